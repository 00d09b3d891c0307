// Forward and backward of one pipeline chunk for one micro-batch: embedding (first virtual
// stage), transformer blocks, final norm, LM head and vocab-parallel cross-entropy (last
// virtual stage). Tensor/sequence parallelism enters only through the region pairs of
// model/model_comm.h.
// Shapes: rs = rows of the residual stream on this rank, rows = T*B inside tp regions,
// qd = local heads * hd, kvd = local kv heads * hd, qkvd = qd + 2 kvd, ffn and V local.
// Q, K, V come from one GEMM over the layer's contiguous wq|wk|wv rows, gate and up from one over
// w_gate|w_up; attention and RoPE read the fused output in place, sequence-major, through a row
// stride. Where a region call is a plain copy (no SP: entering a region; one tp rank: leaving
// it) the copy is skipped: the norm writes the GEMM operand directly, the output projection adds
// into the residual stream (GEMM beta = 1), gradients are cast or normed from where they are.
#include "kernels/base/check.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/fp8.h"
#include <math.h>
#include <string.h>

// fp32 buffers are float *; act-dtype buffers (the backend's activation dtype) are void *.
struct model_work {
  void *block;                 // the single allocation the buffers below live in
  float *reduce_scratch;       // (rs, d) fp32: the tp reductions' scratch
  float *f1, *f2;              // (rows, d) fp32: what crosses tp collectives
  void *fa;                    // (rows, d) act: f1 cast for a GEMM
  int fa_ready;                // fa already holds the act copy of the residual gradient g
  void *q1;                    // (rows, qd) act: gradient of the attention output (ff1's memory)
  void *qkv1;                  // (rows, qkvd) act: gradient of the fused q|k|v (gu1's memory)
  void *ff1;                   // (rows, ffn) act
  void *gu1;                   // (rows, 2 ffn) act: gradient of the fused gate|up
  float *ce_max, *ce_sum, *ce_tgt, *ce_gmax;  // (rows) backend memory
  double *ce_loss;             // (1) backend memory
};

struct model_acts {
  int chunk, nl;
  float *x;                    // (nl + 1, rs, d) fp32: input of each layer, then the chunk output
  float *rstd1, *rstd2;        // (nl, rs) fp32
  void *hf, *h2f;              // (nl, rows, d) act: normed inputs inside the tp region
  void *qkv;                   // (nl, T, B, qkvd) act: roped q, roped k, v of each row
  void *att;                   // (nl, T, B, nh, hd) act: attention output
  float *lse;                  // (nl, B, nh, T) fp32
  float *x2;                   // (nl, rs, d) fp32: residual after attention
  void *gu;                    // (nl, rows, 2 ffn) act: gate | up
  void *act;                   // (nl, rows, ffn) act
  float *rstd_f;               // (rs) fp32, last stage
  void *hfin;                  // (rows, d) act, last stage
  void *logits;                // (rows, V) act, last stage; gradient after backward
  float *lse_ce;               // (rows) fp32, last stage
  float *dx_in, *dx_out;       // (rs, d) fp32
  void *block;                 // the single allocation all of the above live in
};

typedef struct carve {
  char *base;
  size_t off;
  size_t act_bytes;  // element size of the activation dtype
} carve;

static void *take_bytes(carve *c, int64_t n_bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += ((size_t)n_bytes + 255) & ~(size_t)255;
  return p;
}
static float *take(carve *c, int64_t n_elem) { return take_bytes(c, n_elem * (int64_t)sizeof(float)); }
static void *take_act(carve *c, int64_t n_elem) { return take_bytes(c, n_elem * (int64_t)c->act_bytes); }

// Element i of an act-dtype array.
static inline void *at(const model *m, void *p, int64_t i) { return (char *)p + i * (int64_t)m->act_bytes; }

static void carve_work(const model_dims *dm, struct model_work *w, carve *c) {
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  int64_t qkvd = qd + 2 * kvd, ffn = dm->ffn;
  w->reduce_scratch = rs < rows ? take(c, rs * d) : NULL;  // only sequence parallelism reduces into it
  w->f1 = take(c, rows * d); w->f2 = take(c, rows * d);
  w->fa = take_act(c, rows * d);
  // layer_bwd's MLP half, then its attention half: their gradients live in turn and share memory.
  w->ff1 = w->q1 = take_act(c, rows * (ffn > qd ? ffn : qd));
  w->gu1 = w->qkv1 = take_act(c, rows * (2 * ffn > qkvd ? 2 * ffn : qkvd));
  w->ce_max = take(c, rows); w->ce_sum = take(c, rows); w->ce_tgt = take(c, rows); w->ce_gmax = take(c, rows);
  w->ce_loss = take_bytes(c, sizeof(double));
}

// The fused projections read wq|wk|wv and w_gate|w_up as one matrix each: the layout puts
// them next to each other (model_init adds them in that order); their gradients likewise.
static void check_fused_layout(const model *m) {
  for (int ci = 0; ci < m->vpp; ci++)
    for (int i = 0; i < m->chunks[ci].n_layers; i++) {
      const model_layer *ly = &m->chunks[ci].layers[i];
      CHECK(ly->wk->offset == ly->wq->offset + ly->wq->n_elem && ly->wv->offset == ly->wk->offset + ly->wk->n_elem &&
                ly->w_up->offset == ly->w_gate->offset + ly->w_gate->n_elem,
            "layer %d: wq|wk|wv or w_gate|w_up are not contiguous in the parameter buffer", ly->wq->layer);
    }
}

void model_work_init(model *m) {
  struct model_work *w = XCALLOC(1, sizeof *w);
  carve c = {.act_bytes = m->act_bytes};
  carve_work(&m->dims, w, &c);
  c.base = w->block = k_alloc_as(m->be, c.off, K_MEM_WORKSPACE);
  c.off = 0;
  carve_work(&m->dims, w, &c);
  check_fused_layout(m);
  m->work = w;
}

