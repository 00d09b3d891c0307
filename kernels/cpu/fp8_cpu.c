// FP8 reference kernels (kernels/cpu/fp8_cpu.h): the bit-level encoding and decoding, the cast
// with its transpose and amax, the FP8 GEMM by exact decoding, and delayed scaling's update.
// Integer arithmetic on the float's bits throughout the encoder, so the result does not depend
// on the host's rounding mode or on how the compiler evaluates floating point.
#include "kernels/cpu/fp8_cpu.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/cpu/ops_cpu.h"

// Per format: mantissa bits, exponent bias, largest finite code.
static void fmt_params(k_fp8 f, int *mbits, int *bias, int *max_code) {
  CHECK(f == K_E4M3 || f == K_E5M2, "unknown FP8 format %d (K_E4M3 or K_E5M2)", (int)f);
  *mbits = f == K_E4M3 ? 3 : 2;
  *bias = f == K_E4M3 ? 7 : 15;
  *max_code = f == K_E4M3 ? 0x7E : 0x7B;
}

// |x| = sig * 2^(e - 23) with sig = 1.m (24 bits). The target's quantum (the spacing of its
// values) at that magnitude is 2^(E - mbits) with E = max(e, 1 - bias) (below the smallest
// normal the spacing is the subnormals'). q = |x| / quantum rounded to nearest even; then the code
// is ((E + bias - 1) << mbits) + q, which holds across the subnormal/normal boundary and when the
// rounding carries into the next binade (q = 2^(mbits+1)). Codes past the largest finite one
// (E4M3's 0x7F is NaN, E5M2's 0x7C Inf) saturate.
uint8_t k_cpu_fp8_encode(float x, k_fp8 fmt) {
  int mbits, bias, max_code;
  fmt_params(fmt, &mbits, &bias, &max_code);
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7F;                        // NaN
  if (a == 0x7f800000u) return (uint8_t)(sign | max_code);  // Inf saturates
  const int ef = (int)(a >> 23);
  if (ef == 0) return sign;  // fp32 subnormal: far below half of the smallest FP8 subnormal
  const int e = ef - 127, E = e > 1 - bias ? e : 1 - bias;
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const int sh = (E - mbits) - (e - 23);  // bits of sig below the quantum: >= 23 - mbits
  if (sh > 25) return sign;               // |x| < quantum / 2
  uint32_t q = sig >> sh;
  const uint32_t rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  const int64_t code = ((int64_t)(E + bias - 1) << mbits) + q;
  return (uint8_t)(sign | (code > max_code ? max_code : (int)code));
}

float k_cpu_fp8_decode(uint8_t code, k_fp8 fmt) {
  int mbits, bias, max_code;
  fmt_params(fmt, &mbits, &bias, &max_code);
  const int mag = code & 0x7F, ef = mag >> mbits, m = mag & ((1 << mbits) - 1);
  const float s = (code & 0x80) ? -1.0f : 1.0f;
  if (fmt == K_E4M3 && mag == 0x7F) return NAN;
  if (fmt == K_E5M2 && ef == 31) return m ? NAN : s * INFINITY;
  if (ef == 0) return s * ldexpf((float)m, 1 - bias - mbits);
  return s * ldexpf((float)((1 << mbits) + m), ef - bias - mbits);
}

void k_cpu_fp8_cast(const float *x, int64_t rows, int cols, float scale, k_fp8 fmt, uint8_t *out, uint8_t *out_t, float *amax) {
  CHECK(rows >= 0 && cols >= 0, "fp8_cast shape rows=%lld cols=%d must be non-negative", (long long)rows, cols);
  CHECK(fmt == K_E4M3 || fmt == K_E5M2, "fp8_cast: unknown FP8 format %d", (int)fmt);
  uint32_t m;
  memcpy(&m, amax, sizeof m);
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      const float v = x[r * cols + c];
      const uint8_t q = k_cpu_fp8_encode(v * scale, fmt);
      if (out) out[r * cols + c] = q;
      if (out_t) out_t[(int64_t)c * rows + r] = q;
      uint32_t u;
      memcpy(&u, &v, sizeof u);
      u &= 0x7fffffffu;
      if (u > m) m = u;
    }
  }
  memcpy(amax, &m, sizeof m);
}

void k_cpu_fp8_cast_spans(const float *x, const k_span *spans, int n_spans, const float *scale, k_fp8 fmt, uint8_t *out,
                          float *amax) {
  CHECK(n_spans >= 0 && (fmt == K_E4M3 || fmt == K_E5M2), "fp8_cast_spans: %d spans, format %d", n_spans, (int)fmt);
  for (int k = 0; k < n_spans; k++) {
    const k_span *s = &spans[k];
    CHECK(s->at >= 0 && s->n_elem >= 0 && s->tensor >= 0, "fp8_cast_spans: span %d (%lld elements at %lld, tensor %d)",
          k, (long long)s->n_elem, (long long)s->at, s->tensor);
    const float sc = out ? scale[s->tensor] : 0.0f;
    uint32_t m = 0;
    if (amax) memcpy(&m, &amax[s->tensor], sizeof m);
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int64_t i = s->at; i < s->at + s->n_elem; i++) {
      if (out) out[i] = k_cpu_fp8_encode(x[i] * sc, fmt);
      uint32_t u;
      memcpy(&u, &x[i], sizeof u);
      u &= 0x7fffffffu;
      if (u > m) m = u;
    }
    if (amax) memcpy(&amax[s->tensor], &m, sizeof m);
  }
}

