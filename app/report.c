// Progress lines, metrics records and the run report (see report.h).
#include "app/report.h"
#include "kernels/base/fs.h"
#include "parallel/step/grad_compress.h"
#include "parallel/step/grad_shard.h"
#include "parallel/step/weight_shard.h"
#include "parallel/step/param_gather.h"
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>

static void report_duration(double s, char *buf, size_t n) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, n, "%lds", t);
}

int report_open(trainer *t) {
  const char *path = t->c->log.metrics;
  if (t->g->world_rank != 0 || !path[0]) return 0;
  fs_make_parent_dirs(path, NULL, 0);  // a failure shows when the file does not open
  t->metrics = fopen(path, t->step > 0 ? "a" : "w");
  if (!t->metrics) fprintf(stderr, "warning: cannot open log.metrics '%s'; no metrics file\n", path);
  return 0;
}

int report_open_events(trainer *t, char *err, size_t n_err) {
  const char *dir = t->c->log.tensorboard;
  if (!dir[0]) return 0;
  int rc = t->g->world_rank == 0 ? tb_open(&t->tb, dir, err, n_err) : 0;
  return ckpt_agree(t->g->world->mpi, rc, err, (int)n_err);
}

void report_events_start(trainer *t) {
  if (!t->tb.f) return;
  if (t->step > 0) {
    tb_resume(&t->tb);
    return;
  }
  if (t->tb.last_step > 0)
    printf("log.tensorboard: %s already holds events up to step %lld of an earlier run; this run starts at step 1, "
           "so TensorBoard shows both on one curve: give each run a folder of its own\n", t->c->log.tensorboard,
           (long long)t->tb.last_step);
}

void report_close(trainer *t) {
  if (t->metrics) fclose(t->metrics);
  t->metrics = NULL;
  tb_close(&t->tb);
}

// fp8.param_gather: what the updated weights' all-gather brings each rank per step, as FP8 codes
// and in the act dtype, against the compute copy alone (the rank that receives most; collective).
static void report_param_gather(trainer *t) {
  if (!t->c->optim.fp8_param_gather) return;
  const param_gather *pg = t->o.pg;
  double mib[3] = {0, 0, 0};
  if (pg) mib[0] = pg->bytes_codes / 1048576, mib[1] = pg->bytes_act / 1048576, mib[2] = pg->bytes_plain / 1048576;
  t->g->world->ops->all_reduce(t->g->world, mib, 3, COMM_F64, COMM_MAX);
  if (t->g->world_rank != 0) return;
  const char *act = t->be->act == K_BF16 ? "bf16" : "fp32";
  if (mib[2] == 0) printf("fp8.param_gather: no effect with dp 1 (no weights to gather)\n");
  else printf("fp8.param_gather: the updated weights reach a rank in %.3f MiB a step (%.3f MiB of FP8 codes, %.3f MiB in "
              "%s) instead of %.3f MiB in %s\n", mib[0] + mib[1], mib[0], mib[1], act, mib[2], act);
}

// parallel.shard: what each rank holds of the optimizer's state (rank 0; every part is the same
// size), or that dp 1 leaves nothing to shard.
static void report_shard_line(trainer *t) {
  if (t->c->parallel.shard == CFG_SHARD_NONE || t->g->world_rank != 0) return;
  const char *mode = cfg_shard_names[t->c->parallel.shard];
  if (t->g->dp == 1) {
    printf("parallel.shard=%s: no effect with dp 1 (one rank holds all of the optimizer's state)\n", mode);
    return;
  }
  const struct grad_shard *gs = t->o.gs;
  const struct weight_shard *ws = t->o.ws;
  const double gib = 1073741824.0, n_bytes = (gs ? 16.0 : 12.0) * (double)t->o.shard_n + (ws ? (double)ws->n_bytes : 0);
  printf("parallel.shard=%s: each rank holds its part (1/%d) of the fp32 master weights, AdamW moments%s: %lld of "
         "%lld parameters, %.2f GiB", mode, t->o.parts,
         !ws  ? (gs ? " and gradients" : "")
         : t->o.part_pc ? ", gradients and compute copy (with its gathered layers' slots)"
                        : ", gradients (and the compute copy's gathered layers' slots)",
         (long long)t->o.shard_n, (long long)t->m.n_params, n_bytes / gib);
  if (gs) printf(", and %.2f GiB of gradient staging (two layers' slots)", (double)gs->staging_bytes / gib);
  if (t->o.replica) printf("; parallel.shard_group: %d groups of %d dp ranks, each a replica", t->o.replica->size, t->o.parts);
  printf("\n");
}

