// Tensor/sequence-parallel region pairs (see tp.h). With one tp rank every call is a copy.
#include "parallel/tp.h"

// Collective time is measured only when there is a collective, so tp 1 adds no syncs.
static double start(const tp_region *r) { return r->timing && r->c->size > 1 ? timing_now(r->be) : 0; }
static void stop(const tp_region *r, double t0) {
  if (r->timing && r->c->size > 1) r->timing->tp_comm += timing_now(r->be) - t0;
}

static void gather_or_copy(const tp_region *r, const void *src_s, void *dst, int d, k_dtype t) {
  double t0 = start(r);
  if (r->sp && r->c->size > 1)
    r->c->ops->all_gather(r->c, src_s, dst, r->rows_s * d, t == K_BF16 ? COMM_BF16 : COMM_F32);
  else
    r->be->copy(r->be, dst, src_s, (size_t)(r->rows * d) * k_dtype_bytes(t));
  stop(r, t0);
}

static void reduce_to_shard(const tp_region *r, float *src, float *dst_s, int d) {
  double t0 = start(r);
  if (r->c->size == 1) {
    r->be->copy(r->be, dst_s, src, (size_t)(r->rows_s * d) * sizeof(float));
  } else if (r->sp) {
    r->c->ops->reduce_scatter(r->c, src, dst_s, r->rows_s * d, COMM_F32, COMM_SUM);
  } else {
    r->c->ops->all_reduce(r->c, src, r->rows * d, COMM_F32, COMM_SUM);
    r->be->copy(r->be, dst_s, src, (size_t)(r->rows * d) * sizeof(float));
  }
  stop(r, t0);
}

void tp_enter_bwd_start(const tp_region *r, float *dx, float *dx_s, int d) {
  if (r->c->size == 1) return;
  if (r->sp)
    r->c->ops->reduce_scatter_start(r->c, dx, dx_s, r->rows_s * d, COMM_F32, COMM_SUM);
  else
    r->c->ops->all_reduce_start(r->c, dx, r->rows * d, COMM_F32, COMM_SUM);
}

// Timed from the compute before it being done, so the figure is the collective's exposed part.
void tp_enter_bwd_finish(const tp_region *r, float *dx, float *dx_s, int d) {
  double t0 = start(r);
  if (r->c->size > 1) r->c->ops->wait(r->c);
  if (!r->sp || r->c->size == 1) r->be->copy(r->be, dx_s, dx, (size_t)(r->rows_s * d) * sizeof(float));
  stop(r, t0);
}

void tp_enter_fwd(const tp_region *r, const void *x_s, void *x, int d, k_dtype t) { gather_or_copy(r, x_s, x, d, t); }
void tp_exit_fwd(const tp_region *r, float *y, float *y_s, int d) { reduce_to_shard(r, y, y_s, d); }
void tp_exit_bwd(const tp_region *r, const void *dy_s, void *dy, int d, k_dtype t) { gather_or_copy(r, dy_s, dy, d, t); }
