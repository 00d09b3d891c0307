// Gradient compression for the data-parallel reduction (parallel/step/grad_compress.c): the
// element arithmetic every backend follows bit for bit, and the CPU reference of the backend's
// quantise / dequantise ops (kernels/backend.h: grad_amax, quant16, dequant16, quant_i8,
// dequant_i8). The inline functions are compiled for the host and, under nvcc, for the device,
// so kernels/cuda/quant_cuda.cu rounds with the same code rather than with look-alike intrinsics.
//   fp16: IEEE binary16 (largest finite 65504, subnormals 2^-24 apart), round to nearest even,
//         overflow to Inf, NaN as 0x7E00 (sign kept). A power-of-two scale 2^e is applied before
//         the rounding and removed after the widening: both exact, so the scale adds no error.
//   int8: blocks of K_QBLOCK elements, each with an fp32 scale = amax / 127 (amax the block's
//         largest magnitude); code = rint(v * (127 / amax)) in [-127, 127]; a block whose amax is
//         0 is all zeros; one whose amax is NaN or Inf keeps that scale (its values dequantise to
//         NaN, so the step's gradient norm says so) and codes 0.
//   Error feedback: v = src + res is what is quantised, and res becomes v - dequant(code), what
//         the quantisation dropped, to be added back the next time (0 where that is not finite).
//   NaN: every NaN these ops write is the canonical one (fp32 0x7FC00000, fp16 0x7E00, bf16
//         0x7FC0), whatever the payload and sign of the NaN it came from: CPUs propagate payloads
//         through arithmetic and GPUs do not, and the bits must agree.
#ifndef TRAINER_QUANT_CPU_H
#define TRAINER_QUANT_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"

#ifdef __CUDACC__
#define K_HD __host__ __device__ __forceinline__
#else
#define K_HD static inline
#endif

enum { K_QBLOCK = 256 };  // elements per int8 block (one fp32 scale each: 1.6% more bytes)
#define K_F16_MAX 65504.0f

// Blocks of a span of n elements (the last one may be partial).
K_HD int64_t k_qblocks(int64_t n) { return (n + K_QBLOCK - 1) / K_QBLOCK; }

K_HD uint32_t k_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
K_HD float k_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// fp32 -> IEEE binary16, round to nearest even (subnormals included), overflow to Inf.
K_HD uint16_t k_f32_to_f16(float f) {
  const uint32_t u = k_f32_bits(f), a = u & 0x7fffffffu;
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return 0x7e00u;            // NaN (canonical)
  if (a >= 0x477ff000u) return sign | 0x7c00u;    // >= 65520 rounds past 65504: Inf
  if (a >= 0x38800000u) {                          // normal binary16 (>= 2^-14)
    uint32_t h = (a >> 13) - ((uint32_t)(127 - 15) << 10), rb = a & 0x1fffu;
    if (rb > 0x1000u || (rb == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
  }
  const int e = (int)(a >> 23);                    // subnormal binary16, or zero
  if (e < 102) return sign;                        // below 2^-25: rounds to 0
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const int shift = 126 - e;                       // value = m * 2^(e - 150) = q * 2^-24
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | (uint16_t)q;
}

K_HD float k_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return k_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e) return k_bits_f32(sign | ((e + 127 - 15) << 23) | (m << 13));
  return k_bits_f32(sign) + (float)m * 0x1p-24f * (sign ? -1.0f : 1.0f);  // exact: m < 2^10
}

// bf16 with kernels/bf16.h's rounding, but one NaN code (0x7FC0).
K_HD uint16_t k_f32_to_bf16_hd(float f) {
  uint32_t u = k_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
K_HD float k_bf16_to_f32_hd(uint16_t h) { return k_bits_f32((uint32_t)h << 16); }

// The canonical NaN for any NaN, else v.
K_HD float k_canon_nan(float v) { return v != v ? k_bits_f32(0x7fc00000u) : v; }
// |v| as bits, the order of magnitudes (non-negative floats order like their bits; the NaN,
// canonical, above Inf).
K_HD uint32_t k_abs_bits(float v) { return k_f32_bits(k_canon_nan(v)) & 0x7fffffffu; }

K_HD uint16_t k_half_round(float v, k_dtype t) { return t == K_F16 ? k_f32_to_f16(v) : k_f32_to_bf16_hd(v); }
K_HD float k_half_widen(uint16_t h, k_dtype t) { return t == K_F16 ? k_f16_to_f32(h) : k_bf16_to_f32_hd(h); }

// The exponent e of the fp16 scale 2^e for values up to amax summed over n_sum ranks: the largest
// with n_sum * amax * 2^e <= 65504, so neither an element nor any partial sum over the ranks can
// overflow (each is at most n_sum * amax before its rounding, and rounding a value <= 65504
// stays <= 65504). Clamped to [-100, 100] (the widening 2^-e stays exact); 0 when amax is 0,
// NaN or Inf (the values carry the NaN or Inf through).
K_HD int k_f16_scale_exp(float amax, int n_sum) {
  const float m = amax * (float)n_sum;
  if (!(m > 0.0f) || !(m <= 3.0e38f)) return 0;
  int e = 0;
  frexpf(K_F16_MAX / m, &e);  // K_F16_MAX / m = f 2^e with f in [0.5, 1): floor(log2) = e - 1
  e -= 1;
  return e < -100 ? -100 : e > 100 ? 100 : e;
}

// Scale exponent of quant16 / dequant16: fp16 with an amax, else 0.
K_HD int k_half_scale_exp(const float *amax, int n_sum, k_dtype t) {
  return t == K_F16 && amax ? k_f16_scale_exp(*amax, n_sum) : 0;
}

// One int8 block's scale from its amax.
K_HD float k_i8_scale(float amax) { return k_canon_nan(amax / 127.0f); }
K_HD int8_t k_i8_code(float v, float amax) {
  if (!(amax > 0.0f) || !(amax <= 3.4028235e38f)) return 0;
  float q = rintf(v * (127.0f / amax));
  q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
  return (int8_t)q;
}

#ifndef __CUDACC__
// *amax = max(*amax, max_i |x[i] + res[i]|) (res NULL: |x[i]|) over k_abs_bits; a NaN makes it NaN.
void k_cpu_grad_amax(float *amax, const float *x, const float *res, int64_t n);
// dst[i] = half_t((x[i] + res[i]) * 2^e), e = k_half_scale_exp(amax, n_sum, t); with res, res[i]
// becomes the part dropped; *n_underflow (NULL: not counted) += elements whose value was not 0
// but whose code is +-0. t is K_F16 or K_BF16.
void k_cpu_quant16(void *dst, k_dtype t, const float *x, float *res, int64_t n, const float *amax, int n_sum,
                   int64_t *n_underflow);
// dst[i] = widen(src[i]) * 2^-e, e as quant16's.
void k_cpu_dequant16(float *dst, const void *src, k_dtype t, int64_t n, const float *amax, int n_sum);
// Blocks of K_QBLOCK from x: codes q (n), scales (k_qblocks(n)); with res, error feedback.
void k_cpu_quant_i8(int8_t *q, float *scales, const float *x, float *res, int64_t n);
// dst[i] = sum over s < n_src, in order, of q_s[i] * scales_s[i / K_QBLOCK] in fp32, where q_s and
// scales_s lie stride bytes after q_{s-1} and scales_{s-1}.
void k_cpu_dequant_i8(float *dst, const int8_t *q, const float *scales, int64_t n, int n_src, int64_t stride);
#endif

#endif
