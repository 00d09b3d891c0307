// Checkpoint glue between the model/optimizer and the HDF5 checkpoint module: builds the
// tensor list (every parameter and both Adam moments at full logical shape, in one canonical
// order on every rank), saves, finds and loads checkpoints.
#ifndef TRAINER_RUN_CKPT_H
#define TRAINER_RUN_CKPT_H

#include "app/config.h"
#include "parallel/step/optim.h"

// Collective. Returns 0, or -1 with a message. kill_after: ckpt_save's test hook (-1: off).
int run_ckpt_save(const cfg *c, model *m, opt_state *o, int64_t step, int64_t samples_seen, int kill_after, char *err,
                  size_t n_err);
// Collective. path: a checkpoint file. Fills step and samples_seen. Returns 0, or -1 with a
// message (model shape differs, missing tensor, unreadable file).
int run_ckpt_load(const char *path, const cfg *c, model *m, opt_state *o, int64_t *step, int64_t *samples_seen,
                  char *err, size_t n_err);

#endif
