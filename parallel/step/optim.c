// Gradient synchronisation and AdamW (see optim.h).
#include "parallel/step/optim.h"
#include "parallel/step/grad_compress.h"
#include "parallel/step/grad_shard.h"
#include "parallel/step/weight_shard.h"
#include "parallel/step/param_gather.h"
#include "model/fp8.h"
#include "kernels/base/check.h"
#include "kernels/base/trace.h"
#include <math.h>
#include <string.h>

enum { OPT_PIECES = 8 };

static void opt_on_grads_ready(void *ctx, int chunk, int layer);

// parallel.shard=grads and weights: before backward writes a group's gradients (and reads its
// weights), and before forward reads its weights.
static void opt_on_grads_needed(void *ctx, int chunk, int layer) {
  opt_state *o = ctx;
  const int grp = opt_group(chunk, layer);
  if (o->ws) weight_shard_needed(o, grp, 1);
  grad_shard_needed(o, grp);
}

static void opt_on_weights_needed(void *ctx, int chunk, int layer) { weight_shard_needed(ctx, opt_group(chunk, layer), 0); }

// Whether range r of bucket k's part (opt_state.part_ranges) is a norm's: each update range lies
// in one tensor.
static int range_is_norm(const opt_state *o, const opt_bucket *k, const k_range *r) {
  const int64_t at = opt_part_lo(o, k) + r->p_offset;
  for (int i = k->t_lo; i < k->t_hi; i++) {
    const model_tensor *t = &o->m->tensors[i];
    if (at >= t->offset && at < t->offset + t->n_elem) return t->tp_replicated;
  }
  return 0;
}

// optimizer.update_overlap: each bucket's update ranges split into the norms' (early) and the rest.
static void opt_update_split_init(opt_state *o) {
  const int cap = o->part_first[o->n_buckets] + 1;
  o->early_ranges = XCALLOC(cap, sizeof(k_range));
  o->late_ranges = XCALLOC(cap, sizeof(k_range));
  o->early_first = XCALLOC(o->n_buckets + 1, sizeof(int));
  o->late_first = XCALLOC(o->n_buckets + 1, sizeof(int));
  o->upd_ticket = XCALLOC(o->n_buckets, sizeof(int64_t));
  int ne = 0, nl = 0;
  for (int b = 0; b < o->n_buckets; b++) {
    o->early_first[b] = ne, o->late_first[b] = nl;
    o->upd_ticket[b] = -1;
    for (int j = o->part_first[b]; j < o->part_first[b + 1]; j++) {
      if (range_is_norm(o, &o->buckets[b], &o->part_ranges[j])) o->early_ranges[ne++] = o->part_ranges[j];
      else o->late_ranges[nl++] = o->part_ranges[j];
    }
  }
  o->early_first[o->n_buckets] = ne, o->late_first[o->n_buckets] = nl;
  o->update_beside = 1;
}

void opt_update_part(opt_state *o, int b, const k_range *r, int n, const float *grad, float lr, float bc1, float bc2,
                     float g_scale) {
  k_backend *be = o->m->be;
  const opt_config *hp = &o->cfg;
  const opt_bucket *k = &o->buckets[b];
  be->adamw_ranges(be, o->dev_master + k->shard_off, opt_part_pc(o, k), be->act, grad + k->shard_off,
                   o->exp_avg + k->shard_off, o->exp_avg_sq + k->shard_off, r, n, lr, hp->beta1, hp->beta2, hp->eps,
                   hp->weight_decay, bc1, bc2, g_scale);
}

// update_beside: the norms' elements now (opt_share_norms reads them next), the rest of each bucket
// on the side stream, in the order forward reads them (the highest bucket first). The same
// arithmetic as updating each bucket whole: AdamW is elementwise.
static void opt_update_beside(opt_state *o, const float *grad, float lr, float bc1, float bc2, float g_scale) {
  k_backend *be = o->m->be;
  for (int b = 0; b < o->n_buckets; b++)
    opt_update_part(o, b, o->early_ranges + o->early_first[b], o->early_first[b + 1] - o->early_first[b], grad, lr,
                    bc1, bc2, g_scale);
  for (int b = o->n_buckets - 1; b >= 0; b--) {
    be->side_begin(be);
    opt_update_part(o, b, o->late_ranges + o->late_first[b], o->late_first[b + 1] - o->late_first[b], grad, lr, bc1,
                    bc2, g_scale);
    o->upd_ticket[b] = be->side_end(be);
  }
}

