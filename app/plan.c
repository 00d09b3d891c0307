// Dry-run planning (see plan.h). Sizes come from the same spec table and activation layout
// the model allocates from, so the estimate follows the code.
#include "app/plan.h"
#include "model/model.h"
#include "parallel/step/optim.h"
#include "parallel/step/pp_schedule.h"
#include <stdio.h>
#include <string.h>

static double gib(double n_bytes) { return n_bytes / (1024.0 * 1024.0 * 1024.0); }

// Elements of the tensors of one layer, or of the non-layer tensors of a stage, on one tp rank.
static int64_t local_elems(const model_config *mc, int tp, model_kind k) {
  int64_t full[2];
  model_full_shape(mc, k, full);
  int64_t n = full[0] * full[1];
  return model_specs[k].tp_split >= 0 ? n / tp : n;
}

// A word of a shell command, quoted where the shell would change it.
static void plan_word(const char *w) {
  if (*w && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,/:=+@%") == strlen(w)) {
    printf(" %s", w);
    return;
  }
  printf(" '");
  for (const char *q = w; *q; q++) *q == '\'' ? printf("'\\''") : putchar(*q);
  putchar('\'');
}

static void plan_trainer_args(const plan_launch *l) {
  plan_word(l->argv0);
  plan_word(l->config);
  for (int i = 0; i < l->n_over; i++) plan_word(l->over[i]);
  putchar('\n');
}

// Whether some group of the axis (0 tp, 1 dp, 2 pp) holds ranks of two nodes of rpn ranks each.
static int plan_axis_spans(int tp, int dp, int pp, int axis, int rpn) {
  for (int r = 0; r < tp * dp * pp; r++) {
    int t = r % tp, d = (r / tp) % dp, p = r / (tp * dp);
    int first = axis == 0 ? tp * (d + dp * p) : axis == 1 ? t + tp * dp * p : t + tp * d;
    if (r / rpn != first / rpn) return 1;
  }
  return 0;
}

// How the ranks land on nodes of gpus_per_node GPUs, and the commands that launch them so.
static void plan_print_launch(const cfg *c, int world, const plan_launch *l) {
  const cfg_parallel *pc = &c->parallel;
  int rpn = l->gpus_per_node < world ? l->gpus_per_node : world, n_nodes = (world + rpn - 1) / rpn;
  static const char *const axes[] = {"tp", "dp", "pp"};
  char inside[32] = "", across[32] = "";
  for (int a = 0; a < 3; a++) {
    int size = a == 0 ? pc->tp : a == 1 ? pc->dp : pc->pp;
    if (size == 1) continue;
    char *dst = plan_axis_spans(pc->tp, pc->dp, pc->pp, a, rpn) ? across : inside;
    snprintf(dst + strlen(dst), 32 - strlen(dst), "%s%s", *dst ? ", " : "", axes[a]);
  }
  printf("launch: %d rank%s on %d node%s of %d (--gpus-per-node %d); groups inside a node: %s; across nodes: %s\n",
         world, world == 1 ? "" : "s", n_nodes, n_nodes == 1 ? "" : "s", rpn, l->gpus_per_node,
         *inside ? inside : "none", *across ? across : "none");
  if (pc->tp > 1 && plan_axis_spans(pc->tp, pc->dp, pc->pp, 0, rpn))
    printf("warning: with %d ranks per node, tp groups of %d span nodes: pick --gpus-per-node a multiple of tp\n",
           rpn, pc->tp);
  if (n_nodes > 1) printf("  mpirun -np %d --hostfile HOSTFILE --map-by ppr:%d:node", world, rpn);
  else printf("  mpirun -np %d", world);
  plan_trainer_args(l);
  printf("  srun --nodes %d", n_nodes);
  if (world % rpn) printf(" --ntasks %d", world);
  printf(" --ntasks-per-node %d --gpus-per-node %d", rpn, rpn);
  plan_trainer_args(l);
  if (n_nodes > 1) printf("(HOSTFILE: one line per node, `name slots=%d`; docs/multinode.md)\n", rpn);
}

