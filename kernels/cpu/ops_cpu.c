// CPU reference kernels other than GEMM (fp32, row-major, OpenMP): RMSNorm, rotary embedding,
// causal GQA attention, SwiGLU, vocab-parallel embedding and cross-entropy, AdamW and the small
// vector helpers. They define what the CUDA kernels are tested against, so they favour plain,
// exact loops; speed matters only where the default 2-core run spends its time (attention).
//
// Determinism: every output element is computed by one thread in a fixed order. Reductions over
// rows (dw of RMSNorm, dtable of the embedding) are parallelised over output columns, each
// thread walking all rows in order; k_cpu_sumsq uses fixed blocks summed in block order. Inner
// sums use a fixed lane layout (OPS_LANES partial sums, then a fixed tree), so vector width does
// not change the bits either.
#include "kernels/cpu/ops_cpu.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"

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

void k_cpu_rope(float *x, int B, int T, int H, int hd, int pos0, float theta, int inverse) {
  CHECK(hd % 2 == 0, "rope needs an even head dim, got hd=%d", hd);
  const int half = hd / 2;
#pragma omp parallel if ((int64_t)B * T * H * hd > OPS_PAR_MIN)
  {
    float *cs = XMALLOC(sizeof(float) * 2 * (size_t)half);  // (2, half): cos then sin of this position
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
      const int t = (int)(bt % T);
      const double pos = (double)pos0 + t;
      // Angles in double: positions reach thousands, where a float angle loses the low bits.
      for (int i = 0; i < half; i++) {
        const double ang = pos * pow((double)theta, -2.0 * i / hd);
        cs[i] = (float)cos(ang);
        cs[half + i] = inverse ? (float)-sin(ang) : (float)sin(ang);
      }
      for (int h = 0; h < H; h++) {
        float *xh = x + (bt * H + h) * hd;
        for (int i = 0; i < half; i++) {
          const float x0 = xh[i], x1 = xh[half + i], c = cs[i], s = cs[half + i];
          xh[i] = x0 * c - x1 * s;
          xh[half + i] = x0 * s + x1 * c;
        }
      }
    }
    free(cs);
  }
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

// Copy kv head kh of batch b out of x (B, T, nkv, hd) into dst (T, hd), contiguous.
static void attn_gather_kv(const float *x, float *dst, int b, int kh, int T, int nkv, int hd) {
  for (int j = 0; j < T; j++)
    memcpy(dst + (int64_t)j * hd, x + (((int64_t)b * T + j) * nkv + kh) * hd, sizeof(float) * hd);
}

// The same, transposed into dst (hd, T): GEMMs then read it as an untransposed B, in place.
static void attn_gather_kv_t(const float *x, float *dst, int b, int kh, int T, int nkv, int hd) {
  for (int j = 0; j < T; j++) {
    const float *src = x + (((int64_t)b * T + j) * nkv + kh) * hd;
    for (int c = 0; c < hd; c++) dst[(int64_t)c * T + j] = src[c];
  }
}

static void attn_scatter_kv(const float *src, float *x, int b, int kh, int T, int nkv, int hd) {
  for (int j = 0; j < T; j++)
    memcpy(x + (((int64_t)b * T + j) * nkv + kh) * hd, src + (int64_t)j * hd, sizeof(float) * hd);
}

void k_cpu_attn_fwd(const float *q, const float *k, const float *v, float *o, float *lse, int B, int T, int nh,
                    int nkv, int hd) {
  CHECK(nkv > 0 && nh % nkv == 0, "attention needs nh (%d) to be a multiple of nkv (%d)", nh, nkv);
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t ld = (int64_t)nh * hd;  // stride between positions in q and o
#pragma omp parallel
  {
    float *kt = XMALLOC(sizeof(float) * (size_t)T * hd);      // (hd, T)
    float *vv = XMALLOC(sizeof(float) * (size_t)T * hd);      // (T, hd)
    float *p = XMALLOC(sizeof(float) * (size_t)ATTN_QB * T);  // (QB, t1): scores, then probabilities
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * nh; bh++) {
      const int b = bh / nh, h = bh % nh;
      attn_gather_kv_t(k, kt, b, h / grp, T, nkv, hd);
      attn_gather_kv(v, vv, b, h / grp, T, nkv, hd);
      const float *qh = q + (int64_t)b * T * ld + (int64_t)h * hd;
      float *oh = o + (int64_t)b * T * ld + (int64_t)h * hd;
      float *lse_h = lse + ((int64_t)b * nh + h) * T;
      for (int t0 = 0; t0 < T; t0 += ATTN_QB) {
        const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T;
        attn_scores(qh, ld, kt, T, p, t0, t1, hd, scale);
        for (int t = t0; t < t1; t++) {
          float *pr = p + (int64_t)(t - t0) * t1;
          float m = -FLT_MAX, sum = 0.0f;
          for (int j = 0; j <= t; j++) m = pr[j] > m ? pr[j] : m;
          for (int j = 0; j <= t; j++) {
            pr[j] = expf(pr[j] - m);
            sum += pr[j];
          }
          const float inv = 1.0f / sum;
          for (int j = 0; j <= t; j++) pr[j] *= inv;
          for (int j = t + 1; j < t1; j++) pr[j] = 0.0f;  // causal mask
          lse_h[t] = m + logf(sum);
        }
        k_cpu_gemm(0, 0, t1 - t0, hd, t1, 1.0f, p, t1, vv, hd, 0.0f, oh + t0 * ld, (int)ld);
      }
    }
    free(kt);
    free(vv);
    free(p);
  }
}

