// The Llama-style decoder as this rank holds it: parameters laid out from a spec table (one
// allocation, pointers carved out), sharded over tensor-parallel ranks and split into
// pipeline chunks, and the forward/backward of one chunk for one micro-batch.
// Activations are sequence-major, (T, B, d): a sequence-parallel shard is then a contiguous
// block of rows, [tp_rank * T/tp * B, (tp_rank + 1) * T/tp * B).
#ifndef TRAINER_MODEL_H
#define TRAINER_MODEL_H

#include <stdint.h>
#include "model/model_config.h"
#include "kernels/backend.h"
#include "model/model_comm.h"

typedef enum model_kind {
  MODEL_EMBED,        // (V, d), vocab split over tp
  MODEL_ATTN_NORM,    // (d)
  MODEL_WQ,           // (n_heads * hd, d), heads split over tp
  MODEL_WK,           // (n_kv_heads * hd, d), heads split over tp
  MODEL_WV,           // (n_kv_heads * hd, d), heads split over tp
  MODEL_WO,           // (d, n_heads * hd), input split over tp
  MODEL_MLP_NORM,     // (d)
  MODEL_W_GATE,       // (ffn, d), ffn split over tp
  MODEL_W_UP,         // (ffn, d), ffn split over tp
  MODEL_W_DOWN,       // (d, ffn), input split over tp
  MODEL_FINAL_NORM,   // (d)
  MODEL_LM_HEAD,      // (V, d), vocab split over tp; absent when tied to MODEL_EMBED
  MODEL_N_KINDS
} model_kind;

// One row of the spec table: what a parameter is, independent of any layout.
typedef struct model_spec {
  const char *name;   // name in checkpoints: "embed", "layers.{i}.<name>", "final_norm", "lm_head"
  int per_layer;
  int tp_split;       // -1 replicated, 0 split rows (column-parallel), 1 split columns (row-parallel)
  int decay;          // weight decay applies
  int init;           // 0 normal(init_std), 1 normal(init_std / sqrt(2 L)) (residual outputs), 2 ones
} model_spec;
extern const model_spec model_specs[MODEL_N_KINDS];

// One parameter tensor instance held by this rank (a layer's matrix, or a global tensor).
typedef struct model_tensor {
  model_kind kind;
  int layer;              // -1 for non-layer tensors
  int chunk;              // local pipeline chunk holding it
  char name[64];
  int ndim;               // 1 or 2
  int64_t full[2];        // logical shape
  int64_t start[2];       // this rank's block
  int64_t count[2];
  int64_t n_elem;         // count product
  int64_t offset;         // in the flat parameter / gradient buffers
  int tp_replicated;      // same values on every tp rank (norms): counted once in norms
  float *p, *g;           // fp32 weights forward reads (the master; m->norm_copy for a norm, NULL
                          // for the others, when master_in_optimizer) and gradients
  void *pc;               // compute copy in the backend's activation dtype (= p when that is fp32)
} model_tensor;

typedef struct model_layer {
  model_tensor *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *w_gate, *w_up, *w_down;
  int fp8;                // index of its FP8 scaling slots (model/fp8.h); with FP8 only
} model_layer;

typedef struct model_chunk {
  int vstage;             // virtual pipeline stage: chunk * pp + pp_rank
  int layer0, n_layers;   // global index of its first layer, and count
  model_layer *layers;    // (n_layers)
  model_tensor *embed;    // first virtual stage only
  model_tensor *final_norm, *lm_head;  // last virtual stage only (lm_head = embed when tied)
} model_chunk;

// Sizes of one micro-batch's activations for one chunk.
typedef struct model_dims {
  int B, T, d, hd;
  int nh, nkv, ffn, vocab;   // local (per tp rank)
  int v0;                    // first vocab row of this rank
  int64_t rows;              // T * B: rows inside tensor-parallel regions
  int64_t rows_s;            // rows of the residual stream on this rank (T/tp * B with SP)
} model_dims;


