// The optimizer's state in host memory (optimizer.offload=host; see optim.h). The fp32 master
// weights (host_master) and the moments of the host share of the buckets live there, sharded
// over dp like the moments (this rank's part of each bucket only; the model keeps no flat fp32
// copy); the gradients and the compute copy stay in backend memory, and so does the whole state
// of the other buckets (the device share: dev_master and the moments, updated on the GPU as
// without offload). Two engines update the host share:
//   gpu: the multi-tensor AdamW kernel reads the gradient in device memory and reads and writes
//        the master weights and moments in host memory in place (mapped memory, zero-copy);
//   cpu: each bucket's gradient part is copied to host on the copy stream, the host's cores run
//        AdamW on it (k_cpu_adamw_ranges, the reference arithmetic) and the new compute weights
//        go back per bucket while the next bucket updates.
// With optimizer.offload_layer_wait (the default; dp 1, undelayed) the cpu engine's
// update of the host buckets runs on this thread inside the next forward instead: before each
// layer (m->weights_needed) the buckets up to the last one holding that layer's weights update,
// lowest first, and the compute stream waits for their copies back only, so the GPU runs the
// forward of the layers before while the host updates the next ones (opt_offload_complete).
// With optimizer.offload_delay the cpu engine's update of step k runs on a thread of its own
// while step k + 1's forward and backward run (opt_offload_start_delayed, opt_offload_join).
// With dp = 1 a host bucket's gradient is final as soon as backward has finished it, so its copy
// to host starts then, beside the rest of backward, as far as free slots allow
// (opt_offload_grads_final); with offload_delay the previous update's new weights of that bucket
// go back then too (backward no longer reads them this step). With dp > 1 both wait for the DP
// reduction.
// Every call is made per bucket part, with pointers moved to the part's start, so the
// gradient (shard order), the host master and moments (host order), and the compute copy (flat
// order) each keep their own indexing and no pointer leaves its array.
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/cpu/optim_cpu.h"
#include "parallel/step/optim.h"

// Every bucket's update ranges, bucket by bucket, with offset and p_offset counted from the
// start of the bucket's part (the two agree: a part is contiguous in the shard and flat); and
// the norm elements of every part: offset in the shard, p_offset in m->norm_copy (each norm
// tensor's t->p points there).
static void build_part_ranges(opt_state *o) {
  const model *m = o->m;
  int cap = 1;
  for (int b = 0; b < o->n_buckets; b++) cap += o->buckets[b].t_hi - o->buckets[b].t_lo;
  o->part_ranges = XCALLOC(cap, sizeof(k_range));
  o->master_norms = XCALLOC(cap, sizeof(k_range));
  o->part_first = XCALLOC(o->n_buckets + 1, sizeof(int));
  int n = 0;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    const int64_t plo = opt_part_lo(o, k);
    o->part_first[b] = n;
    for (int i = 0; i < o->n_upd_ranges; i++) {
      const k_range *r = &o->upd_ranges[i];
      if (r->offset < k->shard_off || r->offset >= k->shard_off + k->len) continue;
      o->part_ranges[n++] = (k_range){r->offset - k->shard_off, r->n_elem, r->decay, r->p_offset - plo};
    }
    for (int i = k->t_lo; i < k->t_hi; i++) {
      const model_tensor *t = &m->tensors[i];
      int64_t lo = t->offset > plo ? t->offset : plo, hi = t->offset + t->n_elem;
      if (hi > plo + k->len) hi = plo + k->len;
      if (t->tp_replicated && hi > lo)
        o->master_norms[o->n_master_norms++] =
            (k_range){k->shard_off + lo - plo, hi - lo, 0, (t->p - m->norm_copy) + lo - t->offset};
    }
  }
  o->part_first[o->n_buckets] = n;
}

// The delayed host update: its thread and the hyper-parameters of the step it updates.
struct opt_delay {
  pthread_t thread;
  int running;
  atomic_int done;  // the thread has updated every bucket (joining it does not block)
  float lr, bc1, bc2, g_scale;
};

// Buckets of the cpu engine in flight at once: copied to host, updating, copied back. Enough to
// keep the copy engines and the cores busy together; the host memory they take is a few buckets.
enum { OFFLOAD_SLOTS = 4 };

// What opt_offload_grads_final started for host bucket j during backward (opt_state.early).
enum { EARLY_GRAD = 1, EARLY_UP = 2 };

// Clears flag of every host bucket.
static void early_clear(opt_state *o, int flag) {
  for (int j = 0; j < o->n_host; j++) o->early[j] &= ~flag;
}

