// Process grid: tp x dp x pp ranks (tp fastest, then dp, then pp, so TP groups stay inside a
// node), one communicator per group, all in one struct passed around.
// world rank = tp_rank + tp * (dp_rank + dp * pp_rank).
#ifndef TRAINER_GRID_H
#define TRAINER_GRID_H

#include "parallel/comm/comm.h"

typedef struct grid {
  int world_rank, world_size;
  int tp, dp, pp;
  int tp_rank, dp_rank, pp_rank;
  comm *world;  // all ranks; always MPI over host buffers (loss, gradient norm)
  comm *tp_c;   // same dp_rank and pp_rank
  comm *dp_c;   // same tp_rank and pp_rank
  comm *dp_overlap;  // NULL, or a second communicator over dp_c's ranks (grid_add_dp_overlap)
  comm *pp_c;   // same tp_rank and dp_rank; rank within it is pp_rank
} grid;

// Collective over MPI_COMM_WORLD; tp * dp * pp must equal the world size (checked by
// cfg_validate before). create_comm makes the tp, dp and pp communicators (comm_mpi_create, or
// NCCL over device buffers).
// create_comm must duplicate (or otherwise not keep) the MPI_Comm it is given: grid_init frees
// its MPI_Comm_split results right after the call. The group rank of tp_c/dp_c/pp_c equals
// tp_rank/dp_rank/pp_rank (checked).
void grid_init(grid *g, int tp, int dp, int pp, comm *(*create_comm)(MPI_Comm mpi, const char *name));
// Adds dp_overlap, made by create_comm over the ranks of dp_c (collective over the world).
void grid_add_dp_overlap(grid *g, comm *(*create_comm)(MPI_Comm mpi, const char *name));
// Safe twice.
void grid_free(grid *g);
// World rank of the given coordinates.
static inline int grid_rank_of(const grid *g, int tp_rank, int dp_rank, int pp_rank) {
  return tp_rank + g->tp * (dp_rank + g->dp * pp_rank);
}

#endif
