# The profiling scripts' reports, on inputs whose answer is known (no GPU needed).
# scripts/profile/timeline/summary.py (scripts/profile/profile_timeline.sh's report) on a hand-made timeline.
add_test(NAME timeline_summary COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_timeline_summary.sh)
set_tests_properties(timeline_summary PROPERTIES LABELS tools ENVIRONMENT
                     "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
# Includes point only down the layers (README): every #include of the product's sources, and the
# checker itself on a scratch tree with planted violations (so the first cannot pass vacuously).
add_test(NAME include_order COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tools/check_includes.py ${CMAKE_SOURCE_DIR})
add_test(NAME include_order_self_check COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tools/check_includes.py --self-check)
set_tests_properties(include_order include_order_self_check PROPERTIES LABELS tools)
