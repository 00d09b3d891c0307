# Layout parity on CPU ranks: each layout against the single-rank run (tests/test_parity.sh).
add_executable(ckpt_compare tests/ckpt_compare.c)
target_link_libraries(ckpt_compare PRIVATE trainer_core)
set(PARITY_PREFIX "")
set(PARITY_LABEL parity)
set(PARITY_ENV "")
trainer_add_parity(tp2 2 parallel.tp=2)
trainer_add_parity(pp2_1f1b 2 parallel.pp=2)
trainer_add_parity(pp2_vpp2 2 parallel.pp=2 parallel.vpp=2)
trainer_add_parity(pp4_vpp2 4 parallel.pp=4 parallel.vpp=2 model.n_layers=8)
# Uneven stages: the last one (head and loss) with fewer layers than the others.
trainer_add_parity(pp2_last1 2 parallel.pp=2 parallel.last_stage_layers=1)
trainer_add_parity(pp2_vpp2_last1 2 parallel.pp=2 parallel.vpp=2 parallel.last_stage_layers=1 model.n_layers=7)
trainer_add_parity(dp2 2 parallel.dp=2)
trainer_add_parity(dp2_distopt 2 parallel.dp=2 parallel.distributed_optimizer=true)
trainer_add_parity(tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true)
trainer_add_parity(tp2_pp2_dp2_sp_vpp2 8 parallel.tp=2 parallel.pp=2 parallel.dp=2 parallel.vpp=2
                   parallel.sequence_parallel=true)
