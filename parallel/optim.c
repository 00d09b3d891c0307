// Gradient synchronisation and AdamW (see optim.h).
#include "parallel/optim.h"
#include "kernels/check.h"
#include "parallel/trace.h"
#include <math.h>
#include <string.h>

// What model_chunk_bwd reports when a tensor's gradient has this micro-batch's contribution.
static int opt_group(int chunk, int layer) { return chunk * 4096 + layer + 2; }

enum { OPT_PIECES = 8 };

static void opt_on_grads_ready(void *ctx, int chunk, int layer);

// Buckets of bucket_elem (a multiple of parts * 128) from the end of the flat buffer (backward
// fills it from the end), each with the tensors it overlaps. Each bucket is cut into `parts`
// equal parts (dp with ZeRO, otherwise 1): part r of bucket [lo, hi) is flat [lo + r * len,
// + len), and this rank's shard is its part of every bucket, in flat order (at shard_off).
static void opt_build_buckets(opt_state *o) {
  model *m = o->m;
  const int64_t unit = (int64_t)o->parts * 128;  // n_params is a multiple of dp * 128
  o->bucket_elem = (o->bucket_elem + unit - 1) / unit * unit;
  o->n_buckets = (int)((m->n_params + o->bucket_elem - 1) / o->bucket_elem);
  o->buckets = XCALLOC(o->n_buckets ? o->n_buckets : 1, sizeof(opt_bucket));
  int b = 0;
  for (int64_t end = m->n_params; end > 0; end -= o->bucket_elem, b++) {
    opt_bucket *k = &o->buckets[b];
    k->hi = end;
    k->lo = end - o->bucket_elem < 0 ? 0 : end - o->bucket_elem;
    k->len = (k->hi - k->lo) / o->parts;
    k->t_lo = m->n_tensors;
    k->t_hi = 0;
    for (int i = 0; i < m->n_tensors; i++) {
      const model_tensor *t = &m->tensors[i];
      if (t->offset < k->hi && t->offset + t->n_elem > k->lo) {
        if (i < k->t_lo) k->t_lo = i;
        k->t_hi = i + 1;
      }
    }
    if (k->t_hi < k->t_lo) k->t_lo = k->t_hi = 0;  // padding only
  }
  int64_t off = 0;
  for (int i = o->n_buckets - 1; i >= 0; i--) {  // the last bucket is the lowest
    o->buckets[i].shard_off = off;
    off += o->buckets[i].len;
  }
}

// This rank's part of bucket k, in flat elements.
static int64_t opt_part_lo(const opt_state *o, const opt_bucket *k) { return k->lo + o->part_rank * k->len; }

