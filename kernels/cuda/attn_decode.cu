// The decoding attention (attn_decode.h). Block h is query head h: it keeps q in shared memory,
// then for each chunk of DEC_CHUNK keys a warp per key computes the scaled score (lanes over
// the head dim, a warp sum), the block finds the chunk's max, rescales the running sum and
// output by exp(old max - new max) and adds exp(score - max) and its weighted values; thread i
// owns output element i. The order of every sum depends only on the shape.
#include "kernels/cuda/attn_decode.h"
#include "kernels/cuda/cuda_common.cuh"

enum { DEC_THREADS = 256, DEC_CHUNK = 1024, DEC_MAX_HD = DEC_THREADS };

template <typename E>
__global__ void k_attn_decode(const E *q, const E *k, const E *v, int64_t ld, E *o, int n_keys, int grp, int hd,
                              float scale) {
  __shared__ float qs[DEC_MAX_HD], s[DEC_CHUNK], red[32];
  const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  const E *kh = k + (int64_t)(h / grp) * hd, *vh = v + (int64_t)(h / grp) * hd;
  for (int i = tid; i < hd; i += blockDim.x) qs[i] = k_ld(q[(int64_t)h * hd + i]);
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int c0 = 0; c0 < n_keys; c0 += DEC_CHUNK) {
    const int n = n_keys - c0 < DEC_CHUNK ? n_keys - c0 : DEC_CHUNK;
    for (int t = warp; t < n; t += n_warps) {
      const E *kt = kh + (int64_t)(c0 + t) * ld;
      float d = 0.0f;
      for (int i = lane; i < hd; i += 32) d += qs[i] * k_ld(kt[i]);
      d = k_warp_sum(d);
      if (lane == 0) s[t] = d * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int t = tid; t < n; t += blockDim.x) mx = s[t] > mx ? s[t] : mx;
    const float m_new = fmaxf(m, k_block_max(mx, red));
    for (int t = tid; t < n; t += blockDim.x) s[t] = expf(s[t] - m_new);
    __syncthreads();
    float sum = 0.0f;
    for (int t = tid; t < n; t += blockDim.x) sum += s[t];
    sum = k_block_sum(sum, red);
    const float corr = expf(m - m_new);  // 0 for the first chunk (m = -inf)
    l = l * corr + sum;
    if (tid < hd) {
      float a = 0.0f;
      for (int t = 0; t < n; t++) a += s[t] * k_ld(vh[(int64_t)(c0 + t) * ld + tid]);
      acc = acc * corr + a;
    }
    m = m_new;
    __syncthreads();  // s is rewritten by the next chunk
  }
  if (tid < hd) o[(int64_t)h * hd + tid] = k_st<E>(acc / l);
}

template <typename E>
static void attn_decode_launch(const void *q, const void *k, const void *v, int64_t ld, void *o, int n_keys, int nh, int nkv,
                               int hd, cudaStream_t s) {
  k_attn_decode<E><<<nh, DEC_THREADS, 0, s>>>((const E *)q, (const E *)k, (const E *)v, ld, (E *)o, n_keys, nh / nkv, hd,
                                              1.0f / sqrtf((float)hd));
  CUDA_LAUNCH_CHECK("k_attn_decode");
}

extern "C" void k_cuda_attn_decode(k_backend *b, const void *q, const void *k, const void *v, int64_t ld, void *o, int n_keys,
                                   int nh, int nkv, int hd) {
  CHECK(nh > 0 && nkv > 0 && nh % nkv == 0 && n_keys >= 1 && hd >= 1 && hd <= DEC_MAX_HD,
        "attn_decode: nh %d, nkv %d, n_keys %d, hd %d (nh a multiple of nkv, a key at least, head dim 1..%d)", nh, nkv,
        n_keys, hd, DEC_MAX_HD);
  CHECK(ld >= (int64_t)nkv * hd, "attn_decode: row stride %lld < nkv * hd = %d", (long long)ld, nkv * hd);
  const k_cuda_ctx *c = k_cuda_ctx_of(b);
  if (c->act == K_BF16) attn_decode_launch<k_bf16>(q, k, v, ld, o, n_keys, nh, nkv, hd, c->stream);
  else attn_decode_launch<float>(q, k, v, ld, o, n_keys, nh, nkv, hd, c->stream);
}
