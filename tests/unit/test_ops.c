// Unit tests of the CPU reference kernels (kernels/cpu/ops_cpu.h): each forward against a naive
// double-precision loop written here, each backward against central finite differences of a
// scalar loss L = sum(out * R) with fixed random R, plus the determinism that bitwise resume
// needs (same bits for 1, 2 and 3 threads). Shapes are small and odd on purpose. The FP8
// reference (kernels/cpu/fp8_cpu.h): every code's value, the encoder against a search for the
// nearest code, and the cast, GEMM and scale update against plain loops.
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "tests/unit/test_util.h"

// ---------------------------------------------------------------------------------------------
// Helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

// Uniform in [-1, 1): a fixed xorshift so every run sees the same data.
static double rng_uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static float *rand_buf(int64_t n, double amp) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = (float)(amp * rng_uniform());
  return x;
}

static float *copy_buf(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

// max |got - ref| / max(max |ref|, floor): one normalised error per tensor.
static double rel_err(const float *got, const double *ref, int64_t n) {
  double num = 0.0, den = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]);
    if (!(e <= num)) num = e;  // also catches NaN
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  return num / den;
}

static double dot_r(const float *out, const double *R, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)out[i] * R[i];
  return s;
}

static double *rand_dbuf(int64_t n) {
  double *r = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) r[i] = rng_uniform();
  return r;
}

// Central differences of loss() over every stride-th element of x, compared with grad. Tolerance is
// relative to the largest gradient magnitude: fp32 forward noise is ~1e-7 / eps of it. The floor
// of 1e-3 on that magnitude covers gradients that are exactly zero (dk of a single position).
typedef double (*loss_fn)(void *ctx);
static void fd_check_strided(const char *what, loss_fn loss, void *ctx, float *x, int64_t n, const float *grad,
                             int64_t stride) {
  const double eps = 1e-3, tol = 5e-3;
  double max_err = 0.0, max_g = 1e-3;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const float save = x[i];
    const float xp = (float)(save + eps), xm = (float)(save - eps);
    x[i] = xp;
    const double lp = loss(ctx);
    x[i] = xm;
    const double lm = loss(ctx);
    x[i] = save;
    const double fd = (lp - lm) / ((double)xp - (double)xm);
    const double e = fabs(fd - (double)grad[i]);
    if (!(e <= max_err)) max_err = e, worst = i;
    if (fabs(fd) > max_g) max_g = fabs(fd);
    if (fabs(grad[i]) > max_g) max_g = fabs(grad[i]);
  }
  EXPECT(max_err <= tol * max_g, "%s: finite-difference error %.3g (max |grad| %.3g, worst element %lld)", what,
         max_err, max_g, (long long)worst);
}

static void fd_check(const char *what, loss_fn loss, void *ctx, float *x, int64_t n, const float *grad) {
  fd_check_strided(what, loss, ctx, x, n, grad, 1);
}

// ---------------------------------------------------------------------------------------------
// GEMM

static void test_gemm_case(k_isa isa, int ta, int tb, int M, int N, int K, float alpha, float beta) {
  const int pad = 3;  // leading dims wider than the matrix, to catch ld mix-ups
  const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  float *A = rand_buf((int64_t)a_rows * lda, 1.0), *B = rand_buf((int64_t)b_rows * ldb, 1.0);
  float *C = rand_buf((int64_t)M * ldc, 1.0);
  float *C0 = copy_buf(C, (int64_t)M * ldc);
  if (beta == 0.0f)  // beta == 0 must overwrite C without reading it: NaNs must not leak in
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(int64_t)i * ldc + j] = NAN;
  k_cpu_gemm_isa(isa, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  double worst = 0.0;
  int pad_ok = 1;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = 0.0, abs_s = 0.0;
      for (int k = 0; k < K; k++) {
        double a = ta ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k];
        double b = tb ? B[(int64_t)j * ldb + k] : B[(int64_t)k * ldb + j];
        s += a * b;
        abs_s += fabs(a * b);
      }
      double c0 = C0[(int64_t)i * ldc + j];
      double ref = alpha * s + (beta == 0.0f ? 0.0 : beta * c0);
      double bound = 1e-5 * (fabs(alpha) * abs_s + fabs(beta * c0)) + 1e-6;
      double e = fabs(C[(int64_t)i * ldc + j] - ref) / bound;
      if (!(e <= worst)) worst = e;
    }
    for (int j = N; j < ldc; j++) pad_ok &= C[(int64_t)i * ldc + j] == C0[(int64_t)i * ldc + j];
  }
  EXPECT(worst <= 1.0, "gemm ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g: error %.3g of the bound", ta, tb, M, N, K,
         alpha, beta, worst);
  EXPECT(pad_ok, "gemm ta=%d tb=%d M=%d N=%d K=%d wrote outside C's N columns", ta, tb, M, N, K);
  free(A), free(B), free(C), free(C0);
}

// Every kernel the CPU can run (the isa argument caps the choice), each against the naive loop.
static void test_gemm_all(void);
static void test_gemm(k_isa isa) {
  static const int shapes[][3] = {{1, 1, 1},     {3, 17, 33},   {17, 3, 100},  {33, 100, 17}, {100, 33, 3},
                                  {64, 64, 64},  {130, 70, 300}, {9, 257, 513}, {257, 40, 20}, {1, 100, 7},
                                  {100, 1, 260}, {200, 150, 90}, {19, 3100, 9}};  // last: N > one NC block
  static const float betas[] = {0.0f, 1.0f, 0.5f};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int b = 0; b < 3; b++)
          test_gemm_case(isa, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], b == 2 ? -0.75f : 1.0f, betas[b]);
  // K == 0: C = beta * C (and beta == 0 gives zeros even over NaN).
  float C[6] = {1, 2, 3, 4, 5, NAN}, A[1] = {0}, B[1] = {0};
  k_cpu_gemm(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.5f, C, 3);
  EXPECT(C[0] == 0.5f && C[4] == 2.5f && isnan(C[5]), "gemm K=0 must give beta*C");
  C[5] = NAN;
  k_cpu_gemm(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3);
  EXPECT(C[0] == 0.0f && C[5] == 0.0f, "gemm K=0 beta=0 must give zeros");
}

static void test_gemm_all(void) {
  static const k_isa isas[] = {K_ISA_AVX512, K_ISA_AVX2, K_ISA_SSE};
  for (int i = 0; i < 3; i++) test_gemm(isas[i]);
  // The AVX2 and AVX-512 kernels (different tiles, both FMA) must agree bitwise, edges included.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    const int M = 37, N = 71, K = 300;
    float *A = rand_buf((int64_t)M * K, 1.0), *B = rand_buf((int64_t)K * N, 1.0);
    float *C1 = rand_buf((int64_t)M * N, 1.0), *C2 = copy_buf(C1, (int64_t)M * N);
    k_cpu_gemm_isa(K_ISA_AVX512, 0, 1, M, N, K, 0.5f, A, K, B, K, 0.25f, C1, N);
    k_cpu_gemm_isa(K_ISA_AVX2, 0, 1, M, N, K, 0.5f, A, K, B, K, 0.25f, C2, N);
    EXPECT(memcmp(C1, C2, sizeof(float) * M * N) == 0, "gemm: AVX2 and AVX-512 kernels disagree bitwise");
    free(A), free(B), free(C1), free(C2);
  }
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

