// CPU reference kernels other than GEMM (fp32, row-major, OpenMP): RMSNorm, rotary embedding,
// causal GQA attention, SwiGLU, vocab-parallel embedding and cross-entropy, AdamW and the small
// vector helpers. They define what the CUDA kernels are tested against, so they stay plain
// loops, except where the default 2-core run spends its time: attention is built on k_cpu_gemm,
// and softmax, SwiGLU and cross-entropy use a vectorisable exp (ops_expf).
//
// Determinism: every output element is computed by one thread in a fixed order. Reductions over
// rows (dw of RMSNorm, dtable of the embedding) are parallelised over output columns, each
// thread walking all rows in order; k_cpu_sumsq uses fixed blocks summed in block order. Inner
// sums use a fixed lane layout (OPS_LANES partial sums, then a fixed tree), so vector width does
// not change the bits either. (Across machines, the AVX2/AVX-512 builds of the GEMM and of the
// exp loops use FMA and the baseline build does not, so those differ in the last bits.)
#include "kernels/cpu/ops_cpu.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/bf16.h"

enum { OPS_LANES = 16 };

// Elementwise loops shorter than this run on one thread: waking the team costs more.
#define OPS_PAR_MIN ((int64_t)1 << 15)

// Sum of a[i]*b[i] in OPS_LANES partial sums combined by a fixed tree: vectorises without
// -ffast-math and gives the same bits for any vector width.
static inline float ops_dot(const float *restrict a, const float *restrict b, int n) {
  float s[OPS_LANES] = {0};
  int i = 0;
  for (; i + OPS_LANES <= n; i += OPS_LANES)
    for (int l = 0; l < OPS_LANES; l++) s[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; l++) s[l] += a[i + l] * b[i + l];
  for (int w = OPS_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) s[l] += s[l + w];
  return s[0];
}

// exp(x) for fp32, within 1 ulp of the correctly rounded value (checked over [-104, 89]), with
// exp(-inf) = 0, exp(+inf) = inf, NaN in NaN out. libm's expf is a call per element; this one is
// straight-line code that GCC vectorises inside the loops below, which is where softmax, SwiGLU
// and cross-entropy spend their time. Cody-Waite reduction x = n ln2 + r, the Cephes degree-6
// polynomial for exp(r), and 2^n applied as two factors so that results which underflow or
// overflow round to 0 or inf as they should.
static inline float ops_expf(float x) {
  // Clamp to [-104, 89] (beyond, the result is 0 or inf anyway) on the bits, with integer
  // min/select: float selects would keep GCC from vectorising (they may trap). NaN keeps its
  // bits and comes out NaN.
  uint32_t ix;
  memcpy(&ix, &x, sizeof ix);
  const uint32_t sign = ix & 0x80000000u, ax = ix & 0x7FFFFFFFu;
  uint32_t lim = sign ? 0x42D00000u : 0x42B20000u;  // 104.0f : 89.0f
  lim = ax > 0x7F800000u ? ax : lim;
  const uint32_t cx = (ax < lim ? ax : lim) | sign;
  float xc;
  memcpy(&xc, &cx, sizeof xc);
  // Adding 1.5 * 2^23 rounds x / ln2 to an integer n and leaves n in the low mantissa bits.
  const float shifter = 12582912.0f;
  const float t = xc * 1.44269504088896341f + shifter;
  uint32_t it;
  memcpy(&it, &t, sizeof it);
  const int32_t n = (int32_t)(it - 0x4B400000u), n1 = n / 2, n2 = n - n1;
  const float nf = t - shifter;
  float r = xc - nf * 0.693359375f;  // ln2 split in two: the first product is exact
  r = r - nf * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  return y * s1 * s2;
}

// The loops that call ops_expf are built for AVX-512, AVX2 and baseline x86-64 (one binary,
// chosen at load time). As in the GEMM, the FMA builds round differently from the baseline
// build; each is deterministic, and the lane layout makes AVX-512 and AVX2 agree.
#define OPS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// x[j] = exp(x[j] - sub) for j < n; returns their sum (fixed lanes, fixed tree).
static inline float ops_exp_sum(float *x, int n, float sub) {
  float s[OPS_LANES] = {0};
  int j = 0;
  for (; j + OPS_LANES <= n; j += OPS_LANES)
    for (int l = 0; l < OPS_LANES; l++) {
      const float e = ops_expf(x[j + l] - sub);
      x[j + l] = e;
      s[l] += e;
    }
  for (int l = 0; j + l < n; l++) {
    const float e = ops_expf(x[j + l] - sub);
    x[j + l] = e;
    s[l] += e;
  }
  for (int w = OPS_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) s[l] += s[l + w];
  return s[0];
}

