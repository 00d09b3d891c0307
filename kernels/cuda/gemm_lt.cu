// A linear layer that adds into the fp32 residual stream in one cuBLASLt call: D = A W^T + C,
// with C and D separate fp32 buffers (cuBLAS's GemmEx has one C, so the residual would first be
// copied into the output). A and W in the act dtype, fp32 accumulation. Semantics of
// k_cpu_linear_residual (kernels/cpu/ops_cpu.h).
// Descriptors and the heuristic's algorithm are cached per (M, N, K, act dtype) in the backend's
// context (k_cuda_ctx.lt, with its cuBLASLt handle; made on the first call): the same shape
// always runs the same algorithm, and reductions that accumulate into the output buffer in
// place are excluded, so results are run-to-run reproducible. Shapes the heuristic has no
// algorithm for fall back to a copy and k_cuda_gemm with beta = 1.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cublasLt.h>
#include <string.h>

enum { LT_CACHE = 64 };

typedef struct {
  int used, M, N, K;
  k_dtype act;
  int ok;  // an algorithm was found
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

struct k_cuda_lt {
  cublasLtHandle_t h;
  int n;
  lt_plan plans[LT_CACHE];
};

static lt_plan *lt_plan_get(k_cuda_ctx *cx, int M, int N, int K) {
  if (!cx->lt) {
    cx->lt = (k_cuda_lt *)calloc(1, sizeof *cx->lt);
    CHECK(cx->lt != NULL, "out of host memory for the cuBLASLt plan cache");
  }
  k_cuda_lt *lt = cx->lt;
  for (int i = 0; i < lt->n; i++) {
    lt_plan *p = &lt->plans[i];
    if (p->M == M && p->N == N && p->K == K && p->act == cx->act) return p;
  }
  if (!lt->h) CUBLAS_CHECK(cublasLtCreate(&lt->h));
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
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = cx->cublas_ws_bytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  cublasLtMatmulHeuristicResult_t res;
  int n_res = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt->h, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n_res);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  p->ok = st == CUBLAS_STATUS_SUCCESS && n_res > 0;
  if (p->ok) p->algo = res.algo;
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
  if (lt->h) cublasLtDestroy(lt->h);
  free(lt);
  *ltp = NULL;
}
