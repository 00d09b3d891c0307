// FP8 on the CPU: the exact reference of the backend's FP8 ops (kernels/backend.h: fp8_cast,
// gemm_fp8, fp8_scales), so that FP8 training runs on CPU ranks and every GPU kernel is tested
// bit for bit against it. Formats (OCP FP8; k_fp8 in kernels/backend.h):
//   E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals 2^-9 apart; largest
//         finite 448 (0x7E); no Inf; 0x7F / 0xFF are NaN.
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits; subnormals 2^-16 apart; largest
//         finite 57344 (0x7B); 0x7C / 0xFC are +-Inf, 0x7D-0x7F / 0xFD-0xFF NaN.
// Encoding rounds to nearest, ties to even, and saturates: anything beyond the largest finite
// value, Inf included, becomes +-largest finite (PTX's cvt.rn.satfinite). A NaN becomes 0x7F in
// both formats (one code, so the GPU's output is compared bit for bit). Signs survive underflow
// (-1e-30 -> 0x80, negative zero).
#ifndef TRAINER_FP8_CPU_H
#define TRAINER_FP8_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/backend.h"  // k_fp8, k_isa

// Largest finite value of a format.
static inline float k_fp8_max(k_fp8 f) { return f == K_E5M2 ? 57344.0f : 448.0f; }
static inline const char *k_fp8_name(k_fp8 f) { return f == K_E5M2 ? "E5M2" : "E4M3"; }

// Whether gemm_fp8 can run (M, N, K) with these formats and pointers, on every backend alike (so
// a CPU rank refuses what a GPU would). Hopper's FP8 GEMMs (cuBLASLt) need M, N and K multiples
// of 16, 16-byte aligned operands and at least one E4M3 operand. Returns 0 when legal, else 1
// with a message in msg naming the dimension and the nearest legal value.
static inline int k_fp8_gemm_check(int M, int N, int K, k_fp8 a_fmt, k_fp8 b_fmt, const void *A, const void *B, const void *C,
                                   char *msg, size_t msg_bytes) {
  const int dims[3] = {M, N, K};
  const char *names[3] = {"M", "N", "K"};
  for (int i = 0; i < 3; i++) {
    if (dims[i] > 0 && dims[i] % 16 == 0) continue;
    const int near = dims[i] <= 16 ? 16 : (dims[i] + 8) / 16 * 16;
    snprintf(msg, msg_bytes, "gemm_fp8: %s=%d must be a positive multiple of 16 (FP8 GEMMs on Hopper); nearest legal "
             "value %d (pad the tensor or keep this GEMM in bf16)", names[i], dims[i], near);
    return 1;
  }
  if ((a_fmt != K_E4M3 && a_fmt != K_E5M2) || (b_fmt != K_E4M3 && b_fmt != K_E5M2)) {
    snprintf(msg, msg_bytes, "gemm_fp8: unknown FP8 format (A %d, B %d): use K_E4M3 or K_E5M2", (int)a_fmt, (int)b_fmt);
    return 1;
  }
  if (a_fmt == K_E5M2 && b_fmt == K_E5M2) {
    snprintf(msg, msg_bytes, "gemm_fp8: E5M2 x E5M2 is not supported by Hopper's FP8 GEMMs: keep one operand in E4M3 "
             "(gradients E5M2, weights and activations E4M3)");
    return 1;
  }
  const uintptr_t p[3] = {(uintptr_t)A, (uintptr_t)B, (uintptr_t)C};
  for (int i = 0; i < 3; i++)
    if (p[i] % 16) {
      snprintf(msg, msg_bytes, "gemm_fp8: operand %c at %p is not 16-byte aligned (FP8 GEMMs need it)", "ABC"[i],
               (const void *)p[i]);
      return 1;
    }
  return 0;
}

