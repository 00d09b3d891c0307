// The CUDA backend: every op of kernels/backend.h on one GPU, device memory, one compute
// stream, bf16 or fp32 activations. Declarations only; the kernels live in kernels/cuda/*.cu
// behind extern "C".
#ifndef TRAINER_BACKEND_CUDA_H
#define TRAINER_BACKEND_CUDA_H

#include "kernels/backend.h"
#include "kernels/cuda/attn_cudnn.h"

#ifdef __cplusplus
extern "C" {
#endif

// Number of visible CUDA devices (0 when there is no driver or GPU; never aborts).
int k_cuda_device_count(void);
// Whether GPU `device` can train in FP8 (k_fp8_device_check on its name and compute capability):
// 0, or -1 with a one-line message in err. Never aborts on a missing driver (then -1 too).
int k_cuda_device_fp8_check(int device, char *err, size_t n_err);
// Backend on GPU o->device (cudaSetDevice is called) with o->act activations (K_BF16 or K_F32;
// the caller chooses: a zeroed o, or NULL, means fp32), TF32 for fp32 GEMMs when o->tf32, the
// own attention kernel instead of cuDNN's when o->attn_own, o->peak_tflops for MFU. Every op of
// the table runs on this backend's own stream, scratch and caches, so several backends may
// live in one process. Aborts with a message when CUDA fails. k_backend_free frees it (stream,
// cuBLAS, cuBLASLt and cuDNN state, workspaces).
k_backend *k_backend_cuda_create(const k_backend_opts *o);
// b's compute stream (a cudaStream_t): collectives run on it so they are ordered with the
// kernels without extra synchronisation. b must be a CUDA backend.
void *k_cuda_stream_of(const k_backend *b);
// b's cuDNN attention state, for k_cudnn_attn_info_get (logs, benchmarks); NULL until b's first
// attention call that may use cuDNN (bf16 activations, not opts.attn_own).
k_cudnn_attn *k_cuda_cudnn_attn_of(const k_backend *b);

#ifdef __cplusplus
}
#endif

#endif