static void *host_state(opt_state *o, int64_t n_elem, size_t elem_bytes, const char *what) {
  const size_t n_bytes = (size_t)(n_elem ? n_elem : 1) * elem_bytes;
  o->host_bytes += (int64_t)n_bytes;
  return model_host_alloc(o->m->be, n_bytes, what);
}

static void on_weights_needed(void *ctx, int chunk, int layer);

void opt_offload_init(opt_state *o) {
  const opt_config *c = &o->cfg;
  o->n_host = c->offload ? (int)lround(c->offload_fraction * o->n_buckets) : 0;
  if (o->n_host > o->n_buckets) o->n_host = o->n_buckets;
  o->n_done = o->n_host;
  o->dev_n = o->n_host > 0 ? o->buckets[o->n_host - 1].shard_off : o->shard_n;
  CHECK(!c->offload || o->m->master_in_optimizer, "optimizer.offload=host on a model that holds its master weights: "
        "model_layout.master_in_optimizer must be set (cfg_model_layout sets it)");
  // Where the optimizer holds the master weights, every bucket updates on its own (the device
  // share from dev_master, the host share from host_master); else upd_ranges update m->params.
  o->n_dev_ranges = o->m->master_in_optimizer ? 0 : o->n_upd_ranges;
  if (!o->m->master_in_optimizer) return;
  build_part_ranges(o);
  o->dev_master = o->m->be->alloc(o->m->be, (size_t)(o->dev_n ? o->dev_n : 1) * sizeof(float));
  if (!c->offload) return;
  int64_t n_host_elem = o->shard_n - o->dev_n;
  o->host_master = host_state(o, n_host_elem, sizeof(float), "the fp32 master weights");
  o->host_m = host_state(o, n_host_elem, sizeof(float), "the AdamW moments");
  o->host_v = host_state(o, n_host_elem, sizeof(float), "the AdamW moments");
  if (!c->offload_cpu) return;
  // A delayed update reads its gradients while the next step makes new ones: every bucket a slot.
  o->n_slots = o->n_host < OFFLOAD_SLOTS || c->offload_delay ? o->n_host : OFFLOAD_SLOTS;
  if (c->offload_delay) o->delay = XCALLOC(1, sizeof *o->delay);
  for (int b = 0; b < o->n_host; b++)
    if (o->buckets[b].len > o->slot_elem) o->slot_elem = o->buckets[b].len;
  o->host_g = host_state(o, o->n_slots * o->slot_elem, sizeof(float), "the gradients' host copy");
  o->host_pc = host_state(o, o->n_slots * o->slot_elem, o->m->act_bytes, "the compute weights' host copy");
  o->grad_ticket = XCALLOC(o->n_host + 1, sizeof(int64_t));
  o->early = XCALLOC(o->n_host + 1, 1);
  // With dp > 1 the copies would wait for the DP reduction (and ZeRO's all-gather for every
  // bucket). FP8 remakes a layer's weight copies before its forward (model_fp8_weights_ready),
  // after this hook.
  o->layer_wait = c->offload_layer_wait && !c->offload_delay && o->n_host > 0 && o->g->dp_c->size == 1;
  if (o->layer_wait) {
    o->m->weights_needed = on_weights_needed;
    o->m->weights_needed_ctx = o;
  }
}

void opt_offload_free(opt_state *o) {
  k_backend *be = o->m->be;
  opt_offload_join(o);
  if (o->m->weights_needed_ctx == o) {
    o->m->weights_needed = NULL;
    o->m->weights_needed_ctx = NULL;
  }
  free(o->delay);
  o->delay = NULL;
  void *host[] = {o->host_master, o->host_m, o->host_v, o->host_g, o->host_pc};
  for (size_t i = 0; i < sizeof host / sizeof *host; i++)
    if (host[i]) be->host_free(be, host[i]);
  o->host_master = o->host_m = o->host_v = o->host_g = NULL;
  o->host_bytes = 0;
  o->host_pc = NULL;
  if (o->dev_master) be->free(be, o->dev_master);
  o->dev_master = NULL;
  free(o->part_ranges);
  free(o->part_first);
  free(o->master_norms);
  free(o->grad_ticket);
  free(o->early);
  o->early = NULL;
  o->part_ranges = o->master_norms = NULL;
  o->part_first = NULL;
  o->grad_ticket = NULL;
}

