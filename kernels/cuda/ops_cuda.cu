// CUDA ops other than GEMM and attention: RMSNorm, rotary embedding, SwiGLU, vocab-parallel
// embedding and cross-entropy, AdamW, sum of squares, scale, add and the (T,B) <-> (B,T)
// transpose. Semantics are those of kernels/cpu/ops_cpu.h; expressions are written in the CPU
// reference's order so the two round alike. Memory-bound kernels are kept plain.
//
// Determinism (no float atomics): a row reduction is one block's fixed tree; the reductions over
// rows (dw of RMSNorm) go through per-chunk partial sums added in chunk order by a second
// kernel; the embedding gradient sorts token positions by row (a stable radix sort) and sums
// each row's gradients in token order, the order of the CPU reference, so it matches it bitwise.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cub/device/device_radix_sort.cuh>
#include <float.h>
#include <limits.h>

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// Threads for one block per row of d elements: a multiple of 32, no more than the row needs.
static int row_threads(int d) {
  const int t = (d + 31) / 32 * 32;
  return t < K_CUDA_THREADS ? t : K_CUDA_THREADS;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

__global__ void k_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int d, float eps) {
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  const float *xr = x + r * d;
  float *yr = y + r * d;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = k_block_sum(ss, sh);
  const float rs = 1.0f / sqrtf(ss / (float)d + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int j = threadIdx.x; j < d; j += blockDim.x) yr[j] = xr[j] * rs * w[j];
}

// dx_k += rstd w_k dy_k - x_k rstd^3 / d sum_j dy_j w_j x_j, one block per row.
__global__ void k_rmsnorm_bwd_dx(const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                                 int d) {
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  const float *dyr = dy + r * d, *xr = x + r * d;
  float *dxr = dx + r * d;
  const float rs = rstd[r];
  float s = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) s += dyr[j] * w[j] * xr[j];
  s = k_block_sum(s, sh);
  const float c = s * rs * rs * rs / (float)d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dxr[j] += rs * w[j] * dyr[j] - xr[j] * c;
}

enum { DW_COLS = 32, DW_ROWS = 8 };

// Partial dw of rows [chunk * rows_per_chunk, ...): block (DW_COLS, DW_ROWS), columns along x
// (coalesced), rows strided over y, the DW_ROWS sums then added in y order.
__global__ void k_rmsnorm_bwd_dw_part(const float *dy, const float *x, const float *rstd, float *part,
                                      int64_t rows, int d, int64_t rows_per_chunk) {
  __shared__ float sh[DW_ROWS][DW_COLS];
  const int j = blockIdx.x * DW_COLS + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (j < d)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += DW_ROWS) acc += dy[r * d + j] * x[r * d + j] * rstd[r];
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < d) {
    float s = sh[0][threadIdx.x];
    for (int i = 1; i < DW_ROWS; i++) s += sh[i][threadIdx.x];
    part[(int64_t)blockIdx.y * d + j] = s;
  }
}

__global__ void k_rmsnorm_bwd_dw_sum(const float *part, float *dw, int d, int n_chunks) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float s = 0.0f;
  for (int c = 0; c < n_chunks; c++) s += part[(int64_t)c * d + j];
  dw[j] += s;
}

extern "C" void k_cuda_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t rows, int d,
                                   float eps) {
  if (rows <= 0 || d <= 0) return;
  CHECK(rows <= INT_MAX, "rmsnorm: %lld rows is more than one launch takes", (long long)rows);
  cudaStream_t s = k_cuda_cur()->stream;
  k_rmsnorm_fwd<<<(unsigned)rows, row_threads(d), 0, s>>>(x, w, y, rstd, d, eps);
  CUDA_LAUNCH_CHECK("k_rmsnorm_fwd");
}

