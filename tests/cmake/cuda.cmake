# CUDA-only programs. The CUDA backend's op tests are the op suite's GPU run
# (test_backend_ops_cuda, tests/cmake/ops.cmake).
if(TRAINER_HAVE_CUDA)
  # The GEMM + attention floor of a training step on one GPU (a benchmark, not a test:
  # scripts/bench/bench_ceiling.sh runs it).
  add_executable(bench_ceiling scripts/bench/bench_ceiling.c)
  target_link_libraries(bench_ceiling PRIVATE trainer_app)
endif()
