// Forward and backward of one pipeline chunk for one micro-batch: embedding (first virtual
// stage), transformer blocks, final norm, LM head and vocab-parallel cross-entropy (last
// virtual stage). Tensor/sequence parallelism enters only through the tp_region pairs.
// Shapes: rs = rows of the residual stream on this rank, rows = T*B inside tp regions,
// qd = local heads * hd, kvd = local kv heads * hd, ffn and V local.
#include "kernels/check.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "parallel/tp.h"
#include <math.h>
#include <string.h>

// fp32 buffers are float *; act-dtype buffers (the backend's activation dtype) are void *.
struct model_work {
  tp_region region;
  void *block;                 // the single allocation the buffers below live in
  float *s1, *s2;              // (rs, d) fp32
  float *f1, *f2;              // (rows, d) fp32: what crosses tp collectives
  void *fa;                    // (rows, d) act: f1 cast for a GEMM
  void *q1, *q2, *q3;          // (rows, qd) act
  void *k1, *k2, *k3, *k4;     // (rows, kvd) act
  void *ff1, *ff2, *ff3;       // (rows, ffn) act
  float *ce_max, *ce_sum, *ce_tgt, *ce_gmax;  // (rows) backend memory
  float *h_max, *h_sum, *h_tgt, *h_gmax;      // (rows) host
};

struct model_acts {
  int chunk, nl;
  float *x;                    // (nl + 1, rs, d) fp32: input of each layer, then the chunk output
  float *rstd1, *rstd2;        // (nl, rs) fp32
  void *hf, *h2f;              // (nl, rows, d) act: normed inputs inside the tp region
  void *q, *att;               // (nl, B, T, nh, hd) act: roped queries, attention output
  void *k, *v;                 // (nl, B, T, nkv, hd) act: roped keys, values
  float *lse;                  // (nl, B, nh, T) fp32
  float *x2;                   // (nl, rs, d) fp32: residual after attention
  void *gate, *up, *act;       // (nl, rows, ffn) act
  float *rstd_f;               // (rs) fp32, last stage
  void *hfin;                  // (rows, d) act, last stage
  void *logits;                // (rows, V) act, last stage; gradient after backward
  float *lse_ce;               // (rows) fp32, last stage
  float *dx_in, *dx_out;       // (rs, d) fp32
  void *block;                 // the single allocation all of the above live in
};

typedef struct carve {
  char *base;
  size_t off;
  size_t act_bytes;  // element size of the activation dtype
} carve;

static void *take_bytes(carve *c, int64_t n_bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += ((size_t)n_bytes + 255) & ~(size_t)255;
  return p;
}
static float *take(carve *c, int64_t n_elem) { return take_bytes(c, n_elem * (int64_t)sizeof(float)); }
static void *take_act(carve *c, int64_t n_elem) { return take_bytes(c, n_elem * (int64_t)c->act_bytes); }

// Element i of an act-dtype array.
static inline void *at(const model *m, void *p, int64_t i) { return (char *)p + i * (int64_t)m->act_bytes; }

static void carve_work(const model *m, struct model_work *w, carve *c) {
  const model_dims *dm = &m->dims;
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  w->s1 = take(c, rs * d); w->s2 = take(c, rs * d);
  w->f1 = take(c, rows * d); w->f2 = take(c, rows * d);
  w->fa = take_act(c, rows * d);
  w->q1 = take_act(c, rows * qd); w->q2 = take_act(c, rows * qd); w->q3 = take_act(c, rows * qd);
  w->k1 = take_act(c, rows * kvd); w->k2 = take_act(c, rows * kvd);
  w->k3 = take_act(c, rows * kvd); w->k4 = take_act(c, rows * kvd);
  w->ff1 = take_act(c, rows * dm->ffn); w->ff2 = take_act(c, rows * dm->ffn); w->ff3 = take_act(c, rows * dm->ffn);
  w->ce_max = take(c, rows); w->ce_sum = take(c, rows); w->ce_tgt = take(c, rows); w->ce_gmax = take(c, rows);
}