// Each tensor's piece in each of this rank's bucket parts, in flat order: offset in the shard,
// p_offset in the flat buffer. All of them are updated; those this rank counts are in the
// gradient norm. Each element is counted once over the world: tp-replicated tensors by tp rank
// 0 only, and without ZeRO (every dp replica holds all gradients) by dp rank 0 only. The buckets
// are split into n_pieces runs in flat order: piece k's update ranges are upd_ranges[
// piece_first[k] .. piece_first[k + 1]), its buckets (counted from the lowest, as in bucket_lo
// and bucket_len) piece_bucket[k] .. piece_bucket[k + 1]. norm_own lists the norm elements this
// rank updates, with offset in norm_pack (see opt_share_norms).
static void opt_build_ranges(opt_state *o) {
  const model *m = o->m;
  int cap = 1;
  for (int b = 0; b < o->n_buckets; b++) cap += o->buckets[b].t_hi - o->buckets[b].t_lo;
  o->norm_ranges = XCALLOC(cap, sizeof(k_range));
  o->upd_ranges = XCALLOC(cap, sizeof(k_range));
  o->norm_own = XCALLOC(cap, sizeof(k_range));
  o->piece_first = XCALLOC(o->n_pieces + 1, sizeof(int));
  o->piece_bucket = XCALLOC(o->n_pieces + 1, sizeof(int));
  o->bucket_lo = XCALLOC(o->n_buckets + 1, sizeof(int64_t));
  o->bucket_len = XCALLOC(o->n_buckets + 1, sizeof(int64_t));
  int64_t *pack_at = XCALLOC(m->n_tensors, sizeof(int64_t));
  for (int i = 0, at = 0; i < m->n_tensors; i++) {
    pack_at[i] = at;
    if (m->tensors[i].tp_replicated) at += (int)m->tensors[i].n_elem;
  }
  int piece = 0;
  for (int asc = 0; asc < o->n_buckets; asc++) {
    const opt_bucket *k = &o->buckets[o->n_buckets - 1 - asc];
    for (int want = (int)((int64_t)asc * o->n_pieces / o->n_buckets); piece < want;) {
      piece++;
      o->piece_first[piece] = o->n_upd_ranges;
      o->piece_bucket[piece] = asc;
    }
    o->bucket_lo[asc] = k->lo;
    o->bucket_len[asc] = k->len;
    const int64_t plo = opt_part_lo(o, k), phi = plo + k->len;
    for (int i = k->t_lo; i < k->t_hi; i++) {
      const model_tensor *t = &m->tensors[i];
      int64_t lo = t->offset > plo ? t->offset : plo;
      int64_t hi = t->offset + t->n_elem < phi ? t->offset + t->n_elem : phi;
      if (hi <= lo) continue;
      k_range r = {k->shard_off + (lo - plo), hi - lo, model_specs[t->kind].decay, lo};
      o->upd_ranges[o->n_upd_ranges++] = r;
      if ((!t->tp_replicated || m->g->tp_rank == 0) && (o->zero || m->g->dp_rank == 0))
        o->norm_ranges[o->n_norm_ranges++] = r;
      if (t->tp_replicated) o->norm_own[o->n_norm_own++] = (k_range){pack_at[i] + (lo - t->offset), hi - lo, 0, lo};
    }
  }
  while (piece < o->n_pieces) {
    piece++;
    o->piece_first[piece] = o->n_upd_ranges;
    o->piece_bucket[piece] = o->n_buckets;
  }
  free(pack_at);
}

void opt_init(opt_state *o, model *m, const cfg *c) {
  memset(o, 0, sizeof *o);
  o->m = m;
  o->g = m->g;
  o->hp = c->train;
  o->zero = c->parallel.distributed_optimizer && m->g->dp > 1;
  o->bucket_elem = (int64_t)((double)c->parallel.bucket_mb * (1 << 20) / sizeof(float));
  if (o->bucket_elem < 1) o->bucket_elem = 1;
  k_backend *be = m->be;
  o->parts = o->zero ? m->g->dp : 1;
  o->part_rank = o->zero ? m->g->dp_rank : 0;
  o->shard_n = m->n_params / o->parts;
  // With ZeRO the update runs piece by piece, each piece's all-gathers starting as soon as it is
  // updated, so that they overlap the update of the next pieces.
  o->n_pieces = o->zero ? OPT_PIECES : 1;
  o->exp_avg = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  o->exp_avg_sq = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  if (o->zero) o->grad_shard = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  if (o->zero && m->params_c != (void *)m->params) {
    for (int i = 0; i < m->n_tensors; i++)
      if (m->tensors[i].tp_replicated) o->norm_pack_n += m->tensors[i].n_elem;
    o->norm_pack = be->alloc(be, (size_t)(o->norm_pack_n ? o->norm_pack_n : 1) * sizeof(float));
  }
  opt_build_buckets(o);
  opt_build_ranges(o);

  int dp = m->g->dp;
  o->n_micro = c->train.global_batch / (dp * c->train.micro_batch);
  if (o->n_micro < 1) o->n_micro = 1;
  o->t_group = XCALLOC(m->n_tensors, sizeof(int));
  o->t_count = XCALLOC(m->n_tensors, sizeof(int));
  o->t_final = XCALLOC(m->n_tensors, 1);
  for (int i = 0; i < m->n_tensors; i++) o->t_group[i] = -1;
  for (int ci = 0; ci < m->vpp; ci++) {
    model_chunk *ch = &m->chunks[ci];
    for (int l = 0; l < ch->n_layers; l++) {
      model_layer *ly = &ch->layers[l];
      model_tensor *ts[] = {ly->attn_norm, ly->wq, ly->wk, ly->wv, ly->wo, ly->mlp_norm, ly->w_gate, ly->w_up, ly->w_down};
      for (size_t k = 0; k < sizeof ts / sizeof *ts; k++) o->t_group[ts[k] - m->tensors] = opt_group(ci, l);
    }
    // A tied head is the embedding: final only after the embedding's backward.
    if (ch->final_norm) o->t_group[ch->final_norm - m->tensors] = opt_group(ci, MODEL_GRADS_HEAD);
    if (ch->lm_head && ch->lm_head != ch->embed) o->t_group[ch->lm_head - m->tensors] = opt_group(ci, MODEL_GRADS_HEAD);
    if (ch->embed) o->t_group[ch->embed - m->tensors] = opt_group(ci, MODEL_GRADS_EMBED);
  }
  m->grads_ready = opt_on_grads_ready;
  m->grads_ready_ctx = o;
}

