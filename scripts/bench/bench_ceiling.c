// GEMM + attention ceiling of one training step on one GPU: times, through the CUDA backend's op
// table (bf16 activations), exactly the GEMMs and attention calls model/block.c makes for one
// layer (forward and backward; tp 1, no recomputation, as in the benchmark configs) and for the
// LM head, with block.c's shapes, transposes, leading dimensions, beta and output dtypes, then
// prints their sum as a floor for the step time and the tokens/s and MFU that floor allows.
// Norms, RoPE, SwiGLU, cross-entropy, the embedding and the optimizer are left out, so a real
// step is slower. Prints numbers only; it is not a test. Built by tests/cmake/cuda.cmake when CUDA is
// enabled; run `build/bench_ceiling 124m|1b|7b-layers`, or scripts/bench/bench_ceiling.sh for all three.
// `build/bench_ceiling SHAPE tpN` (N = 2, 4 or 8) times instead the GEMMs that tensor parallelism
// over N GPUs with SP splits by rows (model/block.c's gemm_gathered, proj_residual and
// proj_dgrad_enter, so that the tp collectives overlap them) with tp N's shapes: whole, and as N
// row blocks back to back; beside each, the time the other ranks' blocks of its collective take
// at a given link rate, one block after another (what the split may hide; the first block's
// time is what the GEMM over this rank's own rows must cover); and the head's GEMM, which
// block.c keeps whole because of what this shows.
// `build/bench_ceiling SHAPE algos` times each GEMM of a layer and of the head as the backend
// runs it against every algorithm cuBLASLt's heuristic offers for the same problem (up to 16,
// deterministic reduction schemes only, the backend's 32 MiB workspace): what choosing by
// measurement instead of by heuristic would gain.
// `build/bench_ceiling SHAPE fp8` sets the FP8 floor of a layer beside the bf16 one: each of the
// four projections (qkv, wo, gate|up, down) in its three roles (forward Y = X W^T, data gradient
// dX = dY W, weight gradient dW += dY^T X) as block.c runs it in bf16 and as gemm_fp8 runs it
// (E4M3 activations and weights, E5M2 gradients, per-tensor scales, both operands K-major: the
// backward GEMMs read the transposed copies the casts write), forward also with fast
// accumulation, and the fastest of cuBLASLt's heuristic list for each FP8 GEMM; then the fused
// casts FP8 adds (fp8_cast with its transpose: X and dY per micro-batch, W once per step) and
// the layer's totals both ways.
#include <cublasLt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/config.h"
#include "kernels/backend.h"
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "model/model.h"

// The benchmark shapes, as configs/124m.yaml, configs/1b.yaml and configs/7b_layers.yaml set them
// (global_batch = micro_batch in all three: one micro-batch per step).
typedef struct shape {
  const char *name, *config;
  int d, n_layers, nh, nkv, ffn, vocab, T, micro_batch, global_batch, tied;
} shape;
static const shape shapes[] = {
    {"124m", "configs/124m.yaml", 768, 12, 12, 12, 2048, 32000, 1024, 16, 16, 0},
    {"1b", "configs/1b.yaml", 2048, 16, 32, 8, 8192, 128256, 2048, 4, 4, 1},
    {"7b-layers", "configs/7b_layers.yaml", 4096, 8, 32, 32, 11008, 32000, 4096, 2, 2, 0},
};

typedef enum op_kind { OP_GEMM, OP_LINEAR_RESIDUAL, OP_ATTN_FWD, OP_ATTN_BWD } op_kind;

// One call as block.c makes it. GEMMs: C (M,N) = op(A) op(B) + beta C, alpha 1, every leading
// dimension the packed one (block.c's are: lda = ta ? M : K, ldb = tb ? K : N, ldc = N).
typedef struct op {
  const char *name;
  op_kind kind;
  int ta, tb, M, N, K;
  float beta;
  k_dtype c_type;
} op;

typedef struct attn_bufs {
  void *qkv, *o, *dout, *dqkv;  // (rows, qkvd), (rows, qd), (rows, qd), (rows, qkvd) act
  float *lse;                   // (B, nh, T)
  int B, T, nh, nkv, hd;
  int64_t ld;                   // qkvd: q, k, v are column blocks of the fused projection's rows
} attn_bufs;

enum { N_WARM = 3, N_RUNS = 20, POOL = 1 << 22 };

