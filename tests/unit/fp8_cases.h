// The FP8 rows of the op suite (fp8_cast, gemm_fp8, fp8_scales, fp8_cast_spans, fp8_transpose): a
// part of tests/unit/test_backend_ops.c,
// included once by it just before its table (it uses that file's backend under test G, its
// helpers and its tolerances), kept apart so the suite's file stays readable. The reference is
// kernels/cpu/fp8_cpu.h: casts and scales must match it bit for bit on every backend, the GEMM
// within the accumulation bounds its row states.
#ifndef TRAINER_TESTS_FP8_CASES_H
#define TRAINER_TESTS_FP8_CASES_H

#include "kernels/cpu/fp8_cpu.h"

static float one_bf16_ulp(float m, int dir) { return bf16_float((uint16_t)(bf16_bits(m) + dir)); }

// Values whose codes sit on the format's edges, before the division by the cast's scale: every
// midpoint between neighbouring codes (the ties) and one bf16 step either side, subnormals and
// their ties, values past the largest finite one, tiny ones that underflow, signed zeros; with
// nonfinite also Inf and NaN. Returns how many it wrote (at most n_max).
static int fp8_specials(k_fp8 f, int nonfinite, float *v, int n_max) {
  const int top = f == K_E4M3 ? 0x7E : 0x7B;
  const float mx = k_fp8_max(f), q = f == K_E4M3 ? 0x1p-9f : 0x1p-16f;
  int n = 0;
#define PUT(x) (n < n_max ? (void)(v[n++] = (x)) : (void)0)
  for (int c = 0; c < top; c++) {
    const float m = 0.5f * (k_cpu_fp8_decode((uint8_t)c, f) + k_cpu_fp8_decode((uint8_t)(c + 1), f));
    PUT(m), PUT(-m), PUT(one_bf16_ulp(m, 1)), PUT(c ? one_bf16_ulp(m, -1) : 0.25f * q);
  }
  for (int k = 1; k < 8; k++) PUT(0.5f * k * q), PUT(-0.5f * k * q);
  const float big[] = {mx, -mx, 1.03125f * mx, 1.0625f * mx, 2 * mx, -2 * mx, 1e30f, -1e30f, 3e38f, -3e38f,
                       1e-30f, -1e-30f, 0.0f, -0.0f};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) PUT(big[i]);
  if (nonfinite) PUT(INFINITY), PUT(-INFINITY), PUT(NAN), PUT(-NAN);
#undef PUT
  return n;
}

// ---------------------------------------------------------------------------------------------
// fp8_cast: codes, transposed codes and amax bit for bit against k_cpu_fp8_cast on the same
// act-dtype input. Shapes SHF(scale, 0, rows, cols, fmt, trans, specials, offset): specials 1
// scatters fp8_specials / scale over random log-uniform data (scale a power of two keeps them
// exact), 2 adds Inf and NaN; offset > 0 misaligns x and the outputs by that many elements (the
// scalar path); shapes with cols a multiple of 8 and rows of 16 take the vector path. The amax
// starts at 0.25, or at 1e30 (above every |x|: it must stay) for every third shape.

