// CPU reference of the multi-tensor optimizer ops (kernels/backend.h: sumsq_ranges,
// adamw_ranges): the single-tensor kernels of ops_cpu.c applied range by range, so the bits are
// those of calling sumsq / scale / adamw per tensor.
#ifndef TRAINER_OPTIM_CPU_H
#define TRAINER_OPTIM_CPU_H

#include "kernels/backend.h"

double k_cpu_sumsq_ranges(const float *x, const k_range *r, int n_ranges);
void k_cpu_adamw_ranges(float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                        int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float g_scale);

#endif
