# build/sample: the KV-cache decoder against the trainer's step loss, determinism of greedy and
# seeded sampling, stopping at seq_len and bad input (on the CPU backend).
add_test(NAME e2e_sample COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_sample.sh)
set_tests_properties(e2e_sample PROPERTIES LABELS "e2e" ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
# On a GPU (label gpu): the same decoder on the CUDA backend against the CPU backend from one
# checkpoint of the default model: the stream loss to 1e-5 and greedy text equal.
if(TRAINER_HAVE_CUDA)
  add_test(NAME gpu_sample COMMAND sh ${CMAKE_SOURCE_DIR}/tests/gpu/test_sample_gpu.sh)
  set_tests_properties(gpu_sample PROPERTIES LABELS gpu ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endif()