void opt_free(opt_state *o) {
  if (!o->m) return;
  k_backend *be = o->m->be;
  if (o->m->grads_ready_ctx == o) {
    o->m->grads_ready = NULL;
    o->m->grads_ready_ctx = NULL;
  }
  be->free(be, o->exp_avg);
  be->free(be, o->exp_avg_sq);
  if (o->grad_shard) be->free(be, o->grad_shard);
  if (o->norm_pack) be->free(be, o->norm_pack);
  free(o->norm_ranges);
  free(o->upd_ranges);
  free(o->piece_first);
  free(o->piece_bucket);
  free(o->bucket_lo);
  free(o->bucket_len);
  free(o->norm_own);
  free(o->t_group);
  free(o->t_count);
  free(o->t_final);
  free(o->buckets);
  o->m = NULL;
}

float opt_lr_at(const cfg_train *hp, int64_t step) {
  if (step < hp->warmup_steps) return hp->lr * (float)(step + 1) / (float)hp->warmup_steps;
  int64_t decay_steps = hp->steps - hp->warmup_steps;
  if (decay_steps <= 0) return hp->lr;
  double progress = (double)(step - hp->warmup_steps) / (double)decay_steps;
  if (progress > 1) progress = 1;
  return (float)(hp->min_lr + 0.5 * (hp->lr - hp->min_lr) * (1 + cos(M_PI * progress)));
}

// A tensor's gradient has all of this step's contributions. Under sequence parallelism the
// gradients of tp-replicated tensors (norms) are partial per tp rank (each saw only its
// sequence shard): they are summed over tp first, on the compute stream, before any DP bucket
// holding them starts.
static void opt_tensor_final(opt_state *o, int i) {
  model *m = o->m;
  model_tensor *t = &m->tensors[i];
  if (m->sp && t->tp_replicated) m->g->tp_c->ops->all_reduce(m->g->tp_c, t->g, t->n_elem, COMM_F32, COMM_SUM);
  o->t_final[i] = 1;
}

// Starts, in bucket order, every bucket whose tensors are all final: all-reduced, or with ZeRO
// reduce-scattered (each rank's part into its grad_shard). Gradients are already scaled by
// 1 / (tokens of the global batch), so the DP sum is the mean.
static void opt_start_buckets(opt_state *o, comm *dc) {
  if (dc->size == 1) return;
  for (; o->next_bucket < o->n_buckets; o->next_bucket++) {
    const opt_bucket *b = &o->buckets[o->next_bucket];
    for (int i = b->t_lo; i < b->t_hi; i++)
      if (!o->t_final[i]) return;
    trace_push_range("dp bucket start");
    if (o->zero)
      dc->ops->reduce_scatter_start(dc, o->m->grads + b->lo, o->grad_shard + b->shard_off, b->len, COMM_F32, COMM_SUM);
    else
      dc->ops->all_reduce_start(dc, o->m->grads + b->lo, b->hi - b->lo, COMM_F32, COMM_SUM);
    trace_pop_range();
  }
}