static void run_fp8_cast(const op_case *c, const op_shape *s, int idx) {
  (void)c;
  const int64_t rows = s->i[0], n = rows * s->i[1];
  const int cols = (int)s->i[1], trans = (int)s->i[3], specials = (int)s->i[4], off = (int)s->i[5];
  const k_fp8 f = (k_fp8)s->i[2];
  const float scale = (float)s->f[0], a0 = idx % 3 == 2 ? 1e30f : 0.25f;
  float *x = malloc(sizeof(float) * (size_t)(n + off + 1));
  const double hi = log2(1.2 * k_fp8_max(f)), lo = -18.0;  // x * scale from below the subnormals to past the top
  for (int64_t i = 0; i < n + off; i++) {
    const double u = rng_uniform();
    x[i] = (float)((u < 0 ? -1 : 1) * exp2(lo + (hi - lo) * fabs(rng_uniform())) / scale);
  }
  if (specials) {
    float sp[1200];
    const int ns = fp8_specials(f, specials == 2, sp, 1200);
    for (int i = 0; i < ns && i < n; i++) x[off + (i * 7919 + 13) % n] = sp[i] / scale;
  }
  round_act(x, n + off);
  uint8_t *ref = malloc((size_t)n + 1), *ref_t = malloc((size_t)n + 1), *got = malloc((size_t)n + 1),
          *got_t = malloc((size_t)n + 1);
  float ref_amax = a0, got_amax;
  k_cpu_fp8_cast(x + off, rows, cols, scale, f, ref, ref_t, &ref_amax);
  const size_t eb = k_dtype_bytes(G->act);
  char *dx = dev_put_act(x, n + off);
  uint8_t *d_out = G->alloc(G, (size_t)(n + off)), *d_t = G->alloc(G, (size_t)(n + off));
  float *d_scale = dev_putf(&scale, 1), *d_amax = dev_putf(&a0, 1);
  G->fp8_cast(G, dx + off * eb, rows, cols, d_scale, f, d_out + off, trans ? d_t + off : NULL, d_amax);
  G->to_host(G, got, d_out + off, (size_t)n);
  G->to_host(G, got_t, d_t + off, (size_t)n);
  G->to_host(G, &got_amax, d_amax, sizeof got_amax);
  int64_t bad = 0, bad_t = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != ref[i] && bad++ == 0) first = i;
    if (trans) bad_t += got_t[i] != ref_t[i];
  }
  EXPECT(bad == 0 && bad_t == 0 && memcmp(&got_amax, &ref_amax, 4) == 0,
         "[%s] fp8_cast %s rows=%lld cols=%d scale %g%s%s offset %d: %lld codes and %lld transposed codes differ (first "
         "at %lld: x %.9g gave 0x%02X, want 0x%02X); amax %.9g, want %.9g", LABEL, k_fp8_name(f), (long long)rows, cols,
         scale, trans ? " +transpose" : "", specials ? " +specials" : "", off, (long long)bad, (long long)bad_t,
         (long long)first, first >= 0 ? x[off + first] : 0.0, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0,
         got_amax, ref_amax);
  // Either output may be NULL: the transpose alone (a weight gradient's input), and the amax
  // alone (current scaling); the codes written and the amax must not change.
  if (trans) {
    float a1 = a0, a2 = a0;
    G->zero(G, d_t, (size_t)(n + off));
    G->from_host(G, d_amax, &a1, sizeof a1);
    G->fp8_cast(G, dx + off * eb, rows, cols, d_scale, f, NULL, d_t + off, d_amax);
    G->to_host(G, got_t, d_t + off, (size_t)n);
    G->to_host(G, &a1, d_amax, sizeof a1);
    G->from_host(G, d_amax, &a2, sizeof a2);
    G->fp8_cast(G, dx + off * eb, rows, cols, d_scale, f, NULL, NULL, d_amax);
    G->to_host(G, &a2, d_amax, sizeof a2);
    bad_t = 0;
    for (int64_t i = 0; i < n; i++) bad_t += got_t[i] != ref_t[i];
    EXPECT(bad_t == 0 && memcmp(&a1, &ref_amax, 4) == 0 && memcmp(&a2, &ref_amax, 4) == 0,
           "[%s] fp8_cast %s rows=%lld cols=%d with out NULL: %lld transposed codes differ; amax %.9g and (amax "
           "alone) %.9g, want %.9g", LABEL, k_fp8_name(f), (long long)rows, cols, (long long)bad_t, a1, a2, ref_amax);
  }
  free(x), free(ref), free(ref_t), free(got), free(got_t);
  dev_free(dx), dev_free(d_out), dev_free(d_t), dev_free(d_scale), dev_free(d_amax);
}

