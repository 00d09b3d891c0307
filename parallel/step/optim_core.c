// The optimizer's core (see optim_core.h): the schedule helpers, the engine's defaults, and this
// rank's state: where each element lives, its AdamW, and its transfers to and from host memory.
#include <string.h>

#include "kernels/base/check.h"
#include "parallel/step/optim_core.h"

void opt_sum_sp_partial(opt_state *o, int i) {
  model *m = o->m;
  model_tensor *t = &m->tensors[i];
  if (m->sp && t->tp_replicated) o->g->tp_c->ops->all_reduce(o->g->tp_c, t->g, t->n_elem, COMM_F32, COMM_SUM);
}

void opt_comm_wait(opt_state *o, comm *c, int gather) {
  if (!o->time_waits || !o->timing) {
    c->ops->wait(c);
    return;
  }
  const double t0 = timing_now(o->m->be);
  c->ops->wait(c);
  const double dt = timing_now(o->m->be) - t0;
  o->timing->dp_comm += dt;
  if (gather) o->timing->dp_gather += dt;
}

static void engine_nothing(opt_state *o) { (void)o; }
static void engine_nothing_b(opt_state *o, int b) { (void)o, (void)b; }
static void engine_nothing_grad(opt_state *o, const float *grad) { (void)o, (void)grad; }
static void engine_nothing_h(opt_state *o, const opt_hparams *h) { (void)o, (void)h; }
static int engine_unchanged(opt_state *o) { (void)o; return 0; }
static int64_t engine_none_pending(const opt_state *o) { return o->m->n_params; }

void opt_engine_fill(opt_engine *e) {
  CHECK(e->update_piece, "update engine %s: no update_piece", e->name ? e->name : "(unnamed)");
  if (!e->grads_final) e->grads_final = engine_nothing;
  if (!e->settle) e->settle = engine_nothing;
  if (!e->wait_bucket) e->wait_bucket = engine_nothing_b;
  if (!e->begin) e->begin = engine_nothing_grad;
  if (!e->end) e->end = engine_nothing_h;
  if (!e->skip) e->skip = engine_unchanged;
  if (!e->flush) e->flush = engine_unchanged;
  if (!e->pending_lo) e->pending_lo = engine_none_pending;
  if (!e->free) e->free = engine_nothing;
}

// The device share of a part of the state (backend memory, indexed from 0) and its host share
// (host memory, indexed from dev_n).
static float *device_share(const opt_state *o, opt_state_part which) {
  float *dev[] = {o->dev_master, o->exp_avg, o->exp_avg_sq};
  return dev[which];
}

static float *host_share(const opt_state *o, opt_state_part which) {
  float *host[] = {o->host_master, o->host_m, o->host_v};
  return host[which];
}

float *opt_state_at(const opt_state *o, opt_state_part which, int64_t shard_off) {
  if (shard_off < o->dev_n) return device_share(o, which) + shard_off;
  return host_share(o, which) + (shard_off - o->dev_n);
}

void opt_state_alloc(opt_state *o) {
  k_backend *be = o->m->be;
  if (o->m->master_in_optimizer) o->dev_master = be->alloc(be, (size_t)(o->dev_n ? o->dev_n : 1) * sizeof(float));
  o->exp_avg = be->alloc(be, (size_t)o->dev_n * sizeof(float));
  o->exp_avg_sq = be->alloc(be, (size_t)o->dev_n * sizeof(float));
}

void opt_state_free(opt_state *o) {
  k_backend *be = o->m->be;
  float *dev[] = {o->dev_master, o->exp_avg, o->exp_avg_sq};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
    if (dev[i]) be->free(be, dev[i]);
  o->dev_master = o->exp_avg = o->exp_avg_sq = NULL;
}

void opt_update_part(opt_state *o, int b, const k_range *r, int n, const float *grad, const opt_hparams *h) {
  k_backend *be = o->m->be;
  const opt_config *hp = &o->cfg;
  const opt_bucket *k = &o->buckets[b];
  be->adamw_ranges(be, opt_state_at(o, OPT_MASTER, k->shard_off), opt_part_pc(o, k), be->act, grad + k->shard_off,
                   opt_state_at(o, OPT_EXP_AVG, k->shard_off), opt_state_at(o, OPT_EXP_AVG_SQ, k->shard_off), r, n,
                   h->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, h->bc1, h->bc2, h->g_scale);
}

void opt_update_bucket(opt_state *o, int b, const float *grad, const opt_hparams *h) {
  opt_update_part(o, b, o->part_ranges + o->part_first[b], o->part_first[b + 1] - o->part_first[b], grad, h);
}

void opt_state_to_host(opt_state *o, opt_state_part which, float *shard_host) {
  k_backend *be = o->m->be;
  be->to_host(be, shard_host, device_share(o, which), (size_t)o->dev_n * sizeof(float));
  be->sync(be);  // the zero-copy engine's kernels have written the host share
  if (o->shard_n > o->dev_n)
    memcpy(shard_host + o->dev_n, host_share(o, which), (size_t)(o->shard_n - o->dev_n) * sizeof(float));
}

void opt_state_from_host(opt_state *o, opt_state_part which, const float *shard_host) {
  k_backend *be = o->m->be;
  be->sync(be);  // no update in flight reads the host share
  be->from_host(be, device_share(o, which), shard_host, (size_t)o->dev_n * sizeof(float));
  if (o->shard_n > o->dev_n)
    memcpy(host_share(o, which), shard_host + o->dev_n, (size_t)(o->shard_n - o->dev_n) * sizeof(float));
}

void opt_master_set(opt_state *o, int64_t shard_off, const float *src_host, int64_t n_elem) {
  k_backend *be = o->m->be;
  float *dst = opt_state_at(o, OPT_MASTER, shard_off);
  if (shard_off < o->dev_n) {
    be->from_host(be, dst, src_host, (size_t)n_elem * sizeof(float));
    return;
  }
  be->sync(be);  // no update in flight reads the host share
  memcpy(dst, src_host, (size_t)n_elem * sizeof(float));
}

void opt_master_cast(opt_state *o) {
  k_backend *be = o->m->be;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    void *pc = opt_part_pc(o, k);  // NULL: each gather casts it (parallel.shard=weights)
    if (pc) be->cast(be, pc, be->act, opt_state_at(o, OPT_MASTER, k->shard_off), K_F32, k->len);
  }
}

void opt_master_norms_out(opt_state *o, float *pack, int64_t lo, int64_t hi) {
  k_backend *be = o->m->be;
  for (int i = 0; i < o->n_master_norms; i++) {
    const k_range *r = &o->master_norms[i];
    if (r->offset >= lo && r->offset < hi)
      be->copy(be, pack + r->p_offset, opt_state_at(o, OPT_MASTER, r->offset), (size_t)r->n_elem * sizeof(float));
  }
}
