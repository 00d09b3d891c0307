// Decoding with a KV cache through a backend (model/decode.h): the checkpoint's fp32 weights in
// one allocation of the backend's memory, one row per token through the blocks, and the sampler.
#include "model/decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"

enum { DECODE_PER_LAYER = 9 };

static int head_dim(const model_config *c) { return c->dim / c->n_heads; }
static int64_t q_dim(const model_config *c) { return (int64_t)c->n_heads * head_dim(c); }
static int64_t kv_dim(const model_config *c) { return (int64_t)c->n_kv_heads * head_dim(c); }

// Fills t with one whole tensor `<name>` of the given shape (1 or 2 dims), read into the host
// buffer at *cur; *dst gets the same offset in the backend's copy (base + offset).
static void add_tensor(decode_tensor *t, float **cur, float *host, float *dev, float **dst, const char *name, int64_t rows,
                       int64_t cols) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols ? cols : 1;
  t->host = *cur;
  *dst = dev + (*cur - host);
  *cur += rows * (cols ? cols : 1);
}

// Lays out the tensor list over host (read there) and the pointers of m into m->weights; returns
// the tensor count.
static int build_list(decode_model *m, float *host, decode_tensor *list) {
  const model_config *c = &m->cfg;
  int64_t d = c->dim, qd = q_dim(c), kvd = kv_dim(c), F = c->ffn_dim;
  float *cur = host, *dev = m->weights;
  int n = 0;
  char name[96];
  add_tensor(&list[n++], &cur, host, dev, &m->embed, "embed", c->vocab_size, d);
  for (int l = 0; l < c->n_layers; l++) {
    decode_layer *L = &m->layers[l];
    struct { const char *key; float **dst; int64_t rows, cols; } spec[DECODE_PER_LAYER] = {
        {"attn_norm", &L->attn_norm, d, 0}, {"wq", &L->wq, qd, d},         {"wk", &L->wk, kvd, d},
        {"wv", &L->wv, kvd, d},             {"wo", &L->wo, d, qd},         {"mlp_norm", &L->mlp_norm, d, 0},
        {"w_gate", &L->w_gate, F, d},       {"w_up", &L->w_up, F, d},      {"w_down", &L->w_down, d, F}};
    for (int i = 0; i < DECODE_PER_LAYER; i++) {
      snprintf(name, sizeof name, "layers.%d.%s", l, spec[i].key);
      add_tensor(&list[n++], &cur, host, dev, spec[i].dst, name, spec[i].rows, spec[i].cols);
    }
  }
  add_tensor(&list[n++], &cur, host, dev, &m->final_norm, "final_norm", d, 0);
  if (c->tie_embeddings)
    m->lm_head = m->embed;
  else
    add_tensor(&list[n++], &cur, host, dev, &m->lm_head, "lm_head", c->vocab_size, d);
  return n;
}

static int64_t weight_elems(const model_config *c) {
  int64_t d = c->dim, qd = q_dim(c), kvd = kv_dim(c), F = c->ffn_dim;
  int64_t per_layer = 2 * d + qd * d + 2 * kvd * d + d * qd + 3 * F * d;
  return (int64_t)c->vocab_size * d * (c->tie_embeddings ? 1 : 2) + d + c->n_layers * per_layer;
}

// Carves the row's tensors out of one backend allocation.
static void alloc_row(decode_model *m) {
  const model_config *c = &m->cfg;
  int64_t d = c->dim, qd = q_dim(c), F = c->ffn_dim, n_qkv = qd + 2 * kv_dim(c);
  int64_t sizes[] = {d, d, n_qkv, qd, 2 * F, F, 1, c->vocab_size}, total = 0;
  float **dst[] = {&m->x, &m->h, &m->qkv, &m->att, &m->gu, &m->act, &m->rstd, &m->logits_dev};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
  m->row = m->be->alloc(m->be, (size_t)total * sizeof(float));
  float *cur = m->row;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) *dst[i] = cur, cur += sizes[i];
}

int decode_init(decode_model *m, k_backend *be, const model_config *mc, decode_read_fn read, void *read_ctx, char *err,
                size_t n_err) {
  memset(m, 0, sizeof *m);
  CHECK(be->act == K_F32, "decoding needs a backend with fp32 activations (%s has dtype %d)", be->name, (int)be->act);
  m->cfg = *mc;
  m->be = be;
  const model_config *c = &m->cfg;
  size_t w_bytes = (size_t)weight_elems(c) * sizeof(float);
  size_t cache_bytes = (size_t)c->n_layers * c->seq_len * kv_dim(c) * sizeof(float);
  float *host = XMALLOC(w_bytes);
  m->weights = be->alloc(be, w_bytes);
  m->layers = XCALLOC((size_t)c->n_layers, sizeof(decode_layer));
  decode_tensor *list = XCALLOC((size_t)(c->n_layers * DECODE_PER_LAYER + 3), sizeof(decode_tensor));
  int n = build_list(m, host, list);
  int rc = read(read_ctx, list, n, err, n_err);
  free(list);
  if (rc == 0) be->from_host(be, m->weights, host, w_bytes);
  be->sync(be);  // the host copy is freed next
  free(host);
  if (rc != 0) return decode_free(m), -1;
  m->k_cache = be->alloc(be, cache_bytes);
  m->v_cache = be->alloc(be, cache_bytes);
  alloc_row(m);
  m->logits = XMALLOC((size_t)c->vocab_size * sizeof(float));
  return 0;
}

