// The optimizer's configuration: AdamW's hyper-parameters and how gradients are synchronised
// over data-parallel ranks, and where its state lives. app/config.c fills it from the run's config
// (keys of the train, parallel and optimizer sections, docs/config.md).
#ifndef TRAINER_OPTIM_CONFIG_H
#define TRAINER_OPTIM_CONFIG_H

#include "parallel/comm/compress.h"  // comm_compress_mode

// What each dp rank holds only its part of (parallel.shard), each level adding to the one before:
// the fp32 master weights and moments (ZeRO-1), then the fp32 gradients (ZeRO-2), then the compute
// copy of the weights, gathered group by group for forward and backward (ZeRO-3).
typedef enum opt_shard { OPT_SHARD_NONE, OPT_SHARD_OPTIMIZER, OPT_SHARD_GRADS, OPT_SHARD_WEIGHTS } opt_shard;

typedef struct opt_config {
  float lr;                   // peak learning rate
  float min_lr;               // floor of the cosine decay
  int warmup_steps;
  float weight_decay;
  float beta1;
  float beta2;
  float eps;
  float grad_clip;            // global gradient-norm clip; 0 = off
  opt_shard shard;            // parallel.shard: what is sharded over dp (with dp 1 nothing is)
  int shard_prefetch;         // parallel.shard=weights: groups gathered ahead (weight_shard.h)
  int reshard_after_forward;  // bool, parallel.reshard_after_forward: 0 keeps every gathered group from forward to
                              // backward (a slot per group)
  int gather_copy_engine;     // bool, parallel.gather_copy_engine: those gathers on the copy engines, a
                              // communicator (grid_add_gathers, zero-CTA) and a registered slot each
  int update_overlap;         // bool, optimizer.update_overlap: parallel.shard=weights updates each group beside the
                              // next forward (optim_device.c)
  float bucket_mb;            // DP gradient bucket size in MiB
  comm_compress_mode grad_compress;  // DP gradient reduction's format (parallel/step/grad_compress.h)
  int grad_error_feedback;    // bool, resolved: quantisation error carried to the next step
  // optimizer.offload (docs/config.md): state in the backend's host memory. cfg_validate sets
  // offload and offload_cpu from the section's strings.
  int offload;                // bool: offload=host
  int offload_cpu;            // bool: offload_update=cpu (the host's cores update); else the GPU, zero-copy
  float offload_fraction;     // share of the buckets whose state is in host memory
  int offload_delay;          // 1: step k's host update runs during step k + 1 (offload_update=cpu)
  int offload_layer_wait;     // bool: the cpu engine's update finishes in the next forward, layer by layer
  int fp8_param_gather;       // bool, fp8.param_gather: ZeRO gathers FP8 weights as codes (param_gather.h)
  int check_update;           // bool, train.skip_nonfinite > 0: each update is first tried on copies of the state and
                              // refused where it would leave a weight or moment non-finite (optim.c)
} opt_config;

#endif
