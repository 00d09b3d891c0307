// trainer: command-line entry point.
//   mpirun -np N build/trainer CONFIG.yaml [section.key=value ...] [--dry-run [--world-size N]]
// Parses the command line, loads and validates the config, then either prints the plan
// (--dry-run, nothing allocated) or builds the backend, communicators and grid through the
// factory and runs the trainer.
#include "app/config.h"
#include "app/factory.h"
#include "app/plan.h"
#include "app/trainer.h"
#include "parallel/step/pp_schedule.h"
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

typedef struct cli {
  const char *path;
  char **over;  // section.key=value overrides
  int n_over, dry_run, plan_world;
} cli;

enum { CLI_RUN = 0, CLI_HELP = -1 };  // cli_parse's results besides an exit code

// CLI_RUN, CLI_HELP (usage printed), or the exit code of a bad command line. Rank 0 prints.
static int cli_parse(cli *a, int argc, char **argv, int rank) {
  a->over = calloc((size_t)argc, sizeof(char *));
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dry-run") == 0) a->dry_run = 1;
    else if (strcmp(argv[i], "--world-size") == 0 && i + 1 < argc) a->plan_world = atoi(argv[++i]);
    else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      if (rank == 0) usage();
      return CLI_HELP;
    } else if (argv[i][0] == '-') {
      if (rank == 0) fprintf(stderr, "error: unknown option '%s'\n", argv[i]), usage();
      return 2;
    } else if (!a->path && !strchr(argv[i], '=')) a->path = argv[i];
    else a->over[a->n_over++] = argv[i];
  }
  if (!a->path && rank == 0) usage();
  return a->path ? CLI_RUN : 2;
}

// Loads, validates and checks the schedule for `ranks` ranks. 0, or -1 with a message.
static int load_config(cfg *c, const cli *a, int ranks, char *err, size_t n_err) {
  if (cfg_load(c, a->path, a->n_over, a->over, err, n_err) != 0 || cfg_validate(c, ranks, err, n_err) != 0) return -1;
  return pp_schedule_check(c->parallel.pp, c->parallel.vpp, cfg_n_micro(c), err, n_err);
}

static void print_resolved(const cfg *c, const char *path) {
  size_t n = cfg_to_yaml(c, NULL, 0) + 1;
  char *yaml = malloc(n);
  cfg_to_yaml(c, yaml, n);
  printf("# resolved config (%s)\n%s", path, yaml);
  free(yaml);
}

static int run(const cli *a, int rank, int world) {
  cfg c;
  char err[2048];
  int ranks = a->dry_run && a->plan_world > 0 ? a->plan_world : world;
  if (load_config(&c, a, ranks, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    return 2;
  }
  if (a->dry_run) return rank == 0 ? run_plan(&c, ranks) : 0;
  factory f;
  if (factory_init(&f, &c, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    factory_free(&f);
    return 2;
  }
  if (rank == 0) print_resolved(&c, a->path);
  // Test-only fault injection (tests/test_resume.sh), read once here.
  const char *kill_env = getenv("TRAINER_TEST_KILL_IN_CKPT");
  trainer_hooks hooks = {.kill_in_ckpt = kill_env ? atoi(kill_env) : -1};
  int rc = trainer_run(&c, &f.g, f.be, &hooks);
  factory_free(&f);
  return rc;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cli a = {0};
  int rc = cli_parse(&a, argc, argv, rank);
  if (rc == CLI_RUN) rc = run(&a, rank, world);
  free(a.over);
  MPI_Finalize();
  return rc == CLI_HELP ? 0 : rc;
}
