// Gradient synchronisation and the optimizer's step (see optim.h): the model's callbacks, the DP
// buckets, the norm and clipping, the engine's update piece by piece with ZeRO's gathers, and the
// after-update hooks.
#include "parallel/step/optim.h"
#include "parallel/step/grad_compress.h"
#include "parallel/step/grad_shard.h"
#include "parallel/step/optim_engine.h"
#include "parallel/step/param_gather.h"
#include "parallel/step/weight_shard.h"
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

// With ZeRO and a separate compute copy, the fp32 master weights outside this rank's shard are
// stale; but the norms (the tp-replicated tensors) are read in fp32 by forward and backward.
// Every rank packs the norm elements it owns, zeros elsewhere, and the dp sum (exact: one
// term per element is not zero) gives every rank, owner included, the same values. Started
// here; opt_unpack_norms takes the result after the wait. Where the optimizer holds the master
// (m->params is NULL) the norms go to m->norm_copy, which forward reads; without ZeRO straight
// there, as every rank updates every element. Those of an update still pending are left to it
// (the engine's pending_lo).
static void opt_share_norms(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  float *pack = o->norm_pack ? o->norm_pack : m->norm_copy;
  if (o->norm_pack) be->zero(be, o->norm_pack, (size_t)o->norm_pack_n * sizeof(float));
  if (m->master_in_optimizer) opt_master_norms_out(o, pack, 0, o->engine.pending_lo(o));
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

// FP8's weight copies are remade from the new compute copy at the next step.
static void opt_fp8_weights_changed(opt_state *o) { model_fp8_weights_changed(o->m); }

static const opt_hook param_gather_hook = {"fp8.param_gather", param_gather_start_codes, param_gather_finish};
static const opt_hook fp8_hook = {"FP8 weight copies", NULL, opt_fp8_weights_changed};
static const opt_hook weight_shard_hook = {"parallel.shard=weights", NULL, weight_shard_refresh};
static const opt_hook norms_hook = {"norms", opt_share_norms, opt_unpack_norms};

static void opt_hook_add(opt_state *o, const opt_hook *h) {
  CHECK(o->n_hooks < OPT_MAX_HOOKS, "optimizer: no room for hook %s (%d at most)", h->name, OPT_MAX_HOOKS);
  o->hooks[o->n_hooks++] = h;
}

// In the order optim.h lists: the FP8 codes' gather starts before the norms' all-reduce (both on
// the shard communicator) and is finished last, once the norms and the weights' slots are in place.
static void opt_hooks_register(opt_state *o) {
  if (o->pg) opt_hook_add(o, &param_gather_hook);
  else if (o->m->fp8) opt_hook_add(o, &fp8_hook);
  if (o->ws) opt_hook_add(o, &weight_shard_hook);
  if (o->norm_pack || o->m->norm_copy) opt_hook_add(o, &norms_hook);
}

// Once this rank's parts of the compute copy are queued and their ZeRO gathers started.
static void opt_hooks_start(opt_state *o) {
  for (int i = 0; i < o->n_hooks; i++)
    if (o->hooks[i]->start) o->hooks[i]->start(o);
}

// Waits for ZeRO's gathers (and the hooks' collectives on the same communicator), then finishes
// the hooks in the reverse order.
static void opt_hooks_finish(opt_state *o) {
  comm *dc = grid_shard_comm(o->g);
  if (o->zero) dc->ops->wait(dc);
  for (int i = o->n_hooks - 1; i >= 0; i--)
    if (o->hooks[i]->finish) o->hooks[i]->finish(o);
}

// Starts ZeRO's all-gather of the compute copy's buckets [b0, b0 + nb) (counted from the lowest);
// with fp8.param_gather those that do not travel as codes. None with the weights sharded: they are
// gathered group by group as forward and backward need them.
static void opt_gather_start(opt_state *o, int b0, int nb) {
  comm *dc = grid_shard_comm(o->g);
  if (!o->zero || o->ws) return;
  if (o->pg) param_gather_start_act(o, b0, nb);
  else if (nb > 0)
    dc->ops->all_gather_regions_start(dc, o->m->params_c, o->bucket_lo + b0, o->bucket_len + b0, nb, opt_act_comm(o));
}

// After this rank's part of every bucket of the compute copy changed (queued): the other ranks'
// parts gathered with ZeRO, and the hooks run.
static void opt_refresh_model(opt_state *o) {
  opt_gather_start(o, 0, o->n_buckets);
  opt_hooks_start(o);
  opt_hooks_finish(o);
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
  // updated, so that they overlap the update of the next pieces (with the weights sharded there
  // are no such gathers).
  o->n_pieces = o->zero && !m->weights_in_optimizer ? OPT_PIECES : 1;
  if (o->zero) o->grad_shard = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  opt_layout_build(o);
  if (m->grads_in_optimizer) {
    grad_shard_init(o);
    m->grads_needed = opt_on_grads_needed;
    m->grads_needed_ctx = o;
  }
  if (oc->offload) opt_offload_engine_init(o);
  else opt_device_engine_init(o);
  opt_engine_fill(&o->engine);
  opt_state_alloc(o);
  // train.skip_nonfinite: the update's trial buffer (opt_update_finite), blocks of at most
  // OPT_TRIAL_MAX elements of the weights, both moments and the gradient.
  if (oc->check_update) {
    o->trial_n = opt_trial_elems(o->shard_n);
    o->trial = be->alloc(be, 4 * (size_t)o->trial_n * sizeof(float));
  }
  if (m->weights_in_optimizer) {
    weight_shard_init(o, oc->shard_prefetch > 0 ? oc->shard_prefetch : 1, oc->reshard_after_forward);
    m->weights_needed = opt_on_weights_needed;
    m->weights_needed_ctx = o;
  }
  // grads and weights reduce each layer from its staging slot, in bf16 there (grad_shard.c).
  if (grad_compress_on(oc, m->dp) && !o->gs) o->gc = grad_compress_init(o);
  // fp8.param_gather gathers no norms: they are shared here even where the compute copy is the master.
  const int pg = param_gather_on(oc, m, o->zero);
  if (o->zero && (m->params_c != (void *)m->params || pg || o->ws))
    o->norm_pack = be->alloc(be, (size_t)(o->norm_pack_n ? o->norm_pack_n : 1) * sizeof(float));
  if (pg) o->pg = param_gather_init(o);
  opt_hooks_register(o);

  o->n_micro = n_micro > 0 ? n_micro : 1;
  o->t_group = XCALLOC(m->n_tensors, sizeof(int));
  o->t_count = XCALLOC(m->n_tensors, sizeof(int));
  o->t_final = XCALLOC(m->n_tensors, 1);
  // A tied head is the embedding: final only after the embedding's backward.
  for (int i = 0; i < m->n_tensors; i++) o->t_group[i] = opt_group(m->tensors[i].chunk, model_tensor_group(m, &m->tensors[i]));
  m->grads_ready = opt_on_grads_ready;
  m->grads_ready_ctx = o;
}

// Clears the model's callback fields that still name this optimizer.
static void opt_unhook_model(opt_state *o) {
  model *m = o->m;
  if (m->grads_ready_ctx == o) m->grads_ready = NULL, m->grads_ready_ctx = NULL;
  if (m->grads_needed_ctx == o) m->grads_needed = NULL, m->grads_needed_ctx = NULL;
  if (m->weights_needed_ctx == o) m->weights_needed = NULL, m->weights_needed_ctx = NULL;
}

void opt_free(opt_state *o) {
  if (!o->m) return;
  k_backend *be = o->m->be;
  o->engine.free(o);
  opt_unhook_model(o);
  opt_state_free(o);
  if (o->grad_shard) be->free(be, o->grad_shard);
  grad_compress_free(&o->gc, be);
  grad_shard_free(&o->gs, be);
  weight_shard_free(&o->ws, be);
  param_gather_free(&o->pg);
  if (o->norm_pack) be->free(be, o->norm_pack);
  if (o->trial) be->free(be, o->trial);
  opt_layout_free(o);
  free(o->t_group);
  free(o->t_count);
  free(o->t_final);
  o->m = NULL;
}

float opt_lr_at(const opt_config *hp, int64_t steps, int64_t step) {
  if (step < hp->warmup_steps) return hp->lr * (float)(step + 1) / (float)hp->warmup_steps;
  int64_t decay_steps = steps - hp->warmup_steps;
  if (decay_steps <= 0) return hp->lr;
  double progress = (double)(step - hp->warmup_steps) / (double)decay_steps;
  if (progress > 1) progress = 1;
  return (float)(hp->min_lr + 0.5 * (hp->lr - hp->min_lr) * (1 + cos(M_PI * progress)));
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
  o->engine.grads_final(o);
}

// Backward is queued: every gradient final, every bucket reduced (its part into grad_shard with
// ZeRO), and the counts of the next step started.
static void opt_sync_grads(opt_state *o) {
  model *m = o->m;
  comm *dc = grid_shard_comm(o->g);
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
}

// The global norm of grad (this rank's shard), and in *g_scale the clipping's factor. NaN when
// any rank's FP8 casts saw a non-finite amax this step (model/fp8.h); Inf when the clipped norm
// exceeds 1e19: Adam squares each scaled gradient element in fp32, and one past sqrt(FLT_MAX) ~
// 1.8e19 would put Inf into exp_avg_sq for good (its weight would never move again). No element
// exceeds the norm, so a scaled norm past 1e19 (only without clipping) counts as non-finite.
static double opt_grad_norm(opt_state *o, const float *grad, float *g_scale) {
  k_backend *be = o->m->be;
  double sums[2] = {be->sumsq_ranges(be, grad, o->norm_ranges, o->n_norm_ranges), model_fp8_count_nonfinite(o->m)};
  comm *w = o->g->world;
  w->ops->all_reduce(w, sums, 2, COMM_F64, COMM_SUM);
  double norm = sums[1] > 0 ? NAN : sqrt(sums[0]);
  const opt_config *hp = &o->cfg;
  *g_scale = hp->grad_clip > 0 && norm > hp->grad_clip ? (float)(hp->grad_clip / (norm + 1e-6)) : 1.0f;
  if (isfinite(norm) && norm * *g_scale > 1e19) norm = INFINITY;
  return norm;
}

// cfg.check_update: the step's update tried on copies, a block of this rank's update ranges at a
// time: the master weights, moments and gradient of the ranges packed into the trial buffer, the
// same adamw_ranges run there, and the sums of squares of the new weights and of the new moments
// read. 1 when every rank's are finite and the weights' norm (a bound on each) stays below bf16's
// largest value, which the compute copy must hold. The same arithmetic as the update itself
// (AdamW is elementwise), so it says exactly whether the update would make a value non-finite.
// One block of the trial: the n packed ranges (used elements) updated in the trial buffer. 1 when
// a new weight or moment is non-finite or the weights' norm reaches bf16's largest value.
static int opt_trial_block(opt_state *o, const k_range *packed, int n, int64_t used, const opt_hparams *h) {
  k_backend *be = o->m->be;
  const opt_config *hp = &o->cfg;
  const int64_t cap = o->trial_n;
  float *tp = o->trial;
  be->adamw_ranges(be, tp, NULL, be->act, tp + 3 * cap, tp + cap, tp + 2 * cap, packed, n, h->lr, hp->beta1, hp->beta2,
                   hp->eps, hp->weight_decay, h->bc1, h->bc2, h->g_scale);
  const k_range w = {.offset = 0, .n_elem = used};
  const k_range mv[2] = {{.offset = cap, .n_elem = used}, {.offset = 2 * cap, .n_elem = used}};
  const double sp = be->sumsq_ranges(be, tp, &w, 1), smv = be->sumsq_ranges(be, tp, mv, 2);
  return !isfinite(sp) || !isfinite(smv) || sqrt(sp) >= 3.38e38;
}

static int opt_update_finite(opt_state *o, const float *grad, const opt_hparams *h) {
  model *m = o->m;
  k_backend *be = m->be;
  const int64_t cap = o->trial_n;
  float *tp = o->trial, *tm = tp + cap, *tv = tm + cap, *tg = tv + cap;
  k_range *packed = XMALLOC(sizeof *packed * (size_t)(o->n_upd_ranges + 1));
  double bad = 0;
  int n = 0;
  int64_t used = 0;
  for (int i = 0; i < o->n_upd_ranges; i++) {
    const k_range *r = &o->upd_ranges[i];
    for (int64_t at = 0; at < r->n_elem;) {
      if (used == cap) {
        bad += opt_trial_block(o, packed, n, used, h);
        n = 0, used = 0;
      }
      const int64_t len = r->n_elem - at < cap - used ? r->n_elem - at : cap - used, off = r->offset + at;
      const size_t bytes = (size_t)len * sizeof(float);
      be->copy(be, tp + used, m->master_in_optimizer ? opt_state_at(o, OPT_MASTER, off) : m->params + r->p_offset + at,
               bytes);
      be->copy(be, tm + used, opt_state_at(o, OPT_EXP_AVG, off), bytes);
      be->copy(be, tv + used, opt_state_at(o, OPT_EXP_AVG_SQ, off), bytes);
      be->copy(be, tg + used, grad + off, bytes);
      packed[n++] = (k_range){.offset = used, .n_elem = len, .decay = r->decay, .p_offset = used};
      used += len, at += len;
    }
  }
  if (used) bad += opt_trial_block(o, packed, n, used, h);
  free(packed);
  comm *world = o->g->world;
  world->ops->all_reduce(world, &bad, 1, COMM_F64, COMM_SUM);
  return bad == 0;
}

// A NaN or Inf anywhere in the gradient or an FP8 amax: no update, so the weights, moments and
// FP8 scaling state stay finite (the caller stops the run or skips the step, and
// model_fp8_describe_nonfinite names an amax's tensor). The norm is the same on every rank.
static void opt_skip_update(opt_state *o) {
  model *m = o->m;
  const int changed = o->engine.skip(o);
  if (m->grads) m->be->zero(m->be, m->grads, (size_t)m->n_params * sizeof(float));
  model_fp8_discard_step(m);
  if (changed) opt_refresh_model(o);  // an earlier update's weights are all in place: the hooks follow them
}

// The update also writes the compute copy of this rank's elements (when the copy is not the
// master itself). With ZeRO the other ranks' parts of the copy are then all-gathered, piece by
// piece: only the compute copy, so the master weights outside this rank's shard are stale (where
// the optimizer holds the master, not held at all; a checkpoint takes each rank's shard) except the norms,
// which forward reads in fp32 (opt_share_norms).
static void opt_update(opt_state *o, const float *grad, const opt_hparams *h) {
  model *m = o->m;
  for (int k = 0; k < o->n_pieces; k++) {
    o->engine.update_piece(o, k, grad, h);
    opt_gather_start(o, o->piece_bucket[k], o->piece_bucket[k + 1] - o->piece_bucket[k]);
  }
  opt_hooks_start(o);
  // Overlaps the all-gathers. offload_layer_wait: the pending host buckets' gradients are zeroed
  // as each updates (their copies to host read them).
  if (m->grads) m->be->zero(m->be, m->grads, (size_t)o->engine.pending_lo(o) * sizeof(float));
  opt_hooks_finish(o);
  o->engine.end(o, h);
}

double opt_step(opt_state *o, float lr, int64_t t) {
  model *m = o->m;
  k_backend *be = m->be;
  // Backward is queued; exposed DP time runs from its end (on the compute stream) until every
  // bucket has arrived.
  o->engine.settle(o);  // what the last update left to the forward that it did not need (none in training)
  double t0 = o->timing ? timing_now(be) : 0;
  trace_push_range("dp sync");
  opt_sync_grads(o);
  double t1 = o->timing ? timing_now(be) : 0;
  trace_pop_range();
  trace_push_range("optimizer");
  const float *grad = o->zero ? o->grad_shard : m->grads;  // indexed by shard offset
  o->engine.begin(o, grad);
  float g_scale;
  double norm = opt_grad_norm(o, grad, &g_scale);
  const opt_config *hp = &o->cfg;
  const opt_hparams h = {lr, 1.0f - powf(hp->beta1, (float)t), 1.0f - powf(hp->beta2, (float)t), g_scale};
  o->update_refused = isfinite(norm) && hp->check_update && !opt_update_finite(o, grad, &h);
  if (o->update_refused) norm = NAN;
  if (isfinite(norm)) opt_update(o, grad, &h);
  else opt_skip_update(o);
  trace_pop_range();
  if (o->timing) {
    o->timing->dp_comm += t1 - t0;
    o->timing->optimizer += timing_now(be) - t1;
  }
  return norm;
}

void opt_flush(opt_state *o) {
  o->engine.settle(o);
  if (o->engine.flush(o)) opt_refresh_model(o);
}

void opt_weights_set(opt_state *o) {
  if (o->m->master_in_optimizer) opt_master_cast(o);
  else model_sync_compute_weights(o->m);  // every rank holds the whole master
  opt_refresh_model(o);
}
