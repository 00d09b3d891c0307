// Gradient compression on the GPU (kernels/backend.h: grad_amax, quant16, dequant16, quant_i8,
// dequant_i8), bit for bit the CPU reference of kernels/cpu/quant_cpu.c: the rounding and the
// scales are the same inline functions (quant_cpu.h, compiled for the device), and every
// multiply-then-add is written with __fmul_rn / __fadd_rn / __fsub_rn so nvcc cannot contract
// it into an FMA the CPU does not do. Maxima are taken over the bits of |x| (non-negative floats
// order like their bits, a NaN above Inf) and counts are integers, so the atomics that combine
// blocks are order-independent and the results deterministic.
//
// quant_i8 gives each block of K_QBLOCK = 256 elements to one warp: a lane reads 8 elements
// (coalesced, 32 apart), the warp's max gives the block's scale, and the codes and the residual
// are written from registers: one pass over x and res.
#include "kernels/cpu/quant_cpu.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

__device__ __forceinline__ float v_of(const float *x, const float *res, int64_t i) {
  return res ? __fadd_rn(x[i], res[i]) : x[i];
}

__device__ __forceinline__ uint32_t block_max_bits(uint32_t v) {
  __shared__ uint32_t sh[K_CUDA_THREADS / 32];
  v = __reduce_max_sync(0xffffffffu, v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < K_CUDA_THREADS / 32 ? sh[threadIdx.x & 31] : 0u;
  if (threadIdx.x < 32) v = __reduce_max_sync(0xffffffffu, v);
  return v;
}

__global__ void __launch_bounds__(K_CUDA_THREADS) k_grad_amax(float *amax, const float *x, const float *res, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    m = max(m, k_abs_bits(v_of(x, res, i)));
  m = block_max_bits(m);
  if (threadIdx.x == 0) atomicMax((unsigned int *)amax, m);  // *amax is non-negative or the canonical NaN
}

extern "C" void k_cuda_grad_amax(k_backend *b, float *amax, const float *x, const float *res, int64_t n) {
  CHECK(n >= 0, "grad_amax: n=%lld must be non-negative", (long long)n);
  if (n == 0) return;
  k_grad_amax<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_ctx_of(b)->stream>>>(amax, x, res, n);
  CUDA_LAUNCH_CHECK("k_grad_amax");
}

template <k_dtype T>
__global__ void __launch_bounds__(K_CUDA_THREADS) k_quant16(uint16_t *dst, const float *x, float *res, int64_t n,
                                                            const float *amax, int n_sum,
                                                            unsigned long long *n_underflow) {
  const int e = k_half_scale_exp(amax, n_sum, T);
  const float scale = ldexpf(1.0f, e), unscale = ldexpf(1.0f, -e);
  unsigned long long under = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = v_of(x, res, i);
    const uint16_t h = k_half_round(__fmul_rn(v, scale), T);
    dst[i] = h;
    if (res) {
      const float r = __fsub_rn(v, __fmul_rn(k_half_widen(h, T), unscale));
      res[i] = isfinite(r) ? r : 0.0f;
    }
    under += v != 0.0f && (h & 0x7fffu) == 0;
  }
  if (!n_underflow) return;
  __shared__ unsigned long long sh[32];
  under = k_block_sum(under, sh);
  if (threadIdx.x == 0 && under) atomicAdd(n_underflow, under);
}

extern "C" void k_cuda_quant16(k_backend *b, void *dst, k_dtype t, const float *x, float *res, int64_t n,
                               const float *amax, int n_sum, int64_t *n_underflow) {
  CHECK(t == K_F16 || t == K_BF16, "quant16: dtype %d is neither fp16 nor bf16", (int)t);
  CHECK(n >= 0, "quant16: n=%lld must be non-negative", (long long)n);
  if (n == 0) return;
  cudaStream_t s = k_cuda_ctx_of(b)->stream;
  unsigned long long *u = (unsigned long long *)n_underflow;
  const unsigned grid = k_cuda_blocks(n, K_CUDA_THREADS);
  if (t == K_F16) k_quant16<K_F16><<<grid, K_CUDA_THREADS, 0, s>>>((uint16_t *)dst, x, res, n, amax, n_sum, u);
  else k_quant16<K_BF16><<<grid, K_CUDA_THREADS, 0, s>>>((uint16_t *)dst, x, res, n, amax, n_sum, u);
  CUDA_LAUNCH_CHECK("k_quant16");
}

