// The CPU backend: host memory and the reference kernels of kernels/cpu/. Its context holds the
// one option the kernels read, the instruction set of the GEMM and AdamW kernels.
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/base/check.h"
#include "kernels/cpu/attn_decode_cpu.h"
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cpu/optim_cpu.h"
#include "kernels/cpu/quant_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include <string.h>
#include <unistd.h>

typedef struct cpu_ctx {
  k_isa isa;  // the widest kernel the backend's GEMMs and AdamW may use
  k_held held;  // what alloc handed out and free has not taken back
} cpu_ctx;

static void *cpu_alloc(k_backend *b, size_t n_bytes) {
  void *p = XCALLOC(n_bytes, 1);
  k_held_add(&((cpu_ctx *)b->ctx)->held, p, (int64_t)n_bytes);
  return p;
}
static void cpu_free(k_backend *b, void *p) {
  if (p) k_held_remove(&((cpu_ctx *)b->ctx)->held, p);
  free(p);
}
static int64_t cpu_mem_held(k_backend *b) { return ((cpu_ctx *)b->ctx)->held.total; }
static void cpu_mem_held_by_kind(k_backend *b, int64_t bytes[K_MEM_KINDS]) {
  k_held_by_kind(&((cpu_ctx *)b->ctx)->held, bytes);
}
static k_mem_kind cpu_mem_kind(k_backend *b, k_mem_kind kind) { return k_held_set_kind(&((cpu_ctx *)b->ctx)->held, kind); }
static void cpu_host_free(k_backend *b, void *p) { (void)b; free(p); }
static void cpu_copy(k_backend *b, void *dst, const void *src, size_t n_bytes) {
  (void)b;
  if (n_bytes) memmove(dst, src, n_bytes);
}
static void cpu_zero(k_backend *b, void *p, size_t n_bytes) { (void)b; if (n_bytes) memset(p, 0, n_bytes); }
static void cpu_sync(k_backend *b) { (void)b; }

// Host memory is the CPU backend's own memory: "pinned" memory is plain calloc memory and the
// copy stream is memmove, done when it is queued; so the offloaded optimizer's bookkeeping
// (tickets, joins) runs on CPU ranks with the same calls as on GPUs.
static void *cpu_host_alloc(k_backend *b, size_t n_bytes) { (void)b; return calloc(n_bytes ? n_bytes : 1, 1); }
static int64_t cpu_copy_async(k_backend *b, void *dst, const void *src, size_t n_bytes) {
  cpu_copy(b, dst, src, n_bytes);
  return 0;
}
static void cpu_copy_done(k_backend *b, int64_t ticket) { (void)b; (void)ticket; }
static int64_t cpu_side_end(k_backend *b) { (void)b; return 0; }

static int64_t cpu_mem_used(k_backend *b) {
  (void)b;
  long pages_total = 0, pages_resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
  fclose(f);
  return (int64_t)pages_resident * sysconf(_SC_PAGESIZE);
}

void k_backend_set_peak(k_backend *b, double peak_tflops) {
  if (peak_tflops > 0) b->peak_tflops = peak_tflops;
  else if (strstr(b->device_name, "H100") || strstr(b->device_name, "H200")) b->peak_tflops = 989.4;
  else b->peak_tflops = 0;
}

