// Tensor- and sequence-parallel regions as named forward/backward pairs. A column-parallel
// linear is entered with tp_enter (copy-to-region / all-gather along the sequence) and a
// row-parallel linear is left with tp_exit (all-reduce / reduce-scatter along the sequence).
// Activations are sequence-major, so a sequence shard is a contiguous block of rows.
#ifndef TRAINER_TP_H
#define TRAINER_TP_H

#include <stdint.h>
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/timing.h"

typedef struct tp_region {
  comm *c;         // the tp group
  k_backend *be;
  int sp;          // sequence parallel
  int64_t rows;    // rows inside the region (T * B)
  int64_t rows_s;  // rows outside it on this rank (rows / tp with sp, else rows)
  step_timing *timing;  // where collective time is added; NULL = not timed
} tp_region;

// Forward into the region: x_s (rows_s, d) -> x (rows, d), both of dtype t (the layers gather
// the bf16 GEMM operand: the same bits as gathering fp32 and rounding after, half the bytes).
// SP: all-gather; else copy.
void tp_enter_fwd(const tp_region *r, const void *x_s, void *x, int d, k_dtype t);
// Its backward: dx (rows, d) partial per rank -> dx_s (rows_s, d). SP: reduce-scatter;
// else all-reduce. dx is clobbered. In two halves, so that work queued between them (the
// weight-gradient GEMM) runs while the collective does (NCCL: on the communicator's side
// stream); neither buffer may be touched in between.
void tp_enter_bwd_start(const tp_region *r, float *dx, float *dx_s, int d);
void tp_enter_bwd_finish(const tp_region *r, float *dx, float *dx_s, int d);
// Forward out of the region: partial y (rows, d) -> y_s (rows_s, d). SP: reduce-scatter;
// else all-reduce. y is clobbered.
void tp_exit_fwd(const tp_region *r, float *y, float *y_s, int d);
// Its backward: dy_s (rows_s, d) -> dy (rows, d), both of dtype t. SP: all-gather; else copy.
void tp_exit_bwd(const tp_region *r, const void *dy_s, void *dy, int d, k_dtype t);

#endif
