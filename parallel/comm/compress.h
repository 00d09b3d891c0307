// Compressed reductions of fp32 data over a communicator: the gradient compression of the DP
// reduction (parallel/step/grad_compress.c) and commbench's compressed rows run this one code.
// A span of n fp32 elements is cut into c->size chunks of `chunk` elements (the last ones shorter
// or empty when n < size * chunk); the reduction is either plain (every rank gets the sum of all
// n) or scattered (rank r gets the sum of chunk r, as reduce_scatter: then n = size * chunk).
// Formats (arithmetic: kernels/cpu/quant_cpu.h):
//   bf16   each element rounded to bf16, summed by the communicator (all_reduce / reduce_scatter).
//   fp16   a power-of-two scale from the span's amax, agreed by a max all-reduce of one float, so
//          that no element and no partial sum over the ranks overflows; summed in fp16.
//   int8   each chunk in blocks of K_QBLOCK with an fp32 scale each, in a slot (codes, then scales);
//          one all_to_all of the slots; each rank dequantises its chunk from every rank's slot and
//          sums in fp32 in rank order; plain: re-quantised, its slot all-gathered, every chunk
//          dequantised by every rank (so all hold the same bits).
// Two calls: start quantises (on the backend's stream) and starts the exchange (a *_start
// collective on c); after c's wait, finish leaves fp32 sums in out. Error feedback: res (NULL:
// none) is added to x before quantising and keeps what the quantisation dropped.
#ifndef TRAINER_COMPRESS_H
#define TRAINER_COMPRESS_H

#include <stdint.h>
#include "kernels/backend.h"
#include "parallel/comm/comm.h"

typedef enum comm_compress_mode {
  COMM_COMPRESS_NONE,
  COMM_COMPRESS_BF16,
  COMM_COMPRESS_FP16,
  COMM_COMPRESS_INT8
} comm_compress_mode;

// Bytes each of the two wire buffers (send, recv) needs for a span: 16-bit: n codes (send) and
// chunk codes (recv, scattered only; else 0); int8: size slots of chunk codes and their scales.
int64_t comm_compress_bytes(comm_compress_mode mode, int64_t n, int64_t chunk, int size, int scatter, int is_recv);
// Bytes sent by this rank for one span (its share of the traffic: what a link carries).
int64_t comm_compress_wire_bytes(comm_compress_mode mode, int64_t n, int64_t chunk, int size, int scatter);

// What one span needs; the buffers are backend memory of comm_compress_bytes. amax (fp16: 1 float)
// and n_underflow (fp16: 1 int64 that counts values rounded to zero; NULL: not counted) too.
typedef struct comm_compress_span {
  comm_compress_mode mode;
  int64_t n, chunk;
  int scatter;
  void *send, *recv;
  float *amax;
  int64_t *n_underflow;
} comm_compress_span;

// Quantises x (+ res) and starts the exchange on c (every rank in the same order).
void comm_compress_start(k_backend *be, comm *c, const comm_compress_span *s, const float *x, float *res);
// After c's wait: out gets the fp32 sum, n elements (plain) or this rank's chunk (scattered).
// Plain int8 all-gathers over gather (a blocking collective; the span's ranks, e.g. c itself).
void comm_compress_finish(k_backend *be, comm *gather, const comm_compress_span *s, float *out);

#endif