void k_cpu_fp8_transpose(const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t) {
  CHECK(rows >= 0 && cols >= 0, "fp8_transpose shape rows=%lld cols=%d must be non-negative", (long long)rows, cols);
#pragma omp parallel for schedule(static)
  for (int c = 0; c < cols; c++)
    for (int64_t r = 0; r < rows; r++) codes_t[(int64_t)c * rows + r] = codes[r * cols + c];
}

void k_cpu_gemm_fp8(k_isa isa, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, float a_scale_inv, const uint8_t *B,
                    k_fp8 b_fmt, float b_scale_inv, float beta, float *C) {
  char msg[256];
  CHECK(!k_fp8_gemm_check(M, N, K, a_fmt, b_fmt, A, B, C, msg, sizeof msg), "%s", msg);
  float lut_a[256], lut_b[256];
  for (int i = 0; i < 256; i++) lut_a[i] = k_cpu_fp8_decode((uint8_t)i, a_fmt), lut_b[i] = k_cpu_fp8_decode((uint8_t)i, b_fmt);
  const int64_t na = (int64_t)M * K, nb = (int64_t)N * K;
  float *a = XMALLOC(sizeof(float) * (size_t)na), *bb = XMALLOC(sizeof(float) * (size_t)nb);
  for (int64_t i = 0; i < na; i++) a[i] = lut_a[A[i]];
  for (int64_t i = 0; i < nb; i++) bb[i] = lut_b[B[i]];
  k_cpu_gemm_isa(isa, 0, 1, M, N, K, a_scale_inv * b_scale_inv, a, K, bb, K, beta, C, N);
  free(a);
  free(bb);
}

void k_cpu_fp8_scales(float *amax_history, float *amax, float *scale, float *scale_inv, int inv_stride, const uint8_t *fmt,
                      int n, int len, int pos, int margin, int use_max, int *n_nonfinite) {
  CHECK(n >= 0 && len >= 1 && pos >= 0 && pos < len && inv_stride >= 1,
        "fp8_scales: n=%d len=%d pos=%d inv_stride=%d (need len >= 1, 0 <= pos < len, inv_stride >= 1)", n, len, pos,
        inv_stride);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    CHECK(fmt[i] == K_E4M3 || fmt[i] == K_E5M2, "fp8_scales: tensor %d has unknown FP8 format %d", i, (int)fmt[i]);
    float *h = amax_history + (int64_t)i * len;
    h[pos] = amax[i];
    float a = amax[i];
    if (use_max)
      for (int j = 0; j < len; j++)
        if (isnan(h[j]) || h[j] > a) a = h[j];
    bad += !isfinite(amax[i]);
    if (isfinite(a) && a > 0.0f) {
      float s = ldexpf(k_fp8_max((k_fp8)fmt[i]) / a, -margin);
      s = s < FLT_MIN ? FLT_MIN : s > FLT_MAX ? FLT_MAX : s;
      scale[i] = s;
      scale_inv[(int64_t)i * inv_stride] = 1.0f / s;
    }
    amax[i] = 0.0f;
  }
  *n_nonfinite += bad;
}

// ---------------------------------------------------------------------------------------------
// Block scaling (fp8_cpu.h: K_FP8_BLOCK).

// The scale of a tile from its amax's bits: 448 / amax, clamped; 1 for an amax of 0, NaN or Inf.
static float block_scale(uint32_t amax_bits) {
  float a;
  memcpy(&a, &amax_bits, sizeof a);
  if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
  const float s = 448.0f / a;
  return s < FLT_MIN ? FLT_MIN : s > FLT_MAX ? FLT_MAX : s;
}

static uint32_t abs_bits_of(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u & 0x7fffffffu;
}

// One tile: rows [r0, r1), columns [c0, c1) of x, scaled from the tile's own amax. Codes go to
// out (rows, cols) and/or out_t (cols, rows); *si / *si_t get 1 / s. Returns the tile's amax bits.
static uint32_t cast_tile(const float *x, int64_t rows, int cols, int64_t r0, int64_t r1, int c0, int c1, uint8_t *out,
                          float *si, uint8_t *out_t, float *si_t) {
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; r++)
    for (int c = c0; c < c1; c++) {
      const uint32_t u = abs_bits_of(x[r * cols + c]);
      if (u > m) m = u;
    }
  const float s = block_scale(m);
  for (int64_t r = r0; r < r1; r++)
    for (int c = c0; c < c1; c++) {
      const uint8_t q = k_cpu_fp8_encode(x[r * cols + c] * s, K_E4M3);
      if (out) out[r * cols + c] = q;
      if (out_t) out_t[(int64_t)c * rows + r] = q;
    }
  if (si) *si = 1.0f / s;
  if (si_t) *si_t = 1.0f / s;
  return m;
}

