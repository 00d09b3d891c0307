#!/bin/bash
# Installs, builds and runs the test suite on CPU ranks (everything but the `gpu` label).
# Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup/setup.sh build
cd build
ctest --output-on-failure -LE gpu -j "$(nproc)" "$@"
