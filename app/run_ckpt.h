// Checkpoint glue between the model/optimizer and the HDF5 checkpoint module: builds the
// tensor list (every parameter and both Adam moments at full logical shape, in one canonical
// order on every rank), saves, finds and loads checkpoints; and starts a model from a Hugging
// Face directory (checkpoint.init_from).
#ifndef TRAINER_RUN_CKPT_H
#define TRAINER_RUN_CKPT_H

#include "app/config.h"
#include "model/format/ckpt.h"
#include "parallel/step/optim.h"

// Collective. Returns 0, or -1 with a message. faults: ckpt_save's test hooks (NULL: off).
int run_ckpt_save(const cfg *c, model *m, opt_state *o, int64_t step, int64_t samples_seen,
                  const ckpt_faults *faults, char *err, size_t n_err);
// Collective. path: a checkpoint file. Fills step and samples_seen. Returns 0, -1 with a message
// (model shape differs, missing tensor, another format version) or CKPT_DAMAGED with a message
// naming the damage (checksum, non-finite value, unreadable file, root attributes out of range).
int run_ckpt_load(const char *path, const cfg *c, model *m, opt_state *o, int64_t *step, int64_t *samples_seen,
                  char *err, size_t n_err);
// Collective. Starts the model from a Hugging Face Llama directory (checkpoint.init_from=hf:DIR):
// checks its config.json against c->model, reads this rank's block of every parameter (fp32,
// bf16 or fp16 in the files) into the master weights (opt_set_params); the moments stay fresh.
// Returns 0, or -1 with the same message on every rank.
int run_hf_load(const char *dir, const cfg *c, opt_state *o, char *err, size_t n_err);

#endif
