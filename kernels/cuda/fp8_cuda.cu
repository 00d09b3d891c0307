// FP8 on the GPU: the fused cast (scale, round to FP8, transpose, amax in one pass over x), the
// same cast fed by SwiGLU's backward, delayed scaling's scale update, SwiGLU with the codes of
// its output, and block scaling's casts; the FP8 GEMMs are in gemm_lt.cu with the other
// cuBLASLt calls.
// Semantics and rounding are those of kernels/cpu/fp8_cpu.h, which the op suite compares with
// bit for bit: the conversion is the hardware's cvt.rn.satfinite (round to nearest even), with
// the input first clamped to +-largest finite (so saturation does not depend on how cvt treats
// Inf) and a NaN written as 0x7F (so the code does not depend on the NaN's sign or payload).
//
// The cast works on 64 x 64 tiles, 256 threads: each thread reads 16-byte vectors of x along a
// row, writes the codes of a row segment straight to out and into a shared tile, and, after a
// barrier, reads 16 codes down a column of the tile and writes them as one 16-byte store to
// out_t, so both outputs are written in full sectors. Shapes or pointers the vectors do not fit
// take the same tiles element by element. amax: the max over the bits of |x| (non-negative
// floats order like their bits, and a NaN's bits exceed Inf's) by warp and block reductions and
// one atomicMax on the bits per block: integer max is order-independent, so the result is
// deterministic, and no float atomics are used.
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_cuda.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <float.h>

enum { T8 = 64, T8_LD = T8 + 4, T8_THREADS = 256 };  // tile side, shared row stride (bytes), threads

// Block-wide max of v, then one atomicMax into *amax by thread 0, skipped when the block's max
// is not larger (the result is the same either way).
__device__ __forceinline__ void amax_commit(uint32_t v, float *amax) {
  __shared__ uint32_t sh[T8_THREADS / 32];
  v = __reduce_max_sync(0xffffffffu, v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < T8_THREADS / 32 ? sh[threadIdx.x] : 0u;
    v = __reduce_max_sync(0xffffffffu, v);
    unsigned int *a = (unsigned int *)amax;
    if (threadIdx.x == 0 && v > *(volatile unsigned int *)a) atomicMax(a, v);
  }
}

// Where the cast kernel reads its values. A source holds NT tensors of (rows, cols) side by side
// in one (rows, NT cols) output: tensor t is columns [t cols, (t + 1) cols) of the codes and rows
// [t cols, (t + 1) cols) of the transposed codes. load_vec gives the V = k_vec<elem>::N values at
// columns [c, c + V) of row r of each tensor (16-byte vectors: c a multiple of V), load_one the
// value at column c; both as stored in the act dtype, which is what the codes and the amax are of.

// fp8_cast's source: x (rows, cols) itself.
template <typename E>
struct cast_src {
  typedef E elem;
  enum { NT = 1 };
  const E *x;
  int cols;
  __device__ __forceinline__ void load_vec(int64_t r, int c, float (*f)[k_vec<E>::N]) const {
    k_unpack<E>(*(const uint4 *)(x + r * cols + c), f[0]);
  }
  __device__ __forceinline__ void load_one(int64_t r, int c, float *f) const { f[0] = k_ld(x[r * cols + c]); }
};

// swiglu_bwd_fp8's source: the gradients of gate (tensor 0) and up (tensor 1) from dout (rows, n)
// and gu (rows, 2n) (k_swiglu_grad, swiglu_bwd's expression), rounded to E, stored to dgu (rows,
// 2n) unless it is NULL, and read back from that rounding.
template <typename E>
struct swiglu_bwd_src {
  typedef E elem;
  enum { NT = 2 };
  const E *dout, *gu;
  E *dgu;
  int n;
  __device__ __forceinline__ void load_vec(int64_t r, int c, float (*f)[k_vec<E>::N]) const {
    constexpr int W = k_vec<E>::N;
    float g[W], u[W], d[W];
    const E *row = gu + r * 2 * n;
    k_unpack<E>(*(const uint4 *)(row + c), g);
    k_unpack<E>(*(const uint4 *)(row + n + c), u);
    k_unpack<E>(*(const uint4 *)(dout + r * n + c), d);
#pragma unroll
    for (int e = 0; e < W; e++) k_swiglu_grad(g[e], u[e], d[e], &f[0][e], &f[1][e]);
#pragma unroll
    for (int t = 0; t < 2; t++) {
      const uint4 p = k_pack<E>(f[t]);
      if (dgu) *(uint4 *)(dgu + r * 2 * n + t * n + c) = p;
      k_unpack<E>(p, f[t]);
    }
  }
  __device__ __forceinline__ void load_one(int64_t r, int c, float *f) const {
    const E *row = gu + r * 2 * n;
    float dg, du;
    k_swiglu_grad(k_ld(row[c]), k_ld(row[n + c]), k_ld(dout[r * n + c]), &dg, &du);
    const E v[2] = {k_st<E>(dg), k_st<E>(du)};
#pragma unroll
    for (int t = 0; t < 2; t++) {
      if (dgu) dgu[r * 2 * n + t * n + c] = v[t];
      f[t] = k_ld(v[t]);
    }
  }
};

