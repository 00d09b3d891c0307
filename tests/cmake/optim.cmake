# Multi-tensor optimizer ops: the CPU reference against the per-tensor kernels (bitwise). Each
# backend's ops against this reference are rows of the op suite (tests/cmake/ops.cmake).
trainer_add_test(test_optim_ranges tests/unit/test_optim_ranges.c)
# The CPU AdamW against a plain copy of as many bytes (a benchmark, not a test;
# scripts/bench/bench_adamw.py runs it beside PyTorch's AdamW).
add_executable(bench_adamw scripts/bench/bench_adamw.c)
target_link_libraries(bench_adamw PRIVATE trainer_kernels)
