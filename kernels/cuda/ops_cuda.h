// The CUDA ops behind the backend table: the signatures of kernels/backend.h and the semantics
// of kernels/cpu/ops_cpu.h (row-major, device pointers), so each one is tested against its
// k_cpu_ twin. fp32 arguments are float *; the `void *` tensors are in the activation dtype of
// backend b (float or bf16; math in fp32, results rounded to nearest even on store).
// b is the CUDA backend the op runs on (k_backend_cuda_create): each op enqueues,
// asynchronously, on b's compute stream, and uses b's activation dtype, scratch and caches.
// Determinism: no float atomics anywhere; every reduction runs in a fixed order, so the same
// inputs give bitwise the same outputs on the same GPU model (bitwise resume relies on it).
#ifndef TRAINER_OPS_CUDA_H
#define TRAINER_OPS_CUDA_H

#include "kernels/backend.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// kernels/cuda/backend_cuda.cu (cuBLAS, fp32 accumulation; fp32 activations use TF32 only when
// b was created with opts.tf32). A, B in act dtype; C in c_type (act or K_F32).
void k_cuda_gemm(k_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
                 int ldb, float beta, void *C, int ldc, k_dtype c_type);

// kernels/cuda/gemm_lt.cu (cuBLASLt): D (M,N) fp32 = A (M,K) W (N,K)^T + C (M,N) fp32.
void k_cuda_linear_residual(k_backend *b, int M, int N, int K, const void *A, const void *W, const float *C, float *D);

// kernels/cuda/gemm_lt.cu (cuBLASLt): C (M,N) = beta C + (A (M,K) B (N,K)^T) * *a_scale_inv *
// *b_scale_inv, FP8 operands (kernels/cpu/fp8_cpu.h: k_fp8_gemm_check's rules), C act or fp32.
void k_cuda_gemm_fp8(k_backend *b, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, const float *a_scale_inv, const uint8_t *B,
                     k_fp8 b_fmt, const float *b_scale_inv, float beta, const void *c_in, void *C, k_dtype c_type,
                     int fast_accum);

// kernels/cuda/fp8_cuda.cu: the fused FP8 cast (scale, round, transpose, amax) of act-dtype x,
// and delayed scaling's update (kernels/cpu/fp8_cpu.h, bit for bit).
void k_cuda_fp8_cast(k_backend *b, const void *x, int64_t rows, int cols, const float *scale, k_fp8 fmt, uint8_t *out,
                     uint8_t *out_t, float *amax);
void k_cuda_fp8_scales(k_backend *b, float *amax_history, float *amax, float *scale, float *scale_inv, int inv_stride,
                       const uint8_t *fmt, int n, int len, int pos, int margin, int use_max, int *n_nonfinite);
// FP8 codes (rows, cols) transposed (fp8_cuda.cu, the cast's tiles).
void k_cuda_fp8_transpose(k_backend *b, const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t);
// SwiGLU writing the FP8 codes of its output too (fp8_cuda.cu; swiglu_fwd then fp8_cast, bit for bit).
void k_cuda_swiglu_fwd_fp8(k_backend *b, const void *gu, void *out, int64_t rows, int n, const float *scale, uint8_t *out8,
                           float *amax);
// SwiGLU's backward writing the FP8 codes of dgu, transposed codes and amax too, dgu itself
// optional (fp8_cuda.cu; swiglu_bwd then fp8_cast, bit for bit).
void k_cuda_swiglu_bwd_fp8(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n,
                           const float *scale, k_fp8 fmt, uint8_t *out8, uint8_t *out8_t, float *amax);
// FP8 block scaling (kernels/cpu/fp8_cpu.h): the cast (fp8_cuda.cu, bit for bit) and the GEMM
// (gemm_lt.cu, cuBLASLt's VEC128_32F / BLK128x128_32F scale modes).
void k_cuda_fp8_cast_block(k_backend *b, const void *x, int64_t rows, int cols, int tile, uint8_t *out, float *scale_inv,
                           uint8_t *out_t, float *scale_inv_t, float *amax);
