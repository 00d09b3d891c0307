# Multi-tensor optimizer ops: the CPU reference against the per-tensor kernels (bitwise), and
# with a CUDA build the GPU ops against it (label gpu).
trainer_add_test(test_optim_ranges tests/test_optim_ranges.c)
if(TRAINER_HAVE_CUDA)
  add_test(NAME test_optim_ranges_gpu COMMAND test_optim_ranges --gpu)
  set_tests_properties(test_optim_ranges_gpu PROPERTIES LABELS gpu)
endif()
