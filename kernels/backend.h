// A compute backend is a table of functions plus a context, chosen at run time (the ggml
// way): the model calls every op through it, so the same model code runs on CPU ranks or on
// GPUs. Pointers are in the backend's memory. Op semantics are those of kernels/cpu/ops_cpu.h,
// the reference every other backend is tested against.
// Dtypes: the residual stream, norms, statistics, gradients, optimizer state and everything a
// collective carries are fp32 (float *). Tensors typed `void *` below are in the backend's
// activation dtype `act`: the GEMM operands, the compute copy of the weight matrices, q/k/v,
// attention output, SwiGLU tensors and logits (fp32 on CPU, bf16 on GPUs by default).
#ifndef TRAINER_BACKEND_H
#define TRAINER_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/base/held.h"

// K_F16 (IEEE binary16) appears only as a wire type of the compressed DP reduction (quant16).
typedef enum k_dtype { K_F32 = 0, K_BF16 = 1, K_F16 = 2 } k_dtype;
static inline size_t k_dtype_bytes(k_dtype t) { return t == K_F32 ? 4 : 2; }

// FP8 formats (OCP FP8): E4M3 (largest finite 448, no Inf, NaN 0x7F / 0xFF) for weights and
// activations, E5M2 (largest finite 57344, Inf and NaN as IEEE) for gradients. An FP8 tensor is
// uint8_t codes plus a per-tensor fp32 scale: code = fp8(x * scale), x ~ decode(code) * scale_inv.
// kernels/cpu/fp8_cpu.h holds the exact rounding every backend follows.
typedef enum k_fp8 { K_E4M3 = 0, K_E5M2 = 1 } k_fp8;

// Vector instruction sets of the CPU GEMM, widest first after AUTO.
typedef enum k_isa { K_ISA_AUTO = 0, K_ISA_AVX512, K_ISA_AVX2, K_ISA_SSE } k_isa;

// How a backend computes; the run's config (train.precision, train.attention, train.cpu_isa,
// log.peak_tflops) fills it. Zero-initialised = the defaults. A backend keeps what it uses in its
// context for its whole life: the ops read nothing else (no environment, no process state).
typedef struct k_backend_opts {
  k_dtype act;         // activation dtype: K_BF16 or K_F32 on GPUs; the CPU backend accepts K_F32 only
  int tf32;            // fp32 GEMMs may use TF32 (GPU, fp32 activations)
  int attn_own;        // the project's attention kernel instead of cuDNN's (GPU)
  int attn_atomic;     // cuDNN's attention backward accumulates dq with fp32 atomics: faster, with less
                       // workspace, but not bitwise reproducible (GPU); else its deterministic graph
  k_isa cpu_isa;       // widest vector instruction set of the CPU GEMM and AdamW (K_ISA_AUTO: the widest the CPU has)
  double peak_tflops;  // dense peak for MFU; 0: the device's known peak (989.4 for H100/H200), else none
  int device;          // GPU index (CUDA backend)
} k_backend_opts;

// A span for the multi-tensor optimizer ops: n_elem elements from offset in the gradient and
// moments (the optimizer's shard), and from p_offset in the weights and their compute copy (the
// flat parameter buffer); decay says whether weight decay applies to it.
typedef struct k_range {
  int64_t offset, n_elem;
  int decay;
  int64_t p_offset;
} k_range;

// A span of a flat buffer that belongs to one tensor of a list: n_elem elements from at, with the
// tensor's index (its scale and amax) in tensor (fp8_cast_spans).
typedef struct k_span {
  int64_t at, n_elem;
  int tensor;
} k_span;

