// Where the time of a training step goes, for the run report of scaling studies. Each phase
// is bracketed by a backend sync, so on GPUs the figures are completed work, not enqueue time.
// Compute and communication share one stream today, so nothing overlaps and every
// communication second is exposed.
#ifndef TRAINER_TIMING_H
#define TRAINER_TIMING_H

#include <mpi.h>
#include "kernels/backend.h"

typedef struct step_timing {
  double data;       // batch assembly and upload
  double compute;    // forward and backward kernels (tp collectives excluded)
  double tp_comm;    // tensor/sequence-parallel collectives
  double pp_comm;    // pipeline send/recv groups, including the wait for the peer (bubble)
  double dp_comm;    // gradient reduction over dp (and over tp for sequence-parallel norms)
  double optimizer;  // norm, clipping, AdamW, parameter all-gather (ZeRO-1)
} step_timing;

// Seconds on the wall clock once the backend's queued work has finished.
static inline double timing_now(k_backend *be) {
  be->sync(be);
  return MPI_Wtime();
}

#endif
