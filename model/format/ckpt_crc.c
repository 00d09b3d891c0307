// CRC-32C for checkpoint tensors (see ckpt_crc.h). The fast path runs three independent CRC
// streams over adjacent 4 KiB lanes, so the CRC32 instruction's 3-cycle latency is hidden, and
// joins them by shifting (multiplying by x^(8 * 4096) modulo the polynomial).
#include "model/format/ckpt_crc.h"

#include <string.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

#define CRC_POLY 0x82F63B78u  // Castagnoli, bit-reflected
// Lanes of the three-stream loop: 4 KiB for long runs, 512 B for the rest, and x^(8 * lane)
// modulo the polynomial for each, which joins the streams (tests/unit/test_ckpt_crc.c checks the fast
// path against the byte table across both).
#define CRC_LANE 4096
#define CRC_LANE_OP 0x35d73a62u
#define CRC_LANE_SMALL 512
#define CRC_LANE_SMALL_OP 0x74c360a4u

static const uint32_t crc_table[256] = {
    0x00000000, 0xf26b8303, 0xe13b70f7, 0x1350f3f4, 0xc79a971f, 0x35f1141c, 0x26a1e7e8, 0xd4ca64eb,
    0x8ad958cf, 0x78b2dbcc, 0x6be22838, 0x9989ab3b, 0x4d43cfd0, 0xbf284cd3, 0xac78bf27, 0x5e133c24,
    0x105ec76f, 0xe235446c, 0xf165b798, 0x030e349b, 0xd7c45070, 0x25afd373, 0x36ff2087, 0xc494a384,
    0x9a879fa0, 0x68ec1ca3, 0x7bbcef57, 0x89d76c54, 0x5d1d08bf, 0xaf768bbc, 0xbc267848, 0x4e4dfb4b,
    0x20bd8ede, 0xd2d60ddd, 0xc186fe29, 0x33ed7d2a, 0xe72719c1, 0x154c9ac2, 0x061c6936, 0xf477ea35,
    0xaa64d611, 0x580f5512, 0x4b5fa6e6, 0xb93425e5, 0x6dfe410e, 0x9f95c20d, 0x8cc531f9, 0x7eaeb2fa,
    0x30e349b1, 0xc288cab2, 0xd1d83946, 0x23b3ba45, 0xf779deae, 0x05125dad, 0x1642ae59, 0xe4292d5a,
    0xba3a117e, 0x4851927d, 0x5b016189, 0xa96ae28a, 0x7da08661, 0x8fcb0562, 0x9c9bf696, 0x6ef07595,
    0x417b1dbc, 0xb3109ebf, 0xa0406d4b, 0x522bee48, 0x86e18aa3, 0x748a09a0, 0x67dafa54, 0x95b17957,
    0xcba24573, 0x39c9c670, 0x2a993584, 0xd8f2b687, 0x0c38d26c, 0xfe53516f, 0xed03a29b, 0x1f682198,
    0x5125dad3, 0xa34e59d0, 0xb01eaa24, 0x42752927, 0x96bf4dcc, 0x64d4cecf, 0x77843d3b, 0x85efbe38,
    0xdbfc821c, 0x2997011f, 0x3ac7f2eb, 0xc8ac71e8, 0x1c661503, 0xee0d9600, 0xfd5d65f4, 0x0f36e6f7,
    0x61c69362, 0x93ad1061, 0x80fde395, 0x72966096, 0xa65c047d, 0x5437877e, 0x4767748a, 0xb50cf789,
    0xeb1fcbad, 0x197448ae, 0x0a24bb5a, 0xf84f3859, 0x2c855cb2, 0xdeeedfb1, 0xcdbe2c45, 0x3fd5af46,
    0x7198540d, 0x83f3d70e, 0x90a324fa, 0x62c8a7f9, 0xb602c312, 0x44694011, 0x5739b3e5, 0xa55230e6,
    0xfb410cc2, 0x092a8fc1, 0x1a7a7c35, 0xe811ff36, 0x3cdb9bdd, 0xceb018de, 0xdde0eb2a, 0x2f8b6829,
    0x82f63b78, 0x709db87b, 0x63cd4b8f, 0x91a6c88c, 0x456cac67, 0xb7072f64, 0xa457dc90, 0x563c5f93,
    0x082f63b7, 0xfa44e0b4, 0xe9141340, 0x1b7f9043, 0xcfb5f4a8, 0x3dde77ab, 0x2e8e845f, 0xdce5075c,
    0x92a8fc17, 0x60c37f14, 0x73938ce0, 0x81f80fe3, 0x55326b08, 0xa759e80b, 0xb4091bff, 0x466298fc,
    0x1871a4d8, 0xea1a27db, 0xf94ad42f, 0x0b21572c, 0xdfeb33c7, 0x2d80b0c4, 0x3ed04330, 0xccbbc033,
    0xa24bb5a6, 0x502036a5, 0x4370c551, 0xb11b4652, 0x65d122b9, 0x97baa1ba, 0x84ea524e, 0x7681d14d,
    0x2892ed69, 0xdaf96e6a, 0xc9a99d9e, 0x3bc21e9d, 0xef087a76, 0x1d63f975, 0x0e330a81, 0xfc588982,
    0xb21572c9, 0x407ef1ca, 0x532e023e, 0xa145813d, 0x758fe5d6, 0x87e466d5, 0x94b49521, 0x66df1622,
    0x38cc2a06, 0xcaa7a905, 0xd9f75af1, 0x2b9cd9f2, 0xff56bd19, 0x0d3d3e1a, 0x1e6dcdee, 0xec064eed,
    0xc38d26c4, 0x31e6a5c7, 0x22b65633, 0xd0ddd530, 0x0417b1db, 0xf67c32d8, 0xe52cc12c, 0x1747422f,
    0x49547e0b, 0xbb3ffd08, 0xa86f0efc, 0x5a048dff, 0x8ecee914, 0x7ca56a17, 0x6ff599e3, 0x9d9e1ae0,
    0xd3d3e1ab, 0x21b862a8, 0x32e8915c, 0xc083125f, 0x144976b4, 0xe622f5b7, 0xf5720643, 0x07198540,
    0x590ab964, 0xab613a67, 0xb831c993, 0x4a5a4a90, 0x9e902e7b, 0x6cfbad78, 0x7fab5e8c, 0x8dc0dd8f,
    0xe330a81a, 0x115b2b19, 0x020bd8ed, 0xf0605bee, 0x24aa3f05, 0xd6c1bc06, 0xc5914ff2, 0x37faccf1,
    0x69e9f0d5, 0x9b8273d6, 0x88d28022, 0x7ab90321, 0xae7367ca, 0x5c18e4c9, 0x4f48173d, 0xbd23943e,
    0xf36e6f75, 0x0105ec76, 0x12551f82, 0xe03e9c81, 0x34f4f86a, 0xc69f7b69, 0xd5cf889d, 0x27a40b9e,
    0x79b737ba, 0x8bdcb4b9, 0x988c474d, 0x6ae7c44e, 0xbe2da0a5, 0x4c4623a6, 0x5f16d052, 0xad7d5351,
};

