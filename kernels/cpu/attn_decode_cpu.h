// The CPU reference of the decoding attention (backend op attn_decode): one query row against a
// KV cache, fp32. The CUDA twin is kernels/cuda/attn_decode.cu.
#ifndef TRAINER_ATTN_DECODE_CPU_H
#define TRAINER_ATTN_DECODE_CPU_H

#include <stdint.h>

// q (nh * hd): one query row, heads packed. k, v: rows t < n_keys (n_keys >= 1) at stride ld
// elements, nkv heads of hd at the row start (a KV cache, or column blocks of a fused
// projection). o (nh * hd) packed. Head h reads kv head h / (nh / nkv); scores scaled by
// 1/sqrt(hd); every key is visible (the cache holds the positions up to the query's own), so
// o is what row n_keys - 1 of k_cpu_attn_fwd gives over the same keys.
void k_cpu_attn_decode(const float *q, const float *k, const float *v, int64_t ld, float *o, int n_keys, int nh, int nkv,
                       int hd);

#endif
