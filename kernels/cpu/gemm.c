// CPU reference GEMM (fp32, row-major): cache-blocked, packed panels, a register-tile
// micro-kernel written with GCC vector extensions and built per ISA (AVX-512, AVX2+FMA,
// baseline SSE), chosen at run time so one -O3 binary runs on any x86-64 and is fast on the
// machines that have wide vectors. Training on CPU ranks spends most of its time here (the
// attention kernels are built from it too), which is why it is tuned.
//
// Determinism: every element of C is the sum over k in increasing order, in blocks of KC, each
// block accumulated in one register lane and then added to C. Threads split only the M x N tiles
// (never K), and tile shape only decides which elements are computed side by side, so the result
// does not depend on the thread count. The AVX-512 and AVX2 kernels both contract a*b+c to one
// FMA per step and so agree bitwise; only the baseline kernel (no FMA) rounds differently.
#include "kernels/cpu/ops_cpu.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"

// KC is part of the numerical definition (where the k sum is split); keep it fixed. MC and NC
// only size the cache blocks: an A block of MC x KC (128 KiB) sits in L2, a B micro-panel of
// KC x NR (32 KiB at NR = 32) in L1, and the shared packed B block of KC x NC in L2/L3.
// GEMM_DIRECT_REUSE: a panel used this many times or fewer is read in place, not packed.
enum { GEMM_KC = 256, GEMM_MC_MAX = 128, GEMM_NC = 3072, GEMM_DIRECT_REUSE = 4 };

// The FMA kernels rely on GCC contracting acc += a * b into one FMA, which it does in the GNU
// dialects (-std=gnu11, CMake's default) but not under strict ISO (-std=c11 sets
// -ffp-contract=off): results stay deterministic there, but the GEMM runs at half speed.
#ifdef __STRICT_ANSI__
#warning "strict ISO C mode disables FMA contraction: k_cpu_gemm will run at about half speed"
#endif

// Micro-kernel: C(mr x nr tile) = alpha * A * B + beta * C over kc steps of k. A is read as
// a[i * rs_a + p * cs_a] (a packed panel has rs_a = 1, cs_a = MR; an unpacked one points into the
// caller's matrix), B as rows of NR contiguous floats at stride ldb_p (NR when packed, ldb when
// read in place). mr <= MR and nr <= NR say how much of the tile is real: the rows and columns
// beyond are zero padding of packed panels and their results are dropped.
typedef void (*gemm_ukernel_fn)(int kc, const float *a, int64_t rs_a, int64_t cs_a, const float *b, int64_t ldb_p,
                                float *c, int ldc, float alpha, float beta, int mr, int nr);

// The tile is an array of vectors indexed by constants, so after full unrolling GCC keeps it
// in registers. The accumulation is elementwise, hence the same per-element order whatever the
// vector width. Write-back goes through a plain scalar loop on a spilled copy: it is a tiny
// fraction of the work and one code path keeps the rounding of alpha/beta identical for full
// and edge tiles.
#define GEMM_DEFINE_UKERNEL(NAME, ATTR, VBYTES, MR, NV)                                                      \
  ATTR static void NAME(int kc, const float *a, int64_t rs_a, int64_t cs_a, const float *b, int64_t ldb_p, \
                        float *c, int ldc, float alpha, float beta, int mr, int nr) {                      \
    typedef float vec_t __attribute__((vector_size(VBYTES)));                                               \
    enum { VW = (VBYTES) / 4, NR = (NV) * ((VBYTES) / 4) };                                                 \
    const float *ar[MR];                                                                                    \
    for (int i = 0; i < (MR); i++) ar[i] = a + i * rs_a;                                                    \
    vec_t acc[MR][NV];                                                                                      \
    for (int i = 0; i < (MR); i++)                                                                          \
      for (int v = 0; v < (NV); v++) acc[i][v] = (vec_t){0};                                                \
    int64_t ao = 0;                                                                                         \
    for (int p = 0; p < kc; p++, ao += cs_a) {                                                              \
      vec_t bv[NV];                                                                                         \
      for (int v = 0; v < (NV); v++) memcpy(&bv[v], b + p * ldb_p + v * VW, sizeof(vec_t));                 \
      for (int i = 0; i < (MR); i++) {                                                                      \
        const float ai = ar[i][ao]; /* scalar op vector broadcasts */                                       \
        for (int v = 0; v < (NV); v++) acc[i][v] += ai * bv[v];                                             \
      }                                                                                                     \
    }                                                                                                       \
    float tile[(MR) * NR];                                                                                  \
    for (int i = 0; i < (MR); i++)                                                                          \
      for (int v = 0; v < (NV); v++) memcpy(tile + i * NR + v * VW, &acc[i][v], sizeof(vec_t));             \
    if (beta == 0.0f) {                                                                                     \
      for (int i = 0; i < mr; i++)                                                                          \
        for (int j = 0; j < nr; j++) c[(size_t)i * ldc + j] = alpha * tile[i * NR + j];                     \
    } else {                                                                                                \
      for (int i = 0; i < mr; i++)                                                                          \
        for (int j = 0; j < nr; j++)                                                                        \
          c[(size_t)i * ldc + j] = alpha * tile[i * NR + j] + beta * c[(size_t)i * ldc + j];                \
    }                                                                                                       \
  }