// The CPU backend computes in fp32 only (act = K_F32): the act-typed pointers of the table are
// float arrays, and these wrappers only change the pointer types. A GEMM's C may be bf16 (the tp
// reductions' bf16 partial sums, parallel.tp_reduce_dtype=bf16): computed in fp32 into a temporary
// (M, N), widened from C first where beta != 0, and rounded into C (row stride ldc) as the GPU's
// epilogue rounds.
static float *cpu_c_begin(k_dtype c_type, void *C, int M, int N, int ldc, float beta) {
  CHECK(c_type == K_F32 || c_type == K_BF16, "the CPU backend writes a GEMM's C in fp32 or bf16 (asked for dtype %d)",
        (int)c_type);
  if (c_type == K_F32) return C;
  float *t = XMALLOC((size_t)M * (size_t)N * sizeof *t);
  for (int i = 0; beta != 0.0f && i < M; i++)
    for (int j = 0; j < N; j++) t[(size_t)i * N + j] = k_bf16_to_f32(((const uint16_t *)C)[(size_t)i * ldc + j]);
  return t;
}
static void cpu_c_end(void *C, float *t, int M, int N, int ldc) {
  if (t == C) return;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) ((uint16_t *)C)[(size_t)i * ldc + j] = k_f32_to_bf16(t[(size_t)i * N + j]);
  free(t);
}
static void cpu_gemm(k_backend *b, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B, int ldb,
                     float beta, void *C, int ldc, k_dtype c_type) {
  float *c = cpu_c_begin(c_type, C, M, N, ldc, beta);
  k_cpu_gemm_isa(((const cpu_ctx *)b->ctx)->isa, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, c, c == C ? ldc : N);
  cpu_c_end(C, c, M, N, ldc);
}
static void cpu_linear_residual(k_backend *b, int M, int N, int K, const void *A, const void *W, const float *C, float *D) { (void)b;
  k_cpu_linear_residual(M, N, K, A, W, C, D);
}
// Activations are fp32 on the CPU; bf16 appears only as the DP gradient reduction's wire type.
static void cpu_cast(k_backend *b, void *dst, k_dtype dst_type, const void *src, k_dtype src_type, int64_t n) { (void)b;
  if (dst_type == K_BF16 && src_type == K_F32) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = k_f32_to_bf16(((const float *)src)[i]);
  } else if (dst_type == K_F32 && src_type == K_BF16) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = k_bf16_to_f32(((const uint16_t *)src)[i]);
  } else {
    CHECK(dst_type == src_type, "cast %d -> %d", (int)src_type, (int)dst_type);
    if (n && dst != src) memmove(dst, src, (size_t)n * k_dtype_bytes(dst_type));
  }
}
static void cpu_rope(k_backend *b, void *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse) { (void)b;
  k_cpu_rope(x, B, T, H, hd, ld, pos0, theta, inverse);
}
static void cpu_rmsnorm_fwd_act(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d, float eps) { (void)b;
  k_cpu_rmsnorm_fwd(x, w, y, rstd, rows, d, eps);
}
static void cpu_rmsnorm_bwd_act(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                                void *dx_act, int64_t rows, int d) { (void)b;
  k_cpu_rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, d);
  if (dx_act && dx_act != (void *)dx) memcpy(dx_act, dx, sizeof(float) * (size_t)(rows * d));
}
static void cpu_attn_fwd(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B, int T,
                         int nh, int nkv, int hd) { (void)b;
  k_cpu_attn_fwd(q, k, v, ld, o, lse, B, T, nh, nkv, hd);
}
static void cpu_attn_bwd(k_backend *b, const void *dout, const void *q, const void *k, const void *v, int64_t ld, const void *o,
                         const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv, int hd) { (void)b;
  k_cpu_attn_bwd(dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
}
static void cpu_attn_decode(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, int n_keys, int nh,
                            int nkv, int hd) { (void)b;
  k_cpu_attn_decode(q, k, v, ld, o, n_keys, nh, nkv, hd);
}
static void cpu_swiglu_fwd(k_backend *b, const void *gu, void *out, int64_t rows, int n) { (void)b; k_cpu_swiglu_fwd(gu, out, rows, n); }
static void cpu_swiglu_bwd(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n) { (void)b;
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
}
static void cpu_ce_local_stats(k_backend *b, const void *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                               float *row_max, float *row_sumexp, float *target_logit) { (void)b;
  k_cpu_ce_local_stats(logits, targets, rows, n_vocab_local, v0, row_max, row_sumexp, target_logit);
}
static void cpu_ce_bwd(k_backend *b, void *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local, int v0,
                       float scale) { (void)b;
  k_cpu_ce_bwd(logits, targets, lse, rows, n_vocab_local, v0, scale);
}

static void cpu_rmsnorm_bwd(k_backend *b, const float *dy, const float *x, const float *w, const float *rstd,
                            float *dx, float *dw, int64_t rows, int d) {
  (void)b;
  k_cpu_rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, d);
}
static void cpu_embed_fwd(k_backend *b, const int32_t *tokens, const void *table, float *out, int64_t n, int d,
                          int v0, int n_vocab_local) {
  (void)b;
  k_cpu_embed_fwd(tokens, table, out, n, d, v0, n_vocab_local);
}
static void cpu_embed_bwd(k_backend *b, const int32_t *tokens, const float *dout, float *dtable, int64_t n, int d,
                          int v0, int n_vocab_local) {
  (void)b;
  k_cpu_embed_bwd(tokens, dout, dtable, n, d, v0, n_vocab_local);
}
static void cpu_ce_rescale(k_backend *b, float *row_sumexp, const float *row_max, const float *gmax, int64_t rows) {
  (void)b;
  k_cpu_ce_rescale(row_sumexp, row_max, gmax, rows);
}
static void cpu_ce_loss(k_backend *b, const float *gmax, const float *sumexp, const float *target_logit, float *lse,
                        int64_t rows, double *loss) {
  (void)b;
  k_cpu_ce_loss(gmax, sumexp, target_logit, lse, rows, loss);
}
static void cpu_add(k_backend *b, float *y, const void *x, k_dtype x_type, int64_t n) {
  (void)b;
  k_cpu_add(y, x, x_type, n);
}
static double cpu_sumsq_ranges(k_backend *b, const float *x, const k_range *r, int n_ranges) {
  (void)b;
  return k_cpu_sumsq_ranges(x, r, n_ranges);
}
static void cpu_adamw_ranges(k_backend *b, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v,
                             const k_range *r, int n_ranges, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bc1, float bc2, float g_scale) {
  k_cpu_adamw_ranges_isa(((const cpu_ctx *)b->ctx)->isa, p, pc, pc_type, g, m, v, r, n_ranges, lr, beta1, beta2, eps,
                         weight_decay, bc1, bc2, g_scale);
}

