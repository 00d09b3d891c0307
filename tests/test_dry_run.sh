#!/bin/sh
# --dry-run plans every shipped config without allocating: the 8-GPU 7B layouts for 8 ranks,
# the others for their own layout. Each must print its plan and exit 0.
. "$(dirname "$0")/lib.sh"
for f in "$SRC"/configs/*.yaml; do
  name=$(basename "$f" .yaml)
  case $name in 7b_tp*|7b_dp*|7b_pp*) ranks=8 ;; *) ranks=1 ;; esac
  if "$TRAINER" "$f" --dry-run --world-size $ranks > "$WORK/plan.txt" 2>&1 && grep -q "^plan: $ranks ranks" "$WORK/plan.txt" \
     && grep -q "memory per rank" "$WORK/plan.txt"; then
    pass "$name planned for $ranks ranks ($(grep -c '^  [0-9]' "$WORK/plan.txt") rank rows)"
  else
    fail "$name: $(cat "$WORK/plan.txt")"
  fi
done
summary
