// Check macros for CUDA runtime and NCCL calls made from host C code (the NCCL communicator,
// its test and commbench), in the house family of kernels/check.h: they print rank, device,
// function, file:line, the failed call and the library's own message, then abort the job.
// Guarded per macro so a translation unit that also includes the CUDA backend's checks keeps
// one definition.
#ifndef TRAINER_NCCL_CHECK_H
#define TRAINER_NCCL_CHECK_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kernels/check.h"

// The device is part of every message: with one process per GPU, "which card" is the first
// question when a collective fails.
static inline int nccl_check_device(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) d = -1;
  return d;
}

#ifndef CUDA_CHECK
#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t cuda_rc_ = (call);                                                         \
    if (cuda_rc_ != cudaSuccess) {                                                         \
      char cuda_msg_[256];                                                                 \
      snprintf(cuda_msg_, sizeof cuda_msg_, "device %d: %s: %s", nccl_check_device(),      \
               cudaGetErrorName(cuda_rc_), cudaGetErrorString(cuda_rc_));                  \
      check_fail(__FILE__, __LINE__, __func__, #call, cuda_msg_);                          \
    }                                                                                      \
  } while (0)
#endif

// ncclGetLastError(NULL) carries NCCL's detail ("peer rank 3 closed the connection") beyond
// the bare result code.
#ifndef NCCL_CHECK
#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    ncclResult_t nccl_rc_ = (call);                                                        \
    if (nccl_rc_ != ncclSuccess) {                                                         \
      char nccl_msg_[512];                                                                 \
      snprintf(nccl_msg_, sizeof nccl_msg_, "device %d: %s (%s)", nccl_check_device(),     \
               ncclGetErrorString(nccl_rc_), ncclGetLastError(NULL));                      \
      check_fail(__FILE__, __LINE__, __func__, #call, nccl_msg_);                          \
    }                                                                                      \
  } while (0)
#endif

#endif
