// GPU tests of the CUDA backend (label gpu): every op of the table against the CPU reference
// k_cpu_* on the same random inputs, over odd and even shapes, once with fp32 activations and
// once with bf16 ones (the default). Each comparison checks the normalised error
// ||gpu - cpu|| / ||cpu||, a per-element bound and that NaN/Inf sit at the same places
// (elementwise ops also run with NaN and Inf injected). For bf16 the random inputs are rounded
// to bf16 first, so both sides see the same inputs and the bounds only have to cover the
// rounding of the outputs (2^-8 relative) and fp32 summation order. The backward ops that
// reduce (attention, RMSNorm, embedding), sumsq and GEMM must give bitwise equal results when
// run twice. Casts are checked bit for bit against a host round-to-nearest-even.
// Without a visible GPU the test fails: a GPU test that passes vacuously would hide a broken
// setup. A few timings are printed at the end (numbers only, they decide nothing).
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/test_util.h"

static k_backend *G;
static const char *ACT = "f32";  // the name of G's activation dtype, in every message

// ---------------------------------------------------------------------------------------------
// Helpers

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

// Uniform in [-1, 1): a fixed xorshift so every run sees the same data.
static double rng_uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

// Host bf16: round to nearest even on the bits (NaN stays a quiet NaN, overflow gives Inf).
static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float bf16_round(float f) { return bf16_float(bf16_bits(f)); }

// Rounds to the activation dtype in place (nothing for fp32).
static void round_act(float *x, int64_t n) {
  if (G->act == K_BF16)
    for (int64_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

static float *rand_buf(int64_t n, double amp) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = (float)(amp * rng_uniform());
  return x;
}

// Random values already representable in the activation dtype.
static float *rand_act(int64_t n, double amp) {
  float *x = rand_buf(n, amp);
  round_act(x, n);
  return x;
}

static float *copy_buf(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

static void *dev_put(const void *h, size_t n_bytes) {
  void *d = G->alloc(G, n_bytes);
  G->from_host(G, d, h, n_bytes);
  return d;
}
static float *dev_putf(const float *h, int64_t n) { return dev_put(h, sizeof(float) * (size_t)n); }
static int32_t *dev_puti(const int32_t *h, int64_t n) { return dev_put(h, sizeof(int32_t) * (size_t)n); }

// Host floats into existing device memory of dtype t (rounded to bf16 for K_BF16).
static void dev_set_typed(void *d, const float *h, int64_t n, k_dtype t) {
  if (t == K_F32) {
    G->from_host(G, d, h, sizeof(float) * (size_t)n);
    return;
  }
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) b[i] = bf16_bits(h[i]);
  G->from_host(G, d, b, sizeof(uint16_t) * (size_t)n);
  free(b);
}
static void *dev_put_typed(const float *h, int64_t n, k_dtype t) {
  void *d = G->alloc(G, k_dtype_bytes(t) * (size_t)n);
  dev_set_typed(d, h, n, t);
  return d;
}
static void *dev_put_act(const float *h, int64_t n) { return dev_put_typed(h, n, G->act); }
static void *dev_alloc_act(int64_t n) { return G->alloc(G, k_dtype_bytes(G->act) * (size_t)n); }

// A new host float copy of n elements of dtype t in device memory.
static float *dev_get_typed(const void *d, int64_t n, k_dtype t) {
  float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (t == K_F32) {
    G->to_host(G, h, d, sizeof(float) * (size_t)n);
    return h;
  }
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
  G->to_host(G, b, d, sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = bf16_float(b[i]);
  free(b);
  return h;
}
static float *dev_getf(const float *d, int64_t n) { return dev_get_typed(d, n, K_F32); }

static void dev_free(void *p) { G->free(G, p); }

// Tolerance for an act-dtype output: the fp32 one, or 1e-2 for bf16 (its rounding is 2^-8).
static double tol_act(double f32) { return G->act == K_BF16 ? 1e-2 : f32; }

// Compares got (GPU) with ref (CPU): NaN and Inf must sit at the same places; over the finite
// elements, ||got - ref|| / ||ref|| <= tol_norm and |got - ref| <= tol_elem * (|ref| + rms(ref))
// for each element (the rms term keeps elements that cancel to near zero from failing on noise).
static void compare(const char *what, const float *got, const float *ref, int64_t n, double tol_norm,
                    double tol_elem) {
  double ss_ref = 0.0;
  int64_t n_fin = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i])) ss_ref += (double)ref[i] * ref[i], n_fin++;
  const double rms = n_fin ? sqrt(ss_ref / (double)n_fin) : 0.0;
  double ss_err = 0.0, worst = 0.0;
  int64_t worst_i = -1, n_special_bad = 0, first_bad = -1;
  for (int64_t i = 0; i < n; i++) {
    const float g = got[i], r = ref[i];
    if (!isfinite(r) || !isfinite(g)) {
      const int same = (isnan(r) && isnan(g)) || (isinf(r) && isinf(g) && r == g);
      if (!same && n_special_bad++ == 0) first_bad = i;
      continue;
    }
    const double e = (double)g - r;
    ss_err += e * e;
    const double rel = fabs(e) / (fabs((double)r) + rms + 1e-30);
    if (rel > worst) worst = rel, worst_i = i;
  }
  const double norm = ss_err == 0.0 ? 0.0 : sqrt(ss_err) / (sqrt(ss_ref) + 1e-30);
  EXPECT(n_special_bad == 0, "[%s] %s: %lld NaN/Inf mismatches, first at %lld (gpu %g, cpu %g)", ACT, what,
         (long long)n_special_bad, (long long)first_bad, first_bad >= 0 ? got[first_bad] : 0.0,
         first_bad >= 0 ? ref[first_bad] : 0.0);
  EXPECT(norm <= tol_norm, "[%s] %s: normalised error %.3g > %.3g", ACT, what, norm, tol_norm);
  EXPECT(worst <= tol_elem, "[%s] %s: element %lld off by %.3g of (|ref| + rms) > %.3g (gpu %.9g, cpu %.9g)", ACT,
         what, (long long)worst_i, worst, tol_elem, worst_i >= 0 ? got[worst_i] : 0.0,
         worst_i >= 0 ? ref[worst_i] : 0.0);
}

// Device buffer (fp32, or act dtype) vs host reference.
static void compare_dev(const char *what, const float *dev, const float *ref, int64_t n, double tol_norm,
                        double tol_elem) {
  float *h = dev_getf(dev, n);
  compare(what, h, ref, n, tol_norm, tol_elem);
  free(h);
}
static void compare_act(const char *what, const void *dev, const float *ref, int64_t n, double tol_norm,
                        double tol_elem) {
  float *h = dev_get_typed(dev, n, G->act);
  compare(what, h, ref, n, tol_norm, tol_elem);
  free(h);
}