// Where this rank sits in the process grid (parallel/comm/tp.h: tp_model_place).
typedef struct model_place {
  int tp, tp_rank, dp, dp_rank, pp, pp_rank;
} model_place;

typedef struct model {
  model_config cfg;
  int tp, tp_rank, dp, dp_rank, pp, pp_rank, vpp, sp;
  k_dtype reduce_type;    // the partial sums the tp reduce-scatters send (SP): fp32, or bf16
  model_recompute recompute;
  model_comm comm;        // the collectives (model/model_comm.h), bound by parallel/ after model_init
  k_backend *be;
  model_dims dims;
  model_tensor *tensors;  // (n_tensors), in flat-buffer order
  int n_tensors;
  model_chunk *chunks;    // (vpp)
  float *params, *grads;  // (n_params) flat, in backend memory; params NULL when master_in_optimizer, grads NULL
                          // when grads_in_optimizer
  int grads_in_optimizer;   // model_layout.grads_in_optimizer: t->g is set by the optimizer (grads_needed)
  int weights_in_optimizer; // model_layout.weights_in_optimizer: t->pc is set by the optimizer (weights_needed,
                            // grads_needed)
  int master_in_optimizer;  // the optimizer holds the fp32 master weights, sharded like its moments (parallel.shard,
                            // optimizer.offload: in device or host memory)
  float *norm_copy;       // master_in_optimizer: the norm weights forward reads, in backend memory, packed in tensor
                          // order (the optimizer refreshes it); else NULL
  void *params_c;         // (n_params) compute copy in act dtype; = params when act is fp32; NULL with
                          // model_layout.weights_in_optimizer (each t->pc is then set by the optimizer)
  size_t act_bytes;       // element size of the backend's activation dtype
  int64_t n_params;       // local elements, padded to a multiple of dp (distributed optimizer)
  int64_t n_params_used;  // local elements before padding
  struct model_work *work;  // scratch shared by every forward/backward (block.c)
  struct model_fp8 *fp8;    // train.precision=fp8: scaling state and FP8 copies (model/fp8.h); else NULL
  // Called by model_chunk_bwd, once per call, as soon as a group of parameter gradients has
  // received this micro-batch's contribution (queued on the backend): after the head and final
  // norm (layer = MODEL_GRADS_HEAD), after each layer (its local index in the chunk), after the
  // embedding (MODEL_GRADS_EMBED). The optimizer uses it to reduce DP buckets during backward.
  // NULL: not called.
  void (*grads_ready)(void *ctx, int chunk, int layer);
  void *grads_ready_ctx;
  // Called by model_chunk_bwd before it writes a group's gradients (and, recomputing, reads its
  // weights), with the same ids: the head and final norm, each layer, the embedding. With
  // grads_in_optimizer the optimizer points the group's t->g at staging here, zeroed but where
  // backward writes the gradient whole (model_grad_written). NULL: not called.
  void (*grads_needed)(void *ctx, int chunk, int layer);
  void *grads_needed_ctx;
  // Its mirror in forward: called by model_chunk_fwd, once per call, before it reads a group of
  // weights (the same ids): the embedding, each layer, then the final norm and head. The
  // optimizer uses it to finish the update of a layer's weights only when its forward needs
  // them (optimizer.offload_layer_wait). NULL: not called.
  void (*weights_needed)(void *ctx, int chunk, int layer);
  void *weights_needed_ctx;
} model;

// The groups of parameters grads_ready and weights_needed name besides the layers.
enum { MODEL_GRADS_HEAD = -1, MODEL_GRADS_EMBED = -2 };
// The group of tensor t, as the hooks name it: MODEL_GRADS_EMBED for the embedding (and a tied
// head), MODEL_GRADS_HEAD for the final norm and the head, else its layer's index in its chunk.
int model_tensor_group(const model *m, const model_tensor *t);
// Whether tensor i (in flat order) starts a group: the first tensor, or one of another chunk or
// group than tensor i - 1.
int model_group_starts(const model *m, int i);
// Whether backward writes tensor t's gradient instead of adding to it: a layer's projection
// (attention and MLP weights, one weight-gradient GEMM each per backward) with
// grads_in_optimizer, where every backward of a group gets staging of its own. grads_needed
// then need zero only the group's other tensors (norms, embedding, head) and its padding.
int model_grad_written(const model *m, const model_tensor *t);