void k_cuda_gemm_fp8_block(k_backend *b, int M, int N, int K, const uint8_t *A, int a_tile, const float *a_scale_inv,
                           const uint8_t *B, int b_tile, const float *b_scale_inv, float beta, void *C, k_dtype c_type);

// kernels/cuda/ops_cuda.cu
// Any dtype pair; fp32 -> bf16 rounds to nearest even. Independent of the activation dtype.
void k_cuda_cast(k_backend *b, void *dst, k_dtype dst_type, const void *src, k_dtype src_type, int64_t n);
void k_cuda_rmsnorm_bwd(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                        int64_t rows, int d);
// rmsnorm_bwd in one pass; dx_act (may be NULL) gets the updated dx in the act dtype.
void k_cuda_rmsnorm_bwd_act(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                            void *dx_act, int64_t rows, int d);
void k_cuda_rmsnorm_fwd_act(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d, float eps);
// rmsnorm_fwd_act writing the FP8 codes and amax of y too (rmsnorm_fwd_act then fp8_cast, bit for bit).
void k_cuda_rmsnorm_fwd_fp8(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d,
                            float eps, const float *scale, uint8_t *out8, float *amax);
void k_cuda_rope(k_backend *b, void *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse);
void k_cuda_swiglu_fwd(k_backend *b, const void *gu, void *out, int64_t rows, int n);
void k_cuda_swiglu_bwd(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n);
void k_cuda_embed_fwd(k_backend *b, const int32_t *tokens, const void *table, float *out, int64_t n, int d, int v0,
                      int n_vocab_local);
void k_cuda_embed_bwd(k_backend *b, const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                      int n_vocab_local);
void k_cuda_ce_local_stats(k_backend *b, const void *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                           float *row_max, float *row_sumexp, float *target_logit);
void k_cuda_ce_bwd(k_backend *b, void *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local, int v0,
                   float scale);
void k_cuda_ce_rescale(k_backend *b, float *row_sumexp, const float *row_max, const float *gmax, int64_t rows);
void k_cuda_ce_loss(k_backend *b, const float *gmax, const float *sumexp, const float *target_logit, float *lse, int64_t rows,
                    double *loss);
void k_cuda_add(k_backend *b, float *y, const void *x, k_dtype x_type, int64_t n);

// kernels/cuda/quant_cuda.cu: gradient compression (kernels/cpu/quant_cpu.h, bit for bit).
void k_cuda_grad_amax(k_backend *b, float *amax, const float *x, const float *res, int64_t n);
void k_cuda_quant16(k_backend *b, void *dst, k_dtype t, const float *x, float *res, int64_t n, const float *amax,
                    int n_sum, int64_t *n_underflow);
void k_cuda_dequant16(k_backend *b, float *dst, const void *src, k_dtype t, int64_t n, const float *amax, int n_sum);
void k_cuda_quant_i8(k_backend *b, int8_t *q, float *scales, const float *x, float *res, int64_t n);
void k_cuda_dequant_i8(k_backend *b, float *dst, const int8_t *q, const float *scales, int64_t n, int n_src,
                       int64_t stride);

// kernels/cuda/attention.cu. Head dims: a multiple of 4, at most 256. q/k/v/o/dout/dq/dk/dv in
// act dtype, lse fp32; sequence-major, q/k/v/dq/dk/dv rows at stride ld (see k_cpu_attn_fwd).
void k_cuda_attn_fwd(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B, int T,
                     int nh, int nkv, int hd);
void k_cuda_attn_bwd(k_backend *b, const void *dout, const void *q, const void *k, const void *v, int64_t ld, const void *o,
                     const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv, int hd);

#ifdef __cplusplus
}
#endif

#endif
