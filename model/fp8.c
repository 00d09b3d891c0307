// FP8 projections (see fp8.h): scaling state, weight copies, and the three GEMM roles.
#include "model/fp8.h"
#include "kernels/base/check.h"
#include "kernels/cpu/fp8_cpu.h"  // the block tiles and scale layouts
#include <math.h>
#include <stdio.h>
#include <string.h>

// Largest input (K) and output (N) width of the four projections (and the head's), on this rank.
static void fp8_widths(const model *m, int *k_max, int *n_max) {
  const model_dims *dm = &m->dims;
  int qd = dm->nh * dm->hd, qkvd = qd + 2 * dm->nkv * dm->hd, d = dm->d, ffn = dm->ffn;
  int k[] = {d, qd, d, ffn}, n[] = {qkvd, d, 2 * ffn, d};
  *k_max = *n_max = 0;
  for (int p = 0; p < FP8_N_PROJ; p++) {
    if (k[p] > *k_max) *k_max = k[p];
    if (n[p] > *n_max) *n_max = n[p];
  }
  if (m->fp8->head_w && dm->vocab > *n_max) *n_max = dm->vocab;
}

// Projection p of a layer: its (fused) weight's first tensor, N and K.
static const model_tensor *fp8_weight(const model *m, const model_layer *ly, int p, int *n, int *k) {
  const model_dims *dm = &m->dims;
  int qd = dm->nh * dm->hd, qkvd = qd + 2 * dm->nkv * dm->hd;
  const model_tensor *w[] = {ly->wq, ly->wo, ly->w_gate, ly->w_down};
  int ns[] = {qkvd, dm->d, 2 * dm->ffn, dm->d}, ks[] = {dm->d, qd, dm->d, dm->ffn};
  *n = ns[p];
  *k = ks[p];
  return w[p];
}

// The FP8 weights of this rank in f->weights: every projection of the layers in FP8, then the
// head's (fp8.head).
static void fp8_list_weights(model *m) {
  model_fp8 *f = m->fp8;
  f->weights = XCALLOC((size_t)f->n_w, sizeof(model_fp8_weight));
  for (int ci = 0; ci < m->vpp; ci++)
    for (int i = 0; i < m->chunks[ci].n_layers; i++) {
      const model_layer *ly = &m->chunks[ci].layers[i];
      if (!model_fp8_layer_on(m, ly->wq->layer)) continue;
      for (int p = 0; p < FP8_N_PROJ; p++) {
        int n, k;
        const model_tensor *t = fp8_weight(m, ly, p, &n, &k);
        f->weights[f->n_weights++] = (model_fp8_weight){ly->fp8 * FP8_N_PROJ + p, t->offset, (int64_t)n * k, n, k, 0, t};
      }
    }
  if (f->head_w)  // a tied head is the embedding table, which the lookup reads in the act dtype
    f->weights[f->n_weights++] = (model_fp8_weight){f->n_layers * FP8_N_PROJ, f->head_w->offset,
                                                    (int64_t)m->dims.vocab * m->dims.d, m->dims.vocab, m->dims.d,
                                                    f->head_w->kind == MODEL_EMBED, f->head_w};
}

