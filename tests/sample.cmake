# build/sample: the KV-cache decoder against the trainer's step loss, determinism of greedy and
# seeded sampling, stopping at seq_len and bad input.
add_test(NAME e2e_sample COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_sample.sh)
set_tests_properties(e2e_sample PROPERTIES LABELS "e2e" ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
