// CUDA ops other than GEMM, attention, cross-entropy (ce_cuda.cu) and the optimizer
// (optim_cuda.cu): dtype cast, RMSNorm (and the one with FP8 codes of its output, whose
// conversion is fp8_cuda.cuh's), rotary embedding, SwiGLU, vocab-parallel embedding and
// the residual add. Semantics are those of kernels/cpu/ops_cpu.h; expressions are
// written in the CPU reference's order so the two round alike. The act-typed ops (rope, SwiGLU)
// are templates over the element type (float, bf16): loads widen to fp32, the math is fp32,
// stores round to nearest even; the extern "C" launcher picks the instance from the activation
// dtype of the backend it is given. The hot memory-bound ones (cast, RMSNorm forward, rope, SwiGLU)
// move 16-byte vectors when the shape and pointers allow, with the same per-element
// expressions, and fall back to the scalar kernels otherwise.
//
// Determinism (no float atomics): a row reduction is one block's fixed tree; the reductions over
// rows (dw of RMSNorm) go through per-chunk partial sums added in chunk order by a second
// kernel; the embedding gradient sorts token positions by row (a stable radix sort) and sums
// each row's gradients in token order, the order of the CPU reference, so it matches it bitwise.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_cuda.cuh"
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
// Cast. fp32 <-> bf16 moves 4 elements per thread (one 16-byte fp32 access, one 8-byte bf16
// access) when the pointers allow, the few leftover elements by the scalar kernel.

template <typename D, typename S>
__global__ void k_cast(D *dst, const S *src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = k_st<D>(k_ld(src[i]));
}

__global__ void k_cast_f32_bf16_x4(k_bf16 *dst, const float *src, int64_t n4) {
  GRID_STRIDE(i, n4) {
    const float4 x = ((const float4 *)src)[i];
    uint2 u;
    u.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x.x)) |
          (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x.y)) << 16;
    u.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x.z)) |
          (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x.w)) << 16;
    ((uint2 *)dst)[i] = u;
  }
}

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
__global__ void k_cast_bf16_f32_x4(float *dst, const k_bf16 *src, int64_t n4) {
  GRID_STRIDE(i, n4) {
    const uint2 u = ((const uint2 *)src)[i];
    ((float4 *)dst)[i] = make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
  }
}

