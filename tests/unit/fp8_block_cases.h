// The FP8 block-scaling rows of the op suite (fp8_cast_block, gemm_fp8_block), and SwiGLU and
// RMSNorm with the FP8 codes of their output (swiglu_fwd_fp8, swiglu_bwd_fp8, rmsnorm_fwd_fp8): a part of
// tests/unit/test_backend_ops.c, included once by it after tests/unit/fp8_cases.h and the RMSNorm rows,
// whose helpers it uses.
// The reference is kernels/cpu/fp8_cpu.h: the cast (codes, scales, padding untouched, amax) bit
// for bit on every backend; the GEMM within the bounds its row states, and bitwise on the CPU.
#ifndef TRAINER_TESTS_FP8_BLOCK_CASES_H
#define TRAINER_TESTS_FP8_BLOCK_CASES_H

// ---------------------------------------------------------------------------------------------
// fp8_cast_block: x (rows, cols) log-uniform with a magnitude of its own per 128 x 128 region (so
// tiles get different scales), with specials 1 a zero tile row, fp8_specials scattered, and Inf
// and NaN in one region. Shapes SH(rows, cols, tile, outs, specials): outs 1 out, 2 out_t, 3
// both, 0 neither (the amax alone). Scale arrays start filled with -7 on both sides, so padding
// that either side writes shows.

static void run_fp8_cast_block(const op_case *c, const op_shape *s, int idx) {
  (void)c;
  const int64_t rows = s->i[0], n = rows * s->i[1];
  const int cols = (int)s->i[1], tile = (int)s->i[2], outs = (int)s->i[3], specials = (int)s->i[4];
  float *x = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t r = 0; r < rows; r++)
    for (int col = 0; col < cols; col++) {
      const double mag = exp2((double)((r / 128 * 7 + col / 128 * 3) % 40) - 20.0), u = rng_uniform();
      x[r * cols + col] = (float)((u < 0 ? -1 : 1) * mag * exp2(-6.0 * fabs(rng_uniform())));
    }
  if (specials) {
    float sp[1200];
    const int ns = fp8_specials(K_E4M3, 1, sp, 1200);
    for (int i = 0; i < ns && i < n; i++) x[(i * 7919 + 13) % n] = sp[i];
    for (int col = 0; col < cols && rows > 1; col++) x[1 * cols + col] = 0.0f;  // row 1 all zero
  }
  round_act(x, n);
  const int64_t ns_o = k_fp8_block_scales_n(rows, cols, tile), ns_t = k_fp8_block_scales_n(cols, rows, tile);
  uint8_t *ref = calloc((size_t)n + 1, 1), *ref_t = calloc((size_t)n + 1, 1);
  float *rs = malloc(sizeof(float) * (size_t)(ns_o + 1)), *rs_t = malloc(sizeof(float) * (size_t)(ns_t + 1));
  for (int64_t i = 0; i <= ns_o; i++) rs[i] = -7.0f;
  for (int64_t i = 0; i <= ns_t; i++) rs_t[i] = -7.0f;
  const float a0 = idx % 2 ? 1e30f : 0.0f;
  float ref_amax = a0, got_amax;
  const int want_o = outs & 1, want_t = outs & 2;
  k_cpu_fp8_cast_block(x, rows, cols, tile, want_o ? ref : NULL, want_o ? rs : NULL, want_t ? ref_t : NULL,
                       want_t ? rs_t : NULL, &ref_amax);
  char *dx = dev_put_act(x, n);
  uint8_t *zeros = calloc((size_t)n + 1, 1);
  uint8_t *d_o = dev_put(zeros, (size_t)n + 1), *d_t = dev_put(zeros, (size_t)n + 1);
  float *fill_o = malloc(sizeof(float) * (size_t)(ns_o + 1)), *fill_t = malloc(sizeof(float) * (size_t)(ns_t + 1));
  for (int64_t i = 0; i <= ns_o; i++) fill_o[i] = -7.0f;
  for (int64_t i = 0; i <= ns_t; i++) fill_t[i] = -7.0f;
  float *d_so = dev_putf(fill_o, ns_o + 1), *d_st = dev_putf(fill_t, ns_t + 1), *d_amax = dev_putf(&a0, 1);
  G->fp8_cast_block(G, dx, rows, cols, tile, want_o ? d_o : NULL, want_o ? d_so : NULL, want_t ? d_t : NULL,
                    want_t ? d_st : NULL, d_amax);
  uint8_t *got = malloc((size_t)n + 1), *got_t = malloc((size_t)n + 1);
  G->to_host(G, got, d_o, (size_t)n);
  G->to_host(G, got_t, d_t, (size_t)n);
  float *gs = dev_getf(d_so, ns_o + 1), *gs_t = dev_getf(d_st, ns_t + 1);
  G->to_host(G, &got_amax, d_amax, sizeof got_amax);
  int64_t bad = 0, bad_t = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != ref[i] && bad++ == 0) first = i;
    bad_t += got_t[i] != ref_t[i];
  }
  const int scales_ok = memcmp(gs, rs, sizeof(float) * (size_t)(ns_o + 1)) == 0 &&
                        memcmp(gs_t, rs_t, sizeof(float) * (size_t)(ns_t + 1)) == 0;
  EXPECT(bad == 0 && bad_t == 0 && scales_ok && memcmp(&got_amax, &ref_amax, 4) == 0,
         "[%s] fp8_cast_block rows=%lld cols=%d tile %d outs %d specials %d: %lld codes and %lld transposed codes "
         "differ (first at %lld: x %.9g gave 0x%02X, want 0x%02X), scales equal %d, amax %.9g want %.9g", LABEL,
         (long long)rows, cols, tile, outs, specials, (long long)bad, (long long)bad_t, (long long)first,
         first >= 0 ? x[first] : 0.0, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0, scales_ok, got_amax,
         ref_amax);
  free(x), free(ref), free(ref_t), free(rs), free(rs_t), free(zeros), free(fill_o), free(fill_t), free(got), free(got_t);
  free(gs), free(gs_t);
  dev_free(dx), dev_free(d_o), dev_free(d_t), dev_free(d_so), dev_free(d_st), dev_free(d_amax);
}