// optimizer.offload: the pinned host memory the optimizer's state took (its own allocations), on
// rank 0 per parameter it holds, and on the fullest rank; and whether offload_layer_wait is in force.
static void report_offload_line(trainer *t) {
  if (!t->c->optim.offload) return;
  double most = (double)t->o.host_bytes;
  t->g->world->ops->all_reduce(t->g->world, &most, 1, COMM_F64, COMM_MAX);
  if (t->g->world_rank != 0) return;
  printf("offload: %lld bytes of pinned host memory for the optimizer state of rank 0's %lld parameters (%.2f "
         "bytes each; %.2f GiB, the fullest rank %.2f GiB)%s\n", (long long)t->o.host_bytes, (long long)t->m.n_params,
         (double)t->o.host_bytes / (double)t->m.n_params, t->o.host_bytes / 1073741824.0, most / 1073741824.0,
         t->o.layer_wait ? "; the host update finishes in the next forward, layer by layer (offload_layer_wait)" : "");
}

void report_model_line(trainer *t) {
  const cfg *c = t->c;
  int64_t n_params_no_embed = 0, n_params = model_count_params(&c->model, &n_params_no_embed);
  // The fewest OpenMP threads of any rank: 1 where mpirun bound each rank to one core (README).
  int32_t n_threads = -omp_get_max_threads();
  t->g->world->ops->all_reduce(t->g->world, &n_threads, 1, COMM_I32, COMM_MAX);  // min(x) = -max(-x)
  if (t->g->world_rank == 0)
    printf("model: %.2fM parameters (%.2fM without the embedding), %d micro-batches of %d x %d tokens per rank "
           "per step, %s backend, %d rank%s, %d OpenMP thread%s per rank\n",
           n_params / 1e6, n_params_no_embed / 1e6, t->n_micro, c->train.micro_batch, c->model.seq_len, t->be->name,
           t->g->world_size, t->g->world_size > 1 ? "s" : "", -n_threads, n_threads < -1 ? "s" : "");
  report_shard_line(t);
  report_param_gather(t);
  report_offload_line(t);
}

// The values of one logged step, gathered once: the progress line, the metrics record and the
// TensorBoard event all take them from here (docs/metrics.md names each).
typedef struct report_step {
  int64_t step;
  double loss, lr, grad_norm;  // loss and grad_norm NaN or Inf on a skipped step
  double tokens_per_s, ms_per_step, tflops_per_rank, mem_gib;
  double mfu;                  // NaN: no peak known
  double ms_compute, ms_tp_comm, ms_pp_comm, ms_dp_comm, ms_dp_gather, ms_optimizer, ms_data;
  double val_loss;             // NaN: no evaluation at this step
} report_step;

static report_step report_gather_step(const trainer *t, const trainer_step_result *r, double val_loss) {
  const step_timing *tm = &t->stats.tm;
  double tps = t->tokens_per_step / r->seconds;
  double tflops = tps * t->flops_per_token / 1e12 / t->g->world_size;  // per rank
  return (report_step){
      .step = t->step, .loss = r->loss, .lr = r->lr, .grad_norm = r->grad_norm, .tokens_per_s = tps,
      .ms_per_step = r->seconds * 1e3, .tflops_per_rank = tflops, .mem_gib = r->mem_bytes / 1073741824.0,
      .mfu = t->be->peak_tflops > 0 ? tflops / t->be->peak_tflops : NAN, .ms_compute = tm->compute * 1e3,
      .ms_tp_comm = tm->tp_comm * 1e3, .ms_pp_comm = tm->pp_comm * 1e3, .ms_dp_comm = tm->dp_comm * 1e3,
      .ms_dp_gather = tm->dp_gather * 1e3, .ms_optimizer = tm->optimizer * 1e3, .ms_data = tm->data * 1e3, .val_loss = val_loss};
}

