// Host memory the GPU addresses directly (pinned and mapped), the copy stream that moves
// data between it and device memory (kernels/backend.h: host_alloc ... copy_join), and the side
// stream (side_begin ... side_join_ticket). The state of each stream (the stream and a ring of
// events, one per ticket) lives in the backend's context and is made on its first use.
#ifndef TRAINER_HOST_CUDA_H
#define TRAINER_HOST_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void *k_cuda_host_alloc(k_backend *b, size_t n_bytes);
void k_cuda_host_free(k_backend *b, void *p);
int64_t k_cuda_copy_async(k_backend *b, void *dst, const void *src, size_t n_bytes);
void k_cuda_copy_wait(k_backend *b, int64_t ticket);
void k_cuda_copy_join(k_backend *b);
void k_cuda_copy_join_ticket(k_backend *b, int64_t ticket);
void k_cuda_side_begin(k_backend *b);
int64_t k_cuda_side_end(k_backend *b);
void k_cuda_side_join_ticket(k_backend *b, int64_t ticket);

#ifdef __cplusplus
}
#endif

#endif
