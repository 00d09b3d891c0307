// Vocab-parallel cross-entropy on the GPU: per-row local stats (max, sum of exp, target logit),
// their rescale to a global max, lse and loss, and the in-place gradient. The two passes over
// the logits are the heaviest memory traffic of a step, so both stream 16-byte vectors: a row is
// a scalar head up to the first 16-byte boundary, whole vectors, and a scalar tail, which works
// for any row length and base pointer. The stats keep the row in registers between the max and
// the sum, so the logits are read once; the terms are the reference's expf(x - max), summed per
// vector in fp32 and across vectors in double.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <float.h>
#include <limits.h>

enum { CE_THREADS = 512 };  // at most, per block (one block per row)

// Applies fs to each scalar element (fp32) of row lr and fv to each body vector (W fp32): head,
// cached body vectors v, the body vectors past the cache (read again from memory), tail.
template <typename E, int NV, typename FS, typename FV>
__device__ __forceinline__ void ce_row_each(const E *lr, int n, const uint4 *v, FS fs, FV fv) {
  constexpr int W = k_vec<E>::N;
  const int h = k_vec_head(lr, n), nvec = (n - h) / W, t0 = h + nvec * W;
  const int t = threadIdx.x, T = blockDim.x;
  const uint4 *body = (const uint4 *)(lr + h);
  if (t < h) fs(k_ld(lr[t]));
  if (t < n - t0) fs(k_ld(lr[t0 + t]));
  float x[W];
#pragma unroll
  for (int k = 0; k < NV; k++)
    if (t + k * T < nvec) k_unpack<E>(v[k], x), fv(x);
  for (int i = t + NV * T; i < nvec; i += T) k_unpack<E>(body[i], x), fv(x);
}

// exp(x_j - m) of one vector summed in fp32 by a fixed pairwise tree (terms <= 1, so within a
// few fp32 ulps of the exact sum, far inside the reference's own fp32-lane error), then added
// to the thread's double sum: one conversion and one double add per vector, not per element.
template <int W>
__device__ __forceinline__ float ce_vec_sumexp(const float *x, float m) {
  float e[W];
#pragma unroll
  for (int i = 0; i < W; i++) e[i] = expf(x[i] - m);
#pragma unroll
  for (int w = W / 2; w > 0; w /= 2)
#pragma unroll
    for (int i = 0; i < w; i++) e[i] += e[i + w];
  return e[0];
}

template <typename E, int NV>
__global__ void __launch_bounds__(CE_THREADS)
    k_ce_local_stats(const E *logits, const int32_t *targets, int n, int v0, float *row_max, float *row_sumexp,
                     float *target_logit) {
  constexpr int W = k_vec<E>::N;
  __shared__ float shf[32];
  __shared__ double shd[32];
  const int64_t r = blockIdx.x;
  const E *lr = logits + r * n;
  const int h = k_vec_head(lr, n), nvec = (n - h) / W;
  const uint4 *body = (const uint4 *)(lr + h);
  uint4 v[NV];
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) v[k] = body[i];
  }
  float m = -FLT_MAX;  // NaN never wins, as in the reference
  const auto max1 = [&](float x) { m = x > m ? x : m; };
  ce_row_each<E, NV>(lr, n, v, max1, [&](const float *x) {
#pragma unroll
    for (int i = 0; i < W; i++) max1(x[i]);
  });
  m = k_block_max(m, shf);
  double sum = 0.0;  // in double: a vocabulary slice can be tens of thousands of terms
  ce_row_each<E, NV>(
      lr, n, v, [&](float x) { sum += (double)expf(x - m); },
      [&](const float *x) { sum += (double)ce_vec_sumexp<W>(x, m); });
  sum = k_block_sum(sum, shd);
  if (threadIdx.x == 0) {
    const int64_t tl = (int64_t)targets[r] - v0;
    row_max[r] = m;
    row_sumexp[r] = (float)sum;
    target_logit[r] = tl >= 0 && tl < n ? k_ld(lr[tl]) : 0.0f;
  }
}

// In place, one block per row; CE_BWD_UNROLL vectors per thread in flight.
enum { CE_BWD_UNROLL = 4 };

template <typename E>
__global__ void __launch_bounds__(CE_THREADS)
    k_ce_bwd(E *logits, const int32_t *targets, const float *lse, int n, int v0, float scale) {
  constexpr int W = k_vec<E>::N;
  const int64_t r = blockIdx.x;
  E *lr = logits + r * n;
  const float l = lse[r];
  const int64_t tl = (int64_t)targets[r] - v0;  // outside [0, n) when not local
  const int h = k_vec_head(lr, n), nvec = (n - h) / W, t0 = h + nvec * W;
  const int t = threadIdx.x, T = blockDim.x;
  uint4 *body = (uint4 *)(lr + h);
  if (t < h) lr[t] = k_st<E>(scale * (expf(k_ld(lr[t]) - l) - (t == tl ? 1.0f : 0.0f)));
  if (t < n - t0) {
    const int j = t0 + t;
    lr[j] = k_st<E>(scale * (expf(k_ld(lr[j]) - l) - (j == tl ? 1.0f : 0.0f)));
  }
  for (int i0 = t; i0 < nvec; i0 += CE_BWD_UNROLL * T) {
    uint4 u[CE_BWD_UNROLL];
#pragma unroll
    for (int k = 0; k < CE_BWD_UNROLL; k++)
      if (i0 + k * T < nvec) u[k] = body[i0 + k * T];
#pragma unroll
    for (int k = 0; k < CE_BWD_UNROLL; k++) {
      const int i = i0 + k * T;
      if (i < nvec) {
        float x[W];
        k_unpack<E>(u[k], x);
#pragma unroll
        for (int e = 0; e < W; e++) {
          const int j = h + i * W + e;
          x[e] = scale * (expf(x[e] - l) - (j == tl ? 1.0f : 0.0f));
        }
        body[i] = k_pack<E>(x);
      }
    }
  }
}

