// The gradient-compression rows of the op suite (grad_amax, quant16, dequant16, quant_i8,
// dequant_i8): a part of tests/unit/test_backend_ops.c, included once by it just before its table (it
// uses that file's backend under test G and its helpers). Every output must equal the CPU
// reference (kernels/cpu/quant_cpu.c) bit for bit, residuals and counters included. So that the
// CPU backend, whose ops are the reference, is checked too, each row also checks the reference's
// results against what the formats promise: the fp16 conversion at its edges against values
// worked out by hand, the scale's bound (no overflow, even summed over n_sum ranks), round-trip
// errors within half a step, and error feedback's identity (x + old residual = dequantised value
// + new residual, exactly).
#ifndef TRAINER_TESTS_QUANT_CASES_H
#define TRAINER_TESTS_QUANT_CASES_H

#include "kernels/cpu/quant_cpu.h"

// Gradient-like data: log-uniform magnitudes over 2^lo .. 2^hi, random signs, some zeros; with
// specials, NaN and Inf at a few places.
static float *quant_data(int64_t n, double lo, double hi, int specials) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    const double u = rng_uniform();
    x[i] = i % 97 == 5 ? 0.0f : (float)((u < 0 ? -1 : 1) * exp2(lo + (hi - lo) * fabs(rng_uniform())));
  }
  if (specials && n > 600) x[n / 3] = NAN, x[n / 2] = INFINITY, x[n - 300] = -INFINITY;
  return x;
}

static void *host_copy(const void *d, size_t n_bytes) {
  void *h = malloc(n_bytes ? n_bytes : 1);
  G->to_host(G, h, d, n_bytes);
  return h;
}

static void expect_same_bytes(const char *what, const void *dev, const void *ref, size_t n_bytes) {
  void *h = host_copy(dev, n_bytes);
  size_t first = n_bytes;
  for (size_t i = 0; i < n_bytes && first == n_bytes; i++)
    if (((const unsigned char *)h)[i] != ((const unsigned char *)ref)[i]) first = i;
  EXPECT(first == n_bytes, "[%s] %s: differs from the reference from byte %zu of %zu", LABEL, what, first, n_bytes);
  free(h);
}

