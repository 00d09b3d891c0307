// Checkpoints: one HDF5 file per checkpoint, every tensor at its full logical shape. The ranks
// create the file and its datasets together (parallel HDF5); each rank then writes and reads its
// own blocks with plain pwrite/pread at the datasets' places in the file (for an asynchronous
// save, from a background thread). Written to a temporary name and renamed, so a crash mid-write
// leaves the previous checkpoint intact.
// Layout: docs/checkpoint.md.
#ifndef TRAINER_CKPT_H
#define TRAINER_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <mpi.h>
#include "model/decode.h"

// Version written. 2 dropped the root attribute rng_counter (always 0: nothing in a run draws
// from an RNG whose state a resume needs); version 1 files still load, their rng_counter ignored.
// 3 added the attribute crc32c to every tensor (the CRC-32C of its full logical contents); files
// of versions 1 and 2 still load, unverified, with a notice.
#define CKPT_FORMAT_VERSION 3
#define CKPT_FORMAT_VERSION_MIN 1  // oldest version read
#define CKPT_FORMAT_VERSION_CRC 3  // first version whose tensors carry crc32c
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
  int write;             // save: 1 if this rank writes its block (one replica writes); load: 1 if this
                         // rank's block counts toward verifying the tensor's checksum (see ckpt_load)
} ckpt_tensor;

// ckpt_load's result besides 0: -1, the file cannot serve this run (missing, another model or
// format version); CKPT_DAMAGED, its contents are damaged (unreadable, a checksum that does not
// match, a non-finite value, root attributes out of range), so an older checkpoint should be used.
#define CKPT_DAMAGED -2

// Test hooks, {-1, -1, -1, 0} in a run (or pass NULL): after writing kill_after tensors the
// process SIGKILLs itself, mid-write; the write of tensor fail_at on the communicator's last rank
// reports an I/O error, as a failing disk would, so a test can show every rank ends cleanly; the
// checksum pass over tensor nan_in on the last rank counts one non-finite value more, as an
// overflowed update would leave, so a test can show no such checkpoint is published; writing the
// tensors takes delay_s seconds longer, signals or not, as on a slow file system.
typedef struct ckpt_faults {
  int kill_after;
  int fail_at;
  int nan_in;
  double delay_s;
} ckpt_faults;

// Everything but tensors. Stored as attributes of the root group.
typedef struct ckpt_meta {
  int64_t step;             // optimizer steps done
  int64_t samples_seen;     // data position: windows consumed from the training stream
  uint64_t seed;
  const char *config_yaml;  // resolved config (save); on load, a malloc'd copy the caller frees
} ckpt_meta;

// Collective over comm. Writes dir/ckpt_<step, 8 digits>.h5 via dir/.ckpt_<step>.h5.tmp, then
// renames; removes all but the newest `keep` checkpoints (keep 0: keep all). Creates dir.
// Returns 0, or -1 with a message (same result on every rank).
// Precondition (checked; a mismatch aborts): every rank passes the same tensor list, i.e. the same
// names, ndim and full shapes in the same order, because creating a dataset is a collective
// metadata operation. Only start, count, data and write differ between ranks; a rank that holds
// nothing of a tensor passes a zero count or write = 0. A name may repeat (same full shape): each
// entry is one more block of that dataset, e.g. a flat optimizer shard spanning several rows.
// Metadata (step, samples_seen, seed, config_yaml) is taken from rank 0.
// Also: an existing checkpoint of the same step is replaced; the checkpoint just written is
// never rotated away, even when dir holds higher steps (a warning names them); leftover
// .ckpt_*.h5.tmp files of crashed writes are removed. Rotation runs on rank 0 after the result is
// agreed, so other ranks may return before old files are gone; its failures are warnings.
// Each tensor gets the attribute crc32c, the CRC-32C of its full logical contents, from the blocks
// of the ranks that write them (ckpt_crc.h); those blocks must tile each tensor exactly once
// (checked; a gap or overlap aborts). The file's space is reserved before anything is written, so
// a full disk is reported before HDF5 touches the file. faults: test hooks, NULL in a run.
int ckpt_save(const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors, const ckpt_meta *meta,
              int keep, const ckpt_faults *faults, char *err, size_t n_err);
