// Run configuration: one plain struct filled from a YAML file plus `section.key=value`
// overrides. Every key is a row of one table (name, type, offset, min, max, default) in
// config.c; cfg_validate checks the cross-field rules and names the fields in its errors.
// A choice key (one of a fixed set of words) is an enum here; files, overrides, the printed
// config and checkpoints hold its word.
#ifndef TRAINER_CONFIG_H
#define TRAINER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "model/model_config.h"
#include "parallel/step/optim_config.h"

#define CFG_STR 256
#define CFG_MAX_VOCAB 16777216  // the largest model.vocab_size

// The choice keys' enums. Each has its words in config.c, in the enum's order: cfg_<name>_names,
// NULL-terminated (cfg_device_names[CFG_DEVICE_CUDA] is "cuda").
typedef enum cfg_device { CFG_DEVICE_AUTO, CFG_DEVICE_CPU, CFG_DEVICE_CUDA } cfg_device;
typedef enum cfg_precision {
  CFG_PRECISION_AUTO,
  CFG_PRECISION_FP32,
  CFG_PRECISION_TF32,
  CFG_PRECISION_BF16,
  CFG_PRECISION_FP8
} cfg_precision;
typedef enum cfg_attention { CFG_ATTENTION_CUDNN, CFG_ATTENTION_CUDNN_ATOMIC, CFG_ATTENTION_OWN } cfg_attention;
typedef enum cfg_cpu_isa { CFG_CPU_ISA_AUTO, CFG_CPU_ISA_AVX512, CFG_CPU_ISA_AVX2, CFG_CPU_ISA_SSE } cfg_cpu_isa;
typedef enum cfg_recompute { CFG_RECOMPUTE_NONE, CFG_RECOMPUTE_SELECTIVE, CFG_RECOMPUTE_FULL } cfg_recompute;
typedef enum cfg_fp8_recipe { CFG_FP8_RECIPE_DELAYED, CFG_FP8_RECIPE_CURRENT, CFG_FP8_RECIPE_BLOCK } cfg_fp8_recipe;
typedef enum cfg_amax_compute { CFG_AMAX_COMPUTE_MAX, CFG_AMAX_COMPUTE_MOST_RECENT } cfg_amax_compute;
typedef enum cfg_fp8_format { CFG_FP8_FORMAT_HYBRID, CFG_FP8_FORMAT_E4M3 } cfg_fp8_format;
typedef enum cfg_offload { CFG_OFFLOAD_NONE, CFG_OFFLOAD_HOST } cfg_offload;
typedef enum cfg_offload_update { CFG_OFFLOAD_UPDATE_GPU, CFG_OFFLOAD_UPDATE_CPU } cfg_offload_update;
typedef enum cfg_gpu_comm { CFG_GPU_COMM_NCCL, CFG_GPU_COMM_MPI } cfg_gpu_comm;
// How the tp regions' gathers and reduce-scatters run beside the GEMMs (parallel/comm/tp.h).
typedef enum cfg_tp_overlap { CFG_TP_OVERLAP_AUTO, CFG_TP_OVERLAP_NCCL, CFG_TP_OVERLAP_P2P, CFG_TP_OVERLAP_NONE } cfg_tp_overlap;
// The dtype of the partial sums the tp reduce-scatters send (SP); auto: the activations'.
typedef enum cfg_tp_reduce { CFG_TP_REDUCE_AUTO, CFG_TP_REDUCE_FP32, CFG_TP_REDUCE_BF16 } cfg_tp_reduce;
// parallel.shard: what each dp rank holds only its part of (docs/config.md).
typedef enum cfg_shard { CFG_SHARD_NONE, CFG_SHARD_OPTIMIZER, CFG_SHARD_GRADS, CFG_SHARD_WEIGHTS } cfg_shard;
typedef enum cfg_grad_compress {
  CFG_GRAD_COMPRESS_NONE,
  CFG_GRAD_COMPRESS_BF16,
  CFG_GRAD_COMPRESS_FP16,
  CFG_GRAD_COMPRESS_INT8
} cfg_grad_compress;
typedef enum cfg_error_feedback {
  CFG_ERROR_FEEDBACK_AUTO,
  CFG_ERROR_FEEDBACK_ON,
  CFG_ERROR_FEEDBACK_OFF
} cfg_error_feedback;