static k_backend *G;
static void *pool_act, *pool_f32;  // (POOL) random values that fill every operand
static cudaEvent_t ev[N_RUNS + 1];

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rng_uniform(void) {  // [-1, 1), a fixed xorshift
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

// Random operands rather than the zeros of alloc: tensor cores draw less power (and may clock
// higher) on zeros, which would flatter the timings.
static void *alloc_filled(k_dtype t, int64_t n) {
  const size_t eb = k_dtype_bytes(t);
  char *p = G->alloc(G, (size_t)n * eb);
  for (int64_t i = 0; i < n; i += POOL)
    G->copy(G, p + i * (int64_t)eb, t == K_F32 ? pool_f32 : pool_act, (size_t)(n - i < POOL ? n - i : POOL) * eb);
  return p;
}

static void op_run(const op *o, void *a, void *b, void *c, void *d, const attn_bufs *x) {
  const size_t eb = k_dtype_bytes(G->act);
  const int64_t qd = (int64_t)x->nh * x->hd, kvd = (int64_t)x->nkv * x->hd;
  char *qkv = x->qkv, *dqkv = x->dqkv;
  switch (o->kind) {
    case OP_GEMM:
      G->gemm(G, o->ta, o->tb, o->M, o->N, o->K, 1.0f, a, o->ta ? o->M : o->K, b, o->tb ? o->K : o->N, o->beta, c, o->N,
              o->c_type);
      break;
    case OP_LINEAR_RESIDUAL: G->linear_residual(G, o->M, o->N, o->K, a, b, c, d); break;
    case OP_ATTN_FWD:
      G->attn_fwd(G, qkv, qkv + qd * eb, qkv + (qd + kvd) * eb, x->ld, x->o, x->lse, x->B, x->T, x->nh, x->nkv, x->hd);
      break;
    case OP_ATTN_BWD:
      G->attn_bwd(G, x->dout, qkv, qkv + qd * eb, qkv + (qd + kvd) * eb, x->ld, x->o, x->lse, dqkv, dqkv + qd * eb,
                  dqkv + (qd + kvd) * eb, x->B, x->T, x->nh, x->nkv, x->hd);
      break;
  }
}

static int cmp_float(const void *p, const void *q) {
  const float a = *(const float *)p, b = *(const float *)q;
  return (a > b) - (a < b);
}

// The N_RUNS calls' ms, sorted, once the calls recorded between events ev[0..N_RUNS] are done.
static void runs_ms(float ms[N_RUNS]) {
  CUDA_CHECK(cudaEventSynchronize(ev[N_RUNS]));
  for (int i = 0; i < N_RUNS; i++) CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  qsort(ms, N_RUNS, sizeof ms[0], cmp_float);
}

// Times o: N_WARM calls (cuBLASLt and cuDNN plan on the first), then N_RUNS calls back to back
// on the backend's stream, each between two events. Best and median in ms.
static void op_time(const op *o, const attn_bufs *x, double *best, double *median) {
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  const int attn = o->kind == OP_ATTN_FWD || o->kind == OP_ATTN_BWD;
  if (!attn) {  // A (M,K) or (K,M); B (K,N) or (N,K) (linear_residual: W (N,K)); C (M,N)
    a = alloc_filled(G->act, (int64_t)o->M * o->K);
    b = alloc_filled(G->act, (int64_t)o->K * o->N);
    c = alloc_filled(o->kind == OP_GEMM ? o->c_type : K_F32, (int64_t)o->M * o->N);
    if (o->kind == OP_LINEAR_RESIDUAL) d = alloc_filled(K_F32, (int64_t)o->M * o->N);  // D != C, as block.c
  }
  cudaStream_t s = (cudaStream_t)k_cuda_stream_of(G);
  for (int i = 0; i < N_WARM; i++) op_run(o, a, b, c, d, x);
  CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < N_RUNS; i++) {
    op_run(o, a, b, c, d, x);
    CUDA_CHECK(cudaEventRecord(ev[i + 1], s));
  }
  float ms[N_RUNS];
  runs_ms(ms);
  *best = ms[0];
  *median = 0.5 * (ms[(N_RUNS - 1) / 2] + ms[N_RUNS / 2]);
  G->free(G, a), G->free(G, b), G->free(G, c), G->free(G, d);
}

// Causal attention flops: forward 2 matmuls of 2 B nh T^2 hd each, halved by the mask;
// backward 2.5 x forward (5 matmuls against 2).
static double op_flops(const op *o, const attn_bufs *x) {
  const double fwd = 4.0 * x->B * (double)x->T * x->T * x->nh * x->hd / 2.0;
  if (o->kind == OP_ATTN_FWD) return fwd;
  if (o->kind == OP_ATTN_BWD) return 2.5 * fwd;
  return 2.0 * o->M * (double)o->N * o->K;
}

// Times a list of ops, prints one line each; returns the summed best and median ms and flops.
static void ops_bench(const op *ops, int n, const attn_bufs *x, double peak, double *sum_best, double *sum_med,
                      double *sum_flops) {
  *sum_best = *sum_med = *sum_flops = 0;
  for (int i = 0; i < n; i++) {
    const op *o = &ops[i];
    double best, med, fl = op_flops(o, x);
    op_time(o, x, &best, &med);
    const double tf = fl / (best * 1e-3) / 1e12;
    if (o->kind == OP_GEMM || o->kind == OP_LINEAR_RESIDUAL)
      printf("  %-14s %-15s M=%6d N=%6d K=%6d ta=%d tb=%d beta=%g C=%-4s", o->name,
             o->kind == OP_GEMM ? "gemm" : "linear_residual", o->M, o->N, o->K, o->ta, o->tb, o->beta,
             o->kind == OP_LINEAR_RESIDUAL || o->c_type == K_F32 ? "f32" : "bf16");
    else
      printf("  %-14s %-15s B=%d T=%d nh=%d nkv=%d hd=%d ld=%lld causal", o->name,
             o->kind == OP_ATTN_FWD ? "attn_fwd" : "attn_bwd", x->B, x->T, x->nh, x->nkv, x->hd, (long long)x->ld);
    printf("  %8.3f ms (median %8.3f)  %6.1f TFLOP/s  %5.1f%% of peak\n", best, med, tf, 100.0 * tf / peak);
    *sum_best += best, *sum_med += med, *sum_flops += fl;
  }
}