// AVX-512: 8 x 32 tile = 16 zmm accumulators, enough independent FMAs to cover latency on two
// FMA ports. AVX2: 6 x 16 = 12 ymm of the 16. Baseline SSE: 6 x 8 = 12 xmm.
GEMM_DEFINE_UKERNEL(gemm_ukernel_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 8, 2)
GEMM_DEFINE_UKERNEL(gemm_ukernel_avx2, __attribute__((target("avx2,fma"))), 32, 6, 2)
GEMM_DEFINE_UKERNEL(gemm_ukernel_sse, , 16, 6, 2)

typedef struct {
  gemm_ukernel_fn fn;
  int mr, nr;
} gemm_kernel;

// The widest kernel the CPU runs, at most isa (tests pass each one to check every kernel on one
// machine, and that the AVX2 and AVX-512 ones agree bitwise).
static gemm_kernel gemm_pick_kernel(k_isa isa) {
  CHECK(isa >= K_ISA_AUTO && isa <= K_ISA_SSE, "gemm: unknown instruction set %d", (int)isa);
  // __builtin_cpu_supports is a cheap load of a table the runtime fills once at startup.
  const int allow512 = isa == K_ISA_AUTO || isa == K_ISA_AVX512, allow2 = allow512 || isa == K_ISA_AVX2;
  if (allow512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
    return (gemm_kernel){gemm_ukernel_avx512, 8, 32};
  if (allow2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return (gemm_kernel){gemm_ukernel_avx2, 6, 16};
  return (gemm_kernel){gemm_ukernel_sse, 6, 8};
}

// Packs 8 full rows of an untransposed A (at stride lda, ks [0, kc)) into one 8-row panel: an
// 8 x 8 transpose in registers per 8 ks, instead of one scalar store per element, which made
// packing A about 7% of a training step. Only the AVX-512 kernel has 8-row panels.
__attribute__((target("avx512f,avx2,fma"))) static void gemm_pack_a8_rows(const float *src, int lda, int kc,
                                                                          float *dst) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef int v8i __attribute__((vector_size(32)));
  int p = 0;
  for (; p + 8 <= kc; p += 8) {
    v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) memcpy(&r[i], src + (size_t)i * lda + p, sizeof(v8));
    for (int i = 0; i < 8; i += 2) {  // interleave row pairs: [r0_0 r1_0 r0_1 r1_1 | r0_4 r1_4 r0_5 r1_5]
      t[i] = __builtin_shuffle(r[i], r[i + 1], (v8i){0, 8, 1, 9, 4, 12, 5, 13});
      t[i + 1] = __builtin_shuffle(r[i], r[i + 1], (v8i){2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int i = 0; i < 8; i += 4) {  // then pairs of pairs: four rows of one k per 128-bit half
      u[i] = __builtin_shuffle(t[i], t[i + 2], (v8i){0, 1, 8, 9, 4, 5, 12, 13});
      u[i + 1] = __builtin_shuffle(t[i], t[i + 2], (v8i){2, 3, 10, 11, 6, 7, 14, 15});
      u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], (v8i){0, 1, 8, 9, 4, 5, 12, 13});
      u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], (v8i){2, 3, 10, 11, 6, 7, 14, 15});
    }
    for (int k = 0; k < 4; k++) {  // u[k] holds rows 0-3 of ks k and k+4, u[k+4] rows 4-7
      const v8 lo = __builtin_shuffle(u[k], u[k + 4], (v8i){0, 1, 2, 3, 8, 9, 10, 11});
      const v8 hi = __builtin_shuffle(u[k], u[k + 4], (v8i){4, 5, 6, 7, 12, 13, 14, 15});
      memcpy(dst + (size_t)(p + k) * 8, &lo, sizeof(v8));
      memcpy(dst + (size_t)(p + k + 4) * 8, &hi, sizeof(v8));
    }
  }
  for (; p < kc; p++)
    for (int i = 0; i < 8; i++) dst[(size_t)p * 8 + i] = src[(size_t)i * lda + p];
}

