// GPU test (label gpu) of the cuDNN attention path, kernels/cuda/attn_cudnn.cu: on random bf16
// inputs, o, lse, dq, dk, dv must match the CPU reference k_cpu_attn_fwd / k_cpu_attn_bwd (fp32
// on the same bf16-rounded values) within a normalised error of 2e-2, for grouped-query and
// plain heads, training-size and odd sequence lengths. A shape cuDNN refuses (-1) is reported
// as unsupported and counted, never as a pass; a shape that must be refused (head dim not a
// multiple of 8) must give -1. The deterministic backward must repeat bitwise. The large shapes
// compare a few (batch, kv head) slices only, since heads and batches are independent and the
// CPU reference on all of them would take minutes; they also print timings (numbers only).
// The test keeps its data in the (B, T, heads, hd) layout and converts at the calls: the op takes
// sequence-major q|k|v as column blocks of one fused (T*B, (nh + 2 nkv) hd) buffer (and writes
// dq|dk|dv the same way), o and dout (T, B, nh, hd).
// Without a visible GPU the test fails rather than pass vacuously.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/cpu/ops_cpu.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/unit/test_util.h"

enum { MAX_SLICE = 8 };
static const double TOL = 2e-2;
static int n_unsupported;
static k_cudnn_attn *A;  // the plans, handle and workspace every call of the test shares

// ---------------------------------------------------------------------------------------------
// bf16 on the host, random data

static uint16_t f2bf(float f) {  // round to nearest even; inputs here are finite
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double rng_uniform(void) {  // [-1, 1), fixed xorshift: every run sees the same data
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

// n random values of amplitude amp, rounded to bf16: bits in *bits, their float values returned.
static float *rand_bf16(int64_t n, double amp, uint16_t **bits) {
  float *x = malloc(sizeof(float) * (size_t)n);
  *bits = malloc(sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    (*bits)[i] = f2bf((float)(amp * rng_uniform()));
    x[i] = bf2f((*bits)[i]);
  }
  return x;
}

static void *dev_put(const void *h, size_t n_bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, n_bytes));
  CUDA_CHECK(cudaMemcpy(d, h, n_bytes, cudaMemcpyHostToDevice));
  return d;
}

static void *dev_new(size_t n_bytes) {
  void *d = NULL;
  CUDA_CHECK(cudaMalloc(&d, n_bytes));
  CUDA_CHECK(cudaMemset(d, 0xFF, n_bytes));  // NaN pattern: an element never written shows up
  return d;
}

static float *get_bf16(const void *d, int64_t n) {
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)n);
  float *f = malloc(sizeof(float) * (size_t)n);
  CUDA_CHECK(cudaMemcpy(b, d, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; i++) f[i] = bf2f(b[i]);
  free(b);
  return f;
}