typedef struct {
  float *x, *w, *y, *rstd;
  const double *R;
  int rows, d;
} rms_ctx;

static double rms_loss(void *p) {
  rms_ctx *c = p;
  k_cpu_rmsnorm_fwd(c->x, c->w, c->y, c->rstd, c->rows, c->d, 1e-5f);
  return dot_r(c->y, c->R, (int64_t)c->rows * c->d);
}

static void test_rmsnorm(int rows, int d) {
  const int64_t n = (int64_t)rows * d;
  float *x = rand_buf(n, 1.0), *w = rand_buf(d, 1.0), *y = rand_buf(n, 1.0), *rstd = rand_buf(rows, 1.0);
  double *R = rand_dbuf(n), *ref = malloc(sizeof(double) * n), *rref = malloc(sizeof(double) * rows);
  k_cpu_rmsnorm_fwd(x, w, y, rstd, rows, d, 1e-5f);
  for (int r = 0; r < rows; r++) {
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss += (double)x[r * d + j] * x[r * d + j];
    rref[r] = 1.0 / sqrt(ss / d + 1e-5);
    for (int j = 0; j < d; j++) ref[r * d + j] = x[r * d + j] * rref[r] * w[j];
  }
  EXPECT(rel_err(y, ref, n) < 1e-6, "rmsnorm fwd rows=%d d=%d: error %.3g", rows, d, rel_err(y, ref, n));
  EXPECT(rel_err(rstd, rref, rows) < 1e-6, "rmsnorm rstd rows=%d d=%d", rows, d);
  // Backward accumulates: start from known values and subtract them afterwards.
  float *dy = malloc(sizeof(float) * n), *dx = rand_buf(n, 1.0), *dw = rand_buf(d, 1.0);
  float *dx0 = copy_buf(dx, n), *dw0 = copy_buf(dw, d);
  for (int64_t i = 0; i < n; i++) dy[i] = (float)R[i];
  k_cpu_rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, d);
  for (int64_t i = 0; i < n; i++) dx[i] -= dx0[i];
  for (int j = 0; j < d; j++) dw[j] -= dw0[j];
  rms_ctx c = {x, w, y, rstd, R, rows, d};
  fd_check("rmsnorm dx", rms_loss, &c, x, n, dx);
  fd_check("rmsnorm dw", rms_loss, &c, w, d, dw);
  free(x), free(w), free(y), free(rstd), free(R), free(ref), free(rref), free(dy), free(dx), free(dw), free(dx0),
      free(dw0);
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding

typedef struct {
  float *x, *y;
  const double *R;
  int B, T, H, hd, pos0;
} rope_ctx;

static double rope_loss(void *p) {
  rope_ctx *c = p;
  const int64_t n = (int64_t)c->B * c->T * c->H * c->hd;
  memcpy(c->y, c->x, sizeof(float) * n);
  k_cpu_rope(c->y, c->B, c->T, c->H, c->hd, (int64_t)c->H * c->hd, c->pos0, 10000.0f, 0);
  return dot_r(c->y, c->R, n);
}

static void test_rope(int B, int T, int H, int hd, int pos0) {
  const int64_t n = (int64_t)B * T * H * hd;
  const int half = hd / 2;
  float *x = rand_buf(n, 1.0), *y = copy_buf(x, n);
  double *ref = malloc(sizeof(double) * n), *R = rand_dbuf(n);
  const int64_t ld = (int64_t)H * hd;
  k_cpu_rope(y, B, T, H, hd, ld, pos0, 10000.0f, 0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < half; i++) {
          const int64_t o = ((int64_t)t * B + b) * ld + (int64_t)h * hd;  // sequence-major rows
          double ang = (pos0 + t) * pow(10000.0, -2.0 * i / hd);
          ref[o + i] = x[o + i] * cos(ang) - x[o + half + i] * sin(ang);
          ref[o + half + i] = x[o + i] * sin(ang) + x[o + half + i] * cos(ang);
        }
  EXPECT(rel_err(y, ref, n) < 1e-6, "rope fwd hd=%d pos0=%d: error %.3g", hd, pos0, rel_err(y, ref, n));
  // The inverse undoes the forward (to rounding).
  k_cpu_rope(y, B, T, H, hd, ld, pos0, 10000.0f, 1);
  for (int64_t i = 0; i < n; i++) ref[i] = x[i];
  EXPECT(rel_err(y, ref, n) < 1e-6, "rope inverse(rope(x)) != x: error %.3g", rel_err(y, ref, n));
  // The inverse is the backward: dx = rope^-1(dy).
  float *g = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++) g[i] = (float)R[i];
  k_cpu_rope(g, B, T, H, hd, ld, pos0, 10000.0f, 1);
  rope_ctx c = {x, y, R, B, T, H, hd, pos0};
  fd_check("rope backward (inverse)", rope_loss, &c, x, n, g);
  free(x), free(y), free(ref), free(R), free(g);
}

// ---------------------------------------------------------------------------------------------
// Attention

// q, k, v are column blocks of one fused (T*B, ld) buffer qkv, sequence-major, with a few
// padding columns past v that attention must neither read nor write.
typedef struct {
  float *qkv, *o, *lse;
  const double *R;
  int B, T, nh, nkv, hd;
  int64_t ld;
} attn_ctx;

static int64_t attn_ld(int nh, int nkv, int hd) { return (int64_t)(nh + 2 * nkv) * hd + 4; }

static double attn_loss(void *p) {
  attn_ctx *c = p;
  const float *q = c->qkv, *k = q + (int64_t)c->nh * c->hd, *v = k + (int64_t)c->nkv * c->hd;
  k_cpu_attn_fwd(q, k, v, c->ld, c->o, c->lse, c->B, c->T, c->nh, c->nkv, c->hd);
  return dot_r(c->o, c->R, (int64_t)c->B * c->T * c->nh * c->hd);
}

