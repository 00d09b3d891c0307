// The distributed optimizer's layout (optim_core.h): the DP buckets, each rank's part of each
// bucket (its shard), the update and norm ranges and pieces, and each part's own ranges where the
// optimizer holds the master weights.
#include <stdlib.h>

#include "kernels/base/check.h"
#include "parallel/step/optim_core.h"

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
  const int64_t act_bytes = (int64_t)o->m->act_bytes;
  if (!o->m->weights_in_optimizer) return (char *)o->m->params_c + opt_part_lo(o, k) * act_bytes;
  return o->part_pc ? (char *)o->part_pc + k->shard_off * act_bytes : NULL;
}

// Room for the range lists: one range per tensor a bucket overlaps (a tensor cut by bucket
// boundaries counts in each), and one spare.
static int opt_ranges_cap(const opt_state *o) {
  int cap = 1;
  for (int b = 0; b < o->n_buckets; b++) cap += o->buckets[b].t_hi - o->buckets[b].t_lo;
  return cap;
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
  const int cap = opt_ranges_cap(o);
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


// Every bucket's update ranges, bucket by bucket, with offset and p_offset counted from the
// start of the bucket's part (the two agree: a part is contiguous in the shard and flat); and
// the norm elements of every part: offset in the shard, p_offset in m->norm_copy (each norm
// tensor's t->p points there).
static void opt_build_part_ranges(opt_state *o) {
  const model *m = o->m;
  const int cap = opt_ranges_cap(o);
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

void opt_layout_build(opt_state *o) {
  opt_build_buckets(o);
  opt_build_ranges(o);
  if (o->m->master_in_optimizer) opt_build_part_ranges(o);
}

void opt_layout_free(opt_state *o) {
  void *arrays[] = {o->norm_ranges, o->upd_ranges, o->piece_first, o->piece_bucket, o->bucket_lo, o->bucket_len,
                    o->norm_own, o->norm_all, o->part_ranges, o->part_first, o->master_norms, o->buckets};
  for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) free(arrays[i]);
}