template <k_dtype T>
__global__ void k_dequant16(float *dst, const uint16_t *src, int64_t n, const float *amax, int n_sum) {
  const float unscale = ldexpf(1.0f, -k_half_scale_exp(amax, n_sum, T));
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = k_canon_nan(__fmul_rn(k_half_widen(src[i], T), unscale));
}

extern "C" void k_cuda_dequant16(k_backend *b, float *dst, const void *src, k_dtype t, int64_t n, const float *amax,
                                 int n_sum) {
  CHECK(t == K_F16 || t == K_BF16, "dequant16: dtype %d is neither fp16 nor bf16", (int)t);
  CHECK(n >= 0, "dequant16: n=%lld must be non-negative", (long long)n);
  if (n == 0) return;
  cudaStream_t s = k_cuda_ctx_of(b)->stream;
  const unsigned grid = k_cuda_blocks(n, K_CUDA_THREADS);
  if (t == K_F16) k_dequant16<K_F16><<<grid, K_CUDA_THREADS, 0, s>>>(dst, (const uint16_t *)src, n, amax, n_sum);
  else k_dequant16<K_BF16><<<grid, K_CUDA_THREADS, 0, s>>>(dst, (const uint16_t *)src, n, amax, n_sum);
  CUDA_LAUNCH_CHECK("k_dequant16");
}

enum { QI8_PER_LANE = K_QBLOCK / 32, QI8_WARPS = 8 };

__global__ void __launch_bounds__(QI8_WARPS * 32) k_quant_i8(int8_t *q, float *scales, const float *x, float *res,
                                                             int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t blk = (int64_t)blockIdx.x * QI8_WARPS + (threadIdx.x >> 5);
  if (blk >= k_qblocks(n)) return;  // a whole warp leaves together
  const int64_t lo = blk * K_QBLOCK;
  float v[QI8_PER_LANE];
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < QI8_PER_LANE; k++) {
    const int64_t i = lo + lane + 32 * k;
    v[k] = i < n ? v_of(x, res, i) : 0.0f;
    m = max(m, k_abs_bits(v[k]));
  }
  const float amax = k_bits_f32(__reduce_max_sync(0xffffffffu, m)), scale = k_i8_scale(amax);
  if (lane == 0) scales[blk] = scale;
#pragma unroll
  for (int k = 0; k < QI8_PER_LANE; k++) {
    const int64_t i = lo + lane + 32 * k;
    if (i >= n) continue;
    const int8_t c = k_i8_code(v[k], amax);
    q[i] = c;
    if (res) res[i] = isfinite(amax) ? __fsub_rn(v[k], __fmul_rn((float)c, scale)) : 0.0f;
  }
}

extern "C" void k_cuda_quant_i8(k_backend *b, int8_t *q, float *scales, const float *x, float *res, int64_t n) {
  CHECK(n >= 0, "quant_i8: n=%lld must be non-negative", (long long)n);
  if (n == 0) return;
  const int64_t grid = (k_qblocks(n) + QI8_WARPS - 1) / QI8_WARPS;
  CHECK(grid < ((int64_t)1 << 31), "quant_i8: n=%lld too large", (long long)n);
  k_quant_i8<<<(unsigned)grid, QI8_WARPS * 32, 0, k_cuda_ctx_of(b)->stream>>>(q, scales, x, res, n);
  CUDA_LAUNCH_CHECK("k_quant_i8");
}

__global__ void k_dequant_i8(float *dst, const int8_t *q, const float *scales, int64_t n, int n_src, int64_t stride) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_src; s++) {
      const int8_t *qs = (const int8_t *)((const char *)q + s * stride);
      const float *ss = (const float *)((const char *)scales + s * stride);
      acc = __fadd_rn(acc, __fmul_rn((float)qs[i], ss[i / K_QBLOCK]));
    }
    dst[i] = k_canon_nan(acc);
  }
}

extern "C" void k_cuda_dequant_i8(k_backend *b, float *dst, const int8_t *q, const float *scales, int64_t n, int n_src,
                                  int64_t stride) {
  CHECK(n >= 0 && n_src >= 0, "dequant_i8: n=%lld n_src=%d must be non-negative", (long long)n, n_src);
  if (n == 0) return;
  k_dequant_i8<<<k_cuda_blocks(n, K_CUDA_THREADS), K_CUDA_THREADS, 0, k_cuda_ctx_of(b)->stream>>>(dst, q, scales, n,
                                                                                                n_src, stride);
  CUDA_LAUNCH_CHECK("k_dequant_i8");
}
