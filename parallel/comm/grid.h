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
  comm *dp_overlap;  // NULL, or a second communicator over grid_shard_comm's ranks (grid_add_dp_overlap)
  // parallel.shard_group: the dp ranks that share out the sharded state, and those holding the
  // same part of it in the other groups (grid_set_shard_group); NULL when the group is all of dp.
  comm *shard_c;    // dp ranks [k * size, (k + 1) * size) of this rank's k; rank = dp_rank % size
  comm *replica_c;  // dp ranks with this rank's dp_rank % size; rank = dp_rank / size
  comm **gather_c;  // (n_gather) more communicators over grid_shard_comm's ranks (grid_add_gathers)
  int n_gather;
  comm *pp_c;   // same tp_rank and dp_rank; rank within it is pp_rank
  comm_opts opts;  // the options tp_c, dp_c, pp_c and world were made with; a host communicator made
                   // later over a group's ranks (comm_mpi_create) takes its mpi_chunk_elems from here
} grid;

// Collective over MPI_COMM_WORLD; tp * dp * pp must equal the world size (checked by
// cfg_validate before). f makes the tp, dp and pp communicators with f->opts (MPI over host
// buffers, NCCL or staged over device buffers); world is MPI with the same options. f's create
// duplicates the MPI_Comm it is given (comm.h), since grid_init frees its MPI_Comm_split results
// right after the call. f must outlive the grid (comm_factory_free after grid_free). The group
// rank of tp_c/dp_c/pp_c equals tp_rank/dp_rank/pp_rank (checked).
void grid_init(grid *g, int tp, int dp, int pp, const comm_factory *f);
// Shards inside groups of size consecutive dp ranks (size divides dp, 1 < size < dp): adds
// shard_c and replica_c, made by f. Collective over the world; once per grid, before
// grid_add_dp_overlap.
void grid_set_shard_group(grid *g, const comm_factory *f, int size);
// The communicator over the ranks that share out the sharded state: shard_c, or dp_c.
static inline comm *grid_shard_comm(const grid *g) { return g->shard_c ? g->shard_c : g->dp_c; }
// Adds dp_overlap over the ranks of grid_shard_comm, made by f with f->opts but at most max_ctas
// CTAs per operation (0: NCCL's choice; only NCCL uses it): the DP reductions that run beside
// backward slow it less with fewer SMs. Collective over the world; once per grid.
void grid_add_dp_overlap(grid *g, const comm_factory *f, int max_ctas);
// Adds n communicators over the ranks of grid_shard_comm, made by f with f->opts (and
// comm_opts.zero_cta as given): parallel.shard=weights gathers layers on them, with
// parallel.gather_copy_engine one per slot, else those it prefetches beyond the next one.
// Collective over the world; once per grid, after grid_set_shard_group.
void grid_add_gathers(grid *g, const comm_factory *f, int n, int zero_cta);
// Safe twice.
void grid_free(grid *g);
// World rank of the given coordinates.
static inline int grid_rank_of(const grid *g, int tp_rank, int dp_rank, int pp_rank) {
  return tp_rank + g->tp * (dp_rank + g->dp * pp_rank);
}

#endif
