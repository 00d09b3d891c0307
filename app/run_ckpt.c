// Checkpoint glue (see run_ckpt.h). Host staging buffers make it backend-independent.
#include "app/run_ckpt.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"
#include "model/format/ckpt.h"
#include "model/fp8.h"
#include "model/format/hf.h"
#include "model/format/hf_config.h"
#include "parallel/step/grad_compress.h"
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

static const char *section_prefix[3] = {"model/", "optim/exp_avg/", "optim/exp_avg_sq/"};

static const model_tensor *find_tensor(const model *m, model_kind k, int layer) {
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].kind == k && m->tensors[i].layer == layer) return &m->tensors[i];
  return NULL;
}

// Entries of one section: one per tensor of the whole model.
// World rank 0: the rank at the origin of every group.
static int is_root(const model *m) { return m->tp_rank == 0 && m->dp_rank == 0 && m->pp_rank == 0; }

static int section_entries(const model_config *mc) { return 1 + 9 * mc->n_layers + 1 + (mc->tie_embeddings ? 0 : 1); }

// With the optimizer sharded over dp (opt_sharded) each rank saves and loads only its shard: the
// master weights and moments of its part of every bucket, so no rank gathers the others' parts
// (the 7B's 81 GB on every rank of a dp4 host) and each part is written once, by its own rank.
// A tensor's elements in the shard are flat runs (opt_shard_ranges); each run is one to three
// row-aligned blocks of the tensor (a partial first row, whole rows, a partial last row), each
// one more entry of the dataset (ckpt.h: a name may repeat). Every rank passes the same list, so
// each tensor gets the most entries any rank needs, the ones a rank does not need empty.
typedef struct ckpt_shards {
  int *n_blocks;  // (section_entries) entries of each tensor of the whole model, the most over the ranks
  int per_section;
} ckpt_shards;

// Appends at out (NULL: counts only) the blocks of tensor mt in this rank's shard, whose host copy
// is host (shard order); returns how many. Each block keeps mt's ndim and full shape.
static int shard_blocks(const opt_state *o, const model_tensor *mt, float *host, int write, ckpt_tensor *out) {
  int n_ranges, n = 0;
  const k_range *r = opt_shard_ranges(o, &n_ranges);
  CHECK(mt->ndim == 1 || mt->ndim == 2, "checkpoint: tensor '%s' has %d dimensions, expected 1 or 2", mt->name,
        mt->ndim);
  const int64_t cols = mt->ndim == 2 ? mt->count[1] : mt->n_elem;
  for (int k = 0; k < n_ranges; k++) {
    if (r[k].p_offset < mt->offset || r[k].p_offset >= mt->offset + mt->n_elem) continue;
    const int64_t a = r[k].p_offset - mt->offset, b = a + r[k].n_elem;
    for (int64_t i = a; i < b; n++) {
      const int64_t row = i / cols, col = i % cols;
      const int64_t len = col != 0 || b - i < cols ? (cols - col < b - i ? cols - col : b - i) : (b - i) / cols * cols;
      if (out) {
        ckpt_tensor *t = &out[n];
        if (mt->ndim == 1) {
          t->start[0] = mt->start[0] + i, t->count[0] = len;
        } else {
          t->start[0] = mt->start[0] + row, t->count[0] = len < cols ? 1 : len / cols;
          t->start[1] = mt->start[1] + col, t->count[1] = len < cols ? len : cols;
        }
        t->data = host + r[k].offset + (i - a);
        t->write = write;
      }
      i += len;
    }
  }
  return n;
}

// Calls fn(m, k, layer, arg) for every tensor of the whole model in the checkpoint's order: one
// kind after another, every layer of it (identical on every rank).
static void each_tensor(const model *m, void (*fn)(const model *, model_kind, int, void *), void *arg) {
  for (int k = 0; k < MODEL_N_KINDS; k++) {
    if (k == MODEL_LM_HEAD && m->cfg.tie_embeddings) continue;
    int n_layers = model_specs[k].per_layer ? m->cfg.n_layers : 1;
    for (int l = 0; l < n_layers; l++) fn(m, (model_kind)k, model_specs[k].per_layer ? l : -1, arg);
  }
}

typedef struct shard_count {
  const opt_state *o;
  int *n_blocks, e;
} shard_count;

