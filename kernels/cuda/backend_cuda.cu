// The CUDA backend: its context (one non-blocking stream, a cuBLAS handle, scratch, the options
// it was created with and the caches of the modules it owns), device memory, the table of ops
// (kernels/cuda/ops_cuda.h) and the GEMM on cuBLAS. Activations (the table's void * tensors) are
// in the dtype k_backend_opts.act chose, bf16 or fp32; everything else is fp32.
// Every op takes its backend and runs on that backend's stream, scratch, options and caches, so
// nothing here is process-wide: a test may hold an fp32 and a bf16 backend at once. A process
// that trains drives one GPU, through one backend.
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/attn_decode.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/optim_cuda.h"
#include "kernels/cuda/host_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cpu/fp8_cpu.h"  // k_fp8_device_check
#include "kernels/cuda/attn_cudnn.h"

#include <string.h>

// 32 MiB, the workspace NVIDIA recommends for Hopper. A fixed workspace makes cuBLAS pick the
// same kernels (and so the same bits) on every run.
static const size_t k_cublas_ws_bytes = (size_t)32 << 20;

void *k_cuda_scratch(k_cuda_ctx *c, size_t n_bytes) {
  if (n_bytes <= c->scratch_bytes) return c->scratch;
  // Kernels already queued may still read the old buffer: wait for them before freeing it.
  CUDA_CHECK(cudaStreamSynchronize(c->stream));
  CUDA_CHECK(cudaFree(c->scratch));
  const size_t mib = (size_t)1 << 20;
  c->scratch_bytes = (n_bytes + mib - 1) / mib * mib;
  CUDA_CHECK(cudaMalloc(&c->scratch, c->scratch_bytes));
  return c->scratch;
}

// ---------------------------------------------------------------------------------------------
// Memory. Pointers given to from_host/to_host are ordinary (pageable) host memory: a pageable
// host-to-device cudaMemcpyAsync returns once the source is staged, so the caller may reuse it
// at once; device-to-host is followed by a stream sync because the caller reads the result.
// Backend memory may also be pinned host memory (host_alloc, e.g. offloaded master weights):
// every copy is cudaMemcpyDefault, which finds the direction from the pointers.

static int64_t cuda_mem_held(k_backend *b) { return k_cuda_ctx_of(b)->held.total; }
static void cuda_mem_held_by_kind(k_backend *b, int64_t bytes[K_MEM_KINDS]) {
  k_held_by_kind(&k_cuda_ctx_of(b)->held, bytes);
}
static k_mem_kind cuda_mem_kind(k_backend *b, k_mem_kind kind) { return k_held_set_kind(&k_cuda_ctx_of(b)->held, kind); }

static void *cuda_alloc(k_backend *b, size_t n_bytes) {
  void *p = NULL;
  cudaError_t rc = cudaMalloc(&p, n_bytes ? n_bytes : 1);
  if (rc == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();  // clear the failed allocation's error before asking for the free memory
    cudaMemGetInfo(&free_b, &total_b);
    CHECK(0,
          "out of GPU memory: %.2f GiB asked, %.2f GiB free of %.2f GiB on %s; --dry-run shows what the run needs "
          "(with --gpu-mem GIB, which parallel.shard mode fits): lower train.micro_batch, set train.recompute, "
          "parallel.shard (grads or weights, with dp > 1), optimizer.offload=host, or spread the model over more GPUs",
          n_bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0, b->device_name);
  }
  CUDA_CHECK(rc);
  // Zero-filled is the contract (the CPU backend uses calloc); ordered before any op on the stream.
  if (n_bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, n_bytes, k_cuda_ctx_of(b)->stream));
  k_held_add(&k_cuda_ctx_of(b)->held, p, (int64_t)n_bytes);
  return p;
}

static void cuda_free(k_backend *b, void *p) {
  if (!p) return;
  k_held_remove(&k_cuda_ctx_of(b)->held, p);
  CUDA_CHECK(cudaFree(p));  // cudaFree waits for work in flight that may use p
}

