// Where each rank runs (see launch.h): the launcher's environment, MPI's view of the nodes,
// and the start-up layout report.
#include "parallel/comm/launch.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

static const char *launch_getenv_process(const char *name, void *ctx) {
  (void)ctx;
  return getenv(name);
}

// A non-negative decimal integer, or -1 (absent, empty, or anything else).
static int launch_int(launch_getenv_fn get, void *ctx, const char *name) {
  const char *v = get(name, ctx);
  if (!v || !*v) return -1;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x <= 0x7fffffff ? (int)x : -1;
}

void launch_env_read(launch_env *e, launch_getenv_fn get, void *ctx) {
  memset(e, 0, sizeof *e);
  e->rank = e->size = e->local_rank = e->local_size = e->node = e->n_nodes = -1;
  if (!get) get = launch_getenv_process;
  if (get("OMPI_COMM_WORLD_SIZE", ctx)) {
    snprintf(e->launcher, sizeof e->launcher, "mpirun");
    e->rank = launch_int(get, ctx, "OMPI_COMM_WORLD_RANK");
    e->size = launch_int(get, ctx, "OMPI_COMM_WORLD_SIZE");
    e->local_rank = launch_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_RANK");
    e->local_size = launch_int(get, ctx, "OMPI_COMM_WORLD_LOCAL_SIZE");
  } else if (get("PMI_SIZE", ctx) && get("MPI_LOCALRANKID", ctx)) {
    snprintf(e->launcher, sizeof e->launcher, "hydra");
    e->rank = launch_int(get, ctx, "PMI_RANK");
    e->size = launch_int(get, ctx, "PMI_SIZE");
    e->local_rank = launch_int(get, ctx, "MPI_LOCALRANKID");
    e->local_size = launch_int(get, ctx, "MPI_LOCALNRANKS");
  } else if (get("SLURM_STEP_NUM_TASKS", ctx) && get("SLURM_PROCID", ctx)) {
    snprintf(e->launcher, sizeof e->launcher, "srun");
    e->rank = launch_int(get, ctx, "SLURM_PROCID");
    e->size = launch_int(get, ctx, "SLURM_STEP_NUM_TASKS");
    e->local_rank = launch_int(get, ctx, "SLURM_LOCALID");
    e->node = launch_int(get, ctx, "SLURM_NODEID");
    e->n_nodes = launch_int(get, ctx, "SLURM_STEP_NUM_NODES");
    const char *name = get("SLURMD_NODENAME", ctx);
    if (name) snprintf(e->node_name, sizeof e->node_name, "%s", name);
  }
}

int launch_check_size(const launch_env *e, int mpi_size, char *err, size_t n_err) {
  if (!e->launcher[0] || e->size < 0 || e->size == mpi_size) return 0;
  const char *fix = strcmp(e->launcher, "srun") == 0
                        ? "srun could not connect the tasks through a PMI plugin: run srun --mpi=pmix (srun "
                          "--mpi=list shows the plugins; MpiDefault=pmix in slurm.conf makes it the default), or "
                          "launch with mpirun inside the allocation"
                        : "the MPI library the trainer was built with is not the one whose launcher started it: "
                          "use the mpirun of that library (Open MPI's, for the Debian/Ubuntu packages)";
  snprintf(err, n_err,
           "%s started %d processes, but MPI_COMM_WORLD holds %d: each process would train alone. %s", e->launcher,
           e->size, mpi_size, fix);
  return -1;
}

void launch_place_init(launch_place *p) {
  memset(p, 0, sizeof *p);
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &p->rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &p->size));
  MPI_Comm node, leaders;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p->rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &p->local_rank));
  MPI_CHECK(MPI_Comm_size(node, &p->local_size));
  // The node's lowest world rank is its local rank 0 (key = world rank); numbering those
  // leaders in world order numbers the nodes, and each leader tells its node.
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, p->local_rank == 0 ? 0 : MPI_UNDEFINED, p->rank, &leaders));
  if (p->local_rank == 0) {
    MPI_CHECK(MPI_Comm_rank(leaders, &p->node));
    MPI_CHECK(MPI_Comm_size(leaders, &p->n_nodes));
    MPI_CHECK(MPI_Comm_free(&leaders));
  }
  int ids[2] = {p->node, p->n_nodes};
  MPI_CHECK(MPI_Bcast(ids, 2, MPI_INT, 0, node));
  p->node = ids[0];
  p->n_nodes = ids[1];
  MPI_CHECK(MPI_Comm_free(&node));
  int len = 0;
  char host[MPI_MAX_PROCESSOR_NAME];
  MPI_CHECK(MPI_Get_processor_name(host, &len));
  snprintf(p->host, sizeof p->host, "%s", host);
}

