# Layout parity on CPU ranks: each layout against the single-rank run (tests/test_parity.sh).
add_executable(ckpt_compare tests/ckpt_compare.c)
target_link_libraries(ckpt_compare PRIVATE trainer_core)
function(trainer_add_parity name np)
  add_test(NAME parity_${name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_parity.sh ${name} ${np} ${ARGN})
  set_tests_properties(parity_${name} PROPERTIES LABELS "parity" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR}")
endfunction()
trainer_add_parity(tp2 2 parallel.tp=2)
trainer_add_parity(pp2_1f1b 2 parallel.pp=2)
trainer_add_parity(pp2_vpp2 2 parallel.pp=2 parallel.vpp=2)
trainer_add_parity(pp4_vpp2 4 parallel.pp=4 parallel.vpp=2 model.n_layers=8)
trainer_add_parity(dp2 2 parallel.dp=2)
trainer_add_parity(dp2_distopt 2 parallel.dp=2 parallel.distributed_optimizer=true)
trainer_add_parity(tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true)
trainer_add_parity(tp2_pp2_dp2_sp_vpp2 8 parallel.tp=2 parallel.pp=2 parallel.dp=2 parallel.vpp=2
                   parallel.sequence_parallel=true)
