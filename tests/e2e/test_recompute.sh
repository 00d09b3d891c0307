#!/bin/sh
# Activation recomputation: train.recompute=selective and =full give bitwise the losses and the
# final weights of train.recompute=none, on one rank and under tp2 with SP and pp2 (where the
# recomputed norms redo the sequence-parallel all-gathers), and the dry-run plans less memory.
. "$(dirname "$0")/lib.sh"
make_corpus
for layout in "1" "4 parallel.tp=2 parallel.sequence_parallel=true parallel.pp=2"; do
  # shellcheck disable=SC2086
  set -- $layout
  np=$1; shift
  tag="np$np"
  run "${tag}_none" "$np" "$@" train.recompute=none || fail "$tag none run: $(cat "$WORK/${tag}_none/log")"
  for rc in selective full; do
    if run "${tag}_$rc" "$np" "$@" train.recompute=$rc; then pass "$tag recompute=$rc trains"; else fail "$tag $rc run"; cat "$WORK/${tag}_$rc/log"; continue; fi
    if same_losses "${tag}_none" "${tag}_$rc" 0; then pass "$tag $rc losses bitwise"; else fail "$tag $rc losses"; fi
    if same_weights "${tag}_none" "${tag}_$rc" 0; then pass "$tag $rc weights bitwise"; else fail "$tag $rc weights"; fi
  done
done
# The plan's activations per micro-batch shrink: none > selective > full.
act() { "$TRAINER" "$SRC/configs/7b_tp2_dp4.yaml" --dry-run "train.recompute=$1" 2>&1 |
  awk '$1 == "0" && $2 == "0" { print $(NF - 3) }' | tr -d G; }
a_none=$(act none); a_sel=$(act selective); a_full=$(act full)
echo "7b_tp2_dp4 activations per micro-batch (GiB): none $a_none, selective $a_sel, full $a_full"
if python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); sys.exit(0 if a > b > c else 1)" "$a_none" "$a_sel" "$a_full"; then
  pass "dry-run activations shrink with recomputation"
else
  fail "dry-run activations do not shrink: $a_none $a_sel $a_full"
fi
summary