static void report_print_step(const trainer *t, const report_step *v) {
  const trainer_stats *s = &t->stats;
  int steps = t->c->train.steps;
  double eta = (double)(t->last_step - t->step) * (s->t_steps / (t->step - s->first_step));
  char eta_s[32];
  report_duration(eta, eta_s, sizeof eta_s);
  printf("step %5lld/%d | loss %.4f | lr %.2e | grad_norm %.3f | %.0f tok/s | %.1f ms/step", (long long)v->step,
         steps, v->loss, v->lr, v->grad_norm, v->tokens_per_s, v->ms_per_step);
  if (!isnan(v->mfu)) printf(" | MFU %.1f%%", 100 * v->mfu);
  printf(" | mem %.2f GiB | %3.0f%% | ETA %s", v->mem_gib, 100.0 * v->step / steps, eta_s);
  if (!isnan(v->val_loss)) printf(" | val_loss %.4f", v->val_loss);
  printf("\n");
  fflush(stdout);
}

static void report_json_step(FILE *f, const report_step *v) {
  // JSON has no NaN or Inf: a skipped step (train.skip_nonfinite) has a null grad_norm.
  char loss_s[32] = "null", norm_s[32] = "null";
  if (isfinite(v->loss)) snprintf(loss_s, sizeof loss_s, "%.9g", v->loss);
  if (isfinite(v->grad_norm)) snprintf(norm_s, sizeof norm_s, "%.9g", v->grad_norm);
  fprintf(f, "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens_per_s\": %.1f, "
             "\"ms_per_step\": %.3f, \"tflops_per_rank\": %.3f, \"mem_gib\": %.3f",
          (long long)v->step, loss_s, v->lr, norm_s, v->tokens_per_s, v->ms_per_step, v->tflops_per_rank, v->mem_gib);
  if (!isfinite(v->grad_norm)) fprintf(f, ", \"skipped\": true");
  if (!isnan(v->mfu)) fprintf(f, ", \"mfu\": %.4f", v->mfu);
  fprintf(f, ", \"ms_compute\": %.3f, \"ms_tp_comm\": %.3f, \"ms_pp_comm\": %.3f, \"ms_dp_comm\": %.3f, "
             "\"ms_dp_gather\": %.3f, \"ms_optimizer\": %.3f, \"ms_data\": %.3f",
          v->ms_compute, v->ms_tp_comm, v->ms_pp_comm, v->ms_dp_comm, v->ms_dp_gather, v->ms_optimizer, v->ms_data);
  if (!isnan(v->val_loss)) fprintf(f, ", \"val_loss\": %.9g", v->val_loss);
  fprintf(f, "}\n");
  fflush(f);
}

