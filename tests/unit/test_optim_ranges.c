// The CPU reference of the multi-tensor optimizer ops (kernels/cpu/optim_cpu.h: sumsq_ranges,
// adamw_ranges): bit for bit what the per-tensor sumsq / scale / adamw calls give, and nothing
// outside the ranges is touched; its AVX-512 and AVX2 kernels give the scalar kernel's bits, at
// any thread count, on values that stress the rounding (denormals, huge, tiny, Inf, NaN). Each
// backend's ops against this reference (the CUDA ones over the same ranges, with the bf16
// compute copy) are rows of the op suite, tests/unit/test_backend_ops.c.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/optim_cpu.h"
#include "tests/unit/test_util.h"

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

// ---- Vector kernels against the scalar one ----

// Odd lengths and offsets, so vector bodies and scalar tails both run and thread chunks split
// ranges; p sits at other offsets than g, m, v. Together above the one-thread threshold.
static const k_range RI[] = {{0, 1, 1, 3},          {1, 15, 0, 4},          {16, 17, 1, 19},
                             {40, 33, 0, 37},       {80, 100003, 1, 85},    {100090, 40001, 0, 100100}};
enum { NRI = sizeof RI / sizeof *RI, NI = 140200 };

static uint32_t urand(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(*s >> 32);
}

// Mostly ordinary values around scale, and some of every awkward kind. The bf16 edges: ties to
// even (down and up), a denormal tie, the largest float (rounds to Inf), NaNs whose rounding
// would carry into the sign or exponent.
static float awkward(uint64_t *s, float scale) {
  const float x = (float)(urand(s) / 4294967296.0 * 2.0 - 1.0);
  switch (urand(s) % 16) {
    case 0: return x * 1e-39f;  // denormal
    case 1: return x * 3e38f;   // huge
    case 2: return x * 1e-30f;  // tiny
    case 3: return (urand(s) & 1) ? 0.0f : -0.0f;
    case 4: return (urand(s) & 1) ? INFINITY : NAN;
    case 5:
    case 6: {  // any bit pattern, or one at an edge of the bf16 rounding
      static const uint32_t edges[] = {0x3f808000u, 0x3f818000u, 0x00008000u, 0x7f7fffffu,
                                       0x7fffffffu, 0xffffffffu, 0x7f808000u, 0xff80ffffu};
      const uint32_t u = urand(s) % 4 ? urand(s) : edges[urand(s) % 8];
      float f;
      memcpy(&f, &u, sizeof f);
      return f;
    }
    default: return x * scale;
  }
}

typedef struct {
  float *p, *g, *m, *v, *pc;  // p and pc have NI + 16 elements (p_offset beyond offset)
} adamw_bufs;

static adamw_bufs bufs_fill(uint64_t seed) {
  adamw_bufs b = {calloc(NI + 16, 4), calloc(NI, 4), calloc(NI, 4), calloc(NI, 4), calloc(NI + 16, 4)};
  for (int64_t i = 0; i < NI; i++) {
    b.g[i] = awkward(&seed, 1e-2f);
    b.m[i] = awkward(&seed, 1e-3f);
    b.v[i] = fabsf(awkward(&seed, 1e-5f));
  }
  for (int64_t i = 0; i < NI + 16; i++) b.p[i] = awkward(&seed, 1.0f);
  return b;
}

static float *dup(const float *x, int64_t n) {
  float *y = malloc((size_t)n * sizeof *y);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}

static adamw_bufs bufs_copy(const adamw_bufs *a) {
  adamw_bufs b = {dup(a->p, NI + 16), dup(a->g, NI), dup(a->m, NI), dup(a->v, NI), dup(a->pc, NI + 16)};
  return b;
}

static void bufs_free(adamw_bufs *b) { free(b->p), free(b->g), free(b->m), free(b->v), free(b->pc); }

