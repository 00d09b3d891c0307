// The backend's cuBLASLt calls. A linear layer that adds into the fp32 residual stream in one
// call: D = A W^T + C, with C and D separate fp32 buffers (cuBLAS's GemmEx has one C, so the
// residual would first be copied into the output); A and W in the act dtype, fp32 accumulation;
// semantics of k_cpu_linear_residual (kernels/cpu/ops_cpu.h). And the FP8 GEMM (gemm_fp8,
// semantics of k_cpu_gemm_fp8 in kernels/cpu/fp8_cpu.h), which only cuBLASLt offers.
// Descriptors and the heuristic's algorithm are cached per problem in the backend's context
// (k_cuda_ctx.lt, with its cuBLASLt handle; made on the first call): the same problem always
// runs the same algorithm, and reductions that accumulate into the output buffer in place are
// excluded, so results are run-to-run reproducible. linear_residual shapes the heuristic has no
// algorithm for fall back to a copy and k_cuda_gemm with beta = 1; FP8 GEMMs have no fallback.
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cublasLt.h>
#include <string.h>

enum { LT_CACHE = 64, LT_FP8_CACHE = 64 };

typedef struct {
  int used, M, N, K;
  k_dtype act;
  int ok;  // an algorithm was found
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

// One FP8 problem: the shape, formats, C dtype, whether C is read, fast accumulation and the
// operands' alignment (the heuristic may pick kernels that need more than 16 bytes).
typedef struct {
  int M, N, K, a_fmt, b_fmt, c_type, beta_nz, fast_accum, align;
  int a_tile, b_tile;  // block scaling (gemm_fp8_block): 1 or 128; 0 = per-tensor scales
} fp8_key;

typedef struct {
  fp8_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} fp8_plan;

struct k_cuda_lt {
  cublasLtHandle_t h;
  int n;
  lt_plan plans[LT_CACHE];
  int n_fp8, next_fp8;  // plans made; the slot a new problem takes once all are (oldest first)
  fp8_plan fp8[LT_FP8_CACHE];
  float *fp8_scales;    // (8) device: 16-byte aligned copies of scales that are not (see k_cuda_gemm_fp8)
};

static k_cuda_lt *lt_of(k_cuda_ctx *cx) {
  if (!cx->lt) {
    cx->lt = (k_cuda_lt *)calloc(1, sizeof *cx->lt);
    CHECK(cx->lt != NULL, "out of host memory for the cuBLASLt plan cache");
  }
  if (!cx->lt->h) CUBLAS_CHECK(cublasLtCreate(&cx->lt->h));
  return cx->lt;
}

// The first algorithm of cuBLASLt's heuristic for op on a, b and c (C and D alike) within the
// backend's workspace, deterministic reduction schemes only, every operand aligned to align
// bytes (0: not stated). Returns whether there is one (*st: the heuristic's status).
static int lt_first_algo(k_cuda_ctx *cx, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                         cublasLtMatrixLayout_t c, uint32_t align, cublasLtMatmulAlgo_t *algo, cublasStatus_t *st) {
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = cx->cublas_ws_bytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; align && i < 4; i++) CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align));
  cublasLtMatmulHeuristicResult_t res;
  int n_res = 0;
  *st = cublasLtMatmulAlgoGetHeuristic(lt_of(cx)->h, op, a, b, c, c, pref, 1, &res, &n_res);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (*st != CUBLAS_STATUS_SUCCESS || n_res < 1) return 0;
  *algo = res.algo;
  return 1;
}

static lt_plan *lt_plan_get(k_cuda_ctx *cx, int M, int N, int K) {
  k_cuda_lt *lt = lt_of(cx);
  for (int i = 0; i < lt->n; i++) {
    lt_plan *p = &lt->plans[i];
    if (p->M == M && p->N == N && p->K == K && p->act == cx->act) return p;
  }
  if (lt->n == LT_CACHE) return NULL;  // more shapes than a model has: take the fallback
  lt_plan *p = &lt->plans[lt->n++];
  memset(p, 0, sizeof *p);
  p->used = 1, p->M = M, p->N = N, p->K = K, p->act = cx->act;
  // Row-major D (M,N) is column-major D^T (N,M): D^T = W A^T, W read transposed from its (N,K)
  // rows (column-major (K,N), ld K), A^T as stored (column-major (K,M), ld K).
  const cudaDataType ab = cx->act == K_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = cx->act == K_BF16 ? CUBLAS_COMPUTE_32F : cx->gemm_compute;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, K, N, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, K, M, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, M, N));
  cublasStatus_t st;
  p->ok = lt_first_algo(cx, p->op, p->a, p->b, p->c, 0, &p->algo, &st);
  return p;
}

