// The FP8 weight gather (see param_gather.h): which buckets travel as codes, the spans of FP8
// weights each rank casts, and the gathers.
#include "parallel/step/param_gather.h"
#include "kernels/base/check.h"
#include "model/fp8.h"
#include <stdint.h>

// Whether tensor i holds nothing that is read in the act dtype: a norm (forward reads the fp32
// master, which opt_share_norms shares) or a part of an FP8 weight that only the FP8 GEMMs read.
static int pg_tensor_codes_only(const model *m, int i) {
  const model_tensor *t = &m->tensors[i];
  if (t->tp_replicated) return 1;
  const model_fp8 *f = m->fp8;
  for (int w = 0; w < f->n_weights; w++) {
    const model_fp8_weight *x = &f->weights[w];
    if (!x->act_read && t->offset >= x->offset && t->offset + t->n_elem <= x->offset + x->n_elem) return 1;
  }
  return 0;
}

// Whether bucket k travels as codes: it holds an FP8 weight's elements and nothing read in the
// act dtype (padding aside).
static int pg_bucket_codes(const model *m, const opt_bucket *k) {
  int any_weight = 0;
  for (int i = k->t_lo; i < k->t_hi; i++) {
    if (!pg_tensor_codes_only(m, i)) return 0;
    any_weight |= !m->tensors[i].tp_replicated;
  }
  return any_weight;
}

// Appends the parts of the FP8 weights inside flat elements [a, b) as spans counted from lo.
static void pg_add_spans(const model_fp8 *f, int64_t a, int64_t b, int64_t lo, k_span *out, int *n) {
  for (int w = 0; w < f->n_weights; w++) {
    const model_fp8_weight *x = &f->weights[w];
    const int64_t s = x->offset > a ? x->offset : a, e = x->offset + x->n_elem < b ? x->offset + x->n_elem : b;
    if (e > s) out[(*n)++] = (k_span){s - lo, e - s, x->tensor};
  }
}

// The buckets' formats and regions, the codes buffer's extent [lo, *hi) and the bytes per step.
static void pg_classify(param_gather *pg, const opt_state *o, int64_t *hi) {
  const model *m = o->m;
  const model_fp8 *f = m->fp8;
  const double recv = o->parts - 1, act_bytes = (double)m->act_bytes;
  int64_t lo = INT64_MAX;
  *hi = 0;
  for (int w = 0; w < f->n_weights; w++) {
    if (f->weights[w].offset < lo) lo = f->weights[w].offset;
    if (f->weights[w].offset + f->weights[w].n_elem > *hi) *hi = f->weights[w].offset + f->weights[w].n_elem;
  }
  for (int asc = 0; asc < o->n_buckets; asc++) {
    const opt_bucket *k = &o->buckets[o->n_buckets - 1 - asc];
    pg->act_first[asc] = pg->n_act;
    pg->bucket_codes[asc] = (char)pg_bucket_codes(m, k);
    pg->bytes_plain += recv * k->len * act_bytes;
    if (!pg->bucket_codes[asc]) {
      pg->act_at[pg->n_act] = k->lo, pg->act_len[pg->n_act++] = k->len;
      pg->bytes_act += recv * k->len * act_bytes;
      continue;
    }
    pg->code_at[pg->n_code] = k->lo, pg->code_len[pg->n_code++] = k->len;
    pg->bytes_codes += recv * k->len;
    if (k->lo < lo) lo = k->lo;
    if (k->hi > *hi) *hi = k->hi;
  }
  pg->act_first[o->n_buckets] = pg->n_act;
  pg->lo = f->n_weights ? lo / 16 * 16 : 0;  // the weights' codes stay 16-byte aligned (FP8 GEMMs)
  for (int i = 0; i < pg->n_code; i++) pg->code_at[i] -= pg->lo;
}

