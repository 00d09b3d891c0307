// The op suite (after ggml's tests/test-backend-ops.cpp): every op of the backend table
// (kernels/backend.h, gemm to the end of struct k_backend) is one row of CASES below, with the
// shapes it runs over, the activation dtypes it runs with, its tolerances and the function that
// runs it on the backend under test and the CPU reference k_cpu_* on the same random inputs and
// compares. The runner walks the table on every backend present: the CPU backend always (so CI
// runs it without a GPU), and with --backend cuda the CUDA backend with fp32, then bf16
// activations. After each backend a coverage report names any op of struct k_backend that ran
// no case, and the test fails then: OPS names the op slots by offsetof, and the test checks that
// they fill the struct from gemm to its end, so an op added to the struct without an OPS entry
// and a row fails too.
// Comparisons: NaN and Inf must sit at the same places; over the finite elements the
// normalised error ||got - ref|| / ||ref|| and a per-element bound (elementwise ops also run
// with NaN and Inf injected). On the CPU backend, whose ops are the reference, every comparison
// is exact. For bf16 activations the random inputs are rounded to bf16 first, so both sides see
// the same inputs and the bounds only have to cover the rounding of the outputs (2^-8 relative)
// and fp32 summation order. The backward ops that reduce (attention, RMSNorm, embedding), sumsq
// and GEMM must give bitwise equal results when run twice. Casts are checked bit for bit against
// a host round-to-nearest-even, the FP8 cast and scale update bit for bit against the CPU's FP8
// emulation (tests/unit/fp8_cases.h, with the FP8 GEMM's bounds), the gradient-compression ops bit for
// bit against kernels/cpu/quant_cpu.c (tests/unit/quant_cases.h).
//   test_backend_ops [--backend cpu|cuda|all] [--act f32|bf16] [--op NAME]... [--bench]
// --backend cuda without a visible GPU fails: a GPU test that passes vacuously would hide a
// broken setup. --act keeps one activation dtype, --op the rows whose op starts with NAME (e.g.
// to run a few under compute-sanitizer), --bench prints a few GPU timings (they decide nothing).
// The file is past the house ~800 lines because the table and its rows' functions belong together.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cpu/attn_decode_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/cpu/optim_cpu.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif
#include "tests/unit/test_util.h"

// The backend under test: the runner sets these for each backend in turn.
static k_backend *G;
static char LABEL[48] = "";  // "cpu f32", "cuda bf16": in every message
static int EXACT;            // the CPU backend: its ops are the reference, so results must be exact

// ---------------------------------------------------------------------------------------------
// Making backends: the one place that knows the creation API.

// kind "cpu" or "cuda"; act K_F32 or K_BF16 (the CPU backend is fp32 only). NULL when this
// build has no such backend. The CUDA backend runs its own attention kernels (the bounds below
// are theirs; with bf16 cuDNN's flash attention would round P and dP to bf16, and it has its own
// test, tests/gpu/test_cudnn_attn.c) and full fp32 GEMMs (no TF32).
static k_backend *make_backend(const char *kind, k_dtype act) {
  k_backend_opts o = {.act = act, .attn_own = 1};
  if (strcmp(kind, "cpu") == 0) return k_backend_cpu_create(&o);
#ifdef TRAINER_HAVE_CUDA
  if (strcmp(kind, "cuda") == 0) return k_backend_cuda_create(&o);
#endif
  return NULL;
}

// Checks of one backend outside the op table (CUDA: the compute stream collectives run on).
static void check_backend_extras(void) {
#ifdef TRAINER_HAVE_CUDA
  if (strcmp(G->name, "cuda") == 0) EXPECT(k_cuda_stream_of(G) != NULL, "k_cuda_stream_of returns the backend's stream");
#endif
}

// ---------------------------------------------------------------------------------------------
// Helpers

static uint64_t rng_state;

// Each row starts from a seed of its own, so --op reruns a failing row on the same data.
static void rng_seed(const char *name) {
  rng_state = 0x2545F4914F6CDD1Dull;
  for (const char *p = name; *p; p++) rng_state = (rng_state ^ (unsigned char)*p) * 0x100000001B3ull;
  if (!rng_state) rng_state = 1;
}

// Uniform in [-1, 1): a fixed xorshift so every run sees the same data.
static double rng_uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

// Host bf16: round to nearest even on the bits (NaN stays a quiet NaN, overflow gives Inf).
static uint16_t bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float bf16_round(float f) { return bf16_float(bf16_bits(f)); }

// Rounds to the activation dtype in place (nothing for fp32).
static void round_act(float *x, int64_t n) {
  if (G->act == K_BF16)
    for (int64_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

static float *rand_buf(int64_t n, double amp) {
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = (float)(amp * rng_uniform());
  return x;
}

// Random values already representable in the activation dtype.
static float *rand_act(int64_t n, double amp) {
  float *x = rand_buf(n, amp);
  round_act(x, n);
  return x;
}

static float *copy_buf(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)(n ? n : 1));
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

static void *dev_put(const void *h, size_t n_bytes) {
  void *d = G->alloc(G, n_bytes);
  G->from_host(G, d, h, n_bytes);
  return d;
}
static float *dev_putf(const float *h, int64_t n) { return dev_put(h, sizeof(float) * (size_t)n); }
static int32_t *dev_puti(const int32_t *h, int64_t n) { return dev_put(h, sizeof(int32_t) * (size_t)n); }

// Host floats into existing backend memory of dtype t (rounded to bf16 for K_BF16).
static void dev_set_typed(void *d, const float *h, int64_t n, k_dtype t) {
  if (t == K_F32) {
    G->from_host(G, d, h, sizeof(float) * (size_t)n);
    return;
  }
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) b[i] = bf16_bits(h[i]);
  G->from_host(G, d, b, sizeof(uint16_t) * (size_t)n);
  free(b);
}
static void *dev_put_typed(const float *h, int64_t n, k_dtype t) {
  void *d = G->alloc(G, k_dtype_bytes(t) * (size_t)n);
  dev_set_typed(d, h, n, t);
  return d;
}
static void *dev_put_act(const float *h, int64_t n) { return dev_put_typed(h, n, G->act); }
static void *dev_alloc_act(int64_t n) { return G->alloc(G, k_dtype_bytes(G->act) * (size_t)n); }

// A new host float copy of n elements of dtype t in backend memory.
static float *dev_get_typed(const void *d, int64_t n, k_dtype t) {
  float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (t == K_F32) {
    G->to_host(G, h, d, sizeof(float) * (size_t)n);
    return h;
  }
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
  G->to_host(G, b, d, sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = bf16_float(b[i]);
  free(b);
  return h;
}
static float *dev_getf(const float *d, int64_t n) { return dev_get_typed(d, n, K_F32); }

static void dev_free(void *p) { G->free(G, p); }

// Elements whose bits differ (two NaNs count as equal): the check of EXACT.
static int64_t n_bits_differ(const float *a, const float *b, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]));
  return bad;
}

// Bounds of one comparison: normalised error and per-element error (see compare).
typedef struct tol {
  double norm, elem;
} tol;
static const tol TOL0 = {0.0, 0.0};

// Compares got (the backend) with ref (the CPU reference): NaN and Inf must sit at the same
// places; over the finite elements, ||got - ref|| / ||ref|| <= t.norm and |got - ref| <= t.elem *
// (|ref| + rms(ref)) for each element (the rms term keeps elements that cancel to near zero from
// failing on noise).
static void compare(const char *what, const float *got, const float *ref, int64_t n, tol t) {
  double ss_ref = 0.0;
  int64_t n_fin = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i])) ss_ref += (double)ref[i] * ref[i], n_fin++;
  const double rms = n_fin ? sqrt(ss_ref / (double)n_fin) : 0.0;
  double ss_err = 0.0, worst = 0.0;
  int64_t worst_i = -1, n_special_bad = 0, first_bad = -1;
  for (int64_t i = 0; i < n; i++) {
    const float g = got[i], r = ref[i];
    if (!isfinite(r) || !isfinite(g)) {
      const int same = (isnan(r) && isnan(g)) || (isinf(r) && isinf(g) && r == g);
      if (!same && n_special_bad++ == 0) first_bad = i;
      continue;
    }
    const double e = (double)g - r;
    ss_err += e * e;
    const double rel = fabs(e) / (fabs((double)r) + rms + 1e-30);
    if (rel > worst) worst = rel, worst_i = i;
  }
  const double norm = ss_err == 0.0 ? 0.0 : sqrt(ss_err) / (sqrt(ss_ref) + 1e-30);
  EXPECT(n_special_bad == 0, "[%s] %s: %lld NaN/Inf mismatches, first at %lld (got %g, ref %g)", LABEL, what,
         (long long)n_special_bad, (long long)first_bad, first_bad >= 0 ? got[first_bad] : 0.0,
         first_bad >= 0 ? ref[first_bad] : 0.0);
  EXPECT(norm <= t.norm, "[%s] %s: normalised error %.3g > %.3g", LABEL, what, norm, t.norm);
  EXPECT(worst <= t.elem, "[%s] %s: element %lld off by %.3g of (|ref| + rms) > %.3g (got %.9g, ref %.9g)", LABEL,
         what, (long long)worst_i, worst, t.elem, worst_i >= 0 ? got[worst_i] : 0.0,
         worst_i >= 0 ? ref[worst_i] : 0.0);
}

// Backend buffer (fp32, or act dtype) vs host reference.
static void compare_dev(const char *what, const float *dev, const float *ref, int64_t n, tol t) {
  float *h = dev_getf(dev, n);
  compare(what, h, ref, n, t);
  free(h);
}
static void compare_act(const char *what, const void *dev, const float *ref, int64_t n, tol t) {
  float *h = dev_get_typed(dev, n, G->act);
  compare(what, h, ref, n, t);
  free(h);
}