// Starts the copy of the cpu engine's host bucket j (counted from the lowest) into its slot.
static void copy_grad(opt_state *o, int j) {
  k_backend *be = o->m->be;
  const opt_bucket *k = &o->buckets[o->n_host - 1 - j];
  o->grad_ticket[j] = o->last_ticket = be->copy_async(be, o->host_g + (j % o->n_slots) * o->slot_elem,
                                                      o->grad_src + k->shard_off, (size_t)k->len * sizeof(float));
}

void opt_offload_copy_grads(opt_state *o, const float *grad) {
  if (!o->host_g) return;
  o->grad_src = grad;
  for (int j = 0; j < o->n_slots; j++)
    if (!(o->early[j] & EARLY_GRAD)) copy_grad(o, j);
  early_clear(o, EARLY_GRAD);
}

// Host memory only (the update thread runs it): AdamW on the host's cores over host bucket b from
// the gradient in its slot, into the master weights, the moments and the slot's new compute weights.
static void adamw_on_host(opt_state *o, int b, float lr, float bc1, float bc2, float g_scale) {
  model *m = o->m;
  const opt_config *hp = &o->cfg;
  const opt_bucket *k = &o->buckets[b];
  const int64_t hoff = k->shard_off - o->dev_n, slot = ((o->n_host - 1 - b) % o->n_slots) * o->slot_elem;
  const int n = o->part_first[b + 1] - o->part_first[b];
  k_cpu_adamw_ranges(o->host_master + hoff, (char *)o->host_pc + slot * (int64_t)m->act_bytes, m->be->act,
                     o->host_g + slot, o->host_m + hoff, o->host_v + hoff, o->part_ranges + o->part_first[b], n, lr,
                     hp->beta1, hp->beta2, hp->eps, hp->weight_decay, bc1, bc2, g_scale);
}

// Copies host bucket b's new compute weights from its slot into the compute copy. The slot's
// ticket becomes this copy's: the copy stream runs in order, so waiting for it also waits for
// the slot's gradient, and the slot's new weights are not overwritten before they are sent.
static void copy_back(opt_state *o, int b) {
  model *m = o->m;
  const opt_bucket *k = &o->buckets[b];
  const int j = o->n_host - 1 - b;
  const int64_t slot = (j % o->n_slots) * o->slot_elem, act_bytes = m->act_bytes;
  o->grad_ticket[j] = o->last_ticket =
      m->be->copy_async(m->be, opt_part_pc(o, k),
                        (char *)o->host_pc + slot * act_bytes, (size_t)(k->len * act_bytes));
}

// Whether host bucket j's gradient is final this step.
static int host_bucket_final(const opt_state *o, int j) {
  const opt_bucket *k = &o->buckets[o->n_host - 1 - j];
  for (int i = k->t_lo; i < k->t_hi; i++)
    if (!o->t_final[i]) return 0;
  return 1;
}

void opt_offload_grads_final(opt_state *o) {
  if (!o->host_g || o->g->dp_c->size > 1) return;  // dp > 1: the copies read the reduced gradient
  if (o->delay && o->delay->running) {
    if (!atomic_load(&o->delay->done)) return;  // its slots are still being read: copy at opt_step
    opt_offload_join(o);
  }
  o->grad_src = o->m->grads;
  // Backward finishes the highest buckets first (j = n_host - 1 first); only the slots' first
  // buckets (j < n_slots) have a free slot before the update.
  for (int j = o->n_slots - 1; j >= 0; j--) {
    if ((o->early[j] & EARLY_GRAD) || !host_bucket_final(o, j)) continue;
    copy_grad(o, j);
    o->early[j] |= EARLY_GRAD;
    if (o->upload_pending) copy_back(o, o->n_host - 1 - j), o->early[j] |= EARLY_UP;
  }
}

// A skipped step (non-finite gradient) after some of the previous update's weights went back
// during backward: the rest go back too, so that the next step computes with one set of weights.
int opt_offload_skip(opt_state *o) {
  if (!o->delay || !o->upload_pending) return 0;
  int any = 0;
  for (int j = 0; j < o->n_host && !any; j++) any = o->early[j] & EARLY_UP;
  if (!any) return 0;
  for (int j = 0; j < o->n_host; j++)
    if (!(o->early[j] & EARLY_UP)) copy_back(o, o->n_host - 1 - j);
  o->upload_pending = 0;
  early_clear(o, EARLY_UP);
  return 1;
}

