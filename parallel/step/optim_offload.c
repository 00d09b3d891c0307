// The offload engine (optimizer.offload=host; see optim_engine.h). The fp32 master weights and
// the moments of a share of the buckets (the host share: opt_state's host_master, host_m, host_v)
// live in host memory, sharded over dp like the moments (this rank's part of each bucket only; the
// model keeps no flat fp32 copy); the gradients and the compute copy stay in backend memory, and
// so does the whole state of the other buckets (the device share, updated on the GPU as by the
// device engine). Two ways update the host share, chosen at init:
//   gpu: the multi-tensor AdamW kernel reads the gradient in device memory and reads and writes
//        the master weights and moments in host memory in place (mapped memory, zero-copy);
//   cpu: each bucket's gradient part is copied to host on the copy stream, the host's cores run
//        AdamW on it (k_cpu_adamw_ranges, the reference arithmetic) and the new compute weights
//        go back per bucket while the next bucket updates.
// With optimizer.offload_layer_wait (the default; dp 1, undelayed) the cpu engine's
// update of the host buckets runs on this thread inside the next forward instead: before each
// layer (m->weights_needed) the buckets up to the last one holding that layer's weights update,
// lowest first, and the compute stream waits for their copies back only, so the GPU runs the
// forward of the layers before while the host updates the next ones (settle finishes them all).
// With optimizer.offload_delay the cpu engine's update of step k runs on a thread of its own
// while step k + 1's forward and backward run (end starts it, begin and flush join it).
// With dp = 1 a host bucket's gradient is final as soon as backward has finished it, so its copy
// to host starts then, beside the rest of backward, as far as free slots allow (grads_final);
// with offload_delay the previous update's new weights of that bucket go back then too (backward
// no longer reads them this step). With dp > 1 both wait for the DP reduction.
// Every call is made per bucket part, with pointers moved to the part's start, so the
// gradient (shard order), the host master and moments (host order), and the compute copy (flat
// order) each keep their own indexing and no pointer leaves its array.
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/base/check.h"
#include "kernels/cpu/optim_cpu.h"
#include "parallel/step/optim_engine.h"

// Buckets of the cpu engine in flight at once: copied to host, updating, copied back. Enough to
// keep the copy engines and the cores busy together; the host memory they take is a few buckets.
enum { OFFLOAD_SLOTS = 4 };

// What grads_final started for host bucket j during backward (offload.early).
enum { EARLY_GRAD = 1, EARLY_UP = 2 };

// The delayed host update: its thread and the step it updates.
typedef struct offload_delay {
  pthread_t thread;
  int running;
  atomic_int done;  // the thread has updated every bucket (joining it does not block)
  opt_hparams h;
} offload_delay;

// The engine's state (o->engine.ctx). Buckets [0, n_host) (the highest, which backward finishes
// first) are the host share; in shard order they are [dev_n, shard_n).
typedef struct offload {
  int n_host;
  // How a host bucket updates within its step (the zero-copy kernel, the host's cores, the copy
  // back of the delayed update's results, or left to the next forward): chosen at init.
  void (*update_host)(opt_state *o, int b, const float *grad, const opt_hparams *h);
  // The cpu engine takes the host buckets from the lowest (j = 0 is bucket n_host - 1): bucket
  // j's gradient part is copied into slot j % n_slots of host_g (ticket grad_ticket[j]), the
  // host's cores update it and write the new compute weights into the same slot of host_pc, which
  // is copied back into the compute copy; then the copy of bucket j + n_slots starts into the
  // freed slot.
  int n_slots;
  int64_t slot_elem;        // elements of a slot: the longest bucket part
  float *host_g;            // (n_slots, slot_elem)
  void *host_pc;            // (n_slots, slot_elem) in the backend's activation dtype
  int64_t *grad_ticket;     // (n_host)
  const float *grad_src;    // the gradient the copies read (this step's)
  char *early;              // (n_host) per host bucket j: its gradient copy (EARLY_GRAD) and, with
                            // offload_delay, its new weights' copy back (EARLY_UP) started during backward
  // offload_delay: every host bucket has its own slot; the host update of a step runs on a thread
  // of its own until the next step's begin (or flush) joins it, and its new compute weights wait
  // in host_pc (upload_pending) for that step to copy them back.
  offload_delay *delay;
  int upload_pending;
  // offload_layer_wait (opt_state.layer_wait): the step updates the device share and leaves the
  // host buckets pending, with the step's arguments in pend; the next forward updates them
  // through m->weights_needed, from the lowest, as far as the group it is about to run reads, and
  // its compute stream waits for those buckets' copies back only. As each bucket's update
  // finishes its norms are refreshed and its gradient (read by its copy to host until then) is
  // zeroed.
  int n_done;               // host buckets updated, from the lowest (j < n_done); n_host: none pending
  opt_hparams pend;
} offload;