void model_work_init(model *m) {
  struct model_work *w = XCALLOC(1, sizeof *w);
  carve c = {.act_bytes = m->act_bytes};
  carve_work(m, w, &c);
  c.base = w->block = m->be->alloc(m->be, c.off);
  c.off = 0;
  carve_work(m, w, &c);
  int64_t rows = m->dims.rows;
  w->h_max = XMALLOC(4 * (size_t)rows * sizeof(float));
  w->h_sum = w->h_max + rows;
  w->h_tgt = w->h_sum + rows;
  w->h_gmax = w->h_tgt + rows;
  w->region = (tp_region){m->g->tp_c, m->be, m->sp, m->dims.rows, m->dims.rows_s, NULL};
  m->work = w;
}

void model_set_timing(model *m, step_timing *t) { m->work->region.timing = t; }

void model_work_free(model *m) {
  if (!m->work) return;
  m->be->free(m->be, m->work->block);
  free(m->work->h_max);
  free(m->work);
  m->work = NULL;
}

static void carve_acts(const model_dims *dm, int has_head, model_acts *a, carve *c) {
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, nl = a->nl;
  int64_t qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  a->x = take(c, (nl + 1) * rs * d);
  a->rstd1 = take(c, nl * rs); a->rstd2 = take(c, nl * rs);
  a->hf = take_act(c, nl * rows * d); a->h2f = take_act(c, nl * rows * d);
  a->q = take_act(c, nl * rows * qd); a->att = take_act(c, nl * rows * qd);
  a->k = take_act(c, nl * rows * kvd); a->v = take_act(c, nl * rows * kvd);
  a->lse = take(c, nl * dm->B * dm->nh * dm->T);
  a->x2 = take(c, nl * rs * d);
  a->gate = take_act(c, nl * rows * dm->ffn); a->up = take_act(c, nl * rows * dm->ffn);
  a->act = take_act(c, nl * rows * dm->ffn);
  if (has_head) {
    a->rstd_f = take(c, rs);
    a->hfin = take_act(c, rows * d);
    a->logits = take_act(c, rows * dm->vocab);
    a->lse_ce = take(c, rows);
  }
  a->dx_in = take(c, rs * d);
  a->dx_out = take(c, rs * d);
}

int64_t model_acts_bytes(const model_dims *dm, int n_layers, int has_head, int act_bytes) {
  model_acts a = {.nl = n_layers};
  carve c = {.act_bytes = (size_t)act_bytes};
  carve_acts(dm, has_head, &a, &c);
  return (int64_t)c.off;
}

model_acts *model_acts_create(model *m, int chunk) {
  model_acts *a = XCALLOC(1, sizeof *a);
  a->chunk = chunk;
  a->nl = m->chunks[chunk].n_layers;
  int has_head = m->chunks[chunk].lm_head != NULL;
  carve c = {.act_bytes = m->act_bytes};
  carve_acts(&m->dims, has_head, a, &c);
  a->block = m->be->alloc(m->be, c.off);
  c.base = a->block;
  c.off = 0;
  carve_acts(&m->dims, has_head, a, &c);
  return a;
}

void model_acts_free(model *m, model_acts **a) {
  if (!a || !*a) return;
  m->be->free(m->be, (*a)->block);
  free(*a);
  *a = NULL;
}

float *model_acts_input(model_acts *a) { return a->x; }
float *model_acts_input_grad(model_acts *a) { return a->dx_in; }
float *model_acts_output_grad(model_acts *a) { return a->dx_out; }
static float *acts_output(const model *m, model_acts *a) { return a->x + (int64_t)a->nl * m->dims.rows_s * m->dims.d; }
float *model_acts_output(const model *m, model_acts *a) { return acts_output(m, a); }

// Layer i's slice of a micro-batch's saved activations (shapes as in model_acts).
typedef struct layer_acts {
  float *x, *x2, *lse;
  void *hf, *h2f, *q, *att, *k, *v, *gate, *up, *act;
} layer_acts;

static layer_acts layer_view(const model *m, model_acts *a, int i) {
  const model_dims *dm = &m->dims;
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, ffn = dm->ffn;
  int64_t qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  return (layer_acts){
      .x = a->x + i * rs * d, .x2 = a->x2 + i * rs * d, .lse = a->lse + (int64_t)i * dm->B * dm->nh * dm->T,
      .hf = at(m, a->hf, i * rows * d), .h2f = at(m, a->h2f, i * rows * d),
      .q = at(m, a->q, i * rows * qd), .att = at(m, a->att, i * rows * qd),
      .k = at(m, a->k, i * rows * kvd), .v = at(m, a->v, i * rows * kvd),
      .gate = at(m, a->gate, i * rows * ffn), .up = at(m, a->up, i * rows * ffn), .act = at(m, a->act, i * rows * ffn)};
}

