# CPU reference kernels: unit test (forward vs naive double loops, backward vs finite
# differences, determinism across thread counts) and the kernel benchmark (not a test).
trainer_add_test(test_ops tests/unit/test_ops.c)
add_executable(bench_ops scripts/bench/bench_ops.c)
target_link_libraries(bench_ops PRIVATE trainer_kernels)
# The op suite: every op of the backend table (kernels/backend.h) against the CPU reference, one
# table of cases run on every backend present, with a coverage report that fails on an op
# without a case. On the CPU backend (exact: its ops are the reference) in CI; with a CUDA build
# also on the CUDA backend with fp32 and bf16 activations (label gpu, never run by CI, which has
# no GPU: it runs ctest -LE gpu; without a visible GPU it fails rather than pass vacuously).
trainer_add_test(test_backend_ops tests/unit/test_backend_ops.c)
if(TRAINER_HAVE_CUDA)
  add_test(NAME test_backend_ops_cuda COMMAND test_backend_ops --backend cuda)
  set_tests_properties(test_backend_ops_cuda PROPERTIES LABELS gpu ENVIRONMENT
                       "OMP_NUM_THREADS=1;TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
