# Tests of the data module: the shard reader/writer, and the prepare tool end to end.
trainer_add_test(test_data tests/unit/test_data.c)
add_test(NAME test_prepare COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_prepare.sh $<TARGET_FILE:prepare>)
