// The compute copy sharded over dp and gathered group by group (see weight_shard.h).
#include "parallel/step/weight_shard.h"
#include "kernels/base/check.h"
#include "kernels/base/trace.h"
#include "model/fp8.h"

_Static_assert(WEIGHT_SHARD_MAX_PREFETCH + 1 <= FP8_MAX_BANKS, "an FP8 bank for every slot of the prefetch");

static int bucket_chunk(const opt_state *o, int b) { return o->m->tensors[o->buckets[b].t_lo].chunk; }

// Makes the compute stream wait for slot s's gather, if one is in flight.
static void slot_wait(opt_state *o, int s) {
  weight_shard *ws = o->ws;
  if (!ws->slot_comm[s]) return;
  opt_comm_wait(o, ws->slot_comm[s], 1);
  ws->slot_comm[s] = NULL;
}

// Nothing in the slots is current (waiting for gathers still writing them).
static void invalidate(opt_state *o) {
  weight_shard *ws = o->ws;
  for (int s = 0; s < ws->n_slots; s++) {
    slot_wait(o, s);
    ws->slot_bucket[s] = -1;
    ws->slot_used[s] = 0;
  }
  ws->current = -1;
}

weight_shard *weight_shard_init(opt_state *o, int prefetch, int reshard) {
  model *m = o->m;
  k_backend *be = m->be;
  CHECK(o->gs && !m->params_c, "parallel.shard=weights needs the gradients sharded and a model without a compute "
        "copy (model_layout.weights_in_optimizer)");
  CHECK(prefetch >= 1 && prefetch <= WEIGHT_SHARD_MAX_PREFETCH && o->g->n_gather >= prefetch - 1,
        "parallel.shard_prefetch = %d needs %d gather communicators (grid_add_gathers), the grid has %d", prefetch,
        prefetch - 1, o->g->n_gather);
  CHECK(o->g->dp_overlap, "parallel.shard=weights: the gradients' reduce-scatters need the dp-overlap communicator "
        "(grid_add_dp_overlap), apart from the gathers");
  weight_shard *ws = XCALLOC(1, sizeof *ws);
  ws->tied_head = ws->tied_embed = -1;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    if (k->hi - k->lo > ws->slot_elem) ws->slot_elem = k->hi - k->lo;
    const model_chunk *ch = &m->chunks[bucket_chunk(o, b)];
    if (ch->lm_head && ch->lm_head == ch->embed && k->group == opt_group(bucket_chunk(o, b), MODEL_GRADS_HEAD)) {
      ws->tied_head = b;
      ws->tied_embed = opt_bucket_of_group(o, opt_group(bucket_chunk(o, b), MODEL_GRADS_EMBED));
    }
  }
  ws->prefetch = prefetch;
  ws->n_slots = reshard ? prefetch + 1 : o->n_buckets;
  CHECK(reshard || !m->fp8, "parallel.reshard_after_forward=false keeps a slot per layer, and FP8 has a bank of "
        "copies for %d slots at most: set parallel.reshard_after_forward=true or train.precision=bf16", FP8_MAX_BANKS);
  ws->slot = XCALLOC(ws->n_slots, sizeof *ws->slot);
  ws->slot_bucket = XCALLOC(ws->n_slots, sizeof *ws->slot_bucket);
  ws->slot_comm = XCALLOC(ws->n_slots, sizeof *ws->slot_comm);
  ws->slot_used = XCALLOC(ws->n_slots, sizeof *ws->slot_used);
  ws->slot_owner = XCALLOC(ws->n_slots, sizeof *ws->slot_owner);
  ws->copy_engine = o->cfg.gather_copy_engine;
  CHECK(!ws->copy_engine || o->g->n_gather == ws->n_slots, "parallel.gather_copy_engine: %d slots need as many "
        "gather communicators (grid_add_gathers), the grid has %d", ws->n_slots, o->g->n_gather);
  const size_t slot_bytes = (size_t)ws->slot_elem * m->act_bytes;
  for (int s = 0; s < ws->n_slots; s++) {
    comm *c = ws->copy_engine ? o->g->gather_c[s] : NULL;
    ws->slot[s] = c ? c->ops->buffer_alloc(c, slot_bytes) : NULL;
    ws->slot_owner[s] = ws->slot[s] ? c : NULL;
    if (!ws->slot[s]) ws->slot[s] = be->alloc(be, slot_bytes);
  }
  ws->n_bytes = (int64_t)((o->part_pc ? o->shard_n : 0) + ws->n_slots * ws->slot_elem) * (int64_t)m->act_bytes;
  ws->n_comms = prefetch;  // without the copy engines; with them slot s gathers on gather_c[s]
  ws->comms[0] = grid_shard_comm(o->g);
  for (int c = 1; c < prefetch; c++) ws->comms[c] = o->g->gather_c[c - 1];
  o->ws = ws;
  invalidate(o);
  return ws;
}