static inline float ops_max(const float *x, int n) {
  float m[OPS_LANES];
  for (int l = 0; l < OPS_LANES; l++) m[l] = -INFINITY;
  int j = 0;
  for (; j + OPS_LANES <= n; j += OPS_LANES)
    for (int l = 0; l < OPS_LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (int l = 0; j + l < n; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (int w = OPS_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) m[l] = m[l + w] > m[l] ? m[l + w] : m[l];
  return m[0];
}

// ---------------------------------------------------------------------------------------------
// Linear layer into the residual stream

void k_cpu_linear_residual(int M, int N, int K, const float *A, const float *W, const float *C, float *D) {
  if (D != C && M > 0 && N > 0) memcpy(D, C, sizeof(float) * (size_t)M * N);
  k_cpu_gemm(0, 1, M, N, K, 1.0f, A, K, W, K, 1.0f, D, N);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

void k_cpu_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t rows, int d, float eps) {
#pragma omp parallel for schedule(static) if (rows * d > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    const float rs = 1.0f / sqrtf(ops_dot(xr, xr, d) / (float)d + eps);
    rstd[r] = rs;
    for (int j = 0; j < d; j++) yr[j] = xr[j] * rs * w[j];
  }
}

void k_cpu_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                       int64_t rows, int d) {
  // dx_k = rstd * w_k * dy_k - x_k * rstd^3 / d * sum_j dy_j w_j x_j  (rows are independent)
#pragma omp parallel for schedule(static) if (rows * d > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *dyr = dy + r * d, *xr = x + r * d;
    float *dxr = dx + r * d;
    const float rs = rstd[r];
    float s[OPS_LANES] = {0};
    int j = 0;
    for (; j + OPS_LANES <= d; j += OPS_LANES)
      for (int l = 0; l < OPS_LANES; l++) s[l] += dyr[j + l] * w[j + l] * xr[j + l];
    for (int l = 0; j + l < d; l++) s[l] += dyr[j + l] * w[j + l] * xr[j + l];
    for (int wd = OPS_LANES / 2; wd > 0; wd /= 2)
      for (int l = 0; l < wd; l++) s[l] += s[l + wd];
    const float c = s[0] * rs * rs * rs / (float)d;
    for (int k = 0; k < d; k++) dxr[k] += rs * w[k] * dyr[k] - xr[k] * c;
  }
  // dw_j += sum_r dy_rj x_rj rstd_r: a sum over rows, so split the columns instead; each column
  // is summed by one thread in row order, whatever the thread count.
  enum { CB = 16 };
  const int n_cb = (d + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (rows * d > OPS_PAR_MIN)
  for (int cb = 0; cb < n_cb; cb++) {
    const int j0 = cb * CB, j1 = j0 + CB < d ? j0 + CB : d;
    float acc[CB] = {0};
    for (int64_t r = 0; r < rows; r++) {
      const float rs = rstd[r];
      const float *dyr = dy + r * d, *xr = x + r * d;
      for (int j = j0; j < j1; j++) acc[j - j0] += dyr[j] * xr[j] * rs;
    }
    for (int j = j0; j < j1; j++) dw[j] += acc[j - j0];
  }
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding

void k_cpu_rope(float *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse) {
  CHECK(hd % 2 == 0, "rope needs an even head dim, got hd=%d", hd);
  CHECK(ld >= (int64_t)H * hd, "rope: row stride %lld < H*hd = %d", (long long)ld, H * hd);
  const int half = hd / 2;
  // cos and sin of each position's angles, (T, 2, half): shared by every batch row and head.
  float *cs = XMALLOC(sizeof(float) * (size_t)T * hd);
  double *inv_freq = XMALLOC(sizeof(double) * (size_t)half);
  for (int i = 0; i < half; i++) inv_freq[i] = pow((double)theta, -2.0 * i / hd);
  const int par = (int64_t)B * T * H * hd > OPS_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
  for (int t = 0; t < T; t++) {
    // Angles in double: positions reach thousands, where a float angle loses the low bits.
    const double pos = (double)pos0 + t;
    float *ct = cs + (int64_t)t * hd;
    for (int i = 0; i < half; i++) {
      const double ang = pos * inv_freq[i];
      ct[i] = (float)cos(ang);
      ct[half + i] = inverse ? (float)-sin(ang) : (float)sin(ang);
    }
  }
  // Rows are sequence-major: row r = t * B + b holds position pos0 + t.
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < (int64_t)T * B; r++) {
    const float *ct = cs + (r / B) * hd;
    for (int h = 0; h < H; h++) {
      float *xh = x + r * ld + (int64_t)h * hd;
      for (int i = 0; i < half; i++) {
        const float x0 = xh[i], x1 = xh[half + i], c = ct[i], s = ct[half + i];
        xh[i] = x0 * c - x1 * s;
        xh[half + i] = x0 * s + x1 * c;
      }
    }
  }
  free(cs);
  free(inv_freq);
}