// The transposed store of one 64 x 64 tile of codes (tile rows tr, columns tc; the block's rows
// [r0, r0 + 64) and columns [c0, c0 + 64) of a (rows, cols) tensor) into out_t (cols, rows),
// after the barrier that completes the tile. VEC: a thread per column and 16 rows, one 16-byte
// store (rows a multiple of 16, out_t 16-byte aligned); else byte by byte.
template <bool VEC>
__device__ __forceinline__ void tile_store_t(const uint8_t *tile, uint8_t *out_t, int64_t rows, int cols, int64_t r0,
                                             int c0) {
  if (VEC) {  // thread: column tc, rows [16 q, 16 q + 16) of the tile
    const int tc = threadIdx.x >> 2, q = threadIdx.x & 3;
    if (c0 + tc < cols && r0 + 16 * q < rows) {
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 16; j++) w[j / 4] |= (uint32_t)tile[(16 * q + j) * T8_LD + tc] << (8 * (j % 4));
      *(uint4 *)(out_t + (int64_t)(c0 + tc) * rows + r0 + 16 * q) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
    for (int e = threadIdx.x; e < T8 * T8; e += T8_THREADS) {
      const int tc = e / T8, tr = e % T8;
      if (r0 + tr < rows && c0 + tc < cols) out_t[(int64_t)(c0 + tc) * rows + r0 + tr] = tile[tr * T8_LD + tc];
    }
  }
}

// One 64 x 64 tile of each of the source's tensors: block (blockIdx.x, blockIdx.y) = (row tile,
// column tile). VEC: cols a multiple of the vector (16 bytes of the element), the source's
// pointers 16-byte and out 16 / sizeof(element)-byte aligned; with TRANS also rows a multiple
// of 16 and out_t 16-byte aligned.
template <typename Src, k_fp8 F, bool TRANS, bool VEC>
__global__ void __launch_bounds__(T8_THREADS) k_fp8_cast(Src src, int64_t rows, int cols, const float *scale, uint8_t *out,
                                                        uint8_t *out_t, float *amax) {
  constexpr int NT = Src::NT;
  __shared__ __align__(16) uint8_t tile[NT][TRANS ? T8 * T8_LD : 1];
  const int64_t r0 = (int64_t)blockIdx.x * T8, ld = (int64_t)NT * cols;
  const int c0 = blockIdx.y * T8;
  const float s = *scale;
  uint32_t m = 0;
  if (VEC) {
    enum { V = k_vec<typename Src::elem>::N, PER_ROW = T8 / V };  // elements per vector, vectors per tile row
#pragma unroll
    for (int k = 0; k < T8 * PER_ROW / T8_THREADS; k++) {
      const int v = threadIdx.x + k * T8_THREADS, tr = v / PER_ROW, tc = v % PER_ROW * V;
      const int64_t r = r0 + tr;
      if (r >= rows || c0 + tc >= cols) continue;
      float f[NT][V];
      src.load_vec(r, c0 + tc, f);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        uint32_t w[V / 4];
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float *x = f[t] + i;
          m = max(m, max(max(abs_bits(x[0]), abs_bits(x[1])), max(abs_bits(x[2]), abs_bits(x[3]))));
          w[i / 4] = fp8x2<F>(x[0] * s, x[1] * s) | fp8x2<F>(x[2] * s, x[3] * s) << 16;
        }
        if (out) {  // 8 codes (bf16 x) in one 8-byte store, or 4 (fp32 x)
          uint8_t *o = out + r * ld + (int64_t)t * cols + c0 + tc;
          if (V == 8) *(uint2 *)o = make_uint2(w[0], w[V / 4 - 1]);
          else *(uint32_t *)o = w[0];
        }
        if (TRANS)
#pragma unroll
          for (int i = 0; i < V / 4; i++) *(uint32_t *)&tile[t][tr * T8_LD + tc + 4 * i] = w[i];
      }
    }
  } else {
    for (int e = threadIdx.x; e < T8 * T8; e += T8_THREADS) {
      const int tr = e / T8, tc = e % T8;
      const int64_t r = r0 + tr;
      if (r >= rows || c0 + tc >= cols) continue;
      float f[NT];
      src.load_one(r, c0 + tc, f);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        m = max(m, abs_bits(f[t]));
        const uint8_t q = (uint8_t)fp8x2<F>(f[t] * s, 0.0f);
        if (out) out[r * ld + (int64_t)t * cols + c0 + tc] = q;
        if (TRANS) tile[t][tr * T8_LD + tc] = q;
      }
    }
  }
  if (TRANS) {
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NT; t++) tile_store_t<VEC>(tile[t], out_t + (int64_t)t * cols * rows, rows, cols, r0, c0);
  }
  amax_commit(m, amax);
}