// The fp16 conversion at its edges, by hand (the reference itself).
static void check_f16_edges(void) {
  static const struct { float f; uint16_t h; } cases[] = {
      {0.0f, 0x0000},       {-0.0f, 0x8000},        {1.0f, 0x3c00},          {-2.0f, 0xc000},
      {65504.0f, 0x7bff},   {65519.99f, 0x7bff},    {65520.0f, 0x7c00},      {1e6f, 0x7c00},
      {0x1p-14f, 0x0400},   {0x1p-24f, 0x0001},     {0x1p-25f, 0x0000},      {0x1.8p-25f, 0x0001},
      {0x1.8p-24f, 0x0002}, {0x1.4p-24f, 0x0001},   {0x1.ffcp-15f, 0x0400},  {1.0f / 3.0f, 0x3555},
      {1.0009765625f, 0x3c01}, {1.00048828125f, 0x3c00}, {1.00146484375f, 0x3c02}, {INFINITY, 0x7c00}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const uint16_t h = k_f32_to_f16(cases[i].f);
    EXPECT(h == cases[i].h, "f16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, h, cases[i].h);
    if ((h & 0x7c00) != 0x7c00 && (cases[i].f == 0 || h != 0))
      EXPECT(k_f32_to_f16(k_f16_to_f32(h)) == h, "f16 0x%04x does not round-trip", h);
  }
  EXPECT(k_f32_to_f16(NAN) == 0x7e00 && k_f32_to_f16(-NAN) == 0x7e00 && isnan(k_f16_to_f32(0x7e00)), "f16 NaN is 0x7e00");
}

// ---------------------------------------------------------------------------------------------
// grad_amax: SH(n, with residual, specials); the running amax starts at 0.5 (some shapes'
// values stay below it: it must stay).

static void run_grad_amax(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = s->i[0];
  const int with_res = (int)s->i[1];
  float *x = quant_data(n, -30, s->i[2] == 2 ? -3 : 4, s->i[2] == 1), *r = quant_data(n, -40, -10, 0);
  float *dx = dev_putf(x, n), *dr = with_res ? dev_putf(r, n) : NULL, a0 = 0.5f, want = a0;
  float *da = dev_putf(&a0, 1);
  k_cpu_grad_amax(&want, x, with_res ? r : NULL, n);
  G->grad_amax(G, da, dx, dr, n);
  char what[64];
  snprintf(what, sizeof what, "grad_amax n=%lld res=%d", (long long)n, with_res);
  expect_same_bytes(what, da, &want, sizeof want);
  float m = a0;  // the reference against its definition
  for (int64_t i = 0; i < n; i++) {
    const float v = fabsf(with_res ? x[i] + r[i] : x[i]);
    if (v > m || isnan(v)) m = isnan(m) ? m : v;
  }
  EXPECT((isnan(m) && isnan(want)) || m == want, "[%s] %s: %g, by definition %g", LABEL, what, want, m);
  free(x), free(r);
  dev_free(dx), dev_free(da);
  if (dr) dev_free(dr);
}

static const op_shape grad_amax_shapes[] = {SH(1, 0, 0), SH(1000, 1, 0), SH(100003, 0, 1), SH(3000000, 1, 0),
                                            SH(777, 0, 2)};

// ---------------------------------------------------------------------------------------------
// quant16 then dequant16: SH(n, t (0 bf16, 1 fp16), residual, amax (0 none, 1 the data's, 2 a
// huge one: nothing overflows, everything underflows), n_sum, specials).

static void check_quant16_promises(const char *what, k_dtype t, const float *x, const float *r0, const float *r1,
                                   const uint16_t *h, const float *back, int64_t n, const float *amax, int n_sum) {
  const int e = k_half_scale_exp(amax, n_sum, t);
  int64_t bad_bound = 0, bad_err = 0, bad_ef = 0;
  for (int64_t i = 0; i < n; i++) {
    const float v = r0 ? x[i] + r0[i] : x[i];
    if (!isfinite(v)) continue;
    const float w = k_half_widen(h[i], t) * ldexpf(1.0f, -e);
    if (t == K_F16 && amax && isfinite(*amax)) bad_bound += fabsf(k_half_widen(h[i], t)) * n_sum > K_F16_MAX;
    // A step of the format at v's magnitude: at most 2^-7 |v| (bf16), 2^-10 |v| (fp16 normal), and
    // fp16's subnormal step 2^-24 (scaled back).
    const float step = t == K_BF16 ? fabsf(v) * 0x1p-7f : fmaxf(fabsf(v) * 0x1p-10f, ldexpf(0x1p-24f, -e));
    bad_err += isfinite(w) && fabsf(w - v) > 0.5f * step;
    bad_err += back[i] != w && !(isnan(back[i]) && isnan(w));
    if (r1 && isfinite(w)) bad_ef += v - w != r1[i];
  }
  EXPECT(bad_bound == 0, "[%s] %s: %lld codes exceed 65504 / n_sum", LABEL, what, (long long)bad_bound);
  EXPECT(bad_err == 0, "[%s] %s: %lld values off by more than half a step", LABEL, what, (long long)bad_err);
  EXPECT(bad_ef == 0, "[%s] %s: %lld residuals are not x + res - dequant", LABEL, what, (long long)bad_ef);
}

static void run_quant16(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  if (idx == 0) check_f16_edges();
  const int64_t n = s->i[0];
  const k_dtype t = s->i[1] ? K_F16 : K_BF16;
  const int with_res = (int)s->i[2], amax_kind = (int)s->i[3], n_sum = (int)s->i[4];
  float *x = quant_data(n, -36, 3, (int)s->i[5]), *r = quant_data(n, -50, -20, 0);
  float *r_ref = with_res ? copy_buf(r, n) : NULL, amax = 0.0f;
  k_cpu_grad_amax(&amax, x, r_ref, n);
  if (amax_kind == 2) amax = 1e30f;
  const float *pa = amax_kind ? &amax : NULL;
  uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
  float *back = malloc(sizeof(float) * (size_t)(n ? n : 1));
  int64_t under = 3;  // counters accumulate
  k_cpu_quant16(h, t, x, r_ref, n, pa, n_sum, &under);
  k_cpu_dequant16(back, h, t, n, pa, n_sum);
  float *dx = dev_putf(x, n), *dr = with_res ? dev_putf(r, n) : NULL, *da = dev_putf(&amax, 1);
  int64_t u0 = 3;
  int64_t *du = dev_put(&u0, sizeof u0);
  uint16_t *dh = G->alloc(G, sizeof(uint16_t) * (size_t)(n ? n : 1));
  float *dback = G->alloc(G, sizeof(float) * (size_t)(n ? n : 1));
  G->quant16(G, dh, t, dx, dr, n, amax_kind ? da : NULL, n_sum, du);
  G->dequant16(G, dback, dh, t, n, amax_kind ? da : NULL, n_sum);
  char what[96];
  snprintf(what, sizeof what, "quant16 %s n=%lld res=%d amax=%d n_sum=%d", t == K_F16 ? "fp16" : "bf16", (long long)n,
           with_res, amax_kind, n_sum);
  expect_same_bytes(what, dh, h, sizeof(uint16_t) * (size_t)n);
  expect_same_bytes(what, du, &under, sizeof under);
  if (with_res) expect_same_bytes(what, dr, r_ref, sizeof(float) * (size_t)n);
  snprintf(what, sizeof what, "dequant16 %s n=%lld amax=%d", t == K_F16 ? "fp16" : "bf16", (long long)n, amax_kind);
  expect_same_bytes(what, dback, back, sizeof(float) * (size_t)n);
  check_quant16_promises(what, t, x, with_res ? r : NULL, r_ref, h, back, n, pa, n_sum);
  int64_t want_under = 3;  // the count against its definition
  for (int64_t i = 0; i < n; i++) want_under += (with_res ? x[i] + r[i] : x[i]) != 0.0f && (h[i] & 0x7fff) == 0;
  EXPECT(under == want_under, "[%s] %s: underflow count %lld, by definition %lld", LABEL, what, (long long)under,
         (long long)want_under);
  EXPECT(amax_kind != 2 || t != K_F16 || under > 3 + n / 2, "[%s] %s: a huge amax must underflow the values", LABEL,
         what);
  free(x), free(r), free(r_ref), free(h), free(back);
  dev_free(dx), dev_free(da), dev_free(du), dev_free(dh), dev_free(dback);
  if (dr) dev_free(dr);
}

static const op_shape quant16_shapes[] = {SH(1000, 0, 0, 0, 1, 0), SH(1000, 0, 1, 0, 1, 1), SH(4099, 1, 0, 1, 2, 0),
                                          SH(100003, 1, 1, 1, 8, 1),  SH(3000000, 1, 1, 1, 2, 0), SH(2000, 1, 0, 2, 2, 0),
                                          SH(0, 1, 1, 1, 2, 0)};

// The fp16 widening alone, over every code (so both backends agree on each one).
static void run_dequant16(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = 65536;
  const k_dtype t = s->i[0] ? K_F16 : K_BF16;
  uint16_t *h = malloc(sizeof(uint16_t) * n);
  for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)i;
  float *want = malloc(sizeof(float) * n), amax = (float)s->f[0];
  k_cpu_dequant16(want, h, t, n, s->f[0] > 0 ? &amax : NULL, 4);
  uint16_t *dh = dev_put(h, sizeof(uint16_t) * n);
  float *da = dev_putf(&amax, 1), *dd = G->alloc(G, sizeof(float) * n);
  G->dequant16(G, dd, dh, t, n, s->f[0] > 0 ? da : NULL, 4);
  char what[64];
  snprintf(what, sizeof what, "dequant16 %s every code, amax %g", t == K_F16 ? "fp16" : "bf16", s->f[0]);
  expect_same_bytes(what, dd, want, sizeof(float) * n);
  if (t == K_F16 && s->f[0] == 0)  // no scale: the widening is exact, so it round-trips
    for (int64_t i = 0; i < n; i++)
      if ((i & 0x7c00) != 0x7c00 || (i & 0x3ff) == 0) EXPECT(k_f32_to_f16(want[i]) == h[i], "f16 0x%04llx", (long long)i);
  free(h), free(want);
  dev_free(dh), dev_free(da), dev_free(dd);
}

