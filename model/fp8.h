// FP8 for the four projections of every block (train.precision=fp8): the scaling state of each
// projection's input, output gradient and weight, the weights' FP8 copies (and transposed
// copies, since Hopper's FP8 GEMM takes K-major operands only), and the three GEMM roles in
// FP8: forward Y = X W^T, data gradient dX = G W, weight gradient dW += G^T X. block.c calls
// the roles; the step calls model_fp8_begin_step. Shared by model.c and block.c; the
// scaling-state arrays are public so that checkpoints can save and restore them.
#ifndef TRAINER_MODEL_FP8_H
#define TRAINER_MODEL_FP8_H

#include "model/model.h"

// A layer's scaling slots: the inputs of the four projections, their output gradients, and
// the weights. With fp8.head one more set of slots, after every layer's, holds the LM head's. Inputs and gradients are in the activation group (delayed: an amax history),
// weights in the weight group (scaled from their current amax each step).
enum { FP8_QKV, FP8_O, FP8_UP, FP8_DOWN, FP8_N_PROJ };
enum { FP8_X = 0, FP8_G = FP8_N_PROJ, FP8_ACT_SLOTS = 2 * FP8_N_PROJ };

// Each 1 / scale is 16 bytes from the next (fp8_scales' inv_stride), so that the GEMMs can read
// it where it is: cuBLASLt takes only 16-byte aligned scale pointers.
enum { FP8_INV_STRIDE = 4 };
// model.weights_in_optimizer: at most this many slots of gathered groups (model_fp8_place).
enum { FP8_MAX_BANKS = 9 };
static inline float *fp8_inv(float *scale_inv, int64_t i) { return scale_inv + i * FP8_INV_STRIDE; }

// An FP8 weight of this rank: one range of the flat parameter buffer (the fused q|k|v and
// gate|up are one each), cast as one (n, k) tensor.
typedef struct model_fp8_weight {
  int tensor;              // its weight slot: w_scale, w_amax, w8 and w8t are indexed by it
  int64_t offset, n_elem;  // in the flat parameter buffer
  int n, k;
  int act_read;            // its compute copy is read as well (a tied LM head: the embedding lookup)
  const model_tensor *src; // its first tensor: the cast reads src->pc on (n * k elements from there), which
                           // with sharded weights is where the layer was gathered
} model_fp8_weight;

typedef struct model_fp8 {
  model_fp8_config cfg;
  int n_layers;              // this rank's layers (over every chunk), each with slots
  int64_t n_act;             // FP8_ACT_SLOTS * (n_layers + 1): the last set is the head's
  int64_t n_w;               // FP8_N_PROJ * (n_layers + 1)
  // Backend memory. Activation group (n_act): amax since the last update, scale, 1 / scale
  // (n_act * FP8_INV_STRIDE: fp8_inv), amax history (n_act, history), format (k_fp8 per slot).
  // Weight group (n_w) likewise, with a history of one.
  float *amax, *scale, *scale_inv, *history;
  float *w_amax, *w_scale, *w_scale_inv, *w_history;
  uint8_t *fmt, *w_fmt;
  float *amax_sink;          // (2) where casts that must not record their amax write it, and the
                             // amax and history of a current-scaling cast
  int *n_nonfinite;          // (1) amaxes that were NaN or Inf at an update
  model_fp8_weight *weights; // (n_weights) the weights in FP8 on this rank
  int n_weights;
  uint8_t **w8, **w8t;       // (n_w) each weight (N, K) in FP8, and transposed (K, N)
  uint8_t *codes;            // fp8.param_gather: the buffer w8 points into (model_fp8_codes_flat); else NULL
  uint8_t *bank[FP8_MAX_BANKS], *bank_t[FP8_MAX_BANKS];  // model.weights_in_optimizer: the FP8 copies (and
                             // transposes) of the groups in the optimizer's slots (model_fp8_place), each room
                             // for the largest, made at a slot's first use; else NULL
  int64_t bank_elem;         // weights_in_optimizer: the largest weight set's elements; else 0
  uint8_t *x8;               // (rows, widest input) an input cast, or its transpose
  uint8_t *g8, *g8t;         // (rows, widest output) an output gradient cast, and transposed
  int pending;               // activation amaxes recorded since the last update
  char *w_stale;             // (n_layers + 1) per weight set (slot): changed since its FP8 copies were made
  int recording;             // casts record their amax (training); not in evaluation
  int64_t x8_made;           // 1 + the input slot whose codes are made already (model_fp8_fused_cast); 0 = none
  const uint8_t *x8_in;      // the codes of the last input cast, which the forward GEMM reads: x8, or the fused op's
  int64_t g8_made;           // 1 + the gradient slot whose codes are in g8, g8t already (model_fp8_fused_grad_cast)
  int have_history;          // an update has run (or was loaded): until then delayed scaling
                             // scales like current scaling, so the first step's small gradients
                             // do not underflow at the initial scale of 1
  int64_t pos;               // history row the next update writes
  // fp8.recipe=block (kernels/cpu/fp8_cpu.h's tiles and scale layouts): each weight's tile
  // scales (n_w), of w8 and w8t; the inverse scales of x8 (an input's 1 x 128 tiles, or its
  // transpose's), of g8 and of g8t; the input that model_fp8_fwd_rows casts range by range.
  float **ws, **wst;
  float *x_si, *g_si, *gt_si;
  const void *x_src;
  int *layer_of;             // (n_layers + 1) the global layer of each slot index (model_layer.fp8);
                             // the last, the head's, is model.n_layers
  const model_tensor *head_w; // fp8.head, on the rank that holds the LM head: its weight; else NULL
  int64_t bad_code;          // the first tensor whose amax this step was not finite, as global layer *
                             // FP8_ACT_SLOTS + slot (model_fp8_count_nonfinite); -1 = none
  float bad_amax;            // its amax (NaN or Inf)
} model_fp8;