// Local parameters of one layer kind summed over virtual stage vs's chunk (embedding, layers,
// head): what model_init lays out on that rank for that chunk.
static int64_t plan_chunk_params(const cfg *c, const model_layout *ml, int vs) {
  const model_config *mc = &c->model;
  int tp = c->parallel.tp, l0, per_chunk, n_vstages = c->parallel.pp * c->parallel.vpp;
  model_stage_layers(mc, ml, vs, &l0, &per_chunk);
  int64_t n = vs == 0 ? local_elems(mc, tp, MODEL_EMBED) : 0;
  for (int k = 0; k < MODEL_N_KINDS; k++)
    if (model_specs[k].per_layer) n += (int64_t)per_chunk * local_elems(mc, tp, (model_kind)k);
  if (vs == n_vstages - 1)
    n += local_elems(mc, tp, MODEL_FINAL_NORM) + (mc->tie_embeddings ? 0 : local_elems(mc, tp, MODEL_LM_HEAD));
  return n;
}

// parallel.shard=grads and weights: a rank's largest group of tensors (a layer, the final norm and
// head, an untied embedding), rounded up to dp * 128 as the model lays groups out, and in *tied a
// tied embedding, so rounded: each slot of the gradients' staging (parallel/step/grad_shard.h)
// holds the largest group, where a tied embedding has a slot of its own; each slot of the
// gathered weights (weight_shard.h) holds the larger of the two.
static int64_t plan_largest_group(const cfg *c, int has_embed, int has_head, int64_t *tied) {
  const model_config *mc = &c->model;
  int tp = c->parallel.tp;
  int64_t largest = 0, unit = (int64_t)c->parallel.dp * 128;
  for (int k = 0; k < MODEL_N_KINDS; k++)
    if (model_specs[k].per_layer) largest += local_elems(mc, tp, (model_kind)k);
  if (has_head) {
    int64_t head = local_elems(mc, tp, MODEL_FINAL_NORM) + (mc->tie_embeddings ? 0 : local_elems(mc, tp, MODEL_LM_HEAD));
    if (head > largest) largest = head;
  }
  int64_t embed = has_embed ? local_elems(mc, tp, MODEL_EMBED) : 0;
  *tied = mc->tie_embeddings ? (embed + unit - 1) / unit * unit : 0;
  if (!mc->tie_embeddings && embed > largest) largest = embed;
  return (largest + unit - 1) / unit * unit;
}

int64_t plan_rank_params(const cfg *c, int pp_rank) {
  const model_layout ml = cfg_model_layout(c);
  int64_t n = 0;
  for (int ci = 0; ci < c->parallel.vpp; ci++) n += plan_chunk_params(c, &ml, ci * c->parallel.pp + pp_rank);
  return n;
}

// The parts the sharded state is cut into: the shard group's size (dp unless parallel.shard_group)
// with parallel.shard, else 1.
static int plan_parts(const cfg *c) {
  const int dp = c->parallel.dp, group = c->parallel.shard_group;
  return c->optim.shard >= OPT_SHARD_OPTIMIZER && dp > 1 ? (group > 0 ? group : dp) : 1;
}

double plan_host_bytes(const cfg *c, int64_t n) {
  const opt_config *o = &c->optim;
  if (!o->offload) return 0;
  const int parts = plan_parts(c);
  double share = (double)o->offload_fraction * n / parts;
  int act_bytes = c->train.device != CFG_DEVICE_CPU && cfg_act_bf16(c) ? 2 : 4;
  // The cpu engine's copies: a few bucket parts (OFFLOAD_SLOTS of optim_offload.c) of gradient
  // and new weights.
  double part = (double)c->optim.bucket_mb * (1 << 20) / 4 / parts;
  double slots = o->offload_delay || 4.0 * part > share ? share : 4.0 * part;  // delayed: every bucket
  // The master weights (4 bytes) and both moments (8) of this rank's part of the host share.
  return 12.0 * share + (o->offload_cpu ? (4.0 + act_bytes) * slots : 0.0);
}

