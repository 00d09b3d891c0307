// The CUDA backend: every op of kernels/backend.h on one GPU, device memory, one compute
// stream, bf16 (default) or fp32 activations. Declarations only; the kernels live in kernels/cuda/*.cu behind extern "C".
#ifndef TRAINER_BACKEND_CUDA_H
#define TRAINER_BACKEND_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Number of visible CUDA devices (0 when there is no driver or GPU; never aborts).
int k_cuda_device_count(void);
// Backend on `device` (cudaSetDevice is called). Aborts with a message when CUDA fails.
// Activations are bf16 (act = K_BF16) unless TRAINER_CUDA_ACT=f32 (for debugging and op tests).
k_backend *k_backend_cuda_create(int device);
// The same with an explicit activation dtype (tests). The ops of the table run on the stream,
// scratch and activation dtype of the backend created last (a file-static current context:
// the table's signatures carry no backend), so when a process makes several (a test running
// fp32 then bf16), it uses the ops of one only while it is the latest.
k_backend *k_backend_cuda_create_dtype(int device, k_dtype act);
// Frees the backend and its context (stream, cuBLAS and cuDNN state, workspaces); safe twice.
// The same as k_backend_free, which calls the table's release entry.
void k_backend_cuda_free(k_backend **b);
// The backend's compute stream (a cudaStream_t): collectives run on it so they are ordered
// with the kernels without extra synchronisation.
void *k_cuda_stream(void);

#ifdef __cplusplus
}
#endif

#endif