void k_cpu_fp8_cast_block(const float *x, int64_t rows, int cols, int tile, uint8_t *out, float *scale_inv,
                          uint8_t *out_t, float *scale_inv_t, float *amax) {
  CHECK(rows >= 0 && cols >= 0 && (tile == 1 || tile == K_FP8_BLOCK),
        "fp8_cast_block: rows=%lld cols=%d tile=%d (need non-negative sizes, tile 1 or 128)", (long long)rows, cols, tile);
  CHECK((!out || scale_inv) && (!out_t || scale_inv_t), "fp8_cast_block: an output without its scale array");
  uint32_t m;
  memcpy(&m, amax, sizeof m);
  const int B = K_FP8_BLOCK, ncb = k_fp8_blocks(cols), nrb = k_fp8_blocks(rows);
  if (tile == B) {
#pragma omp parallel for schedule(static) reduction(max : m)
    for (int rb = 0; rb < nrb; rb++)
      for (int cb = 0; cb < ncb; cb++) {
        const int64_t r1 = (int64_t)(rb + 1) * B < rows ? (int64_t)(rb + 1) * B : rows;
        const int c1 = (cb + 1) * B < cols ? (cb + 1) * B : cols;
        float *si = scale_inv ? scale_inv + (int64_t)rb * k_fp8_block_ld(cols) + cb : NULL;
        float *si_t = scale_inv_t ? scale_inv_t + (int64_t)cb * k_fp8_block_ld(rows) + rb : NULL;
        const uint32_t t = cast_tile(x, rows, cols, (int64_t)rb * B, r1, cb * B, c1, out, si, out_t, si_t);
        if (t > m) m = t;
      }
  } else {
    if (out)  // 1 x 128 tiles along each row
#pragma omp parallel for schedule(static) reduction(max : m)
      for (int64_t r = 0; r < rows; r++)
        for (int cb = 0; cb < ncb; cb++) {
          const int c1 = (cb + 1) * B < cols ? (cb + 1) * B : cols;
          const uint32_t t = cast_tile(x, rows, cols, r, r + 1, cb * B, c1, out, scale_inv + (int64_t)cb * rows + r, NULL, NULL);
          if (t > m) m = t;
        }
    if (out_t)  // 128 x 1 tiles down each column: 1 x 128 tiles of the transpose
#pragma omp parallel for schedule(static) reduction(max : m)
      for (int c = 0; c < cols; c++)
        for (int rb = 0; rb < nrb; rb++) {
          const int64_t r1 = (int64_t)(rb + 1) * B < rows ? (int64_t)(rb + 1) * B : rows;
          const uint32_t t =
              cast_tile(x, rows, cols, (int64_t)rb * B, r1, c, c + 1, NULL, NULL, out_t, scale_inv_t + (int64_t)rb * cols + c);
          if (t > m) m = t;
        }
    if (!out && !out_t)
      for (int64_t i = 0; i < rows * cols; i++) {
        const uint32_t u = abs_bits_of(x[i]);
        if (u > m) m = u;
      }
  }
  memcpy(amax, &m, sizeof m);
}

void k_cpu_gemm_fp8_block(int M, int N, int K, const uint8_t *A, int a_tile, const float *a_scale_inv, const uint8_t *B,
                          int b_tile, const float *b_scale_inv, float beta, float *C) {
  char msg[256];
  CHECK(!k_fp8_gemm_block_check(M, N, K, a_tile, b_tile, A, B, C, msg, sizeof msg), "%s", msg);
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = k_cpu_fp8_decode((uint8_t)i, K_E4M3);
  const int nkb = k_fp8_blocks(K);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      const uint8_t *a = A + (int64_t)i * K, *b = B + (int64_t)j * K;
      double acc = 0.0;
      for (int kb = 0; kb < nkb; kb++) {
        const int k0 = kb * K_FP8_BLOCK, k1 = k0 + K_FP8_BLOCK < K ? k0 + K_FP8_BLOCK : K;
        double p = 0.0;
        for (int k = k0; k < k1; k++) p += (double)lut[a[k]] * (double)lut[b[k]];
        const float s = a_scale_inv[k_fp8_block_scale_at(M, K, a_tile, i, k0)] *
                        b_scale_inv[k_fp8_block_scale_at(N, K, b_tile, j, k0)];
        acc += (double)(float)p * (double)s;
      }
      float *c = C + (int64_t)i * N + j;
      *c = (float)(acc + (beta != 0.0f ? (double)beta * *c : 0.0));
    }
}
