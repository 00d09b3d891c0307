// Prints the pipeline schedule of every rank, one line each, as pp_schedule_build makes it:
// F/B for the forward/backward of micro-batch m in local chunk c ("F3.1"), sA/rA/sG/rG for the
// sends and receives of activations and gradients, and [ ... ] around each group of transfers.
// scripts/bench/pp_bubble_model.py reads it.
//   pp_schedule_dump PP VPP N_MICRO
#include <stdio.h>
#include <stdlib.h>

#include "parallel/step/pp_schedule.h"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: pp_schedule_dump PP VPP N_MICRO\n");
    return 2;
  }
  int pp = atoi(argv[1]), vpp = atoi(argv[2]), n_micro = atoi(argv[3]);
  static const char *const name[] = {"F", "B", "sA", "rA", "sG", "rG"};
  for (int r = 0; r < pp; r++) {
    pp_schedule s;
    char err[256];
    if (pp_schedule_build(&s, pp, vpp, n_micro, r, err, sizeof err) != 0) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    printf("rank %d:", r);
    for (int i = 0; i < s.n_steps; i++) {
      const pp_step *t = &s.steps[i];
      int comm = t->op != PP_FWD && t->op != PP_BWD;
      int open = comm && (i == 0 || s.steps[i - 1].op == PP_FWD || s.steps[i - 1].op == PP_BWD);
      int close = comm && (i + 1 == s.n_steps || s.steps[i + 1].op == PP_FWD || s.steps[i + 1].op == PP_BWD);
      printf("%s %s%d.%d%s", open ? " [" : "", name[t->op], t->micro, t->chunk, close ? " ]" : "");
    }
    printf("\n");
    pp_schedule_free(&s);
  }
  return 0;
}
