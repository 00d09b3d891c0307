// The trainer (see trainer.h): init, step, evaluate, checkpoint, free and the loop. The
// progress lines, metrics records and run report are in report.c.
#include "app/trainer.h"
#include "app/report.h"
#include "app/run_ckpt.h"
#include "app/run_offload.h"
#include "kernels/base/check.h"
#include "model/format/ckpt.h"
#include "model/fp8.h"
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>

// SIGTERM (a scheduler's notice before it kills a job) or SIGINT: finish the step in flight,
// checkpoint it, and stop, so a preempted run loses nothing. The product's one file-scope
// variable: a signal handler can reach nothing else.
static volatile sig_atomic_t trainer_signal_received;
static void trainer_on_stop_signal(int sig) { trainer_signal_received = sig; }

// A shard that changed under the run (data_get_window's error) ends the job from the rank that
// read it, with the message naming the shard: the other ranks are already in the step's
// collectives and cannot be told, and no checkpoint is written, so the newest one on disk holds
// only steps trained on the data as it was.
static void trainer_data_changed(const trainer *t, const data_loader *dl, const char *msg) {
  fprintf(stderr, "error: %s: %s\n", dl == &t->train ? "data.train" : "data.val", msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// Fills micro-batches with consecutive samples from `first`, sequence-major: token t of
// sequence b of micro-batch j at [j][t][b].
static void trainer_fill_batch(trainer *t, data_loader *dl, int64_t first, int n_micro) {
  trainer_batch *rb = &t->batch;
  int B = t->c->train.micro_batch, T = t->c->model.seq_len;
  char msg[1024];
  for (int j = 0; j < n_micro; j++)
    for (int b = 0; b < B; b++) {
      if (data_get_window(dl, first + (int64_t)j * B + b, rb->window, msg, sizeof msg) != 0)
        trainer_data_changed(t, dl, msg);
      int64_t base = (int64_t)j * T * B;
      for (int i = 0; i < T; i++) {
        rb->tokens_h[base + (int64_t)i * B + b] = rb->window[i];
        rb->targets_h[base + (int64_t)i * B + b] = rb->window[i + 1];
      }
    }
  size_t n_bytes = (size_t)n_micro * T * B * sizeof(int32_t);
  t->be->from_host(t->be, rb->tokens, rb->tokens_h, n_bytes);
  t->be->from_host(t->be, rb->targets, rb->targets_h, n_bytes);
}

// The loss term of this rank counts only where the last virtual stage lives, once per tp group.
static double trainer_loss_term(const grid *g, double local) {
  return (g->pp_rank == g->pp - 1 && g->tp_rank == 0) ? local : 0;
}

// Decides where to resume from: -1 error, 0 fresh start, 1 path set.
static int trainer_resume_path(const cfg *c, char *path, size_t n, char *err, size_t n_err) {
  const char *r = c->checkpoint.resume;
  if (strcmp(r, "none") == 0) return 0;
  if (strcmp(r, "auto") == 0) {
    if (!c->checkpoint.dir[0]) return 0;
    int rc = ckpt_find_latest(c->checkpoint.dir, INT64_MAX, path, n, NULL);
    if (rc < 0) {
      snprintf(err, n_err, "checkpoint.resume=auto: cannot scan checkpoint.dir '%s'", c->checkpoint.dir);
      return -1;
    }
    return rc == 0;
  }
  snprintf(path, n, "%s", r);
  return 1;
}

static int trainer_open_data(trainer *t, char *err, size_t n_err) {
  const cfg *c = t->c;
  char msg[1024] = "";
  int T = c->model.seq_len;
  if (data_open(&t->train, c->data.train, T, c->train.seed, msg, sizeof msg) != 0)
    return snprintf(err, n_err, "data.train: %s", msg), -1;
  t->have_val = c->data.val[0] && c->log.eval_batches > 0;
  if (t->have_val && data_open(&t->val, c->data.val, T, c->train.seed, msg, sizeof msg) != 0)
    return snprintf(err, n_err, "data.val: %s", msg), -1;
  int64_t max_tok = t->train.max_token > t->val.max_token ? t->train.max_token : t->val.max_token;
  if (max_tok >= c->model.vocab_size && max_tok + 1 > CFG_MAX_VOCAB)
    return snprintf(err, n_err, "the data holds token id %lld, beyond the largest model.vocab_size (%d): the shard "
                                "is damaged or not a token shard; re-create it with build/prepare",
                    (long long)max_tok, CFG_MAX_VOCAB), -1;
  if (max_tok >= c->model.vocab_size)
    return snprintf(err, n_err, "the data holds token id %lld but model.vocab_size is %d: set model.vocab_size to at "
                                "least %lld", (long long)max_tok, c->model.vocab_size, (long long)max_tok + 1), -1;
  return 0;
}

static void trainer_alloc_batch(trainer *t) {
  size_t tok_bytes = (size_t)t->n_micro * t->c->model.seq_len * t->c->train.micro_batch * sizeof(int32_t);
  trainer_batch *rb = &t->batch;
  rb->tokens_h = XMALLOC(tok_bytes);
  rb->targets_h = XMALLOC(tok_bytes);
  rb->tokens = t->be->alloc(t->be, tok_bytes);
  rb->targets = t->be->alloc(t->be, tok_bytes);
  rb->window = XMALLOC((size_t)(t->c->model.seq_len + 1) * sizeof(int32_t));
}

// Where the weights come from: a checkpoint to resume (path set), checkpoint.init_from, or the
// random init. A checkpoint found wins over init_from.
typedef enum {
  TRAINER_START_ERROR = -1,
  TRAINER_START_FRESH,
  TRAINER_START_RESUME,
  TRAINER_START_INIT_FROM
} trainer_start;

static trainer_start trainer_start_point(const trainer *t, char *path, size_t n_path, char *err, size_t n_err) {
  const cfg *c = t->c;
  int resume = trainer_resume_path(c, path, n_path, err, n_err);
  int root = t->g->world_rank == 0;
  const char *from = c->checkpoint.init_from;
  if (resume < 0) return TRAINER_START_ERROR;
  if (resume == 1) {
    if (from[0] && root) printf("checkpoint.init_from=%s ignored: resuming from %s\n", from, path);
    return TRAINER_START_RESUME;
  }
  if (root && strcmp(c->checkpoint.resume, "auto") == 0)
    printf("checkpoint.resume=auto: no checkpoint in '%s', starting %s\n", c->checkpoint.dir,
           from[0] ? "from checkpoint.init_from" : "fresh");
  return from[0] ? TRAINER_START_INIT_FROM : TRAINER_START_FRESH;
}

// Loads the checkpoint at path; with checkpoint.resume=auto, a damaged one (a checksum or
// finiteness failure, an unreadable file) is skipped with a warning for the next older one.
static int trainer_resume(trainer *t, char *path, size_t n_path, char *err, size_t n_err) {
  const cfg *c = t->c;
  int rc;
  while ((rc = run_ckpt_load(path, c, &t->m, &t->o, &t->step, &t->samples_seen, err, n_err)) == CKPT_DAMAGED &&
         strcmp(c->checkpoint.resume, "auto") == 0) {
    if (t->g->world_rank == 0)
      fprintf(stderr, "warning: checkpoint.resume=auto: %s; trying an older checkpoint\n", err);
    const char *base = strrchr(path, '/');
    long long step = 0;
    if (!base || sscanf(base + 1, "ckpt_%lld.h5", &step) != 1 ||
        ckpt_find_latest(c->checkpoint.dir, step, path, n_path, NULL) != 0)
      return snprintf(err, n_err, "checkpoint.resume=auto: no undamaged checkpoint left in '%s' (each was skipped "
                      "with a warning above): resume from a copy, or start a fresh run with checkpoint.resume=none",
                      c->checkpoint.dir), -1;
  }
  return rc == 0 ? 0 : -1;
}

// The size of the file at path in bytes, -1 when it cannot be read: what the checkpoint lines
// divide by the time to give the speed.
static double trainer_file_bytes(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (double)st.st_size : -1;
}

// Sets the weights the start point names: the random init, a checkpoint or Hugging Face weights.
static int trainer_load_start(trainer *t, trainer_start start, char *path, size_t n_path, char *err, size_t n_err) {
  if (start == TRAINER_START_FRESH) opt_init_weights(&t->o, t->c->train.seed);
  if (start == TRAINER_START_RESUME) {
    const double t0 = MPI_Wtime();
    if (trainer_resume(t, path, n_path, err, n_err) != 0) return -1;
    const double seconds = MPI_Wtime() - t0, n_bytes = t->g->world_rank == 0 ? trainer_file_bytes(path) : -1;
    if (t->g->world_rank == 0) printf("resumed from %s at step %lld\n", path, (long long)t->step);
    if (t->g->world_rank == 0 && n_bytes >= 0)
      printf("checkpoint: loaded %s (%.2f GB) in %.2f s (%.2f GB/s)\n", path, n_bytes / 1e9, seconds,
             seconds > 0 ? n_bytes / seconds / 1e9 : 0.0);
    if (t->g->world_rank == 0 && t->step >= t->c->train.steps)
      printf("checkpoint %s is at step %lld and train.steps is %d: the run is already complete; raise train.steps "
             "to train further\n", path, (long long)t->step, t->c->train.steps);
  } else if (start == TRAINER_START_INIT_FROM) {
    const char *dir = t->c->checkpoint.init_from + 3;  // after "hf:" (cfg_validate)
    char msg[1536];
    if (run_hf_load(dir, t->c, &t->o, msg, sizeof msg) != 0)
      return snprintf(err, n_err, "checkpoint.init_from: %s", msg), -1;
    if (t->g->world_rank == 0)
      printf("initialised from %s: %.2fM parameters, fresh optimizer state\n", t->c->checkpoint.init_from,
             model_count_params(&t->c->model, NULL) / 1e6);
  }
  return 0;
}

int trainer_init(trainer *t, const cfg *c, grid *g, k_backend *be, const trainer_hooks *hooks, char *err,
                 size_t n_err) {
  memset(t, 0, sizeof *t);
  t->c = c;
  t->g = g;
  t->be = be;
  t->hooks = hooks ? *hooks : (trainer_hooks){.ckpt = {.kill_after = -1, .fail_at = -1, .nan_in = -1, .delay_s = 0}};
  t->n_micro = cfg_n_micro(c);
  t->stats.last_loss = t->stats.last_val = NAN;
  if (trainer_open_data(t, err, n_err) != 0) return -1;
  if (c->checkpoint.dir[0] && ckpt_check_dir(c->checkpoint.dir, g->world->mpi, err, n_err) != 0) return -1;
  if (report_open_events(t, err, n_err) != 0) return -1;
  char path[CFG_STR + 64];
  trainer_start start = trainer_start_point(t, path, sizeof path, err, n_err);
  if (start == TRAINER_START_ERROR) return -1;

  if (run_offload_check(c, g, be, err, n_err) != 0) return -1;  // before the host state is pinned
  const model_layout ml = cfg_model_layout(c);
  const model_place at = tp_model_place(g);
  model_init(&t->m, &c->model, &ml, &at, be);
  tp_bind_model(&t->tpc, &t->m, g);
  // Timing tp collectives needs a sync around each one: only when asked for (timing.h).
  tp_set_timing(&t->tpc, c->log.time_tp ? &t->stats.tm : NULL);
  tp_set_serial(&t->tpc, c->parallel.tp_overlap == CFG_TP_OVERLAP_NONE);
  const k_mem_kind kind_before = be->mem_kind(be, K_MEM_OPTIMIZER);  // its state and sharding buffers
  opt_init(&t->o, &t->m, g, &c->optim, t->n_micro);
  be->mem_kind(be, kind_before);
  t->o.timing = &t->stats.tm;
  t->o.time_waits = c->log.time_dp;
  if (pp_exec_init(&t->e, &t->m, g, t->n_micro, err, n_err) != 0) return -1;
  t->e.timing = &t->stats.tm;
  t->e.comm_bf16 = c->parallel.pp_comm_bf16;
  if (c->parallel.pp_overlap && g->pp > 1) pp_exec_overlap(&t->e);
  if (trainer_load_start(t, start, path, sizeof path, err, n_err) != 0) return -1;
  report_events_start(t);
  trainer_alloc_batch(t);

  int64_t n_params_no_embed = 0;
  model_count_params(&c->model, &n_params_no_embed);
  t->tokens_per_step = (double)c->train.global_batch * c->model.seq_len;
  // Model flops per token (the MFU convention of docs/benchmarks.md): 6 N + 12 L d T, N the
  // parameters without the embedding table.
  t->flops_per_token = 6.0 * n_params_no_embed + 12.0 * c->model.n_layers * c->model.dim * c->model.seq_len;
  t->last_step = c->train.stop_at > 0 && c->train.stop_at < c->train.steps ? c->train.stop_at : c->train.steps;
  t->stats.first_step = t->step;
  return report_open(t);
}

// The one world all-reduce of a step: the loss and whether any rank got a stop signal, so
// every rank stops after the same step. SIGTERM wins over SIGINT.
static double trainer_world_loss(trainer *t, double local) {
  int sig = trainer_signal_received;
  double v[3] = {trainer_loss_term(t->g, local), sig == SIGTERM, sig == SIGINT};
  t->g->world->ops->all_reduce(t->g->world, v, 3, COMM_F64, COMM_SUM);
  t->stop_signal = v[1] > 0 ? SIGTERM : v[2] > 0 ? SIGINT : 0;
  return v[0];
}

static void trainer_add_timing(trainer_stats *s, double dt) {
  s->tm_total.data += s->tm.data;
  s->tm_total.compute += s->tm.compute;
  s->tm_total.tp_comm += s->tm.tp_comm;
  s->tm_total.pp_comm += s->tm.pp_comm;
  s->tm_total.dp_comm += s->tm.dp_comm;
  s->tm_total.dp_gather += s->tm.dp_gather;
  s->tm_total.optimizer += s->tm.optimizer;
  s->t_steady += dt;
  s->n_timed++;
}

trainer_step_result trainer_step(trainer *t) {
  const cfg *c = t->c;
  trainer_stats *s = &t->stats;
  k_backend *be = t->be;
  trainer_step_result r = {0};
  memset(&s->tm, 0, sizeof s->tm);
  double t0 = timing_now(be);
  r.lr = opt_lr_at(&c->optim, c->train.steps, t->step);
  int64_t first = t->samples_seen + (int64_t)t->g->dp_rank * (c->train.global_batch / t->g->dp);
  trainer_fill_batch(t, &t->train, first, t->n_micro);
  double t_data = timing_now(be);
  s->tm.data = t_data - t0;
  // The test hook TRAINER_TEST_NAN_AT_STEP: a NaN loss scale makes every gradient NaN, the loss not.
  float loss_scale = t->step + 1 == t->hooks.nan_at_step ? NAN : (float)(1.0 / t->tokens_per_step);
  if (t->step + 1 == t->hooks.huge_at_step) loss_scale *= 1e30f;  // TRAINER_TEST_HUGE_GRAD_AT_STEP
  double local = pp_exec_train_step(&t->e, t->batch.tokens, t->batch.targets, loss_scale);
  if (t->step + 1 == t->hooks.fp8_inf_at_step) model_fp8_test_set_amax(&t->m, INFINITY);
  // Less the optimizer's host update run inside forward (optimizer.offload_layer_wait; timing.h),
  // and what forward and backward waited for of sharded data parallelism (log.time_dp).
  s->tm.compute = timing_now(be) - t_data - s->tm.pp_comm - s->tm.tp_comm - s->tm.optimizer - s->tm.dp_comm;
  const float lr = t->step + 1 == t->hooks.inf_lr_at_step ? INFINITY : r.lr;  // TRAINER_TEST_INF_LR_AT_STEP
  r.grad_norm = opt_step(&t->o, lr, t->step + 1);
  be->sync(be);
  r.loss = trainer_world_loss(t, local) / t->tokens_per_step;
  t->step++;
  t->samples_seen += c->train.global_batch;
  s->tokens_seen += (int64_t)t->tokens_per_step;
  r.seconds = MPI_Wtime() - t0;
  s->t_steps += r.seconds;
  r.mem_bytes = (double)be->mem_used(be);
  if (r.mem_bytes > s->mem_peak) s->mem_peak = r.mem_bytes;
  const double held = (double)be->mem_held(be);
  if (held > s->held_peak) {
    s->held_peak = held;
    be->mem_held_by_kind(be, s->held_peak_by_kind);
  }
  if (t->step > s->first_step + 1) trainer_add_timing(s, r.seconds);  // the first step warms up caches
  if (isfinite(r.loss)) s->last_loss = r.loss;
  return r;
}

// The same sequences whatever the layout: the first eval_batches * micro_batch of the val
// stream, split over dp ranks.
double trainer_evaluate(trainer *t) {
  int B = t->c->train.micro_batch;
  int64_t n_seq = (int64_t)t->c->log.eval_batches * B;
  double local = 0;
  // Every dp rank runs as many forwards (with parallel.shard=weights each one gathers the weights
  // over dp): one past the end recomputes the first micro-batch and does not count it.
  const int64_t dpb = (int64_t)t->g->dp * B, rounds = (n_seq + dpb - 1) / dpb;
  for (int64_t k = 0; k < rounds; k++) {
    const int64_t first = k * dpb + (int64_t)t->g->dp_rank * B;
    trainer_fill_batch(t, &t->val, first < n_seq ? first : 0, 1);
    const double loss = pp_exec_forward(&t->e, t->batch.tokens, t->batch.targets);
    if (first < n_seq) local += loss;
  }
  double v = trainer_loss_term(t->g, local);
  t->g->world->ops->all_reduce(t->g->world, &v, 1, COMM_F64, COMM_SUM);
  t->stats.last_val = v / ((double)n_seq * t->c->model.seq_len);
  return t->stats.last_val;
}

// Collective: completes the asynchronous write in flight, and says so on rank 0 with the time it
// took: the background write of the slowest rank plus publishing it.
static int trainer_checkpoint_finish(trainer *t, char *err, size_t n_err) {
  ckpt_async *w = &t->ckpt_async.write;
  const int64_t step = w->step;
  const double n_bytes = (double)w->n_bytes, t0 = MPI_Wtime();
  if (ckpt_async_finish(w, err, n_err) != 0) return -1;
  const double seconds = w->write_s + MPI_Wtime() - t0;
  if (t->g->world_rank == 0)
    printf("checkpoint: step %lld saved to %s in %.2f s in the background (%.2f GB/s)\n", (long long)step,
           t->c->checkpoint.dir, seconds, seconds > 0 ? n_bytes / seconds / 1e9 : 0.0);
  return 0;
}

int trainer_checkpoint_poll(trainer *t, char *err, size_t n_err) {
  if (!ckpt_async_pending(&t->ckpt_async.write) || !ckpt_async_ready(&t->ckpt_async.write)) return 0;
  return trainer_checkpoint_finish(t, err, n_err);
}

int trainer_checkpoint_wait(trainer *t, char *err, size_t n_err) {
  return ckpt_async_pending(&t->ckpt_async.write) ? trainer_checkpoint_finish(t, err, n_err) : 0;
}

// Collective. checkpoint.async: the previous write first (at most one in flight), then the
// snapshot; the time the training thread spent on both is what the checkpoint cost it.
static int trainer_checkpoint_async(trainer *t, char *err, size_t n_err) {
  const double t0 = MPI_Wtime();
  if (trainer_checkpoint_wait(t, err, n_err) != 0) return -1;
  const double t_snap = MPI_Wtime();
  if (run_ckpt_async_start(&t->ckpt_async, t->c, &t->m, &t->o, t->step, t->samples_seen, &t->hooks.ckpt, err,
                           n_err) != 0)
    return -1;
  const double t1 = MPI_Wtime();
  if (t->g->world_rank == 0)
    printf("checkpoint: step %lld copied to host in %.2f s (training stalled %.2f s), writing to %s in the "
           "background\n", (long long)t->step, t1 - t_snap, t1 - t0, t->c->checkpoint.dir);
  return 0;
}

int trainer_checkpoint(trainer *t, char *err, size_t n_err) {
  if (t->c->checkpoint.async) return trainer_checkpoint_async(t, err, n_err);
  double t0 = MPI_Wtime();
  if (run_ckpt_save(t->c, &t->m, &t->o, t->step, t->samples_seen, &t->hooks.ckpt, err, n_err) != 0) return -1;
  const double seconds = MPI_Wtime() - t0;
  if (t->g->world_rank == 0) {
    char path[CFG_STR + 64];  // the name ckpt_write.c publishes the file under
    snprintf(path, sizeof path, "%s/ckpt_%08lld.h5", t->c->checkpoint.dir, (long long)t->step);
    const double n_bytes = trainer_file_bytes(path);
    printf("checkpoint: step %lld saved to %s in %.2f s (%.2f GB/s)\n", (long long)t->step, t->c->checkpoint.dir,
           seconds, seconds > 0 && n_bytes > 0 ? n_bytes / seconds / 1e9 : 0.0);
  }
  return 0;
}

void trainer_free(trainer *t) {
  run_ckpt_async_free(&t->ckpt_async);
  report_close(t);
  free(t->batch.tokens_h);
  free(t->batch.targets_h);
  free(t->batch.window);
  if (t->batch.tokens) t->be->free(t->be, t->batch.tokens);
  if (t->batch.targets) t->be->free(t->be, t->batch.targets);
  memset(&t->batch, 0, sizeof t->batch);
  pp_exec_free(&t->e);
  opt_free(&t->o);
  model_free(&t->m);
  data_close(&t->train);
  data_close(&t->val);
}

// Whether the step just done evaluates, logs or checkpoints.
static int trainer_due(int64_t step, int every) { return every > 0 && step % every == 0; }

// One write for the whole line: mpirun forwards each write of a rank separately, so a line
// written in pieces can come out with other output in between.
static int trainer_fail(const trainer *t, const char *what, const char *msg) {
  if (t->g->world_rank == 0) fprintf(stderr, "error: %s%s\n", what, msg);
  return 1;
}

// Collective. Why the step's update was refused: an FP8 amax (named) or the gradient norm.
static void trainer_refusal_cause(trainer *t, double grad_norm, char *buf, size_t n_buf) {
  if (t->o.update_refused)
    snprintf(buf, n_buf, "the update, tried first on copies of the optimizer's state, would have made weights or "
             "moments non-finite");
  else if (!model_fp8_describe_nonfinite(&t->m, buf, n_buf))
    snprintf(buf, n_buf, "the gradient norm is %g", grad_norm);
}

int trainer_run(const cfg *c, grid *g, k_backend *be, const trainer_hooks *hooks) {
  trainer t;
  char err[1024] = "";
  int rc = 0;
  if (trainer_init(&t, c, g, be, hooks, err, sizeof err) != 0) {
    rc = trainer_fail(&t, "", err);
    trainer_free(&t);
    return rc;
  }
  if (t.step >= c->train.steps) {  // resumed from the run's last checkpoint: nothing to do (said above)
    trainer_free(&t);
    return 0;
  }
  report_model_line(&t);
  // The initial weights as a checkpoint (checkpoint.at_start), before the first update.
  if (c->checkpoint.dir[0] && c->checkpoint.at_start && t.step == 0 && trainer_checkpoint(&t, err, sizeof err) != 0) {
    rc = trainer_fail(&t, "checkpoint: ", err);
    trainer_free(&t);
    return rc;
  }
  t.stats.t_start = MPI_Wtime();
  struct sigaction stop_action = {.sa_handler = trainer_on_stop_signal};
  sigaction(SIGTERM, &stop_action, NULL);
  sigaction(SIGINT, &stop_action, NULL);
  while (t.step < t.last_step && !t.stop_signal) {
    trainer_step_result r = trainer_step(&t);
    // Checked before anything is logged or saved: opt_step refused the update, so the weights
    // are still those of the step before and no checkpoint (periodic or at a stop signal) of this
    // step is written.
    char cause[256] = "";
    if (!isfinite(r.grad_norm)) trainer_refusal_cause(&t, r.grad_norm, cause, sizeof cause);
    if (!isfinite(r.grad_norm) && t.stats.n_skipped >= c->train.skip_nonfinite) {
      snprintf(err, sizeof err,
               "step %lld: %s, so the update was refused and the run stops with the weights of step %lld "
               "(checkpoints hold no NaN or Inf): lower train.lr or check the data%s "
               "(train.skip_nonfinite=N skips up to N such steps)",
               (long long)t.step, cause, (long long)t.step - 1, t.m.fp8 ? ", or train.precision=bf16" : "");
      rc = trainer_fail(&t, "", err);
      break;
    }
    if (!isfinite(r.grad_norm)) {
      t.stats.n_skipped++;
      if (g->world_rank == 0)
        fprintf(stderr, "warning: step %lld: %s: update skipped (%lld of train.skip_nonfinite = %d)\n",
                (long long)t.step, cause, (long long)t.stats.n_skipped, c->train.skip_nonfinite);
    } else if (!isfinite(r.loss)) {
      snprintf(err, sizeof err, "loss is %g at step %lld: lower train.lr or check the data", r.loss,
               (long long)t.step);
      rc = trainer_fail(&t, "", err);
      break;
    }
    int do_eval = t.have_val && (trainer_due(t.step, c->log.eval_every) || t.step == c->train.steps);
    double val_loss = do_eval ? trainer_evaluate(&t) : NAN;
    if (trainer_due(t.step, c->log.every) || t.step == t.last_step || t.step == t.stats.first_step + 1 || do_eval ||
        !isfinite(r.grad_norm))
      trainer_log(&t, &r, val_loss);
    // The stop signal came with the loss: every rank learnt of a signal any rank got.
    if (t.stop_signal && g->world_rank == 0)
      printf("signal %d: stopping after step %lld\n", t.stop_signal, (long long)t.step);
    int do_ckpt = trainer_due(t.step, c->checkpoint.every) || t.step == t.last_step || t.stop_signal;
    // checkpoint.async: a write that ended during the step is published here, at the first step
    // boundary after every rank's part is written; a failed one stops the run here.
    if (trainer_checkpoint_poll(&t, err, sizeof err) != 0 ||
        (c->checkpoint.dir[0] && do_ckpt && trainer_checkpoint(&t, err, sizeof err) != 0)) {
      rc = trainer_fail(&t, "checkpoint: ", err);
      break;
    }
  }
  // The write in flight (checkpoint.async) is completed and published before the run ends, at a
  // stop signal too; after an error as well, since it holds an earlier step.
  if (trainer_checkpoint_wait(&t, err, sizeof err) != 0) rc = trainer_fail(&t, "checkpoint: ", err);
  if (rc == 0) {
    trainer_report(&t);
    if (t.stop_signal) rc = 128 + t.stop_signal;
  }
  trainer_free(&t);
  return rc;
}
