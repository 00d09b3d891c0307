// The CPU backend: host memory and the reference kernels of kernels/cpu/.
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/check.h"
#include "kernels/cpu/optim_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include <string.h>
#include <unistd.h>

static void *cpu_alloc(k_backend *b, size_t n_bytes) { (void)b; return XCALLOC(n_bytes, 1); }
static void cpu_free(k_backend *b, void *p) { (void)b; free(p); }
static void cpu_copy(k_backend *b, void *dst, const void *src, size_t n_bytes) {
  (void)b;
  if (n_bytes) memmove(dst, src, n_bytes);
}
static void cpu_zero(k_backend *b, void *p, size_t n_bytes) { (void)b; if (n_bytes) memset(p, 0, n_bytes); }
static void cpu_sync(k_backend *b) { (void)b; }

static int64_t cpu_mem_used(k_backend *b) {
  (void)b;
  long pages_total = 0, pages_resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
  fclose(f);
  return (int64_t)pages_resident * sysconf(_SC_PAGESIZE);
}

void k_backend_set_peak(k_backend *b) {
  const char *env = getenv("TRAINER_PEAK_TFLOPS");
  if (env) b->peak_tflops = atof(env);
  else if (strstr(b->device_name, "H100") || strstr(b->device_name, "H200")) b->peak_tflops = 989.4;
  else b->peak_tflops = 0;
}

// The CPU backend computes in fp32 only (act = K_F32): the act-typed pointers of the table are
// float arrays, and these wrappers only change the pointer types.
static void cpu_gemm(int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B, int ldb,
                     float beta, void *C, int ldc, k_dtype c_type) {
  CHECK(c_type == K_F32, "the CPU backend computes in fp32 only (gemm asked for dtype %d)", (int)c_type);
  k_cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
static void cpu_linear_residual(int M, int N, int K, const void *A, const void *W, const float *C, float *D) {
  k_cpu_linear_residual(M, N, K, A, W, C, D);
}
// Activations are fp32 on the CPU; bf16 appears only as the DP gradient reduction's wire type.
static void cpu_cast(void *dst, k_dtype dst_type, const void *src, k_dtype src_type, int64_t n) {
  if (dst_type == K_BF16 && src_type == K_F32) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = k_f32_to_bf16(((const float *)src)[i]);
  } else if (dst_type == K_F32 && src_type == K_BF16) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = k_bf16_to_f32(((const uint16_t *)src)[i]);
  } else {
    CHECK(dst_type == src_type, "cast %d -> %d", (int)src_type, (int)dst_type);
    if (n && dst != src) memmove(dst, src, (size_t)n * k_dtype_bytes(dst_type));
  }
}
static void cpu_rope(void *x, int B, int T, int H, int hd, int64_t ld, int pos0, float theta, int inverse) {
  k_cpu_rope(x, B, T, H, hd, ld, pos0, theta, inverse);
}
static void cpu_rmsnorm_fwd_act(const float *x, const float *w, void *y, float *rstd, int64_t rows, int d, float eps) {
  k_cpu_rmsnorm_fwd(x, w, y, rstd, rows, d, eps);
}
static void cpu_rmsnorm_bwd_act(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *dw,
                                void *dx_act, int64_t rows, int d) {
  k_cpu_rmsnorm_bwd(dy, x, w, rstd, dx, dw, rows, d);
  if (dx_act && dx_act != (void *)dx) memcpy(dx_act, dx, sizeof(float) * (size_t)(rows * d));
}
static void cpu_attn_fwd(const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B, int T,
                         int nh, int nkv, int hd) {
  k_cpu_attn_fwd(q, k, v, ld, o, lse, B, T, nh, nkv, hd);
}
static void cpu_attn_bwd(const void *dout, const void *q, const void *k, const void *v, int64_t ld, const void *o,
                         const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv, int hd) {
  k_cpu_attn_bwd(dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
}
static void cpu_swiglu_fwd(const void *gu, void *out, int64_t rows, int n) { k_cpu_swiglu_fwd(gu, out, rows, n); }
static void cpu_swiglu_bwd(const void *dout, const void *gu, void *dgu, int64_t rows, int n) {
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
}
static void cpu_ce_local_stats(const void *logits, const int32_t *targets, int64_t rows, int n_vocab_local, int v0,
                               float *row_max, float *row_sumexp, float *target_logit) {
  k_cpu_ce_local_stats(logits, targets, rows, n_vocab_local, v0, row_max, row_sumexp, target_logit);
}
static void cpu_ce_bwd(void *logits, const int32_t *targets, const float *lse, int64_t rows, int n_vocab_local, int v0,
                       float scale) {
  k_cpu_ce_bwd(logits, targets, lse, rows, n_vocab_local, v0, scale);
}

k_backend *k_backend_cpu_create(void) {
  k_backend *b = XCALLOC(1, sizeof *b);
  b->name = "cpu";
  b->alloc = cpu_alloc;
  b->free = cpu_free;
  b->to_host = cpu_copy;
  b->from_host = cpu_copy;
  b->copy = cpu_copy;
  b->zero = cpu_zero;
  b->sync = cpu_sync;
  b->mem_used = cpu_mem_used;
  snprintf(b->device_name, sizeof b->device_name, "cpu");
  k_backend_set_peak(b);
  b->act = K_F32;
  b->gemm = cpu_gemm;
  b->linear_residual = cpu_linear_residual;
  b->cast = cpu_cast;
  b->rmsnorm_bwd = k_cpu_rmsnorm_bwd;
  b->rmsnorm_fwd_act = cpu_rmsnorm_fwd_act;
  b->rmsnorm_bwd_act = cpu_rmsnorm_bwd_act;
  b->rope = cpu_rope;
  b->attn_fwd = cpu_attn_fwd;
  b->attn_bwd = cpu_attn_bwd;
  b->swiglu_fwd = cpu_swiglu_fwd;
  b->swiglu_bwd = cpu_swiglu_bwd;
  b->embed_fwd = k_cpu_embed_fwd;
  b->embed_bwd = k_cpu_embed_bwd;
  b->ce_local_stats = cpu_ce_local_stats;
  b->ce_bwd = cpu_ce_bwd;
  b->ce_rescale = k_cpu_ce_rescale;
  b->ce_loss = k_cpu_ce_loss;
  b->add = k_cpu_add;
  b->sumsq_ranges = k_cpu_sumsq_ranges;
  b->adamw_ranges = k_cpu_adamw_ranges;
  return b;
}

void k_backend_free(k_backend **b) {
  if (!b || !*b) return;
  if ((*b)->release) (*b)->release(*b);
  free(*b);
  *b = NULL;
}
