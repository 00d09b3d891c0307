// TensorBoard event files, written without a protobuf library: each file is a sequence of
// TFRecords (length, masked CRC-32C of the length, data, masked CRC-32C of the data) whose data
// is a tensorflow.Event (event.proto): the first one names the file version, each later one
// holds one logged step's scalars as a Summary of simple values (summary.proto). The format and
// the tags the trainer writes: docs/metrics.md.
#ifndef TRAINER_TENSORBOARD_H
#define TRAINER_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct tb_writer {
  FILE *f;               // NULL = closed
  int64_t last_step;     // the largest step in the folder's event files when it was opened (0: none)
  int64_t skip_through;  // steps at or below it are not written (tb_resume)
} tb_writer;

// One value of a step: the tag TensorBoard charts it under, and the value (stored as float32).
typedef struct tb_scalar {
  const char *tag;
  double value;
} tb_scalar;

// Creates dir (parents too) and a new event file in it, events.out.tfevents.<unix time>.<host>
// (".1", ".2", ... appended while that name exists, so no earlier file is ever overwritten), and
// writes the file-version event. 0, or -1 with a one-line message naming the folder and the fix.
int tb_open(tb_writer *w, const char *dir, char *err, size_t n_err);
// A run resumed from a checkpoint: the steps the folder already holds (written by the run that
// stopped after that checkpoint, with the same values when the resume is bitwise) are not written
// again, so no step appears twice.
void tb_resume(tb_writer *w);
// One event at step holding the n scalars, flushed to the file (nothing for a step tb_resume
// skips). 0, or -1 when the write failed.
int tb_write_scalars(tb_writer *w, int64_t step, const tb_scalar *s, int n);
// Safe twice and on a writer never opened (zeroed).
void tb_close(tb_writer *w);

#endif