// Pack rows [i0, i0+mc) and ks [p0, p0+kc) of op(A) into panels of mr rows, k-major, zero-padded.
static void gemm_pack_a(int trans_a, const float *A, int lda, int i0, int mc, int p0, int kc, int mr, float *ap) {
  for (int ir = 0; ir < mc; ir += mr) {
    float *dst = ap + (size_t)ir * kc;
    int rows = mc - ir < mr ? mc - ir : mr;
    if (!trans_a && mr == 8 && rows == 8) {
      gemm_pack_a8_rows(A + (size_t)(i0 + ir) * lda + p0, lda, kc, dst);
      continue;
    }
    if (!trans_a) {
      // Rows of A are contiguous along k: read them in order, write with stride mr.
      for (int i = 0; i < rows; i++) {
        const float *src = A + (size_t)(i0 + ir + i) * lda + p0;
        for (int p = 0; p < kc; p++) dst[(size_t)p * mr + i] = src[p];
      }
    } else {
      for (int p = 0; p < kc; p++) {
        const float *src = A + (size_t)(p0 + p) * lda + i0 + ir;
        for (int i = 0; i < rows; i++) dst[(size_t)p * mr + i] = src[i];
      }
    }
    for (int i = rows; i < mr; i++)
      for (int p = 0; p < kc; p++) dst[(size_t)p * mr + i] = 0.0f;
  }
}

// Pack one panel of nr columns [j0, j0+nr) and ks [p0, p0+kc) of op(B), k-major, zero-padded.
static void gemm_pack_b_panel(int trans_b, const float *B, int ldb, int j0, int cols, int p0, int kc, int nr,
                              float *bp) {
  if (!trans_b) {
    for (int p = 0; p < kc; p++) {
      const float *src = B + (size_t)(p0 + p) * ldb + j0;
      float *dst = bp + (size_t)p * nr;
      for (int j = 0; j < cols; j++) dst[j] = src[j];
      for (int j = cols; j < nr; j++) dst[j] = 0.0f;
    }
  } else {
    for (int j = 0; j < cols; j++) {
      const float *src = B + (size_t)(j0 + j) * ldb + p0;
      for (int p = 0; p < kc; p++) bp[(size_t)p * nr + j] = src[p];
    }
    for (int j = cols; j < nr; j++)
      for (int p = 0; p < kc; p++) bp[(size_t)p * nr + j] = 0.0f;
  }
}