#define FB(r, c, tile, outs, sp) SH(r, c, tile, outs, sp)
static const op_shape fp8_cast_block_shapes[] = {
    FB(1, 1, 1, 3, 0),      FB(7, 13, 1, 3, 1),     FB(130, 300, 1, 3, 1),  FB(256, 384, 1, 1, 0),
    FB(256, 384, 1, 2, 1),  FB(64, 64, 1, 0, 0),    FB(1024, 768, 1, 3, 1), FB(7, 13, 128, 3, 1),
    FB(130, 300, 128, 3, 1), FB(256, 640, 128, 1, 0), FB(640, 256, 128, 3, 1), FB(1024, 768, 128, 2, 0)};

// ---------------------------------------------------------------------------------------------
// gemm_fp8_block: random E4M3 codes (no NaN) and random positive block scales (2^-8 .. 2^8) in the
// layouts of the tiles, against k_cpu_gemm_fp8_block (exact on the CPU backend). Shapes
// SHF(beta, 0, M, N, K, a_tile, b_tile, c_f32): the roles of fp8.recipe=block (forward X W^T:
// 1 x 128 by 128 x 128; data gradient G W: the same with W transposed; weight gradient G^T X: 1 x
// 128 by 1 x 128 along the tokens, fp32 C, beta 1), the 128 x 128 operand first, K not a multiple
// of 128 (a partial last block). Bounds per element as gemm_fp8's without fast accumulation (the
// block-scaled kernels take none): |got - ref| <= elem * sum_k |a_k b_k| sa sb + |beta C0| + (bf16
// C) 2^-8 |ref|; measured on an H100 (cuBLAS 13): normalised errors about 2e-4 (fp32 C).

