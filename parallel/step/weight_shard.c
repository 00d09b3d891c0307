// The compute copy sharded over dp and gathered group by group (see weight_shard.h).
#include "parallel/step/weight_shard.h"
#include "kernels/base/check.h"
#include "kernels/base/trace.h"
#include "model/fp8.h"

static int bucket_of(const opt_state *o, int grp) {
  for (int b = 0; b < o->n_buckets; b++)
    if (o->buckets[b].group == grp) return b;
  CHECK(0, "parallel.shard=weights: the model asked for group %d, which no bucket holds", grp);
  return -1;
}

static int bucket_chunk(const opt_state *o, int b) { return o->m->tensors[o->buckets[b].t_lo].chunk; }

// Nothing in the slots is current (waiting for a gather still writing one).
static void invalidate(opt_state *o) {
  weight_shard *ws = o->ws;
  if (ws->pending) ws->c->ops->wait(ws->c);  // a prefetch still writes a slot
  ws->pending = 0;
  ws->slot_bucket[0] = ws->slot_bucket[1] = -1;
  ws->current = -1;
}

weight_shard *weight_shard_init(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  CHECK(o->gs && !m->params_c, "parallel.shard=weights needs the gradients sharded and a model without a compute "
        "copy (model_layout.weights_in_optimizer)");
  weight_shard *ws = XCALLOC(1, sizeof *ws);
  ws->tied_head = ws->tied_embed = -1;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    if (k->hi - k->lo > ws->slot_elem) ws->slot_elem = k->hi - k->lo;
    const model_chunk *ch = &m->chunks[bucket_chunk(o, b)];
    if (ch->lm_head && ch->lm_head == ch->embed && k->group == opt_group(bucket_chunk(o, b), MODEL_GRADS_HEAD)) {
      ws->tied_head = b;
      ws->tied_embed = bucket_of(o, opt_group(bucket_chunk(o, b), MODEL_GRADS_EMBED));
    }
  }
  ws->pc = be->alloc(be, (size_t)(o->shard_n ? o->shard_n : 1) * m->act_bytes);
  for (int s = 0; s < 2; s++) ws->slot[s] = be->alloc(be, (size_t)ws->slot_elem * m->act_bytes);
  ws->n_bytes = (int64_t)(o->shard_n + 2 * ws->slot_elem) * (int64_t)m->act_bytes;
  ws->c = grid_shard_comm(o->g);
  CHECK(o->g->dp_overlap, "parallel.shard=weights: the gradients' reduce-scatters need the dp-overlap communicator "
        "(grid_add_dp_overlap), apart from the gathers");
  o->ws = ws;
  invalidate(o);
  return ws;
}

void weight_shard_free(weight_shard **p, k_backend *be) {
  weight_shard *ws = *p;
  if (!ws) return;
  if (ws->pending) ws->c->ops->wait(ws->c);  // the next step's first gather, started after the last update
  be->free(be, ws->pc);
  for (int s = 0; s < 2; s++) be->free(be, ws->slot[s]);
  free(ws);
  *p = NULL;
}

void *weight_shard_part(const opt_state *o, const opt_bucket *k) {
  return (char *)o->ws->pc + k->shard_off * (int64_t)o->m->act_bytes;
}


// The bucket whose weights group bucket b reads: a tied head reads the embedding's.
static int weights_of(const opt_state *o, int b) { return b == o->ws->tied_head ? o->ws->tied_embed : b; }

static int resident(const weight_shard *ws, int b) {
  return ws->slot_bucket[0] == b ? 0 : ws->slot_bucket[1] == b ? 1 : -1;
}

// Starts the gather of bucket b into slot s: this rank's part copied to its place (compute stream,
// after whatever read the slot before), the others' parts gathered around it.
static void gather_start(opt_state *o, int b, int s) {
  weight_shard *ws = o->ws;
  const opt_bucket *k = &o->buckets[b];
  k_backend *be = o->m->be;
  const int64_t ab = (int64_t)o->m->act_bytes, at = 0, len = k->len;
  if (ws->pending) {  // a gather in flight may write slot s: this rank's part goes in after it
    opt_comm_wait(o, ws->c);
    ws->pending = 0;
  }
  trace_push_range("dp weights all-gather");
  be->copy(be, (char *)ws->slot[s] + o->part_rank * len * ab, weight_shard_part(o, k), (size_t)(len * ab));
  ws->c->ops->all_gather_regions_start(ws->c, ws->slot[s], &at, &len, 1, opt_act_comm(o));
  trace_pop_range();
  ws->slot_bucket[s] = b;
  ws->pending = 1;
  model_fp8_place(o->m, s, k->t_lo, k->t_hi);  // FP8: the group's copies, remade from slot s before use
}

// Bucket b's tensors read their compute weights from slot s. (A tied head's group reads the
// embedding tensor, in the embedding's bucket; its final norm is read in fp32 from m->norm_copy.)
static void point_weights(opt_state *o, int b, int s) {
  const opt_bucket *k = &o->buckets[b];
  const int64_t ab = (int64_t)o->m->act_bytes;
  for (int i = k->t_lo; i < k->t_hi; i++) {
    model_tensor *t = &o->m->tensors[i];
    t->pc = (char *)o->ws->slot[s] + (t->offset - k->lo) * ab;
  }
}

// The pass's next group after bucket b, in the same chunk (forward: the next higher in flat order,
// so the next lower bucket index), or -1.
static int next_in_pass(const opt_state *o, int b, int backward) {
  const int n = backward ? b + 1 : b - 1;
  if (n < 0 || n >= o->n_buckets || bucket_chunk(o, n) != bucket_chunk(o, b)) return -1;
  return n;
}

void weight_shard_needed(opt_state *o, int grp, int backward) {
  weight_shard *ws = o->ws;
  const int b = bucket_of(o, grp), w = weights_of(o, b);
  int s = resident(ws, w);
  if (s < 0) {
    s = ws->current == 0 ? 1 : 0;
    gather_start(o, w, s);
  }
  if (ws->pending) {  // its gather (or, resident, the prefetch that brought it) has arrived
    opt_comm_wait(o, ws->c);
    ws->pending = 0;
  }
  ws->current = s;
  point_weights(o, w, s);
  const int nb = next_in_pass(o, b, backward), nw = nb < 0 ? -1 : weights_of(o, nb);
  if (nw >= 0 && resident(ws, nw) < 0) gather_start(o, nw, 1 - s);
}

void weight_shard_refresh(opt_state *o) {
  invalidate(o);
  gather_start(o, o->n_buckets - 1, 0);
}