static int dev_equal_bytes(const void *a, const void *b, size_t n_bytes) {
  unsigned char *ha = malloc(n_bytes ? n_bytes : 1), *hb = malloc(n_bytes ? n_bytes : 1);
  G->to_host(G, ha, a, n_bytes);
  G->to_host(G, hb, b, n_bytes);
  const int eq = memcmp(ha, hb, n_bytes) == 0;
  free(ha);
  free(hb);
  return eq;
}
static int dev_equal(const float *a, const float *b, int64_t n) { return dev_equal_bytes(a, b, sizeof(float) * n); }
static int dev_equal_act(const void *a, const void *b, int64_t n) {
  return dev_equal_bytes(a, b, k_dtype_bytes(G->act) * (size_t)n);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// The table's types. A row's shapes are integer and real parameters whose meaning the row's
// function gives (each shape list below says it); its tolerances are for outputs in the act
// dtype, under fp32 and under bf16 activations, and for fp32 outputs; EXACT makes them all 0.

typedef struct op_shape {
  int64_t i[8];
  double f[2];
} op_shape;
#define SH(...) {.i = {__VA_ARGS__}}
#define SHF(f0, f1, ...) {.i = {__VA_ARGS__}, .f = {f0, f1}}

enum { ACT_F32 = 1, ACT_BF16 = 2, ACT_ALL = ACT_F32 | ACT_BF16 };

typedef struct op_case op_case;
struct op_case {
  const char *op;  // the k_backend entry it tests (a name of OPS)
  // Runs shape s (the idx-th of the list) on G and on the reference and compares.
  void (*run)(const op_case *c, const op_shape *s, int idx);
  const op_shape *shapes;
  int n_shapes;
  unsigned acts;     // ACT_F32 | ACT_BF16: the activation dtypes it runs with
  tol act32, act16;  // outputs in the act dtype, with fp32 / bf16 activations
  tol f32;           // fp32 outputs (statistics, fp32 gradients), whatever the act dtype
};
#define SHAPES(a) a, (int)(sizeof a / sizeof a[0])

static tol tol_act(const op_case *c) { return EXACT ? TOL0 : G->act == K_BF16 ? c->act16 : c->act32; }
static tol tol_f32(const op_case *c) { return EXACT ? TOL0 : c->f32; }

// ---------------------------------------------------------------------------------------------
// Memory (not an op: every backend, before its cases)

static void test_memory(void) {
  const size_t n_bytes = 1000;
  unsigned char *d = G->alloc(G, n_bytes), h[1000], h2[1000];
  memset(h, 0xAB, sizeof h);
  G->to_host(G, h, d, n_bytes);
  int zero = 1;
  for (size_t i = 0; i < n_bytes; i++) zero &= h[i] == 0;
  EXPECT(zero, "[%s] alloc must be zero-filled", LABEL);
  for (size_t i = 0; i < n_bytes; i++) h[i] = (unsigned char)(i * 7 + 1);
  G->from_host(G, d, h, n_bytes);
  unsigned char *d2 = G->alloc(G, n_bytes);
  G->copy(G, d2, d, n_bytes);
  G->to_host(G, h2, d2, n_bytes);
  EXPECT(memcmp(h, h2, n_bytes) == 0, "[%s] from_host / copy / to_host round trip", LABEL);
  G->zero(G, d2 + 100, 50);
  G->sync(G);
  G->to_host(G, h2, d2, n_bytes);
  int ok = 1;
  for (size_t i = 0; i < n_bytes; i++) ok &= h2[i] == (i >= 100 && i < 150 ? 0 : h[i]);
  EXPECT(ok, "[%s] zero clears exactly the range", LABEL);
  EXPECT(G->mem_used(G) >= 0, "[%s] mem_used is not negative", LABEL);
  const int64_t held = G->mem_held(G);
  int64_t by_kind[K_MEM_KINDS], by_kind_with[K_MEM_KINDS];
  G->mem_held_by_kind(G, by_kind);
  void *d3 = k_alloc_as(G, 1 << 20, K_MEM_FP8);
  G->mem_held_by_kind(G, by_kind_with);
  EXPECT(G->mem_held(G) == held + (1 << 20) && by_kind_with[K_MEM_FP8] == by_kind[K_MEM_FP8] + (1 << 20) &&
             by_kind_with[K_MEM_OTHER] == by_kind[K_MEM_OTHER],
         "[%s] mem_held counts a new buffer under its kind (%lld -> %lld bytes)", LABEL, (long long)held,
         (long long)G->mem_held(G));
  G->free(G, d3);
  G->mem_held_by_kind(G, by_kind_with);
  EXPECT(G->mem_held(G) == held && by_kind_with[K_MEM_FP8] == by_kind[K_MEM_FP8],
         "[%s] mem_held gives a freed buffer back (%lld, was %lld)", LABEL, (long long)G->mem_held(G), (long long)held);
  dev_free(d);
  dev_free(d2);
}

// Host memory the device addresses (host_alloc) and the copy stream, as the offloaded optimizer
// uses them: zero-filled, copies both ways with tickets and joins, and the multi-tensor AdamW
// with the master weights and moments in host memory and the gradient in backend memory giving
// the same bits as with everything in backend memory (the same kernel reads them in place),
// run on the side stream (side_begin ... side_join_ticket) as the sharded optimizer runs it.
static void test_host_memory(void) {
  const int64_t n = 3000;
  float *h = G->host_alloc(G, n * sizeof(float)), *src = malloc(n * sizeof(float));
  EXPECT(h != NULL, "[%s] host_alloc of %lld bytes", LABEL, (long long)(n * 4));
  if (!h) return free(src);
  int zero = 1;
  for (int64_t i = 0; i < n; i++) zero &= h[i] == 0.0f, src[i] = (float)i * 0.5f - 7.0f;
  EXPECT(zero, "[%s] host_alloc must be zero-filled", LABEL);
  float *d = dev_putf(src, n), *d2 = G->alloc(G, n * sizeof(float));
  int64_t t1 = G->copy_async(G, h, d, n * sizeof(float));  // after the upload queued on the compute stream
  G->copy_wait(G, t1);
  EXPECT(memcmp(h, src, n * sizeof(float)) == 0, "[%s] copy_async device -> host, after copy_wait", LABEL);
  for (int64_t i = 0; i < n; i++) h[i] = -h[i];
  G->copy_async(G, d2, h, n * sizeof(float));
  G->copy_join(G);  // the compute stream's next work (to_host) sees the copy
  float *back = dev_getf(d2, n);
  int neg = 1;
  for (int64_t i = 0; i < n; i++) neg &= back[i] == -src[i];
  EXPECT(neg, "[%s] copy_async host -> device, after copy_join", LABEL);
  free(back);
  // copy_join_ticket: the compute stream waits for one copy (here not the last one queued).
  for (int64_t i = 0; i < n; i++) h[i] = 2.0f * src[i];
  const int64_t t2 = G->copy_async(G, d2, h, n * sizeof(float));
  G->copy_async(G, h + n / 2, d, (n / 2) * sizeof(float));
  G->copy_join_ticket(G, t2);
  back = dev_getf(d2, n);
  int twice = 1;
  for (int64_t i = 0; i < n; i++) twice &= back[i] == 2.0f * src[i];
  EXPECT(twice, "[%s] copy_async host -> device, after copy_join_ticket", LABEL);
  G->copy_join(G);  // the later copy is done before h is freed
  free(back);
  // The side stream: a copy there, after the compute stream's work before it (d2's upload), and
  // the compute stream's read (to_host) after side_join_ticket(-1).
  G->zero(G, d2, n * sizeof(float));
  G->side_begin(G);
  G->copy(G, d2, d, n * sizeof(float));
  G->side_end(G);
  G->side_join_ticket(G, -1);
  back = dev_getf(d2, n);
  EXPECT(memcmp(back, src, n * sizeof(float)) == 0, "[%s] copy on the side stream, after side_join_ticket", LABEL);
  free(back);
  // AdamW over two ranges: p, m, v in host memory against the same in backend memory.
  float *hp = G->host_alloc(G, n * sizeof(float)), *hm = G->host_alloc(G, n * sizeof(float));
  float *hv = G->host_alloc(G, n * sizeof(float));
  float *g0 = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    hp[i] = src[i] * 0.01f, hm[i] = 0.001f * (float)(i % 7), hv[i] = 1e-4f * (float)(i % 5), g0[i] = (float)(i % 11) - 5.0f;
  }
  float *dp = dev_putf(hp, n), *dm = dev_putf(hm, n), *dv = dev_putf(hv, n), *dg = dev_putf(g0, n);
  const k_range r[2] = {{0, 1000, 1, 500}, {1000, 1500, 0, 1500}};
  void *pc_d = G->alloc(G, n * k_dtype_bytes(G->act)), *pc_h = G->alloc(G, n * k_dtype_bytes(G->act));
  G->adamw_ranges(G, dp, pc_d, G->act, dg, dm, dv, r, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f);
  G->side_begin(G);  // and on the side stream: the same bits
  G->adamw_ranges(G, hp, pc_h, G->act, dg, hm, hv, r, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f);
  G->side_join_ticket(G, G->side_end(G));
  G->sync(G);
  float *ep = dev_getf(dp, n), *em = dev_getf(dm, n), *ev = dev_getf(dv, n);
  float *cd = dev_get_typed(pc_d, n, G->act), *ch = dev_get_typed(pc_h, n, G->act);
  EXPECT(memcmp(ep, hp, n * 4) == 0 && memcmp(em, hm, n * 4) == 0 && memcmp(ev, hv, n * 4) == 0,
         "[%s] adamw_ranges on host memory: master weights and moments as in backend memory", LABEL);
  EXPECT(memcmp(cd, ch, n * 4) == 0, "[%s] adamw_ranges on host memory: the compute copy as in backend memory", LABEL);
  free(ep), free(em), free(ev), free(cd), free(ch), free(g0), free(src);
  dev_free(dp), dev_free(dm), dev_free(dv), dev_free(dg), dev_free(d), dev_free(d2), dev_free(pc_d), dev_free(pc_h);
  G->host_free(G, h), G->host_free(G, hp), G->host_free(G, hm), G->host_free(G, hv);
}

// ---------------------------------------------------------------------------------------------
// gemm. Shapes {kind, ta, tb, M, N, K} {alpha, beta}: GEMM_ONE one product; GEMM_GRID the same
// with alpha, beta taken in turn from GEMM_AB by the shape's index; GEMM_ACCUM the weight
// gradient pattern (M, N, K). Each product runs with C in the act dtype and, for bf16
// activations, in fp32 too.
// Tolerances (act32, act16): norm the normalised error, elem the accumulation bound tol_acc.

enum { GEMM_ONE, GEMM_GRID, GEMM_ACCUM };
static const float GEMM_AB[3][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}};

// One product with A, B in the act dtype and C in c_type. The per-element bound is
// tol_acc |alpha| |op(A)| |op(B)| + |beta C0| (summation order; 1e-5 as for any fp32 dot product,
// 1e-4 for the tensor cores' bf16 products) plus, for a bf16 C, its one rounding (2^-8 |C|:
// the backend forbids cuBLAS's split-K reductions in bf16, which would round partial sums) and a
// normalised error of 1e-2.
static void gemm_product(tol t, int ta, int tb, int M, int N, int K, float alpha, float beta, k_dtype c_type) {
  const int pad = 3;  // leading dims wider than the matrix, to catch ld mix-ups
  const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  const int64_t na = (int64_t)a_rows * lda, nb = (int64_t)b_rows * ldb, nc = (int64_t)M * ldc;
  float *A = rand_act(na, 1.0), *B = rand_act(nb, 1.0), *C = rand_buf(nc, 1.0);
  if (c_type == K_BF16)
    for (int64_t i = 0; i < nc; i++) C[i] = bf16_round(C[i]);
  if (beta == 0.0f)  // beta == 0 must overwrite C without reading it: NaNs must not leak in
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(int64_t)i * ldc + j] = NAN;
  float *C0 = copy_buf(C, nc);
  void *dA = dev_put_act(A, na), *dB = dev_put_act(B, nb), *dC = dev_put_typed(C, nc, c_type);
  k_cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  G->gemm(G, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc, c_type);
  float *g = dev_get_typed(dC, nc, c_type);
  for (int64_t i = 0; i < na; i++) A[i] = fabsf(A[i]);
  for (int64_t i = 0; i < nb; i++) B[i] = fabsf(B[i]);
  float *bound = calloc((size_t)nc, sizeof(float));
  k_cpu_gemm(ta, tb, M, N, K, fabsf(alpha), A, lda, B, ldb, 0.0f, bound, ldc);
  const double tol_acc = t.elem, tol_rnd = c_type == K_BF16 ? 1.0 / 256 : 0.0;
  const double tol_norm = c_type == K_BF16 ? 1e-2 : t.norm;
  double ss_err = 0.0, ss_ref = 0.0, worst = 0.0;
  int pad_ok = 1, nan_ok = 1;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      const int64_t ij = (int64_t)i * ldc + j;
      if (isnan(g[ij]) || isnan(C[ij])) {
        nan_ok = 0;
        continue;
      }
      const double e = (double)g[ij] - C[ij];
      ss_err += e * e;
      ss_ref += (double)C[ij] * C[ij];
      const double b = bound[ij] + (beta == 0.0f ? 0.0f : fabsf(beta * C0[ij]));
      const double rel = fabs(e) / (1.01 * tol_acc * b + tol_rnd * fabs((double)C[ij]) + 1e-6);
      if (rel > worst) worst = rel;
    }
    for (int j = N; j < ldc; j++) pad_ok &= memcmp(&g[(int64_t)i * ldc + j], &C0[(int64_t)i * ldc + j], 4) == 0;
  }
  const double norm = ss_err == 0.0 ? 0.0 : sqrt(ss_err / (ss_ref + 1e-30));
  const int64_t n_diff = EXACT ? n_bits_differ(g, C, nc) : 0;
  EXPECT(nan_ok && pad_ok && norm <= tol_norm && worst <= 1.0 && n_diff == 0,
         "[%s] gemm C %s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g: nan_ok %d pad_ok %d norm err %.3g, "
         "worst/bound %.3g, %lld elements not bitwise equal (checked when exact)",
         LABEL, c_type == K_BF16 ? "bf16" : "f32", ta, tb, M, N, K, alpha, beta, nan_ok, pad_ok, norm, worst,
         (long long)n_diff);
  free(A), free(B), free(C), free(C0), free(g), free(bound);
  dev_free(dA), dev_free(dB), dev_free(dC);
}

// The weight-gradient pattern: dW (N,K) fp32 += dY^T X over two micro-batches, act-dtype
// operands, beta = 1; and the same again into a second buffer gives the same bits.
static void gemm_accum(tol t, int M, int N, int K) {
  const int64_t ny = (int64_t)M * N, nx = (int64_t)M * K, nw = (int64_t)N * K;
  float *dy[2], *x[2], *w = rand_buf(nw, 0.5), *bound = calloc((size_t)nw, sizeof(float));
  void *d_dy[2], *d_x[2];
  float *d_w = dev_putf(w, nw), *d_w2 = dev_putf(w, nw);
  for (int i = 0; i < 2; i++) {
    dy[i] = rand_act(ny, 1.0), x[i] = rand_act(nx, 1.0);
    d_dy[i] = dev_put_act(dy[i], ny), d_x[i] = dev_put_act(x[i], nx);
  }
  float *w0 = copy_buf(w, nw);
  for (int i = 0; i < 2; i++) {
    k_cpu_gemm(1, 0, N, K, M, 1.0f, dy[i], N, x[i], K, 1.0f, w, K);
    G->gemm(G, 1, 0, N, K, M, 1.0f, d_dy[i], N, d_x[i], K, 1.0f, d_w, K, K_F32);
    G->gemm(G, 1, 0, N, K, M, 1.0f, d_dy[i], N, d_x[i], K, 1.0f, d_w2, K, K_F32);
    for (int64_t j = 0; j < ny; j++) dy[i][j] = fabsf(dy[i][j]);
    for (int64_t j = 0; j < nx; j++) x[i][j] = fabsf(x[i][j]);
    k_cpu_gemm(1, 0, N, K, M, 1.0f, dy[i], N, x[i], K, 1.0f, bound, K);
  }
  float *g = dev_getf(d_w, nw);
  double worst = 0.0, ss_err = 0.0, ss_ref = 0.0;
  for (int64_t j = 0; j < nw; j++) {
    const double e = (double)g[j] - w[j];
    ss_err += e * e, ss_ref += (double)w[j] * w[j];
    const double rel = fabs(e) / (t.elem * (bound[j] + fabsf(w0[j])) + 1e-6);
    if (rel > worst) worst = rel;
  }
  const double norm = sqrt(ss_err / (ss_ref + 1e-30));
  const int64_t n_diff = EXACT ? n_bits_differ(g, w, nw) : 0;
  EXPECT(norm <= t.norm && worst <= 1.0 && n_diff == 0,
         "[%s] gemm dW += dY^T X (C f32, beta 1) M=%d N=%d K=%d: norm err %.3g, worst/bound %.3g, %lld elements "
         "not bitwise equal (checked when exact)", LABEL, M, N, K, norm, worst, (long long)n_diff);
  EXPECT(dev_equal(d_w, d_w2, nw), "[%s] gemm M=%d N=%d K=%d not bitwise repeatable", LABEL, M, N, K);
  for (int i = 0; i < 2; i++) free(dy[i]), free(x[i]), dev_free(d_dy[i]), dev_free(d_x[i]);
  free(w), free(w0), free(bound), free(g);
  dev_free(d_w), dev_free(d_w2);
}

