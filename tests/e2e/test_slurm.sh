#!/bin/sh
# The README's Slurm line on a two-node Slurm cluster that this test starts on this machine:
#   srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 build/trainer configs/7b_tp2_dp4.yaml
# with only the model shrunk by overrides (tiny dims, 6 steps, CPU ranks). Checks that the loss
# curve equals the single-rank run's (1e-5), that every rank's layout line (--print-layout)
# agrees with what srun told it (SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME), that every tp
# group sits on one node, that the step-3 checkpoint resumes under srun on one node of 8 ranks
# (parallel.dp=0), and that srun without a PMI plugin (--mpi=none: 2 tasks that MPI does not
# connect) fails with a message instead of training twice alone.
#
# The cluster (Debian 12's slurm-wlm 22.05, installed here if missing; root only, exit 77 =
# skipped otherwise): slurmctld and two slurmd (node0, node1) on this host, ports, state, logs,
# spool and PMIx directories all under the test's temporary folder; auth/none (no munge);
# MpiDefault=pmix, so srun connects Open MPI's ranks through PMIx as on a real cluster. Two
# slurmd on one host need their own TmpFS (%n) or their PMIx folders collide. The GPU request
# needs a gres/gpu of 8 per node: 8 stand-in device nodes (mknod, aliases of /dev/null) in the
# temporary folder; where mknod is refused the test runs the line without --gpus-per-node.
# As with mpirun's two nodes (tests/e2e/test_two_nodes.sh), the ranks talk TCP over loopback:
# Open MPI's shared memory would collide between two "nodes" of one host name.
. "$(dirname "$0")/lib.sh"
if [ "$(id -u)" != 0 ]; then echo "skipped: starting slurmd needs root"; exit 77; fi
if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v srun > /dev/null; then
  echo "installing slurm-wlm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm > "$WORK/apt.log" 2>&1 ||
    { apt-get update -qq > /dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm > "$WORK/apt.log" 2>&1; } ||
    { fail "apt-get install slurm-wlm: $(tail -3 "$WORK/apt.log")"; summary; exit 1; }
fi
make_corpus
S="$WORK/slurm"
mkdir -p "$S/state" "$S/log" "$S/spool/node0" "$S/spool/node1" "$S/tmp/node0" "$S/tmp/node1" "$S/dev" "$WORK/tmp"
host=$(hostname -s)
port=$((20000 + ($$ % 4000) * 4))
gres="" gpus=""
if (for i in 0 1 2 3 4 5 6 7; do mknod "$S/dev/gpu$i" c 1 3 2> /dev/null || exit 1; done); then
  gres="Gres=gpu:8"; gpus="--gpus-per-node 8"
  echo "NodeName=node[0-1] Name=gpu File=$S/dev/gpu[0-7]" > "$S/gres.conf"
else
  echo "note: mknod refused; the cluster has no gres/gpu and srun runs without --gpus-per-node"
fi
cat > "$S/slurm.conf" <<EOF
ClusterName=trainertest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/none
CredType=cred/none
${gres:+GresTypes=gpu}
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
TmpFS=$S/tmp/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=node[0-1] NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2))-$((port + 3)) CPUs=8 $gres State=UNKNOWN
PartitionName=test Nodes=node[0-1] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$S/slurm.conf"
# Stop the daemons this test started (by their pid files), then remove the folder.
stop_slurm() {
  for f in "$S"/slurmd.node0.pid "$S"/slurmd.node1.pid "$S"/slurmctld.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2> /dev/null
  done
  sleep 1
  for f in "$S"/slurmd.node0.pid "$S"/slurmd.node1.pid "$S"/slurmctld.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2> /dev/null
  done
  rm -rf "$WORK"
}
trap stop_slurm EXIT
slurmctld -f "$S/slurm.conf" -i || fail "slurmctld did not start: $(tail -5 "$S/log/slurmctld.log")"
sleep 1
slurmd -f "$S/slurm.conf" -N node0 && slurmd -f "$S/slurm.conf" -N node1 || fail "slurmd did not start"
up=0
for _ in $(seq 30); do
  [ "$(sinfo -h -o '%D %t' 2> /dev/null)" = "2 idle" ] && up=1 && break
  sleep 1
done
if [ "$up" = 1 ]; then pass "two-node Slurm cluster up: $(sinfo -h -o '%P %D %t %N %G')"; else
  fail "cluster not up: $(sinfo 2>&1 | tail -2) $(tail -3 "$S/log/slurmctld.log")"; summary; exit 1; fi

# The tasks' environment: loopback TCP between the two "nodes", no busy polling on 2 cores,
# Open MPI's session files in the test's folder.
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=127.0.0.0/8 OMPI_MCA_oob_tcp_if_include=127.0.0.0/8
export OMPI_MCA_mpi_yield_when_idle=1 TMPDIR="$WORK/tmp"
CONFIG="$SRC/configs/7b_tp2_dp4.yaml"
SHRINK="model.dim=64 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=128 model.vocab_size=256
  model.seq_len=32 train.steps=6 train.warmup_steps=2 train.device=cpu log.eval_every=0 checkpoint.every=3
  checkpoint.keep=0"