// FP8: scales and amaxes are host memory here, read and written in place.
static void cpu_fp8_cast(k_backend *b, const void *x, int64_t rows, int cols, const float *scale, k_fp8 fmt, uint8_t *out,
                         uint8_t *out_t, float *amax) {
  (void)b;
  k_cpu_fp8_cast(x, rows, cols, *scale, fmt, out, out_t, amax);
}
static void cpu_gemm_fp8(k_backend *b, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, const float *a_scale_inv,
                         const uint8_t *B, k_fp8 b_fmt, const float *b_scale_inv, float beta, const void *c_in, void *C,
                         k_dtype c_type, int fast_accum) {
  (void)fast_accum;  // the CPU sums in fp32 either way
  CHECK(c_type == K_F32 || beta == 0.0f, "the CPU backend adds into a gemm_fp8's C in fp32 only (C dtype %d)",
        (int)c_type);
  if (c_in && c_in != C && beta != 0.0f) memcpy(C, c_in, (size_t)M * (size_t)N * sizeof(float));
  float *c = cpu_c_begin(c_type, C, M, N, N, beta);
  k_cpu_gemm_fp8(((const cpu_ctx *)b->ctx)->isa, M, N, K, A, a_fmt, *a_scale_inv, B, b_fmt, *b_scale_inv, beta, c);
  cpu_c_end(C, c, M, N, N);
}
static void cpu_swiglu_fwd_fp8(k_backend *b, const void *gu, void *out, int64_t rows, int n, const float *scale,
                               uint8_t *out8, float *amax) {
  (void)b;
  void *y = out ? out : XMALLOC((size_t)(rows * n) * sizeof(float));  // the CPU computes in fp32
  k_cpu_swiglu_fwd(gu, y, rows, n);
  k_cpu_fp8_cast(y, rows, n, *scale, K_E4M3, out8, NULL, amax);
  if (!out) free(y);
}
static void cpu_rmsnorm_fwd_fp8(k_backend *b, const float *x, const float *w, void *y, float *rstd, int64_t rows, int d,
                                float eps, const float *scale, uint8_t *out8, float *amax) {
  (void)b;
  void *v = y ? y : XMALLOC((size_t)(rows * d) * sizeof(float));  // the CPU computes in fp32
  k_cpu_rmsnorm_fwd(x, w, v, rstd, rows, d, eps);
  k_cpu_fp8_cast(v, rows, d, *scale, K_E4M3, out8, NULL, amax);
  if (!y) free(v);
}
static void cpu_swiglu_bwd_fp8(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n,
                               const float *scale, k_fp8 fmt, uint8_t *out8, uint8_t *out8_t, float *amax) {
  (void)b;
  CHECK(out8 && out8_t, "swiglu_bwd_fp8: the codes and the transposed codes are both required");
  float *tmp = dgu ? NULL : XMALLOC(sizeof(float) * (size_t)(rows * 2 * n) + 1);  // dgu NULL: made here, not kept
  float *g = dgu ? dgu : tmp;
  k_cpu_swiglu_bwd(dout, gu, g, rows, n);
  k_cpu_fp8_cast(g, rows, 2 * n, *scale, fmt, out8, out8_t, amax);
  free(tmp);
}
static void cpu_fp8_cast_block(k_backend *b, const void *x, int64_t rows, int cols, int tile, uint8_t *out, float *scale_inv,
                               uint8_t *out_t, float *scale_inv_t, float *amax) {
  (void)b;
  k_cpu_fp8_cast_block(x, rows, cols, tile, out, scale_inv, out_t, scale_inv_t, amax);
}
static void cpu_gemm_fp8_block(k_backend *b, int M, int N, int K, const uint8_t *A, int a_tile, const float *a_scale_inv,
                               const uint8_t *B, int b_tile, const float *b_scale_inv, float beta, void *C, k_dtype c_type) {
  (void)b;
  float *c = cpu_c_begin(c_type, C, M, N, N, beta);
  k_cpu_gemm_fp8_block(M, N, K, A, a_tile, a_scale_inv, B, b_tile, b_scale_inv, beta, c);
  cpu_c_end(C, c, M, N, N);
}
static void cpu_fp8_cast_spans(k_backend *b, const void *x, const k_span *spans, int n_spans, const float *scale,
                               k_fp8 fmt, uint8_t *out, float *amax) {
  (void)b;
  k_cpu_fp8_cast_spans(x, spans, n_spans, scale, fmt, out, amax);
}
static void cpu_fp8_transpose(k_backend *b, const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t) {
  (void)b;
  k_cpu_fp8_transpose(codes, rows, cols, codes_t);
}
static void cpu_fp8_scales(k_backend *b, float *amax_history, float *amax, float *scale, float *scale_inv, int inv_stride,
                           const uint8_t *fmt, int n, int len, int pos, int margin, int use_max, int *n_nonfinite) {
  (void)b;
  k_cpu_fp8_scales(amax_history, amax, scale, scale_inv, inv_stride, fmt, n, len, pos, margin, use_max, n_nonfinite);
}