extern "C" void k_cuda_cast(k_backend *b, void *dst, k_dtype dst_type, const void *src, k_dtype src_type, int64_t n) {
  CHECK((dst_type == K_F32 || dst_type == K_BF16) && (src_type == K_F32 || src_type == K_BF16),
        "cast: unknown dtype (%d -> %d)", (int)src_type, (int)dst_type);
  if (n <= 0) return;
  cudaStream_t s = k_cuda_ctx_of(b)->stream;
  if (dst_type == src_type) {  // Default: either side may be host_alloc memory (offloaded master weights)
    if (dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * k_dtype_bytes(dst_type), cudaMemcpyDefault, s));
    return;
  }
  const float *f = (const float *)(dst_type == K_F32 ? dst : src);
  const k_bf16 *h = (const k_bf16 *)(dst_type == K_BF16 ? dst : src);
  const bool vec = (uintptr_t)f % 16 == 0 && (uintptr_t)h % 8 == 0;
  const int64_t n4 = vec ? n / 4 : 0, tail = n - 4 * n4;
  if (n4) {
    if (dst_type == K_BF16)
      k_cast_f32_bf16_x4<<<k_cuda_blocks(n4, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((k_bf16 *)dst,
                                                                                      (const float *)src, n4);
    else
      k_cast_bf16_f32_x4<<<k_cuda_blocks(n4, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((float *)dst,
                                                                                      (const k_bf16 *)src, n4);
    CUDA_LAUNCH_CHECK("k_cast_x4");
  }
  if (tail) {
    const int64_t o = 4 * n4;
    if (dst_type == K_BF16)
      k_cast<k_bf16, float><<<k_cuda_blocks(tail, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(
          (k_bf16 *)dst + o, (const float *)src + o, tail);
    else
      k_cast<float, k_bf16><<<k_cuda_blocks(tail, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(
          (float *)dst + o, (const k_bf16 *)src + o, tail);
    CUDA_LAUNCH_CHECK("k_cast");
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

// The FP8 codes a fused RMSNorm writes beside y (rmsnorm_fwd_fp8): E4M3 with *scale, and the amax,
// both of y as stored in its dtype, as fp8_cast reading y would; F8 false: none.
struct rn_fp8 {
  const float *scale;
  uint8_t *out8;
  float *amax;
};

// y as stored, read back: the value fp8_cast would see.
template <typename Y>
__device__ __forceinline__ float rn_rounded(float v) { return k_ld(k_st<Y>(v)); }

template <typename Y, bool F8>
__global__ void k_rmsnorm_fwd(const float *x, const float *w, Y *y, float *rstd, int d, float eps, rn_fp8 q) {
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  const float *xr = x + r * d;
  Y *yr = y ? y + r * d : NULL;  // NULL: the codes alone (rmsnorm_fwd_fp8)
  float ss = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = k_block_sum(ss, sh);
  const float rs = 1.0f / sqrtf(ss / (float)d + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  const float sc = F8 ? *q.scale : 0.0f;
  uint32_t m = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const Y v = k_st<Y>(xr[j] * rs * w[j]);
    if (!F8 || yr) yr[j] = v;
    if (F8) {
      const float f = k_ld(v);
      m = max(m, abs_bits(f));
      q.out8[r * d + j] = (uint8_t)fp8x2<K_E4M3>(f * sc, 0.0f);
    }
  }
  if (F8) amax_commit_warp(m, q.amax);
}

// The same on float4 vectors (d a multiple of 4, x, w, y 16-byte aligned; bf16 y needs 8), the
// row kept in registers between its sum of squares and the output: NV vectors per thread, one
// warp per row (WARP, rows of up to 32 * NV vectors: no block barrier, several rows per block)
// or one block per row. Only the order of the sum of squares differs from k_rmsnorm_fwd.
enum { RN_THREADS = 512 };

template <typename Y>
__device__ __forceinline__ void rn_store4(Y *y, int64_t i4, float a, float b, float c, float d);
template <>
__device__ __forceinline__ void rn_store4<float>(float *y, int64_t i4, float a, float b, float c, float d) {
  ((float4 *)y)[i4] = make_float4(a, b, c, d);
}
template <>
__device__ __forceinline__ void rn_store4<k_bf16>(k_bf16 *y, int64_t i4, float a, float b, float c, float d) {
  ((uint2 *)y)[i4] = make_uint2((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
                                     (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16,
                                 (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(c)) |
                                     (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(d)) << 16);
}

// With F8, the four codes of a vector as one 4-byte store (out8 4-byte aligned) or four.
__device__ __forceinline__ void rn_codes4(uint8_t *out8, int64_t i4, float a, float b, float c, float d, float s) {
  const uint32_t w = fp8x2<K_E4M3>(a * s, b * s) | fp8x2<K_E4M3>(c * s, d * s) << 16;
  uint8_t *o = out8 + 4 * i4;
  if ((uintptr_t)o % 4 == 0) *(uint32_t *)o = w;
  else o[0] = (uint8_t)w, o[1] = (uint8_t)(w >> 8), o[2] = (uint8_t)(w >> 16), o[3] = (uint8_t)(w >> 24);
}

template <typename Y, int NV, bool WARP, bool F8>
__global__ void __launch_bounds__(RN_THREADS)
    k_rmsnorm_fwd_vec(const float4 *x, const float4 *w, Y *y, float *rstd, int64_t rows, int d4, float eps, rn_fp8 q) {
  __shared__ float sh[32];
  const int lane = WARP ? threadIdx.x & 31 : threadIdx.x, T = WARP ? 32 : blockDim.x;
  const int64_t r = WARP ? blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  if (WARP && r >= rows) return;  // whole warps: no barrier follows
  const float4 *xr = x + r * d4;
  float4 v[NV];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int i = lane + k * T;
    if (i < d4) v[k] = xr[i];
  }
#pragma unroll
  for (int k = 0; k < NV; k++)
    if (lane + k * T < d4) ss += v[k].x * v[k].x, ss += v[k].y * v[k].y, ss += v[k].z * v[k].z, ss += v[k].w * v[k].w;
  ss = WARP ? k_warp_sum(ss) : k_block_sum(ss, sh);
  const float rs = 1.0f / sqrtf(ss / (float)(4 * d4) + eps);
  if (lane == 0) rstd[r] = rs;
  const float sc = F8 ? *q.scale : 0.0f;
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int i = lane + k * T;
    if (i < d4) {
      const float4 wv = __ldg(w + i);
      const float a = v[k].x * rs * wv.x, b = v[k].y * rs * wv.y, c = v[k].z * rs * wv.z, e = v[k].w * rs * wv.w;
      if (!F8 || y) rn_store4<Y>(y, r * d4 + i, a, b, c, e);  // y NULL: the codes alone
      if (F8) {
        const float ra = rn_rounded<Y>(a), rb = rn_rounded<Y>(b), rc = rn_rounded<Y>(c), re = rn_rounded<Y>(e);
        m = max(m, max(max(abs_bits(ra), abs_bits(rb)), max(abs_bits(rc), abs_bits(re))));
        rn_codes4(q.out8, r * d4 + i, ra, rb, rc, re, sc);
      }
    }
  }
  if (F8) amax_commit_warp(m, q.amax);
}

template <typename Y, int NV, bool WARP>
static void rmsnorm_fwd_vec_go(const float *x, const float *w, Y *y, float *rstd, int64_t rows, int d4, float eps,
                               rn_fp8 q, int th, cudaStream_t s) {
  const int64_t nb = WARP ? (rows + th / 32 - 1) / (th / 32) : rows;
  if (q.out8)
    k_rmsnorm_fwd_vec<Y, NV, WARP, true><<<(unsigned)nb, th, 0, s>>>((const float4 *)x, (const float4 *)w, y, rstd, rows,
                                                                     d4, eps, q);
  else
    k_rmsnorm_fwd_vec<Y, NV, WARP, false><<<(unsigned)nb, th, 0, s>>>((const float4 *)x, (const float4 *)w, y, rstd, rows,
                                                                      d4, eps, q);
  CUDA_LAUNCH_CHECK("k_rmsnorm_fwd_vec");
}

// Runs the vector kernel if the shape and pointers allow it; false otherwise.
template <typename Y>
static bool rmsnorm_fwd_vec(const float *x, const float *w, Y *y, float *rstd, int64_t rows, int d, float eps, rn_fp8 q,
                            cudaStream_t s) {
  const int d4 = d / 4;
  if (d % 4 || !k_aligned16((uintptr_t)x | (uintptr_t)w) || (uintptr_t)y % (4 * sizeof(Y)) || d4 > 8 * RN_THREADS)
    return false;
  if (d4 <= 32) rmsnorm_fwd_vec_go<Y, 1, true>(x, w, y, rstd, rows, d4, eps, q, 256, s);
  else if (d4 <= 64) rmsnorm_fwd_vec_go<Y, 2, true>(x, w, y, rstd, rows, d4, eps, q, 256, s);
  else if (d4 <= 128) rmsnorm_fwd_vec_go<Y, 4, true>(x, w, y, rstd, rows, d4, eps, q, 256, s);
  else if (d4 <= 256) rmsnorm_fwd_vec_go<Y, 8, true>(x, w, y, rstd, rows, d4, eps, q, 256, s);
  else {
    const int nv = d4 <= 2 * RN_THREADS ? 2 : d4 <= 4 * RN_THREADS ? 4 : 8;
    const int th = ((d4 + nv - 1) / nv + 31) / 32 * 32;
    if (nv == 2) rmsnorm_fwd_vec_go<Y, 2, false>(x, w, y, rstd, rows, d4, eps, q, th, s);
    else if (nv == 4) rmsnorm_fwd_vec_go<Y, 4, false>(x, w, y, rstd, rows, d4, eps, q, th, s);
    else rmsnorm_fwd_vec_go<Y, 8, false>(x, w, y, rstd, rows, d4, eps, q, th, s);
  }
  return true;
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

// rmsnorm_fwd_act, and with q.out8 the FP8 codes and amax of y too: the path (vector or scalar)
// is chosen from x, w, y and d alone, so y and rstd are those of rmsnorm_fwd_act either way.
template <typename Y>
static void rmsnorm_fwd_go(const float *x, const float *w, Y *y, float *rstd, int64_t rows, int d, float eps, rn_fp8 q,
                           cudaStream_t s) {
  if (rmsnorm_fwd_vec<Y>(x, w, y, rstd, rows, d, eps, q, s)) return;
  if (q.out8) k_rmsnorm_fwd<Y, true><<<(unsigned)rows, row_threads(d), 0, s>>>(x, w, y, rstd, d, eps, q);
  else k_rmsnorm_fwd<Y, false><<<(unsigned)rows, row_threads(d), 0, s>>>(x, w, y, rstd, d, eps, q);
  CUDA_LAUNCH_CHECK("k_rmsnorm_fwd");
}

static void rmsnorm_fwd_any(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d,
                            float eps, rn_fp8 q) {
  if (rows <= 0 || d <= 0) return;
  CHECK(rows <= INT_MAX, "rmsnorm: %lld rows is more than one launch takes", (long long)rows);
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) rmsnorm_fwd_go<k_bf16>(x, w, (k_bf16 *)y, rstd, rows, d, eps, q, c->stream);
  else rmsnorm_fwd_go<float>(x, w, (float *)y, rstd, rows, d, eps, q, c->stream);
}

extern "C" void k_cuda_rmsnorm_fwd_act(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d,
                                       float eps) {
  rmsnorm_fwd_any(b, x, w, y, rstd, rows, d, eps, rn_fp8{NULL, NULL, NULL});
}

extern "C" void k_cuda_rmsnorm_fwd_fp8(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows,
                                       int d, float eps, const float *scale, uint8_t *out8, float *amax) {
  CHECK(out8 && scale && amax, "rmsnorm_fwd_fp8: scale, codes and amax are required");
  rmsnorm_fwd_any(b, x, w, y, rstd, rows, d, eps, rn_fp8{scale, out8, amax});
}

extern "C" void k_cuda_rmsnorm_bwd(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                                   float *dw, int64_t rows, int d) {
  if (rows <= 0 || d <= 0) return;
  CHECK(rows <= INT_MAX, "rmsnorm: %lld rows is more than one launch takes", (long long)rows);
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  k_rmsnorm_bwd_dx<<<(unsigned)rows, row_threads(d), 0, s>>>(dy, x, w, rstd, dx, d);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dx");
  // The chunking depends on rows alone (never on the device), so the summation order is fixed.
  // At least 64 rows per chunk, at most 512 chunks: the scratch stays at 512 * d floats.
  int64_t rpc = (rows + 511) / 512;
  if (rpc < 64) rpc = 64;
  const int n_chunks = (int)((rows + rpc - 1) / rpc);
  float *part = (float *)k_cuda_scratch(c, sizeof(float) * (size_t)n_chunks * d);
  k_rmsnorm_bwd_dw_part<<<dim3((d + DW_COLS - 1) / DW_COLS, n_chunks), dim3(DW_COLS, DW_ROWS), 0, s>>>(
      dy, x, rstd, part, rows, d, rpc);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dw_part");
  k_rmsnorm_bwd_dw_sum<<<(d + K_CUDA_THREADS - 1) / K_CUDA_THREADS, K_CUDA_THREADS, 0, s>>>(part, dw, d, n_chunks);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dw_sum");
}

// Backward in one pass over dy and x: a block takes a chunk of rows, thread t owns columns
// t + k * blockDim.x (k < NCOL) and keeps their dw partial sums in registers, added in row order;
// each row's dot product is one block reduction, and the next row's dy and x are loaded before
// it so that the loads overlap the barrier. The chunk partials are then added in chunk order
// (k_rmsnorm_bwd_dw_sum). dx_act, if not NULL, receives the updated dx in the act dtype (the
// operand of the next GEMM), saving a cast pass.
enum { RB_MAX_THREADS = 1024, RB_MAX_CHUNKS = 1024 };

template <int NCOL, typename A>
__global__ void __launch_bounds__(RB_MAX_THREADS)
    k_rmsnorm_bwd_fused(const float *dy, const float *x, const float *w, const float *rstd, float *dx, A *dx_act,
                        float *part, int64_t rows, int d, int64_t rows_per_chunk) {
  __shared__ float sh[32];
  const int64_t r0 = blockIdx.x * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float wj[NCOL], acc[NCOL], dyv[NCOL], xv[NCOL];
#pragma unroll
  for (int k = 0; k < NCOL; k++) {
    const int j = threadIdx.x + k * blockDim.x;
    wj[k] = j < d ? w[j] : 0.0f;
    acc[k] = 0.0f;
    dyv[k] = j < d && r0 < r1 ? dy[r0 * d + j] : 0.0f;
    xv[k] = j < d && r0 < r1 ? x[r0 * d + j] : 0.0f;
  }
  for (int64_t r = r0; r < r1; r++) {
    const float rs = rstd[r];
    float s = 0.0f, dyn[NCOL], xn[NCOL];
#pragma unroll
    for (int k = 0; k < NCOL; k++) {
      const int j = threadIdx.x + k * blockDim.x;
      s += dyv[k] * wj[k] * xv[k];
      dyn[k] = j < d && r + 1 < r1 ? dy[(r + 1) * d + j] : 0.0f;  // prefetch
      xn[k] = j < d && r + 1 < r1 ? x[(r + 1) * d + j] : 0.0f;
    }
    s = k_block_sum(s, sh);
    const float c = s * rs * rs * rs / (float)d;
#pragma unroll
    for (int k = 0; k < NCOL; k++) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < d) {
        const float v = dx[r * d + j] + (rs * wj[k] * dyv[k] - xv[k] * c);
        dx[r * d + j] = v;
        if (dx_act) dx_act[r * d + j] = k_st<A>(v);
        acc[k] += dyv[k] * xv[k] * rs;
      }
      dyv[k] = dyn[k];
      xv[k] = xn[k];
    }
  }
#pragma unroll
  for (int k = 0; k < NCOL; k++) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < d) part[(int64_t)blockIdx.x * d + j] = acc[k];
  }
}

template <int NCOL>
static void rmsnorm_bwd_fused_run(const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                                  void *dx_act, k_dtype act, float *part, int64_t rows, int d, int th, int64_t rpc,
                                  int n_chunks, cudaStream_t s) {
  if (dx_act && act == K_BF16)
    k_rmsnorm_bwd_fused<NCOL, k_bf16><<<n_chunks, th, 0, s>>>(dy, x, w, rstd, dx, (k_bf16 *)dx_act, part, rows, d, rpc);
  else
    k_rmsnorm_bwd_fused<NCOL, float><<<n_chunks, th, 0, s>>>(dy, x, w, rstd, dx, (float *)dx_act, part, rows, d, rpc);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_fused");
}

extern "C" void k_cuda_rmsnorm_bwd_act(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx,
                                       float *dw, void *dx_act, int64_t rows, int d) {
  if (rows <= 0 || d <= 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  if (d > 8 * RB_MAX_THREADS) {  // wider than the fused kernel's registers: two passes and a cast
    k_cuda_rmsnorm_bwd(b, dy, x, w, rstd, dx, dw, rows, d);
    if (dx_act) k_cuda_cast(b, dx_act, c->act, dx, K_F32, rows * d);
    return;
  }
  // Blocks of 256 threads (more for d > 2048) with up to 8 columns each: many independent loads
  // per thread. The chunking depends on rows alone (never on the device), so the summation
  // order is fixed; at most RB_MAX_CHUNKS chunks, so the scratch stays at that many rows of d.
  int th = (d + 7) / 8;
  th = th < K_CUDA_THREADS ? K_CUDA_THREADS : (th + 31) / 32 * 32;
  const int ncol = (d + th - 1) / th;
  th = ((d + ncol - 1) / ncol + 31) / 32 * 32;
  int64_t rpc = (rows + RB_MAX_CHUNKS - 1) / RB_MAX_CHUNKS;
  if (rpc < 4) rpc = 4;
  const int n_chunks = (int)((rows + rpc - 1) / rpc);
  float *part = (float *)k_cuda_scratch(c, sizeof(float) * (size_t)n_chunks * d);
  if (ncol <= 1) rmsnorm_bwd_fused_run<1>(dy, x, w, rstd, dx, dx_act, c->act, part, rows, d, th, rpc, n_chunks, s);
  else if (ncol <= 2) rmsnorm_bwd_fused_run<2>(dy, x, w, rstd, dx, dx_act, c->act, part, rows, d, th, rpc, n_chunks, s);
  else if (ncol <= 4) rmsnorm_bwd_fused_run<4>(dy, x, w, rstd, dx, dx_act, c->act, part, rows, d, th, rpc, n_chunks, s);
  else rmsnorm_bwd_fused_run<8>(dy, x, w, rstd, dx, dx_act, c->act, part, rows, d, th, rpc, n_chunks, s);
  k_rmsnorm_bwd_dw_sum<<<(d + K_CUDA_THREADS - 1) / K_CUDA_THREADS, K_CUDA_THREADS, 0, s>>>(part, dw, d, n_chunks);
  CUDA_LAUNCH_CHECK("k_rmsnorm_bwd_dw_sum");
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding: one thread per (row r, pair i), looping over heads, so the angle is computed
// once per (row, i). Rows are sequence-major: row r = t * B + b has position pos0 + r / B. Angles
// in double like the reference: positions reach thousands, where a float angle loses the low bits.

template <typename E>
__global__ void k_rope(E *x, int64_t rows, int B, int H, int hd, int64_t ld, int pos0, float theta, int inverse) {
  const int half = hd / 2;
  GRID_STRIDE(idx, rows * half) {
    const int64_t r = idx / half;
    const int i = (int)(idx % half);
    const double pos = (double)pos0 + (double)(r / B);
    const double ang = pos * pow((double)theta, -2.0 * i / hd);
    double sd, cd;
    sincos(ang, &sd, &cd);
    const float c = (float)cd, sn = inverse ? (float)-sd : (float)sd;
    for (int h = 0; h < H; h++) {
      E *xh = x + r * ld + (int64_t)h * hd;
      const float x0 = k_ld(xh[i]), x1 = k_ld(xh[half + i]);
      xh[i] = k_st<E>(x0 * c - x1 * sn);
      xh[half + i] = k_st<E>(x0 * sn + x1 * c);
    }
  }
}

// The vector path: the (T, half) table of (cos, sin) is computed once (the same expressions as
// k_rope, so the same floats), then one thread per (row, head, W pairs) rotates W pairs with two
// 16-byte loads and stores. Needs half a multiple of W and 16-byte aligned x and row stride.
__global__ void k_rope_table(float2 *cs, int T, int hd, int pos0, float theta, int inverse) {
  const int half = hd / 2;
  GRID_STRIDE(idx, (int64_t)T * half) {
    const int64_t t = idx / half;
    const int i = (int)(idx % half);
    const double pos = (double)pos0 + (double)t;
    const double ang = pos * pow((double)theta, -2.0 * i / hd);
    double sd, cd;
    sincos(ang, &sd, &cd);
    cs[idx] = make_float2((float)cd, inverse ? (float)-sd : (float)sd);
  }
}

template <typename E>
__global__ void k_rope_vec(E *x, const float2 *cs, int64_t rows, int B, int H, int hd, int64_t ld) {
  constexpr int W = k_vec<E>::N;
  const int half = hd / 2, G = half / W, hg = H * G;
  GRID_STRIDE(idx, rows * hg) {
    const int64_t r = idx / hg;
    const int rem = (int)(idx - r * hg), h = rem / G, i0 = (rem - h * G) * W;
    E *xh = x + r * ld + (int64_t)h * hd + i0;
    const float4 *c4 = (const float4 *)(cs + (r / B) * half + i0);  // W (cos, sin) pairs
    float x0[W], x1[W], t[2 * W];
    k_unpack<E>(*(const uint4 *)xh, x0);
    k_unpack<E>(*(const uint4 *)(xh + half), x1);
#pragma unroll
    for (int k = 0; k < W / 2; k++) {
      const float4 q = __ldg(c4 + k);
      t[4 * k] = q.x, t[4 * k + 1] = q.y, t[4 * k + 2] = q.z, t[4 * k + 3] = q.w;
    }
#pragma unroll
    for (int e = 0; e < W; e++) {
      const float c = t[2 * e], sn = t[2 * e + 1], a = x0[e], b = x1[e];
      x0[e] = a * c - b * sn;
      x1[e] = a * sn + b * c;
    }
    *(uint4 *)xh = k_pack<E>(x0);
    *(uint4 *)(xh + half) = k_pack<E>(x1);
  }
}

template <typename E>
static void rope_run(k_cuda_ctx *c, void *x, int64_t rows, int B, int H, int hd, int64_t ld, int pos0, float theta,
                     int inverse) {
  constexpr int W = k_vec<E>::N;
  cudaStream_t s = c->stream;
  if ((hd / 2) % W == 0 && k_aligned16((uintptr_t)x | (uint64_t)ld * sizeof(E))) {
    const int T = (int)(rows / B), half = hd / 2;
    float2 *cs = (float2 *)k_cuda_scratch(c, sizeof(float2) * (size_t)T * half);
    k_rope_table<<<k_cuda_blocks((int64_t)T * half, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(cs, T, hd, pos0, theta,
                                                                                            inverse);
    CUDA_LAUNCH_CHECK("k_rope_table");
    const int64_t nv = rows * H * (half / W);
    k_rope_vec<E><<<k_cuda_blocks(nv, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((E *)x, cs, rows, B, H, hd, ld);
    CUDA_LAUNCH_CHECK("k_rope_vec");
    return;
  }
  const int64_t n = rows * (hd / 2);
  k_rope<E><<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((E *)x, rows, B, H, hd, ld, pos0, theta,
                                                                         inverse);
  CUDA_LAUNCH_CHECK("k_rope");
}

extern "C" void k_cuda_rope(k_backend *b, void *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse) {
  CHECK(hd % 2 == 0, "rope needs an even head dim, got hd=%d", hd);
  CHECK(ld >= (int64_t)H * hd, "rope: row stride %lld < H*hd = %d", (long long)ld, H * hd);
  const int64_t rows = (int64_t)B * T, n = rows * (hd / 2);
  if (n <= 0 || H <= 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) rope_run<k_bf16>(c, x, rows, B, H, hd, ld, pos0, theta, inverse);
  else rope_run<float>(c, x, rows, B, H, hd, ld, pos0, theta, inverse);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU on the fused gate|up rows: element (r, j) reads gu[r][j] and gu[r][n + j].

// Rows along grid y, columns along x: no index division per element.
#define SWIGLU_LOOP(r, j, n)                                                     \
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)                        \
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (n); j += gridDim.x * blockDim.x)

template <typename E>
__global__ void k_swiglu_fwd(const E *gu, E *out, int64_t rows, int n) {
  SWIGLU_LOOP(r, j, n) {
    const E *row = gu + r * 2 * n;
    out[r * n + j] = k_st<E>(k_swiglu(k_ld(row[j]), k_ld(row[n + j])));
  }
}

template <typename E>
__global__ void k_swiglu_bwd(const E *dout, const E *gu, E *dgu, int64_t rows, int n) {
  SWIGLU_LOOP(r, j, n) {
    const E *row = gu + r * 2 * n;
    E *drow = dgu + r * 2 * n;
    float dg, du;
    k_swiglu_grad(k_ld(row[j]), k_ld(row[n + j]), k_ld(dout[r * n + j]), &dg, &du);
    drow[j] = k_st<E>(dg);
    drow[n + j] = k_st<E>(du);
  }
}

// The same on 16-byte vectors, when n is a multiple of the vector width and the buffers are
// 16-byte aligned (so every row is): nv = n / W vectors per row, the expressions as above.
template <typename E>
__global__ void k_swiglu_fwd_vec(const uint4 *gu, uint4 *out, int64_t rows, int nv) {
  constexpr int W = k_vec<E>::N;
  SWIGLU_LOOP(r, j, nv) {
    float g[W], u[W];
    k_unpack<E>(gu[r * 2 * nv + j], g);
    k_unpack<E>(gu[r * 2 * nv + nv + j], u);
#pragma unroll
    for (int e = 0; e < W; e++) g[e] = k_swiglu(g[e], u[e]);
    out[r * nv + j] = k_pack<E>(g);
  }
}

template <typename E>
__global__ void k_swiglu_bwd_vec(const uint4 *dout, const uint4 *gu, uint4 *dgu, int64_t rows, int nv) {
  constexpr int W = k_vec<E>::N;
  SWIGLU_LOOP(r, j, nv) {
    float g[W], u[W], d[W];
    k_unpack<E>(gu[r * 2 * nv + j], g);
    k_unpack<E>(gu[r * 2 * nv + nv + j], u);
    k_unpack<E>(dout[r * nv + j], d);
    float dg[W], du[W];
#pragma unroll
    for (int e = 0; e < W; e++) k_swiglu_grad(g[e], u[e], d[e], &dg[e], &du[e]);
    dgu[r * 2 * nv + j] = k_pack<E>(dg);
    dgu[r * 2 * nv + nv + j] = k_pack<E>(du);
  }
}

static dim3 swiglu_grid(int64_t rows, int n) {
  const int64_t bx = (n + K_CUDA_THREADS - 1) / K_CUDA_THREADS;
  return dim3((unsigned)(bx < 1024 ? bx : 1024), (unsigned)(rows < 65535 ? rows : 65535));
}

template <typename E>
static void swiglu_fwd_run(const void *gu, void *out, int64_t rows, int n, cudaStream_t s) {
  constexpr int W = k_vec<E>::N;
  if (n % W == 0 && k_aligned16((uintptr_t)gu | (uintptr_t)out)) {
    k_swiglu_fwd_vec<E><<<swiglu_grid(rows, n / W), K_CUDA_THREADS, 0, s>>>(
        (const uint4 *)gu, (uint4 *)out, rows, n / W);
    CUDA_LAUNCH_CHECK("k_swiglu_fwd_vec");
    return;
  }
  k_swiglu_fwd<E><<<swiglu_grid(rows, n), K_CUDA_THREADS, 0, s>>>((const E *)gu, (E *)out, rows, n);
  CUDA_LAUNCH_CHECK("k_swiglu_fwd");
}

template <typename E>
static void swiglu_bwd_run(const void *dout, const void *gu, void *dgu, int64_t rows, int n, cudaStream_t s) {
  constexpr int W = k_vec<E>::N;
  if (n % W == 0 && k_aligned16((uintptr_t)dout | (uintptr_t)gu | (uintptr_t)dgu)) {
    k_swiglu_bwd_vec<E><<<swiglu_grid(rows, n / W), K_CUDA_THREADS, 0, s>>>(
        (const uint4 *)dout, (const uint4 *)gu, (uint4 *)dgu, rows, n / W);
    CUDA_LAUNCH_CHECK("k_swiglu_bwd_vec");
    return;
  }
  k_swiglu_bwd<E><<<swiglu_grid(rows, n), K_CUDA_THREADS, 0, s>>>((const E *)dout, (const E *)gu, (E *)dgu, rows, n);
  CUDA_LAUNCH_CHECK("k_swiglu_bwd");
}

extern "C" void k_cuda_swiglu_fwd(k_backend *b, const void *gu, void *out, int64_t rows, int n) {
  if (rows <= 0 || n <= 0) return;
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) swiglu_fwd_run<k_bf16>(gu, out, rows, n, c->stream);
  else swiglu_fwd_run<float>(gu, out, rows, n, c->stream);
}

extern "C" void k_cuda_swiglu_bwd(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n) {
  if (rows <= 0 || n <= 0) return;
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) swiglu_bwd_run<k_bf16>(dout, gu, dgu, rows, n, c->stream);
  else swiglu_bwd_run<float>(dout, gu, dgu, rows, n, c->stream);
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding

template <typename T>
__global__ void k_embed_fwd(const int32_t *tokens, const T *table, float *out, int d, int v0, int n_vocab_local) {
  const int64_t i = blockIdx.x;
  const int64_t row = (int64_t)tokens[i] - v0;
  const bool local = row >= 0 && row < n_vocab_local;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = local ? k_ld(table[row * d + j]) : 0.0f;
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

extern "C" void k_cuda_embed_fwd(k_backend *b, const int32_t *tokens, const void *table, float *out, int64_t n, int d, int v0,
                                 int n_vocab_local) {
  if (n <= 0 || d <= 0) return;
  CHECK(n <= INT_MAX, "embed: %lld tokens is more than one launch takes", (long long)n);
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  if (c->act == K_BF16)
    k_embed_fwd<<<(unsigned)n, row_threads(d), 0, s>>>(tokens, (const k_bf16 *)table, out, d, v0, n_vocab_local);
  else
    k_embed_fwd<<<(unsigned)n, row_threads(d), 0, s>>>(tokens, (const float *)table, out, d, v0, n_vocab_local);
  CUDA_LAUNCH_CHECK("k_embed_fwd");
}

extern "C" void k_cuda_embed_bwd(k_backend *b, const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                                 int n_vocab_local) {
  if (n <= 0 || d <= 0 || n_vocab_local <= 0) return;
  CHECK(n < INT_MAX / 4, "embed: %lld tokens is more than the sort takes", (long long)n);
  CHECK(n_vocab_local < INT_MAX, "embed: n_vocab_local=%d too large", n_vocab_local);
  const int ni = (int)n;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  int end_bit = 1;  // sort only the bits the keys use (they are <= n_vocab_local)
  while (end_bit < 31 && ((int64_t)1 << end_bit) <= n_vocab_local) end_bit++;
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                             (const int32_t *)NULL, (int32_t *)NULL, ni, 0, end_bit, s));
  const size_t arr = ((size_t)ni * sizeof(int32_t) + 255) / 256 * 256;
  char *ws = (char *)k_cuda_scratch(c, 4 * arr + sort_bytes);
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
// Residual add

template <typename S>
__global__ void k_add(float *y, const S *x, int64_t n) {
  GRID_STRIDE(i, n) y[i] += k_ld(x[i]);
}

// Four floats a thread per load and store: the tensor-parallel reductions' adds are 64 MiB and
// more, where the scalar kernel reached about half the memory bandwidth.
__global__ void k_add_x4(float4 *y, const float4 *x, int64_t n4) {
  GRID_STRIDE(i, n4) {
    float4 a = y[i];
    const float4 b = x[i];
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    y[i] = a;
  }
}

// The same from four bf16 (one 8-byte load), widened exactly.
__global__ void k_add_bf16_x4(float4 *y, const uint2 *x, int64_t n4) {
  GRID_STRIDE(i, n4) {
    float4 a = y[i];
    const uint2 u = x[i];
    a.x += __uint_as_float(u.x << 16), a.y += __uint_as_float(u.x & 0xffff0000u);
    a.z += __uint_as_float(u.y << 16), a.w += __uint_as_float(u.y & 0xffff0000u);
    y[i] = a;
  }
}

extern "C" void k_cuda_add(k_backend *b, float *y, const void *x, k_dtype x_type, int64_t n) {
  CHECK(x_type == K_F32 || x_type == K_BF16, "add: x of dtype %d (fp32 or bf16)", (int)x_type);
  if (n <= 0) return;
  cudaStream_t s = k_cuda_ctx_of(b)->stream;
  const bool bf16 = x_type == K_BF16;
  const int64_t n4 = (uintptr_t)y % 16 == 0 && (uintptr_t)x % (bf16 ? 8 : 16) == 0 ? n / 4 : 0, o = 4 * n4;
  if (n4 && bf16)
    k_add_bf16_x4<<<k_cuda_blocks(n4, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((float4 *)y, (const uint2 *)x, n4);
  else if (n4)
    k_add_x4<<<k_cuda_blocks(n4, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>((float4 *)y, (const float4 *)x, n4);
  CUDA_LAUNCH_CHECK("k_add_x4");
  if (n > o && bf16)
    k_add<<<k_cuda_blocks(n - o, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(y + o, (const k_bf16 *)x + o, n - o);
  else if (n > o)
    k_add<<<k_cuda_blocks(n - o, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(y + o, (const float *)x + o, n - o);
  CUDA_LAUNCH_CHECK("k_add");
}
