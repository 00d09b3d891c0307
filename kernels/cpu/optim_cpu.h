// Multi-tensor optimizer ops on the CPU (kernels/backend.h: sumsq_ranges, adamw_ranges): the
// CPU backend's, and the update of optimizer state kept in host memory. The bits are those of
// calling sumsq / scale / adamw of ops_cpu.c per tensor.
#ifndef TRAINER_OPTIM_CPU_H
#define TRAINER_OPTIM_CPU_H

#include "kernels/backend.h"

double k_cpu_sumsq_ranges(const float *x, const k_range *r, int n_ranges);
// AdamW over the ranges as backend.h's adamw_ranges says, on all OpenMP threads, one pass per
// element, on the widest vector kernel the CPU has.
void k_cpu_adamw_ranges(float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v, const k_range *r,
                        int n_ranges, float lr, float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float g_scale);
// The same on the widest kernel of at most isa (K_ISA_SSE: the scalar one). Every kernel gives
// the same bits; isa only caps the speed (train.cpu_isa, and tests checking each kernel).
void k_cpu_adamw_ranges_isa(k_isa isa, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v,
                            const k_range *r, int n_ranges, float lr, float beta1, float beta2, float eps,
                            float weight_decay, float bc1, float bc2, float g_scale);

#endif