static void run_gemm(const op_case *c, const op_shape *s, int idx) {
  const tol t = tol_act(c);
  const int kind = (int)s->i[0], ta = (int)s->i[1], tb = (int)s->i[2];
  const int M = (int)s->i[3], N = (int)s->i[4], K = (int)s->i[5];
  if (kind == GEMM_ACCUM) {
    gemm_accum(t, M, N, K);
    return;
  }
  float alpha = (float)s->f[0], beta = (float)s->f[1];
  if (kind == GEMM_GRID) alpha = GEMM_AB[idx % 3][0], beta = GEMM_AB[idx % 3][1];
  gemm_product(t, ta, tb, M, N, K, alpha, beta, G->act);
  if (G->act != K_F32) gemm_product(t, ta, tb, M, N, K, alpha, beta, K_F32);
}

// Sizes {1, 7, 33, 128, 257}^3 for one transpose pair.
#define GG(ta, tb, m, n, k) SH(GEMM_GRID, ta, tb, m, n, k)
#define GG_K(ta, tb, m, n) GG(ta, tb, m, n, 1), GG(ta, tb, m, n, 7), GG(ta, tb, m, n, 33), GG(ta, tb, m, n, 128), \
                           GG(ta, tb, m, n, 257)
#define GG_N(ta, tb, m) GG_K(ta, tb, m, 1), GG_K(ta, tb, m, 7), GG_K(ta, tb, m, 33), GG_K(ta, tb, m, 128), \
                        GG_K(ta, tb, m, 257)
#define GG_M(ta, tb) GG_N(ta, tb, 1), GG_N(ta, tb, 7), GG_N(ta, tb, 33), GG_N(ta, tb, 128), GG_N(ta, tb, 257)
static const op_shape gemm_shapes[] = {
    GG_M(0, 0), GG_M(0, 1), GG_M(1, 0), GG_M(1, 1),
    // Degenerate cases: K == 0 and alpha == 0 leave beta * C (zeros for beta == 0).
    SHF(1.0, 0.0, GEMM_ONE, 0, 0, 5, 6, 0), SHF(1.0, 0.5, GEMM_ONE, 1, 1, 5, 6, 0),
    SHF(0.0, 2.0, GEMM_ONE, 0, 1, 9, 4, 3),
    // Products the size of the model's projections.
    SHF(1.0, 0.0, GEMM_ONE, 0, 1, 512, 768, 1024), SHF(1.0, 1.0, GEMM_ONE, 1, 0, 768, 1024, 512),
    // dW accumulation
    SH(GEMM_ACCUM, 0, 0, 300, 96, 130), SH(GEMM_ACCUM, 0, 0, 1024, 256, 512)};

// ---------------------------------------------------------------------------------------------
// linear_residual: D = A W^T + C into the fp32 residual stream (cuBLASLt on the GPU), each
// element within the accumulation bound (the rows' elem), separate D and in place (D == C),
// bitwise repeatable. Shapes {M, N, K}.

static void linear_residual_one(tol t, int M, int N, int K, int in_place) {
  const int64_t na = (int64_t)M * K, nw = (int64_t)N * K, nc = (int64_t)M * N;
  float *A = rand_act(na, 1.0), *W = rand_act(nw, 1.0), *C = rand_buf(nc, 1.0), *D = malloc(sizeof(float) * nc);
  void *dA = dev_put_act(A, na), *dW = dev_put_act(W, nw);
  float *dC = dev_putf(C, nc), *dD = in_place ? dC : G->alloc(G, sizeof(float) * nc), *dD2 = NULL;
  k_cpu_linear_residual(M, N, K, A, W, C, D);
  G->linear_residual(G, M, N, K, dA, dW, dC, dD);
  float *g = dev_getf(dD, nc), *c_after = dev_getf(dC, nc);
  for (int64_t i = 0; i < na; i++) A[i] = fabsf(A[i]);
  for (int64_t i = 0; i < nw; i++) W[i] = fabsf(W[i]);
  float *bound = calloc((size_t)nc, sizeof(float));
  k_cpu_gemm(0, 1, M, N, K, 1.0f, A, K, W, K, 0.0f, bound, N);
  double worst = 0.0;
  int nan_ok = 1, c_kept = 1;
  for (int64_t i = 0; i < nc; i++) {
    if (isnan(g[i]) != isnan(D[i])) nan_ok = 0;
    const double rel = fabs((double)g[i] - D[i]) / (1.01 * t.elem * (bound[i] + fabsf(C[i])) + 1e-6);
    if (rel > worst) worst = rel;
    if (!in_place) c_kept &= c_after[i] == C[i];
  }
  if (!in_place) {  // the same call again gives the same bits
    dD2 = G->alloc(G, sizeof(float) * nc);
    G->linear_residual(G, M, N, K, dA, dW, dC, dD2);
    EXPECT(dev_equal(dD, dD2, nc), "[%s] linear_residual M=%d N=%d K=%d not bitwise repeatable", LABEL, M, N, K);
    dev_free(dD2);
  }
  const int64_t n_diff = EXACT ? n_bits_differ(g, D, nc) : 0;
  EXPECT(nan_ok && c_kept && worst <= 1.0 && n_diff == 0, "[%s] linear_residual M=%d N=%d K=%d%s: nan_ok %d, C kept %d, "
         "worst/bound %.3g, %lld elements not bitwise equal (checked when exact)", LABEL, M, N, K,
         in_place ? " (in place)" : "", nan_ok, c_kept, worst, (long long)n_diff);
  free(A), free(W), free(C), free(D), free(g), free(c_after), free(bound);
  dev_free(dA), dev_free(dW), dev_free(dC);
  if (!in_place) dev_free(dD);
}

static void run_linear_residual(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  for (int in_place = 0; in_place < 2; in_place++)
    linear_residual_one(tol_act(c), (int)s->i[0], (int)s->i[1], (int)s->i[2], in_place);
}

static const op_shape linear_residual_shapes[] = {SH(1, 1, 1),       SH(7, 5, 3),        SH(33, 64, 128),
                                                  SH(130, 257, 33),  SH(1024, 768, 2048), SH(4096, 768, 768),
                                                  SH(5, 8, 0)};

// ---------------------------------------------------------------------------------------------
// cast (independent of the activation dtype): bit for bit against the host rounding. Shapes
// {n, offset}: an offset of 1 element misaligns both sides (the scalar path).

static void run_cast(const op_case *c, const op_shape *s, int idx) {
  (void)c, (void)idx;
  const int64_t n = s->i[0];
  const int offset = (int)s->i[1];
  float *x = rand_buf(n + offset, 3.0);
  // Specials and the corners of round-to-nearest-even: ties to even both ways (normal and
  // subnormal), overflow to Inf, the smallest subnormal, signed zero, NaN, Inf.
  static const uint32_t corner[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00000001u, 0x00018000u,
                                    0x00008000u, 0x80000000u, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0xbf818000u};
  for (int i = 0; i < 12 && i < n; i++) memcpy(&x[offset + (i * 7919) % n], &corner[i], 4);
  float *d_f = dev_putf(x, n + offset);
  uint16_t *d_h = G->alloc(G, sizeof(uint16_t) * (size_t)(n + offset));
  float *d_f2 = G->alloc(G, sizeof(float) * (size_t)(n + offset));
  uint16_t *d_h2 = G->alloc(G, sizeof(uint16_t) * (size_t)(n + offset));
  G->cast(G, d_h + offset, K_BF16, d_f + offset, K_F32, n);
  G->cast(G, d_f2 + offset, K_F32, d_h + offset, K_BF16, n);
  G->cast(G, d_h2 + offset, K_BF16, d_h + offset, K_BF16, n);
  uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n), *h2 = malloc(sizeof(uint16_t) * (size_t)n);
  float *f2 = malloc(sizeof(float) * (size_t)n);
  G->to_host(G, h, d_h + offset, sizeof(uint16_t) * (size_t)n);
  G->to_host(G, h2, d_h2 + offset, sizeof(uint16_t) * (size_t)n);
  G->to_host(G, f2, d_f2 + offset, sizeof(float) * (size_t)n);
  int64_t bad = 0, bad_back = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    const float xi = x[offset + i];
    const uint16_t want = bf16_bits(xi);
    const int ok = isnan(xi) ? isnan(bf16_float(h[i])) : h[i] == want;
    if (!ok && bad++ == 0) first = i;
    // bf16 -> fp32 is exact: the high half of the fp32 bits.
    const uint32_t back = (uint32_t)h[i] << 16;
    if (memcmp(&back, &f2[i], 4) != 0) bad_back++;
  }
  EXPECT(bad == 0, "[%s] cast f32->bf16 n=%lld offset %d: %lld elements not rounded to nearest even, first %lld "
         "(%.9g gave 0x%04x, want 0x%04x)", LABEL, (long long)n, offset, (long long)bad, (long long)first,
         first >= 0 ? x[offset + first] : 0.0, first >= 0 ? h[first] : 0, first >= 0 ? bf16_bits(x[offset + first]) : 0);
  EXPECT(bad_back == 0, "[%s] cast bf16->f32 n=%lld offset %d: %lld elements not exact", LABEL, (long long)n, offset,
         (long long)bad_back);
  EXPECT(memcmp(h, h2, sizeof(uint16_t) * (size_t)n) == 0, "[%s] cast bf16->bf16 n=%lld is not a copy", LABEL,
         (long long)n);
  G->cast(G, d_f2 + offset, K_F32, d_f + offset, K_F32, n);
  EXPECT(dev_equal_bytes(d_f2 + offset, d_f + offset, sizeof(float) * (size_t)n),
         "[%s] cast f32->f32 n=%lld is not a copy", LABEL, (long long)n);
  G->cast(G, d_f2, K_F32, d_f, K_BF16, 0);  // n == 0 does nothing
  free(x), free(h), free(h2), free(f2);
  dev_free(d_f), dev_free(d_h), dev_free(d_f2), dev_free(d_h2);
}

static const op_shape cast_shapes[] = {SH(1, 0), SH(3, 0), SH(1000, 0), SH(1000003, 0), SH(1001, 1)};

// ---------------------------------------------------------------------------------------------
// RMSNorm: rmsnorm_fwd_act, rmsnorm_bwd_act and rmsnorm_bwd over one shape list {rows, d,
// inject}. inject puts a NaN in x (it poisons row 2: y, rstd, dx, and every dw) and an Inf in dy.
// The backwards start from the CPU's rstd on both sides, so only the backward is compared.

typedef struct rms_in {
  int64_t rows, n;
  int d, inject;
  float *x, *w, *dy, *dx, *dw, *y, *rstd;  // dx, dw: the accumulators' start; y, rstd: the reference forward
  char what[64];                           // " rows=.. d=..[ +nan]"
} rms_in;

static rms_in rms_make(const op_shape *s) {
  rms_in r = {.rows = s->i[0], .d = (int)s->i[1], .inject = (int)s->i[2]};
  r.n = r.rows * r.d;
  r.x = rand_buf(r.n, 2.0), r.w = rand_buf(r.d, 1.0), r.dy = rand_buf(r.n, 1.0);
  r.dx = rand_buf(r.n, 1.0), r.dw = rand_buf(r.d, 1.0);
  if (r.inject && r.rows >= 3 && r.d >= 4) {
    r.x[2 * r.d + 3] = NAN;
    r.dy[0 * r.d + 1] = INFINITY;
  }
  r.y = malloc(sizeof(float) * r.n), r.rstd = malloc(sizeof(float) * r.rows);
  k_cpu_rmsnorm_fwd(r.x, r.w, r.y, r.rstd, r.rows, r.d, 1e-5f);
  snprintf(r.what, sizeof r.what, " rows=%lld d=%d%s", (long long)r.rows, r.d, r.inject ? " +nan" : "");
  return r;
}
static void rms_free(rms_in *r) { free(r->x), free(r->w), free(r->dy), free(r->dx), free(r->dw), free(r->y), free(r->rstd); }

static void run_rmsnorm_fwd_act(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[128];
  rms_in r = rms_make(s);
  float *d_x = dev_putf(r.x, r.n), *d_w = dev_putf(r.w, r.d), *d_r = G->alloc(G, sizeof(float) * r.rows);
  void *d_ya = dev_alloc_act(r.n);
  float *ya = copy_buf(r.y, r.n);  // y in the act dtype: the reference rounded like a cast would
  round_act(ya, r.n);
  G->rmsnorm_fwd_act(G, d_x, d_w, d_ya, d_r, r.rows, r.d, 1e-5f);
  snprintf(what, sizeof what, "rmsnorm_fwd_act y%s", r.what);
  compare_act(what, d_ya, ya, r.n, tol_act(c));
  snprintf(what, sizeof what, "rmsnorm_fwd_act rstd%s", r.what);
  compare_dev(what, d_r, r.rstd, r.rows, tol_f32(c));
  free(ya);
  rms_free(&r);
  dev_free(d_x), dev_free(d_w), dev_free(d_r), dev_free(d_ya);
}