static void layer_fwd(model *m, model_layer *ly, model_acts *a, int i) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const tp_region *R = &w->region;
  const model_dims *dm = &m->dims;
  const k_dtype A = be->act;
  int B = dm->B, T = dm->T, d = dm->d, hd = dm->hd, nh = dm->nh, nkv = dm->nkv, ffn = dm->ffn;
  int64_t rs = dm->rows_s, rows = dm->rows, qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
  float eps = m->cfg.norm_eps, theta = m->cfg.rope_theta;
  layer_acts L = layer_view(m, a, i);
  float *xin = L.x, *xout = xin + rs * d, *x2 = L.x2, *lse = L.lse;
  void *hf = L.hf, *h2f = L.h2f, *q = L.q, *att = L.att, *k = L.k, *v = L.v, *gate = L.gate, *up = L.up, *act = L.act;

  be->rmsnorm_fwd(xin, ly->attn_norm->p, w->s1, a->rstd1 + i * rs, rs, d, eps);
  tp_enter_fwd(R, w->s1, w->f1, d);
  be->cast(hf, A, w->f1, K_F32, rows * d);
  be->gemm(0, 1, rows, qd, d, 1, hf, d, ly->wq->pc, d, 0, w->q1, qd, A);
  be->gemm(0, 1, rows, kvd, d, 1, hf, d, ly->wk->pc, d, 0, w->k1, kvd, A);
  be->gemm(0, 1, rows, kvd, d, 1, hf, d, ly->wv->pc, d, 0, w->k2, kvd, A);
  be->transpose_tb(q, w->q1, T, B, qd);
  be->transpose_tb(k, w->k1, T, B, kvd);
  be->transpose_tb(v, w->k2, T, B, kvd);
  be->rope(q, B, T, nh, hd, 0, theta, 0);
  be->rope(k, B, T, nkv, hd, 0, theta, 0);
  be->attn_fwd(q, k, v, att, lse, B, T, nh, nkv, hd);
  be->transpose_tb(w->q1, att, B, T, qd);
  be->gemm(0, 1, rows, d, qd, 1, w->q1, qd, ly->wo->pc, qd, 0, w->f1, d, K_F32);
  tp_exit_fwd(R, w->f1, w->s2, d);
  be->copy(be, x2, xin, (size_t)(rs * d) * sizeof(float));
  be->add(x2, w->s2, rs * d);

  be->rmsnorm_fwd(x2, ly->mlp_norm->p, w->s1, a->rstd2 + i * rs, rs, d, eps);
  tp_enter_fwd(R, w->s1, w->f1, d);
  be->cast(h2f, A, w->f1, K_F32, rows * d);
  be->gemm(0, 1, rows, ffn, d, 1, h2f, d, ly->w_gate->pc, d, 0, gate, ffn, A);
  be->gemm(0, 1, rows, ffn, d, 1, h2f, d, ly->w_up->pc, d, 0, up, ffn, A);
  be->swiglu_fwd(gate, up, act, rows * ffn);
  be->gemm(0, 1, rows, d, ffn, 1, act, ffn, ly->w_down->pc, ffn, 0, w->f1, d, K_F32);
  tp_exit_fwd(R, w->f1, w->s2, d);
  be->copy(be, xout, x2, (size_t)(rs * d) * sizeof(float));
  be->add(xout, w->s2, rs * d);
}