// C = beta * C for the degenerate cases (K == 0 or alpha == 0), as BLAS defines them.
static void gemm_scale_c(int M, int N, float beta, float *C, int ldc) {
#pragma omp parallel for schedule(static) if ((int64_t)M * N > 65536)
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

static int gemm_ceil_div(int a, int b) { return (a + b - 1) / b; }

void k_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
  k_cpu_gemm_isa(K_ISA_AUTO, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void k_cpu_gemm_isa(k_isa isa, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
  CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape M=%d N=%d K=%d must be non-negative", M, N, K);
  if (M == 0 || N == 0) return;
  CHECK(ldc >= N, "gemm ldc=%d < N=%d", ldc, N);
  CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N), "gemm lda=%d or ldb=%d too small for M=%d N=%d K=%d",
        lda, ldb, M, N, K);
  if (K == 0 || alpha == 0.0f) {
    gemm_scale_c(M, N, beta, C, ldc);
    return;
  }
  const gemm_kernel kern = gemm_pick_kernel(isa);
  const int mr = kern.mr, nr = kern.nr;

  // Threads: small products are not worth waking the team for, and a caller already inside a
  // parallel region (attention runs one GEMM per task) keeps its thread. Results do not depend
  // on the count.
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (2.0 * M * N * K < 2e6) nt = 1;

  // Row blocks: a multiple of the thread count when there are enough row panels, so the static
  // split is even; if there are too few row blocks, the columns of each B block are split too.
  const int m_pan = gemm_ceil_div(M, mr);
  int n_mblk = gemm_ceil_div(m_pan * mr, GEMM_MC_MAX);
  n_mblk = gemm_ceil_div(n_mblk, nt) * nt;
  if (n_mblk > m_pan) n_mblk = m_pan;
  const int pan_per_mblk = gemm_ceil_div(m_pan, n_mblk);
  n_mblk = gemm_ceil_div(m_pan, pan_per_mblk);
  const int mc_max = pan_per_mblk * mr;

  const int nc_max = N < GEMM_NC ? gemm_ceil_div(N, nr) * nr : GEMM_NC;
  const int kc_max = K < GEMM_KC ? K : GEMM_KC;
  float *bp = XMALLOC((size_t)kc_max * nc_max * sizeof(float));  // (KC, NC) in NR panels, shared

#pragma omp parallel num_threads(nt)
  {
    float *ap = XMALLOC((size_t)kc_max * mc_max * sizeof(float));  // (MC, KC) in MR panels, per thread
    for (int jc = 0; jc < N; jc += GEMM_NC) {
      const int nc = N - jc < GEMM_NC ? N - jc : GEMM_NC;
      const int n_pan = gemm_ceil_div(nc, nr);
      int n_split = n_mblk >= nt ? 1 : gemm_ceil_div(2 * nt, n_mblk);
      if (n_split > n_pan) n_split = n_pan;
      const int pan_per_split = gemm_ceil_div(n_pan, n_split);
      n_split = gemm_ceil_div(n_pan, pan_per_split);
      const int n_task = n_mblk * n_split;
      // Packing pays only when a panel is reused: read A in place when each task visits few B
      // panels, and B in place (not transposed, full panels) when few A panels share each one.
      const int a_direct = pan_per_split <= GEMM_DIRECT_REUSE;
      const int b_direct = !trans_b && pan_per_mblk <= GEMM_DIRECT_REUSE;
      for (int pc = 0; pc < K; pc += GEMM_KC) {
        const int kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
        // First k block applies the caller's beta; later ones add onto what is already in C.
        const float beta_eff = pc == 0 ? beta : 1.0f;
#pragma omp for schedule(static)
        for (int jp = 0; jp < n_pan; jp++) {
          const int cols = nc - jp * nr < nr ? nc - jp * nr : nr;
          if (b_direct && cols == nr) continue;
          gemm_pack_b_panel(trans_b, B, ldb, jc + jp * nr, cols, pc, kc, nr, bp + (size_t)jp * kc * nr);
        }
        // (implicit barrier: the packed B block is complete before anyone reads it)
        int packed_mb = -1;  // the row block now in ap; a thread's consecutive tasks share it
#pragma omp for schedule(static)
        for (int t = 0; t < n_task; t++) {
          const int mb = t / n_split, sb = t % n_split;
          const int i0 = mb * mc_max;
          const int mc = M - i0 < mc_max ? M - i0 : mc_max;
          const int ir_edge = mc / mr * mr;  // first row of a partial panel (== mc when none)
          if (mb != packed_mb) {
            if (!a_direct)
              gemm_pack_a(trans_a, A, lda, i0, mc, pc, kc, mr, ap);
            else if (ir_edge < mc)  // in-place reads would run past row M: pack just that panel
              gemm_pack_a(trans_a, A, lda, i0 + ir_edge, mc - ir_edge, pc, kc, mr, ap);
            packed_mb = mb;
          }
          const int jp_end = (sb + 1) * pan_per_split < n_pan ? (sb + 1) * pan_per_split : n_pan;
          for (int jp = sb * pan_per_split; jp < jp_end; jp++) {
            const int j0 = jp * nr;
            const int cols = nc - j0 < nr ? nc - j0 : nr;
            const int b_here = b_direct && cols == nr;
            const float *bpan = b_here ? B + (size_t)pc * ldb + jc + j0 : bp + (size_t)jp * kc * nr;
            const int64_t ldb_p = b_here ? ldb : nr;
            for (int ir = 0; ir < mc; ir += mr) {
              const int rows = mc - ir < mr ? mc - ir : mr;
              const float *apan = ap + (size_t)ir * kc;
              int64_t rs_a = 1, cs_a = mr;
              if (a_direct && ir < ir_edge) {
                apan = trans_a ? A + (size_t)pc * lda + i0 + ir : A + (size_t)(i0 + ir) * lda + pc;
                rs_a = trans_a ? 1 : lda;
                cs_a = trans_a ? lda : 1;
              } else if (a_direct) {
                apan = ap;
              }
              kern.fn(kc, apan, rs_a, cs_a, bpan, ldb_p, C + (size_t)(i0 + ir) * ldc + jc + j0, ldc, alpha,
                      beta_eff, rows, cols);
            }
          }
        }
        // (implicit barrier: nobody repacks B while another thread still reads it)
      }
    }
    free(ap);
  }
  free(bp);
}
