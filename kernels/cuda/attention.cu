// Causal grouped-query attention on the GPU, flash style: scores never go to global memory.
// Templates over the element type E of q, k, v, o and their gradients (float or bf16, the
// activation dtype of the backend the launcher is given): tiles are widened to fp32 as they are loaded into shared
// memory, all math is fp32, outputs are rounded on store; lse and delta are fp32. Layouts as
// kernels/cpu/ops_cpu.h, sequence-major: q, k, v (and dq, dk, dv) rows (t, b) at stride ld, so a
// position step is B * ld; o, dout (T,B,nh,hd); lse (B,nh,T); head h reads kv head h / (nh/nkv);
// scale 1/sqrt(hd).
//
// Forward: a block takes ATT_QB query rows of one (batch, head), 4 warps of ATT_RPW rows each,
// and walks key tiles of 32 held in shared memory with an online softmax. In the score loop a
// lane owns a key; in the P V loop a lane owns head dims lane + 32c (c < NC).
// Backward: no atomics, so every gradient has one writer and one summation order, and the
// result is bitwise reproducible. Three kernels: delta = rowsum(dO * O); dq per query block
// (walks key tiles, like the forward); dk and dv per block of ATT_QB keys of one kv head, which
// walks every query row of the nh/nkv heads that share it, in head then row order. Both
// recompute p = exp(s - lse) from the same score loop as the forward.
//
// Shared-memory rows are padded to hd + 4 floats: 16-byte aligned for float4 reads and, for
// hd % 8 == 0, free of bank conflicts when each lane reads its own row. Head dims must be a
// multiple of 4 and at most 256 (NC = 8).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <math.h>

enum { ATT_WARPS = 4, ATT_RPW = 4, ATT_QB = ATT_WARPS * ATT_RPW, ATT_KB = 32, ATT_THREADS = 32 * ATT_WARPS };

// dot of a (hd) with each of the RPW rows of b (RPW rows at stride ldb), in increasing d order.
template <int RPW>
__device__ __forceinline__ void att_dots(const float *a, const float *b, int ldb, int hd4, float *out) {
  const float4 *a4 = (const float4 *)a;
#pragma unroll
  for (int r = 0; r < RPW; r++) out[r] = 0.0f;
  for (int d4 = 0; d4 < hd4; d4++) {
    const float4 x = a4[d4];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
      const float4 y = ((const float4 *)(b + r * ldb))[d4];
      out[r] = fmaf(y.x, x.x, out[r]);
      out[r] = fmaf(y.y, x.y, out[r]);
      out[r] = fmaf(y.z, x.z, out[r]);
      out[r] = fmaf(y.w, x.w, out[r]);
    }
  }
}

// acc[r][c] += sum_j w[r][j] * m[j][lane + 32c] over j < jn, j increasing. w: RPW rows of 32
// weights (stride 32) in shared memory; m: rows of the matrix at stride ldm.
template <int RPW, int NC>
__device__ __forceinline__ void att_accum(float (&acc)[RPW][NC], const float *w, const float *m, int ldm, int jn,
                                          int hd, int lane) {
  for (int j4 = 0; j4 < (jn + 3) / 4; j4++) {
    float4 wv[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) wv[r] = ((const float4 *)(w + r * 32))[j4];
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
      const float *mj = m + (4 * j4 + jj) * ldm;
#pragma unroll
      for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < hd) {
          const float x = mj[d];
#pragma unroll
          for (int r = 0; r < RPW; r++) {
            const float wj = jj == 0 ? wv[r].x : jj == 1 ? wv[r].y : jj == 2 ? wv[r].z : wv[r].w;
            acc[r][c] = fmaf(wj, x, acc[r][c]);
          }
        }
      }
    }
  }
}