extern "C" void k_cuda_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                                   float *dw, int64_t rows, int d) {
  if (rows <= 0 || d <= 0) return;
  CHECK(rows <= INT_MAX, "rmsnorm: %lld rows is more than one launch takes", (long long)rows);
  cudaStream_t s = k_cuda_cur()->stream;
  k_rmsnorm_bwd_dx<<<(unsigned)rows, row_threads(d), 0, s>>>(dy, x, w, rstd, dx, d);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dx");
  // The chunking depends on rows alone (never on the device), so the summation order is fixed.
  // At least 64 rows per chunk, at most 512 chunks: the scratch stays at 512 * d floats.
  int64_t rpc = (rows + 511) / 512;
  if (rpc < 64) rpc = 64;
  const int n_chunks = (int)((rows + rpc - 1) / rpc);
  float *part = (float *)k_cuda_scratch(sizeof(float) * (size_t)n_chunks * d);
  k_rmsnorm_bwd_dw_part<<<dim3((d + DW_COLS - 1) / DW_COLS, n_chunks), dim3(DW_COLS, DW_ROWS), 0, s>>>(
      dy, x, rstd, part, rows, d, rpc);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dw_part");
  k_rmsnorm_bwd_dw_sum<<<(d + K_CUDA_THREADS - 1) / K_CUDA_THREADS, K_CUDA_THREADS, 0, s>>>(part, dw, d, n_chunks);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dw_sum");
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding: one thread per (position row bt, pair i), looping over heads, so the angle is
// computed once per (t, i). Angles in double like the reference: positions reach thousands,
// where a float angle loses the low bits.

__global__ void k_rope(float *x, int64_t BT, int T, int H, int hd, int pos0, float theta, int inverse) {
  const int half = hd / 2;
  GRID_STRIDE(idx, BT * half) {
    const int64_t bt = idx / half;
    const int i = (int)(idx % half);
    const double pos = (double)pos0 + (double)(bt % T);
    const double ang = pos * pow((double)theta, -2.0 * i / hd);
    double sd, cd;
    sincos(ang, &sd, &cd);
    const float c = (float)cd, sn = inverse ? (float)-sd : (float)sd;
    for (int h = 0; h < H; h++) {
      float *xh = x + (bt * H + h) * hd;
      const float x0 = xh[i], x1 = xh[half + i];
      xh[i] = x0 * c - x1 * sn;
      xh[half + i] = x0 * sn + x1 * c;
    }
  }
}

extern "C" void k_cuda_rope(float *x, int B, int T, int H, int hd, int pos0, float theta, int inverse) {
  CHECK(hd % 2 == 0, "rope needs an even head dim, got hd=%d", hd);
  const int64_t BT = (int64_t)B * T, n = BT * (hd / 2);
  if (n <= 0 || H <= 0) return;
  k_rope<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(x, BT, T, H, hd, pos0, theta,
                                                                                         inverse);
  CUDA_LAUNCH_CHECK("k_rope");
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

__global__ void k_swiglu_fwd(const float *gate, const float *up, float *out, int64_t n) {
  GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g)))
__global__ void k_swiglu_bwd(const float *dout, const float *gate, const float *up, float *dgate, float *dup,
                             int64_t n) {
  GRID_STRIDE(i, n) {
    const float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dout[i] * g * sig;
  }
}

extern "C" void k_cuda_swiglu_fwd(const float *gate, const float *up, float *out, int64_t n) {
  if (n <= 0) return;
  k_swiglu_fwd<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(gate, up, out, n);
  CUDA_LAUNCH_CHECK("k_swiglu_fwd");
}

extern "C" void k_cuda_swiglu_bwd(const float *dout, const float *gate, const float *up, float *dgate, float *dup,
                                  int64_t n) {
  if (n <= 0) return;
  k_swiglu_bwd<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(dout, gate, up, dgate,
                                                                                               dup, n);
  CUDA_LAUNCH_CHECK("k_swiglu_bwd");
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding

__global__ void k_embed_fwd(const int32_t *tokens, const float *table, float *out, int d, int v0,
                            int n_vocab_local) {
  const int64_t i = blockIdx.x;
  const int64_t row = (int64_t)tokens[i] - v0;
  const bool local = row >= 0 && row < n_vocab_local;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = local ? table[row * d + j] : 0.0f;
}

// Sort keys, unsigned so the radix sort needs no sign handling: the local row, or n_vocab_local
// (sorted last, then skipped) for other ranks' tokens.
__global__ void k_embed_keys(const int32_t *tokens, uint32_t *keys, int32_t *pos, int n, int v0, int n_vocab_local) {
  GRID_STRIDE(i, n) {
    const int64_t row = (int64_t)tokens[i] - v0;
    keys[i] = (uint32_t)(row >= 0 && row < n_vocab_local ? row : n_vocab_local);
    pos[i] = (int32_t)i;
  }
}

// One block per sorted position; the block at the first position of each run of equal rows adds
// that row's gradients one token after the other, in token order (the sort is stable), exactly
// as the CPU reference does, so dtable matches it bitwise.
__global__ void k_embed_bwd_rows(const uint32_t *keys, const int32_t *pos, const float *dout, float *dtable, int n,
                                 int d, int n_vocab_local) {
  const int p = blockIdx.x;
  const uint32_t row = keys[p];
  if (row == (uint32_t)n_vocab_local || (p > 0 && keys[p - 1] == row)) return;
  int p1 = p + 1;
  while (p1 < n && keys[p1] == row) p1++;
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < d; j += gridDim.y * blockDim.x) {
    float acc = dtable[(int64_t)row * d + j];
    for (int q = p; q < p1; q++) acc += dout[(int64_t)pos[q] * d + j];
    dtable[(int64_t)row * d + j] = acc;
  }
}