void model_work_free(model *m) {
  if (!m->work) return;
  m->be->free(m->be, m->work->block);
  free(m->work);
  m->work = NULL;
}

// Whether a micro-batch keeps a tensor for every layer; if not, one slot (layer 0's) serves
// every layer and backward recomputes it (model_recompute). The GEMM and attention outputs are
// dropped by full only; the cheap ones (normed inputs, SwiGLU output) by selective too.
static int kept_per_layer(model_recompute rc, int cheap) {
  return cheap ? rc == MODEL_RECOMPUTE_NONE : rc != MODEL_RECOMPUTE_FULL;
}

static void carve_acts(const model_dims *dm, int has_head, model_recompute rc, model_acts *a, carve *c) {
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, nl = a->nl;
  int64_t qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  int64_t nk = kept_per_layer(rc, 0) ? nl : 1, nc = kept_per_layer(rc, 1) ? nl : 1;
  a->x = take(c, (nl + 1) * rs * d);
  a->rstd1 = take(c, nk * rs); a->rstd2 = take(c, nk * rs);
  a->hf = take_act(c, nc * rows * d); a->h2f = take_act(c, nc * rows * d);
  a->qkv = take_act(c, nk * rows * (qd + 2 * kvd)); a->att = take_act(c, nk * rows * qd);
  a->lse = take(c, nk * dm->B * dm->nh * dm->T);
  a->x2 = take(c, nk * rs * d);
  a->gu = take_act(c, nk * rows * 2 * dm->ffn);
  a->act = take_act(c, nc * rows * dm->ffn);
  if (has_head) {
    a->rstd_f = take(c, rs);
    a->hfin = take_act(c, rows * d);
    a->logits = take_act(c, rows * dm->vocab);
    a->lse_ce = take(c, rows);
  }
  a->dx_in = take(c, rs * d);
  a->dx_out = take(c, rs * d);
}

int64_t model_work_bytes(const model_dims *dm, int act_bytes) {
  struct model_work w;
  carve c = {.act_bytes = (size_t)act_bytes};
  carve_work(dm, &w, &c);
  return (int64_t)c.off;
}

int64_t model_acts_bytes(const model_dims *dm, int n_layers, int has_head, int act_bytes, model_recompute rc) {
  model_acts a = {.nl = n_layers};
  carve c = {.act_bytes = (size_t)act_bytes};
  carve_acts(dm, has_head, rc, &a, &c);
  return (int64_t)c.off;
}

model_acts *model_acts_create(model *m, int chunk) {
  model_acts *a = XCALLOC(1, sizeof *a);
  a->chunk = chunk;
  a->nl = m->chunks[chunk].n_layers;
  int has_head = m->chunks[chunk].lm_head != NULL;
  carve c = {.act_bytes = m->act_bytes};
  carve_acts(&m->dims, has_head, m->recompute, a, &c);
  a->block = k_alloc_as(m->be, c.off, K_MEM_ACTIVATIONS);
  c.base = a->block;
  c.off = 0;
  carve_acts(&m->dims, has_head, m->recompute, a, &c);
  return a;
}

void model_acts_free(model *m, model_acts **a) {
  if (!a || !*a) return;
  m->be->free(m->be, (*a)->block);
  free(*a);
  *a = NULL;
}

float *model_acts_input(model_acts *a) { return a->x; }
float *model_acts_input_grad(model_acts *a) { return a->dx_in; }
float *model_acts_output_grad(model_acts *a) { return a->dx_out; }
static float *acts_output(const model *m, model_acts *a) { return a->x + (int64_t)a->nl * m->dims.rows_s * m->dims.d; }
float *model_acts_output(const model *m, model_acts *a) { return acts_output(m, a); }

// Layer i's slice of a micro-batch's saved activations (shapes as in model_acts); recomputed
// tensors live in slot 0 (carve_acts).
typedef struct layer_acts {
  float *x, *x2, *lse, *rstd1, *rstd2;
  void *hf, *h2f, *qkv, *att, *gu, *act;
} layer_acts;

static layer_acts layer_view(const model *m, model_acts *a, int i) {
  const model_dims *dm = &m->dims;
  int64_t rs = dm->rows_s, rows = dm->rows, d = dm->d, ffn = dm->ffn;
  int64_t qd = (int64_t)dm->nh * dm->hd, kvd = (int64_t)dm->nkv * dm->hd;
  int64_t k = kept_per_layer(m->recompute, 0) ? i : 0, c = kept_per_layer(m->recompute, 1) ? i : 0;
  return (layer_acts){
      .x = a->x + i * rs * d, .x2 = a->x2 + k * rs * d, .lse = a->lse + k * dm->B * dm->nh * dm->T,
      .rstd1 = a->rstd1 + k * rs, .rstd2 = a->rstd2 + k * rs,
      .hf = at(m, a->hf, c * rows * d), .h2f = at(m, a->h2f, c * rows * d),
      .qkv = at(m, a->qkv, k * rows * (qd + 2 * kvd)), .att = at(m, a->att, k * rows * qd),
      .gu = at(m, a->gu, k * rows * 2 * ffn), .act = at(m, a->act, c * rows * ffn)};
}

// Which region calls are plain copies: entering a region (and leaving it backward) without SP;
// leaving it (and entering backward) with one tp rank.
static int enter_is_copy(const model *m) { return !m->sp; }
static int exit_is_copy(const model *m) { return m->tp == 1; }
// The first of this rank's rows inside a region: tp_rank * rows_s with SP, else 0.
static int64_t own_row(const model *m) { return m->sp ? m->tp_rank * m->dims.rows_s : 0; }