void opt_update_wait(opt_state *o, int b) {
  if (!o->update_beside || o->upd_ticket[b] < 0) return;
  o->m->be->side_join_ticket(o->m->be, o->upd_ticket[b]);
  o->upd_ticket[b] = -1;
}

void opt_update_join(opt_state *o) {
  if (!o->update_beside) return;
  for (int b = 0; b < o->n_buckets; b++) opt_update_wait(o, b);
}

void opt_init(opt_state *o, model *m, grid *g, const opt_config *oc, int n_micro) {
  memset(o, 0, sizeof *o);
  o->m = m;
  o->g = g;
  o->cfg = *oc;
  o->zero = oc->shard >= OPT_SHARD_OPTIMIZER && m->dp > 1;
  o->bucket_elem = (int64_t)((double)oc->bucket_mb * (1 << 20) / sizeof(float));
  if (o->bucket_elem < 1) o->bucket_elem = 1;
  k_backend *be = m->be;
  // With parallel.shard_group the parts are shared out inside the group, and each group holds a replica.
  o->parts = o->zero ? grid_shard_comm(g)->size : 1;
  o->part_rank = o->zero ? grid_shard_comm(g)->rank : 0;
  o->replica = o->zero ? g->replica_c : NULL;
  o->shard_n = m->n_params / o->parts;
  // With ZeRO the update runs piece by piece, each piece's all-gathers starting as soon as it is
  // updated, so that they overlap the update of the next pieces.
  o->n_pieces = o->zero ? OPT_PIECES : 1;
  if (o->zero) o->grad_shard = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  opt_layout_build(o);
  if (m->grads_in_optimizer) {
    grad_shard_init(o);
    m->grads_needed = opt_on_grads_needed;
    m->grads_needed_ctx = o;
  }
  if (m->weights_in_optimizer) {
    weight_shard_init(o, oc->shard_prefetch > 0 ? oc->shard_prefetch : 1, oc->reshard_after_forward);
    m->weights_needed = opt_on_weights_needed;
    m->weights_needed_ctx = o;
  }
  // grads and weights reduce each layer from its staging slot, in bf16 there (grad_shard.c).
  if (grad_compress_on(oc, m->dp) && !o->gs) o->gc = grad_compress_init(o);
  opt_offload_init(o);  // the device share's moments: shard [0, dev_n)
  if (o->ws && oc->update_overlap && !oc->offload) opt_update_split_init(o);
  o->exp_avg = be->alloc(be, (size_t)o->dev_n * sizeof(float));
  o->exp_avg_sq = be->alloc(be, (size_t)o->dev_n * sizeof(float));
  // fp8.param_gather gathers no norms: they are shared here even where the compute copy is the master.
  const int pg = param_gather_on(oc, m, o->zero);
  if (o->zero && (m->params_c != (void *)m->params || pg || o->ws))
    o->norm_pack = be->alloc(be, (size_t)(o->norm_pack_n ? o->norm_pack_n : 1) * sizeof(float));
  if (pg) o->pg = param_gather_init(o);

  o->n_micro = n_micro > 0 ? n_micro : 1;
  o->t_group = XCALLOC(m->n_tensors, sizeof(int));
  o->t_count = XCALLOC(m->n_tensors, sizeof(int));
  o->t_final = XCALLOC(m->n_tensors, 1);
  // A tied head is the embedding: final only after the embedding's backward.
  for (int i = 0; i < m->n_tensors; i++) o->t_group[i] = opt_group(m->tensors[i].chunk, model_tensor_group(m, &m->tensors[i]));
  m->grads_ready = opt_on_grads_ready;
  m->grads_ready_ctx = o;
}