static float *fp8_upload(k_backend *be, int64_t n, float value) {
  float *host = XMALLOC((size_t)n * sizeof(float)), *dev = be->alloc(be, (size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) host[i] = value;
  be->from_host(be, dev, host, (size_t)n * sizeof(float));
  be->sync(be);
  free(host);
  return dev;
}

static uint8_t *fp8_formats(k_backend *be, int64_t n, int per_layer, k_fp8 (*of)(int slot, int hybrid), int hybrid) {
  uint8_t *host = XMALLOC((size_t)n), *dev = be->alloc(be, (size_t)n);
  for (int64_t i = 0; i < n; i++) host[i] = (uint8_t)of((int)(i % per_layer), hybrid);
  be->from_host(be, dev, host, (size_t)n);
  be->sync(be);
  free(host);
  return dev;
}

static k_fp8 fp8_act_format(int slot, int hybrid) { return slot >= FP8_G && hybrid ? K_E5M2 : K_E4M3; }
static k_fp8 fp8_weight_format(int slot, int hybrid) { (void)slot, (void)hybrid; return K_E4M3; }

int model_fp8_layer_on(const model *m, int layer) {
  return m->fp8 && !(m->fp8->cfg.edge_layers_bf16 && (layer == 0 || layer == m->cfg.n_layers - 1));
}

static float *fp8_scales_alloc(k_backend *be, int64_t n) { return be->alloc(be, (size_t)n * sizeof(float)); }

// Block scaling's scale arrays: each weight's (and its transpose's) 128 x 128 tiles, and the 1 x
// 128 tiles of the widest input and output gradient, as cast and transposed.
static void fp8_block_init(model *m, int k_max, int n_max) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  int64_t rows = m->dims.rows;
  f->ws = XCALLOC((size_t)f->n_w, sizeof(float *));
  f->wst = XCALLOC((size_t)f->n_w, sizeof(float *));
  for (int i = 0; i < f->n_weights; i++) {
    const model_fp8_weight *w = &f->weights[i];
    f->ws[w->tensor] = fp8_scales_alloc(be, k_fp8_block_scales_n(w->n, w->k, K_FP8_BLOCK));
    f->wst[w->tensor] = fp8_scales_alloc(be, k_fp8_block_scales_n(w->k, w->n, K_FP8_BLOCK));
  }
  int64_t nx = k_fp8_block_scales_n(rows, k_max, 1), nxt = k_fp8_block_scales_n(k_max, rows, 1);
  f->x_si = fp8_scales_alloc(be, nx > nxt ? nx : nxt);
  f->g_si = fp8_scales_alloc(be, k_fp8_block_scales_n(rows, n_max, 1));
  f->gt_si = fp8_scales_alloc(be, k_fp8_block_scales_n(n_max, rows, 1));
}

// model.weights_in_optimizer: the size of a bank, room for the FP8 copies of the largest weight
// set (a layer's four projections, or the head's); model_fp8_place allocates each at its first use.
static void fp8_banks_init(model *m) {
  model_fp8 *f = m->fp8;
  int64_t *per_slot = XCALLOC((size_t)f->n_layers + 1, sizeof(int64_t));
  for (int i = 0; i < f->n_weights; i++) {
    const model_fp8_weight *w = &f->weights[i];
    per_slot[w->tensor / FP8_N_PROJ] += w->n_elem;
    if (per_slot[w->tensor / FP8_N_PROJ] > f->bank_elem) f->bank_elem = per_slot[w->tensor / FP8_N_PROJ];
  }
  free(per_slot);
  if (f->bank_elem == 0) f->bank_elem = 1;
}

void model_fp8_place(model *m, int k, int t_lo, int t_hi) {
  model_fp8 *f = m->fp8;
  if (!f) return;
  CHECK(f->bank_elem > 0 && k >= 0 && k < FP8_MAX_BANKS, "model_fp8_place: bank %d of a model without FP8 banks "
        "(or past %d)", k, FP8_MAX_BANKS);
  if (!f->bank[k]) {
    f->bank[k] = k_alloc_as(m->be, (size_t)f->bank_elem, K_MEM_FP8);
    f->bank_t[k] = k_alloc_as(m->be, (size_t)f->bank_elem, K_MEM_FP8);
  }
  int64_t off = 0;
  for (int i = 0; i < f->n_weights; i++) {
    const model_fp8_weight *w = &f->weights[i];
    const int t = (int)(w->src - m->tensors);
    if (t < t_lo || t >= t_hi) continue;
    CHECK(off + w->n_elem <= f->bank_elem, "model_fp8_place: tensors %d to %d outgrow the bank", t_lo, t_hi);
    f->w8[w->tensor] = f->bank[k] + off;
    f->w8t[w->tensor] = f->bank_t[k] + off;
    off += w->n_elem;
    f->w_stale[w->tensor / FP8_N_PROJ] = 1;
  }
}

