// Pipeline schedules as data: the order of forwards and backwards of one pipeline rank (1F1B,
// or interleaved 1F1B over vpp model chunks) with the sends and receives that feed them, placed
// so that the executor can run every run of consecutive send/recv steps as one group without
// deadlock (see pp_schedule_build). tests/unit/test_pp_schedule.c simulates every rank under those
// group semantics for all small shapes and checks that nothing deadlocks.
#include "parallel/step/pp_schedule.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pp_schedule_check(int pp, int vpp, int n_micro, char *err, size_t n_err) {
  if (err && n_err) err[0] = '\0';
  if (pp < 1) {
    if (err) snprintf(err, n_err, "parallel.pp = %d: the pipeline needs at least one stage; set parallel.pp >= 1", pp);
    return -1;
  }
  if (vpp < 1) {
    if (err) snprintf(err, n_err, "parallel.vpp = %d: each rank holds at least one model chunk; set parallel.vpp >= 1", vpp);
    return -1;
  }
  if (n_micro < 1) {
    if (err)
      snprintf(err, n_err,
               "the micro-batch count (train.global_batch / (parallel.dp * train.micro_batch)) is %d; "
               "it must be >= 1: raise train.global_batch or lower train.micro_batch", n_micro);
    return -1;
  }
  if (vpp > 1 && pp == 1) {
    if (err)
      snprintf(err, n_err,
               "parallel.vpp = %d (interleaved 1F1B) needs parallel.pp > 1: with one stage there is no "
               "pipeline to interleave; set parallel.vpp = 1 or parallel.pp > 1", vpp);
    return -1;
  }
  // Interleaving walks the chunks in rounds of pp micro-batches: the last rank's chunk c output
  // for micro m must exist when rank 0 starts chunk c + 1 of m, which holds only for full rounds.
  if (vpp > 1 && n_micro % pp != 0) {
    int down = n_micro / pp * pp, up = down + pp;
    char near[64];
    if (down > 0) snprintf(near, sizeof near, "%d or %d", down, up);
    else snprintf(near, sizeof near, "%d", up);
    if (err)
      snprintf(err, n_err,
               "parallel.vpp = %d (interleaved 1F1B) needs the micro-batch count, train.global_batch / "
               "(parallel.dp * train.micro_batch) = %d, to be a multiple of parallel.pp = %d; set "
               "train.global_batch so that it is (e.g. %s micro-batches), or set parallel.vpp = 1",
               vpp, n_micro, pp, near);
    return -1;
  }
  if ((long long)n_micro * vpp > INT_MAX / 8) {
    if (err)
      snprintf(err, n_err, "%d micro-batches x parallel.vpp = %d chunks is too many steps for one schedule; "
               "lower train.global_batch", n_micro, vpp);
    return -1;
  }
  return 0;
}

double pp_bubble_theory(int pp, int vpp, int n_micro) {
  return (double)(pp - 1) / ((double)vpp * n_micro + pp - 1);
}

// The k-th forward (or backward) unit of a rank: rounds of pp micro-batches per chunk, chunks in
// order for forward and in reverse for backward (the last virtual stage's backward comes first).
static void pp_unit(int k, int pp, int vpp, int bwd, int *micro, int *chunk) {
  int c = (k / pp) % vpp;
  *chunk = bwd ? vpp - 1 - c : c;
  *micro = (k / (pp * vpp)) * pp + k % pp;
}

static int pp_warmup(int pp, int vpp, int n_micro, int rank) {
  const int total = n_micro * vpp;
  // 1F1B: rank r runs ahead by the pp - r - 1 forwards that fill the stages after it.
  // Interleaved: the first chunk round ((vpp - 1) * pp units) plus two units per stage
  // downstream, so the first backward's gradient can have arrived when it is needed.
  int w = vpp == 1 ? pp - rank - 1 : (pp - rank - 1) * 2 + (vpp - 1) * pp;
  return w < total ? w : total;
}

