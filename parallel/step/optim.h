// AdamW over this rank's parameters, and the gradient synchronisation that precedes it:
// sequence-parallel norm gradients reduced over tp, DP gradients averaged in buckets during
// backward (with the distributed optimizer, ZeRO-1, each bucket reduce-scattered: every rank
// updates its part of every bucket), the global gradient norm, clipping, the update, and (ZeRO-1)
// the all-gather of the updated compute weights.
// Parameters are fp32 and are the master weights; moments are fp32. With optimizer.offload=host
// the optimizer holds the master weights itself (the model has no m->params), and those of a share
// of the buckets live in host memory with their moments, sharded like them (optim_offload.c);
// the host's cores may finish their update in the next forward, layer by layer (layer_wait).
#ifndef TRAINER_OPTIM_H
#define TRAINER_OPTIM_H

#include <stdint.h>
#include "model/model.h"
#include "parallel/comm/grid.h"
#include "parallel/step/optim_config.h"
#include "parallel/comm/timing.h"

// A DP bucket: flat elements [lo, hi), overlapping tensors [t_lo, t_hi); cut into parts of len
// elements (one per dp rank with ZeRO), this rank's part at shard_off in its shard.
typedef struct opt_bucket {
  int64_t lo, hi, len, shard_off;
  int t_lo, t_hi;
  int group;                // parallel.shard=grads: the group of tensors it is (opt_group); else -1
} opt_bucket;

// The id of group `layer` of chunk (model.h's hooks: a layer's index, MODEL_GRADS_HEAD or
// MODEL_GRADS_EMBED) in the optimizer's tables.
static inline int opt_group(int chunk, int layer) { return chunk * 4096 + layer + 2; }