static void opt_on_grads_ready(void *ctx, int chunk, int layer) {
  opt_state *o = ctx;
  int grp = opt_group(chunk, layer);
  // Backward order is the reverse of the flat order: walk from the end so SP reductions go
  // out in the order the gradients were finished.
  for (int i = o->m->n_tensors - 1; i >= 0; i--)
    if (o->t_group[i] == grp && ++o->t_count[i] == o->n_micro && !o->t_final[i]) opt_tensor_final(o, i);
  // While backward runs: on the overlap communicator when there is one (fewer SMs).
  opt_start_buckets(o, o->m->g->dp_overlap ? o->m->g->dp_overlap : o->m->g->dp_c);
}

// With ZeRO and a separate compute copy, the fp32 master weights outside this rank's shard are
// stale; but the norms (the tp-replicated tensors) are read in fp32 by forward and backward.
// Every rank packs the norm elements it owns, zeros elsewhere, and the dp sum (exact: one
// term per element is not zero) gives every rank, owner included, the same values. Started
// here; opt_unpack_norms takes the result after the wait.
static void opt_share_norms(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  be->zero(be, o->norm_pack, (size_t)o->norm_pack_n * sizeof(float));
  for (int k = 0; k < o->n_norm_own; k++) {
    const k_range *r = &o->norm_own[k];
    be->copy(be, o->norm_pack + r->offset, m->params + r->p_offset, (size_t)r->n_elem * sizeof(float));
  }
  m->g->dp_c->ops->all_reduce_start(m->g->dp_c, o->norm_pack, o->norm_pack_n, COMM_F32, COMM_SUM);
}

static void opt_unpack_norms(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  int64_t at = 0;
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    if (!t->tp_replicated) continue;
    be->copy(be, t->p, o->norm_pack + at, (size_t)t->n_elem * sizeof(float));
    at += t->n_elem;
  }
}

double opt_step(opt_state *o, float lr, int64_t t) {
  model *m = o->m;
  k_backend *be = m->be;
  comm *dc = m->g->dp_c;
  // Backward is queued; exposed DP time runs from its end (on the compute stream) until every
  // bucket has arrived.
  double t0 = o->timing ? timing_now(be) : 0;
  trace_push_range("dp sync");
  // Whatever backward did not report (a caller driving model_chunk_bwd itself) is final now.
  for (int i = m->n_tensors - 1; i >= 0; i--)
    if (!o->t_final[i]) opt_tensor_final(o, i);
  if (dc->size > 1) {
    opt_start_buckets(o, dc);  // backward is done: the rest with all of NCCL's SMs
    comm *ovl = m->g->dp_overlap;
    if (o->timing) {  // bounded host waits: a dead peer ends the job here
      if (ovl) ovl->ops->drain(ovl);
      dc->ops->drain(dc);
    }
    if (ovl) ovl->ops->wait(ovl);
    dc->ops->wait(dc);
  }
  memset(o->t_count, 0, (size_t)m->n_tensors * sizeof(int));
  memset(o->t_final, 0, (size_t)m->n_tensors);
  o->next_bucket = 0;
  double t1 = o->timing ? timing_now(be) : 0;
  trace_pop_range();
  trace_push_range("optimizer");
  float *grad = o->zero ? o->grad_shard : m->grads;  // indexed by shard offset
  double sumsq = be->sumsq_ranges(grad, o->norm_ranges, o->n_norm_ranges);
  comm *w = m->g->world;
  w->ops->all_reduce(w, &sumsq, 1, COMM_F64, COMM_SUM);
  double norm = sqrt(sumsq);
  const cfg_train *hp = &o->hp;
  float g_scale = hp->grad_clip > 0 && norm > hp->grad_clip ? (float)(hp->grad_clip / (norm + 1e-6)) : 1.0f;
  float bc1 = 1.0f - powf(hp->beta1, (float)t), bc2 = 1.0f - powf(hp->beta2, (float)t);
  // The update also writes the compute copy of this rank's elements (when the copy is not the
  // master itself). With ZeRO the other ranks' parts of the copy are then all-gathered, bucket by
  // bucket: only the compute copy, so the master weights outside this rank's shard are stale
  // (opt_get_params gathers them) except the norms, which forward reads in fp32
  // (opt_share_norms).
  void *pc = m->params_c == (void *)m->params ? NULL : m->params_c;
  for (int k = 0; k < o->n_pieces; k++) {
    int r0 = o->piece_first[k];
    be->adamw_ranges(m->params, pc, be->act, grad, o->exp_avg, o->exp_avg_sq, o->upd_ranges + r0,
                     o->piece_first[k + 1] - r0, lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, bc1, bc2,
                     g_scale);
    int b0 = o->piece_bucket[k], nb = o->piece_bucket[k + 1] - b0;
    if (o->zero && nb > 0)
      dc->ops->all_gather_regions_start(dc, m->params_c, o->bucket_lo + b0, o->bucket_len + b0, nb,
                                        be->act == K_BF16 ? COMM_BF16 : COMM_F32);
  }
  if (o->norm_pack) opt_share_norms(o);
  be->zero(be, m->grads, (size_t)m->n_params * sizeof(float));  // overlaps the all-gathers
  if (o->zero) dc->ops->wait(dc);
  if (o->norm_pack) opt_unpack_norms(o);
  trace_pop_range();
  if (o->timing) {
    o->timing->dp_comm += t1 - t0;
    o->timing->optimizer += timing_now(be) - t1;
  }
  return norm;
}

