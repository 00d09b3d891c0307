#!/bin/bash
# The 16-rank layout of configs/7b_tp2_dp4.yaml (tp 2 x dp 4 x pp 2, interleaved) with a tiny
# model on this host's GPU(s): the 16 ranks share them over the staged MPI communicator
# (parallel.gpu_comm=mpi; NCCL needs a GPU per rank), STEPS steps (default 20), and the loss
# curve against one rank of the same model must agree to TRAINER_PARITY_RTOL (default 2e-2: bf16
# activations, another summation order). It checks the layout's arithmetic on GPUs, not speed;
# the two-node launch itself is tested on CPU ranks (tests/e2e/test_two_nodes.sh). Needs trainer in
# BIN_DIR.
#   scripts/validate/validate_16_ranks.sh [BIN_DIR (default build)] [STEPS (default 20)] [OUT_DIR (default runs/validate16)]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(cd "${1:-build}" && pwd)
steps=${2:-20}
out=${3:-runs/validate16}
rtol=${TRAINER_PARITY_RTOL:-2e-2}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off (shared machines)
command -v nvidia-smi > /dev/null && nvidia-smi -L
small="model.dim=64 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=128 model.vocab_size=256
  model.seq_len=32 train.steps=$steps train.warmup_steps=4 train.device=cuda log.eval_every=0 checkpoint.dir= log.every=1"
root=""; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
# shellcheck disable=SC2086
"$bin/trainer" configs/7b_tp2_dp4.yaml $small parallel.tp=1 parallel.pp=1 parallel.vpp=1 parallel.dp=1 \
  parallel.sequence_parallel=false "log.metrics=$out/one_rank.jsonl" > "$out/one_rank.log" 2>&1
# shellcheck disable=SC2086
mpirun $root --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -np 16 "$bin/trainer" \
  configs/7b_tp2_dp4.yaml $small parallel.gpu_comm=mpi "log.metrics=$out/16_ranks.jsonl" > "$out/16_ranks.log" 2>&1
grep -m1 '^layout' "$out/16_ranks.log" || true
python3 - "$out/one_rank.jsonl" "$out/16_ranks.jsonl" "$rtol" <<'PY'
import json, sys
read = lambda p: [json.loads(l) for l in open(p) if '"step"' in l]
a, b, rtol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
d = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
ok = len(a) == len(b) and len(a) > 0 and d <= rtol
print(f"16 ranks against one rank: {len(b)} / {len(a)} steps, largest relative loss difference {d:.2e} (tolerance "
      f"{rtol:g}), final loss {b[-1]['loss']:.6f} / {a[-1]['loss']:.6f}: {'agree' if ok else 'DIFFER'}")
sys.exit(0 if ok else 1)
PY
