// trainer: command-line entry point.
//   mpirun -np N build/trainer CONFIG.yaml [section.key=value ...] [--print-layout]
//   build/trainer CONFIG.yaml [section.key=value ...] --dry-run [--world-size N] [--gpus-per-node N]
//       [--gpu-mem GIB]
// Parses the command line, loads and validates the config, then either prints the plan
// (--dry-run, nothing allocated) or builds the backend, communicators and grid through the
// factory and runs the trainer.
#include "app/config.h"
#include "app/factory.h"
#include "app/plan.h"
#include "app/trainer.h"
#include "parallel/comm/launch.h"
#include "parallel/step/pp_schedule.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
  fprintf(stderr,
          "usage: trainer CONFIG.yaml [section.key=value ...] [--print-layout] [--dry-run [--world-size N] "
          "[--gpus-per-node N] [--gpu-mem GIB]]\n"
          "  trains the run that CONFIG describes (docs/config.md); under mpirun or srun, one process per rank.\n"
          "  --print-layout    at start-up, one line per rank: node, node-local rank, tp/dp/pp coordinates,\n"
          "                    device and what the launcher said (docs/multinode.md)\n"
          "  --dry-run         print the layout, parameters, memory per rank and the launch command; allocate\n"
          "                    nothing\n"
          "  --world-size N    with --dry-run: plan for N ranks (default: tp * pp * dp of the config; with\n"
          "                    parallel.dp = 0, the number of ranks launched)\n"
          "  --gpus-per-node N with --dry-run: ranks per node in the launch command and node map (default 8)\n"
          "  --gpu-mem GIB     with --dry-run: a GPU's memory in GiB; says whether the fullest rank fits and, if\n"
          "                    not, which parallel.shard mode would\n");
}

typedef struct cli {
  const char *path;
  char **over;  // section.key=value overrides
  int n_over, dry_run, plan_world, gpus_per_node, gpu_mem_gib, print_layout;
  const char *argv0;
} cli;

enum { CLI_RUN = 0, CLI_HELP = -1 };  // cli_parse's results besides an exit code

