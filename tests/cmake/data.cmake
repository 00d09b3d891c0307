# Tests of the data module: the shard reader/writer, and the prepare tool end to end.
trainer_add_test(test_data tests/unit/test_data.c)
add_test(NAME test_prepare COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_prepare.sh $<TARGET_FILE:prepare>)
# Megatron indexed datasets: training on one equals training on the native shard of the same
# tokens, bit for bit; damaged ones get their one-line errors.
add_test(NAME e2e_data_megatron COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_data_megatron.sh)
set_tests_properties(e2e_data_megatron PROPERTIES LABELS "e2e" ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
# Byte-level BPE tokenizers (tokenizer.json) against the fixtures of tests/fixtures/bpe.
trainer_add_test(test_bpe tests/unit/test_bpe.c)
# The tokenizer end to end: prepare, train, sample and export_hf with it.
add_test(NAME e2e_tokenizer COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_tokenizer.sh)
set_tests_properties(e2e_tokenizer PROPERTIES LABELS "e2e" ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
