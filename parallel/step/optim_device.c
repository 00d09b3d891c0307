// The device engine (see optim_engine.h): AdamW by the backend over this rank's shard, its whole
// state in backend memory. Where the model holds the master weights (m->params: every rank all of
// them) a piece updates in one multi-tensor call over the flat buffer; where the optimizer holds
// them, one call per bucket part.
// optimizer.update_overlap (parallel.shard=weights): the norms' elements update at once (they are
// shared before the next forward) and each bucket's other elements on the backend's side stream,
// in the order forward reads the buckets; the gather of a bucket's weights first makes the compute
// stream wait for its update (wait_bucket). The same arithmetic as updating each bucket whole:
// AdamW is elementwise.
#include <stdlib.h>

#include "kernels/base/check.h"
#include "parallel/step/optim_engine.h"

// update_overlap's split of each bucket's update ranges (part_ranges): early (the norms) and late,
// offsets from its part's start.
typedef struct beside {
  k_range *early, *late;
  int *early_first, *late_first;  // (n_buckets + 1) bucket b's ranges start there
  int64_t *ticket;                // (n_buckets) the side stream's ticket of bucket b's update; -1: none to wait for
} beside;

static void update_flat(opt_state *o, int k, const float *grad, const opt_hparams *h) {
  model *m = o->m;
  k_backend *be = m->be;
  const opt_config *hp = &o->cfg;
  void *pc = m->params_c == (void *)m->params ? NULL : m->params_c;  // the compute copy, where it is not the master
  const int r0 = o->piece_first[k], r1 = o->piece_first[k + 1];
  if (r1 > r0)
    be->adamw_ranges(be, m->params, pc, be->act, grad, o->exp_avg, o->exp_avg_sq, o->upd_ranges + r0, r1 - r0, h->lr,
                     hp->beta1, hp->beta2, hp->eps, hp->weight_decay, h->bc1, h->bc2, h->g_scale);
}

static void update_parts(opt_state *o, int k, const float *grad, const opt_hparams *h) {
  for (int asc = o->piece_bucket[k]; asc < o->piece_bucket[k + 1]; asc++)
    opt_update_bucket(o, o->n_buckets - 1 - asc, grad, h);
}

// The piece's norms now (opt_share_norms reads them next), then the rest of each of its buckets on
// the side stream, the lowest (which forward reads first) first.
static void update_beside(opt_state *o, int k, const float *grad, const opt_hparams *h) {
  beside *s = o->engine.ctx;
  k_backend *be = o->m->be;
  const int b_lo = o->n_buckets - o->piece_bucket[k + 1], b_hi = o->n_buckets - o->piece_bucket[k];
  for (int b = b_lo; b < b_hi; b++)
    opt_update_part(o, b, s->early + s->early_first[b], s->early_first[b + 1] - s->early_first[b], grad, h);
  for (int b = b_hi - 1; b >= b_lo; b--) {
    be->side_begin(be);
    opt_update_part(o, b, s->late + s->late_first[b], s->late_first[b + 1] - s->late_first[b], grad, h);
    s->ticket[b] = be->side_end(be);
  }
}

static void beside_wait(opt_state *o, int b) {
  beside *s = o->engine.ctx;
  if (s->ticket[b] < 0) return;
  o->m->be->side_join_ticket(o->m->be, s->ticket[b]);
  s->ticket[b] = -1;
}

static void beside_join(opt_state *o) {
  for (int b = 0; b < o->n_buckets; b++) beside_wait(o, b);
}

static void beside_free(opt_state *o) {
  beside *s = o->engine.ctx;
  if (!s) return;
  beside_join(o);
  free(s->early);
  free(s->late);
  free(s->early_first);
  free(s->late_first);
  free(s->ticket);
  free(s);
  o->engine.ctx = NULL;
}

// Whether range r of bucket k's part (opt_state.part_ranges) is a norm's: each update range lies
// in one tensor.
static int range_is_norm(const opt_state *o, const opt_bucket *k, const k_range *r) {
  const int64_t at = opt_part_lo(o, k) + r->p_offset;
  for (int i = k->t_lo; i < k->t_hi; i++) {
    const model_tensor *t = &o->m->tensors[i];
    if (at >= t->offset && at < t->offset + t->n_elem) return t->tp_replicated;
  }
  return 0;
}

static beside *beside_init(const opt_state *o) {
  beside *s = XCALLOC(1, sizeof *s);
  const int cap = o->part_first[o->n_buckets] + 1;
  s->early = XCALLOC(cap, sizeof(k_range));
  s->late = XCALLOC(cap, sizeof(k_range));
  s->early_first = XCALLOC(o->n_buckets + 1, sizeof(int));
  s->late_first = XCALLOC(o->n_buckets + 1, sizeof(int));
  s->ticket = XCALLOC(o->n_buckets, sizeof(int64_t));
  int ne = 0, nl = 0;
  for (int b = 0; b < o->n_buckets; b++) {
    s->early_first[b] = ne, s->late_first[b] = nl;
    s->ticket[b] = -1;
    for (int j = o->part_first[b]; j < o->part_first[b + 1]; j++) {
      if (range_is_norm(o, &o->buckets[b], &o->part_ranges[j])) s->early[ne++] = o->part_ranges[j];
      else s->late[nl++] = o->part_ranges[j];
    }
  }
  s->early_first[o->n_buckets] = ne, s->late_first[o->n_buckets] = nl;
  return s;
}

void opt_device_engine_init(opt_state *o) {
  opt_engine *e = &o->engine;
  *e = (opt_engine){.name = "device"};
  o->dev_n = o->shard_n;
  if (!o->m->master_in_optimizer) {
    e->update_piece = update_flat;
  } else if (o->m->weights_in_optimizer && o->cfg.update_overlap) {
    e->name = "device, beside the next forward";
    e->ctx = beside_init(o);
    e->update_piece = update_beside;
    e->wait_bucket = beside_wait;
    e->settle = beside_join;
    e->free = beside_free;
  } else {
    e->update_piece = update_parts;
  }
}