// rows [t0, t0 + n_rows) of one head of x (stride ld between positions) into s (n_rows, lds),
// zeros past T.
template <typename E>
__device__ __forceinline__ void att_load(float *s, int lds, const E *x, int64_t ld, int t0, int n_rows, int T,
                                         int hd) {
  for (int idx = threadIdx.x; idx < n_rows * hd; idx += blockDim.x) {
    const int r = idx / hd, d = idx - r * hd, t = t0 + r;
    s[r * lds + d] = t < T ? k_ld(x[(int64_t)t * ld + d]) : 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

template <typename E, int NC>
__global__ void __launch_bounds__(ATT_THREADS) k_attn_fwd(const E *q, const E *k, const E *v, int64_t ld, E *o,
                                                          float *lse, int B, int T, int nh, int nkv, int hd,
                                                          float scale) {
  extern __shared__ float4 att_sh4[];
  const int ldk = hd + 4, hd4 = hd / 4;
  float *Ks = (float *)att_sh4, *Vs = Ks + ATT_KB * ldk, *Qs = Vs + ATT_KB * ldk, *Ps = Qs + ATT_QB * hd;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int q0 = blockIdx.x * ATT_QB, h = blockIdx.y, b = blockIdx.z, kh = h / (nh / nkv);
  const int64_t ldo = (int64_t)nh * hd, sq = (int64_t)B * ld;  // sq: position step of q, k, v
  const E *qb = q + (int64_t)b * ld + (int64_t)h * hd;
  const E *kb = k + (int64_t)b * ld + (int64_t)kh * hd;
  const E *vb = v + (int64_t)b * ld + (int64_t)kh * hd;
  att_load(Qs, hd, qb, sq, q0, ATT_QB, T, hd);
  float acc[ATT_RPW][NC], m[ATT_RPW], l[ATT_RPW];
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
  }
  const int q_end = min(q0 + ATT_QB, T);  // keys at or past q_end are masked for every row here
  float *Pw = Ps + w * ATT_RPW * 32;
  for (int k0 = 0; k0 < q_end; k0 += ATT_KB) {
    __syncthreads();  // the previous tile is consumed (and, the first time, Qs is loaded)
    att_load(Ks, ldk, kb, sq, k0, ATT_KB, T, hd);
    att_load(Vs, ldk, vb, sq, k0, ATT_KB, T, hd);
    __syncthreads();
    float s[ATT_RPW];
    att_dots<ATT_RPW>(Ks + lane * ldk, Qs + w * ATT_RPW * hd, hd, hd4, s);
    const int key = k0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
      const int t = q0 + w * ATT_RPW + r;
      // Key 0 is in the first tile and visible to every row, so m is finite from then on.
      const float sr = key <= t && key < T ? s[r] * scale : -INFINITY;
      const float mx = k_warp_max(sr), mn = mx > m[r] ? mx : m[r];
      const float p = expf(sr - mn), alpha = expf(m[r] - mn);
      l[r] = l[r] * alpha + k_warp_sum(p);
      m[r] = mn;
      Pw[r * 32 + lane] = p;
#pragma unroll
      for (int c = 0; c < NC; c++) acc[r][c] *= alpha;
    }
    __syncwarp();
    att_accum<ATT_RPW, NC>(acc, Pw, Vs, ldk, min(ATT_KB, q_end - k0), hd, lane);
  }
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++) {
    const int t = q0 + w * ATT_RPW + r;
    if (t >= T) continue;
    const float inv = 1.0f / l[r];
    E *orow = o + ((int64_t)t * B + b) * ldo + (int64_t)h * hd;
#pragma unroll
    for (int c = 0; c < NC; c++)
      if (lane + 32 * c < hd) orow[lane + 32 * c] = k_st<E>(acc[r][c] * inv);
    if (lane == 0) lse[((int64_t)b * nh + h) * T + t] = m[r] + logf(l[r]);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

// delta (B,nh,T) = sum_d dO * O: one warp per (t, b, h), the memory order of dO and O.
template <typename E>
__global__ void k_attn_delta(const E *dout, const E *o, float *delta, int B, int T, int nh, int hd) {
  const int64_t n_rows = (int64_t)B * T * nh;
  const int lane = threadIdx.x & 31;
  for (int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; row < n_rows;
       row += (int64_t)gridDim.x * blockDim.x / 32) {
    const E *a = dout + row * hd, *c = o + row * hd;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s = fmaf(k_ld(a[d]), k_ld(c[d]), s);
    s = k_warp_sum(s);
    const int64_t tb = row / nh, t = tb / B, b = tb % B, h = row % nh;
    if (lane == 0) delta[(b * nh + h) * T + t] = s;
  }
}

template <typename E, int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dq(const E *dout, const E *q, const E *k, const E *v, int64_t ld, const float *lse, const float *delta,
                  E *dq, int B, int T, int nh, int nkv, int hd, float scale) {
  extern __shared__ float4 att_sh4[];
  const int ldk = hd + 4, hd4 = hd / 4;
  float *Ks = (float *)att_sh4, *Vs = Ks + ATT_KB * ldk, *Qs = Vs + ATT_KB * ldk, *dOs = Qs + ATT_QB * hd;
  float *dSs = dOs + ATT_QB * hd;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int q0 = blockIdx.x * ATT_QB, h = blockIdx.y, b = blockIdx.z, kh = h / (nh / nkv);
  const int64_t ldo = (int64_t)nh * hd, sq = (int64_t)B * ld, so = (int64_t)B * ldo;  // position steps
  const int64_t qoff = (int64_t)b * ld + (int64_t)h * hd, kvoff = (int64_t)b * ld + (int64_t)kh * hd;
  const int64_t ooff = (int64_t)b * ldo + (int64_t)h * hd;
  att_load(Qs, hd, q + qoff, sq, q0, ATT_QB, T, hd);
  att_load(dOs, hd, dout + ooff, so, q0, ATT_QB, T, hd);
  const float *lse_h = lse + ((int64_t)b * nh + h) * T, *delta_h = delta + ((int64_t)b * nh + h) * T;
  float acc[ATT_RPW][NC], lr[ATT_RPW], dr[ATT_RPW];
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++) {
    const int t = q0 + w * ATT_RPW + r;
    lr[r] = t < T ? lse_h[t] : 0.0f;
    dr[r] = t < T ? delta_h[t] : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
  }
  const int q_end = min(q0 + ATT_QB, T);
  float *dSw = dSs + w * ATT_RPW * 32;
  for (int k0 = 0; k0 < q_end; k0 += ATT_KB) {
    __syncthreads();
    att_load(Ks, ldk, k + kvoff, sq, k0, ATT_KB, T, hd);
    att_load(Vs, ldk, v + kvoff, sq, k0, ATT_KB, T, hd);
    __syncthreads();
    float s[ATT_RPW], dp[ATT_RPW];
    att_dots<ATT_RPW>(Ks + lane * ldk, Qs + w * ATT_RPW * hd, hd, hd4, s);
    att_dots<ATT_RPW>(Vs + lane * ldk, dOs + w * ATT_RPW * hd, hd, hd4, dp);
    const int key = k0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
      const int t = q0 + w * ATT_RPW + r;
      const float p = t < T && key <= t ? expf(s[r] * scale - lr[r]) : 0.0f;
      dSw[r * 32 + lane] = p * (dp[r] - dr[r]);
    }
    __syncwarp();
    att_accum<ATT_RPW, NC>(acc, dSw, Ks, ldk, min(ATT_KB, q_end - k0), hd, lane);
  }
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++) {
    const int t = q0 + w * ATT_RPW + r;
    if (t >= T) continue;
    E *row = dq + qoff + (int64_t)t * sq;
#pragma unroll
    for (int c = 0; c < NC; c++)
      if (lane + 32 * c < hd) row[lane + 32 * c] = k_st<E>(acc[r][c] * scale);
  }
}