// The launch over 64 x 64 tiles of (rows, cols); vec: the vector path's conditions hold.
template <typename Src, k_fp8 F>
static void fp8_cast_go(const Src &src, int64_t rows, int cols, bool vec, const float *scale, uint8_t *out, uint8_t *out_t,
                        float *amax, cudaStream_t st) {
  const dim3 grid((unsigned)((rows + T8 - 1) / T8), (unsigned)((cols + T8 - 1) / T8));
  if (out_t && vec) k_fp8_cast<Src, F, true, true><<<grid, T8_THREADS, 0, st>>>(src, rows, cols, scale, out, out_t, amax);
  else if (out_t) k_fp8_cast<Src, F, true, false><<<grid, T8_THREADS, 0, st>>>(src, rows, cols, scale, out, out_t, amax);
  else if (vec) k_fp8_cast<Src, F, false, true><<<grid, T8_THREADS, 0, st>>>(src, rows, cols, scale, out, out_t, amax);
  else k_fp8_cast<Src, F, false, false><<<grid, T8_THREADS, 0, st>>>(src, rows, cols, scale, out, out_t, amax);
  CUDA_LAUNCH_CHECK("k_fp8_cast");
}

// Whether the vector path fits: cols whole vectors of E, the act-dtype pointers (OR-ed into
// act_ptrs) 16-byte aligned, out aligned to a vector's codes, and out_t (if any) to 16 bytes
// with rows a multiple of 16.
template <typename E>
static bool fp8_cast_vec(int64_t rows, int cols, uintptr_t act_ptrs, const uint8_t *out, const uint8_t *out_t) {
  const int V = k_vec<E>::N;
  return cols % V == 0 && k_aligned16(act_ptrs) && (uintptr_t)out % V == 0 &&
         (!out_t || (rows % 16 == 0 && k_aligned16((uintptr_t)out_t)));
}

template <typename E, k_fp8 F>
static void fp8_cast_x(const E *x, int64_t rows, int cols, const float *scale, uint8_t *out, uint8_t *out_t, float *amax,
                       cudaStream_t st) {
  const cast_src<E> src = {x, cols};
  fp8_cast_go<cast_src<E>, F>(src, rows, cols, fp8_cast_vec<E>(rows, cols, (uintptr_t)x, out, out_t), scale, out, out_t,
                              amax, st);
}

