// Gradients sharded over dp (see grad_shard.h).
#include "parallel/step/grad_shard.h"
#include "kernels/base/check.h"
#include "kernels/base/trace.h"

// Points bucket b's tensors' gradients into slot s, which holds the bucket's flat elements from lo.
static void point_grads(opt_state *o, int b, int s) {
  const opt_bucket *k = &o->buckets[b];
  for (int i = k->t_lo; i < k->t_hi; i++) o->m->tensors[i].g = o->gs->slot[s] + (o->m->tensors[i].offset - k->lo);
  o->gs->slot_of[b] = s;
}

grad_shard *grad_shard_init(opt_state *o) {
  model *m = o->m;
  k_backend *be = m->be;
  CHECK(m->grads_in_optimizer && o->zero, "parallel.shard=grads needs dp > 1 and a model laid out for it");
  grad_shard *gs = XCALLOC(1, sizeof *gs);
  o->gs = gs;
  gs->tied_bucket = -1;
  gs->add_bucket = -1;
  gs->slot_of = XCALLOC(o->n_buckets, sizeof(int));
  gs->count = XCALLOC(o->n_buckets, sizeof(int));
  int64_t part = 1, tied = 0;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    CHECK(k->len * o->parts == k->hi - k->lo, "parallel.shard=grads: bucket %d [%lld, %lld) is not %d equal parts", b,
          (long long)k->lo, (long long)k->hi, o->parts);
    if (k->len > part) part = k->len;
    const model_tensor *t = &m->tensors[k->t_lo];
    if (t->kind == MODEL_EMBED && m->chunks[t->chunk].lm_head == m->chunks[t->chunk].embed) {
      gs->tied_bucket = b;
      tied = k->hi - k->lo;
    } else if (k->hi - k->lo > gs->slot_elem) {
      gs->slot_elem = k->hi - k->lo;
    }
  }
  for (int s = 0; s < 2; s++) gs->slot[s] = be->alloc(be, (size_t)gs->slot_elem * sizeof(float));
  if (tied) {
    gs->slot[2] = be->alloc(be, (size_t)tied * sizeof(float));  // zero-filled: ready for the first head
    point_grads(o, gs->tied_bucket, 2);
  }
  gs->part = be->alloc(be, (size_t)part * sizeof(float));
  gs->staging_bytes = (int64_t)(2 * gs->slot_elem + tied + part) * (int64_t)sizeof(float);
  const comm_compress_mode mode = o->cfg.grad_compress;
  CHECK(mode == COMM_COMPRESS_NONE || (mode == COMM_COMPRESS_BF16 && !o->cfg.grad_error_feedback),
        "parallel.shard=grads reduces each layer's gradients from its staging slot in fp32, or bf16 without error "
        "feedback: parallel.grad_compress int8 or fp16, or error feedback, needs parallel.shard=optimizer or none");
  gs->bf16 = mode == COMM_COMPRESS_BF16;
  for (int s = 0; gs->bf16 && s < 3; s++) {
    const int64_t n = s < 2 ? gs->slot_elem : tied;
    if (n == 0) continue;
    gs->wire[s] = be->alloc(be, (size_t)n * 2);
    gs->recv[s] = be->alloc(be, (size_t)part * 2);
    gs->staging_bytes += (n + part) * 2;
  }
  gs->c = o->g->dp_overlap ? o->g->dp_overlap : grid_shard_comm(o->g);
  return gs;
}

void grad_shard_free(grad_shard **p, k_backend *be) {
  grad_shard *gs = *p;
  if (!gs) return;
  for (int s = 0; s < 3; s++) {
    void *own[] = {gs->slot[s], gs->wire[s], gs->recv[s]};
    for (int i = 0; i < 3; i++)
      if (own[i]) be->free(be, own[i]);
  }
  be->free(be, gs->part);
  free(gs->slot_of);
  free(gs->count);
  free(gs);
  *p = NULL;
}

