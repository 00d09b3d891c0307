// Compressed DP gradient reduction (see grad_compress.h): the buckets as spans of
// parallel/comm/compress.c, their buffers, and error feedback's residual.
#include "parallel/step/grad_compress.h"

#include "kernels/base/check.h"

grad_compress *grad_compress_init(const opt_state *o) {
  k_backend *be = o->m->be;
  const int dp = o->g->dp;
  const comm_compress_mode mode = o->cfg.grad_compress;
  grad_compress *gc = XCALLOC(1, sizeof *gc);
  gc->spans = XCALLOC(o->n_buckets + 1, sizeof *gc->spans);
  if (o->cfg.grad_error_feedback) gc->residual = be->alloc(be, (size_t)o->m->n_params * sizeof(float));
  if (mode == COMM_COMPRESS_FP16) {
    gc->amax = be->alloc(be, (size_t)(o->n_buckets + 1) * sizeof(float));
    gc->n_underflow = be->alloc(be, sizeof(int64_t));
  }
  // Every span's send then receive buffer, 256-byte aligned, in one allocation.
  int64_t total = 0, *at = XCALLOC(2 * (o->n_buckets + 1), sizeof(int64_t));
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    comm_compress_span *s = &gc->spans[b];
    s->mode = mode;
    s->n = k->hi - k->lo;
    s->scatter = o->zero;
    s->chunk = o->zero ? k->len : (s->n + dp - 1) / dp;
    s->amax = gc->amax ? gc->amax + b : NULL;
    s->n_underflow = gc->n_underflow;
    for (int r = 0; r < 2; r++) {
      at[2 * b + r] = total;
      total += (comm_compress_bytes(mode, s->n, s->chunk, dp, s->scatter, r) + 255) / 256 * 256;
    }
  }
  gc->wire = be->alloc(be, (size_t)(total ? total : 1));
  for (int b = 0; b < o->n_buckets; b++) {
    gc->spans[b].send = gc->wire + at[2 * b];
    gc->spans[b].recv = gc->wire + at[2 * b + 1];
  }
  free(at);
  return gc;
}

void grad_compress_free(grad_compress **gcp, k_backend *be) {
  grad_compress *gc = *gcp;
  if (!gc) return;
  void *dev[] = {gc->wire, gc->amax, gc->n_underflow, gc->residual};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
    if (dev[i]) be->free(be, dev[i]);
  free(gc->spans);
  free(gc);
  *gcp = NULL;
}

void grad_compress_start(opt_state *o, comm *dc, int b) {
  const int64_t lo = o->buckets[b].lo;
  float *res = o->gc->residual ? o->gc->residual + lo : NULL;
  comm_compress_start(o->m->be, dc, &o->gc->spans[b], o->m->grads + lo, res);
}

void grad_compress_finish(opt_state *o) {
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    float *out = o->zero ? o->grad_shard + k->shard_off : o->m->grads + k->lo;
    comm_compress_finish(o->m->be, grid_shard_comm(o->g), &o->gc->spans[b], out);
  }
}

int64_t grad_compress_underflow(const opt_state *o) {
  int64_t n = 0;
  if (o->gc && o->gc->n_underflow) o->m->be->to_host(o->m->be, &n, o->gc->n_underflow, sizeof n);
  return n;
}
