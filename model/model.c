// Parameter layout from the spec table: which tensors this rank holds (pipeline chunks, tp
// shards), one flat allocation for parameters and one for gradients, and the
// layout-independent initialisation.
#include "model/model.h"
#include "kernels/base/check.h"
#include "model/model_internal.h"
#include "model/fp8.h"
#include <math.h>
#include <string.h>

const model_spec model_specs[MODEL_N_KINDS] = {
    [MODEL_EMBED] = {"embed", 0, 0, 1, 0},
    [MODEL_ATTN_NORM] = {"attn_norm", 1, -1, 0, 2},
    [MODEL_WQ] = {"wq", 1, 0, 1, 0},
    [MODEL_WK] = {"wk", 1, 0, 1, 0},
    [MODEL_WV] = {"wv", 1, 0, 1, 0},
    [MODEL_WO] = {"wo", 1, 1, 1, 1},
    [MODEL_MLP_NORM] = {"mlp_norm", 1, -1, 0, 2},
    [MODEL_W_GATE] = {"w_gate", 1, 0, 1, 0},
    [MODEL_W_UP] = {"w_up", 1, 0, 1, 0},
    [MODEL_W_DOWN] = {"w_down", 1, 1, 1, 1},
    [MODEL_FINAL_NORM] = {"final_norm", 0, -1, 0, 2},
    [MODEL_LM_HEAD] = {"lm_head", 0, 0, 1, 0},
};

// Full logical shape of a kind; returns ndim.
int model_full_shape(const model_config *c, model_kind k, int64_t full[2]) {
  int64_t d = c->dim, hd = c->dim / c->n_heads, q = (int64_t)c->n_heads * hd, kv = (int64_t)c->n_kv_heads * hd;
  full[1] = 1;
  switch (k) {
    case MODEL_EMBED: case MODEL_LM_HEAD: full[0] = c->vocab_size; full[1] = d; return 2;
    case MODEL_ATTN_NORM: case MODEL_MLP_NORM: case MODEL_FINAL_NORM: full[0] = d; return 1;
    case MODEL_WQ: full[0] = q; full[1] = d; return 2;
    case MODEL_WK: case MODEL_WV: full[0] = kv; full[1] = d; return 2;
    case MODEL_WO: full[0] = d; full[1] = q; return 2;
    case MODEL_W_GATE: case MODEL_W_UP: full[0] = c->ffn_dim; full[1] = d; return 2;
    case MODEL_W_DOWN: full[0] = d; full[1] = c->ffn_dim; return 2;
    default: return 0;
  }
}

void model_dims_compute(model_dims *dm, const model_config *mc, int micro_batch, int tp, int tp_rank, int sp) {
  dm->B = micro_batch;
  dm->T = mc->seq_len;
  dm->d = mc->dim;
  dm->hd = mc->dim / mc->n_heads;
  dm->nh = mc->n_heads / tp;
  dm->nkv = mc->n_kv_heads / tp;
  dm->ffn = mc->ffn_dim / tp;
  dm->vocab = mc->vocab_size / tp;
  dm->v0 = dm->vocab * tp_rank;
  dm->rows = (int64_t)dm->T * dm->B;
  dm->rows_s = sp ? dm->rows / tp : dm->rows;
}

int64_t model_count_params(const model_config *c, int64_t *n_without_embedding) {
  int64_t total = 0, embed = 0, full[2];
  for (int k = 0; k < MODEL_N_KINDS; k++) {
    if (k == MODEL_LM_HEAD && c->tie_embeddings) continue;
    model_full_shape(c, (model_kind)k, full);
    int64_t n = full[0] * full[1] * (model_specs[k].per_layer ? c->n_layers : 1);
    total += n;
    if (k == MODEL_EMBED) embed = n;
  }
  if (n_without_embedding) *n_without_embedding = total - embed;
  return total;
}

