// The training loop: data to micro-batches, pipeline step, optimizer step, progress lines,
// JSON-lines metrics, evaluation, checkpoints, resume, and the run report at the end.
#ifndef TRAINER_TRAIN_H
#define TRAINER_TRAIN_H

#include "app/config.h"
#include "kernels/backend.h"
#include "parallel/comm/grid.h"

// Collective. Returns the process exit code: 0, or 1 after printing the error on rank 0.
int run_train(const cfg *c, grid *g, k_backend *be);

#endif
