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
// Asynchronous checkpoints (checkpoint.async): the training thread copies everything a
// checkpoint holds into pinned host memory (the backend's host_alloc, allocated at the first
// checkpoint and reused), then a background thread writes the file from it (ckpt_async) while
// training goes on. At most one write is in flight: complete it (ckpt_async_ready,
// ckpt_async_finish on `write`) before the next start and before run_ckpt_async_free.
typedef struct run_ckpt_snapshot run_ckpt_snapshot;
typedef struct run_ckpt_async {
  run_ckpt_snapshot *snap;  // the host copy the write in flight reads; NULL before the first
  ckpt_async write;         // the write in flight
} run_ckpt_async;

// Collective; no write in flight. Copies the state of step into the snapshot and starts its
// write. 0, or -1 with a message (the same on every rank; nothing in flight then).
int run_ckpt_async_start(run_ckpt_async *a, const cfg *c, model *m, opt_state *o, int64_t step,
                         int64_t samples_seen, const ckpt_faults *faults, char *err, size_t n_err);
// Frees the snapshot; no write in flight (checked). Safe twice.
void run_ckpt_async_free(run_ckpt_async *a);
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