// The one-pass backward, with the act copy of dx; bitwise repeatable with or without the copy.
static void run_rmsnorm_bwd_act(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[128];
  rms_in r = rms_make(s);
  const int64_t n = r.n, rows = r.rows;
  const int d = r.d;
  float *d_x = dev_putf(r.x, n), *d_w = dev_putf(r.w, d), *d_r = dev_putf(r.rstd, rows), *d_dy = dev_putf(r.dy, n);
  float *d_dx = dev_putf(r.dx, n), *d_dw = dev_putf(r.dw, d);
  void *d_dxa = dev_alloc_act(n);
  k_cpu_rmsnorm_bwd(r.dy, r.x, r.w, r.rstd, r.dx, r.dw, rows, d);
  float *dxa = copy_buf(r.dx, n);
  round_act(dxa, n);
  G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, d_dx, d_dw, d_dxa, rows, d);
  snprintf(what, sizeof what, "rmsnorm_bwd_act dx%s", r.what);
  compare_dev(what, d_dx, r.dx, n, tol_f32(c));
  snprintf(what, sizeof what, "rmsnorm_bwd_act dw%s", r.what);
  compare_dev(what, d_dw, r.dw, d, tol_f32(c));
  snprintf(what, sizeof what, "rmsnorm_bwd_act dx_act%s", r.what);
  compare_act(what, d_dxa, dxa, n, tol_act(c));
  if (!r.inject) {
    float *e_dx = G->alloc(G, sizeof(float) * n), *e_dw = G->alloc(G, sizeof(float) * d);
    float *f_dx = G->alloc(G, sizeof(float) * n), *f_dw = G->alloc(G, sizeof(float) * d);
    G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, e_dx, e_dw, d_dxa, rows, d);
    G->rmsnorm_bwd_act(G, d_dy, d_x, d_w, d_r, f_dx, f_dw, NULL, rows, d);
    EXPECT(dev_equal(e_dx, f_dx, n) && dev_equal(e_dw, f_dw, d), "[%s] rmsnorm_bwd_act%s not bitwise repeatable",
           LABEL, r.what);
    dev_free(e_dx), dev_free(e_dw), dev_free(f_dx), dev_free(f_dw);
  }
  free(dxa);
  rms_free(&r);
  dev_free(d_x), dev_free(d_w), dev_free(d_r), dev_free(d_dy), dev_free(d_dx), dev_free(d_dw), dev_free(d_dxa);
}

static void run_rmsnorm_bwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[128];
  rms_in r = rms_make(s);
  const int64_t n = r.n, rows = r.rows;
  const int d = r.d;
  float *d_x = dev_putf(r.x, n), *d_w = dev_putf(r.w, d), *d_r = dev_putf(r.rstd, rows), *d_dy = dev_putf(r.dy, n);
  float *d_dx = dev_putf(r.dx, n), *d_dw = dev_putf(r.dw, d);
  k_cpu_rmsnorm_bwd(r.dy, r.x, r.w, r.rstd, r.dx, r.dw, rows, d);
  G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, d_dx, d_dw, rows, d);
  snprintf(what, sizeof what, "rmsnorm_bwd dx%s", r.what);
  compare_dev(what, d_dx, r.dx, n, tol_f32(c));
  snprintf(what, sizeof what, "rmsnorm_bwd dw%s", r.what);
  compare_dev(what, d_dw, r.dw, d, tol_f32(c));
  if (!r.inject) {  // determinism: the same accumulation from the same start, twice
    float *e_dx = G->alloc(G, sizeof(float) * n), *e_dw = G->alloc(G, sizeof(float) * d);
    float *f_dx = G->alloc(G, sizeof(float) * n), *f_dw = G->alloc(G, sizeof(float) * d);
    G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, e_dx, e_dw, rows, d);
    G->rmsnorm_bwd(G, d_dy, d_x, d_w, d_r, f_dx, f_dw, rows, d);
    EXPECT(dev_equal(e_dx, f_dx, n) && dev_equal(e_dw, f_dw, d), "[%s] rmsnorm_bwd%s not bitwise repeatable", LABEL,
           r.what);
    dev_free(e_dx), dev_free(e_dw), dev_free(f_dx), dev_free(f_dw);
  }
  rms_free(&r);
  dev_free(d_x), dev_free(d_w), dev_free(d_r), dev_free(d_dy), dev_free(d_dx), dev_free(d_dw);
}

static const op_shape rmsnorm_shapes[] = {
    SH(1, 1, 0), SH(7, 7, 0), SH(33, 64, 0), SH(130, 257, 0), SH(1000, 1024, 0), SH(3000, 33, 0),
    SH(64, 4096, 0), SH(40000, 8, 0), SH(517, 768, 0), SH(9, 2049, 0), SH(20, 8193, 0), SH(3, 9000, 0),
    SH(130, 257, 1),
    // The forward's vector paths (d a multiple of 4): a warp per row with 1, 2, 4, 8 float4 per
    // lane and a partial last block of rows; a block per row; past the vector limit (d > 16384).
    SH(3, 4, 0), SH(1001, 124, 0), SH(33, 252, 0), SH(9, 500, 0), SH(16389, 768, 0), SH(7, 1028, 0),
    SH(5, 3996, 0), SH(3, 8196, 0), SH(2, 16384, 0), SH(2, 16388, 0),
    SH(517, 768, 1), SH(5, 4096, 1)};

// ---------------------------------------------------------------------------------------------
// rope: rows of ld = H*hd + pad elements (the heads at the row start, the rest must stay
// untouched). Shapes {B, T, H, hd, pad, pos0, inverse, inject} {theta}.

static void run_rope(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[128];
  const int B = (int)s->i[0], T = (int)s->i[1], H = (int)s->i[2], hd = (int)s->i[3], pad = (int)s->i[4];
  const int pos0 = (int)s->i[5], inverse = (int)s->i[6], inject = (int)s->i[7];
  const float theta = (float)s->f[0];
  const int64_t ld = (int64_t)H * hd + pad, n = (int64_t)B * T * ld;
  float *x = rand_act(n, 1.0);
  if (inject) x[n / 2] = NAN, x[n - 1] = INFINITY;
  void *d_x = dev_put_act(x, n);
  k_cpu_rope(x, B, T, H, hd, ld, pos0, theta, inverse);
  G->rope(G, d_x, B, T, H, hd, ld, pos0, theta, inverse);
  snprintf(what, sizeof what, "rope B=%d T=%d H=%d hd=%d ld=%lld pos0=%d inv=%d%s", B, T, H, hd, (long long)ld, pos0,
           inverse, inject ? " +nan" : "");
  compare_act(what, d_x, x, n, tol_act(c));
  free(x);
  dev_free(d_x);
}

static const op_shape rope_shapes[] = {
    SHF(10000.0, 0, 1, 1, 1, 2, 0, 0, 0, 0), SHF(10000.0, 0, 2, 3, 4, 16, 0, 0, 0, 0),
    SHF(10000.0, 0, 1, 65, 3, 64, 64, 7, 1, 0),  // q|k of a fused row, v left alone
    SHF(500000.0, 0, 2, 130, 2, 128, 0, 0, 0, 0), SHF(10000.0, 0, 3, 33, 5, 128, 6, 4000, 1, 0),
    SHF(10000.0, 0, 2, 17, 3, 64, 0, 0, 0, 1), SHF(10000.0, 0, 5, 7, 3, 10, 3, 2, 0, 0),
    // The vector path (half a multiple of 8 bf16 or 4 fp32, 16-byte row stride) and its
    // fallbacks: hd 24 and a 36-element stride are vectorised for fp32 only.
    SHF(10000.0, 0, 4, 33, 24, 64, 0, 5, 0, 1),
    SHF(10000.0, 0, 2, 9, 3, 64, 8, 3, 1, 0),  // pad columns past the heads stay untouched
    SHF(10000.0, 0, 3, 5, 2, 16, 4, 0, 0, 0), SHF(10000.0, 0, 2, 7, 3, 24, 0, 1000, 1, 0),
    SHF(500000.0, 0, 1, 300, 4, 128, 128, 0, 0, 0)};

// ---------------------------------------------------------------------------------------------
// Attention: q, k, v are column blocks of one fused (T*B, ld) buffer, sequence-major, with pad
// columns past v that must stay untouched (in dq|dk|dv too). Shapes {B, T, nh, nkv, hd, pad}.
// The backward starts from the CPU's o (rounded to the act dtype, on both sides) and lse, so
// only the backward is compared.

typedef struct attn_dims {
  int B, T, nh, nkv, hd;
  int64_t ld, nx, nq, nl, ko, vo;  // row stride; elements of x, o, lse; offsets of k and v in a row
  char what[96];
} attn_dims;

static attn_dims attn_dims_of(const op_shape *s) {
  attn_dims a = {.B = (int)s->i[0], .T = (int)s->i[1], .nh = (int)s->i[2], .nkv = (int)s->i[3], .hd = (int)s->i[4]};
  a.ld = (int64_t)(a.nh + 2 * a.nkv) * a.hd + s->i[5], a.nx = (int64_t)a.B * a.T * a.ld;
  a.nq = (int64_t)a.B * a.T * a.nh * a.hd, a.nl = (int64_t)a.B * a.nh * a.T;
  a.ko = (int64_t)a.nh * a.hd, a.vo = a.ko + (int64_t)a.nkv * a.hd;
  snprintf(a.what, sizeof a.what, " B=%d T=%d nh=%d nkv=%d hd=%d ld=%lld", a.B, a.T, a.nh, a.nkv, a.hd, (long long)a.ld);
  return a;
}

static void run_attn_fwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[160];
  const attn_dims a = attn_dims_of(s);
  const int64_t eb = (int64_t)k_dtype_bytes(G->act);
  float *x = rand_act(a.nx, 1.0), *o = malloc(sizeof(float) * a.nq), *lse = malloc(sizeof(float) * a.nl);
  k_cpu_attn_fwd(x, x + a.ko, x + a.vo, a.ld, o, lse, a.B, a.T, a.nh, a.nkv, a.hd);
  char *d_x = dev_put_act(x, a.nx);
  void *d_o = dev_alloc_act(a.nq);
  float *d_l = G->alloc(G, sizeof(float) * a.nl);
  G->attn_fwd(G, d_x, d_x + a.ko * eb, d_x + a.vo * eb, a.ld, d_o, d_l, a.B, a.T, a.nh, a.nkv, a.hd);
  snprintf(what, sizeof what, "attn_fwd o%s", a.what);
  compare_act(what, d_o, o, a.nq, tol_act(c));
  snprintf(what, sizeof what, "attn_fwd lse%s", a.what);
  compare_dev(what, d_l, lse, a.nl, tol_f32(c));
  free(x), free(o), free(lse);
  dev_free(d_x), dev_free(d_o), dev_free(d_l);
}

static void run_attn_bwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[160];
  const attn_dims a = attn_dims_of(s);
  const int64_t eb = (int64_t)k_dtype_bytes(G->act);
  float *x = rand_act(a.nx, 1.0), *dout = rand_act(a.nq, 1.0);
  float *o = malloc(sizeof(float) * a.nq), *lse = malloc(sizeof(float) * a.nl), *dx = calloc((size_t)a.nx, sizeof(float));
  k_cpu_attn_fwd(x, x + a.ko, x + a.vo, a.ld, o, lse, a.B, a.T, a.nh, a.nkv, a.hd);
  round_act(o, a.nq);
  k_cpu_attn_bwd(dout, x, x + a.ko, x + a.vo, a.ld, o, lse, dx, dx + a.ko, dx + a.vo, a.B, a.T, a.nh, a.nkv, a.hd);
  char *d_x = dev_put_act(x, a.nx);
  void *d_do = dev_put_act(dout, a.nq), *d_o = dev_put_act(o, a.nq);
  float *d_l = dev_putf(lse, a.nl);
  char *g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = dev_alloc_act(a.nx);
    G->attn_bwd(G, d_do, d_x, d_x + a.ko * eb, d_x + a.vo * eb, a.ld, d_o, d_l, g[r], g[r] + a.ko * eb,
                g[r] + a.vo * eb, a.B, a.T, a.nh, a.nkv, a.hd);
  }
  snprintf(what, sizeof what, "attn_bwd dq|dk|dv%s", a.what);
  compare_act(what, g[0], dx, a.nx, tol_act(c));
  EXPECT(dev_equal_act(g[0], g[1], a.nx), "[%s] attn_bwd%s not bitwise repeatable", LABEL, a.what);
  for (int r = 0; r < 2; r++) dev_free(g[r]);
  free(x), free(dout), free(o), free(lse), free(dx);
  dev_free(d_x), dev_free(d_do), dev_free(d_o), dev_free(d_l);
}

static const op_shape attn_shapes[] = {
    SH(1, 1, 2, 2, 16, 0),  SH(2, 3, 4, 1, 64, 8),    SH(1, 65, 6, 2, 128, 0), SH(2, 130, 4, 4, 64, 0),
    SH(1, 130, 8, 2, 16, 4), SH(1, 33, 2, 1, 128, 0), SH(1, 200, 2, 1, 256, 0), SH(1, 70, 3, 3, 96, 0),
    SH(1, 40, 2, 1, 20, 4),  SH(2, 65, 4, 2, 64, 0),  SH(3, 37, 4, 2, 32, 12)};

// ---------------------------------------------------------------------------------------------
// Decoding attention: one query row against n_keys rows of a KV cache whose rows have pad
// columns past the kv heads. Shapes {n_keys, nh, nkv, hd, pad}; 1030 and 2100 keys cross the
// CUDA kernel's chunks of 1024. On the CPU backend the reference itself is checked against row
// n_keys - 1 of the causal attn_fwd over the same keys (other summation order: 1e-5).