void model_fp8_init(model *m, const model_fp8_config *fc) {
  k_backend *be = m->be;
  const k_mem_kind kind_before = be->mem_kind(be, K_MEM_FP8);  // every buffer below
  model_fp8 *f = XCALLOC(1, sizeof *f);
  m->fp8 = f;
  f->cfg = *fc;
  for (int ci = 0; ci < m->vpp; ci++)
    for (int i = 0; i < m->chunks[ci].n_layers; i++) m->chunks[ci].layers[i].fp8 = f->n_layers++;
  // The head's slots follow the layers' (model_fp8_head_slot), on every rank alike.
  f->layer_of = XCALLOC((size_t)f->n_layers + 1, sizeof(int));
  for (int ci = 0; ci < m->vpp; ci++)
    for (int i = 0; i < m->chunks[ci].n_layers; i++) f->layer_of[m->chunks[ci].layers[i].fp8] = m->chunks[ci].layers[i].wq->layer;
  f->layer_of[f->n_layers] = m->cfg.n_layers;
  for (int ci = 0; ci < m->vpp && fc->head; ci++)
    if (m->chunks[ci].lm_head) f->head_w = m->chunks[ci].lm_head;
  f->bad_code = -1;
  f->n_act = (int64_t)FP8_ACT_SLOTS * (f->n_layers + 1);
  f->n_w = (int64_t)FP8_N_PROJ * (f->n_layers + 1);
  int len = fc->recipe == MODEL_FP8_DELAYED ? fc->amax_history : 1;
  f->amax = be->alloc(be, (size_t)f->n_act * sizeof(float));
  f->scale = fp8_upload(be, f->n_act, 1.0f);
  f->scale_inv = fp8_upload(be, f->n_act * FP8_INV_STRIDE, 1.0f);
  f->history = be->alloc(be, (size_t)(f->n_act * len) * sizeof(float));
  f->fmt = fp8_formats(be, f->n_act, FP8_ACT_SLOTS, fp8_act_format, fc->hybrid);
  f->w_amax = be->alloc(be, (size_t)f->n_w * sizeof(float));
  f->w_scale = fp8_upload(be, f->n_w, 1.0f);
  f->w_scale_inv = fp8_upload(be, f->n_w * FP8_INV_STRIDE, 1.0f);
  f->w_history = be->alloc(be, (size_t)f->n_w * sizeof(float));
  f->w_fmt = fp8_formats(be, f->n_w, FP8_N_PROJ, fp8_weight_format, 0);
  f->amax_sink = be->alloc(be, 2 * sizeof(float));
  f->n_nonfinite = be->alloc(be, sizeof(int));
  fp8_list_weights(m);
  f->w8 = XCALLOC((size_t)f->n_w, sizeof(uint8_t *));
  f->w8t = XCALLOC((size_t)f->n_w, sizeof(uint8_t *));
  if (m->weights_in_optimizer) fp8_banks_init(m);
  for (int i = 0; i < f->n_weights && !f->bank_elem; i++) {
    const model_fp8_weight *w = &f->weights[i];
    f->w8[w->tensor] = be->alloc(be, (size_t)w->n_elem);
    f->w8t[w->tensor] = be->alloc(be, (size_t)w->n_elem);
  }
  int k_max, n_max;
  fp8_widths(m, &k_max, &n_max);
  f->x8 = be->alloc(be, (size_t)(m->dims.rows * k_max));
  f->x8_in = f->x8;
  f->g8 = be->alloc(be, (size_t)(m->dims.rows * n_max));
  f->g8t = be->alloc(be, (size_t)(m->dims.rows * n_max));
  if (fc->recipe == MODEL_FP8_BLOCK) fp8_block_init(m, k_max, n_max);
  f->w_stale = XMALLOC((size_t)(f->n_layers + 1));
  model_fp8_weights_changed(m);
  be->mem_kind(be, kind_before);
}

void model_fp8_free(model *m) {
  model_fp8 *f = m->fp8;
  if (!f) return;
  k_backend *be = m->be;
  void *bufs[] = {f->amax, f->scale, f->scale_inv, f->history, f->fmt, f->w_amax, f->w_scale, f->w_scale_inv,
                  f->w_history, f->w_fmt, f->amax_sink, f->n_nonfinite, f->x8, f->g8, f->g8t};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
  if (f->codes) be->free(be, f->codes);
  for (int k = 0; k < FP8_MAX_BANKS; k++)
    if (f->bank[k]) be->free(be, f->bank[k]), be->free(be, f->bank_t[k]);
  for (int64_t j = 0; j < f->n_w; j++) {
    if (f->w8[j] && !f->codes && !f->bank_elem) be->free(be, f->w8[j]);
    if (f->w8t[j] && !f->bank_elem) be->free(be, f->w8t[j]);
    if (f->ws && f->ws[j]) be->free(be, f->ws[j]);
    if (f->wst && f->wst[j]) be->free(be, f->wst[j]);
  }
  float *block_bufs[] = {f->x_si, f->g_si, f->gt_si};
  for (int i = 0; i < 3; i++)
    if (block_bufs[i]) be->free(be, block_bufs[i]);
  free(f->w8);
  free(f->w8t);
  free(f->ws);
  free(f->wst);
  free(f->layer_of);
  free(f->w_stale);
  free(f->weights);
  free(f);
  m->fp8 = NULL;
}