static int dev_equal_bytes(const void *a, const void *b, size_t n_bytes) {
  unsigned char *ha = malloc(n_bytes ? n_bytes : 1), *hb = malloc(n_bytes ? n_bytes : 1);
  G->to_host(G, ha, a, n_bytes);
  G->to_host(G, hb, b, n_bytes);
  const int eq = memcmp(ha, hb, n_bytes) == 0;
  free(ha);
  free(hb);
  return eq;
}
static int dev_equal(const float *a, const float *b, int64_t n) { return dev_equal_bytes(a, b, sizeof(float) * n); }
static int dev_equal_act(const void *a, const void *b, int64_t n) {
  return dev_equal_bytes(a, b, k_dtype_bytes(G->act) * (size_t)n);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// Creation: k_backend_opts.act picks the activation dtype of k_backend_cuda_create.

static void test_create(void) {
  k_backend *b = k_backend_cuda_create(&(k_backend_opts){.act = K_F32});
  EXPECT(b->act == K_F32 && strcmp(b->name, "cuda") == 0, "opts.act = K_F32 gives act %d", (int)b->act);
  k_backend_free(&b);
  b = k_backend_cuda_create(&(k_backend_opts){.act = K_BF16});
  EXPECT(b->act == K_BF16, "opts.act = K_BF16 gives act %d", (int)b->act);
  k_backend_free(&b);
  k_backend_free(&b);  // safe twice
  EXPECT(b == NULL, "k_backend_free clears the pointer");
}

// ---------------------------------------------------------------------------------------------
// Memory

static void test_memory(void) {
  const size_t n_bytes = 1000;
  unsigned char *d = G->alloc(G, n_bytes), h[1000], h2[1000];
  memset(h, 0xAB, sizeof h);
  G->to_host(G, h, d, n_bytes);
  int zero = 1;
  for (size_t i = 0; i < n_bytes; i++) zero &= h[i] == 0;
  EXPECT(zero, "alloc must be zero-filled");
  for (size_t i = 0; i < n_bytes; i++) h[i] = (unsigned char)(i * 7 + 1);
  G->from_host(G, d, h, n_bytes);
  unsigned char *d2 = G->alloc(G, n_bytes);
  G->copy(G, d2, d, n_bytes);
  G->to_host(G, h2, d2, n_bytes);
  EXPECT(memcmp(h, h2, n_bytes) == 0, "from_host / copy / to_host round trip");
  G->zero(G, d2 + 100, 50);
  G->sync(G);
  G->to_host(G, h2, d2, n_bytes);
  int ok = 1;
  for (size_t i = 0; i < n_bytes; i++) ok &= h2[i] == (i >= 100 && i < 150 ? 0 : h[i]);
  EXPECT(ok, "zero clears exactly the range");
  EXPECT(k_cuda_stream_of(G) != NULL, "k_cuda_stream_of returns the backend's stream");
  dev_free(d);
  dev_free(d2);
}

// ---------------------------------------------------------------------------------------------
// GEMM

// One product with A, B in the act dtype and C in c_type. The per-element bound is
// tol_acc |alpha| |op(A)| |op(B)| + |beta C0| (summation order; 1e-5 as for any fp32 dot product,
// 1e-4 for the tensor cores' bf16 products) plus, for a bf16 C, its one rounding (2^-8 |C|:
// the backend forbids cuBLAS's split-K reductions in bf16, which would round partial sums).
static void test_gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, k_dtype c_type) {
  const int pad = 3;  // leading dims wider than the matrix, to catch ld mix-ups
  const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  const int64_t na = (int64_t)a_rows * lda, nb = (int64_t)b_rows * ldb, nc = (int64_t)M * ldc;
  float *A = rand_act(na, 1.0), *B = rand_act(nb, 1.0), *C = rand_buf(nc, 1.0);
  if (c_type == K_BF16)
    for (int64_t i = 0; i < nc; i++) C[i] = bf16_round(C[i]);
  if (beta == 0.0f)  // beta == 0 must overwrite C without reading it: NaNs must not leak in
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(int64_t)i * ldc + j] = NAN;
  float *C0 = copy_buf(C, nc);
  void *dA = dev_put_act(A, na), *dB = dev_put_act(B, nb), *dC = dev_put_typed(C, nc, c_type);
  k_cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  G->gemm(G, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc, c_type);
  float *g = dev_get_typed(dC, nc, c_type);
  for (int64_t i = 0; i < na; i++) A[i] = fabsf(A[i]);
  for (int64_t i = 0; i < nb; i++) B[i] = fabsf(B[i]);
  float *bound = calloc((size_t)nc, sizeof(float));
  k_cpu_gemm(ta, tb, M, N, K, fabsf(alpha), A, lda, B, ldb, 0.0f, bound, ldc);
  const double tol_acc = G->act == K_BF16 ? 1e-4 : 1e-5, tol_rnd = c_type == K_BF16 ? 1.0 / 256 : 0.0;
  const double tol_norm = c_type == K_BF16 ? 1e-2 : G->act == K_BF16 ? 1e-3 : 1e-5;
  double ss_err = 0.0, ss_ref = 0.0, worst = 0.0;
  int pad_ok = 1, nan_ok = 1;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      const int64_t ij = (int64_t)i * ldc + j;
      if (isnan(g[ij]) || isnan(C[ij])) {
        nan_ok = 0;
        continue;
      }
      const double e = (double)g[ij] - C[ij];
      ss_err += e * e;
      ss_ref += (double)C[ij] * C[ij];
      const double b = bound[ij] + (beta == 0.0f ? 0.0f : fabsf(beta * C0[ij]));
      const double rel = fabs(e) / (1.01 * tol_acc * b + tol_rnd * fabs((double)C[ij]) + 1e-6);
      if (rel > worst) worst = rel;
    }
    for (int j = N; j < ldc; j++) pad_ok &= memcmp(&g[(int64_t)i * ldc + j], &C0[(int64_t)i * ldc + j], 4) == 0;
  }
  const double norm = ss_err == 0.0 ? 0.0 : sqrt(ss_err / (ss_ref + 1e-30));
  EXPECT(nan_ok && pad_ok && norm <= tol_norm && worst <= 1.0,
         "[%s] gemm C %s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g: nan_ok %d pad_ok %d norm err %.3g, "
         "worst/bound %.3g",
         ACT, c_type == K_BF16 ? "bf16" : "f32", ta, tb, M, N, K, alpha, beta, nan_ok, pad_ok, norm, worst);
  free(A), free(B), free(C), free(C0), free(g), free(bound);
  dev_free(dA), dev_free(dB), dev_free(dC);
}

// The weight-gradient pattern: dW (N,K) fp32 += dY^T X over two micro-batches, bf16 (or fp32)
// operands, beta = 1; and the same again into a second buffer gives the same bits.
static void test_gemm_accum(int M, int N, int K) {
  const int64_t ny = (int64_t)M * N, nx = (int64_t)M * K, nw = (int64_t)N * K;
  float *dy[2], *x[2], *w = rand_buf(nw, 0.5), *bound = calloc((size_t)nw, sizeof(float));
  void *d_dy[2], *d_x[2];
  float *d_w = dev_putf(w, nw), *d_w2 = dev_putf(w, nw);
  for (int i = 0; i < 2; i++) {
    dy[i] = rand_act(ny, 1.0), x[i] = rand_act(nx, 1.0);
    d_dy[i] = dev_put_act(dy[i], ny), d_x[i] = dev_put_act(x[i], nx);
  }
  float *w0 = copy_buf(w, nw);
  for (int i = 0; i < 2; i++) {
    k_cpu_gemm(1, 0, N, K, M, 1.0f, dy[i], N, x[i], K, 1.0f, w, K);
    G->gemm(G, 1, 0, N, K, M, 1.0f, d_dy[i], N, d_x[i], K, 1.0f, d_w, K, K_F32);
    G->gemm(G, 1, 0, N, K, M, 1.0f, d_dy[i], N, d_x[i], K, 1.0f, d_w2, K, K_F32);
    for (int64_t j = 0; j < ny; j++) dy[i][j] = fabsf(dy[i][j]);
    for (int64_t j = 0; j < nx; j++) x[i][j] = fabsf(x[i][j]);
    k_cpu_gemm(1, 0, N, K, M, 1.0f, dy[i], N, x[i], K, 1.0f, bound, K);
  }
  float *g = dev_getf(d_w, nw);
  double worst = 0.0, ss_err = 0.0, ss_ref = 0.0;
  for (int64_t j = 0; j < nw; j++) {
    const double e = (double)g[j] - w[j];
    ss_err += e * e, ss_ref += (double)w[j] * w[j];
    const double rel = fabs(e) / ((G->act == K_BF16 ? 1e-4 : 1e-5) * (bound[j] + fabsf(w0[j])) + 1e-6);
    if (rel > worst) worst = rel;
  }
  const double norm = sqrt(ss_err / (ss_ref + 1e-30));
  EXPECT(norm <= (G->act == K_BF16 ? 1e-3 : 1e-5) && worst <= 1.0,
         "[%s] gemm dW += dY^T X (C f32, beta 1) M=%d N=%d K=%d: norm err %.3g, worst/bound %.3g", ACT, M, N, K, norm,
         worst);
  EXPECT(dev_equal(d_w, d_w2, nw), "[%s] gemm M=%d N=%d K=%d not bitwise repeatable", ACT, M, N, K);
  for (int i = 0; i < 2; i++) free(dy[i]), free(x[i]), dev_free(d_dy[i]), dev_free(d_x[i]);
  free(w), free(w0), free(bound), free(g);
  dev_free(d_w), dev_free(d_w2);
}