// The same values as TensorBoard scalars (tags: docs/metrics.md). A skipped step's NaN or Inf
// loss and grad_norm are written as they are (TensorBoard shows them).
static void report_events_step(trainer *t, const report_step *v) {
  tb_scalar s[16];
  int n = 0;
  s[n++] = (tb_scalar){"loss", v->loss};
  if (!isnan(v->val_loss)) s[n++] = (tb_scalar){"val_loss", v->val_loss};
  s[n++] = (tb_scalar){"lr", v->lr};
  s[n++] = (tb_scalar){"grad_norm", v->grad_norm};
  s[n++] = (tb_scalar){"tokens_per_s", v->tokens_per_s};
  if (!isnan(v->mfu)) s[n++] = (tb_scalar){"mfu", v->mfu};
  s[n++] = (tb_scalar){"mem_gib", v->mem_gib};
  s[n++] = (tb_scalar){"step_ms/data", v->ms_data};
  s[n++] = (tb_scalar){"step_ms/compute", v->ms_compute};
  s[n++] = (tb_scalar){"step_ms/tp_comm", v->ms_tp_comm};
  s[n++] = (tb_scalar){"step_ms/pp_comm", v->ms_pp_comm};
  s[n++] = (tb_scalar){"step_ms/dp_comm", v->ms_dp_comm};
  s[n++] = (tb_scalar){"step_ms/dp_gather", v->ms_dp_gather};
  s[n++] = (tb_scalar){"step_ms/optimizer", v->ms_optimizer};
  if (tb_write_scalars(&t->tb, v->step, s, n) != 0) {
    fprintf(stderr, "warning: cannot write to log.tensorboard '%s' (%s); no more TensorBoard events this run\n",
            t->c->log.tensorboard, strerror(errno));
    tb_close(&t->tb);
  }
}

void trainer_log(trainer *t, const trainer_step_result *r, double val_loss) {
  if (t->g->world_rank != 0) return;
  report_step v = report_gather_step(t, r, val_loss);
  report_print_step(t, &v);
  if (t->metrics) report_json_step(t->metrics, &v);
  report_events_step(t, &v);
}

// The pipeline's idle share (collective), as fractions: the mean over ranks, the busiest stage's
// and this rank's. Each rank idles for the schedule's bubble, the transfers, and waiting for a
// slower stage (the last one also runs the head). Every rank starts the schedule at the same
// time (the previous step ended in a world all-reduce) and the schedule lasts as long as it
// does on the rank that ends last, so a rank's idle time is that longest span less its own
// compute: this counts the drain at the end too, which a stage that finished early spends
// waiting outside any transfer. The mean is the share of GPU time the pipeline loses (what
// (p-1)/(v*m+p-1) predicts for equal stages); the minimum is the busiest stage's.
typedef struct report_bubble {
  double mean, busiest, own;
} report_bubble;

static report_bubble report_pipeline_idle(const trainer *t) {
  const step_timing *tt = &t->stats.tm_total;
  comm *w = t->g->world;
  double pipe = tt->compute + tt->tp_comm + tt->pp_comm, pipe_max = pipe;
  w->ops->all_reduce(w, &pipe_max, 1, COMM_F64, COMM_MAX);
  double idle = pipe_max > 0 && t->g->pp > 1 ? (pipe_max - tt->compute - tt->tp_comm) / pipe_max : 0.0;
  double idle_mean = idle, idle_min = -idle;
  w->ops->all_reduce(w, &idle_mean, 1, COMM_F64, COMM_SUM);
  w->ops->all_reduce(w, &idle_min, 1, COMM_F64, COMM_MAX);  // min(x) = -max(-x)
  return (report_bubble){idle_mean / t->g->world_size, -idle_min, idle};
}

// The report's figures, derived once from the running sums.
typedef struct report_figures {
  double wall, mean_tps, mean_tflops, mfu, ms_per;  // ms_per: ms per timed step of a total in seconds
  double exposed_pct, theory_pct;
  report_bubble bubble;
} report_figures;

static report_figures report_compute(const trainer *t, report_bubble bubble) {
  const trainer_stats *s = &t->stats;
  const step_timing *tt = &s->tm_total;
  report_figures f = {.bubble = bubble};
  f.wall = MPI_Wtime() - s->t_start;
  // Steady state: without the first step, which builds plans, caches and allocations.
  f.mean_tps = s->n_timed > 0 ? s->n_timed * t->tokens_per_step / s->t_steady
                              : (s->t_steps > 0 ? s->tokens_seen / s->t_steps : 0.0);
  f.mean_tflops = f.mean_tps * t->flops_per_token / 1e12 / t->g->world_size;
  f.mfu = t->be->peak_tflops > 0 ? f.mean_tflops / t->be->peak_tflops : 0.0;
  f.ms_per = s->n_timed > 0 ? 1e3 / s->n_timed : 0;
  double comm = tt->tp_comm + tt->pp_comm + tt->dp_comm;
  double all = tt->compute + tt->tp_comm + tt->pp_comm + tt->dp_comm + tt->optimizer + tt->data;
  f.exposed_pct = all > 0 ? 100 * comm / all : 0.0;
  f.theory_pct = 100 * pp_bubble_theory(t->g->pp, t->c->parallel.vpp, t->n_micro);
  return f;
}