#define FC(sc, r, c, f, t, sp, o) SHF(sc, 0, r, c, f, t, sp, o)
static const op_shape fp8_cast_shapes[] = {
    // Element paths: odd shapes, partial tiles, misaligned.
    FC(4, 1, 1, K_E4M3, 1, 0, 0), FC(4, 7, 13, K_E4M3, 1, 1, 0), FC(0.25, 65, 130, K_E5M2, 1, 2, 0),
    FC(4, 100, 37, K_E4M3, 1, 2, 0), FC(3.7, 33, 64, K_E5M2, 0, 0, 0), FC(4, 64, 64, K_E4M3, 1, 1, 1),
    // Vector paths (cols % 8 == 0, rows % 16 == 0): whole and partial 64 x 64 tiles.
    FC(4, 16, 8, K_E4M3, 1, 1, 0), FC(8, 48, 80, K_E5M2, 1, 2, 0), FC(4, 128, 256, K_E4M3, 1, 2, 0),
    FC(4, 128, 256, K_E5M2, 1, 1, 0), FC(2.3, 1024, 768, K_E4M3, 1, 0, 0), FC(4, 80, 72, K_E4M3, 0, 2, 0),
    FC(1024, 256, 1040, K_E5M2, 1, 1, 0), FC(0.0625, 4096, 64, K_E4M3, 1, 1, 0)};

// ---------------------------------------------------------------------------------------------
// gemm_fp8: C = beta C + (A B^T) * a_scale_inv * b_scale_inv on random codes (log-uniform over
// the top 8 binades, random signs), against k_cpu_gemm_fp8 (exact on the CPU backend). Shapes
// SHF(beta, 0, M, N, K, a_fmt, b_fmt, c_f32, fast): C in the act dtype, or fp32 with c_f32;
// beta 0 starts C as NaN (it must not be read). Bounds per element: |got - ref| <= elem *
// (alpha sum_k |a_k b_k| + |beta C0|) + (bf16 C: 2^-8 |ref|, its one rounding), and the
// normalised error <= norm (at least 1e-2 for a bf16 C). The row's act32 column holds the bounds
// without fast accumulation, act16 those with it, whatever the act dtype. In place, and reading
// C from a separate c_in (twice: bitwise repeatable); both within the bounds.
// Why they are looser than the bf16 GEMM's 1e-4: the products of two FP8 values are exact, but
// Hopper's FP8 tensor cores add them with about 14 significant bits (truncating), so each K=32
// step of a WGMMA errs by up to ~2^-13 of the running sum. cuBLASLt without fast accumulation
// moves the partial sums into fp32 every few steps (K=128), which bounds the error by that of
// one short reduced-precision chunk: 2^-8 of sum |a b| is about 4x the worst chunk seen in that
// model. With fast accumulation the reduced-precision sum runs over all of K (the error grows
// with K, ~1-2% of |C| at K=4096 as measured by others), hence 2^-5 and a 5e-2 normalised error.

// How an FP8 GEMM's C (got) meets the bounds above against ref: no NaN on either side, the
// normalised error, the worst |got - ref| over its element bound (elem * (bound + |beta C0|) +
// bf16 C's rounding), and (EXACT) the elements whose bits differ. gemm_fp8 and gemm_fp8_block
// share it.
typedef struct fp8_gemm_err {
  int nan_ok;
  double norm, worst;
  int64_t n_diff;
} fp8_gemm_err;

static fp8_gemm_err fp8_gemm_measure(const float *got, const float *ref, const float *bound, const float *C0, float beta,
                                     int64_t nc, double elem, k_dtype ct) {
  const double tol_rnd = ct == K_BF16 ? 1.0 / 256 : 0.0;
  fp8_gemm_err r = {.nan_ok = 1};
  double ss_err = 0.0, ss_ref = 0.0;
  for (int64_t i = 0; i < nc; i++) {
    if (isnan(got[i]) || isnan(ref[i])) {
      r.nan_ok = 0;
      continue;
    }
    const double e = (double)got[i] - ref[i], b0 = beta == 0.0f ? 0.0 : fabs((double)beta * C0[i]);
    ss_err += e * e, ss_ref += (double)ref[i] * ref[i];
    const double rel = fabs(e) / (elem * (bound[i] + b0) + tol_rnd * fabs((double)ref[i]) + 1e-30);
    if (rel > r.worst) r.worst = rel;
  }
  r.norm = ss_err == 0.0 ? 0.0 : sqrt(ss_err / (ss_ref + 1e-30));
  r.n_diff = EXACT ? n_bits_differ(got, ref, nc) : 0;
  return r;
}

