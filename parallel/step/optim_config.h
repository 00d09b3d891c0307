// The optimizer's configuration: AdamW's hyper-parameters and how gradients are synchronised
// over data-parallel ranks. app/config.c fills it from the run's config (keys of the train and
// parallel sections, docs/config.md).
#ifndef TRAINER_OPTIM_CONFIG_H
#define TRAINER_OPTIM_CONFIG_H

#include "parallel/comm/compress.h"  // comm_compress_mode

typedef struct opt_config {
  float lr;                   // peak learning rate
  float min_lr;               // floor of the cosine decay
  int warmup_steps;
  float weight_decay;
  float beta1;
  float beta2;
  float eps;
  float grad_clip;            // global gradient-norm clip; 0 = off
  int distributed_optimizer;  // bool: ZeRO-1 over dp
  float bucket_mb;            // DP gradient bucket size in MiB
  comm_compress_mode grad_compress;  // DP gradient reduction's format (parallel/step/grad_compress.h)
  int grad_error_feedback;    // bool, resolved: quantisation error carried to the next step
} opt_config;

#endif