static offload *ctx_of(const opt_state *o) { return o->engine.ctx; }

// Clears flag of every host bucket.
static void early_clear(offload *x, int flag) {
  for (int j = 0; j < x->n_host; j++) x->early[j] &= ~flag;
}

static void *host_state(opt_state *o, int64_t n_elem, size_t elem_bytes, const char *what) {
  const size_t n_bytes = (size_t)(n_elem ? n_elem : 1) * elem_bytes;
  o->host_bytes += (int64_t)n_bytes;
  return model_host_alloc(o->m->be, n_bytes, what);
}

// Starts the copy of the cpu engine's host bucket j (counted from the lowest) into its slot.
static void copy_grad(opt_state *o, int j) {
  offload *x = ctx_of(o);
  k_backend *be = o->m->be;
  const opt_bucket *k = &o->buckets[x->n_host - 1 - j];
  x->grad_ticket[j] = be->copy_async(be, x->host_g + (j % x->n_slots) * x->slot_elem, x->grad_src + k->shard_off,
                                     (size_t)k->len * sizeof(float));
}

// Host memory only (the update thread runs it): AdamW on the host's cores over host bucket b from
// the gradient in its slot, into the master weights, the moments and the slot's new compute weights.
static void adamw_on_host(opt_state *o, int b, const opt_hparams *h) {
  const offload *x = ctx_of(o);
  model *m = o->m;
  const opt_config *hp = &o->cfg;
  const opt_bucket *k = &o->buckets[b];
  const int64_t slot = ((x->n_host - 1 - b) % x->n_slots) * x->slot_elem;
  const int n = o->part_first[b + 1] - o->part_first[b];
  k_cpu_adamw_ranges(opt_state_at(o, OPT_MASTER, k->shard_off), (char *)x->host_pc + slot * (int64_t)m->act_bytes,
                     m->be->act, x->host_g + slot, opt_state_at(o, OPT_EXP_AVG, k->shard_off),
                     opt_state_at(o, OPT_EXP_AVG_SQ, k->shard_off), o->part_ranges + o->part_first[b], n, h->lr,
                     hp->beta1, hp->beta2, hp->eps, hp->weight_decay, h->bc1, h->bc2, h->g_scale);
}

// Copies host bucket b's new compute weights from its slot into the compute copy. The slot's
// ticket becomes this copy's: the copy stream runs in order, so waiting for it also waits for
// the slot's gradient, and the slot's new weights are not overwritten before they are sent.
static void copy_back(opt_state *o, int b) {
  offload *x = ctx_of(o);
  model *m = o->m;
  const opt_bucket *k = &o->buckets[b];
  const int j = x->n_host - 1 - b;
  const int64_t slot = (j % x->n_slots) * x->slot_elem, act_bytes = m->act_bytes;
  x->grad_ticket[j] = m->be->copy_async(m->be, opt_part_pc(o, k), (char *)x->host_pc + slot * act_bytes,
                                        (size_t)(k->len * act_bytes));
}

// Whether host bucket j's gradient is final this step.
static int host_bucket_final(const opt_state *o, int j) {
  const opt_bucket *k = &o->buckets[ctx_of(o)->n_host - 1 - j];
  for (int i = k->t_lo; i < k->t_hi; i++)
    if (!o->t_final[i]) return 0;
  return 1;
}

// The update thread: each bucket as soon as its gradient has landed (and its slot's previous
// weights have gone back), while the main thread goes on to the next step.
static void *delayed_update(void *arg) {
  opt_state *o = arg;
  offload *x = ctx_of(o);
  for (int b = x->n_host - 1; b >= 0; b--) {
    o->m->be->copy_wait(o->m->be, x->grad_ticket[x->n_host - 1 - b]);
    adamw_on_host(o, b, &x->delay->h);
  }
  atomic_store(&x->delay->done, 1);
  return NULL;
}