static void attn_ref(const float *qkv, int64_t ld, double *o, double *lse, int B, int T, int nh, int nkv, int hd) {
  double *s = malloc(sizeof(double) * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < T; t++) {
        const int kh = h / (nh / nkv);
        const float *qt = qkv + ((int64_t)t * B + b) * ld + (int64_t)h * hd;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) {
          const float *kj = qkv + ((int64_t)j * B + b) * ld + (int64_t)(nh + kh) * hd;
          s[j] = 0.0;
          for (int c = 0; c < hd; c++) s[j] += (double)qt[c] * kj[c];
          s[j] /= sqrt((double)hd);
          if (s[j] > m) m = s[j];
        }
        for (int j = 0; j <= t; j++) sum += exp(s[j] - m);
        double *ot = o + (((int64_t)t * B + b) * nh + h) * hd;
        for (int c = 0; c < hd; c++) ot[c] = 0.0;
        for (int j = 0; j <= t; j++) {
          const float *vj = qkv + ((int64_t)j * B + b) * ld + (int64_t)(nh + nkv + kh) * hd;
          for (int c = 0; c < hd; c++) ot[c] += exp(s[j] - m) / sum * vj[c];
        }
        lse[((int64_t)b * nh + h) * T + t] = m + log(sum);
      }
  free(s);
}

