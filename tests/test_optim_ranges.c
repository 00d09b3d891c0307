// Multi-tensor optimizer ops (kernels/backend.h sumsq_ranges, adamw_ranges). On CPU: bit for
// bit what the per-tensor sumsq / scale / adamw calls give, and nothing outside the ranges is
// touched. With --gpu (ctest label gpu): the CUDA ops against the CPU reference, ranges of very
// different sizes with gaps between them, the bf16 compute copy rounded from the updated p.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/optim_cpu.h"
#include "tests/test_util.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

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

#ifdef TRAINER_HAVE_CUDA
static void test_gpu(void) {
  k_backend *be = k_backend_cuda_create(&(k_backend_opts){.act = K_BF16});
  float *p = malloc((size_t)N * 4), *g = malloc((size_t)N * 4), *m = malloc((size_t)N * 4), *v = malloc((size_t)N * 4);
  fill(p, g, m, v);
  size_t nb = (size_t)N * 4;
  float *dp = be->alloc(be, nb), *dg = be->alloc(be, nb), *dm = be->alloc(be, nb), *dv = be->alloc(be, nb);
  uint16_t *dpc = be->alloc(be, (size_t)N * 2), *hpc = malloc((size_t)N * 2), *want_pc = malloc((size_t)N * 2);
  be->from_host(be, dp, p, nb), be->from_host(be, dg, g, nb), be->from_host(be, dm, m, nb), be->from_host(be, dv, v, nb);
  double want = k_cpu_sumsq_ranges(g, R, NR), got = be->sumsq_ranges(be, dg, R, NR);
  EXPECT(fabs(got - want) <= 1e-12 * want, "GPU sumsq_ranges %.17g, CPU %.17g", got, want);
  double again = be->sumsq_ranges(be, dg, R, NR);
  EXPECT(again == got, "GPU sumsq_ranges not deterministic: %.17g then %.17g", got, again);
  for (int rep = 0; rep < 2; rep++) {  // the second call reuses the uploaded range table
    k_cpu_adamw_ranges(p, want_pc, K_BF16, g, m, v, R, NR, LR, B1, B2, EPS, WD, BC1, BC2, S);
    be->adamw_ranges(be, dp, dpc, K_BF16, dg, dm, dv, R, NR, LR, B1, B2, EPS, WD, BC1, BC2, S);
  }
  float *hp = malloc(nb), *hm = malloc(nb), *hv = malloc(nb);
  be->to_host(be, hp, dp, nb), be->to_host(be, hm, dm, nb), be->to_host(be, hv, dv, nb);
  be->to_host(be, hpc, dpc, (size_t)N * 2);
  int64_t bad = 0, bad_pc = 0;
  double worst = 0, scale[3] = {0, 0, 0};
  for (int64_t i = 0; i < N; i++) {
    scale[0] = fmax(scale[0], fabs(p[i])), scale[1] = fmax(scale[1], fabs(m[i])), scale[2] = fmax(scale[2], fabs(v[i]));
  }
  for (int64_t i = 0; i < N; i++) {
    // The GPU contracts to FMA where the CPU build does not: a few ulp, so each element is held
    // to 1e-5 of itself plus 1e-6 of its array's largest (m cancels to near 0 in places).
    double e = fmax(fmax(fabs(hp[i] - p[i]) / (fabs(p[i]) + 0.1 * scale[0]), fabs(hm[i] - m[i]) / (fabs(m[i]) + 0.1 * scale[1])),
                    fabs(hv[i] - v[i]) / (fabs(v[i]) + 0.1 * scale[2]));
    if (e > worst) worst = e;
    bad += !(fabs(hp[i] - p[i]) <= 1e-5 * fabs(p[i]) + 1e-6 * scale[0] &&
             fabs(hm[i] - m[i]) <= 1e-5 * fabs(m[i]) + 1e-6 * scale[1] &&
             fabs(hv[i] - v[i]) <= 1e-5 * fabs(v[i]) + 1e-6 * scale[2]);
    // The copy is the GPU's own p rounded: compare with rounding the GPU p on the host.
    float one = hp[i];
    k_range r1 = {0, 1, 0, 0};
    uint16_t want1 = 0;
    float m1 = 0, v1 = 0, g1 = 0;
    k_cpu_adamw_ranges(&one, &want1, K_BF16, &g1, &m1, &v1, &r1, 1, 0, 0, 0, 1, 0, 1, 1, 1);
    int in = 0;
    for (int k = 0; k < NR; k++) in |= i >= R[k].offset && i < R[k].offset + R[k].n_elem;
    bad_pc += in ? hpc[i] != want1 : hpc[i] != 0;
  }
  EXPECT(bad == 0, "GPU adamw_ranges: %lld elements off the CPU reference (worst normalised %.3g)", (long long)bad, worst);
  EXPECT(bad_pc == 0, "GPU bf16 compute copy: %lld elements wrong", (long long)bad_pc);
  printf("GPU vs CPU: sumsq rel %.3g, adamw worst normalised %.3g\n", fabs(got - want) / want, worst);
  be->free(be, dp), be->free(be, dg), be->free(be, dm), be->free(be, dv), be->free(be, dpc);
  free(p), free(g), free(m), free(v), free(hp), free(hm), free(hv), free(hpc), free(want_pc);
  k_backend_free(&be);
}
#endif

int main(int argc, char **argv) {
  test_cpu();
  if (argc > 1 && !strcmp(argv[1], "--gpu")) {
#ifdef TRAINER_HAVE_CUDA
    test_gpu();
#else
    EXPECT(0, "--gpu: this build has no CUDA backend");
#endif
  }
  return test_summary();
}
