// Checkpoint directory handling and the message helper, shared by model/ckpt.c (HDF5 I/O) and
// model/ckpt_dir.c (listing, creating, publishing and rotating checkpoint files).
#ifndef TRAINER_CKPT_INTERNAL_H
#define TRAINER_CKPT_INTERNAL_H

#include <stdint.h>

#define CKPT_MSG 2048   // internal message buffer; copied into the caller's err
#define CKPT_PATH 4096

// Formats into a CKPT_MSG buffer.
void ckpt_msgf(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct ckpt_entry {
  int64_t step;
  char name[256];
} ckpt_entry;

// Lists files of dir matching prefix<digits>suffix, newest step first (malloc'd into *out).
// Returns the count, or -1 with errno set (ENOENT when dir does not exist).
int ckpt_list(const char *dir, const char *prefix, const char *suffix, ckpt_entry **out);
// Rank 0 before a write: makes the directory, refuses when n_bytes_needed cannot fit. 0 or -1 + msg.
int ckpt_prepare_dir(const char *dir, int64_t n_bytes_needed, char *msg);
// Rank 0 at start-up: makes the directory and shows that a file can be created in it. 0 or -1 + msg.
int ckpt_probe_dir(const char *dir, char *msg);
// Rank 0 after the write: fsync, atomic rename of tmp to final, fsync of dir. 0 or -1 + msg.
int ckpt_publish(const char *tmp, const char *final, const char *dir, char *msg);
// Rank 0 after a save: keeps the newest `keep` checkpoints (never `step`), drops stale temporaries.
void ckpt_rotate(const char *dir, int keep, int64_t step);

#endif