// The cpu engine's update of host bucket b within its step: its gradient's host copy, the host
// update, the new weights back while the next bucket updates; its slot then takes the gradient
// of bucket j + n_slots (the copy stream runs in order: the copy back ends before it lands).
static void update_on_host(opt_state *o, int b, float lr, float bc1, float bc2, float g_scale) {
  const int j = o->n_host - 1 - b;
  o->m->be->copy_wait(o->m->be, o->grad_ticket[j]);
  adamw_on_host(o, b, lr, bc1, bc2, g_scale);
  copy_back(o, b);
  if (j + o->n_slots < o->n_host) copy_grad(o, j + o->n_slots);
}

// The update thread: each bucket as soon as its gradient has landed (and its slot's previous
// weights have gone back), while the main thread goes on to the next step.
static void *delayed_update(void *arg) {
  opt_state *o = arg;
  const struct opt_delay *d = o->delay;
  for (int b = o->n_host - 1; b >= 0; b--) {
    o->m->be->copy_wait(o->m->be, o->grad_ticket[o->n_host - 1 - b]);
    adamw_on_host(o, b, d->lr, d->bc1, d->bc2, d->g_scale);
  }
  atomic_store(&o->delay->done, 1);
  return NULL;
}

void opt_offload_join(opt_state *o) {
  if (!o->delay || !o->delay->running) return;
  CHECK(pthread_join(o->delay->thread, NULL) == 0, "cannot join the optimizer's host update thread");
  o->delay->running = 0;
  o->upload_pending = 1;
}

void opt_offload_start_delayed(opt_state *o, float lr, float bc1, float bc2, float g_scale) {
  if (!o->delay || o->n_host == 0) return;
  struct opt_delay *d = o->delay;
  o->upload_pending = 0;
  early_clear(o, EARLY_UP);
  // The copies queued on the compute stream that read or write the master weights (the norms'
  // refresh, their ZeRO exchange) are done before the thread writes them.
  o->m->be->sync(o->m->be);
  d->lr = lr, d->bc1 = bc1, d->bc2 = bc2, d->g_scale = g_scale;
  atomic_store(&d->done, 0);
  CHECK(pthread_create(&d->thread, NULL, delayed_update, o) == 0, "cannot start the optimizer's host update thread");
  d->running = 1;
}

void opt_offload_update(opt_state *o, int asc_lo, int asc_hi, const float *grad, float lr, float bc1, float bc2,
                        float g_scale) {
  model *m = o->m;
  k_backend *be = m->be;
  const opt_config *hp = &o->cfg;
  if (!m->master_in_optimizer) return;  // upd_ranges update everything (opt_step)
  for (int asc = asc_lo; asc < asc_hi; asc++) {
    const int b = o->n_buckets - 1 - asc;
    const opt_bucket *k = &o->buckets[b];
    const k_range *r = o->part_ranges + o->part_first[b];
    const int n = o->part_first[b + 1] - o->part_first[b];
    const int64_t hoff = k->shard_off - o->dev_n;
    char *pc = opt_part_pc(o, k);
    if (b >= o->n_host) {  // the device share: all of its state in backend memory
      opt_update_part(o, b, r, n, grad, lr, bc1, bc2, g_scale);
    } else if (o->delay) {  // the previous step's results, if a host update has run since the last copy back
      if (o->upload_pending && !(o->early[o->n_host - 1 - b] & EARLY_UP)) copy_back(o, b);
    } else if (o->layer_wait) {  // forward updates it (opt_offload_complete)
      o->pend.lr = lr, o->pend.bc1 = bc1, o->pend.bc2 = bc2, o->pend.g_scale = g_scale;
      o->n_done = 0;
    } else if (hp->offload_cpu) {
      update_on_host(o, b, lr, bc1, bc2, g_scale);
    } else {
      be->adamw_ranges(be, o->host_master + hoff, pc, be->act, grad + k->shard_off, o->host_m + hoff,
                       o->host_v + hoff, r, n, lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, bc1, bc2, g_scale);
    }
  }
}

// The master weights at shard offset off (n_elem of them, within one bucket part): dev_master
// below dev_n, host_master above.
static float *master_at(const opt_state *o, int64_t off) {
  return off < o->dev_n ? o->dev_master + off : o->host_master + (off - o->dev_n);
}

// The master's norm elements at shard offsets [lo, hi) into pack.
static void norms_out(opt_state *o, float *pack, int64_t lo, int64_t hi) {
  k_backend *be = o->m->be;
  for (int i = 0; i < o->n_master_norms; i++) {
    const k_range *r = &o->master_norms[i];
    if (r->offset >= lo && r->offset < hi)
      be->copy(be, pack + r->p_offset, master_at(o, r->offset), (size_t)r->n_elem * sizeof(float));
  }
}

