// The one place that turns a run's config into its execution environment: the backend (CPU,
// or CUDA on the GPU this rank's node-local rank picks), the communicator factory (MPI, NCCL or
// the staged MPI one) with the options the config names, and the process grid built from it.
#ifndef TRAINER_FACTORY_H
#define TRAINER_FACTORY_H

#include "app/config.h"
#include "kernels/backend.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/launch.h"

typedef struct factory {
  k_backend *be;
  comm_factory comms;
  grid g;
  int have_grid;
  launch_place place;  // this rank's node and node-local rank
  int device;          // the GPU this rank runs on, or -1 (CPU)
  cfg_tp_overlap tp_overlap;  // what parallel.tp_overlap resolved to: p2p, nccl (also MPI) or none
} factory;

// The backend options train.precision, train.attention, train.cpu_isa and log.peak_tflops ask for.
k_backend_opts factory_backend_opts(const cfg *c, int on_gpu);
// Collective. Builds the backend, communicators and grid. 0, or -1 with a message in err (a
// GPU asked for and none visible, a precision the CPU backend cannot run).
int factory_init(factory *f, const cfg *c, char *err, size_t n_err);
// The backend of a one-process tool (build/sample) on device (as train.device; auto: GPU 0 when
// one is visible): fp32 activations and, on a GPU, full fp32 GEMMs
// (no TF32), so that it computes what the CPU does. NULL with a message naming the option when
// cuda is asked for and there is no GPU (or no CUDA backend in the build).
k_backend *factory_tool_backend(cfg_device device, char *err, size_t n_err);
// Collective. Communicators first (NCCL's streams and events belong to the backend's device).
// Safe twice.
void factory_free(factory *f);

#endif
