// The training loop (see train.h). Rank 0 prints and writes the metrics file; every rank
// holds the same step counter and data position, so the loop needs no coordination beyond
// the collectives of the step itself.
#include "app/train.h"
#include "app/run_ckpt.h"
#include "data/data.h"
#include "kernels/check.h"
#include "model/ckpt.h"
#include "parallel/step/optim.h"
#include "parallel/step/pp_exec.h"
#include <math.h>
#include <omp.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>

typedef struct run_batch {
  int32_t *tokens_h, *targets_h;  // (n, T, B) host
  int32_t *tokens, *targets;      // the same in backend memory
  int32_t *window;                // (T + 1)
} run_batch;

// Fills micro-batches with consecutive samples from `first`, sequence-major: token t of
// sequence b of micro-batch j at [j][t][b].
static void fill_batch(run_batch *rb, data_loader *dl, int64_t first, int n_micro, int B, int T, k_backend *be) {
  for (int j = 0; j < n_micro; j++)
    for (int b = 0; b < B; b++) {
      data_get_window(dl, first + (int64_t)j * B + b, rb->window);
      int64_t base = (int64_t)j * T * B;
      for (int t = 0; t < T; t++) {
        rb->tokens_h[base + (int64_t)t * B + b] = rb->window[t];
        rb->targets_h[base + (int64_t)t * B + b] = rb->window[t + 1];
      }
    }
  size_t n_bytes = (size_t)n_micro * T * B * sizeof(int32_t);
  be->from_host(be, rb->tokens, rb->tokens_h, n_bytes);
  be->from_host(be, rb->targets, rb->targets_h, n_bytes);
}

// The loss term of this rank counts only where the last virtual stage lives, once per tp group.
static double loss_term(const grid *g, double local) {
  return (g->pp_rank == g->pp - 1 && g->tp_rank == 0) ? local : 0;
}

static double world_loss_sum(const grid *g, double local) {
  double v = loss_term(g, local);
  g->world->ops->all_reduce(g->world, &v, 1, COMM_F64, COMM_SUM);
  return v;
}

// The one world all-reduce of a step: the loss as world_loss_sum and whether any rank got a
// stop signal, so every rank stops after the same step. SIGTERM wins over SIGINT.
static double world_loss_and_signal(const grid *g, double local, int sig, int *stop_sig) {
  double v[3] = {loss_term(g, local), sig == SIGTERM, sig == SIGINT};
  g->world->ops->all_reduce(g->world, v, 3, COMM_F64, COMM_SUM);
  *stop_sig = v[1] > 0 ? SIGTERM : v[2] > 0 ? SIGINT : 0;
  return v[0];
}

// Validation loss over the first eval_batches * micro_batch sequences of the val stream,
// split over dp ranks; the same sequences whatever the layout.
static double evaluate(const cfg *c, grid *g, pp_exec *e, data_loader *val, run_batch *rb) {
  int B = c->train.micro_batch, T = c->model.seq_len;
  int64_t n_seq = (int64_t)c->log.eval_batches * B;
  double local = 0;
  for (int64_t first = (int64_t)g->dp_rank * B; first < n_seq; first += (int64_t)g->dp * B) {
    fill_batch(rb, val, first, 1, B, T, e->m->be);
    local += pp_exec_forward(e, rb->tokens, rb->targets);
  }
  return world_loss_sum(g, local) / ((double)n_seq * T);
}

static void format_duration(double s, char *buf, size_t n) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, n, "%lds", t);
}

static int mkdir_parents(const char *path) {
  char tmp[CFG_STR];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0755);
      *p = '/';
    }
  return 0;
}

// Decides where to resume from: -1 error, 0 fresh start, 1 path set.
static int resume_path(const cfg *c, char *path, size_t n, char *err, size_t n_err) {
  const char *r = c->checkpoint.resume;
  if (strcmp(r, "none") == 0) return 0;
  if (strcmp(r, "auto") == 0) {
    if (!c->checkpoint.dir[0]) return 0;
    int rc = ckpt_find_latest(c->checkpoint.dir, path, n);
    if (rc < 0) {
      snprintf(err, n_err, "checkpoint.resume=auto: cannot scan checkpoint.dir '%s'", c->checkpoint.dir);
      return -1;
    }
    return rc == 0;
  }
  snprintf(path, n, "%s", r);
  return 1;
}