// The region pairs and the tp reduction, through the collectives parallel/ bound (model_comm.h).
static void gather_start(const model *m, void *x, int d, k_dtype t) { m->comm.ops->gather_start(m->comm.ctx, x, d, t); }
static void gather_finish(const model *m) { m->comm.ops->gather_finish(m->comm.ctx); }
static void gather_wait_from(const model *m, int from) { m->comm.ops->gather_wait_from(m->comm.ctx, from); }
static void reduce_start(const model *m, float *y, float *y_s, int d) {
  m->comm.ops->reduce_start(m->comm.ctx, y, y_s, d);
}
static void reduce_finish(const model *m, float *y, float *y_s, int d) {
  m->comm.ops->reduce_finish(m->comm.ctx, y, y_s, d);
}
static void reduce_add_block(const model *m, void *y, float *y_s, int d, int to) {
  m->comm.ops->reduce_add_block(m->comm.ctx, y, m->reduce_type, y_s, m->work->reduce_scratch, d, to);
}
static void reduce_add_finish(const model *m, void *y, float *y_s, int d) {
  m->comm.ops->reduce_add_finish(m->comm.ctx, y, m->reduce_type, y_s, m->work->reduce_scratch, d);
}
static void tp_all_reduce(const model *m, float *x, int64_t n, model_reduce_op op) {
  m->comm.ops->tp_all_reduce(m->comm.ctx, x, n, op);
}

// C (rows, N) = A (rows, K) @ op(B) (B^T when tb) over rows [r0, r1) only; A in the act dtype.
static void gemm_rows(model *m, int64_t r0, int64_t r1, int tb, int N, int K, const void *A, const void *B, int ldb,
                      void *C, k_dtype ct) {
  if (r1 <= r0) return;
  m->be->gemm(m->be, 0, tb, (int)(r1 - r0), N, K, 1, at(m, (void *)A, r0 * K), K, B, ldb, 0,
              (char *)C + r0 * N * (int64_t)k_dtype_bytes(ct), N, ct);
}

// The other tp ranks in ring order (model_comm.h), k = 1 .. tp - 1: the k-th whose gathered rows
// arrive (tp_rank - k) and the k-th to send a reduction's block to (tp_rank + k).
static int ring_from(const model *m, int k) { return (m->tp_rank - k + m->tp) % m->tp; }
static int ring_to(const model *m, int k) { return (m->tp_rank + k) % m->tp; }

// Walking a gathered region (SP) in arrival order, k = 0 .. tp - 1: the first row of the k-th
// rank's rows (k 0: this rank's own, there from the start; then tp_rank - 1, ...), waited for
// first, so the work queued next may read them.
static int64_t gathered_rows(const model *m, int k) {
  if (k) gather_wait_from(m, ring_from(m, k));
  return ring_from(m, k) * m->dims.rows_s;
}

// The same over every row of A, whose gather into the region gather_start began: this rank's
// rows while the other ranks' rows arrive, then each rank's as they arrive (SP).
static void gemm_gathered(model *m, int tb, int N, int K, const void *A, const void *B, int ldb, void *C, k_dtype ct) {
  if (enter_is_copy(m)) {
    gather_finish(m);
    gemm_rows(m, 0, m->dims.rows, tb, N, K, A, B, ldb, C, ct);
    return;
  }
  for (int k = 0; k < m->tp; k++) {
    const int64_t r0 = gathered_rows(m, k);
    gemm_rows(m, r0, r0 + m->dims.rows_s, tb, N, K, A, B, ldb, C, ct);
  }
}

// The block's projections (weights wq|wk|wv, wo, w_gate|w_up, w_down), each in FP8 where
// train.precision=fp8 puts its layer (model/fp8.h), else in the act dtype.
static int fp8_on(const model *m, const model_layer *ly) { return model_fp8_layer_on(m, ly->wq->layer); }

// Whether ly's norm output hn, the input of projection p, holds its FP8 codes (rows, d bytes)
// instead of its values: where its scale is known before hn is made (model_fp8_fused_casts).
// With SP each rank makes its own rows' codes and the codes are gathered.
static int hn_is_codes(const model *m, const model_layer *ly) {
  return ly && fp8_on(m, ly) && model_fp8_fused_casts(m);
}

// FP8 codes (rows, d bytes) gathered into the region: moved as bf16 pairs (d is even).
static void gather_codes_start(const model *m, uint8_t *codes, int d) { gather_start(m, codes, d / 2, K_BF16); }

// Whether the residual gradient leaving a region into ly's projections is gathered as its FP8
// codes (SP, the gradient's scale known before the cast): each rank casts its own rows, the codes
// cross (half the bytes of the act dtype) and the data gradient starts on this rank's rows.
static int grad_gathers_codes(const model *m, const model_layer *ly) {
  return !enter_is_copy(m) && fp8_on(m, ly) && model_fp8_fused_casts(m);
}

// hn (rows, d) act = norm(x) inside the region; rstd (rs) saved. The norm writes this rank's
// rows, already in the GEMM's dtype, and their gather starts (SP); gemm_gathered or
// gather_finish completes it. With ly, hn is the input of ly's projection p: where
// hn_is_codes, the norm writes hn's FP8 codes (into hn's memory) and amax instead, a pass over
// hn fewer; the projection's GEMMs read only the codes, its weight gradient their transpose.
static void norm_enter_start(model *m, const model_layer *ly, int p, const float *x, const float *w, float *rstd,
                             void *hn) {
  const model_dims *dm = &m->dims;
  const float *scale;
  uint8_t *codes;
  float *amax;
  if (hn_is_codes(m, ly) && model_fp8_fused_cast(m, ly->fp8, p, hn, &scale, &codes, &amax)) {
    m->be->rmsnorm_fwd_fp8(m->be, x, w, NULL, rstd, dm->rows_s, dm->d, m->cfg.norm_eps, scale,
                           codes + own_row(m) * dm->d, amax);
    if (!enter_is_copy(m)) gather_codes_start(m, codes, dm->d);
    return;
  }
  m->be->rmsnorm_fwd_act(m->be, x, w, at(m, hn, own_row(m) * dm->d), rstd, dm->rows_s, dm->d, m->cfg.norm_eps);
  gather_start(m, hn, dm->d, m->be->act);
}