// Waits (compute stream) for the reduce-scatters started so far, adds a later micro-batch's part
// into the shard and zeroes a tied embedding's slot for the next micro-batch.
static void flush(opt_state *o) {
  grad_shard *gs = o->gs;
  if (!gs->busy[0] && !gs->busy[1] && !gs->busy[2]) return;
  k_backend *be = o->m->be;
  opt_comm_wait(o, gs->c, 0);
  for (int s = 0; gs->bf16 && s < 3; s++)  // the bf16 parts widened where the fp32 ones would be
    if (gs->busy[s]) be->cast(be, gs->dst[s], K_F32, gs->recv[s], K_BF16, gs->dst_len[s]);
  if (gs->add_bucket >= 0) {
    const opt_bucket *k = &o->buckets[gs->add_bucket];
    be->add(be, o->grad_shard + k->shard_off, gs->part, K_F32, k->len);
    gs->add_bucket = -1;
  }
  if (gs->busy[2]) {
    const opt_bucket *k = &o->buckets[gs->tied_bucket];
    be->zero(be, gs->slot[2], (size_t)(k->hi - k->lo) * sizeof(float));
  }
  // parallel.shard_group: a bucket's part is final after its last micro-batch; summed over the
  // replicas while backward goes on.
  const opt_bucket *k = &o->buckets[gs->last_bucket];
  if (o->replica && gs->count[gs->last_bucket] == o->n_micro)
    o->replica->ops->all_reduce_start(o->replica, o->grad_shard + k->shard_off, k->len, COMM_F32, COMM_SUM);
  gs->busy[0] = gs->busy[1] = gs->busy[2] = 0;
}

// Zeroes slot (bucket b's elements from lo) but where backward writes a gradient whole
// (model_grad_written): the norms, the embedding, the head and the padding, a few spans.
static void zero_unwritten(opt_state *o, int b, float *slot) {
  const model *m = o->m;
  const opt_bucket *k = &o->buckets[b];
  int64_t from = k->lo;  // the first element not yet zeroed nor written
  for (int i = k->t_lo; i <= k->t_hi; i++) {
    const model_tensor *t = i < k->t_hi ? &m->tensors[i] : NULL;
    if (t && !model_grad_written(m, t)) continue;
    const int64_t to = t ? t->offset : k->hi;
    if (to > from) m->be->zero(m->be, slot + (from - k->lo), (size_t)(to - from) * sizeof(float));
    if (t) from = t->offset + t->n_elem;
  }
}

void grad_shard_needed(opt_state *o, int grp) {
  grad_shard *gs = o->gs;
  const int b = opt_bucket_of_group(o, grp);
  if (gs->busy[2]) flush(o);  // a tied embedding's slot is written from the head's backward on
  if (b == gs->tied_bucket) return;
  const int s = gs->next;
  gs->next ^= 1;
  if (gs->busy[s]) flush(o);
  zero_unwritten(o, b, gs->slot[s]);
  point_grads(o, b, s);
}

void grad_shard_ready(opt_state *o, int grp) {
  grad_shard *gs = o->gs;
  const int b = opt_bucket_of_group(o, grp);
  const opt_bucket *k = &o->buckets[b];
  for (int i = k->t_lo; i < k->t_hi; i++) opt_sum_sp_partial(o, i);
  flush(o);  // the previous group's reduce-scatter, which ran beside this group's backward
  trace_push_range("dp grads reduce-scatter");
  const int s = gs->slot_of[b];
  float *dst = gs->count[b] == 0 ? o->grad_shard + k->shard_off : gs->part;
  if (dst == gs->part) gs->add_bucket = b;
  gs->last_bucket = b;
  if (gs->bf16) {
    o->m->be->cast(o->m->be, gs->wire[s], K_BF16, gs->slot[s], K_F32, k->hi - k->lo);
    gs->c->ops->reduce_scatter_start(gs->c, gs->wire[s], gs->recv[s], k->len, COMM_BF16, COMM_SUM);
    gs->dst[s] = dst, gs->dst_len[s] = k->len;
  } else {
    gs->c->ops->reduce_scatter_start(gs->c, gs->slot[s], dst, k->len, COMM_F32, COMM_SUM);
  }
  gs->busy[s] = 1;
  gs->count[b]++;
  trace_pop_range();
}

void grad_shard_step_end(opt_state *o) {
  grad_shard *gs = o->gs;
  flush(o);
  if (o->replica) opt_comm_wait(o, o->replica, 0);
  for (int b = 0; b < o->n_buckets; b++) {
    CHECK(gs->count[b] == o->n_micro,
          "parallel.shard=grads: bucket %d (group %d) was reduced %d times this step, expected once per "
          "micro-batch (%d): every backward must run through model_chunk_bwd's hooks",
          b, o->buckets[b].group, gs->count[b], o->n_micro);
    gs->count[b] = 0;
  }
}