extern "C" void k_cuda_fp8_cast(k_backend *b, const void *x, int64_t rows, int cols, const float *scale, k_fp8 fmt, uint8_t *out,
                                uint8_t *out_t, float *amax) {
  CHECK(rows >= 0 && cols >= 0, "fp8_cast shape rows=%lld cols=%d must be non-negative", (long long)rows, cols);
  CHECK(fmt == K_E4M3 || fmt == K_E5M2, "fp8_cast: unknown FP8 format %d", (int)fmt);
  CHECK((rows + T8 - 1) / T8 < ((int64_t)1 << 31), "fp8_cast: rows=%lld too many", (long long)rows);
  if (rows == 0 || cols == 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) {
    if (fmt == K_E4M3) fp8_cast_x<k_bf16, K_E4M3>((const k_bf16 *)x, rows, cols, scale, out, out_t, amax, c->stream);
    else fp8_cast_x<k_bf16, K_E5M2>((const k_bf16 *)x, rows, cols, scale, out, out_t, amax, c->stream);
  } else {
    if (fmt == K_E4M3) fp8_cast_x<float, K_E4M3>((const float *)x, rows, cols, scale, out, out_t, amax, c->stream);
    else fp8_cast_x<float, K_E5M2>((const float *)x, rows, cols, scale, out, out_t, amax, c->stream);
  }
}

// ---------------------------------------------------------------------------------------------
// The transpose of FP8 codes: the cast's 64 x 64 tiles without the cast. VEC: cols a multiple of
// 16 and codes 16-byte aligned (each thread loads 16 codes of a row), and the store's conditions
// (tile_store_t).

template <bool VEC>
__global__ void __launch_bounds__(T8_THREADS) k_fp8_transpose(const uint8_t *codes, int64_t rows, int cols,
                                                             uint8_t *codes_t) {
  __shared__ __align__(16) uint8_t tile[T8 * T8_LD];
  const int64_t r0 = (int64_t)blockIdx.x * T8;
  const int c0 = blockIdx.y * T8;
  if (VEC) {  // thread: row tr of the tile, columns [tc, tc + 16)
    const int tr = threadIdx.x >> 2, tc = (threadIdx.x & 3) * 16;
    if (r0 + tr < rows && c0 + tc < cols) {
      const uint4 v = *(const uint4 *)(codes + (r0 + tr) * cols + c0 + tc);
      uint32_t *t = (uint32_t *)&tile[tr * T8_LD + tc];  // T8_LD is a multiple of 4
      t[0] = v.x, t[1] = v.y, t[2] = v.z, t[3] = v.w;
    }
  } else {
    for (int e = threadIdx.x; e < T8 * T8; e += T8_THREADS) {
      const int tr = e / T8, tc = e % T8;
      if (r0 + tr < rows && c0 + tc < cols) tile[tr * T8_LD + tc] = codes[(r0 + tr) * cols + c0 + tc];
    }
  }
  __syncthreads();
  tile_store_t<VEC>(tile, codes_t, rows, cols, r0, c0);
}

extern "C" void k_cuda_fp8_transpose(k_backend *b, const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t) {
  CHECK(rows >= 0 && cols >= 0, "fp8_transpose shape rows=%lld cols=%d must be non-negative", (long long)rows, cols);
  CHECK((rows + T8 - 1) / T8 < ((int64_t)1 << 31), "fp8_transpose: rows=%lld too many", (long long)rows);
  if (rows == 0 || cols == 0) return;
  const cudaStream_t st = k_cuda_ctx_of(b)->stream;
  const bool vec = cols % 16 == 0 && rows % 16 == 0 && k_aligned16((uintptr_t)codes) && k_aligned16((uintptr_t)codes_t);
  const dim3 grid((unsigned)((rows + T8 - 1) / T8), (unsigned)((cols + T8 - 1) / T8));
  if (vec) k_fp8_transpose<true><<<grid, T8_THREADS, 0, st>>>(codes, rows, cols, codes_t);
  else k_fp8_transpose<false><<<grid, T8_THREADS, 0, st>>>(codes, rows, cols, codes_t);
  CUDA_LAUNCH_CHECK("k_fp8_transpose");
}

// ---------------------------------------------------------------------------------------------
// Delayed scaling: one thread per tensor, k_cpu_fp8_scales's expressions in its order (IEEE
// division, exact ldexpf; no fast-math), so the scales agree bit for bit.