// ---------------------------------------------------------------------------------------------
// Causal attention with grouped-query heads.
//
// Query rows are taken in blocks of ATTN_QB; a block [t0, t1) sees keys [0, t1). The scores,
// O = P V and the backward products are k_cpu_gemm calls on those blocks, one thread per task
// (a task is one (batch, head) forward, one (batch, kv head) backward), so attention runs at
// GEMM speed and every element keeps the GEMM's fixed summation order. The causal mask wastes
// only the upper half of each diagonal block. Softmax is two-pass per row (max, then exp and
// sum); lse = max + log(sum) is saved, and backward rebuilds p = exp(s - lse) from the very same
// score GEMM, so its probabilities are the forward's to rounding.

enum { ATTN_QB = 64 };

// Scaled scores of query rows [t0, t1) of one head against keys [0, t1): s (t1 - t0, t1).
// qh: this head's rows at stride ld; kt: (hd, T) keys of its kv head, transposed. Forward and
// backward both call this, which is what makes the recomputed scores bitwise the forward's.
static void attn_scores(const float *qh, int64_t ld, const float *kt, int T, float *s, int t0, int t1, int hd,
                        float scale) {
  k_cpu_gemm(0, 0, t1 - t0, t1, hd, scale, qh + t0 * ld, (int)ld, kt, T, 0.0f, s, t1);
}

// Copy kv head kh of batch b out of x (rows (t, b) at stride ld) into dst (T, hd), contiguous.
static void attn_gather_kv(const float *x, float *dst, int b, int kh, int B, int T, int64_t ld, int hd) {
  for (int j = 0; j < T; j++)
    memcpy(dst + (int64_t)j * hd, x + ((int64_t)j * B + b) * ld + (int64_t)kh * hd, sizeof(float) * hd);
}

// The same, transposed into dst (hd, T): GEMMs then read it as an untransposed B, in place.
static void attn_gather_kv_t(const float *x, float *dst, int b, int kh, int B, int T, int64_t ld, int hd) {
  for (int j = 0; j < T; j++) {
    const float *src = x + ((int64_t)j * B + b) * ld + (int64_t)kh * hd;
    for (int c = 0; c < hd; c++) dst[(int64_t)c * T + j] = src[c];
  }
}

static void attn_scatter_kv(const float *src, float *x, int b, int kh, int B, int T, int64_t ld, int hd) {
  for (int j = 0; j < T; j++)
    memcpy(x + ((int64_t)j * B + b) * ld + (int64_t)kh * hd, src + (int64_t)j * hd, sizeof(float) * hd);
}

// Causal softmax in place on the scores p (t1 - t0, t1) of query rows [t0, t1); lse_h[t] saved.
OPS_CLONES static void attn_softmax_rows(float *p, float *lse_h, int t0, int t1) {
  for (int t = t0; t < t1; t++) {
    float *pr = p + (int64_t)(t - t0) * t1;
    const float m = ops_max(pr, t + 1);
    const float sum = ops_exp_sum(pr, t + 1, m);
    const float inv = 1.0f / sum;
    for (int j = 0; j <= t; j++) pr[j] *= inv;
    for (int j = t + 1; j < t1; j++) pr[j] = 0.0f;  // causal mask
    lse_h[t] = m + logf(sum);
  }
}

