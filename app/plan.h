// `trainer CONFIG --dry-run`: the layout of a run (which rank holds which layers, heads and
// vocab slice), parameters per rank, a memory estimate per rank, and the command that launches
// it on nodes of --gpus-per-node GPUs (which groups stay inside a node), without allocating.
#ifndef TRAINER_PLAN_H
#define TRAINER_PLAN_H

#include <stdint.h>
#include "app/config.h"

// The command line the plan's launch lines repeat.
typedef struct plan_launch {
  const char *argv0, *config;  // the trainer as it was called, the config path
  const char *const *over;     // (n_over) section.key=value overrides
  int n_over;
  int gpus_per_node;           // ranks per node of the launch lines (at most the world size)
  int gpu_mem_gib;             // --gpu-mem: a GPU's memory in GiB, for the fit check; 0 = not given
} plan_launch;

// Local parameters of a rank at pipeline stage pp_rank (every tp rank holds as many).
int64_t plan_rank_params(const cfg *c, int pp_rank);
// Pinned host memory in bytes of a rank holding n local parameters under optimizer.offload
// (0 without offload): the master weights and moments of the host share (sharded over dp with
// the distributed optimizer), and the cpu engine's copies of a few buckets of gradient and new
// weights.
double plan_host_bytes(const cfg *c, int64_t n);
// Prints the plan of c (validated for world_size ranks) to stdout. Returns 0.
int run_plan(const cfg *c, int world_size, const plan_launch *launch);

#endif