static model_tensor *add_tensor(model *m, int *n, model_kind k, int layer, int chunk) {
  model_tensor *t = &m->tensors[(*n)++];
  memset(t, 0, sizeof *t);
  t->kind = k;
  t->layer = layer;
  t->chunk = chunk;
  if (layer >= 0) snprintf(t->name, sizeof t->name, "layers.%d.%s", layer, model_specs[k].name);
  else snprintf(t->name, sizeof t->name, "%s", model_specs[k].name);
  t->ndim = model_full_shape(&m->cfg, k, t->full);
  t->count[0] = t->full[0];
  t->count[1] = t->full[1];
  int split = model_specs[k].tp_split;
  if (split >= 0) {
    t->count[split] = t->full[split] / m->tp;
    t->start[split] = t->count[split] * m->tp_rank;
  }
  t->tp_replicated = split < 0;
  t->n_elem = t->count[0] * t->count[1];
  return t;
}

void model_stage_layers(const model_config *mc, const model_layout *ml, int vstage, int *layer0, int *n_layers) {
  int n_vstages = ml->pp * ml->vpp, last = ml->last_stage_layers, total = mc->n_layers;
  if (last == 0 || n_vstages == 1) {
    *n_layers = total / n_vstages;
    *layer0 = vstage * *n_layers;
    return;
  }
  int other = (total - last) / (n_vstages - 1);
  CHECK(last < total && other * (n_vstages - 1) + last == total, "parallel.last_stage_layers = %d does not split %d layers",
        last, total);
  *layer0 = vstage * other;
  *n_layers = vstage == n_vstages - 1 ? last : other;
}

void *model_host_alloc(k_backend *be, size_t n_bytes, const char *what) {
  void *p = be->host_alloc(be, n_bytes);
  CHECK(p, "cannot pin %.2f GiB of host memory for %s (optimizer.offload=host): lower optimizer.offload_fraction, "
        "shard over more dp ranks (parallel.shard=optimizer) or run fewer ranks per node",
        n_bytes / 1073741824.0, what);
  return p;
}

// With the master weights held by the optimizer (sharded like its moments, in device or host
// memory), forward and backward read the norm weights (the only fp32 weights they read) from a
// copy in backend memory, packed one after the other in tensor order: every rank has all of
// them, no reads cross the host link, and an update running on the host
// (optimizer.offload_delay) cannot change them under a step. The
// optimizer refreshes it after every update (parallel/step/optim.c, opt_share_norms).
static void model_place_norms(model *m) {
  if (!m->master_in_optimizer) return;
  int64_t n = 0;
  for (int i = 0; i < m->n_tensors; i++) n += m->tensors[i].tp_replicated ? m->tensors[i].n_elem : 0;
  m->norm_copy = k_alloc_as(m->be, (size_t)(n ? n : 1) * sizeof(float), K_MEM_WEIGHTS);
  n = 0;
  for (int i = 0; i < m->n_tensors; i++) {
    model_tensor *t = &m->tensors[i];
    if (!t->tp_replicated) continue;
    t->p = m->norm_copy + n;
    n += t->n_elem;
  }
}

int model_tensor_group(const model *m, const model_tensor *t) {
  if (t->kind == MODEL_EMBED) return MODEL_GRADS_EMBED;
  if (t->kind == MODEL_FINAL_NORM || t->kind == MODEL_LM_HEAD) return MODEL_GRADS_HEAD;
  return t->layer - m->chunks[t->chunk].layer0;
}

int model_group_starts(const model *m, int i) {
  const model_tensor *t = &m->tensors[i];
  return i == 0 || t->chunk != t[-1].chunk || model_tensor_group(m, t) != model_tensor_group(m, t - 1);
}

int model_grad_written(const model *m, const model_tensor *t) {
  switch (t->kind) {
    case MODEL_WQ: case MODEL_WK: case MODEL_WV: case MODEL_WO: case MODEL_W_GATE: case MODEL_W_UP: case MODEL_W_DOWN:
      return m->grads_in_optimizer;
    default:
      return 0;
  }
}

