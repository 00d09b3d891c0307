// Benchmark of the CPU AdamW (k_cpu_adamw_ranges) against the host's copy bandwidth: AdamW is
// memory-bound, so a plain copy moving as many bytes is the ceiling it is measured against.
// Prints numbers only; it is not a test. Built by tests/cmake/optim.cmake as bench_adamw; run e.g.
//   build/bench_adamw -n 500000000 -t 16
// scripts/bench/bench_adamw.py runs it beside PyTorch's AdamW on the same parameter count and threads.
//
// Bytes counted per parameter: AdamW reads g, p, m, v (16) and writes p, m, v (12): 28, plus the
// compute copy it writes (bf16 2, fp32 4). The copy is a memcpy of 14 bytes per parameter from
// one buffer to another (28 moved), each thread its static chunk, as AdamW splits its work. The
// two alternate, step by step, so both see the same machine; together they hold 44 bytes per
// parameter plus the compute copy (23 GB at the default 500 M parameters with bf16).
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/optim_cpu.h"

typedef struct bench_opts {
  int64_t n_params, range_elems;
  int threads, reps;
  k_dtype pc_type;
  int use_pc;
  k_isa isa;
  const char *pc_name, *isa_name;
} bench_opts;

static void usage_exit(const char *problem) {
  fprintf(stderr,
          "bench_adamw: %s\n"
          "usage: bench_adamw [-n PARAMS] [-t THREADS] [-r REPS] [-s RANGE_ELEMS] [-c bf16|f32|none]"
          " [-i auto|avx512|avx2|sse]\n",
          problem);
  exit(2);
}

static int64_t parse_positive(const char *s, const char *what) {
  char *end;
  const double x = strtod(s, &end);  // accepts 5e8
  if (*end || x < 1 || x > 1e12) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s '%s' is not a number from 1 to 1e12", what, s);
    usage_exit(msg);
  }
  return (int64_t)x;
}

static bench_opts parse_args(int argc, char **argv) {
  bench_opts o = {500000000, (int64_t)1 << 24, omp_get_max_threads(), 5, K_BF16, 1, K_ISA_AUTO, "bf16", "auto"};
  int c;
  while ((c = getopt(argc, argv, "n:t:r:s:c:i:")) != -1) {
    if (c == 'n') o.n_params = parse_positive(optarg, "-n (parameters)");
    else if (c == 't') o.threads = (int)parse_positive(optarg, "-t (threads)");
    else if (c == 'r') o.reps = (int)parse_positive(optarg, "-r (repetitions)");
    else if (c == 's') o.range_elems = parse_positive(optarg, "-s (elements per range)");
    else if (c == 'c') {
      o.pc_name = optarg;
      o.use_pc = strcmp(optarg, "none") != 0;
      o.pc_type = strcmp(optarg, "f32") == 0 ? K_F32 : K_BF16;
      if (o.use_pc && strcmp(optarg, "f32") && strcmp(optarg, "bf16")) usage_exit("-c takes bf16, f32 or none");
    } else if (c == 'i') {
      static const char *names[] = {"auto", "avx512", "avx2", "sse"};
      o.isa = (k_isa)-1;
      for (int k = 0; k < 4; k++)
        if (strcmp(optarg, names[k]) == 0) o.isa = (k_isa)k, o.isa_name = names[k];
      if ((int)o.isa < 0) usage_exit("-i takes auto, avx512, avx2 or sse");
    } else {
      usage_exit("unknown option");
    }
  }
  if (optind < argc) usage_exit("unexpected argument");
  return o;
}

// Allocated and first touched by the threads that will use each part (pages land on their node).
static void *bench_alloc(int64_t n_bytes, unsigned char fill) {
  void *x = aligned_alloc(64, ((size_t)n_bytes + 63) / 64 * 64);
  if (!x) {
    fprintf(stderr, "bench_adamw: cannot allocate %.1f GB: lower -n\n", n_bytes * 1e-9);
    exit(1);
  }
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = n_bytes * t / nt, hi = n_bytes * (t + 1) / nt;
    memset((char *)x + lo, fill, (size_t)(hi - lo));
  }
  return x;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  double best, median;
} bench_time;

static bench_time time_summary(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return (bench_time){t[0], t[n / 2]};
}

// What one AdamW step and one copy work on. Ranges of range_elems (the last shorter), decay on
// every other one as on weights and not on norms. Gradients of about 1e-3 and fresh moments keep
// every value normal, so no denormal slows a step.
typedef struct bench_bufs {
  float *p, *g, *m, *v;  // (n_params)
  void *pc;              // (n_params) in the compute copy's dtype, or NULL
  k_range *r;
  int n_ranges;
  char *src, *dst;  // (14 n_params) bytes each, for the copy
} bench_bufs;