# trainer NAME LAUNCH... -- ARGS...
trainer() {
  local name=$1 launch=""
  shift
  while [ "$1" != "--" ]; do launch="$launch $1"; shift; done
  shift
  mkdir -p "$WORK/$name"
  # shellcheck disable=SC2086
  timeout 300 $launch "$TRAINER" "$CONFIG" $SHRINK "data.train=$WORK/data/train_*.bin" "data.val=$WORK/data/val_*.bin" \
    "log.metrics=$WORK/$name/metrics.jsonl" "checkpoint.dir=$WORK/$name/ckpt" "$@" > "$WORK/$name/log" 2>&1 < /dev/null
}
trainer reference -- parallel.tp=1 parallel.pp=1 parallel.vpp=1 parallel.dp=1 parallel.sequence_parallel=false ||
  fail "single-rank run: $(tail -5 "$WORK/reference/log")"
t0=$(date +%s)
# On a loaded machine the PMIx server of a stand-in node can drop a task's connection while the
# 16 tasks start, or Open MPI's TCP transport can fail while the tasks connect (start_fault in
# tests/e2e/lib.sh): such a launch, and only such a one, is tried again (launch_retried).
srun16() {
  # shellcheck disable=SC2086
  trainer srun16 srun --nodes 2 --ntasks-per-node 8 $gpus -- --print-layout
}
if launch_retried srun16; then
  pass "srun --nodes 2 --ntasks-per-node 8 $gpus trainer configs/7b_tp2_dp4.yaml: $(($(date +%s) - t0)) s"
else
  fail "srun run"; tail -30 "$WORK/srun16/log"
fi
same_losses reference srun16 1e-5 && pass "srun losses equal the single rank's (rtol 1e-5)" || fail "srun losses"
if python3 - "$WORK/srun16/log" <<'PY'; then pass "layout: ranks, local ranks and nodes as srun says; tp groups inside a node"; else fail "layout under srun"; fi
import sys
text = open(sys.argv[1]).read()
rows = {}
for line in text.splitlines():
    if line.startswith("layout rank="):
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        rows[int(f["rank"])] = f
bad = []
def check(cond, what):
    if not cond: bad.append(what)
check(sorted(rows) == list(range(16)), "a layout line for each of the 16 ranks")
check({f["launcher_node"] for f in rows.values()} == {"node0", "node1"}, "SLURMD_NODENAME node0 and node1")
for r, f in rows.items():
    check(f["launcher"] == "srun" and int(f["launcher_rank"]) == r, f"rank {r}: SLURM_PROCID {f['launcher_rank']}")
    check(int(f["launcher_local_rank"]) == int(f["local_rank"]) == r % 8,
          f"rank {r}: SLURM_LOCALID {f['launcher_local_rank']}, trainer {f['local_rank']}")
    check(int(f["local_size"]) == 8, f"rank {r}: local_size {f['local_size']}")
    for s, g in rows.items():
        check((f["node"] == g["node"]) == (f["launcher_node"] == g["launcher_node"]), f"ranks {r}, {s}: nodes differ")
    lead = rows[2 * (int(f["dp"]) + 4 * int(f["pp"]))]
    check(f["launcher_node"] == lead["launcher_node"], f"rank {r}: its tp group leaves {lead['launcher_node']}")
check("layout: 16 ranks on 2 nodes (8 per node), launcher srun; every tp group within one node" in text, "summary line")
check("warning:" not in text, "no warnings")
print("\n".join(bad[:20]) or "layout checked: 16 ranks on node0 and node1")
sys.exit(1 if bad else 0)
PY
ck="$WORK/srun16/ckpt/ckpt_00000003.h5"
resume8() { trainer resume8 srun --nodes 1 --ntasks 8 -- parallel.dp=0 "checkpoint.resume=$ck"; }
launch_retried resume8 ||
  fail "resume under srun on 8 ranks: $(tail -5 "$WORK/resume8/log")"
grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/resume8/log" && pass "resumed under srun on 8 ranks (parallel.dp=0)" ||
  fail "no resume under srun on 8 ranks"
same_losses reference resume8 1e-5 && pass "8-rank losses after resume" || fail "8-rank losses after resume"
# srun without a PMI plugin: MPI does not connect the tasks. Open MPI refuses in MPI_Init
# itself; with a library that starts each task alone, the trainer refuses (tests/unit/test_launch.c
# and tests/e2e/test_bad_input.sh set srun's variables by hand for that path). No task may train.
if trainer nopmi srun --mpi=none --nodes 1 --ntasks 2 --; then fail "srun --mpi=none ran"
elif grep -q "^step " "$WORK/nopmi/log"; then fail "srun --mpi=none: a task trained alone"
elif grep -q -e "srun --mpi=pmix" -e "direct launched using \"srun\"" "$WORK/nopmi/log"; then
  pass "srun without PMI refused: $(grep -m1 -e "error: srun" -e "direct launched" "$WORK/nopmi/log")"
else fail "srun --mpi=none: $(tail -3 "$WORK/nopmi/log")"; fi
summary