// The same, complete; where hn_is_codes no GEMM follows (the recomputation before backward), so
// the made codes are taken here.
static void norm_enter(model *m, const model_layer *ly, int p, const float *x, const float *w, float *rstd, void *hn) {
  norm_enter_start(m, ly, p, x, w, rstd, hn);
  gather_finish(m);
  if (hn_is_codes(m, ly)) model_fp8_cast_input(m, ly->fp8, p, NULL, m->dims.rows, m->dims.d);  // made: taken
}

// c (r1 - r0, N) = rows [r0, r1) of a (rows, K) times w^T, into ct with beta 0 or 1. In FP8 the
// whole of a was cast by model_fp8_cast_input first.
static void proj_rows(model *m, const model_layer *ly, const model_tensor *w, int p, int64_t r0, int64_t r1, int N,
                      int K, const void *a, void *c, k_dtype ct, float beta) {
  if (r1 <= r0) return;
  if (fp8_on(m, ly)) {
    model_fp8_fwd_rows(m, ly->fp8, p, r0, r1, N, K, NULL, c, ct, beta);
    return;
  }
  m->be->gemm(m->be, 0, 1, (int)(r1 - r0), N, K, 1, at(m, (void *)a, r0 * K), K, w->pc, K, beta, c, N, ct);
}

// y (rows, N) = x (rows, K) w^T, x gathered into the region by gather_start: this rank's rows
// while the other ranks' rows arrive, then those. In FP8 each range is cast just before its GEMM
// where the casts can go by rows (model_fp8_input_by_rows; the same codes), else the gather
// completes first and the whole input is cast at once.
static void proj_fwd_gathered(model *m, const model_layer *ly, const model_tensor *w, int p, int N, int K,
                              const void *x, void *y, k_dtype ct) {
  if (!fp8_on(m, ly)) {
    gemm_gathered(m, 1, N, K, x, w->pc, K, y, ct);
    return;
  }
  const int64_t rows = m->dims.rows;
  if (enter_is_copy(m) || !model_fp8_input_by_rows(m)) {
    gather_finish(m);
    model_fp8_cast_input(m, ly->fp8, p, x, rows, K);
    proj_rows(m, ly, w, p, 0, rows, N, K, x, y, ct, 0);
    return;
  }
  const int64_t rs = m->dims.rows_s;
  const int codes = hn_is_codes(m, ly);  // made by the norm, gathered: no cast
  if (codes) model_fp8_cast_input(m, ly->fp8, p, NULL, rows, K);  // made: taken
  for (int k = 0; k < m->tp; k++) {  // this rank's rows, then each rank's as they arrive
    const int64_t r0 = gathered_rows(m, k);
    if (!codes) model_fp8_cast_input_rows(m, ly->fp8, p, x, r0, r0 + rs, K);
    proj_rows(m, ly, w, p, r0, r0 + rs, N, K, x, (char *)y + r0 * N * k_dtype_bytes(ct), ct, 0);
  }
}

// Rows [r0, r1) of the data gradient dx (rows, K) = g (rows, N) w, w (N, K), into those rows of
// dx, in ct. In FP8 from g's codes, cast (model_fp8_cast_grad) before.
static void dgrad_rows(model *m, const model_layer *ly, const model_tensor *w, int p, int64_t r0, int64_t r1, int N,
                       int K, const void *g, void *dx, k_dtype ct) {
  if (fp8_on(m, ly)) model_fp8_dgrad(m, ly->fp8, p, r0, r1, N, K, dx, ct);
  else gemm_rows(m, r0, r1, 0, K, N, g, w->pc, K, dx, ct);
}

// Data gradient dx (rows, K) = g (rows, N) w, w (N, K). In FP8 g is cast (with its transpose,
// for proj_wgrad next), unless the op that made g made its codes too (g NULL then).
static void proj_dgrad(model *m, const model_layer *ly, const model_tensor *w, int p, int N, int K, const void *g,
                       void *dx, k_dtype ct) {
  if (fp8_on(m, ly)) model_fp8_cast_grad(m, ly->fp8, p, g, m->dims.rows, N);
  dgrad_rows(m, ly, w, p, 0, m->dims.rows, N, K, g, dx, ct);
}

// The same with g gathered into the region by grad_exit_start: the GEMM starts on this rank's
// rows while the others arrive; in FP8 where grad_gathers_codes, g's codes were cast by rows and
// gathered, and their transpose is made once every row is there; else, in FP8, the gather
// completes before the cast.
static void proj_dgrad_gathered(model *m, const model_layer *ly, const model_tensor *w, int p, int N, int K,
                                const void *g, void *dx, k_dtype ct) {
  if (!fp8_on(m, ly)) {
    gemm_gathered(m, 0, K, N, g, w->pc, K, dx, ct);
    return;
  }
  if (!grad_gathers_codes(m, ly)) {
    gather_finish(m);
    proj_dgrad(m, ly, w, p, N, K, g, dx, ct);
    return;
  }
  const int64_t rs = m->dims.rows_s;
  for (int k = 0; k < m->tp; k++) {  // this rank's rows, then each rank's as they arrive
    const int64_t r0 = gathered_rows(m, k);
    model_fp8_dgrad(m, ly->fp8, p, r0, r0 + rs, N, K, dx, ct);
  }
  model_fp8_grad_rows_done(m, m->dims.rows, N);
}