uint32_t ckpt_crc_raw_table(uint32_t state, const void *data, size_t n_bytes) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n_bytes; i++) state = (state >> 8) ^ crc_table[(state ^ p[i]) & 0xff];
  return state;
}

// Product of two polynomials modulo the CRC polynomial, bit-reflected (bit 31 holds x^0).
static uint32_t crc_mul(uint32_t a, uint32_t b) {
  uint32_t prod = 0;
  for (int i = 0; i < 32; i++) {
    if (a & 0x80000000u) prod ^= b;
    a <<= 1;
    b = (b >> 1) ^ (b & 1 ? CRC_POLY : 0);
  }
  return prod;
}

// x^(8 n) modulo the polynomial: appending n zero bytes multiplies the register by it.
static uint32_t crc_zeros_op(uint64_t n_bytes) {
  uint32_t op = 0x80000000u, sq = 0x40000000u;  // x^0; x^1
  for (int i = 0; i < 3; i++) sq = crc_mul(sq, sq);  // x^8: one byte
  for (; n_bytes; n_bytes >>= 1) {
    if (n_bytes & 1) op = crc_mul(sq, op);
    sq = crc_mul(sq, sq);
  }
  return op;
}

uint32_t ckpt_crc_shift(uint32_t raw, uint64_t n_bytes) { return n_bytes ? crc_mul(crc_zeros_op(n_bytes), raw) : raw; }

