#!/bin/bash
# The default run from a fresh machine: install, build, prepare the embedded corpus (the King
# James Bible, public domain) and train configs/default.yaml on this machine's CPU cores.
# Extra arguments are passed to the trainer (section.key=value overrides). Ends with a short
# greedy sample from the run's newest checkpoint (build/sample, on a GPU when one is visible,
# else the CPU; fp32 on both, so the text is the same), unless an override
# turned checkpoints off.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup/setup.sh build
scripts/setup/get_corpus.sh build
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
build/trainer configs/default.yaml "$@"

# The checkpoint folder: the config's, or the last checkpoint.dir= override.
ckpt_dir=$(sed -n 's/^  dir: *"\{0,1\}\([^"#]*\)"\{0,1\}.*/\1/p' configs/default.yaml | head -n 1)
for arg in "$@"; do
  case "$arg" in checkpoint.dir=*) ckpt_dir=${arg#checkpoint.dir=} ;; esac
done
ckpt_dir=${ckpt_dir%\"}; ckpt_dir=${ckpt_dir#\"}
last=""
if [ -n "$ckpt_dir" ] && [ -d "$ckpt_dir" ]; then
  last=$(find "$ckpt_dir" -maxdepth 1 -name 'ckpt_*.h5' | sort -V | tail -n 1)
fi
if [ -z "$last" ]; then
  echo "sample: no checkpoint (checkpoint.dir is off or empty): skipped"
  exit 0
fi
echo "sample from $last (greedy):"
build/sample "$last" --prompt "And God said" --tokens 80 --temperature 0
