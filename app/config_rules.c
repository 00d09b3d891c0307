// The rules between keys (cfg_validate: cross-field checks, the layout for a world size, FP8's
// dimensions) and what the other modules get from a config (the model's layout, the
// micro-batch count). The key table, the YAML reader and the dump are in config.c.
#include "app/config.h"
#include "kernels/base/check.h"

#include <stdio.h>
#include <string.h>

// parallel.grad_compress and grad_error_feedback into the optimizer's config.
static void cfg_resolve_compress(cfg *c) {
  static const comm_compress_mode modes[] = {
      [CFG_GRAD_COMPRESS_NONE] = COMM_COMPRESS_NONE, [CFG_GRAD_COMPRESS_BF16] = COMM_COMPRESS_BF16,
      [CFG_GRAD_COMPRESS_FP16] = COMM_COMPRESS_FP16, [CFG_GRAD_COMPRESS_INT8] = COMM_COMPRESS_INT8};
  const cfg_parallel *p = &c->parallel;
  const comm_compress_mode m = c->optim.grad_compress = modes[p->grad_compress];
  const cfg_error_feedback fb = p->grad_error_feedback;
  const int int8 = m == COMM_COMPRESS_INT8;
  c->optim.grad_error_feedback =
      m != COMM_COMPRESS_NONE && (fb == CFG_ERROR_FEEDBACK_ON || (fb == CFG_ERROR_FEEDBACK_AUTO && int8));
}

void cfg_resolve_shard(cfg *c) {
  static const opt_shard shards[] = {[CFG_SHARD_NONE] = OPT_SHARD_NONE, [CFG_SHARD_OPTIMIZER] = OPT_SHARD_OPTIMIZER,
                                     [CFG_SHARD_GRADS] = OPT_SHARD_GRADS, [CFG_SHARD_WEIGHTS] = OPT_SHARD_WEIGHTS};
  c->optim.shard = shards[c->parallel.shard];
  c->optim.shard_prefetch = c->parallel.shard_prefetch;
  c->optim.gather_copy_engine = c->parallel.gather_copy_engine;
  c->optim.reshard_after_forward = c->parallel.reshard_after_forward;
}

// The optimizer's state: what is sharded over dp and where it lives (the optimizer section's
// choices), resolved into c->optim.
static int cfg_validate_offload(cfg *c, char *err, size_t n_err) {
  const cfg_optimizer *s = &c->optimizer;
  opt_config *o = &c->optim;
  o->offload = s->offload == CFG_OFFLOAD_HOST;
  cfg_resolve_shard(c);
  o->offload_cpu = s->offload_update == CFG_OFFLOAD_UPDATE_CPU;
  if (o->offload_delay && !(o->offload && o->offload_cpu))
    return check_errf(err, n_err, "optimizer.offload_delay = 1 delays the host update of the cpu engine: it needs "
                      "optimizer.offload=host and optimizer.offload_update=cpu (found offload=%s, offload_update=%s); "
                      "set offload_delay=0 or both", cfg_offload_names[s->offload],
                      cfg_offload_update_names[s->offload_update]);
  return 0;
}

// fp8.param_gather: the FP8 codes of one scale per tensor, gathered by the distributed optimizer.
static int cfg_validate_param_gather(const cfg *c, char *err, size_t n_err) {
  if (!c->optim.fp8_param_gather) return 0;
  if (c->train.precision != CFG_PRECISION_FP8)
    return check_errf(err, n_err, "fp8.param_gather = true gathers FP8 weights, but train.precision = %s: set "
                      "train.precision=fp8 or fp8.param_gather=false", cfg_precision_names[c->train.precision]);
  if (c->fp8.recipe == CFG_FP8_RECIPE_BLOCK)
    return check_errf(err, n_err, "fp8.param_gather = true gathers codes of one scale per tensor, but fp8.recipe = "
                      "block scales 128 x 128 tiles: set fp8.recipe to delayed or current, or fp8.param_gather=false");
  if (c->optim.shard == OPT_SHARD_NONE)
    return check_errf(err, n_err, "fp8.param_gather = true replaces the sharded optimizer's all-gather of the "
                      "updated weights, but parallel.shard = none: set parallel.shard=optimizer or "
                      "fp8.param_gather=false");
  return 0;
}