// CLI_RUN, CLI_HELP (usage printed), or the exit code of a bad command line. Rank 0 prints.
static int cli_parse(cli *a, int argc, char **argv, int rank) {
  a->over = calloc((size_t)argc, sizeof(char *));
  a->argv0 = argv[0];
  a->gpus_per_node = 8;
  for (int i = 1; i < argc; i++) {
    int *num = strcmp(argv[i], "--world-size") == 0 ? &a->plan_world
               : strcmp(argv[i], "--gpus-per-node") == 0 ? &a->gpus_per_node
               : strcmp(argv[i], "--gpu-mem") == 0       ? &a->gpu_mem_gib
                                                         : NULL;
    if (strcmp(argv[i], "--dry-run") == 0) a->dry_run = 1;
    else if (strcmp(argv[i], "--print-layout") == 0) a->print_layout = 1;
    else if (num) {
      // Digits only: strtol alone would also take leading blanks and a sign.
      const char *s = i + 1 < argc ? argv[i + 1] : "";
      char *end = NULL;
      long v = s[0] >= '0' && s[0] <= '9' ? strtol(s, &end, 10) : 0;
      if (!end || *end || v < 1 || v > 1048576) {
        if (rank == 0) fprintf(stderr, "error: %s needs a whole number %s from 1 to 1048576, found '%s'\n", argv[i],
                               num == &a->gpu_mem_gib ? "of GiB" : "of ranks", i + 1 < argc ? argv[i + 1] : "");
        return 2;
      }
      *num = (int)v;
      i++;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
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

// The ranks --dry-run plans for: --world-size, else the config's own tp * pp * dp, else (dp 0)
// the ranks launched. 0 with a message when the config does not load.
static int plan_ranks(const cli *a, int world, int *from_launch, char *err, size_t n_err) {
  *from_launch = 0;
  if (a->plan_world > 0) return a->plan_world;
  cfg c;
  if (cfg_load(&c, a->path, a->n_over, a->over, err, n_err) != 0) return 0;
  const cfg_parallel *p = &c.parallel;
  long long own = (long long)p->tp * p->pp * p->dp;
  if (p->dp > 0 && own <= 1048576) return (int)own;
  *from_launch = 1;
  return world;
}

static int run(const cli *a, int rank, int world, const launch_env *env) {
  cfg c;
  char err[2048];
  int ranks = world, from_launch = 0;
  if (a->dry_run && (ranks = plan_ranks(a, world, &from_launch, err, sizeof err)) == 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    return 2;
  }
  if (load_config(&c, a, ranks, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    return 2;
  }
  if (a->dry_run) {
    if (rank != 0) return 0;
    if (from_launch)
      printf("parallel.dp = 0 leaves the rank count to the launch: planned for the %d rank%s launched; pass "
             "--world-size N (or launch N ranks) to plan for N\n", ranks, ranks == 1 ? "" : "s");
    plan_launch launch = {.argv0 = a->argv0, .config = a->path, .over = (const char *const *)a->over,
                          .n_over = a->n_over, .gpus_per_node = a->gpus_per_node,
                          .gpu_mem_gib = a->gpu_mem_gib};
    return run_plan(&c, ranks, &launch);
  }
  factory f;
  if (factory_init(&f, &c, err, sizeof err) != 0) {
    if (rank == 0) fprintf(stderr, "error: %s\n", err);
    factory_free(&f);
    return 2;
  }
  char device[24] = "cpu";
  if (f.device >= 0) snprintf(device, sizeof device, "cuda:%d", f.device);
  launch_report(&f.place, env, &f.g, device, a->print_layout, stdout);
  if (rank == 0) print_resolved(&c, a->path);
  static const char *const tp_how[] = {
      [CFG_TP_OVERLAP_P2P] = "peer copies on the copy engines, overlapped with the GEMMs",
      [CFG_TP_OVERLAP_NCCL] = "the communicator's collectives, overlapped with the GEMMs",
      [CFG_TP_OVERLAP_NONE] = "the communicator's collectives, not overlapped (each waited for at its start)"};
  const cfg_tp_overlap tpo = c.parallel.tp_overlap;
  const cfg_tp_reduce tpr = c.parallel.tp_reduce_dtype;
  // auto: the backend's activation dtype, as the model resolves it (model_init).
  const int reduce_bf16 = tpr == CFG_TP_REDUCE_BF16 || (tpr == CFG_TP_REDUCE_AUTO && f.be->act == K_BF16);
  const int tp_sp = f.g.tp > 1 && c.parallel.sequence_parallel;
  const char *no_sp = f.g.tp == 1 ? "with parallel.tp = 1" : "without sequence parallelism (the tp reductions are all-reduces)";
  if (rank == 0 && tp_sp)
    printf("tensor parallelism: gathers and reduce-scatters as %s (parallel.tp_overlap=%s), partial sums in %s "
           "(parallel.tp_reduce_dtype=%s)\n",
           tp_how[f.tp_overlap], cfg_tp_overlap_names[tpo], reduce_bf16 ? "bf16" : "fp32", cfg_tp_reduce_names[tpr]);
  else if (rank == 0 && (tpo == CFG_TP_OVERLAP_P2P || (tpo == CFG_TP_OVERLAP_NONE && f.g.tp == 1)))
    printf("parallel.tp_overlap=%s has no effect %s\n", cfg_tp_overlap_names[tpo], no_sp);
  if (rank == 0 && tpr != CFG_TP_REDUCE_AUTO && !tp_sp)
    printf("parallel.tp_reduce_dtype=%s has no effect %s\n", cfg_tp_reduce_names[tpr], no_sp);
  // Test-only fault injection (tests/e2e/test_resume.sh), read once here.
  const char *kill_env = getenv("TRAINER_TEST_KILL_IN_CKPT"), *fail_env = getenv("TRAINER_TEST_FAIL_IN_CKPT"),
             *nan_env = getenv("TRAINER_TEST_NAN_AT_STEP"), *inf_env = getenv("TRAINER_TEST_FP8_INF_AT_STEP");
  const char *delay_env = getenv("TRAINER_TEST_CKPT_DELAY_S"), *huge_env = getenv("TRAINER_TEST_HUGE_GRAD_AT_STEP");
  const char *nan_ckpt_env = getenv("TRAINER_TEST_NAN_IN_CKPT"), *inf_lr_env = getenv("TRAINER_TEST_INF_LR_AT_STEP");
  trainer_hooks hooks = {.ckpt = {.kill_after = kill_env ? atoi(kill_env) : -1,
                                  .fail_at = fail_env ? atoi(fail_env) : -1,
                                  .nan_in = nan_ckpt_env ? atoi(nan_ckpt_env) : -1,
                                  .delay_s = delay_env ? atof(delay_env) : 0},
                         .nan_at_step = nan_env ? atoll(nan_env) : 0,
                         .fp8_inf_at_step = inf_env ? atoll(inf_env) : 0,
                         .huge_at_step = huge_env ? atoll(huge_env) : 0,
                         .inf_lr_at_step = inf_lr_env ? atoll(inf_lr_env) : 0};
  int rc = trainer_run(&c, &f.g, f.be, &hooks);
  factory_free(&f);
  return rc;
}

int main(int argc, char **argv) {
  // Funneled: OpenMP threads and the background write of asynchronous checkpoints run beside the
  // main thread, and only the main thread calls MPI.
  int thread_level = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &thread_level);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cli a = {0};
  int rc = cli_parse(&a, argc, argv, rank);
  // A launcher that started more processes than MPI connected (srun without a PMI plugin) would
  // leave each one training alone: stop before any of them writes.
  launch_env env;
  launch_env_read(&env, NULL, NULL);
  char err[1024];
  if (rc == CLI_RUN && launch_check_size(&env, world, err, sizeof err) != 0) {
    if (env.rank <= 0) fprintf(stderr, "error: %s\n", err);
    rc = 2;
  }
  if (rc == CLI_RUN) rc = run(&a, rank, world, &env);
  free(a.over);
  MPI_Finalize();
  return rc == CLI_HELP ? 0 : rc;
}