// From the scores p and dP = dO V^T in ds, both (t1 - t0, t1): p becomes exp(s - lse) and ds
// becomes dS = p * (dP - dO.O), masked. doh, oh: this head's rows at stride ld (positions).
OPS_CLONES static void attn_dsoftmax_rows(float *p, float *ds, const float *lse_h, const float *doh, const float *oh,
                                          int64_t ld, int t0, int t1, int hd) {
  for (int t = t0; t < t1; t++) {
    float *pr = p + (int64_t)(t - t0) * t1, *dr = ds + (int64_t)(t - t0) * t1;
    const float lt = lse_h[t];
    const float delta = ops_dot(doh + t * ld, oh + t * ld, hd);  // sum_j p_j dP_j = dO . O
    for (int j = 0; j <= t; j++) {
      pr[j] = ops_expf(pr[j] - lt);
      dr[j] = pr[j] * (dr[j] - delta);
    }
    for (int j = t + 1; j < t1; j++) pr[j] = dr[j] = 0.0f;  // causal mask
  }
}

void k_cpu_attn_fwd(const float *q, const float *k, const float *v, int64_t ld, float *o, float *lse, int B, int T,
                    int nh, int nkv, int hd) {
  CHECK(nkv > 0 && nh % nkv == 0, "attention needs nh (%d) to be a multiple of nkv (%d)", nh, nkv);
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  // Strides between positions: of q (rows of ld) and of o (rows of nh * hd), both sequence-major.
  const int64_t lq = (int64_t)B * ld, lo = (int64_t)B * nh * hd;
#pragma omp parallel
  {
    float *kt = XMALLOC(sizeof(float) * (size_t)T * hd);      // (hd, T)
    float *vv = XMALLOC(sizeof(float) * (size_t)T * hd);      // (T, hd)
    float *p = XMALLOC(sizeof(float) * (size_t)ATTN_QB * T);  // (QB, t1): scores, then probabilities
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * nh; bh++) {
      const int b = bh / nh, h = bh % nh;
      attn_gather_kv_t(k, kt, b, h / grp, B, T, ld, hd);
      attn_gather_kv(v, vv, b, h / grp, B, T, ld, hd);
      const float *qh = q + (int64_t)b * ld + (int64_t)h * hd;
      float *oh = o + ((int64_t)b * nh + h) * hd;
      float *lse_h = lse + ((int64_t)b * nh + h) * T;
      for (int t0 = 0; t0 < T; t0 += ATTN_QB) {
        const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T;
        attn_scores(qh, lq, kt, T, p, t0, t1, hd, scale);
        attn_softmax_rows(p, lse_h, t0, t1);
        k_cpu_gemm(0, 0, t1 - t0, hd, t1, 1.0f, p, t1, vv, hd, 0.0f, oh + t0 * lo, (int)lo);
      }
    }
    free(kt);
    free(vv);
    free(p);
  }
}

// Backward runs per (batch, kv head) over the grp query heads that share it, in head order, so
// dk and dv of a kv head are summed by one thread in one fixed order.
void k_cpu_attn_bwd(const float *dout, const float *q, const float *k, const float *v, int64_t ld, const float *o,
                    const float *lse, float *dq, float *dk, float *dv, int B, int T, int nh, int nkv, int hd) {
  CHECK(nkv > 0 && nh % nkv == 0, "attention needs nh (%d) to be a multiple of nkv (%d)", nh, nkv);
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t lq = (int64_t)B * ld, lo = (int64_t)B * nh * hd;
#pragma omp parallel
  {
    const size_t th = (size_t)T * hd, qt = (size_t)ATTN_QB * T;
    float *buf = XMALLOC(sizeof(float) * (5 * th + 2 * qt));
    float *kk = buf, *dkb = kk + th, *dvb = dkb + th;  // (T, hd) each
    float *kt = dvb + th, *vt = kt + th;               // (hd, T) each
    float *p = vt + th, *ds = p + qt;                  // (QB, t1) each
#pragma omp for schedule(static)
    for (int bk = 0; bk < B * nkv; bk++) {
      const int b = bk / nkv, kh = bk % nkv;
      attn_gather_kv(k, kk, b, kh, B, T, ld, hd);
      attn_gather_kv_t(k, kt, b, kh, B, T, ld, hd);
      attn_gather_kv_t(v, vt, b, kh, B, T, ld, hd);
      memset(dkb, 0, sizeof(float) * th);
      memset(dvb, 0, sizeof(float) * th);
      for (int g = 0; g < grp; g++) {
        const int h = kh * grp + g;
        const int64_t qoff = (int64_t)b * ld + (int64_t)h * hd, ooff = ((int64_t)b * nh + h) * hd;
        const float *qh = q + qoff, *doh = dout + ooff, *oh = o + ooff;
        float *dqh = dq + qoff;
        const float *lse_h = lse + ((int64_t)b * nh + h) * T;
        for (int t0 = 0; t0 < T; t0 += ATTN_QB) {
          const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T, mq = t1 - t0;
          attn_scores(qh, lq, kt, T, p, t0, t1, hd, scale);
          k_cpu_gemm(0, 0, mq, t1, hd, 1.0f, doh + t0 * lo, (int)lo, vt, T, 0.0f, ds, t1);  // dP = dO V^T
          attn_dsoftmax_rows(p, ds, lse_h, doh, oh, lo, t0, t1, hd);
          // dQ = scale dS K; dK[0:t1] += scale dS^T Q; dV[0:t1] += P^T dO.
          k_cpu_gemm(0, 0, mq, hd, t1, scale, ds, t1, kk, hd, 0.0f, dqh + t0 * lq, (int)lq);
          k_cpu_gemm(1, 0, t1, hd, mq, scale, ds, t1, qh + t0 * lq, (int)lq, 1.0f, dkb, hd);
          k_cpu_gemm(1, 0, t1, hd, mq, 1.0f, p, t1, doh + t0 * lo, (int)lo, 1.0f, dvb, hd);
        }
      }
      attn_scatter_kv(dkb, dk, b, kh, B, T, ld, hd);
      attn_scatter_kv(dvb, dv, b, kh, B, T, ld, hd);
    }
    free(buf);
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

// Elementwise ops run on fixed spans of OPS_SPAN elements, one cloned call per span.
enum { OPS_SPAN = 4096 };

OPS_CLONES static void swiglu_fwd_span(const float *gate, const float *up, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    out[i] = g / (1.0f + ops_expf(-g)) * up[i];
  }
}

// d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g)))
OPS_CLONES static void swiglu_bwd_span(const float *dout, const float *gate, const float *up, float *dgate, float *dup,
                                       int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i], sig = 1.0f / (1.0f + ops_expf(-g));
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dout[i] * g * sig;
  }
}

