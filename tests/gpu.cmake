# Layout parity on GPUs (label gpu, 2 GPUs): 20 steps of each layout against the 1-GPU run,
# within bf16 tolerance (2e-2 relative), through the same script as the CPU parity tests.
if(TRAINER_HAVE_CUDA)
  set(PARITY_PREFIX gpu_)
  set(PARITY_LABEL gpu)
  set(PARITY_ENV "TRAINER_PARITY_RTOL=2e-2" "TRAINER_TEST_ARGS=train.device=cuda train.steps=20 train.warmup_steps=4")
  trainer_add_parity(tp2 2 parallel.tp=2)
  trainer_add_parity(pp2_1f1b 2 parallel.pp=2)
  trainer_add_parity(pp2_vpp2 2 parallel.pp=2 parallel.vpp=2)
  trainer_add_parity(dp2 2 parallel.dp=2)
  trainer_add_parity(dp2_distopt 2 parallel.dp=2 parallel.distributed_optimizer=true)
  trainer_add_parity(dp2_distopt_buckets 2 parallel.dp=2 parallel.distributed_optimizer=true parallel.bucket_mb=0.01
                     parallel.dp_overlap_ctas=4)
  trainer_add_parity(dp2_distopt_tied 2 parallel.dp=2 parallel.distributed_optimizer=true parallel.bucket_mb=0.01
                     model.tie_embeddings=true)
  trainer_add_parity(dp2_distopt_bf16_reduce 2 parallel.dp=2 parallel.distributed_optimizer=true parallel.bucket_mb=0.01
                     parallel.grad_reduce_bf16=true)
  trainer_add_parity(pp2_vpp2_bf16_comm 2 parallel.pp=2 parallel.vpp=2 parallel.pp_comm_bf16=true)
  trainer_add_parity(tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true)

  # The whole model on CPU fp32 against the GPU in bf16: loss and every parameter gradient.
  trainer_add_test(test_model_gpu tests/test_model_gpu.c LABELS gpu)
endif()
