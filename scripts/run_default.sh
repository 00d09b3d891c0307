#!/bin/bash
# The default run from a fresh machine: install, build, prepare the embedded corpus (the King
# James Bible, public domain) and train configs/default.yaml on this machine's CPU cores.
# Extra arguments are passed to the trainer (section.key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
scripts/get_corpus.sh build
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
exec build/trainer configs/default.yaml "$@"
