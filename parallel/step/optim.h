// AdamW over this rank's parameters, and the gradient synchronisation that precedes it:
// sequence-parallel norm gradients reduced over tp, DP gradients averaged in buckets during
// backward (with the distributed optimizer, ZeRO-1, each bucket reduce-scattered: every rank
// updates its part of every bucket), the global gradient norm, clipping, the update, and (ZeRO-1)
// the all-gather of the updated compute weights.
// Parameters are fp32 and are the master weights; moments are fp32. With optimizer.offload=host
// the optimizer holds the master weights itself (the model has no m->params), and those of a share
// of the buckets live in host memory with their moments, sharded like them (optim_offload.c);
// the host's cores may finish their update in the next forward, layer by layer (layer_wait).
//
// The files and what each includes (an arrow: includes and calls; none points up):
//
//   optim.h  opt_init, opt_step, opt_flush, opt_free; the weights' and state's ins and outs
//     optim.c     the step: DP buckets started during backward, the norm, the engine's update
//                 piece by piece, ZeRO's gathers, the after-update hooks
//     optim_io.c  get and set the master weights and moments (checkpoints, initialisation)
//       |
//       +--> grad_shard.h    parallel.shard=grads: staging and reduce-scatters
//       +--> weight_shard.h  parallel.shard=weights: the layers' gathers (a hook: refresh)
//       +--> param_gather.h  fp8.param_gather: FP8 codes gathered (a hook: start, finish)
//       +--> grad_compress.h parallel.grad_compress: compressed bucket reductions
//       +--> optim_engine.h  the update engines, one chosen at opt_init:
//       |      optim_device.c   AdamW on the device (optimizer.update_overlap: beside the forward)
//       |      optim_offload.c  the host share (zero-copy GPU or host cores; delay, layer_wait)
//       |      (every one of the five above includes optim_core.h only)
//       v
//   optim_core.h  opt_state, buckets, parts, shard, the engine and hook interfaces, the state's
//                 placement and AdamW of a part, opt_comm_wait, opt_sum_sp_partial, opt_act_comm
//     optim_layout.c  buckets, ranges, pieces;  optim_core.c  the rest
//
// Calls up the graph go through the tables optim.c fills at opt_init: weight_shard waits for a
// bucket's update through o->engine (opt_update_wait), and the work after every change of the
// weights runs as o->hooks, registered in this order (started in it, finished in reverse):
//   fp8.param_gather's codes (param_gather_start_codes / param_gather_finish), or with FP8 the
//   invalidation of the FP8 weight copies (model_fp8_weights_changed);
//   parallel.shard=weights' refresh (weight_shard_refresh);
//   the norms' sharing (opt_share_norms / opt_unpack_norms).
// The model reaches the optimizer through its callbacks (grads_ready, grads_needed,
// weights_needed), which optim.c (and the offload engine, for layer_wait) sets.
#ifndef TRAINER_OPTIM_H
#define TRAINER_OPTIM_H

#include <stdint.h>
#include "parallel/step/optim_core.h"

// n_micro: backward passes per chunk and step (global_batch / (dp * micro_batch)).
void opt_init(opt_state *o, model *m, grid *g, const opt_config *oc, int n_micro);
void opt_free(opt_state *o);
// Learning rate at step (0-based) of a run of steps: linear warmup, then cosine decay to min_lr.
float opt_lr_at(const opt_config *oc, int64_t steps, int64_t step);
// Gradient synchronisation is started during backward through m->grads_ready (set by
// opt_init; n_micro = global_batch / (dp * micro_batch) backward passes per chunk and step).
// Synchronises gradients, clips, updates parameters with learning rate lr as step t (1-based,
// for bias correction), zeroes the gradients. Returns the global gradient norm before clipping.
// When that norm is NaN or Inf (the same on every rank) nothing is updated: the gradients are
// zeroed and the non-finite norm is returned. So too (NaN) when any rank's FP8 casts saw a
// non-finite amax this step (model_fp8_count_nonfinite), whose amaxes are then dropped. So too (Inf)
// when the norm after clipping exceeds 1e19 (without train.grad_clip): an element's square would
// overflow Adam's fp32 second moment. With cfg.check_update, so too (NaN, and o->update_refused
// set) when the update, tried first on copies of the state, would leave a master weight or moment
// non-finite or the weights' norm beyond bf16's range.
double opt_step(opt_state *o, float lr, int64_t t);
// Collective. Completes an update that offload_delay left in flight: joins it and puts its
// weights in place (compute copy, gathered over dp with ZeRO, and the norms), as a step would;
// or the one offload_layer_wait left pending. Checkpoints call it first, so a run resumed from
// one continues bitwise. No-op otherwise.
void opt_flush(opt_state *o);
// Master weights and moments of this rank's whole flat buffer, into host arrays of m->n_params
// elements; and the moments back. Only where the optimizer is not sharded over dp (checked);
// sharded, each rank takes its shard alone (opt_get_shard below).
void opt_get_params(opt_state *o, float *params_host);
void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host);
void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host);
// Setting the weights (the random init, a checkpoint, Hugging Face weights): opt_set_tensor puts
// tensor i's block on this rank (its n_elem values, host memory) into the master weights, all of
// it where the model holds them (m->params), only this rank's shard of it with offload; after
// every tensor, opt_weights_set (collective over dp) refreshes what the model reads from the
// master: the compute copy (with offload each rank casts its shard and the parts are gathered),
// the norms' copy and the FP8 weights. opt_set_params does both from a whole flat host array
// (m->n_params); opt_init_weights from model_init_tensor, tensor by tensor.
void opt_set_tensor(opt_state *o, int i, const float *block);
void opt_weights_set(opt_state *o);
void opt_set_params(opt_state *o, const float *params_host);
void opt_init_weights(opt_state *o, uint64_t seed);
// This rank's shard alone, where the optimizer is sharded over dp (parallel.shard >= optimizer,
// dp > 1; opt_sharded), so that a checkpoint holds each part once and no rank gathers the rest:
// opt_shard_ranges lists its runs (offset in the shard, p_offset in the flat buffer, each inside
// one tensor; *n of them); opt_shard_writes says whether this rank writes them (with shard
// groups, the first group's ranks do); opt_get_shard copies the master weights and both moments
// (shard_n elements each, shard order) into host memory, and opt_set_shard puts them back and
// refreshes what the model reads (collective over dp, as opt_weights_set).
int opt_sharded(const opt_state *o);
int64_t opt_shard_elems(const opt_state *o);
const k_range *opt_shard_ranges(const opt_state *o, int *n);
int opt_shard_writes(const opt_state *o);
void opt_get_shard(opt_state *o, float *params_host, float *exp_avg_host, float *exp_avg_sq_host);
void opt_set_shard(opt_state *o, const float *params_host, const float *exp_avg_host, const float *exp_avg_sq_host);

#endif