// This rank's shard of a flat fp32 array (shard order; the whole array without ZeRO), whole
// into host memory in flat order.
static void gather_or_copy(opt_state *o, const float *shard, float *host) {
  model *m = o->m;
  k_backend *be = m->be;
  size_t n_bytes = (size_t)m->n_params * sizeof(float);
  if (!o->zero) {
    be->to_host(be, host, shard, n_bytes);
    return;
  }
  float *full = be->alloc(be, n_bytes), *tmp = XMALLOC(n_bytes);
  m->g->dp_c->ops->all_gather(m->g->dp_c, shard, full, o->shard_n, COMM_F32);
  be->to_host(be, tmp, full, n_bytes);
  be->free(be, full);
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    for (int r = 0; r < o->parts; r++)
      memcpy(host + k->lo + r * k->len, tmp + r * o->shard_n + k->shard_off, (size_t)k->len * sizeof(float));
  }
  free(tmp);
}

void opt_get_params(opt_state *o, float *params_host) {
  model *m = o->m;
  k_backend *be = m->be;
  if (!o->zero) {
    gather_or_copy(o, m->params, params_host);
    return;
  }
  float *shard = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    be->copy(be, shard + k->shard_off, m->params + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  gather_or_copy(o, shard, params_host);
  be->free(be, shard);
}

void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host) {
  gather_or_copy(o, o->exp_avg, exp_avg_host);
  gather_or_copy(o, o->exp_avg_sq, exp_avg_sq_host);
}

// This rank's shard of a whole flat host array, into backend memory.
static void scatter_or_copy(opt_state *o, const float *host, float *shard) {
  k_backend *be = o->m->be;
  size_t n_bytes = (size_t)o->shard_n * sizeof(float);
  if (!o->zero) {
    be->from_host(be, shard, host, n_bytes);
    return;
  }
  float *tmp = XMALLOC(n_bytes);
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    memcpy(tmp + k->shard_off, host + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  be->from_host(be, shard, tmp, n_bytes);
  free(tmp);
}

void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host) {
  scatter_or_copy(o, exp_avg_host, o->exp_avg);
  scatter_or_copy(o, exp_avg_sq_host, o->exp_avg_sq);
}