// g: (rs, d) gradient of the layer output on entry, of the layer input on exit (in place).
static void layer_bwd(model *m, model_layer *ly, model_acts *a, int i, float *g) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const tp_region *R = &w->region;
  const model_dims *dm = &m->dims;
  const k_dtype A = be->act;
  int B = dm->B, T = dm->T, d = dm->d, hd = dm->hd, nh = dm->nh, nkv = dm->nkv, ffn = dm->ffn;
  int64_t rs = dm->rows_s, rows = dm->rows, qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd;
  float theta = m->cfg.rope_theta;
  layer_acts L = layer_view(m, a, i);
  float *xin = L.x, *x2 = L.x2, *lse = L.lse;
  void *hf = L.hf, *h2f = L.h2f, *q = L.q, *att = L.att, *k = L.k, *v = L.v, *gate = L.gate, *up = L.up, *act = L.act;

  // MLP: out = x2 + down(swiglu(gate(h2), up(h2))), h2 = norm(x2).
  tp_exit_bwd(R, g, w->f1, d);
  be->cast(w->fa, A, w->f1, K_F32, rows * d);
  be->gemm(0, 0, rows, ffn, d, 1, w->fa, d, ly->w_down->pc, ffn, 0, w->ff1, ffn, A);
  be->gemm(1, 0, d, ffn, rows, 1, w->fa, d, act, ffn, 1, ly->w_down->g, ffn, K_F32);
  be->swiglu_bwd(w->ff1, gate, up, w->ff2, w->ff3, rows * ffn);
  be->gemm(0, 0, rows, d, ffn, 1, w->ff2, ffn, ly->w_gate->pc, d, 0, w->f2, d, K_F32);
  be->gemm(0, 0, rows, d, ffn, 1, w->ff3, ffn, ly->w_up->pc, d, 1, w->f2, d, K_F32);
  be->gemm(1, 0, ffn, d, rows, 1, w->ff2, ffn, h2f, d, 1, ly->w_gate->g, d, K_F32);
  be->gemm(1, 0, ffn, d, rows, 1, w->ff3, ffn, h2f, d, 1, ly->w_up->g, d, K_F32);
  tp_enter_bwd(R, w->f2, w->s1, d);
  be->rmsnorm_bwd(w->s1, x2, ly->mlp_norm->p, a->rstd2 + i * rs, g, ly->mlp_norm->g, rs, d);

  // Attention: x2 = x + wo(attn(rope(q(h)), rope(k(h)), v(h))), h = norm(x).
  tp_exit_bwd(R, g, w->f1, d);
  be->cast(w->fa, A, w->f1, K_F32, rows * d);
  be->gemm(0, 0, rows, qd, d, 1, w->fa, d, ly->wo->pc, qd, 0, w->q1, qd, A);
  be->transpose_tb(w->q2, att, B, T, qd);
  be->gemm(1, 0, d, qd, rows, 1, w->fa, d, w->q2, qd, 1, ly->wo->g, qd, K_F32);
  be->transpose_tb(w->q3, w->q1, T, B, qd);
  be->attn_bwd(w->q3, q, k, v, att, lse, w->q1, w->k1, w->k2, B, T, nh, nkv, hd);
  be->rope(w->q1, B, T, nh, hd, 0, theta, 1);
  be->rope(w->k1, B, T, nkv, hd, 0, theta, 1);
  be->transpose_tb(w->q2, w->q1, B, T, qd);
  be->transpose_tb(w->k3, w->k1, B, T, kvd);
  be->transpose_tb(w->k4, w->k2, B, T, kvd);
  be->gemm(0, 0, rows, d, qd, 1, w->q2, qd, ly->wq->pc, d, 0, w->f2, d, K_F32);
  be->gemm(0, 0, rows, d, kvd, 1, w->k3, kvd, ly->wk->pc, d, 1, w->f2, d, K_F32);
  be->gemm(0, 0, rows, d, kvd, 1, w->k4, kvd, ly->wv->pc, d, 1, w->f2, d, K_F32);
  be->gemm(1, 0, qd, d, rows, 1, w->q2, qd, hf, d, 1, ly->wq->g, d, K_F32);
  be->gemm(1, 0, kvd, d, rows, 1, w->k3, kvd, hf, d, 1, ly->wk->g, d, K_F32);
  be->gemm(1, 0, kvd, d, rows, 1, w->k4, kvd, hf, d, 1, ly->wv->g, d, K_F32);
  tp_enter_bwd(R, w->f2, w->s1, d);
  be->rmsnorm_bwd(w->s1, xin, ly->attn_norm->p, a->rstd1 + i * rs, g, ly->attn_norm->g, rs, d);
}