static void run_attn_decode(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[160];
  const int T = (int)s->i[0], nh = (int)s->i[1], nkv = (int)s->i[2], hd = (int)s->i[3];
  const int64_t ld = (int64_t)nkv * hd + s->i[4], nq = (int64_t)nh * hd, nc = (int64_t)T * ld;
  snprintf(what, sizeof what, "attn_decode o n_keys=%d nh=%d nkv=%d hd=%d ld=%lld", T, nh, nkv, hd, (long long)ld);
  float *q = rand_act(nq, 1.0), *k = rand_act(nc, 1.0), *v = rand_act(nc, 1.0), *o = malloc(sizeof(float) * nq);
  k_cpu_attn_decode(q, k, v, ld, o, T, nh, nkv, hd);
  if (EXACT) {  // the last row of the causal forward over a fused (T, q|k|v) buffer
    const int64_t lf = nq + 2 * (int64_t)nkv * hd, kvd = (int64_t)nkv * hd;
    float *x = calloc((size_t)(T * lf), sizeof(float)), *of = malloc(sizeof(float) * (size_t)(T * nq));
    float *lse = malloc(sizeof(float) * (size_t)(T * nh));
    memcpy(x + (int64_t)(T - 1) * lf, q, sizeof(float) * nq);
    for (int t = 0; t < T; t++) {
      memcpy(x + t * lf + nq, k + t * ld, sizeof(float) * kvd);
      memcpy(x + t * lf + nq + kvd, v + t * ld, sizeof(float) * kvd);
    }
    k_cpu_attn_fwd(x, x + nq, x + nq + kvd, lf, of, lse, 1, T, nh, nkv, hd);
    compare("attn_decode reference vs the last row of attn_fwd", o, of + (int64_t)(T - 1) * nq, nq, (tol){1e-5, 1e-5});
    free(x), free(of), free(lse);
  }
  void *d_q = dev_put_act(q, nq), *d_k = dev_put_act(k, nc), *d_v = dev_put_act(v, nc);
  void *d_o[2] = {dev_alloc_act(nq), dev_alloc_act(nq)};
  for (int r = 0; r < 2; r++) G->attn_decode(G, d_q, d_k, d_v, ld, d_o[r], T, nh, nkv, hd);
  compare_act(what, d_o[0], o, nq, tol_act(c));
  EXPECT(dev_equal_act(d_o[0], d_o[1], nq), "[%s] %s: not bitwise repeatable", LABEL, what);
  free(q), free(k), free(v), free(o);
  dev_free(d_q), dev_free(d_k), dev_free(d_v), dev_free(d_o[0]), dev_free(d_o[1]);
}

static const op_shape attn_decode_shapes[] = {SH(1, 2, 2, 16, 0),   SH(7, 4, 1, 64, 8),   SH(33, 6, 2, 128, 0),
                                              SH(5, 3, 3, 20, 4),   SH(300, 8, 2, 96, 0), SH(1030, 4, 2, 64, 0),
                                              SH(2100, 2, 1, 256, 4)};

// ---------------------------------------------------------------------------------------------
// SwiGLU: gu (rows, 2n) is gate columns then up columns, as the fused projection writes them.
// Shapes {rows, n, inject}.

static void run_swiglu_fwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  const int64_t rows = s->i[0], m = rows * s->i[1];
  const int n = (int)s->i[1], inject = (int)s->i[2];
  float *gu = rand_act(2 * m, 3.0), *out = malloc(sizeof(float) * m);
  if (inject && n >= 8) gu[1] = NAN, gu[n + 3] = NAN, gu[5] = INFINITY, gu[6] = -INFINITY;
  void *d_gu = dev_put_act(gu, 2 * m), *d_out = dev_alloc_act(m);
  k_cpu_swiglu_fwd(gu, out, rows, n);
  G->swiglu_fwd(G, d_gu, d_out, rows, n);
  snprintf(what, sizeof what, "swiglu_fwd rows=%lld n=%d%s", (long long)rows, n, inject ? " +nan" : "");
  compare_act(what, d_out, out, m, tol_act(c));
  free(gu), free(out);
  dev_free(d_gu), dev_free(d_out);
}

static void run_swiglu_bwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  const int64_t rows = s->i[0], m = rows * s->i[1];
  const int n = (int)s->i[1], inject = (int)s->i[2];
  float *gu = rand_act(2 * m, 3.0), *dout = rand_act(m, 1.0), *dgu = malloc(sizeof(float) * 2 * m);
  if (inject && n >= 8) gu[1] = NAN, gu[n + 3] = NAN, gu[5] = INFINITY, gu[6] = -INFINITY, dout[7] = NAN;
  void *d_gu = dev_put_act(gu, 2 * m), *d_d = dev_put_act(dout, m), *d_dgu = dev_alloc_act(2 * m);
  k_cpu_swiglu_bwd(dout, gu, dgu, rows, n);
  G->swiglu_bwd(G, d_d, d_gu, d_dgu, rows, n);
  snprintf(what, sizeof what, "swiglu_bwd dgate|dup rows=%lld n=%d%s", (long long)rows, n, inject ? " +nan" : "");
  compare_act(what, d_dgu, dgu, 2 * m, tol_act(c));
  free(gu), free(dout), free(dgu);
  dev_free(d_gu), dev_free(d_d), dev_free(d_dgu);
}

static const op_shape swiglu_shapes[] = {
    SH(1, 1, 0), SH(3, 1000, 0), SH(1000, 1003, 0), SH(7, 13, 0), SH(4, 1000, 1),
    SH(70001, 3, 0),   // more rows than the grid's y dimension
    SH(2, 300001, 0),  // more columns than the grid's x dimension covers
    // The vector path (n a multiple of 8: whole 16-byte vectors) and its edges; n = 2052 is
    // vectorised for fp32 but not bf16, 8k+3 for neither.
    SH(64, 2048, 1), SH(64, 2052, 0), SH(9, 8 * 100 + 3, 1),
    SH(70001, 8, 0),       // vector rows past the grid's y dimension
    SH(2, 8 * 262145, 0)};  // vector columns past what the grid's x dimension covers

// ---------------------------------------------------------------------------------------------
// Embedding: tokens around the local slice (some below v0, some past it, many repeated).
// Shapes {n, d, v0, n_vocab_local}.

static int32_t *embed_tokens(int64_t n, int v0, int nvl) {
  int32_t *tok = malloc(sizeof(int32_t) * n);
  const int lo = v0 > 20 ? v0 - 20 : 0, span = v0 + nvl + 20 - lo;
  for (int64_t i = 0; i < n; i++) tok[i] = lo + (int32_t)((rng_uniform() * 0.5 + 0.5) * span) % span;
  return tok;
}

// A copy of the table rows: exact.
static void run_embed_fwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  const int64_t n = s->i[0];
  const int d = (int)s->i[1], v0 = (int)s->i[2], nvl = (int)s->i[3];
  const int64_t nt = (int64_t)nvl * d, no = n * d;
  int32_t *tok = embed_tokens(n, v0, nvl);
  float *table = rand_act(nt, 1.0), *out = malloc(sizeof(float) * no);  // table: the compute copy
  if (nvl > 2 && d > 1) table[2 * d + 1] = NAN;  // every token of row 2 carries it to out
  int32_t *d_tok = dev_puti(tok, n);
  void *d_table = dev_put_act(table, nt);
  float *d_out = G->alloc(G, sizeof(float) * no);
  k_cpu_embed_fwd(tok, table, out, n, d, v0, nvl);
  G->embed_fwd(G, d_tok, d_table, d_out, n, d, v0, nvl);
  snprintf(what, sizeof what, "embed_fwd n=%lld d=%d v0=%d nvl=%d", (long long)n, d, v0, nvl);
  compare_dev(what, d_out, out, no, tol_f32(c));
  free(tok), free(table), free(out);
  dev_free(d_tok), dev_free(d_table), dev_free(d_out);
}

// Sums in token order like the reference: the same bits, and the same again on a second run.
static void run_embed_bwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  const int64_t n = s->i[0];
  const int d = (int)s->i[1], v0 = (int)s->i[2], nvl = (int)s->i[3];
  const int64_t nt = (int64_t)nvl * d, no = n * d;
  int32_t *tok = embed_tokens(n, v0, nvl);
  float *dout = rand_buf(no, 1.0), *dtab = rand_buf(nt, 1.0);
  int32_t *d_tok = dev_puti(tok, n);
  float *d_dout = dev_putf(dout, no), *d_dtab = dev_putf(dtab, nt), *d_dtab2 = dev_putf(dtab, nt);
  k_cpu_embed_bwd(tok, dout, dtab, n, d, v0, nvl);
  G->embed_bwd(G, d_tok, d_dout, d_dtab, n, d, v0, nvl);
  G->embed_bwd(G, d_tok, d_dout, d_dtab2, n, d, v0, nvl);
  snprintf(what, sizeof what, "embed_bwd n=%lld d=%d v0=%d nvl=%d", (long long)n, d, v0, nvl);
  compare_dev(what, d_dtab, dtab, nt, tol_f32(c));
  float *h = dev_getf(d_dtab, nt);
  EXPECT(memcmp(h, dtab, sizeof(float) * nt) == 0, "[%s] %s: not bitwise equal to the CPU reference", LABEL, what);
  EXPECT(dev_equal(d_dtab, d_dtab2, nt), "[%s] %s: not bitwise repeatable", LABEL, what);
  free(h), free(tok), free(dout), free(dtab);
  dev_free(d_tok), dev_free(d_dout), dev_free(d_dtab), dev_free(d_dtab2);
}

static const op_shape embed_shapes[] = {SH(1, 7, 0, 5), SH(1000, 64, 10, 50), SH(5000, 33, 0, 3),
                                        SH(16384, 257, 100, 1000), SH(4096, 1024, 50000, 64)};

// ---------------------------------------------------------------------------------------------
// Cross-entropy: ce_local_stats, ce_rescale, ce_loss and ce_bwd over one shape list {rows,
// n_vocab_local, v0, inject}: random logits (NaN injected: at 3, and inside a row's vector body),
// targets around the local slice; each op gets the reference's results of the ops before it
// (stats, a made-up global max at or above each row's, lse), so only the op itself is compared.

typedef struct ce_in {
  int64_t rows, n;
  int nvl, v0, inject;
  float *logits;                // (rows, nvl) in the act dtype's values
  int32_t *tgt;                 // (rows)
  float *mx, *se, *tl;          // the reference's ce_local_stats (rows)
  float *gm;                    // a made-up global max per row: mx + r % 3
  char what[64];                // " rows=.. nvl=..[ +nan]"
} ce_in;

static ce_in ce_make(const op_shape *s) {
  ce_in e = {.rows = s->i[0], .nvl = (int)s->i[1], .v0 = (int)s->i[2], .inject = (int)s->i[3]};
  const int64_t rows = e.rows;
  e.n = rows * e.nvl;
  e.logits = rand_act(e.n, 5.0);
  if (e.inject && e.n > 3) e.logits[3] = NAN;
  if (e.inject && e.n > 100) e.logits[e.n / 2 + 1] = NAN;
  e.tgt = calloc((size_t)rows, sizeof(int32_t));
  const int lo = e.v0 > 10 ? e.v0 - 10 : 0, span = e.v0 + e.nvl + 10 - lo;
  for (int64_t r = 0; r < rows; r++) e.tgt[r] = lo + (int32_t)((rng_uniform() * 0.5 + 0.5) * span) % span;
  e.mx = malloc(sizeof(float) * rows), e.se = malloc(sizeof(float) * rows), e.tl = malloc(sizeof(float) * rows);
  e.gm = malloc(sizeof(float) * rows);
  k_cpu_ce_local_stats(e.logits, e.tgt, rows, e.nvl, e.v0, e.mx, e.se, e.tl);
  for (int64_t r = 0; r < rows; r++) e.gm[r] = e.mx[r] + (float)(r % 3);
  snprintf(e.what, sizeof e.what, " rows=%lld nvl=%d%s", (long long)rows, e.nvl, e.inject ? " +nan" : "");
  return e;
}
static void ce_free(ce_in *e) { free(e->logits), free(e->tgt), free(e->mx), free(e->se), free(e->tl), free(e->gm); }

// The max and the target logit are exact; the sum of exponentials within the row's f32 bound
// (the reference sums a vectorised exp approximation in fp32 lanes: ~1e-6 off over 50k terms).
static void run_ce_local_stats(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  ce_in e = ce_make(s);
  const int64_t rows = e.rows;
  void *d_lg = dev_put_act(e.logits, e.n);
  int32_t *d_tgt = dev_puti(e.tgt, rows);
  float *d_mx = G->alloc(G, sizeof(float) * rows), *d_se = G->alloc(G, sizeof(float) * rows);
  float *d_tl = G->alloc(G, sizeof(float) * rows);
  G->ce_local_stats(G, d_lg, d_tgt, rows, e.nvl, e.v0, d_mx, d_se, d_tl);
  snprintf(what, sizeof what, "ce_local_stats max%s", e.what);
  compare_dev(what, d_mx, e.mx, rows, TOL0);
  snprintf(what, sizeof what, "ce_local_stats sumexp%s", e.what);
  compare_dev(what, d_se, e.se, rows, tol_f32(c));
  snprintf(what, sizeof what, "ce_local_stats target%s", e.what);
  compare_dev(what, d_tl, e.tl, rows, TOL0);
  ce_free(&e);
  dev_free(d_lg), dev_free(d_tgt), dev_free(d_mx), dev_free(d_se), dev_free(d_tl);
}

static void run_ce_rescale(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  ce_in e = ce_make(s);
  const int64_t rows = e.rows;
  float *d_se = dev_putf(e.se, rows), *d_mx = dev_putf(e.mx, rows), *d_gm = dev_putf(e.gm, rows);
  k_cpu_ce_rescale(e.se, e.mx, e.gm, rows);
  G->ce_rescale(G, d_se, d_mx, d_gm, rows);
  snprintf(what, sizeof what, "ce_rescale%s", e.what);
  compare_dev(what, d_se, e.se, rows, tol_f32(c));
  ce_free(&e);
  dev_free(d_se), dev_free(d_mx), dev_free(d_gm);
}

// lse within the f32 bound; the loss within f32.elem of the sum of |lse| + |target logit|
// (summation order and the device's logf differ from the host's by ulps per row).
static void run_ce_loss(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  ce_in e = ce_make(s);
  const int64_t rows = e.rows;
  k_cpu_ce_rescale(e.se, e.mx, e.gm, rows);
  float *lse = malloc(sizeof(float) * rows);
  double loss = 0, loss_ref = 0;
  float *d_gm = dev_putf(e.gm, rows), *d_se = dev_putf(e.se, rows), *d_tl = dev_putf(e.tl, rows);
  float *d_lse = G->alloc(G, sizeof(float) * rows);
  double *d_loss = G->alloc(G, sizeof(double));
  k_cpu_ce_loss(e.gm, e.se, e.tl, lse, rows, &loss_ref);
  G->ce_loss(G, d_gm, d_se, d_tl, d_lse, rows, d_loss);
  G->to_host(G, &loss, d_loss, sizeof loss);
  snprintf(what, sizeof what, "ce_loss lse%s", e.what);
  compare_dev(what, d_lse, lse, rows, tol_f32(c));
  double mag = 0;
  for (int64_t r = 0; r < rows; r++) mag += fabs((double)lse[r]) + fabs((double)e.tl[r]);
  EXPECT(isnan(loss) == isnan(loss_ref) && (isnan(loss) || fabs(loss - loss_ref) <= tol_f32(c).elem * (1 + mag)),
         "[%s] ce_loss%s: %.17g vs reference %.17g", LABEL, e.what, loss, loss_ref);
  free(lse);
  ce_free(&e);
  dev_free(d_gm), dev_free(d_se), dev_free(d_tl), dev_free(d_lse), dev_free(d_loss);
}