// stride > 1 checks every stride-th input element only, for sequences long enough to span
// several query blocks of the kernel, where checking all of them would be slow.
static void test_attn(int B, int T, int nh, int nkv, int hd, int stride) {
  const int64_t ld = attn_ld(nh, nkv, hd), nx = (int64_t)B * T * ld;
  const int64_t nq = (int64_t)B * T * nh * hd, nl = (int64_t)B * nh * T, qo = (int64_t)nh * hd, vo = qo + nkv * hd;
  float *qkv = rand_buf(nx, 1.5);
  float *o = rand_buf(nq, 1.0), *lse = rand_buf(nl, 1.0);
  double *oref = malloc(sizeof(double) * nq), *lref = malloc(sizeof(double) * nl), *R = rand_dbuf(nq);
  k_cpu_attn_fwd(qkv, qkv + qo, qkv + vo, ld, o, lse, B, T, nh, nkv, hd);
  attn_ref(qkv, ld, oref, lref, B, T, nh, nkv, hd);
  EXPECT(rel_err(o, oref, nq) < 1e-5, "attn fwd B=%d T=%d nh=%d nkv=%d hd=%d: error %.3g", B, T, nh, nkv, hd,
         rel_err(o, oref, nq));
  EXPECT(rel_err(lse, lref, nl) < 1e-5, "attn lse B=%d T=%d nh=%d nkv=%d hd=%d: error %.3g", B, T, nh, nkv, hd,
         rel_err(lse, lref, nl));
  // Padding columns of the gradient must stay as they were (zero here): fd gives 0 for them.
  float *dout = malloc(sizeof(float) * nq), *dqkv = calloc((size_t)nx, sizeof(float));
  for (int64_t i = 0; i < nq; i++) dout[i] = (float)R[i];
  k_cpu_attn_bwd(dout, qkv, qkv + qo, qkv + vo, ld, o, lse, dqkv, dqkv + qo, dqkv + vo, B, T, nh, nkv, hd);
  attn_ctx c = {qkv, o, lse, R, B, T, nh, nkv, hd, ld};
  char what[96];
  snprintf(what, sizeof what, "attn dq|dk|dv (T=%d nh=%d nkv=%d hd=%d)", T, nh, nkv, hd);
  fd_check_strided(what, attn_loss, &c, qkv, nx, dqkv, stride);
  free(qkv), free(o), free(lse), free(oref), free(lref), free(R), free(dout), free(dqkv);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// The gate and up halves of fused rows gu (rows, 2n).
typedef struct {
  float *gu, *out;
  const double *R;
  int64_t rows;
  int n;
} swiglu_ctx;

static double swiglu_loss(void *p) {
  swiglu_ctx *c = p;
  k_cpu_swiglu_fwd(c->gu, c->out, c->rows, c->n);
  return dot_r(c->out, c->R, c->rows * c->n);
}

// SwiGLU over a wide range of gates: exercises the kernels' exp far from 0 (g / (1 + exp(-g))
// has the relative error of exp(-g) when g << 0) and at the ends where it under/overflows.
static void test_swiglu_range(void) {
  enum { N = 20001 };
  float *gu = malloc(sizeof(float) * 2 * (N + 6)), *out = malloc(sizeof(float) * (N + 6));
  float *g = gu, *u = gu + N + 6;  // one row of n = N + 6
  for (int i = 0; i < N; i++) g[i] = -86.0f + 172.0f * i / (N - 1), u[i] = 1.0f;
  const float special[6] = {-200.0f, 200.0f, -INFINITY, INFINITY, NAN, 0.0f};
  for (int i = 0; i < 6; i++) g[N + i] = special[i], u[N + i] = 1.0f;
  k_cpu_swiglu_fwd(gu, out, 1, N + 6);
  double worst = 0.0;
  for (int i = 0; i < N; i++) {
    const double ref = g[i] / (1.0 + exp(-(double)g[i]));
    const double e = ref == 0.0 ? fabs(out[i]) : fabs(out[i] - ref) / fabs(ref);
    if (!(e <= worst)) worst = e;
  }
  EXPECT(worst < 3e-7, "swiglu over g in [-86, 86]: relative error %.3g (exp accuracy)", worst);
  EXPECT(out[N] == 0.0f && out[N + 1] == 200.0f && isnan(out[N + 2]) && out[N + 3] == INFINITY &&
             isnan(out[N + 4]) && out[N + 5] == 0.0f,
         "swiglu special gates: %g %g %g %g %g %g", out[N], out[N + 1], out[N + 2], out[N + 3], out[N + 4], out[N + 5]);
  free(gu), free(out);
}

static void test_swiglu(int64_t rows, int n) {
  const int64_t m = rows * n;
  float *gu = rand_buf(2 * m, 3.0), *out = malloc(sizeof(float) * m);
  double *ref = malloc(sizeof(double) * m), *R = rand_dbuf(m);
  k_cpu_swiglu_fwd(gu, out, rows, n);
  for (int64_t r = 0; r < rows; r++)
    for (int j = 0; j < n; j++) {
      const double g = gu[r * 2 * n + j], u = gu[r * 2 * n + n + j];
      ref[r * n + j] = g / (1.0 + exp(-g)) * u;
    }
  EXPECT(rel_err(out, ref, m) < 1e-6, "swiglu fwd rows=%lld n=%d: error %.3g", (long long)rows, n,
         rel_err(out, ref, m));
  float *dout = malloc(sizeof(float) * m), *dgu = malloc(sizeof(float) * 2 * m);
  for (int64_t i = 0; i < m; i++) dout[i] = (float)R[i];
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
  swiglu_ctx c = {gu, out, R, rows, n};
  fd_check("swiglu dgate|dup", swiglu_loss, &c, gu, 2 * m, dgu);
  free(gu), free(out), free(ref), free(R), free(dout), free(dgu);
}

// ---------------------------------------------------------------------------------------------
// Embedding (vocab-parallel slice [v0, v0 + nvl) of a vocabulary of V)

typedef struct {
  const int32_t *tok;
  float *table, *out;
  const double *R;
  int n, d, v0, nvl;
} embed_ctx;

static double embed_loss(void *p) {
  embed_ctx *c = p;
  k_cpu_embed_fwd(c->tok, c->table, c->out, c->n, c->d, c->v0, c->nvl);
  return dot_r(c->out, c->R, (int64_t)c->n * c->d);
}

static void test_embed(int n, int d, int V, int v0, int nvl) {
  int32_t *tok = malloc(sizeof(int32_t) * n);
  for (int i = 0; i < n; i++) tok[i] = (int32_t)((rng_uniform() + 1.0) * 0.5 * V) % V;
  tok[0] = v0, tok[n - 1] = v0 + nvl - 1, tok[1] = v0;  // both ends of the slice, and a repeat
  float *table = rand_buf((int64_t)nvl * d, 1.0), *out = rand_buf((int64_t)n * d, 1.0);
  double *ref = malloc(sizeof(double) * n * d), *R = rand_dbuf((int64_t)n * d);
  k_cpu_embed_fwd(tok, table, out, n, d, v0, nvl);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++)
      ref[i * d + j] = tok[i] >= v0 && tok[i] < v0 + nvl ? table[(tok[i] - v0) * d + j] : 0.0;
  EXPECT(rel_err(out, ref, (int64_t)n * d) == 0.0, "embed fwd v0=%d nvl=%d: not an exact row copy / zero", v0, nvl);
  float *dout = malloc(sizeof(float) * n * d), *dt = rand_buf((int64_t)nvl * d, 1.0);
  float *dt0 = copy_buf(dt, (int64_t)nvl * d);
  for (int64_t i = 0; i < (int64_t)n * d; i++) dout[i] = (float)R[i];
  k_cpu_embed_bwd(tok, dout, dt, n, d, v0, nvl);
  for (int64_t i = 0; i < (int64_t)nvl * d; i++) dt[i] -= dt0[i];
  embed_ctx c = {tok, table, out, R, n, d, v0, nvl};
  fd_check("embed dtable", embed_loss, &c, table, (int64_t)nvl * d, dt);
  free(tok), free(table), free(out), free(ref), free(R), free(dout), free(dt), free(dt0);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy: the vocabulary V is split into two slices as two TP ranks would hold it; the
// caller's combination of local stats into the global lse is done here as the model would.

typedef struct {
  float *logits;  // (rows, V)
  const int32_t *tgt;
  int rows, V;
  double scale;
} ce_ctx;

// scale * sum_r (lse_r - logit_r[target]) straight from the full logits, in double.
static double ce_loss(void *p) {
  ce_ctx *c = p;
  double L = 0.0;
  for (int r = 0; r < c->rows; r++) {
    const float *lr = c->logits + (int64_t)r * c->V;
    double m = -INFINITY, s = 0.0;
    for (int j = 0; j < c->V; j++) m = lr[j] > m ? lr[j] : m;
    for (int j = 0; j < c->V; j++) s += exp(lr[j] - m);
    L += m + log(s) - lr[c->tgt[r]];
  }
  return c->scale * L;
}

static void test_ce(int rows, int V, int split) {
  float *logits = rand_buf((int64_t)rows * V, 3.0);
  int32_t *tgt = malloc(sizeof(int32_t) * rows);
  for (int r = 0; r < rows; r++) tgt[r] = (int32_t)((rng_uniform() + 1.0) * 0.5 * V) % V;
  tgt[0] = split - 1, tgt[rows - 1] = split;  // targets on both sides of the slice boundary
  const int v0s[2] = {0, split}, nvls[2] = {split, V - split};
  float *loc[2], mx[2][64], se[2][64], tl[2][64];
  for (int s = 0; s < 2; s++) {
    loc[s] = malloc(sizeof(float) * rows * nvls[s]);
    for (int r = 0; r < rows; r++)
      memcpy(loc[s] + (int64_t)r * nvls[s], logits + (int64_t)r * V + v0s[s], sizeof(float) * nvls[s]);
    k_cpu_ce_local_stats(loc[s], tgt, rows, nvls[s], v0s[s], mx[s], se[s], tl[s]);
    for (int r = 0; r < rows; r++) {
      double m = -INFINITY, sum = 0.0;
      const float *lr = loc[s] + (int64_t)r * nvls[s];
      for (int j = 0; j < nvls[s]; j++) m = lr[j] > m ? lr[j] : m;
      for (int j = 0; j < nvls[s]; j++) sum += exp(lr[j] - m);
      int local = tgt[r] >= v0s[s] && tgt[r] < v0s[s] + nvls[s];
      EXPECT(mx[s][r] == (float)m, "ce row_max slice %d row %d", s, r);
      EXPECT(fabs(se[s][r] - sum) <= 1e-6 * sum, "ce row_sumexp slice %d row %d: %g vs %g", s, r, se[s][r], sum);
      EXPECT(tl[s][r] == (local ? lr[tgt[r] - v0s[s]] : 0.0f), "ce target_logit slice %d row %d", s, r);
    }
  }
  // Global lse as the caller combines it across ranks; the loss it gives must match the reference.
  float lse[64];
  const double scale = 1.0 / rows;
  double L = 0.0;
  for (int r = 0; r < rows; r++) {
    double m = mx[0][r] > mx[1][r] ? mx[0][r] : mx[1][r];
    double s = se[0][r] * exp(mx[0][r] - m) + se[1][r] * exp(mx[1][r] - m);
    lse[r] = (float)(m + log(s));
    L += scale * ((double)lse[r] - tl[0][r] - tl[1][r]);
  }
  ce_ctx c = {logits, tgt, rows, V, scale};
  EXPECT(fabs(L - ce_loss(&c)) < 1e-5, "ce loss from local stats %.8g vs reference %.8g", L, ce_loss(&c));
  float *grad = malloc(sizeof(float) * rows * V);
  for (int s = 0; s < 2; s++) {
    k_cpu_ce_bwd(loc[s], tgt, lse, rows, nvls[s], v0s[s], (float)scale);
    for (int r = 0; r < rows; r++)
      memcpy(grad + (int64_t)r * V + v0s[s], loc[s] + (int64_t)r * nvls[s], sizeof(float) * nvls[s]);
  }
  fd_check("ce dlogits (two vocab slices)", ce_loss, &c, logits, (int64_t)rows * V, grad);
  free(logits), free(tgt), free(loc[0]), free(loc[1]), free(grad);
}

// ---------------------------------------------------------------------------------------------
// AdamW, sumsq, scale, add

static void test_adamw(void) {
  const int64_t n = 1001;
  float *p = rand_buf(n, 1.0), *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
  double *pr = malloc(sizeof(double) * n), *mr = calloc(n, sizeof(double)), *vr = calloc(n, sizeof(double));
  for (int64_t i = 0; i < n; i++) pr[i] = p[i];
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int t = 1; t <= 5; t++) {
    float *g = rand_buf(n, 0.5);
    const float bc1 = 1.0f - powf(b1, t), bc2 = 1.0f - powf(b2, t);
    k_cpu_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
    for (int64_t i = 0; i < n; i++) {
      mr[i] = b1 * mr[i] + (1.0 - b1) * g[i];
      vr[i] = b2 * vr[i] + (1.0 - b2) * (double)g[i] * g[i];
      pr[i] -= lr * (mr[i] / bc1 / (sqrt(vr[i] / bc2) + eps) + wd * pr[i]);
    }
    free(g);
  }
  EXPECT(rel_err(p, pr, n) < 1e-6, "adamw p: error %.3g", rel_err(p, pr, n));
  EXPECT(rel_err(m, mr, n) < 1e-6, "adamw m: error %.3g", rel_err(m, mr, n));
  EXPECT(rel_err(v, vr, n) < 1e-6, "adamw v: error %.3g", rel_err(v, vr, n));
  free(p), free(m), free(v), free(pr), free(mr), free(vr);
}