// The spans: this rank's part of every bucket, of the code buckets, and the act-dtype buckets.
static void pg_build_spans(param_gather *pg, const opt_state *o) {
  const model_fp8 *f = o->m->fp8;
  const int cap = o->n_buckets + f->n_weights + 1;  // two sets of disjoint ranges meet at most this often
  pg->own = XCALLOC(cap, sizeof(k_span));
  pg->own_code = XCALLOC(cap, sizeof(k_span));
  pg->rest = XCALLOC(cap, sizeof(k_span));
  for (int asc = 0; asc < o->n_buckets; asc++) {
    const opt_bucket *k = &o->buckets[o->n_buckets - 1 - asc];
    const int64_t plo = k->lo + o->part_rank * k->len;
    pg_add_spans(f, plo, plo + k->len, pg->lo, pg->own, &pg->n_own);
    if (pg->bucket_codes[asc]) pg_add_spans(f, plo, plo + k->len, pg->lo, pg->own_code, &pg->n_own_code);
    else pg_add_spans(f, k->lo, k->hi, pg->lo, pg->rest, &pg->n_rest);
  }
}

param_gather *param_gather_init(const opt_state *o) {
  model *m = o->m;
  CHECK(m->fp8->cfg.recipe != MODEL_FP8_BLOCK,
        "fp8.param_gather gathers codes of one scale per tensor: it needs fp8.recipe delayed or current");
  param_gather *pg = XCALLOC(1, sizeof *pg);
  const int nb = o->n_buckets + 1;
  pg->bucket_codes = XCALLOC(nb, 1);
  pg->act_first = XCALLOC(nb, sizeof(int));
  pg->act_at = XCALLOC(nb, sizeof(int64_t));
  pg->act_len = XCALLOC(nb, sizeof(int64_t));
  pg->code_at = XCALLOC(nb, sizeof(int64_t));
  pg->code_len = XCALLOC(nb, sizeof(int64_t));
  int64_t hi;
  pg_classify(pg, o, &hi);
  pg_build_spans(pg, o);
  if (m->fp8->n_weights) pg->codes = model_fp8_codes_flat(m, pg->lo, hi);
  return pg;
}

void param_gather_free(param_gather **pgp) {
  param_gather *pg = *pgp;
  if (!pg) return;
  void *arrays[] = {pg->bucket_codes, pg->act_first, pg->act_at, pg->act_len, pg->code_at, pg->code_len,
                    pg->own, pg->own_code, pg->rest};
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) free(arrays[i]);
  free(pg);
  *pgp = NULL;
}

void param_gather_start_act(opt_state *o, int b0, int nb) {
  const param_gather *pg = o->pg;
  const int i0 = pg->act_first[b0], n = pg->act_first[b0 + nb] - i0;
  comm *dc = grid_shard_comm(o->g);
  if (n > 0)
    dc->ops->all_gather_regions_start(dc, o->m->params_c, pg->act_at + i0, pg->act_len + i0, n, opt_act_comm(o));
}

// The compute copy from the codes buffer's first element on.
static const void *pg_compute_copy(const opt_state *o) {
  return (const char *)o->m->params_c + o->pg->lo * (int64_t)o->m->act_bytes;
}

void param_gather_start_codes(opt_state *o) {
  const param_gather *pg = o->pg;
  model *m = o->m;
  k_backend *be = m->be;
  model_fp8 *f = m->fp8;
  be->fp8_cast_spans(be, pg_compute_copy(o), pg->own, pg->n_own, NULL, K_E4M3, NULL, f->w_amax);
  model_fp8_scale_weights(m);
  be->fp8_cast_spans(be, pg_compute_copy(o), pg->own_code, pg->n_own_code, f->w_scale, K_E4M3, pg->codes, NULL);
  comm *dc = grid_shard_comm(o->g);
  if (pg->n_code > 0) dc->ops->all_gather_regions_start(dc, pg->codes, pg->code_at, pg->code_len, pg->n_code, COMM_I8);
}

void param_gather_finish(opt_state *o) {
  const param_gather *pg = o->pg;
  model *m = o->m;
  m->be->fp8_cast_spans(m->be, pg_compute_copy(o), pg->rest, pg->n_rest, m->fp8->w_scale, K_E4M3, pg->codes, NULL);
  model_fp8_codes_ready(m);
}
