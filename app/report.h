// What a run prints and records: the model line at the start, a progress line, a JSON-lines
// metrics record and a TensorBoard event (app/tensorboard.h) per logged step, all from the same
// values (trainer_log), and the run report at the end (trainer_report),
// with the step split of parallel/comm/timing.h.
#ifndef TRAINER_REPORT_H
#define TRAINER_REPORT_H

#include "app/trainer.h"

// Rank 0: opens log.metrics (appending after a resume). 0; a file that cannot be opened is a
// warning, and the run goes on without it.
int report_open(trainer *t);
// Collective, at start-up: with log.tensorboard set, rank 0 creates the folder (parents too) and
// a new event file in it, so a folder that cannot be written is refused before the first step.
// 0, or -1 with a one-line message (the same on every rank) naming the folder and the fix.
int report_open_events(trainer *t, char *err, size_t n_err);
// Once the start point is known (t->step): a resumed run skips the steps the folder already
// holds; a run from step 0 in a folder with earlier events gets a one-line notice (rank 0).
void report_events_start(trainer *t);
// Closes the metrics file and the event file; safe twice.
void report_close(trainer *t);
// Collective (the fewest OpenMP threads of any rank): parameters, micro-batches, backend, ranks;
// with fp8.param_gather a line with the bytes of the weights' all-gather per step, and with
// optimizer.offload one with the pinned host memory of the optimizer's state.
void report_model_line(trainer *t);

#endif
