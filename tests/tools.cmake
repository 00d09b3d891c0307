# The profiling scripts' reports, on inputs whose answer is known (no GPU needed).
# scripts/timeline/summary.py (scripts/profile_timeline.sh's report) on a hand-made timeline.
add_test(NAME timeline_summary COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_timeline_summary.sh)
set_tests_properties(timeline_summary PROPERTIES LABELS tools ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