typedef struct opt_state {
  model *m;
  grid *g;
  opt_config cfg;
  int zero;                 // distributed optimizer over dp
  int64_t bucket_elem;      // DP bucket size
  int parts, part_rank;      // each bucket's parts (the shard group's size, dp unless parallel.shard_group, with
                            // ZeRO; else 1), and which is this rank's
  comm *replica;            // parallel.shard_group: the ranks holding the same parts in the other groups; else NULL
  int64_t shard_n;          // elements this rank updates: its part of every bucket (see opt_bucket)
  float *exp_avg, *exp_avg_sq;  // (shard_n) backend memory
  float *grad_shard;        // (shard_n) ZeRO only
  struct grad_shard *gs;    // parallel.shard=grads: the gradients' staging (grad_shard.h); NULL = m->grads
  struct weight_shard *ws;  // parallel.shard=weights: the compute copy's part and slots (weight_shard.h); NULL =
                            // m->params_c
  struct grad_compress *gc;  // parallel.grad_compress (dp > 1): grad_compress.h; NULL = fp32
  struct param_gather *pg;  // fp8.param_gather (ZeRO, FP8): param_gather.h; NULL = the compute copy gathered
  float *norm_pack;         // (norm_pack_n) ZeRO with a separate compute copy: see opt_share_norms
  int64_t norm_pack_n;      // elements of all norm tensors (optim_layout.c)
  step_timing *timing;      // gradient-sync and update time are added here; NULL = not timed
  int time_waits;           // log.time_dp: also the waits of forward and backward for sharded gradients' and
                            // weights' collectives (a sync around each), into timing->dp_comm
  // Overlap of the DP reduction with backward (model.grads_ready): a tensor's gradient is final
  // once its group was reported n_micro times in a step; a bucket is started once every tensor
  // it overlaps is final. Buckets start in a fixed order (last first), the same on every rank.
  int n_micro;              // backward passes per chunk and step
  int *t_group;             // (n_tensors) chunk * 4096 + (layer + 2): what model_chunk_bwd reports
  int *t_count;             // (n_tensors) reports received this step
  char *t_final;            // (n_tensors) final this step (tp-reduced under SP)
  opt_bucket *buckets;      // (n_buckets) from the end of the flat buffer to its start
  int n_buckets, next_bucket;
  k_range *norm_ranges, *upd_ranges;  // counted in the norm; updated (offset in the shard, p_offset flat)
  int n_norm_ranges, n_upd_ranges;
  int n_pieces;             // the update's pieces: 1, or with ZeRO a few (see opt_init)
  int *piece_first;         // (n_pieces + 1) piece k's update ranges start at upd_ranges[piece_first[k]]
  int *piece_bucket;        // (n_pieces + 1) and its buckets, counted from the lowest
  int64_t *bucket_lo, *bucket_len;  // (n_buckets) each bucket's lo and part length, lowest first
  k_range *norm_all;        // every norm tensor: offset in norm_pack, p_offset flat
  k_range *norm_own;        // the norm elements this rank updates, the same way
  int n_norm_all, n_norm_own;
  // optimizer.offload (optim_offload.c). The master weights are then the optimizer's, in shard
  // order like the moments: only this rank's part of every bucket (m->params is NULL). Buckets
  // [0, n_host) (the highest, which backward finishes first) keep their state in host memory:
  // master weights in host_master, moments in host_m / host_v; in shard order they are [dev_n,
  // shard_n), and the three are indexed from dev_n. The other buckets (shard [0, dev_n)) keep
  // theirs in backend memory: master weights in dev_master, moments in exp_avg / exp_avg_sq.
  // Forward reads the norms from m->norm_copy, refreshed from master_norms after every update
  // (opt_share_norms). Without offload n_host is 0, dev_n shard_n, and upd_ranges[0,
  // n_dev_ranges) update the whole shard as before; with offload n_dev_ranges is 0 and every
  // bucket updates on its own (opt_offload_update).
  int n_host;
  int64_t dev_n;
  int n_dev_ranges;
  float *host_master;       // (shard_n - dev_n) backend host memory
  float *host_m, *host_v;   // (shard_n - dev_n) backend host memory
  float *dev_master;        // (dev_n) backend memory, offload only
  int64_t host_bytes;       // backend host memory the optimizer's state takes on this rank
  k_range *part_ranges;     // bucket b's update ranges from part_first[b], offsets from its part's start
  int *part_first;          // (n_buckets + 1)
  k_range *master_norms;    // the norm elements this rank updates: offset in the shard, p_offset in m->norm_copy
  int n_master_norms;
  // The cpu engine (offload_update=cpu) takes the host buckets from the lowest (j = 0 is bucket
  // n_host - 1): bucket j's gradient part is copied into slot j % n_slots of host_g (ticket
  // grad_ticket[j]), the host's cores update it and write the new compute weights into the same
  // slot of host_pc, which is copied back into the compute copy; then the copy of bucket
  // j + n_slots starts into the freed slot.
  int n_slots;
  int64_t slot_elem;        // elements of a slot: the longest bucket part
  float *host_g;            // (n_slots, slot_elem)
  void *host_pc;            // (n_slots, slot_elem) in the backend's activation dtype
  int64_t *grad_ticket;     // (n_host)
  int64_t last_ticket;      // the newest copy queued
  const float *grad_src;    // the gradient the copies read (this step's)
  char *early;              // (n_host) per host bucket j: its gradient copy (1) and, with
                            // offload_delay, its new weights' copy back (2) started during backward
  // offload_delay: every host bucket has its own slot; the host update of a step runs on a thread
  // of its own (struct opt_delay, optim_offload.c) until the next step's opt_step (or opt_flush)
  // joins it, and its new compute weights wait in host_pc (upload_pending) for that step to
  // copy them back.
  struct opt_delay *delay;
  int upload_pending;
  // offload_layer_wait (the cpu engine undelayed, dp 1: layer_wait set): opt_step updates
  // the device share and leaves the host buckets pending, with the step's hyper-parameters in
  // pend; the next forward updates them through m->weights_needed, from the lowest, as far as
  // the group it is about to run reads, and its compute stream waits for those buckets' copies
  // back only. As each bucket's update finishes its norms are refreshed and its gradient (read
  // by its copy to host until then) is zeroed.
  int layer_wait;
  int n_done;               // host buckets updated, from the lowest (j < n_done); n_host: none pending
  struct { float lr, bc1, bc2, g_scale; } pend;
  // optimizer.update_overlap (parallel.shard=weights, the update on the GPU): opt_step updates
  // the norms' elements at once (they are shared before the next forward) and each bucket's
  // other elements on the backend's side stream, in the order forward reads the buckets; the
  // gather of a bucket's weights first makes the compute stream wait for its update
  // (opt_update_wait). Each bucket's update ranges (part_ranges) split so: early (the norms)
  // and late, offsets from its part's start.
  int update_beside;
  k_range *early_ranges, *late_ranges;
  int *early_first, *late_first;  // (n_buckets + 1)
  int64_t *upd_ticket;      // (n_buckets) the side stream's ticket of bucket b's update; -1: nothing to wait for
} opt_state;

// Under sequence parallelism the gradients of tp-replicated tensors (norms) are partial per tp
// rank (each saw only its sequence shard): tensor i's is summed over tp here (compute stream);
// a no-op for the others.
void opt_sum_sp_partial(opt_state *o, int i);
// The bucket that is group grp (opt_group) when buckets are groups (model.grads_in_optimizer).
int opt_bucket_of_group(const opt_state *o, int grp);
// update_beside: the compute stream waits for bucket b's update, if it is in flight (opt_update_join:
// for every bucket's). No-op otherwise.
void opt_update_wait(opt_state *o, int b);
void opt_update_join(opt_state *o);
// AdamW over n ranges r of bucket b's part (offsets from the part's start; its state in backend
// memory): master weights, moments and this rank's part of the compute copy.
void opt_update_part(opt_state *o, int b, const k_range *r, int n, const float *grad, float lr, float bc1, float bc2,
                     float g_scale);