// offload_delay: joins the host update in flight, if any (its results then await upload).
static void join_delayed(opt_state *o) {
  offload *x = ctx_of(o);
  if (!x->delay || !x->delay->running) return;
  CHECK(pthread_join(x->delay->thread, NULL) == 0, "cannot join the optimizer's host update thread");
  x->delay->running = 0;
  x->upload_pending = 1;
}

// Called as backward finishes gradients: with dp = 1, starts the copies of the host buckets whose
// gradients are final, from the lowest, into the free slots.
static void offload_grads_final(opt_state *o) {
  offload *x = ctx_of(o);
  if (!x->host_g || o->g->dp_c->size > 1) return;  // dp > 1: the copies read the reduced gradient
  if (x->delay && x->delay->running) {
    if (!atomic_load(&x->delay->done)) return;  // its slots are still being read: copy at the step
    join_delayed(o);
  }
  x->grad_src = o->m->grads;
  // Backward finishes the highest buckets first (j = n_host - 1 first); only the slots' first
  // buckets (j < n_slots) have a free slot before the update.
  for (int j = x->n_slots - 1; j >= 0; j--) {
    if ((x->early[j] & EARLY_GRAD) || !host_bucket_final(o, j)) continue;
    copy_grad(o, j);
    x->early[j] |= EARLY_GRAD;
    if (x->upload_pending) copy_back(o, x->n_host - 1 - j), x->early[j] |= EARLY_UP;
  }
}

// The step begins: offload_delay's previous host update joined before its slots are reused, and
// the cpu engine's copies of the host share's gradient (grad: m->grads, or the ZeRO shard) started
// beside the norm.
static void offload_begin(opt_state *o, const float *grad) {
  offload *x = ctx_of(o);
  join_delayed(o);
  if (!x->host_g) return;
  x->grad_src = grad;
  for (int j = 0; j < x->n_slots; j++)
    if (!(x->early[j] & EARLY_GRAD)) copy_grad(o, j);
  early_clear(x, EARLY_GRAD);
}

// A skipped step (non-finite gradient) after some of the previous update's weights went back
// during backward: the rest go back too, so that the next step computes with one set of weights.
// The gradient copies are done before the step zeroes what they read.
static int offload_skip(opt_state *o) {
  offload *x = ctx_of(o);
  int any = 0;
  for (int j = 0; x->delay && x->upload_pending && j < x->n_host && !any; j++) any = (x->early[j] & EARLY_UP) != 0;
  if (any) {
    for (int j = 0; j < x->n_host; j++)
      if (!(x->early[j] & EARLY_UP)) copy_back(o, x->n_host - 1 - j);
    x->upload_pending = 0;
    early_clear(x, EARLY_UP);
  }
  o->m->be->copy_join(o->m->be);
  return any;
}

// The cpu engine's update of host bucket b within its step: its gradient's host copy, the host
// update, the new weights back while the next bucket updates; its slot then takes the gradient
// of bucket j + n_slots (the copy stream runs in order: the copy back ends before it lands).
static void update_on_host(opt_state *o, int b, const float *grad, const opt_hparams *h) {
  offload *x = ctx_of(o);
  (void)grad;  // its host copy (grad_src) is read
  const int j = x->n_host - 1 - b;
  o->m->be->copy_wait(o->m->be, x->grad_ticket[j]);
  adamw_on_host(o, b, h);
  copy_back(o, b);
  if (j + x->n_slots < x->n_host) copy_grad(o, j + x->n_slots);
}

// offload_delay: the previous step's results of host bucket b go back, if a host update has run
// since the last copy back (this step's update starts at end).
static void upload_previous(opt_state *o, int b, const float *grad, const opt_hparams *h) {
  offload *x = ctx_of(o);
  (void)grad, (void)h;
  if (x->upload_pending && !(x->early[x->n_host - 1 - b] & EARLY_UP)) copy_back(o, b);
}

// offload_layer_wait: the next forward updates host bucket b (complete_below).
static void defer_to_forward(opt_state *o, int b, const float *grad, const opt_hparams *h) {
  offload *x = ctx_of(o);
  (void)b, (void)grad;
  x->pend = *h;
  x->n_done = 0;
}

// The device share's buckets of piece k update on the GPU, the host share's as chosen at init.
static void offload_update_piece(opt_state *o, int k, const float *grad, const opt_hparams *h) {
  offload *x = ctx_of(o);
  for (int asc = o->piece_bucket[k]; asc < o->piece_bucket[k + 1]; asc++) {
    const int b = o->n_buckets - 1 - asc;
    if (b >= x->n_host) opt_update_bucket(o, b, grad, h);
    else x->update_host(o, b, grad, h);
  }
  o->m->be->copy_join(o->m->be);  // the cpu engine's new weights are in place before they are gathered or read
}