// Weight gradient w->g (N, K) += g^T x (= where model_grad_written), g (rows, N) the output
// gradient of the last proj_dgrad (in FP8 not read: the transposed codes made there are), x
// (rows, K) the saved input (in FP8 with x_codes: its codes, as act_is_codes keeps them).
static void proj_wgrad(model *m, const model_layer *ly, model_tensor *w, int p, int N, int K, const void *g,
                       const void *x, int x_codes) {
  int64_t rows = m->dims.rows;
  const float beta = model_grad_written(m, w) ? 0.0f : 1.0f;
  if (!fp8_on(m, ly)) {
    m->be->gemm(m->be, 1, 0, N, K, (int)rows, 1, g, N, x, K, beta, w->g, K, K_F32);
    return;
  }
  model_fp8_wgrad(m, ly->fp8, p, x_codes ? NULL : x, x_codes ? x : NULL, rows, N, K, beta, w->g);
}

// xout (rs, d) = xin + a (rows, K) @ w^T, w (d, K) row-parallel. With SP the other ranks' rows
// go first (in m->reduce_type: parallel.tp_reduce_dtype), each sent while the
// next is computed, and this rank's rows are computed with the residual in the GEMM's epilogue,
// into xout; the finish adds the other ranks' sums of this rank's rows.
static void proj_residual(model *m, const model_layer *ly, const model_tensor *w, int p, const void *a, int K,
                          const float *xin, float *xout) {
  k_backend *be = m->be;
  struct model_work *wk = m->work;
  const model_dims *dm = &m->dims;
  int d = dm->d, fp8 = fp8_on(m, ly);
  int64_t rs = dm->rows_s, rows = dm->rows, r0 = own_row(m), r1 = r0 + rs;
  if (fp8) model_fp8_cast_input(m, ly->fp8, p, a, rows, K);
  if (exit_is_copy(m)) {
    if (!fp8) be->linear_residual(be, (int)rows, d, K, a, w->pc, xin, xout);
    else model_fp8_fwd_rows(m, ly->fp8, p, 0, rows, d, K, xin, xout, K_F32, 1);  // xout = xin + a w^T
    return;
  }
  if (!m->sp) {  // all-reduced in place
    proj_rows(m, ly, w, p, 0, rows, d, K, a, wk->f1, K_F32, 0);
    reduce_start(m, wk->f1, wk->f1, d);
    reduce_finish(m, wk->f1, wk->f1, d);
    be->copy(be, xout, xin, (size_t)(rs * d) * sizeof(float));
    be->add(be, xout, wk->f1, K_F32, rs * d);
    return;
  }
  const k_dtype rt = m->reduce_type;
  for (int k = 1; k < m->tp; k++) {  // each other rank's rows, sent while the next are computed
    const int64_t t0 = ring_to(m, k) * rs;
    proj_rows(m, ly, w, p, t0, t0 + rs, d, K, a, (char *)wk->f1 + t0 * d * k_dtype_bytes(rt), rt, 0);
    reduce_add_block(m, wk->f1, xout, d, ring_to(m, k));
  }
  if (!fp8) be->linear_residual(be, (int)rs, d, K, at(m, (void *)a, r0 * K), w->pc, xin, xout);
  else model_fp8_fwd_rows(m, ly->fp8, p, r0, r1, d, K, xin, xout, K_F32, 1);
  reduce_add_finish(m, wk->f1, xout, d);
}

// The act-dtype GEMM operand (rows, d) in w->fa of the residual gradient g (rs, d) leaving a
// region into ly's projection p: this rank's rows, rounded (unless grad_enter_norm wrote them),
// and their gather starts (SP; rounding commutes with the gather), or, where
// grad_gathers_codes, the gather of their FP8 codes; proj_dgrad_gathered completes it.
static void grad_exit_start(model *m, const model_layer *ly, int p, const float *g) {
  k_backend *be = m->be;
  struct model_work *wk = m->work;
  const model_dims *dm = &m->dims;
  const int64_t r0 = own_row(m);
  if (!wk->fa_ready) be->cast(be, at(m, wk->fa, r0 * dm->d), be->act, g, K_F32, dm->rows_s * dm->d);
  wk->fa_ready = 0;
  if (enter_is_copy(m)) return;
  if (grad_gathers_codes(m, ly))
    gather_codes_start(m, model_fp8_cast_grad_rows(m, ly->fp8, p, wk->fa, r0, r0 + dm->rows_s, dm->d), dm->d);
  else
    gather_start(m, wk->fa, dm->d, be->act);
}

// Starts summing the region's input gradient dh (rows, d), partial per tp rank, into this
// rank's rows of it (in place); the weight-gradient GEMM queued next runs meanwhile.
// grad_enter_norm ends it.
static void grad_enter_start(model *m, float *dh) {
  if (!exit_is_copy(m)) reduce_start(m, dh, dh + own_row(m) * m->dims.d, m->dims.d);
}

// Whether ly's column-parallel projections (QKV, gate|up) compute their data gradient rank by
// rank's rows, each other rank's sent while the next is computed (proj_dgrad_enter): with SP,
// unless FP8 block scaling's data gradient goes over every row at once.
static int dgrad_in_blocks(const model *m, const model_layer *ly) {
  return ly && m->sp && !exit_is_copy(m) && !(fp8_on(m, ly) && !model_fp8_dgrad_by_rows(m));
}

