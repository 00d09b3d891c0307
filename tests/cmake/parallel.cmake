# Tests of the parallel layer: the communicator suite and process grid over the MPI communicator
# under 4 ranks (nccl.cmake runs the same suite over NCCL and staged on GPUs), where ranks run,
# pipeline schedule invariants in one process.
trainer_add_test(test_comm tests/unit/test_comm.c NP 4 ARGS --comm mpi)
trainer_add_test(test_pp_schedule tests/unit/test_pp_schedule.c)
# Where ranks run: the launchers' environments set by hand (srun, mpirun, hydra), MPI's view of
# the node and the start-up layout report, under 4 ranks.
trainer_add_test(test_launch tests/unit/test_launch.c NP 4)
# A tool: every rank's schedule as text, for scripts/bench/pp_bubble_model.py.
add_executable(pp_schedule_dump tests/tools/pp_schedule_dump.c)
target_link_libraries(pp_schedule_dump PRIVATE trainer_step)
# The schedules on model clocks (equal stages, free transfers): every rank idle exactly the
# theoretical (p-1)/(v*m+p-1), for 1F1B and interleaved shapes up to pp 8.
add_test(NAME pp_bubble_theory COMMAND python3 ${CMAKE_SOURCE_DIR}/scripts/bench/pp_bubble_model.py --bin ${CMAKE_BINARY_DIR}
         --check-theory)
set_tests_properties(pp_bubble_theory PROPERTIES LABELS parallel)
