#!/bin/bash
# Checkpoint speed against the disk's own, and the cost of asynchronous checkpoints, in one call:
#  1. a synchronous checkpoint of step 2 (the trainer's line "checkpoint: step 2 saved to DIR in
#     X s (Y GB/s)");
#  2. loading it with the file dropped from the page cache first (dd iflag=nocache, no privileges
#     needed; "checkpoint: loaded PATH (Z GB) in X s (Y GB/s)");
#  3. the same folder's sequential write (dd conv=fdatasync) and read (page cache dropped first)
#     of a file of the checkpoint's size, and the checkpoint's speeds as fractions of them;
#  4. ASYNC_STEPS steps without checkpoints and with checkpoint.async=true every ASYNC_EVERY steps:
#     the mean step time (ms_per_step of the metrics log, steps 2 on), the training thread's stall
#     per checkpoint, the background write's time and speed, and the cost: the with-checkpoint
#     steps plus the stall spread over ASYNC_EVERY steps, against the plain steps; the first
#     checkpoint's stall, which also pins the snapshot's host memory once per run, is shown apart
#     and left out of the cost where later ones exist. (ms_per_step
#     holds a step's own work, so the background write's interference with it; the stall is
#     outside it; publishing a finished write at a step boundary is in neither.)
# Prints a summary table and writes it to $OUT/summary.txt. Runs in the repository root: relative
# paths are taken from there.
#   scripts/bench/bench_ckpt.sh [BIN_DIR (build)] [CONFIG (configs/7b_dp4_sharded.yaml)] [NP (4)] [overrides...]
# Environment:
#   OUT          folder of the logs, metrics and summary (default runs/bench_ckpt)
#   CKPT_DIR     the folder checkpoints and the dd file are written to (default $OUT/ckpt): it must
#                be new, empty or hold only checkpoint files, which are removed first; it is removed
#                at the end
#   ASYNC_STEPS  steps of each run of part 4 (default 30)
#   ASYNC_EVERY  checkpoint.every of the asynchronous run (default 10)
#   MPIRUN       the launcher as a full command (default mpirun); on a GPU host as root:
#                MPIRUN="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
# Needs GNU dd (iflag=nocache) and python3. Room in CKPT_DIR: the asynchronous run holds two
# checkpoints at once (checkpoint.keep=1: the newest published one and the one being written),
# checked against the measured size before it starts.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}; config=${2:-configs/7b_dp4_sharded.yaml}; np=${3:-4}
shift $(( $# > 3 ? 3 : $# ))
out=${OUT:-runs/bench_ckpt}; ckpt_dir=${CKPT_DIR:-$out/ckpt}
async_steps=${ASYNC_STEPS:-30}; async_every=${ASYNC_EVERY:-10}
mpirun_cmd=${MPIRUN:-mpirun}
export LC_ALL=C  # dd's and printf's numbers with a decimal point

die() { echo "bench_ckpt: error: $*" >&2; exit 1; }
[[ $np =~ ^[1-9][0-9]*$ ]] || die "NP must be a number of ranks, not '$np'"
[[ $async_steps =~ ^[0-9]+$ && $async_steps -ge 3 ]] || die "ASYNC_STEPS must be a number >= 3, not '$async_steps'"
[[ $async_every =~ ^[1-9][0-9]*$ && $async_every -lt $async_steps ]] ||
  die "ASYNC_EVERY must be a number from 1 to ASYNC_STEPS - 1, not '$async_every'"
[ -x "$bin/trainer" ] || die "no trainer in '$bin': pass the folder of the built binaries"
[ -f "$config" ] || die "no config file '$config'"
dd --help 2>/dev/null | grep -q nocache || die "dd does not know iflag=nocache: GNU coreutils dd is needed"

# Checkpoint files only, so that emptying the folder never removes anything else.
ckpt_names=(\( -name 'ckpt_*.h5' -o -name '.ckpt_*.h5.tmp' -o -name '.ckpt_write_test.*' -o -name dd.bin \))
ckpt_files() { find "$ckpt_dir" -mindepth 1 -maxdepth 1 "${ckpt_names[@]}" "$@"; }
if [ -d "$ckpt_dir" ]; then
  other=$(find "$ckpt_dir" -mindepth 1 -maxdepth 1 ! "${ckpt_names[@]}" | head -n 3 | tr '\n' ' ')
  [ -z "$other" ] || die "CKPT_DIR=$ckpt_dir holds files other than checkpoints (${other}...): point CKPT_DIR at a new or empty folder"
fi
mkdir -p "$out" "$ckpt_dir"
ckpt_files -delete
cleanup() { ckpt_files -delete 2>/dev/null || true; rmdir "$ckpt_dir" 2>/dev/null || true; }
trap cleanup EXIT

# launch NAME overrides...: the config on NP ranks, output in $out/NAME.log; a failed run ends the
# benchmark with the run's first error line.
launch() {
  local name=$1 status=0
  shift
  # shellcheck disable=SC2086
  $mpirun_cmd -np "$np" "$bin/trainer" "$config" "$@" < /dev/null > "$out/$name.log" 2>&1 || status=$?
  [ "$status" = 0 ] || die "the $name run failed (exit $status): $(grep -m1 'error' "$out/$name.log" ||
    tail -n 1 "$out/$name.log") (log: $out/$name.log)"
}
# field LOG SED: the first match of a sed -n expression in a run's log, or the benchmark ends.
field() {
  local v
  v=$(sed -n "$2" "$out/$1.log" | head -n 1)
  [ -n "$v" ] || die "no expected line in $out/$1.log (sed '$2'): the trainer's output changed?"
  echo "$v"
}
# drop_cache FILE: the file's pages leave the page cache (posix_fadvise DONTNEED, once written back).
drop_cache() { sync "$1" 2>/dev/null || sync; dd if="$1" iflag=nocache count=0 status=none; }
# dd_gbs: GB/s from the last line of dd's report ("N bytes (...) copied, S s, ...").
dd_gbs() { tail -n 1 | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i - 1); print $1 / s / 1e9 }'; }
# free_bytes: what CKPT_DIR's file system has free for this user.
free_bytes() { df -P -B1 "$ckpt_dir" | awk 'NR == 2 { print $4 }'; }

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, - || true)
fs=$(df -P -T "$ckpt_dir" 2>/dev/null | awk 'NR == 2 { print $2 " (" $1 ")" }' || true)
title="bench_ckpt $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?), ${gpu:-no GPU}
  $config on $np ranks${*:+, overrides: $*}; CKPT_DIR $ckpt_dir on ${fs:-?}"