// The tp group's max of n amaxes in backend memory: the amax of a tensor split over the group
// (the same on every rank where each holds all of it).
static void fp8_tp_max(const model *m, float *amax, int64_t n) {
  m->comm.ops->tp_all_reduce(m->comm.ctx, amax, n, MODEL_REDUCE_MAX);
}

// Delayed scaling: this step's amaxes, maxed over the layer's tp and dp groups (each holds a
// part of the global batch, or of the tensor), into the history and the scales.
static void fp8_fold(model *m) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  fp8_tp_max(m, f->amax, f->n_act);
  m->comm.ops->dp_all_reduce(m->comm.ctx, f->amax, f->n_act, MODEL_REDUCE_MAX);
  be->fp8_scales(be, f->history, f->amax, f->scale, f->scale_inv, FP8_INV_STRIDE, f->fmt, (int)f->n_act, f->cfg.amax_history,
                 (int)f->pos, f->cfg.margin, f->cfg.amax_max, f->n_nonfinite);
  f->pos = (f->pos + 1) % f->cfg.amax_history;
  f->pending = 0;
  f->have_history = 1;
}

// Pass 0: weight slot j's amax; pass 1: its FP8 copy and transpose.
static void fp8_cast_weight(model *m, int pass, int64_t j, const void *w, int n, int k) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  if (f->cfg.recipe == MODEL_FP8_BLOCK) {  // each tile scaled from its own amax: one pass
    if (pass == 1) be->fp8_cast_block(be, w, n, k, K_FP8_BLOCK, f->w8[j], f->ws[j], f->w8t[j], f->wst[j], f->amax_sink);
    return;
  }
  if (pass == 0) be->fp8_cast(be, w, n, k, f->w_scale + j, K_E4M3, NULL, NULL, f->w_amax + j);
  else be->fp8_cast(be, w, n, k, f->w_scale + j, K_E4M3, f->w8[j], f->w8t[j], f->amax_sink);
}

// The scales of weight slots [j0, j0 + n) from their amaxes in w_amax (each the weight's, or this
// rank's part of it over a group that holds the rest): maxed over tp (a shard's amax is not the
// tensor's), then each weight scaled from its current amax.
static void fp8_scale_weights(model *m, int64_t j0, int64_t n) {
  model_fp8 *f = m->fp8;
  fp8_tp_max(m, f->w_amax + j0, n);
  m->be->fp8_scales(m->be, f->w_history + j0, f->w_amax + j0, f->w_scale + j0, fp8_inv(f->w_scale_inv, j0),
                    FP8_INV_STRIDE, f->w_fmt + j0, (int)n, 1, 0, f->cfg.margin, 1, f->n_nonfinite);
}

void model_fp8_weights_ready(model *m, int slot) {
  model_fp8 *f = m->fp8;
  if (!f->w_stale[slot]) return;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < f->n_weights; i++) {
      const model_fp8_weight *w = &f->weights[i];
      if (w->tensor / FP8_N_PROJ == slot)
        fp8_cast_weight(m, pass, w->tensor, w->src->pc, w->n, w->k);
    }
    if (pass == 0 && f->cfg.recipe != MODEL_FP8_BLOCK) fp8_scale_weights(m, (int64_t)slot * FP8_N_PROJ, FP8_N_PROJ);
  }
  f->w_stale[slot] = 0;
}

void model_fp8_begin_step(model *m, int training) {
  model_fp8 *f = m->fp8;
  if (!f) return;
  if (training && f->pending) fp8_fold(m);
  if (training && f->cfg.recipe != MODEL_FP8_DELAYED) m->be->zero(m->be, f->amax, (size_t)f->n_act * sizeof(float));
  f->recording = training;
  if (training) f->pending = f->cfg.recipe == MODEL_FP8_DELAYED;  // an evaluation keeps the step's amaxes
}

void model_fp8_scale_inv_to_host(const model *m, float *host) {
  const model_fp8 *f = m->fp8;
  float *padded = XMALLOC((size_t)(f->n_act * FP8_INV_STRIDE) * sizeof(float));
  m->be->to_host(m->be, padded, f->scale_inv, (size_t)(f->n_act * FP8_INV_STRIDE) * sizeof(float));
  for (int64_t i = 0; i < f->n_act; i++) host[i] = *fp8_inv(padded, i);
  free(padded);
}

