# NCCL communicator (parallel/nccl): its 2-rank GPU test, the hang-to-message timeout test, and
# the commbench tool, and the staged MPI communicator's test. They build wherever a CUDA toolkit
# is found, so CI compiles them; the tests carry the label gpu, and the NCCL ones need one GPU
# per rank.
if(TRAINER_HAVE_CUDA)
  trainer_add_test(test_comm_nccl tests/test_comm_nccl.c NP 2 LABELS gpu)
  # Rank 0 waits in a barrier rank 1 never joins: the job must end (not hang) with a message
  # naming the group, the operation and the timeout.
  add_test(NAME test_comm_nccl_timeout COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm_nccl> --timeout-check)
  set_tests_properties(test_comm_nccl_timeout PROPERTIES LABELS gpu TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "group 'stuck' barrier did not complete within 2 s")

  # The staged MPI communicator (parallel.gpu_comm=mpi) through the same checks; one GPU will do.
  add_test(NAME test_comm_staged COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm_nccl> --staged)
  set_tests_properties(test_comm_staged PROPERTIES LABELS gpu TIMEOUT 300)

  add_executable(commbench parallel/comm/nccl/commbench.c)
  target_link_libraries(commbench PRIVATE trainer_comm_nccl)
endif()
