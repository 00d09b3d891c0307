#!/bin/bash
# The 16-rank layout of configs/7b_tp2_dp4.yaml (tp 2 x dp 4 x pp 2, interleaved; two nodes of
# 8) with a tiny model on this host's GPU(s): tests/test_two_nodes.sh with the CUDA backend.
# The two nodes are simulated on this host as in that test (docs/multinode.md, section 7); the
# 16 ranks share the GPU(s) over the staged MPI communicator (parallel.gpu_comm=mpi: NCCL needs
# a GPU per rank), each picking GPU local_rank % GPUs. STEPS steps (default 20); the loss curve
# and final weights against one GPU within TRAINER_PARITY_RTOL (default 2e-2: bf16 activations),
# the layout against Open MPI's map, and the step-3 checkpoint resumed on 8 ranks and on one.
# It checks the layout on GPUs, not speed. Needs trainer, prepare and ckpt_compare in BIN_DIR.
#   scripts/validate_two_nodes.sh [BIN_DIR (default build)] [STEPS (default 20)]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${1:-build}" && pwd)
steps=${2:-20}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off (shared machines)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export TRAINER_SOURCE_DIR=$PWD TRAINER_BUILD_DIR=$bin TRAINER_PARITY_RTOL=${TRAINER_PARITY_RTOL:-2e-2}
export TRAINER_MPIRUN_ARGS="-x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
export TRAINER_TEST_ARGS="train.device=cuda parallel.gpu_comm=mpi train.steps=$steps train.warmup_steps=4"
command -v nvidia-smi > /dev/null && nvidia-smi -L
sh tests/test_two_nodes.sh