static float *get_f32(const void *d, int64_t n) {
  float *f = malloc(sizeof(float) * (size_t)n);
  CUDA_CHECK(cudaMemcpy(f, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
  return f;
}

static int same_bytes(const void *a, const void *b, size_t n_bytes) {
  char *ha = malloc(n_bytes), *hb = malloc(n_bytes);
  CUDA_CHECK(cudaMemcpy(ha, a, n_bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hb, b, n_bytes, cudaMemcpyDeviceToHost));
  const int same = memcmp(ha, hb, n_bytes) == 0;
  free(ha);
  free(hb);
  return same;
}

// ||got - ref|| / max(||ref||, ERR_FLOOR * sqrt(n)), infinite if got has a non-finite value.
// The floor (an rms of 1e-3, against values of order 1 here) keeps gradients that are zero in
// exact arithmetic (T = 1: the softmax of a single score has no gradient) from failing on
// rounding noise of order 1e-7 on both sides.
static const double ERR_FLOOR = 1e-3;
static double norm_err(const float *got, const float *ref, int64_t n, double *max_abs) {
  double ss_err = 0.0, ss_ref = 0.0;
  *max_abs = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    const double e = (double)got[i] - ref[i];
    ss_err += e * e;
    ss_ref += (double)ref[i] * ref[i];
    if (fabs(e) > *max_abs) *max_abs = fabs(e);
  }
  const double floor_ss = ERR_FLOOR * ERR_FLOOR * (double)n;
  return sqrt(ss_err / (ss_ref > floor_ss ? ss_ref : floor_ss));
}

// ---------------------------------------------------------------------------------------------
// Slices: a subset of batches and kv heads (with all the query heads of each kv group) is an
// exact sub-problem, so the CPU reference runs on it alone.

typedef struct {
  int nb, nk;
  int b[MAX_SLICE], kh[MAX_SLICE];
} slice;

// Copies rows of x (B, T, heads, hd) for the slice's batches and heads [kh*per, kh*per + per)
// of each slice kv head into dst (nb, T, nk*per, hd).
static void slice_rows(const float *x, float *dst, const slice *s, int T, int heads, int per, int hd) {
  int64_t o = 0;
  for (int i = 0; i < s->nb; i++)
    for (int t = 0; t < T; t++)
      for (int j = 0; j < s->nk; j++)
        for (int g = 0; g < per; g++) {
          const int64_t src = (((int64_t)s->b[i] * T + t) * heads + s->kh[j] * per + g) * hd;
          memcpy(dst + o, x + src, sizeof(float) * (size_t)hd);
          o += hd;
        }
}

// The same for lse (B, heads, T).
static void slice_lse(const float *x, float *dst, const slice *s, int T, int heads, int per) {
  int64_t o = 0;
  for (int i = 0; i < s->nb; i++)
    for (int j = 0; j < s->nk; j++)
      for (int g = 0; g < per; g++) {
        memcpy(dst + o, x + ((int64_t)s->b[i] * heads + s->kh[j] * per + g) * T, sizeof(float) * (size_t)T);
        o += T;
      }
}

// ---------------------------------------------------------------------------------------------
// Layout changes: x (B, T, H, hd) <-> the heads at column col0 of rows (t, b) of ld elements,
// element size esz (bf16 bits or floats).

static void to_seq(const void *x, void *y, size_t esz, int B, int T, int H, int hd, int64_t ld, int64_t col0) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      memcpy((char *)y + (((int64_t)t * B + b) * ld + col0) * esz, (const char *)x + ((int64_t)b * T + t) * H * hd * esz,
             esz * (size_t)H * hd);
}

static void from_seq(const void *y, void *x, size_t esz, int B, int T, int H, int hd, int64_t ld, int64_t col0) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      memcpy((char *)x + ((int64_t)b * T + t) * H * hd * esz, (const char *)y + (((int64_t)t * B + b) * ld + col0) * esz,
             esz * (size_t)H * hd);
}

// The CPU reference on (B, T, H, hd) arrays.
static void ref_attn(const float *q, const float *k, const float *v, const float *dout, float *o, float *lse,
                     float *dq, float *dk, float *dv, int B, int T, int nh, int nkv, int hd) {
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, ko = (int64_t)nh * hd, vo = ko + (int64_t)nkv * hd;
  const int64_t nx = (int64_t)B * T * ld, nq = (int64_t)B * T * nh * hd;
  float *x = malloc(sizeof(float) * nx), *dx = malloc(sizeof(float) * nx), *so = malloc(sizeof(float) * nq),
        *sdo = malloc(sizeof(float) * nq);
  to_seq(q, x, 4, B, T, nh, hd, ld, 0);
  to_seq(k, x, 4, B, T, nkv, hd, ld, ko);
  to_seq(v, x, 4, B, T, nkv, hd, ld, vo);
  to_seq(dout, sdo, 4, B, T, nh, hd, ko, 0);
  k_cpu_attn_fwd(x, x + ko, x + vo, ld, so, lse, B, T, nh, nkv, hd);
  k_cpu_attn_bwd(sdo, x, x + ko, x + vo, ld, so, lse, dx, dx + ko, dx + vo, B, T, nh, nkv, hd);
  from_seq(so, o, 4, B, T, nh, hd, ko, 0);
  from_seq(dx, dq, 4, B, T, nh, hd, ld, 0);
  from_seq(dx, dk, 4, B, T, nkv, hd, ld, ko);
  from_seq(dx, dv, 4, B, T, nkv, hd, ld, vo);
  free(x), free(dx), free(so), free(sdo);
}