static const op_shape dequant16_shapes[] = {SHF(0, 0, 1), SHF(3e-3, 0, 1), SHF(0, 0, 0)};

// ---------------------------------------------------------------------------------------------
// quant_i8 then dequant_i8: SH(n, residual, specials, n_src, misalign). The data has a block of
// zeros; with specials NaN and Inf in some blocks. n_src sources are the same codes at a stride of
// one padded slot (as the int8 reduction lays them out); misalign shifts the output by 1 float.

static void run_quant_i8(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = s->i[0], nb = k_qblocks(n), codes = nb * K_QBLOCK, slot = codes + nb * 4;
  const int with_res = (int)s->i[1], n_src = (int)s->i[3], off = (int)s->i[4];
  float *x = quant_data(n, -20, 2, (int)s->i[2]), *r = quant_data(n, -30, -12, 0);
  for (int64_t i = K_QBLOCK; i < 2 * K_QBLOCK && i < n; i++) x[i] = 0.0f;
  float *r_ref = with_res ? copy_buf(r, n) : NULL;
  int8_t *slots = calloc((size_t)(slot * n_src + 1), 1);
  k_cpu_quant_i8(slots, (float *)(slots + codes), x, r_ref, n);
  for (int k = 1; k < n_src; k++) memcpy(slots + k * slot, slots, (size_t)slot);
  float *sum = malloc(sizeof(float) * (size_t)(n + off + 1));
  k_cpu_dequant_i8(sum + off, slots, (const float *)(slots + codes), n, n_src, slot);
  float *dx = dev_putf(x, n), *dr = with_res ? dev_putf(r, n) : NULL;
  int8_t *ds = G->alloc(G, (size_t)(slot * n_src + 1));
  G->quant_i8(G, ds, (float *)(ds + codes), dx, dr, n);
  for (int k = 1; k < n_src; k++) G->copy(G, ds + k * slot, ds, (size_t)slot);
  float *dsum = G->alloc(G, sizeof(float) * (size_t)(n + off + 1));
  G->dequant_i8(G, dsum + off, ds, (const float *)(ds + codes), n, n_src, slot);
  char what[96];
  snprintf(what, sizeof what, "quant_i8 n=%lld res=%d", (long long)n, with_res);
  expect_same_bytes(what, ds, slots, (size_t)n);
  expect_same_bytes(what, ds + codes, slots + codes, (size_t)nb * 4);
  if (with_res) expect_same_bytes(what, dr, r_ref, sizeof(float) * (size_t)n);
  snprintf(what, sizeof what, "dequant_i8 n=%lld n_src=%d", (long long)n, n_src);
  expect_same_bytes(what, dsum + off, sum + off, sizeof(float) * (size_t)n);
  // The reference against the format: codes within +-127, a zero block (without residual) all zero, each value within
  // half a step (scale / 2) of its dequantised code, and the residual exactly what was dropped.
  int64_t bad = 0;
  const float *scales = (const float *)(slots + codes);
  for (int64_t i = 0; i < n; i++) {
    const float v = with_res ? x[i] + r[i] : x[i], sc = scales[i / K_QBLOCK], w = (float)slots[i] * sc;
    if (!isfinite(sc)) {
      bad += slots[i] != 0 || (with_res && r_ref[i] != 0.0f);
      continue;
    }
    bad += slots[i] < -127 || (!with_res && i >= K_QBLOCK && i < 2 * K_QBLOCK && (slots[i] != 0 || sc != 0.0f));
    bad += fabsf(v - w) > 0.5f * sc * (1.0f + 0x1p-20f);
    if (with_res) bad += r_ref[i] != v - w;
    float acc = 0.0f;
    for (int k = 0; k < n_src; k++) acc += w;
    bad += sum[off + i] != acc;
  }
  EXPECT(bad == 0, "[%s] %s: %lld elements break the int8 format's promises", LABEL, what, (long long)bad);
  free(x), free(r), free(r_ref), free(slots), free(sum);
  dev_free(dx), dev_free(ds), dev_free(dsum);
  if (dr) dev_free(dr);
}