static void run_gemm_fp8(const op_case *c, const op_shape *s, int idx) {
  const int M = (int)s->i[0], N = (int)s->i[1], K = (int)s->i[2], c_f32 = (int)s->i[5], fast = (int)s->i[6];
  const k_fp8 af = (k_fp8)s->i[3], bf = (k_fp8)s->i[4];
  const float beta = (float)s->f[0], a_si = 1.3f / k_fp8_max(af), b_si = 0.7f / k_fp8_max(bf);
  const k_dtype ct = c_f32 ? K_F32 : G->act;
  const tol t = EXACT ? TOL0 : fast ? c->act16 : c->act32;
  const int64_t na = (int64_t)M * K, nb = (int64_t)N * K, nc = (int64_t)M * N;
  uint8_t *A = malloc((size_t)na), *B = malloc((size_t)nb);
  float *fa = malloc(sizeof(float) * (size_t)na), *fb = malloc(sizeof(float) * (size_t)nb);
  for (int64_t i = 0; i < na + nb; i++) {
    const k_fp8 fi = i < na ? af : bf;
    const double u = rng_uniform(), v = (u < 0 ? -1 : 1) * k_fp8_max(fi) * exp2(-8.0 * fabs(rng_uniform()));
    uint8_t *code = i < na ? &A[i] : &B[i - na];
    *code = k_cpu_fp8_encode((float)v, fi);
    (i < na ? fa : fb)[i < na ? i : i - na] = fabsf(k_cpu_fp8_decode(*code, fi));
  }
  float *C0 = rand_buf(nc, 1.0), *ref = NULL, *bound = calloc((size_t)nc, sizeof(float));
  for (int64_t i = 0; i < nc; i++) C0[i] = beta == 0.0f ? NAN : ct == K_BF16 ? bf16_round(C0[i]) : C0[i];
  ref = copy_buf(C0, nc);
  k_cpu_gemm_fp8(K_ISA_AUTO, M, N, K, A, af, a_si, B, bf, b_si, beta, ref);
  k_cpu_gemm(0, 1, M, N, K, fabsf(a_si * b_si), fa, K, fb, K, 0.0f, bound, N);
  uint8_t *dA = dev_put(A, (size_t)na), *dB = dev_put(B, (size_t)nb);
  // Odd rows read their scales from inside arrays (4 and 8 bytes in: not 16-byte aligned), as a
  // model's per-tensor scales are.
  const float sa[3] = {0, a_si, 0}, sb[3] = {0, 0, b_si};
  float *d_sa = dev_putf(sa, 3), *d_sb = dev_putf(sb, 3);
  float *d_asi = idx % 2 ? d_sa + 1 : d_sa, *d_bsi = idx % 2 ? d_sb + 2 : d_sb;
  if (idx % 2 == 0) G->from_host(G, d_asi, &a_si, sizeof a_si), G->from_host(G, d_bsi, &b_si, sizeof b_si);
  // In place (C read and written), then twice reading C from c_in into a C that starts as NaN
  // (only written; cuBLASLt's result may differ in its last bits from the in-place one).
  float *nans = malloc(sizeof(float) * (size_t)nc);
  for (int64_t i = 0; i < nc; i++) nans[i] = NAN;
  void *dC = dev_put_typed(C0, nc, ct), *dC_in = dev_put_typed(C0, nc, ct);
  void *dC2 = dev_put_typed(nans, nc, ct), *dC3 = dev_put_typed(nans, nc, ct);
  G->gemm_fp8(G, M, N, K, dA, af, d_asi, dB, bf, d_bsi, beta, NULL, dC, ct, fast);
  G->gemm_fp8(G, M, N, K, dA, af, d_asi, dB, bf, d_bsi, beta, dC_in, dC2, ct, fast);
  G->gemm_fp8(G, M, N, K, dA, af, d_asi, dB, bf, d_bsi, beta, dC_in, dC3, ct, fast);
  const double tol_norm = ct == K_BF16 && t.norm < 1e-2 ? 1e-2 : t.norm;
  void *const outs[2] = {dC, dC2};
  for (int o = 0; o < 2; o++) {
    float *got = dev_get_typed(outs[o], nc, ct);
    const fp8_gemm_err r = fp8_gemm_measure(got, ref, bound, C0, beta, nc, t.elem, ct);
    EXPECT(r.nan_ok && r.norm <= tol_norm && r.worst <= 1.0 && r.n_diff == 0,
           "[%s] gemm_fp8 M=%d N=%d K=%d %s x %s C %s beta %g fast_accum %d, C %s: nan_ok %d, norm err %.3g (bound %.3g), "
           "worst/bound %.3g, %lld elements not bitwise equal (checked when exact)", LABEL, M, N, K, k_fp8_name(af),
           k_fp8_name(bf), ct == K_BF16 ? "bf16" : "f32", beta, fast, o ? "from c_in" : "in place", r.nan_ok, r.norm,
           tol_norm, r.worst, (long long)r.n_diff);
    free(got);
  }
  EXPECT(dev_equal_bytes(dC2, dC3, k_dtype_bytes(ct) * (size_t)nc), "[%s] gemm_fp8 M=%d N=%d K=%d not bitwise repeatable",
         LABEL, M, N, K);
  free(A), free(B), free(fa), free(fb), free(C0), free(ref), free(bound), free(nans);
  dev_free(dA), dev_free(dB), dev_free(d_sa), dev_free(d_sb), dev_free(dC), dev_free(dC2), dev_free(dC3), dev_free(dC_in);
}

