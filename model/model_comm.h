// The collectives the model calls and does not implement: the tensor- and sequence-parallel
// region pairs (entering a column-parallel linear gathers, leaving a row-parallel one reduces),
// the vocab-parallel cross-entropy's row statistics and FP8's amax maxima over the tp group,
// FP8's amax maxima over the dp group, and host scalars over every rank. The model declares them
// here and reaches them only through this table; parallel/ implements it over its communicators
// (parallel/comm/tp.h: tp_bind_model), so no file of model/ sees a communicator or the grid.
// Every collective comes in two halves where work can run between them (the GEMM over this
// rank's own rows); the buffers named must not be touched in between.
#ifndef TRAINER_MODEL_COMM_H
#define TRAINER_MODEL_COMM_H

#include <stdint.h>
#include "kernels/backend.h"

typedef enum model_reduce_op { MODEL_REDUCE_SUM, MODEL_REDUCE_MAX } model_reduce_op;

typedef struct model_comm_ops {
  // In place: x (rows, d) of dtype t holds this rank's rows at the model's own row; with SP the
  // other tp ranks' rows are gathered into it; else nothing to do. Completed by gather_finish,
  // or by gather_wait_from for every other tp rank in ring order (from = tp_rank - 1, tp_rank - 2,
  // ... mod tp, the order the rows arrive in): the work queued after it may read rank from's rows,
  // so the GEMM over each rank's rows starts while the next rank's travel.
  void (*gather_start)(void *ctx, void *x, int d, k_dtype t);
  void (*gather_finish)(void *ctx);
  void (*gather_wait_from)(void *ctx, int from);
  // y (rows, d) partial per tp rank -> y_s (rows_s, d), the sum over ranks of this rank's rows
  // (SP: reduce-scatter; else all-reduce and a copy; one rank: a copy). y may be clobbered;
  // y_s may be this rank's own rows of y (in place).
  void (*reduce_start)(void *ctx, float *y, float *y_s, int d);
  void (*reduce_finish)(void *ctx, float *y, float *y_s, int d);
  // SP only: y_s (rows_s, d) += the other tp ranks' partial sums of this rank's rows, from y
  // (rows, d) of partials per rank, of dtype t (fp32, or bf16: half the bytes, widened as added),
  // started block by block: reduce_add_block says the rows of y
  // that rank `to` owns are written, for to = tp_rank + 1, tp_rank + 2, ... (mod tp), every other
  // rank in that ring order, so each block travels while the next is computed. This rank's own
  // rows of y are not read (they may be overwritten), and y_s is read and written only by the
  // finish, so the work queued before it may compute this rank's share into y_s (the
  // row-parallel projection's own rows). scratch (rows_s, d) may be used.
  void (*reduce_add_block)(void *ctx, void *y, k_dtype t, float *y_s, float *scratch, int d, int to);
  void (*reduce_add_finish)(void *ctx, void *y, k_dtype t, float *y_s, float *scratch, int d);
  // Blocking in queue order, backend memory, in place: over the tp group (the cross-entropy's
  // statistics, FP8 amaxes) and over the dp group (FP8 amaxes).
  void (*tp_all_reduce)(void *ctx, float *x, int64_t n, model_reduce_op op);
  void (*dp_all_reduce)(void *ctx, float *x, int64_t n, model_reduce_op op);
  // Host doubles over every rank (a non-finite FP8 amax's report).
  void (*world_all_reduce)(void *ctx, double *x, int n, model_reduce_op op);
} model_comm_ops;

typedef struct model_comm {
  const model_comm_ops *ops;
  void *ctx;
} model_comm;

#endif