static void count_tensor(const model *m, model_kind k, int layer, void *arg) {
  shard_count *c = arg;
  const model_tensor *mt = find_tensor(m, k, layer);
  c->n_blocks[c->e++] = mt ? shard_blocks(c->o, mt, NULL, 0, NULL) : 0;
}

// Collective over the world: sh for this run, or sh->n_blocks NULL where the optimizer is not
// sharded (each section then holds every rank's whole flat buffer, dp rank 0 writing).
static void shards_init(ckpt_shards *sh, const model *m, const opt_state *o) {
  *sh = (ckpt_shards){0};
  if (!opt_sharded(o)) return;
  const int n = section_entries(&m->cfg);
  shard_count c = {.o = o, .n_blocks = XCALLOC((size_t)n, sizeof(int))};
  each_tensor(m, count_tensor, &c);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, c.n_blocks, n, MPI_INT, MPI_MAX, o->g->world->mpi));
  sh->n_blocks = c.n_blocks;
  for (int i = 0; i < n; i++) sh->per_section += sh->n_blocks[i] > 0 ? sh->n_blocks[i] : 1;
}

static void shards_free(ckpt_shards *sh) {
  free(sh->n_blocks);
  sh->n_blocks = NULL;
}

// Elements of each section's host buffer: the shard, or the whole flat buffer.
static int64_t section_elems(const model *m, const opt_state *o) {
  return opt_sharded(o) ? opt_shard_elems(o) : m->n_params;
}

// Entries of one section.
static int section_size(const model *m, const ckpt_shards *sh) {
  return sh->n_blocks ? sh->per_section : section_entries(&m->cfg);
}

typedef struct section_add {
  const opt_state *o;
  const ckpt_shards *sh;  // NULL: the whole flat buffer (or per_dp)
  const char *prefix;
  float *host;
  int per_dp, e;
  ckpt_tensor *list;
  int *n;
} section_add;

// One tensor's entries: its name and full shape, then its blocks (see add_section).
static void add_tensor(const model *m, model_kind k, int layer, void *arg) {
  section_add *a = arg;
  const int lead = a->per_dp ? 1 : 0;
  ckpt_tensor head = {0};
  int64_t full[2];
  head.ndim = model_full_shape(&m->cfg, k, full) + lead;
  if (layer >= 0) snprintf(head.name, sizeof head.name, "%slayers.%d.%s", a->prefix, layer, model_specs[k].name);
  else snprintf(head.name, sizeof head.name, "%s%s", a->prefix, model_specs[k].name);
  if (a->per_dp) head.full[0] = m->dp;
  for (int dd = lead; dd < head.ndim; dd++) head.full[dd] = full[dd - lead];
  const model_tensor *mt = find_tensor(m, k, layer);
  const int e = a->e++;
  if (a->sh) {  // this rank's blocks, then empty ones up to the most any rank has
    const int want = a->sh->n_blocks[e] > 0 ? a->sh->n_blocks[e] : 1;
    for (int i = 0; i < want; i++) a->list[*a->n + i] = head;
    int got = mt ? shard_blocks(a->o, mt, a->host, opt_shard_writes(a->o) && (!mt->tp_replicated || m->tp_rank == 0),
                                &a->list[*a->n])
                 : 0;
    CHECK(got <= want, "checkpoint: tensor '%s' has %d blocks in this rank's shard, room for %d", head.name, got, want);
    *a->n += want;
    return;
  }
  ckpt_tensor *t = &a->list[(*a->n)++];
  *t = head;
  if (a->per_dp) t->start[0] = m->dp_rank, t->count[0] = mt ? 1 : 0;
  for (int dd = lead; dd < t->ndim; dd++) {
    t->start[dd] = mt ? mt->start[dd - lead] : 0;
    t->count[dd] = mt ? mt->count[dd - lead] : 0;
  }
  t->data = mt ? a->host + mt->offset : NULL;
  t->write = mt && (a->per_dp || m->dp_rank == 0) && (!mt->tp_replicated || m->tp_rank == 0);
}

// Appends one section at list[*n]: every tensor of the whole model under prefix, identical names
// and shapes on every rank; blocks this rank does not hold have count 0. host is a host buffer:
// this rank's shard where sh names one (sh->n_blocks), else its whole flat buffer. per_dp (whole
// buffers only): a leading dimension of dp, this rank's row at dp_rank, written by every dp
// replica (state that differs between them); otherwise dp rank 0 writes.
static void add_section(const model *m, const opt_state *o, const ckpt_shards *sh, const char *prefix, float *host,
                        int per_dp, ckpt_tensor *list, int *n) {
  section_add a = {.o = o, .sh = sh && sh->n_blocks ? sh : NULL, .prefix = prefix, .host = host, .per_dp = per_dp,
                   .list = list, .n = n};
  each_tensor(m, add_tensor, &a);
}

