// Tensor- and sequence-parallel regions. A column-parallel linear is entered by a gather (SP:
// all-gather along the sequence; without SP every rank already holds all rows) and a
// row-parallel linear is left by a reduce (SP: reduce-scatter along the sequence; else
// all-reduce); backward, entering reduces and leaving gathers. Activations are sequence-major,
// so a sequence shard is a contiguous block of rows. Every collective comes in two halves, so
// work queued between them (the GEMM over this rank's own rows, a weight-gradient GEMM) runs
// while it does (NCCL: on the tp communicator's side stream); the buffers it names must not be
// touched in between. The tp collectives outside these pairs: the vocab-parallel
// cross-entropy's (tp_vocab_reduce) and FP8's amax (tp_amax_reduce).
#ifndef TRAINER_TP_H
#define TRAINER_TP_H

#include <stdint.h>
#include "kernels/backend.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/timing.h"

typedef struct tp_region {
  comm *c;         // the tp group
  k_backend *be;
  int sp;          // sequence parallel
  int64_t rows;    // rows inside the region (T * B)
  int64_t rows_s;  // rows outside it on this rank (rows / tp with sp, else rows)
  step_timing *timing;  // where the collectives' exposed time is added; NULL = not timed
} tp_region;

// The first of this rank's rows inside the region: rank * rows_s with SP, else 0.
int64_t tp_own_row(const tp_region *r);
// In place: x (rows, d) of dtype t holds this rank's rows at tp_own_row; SP: the other ranks'
// rows are gathered into it; else there is nothing to do.
void tp_gather_start(const tp_region *r, void *x, int d, k_dtype t);
void tp_gather_finish(const tp_region *r);
// y (rows, d) partial per rank -> y_s (rows_s, d), the sum over ranks of this rank's rows.
// SP: reduce-scatter; else all-reduce (y is clobbered) and a copy; one rank: a copy.
void tp_reduce_start(const tp_region *r, float *y, float *y_s, int d);
void tp_reduce_finish(const tp_region *r, float *y, float *y_s, int d);
// The vocab-parallel cross-entropy's per-row statistics, which no region pair carries: each tp
// rank holds the logits of its vocabulary slice, so the row max (COMM_MAX) and the sums of
// exponentials and of target logits (COMM_SUM) are reduced over the tp group. x (n) in place,
// the same result on every rank; blocking in queue order (later work sees it). Timed like the
// collectives above; tp 1: nothing to do.
void tp_vocab_reduce(const tp_region *r, float *x, int64_t n, comm_redop op);
// FP8 scaling: n amaxes (backend memory) of tensors split over the group, or held whole by
// every rank, maxed over it in place, so every rank scales a tensor alike. Blocking, timed.
void tp_amax_reduce(const tp_region *r, float *amax, int64_t n);

#endif