echo "$title"

# 1. Synchronous write of step 2.
launch sync_write train.steps=2 train.warmup_steps=1 checkpoint.every=2 checkpoint.async=false \
  "checkpoint.dir=$ckpt_dir" log.metrics= "$@"
read -r write_s write_gbs < <(field sync_write \
  's/^checkpoint: step 2 saved to .* in \([0-9.]*\) s (\([0-9.]*\) GB\/s)$/\1 \2/p')
file=$ckpt_dir/ckpt_00000002.h5
[ -f "$file" ] || die "the synchronous run wrote no $file"
n_bytes=$(stat -c %s "$file")
gb=$(awk -v b="$n_bytes" 'BEGIN { printf "%.3f", b / 1e9 }')
echo "synchronous write: $gb GB in $write_s s, $write_gbs GB/s"

# 2. Load it, from the disk rather than the page cache. The path itself and no checkpoint.dir:
# nothing is written at the end of the run.
drop_cache "$file"
launch load train.steps=3 train.warmup_steps=1 "checkpoint.resume=$file" checkpoint.dir= checkpoint.every=0 \
  log.metrics= "$@"
read -r load_s load_gbs < <(field load 's/^checkpoint: loaded .* ([0-9.]* GB) in \([0-9.]*\) s (\([0-9.]*\) GB\/s)$/\1 \2/p')
echo "load: $load_s s, $load_gbs GB/s"
ckpt_files -delete

# 3. The disk's own sequential speeds on a file of the checkpoint's size (64 MiB blocks).
count=$(( (n_bytes + (64 << 20) - 1) / (64 << 20) ))
dd if=/dev/zero of="$ckpt_dir/dd.bin" bs=64M count="$count" conv=fdatasync 2> "$out/dd_write.log" ||
  die "dd could not write $ckpt_dir/dd.bin: $(tail -n 1 "$out/dd_write.log")"
dd_write_gbs=$(dd_gbs < "$out/dd_write.log" | xargs printf '%.2f')
drop_cache "$ckpt_dir/dd.bin"
dd if="$ckpt_dir/dd.bin" of=/dev/null bs=64M 2> "$out/dd_read.log" ||
  die "dd could not read $ckpt_dir/dd.bin: $(tail -n 1 "$out/dd_read.log")"