#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_FEATURE_CRC32))
#if defined(__x86_64__)
#define CRC_TARGET __attribute__((target("sse4.2")))
#define CRC_U64(s, w) ((uint32_t)_mm_crc32_u64((s), (w)))
#define CRC_U8(s, b) _mm_crc32_u8((s), (b))
#else
#define CRC_TARGET
#define CRC_U64(s, w) __crc32cd((s), (w))
#define CRC_U8(s, b) __crc32cb((s), (b))
#endif

static inline uint64_t crc_load64(const unsigned char *p) {
  uint64_t w;
  memcpy(&w, p, sizeof w);
  return w;
}

// Three streams over adjacent lanes while 3 * lane bytes are left; advances *p and *n.
CRC_TARGET static uint32_t crc_lanes(uint32_t state, const unsigned char **p, size_t *n, size_t lane, uint32_t op) {
  const unsigned char *q = *p;
  size_t left = *n;
  for (; left >= 3 * lane; q += 3 * lane, left -= 3 * lane) {
    uint32_t a = state, b = 0, c = 0;
    for (size_t i = 0; i < lane; i += 8) {
      a = CRC_U64(a, crc_load64(q + i));
      b = CRC_U64(b, crc_load64(q + lane + i));
      c = CRC_U64(c, crc_load64(q + 2 * lane + i));
    }
    state = crc_mul(op, crc_mul(op, a) ^ b) ^ c;
  }
  *p = q;
  *n = left;
  return state;
}

CRC_TARGET static uint32_t crc_raw_hw(uint32_t state, const unsigned char *p, size_t n) {
  state = crc_lanes(state, &p, &n, CRC_LANE, CRC_LANE_OP);
  state = crc_lanes(state, &p, &n, CRC_LANE_SMALL, CRC_LANE_SMALL_OP);
  for (; n >= 8; p += 8, n -= 8) state = CRC_U64(state, crc_load64(p));
  for (; n; p++, n--) state = CRC_U8(state, *p);
  return state;
}

static int crc_have_hw(void) {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return 1;
#endif
}
#endif

uint32_t ckpt_crc_raw(uint32_t state, const void *data, size_t n_bytes) {
#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_FEATURE_CRC32))
  if (crc_have_hw()) return crc_raw_hw(state, data, n_bytes);
#endif
  return ckpt_crc_raw_table(state, data, n_bytes);
}

uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t n_bytes) { return ~ckpt_crc_raw(~crc, data, n_bytes); }

uint32_t ckpt_crc_finish(uint32_t xor_of_blocks, uint64_t n_bytes) {
  return ~(ckpt_crc_shift(0xFFFFFFFFu, n_bytes) ^ xor_of_blocks);
}

int ckpt_runs_init(ckpt_runs *b, int ndim, const int64_t *full, const int64_t *start, const int64_t *count) {
  *b = (ckpt_runs){.j = ndim - 1, .n_runs = 1, .n_total = 1, .start = start, .count = count};
  for (int d = ndim - 1; d >= 0; d--) {
    if (count[d] == 0) return 0;
    b->stride[d] = b->n_total;
    b->n_total *= full[d];
  }
  b->run = count[b->j];
  while (b->j > 0 && count[b->j] == full[b->j]) b->run *= count[--b->j];
  for (int d = 0; d < b->j; d++) b->n_runs *= count[d];
  return 1;
}

