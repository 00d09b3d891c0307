// Tensor/sequence-parallel collectives in two halves (see tp.h).
#include "parallel/comm/tp.h"

#include "kernels/base/check.h"

// Timed from the compute queued before the finish being done (a sync) to the collective's end,
// so the figure is its exposed part; tp 1 adds no syncs.
static double start(const tp_region *r) { return r->timing && r->c->size > 1 ? timing_now(r->be) : 0; }
static void stop(const tp_region *r, double t0) {
  if (r->timing && r->c->size > 1) r->timing->tp_comm += timing_now(r->be) - t0;
}

static int gathers(const tp_region *r) { return r->sp && r->c->size > 1; }

int64_t tp_own_row(const tp_region *r) { return gathers(r) ? r->c->rank * r->rows_s : 0; }

// The compute queued next waits for the collectives started, timed.
static void timed_wait(const tp_region *r) {
  double t0 = start(r);
  r->c->ops->wait(r->c);
  stop(r, t0);
}

// parallel.tp_overlap=none: the compute queued next waits for the collective just started.
static void serial_wait(const tp_region *r) {
  if (r->serial) timed_wait(r);
}

static comm_dtype comm_type_of(k_dtype t) { return t == K_BF16 ? COMM_BF16 : COMM_F32; }

void tp_gather_start(const tp_region *r, void *x, int d, k_dtype t) {
  if (!gathers(r)) return;
  const int64_t at = 0, n = r->rows_s * d;
  r->c->ops->all_gather_regions_start(r->c, x, &at, &n, 1, comm_type_of(t));
  serial_wait(r);
}

void tp_gather_finish(const tp_region *r) {
  if (gathers(r)) timed_wait(r);
}

void tp_gather_wait_from(const tp_region *r, int from) {
  if (!gathers(r)) return;
  if (!r->c->ops->wait_from) {  // every row at the first
    if (from == comm_ring_from(r->c, 1)) timed_wait(r);
    return;
  }
  double t0 = start(r);
  r->c->ops->wait_from(r->c, from);
  if (from == comm_ring_from(r->c, r->c->size - 1)) r->c->ops->wait(r->c);  // the last: the gather complete
  stop(r, t0);
}

void tp_reduce_start(const tp_region *r, float *y, float *y_s, int d) {
  if (r->c->size == 1) return;
  if (r->sp)
    r->c->ops->reduce_scatter_start(r->c, y, y_s, r->rows_s * d, COMM_F32, COMM_SUM);
  else
    r->c->ops->all_reduce_start(r->c, y, r->rows * d, COMM_F32, COMM_SUM);
  serial_wait(r);
}

void tp_reduce_finish(const tp_region *r, float *y, float *y_s, int d) {
  double t0 = start(r);
  if (r->c->size > 1) r->c->ops->wait(r->c);
  if (!gathers(r) && y_s != y) r->be->copy(r->be, y_s, y, (size_t)(r->rows_s * d) * sizeof(float));
  stop(r, t0);
}

void tp_reduce_add_block(const tp_region *r, void *y, k_dtype t, float *y_s, float *scratch, int d, int to) {
  CHECK(gathers(r), "tp_reduce_add_block: only with sequence parallelism over more than one tp rank");
  const int64_t n = r->rows_s * d;
  const int last = to == comm_ring_to(r->c, r->c->size - 1);
  if (r->c->ops->reduce_scatter_add_block) {
    r->c->ops->reduce_scatter_add_block(r->c, y, y_s, n, comm_type_of(t), to);
  } else if (last) {
    r->be->zero(r->be, (char *)y + tp_own_row(r) * d * k_dtype_bytes(t), (size_t)n * k_dtype_bytes(t));
    r->c->ops->reduce_scatter_start(r->c, y, scratch, n, comm_type_of(t), COMM_SUM);
  }
  if (last) serial_wait(r);
}

void tp_reduce_add_finish(const tp_region *r, void *y, k_dtype t, float *y_s, float *scratch, int d) {
  (void)y;
  timed_wait(r);
  if (!r->c->ops->reduce_scatter_add_block) r->be->add(r->be, y_s, scratch, t, r->rows_s * d);
}

