// Where the time of a training step goes, for the run report of scaling studies. The host
// waits for the GPU only at phase boundaries (no sync per kernel or per compute step), so the
// figures are completed work, not enqueue time, and the waits do not stall the GPU's queue:
//   data       batch assembly and upload (from the step's start to its upload done)
//   compute    forward and backward of every micro-batch (from the upload done to the last
//              backward kernel done), minus pp_comm and tp_comm; DP buckets started during
//              backward overlap it on the communication stream, and its slow-down is in here
//   tp_comm    tp/SP collectives, measured (with a sync around each) only when the run asks for
//              it (log.time_tp=true); else 0 and inside compute
//   pp_comm    pipeline send/recv groups: from the compute queued before a group being done to
//              the group's end, so the bubble (waiting for the peer) is in here
//   dp_comm    exposed DP communication: from backward done (compute stream) to the last bucket
//              (or the ZeRO reduce-scatter) arrived, plus the tp reduction of SP norm gradients
//              not yet done; the overlapped part of the DP traffic is not in any figure. With
//              parallel.shard=grads or weights and log.time_dp=true also what forward and backward
//              wait for (the weights' all-gathers, the reduce-scatter before the next group's),
//              measured with a sync around each wait; else that is in compute
//   dp_gather  of dp_comm, the weights' all-gathers that forward and backward waited for
//              (parallel.shard=weights with log.time_dp=true; else 0)
//   optimizer  gradient norm, clipping, AdamW, compute-copy refresh, ZeRO all-gather; with
//              optimizer.offload_layer_wait also the host's time in the host update that the
//              next forward runs before its layers (not in compute). The GPU runs the forward
//              already queued meanwhile, so that part is an upper bound of the time the update
//              exposes, and compute a lower bound of the forward's (exact on CPU ranks). With
//              optimizer.update_overlap (parallel.shard=weights) the update of all but the norms
//              runs beside the next forward: its time, and its slowing of that forward, are in compute
#ifndef TRAINER_TIMING_H
#define TRAINER_TIMING_H

#include <mpi.h>
#include "kernels/backend.h"

typedef struct step_timing {
  double data;       // batch assembly and upload
  double compute;    // forward and backward kernels (tp collectives excluded)
  double tp_comm;    // tensor/sequence-parallel collectives (when measured, see above)
  double pp_comm;    // pipeline send/recv groups, including the wait for the peer (bubble)
  double dp_comm;    // exposed gradient reduction over dp (not hidden behind backward)
  double dp_gather;  // of dp_comm: the weights' all-gathers waited for (parallel.shard=weights, log.time_dp)
  double optimizer;  // norm, clipping, AdamW, parameter all-gather (ZeRO-1)
} step_timing;

// Seconds on the wall clock once the backend's queued work has finished.
static inline double timing_now(k_backend *be) {
  be->sync(be);
  return MPI_Wtime();
}

#endif