extern "C" void k_cuda_embed_fwd(const int32_t *tokens, const float *table, float *out, int64_t n, int d, int v0,
                                 int n_vocab_local) {
  if (n <= 0 || d <= 0) return;
  CHECK(n <= INT_MAX, "embed: %lld tokens is more than one launch takes", (long long)n);
  k_embed_fwd<<<(unsigned)n, row_threads(d), 0, k_cuda_cur()->stream>>>(tokens, table, out, d, v0, n_vocab_local);
  CUDA_LAUNCH_CHECK("k_embed_fwd");
}

extern "C" void k_cuda_embed_bwd(const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                                 int n_vocab_local) {
  if (n <= 0 || d <= 0 || n_vocab_local <= 0) return;
  CHECK(n < INT_MAX / 4, "embed: %lld tokens is more than the sort takes", (long long)n);
  CHECK(n_vocab_local < INT_MAX, "embed: n_vocab_local=%d too large", n_vocab_local);
  const int ni = (int)n;
  cudaStream_t s = k_cuda_cur()->stream;
  int end_bit = 1;  // sort only the bits the keys use (they are <= n_vocab_local)
  while (end_bit < 31 && ((int64_t)1 << end_bit) <= n_vocab_local) end_bit++;
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                             (const int32_t *)NULL, (int32_t *)NULL, ni, 0, end_bit, s));
  const size_t arr = ((size_t)ni * sizeof(int32_t) + 255) / 256 * 256;
  char *ws = (char *)k_cuda_scratch(4 * arr + sort_bytes);
  uint32_t *keys = (uint32_t *)ws, *keys_s = (uint32_t *)(ws + 2 * arr);
  int32_t *pos = (int32_t *)(ws + arr), *pos_s = (int32_t *)(ws + 3 * arr);
  k_embed_keys<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(tokens, keys, pos, ni, v0, n_vocab_local);
  CUDA_LAUNCH_CHECK("k_embed_keys");
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + 4 * arr, sort_bytes, keys, keys_s, pos, pos_s, ni, 0, end_bit, s));
  const int th = row_threads(d);
  const unsigned gy = (unsigned)((d + th - 1) / th);
  k_embed_bwd_rows<<<dim3((unsigned)ni, gy), th, 0, s>>>(keys_s, pos_s, dout, dtable, ni, d, n_vocab_local);
  CUDA_LAUNCH_CHECK("k_embed_bwd_rows");
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel cross-entropy: one block per row.

__global__ void k_ce_local_stats(const float *logits, const int32_t *targets, int n_vocab_local, int v0,
                                 float *row_max, float *row_sumexp, float *target_logit) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t r = blockIdx.x;
  const float *lr = logits + r * n_vocab_local;
  float m = -FLT_MAX;
  for (int j = threadIdx.x; j < n_vocab_local; j += blockDim.x) m = lr[j] > m ? lr[j] : m;
  m = k_block_max(m, shf);
  double sum = 0.0;  // in double: a vocabulary slice can be tens of thousands of terms
  for (int j = threadIdx.x; j < n_vocab_local; j += blockDim.x) sum += (double)expf(lr[j] - m);
  sum = k_block_sum(sum, shd);
  if (threadIdx.x == 0) {
    const int64_t tl = (int64_t)targets[r] - v0;
    row_max[r] = m;
    row_sumexp[r] = (float)sum;
    target_logit[r] = tl >= 0 && tl < n_vocab_local ? lr[tl] : 0.0f;
  }
}

__global__ void k_ce_bwd(float *logits, const int32_t *targets, const float *lse, int n_vocab_local, int v0,
                         float scale) {
  const int64_t r = blockIdx.x;
  float *lr = logits + r * n_vocab_local;
  const float l = lse[r];
  const int64_t tl = (int64_t)targets[r] - v0;  // outside [0, n_vocab_local) when not local
  for (int j = threadIdx.x; j < n_vocab_local; j += blockDim.x)
    lr[j] = scale * (expf(lr[j] - l) - (j == tl ? 1.0f : 0.0f));
}

extern "C" void k_cuda_ce_local_stats(const float *logits, const int32_t *targets, int64_t rows, int n_vocab_local,
                                      int v0, float *row_max, float *row_sumexp, float *target_logit) {
  if (rows <= 0 || n_vocab_local <= 0) return;
  CHECK(rows <= INT_MAX, "cross-entropy: %lld rows is more than one launch takes", (long long)rows);
  k_ce_local_stats<<<(unsigned)rows, row_threads(n_vocab_local), 0, k_cuda_cur()->stream>>>(
      logits, targets, n_vocab_local, v0, row_max, row_sumexp, target_logit);
  CUDA_LAUNCH_CHECK("k_ce_local_stats");
}