static void run_gemm_fp8_block(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  const int M = (int)s->i[0], N = (int)s->i[1], K = (int)s->i[2], at = (int)s->i[3], bt = (int)s->i[4];
  const int c_f32 = (int)s->i[5];
  const float beta = (float)s->f[0];
  const k_dtype ct = c_f32 ? K_F32 : G->act;
  const tol t = EXACT ? TOL0 : c->act32;
  const int64_t na = (int64_t)M * K, nb = (int64_t)N * K, nc = (int64_t)M * N;
  const int64_t nsa = k_fp8_block_scales_n(M, K, at), nsb = k_fp8_block_scales_n(N, K, bt);
  uint8_t *A = malloc((size_t)na), *B = malloc((size_t)nb);
  for (int64_t i = 0; i < na + nb; i++) {
    const double u = rng_uniform(), v = (u < 0 ? -1 : 1) * 448.0 * exp2(-8.0 * fabs(rng_uniform()));
    (i < na ? A : B)[i < na ? i : i - na] = k_cpu_fp8_encode((float)v, K_E4M3);
  }
  float *sa = malloc(sizeof(float) * (size_t)nsa), *sb = malloc(sizeof(float) * (size_t)nsb);
  for (int64_t i = 0; i < nsa; i++) sa[i] = (float)exp2(8.0 * rng_uniform());
  for (int64_t i = 0; i < nsb; i++) sb[i] = (float)exp2(8.0 * rng_uniform());
  float *C0 = rand_buf(nc, 1.0), *bound = calloc((size_t)nc, sizeof(float));
  for (int64_t i = 0; i < nc; i++) C0[i] = beta == 0.0f ? NAN : ct == K_BF16 ? bf16_round(C0[i]) : C0[i];
  float *ref = copy_buf(C0, nc);
  k_cpu_gemm_fp8_block(M, N, K, A, at, sa, B, bt, sb, beta, ref);
  float lut[256];
  for (int i = 0; i < 256; i++) lut[i] = fabsf(k_cpu_fp8_decode((uint8_t)i, K_E4M3));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double b = 0.0;
      for (int k0 = 0; k0 < K; k0 += K_FP8_BLOCK) {
        double p = 0.0;
        for (int k = k0; k < K && k < k0 + K_FP8_BLOCK; k++) p += lut[A[(int64_t)i * K + k]] * lut[B[(int64_t)j * K + k]];
        b += p * sa[k_fp8_block_scale_at(M, K, at, i, k0)] * sb[k_fp8_block_scale_at(N, K, bt, j, k0)];
      }
      bound[(int64_t)i * N + j] = (float)b;
    }
  uint8_t *dA = dev_put(A, (size_t)na), *dB = dev_put(B, (size_t)nb);
  float *d_sa = dev_putf(sa, nsa), *d_sb = dev_putf(sb, nsb);
  void *dC = dev_put_typed(C0, nc, ct), *dC2 = dev_put_typed(C0, nc, ct);
  G->gemm_fp8_block(G, M, N, K, dA, at, d_sa, dB, bt, d_sb, beta, dC, ct);
  G->gemm_fp8_block(G, M, N, K, dA, at, d_sa, dB, bt, d_sb, beta, dC2, ct);
  float *got = dev_get_typed(dC, nc, ct);
  const double tol_norm = ct == K_BF16 && t.norm < 1e-2 ? 1e-2 : t.norm;
  const fp8_gemm_err r = fp8_gemm_measure(got, ref, bound, C0, beta, nc, t.elem, ct);
  EXPECT(r.nan_ok && r.norm <= tol_norm && r.worst <= 1.0 && r.n_diff == 0,
         "[%s] gemm_fp8_block M=%d N=%d K=%d tiles %d x %d C %s beta %g: nan_ok %d, norm err %.3g (bound %.3g), "
         "worst/bound %.3g, %lld elements not bitwise equal (checked when exact)", LABEL, M, N, K, at, bt,
         ct == K_BF16 ? "bf16" : "f32", beta, r.nan_ok, r.norm, tol_norm, r.worst, (long long)r.n_diff);
  EXPECT(dev_equal_bytes(dC, dC2, k_dtype_bytes(ct) * (size_t)nc),
         "[%s] gemm_fp8_block M=%d N=%d K=%d not bitwise repeatable", LABEL, M, N, K);
  free(A), free(B), free(sa), free(sb), free(C0), free(bound), free(ref), free(got);
  dev_free(dA), dev_free(dB), dev_free(d_sa), dev_free(d_sb), dev_free(dC), dev_free(dC2);
}

