// Tensor- and sequence-parallel regions, and the model's collectives (model/model_comm.h) built
// from them: parallel/ binds them to a model, which reaches no communicator itself.
// A column-parallel linear is entered by a gather (SP: all-gather along the sequence; without SP every rank already holds all rows) and a
// row-parallel linear is left by a reduce (SP: reduce-scatter along the sequence; else
// all-reduce); backward, entering reduces and leaving gathers. Activations are sequence-major,
// so a sequence shard is a contiguous block of rows. Every collective comes in two halves, so
// work queued between them (the GEMM over this rank's own rows, a weight-gradient GEMM) runs
// while it does (NCCL: on the tp communicator's side stream); the buffers it names must not be
// touched in between. The tp collectives outside these pairs (tp_all_reduce): the
// vocab-parallel cross-entropy's and FP8's amax.
#ifndef TRAINER_TP_H
#define TRAINER_TP_H

#include <stdint.h>
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/timing.h"

typedef struct tp_region {
  comm *c;         // the tp group
  k_backend *be;
  int sp;          // sequence parallel
  int64_t rows;    // rows inside the region (T * B)
  int64_t rows_s;  // rows outside it on this rank (rows / tp with sp, else rows)
  step_timing *timing;  // where the collectives' exposed time is added; NULL = not timed
  int serial;           // each collective waited for at its start (parallel.tp_overlap=none: nothing overlaps)
} tp_region;

// The first of this rank's rows inside the region: rank * rows_s with SP, else 0.
int64_t tp_own_row(const tp_region *r);
// In place: x (rows, d) of dtype t holds this rank's rows at tp_own_row; SP: the other ranks'
// rows are gathered into it; else there is nothing to do.
void tp_gather_start(const tp_region *r, void *x, int d, k_dtype t);
void tp_gather_finish(const tp_region *r);
// Instead of tp_gather_finish, called for every other rank in ring order (rank - 1, rank - 2, ...
// mod size): the work queued next may read rank from's rows. Where the communicator cannot wait
// for one rank (comm_ops.wait_from NULL) the first call waits for every row.
void tp_gather_wait_from(const tp_region *r, int from);
// y (rows, d) partial per rank -> y_s (rows_s, d), the sum over ranks of this rank's rows.
// SP: reduce-scatter; else all-reduce (y is clobbered) and a copy; one rank: a copy.
void tp_reduce_start(const tp_region *r, float *y, float *y_s, int d);
void tp_reduce_finish(const tp_region *r, float *y, float *y_s, int d);
// SP: y_s (rows_s, d) += the other ranks' partial sums of this rank's rows (y's own rows are not
// read; y_s is touched only by the finish), started by a call per other rank `to` in ring order
// (rank + 1, rank + 2, ... mod size) once y's rows of rank to are written. Where the
// communicator sends block by block and adds into y_s itself (comm_ops.reduce_scatter_add_block:
// peer copies) scratch is unused; else, at the last block, y's own rows are zeroed,
// reduce-scattered into scratch (rows_s, d) and the finish adds it.
// y of dtype t (fp32, or bf16: half the bytes, each block widened as it is added; over the
// communicator's reduce-scatter the sum of the other ranks' blocks is bf16 too, exact for two ranks).
void tp_reduce_add_block(const tp_region *r, void *y, k_dtype t, float *y_s, float *scratch, int d, int to);
void tp_reduce_add_finish(const tp_region *r, void *y, k_dtype t, float *y_s, float *scratch, int d);
// What no region pair carries, reduced over the tp group: the vocab-parallel cross-entropy's
// per-row statistics (each tp rank holds the logits of its vocabulary slice: the row max and the
// sums of exponentials and of target logits) and FP8's amaxes of tensors split over the group.
// x (n, backend memory) in place, the same result on every rank; blocking in queue order (later
// work sees it). Timed like the collectives above; tp 1: nothing to do.
void tp_all_reduce(const tp_region *r, float *x, int64_t n, comm_redop op);

// The model's collectives over a grid: the tp regions of m's activations (its dims and SP), the
// cross-entropy's statistics and FP8's amaxes over tp, FP8's amaxes over dp, host scalars over
// the world. The caller owns it and keeps it at one address while m lives.
typedef struct tp_model_comm {
  tp_region region;
  comm *dp, *world;
} tp_model_comm;
// Where this rank sits in g, for model_init.
model_place tp_model_place(const grid *g);
// Fills t for m (after model_init) and sets m->comm to it.
void tp_bind_model(tp_model_comm *t, model *m, const grid *g);
// Tensor-parallel collective time is added to timing (NULL: not timed).
void tp_set_timing(tp_model_comm *t, step_timing *timing);
// serial: every collective completes at its start, so no work overlaps it (a baseline).
void tp_set_serial(tp_model_comm *t, int serial);

#endif