// The block's roles: forward X W^T (E4M3 x E4M3), dgrad dY W (E5M2 x E4M3, W transposed), wgrad
// dW += dY^T X (E5M2 x E4M3, fp32 C, beta 1); then E4M3 x E5M2, small and long-K products.
#define GF(beta, m, n, k, a, b, c32, fast) SHF(beta, 0, m, n, k, a, b, c32, fast)
static const op_shape gemm_fp8_shapes[] = {
    GF(0, 16, 16, 16, K_E4M3, K_E4M3, 1, 0),        GF(0, 64, 48, 32, K_E4M3, K_E5M2, 0, 0),
    GF(1, 48, 64, 80, K_E5M2, K_E4M3, 1, 0),        GF(1, 32, 96, 16, K_E4M3, K_E4M3, 0, 0),
    GF(0, 256, 512, 1024, K_E4M3, K_E4M3, 0, 0),    GF(0, 256, 512, 1024, K_E4M3, K_E4M3, 0, 1),
    GF(0, 512, 256, 768, K_E5M2, K_E4M3, 0, 0),     GF(1, 768, 256, 512, K_E5M2, K_E4M3, 1, 0),
    GF(1, 768, 256, 512, K_E5M2, K_E4M3, 1, 1),     GF(0, 64, 64, 4096, K_E4M3, K_E4M3, 1, 0),
    GF(0, 64, 64, 4096, K_E4M3, K_E4M3, 1, 1),      GF(1, 64, 64, 4096, K_E4M3, K_E4M3, 0, 0)};

// ---------------------------------------------------------------------------------------------
// fp8_scales: `steps` updates in a row (history position step % len) with amaxes cycling through
// normal values, zero, NaN, Inf, a subnormal (the scale clamps to FLT_MAX) and a huge one (with
// margin 8 the scale clamps to FLT_MIN), formats alternating, the history seeded with random
// values and one NaN; history, amax, scale, scale_inv and the nonfinite count bit for bit against
// k_cpu_fp8_scales. Shapes {n, len, margin, use_max, steps}.

