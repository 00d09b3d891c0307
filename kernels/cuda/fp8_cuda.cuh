// FP8 device helpers shared by the kernels that write FP8 codes (fp8_cuda.cu; the RMSNorm with
// FP8 codes in ops_cuda.cu): the conversion of kernels/cpu/fp8_cpu.h (cvt.rn.satfinite after a
// clamp to +-largest finite, NaN written as 0x7F) and the amax's order (|x| bits).
#ifndef KERNELS_CUDA_FP8_CUDA_CUH
#define KERNELS_CUDA_FP8_CUDA_CUH

#include "kernels/backend.h"

#include <cuda_fp8.h>
#include <stdint.h>

// Codes of a and b in fmt F, a in the low byte.
template <k_fp8 F>
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
  const float m = F == K_E4M3 ? 448.0f : 57344.0f;
  const __nv_fp8_interpretation_t fi = F == K_E4M3 ? __NV_E4M3 : __NV_E5M2;
  uint32_t r = __nv_cvt_float2_to_fp8x2(make_float2(fminf(fmaxf(a, -m), m), fminf(fmaxf(b, -m), m)), __NV_SATFINITE, fi);
  if (a != a) r = (r & 0xff00u) | 0x7fu;
  if (b != b) r = (r & 0x00ffu) | 0x7f00u;
  return r;
}

// |x| bits as an unsigned integer (the amax's order: non-negative floats order like their bits,
// and a NaN's bits exceed Inf's).
__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// The max of v over a whole (all lanes active) warp, then one atomicMax into *amax's bits by lane
// 0, skipped when not larger (same result either way). Integer max: deterministic.
__device__ __forceinline__ void amax_commit_warp(uint32_t v, float *amax) {
  v = __reduce_max_sync(0xffffffffu, v);
  unsigned int *a = (unsigned int *)amax;
  if ((threadIdx.x & 31) == 0 && v > *(volatile unsigned int *)a) atomicMax(a, v);
}

#endif
