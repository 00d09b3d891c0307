# Optimizer state in host memory (optimizer.offload=host) on CPU ranks: both engines at fraction
# 1 and 0.5 against the run without offload (bitwise), bitwise resume with offload, and resume
# switching offload off and on, the cpu engine's update finished layer by layer in the next
# forward against the whole update (bitwise), and the pinned host memory the run reports and
# --dry-run plans (tests/e2e/test_offload.sh), on one rank and on dp2 with the distributed optimizer
# (the host share's master weights and moments sharded over dp).
set(OFFLOAD_ONE 1)
set(OFFLOAD_DP2_DISTOPT 2 parallel.dp=2 parallel.shard=optimizer)
set(OFFLOAD_DP2_GRADS 2 parallel.dp=2 parallel.shard=grads)
set(OFFLOAD_DP2_WEIGHTS 2 parallel.dp=2 parallel.shard=weights)
foreach(t ONE DP2_DISTOPT DP2_GRADS DP2_WEIGHTS)
  string(TOLOWER ${t} name)
  add_test(NAME offload_${name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_offload.sh ${name} ${OFFLOAD_${t}})
  set_tests_properties(offload_${name} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
# Bad values and combinations of the optimizer section, and a node without the memory.
add_test(NAME offload_bad_input COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_offload_bad_input.sh)
set_tests_properties(offload_bad_input PROPERTIES LABELS "e2e" ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
# On GPUs (label gpu; scripts/validate/test_gpu.sh runs the same): both engines against the on-GPU
# optimizer within 2e-2 relative, resume with offload bitwise.
if(TRAINER_HAVE_CUDA)
  foreach(t ONE DP2_DISTOPT DP2_GRADS DP2_WEIGHTS)
    string(TOLOWER ${t} name)
    add_test(NAME gpu_offload_${name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_offload.sh ${name} ${OFFLOAD_${t}})
    set_tests_properties(gpu_offload_${name} PROPERTIES LABELS gpu ENVIRONMENT
                         "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_OFFLOAD_RTOL=2e-2;TRAINER_TEST_ARGS=train.device=cuda")
  endforeach()
endif()