static void cuda_to_host(k_backend *b, void *dst_host, const void *src, size_t n_bytes) {
  if (!n_bytes) return;
  cudaStream_t s = k_cuda_ctx_of(b)->stream;
  CUDA_CHECK(cudaMemcpyAsync(dst_host, src, n_bytes, cudaMemcpyDefault, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

static void cuda_from_host(k_backend *b, void *dst, const void *src_host, size_t n_bytes) {
  if (!n_bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src_host, n_bytes, cudaMemcpyDefault, k_cuda_ctx_of(b)->stream));
}

static void cuda_copy(k_backend *b, void *dst, const void *src, size_t n_bytes) {
  if (!n_bytes || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDefault, k_cuda_ctx_of(b)->stream));
}

static void cuda_zero(k_backend *b, void *p, size_t n_bytes) {
  if (n_bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, n_bytes, k_cuda_ctx_of(b)->stream));
}

static void cuda_sync(k_backend *b) { CUDA_CHECK(cudaStreamSynchronize(k_cuda_ctx_of(b)->stream)); }

// ---------------------------------------------------------------------------------------------
// GEMM

// C = beta * C for K == 0 or alpha == 0, as the CPU reference (and BLAS) define them; beta == 0
// writes zeros without reading C, so NaNs in C do not survive.
template <typename E>
__global__ void k_gemm_scale_c(int M, int N, float beta, E *C, int ldc) {
  const int64_t n = (int64_t)M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    E *c = C + (i / N) * ldc + i % N;
    *c = k_st<E>(beta == 0.0f ? 0.0f : beta * k_ld(*c));
  }
}

static cudaDataType k_cuda_data_type(k_dtype t) { return t == K_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Row-major C (M,N) is column-major C^T (N,M) with the same leading dimension, so
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: cuBLAS's first
// operand is B (its op is trans_b, ld ldb), its second A (op trans_a, ld lda), m = N, n = M.
// A and B are in the act dtype, C in c_type (act, or fp32 for bf16 x bf16 -> fp32); the
// accumulation is fp32 (CUBLAS_COMPUTE_32F: bf16 inputs run on the tensor cores at full rate),
// split-K reductions included (see the math mode set at creation), so a bf16 C is rounded once.
// Any leading dimension works, but bf16 operands reach the fast kernels only when every ld is a
// multiple of 8 elements and the pointers are 16-byte aligned.
extern "C" void k_cuda_gemm(k_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                            const void *B, int ldb, float beta, void *C, int ldc, k_dtype c_type) {
  CHECK(M >= 0 && N >= 0 && K >= 0, "gemm shape M=%d N=%d K=%d must be non-negative", M, N, K);
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  CHECK(c_type == c->act || c_type == K_F32, "gemm: C dtype %d must be the act dtype (%d) or K_F32", (int)c_type,
        (int)c->act);
  if (M == 0 || N == 0) return;
  CHECK(ldc >= N, "gemm ldc=%d < N=%d", ldc, N);
  CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N), "gemm lda=%d or ldb=%d too small for M=%d N=%d K=%d",
        lda, ldb, M, N, K);
  if (K == 0 || alpha == 0.0f) {
    const unsigned nb = k_cuda_blocks((int64_t)M * N, K_CUDA_THREADS);
    if (c_type == K_BF16)
      k_gemm_scale_c<k_bf16><<<nb, K_CUDA_THREADS, 0, c->stream>>>(M, N, beta, (k_bf16 *)C, ldc);
    else
      k_gemm_scale_c<float><<<nb, K_CUDA_THREADS, 0, c->stream>>>(M, N, beta, (float *)C, ldc);
    CUDA_LAUNCH_CHECK("k_gemm_scale_c");
    return;
  }
  const cudaDataType ab = k_cuda_data_type(c->act);
  const cublasComputeType_t compute = c->act == K_BF16 ? CUBLAS_COMPUTE_32F : c->gemm_compute;
  CUBLAS_CHECK(cublasGemmEx(c->cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                            M, K, &alpha, B, ab, ldb, A, ab, lda, &beta, C, k_cuda_data_type(c_type), ldc, compute,
                            CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------
// Creation

extern "C" int k_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: not an error here, clear it
    return 0;
  }
  return n;
}

