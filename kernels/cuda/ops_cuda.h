// The CUDA ops behind the backend table: the signatures and semantics of kernels/cpu/ops_cpu.h
// (fp32, row-major, device pointers), so each one is tested against its k_cpu_ twin. They take
// no stream argument because the table's signatures have none: each enqueues, asynchronously,
// on the compute stream of the current CUDA backend (the one k_backend_cuda_create made last).
// Determinism: no float atomics anywhere; every reduction runs in a fixed order, so the same
// inputs give bitwise the same outputs on the same GPU model (bitwise resume relies on it).
#ifndef TRAINER_OPS_CUDA_H
#define TRAINER_OPS_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// kernels/cuda/backend_cuda.cu (cuBLAS; fp32 compute unless TRAINER_CUDA_TF32=1).
void k_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);

// kernels/cuda/ops_cuda.cu
void k_cuda_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t rows, int d, float eps);
void k_cuda_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                        int64_t rows, int d);
void k_cuda_rope(float *x, int B, int T, int H, int hd, int pos0, float theta, int inverse);
void k_cuda_swiglu_fwd(const float *gate, const float *up, float *out, int64_t n);
void k_cuda_swiglu_bwd(const float *dout, const float *gate, const float *up, float *dgate, float *dup, int64_t n);
void k_cuda_embed_fwd(const int32_t *tokens, const float *table, float *out, int64_t n, int d, int v0,
                      int n_vocab_local);
void k_cuda_embed_bwd(const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                      int n_vocab_local);
void k_cuda_ce_local_stats(const float *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                           float *row_max, float *row_sumexp, float *target_logit);
void k_cuda_ce_bwd(float *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local,
                   int v0, float scale);
void k_cuda_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float bc1, float bc2);
// Synchronises the stream: the sum comes back to the host.
double k_cuda_sumsq(const float *x, int64_t n);
void k_cuda_scale(float *x, int64_t n, float s);
void k_cuda_add(float *y, const float *x, int64_t n);
void k_cuda_transpose_tb(float *dst, const float *src, int T, int B, int64_t inner);

// kernels/cuda/attention.cu. Head dims: a multiple of 4, at most 256.
void k_cuda_attn_fwd(const float *q, const float *k, const float *v, float *o, float *lse, int B, int T, int nh,
                     int nkv, int hd);
void k_cuda_attn_bwd(const float *dout, const float *q, const float *k, const float *v, const float *o,
                     const float *lse, float *dq, float *dk, float *dv, int B, int T, int nh, int nkv, int hd);

#ifdef __cplusplus
}
#endif

#endif
