# GPU tests (label gpu, never run by CI, which has no GPU: it runs ctest -LE gpu). They need a
# CUDA build and a visible GPU; without one they fail rather than pass vacuously.
if(TRAINER_HAVE_CUDA)
  trainer_add_test(test_cuda_ops tests/test_cuda_ops.c LABELS gpu)
  # The GEMM + attention floor of a training step on one GPU (a benchmark, not a test:
  # scripts/bench_ceiling.sh runs it).
  add_executable(bench_ceiling tests/bench_ceiling.c)
  target_link_libraries(bench_ceiling PRIVATE trainer_app)
endif()