// Entries besides the weights and moments: the FP8 state of every chunk and of the head, the residual.
static int extra_entries(const model *m) { return 3 * m->vpp + 3 + section_entries(&m->cfg); }

// The weights and both moments from host[3] (section_elems each). Room for n_extra more entries
// is left at the end. Order: all layers of one kind after another would scatter a layer; sort is
// not needed for correctness, only identical order on every rank, which add_section gives.
static ckpt_tensor *build_list(const model *m, const opt_state *o, const ckpt_shards *sh, float *host[3],
                               int n_extra, int *n_out) {
  ckpt_tensor *list = XCALLOC((size_t)3 * section_size(m, sh) + n_extra, sizeof(ckpt_tensor));
  int n = 0;
  for (int s = 0; s < 3; s++) add_section(m, o, sh, section_prefix[s], host[s], 0, list, &n);
  *n_out = n;
  return list;
}

// Error feedback's residual (parallel/step/grad_compress.h): per dp rank, so each tensor gets a
// leading dimension of dp, (dp, full shape); a resume under another tp or pp reads its own
// blocks of the same rows. Under another dp the rows do not map to ranks, so it starts at zero.
static const char *const residual_prefix = "grad_compress/residual/";

static float *residual_of(const opt_state *o) { return o->gc ? o->gc->residual : NULL; }

// FP8 scaling state (train.precision=fp8): the activation group's scale, 1 / scale and amax
// history, each at its full shape over every layer of the model, (n_layers, slots) and
// (n_layers, slots, history); each chunk of this rank is one block of rows. Values are the
// same on every tp and dp rank (the amaxes are reduced over both), so one replica writes.
// Weights need none: their scales come from their current amax each step. With fp8.head, the
// head's slots too, as fp8/head/* (fp8_head_list).
typedef struct fp8_host {
  float *scale, *scale_inv, *history;  // host copies of the model_fp8 arrays
  int len;                             // history length
} fp8_host;

static void fp8_host_alloc(const model *m, fp8_host *h) {
  const model_fp8 *f = m->fp8;
  h->len = f->cfg.recipe == MODEL_FP8_DELAYED ? f->cfg.amax_history : 1;
  h->scale = XMALLOC((size_t)f->n_act * sizeof(float));
  h->scale_inv = XMALLOC((size_t)f->n_act * sizeof(float));
  h->history = XCALLOC((size_t)(f->n_act * h->len), sizeof(float));
  for (int64_t i = 0; i < f->n_act; i++) h->scale[i] = h->scale_inv[i] = 1.0f;  // what a load leaves unread
}

static void fp8_host_free(fp8_host *h) {
  free(h->scale);
  free(h->scale_inv);
  free(h->history);
}

// Appends the state's 3 * vpp entries to list at *n.
static void fp8_list(const model *m, const fp8_host *h, ckpt_tensor *list, int *n) {
  static const char *const names[3] = {"fp8/scale", "fp8/scale_inv", "fp8/amax_history"};
  float *data[3] = {h->scale, h->scale_inv, h->history};
  for (int s = 0; s < 3; s++)
    for (int ci = 0; ci < m->vpp; ci++) {
      const model_chunk *ch = &m->chunks[ci];
      ckpt_tensor *t = &list[(*n)++];
      snprintf(t->name, sizeof t->name, "%s", names[s]);
      t->ndim = s == 2 ? 3 : 2;
      int64_t full[3] = {m->cfg.n_layers, FP8_ACT_SLOTS, h->len}, start[3] = {ch->layer0, 0, 0},
              count[3] = {ch->n_layers, FP8_ACT_SLOTS, h->len};
      for (int dd = 0; dd < t->ndim; dd++) t->full[dd] = full[dd], t->start[dd] = start[dd], t->count[dd] = count[dd];
      int64_t first = ch->n_layers ? ch->layers[0].fp8 : 0;
      t->data = data[s] + first * FP8_ACT_SLOTS * (s == 2 ? h->len : 1);
      t->write = m->dp_rank == 0 && m->tp_rank == 0;
    }
}

