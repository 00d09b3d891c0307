// The optimizer's state in and out (see optim.h): the master weights and moments of the whole
// flat buffer, or of this rank's shard where the optimizer is sharded over dp, into host memory
// for a checkpoint and back; weights set tensor by tensor.
#include <stdlib.h>

#include "kernels/base/check.h"
#include "parallel/step/optim.h"

void opt_get_params(opt_state *o, float *params_host) {
  CHECK(!o->zero, "opt_get_params: the optimizer is sharded over dp: take this rank's shard (opt_get_shard)");
  o->engine.settle(o);  // an update beside the forward, or left to it, is part of the state
  model *m = o->m;
  if (m->master_in_optimizer) opt_state_to_host(o, OPT_MASTER, params_host);  // the shard is the flat buffer
  else m->be->to_host(m->be, params_host, m->params, (size_t)m->n_params * sizeof(float));
}

void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host) {
  CHECK(!o->zero, "opt_get_moments: the optimizer is sharded over dp: take this rank's shard (opt_get_shard)");
  o->engine.settle(o);
  opt_state_to_host(o, OPT_EXP_AVG, exp_avg_host);
  opt_state_to_host(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
}

void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host) {
  CHECK(!o->zero, "opt_set_moments: the optimizer is sharded over dp: set this rank's shard (opt_set_shard)");
  o->engine.settle(o);
  opt_state_from_host(o, OPT_EXP_AVG, exp_avg_host);
  opt_state_from_host(o, OPT_EXP_AVG_SQ, exp_avg_sq_host);
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