// The GEMMs of one tp-N layer that SP splits by rows, and the head's: each whole, then one of its
// N row blocks (all the same shape; back to back on one stream they add). moved: the columns of
// the collective's blocks (the gathered input's for a gathered GEMM, the output's for a
// reduce-scatter) and their bytes per element, for the transfer time at gbps GB/s.
typedef struct split_op {
  op o;
  int moved_cols, moved_bytes;
} split_op;

static void tp_split_bench(int tp, int R, int d, int qkvd, int qd, int F, int V, const attn_bufs *x, double peak,
                           double gbps) {
  const k_dtype A = G->act;
  const int ab = (int)k_dtype_bytes(A);
  const split_op ops[] = {
      {{"qkv fwd", OP_GEMM, 0, 1, R, qkvd, d, 0, A}, d, ab},          // all-gather of the norm output
      {{"wo fwd", OP_GEMM, 0, 1, R, d, qd, 0, K_BF16}, d, 2},         // reduce-scatter, bf16 sums
      {{"gate|up fwd", OP_GEMM, 0, 1, R, 2 * F, d, 0, A}, d, ab},     // all-gather
      {{"down fwd", OP_GEMM, 0, 1, R, d, F, 0, K_BF16}, d, 2},        // reduce-scatter
      {{"down dX", OP_GEMM, 0, 0, R, F, d, 0, A}, d, ab},             // all-gather of the residual gradient
      {{"gate|up dX", OP_GEMM, 0, 0, R, d, 2 * F, 0, K_BF16}, d, 2},  // reduce-scatter
      {{"wo dX", OP_GEMM, 0, 0, R, qd, d, 0, A}, d, ab},              // all-gather
      {{"qkv dX", OP_GEMM, 0, 0, R, d, qkvd, 0, K_BF16}, d, 2},       // reduce-scatter
      {{"head fwd", OP_GEMM, 0, 1, R, V, d, 0, A}, d, ab},            // all-gather (kept whole)
  };
  const int n = (int)(sizeof ops / sizeof ops[0]);
  double sum_whole = 0, sum_split = 0, sum_moved = 0;
  printf("  (the reduce-scatters' GEMMs timed with bf16 output, as parallel.tp_reduce_dtype=bf16 writes the "
         "other ranks' rows; transfers at %.0f GB/s)\n", gbps);
  for (int i = 0; i < n; i++) {
    const op *whole = &ops[i].o;
    op block = *whole;
    block.M = R / tp;
    double bw, mw, bb, mb;
    op_time(whole, x, &bw, &mw);
    op_time(&block, x, &bb, &mb);
    const double moved = (double)(tp - 1) * block.M * ops[i].moved_cols * ops[i].moved_bytes / (gbps * 1e9) * 1e3;
    printf("  %-12s M=%6d N=%6d K=%6d  whole %7.3f ms  %d blocks %7.3f ms (%+5.1f%%)  %6.1f TFLOP/s whole  "
           "transfers %6.3f ms (first %6.3f, own block %6.3f)\n",
           whole->name, R, whole->N, whole->K, bw, tp, tp * bb, 100.0 * (tp * bb - bw) / bw,
           op_flops(whole, x) / (bw * 1e-3) / 1e12, moved, moved / (tp - 1), bb);
    if (i < n - 1) sum_whole += bw, sum_split += tp * bb, sum_moved += moved;
  }
  printf("  a layer's split GEMMs: whole %.3f ms, as %d blocks %.3f ms (%+.1f%%); their transfers %.3f ms; peak %.1f "
         "TFLOP/s\n",
         sum_whole, tp, sum_split, 100.0 * (sum_split - sum_whole) / sum_whole, sum_moved, peak);
}

// Best ms over N_RUNS calls (after N_WARM) of one cuBLASLt algorithm on o's operands, or -1 if it
// fails; D = C for beta 1, as the backend's in-place accumulation (linear_residual: D != C).
static double lt_time(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo,
                      const void *x, const void *y, const void *c, void *d, float beta, void *ws, size_t ws_bytes) {
  cudaStream_t s = (cudaStream_t)k_cuda_stream_of(G);
  const float one = 1.0f;
  for (int i = 0; i < N_WARM; i++)
    if (cublasLtMatmul(h, desc, &one, x, la, y, lb, &beta, c, lc, d, lc, algo, ws, ws_bytes, s) != CUBLAS_STATUS_SUCCESS)
      return -1;
  CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < N_RUNS; i++) {
    cublasLtMatmul(h, desc, &one, x, la, y, lb, &beta, c, lc, d, lc, algo, ws, ws_bytes, s);
    CUDA_CHECK(cudaEventRecord(ev[i + 1], s));
  }
  float ms[N_RUNS];
  runs_ms(ms);
  return ms[0];
}