static void run_fp8_scales(const op_case *c, const op_shape *s, int idx) {
  (void)c;
  const int n = (int)s->i[0], len = (int)s->i[1], margin = (int)s->i[2], use_max = (int)s->i[3], steps = (int)s->i[4];
  const int stride = idx % 2 ? 4 : 1;  // odd rows: scale_inv 16-byte strided, the rest between untouched
  const int64_t nh = (int64_t)n * len, nsi = (int64_t)n * stride;
  float *h = malloc(sizeof(float) * (size_t)nh), *am = malloc(sizeof(float) * (size_t)n);
  float *sc = malloc(sizeof(float) * (size_t)n), *si = malloc(sizeof(float) * (size_t)(nsi ? nsi : 1));
  uint8_t *fm = malloc((size_t)n);
  for (int64_t i = 0; i < nh; i++) h[i] = (float)(2.0 * fabs(rng_uniform()));
  if (nh > 5) h[5] = NAN;
  for (int i = 0; i < n; i++) sc[i] = 1.0f, fm[i] = (uint8_t)(i % 2 ? K_E5M2 : K_E4M3);
  for (int64_t i = 0; i < nsi; i++) si[i] = i % stride ? -2.0f : 1.0f;
  float *d_h = dev_putf(h, nh), *d_am = G->alloc(G, sizeof(float) * (size_t)n), *d_sc = dev_putf(sc, n),
        *d_si = dev_putf(si, nsi);
  uint8_t *d_fm = dev_put(fm, (size_t)n);
  int n_bad = 3, *d_bad = dev_put(&n_bad, sizeof n_bad);
  const float special[] = {2.0f, 0.0f, NAN, INFINITY, 1e-40f, 3e38f, 0.01f, 300.0f};
  for (int step = 0; step < steps; step++) {
    for (int i = 0; i < n; i++) am[i] = (i + step) % 3 ? special[(i + step) % 8] : (float)(100.0 * fabs(rng_uniform()));
    G->from_host(G, d_am, am, sizeof(float) * (size_t)n);
    G->fp8_scales(G, d_h, d_am, d_sc, d_si, stride, d_fm, n, len, step % len, margin, use_max, d_bad);
    k_cpu_fp8_scales(h, am, sc, si, stride, fm, n, len, step % len, margin, use_max, &n_bad);
  }
  float *gh = dev_getf(d_h, nh), *gam = dev_getf(d_am, n), *gsc = dev_getf(d_sc, n), *gsi = dev_getf(d_si, nsi);
  int g_bad = 0;
  G->to_host(G, &g_bad, d_bad, sizeof g_bad);
  const int ok = memcmp(gh, h, sizeof(float) * (size_t)nh) == 0 && memcmp(gam, am, sizeof(float) * (size_t)n) == 0 &&
                 memcmp(gsc, sc, sizeof(float) * (size_t)n) == 0 && memcmp(gsi, si, sizeof(float) * (size_t)nsi) == 0;
  EXPECT(ok && g_bad == n_bad, "[%s] fp8_scales n=%d len=%d margin %d use_max %d steps %d inv_stride %d: history, amax, "
         "scale or scale_inv not bitwise the reference's (%d), nonfinite count %d, want %d", LABEL, n, len, margin, use_max,
         steps, stride, ok, g_bad, n_bad);
  free(h), free(am), free(sc), free(si), free(fm), free(gh), free(gam), free(gsc), free(gsi);
  dev_free(d_h), dev_free(d_am), dev_free(d_sc), dev_free(d_si), dev_free(d_fm), dev_free(d_bad);
}

static const op_shape fp8_scales_shapes[] = {SH(1, 1, 0, 0, 3),  SH(7, 4, 0, 1, 9),   SH(7, 4, 1, 0, 5),
                                             SH(9, 16, 8, 1, 20), SH(300, 1024, 2, 1, 3), SH(0, 1, 0, 0, 1)};

