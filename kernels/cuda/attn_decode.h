// The decoding attention on the GPU (backend op attn_decode): one query row against a KV cache,
// the semantics of k_cpu_attn_decode (kernels/cpu/attn_decode_cpu.h), its CPU reference.
#ifndef TRAINER_ATTN_DECODE_CUDA_H
#define TRAINER_ATTN_DECODE_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// q, k, v, o in b's activation dtype (math in fp32); head dims up to 256; n_keys >= 1. One
// block per query head walks the keys in chunks with a running max and sum (any n_keys in
// fixed shared memory), in a fixed order: the same inputs give the same bits.
void k_cuda_attn_decode(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, int n_keys, int nh,
                        int nkv, int hd);

#ifdef __cplusplus
}
#endif

#endif