void weight_shard_free(weight_shard **p, k_backend *be) {
  weight_shard *ws = *p;
  if (!ws) return;
  for (int s = 0; s < ws->n_slots; s++)  // the next step's first gather, started after the last update
    if (ws->slot_comm[s]) ws->slot_comm[s]->ops->wait(ws->slot_comm[s]);
  for (int s = 0; s < ws->n_slots; s++) {
    if (ws->slot_owner[s]) ws->slot_owner[s]->ops->buffer_free(ws->slot_owner[s], ws->slot[s]);
    else be->free(be, ws->slot[s]);
  }
  free(ws->slot);
  free(ws->slot_bucket);
  free(ws->slot_comm);
  free(ws->slot_used);
  free(ws->slot_owner);
  free(ws);
  *p = NULL;
}

// This rank's part of bucket k into its place in slot s, on the compute stream: cast from the
// fp32 master weights (the same rounding as the update's own write of the compute copy), or
// copied from opt_state.part_pc where the update wrote it.
static void own_part_in(opt_state *o, const opt_bucket *k, int s) {
  k_backend *be = o->m->be;
  const int64_t ab = (int64_t)o->m->act_bytes;
  void *dst = (char *)o->ws->slot[s] + o->part_rank * k->len * ab;
  const void *part = opt_part_pc(o, k);
  if (part) be->copy(be, dst, part, (size_t)(k->len * ab));
  else be->cast(be, dst, be->act, opt_state_at(o, OPT_MASTER, k->shard_off), K_F32, k->len);
}

// The bucket whose weights group bucket b reads: a tied head reads the embedding's.
static int weights_of(const opt_state *o, int b) { return b == o->ws->tied_head ? o->ws->tied_embed : b; }

static int resident(const weight_shard *ws, int b) {
  for (int s = 0; s < ws->n_slots; s++)
    if (ws->slot_bucket[s] == b) return s;
  return -1;
}

// Starts the gather of bucket b into slot s, on the next communicator in turn: this rank's part
// put in its place (compute stream, after whatever read the slot before), the others' parts
// gathered around it.
static void gather_start(opt_state *o, int b, int s) {
  weight_shard *ws = o->ws;
  const opt_bucket *k = &o->buckets[b];
  const int64_t at = 0, len = k->len;
  slot_wait(o, s);  // a gather still writing slot s (a prefetch never used): this rank's part goes in after it
  opt_update_wait(o, b);  // optimizer.update_overlap: the part's update, on the side stream (the engine's)
  comm *c = ws->copy_engine ? o->g->gather_c[s] : ws->comms[ws->next_comm];
  if (!ws->copy_engine) ws->next_comm = (ws->next_comm + 1) % ws->n_comms;
  trace_push_range("dp weights all-gather");
  own_part_in(o, k, s);
  c->ops->all_gather_regions_start(c, ws->slot[s], &at, &len, 1, opt_act_comm(o));
  trace_pop_range();
  ws->slot_bucket[s] = b;
  ws->slot_comm[s] = c;
  ws->slot_used[s] = ++ws->tick;
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

// The slot a new gather takes: the least recently used one but the group computing's and those
// of the groups the pass reads next (keep, n_keep): one is always left, as at most prefetch of the
// prefetch + 1 slots hold those.
static int free_slot(const weight_shard *ws, const int *keep, int n_keep) {
  int best = -1;
  for (int s = 0; s < ws->n_slots; s++) {
    int kept = s == ws->current;
    for (int j = 0; j < n_keep && !kept; j++) kept = ws->slot_bucket[s] == keep[j];
    if (!kept && (best < 0 || ws->slot_used[s] < ws->slot_used[best])) best = s;
  }
  CHECK(best >= 0, "parallel.shard=weights: no free slot among %d", ws->n_slots);
  return best;
}

void weight_shard_needed(opt_state *o, int grp, int backward) {
  weight_shard *ws = o->ws;
  const int b = opt_bucket_of_group(o, grp), w = weights_of(o, b);
  // The groups this pass reads next, as far as the prefetch goes (w's weights first).
  int keep[WEIGHT_SHARD_MAX_PREFETCH + 1], n_keep = 0;
  keep[n_keep++] = w;
  for (int nb = next_in_pass(o, b, backward); nb >= 0 && n_keep <= ws->prefetch; nb = next_in_pass(o, nb, backward))
    keep[n_keep++] = weights_of(o, nb);
  // The group computed before is queued already: its slot may take a gather (which follows it on
  // the compute stream).
  ws->current = -1;
  int s = resident(ws, w);
  if (s < 0) {
    s = free_slot(ws, keep, n_keep);
    gather_start(o, w, s);
  }
  slot_wait(o, s);  // its gather (or the prefetch that brought it) has arrived
  ws->current = s;
  ws->slot_used[s] = ++ws->tick;
  point_weights(o, w, s);
  for (int j = 1; j < n_keep; j++)
    if (resident(ws, keep[j]) < 0) gather_start(o, keep[j], free_slot(ws, keep, n_keep));
}

void weight_shard_refresh(opt_state *o) {
  invalidate(o);
  gather_start(o, o->n_buckets - 1, 0);
}
