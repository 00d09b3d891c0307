// CPU reference of the gradient-compression ops (semantics in quant_cpu.h). Every element is
// computed by the inline functions the CUDA kernels call, and the sums of dequant_i8 run over
// the sources in order, so the GPU's results match these bit for bit.
#include "kernels/cpu/quant_cpu.h"

#include "kernels/base/check.h"

void k_cpu_grad_amax(float *amax, const float *x, const float *res, int64_t n) {
  uint32_t m = k_abs_bits(*amax);
  for (int64_t i = 0; i < n; i++) {
    const uint32_t a = k_abs_bits(res ? x[i] + res[i] : x[i]);
    if (a > m) m = a;
  }
  *amax = k_bits_f32(m);
}

void k_cpu_quant16(void *dst, k_dtype t, const float *x, float *res, int64_t n, const float *amax, int n_sum,
                   int64_t *n_underflow) {
  CHECK(t == K_F16 || t == K_BF16, "quant16: dtype %d is neither fp16 nor bf16", (int)t);
  const int e = k_half_scale_exp(amax, n_sum, t);
  const float scale = ldexpf(1.0f, e), unscale = ldexpf(1.0f, -e);
  uint16_t *h = dst;
  int64_t under = 0;
  for (int64_t i = 0; i < n; i++) {
    const float v = res ? x[i] + res[i] : x[i];
    h[i] = k_half_round(v * scale, t);
    if (res) {  // Inf or NaN (a step the norm will skip) leaves nothing to carry
      const float r = v - k_half_widen(h[i], t) * unscale;
      res[i] = isfinite(r) ? r : 0.0f;
    }
    under += v != 0.0f && (h[i] & 0x7fffu) == 0;
  }
  if (n_underflow) *n_underflow += under;
}

void k_cpu_dequant16(float *dst, const void *src, k_dtype t, int64_t n, const float *amax, int n_sum) {
  CHECK(t == K_F16 || t == K_BF16, "dequant16: dtype %d is neither fp16 nor bf16", (int)t);
  const float unscale = ldexpf(1.0f, -k_half_scale_exp(amax, n_sum, t));
  const uint16_t *h = src;
  for (int64_t i = 0; i < n; i++) dst[i] = k_canon_nan(k_half_widen(h[i], t) * unscale);
}

void k_cpu_quant_i8(int8_t *q, float *scales, const float *x, float *res, int64_t n) {
  for (int64_t b = 0; b < k_qblocks(n); b++) {
    const int64_t lo = b * K_QBLOCK, hi = lo + K_QBLOCK < n ? lo + K_QBLOCK : n;
    float amax = 0.0f;
    k_cpu_grad_amax(&amax, x + lo, res ? res + lo : NULL, hi - lo);
    const float scale = k_i8_scale(amax);
    scales[b] = scale;
    for (int64_t i = lo; i < hi; i++) {
      const float v = res ? x[i] + res[i] : x[i];
      q[i] = k_i8_code(v, amax);
      if (res) res[i] = isfinite(amax) ? v - (float)q[i] * scale : 0.0f;
    }
  }
}

void k_cpu_dequant_i8(float *dst, const int8_t *q, const float *scales, int64_t n, int n_src, int64_t stride) {
  for (int64_t i = 0; i < n; i++) {
    float acc = 0.0f;
    for (int s = 0; s < n_src; s++) {
      const int8_t *qs = (const int8_t *)((const char *)q + s * stride);
      const float *ss = (const float *)((const char *)scales + s * stride);
      acc += (float)qs[i] * ss[i / K_QBLOCK];
    }
    dst[i] = k_canon_nan(acc);
  }
}
