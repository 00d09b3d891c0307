// Gradient synchronisation and AdamW (see optim.h).
#include "parallel/optim.h"
#include "kernels/check.h"
#include <math.h>
#include <string.h>

void opt_init(opt_state *o, model *m, const cfg *c) {
  memset(o, 0, sizeof *o);
  o->m = m;
  o->g = m->g;
  o->hp = c->train;
  o->zero = c->parallel.distributed_optimizer && m->g->dp > 1;
  o->bucket_elem = (int64_t)c->parallel.bucket_mb * (1 << 20) / (int64_t)sizeof(float);
  if (o->bucket_elem < 1) o->bucket_elem = 1;
  k_backend *be = m->be;
  o->shard_n = o->zero ? m->n_params / m->g->dp : m->n_params;
  o->shard_lo = o->zero ? o->shard_n * m->g->dp_rank : 0;
  o->exp_avg = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  o->exp_avg_sq = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  if (o->zero) o->grad_shard = be->alloc(be, (size_t)o->shard_n * sizeof(float));
  o->ranges = XCALLOC(m->n_tensors, sizeof(opt_range));
  for (int i = 0; i < m->n_tensors; i++) {
    model_tensor *t = &m->tensors[i];
    opt_range *r = &o->ranges[o->n_ranges++];
    r->offset = t->offset;
    r->n_elem = t->n_elem;
    r->decay = model_specs[t->kind].decay;
    // Each element is counted once over the world: tp-replicated tensors by tp rank 0 only,
    // and without ZeRO (every dp replica holds all gradients) by dp rank 0 only.
    r->in_norm = (!t->tp_replicated || m->g->tp_rank == 0) && (o->zero || m->g->dp_rank == 0);
  }
}

void opt_free(opt_state *o) {
  if (!o->m) return;
  k_backend *be = o->m->be;
  be->free(be, o->exp_avg);
  be->free(be, o->exp_avg_sq);
  if (o->grad_shard) be->free(be, o->grad_shard);
  free(o->ranges);
  o->m = NULL;
}

float opt_lr_at(const cfg_train *hp, int64_t step) {
  if (step < hp->warmup_steps) return hp->lr * (float)(step + 1) / (float)hp->warmup_steps;
  int64_t decay_steps = hp->steps - hp->warmup_steps;
  if (decay_steps <= 0) return hp->lr;
  double progress = (double)(step - hp->warmup_steps) / (double)decay_steps;
  if (progress > 1) progress = 1;
  return (float)(hp->min_lr + 0.5 * (hp->lr - hp->min_lr) * (1 + cos(M_PI * progress)));
}

// Gradients of every tp-replicated tensor (norms) are partial per tp rank under sequence
// parallelism: each rank saw only its sequence shard.
static void reduce_sp_norm_grads(opt_state *o) {
  model *m = o->m;
  if (!m->sp) return;
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].tp_replicated)
      m->g->tp_c->ops->all_reduce(m->g->tp_c, m->tensors[i].g, m->tensors[i].n_elem, COMM_F32, COMM_SUM);
}

// Gradients are already scaled by 1 / (tokens of the global batch), so the DP sum is the mean.
static void reduce_dp_grads(opt_state *o) {
  model *m = o->m;
  comm *dc = m->g->dp_c;
  if (dc->size == 1) return;
  if (o->zero) {
    dc->ops->reduce_scatter(dc, m->grads, o->grad_shard, o->shard_n, COMM_F32, COMM_SUM);
    return;
  }
  // Last bucket first: backward fills the flat buffer from its end.
  for (int64_t end = m->n_params; end > 0; end -= o->bucket_elem) {
    int64_t lo = end - o->bucket_elem < 0 ? 0 : end - o->bucket_elem;
    dc->ops->all_reduce(dc, m->grads + lo, end - lo, COMM_F32, COMM_SUM);
  }
}

