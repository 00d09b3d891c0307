// Process grid: splits MPI_COMM_WORLD into the tensor-, data- and pipeline-parallel groups of
// this rank (tp fastest, then dp, then pp) and wraps each in a communicator of the backend,
// made by the factory it is given.
#include "parallel/comm/grid.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

// Splits world by color and wraps the piece; key orders ranks inside a group so that the
// group rank is the coordinate along that axis (MPI_Comm_split sorts by key).
static comm *grid_split(int color, int key, const char *name, const comm_factory *f, const comm_opts *opts) {
  MPI_Comm part;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &part));
  comm *c = f->create(f->ctx, part, name, opts);  // every create duplicates, so our split is ours to free
  MPI_CHECK(MPI_Comm_free(&part));
  return c;
}

// The dp group of g's rank (same tp_rank and pp_rank), ordered by dp_rank.
static comm *grid_dp_split(const grid *g, const char *name, const comm_factory *f, const comm_opts *opts) {
  return grid_split(g->tp_rank + g->tp * g->pp_rank, g->dp_rank, name, f, opts);
}

// The shard group of g's rank inside its dp group (grid_set_shard_group), ordered by dp_rank.
static comm *grid_shard_split(const grid *g, const char *name, const comm_factory *f, const comm_opts *opts) {
  if (!g->shard_c) return grid_dp_split(g, name, f, opts);
  const int size = g->shard_c->size, groups = g->dp / size;
  return grid_split((g->tp_rank + g->tp * g->pp_rank) * groups + g->dp_rank / size, g->dp_rank % size, name, f, opts);
}

void grid_init(grid *g, int tp, int dp, int pp, const comm_factory *f) {
  memset(g, 0, sizeof *g);
  CHECK(tp >= 1 && dp >= 1 && pp >= 1, "grid: tp = %d, dp = %d, pp = %d must all be >= 1", tp, dp, pp);
  CHECK(f && f->create, "grid: no communicator factory given");
  comm_opts_check(&f->opts, "grid_init");
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g->world_size));
  CHECK((long long)tp * dp * pp == g->world_size,
        "grid: parallel.tp * parallel.dp * parallel.pp = %d * %d * %d = %lld, but the job has %d ranks; "
        "change the layout or the rank count (mpirun -np)", tp, dp, pp, (long long)tp * dp * pp, g->world_size);
  g->tp = tp;
  g->dp = dp;
  g->pp = pp;
  // Inverse of world = tp_rank + tp * (dp_rank + dp * pp_rank).
  g->tp_rank = g->world_rank % tp;
  g->dp_rank = (g->world_rank / tp) % dp;
  g->pp_rank = g->world_rank / (tp * dp);
  g->opts = f->opts;

  // Color = the coordinates the group shares, key = the coordinate that varies within it.
  // The world communicator carries host scalars (loss, gradient norm) on every backend.
  g->world = comm_mpi_create(MPI_COMM_WORLD, "world", &f->opts);
  g->tp_c = grid_split(g->dp_rank + dp * g->pp_rank, g->tp_rank, "tp", f, &f->opts);
  g->dp_c = grid_dp_split(g, "dp", f, &f->opts);
  g->pp_c = grid_split(g->tp_rank + tp * g->dp_rank, g->pp_rank, "pp", f, &f->opts);
  CHECK(g->tp_c->rank == g->tp_rank && g->dp_c->rank == g->dp_rank && g->pp_c->rank == g->pp_rank,
        "grid: group ranks (tp %d, dp %d, pp %d) differ from coordinates (%d, %d, %d)",
        g->tp_c->rank, g->dp_c->rank, g->pp_c->rank, g->tp_rank, g->dp_rank, g->pp_rank);
}

void grid_set_shard_group(grid *g, const comm_factory *f, int size) {
  CHECK(f && f->create, "grid_set_shard_group: no communicator factory given");
  CHECK(!g->shard_c && !g->dp_overlap, "grid_set_shard_group: once per grid, before grid_add_dp_overlap");
  CHECK(size > 1 && size < g->dp && g->dp % size == 0,
        "parallel.shard_group = %d must divide parallel.dp = %d and lie between 2 and dp - 1", size, g->dp);
  const int groups = g->dp / size, base = g->tp_rank + g->tp * g->pp_rank;
  g->shard_c = grid_split(base * groups + g->dp_rank / size, g->dp_rank % size, "shard", f, &f->opts);
  g->replica_c = grid_split(base * size + g->dp_rank % size, g->dp_rank / size, "replica", f, &f->opts);
}

void grid_add_dp_overlap(grid *g, const comm_factory *f, int max_ctas) {
  CHECK(f && f->create, "grid_add_dp_overlap: no communicator factory given");
  CHECK(!g->dp_overlap, "grid_add_dp_overlap called twice");
  comm_opts o = f->opts;
  o.max_ctas = max_ctas;
  comm_opts_check(&o, "grid_add_dp_overlap");
  g->dp_overlap = grid_shard_split(g, "dp-overlap", f, &o);
}

void grid_add_gathers(grid *g, const comm_factory *f, int n, int zero_cta) {
  CHECK(f && f->create, "grid_add_gathers: no communicator factory given");
  CHECK(!g->gather_c && n >= 1, "grid_add_gathers: once per grid, n = %d >= 1", n);
  comm_opts o = f->opts;
  o.zero_cta = zero_cta;
  g->gather_c = XCALLOC((size_t)n, sizeof(comm *));
  for (int i = 0; i < n; i++) {
    char name[24];
    snprintf(name, sizeof name, "gather-%d", i + 1);
    g->gather_c[i] = grid_shard_split(g, name, f, &o);
  }
  g->n_gather = n;
}

void grid_free(grid *g) {
  if (!g) return;
  for (int i = 0; i < g->n_gather; i++) comm_free(&g->gather_c[i]);
  free(g->gather_c);
  g->gather_c = NULL;
  g->n_gather = 0;
  comm_free(&g->dp_overlap);
  comm_free(&g->replica_c);
  comm_free(&g->shard_c);
  comm_free(&g->pp_c);
  comm_free(&g->dp_c);
  comm_free(&g->tp_c);
  comm_free(&g->world);
}