// ---------------------------------------------------------------------------------------------
// One shape

typedef struct {
  int B, T, nh, nkv, hd;
  int bench;   // print timings and also run the atomic backward
  slice sl;    // nb == 0: the whole problem
} shape;

static double time_ms(int fwd, int iters, void **p, int64_t ld, const shape *c) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int it = -2; it < iters; it++) {  // two warm-up calls
    if (it == 0) CUDA_CHECK(cudaEventRecord(e0, 0));
    if (fwd)
      k_cudnn_attn_fwd(A, p[0], p[1], p[2], ld, p[3], p[4], c->B, c->T, c->nh, c->nkv, c->hd, NULL);
    else
      k_cudnn_attn_bwd(A, p[5], p[0], p[1], p[2], ld, p[3], p[4], p[6], p[7], p[8], c->B, c->T, c->nh, c->nkv, c->hd,
                       NULL);
  }
  CUDA_CHECK(cudaEventRecord(e1, 0));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return ms / iters;
}

static void print_info(int dir, int64_t ld, const shape *c) {
  k_cudnn_attn_info inf;
  if (k_cudnn_attn_info_get(A, dir, c->B, c->T, c->nh, c->nkv, c->hd, ld, &inf) == 0)
    printf("    %s plan: engine %lld, workspace %.1f MiB%s%s\n", dir ? "bwd" : "fwd", (long long)inf.engine,
           inf.workspace / 1048576.0, dir ? (inf.deterministic ? ", deterministic" : ", nondeterministic") : "",
           inf.padded ? ", padding-mask workaround" : "");
}

static void check(const char *what, const shape *c, const float *got, const float *ref, int64_t n) {
  double max_abs = 0.0;
  const double err = norm_err(got, ref, n, &max_abs);
  printf("    %-3s err %.2e (max abs %.2e)\n", what, err, max_abs);
  EXPECT(err <= TOL, "%s B=%d T=%d nh=%d nkv=%d hd=%d: normalised error %.3e > %.0e", what, c->B, c->T, c->nh,
         c->nkv, c->hd, err, TOL);
}