extern "C" void k_cuda_ce_bwd(float *logits, const int32_t *targets, const float *lse, int64_t rows,
                              int n_vocab_local, int v0, float scale) {
  if (rows <= 0 || n_vocab_local <= 0) return;
  CHECK(rows <= INT_MAX, "cross-entropy: %lld rows is more than one launch takes", (long long)rows);
  k_ce_bwd<<<(unsigned)rows, row_threads(n_vocab_local), 0, k_cuda_cur()->stream>>>(logits, targets, lse,
                                                                                     n_vocab_local, v0, scale);
  CUDA_LAUNCH_CHECK("k_ce_bwd");
}

// ---------------------------------------------------------------------------------------------
// AdamW and vector helpers

__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, float bc1, float bc2) {
  GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + weight_decay * p[i]);
  }
}

extern "C" void k_cuda_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float bc1, float bc2) {
  if (n <= 0) return;
  k_adamw<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(
      p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  CUDA_LAUNCH_CHECK("k_adamw");
}

// Sum of squares in two fixed stages: SUMSQ_MAX_BLOCKS (or fewer, by n alone) blocks each sum a
// strided share in double and reduce it by the block tree; one block then reduces the partials.
enum { SUMSQ_THREADS = 256, SUMSQ_MAX_BLOCKS = 1024 };

__global__ void k_sumsq_part(const float *x, int64_t n, double *part) {
  __shared__ double sh[32];
  double s = 0.0;
  GRID_STRIDE(i, n) s += (double)x[i] * x[i];
  s = k_block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sumsq_total(const double *part, int n_part, double *total) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n_part; i += blockDim.x) s += part[i];
  s = k_block_sum(s, sh);
  if (threadIdx.x == 0) *total = s;
}

extern "C" double k_cuda_sumsq(const float *x, int64_t n) {
  if (n <= 0) return 0.0;
  cudaStream_t s = k_cuda_cur()->stream;
  int64_t nb = (n + SUMSQ_THREADS * 16 - 1) / (SUMSQ_THREADS * 16);
  if (nb > SUMSQ_MAX_BLOCKS) nb = SUMSQ_MAX_BLOCKS;
  double *part = (double *)k_cuda_scratch(sizeof(double) * (SUMSQ_MAX_BLOCKS + 1)), *total = part + SUMSQ_MAX_BLOCKS;
  k_sumsq_part<<<(unsigned)nb, SUMSQ_THREADS, 0, s>>>(x, n, part);
  CUDA_LAUNCH_CHECK("k_sumsq_part");
  k_sumsq_total<<<1, 1024, 0, s>>>(part, (int)nb, total);
  CUDA_LAUNCH_CHECK("k_sumsq_total");
  double h = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&h, total, sizeof h, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

__global__ void k_scale(float *x, int64_t n, float s) {
  GRID_STRIDE(i, n) x[i] *= s;
}

__global__ void k_add(float *y, const float *x, int64_t n) {
  GRID_STRIDE(i, n) y[i] += x[i];
}

extern "C" void k_cuda_scale(float *x, int64_t n, float s) {
  if (n <= 0) return;
  k_scale<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(x, n, s);
  CUDA_LAUNCH_CHECK("k_scale");
}

extern "C" void k_cuda_add(float *y, const float *x, int64_t n) {
  if (n <= 0) return;
  k_add<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(y, x, n);
  CUDA_LAUNCH_CHECK("k_add");
}

// Rows of `inner` floats: src row (t, b) goes to dst row (b, t). One block per dst row (grid-
// strided), so both sides are read and written contiguously.
__global__ void k_transpose_tb(float *dst, const float *src, int T, int B, int64_t inner) {
  const int64_t rows = (int64_t)T * B;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / T, t = r % T;
    const float *s = src + (t * B + b) * inner;
    float *d = dst + r * inner;
    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) d[c] = s[c];
  }
}

extern "C" void k_cuda_transpose_tb(float *dst, const float *src, int T, int B, int64_t inner) {
  const int64_t rows = (int64_t)T * B;
  if (rows <= 0 || inner <= 0) return;
  const int64_t cap = 1 << 20;
  k_transpose_tb<<<(unsigned)(rows < cap ? rows : cap), K_CUDA_THREADS, 0, k_cuda_cur()->stream>>>(dst, src, T, B,
                                                                                                   inner);
  CUDA_LAUNCH_CHECK("k_transpose_tb");
}
