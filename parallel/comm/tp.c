// Tensor/sequence-parallel collectives in two halves (see tp.h).
#include "parallel/comm/tp.h"

// Timed from the compute queued before the finish being done (a sync) to the collective's end,
// so the figure is its exposed part; tp 1 adds no syncs.
static double start(const tp_region *r) { return r->timing && r->c->size > 1 ? timing_now(r->be) : 0; }
static void stop(const tp_region *r, double t0) {
  if (r->timing && r->c->size > 1) r->timing->tp_comm += timing_now(r->be) - t0;
}

static int gathers(const tp_region *r) { return r->sp && r->c->size > 1; }

int64_t tp_own_row(const tp_region *r) { return gathers(r) ? r->c->rank * r->rows_s : 0; }

void tp_gather_start(const tp_region *r, void *x, int d, k_dtype t) {
  if (!gathers(r)) return;
  const int64_t at = 0, n = r->rows_s * d;
  r->c->ops->all_gather_regions_start(r->c, x, &at, &n, 1, t == K_BF16 ? COMM_BF16 : COMM_F32);
}

void tp_gather_finish(const tp_region *r) {
  if (!gathers(r)) return;
  double t0 = start(r);
  r->c->ops->wait(r->c);
  stop(r, t0);
}

void tp_reduce_start(const tp_region *r, float *y, float *y_s, int d) {
  if (r->c->size == 1) return;
  if (r->sp)
    r->c->ops->reduce_scatter_start(r->c, y, y_s, r->rows_s * d, COMM_F32, COMM_SUM);
  else
    r->c->ops->all_reduce_start(r->c, y, r->rows * d, COMM_F32, COMM_SUM);
}

void tp_reduce_finish(const tp_region *r, float *y, float *y_s, int d) {
  double t0 = start(r);
  if (r->c->size > 1) r->c->ops->wait(r->c);
  if (!gathers(r)) r->be->copy(r->be, y_s, y, (size_t)(r->rows_s * d) * sizeof(float));
  stop(r, t0);
}

// A blocking all-reduce over the group, timed like the collectives above.
static void tp_all_reduce(const tp_region *r, float *x, int64_t n, comm_redop op) {
  if (r->c->size == 1) return;
  double t0 = start(r);
  r->c->ops->all_reduce(r->c, x, n, COMM_F32, op);
  stop(r, t0);
}

void tp_vocab_reduce(const tp_region *r, float *x, int64_t n, comm_redop op) { tp_all_reduce(r, x, n, op); }

void tp_amax_reduce(const tp_region *r, float *amax, int64_t n) { tp_all_reduce(r, amax, n, COMM_MAX); }
