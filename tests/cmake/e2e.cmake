# End-to-end tests of the trainer binary: bitwise resume (one rank, and three 2-rank layouts) and
# crash safety, bad input, checkpoints moved between layouts, the dry-run plans, bitwise
# activation recomputation, the 8-GPU validation script on CPU ranks, the FP8 weights gathered as
# codes against the bf16 gather (bitwise), and the 16-rank headline command on two nodes simulated
# on this machine, TensorBoard event files against the metrics file, and the sharded gradients'
# and weights modes against the sharded optimizer (bitwise), their timing and their refusals, and
# the weights mode's update beside the next forward against the update before the step's end, and
# tp2 + SP with its collectives not overlapped against overlapped (bitwise).
foreach(t resume bad_input data_change preempt huge_grad nonfinite layout_resume dry_run recompute validate_8gpu
        two_nodes fp8_eval compress_resume param_gather tensorboard shard update_overlap tp_overlap)
  add_test(NAME e2e_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_${t}.sh)
  set_tests_properties(e2e_${t} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
# 16 ranks and Open MPI's daemons over loopback: alone, not beside other MPI jobs.
set_tests_properties(e2e_two_nodes PROPERTIES RUN_SERIAL TRUE)
# The README's srun line on a two-node Slurm cluster the test starts here (root; it installs
# slurm-wlm when missing, and is skipped without root).
add_test(NAME e2e_slurm COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_slurm.sh)
set_tests_properties(e2e_slurm PROPERTIES LABELS "e2e" SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL TRUE ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
set(RESUME_ZERO parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01)
# The gradients sharded too: two micro-batches a step, each layer reduce-scattered from its slot.
set(RESUME_GRADS parallel.dp=2 parallel.shard=grads train.micro_batch=1)
set(RESUME_TP2_SP parallel.tp=2 parallel.sequence_parallel=true)
set(RESUME_PP2_VPP2_OVERLAP parallel.pp=2 parallel.vpp=2 parallel.pp_overlap=true parallel.pp_comm_bf16=true)
# FP8: the scaling state (scales and amax histories) resumes bitwise too; pp2 with the head in FP8
# (its state written by the last stage alone).
set(RESUME_FP8_ZERO train.precision=fp8 parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01)
set(RESUME_FP8_GRADS train.precision=fp8 parallel.dp=2 parallel.shard=grads)
set(RESUME_FP8_TP2_SP train.precision=fp8 parallel.tp=2 parallel.sequence_parallel=true fp8.amax_history=4)
set(RESUME_FP8_PP2_VPP2 train.precision=fp8 parallel.pp=2 parallel.vpp=2 fp8.head=true)
# The FP8 weights all-gathered as codes (fp8.param_gather): their copies after a resume are cast
# from the loaded weights, bit for bit the gathered ones.
set(RESUME_FP8_PGATHER train.precision=fp8 parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01
    fp8.param_gather=true)
# Compressed DP gradients: error feedback's residual (per dp rank) resumes bitwise too.
set(RESUME_INT8_EF parallel.dp=2 parallel.grad_compress=int8 parallel.bucket_mb=0.05)
set(RESUME_FP16_EF_ZERO parallel.dp=2 parallel.shard=optimizer parallel.bucket_mb=0.01
    parallel.grad_compress=fp16 parallel.grad_error_feedback=on)
foreach(t ZERO GRADS TP2_SP PP2_VPP2_OVERLAP FP8_ZERO FP8_GRADS FP8_TP2_SP FP8_PP2_VPP2 FP8_PGATHER INT8_EF FP16_EF_ZERO)
  string(TOLOWER ${t} name)
  add_test(NAME e2e_resume_${name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_resume_layout.sh ${name} ${RESUME_${t}})
  set_tests_properties(e2e_resume_${name} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
# Kill a rank of a 2-rank dp2 run: the job must end with a message (label e2e on CPU ranks;
# the GPU variant, label gpu, trains with train.device=cuda and relies on NCCL's watchdog too).
add_test(NAME e2e_kill_rank COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_kill_rank.sh)
set_tests_properties(e2e_kill_rank PROPERTIES LABELS "e2e" TIMEOUT 300 ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
if(TRAINER_HAVE_CUDA)
  add_test(NAME gpu_kill_rank COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_kill_rank.sh)
  set_tests_properties(gpu_kill_rank PROPERTIES LABELS gpu TIMEOUT 300 ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")
  # The same with tp2 + SP on peer copies (parallel.tp_overlap=p2p): the survivor waits on the GPU
  # for copies that never come; 2 GPUs with peer access.
  add_test(NAME gpu_kill_rank_p2p COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_kill_rank.sh)
  set_tests_properties(gpu_kill_rank_p2p PROPERTIES LABELS gpu TIMEOUT 300 ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda parallel.dp=1 parallel.tp=2 parallel.sequence_parallel=true parallel.tp_overlap=p2p")
  foreach(t ZERO GRADS TP2_SP PP2_VPP2_OVERLAP INT8_EF FP8_PGATHER)
    string(TOLOWER ${t} name)
    add_test(NAME gpu_resume_${name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_resume_layout.sh ${name} ${RESUME_${t}})
    set_tests_properties(gpu_resume_${name} PROPERTIES LABELS gpu ENVIRONMENT
                         "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")
  endforeach()
endif()