// offload_delay: once this step's update of the device share is queued (and the hooks have read
// the master's norms), starts the host update of this step's gradients on the update thread.
static void offload_end(opt_state *o, const opt_hparams *h) {
  offload *x = ctx_of(o);
  if (!x->delay || x->n_host == 0) return;
  offload_delay *d = x->delay;
  x->upload_pending = 0;
  early_clear(x, EARLY_UP);
  // The copies queued on the compute stream that read or write the master weights (the norms'
  // refresh, their ZeRO exchange) are done before the thread writes them.
  o->m->be->sync(o->m->be);
  d->h = *h;
  atomic_store(&d->done, 0);
  CHECK(pthread_create(&d->thread, NULL, delayed_update, o) == 0, "cannot start the optimizer's host update thread");
  d->running = 1;
}

// Completes an update that offload_delay left in flight: joins it and copies its weights back
// (the host buckets only, as the device share's were updated in their step).
static int offload_flush(opt_state *o) {
  offload *x = ctx_of(o);
  join_delayed(o);
  if (!x->upload_pending) return 0;
  for (int b = x->n_host - 1; b >= 0; b--) upload_previous(o, b, NULL, NULL);
  x->upload_pending = 0;
  o->m->be->copy_join(o->m->be);
  return 1;
}

// offload_layer_wait keeps to dp 1 without ZeRO, where a bucket's part is the bucket: the shard
// is the flat buffer.
static int64_t offload_pending_lo(const opt_state *o) {
  const offload *x = ctx_of(o);
  return x->n_done < x->n_host ? o->buckets[x->n_host - 1 - x->n_done].lo : o->m->n_params;
}

// The pending update of host bucket b (the lowest pending one): the host update, its norms from
// the new master, and its gradient zeroed, as the copy to host that read it is done
// (update_on_host waited for it) and the next backward accumulates into it.
static void finish_pending(opt_state *o, int b) {
  offload *x = ctx_of(o);
  model *m = o->m;
  const opt_bucket *k = &o->buckets[b];
  update_on_host(o, b, NULL, &x->pend);
  opt_master_norms_out(o, m->norm_copy, k->lo, k->hi);
  m->be->zero(m->be, m->grads + k->lo, (size_t)(k->hi - k->lo) * sizeof(float));
  x->n_done++;
}

// Finishes every pending host bucket, from the lowest, that starts below flat element end; the
// compute work queued next waits for their new weights, not for the gradient copies queued after.
static void complete_below(opt_state *o, int64_t end) {
  offload *x = ctx_of(o);
  const int first = x->n_done;
  while (x->n_done < x->n_host && o->buckets[x->n_host - 1 - x->n_done].lo < end)
    finish_pending(o, x->n_host - 1 - x->n_done);
  if (x->n_done > first) o->m->be->copy_join_ticket(o->m->be, x->grad_ticket[x->n_done - 1]);  // copy_back's
}

// offload_layer_wait: runs the host update that the step left pending, if any.
static void offload_settle(opt_state *o) { complete_below(o, INT64_MAX); }

// Whether forward's group (chunk, layer) reads tensor t (the ids of model.weights_needed).
static int group_reads(const model *m, const model_tensor *t, int chunk, int layer) {
  const model_chunk *ch = &m->chunks[chunk];
  if (layer == MODEL_GRADS_HEAD && t == ch->lm_head) return 1;  // the embedding, when tied
  if (t->chunk != chunk) return 0;
  if (layer >= 0) return t->layer == ch->layer0 + layer;
  return t->kind == (layer == MODEL_GRADS_EMBED ? MODEL_EMBED : MODEL_FINAL_NORM);
}

// m->weights_needed: the pending buckets up to the last one holding a weight the group reads.
// The host's time here is the optimizer's in the run report (timing.h); meanwhile the GPU runs
// the forward already queued.
static void on_weights_needed(void *ctx, int chunk, int layer) {
  opt_state *o = ctx;
  const model *m = o->m;
  if (ctx_of(o)->n_done == ctx_of(o)->n_host) return;
  const double t0 = MPI_Wtime();
  int64_t end = 0;
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    if (group_reads(m, t, chunk, layer) && t->offset + t->n_elem > end) end = t->offset + t->n_elem;
  }
  complete_below(o, end);
  if (o->timing) o->timing->optimizer += MPI_Wtime() - t0;
}