void model_init(model *m, const model_config *mc, const model_layout *ml, const model_place *at, k_backend *be) {
  CHECK(ml->pp == at->pp, "model layout for %d pipeline stages on a grid of %d", ml->pp, at->pp);
  memset(m, 0, sizeof *m);
  m->cfg = *mc;
  m->be = be;
  m->tp = at->tp;
  m->tp_rank = at->tp_rank;
  m->dp = at->dp;
  m->dp_rank = at->dp_rank;
  m->pp = at->pp;
  m->pp_rank = at->pp_rank;
  m->vpp = ml->vpp;
  m->sp = ml->sequence_parallel && at->tp > 1;
  m->reduce_type = !m->sp || ml->tp_reduce == MODEL_TP_REDUCE_FP32 ? K_F32
                   : ml->tp_reduce == MODEL_TP_REDUCE_BF16    ? K_BF16
                                                              : be->act;
  m->recompute = ml->recompute;
  int n_vstages = m->pp * m->vpp;

  model_dims_compute(&m->dims, mc, ml->micro_batch, m->tp, m->tp_rank, m->sp);

  int max_tensors = mc->n_layers * 9 + m->vpp * 3;  // at most every layer, and 3 non-layer tensors per chunk
  m->tensors = XCALLOC(max_tensors, sizeof(model_tensor));
  m->chunks = XCALLOC(m->vpp, sizeof(model_chunk));
  int n = 0;
  for (int ci = 0; ci < m->vpp; ci++) {
    model_chunk *ch = &m->chunks[ci];
    ch->vstage = ci * m->pp + m->pp_rank;
    model_stage_layers(mc, ml, ch->vstage, &ch->layer0, &ch->n_layers);
    ch->layers = XCALLOC(ch->n_layers, sizeof(model_layer));
    if (ch->vstage == 0) ch->embed = add_tensor(m, &n, MODEL_EMBED, -1, ci);
    for (int i = 0; i < ch->n_layers; i++) {
      int l = ch->layer0 + i;
      model_layer *ly = &ch->layers[i];
      ly->attn_norm = add_tensor(m, &n, MODEL_ATTN_NORM, l, ci);
      ly->wq = add_tensor(m, &n, MODEL_WQ, l, ci);
      ly->wk = add_tensor(m, &n, MODEL_WK, l, ci);
      ly->wv = add_tensor(m, &n, MODEL_WV, l, ci);
      ly->wo = add_tensor(m, &n, MODEL_WO, l, ci);
      ly->mlp_norm = add_tensor(m, &n, MODEL_MLP_NORM, l, ci);
      ly->w_gate = add_tensor(m, &n, MODEL_W_GATE, l, ci);
      ly->w_up = add_tensor(m, &n, MODEL_W_UP, l, ci);
      ly->w_down = add_tensor(m, &n, MODEL_W_DOWN, l, ci);
    }
    if (ch->vstage == n_vstages - 1) {
      ch->final_norm = add_tensor(m, &n, MODEL_FINAL_NORM, -1, ci);
      if (mc->tie_embeddings) {
        CHECK(ch->embed, "tied embeddings need the embedding and the head on one stage (pp 1)");
        ch->lm_head = ch->embed;
      } else {
        ch->lm_head = add_tensor(m, &n, MODEL_LM_HEAD, -1, ci);
      }
    }
  }
  m->n_tensors = n;
  // Padded to a multiple of dp * 128, so that the distributed optimizer's buckets split into dp
  // parts of whole 128-element blocks (parallel/step/optim_layout.c) and every part starts aligned;
  // with grads_in_optimizer each group too, as each group is a bucket.
  int64_t unit = (int64_t)m->dp * 128;
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    model_tensor *t = &m->tensors[i];
    if (ml->grads_in_optimizer && model_group_starts(m, i)) off = (off + unit - 1) / unit * unit;
    t->offset = off;
    off += t->n_elem;
  }
  m->n_params_used = off;
  m->n_params = (off + unit - 1) / unit * unit;
  // With the master weights in host memory the optimizer holds them, only its shard on each dp
  // rank (parallel/step/optim_core.h): the model then has no fp32 flat buffer of weights.
  m->master_in_optimizer = ml->master_in_optimizer;
  m->params = m->master_in_optimizer ? NULL : k_alloc_as(be, (size_t)m->n_params * sizeof(float), K_MEM_WEIGHTS);
  m->grads_in_optimizer = ml->grads_in_optimizer;
  m->weights_in_optimizer = ml->weights_in_optimizer;
  CHECK(!m->weights_in_optimizer || (m->grads_in_optimizer && m->master_in_optimizer),
        "a model whose compute copy the optimizer holds needs its gradients and master weights there too");
  m->grads = m->grads_in_optimizer ? NULL : k_alloc_as(be, (size_t)m->n_params * sizeof(float), K_MEM_GRADS);
  m->act_bytes = k_dtype_bytes(be->act);
  // Master weights in host memory: the compute copy stays in backend memory even in fp32.
  m->params_c = ml->weights_in_optimizer                       ? NULL
                : be->act == K_F32 && !m->master_in_optimizer ? (void *)m->params
                                                              : k_alloc_as(be, (size_t)m->n_params * m->act_bytes, K_MEM_WEIGHTS);
  model_place_norms(m);
  for (int i = 0; i < n; i++) {
    if (!m->tensors[i].p && m->params) m->tensors[i].p = m->params + m->tensors[i].offset;
    m->tensors[i].g = m->grads ? m->grads + m->tensors[i].offset : NULL;
    m->tensors[i].pc = m->params_c ? (char *)m->params_c + m->tensors[i].offset * (int64_t)m->act_bytes : NULL;
  }
  model_work_init(m);
  if (ml->fp8.enabled) model_fp8_init(m, &ml->fp8);
}

