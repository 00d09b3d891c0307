// The model's own configuration: its shape (the YAML section model:) and how a run lays it out
// over pipeline stages and micro-batches. app/config.c fills both from the run's config.
#ifndef TRAINER_MODEL_CONFIG_H
#define TRAINER_MODEL_CONFIG_H

typedef struct model_config {
  int dim;             // model width d
  int n_layers;
  int n_heads;
  int n_kv_heads;      // grouped-query heads; divides n_heads
  int ffn_dim;         // SwiGLU hidden width
  int vocab_size;
  int seq_len;         // tokens per sequence (context length)
  float norm_eps;
  float rope_theta;
  int tie_embeddings;  // bool: LM head shares the embedding table
  float init_std;      // std of the normal init of matrices
} model_config;

// Activation recomputation (train.recompute), trading compute in backward for saved memory:
// none keeps every layer's tensors; selective recomputes each layer's normed inputs and SwiGLU
// output (cheap elementwise work, plus the SP all-gathers) and keeps the GEMM and attention
// outputs; full keeps only each layer's input and reruns the layer's forward before its
// backward. All three give bitwise the same gradients.
typedef enum model_recompute { MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL } model_recompute;
// The dtype of the partial sums the tp reduce-scatters send (SP): the activations', fp32 or bf16.
typedef enum model_tp_reduce { MODEL_TP_REDUCE_ACT, MODEL_TP_REDUCE_FP32, MODEL_TP_REDUCE_BF16 } model_tp_reduce;

// FP8 for the four projections of every block (train.precision=fp8; the fp8: section of the
// config): per-tensor scales, E4M3 for weights and activations and E5M2 (hybrid) or E4M3 for
// gradients. Delayed scaling scales a tensor from the largest amax of its history (or the most
// recent) of earlier steps; current scaling from its own amax just before the cast. Weights
// are always scaled from their current amax, once per optimizer step.
// Block scaling (MODEL_FP8_BLOCK, DeepSeek-V3's) scales each 1 x 128 tile of an input or gradient
// and each 128 x 128 tile of a weight from its own amax, all E4M3 (kernels/cpu/fp8_cpu.h).
typedef enum model_fp8_recipe { MODEL_FP8_DELAYED, MODEL_FP8_CURRENT, MODEL_FP8_BLOCK } model_fp8_recipe;
typedef struct model_fp8_config {
  int enabled;               // bool
  model_fp8_recipe recipe;
  int amax_history;          // steps of amax kept (delayed)
  int amax_max;              // bool: scale from the history's largest amax (else the most recent)
  int margin;                // scale = max / amax / 2^margin
  int hybrid;                // bool: gradients in E5M2 (else E4M3)
  int fast_accum;            // bool: the forward GEMMs accumulate in the tensor cores' fast mode
  int edge_layers_bf16;      // bool: the first and last block stay in bf16
  int head;                  // bool: the LM head's three GEMMs in FP8 too
} model_fp8_config;

// How a run lays the model out: pipeline stages and their virtual chunks, the last stage's
// share of the layers, sequence parallelism, the micro-batch and what backward recomputes.
typedef struct model_layout {
  int pp, vpp;               // pipeline stages, and virtual chunks per stage
  int last_stage_layers;     // layers of the last virtual stage; 0 = an even split
  int sequence_parallel;     // bool (only with tp > 1)
  model_tp_reduce tp_reduce; // with SP, the partial sums the tp reduce-scatters carry
  int micro_batch;           // sequences per micro-batch
  model_recompute recompute;
  model_fp8_config fp8;
  int master_in_optimizer;   // bool: the optimizer holds the fp32 master weights, sharded like its moments
                             // (parallel.shard, optimizer.offload); the model keeps no fp32 flat copy
  int grads_in_optimizer;    // bool: the optimizer holds the gradients (parallel.shard=grads): the model keeps no
                             // flat gradient buffer, each group of tensors starts at a multiple of dp * 128 in the
                             // flat order, and the optimizer points the group's t->g at a staging slot before its
                             // backward (model->grads_needed)
  int weights_in_optimizer;  // bool: the optimizer holds the compute copy too (parallel.shard=weights): the model
                             // keeps no params_c; the optimizer points a group's t->pc at its gathered weights
                             // before forward or backward reads them (weights_needed, grads_needed)
} model_layout;

#endif