// Backward runs per (batch, kv head) over the grp query heads that share it, in head order, so
// dk and dv of a kv head are summed by one thread in one fixed order.
void k_cpu_attn_bwd(const float *dout, const float *q, const float *k, const float *v, const float *o,
                    const float *lse, float *dq, float *dk, float *dv, int B, int T, int nh, int nkv, int hd) {
  CHECK(nkv > 0 && nh % nkv == 0, "attention needs nh (%d) to be a multiple of nkv (%d)", nh, nkv);
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
  const int64_t ld = (int64_t)nh * hd;
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
      attn_gather_kv(k, kk, b, kh, T, nkv, hd);
      attn_gather_kv_t(k, kt, b, kh, T, nkv, hd);
      attn_gather_kv_t(v, vt, b, kh, T, nkv, hd);
      memset(dkb, 0, sizeof(float) * th);
      memset(dvb, 0, sizeof(float) * th);
      for (int g = 0; g < grp; g++) {
        const int h = kh * grp + g;
        const int64_t off = (int64_t)b * T * ld + (int64_t)h * hd;
        const float *qh = q + off, *doh = dout + off, *oh = o + off;
        float *dqh = dq + off;
        const float *lse_h = lse + ((int64_t)b * nh + h) * T;
        for (int t0 = 0; t0 < T; t0 += ATTN_QB) {
          const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T, mq = t1 - t0;
          attn_scores(qh, ld, kt, T, p, t0, t1, hd, scale);
          k_cpu_gemm(0, 0, mq, t1, hd, 1.0f, doh + t0 * ld, (int)ld, vt, T, 0.0f, ds, t1);  // dP = dO V^T
          for (int t = t0; t < t1; t++) {
            float *pr = p + (int64_t)(t - t0) * t1, *dr = ds + (int64_t)(t - t0) * t1;
            const float lt = lse_h[t];
            const float delta = ops_dot(doh + t * ld, oh + t * ld, hd);  // sum_j p_j dP_j = dO . O
            for (int j = 0; j <= t; j++) {
              pr[j] = expf(pr[j] - lt);
              dr[j] = pr[j] * (dr[j] - delta);  // dS
            }
            for (int j = t + 1; j < t1; j++) pr[j] = dr[j] = 0.0f;  // causal mask
          }
          // dQ = scale dS K; dK[0:t1] += scale dS^T Q; dV[0:t1] += P^T dO.
          k_cpu_gemm(0, 0, mq, hd, t1, scale, ds, t1, kk, hd, 0.0f, dqh + t0 * ld, (int)ld);
          k_cpu_gemm(1, 0, t1, hd, mq, scale, ds, t1, qh + t0 * ld, (int)ld, 1.0f, dkb, hd);
          k_cpu_gemm(1, 0, t1, hd, mq, 1.0f, p, t1, doh + t0 * ld, (int)ld, 1.0f, dvb, hd);
        }
      }
      attn_scatter_kv(dkb, dk, b, kh, T, nkv, hd);
      attn_scatter_kv(dvb, dv, b, kh, T, nkv, hd);
    }
    free(buf);
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

void k_cpu_swiglu_fwd(const float *gate, const float *up, float *out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

void k_cpu_swiglu_bwd(const float *dout, const float *gate, const float *up, float *dgate, float *dup, int64_t n) {
  // d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g)))
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i], sig = 1.0f / (1.0f + expf(-g));
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] = dout[i] * g * sig;
  }
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding

void k_cpu_embed_fwd(const int32_t *tokens, const float *table, float *out, int64_t n, int d, int v0,
                     int n_vocab_local) {
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

void k_cpu_ce_local_stats(const float *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                          float *row_max, float *row_sumexp, float *target_logit) {
#pragma omp parallel for schedule(static) if (rows * n_vocab_local > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *lr = logits + r * n_vocab_local;
    float m = -FLT_MAX;
    for (int j = 0; j < n_vocab_local; j++) m = lr[j] > m ? lr[j] : m;
    double sum = 0.0;  // in double: a vocabulary slice can be tens of thousands of terms
    for (int j = 0; j < n_vocab_local; j++) sum += (double)expf(lr[j] - m);
    const int64_t tl = (int64_t)targets[r] - v0;
    row_max[r] = m;
    row_sumexp[r] = (float)sum;
    target_logit[r] = tl >= 0 && tl < n_vocab_local ? lr[tl] : 0.0f;
  }
}

void k_cpu_ce_bwd(float *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local,
                  int v0, float scale) {
#pragma omp parallel for schedule(static) if (rows * n_vocab_local > OPS_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    float *lr = logits + r * n_vocab_local;
    const float l = lse[r];
    const int64_t tl = (int64_t)targets[r] - v0;  // outside [0, n_vocab_local) when not local
    // p - 0 is exact, so the one-hot costs nothing off the target.
    for (int j = 0; j < n_vocab_local; j++) lr[j] = scale * (expf(lr[j] - l) - (j == tl ? 1.0f : 0.0f));
  }
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

void k_cpu_add(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