void decode_free(decode_model *m) {
  float **bufs[] = {&m->weights, &m->k_cache, &m->v_cache, &m->row};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    if (*bufs[i]) m->be->free(m->be, *bufs[i]);
    *bufs[i] = NULL;
  }
  free(m->logits);
  free(m->layers);
  m->logits = NULL;
  m->layers = NULL;
  m->n_pos = 0;
}

void decode_reset(decode_model *m) { m->n_pos = 0; }

// y (n) = x (k) @ W (n, k)^T: a linear layer on one row, in fp32.
static void linear_row(k_backend *b, const float *x, const float *W, float *y, int n, int k) {
  b->gemm(b, 0, 1, 1, n, k, 1.0f, x, k, W, k, 0.0f, y, n, K_F32);
}

// x += attn(attn_norm(x)) at position pos; the row's roped key and its value join the cache.
static void attention_block(decode_model *m, const decode_layer *L, int layer, int pos) {
  const model_config *c = &m->cfg;
  k_backend *b = m->be;
  int d = c->dim, hd = head_dim(c), qd = (int)q_dim(c), kvd = (int)kv_dim(c), n_qkv = qd + 2 * kvd;
  float *kc = m->k_cache + (int64_t)layer * c->seq_len * kvd, *vc = m->v_cache + (int64_t)layer * c->seq_len * kvd;
  b->rmsnorm_fwd_act(b, m->x, L->attn_norm, m->h, m->rstd, 1, d, c->norm_eps);
  linear_row(b, m->h, L->wq, m->qkv, n_qkv, d);  // wq | wk | wv, adjacent
  b->rope(b, m->qkv, 1, 1, c->n_heads + c->n_kv_heads, hd, n_qkv, pos, c->rope_theta, 0);  // q and k heads
  b->copy(b, kc + (int64_t)pos * kvd, m->qkv + qd, (size_t)kvd * sizeof(float));
  b->copy(b, vc + (int64_t)pos * kvd, m->qkv + qd + kvd, (size_t)kvd * sizeof(float));
  b->attn_decode(b, m->qkv, kc, vc, kvd, m->att, pos + 1, c->n_heads, c->n_kv_heads, hd);
  b->linear_residual(b, 1, d, qd, m->att, L->wo, m->x, m->x);
}

// x += w_down (silu(w_gate h) * (w_up h)), h = mlp_norm(x).
static void mlp_block(decode_model *m, const decode_layer *L) {
  const model_config *c = &m->cfg;
  k_backend *b = m->be;
  int d = c->dim, F = c->ffn_dim;
  b->rmsnorm_fwd_act(b, m->x, L->mlp_norm, m->h, m->rstd, 1, d, c->norm_eps);
  linear_row(b, m->h, L->w_gate, m->gu, 2 * F, d);  // w_gate | w_up, adjacent
  b->swiglu_fwd(b, m->gu, m->act, 1, F);
  b->linear_residual(b, 1, d, F, m->act, L->w_down, m->x, m->x);
}

const float *decode_step(decode_model *m, int32_t token) {
  const model_config *c = &m->cfg;
  k_backend *b = m->be;
  int pos = m->n_pos, d = c->dim;
  CHECK(pos < c->seq_len && token >= 0 && token < c->vocab_size, "position %d (seq_len %d), token %d (vocab %d)", pos,
        c->seq_len, (int)token, c->vocab_size);
  b->copy(b, m->x, m->embed + (int64_t)token * d, (size_t)d * sizeof(float));
  for (int l = 0; l < c->n_layers; l++) {
    attention_block(m, &m->layers[l], l, pos);
    mlp_block(m, &m->layers[l]);
  }
  b->rmsnorm_fwd_act(b, m->x, m->final_norm, m->h, m->rstd, 1, d, c->norm_eps);
  linear_row(b, m->h, m->lm_head, m->logits_dev, c->vocab_size, d);
  b->to_host(b, m->logits, m->logits_dev, (size_t)c->vocab_size * sizeof(float));
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