// Whether the t-th compute unit of a rank (t in [0, 2 * total)) is a backward: warm-up
// forwards, then forward/backward pairs (forward first), then the remaining backwards.
static int pp_is_bwd(int t, int warmup, int total) {
  if (t < warmup) return 0;
  if (t >= warmup + 2 * (total - warmup)) return 1;
  return (t - warmup) % 2 == 1;
}

static void pp_push(pp_schedule *s, pp_op op, int micro, int chunk, int peer) {
  pp_step *st = &s->steps[s->n_steps++];
  st->op = op;
  st->micro = micro;
  st->chunk = chunk;
  st->peer = peer;
}

// Appends a transfer of (micro, chunk) on this rank if the neighbouring virtual stage exists:
// activations come from stage v - 1 and go to v + 1, gradients the other way. The stage
// before virtual stage v is on rank - 1 (chunk - 1 when rank == 0), the one after on rank + 1.
static void pp_push_comm(pp_schedule *s, pp_op op, int micro, int chunk, int rank, int pp, int vpp) {
  const int v = chunk * pp + rank, last = pp * vpp - 1;
  const int prev = (rank + pp - 1) % pp, next = (rank + 1) % pp;
  switch (op) {
    case PP_RECV_ACT: if (v > 0) pp_push(s, op, micro, chunk, prev); break;
    case PP_SEND_GRAD: if (v > 0) pp_push(s, op, micro, chunk, prev); break;
    case PP_SEND_ACT: if (v < last) pp_push(s, op, micro, chunk, next); break;
    case PP_RECV_GRAD: if (v < last) pp_push(s, op, micro, chunk, next); break;
    default: break;
  }
}

// Plain 1F1B: each receive right before the compute that consumes it, each send right after
// the one that produced it. In the steady state the runs between computes are then
// "send act of F + receive grad of the next B" (both with rank + 1) and "send grad of B +
// receive act of the next F" (both with rank - 1), and rank r's first kind meets rank r + 1's
// second kind: the exchanges pair up, every group waits only for the input it needs next.
static void pp_build_1f1b(pp_schedule *s, int pp, int n_micro, int rank, int warmup) {
  int n_fwd = 0, n_bwd = 0;
  for (int t = 0; t < 2 * n_micro; t++) {
    if (pp_is_bwd(t, warmup, n_micro)) {
      int m = n_bwd++;
      pp_push_comm(s, PP_RECV_GRAD, m, 0, rank, pp, 1);
      pp_push(s, PP_BWD, m, 0, -1);
      pp_push_comm(s, PP_SEND_GRAD, m, 0, rank, pp, 1);
    } else {
      int m = n_fwd++;
      pp_push_comm(s, PP_RECV_ACT, m, 0, rank, pp, 1);
      pp_push(s, PP_FWD, m, 0, -1);
      pp_push_comm(s, PP_SEND_ACT, m, 0, rank, pp, 1);
    }
  }
}

