// parallel.shard=grads (ZeRO-2): no whole gradient buffer on any rank. Each DP bucket is one
// group of tensors (a layer, the final norm and head, the embedding), which the model starts at a
// multiple of dp * 128 in its flat order (model_layout.grads_in_optimizer). Before backward writes
// a group's gradients (model->grads_needed) its tensors' t->g point at a zeroed staging slot; once
// backward has queued them (grads_ready) the slot is reduce-scattered into this rank's part of the
// bucket: straight into the optimizer's grad_shard for the step's first micro-batch, into a part
// buffer added to it for the others. Two slots alternate, so the reduce-scatter of one group runs
// beside the backward of the next; the report of a group waits for the reduce-scatter before it
// (the communicator's wait covers every collective started on it). A tied embedding is written by
// the head's backward and by the embedding's, so it has a slot of its own for the micro-batch.
// With parallel.shard_group the parts are the group's, and each bucket's part, once its last
// micro-batch is in, is all-reduced over the replicas on their own communicator, beside backward.
// With parallel.grad_compress=bf16 a slot is rounded to bf16 (wire) before its reduce-scatter,
// which sums in bf16 into recv; the wait's flush widens the part back to fp32 where the fp32
// reduce-scatter would have put it.
#ifndef TRAINER_GRAD_SHARD_H
#define TRAINER_GRAD_SHARD_H

#include <stdint.h>
#include "parallel/step/optim_core.h"

typedef struct grad_shard {
  float *slot[3];       // ring slots 0 and 1 (slot_elem), and a tied embedding's own (2; NULL untied)
  int64_t slot_elem;    // the longest group outside the tied embedding
  int next;             // the ring slot the next group takes
  int tied_bucket;      // the tied embedding's bucket, or -1
  float *part;          // (longest bucket part) a later micro-batch's reduced part, added after the wait
  int add_bucket;       // the bucket whose reduced part waits in part, or -1
  int last_bucket;      // the bucket of the reduce-scatter started last
  int busy[3];          // a reduce-scatter reading the slot was started and not yet waited for
  int *slot_of;         // (n_buckets) the slot holding the bucket's gradients this micro-batch
  int *count;           // (n_buckets) micro-batches reduced this step
  comm *c;              // the communicator of the reduce-scatters (dp-overlap where there is one)
  int bf16;             // parallel.grad_compress=bf16: the reduce-scatters in bf16
  void *wire[3];        // bf16: slot s rounded (as slot[s]); NULL without
  void *recv[3];        // bf16: slot s's reduced part (longest bucket part)
  float *dst[3];        // bf16: where slot s's part goes in fp32 at the flush
  int64_t dst_len[3];
  int64_t staging_bytes;  // backend memory of the slots, the part buffer and the bf16 buffers
} grad_shard;

// After opt_layout_build (one bucket per group): allocates the slots.
grad_shard *grad_shard_init(opt_state *o);
void grad_shard_free(grad_shard **gs, k_backend *be);
// The model's grads_needed and grads_ready for group grp (opt_group's id), through optim.c.
void grad_shard_needed(opt_state *o, int grp);
void grad_shard_ready(opt_state *o, int grp);
// After backward: every reduced part is in grad_shard (queued); checks that every bucket was
// reduced once per micro-batch and starts the count of the next step.
void grad_shard_step_end(opt_state *o);

#endif
