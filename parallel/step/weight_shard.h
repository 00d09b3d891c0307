// parallel.shard=weights (ZeRO-3): no rank keeps the whole compute copy of the weights. Each DP
// bucket is one group of tensors (as with sharded gradients, grad_shard.h); this rank holds the
// fp32 master weights of its part of every bucket and no compute copy of them: before forward or
// backward reads a group (model->weights_needed, grads_needed) each rank casts its part into its
// place in a slot (with optimizer.offload=host, where the update writes the part in the act
// dtype, opt_state.part_pc, it is copied from there), the parts are all-gathered around it, and
// the group's t->pc point there; the pass's next
// parallel.shard_prefetch groups (forward: the next layers; backward: the ones before) are gathered
// into other slots while this one computes: prefetch + 1 slots, the least recently used taken
// first. A group still in a slot is not gathered again: the head, last in forward, is first in
// backward, and the embedding, last in backward, first in the next forward. A communicator's wait
// covers every collective started on it, so each gather in flight has a communicator of its own
// (the shard group's, then grid_add_gathers's, in turn; with parallel.gather_copy_engine each slot
// has one, which allocated the slot in memory its copy engines gather into), and the gradients'
// reduce-scatters run on dp-overlap: waiting for one never waits for another. An update (or any change of the weights)
// empties the slots and starts the gather of the next forward's first group. With
// parallel.reshard_after_forward=false there is a slot per group, so backward finds every group
// forward gathered (FSDP's reshard_after_forward=False: the whole compute copy between forward
// and backward, no gathers in backward). The norms' fp32 copy
// stays whole (m->norm_copy, opt_share_norms). In FP8 a group's FP8 copies live in the bank of its
// slot (model_fp8_place), cast from the gathered weights.
#ifndef TRAINER_WEIGHT_SHARD_H
#define TRAINER_WEIGHT_SHARD_H

#include <stdint.h>
#include "parallel/step/optim_core.h"

enum { WEIGHT_SHARD_MAX_PREFETCH = 8 };

typedef struct weight_shard {
  int prefetch;         // parallel.shard_prefetch
  int n_slots;          // prefetch + 1; with parallel.reshard_after_forward=false one per bucket
  void **slot;          // (n_slots, slot_elem each) gathered groups
  int64_t slot_elem;    // the longest bucket
  int *slot_bucket;     // (n_slots) the bucket slot s holds or is gathering; -1 none
  comm **slot_comm;     // (n_slots) the communicator of its gather in flight; NULL none
  int64_t *slot_used;   // (n_slots) when it was last gathered into or computed from
  int64_t tick;
  int current;          // the slot of the group being computed; -1 none
  comm *comms[WEIGHT_SHARD_MAX_PREFETCH];  // (prefetch) the gathers' communicators, taken in turn (with
                                           // gather_copy_engine slot s's gathers run on the grid's gather_c[s])
  int n_comms, next_comm;
  int copy_engine;      // parallel.gather_copy_engine: each slot from its communicator's buffer_alloc where it has one
  comm **slot_owner;    // (n_slots) the communicator whose buffer_alloc made slot s; NULL: the backend
  int tied_head;        // the bucket of a head tied to the embedding (its weights are the embedding's), or -1
  int tied_embed;       // and the embedding's bucket
  int64_t n_bytes;      // backend memory of the slots and of opt_state.part_pc
} weight_shard;

// After the engine's init (one bucket per group): allocates prefetch + 1 slots, or
// with reshard 0 (parallel.reshard_after_forward=false) a slot per bucket, so that every group
// gathered for forward stays for backward.
weight_shard *weight_shard_init(opt_state *o, int prefetch, int reshard);
void weight_shard_free(weight_shard **ws, k_backend *be);
// Forward (backward 0) or backward (1) is about to read group grp (opt_group): its
// weights gathered and pointed at, and the gathers of the pass's next groups started.
void weight_shard_needed(opt_state *o, int grp, int backward);
// The weights changed (an update, a load; the optimizer's after-update hook): nothing in the
// slots is current any more, and the gather of the first group the next forward reads (the lowest
// bucket) starts.
void weight_shard_refresh(opt_state *o);

#endif
