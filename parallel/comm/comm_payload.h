// Element access by comm_dtype for collective checks (tests and commbench): payloads are small
// integers, exact in every dtype, so results compare with == and a wrong byte is caught.
#ifndef TRAINER_COMM_PAYLOAD_H
#define TRAINER_COMM_PAYLOAD_H

#include <stdint.h>
#include <string.h>
#include "kernels/bf16.h"
#include "kernels/cpu/quant_cpu.h"
#include "parallel/comm/comm.h"

static inline void comm_payload_set(void *buf, int64_t i, comm_dtype t, double v) {
  switch (t) {
    case COMM_F32: ((float *)buf)[i] = (float)v; break;
    case COMM_BF16: ((uint16_t *)buf)[i] = k_f32_to_bf16((float)v); break;
    case COMM_F64: ((double *)buf)[i] = v; break;
    case COMM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case COMM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case COMM_F16: ((uint16_t *)buf)[i] = k_f32_to_f16((float)v); break;
    case COMM_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
  }
}

static inline double comm_payload_get(const void *buf, int64_t i, comm_dtype t) {
  switch (t) {
    case COMM_F32: return ((const float *)buf)[i];
    case COMM_BF16: return k_bf16_to_f32(((const uint16_t *)buf)[i]);
    case COMM_F64: return ((const double *)buf)[i];
    case COMM_I32: return ((const int32_t *)buf)[i];
    case COMM_I64: return (double)((const int64_t *)buf)[i];
    case COMM_F16: return k_f16_to_f32(((const uint16_t *)buf)[i]);
    case COMM_I8: return ((const int8_t *)buf)[i];
  }
  return 0;
}

static inline const char *comm_dtype_name(comm_dtype t) {
  static const char *const names[] = {"f32", "bf16", "f64", "i32", "i64", "f16", "i8"};
  return names[t];
}

#endif