// parallel.shard=grads reduces each group's fp32 gradients from its staging slot as backward ends
// it; weights gathers each group's compute copy, in the act dtype, into a slot.
static int cfg_validate_shard(const cfg *c, char *err, size_t n_err) {
  const char *mode = cfg_shard_names[c->parallel.shard];
  const comm_compress_mode gc = c->optim.grad_compress;
  if (c->optim.shard >= OPT_SHARD_GRADS && gc != COMM_COMPRESS_NONE && gc != COMM_COMPRESS_BF16)
    return check_errf(err, n_err, "parallel.shard = %s reduces each layer's gradients as backward finishes them, in "
                      "fp32 or bf16, not in parallel.grad_compress = %s: set parallel.grad_compress=bf16 or none, or "
                      "parallel.shard=optimizer", mode, cfg_grad_compress_names[c->parallel.grad_compress]);
  if (c->optim.shard >= OPT_SHARD_GRADS && gc == COMM_COMPRESS_BF16 && c->optim.grad_error_feedback)
    return check_errf(err, n_err, "parallel.shard = %s reduces each layer's gradients in bf16 without error feedback "
                      "(it keeps no whole gradient to carry it in): set parallel.grad_error_feedback=auto or off, or "
                      "parallel.shard=optimizer", mode);
  const int group = c->parallel.shard_group;
  if (group > 0 && c->optim.shard == OPT_SHARD_NONE)
    return check_errf(err, n_err, "parallel.shard_group = %d shares out sharded state, but parallel.shard = none: set "
                      "parallel.shard (optimizer, grads or weights), or parallel.shard_group=0", group);
  if (c->optim.shard >= OPT_SHARD_WEIGHTS && !c->parallel.reshard_after_forward &&
      (c->train.precision == CFG_PRECISION_FP8 || c->parallel.gather_copy_engine))
    return check_errf(err, n_err, "parallel.reshard_after_forward = false keeps a slot per layer, which %s does not "
                      "serve yet: set parallel.reshard_after_forward=true, or %s",
                      c->parallel.gather_copy_engine ? "parallel.gather_copy_engine (a communicator per slot)"
                                                     : "FP8 (a bank of copies per slot)",
                      c->parallel.gather_copy_engine ? "parallel.gather_copy_engine=false" : "train.precision=bf16");
  if (c->optim.shard >= OPT_SHARD_WEIGHTS && c->optim.fp8_param_gather)
    return check_errf(err, n_err, "parallel.shard = weights gathers each layer's bf16 weights when it computes and "
                      "casts them to FP8 there, so fp8.param_gather has no all-gather to replace: set "
                      "fp8.param_gather=false, or parallel.shard=grads");
  return 0;
}