// SIGTERM (a scheduler's notice before it kills a job) or SIGINT: finish the step in flight,
// checkpoint it, and stop, so a preempted run loses nothing.
static volatile sig_atomic_t run_stop_signal;
static void run_on_stop_signal(int sig) { run_stop_signal = sig; }

// One write for the whole line: mpirun forwards each write of a rank separately, so a line
// written in pieces can come out with other output in between.
#define RUN_FAIL(...)                                  \
  do {                                                 \
    if (g->world_rank == 0) {                          \
      char fail_msg_[2048];                            \
      snprintf(fail_msg_, sizeof fail_msg_, __VA_ARGS__); \
      fprintf(stderr, "error: %s\n", fail_msg_);       \
    }                                                  \
    rc = 1;                                            \
    goto done;                                         \
  } while (0)

int run_train(const cfg *c, grid *g, k_backend *be) {
  int rc = 0, r0 = g->world_rank == 0;
  char err[1024] = "";
  data_loader train = {0}, val = {0};
  model m = {0};
  opt_state o = {0};
  pp_exec e = {0};
  run_batch rb = {0};
  FILE *metrics = NULL;
  const cfg_train *hp = &c->train;
  int B = hp->micro_batch, T = c->model.seq_len;
  int n_micro = hp->global_batch / (g->dp * B);
  int have_val = c->data.val[0] && c->log.eval_batches > 0;

  if (data_open(&train, c->data.train, T, hp->seed, err, sizeof err) != 0) RUN_FAIL("data.train: %s", err);
  if (have_val && data_open(&val, c->data.val, T, hp->seed, err, sizeof err) != 0) RUN_FAIL("data.val: %s", err);
  int32_t max_tok = train.max_token > val.max_token ? train.max_token : val.max_token;
  if (max_tok >= c->model.vocab_size)
    RUN_FAIL("the data holds token id %d but model.vocab_size is %d: set model.vocab_size to at least %d", max_tok,
             c->model.vocab_size, max_tok + 1);

  step_timing tm = {0}, tm_total = {0};  // this step; sum over the timed steps
  int64_t n_timed = 0;
  model_init(&m, c, g, be);
  model_init_weights(&m, hp->seed);
  // Timing tp collectives needs a sync around each one: only when asked for (timing.h).
  const char *tp_timing = getenv("TRAINER_TIMING_TP");
  int time_tp = tp_timing && strcmp(tp_timing, "1") == 0;
  model_set_timing(&m, time_tp ? &tm : NULL);
  opt_init(&o, &m, c);
  o.timing = &tm;
  if (pp_exec_init(&e, &m, n_micro, err, sizeof err) != 0) RUN_FAIL("%s", err);
  e.timing = &tm;
  e.comm_bf16 = c->parallel.pp_comm_bf16;
  if (c->parallel.pp_overlap && g->pp > 1) pp_exec_overlap(&e);

  int64_t step = 0, samples_seen = 0;
  char path[CFG_STR + 64];
  int resume = resume_path(c, path, sizeof path, err, sizeof err);
  if (resume < 0) RUN_FAIL("%s", err);
  if (resume) {
    if (run_ckpt_load(path, c, &m, &o, &step, &samples_seen, err, sizeof err) != 0) RUN_FAIL("%s", err);
    if (r0) printf("resumed from %s at step %lld\n", path, (long long)step);
  } else if (r0 && strcmp(c->checkpoint.resume, "auto") == 0) {
    printf("checkpoint.resume=auto: no checkpoint in '%s', starting fresh\n", c->checkpoint.dir);
  }

  size_t tok_bytes = (size_t)n_micro * T * B * sizeof(int32_t);
  rb.tokens_h = XMALLOC(tok_bytes);
  rb.targets_h = XMALLOC(tok_bytes);
  rb.tokens = be->alloc(be, tok_bytes);
  rb.targets = be->alloc(be, tok_bytes);
  rb.window = XMALLOC((size_t)(T + 1) * sizeof(int32_t));

  if (r0 && c->log.metrics[0]) {
    mkdir_parents(c->log.metrics);
    metrics = fopen(c->log.metrics, step > 0 ? "a" : "w");
    if (!metrics) fprintf(stderr, "warning: cannot open log.metrics '%s'; no metrics file\n", c->log.metrics);
  }
  int64_t n_params_no_embed = 0, n_params = model_count_params(&c->model, &n_params_no_embed);
  // The fewest OpenMP threads of any rank: 1 where mpirun bound each rank to one core (README).
  int32_t n_threads = -omp_get_max_threads();
  g->world->ops->all_reduce(g->world, &n_threads, 1, COMM_I32, COMM_MAX);  // min(x) = -max(-x)
  if (r0)
    printf("model: %.2fM parameters (%.2fM without the embedding), %d micro-batches of %d x %d tokens per rank "
           "per step, %s backend, %d rank%s, %d OpenMP thread%s per rank\n",
           n_params / 1e6, n_params_no_embed / 1e6, n_micro, B, T, be->name, g->world_size,
           g->world_size > 1 ? "s" : "", -n_threads, n_threads < -1 ? "s" : "");

  double tokens_per_step = (double)hp->global_batch * T;
  // Model flops per token (the MFU convention of docs/benchmarks.md): 6 N + 12 L d T, N the
  // parameters without the embedding table.
  double flops_per_token = 6.0 * n_params_no_embed + 12.0 * c->model.n_layers * c->model.dim * T;
  double mem_peak = 0;
  double loss_scale = 1.0 / tokens_per_step;
  double t_start = MPI_Wtime(), last_loss = NAN, last_val = NAN, t_steps = 0;
  int64_t first_step = step, tokens_seen = 0;
  double t_steady = 0;  // time of the steps after the first (warm-up) step of this process
  int64_t last_step = hp->stop_at > 0 && hp->stop_at < hp->steps ? hp->stop_at : hp->steps;
  struct sigaction stop_action = {.sa_handler = run_on_stop_signal};
  sigaction(SIGTERM, &stop_action, NULL);
  sigaction(SIGINT, &stop_action, NULL);
  int stop_sig = 0;
  while (step < last_step && !stop_sig) {
    memset(&tm, 0, sizeof tm);
    double t0 = timing_now(be);
    float lr = opt_lr_at(hp, step);
    int64_t first = samples_seen + (int64_t)g->dp_rank * (hp->global_batch / g->dp);
    fill_batch(&rb, &train, first, n_micro, B, T, be);
    double t_data = timing_now(be);
    tm.data = t_data - t0;
    double local = pp_exec_train_step(&e, rb.tokens, rb.targets, (float)loss_scale);
    tm.compute = timing_now(be) - t_data - tm.pp_comm - tm.tp_comm;
    double gnorm = opt_step(&o, lr, step + 1);
    be->sync(be);
    double loss = world_loss_and_signal(g, local, run_stop_signal, &stop_sig) / tokens_per_step;
    step++;
    samples_seen += hp->global_batch;
    tokens_seen += (int64_t)tokens_per_step;
    double dt = MPI_Wtime() - t0;
    t_steps += dt;
    double mem = (double)be->mem_used(be);
    if (mem > mem_peak) mem_peak = mem;
    if (step > first_step + 1) {  // the first step of a process warms up allocators and caches
      tm_total.data += tm.data;
      tm_total.compute += tm.compute;
      tm_total.tp_comm += tm.tp_comm;
      tm_total.pp_comm += tm.pp_comm;
      tm_total.dp_comm += tm.dp_comm;
      tm_total.optimizer += tm.optimizer;
      t_steady += dt;
      n_timed++;
    }
    last_loss = loss;
    if (!isfinite(loss)) RUN_FAIL("loss is %g at step %lld: lower train.lr or check the data", loss, (long long)step);

    int do_eval = have_val && ((c->log.eval_every > 0 && step % c->log.eval_every == 0) || step == hp->steps);
    double val_loss = do_eval ? evaluate(c, g, &e, &val, &rb) : NAN;
    if (do_eval) last_val = val_loss;
    int do_log = step % c->log.every == 0 || step == last_step || step == first_step + 1 || do_eval;
    if (r0 && do_log) {
      double tps = tokens_per_step / dt, eta = (double)(last_step - step) * (t_steps / (step - first_step));
      char eta_s[32];
      format_duration(eta, eta_s, sizeof eta_s);
      double tflops = tps * flops_per_token / 1e12 / g->world_size;  // per rank
      printf("step %5lld/%d | loss %.4f | lr %.2e | grad_norm %.3f | %.0f tok/s | %.1f ms/step", (long long)step,
             hp->steps, loss, lr, gnorm, tps, dt * 1e3);
      if (be->peak_tflops > 0) printf(" | MFU %.1f%%", 100 * tflops / be->peak_tflops);
      printf(" | mem %.2f GiB | %3.0f%% | ETA %s", mem / 1073741824.0, 100.0 * step / hp->steps, eta_s);
      if (do_eval) printf(" | val_loss %.4f", val_loss);
      printf("\n");
      fflush(stdout);
      if (metrics) {
        fprintf(metrics, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens_per_s\": %.1f, "
                         "\"ms_per_step\": %.3f, \"tflops_per_rank\": %.3f, \"mem_gib\": %.3f",
                (long long)step, loss, lr, gnorm, tps, dt * 1e3, tflops, mem / 1073741824.0);
        if (be->peak_tflops > 0) fprintf(metrics, ", \"mfu\": %.4f", tflops / be->peak_tflops);
        fprintf(metrics, ", \"ms_compute\": %.3f, \"ms_tp_comm\": %.3f, \"ms_pp_comm\": %.3f, \"ms_dp_comm\": %.3f, "
                         "\"ms_optimizer\": %.3f, \"ms_data\": %.3f",
                tm.compute * 1e3, tm.tp_comm * 1e3, tm.pp_comm * 1e3, tm.dp_comm * 1e3, tm.optimizer * 1e3,
                tm.data * 1e3);
        if (do_eval) fprintf(metrics, ", \"val_loss\": %.9g", val_loss);
        fprintf(metrics, "}\n");
        fflush(metrics);
      }
    }
    // stop_sig came with the loss: every rank learnt of a signal any rank got.
    if (stop_sig && r0) printf("signal %d: stopping after step %lld\n", stop_sig, (long long)step);
    if (c->checkpoint.dir[0] &&
        ((c->checkpoint.every > 0 && step % c->checkpoint.every == 0) || step == last_step || stop_sig)) {
      double tc = MPI_Wtime();
      if (run_ckpt_save(c, &m, &o, step, samples_seen, err, sizeof err) != 0) RUN_FAIL("checkpoint: %s", err);
      if (r0) printf("checkpoint: step %lld saved to %s in %.2f s\n", (long long)step, c->checkpoint.dir, MPI_Wtime() - tc);
    }
  }
  g->world->ops->all_reduce(g->world, &mem_peak, 1, COMM_F64, COMM_MAX);
  // The pipeline's idle share on each rank: the schedule's bubble, the transfers, and waiting
  // for a slower stage (the last one also runs the head). Every rank starts the schedule at the
  // same time (the previous step ended in a world all-reduce) and the schedule lasts as long as
  // it does on the rank that ends last, so a rank's idle time is that longest span less its own
  // compute: this counts the drain at the end too, which a stage that finished early spends
  // waiting outside any transfer. The mean over ranks is the share of GPU time the pipeline
  // loses (what (p-1)/(v*m+p-1) predicts for equal stages); the minimum is the busiest stage's.
  double pipe = tm_total.compute + tm_total.tp_comm + tm_total.pp_comm, pipe_max = pipe;
  g->world->ops->all_reduce(g->world, &pipe_max, 1, COMM_F64, COMM_MAX);
  double idle = pipe_max > 0 && g->pp > 1 ? (pipe_max - tm_total.compute - tm_total.tp_comm) / pipe_max : 0.0;
  double idle_mean = idle, idle_min = -idle;
  g->world->ops->all_reduce(g->world, &idle_mean, 1, COMM_F64, COMM_SUM);
  g->world->ops->all_reduce(g->world, &idle_min, 1, COMM_F64, COMM_MAX);  // min(x) = -max(-x)
  idle_mean /= g->world_size;
  idle_min = -idle_min;
  if (r0) {
    double wall = MPI_Wtime() - t_start;
    // Steady state: without the first step, which builds plans, caches and allocations.
    double mean_tps = n_timed > 0 ? n_timed * tokens_per_step / t_steady : (t_steps > 0 ? tokens_seen / t_steps : 0.0);
    double mean_tflops = mean_tps * flops_per_token / 1e12 / g->world_size;
    char wall_s[32];
    format_duration(wall, wall_s, sizeof wall_s);
    char val_s[32] = "null";  // JSON has no NaN: no evaluation ran
    if (!isnan(last_val)) snprintf(val_s, sizeof val_s, "%.9g", last_val);
    printf("run report: %lld steps (%lld this run), %lld tokens this run in %s, mean %.0f tok/s "
           "(%.0f per rank; steps after the first), %.2f model TFLOP/s per rank",
           (long long)step, (long long)(step - first_step), (long long)tokens_seen, wall_s, mean_tps,
           mean_tps / g->world_size, mean_tflops);
    if (be->peak_tflops > 0) printf(", MFU %.1f%% of %.1f (%s)", 100 * mean_tflops / be->peak_tflops, be->peak_tflops,
                                    be->device_name);
    printf(", peak memory %.2f GiB on the fullest rank, final train loss %.4f, final val loss %.4f\n", mem_peak / 1073741824.0,
           last_loss, last_val);
    // The step split (what each figure is: parallel/comm/timing.h; dp comm is the exposed part only).
    double k = n_timed > 0 ? 1e3 / n_timed : 0;
    double comm = tm_total.tp_comm + tm_total.pp_comm + tm_total.dp_comm;
    double all = pipe + tm_total.dp_comm + tm_total.optimizer + tm_total.data;
    double exposed_pct = all > 0 ? 100 * comm / all : 0.0;
    double bubble_pct = 100 * idle_mean, bubble_min_pct = 100 * idle_min, bubble_rank0_pct = 100 * idle;
    double bubble_theory_pct = 100 * pp_bubble_theory(g->pp, c->parallel.vpp, n_micro);
    double mfu = be->peak_tflops > 0 ? mean_tflops / be->peak_tflops : 0.0;
    if (n_timed > 0) {
      printf("step time on rank 0 (ms, mean of %lld steps): compute %.2f | tp comm %.2f%s | pipeline comm and bubble %.2f "
             "| exposed dp comm %.2f | optimizer %.2f | data %.2f; exposed communication %.1f%% of the step",
             (long long)n_timed, tm_total.compute * k, tm_total.tp_comm * k,
             g->tp > 1 && !time_tp ? " (in compute; TRAINER_TIMING_TP=1 measures it)" : "",
             tm_total.pp_comm * k, tm_total.dp_comm * k, tm_total.optimizer * k, tm_total.data * k, exposed_pct);
      if (g->pp > 1)
        printf("; pipeline bubble %.1f%% measured (mean over ranks; busiest stage %.1f%%, rank 0 %.1f%%), %.1f%% in "
               "theory ((p-1)/(v*m+p-1))", bubble_pct, bubble_min_pct, bubble_rank0_pct, bubble_theory_pct);
      printf("\n");
    }
    if (metrics) {
      char bubble_s[32] = "null", bubble_min_s[32] = "null", theory_s[32] = "null";
      if (g->pp > 1) {
        snprintf(bubble_s, sizeof bubble_s, "%.3f", bubble_pct);
        snprintf(bubble_min_s, sizeof bubble_min_s, "%.3f", bubble_min_pct);
        snprintf(theory_s, sizeof theory_s, "%.3f", bubble_theory_pct);
      }
      fprintf(metrics,
              "{\"report\": true, \"steps\": %lld, \"tokens\": %lld, \"wall_s\": %.3f, \"ranks\": %d, "
              "\"tokens_per_s\": %.1f, \"tokens_per_s_per_rank\": %.1f, \"tflops_per_rank\": %.3f, \"mfu\": %.4f, "
              "\"peak_mem_gib\": %.3f, \"final_loss\": %.9g, \"final_val_loss\": %s, "
              "\"step_ms\": {\"compute\": %.3f, \"tp_comm\": %.3f, \"pp_comm\": %.3f, \"dp_comm\": %.3f, "
              "\"optimizer\": %.3f, \"data\": %.3f}, \"exposed_comm_pct\": %.3f, \"bubble_pct\": %s, "
              "\"bubble_busiest_pct\": %s, \"bubble_theory_pct\": %s}\n",
              (long long)step, (long long)tokens_seen, wall, g->world_size, mean_tps, mean_tps / g->world_size,
              mean_tflops, mfu, mem_peak / 1073741824.0, last_loss, val_s, tm_total.compute * k, tm_total.tp_comm * k,
              tm_total.pp_comm * k, tm_total.dp_comm * k, tm_total.optimizer * k, tm_total.data * k, exposed_pct,
              bubble_s, bubble_min_s, theory_s);
    }
  }

  if (stop_sig) rc = 128 + stop_sig;

done:
  if (metrics) fclose(metrics);
  free(rb.tokens_h);
  free(rb.targets_h);
  free(rb.window);
  if (rb.tokens) be->free(be, rb.tokens);
  if (rb.targets) be->free(be, rb.targets);
  pp_exec_free(&e);
  opt_free(&o);
  model_free(&m);
  data_close(&train);
  data_close(&val);
  return rc;
}