#define GB(beta, m, n, k, at, bt, c32) SHF(beta, 0, m, n, k, at, bt, c32)
static const op_shape gemm_fp8_block_shapes[] = {
    GB(0, 128, 256, 384, 1, 128, 0), GB(0, 256, 128, 640, 1, 128, 1), GB(1, 384, 256, 256, 1, 1, 1),
    GB(0, 128, 128, 128, 128, 1, 0), GB(0, 64, 96, 64, 1, 128, 1),    GB(1, 48, 80, 208, 1, 1, 1),
    GB(0, 256, 256, 1024, 1, 128, 0), GB(1, 128, 256, 2048, 1, 1, 1)};

// ---------------------------------------------------------------------------------------------
// swiglu_fwd_fp8: out against k_cpu_swiglu_fwd within swiglu_fwd's bounds (compare_act), and out,
// the codes and the amax bit for bit against this backend's swiglu_fwd then fp8_cast on the same
// input (its definition); then again with out NULL (not written): the same codes and amax.
// Shapes SHF(scale, 0, rows, n, inject): odd widths take the element path, widths of 8 the vector
// path; inject puts NaN and Inf into gu; every other shape starts the amax above every |out| (it
// must stay).

static void run_swiglu_fwd_fp8(const op_case *c, const op_shape *s, int idx) {
  char what[96];
  const int64_t rows = s->i[0], m = rows * s->i[1];
  const int n = (int)s->i[1], inject = (int)s->i[2];
  const float scale = (float)s->f[0], a0 = idx % 2 ? 1e30f : 0.0f;
  float *gu = rand_act(2 * m, 3.0), *out = malloc(sizeof(float) * (size_t)m);
  if (inject && n >= 8) gu[1] = NAN, gu[n + 3] = NAN, gu[5] = INFINITY, gu[6] = -INFINITY;
  void *d_gu = dev_put_act(gu, 2 * m), *d_out = dev_alloc_act(m), *d_out2 = dev_alloc_act(m);
  uint8_t *d_c = G->alloc(G, (size_t)m + 1), *d_c2 = G->alloc(G, (size_t)m + 1);
  float *d_s = dev_putf(&scale, 1), *d_a = dev_putf(&a0, 1), *d_a2 = dev_putf(&a0, 1);
  G->swiglu_fwd_fp8(G, d_gu, d_out, rows, n, d_s, d_c, d_a);
  G->swiglu_fwd(G, d_gu, d_out2, rows, n);
  G->fp8_cast(G, d_out2, rows, n, d_s, K_E4M3, d_c2, NULL, d_a2);
  k_cpu_swiglu_fwd(gu, out, rows, n);
  snprintf(what, sizeof what, "swiglu_fwd_fp8 rows=%lld n=%d%s", (long long)rows, n, inject ? " +nan" : "");
  compare_act(what, d_out, out, m, tol_act(c));
  float a1, a2;
  G->to_host(G, &a1, d_a, sizeof a1);
  G->to_host(G, &a2, d_a2, sizeof a2);
  const size_t ob = k_dtype_bytes(G->act) * (size_t)m;
  EXPECT(dev_equal_bytes(d_out, d_out2, ob) && dev_equal_bytes(d_c, d_c2, (size_t)m) && memcmp(&a1, &a2, 4) == 0,
         "[%s] %s: out, codes or amax (%.9g, want %.9g) not bitwise swiglu_fwd then fp8_cast's", LABEL, what, a1, a2);
  G->from_host(G, d_a, &a0, sizeof a0);
  G->zero(G, d_c, (size_t)m);
  G->swiglu_fwd_fp8(G, d_gu, NULL, rows, n, d_s, d_c, d_a);
  G->to_host(G, &a1, d_a, sizeof a1);
  EXPECT(dev_equal_bytes(d_c, d_c2, (size_t)m) && memcmp(&a1, &a2, 4) == 0,
         "[%s] %s, out NULL: codes or amax (%.9g, want %.9g) not those with out written", LABEL, what, a1, a2);
  free(gu), free(out);
  dev_free(d_gu), dev_free(d_out), dev_free(d_out2), dev_free(d_c), dev_free(d_c2), dev_free(d_s), dev_free(d_a);
  dev_free(d_a2);
}