// Appends the head's 3 entries (fp8.head): its slots (FP8_ACT_SLOTS; model_fp8_head_slot) and
// their history (FP8_ACT_SLOTS, history), held and written by the head's rank of dp 0, tp 0.
static void fp8_head_list(const model *m, const fp8_host *h, ckpt_tensor *list, int *n) {
  static const char *const names[3] = {"fp8/head/scale", "fp8/head/scale_inv", "fp8/head/amax_history"};
  float *data[3] = {h->scale, h->scale_inv, h->history};
  int hs = model_fp8_head_slot(m);
  for (int s = 0; s < 3; s++) {
    ckpt_tensor *t = &list[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", names[s]);
    t->ndim = s == 2 ? 2 : 1;
    int64_t full[2] = {FP8_ACT_SLOTS, h->len};
    for (int dd = 0; dd < t->ndim; dd++) t->full[dd] = full[dd], t->start[dd] = 0, t->count[dd] = hs >= 0 ? full[dd] : 0;
    t->data = hs >= 0 ? data[s] + (int64_t)hs * FP8_ACT_SLOTS * (s == 2 ? h->len : 1) : NULL;
    t->write = hs >= 0 && m->dp_rank == 0 && m->tp_rank == 0;
  }
}

static void fp8_to_host(const model *m, fp8_host *h) {
  const model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  be->to_host(be, h->scale, f->scale, (size_t)f->n_act * sizeof(float));
  model_fp8_scale_inv_to_host(m, h->scale_inv);
  be->to_host(be, h->history, f->history, (size_t)(f->n_act * h->len) * sizeof(float));
}

static void fp8_from_host(model *m, const fp8_host *h, int64_t step) {
  model_fp8 *f = m->fp8;
  k_backend *be = m->be;
  be->from_host(be, f->scale, h->scale, (size_t)f->n_act * sizeof(float));
  model_fp8_scale_inv_from_host(m, h->scale_inv);
  be->from_host(be, f->history, h->history, (size_t)(f->n_act * h->len) * sizeof(float));
  be->sync(be);  // the host buffers are freed next
  f->pos = step % h->len;  // one update per step: model_fp8_settle ran before the save
  f->have_history = step > 0;
}

// n_elem zeroed floats of host memory for a checkpoint's tensors, faulted in in 2 MiB pages where
// the kernel makes them on request (transparent huge pages in madvise mode): a checkpoint's
// gigabytes otherwise fault in 4 KiB at a time, the kernel zeroing each (about a third of a load
// from the page cache on CPU ranks).
static float *host_floats(int64_t n_elem) {
  const size_t n_bytes = (size_t)n_elem * sizeof(float), page = 4096;
  float *p = XCALLOC((size_t)n_elem, sizeof(float));
  uintptr_t lo = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1), hi = ((uintptr_t)p + n_bytes) & ~(uintptr_t)(page - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);  // advice: refused, it changes nothing
  return p;
}

static void alloc_host(int64_t n_elem, float *host[3]) {
  for (int s = 0; s < 3; s++) host[s] = host_floats(n_elem);
}

// Everything a checkpoint of this rank holds, in host memory, with the tensor list over it: the
// buffers of a synchronous save (malloc'd, freed after it) or of asynchronous ones (the backend's
// pinned host memory, allocated at the first and reused, since the device copies into it at
// full speed and the background write reads it while training goes on).
struct run_ckpt_snapshot {
  float *host[3];      // (section_elems) this rank's weights, exp_avg, exp_avg_sq: its shard or its flat buffer
  ckpt_shards sh;      // how the sections list the shard's blocks; n_blocks NULL: whole flat buffers
  float *res;          // (n_params) error feedback's residual; NULL: the run keeps none
  fp8_host h8;         // FP8 scaling state; scale NULL: not an FP8 run
  ckpt_tensor *list;   // (cap) the tensors over the buffers above
  int n, cap;
  char *yaml;          // the resolved config
  ckpt_meta meta;
  k_backend *pinned;   // the backend whose host_alloc holds host[] and res; NULL: malloc'd
};

// n_bytes of host memory: the backend's pinned memory (be), else malloc'd; zero-filled. NULL only
// when the backend refuses.
static float *snapshot_buffer(k_backend *be, int64_t n_elem) {
  size_t n_bytes = (size_t)n_elem * sizeof(float);
  return be ? be->host_alloc(be, n_bytes) : host_floats(n_elem);
}