void k_cpu_swiglu_fwd(const float *gu, float *out, int64_t rows, int n) {
#pragma omp parallel for schedule(static) if (rows * n > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *g = gu + r * 2 * n;
    for (int64_t i = 0; i < n; i += OPS_SPAN)
      swiglu_fwd_span(g + i, g + n + i, out + r * n + i, n - i < OPS_SPAN ? n - i : OPS_SPAN);
  }
}

void k_cpu_swiglu_bwd(const float *dout, const float *gu, float *dgu, int64_t rows, int n) {
#pragma omp parallel for schedule(static) if (rows * n > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *g = gu + r * 2 * n;
    float *dg = dgu + r * 2 * n;
    for (int64_t i = 0; i < n; i += OPS_SPAN)
      swiglu_bwd_span(dout + r * n + i, g + i, g + n + i, dg + i, dg + n + i, n - i < OPS_SPAN ? n - i : OPS_SPAN);
  }
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding

void k_cpu_embed_fwd(const int32_t *tokens, const void *table_f32, float *out, int64_t n, int d, int v0,
                     int n_vocab_local) {
  const float *table = table_f32;
#pragma omp parallel for schedule(static) if (n * d > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const int64_t row = (int64_t)tokens[i] - v0;
    if (row >= 0 && row < n_vocab_local)
      memcpy(out + i * d, table + row * d, sizeof(float) * d);
    else
      memset(out + i * d, 0, sizeof(float) * d);
  }
}