static const op_shape swiglu_fwd_fp8_shapes[] = {SHF(16, 0, 1, 1, 0),    SHF(4, 0, 7, 13, 0),  SHF(0.5, 0, 4, 1000, 1),
                                                 SHF(64, 0, 64, 256, 0), SHF(2, 0, 70001, 8, 0), SHF(8, 0, 3, 300008, 1),
                                                 SHF(1024, 0, 256, 768, 1)};

// swiglu_bwd_fp8: dgu against k_cpu_swiglu_bwd within swiglu_bwd's bounds (compare_act), and
// dgu, the codes, the transposed codes and the amax bit for bit against this backend's swiglu_bwd
// then fp8_cast (its definition); then again with dgu NULL (not written): the same codes and
// amax. Shapes SHF(scale, 0, rows, n, fmt, inject, offset): widths of 8 with rows of 16 take the
// vector path, others the element path; inject puts NaN and Inf into gu and dout; offset moves
// both codes buffers a byte off their alignment (the element path); every other shape starts the
// amax above every |dgu| (it must stay).

static void run_swiglu_bwd_fp8(const op_case *c, const op_shape *s, int idx) {
  char what[112];
  const int64_t rows = s->i[0], m = rows * s->i[1];
  const int n = (int)s->i[1], inject = (int)s->i[3], off = (int)s->i[4];
  const k_fp8 f = (k_fp8)s->i[2];
  const float scale = (float)s->f[0], a0 = idx % 2 ? 1e30f : 0.0f;
  float *gu = rand_act(2 * m, 3.0), *dout = rand_act(m, 1.0), *dgu = malloc(sizeof(float) * (size_t)(2 * m));
  if (inject && n >= 8) gu[1] = NAN, gu[n + 3] = NAN, gu[5] = INFINITY, gu[6] = -INFINITY, dout[7] = NAN;
  void *d_gu = dev_put_act(gu, 2 * m), *d_d = dev_put_act(dout, m), *d_dgu = dev_alloc_act(2 * m),
       *d_dgu2 = dev_alloc_act(2 * m);
  uint8_t *codes[3], *codes_t[3];  // fused with dgu, fused without, the two ops
  float *d_s = dev_putf(&scale, 1), *d_a[3], a[3];
  for (int k = 0; k < 3; k++) {
    codes[k] = G->alloc(G, (size_t)(2 * m + off)), codes_t[k] = G->alloc(G, (size_t)(2 * m + off));
    d_a[k] = dev_putf(&a0, 1);
  }
  G->swiglu_bwd_fp8(G, d_d, d_gu, d_dgu, rows, n, d_s, f, codes[0] + off, codes_t[0] + off, d_a[0]);
  G->swiglu_bwd_fp8(G, d_d, d_gu, NULL, rows, n, d_s, f, codes[1] + off, codes_t[1] + off, d_a[1]);
  G->swiglu_bwd(G, d_d, d_gu, d_dgu2, rows, n);
  G->fp8_cast(G, d_dgu2, rows, 2 * n, d_s, f, codes[2] + off, codes_t[2] + off, d_a[2]);
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
  snprintf(what, sizeof what, "swiglu_bwd_fp8 %s rows=%lld n=%d scale %g%s offset %d", k_fp8_name(f), (long long)rows, n,
           scale, inject ? " +nan" : "", off);
  compare_act(what, d_dgu, dgu, 2 * m, tol_act(c));
  for (int k = 0; k < 3; k++) G->to_host(G, &a[k], d_a[k], sizeof a[k]);
  const size_t gb = k_dtype_bytes(G->act) * (size_t)(2 * m), cb = (size_t)(2 * m + off);
  for (int k = 0; k < 2; k++)
    EXPECT((k || dev_equal_bytes(d_dgu, d_dgu2, gb)) && dev_equal_bytes(codes[k], codes[2], cb) &&
               dev_equal_bytes(codes_t[k], codes_t[2], cb) && memcmp(&a[k], &a[2], 4) == 0,
           "[%s] %s%s: dgu, codes, transposed codes or amax (%.9g, want %.9g) not bitwise swiglu_bwd then fp8_cast's",
           LABEL, what, k ? " (dgu NULL)" : "", a[k], a[2]);
  free(gu), free(dout), free(dgu);
  dev_free(d_gu), dev_free(d_d), dev_free(d_dgu), dev_free(d_dgu2), dev_free(d_s);
  for (int k = 0; k < 3; k++) dev_free(codes[k]), dev_free(codes_t[k]), dev_free(d_a[k]);
}