static void test_vector_ops(void) {
  const int64_t n = 1000003;  // several sumsq blocks, last one partial
  float *x = rand_buf(n, 2.0), *y = rand_buf(n, 1.0), *y0 = copy_buf(y, n);
  double ref = 0.0;
  for (int64_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
  double s[3];
  for (int nt = 1; nt <= 3; nt++) {
    omp_set_num_threads(nt);
    s[nt - 1] = k_cpu_sumsq(x, n);
  }
  omp_set_num_threads(2);
  EXPECT(fabs(s[0] - ref) <= 1e-12 * ref, "sumsq %.17g vs %.17g", s[0], ref);
  EXPECT(memcmp(&s[0], &s[1], sizeof(double)) == 0 && memcmp(&s[0], &s[2], sizeof(double)) == 0,
         "sumsq differs with thread count: %.17g %.17g %.17g", s[0], s[1], s[2]);
  const double s3 = (double)x[0] * x[0] + (double)x[1] * x[1] + (double)x[2] * x[2];
  EXPECT(k_cpu_sumsq(x, 0) == 0.0 && k_cpu_sumsq(x, 3) == s3, "sumsq of tiny inputs");
  k_cpu_add(y, x, K_F32, n);
  int ok = 1;
  for (int64_t i = 0; i < n; i++) ok &= y[i] == y0[i] + x[i];
  EXPECT(ok, "add");
  k_cpu_scale(y, n, 0.25f);
  ok = 1;
  for (int64_t i = 0; i < n; i++) ok &= y[i] == (y0[i] + x[i]) * 0.25f;
  EXPECT(ok, "scale");
  free(x), free(y), free(y0);
}

// ---------------------------------------------------------------------------------------------
// FP8. Known values worked out by hand from the bit layouts (sign | exponent | mantissa):
// E4M3 1.0 = 0 0111 000 = 0x38 (bias 7); 0.1 = 1.6 * 2^-4 -> exponent 3, mantissa 0.6 * 8 = 4.8
// -> 5: 0 0011 101 = 0x1D = 1.625 / 16 = 0.1015625; 448 = 1.75 * 2^8 = 0 1111 110 = 0x7E.
// E5M2 1.0 = 0 01111 00 = 0x3C (bias 15); 0.1 -> mantissa 0.6 * 4 = 2.4 -> 2: 0 01011 10 = 0x2E
// = 1.5 / 16 = 0.09375; 57344 = 1.75 * 2^15 = 0 11110 11 = 0x7B.

// The code nearest x among a format's finite values, ties to the even code, beyond the largest
// finite value saturated: the encoder's definition, by exhaustive search over decoded codes.
static uint8_t fp8_nearest(float x, k_fp8 f) {
  if (isnan(x)) return 0x7F;
  const int top = f == K_E4M3 ? 0x7E : 0x7B;
  const double ax = fmin(fabs((double)x), k_fp8_max(f));
  int best = 0;
  for (int c = 1; c <= top; c++) {
    const double d = fabs(k_cpu_fp8_decode((uint8_t)c, f) - ax), db = fabs(k_cpu_fp8_decode((uint8_t)best, f) - ax);
    if (d < db || (d == db && !(c & 1))) best = c;
  }
  return (uint8_t)(best | (signbit(x) ? 0x80 : 0));
}

static void test_fp8_codes(k_fp8 f) {
  const char *fn = k_fp8_name(f);
  const int top = f == K_E4M3 ? 0x7E : 0x7B;
  // {code, value}: by hand, above; subnormals m * 2^(1 - bias - mbits).
  static const struct { uint8_t c; double v; } e4[] = {
      {0x00, 0}, {0x01, 0x1p-9}, {0x07, 7 * 0x1p-9}, {0x08, 0x1p-6}, {0x1D, 0.1015625}, {0x38, 1}, {0x39, 1.125},
      {0x40, 2}, {0x7E, 448}, {0xB8, -1}, {0xFE, -448}, {0x81, -0x1p-9}},
    e5[] = {{0x00, 0}, {0x01, 0x1p-16}, {0x03, 3 * 0x1p-16}, {0x04, 0x1p-14}, {0x2E, 0.09375}, {0x3C, 1},
            {0x3D, 1.25}, {0x7B, 57344}, {0xBC, -1}, {0xFB, -57344}};
  const int n_known = f == K_E4M3 ? (int)(sizeof e4 / sizeof e4[0]) : (int)(sizeof e5 / sizeof e5[0]);
  for (int i = 0; i < n_known; i++) {
    const uint8_t c = f == K_E4M3 ? e4[i].c : e5[i].c;
    const double v = f == K_E4M3 ? e4[i].v : e5[i].v;
    EXPECT(k_cpu_fp8_decode(c, f) == v, "%s 0x%02X decodes to %.9g, expected %.9g", fn, c, k_cpu_fp8_decode(c, f), v);
  }
  // Every code: finite codes increase strictly with the code and re-encode to themselves, the
  // negative half mirrors the positive one, Inf and NaN where the format puts them.
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    const int mag = c & 0x7F;
    const float v = k_cpu_fp8_decode((uint8_t)c, f), vp = k_cpu_fp8_decode((uint8_t)mag, f);
    if (mag <= top) {
      bad += !(v == ((c & 0x80) ? -vp : vp)) || !!signbit(v) != !!(c & 0x80) || k_cpu_fp8_encode(v, f) != c;
      if (mag > 0) bad += !(vp > k_cpu_fp8_decode((uint8_t)(mag - 1), f));
    } else if (f == K_E5M2 && mag == 0x7C) {
      bad += !(isinf(v) && (v < 0) == !!(c & 0x80)) || k_cpu_fp8_encode(v, f) != (uint8_t)((c & 0x80) | top);
    } else {
      bad += !isnan(v) || k_cpu_fp8_encode(v, f) != 0x7F;
    }
  }
  EXPECT(bad == 0, "%s: %d of the 256 codes decode or re-encode wrongly", fn, bad);
  // Rounding: ties to even (normal and subnormal), saturation, signs, NaN. E5M2 spaces 448 and
  // 512 by 64: 464 -> 448 (0x5F), 480 is a tie -> 512 (0x60, even); 61440 ties 57344 and 2^16
  // and saturates either way.
  const float q = f == K_E4M3 ? 0x1p-9f : 0x1p-16f, mx = k_fp8_max(f);
  const struct { float x; uint8_t e4, e5; } r[] = {
      {0.1f, 0x1D, 0x2E}, {1.0625f, 0x38, 0x3C}, {1.1875f, 0x3A, 0x3D}, {1.375f, 0x3B, 0x3E}, {-1.0625f, 0xB8, 0xBC},
      {0.5f * q, 0x00, 0x00}, {1.5f * q, 0x02, 0x02}, {2.5f * q, 0x02, 0x02}, {-0.5f * q, 0x80, 0x80},
      {-1e-30f, 0x80, 0x80}, {464.0f, 0x7E, 0x5F}, {480.0f, 0x7E, 0x60}, {1e9f, 0x7E, 0x7B}, {-1e9f, 0xFE, 0xFB},
      {61440.0f, 0x7E, 0x7B}, {INFINITY, 0x7E, 0x7B}, {-INFINITY, 0xFE, 0xFB}, {NAN, 0x7F, 0x7F}, {-NAN, 0x7F, 0x7F},
      {mx, 0x7E, 0x7B}};
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    const uint8_t want = f == K_E4M3 ? r[i].e4 : r[i].e5, got = k_cpu_fp8_encode(r[i].x, f);
    EXPECT(got == want, "%s encode(%.9g) = 0x%02X, expected 0x%02X", fn, r[i].x, got, want);
  }
  // Against the exhaustive search: every midpoint between neighbouring codes and one fp32 ulp
  // either side, then random magnitudes and random bit patterns.
  bad = 0;
  for (int c = 0; c < top; c++) {
    const float m = 0.5f * (k_cpu_fp8_decode((uint8_t)c, f) + k_cpu_fp8_decode((uint8_t)(c + 1), f));
    const float xs[6] = {m, nextafterf(m, 0.0f), nextafterf(m, INFINITY), -m, -nextafterf(m, 0.0f), 2 * mx - m};
    for (int i = 0; i < 6; i++) bad += k_cpu_fp8_encode(xs[i], f) != fp8_nearest(xs[i], f);
  }
  for (int i = 0; i < 20000; i++) {
    const float x = (float)(rng_uniform() * ldexp(1.0, (int)(24 * rng_uniform())));
    uint32_t u = (uint32_t)(rng_state >> 32);
    float y;
    memcpy(&y, &u, 4);
    bad += k_cpu_fp8_encode(x, f) != fp8_nearest(x, f);
    bad += k_cpu_fp8_encode(y, f) != fp8_nearest(y, f);
  }
  EXPECT(bad == 0, "%s: the encoder and the nearest-code search disagree on %d values", fn, bad);
}

