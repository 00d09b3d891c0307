// The CUDA backend: every op of kernels/backend.h on one GPU, device memory, one compute
// stream. Declarations only; the kernels live in kernels/cuda/*.cu behind extern "C".
#ifndef TRAINER_BACKEND_CUDA_H
#define TRAINER_BACKEND_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Number of visible CUDA devices (0 when there is no driver or GPU; never aborts).
int k_cuda_device_count(void);
// Backend on `device` (cudaSetDevice is called). Aborts with a message when CUDA fails.
k_backend *k_backend_cuda_create(int device);
// The backend's compute stream (a cudaStream_t): collectives run on it so they are ordered
// with the kernels without extra synchronisation.
void *k_cuda_stream(void);

#ifdef __cplusplus
}
#endif

#endif
