// Multi-tensor optimizer ops on CPU ranks (see optim_cpu.h). The element math repeats
// k_cpu_adamw's expression exactly, on g * g_scale, which is the value the separate scale pass
// used to leave in g; so a run gives the same bits as the per-tensor calls did.
#include "kernels/cpu/optim_cpu.h"

#include <math.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/check.h"
#include "kernels/cpu/ops_cpu.h"

// Elementwise ranges shorter than this run on one thread (as in ops_cpu.c).
#define OPTIM_PAR_MIN ((int64_t)1 << 15)

double k_cpu_sumsq_ranges(const float *x, const k_range *r, int n_ranges) {
  double s = 0;
  for (int i = 0; i < n_ranges; i++) s += k_cpu_sumsq(x + r[i].offset, r[i].n_elem);
  return s;
}

void k_cpu_adamw_ranges(float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                        int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float g_scale) {
  for (int k = 0; k < n_ranges; k++) {
    const int64_t o = r[k].offset, po = r[k].p_offset, n = r[k].n_elem;
    const float wd = r[k].decay ? weight_decay : 0.0f;
    float *pk = p + po, *mk = m + o, *vk = v + o;
    const float *gk = g + o;
#pragma omp parallel for schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
      const float gi = gk[i] * g_scale;
      const float mi = beta1 * mk[i] + (1.0f - beta1) * gi;
      const float vi = beta2 * vk[i] + (1.0f - beta2) * gi * gi;
      mk[i] = mi;
      vk[i] = vi;
      pk[i] -= lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * pk[i]);
    }
    if (!pc) continue;
    if (pc_type == K_BF16) {
      uint16_t *h = (uint16_t *)pc + po;
      for (int64_t i = 0; i < n; i++) h[i] = k_f32_to_bf16(pk[i]);
    } else {
      CHECK(pc_type == K_F32, "adamw_ranges: unknown compute-copy dtype %d", (int)pc_type);
      memcpy((float *)pc + po, pk, (size_t)n * sizeof(float));
    }
  }
}