// One rank's row of the report, gathered on rank 0.
typedef struct launch_row {
  int rank, node, local_rank, local_size, tp, dp, pp;
  int l_rank, l_local_rank, l_node;
  char host[64], device[24], launcher[16], l_node_name[64];
} launch_row;

static void launch_row_node(const launch_row *r, char *buf, size_t n) {
  if (r->l_node_name[0]) snprintf(buf, n, "%s", r->l_node_name);
  else if (r->l_node >= 0) snprintf(buf, n, "%d", r->l_node);
  else snprintf(buf, n, "-");
}

int launch_report(const launch_place *p, const launch_env *e, const grid *g, const char *device, int per_rank,
                  FILE *out) {
  launch_row me = {.rank = p->rank, .node = p->node, .local_rank = p->local_rank, .local_size = p->local_size,
                   .tp = g->tp_rank, .dp = g->dp_rank, .pp = g->pp_rank, .l_rank = e->rank,
                   .l_local_rank = e->local_rank, .l_node = e->node};
  snprintf(me.host, sizeof me.host, "%.63s", p->host);
  snprintf(me.device, sizeof me.device, "%s", device);
  snprintf(me.launcher, sizeof me.launcher, "%s", e->launcher[0] ? e->launcher : "none");
  if (e->node_name[0]) {
    // Slurm's name of the node where it gives one, so a node is named as the scheduler names it.
    snprintf(me.l_node_name, sizeof me.l_node_name, "%s", e->node_name);
  }
  launch_row *rows = p->rank == 0 ? XCALLOC((size_t)p->size, sizeof *rows) : NULL;
  MPI_CHECK(MPI_Gather(&me, (int)sizeof me, MPI_BYTE, rows, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD));
  int n_warn = 0;
  if (p->rank == 0) {
    // A tp group is the ranks that share dp and pp coordinates; it should sit on one node.
    int span = 0, first_span = -1;
    for (int r = 0; r < p->size; r++) {
      int lead = grid_rank_of(g, 0, rows[r].dp, rows[r].pp);
      if (rows[r].node != rows[lead].node) {
        if (!span) first_span = lead;
        span++;
      }
    }
    int min_local = p->size, max_local = 0;
    for (int r = 0; r < p->size; r++) {
      if (rows[r].local_size < min_local) min_local = rows[r].local_size;
      if (rows[r].local_size > max_local) max_local = rows[r].local_size;
    }
    char per_node[48];
    if (min_local == max_local) snprintf(per_node, sizeof per_node, "%d per node", min_local);
    else snprintf(per_node, sizeof per_node, "%d to %d per node", min_local, max_local);
    fprintf(out, "layout: %d rank%s on %d node%s (%s), launcher %s; %s\n", p->size, p->size == 1 ? "" : "s", p->n_nodes,
            p->n_nodes == 1 ? "" : "s", per_node, me.launcher,
            g->tp == 1 ? "tp 1" : span ? "tp groups span nodes" : "every tp group within one node");
    if (per_rank)
      for (int r = 0; r < p->size; r++) {
        const launch_row *w = &rows[r];
        char lnode[64];
        launch_row_node(w, lnode, sizeof lnode);
        fprintf(out,
                "layout rank=%d node=%d host=%s local_rank=%d local_size=%d tp=%d dp=%d pp=%d device=%s "
                "launcher=%s launcher_rank=%d launcher_local_rank=%d launcher_node=%s\n",
                w->rank, w->node, w->host, w->local_rank, w->local_size, w->tp, w->dp, w->pp, w->device, w->launcher,
                w->l_rank, w->l_local_rank, lnode);
      }
    if (span) {
      n_warn++;
      fprintf(out,
              "warning: %d rank%s on another node than the rest of %s tp group (first: the group of rank %d, "
              "tp %d): tensor-parallel traffic crosses the network; start a multiple of parallel.tp ranks on every "
              "node (mpirun --map-by ppr:N:node, srun --ntasks-per-node N)\n",
              span, span == 1 ? " sits" : "s sit", span == 1 ? "its" : "their", first_span, g->tp);
    }
    for (int r = 0; r < p->size; r++) {
      const launch_row *w = &rows[r];
      int bad_rank = w->l_rank >= 0 && w->l_rank != w->rank;
      int bad_local = w->l_local_rank >= 0 && w->l_local_rank != w->local_rank;
      if (!bad_rank && !bad_local) continue;
      n_warn++;
      fprintf(out,
              "warning: rank %d: %s says rank %d, local rank %d; MPI says rank %d, local rank %d (the GPU follows "
              "MPI's local rank)\n",
              w->rank, w->launcher, w->l_rank, w->l_local_rank, w->rank, w->local_rank);
    }
    fflush(out);
    free(rows);
  }
  MPI_CHECK(MPI_Bcast(&n_warn, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return n_warn;
}