// One rank's memory estimate (bytes; act for one micro-batch in one chunk, acts for all in flight).
typedef struct plan_mem {
  int64_t n;              // local parameters
  double w, gr, adam;     // weights (compute copy, masters held here, FP8 copies), gradients, moments
  double act, acts;       // activations of one micro-batch chunk, and of all in flight (and staging)
  double work;            // the model's work buffers and the tp peer copies' staging
  double host;            // pinned host memory (optimizer.offload)
  int in_flight;          // micro-batch chunks whose backward has not run yet
  char layers[64];        // the layers it holds, per chunk
  model_dims dm;          // its activation sizes
} plan_mem;

static double plan_total(const plan_mem *r) { return r->w + r->gr + r->adam + r->acts + r->work; }

// Whether parallel.tp_overlap runs the tp collectives as peer copies (auto: assumed where the tp
// group is GPU ranks over NCCL with SP; the run probes peer access).
static int plan_tp_peer(const cfg *c) {
  const cfg_parallel *p = &c->parallel;
  return c->train.device == CFG_DEVICE_CUDA && p->gpu_comm == CFG_GPU_COMM_NCCL && p->tp > 1 &&
         p->sequence_parallel && (p->tp_overlap == CFG_TP_OVERLAP_AUTO || p->tp_overlap == CFG_TP_OVERLAP_P2P);
}

