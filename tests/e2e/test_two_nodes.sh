#!/bin/sh
# The headline command on two nodes of 8 ranks, simulated on this one machine:
#   mpirun -np 16 --hostfile HOSTS --map-by ppr:8:node build/trainer configs/7b_tp2_dp4.yaml
# with only the model shrunk by overrides (tiny dims, 6 steps, CPU ranks). Checks that the loss
# curve and final weights equal the single-rank run's (1e-5), that the trainer's per-rank layout
# (--print-layout) matches Open MPI's map (--display-map: which rank on which node) and its
# OMPI_COMM_WORLD_LOCAL_RANK, that every tp group sits on one node, that a checkpoint of the
# 16-rank run resumes on 8 ranks (parallel.dp=0: tp2 pp2 dp2) and on one, and that the config on
# 8 ranks without parallel.dp=0 is refused with a message naming 16 ranks and the override.
#
# Two nodes on one machine, Open MPI 4.1: it folds every name of this machine (localhost,
# 127.0.0.1, the host name, any alias in /etc/hosts) into one node, so
# `--host localhost:8,127.0.0.1:8 --map-by ppr:8:node` is refused ("more processes than the ppr
# for this topology can support"). Names that do not resolve here (node0, node1) are remote to
# it: mpirun starts one orted per name through plm_rsh_agent, here a stand-in for ssh that runs
# the orted on this machine. Each orted is a node to Open MPI and to MPI_COMM_TYPE_SHARED, with
# local ranks 0-7. Shared memory (btl vader) stays off, since both "nodes" would name their
# segments after the same host and collide: ranks talk TCP over the loopback interface. Open MPI
# sees 8 slots per node and does not know that 16 ranks share 2 cores: mpi_yield_when_idle.
#
# TRAINER_TEST_ARGS and TRAINER_PARITY_RTOL apply; on GPU hosts scripts/validate/validate_16_ranks.sh
# checks the same layout's arithmetic on one node.
. "$(dirname "$0")/lib.sh"
make_corpus
rtol=${TRAINER_PARITY_RTOL:-1e-5}
CONFIG="$SRC/configs/7b_tp2_dp4.yaml"
SHRINK="model.dim=64 model.n_layers=4 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=128 model.vocab_size=256
  model.seq_len=32 train.steps=6 train.warmup_steps=2 train.device=cpu log.eval_every=0 checkpoint.every=3
  checkpoint.keep=0"
ONE_RANK="parallel.tp=1 parallel.pp=1 parallel.vpp=1 parallel.dp=1 parallel.sequence_parallel=false"

cat > "$WORK/ssh" <<'EOF'
#!/bin/sh
# ssh stand-in for Open MPI's plm_rsh_agent: skip the options and the host, run the command here.
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
shift
exec sh -c "$*"
EOF
chmod +x "$WORK/ssh"
printf 'node0 slots=8\nnode1 slots=8\n' > "$WORK/hosts"
TWO_NODES="--mca plm_rsh_agent $WORK/ssh --mca btl self,tcp --mca btl_tcp_if_include 127.0.0.0/8
  --mca oob_tcp_if_include 127.0.0.0/8 --mca mpi_yield_when_idle 1 --bind-to none -x OMP_NUM_THREADS"
[ "$(id -u)" = 0 ] && TWO_NODES="$TWO_NODES --allow-run-as-root"

# trainer NAME LAUNCH... -- ARGS...: the 7B config shrunk, data, metrics and checkpoints of run NAME.
trainer() {
  local name=$1 launch=""
  shift
  while [ "$1" != "--" ]; do launch="$launch $1"; shift; done
  shift
  mkdir -p "$WORK/$name"
  # shellcheck disable=SC2086
  $launch "$TRAINER" "$CONFIG" $SHRINK "data.train=$WORK/data/train_*.bin" "data.val=$WORK/data/val_*.bin" \
    "log.metrics=$WORK/$name/metrics.jsonl" "checkpoint.dir=$WORK/$name/ckpt" $EXTRA_ARGS "$@" \
    > "$WORK/$name/log" 2>&1 < /dev/null
}

trainer reference -- $ONE_RANK || fail "single-rank run: $(tail -5 "$WORK/reference/log")"
t0=$(date +%s)
# shellcheck disable=SC2086
# Open MPI's daemons for the two names start through the ssh stand-in and connect back over
# loopback TCP; on a loaded machine that start can fail before the trainer runs: such a launch,
# and only such a one, is tried again (launch_retried in tests/e2e/lib.sh).
two_nodes() {
  trainer two_nodes mpirun -np 16 --hostfile "$WORK/hosts" --map-by ppr:8:node $TWO_NODES ${TRAINER_MPIRUN_ARGS:-} \
    --display-map -- --print-layout
}
if launch_retried two_nodes; then
  pass "mpirun -np 16 --hostfile (2 nodes) --map-by ppr:8:node trainer configs/7b_tp2_dp4.yaml: $(($(date +%s) - t0)) s"
