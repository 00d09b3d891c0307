// Run configuration: one plain struct filled from a YAML file plus `section.key=value`
// overrides. Every key is a row of one table (name, type, offset, min, max, default) in
// config.c; cfg_validate checks the cross-field rules and names the fields in its errors.
#ifndef TRAINER_CONFIG_H
#define TRAINER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define CFG_STR 256

typedef struct cfg_model {
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
} cfg_model;

typedef struct cfg_parallel {
  int tp;                     // tensor-parallel ranks
  int pp;                     // pipeline stages
  int dp;                     // data-parallel replicas; 0 = inferred from the world size
  int vpp;                    // virtual pipeline chunks per rank (1 = plain 1F1B)
  int last_stage_layers;      // layers of the last virtual stage; 0 = an even split
  int pp_comm_bf16;           // pipeline transfers in bf16 (0: fp32)
  int pp_overlap;             // pipeline transfers overlap compute (one channel per directed link)
  int sequence_parallel;      // bool
  int distributed_optimizer;  // bool: ZeRO-1 over dp
  float bucket_mb;            // DP gradient bucket size in MiB
  int grad_reduce_bf16;       // DP gradient reduction in bf16 (0: fp32)
  char gpu_comm[CFG_STR];     // GPU ranks' communicator: nccl | mpi (staged through host memory)
  int dp_overlap_ctas;        // NCCL: CTAs of the DP reductions that overlap backward; 0 = NCCL's choice
} cfg_parallel;

typedef struct cfg_train {
  int steps;            // optimizer steps
  int stop_at;          // stop after this step (schedule unchanged); 0 = run to steps
  int global_batch;     // sequences per optimizer step, over all dp ranks
  int micro_batch;      // sequences per micro-batch on one rank
  float lr;             // peak learning rate
  float min_lr;         // floor of the cosine decay
  int warmup_steps;
  float weight_decay;
  float beta1;
  float beta2;
  float eps;
  float grad_clip;      // global gradient-norm clip; 0 = off
  uint64_t seed;
  char device[CFG_STR];     // auto | cpu | cuda
  char recompute[CFG_STR];  // none | selective | full
} cfg_train;

typedef struct cfg_data {
  char train[CFG_STR];  // shard path or glob
  char val[CFG_STR];    // shard path or glob; empty = no evaluation
} cfg_data;

typedef struct cfg_checkpoint {
  char dir[CFG_STR];     // empty = no checkpoints
  int every;             // steps between checkpoints; 0 = only at the end
  char resume[CFG_STR];  // none | auto | path of a checkpoint file
  int keep;              // newest checkpoints kept; 0 = all
} cfg_checkpoint;

typedef struct cfg_log {
  int every;             // steps between log lines
  char metrics[CFG_STR]; // JSON-lines metrics file; empty = none
  int eval_every;        // steps between val-loss evaluations; 0 = only at the end
  int eval_batches;      // micro-batches (of micro_batch sequences) per evaluation
} cfg_log;

typedef struct cfg {
  cfg_model model;
  cfg_parallel parallel;
  cfg_train train;
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
// Cross-field rules of the model and training sections, and of the layout for world_size
// ranks (world_size <= 0 skips the layout rules). Resolves parallel.dp when it is 0.
// Returns 0, or -1 with a message naming the fields and the fix.
int cfg_validate(cfg *c, int world_size, char *err, size_t n_err);
// The resolved config as YAML text (every key, in table order). Returns bytes written
// (excluding the NUL), or the size needed if n_buf is too small.
size_t cfg_to_yaml(const cfg *c, char *buf, size_t n_buf);

#endif