// Whether a GPU can train in FP8: FP8 tensor cores (and cuBLASLt's FP8 GEMMs) need compute
// capability 8.9 (Ada) or later, Hopper's 9.0 included. Returns 0 when it can, else 1 with a
// one-line message in msg naming the GPU, its capability and the fix. Pure, so that CPU tests
// cover it; the CUDA backend calls it with the device's properties (k_cuda_device_fp8_check).
static inline int k_fp8_device_check(const char *gpu_name, int cc_major, int cc_minor, char *msg, size_t msg_bytes) {
  if (cc_major > 8 || (cc_major == 8 && cc_minor >= 9)) return 0;
  snprintf(msg, msg_bytes, "train.precision=fp8 needs FP8 tensor cores (compute capability 8.9 or later: Ada, "
           "Hopper) and %s has compute capability %d.%d: set train.precision=bf16", gpu_name, cc_major, cc_minor);
  return 1;
}

// Block scaling (fp8.recipe=block, as DeepSeek-V3 trained): E4M3 codes with one fp32 scale per
// tile, 1 x 128 (activations, gradients: 128 consecutive elements of a row, along K) or 128 x 128
// (weights), each tile scaled from its own amax: s = 448 / amax (fp32 division; clamped to
// [FLT_MIN, FLT_MAX]; 1 where the amax is 0, NaN or Inf), codes = encode(x * s), and the GEMM
// reads 1 / s (fp32). Scale arrays are laid out as cuBLASLt's block-scaled GEMMs read them (seen
// on an H100 with cuBLAS 13: other layouts give wrong products), for an operand of R rows and K
// columns (K innermost): 1 x 128, [ceil(K / 128)][R] (R contiguous); 128 x 128,
// [ceil(R / 128)][ld] with ld = ceil(K / 128) rounded up to a multiple of 4 (the padding is
// neither read nor written).
enum { K_FP8_BLOCK = 128 };
static inline int k_fp8_blocks(int64_t n) { return (int)((n + K_FP8_BLOCK - 1) / K_FP8_BLOCK); }
static inline int k_fp8_block_ld(int64_t k) { return (k_fp8_blocks(k) + 3) / 4 * 4; }
// Floats of the scale array of an (R, K) operand with tile 1 or 128.
static inline int64_t k_fp8_block_scales_n(int64_t R, int64_t K, int tile) {
  return tile == 1 ? (int64_t)k_fp8_blocks(K) * R : (int64_t)k_fp8_blocks(R) * k_fp8_block_ld(K);
}
// The index of the scale of element (r, k) of an (R, K) operand.
static inline int64_t k_fp8_block_scale_at(int64_t R, int64_t K, int tile, int64_t r, int64_t k) {
  return tile == 1 ? (k / K_FP8_BLOCK) * R + r : (r / K_FP8_BLOCK) * k_fp8_block_ld(K) + k / K_FP8_BLOCK;
}

// Whether gemm_fp8_block can run (M, N, K) with these tiles: k_fp8_gemm_check's rules (E4M3 both),
// tiles 1 or 128, not both 128 (cuBLASLt on Hopper multiplies 1x128 by 128x128, 128x128 by 1x128
// and 1x128 by 1x128). 0 when legal, else 1 with a message.
static inline int k_fp8_gemm_block_check(int M, int N, int K, int a_tile, int b_tile, const void *A, const void *B,
                                         const void *C, char *msg, size_t msg_bytes) {
  if (k_fp8_gemm_check(M, N, K, K_E4M3, K_E4M3, A, B, C, msg, msg_bytes)) return 1;
  if ((a_tile != 1 && a_tile != 128) || (b_tile != 1 && b_tile != 128) || (a_tile == 128 && b_tile == 128)) {
    snprintf(msg, msg_bytes, "gemm_fp8_block: tiles %d and %d: each 1 (1 x 128) or 128 (128 x 128), not both 128",
             a_tile, b_tile);
    return 1;
  }
  return 0;
}

