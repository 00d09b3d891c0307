// Decoding on the CPU with a KV cache (model/decode.h): the checkpoint's fp32 weights in one
// allocation, one row per token through the blocks, and the sampler.
#include "model/decode.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/ops_cpu.h"
#include "model/ckpt.h"

enum { DECODE_PER_LAYER = 9 };

static int head_dim(const model_config *c) { return c->dim / c->n_heads; }

// Fills t with one whole tensor `model/<name>` of the given shape (1 or 2 dims), data at *cur.
static void add_tensor(ckpt_tensor *t, float **cur, float **dst, const char *name, int64_t rows, int64_t cols) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "model/%s", name);
  t->ndim = cols ? 2 : 1;
  t->full[0] = t->count[0] = rows;
  if (cols) t->full[1] = t->count[1] = cols;
  t->data = *dst = *cur;
  *cur += rows * (cols ? cols : 1);
}

// Lays out the tensor list and the pointers of m into m->weights; returns the tensor count.
static int build_list(decode_model *m, ckpt_tensor *list) {
  const model_config *c = &m->cfg;
  int64_t d = c->dim, hd = head_dim(c), qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, F = c->ffn_dim;
  float *cur = m->weights;
  int n = 0;
  char name[96];
  add_tensor(&list[n++], &cur, &m->embed, "embed", c->vocab_size, d);
  for (int l = 0; l < c->n_layers; l++) {
    decode_layer *L = &m->layers[l];
    struct { const char *key; float **dst; int64_t rows, cols; } spec[DECODE_PER_LAYER] = {
        {"attn_norm", &L->attn_norm, d, 0}, {"wq", &L->wq, qd, d},         {"wk", &L->wk, kvd, d},
        {"wv", &L->wv, kvd, d},             {"wo", &L->wo, d, qd},         {"mlp_norm", &L->mlp_norm, d, 0},
        {"w_gate", &L->w_gate, F, d},       {"w_up", &L->w_up, F, d},      {"w_down", &L->w_down, d, F}};
    for (int i = 0; i < DECODE_PER_LAYER; i++) {
      snprintf(name, sizeof name, "layers.%d.%s", l, spec[i].key);
      add_tensor(&list[n++], &cur, spec[i].dst, name, spec[i].rows, spec[i].cols);
    }
  }
  add_tensor(&list[n++], &cur, &m->final_norm, "final_norm", d, 0);
  if (c->tie_embeddings)
    m->lm_head = m->embed;
  else
    add_tensor(&list[n++], &cur, &m->lm_head, "lm_head", c->vocab_size, d);
  return n;
}

static int64_t weight_elems(const model_config *c) {
  int64_t d = c->dim, hd = head_dim(c), qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, F = c->ffn_dim;
  int64_t per_layer = 2 * d + qd * d + 2 * kvd * d + d * qd + 3 * F * d;
  return (int64_t)c->vocab_size * d * (c->tie_embeddings ? 1 : 2) + d + c->n_layers * per_layer;
}

int decode_init(decode_model *m, const model_config *mc, const char *path, char *err, size_t n_err) {
  memset(m, 0, sizeof *m);
  m->cfg = *mc;
  const model_config *c = &m->cfg;
  int64_t hd = head_dim(c), kvd = c->n_kv_heads * hd, cache = (int64_t)c->n_layers * c->seq_len * kvd;
  m->weights = XMALLOC((size_t)weight_elems(c) * sizeof(float));
  m->layers = XCALLOC((size_t)c->n_layers, sizeof(decode_layer));
  ckpt_tensor *list = XCALLOC((size_t)(c->n_layers * DECODE_PER_LAYER + 3), sizeof(ckpt_tensor));
  int n = build_list(m, list);
  int rc = ckpt_load(path, MPI_COMM_SELF, list, n, NULL, err, n_err);
  free(list);
  if (rc != 0) return decode_free(m), -1;
  m->k_cache = XMALLOC((size_t)cache * sizeof(float));
  m->v_cache = XMALLOC((size_t)cache * sizeof(float));
  m->x = XMALLOC((size_t)c->dim * sizeof(float));
  m->h = XMALLOC((size_t)c->dim * sizeof(float));
  m->q = XMALLOC((size_t)(c->n_heads * hd) * sizeof(float));
  m->att = XMALLOC((size_t)(c->n_heads * hd) * sizeof(float));
  m->scores = XMALLOC((size_t)c->seq_len * sizeof(float));
  m->gu = XMALLOC((size_t)(2 * c->ffn_dim) * sizeof(float));
  m->act = XMALLOC((size_t)c->ffn_dim * sizeof(float));
  m->logits = XMALLOC((size_t)c->vocab_size * sizeof(float));
  return 0;
}

void decode_free(decode_model *m) {
  float **bufs[] = {&m->weights, &m->k_cache, &m->v_cache, &m->x,   &m->h,   &m->q,
                    &m->att,     &m->scores,  &m->gu,      &m->act, &m->logits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    free(*bufs[i]);
    *bufs[i] = NULL;
  }
  free(m->layers);
  m->layers = NULL;
  m->n_pos = 0;
}

void decode_reset(decode_model *m) { m->n_pos = 0; }

// y (n) = x (k) @ W (n, k)^T: a linear layer on one row.
static void linear_row(const float *x, const float *W, float *y, int n, int k) {
  k_cpu_gemm(0, 1, 1, n, k, 1.0f, x, k, W, k, 0.0f, y, n);
}