extern const char *const cfg_device_names[];
extern const char *const cfg_precision_names[];
extern const char *const cfg_attention_names[];
extern const char *const cfg_cpu_isa_names[];
extern const char *const cfg_recompute_names[];
extern const char *const cfg_shard_names[];
extern const char *const cfg_fp8_recipe_names[];
extern const char *const cfg_amax_compute_names[];
extern const char *const cfg_fp8_format_names[];
extern const char *const cfg_offload_names[];
extern const char *const cfg_offload_update_names[];
extern const char *const cfg_gpu_comm_names[];
extern const char *const cfg_tp_overlap_names[];
extern const char *const cfg_tp_reduce_names[];
extern const char *const cfg_grad_compress_names[];
extern const char *const cfg_error_feedback_names[];

typedef struct cfg_parallel {
  int tp;                     // tensor-parallel ranks
  int pp;                     // pipeline stages
  int dp;                     // data-parallel replicas; 0 = inferred from the world size
  int vpp;                    // virtual pipeline chunks per rank (1 = plain 1F1B)
  int last_stage_layers;      // layers of the last virtual stage; 0 = an even split
  int pp_comm_bf16;           // pipeline transfers in bf16 (0: fp32)
  int pp_overlap;             // pipeline transfers overlap compute (one channel per directed link)
  int sequence_parallel;      // bool
  cfg_shard shard;            // what is sharded over dp (resolved into optim.shard)
  int shard_group;            // dp ranks sharing out the sharded state, a replica per group; 0 = all of dp
  int shard_prefetch;         // parallel.shard=weights: groups gathered ahead of the one computing
  int gather_copy_engine;     // bool: parallel.shard=weights gathers on the copy engines (NCCL zero-CTA)
  int reshard_after_forward;  // bool: parallel.shard=weights frees a layer's gathered weights after its forward
  cfg_gpu_comm gpu_comm;      // GPU ranks' communicator (mpi: staged through host memory)
  cfg_tp_overlap tp_overlap;  // the tp collectives: peer copies (p2p), NCCL, or not overlapped (none)
  cfg_tp_reduce tp_reduce_dtype;  // SP: the partial sums the tp reduce-scatters carry
  int dp_overlap_ctas;        // NCCL: CTAs of the DP reductions that overlap backward; 0 = NCCL's choice
  float comm_timeout_s;       // longest wait of a GPU collective before the job ends with a message
  int mpi_chunk_elems;        // MPI: largest message in elements; 0 = no chunking
  cfg_grad_compress grad_compress;          // resolved into optim.grad_compress
  cfg_error_feedback grad_error_feedback;   // resolved into optim.grad_error_feedback
} cfg_parallel;

typedef struct cfg_train {
  int steps;            // optimizer steps
  int stop_at;          // stop after this step (schedule unchanged); 0 = run to steps
  int global_batch;     // sequences per optimizer step, over all dp ranks
  int micro_batch;      // sequences per micro-batch on one rank
  int skip_nonfinite;   // steps whose gradient norm is NaN or Inf skipped (no update) before the run stops
  uint64_t seed;
  cfg_device device;
  cfg_precision precision;  // auto: bf16 on GPUs, fp32 on CPU ranks
  cfg_attention attention;  // GPUs
  cfg_cpu_isa cpu_isa;      // widest vector ISA of the CPU GEMM and AdamW
  cfg_recompute recompute;
} cfg_train;

typedef struct cfg_fp8 {
  cfg_fp8_recipe recipe;
  int amax_history;            // steps of amax history (delayed)
  cfg_amax_compute amax_compute;  // delayed
  int margin;
  cfg_fp8_format format;
  int fast_accum;              // bool: forward GEMMs only
  int bf16_edge_layers;        // bool
  int head;                    // bool: the LM head's GEMMs in FP8 too
} cfg_fp8;

typedef struct cfg_optimizer {
  cfg_offload offload;
  cfg_offload_update offload_update;
} cfg_optimizer;

typedef struct cfg_data {
  char train[CFG_STR];  // shard path or glob
  char val[CFG_STR];    // shard path or glob; empty = no evaluation
} cfg_data;