static const op_shape quant_i8_shapes[] = {SH(1, 0, 0, 1, 0),       SH(1000, 1, 0, 2, 1),  SH(4096, 0, 1, 3, 0),
                                           SH(100003, 1, 1, 8, 1),  SH(3000001, 1, 0, 2, 0), SH(0, 1, 0, 2, 0)};

// dequant_i8's own row: sources with different codes and scales (the real reduction's case),
// summed in order; checked against the reference and, for 2 sources, against the exact sum.
static void run_dequant_i8(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = s->i[0], nb = k_qblocks(n), codes = nb * K_QBLOCK, slot = codes + nb * 4;
  const int n_src = (int)s->i[1];
  int8_t *slots = calloc((size_t)(slot * n_src + 1), 1);
  for (int k = 0; k < n_src; k++) {
    float *x = quant_data(n, -20 + k, 1, 0);
    k_cpu_quant_i8(slots + k * slot, (float *)(slots + k * slot + codes), x, NULL, n);
    free(x);
  }
  float *want = malloc(sizeof(float) * (size_t)(n + 1));
  k_cpu_dequant_i8(want, slots, (const float *)(slots + codes), n, n_src, slot);
  int8_t *ds = dev_put(slots, (size_t)(slot * n_src + 1));
  float *dd = G->alloc(G, sizeof(float) * (size_t)(n + 1));
  G->dequant_i8(G, dd, ds, (const float *)(ds + codes), n, n_src, slot);
  char what[64];
  snprintf(what, sizeof what, "dequant_i8 n=%lld n_src=%d", (long long)n, n_src);
  expect_same_bytes(what, dd, want, sizeof(float) * (size_t)n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n && n_src == 2; i++) {
    const double a = (double)slots[i] * ((const float *)(slots + codes))[i / K_QBLOCK],
                 b = (double)slots[slot + i] * ((const float *)(slots + slot + codes))[i / K_QBLOCK];
    bad += want[i] != (float)((float)a + (float)b);
  }
  EXPECT(bad == 0, "[%s] %s: %lld sums differ from q0 s0 + q1 s1", LABEL, what, (long long)bad);
  free(slots), free(want);
  dev_free(ds), dev_free(dd);
}

static const op_shape dequant_i8_shapes[] = {SH(1000, 2), SH(70001, 8), SH(2000000, 2), SH(5, 1)};

#endif