// Calls fn on every part of a range that lies inside this rank's shard.
#define FOR_SHARD_PARTS(o, r, lo, n)                                                          \
  int64_t lo = (r)->offset > (o)->shard_lo ? (r)->offset : (o)->shard_lo;                     \
  int64_t hi_ = (r)->offset + (r)->n_elem < (o)->shard_lo + (o)->shard_n                      \
                    ? (r)->offset + (r)->n_elem                                               \
                    : (o)->shard_lo + (o)->shard_n;                                           \
  int64_t n = hi_ - lo;                                                                       \
  if (n > 0)

double opt_step(opt_state *o, float lr, int64_t t) {
  model *m = o->m;
  k_backend *be = m->be;
  double t0 = o->timing ? timing_now(be) : 0;
  reduce_sp_norm_grads(o);
  reduce_dp_grads(o);
  double t1 = o->timing ? timing_now(be) : 0;
  float *grad = o->zero ? o->grad_shard : m->grads;  // indexed by flat offset - shard_lo
  double sumsq = 0;
  for (int i = 0; i < o->n_ranges; i++) {
    opt_range *r = &o->ranges[i];
    if (!r->in_norm) continue;
    FOR_SHARD_PARTS(o, r, lo, n) sumsq += be->sumsq(grad + (lo - o->shard_lo), n);
  }
  comm *w = m->g->world;
  w->ops->all_reduce(w, &sumsq, 1, COMM_F64, COMM_SUM);
  double norm = sqrt(sumsq);
  const cfg_train *hp = &o->hp;
  if (hp->grad_clip > 0 && norm > hp->grad_clip) be->scale(grad, o->shard_n, (float)(hp->grad_clip / (norm + 1e-6)));
  float bc1 = 1.0f - powf(hp->beta1, (float)t), bc2 = 1.0f - powf(hp->beta2, (float)t);
  for (int i = 0; i < o->n_ranges; i++) {
    opt_range *r = &o->ranges[i];
    FOR_SHARD_PARTS(o, r, lo, n) {
      int64_t s = lo - o->shard_lo;
      be->adamw(m->params + lo, grad + s, o->exp_avg + s, o->exp_avg_sq + s, n, lr, hp->beta1, hp->beta2, hp->eps,
                r->decay ? hp->weight_decay : 0.0f, bc1, bc2);
    }
  }
  if (o->zero) {
    comm *dc = m->g->dp_c;
    be->copy(be, o->grad_shard, m->params + o->shard_lo, (size_t)o->shard_n * sizeof(float));
    dc->ops->all_gather(dc, o->grad_shard, m->params, o->shard_n, COMM_F32);
    be->zero(be, o->grad_shard, (size_t)o->shard_n * sizeof(float));
  }
  be->zero(be, m->grads, (size_t)m->n_params * sizeof(float));
  model_sync_compute_weights(m);
  if (o->timing) {
    o->timing->dp_comm += t1 - t0;
    o->timing->optimizer += timing_now(be) - t1;
  }
  return norm;
}

static void gather_or_copy_moment(opt_state *o, const float *shard, float *host) {
  model *m = o->m;
  k_backend *be = m->be;
  size_t n_bytes = (size_t)m->n_params * sizeof(float);
  if (!o->zero) {
    be->to_host(be, host, shard, n_bytes);
    return;
  }
  float *full = be->alloc(be, n_bytes);
  m->g->dp_c->ops->all_gather(m->g->dp_c, shard, full, o->shard_n, COMM_F32);
  be->to_host(be, host, full, n_bytes);
  be->free(be, full);
}

void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host) {
  gather_or_copy_moment(o, o->exp_avg, exp_avg_host);
  gather_or_copy_moment(o, o->exp_avg_sq, exp_avg_sq_host);
}

void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host) {
  k_backend *be = o->m->be;
  size_t n_bytes = (size_t)o->shard_n * sizeof(float);
  be->from_host(be, o->exp_avg, exp_avg_host + o->shard_lo, n_bytes);
  be->from_host(be, o->exp_avg_sq, exp_avg_sq_host + o->shard_lo, n_bytes);
}
