// Compressed reductions (see compress.h; element arithmetic in kernels/cpu/quant_cpu.h).
#include "parallel/comm/compress.h"

#include "kernels/base/check.h"
#include "kernels/cpu/quant_cpu.h"

// int8 slot of a chunk: its codes padded to whole blocks, then one scale per block.
static int64_t slot_codes(int64_t chunk) { return k_qblocks(chunk) * K_QBLOCK; }
static int64_t slot_bytes(int64_t chunk) { return slot_codes(chunk) + k_qblocks(chunk) * (int64_t)sizeof(float); }

// Elements of chunk r of a span.
static int64_t chunk_n(const comm_compress_span *s, int r) {
  const int64_t left = s->n - r * s->chunk;
  return left <= 0 ? 0 : left < s->chunk ? left : s->chunk;
}

int64_t comm_compress_bytes(comm_compress_mode mode, int64_t n, int64_t chunk, int size, int scatter, int is_recv) {
  if (mode == COMM_COMPRESS_INT8) return size * slot_bytes(chunk);
  if (mode == COMM_COMPRESS_NONE) return 0;
  return (is_recv ? (scatter ? chunk : 0) : n) * (int64_t)sizeof(uint16_t);
}

// Ring all-reduce sends 2 (size-1)/size of the data, reduce-scatter and all-gather (size-1)/size
// each, all-to-all (size-1) of size slots.
int64_t comm_compress_wire_bytes(comm_compress_mode mode, int64_t n, int64_t chunk, int size, int scatter) {
  const double f = (double)(size - 1) / size;
  if (mode == COMM_COMPRESS_INT8) return (int64_t)((size - 1) * slot_bytes(chunk) * (scatter ? 1 : 2));
  const int64_t esz = mode == COMM_COMPRESS_NONE ? 4 : 2;
  return (int64_t)((scatter ? 1 : 2) * f * (double)(n * esz));
}

static k_dtype half_of(comm_compress_mode m) { return m == COMM_COMPRESS_FP16 ? K_F16 : K_BF16; }
static comm_dtype wire16_of(comm_compress_mode m) { return m == COMM_COMPRESS_FP16 ? COMM_F16 : COMM_BF16; }

static void start16(k_backend *be, comm *c, const comm_compress_span *s, const float *x, float *res) {
  const float *amax = NULL;
  if (s->mode == COMM_COMPRESS_FP16) {  // the blocking max is ordered before the start on c
    be->zero(be, s->amax, sizeof(float));
    be->grad_amax(be, s->amax, x, res, s->n);
    c->ops->all_reduce(c, s->amax, 1, COMM_F32, COMM_MAX);
    amax = s->amax;
  }
  be->quant16(be, s->send, half_of(s->mode), x, res, s->n, amax, c->size, s->n_underflow);
  if (s->scatter) c->ops->reduce_scatter_start(c, s->send, s->recv, s->chunk, wire16_of(s->mode), COMM_SUM);
  else c->ops->all_reduce_start(c, s->send, s->n, wire16_of(s->mode), COMM_SUM);
}

static void start8(k_backend *be, comm *c, const comm_compress_span *s, const float *x, float *res) {
  const int64_t slot = slot_bytes(s->chunk);
  for (int r = 0; r < c->size; r++) {
    int8_t *q = (int8_t *)s->send + r * slot;
    const int64_t lo = r * s->chunk;
    be->quant_i8(be, q, (float *)(q + slot_codes(s->chunk)), x + lo, res ? res + lo : NULL, chunk_n(s, r));
  }
  c->ops->all_to_all_start(c, s->send, s->recv, slot, COMM_I8);
}

void comm_compress_start(k_backend *be, comm *c, const comm_compress_span *s, const float *x, float *res) {
  CHECK(s->mode != COMM_COMPRESS_NONE, "comm %s: compressed reduction without a format", c->name);
  CHECK(!s->scatter || s->n == c->size * s->chunk, "comm %s: scattered compressed reduction of %lld elements in %d "
        "chunks of %lld", c->name, (long long)s->n, c->size, (long long)s->chunk);
  if (s->mode == COMM_COMPRESS_INT8) start8(be, c, s, x, res);
  else start16(be, c, s, x, res);
}

// int8: this rank's chunk summed from every rank's slot; plain: re-quantised (without feedback:
// its error is the same on every rank), all-gathered and dequantised by every rank alike.
static void finish8(k_backend *be, comm *gather, const comm_compress_span *s, float *out) {
  const int64_t slot = slot_bytes(s->chunk), codes = slot_codes(s->chunk);
  int8_t *send = s->send, *recv = s->recv;
  const int me = gather->rank;
  float *sum = s->scatter ? out : out + me * s->chunk;
  be->dequant_i8(be, sum, recv, (const float *)(recv + codes), chunk_n(s, me), gather->size, slot);
  if (s->scatter) return;
  be->quant_i8(be, recv, (float *)(recv + codes), sum, NULL, chunk_n(s, me));
  gather->ops->all_gather(gather, recv, send, slot, COMM_I8);
  for (int r = 0; r < gather->size; r++) {
    const int8_t *q = send + r * slot;
    be->dequant_i8(be, out + r * s->chunk, q, (const float *)(q + codes), chunk_n(s, r), 1, 0);
  }
}

void comm_compress_finish(k_backend *be, comm *gather, const comm_compress_span *s, float *out) {
  if (s->mode == COMM_COMPRESS_INT8) {
    finish8(be, gather, s, out);
    return;
  }
  const float *amax = s->mode == COMM_COMPRESS_FP16 ? s->amax : NULL;
  if (s->scatter) be->dequant16(be, out, s->recv, half_of(s->mode), s->chunk, amax, gather->size);
  else be->dequant16(be, out, s->send, half_of(s->mode), s->n, amax, gather->size);
}