// cuBLASLt's heuristic list (up to 16) for desc on la, lb and lc (C and D alike) within ws_bytes of
// workspace, deterministic reduction schemes only, as the backend asks for its first; its length.
static int lt_list(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc, size_t ws_bytes, cublasLtMatmulHeuristicResult_t res[16]) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof ws_bytes));
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  int n_res = 0;
  if (cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 16, res, &n_res) != CUBLAS_STATUS_SUCCESS) n_res = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  return n_res;
}

// For each GEMM of ops: the backend's time, the heuristic's first algorithm's and the fastest of
// its first 16 (row-major C (M,N) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, as
// k_cuda_gemm passes it to cublasGemmEx).
static void algos_bench(const op *ops, int n, const attn_bufs *x, double *sum_backend, double *sum_first,
                        double *sum_best) {
  cublasLtHandle_t h;
  CUBLAS_CHECK(cublasLtCreate(&h));
  const size_t ws_bytes = (size_t)32 << 20;
  void *ws = G->alloc(G, ws_bytes);
  for (int i = 0; i < n; i++) {
    const op *o = &ops[i];
    if (o->kind != OP_GEMM && o->kind != OP_LINEAR_RESIDUAL) continue;
    double backend, med;
    op_time(o, x, &backend, &med);
    // linear_residual is D (M,N) = A W^T + C: the GEMM ta = 0, tb = 1 with beta 1, D != C.
    const int lr = o->kind == OP_LINEAR_RESIDUAL, ta = lr ? 0 : o->ta, tb = lr ? 1 : o->tb;
    const k_dtype ct = lr ? K_F32 : o->c_type;
    const cudaDataType ab = CUDA_R_16BF, cdt = ct == K_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
    // X = B: (N,K) col-major when not transposed, else (K,N); Y = A: (K,M), else (M,K); C^T (N,M).
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, ab, tb ? o->K : o->N, tb ? o->N : o->K, tb ? o->K : o->N));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, ta ? o->M : o->K, ta ? o->K : o->M, ta ? o->M : o->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, cdt, o->N, o->M, o->N));
    cublasLtMatmulHeuristicResult_t res[16];
    const int n_res = lt_list(h, desc, la, lb, lc, ws_bytes, res);
    void *a = alloc_filled(G->act, (int64_t)o->M * o->K), *b = alloc_filled(G->act, (int64_t)o->K * o->N);
    void *c = alloc_filled(ct, (int64_t)o->M * o->N), *d = lr ? alloc_filled(K_F32, (int64_t)o->M * o->N) : c;
    double first = -1, best = -1;
    int best_i = -1;
    for (int k = 0; k < n_res; k++) {
      double t = lt_time(h, desc, la, lb, lc, &res[k].algo, b, a, c, d, o->beta, ws, ws_bytes);
      if (k == 0) first = t;
      if (t > 0 && (best < 0 || t < best)) best = t, best_i = k;
    }
    printf("  %-14s M=%6d N=%6d K=%6d  backend %7.3f ms  heuristic's first %7.3f ms  best of %2d %7.3f ms (#%d)  "
           "%+5.1f%% against the backend\n",
           o->name, o->M, o->N, o->K, backend, first, n_res, best, best_i,
           best > 0 ? 100.0 * (best - backend) / backend : 0.0);
    *sum_backend += backend;
    *sum_first += first > 0 ? first : backend;
    *sum_best += best > 0 ? best : backend;
    G->free(G, a), G->free(G, b), G->free(G, c);
    if (lr) G->free(G, d);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  G->free(G, ws);
  cublasLtDestroy(h);
}

// ---------------------------------------------------------------------------------------------
// FP8 (SHAPE fp8)

// N_WARM calls, then N_RUNS timed back to back on the backend's stream: best and median ms.
typedef void (*call_fn)(const void *arg);
static void calls_time(call_fn fn, const void *arg, double *best, double *median) {
  cudaStream_t s = (cudaStream_t)k_cuda_stream_of(G);
  for (int i = 0; i < N_WARM; i++) fn(arg);
  CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < N_RUNS; i++) {
    fn(arg);
    CUDA_CHECK(cudaEventRecord(ev[i + 1], s));
  }
  float ms[N_RUNS];
  runs_ms(ms);
  *best = ms[0];
  *median = 0.5 * (ms[(N_RUNS - 1) / 2] + ms[N_RUNS / 2]);
}

// One FP8 GEMM as gemm_fp8 takes it: C (M,N) = beta C + A (M,K) B (N,K)^T.
typedef struct fp8_gemm {
  int M, N, K;
  const uint8_t *A, *B;
  k_fp8 af, bf;
  const float *a_si, *b_si;
  float beta;
  void *C;
  k_dtype ct;
  int fast;
} fp8_gemm;
static void fp8_gemm_call(const void *p) {
  const fp8_gemm *g = p;
  G->gemm_fp8(G, g->M, g->N, g->K, g->A, g->af, g->a_si, g->B, g->bf, g->b_si, g->beta, NULL, g->C, g->ct, g->fast);
}

typedef struct fp8_cast_args {
  const void *x;
  int64_t rows;
  int cols;
  const float *scale;
  k_fp8 fmt;
  uint8_t *out, *out_t;
  float *amax;
} fp8_cast_args;
static void fp8_cast_call(const void *p) {
  const fp8_cast_args *c = p;
  G->fp8_cast(G, c->x, c->rows, c->cols, c->scale, c->fmt, c->out, c->out_t, c->amax);
}

