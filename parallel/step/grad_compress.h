// Compressed DP gradient reduction (parallel.grad_compress; docs/compression.md): each bucket is
// one span of parallel/comm/compress.h, quantised when the bucket starts (on the compute stream,
// during backward) and exchanged in its wire format; after opt_step's wait,
// grad_compress_finish leaves fp32 gradients where the uncompressed reduction would (m->grads,
// or with ZeRO the rank's part of each bucket in grad_shard). Without ZeRO a bucket's chunks
// are ceil(n / dp) elements; with ZeRO they are the bucket's parts.
// Error feedback (parallel.grad_error_feedback) keeps, per rank, what the first quantisation of
// each gradient element dropped (a (n_params) fp32 residual, checkpointed) and adds it to the
// next step's gradient before quantising. The re-quantisation of plain int8 is not fed back: its
// error is the same on every rank.
#ifndef TRAINER_GRAD_COMPRESS_H
#define TRAINER_GRAD_COMPRESS_H

#include <stdint.h>
#include "parallel/comm/compress.h"
#include "parallel/step/optim_core.h"

typedef struct grad_compress {
  comm_compress_span *spans;  // (n_buckets) one per bucket, its wire buffers carved from wire
  char *wire;                 // backend memory: every span's send and receive buffers
  float *amax;                // (n_buckets) fp16: each bucket's amax, agreed over dp
  int64_t *n_underflow;       // (1) fp16: this rank's values rounded to zero, over the run
  float *residual;            // (n_params) error feedback; NULL = off
} grad_compress;

// Whether oc compresses a reduction over dp ranks.
static inline int grad_compress_on(const opt_config *oc, int dp) {
  return dp > 1 && oc->grad_compress != COMM_COMPRESS_NONE;
}
// After opt_layout_build (it needs the buckets). The residual starts at zero.
grad_compress *grad_compress_init(const opt_state *o);
void grad_compress_free(grad_compress **gc, k_backend *be);  // safe twice
// Quantises bucket b (an index into o->buckets) and starts its exchange on dc.
void grad_compress_start(opt_state *o, comm *dc, int b);
// After every started exchange was waited for: each bucket's fp32 sums into place (plain int8
// all-gathers over the dp communicator).
void grad_compress_finish(opt_state *o);
// This rank's fp16 values rounded to zero so far (a host read; 0 for the other formats).
int64_t grad_compress_underflow(const opt_state *o);

#endif