// The cast, the GEMM and the scale update against loops over k_cpu_fp8_encode / _decode.
static void test_fp8_ops(void) {
  const int rows = 37, cols = 21;
  float *x = rand_buf(rows * cols, 3.0), amax = 0.5f;
  x[5] = -7.5f, x[9] = 1e-6f;
  uint8_t *out = malloc(rows * cols), *out_t = malloc(rows * cols);
  k_cpu_fp8_cast(x, rows, cols, 37.0f, K_E4M3, out, out_t, &amax);
  int bad = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const uint8_t q = k_cpu_fp8_encode(x[r * cols + c] * 37.0f, K_E4M3);
      bad += out[r * cols + c] != q || out_t[c * rows + r] != q;
    }
  EXPECT(bad == 0 && amax == 7.5f, "fp8 cast: %d codes wrong, amax %g (expected 7.5)", bad, amax);
  x[11] = NAN;
  k_cpu_fp8_cast(x, rows, cols, 1.0f, K_E5M2, out, NULL, &amax);
  EXPECT(isnan(amax) && out[11] == 0x7F, "fp8 cast: a NaN makes amax NaN (%g) and codes 0x7F (0x%02X)", amax, out[11]);
  // GEMM: (32, 16, 48), E5M2 x E4M3, beta 1, against a double loop of the decoded codes.
  const int M = 32, N = 16, K = 48;
  uint8_t *A = malloc(M * K), *B = malloc(N * K);
  for (int i = 0; i < M * K; i++) A[i] = k_cpu_fp8_encode((float)(rng_uniform() * 1000.0), K_E5M2);
  for (int i = 0; i < N * K; i++) B[i] = k_cpu_fp8_encode((float)(rng_uniform() * 400.0), K_E4M3);
  float *C = rand_buf(M * N, 1.0), *C0 = copy_buf(C, M * N);
  double *ref = malloc(sizeof(double) * M * N);
  k_cpu_gemm_fp8(K_ISA_AUTO, M, N, K, A, K_E5M2, 0.001f, B, K_E4M3, 0.0025f, 1.0f, C);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0.0;
      for (int k = 0; k < K; k++) s += (double)k_cpu_fp8_decode(A[i * K + k], K_E5M2) * k_cpu_fp8_decode(B[j * K + k], K_E4M3);
      ref[i * N + j] = C0[i * N + j] + (double)(0.001f * 0.0025f) * s;
    }
  EXPECT(rel_err(C, ref, M * N) < 1e-6, "fp8 gemm: error %.3g", rel_err(C, ref, M * N));
  char msg[256];
  EXPECT(k_fp8_gemm_check(M, N, K, K_E5M2, K_E4M3, A, B, C, msg, sizeof msg) == 0, "fp8 gemm (32, 16, 48) is legal");
  EXPECT(k_fp8_gemm_check(64, 64, 100, K_E4M3, K_E4M3, A, B, C, msg, sizeof msg) && strstr(msg, "K=100") &&
         strstr(msg, "nearest legal value 96"), "fp8 gemm K=100 refused naming K and 96: %s", msg);
  EXPECT(k_fp8_gemm_check(7, 64, 64, K_E4M3, K_E4M3, A, B, C, msg, sizeof msg) && strstr(msg, "M=7") &&
         strstr(msg, "value 16"), "fp8 gemm M=7 refused naming M and 16: %s", msg);
  EXPECT(k_fp8_gemm_check(64, 64, 64, K_E5M2, K_E5M2, A, B, C, msg, sizeof msg) && strstr(msg, "E5M2 x E5M2"),
         "fp8 gemm E5M2 x E5M2 refused: %s", msg);
  EXPECT(k_fp8_gemm_check(64, 64, 64, K_E4M3, K_E4M3, A + 1, B, C, msg, sizeof msg) && strstr(msg, "aligned"),
         "fp8 gemm misaligned A refused: %s", msg);
  EXPECT(k_fp8_device_check("NVIDIA H100 80GB HBM3", 9, 0, msg, sizeof msg) == 0 &&
         k_fp8_device_check("NVIDIA L4", 8, 9, msg, sizeof msg) == 0 &&
         k_fp8_device_check("NVIDIA B200", 10, 0, msg, sizeof msg) == 0, "fp8 on compute capability 8.9, 9.0, 10.0");
  EXPECT(k_fp8_device_check("NVIDIA A100-SXM4-80GB", 8, 0, msg, sizeof msg) && strstr(msg, "NVIDIA A100-SXM4-80GB") &&
         strstr(msg, "capability 8.0") && strstr(msg, "train.precision=bf16") && !strchr(msg, '\n'),
         "fp8 on an A100 (8.0) refused naming the GPU, 8.0 and the fix: %s", msg);
  EXPECT(k_fp8_device_check("NVIDIA GeForce RTX 3090", 8, 6, msg, sizeof msg) && strstr(msg, "capability 8.6"),
         "fp8 on compute capability 8.6 refused: %s", msg);
  // Scales: E4M3 history max 8, margin 1 -> 448 / 8 / 2 = 28; then the most recent amax 2,
  // margin 0 -> 224; a NaN or zero amax leaves the scale.
  float hist[4 * 2] = {0, 8, 0, 1, 0, 0, 0, 0}, am[4] = {2.0f, 4.0f, NAN, 0.0f}, sc[4] = {1, 1, 3, 5}, si[4] = {1, 1, 1, 1};
  const uint8_t fm[4] = {K_E4M3, K_E5M2, K_E4M3, K_E4M3};
  int n_bad = 1;
  k_cpu_fp8_scales(hist, am, sc, si, 1, fm, 4, 2, 0, 1, 1, &n_bad);
  EXPECT(sc[0] == 28.0f && si[0] == 1.0f / 28.0f && sc[1] == 57344.0f / 4 / 2 && sc[2] == 3 && sc[3] == 5 &&
         n_bad == 2 && am[0] == 0 && am[2] == 0 && hist[0] == 2 && isnan(hist[4]),
         "fp8 scales (max of history, margin 1): scales %g %g %g %g, nonfinite %d", sc[0], sc[1], sc[2], sc[3], n_bad);
  am[0] = 2.0f;
  k_cpu_fp8_scales(hist, am, sc, si, 1, fm, 1, 2, 1, 0, 0, &n_bad);
  EXPECT(sc[0] == 224.0f && hist[1] == 2.0f, "fp8 scales (most recent, margin 0): %g", sc[0]);
  free(x), free(out), free(out_t), free(A), free(B), free(C), free(C0), free(ref);
}