// An asynchronous save: ckpt_save's file, written while the caller goes on. ckpt_async_start
// (collective) does what needs every rank before any data is written: the temporary file, its
// attributes and every dataset (collective metadata, so the file's layout is fixed here). It then
// starts a background thread that writes this rank's blocks straight into their datasets' bytes
// with plain POSIX writes, fsyncs them and computes their checksum contributions: no MPI and no
// HDF5 call, so the caller's MPI and NCCL collectives may run meanwhile (MPI need not be
// initialised with MPI_THREAD_MULTIPLE, and HDF5 need not be thread-safe). ckpt_async_ready
// (collective) says whether every rank's thread has finished; ckpt_async_finish (collective)
// waits for this rank's and does the rest as ckpt_save: agree on the result over the ranks,
// refuse a tensor holding NaN or Inf, write the checksums, close, publish by rename, rotate.
// On a failure the temporary is removed and every rank returns the same message. The result is
// the file ckpt_save writes from the same arguments.
typedef struct ckpt_async {
  struct ckpt_async_job *job;  // the write in flight; NULL: none
  int64_t step;                // its step
  int64_t n_bytes;             // its tensors' bytes in the file, every rank's together
  double write_s;              // set by ckpt_async_finish: seconds the background write took, slowest rank
} ckpt_async;

// Collective; no write in flight (checked). As ckpt_save's arguments; the tensors (list and
// data) must stay unchanged until ckpt_async_finish returns. 0: the write is in flight; -1 with a
// message (the same on every rank): nothing is, and no temporary is left.
int ckpt_async_start(ckpt_async *a, const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors,
                     const ckpt_meta *meta, int keep, const ckpt_faults *faults, char *err, size_t n_err);
// Collective over the start's communicator while a write is in flight: 1 once every rank's
// background write has returned (ckpt_async_finish then does not wait), else 0. 1 with none.
int ckpt_async_ready(const ckpt_async *a);
// Collective. Completes the write in flight, waiting for this rank's background write: 0 (also
// with none in flight), or -1 with a message, the same on every rank.
int ckpt_async_finish(ckpt_async *a, char *err, size_t n_err);
static inline int ckpt_async_pending(const ckpt_async *a) { return a->job != NULL; }

// Collective. Reads into each tensor's block. A missing tensor, or a full shape different
// from the file's, is an error naming the tensor and both shapes and saying what to do.
// Same list precondition as ckpt_save (names and full shapes equal on every rank); a zero count
// reads nothing. n_tensors 0 reads only meta (e.g. the stored config before the model is built).
// Verified, not trusted: the root attributes are range-checked (step >= 0, samples_seen >= step);
// every block read is checked finite; a tensor whose blocks with write = 1 (on a one-rank
// communicator: all blocks) cover it exactly is checked against its crc32c (files of version 3 on;
// older ones load with a notice). A tensor read only in part is not checksummed. A failure names
// the tensor. HDF5 prints nothing: its error stack goes into the message.
// meta may be NULL; on success meta->config_yaml is malloc'd (free it with
// free((void *)meta->config_yaml)); on failure it is NULL. Every rank gets the same result:
// 0, -1 or CKPT_DAMAGED.
int ckpt_load(const char *path, MPI_Comm comm, ckpt_tensor *tensors, int n_tensors, ckpt_meta *meta, char *err,
              size_t n_err);
// Collective, at start-up: rank 0 creates dir (with its parents) and a file in it, which it
// removes, so an unwritable checkpoint.dir is reported before the first step rather than at the
// first save. 0, or -1 with a message naming the directory (the same on every rank).
int ckpt_check_dir(const char *dir, MPI_Comm comm, char *err, size_t n_err);
// Collective: every rank ends a collective step with the same result, the first failing rank's
// rc and message (msg holds n_msg bytes on every rank). rc: this rank's (0 = success). Returns 0
// if no rank failed, else the first failing rank's rc.
int ckpt_agree(MPI_Comm comm, int rc, char *msg, int n_msg);
// Newest complete checkpoint in dir whose step is below before_step (INT64_MAX: any) in
// path_out and its step in *step_out (may be NULL); 0 if found, 1 if none, -1 on error.
// Not collective: serial read-only opens, safe from every rank at once (cheaper at scale: call it
// on rank 0 and broadcast). A missing dir means none (1). Files that do not open or lack
// complete == 1 are skipped with a warning on stderr (printed by world rank 0 only). The format
// version is not checked here, so ckpt_load reports a version mismatch instead of an older file
// being picked silently. On -1 (dir unreadable) path_out holds the error message.
int ckpt_find_latest(const char *dir, int64_t before_step, char *path_out, size_t n_path, int64_t *step_out);
// Not collective: checks the checkpoint at path on its own (structure, root attributes, every
// tensor's checksum and finiteness, reading each tensor in slices), printing one line per problem
// to out. Returns the number of problems (0: the checkpoint is sound).
int ckpt_verify(const char *path, FILE *out);

// A decode_read_fn (model/decode.h) over a checkpoint file, ctx its path: reads each whole tensor
// "model/<name>" of list on this rank alone (MPI_COMM_SELF), with ckpt_load's checks and errors.
int ckpt_read_decode(void *path, decode_tensor *list, int n, char *err, size_t n_err);

#endif