// Rank 0's own buffers by what they hold, after the step they peaked in, and the rest of its
// device (or process) memory at its peak.
static void report_print_held(const trainer_stats *s) {
  const double gib = 1073741824.0;
  printf("memory of rank 0 (GiB): its own buffers at their peak:");
  for (int k = K_MEM_OTHER + 1; k < K_MEM_KINDS; k++)
    printf(" %s %.2f,", k_mem_kind_names[k], s->held_peak_by_kind[k] / gib);
  printf(" %s %.2f; the runtime's at the peak in use %.2f\n", k_mem_kind_names[K_MEM_OTHER],
         s->held_peak_by_kind[K_MEM_OTHER] / gib, (s->mem_peak - s->held_peak) / gib);
}

static void report_print(const trainer *t, const report_figures *f, double mem_peak, double held_peak) {
  const trainer_stats *s = &t->stats;
  const step_timing *tt = &s->tm_total;
  const k_backend *be = t->be;
  int n = t->g->world_size;
  char wall_s[32];
  report_duration(f->wall, wall_s, sizeof wall_s);
  printf("run report: %lld steps (%lld this run), %lld tokens this run in %s, mean %.0f tok/s "
         "(%.0f per rank; steps after the first), %.2f model TFLOP/s per rank",
         (long long)t->step, (long long)(t->step - s->first_step), (long long)s->tokens_seen, wall_s, f->mean_tps,
         f->mean_tps / n, f->mean_tflops);
  if (be->peak_tflops > 0)
    printf(", MFU %.1f%% of %.1f (%s)", 100 * f->mfu, be->peak_tflops, be->device_name);
  printf(", peak memory %.2f GiB on the fullest rank (the trainer's own buffers at most %.2f GiB; the rest is the "
         "runtime's: CUDA context, library workspaces, communicators), final train loss %.4f",
         mem_peak / 1073741824.0, held_peak / 1073741824.0, s->last_loss);
  if (isnan(s->last_val)) printf(", no val loss\n");
  else printf(", final val loss %.4f\n", s->last_val);
  report_print_held(s);
  if (t->o.gc && t->c->optim.grad_compress == COMM_COMPRESS_FP16)
    printf("gradient compression fp16: %lld gradient values of rank 0 rounded to zero over this run "
           "(docs/compression.md)\n", (long long)grad_compress_underflow(&t->o));
  if (s->n_timed == 0) return;
  // The step split (what each figure is: parallel/comm/timing.h; dp comm is the exposed part only).
  double k = f->ms_per;
  char gather_s[64] = "";  // the weights' all-gathers waited for, where they are timed
  if (t->o.ws && t->c->log.time_dp) snprintf(gather_s, sizeof gather_s, " (weights' gathers %.2f)", tt->dp_gather * k);
  printf("step time on rank 0 (ms, mean of %lld steps): compute %.2f | tp comm %.2f%s | pipeline comm and bubble %.2f "
         "| exposed dp comm %.2f%s | optimizer %.2f | data %.2f; exposed communication %.1f%% of the step",
         (long long)s->n_timed, tt->compute * k, tt->tp_comm * k,
         t->g->tp > 1 && !t->c->log.time_tp ? " (in compute; log.time_tp=true measures it)" : "", tt->pp_comm * k,
         tt->dp_comm * k, gather_s, tt->optimizer * k, tt->data * k, f->exposed_pct);
  if (t->g->pp > 1)
    printf("; pipeline bubble %.1f%% measured (mean over ranks; busiest stage %.1f%%, rank 0 %.1f%%), %.1f%% in "
           "theory ((p-1)/(v*m+p-1))",
           100 * f->bubble.mean, 100 * f->bubble.busiest, 100 * f->bubble.own, f->theory_pct);
  printf("\n");
}

