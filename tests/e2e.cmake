# End-to-end tests of the trainer binary: bitwise resume (one rank, and dp2 with the distributed
# optimizer) and crash safety, bad input,
# checkpoints moved between layouts, the dry-run plans, bitwise activation recomputation, and
# the 8-GPU validation script on CPU ranks.
foreach(t resume resume_zero bad_input layout_resume dry_run recompute validate_8gpu)
  add_test(NAME e2e_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_${t}.sh)
  set_tests_properties(e2e_${t} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
# Kill a rank of a 2-rank dp2 run: the job must end with a message (label e2e on CPU ranks;
# the GPU variant, label gpu, trains with train.device=cuda and relies on NCCL's watchdog too).
add_test(NAME e2e_kill_rank COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_kill_rank.sh)
set_tests_properties(e2e_kill_rank PROPERTIES LABELS "e2e" TIMEOUT 300 ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
if(TRAINER_HAVE_CUDA)
  add_test(NAME gpu_kill_rank COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_kill_rank.sh)
  set_tests_properties(gpu_kill_rank PROPERTIES LABELS gpu TIMEOUT 300 ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")
  add_test(NAME gpu_resume_zero COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_resume_zero.sh)
  set_tests_properties(gpu_resume_zero PROPERTIES LABELS gpu ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_TEST_ARGS=train.device=cuda")
endif()