// Block scaling against loops written from its definition (kernels/cpu/fp8_cpu.h): each tile's
// scale 448 / amax, codes encode(x * s), 1 / s at the layout's index; the GEMM's per-block
// products. Tiles of both kinds, partial ones, an all-zero row (scale 1).
static float tile_amax(const float *x, int cols, int r0, int r1, int c0, int c1) {
  float a = 0.0f;
  for (int r = r0; r < r1; r++)
    for (int c = c0; c < c1; c++) a = fmaxf(a, fabsf(x[r * cols + c]));
  return a;
}

static void test_fp8_block(void) {
  const int rows = 150, cols = 200;
  float *x = rand_buf(rows * cols, 1.0), amax = 0.0f;
  for (int i = 0; i < rows * cols; i++) x[i] *= exp2f((float)((i / cols / 128 * 5 + i % cols / 16) % 12) - 6.0f);
  for (int c = 0; c < cols; c++) x[3 * cols + c] = 0.0f;
  uint8_t *out = malloc(rows * cols), *out_t = malloc(rows * cols);
  float *si = malloc(sizeof(float) * 4 * rows), *si_t = malloc(sizeof(float) * 4 * cols);
  int bad = 0;
  for (int tile = 1; tile <= 128; tile += 127) {
    k_cpu_fp8_cast_block(x, rows, cols, tile, out, si, out_t, si_t, &amax);
    for (int r = 0; r < rows; r++)
      for (int c = 0; c < cols; c++) {
        // the tile of (r, c) in out, and in out_t (for tile 1: 128 rows of column c)
        int r0 = tile == 1 ? r : r / 128 * 128, c0 = c / 128 * 128, rt0 = r / 128 * 128, ct0 = tile == 1 ? c : c0;
        float a = tile_amax(x, cols, r0, r0 + tile < rows ? r0 + tile : rows, c0, c0 + 128 < cols ? c0 + 128 : cols);
        float at = tile_amax(x, cols, rt0, rt0 + 128 < rows ? rt0 + 128 : rows, ct0,
                             tile == 1 ? c + 1 : (ct0 + 128 < cols ? ct0 + 128 : cols));
        float s = a > 0 ? 448.0f / a : 1.0f, st = at > 0 ? 448.0f / at : 1.0f;
        bad += out[r * cols + c] != k_cpu_fp8_encode(x[r * cols + c] * s, K_E4M3);
        bad += out_t[c * rows + r] != k_cpu_fp8_encode(x[r * cols + c] * st, K_E4M3);
        bad += si[k_fp8_block_scale_at(rows, cols, tile, r, c)] != 1.0f / s;
        bad += si_t[k_fp8_block_scale_at(cols, rows, tile, c, r)] != 1.0f / st;
      }
  }
  EXPECT(bad == 0 && amax == tile_amax(x, cols, 0, rows, 0, cols), "fp8 block cast: %d codes or scales wrong, amax %g",
         bad, amax);
  // GEMM: (32, 48, 208), 1x128 by 128x128 and 1x128 by 1x128, beta 1, against double loops.
  const int M = 32, N = 48, K = 208;
  uint8_t *A = malloc(M * K), *B = malloc(N * K);
  for (int i = 0; i < M * K; i++) A[i] = k_cpu_fp8_encode((float)(rng_uniform() * 300.0), K_E4M3);
  for (int i = 0; i < N * K; i++) B[i] = k_cpu_fp8_encode((float)(rng_uniform() * 300.0), K_E4M3);
  float sa[2 * 32], sb[2 * 48];
  for (int i = 0; i < 2 * 32; i++) sa[i] = (float)exp2(4.0 * rng_uniform());
  for (int i = 0; i < 2 * 48; i++) sb[i] = (float)exp2(4.0 * rng_uniform());
  for (int bt = 1; bt <= 128; bt += 127) {
    float *C = rand_buf(M * N, 1.0), *C0 = copy_buf(C, M * N);
    double *ref = malloc(sizeof(double) * M * N);
    k_cpu_gemm_fp8_block(M, N, K, A, 1, sa, B, bt, sb, 1.0f, C);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = C0[i * N + j];
        for (int k = 0; k < K; k++)
          s += (double)k_cpu_fp8_decode(A[i * K + k], K_E4M3) * k_cpu_fp8_decode(B[j * K + k], K_E4M3) *
               sa[k_fp8_block_scale_at(M, K, 1, i, k)] * sb[k_fp8_block_scale_at(N, K, bt, j, k)];
        ref[i * N + j] = s;
      }
    EXPECT(rel_err(C, ref, M * N) < 1e-6, "fp8 block gemm (b tile %d): error %.3g", bt, rel_err(C, ref, M * N));
    free(C), free(C0), free(ref);
  }
  char msg[256];
  EXPECT(k_fp8_gemm_block_check(64, 64, 128, 128, 128, A, B, sa, msg, sizeof msg) && strstr(msg, "not both 128"),
         "fp8 block gemm 128x128 by 128x128 refused: %s", msg);
  free(x), free(out), free(out_t), free(si), free(si_t), free(A), free(B);
}

