// CRC-32C (Castagnoli) of checkpoint tensors. A tensor's checksum covers its full logical contents
// (float32 little-endian, row-major over the full shape), whatever layout wrote or reads it: each
// rank computes the contribution of the blocks it holds, the contributions of all ranks XOR
// together (in any order) and ckpt_crc_finish turns the XOR into the standard CRC-32C of the
// whole tensor, the value any CRC-32C tool computes over the same bytes. This works because a
// CRC without its initial and final inversion is linear over GF(2): the CRC of a message is the
// XOR of the CRCs of its pieces, each followed by the zero bytes that pad it to the message's end.
#ifndef TRAINER_CKPT_CRC_H
#define TRAINER_CKPT_CRC_H

#include <stddef.h>
#include <stdint.h>

// Standard CRC-32C, streaming: crc of (earlier bytes || data), starting from crc = 0.
uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t n_bytes);
// The register update without the initial and final inversion (hardware CRC32 instructions where
// the CPU has them: SSE4.2, ARMv8 CRC), and the same by a byte table (the reference in tests).
uint32_t ckpt_crc_raw(uint32_t state, const void *data, size_t n_bytes);
uint32_t ckpt_crc_raw_table(uint32_t state, const void *data, size_t n_bytes);
// raw followed by n_bytes zero bytes, in O(log n_bytes).
uint32_t ckpt_crc_shift(uint32_t raw, uint64_t n_bytes);
// The contribution of this rank's dense block [start, start + count) of a float32 tensor of shape
// full (ndim <= 4) to the tensor's checksum; 0 for an empty block. XOR the contributions of blocks
// that tile the tensor exactly once, then call ckpt_crc_finish. n_nonfinite (NULL: not wanted)
// gets the block's NaNs and infinities, counted in the same pass.
uint32_t ckpt_crc_block(const float *data, int ndim, const int64_t *full, const int64_t *start, const int64_t *count,
                        int64_t *n_nonfinite);
// The CRC-32C of an n_bytes message from the XOR of its pieces' contributions.
uint32_t ckpt_crc_finish(uint32_t xor_of_blocks, uint64_t n_bytes);

// A dense block [start, start + count) of a row-major tensor of shape full is a sequence of equal
// contiguous runs (the trailing dimensions it spans whole merge into one run), at known offsets in
// the tensor: how the checksum walks a block, and how an asynchronous save writes it (ckpt_async.c).
typedef struct ckpt_runs {
  int j;                         // runs span dimensions j.. (the outer ones 0..j-1 index them)
  int64_t run, n_runs, n_total;  // floats per run, runs, floats in the whole tensor
  int64_t stride[4];
  const int64_t *start, *count;  // the caller's, read by ckpt_run_offset
} ckpt_runs;
// 0 for an empty block (nothing to walk), else 1 with b set up (ndim <= 4).
int ckpt_runs_init(ckpt_runs *b, int ndim, const int64_t *full, const int64_t *start, const int64_t *count);
// Where run r (r * run floats into the dense block) starts in the tensor, in floats.
int64_t ckpt_run_offset(const ckpt_runs *b, int64_t r);

#endif
