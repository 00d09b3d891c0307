# Layout parity on GPUs (label gpu): 20 steps of each layout of tests/gpu/parity_gpu.txt against the
# 1-GPU run, within bf16 tolerance (2e-2 relative), through the same script as the CPU parity
# tests: on 2 GPUs over NCCL (gpu_parity_*), and on one GPU shared by both ranks over the staged
# MPI communicator (gpu1_parity_*).
if(TRAINER_HAVE_CUDA)
  set(PARITY_PREFIX gpu_)
  set(PARITY_LABEL gpu)
  set(PARITY_ENV "TRAINER_PARITY_RTOL=2e-2" "TRAINER_TEST_ARGS=train.device=cuda train.steps=20 train.warmup_steps=4")
  file(STRINGS ${CMAKE_SOURCE_DIR}/tests/gpu/parity_gpu.txt layouts REGEX "^[^#]")
  foreach(line ${layouts})
    separate_arguments(args UNIX_COMMAND "${line}")
    list(POP_FRONT args name)
    trainer_add_parity(${name} 2 ${args})
  endforeach()
  # The same layouts with both ranks on one GPU, over the staged MPI communicator
  # (parallel.gpu_comm=mpi): the model's GPU code under every layout where NCCL cannot run.
  set(PARITY_PREFIX gpu1_)
  list(APPEND PARITY_ENV "CUDA_VISIBLE_DEVICES=0")  # one GPU even on a host with more
  foreach(line ${layouts})
    separate_arguments(args UNIX_COMMAND "${line}")
    list(POP_FRONT args name)
    trainer_add_parity(${name} 2 ${args} parallel.gpu_comm=mpi)
  endforeach()

  # FP8: three layouts against 1 GPU, both in FP8 (through TRAINER_TEST_ARGS, which the reference
  # run gets too), on 2 GPUs over NCCL; 5e-2 as in scripts/validate/test_gpu.sh.
  set(PARITY_PREFIX gpu_)
  set(PARITY_ENV "TRAINER_PARITY_RTOL=5e-2"
      "TRAINER_TEST_ARGS=train.device=cuda train.steps=20 train.warmup_steps=4 train.precision=fp8")
  trainer_add_parity(fp8_tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true)
  trainer_add_parity(fp8_pp2_vpp2 2 parallel.pp=2 parallel.vpp=2)
  trainer_add_parity(fp8_dp2_distopt 2 parallel.dp=2 parallel.shard=optimizer)
  trainer_add_parity(fp8_dp2_shard_grads 2 parallel.dp=2 parallel.shard=grads)
  trainer_add_parity(fp8_dp2_shard_weights 2 parallel.dp=2 parallel.shard=weights)
  # Block scaling with the head in FP8, on a model whose tp2 shards keep the single GPU's tiles.
  set(block_args "train.device=cuda train.steps=20 train.warmup_steps=4 train.precision=fp8 fp8.recipe=block fp8.head=true")
  set(PARITY_ENV "TRAINER_PARITY_RTOL=5e-2" "TRAINER_TEST_ARGS=${block_args}")
  trainer_add_parity(fp8_block_tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true model.dim=256 model.n_heads=2
                     model.n_kv_heads=2 model.ffn_dim=512 model.n_layers=2)

  # FP8 weights all-gathered as codes (fp8.param_gather) against the bf16 gather, bitwise: the
  # 2-rank layouts on 2 GPUs over NCCL, and every layout on one GPU over the staged communicator.
  foreach(variant gpu gpu1)
    if(variant STREQUAL gpu)
      set(pg_args dp2 dp2_offload dp2_grads)
      set(pg_env "TRAINER_TEST_ARGS=train.device=cuda")
    else()
      set(pg_args "")
      set(pg_env "TRAINER_TEST_ARGS=train.device=cuda parallel.gpu_comm=mpi" "CUDA_VISIBLE_DEVICES=0")
    endif()
    add_test(NAME ${variant}_param_gather COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_param_gather.sh ${pg_args})
    set_tests_properties(${variant}_param_gather PROPERTIES LABELS gpu ENVIRONMENT
                         "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};${pg_env}")
  endforeach()

  # parallel.tp_overlap: tp2 + SP with peer copies and not overlapped, against NCCL's collectives,
  # bitwise, in bf16 and FP8.
  add_test(NAME gpu_tp_overlap COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_tp_overlap.sh none p2p)
  set_tests_properties(gpu_tp_overlap PROPERTIES LABELS gpu ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda;PRECISIONS=default fp8 reduce_fp32")

  # Non-finite gradients, FP8 amaxes and updates on GPUs: stopped or skipped, every checkpoint finite,
  # a refused update bitwise a NaN gradient's skip (the update's trial on the backend's copies).
  add_test(NAME gpu_nonfinite COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_nonfinite.sh)
  set_tests_properties(gpu_nonfinite PROPERTIES LABELS gpu ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")

  # parallel.shard=weights: the update beside the next forward against the update before it, bitwise.
  add_test(NAME gpu_update_overlap COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_update_overlap.sh)
  set_tests_properties(gpu_update_overlap PROPERTIES LABELS gpu ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")

  # int8 DP gradients against 1 GPU uncompressed, 5e-2 as in scripts/validate/test_gpu.sh.
  set(PARITY_ENV "TRAINER_PARITY_RTOL=5e-2" "TRAINER_TEST_ARGS=train.device=cuda train.steps=20 train.warmup_steps=4")
  trainer_add_parity(dp2_int8_reduce 2 parallel.dp=2 parallel.grad_compress=int8 parallel.bucket_mb=0.05)
  trainer_add_parity(dp2_distopt_int8_reduce 2 parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01
                     parallel.grad_compress=int8)

  # The whole model on CPU fp32 against the GPU in bf16: loss and every parameter gradient.
  trainer_add_test(test_model_gpu tests/gpu/test_model_gpu.c LABELS gpu)
endif()
