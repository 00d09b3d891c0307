// bf16 <-> fp32 on the host, bit for bit as the GPU converts: round to nearest even, NaN stays
// NaN (the quiet bit set, so rounding cannot turn it into Inf).
#ifndef TRAINER_BF16_H
#define TRAINER_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t k_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float k_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#endif