void model_free(model *m) {
  if (!m->tensors) return;
  model_fp8_free(m);
  model_work_free(m);
  if (m->params_c != (void *)m->params) m->be->free(m->be, m->params_c);
  if (m->norm_copy) m->be->free(m->be, m->norm_copy);
  if (m->params) m->be->free(m->be, m->params);
  if (m->grads) m->be->free(m->be, m->grads);
  for (int ci = 0; ci < m->vpp; ci++) free(m->chunks[ci].layers);
  free(m->chunks);
  free(m->tensors);
  m->tensors = NULL;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

// Standard normal from (key, index) alone: Box-Muller on two hashed uniforms.
static float normal_at(uint64_t key, uint64_t i) {
  uint64_t a = splitmix64(key ^ splitmix64(2 * i)), b = splitmix64(key ^ splitmix64(2 * i + 1));
  double u1 = ((a >> 11) + 1.0) / 9007199254740993.0, u2 = (b >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void model_sync_compute_weights(model *m) {
  CHECK(m->params, "the optimizer holds the master weights (optimizer.offload=host): it refreshes the compute copy");
  if (m->params_c != (void *)m->params) m->be->cast(m->be, m->params_c, m->be->act, m->params, K_F32, m->n_params);
  model_fp8_weights_changed(m);
}

void model_init_tensor(const model *m, int i, uint64_t seed, float *block) {
  const model_tensor *t = &m->tensors[i];
  int init = model_specs[t->kind].init;
  float std = m->cfg.init_std * (init == 1 ? 1.0f / sqrtf(2.0f * m->cfg.n_layers) : 1.0f);
  uint64_t key = splitmix64(seed) ^ hash_name(t->name);
  // Each value depends on (key, index) alone, so the threads' split does not change the bits;
  // the 1B-7B shapes take minutes on one core.
#pragma omp parallel for schedule(static) if (t->n_elem > ((int64_t)1 << 16))
  for (int64_t r = 0; r < t->count[0]; r++)
    for (int64_t c = 0; c < t->count[1]; c++) {
      uint64_t idx = (uint64_t)((t->start[0] + r) * t->full[1] + t->start[1] + c);
      block[r * t->count[1] + c] = init == 2 ? 1.0f : std * normal_at(key, idx);
    }
}

void model_init_weights(model *m, uint64_t seed) {
  CHECK(m->params, "the optimizer holds the master weights (optimizer.offload=host): opt_init_weights sets them");
  for (int i = 0; i < m->n_tensors; i++) {
    model_tensor *t = &m->tensors[i];
    float *block = XMALLOC((size_t)t->n_elem * sizeof(float));
    model_init_tensor(m, i, seed, block);
    m->be->from_host(m->be, m->params + t->offset, block, (size_t)t->n_elem * sizeof(float));
    free(block);
  }
  model_sync_compute_weights(m);
}
