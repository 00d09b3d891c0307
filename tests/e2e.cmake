# End-to-end tests of the trainer binary: bitwise resume and crash safety, bad input, and
# checkpoints moved between layouts.
foreach(t resume bad_input layout_resume dry_run)
  add_test(NAME e2e_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_${t}.sh)
  set_tests_properties(e2e_${t} PROPERTIES LABELS "e2e" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endforeach()
