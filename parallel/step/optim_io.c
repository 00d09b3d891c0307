// The optimizer's state in and out (see optim.h): the master weights and moments gathered whole
// into host memory for a checkpoint, and weights and moments put back into this rank's shard.
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "parallel/step/optim.h"

// Every dp rank's shard (host memory, shard order) into the whole flat array on every rank.
// Through host memory and MPI, so a checkpoint needs no device memory beyond training's.
static void gather_host(opt_state *o, const float *mine, float *host) {
  float *tmp = XMALLOC((size_t)o->m->n_params * sizeof(float));
  comm *hc = comm_mpi_create(grid_shard_comm(o->g)->mpi, "shard-host", &o->g->opts);
  hc->ops->all_gather(hc, mine, tmp, o->shard_n, COMM_F32);
  comm_free(&hc);
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    for (int r = 0; r < o->parts; r++)
      memcpy(host + k->lo + r * k->len, tmp + r * o->shard_n + k->shard_off, (size_t)k->len * sizeof(float));
  }
  free(tmp);
}

// This rank's shard of a moment, whole into host memory in flat order.
static void gather_moment(opt_state *o, opt_state_part which, float *host) {
  if (!o->zero) {
    opt_state_to_host(o, which, host);  // the shard is the flat buffer
    return;
  }
  float *mine = XMALLOC((size_t)o->shard_n * sizeof(float));
  opt_state_to_host(o, which, mine);
  gather_host(o, mine, host);
  free(mine);
}

void opt_get_params(opt_state *o, float *params_host) {
  o->engine.settle(o);  // an update beside the forward, or left to it, is part of the state
  model *m = o->m;
  k_backend *be = m->be;
  if (!o->zero && !m->master_in_optimizer) {
    be->to_host(be, params_host, m->params, (size_t)m->n_params * sizeof(float));
    return;
  }
  // This rank's part of every bucket; without ZeRO that is the whole flat buffer.
  float *mine = o->zero ? XMALLOC((size_t)o->shard_n * sizeof(float)) : params_host;
  if (m->master_in_optimizer) opt_state_to_host(o, OPT_MASTER, mine);
  for (int b = 0; !m->master_in_optimizer && b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    be->to_host(be, mine + k->shard_off, m->params + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  if (!o->zero) return;
  gather_host(o, mine, params_host);
  free(mine);
}

void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host) {
  o->engine.settle(o);
  gather_moment(o, OPT_EXP_AVG, exp_avg_host);
  gather_moment(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
}

// This rank's shard of a whole flat host array of a moment, into the optimizer's state.
static void scatter_moment(opt_state *o, opt_state_part which, const float *host) {
  if (!o->zero) {
    opt_state_from_host(o, which, host);
    return;
  }
  float *tmp = XMALLOC((size_t)o->shard_n * sizeof(float));
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    memcpy(tmp + k->shard_off, host + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  opt_state_from_host(o, which, tmp);
  free(tmp);
}

void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host) {
  o->engine.settle(o);
  scatter_moment(o, OPT_EXP_AVG, exp_avg_host);
  scatter_moment(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
}

void opt_set_tensor(opt_state *o, int i, const float *block) {
  o->engine.settle(o);
  model *m = o->m;
  const model_tensor *t = &m->tensors[i];
  if (!m->master_in_optimizer) {
    m->be->from_host(m->be, m->params + t->offset, block, (size_t)t->n_elem * sizeof(float));
    return;
  }
  // The tensor's pieces in this rank's parts (the update ranges: each lies in one tensor).
  for (int k = 0; k < o->n_upd_ranges; k++) {
    const k_range *r = &o->upd_ranges[k];
    if (r->p_offset >= t->offset && r->p_offset < t->offset + t->n_elem)
      opt_master_set(o, r->offset, block + (r->p_offset - t->offset), r->n_elem);
  }
}

void opt_set_params(opt_state *o, const float *params_host) {
  for (int i = 0; i < o->m->n_tensors; i++) opt_set_tensor(o, i, params_host + o->m->tensors[i].offset);
  opt_weights_set(o);
}

void opt_init_weights(opt_state *o, uint64_t seed) {
  model *m = o->m;
  for (int i = 0; i < m->n_tensors; i++) {
    float *block = XMALLOC((size_t)m->tensors[i].n_elem * sizeof(float));
    model_init_tensor(m, i, seed, block);
    opt_set_tensor(o, i, block);
    free(block);
  }
  opt_weights_set(o);
}

int opt_sharded(const opt_state *o) { return o->zero; }
int64_t opt_shard_elems(const opt_state *o) { return o->shard_n; }
int opt_shard_writes(const opt_state *o) { return !o->replica || o->replica->rank == 0; }

const k_range *opt_shard_ranges(const opt_state *o, int *n) {
  *n = o->n_upd_ranges;
  return o->upd_ranges;
}

void opt_get_shard(opt_state *o, float *params_host, float *exp_avg_host, float *exp_avg_sq_host) {
  CHECK(o->zero, "opt_get_shard: the optimizer is not sharded over dp");
  o->engine.settle(o);
  opt_state_to_host(o, OPT_MASTER, params_host);
  opt_state_to_host(o, OPT_EXP_AVG, exp_avg_host);
  opt_state_to_host(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
}

void opt_set_shard(opt_state *o, const float *params_host, const float *exp_avg_host, const float *exp_avg_sq_host) {
  CHECK(o->zero, "opt_set_shard: the optimizer is not sharded over dp");
  o->engine.settle(o);
  opt_state_from_host(o, OPT_MASTER, params_host);
  opt_state_from_host(o, OPT_EXP_AVG, exp_avg_host);
  opt_state_from_host(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
  opt_weights_set(o);
}
