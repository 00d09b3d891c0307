// Check macros for the CUDA runtime and cuBLAS, the GPU members of the one family in
// kernels/base/check.h: on failure they print rank, device, function, file:line, the failed call and
// the library's own message (through check_fail), then end the whole job with MPI_Abort.
// Includable from C and from CUDA C++ (check_fail keeps C linkage either way).
#ifndef TRAINER_CUDA_CHECK_H
#define TRAINER_CUDA_CHECK_H

// mpi.h must not pull in the C++ bindings when nvcc compiles this as C++.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/base/check.h"
#ifdef __cplusplus
}
#endif

// The device is part of the message: with one rank per GPU it tells which card failed.
static inline void k_cuda_fail(const char *file, int line, const char *func, const char *what, const char *lib,
                               const char *name, const char *text) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  char msg[512];
  snprintf(msg, sizeof msg, "%s error %s: %s (device %d)", lib, name, text, dev);
  check_fail(file, line, func, what, msg);
}

#define CUDA_CHECK(call)                                                                            \
  do {                                                                                              \
    cudaError_t cuda_rc_ = (call);                                                                  \
    if (cuda_rc_ != cudaSuccess)                                                                    \
      k_cuda_fail(__FILE__, __LINE__, __func__, #call, "CUDA", cudaGetErrorName(cuda_rc_),          \
                  cudaGetErrorString(cuda_rc_));                                                    \
  } while (0)

#define CUBLAS_CHECK(call)                                                                          \
  do {                                                                                              \
    cublasStatus_t cublas_rc_ = (call);                                                             \
    if (cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                        \
      k_cuda_fail(__FILE__, __LINE__, __func__, #call, "cuBLAS", cublasGetStatusName(cublas_rc_),   \
                  cublasGetStatusString(cublas_rc_));                                               \
  } while (0)

// After every kernel launch: catches bad launch configurations at once (asynchronous faults
// inside the kernel surface at the next synchronising call, which is checked too).
#define CUDA_LAUNCH_CHECK(kernel_name)                                                              \
  do {                                                                                              \
    cudaError_t cuda_rc_ = cudaGetLastError();                                                      \
    if (cuda_rc_ != cudaSuccess)                                                                    \
      k_cuda_fail(__FILE__, __LINE__, __func__, "launch of " kernel_name, "CUDA",                   \
                  cudaGetErrorName(cuda_rc_), cudaGetErrorString(cuda_rc_));                        \
  } while (0)

#endif
