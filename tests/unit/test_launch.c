// Tests of parallel/comm/launch.c. The launchers' environments are set by hand, as srun,
// Open MPI's mpirun and MPICH's hydra set them for a 16-task job on two nodes of 8 (and as a
// Slurm batch script and mpirun inside an allocation leave them), so the discovery srun relies
// on is tested on machines without Slurm. Under mpirun -np 4: MPI's view of the node (one node
// of 4), and the layout report of a tp 2 x dp 2 grid, warnings included.
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/launch.h"
#include "test_util.h"

typedef struct var {
  const char *name;
  char value[64];
} var;

typedef struct env_table {
  var v[16];
  int n;
} env_table;

static void env_set(env_table *t, const char *name, const char *fmt, int x) {
  t->v[t->n].name = name;
  snprintf(t->v[t->n].value, sizeof t->v[t->n].value, fmt, x);
  t->n++;
}

static const char *env_get(const char *name, void *ctx) {
  const env_table *t = ctx;
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->v[i].name, name) == 0) return t->v[i].value;
  return NULL;
}

// srun --nodes 2 --ntasks-per-node 8, task r (as a job step's environment has it).
static env_table env_srun(int r) {
  env_table t = {.n = 0};
  env_set(&t, "SLURM_JOB_ID", "%d", 42);
  env_set(&t, "SLURM_STEP_ID", "%d", 0);
  env_set(&t, "SLURM_PROCID", "%d", r);
  env_set(&t, "SLURM_LOCALID", "%d", r % 8);
  env_set(&t, "SLURM_NODEID", "%d", r / 8);
  env_set(&t, "SLURM_NTASKS", "%d", 16);
  env_set(&t, "SLURM_STEP_NUM_TASKS", "%d", 16);
  env_set(&t, "SLURM_STEP_NUM_NODES", "%d", 2);
  env_set(&t, "SLURMD_NODENAME", "gpu-%d", r / 8);
  return t;
}

static void test_env(void) {
  for (int r = 0; r < 16; r++) {
    env_table t = env_srun(r);
    launch_env e;
    launch_env_read(&e, env_get, &t);
    char name[16];
    snprintf(name, sizeof name, "gpu-%d", r / 8);
    EXPECT(!strcmp(e.launcher, "srun") && e.rank == r && e.size == 16 && e.local_rank == r % 8 && e.node == r / 8 &&
               e.n_nodes == 2 && !strcmp(e.node_name, name) && e.local_size == -1,
           "srun task %d: launcher '%s' rank %d size %d local %d node %d of %d '%s'", r, e.launcher, e.rank, e.size,
           e.local_rank, e.node, e.n_nodes, e.node_name);
    char err[512] = "";
    EXPECT(launch_check_size(&e, 16, err, sizeof err) == 0, "srun's 16 tasks in a world of 16: %s", err);
    EXPECT(launch_check_size(&e, 1, err, sizeof err) == -1 && strstr(err, "srun started 16 processes") &&
               strstr(err, "MPI_COMM_WORLD holds 1") && strstr(err, "srun --mpi=pmix"),
           "srun's 16 tasks, each an MPI world of 1: '%s'", err);
  }
  // A batch script's own environment (no job step): SLURM_PROCID and SLURM_NTASKS, no launch.
  env_table batch = {.n = 0};
  env_set(&batch, "SLURM_JOB_ID", "%d", 42);
  env_set(&batch, "SLURM_PROCID", "%d", 0);
  env_set(&batch, "SLURM_LOCALID", "%d", 0);
  env_set(&batch, "SLURM_NODEID", "%d", 0);
  env_set(&batch, "SLURM_NTASKS", "%d", 16);
  launch_env e;
  launch_env_read(&e, env_get, &batch);
  char err[512] = "";
  EXPECT(!e.launcher[0] && e.rank == -1 && launch_check_size(&e, 1, err, sizeof err) == 0,
         "a batch script is not a launch: launcher '%s', rank %d", e.launcher, e.rank);
  // mpirun inside the allocation: its OMPI_* variables win over the SLURM_* it passes on.
  env_table in_alloc = batch;
  env_set(&in_alloc, "OMPI_COMM_WORLD_RANK", "%d", 9);
  env_set(&in_alloc, "OMPI_COMM_WORLD_SIZE", "%d", 16);
  env_set(&in_alloc, "OMPI_COMM_WORLD_LOCAL_RANK", "%d", 1);
  env_set(&in_alloc, "OMPI_COMM_WORLD_LOCAL_SIZE", "%d", 8);
  env_set(&in_alloc, "SLURM_STEP_NUM_TASKS", "%d", 1);  // even inside an srun of one task
  launch_env_read(&e, env_get, &in_alloc);
  EXPECT(!strcmp(e.launcher, "mpirun") && e.rank == 9 && e.size == 16 && e.local_rank == 1 && e.local_size == 8 &&
             e.node == -1 && !e.node_name[0],
         "mpirun in an allocation: '%s' rank %d size %d local %d/%d", e.launcher, e.rank, e.size, e.local_rank,
         e.local_size);
  EXPECT(launch_check_size(&e, 1, err, sizeof err) == -1 && strstr(err, "mpirun started 16 processes") &&
             strstr(err, "mpirun of that library"),
         "mpirun of another MPI: '%s'", err);
  // MPICH's hydra.
  env_table hydra = {.n = 0};
  env_set(&hydra, "PMI_RANK", "%d", 5);
  env_set(&hydra, "PMI_SIZE", "%d", 16);
  env_set(&hydra, "MPI_LOCALRANKID", "%d", 5);
  env_set(&hydra, "MPI_LOCALNRANKS", "%d", 8);
  launch_env_read(&e, env_get, &hydra);
  EXPECT(!strcmp(e.launcher, "hydra") && e.rank == 5 && e.size == 16 && e.local_rank == 5 && e.local_size == 8,
         "hydra: '%s' rank %d size %d local %d/%d", e.launcher, e.rank, e.size, e.local_rank, e.local_size);
  // Nothing: a plain process. Garbage values read as unknown.
  env_table none = {.n = 0}, junk = {.n = 0};
  launch_env_read(&e, env_get, &none);
  EXPECT(!e.launcher[0] && e.size == -1 && launch_check_size(&e, 1, err, sizeof err) == 0, "no launcher");
  env_set(&junk, "SLURM_STEP_NUM_TASKS", "%dx", 16);
  env_set(&junk, "SLURM_PROCID", "%d", -3);
  launch_env_read(&e, env_get, &junk);
  EXPECT(!strcmp(e.launcher, "srun") && e.size == -1 && e.rank == -1 && launch_check_size(&e, 1, err, sizeof err) == 0,
         "unreadable srun values are unknown, not a mismatch: size %d rank %d", e.size, e.rank);
}