__global__ void k_fp8_scales(float *hist, float *amax, float *scale, float *scale_inv, int inv_stride, const uint8_t *fmt, int n,
                             int len, int pos, int margin, int use_max, int *n_nonfinite) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float *h = hist + (int64_t)i * len;
  const float am = amax[i];
  h[pos] = am;
  float a = am;
  if (use_max)
    for (int j = 0; j < len; j++) {
      const float v = h[j];
      if (isnan(v) || v > a) a = v;
    }
  if (!isfinite(am)) atomicAdd(n_nonfinite, 1);
  if (isfinite(a) && a > 0.0f) {
    float s = ldexpf((fmt[i] == K_E5M2 ? 57344.0f : 448.0f) / a, -margin);
    s = s < FLT_MIN ? FLT_MIN : s > FLT_MAX ? FLT_MAX : s;
    scale[i] = s;
    scale_inv[(int64_t)i * inv_stride] = 1.0f / s;
  }
  amax[i] = 0.0f;
}

extern "C" void k_cuda_fp8_scales(k_backend *b, float *amax_history, float *amax, float *scale, float *scale_inv,
                                  int inv_stride, const uint8_t *fmt, int n, int len, int pos, int margin, int use_max,
                                  int *n_nonfinite) {
  CHECK(n >= 0 && len >= 1 && pos >= 0 && pos < len && inv_stride >= 1,
        "fp8_scales: n=%d len=%d pos=%d inv_stride=%d (need len >= 1, 0 <= pos < len, inv_stride >= 1)", n, len, pos,
        inv_stride);
  if (n == 0) return;
  k_fp8_scales<<<(n + 127) / 128, 128, 0, k_cuda_ctx_of(b)->stream>>>(amax_history, amax, scale, scale_inv, inv_stride, fmt,
                                                                     n, len, pos, margin, use_max, n_nonfinite);
  CUDA_LAUNCH_CHECK("k_fp8_scales");
}

// ---------------------------------------------------------------------------------------------
// SwiGLU with the FP8 codes of its output: k_swiglu_fwd's rows and columns (vectors of 16 bytes
// where n and the pointers allow), each value stored in the act dtype, then read back from that
// rounding for its code and the amax, as fp8_cast reading out would.

template <typename E, bool VEC>
__global__ void __launch_bounds__(T8_THREADS) k_swiglu_fwd_fp8(const E *gu, E *out, int64_t rows, int n,
                                                               const float *scale, uint8_t *out8, float *amax) {
  constexpr int W = k_vec<E>::N;  // elements of a 16-byte vector (the vector path)
  const int nw = VEC ? n / W : n;
  const float s = *scale;
  uint32_t m = 0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nw; j += gridDim.x * blockDim.x) {
      if (VEC) {
        float g[W], u[W];
        const uint4 *row = (const uint4 *)gu + r * 2 * nw;
        k_unpack<E>(row[j], g);
        k_unpack<E>(row[nw + j], u);
#pragma unroll
        for (int e = 0; e < W; e++) g[e] = k_swiglu(g[e], u[e]);
        const uint4 p = k_pack<E>(g);
        if (out) ((uint4 *)out)[r * nw + j] = p;
        k_unpack<E>(p, g);
        uint32_t w[W / 4];
#pragma unroll
        for (int i = 0; i < W; i += 4) {
          m = max(m, max(max(abs_bits(g[i]), abs_bits(g[i + 1])), max(abs_bits(g[i + 2]), abs_bits(g[i + 3]))));
          w[i / 4] = fp8x2<K_E4M3>(g[i] * s, g[i + 1] * s) | fp8x2<K_E4M3>(g[i + 2] * s, g[i + 3] * s) << 16;
        }
        uint8_t *o = out8 + r * n + (int64_t)j * W;
        if (W == 8) *(uint2 *)o = make_uint2(w[0], w[W / 4 - 1]);
        else *(uint32_t *)o = w[0];
      } else {
        const E *row = gu + r * 2 * n;
        const E v = k_st<E>(k_swiglu(k_ld(row[j]), k_ld(row[n + j])));
        if (out) out[r * n + j] = v;
        const float f = k_ld(v);
        m = max(m, abs_bits(f));
        out8[r * n + j] = (uint8_t)fp8x2<K_E4M3>(f * s, 0.0f);
      }
    }
  amax_commit(m, amax);
}