static void run_shape(const shape *c) {
  const int B = c->B, T = c->T, nh = c->nh, nkv = c->nkv, hd = c->hd, grp = nh / nkv;
  const int64_t nq = (int64_t)B * T * nh * hd, nk = (int64_t)B * T * nkv * hd, nl = (int64_t)B * nh * T;
  printf("shape B=%d T=%d nh=%d nkv=%d hd=%d\n", B, T, nh, nkv, hd);
  uint16_t *bq, *bk, *bv, *bdo;
  float *q = rand_bf16(nq, 1.5, &bq), *k = rand_bf16(nk, 1.5, &bk), *v = rand_bf16(nk, 1.0, &bv);
  float *dout = rand_bf16(nq, 1.0, &bdo);
  // Sequence-major device buffers: q|k|v fused rows (and their gradients), dout (T, B, nh, hd).
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, ko = (int64_t)nh * hd, vo = ko + (int64_t)nkv * hd;
  const int64_t nx = (int64_t)B * T * ld;
  uint16_t *hx = malloc(2 * (size_t)nx), *hdo = malloc(2 * (size_t)nq);
  to_seq(bq, hx, 2, B, T, nh, hd, ld, 0);
  to_seq(bk, hx, 2, B, T, nkv, hd, ld, ko);
  to_seq(bv, hx, 2, B, T, nkv, hd, ld, vo);
  to_seq(bdo, hdo, 2, B, T, nh, hd, ko, 0);
  char *d_x = dev_put(hx, 2 * (size_t)nx), *g_x = dev_new(2 * (size_t)nx), *g_x2 = dev_new(2 * (size_t)nx);
  free(hx);
  void *dq_ = d_x, *dk_ = d_x + 2 * ko, *dv_ = d_x + 2 * vo;
  void *ddo = dev_put(hdo, 2 * (size_t)nq);
  free(hdo);
  void *d_o = dev_new(2 * (size_t)nq), *d_lse = dev_new(4 * (size_t)nl);
  void *g_dq = g_x, *g_dk = g_x + 2 * ko, *g_dv = g_x + 2 * vo;
  void *g_dq2 = g_x2, *g_dk2 = g_x2 + 2 * ko, *g_dv2 = g_x2 + 2 * vo;

  int rc = k_cudnn_attn_fwd(A, dq_, dk_, dv_, ld, d_o, d_lse, B, T, nh, nkv, hd, NULL);
  int rcb = rc == 0 ? k_cudnn_attn_bwd(A, ddo, dq_, dk_, dv_, ld, d_o, d_lse, g_dq, g_dk, g_dv, B, T, nh, nkv, hd, NULL)
                    : -1;
  CUDA_CHECK(cudaDeviceSynchronize());
  if (rc != 0 || rcb != 0) {
    n_unsupported++;
    printf("  UNSUPPORTED by cuDNN (%s returned -1): not counted as a pass\n", rc != 0 ? "forward" : "backward");
  } else {
    print_info(0, ld, c);
    print_info(1, ld, c);
    // Reference on the slice (or everything).
    const int whole = c->sl.nb == 0;
    const slice *s = &c->sl;
    const int sb = whole ? B : s->nb, sk = whole ? nkv : s->nk, snh = sk * grp;
    const int64_t sq = (int64_t)sb * T * snh * hd, skv = (int64_t)sb * T * sk * hd, sl = (int64_t)sb * snh * T;
    float *rq, *rk, *rv, *rdo;
    if (whole) {
      rq = q, rk = k, rv = v, rdo = dout;
    } else {
      rq = malloc(4 * sq), rk = malloc(4 * skv), rv = malloc(4 * skv), rdo = malloc(4 * sq);
      slice_rows(q, rq, s, T, nh, grp, hd);
      slice_rows(k, rk, s, T, nkv, 1, hd);
      slice_rows(v, rv, s, T, nkv, 1, hd);
      slice_rows(dout, rdo, s, T, nh, grp, hd);
    }
    float *ro = malloc(4 * sq), *rl = malloc(4 * sl), *rdq = malloc(4 * sq), *rdk = malloc(4 * skv),
          *rdv = malloc(4 * skv);
    ref_attn(rq, rk, rv, rdo, ro, rl, rdq, rdk, rdv, sb, T, snh, sk, hd);

    // GPU results, back in (B, T, heads, hd) and sliced the same way.
    float *go = malloc(4 * (size_t)nq), *gl = get_f32(d_lse, nl), *gdq = malloc(4 * (size_t)nq);
    float *gdk = malloc(4 * (size_t)nk), *gdv = malloc(4 * (size_t)nk);
    {
      float *so_ = get_bf16(d_o, nq), *sx = get_bf16(g_x, nx);
      from_seq(so_, go, 4, B, T, nh, hd, ko, 0);
      from_seq(sx, gdq, 4, B, T, nh, hd, ld, 0);
      from_seq(sx, gdk, 4, B, T, nkv, hd, ld, ko);
      from_seq(sx, gdv, 4, B, T, nkv, hd, ld, vo);
      free(so_), free(sx);
    }
    float *so = go, *sl_ = gl, *sdq = gdq, *sdk = gdk, *sdv = gdv;
    if (!whole) {
      so = malloc(4 * sq), sl_ = malloc(4 * sl), sdq = malloc(4 * sq), sdk = malloc(4 * skv), sdv = malloc(4 * skv);
      slice_rows(go, so, s, T, nh, grp, hd);
      slice_lse(gl, sl_, s, T, nh, grp);
      slice_rows(gdq, sdq, s, T, nh, grp, hd);
      slice_rows(gdk, sdk, s, T, nkv, 1, hd);
      slice_rows(gdv, sdv, s, T, nkv, 1, hd);
    }
    if (!whole) printf("    comparing %d batch(es) x %d kv head(s) against the CPU\n", sb, sk);
    check("o", c, so, ro, sq);
    check("lse", c, sl_, rl, sl);
    check("dq", c, sdq, rdq, sq);
    check("dk", c, sdk, rdk, skv);
    check("dv", c, sdv, rdv, skv);

    // The deterministic backward must repeat bitwise.
    k_cudnn_attn_info inf = {0, 0, 0, 0, 0};
    if (k_cudnn_attn_info_get(A, 1, B, T, nh, nkv, hd, ld, &inf) == 0 && inf.deterministic) {
      k_cudnn_attn_bwd(A, ddo, dq_, dk_, dv_, ld, d_o, d_lse, g_dq2, g_dk2, g_dv2, B, T, nh, nkv, hd, NULL);
      const int rep = same_bytes(g_x, g_x2, 2 * (size_t)nx);
      printf("    bwd repeat: %s\n", rep ? "bitwise identical" : "DIFFERS");
      EXPECT(rep, "deterministic backward B=%d T=%d nh=%d nkv=%d hd=%d differs between two runs", B, T, nh, nkv, hd);
      // In pieces (a workspace cap below the plan's: half the heads or sequences, then one kv
      // group of one sequence a call): the same bits.
      const size_t caps[2] = {(size_t)inf.workspace / 2, 1};
      for (int i = 0; i < 2; i++) {
        k_cudnn_attn_set_bwd_cap(A, caps[i]);
        CUDA_CHECK(cudaMemset(g_x2, 0, 2 * (size_t)nx));
        k_cudnn_attn_bwd(A, ddo, dq_, dk_, dv_, ld, d_o, d_lse, g_dq2, g_dk2, g_dv2, B, T, nh, nkv, hd, NULL);
        k_cudnn_attn_info pi = {0, 0, 0, 0, 0};
        k_cudnn_attn_info_get(A, 1, B, T, nh, nkv, hd, ld, &pi);
        const int same = same_bytes(g_x, g_x2, 2 * (size_t)nx);
        printf("    bwd in %d pieces (cap %zu bytes): %s\n", pi.pieces, caps[i], same ? "bitwise identical" : "DIFFERS");
        EXPECT(same && (pi.pieces > 1 || B * nh / (nh / nkv) == 1), "backward in %d pieces B=%d T=%d nh=%d nkv=%d "
               "hd=%d: %s", pi.pieces, B, T, nh, nkv, hd, same ? "not in pieces" : "differs from one call");
      }
      k_cudnn_attn_set_bwd_cap(A, 0);
    }

    if (c->bench) {
      void *p[9] = {dq_, dk_, dv_, d_o, d_lse, ddo, g_dq2, g_dk2, g_dv2};
      const double fl = 2.0 * B * nh * (double)T * T * hd;  // causal forward: half of 4 B nh T^2 hd
      const double tf = time_ms(1, 20, p, ld, c), tb = time_ms(0, 20, p, ld, c);
      printf("    time fwd %.3f ms %.1f TFLOP/s | bwd (%s) %.3f ms %.1f TFLOP/s\n", tf, fl / tf * 1e-9,
             inf.deterministic ? "deterministic" : "atomic", tb, 2.5 * fl / tb * 1e-9);
      // The atomic backward: checked against the same reference, then timed.
      k_cudnn_attn_set_deterministic(A, 0);
      if (k_cudnn_attn_bwd(A, ddo, dq_, dk_, dv_, ld, d_o, d_lse, g_dq2, g_dk2, g_dv2, B, T, nh, nkv, hd, NULL) == 0) {
        print_info(1, ld, c);
        float *adq = malloc(4 * (size_t)nq), *adk = malloc(4 * (size_t)nk), *adv = malloc(4 * (size_t)nk);
        float *ax = get_bf16(g_x2, nx);
        from_seq(ax, adq, 4, B, T, nh, hd, ld, 0);
        from_seq(ax, adk, 4, B, T, nkv, hd, ld, ko);
        from_seq(ax, adv, 4, B, T, nkv, hd, ld, vo);
        free(ax);
        if (!whole) {
          slice_rows(adq, sdq, s, T, nh, grp, hd);
          slice_rows(adk, sdk, s, T, nkv, 1, hd);
          slice_rows(adv, sdv, s, T, nkv, 1, hd);
        } else {
          memcpy(sdq, adq, 4 * sq), memcpy(sdk, adk, 4 * skv), memcpy(sdv, adv, 4 * skv);
        }
        check("dq", c, sdq, rdq, sq);
        check("dk", c, sdk, rdk, skv);
        check("dv", c, sdv, rdv, skv);
        free(adq), free(adk), free(adv);
        const double ta = time_ms(0, 20, p, ld, c);
        printf("    time bwd (atomic) %.3f ms %.1f TFLOP/s\n", ta, 2.5 * fl / ta * 1e-9);
      } else {
        printf("    atomic backward: UNSUPPORTED by cuDNN\n");
      }
      k_cudnn_attn_set_deterministic(A, 1);
    }
    if (!whole) {
      free(rq), free(rk), free(rv), free(rdo);
      free(so), free(sl_), free(sdq), free(sdk), free(sdv);
    }
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
    free(go), free(gl), free(gdq), free(gdk), free(gdv);
  }
  void *dev[] = {d_x, ddo, d_o, d_lse, g_x, g_x2};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_CHECK(cudaFree(dev[i]));
  free(q), free(k), free(v), free(dout), free(bq), free(bk), free(bv), free(bdo);
}