// What rank (pp_rank pr, tp_rank tr) of c holds.
static plan_mem plan_rank_mem(const cfg *c, int pr, int tr) {
  const model_config *mc = &c->model;
  const cfg_parallel *pc = &c->parallel;
  const model_layout ml = cfg_model_layout(c);
  int tp = pc->tp, pp = pc->pp, dp = pc->dp, vpp = pc->vpp, sp = pc->sequence_parallel && tp > 1;
  int gpu = c->train.device == CFG_DEVICE_CUDA, bf16_act = gpu && cfg_act_bf16(c), act_bytes = bf16_act ? 2 : 4;
  plan_mem r = {0};
  pp_schedule s = {0};
  char err[256];
  int built = pp_schedule_build(&s, pp, vpp, cfg_n_micro(c), pr, err, sizeof err) == 0;
  int max_group = built ? pp_schedule_max_group(&s) : 1;
  r.in_flight = built ? s.max_in_flight : 1;
  pp_schedule_free(&s);
  model_dims *dm = &r.dm;
  model_dims_compute(dm, mc, ml.micro_batch, tp, tr, sp);
  int64_t act = 0, n_proj = 0;  // n_proj: parameters of the block projections (FP8), and the head's
  int has_fp8_head = 0, len = 0, has_embed = pr == 0, has_head = 0, n_layers_here = 0;
  for (int ci = 0; ci < vpp; ci++) {
    int vs = ci * pp + pr, l0, per_chunk, last = vs == pp * vpp - 1;
    model_stage_layers(mc, &ml, vs, &l0, &per_chunk);
    len += snprintf(r.layers + len, sizeof r.layers - len, "%s%d-%d", ci ? "," : "", l0, l0 + per_chunk - 1);
    r.n += plan_chunk_params(c, &ml, vs);
    n_layers_here += per_chunk;
    for (int l = l0; l < l0 + per_chunk; l++)
      if (ml.fp8.enabled && !(ml.fp8.edge_layers_bf16 && (l == 0 || l == mc->n_layers - 1)))
        for (int k = MODEL_WQ; k <= MODEL_W_DOWN; k++)
          if (k != MODEL_MLP_NORM) n_proj += local_elems(mc, tp, (model_kind)k);
    has_head |= last;
    if (last && ml.fp8.enabled && ml.fp8.head) n_proj += local_elems(mc, tp, MODEL_LM_HEAD), has_fp8_head = 1;
    int64_t a = model_acts_bytes(dm, per_chunk, last, act_bytes, ml.recompute);
    if (a > act) act = a;
  }
  const double n = (double)r.n;
  // With the optimizer's state sharded the reduced part of every bucket sits beside the full
  // gradients. A compressed reduction (parallel/step/grad_compress.c) adds its wire buffers: 16-bit
  // codes of both, or int8 send and receive slots with a scale per 256 elements; error feedback an
  // fp32 residual.
  const int parts = plan_parts(c), zero = parts > 1;
  comm_compress_mode gcm = dp > 1 ? c->optim.grad_compress : COMM_COMPRESS_NONE;
  double wire = gcm == COMM_COMPRESS_NONE   ? 0.0
                : gcm == COMM_COMPRESS_INT8 ? 2.0 * (1.0 + 4.0 / 256)
                                            : 2.0 * (1.0 + (zero ? 1.0 / parts : 0.0));
  double ef = gcm != COMM_COMPRESS_NONE && c->optim.grad_error_feedback ? 4.0 : 0.0;
  r.gr = 4.0 * n * (zero ? 1.0 + 1.0 / parts : 1.0) + (wire + ef) * n;
  // parallel.shard=grads: the reduced part only, and the staging of the groups backward writes
  // (two slots, a tied embedding's own, a bucket part); reduced in bf16, each slot's bf16 copy
  // and received part too (grad_shard.h).
  int64_t tied = 0, group = ml.grads_in_optimizer ? plan_largest_group(c, has_embed, has_head, &tied) : 0;
  const double staged = 2.0 * group + (double)tied, n_slots = tied ? 3.0 : 2.0;
  if (ml.grads_in_optimizer)
    r.gr = 4.0 * n / parts + 4.0 * (staged + (double)group / parts) +
           (gcm == COMM_COMPRESS_BF16 ? 2.0 * (staged + n_slots * (double)group / parts) : 0.0);
  // optimizer.offload=host: the master weights and the host share of the moments move to pinned
  // host memory (plan_host_bytes); the compute copy is then separate even in fp32. Where the
  // optimizer holds the masters, the device share keeps them beside its moments, sharded like
  // them (all of the state is the device share without offload).
  const opt_config *oc = &c->optim;
  double dev_frac = oc->offload ? 1.0 - oc->offload_fraction : 1.0;
  double dev_share = ml.master_in_optimizer ? dev_frac * n / parts : 0.0;
  r.w = ml.master_in_optimizer ? (bf16_act ? 2.0 : 4.0) * n + 4.0 * dev_share : (bf16_act ? 6.0 : 4.0) * n;
  // parallel.shard=weights: parallel.shard_prefetch + 1 groups gathered, or with
  // reshard_after_forward=false every group (its layers, the embedding's and the head's); with
  // offload also this rank's part of the compute copy (weight_shard.h).
  const double slots = pc->reshard_after_forward ? pc->shard_prefetch + 1.0 : (double)(n_layers_here + has_embed + has_head);
  if (ml.weights_in_optimizer)
    r.w = act_bytes * ((oc->offload ? n / parts : 0.0) + slots * (double)(group > tied ? group : tied)) + 4.0 * dev_share;
  r.adam = 8.0 * n / parts * dev_frac;
  // train.skip_nonfinite: the update's trial, four arrays of a block of this rank's shard (optim.c).
  if (c->train.skip_nonfinite > 0) r.adam += 16.0 * (double)opt_trial_elems((int64_t)(n / parts));
  r.host = plan_host_bytes(c, r.n);
  // parallel.pp_comm_bf16: a bf16 staging buffer per transfer of a group, or with pp_overlap
  // two per activation set in flight (parallel/step/pp_exec.c).
  double n_stage = pc->pp_overlap ? 2.0 * r.in_flight : (double)max_group;
  double stage = pc->pp_comm_bf16 && pp > 1 ? n_stage * dm->rows_s * dm->d * 2.0 : 0.0;
  // FP8: each projection's weight in FP8 and transposed (2 bytes a parameter), and the casts of
  // one GEMM's input and output gradient (model/fp8.c); the scaling state is a few KiB.
  if (ml.fp8.enabled) {
    int qd = dm->nh * dm->hd, qkvd = qd + 2 * dm->nkv * dm->hd, k_max = dm->d > qd ? dm->d : qd, n_max = dm->d;
    if (dm->ffn > k_max) k_max = dm->ffn;
    if (qkvd > n_max) n_max = qkvd;
    if (2 * dm->ffn > n_max) n_max = 2 * dm->ffn;
    if (has_fp8_head && dm->vocab > n_max) n_max = dm->vocab;
    // parallel.shard=weights: the copies of the groups gathered only (a bank per slot,
    // model_fp8_place), a layer's projections or the head's.
    double layer_proj = 0, head = has_fp8_head ? local_elems(mc, tp, MODEL_LM_HEAD) : 0;
    for (int k = MODEL_WQ; k <= MODEL_W_DOWN; k++)
      if (k != MODEL_MLP_NORM) layer_proj += (double)local_elems(mc, tp, (model_kind)k);
    double copies = ml.weights_in_optimizer ? slots * 2.0 * (n_proj ? (layer_proj > head ? layer_proj : head) : head)
                                            : 2.0 * n_proj;
    r.w += copies + (double)dm->rows * (k_max + 2.0 * n_max);
  }
  r.act = (double)act;
  r.acts = r.act * r.in_flight + stage;
  // parallel.tp_overlap=p2p: a slot per tp rank of the largest block it receives (an fp32
  // reduce-scatter block of rows_s x d; parallel/comm/nccl/comm_peer.c).
  r.work = (double)model_work_bytes(dm, act_bytes) + (plan_tp_peer(c) ? (double)tp * dm->rows_s * dm->d * 4.0 : 0.0);
  return r;
}

