// CPU reference kernels: fp32, row-major, OpenMP. Every op the model needs, forward and
// backward. Deterministic: the same inputs give bitwise the same outputs whatever the thread
// count schedule (static partitions, no racy reductions), which bitwise resume relies on.
// Conventions: "accumulate" means the op adds into its output (+=); otherwise it overwrites.
#ifndef TRAINER_OPS_CPU_H
#define TRAINER_OPS_CPU_H

#include <stdint.h>

#include "kernels/backend.h"  // k_isa

// C(M,N) = alpha * op(A) * op(B) + beta * C. op(A) is (M,K): A is (M,K) with lda, or (K,M) if
// trans_a. op(B) is (K,N): B is (K,N) with ldb, or (N,K) if trans_b. Row-major, leading dims in
// elements. beta == 0 overwrites C (NaNs in C are not propagated).
void k_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);
// The same on the widest kernel the CPU runs of at most isa (k_cpu_gemm: K_ISA_AUTO, the widest).
// The AVX-512 and AVX2 kernels agree bitwise; the SSE one (no FMA) rounds differently.
void k_cpu_gemm_isa(k_isa isa, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

// D (M,N) = A (M,K) W (N,K)^T + C (M,N): a linear layer adding into the residual stream; D == C
// allowed (otherwise they must not overlap).
void k_cpu_linear_residual(int M, int N, int K, const float *A, const float *W, const float *C, float *D);

// RMSNorm over the last dim: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
// x, y: (rows, d); w: (d); rstd: (rows), saved for backward.
void k_cpu_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t rows, int d, float eps);
// dx accumulate (rows, d); dw accumulate (d).
void k_cpu_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                       int64_t rows, int d);

// Layouts are sequence-major like the residual stream: row (t, b) is row t * B + b.
// Rotary embedding in place on the first H heads of hd of each of the T*B rows of x (row
// stride ld >= H*hd elements; the rest of a row is untouched); row (t, b) has position pos0 + t.
// Pairs are (i, i + hd/2) for i < hd/2 (the "rotate half" convention), angle =
// pos * theta^(-2i/hd). inverse = 1 rotates by -angle (the backward of the forward rotation).
void k_cpu_rope(float *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse);

// Causal attention with grouped-query heads, sequence-major. q, k, v: rows (t, b) at stride ld
// elements, nh (q) or nkv (k, v) heads of hd at the row start (so q, k, v may be column blocks
// of one fused projection output (T*B, ld)); o (T, B, nh, hd) packed; lse (B, nh, T) the
// log-sum-exp of the scaled scores, saved for backward. Head h reads kv head h / (nh/nkv).
// Scale 1/sqrt(hd).
void k_cpu_attn_fwd(const float *q, const float *k, const float *v, int64_t ld, float *o, float *lse, int B, int T,
                    int nh, int nkv, int hd);
// dout like o; dq, dk, dv overwrite the heads of rows at stride ld, laid out as q, k, v.
void k_cpu_attn_bwd(const float *dout, const float *q, const float *k, const float *v, int64_t ld, const float *o,
                    const float *lse, float *dq, float *dk, float *dv, int B, int T, int nh, int nkv, int hd);

// SwiGLU over rows of a fused gate/up projection: gu (rows, 2n), gate in columns [0, n), up in
// [n, 2n); out (rows, n) = silu(gate) * up. Backward overwrites dgu (rows, 2n), same layout.
void k_cpu_swiglu_fwd(const float *gu, float *out, int64_t rows, int n);
void k_cpu_swiglu_bwd(const float *dout, const float *gu, float *dgu, int64_t rows, int n);

// Vocab-parallel embedding: this rank holds rows [v0, v0 + n_vocab_local) of the table
// (n_vocab_local, d). out (n, d): the row of each token, zeros where the token is not local.
// table_f32 is fp32 (void for the backend table's act-dtype slot).
void k_cpu_embed_fwd(const int32_t *tokens, const void *table_f32, float *out, int64_t n, int d, int v0,
                     int n_vocab_local);
// dtable accumulate: dtable[tok - v0] += dout[i] for local tokens.
void k_cpu_embed_bwd(const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                     int n_vocab_local);

// Vocab-parallel cross-entropy, local part. logits (rows, n_vocab_local) hold vocab entries
// [v0, v0 + n_vocab_local). Per row: row_max = max of local logits, row_sumexp = sum exp(l -
// row_max), target_logit = logit of targets[r] if it is local, else 0.
void k_cpu_ce_local_stats(const float *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                          float *row_max, float *row_sumexp, float *target_logit);
// In place: logits become scale * (softmax - onehot(target)), with lse (rows) the global
// log-sum-exp of each row.
void k_cpu_ce_bwd(float *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local,
                  int v0, float scale);

// Device-side combination of the stats above (the model calls them between tp collectives):
// row_sumexp *= exp(row_max - gmax), gmax the max over tp ranks.
void k_cpu_ce_rescale(float *row_sumexp, const float *row_max, const float *gmax, int64_t rows);
// lse[r] = gmax[r] + log(sumexp[r]); *loss = sum over r, in row order, of (double)lse[r] - target_logit[r].
void k_cpu_ce_loss(const float *gmax, const float *sumexp, const float *target_logit, float *lse, int64_t rows,
                   double *loss);

// AdamW step on n elements (decoupled weight decay): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + wd * p), bc1 = 1-b1^t, bc2 = 1-b2^t.
void k_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                 float eps, float weight_decay, float bc1, float bc2);

// Sum of squares in double, deterministic (fixed blocking, fixed order of partial sums).
double k_cpu_sumsq(const float *x, int64_t n);
// x *= s
void k_cpu_scale(float *x, int64_t n, float s);
// y += x
// y += x, x fp32 or bf16 (widened exactly).
void k_cpu_add(float *y, const void *x, k_dtype x_type, int64_t n);

#endif
