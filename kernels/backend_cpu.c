// The CPU backend: host memory and the reference kernels of kernels/cpu/.
#include "kernels/backend.h"
#include "kernels/check.h"
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

// Rows of `inner` floats: src row (t, b) goes to dst row (b, t).
static void cpu_transpose_tb(float *dst, const float *src, int T, int B, int64_t inner) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      memcpy(dst + ((int64_t)b * T + t) * inner, src + ((int64_t)t * B + b) * inner, (size_t)inner * sizeof(float));
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
  b->gemm = k_cpu_gemm;
  b->rmsnorm_fwd = k_cpu_rmsnorm_fwd;
  b->rmsnorm_bwd = k_cpu_rmsnorm_bwd;
  b->rope = k_cpu_rope;
  b->attn_fwd = k_cpu_attn_fwd;
  b->attn_bwd = k_cpu_attn_bwd;
  b->swiglu_fwd = k_cpu_swiglu_fwd;
  b->swiglu_bwd = k_cpu_swiglu_bwd;
  b->embed_fwd = k_cpu_embed_fwd;
  b->embed_bwd = k_cpu_embed_bwd;
  b->ce_local_stats = k_cpu_ce_local_stats;
  b->ce_bwd = k_cpu_ce_bwd;
  b->adamw = k_cpu_adamw;
  b->sumsq = k_cpu_sumsq;
  b->scale = k_cpu_scale;
  b->add = k_cpu_add;
  b->transpose_tb = cpu_transpose_tb;
  return b;
}

void k_backend_free(k_backend **b) {
  if (!b || !*b) return;
  free(*b);
  *b = NULL;
}