static void test_gemm(void) {
  static const int sizes[] = {1, 7, 33, 128, 257};
  static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}};
  const k_dtype c_types[2] = {G->act, K_F32};
  const int n_ct = G->act == K_F32 ? 1 : 2;
  int c = 0;
  for (int ic = 0; ic < n_ct; ic++) {
    const k_dtype ct = c_types[ic];
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int im = 0; im < 5; im++)
          for (int in = 0; in < 5; in++)
            for (int ik = 0; ik < 5; ik++, c++)
              test_gemm_case(ta, tb, sizes[im], sizes[in], sizes[ik], ab[c % 3][0], ab[c % 3][1], ct);
    // Degenerate cases: K == 0 and alpha == 0 leave beta * C (zeros for beta == 0).
    test_gemm_case(0, 0, 5, 6, 0, 1.0f, 0.0f, ct);
    test_gemm_case(1, 1, 5, 6, 0, 1.0f, 0.5f, ct);
    test_gemm_case(0, 1, 9, 4, 3, 0.0f, 2.0f, ct);
    // Products the size of the model's projections.
    test_gemm_case(0, 1, 512, 768, 1024, 1.0f, 0.0f, ct);
    test_gemm_case(1, 0, 768, 1024, 512, 1.0f, 1.0f, ct);
  }
  test_gemm_accum(300, 96, 130);
  test_gemm_accum(1024, 256, 512);
  printf("[%s] gemm: %d shapes x 4 transposes + 5 more, for %d C dtype(s); dW accumulation\n", ACT, c / 4 / n_ct,
         n_ct);
}

// D = A W^T + C into the fp32 residual stream (cuBLASLt): against the CPU reference, each element
// within the accumulation bound, separate D and in place (D == C), bitwise repeatable.
static void test_linear_residual_case(int M, int N, int K, int in_place) {
  const int64_t na = (int64_t)M * K, nw = (int64_t)N * K, nc = (int64_t)M * N;
  float *A = rand_act(na, 1.0), *W = rand_act(nw, 1.0), *C = rand_buf(nc, 1.0), *D = malloc(sizeof(float) * nc);
  void *dA = dev_put_act(A, na), *dW = dev_put_act(W, nw);
  float *dC = dev_putf(C, nc), *dD = in_place ? dC : G->alloc(G, sizeof(float) * nc), *dD2 = NULL;
  k_cpu_linear_residual(M, N, K, A, W, C, D);
  G->linear_residual(G, M, N, K, dA, dW, dC, dD);
  float *g = dev_getf(dD, nc), *c_after = dev_getf(dC, nc);
  for (int64_t i = 0; i < na; i++) A[i] = fabsf(A[i]);
  for (int64_t i = 0; i < nw; i++) W[i] = fabsf(W[i]);
  float *bound = calloc((size_t)nc, sizeof(float));
  k_cpu_gemm(0, 1, M, N, K, 1.0f, A, K, W, K, 0.0f, bound, N);
  const double tol_acc = G->act == K_BF16 ? 1e-4 : 1e-5;
  double worst = 0.0;
  int nan_ok = 1, c_kept = 1;
  for (int64_t i = 0; i < nc; i++) {
    if (isnan(g[i]) != isnan(D[i])) nan_ok = 0;
    const double rel = fabs((double)g[i] - D[i]) / (1.01 * tol_acc * (bound[i] + fabsf(C[i])) + 1e-6);
    if (rel > worst) worst = rel;
    if (!in_place) c_kept &= c_after[i] == C[i];
  }
  if (!in_place) {  // the same call again gives the same bits
    dD2 = G->alloc(G, sizeof(float) * nc);
    G->linear_residual(G, M, N, K, dA, dW, dC, dD2);
    EXPECT(dev_equal(dD, dD2, nc), "[%s] linear_residual M=%d N=%d K=%d not bitwise repeatable", ACT, M, N, K);
    dev_free(dD2);
  }
  EXPECT(nan_ok && c_kept && worst <= 1.0, "[%s] linear_residual M=%d N=%d K=%d%s: nan_ok %d, C kept %d, "
         "worst/bound %.3g", ACT, M, N, K, in_place ? " (in place)" : "", nan_ok, c_kept, worst);
  free(A), free(W), free(C), free(D), free(g), free(c_after), free(bound);
  dev_free(dA), dev_free(dW), dev_free(dC);
  if (!in_place) dev_free(dD);
}

static void test_linear_residual(void) {
  static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 64, 128}, {130, 257, 33}, {1024, 768, 2048},
                                  {4096, 768, 768}, {5, 8, 0}};
  const int n = (int)(sizeof shapes / sizeof shapes[0]);
  for (int i = 0; i < n; i++)
    for (int ip = 0; ip < 2; ip++) test_linear_residual_case(shapes[i][0], shapes[i][1], shapes[i][2], ip);
  printf("[%s] linear_residual: %d shapes, separate and in place\n", ACT, n);
}

// ---------------------------------------------------------------------------------------------
// Cast (independent of the activation dtype): bit for bit against the host rounding.