// The fullest rank's device memory of c (bytes).
static double plan_max_total(const cfg *c) {
  double most = 0;
  for (int pr = 0; pr < c->parallel.pp; pr++)
    for (int tr = 0; tr < c->parallel.tp; tr++) {
      const plan_mem r = plan_rank_mem(c, pr, tr);
      if (plan_total(&r) > most) most = plan_total(&r);
    }
  return most;
}

// NCCL's buffers of one communicator over n ranks (GiB); none for one rank.
static double plan_comm_gib(int n) { return n > 1 ? 0.11 + 0.12 * (n - 1) : 0.0; }

// What the table leaves out but a GPU rank holds (GiB): the CUDA context, cuBLAS's and cuDNN's
// workspaces and NCCL's buffers. Fitted to the runtime's share of the peak that run reports give
// (docs/benchmarks.md, "Memory: plan against measured"): 2.26 GiB on one H200, 2.53 with one
// 2-rank NCCL communicator, about 4.2 with four 4-rank ones (7B dp4, parallel.shard=weights); so
// 2.3 GiB and plan_comm_gib for each communicator over more than one rank that the run makes
// (factory_init).
static double plan_runtime_gib(const cfg *c) {
  const cfg_parallel *p = &c->parallel;
  const int dp = p->dp, weights = p->shard == CFG_SHARD_WEIGHTS && dp > 1;
  const int grouped = p->shard_group > 1 && p->shard_group < dp, shard = grouped ? p->shard_group : dp;
  double gib = 2.3 + plan_comm_gib(p->tp) + plan_comm_gib(dp) + plan_comm_gib(p->pp);
  if (p->dp_overlap_ctas > 0 || weights) gib += plan_comm_gib(dp);  // grid_add_dp_overlap
  if (grouped) gib += plan_comm_gib(p->shard_group) + plan_comm_gib(dp / p->shard_group);
  const int gathers = !weights ? 0 : p->gather_copy_engine ? p->shard_prefetch + 1 : p->shard_prefetch > 1 ? p->shard_prefetch - 1 : 0;
  return gib + gathers * plan_comm_gib(shard);
}