static bench_bufs bench_bufs_init(const bench_opts *o) {
  const int64_t n = o->n_params;
  bench_bufs b = {bench_alloc(n * 4, 0), bench_alloc(n * 4, 0), bench_alloc(n * 4, 0), bench_alloc(n * 4, 0),
                  o->use_pc ? bench_alloc(n * (o->pc_type == K_BF16 ? 2 : 4), 0) : NULL, NULL, 0,
                  bench_alloc(n * 14, 1), bench_alloc(n * 14, 0)};
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    b.p[i] = (float)(i % 2001 - 1000) * 2e-5f;
    b.g[i] = (float)(i % 997 - 498) * 2e-6f + 1e-7f;
  }
  b.n_ranges = (int)((n + o->range_elems - 1) / o->range_elems);
  b.r = malloc((size_t)b.n_ranges * sizeof *b.r);
  for (int k = 0; k < b.n_ranges; k++) {
    const int64_t off = (int64_t)k * o->range_elems, len = n - off < o->range_elems ? n - off : o->range_elems;
    b.r[k] = (k_range){off, len, k % 2 == 0, off};
  }
  return b;
}

static void bench_bufs_free(bench_bufs *b) {
  free(b->p), free(b->g), free(b->m), free(b->v), free(b->pc), free(b->r), free(b->src), free(b->dst);
}

static double time_adamw(const bench_opts *o, bench_bufs *b, int step) {
  const float bc1 = 1.0f - powf(0.9f, (float)step), bc2 = 1.0f - powf(0.95f, (float)step);
  const double t0 = omp_get_wtime();
  k_cpu_adamw_ranges_isa(o->isa, b->p, b->pc, o->pc_type, b->g, b->m, b->v, b->r, b->n_ranges, 3e-4f, 0.9f, 0.95f,
                         1e-8f, 0.1f, bc1, bc2, 1.0f);
  return omp_get_wtime() - t0;
}

static double time_copy(const bench_opts *o, bench_bufs *b) {
  const int64_t n_bytes = o->n_params * 14;
  const double t0 = omp_get_wtime();
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = n_bytes * t / nt, hi = n_bytes * (t + 1) / nt;
    memcpy(b->dst + lo, b->src + lo, (size_t)(hi - lo));
  }
  return omp_get_wtime() - t0;
}

int main(int argc, char **argv) {
  const bench_opts o = parse_args(argc, argv);
  omp_set_num_threads(o.threads);
  const int pc_bytes = !o.use_pc ? 0 : o.pc_type == K_BF16 ? 2 : 4;
  const double n = (double)o.n_params, adamw_bytes = n * (28 + pc_bytes), copy_bytes = n * 28;
  printf("bench_adamw: %d threads, kernel: widest of %s the CPU has (avx512f %s, avx2 %s), best and median of %d\n",
         o.threads, o.isa_name, __builtin_cpu_supports("avx512f") ? "yes" : "no",
         __builtin_cpu_supports("avx2") ? "yes" : "no", o.reps);
  bench_bufs b = bench_bufs_init(&o);
  printf("%lld parameters in %d ranges of up to %lld, compute copy: %s; %.1f GB allocated\n", (long long)o.n_params,
         b.n_ranges, (long long)o.range_elems, o.pc_name, n * (44 + pc_bytes) * 1e-9);
  // AdamW and the copy alternate, so that both see the same machine (other load, clocks).
  double *ta = malloc(sizeof(double) * (size_t)o.reps), *tc = malloc(sizeof(double) * (size_t)o.reps);
  for (int rep = -1; rep < o.reps; rep++) {  // rep -1 warms up
    const double t_adamw = time_adamw(&o, &b, rep + 2), t_copy = time_copy(&o, &b);
    if (rep >= 0) ta[rep] = t_adamw, tc[rep] = t_copy;
  }
  const bench_time a = time_summary(ta, o.reps), c = time_summary(tc, o.reps);
  free(ta), free(tc);
  bench_bufs_free(&b);
  printf("adamw: %.4f s (median %.4f s)  %.3f G params/s  %.1f GB/s  (%d B/param: g read 4, p m v read and written 24",
         a.best, a.median, n / a.best * 1e-9, adamw_bytes / a.best * 1e-9, 28 + pc_bytes);
  if (pc_bytes) printf(", %s copy written %d", o.pc_name, pc_bytes);
  printf(")\n");
  printf("copy:  %.4f s (median %.4f s)  %.1f GB/s  (memcpy of 14 B/param: 28 B/param moved)\n", c.best, c.median,
         copy_bytes / c.best * 1e-9);
  const double frac = (adamw_bytes / a.best) / (copy_bytes / c.best);
  printf("adamw bandwidth / copy bandwidth: %.1f%%\n", 100 * frac);
  printf("result params_per_s=%.6g adamw_gb_s=%.6g copy_gb_s=%.6g fraction=%.4f threads=%d n_params=%lld\n",
         n / a.best, adamw_bytes / a.best * 1e-9, copy_bytes / c.best * 1e-9, frac, o.threads,
         (long long)o.n_params);
  return 0;
}