extern "C" int k_cuda_device_fp8_check(int device, char *err, size_t n_err) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    snprintf(err, n_err, "CUDA device %d: %s (check the driver and CUDA_VISIBLE_DEVICES)", device,
             cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  return k_fp8_device_check(prop.name, prop.major, prop.minor, err, n_err) ? -1 : 0;
}

static int64_t cuda_mem_used(k_backend *b) {
  (void)b;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return (int64_t)(total_bytes - free_bytes);
}

// Attention: cuDNN's fused flash attention for bf16 activations (deterministic backward unless
// opts.attn_atomic), the own tiled kernel for fp32 activations, for shapes cuDNN refuses, or with
// opts.attn_own. The cuDNN state (handle, plans, workspace) is made on the first call that may use it.
static k_cudnn_attn *cudnn_attn_of(k_cuda_ctx *c) {
  if (c->attn_own || c->act != K_BF16) return NULL;
  if (!c->cudnn) {
    c->cudnn = k_cudnn_attn_create();
    k_cudnn_attn_set_deterministic(c->cudnn, !c->attn_atomic);
  }
  return c->cudnn;
}

static void attn_fwd(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B, int T,
                     int nh, int nkv, int hd) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cudnn_attn *a = cudnn_attn_of(c);
  if (a && k_cudnn_attn_fwd(a, q, k, v, ld, o, lse, B, T, nh, nkv, hd, c->stream) == 0) return;
  k_cuda_attn_fwd(b, q, k, v, ld, o, lse, B, T, nh, nkv, hd);
}

static void attn_bwd(k_backend *b, const void *dout, const void *q, const void *k, const void *v, int64_t ld, const void *o,
                     const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh, int nkv, int hd) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cudnn_attn *a = cudnn_attn_of(c);
  if (a && k_cudnn_attn_bwd(a, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd, c->stream) == 0) return;
  k_cuda_attn_bwd(b, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
}

static void cuda_release(k_backend *b) {
  k_cuda_ctx *c = (k_cuda_ctx *)b->ctx;
  if (!c) return;
  CUDA_CHECK(cudaStreamSynchronize(c->stream));
  k_cuda_lt_free(&c->lt);
  k_cudnn_attn_free(&c->cudnn);
  k_cuda_optim_free(&c->optim);
  k_cuda_lane_free(&c->copy);
  k_cuda_lane_free(&c->side);
  CUBLAS_CHECK(cublasDestroy(c->cublas));
  CUDA_CHECK(cudaFree(c->cublas_ws));
  CUDA_CHECK(cudaFree(c->scratch));
  CUDA_CHECK(cudaStreamDestroy(c->stream));
  k_held_free(&c->held);
  free(c);
  b->ctx = NULL;
}

extern "C" void *k_cuda_stream_of(const k_backend *b) { return (void *)k_cuda_ctx_of(b)->stream; }

extern "C" k_cudnn_attn *k_cuda_cudnn_attn_of(const k_backend *b) { return k_cuda_ctx_of(b)->cudnn; }