// Threads for a row of nvec vectors at nv vectors per thread: a multiple of 32, at most CE_THREADS.
static int ce_threads(int64_t nvec, int nv) {
  const int64_t t = (nvec + nv - 1) / nv;
  return t <= 32 ? 32 : t >= CE_THREADS ? CE_THREADS : (int)((t + 31) / 32 * 32);
}

template <typename E>
static void ce_stats_run(const void *logits, const int32_t *targets, int64_t rows, int n, int v0, float *row_max,
                         float *row_sumexp, float *target_logit, cudaStream_t s) {
  const unsigned nb = (unsigned)rows;
  const int64_t nvec = n / k_vec<E>::N;
  const E *l = (const E *)logits;
  // The fewest vectors per thread that fit the row in one block (8 at most; past that the
  // rest of the row is read twice, the second time mostly from L2).
  if (nvec <= CE_THREADS)
    k_ce_local_stats<E, 1><<<nb, ce_threads(nvec, 1), 0, s>>>(l, targets, n, v0, row_max, row_sumexp, target_logit);
  else if (nvec <= 2 * CE_THREADS)
    k_ce_local_stats<E, 2><<<nb, ce_threads(nvec, 2), 0, s>>>(l, targets, n, v0, row_max, row_sumexp, target_logit);
  else if (nvec <= 4 * CE_THREADS)
    k_ce_local_stats<E, 4><<<nb, ce_threads(nvec, 4), 0, s>>>(l, targets, n, v0, row_max, row_sumexp, target_logit);
  else
    k_ce_local_stats<E, 8><<<nb, ce_threads(nvec, 8), 0, s>>>(l, targets, n, v0, row_max, row_sumexp, target_logit);
  CUDA_LAUNCH_CHECK("k_ce_local_stats");
}

extern "C" void k_cuda_ce_local_stats(k_backend *b, const void *logits, const int32_t *targets, int64_t rows, int n_vocab_local,
                                      int v0, float *row_max, float *row_sumexp, float *target_logit) {
  if (rows <= 0 || n_vocab_local <= 0) return;
  CHECK(rows <= INT_MAX, "cross-entropy: %lld rows is more than one launch takes", (long long)rows);
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16)
    ce_stats_run<k_bf16>(logits, targets, rows, n_vocab_local, v0, row_max, row_sumexp, target_logit, c->stream);
  else
    ce_stats_run<float>(logits, targets, rows, n_vocab_local, v0, row_max, row_sumexp, target_logit, c->stream);
}

extern "C" void k_cuda_ce_bwd(k_backend *b, void *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local,
                              int v0, float scale) {
  if (rows <= 0 || n_vocab_local <= 0) return;
  CHECK(rows <= INT_MAX, "cross-entropy: %lld rows is more than one launch takes", (long long)rows);
  const unsigned nb = (unsigned)rows;
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  if (c->act == K_BF16)
    k_ce_bwd<k_bf16><<<nb, ce_threads(n_vocab_local / 8, CE_BWD_UNROLL), 0, s>>>((k_bf16 *)logits, targets, lse,
                                                                                n_vocab_local, v0, scale);
  else
    k_ce_bwd<float><<<nb, ce_threads(n_vocab_local / 4, CE_BWD_UNROLL), 0, s>>>((float *)logits, targets, lse,
                                                                               n_vocab_local, v0, scale);
  CUDA_LAUNCH_CHECK("k_ce_bwd");
}

__global__ void k_ce_rescale(float *row_sumexp, const float *row_max, const float *gmax, int64_t rows) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x)
    row_sumexp[r] *= expf(row_max[r] - gmax[r]);
}

// One block: lse per row, and the loss summed in double by a fixed tree (strided partial sums,
// then the block reduction), so it is the same bits on every run.
enum { CE_LOSS_THREADS = 1024 };
__global__ void k_ce_loss(const float *gmax, const float *sumexp, const float *target_logit, float *lse, int64_t rows,
                          double *loss) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float l = gmax[r] + logf(sumexp[r]);
    lse[r] = l;
    s += (double)l - target_logit[r];
  }
  s = k_block_sum(s, sh);
  if (threadIdx.x == 0) *loss = s;
}

extern "C" void k_cuda_ce_rescale(k_backend *b, float *row_sumexp, const float *row_max, const float *gmax, int64_t rows) {
  if (rows <= 0) return;
  k_ce_rescale<<<k_cuda_blocks(rows, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_ctx_of(b)->stream>>>(
      row_sumexp, row_max, gmax, rows);
  CUDA_LAUNCH_CHECK("k_ce_rescale");
}

extern "C" void k_cuda_ce_loss(k_backend *b, const float *gmax, const float *sumexp, const float *target_logit, float *lse,
                               int64_t rows, double *loss) {
  k_ce_loss<<<1, CE_LOSS_THREADS, 0, k_cuda_ctx_of(b)->stream>>>(gmax, sumexp, target_logit, lse,
                                                                 rows > 0 ? rows : 0, loss);
  CUDA_LAUNCH_CHECK("k_ce_loss");
}