else
  fail "16-rank run"; tail -30 "$WORK/two_nodes/log"
fi
same_losses reference two_nodes "$rtol" && pass "16-rank losses equal the single rank's (rtol $rtol)" || fail "16-rank losses"
same_weights reference two_nodes "$rtol" && pass "16-rank final weights equal the single rank's" || fail "16-rank weights"

# The trainer's layout against Open MPI's own map of the job.
if python3 - "$WORK/two_nodes/log" <<'PY'; then pass "layout: 2 nodes of 8, local ranks as Open MPI's, tp groups inside a node"; else fail "layout"; fi
import re, sys
text = open(sys.argv[1]).read()
launcher_node, node = {}, None
for line in text.splitlines():
    m = re.search(r"Data for node: (\S+)", line)
    if m: node = m.group(1)
    m = re.search(r"Process rank: (\d+)", line)
    if m: launcher_node.setdefault(int(m.group(1)), node)
rows = {}
for line in text.splitlines():
    if line.startswith("layout rank="):
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        rows[int(f["rank"])] = f
bad = []
def check(cond, what):
    if not cond: bad.append(what)
check(sorted(rows) == list(range(16)), "a layout line for each of the 16 ranks")
check(sorted(launcher_node) == list(range(16)), "Open MPI's map names 16 ranks")
check(len(set(launcher_node.values())) == 2, "Open MPI's map has 2 nodes")
for r, f in rows.items():
    on_node = sorted(s for s in launcher_node if launcher_node[s] == launcher_node.get(r))
    check(int(f["local_size"]) == 8, f"rank {r}: local_size {f['local_size']}, not 8")
    check(int(f["local_rank"]) == on_node.index(r), f"rank {r}: local_rank {f['local_rank']}, Open MPI's map {on_node.index(r)}")
    check(f["launcher"] == "mpirun" and int(f["launcher_local_rank"]) == int(f["local_rank"]),
          f"rank {r}: OMPI_COMM_WORLD_LOCAL_RANK {f['launcher_local_rank']}, trainer {f['local_rank']}")
    for s, g in rows.items():
        same_trainer, same_launcher = f["node"] == g["node"], launcher_node[r] == launcher_node[s]
        check(same_trainer == same_launcher, f"ranks {r}, {s}: same node for the trainer {same_trainer}, for Open MPI {same_launcher}")
    tp, dp, pp = int(f["tp"]), int(f["dp"]), int(f["pp"])
    check(r == tp + 2 * (dp + 4 * pp), f"rank {r}: coordinates tp {tp} dp {dp} pp {pp}")
    lead = 2 * (dp + 4 * pp)
    check(launcher_node[r] == launcher_node[lead], f"rank {r}: its tp group leaves node {launcher_node[lead]}")
check("layout: 16 ranks on 2 nodes (8 per node), launcher mpirun; every tp group within one node" in text, "summary line")
check("warning:" not in text, "no warnings")
print("\n".join(bad[:20]) or "layout checked: %d ranks, nodes %s" % (len(rows), sorted(set(launcher_node.values()))))
sys.exit(1 if bad else 0)
PY

# The 16-rank run's step-3 checkpoint resumes under other layouts: 8 ranks with the override
# the error names (tp2 pp2 dp2), and one rank.
ck="$WORK/two_nodes/ckpt/ckpt_00000003.h5"
# shellcheck disable=SC2086
trainer resume8 $MPIRUN -np 8 -- parallel.dp=0 "checkpoint.resume=$ck" || fail "resume on 8 ranks: $(tail -5 "$WORK/resume8/log")"
grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/resume8/log" && grep -q "^  dp: 2$" "$WORK/resume8/log" \
  && pass "resumed on 8 ranks (parallel.dp=0)" || fail "no resume on 8 ranks"
same_losses reference resume8 "$rtol" && pass "8-rank losses after resume" || fail "8-rank losses after resume"
trainer resume1 -- $ONE_RANK "checkpoint.resume=$ck" || fail "resume on one rank: $(tail -5 "$WORK/resume1/log")"
grep -q "resumed from .*ckpt_00000003.h5 at step 3" "$WORK/resume1/log" && pass "resumed on one rank" || fail "no resume on one rank"
same_losses reference resume1 "$rtol" && pass "one-rank losses after resume" || fail "one-rank losses after resume"
same_weights reference resume1 "$rtol" && pass "one-rank final weights after resume" || fail "one-rank weights after resume"

# On 8 ranks as written: refused, naming the config's 16 ranks and the override.
# shellcheck disable=SC2086
if trainer wrong8 $MPIRUN -np 8 --; then fail "7b_tp2_dp4 on 8 ranks ran"
elif grep -q "error:.*laid out for 16 ranks.*parallel.dp=0" "$WORK/wrong8/log"; then pass "8 ranks refused: $(grep -m1 error: "$WORK/wrong8/log")"
else fail "8 ranks: $(tail -3 "$WORK/wrong8/log")"; fi
summary