// Layers [*layer0, *layer0 + *n_layers) of virtual pipeline stage vstage (of pp * vpp): an even
// split, or parallel.last_stage_layers for the last stage (it also runs the head and the loss)
// and an even split of the rest for the others.
void model_stage_layers(const model_config *mc, const model_layout *ml, int vstage, int *layer0, int *n_layers);

// Lays out this rank's parameters (chunks, tp shards) and allocates them. micro_batch sets
// the activation sizes. dp pads the flat buffer to a multiple of dp. m->comm must be bound
// (parallel/comm/tp.h: tp_bind_model) before the first forward.
void model_init(model *m, const model_config *mc, const model_layout *ml, const model_place *at, k_backend *be);
void model_free(model *m);
// n_bytes of the backend's host memory (host_alloc) for `what`; a refusal ends the job with a
// message naming the bytes and the fix.
void *model_host_alloc(k_backend *be, size_t n_bytes, const char *what);
// Deterministic init, independent of the layout: element (i) of a full tensor gets a value
// from (seed, tensor name, i), so every layout starts from the same weights. model_init_tensor
// writes tensor i's block on this rank (n_elem values) into host memory; model_init_weights
// sets every tensor of m->params so (not with master_in_optimizer: the optimizer's opt_init_weights).
void model_init_tensor(const model *m, int i, uint64_t seed, float *block);
void model_init_weights(model *m, uint64_t seed);
// The full (logical) shape of a parameter kind; returns its number of dimensions (1 or 2).
int model_full_shape(const model_config *c, model_kind k, int64_t full[2]);
// Parameter counts of the whole model (all ranks): total and without the embedding table.
int64_t model_count_params(const model_config *c, int64_t *n_without_embedding);

// Activations of one (micro-batch, chunk): inputs, saved tensors, outputs, gradients.
typedef struct model_acts model_acts;
model_acts *model_acts_create(model *m, int chunk);
void model_acts_free(model *m, model_acts **a);
// The chunk's input x (rows_s, d) (received activations) and input gradient (rows_s, d).
float *model_acts_input(model_acts *a);
float *model_acts_input_grad(model_acts *a);
// The chunk's output (rows_s, d) and output gradient (rows_s, d) (received gradients).
float *model_acts_output(const model *m, model_acts *a);
float *model_acts_output_grad(model_acts *a);
// Bytes of the work buffers a model keeps beside its activations (model_work_init: the gradients
// and tp-crossing buffers one layer at a time needs).
int64_t model_work_bytes(const model_dims *dm, int act_bytes);
// Bytes of one model_acts for a chunk of n_layers (with the head when has_head).
int64_t model_acts_bytes(const model_dims *dm, int n_layers, int has_head, int act_bytes, model_recompute rc);
// Refreshes the compute copy of the weights from m->params (after init or load; not with
// master_in_optimizer, where the optimizer refreshes it: opt_set_params).
void model_sync_compute_weights(model *m);
// Activation sizes on one rank: tp rank tp_rank of tp, with or without sequence parallelism.
void model_dims_compute(model_dims *dm, const model_config *mc, int micro_batch, int tp, int tp_rank, int sp);

// Forward of a chunk. tokens/targets: (T, B) in backend memory, used by the first/last
// virtual stage. On the last stage returns the sum over this micro-batch of the per-token
// loss (identical on every tp rank); else 0.
double model_chunk_fwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets);
// Backward of a chunk: output gradient (or, on the last stage, the loss scaled by
// loss_scale per token) to input gradient; parameter gradients accumulate into m->grads.
void model_chunk_bwd(model *m, int chunk, model_acts *a, const int32_t *tokens, const int32_t *targets,
                     float loss_scale);

#endif
