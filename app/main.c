// trainer: command-line entry point.
//   mpirun -np N build/trainer CONFIG.yaml [section.key=value ...] [--dry-run [--world-size N]]
// Loads and validates the config, builds the process grid and the backend, then trains
// (or, with --dry-run, prints the plan without allocating).
#include "app/config.h"
#include "app/plan.h"
#include "app/train.h"
#include "kernels/backend.h"
#include "parallel/comm/grid.h"
#include "parallel/step/pp_schedule.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "parallel/comm/nccl/comm_nccl.h"
#include "parallel/comm/nccl/comm_staged.h"
#endif
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
  fprintf(stderr,
          "usage: trainer CONFIG.yaml [section.key=value ...] [--dry-run [--world-size N]]\n"
          "  trains the run that CONFIG describes (docs/config.md); under mpirun, one process per rank.\n"
          "  --dry-run      print the layout, parameters and memory per rank, allocate nothing\n"
          "  --world-size N with --dry-run: plan for N ranks (default: the number of MPI ranks)\n");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char *path = NULL;
  int dry_run = 0, plan_world = 0, n_over = 0, rc = 0;
  char **over = calloc((size_t)argc, sizeof(char *));
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dry-run") == 0) dry_run = 1;
    else if (strcmp(argv[i], "--world-size") == 0 && i + 1 < argc) plan_world = atoi(argv[++i]);
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) { if (rank == 0) usage(); goto out; }
    else if (argv[i][0] == '-') { if (rank == 0) { fprintf(stderr, "error: unknown option '%s'\n", argv[i]); usage(); } rc = 2; goto out; }
    else if (!path && !strchr(argv[i], '=')) path = argv[i];
    else over[n_over++] = argv[i];
  }
  if (!path) {
    if (rank == 0) usage();
    rc = 2;
    goto out;
  }
  cfg c;
  char err[2048];
  int ranks = dry_run && plan_world > 0 ? plan_world : world;
  if (cfg_load(&c, path, n_over, over, err, sizeof err) != 0 || cfg_validate(&c, ranks, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    rc = 2;
    goto out;
  }
  int n_micro = c.train.global_batch / (c.parallel.dp * c.train.micro_batch);
  if (pp_schedule_check(c.parallel.pp, c.parallel.vpp, n_micro, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    rc = 2;
    goto out;
  }
  if (dry_run) {
    if (rank == 0) rc = run_plan(&c, ranks);
    goto out;
  }
  int n_gpus = 0;
#ifdef TRAINER_HAVE_CUDA
  n_gpus = k_cuda_device_count();
#endif
  int use_cuda = strcmp(c.train.device, "cuda") == 0 || (strcmp(c.train.device, "auto") == 0 && n_gpus > 0);
  if (use_cuda && n_gpus == 0) {
    if (rank == 0)
      fprintf(stderr, "error: train.device=cuda but %s; use train.device=cpu (or auto)\n",
#ifdef TRAINER_HAVE_CUDA
              "no GPU is visible"
#else
              "this build has no CUDA backend (no CUDA toolkit at configure time)"
#endif
      );
    rc = 2;
    goto out;
  }
  if (rank == 0) {
    size_t n = cfg_to_yaml(&c, NULL, 0) + 1;
    char *yaml = malloc(n);
    cfg_to_yaml(&c, yaml, n);
    printf("# resolved config (%s)\n%s", path, yaml);
    free(yaml);
  }
  grid g;
  k_backend *be = NULL;
  // Communicator options; the dp-overlap communicator gets its own max_ctas (grid_add_dp_overlap).
  comm_opts co = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, NULL);
  comm_factory cf = {0};
  int dp_overlap = c.parallel.dp_overlap_ctas > 0 && c.parallel.dp > 1;
#ifdef TRAINER_HAVE_CUDA
  if (use_cuda) {
    // One GPU per rank, chosen by the node-local rank, so the same command works on many nodes
    // (and where a launcher shows each rank one GPU, that one). NCCL refuses two ranks on one
    // GPU; the staged MPI communicator lets them share it. Both order their work on the
    // backend's compute stream.
    int staged = strcmp(c.parallel.gpu_comm, "mpi") == 0;
    be = k_backend_cuda_create(comm_nccl_local_rank() % n_gpus);
    co.stream = k_cuda_stream();
    cf = staged ? comm_staged_factory(&co) : comm_nccl_factory(&co);
    grid_init(&g, c.parallel.tp, c.parallel.dp, c.parallel.pp, &cf);
    // The reductions that run beside backward take SMs from its kernels: fewer CTAs, on a
    // communicator of their own, slow the backward less (the rest keep NCCL's choice).
    if (dp_overlap) grid_add_dp_overlap(&g, &cf, c.parallel.dp_overlap_ctas);
  }
#endif
  if (!be) {
    be = k_backend_cpu_create();
    cf = comm_mpi_factory(&co);
    grid_init(&g, c.parallel.tp, c.parallel.dp, c.parallel.pp, &cf);
    // No SMs to spare on CPU ranks; the second communicator only exercises the same code path.
    if (dp_overlap) grid_add_dp_overlap(&g, &cf, c.parallel.dp_overlap_ctas);
  }
  rc = run_train(&c, &g, be);
  grid_free(&g);  // communicators first: NCCL's streams and events belong to the backend's device
  comm_factory_free(&cf);
  k_backend_free(&be);
out:
  free(over);
  MPI_Finalize();
  return rc;
}
