// Named ranges on the profiler timeline (Nsight Systems): forward, backward, DP sync, optimizer.
// NVTX3 from the CUDA toolkit, header-only; without CUDA the calls compile to nothing.
#ifndef TRAINER_TRACE_H
#define TRAINER_TRACE_H

#ifdef TRAINER_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
static inline void trace_push_range(const char *name) { nvtxRangePushA(name); }
static inline void trace_pop_range(void) { nvtxRangePop(); }
#else
static inline void trace_push_range(const char *name) { (void)name; }
static inline void trace_pop_range(void) {}
#endif

#endif