typedef struct k_backend {
  const char *name;  // "cpu", "cuda"
  char device_name[128];  // e.g. "NVIDIA H200", or the CPU model
  double peak_tflops;     // dense peak for MFU (k_backend_opts.peak_tflops, else known); 0 = unknown
  k_dtype act;            // activation dtype (see above)
  void *ctx;  // the backend's own state (streams, handles, caches, options); every op reads it through b
  // Frees what ctx holds (streams, library handles, workspaces) once the queued work is done;
  // called by k_backend_free. NULL: nothing to free.
  void (*release)(struct k_backend *b);
  // Memory.
  void *(*alloc)(struct k_backend *b, size_t n_bytes);  // zero-filled
  void (*free)(struct k_backend *b, void *p);
  void (*to_host)(struct k_backend *b, void *dst_host, const void *src, size_t n_bytes);
  void (*from_host)(struct k_backend *b, void *dst, const void *src_host, size_t n_bytes);
  void (*copy)(struct k_backend *b, void *dst, const void *src, size_t n_bytes);
  void (*zero)(struct k_backend *b, void *p, size_t n_bytes);
  void (*sync)(struct k_backend *b);
  // Bytes of memory in use now: device memory in use (whole device) on GPUs, resident set on CPU.
  int64_t (*mem_used)(struct k_backend *b);
  // Bytes held now through alloc (the caller's own buffers; not the context, libraries' workspaces
  // or communicators' buffers), so that mem_used can be split into the two; and by what they hold:
  // mem_kind names the kind of the buffers alloc makes from now on (returning the kind before).
  int64_t (*mem_held)(struct k_backend *b);
  void (*mem_held_by_kind)(struct k_backend *b, int64_t bytes[K_MEM_KINDS]);
  k_mem_kind (*mem_kind)(struct k_backend *b, k_mem_kind kind);
  // Host memory the device also addresses (pinned and mapped on GPUs: its pointers are valid in
  // kernels, so ops may read and write it over the host link; plain memory on CPU ranks),
  // zero-filled; NULL when the system refuses it (the caller says how much and what to do).
  void *(*host_alloc)(struct k_backend *b, size_t n_bytes);
  void (*host_free)(struct k_backend *b, void *p);
  // A copy between backend memory and host_alloc memory (either way) on the backend's copy
  // stream, after the work queued so far on the compute stream; returns at once with a ticket.
  // copy_wait blocks the host until the copy of a ticket (and every earlier one) is done (it may
  // be called from another thread while no copy is being queued);
  // copy_join makes the compute work queued from now on wait for every copy queued so far;
  // copy_join_ticket for the copy of one ticket (and every earlier one) only, not the later ones.
  // Neither blocks the host.
  int64_t (*copy_async)(struct k_backend *b, void *dst, const void *src, size_t n_bytes);
  void (*copy_wait)(struct k_backend *b, int64_t ticket);
  void (*copy_join)(struct k_backend *b);
  void (*copy_join_ticket)(struct k_backend *b, int64_t ticket);
  // A second compute stream, for work that may run beside the compute stream's (the optimizer's
  // update of the groups a forward has not reached yet). side_begin: the ops queued from now on
  // run on the side stream, after the work queued so far on the compute stream; side_end: they go
  // to the compute stream again, and the ticket returned stands for the side work queued so far;
  // side_join_ticket: the compute work queued from now on waits for it (and all side work before
  // it; -1: for all side work queued so far). Neither blocks the host. Only ops that use no
  // scratch or library handle may run on the side stream: adamw_ranges, copy, zero. The CPU
  // backend runs them in place (tickets 0).
  void (*side_begin)(struct k_backend *b);
  int64_t (*side_end)(struct k_backend *b);
  void (*side_join_ticket)(struct k_backend *b, int64_t ticket);
  // Ops.
  // C(M,N) = alpha op(A) op(B) + beta C; A and B in act dtype; C in c_type (act or K_F32).
  void (*gemm)(struct k_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda, const void *B,
               int ldb, float beta, void *C, int ldc, k_dtype c_type);
  // A linear layer adding into the residual stream: D (M,N) = A (M,K) W (N,K)^T + C (M,N); A, W
  // in act dtype, C and D fp32 (D == C allowed).
  void (*linear_residual)(struct k_backend *b, int M, int N, int K, const void *A, const void *W, const float *C, float *D);
  // dst[i] = src[i] converted (a copy when the dtypes agree).
  void (*cast)(struct k_backend *b, void *dst, k_dtype dst_type, const void *src, k_dtype src_type, int64_t n);
  void (*rmsnorm_bwd)(struct k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                      int64_t rows, int d);
  // y (rows, d) = x / rms(x) * w in act dtype (the norm and the cast for a GEMM in one pass);
  // rstd (rows) = 1 / rms(x), kept for the backward.
  void (*rmsnorm_fwd_act)(struct k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d, float eps);
  // rmsnorm_bwd that also writes the updated dx (rows, d) in act dtype to dx_act (NULL: not).
  void (*rmsnorm_bwd_act)(struct k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                          void *dx_act, int64_t rows, int d);
  // Sequence-major (row (t, b) = t*B + b); rows of q/k/v and their gradients at stride ld, so
  // they can be column blocks of one fused QKV projection (see k_cpu_attn_fwd).
  void (*rope)(struct k_backend *b, void *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse);
  void (*attn_fwd)(struct k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B, int T, int nh,
                   int nkv, int hd);
  void (*attn_bwd)(struct k_backend *b, const void *dout, const void *q, const void *k, const void *v, int64_t ld, const void *o,
                   const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv, int hd);
  // Decoding with a KV cache: one query row (nh heads of hd, packed) against n_keys >= 1 cached
  // rows of keys and values (stride ld, nkv heads of hd at the row start), all visible; o (nh*hd)
  // packed; head h reads kv head h / (nh/nkv), scale 1/sqrt(hd) (k_cpu_attn_decode).
  void (*attn_decode)(struct k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, int n_keys,
                      int nh, int nkv, int hd);
  // gu (rows, 2n): gate columns then up columns (one fused projection); out (rows, n).
  void (*swiglu_fwd)(struct k_backend *b, const void *gu, void *out, int64_t rows, int n);
  void (*swiglu_bwd)(struct k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n);
  // table in the act dtype (the compute copy): out is the same on every rank that holds it,
  // whoever updated the fp32 master.
  void (*embed_fwd)(struct k_backend *b, const int32_t *tokens, const void *table, float *out, int64_t n, int d, int v0,
                    int n_vocab_local);
  void (*embed_bwd)(struct k_backend *b, const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d, int v0,
                    int n_vocab_local);
  void (*ce_local_stats)(struct k_backend *b, const void *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                         float *row_max, float *row_sumexp, float *target_logit);
  void (*ce_bwd)(struct k_backend *b, void *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local, int v0,
                 float scale);
  // Combining the stats of ce_local_stats on the device (no host round trip): ce_rescale moves
  // each rank's sum of exponentials to the global max; ce_loss writes lse = gmax + log(sumexp)
  // and *loss (one double in backend memory) = sum over rows of lse - target_logit.
  void (*ce_rescale)(struct k_backend *b, float *row_sumexp, const float *row_max, const float *gmax, int64_t rows);
  void (*ce_loss)(struct k_backend *b, const float *gmax, const float *sumexp, const float *target_logit, float *lse, int64_t rows,
                  double *loss);
  // y (fp32) += x, x fp32 or bf16 (widened exactly: the sum rounds once, in fp32).
  void (*add)(struct k_backend *b, float *y, const void *x, k_dtype x_type, int64_t n);
  // Multi-tensor optimizer ops: one pass over a list of ranges, with no host round trip per
  // range (kernels/cpu/optim_cpu.c is the reference). Sum of squares of x over the ranges: each
  // range as k_cpu_sumsq sums it, the range sums added in list order in fp64; one read by the host.
  double (*sumsq_ranges)(struct k_backend *b, const float *x, const k_range *r, int n_ranges);
  // AdamW as k_cpu_adamw does it, over the ranges, on g * g_scale (clipping folded in), weight_decay
  // where the range's decay is set; offset indexes g, m and v, p_offset p and pc. pc (NULL: none)
  // gets the updated p rounded to pc_type, the compute copy of the weights.
  void (*adamw_ranges)(struct k_backend *b, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                       int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                       float bc2, float g_scale);
  // FP8 (per-tensor scaling; semantics and rounding of kernels/cpu/fp8_cpu.h). Scales and amaxes
  // stay in backend memory so that delayed scaling needs no host round trip.
  // x (rows, cols) in act dtype -> out (rows, cols) = fp8(x * *scale) in fmt, rounded to nearest
  // even, saturating to +-448 (E4M3) / +-57344 (E5M2), Inf included; NaN becomes 0x7F. out_t
  // (cols, rows) gets the same codes transposed: the K-major copy that the backward GEMMs read.
  // Either may be NULL (not written; both NULL: the amax alone, for current scaling). *amax (1 float, non-negative) = max(*amax, max |x|) of the unscaled x; a NaN in x
  // makes it NaN. One pass over x.
  void (*fp8_cast)(struct k_backend *b, const void *x, int64_t rows, int cols, const float *scale, k_fp8 fmt, uint8_t *out,
                   uint8_t *out_t, float *amax);
  // C (M,N) = beta C_in + (A B^T) * *a_scale_inv * *b_scale_inv: A (M,K) and B (N,K) FP8 codes,
  // both K-major (row-major, K innermost: the one layout Hopper's FP8 GEMMs take), fp32
  // accumulation; C (ldc N) in c_type (act or K_F32); C_in is c_in, or C itself (in place) when
  // c_in is NULL; c_in (same dtype and shape) is only read, so a residual add needs no copy into
  // C first. beta 0 overwrites C without reading either, beta 1 accumulates (the weight
  // gradient). The scale pointers are read when the GEMM runs. M, N, K positive multiples of 16,
  // pointers 16-byte aligned; E5M2 x E5M2 is refused (k_fp8_gemm_check).
  // fast_accum: the GPU may skip the periodic promotion of partial sums to fp32 (faster, less
  // accurate; usually forward only).
  void (*gemm_fp8)(struct k_backend *b, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, const float *a_scale_inv,
                   const uint8_t *B, k_fp8 b_fmt, const float *b_scale_inv, float beta, const void *c_in, void *C,
                   k_dtype c_type, int fast_accum);
  // Delayed scaling's update for n tensors at once (len 1 with use_max 0: current scaling).
  // amax_history (n, len): row i gets amax[i] at column pos; a = the row's max (use_max; a NaN
  // in the row wins) or amax[i]; if a is finite and > 0, scale[i] = fp8_max(fmt[i]) / a /
  // 2^margin, clamped to [FLT_MIN, FLT_MAX], and scale_inv[i * inv_stride] = 1 / scale[i]
  // (a stride of 4 keeps each one 16-byte aligned, as cuBLASLt's scale pointers must be);
  // otherwise both stay. amax[i] is reset to 0. *n_nonfinite (1 int) += the number of tensors whose amax[i]
  // (this step's) is NaN or Inf. fmt (n) holds k_fp8 values. Scales start at 1 (the caller's).
  void (*fp8_scales)(struct k_backend *b, float *amax_history, float *amax, float *scale, float *scale_inv, int inv_stride,
                     const uint8_t *fmt, int n, int len, int pos, int margin, int use_max, int *n_nonfinite);
  // Gradient compression for the DP reduction (kernels/cpu/quant_cpu.h: formats, rounding,
  // scales; every backend bit for bit). res (NULL: none) is the error-feedback residual: what is
  // quantised is x + res, and res becomes what the quantisation dropped. Pointers to amax, scales
  // and counters are backend memory, so no op waits for the host.
  // *amax = max(*amax, max |x + res|); a NaN makes it NaN.
  void (*grad_amax)(struct k_backend *b, float *amax, const float *x, const float *res, int64_t n);
  // dst (n, t = K_F16 or K_BF16) = round((x + res) * 2^e), e from *amax over n_sum ranks for
  // fp16 (amax NULL or bf16: e = 0); *n_underflow (NULL: not counted) += non-zero values that
  // became +-0.
  void (*quant16)(struct k_backend *b, void *dst, k_dtype t, const float *x, float *res, int64_t n, const float *amax,
                  int n_sum, int64_t *n_underflow);
  // dst (n) = widen(src) * 2^-e, e as quant16's.
  void (*dequant16)(struct k_backend *b, float *dst, const void *src, k_dtype t, int64_t n, const float *amax, int n_sum);
  // int8 codes q (n) and one fp32 scale per block of K_QBLOCK (k_qblocks(n) scales) of x + res.
  void (*quant_i8)(struct k_backend *b, int8_t *q, float *scales, const float *x, float *res, int64_t n);
  // dst (n) = sum over n_src sources, in order, of q_s * scale_s in fp32; source s's codes and
  // scales lie s * stride bytes after q and scales.
  void (*dequant_i8)(struct k_backend *b, float *dst, const int8_t *q, const float *scales, int64_t n, int n_src,
                     int64_t stride);
  // swiglu_fwd, then fp8_cast of its output (E4M3, per-tensor *scale, out8 the codes, no
  // transpose), in one pass: out, out8 and *amax bit for bit those of the two ops in a row on
  // this backend (the codes from out as stored in the act dtype). For an FP8 input whose scale
  // is known before it is made (delayed scaling): a pass over the tensor fewer. out may be NULL:
  // then only the codes and the amax are written (the same codes).
  void (*swiglu_fwd_fp8)(struct k_backend *b, const void *gu, void *out, int64_t rows, int n, const float *scale,
                         uint8_t *out8, float *amax);
  // rmsnorm_fwd_act, then fp8_cast of y (E4M3, per-tensor *scale, out8 the codes, no transpose),
  // in one pass: y, rstd, out8 and *amax bit for bit those of the two ops in a row on this
  // backend (the codes from y as stored in the act dtype). Same use as swiglu_fwd_fp8; y may be
  // NULL likewise (rstd, the codes and the amax are written).
  void (*rmsnorm_fwd_fp8)(struct k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d,
                          float eps, const float *scale, uint8_t *out8, float *amax);
  // swiglu_bwd, then fp8_cast of its output dgu (rows, 2n) in fmt with the per-tensor *scale:
  // out8 (rows, 2n) the codes, out8_t (2n, rows) the same codes transposed (neither NULL), in
  // one pass: dgu, out8, out8_t and *amax bit for bit those of the two ops in a row on this
  // backend (the codes from dgu as stored in the act dtype). dgu may be NULL (not written) where
  // only the codes are read: the output gradient of an FP8 projection whose scale is known
  // before it is made (delayed scaling) saves a write and a read of the tensor.
  void (*swiglu_bwd_fp8)(struct k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n,
                         const float *scale, k_fp8 fmt, uint8_t *out8, uint8_t *out8_t, float *amax);
  // FP8 block scaling (fp8.recipe=block): E4M3 with an fp32 scale per 1 x 128 or 128 x 128 tile
  // from the tile's own amax; semantics, rounding and the scale arrays' layouts are those of
  // kernels/cpu/fp8_cpu.h (k_cpu_fp8_cast_block, k_cpu_gemm_fp8_block), bit for bit for the cast.
  // x (rows, cols) act dtype; tile 1: out in 1 x 128 tiles along cols, out_t (cols, rows) in 1 x
  // 128 tiles along rows; tile 128: both the same 128 x 128 tiles. Outputs may be NULL.
  void (*fp8_cast_block)(struct k_backend *b, const void *x, int64_t rows, int cols, int tile, uint8_t *out,
                         float *scale_inv, uint8_t *out_t, float *scale_inv_t, float *amax);
  // C (M,N) = beta C + A B^T, A (M,K) and B (N,K) block-scaled E4M3 codes (tiles 1 or 128, not
  // both 128), K-major; C in c_type (act or K_F32); fp32 accumulation per 128-column block.
  void (*gemm_fp8_block)(struct k_backend *b, int M, int N, int K, const uint8_t *A, int a_tile, const float *a_scale_inv,
                         const uint8_t *B, int b_tile, const float *b_scale_inv, float beta, void *C, k_dtype c_type);
  // fp8_cast over a host list of spans of a flat buffer, one pass and no host round trip per span
  // (fp8.param_gather: the parts of the weights a rank updated): for each span s, out[s.at, +
  // s.n_elem) = fp8(x[same] * scale[s.tensor]) in fmt (no transpose), and amax[s.tensor] =
  // max(amax[s.tensor], max |x[same]|) as fp8_cast takes it. x in act dtype; out or amax may be
  // NULL (not written; scale is read only with out).
  void (*fp8_cast_spans)(struct k_backend *b, const void *x, const k_span *spans, int n_spans, const float *scale,
                         k_fp8 fmt, uint8_t *out, float *amax);
  // codes_t (cols, rows) = codes (rows, cols) transposed, one byte each: an FP8 tensor's K-major
  // copy from its codes, the same bytes fp8_cast writes to out_t.
  void (*fp8_transpose)(struct k_backend *b, const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t);
} k_backend;

// alloc, the buffer counted under kind (mem_kind), the kind before left as it was.
static inline void *k_alloc_as(k_backend *b, size_t n_bytes, k_mem_kind kind) {
  const k_mem_kind before = b->mem_kind(b, kind);
  void *p = b->alloc(b, n_bytes);
  b->mem_kind(b, before);
  return p;
}

#ifdef __cplusplus
extern "C" {
#endif
// Fills b->peak_tflops: peak_tflops when > 0 (the caller's k_backend_opts.peak_tflops), else
// 989.4 for an H100/H200 device_name (BF16 dense), else 0 (MFU is not reported).
void k_backend_set_peak(k_backend *b, double peak_tflops);

// The CPU reference backend (OpenMP threads of this rank). o: NULL = defaults; o->act must be
// K_F32; o->cpu_isa caps the GEMM and AdamW kernels; the GPU fields are ignored.
k_backend *k_backend_cpu_create(const k_backend_opts *o);
// Releases the context (b->release) and the table; safe twice (*b is NULL after).
void k_backend_free(k_backend **b);
#ifdef __cplusplus
}
#endif

#endif