// The fastest of cuBLASLt's heuristic list (up to 16) for g, laid out as k_cuda_gemm_fp8 lays it
// out ("TN": cuBLASLt's A is our B); best ms, or -1 when none runs. *n_algos: the list's length.
static double fp8_best_algo(const fp8_gemm *g, cublasLtHandle_t h, void *ws, size_t ws_bytes, int *n_algos, int *best_i) {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast = (int8_t)g->fast;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->b_si, sizeof g->b_si));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->a_si, sizeof g->a_si));
  const cudaDataType ta8 = g->af == K_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, tb8 = g->bf == K_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, tb8, g->K, g->N, g->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, ta8, g->K, g->M, g->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, g->ct == K_F32 ? CUDA_R_32F : CUDA_R_16BF, g->N, g->M, g->N));
  cublasLtMatmulHeuristicResult_t res[16];
  const int n_res = lt_list(h, desc, la, lb, lc, ws_bytes, res);
  double best = -1;
  *best_i = -1;
  for (int k = 0; k < n_res; k++) {
    const double t = lt_time(h, desc, la, lb, lc, &res[k].algo, g->B, g->A, g->C, g->C, g->beta, ws, ws_bytes);
    if (t > 0 && (best < 0 || t < best)) best = t, *best_i = k;
  }
  *n_algos = n_res;
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return best;
}

// One projection W (n, k) of a layer with R rows, its bf16 GEMMs as block.c runs them (the
// layer[] rows of main: fwd, dX, dW) and their FP8 forms. Sums its ms into tot: [0] bf16 GEMMs,
// [1] FP8 GEMMs, [2] FP8 GEMMs with the forward's fast accumulation, [3] best algorithms,
// [4] X and dY casts, [5] the W cast.
static void fp8_proj_bench(const char *name, const op bf[3], const attn_bufs *ab, int R, int n, int k, cublasLtHandle_t h,
                           void *ws, size_t ws_bytes, double tot[6]) {
  const k_dtype A = G->act;
  void *x = alloc_filled(A, (int64_t)R * k), *w = alloc_filled(A, (int64_t)n * k), *dy = alloc_filled(A, (int64_t)R * n);
  uint8_t *x8 = G->alloc(G, (size_t)R * k), *x8t = G->alloc(G, (size_t)R * k), *w8 = G->alloc(G, (size_t)n * k),
          *w8t = G->alloc(G, (size_t)n * k), *dy8 = G->alloc(G, (size_t)R * n), *dy8t = G->alloc(G, (size_t)R * n);
  // Scales for the pool's values in [-1, 1): x, w, dy; the inverse ones 16 bytes apart, as
  // cuBLASLt takes scale pointers (fp8_best_algo calls it directly).
  const float sc[3] = {400.0f, 400.0f, 50000.0f}, si[9] = {1 / 400.0f, 0, 0, 0, 1 / 400.0f, 0, 0, 0, 1 / 50000.0f};
  float *d_sc = G->alloc(G, sizeof sc), *d_si = G->alloc(G, sizeof si), *d_amax = G->alloc(G, 3 * sizeof(float));
  G->from_host(G, d_sc, sc, sizeof sc);
  G->from_host(G, d_si, si, sizeof si);
  const fp8_cast_args casts[3] = {{x, R, k, d_sc, K_E4M3, x8, x8t, d_amax}, {w, n, k, d_sc + 1, K_E4M3, w8, w8t, d_amax + 1},
                                  {dy, R, n, d_sc + 2, K_E5M2, dy8, dy8t, d_amax + 2}};
  double cast_ms[3], med;
  for (int i = 0; i < 3; i++) calls_time(fp8_cast_call, &casts[i], &cast_ms[i], &med);
  // fwd: Y (R,n) = X W^T; dX (R,k) = dY (R,n) [W^T (k,n)]^T; dW (n,k) += [dY^T (n,R)] [X^T (k,R)]^T.
  const int resid = bf[0].kind == OP_LINEAR_RESIDUAL;
  void *cy = alloc_filled(resid ? K_F32 : A, (int64_t)R * n), *cdx = alloc_filled(bf[1].c_type, (int64_t)R * k);
  void *cdw = alloc_filled(K_F32, (int64_t)n * k);
  const fp8_gemm g8[3] = {
      {R, n, k, x8, w8, K_E4M3, K_E4M3, d_si, d_si + 4, resid ? 1.0f : 0.0f, cy, resid ? K_F32 : A, 0},
      {R, k, n, dy8, w8t, K_E5M2, K_E4M3, d_si + 8, d_si + 4, 0.0f, cdx, bf[1].c_type, 0},
      {n, k, R, dy8t, x8t, K_E5M2, K_E4M3, d_si + 8, d_si, 1.0f, cdw, K_F32, 0}};
  const char *role[3] = {"fwd", "dX", "dW"};
  for (int i = 0; i < 3; i++) {
    double t16, t8, t8f = -1, tb;
    int n_algos, best_i;
    op_time(&bf[i], ab, &t16, &med);
    calls_time(fp8_gemm_call, &g8[i], &t8, &med);
    if (i == 0) {
      fp8_gemm f = g8[0];
      f.fast = 1;
      calls_time(fp8_gemm_call, &f, &t8f, &med);
    }
    tb = fp8_best_algo(&g8[i], h, ws, ws_bytes, &n_algos, &best_i);
    const double fl = 2.0 * g8[i].M * (double)g8[i].N * g8[i].K;
    printf("  %-8s %-3s M=%6d N=%6d K=%6d %s x %s C=%-4s  bf16 %7.3f ms  fp8 %7.3f ms (%5.0f TFLOP/s, x%.2f)", name,
           role[i], g8[i].M, g8[i].N, g8[i].K, k_fp8_name(g8[i].af), k_fp8_name(g8[i].bf),
           g8[i].ct == K_F32 ? "f32" : "bf16", t16, t8, fl / (t8 * 1e-3) / 1e12, t16 / t8);
    if (t8f > 0) printf("  fast accum %7.3f ms", t8f);
    printf("  best of %2d algos %7.3f ms (#%d)\n", n_algos, tb, best_i);
    tot[0] += t16, tot[1] += t8, tot[2] += t8f > 0 ? t8f : t8, tot[3] += tb > 0 ? tb : t8;
  }
  printf("  %-8s casts with transpose: X (%d x %d, E4M3) %.3f ms, dY (%d x %d, E5M2) %.3f ms, W (%d x %d, E4M3) %.3f ms\n",
         name, R, k, cast_ms[0], R, n, cast_ms[2], n, k, cast_ms[1]);
  tot[4] += cast_ms[0] + cast_ms[2], tot[5] += cast_ms[1];
  void *bufs[] = {x, w, dy, x8, x8t, w8, w8t, dy8, dy8t, d_sc, d_si, d_amax, cy, cdx, cdw};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) G->free(G, bufs[i]);
}