static void offload_free(opt_state *o) {
  offload *x = ctx_of(o);
  if (!x) return;
  k_backend *be = o->m->be;
  join_delayed(o);
  if (o->m->weights_needed_ctx == o && o->layer_wait) {
    o->m->weights_needed = NULL;
    o->m->weights_needed_ctx = NULL;
  }
  void *host[] = {o->host_master, o->host_m, o->host_v, x->host_g, x->host_pc};
  for (size_t i = 0; i < sizeof host / sizeof *host; i++)
    if (host[i]) be->host_free(be, host[i]);
  o->host_master = o->host_m = o->host_v = NULL;
  o->host_bytes = 0;
  if (o->part_pc) be->free(be, o->part_pc);
  o->part_pc = NULL;
  free(x->delay);
  free(x->grad_ticket);
  free(x->early);
  free(x);
  o->engine.ctx = NULL;
}

// The cpu engine's slots and, with offload_delay, its thread's state; offload_layer_wait's hook.
static void cpu_init(opt_state *o, offload *x) {
  const opt_config *c = &o->cfg;
  // A delayed update reads its gradients while the next step makes new ones: every bucket a slot.
  x->n_slots = x->n_host < OFFLOAD_SLOTS || c->offload_delay ? x->n_host : OFFLOAD_SLOTS;
  if (c->offload_delay) x->delay = XCALLOC(1, sizeof *x->delay);
  for (int b = 0; b < x->n_host; b++)
    if (o->buckets[b].len > x->slot_elem) x->slot_elem = o->buckets[b].len;
  x->host_g = host_state(o, x->n_slots * x->slot_elem, sizeof(float), "the gradients' host copy");
  x->host_pc = host_state(o, x->n_slots * x->slot_elem, o->m->act_bytes, "the compute weights' host copy");
  x->grad_ticket = XCALLOC(x->n_host + 1, sizeof(int64_t));
  x->early = XCALLOC(x->n_host + 1, 1);
  // With dp > 1 the copies would wait for the DP reduction (and ZeRO's all-gather for every
  // bucket). FP8 remakes a layer's weight copies before its forward (model_fp8_weights_ready),
  // after this hook.
  o->layer_wait = c->offload_layer_wait && !c->offload_delay && x->n_host > 0 && o->g->dp_c->size == 1;
  if (o->layer_wait) {
    o->m->weights_needed = on_weights_needed;
    o->m->weights_needed_ctx = o;
  }
  x->update_host = x->delay ? upload_previous : o->layer_wait ? defer_to_forward : update_on_host;
}

void opt_offload_engine_init(opt_state *o) {
  const opt_config *c = &o->cfg;
  model *m = o->m;
  CHECK(m->master_in_optimizer, "optimizer.offload=host on a model that holds its master weights: "
        "model_layout.master_in_optimizer must be set (cfg_model_layout sets it)");
  offload *x = XCALLOC(1, sizeof *x);
  o->engine = (opt_engine){.name = c->offload_cpu ? "offload, host cores" : "offload, zero-copy", .ctx = x,
                           .grads_final = offload_grads_final, .settle = offload_settle, .begin = offload_begin,
                           .update_piece = offload_update_piece, .end = offload_end, .skip = offload_skip,
                           .flush = offload_flush, .pending_lo = offload_pending_lo, .free = offload_free};
  x->n_host = (int)lround(c->offload_fraction * o->n_buckets);
  if (x->n_host > o->n_buckets) x->n_host = o->n_buckets;
  x->n_done = x->n_host;
  o->dev_n = x->n_host > 0 ? o->buckets[x->n_host - 1].shard_off : o->shard_n;
  const int64_t n_host_elem = o->shard_n - o->dev_n;
  o->host_master = host_state(o, n_host_elem, sizeof(float), "the fp32 master weights");
  o->host_m = host_state(o, n_host_elem, sizeof(float), "the AdamW moments");
  o->host_v = host_state(o, n_host_elem, sizeof(float), "the AdamW moments");
  // Without a compute copy (parallel.shard=weights) the update writes this rank's parts of it here,
  // where the gathers take them.
  if (m->weights_in_optimizer) o->part_pc = m->be->alloc(m->be, (size_t)(o->shard_n ? o->shard_n : 1) * m->act_bytes);
  if (c->offload_cpu) cpu_init(o, x);
  else x->update_host = opt_update_bucket;
}