void model_fp8_scale_inv_from_host(model *m, const float *host) {
  const model_fp8 *f = m->fp8;
  float *padded = XMALLOC((size_t)(f->n_act * FP8_INV_STRIDE) * sizeof(float));
  for (int64_t i = 0; i < f->n_act * FP8_INV_STRIDE; i++) padded[i] = host[i / FP8_INV_STRIDE];
  m->be->from_host(m->be, f->scale_inv, padded, (size_t)(f->n_act * FP8_INV_STRIDE) * sizeof(float));
  m->be->sync(m->be);  // padded is freed next
  free(padded);
}

void model_fp8_weights_changed(model *m) {
  if (m->fp8) memset(m->fp8->w_stale, 1, (size_t)(m->fp8->n_layers + 1));
}

uint8_t *model_fp8_codes_flat(model *m, int64_t lo, int64_t hi) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  CHECK(!f->codes && hi > lo, "FP8 codes: one flat buffer, once (elements %lld to %lld)", (long long)lo, (long long)hi);
  f->codes = k_alloc_as(be, (size_t)(hi - lo), K_MEM_FP8);
  for (int i = 0; i < f->n_weights; i++) {
    const model_fp8_weight *w = &f->weights[i];
    CHECK(w->offset >= lo && w->offset + w->n_elem <= hi, "FP8 codes: weight slot %d outside elements %lld to %lld",
          w->tensor, (long long)lo, (long long)hi);
    be->free(be, f->w8[w->tensor]);
    f->w8[w->tensor] = f->codes + (w->offset - lo);
  }
  model_fp8_weights_changed(m);
  return f->codes;
}

void model_fp8_scale_weights(model *m) {
  model_fp8 *f = m->fp8;
  m->comm.ops->dp_all_reduce(m->comm.ctx, f->w_amax, f->n_w, MODEL_REDUCE_MAX);
  fp8_scale_weights(m, 0, f->n_w);
}

void model_fp8_codes_ready(model *m) {
  model_fp8 *f = m->fp8;
  for (int i = 0; i < f->n_weights; i++) {
    const model_fp8_weight *w = &f->weights[i];
    m->be->fp8_transpose(m->be, f->w8[w->tensor], w->n, w->k, f->w8t[w->tensor]);
  }
  memset(f->w_stale, 0, (size_t)(f->n_layers + 1));
}

void model_fp8_settle(model *m) {
  if (m->fp8 && m->fp8->pending) fp8_fold(m);
}

// Where a cast of slot i records its amax: the slot's while training (delayed scaling's next
// update, and every recipe's non-finite check), else a sink (an evaluation changes no scale).
static float *fp8_slot_amax(model_fp8 *f, int64_t i) { return f->recording ? f->amax + i : f->amax_sink; }

// Casts x (rows, cols) with activation slot i's scale into out (and/or its transpose). Current
// scaling (and delayed scaling before its first update) first takes the tensor's amax (over tp)
// and the scale from it; delayed scaling records the amax for the next update while training.
static void fp8_cast_slot(model *m, int64_t i, k_fp8 fmt, const void *x, int64_t rows, int cols, uint8_t *out,
                          uint8_t *out_t) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  int delayed = f->cfg.recipe == MODEL_FP8_DELAYED;
  if (!delayed || !f->have_history) {  // the scratch amax: the recorded one keeps the step's max
    float *a = f->amax_sink;
    be->zero(be, a, sizeof(float));
    be->fp8_cast(be, x, rows, cols, f->scale + i, fmt, NULL, NULL, a);
    fp8_tp_max(m, a, 1);
    be->fp8_scales(be, a + 1, a, f->scale + i, fp8_inv(f->scale_inv, i), FP8_INV_STRIDE, f->fmt + i, 1, 1, 0, f->cfg.margin, 1,
                   f->n_nonfinite);
  }
  be->fp8_cast(be, x, rows, cols, f->scale + i, fmt, out, out_t, fp8_slot_amax(f, i));
}

static k_fp8 fp8_grad_format(const model_fp8 *f) { return f->cfg.hybrid ? K_E5M2 : K_E4M3; }
static int64_t fp8_x_slot(int slot, int p) { return (int64_t)slot * FP8_ACT_SLOTS + FP8_X + p; }
static int64_t fp8_g_slot(int slot, int p) { return (int64_t)slot * FP8_ACT_SLOTS + FP8_G + p; }

