// Causal bf16 attention through cuDNN's fused flash-attention engines (cuDNN 9 graph API, C
// backend descriptors), as an optional fast path beside the trainer's own kernels in
// kernels/cuda/attention.cu: each entry point returns 0 when cuDNN ran it and -1, without
// aborting, when cuDNN cannot do the shape, so the caller falls back to its own kernel.
//
// Semantics are those of k_cpu_attn_fwd / k_cpu_attn_bwd (kernels/cpu/ops_cpu.h), sequence-major:
// q, dq (nh heads) and k, v, dk, dv (nkv heads) rows (t, b) at stride ld elements (a multiple of
// 8), o, dout (T,B,nh,hd) packed, all bf16 (__nv_bfloat16, passed as void *), device memory,
// 16-byte aligned; lse (B,nh,T) fp32, the natural-log log-sum-exp of the scaled
// causal scores (cuDNN's softmax "stats" are exactly that, so it goes straight in and out).
// Scale 1/sqrt(hd); head h reads kv head h / (nh/nkv). dq, dk, dv are overwritten.
//
// State: a k_cudnn_attn holds the cuDNN handles (one per device it ran on), the plan cache and
// the workspace; the CUDA backend owns one (made on its first bf16 attention call), a test may
// make its own. Nothing is shared between two of them.
// Streams: work is enqueued on cuda_stream (a cudaStream_t; NULL is the legacy default stream).
// One workspace is shared by all calls on one k_cudnn_attn, so its calls must be ordered on one
// stream, or the caller must synchronise between calls made on different streams.
// Plans: the first call of a shape builds an execution plan (milliseconds to seconds: cuDNN may
// compile kernels at run time) and caches it, keyed by (device, direction, B, T, nh, nkv, hd, ld,
// determinism); a shape cuDNN refuses is cached as refused and costs nothing on later calls.
// Not thread-safe: call each k_cudnn_attn from one host thread.
#ifndef TRAINER_ATTN_CUDNN_H
#define TRAINER_ATTN_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k_cudnn_attn k_cudnn_attn;

// A new, empty state (no cuDNN handle yet; the first call on a device makes one). When the
// loaded cuDNN is older than 9, says so on stderr, and every call returns -1.
k_cudnn_attn *k_cudnn_attn_create(void);
// Frees every cached plan, the workspace and the cuDNN handles; *a is NULL after, so it is safe
// twice. Work queued on them must be done (the CUDA backend syncs its stream first).
void k_cudnn_attn_free(k_cudnn_attn **a);

int k_cudnn_attn_fwd(k_cudnn_attn *a, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse,
                     int B, int T, int nh, int nkv, int hd, void *cuda_stream);
int k_cudnn_attn_bwd(k_cudnn_attn *a, const void *dout, const void *q, const void *k, const void *v, int64_t ld,
                     const void *o, const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv,
                     int hd, void *cuda_stream);

// Backward flavour for a's plans built from now on. 1 (the default): the deterministic graph, where
// dq is one matmul written once (cuDNN keeps dP in a workspace of about 2*B*nh*T*T bytes); if
// cuDNN cannot plan that for a shape, the atomic graph below is used instead and
// k_cudnn_attn_info reports it. 0: dq accumulates in an fp32 buffer with atomics (less
// workspace, not bitwise reproducible).
void k_cudnn_attn_set_deterministic(k_cudnn_attn *a, int on);
// The deterministic backward's dP takes B*nh*T*T elements of workspace (2 GiB and more at T 4096):
// where the plan of a shape asks for more than n_bytes (0: the default, 512 MiB), the backward runs in
// pieces (fewer heads, then one sequence at a time), each with the workspace of its own plan. Every
// (sequence, head) is computed alone, so the values are those of one call. From the next call on.
void k_cudnn_attn_set_bwd_cap(k_cudnn_attn *a, size_t n_bytes);

// What a's plan of a shape is, for logs and tests. dir: 0 forward, 1 backward. Returns 0 and
// fills info if a plan for that shape exists (was built by an earlier call on a), else -1 (also
// when a is NULL).
typedef struct {
  int64_t engine;         // cuDNN's global engine index
  int64_t workspace;      // bytes this plan uses in the shared workspace (cuDNN's plus ours)
  int deterministic;      // backward: the deterministic graph was planned and cuDNN flags no nondeterminism
  int padded;             // backward: the T % 128 workaround (a padding mask) is in the graph
  int pieces;             // backward: calls it runs in (k_cudnn_attn_set_bwd_cap); forward 1
} k_cudnn_attn_info;
int k_cudnn_attn_info_get(const k_cudnn_attn *a, int dir, int B, int T, int nh, int nkv, int hd, int64_t ld,
                          k_cudnn_attn_info *info);

// The cuDNN version loaded at run time (e.g. 91400), 0 if the library cannot be used.
int k_cudnn_attn_version(void);

#ifdef __cplusplus
}
#endif

#endif