void opt_free(opt_state *o) {
  if (!o->m) return;
  k_backend *be = o->m->be;
  opt_update_join(o);
  if (o->m->grads_ready_ctx == o) {
    o->m->grads_ready = NULL;
    o->m->grads_ready_ctx = NULL;
  }
  be->free(be, o->exp_avg);
  be->free(be, o->exp_avg_sq);
  if (o->grad_shard) be->free(be, o->grad_shard);
  grad_compress_free(&o->gc, be);
  grad_shard_free(&o->gs, be);
  weight_shard_free(&o->ws, be);
  if (o->m->weights_needed_ctx == o) {
    o->m->weights_needed = NULL;
    o->m->weights_needed_ctx = NULL;
  }
  if (o->m->grads_needed_ctx == o) {
    o->m->grads_needed = NULL;
    o->m->grads_needed_ctx = NULL;
  }
  param_gather_free(&o->pg);
  if (o->norm_pack) be->free(be, o->norm_pack);
  opt_offload_free(o);
  free(o->early_ranges);
  free(o->late_ranges);
  free(o->early_first);
  free(o->late_first);
  free(o->upd_ticket);
  free(o->norm_ranges);
  free(o->upd_ranges);
  free(o->piece_first);
  free(o->piece_bucket);
  free(o->bucket_lo);
  free(o->bucket_len);
  free(o->norm_own);
  free(o->norm_all);
  free(o->t_group);
  free(o->t_count);
  free(o->t_final);
  free(o->buckets);
  o->m = NULL;
}

void opt_comm_wait(opt_state *o, comm *c, int gather) {
  if (!o->time_waits || !o->timing) {
    c->ops->wait(c);
    return;
  }
  const double t0 = timing_now(o->m->be);
  c->ops->wait(c);
  const double dt = timing_now(o->m->be) - t0;
  o->timing->dp_comm += dt;
  if (gather) o->timing->dp_gather += dt;
}

float opt_lr_at(const opt_config *hp, int64_t steps, int64_t step) {
  if (step < hp->warmup_steps) return hp->lr * (float)(step + 1) / (float)hp->warmup_steps;
  int64_t decay_steps = steps - hp->warmup_steps;
  if (decay_steps <= 0) return hp->lr;
  double progress = (double)(step - hp->warmup_steps) / (double)decay_steps;
  if (progress > 1) progress = 1;
  return (float)(hp->min_lr + 0.5 * (hp->lr - hp->min_lr) * (1 + cos(M_PI * progress)));
}

void opt_sum_sp_partial(opt_state *o, int i) {
  model *m = o->m;
  model_tensor *t = &m->tensors[i];
  if (m->sp && t->tp_replicated) o->g->tp_c->ops->all_reduce(o->g->tp_c, t->g, t->n_elem, COMM_F32, COMM_SUM);
}

// A tensor's gradient has all of this step's contributions: summed over tp where it is partial
// (opt_sum_sp_partial), on the compute stream, before any DP bucket holding it starts.
static void opt_tensor_final(opt_state *o, int i) {
  opt_sum_sp_partial(o, i);
  o->t_final[i] = 1;
}

// Starts, in bucket order, every bucket whose tensors are all final: all-reduced, or with ZeRO
// reduce-scattered (each rank's part into its grad_shard); compressed first under
// parallel.grad_compress (grad_compress.h). Gradients are already scaled by 1 / (tokens of the
// global batch), so the DP sum is the mean.
static void opt_start_buckets(opt_state *o, comm *dc) {
  if (dc->size == 1) return;
  for (; o->next_bucket < o->n_buckets; o->next_bucket++) {
    const opt_bucket *b = &o->buckets[o->next_bucket];
    for (int i = b->t_lo; i < b->t_hi; i++)
      if (!o->t_final[i]) return;
    trace_push_range("dp bucket start");
    if (o->gc)  // quantised (compute stream), exchanged compressed
      grad_compress_start(o, dc, o->next_bucket);
    else if (o->zero)
      dc->ops->reduce_scatter_start(dc, o->m->grads + b->lo, o->grad_shard + b->shard_off, b->len, COMM_F32, COMM_SUM);
    else
      dc->ops->all_reduce_start(dc, o->m->grads + b->lo, b->hi - b->lo, COMM_F32, COMM_SUM);
    trace_pop_range();
  }
}