// Block scaling's forward: rows [r0, r1) of the input, each row's 1 x 128 tiles cast on their own
// (a range's scales contiguous, as the GEMM reads them), times the weight's 128 x 128 tiles.
static void fp8_block_fwd_rows(model *m, int slot, int p, int64_t r0, int64_t r1, int n, int k, void *y, k_dtype c_type,
                               float beta) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  int64_t j = (int64_t)slot * FP8_N_PROJ + p, nkb = k_fp8_blocks(k);
  const char *x = (const char *)f->x_src + r0 * k * (int64_t)k_dtype_bytes(be->act);
  be->fp8_cast_block(be, x, r1 - r0, k, 1, f->x8 + r0 * k, f->x_si + r0 * nkb, NULL, NULL,
                     fp8_slot_amax(f, fp8_x_slot(slot, p)));
  be->gemm_fp8_block(be, (int)(r1 - r0), n, k, f->x8 + r0 * k, 1, f->x_si + r0 * nkb, f->w8[j], K_FP8_BLOCK, f->ws[j],
                     beta, y, c_type);
}

static int fp8_block(const model_fp8 *f) { return f->cfg.recipe == MODEL_FP8_BLOCK; }

// Whether a tensor's scale is known before the tensor is made, so the op that makes it can cast
// it too: delayed scaling after its first update.
static int fp8_scale_known(const model_fp8 *f) { return f->cfg.recipe == MODEL_FP8_DELAYED && f->have_history; }

// Whether the codes of slot i were made by a fused op (*made: 1 + the slot they were made for, 0
// none; reset here). Codes made for another slot and not used are a bug in the caller.
static int fp8_take_made(int64_t *made, int64_t i) {
  int64_t was = *made;
  *made = 0;
  if (was == i + 1) return 1;
  CHECK(was == 0, "FP8: the codes made for slot %lld were not used before slot %lld was cast", (long long)was - 1,
        (long long)i);
  return 0;
}

int model_fp8_fused_casts(const model *m) { return m->fp8 && fp8_scale_known(m->fp8); }

int model_fp8_fused_cast(model *m, int slot, int p, uint8_t *into, const float **scale, uint8_t **codes, float **amax) {
  model_fp8 *f = m->fp8;
  if (!fp8_scale_known(f)) return 0;
  int64_t i = fp8_x_slot(slot, p);
  *scale = f->scale + i;
  *codes = into ? into : f->x8;
  f->x8_in = *codes;
  *amax = fp8_slot_amax(f, i);
  f->x8_made = i + 1;
  return 1;
}

int model_fp8_fused_grad_cast(model *m, int slot, int p, const float **scale, k_fp8 *fmt, uint8_t **codes,
                              uint8_t **codes_t, float **amax) {
  model_fp8 *f = m->fp8;
  if (!fp8_scale_known(f)) return 0;
  int64_t i = fp8_g_slot(slot, p);
  *scale = f->scale + i;
  *fmt = fp8_grad_format(f);
  *codes = f->g8;
  *codes_t = f->g8t;
  *amax = fp8_slot_amax(f, i);
  f->g8_made = i + 1;
  return 1;
}

void model_fp8_cast_input(model *m, int slot, int p, const void *x, int64_t rows, int k) {
  model_fp8 *f = m->fp8;
  if (fp8_take_made(&f->x8_made, fp8_x_slot(slot, p))) return;  // model_fp8_fused_cast's op made the codes
  if (fp8_block(f)) {  // cast range by range in model_fp8_fwd_rows
    m->fp8->x_src = x;
    return;
  }
  fp8_cast_slot(m, fp8_x_slot(slot, p), K_E4M3, x, rows, k, f->x8, NULL);
  f->x8_in = f->x8;
}

// Rows [r0, r1) of an act-dtype tensor of `cols` columns cast with slot i's scale into codes at row r0,
// recording the slot's amax (the scale must be known: delayed scaling after its first step).
static void fp8_cast_rows(model *m, int64_t i, k_fp8 format, const void *x, int64_t r0, int64_t r1, int cols,
                          uint8_t *codes) {
  if (r1 <= r0) return;
  const size_t row_bytes = (size_t)cols * k_dtype_bytes(m->be->act);
  m->be->fp8_cast(m->be, (const char *)x + r0 * row_bytes, r1 - r0, cols, m->fp8->scale + i, format, codes + r0 * cols,
                  NULL, fp8_slot_amax(m->fp8, i));
}

int model_fp8_input_by_rows(const model *m) { return fp8_block(m->fp8) || fp8_scale_known(m->fp8); }

