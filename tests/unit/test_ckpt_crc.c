// CRC-32C of checkpoint tensors: the standard check value, the hardware path against the byte
// table on every length and alignment near the lane boundaries, and the block contributions of
// several tilings of one tensor, which must XOR to the CRC of the whole tensor computed in one
// pass. `test_ckpt_crc --bench` prints what checksums and the finiteness check cost per GiB
// beside memcpy instead (nothing asserted).
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "tests/unit/test_util.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void check_known_value(void) {
  uint32_t c = ckpt_crc32c(0, "123456789", 9);
  EXPECT(c == 0xE3069283u, "CRC-32C of '123456789' is %08x, the standard check value is e3069283", c);
  uint32_t split = ckpt_crc32c(ckpt_crc32c(0, "1234", 4), "56789", 5);
  EXPECT(split == c, "streaming in two pieces gives %08x", split);
}

static void check_fast_path(void) {
  size_t n_max = 3 * 4096 * 2 + 64;
  unsigned char *buf = malloc(n_max + 8);
  for (size_t i = 0; i < n_max + 8; i++) buf[i] = (unsigned char)(i * 131 + (i >> 7));
  size_t lens[] = {0, 1, 7, 8, 9, 1535, 1536, 1537, 4095, 8192, 12287, 12288, 12289, 12288 * 2 + 17, n_max};
  int bad = 0;
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (int align = 0; align < 8; align++)
      bad += ckpt_crc_raw(0x1234567u, buf + align, lens[k]) != ckpt_crc_raw_table(0x1234567u, buf + align, lens[k]);
  EXPECT(bad == 0, "%d (length, alignment) cases where the fast path and the byte table differ", bad);
  free(buf);
}

// A (6, 10, 4) tensor tiled by blocks of each shape below; every tiling must reproduce the CRC.
static void check_tilings(void) {
  enum { D0 = 6, D1 = 10, D2 = 4 };
  static float t[D0 * D1 * D2];
  for (int i = 0; i < D0 * D1 * D2; i++) t[i] = (float)i * 0.37f - 11.0f;
  uint32_t whole = ckpt_crc32c(0, t, sizeof t);
  int64_t full[3] = {D0, D1, D2};
  int64_t tiles[][3] = {{D0, D1, D2}, {1, D1, D2}, {D0, 5, D2}, {3, 2, D2}, {2, D1, 1}, {D0, 1, 2}, {1, 1, 1}};
  for (size_t k = 0; k < sizeof tiles / sizeof tiles[0]; k++) {
    const int64_t *c = tiles[k];
    uint32_t x = 0;
    float block[D0 * D1 * D2];
    for (int64_t a = 0; a < D0; a += c[0])
      for (int64_t b = 0; b < D1; b += c[1])
        for (int64_t e = 0; e < D2; e += c[2]) {
          int64_t start[3] = {a, b, e}, n = 0;
          for (int64_t i = 0; i < c[0]; i++)
            for (int64_t j = 0; j < c[1]; j++)
              for (int64_t l = 0; l < c[2]; l++) block[n++] = t[((a + i) * D1 + b + j) * D2 + e + l];
          x ^= ckpt_crc_block(block, 3, full, start, c, NULL);
        }
    uint32_t got = ckpt_crc_finish(x, sizeof t);
    EXPECT(got == whole, "tiles (%lld, %lld, %lld): %08x, whole tensor %08x", (long long)c[0], (long long)c[1],
           (long long)c[2], got, whole);
  }
  int64_t start[3] = {0, 0, 0}, none[3] = {0, D1, D2};
  EXPECT(ckpt_crc_block(NULL, 3, full, start, none, NULL) == 0, "an empty block contributes 0");
}

