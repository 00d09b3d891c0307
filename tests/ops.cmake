# CPU reference kernels: unit test (forward vs naive double loops, backward vs finite
# differences, determinism across thread counts) and the kernel benchmark (not a test).
trainer_add_test(test_ops tests/test_ops.c)
add_executable(bench_ops tests/bench_ops.c)
target_link_libraries(bench_ops PRIVATE trainer_kernels)
