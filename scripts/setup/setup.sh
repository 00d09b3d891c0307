#!/bin/bash
# Installs what the trainer needs on Debian/Ubuntu (skips packages already there), then
# configures and builds into build/. Usage: scripts/setup/setup.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
# python3-matplotlib and python3-yaml: scripts/study/study.py; python3-numpy and python3-h5py: the tests'
# independent reader of safetensors exports and checkpoints.
pkgs="build-essential cmake python3 python3-matplotlib python3-yaml python3-numpy python3-h5py libopenmpi-dev openmpi-bin \
libhdf5-openmpi-dev hdf5-tools libyaml-dev bible-kjv"
missing=""
for p in $pkgs; do dpkg -s "$p" > /dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing$missing"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing > /dev/null
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$(nproc)"
