// `trainer CONFIG --dry-run`: the layout of a run (which rank holds which layers, heads and
// vocab slice), parameters per rank and a memory estimate per rank, without allocating.
#ifndef TRAINER_PLAN_H
#define TRAINER_PLAN_H

#include "app/config.h"

// Prints the plan of c (validated for world_size ranks) to stdout. Returns 0.
int run_plan(const cfg *c, int world_size);

#endif