// A head dim that is not a multiple of 8 must be refused (-1), without aborting.
static void run_refused(void) {
  const int B = 1, T = 64, nh = 2, nkv = 2, hd = 36;
  const size_t n = (size_t)B * T * nh * hd;
  void *x = dev_new(2 * n), *o = dev_new(2 * n), *l = dev_new(4 * (size_t)B * nh * T), *g = dev_new(2 * n);
  const int64_t ld = (int64_t)nh * hd;  // one buffer for all: only the refusal matters here
  const int rf = k_cudnn_attn_fwd(A, x, x, x, ld, o, l, B, T, nh, nkv, hd, NULL);
  const int rb = k_cudnn_attn_bwd(A, x, x, x, x, ld, o, l, g, g, g, B, T, nh, nkv, hd, NULL);
  printf("shape B=%d T=%d nh=%d nkv=%d hd=%d (must be refused): fwd %d, bwd %d\n", B, T, nh, nkv, hd, rf, rb);
  EXPECT(rf == -1 && rb == -1, "hd=%d should be refused, got fwd %d bwd %d", hd, rf, rb);
  void *dev[] = {x, o, l, g};
  for (int i = 0; i < 4; i++) CUDA_CHECK(cudaFree(dev[i]));
}

// Optional argument: the index of one shape to run (for debugging with cuDNN's logs on).
int main(int argc, char **argv) {
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    fprintf(stderr, "test_cudnn_attn: no CUDA device visible; this gpu-labelled test needs a GPU\n");
    return 1;
  }
  struct cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("device 0: %s, cuDNN runtime %d\n", prop.name, k_cudnn_attn_version());
  A = k_cudnn_attn_create();
  const shape shapes[] = {
      {2, 1024, 16, 4, 64, 1, {0, 0, {0}, {0}}},
      {1, 4096, 32, 32, 128, 1, {1, 2, {0}, {0, 31}}},
      {4, 2048, 32, 8, 64, 1, {2, 2, {0, 3}, {1, 6}}},
      {2, 1, 4, 2, 64, 0, {0, 0, {0}, {0}}},
      {2, 65, 4, 2, 64, 0, {0, 0, {0}, {0}}},
      {1, 130, 8, 8, 128, 0, {0, 0, {0}, {0}}},
      {3, 200, 6, 1, 32, 0, {0, 0, {0}, {0}}},
      {2, 384, 8, 2, 128, 0, {0, 0, {0}, {0}}},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if (only < 0 || (size_t)only == i) run_shape(&shapes[i]);
  if (only < 0) run_refused();
  printf("unsupported shapes: %d\n", n_unsupported);
  k_cudnn_attn_free(&A);
  k_cudnn_attn_free(&A);  // safe twice
  EXPECT(A == NULL, "k_cudnn_attn_free clears the pointer");
  return test_summary();
}
