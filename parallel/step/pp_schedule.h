// Pipeline schedules as data: pp_schedule_build returns, for one pipeline rank, the ordered
// list of steps it executes (forward, backward, send/receive of activations and gradients).
// One executor runs any schedule. Virtual stage s = chunk * pp + rank holds layers
// [s * L / (pp*vpp), (s+1) * L / (pp*vpp)); stage s sends activations to stage s + 1.
// Consecutive send/recv steps form one group: the executor posts them all, then completes
// them together (comm group_start/group_end), which is what makes crossed pairs safe.
// The executor contract, precisely (tests/unit/test_pp_schedule.c simulates it for every rank):
// - a group is a maximal run of consecutive send/recv steps; post every step of it, in the
//   listed order, between one group_start and one group_end, and nothing else in that group;
//   run compute steps one by one (FWD and BWD may follow each other with no group between);
// - transfers between two ranks are matched in posting order (no tags, as in NCCL), so the
//   listed order must be kept: with pp == 2 one group can hold an activation and a gradient
//   for the same peer;
// - receives may come earlier than the compute that uses them (interleaved schedules prefetch
//   the next forward's input and the next backward's gradient): RECV_ACT (m, c) fills the
//   input of (m, c), RECV_GRAD (m, c) the output gradient of (m, c), whose forward has run;
// - sends read the output (SEND_ACT, after FWD) or input gradient (SEND_GRAD, after BWD) of
//   (m, c), which must stay intact until the group holding the send has ended;
// - peer is the rank in the pipeline communicator (grid pp_c), not the world rank.
#ifndef TRAINER_PP_SCHEDULE_H
#define TRAINER_PP_SCHEDULE_H

#include <stddef.h>

typedef enum pp_op {
  PP_FWD,       // forward of (micro, chunk); its input was received before (or is the data)
  PP_BWD,       // backward of (micro, chunk); its output gradient was received (or is the loss)
  PP_SEND_ACT,  // send forward output of (micro, chunk) to the next virtual stage
  PP_RECV_ACT,  // receive forward input of (micro, chunk) from the previous virtual stage
  PP_SEND_GRAD, // send input gradient of (micro, chunk) to the previous virtual stage
  PP_RECV_GRAD, // receive output gradient of (micro, chunk) from the next virtual stage
} pp_op;

typedef struct pp_step {
  pp_op op;
  int micro;  // micro-batch index in [0, n_micro)
  int chunk;  // model chunk on this rank in [0, vpp)
  int peer;   // pipeline rank of the other side (send/recv only), else -1
} pp_step;

typedef struct pp_schedule {
  pp_step *steps;
  int n_steps;
  int max_in_flight;  // most (micro, chunk) forwards whose backward has not run yet, on this rank
} pp_schedule;

// Returns 0, or -1 with a message when (pp, vpp, n_micro) is not admissible (e.g. interleaving
// needs n_micro to be a multiple of pp), naming the fields and the fix.
int pp_schedule_check(int pp, int vpp, int n_micro, char *err, size_t n_err);
// 1F1B when vpp == 1, interleaved 1F1B when vpp > 1. Caller frees with pp_schedule_free.
int pp_schedule_build(pp_schedule *s, int pp, int vpp, int n_micro, int rank, char *err, size_t n_err);
void pp_schedule_free(pp_schedule *s);
// The most transfers in one group of the schedule (at least 1).
int pp_schedule_max_group(const pp_schedule *s);
// Theoretical bubble fraction (pp - 1) / (vpp * n_micro + pp - 1).
double pp_bubble_theory(int pp, int vpp, int n_micro);

#endif