typedef struct cfg_checkpoint {
  char dir[CFG_STR];     // empty = no checkpoints
  int every;             // steps between checkpoints; 0 = only at the end
  char resume[CFG_STR];  // none | auto | path of a checkpoint file
  int keep;              // newest checkpoints kept; 0 = all
  char init_from[CFG_STR];  // weights to start from: hf:DIR; empty = random init
  int at_start;          // bool: also checkpoint step 0, before the first update
  int async;             // bool: write checkpoints in the background (checkpoint.async)
} cfg_checkpoint;

typedef struct cfg_log {
  int every;             // steps between log lines
  char metrics[CFG_STR]; // JSON-lines metrics file; empty = none
  char tensorboard[CFG_STR];  // folder for TensorBoard event files; empty = none
  int eval_every;        // steps between val-loss evaluations; 0 = only at the end
  int eval_batches;      // micro-batches (of micro_batch sequences) per evaluation
  int time_tp;           // bool: time the tp collectives (a sync around each)
  int time_dp;           // bool: time the waits for sharded data parallelism's collectives (a sync around each)
  float peak_tflops;     // dense peak per rank for MFU; 0 = the device's known peak
} cfg_log;

typedef struct cfg {
  model_config model;
  char model_from[CFG_STR];  // model.from: hf:DIR, whose config.json gives the model keys; empty = none
  cfg_parallel parallel;
  cfg_train train;
  cfg_fp8 fp8;
  opt_config optim;      // the optimizer's keys: train.lr ... train.grad_clip, parallel.shard,
                         // parallel.bucket_mb, optimizer.offload_*; grad_compress and
                         // grad_error_feedback resolved from parallel's choices by cfg_validate
  cfg_optimizer optimizer;  // the optimizer section's choices (cfg_validate resolves them into optim)
  cfg_data data;
  cfg_checkpoint checkpoint;
  cfg_log log;
  char path[CFG_STR];    // file it was loaded from
} cfg;

// Fill c with defaults, then the YAML file at path (NULL: defaults only), then the overrides
// ("section.key=value"). Returns 0, or -1 with a one-line message in err naming file, line and
// key (e.g. "configs/x.yaml:12: unknown key 'model.dimm' (known keys in section model: ...)").
int cfg_load(cfg *c, const char *path, int n_overrides, char **overrides, char *err, size_t n_err);
// Same, from YAML text in memory (the copy stored in a checkpoint); name is used in messages.
int cfg_load_string(cfg *c, const char *yaml, const char *name, char *err, size_t n_err);
// The words of choice key name ("train.precision"), NULL-terminated in its enum's order; NULL
// for a key that is not a choice.
const char *const *cfg_list_choices(const char *name);
// The index of word among words (a cfg_<name>_names list), which is its enum value; -1 if absent.
int cfg_find_choice(const char *const *words, const char *word);
// The key table's ranges and choices (cfg_validate checks them again for a struct filled by code). 0,
// or -1 with a message naming the key.
int cfg_check_ranges(const cfg *c, char *err, size_t n_err);
// Cross-field rules of the model and training sections, and of the layout for world_size
// ranks (world_size <= 0 skips the layout rules). Resolves parallel.dp when it is 0.
// Returns 0, or -1 with a message naming the fields and the fix.
int cfg_validate(cfg *c, int world_size, char *err, size_t n_err);
// The resolved config as YAML text (every key, in table order). Returns bytes written
// (excluding the NUL), or the size needed if n_buf is too small.
size_t cfg_to_yaml(const cfg *c, char *buf, size_t n_buf);
// parallel.shard into the optimizer's config (c->optim.shard); cfg_validate calls
// it, and so does whatever plans another shard mode from a validated config.
void cfg_resolve_shard(cfg *c);
// The model's layout for this run (pipeline, sequence parallelism, micro-batch, recomputation).
model_layout cfg_model_layout(const cfg *c);
// Whether GPU ranks compute with bf16 activations (train.precision auto, bf16 or fp8).
int cfg_act_bf16(const cfg *c);
// Micro-batches per rank and step: global_batch / (dp * micro_batch) (dp resolved).
int cfg_n_micro(const cfg *c);

#endif