#ifdef __cplusplus
extern "C" {
#endif

// One value: round to nearest even with saturation (see the top of this file); and back, exactly.
uint8_t k_cpu_fp8_encode(float x, k_fp8 fmt);
float k_cpu_fp8_decode(uint8_t code, k_fp8 fmt);

// out (rows, cols) = encode(x * scale) (the product rounded to fp32 first, as the GPU does);
// out_t (cols, rows) the same transposed (NULL: none); *amax = max(*amax, max |x|), taken on the
// bits of |x| as unsigned integers (for non-negative floats that is their order, and any NaN
// exceeds Inf), so a NaN in x makes *amax NaN. *amax must be non-negative or NaN.
void k_cpu_fp8_cast(const float *x, int64_t rows, int cols, float scale, k_fp8 fmt, uint8_t *out, uint8_t *out_t, float *amax);

// k_cpu_fp8_cast over spans of a flat x (kernels/backend.h, fp8_cast_spans): for each span s,
// out[s.at, + s.n_elem) = encode(x * scale[s.tensor]) (out NULL: not written), and amax[s.tensor]
// (NULL: not taken) as k_cpu_fp8_cast takes it.
void k_cpu_fp8_cast_spans(const float *x, const k_span *spans, int n_spans, const float *scale, k_fp8 fmt, uint8_t *out,
                          float *amax);
// codes_t (cols, rows) = codes (rows, cols) transposed, byte by byte.
void k_cpu_fp8_transpose(const uint8_t *codes, int64_t rows, int cols, uint8_t *codes_t);

// C (M,N) fp32 = beta C + alpha (A B^T), alpha = a_scale_inv * b_scale_inv (rounded to fp32):
// A (M,K) and B (N,K) decoded exactly to fp32 and multiplied by k_cpu_gemm_isa, so the scale
// multiplies the fp32 sum, as cuBLASLt applies it. Checks k_fp8_gemm_check.
void k_cpu_gemm_fp8(k_isa isa, int M, int N, int K, const uint8_t *A, k_fp8 a_fmt, float a_scale_inv, const uint8_t *B,
                    k_fp8 b_fmt, float b_scale_inv, float beta, float *C);

// Block-scaled cast of x (rows, cols) (see K_FP8_BLOCK above), E4M3. tile 1: out (rows, cols)
// in 1 x 128 tiles along cols, scale_inv its (rows, cols) scales; out_t (cols, rows) in 1 x 128
// tiles along rows (128 x 1 tiles of x: another quantization), scale_inv_t its (cols, rows)
// scales. tile 128: out and out_t the same codes, transposed, of 128 x 128 tiles, with their
// scales. Either output (with its scales) may be NULL. *amax as k_cpu_fp8_cast.
void k_cpu_fp8_cast_block(const float *x, int64_t rows, int cols, int tile, uint8_t *out, float *scale_inv,
                          uint8_t *out_t, float *scale_inv_t, float *amax);

// C (M,N) = beta C + A B^T block-scaled: A (M,K), B (N,K) E4M3 codes with tiles a_tile, b_tile
// and scale arrays in the layouts above. The exact definition, which this computes: for each
// element, p_j = the dot product of the j-th 128-column blocks of A's row and B's row, summed
// exactly (in fp64: the products of E4M3 codes are exact and 128 of them fit fp64's mantissa)
// and rounded to fp32; acc = sum over j ascending, in fp64, of p_j * (sa_j * sb_j) with the
// scale product rounded to fp32; C = fp32(acc + beta C). A GPU sums in its own order: the op
// suite bounds the difference. Checks k_fp8_gemm_block_check.
void k_cpu_gemm_fp8_block(int M, int N, int K, const uint8_t *A, int a_tile, const float *a_scale_inv, const uint8_t *B,
                          int b_tile, const float *b_scale_inv, float beta, float *C);

// The scale update of delayed scaling (kernels/backend.h, fp8_scales), the GPU's rules:
// history[i][pos] = amax[i]; a = max of the row (a NaN wins) if use_max, else amax[i]; a finite
// and > 0: scale[i] = clamp(ldexpf(fp8_max / a, -margin), FLT_MIN, FLT_MAX), scale_inv[i *
// inv_stride] = 1 / scale[i]; amax[i] = 0; *n_nonfinite += the count of non-finite amax[i].
void k_cpu_fp8_scales(float *amax_history, float *amax, float *scale, float *scale_inv, int inv_stride, const uint8_t *fmt,
                      int n, int len, int pos, int margin, int use_max, int *n_nonfinite);

#ifdef __cplusplus
}
#endif

#endif
