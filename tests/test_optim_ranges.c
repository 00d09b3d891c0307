// The CPU reference of the multi-tensor optimizer ops (kernels/cpu/optim_cpu.h: sumsq_ranges,
// adamw_ranges): bit for bit what the per-tensor sumsq / scale / adamw calls give, and nothing
// outside the ranges is touched. Each backend's ops against this reference (the CUDA ones over
// the same ranges, with the bf16 compute copy) are rows of the op suite, tests/test_backend_ops.c.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/optim_cpu.h"
#include "tests/test_util.h"

static const k_range R[] = {{0, 1000, 1, 0},          {1500, 30000, 0, 1500},       {31500, 1, 1, 31500},
                            {40000, 2500000, 1, 40000}, {2600000, 123457, 0, 2600000}};
enum { NR = sizeof R / sizeof *R, N = 2800000, SHIFT = 77 };
static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f, BC1 = 0.19f, BC2 = 0.0975f, S = 0.37f;

static float frand(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((*s >> 40) / 16777216.0) * 2.0f - 1.0f;
}

static void fill(float *p, float *g, float *m, float *v) {
  uint64_t s = 42;
  for (int64_t i = 0; i < N; i++) {
    p[i] = frand(&s);
    g[i] = frand(&s) * 1e-2f;
    m[i] = frand(&s) * 1e-3f;
    v[i] = fabsf(frand(&s)) * 1e-5f;
  }
}

static float *copy_of(const float *x) {
  float *y = malloc((size_t)N * sizeof *y);
  memcpy(y, x, (size_t)N * sizeof *y);
  return y;
}

static void test_cpu(void) {
  float *p = malloc((size_t)N * 4), *g = malloc((size_t)N * 4), *m = malloc((size_t)N * 4), *v = malloc((size_t)N * 4);
  fill(p, g, m, v);
  float *p2 = copy_of(p), *g2 = copy_of(g), *m2 = copy_of(m), *v2 = copy_of(v), *pc = calloc(N, 4);
  float *m3 = copy_of(m), *v3 = copy_of(v), *p3 = calloc(N + SHIFT, 4);  // for the p_offset check below
  memcpy(p3 + SHIFT, p, (size_t)N * 4);
  double want = 0;
  for (int k = 0; k < NR; k++) want += k_cpu_sumsq(g + R[k].offset, R[k].n_elem);
  double got = k_cpu_sumsq_ranges(g, R, NR);
  EXPECT(got == want, "sumsq_ranges %.17g, per-tensor %.17g", got, want);
  k_cpu_scale(g2, N, S);
  for (int k = 0; k < NR; k++) {
    int64_t o = R[k].offset;
    k_cpu_adamw(p2 + o, g2 + o, m2 + o, v2 + o, R[k].n_elem, LR, B1, B2, EPS, R[k].decay ? WD : 0.0f, BC1, BC2);
  }
  float *p0 = copy_of(p);
  k_cpu_adamw_ranges(p, pc, K_F32, g, m, v, R, NR, LR, B1, B2, EPS, WD, BC1, BC2, S);
  EXPECT(!memcmp(p, p2, (size_t)N * 4) && !memcmp(m, m2, (size_t)N * 4) && !memcmp(v, v2, (size_t)N * 4),
         "adamw_ranges differs from scale + per-tensor adamw");
  int64_t bad = 0;
  for (int k = 0; k < NR; k++)
    for (int64_t i = R[k].offset; i < R[k].offset + R[k].n_elem; i++) bad += pc[i] != p[i];
  EXPECT(bad == 0, "fp32 compute copy: %lld elements differ from p", (long long)bad);
  EXPECT(p[1200] == p0[1200] && pc[1200] == 0 && p[35000] == p0[35000], "elements between ranges were touched");
  // Weights at p_offset apart from the gradient and moments at offset: the same update.
  k_range RS[NR];
  for (int k = 0; k < NR; k++) RS[k] = R[k], RS[k].p_offset += SHIFT;
  k_cpu_adamw_ranges(p3, NULL, K_F32, g, m3, v3, RS, NR, LR, B1, B2, EPS, WD, BC1, BC2, S);
  EXPECT(!memcmp(p3 + SHIFT, p, (size_t)N * 4) && !memcmp(m3, m, (size_t)N * 4) && !memcmp(v3, v, (size_t)N * 4),
         "adamw_ranges with p_offset = offset + %d differs", SHIFT);
  free(p), free(g), free(m), free(v), free(p2), free(g2), free(m2), free(v2), free(pc), free(p0), free(m3), free(v3);
  free(p3);
}

int main(void) {
  test_cpu();
  return test_summary();
}