extern "C" void k_cuda_linear_residual(k_backend *b, int M, int N, int K, const void *A, const void *W, const float *C, float *D) {
  CHECK(M >= 0 && N >= 0 && K >= 0, "linear_residual shape M=%d N=%d K=%d must be non-negative", M, N, K);
  if (M == 0 || N == 0) return;
  k_cuda_ctx *cx = k_cuda_ctx_of(b);
  lt_plan *p = K > 0 ? lt_plan_get(cx, M, N, K) : NULL;
  if (!p || !p->ok) {
    if (D != C)
      CUDA_CHECK(cudaMemcpyAsync(D, C, sizeof(float) * (size_t)M * N, cudaMemcpyDeviceToDevice, cx->stream));
    k_cuda_gemm(b, 0, 1, M, N, K, 1.0f, A, K, W, K, 1.0f, D, N, K_F32);
    return;
  }
  const float one = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cx->lt->h, p->op, &one, W, p->a, A, p->b, &one, C, p->c, D, p->c, &p->algo, cx->cublas_ws,
                              cx->cublas_ws_bytes, cx->stream));
}

// ---------------------------------------------------------------------------------------------
// FP8 GEMM. Row-major C (M,N) = A (M,K) B (N,K)^T is column-major C^T (N,M) = B A^T: cuBLASLt's
// first operand is B, read transposed from its (N,K) rows (column-major (K,N), ld K), its second
// A as stored (column-major (K,M), ld K): op(first) = T, op(second) = N, the "TN" layout Hopper's
// FP8 kernels require, with K contiguous in both. So cuBLASLt's A scale is b_scale_inv and its B
// scale a_scale_inv. fp32 compute and scale type, C and D one descriptor (D is C, or C is read
// from c_in apart).

static cudaDataType fp8_type(int f) { return f == K_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

static void fp8_plan_free(fp8_plan *p) {
  cublasLtMatrixLayoutDestroy(p->a);
  cublasLtMatrixLayoutDestroy(p->b);
  cublasLtMatrixLayoutDestroy(p->c);
  cublasLtMatmulDescDestroy(p->op);
}

// The plan of problem k, made on its first call (whose scale pointers the heuristic sees; every
// call sets its own before it runs).
static fp8_plan *fp8_plan_get(k_cuda_ctx *cx, const fp8_key *k, const float *a_scale_inv, const float *b_scale_inv) {
  k_cuda_lt *lt = lt_of(cx);
  for (int i = 0; i < lt->n_fp8; i++)
    if (memcmp(&lt->fp8[i].key, k, sizeof *k) == 0) return &lt->fp8[i];
  fp8_plan *p;
  if (lt->n_fp8 < LT_FP8_CACHE) {
    p = &lt->fp8[lt->n_fp8++];
  } else {  // more problems than a model has (tests): reuse the oldest slot, planned afresh
    p = &lt->fp8[lt->next_fp8];
    lt->next_fp8 = (lt->next_fp8 + 1) % LT_FP8_CACHE;
    CUDA_CHECK(cudaStreamSynchronize(cx->stream));  // queued matmuls may still read the descriptors
    fp8_plan_free(p);
  }
  memset(p, 0, sizeof *p);
  p->key = *k;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int8_t fast = (int8_t)(k->fast_accum != 0);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  if (k->a_tile) {  // cuBLASLt's A is our B: its scale mode is b_tile's
    const int32_t am = k->b_tile == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t bm = k->a_tile == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
  }
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, fp8_type(k->b_fmt), k->K, k->N, k->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, fp8_type(k->a_fmt), k->K, k->M, k->K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, k->c_type == K_BF16 ? CUDA_R_16BF : CUDA_R_32F, k->N, k->M, k->N));
  cublasStatus_t st;
  CHECK(lt_first_algo(cx, p->op, p->a, p->b, p->c, (uint32_t)k->align, &p->algo, &st),
        "gemm_fp8: cuBLASLt has no FP8 algorithm for M=%d N=%d K=%d A %s B %s C %s beta %s fast_accum %d tiles %d %d "
        "(status %s): FP8 GEMMs need compute capability 8.9 or later and cuBLASLt 12.1 or later; block scaling (tiles "
        "1 / 128) Hopper and cuBLASLt 12.9 or later",
        k->M, k->N, k->K, k_fp8_name((k_fp8)k->a_fmt), k_fp8_name((k_fp8)k->b_fmt), k->c_type == K_BF16 ? "bf16" : "f32",
        k->beta_nz ? "!= 0" : "0", k->fast_accum, k->a_tile, k->b_tile, cublasGetStatusName(st));
  return p;
}

// The largest power of two, up to 256, that divides every address: the alignment the plan's
// kernels may assume.
static int fp8_align(const void *A, const void *B, const void *C, const void *c_in) {
  const uintptr_t u = (uintptr_t)A | (uintptr_t)B | (uintptr_t)C | (uintptr_t)c_in | 256;
  return (int)(u & (~u + 1));
}