static void test_cast_case(int64_t n, int offset) {
  float *x = rand_buf(n + offset, 3.0);
  // Specials and the corners of round-to-nearest-even: ties to even both ways (normal and
  // subnormal), overflow to Inf, the smallest subnormal, signed zero, NaN, Inf.
  static const uint32_t corner[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00000001u, 0x00018000u,
                                    0x00008000u, 0x80000000u, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf818000u};
  for (int i = 0; i < 12 && i < n; i++) memcpy(&x[offset + (i * 7919) % n], &corner[i], 4);
  float *d_f = dev_putf(x, n + offset);
  uint16_t *d_h = G->alloc(G, sizeof(uint16_t) * (size_t)(n + offset));
  float *d_f2 = G->alloc(G, sizeof(float) * (size_t)(n + offset));
  uint16_t *d_h2 = G->alloc(G, sizeof(uint16_t) * (size_t)(n + offset));
  // An offset of 1 element misaligns both sides: the scalar path.
  G->cast(G, d_h + offset, K_BF16, d_f + offset, K_F32, n);
  G->cast(G, d_f2 + offset, K_F32, d_h + offset, K_BF16, n);
  G->cast(G, d_h2 + offset, K_BF16, d_h + offset, K_BF16, n);
  uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n), *h2 = malloc(sizeof(uint16_t) * (size_t)n);
  float *f2 = malloc(sizeof(float) * (size_t)n);
  G->to_host(G, h, d_h + offset, sizeof(uint16_t) * (size_t)n);
  G->to_host(G, h2, d_h2 + offset, sizeof(uint16_t) * (size_t)n);
  G->to_host(G, f2, d_f2 + offset, sizeof(float) * (size_t)n);
  int64_t bad = 0, bad_back = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    const float xi = x[offset + i];
    const uint16_t want = bf16_bits(xi);
    const int ok = isnan(xi) ? isnan(bf16_float(h[i])) : h[i] == want;
    if (!ok && bad++ == 0) first = i;
    // bf16 -> fp32 is exact: the high half of the fp32 bits.
    const uint32_t back = (uint32_t)h[i] << 16;
    if (memcmp(&back, &f2[i], 4) != 0) bad_back++;
  }
  EXPECT(bad == 0, "cast f32->bf16 n=%lld offset %d: %lld elements not rounded to nearest even, first %lld (%.9g "
         "gave 0x%04x, want 0x%04x)", (long long)n, offset, (long long)bad, (long long)first,
         first >= 0 ? x[offset + first] : 0.0, first >= 0 ? h[first] : 0, first >= 0 ? bf16_bits(x[offset + first]) : 0);
  EXPECT(bad_back == 0, "cast bf16->f32 n=%lld offset %d: %lld elements not exact", (long long)n, offset,
         (long long)bad_back);
  EXPECT(memcmp(h, h2, sizeof(uint16_t) * (size_t)n) == 0, "cast bf16->bf16 n=%lld is not a copy", (long long)n);
  G->cast(G, d_f2 + offset, K_F32, d_f + offset, K_F32, n);
  EXPECT(dev_equal_bytes(d_f2 + offset, d_f + offset, sizeof(float) * (size_t)n), "cast f32->f32 n=%lld is not a copy",
         (long long)n);
  G->cast(G, d_f2, K_F32, d_f, K_BF16, 0);  // n == 0 does nothing
  free(x), free(h), free(h2), free(f2);
  dev_free(d_f), dev_free(d_h), dev_free(d_f2), dev_free(d_h2);
}