// One query row (all heads, at position pos) over keys and values 0..pos of one layer's cache.
static void attend_row(decode_model *m, const float *kc, const float *vc, int pos) {
  const model_config *c = &m->cfg;
  int hd = head_dim(c), kvd = c->n_kv_heads * hd, group = c->n_heads / c->n_kv_heads;
  float scale = 1.0f / sqrtf((float)hd);
  for (int h = 0; h < c->n_heads; h++) {
    const float *q = m->q + (int64_t)h * hd;
    int64_t off = (int64_t)(h / group) * hd;
    float mx = -INFINITY;
    for (int t = 0; t <= pos; t++) {
      const float *k = kc + (int64_t)t * kvd + off;
      float s = 0.0f;
      for (int i = 0; i < hd; i++) s += q[i] * k[i];
      m->scores[t] = s * scale;
      if (m->scores[t] > mx) mx = m->scores[t];
    }
    double sum = 0.0;
    for (int t = 0; t <= pos; t++) sum += m->scores[t] = expf(m->scores[t] - mx);
    float *o = m->att + (int64_t)h * hd;
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int t = 0; t <= pos; t++) {
      float p = (float)(m->scores[t] / sum);
      const float *v = vc + (int64_t)t * kvd + off;
      for (int i = 0; i < hd; i++) o[i] += p * v[i];
    }
  }
}

// x += attn(attn_norm(x)) at position pos; the row's roped key and its value join the cache.
static void attention_block(decode_model *m, const decode_layer *L, int layer, int pos) {
  const model_config *c = &m->cfg;
  int d = c->dim, hd = head_dim(c), qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
  float rstd;
  float *kc = m->k_cache + (int64_t)layer * c->seq_len * kvd, *vc = m->v_cache + (int64_t)layer * c->seq_len * kvd;
  float *k = kc + (int64_t)pos * kvd, *v = vc + (int64_t)pos * kvd;
  k_cpu_rmsnorm_fwd(m->x, L->attn_norm, m->h, &rstd, 1, d, c->norm_eps);
  linear_row(m->h, L->wq, m->q, qd, d);
  linear_row(m->h, L->wk, k, kvd, d);
  linear_row(m->h, L->wv, v, kvd, d);
  k_cpu_rope(m->q, 1, 1, c->n_heads, hd, qd, pos, c->rope_theta, 0);
  k_cpu_rope(k, 1, 1, c->n_kv_heads, hd, kvd, pos, c->rope_theta, 0);
  attend_row(m, kc, vc, pos);
  k_cpu_linear_residual(1, d, qd, m->att, L->wo, m->x, m->x);
}

// x += w_down (silu(w_gate h) * (w_up h)), h = mlp_norm(x).
static void mlp_block(decode_model *m, const decode_layer *L) {
  const model_config *c = &m->cfg;
  int d = c->dim, F = c->ffn_dim;
  float rstd;
  k_cpu_rmsnorm_fwd(m->x, L->mlp_norm, m->h, &rstd, 1, d, c->norm_eps);
  linear_row(m->h, L->w_gate, m->gu, F, d);
  linear_row(m->h, L->w_up, m->gu + F, F, d);
  k_cpu_swiglu_fwd(m->gu, m->act, 1, F);
  k_cpu_linear_residual(1, d, F, m->act, L->w_down, m->x, m->x);
}

const float *decode_step(decode_model *m, int32_t token) {
  const model_config *c = &m->cfg;
  int pos = m->n_pos, d = c->dim;
  CHECK(pos < c->seq_len && token >= 0 && token < c->vocab_size, "position %d (seq_len %d), token %d (vocab %d)", pos,
        c->seq_len, (int)token, c->vocab_size);
  memcpy(m->x, m->embed + (int64_t)token * d, (size_t)d * sizeof(float));
  for (int l = 0; l < c->n_layers; l++) {
    attention_block(m, &m->layers[l], l, pos);
    mlp_block(m, &m->layers[l]);
  }
  float rstd;
  k_cpu_rmsnorm_fwd(m->x, m->final_norm, m->h, &rstd, 1, d, c->norm_eps);
  linear_row(m->h, m->lm_head, m->logits, c->vocab_size, d);
  m->n_pos = pos + 1;
  return m->logits;
}

uint64_t decode_rng_next(decode_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double decode_rng_uniform(decode_rng *r) { return (double)(decode_rng_next(r) >> 11) * 0x1.0p-53; }

typedef struct decode_cand {
  double p;
  int32_t id;
} decode_cand;

// Most likely first; equal probabilities by id, so the order never depends on qsort.
static int cand_cmp(const void *a, const void *b) {
  const decode_cand *x = a, *y = b;
  if (x->p != y->p) return x->p > y->p ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t argmax(const float *logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int32_t decode_sample(const float *logits, int n, float temperature, float top_p, decode_rng *r) {
  if (temperature <= 0.0f) return argmax(logits, n);
  decode_cand *c = XMALLOC((size_t)n * sizeof(decode_cand));
  float mx = logits[argmax(logits, n)];
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += c[i].p = exp(((double)logits[i] - mx) / temperature), c[i].id = i;
  qsort(c, (size_t)n, sizeof *c, cand_cmp);
  int keep = 0;
  double mass = 0.0;
  while (keep < n && (keep == 0 || mass < top_p * sum)) mass += c[keep++].p;
  double u = decode_rng_uniform(r) * mass, acc = 0.0;
  int32_t tok = c[keep - 1].id;
  for (int i = 0; i < keep; i++)
    if ((acc += c[i].p) > u) {
      tok = c[i].id;
      break;
    }
  free(c);
  return tok;
}
