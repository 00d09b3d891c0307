// Run configuration: one plain struct filled from a YAML file plus `section.key=value`
// overrides. Every key is a row of one table (name, type, offset, min, max, default) in
// config.c; cfg_validate checks the cross-field rules and names the fields in its errors.
#ifndef TRAINER_CONFIG_H
#define TRAINER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "model/model_config.h"
#include "parallel/step/optim_config.h"

#define CFG_STR 256
#define CFG_MAX_VOCAB 16777216  // the largest model.vocab_size

typedef struct cfg_parallel {
  int tp;                     // tensor-parallel ranks
  int pp;                     // pipeline stages
  int dp;                     // data-parallel replicas; 0 = inferred from the world size
  int vpp;                    // virtual pipeline chunks per rank (1 = plain 1F1B)
  int last_stage_layers;      // layers of the last virtual stage; 0 = an even split
  int pp_comm_bf16;           // pipeline transfers in bf16 (0: fp32)
  int pp_overlap;             // pipeline transfers overlap compute (one channel per directed link)
  int sequence_parallel;      // bool
  char gpu_comm[CFG_STR];     // GPU ranks' communicator: nccl | mpi (staged through host memory)
  int dp_overlap_ctas;        // NCCL: CTAs of the DP reductions that overlap backward; 0 = NCCL's choice
  float comm_timeout_s;       // longest wait of a GPU collective before the job ends with a message
  int mpi_chunk_elems;        // MPI: largest message in elements; 0 = no chunking
  char grad_compress[CFG_STR];        // none | bf16 | fp16 | int8 (resolved into optim.grad_compress)
  char grad_error_feedback[CFG_STR];  // auto | on | off (resolved into optim.grad_error_feedback)
} cfg_parallel;

typedef struct cfg_train {
  int steps;            // optimizer steps
  int stop_at;          // stop after this step (schedule unchanged); 0 = run to steps
  int global_batch;     // sequences per optimizer step, over all dp ranks
  int micro_batch;      // sequences per micro-batch on one rank
  int skip_nonfinite;   // steps whose gradient norm is NaN or Inf skipped (no update) before the run stops
  uint64_t seed;
  char device[CFG_STR];     // auto | cpu | cuda
  char precision[CFG_STR];  // auto | fp32 | tf32 | bf16 | fp8 (auto: bf16 on GPUs, fp32 on CPU ranks)
  char attention[CFG_STR];  // cudnn | own (GPUs)
  char cpu_isa[CFG_STR];    // auto | avx512 | avx2 | sse: widest vector ISA of the CPU GEMM and AdamW
  char recompute[CFG_STR];  // none | selective | full
} cfg_train;

typedef struct cfg_fp8 {
  char recipe[CFG_STR];        // delayed | current
  int amax_history;            // steps of amax history (delayed)
  char amax_compute[CFG_STR];  // max | most_recent (delayed)
  int margin;
  char format[CFG_STR];        // hybrid | e4m3
  int fast_accum;              // bool: forward GEMMs only
  int bf16_edge_layers;        // bool
  int head;                    // bool: the LM head's GEMMs in FP8 too
} cfg_fp8;

typedef struct cfg_optimizer {
  char offload[CFG_STR];         // none | host
  char offload_update[CFG_STR];  // gpu | cpu
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
} cfg_checkpoint;

typedef struct cfg_log {
  int every;             // steps between log lines
  char metrics[CFG_STR]; // JSON-lines metrics file; empty = none
  int eval_every;        // steps between val-loss evaluations; 0 = only at the end
  int eval_batches;      // micro-batches (of micro_batch sequences) per evaluation
  int time_tp;           // bool: time the tp collectives (a sync around each)
  float peak_tflops;     // dense peak per rank for MFU; 0 = the device's known peak
} cfg_log;

typedef struct cfg {
  model_config model;
  char model_from[CFG_STR];  // model.from: hf:DIR, whose config.json gives the model keys; empty = none
  cfg_parallel parallel;
  cfg_train train;
  cfg_fp8 fp8;
  opt_config optim;      // the optimizer's keys: train.lr ... train.grad_clip, parallel.distributed_optimizer,
                         // parallel.bucket_mb, optimizer.offload_*; grad_compress and
                         // grad_error_feedback resolved from parallel's strings by cfg_validate
  cfg_optimizer optimizer;  // the optimizer section's strings (cfg_validate resolves them into optim)
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
// The key table's ranges (cfg_validate checks them again for a struct filled by code). 0, or -1
// with a message naming the key.
int cfg_check_ranges(const cfg *c, char *err, size_t n_err);
// Cross-field rules of the model and training sections, and of the layout for world_size
// ranks (world_size <= 0 skips the layout rules). Resolves parallel.dp when it is 0.
// Returns 0, or -1 with a message naming the fields and the fix.
int cfg_validate(cfg *c, int world_size, char *err, size_t n_err);
// The resolved config as YAML text (every key, in table order). Returns bytes written
// (excluding the NUL), or the size needed if n_buf is too small.
size_t cfg_to_yaml(const cfg *c, char *buf, size_t n_buf);
// The model's layout for this run (pipeline, sequence parallelism, micro-batch, recomputation).
model_layout cfg_model_layout(const cfg *c);
// Whether GPU ranks compute with bf16 activations (train.precision auto, bf16 or fp8).
int cfg_act_bf16(const cfg *c);
// Micro-batches per rank and step: global_batch / (dp * micro_batch) (dp resolved).
int cfg_n_micro(const cfg *c);

#endif
