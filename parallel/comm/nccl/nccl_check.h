// Check macro for NCCL calls from host C code (the NCCL communicator, its test and commbench),
// in the house family of kernels/base/check.h; CUDA_CHECK comes from kernels/cuda/cuda_check.h. On
// failure: rank, device, function, file:line, the failed call and NCCL's own message, then the
// job ends.
#ifndef TRAINER_NCCL_CHECK_H
#define TRAINER_NCCL_CHECK_H

#include <nccl.h>

#include "kernels/cuda/cuda_check.h"

// The device named in messages (-1 when CUDA cannot tell).
static inline int nccl_check_device(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) d = -1;
  return d;
}

// ncclGetLastError(NULL) carries NCCL's detail ("peer rank 3 closed the connection") beyond
// the bare result code.
#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    ncclResult_t nccl_rc_ = (call);                                                        \
    if (nccl_rc_ != ncclSuccess)                                                           \
      k_cuda_fail(__FILE__, __LINE__, __func__, #call, "NCCL", ncclGetErrorString(nccl_rc_), \
                  ncclGetLastError(NULL));                                                 \
  } while (0)

#endif