#define SB(sc, r, n, f, inj, o) SHF(sc, 0, r, n, f, inj, o)
static const op_shape swiglu_bwd_fp8_shapes[] = {
    // Element path: odd shapes, rows not a multiple of 16, misaligned codes.
    SB(16, 1, 1, K_E4M3, 0, 0), SB(4, 7, 13, K_E5M2, 0, 0), SB(0.5, 4, 1000, K_E5M2, 1, 0),
    SB(8, 128, 1000, K_E4M3, 0, 1), SB(64, 64, 256, K_E5M2, 1, 1),
    // Vector path (n % 8 == 0, rows % 16 == 0): whole and partial 64 x 64 tiles; n = 2052 is
    // vectorised for fp32 but not bf16; scale 1024 saturates.
    SB(4, 16, 8, K_E4M3, 0, 0), SB(64, 64, 256, K_E4M3, 0, 0), SB(2, 48, 2052, K_E5M2, 1, 0),
    SB(1024, 256, 768, K_E5M2, 1, 0), SB(1024, 256, 768, K_E4M3, 0, 0), SB(1, 1040, 72, K_E5M2, 0, 0)};

// rmsnorm_fwd_fp8: y and rstd against k_cpu_rmsnorm_fwd within rmsnorm_fwd_act's bounds, and y,
// rstd, the codes and the amax bit for bit against this backend's rmsnorm_fwd_act then fp8_cast
// on the same input (its definition); then with y NULL (not written): the same rstd, codes and
// amax. Shapes SHF(scale, 0, rows, d, inject) (rms_make's x, w):
// the widths take each of the forward's paths (one warp per row, one block per row, element by
// element); odd shapes write the codes one byte past an aligned address and start the amax above
// every |y| (it must stay).