template <typename E>
static void swiglu_fwd_fp8_go(const E *gu, E *out, int64_t rows, int n, const float *scale, uint8_t *out8, float *amax,
                              cudaStream_t st) {
  constexpr int W = k_vec<E>::N;
  const bool vec = n % W == 0 && k_aligned16((uintptr_t)gu | (uintptr_t)out) && (uintptr_t)out8 % W == 0;
  const int64_t bx = ((vec ? n / W : n) + T8_THREADS - 1) / T8_THREADS;
  const dim3 grid((unsigned)(bx < 1024 ? bx : 1024), (unsigned)(rows < 65535 ? rows : 65535));
  if (vec) k_swiglu_fwd_fp8<E, true><<<grid, T8_THREADS, 0, st>>>(gu, out, rows, n, scale, out8, amax);
  else k_swiglu_fwd_fp8<E, false><<<grid, T8_THREADS, 0, st>>>(gu, out, rows, n, scale, out8, amax);
  CUDA_LAUNCH_CHECK("k_swiglu_fwd_fp8");
}

extern "C" void k_cuda_swiglu_fwd_fp8(k_backend *b, const void *gu, void *out, int64_t rows, int n, const float *scale,
                                      uint8_t *out8, float *amax) {
  CHECK(rows >= 0 && n >= 0, "swiglu_fwd_fp8 shape rows=%lld n=%d must be non-negative", (long long)rows, n);
  if (rows == 0 || n == 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) swiglu_fwd_fp8_go<k_bf16>((const k_bf16 *)gu, (k_bf16 *)out, rows, n, scale, out8, amax, c->stream);
  else swiglu_fwd_fp8_go<float>((const float *)gu, (float *)out, rows, n, scale, out8, amax, c->stream);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU's backward with the FP8 codes of its output dgu: the cast kernel above over the gate and
// up halves of dgu as two tensors of (rows, n), its loader computing them (swiglu_bwd_src), so a
// block reads dout and gu once for both halves and dgu need not be written or read again.

template <typename E, k_fp8 F>
static void swiglu_bwd_fp8_go(const E *dout, const E *gu, E *dgu, int64_t rows, int n, const float *scale, uint8_t *out8,
                              uint8_t *out8_t, float *amax, cudaStream_t st) {
  const swiglu_bwd_src<E> src = {dout, gu, dgu, n};
  const uintptr_t act_ptrs = (uintptr_t)dout | (uintptr_t)gu | (uintptr_t)dgu;
  fp8_cast_go<swiglu_bwd_src<E>, F>(src, rows, n, fp8_cast_vec<E>(rows, n, act_ptrs, out8, out8_t), scale, out8, out8_t,
                                    amax, st);
}

extern "C" void k_cuda_swiglu_bwd_fp8(k_backend *b, const void *dout, const void *gu, void *dgu, int64_t rows, int n,
                                      const float *scale, k_fp8 fmt, uint8_t *out8, uint8_t *out8_t, float *amax) {
  CHECK(rows >= 0 && n >= 0, "swiglu_bwd_fp8 shape rows=%lld n=%d must be non-negative", (long long)rows, n);
  CHECK(fmt == K_E4M3 || fmt == K_E5M2, "swiglu_bwd_fp8: unknown FP8 format %d", (int)fmt);
  CHECK(out8 && out8_t, "swiglu_bwd_fp8: the codes and the transposed codes are both required");
  CHECK((rows + T8 - 1) / T8 < ((int64_t)1 << 31) && (n + T8 - 1) / T8 < 65536,
        "swiglu_bwd_fp8: rows=%lld n=%d too large", (long long)rows, n);
  if (rows == 0 || n == 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) {
    const k_bf16 *d = (const k_bf16 *)dout, *g = (const k_bf16 *)gu;
    if (fmt == K_E4M3) swiglu_bwd_fp8_go<k_bf16, K_E4M3>(d, g, (k_bf16 *)dgu, rows, n, scale, out8, out8_t, amax, c->stream);
    else swiglu_bwd_fp8_go<k_bf16, K_E5M2>(d, g, (k_bf16 *)dgu, rows, n, scale, out8, out8_t, amax, c->stream);
  } else {
    const float *d = (const float *)dout, *g = (const float *)gu;
    if (fmt == K_E4M3) swiglu_bwd_fp8_go<float, K_E4M3>(d, g, (float *)dgu, rows, n, scale, out8, out8_t, amax, c->stream);
    else swiglu_bwd_fp8_go<float, K_E5M2>(d, g, (float *)dgu, rows, n, scale, out8, out8_t, amax, c->stream);
  }
}

// ---------------------------------------------------------------------------------------------
// Block scaling (kernels/cpu/fp8_cpu.h: k_cpu_fp8_cast_block, bit for bit): each tile's amax, its
// scale 448 / amax (IEEE division, the CPU's clamps), E4M3 codes, 1 / scale in cuBLASLt's layout.
// 256 threads a block, as amax_commit (the whole tensor's amax) expects.

__device__ __forceinline__ float block_scale(uint32_t amax_bits) {
  const float a = __uint_as_float(amax_bits);
  if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
  const float s = 448.0f / a;
  return s < FLT_MIN ? FLT_MIN : s > FLT_MAX ? FLT_MAX : s;
}

// k_fp8_block_ld on the device: the row stride of a 128 x 128 scale array.
__device__ __forceinline__ int64_t blk_ld(int64_t k) { return ((k + 127) / 128 + 3) / 4 * 4; }

__device__ __forceinline__ uint8_t e4m3(float v) { return (uint8_t)fp8x2<K_E4M3>(v, 0.0f); }

// 1 x 128 tiles along each row: a warp per (row, 128-column block), 4 columns a lane.
template <typename E>
__global__ void __launch_bounds__(T8_THREADS) k_fp8_cast_rows128(const E *x, int64_t rows, int cols, uint8_t *out,
                                                                 float *si, float *amax) {
  const int ncb = (cols + 127) / 128, lane = threadIdx.x & 31;
  const int64_t w = (int64_t)blockIdx.x * (T8_THREADS / 32) + (threadIdx.x >> 5);
  uint32_t m = 0;
  float f[4];
  const int64_t r = w / ncb;
  const int cb = (int)(w % ncb);
  if (r < rows) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int c = cb * 128 + lane + 32 * i;
      f[i] = c < cols ? k_ld(x[r * cols + c]) : 0.0f;
      m = max(m, abs_bits(f[i]));
    }
  }
  const uint32_t tm = __reduce_max_sync(0xffffffffu, m);
  if (r < rows) {
    const float s = block_scale(tm);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int c = cb * 128 + lane + 32 * i;
      if (out && c < cols) out[r * cols + c] = e4m3(f[i] * s);
    }
    if (out && lane == 0) si[(int64_t)cb * rows + r] = 1.0f / s;
  }
  amax_commit(m, amax);
}