static void opt_on_grads_ready(void *ctx, int chunk, int layer) {
  opt_state *o = ctx;
  int grp = opt_group(chunk, layer);
  if (o->gs) {
    grad_shard_ready(o, grp);
    return;
  }
  // Backward order is the reverse of the flat order: walk from the end so SP reductions go
  // out in the order the gradients were finished.
  for (int i = o->m->n_tensors - 1; i >= 0; i--)
    if (o->t_group[i] == grp && ++o->t_count[i] == o->n_micro && !o->t_final[i]) opt_tensor_final(o, i);
  // While backward runs: on the overlap communicator when there is one (fewer SMs).
  opt_start_buckets(o, o->g->dp_overlap ? o->g->dp_overlap : grid_shard_comm(o->g));
  opt_offload_grads_final(o);
}

// With ZeRO and a separate compute copy, the fp32 master weights outside this rank's shard are
// stale; but the norms (the tp-replicated tensors) are read in fp32 by forward and backward.
// Every rank packs the norm elements it owns, zeros elsewhere, and the dp sum (exact: one
// term per element is not zero) gives every rank, owner included, the same values. Started
// here; opt_unpack_norms takes the result after the wait. With offload the norms come from the
// optimizer's master (m->params is NULL) and go to m->norm_copy, which forward reads; without
// ZeRO straight there, as every rank updates every element.
static void opt_share_norms(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  float *pack = o->norm_pack ? o->norm_pack : m->norm_copy;
  if (!pack) return;  // forward reads the master itself
  if (o->norm_pack) be->zero(be, o->norm_pack, (size_t)o->norm_pack_n * sizeof(float));
  if (m->master_in_optimizer) opt_offload_norms_out(o, pack);
  for (int k = 0; !m->master_in_optimizer && k < o->n_norm_own; k++) {
    const k_range *r = &o->norm_own[k];
    be->copy(be, pack + r->offset, m->params + r->p_offset, (size_t)r->n_elem * sizeof(float));
  }
  comm *sc = grid_shard_comm(o->g);
  if (o->norm_pack) sc->ops->all_reduce_start(sc, o->norm_pack, o->norm_pack_n, COMM_F32, COMM_SUM);
}

static void opt_unpack_norms(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  if (!o->norm_pack) return;
  if (m->norm_copy) {  // laid out as the pack
    be->copy(be, m->norm_copy, o->norm_pack, (size_t)o->norm_pack_n * sizeof(float));
    return;
  }
  for (int k = 0; k < o->n_norm_all; k++) {
    const k_range *r = &o->norm_all[k];
    be->copy(be, m->params + r->p_offset, o->norm_pack + r->offset, (size_t)r->n_elem * sizeof(float));
  }
}

// Starts the all-gather of the compute copy's buckets [b0, b0 + nb) (counted from the lowest);
// with fp8.param_gather those that do not travel as codes.
static void opt_gather_start(opt_state *o, int b0, int nb) {
  comm *dc = grid_shard_comm(o->g);
  if (o->ws) return;  // gathered group by group as forward and backward need them
  if (o->pg) param_gather_start_act(o, b0, nb);
  else if (nb > 0)
    dc->ops->all_gather_regions_start(dc, o->m->params_c, o->bucket_lo + b0, o->bucket_len + b0, nb, opt_act_comm(o));
}

// After the wait for the gathers: the norms in place, and the FP8 copies remade at the next step
// (or, with fp8.param_gather, finished now).
static void opt_weights_arrived(opt_state *o) {
  opt_unpack_norms(o);
  if (o->ws) weight_shard_refresh(o);
  if (o->pg) param_gather_finish(o);
  else model_fp8_weights_changed(o->m);
}