extern "C" k_backend *k_backend_cuda_create(const k_backend_opts *o) {
  const k_backend_opts defaults = {};
  if (!o) o = &defaults;
  const k_dtype act = o->act;
  const int device = o->device;
  CHECK(act == K_F32 || act == K_BF16, "CUDA backend: unknown activation dtype %d", (int)act);
  const int n_dev = k_cuda_device_count();
  CHECK(device >= 0 && device < n_dev, "CUDA device %d requested but %d visible (check CUDA_VISIBLE_DEVICES)",
        device, n_dev);
  CUDA_CHECK(cudaSetDevice(device));
  k_cuda_ctx *c = (k_cuda_ctx *)XCALLOC(1, sizeof *c);
  c->device = device;
  c->act = act;
  c->attn_own = o->attn_own != 0;
  c->attn_atomic = o->attn_atomic != 0;
  // Non-blocking: the legacy default stream (used by stray library calls) must not serialise with it.
  CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&c->cublas));
  CUBLAS_CHECK(cublasSetStream(c->cublas, c->stream));  // resets the workspace, so set it after
  c->cublas_ws_bytes = k_cublas_ws_bytes;
  CUDA_CHECK(cudaMalloc(&c->cublas_ws, c->cublas_ws_bytes));
  CUBLAS_CHECK(cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_bytes));
  // bf16 outputs: without this flag cuBLAS may pick split-K kernels that add the partial sums
  // in bf16 (reduced-precision reduction), several roundings of sums larger than the result;
  // with it every reduction is fp32 and a bf16 C is rounded once, at the end.
  CUBLAS_CHECK(cublasSetMathMode(
      c->cublas, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  // With fp32 activations, full fp32 GEMMs by default so that GPU runs track the CPU reference;
  // TF32 is an opt-in speed-up. bf16 activations always accumulate in fp32.
  c->gemm_compute = o->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

  k_backend *b = (k_backend *)XCALLOC(1, sizeof *b);
  b->name = "cuda";
  b->ctx = c;
  b->release = cuda_release;
  b->alloc = cuda_alloc;
  b->free = cuda_free;
  b->to_host = cuda_to_host;
  b->from_host = cuda_from_host;
  b->copy = cuda_copy;
  b->zero = cuda_zero;
  b->sync = cuda_sync;
  b->mem_used = cuda_mem_used;
  b->mem_held = cuda_mem_held;
  b->mem_held_by_kind = cuda_mem_held_by_kind;
  b->mem_kind = cuda_mem_kind;
  b->host_alloc = k_cuda_host_alloc;
  b->host_free = k_cuda_host_free;
  b->copy_async = k_cuda_copy_async;
  b->copy_wait = k_cuda_copy_wait;
  b->copy_join = k_cuda_copy_join;
  b->copy_join_ticket = k_cuda_copy_join_ticket;
  b->side_begin = k_cuda_side_begin;
  b->side_end = k_cuda_side_end;
  b->side_join_ticket = k_cuda_side_join_ticket;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  snprintf(b->device_name, sizeof b->device_name, "%.127s", prop.name);
  k_backend_set_peak(b, o->peak_tflops);
  b->act = act;
  b->gemm = k_cuda_gemm;
  b->linear_residual = k_cuda_linear_residual;
  b->cast = k_cuda_cast;
  b->rmsnorm_bwd = k_cuda_rmsnorm_bwd;
  b->rmsnorm_fwd_act = k_cuda_rmsnorm_fwd_act;
  b->rmsnorm_bwd_act = k_cuda_rmsnorm_bwd_act;
  b->rope = k_cuda_rope;
  b->attn_fwd = attn_fwd;
  b->attn_bwd = attn_bwd;
  b->attn_decode = k_cuda_attn_decode;
  b->swiglu_fwd = k_cuda_swiglu_fwd;
  b->swiglu_bwd = k_cuda_swiglu_bwd;
  b->embed_fwd = k_cuda_embed_fwd;
  b->embed_bwd = k_cuda_embed_bwd;
  b->ce_local_stats = k_cuda_ce_local_stats;
  b->ce_bwd = k_cuda_ce_bwd;
  b->ce_rescale = k_cuda_ce_rescale;
  b->ce_loss = k_cuda_ce_loss;
  b->add = k_cuda_add;
  b->sumsq_ranges = k_cuda_sumsq_ranges;
  b->adamw_ranges = k_cuda_adamw_ranges;
  b->fp8_cast = k_cuda_fp8_cast;
  b->gemm_fp8 = k_cuda_gemm_fp8;
  b->fp8_scales = k_cuda_fp8_scales;
  b->grad_amax = k_cuda_grad_amax;
  b->quant16 = k_cuda_quant16;
  b->dequant16 = k_cuda_dequant16;
  b->quant_i8 = k_cuda_quant_i8;
  b->dequant_i8 = k_cuda_dequant_i8;
  b->swiglu_fwd_fp8 = k_cuda_swiglu_fwd_fp8;
  b->rmsnorm_fwd_fp8 = k_cuda_rmsnorm_fwd_fp8;
  b->swiglu_bwd_fp8 = k_cuda_swiglu_bwd_fp8;
  b->fp8_cast_block = k_cuda_fp8_cast_block;
  b->gemm_fp8_block = k_cuda_gemm_fp8_block;
  b->fp8_cast_spans = k_cuda_fp8_cast_spans;
  b->fp8_transpose = k_cuda_fp8_transpose;
  return b;
}