int64_t ckpt_run_offset(const ckpt_runs *b, int64_t r) {
  int64_t off = b->start[b->j] * b->stride[b->j];
  for (int d = b->j - 1; d >= 0; d--) {
    off += (b->start[d] + r % b->count[d]) * b->stride[d];
    r /= b->count[d];
  }
  return off;
}

// NaNs and infinities among n floats (their exponent bits all set).
static int64_t count_nonfinite(const float *x, int64_t n) {
  const uint32_t *u = (const uint32_t *)(const void *)x;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += (u[i] & 0x7f800000u) == 0x7f800000u;
  return k;
}

// Contribution of runs [r0, r1): walking them in file order, acc = shift(acc, gap) ^ crc(run)
// leaves the XOR of every run's CRC shifted to the last run's end; one more shift carries it to
// the tensor's end. Each run's non-finite values are counted into *nonfinite while it is in cache.
static uint32_t crc_run_range(const ckpt_runs *b, const float *data, int64_t r0, int64_t r1, int64_t *nonfinite) {
  int64_t prev_off = 0, cached_gap = -1;
  uint32_t acc = 0, gap_op = 0;
  for (int64_t r = r0; r < r1; r++) {
    int64_t off = ckpt_run_offset(b, r);
    if (r > r0) {
      int64_t gap = (off - prev_off) * (int64_t)sizeof(float);
      if (gap != cached_gap) gap_op = crc_zeros_op((uint64_t)gap), cached_gap = gap;
      acc = crc_mul(gap_op, acc);
    }
    acc ^= ckpt_crc_raw(0, data + r * b->run, (size_t)b->run * sizeof(float));
    *nonfinite += count_nonfinite(data + r * b->run, b->run);
    prev_off = off;
  }
  return ckpt_crc_shift(acc, (uint64_t)(b->n_total - prev_off - b->run) * sizeof(float));
}

#define CRC_PIECE (1 << 20)  // floats per thread's piece of one long run (4 MiB)

// The OpenMP threads share the work (CRC contributions XOR in any order): one long run is cut
// into pieces, many runs into ranges of runs.
uint32_t ckpt_crc_block(const float *data, int ndim, const int64_t *full, const int64_t *start, const int64_t *count,
                        int64_t *n_nonfinite) {
  ckpt_runs b;
  int64_t nf = 0;
  if (n_nonfinite) *n_nonfinite = 0;
  if (!ckpt_runs_init(&b, ndim, full, start, count)) return 0;
  uint32_t x = 0;
  if (b.n_runs == 1) {
    int64_t off = ckpt_run_offset(&b, 0), n_pieces = (b.run + CRC_PIECE - 1) / CRC_PIECE;
#pragma omp parallel for reduction(^ : x) reduction(+ : nf) schedule(static)
    for (int64_t i = 0; i < n_pieces; i++) {
      int64_t lo = i * CRC_PIECE, n = b.run - lo < CRC_PIECE ? b.run - lo : CRC_PIECE;
      uint32_t raw = ckpt_crc_raw(0, data + lo, (size_t)n * sizeof(float));
      x ^= ckpt_crc_shift(raw, (uint64_t)(b.n_total - off - lo - n) * sizeof(float));
      nf += count_nonfinite(data + lo, n);
    }
  } else {
    int64_t per = 1 + CRC_PIECE / b.run, n_ranges = (b.n_runs + per - 1) / per;
#pragma omp parallel for reduction(^ : x) reduction(+ : nf) schedule(static)
    for (int64_t i = 0; i < n_ranges; i++) {
      int64_t k = 0;
      x ^= crc_run_range(&b, data, i * per, (i + 1) * per < b.n_runs ? (i + 1) * per : b.n_runs, &k);
      nf += k;
    }
  }
  if (n_nonfinite) *n_nonfinite = nf;
  return x;
}
