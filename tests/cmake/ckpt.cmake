trainer_add_test(test_ckpt tests/unit/test_ckpt.c NP 2)
trainer_add_test(test_ckpt_crc tests/unit/test_ckpt_crc.c)
add_executable(ckpt_damage tests/tools/ckpt_damage.c)
target_link_libraries(ckpt_damage PRIVATE trainer_format)
# Verified checkpoints (a damaged tensor, a non-finite moment, out-of-range attributes, a truncated
# file: named, and skipped by resume=auto) and write errors that end every rank cleanly (a full
# tmpfs where the machine lets the test mount one, and an injected I/O error), on 1 and 2 ranks;
# asynchronous checkpoints against synchronous ones (same files, bitwise resume, failures, a
# stop signal with a write in flight).
foreach(t ckpt_verify ckpt_write_fault ckpt_async)
  add_test(NAME e2e_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_${t}.sh)
  set_tests_properties(e2e_${t} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