static void snapshot_buffer_free(const run_ckpt_snapshot *s, float *p) {
  if (p && s->pinned) s->pinned->host_free(s->pinned, p);
  else free(p);
}

static void snapshot_free(run_ckpt_snapshot *s) {
  for (int i = 0; i < 3; i++) snapshot_buffer_free(s, s->host[i]);
  snapshot_buffer_free(s, s->res);
  shards_free(&s->sh);
  fp8_host_free(&s->h8);
  free(s->list);
  free(s->yaml);
  free(s);
}

// The buffers for the checkpoints of this run. pinned: the backend's host_alloc (NULL: malloc).
// NULL where the backend refuses pinned memory (the others are freed). Collective (shards_init).
static run_ckpt_snapshot *snapshot_alloc(const cfg *c, const model *m, const opt_state *o, k_backend *pinned) {
  run_ckpt_snapshot *s = XCALLOC(1, sizeof *s);
  s->pinned = pinned;
  shards_init(&s->sh, m, o);
  int ok = 1;
  for (int i = 0; i < 3; i++) ok = ok && (s->host[i] = snapshot_buffer(pinned, section_elems(m, o))) != NULL;
  if (ok && residual_of(o)) ok = (s->res = snapshot_buffer(pinned, m->n_params)) != NULL;
  if (!ok) {
    snapshot_free(s);
    return NULL;
  }
  if (m->fp8) fp8_host_alloc(m, &s->h8);
  s->cap = 3 * section_size(m, &s->sh) + extra_entries(m);
  s->list = XCALLOC((size_t)s->cap, sizeof(ckpt_tensor));
  size_t n_yaml = cfg_to_yaml(c, NULL, 0) + 1;
  s->yaml = XMALLOC(n_yaml);
  cfg_to_yaml(c, s->yaml, n_yaml);
  return s;
}

// Collective (opt_flush): copies everything the checkpoint of step holds into s and lists it.
static void snapshot_take(run_ckpt_snapshot *s, const cfg *c, model *m, opt_state *o, int64_t step,
                          int64_t samples_seen) {
  opt_flush(o);  // offload_delay: the update in flight is part of the checkpoint's step
  if (s->sh.n_blocks) {
    opt_get_shard(o, s->host[0], s->host[1], s->host[2]);
  } else {
    opt_get_params(o, s->host[0]);
    opt_get_moments(o, s->host[1], s->host[2]);
  }
  s->n = 0;
  for (int i = 0; i < 3; i++) add_section(m, o, &s->sh, section_prefix[i], s->host[i], 0, s->list, &s->n);
  if (m->fp8) {
    model_fp8_settle(m);
    fp8_to_host(m, &s->h8);
    fp8_list(m, &s->h8, s->list, &s->n);
    if (m->fp8->cfg.head) fp8_head_list(m, &s->h8, s->list, &s->n);
  }
  if (s->res) {
    m->be->to_host(m->be, s->res, residual_of(o), (size_t)m->n_params * sizeof(float));
    add_section(m, o, NULL, residual_prefix, s->res, 1, s->list, &s->n);
  }
  CHECK(s->n <= s->cap, "checkpoint list: %d entries, room for %d", s->n, s->cap);
  s->meta = (ckpt_meta){.step = step, .samples_seen = samples_seen, .seed = c->train.seed, .config_yaml = s->yaml};
}

int run_ckpt_save(const cfg *c, model *m, opt_state *o, int64_t step, int64_t samples_seen,
                  const ckpt_faults *faults, char *err, size_t n_err) {
  run_ckpt_snapshot *s = snapshot_alloc(c, m, o, NULL);
  snapshot_take(s, c, m, o, step, samples_seen);
  int rc = ckpt_save(c->checkpoint.dir, o->g->world->mpi, s->list, s->n, &s->meta, c->checkpoint.keep, faults, err,
                     n_err);
  snapshot_free(s);
  return rc;
}