static int is_nan32(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
static int is_nan16(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

// Elements whose bits differ, a NaN matching any NaN: operand order decides which NaN's payload
// survives when two meet, and that is not part of the arithmetic the kernels promise.
static int64_t count_diff32(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t x, y;
    memcpy(&x, a + i, 4), memcpy(&y, b + i, 4);
    bad += x != y && !(is_nan32(x) && is_nan32(y));
  }
  return bad;
}
static int64_t count_diff16(const uint16_t *a, const uint16_t *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += a[i] != b[i] && !(is_nan16(a[i]) && is_nan16(b[i]));
  return bad;
}

typedef struct {
  const char *name;
  float lr, g_scale;
} adamw_case;

static void run_isa(k_isa isa, const adamw_case *c, k_dtype pc_type, int use_pc, adamw_bufs *b) {
  k_cpu_adamw_ranges_isa(isa, b->p, use_pc ? b->pc : NULL, pc_type, b->g, b->m, b->v, RI, NRI, c->lr, B1, B2, EPS, WD,
                         BC1, BC2, c->g_scale);
}

// The compute copy is the updated p rounded as k_f32_to_bf16 rounds (or p itself).
static int64_t count_bad_copy(const adamw_bufs *b, k_dtype pc_type) {
  int64_t bad = 0;
  for (int k = 0; k < NRI; k++)
    for (int64_t i = RI[k].p_offset; i < RI[k].p_offset + RI[k].n_elem; i++)
      bad += pc_type == K_BF16 ? ((uint16_t *)b->pc)[i] != k_f32_to_bf16(b->p[i]) : memcmp(b->pc + i, b->p + i, 4) != 0;
  return bad;
}

static void check_same(const char *what, const adamw_bufs *got, const adamw_bufs *want, k_dtype pc_type) {
  const int64_t bad_p = count_diff32(got->p, want->p, NI + 16), bad_m = count_diff32(got->m, want->m, NI);
  const int64_t bad_v = count_diff32(got->v, want->v, NI);
  const int64_t bad_pc = pc_type == K_BF16 ? count_diff16((uint16_t *)got->pc, (uint16_t *)want->pc, 2 * (NI + 16))
                                           : count_diff32(got->pc, want->pc, NI + 16);
  EXPECT(bad_p + bad_m + bad_v + bad_pc == 0, "%s: p %lld, m %lld, v %lld, copy %lld elements differ", what,
         (long long)bad_p, (long long)bad_m, (long long)bad_v, (long long)bad_pc);
}

static void test_isa_case(const adamw_case *c, k_dtype pc_type, int use_pc, uint64_t seed) {
  static const k_isa vec_isas[] = {K_ISA_AVX512, K_ISA_AVX2};
  static const char *vec_names[] = {"avx512", "avx2"};
  const char *copy_name = !use_pc ? "no copy" : pc_type == K_BF16 ? "bf16 copy" : "fp32 copy";
  char what[128];
  adamw_bufs ref = bufs_fill(seed);
  adamw_bufs per_tensor = bufs_copy(&ref);
  run_isa(K_ISA_SSE, c, pc_type, use_pc, &ref);
  if (use_pc)
    EXPECT(count_bad_copy(&ref, pc_type) == 0, "%s, %s: the compute copy is not the rounded p", c->name, copy_name);
  // The scalar kernel is k_cpu_adamw on the scaled gradient, range by range.
  k_cpu_scale(per_tensor.g, NI, c->g_scale);
  for (int k = 0; k < NRI; k++)
    k_cpu_adamw(per_tensor.p + RI[k].p_offset, per_tensor.g + RI[k].offset, per_tensor.m + RI[k].offset,
                per_tensor.v + RI[k].offset, RI[k].n_elem, c->lr, B1, B2, EPS, RI[k].decay ? WD : 0.0f, BC1, BC2);
  snprintf(what, sizeof what, "%s, %s: scalar vs per-tensor k_cpu_adamw", c->name, copy_name);
  memcpy(per_tensor.pc, ref.pc, (size_t)(NI + 16) * 4);  // k_cpu_adamw makes no copy
  check_same(what, &ref, &per_tensor, pc_type);
  for (int i = 0; i < 2; i++) {
    if (!(i == 0 ? __builtin_cpu_supports("avx512f") : __builtin_cpu_supports("avx2"))) {
      printf("%s: this CPU has no %s, kernel not checked\n", c->name, vec_names[i]);
      continue;
    }
    adamw_bufs got = bufs_fill(seed);
    run_isa(vec_isas[i], c, pc_type, use_pc, &got);
    snprintf(what, sizeof what, "%s, %s: %s vs scalar", c->name, copy_name, vec_names[i]);
    check_same(what, &got, &ref, pc_type);
    bufs_free(&got);
  }
  // The widest kernel on 1 and 3 threads: chunk edges fall inside ranges, bits stay.
  adamw_bufs one = bufs_fill(seed), three = bufs_fill(seed);
  const int max_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  run_isa(K_ISA_AUTO, c, pc_type, use_pc, &one);
  omp_set_num_threads(3);
  run_isa(K_ISA_AUTO, c, pc_type, use_pc, &three);
  omp_set_num_threads(max_threads);
  snprintf(what, sizeof what, "%s, %s: 3 threads vs 1", c->name, copy_name);
  check_same(what, &three, &one, pc_type);
  bufs_free(&ref), bufs_free(&per_tensor), bufs_free(&one), bufs_free(&three);
}

static void test_isa(void) {
  static const adamw_case cases[] = {
      {"typical step", LR, S},
      {"lr 0 (the copy rounds p's raw bits)", 0.0f, 1.0f},
      {"huge gradient scale", LR, 1e30f},
      {"tiny gradient scale", 1e-6f, 1e-30f},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    test_isa_case(&cases[c], K_BF16, 1, 1000 + c);
    test_isa_case(&cases[c], K_F32, 1, 2000 + c);
    test_isa_case(&cases[c], K_F32, 0, 3000 + c);
  }
}

int main(void) {
  test_cpu();
  test_isa();
  return test_summary();
}