dd_read_gbs=$(dd_gbs < "$out/dd_read.log" | xargs printf '%.2f')
rm -f "$ckpt_dir/dd.bin"
echo "dd: $((count * 64)) MiB written at $dd_write_gbs GB/s (fdatasync), read at $dd_read_gbs GB/s"

# 4. Asynchronous checkpoints against none.
need=$(( n_bytes * 21 / 10 ))
free=$(free_bytes)
[ "$free" -ge "$need" ] || die "the asynchronous run needs about $((need >> 20)) MiB in $ckpt_dir (two checkpoints)" \
  "but $((free >> 20)) MiB are free: point CKPT_DIR at a larger file system"
launch async_base "train.steps=$async_steps" train.warmup_steps=1 log.every=1 checkpoint.every=0 checkpoint.dir= \
  "log.metrics=$out/async_base.jsonl" "$@"
launch async_ckpt "train.steps=$async_steps" train.warmup_steps=1 log.every=1 checkpoint.async=true \
  "checkpoint.every=$async_every" checkpoint.keep=1 "checkpoint.dir=$ckpt_dir" "log.metrics=$out/async_ckpt.jsonl" "$@"
ckpt_files -delete
stalls=$(sed -n 's/^checkpoint: step [0-9]* copied to host in [0-9.]* s (training stalled \([0-9.]*\) s).*/\1/p' \
  "$out/async_ckpt.log")
writes=$(sed -n 's/^checkpoint: step [0-9]* saved to .* in \([0-9.]*\) s in the background (\([0-9.]*\) GB\/s)$/\1 \2/p' \
  "$out/async_ckpt.log")
{ [ -n "$stalls" ] && [ -n "$writes" ]; } || die "no stall or background write line in $out/async_ckpt.log"
read -r base_ms ckpt_ms n_ckpt stall_first stall_s bg_s bg_gbs cost < <(python3 - "$out/async_base.jsonl" "$out/async_ckpt.jsonl" \
  "$async_every" "$stalls" "$writes" <<'PY'
import json, sys
def mean_ms(path):  # steps 2 on: the first warms up
    ms = [o["ms_per_step"] for o in map(json.loads, open(path)) if o.get("step", 0) >= 2 and "ms_per_step" in o]
    if not ms:
        sys.exit("no steps in " + path)
    return sum(ms) / len(ms)
base, ckpt, every = mean_ms(sys.argv[1]), mean_ms(sys.argv[2]), int(sys.argv[3])
stalls = [float(s) for s in sys.argv[4].split()]
writes = [tuple(map(float, w.split())) for w in sys.argv[5].splitlines()]
# The first checkpoint also allocates and pins the snapshot's host memory, once per run; the
# cost is that of the later ones (of the first where there is no other).
later = stalls[1:] or stalls
stall = sum(later) / len(later)
cost = 100 * ((ckpt + 1000 * stall / every) / base - 1)
print("%.1f %.1f %d %.3f %.3f %.2f %.2f %.1f" % (base, ckpt, len(stalls), stalls[0], stall,
                                                sum(w[0] for w in writes) / len(writes),
                                                sum(w[1] for w in writes) / len(writes), cost))
PY
)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf (b > 0 ? "%.2f" : "-"), (b > 0 ? a / b : 0) }'; }
{
  echo "$title"
  printf '  %-34s %10s\n' "checkpoint size (GB)" "$gb" \
    "synchronous write (GB/s)" "$write_gbs" \
    "load, page cache dropped (GB/s)" "$load_gbs" \
    "dd write, fdatasync (GB/s)" "$dd_write_gbs" \
    "dd read, page cache dropped (GB/s)" "$dd_read_gbs" \
    "write / dd write" "$(ratio "$write_gbs" "$dd_write_gbs")" \
    "load / dd read" "$(ratio "$load_gbs" "$dd_read_gbs")"
  echo "  asynchronous checkpoints: $async_steps steps, checkpoint.every=$async_every ($n_ckpt written)"
  printf '  %-34s %10s\n' "baseline (ms/step)" "$base_ms" \
    "with checkpoints (ms/step)" "$ckpt_ms" \
    "cost, stall included (%)" "$cost" \
    "stall, first checkpoint (s)" "$stall_first" \
    "stall per later checkpoint (s)" "$stall_s" \
    "background write (s)" "$bg_s" \
    "background write (GB/s)" "$bg_gbs"
} | tee "$out/summary.txt"