// ---------------------------------------------------------------------------------------------
// fp8_cast_spans: codes and per-tensor amaxes bit for bit against k_cpu_fp8_cast_spans, on a flat
// x of random log-uniform values (specials as fp8_cast's), cut into spans of random lengths (0,
// a few, about a slice of the GPU kernel, several slices), some left out (their bytes must keep
// the sentinel), each of a random tensor of n_tensors with scales 2^k or 3.7 * 2^k; amaxes start
// at 0.25, except tensor 1 at 1e30 (above every |x|: it must stay). Then with out NULL (the amax
// alone, scale NULL) and with amax NULL (the codes alone). Shapes {n, n_spans, n_tensors, fmt,
// specials}.

static uint64_t span_draw(uint64_t n) { return n ? (uint64_t)((rng_uniform() + 1.0) * 0.5 * (double)n) % n : 0; }

static int make_spans(int64_t n, int n_spans, int n_tensors, k_span *sp) {
  static const int64_t lens[] = {0, 1, 3, 4095, 4096, 4097, 9000, 30000};
  int k = 0;
  for (int64_t at = 0; k < n_spans && at < n;) {
    int64_t len = lens[span_draw(8)] + (int64_t)span_draw(50);
    if (len > n - at) len = n - at;
    if (span_draw(5)) sp[k++] = (k_span){at, len, (int)span_draw((uint64_t)n_tensors)};  // else a gap
    at += len;
  }
  return k;
}

static void run_fp8_cast_spans(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = s->i[0];
  const int n_tensors = (int)s->i[2], specials = (int)s->i[4];
  const k_fp8 f = (k_fp8)s->i[3];
  k_span *sp = malloc(sizeof(k_span) * (size_t)(s->i[1] + 1));
  const int n_spans = make_spans(n, (int)s->i[1], n_tensors, sp);
  float *x = malloc(sizeof(float) * (size_t)(n + 1)), sc[16], a0[16];
  for (int t = 0; t < n_tensors; t++) {
    sc[t] = (t % 2 ? 3.7f : 1.0f) * ldexpf(1.0f, t % 5 - 2);
    a0[t] = t == 1 ? 1e30f : 0.25f;
  }
  const double hi = log2(1.2 * k_fp8_max(f)) + 2, lo = -18.0;  // past every tensor's top, below its subnormals
  for (int64_t i = 0; i < n; i++) {
    const double u = rng_uniform();
    x[i] = (float)((u < 0 ? -1 : 1) * exp2(lo + (hi - lo) * fabs(rng_uniform())));
  }
  if (specials) {
    float v[1200];
    const int nv = fp8_specials(f, specials == 2, v, 1200);
    for (int i = 0; i < nv && n > 0; i++) x[(i * 7919 + 13) % n] = v[i];
  }
  round_act(x, n);
  uint8_t *ref = malloc((size_t)n + 1), *got = malloc((size_t)n + 1);
  memset(ref, 0xA5, (size_t)n + 1);
  float ref_amax[16], got_amax[16], amax_only[16];
  memcpy(ref_amax, a0, sizeof a0);
  k_cpu_fp8_cast_spans(x, sp, n_spans, sc, f, ref, ref_amax);
  // The output starts as the sentinel outside the spans and as the complement of the reference in
  // them, so that a code left unwritten differs.
  memcpy(got, ref, (size_t)n + 1);
  for (int k = 0; k < n_spans; k++)
    for (int64_t i = sp[k].at; i < sp[k].at + sp[k].n_elem; i++) got[i] = (uint8_t)~ref[i];
  void *dx = dev_put_act(x, n);
  uint8_t *d_out = dev_put(got, (size_t)n + 1);
  float *d_sc = dev_putf(sc, n_tensors), *d_amax = dev_putf(a0, n_tensors);
  G->fp8_cast_spans(G, dx, sp, n_spans, d_sc, f, d_out, d_amax);
  G->to_host(G, got, d_out, (size_t)n + 1);
  G->to_host(G, got_amax, d_amax, sizeof(float) * (size_t)n_tensors);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i <= n; i++)
    if (got[i] != ref[i] && bad++ == 0) first = i;
  EXPECT(bad == 0 && memcmp(got_amax, ref_amax, sizeof(float) * (size_t)n_tensors) == 0,
         "[%s] fp8_cast_spans %s n=%lld, %d spans of %d tensors: %lld bytes differ (first at %lld: 0x%02X, want 0x%02X); "
         "amaxes bitwise the reference's: %d", LABEL, k_fp8_name(f), (long long)n, n_spans, n_tensors, (long long)bad,
         (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0,
         memcmp(got_amax, ref_amax, sizeof(float) * (size_t)n_tensors) == 0);
  // The amax alone (no codes written: they stay as they are), then the codes alone.
  G->from_host(G, d_amax, a0, sizeof(float) * (size_t)n_tensors);
  G->fp8_cast_spans(G, dx, sp, n_spans, NULL, f, NULL, d_amax);
  G->to_host(G, amax_only, d_amax, sizeof(float) * (size_t)n_tensors);
  G->zero(G, d_out, (size_t)n + 1);
  G->fp8_cast_spans(G, dx, sp, n_spans, d_sc, f, d_out, NULL);
  G->to_host(G, got, d_out, (size_t)n + 1);
  bad = 0;
  for (int k = 0; k < n_spans; k++) bad += memcmp(got + sp[k].at, ref + sp[k].at, (size_t)sp[k].n_elem) != 0;
  EXPECT(bad == 0 && memcmp(amax_only, ref_amax, sizeof(float) * (size_t)n_tensors) == 0,
         "[%s] fp8_cast_spans %s n=%lld: with amax NULL %lld spans' codes differ; with out NULL the amaxes bitwise the "
         "reference's: %d", LABEL, k_fp8_name(f), (long long)n, (long long)bad,
         memcmp(amax_only, ref_amax, sizeof(float) * (size_t)n_tensors) == 0);
  free(sp), free(x), free(ref), free(got);
  dev_free(dx), dev_free(d_out), dev_free(d_sc), dev_free(d_amax);
}