static void test_cast(void) {
  test_cast_case(1, 0);
  test_cast_case(3, 0);
  test_cast_case(1000, 0);
  test_cast_case(1000003, 0);
  test_cast_case(1001, 1);
  printf("[%s] cast: 5 cases\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

static void test_rmsnorm_case(int64_t rows, int d, int inject) {
  char what[128];
  const int64_t n = rows * d;
  float *x = rand_buf(n, 2.0), *w = rand_buf(d, 1.0), *dy = rand_buf(n, 1.0);
  float *dx = rand_buf(n, 1.0), *dw = rand_buf(d, 1.0);
  if (inject && rows >= 3 && d >= 4) {
    x[2 * d + 3] = NAN;   // poisons row 2 (y, rstd, dx) and every dw
    dy[0 * d + 1] = INFINITY;
  }
  float *y = malloc(sizeof(float) * n), *rstd = malloc(sizeof(float) * rows);
  float *d_x = dev_putf(x, n), *d_w = dev_putf(w, d);
  float *d_r = G->alloc(G, sizeof(float) * rows), *d_dy = dev_putf(dy, n);
  float *d_dx = dev_putf(dx, n), *d_dw = dev_putf(dw, d);
  k_cpu_rmsnorm_fwd(x, w, y, rstd, rows, d, 1e-5f);
  {  // y in the act dtype (the reference rounded like a cast would)
    void *d_ya = dev_alloc_act(n);
    float *ya = copy_buf(y, n);
    if (G->act == K_BF16) round_act(ya, n);
    G->rmsnorm_fwd_act(G, d_x, d_w, d_ya, d_r, rows, d, 1e-5f);
    snprintf(what, sizeof what, "rmsnorm_fwd_act y rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
    compare_act(what, d_ya, ya, n, tol_act(1e-5), tol_act(1e-5));
    snprintf(what, sizeof what, "rmsnorm_fwd_act rstd rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
    compare_dev(what, d_r, rstd, rows, 1e-5, 1e-5);
    free(ya);
    dev_free(d_ya);
  }
  // Backward from the CPU's rstd on both, so only the backward is compared.
  G->from_host(G, d_r, rstd, sizeof(float) * rows);
  float *d_dx2 = dev_putf(dx, n), *d_dw2 = dev_putf(dw, d);  // the same start for rmsnorm_bwd_act
  k_cpu_rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, d);
  {  // one-pass backward, with the act copy of dx
    void *d_dxa = dev_alloc_act(n);
    float *dxa = copy_buf(dx, n);
    if (G->act == K_BF16) round_act(dxa, n);
    G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, d_dx2, d_dw2, d_dxa, rows, d);
    snprintf(what, sizeof what, "rmsnorm_bwd_act dx rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
    compare_dev(what, d_dx2, dx, n, 1e-5, 1e-5);
    snprintf(what, sizeof what, "rmsnorm_bwd_act dw rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
    compare_dev(what, d_dw2, dw, d, 1e-5, 1e-5);
    snprintf(what, sizeof what, "rmsnorm_bwd_act dx_act rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
    compare_act(what, d_dxa, dxa, n, tol_act(1e-5), tol_act(1e-5));
    if (!inject) {  // bitwise repeatable, with or without the act copy
      float *e_dx = G->alloc(G, sizeof(float) * n), *e_dw = G->alloc(G, sizeof(float) * d);
      float *f_dx = G->alloc(G, sizeof(float) * n), *f_dw = G->alloc(G, sizeof(float) * d);
      G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, e_dx, e_dw, d_dxa, rows, d);
      G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, f_dx, f_dw, NULL, rows, d);
      EXPECT(dev_equal(e_dx, f_dx, n) && dev_equal(e_dw, f_dw, d),
             "[%s] rmsnorm_bwd_act rows=%lld d=%d not bitwise repeatable", ACT, (long long)rows, d);
      dev_free(e_dx), dev_free(e_dw), dev_free(f_dx), dev_free(f_dw);
    }
    free(dxa);
    dev_free(d_dxa), dev_free(d_dx2), dev_free(d_dw2);
  }
  G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, d_dx, d_dw, rows, d);
  snprintf(what, sizeof what, "rmsnorm_bwd dx rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
  compare_dev(what, d_dx, dx, n, 1e-5, 1e-5);
  snprintf(what, sizeof what, "rmsnorm_bwd dw rows=%lld d=%d%s", (long long)rows, d, inject ? " +nan" : "");
  compare_dev(what, d_dw, dw, d, 1e-5, 1e-5);
  if (!inject) {  // determinism: the same accumulation from the same start, twice
    float *e_dx = G->alloc(G, sizeof(float) * n), *e_dw = G->alloc(G, sizeof(float) * d);
    float *f_dx = G->alloc(G, sizeof(float) * n), *f_dw = G->alloc(G, sizeof(float) * d);
    G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, e_dx, e_dw, rows, d);
    G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, f_dx, f_dw, rows, d);
    EXPECT(dev_equal(e_dx, f_dx, n) && dev_equal(e_dw, f_dw, d),
           "[%s] rmsnorm_bwd rows=%lld d=%d not bitwise repeatable", ACT, (long long)rows, d);
    dev_free(e_dx), dev_free(e_dw), dev_free(f_dx), dev_free(f_dw);
  }
  free(x), free(w), free(dy), free(dx), free(dw), free(y), free(rstd);
  dev_free(d_x), dev_free(d_w), dev_free(d_r), dev_free(d_dy), dev_free(d_dx), dev_free(d_dw);
}

static void test_rmsnorm(void) {
  static const int64_t shapes[][2] = {{1, 1},     {7, 7},     {33, 64},   {130, 257}, {1000, 1024}, {3000, 33},
                                      {64, 4096}, {40000, 8}, {517, 768}, {9, 2049},  {20, 8193},   {3, 9000}};
  const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
  for (int i = 0; i < n_shapes; i++) test_rmsnorm_case(shapes[i][0], (int)shapes[i][1], 0);
  test_rmsnorm_case(130, 257, 1);
  // The forward's vector paths (d a multiple of 4): a warp per row with 1, 2, 4, 8 float4 per
  // lane and a partial last block of rows; a block per row; past the vector limit (d > 16384).
  static const int64_t vshapes[][2] = {{3, 4},     {1001, 124}, {33, 252}, {9, 500},  {16389, 768},
                                       {7, 1028},  {5, 3996},   {3, 8196}, {2, 16384}, {2, 16388}};
  const int n_v = (int)(sizeof vshapes / sizeof vshapes[0]);
  for (int i = 0; i < n_v; i++) test_rmsnorm_case(vshapes[i][0], (int)vshapes[i][1], 0);
  test_rmsnorm_case(517, 768, 1);
  test_rmsnorm_case(5, 4096, 1);
  printf("[%s] rmsnorm: %d shapes\n", ACT, n_shapes + n_v);
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding

// Rows of ld >= H*hd elements (the heads at the row start, the rest must stay untouched).
static void test_rope_case(int B, int T, int H, int hd, int pad, int pos0, float theta, int inverse, int inject) {
  char what[128];
  const int64_t ld = (int64_t)H * hd + pad, n = (int64_t)B * T * ld;
  float *x = rand_act(n, 1.0);
  if (inject) x[n / 2] = NAN, x[n - 1] = INFINITY;
  void *d_x = dev_put_act(x, n);
  k_cpu_rope(x, B, T, H, hd, ld, pos0, theta, inverse);
  G->rope(G, d_x, B, T, H, hd, ld, pos0, theta, inverse);
  snprintf(what, sizeof what, "rope B=%d T=%d H=%d hd=%d ld=%lld pos0=%d inv=%d%s", B, T, H, hd, (long long)ld, pos0,
           inverse, inject ? " +nan" : "");
  compare_act(what, d_x, x, n, tol_act(1e-5), tol_act(1e-5));
  free(x);
  dev_free(d_x);
}

static void test_rope(void) {
  test_rope_case(1, 1, 1, 2, 0, 0, 10000.0f, 0, 0);
  test_rope_case(2, 3, 4, 16, 0, 0, 10000.0f, 0, 0);
  test_rope_case(1, 65, 3, 64, 64, 7, 10000.0f, 1, 0);    // q|k of a fused row, v left alone
  test_rope_case(2, 130, 2, 128, 0, 0, 500000.0f, 0, 0);
  test_rope_case(3, 33, 5, 128, 6, 4000, 10000.0f, 1, 0);
  test_rope_case(2, 17, 3, 64, 0, 0, 10000.0f, 0, 1);
  test_rope_case(5, 7, 3, 10, 3, 2, 10000.0f, 0, 0);
  // The vector path (half a multiple of 8 bf16 or 4 fp32, 16-byte row stride) and its fallbacks:
  // hd 24 and a 36-element stride are vectorised for fp32 only.
  test_rope_case(4, 33, 24, 64, 0, 5, 10000.0f, 0, 1);
  test_rope_case(2, 9, 3, 64, 8, 3, 10000.0f, 1, 0);    // pad columns past the heads stay untouched
  test_rope_case(3, 5, 2, 16, 4, 0, 10000.0f, 0, 0);
  test_rope_case(2, 7, 3, 24, 0, 1000, 10000.0f, 1, 0);
  test_rope_case(1, 300, 4, 128, 128, 0, 500000.0f, 0, 0);
  printf("[%s] rope: 12 shapes\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// Attention

// q, k, v are column blocks of one fused (T*B, ld) buffer, sequence-major, with pad columns
// past v that must stay untouched (in dq|dk|dv too).
static void test_attn_case(int B, int T, int nh, int nkv, int hd, int pad) {
  char what[160];
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd + pad, nx = (int64_t)B * T * ld;
  const int64_t nq = (int64_t)B * T * nh * hd, nl = (int64_t)B * nh * T, ko = (int64_t)nh * hd, vo = ko + nkv * hd;
  float *x = rand_act(nx, 1.0), *dout = rand_act(nq, 1.0);
  float *o = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * nl), *dx = calloc((size_t)nx, sizeof(float));
  k_cpu_attn_fwd(x, x + ko, x + vo, ld, o, lse, B, T, nh, nkv, hd);
  void *d_x = dev_put_act(x, nx), *d_do = dev_put_act(dout, nq);
  void *d_k = (char *)d_x + ko * (int64_t)k_dtype_bytes(G->act), *d_v = (char *)d_x + vo * (int64_t)k_dtype_bytes(G->act);
  void *d_o = dev_alloc_act(nq);
  float *d_l = G->alloc(G, sizeof(float) * nl);
  G->attn_fwd(G, d_x, d_k, d_v, ld, d_o, d_l, B, T, nh, nkv, hd);
  snprintf(what, sizeof what, "attn_fwd o B=%d T=%d nh=%d nkv=%d hd=%d ld=%lld", B, T, nh, nkv, hd, (long long)ld);
  compare_act(what, d_o, o, nq, tol_act(1e-4), tol_act(1e-3));
  snprintf(what, sizeof what, "attn_fwd lse B=%d T=%d nh=%d nkv=%d hd=%d ld=%lld", B, T, nh, nkv, hd, (long long)ld);
  compare_dev(what, d_l, lse, nl, 1e-5, 1e-5);
  // Backward from the CPU's o (rounded to the act dtype, on both sides) and lse, so only the
  // backward is compared.
  round_act(o, nq);
  k_cpu_attn_bwd(dout, x, x + ko, x + vo, ld, o, lse, dx, dx + ko, dx + vo, B, T, nh, nkv, hd);
  dev_set_typed(d_o, o, nq, G->act);
  G->from_host(G, d_l, lse, sizeof(float) * nl);
  void *g[2];
  const int64_t eb = (int64_t)k_dtype_bytes(G->act);
  for (int r = 0; r < 2; r++) {
    g[r] = dev_alloc_act(nx);
    G->attn_bwd(G, d_do, d_x, d_k, d_v, ld, d_o, d_l, g[r], (char *)g[r] + ko * eb, (char *)g[r] + vo * eb, B, T, nh,
                nkv, hd);
  }
  snprintf(what, sizeof what, "attn_bwd dq|dk|dv B=%d T=%d nh=%d nkv=%d hd=%d ld=%lld", B, T, nh, nkv, hd,
           (long long)ld);
  compare_act(what, g[0], dx, nx, tol_act(1e-4), tol_act(1e-3));
  EXPECT(dev_equal_act(g[0], g[1], nx), "[%s] attn_bwd B=%d T=%d nh=%d nkv=%d hd=%d not bitwise repeatable", ACT, B,
         T, nh, nkv, hd);
  for (int r = 0; r < 2; r++) dev_free(g[r]);
  free(x), free(dout), free(o), free(lse), free(dx);
  dev_free(d_x), dev_free(d_do), dev_free(d_o), dev_free(d_l);
}

static void test_attn(void) {
  static const int shapes[][6] = {  // B, T, nh, nkv, hd, pad
      {1, 1, 2, 2, 16, 0},  {2, 3, 4, 1, 64, 8},    {1, 65, 6, 2, 128, 0}, {2, 130, 4, 4, 64, 0}, {1, 130, 8, 2, 16, 4},
      {1, 33, 2, 1, 128, 0}, {1, 200, 2, 1, 256, 0}, {1, 70, 3, 3, 96, 0},  {1, 40, 2, 1, 20, 4},  {2, 65, 4, 2, 64, 0},
      {3, 37, 4, 2, 32, 12}};
  const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
  for (int i = 0; i < n_shapes; i++)
    test_attn_case(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4], shapes[i][5]);
  printf("[%s] attention: %d shapes\n", ACT, n_shapes);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// gu (rows, 2n): gate columns then up columns, as the fused projection writes them.
static void test_swiglu_case(int64_t rows, int n, int inject) {
  char what[96];
  const int64_t m = rows * n;
  float *gu = rand_act(2 * m, 3.0), *dout = rand_act(m, 1.0);
  if (inject && n >= 8) gu[1] = NAN, gu[n + 3] = NAN, gu[5] = INFINITY, gu[6] = -INFINITY, dout[7] = NAN;
  float *out = malloc(sizeof(float) * m), *dgu = malloc(sizeof(float) * 2 * m);
  void *d_gu = dev_put_act(gu, 2 * m), *d_d = dev_put_act(dout, m);
  void *d_out = dev_alloc_act(m), *d_dgu = dev_alloc_act(2 * m);
  k_cpu_swiglu_fwd(gu, out, rows, n);
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
  G->swiglu_fwd(G, d_gu, d_out, rows, n);
  G->swiglu_bwd(G, d_d, d_gu, d_dgu, rows, n);
  snprintf(what, sizeof what, "swiglu_fwd rows=%lld n=%d%s", (long long)rows, n, inject ? " +nan" : "");
  compare_act(what, d_out, out, m, tol_act(1e-5), tol_act(1e-5));
  snprintf(what, sizeof what, "swiglu_bwd dgate|dup rows=%lld n=%d%s", (long long)rows, n, inject ? " +nan" : "");
  compare_act(what, d_dgu, dgu, 2 * m, tol_act(1e-5), tol_act(1e-5));
  free(gu), free(dout), free(out), free(dgu);
  dev_free(d_gu), dev_free(d_d), dev_free(d_out), dev_free(d_dgu);
}

static void test_swiglu(void) {
  test_swiglu_case(1, 1, 0);
  test_swiglu_case(3, 1000, 0);
  test_swiglu_case(1000, 1003, 0);
  test_swiglu_case(7, 13, 0);
  test_swiglu_case(4, 1000, 1);
  test_swiglu_case(70001, 3, 0);    // more rows than the grid's y dimension
  test_swiglu_case(2, 300001, 0);   // more columns than the grid's x dimension covers
  // The vector path (n a multiple of 8: whole 16-byte vectors) and its edges; n = 2052 is
  // vectorised for fp32 but not bf16, 8k+3 for neither.
  test_swiglu_case(64, 2048, 1);
  test_swiglu_case(64, 2052, 0);
  test_swiglu_case(9, 8 * 100 + 3, 1);
  test_swiglu_case(70001, 8, 0);        // vector rows past the grid's y dimension
  test_swiglu_case(2, 8 * 262145, 0);   // vector columns past what the grid's x dimension covers
  printf("[%s] swiglu: 12 cases\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// Embedding

static void test_embed_case(int64_t n, int d, int v0, int nvl) {
  char what[96];
  // Tokens around the local slice: some below v0, some past it, many repeated.
  int32_t *tok = malloc(sizeof(int32_t) * n);
  const int lo = v0 > 20 ? v0 - 20 : 0, span = v0 + nvl + 20 - lo;
  for (int64_t i = 0; i < n; i++) tok[i] = lo + (int32_t)((rng_uniform() * 0.5 + 0.5) * span) % span;
  const int64_t nt = (int64_t)nvl * d, no = n * d;
  float *table = rand_act(nt, 1.0), *dout = rand_buf(no, 1.0), *dtab = rand_buf(nt, 1.0);  // table: the compute copy
  if (nvl > 2 && d > 1) table[2 * d + 1] = NAN;  // every token of row 2 carries it to out
  float *out = malloc(sizeof(float) * no);
  int32_t *d_tok = dev_puti(tok, n);
  void *d_table = dev_put_act(table, nt);
  float *d_out = G->alloc(G, sizeof(float) * no), *d_dout = dev_putf(dout, no);
  float *d_dtab = dev_putf(dtab, nt), *d_dtab2 = dev_putf(dtab, nt);
  k_cpu_embed_fwd(tok, table, out, n, d, v0, nvl);
  G->embed_fwd(G, d_tok, d_table, d_out, n, d, v0, nvl);
  snprintf(what, sizeof what, "embed_fwd n=%lld d=%d v0=%d nvl=%d", (long long)n, d, v0, nvl);
  compare_dev(what, d_out, out, no, 0.0, 0.0);
  k_cpu_embed_bwd(tok, dout, dtab, n, d, v0, nvl);
  G->embed_bwd(G, d_tok, d_dout, d_dtab, n, d, v0, nvl);
  G->embed_bwd(G, d_tok, d_dout, d_dtab2, n, d, v0, nvl);
  snprintf(what, sizeof what, "embed_bwd n=%lld d=%d v0=%d nvl=%d", (long long)n, d, v0, nvl);
  compare_dev(what, d_dtab, dtab, nt, 1e-6, 1e-6);
  // Sums in token order like the reference: the same bits, and the same again on a second run.
  float *h = dev_getf(d_dtab, nt);
  EXPECT(memcmp(h, dtab, sizeof(float) * nt) == 0, "%s: not bitwise equal to the CPU reference", what);
  EXPECT(dev_equal(d_dtab, d_dtab2, nt), "%s: not bitwise repeatable", what);
  free(h), free(tok), free(table), free(dout), free(dtab), free(out);
  dev_free(d_tok), dev_free(d_table), dev_free(d_out), dev_free(d_dout), dev_free(d_dtab), dev_free(d_dtab2);
}

static void test_embed(void) {
  test_embed_case(1, 7, 0, 5);
  test_embed_case(1000, 64, 10, 50);
  test_embed_case(5000, 33, 0, 3);
  test_embed_case(16384, 257, 100, 1000);
  test_embed_case(4096, 1024, 50000, 64);
  printf("[%s] embed: 5 cases\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

static void test_ce_case(int64_t rows, int nvl, int v0, int inject) {
  char what[96];
  const int64_t n = rows * nvl;
  float *logits = rand_act(n, 5.0);
  if (inject && n > 3) logits[3] = NAN;
  if (inject && n > 100) logits[n / 2 + 1] = NAN;  // inside a row's vector body
  int32_t *tgt = malloc(sizeof(int32_t) * rows);
  const int lo = v0 > 10 ? v0 - 10 : 0, span = v0 + nvl + 10 - lo;
  for (int64_t r = 0; r < rows; r++) tgt[r] = lo + (int32_t)((rng_uniform() * 0.5 + 0.5) * span) % span;
  float *mx = malloc(sizeof(float) * rows), *se = malloc(sizeof(float) * rows), *tl = malloc(sizeof(float) * rows);
  void *d_lg = dev_put_act(logits, n);
  float *d_mx = G->alloc(G, sizeof(float) * rows);
  float *d_se = G->alloc(G, sizeof(float) * rows), *d_tl = G->alloc(G, sizeof(float) * rows);
  int32_t *d_tgt = dev_puti(tgt, rows);
  k_cpu_ce_local_stats(logits, tgt, rows, nvl, v0, mx, se, tl);
  G->ce_local_stats(G, d_lg, d_tgt, rows, nvl, v0, d_mx, d_se, d_tl);
  snprintf(what, sizeof what, "ce_local_stats max rows=%lld nvl=%d%s", (long long)rows, nvl, inject ? " +nan" : "");
  compare_dev(what, d_mx, mx, rows, 0.0, 0.0);
  snprintf(what, sizeof what, "ce_local_stats sumexp rows=%lld nvl=%d%s", (long long)rows, nvl,
           inject ? " +nan" : "");
  // The reference sums a vectorised exp approximation in fp32 lanes: ~1e-6 off over 50k terms.
  compare_dev(what, d_se, se, rows, 5e-6, 5e-6);
  snprintf(what, sizeof what, "ce_local_stats target rows=%lld nvl=%d%s", (long long)rows, nvl,
           inject ? " +nan" : "");
  compare_dev(what, d_tl, tl, rows, 0.0, 0.0);
  // Device-side combination: a made-up global max at or above each row's, then lse and loss.
  float *gm = malloc(sizeof(float) * rows), *se2 = copy_buf(se, rows), *lse2 = malloc(sizeof(float) * rows);
  for (int64_t r = 0; r < rows; r++) gm[r] = mx[r] + (float)(r % 3);
  float *d_gm = dev_putf(gm, rows), *d_se2 = dev_putf(se, rows), *d_lse2 = G->alloc(G, sizeof(float) * rows);
  double *d_loss = G->alloc(G, sizeof(double)), loss = 0, loss_ref = 0;
  k_cpu_ce_rescale(se2, mx, gm, rows);
  G->ce_rescale(G, d_se2, d_mx, d_gm, rows);
  snprintf(what, sizeof what, "ce_rescale rows=%lld%s", (long long)rows, inject ? " +nan" : "");
  compare_dev(what, d_se2, se2, rows, 1e-6, 1e-6);
  G->from_host(G, d_se2, se2, sizeof(float) * rows);
  k_cpu_ce_loss(gm, se2, tl, lse2, rows, &loss_ref);
  G->ce_loss(G, d_gm, d_se2, d_tl, d_lse2, rows, d_loss);
  G->to_host(G, &loss, d_loss, sizeof loss);
  snprintf(what, sizeof what, "ce_loss lse rows=%lld%s", (long long)rows, inject ? " +nan" : "");
  compare_dev(what, d_lse2, lse2, rows, 1e-6, 1e-6);
  // Summation order and the device's logf differ from the host's by ulps per row.
  double mag = 0;
  for (int64_t r = 0; r < rows; r++) mag += fabs((double)lse2[r]) + fabs((double)tl[r]);
  EXPECT(isnan(loss) == isnan(loss_ref) && (isnan(loss) || fabs(loss - loss_ref) <= 1e-6 * (1 + mag)),
         "[%s] ce_loss rows=%lld: %.17g vs reference %.17g", ACT, (long long)rows, loss, loss_ref);
  free(gm), free(se2), free(lse2);
  dev_free(d_gm), dev_free(d_se2), dev_free(d_lse2), dev_free(d_loss);
  float *lse = malloc(sizeof(float) * rows);
  for (int64_t r = 0; r < rows; r++) lse[r] = mx[r] + logf(se[r]);
  float *d_lse = dev_putf(lse, rows);
  k_cpu_ce_bwd(logits, tgt, lse, rows, nvl, v0, 0.125f);
  G->ce_bwd(G, d_lg, d_tgt, d_lse, rows, nvl, v0, 0.125f);
  snprintf(what, sizeof what, "ce_bwd rows=%lld nvl=%d%s", (long long)rows, nvl, inject ? " +nan" : "");
  compare_act(what, d_lg, logits, n, tol_act(1e-5), tol_act(1e-5));
  free(logits), free(tgt), free(mx), free(se), free(tl), free(lse);
  dev_free(d_lg), dev_free(d_mx), dev_free(d_se), dev_free(d_tl), dev_free(d_tgt), dev_free(d_lse);
}

static void test_ce(void) {
  test_ce_case(1, 1, 0, 0);
  test_ce_case(7, 33, 5, 0);
  test_ce_case(65, 1000, 0, 0);
  test_ce_case(16, 50257, 1000, 0);
  test_ce_case(7, 33, 0, 1);
  test_ce_case(3000, 17, 0, 0);  // ce_loss over more rows than its block has threads
  // The vector paths: rows of whole 16-byte vectors (32000), rows that start off a 16-byte
  // boundary with a scalar head and tail (8k+3, 8k+5), rows longer than the registers hold.
  test_ce_case(40, 32000, 0, 0);
  test_ce_case(37, 8 * 1000 + 3, 11, 0);
  test_ce_case(5, 8 * 4003 + 5, 0, 1);
  test_ce_case(3, 70001, 100, 0);
  test_ce_case(11, 4099, 0, 1);
  printf("[%s] cross-entropy: 11 cases\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// add (the residual add of the tensor-parallel path)

static void test_vector_ops(void) {
  static const int64_t ns[] = {1, 1000, 1000003, 5000000};
  for (int i = 0; i < 4; i++) {
    const int64_t n = ns[i];
    float *x = rand_buf(n, 3.0), *y = rand_buf(n, 1.0);
    if (n >= 10) x[n / 3] = NAN, y[n / 2] = INFINITY;
    float *d_x = dev_putf(x, n), *d_y = dev_putf(y, n);
    k_cpu_add(y, x, n);
    G->add(G, d_y, d_x, n);
    compare_dev("add", d_y, y, n, 0.0, 0.0);
    free(x), free(y);
    dev_free(d_x), dev_free(d_y);
  }
  printf("[%s] add: done\n", ACT);
}

// ---------------------------------------------------------------------------------------------
// Timings (printed, never asserted)

// Attention forward and backward at one shape (random q, k, v, dout), reps timed runs each.
static void bench_attn(int B, int T, int nh, int nkv, int hd, int reps) {
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, nx = (int64_t)B * T * ld, nq = (int64_t)B * T * nh * hd;
  const int64_t eb = (int64_t)k_dtype_bytes(G->act);
  float *h = rand_act(nx, 1.0);
  char *x = dev_put_act(h, nx), *dx = dev_alloc_act(nx);  // fused q|k|v rows and their gradient
  void *q = x, *k = x + nh * hd * eb, *v = x + (nh + nkv) * hd * eb;
  void *dq = dx, *dk = dx + nh * hd * eb, *dv = dx + (nh + nkv) * hd * eb;
  void *dout = dev_put_act(h, nq), *o = dev_alloc_act(nq);
  float *lse = G->alloc(G, sizeof(float) * (size_t)B * nh * T);
  free(h);
  G->attn_fwd(G, q, k, v, ld, o, lse, B, T, nh, nkv, hd);
  G->sync(G);
  double t0 = now_s();
  for (int r = 0; r < reps; r++) G->attn_fwd(G, q, k, v, ld, o, lse, B, T, nh, nkv, hd);
  G->sync(G);
  const double t_fwd = (now_s() - t0) / reps;
  G->attn_bwd(G, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
  G->sync(G);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->attn_bwd(G, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
  G->sync(G);
  const double t_bwd = (now_s() - t0) / reps;
  const double fl = 2.0 * B * nh * (double)T * T * hd;  // causal: half of the 4 B nh T^2 hd of QK^T and PV
  printf("bench [%s] attention B=%d T=%d nh=%d nkv=%d hd=%d: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms (%.1f "
         "TFLOP/s)\n", ACT, B, T, nh, nkv, hd, 1e3 * t_fwd, fl / t_fwd * 1e-12, 1e3 * t_bwd, 2.5 * fl / t_bwd * 1e-12);
  dev_free(x), dev_free(dx), dev_free(dout), dev_free(o), dev_free(lse);
}

// C (M,N) = A (M,K) W (N,K)^T, the shape of a linear layer, C in c_type; with wgrad the
// weight gradient instead: C (M,N) += A (K,M)^T W (K,N), beta 1 (A, W reused as buffers).
static void bench_gemm(int M, int N, int K, k_dtype c_type, int wgrad, int reps) {
  const int64_t na = (int64_t)M * K > (int64_t)N * K ? (int64_t)M * K : (int64_t)N * K;
  float *h = rand_act(na, 1.0);
  void *A = dev_put_act(h, na), *W = dev_put_act(h, na);
  void *C = G->alloc(G, k_dtype_bytes(c_type) * (size_t)M * N);
  free(h);
  const int ta = wgrad ? 1 : 0, tb = wgrad ? 0 : 1, lda = wgrad ? M : K, ldb = wgrad ? N : K;
  const float beta = wgrad ? 1.0f : 0.0f;
  G->gemm(G, ta, tb, M, N, K, 1, A, lda, W, ldb, beta, C, N, c_type);
  G->sync(G);
  const double t0 = now_s();
  for (int r = 0; r < reps; r++) G->gemm(G, ta, tb, M, N, K, 1, A, lda, W, ldb, beta, C, N, c_type);
  G->sync(G);
  const double t = (now_s() - t0) / reps;
  printf("bench [%s] gemm %dx%dx%d%s C %s: %.3f ms (%.1f TFLOP/s)\n", ACT, M, N, K, wgrad ? " (A^T B, beta 1)" : "",
         c_type == K_BF16 ? "bf16" : "f32", 1e3 * t, 2.0 * M * N * K / t * 1e-12);
  dev_free(A), dev_free(W), dev_free(C);
}

static void bench(void) {
  const int reps = 10;
  bench_attn(4, 1024, 16, 4, 64, reps);
  bench_attn(1, 4096, 16, 16, 128, 3);  // one TP-2 rank of the 7B model
  bench_gemm(4096, 1024, 1024, G->act, 0, reps);
  bench_gemm(4096, 4096, 4096, G->act, 0, reps);
  if (G->act != K_F32) bench_gemm(4096, 4096, 4096, K_F32, 0, reps);
  bench_gemm(4096, 4096, 4096, K_F32, 1, reps);
  bench_gemm(4096, 11008, 4096, G->act, 0, reps);  // 7B MLP up projection, 4096 tokens
  // fp32 -> bf16 cast of 64 Mi elements (the per-step compute copy of the weights).
  const int64_t n = (int64_t)64 << 20;
  void *f = G->alloc(G, sizeof(float) * (size_t)n), *hb = G->alloc(G, sizeof(uint16_t) * (size_t)n);
  G->cast(G, hb, K_BF16, f, K_F32, n);
  G->sync(G);
  double t0 = now_s();
  for (int r = 0; r < reps; r++) G->cast(G, hb, K_BF16, f, K_F32, n);
  G->sync(G);
  double t = (now_s() - t0) / reps;
  printf("bench [%s] cast f32->bf16 n=%lld: %.3f ms (%.0f GB/s)\n", ACT, (long long)n, 1e3 * t, 6.0 * n / t * 1e-9);
  dev_free(f), dev_free(hb);
  if (G->act != K_F32) return;  // the rest is fp32 whatever the act dtype: timed once
  const int M = 4096, d = 1024;
  float *x = G->alloc(G, 4 * (int64_t)M * d), *dy = G->alloc(G, 4 * (int64_t)M * d);
  float *w = G->alloc(G, 4 * d), *rs = G->alloc(G, 4 * M), *dw = G->alloc(G, 4 * d);
  float *dx = G->alloc(G, 4 * (int64_t)M * d);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->rmsnorm_bwd(G, dy, x, w, rs, dx, dw, M, d);
  G->sync(G);
  printf("bench rmsnorm_bwd rows=%d d=%d: %.3f ms\n", M, d, 1e3 * (now_s() - t0) / reps);
  const int n_tok = 16384, vocab = 32768;
  int32_t *htok = malloc(sizeof(int32_t) * n_tok);
  for (int i = 0; i < n_tok; i++) htok[i] = (int32_t)((rng_uniform() * 0.5 + 0.5) * vocab) % vocab;
  int32_t *tok = dev_puti(htok, n_tok);
  float *dout = G->alloc(G, 4 * (int64_t)n_tok * d), *dtab = G->alloc(G, 4 * (int64_t)vocab * d);
  G->embed_bwd(G, tok, dout, dtab, n_tok, d, 0, vocab);
  G->sync(G);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->embed_bwd(G, tok, dout, dtab, n_tok, d, 0, vocab);
  G->sync(G);
  printf("bench embed_bwd n=%d d=%d vocab=%d: %.3f ms\n", n_tok, d, vocab, 1e3 * (now_s() - t0) / reps);
  free(htok);
  dev_free(x), dev_free(dy), dev_free(dx), dev_free(w), dev_free(rs), dev_free(dw);
  dev_free(tok), dev_free(dout), dev_free(dtab);
}

// Arguments, if any, name the sections to run (create memory gemm cast rmsnorm rope attn swiglu
// embed ce vector bench) and/or the activation dtypes (f32 bf16), e.g. to run a few under
// compute-sanitizer; none runs them all, for both dtypes.
static int is_dtype_arg(const char *a) { return strcmp(a, "f32") == 0 || strcmp(a, "bf16") == 0; }
static int want_of(int argc, char **argv, const char *name, int dtypes) {
  int any = 0;
  for (int i = 1; i < argc; i++) {
    if (is_dtype_arg(argv[i]) != dtypes) continue;
    any = 1;
    if (strcmp(argv[i], name) == 0) return 1;
  }
  return !any;
}
static int want(int argc, char **argv, const char *section) { return want_of(argc, argv, section, 0); }

int main(int argc, char **argv) {
  const int n_dev = k_cuda_device_count();
  if (n_dev == 0) {
    fprintf(stderr, "test_cuda_ops: no CUDA device visible; this gpu-labelled test needs a GPU\n");
    return 1;
  }
  printf("CUDA devices: %d, testing device 0\n", n_dev);
  if (want(argc, argv, "create")) test_create();
  static const k_dtype acts[2] = {K_F32, K_BF16};
  for (int ia = 0; ia < 2; ia++) {
    ACT = acts[ia] == K_BF16 ? "bf16" : "f32";
    if (!want_of(argc, argv, ACT, 1)) continue;
    // attn_own: these are the bounds of the own kernels; with bf16 the backend would route
    // attention to cuDNN, whose flash attention rounds P and dP to bf16 and has its own test
    // (tests/test_cudnn_attn.c, normalised error <= 2e-2).
    G = k_backend_cuda_create(&(k_backend_opts){.act = acts[ia], .attn_own = 1});
    printf("== activations %s on %s\n", ACT, G->device_name);
    if (want(argc, argv, "memory")) test_memory();
    if (want(argc, argv, "gemm")) test_gemm();
    if (want(argc, argv, "gemm")) test_linear_residual();
    if (want(argc, argv, "cast")) test_cast();
    if (want(argc, argv, "rmsnorm")) test_rmsnorm();
    if (want(argc, argv, "rope")) test_rope();
    if (want(argc, argv, "attn")) test_attn();
    if (want(argc, argv, "swiglu")) test_swiglu();
    if (want(argc, argv, "embed")) test_embed();
    if (want(argc, argv, "ce")) test_ce();
    if (want(argc, argv, "vector")) test_vector_ops();
    if (want(argc, argv, "bench")) bench();
    G->sync(G);
    k_backend_free(&G);
  }
  return test_summary();
}