// dk, dv of keys [j0, j0 + ATT_QB) of kv head kh: warp w owns keys j0 + w*ATT_RPW + r; in the
// score loop a lane owns a query row of the current tile of 32.
template <typename E, int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dkdv(const E *dout, const E *q, const E *k, const E *v, int64_t ld, const float *lse,
                    const float *delta, E *dk, E *dv, int B, int T, int nh, int nkv, int hd, float scale) {
  extern __shared__ float4 att_sh4[];
  const int ldq_s = hd + 4, hd4 = hd / 4;
  float *Ks = (float *)att_sh4, *Vs = Ks + ATT_QB * hd, *Qs = Vs + ATT_QB * hd, *dOs = Qs + ATT_KB * ldq_s;
  float *Ls = dOs + ATT_KB * ldq_s, *Ds = Ls + ATT_KB, *Ps = Ds + ATT_KB, *dSs = Ps + ATT_WARPS * ATT_RPW * 32;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int j0 = blockIdx.x * ATT_QB, kh = blockIdx.y, b = blockIdx.z, grp = nh / nkv;
  const int64_t ldo = (int64_t)nh * hd, sq = (int64_t)B * ld, so = (int64_t)B * ldo;  // position steps
  const int64_t kvoff = (int64_t)b * ld + (int64_t)kh * hd;
  att_load(Ks, hd, k + kvoff, sq, j0, ATT_QB, T, hd);
  att_load(Vs, hd, v + kvoff, sq, j0, ATT_QB, T, hd);
  float gk[ATT_RPW][NC], gv[ATT_RPW][NC];
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++)
#pragma unroll
    for (int c = 0; c < NC; c++) gk[r][c] = gv[r][c] = 0.0f;
  float *Pw = Ps + w * ATT_RPW * 32, *dSw = dSs + w * ATT_RPW * 32;
  for (int g = 0; g < grp; g++) {
    const int h = kh * grp + g;
    const int64_t qoff = (int64_t)b * ld + (int64_t)h * hd, ooff = (int64_t)b * ldo + (int64_t)h * hd;
    const float *lse_h = lse + ((int64_t)b * nh + h) * T, *delta_h = delta + ((int64_t)b * nh + h) * T;
    for (int t0 = j0 / ATT_KB * ATT_KB; t0 < T; t0 += ATT_KB) {
      __syncthreads();
      att_load(Qs, ldq_s, q + qoff, sq, t0, ATT_KB, T, hd);
      att_load(dOs, ldq_s, dout + ooff, so, t0, ATT_KB, T, hd);
      if (threadIdx.x < ATT_KB) {
        const int t = t0 + threadIdx.x;
        Ls[threadIdx.x] = t < T ? lse_h[t] : 0.0f;
        Ds[threadIdx.x] = t < T ? delta_h[t] : 0.0f;
      }
      __syncthreads();
      float s[ATT_RPW], dp[ATT_RPW];
      att_dots<ATT_RPW>(Qs + lane * ldq_s, Ks + w * ATT_RPW * hd, hd, hd4, s);
      att_dots<ATT_RPW>(dOs + lane * ldq_s, Vs + w * ATT_RPW * hd, hd, hd4, dp);
      const int t = t0 + lane;
#pragma unroll
      for (int r = 0; r < ATT_RPW; r++) {
        const int key = j0 + w * ATT_RPW + r;
        const float p = t < T && key <= t ? expf(s[r] * scale - Ls[lane]) : 0.0f;
        Pw[r * 32 + lane] = p;
        dSw[r * 32 + lane] = p * (dp[r] - Ds[lane]);
      }
      __syncwarp();
      const int in = min(ATT_KB, T - t0);
      att_accum<ATT_RPW, NC>(gv, Pw, dOs, ldq_s, in, hd, lane);
      att_accum<ATT_RPW, NC>(gk, dSw, Qs, ldq_s, in, hd, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < ATT_RPW; r++) {
    const int key = j0 + w * ATT_RPW + r;
    if (key >= T) continue;
    E *rk = dk + kvoff + (int64_t)key * sq, *rv = dv + kvoff + (int64_t)key * sq;
#pragma unroll
    for (int c = 0; c < NC; c++) {
      const int d = lane + 32 * c;
      if (d < hd) {
        rk[d] = k_st<E>(gk[r][c] * scale);
        rv[d] = k_st<E>(gv[r][c]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers

static void att_check(int B, int T, int nh, int nkv, int hd) {
  CHECK(nkv > 0 && nh % nkv == 0, "attention needs nh (%d) to be a multiple of nkv (%d)", nh, nkv);
  CHECK(hd > 0 && hd % 4 == 0 && hd <= 256, "CUDA attention needs a head dim that is a multiple of 4, at most 256; "
        "got hd=%d", hd);
  CHECK(B >= 0 && T >= 0 && B <= 65535 && nh <= 65535, "attention shape B=%d T=%d nh=%d: negative or over the "
        "grid's 65535", B, T, nh);
}

// Lanes hold NC dims each: the smallest instantiated NC with 32 * NC >= hd.
static int att_nc(int hd) { return hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : 8; }

template <typename F>
static void att_smem(F *kernel, size_t n_bytes) {
  if (n_bytes > 48 * 1024)  // beyond the default dynamic limit: opt in (Hopper gives up to 227 KiB)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)n_bytes));
}

template <typename E, int NC>
static void att_fwd_launch(const E *q, const E *k, const E *v, int64_t ld, E *o, float *lse, int B, int T, int nh,
                           int nkv, int hd, cudaStream_t s) {
  const size_t sh = sizeof(float) * ((size_t)2 * ATT_KB * (hd + 4) + (size_t)ATT_QB * hd + ATT_QB * 32);
  att_smem(k_attn_fwd<E, NC>, sh);
  const dim3 grid((T + ATT_QB - 1) / ATT_QB, nh, B);
  k_attn_fwd<E, NC><<<grid, ATT_THREADS, sh, s>>>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, 1.0f / sqrtf((float)hd));
  CUDA_LAUNCH_CHECK("k_attn_fwd");
}

template <typename E, int NC>
static void att_bwd_launch(const E *dout, const E *q, const E *k, const E *v, int64_t ld, const float *lse,
                           const float *delta, E *dq, E *dk, E *dv, int B, int T, int nh, int nkv, int hd,
                           cudaStream_t s) {
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t sh_dq =
      sizeof(float) * ((size_t)2 * ATT_KB * (hd + 4) + (size_t)2 * ATT_QB * hd + ATT_QB * 32);
  att_smem(k_attn_bwd_dq<E, NC>, sh_dq);
  k_attn_bwd_dq<E, NC><<<dim3((T + ATT_QB - 1) / ATT_QB, nh, B), ATT_THREADS, sh_dq, s>>>(
      dout, q, k, v, ld, lse, delta, dq, B, T, nh, nkv, hd, scale);
  CUDA_LAUNCH_CHECK("k_attn_bwd_dq");
  const size_t sh_kv = sizeof(float) * ((size_t)2 * ATT_QB * hd + (size_t)2 * ATT_KB * (hd + 4) + 2 * ATT_KB +
                                        (size_t)2 * ATT_WARPS * ATT_RPW * 32);
  att_smem(k_attn_bwd_dkdv<E, NC>, sh_kv);
  k_attn_bwd_dkdv<E, NC><<<dim3((T + ATT_QB - 1) / ATT_QB, nkv, B), ATT_THREADS, sh_kv, s>>>(
      dout, q, k, v, ld, lse, delta, dk, dv, B, T, nh, nkv, hd, scale);
  CUDA_LAUNCH_CHECK("k_attn_bwd_dkdv");
}

template <typename E>
static void att_fwd_run(const void *qv, const void *kv, const void *vv, int64_t ld, void *ov, float *lse, int B, int T,
                        int nh, int nkv, int hd, cudaStream_t s) {
  const E *q = (const E *)qv, *k = (const E *)kv, *v = (const E *)vv;
  E *o = (E *)ov;
  switch (att_nc(hd)) {
    case 1: att_fwd_launch<E, 1>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s); break;
    case 2: att_fwd_launch<E, 2>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s); break;
    case 4: att_fwd_launch<E, 4>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s); break;
    default: att_fwd_launch<E, 8>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s); break;
  }
}

template <typename E>
static void att_bwd_run(k_cuda_ctx *c, const void *doutv, const void *qv, const void *kv, const void *vv, int64_t ld,
                        const void *ov, const float *lse, void *dqv, void *dkv, void *dvv, int B, int T, int nh,
                        int nkv, int hd) {
  cudaStream_t s = c->stream;
  const E *dout = (const E *)doutv, *q = (const E *)qv, *k = (const E *)kv, *v = (const E *)vv, *o = (const E *)ov;
  E *dq = (E *)dqv, *dk = (E *)dkv, *dv = (E *)dvv;
  const int64_t n_rows = (int64_t)B * T * nh;
  float *delta = (float *)k_cuda_scratch(c, sizeof(float) * (size_t)n_rows);  // (B, nh, T)
  k_attn_delta<E><<<k_cuda_blocks(n_rows * 32, K_CUDA_THREADS), K_CUDA_THREADS, 0, s>>>(dout, o, delta, B, T, nh, hd);
  CUDA_LAUNCH_CHECK("k_attn_delta");
  switch (att_nc(hd)) {
    case 1: att_bwd_launch<E, 1>(dout, q, k, v, ld, lse, delta, dq, dk, dv, B, T, nh, nkv, hd, s); break;
    case 2: att_bwd_launch<E, 2>(dout, q, k, v, ld, lse, delta, dq, dk, dv, B, T, nh, nkv, hd, s); break;
    case 4: att_bwd_launch<E, 4>(dout, q, k, v, ld, lse, delta, dq, dk, dv, B, T, nh, nkv, hd, s); break;
    default: att_bwd_launch<E, 8>(dout, q, k, v, ld, lse, delta, dq, dk, dv, B, T, nh, nkv, hd, s); break;
  }
}

extern "C" void k_cuda_attn_fwd(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, float *lse, int B,
                                int T, int nh, int nkv, int hd) {
  att_check(B, T, nh, nkv, hd);
  CHECK(ld >= (int64_t)nh * hd && ld >= (int64_t)nkv * hd, "attention: row stride %lld too small", (long long)ld);
  if (B <= 0 || T <= 0 || nh <= 0) return;
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  if (c->act == K_BF16) att_fwd_run<k_bf16>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s);
  else att_fwd_run<float>(q, k, v, ld, o, lse, B, T, nh, nkv, hd, s);
}

extern "C" void k_cuda_attn_bwd(k_backend *b, const void *dout, const void *q, const void *k, const void *v, int64_t ld,
                                const void *o, const float *lse, void *dq, void *dk, void *dv, int B, int T, int nh,
                                int nkv, int hd) {
  att_check(B, T, nh, nkv, hd);
  CHECK(ld >= (int64_t)nh * hd && ld >= (int64_t)nkv * hd, "attention: row stride %lld too small", (long long)ld);
  if (B <= 0 || T <= 0 || nh <= 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) att_bwd_run<k_bf16>(c, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
  else att_bwd_run<float>(c, dout, q, k, v, ld, o, lse, dq, dk, dv, B, T, nh, nkv, hd);
}