void model_fp8_init(model *m, const model_fp8_config *fc);
void model_fp8_free(model *m);
// The LM head (fp8.head): a slot index like a layer's (model_layer.fp8) after every layer's,
// whose first projection's slots are the head's (p = 0: input, output gradient, weight), so that
// the roles below serve it too; -1 where the head is not in FP8 on this rank.
int model_fp8_head_slot(const model *m);
// Whether a layer (global index) computes in FP8: not with fp8.bf16_edge_layers for the first
// and the last block.
int model_fp8_layer_on(const model *m, int layer);
// Collective over the layer's tp and dp groups. Before the micro-batches of a step (training)
// or an evaluation: training folds the amaxes of the last step into the scales (delayed
// scaling: reduced over tp and dp, so every layout scales alike).
void model_fp8_begin_step(model *m, int training);
// The weights changed (an update, init, load): their FP8 copies are remade before next use.
void model_fp8_weights_changed(model *m);
// model.weights_in_optimizer: the tensors [t_lo, t_hi) (a group) are being gathered into the
// optimizer's slot k (below FP8_MAX_BANKS): the FP8 copies of the weights that start among them go
// in bank k (allocated at its first use), remade from the gathered weights before their next use.
// The copies of the group bank k held before are gone.
void model_fp8_place(model *m, int k, int t_lo, int t_hi);
// Collective over the layer's tp group. Before the first forward GEMM of weight set slot (a
// layer's model_layer.fp8, or model_fp8_head_slot) in a step: remakes its FP8 copies and
// transposes if its weights changed, each scaled from its current amax. Set by set, so a
// layer's copies wait only for that layer's weights (optimizer.offload_layer_wait).
void model_fp8_weights_ready(model *m, int slot);
// fp8.param_gather (parallel/step/param_gather.h) makes the weights' FP8 copies itself, from the
// parts of the compute copy this rank updated: the three calls below.
// The weights' codes move into one buffer of one byte per element of the flat parameter buffer
// from element lo to hi (covering every FP8 weight; w8 points into it), which is returned.
uint8_t *model_fp8_codes_flat(model *m, int64_t lo, int64_t hi);
// Collective over dp and tp: w_amax holds, for each weight, the amax of the part of it this rank
// updated; maxed over dp (one all-reduce for every weight) and tp, it scales the weights as
// model_fp8_weights_ready would from the whole compute copy.
void model_fp8_scale_weights(model *m);
// The codes of every weight are in w8: their transposes are made from them (a byte transpose, the
// codes fp8_cast would write), and the FP8 copies count as current.
void model_fp8_codes_ready(model *m);
// The activation group's 1 / scale, n_act values packed (as checkpoints hold them), from backend
// memory into host memory and back.
void model_fp8_scale_inv_to_host(const model *m, float *host);
void model_fp8_scale_inv_from_host(model *m, const float *host);
// Collective. Folds pending amaxes into the scales now (before a checkpoint saves them); the
// next begin_step then has nothing to fold. Same result as leaving it to begin_step.
void model_fp8_settle(model *m);

// A non-finite amax (an Inf or NaN in a projection's input or output gradient) refuses the
// step's update, like a non-finite gradient norm (parallel/step/optim.c), and never reaches the
// scaling state or a checkpoint. Local: how many tensors recorded a NaN or Inf amax in this
// step's training casts (0 without FP8); remembers the first for model_fp8_describe_nonfinite.
int model_fp8_count_nonfinite(model *m);
// This step's recorded amaxes become 0 (its update was refused): the next update folds a row
// of zeros, so no NaN reaches the history and it keeps one row per step (as resume assumes).
void model_fp8_discard_step(model *m);
// Collective over the world (nothing without FP8). Whether some rank's last count saw a
// non-finite amax: 1, naming the first such tensor over every rank (lowest layer, then slot)
// and its amax in buf, e.g. "the FP8 amax of layer 0's QKV projection input is inf"; else 0.
int model_fp8_describe_nonfinite(model *m, char *buf, size_t n_buf);
// Test hook (TRAINER_TEST_FP8_AMAX_AT_STEP, app/main.c): the amax that this step recorded for the
// input of the first FP8 projection on this rank becomes value, as if the input held it.
void model_fp8_test_set_amax(model *m, float value);

