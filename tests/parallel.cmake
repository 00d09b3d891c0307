# Tests of the parallel layer: communicator and process grid under 4 MPI ranks, pipeline
# schedule invariants in one process.
trainer_add_test(test_comm tests/test_comm.c NP 4)
trainer_add_test(test_pp_schedule tests/test_pp_schedule.c)