// The fullest rank under each parallel.shard mode, the rest of c as it is (dp > 1); with
// --gpu-mem, whether this run fits and, if not, the least sharding that would.
static void plan_print_shard_modes(const cfg *c, int gpu_mem_gib) {
  double need[CFG_SHARD_WEIGHTS + 1];
  for (int m = CFG_SHARD_NONE; m <= CFG_SHARD_WEIGHTS; m++) {
    cfg alt = *c;
    alt.parallel.shard = (cfg_shard)m;
    cfg_resolve_shard(&alt);
    need[m] = gib(plan_max_total(&alt));
  }
  if (c->parallel.dp > 1) {
    printf("parallel.shard: the fullest rank needs");
    for (int m = CFG_SHARD_NONE; m <= CFG_SHARD_WEIGHTS; m++)
      printf("%s %.2f GiB with %s%s", m ? "," : "", need[m], cfg_shard_names[m],
             m == (int)c->parallel.shard ? " (this run)" : "");
    printf("\n");
  }
  if (!gpu_mem_gib) return;
  const double runtime = plan_runtime_gib(c), room = gpu_mem_gib - runtime, mine = need[c->parallel.shard];
  printf("fit: %.2f GiB planned on the fullest rank, %d GiB a GPU less about %.1f GiB for the CUDA context, NCCL and "
         "the libraries' workspaces: ", mine, gpu_mem_gib, runtime);
  if (mine <= room) {
    printf("fits\n");
    return;
  }
  int m = c->parallel.dp > 1 ? (int)c->parallel.shard + 1 : CFG_SHARD_WEIGHTS + 1;
  while (m <= CFG_SHARD_WEIGHTS && need[m] > room) m++;
  if (m <= CFG_SHARD_WEIGHTS) printf("does not fit; parallel.shard=%s would (%.2f GiB)\n", cfg_shard_names[m], need[m]);
  else printf("does not fit%s; try train.recompute=full, a smaller train.micro_batch or more ranks\n",
              c->parallel.dp > 1 ? " under any parallel.shard" : "");
}

