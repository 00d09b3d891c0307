// Benchmark of the CPU kernels at the default run's shapes (d 256, ffn 768, 8 x 128 tokens per
// micro-batch, 8 query / 4 kv heads of 32): GEMM GFLOP/s for every product a block makes, and
// attention forward/backward times. Prints numbers only; it is not a test. Built by
// tests/cmake/ops.cmake as bench_ops; run e.g. OMP_NUM_THREADS=2 build/bench_ops.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/ops_cpu.h"

static float *bench_buf(int64_t n) {
  float *x = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  return x;
}

// Best time of repeated calls over about half a second, so one slow run does not count.
static void bench_gemm(const char *what, int ta, int tb, int M, int N, int K) {
  float *A = bench_buf((int64_t)M * K), *B = bench_buf((int64_t)K * N), *C = bench_buf((int64_t)M * N);
  const int lda = ta ? M : K, ldb = tb ? K : N;
  double best = 1e30, start = omp_get_wtime();
  for (int rep = 0; rep < 3 || omp_get_wtime() - start < 0.5; rep++) {
    double t0 = omp_get_wtime();
    k_cpu_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
    double t = omp_get_wtime() - t0;
    if (t < best) best = t;
  }
  printf("gemm %-22s M=%5d N=%5d K=%5d ta=%d tb=%d  %7.1f GFLOP/s  %7.3f ms\n", what, M, N, K, ta, tb,
         2.0 * M * N * K / best * 1e-9, best * 1e3);
  free(A), free(B), free(C);
}

int main(void) {
  const int rows = 1024, d = 256, ffn = 768, qkv = 256 + 2 * 128, vocab = 256;
  printf("threads: %d\n", omp_get_max_threads());
  bench_gemm("(warm-up)", 0, 0, 512, 512, 512);
  bench_gemm("qkv fwd", 0, 1, rows, qkv, d);
  bench_gemm("qkv dx", 0, 0, rows, d, qkv);
  bench_gemm("qkv dW", 1, 0, qkv, d, rows);
  bench_gemm("ffn up+gate fwd", 0, 1, rows, 2 * ffn, d);
  bench_gemm("ffn down fwd", 0, 1, rows, d, ffn);
  bench_gemm("ffn down dx", 0, 0, rows, ffn, d);
  bench_gemm("ffn down dW", 1, 0, d, ffn, rows);
  bench_gemm("lm head fwd", 0, 1, rows, vocab, d);
  bench_gemm("square 1024", 0, 0, 1024, 1024, 1024);
  bench_gemm("M=1024 N=768 K=256", 0, 0, 1024, 768, 256);

  const int Bt = 8, T = 128, nh = 8, nkv = 4, hd = 32;
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, nq = (int64_t)Bt * T * nh * hd, nx = (int64_t)Bt * T * ld;
  float *x = bench_buf(nx), *dx = bench_buf(nx), *o = bench_buf(nq), *dout = bench_buf(nq);  // x: fused q|k|v rows
  float *q = x, *k = x + nh * hd, *v = k + nkv * hd, *dq = dx, *dk = dx + nh * hd, *dv = dk + nkv * hd;
  float *lse = bench_buf((int64_t)Bt * nh * T);
  double best_f = 1e30, best_b = 1e30;
  for (int rep = 0; rep < 20; rep++) {
    double t0 = omp_get_wtime();
    k_cpu_attn_fwd(q, k, v, ld, o, lse, Bt, T, nh, nkv, hd);
    double t1 = omp_get_wtime();
    k_cpu_attn_bwd(dout, q, k, v, ld, o, lse, dq, dk, dv, Bt, T, nh, nkv, hd);
    double t2 = omp_get_wtime();
    if (t1 - t0 < best_f) best_f = t1 - t0;
    if (t2 - t1 < best_b) best_b = t2 - t1;
  }
  printf("attention B=%d T=%d nh=%d nkv=%d hd=%d: fwd %.3f ms, bwd %.3f ms\n", Bt, T, nh, nkv, hd, best_f * 1e3,
         best_b * 1e3);
  free(x), free(dx), free(o), free(dout), free(lse);
  return 0;
}
