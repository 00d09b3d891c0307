// The pipeline executor: runs any schedule from pp_schedule_build for one optimizer step
// (forward and backward of every micro-batch of this rank's chunks), and the forward-only
// pass used for evaluation. Activation buffers come from a pool, taken when a micro-batch
// enters a chunk and returned once its input gradient has left.
#ifndef TRAINER_PP_EXEC_H
#define TRAINER_PP_EXEC_H

#include "model/model.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/timing.h"
#include "parallel/step/pp_schedule.h"

typedef struct pp_exec {
  model *m;
  grid *g;
  pp_schedule sched;
  int n_micro;
  model_acts **slot;     // (n_micro * vpp): activations in use by (micro, chunk), or NULL
  model_acts **pool;     // free activations, per chunk a stack of up to pool_cap
  int *pool_n;           // (vpp)
  int pool_cap;
  int n_created;         // activation sets allocated so far (peak in-flight)
  step_timing *timing;   // pipeline-communication time is added here (pp_comm); NULL = not timed
  // parallel.pp_comm_bf16 (set by the caller): activations and gradients cross stages as bf16,
  // rounded from fp32 into a staging buffer before a send and widened from one after a receive
  // (per group position, or with overlap two per activation set).
  int comm_bf16;
  uint16_t **stage;      // (n_stage) rows_s * d each, backend memory, made on first use
  int n_stage;           // the most transfers in one group of the schedule
  // parallel.pp_overlap (set by the caller before the first step): transfers run on the
  // communicator's xfer channels, overlapping compute; a compute step waits only for the
  // receive it reads, and a buffer is reused only once the sends reading it are done.
  int overlap;
  struct pp_tickets *slot_t;  // (n_micro * vpp) transfer tickets of the activations in slot
  struct pp_tickets *pool_t;  // (vpp * pool_cap) those of the free activations in pool
} pp_exec;

// Returns 0, or -1 with a message when the schedule is not admissible.
int pp_exec_init(pp_exec *e, model *m, grid *g, int n_micro, char *err, size_t n_err);
void pp_exec_free(pp_exec *e);
// Turns on overlapped transfers (parallel.pp_overlap): opens the pipeline communicator's xfer
// channels, so every rank of the pipeline group calls it together, before the first step.
void pp_exec_overlap(pp_exec *e);
// One step. tokens/targets: (n_micro, T, B) in backend memory. Returns the summed per-token
// loss of this rank's micro-batches if it holds the last virtual stage, else 0.
double pp_exec_train_step(pp_exec *e, const int32_t *tokens, const int32_t *targets, float loss_scale);
// Forward only of one micro-batch through every virtual stage (evaluation). Returns the
// summed loss on the rank holding the last virtual stage, else 0.
double pp_exec_forward(pp_exec *e, const int32_t *tokens, const int32_t *targets);

#endif