// The four projections of the layer list (rows 0/2/3/4 forward, with their dX and dW rows).
static void fp8_bench(const op *layer, const attn_bufs *ab, int R, int d, int qkvd, int qd, int F, int n_per_step) {
  cublasLtHandle_t h;
  CUBLAS_CHECK(cublasLtCreate(&h));
  const size_t ws_bytes = (size_t)32 << 20;
  void *ws = G->alloc(G, ws_bytes);
  double tot[6] = {0};
  // layer[] order: qkv fwd 0, wo fwd 2, gate|up fwd 3, down fwd 4, down dX 5, down dW 6, gate|up dX 7,
  // gate|up dW 8, wo dX 9, wo dW 10, qkv dX 12, qkv dW 13.
  const op qkv[3] = {layer[0], layer[12], layer[13]}, wo[3] = {layer[2], layer[9], layer[10]};
  const op gu[3] = {layer[3], layer[7], layer[8]}, down[3] = {layer[4], layer[5], layer[6]};
  printf("one layer's projections (rows = B*T = %d), best ms; x: bf16 / fp8\n", R);
  fp8_proj_bench("qkv", qkv, ab, R, qkvd, d, h, ws, ws_bytes, tot);
  fp8_proj_bench("wo", wo, ab, R, d, qd, h, ws, ws_bytes, tot);
  fp8_proj_bench("gate|up", gu, ab, R, 2 * F, d, h, ws, ws_bytes, tot);
  fp8_proj_bench("down", down, ab, R, d, F, h, ws, ws_bytes, tot);
  const double with_casts = tot[1] + tot[4], all = with_casts + tot[5];
  printf("layer: bf16 GEMMs %.3f ms; fp8 GEMMs %.3f ms (x%.2f), fast-accum forward %.3f ms (x%.2f), best algorithms "
         "%.3f ms (x%.2f)\n", tot[0], tot[1], tot[0] / tot[1], tot[2], tot[0] / tot[2], tot[3], tot[0] / tot[3]);
  printf("layer: fp8 GEMMs + X and dY casts %.3f ms (x%.2f); + W casts %.3f ms (x%.2f; the W casts run once per step, "
         "%d micro-batch%s here)\n", with_casts, tot[0] / with_casts, all, tot[0] / all, n_per_step,
         n_per_step > 1 ? "es" : "");
  G->free(G, ws);
  cublasLtDestroy(h);
}

