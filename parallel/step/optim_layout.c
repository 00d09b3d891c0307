// The distributed optimizer's layout (see optim.h): the DP buckets, each rank's part of each
// bucket (its shard), the update and norm ranges and pieces, the gathers and scatters of
// shards that checkpoints use, and the placing of weights into the master.
#include <string.h>

#include "kernels/base/check.h"
#include "parallel/step/optim.h"
#include "parallel/step/weight_shard.h"

// Buckets of bucket_elem (a multiple of parts * 128) from the end of the flat buffer (backward
// fills it from the end), each with the tensors it overlaps. Each bucket is cut into `parts`
// equal parts (dp with ZeRO, otherwise 1): part r of bucket [lo, hi) is flat [lo + r * len,
// + len), and this rank's shard is its part of every bucket, in flat order (at shard_off).
// With the gradients sharded (model.grads_in_optimizer) a bucket is one group of tensors instead
// (a layer, the head, the embedding: grad_shard.h), which the model starts at a multiple of
// dp * 128; the last one ends at n_params.
static int opt_cut_buckets(opt_state *o) {
  model *m = o->m;
  const int64_t unit = (int64_t)o->parts * 128;  // n_params is a multiple of dp * 128
  o->bucket_elem = (o->bucket_elem + unit - 1) / unit * unit;
  int n = (int)((m->n_params + o->bucket_elem - 1) / o->bucket_elem);
  if (m->grads_in_optimizer) {
    n = 0;
    for (int i = 0; i < m->n_tensors; i++) n += model_group_starts(m, i);
  }
  o->buckets = XCALLOC(n ? n : 1, sizeof(opt_bucket));
  int b = 0;
  if (m->grads_in_optimizer) {
    int64_t end = m->n_params;
    for (int i = m->n_tensors - 1; i >= 0; i--) {
      if (!model_group_starts(m, i)) continue;
      const model_tensor *t = &m->tensors[i];
      o->buckets[b++] = (opt_bucket){.lo = t->offset, .hi = end, .group = opt_group(t->chunk, model_tensor_group(m, t))};
      end = t->offset;
    }
  } else {
    for (int64_t end = m->n_params; end > 0; end -= o->bucket_elem, b++)
      o->buckets[b] = (opt_bucket){.lo = end - o->bucket_elem < 0 ? 0 : end - o->bucket_elem, .hi = end, .group = -1};
  }
  return n;
}

static void opt_build_buckets(opt_state *o) {
  model *m = o->m;
  o->n_buckets = opt_cut_buckets(o);
  for (int b = 0; b < o->n_buckets; b++) {
    opt_bucket *k = &o->buckets[b];
    k->len = (k->hi - k->lo) / o->parts;
    k->t_lo = m->n_tensors;
    k->t_hi = 0;
    for (int i = 0; i < m->n_tensors; i++) {
      const model_tensor *t = &m->tensors[i];
      if (t->offset < k->hi && t->offset + t->n_elem > k->lo) {
        if (i < k->t_lo) k->t_lo = i;
        k->t_hi = i + 1;
      }
    }
    if (k->t_hi < k->t_lo) k->t_lo = k->t_hi = 0;  // padding only
  }
  int64_t off = 0;
  for (int i = o->n_buckets - 1; i >= 0; i--) {  // the last bucket is the lowest
    o->buckets[i].shard_off = off;
    off += o->buckets[i].len;
  }
}

int64_t opt_part_lo(const opt_state *o, const opt_bucket *k) { return k->lo + o->part_rank * k->len; }

int opt_bucket_of_group(const opt_state *o, int grp) {
  for (int b = 0; b < o->n_buckets; b++)
    if (o->buckets[b].group == grp) return b;
  CHECK(0, "parallel.shard: the model named group %d, which no bucket is", grp);
  return -1;
}

void *opt_part_pc(const opt_state *o, const opt_bucket *k) {
  if (o->ws) return weight_shard_part(o, k);
  return (char *)o->m->params_c + opt_part_lo(o, k) * (int64_t)o->m->act_bytes;
}