void k_cpu_embed_bwd(const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                     int n_vocab_local) {
  // Repeated tokens add into the same row, so split the columns: each thread walks all tokens
  // in order for its columns, and every element is summed in token order.
  enum { CB = 16 };
  const int n_cb = (d + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (n * d > OPS_PAR_MIN)
  for (int cb = 0; cb < n_cb; cb++) {
    const int j0 = cb * CB, j1 = j0 + CB < d ? j0 + CB : d;
    for (int64_t i = 0; i < n; i++) {
      const int64_t row = (int64_t)tokens[i] - v0;
      if (row < 0 || row >= n_vocab_local) continue;
      for (int j = j0; j < j1; j++) dtable[row * d + j] += dout[i * d + j];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel cross-entropy

// One row: max, sum of exp(l - max) (fixed lanes) and the target's logit if it is local.
OPS_CLONES static void ce_stats_row(const float *lr, int n, int64_t tl, float *row_max, float *row_sumexp,
                                    float *target_logit) {
  const float m = ops_max(lr, n);
  float s[OPS_LANES] = {0};
  int j = 0;
  for (; j + OPS_LANES <= n; j += OPS_LANES)
    for (int l = 0; l < OPS_LANES; l++) s[l] += ops_expf(lr[j + l] - m);
  for (int l = 0; j + l < n; l++) s[l] += ops_expf(lr[j + l] - m);
  for (int w = OPS_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) s[l] += s[l + w];
  *row_max = m;
  *row_sumexp = s[0];
  *target_logit = tl >= 0 && tl < n ? lr[tl] : 0.0f;
}

void k_cpu_ce_local_stats(const float *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                          float *row_max, float *row_sumexp, float *target_logit) {
#pragma omp parallel for schedule(static) if (rows * n_vocab_local > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    ce_stats_row(logits + r * n_vocab_local, n_vocab_local, (int64_t)targets[r] - v0, row_max + r, row_sumexp + r,
                 target_logit + r);
}

// One row in place: scale * (exp(l - lse) - onehot); tl outside [0, n) when the target is not
// local. p - 0 is exact, so the one-hot changes nothing off the target.
OPS_CLONES static void ce_bwd_row(float *lr, int n, int64_t tl, float lse, float scale) {
  for (int j = 0; j < n; j++) lr[j] = scale * (ops_expf(lr[j] - lse) - (j == tl ? 1.0f : 0.0f));
}

void k_cpu_ce_bwd(float *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local,
                  int v0, float scale) {
#pragma omp parallel for schedule(static) if (rows * n_vocab_local > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++)
    ce_bwd_row(logits + r * n_vocab_local, n_vocab_local, (int64_t)targets[r] - v0, lse[r], scale);
}

void k_cpu_ce_rescale(float *row_sumexp, const float *row_max, const float *gmax, int64_t rows) {
  for (int64_t r = 0; r < rows; r++) row_sumexp[r] *= expf(row_max[r] - gmax[r]);
}

void k_cpu_ce_loss(const float *gmax, const float *sumexp, const float *target_logit, float *lse, int64_t rows,
                   double *loss) {
  double s = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    lse[r] = gmax[r] + logf(sumexp[r]);
    s += (double)lse[r] - target_logit[r];
  }
  *loss = s;
}

// ---------------------------------------------------------------------------------------------
// AdamW and vector helpers

void k_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                 float eps, float weight_decay, float bc1, float bc2) {
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + weight_decay * p[i]);
  }
}

double k_cpu_sumsq(const float *x, int64_t n) {
  // Fixed blocks of SUMSQ_BLOCK elements, each summed in OPS_LANES double lanes combined by a
  // fixed tree, then the block sums added in block order: the same bits for any thread count.
  enum { SUMSQ_BLOCK = 8192, SUMSQ_STACK = 64 };
  const int64_t n_blk = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
  double stack_part[SUMSQ_STACK];
  double *part = n_blk <= SUMSQ_STACK ? stack_part : XMALLOC(sizeof(double) * (size_t)n_blk);
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t b = 0; b < n_blk; b++) {
    const float *xb = x + b * SUMSQ_BLOCK;
    const int64_t len = n - b * SUMSQ_BLOCK < SUMSQ_BLOCK ? n - b * SUMSQ_BLOCK : SUMSQ_BLOCK;
    double s[OPS_LANES] = {0};
    int64_t i = 0;
    for (; i + OPS_LANES <= len; i += OPS_LANES)
      for (int l = 0; l < OPS_LANES; l++) s[l] += (double)xb[i + l] * xb[i + l];
    for (int l = 0; i + l < len; l++) s[l] += (double)xb[i + l] * xb[i + l];
    for (int w = OPS_LANES / 2; w > 0; w /= 2)
      for (int l = 0; l < w; l++) s[l] += s[l + w];
    part[b] = s[0];
  }
  double total = 0.0;
  for (int64_t b = 0; b < n_blk; b++) total += part[b];
  if (part != stack_part) free(part);
  return total;
}

void k_cpu_scale(float *x, int64_t n, float s) {
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void k_cpu_add(float *y, const void *x, k_dtype x_type, int64_t n) {
  CHECK(x_type == K_F32 || x_type == K_BF16, "add: x of dtype %d (fp32 or bf16)", (int)x_type);
  if (x_type == K_F32) {
    const float *xf = x;
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += xf[i];
    return;
  }
  const uint16_t *xh = x;
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] += k_bf16_to_f32(xh[i]);
}
