// The trainer: one object that owns a run's data streams, model, optimizer, pipeline executor
// and metrics, with a function for each thing a run does: init (data, model, optimizer, resume),
// step (one optimizer step), evaluate, log, checkpoint, report and free. trainer_run is the loop
// that ties them together. Rank 0 prints and writes the metrics file; every rank holds the same
// step counter and data position, so the loop needs no coordination beyond each step's
// collectives.
#ifndef TRAINER_TRAINER_H
#define TRAINER_TRAINER_H

#include <stdio.h>
#include "app/config.h"
#include "app/run_ckpt.h"
#include "app/tensorboard.h"
#include "data/data.h"
#include "kernels/backend.h"
#include "model/format/ckpt.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/tp.h"
#include "parallel/step/optim.h"
#include "parallel/step/pp_exec.h"

// Test-only fault injection, read once at start-up (main.c): the process SIGKILLs itself after
// writing this many tensors of a checkpoint (TRAINER_TEST_KILL_IN_CKPT), or the last rank's write
// of that tensor fails as on a failing disk (TRAINER_TEST_FAIL_IN_CKPT), or its checksum pass
// finds a non-finite value there (TRAINER_TEST_NAN_IN_CKPT); -1 = never. The
// gradient of step nan_at_step (1-based) is NaN (TRAINER_TEST_NAN_AT_STEP); 0 = never. The
// amax recorded for the first FP8 projection input of step fp8_inf_at_step is Inf
// (TRAINER_TEST_FP8_INF_AT_STEP, train.precision=fp8); 0 = never. Every checkpoint write takes
// ckpt.delay_s seconds longer, signals or not, as a slow file system would
// (TRAINER_TEST_CKPT_DELAY_S); 0 = no delay. The gradient of step huge_at_step is 1e30 times
// larger, finite (TRAINER_TEST_HUGE_GRAD_AT_STEP); 0 = never. The update of step inf_lr_at_step
// runs with an infinite learning rate, so it would make the weights non-finite from finite
// gradients (TRAINER_TEST_INF_LR_AT_STEP); 0 = never.
typedef struct trainer_hooks {
  ckpt_faults ckpt;
  int64_t nan_at_step;
  int64_t fp8_inf_at_step;
  int64_t huge_at_step;
  int64_t inf_lr_at_step;
} trainer_hooks;

// One step's token ids, host and backend copies.
typedef struct trainer_batch {
  int32_t *tokens_h, *targets_h;  // (n_micro, T, B) host
  int32_t *tokens, *targets;      // the same in backend memory
  int32_t *window;                // (T + 1)
} trainer_batch;

// Running sums behind the progress lines and the run report.
typedef struct trainer_stats {
  step_timing tm;           // the step in flight
  step_timing tm_total;     // sum over the timed steps (every step after a process's first)
  int64_t n_timed;
  double t_start;           // wall clock at the first step
  double t_steps, t_steady; // time of every step; of the timed ones
  int64_t first_step;       // the step this process started from (after a resume)
  int64_t tokens_seen;      // this process
  double mem_peak;          // bytes, this rank
  double held_peak;         // bytes of the trainer's own buffers (k_backend.mem_held), this rank
  int64_t held_peak_by_kind[K_MEM_KINDS];  // the same by what they hold, after the step of held_peak
  double last_loss, last_val;
  int64_t n_skipped;        // steps skipped for a non-finite gradient norm (train.skip_nonfinite)
} trainer_stats;

typedef struct trainer {
  const cfg *c;
  grid *g;
  k_backend *be;
  trainer_hooks hooks;
  data_loader train, val;
  int have_val;
  model m;
  tp_model_comm tpc;        // the model's collectives over g (m.comm points here)
  opt_state o;
  pp_exec e;
  run_ckpt_async ckpt_async;  // checkpoint.async: the snapshot and the write in flight
  trainer_batch batch;
  FILE *metrics;            // rank 0, log.metrics; NULL = none
  tb_writer tb;             // rank 0, log.tensorboard; closed = none
  int n_micro;              // micro-batches per rank and step
  int64_t step;             // optimizer steps done
  int64_t last_step;        // the step this run ends at (train.stop_at or train.steps)
  int64_t samples_seen;     // data position in the training stream
  double tokens_per_step;
  double flops_per_token;   // model FLOPs per token for MFU (docs/benchmarks.md)
  int stop_signal;          // SIGTERM or SIGINT that some rank received; 0 = none
  trainer_stats stats;
} trainer;

// Collective. Opens the data, builds the model, optimizer and pipeline executor, and resumes
// from a checkpoint when checkpoint.resume asks. 0, or -1 with a message in err.
int trainer_init(trainer *t, const cfg *c, grid *g, k_backend *be, const trainer_hooks *hooks, char *err,
                 size_t n_err);
// What one step reports.
typedef struct trainer_step_result {
  double loss;       // mean loss per token over the global batch
  float lr;
  double grad_norm;  // before clipping; NaN or Inf: the update was refused (opt_step)
  double seconds;
  double mem_bytes;  // the backend's memory in use after the step
} trainer_step_result;

// Collective. One optimizer step (and whether a stop signal reached any rank: t->stop_signal).
trainer_step_result trainer_step(trainer *t);
// Collective. Validation loss per token over log.eval_batches micro-batches of the val stream.
double trainer_evaluate(trainer *t);
// Rank 0: the progress line, the metrics record and the TensorBoard event of the step just done
// (val_loss NaN: none).
void trainer_log(trainer *t, const trainer_step_result *r, double val_loss);
// Collective. Writes a checkpoint of the current step. 0, or -1 with a message. With
// checkpoint.async it first completes the write in flight, then snapshots the step and starts
// its write, which trainer_checkpoint_poll or trainer_checkpoint_wait completes.
int trainer_checkpoint(trainer *t, char *err, size_t n_err);
// Collective: completes the asynchronous write in flight once every rank's has finished
// (trainer_checkpoint_poll, at a step boundary), or waiting for it (trainer_checkpoint_wait,
// before the next one and at the end of the run). 0 (also with none in flight), or -1 with a
// message: the write failed and its checkpoint is not published.
int trainer_checkpoint_poll(trainer *t, char *err, size_t n_err);
int trainer_checkpoint_wait(trainer *t, char *err, size_t n_err);
// Collective. The run report (rank 0 prints it and appends it to the metrics file).
void trainer_report(trainer *t);
// Safe twice and after a failed init; no asynchronous write in flight (checked).
void trainer_free(trainer *t);

// Collective. The whole run: init, steps with evaluation, logging and checkpoints, report.
// Returns the process exit code: 0; 1 after printing the error on rank 0; 128 + signal when a
// SIGTERM or SIGINT stopped it (after checkpointing the step in flight).
int trainer_run(const cfg *c, grid *g, k_backend *be, const trainer_hooks *hooks);

#endif
