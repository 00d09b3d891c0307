# The communicator suite (tests/unit/test_comm.c, built by parallel.cmake) over the NCCL, staged and
# peer communicators, the hang-to-message timeout test, and the commbench tool. They build wherever a
# CUDA toolkit is found, so CI compiles them; the tests carry the label gpu, and the NCCL ones
# need one GPU per rank.
if(TRAINER_HAVE_CUDA)
  add_test(NAME test_comm_nccl COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm> --comm nccl)
  set_tests_properties(test_comm_nccl PROPERTIES LABELS gpu ENVIRONMENT "OMP_NUM_THREADS=1")
  # Rank 0 waits in a barrier rank 1 never joins: the job must end (not hang) with a message
  # naming the group, the operation and the timeout (2 s, given at the communicator's creation).
  add_test(NAME test_comm_nccl_timeout COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm> --comm nccl
           --timeout-check)
  set_tests_properties(test_comm_nccl_timeout PROPERTIES LABELS gpu TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "group 'stuck' barrier did not complete within 2 s")

  # The staged MPI communicator (parallel.gpu_comm=mpi) through the same suite; one GPU will do.
  add_test(NAME test_comm_staged COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm> --comm staged)
  set_tests_properties(test_comm_staged PROPERTIES LABELS gpu TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")

  # The peer copies of parallel.tp_overlap=p2p through the same suite: two GPUs with peer access.
  add_test(NAME test_comm_peer COMMAND ${TRAINER_MPIRUN} -np 2 $<TARGET_FILE:test_comm> --comm peer)
  set_tests_properties(test_comm_peer PROPERTIES LABELS gpu TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1")

  add_executable(commbench parallel/comm/nccl/commbench.c)
  target_link_libraries(commbench PRIVATE trainer_comm_nccl)
endif()
