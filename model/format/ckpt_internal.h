// Checkpoint internals shared by model/format/ckpt.c (HDF5 I/O), model/format/ckpt_dir.c (listing, creating,
// publishing and rotating checkpoint files) and model/format/ckpt_verify.c (the standalone check).
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