// The region's input gradient dh (rows, d) fp32 = g (rows, N) w, w (N, K = d) column-parallel,
// and the start of its sum over tp into this rank's rows, as grad_enter_start. Where
// dgrad_in_blocks, as proj_residual: the other ranks' rows go first, in m->reduce_type, into
// w->f1, each sent while the next is computed, then this rank's rows into dh.
static void proj_dgrad_enter(model *m, const model_layer *ly, const model_tensor *w, int p, int N, int K,
                             const void *g, float *dh) {
  if (!dgrad_in_blocks(m, ly)) {
    proj_dgrad(m, ly, w, p, N, K, g, dh, K_F32);
    grad_enter_start(m, dh);
    return;
  }
  const k_dtype rt = m->reduce_type;
  const int64_t rs = m->dims.rows_s, r0 = own_row(m);
  if (fp8_on(m, ly)) model_fp8_cast_grad(m, ly->fp8, p, g, m->dims.rows, N);
  for (int k = 1; k <= m->tp; k++) {  // each other rank's rows, then this rank's (k = tp)
    const int64_t t0 = ring_to(m, k) * rs;
    void *dx = k < m->tp ? m->work->f1 : (void *)dh;
    dgrad_rows(m, ly, w, p, t0, t0 + rs, N, K, g, dx, k < m->tp ? rt : K_F32);
    if (k < m->tp) reduce_add_block(m, m->work->f1, dh + r0 * K, K, ring_to(m, k));
  }
}

// g (rs, d) += the norm's backward of dh (clobbered), after grad_enter_start, or after
// proj_dgrad_enter for ly's projection (ly NULL: the head's). The norm's backward also writes the
// cast of g that grad_exit_start would make (this rank's rows of w->fa).
static void grad_enter_norm(model *m, const model_layer *ly, float *dh, const float *x, const model_tensor *norm,
                            const float *rstd, float *g) {
  k_backend *be = m->be;
  struct model_work *wk = m->work;
  const model_dims *dm = &m->dims;
  float *dn = dh + own_row(m) * dm->d;
  if (dgrad_in_blocks(m, ly)) reduce_add_finish(m, wk->f1, dn, dm->d);
  else if (!exit_is_copy(m)) reduce_finish(m, dh, dn, dm->d);
  wk->fa_ready = 1;
  be->rmsnorm_bwd_act(be, dn, x, norm->p, rstd, g, norm->g, at(m, wk->fa, own_row(m) * dm->d), dm->rows_s, dm->d);
}

// Whether act holds the down projection's FP8 input codes (rows, ffn bytes) instead of its values:
// where its scale is known before act is made (model_fp8_fused_casts), in the whole step.
static int act_is_codes(const model *m, const model_layer *ly) { return fp8_on(m, ly) && model_fp8_fused_casts(m); }

// act = SwiGLU(gu); where act_is_codes, the op writes act's FP8 codes (into act's memory) and
// amax instead: the down projection's GEMMs read only the codes (its weight gradient their
// transpose), so act's values are never written or read again.
static void swiglu_fwd_into_down(model *m, const model_layer *ly, const layer_acts *L) {
  const float *scale;
  uint8_t *codes;
  float *amax;
  if (act_is_codes(m, ly) && model_fp8_fused_cast(m, ly->fp8, FP8_DOWN, L->act, &scale, &codes, &amax))
    m->be->swiglu_fwd_fp8(m->be, L->gu, NULL, m->dims.rows, m->dims.ffn, scale, codes, amax);
  else
    m->be->swiglu_fwd(m->be, L->gu, L->act, m->dims.rows, m->dims.ffn);
}

static void layer_fwd(model *m, model_layer *ly, model_acts *a, int i) {
  k_backend *be = m->be;
  const model_dims *dm = &m->dims;
  const k_dtype A = be->act;
  int B = dm->B, T = dm->T, d = dm->d, hd = dm->hd, nh = dm->nh, nkv = dm->nkv, ffn = dm->ffn;
  int64_t rs = dm->rows_s, qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, qkvd = qd + 2 * kvd;
  float theta = m->cfg.rope_theta;
  layer_acts L = layer_view(m, a, i);
  float *xin = L.x, *xout = xin + rs * d;
  if (fp8_on(m, ly)) model_fp8_weights_ready(m, ly->fp8);

  norm_enter_start(m, ly, FP8_QKV, xin, ly->attn_norm->p, L.rstd1, L.hf);
  proj_fwd_gathered(m, ly, ly->wq, FP8_QKV, qkvd, d, L.hf, L.qkv, A);
  be->rope(be, L.qkv, B, T, nh + nkv, hd, qkvd, 0, theta, 0);  // q and k heads are adjacent in a row
  be->attn_fwd(be, L.qkv, at(m, L.qkv, qd), at(m, L.qkv, qd + kvd), qkvd, L.att, L.lse, B, T, nh, nkv, hd);
  proj_residual(m, ly, ly->wo, FP8_O, L.att, qd, xin, L.x2);

  norm_enter_start(m, ly, FP8_UP, L.x2, ly->mlp_norm->p, L.rstd2, L.h2f);
  proj_fwd_gathered(m, ly, ly->w_gate, FP8_UP, 2 * ffn, d, L.h2f, L.gu, A);
  swiglu_fwd_into_down(m, ly, &L);
  proj_residual(m, ly, ly->w_down, FP8_DOWN, L.act, ffn, L.x2, xout);
}

// Before layer i's backward: the tensors train.recompute did not keep, from the ones it did.
// Same ops on the same inputs as layer_fwd, so the same bits. Leaves w->fa (the cast residual
// gradient of grad_enter_norm) alone.
static void layer_recompute(model *m, model_layer *ly, model_acts *a, int i) {
  if (m->recompute == MODEL_RECOMPUTE_FULL) {
    layer_fwd(m, ly, a, i);
  } else if (m->recompute == MODEL_RECOMPUTE_SELECTIVE) {
    layer_acts L = layer_view(m, a, i);
    norm_enter(m, ly, FP8_UP, L.x2, ly->mlp_norm->p, L.rstd2, L.h2f);
    swiglu_fwd_into_down(m, ly, &L);
    if (act_is_codes(m, ly)) model_fp8_cast_input(m, ly->fp8, FP8_DOWN, NULL, m->dims.rows, m->dims.ffn);  // made: taken
    norm_enter(m, ly, FP8_QKV, L.x, ly->attn_norm->p, L.rstd1, L.hf);
  }
}