int model_fp8_dgrad_by_rows(const model *m) { return !fp8_block(m->fp8); }

void model_fp8_cast_input_rows(model *m, int slot, int p, const void *x, int64_t r0, int64_t r1, int k) {
  model_fp8 *f = m->fp8;
  CHECK(model_fp8_input_by_rows(m), "FP8: an input cast by rows needs its scale before the cast");
  if (fp8_block(f)) {  // cast range by range in model_fp8_fwd_rows
    f->x_src = x;
    return;
  }
  fp8_cast_rows(m, fp8_x_slot(slot, p), K_E4M3, x, r0, r1, k, f->x8);
  f->x8_in = f->x8;
}

void model_fp8_fwd_rows(model *m, int slot, int p, int64_t r0, int64_t r1, int n, int k, const void *y_in, void *y,
                        k_dtype c_type, float beta) {
  if (r1 <= r0) return;
  model_fp8 *f = m->fp8;
  if (fp8_block(f)) {
    if (y_in && beta != 0.0f) m->be->copy(m->be, y, y_in, (size_t)((r1 - r0) * n) * k_dtype_bytes(c_type));
    fp8_block_fwd_rows(m, slot, p, r0, r1, n, k, y, c_type, beta);
    return;
  }
  int64_t ix = fp8_x_slot(slot, p), j = (int64_t)slot * FP8_N_PROJ + p;
  m->be->gemm_fp8(m->be, (int)(r1 - r0), n, k, f->x8_in + r0 * k, K_E4M3, fp8_inv(f->scale_inv, ix), f->w8[j], K_E4M3,
                  fp8_inv(f->w_scale_inv, j), beta, y_in, y, c_type, f->cfg.fast_accum);
}

void model_fp8_cast_grad(model *m, int slot, int p, const void *g, int64_t rows, int n) {
  model_fp8 *f = m->fp8;
  if (fp8_take_made(&f->g8_made, fp8_g_slot(slot, p))) return;  // model_fp8_fused_grad_cast's op made them
  if (fp8_block(f)) {  // G's 1 x 128 tiles (data gradient) and its transpose's (weight gradient)
    m->be->fp8_cast_block(m->be, g, rows, n, 1, f->g8, f->g_si, f->g8t, f->gt_si, fp8_slot_amax(f, fp8_g_slot(slot, p)));
    return;
  }
  fp8_cast_slot(m, fp8_g_slot(slot, p), fp8_grad_format(f), g, rows, n, f->g8, f->g8t);
}

void model_fp8_dgrad(model *m, int slot, int p, int64_t r0, int64_t r1, int n, int k, void *dx, k_dtype c_type) {
  if (r1 <= r0) return;
  model_fp8 *f = m->fp8;
  int64_t ig = fp8_g_slot(slot, p), j = (int64_t)slot * FP8_N_PROJ + p;
  void *out = (char *)dx + r0 * k * (int64_t)k_dtype_bytes(c_type);
  if (fp8_block(f)) {  // every row: the tile scales' layout is the kernel's
    CHECK(r0 == 0, "FP8 block scaling: a data gradient over rows from %lld (a bug in the caller)", (long long)r0);
    m->be->gemm_fp8_block(m->be, (int)r1, k, n, f->g8, 1, f->g_si, f->w8t[j], K_FP8_BLOCK, f->wst[j], 0, dx, c_type);
    return;
  }
  m->be->gemm_fp8(m->be, (int)(r1 - r0), k, n, f->g8 + r0 * n, fp8_grad_format(f), fp8_inv(f->scale_inv, ig), f->w8t[j],
                  K_E4M3, fp8_inv(f->w_scale_inv, j), 0, NULL, out, c_type, 0);
}

uint8_t *model_fp8_cast_grad_rows(model *m, int slot, int p, const void *g, int64_t r0, int64_t r1, int n) {
  model_fp8 *f = m->fp8;
  CHECK(fp8_scale_known(f), "FP8: a gradient cast by rows needs its scale before the cast");
  fp8_cast_rows(m, fp8_g_slot(slot, p), fp8_grad_format(f), g, r0, r1, n, f->g8);
  return f->g8;
}

void model_fp8_grad_rows_done(model *m, int64_t rows, int n) { m->be->fp8_transpose(m->be, m->fp8->g8, rows, n, m->fp8->g8t); }

