// The decoding attention on the CPU (attn_decode_cpu.h): per head, the scaled scores of every
// cached key, their softmax (sum in double) and the weighted sum of the values.
#include "kernels/cpu/attn_decode_cpu.h"
#include "kernels/base/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// One head: q (hd) over keys and values at stride ld; scores is scratch of n_keys.
static void attn_decode_head(const float *q, const float *k, const float *v, int64_t ld, float *o, int n_keys, int hd,
                             float scale, float *scores) {
  float mx = -INFINITY;
  for (int t = 0; t < n_keys; t++) {
    const float *kt = k + (int64_t)t * ld;
    float s = 0.0f;
    for (int i = 0; i < hd; i++) s += q[i] * kt[i];
    scores[t] = s * scale;
    if (scores[t] > mx) mx = scores[t];
  }
  double sum = 0.0;
  for (int t = 0; t < n_keys; t++) sum += scores[t] = expf(scores[t] - mx);
  memset(o, 0, (size_t)hd * sizeof(float));
  for (int t = 0; t < n_keys; t++) {
    const float p = (float)(scores[t] / sum), *vt = v + (int64_t)t * ld;
    for (int i = 0; i < hd; i++) o[i] += p * vt[i];
  }
}

void k_cpu_attn_decode(const float *q, const float *k, const float *v, int64_t ld, float *o, int n_keys, int nh, int nkv,
                       int hd) {
  CHECK(nkv > 0 && nh % nkv == 0 && n_keys >= 1, "attn_decode: nh %d, nkv %d, n_keys %d (nh a multiple of nkv, a key "
        "at least)", nh, nkv, n_keys);
  const int grp = nh / nkv;
  const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
  {
    float *scores = XMALLOC(sizeof(float) * (size_t)n_keys);
#pragma omp for schedule(static)
    for (int h = 0; h < nh; h++) {
      const int64_t kv = (int64_t)(h / grp) * hd;
      attn_decode_head(q + (int64_t)h * hd, k + kv, v + kv, ld, o + (int64_t)h * hd, n_keys, hd, scale, scores);
    }
    free(scores);
  }
}