// Vocab-parallel cross-entropy: combines each rank's row max, sum of exponentials and target
// logit over tp, stores the global log-sum-exp per row, returns the summed loss.
static double ce_fwd(model *m, model_acts *a, const int32_t *targets) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  int64_t rows = dm->rows;
  size_t n_bytes = (size_t)rows * sizeof(float);
  comm *tc = m->g->tp_c;
  be->ce_local_stats(a->logits, targets, rows, dm->vocab, dm->v0, w->ce_max, w->ce_sum, w->ce_tgt);
  be->copy(be, w->ce_gmax, w->ce_max, n_bytes);
  if (tc->size > 1) tc->ops->all_reduce(tc, w->ce_gmax, rows, COMM_F32, COMM_MAX);
  be->to_host(be, w->h_max, w->ce_max, n_bytes);
  be->to_host(be, w->h_gmax, w->ce_gmax, n_bytes);
  be->to_host(be, w->h_sum, w->ce_sum, n_bytes);
  for (int64_t r = 0; r < rows; r++) w->h_sum[r] *= expf(w->h_max[r] - w->h_gmax[r]);
  if (tc->size > 1) {
    be->from_host(be, w->ce_sum, w->h_sum, n_bytes);
    tc->ops->all_reduce(tc, w->ce_sum, rows, COMM_F32, COMM_SUM);
    tc->ops->all_reduce(tc, w->ce_tgt, rows, COMM_F32, COMM_SUM);
    be->to_host(be, w->h_sum, w->ce_sum, n_bytes);
  }
  be->to_host(be, w->h_tgt, w->ce_tgt, n_bytes);
  double loss = 0;
  for (int64_t r = 0; r < rows; r++) {
    w->h_max[r] = w->h_gmax[r] + logf(w->h_sum[r]);  // reuse as the lse
    loss += (double)w->h_max[r] - w->h_tgt[r];
  }
  be->from_host(be, a->lse_ce, w->h_max, n_bytes);
  return loss;
}

double model_chunk_fwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  model_chunk *ch = &m->chunks[chunk];
  int d = dm->d;
  if (ch->embed) {
    be->embed_fwd(tokens, ch->embed->p, w->f1, dm->rows, d, dm->v0, dm->vocab);
    tp_exit_fwd(&w->region, w->f1, a->x, d);
  }
  for (int i = 0; i < ch->n_layers; i++) layer_fwd(m, &ch->layers[i], a, i);
  if (!ch->lm_head) return 0;
  be->rmsnorm_fwd(acts_output(m, a), ch->final_norm->p, w->s1, a->rstd_f, dm->rows_s, d, m->cfg.norm_eps);
  tp_enter_fwd(&w->region, w->s1, w->f1, d);
  be->cast(a->hfin, be->act, w->f1, K_F32, dm->rows * d);
  be->gemm(0, 1, dm->rows, dm->vocab, d, 1, a->hfin, d, ch->lm_head->pc, d, 0, a->logits, dm->vocab, be->act);
  return ce_fwd(m, a, targets);
}

void model_chunk_bwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets,
                     float loss_scale) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  model_chunk *ch = &m->chunks[chunk];
  int d = dm->d;
  size_t n_bytes = (size_t)(dm->rows_s * d) * sizeof(float);
  float *g = a->dx_in;
  if (ch->lm_head) {
    be->ce_bwd(a->logits, targets, a->lse_ce, dm->rows, dm->vocab, dm->v0, loss_scale);
    be->gemm(0, 0, dm->rows, d, dm->vocab, 1, a->logits, dm->vocab, ch->lm_head->pc, d, 0, w->f1, d, K_F32);
    be->gemm(1, 0, dm->vocab, d, dm->rows, 1, a->logits, dm->vocab, a->hfin, d, 1, ch->lm_head->g, d, K_F32);
    tp_enter_bwd(&w->region, w->f1, w->s1, d);
    be->zero(be, g, n_bytes);
    be->rmsnorm_bwd(w->s1, acts_output(m, a), ch->final_norm->p, a->rstd_f, g, ch->final_norm->g, dm->rows_s, d);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, MODEL_GRADS_HEAD);
  } else {
    be->copy(be, g, a->dx_out, n_bytes);
  }
  for (int i = ch->n_layers - 1; i >= 0; i--) {
    layer_bwd(m, &ch->layers[i], a, i, g);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, i);
  }
  if (ch->embed) {
    tp_exit_bwd(&w->region, g, w->f1, d);
    be->embed_bwd(tokens, w->f1, ch->embed->g, dm->rows, d, dm->v0, dm->vocab);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, MODEL_GRADS_EMBED);
  }
}