int main(int argc, char **argv) {
  const shape *sh = NULL;
  for (size_t i = 0; (argc == 2 || argc == 3) && i < sizeof shapes / sizeof shapes[0]; i++)
    if (strcmp(argv[1], shapes[i].name) == 0) sh = &shapes[i];
  const int tp = argc == 3 && (strcmp(argv[2], "tp2") == 0 || strcmp(argv[2], "tp4") == 0 || strcmp(argv[2], "tp8") == 0)
                     ? atoi(argv[2] + 2)
                     : 0;
  const int algos = argc == 3 && strcmp(argv[2], "algos") == 0, fp8 = argc == 3 && strcmp(argv[2], "fp8") == 0;
  if (!sh || (argc == 3 && !tp && !algos && !fp8)) {
    fprintf(stderr, "usage: %s 124m|1b|7b-layers [tp2|tp4|tp8|algos|fp8]\n", argv[0]);
    return 2;
  }
  if (k_cuda_device_count() == 0) {
    fprintf(stderr, "bench_ceiling: no GPU visible\n");
    return 1;
  }
  G = k_backend_cuda_create(&(k_backend_opts){.act = K_BF16});
  struct cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double peak = G->peak_tflops > 0 ? G->peak_tflops : 989.4;

  const int B = sh->micro_batch, T = sh->T, d = sh->d, hd = sh->d / sh->nh, F = sh->ffn, V = sh->vocab;
  const int R = B * T, qd = sh->nh * hd, kvd = sh->nkv * hd, qkvd = qd + 2 * kvd;
  const int n_micro = sh->global_batch / sh->micro_batch;
  printf("bench_ceiling: GEMM + attention floor of one training step through the CUDA backend (bf16 act)\n");
  printf("device: %s (%d SMs), dense bf16 peak %.1f TFLOP/s%s\n", prop.name, prop.multiProcessorCount, peak,
         G->peak_tflops > 0 ? "" : " (assumed: device not recognised)");
  printf("shape %s (%s): d %d, %d layers, %d heads, %d kv heads, hd %d, ffn %d, vocab %d%s, seq %d, micro-batch %d, "
         "global batch %d (%d micro-batch%s per step), tp 1, no recomputation\n",
         sh->name, sh->config, d, sh->n_layers, sh->nh, sh->nkv, hd, F, V, sh->tied ? " (tied head)" : "", T, B,
         sh->global_batch, n_micro, n_micro > 1 ? "es" : "");
  printf("timing: %d warm-up + %d timed calls per op, cudaEvents on the backend stream; ms = best, median beside it\n",
         N_WARM, N_RUNS);
  printf("flops: GEMM 2*M*N*K; causal attention fwd 4*B*T^2*nh*hd/2 (the causal half), bwd 2.5 x fwd\n");

  float *host = XMALLOC(sizeof(float) * POOL);
  for (int i = 0; i < POOL; i++) host[i] = rng_uniform();
  pool_f32 = G->alloc(G, sizeof(float) * POOL);
  pool_act = G->alloc(G, k_dtype_bytes(G->act) * POOL);
  G->from_host(G, pool_f32, host, sizeof(float) * POOL);
  G->cast(G, pool_act, G->act, pool_f32, K_F32, POOL);
  free(host);
  for (int i = 0; i <= N_RUNS; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));

  attn_bufs x = {.B = B, .T = T, .nh = sh->nh, .nkv = sh->nkv, .hd = hd, .ld = qkvd};
  x.qkv = alloc_filled(G->act, (int64_t)R * qkvd);
  x.dout = alloc_filled(G->act, (int64_t)R * qd);
  x.o = G->alloc(G, k_dtype_bytes(G->act) * (size_t)R * qd);  // written by attn_fwd, read by attn_bwd
  x.dqkv = G->alloc(G, k_dtype_bytes(G->act) * (size_t)R * qkvd);
  x.lse = G->alloc(G, sizeof(float) * (size_t)B * sh->nh * T);

  if (tp) {
    if (sh->nkv % tp || F % tp || V % tp) {
      fprintf(stderr, "bench_ceiling: %s does not split over tp %d\n", sh->name, tp);
      return 2;
    }
    printf("tp %d with SP: the GEMMs split by rows (heads, ffn and vocabulary over %d; rows = B*T = %d):\n", tp, tp, R);
    tp_split_bench(tp, R, d, (qd + 2 * kvd) / tp, qd / tp, F / tp, V / tp, &x, peak, 370.0);
    return 0;
  }
  // layer_fwd then layer_bwd of block.c, in call order (wo and down add into the residual
  // stream through linear_residual: D = A W^T + C, fp32 C and D).
  const k_dtype A = G->act;
  const op layer[] = {
      {"qkv fwd", OP_GEMM, 0, 1, R, qkvd, d, 0, A},
      {"attn fwd", OP_ATTN_FWD, 0, 0, 0, 0, 0, 0, A},
      {"wo fwd", OP_LINEAR_RESIDUAL, 0, 1, R, d, qd, 1, K_F32},
      {"gate|up fwd", OP_GEMM, 0, 1, R, 2 * F, d, 0, A},
      {"down fwd", OP_LINEAR_RESIDUAL, 0, 1, R, d, F, 1, K_F32},
      {"down dX", OP_GEMM, 0, 0, R, F, d, 0, A},
      {"down dW", OP_GEMM, 1, 0, d, F, R, 1, K_F32},
      {"gate|up dX", OP_GEMM, 0, 0, R, d, 2 * F, 0, K_F32},
      {"gate|up dW", OP_GEMM, 1, 0, 2 * F, d, R, 1, K_F32},
      {"wo dX", OP_GEMM, 0, 0, R, qd, d, 0, A},
      {"wo dW", OP_GEMM, 1, 0, d, qd, R, 1, K_F32},
      {"attn bwd", OP_ATTN_BWD, 0, 0, 0, 0, 0, 0, A},
      {"qkv dX", OP_GEMM, 0, 0, R, d, qkvd, 0, K_F32},
      {"qkv dW", OP_GEMM, 1, 0, qkvd, d, R, 1, K_F32},
  };
  // model_chunk_fwd / model_chunk_bwd's head: logits, then dX and dW from the logits' gradient.
  const op head[] = {
      {"head fwd", OP_GEMM, 0, 1, R, V, d, 0, A},
      {"head dX", OP_GEMM, 0, 0, R, d, V, 0, K_F32},
      {"head dW", OP_GEMM, 1, 0, V, d, R, 1, K_F32},
  };
  if (fp8) {
    fp8_bench(layer, &x, R, d, qkvd, qd, F, n_micro);
    return 0;
  }
  if (algos) {
    double lb = 0, lf = 0, lbest = 0, hb = 0, hf = 0, hbest = 0;
    printf("one layer's GEMMs (rows = B*T = %d): the backend's call against cuBLASLt's algorithms, best ms:\n", R);
    algos_bench(layer, (int)(sizeof layer / sizeof layer[0]), &x, &lb, &lf, &lbest);
    printf("head:\n");
    algos_bench(head, (int)(sizeof head / sizeof head[0]), &x, &hb, &hf, &hbest);
    const double sb = n_micro * (sh->n_layers * lb + hb), sf = n_micro * (sh->n_layers * lf + hf),
                 sbest = n_micro * (sh->n_layers * lbest + hbest);
    printf("per step: backend %.3f ms, heuristic's first %.3f ms (%+.1f%%), best of its list %.3f ms (%+.1f%%)\n", sb,
           sf, 100.0 * (sf - sb) / sb, sbest, 100.0 * (sbest - sb) / sb);
    return 0;
  }
  double l_best, l_med, l_fl, h_best, h_med, h_fl;
  printf("one layer (rows = B*T = %d):\n", R);
  ops_bench(layer, (int)(sizeof layer / sizeof layer[0]), &x, peak, &l_best, &l_med, &l_fl);
  printf("  %-14s %8.3f ms (median %8.3f)  %6.1f TFLOP/s  %5.1f%% of peak\n", "layer total", l_best, l_med,
         l_fl / (l_best * 1e-3) / 1e12, 100.0 * l_fl / (l_best * 1e-3) / 1e12 / peak);
  k_cudnn_attn_info fi, bi;
  const k_cudnn_attn *ca = k_cuda_cudnn_attn_of(G);
  if (k_cudnn_attn_info_get(ca, 0, B, T, sh->nh, sh->nkv, hd, qkvd, &fi) == 0 &&
      k_cudnn_attn_info_get(ca, 1, B, T, sh->nh, sh->nkv, hd, qkvd, &bi) == 0)
    printf("  attention ran on cuDNN's fused engines (fwd engine %lld, bwd engine %lld, %s backward)\n",
           (long long)fi.engine, (long long)bi.engine, bi.deterministic ? "deterministic" : "nondeterministic");
  else
    printf("  attention ran on the backend's own kernel (cuDNN refused the shape)\n");
  printf("head:\n");
  ops_bench(head, (int)(sizeof head / sizeof head[0]), &x, peak, &h_best, &h_med, &h_fl);

  // The step: every micro-batch runs every layer and the head once (forward and backward).
  const double floor_ms = n_micro * (sh->n_layers * l_best + h_best);
  const double floor_med = n_micro * (sh->n_layers * l_med + h_med);
  const double step_flops = n_micro * (sh->n_layers * l_fl + h_fl);
  const double tokens = (double)sh->global_batch * T;
  // The MFU convention of app/train.c and docs/benchmarks.md: 6 N + 12 L d T flops per token,
  // N the parameters without the embedding table (the head counts unless tied).
  model_config mc = {.dim = d, .n_layers = sh->n_layers, .n_heads = sh->nh, .n_kv_heads = sh->nkv, .ffn_dim = F,
                  .vocab_size = V, .seq_len = T, .tie_embeddings = sh->tied};
  int64_t n_no_embed = 0;
  model_count_params(&mc, &n_no_embed);
  const double model_fpt = 6.0 * n_no_embed + 12.0 * sh->n_layers * (double)d * T;
  const double tps = tokens / (floor_ms * 1e-3);
  printf("step (%d x (%d layers x layer + head)):\n", n_micro, sh->n_layers);
  printf("  GEMM + attention floor per step (ms): %.3f (from medians %.3f)\n", floor_ms, floor_med);
  const double exec_tf = step_flops / (floor_ms * 1e-3) / 1e12;
  printf("  executed GEMM + attention flops: %.3f TFLOP per step, %.1f TFLOP/s at the floor (%.1f%% of peak)\n",
         step_flops / 1e12, exec_tf, 100.0 * exec_tf / peak);
  printf("  tokens per step %.0f -> tokens/s ceiling %.0f\n", tokens, tps);
  printf("  model flops per token 6N + 12*L*d*T = %.4g (N = %.2fM without the embedding) -> MFU ceiling %.1f%% "
         "(%.1f TFLOP/s of %.1f)\n",
         model_fpt, n_no_embed / 1e6, 100.0 * tps * model_fpt / 1e12 / peak, tps * model_fpt / 1e12, peak);

  for (int i = 0; i <= N_RUNS; i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
  G->free(G, x.qkv), G->free(G, x.dout), G->free(G, x.o), G->free(G, x.dqkv), G->free(G, x.lse);
  G->free(G, pool_act), G->free(G, pool_f32);
  k_backend_free(&G);
  return 0;
}