// comm's wait (the compute stream waits for the collectives started on comm); with time_waits
// timed into timing->dp_comm, with a sync before and after (parallel/comm/timing.h).
// gather: the wait is for a weights' all-gather (also into timing->dp_gather).
void opt_comm_wait(opt_state *o, comm *c, int gather);

// The wire type of the compute copy's all-gather: the backend's activation dtype.
static inline comm_dtype opt_act_comm(const opt_state *o) { return o->m->be->act == K_BF16 ? COMM_BF16 : COMM_F32; }

// n_micro: backward passes per chunk and step (global_batch / (dp * micro_batch)).
void opt_init(opt_state *o, model *m, grid *g, const opt_config *oc, int n_micro);
// Builds the buckets, the shard's ranges, the pieces and the norm packing from o->m, o->parts, o->part_rank,
// o->bucket_elem and o->n_pieces (optim_layout.c; opt_init calls it).
void opt_layout_build(opt_state *o);
// This rank's part of bucket k: its first element in the flat buffer.
int64_t opt_part_lo(const opt_state *o, const opt_bucket *k);
// Where the compute copy of this rank's part of bucket k lives: in m->params_c at opt_part_lo, or
// with parallel.shard=weights in the optimizer's part of the compute copy.
void *opt_part_pc(const opt_state *o, const opt_bucket *k);
// optimizer.offload (optim_offload.c): after opt_layout_build, splits the buckets into the host
// share and the device share and allocates the host state.
void opt_offload_init(opt_state *o);
void opt_offload_free(opt_state *o);
// The cpu engine: copies the host share's gradient (grad: m->grads, or the ZeRO shard) to host.
void opt_offload_copy_grads(opt_state *o, const float *grad);
// Called as backward finishes gradients: with dp = 1, starts the copies of the host buckets whose
// gradients are final, from the lowest, into the free slots.
void opt_offload_grads_final(opt_state *o);
// A step whose update is skipped: completes what opt_offload_grads_final began to copy back;
// 1 if it did (the norms and FP8 copies must then follow the new weights).
int opt_offload_skip(opt_state *o);
// Updates the host buckets among buckets [asc_lo, asc_hi) counted from the lowest (a piece);
// with offload_delay it copies back the results of the previous step's update instead.
void opt_offload_update(opt_state *o, int asc_lo, int asc_hi, const float *grad, float lr, float bc1, float bc2,
                        float g_scale);
// offload_layer_wait: runs the host update that opt_step left pending, if any. Whatever reads or
// sets the weights or the optimizer's state other than the training forward calls it first.
void opt_offload_complete(opt_state *o);
// The first element of m->grads that a pending host update still reads (m->n_params: none).
int64_t opt_offload_pending_lo(const opt_state *o);
// offload_delay: joins the host update in flight, if any (its results then await upload);
// and, once this step's update of the device share is queued, starts the host update of this
// step's gradients on the update thread.
void opt_offload_join(opt_state *o);
void opt_offload_start_delayed(opt_state *o, float lr, float bc1, float bc2, float g_scale);
// Collective. Completes an update that offload_delay left in flight: joins it and puts its
// weights in place (compute copy, gathered over dp with ZeRO, and the norms), as a step would;
// or the one offload_layer_wait left pending. Checkpoints call it first, so a run resumed from
// one continues bitwise. No-op otherwise.
void opt_flush(opt_state *o);
// This rank's shard of the first (which 0) or second (1) moment, device share then host share,
// into host memory (shard_n elements); and back.
void opt_moment_to_host(opt_state *o, int which, float *shard_host);
void opt_moment_from_host(opt_state *o, int which, const float *shard_host);
// The master weights of this rank's shard (dev_master, host_master) into host memory in shard
// order (shard_n elements; flat order without ZeRO).
void opt_offload_params_to_host(opt_state *o, float *shard_host);
// n_elem master weights at shard offset shard_off (within one bucket part) from host memory.
void opt_offload_set_master(opt_state *o, int64_t shard_off, const float *src_host, int64_t n_elem);
// This rank's part of every bucket of the compute copy, cast from the master weights.
void opt_offload_cast_master(opt_state *o);
// The master's norm elements this rank updates into pack (laid out as m->norm_copy), but those of
// host buckets whose update is pending (offload_layer_wait refreshes them as each updates).
void opt_offload_norms_out(opt_state *o, float *pack);
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
// overflow Adam's fp32 second moment.
double opt_step(opt_state *o, float lr, int64_t t);
// Master weights and moments for this rank's whole flat buffer (gathered over dp with ZeRO),
// into host arrays of m->n_params elements; and the moments back. Collective over dp with ZeRO.
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

#endif