static void run_ce_bwd(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  char what[96];
  ce_in e = ce_make(s);
  const int64_t rows = e.rows;
  float *lse = malloc(sizeof(float) * rows);
  for (int64_t r = 0; r < rows; r++) lse[r] = e.mx[r] + logf(e.se[r]);
  void *d_lg = dev_put_act(e.logits, e.n);
  int32_t *d_tgt = dev_puti(e.tgt, rows);
  float *d_lse = dev_putf(lse, rows);
  k_cpu_ce_bwd(e.logits, e.tgt, lse, rows, e.nvl, e.v0, 0.125f);
  G->ce_bwd(G, d_lg, d_tgt, d_lse, rows, e.nvl, e.v0, 0.125f);
  snprintf(what, sizeof what, "ce_bwd%s", e.what);
  compare_act(what, d_lg, e.logits, e.n, tol_act(c));
  free(lse);
  ce_free(&e);
  dev_free(d_lg), dev_free(d_tgt), dev_free(d_lse);
}

static const op_shape ce_shapes[] = {
    SH(1, 1, 0, 0), SH(7, 33, 5, 0), SH(65, 1000, 0, 0), SH(16, 50257, 1000, 0), SH(7, 33, 0, 1),
    SH(3000, 17, 0, 0),  // ce_loss over more rows than its block has threads
    // The vector paths: rows of whole 16-byte vectors (32000), rows that start off a 16-byte
    // boundary with a scalar head and tail (8k+3, 8k+5), rows longer than the registers hold.
    SH(40, 32000, 0, 0), SH(37, 8 * 1000 + 3, 11, 0), SH(5, 8 * 4003 + 5, 0, 1), SH(3, 70001, 100, 0),
    SH(11, 4099, 0, 1)};

// ---------------------------------------------------------------------------------------------
// add (the residual add of the tensor-parallel path): exact. Shapes {n, y offset, x offset}: the
// offsets (elements) move the operands off 16-byte alignment, where the four-wide kernel is not
// used, and off each other.

// y (fp32) += x, x fp32 then bf16 (the tp reductions' bf16 partial sums), bit for bit.
static void run_add(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  const int64_t n = s->i[0], oy = s->i[1], ox = s->i[2];
  char what[96];
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    const k_dtype xt = bf16 ? K_BF16 : K_F32;
    float *x = rand_buf(n + ox, 3.0), *y = rand_buf(n + oy, 1.0);
    if (n >= 10) x[ox + n / 3] = NAN, y[oy + n / 2] = INFINITY;
    uint16_t *xh = malloc(sizeof *xh * (size_t)(n + ox));
    for (int64_t i = 0; i < n + ox; i++) xh[i] = k_f32_to_bf16(x[i]);
    const size_t esz = k_dtype_bytes(xt);
    void *d_x = dev_put(bf16 ? (const void *)xh : (const void *)x, (size_t)(n + ox) * esz);
    float *d_y = dev_putf(y, n + oy);
    k_cpu_add(y + oy, bf16 ? (const void *)(xh + ox) : (const void *)(x + ox), xt, n);
    G->add(G, d_y + oy, (const char *)d_x + ox * esz, xt, n);
    snprintf(what, sizeof what, "add %s n=%lld (offsets %lld, %lld)", bf16 ? "bf16" : "fp32", (long long)n,
             (long long)oy, (long long)ox);
    compare_dev(what, d_y, y, n + oy, tol_f32(c));
    free(x), free(y), free(xh);
    dev_free(d_x), dev_free(d_y);
  }
}

static const op_shape add_shapes[] = {SH(1, 0, 0),       SH(7, 0, 0),    SH(1000, 0, 0), SH(1000003, 0, 0),
                                      SH(5000000, 0, 0), SH(4099, 1, 1), SH(4099, 0, 2)};

// ---------------------------------------------------------------------------------------------
// Multi-tensor optimizer ops over ranges of very different sizes with gaps between them (the
// CPU reference against the per-tensor kernels is tests/unit/test_optim_ranges.c).

static const k_range OPT_R[] = {{0, 1000, 1, 0},          {1500, 30000, 0, 1500},       {31500, 1, 1, 31500},
                                {40000, 2500000, 1, 40000}, {2600000, 123457, 0, 2600000}};
enum { OPT_NR = sizeof OPT_R / sizeof *OPT_R, OPT_N = 2800000 };
static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f, BC1 = 0.19f, BC2 = 0.0975f, GS = 0.37f;

// sumsq_ranges: within f32.norm of the reference (relative), the same bits when run twice.
// Shapes {n_ranges}: the first n_ranges of OPT_R.
static void run_sumsq_ranges(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  const int nr = (int)s->i[0];
  float *g = rand_buf(OPT_N, 1e-2);
  float *d_g = dev_putf(g, OPT_N);
  const double want = k_cpu_sumsq_ranges(g, OPT_R, nr), got = G->sumsq_ranges(G, d_g, OPT_R, nr);
  EXPECT(fabs(got - want) <= tol_f32(c).norm * want, "[%s] sumsq_ranges n_ranges=%d: %.17g, reference %.17g", LABEL,
         nr, got, want);
  const double again = G->sumsq_ranges(G, d_g, OPT_R, nr);
  EXPECT(again == got, "[%s] sumsq_ranges n_ranges=%d not deterministic: %.17g then %.17g", LABEL, nr, got, again);
  free(g);
  dev_free(d_g);
}

static const op_shape sumsq_ranges_shapes[] = {SH(OPT_NR), SH(1), SH(0)};

// adamw_ranges, two steps (the second reuses the uploaded range table), the weights shift
// elements past the gradient and moments (p_offset = offset + shift). Each element of p, m and v
// within f32.elem of itself plus f32.norm of its array's largest (the GPU contracts to FMA where
// the CPU build does not: a few ulp; m cancels to near 0 in places); outside the ranges nothing
// moves; the compute copy is the backend's own p rounded to its dtype (zero outside the ranges).
// Shapes {compute copy: 0 none, 1 fp32, 2 bf16; shift}.
static void run_adamw_ranges(const op_case *c, const op_shape *s, int idx) {
  (void)idx;
  const int pc_kind = (int)s->i[0];
  const int64_t shift = s->i[1], n_p = OPT_N + shift;
  const k_dtype pc_type = pc_kind == 2 ? K_BF16 : K_F32;
  const size_t pc_bytes = pc_kind ? k_dtype_bytes(pc_type) * (size_t)n_p : 0;
  static k_range r[OPT_NR];  // static: the GPU keeps a device copy per list address
  for (int k = 0; k < OPT_NR; k++) r[k] = OPT_R[k], r[k].p_offset += shift;
  float *p = rand_buf(n_p, 1.0), *g = rand_buf(OPT_N, 1e-2), *m = rand_buf(OPT_N, 1e-3), *v = rand_buf(OPT_N, 1e-5);
  for (int64_t i = 0; i < OPT_N; i++) v[i] = fabsf(v[i]);
  float *p0 = copy_buf(p, n_p), *m0 = copy_buf(m, OPT_N), *v0 = copy_buf(v, OPT_N);
  void *pc = pc_kind ? calloc(pc_bytes, 1) : NULL;
  float *d_p = dev_putf(p, n_p), *d_g = dev_putf(g, OPT_N), *d_m = dev_putf(m, OPT_N), *d_v = dev_putf(v, OPT_N);
  void *d_pc = pc_kind ? G->alloc(G, pc_bytes) : NULL;
  for (int rep = 0; rep < 2; rep++) {
    k_cpu_adamw_ranges(p, pc, pc_type, g, m, v, r, OPT_NR, LR, B1, B2, EPS, WD, BC1, BC2, GS);
    G->adamw_ranges(G, d_p, d_pc, pc_type, d_g, d_m, d_v, r, OPT_NR, LR, B1, B2, EPS, WD, BC1, BC2, GS);
  }
  float *hp = dev_getf(d_p, n_p), *hm = dev_getf(d_m, OPT_N), *hv = dev_getf(d_v, OPT_N);
  unsigned char *hpc = malloc(pc_bytes ? pc_bytes : 1);
  if (pc_kind) G->to_host(G, hpc, d_pc, pc_bytes);
  const tol t = tol_f32(c);
  double scale[3] = {0, 0, 0}, worst = 0;
  for (int64_t i = 0; i < n_p; i++) scale[0] = fmax(scale[0], fabs(p[i]));
  for (int64_t i = 0; i < OPT_N; i++) scale[1] = fmax(scale[1], fabs(m[i])), scale[2] = fmax(scale[2], fabs(v[i]));
  int64_t bad = 0, bad_pc = 0, moved = 0;
  for (int64_t i = 0; i < n_p; i++) {
    const double e = fabs(hp[i] - p[i]);
    worst = fmax(worst, e / (fabs(p[i]) + 0.1 * scale[0]));
    bad += !(e <= t.elem * fabs(p[i]) + t.norm * scale[0]);
  }
  for (int64_t i = 0; i < OPT_N; i++) {
    const double em = fabs(hm[i] - m[i]), ev = fabs(hv[i] - v[i]);
    worst = fmax(worst, fmax(em / (fabs(m[i]) + 0.1 * scale[1]), ev / (fabs(v[i]) + 0.1 * scale[2])));
    bad += !(em <= t.elem * fabs(m[i]) + t.norm * scale[1] && ev <= t.elem * fabs(v[i]) + t.norm * scale[2]);
  }
  if (EXACT) bad += n_bits_differ(hp, p, n_p) + n_bits_differ(hm, m, OPT_N) + n_bits_differ(hv, v, OPT_N);
  // Where the ranges lie, in the gradient's and in the weights' indexing.
  unsigned char *in_g = calloc(OPT_N, 1), *in_p = calloc((size_t)n_p, 1);
  for (int k = 0; k < OPT_NR; k++) {
    memset(in_g + r[k].offset, 1, (size_t)r[k].n_elem);
    memset(in_p + r[k].p_offset, 1, (size_t)r[k].n_elem);
  }
  for (int64_t i = 0; i < n_p; i++) {
    if (!in_p[i]) moved += memcmp(&hp[i], &p0[i], 4) != 0;
    if (!pc_kind) continue;
    uint32_t want = 0, got = 0;  // the copy's bits
    if (pc_kind == 2) {
      want = in_p[i] ? bf16_bits(hp[i]) : 0;
      got = ((const uint16_t *)hpc)[i];
    } else {
      if (in_p[i]) memcpy(&want, &hp[i], 4);
      memcpy(&got, hpc + 4 * i, 4);
    }
    bad_pc += got != want;
  }
  for (int64_t i = 0; i < OPT_N; i++)
    if (!in_g[i]) moved += memcmp(&hm[i], &m0[i], 4) != 0 || memcmp(&hv[i], &v0[i], 4) != 0;
  const char *pc_name = pc_kind == 2 ? "bf16" : pc_kind ? "f32" : "none";
  EXPECT(bad == 0, "[%s] adamw_ranges (copy %s, shift %lld): %lld elements off the CPU reference (worst normalised %.3g)",
         LABEL, pc_name, (long long)shift, (long long)bad, worst);
  EXPECT(bad_pc == 0, "[%s] adamw_ranges (copy %s, shift %lld): %lld elements of the compute copy wrong", LABEL, pc_name,
         (long long)shift, (long long)bad_pc);
  EXPECT(moved == 0, "[%s] adamw_ranges (copy %s, shift %lld): %lld elements outside the ranges changed", LABEL,
         pc_name, (long long)shift, (long long)moved);
  free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0), free(pc), free(hp), free(hm), free(hv), free(hpc);
  free(in_g), free(in_p);
  dev_free(d_p), dev_free(d_g), dev_free(d_m), dev_free(d_v);
  if (d_pc) dev_free(d_pc);
}

static const op_shape adamw_ranges_shapes[] = {SH(2, 0), SH(1, 77), SH(0, 0)};

// ---------------------------------------------------------------------------------------------
// FP8: fp8_cast, gemm_fp8, fp8_scales, swiglu_fwd_fp8, rmsnorm_fwd_fp8, swiglu_bwd_fp8,
// fp8_cast_spans, fp8_transpose, and block scaling's fp8_cast_block, gemm_fp8_block (their rows'
// functions and shapes).

#include "tests/unit/fp8_cases.h"
#include "tests/unit/quant_cases.h"
#include "tests/unit/fp8_block_cases.h"

// ---------------------------------------------------------------------------------------------
// The table: one row per op of k_backend. compare's reading of {norm, elem} holds unless the
// row's function says otherwise (gemm, linear_residual, gemm_fp8: elem is the accumulation bound;
// sumsq_ranges, adamw_ranges, ce_loss, gemm_fp8: see there); a {0, 0} column is exact or unused.

