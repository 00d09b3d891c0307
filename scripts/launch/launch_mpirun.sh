#!/bin/sh
# mpirun for a trainer job that a scheduler may stop with SIGTERM (preemption, a time limit):
#
#   scripts/launch/launch_mpirun.sh [mpirun options] build/trainer CONFIG.yaml [overrides]
#
# Open MPI's mpirun, given SIGTERM or SIGINT, ends the job itself: it sends the ranks SIGCONT,
# waits odls_base_sigkill_timeout (1 s), sends SIGTERM, waits as long again, sends SIGKILL and
# exits 1, so a checkpoint that takes longer than about a second is lost. This script runs mpirun
# in a session of its own (a terminal's Ctrl-C or a signal to this process group does not reach
# it) and passes a SIGTERM or SIGINT it gets to the trainer processes mpirun started on this
# node instead. One rank is enough: every rank learns of the signal at the next step's
# all-reduce, all of them finish that step, write its checkpoint, however long that takes, and
# exit 128 + the signal, and so does this script (mpirun's exit status). With no trainer process
# on this node (all ranks remote), the signal goes to mpirun as it would without this script.
# docs/multinode.md says how to point a scheduler's signal at this script.
set -u
command -v setsid > /dev/null || { echo "launch_mpirun.sh: setsid (util-linux) is needed" >&2; exit 2; }
setsid mpirun "$@" &
mpirun_pid=$!

relay() {
  ranks=$(pgrep -x -P "$mpirun_pid" trainer | tr '\n' ' ')
  if [ -n "$ranks" ]; then
    echo "launch_mpirun.sh: SIG$1 passed to the trainer processes $ranks(they checkpoint and stop)" >&2
    kill -s "$1" $ranks 2> /dev/null
  else
    echo "launch_mpirun.sh: no trainer process under mpirun on this node: SIG$1 goes to mpirun" >&2
    kill -s "$1" "$mpirun_pid" 2> /dev/null
  fi
}
trap 'relay TERM' TERM
trap 'relay INT' INT

# wait returns early when a trapped signal arrives: wait again until mpirun has exited.
while :; do
  wait "$mpirun_pid"
  status=$?
  kill -0 "$mpirun_pid" 2> /dev/null || break
done
exit "$status"