// 1 x 128 tiles of the transpose (128 x 1 down each column of x): a block per 128 rows x 32
// columns through shared memory; a warp per 4 columns, each column's 128 codes written along out_t.
template <typename E>
__global__ void __launch_bounds__(T8_THREADS) k_fp8_cast_cols128(const E *x, int64_t rows, int cols, uint8_t *out_t,
                                                                 float *si_t, float *amax) {
  __shared__ float tile[128][33];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  const int64_t r0 = (int64_t)blockIdx.x * 128;
  const int c0 = blockIdx.y * 32;
  uint32_t m = 0;
  for (int i = 0; i < 16; i++) {
    const int tr = wp + 8 * i;
    const int64_t r = r0 + tr;
    const int c = c0 + lane;
    const float v = r < rows && c < cols ? k_ld(x[r * cols + c]) : 0.0f;
    tile[tr][lane] = v;
    m = max(m, abs_bits(v));
  }
  __syncthreads();
  for (int j = wp * 4; j < wp * 4 + 4; j++) {
    const int c = c0 + j;
    uint32_t cm = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) cm = max(cm, abs_bits(tile[lane + 32 * q][j]));
    cm = __reduce_max_sync(0xffffffffu, cm);
    if (c >= cols) continue;
    const float s = block_scale(cm);
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const int64_t r = r0 + lane + 32 * q;
      if (r < rows) out_t[(int64_t)c * rows + r] = e4m3(tile[lane + 32 * q][j] * s);
    }
    if (lane == 0) si_t[(int64_t)blockIdx.x * cols + c] = 1.0f / s;
  }
  amax_commit(m, amax);
}

