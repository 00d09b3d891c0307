// Checks before a run with optimizer.offload=host allocates its host state: a one-line notice on
// CPU ranks (the state is host memory already), a warning when the cpu engine has one OpenMP
// thread, and whether each node's available memory holds what its ranks will pin.
#ifndef TRAINER_RUN_OFFLOAD_H
#define TRAINER_RUN_OFFLOAD_H

#include <stddef.h>
#include "app/config.h"
#include "kernels/backend.h"
#include "parallel/comm/grid.h"

// Collective over the world. 0, or -1 on every rank with a message naming the node's need, its
// MemAvailable and the fix. Without offload: 0 at once.
int run_offload_check(const cfg *c, const grid *g, const k_backend *be, char *err, size_t n_err);
// Bytes of MemAvailable in /proc/meminfo text; -1 when it is not there.
double run_mem_available(const char *meminfo);

#endif