// Interleaved 1F1B. Placing receives right before their consumer deadlocks here: stage 0 and
// the last stage drop transfers from the pairs above, and a rank can end up sending a gradient
// to a neighbour that will only post the matching receive after a group that waits on this
// rank. So the receives of the next forward and of the next backward are prefetched, as in
// Megatron-LM's non-overlapped interleaved schedule: one group after every warm-up forward
// (send its output, receive the next forward's input; the last warm-up group also receives the
// first backward's gradient), one group after every steady-state forward+backward pair (send
// both outputs, receive both next inputs), one group after every cool-down backward.
// Inside a group every rank posts activations before gradients: with pp == 2 both directions
// join the same two ranks, and transfers between a pair are matched in posting order (no
// tags), so a group holding an activation and a gradient for the same peer must list them in
// the same order on both sides.
static void pp_build_interleaved(pp_schedule *s, int pp, int vpp, int n_micro, int rank, int warmup) {
  const int total = n_micro * vpp;
  int m = 0, c = 0, m2 = 0, c2 = 0;
  pp_unit(0, pp, vpp, 0, &m, &c);
  pp_push_comm(s, PP_RECV_ACT, m, c, rank, pp, vpp);
  for (int k = 0; k < warmup; k++) {
    pp_unit(k, pp, vpp, 0, &m, &c);
    pp_push(s, PP_FWD, m, c, -1);
    pp_push_comm(s, PP_SEND_ACT, m, c, rank, pp, vpp);
    if (k + 1 < total) {
      pp_unit(k + 1, pp, vpp, 0, &m2, &c2);
      pp_push_comm(s, PP_RECV_ACT, m2, c2, rank, pp, vpp);
    }
    if (k == warmup - 1) {
      pp_unit(0, pp, vpp, 1, &m2, &c2);
      pp_push_comm(s, PP_RECV_GRAD, m2, c2, rank, pp, vpp);
    }
  }
  for (int i = 0; i < total - warmup; i++) {
    int k = warmup + i, fm, fc, bm, bc;
    pp_unit(k, pp, vpp, 0, &fm, &fc);
    pp_unit(i, pp, vpp, 1, &bm, &bc);
    pp_push(s, PP_FWD, fm, fc, -1);
    pp_push(s, PP_BWD, bm, bc, -1);
    pp_push_comm(s, PP_SEND_ACT, fm, fc, rank, pp, vpp);
    if (k + 1 < total) {
      pp_unit(k + 1, pp, vpp, 0, &m, &c);
      pp_push_comm(s, PP_RECV_ACT, m, c, rank, pp, vpp);
    }
    pp_push_comm(s, PP_SEND_GRAD, bm, bc, rank, pp, vpp);
    if (i + 1 < total) {
      pp_unit(i + 1, pp, vpp, 1, &m2, &c2);
      pp_push_comm(s, PP_RECV_GRAD, m2, c2, rank, pp, vpp);
    }
  }
  for (int i = total - warmup; i < total; i++) {
    pp_unit(i, pp, vpp, 1, &m, &c);
    pp_push(s, PP_BWD, m, c, -1);
    pp_push_comm(s, PP_SEND_GRAD, m, c, rank, pp, vpp);
    if (i + 1 < total) {
      pp_unit(i + 1, pp, vpp, 1, &m2, &c2);
      pp_push_comm(s, PP_RECV_GRAD, m2, c2, rank, pp, vpp);
    }
  }
}

int pp_schedule_build(pp_schedule *s, int pp, int vpp, int n_micro, int rank, char *err, size_t n_err) {
  memset(s, 0, sizeof *s);
  if (pp_schedule_check(pp, vpp, n_micro, err, n_err)) return -1;
  if (rank < 0 || rank >= pp) {
    if (err) snprintf(err, n_err, "pipeline rank %d outside [0, parallel.pp = %d)", rank, pp);
    return -1;
  }
  const int total = n_micro * vpp;
  // Each compute unit brings at most one receive and one send: 3 steps per unit.
  s->steps = malloc((size_t)6 * total * sizeof *s->steps);
  if (!s->steps) {
    if (err) snprintf(err, n_err, "out of memory for a schedule of %d units", 2 * total);
    return -1;
  }
  const int warmup = pp_warmup(pp, vpp, n_micro, rank);
  if (vpp == 1) pp_build_1f1b(s, pp, n_micro, rank, warmup);
  else pp_build_interleaved(s, pp, vpp, n_micro, rank, warmup);
  // Activation memory: forwards whose backward has not run yet.
  int in_flight = 0;
  for (int i = 0; i < s->n_steps; i++) {
    if (s->steps[i].op == PP_FWD && ++in_flight > s->max_in_flight) s->max_in_flight = in_flight;
    if (s->steps[i].op == PP_BWD) in_flight--;
  }
  return 0;
}

void pp_schedule_free(pp_schedule *s) {
  if (!s) return;
  free(s->steps);
  s->steps = NULL;
  s->n_steps = 0;
  s->max_in_flight = 0;
}

int pp_schedule_max_group(const pp_schedule *s) {
  int most = 1;
  for (int i = 0, run = 0; i < s->n_steps; i++) {
    run = s->steps[i].op != PP_FWD && s->steps[i].op != PP_BWD ? run + 1 : 0;
    if (run > most) most = run;
  }
  return most;
}