int cfg_validate(cfg *c, int world_size, char *err, size_t n_err) {
  const model_config *m = &c->model;
  cfg_parallel *p = &c->parallel;
  const cfg_train *t = &c->train;
  const opt_config *o = &c->optim;
  if (err && n_err) err[0] = '\0';
#define CFG_RULE(cond, ...) \
  if (!(cond)) return check_errf(err, n_err, __VA_ARGS__)

  // A struct filled by code rather than cfg_load may hold anything; the rules below divide
  // by these values, so the table's ranges are checked again first.
  if (cfg_check_ranges(c, err, n_err) != 0) return -1;

  CFG_RULE(m->n_heads % m->n_kv_heads == 0,
           "model.n_heads = %d is not divisible by model.n_kv_heads = %d: set n_kv_heads to a divisor of n_heads",
           m->n_heads, m->n_kv_heads);
  CFG_RULE(m->dim % m->n_heads == 0,
           "model.dim = %d is not divisible by model.n_heads = %d: make dim a multiple of n_heads", m->dim,
           m->n_heads);
  CFG_RULE((m->dim / m->n_heads) % 2 == 0,
           "head dimension model.dim / model.n_heads = %d / %d = %d is odd; rotary embeddings need it even: "
           "change model.dim or model.n_heads",
           m->dim, m->n_heads, m->dim / m->n_heads);
  CFG_RULE(t->micro_batch <= t->global_batch,
           "train.micro_batch = %d is larger than train.global_batch = %d: lower micro_batch or raise global_batch",
           t->micro_batch, t->global_batch);
  CFG_RULE(o->min_lr <= o->lr, "train.min_lr = %.9g is larger than train.lr = %.9g: set min_lr <= lr",
           (double)o->min_lr, (double)o->lr);
  CFG_RULE(o->warmup_steps <= t->steps,
           "train.warmup_steps = %d is larger than train.steps = %d: set warmup_steps <= steps", o->warmup_steps,
           t->steps);
  // The choice keys hold one of their words (cfg_load, cfg_check_ranges above).
  cfg_resolve_compress(c);
  c->optim.check_update = t->skip_nonfinite > 0;
  CFG_RULE(t->device != CFG_DEVICE_CPU || (t->precision != CFG_PRECISION_TF32 && t->precision != CFG_PRECISION_BF16),
           "train.precision = %s with train.device = cpu: CPU ranks compute in fp32; set train.precision=fp32 (or "
           "auto), or train.device=cuda", cfg_precision_names[t->precision]);
  CFG_RULE(c->checkpoint.resume[0] != '\0',
           "checkpoint.resume is empty: set it to none, auto, or the path of a checkpoint file");
  const char *from = c->checkpoint.init_from;
  CFG_RULE(!from[0] || (strncmp(from, "hf:", 3) == 0 && from[3]),
           "checkpoint.init_from = '%s': expected hf:DIR (a Hugging Face Llama model directory) or empty", from);
  if (cfg_validate_offload(c, err, n_err) != 0) return -1;
  if (cfg_validate_param_gather(c, err, n_err) != 0) return -1;
  if (cfg_validate_shard(c, err, n_err) != 0) return -1;
  if (world_size <= 0) return 0;

  // Products in long long: each factor is bounded by the table, their product is not by int.
  long long tp = p->tp, pp = p->pp, model_par = tp * pp;
  if (p->dp == 0) {
    CFG_RULE(world_size % model_par == 0,
             "world size %d is not divisible by parallel.tp * parallel.pp = %lld: launch a multiple of %lld ranks "
             "or change tp/pp",
             world_size, model_par, model_par);
    p->dp = (int)(world_size / model_par);
  }
  long long dp = p->dp;
  if (model_par * dp != world_size) {
    // Name the rank count the config is laid out for, and the override that adapts it to these ranks.
    char fit[256];
    if (world_size % model_par == 0)
      snprintf(fit, sizeof fit, "to run it on %d, add the override parallel.dp=0 (dp = %d / (tp * pp) = %lld)",
               world_size, world_size, world_size / model_par);
    else
      snprintf(fit, sizeof fit, "%d ranks do not divide into tp * pp = %lld: launch a multiple of %lld, or change "
               "parallel.tp / parallel.pp and add parallel.dp=0", world_size, model_par, model_par);
    return check_errf(err, n_err,
                    "parallel.tp * parallel.pp * parallel.dp = %d * %d * %d = %lld does not match the world size %d: "
                    "%s is laid out for %lld ranks (mpirun -np %lld); %s",
                    p->tp, p->pp, p->dp, model_par * dp, world_size, c->path[0] ? c->path : "the config",
                    model_par * dp, model_par * dp, fit);
  }
  CFG_RULE(p->shard_group == 0 || p->dp % p->shard_group == 0,
           "parallel.shard_group = %d does not divide parallel.dp = %d: set a divisor of dp (the dp ranks of a node), "
           "or 0 for all of dp", p->shard_group, p->dp);
  CFG_RULE(p->shard_group == 0 || p->shard_group == p->dp || c->optim.grad_compress == COMM_COMPRESS_NONE,
           "parallel.shard_group = %d (of dp %d) cannot compress the gradients yet (parallel.grad_compress = %s): set "
           "parallel.grad_compress=none or parallel.shard_group=0", p->shard_group, p->dp,
           cfg_grad_compress_names[p->grad_compress]);
  CFG_RULE(m->n_heads % p->tp == 0 && m->n_kv_heads % p->tp == 0,
           "model.n_heads = %d and model.n_kv_heads = %d must both be divisible by parallel.tp = %d: "
           "lower tp or change the head counts",
           m->n_heads, m->n_kv_heads, p->tp);
  CFG_RULE(m->ffn_dim % p->tp == 0, "model.ffn_dim = %d is not divisible by parallel.tp = %d: make ffn_dim a multiple of tp",
           m->ffn_dim, p->tp);
  CFG_RULE(m->vocab_size % p->tp == 0,
           "model.vocab_size = %d is not divisible by parallel.tp = %d: pad vocab_size to a multiple of tp",
           m->vocab_size, p->tp);
  int n_vstages = p->pp * p->vpp, last = p->last_stage_layers;
  CFG_RULE(last > 0 || m->n_layers % n_vstages == 0,
           "model.n_layers = %d is not divisible by parallel.pp * parallel.vpp = %d * %d = %d: "
           "change n_layers, pp or vpp (or give the last stage its own count with parallel.last_stage_layers)",
           m->n_layers, p->pp, p->vpp, n_vstages);
  CFG_RULE(last == 0 || n_vstages > 1,
           "parallel.last_stage_layers = %d needs a pipeline (parallel.pp * parallel.vpp > 1): set it to 0", last);
  CFG_RULE(last == 0 || n_vstages == 1 || (last < m->n_layers && (m->n_layers - last) % (n_vstages - 1) == 0),
           "parallel.last_stage_layers = %d: the other %d pipeline stages must split the remaining %d of model.n_layers "
           "= %d evenly (and at least one layer each): pick a count that leaves a multiple of %d, or 0 for an even split",
           last, n_vstages - 1, m->n_layers - last, m->n_layers, n_vstages - 1);
  CFG_RULE(p->vpp == 1 || p->pp > 1,
           "parallel.vpp = %d needs parallel.pp > 1 (virtual chunks interleave pipeline stages): set vpp=1", p->vpp);
  CFG_RULE(!p->sequence_parallel || p->tp > 1,
           "parallel.sequence_parallel needs parallel.tp > 1: set sequence_parallel=false or raise tp");
  CFG_RULE(!p->sequence_parallel || m->seq_len % p->tp == 0,
           "parallel.sequence_parallel splits model.seq_len = %d over parallel.tp = %d, which does not divide it: "
           "make seq_len a multiple of tp",
           m->seq_len, p->tp);
  CFG_RULE(t->global_batch % (dp * t->micro_batch) == 0,
           "train.global_batch = %d is not divisible by parallel.dp * train.micro_batch = %d * %d = %lld: "
           "make global_batch a multiple of it (micro-batches per step = global_batch / (dp * micro_batch))",
           t->global_batch, p->dp, t->micro_batch, dp * t->micro_batch);
  CFG_RULE(!m->tie_embeddings || p->pp == 1,
           "model.tie_embeddings with parallel.pp = %d is not supported (embedding and LM head sit on different "
           "stages): set model.tie_embeddings=false",
           p->pp);
  if (t->precision == CFG_PRECISION_FP8) {
    // FP8 GEMMs take dimensions that are multiples of 16 only: each projection's local sizes
    // and the rows of a micro-batch (of a sequence shard with SP, whose GEMMs run per shard).
    long long hd = m->dim / m->n_heads, rows = (long long)m->seq_len * t->micro_batch;
    struct { const char *what; long long n; } dims[] = {
        {"model.dim", m->dim},
        {"model.n_heads * head dim / parallel.tp (the attention output projection's input)", m->n_heads * hd / tp},
        {"model.n_kv_heads * head dim / parallel.tp (each of k and v)", m->n_kv_heads * hd / tp},
        {"model.ffn_dim / parallel.tp", m->ffn_dim / tp},
        {"model.seq_len * train.micro_batch (rows of a micro-batch)", rows},
        {"model.seq_len * train.micro_batch / parallel.tp (rows of a sequence shard)", p->sequence_parallel ? rows / tp : 16},
        {"model.vocab_size / parallel.tp (the LM head's rows, fp8.head)", c->fp8.head ? m->vocab_size / tp : 16},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
      CFG_RULE(dims[i].n % 16 == 0,
               "train.precision=fp8: %s = %lld is not a multiple of 16, which FP8 GEMMs need: the nearest legal "
               "value is %lld", dims[i].what, dims[i].n, dims[i].n < 16 ? 16 : (dims[i].n + 8) / 16 * 16);
  }
#undef CFG_RULE
  return 0;
}

// The choices the model's layout holds, in the model's own enums: this is the one mapping.
model_layout cfg_model_layout(const cfg *c) {
  static const model_recompute recomputes[] = {[CFG_RECOMPUTE_NONE] = MODEL_RECOMPUTE_NONE,
                                               [CFG_RECOMPUTE_SELECTIVE] = MODEL_RECOMPUTE_SELECTIVE,
                                               [CFG_RECOMPUTE_FULL] = MODEL_RECOMPUTE_FULL};
  static const model_fp8_recipe recipes[] = {[CFG_FP8_RECIPE_DELAYED] = MODEL_FP8_DELAYED,
                                             [CFG_FP8_RECIPE_CURRENT] = MODEL_FP8_CURRENT,
                                             [CFG_FP8_RECIPE_BLOCK] = MODEL_FP8_BLOCK};
  static const model_tp_reduce tp_reduces[] = {[CFG_TP_REDUCE_AUTO] = MODEL_TP_REDUCE_ACT,
                                               [CFG_TP_REDUCE_FP32] = MODEL_TP_REDUCE_FP32,
                                               [CFG_TP_REDUCE_BF16] = MODEL_TP_REDUCE_BF16};
  return (model_layout){
      .pp = c->parallel.pp,
      .vpp = c->parallel.vpp,
      .last_stage_layers = c->parallel.last_stage_layers,
      .sequence_parallel = c->parallel.sequence_parallel,
      .tp_reduce = tp_reduces[c->parallel.tp_reduce_dtype],
      .micro_batch = c->train.micro_batch,
      .recompute = recomputes[c->train.recompute],
      // With the optimizer's state sharded the optimizer holds the master weights (its part only); with
      // dp 1 its part is all of it, held by the model as without sharding.
      .master_in_optimizer = c->optim.offload || (c->optim.shard >= OPT_SHARD_OPTIMIZER && c->parallel.dp > 1),
      // With the gradients sharded the optimizer holds them too: a staging slot per layer in backward.
      .grads_in_optimizer = c->optim.shard >= OPT_SHARD_GRADS && c->parallel.dp > 1,
      // And with the weights sharded the compute copy: gathered into a slot per group for compute.
      .weights_in_optimizer = c->optim.shard >= OPT_SHARD_WEIGHTS && c->parallel.dp > 1,
      .fp8 = {
          .enabled = c->train.precision == CFG_PRECISION_FP8,
          .recipe = recipes[c->fp8.recipe],
          .amax_history = c->fp8.amax_history,
          .amax_max = c->fp8.amax_compute == CFG_AMAX_COMPUTE_MAX,
          .margin = c->fp8.margin,
          .hybrid = c->fp8.format == CFG_FP8_FORMAT_HYBRID,
          .fast_accum = c->fp8.fast_accum,
          .edge_layers_bf16 = c->fp8.bf16_edge_layers,
          .head = c->fp8.head,
      },
  };
}

int cfg_n_micro(const cfg *c) { return c->train.global_batch / (c->parallel.dp * c->train.micro_batch); }

int cfg_act_bf16(const cfg *c) {
  const cfg_precision p = c->train.precision;
  return p == CFG_PRECISION_AUTO || p == CFG_PRECISION_BF16 || p == CFG_PRECISION_FP8;
}
