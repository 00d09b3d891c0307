// What the CUDA translation units share: the backend context (stream, cuBLAS handle, scratch,
// the options it was created with, the caches of cuBLASLt, cuDNN and the optimizer ops),
// element-type conversions, launch sizing and the block reductions. Every launcher finds the
// context through its k_backend argument (k_cuda_ctx_of), so several backends may live in one
// process, each with its own state. The reductions combine in a fixed tree that depends only on
// blockDim, which is what keeps every reduction in these kernels deterministic.
#ifndef TRAINER_CUDA_COMMON_CUH
#define TRAINER_CUDA_COMMON_CUH

#include "kernels/backend.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_check.h"

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

typedef __nv_bfloat16 k_bf16;

// State of the modules the context owns; each is made on first use by its module and freed by
// the backend's release.
struct k_cuda_lt;     // kernels/cuda/gemm_lt.cu: the cuBLASLt handle and plan cache
struct k_cuda_optim;  // kernels/cuda/optim_cuda.cu: device range tables, partial sums
struct k_cuda_lane;   // kernels/cuda/host_cuda.cu: a stream beside the compute stream and its events

struct k_cuda_ctx {
  int device;
  k_dtype act;          // the activation dtype: the element type of every act-typed op argument
  int attn_own;         // attention on the own kernel even where cuDNN's would run
  int attn_atomic;      // cuDNN's attention backward with atomic dq accumulation (k_backend_opts)
  cudaStream_t stream;  // every op and copy of this backend runs here, in order
  cublasHandle_t cublas;
  cublasComputeType_t gemm_compute;  // fp32 activations: CUBLAS_COMPUTE_32F, or _FAST_TF32 (opts.tf32)
  void *cublas_ws;  // a fixed cuBLAS workspace: with it, cuBLAS results are run-to-run reproducible
  size_t cublas_ws_bytes;
  void *scratch;  // ops' temporaries (partial sums, sort buffers), grown on demand
  size_t scratch_bytes;
  k_cuda_lt *lt;         // NULL until the first linear_residual
  k_cudnn_attn *cudnn;   // NULL until the first attention cuDNN may run
  k_cuda_optim *optim;   // NULL until the first optimizer op
  k_cuda_lane *copy;     // the copy stream: NULL until the first copy_async (host_cuda.cu)
  k_cuda_lane *side;     // the side stream: NULL until the first side_begin (host_cuda.cu)
  k_held held;  // what alloc handed out and free has not taken back (mem_held)
};

// The context of a CUDA backend (aborts on another kind of backend).
static inline k_cuda_ctx *k_cuda_ctx_of(const k_backend *b) {
  CHECK(b != NULL && b->ctx != NULL && b->name != NULL && strcmp(b->name, "cuda") == 0,
        "a CUDA op was given %s, not a live CUDA backend", b && b->name ? b->name : "no backend");
  return (k_cuda_ctx *)b->ctx;
}
// At least n_bytes of c's device scratch, valid until the next call. Ops on the one stream run
// in order, so an op may use it for its own kernels without further synchronisation.
void *k_cuda_scratch(k_cuda_ctx *c, size_t n_bytes);

// Free a module's state and set the pointer to NULL (safe twice); the backend's release calls
// them once its stream is idle.
void k_cuda_lt_free(k_cuda_lt **lt);
void k_cuda_optim_free(k_cuda_optim **o);
void k_cuda_lane_free(k_cuda_lane **k);

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

// 16-byte vectors of act elements (8 bf16 or 4 fp32): one access per vector, widened to fp32
// exactly on load (bf16 is the high half of an fp32) and rounded on store like k_st.
template <typename E>
struct k_vec {
  enum { N = 16 / (int)sizeof(E) };
};
template <typename E>
__device__ __forceinline__ void k_unpack(uint4 u, float *f);
template <>
__device__ __forceinline__ void k_unpack<float>(uint4 u, float *f) {
  f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
template <>
__device__ __forceinline__ void k_unpack<k_bf16>(uint4 u, float *f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
template <typename E>
__device__ __forceinline__ uint4 k_pack(const float *f);
template <>
__device__ __forceinline__ uint4 k_pack<float>(const float *f) {
  return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <>
__device__ __forceinline__ uint4 k_pack<k_bf16>(const float *f) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    w[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i])) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1])) << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Elements of E before the first 16-byte boundary at or after p (at most n): a row's scalar head,
// after which its body is whole vectors.
template <typename E>
__device__ __forceinline__ int k_vec_head(const E *p, int n) {
  const int h = (int)((16 - (uintptr_t)p % 16) % 16 / sizeof(E));
  return h < n ? h : n;
}

// Whether every pointer or byte count in a is a multiple of 16 (the vector paths' precondition).
static inline bool k_aligned16(uint64_t a) { return a % 16 == 0; }

enum { K_CUDA_THREADS = 256 };

// SwiGLU of one element, silu(g) * u: the one expression of swiglu_fwd and swiglu_fwd_fp8.
__device__ __forceinline__ float k_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }
// SwiGLU's backward of one element: the gradients of gate g and up u from the output's d, with
// d silu(g)/dg = sig(g) (1 + g (1 - sig(g))); the one expression of swiglu_bwd and swiglu_bwd_fp8.
__device__ __forceinline__ void k_swiglu_grad(float g, float u, float d, float *dg, float *du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  *dg = d * u * sig * (1.0f + g * (1.0f - sig));
  *du = d * g * sig;
}

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