// A (12, 2^19) tensor, large enough that the threads split one long run into pieces and many
// runs into ranges: whole, and as two column halves (tp = 2).
static void check_large(void) {
  int64_t rows = 12, cols = 1 << 19, half = cols / 2, full[2] = {rows, cols};
  float *t = malloc((size_t)(rows * cols) * sizeof(float)), *h = malloc((size_t)(rows * half) * sizeof(float));
  for (int64_t i = 0; i < rows * cols; i++) t[i] = (float)(i % 9973) - 4000.5f;
  uint32_t whole = ckpt_crc32c(0, t, (size_t)(rows * cols) * sizeof(float)), x = 0;
  uint32_t one = ckpt_crc_finish(ckpt_crc_block(t, 2, full, (int64_t[]){0, 0}, full, NULL), (uint64_t)(rows * cols) * 4);
  for (int64_t c0 = 0; c0 < cols; c0 += half) {
    for (int64_t i = 0; i < rows; i++) memcpy(h + i * half, t + i * cols + c0, (size_t)half * sizeof(float));
    x ^= ckpt_crc_block(h, 2, full, (int64_t[]){0, c0}, (int64_t[]){rows, half}, NULL);
  }
  uint32_t halves = ckpt_crc_finish(x, (uint64_t)(rows * cols) * sizeof(float));
  EXPECT(one == whole && halves == whole, "large tensor: whole block %08x, column halves %08x, expected %08x", one,
         halves, whole);
  int64_t nf = -1;
  ckpt_crc_block(t, 2, full, (int64_t[]){0, 0}, full, &nf);
  EXPECT(nf == 0, "finite tensor: %lld non-finite values counted", (long long)nf);
  t[5 * cols + 7] = INFINITY;
  t[11 * cols + 3] = NAN;
  EXPECT(ckpt_first_nonfinite(t, rows * cols) == 5 * cols + 7, "the first Inf is not found");
  ckpt_crc_block(t, 2, full, (int64_t[]){0, 0}, full, &nf);  // one long run, in pieces
  EXPECT(nf == 2, "whole block: %lld non-finite values counted, expected 2", (long long)nf);
  int64_t nf_half = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += half) {  // many runs, in ranges
    for (int64_t i = 0; i < rows; i++) memcpy(h + i * half, t + i * cols + c0, (size_t)half * sizeof(float));
    ckpt_crc_block(h, 2, full, (int64_t[]){0, c0}, (int64_t[]){rows, half}, &nf);
    nf_half += nf;
  }
  EXPECT(nf_half == 2, "column halves: %lld non-finite values counted, expected 2", (long long)nf_half);
  free(t);
  free(h);
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Seconds per GiB of fn over buf (n_bytes), best of 3.
static double per_gib(void (*fn)(const float *, size_t, uint32_t *), const float *buf, size_t n_bytes, uint32_t *sink) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    double t0 = seconds();
    fn(buf, n_bytes, sink);
    double dt = seconds() - t0;
    best = dt < best ? dt : best;
  }
  return best * (double)(1u << 30) / (double)n_bytes;
}

static void run_copy(const float *x, size_t n, uint32_t *sink) {
  static float *dst;
  if (!dst) dst = malloc(n);
  memcpy(dst, x, n);
  *sink ^= (uint32_t)dst[n / 8];
}
static void run_fast(const float *x, size_t n, uint32_t *sink) {
  int64_t full[1] = {(int64_t)(n / sizeof(float))}, start[1] = {0};
  *sink ^= ckpt_crc_block(x, 1, full, start, full, NULL);
}
static void run_table(const float *x, size_t n, uint32_t *sink) { *sink ^= ckpt_crc_raw_table(0, x, n / 8); }
// A tp=2 column block of a (rows, 2 * 2048) tensor: one 8 KiB run per row, combined by shifts.
static void run_block(const float *x, size_t n, uint32_t *sink) {
  int64_t cols = 2048, rows = (int64_t)(n / sizeof(float)) / cols;
  int64_t full[2] = {rows, 2 * cols}, start[2] = {0, cols}, count[2] = {rows, cols};
  *sink ^= ckpt_crc_block(x, 2, full, start, count, NULL);
}
static void run_finite(const float *x, size_t n, uint32_t *sink) {
  *sink ^= (uint32_t)ckpt_first_nonfinite(x, (int64_t)(n / sizeof(float)));
}

static void bench(void) {
  size_t n_bytes = (size_t)512 << 20;
  float *buf = malloc(n_bytes);
  for (size_t i = 0; i < n_bytes / sizeof(float); i++) buf[i] = (float)(i % 1000) * 0.001f;
  uint32_t sink = 0;
  double copy = per_gib(run_copy, buf, n_bytes, &sink), fast = per_gib(run_fast, buf, n_bytes, &sink),
         block = per_gib(run_block, buf, n_bytes, &sink), finite = per_gib(run_finite, buf, n_bytes, &sink),
         table = per_gib(run_table, buf, n_bytes, &sink) * 8;
  printf("seconds per GiB, %d OpenMP thread(s), %zu MiB buffer [%08x]:\n", omp_get_max_threads(), n_bytes >> 20, sink);
  printf("  memcpy (baseline)                      %.3f\n", copy);
  printf("  crc32c, hardware path, whole tensor    %.3f\n", fast);
  printf("  crc32c, hardware path, tp column block %.3f\n", block);
  printf("  finiteness check                       %.3f\n", finite);
  printf("  crc32c, byte table (portable)          %.3f\n", table);
  free(buf);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench(), 0;
  check_known_value();
  check_fast_path();
  check_tilings();
  check_large();
  return test_summary();
}