// Collective: the pinned snapshot, allocated at the first asynchronous checkpoint. 0, or -1 with
// a message on every rank where any rank's backend refused the memory.
static int async_snapshot_alloc(run_ckpt_async *a, const cfg *c, model *m, opt_state *o, char *err, size_t n_err) {
  if (a->snap) return 0;
  a->snap = snapshot_alloc(c, m, o, m->be);
  char msg[512] = "";
  if (!a->snap)
    snprintf(msg, sizeof msg, "cannot pin %.2f GiB of host memory for the snapshot of checkpoint.async: set "
             "checkpoint.async=false, or run fewer ranks per node",
             (3.0 * (double)section_elems(m, o) + (residual_of(o) ? (double)m->n_params : 0.0)) * sizeof(float) /
                 1073741824.0);
  int rc = ckpt_agree(o->g->world->mpi, a->snap ? 0 : -1, msg, (int)sizeof msg);
  snprintf(err, n_err, "%s", msg);
  return rc;
}

int run_ckpt_async_start(run_ckpt_async *a, const cfg *c, model *m, opt_state *o, int64_t step,
                         int64_t samples_seen, const ckpt_faults *faults, char *err, size_t n_err) {
  if (async_snapshot_alloc(a, c, m, o, err, n_err) != 0) return -1;
  snapshot_take(a->snap, c, m, o, step, samples_seen);
  return ckpt_async_start(&a->write, c->checkpoint.dir, o->g->world->mpi, a->snap->list, a->snap->n, &a->snap->meta,
                          c->checkpoint.keep, faults, err, n_err);
}

void run_ckpt_async_free(run_ckpt_async *a) {
  CHECK(!ckpt_async_pending(&a->write), "run_ckpt_async_free: the checkpoint of step %lld is still being written",
        (long long)a->write.step);
  if (a->snap) snapshot_free(a->snap);
  a->snap = NULL;
}

// What extra state the checkpoint at path holds, from its stored config, read once: FP8
// scaling state (*has_fp8: train.precision fp8), the LM head's FP8 state (*has_head:
// fp8.head), and error feedback's residual (*res_dp: the dp it was written with; 0 = none). All
// 0 for a stored config this build does not read. 0, or ckpt_load's error.
static int ckpt_extra_state(const char *path, MPI_Comm world, int *has_fp8, int *has_head, int *res_dp, char *err,
                            size_t n_err) {
  ckpt_meta meta = {0};
  int rc = ckpt_load(path, world, NULL, 0, &meta, err, n_err);
  if (rc != 0) return rc;
  cfg stored;
  char msg[256];
  *has_fp8 = *has_head = *res_dp = 0;
  if (meta.config_yaml && cfg_load_string(&stored, meta.config_yaml, path, msg, sizeof msg) == 0) {
    *has_fp8 = stored.train.precision == CFG_PRECISION_FP8;
    *has_head = *has_fp8 && stored.fp8.head;
    if (cfg_validate(&stored, 0, msg, sizeof msg) == 0 && grad_compress_on(&stored.optim, stored.parallel.dp) &&
        stored.optim.grad_error_feedback)
      *res_dp = stored.parallel.dp;
  }
  free((void *)meta.config_yaml);
  return 0;
}

// One line on rank 0 where the checkpoint's residual is not carried into this run.
static void residual_notice(const char *path, const model *m, const opt_state *o, int res_dp) {
  if (!is_root(m) || !res_dp || (residual_of(o) && res_dp == m->dp)) return;
  if (residual_of(o))
    printf("note: checkpoint %s holds the gradient-compression residual of dp %d; this run has dp %d, so the "
           "residual starts at zero (docs/compression.md)\n", path, res_dp, m->dp);
  else
    printf("note: checkpoint %s holds a gradient-compression residual; this run keeps none (dp 1, "
           "parallel.grad_compress none or parallel.grad_error_feedback off), so it is dropped\n", path);
}

// One line on rank 0 where the checkpoint's precision and the run's differ in FP8 state.
static void fp8_notice(const char *path, const model *m, int has, int has_head) {
  if (is_root(m) && has && m->fp8 && has_head != m->fp8->cfg.head)
    printf("note: checkpoint %s %s: the LM head's FP8 scales %s\n", path,
           has_head ? "holds the LM head's FP8 scaling state and this run has fp8.head=false"
                    : "has no FP8 scaling state of the LM head (fp8.head was false)",
           has_head ? "are dropped" : "start at 1 with an empty amax history");
  if (!is_root(m) || has == (m->fp8 != NULL)) return;
  if (has)
    printf("note: checkpoint %s holds FP8 scaling state; this run is not FP8 (train.precision), so it is "
           "dropped\n", path);
  else
    printf("note: checkpoint %s has no FP8 scaling state (not trained in FP8): the FP8 scales start at 1 with "
           "an empty amax history\n", path);
}