// ---------------------------------------------------------------------------------------------
// Determinism: the same bits for 1, 2 and 3 threads (3 gives uneven static splits).

static void test_determinism(void) {
  const int M = 300, N = 200, K = 600;
  float *A = rand_buf((int64_t)M * K, 1.0), *B = rand_buf((int64_t)K * N, 1.0);
  float *C[3];
  const int Bt = 2, T = 100, nh = 4, nkv = 2, hd = 32;  // T spans two query blocks
  const int64_t ld = attn_ld(nh, nkv, hd), nq = (int64_t)Bt * T * nh * hd, nx = (int64_t)Bt * T * ld;
  float *qkv = rand_buf(nx, 1.0), *dout = rand_buf(nq, 1.0);
  const float *q = qkv, *k = qkv + nh * hd, *v = k + nkv * hd;
  float *o[3], *lse[3], *dx_[3];
  const int rows = 1000, d = 100;
  float *x = rand_buf((int64_t)rows * d, 1.0), *w = rand_buf(d, 1.0), *y = malloc(sizeof(float) * rows * d);
  float *rstd = malloc(sizeof(float) * rows), *dx = calloc((size_t)rows * d, sizeof(float)), *dw[3], *dtab[3];
  int32_t *tok = malloc(sizeof(int32_t) * rows);
  for (int i = 0; i < rows; i++) tok[i] = i % 37;
  k_cpu_rmsnorm_fwd(x, w, y, rstd, rows, d, 1e-5f);
  for (int nt = 1; nt <= 3; nt++) {
    const int i = nt - 1;
    omp_set_num_threads(nt);
    C[i] = malloc(sizeof(float) * M * N);
    k_cpu_gemm(1, 0, M, N, K, 1.0f, A, M, B, N, 0.0f, C[i], N);
    o[i] = malloc(sizeof(float) * nq), lse[i] = malloc(sizeof(float) * Bt * nh * T);
    dx_[i] = calloc((size_t)nx, sizeof(float));
    k_cpu_attn_fwd(q, k, v, ld, o[i], lse[i], Bt, T, nh, nkv, hd);
    k_cpu_attn_bwd(dout, q, k, v, ld, o[i], lse[i], dx_[i], dx_[i] + nh * hd, dx_[i] + (nh + nkv) * hd, Bt, T, nh,
                   nkv, hd);
    dw[i] = calloc(d, sizeof(float)), dtab[i] = calloc(37 * d, sizeof(float));
    k_cpu_rmsnorm_bwd(x, x, w, rstd, dx, dw[i], rows, d);
    k_cpu_embed_bwd(tok, x, dtab[i], rows, d, 0, 37);
  }
  omp_set_num_threads(2);
  for (int i = 1; i < 3; i++) {
    EXPECT(memcmp(C[0], C[i], sizeof(float) * M * N) == 0, "gemm bits differ between 1 and %d threads", i + 1);
    EXPECT(memcmp(o[0], o[i], sizeof(float) * nq) == 0 && memcmp(lse[0], lse[i], sizeof(float) * Bt * nh * T) == 0,
           "attn fwd bits differ between 1 and %d threads", i + 1);
    EXPECT(memcmp(dx_[0], dx_[i], sizeof(float) * nx) == 0,
           "attn bwd bits differ between 1 and %d threads", i + 1);
    EXPECT(memcmp(dw[0], dw[i], sizeof(float) * d) == 0, "rmsnorm dw bits differ between 1 and %d threads", i + 1);
    EXPECT(memcmp(dtab[0], dtab[i], sizeof(float) * 37 * d) == 0, "embed dtable bits differ, 1 vs %d threads", i + 1);
  }
  // Run to run on the same thread count.
  float *C2 = malloc(sizeof(float) * M * N);
  k_cpu_gemm(1, 0, M, N, K, 1.0f, A, M, B, N, 0.0f, C2, N);
  EXPECT(memcmp(C[0], C2, sizeof(float) * M * N) == 0, "gemm bits differ run to run");
  free(C2);
  for (int i = 0; i < 3; i++) free(C[i]), free(o[i]), free(lse[i]), free(dx_[i]), free(dw[i]), free(dtab[i]);
  free(A), free(B), free(qkv), free(dout), free(x), free(w), free(y), free(rstd), free(dx), free(tok);
}

int main(void) {
  test_gemm_all();
  test_rmsnorm(5, 19);
  test_rmsnorm(3, 64);
  test_rope(2, 5, 3, 8, 7);
  test_rope(1, 4, 2, 6, 1000);
  test_attn(2, 7, 4, 2, 8, 1);    // GQA: two query heads per kv head
  test_attn(1, 5, 3, 3, 5, 1);    // nh == nkv, odd head dim
  test_attn(1, 1, 2, 1, 4, 1);    // a single position
  test_attn(1, 19, 4, 1, 17, 1);  // multi-query, longer than the lane width
  test_attn(1, 150, 4, 2, 8, 23);  // three query blocks (64, 64, 22): dk/dv summed across blocks
  test_swiglu(1, 37);
  test_swiglu(5, 13);
  test_swiglu_range();
  test_embed(23, 5, 20, 8, 6);  // slice [8, 14) of a vocabulary of 20
  test_embed(9, 33, 7, 0, 7);
  test_ce(6, 21, 9);
  test_ce(5, 3, 1);
  test_adamw();
  test_vector_ops();
  test_determinism();
  test_fp8_codes(K_E4M3);
  test_fp8_codes(K_E5M2);
  test_fp8_ops();
  test_fp8_block();
  return test_summary();
}