// A blocking all-reduce over the group, timed like the collectives above.
void tp_all_reduce(const tp_region *r, float *x, int64_t n, comm_redop op) {
  if (r->c->size == 1) return;
  double t0 = start(r);
  r->c->ops->all_reduce(r->c, x, n, COMM_F32, op);
  stop(r, t0);
}


static comm_redop redop_of(model_reduce_op op) { return op == MODEL_REDUCE_MAX ? COMM_MAX : COMM_SUM; }

static void bound_gather_start(void *ctx, void *x, int d, k_dtype t) {
  tp_gather_start(&((tp_model_comm *)ctx)->region, x, d, t);
}
static void bound_gather_finish(void *ctx) { tp_gather_finish(&((tp_model_comm *)ctx)->region); }
static void bound_gather_wait_from(void *ctx, int from) { tp_gather_wait_from(&((tp_model_comm *)ctx)->region, from); }
static void bound_reduce_start(void *ctx, float *y, float *y_s, int d) {
  tp_reduce_start(&((tp_model_comm *)ctx)->region, y, y_s, d);
}
static void bound_reduce_finish(void *ctx, float *y, float *y_s, int d) {
  tp_reduce_finish(&((tp_model_comm *)ctx)->region, y, y_s, d);
}
static void bound_reduce_add_block(void *ctx, void *y, k_dtype t, float *y_s, float *scratch, int d, int to) {
  tp_reduce_add_block(&((tp_model_comm *)ctx)->region, y, t, y_s, scratch, d, to);
}
static void bound_reduce_add_finish(void *ctx, void *y, k_dtype t, float *y_s, float *scratch, int d) {
  tp_reduce_add_finish(&((tp_model_comm *)ctx)->region, y, t, y_s, scratch, d);
}
static void bound_tp_all_reduce(void *ctx, float *x, int64_t n, model_reduce_op op) {
  tp_all_reduce(&((tp_model_comm *)ctx)->region, x, n, redop_of(op));
}
static void bound_dp_all_reduce(void *ctx, float *x, int64_t n, model_reduce_op op) {
  comm *dc = ((tp_model_comm *)ctx)->dp;
  if (dc->size > 1) dc->ops->all_reduce(dc, x, n, COMM_F32, redop_of(op));
}
static void bound_world_all_reduce(void *ctx, double *x, int n, model_reduce_op op) {
  comm *w = ((tp_model_comm *)ctx)->world;
  w->ops->all_reduce(w, x, n, COMM_F64, redop_of(op));
}

static const model_comm_ops tp_model_ops = {
    .gather_start = bound_gather_start,
    .gather_finish = bound_gather_finish,
    .gather_wait_from = bound_gather_wait_from,
    .reduce_start = bound_reduce_start,
    .reduce_finish = bound_reduce_finish,
    .reduce_add_block = bound_reduce_add_block,
    .reduce_add_finish = bound_reduce_add_finish,
    .tp_all_reduce = bound_tp_all_reduce,
    .dp_all_reduce = bound_dp_all_reduce,
    .world_all_reduce = bound_world_all_reduce,
};

model_place tp_model_place(const grid *g) {
  return (model_place){.tp = g->tp, .tp_rank = g->tp_rank, .dp = g->dp, .dp_rank = g->dp_rank, .pp = g->pp,
                       .pp_rank = g->pp_rank};
}

void tp_bind_model(tp_model_comm *t, model *m, const grid *g) {
  *t = (tp_model_comm){.region = {g->tp_c, m->be, m->sp, m->dims.rows, m->dims.rows_s, NULL, 0}, .dp = g->dp_c,
                       .world = g->world};
  m->comm = (model_comm){&tp_model_ops, t};
}

void tp_set_timing(tp_model_comm *t, step_timing *timing) { t->region.timing = timing; }
void tp_set_serial(tp_model_comm *t, int serial) { t->region.serial = serial; }
