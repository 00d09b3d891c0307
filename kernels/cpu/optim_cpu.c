// Multi-tensor optimizer ops on CPU ranks and for optimizer state in host memory (see
// optim_cpu.h). AdamW is memory-bound (28 bytes per parameter against ~15 flops), so it makes one
// pass: each element's g, p, m and v are read once, and p, m, v and the compute copy written in
// the same pass. All threads split the concatenated ranges in static chunks; each chunk runs on
// the widest vector kernel the CPU has (AVX-512, AVX2, else scalar), chosen at run time as the
// GEMM's kernel is.
//
// Bits: every path computes k_cpu_adamw's expression on g * g_scale with the same operations in
// the same order, one rounding each (no FMA: CMake builds this file with -ffp-contract=off, as
// GCC would otherwise fuse the intrinsics' mul and add), and rounds to bf16 as k_f32_to_bf16
// does. So the ISA and the thread count never change a result, and a run gives the bits of the
// per-tensor scale and adamw calls it replaced.
#include "kernels/cpu/optim_cpu.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "kernels/bf16.h"
#include "kernels/base/check.h"
#include "kernels/cpu/ops_cpu.h"

// Below this many elements in all ranges together the update runs on one thread (as in ops_cpu.c).
#define OPTIM_PAR_MIN ((int64_t)1 << 15)
// Thread chunks start at multiples of this many elements (a 64-byte line of fp32), so two
// threads share a written line only where a range boundary falls inside one.
#define OPTIM_CHUNK_ALIGN 16

double k_cpu_sumsq_ranges(const float *x, const k_range *r, int n_ranges) {
  double s = 0;
  for (int i = 0; i < n_ranges; i++) s += k_cpu_sumsq(x + r[i].offset, r[i].n_elem);
  return s;
}

// The step's scalars as the element expression reads them.
typedef struct adamw_step {
  float lr, beta1, beta2, eps, bc1, bc2, g_scale;
} adamw_step;

// One contiguous span of n elements: g, m, v from the range's offset, p and the compute copy
// (pc16 bf16, pc32 fp32, at most one non-NULL) from its p_offset. wd: the range's weight decay.
typedef void (*adamw_span_fn)(const adamw_step *s, float wd, int64_t n, const float *g, float *m, float *v,
                              float *p, uint16_t *pc16, float *pc32);

// The reference: k_cpu_adamw's expression, term for term. The vector kernels below repeat it
// lane by lane and run it on their tails.
static void adamw_span_scalar(const adamw_step *s, float wd, int64_t n, const float *g, float *m, float *v, float *p,
                              uint16_t *pc16, float *pc32) {
  // Locals, not s->: the stores below could alias *s, which would keep every read in the loop.
  const float lr = s->lr, beta1 = s->beta1, beta2 = s->beta2, eps = s->eps, bc1 = s->bc1, bc2 = s->bc2;
  const float g_scale = s->g_scale;
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] * g_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] - lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    p[i] = pi;
    if (pc16) pc16[i] = k_f32_to_bf16(pi);
    if (pc32) pc32[i] = pi;
  }
}

// bf16 of 16 or 8 lanes as k_f32_to_bf16 rounds: NaN -> its top half with the quiet bit set,
// else add 0x7fff plus the lowest kept bit and keep the top half (round to nearest even).
__attribute__((target("avx512f"))) static inline void adamw_store_bf16_avx512(uint16_t *dst, __m512 x) {
  const __m512i u = _mm512_castps_si512(x), top = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(top, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __m512i h = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(h));
}