void model_fp8_wgrad(model *m, int slot, int p, const void *x, const uint8_t *x_codes, int64_t rows, int n, int k,
                     float beta, float *dw) {
  model_fp8 *f = m->fp8;
  int64_t ix = fp8_x_slot(slot, p), ig = fp8_g_slot(slot, p);
  CHECK(!x_codes || !fp8_block(f), "FP8 weight gradient: kept input codes under block scaling (a bug in the caller)");
  if (fp8_block(f)) {  // X^T's 1 x 128 tiles along the rows (tokens), the contraction of G^T X
    m->be->fp8_cast_block(m->be, x, rows, k, 1, NULL, NULL, f->x8, f->x_si, fp8_slot_amax(f, ix));
    m->be->gemm_fp8_block(m->be, n, k, (int)rows, f->g8t, 1, f->gt_si, f->x8, 1, f->x_si, beta, dw, K_F32);
    return;
  }
  if (x_codes) m->be->fp8_transpose(m->be, x_codes, rows, k, f->x8);
  else fp8_cast_slot(m, ix, K_E4M3, x, rows, k, NULL, f->x8);
  m->be->gemm_fp8(m->be, n, k, (int)rows, f->g8t, fp8_grad_format(f), fp8_inv(f->scale_inv, ig), f->x8, K_E4M3,
                  fp8_inv(f->scale_inv, ix), beta, NULL, dw, K_F32, 0);
}

int model_fp8_count_nonfinite(model *m) {
  model_fp8 *f = m->fp8;
  if (!f || !f->recording) return 0;
  float *amax = XMALLOC((size_t)f->n_act * sizeof(float));
  m->be->to_host(m->be, amax, f->amax, (size_t)f->n_act * sizeof(float));
  int n_bad = 0;
  f->bad_code = -1;
  for (int64_t i = 0; i < f->n_act; i++) {
    if (isfinite(amax[i])) continue;
    int64_t code = (int64_t)f->layer_of[i / FP8_ACT_SLOTS] * FP8_ACT_SLOTS + i % FP8_ACT_SLOTS;
    if (n_bad++ == 0 || code < f->bad_code) f->bad_code = code, f->bad_amax = amax[i];
  }
  free(amax);
  return n_bad;
}

void model_fp8_discard_step(model *m) {
  model_fp8 *f = m->fp8;
  if (!f) return;
  m->be->zero(m->be, f->amax, (size_t)f->n_act * sizeof(float));
}

int model_fp8_describe_nonfinite(model *m, char *buf, size_t n_buf) {
  model_fp8 *f = m->fp8;
  if (!f) return 0;
  // The lowest code over every rank (a max of its negation; -1 where none), then its amax summed
  // over the ranks that hold it (tp ranks each hold the same slot: Inf + Inf and NaN + NaN stay).
  double first = f->bad_code >= 0 ? -(double)f->bad_code : -1e300;
  m->comm.ops->world_all_reduce(m->comm.ctx, &first, 1, MODEL_REDUCE_MAX);
  if (first < -1e299) return 0;
  int64_t code = (int64_t)-first;
  double value = f->bad_code == code ? f->bad_amax : 0.0;
  m->comm.ops->world_all_reduce(m->comm.ctx, &value, 1, MODEL_REDUCE_SUM);
  static const char *const proj[FP8_N_PROJ] = {"QKV", "attention output", "gate|up", "down"};
  int slot = (int)(code % FP8_ACT_SLOTS), p = slot % FP8_N_PROJ;
  int64_t layer = code / FP8_ACT_SLOTS;
  const char *what = slot < FP8_G ? "input" : "output gradient", *val = isnan(value) ? "nan" : "inf";
  if (layer == m->cfg.n_layers) snprintf(buf, n_buf, "the FP8 amax of the LM head's %s is %s", what, val);
  else snprintf(buf, n_buf, "the FP8 amax of layer %lld's %s projection %s is %s", (long long)layer, proj[p], what, val);
  return 1;
}

void model_fp8_test_set_amax(model *m, float value) {
  model_fp8 *f = m->fp8;
  if (!f || !f->recording) return;
  for (int64_t s = 0; s < f->n_layers; s++)
    if (model_fp8_layer_on(m, f->layer_of[s])) {
      m->be->from_host(m->be, f->amax + s * FP8_ACT_SLOTS + FP8_X + FP8_QKV, &value, sizeof value);
      m->be->sync(m->be);
      return;
    }
}

int model_fp8_head_slot(const model *m) { return m->fp8 && m->fp8->head_w ? m->fp8->n_layers : -1; }
