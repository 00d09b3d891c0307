// CUDA multi-tensor ops (kernels/backend.h: sumsq_ranges, adamw_ranges, tested against
// kernels/cpu/optim_cpu.c; fp8_cast_spans, against kernels/cpu/fp8_cpu.c). Enqueued on b's
// compute stream; the device copies of the range lists and the partial sums are cached in b's
// context.
#ifndef TRAINER_OPTIM_CUDA_H
#define TRAINER_OPTIM_CUDA_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

double k_cuda_sumsq_ranges(k_backend *b, const float *x, const k_range *r, int n_ranges);
void k_cuda_adamw_ranges(k_backend *b, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                         int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                         float bc2, float g_scale);

void k_cuda_fp8_cast_spans(k_backend *b, const void *x, const k_span *spans, int n_spans, const float *scale,
                           k_fp8 fmt, uint8_t *out, float *amax);

#ifdef __cplusplus
}
#endif

#endif