// After this rank's part of every bucket of the compute copy changed (queued): the other ranks'
// parts gathered with ZeRO (with fp8.param_gather the FP8 weights as codes), the norms shared,
// the FP8 weights remade.
static void opt_refresh_model(opt_state *o) {
  comm *dc = grid_shard_comm(o->g);
  if (o->zero) opt_gather_start(o, 0, o->n_buckets);
  if (o->pg) param_gather_start_codes(o);
  opt_share_norms(o);
  if (o->zero) dc->ops->wait(dc);
  opt_weights_arrived(o);
}

double opt_step(opt_state *o, float lr, int64_t t) {
  model *m = o->m;
  k_backend *be = m->be;
  comm *dc = grid_shard_comm(o->g);
  // Backward is queued; exposed DP time runs from its end (on the compute stream) until every
  // bucket has arrived.
  opt_update_join(o);  // the last update's buckets that no forward gathered since (none in training)
  double t0 = o->timing ? timing_now(be) : 0;
  trace_push_range("dp sync");
  // Whatever backward did not report (a caller driving model_chunk_bwd itself) is final now.
  for (int i = m->n_tensors - 1; !o->gs && i >= 0; i--)
    if (!o->t_final[i]) opt_tensor_final(o, i);
  if (o->gs) {
    grad_shard_step_end(o);
  } else if (dc->size > 1) {
    opt_start_buckets(o, dc);  // backward is done: the rest with all of NCCL's SMs
    comm *ovl = o->g->dp_overlap;
    if (o->timing) {  // bounded host waits: a dead peer ends the job here
      if (ovl) ovl->ops->drain(ovl);
      dc->ops->drain(dc);
    }
    if (ovl) ovl->ops->wait(ovl);
    dc->ops->wait(dc);
    if (o->gc) grad_compress_finish(o);  // back to fp32 for the norm and the update
    // parallel.shard_group: the groups' reduced parts summed over the replicas.
    if (o->replica) o->replica->ops->all_reduce(o->replica, o->grad_shard, o->shard_n, COMM_F32, COMM_SUM);
  }
  memset(o->t_count, 0, (size_t)m->n_tensors * sizeof(int));
  memset(o->t_final, 0, (size_t)m->n_tensors);
  o->next_bucket = 0;
  double t1 = o->timing ? timing_now(be) : 0;
  trace_pop_range();
  trace_push_range("optimizer");
  opt_offload_join(o);  // offload_delay: the previous step's host update, before its slots are reused
  opt_offload_complete(o);  // offload_layer_wait: one a forward did not finish, likewise
  float *grad = o->zero ? o->grad_shard : m->grads;  // indexed by shard offset
  opt_offload_copy_grads(o, grad);  // the cpu engine's copies run beside the norm
  // With the sum of squares, the count of non-finite FP8 amaxes of the step (model/fp8.h).
  double sums[2] = {be->sumsq_ranges(be, grad, o->norm_ranges, o->n_norm_ranges), model_fp8_count_nonfinite(m)};
  comm *w = o->g->world;
  w->ops->all_reduce(w, sums, 2, COMM_F64, COMM_SUM);
  double norm = sums[1] > 0 ? NAN : sqrt(sums[0]);
  const opt_config *hp = &o->cfg;
  float g_scale = hp->grad_clip > 0 && norm > hp->grad_clip ? (float)(hp->grad_clip / (norm + 1e-6)) : 1.0f;
  // Adam squares each scaled gradient element in fp32: one past sqrt(FLT_MAX) ~ 1.8e19 would put
  // Inf into exp_avg_sq for good (its weight would never move again). No element exceeds the
  // norm, so a scaled norm past 1e19 (only without clipping) counts as non-finite: reported Inf.
  if (isfinite(norm) && norm * g_scale > 1e19) norm = INFINITY;
  if (!isfinite(norm)) {
    // A NaN or Inf anywhere in the gradient or an FP8 amax: no update, so the weights, moments
    // and FP8 scaling state stay finite (the caller stops the run or skips the step, and
    // model_fp8_describe_nonfinite names an amax's tensor). The norm is the same on every rank.
    const int uploaded = opt_offload_skip(o);
    be->copy_join(be);  // the cpu engine's gradient copies read m->grads
    if (m->grads) be->zero(be, m->grads, (size_t)m->n_params * sizeof(float));
    model_fp8_discard_step(m);
    if (uploaded) opt_refresh_model(o);  // the previous update's weights are all back: norms and FP8 copies follow
    trace_pop_range();
    if (o->timing) {
      o->timing->dp_comm += t1 - t0;
      o->timing->optimizer += timing_now(be) - t1;
    }
    return norm;
  }
  float bc1 = 1.0f - powf(hp->beta1, (float)t), bc2 = 1.0f - powf(hp->beta2, (float)t);
  // The update also writes the compute copy of this rank's elements (when the copy is not the
  // master itself). With ZeRO the other ranks' parts of the copy are then all-gathered, bucket by
  // bucket: only the compute copy, so the master weights outside this rank's shard are stale
  // (with offload not held at all; opt_get_params gathers them) except the norms, which forward
  // reads in fp32 (opt_share_norms).
  void *pc = m->params_c == (void *)m->params ? NULL : m->params_c;
  if (o->update_beside) opt_update_beside(o, grad, lr, bc1, bc2, g_scale);
  // With offload, the piece's device share updates first (queued), then its host buckets.
  for (int k = 0; !o->update_beside && k < o->n_pieces; k++) {
    int r0 = o->piece_first[k], r1 = o->piece_first[k + 1] < o->n_dev_ranges ? o->piece_first[k + 1] : o->n_dev_ranges;
    if (r1 > r0)
      be->adamw_ranges(be, m->params, pc, be->act, grad, o->exp_avg, o->exp_avg_sq, o->upd_ranges + r0, r1 - r0, lr,
                       hp->beta1, hp->beta2, hp->eps, hp->weight_decay, bc1, bc2, g_scale);
    int b0 = o->piece_bucket[k], nb = o->piece_bucket[k + 1] - b0;
    opt_offload_update(o, b0, b0 + nb, grad, lr, bc1, bc2, g_scale);
    be->copy_join(be);  // the cpu engine's new weights are in place before they are gathered or read
    if (o->zero) opt_gather_start(o, b0, nb);
  }
  if (o->pg) param_gather_start_codes(o);  // every part of every FP8 weight is updated now
  opt_share_norms(o);
  // Overlaps the all-gathers. offload_layer_wait: the pending host buckets' gradients are zeroed
  // as each updates (their copies to host read them).
  if (m->grads) be->zero(be, m->grads, (size_t)opt_offload_pending_lo(o) * sizeof(float));
  if (o->zero) dc->ops->wait(dc);
  opt_weights_arrived(o);
  opt_offload_start_delayed(o, lr, bc1, bc2, g_scale);  // after the norms: it writes master weights
  trace_pop_range();
  if (o->timing) {
    o->timing->dp_comm += t1 - t0;
    o->timing->optimizer += timing_now(be) - t1;
  }
  return norm;
}

void opt_flush(opt_state *o) {
  opt_update_join(o);
  opt_offload_complete(o);
  opt_offload_join(o);
  if (!o->upload_pending) return;
  // The copies back: the host buckets only (the highest, counted from the lowest), as the
  // device share's were updated in their step and have no gradient now.
  opt_offload_update(o, o->n_buckets - o->n_host, o->n_buckets, NULL, 0, 0, 0, 0);
  o->upload_pending = 0;
  o->m->be->copy_join(o->m->be);
  opt_refresh_model(o);
}

void opt_weights_set(opt_state *o) {
  if (!o->m->master_in_optimizer) {
    model_sync_compute_weights(o->m);  // every rank holds the whole master
    return;
  }
  opt_offload_cast_master(o);
  opt_refresh_model(o);
}