static const op_case CASES[] = {
    // op                run                   shapes                          acts     act32 {norm, elem}  act16         f32
    {"gemm",             run_gemm,             SHAPES(gemm_shapes),            ACT_ALL, {1e-5, 1e-5}, {1e-3, 1e-4}, {0, 0}},
    {"linear_residual",  run_linear_residual,  SHAPES(linear_residual_shapes), ACT_ALL, {1e-5, 1e-5}, {1e-3, 1e-4}, {0, 0}},
    {"cast",             run_cast,             SHAPES(cast_shapes),            ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"rmsnorm_bwd",      run_rmsnorm_bwd,      SHAPES(rmsnorm_shapes),         ACT_ALL, {0, 0},       {0, 0},       {1e-5, 1e-5}},
    {"rmsnorm_fwd_act",  run_rmsnorm_fwd_act,  SHAPES(rmsnorm_shapes),         ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {1e-5, 1e-5}},
    {"rmsnorm_bwd_act",  run_rmsnorm_bwd_act,  SHAPES(rmsnorm_shapes),         ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {1e-5, 1e-5}},
    {"rope",             run_rope,             SHAPES(rope_shapes),            ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"attn_fwd",         run_attn_fwd,         SHAPES(attn_shapes),            ACT_ALL, {1e-4, 1e-3}, {1e-2, 1e-2}, {1e-5, 1e-5}},
    {"attn_bwd",         run_attn_bwd,         SHAPES(attn_shapes),            ACT_ALL, {1e-4, 1e-3}, {1e-2, 1e-2}, {0, 0}},
    {"attn_decode",      run_attn_decode,      SHAPES(attn_decode_shapes),     ACT_ALL, {1e-5, 1e-4}, {1e-2, 1e-2}, {0, 0}},
    {"swiglu_fwd",       run_swiglu_fwd,       SHAPES(swiglu_shapes),          ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"swiglu_bwd",       run_swiglu_bwd,       SHAPES(swiglu_shapes),          ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"embed_fwd",        run_embed_fwd,        SHAPES(embed_shapes),           ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"embed_bwd",        run_embed_bwd,        SHAPES(embed_shapes),           ACT_ALL, {0, 0},       {0, 0},       {1e-6, 1e-6}},
    {"ce_local_stats",   run_ce_local_stats,   SHAPES(ce_shapes),              ACT_ALL, {0, 0},       {0, 0},       {5e-6, 5e-6}},
    {"ce_bwd",           run_ce_bwd,           SHAPES(ce_shapes),              ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"ce_rescale",       run_ce_rescale,       SHAPES(ce_shapes),              ACT_ALL, {0, 0},       {0, 0},       {1e-6, 1e-6}},
    {"ce_loss",          run_ce_loss,          SHAPES(ce_shapes),              ACT_ALL, {0, 0},       {0, 0},       {1e-6, 1e-6}},
    {"add",              run_add,              SHAPES(add_shapes),             ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"sumsq_ranges",     run_sumsq_ranges,     SHAPES(sumsq_ranges_shapes),    ACT_ALL, {0, 0},       {0, 0},       {1e-12, 0}},
    {"adamw_ranges",     run_adamw_ranges,     SHAPES(adamw_ranges_shapes),    ACT_ALL, {0, 0},       {0, 0},       {1e-6, 1e-5}},
    {"fp8_cast",         run_fp8_cast,         SHAPES(fp8_cast_shapes),        ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    // act32: without fast accumulation, act16: with it (see run_gemm_fp8)
    {"gemm_fp8",         run_gemm_fp8,         SHAPES(gemm_fp8_shapes),        ACT_ALL, {5e-3, 0x1p-8}, {5e-2, 0x1p-5}, {0, 0}},
    {"fp8_scales",       run_fp8_scales,       SHAPES(fp8_scales_shapes),      ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    // gradient compression: bit for bit (tests/unit/quant_cases.h); fp32 data whatever the act dtype
    {"grad_amax",        run_grad_amax,        SHAPES(grad_amax_shapes),       ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"quant16",          run_quant16,          SHAPES(quant16_shapes),         ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"dequant16",        run_dequant16,        SHAPES(dequant16_shapes),       ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"quant_i8",         run_quant_i8,         SHAPES(quant_i8_shapes),        ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"dequant_i8",       run_dequant_i8,       SHAPES(dequant_i8_shapes),      ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"swiglu_fwd_fp8",   run_swiglu_fwd_fp8,   SHAPES(swiglu_fwd_fp8_shapes),  ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"rmsnorm_fwd_fp8",  run_rmsnorm_fwd_fp8,  SHAPES(rmsnorm_fwd_fp8_shapes), ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"swiglu_bwd_fp8",   run_swiglu_bwd_fp8,   SHAPES(swiglu_bwd_fp8_shapes),  ACT_ALL, {1e-5, 1e-5}, {1e-2, 1e-2}, {0, 0}},
    {"fp8_cast_block",   run_fp8_cast_block,   SHAPES(fp8_cast_block_shapes),  ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    // act32 holds the bounds for every act dtype (no fast accumulation; see run_gemm_fp8_block)
    {"gemm_fp8_block",   run_gemm_fp8_block,   SHAPES(gemm_fp8_block_shapes),  ACT_ALL, {5e-3, 0x1p-8}, {0, 0},     {0, 0}},
    {"fp8_cast_spans",   run_fp8_cast_spans,   SHAPES(fp8_cast_spans_shapes),  ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
    {"fp8_transpose",    run_fp8_transpose,    SHAPES(fp8_transpose_shapes),   ACT_ALL, {0, 0},       {0, 0},       {0, 0}},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

// ---------------------------------------------------------------------------------------------
// Coverage. OPS names every op slot of struct k_backend (gemm to the end); check_tables fails
// when a pointer-sized slot in that span has no entry, so a new op added to the struct without
// an entry here (and a row in CASES) fails the test.

#define OP_SLOT(name) {#name, offsetof(k_backend, name)}
static const struct op_slot {
  const char *name;
  size_t offset;
} OPS[] = {OP_SLOT(gemm),          OP_SLOT(linear_residual), OP_SLOT(cast),           OP_SLOT(rmsnorm_bwd),
           OP_SLOT(rmsnorm_fwd_act), OP_SLOT(rmsnorm_bwd_act), OP_SLOT(rope),           OP_SLOT(attn_fwd),
           OP_SLOT(attn_bwd),        OP_SLOT(attn_decode),     OP_SLOT(swiglu_fwd),      OP_SLOT(swiglu_bwd),     OP_SLOT(embed_fwd),
           OP_SLOT(embed_bwd),       OP_SLOT(ce_local_stats),  OP_SLOT(ce_bwd),         OP_SLOT(ce_rescale),
           OP_SLOT(ce_loss),         OP_SLOT(add),             OP_SLOT(sumsq_ranges),   OP_SLOT(adamw_ranges),
           OP_SLOT(fp8_cast),        OP_SLOT(gemm_fp8),        OP_SLOT(fp8_scales),     OP_SLOT(grad_amax),
           OP_SLOT(quant16),         OP_SLOT(dequant16),       OP_SLOT(quant_i8),       OP_SLOT(dequant_i8),
           OP_SLOT(swiglu_fwd_fp8),  OP_SLOT(rmsnorm_fwd_fp8), OP_SLOT(swiglu_bwd_fp8),  OP_SLOT(fp8_cast_block),
           OP_SLOT(gemm_fp8_block),  OP_SLOT(fp8_cast_spans),  OP_SLOT(fp8_transpose)};
enum { N_OPS = sizeof OPS / sizeof OPS[0] };

static int op_index(const char *name) {
  for (int k = 0; k < N_OPS; k++)
    if (strcmp(OPS[k].name, name) == 0) return k;
  return -1;
}

static const op_case *case_of(const char *op) {
  for (int i = 0; i < N_CASES; i++)
    if (strcmp(CASES[i].op, op) == 0) return &CASES[i];
  return NULL;
}

// The slots from gemm to the end of the struct against OPS, and CASES against OPS: each slot
// named once, each row naming an op of OPS, no op with two rows.
static void check_tables(void) {
  const size_t first = offsetof(k_backend, gemm), slot = sizeof(void (*)(void));
  int n_bad = 0;
  for (size_t off = first; off < sizeof(k_backend); off += slot) {
    int n = 0;
    const char *before = "gemm";
    size_t before_off = 0;
    for (int k = 0; k < N_OPS; k++) {
      n += OPS[k].offset == off;
      if (OPS[k].offset < off && OPS[k].offset >= before_off) before = OPS[k].name, before_off = OPS[k].offset;
    }
    if (n != 1) {
      n_bad++;
      fprintf(stderr, "the op slot at byte %zu of struct k_backend (after %s) is named %d times in OPS, not once: "
              "add the new op to OPS and a row for it to CASES\n", off, before, n);
    }
  }
  for (int k = 0; k < N_OPS; k++)
    if (OPS[k].offset < first || OPS[k].offset >= sizeof(k_backend) || (OPS[k].offset - first) % slot) {
      n_bad++;
      fprintf(stderr, "OPS entry %s is not an op slot of struct k_backend\n", OPS[k].name);
    }
  EXPECT(n_bad == 0, "OPS covers the %zu op slots of struct k_backend once each (%d problems above)",
         (sizeof(k_backend) - first) / slot, n_bad);
  int n_rows_bad = 0;
  for (int i = 0; i < N_CASES; i++) {
    if (op_index(CASES[i].op) < 0) n_rows_bad++, fprintf(stderr, "CASES row %s names no op of OPS\n", CASES[i].op);
    if (case_of(CASES[i].op) != &CASES[i]) n_rows_bad++, fprintf(stderr, "CASES has two rows for %s\n", CASES[i].op);
    if (CASES[i].n_shapes <= 0 || !CASES[i].acts) n_rows_bad++, fprintf(stderr, "CASES row %s runs nothing\n", CASES[i].op);
  }
  EXPECT(n_rows_bad == 0, "each CASES row names one op of OPS, once (%d problems above)", n_rows_bad);
}

// ---------------------------------------------------------------------------------------------
// Timings (--bench; printed, never asserted; GPU backends only)

// Attention forward and backward at one shape (random q, k, v, dout), reps timed runs each.
static void bench_attn(int B, int T, int nh, int nkv, int hd, int reps) {
  const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, nx = (int64_t)B * T * ld, nq = (int64_t)B * T * nh * hd;
  const int64_t eb = (int64_t)k_dtype_bytes(G->act);
  float *h = rand_act(nx, 1.0);
  char *x = dev_put_act(h, nx), *dx = dev_alloc_act(nx);  // fused q|k|v rows and their gradient
  void *q = x, *k = x + nh * hd * eb, *v = x + (nh + nkv) * hd * eb;
  void *dq = dx, *dk = dx + nh * hd * eb, *dv = dx + (nh + nkv) * hd * eb;
  void *dout = dev_put_act(h, nq), *o = dev_alloc_act(nq);
  float *lse = G->alloc(G, sizeof(float) * (size_t)B * nh * T);
  free(h);
  G->attn_fwd(G, q, k, v, ld, o, lse, B, T, nh, nkv, hd);
  G->sync(G);
  double t0 = now_s();
  for (int r = 0; r < reps; r++) G->attn_fwd(G, q, k, v, ld, o, lse, B, T, nh, nkv, hd);
  G->sync(G);
  const double t_fwd = (now_s() - t0) / reps;
  G->attn_bwd(G, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
  G->sync(G);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->attn_bwd(G, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
  G->sync(G);
  const double t_bwd = (now_s() - t0) / reps;
  const double fl = 2.0 * B * nh * (double)T * T * hd;  // causal: half of the 4 B nh T^2 hd of QK^T and PV
  printf("bench [%s] attention B=%d T=%d nh=%d nkv=%d hd=%d: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms (%.1f "
         "TFLOP/s)\n", LABEL, B, T, nh, nkv, hd, 1e3 * t_fwd, fl / t_fwd * 1e-12, 1e3 * t_bwd, 2.5 * fl / t_bwd * 1e-12);
  dev_free(x), dev_free(dx), dev_free(dout), dev_free(o), dev_free(lse);
}

// C (M,N) = A (M,K) W (N,K)^T, the shape of a linear layer, C in c_type; with wgrad the
// weight gradient instead: C (M,N) += A (K,M)^T W (K,N), beta 1 (A, W reused as buffers).
static void bench_gemm(int M, int N, int K, k_dtype c_type, int wgrad, int reps) {
  const int64_t na = (int64_t)M * K > (int64_t)N * K ? (int64_t)M * K : (int64_t)N * K;
  float *h = rand_act(na, 1.0);
  void *A = dev_put_act(h, na), *W = dev_put_act(h, na);
  void *C = G->alloc(G, k_dtype_bytes(c_type) * (size_t)M * N);
  free(h);
  const int ta = wgrad ? 1 : 0, tb = wgrad ? 0 : 1, lda = wgrad ? M : K, ldb = wgrad ? N : K;
  const float beta = wgrad ? 1.0f : 0.0f;
  G->gemm(G, ta, tb, M, N, K, 1, A, lda, W, ldb, beta, C, N, c_type);
  G->sync(G);
  const double t0 = now_s();
  for (int r = 0; r < reps; r++) G->gemm(G, ta, tb, M, N, K, 1, A, lda, W, ldb, beta, C, N, c_type);
  G->sync(G);
  const double t = (now_s() - t0) / reps;
  printf("bench [%s] gemm %dx%dx%d%s C %s: %.3f ms (%.1f TFLOP/s)\n", LABEL, M, N, K, wgrad ? " (A^T B, beta 1)" : "",
         c_type == K_BF16 ? "bf16" : "f32", 1e3 * t, 2.0 * M * N * K / t * 1e-12);
  dev_free(A), dev_free(W), dev_free(C);
}

// SwiGLU's backward then the FP8 cast of dgu (codes and transposed codes, E5M2), against the
// fused swiglu_bwd_fp8 writing dgu too and not: one MLP's output-gradient cast per layer.
static void swiglu_bwd_fp8_variant(int v, void *dout, void *gu, void *dgu, int64_t rows, int n, float *scale, uint8_t *c,
                                   uint8_t *ct, float *amax) {
  if (v == 0) {
    G->swiglu_bwd(G, dout, gu, dgu, rows, n);
    G->fp8_cast(G, dgu, rows, 2 * n, scale, K_E5M2, c, ct, amax);
  } else {
    G->swiglu_bwd_fp8(G, dout, gu, v == 1 ? dgu : NULL, rows, n, scale, K_E5M2, c, ct, amax);
  }
}

static void bench_swiglu_bwd_fp8(int64_t rows, int n, int reps) {
  const int64_t m = rows * n;
  float *h = rand_act(2 * m, 1.0);
  void *gu = dev_put_act(h, 2 * m), *dout = dev_put_act(h, m), *dgu = dev_alloc_act(2 * m);
  uint8_t *c = G->alloc(G, (size_t)(2 * m)), *ct = G->alloc(G, (size_t)(2 * m));
  const float one = 1.0f;
  float *scale = dev_putf(&one, 1), *amax = G->alloc(G, sizeof(float)), t[3];
  free(h);
  for (int v = 0; v < 3; v++) {
    swiglu_bwd_fp8_variant(v, dout, gu, dgu, rows, n, scale, c, ct, amax);
    G->sync(G);
    const double t0 = now_s();
    for (int r = 0; r < reps; r++) swiglu_bwd_fp8_variant(v, dout, gu, dgu, rows, n, scale, c, ct, amax);
    G->sync(G);
    t[v] = (float)((now_s() - t0) / reps);
  }
  printf("bench [%s] swiglu_bwd then fp8_cast rows=%lld n=%d: %.3f ms; swiglu_bwd_fp8 %.3f ms (dgu written), %.3f ms "
         "(dgu not written)\n", LABEL, (long long)rows, n, 1e3 * t[0], 1e3 * t[1], 1e3 * t[2]);
  dev_free(gu), dev_free(dout), dev_free(dgu), dev_free(c), dev_free(ct), dev_free(scale), dev_free(amax);
}

// The zero-copy optimizer engine (optimizer.offload_update=gpu): AdamW over n parameters whose
// master weights and moments live in host memory the kernel reads and writes over the host link
// (24 bytes a parameter cross it), beside plain pinned copies of the same 24 bytes a parameter on
// the copy stream (12 to the device, then 12 back).
static void bench_adamw_host(int64_t n, int reps) {
  const size_t nb = sizeof(float) * (size_t)n;
  float *p = G->host_alloc(G, nb), *m = G->host_alloc(G, nb), *v = G->host_alloc(G, nb), *stage = G->host_alloc(G, 3 * nb);
  if (!p || !m || !v || !stage) {
    printf("bench [%s] adamw over host memory: pinned allocation of %.1f GiB refused, skipped\n", LABEL, 6.0 * nb / (1 << 30));
    return;
  }
  float *g = G->alloc(G, nb), *d3 = G->alloc(G, 3 * nb);
  void *pc = G->alloc(G, sizeof(uint16_t) * (size_t)n);
  G->zero(G, g, nb);
  const k_range r = {0, n, 1, 0};
  G->adamw_ranges(G, p, pc, K_BF16, g, m, v, &r, 1, LR, B1, B2, EPS, WD, BC1, BC2, GS);
  G->sync(G);
  double t0 = now_s();
  for (int k = 0; k < reps; k++) G->adamw_ranges(G, p, pc, K_BF16, g, m, v, &r, 1, LR, B1, B2, EPS, WD, BC1, BC2, GS);
  G->sync(G);
  const double t_zero = (now_s() - t0) / reps;
  G->copy_wait(G, G->copy_async(G, d3, stage, 3 * nb));
  t0 = now_s();
  for (int k = 0; k < reps; k++) {
    G->copy_async(G, d3, stage, 3 * nb);
    G->copy_wait(G, G->copy_async(G, stage, d3, 3 * nb));
  }
  const double t_copy = (now_s() - t0) / reps;
  printf("bench [%s] adamw over host memory n=%lld: zero-copy %.2f ms (%.1f GB/s over the link); pinned copies of the "
         "same bytes %.2f ms (%.1f GB/s)\n", LABEL, (long long)n, 1e3 * t_zero, 24.0 * n / t_zero * 1e-9, 1e3 * t_copy,
         24.0 * n / t_copy * 1e-9);
  G->host_free(G, p), G->host_free(G, m), G->host_free(G, v), G->host_free(G, stage);
  dev_free(g), dev_free(d3), dev_free(pc);
}

static void bench(void) {
  const int reps = 10;
  rng_seed("bench");
  bench_attn(4, 1024, 16, 4, 64, reps);
  bench_attn(1, 4096, 16, 16, 128, 3);  // one TP-2 rank of the 7B model
  bench_gemm(4096, 1024, 1024, G->act, 0, reps);
  bench_gemm(4096, 4096, 4096, G->act, 0, reps);
  if (G->act != K_F32) bench_gemm(4096, 4096, 4096, K_F32, 0, reps);
  bench_gemm(4096, 4096, 4096, K_F32, 1, reps);
  bench_gemm(4096, 11008, 4096, G->act, 0, reps);  // 7B MLP up projection, 4096 tokens
  bench_swiglu_bwd_fp8(8192, 11008, reps);          // 7b-layers' MLP, 8192 tokens
  if (G->act != K_F32) bench_adamw_host((int64_t)64 << 20, 5);  // once: it does not depend on the act dtype
  // fp32 -> bf16 cast of 64 Mi elements (the per-step compute copy of the weights).
  const int64_t n = (int64_t)64 << 20;
  void *f = G->alloc(G, sizeof(float) * (size_t)n), *hb = G->alloc(G, sizeof(uint16_t) * (size_t)n);
  G->cast(G, hb, K_BF16, f, K_F32, n);
  G->sync(G);
  double t0 = now_s();
  for (int r = 0; r < reps; r++) G->cast(G, hb, K_BF16, f, K_F32, n);
  G->sync(G);
  double t = (now_s() - t0) / reps;
  printf("bench [%s] cast f32->bf16 n=%lld: %.3f ms (%.0f GB/s)\n", LABEL, (long long)n, 1e3 * t, 6.0 * n / t * 1e-9);
  dev_free(f), dev_free(hb);
  if (G->act != K_F32) return;  // the rest is fp32 whatever the act dtype: timed once
  const int M = 4096, d = 1024;
  float *x = G->alloc(G, 4 * (int64_t)M * d), *dy = G->alloc(G, 4 * (int64_t)M * d);
  float *w = G->alloc(G, 4 * d), *rs = G->alloc(G, 4 * M), *dw = G->alloc(G, 4 * d);
  float *dx = G->alloc(G, 4 * (int64_t)M * d);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->rmsnorm_bwd(G, dy, x, w, rs, dx, dw, M, d);
  G->sync(G);
  printf("bench [%s] rmsnorm_bwd rows=%d d=%d: %.3f ms\n", LABEL, M, d, 1e3 * (now_s() - t0) / reps);
  const int n_tok = 16384, vocab = 32768;
  int32_t *htok = malloc(sizeof(int32_t) * n_tok);
  for (int i = 0; i < n_tok; i++) htok[i] = (int32_t)((rng_uniform() * 0.5 + 0.5) * vocab) % vocab;
  int32_t *tok = dev_puti(htok, n_tok);
  float *dout = G->alloc(G, 4 * (int64_t)n_tok * d), *dtab = G->alloc(G, 4 * (int64_t)vocab * d);
  G->embed_bwd(G, tok, dout, dtab, n_tok, d, 0, vocab);
  G->sync(G);
  t0 = now_s();
  for (int r = 0; r < reps; r++) G->embed_bwd(G, tok, dout, dtab, n_tok, d, 0, vocab);
  G->sync(G);
  printf("bench [%s] embed_bwd n=%d d=%d vocab=%d: %.3f ms\n", LABEL, n_tok, d, vocab, 1e3 * (now_s() - t0) / reps);
  free(htok);
  dev_free(x), dev_free(dy), dev_free(dx), dev_free(w), dev_free(rs), dev_free(dw);
  dev_free(tok), dev_free(dout), dev_free(dtab);
}

// ---------------------------------------------------------------------------------------------
// The runner

static const char *OP_FILTER[64];  // --op prefixes; none: every row
static int N_FILTER, BENCH;

static int selected(const char *op) {
  if (N_FILTER == 0) return 1;
  for (int i = 0; i < N_FILTER; i++)
    if (strncmp(op, OP_FILTER[i], strlen(OP_FILTER[i])) == 0) return 1;
  return 0;
}

// Prints the ops of OPS that this backend ran no case for, and fails if there is one: an op
// with no row in CASES, a row that does not run with this activation dtype, or an op the
// backend leaves NULL. Ops left out by --op are counted apart and do not fail.
static void report_coverage(const int *n_run) {
  int n_missing = 0, n_skipped = 0;
  for (int k = 0; k < N_OPS; k++) {
    void (*fn)(void) = NULL;
    memcpy(&fn, (const char *)G + OPS[k].offset, sizeof fn);
    const op_case *row = case_of(OPS[k].name);
    const char *why = NULL;
    if (!fn) why = "the backend leaves it NULL";
    else if (!row) why = "no row in CASES";
    else if (!selected(row->op)) n_skipped++;
    else if (n_run[k] == 0) why = "its row does not run with this activation dtype";
    if (why) printf("coverage [%s]: %s has no case: %s\n", LABEL, OPS[k].name, why), n_missing++;
  }
  printf("coverage [%s]: %d of %d ops of k_backend ran cases", LABEL, N_OPS - n_missing - n_skipped, N_OPS);
  if (n_skipped) printf(", %d not selected by --op", n_skipped);
  printf(", %d without a case\n", n_missing);
  EXPECT(n_missing == 0, "[%s] %d ops of k_backend have no case (listed above)", LABEL, n_missing);
}

// One backend: make it, check memory, walk the table, report coverage, free it (before any
// other backend is made).
static void run_backend(const char *kind, k_dtype act) {
  G = make_backend(kind, act);
  EXPECT(G != NULL, "backend %s: this build cannot make it", kind);
  if (!G) return;
  snprintf(LABEL, sizeof LABEL, "%s %s", G->name, G->act == K_BF16 ? "bf16" : "f32");
  EXACT = strcmp(G->name, "cpu") == 0;
  EXPECT(strcmp(G->name, kind) == 0 && G->act == act,
         "make_backend(%s, act %d) gave backend %s with act %d", kind, (int)act, G->name, (int)G->act);
  printf("== %s on %s%s\n", LABEL, G->device_name, EXACT ? " (the reference itself: every comparison exact)" : "");
  test_memory();
  test_host_memory();
  check_backend_extras();
  int n_run[N_OPS] = {0};
  const unsigned act_bit = G->act == K_BF16 ? ACT_BF16 : ACT_F32;
  for (int i = 0; i < N_CASES; i++) {
    const op_case *c = &CASES[i];
    if (!selected(c->op) || !(c->acts & act_bit)) continue;
    const int fail0 = test_n_fail;
    const double t0 = now_s();
    rng_seed(c->op);
    for (int j = 0; j < c->n_shapes; j++) c->run(c, &c->shapes[j], j);
    G->sync(G);
    if (op_index(c->op) >= 0) n_run[op_index(c->op)] += c->n_shapes;  // else check_tables failed
    printf("[%s] %-16s %4d shapes  %s  (%.2f s)\n", LABEL, c->op, c->n_shapes, test_n_fail == fail0 ? "ok" : "FAILED",
           now_s() - t0);
    fflush(stdout);
  }
  report_coverage(n_run);
  if (BENCH && !EXACT) bench();
  G->sync(G);
  k_backend_free(&G);
  k_backend_free(&G);  // safe twice
  EXPECT(G == NULL, "[%s] k_backend_free clears the pointer", LABEL);
}

static int usage(void) {
  fprintf(stderr, "usage: test_backend_ops [--backend cpu|cuda|all] [--act f32|bf16] [--op NAME]... [--bench]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *backend = "cpu", *act_arg = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
    else if (strcmp(argv[i], "--act") == 0 && i + 1 < argc) act_arg = argv[++i];
    else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc && N_FILTER < 64) OP_FILTER[N_FILTER++] = argv[++i];
    else if (strcmp(argv[i], "--bench") == 0) BENCH = 1;
    else return usage();
  }
  const int want_cpu = !strcmp(backend, "cpu") || !strcmp(backend, "all");
  const int want_cuda = !strcmp(backend, "cuda") || !strcmp(backend, "all");
  if (!want_cpu && !want_cuda) return usage();
  if (act_arg && strcmp(act_arg, "f32") != 0 && strcmp(act_arg, "bf16") != 0) return usage();
  const int want_f32 = !act_arg || !strcmp(act_arg, "f32"), want_bf16 = !act_arg || !strcmp(act_arg, "bf16");
  for (int i = 0; i < N_FILTER; i++) {
    int any = 0;
    for (int k = 0; k < N_CASES; k++) any |= strncmp(CASES[k].op, OP_FILTER[i], strlen(OP_FILTER[i])) == 0;
    EXPECT(any, "--op %s selects no row", OP_FILTER[i]);
  }

  check_tables();
  if (want_cpu && want_f32) run_backend("cpu", K_F32);
  if (want_cuda) {
#ifdef TRAINER_HAVE_CUDA
    const int n_dev = k_cuda_device_count();
    EXPECT(n_dev > 0, "--backend %s: no CUDA device visible; the CUDA run needs a GPU", backend);
    if (n_dev > 0) {
      printf("CUDA devices: %d, testing device 0\n", n_dev);
      if (want_f32) run_backend("cuda", K_F32);
      if (want_bf16) run_backend("cuda", K_BF16);
    }
#else
    (void)want_bf16;
    EXPECT(0, "--backend %s: this build has no CUDA backend", backend);
#endif
  }
  return test_summary();
}