// MPI's view under mpirun -np 4 on this one machine, and the report of tp 2 x dp 2.
static void test_place_and_report(void) {
  launch_place p;
  launch_place_init(&p);
  EXPECT(p.size == 4 && p.node == 0 && p.n_nodes == 1 && p.local_rank == p.rank && p.local_size == 4 && p.host[0],
         "rank %d: node %d of %d, local %d/%d, host '%s'", p.rank, p.node, p.n_nodes, p.local_rank, p.local_size,
         p.host);
  comm_factory f = comm_mpi_factory(NULL);
  grid g;
  grid_init(&g, 2, 2, 1, &f);
  launch_env e;
  launch_env_read(&e, NULL, NULL);  // mpirun's own
  FILE *out = tmpfile();
  int n_warn = launch_report(&p, &e, &g, "cpu", 1, out);
  EXPECT(n_warn == 0, "rank %d: %d warnings from a plain tp 2 x dp 2 layout", p.rank, n_warn);
  if (p.rank == 0) {
    char text[4096] = "";
    rewind(out);
    size_t n = fread(text, 1, sizeof text - 1, out);
    text[n] = '\0';
    EXPECT(strstr(text, "layout: 4 ranks on 1 node (4 per node), launcher mpirun; every tp group within one node\n"),
           "summary line: %s", text);
    EXPECT(strstr(text, "layout rank=3 node=0 host=") && strstr(text, " local_rank=3 local_size=4 tp=1 dp=1 pp=0 "
                                                                     "device=cpu launcher=mpirun launcher_rank=3 "
                                                                     "launcher_local_rank=3 launcher_node=-\n"),
           "rank 3's line: %s", text);
  }
  fclose(out);
  // Two "nodes" of 2 ranks that cut every tp group of 4 in half, and a launcher whose local
  // rank disagrees on rank 1: one warning each, on every rank.
  grid_free(&g);
  grid_init(&g, 4, 1, 1, &f);
  launch_place split = p;
  split.node = p.rank / 2;
  split.n_nodes = 2;
  split.local_rank = p.rank % 2;
  split.local_size = 2;
  launch_env liar = e;
  liar.local_rank = p.rank == 1 ? 0 : split.local_rank;
  out = tmpfile();
  n_warn = launch_report(&split, &liar, &g, "cpu", 0, out);
  EXPECT(n_warn == 2, "rank %d: %d warnings, want 2 (a tp group across nodes, rank 1's local rank)", p.rank, n_warn);
  if (p.rank == 0) {
    char text[4096] = "";
    rewind(out);
    size_t n = fread(text, 1, sizeof text - 1, out);
    text[n] = '\0';
    EXPECT(strstr(text, "tp groups span nodes") && strstr(text, "warning: 2 ranks sit on another node than the rest of their tp group") &&
               strstr(text, "warning: rank 1: mpirun says rank 1, local rank 0; MPI says rank 1, local rank 1") &&
               !strstr(text, "layout rank="),
           "warnings: %s", text);
  }
  fclose(out);
  grid_free(&g);
  comm_factory_free(&f);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  test_env();
  test_place_and_report();
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}
