// Start-up checks of optimizer.offload=host (see run_offload.h).
#include "app/run_offload.h"
#include "app/plan.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

double run_mem_available(const char *meminfo) {
  const char *p = strstr(meminfo, "MemAvailable:");
  double kib = 0;
  return p && sscanf(p, "MemAvailable: %lf kB", &kib) == 1 ? kib * 1024.0 : -1.0;
}

// MemAvailable of this node, or -1 when /proc/meminfo cannot be read (not Linux: no check).
static double node_mem_available(void) {
  char text[8192] = "";
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return run_mem_available(text);
}

int run_offload_check(const cfg *c, const grid *g, const k_backend *be, char *err, size_t n_err) {
  if (!c->optim.offload) return 0;
  int root = g->world_rank == 0;
  if (root && strcmp(be->name, "cpu") == 0)
    printf("note: optimizer.offload=host on CPU ranks: the optimizer state is in host memory already, nothing to "
           "offload; the same bookkeeping runs in plain memory\n");
  // On GPU ranks the cpu engine's AdamW runs on the rank's OpenMP threads; ranks of a node that
  // share too few cores make it many times slower.
  if (root && strcmp(be->name, "cpu") != 0 && c->optim.offload_cpu && omp_get_max_threads() < 2)
    fprintf(stderr, "warning: optimizer.offload_update=cpu with %d OpenMP thread per rank: the host update runs on "
            "one core; give each rank its share of the node's cores (OMP_NUM_THREADS, mpirun --bind-to none)\n",
            omp_get_max_threads());
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(g->world->mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local_rank = 0, local_size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  // Each node's ranks together: a node's memory is shared by every rank placed on it.
  double need = plan_host_bytes(c, plan_rank_params(c, g->pp_rank)), node_need = 0;
  MPI_CHECK(MPI_Allreduce(&need, &node_need, 1, MPI_DOUBLE, MPI_SUM, node));
  MPI_CHECK(MPI_Comm_free(&node));
  double avail = local_rank == 0 ? node_mem_available() : -1;
  int short_here = avail >= 0 && node_need > avail, any_short = 0;
  MPI_CHECK(MPI_Allreduce(&short_here, &any_short, 1, MPI_INT, MPI_MAX, g->world->mpi));
  // The figures of the node that lacks memory: the lowest world rank of such a node says them.
  double fig[3] = {short_here ? node_need : 0, short_here ? avail : 0, short_here ? local_size : 0}, worst[3];
  MPI_CHECK(MPI_Allreduce(fig, worst, 3, MPI_DOUBLE, MPI_MAX, g->world->mpi));
  if (!any_short) return 0;
  return check_errf(err, n_err,
                    "optimizer.offload=host: %d rank%s on one node need %.2f GiB of pinned host memory but the node "
                    "has %.2f GiB available (MemAvailable in /proc/meminfo): lower optimizer.offload_fraction, shard "
                    "the master weights and moments over more dp ranks (parallel.shard=optimizer), or run "
                    "fewer ranks per node",
                    (int)worst[2], worst[2] == 1 ? "" : "s", worst[0] / 1073741824.0, worst[1] / 1073741824.0);
}