// The halves are packed with unsigned saturation (they are at most 0xffff: nothing saturates),
// then the two 64-bit groups holding them brought together.
__attribute__((target("avx2"))) static inline void adamw_store_bf16_avx2(uint16_t *dst, __m256 x) {
  const __m256i u = _mm256_castps_si256(x), top = _mm256_srli_epi32(u, 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(top, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(packed));
}

// A vector kernel: adamw_span_scalar's expression on W lanes of type VEC at a time (MM: the
// intrinsics' prefix), the tail of fewer than W elements on the scalar kernel.
#define ADAMW_DEFINE_SPAN(NAME, ATTR, VEC, MM, W, STORE_BF16)                                                        \
  ATTR static void NAME(const adamw_step *s, float wd, int64_t n, const float *g, float *m, float *v, float *p,    \
                        uint16_t *pc16, float *pc32) {                                                             \
    const VEC lr = MM##_set1_ps(s->lr), b1 = MM##_set1_ps(s->beta1), c1 = MM##_set1_ps(1.0f - s->beta1);           \
    const VEC b2 = MM##_set1_ps(s->beta2), c2 = MM##_set1_ps(1.0f - s->beta2), eps = MM##_set1_ps(s->eps);         \
    const VEC bc1 = MM##_set1_ps(s->bc1), bc2 = MM##_set1_ps(s->bc2), gs = MM##_set1_ps(s->g_scale);               \
    const VEC wdv = MM##_set1_ps(wd);                                                                              \
    int64_t i = 0;                                                                                                 \
    for (; i + (W) <= n; i += (W)) {                                                                               \
      const VEC gi = MM##_mul_ps(MM##_loadu_ps(g + i), gs);                                                        \
      const VEC mi = MM##_add_ps(MM##_mul_ps(b1, MM##_loadu_ps(m + i)), MM##_mul_ps(c1, gi));                      \
      const VEC vi = MM##_add_ps(MM##_mul_ps(b2, MM##_loadu_ps(v + i)), MM##_mul_ps(MM##_mul_ps(c2, gi), gi));     \
      MM##_storeu_ps(m + i, mi);                                                                                   \
      MM##_storeu_ps(v + i, vi);                                                                                   \
      const VEC p0 = MM##_loadu_ps(p + i);                                                                         \
      const VEC den = MM##_add_ps(MM##_sqrt_ps(MM##_div_ps(vi, bc2)), eps);                                        \
      const VEC upd = MM##_add_ps(MM##_div_ps(MM##_div_ps(mi, bc1), den), MM##_mul_ps(wdv, p0));                   \
      const VEC pi = MM##_sub_ps(p0, MM##_mul_ps(lr, upd));                                                        \
      MM##_storeu_ps(p + i, pi);                                                                                   \
      if (pc16) STORE_BF16(pc16 + i, pi);                                                                          \
      if (pc32) MM##_storeu_ps(pc32 + i, pi);                                                                      \
    }                                                                                                              \
    adamw_span_scalar(s, wd, n - i, g + i, m + i, v + i, p + i, pc16 ? pc16 + i : NULL, pc32 ? pc32 + i : NULL);  \
  }

ADAMW_DEFINE_SPAN(adamw_span_avx512, __attribute__((target("avx512f"))), __m512, _mm512, 16, adamw_store_bf16_avx512)
ADAMW_DEFINE_SPAN(adamw_span_avx2, __attribute__((target("avx2"))), __m256, _mm256, 8, adamw_store_bf16_avx2)

// The widest kernel the CPU runs, at most isa (as gemm.c picks its GEMM kernel).
static adamw_span_fn adamw_pick_span(k_isa isa) {
  CHECK(isa >= K_ISA_AUTO && isa <= K_ISA_SSE, "adamw_ranges: unknown instruction set %d", (int)isa);
  const int allow512 = isa == K_ISA_AUTO || isa == K_ISA_AVX512, allow2 = allow512 || isa == K_ISA_AVX2;
  if (allow512 && __builtin_cpu_supports("avx512f")) return adamw_span_avx512;
  if (allow2 && __builtin_cpu_supports("avx2")) return adamw_span_avx2;
  return adamw_span_scalar;
}

// Runs the elements [lo, hi) of the ranges laid end to end.
static void adamw_chunk(adamw_span_fn span, const adamw_step *s, float weight_decay, int64_t lo, int64_t hi, float *p,
                        uint16_t *pc16, float *pc32, const float *g, float *m, float *v, const k_range *r,
                        int n_ranges) {
  int64_t start = 0;  // of range k in the concatenation
  for (int k = 0; k < n_ranges && start < hi; start += r[k].n_elem, k++) {
    const int64_t a = lo > start ? lo - start : 0, b = hi - start < r[k].n_elem ? hi - start : r[k].n_elem;
    if (a >= b) continue;
    const int64_t o = r[k].offset + a, po = r[k].p_offset + a;
    span(s, r[k].decay ? weight_decay : 0.0f, b - a, g + o, m + o, v + o, p + po, pc16 ? pc16 + po : NULL,
         pc32 ? pc32 + po : NULL);
  }
}

void k_cpu_adamw_ranges_isa(k_isa isa, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v,
                            const k_range *r, int n_ranges, float lr, float beta1, float beta2, float eps,
                            float weight_decay, float bc1, float bc2, float g_scale) {
  CHECK(!pc || pc_type == K_BF16 || pc_type == K_F32, "adamw_ranges: unknown compute-copy dtype %d", (int)pc_type);
  const adamw_span_fn span = adamw_pick_span(isa);
  const adamw_step s = {lr, beta1, beta2, eps, bc1, bc2, g_scale};
  uint16_t *pc16 = pc && pc_type == K_BF16 ? pc : NULL;
  float *pc32 = pc && pc_type == K_F32 ? pc : NULL;
  int64_t total = 0;
  for (int k = 0; k < n_ranges; k++) total += r[k].n_elem;
  const int nt = total > OPTIM_PAR_MIN ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n_threads = omp_get_num_threads();
    const int64_t lo = total * t / n_threads / OPTIM_CHUNK_ALIGN * OPTIM_CHUNK_ALIGN;
    const int64_t hi = t + 1 == n_threads ? total : total * (t + 1) / n_threads / OPTIM_CHUNK_ALIGN * OPTIM_CHUNK_ALIGN;
    adamw_chunk(span, &s, weight_decay, lo, hi, p, pc16, pc32, g, m, v, r, n_ranges);
  }
}

void k_cpu_adamw_ranges(float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                        int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float g_scale) {
  k_cpu_adamw_ranges_isa(K_ISA_AUTO, p, pc, pc_type, g, m, v, r, n_ranges, lr, beta1, beta2, eps, weight_decay, bc1,
                         bc2, g_scale);
}
