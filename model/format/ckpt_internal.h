// Checkpoint internals shared by model/format/ckpt.c (HDF5 I/O, reading), model/format/ckpt_write.c
// (writing), model/format/ckpt_async.c (the background write), model/format/ckpt_dir.c (listing,
// creating, publishing and rotating checkpoint files) and model/format/ckpt_verify.c (the
// standalone check).
#ifndef TRAINER_CKPT_INTERNAL_H
#define TRAINER_CKPT_INTERNAL_H

#include <hdf5.h>
#include <stdint.h>
#include "model/format/ckpt.h"

#define CKPT_MSG 2048   // internal message buffer; copied into the caller's err
#define CKPT_PATH 4096
#define CKPT_MAGIC "trainer-checkpoint"  // value of the root attribute "format"

// HDF5 calls return a negative value on failure. HDF5's own printing is off while the checkpoint
// code runs (ckpt_quiet), so the innermost entry of its error stack goes into the message.
#define H5_CHECK(call)                                                                \
  do {                                                                                \
    if ((long long)(call) < 0) {                                                      \
      char h5_reason_[256];                                                           \
      ckpt_h5_reason(h5_reason_);                                                     \
      check_fail(__FILE__, __LINE__, __func__, #call, h5_reason_);                    \
    }                                                                                 \
  } while (0)

// HDF5 prints its error stack on every failed call unless told not to. A failure the trainer
// expects (missing file, damaged file, disk full) must end in one clean message, and an
// unexpected one (H5_CHECK) names HDF5's innermost reason in its own: so ckpt_save and ckpt_load
// run with the printing off, and restore the caller's setting on return.
typedef struct ckpt_quiet {
  H5E_auto2_t func;
  void *data;
} ckpt_quiet;
void ckpt_quiet_begin(ckpt_quiet *q);
void ckpt_quiet_end(const ckpt_quiet *q);

// Formats into a CKPT_MSG buffer.
void ckpt_msgf(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// msg into the caller's err (n_err bytes; err may be NULL).
void ckpt_copy_err(char *err, size_t n_err, const char *msg);

// Tensor lists, shared by the save and the load (ckpt.c). Whether t's block is empty; the first
// entry of the list with entry i's name (the dataset's own entry: a name may repeat, one block
// each); elements of a shape.
int ckpt_block_empty(const ckpt_tensor *t);
int ckpt_first_index(const ckpt_tensor *tensors, int i);
int64_t ckpt_n_elem(int ndim, const int64_t *dims);
// Collective: aborts, naming the bug, unless every rank passes the same names and full shapes in
// the same order (creating or opening a dataset is a collective metadata operation).
void ckpt_check_list(MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors, int saving, const char *fn);
// Selects t's block in fspace (active) or nothing, and returns the matching memory space.
hid_t ckpt_select(const ckpt_tensor *t, int active, hid_t fspace);
// The file access properties of a collective open over comm (parallel HDF5, MPI-IO).
hid_t ckpt_fapl(MPI_Comm comm);

// One checkpoint being written (ckpt_write.c). ckpt_save runs the stages in a row:
// ckpt_write_begin (collective: the temporary file, its root attributes and every dataset, so the
// file's layout is fixed before any data), ckpt_write_blocks (this rank's blocks), then
// ckpt_write_end (collective: agree, checksum attributes, close, publish, rotate). An asynchronous
// save (ckpt_async.c) runs ckpt_write_blocks in a background thread.
typedef struct ckpt_writer {
  MPI_Comm comm;
  int rank, n_ranks, keep;
  const ckpt_tensor *tensors;
  int n_tensors;
  ckpt_faults faults;
  int64_t step;
  char dir[CKPT_PATH], tmp[CKPT_PATH], final[CKPT_PATH];
  hid_t file;          // the temporary, open on every rank from begin to end
  int64_t *offset;     // (n_tensors) where each dataset's data starts in the file, bytes, at its first entry
  uint32_t *crc;       // (n_tensors) this rank's checksum contributions, at each dataset's first entry
  int64_t *covered;    // (n_tensors) elements this rank wrote, likewise
  int64_t *nonfinite;  // (n_tensors) NaNs and infinities among them, likewise
  int64_t n_bytes;     // the tensors' bytes in the file (every rank's blocks together)
  char msg[CKPT_MSG];  // the failure's message
} ckpt_writer;

// Collective. 0, or -1 with w->msg (the same on every rank; nothing is left open and the
// temporary is removed). The tensors must stay unchanged until ckpt_write_end.
int ckpt_write_begin(ckpt_writer *w, const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors,
                     const ckpt_meta *meta, int keep, const ckpt_faults *faults);
// Not collective, no MPI and no HDF5: this rank's blocks by plain writes at their datasets'
// offsets (which HDF5 never writes: no fill values), then fsync. Every rank writes at once, so a
// save runs at the file system's speed rather than through MPI-IO's aggregators. 0, or -1 with
// w->msg at this rank's first failure (ckpt_write_end agrees on it).
int ckpt_write_blocks(ckpt_writer *w);
// Entry i's block, just written, into its dataset's checksum contribution and non-finite count.
void ckpt_write_count(ckpt_writer *w, int i);
// The test hooks (ckpt_faults) as the block writers apply them: the slow write (delay_s), the
// kill before writing entry i, and whether the write of entry i fails on this rank.
void ckpt_fault_delay(const ckpt_writer *w);
void ckpt_fault_kill(const ckpt_writer *w, int i);
int ckpt_fault_fails(const ckpt_writer *w, int i);
// The message of entry i's failed write into w->msg; reason says what failed.
void ckpt_write_failed(ckpt_writer *w, int i, const char *reason);
// Collective. rc: this rank's result of the blocks. Agrees on it, then as ckpt_save; frees what
// begin allocated. 0, or -1 with w->msg (the same on every rank).
int ckpt_write_end(ckpt_writer *w, int rc);

typedef struct ckpt_entry {
  int64_t step;
  char name[256];
} ckpt_entry;

// Lists files of dir matching prefix<digits>suffix, newest step first (malloc'd into *out).
// Returns the count, or -1 with errno set (ENOENT when dir does not exist).
int ckpt_list(const char *dir, const char *prefix, const char *suffix, ckpt_entry **out);
// Rank 0 before a write: makes the directory and creates the empty file tmp with n_bytes_needed
// allocated to it (so no later write of it can find the disk full); refuses, removing tmp, when
// they cannot be had. 0 or -1 + msg.
int ckpt_prepare_dir(const char *dir, const char *tmp, int64_t n_bytes_needed, char *msg);
// Rank 0 at start-up: makes the directory and shows that a file can be created in it. 0 or -1 + msg.
int ckpt_probe_dir(const char *dir, char *msg);
// Rank 0 after the write: fsync, atomic rename of tmp to final, fsync of dir. 0 or -1 + msg.
int ckpt_publish(const char *tmp, const char *final, const char *dir, char *msg);
// Rank 0 after a save: keeps the newest `keep` checkpoints (never `step`), drops stale temporaries.
void ckpt_rotate(const char *dir, int keep, int64_t step);

// Reading, with HDF5's printing off (the caller's business). Scalar numeric attribute: 1 read,
// 0 missing, -1 present but not one readable number. String attribute (fixed or variable length)
// into a malloc'd copy, same returns.
int ckpt_attr_read(hid_t loc, const char *name, hid_t mem_type, void *out);
int ckpt_attr_read_string(hid_t loc, const char *name, char **out);
// Root attributes, checked in the format's order and range-checked. meta may be NULL; version_out
// too. 0, or -1 / CKPT_DAMAGED with msg.
int ckpt_read_root(hid_t file, const char *path, ckpt_meta *meta, int32_t *version_out, char *msg);
// Serial read-only open (a shared lock where the file system has locks). The id, or < 0 with
// HDF5's reason.
hid_t ckpt_open_serial(const char *path, char reason[256]);
// Index of the first NaN or Inf of x[0..n), or -1.
int64_t ckpt_first_nonfinite(const float *x, int64_t n);
// The innermost HDF5 error description on the current stack (or "no detail from HDF5").
void ckpt_h5_reason(char out[256]);
// Whether this is rank 0 of MPI_COMM_WORLD (or MPI is not running): who prints notices.
int ckpt_is_world_root(void);

#endif