// Each step advances the data position by the global batch, so samples_seen is step times the
// train.global_batch stored with the checkpoint unless the batch changed during the run (legal)
// or the file is damaged: one line on rank 0 either way.
static void position_notice(const char *path, const model *m, const ckpt_meta *meta) {
  const char *at = meta->config_yaml ? strstr(meta->config_yaml, "\n  global_batch: ") : NULL;
  long long batch = 0;
  if (!is_root(m) || !at || sscanf(at, "\n  global_batch: %lld", &batch) != 1 || batch <= 0) return;
  if (meta->samples_seen % batch == 0 && meta->samples_seen / batch == meta->step) return;
  printf("note: checkpoint %s: samples_seen = %lld is not step %lld times its train.global_batch %lld: the global "
         "batch changed during the run, or the file is damaged (build/ckpt_verify checks it)\n",
         path, (long long)meta->samples_seen, (long long)meta->step, batch);
}

int run_ckpt_load(const char *path, const cfg *c, model *m, opt_state *o, int64_t *step, int64_t *samples_seen,
                  char *err, size_t n_err) {
  int has_fp8 = 0, has_head = 0, res_dp = 0;
  int rc = ckpt_extra_state(path, o->g->world->mpi, &has_fp8, &has_head, &res_dp, err, n_err);
  if (rc != 0) return rc;
  float *host[3];
  ckpt_shards sh;
  shards_init(&sh, m, o);
  alloc_host(section_elems(m, o), host);
  int n = 0;
  ckpt_tensor *list = build_list(m, o, &sh, host, extra_entries(m), &n);
  fp8_host h8 = {0};
  if (m->fp8 && has_fp8) {
    fp8_host_alloc(m, &h8);
    fp8_list(m, &h8, list, &n);
    if (has_head && m->fp8->cfg.head) fp8_head_list(m, &h8, list, &n);
  }
  float *res = NULL;
  if (residual_of(o) && res_dp == m->dp) {
    res = host_floats(m->n_params);
    add_section(m, o, NULL, residual_prefix, res, 1, list, &n);
  }
  ckpt_meta meta = {0};
  rc = ckpt_load(path, o->g->world->mpi, list, n, &meta, err, n_err);
  if (rc == 0) {
    if (sh.n_blocks) {
      opt_set_shard(o, host[0], host[1], host[2]);
    } else {
      opt_set_params(o, host[0]);
      opt_set_moments(o, host[1], host[2]);
    }
    *step = meta.step;
    *samples_seen = meta.samples_seen;
    if (h8.scale) fp8_from_host(m, &h8, meta.step);
    fp8_notice(path, m, has_fp8, has_head);
    if (res) {
      m->be->from_host(m->be, residual_of(o), res, (size_t)m->n_params * sizeof(float));
      m->be->sync(m->be);  // res is freed next
    }
    residual_notice(path, m, o, res_dp);
    position_notice(path, m, &meta);
    if (meta.seed != c->train.seed && is_root(m))
      fprintf(stderr, "warning: checkpoint %s was trained with train.seed %llu, the config says %llu\n", path,
              (unsigned long long)meta.seed, (unsigned long long)c->train.seed);
  }
  free((void *)meta.config_yaml);
  free(list);
  free(res);
  fp8_host_free(&h8);
  shards_free(&sh);
  for (int s = 0; s < 3; s++) free(host[s]);
  return rc;
}

int run_hf_load(const char *dir, const cfg *c, opt_state *o, char *err, size_t n_err) {
  model *m = o->m;
  char msg[1536] = "";
  // Every rank reads the small files and its own blocks itself (a file system all ranks share,
  // as for checkpoints); the checks see the whole model, so ranks fail alike.
  hf_dir h = {0};
  int rc = hf_check_config(dir, &c->model, msg, sizeof msg);
  if (rc == 0) rc = hf_dir_open(&h, dir, msg, sizeof msg);
  float *host = host_floats(m->n_params);
  if (rc == 0) rc = hf_read_model(&h, m, host, msg, sizeof msg);
  hf_dir_close(&h);
  rc = ckpt_agree(o->g->world->mpi, rc, msg, (int)sizeof msg);
  if (rc == 0) opt_set_params(o, host);
  free(host);
  snprintf(err, n_err, "%s", rc == 0 ? "" : msg);
  return rc;
}
