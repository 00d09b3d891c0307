#!/bin/sh
# scripts/study/study.py on broken studies: each case ends with a named error (exit 2) or a failed
# study that names the variant (exit 1), never a Python traceback: an unknown key, a missing
# config, malformed YAML, a missing study file, an unknown --only name, a folder that holds no
# study; a variant that crashes (its exit status and its log's last lines in the report) while
# the others' figures are kept; a variant the trainer's config check refuses (an FP8 width that
# is not a multiple of 16: its message in the report); a variant with more ranks than the GPUs
# visible.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/study_lib.sh"
make_corpus
printf 'kind: compare\nconfig: configs/tiny.yaml\nstepz: 4\nvariants:\n  - {name: a}\n  - {name: b}\n' > "$WORK/typo.yaml"
study typo "$WORK/typo.yaml"
expect_rc "unknown key" 2 typo
expect_text "it names the file, line and key" "typo.yaml:3: unknown key 'stepz' in the study \(did you mean 'steps'\?" "$WORK/typo.txt"
printf 'kind: compare\nconfig: configs/tiny.yaml\nvariants:\n  - {name: a, overridez: {}}\n' > "$WORK/vtypo.yaml"
study vtypo "$WORK/vtypo.yaml"
expect_rc "unknown variant key" 2 vtypo
expect_text "it names the variant's key" "vtypo.yaml:4: unknown key 'overridez' in variant 1" "$WORK/vtypo.txt"
printf 'kind: compare\nconfig: configs/nope.yaml\nvariants:\n  - {name: a}\n  - {name: b}\n' > "$WORK/noconf.yaml"
study noconf "$WORK/noconf.yaml"
expect_rc "missing config" 2 noconf
expect_text "it names the config" "noconf.yaml:2: config 'configs/nope.yaml' not found" "$WORK/noconf.txt"
printf 'kind: compare\nconfig: [configs/tiny.yaml\n' > "$WORK/yaml.yaml"
study yaml "$WORK/yaml.yaml"
expect_rc "malformed YAML" 2 yaml
expect_text "it says so" "yaml.yaml:[0-9]+: malformed YAML" "$WORK/yaml.txt"
study nofile "$WORK/none.yaml"
expect_rc "missing study file" 2 nofile
study only "$SRC/configs/studies/cpu_dp2_vs_tp2.yaml" --only tp3 --out "$WORK/only"
expect_rc "unknown --only name" 2 only
expect_text "it lists the variants" "--only tp3: no such variant .*\(variants: dp2, tp2\)" "$WORK/only.txt"
collect nodir "$WORK"
expect_rc "--collect of a folder without a study" 2 nodir
# The study names its data itself: --set (which study() passes) would win over the crashing
# variant's data.train. One rank: of several, rank 0 prints the error, and mpirun may end it
# before it does when another rank exits first.
cat > "$WORK/crash.yaml" <<YAML
kind: compare
config: configs/tiny.yaml
steps: 4
warmup: 1
overrides: {train.device: cpu, data.val: "", data.train: "$WORK/data/train_*.bin"}
variants:
  - {name: base, ranks: 1}
  - {name: crash, ranks: 1, overrides: {data.train: /nonexistent/shard_*.bin}}
launcher: {mpirun_args: [--oversubscribe, --bind-to, none], env: {OMP_NUM_THREADS: 1}}
YAML
set +e
"$PY" "$STUDY" "$WORK/crash.yaml" --trainer "$TRAINER" --out "$WORK/crash" --no-plots \
  "--mpirun-args=${TRAINER_MPIRUN_ARGS:-}" > "$WORK/crashrun.txt" 2>&1
RC=$?
set -e
expect_rc "a variant that crashes" 1 crashrun
expect_text "the report names it and its exit status" '^### crash: exit status 1: error: data.train: no data shard' \
  "$WORK/crash/report.md"
expect_text "and its log's error lines" "^error: data.train: no data shard matches '/nonexistent/shard_\*.bin'" \
  "$WORK/crash/report.md"
expect_text "and its log's last lines" "^Last lines of its log:" "$WORK/crash/report.md"
expect_text "the other variant's figures are kept" '^\| base \| 1 \| 1 \| [0-9,]+ .*\| ok \|$' "$WORK/crash/report.md"
printf 'kind: compare\nconfig: configs/tiny.yaml\nvariants:\n  - {name: bf16}\n  - {name: fp8, overrides: {train.precision: fp8, model.dim: 72}}\n' > "$WORK/fp8.yaml"
study fp8 "$WORK/fp8.yaml" --out "$WORK/fp8" --only fp8 --no-plots
expect_rc "a variant the trainer's config check refuses" 1 fp8
expect_text "the trainer's own message names the key" \
  "FAIL: fp8: not run: error: train.precision=fp8: model.dim = 72 is not a multiple of 16" "$WORK/fp8.txt"
study gpus "$SRC/configs/studies/dp_weak_1b.yaml" --out "$WORK/gpus" --only 1b_dp2 --gpus 1 --no-plots
expect_rc "2 ranks on 1 visible GPU without --share-gpus" 1 gpus
expect_text "refused before it runs, naming --share-gpus" \
  "FAIL: 1b_dp2: not run: 2 ranks need 2 GPUs with NCCL and 1 visible here: --share-gpus" \
  "$WORK/gpus.txt"
summary
