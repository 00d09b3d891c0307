# Multi-tensor optimizer ops: the CPU reference against the per-tensor kernels (bitwise). Each
# backend's ops against this reference are rows of the op suite (tests/ops.cmake).
trainer_add_test(test_optim_ranges tests/test_optim_ranges.c)