static void cpu_release(k_backend *b) {
  k_held_free(&((cpu_ctx *)b->ctx)->held);
  free(b->ctx);
  b->ctx = NULL;
}

// Gradient compression (kernels/cpu/quant_cpu.c is the reference itself).
static void cpu_grad_amax(k_backend *b, float *amax, const float *x, const float *res, int64_t n) { (void)b;
  k_cpu_grad_amax(amax, x, res, n);
}
static void cpu_quant16(k_backend *b, void *dst, k_dtype t, const float *x, float *res, int64_t n, const float *amax,
                        int n_sum, int64_t *n_underflow) { (void)b;
  k_cpu_quant16(dst, t, x, res, n, amax, n_sum, n_underflow);
}
static void cpu_dequant16(k_backend *b, float *dst, const void *src, k_dtype t, int64_t n, const float *amax, int n_sum) {
  (void)b;
  k_cpu_dequant16(dst, src, t, n, amax, n_sum);
}
static void cpu_quant_i8(k_backend *b, int8_t *q, float *scales, const float *x, float *res, int64_t n) { (void)b;
  k_cpu_quant_i8(q, scales, x, res, n);
}
static void cpu_dequant_i8(k_backend *b, float *dst, const int8_t *q, const float *scales, int64_t n, int n_src,
                           int64_t stride) { (void)b;
  k_cpu_dequant_i8(dst, q, scales, n, n_src, stride);
}