static void report_record(const trainer *t, const report_figures *f, double mem_peak, double held_peak) {
  const trainer_stats *s = &t->stats;
  const step_timing *tt = &s->tm_total;
  char val_s[32] = "null";  // JSON has no NaN: no evaluation ran
  if (!isnan(s->last_val)) snprintf(val_s, sizeof val_s, "%.9g", s->last_val);
  char bubble_s[32] = "null", busiest_s[32] = "null", theory_s[32] = "null";
  if (t->g->pp > 1) {
    snprintf(bubble_s, sizeof bubble_s, "%.3f", 100 * f->bubble.mean);
    snprintf(busiest_s, sizeof busiest_s, "%.3f", 100 * f->bubble.busiest);
    snprintf(theory_s, sizeof theory_s, "%.3f", f->theory_pct);
  }
  char held_s[512];  // rank 0's own buffers by kind (report_print_held)
  int n = snprintf(held_s, sizeof held_s, "{");
  for (int i = 0; i < K_MEM_KINDS; i++)
    n += snprintf(held_s + n, sizeof held_s - (size_t)n, "%s\"%s\": %.3f", i ? ", " : "", k_mem_kind_names[i],
                  s->held_peak_by_kind[i] / 1073741824.0);
  snprintf(held_s + n, sizeof held_s - (size_t)n, "}");
  double k = f->ms_per;
  fprintf(t->metrics,
          "{\"report\": true, \"steps\": %lld, \"tokens\": %lld, \"wall_s\": %.3f, \"ranks\": %d, "
          "\"tokens_per_s\": %.1f, \"tokens_per_s_per_rank\": %.1f, \"tflops_per_rank\": %.3f, \"mfu\": %.4f, "
          "\"peak_mem_gib\": %.3f, \"peak_held_gib\": %.3f, \"peak_held_by_kind_gib\": %s, \"final_loss\": %.9g, "
          "\"final_val_loss\": %s, "
          "\"step_ms\": {\"compute\": %.3f, \"tp_comm\": %.3f, \"pp_comm\": %.3f, \"dp_comm\": %.3f, "
          "\"dp_gather\": %.3f, \"optimizer\": %.3f, \"data\": %.3f}, \"exposed_comm_pct\": %.3f, \"bubble_pct\": %s, "
          "\"bubble_busiest_pct\": %s, \"bubble_theory_pct\": %s}\n",
          (long long)t->step, (long long)s->tokens_seen, f->wall, t->g->world_size, f->mean_tps,
          f->mean_tps / t->g->world_size, f->mean_tflops, f->mfu, mem_peak / 1073741824.0, held_peak / 1073741824.0,
          held_s, s->last_loss, val_s,
          tt->compute * k, tt->tp_comm * k, tt->pp_comm * k, tt->dp_comm * k, tt->dp_gather * k, tt->optimizer * k,
          tt->data * k, f->exposed_pct, bubble_s, busiest_s, theory_s);
}

void trainer_report(trainer *t) {
  double peaks[2] = {t->stats.mem_peak, t->stats.held_peak};
  t->g->world->ops->all_reduce(t->g->world, peaks, 2, COMM_F64, COMM_MAX);
  const double mem_peak = peaks[0], held_peak = peaks[1];
  report_bubble bubble = report_pipeline_idle(t);
  if (t->g->world_rank != 0) return;
  report_figures f = report_compute(t, bubble);
  report_print(t, &f, mem_peak, held_peak);
  if (t->metrics) report_record(t, &f, mem_peak, held_peak);
}