// One pass fewer: where the input of projection p can be cast by the op that makes it (delayed
// scaling after its first update: the scale is known before the tensor is; not block scaling),
// returns 1 with the scale, the codes' buffer and the amax that cast uses (the op writes codes
// and amax as fp8_cast would), and the next model_fp8_cast_input of that slot finds the codes
// made. 0 where not: cast as usual. The codes' buffer is into, where the caller keeps them
// (rows, K bytes; the forward GEMM reads them there), or with into NULL a scratch buffer.
// Whether such casts run this step (the same for every op of a step, forward and backward):
// model_fp8_fused_casts.
int model_fp8_fused_cast(model *m, int slot, int p, uint8_t *into, const float **scale, uint8_t **codes, float **amax);
int model_fp8_fused_casts(const model *m);
// The same for the output gradient of projection p: returns 1 with the scale, the format, the
// buffers of the codes and of the transposed codes, and the amax that model_fp8_cast_grad would
// use (the op writes them as fp8_cast would), and the next model_fp8_cast_grad of that slot finds
// them made (its g is not read then: it may be NULL). 0 where not: cast as usual.
int model_fp8_fused_grad_cast(model *m, int slot, int p, const float **scale, k_fp8 *fmt, uint8_t **codes,
                              uint8_t **codes_t, float **amax);

// The roles, for a layer's slots `slot` (model_layer.fp8) and projection p (FP8_QKV ...).
// Forward: model_fp8_cast_input casts X (rows, K) act, every row; then y (r1 - r0, N) = rows
// [r0, r1) of X times W^T, into c_type, with beta 0 or 1 (adding y_in, or y itself where y_in
// is NULL, in fp32).
void model_fp8_cast_input(model *m, int slot, int p, const void *x, int64_t rows, int k);
// Whether the input casts can go a range of rows at a time, each range as its rows are ready (a
// gather's own rows before the others arrive): where the scale is known before the cast (delayed
// scaling with a history) or block scaling casts tile by tile in model_fp8_fwd_rows anyway.
int model_fp8_input_by_rows(const model *m);
// Rows [r0, r1) of X (rows, K) act cast as model_fp8_cast_input casts them (the same codes; the
// amax the max over the calls), for model_fp8_fwd_rows over those rows; only where
// model_fp8_input_by_rows.
void model_fp8_cast_input_rows(model *m, int slot, int p, const void *x, int64_t r0, int64_t r1, int k);
void model_fp8_fwd_rows(model *m, int slot, int p, int64_t r0, int64_t r1, int n, int k, const void *y_in, void *y,
                        k_dtype c_type, float beta);
// Backward: cast the output gradient G (rows, N) act (and its transpose; unless
// model_fp8_fused_grad_cast's op made both); then the data
// gradient dX (rows, K) = G W into c_type, and the weight gradient dW (N, K) fp32 = G^T X + beta dW
// (beta 1 adds, 0 writes),
// with X (rows, K) the layer's saved input, cast again (transposed) with its forward scale; or,
// where x_codes is given (the codes model_fp8_fused_cast's op kept, x then unused), those codes
// transposed: the same codes either way.
void model_fp8_cast_grad(model *m, int slot, int p, const void *g, int64_t rows, int n);
// Rows [r0, r1) of dX from rows [r0, r1) of G's codes, into rows [r0, r1) of dx (block scaling:
// r0 0).
void model_fp8_dgrad(model *m, int slot, int p, int64_t r0, int64_t r1, int n, int k, void *dx, k_dtype c_type);
// Whether model_fp8_dgrad may go a range of rows at a time (r0 > 0): all recipes but block
// scaling, whose data-gradient GEMM reads the gradient's tile scales of every row at once.
int model_fp8_dgrad_by_rows(const model *m);
// The output gradient cast a range of rows at a time, for a gather of its codes (sequence
// parallelism: each rank casts its own rows and the codes cross, half the bytes of the act
// dtype): rows [r0, r1) of G (rows, N) act into the codes the data gradient reads, with the
// slot's scale (the amax the max over the calls); returns those codes (rows, N bytes), for the
// caller to gather the other rows into. Only where model_fp8_fused_casts (the scale known before
// the cast). Once every row is there, model_fp8_grad_rows_done makes the transposed codes for
// the weight gradient: the same codes as model_fp8_cast_grad of the whole G.
uint8_t *model_fp8_cast_grad_rows(model *m, int slot, int p, const void *g, int64_t r0, int64_t r1, int n);
void model_fp8_grad_rows_done(model *m, int64_t rows, int n);
void model_fp8_wgrad(model *m, int slot, int p, const void *x, const uint8_t *x_codes, int64_t rows, int n, int k,
                     float beta, float *dw);

#endif