static const op_shape fp8_cast_spans_shapes[] = {SH(1, 1, 1, K_E4M3, 0),         SH(0, 0, 1, K_E4M3, 0),
                                                 SH(1000, 7, 3, K_E5M2, 1),        SH(100000, 40, 5, K_E4M3, 2),
                                                 SH(300000, 200, 16, K_E4M3, 1),   SH(70000, 30, 2, K_E5M2, 2)};

// ---------------------------------------------------------------------------------------------
// fp8_transpose: random bytes against k_cpu_fp8_transpose. Shapes {rows, cols, offset}: rows and
// cols multiples of 16 take the vector path; odd shapes and offset > 0 (misaligned by that many
// bytes) the element path.

static void run_fp8_transpose(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t rows = s->i[0], n = rows * s->i[1];
  const int cols = (int)s->i[1], off = (int)s->i[2];
  uint8_t *in = malloc((size_t)(n + off + 1)), *ref = malloc((size_t)n + 1), *got = malloc((size_t)n + 1);
  for (int64_t i = 0; i < n + off; i++) in[i] = (uint8_t)span_draw(256);
  k_cpu_fp8_transpose(in + off, rows, cols, ref);
  uint8_t *d_in = dev_put(in, (size_t)(n + off + 1)), *d_t = G->alloc(G, (size_t)(n + off + 1));
  G->fp8_transpose(G, d_in + off, rows, cols, d_t + off);
  G->to_host(G, got, d_t + off, (size_t)n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += got[i] != ref[i];
  EXPECT(bad == 0, "[%s] fp8_transpose rows=%lld cols=%d offset %d: %lld bytes differ", LABEL, (long long)rows, cols, off,
         (long long)bad);
  free(in), free(ref), free(got);
  dev_free(d_in), dev_free(d_t);
}

static const op_shape fp8_transpose_shapes[] = {SH(1, 1, 0),    SH(7, 13, 0),    SH(65, 130, 0),  SH(100, 37, 0),
                                                SH(16, 16, 0),  SH(48, 80, 0),   SH(128, 256, 0), SH(1024, 768, 0),
                                                SH(64, 64, 1),  SH(4096, 64, 0), SH(96, 4112, 0), SH(0, 5, 0)};

#endif