// dgu = SwiGLU's backward of the down projection's data gradient (w->ff1). Where the gate|up
// projection's output-gradient scale is known before dgu is made (model_fp8_fused_grad_cast),
// the same op writes dgu's FP8 codes, transposed codes and amax instead, and dgu itself is not
// written: the FP8 data and weight gradients read only the codes. Returns dgu in the act dtype
// (w->gu1), or NULL where only its codes were made.
static const void *swiglu_bwd_into_up(model *m, const model_layer *ly, const layer_acts *L) {
  struct model_work *w = m->work;
  const float *scale;
  k_fp8 fmt;
  uint8_t *codes, *codes_t;
  float *amax;
  if (fp8_on(m, ly) && model_fp8_fused_grad_cast(m, ly->fp8, FP8_UP, &scale, &fmt, &codes, &codes_t, &amax)) {
    m->be->swiglu_bwd_fp8(m->be, w->ff1, L->gu, NULL, m->dims.rows, m->dims.ffn, scale, fmt, codes, codes_t, amax);
    return NULL;
  }
  m->be->swiglu_bwd(m->be, w->ff1, L->gu, w->gu1, m->dims.rows, m->dims.ffn);
  return w->gu1;
}

// g: (rs, d) gradient of the layer output on entry, of the layer input on exit (in place).
static void layer_bwd(model *m, model_layer *ly, model_acts *a, int i, float *g) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  const k_dtype A = be->act;
  int B = dm->B, T = dm->T, d = dm->d, hd = dm->hd, nh = dm->nh, nkv = dm->nkv, ffn = dm->ffn;
  int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, qkvd = qd + 2 * kvd;
  float theta = m->cfg.rope_theta;
  layer_acts L = layer_view(m, a, i);
  // With the weights sharded (model.weights_in_optimizer) the copies the forward made may have
  // given their bank to another layer since: remade here if so, a no-op otherwise.
  if (fp8_on(m, ly)) model_fp8_weights_ready(m, ly->fp8);

  // MLP: out = x2 + down(swiglu(gate(h2), up(h2))), h2 = norm(x2).
  grad_exit_start(m, ly, FP8_DOWN, g);
  proj_dgrad_gathered(m, ly, ly->w_down, FP8_DOWN, d, ffn, w->fa, w->ff1, A);
  proj_wgrad(m, ly, ly->w_down, FP8_DOWN, d, ffn, w->fa, L.act, act_is_codes(m, ly));
  const void *dgu = swiglu_bwd_into_up(m, ly, &L);
  proj_dgrad_enter(m, ly, ly->w_gate, FP8_UP, 2 * ffn, d, dgu, w->f2);
  proj_wgrad(m, ly, ly->w_gate, FP8_UP, 2 * ffn, d, dgu, L.h2f, hn_is_codes(m, ly));
  grad_enter_norm(m, ly, w->f2, L.x2, ly->mlp_norm, L.rstd2, g);

  // Attention: x2 = x + wo(attn(rope(q(h)), rope(k(h)), v(h))), h = norm(x).
  grad_exit_start(m, ly, FP8_O, g);
  proj_dgrad_gathered(m, ly, ly->wo, FP8_O, d, (int)qd, w->fa, w->q1, A);
  proj_wgrad(m, ly, ly->wo, FP8_O, d, (int)qd, w->fa, L.att, 0);
  be->attn_bwd(be, w->q1, L.qkv, at(m, L.qkv, qd), at(m, L.qkv, qd + kvd), qkvd, L.att, L.lse, w->qkv1,
               at(m, w->qkv1, qd), at(m, w->qkv1, qd + kvd), B, T, nh, nkv, hd);
  be->rope(be, w->qkv1, B, T, nh + nkv, hd, qkvd, 0, theta, 1);
  proj_dgrad_enter(m, ly, ly->wq, FP8_QKV, (int)qkvd, d, w->qkv1, w->f2);
  proj_wgrad(m, ly, ly->wq, FP8_QKV, (int)qkvd, d, w->qkv1, L.hf, hn_is_codes(m, ly));
  grad_enter_norm(m, ly, w->f2, L.x, ly->attn_norm, L.rstd1, g);
}

// Vocab-parallel cross-entropy: combines each rank's row max, sum of exponentials and target
// logit over tp on the device, stores the global log-sum-exp per row, returns the summed loss
// (one 8-byte read back per micro-batch).
static double ce_fwd(model *m, model_acts *a, const int32_t *targets) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  int64_t rows = dm->rows;
  be->ce_local_stats(be, a->logits, targets, rows, dm->vocab, dm->v0, w->ce_max, w->ce_sum, w->ce_tgt);
  const float *gmax = w->ce_max;
  if (m->tp > 1) {
    be->copy(be, w->ce_gmax, w->ce_max, (size_t)rows * sizeof(float));
    tp_all_reduce(m, w->ce_gmax, rows, MODEL_REDUCE_MAX);
    be->ce_rescale(be, w->ce_sum, w->ce_max, w->ce_gmax, rows);
    tp_all_reduce(m, w->ce_sum, rows, MODEL_REDUCE_SUM);
    tp_all_reduce(m, w->ce_tgt, rows, MODEL_REDUCE_SUM);
    gmax = w->ce_gmax;
  }
  be->ce_loss(be, gmax, w->ce_sum, w->ce_tgt, a->lse_ce, rows, w->ce_loss);
  double loss = 0;
  be->to_host(be, &loss, w->ce_loss, sizeof loss);
  return loss;
}