void opt_offload_norms_out(opt_state *o, float *pack) { norms_out(o, pack, 0, opt_offload_pending_lo(o)); }

// offload_layer_wait keeps to dp 1 without ZeRO, where a bucket's part is the bucket: the shard
// is the flat buffer.
int64_t opt_offload_pending_lo(const opt_state *o) {
  return o->n_done < o->n_host ? o->buckets[o->n_host - 1 - o->n_done].lo : o->m->n_params;
}

// The pending update of host bucket b (the lowest pending one): the host update, its norms from
// the new master, and its gradient zeroed, as the copy to host that read it is done
// (update_on_host waited for it) and the next backward accumulates into it.
static void finish_pending(opt_state *o, int b) {
  model *m = o->m;
  const opt_bucket *k = &o->buckets[b];
  update_on_host(o, b, o->pend.lr, o->pend.bc1, o->pend.bc2, o->pend.g_scale);
  norms_out(o, m->norm_copy, k->lo, k->hi);
  m->be->zero(m->be, m->grads + k->lo, (size_t)(k->hi - k->lo) * sizeof(float));
  o->n_done++;
}

// Finishes every pending host bucket, from the lowest, that starts below flat element end; the
// compute work queued next waits for their new weights, not for the gradient copies queued after.
static void complete_below(opt_state *o, int64_t end) {
  const int first = o->n_done;
  while (o->n_done < o->n_host && o->buckets[o->n_host - 1 - o->n_done].lo < end)
    finish_pending(o, o->n_host - 1 - o->n_done);
  if (o->n_done > first) o->m->be->copy_join_ticket(o->m->be, o->grad_ticket[o->n_done - 1]);  // copy_back's
}

void opt_offload_complete(opt_state *o) { complete_below(o, INT64_MAX); }

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
  if (o->n_done == o->n_host) return;
  const double t0 = MPI_Wtime();
  int64_t end = 0;
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    if (group_reads(m, t, chunk, layer) && t->offset + t->n_elem > end) end = t->offset + t->n_elem;
  }
  complete_below(o, end);
  if (o->timing) o->timing->optimizer += MPI_Wtime() - t0;
}

void opt_offload_cast_master(opt_state *o) {
  model *m = o->m;
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    void *pc = opt_part_pc(o, k);
    if (pc) m->be->cast(m->be, pc, m->be->act, master_at(o, k->shard_off), K_F32, k->len);  // NULL: cast when gathered
  }
}

void opt_offload_params_to_host(opt_state *o, float *shard_host) {
  opt_offload_complete(o);
  k_backend *be = o->m->be;
  be->to_host(be, shard_host, o->dev_master, (size_t)o->dev_n * sizeof(float));
  be->sync(be);  // the gpu engine's kernels have written the host share
  if (o->n_host) memcpy(shard_host + o->dev_n, o->host_master, (size_t)(o->shard_n - o->dev_n) * sizeof(float));
}

void opt_offload_set_master(opt_state *o, int64_t shard_off, const float *src_host, int64_t n_elem) {
  opt_offload_complete(o);
  k_backend *be = o->m->be;
  if (shard_off < o->dev_n) {
    be->from_host(be, o->dev_master + shard_off, src_host, (size_t)n_elem * sizeof(float));
    return;
  }
  be->sync(be);  // no update in flight reads the host share
  memcpy(o->host_master + (shard_off - o->dev_n), src_host, (size_t)n_elem * sizeof(float));
}

void opt_moment_to_host(opt_state *o, int which, float *shard_host) {
  opt_offload_complete(o);
  k_backend *be = o->m->be;
  be->to_host(be, shard_host, which ? o->exp_avg_sq : o->exp_avg, (size_t)o->dev_n * sizeof(float));
  be->sync(be);  // the gpu engine's kernels have written the host share
  if (o->n_host)
    memcpy(shard_host + o->dev_n, which ? o->host_v : o->host_m, (size_t)(o->shard_n - o->dev_n) * sizeof(float));
}

void opt_moment_from_host(opt_state *o, int which, const float *shard_host) {
  opt_offload_complete(o);
  k_backend *be = o->m->be;
  be->sync(be);  // no update in flight reads the host share
  be->from_host(be, which ? o->exp_avg_sq : o->exp_avg, shard_host, (size_t)o->dev_n * sizeof(float));
  if (o->n_host)
    memcpy(which ? o->host_v : o->host_m, shard_host + o->dev_n, (size_t)(o->shard_n - o->dev_n) * sizeof(float));
}
