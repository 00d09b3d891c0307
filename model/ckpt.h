// Checkpoints: one HDF5 file per checkpoint, every tensor at its full logical shape, each
// rank writing and reading its own hyperslab with collective parallel I/O. Written to a
// temporary name and renamed, so a crash mid-write leaves the previous checkpoint intact.
// Layout: docs/checkpoint.md.
#ifndef TRAINER_CKPT_H
#define TRAINER_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#define CKPT_FORMAT_VERSION 1
#define CKPT_MAX_DIMS 4

// One tensor as this rank sees it: the full logical shape in the file, and the block
// [start, start + count) this rank holds in `data` (fp32, row-major, dense over count).
typedef struct ckpt_tensor {
  char name[128];        // HDF5 path, e.g. "model/layers.wq", "optim/exp_avg/layers.wq"
  int ndim;
  int64_t full[CKPT_MAX_DIMS];
  int64_t start[CKPT_MAX_DIMS];
  int64_t count[CKPT_MAX_DIMS];
  float *data;
  int write;             // on save: 1 if this rank writes its block (one replica writes)
} ckpt_tensor;

// Everything but tensors. Stored as attributes of the root group.
typedef struct ckpt_meta {
  int64_t step;             // optimizer steps done
  int64_t samples_seen;     // data position: windows consumed from the training stream
  uint64_t seed;
  uint64_t rng_counter;     // state of the counter-based RNG
  const char *config_yaml;  // resolved config (save); on load, a malloc'd copy the caller frees
} ckpt_meta;

// Collective over comm. Writes dir/ckpt_<step, 8 digits>.h5 via dir/.ckpt_<step>.h5.tmp, then
// renames; removes all but the newest `keep` checkpoints (keep 0: keep all). Creates dir.
// Returns 0, or -1 with a message (same result on every rank).
int ckpt_save(const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors, const ckpt_meta *meta,
              int keep, char *err, size_t n_err);
// Collective. Reads into each tensor's block. A missing tensor, or a full shape different
// from the file's, is an error naming the tensor and both shapes and saying what to do.
int ckpt_load(const char *path, MPI_Comm comm, ckpt_tensor *tensors, int n_tensors, ckpt_meta *meta, char *err,
              size_t n_err);
// Newest complete checkpoint in dir (path_out), 0 if found, 1 if none, -1 on error.
int ckpt_find_latest(const char *dir, char *path_out, size_t n_path);

#endif