static void run_rmsnorm_fwd_fp8(const op_case *c, const op_shape *s, int idx) {
  char what[128];
  rms_in r = rms_make(s);
  const float scale = (float)s->f[0], a0 = idx % 2 ? 1e30f : 0.0f;
  float *d_x = dev_putf(r.x, r.n), *d_w = dev_putf(r.w, r.d);
  float *d_r = G->alloc(G, sizeof(float) * r.rows), *d_r2 = G->alloc(G, sizeof(float) * r.rows);
  void *d_y = dev_alloc_act(r.n), *d_y2 = dev_alloc_act(r.n);
  uint8_t *d_c = G->alloc(G, (size_t)r.n + 1), *d_c2 = G->alloc(G, (size_t)r.n + 1), *codes = d_c + idx % 2;
  float *d_s = dev_putf(&scale, 1), *d_a = dev_putf(&a0, 1), *d_a2 = dev_putf(&a0, 1);
  G->rmsnorm_fwd_fp8(G, d_x, d_w, d_y, d_r, r.rows, r.d, 1e-5f, d_s, codes, d_a);
  G->rmsnorm_fwd_act(G, d_x, d_w, d_y2, d_r2, r.rows, r.d, 1e-5f);
  G->fp8_cast(G, d_y2, r.rows, r.d, d_s, K_E4M3, d_c2, NULL, d_a2);
  float *ya = copy_buf(r.y, r.n);
  round_act(ya, r.n);
  snprintf(what, sizeof what, "rmsnorm_fwd_fp8 y%s scale %g", r.what, scale);
  compare_act(what, d_y, ya, r.n, tol_act(c));
  float a1, a2;
  G->to_host(G, &a1, d_a, sizeof a1);
  G->to_host(G, &a2, d_a2, sizeof a2);
  const size_t yb = k_dtype_bytes(G->act) * (size_t)r.n;
  EXPECT(dev_equal_bytes(d_y, d_y2, yb) && dev_equal_bytes(d_r, d_r2, sizeof(float) * (size_t)r.rows) &&
             dev_equal_bytes(codes, d_c2, (size_t)r.n) && memcmp(&a1, &a2, 4) == 0,
         "[%s] %s: y, rstd, codes or amax (%.9g, want %.9g) not bitwise rmsnorm_fwd_act then fp8_cast's", LABEL, what,
         a1, a2);
  G->from_host(G, d_a, &a0, sizeof a0);
  G->zero(G, codes, (size_t)r.n);
  G->zero(G, d_r, sizeof(float) * r.rows);
  G->rmsnorm_fwd_fp8(G, d_x, d_w, NULL, d_r, r.rows, r.d, 1e-5f, d_s, codes, d_a);
  G->to_host(G, &a1, d_a, sizeof a1);
  EXPECT(dev_equal_bytes(d_r, d_r2, sizeof(float) * (size_t)r.rows) && dev_equal_bytes(codes, d_c2, (size_t)r.n) &&
             memcmp(&a1, &a2, 4) == 0,
         "[%s] %s, y NULL: rstd, codes or amax (%.9g, want %.9g) not those with y written", LABEL, what, a1, a2);
  free(ya);
  rms_free(&r);
  dev_free(d_x), dev_free(d_w), dev_free(d_r), dev_free(d_r2), dev_free(d_y), dev_free(d_y2), dev_free(d_c);
  dev_free(d_c2), dev_free(d_s), dev_free(d_a), dev_free(d_a2);
}

static const op_shape rmsnorm_fwd_fp8_shapes[] = {
    SHF(16, 0, 1, 1, 0),      SHF(4, 0, 7, 13, 0),       SHF(64, 0, 33, 64, 0),  SHF(2, 0, 1000, 1024, 0),
    SHF(0.5, 0, 130, 257, 1), SHF(8, 0, 64, 4096, 1),    SHF(1, 0, 20, 8193, 0), SHF(32, 0, 3, 20000, 0),
    SHF(448, 0, 517, 768, 1), SHF(1024, 0, 40000, 8, 0)};

#endif
