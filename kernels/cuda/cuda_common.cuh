// What the CUDA translation units share: the backend context (stream, cuBLAS handle, scratch,
// activation dtype), element-type conversions, launch sizing and the block reductions. The
// reductions combine in a fixed tree that depends only on blockDim, which is what keeps every
// reduction in these kernels deterministic.
#ifndef TRAINER_CUDA_COMMON_CUH
#define TRAINER_CUDA_COMMON_CUH

#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 k_bf16;

struct k_cuda_ctx {
  int device;
  k_dtype act;          // the activation dtype: the element type of every act-typed op argument
  cudaStream_t stream;  // every op and copy of this backend runs here, in order
  cublasHandle_t cublas;
  cublasComputeType_t gemm_compute;  // CUBLAS_COMPUTE_32F, or _FAST_TF32 with TRAINER_CUDA_TF32=1
  void *cublas_ws;  // a fixed cuBLAS workspace: with it, cuBLAS results are run-to-run reproducible
  size_t cublas_ws_bytes;
  void *scratch;  // ops' temporaries (partial sums, sort buffers), grown on demand
  size_t scratch_bytes;
};

// The context of the most recently created backend; aborts when there is none.
k_cuda_ctx *k_cuda_cur(void);
// At least n_bytes of device scratch, valid until the next call. Ops on the one stream run in
// order, so an op may use it for its own kernels without further synchronisation.
void *k_cuda_scratch(size_t n_bytes);

// The activation dtype of the current backend: the act-typed ops dispatch on it.
static inline k_dtype k_cuda_act(void) { return k_cuda_cur()->act; }

// Element types of act tensors: loads widen to fp32, where all math is done; stores round to
// nearest even (NaN stays NaN, overflow goes to Inf).
__device__ __forceinline__ float k_ld(float x) { return x; }
__device__ __forceinline__ float k_ld(k_bf16 x) { return __bfloat162float(x); }
template <typename E>
__device__ __forceinline__ E k_st(float x);
template <>
__device__ __forceinline__ float k_st<float>(float x) { return x; }
template <>
__device__ __forceinline__ k_bf16 k_st<k_bf16>(float x) { return __float2bfloat16_rn(x); }

enum { K_CUDA_THREADS = 256 };

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, no more.
static inline unsigned k_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  const int64_t cap = 1 << 16;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

template <typename T>
__device__ __forceinline__ T k_warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// NaN never wins (the CPU reference's `x > m ? x : m` ignores NaNs the same way).
__device__ __forceinline__ float k_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// sh: 32 elements of shared memory, reused, so the call starts and ends with a barrier.
template <typename T>
__device__ __forceinline__ T k_block_sum(T v, T *sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = k_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : T(0);
  v = k_warp_sum(v);
  __syncthreads();
  return v;
}

__device__ __forceinline__ float k_block_max(float v, float *sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = k_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -3.402823466e38f;
  v = k_warp_max(v);
  __syncthreads();
  return v;
}

#endif