// Each tensor's piece in each of this rank's bucket parts, in flat order: offset in the shard,
// p_offset in the flat buffer. All of them are updated; those this rank counts are in the
// gradient norm. Each element is counted once over the world: tp-replicated tensors by tp rank
// 0 only, without ZeRO (every dp replica holds all gradients) by dp rank 0 only, and with shard
// groups by the first group only. The buckets
// are split into n_pieces runs in flat order: piece k's update ranges are upd_ranges[
// piece_first[k] .. piece_first[k + 1]), its buckets (counted from the lowest, as in bucket_lo
// and bucket_len) piece_bucket[k] .. piece_bucket[k + 1]. The norms (tp-replicated tensors) are
// packed one after the other in norm_pack (see opt_share_norms): norm_all lists them, norm_own
// the elements of them this rank updates, with offset in the pack and p_offset flat.
static void opt_build_ranges(opt_state *o) {
  const model *m = o->m;
  int cap = 1;
  for (int b = 0; b < o->n_buckets; b++) cap += o->buckets[b].t_hi - o->buckets[b].t_lo;
  o->norm_ranges = XCALLOC(cap, sizeof(k_range));
  o->upd_ranges = XCALLOC(cap, sizeof(k_range));
  o->norm_own = XCALLOC(cap, sizeof(k_range));
  o->piece_first = XCALLOC(o->n_pieces + 1, sizeof(int));
  o->piece_bucket = XCALLOC(o->n_pieces + 1, sizeof(int));
  o->bucket_lo = XCALLOC(o->n_buckets + 1, sizeof(int64_t));
  o->bucket_len = XCALLOC(o->n_buckets + 1, sizeof(int64_t));
  o->norm_all = XCALLOC(m->n_tensors, sizeof(k_range));
  int64_t *pack_at = XCALLOC(m->n_tensors, sizeof(int64_t));
  for (int i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    if (!t->tp_replicated) continue;
    pack_at[i] = o->norm_pack_n;
    o->norm_all[o->n_norm_all++] = (k_range){o->norm_pack_n, t->n_elem, 0, t->offset};
    o->norm_pack_n += t->n_elem;
  }
  int piece = 0;
  for (int asc = 0; asc < o->n_buckets; asc++) {
    const opt_bucket *k = &o->buckets[o->n_buckets - 1 - asc];
    for (int want = (int)((int64_t)asc * o->n_pieces / o->n_buckets); piece < want;) {
      piece++;
      o->piece_first[piece] = o->n_upd_ranges;
      o->piece_bucket[piece] = asc;
    }
    o->bucket_lo[asc] = k->lo;
    o->bucket_len[asc] = k->len;
    const int64_t plo = opt_part_lo(o, k), phi = plo + k->len;
    for (int i = k->t_lo; i < k->t_hi; i++) {
      const model_tensor *t = &m->tensors[i];
      int64_t lo = t->offset > plo ? t->offset : plo;
      int64_t hi = t->offset + t->n_elem < phi ? t->offset + t->n_elem : phi;
      if (hi <= lo) continue;
      k_range r = {k->shard_off + (lo - plo), hi - lo, model_specs[t->kind].decay, lo};
      o->upd_ranges[o->n_upd_ranges++] = r;
      if ((!t->tp_replicated || m->tp_rank == 0) && (o->zero ? !o->replica || o->replica->rank == 0 : m->dp_rank == 0))
        o->norm_ranges[o->n_norm_ranges++] = r;
      if (t->tp_replicated) o->norm_own[o->n_norm_own++] = (k_range){pack_at[i] + (lo - t->offset), hi - lo, 0, lo};
    }
  }
  while (piece < o->n_pieces) {
    piece++;
    o->piece_first[piece] = o->n_upd_ranges;
    o->piece_bucket[piece] = o->n_buckets;
  }
  free(pack_at);
}

void opt_layout_build(opt_state *o) {
  opt_build_buckets(o);
  opt_build_ranges(o);
}

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

// This rank's shard of a moment (opt_moment_to_host), whole into host memory in flat order.
static void gather_moment(opt_state *o, int which, float *host) {
  if (!o->zero) {
    opt_moment_to_host(o, which, host);  // the shard is the flat buffer
    return;
  }
  float *mine = XMALLOC((size_t)o->shard_n * sizeof(float));
  opt_moment_to_host(o, which, mine);
  gather_host(o, mine, host);
  free(mine);
}

void opt_get_params(opt_state *o, float *params_host) {
  opt_update_join(o);  // an update on the side stream is part of the state
  model *m = o->m;
  k_backend *be = m->be;
  if (!o->zero && !m->master_in_optimizer) {
    be->to_host(be, params_host, m->params, (size_t)m->n_params * sizeof(float));
    return;
  }
  // This rank's part of every bucket; without ZeRO that is the whole flat buffer.
  float *mine = o->zero ? XMALLOC((size_t)o->shard_n * sizeof(float)) : params_host;
  if (m->master_in_optimizer) opt_offload_params_to_host(o, mine);
  for (int b = 0; !m->master_in_optimizer && b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    be->to_host(be, mine + k->shard_off, m->params + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  if (!o->zero) return;
  gather_host(o, mine, params_host);
  free(mine);
}

void opt_get_moments(opt_state *o, float *exp_avg_host, float *exp_avg_sq_host) {
  opt_update_join(o);  // an update on the side stream is part of the state
  gather_moment(o, 0, exp_avg_host);
  gather_moment(o, 1, exp_avg_sq_host);
}

// This rank's shard of a whole flat host array of a moment, into the optimizer's state.
static void scatter_moment(opt_state *o, int which, const float *host) {
  if (!o->zero) {
    opt_moment_from_host(o, which, host);
    return;
  }
  float *tmp = XMALLOC((size_t)o->shard_n * sizeof(float));
  for (int b = 0; b < o->n_buckets; b++) {
    const opt_bucket *k = &o->buckets[b];
    memcpy(tmp + k->shard_off, host + opt_part_lo(o, k), (size_t)k->len * sizeof(float));
  }
  opt_moment_from_host(o, which, tmp);
  free(tmp);
}

void opt_set_moments(opt_state *o, const float *exp_avg_host, const float *exp_avg_sq_host) {
  opt_update_join(o);  // an update on the side stream is part of the state
  scatter_moment(o, 0, exp_avg_host);
  scatter_moment(o, 1, exp_avg_sq_host);
}

void opt_set_tensor(opt_state *o, int i, const float *block) {
  opt_update_join(o);  // an update on the side stream is part of the state
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
      opt_offload_set_master(o, r->offset, block + (r->p_offset - t->offset), r->n_elem);
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