int run_plan(const cfg *c, int world_size, const plan_launch *launch) {
  const model_config *mc = &c->model;
  const cfg_parallel *pc = &c->parallel;
  int tp = pc->tp, pp = pc->pp, dp = pc->dp, vpp = pc->vpp;
  int sp = pc->sequence_parallel && tp > 1;
  int n_micro = cfg_n_micro(c);
  const model_layout ml = cfg_model_layout(c);
  int64_t n_no_embed = 0, n_total = model_count_params(mc, &n_no_embed);
  int hd = mc->dim / mc->n_heads;
  printf("plan: %d ranks = tp %d x dp %d x pp %d (vpp %d)%s%s%s\n", world_size, tp, dp, pp, vpp,
         sp ? ", sequence parallel" : "", plan_parts(c) > 1 ? ", parallel.shard=" : "",
         plan_parts(c) > 1 ? cfg_shard_names[c->parallel.shard] : "");
  printf("model: %.3fB parameters (%.3fB without the embedding), d %d, %d layers, %d heads (%d kv), head dim %d, "
         "ffn %d, vocab %d, seq %d\n",
         n_total / 1e9, n_no_embed / 1e9, mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, hd, mc->ffn_dim,
         mc->vocab_size, mc->seq_len);
  printf("batch: global %d sequences = dp %d x %d micro-batches x %d; pipeline bubble (theory) %.1f%%\n",
         c->train.global_batch, dp, n_micro, c->train.micro_batch, 100 * pp_bubble_theory(pp, vpp, n_micro));
  // GPUs in bf16 hold bf16 activations and a bf16 compute copy of the weights beside the fp32 masters.
  int gpu = c->train.device == CFG_DEVICE_CUDA, bf16_act = gpu && cfg_act_bf16(c);
  // The optimizer holds the fp32 masters (ml.master_in_optimizer): its part with parallel.shard, the
  // device share's with optimizer.offload; else the model holds them whole.
  const char *weights = ml.weights_in_optimizer
                            ? (c->optim.offload
                                   ? (bf16_act ? "bf16 compute copy and fp32 masters of this rank's part + layers gathered"
                                               : "fp32 compute copy and fp32 masters of this rank's part + layers gathered")
                                   : "fp32 masters of this rank's part + layers gathered")
                        : ml.master_in_optimizer
                            ? (c->optim.offload ? (bf16_act ? "bf16 compute copy + fp32 masters of the device share"
                                                            : "fp32 compute copy + fp32 masters of the device share")
                                                : (bf16_act ? "bf16 compute copy + fp32 masters of this rank's part"
                                                            : "fp32 compute copy + fp32 masters of this rank's part"))
                        : bf16_act ? "fp32 master weights + bf16 compute copy"
                                   : "fp32 master weights";
  printf("memory per rank, as train.device=%s holds it (%s, %s, %s activations; Adam "
         "moments %s):\n", gpu ? "cuda" : cfg_device_names[c->train.device], weights,
         ml.grads_in_optimizer ? "fp32 grads sharded + two layers' staging" : "fp32 grads",
         bf16_act ? "bf16" : "fp32", plan_parts(c) == 1 ? "replicated"
                                      : c->parallel.shard_group > 0 && c->parallel.shard_group < dp ? "sharded over each shard group"
                                                                                                    : "sharded over dp");
  printf("  %-8s %-8s %-22s %-12s %-12s %-14s %9s %8s %8s %8s %9s %8s %8s %9s\n", "pp_rank", "tp_rank", "layers",
         "heads", "kv_heads", "vocab", "params", "weights", "grads", "adam", "act/micro", "in-flt", "work", "total");
  double most = 0;  // the fullest rank's total
  double host_max = 0;  // pinned host memory of the rank that needs most
  for (int pr = 0; pr < pp; pr++) {
    for (int tr = 0; tr < tp; tr++) {
      const plan_mem r = plan_rank_mem(c, pr, tr);
      const model_dims *dm = &r.dm;
      if (r.host > host_max) host_max = r.host;
      char heads[32], kv[32], vocab[32];
      snprintf(heads, sizeof heads, "%d-%d", tr * dm->nh, (tr + 1) * dm->nh - 1);
      snprintf(kv, sizeof kv, "%d-%d", tr * dm->nkv, (tr + 1) * dm->nkv - 1);
      snprintf(vocab, sizeof vocab, "%d-%d", dm->v0, dm->v0 + dm->vocab - 1);
      printf("  %-8d %-8d %-22s %-12s %-12s %-14s %8.1fM %7.2fG %7.2fG %7.2fG %8.2fG %8d %7.2fG %8.2fG\n", pr, tr,
             r.layers, heads, kv, vocab, r.n / 1e6, gib(r.w), gib(r.gr), gib(r.adam), gib(r.act), r.in_flight,
             gib(r.work), gib(plan_total(&r)));
      if (plan_total(&r) > most) most = plan_total(&r);
    }
  }
  printf("(GiB; act/micro: activations of one micro-batch in one chunk; in-flt: most micro-batch chunks whose "
         "backward has not run yet; work: the layers' gradient and tp buffers%s; dp replicas hold the same as dp "
         "rank 0%s)\n", plan_tp_peer(c) ? " and the tp peer copies' staging" : "",
         !ml.fp8.enabled ? "" : ml.fp8.head ? "; weights include the FP8 copies of the block projections and of the "
                          "LM head, transposed copies and the FP8 cast buffers"
                          : "; weights include the FP8 copies of the block projections, transposed copies and the "
                          "FP8 cast buffers");
  if (gpu)
    printf("expected peak on the fullest rank: %.2f GiB, the table's %.2f and about %.1f GiB for the runtime (CUDA "
           "context, cuBLAS and cuDNN workspaces, NCCL buffers; an estimate fitted to measured runs)\n",
           gib(most) + plan_runtime_gib(c), gib(most), plan_runtime_gib(c));
  plan_print_shard_modes(c, launch ? launch->gpu_mem_gib : 0);
  if (c->optim.offload) {  // the table is device memory; the offloaded state is here
    int rpn = launch && launch->gpus_per_node < world_size ? launch->gpus_per_node : world_size;
    const char *spread = dp == 1                              ? ""
                         : c->optim.shard >= OPT_SHARD_OPTIMIZER ? ", sharded over dp"
                                                          : ", whole on each dp rank";
    printf("offload: the master weights and moments of offload_fraction %g of the buckets%s, in pinned host memory "
           "(offload_update=%s): up to %.2f GiB per rank, up to %.2f GiB per node of %d ranks; the table above is "
           "device memory\n", (double)c->optim.offload_fraction, spread,
           cfg_offload_update_names[c->optimizer.offload_update], gib(host_max), gib(host_max * rpn), rpn);
  }
  if (launch) plan_print_launch(c, world_size, launch);
  return 0;
}
