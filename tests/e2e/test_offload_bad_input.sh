#!/bin/sh
# Bad input of optimizer.offload: each bad value or combination ends with one line naming the key
# and the fix, and a node whose memory cannot hold what its ranks would pin stops before
# anything is allocated, naming both figures.
. "$(dirname "$0")/lib.sh"
make_corpus
T="$SRC/configs/tiny.yaml data.train=$WORK/data/train_*.bin data.val= checkpoint.dir= log.metrics= train.steps=2"
# shellcheck disable=SC2086
expect_error "offload=gpu" "optimizer.offload = 'gpu' is not one of: none, host" 1 $T optimizer.offload=gpu
# shellcheck disable=SC2086
expect_error "offload_update=disk" "optimizer.offload_update = 'disk' is not one of: gpu, cpu" 1 $T \
  optimizer.offload=host optimizer.offload_update=disk
# shellcheck disable=SC2086
expect_error "offload_fraction=1.5" "optimizer.offload_fraction = 1.5 is out of range \[0, 1\]" 1 $T \
  optimizer.offload_fraction=1.5
# shellcheck disable=SC2086
expect_error "offload_fraction=-0.1" "optimizer.offload_fraction = -0.1 is out of range" 1 $T \
  optimizer.offload_fraction=-0.1
# shellcheck disable=SC2086
expect_error "offload_fraction=half" "optimizer.offload_fraction: expected a number, found 'half'" 1 $T \
  optimizer.offload_fraction=half
# shellcheck disable=SC2086
expect_error "offload_delay=2" "optimizer.offload_delay = 2 is out of range \[0, 1\]" 1 $T optimizer.offload_delay=2
# shellcheck disable=SC2086
expect_error "offload_delay without offload" "offload_delay = 1 .* needs optimizer.offload=host" 1 $T \
  optimizer.offload_delay=1
# shellcheck disable=SC2086
expect_error "offload_delay with the gpu engine" "offload_delay = 1 .*offload_update=gpu" 1 $T \
  optimizer.offload=host optimizer.offload_update=gpu optimizer.offload_delay=1
# shellcheck disable=SC2086
expect_error "misspelt key" "unknown key 'optimizer.offlaod' (did you mean 'optimizer.offload'" 1 $T \
  optimizer.offlaod=host
# A 3 TiB state on this node: refused before any allocation, with the node's need and MemAvailable.
# shellcheck disable=SC2086
expect_error "state larger than the node's memory" "need .* GiB of pinned host memory but the node has .* GiB available.*offload_fraction" \
  1 $T optimizer.offload=host model.dim=16384 model.n_layers=64 model.n_heads=128 model.n_kv_heads=128 \
  model.ffn_dim=65536
summary