extern "C" void k_cuda_gemm_fp8(k_backend *b, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, const float *a_scale_inv,
                                const uint8_t *B, k_fp8 b_fmt, const float *b_scale_inv, float beta, const void *c_in,
                                void *C, k_dtype c_type, int fast_accum) {
  char msg[256];
  CHECK(!k_fp8_gemm_check(M, N, K, a_fmt, b_fmt, A, B, C, msg, sizeof msg), "%s", msg);
  if (!c_in) c_in = C;
  CHECK((uintptr_t)c_in % 16 == 0, "gemm_fp8: C's input at %p is not 16-byte aligned (FP8 GEMMs need it)", c_in);
  k_cuda_ctx *cx = k_cuda_ctx_of(b);
  CHECK(c_type == cx->act || c_type == K_F32, "gemm_fp8: C dtype %d must be the act dtype (%d) or K_F32", (int)c_type,
        (int)cx->act);
  CHECK(a_scale_inv != NULL && b_scale_inv != NULL, "gemm_fp8: the scale pointers must be set (device memory)");
  // cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED, seen on an H100 with cuBLAS 13.1) scale
  // pointers that are not 16-byte aligned, as a scale taken from an array of them is: those are
  // copied, in stream order, to an aligned pair of the context's own.
  if (((uintptr_t)a_scale_inv | (uintptr_t)b_scale_inv) % 16 != 0) {
    k_cuda_lt *lt = lt_of(cx);
    if (!lt->fp8_scales) CUDA_CHECK(cudaMalloc(&lt->fp8_scales, 8 * sizeof(float)));
    CUDA_CHECK(cudaMemcpyAsync(lt->fp8_scales, a_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, cx->stream));
    CUDA_CHECK(cudaMemcpyAsync(lt->fp8_scales + 4, b_scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, cx->stream));
    a_scale_inv = lt->fp8_scales;
    b_scale_inv = lt->fp8_scales + 4;
  }
  fp8_key k;
  memset(&k, 0, sizeof k);  // compared with memcmp
  k.M = M, k.N = N, k.K = K, k.a_fmt = a_fmt, k.b_fmt = b_fmt, k.c_type = c_type, k.beta_nz = beta != 0.0f;
  k.fast_accum = fast_accum != 0, k.align = fp8_align(A, B, C, c_in);
  fp8_plan *p = fp8_plan_get(cx, &k, a_scale_inv, b_scale_inv);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv));
  const float one = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cx->lt->h, p->op, &one, B, p->a, A, p->b, &beta, c_in, p->c, C, p->c, &p->algo, cx->cublas_ws,
                              cx->cublas_ws_bytes, cx->stream));
}

// Block-scaled FP8 GEMM: the plan of gemm_fp8 with the operands' scale modes (each tile 1 ->
// VEC128_32F, 128 -> BLK128x128_32F; the scale arrays in the layouts of kernels/cpu/fp8_cpu.h),
// E4M3 both, no fast accumulation (cuBLASLt's block-scaled kernels take none).
extern "C" void k_cuda_gemm_fp8_block(k_backend *b, int M, int N, int K, const uint8_t *A, int a_tile,
                                      const float *a_scale_inv, const uint8_t *B, int b_tile, const float *b_scale_inv,
                                      float beta, void *C, k_dtype c_type) {
  char msg[256];
  CHECK(!k_fp8_gemm_block_check(M, N, K, a_tile, b_tile, A, B, C, msg, sizeof msg), "%s", msg);
  k_cuda_ctx *cx = k_cuda_ctx_of(b);
  CHECK(c_type == cx->act || c_type == K_F32, "gemm_fp8_block: C dtype %d must be the act dtype (%d) or K_F32",
        (int)c_type, (int)cx->act);
  CHECK(a_scale_inv != NULL && b_scale_inv != NULL && ((uintptr_t)a_scale_inv | (uintptr_t)b_scale_inv) % 16 == 0,
        "gemm_fp8_block: the scale arrays must be set and 16-byte aligned (device memory)");
  fp8_key k;
  memset(&k, 0, sizeof k);
  k.M = M, k.N = N, k.K = K, k.a_fmt = K_E4M3, k.b_fmt = K_E4M3, k.c_type = c_type, k.beta_nz = beta != 0.0f;
  k.align = fp8_align(A, B, C, C), k.a_tile = a_tile, k.b_tile = b_tile;
  fp8_plan *p = fp8_plan_get(cx, &k, a_scale_inv, b_scale_inv);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv, sizeof b_scale_inv));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv, sizeof a_scale_inv));
  const float one = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cx->lt->h, p->op, &one, B, p->a, A, p->b, &beta, C, p->c, C, p->c, &p->algo, cx->cublas_ws,
                              cx->cublas_ws_bytes, cx->stream));
}

void k_cuda_lt_free(k_cuda_lt **ltp) {
  if (!ltp || !*ltp) return;
  k_cuda_lt *lt = *ltp;
  for (int i = 0; i < lt->n; i++) {
    lt_plan *p = &lt->plans[i];
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->op);
  }
  for (int i = 0; i < lt->n_fp8; i++) fp8_plan_free(&lt->fp8[i]);
  if (lt->fp8_scales) CUDA_CHECK(cudaFree(lt->fp8_scales));
  if (lt->h) cublasLtDestroy(lt->h);
  free(lt);
  *ltp = NULL;
}