k_backend *k_backend_cpu_create(const k_backend_opts *o) {
  const k_backend_opts defaults = {0};
  if (!o) o = &defaults;
  CHECK(o->act == K_F32, "the CPU backend computes in fp32 only: activation dtype %d asked for, use K_F32",
        (int)o->act);
  CHECK(o->cpu_isa >= K_ISA_AUTO && o->cpu_isa <= K_ISA_SSE, "CPU backend: unknown GEMM instruction set %d",
        (int)o->cpu_isa);
  cpu_ctx *c = XCALLOC(1, sizeof *c);
  c->isa = o->cpu_isa;
  k_backend *b = XCALLOC(1, sizeof *b);
  b->name = "cpu";
  b->ctx = c;
  b->release = cpu_release;
  b->alloc = cpu_alloc;
  b->free = cpu_free;
  b->to_host = cpu_copy;
  b->from_host = cpu_copy;
  b->copy = cpu_copy;
  b->zero = cpu_zero;
  b->sync = cpu_sync;
  b->mem_used = cpu_mem_used;
  b->mem_held = cpu_mem_held;
  b->mem_held_by_kind = cpu_mem_held_by_kind;
  b->mem_kind = cpu_mem_kind;
  b->host_alloc = cpu_host_alloc;
  b->host_free = cpu_host_free;
  b->copy_async = cpu_copy_async;
  b->copy_wait = cpu_copy_done;
  b->copy_join = cpu_sync;
  b->copy_join_ticket = cpu_copy_done;
  b->side_begin = cpu_sync;
  b->side_end = cpu_side_end;
  b->side_join_ticket = cpu_copy_done;
  snprintf(b->device_name, sizeof b->device_name, "cpu");
  k_backend_set_peak(b, o->peak_tflops);
  b->act = K_F32;
  b->gemm = cpu_gemm;
  b->linear_residual = cpu_linear_residual;
  b->cast = cpu_cast;
  b->rmsnorm_bwd = cpu_rmsnorm_bwd;
  b->rmsnorm_fwd_act = cpu_rmsnorm_fwd_act;
  b->rmsnorm_bwd_act = cpu_rmsnorm_bwd_act;
  b->rope = cpu_rope;
  b->attn_fwd = cpu_attn_fwd;
  b->attn_bwd = cpu_attn_bwd;
  b->attn_decode = cpu_attn_decode;
  b->swiglu_fwd = cpu_swiglu_fwd;
  b->swiglu_bwd = cpu_swiglu_bwd;
  b->embed_fwd = cpu_embed_fwd;
  b->embed_bwd = cpu_embed_bwd;
  b->ce_local_stats = cpu_ce_local_stats;
  b->ce_bwd = cpu_ce_bwd;
  b->ce_rescale = cpu_ce_rescale;
  b->ce_loss = cpu_ce_loss;
  b->add = cpu_add;
  b->sumsq_ranges = cpu_sumsq_ranges;
  b->adamw_ranges = cpu_adamw_ranges;
  b->fp8_cast = cpu_fp8_cast;
  b->gemm_fp8 = cpu_gemm_fp8;
  b->fp8_scales = cpu_fp8_scales;
  b->grad_amax = cpu_grad_amax;
  b->quant16 = cpu_quant16;
  b->dequant16 = cpu_dequant16;
  b->quant_i8 = cpu_quant_i8;
  b->dequant_i8 = cpu_dequant_i8;
  b->swiglu_fwd_fp8 = cpu_swiglu_fwd_fp8;
  b->rmsnorm_fwd_fp8 = cpu_rmsnorm_fwd_fp8;
  b->swiglu_bwd_fp8 = cpu_swiglu_bwd_fp8;
  b->fp8_cast_block = cpu_fp8_cast_block;
  b->gemm_fp8_block = cpu_gemm_fp8_block;
  b->fp8_cast_spans = cpu_fp8_cast_spans;
  b->fp8_transpose = cpu_fp8_transpose;
  return b;
}

void k_backend_free(k_backend **b) {
  if (!b || !*b) return;
  if ((*b)->release) (*b)->release(*b);
  free(*b);
  *b = NULL;
}
