# Hugging Face interop: the JSON reader, safetensors reader and writer, names and config.json
# checks (unit test); export and import end to end, the round trip bitwise under three layouts
# and read back by an independent reader (numpy); the bad inputs of both directions; and
# model.from (the model section from a config.json) with and without init_from.
trainer_add_test(test_safetensors tests/unit/test_safetensors.c)
foreach(t hf_interop hf_bad_input model_from)
  add_test(NAME e2e_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_${t}.sh)
  set_tests_properties(e2e_${t} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