// 128 x 128 tiles: a block per tile; the tile's amax, then the codes row-wise to out and
// column-wise to out_t (the weights' copies, made once per optimizer step).
template <typename E>
__global__ void __launch_bounds__(T8_THREADS) k_fp8_cast_tiles128(const E *x, int64_t rows, int cols, uint8_t *out,
                                                                  float *si, uint8_t *out_t, float *si_t, float *amax) {
  __shared__ uint32_t part[T8_THREADS / 32];
  const int64_t r0 = (int64_t)blockIdx.x * 128;
  const int c0 = blockIdx.y * 128;
  uint32_t m = 0;
  for (int e = threadIdx.x; e < 128 * 128; e += T8_THREADS) {
    const int64_t r = r0 + e / 128;
    const int c = c0 + e % 128;
    if (r < rows && c < cols) m = max(m, abs_bits(k_ld(x[r * cols + c])));
  }
  uint32_t v = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  uint32_t tm = 0;
  for (int i = 0; i < T8_THREADS / 32; i++) tm = max(tm, part[i]);
  const float s = block_scale(tm);
  if (out)
    for (int e = threadIdx.x; e < 128 * 128; e += T8_THREADS) {
      const int64_t r = r0 + e / 128;
      const int c = c0 + e % 128;
      if (r < rows && c < cols) out[r * cols + c] = e4m3(k_ld(x[r * cols + c]) * s);
    }
  if (out_t)
    for (int e = threadIdx.x; e < 128 * 128; e += T8_THREADS) {
      const int c = c0 + e / 128;
      const int64_t r = r0 + e % 128;
      if (r < rows && c < cols) out_t[(int64_t)c * rows + r] = e4m3(k_ld(x[r * cols + c]) * s);
    }
  if (threadIdx.x == 0) {
    if (si) si[(int64_t)blockIdx.x * blk_ld(cols) + blockIdx.y] = 1.0f / s;
    if (si_t) si_t[(int64_t)blockIdx.y * blk_ld(rows) + blockIdx.x] = 1.0f / s;
  }
  amax_commit(m, amax);
}

template <typename E>
static void fp8_cast_block_go(const E *x, int64_t rows, int cols, int tile, uint8_t *out, float *si, uint8_t *out_t,
                              float *si_t, float *amax, cudaStream_t st) {
  const unsigned nrb = (unsigned)((rows + 127) / 128), ncb = (unsigned)((cols + 127) / 128);
  if (tile == 128) {
    k_fp8_cast_tiles128<E><<<dim3(nrb, ncb), T8_THREADS, 0, st>>>(x, rows, cols, out, si, out_t, si_t, amax);
    CUDA_LAUNCH_CHECK("k_fp8_cast_tiles128");
    return;
  }
  if (out || !out_t) {  // with neither output, this pass alone takes the amax (out NULL: no codes)
    const int64_t warps = rows * ncb;
    k_fp8_cast_rows128<E><<<(unsigned)((warps + 7) / 8), T8_THREADS, 0, st>>>(x, rows, cols, out, si, amax);
    CUDA_LAUNCH_CHECK("k_fp8_cast_rows128");
  }
  if (out_t) {
    k_fp8_cast_cols128<E><<<dim3(nrb, (unsigned)((cols + 31) / 32)), T8_THREADS, 0, st>>>(x, rows, cols, out_t, si_t, amax);
    CUDA_LAUNCH_CHECK("k_fp8_cast_cols128");
  }
}

extern "C" void k_cuda_fp8_cast_block(k_backend *b, const void *x, int64_t rows, int cols, int tile, uint8_t *out,
                                      float *scale_inv, uint8_t *out_t, float *scale_inv_t, float *amax) {
  CHECK(rows >= 0 && cols >= 0 && (tile == 1 || tile == 128),
        "fp8_cast_block: rows=%lld cols=%d tile=%d (need non-negative sizes, tile 1 or 128)", (long long)rows, cols, tile);
  CHECK((!out || scale_inv) && (!out_t || scale_inv_t), "fp8_cast_block: an output without its scale array");
  CHECK((rows + 127) / 128 < 65536 && (cols + 31) / 32 < 65536 && rows * ((cols + 127) / 128) < ((int64_t)1 << 34),
        "fp8_cast_block: rows=%lld cols=%d too large", (long long)rows, cols);
  if (rows == 0 || cols == 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) fp8_cast_block_go<k_bf16>((const k_bf16 *)x, rows, cols, tile, out, scale_inv, out_t, scale_inv_t, amax, c->stream);
  else fp8_cast_block_go<float>((const float *)x, rows, cols, tile, out, scale_inv, out_t, scale_inv_t, amax, c->stream);
}