// The LM head's GEMMs, vocab-parallel (lm_head (V_local, d)): logits (rows, V_local) = hfin
// W^T; the data gradient dx (rows, d) fp32 = G W and the weight gradient W.g += G^T hfin, with G
// the logits' gradient in place. In FP8 with fp8.head (the head's slot of model/fp8.h).
static void head_fwd(model *m, const model_tensor *w, model_acts *a) {
  const model_dims *dm = &m->dims;
  int hs = model_fp8_head_slot(m);
  if (hs < 0) {
    m->be->gemm(m->be, 0, 1, dm->rows, dm->vocab, dm->d, 1, a->hfin, dm->d, w->pc, dm->d, 0, a->logits, dm->vocab,
                m->be->act);
    return;
  }
  model_fp8_weights_ready(m, hs);
  model_fp8_cast_input(m, hs, 0, a->hfin, dm->rows, dm->d);
  model_fp8_fwd_rows(m, hs, 0, 0, dm->rows, dm->vocab, dm->d, NULL, a->logits, m->be->act, 0);
}

static void head_dgrad(model *m, const model_tensor *w, model_acts *a, float *dx) {
  const model_dims *dm = &m->dims;
  int hs = model_fp8_head_slot(m);
  if (hs < 0) {
    m->be->gemm(m->be, 0, 0, dm->rows, dm->d, dm->vocab, 1, a->logits, dm->vocab, w->pc, dm->d, 0, dx, dm->d, K_F32);
    return;
  }
  model_fp8_weights_ready(m, hs);  // as in layer_bwd: a no-op unless its bank was given away
  model_fp8_cast_grad(m, hs, 0, a->logits, dm->rows, dm->vocab);
  model_fp8_dgrad(m, hs, 0, 0, dm->rows, dm->vocab, dm->d, dx, K_F32);
}

static void head_wgrad(model *m, model_tensor *w, model_acts *a) {
  const model_dims *dm = &m->dims;
  int hs = model_fp8_head_slot(m);
  if (hs < 0) {
    m->be->gemm(m->be, 1, 0, dm->vocab, dm->d, dm->rows, 1, a->logits, dm->vocab, a->hfin, dm->d, 1, w->g, dm->d,
                K_F32);
    return;
  }
  model_fp8_wgrad(m, hs, 0, a->hfin, NULL, dm->rows, dm->vocab, dm->d, 1, w->g);
}

// Before forward reads the weights of a group (m->weights_needed).
static void weights_needed(model *m, int chunk, int layer) {
  if (m->weights_needed) m->weights_needed(m->weights_needed_ctx, chunk, layer);
}

// Before backward writes the gradients of a group (m->grads_needed).
static void grads_needed(model *m, int chunk, int layer) {
  if (m->grads_needed) m->grads_needed(m->grads_needed_ctx, chunk, layer);
}

double model_chunk_fwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  model_chunk *ch = &m->chunks[chunk];
  int d = dm->d;
  if (ch->embed) {
    weights_needed(m, chunk, MODEL_GRADS_EMBED);
    if (exit_is_copy(m)) {
      be->embed_fwd(be, tokens, ch->embed->pc, a->x, dm->rows, d, dm->v0, dm->vocab);
    } else {
      be->embed_fwd(be, tokens, ch->embed->pc, w->f1, dm->rows, d, dm->v0, dm->vocab);
      reduce_start(m, w->f1, a->x, d);
      reduce_finish(m, w->f1, a->x, d);
    }
  }
  for (int i = 0; i < ch->n_layers; i++) {
    weights_needed(m, chunk, i);
    layer_fwd(m, &ch->layers[i], a, i);
  }
  if (!ch->lm_head) return 0;
  weights_needed(m, chunk, MODEL_GRADS_HEAD);
  // Whole: split into row halves the head GEMM costs more than the gather it would hide
  // (bench_ceiling SHAPE tp2: +11% on 7b-layers' head, +14% on 1b's).
  norm_enter(m, NULL, 0, acts_output(m, a), ch->final_norm->p, a->rstd_f, a->hfin);
  head_fwd(m, ch->lm_head, a);
  return ce_fwd(m, a, targets);
}

void model_chunk_bwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets,
                     float loss_scale) {
  k_backend *be = m->be;
  struct model_work *w = m->work;
  const model_dims *dm = &m->dims;
  model_chunk *ch = &m->chunks[chunk];
  int d = dm->d;
  size_t n_bytes = (size_t)(dm->rows_s * d) * sizeof(float);
  float *g = a->dx_in;
  w->fa_ready = 0;
  if (ch->lm_head) {
    grads_needed(m, chunk, MODEL_GRADS_HEAD);
    be->ce_bwd(be, a->logits, targets, a->lse_ce, dm->rows, dm->vocab, dm->v0, loss_scale);
    head_dgrad(m, ch->lm_head, a, w->f1);
    grad_enter_start(m, w->f1);
    head_wgrad(m, ch->lm_head, a);
    be->zero(be, g, n_bytes);
    grad_enter_norm(m, NULL, w->f1, acts_output(m, a), ch->final_norm, a->rstd_f, g);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, MODEL_GRADS_HEAD);
  } else {
    be->copy(be, g, a->dx_out, n_bytes);
  }
  for (int i = ch->n_layers - 1; i >= 0; i--) {
    grads_needed(m, chunk, i);
    layer_recompute(m, &ch->layers[i], a, i);
    layer_bwd(m, &ch->layers[i], a, i, g);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, i);
  }
  if (ch->embed) {
    grads_needed(m, chunk, MODEL_GRADS_EMBED);
    const float *ge = g;
    if (!enter_is_copy(m)) {
      be->copy(be, w->f1 + own_row(m) * d, g, n_bytes);
      gather_start(m, w->f1, d, K_F32);
      gather_finish(m);
      ge = w->f1;
    }
    be->embed_bwd(be, tokens, ge, ch->embed->g, dm->rows, d, dm->v0, dm->vocab);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, chunk, MODEL_GRADS_EMBED);
  }
}
