// Tests of the config module: defaults, YAML files, overrides, every error message (file:line,
// key, fix), every cfg_validate rule, the cfg_to_yaml round trip, and that configs/*.yaml and
// docs/config.md agree with the key table.
#include "app/config.h"
#include "tests/unit/test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp_dir[64];
static char tmp_paths[64][128];
static int n_tmp_paths;

static const char *write_file(const char *name, const char *text) {
  char *path = tmp_paths[n_tmp_paths++];
  snprintf(path, sizeof tmp_paths[0], "%s/%s", tmp_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

static int has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

// Loads text from a temporary file; returns cfg_load's result with its message in err.
static int load_text(cfg *c, const char *name, const char *text, int n_ov, char **ov, char *err, size_t n_err) {
  return cfg_load(c, write_file(name, text), n_ov, ov, err, n_err);
}

static void test_defaults(void) {
  cfg c;
  char err[512];
  EXPECT(cfg_load(&c, NULL, 0, NULL, err, sizeof err) == 0, "%s", err);
  EXPECT(c.model.dim == 256 && c.model.n_layers == 4 && c.model.n_heads == 8 && c.model.n_kv_heads == 4, "model");
  EXPECT(c.model.ffn_dim == 768 && c.model.vocab_size == 256 && c.model.seq_len == 128, "model sizes");
  EXPECT(c.model.norm_eps == 1e-5f && c.model.rope_theta == 10000.0f && c.model.init_std == 0.02f, "model floats");
  EXPECT(c.model.tie_embeddings == 0, "tie");
  EXPECT(c.parallel.tp == 1 && c.parallel.pp == 1 && c.parallel.dp == 0 && c.parallel.vpp == 1, "layout");
  EXPECT(!c.parallel.sequence_parallel && c.parallel.shard == CFG_SHARD_NONE && c.optim.bucket_mb == 100, "par");
  EXPECT(c.train.steps == 300 && c.train.global_batch == 32 && c.train.micro_batch == 8, "train ints");
  EXPECT(c.optim.lr == 3e-3f && c.optim.min_lr == 3e-4f && c.optim.warmup_steps == 30, "schedule");
  EXPECT(c.optim.weight_decay == 0.1f && c.optim.beta1 == 0.9f && c.optim.beta2 == 0.95f, "adamw");
  EXPECT(c.optim.eps == 1e-8f && c.optim.grad_clip == 1.0f && c.train.seed == 1234, "eps clip seed");
  EXPECT(c.train.device == CFG_DEVICE_AUTO && c.train.recompute == CFG_RECOMPUTE_NONE, "choices");
  EXPECT(c.train.precision == CFG_PRECISION_AUTO && c.fp8.recipe == CFG_FP8_RECIPE_DELAYED &&
         c.optimizer.offload_update == CFG_OFFLOAD_UPDATE_CPU && c.parallel.gpu_comm == CFG_GPU_COMM_NCCL, "choices");
  EXPECT(!strcmp(c.data.train, "data/corpus/train_*.bin") && !strcmp(c.data.val, "data/corpus/val_*.bin"), "data");
  EXPECT(!strcmp(c.checkpoint.dir, "runs/default/ckpt") && c.checkpoint.every == 100, "ckpt");
  EXPECT(!strcmp(c.checkpoint.resume, "none") && c.checkpoint.keep == 3, "resume keep");
  EXPECT(c.log.every == 10 && !strcmp(c.log.metrics, "runs/default/metrics.jsonl"), "log");
  EXPECT(c.log.eval_every == 50 && c.log.eval_batches == 8, "eval");
  EXPECT(c.path[0] == '\0', "path '%s'", c.path);
  EXPECT(cfg_validate(&c, 0, err, sizeof err) == 0, "%s", err);
  EXPECT(cfg_validate(&c, 2, err, sizeof err) == 0 && c.parallel.dp == 2, "dp %d: %s", c.parallel.dp, err);
}

static void test_file_and_overrides(void) {
  cfg c;
  char err[512];
  const char *yaml =
      "# a comment\n"
      "model:\n"
      "  dim: 64          # width\n"
      "  norm_eps: 1e-6\n"
      "  tie_embeddings: yes\n"
      "parallel:\n"
      "  sequence_parallel: On\n"
      "  pp_overlap: 0\n"
      "train:\n"
      "  seed: 18446744073709551615\n"
      "  device: 'cpu'\n"
      "  lr: .5\n"
      "checkpoint:\n"
      "  dir: null\n"
      "  resume: \"null\"\n"
      "log:\n"
      "data: ~\n";
  int rc = load_text(&c, "file.yaml", yaml, 0, NULL, err, sizeof err);
  EXPECT(rc == 0, "%s", err);
  EXPECT(c.model.dim == 64 && c.model.norm_eps == 1e-6f && c.model.tie_embeddings == 1, "model");
  EXPECT(c.parallel.sequence_parallel == 1 && c.parallel.pp_overlap == 0, "bools");
  EXPECT(c.train.seed == UINT64_MAX && c.train.device == CFG_DEVICE_CPU && c.optim.lr == 0.5f, "train");
  EXPECT(c.checkpoint.dir[0] == '\0', "plain null is an empty string, got '%s'", c.checkpoint.dir);
  EXPECT(!strcmp(c.checkpoint.resume, "null"), "quoted null stays a string, got '%s'", c.checkpoint.resume);
  EXPECT(c.model.n_layers == 4 && c.train.steps == 300, "unset keys keep defaults");
  EXPECT(has(c.path, "file.yaml"), "path '%s'", c.path);

  char *ov[] = {"model.dim=128", "train.device=cuda", "model.tie_embeddings=off", "data.val=", "train.seed=7"};
  rc = load_text(&c, "file2.yaml", yaml, 5, ov, err, sizeof err);
  EXPECT(rc == 0, "%s", err);
  EXPECT(c.model.dim == 128 && c.train.device == CFG_DEVICE_CUDA && c.model.tie_embeddings == 0, "overrides win");
  EXPECT(c.data.val[0] == '\0' && c.train.seed == 7, "override empty string and seed");
  char *ov2[] = {"model.dim=32", "model.dim=96"};
  EXPECT(cfg_load(&c, NULL, 2, ov2, err, sizeof err) == 0 && c.model.dim == 96, "last override wins");

  EXPECT(load_text(&c, "empty.yaml", "", 0, NULL, err, sizeof err) == 0 && c.model.dim == 256, "empty: %s", err);
  EXPECT(load_text(&c, "comments.yaml", "# nothing\n---\n", 0, NULL, err, sizeof err) == 0, "%s", err);
  EXPECT(cfg_load_string(&c, "train: {steps: 5, lr: 0.01}\n", "inline", err, sizeof err) == 0 && c.train.steps == 5,
         "flow mapping: %s", err);
}

// Expects a load failure whose message holds each of the given substrings.
static void expect_load_error(const char *name, const char *yaml, int n_ov, char **ov, const char *const *subs,
                              int n_subs) {
  cfg c;
  char err[512] = "";
  int rc = yaml ? load_text(&c, name, yaml, n_ov, ov, err, sizeof err) : cfg_load(&c, NULL, n_ov, ov, err, sizeof err);
  EXPECT(rc == -1, "%s: load should fail", name);
  for (int i = 0; i < n_subs; i++) EXPECT(has(err, subs[i]), "%s: message '%s' lacks '%s'", name, err, subs[i]);
}
#define LOAD_ERR(name, yaml, n_ov, ov, ...)                                                     \
  do {                                                                                          \
    const char *const subs_[] = {__VA_ARGS__};                                                  \
    expect_load_error(name, yaml, n_ov, ov, subs_, (int)(sizeof subs_ / sizeof subs_[0]));      \
  } while (0)

static void test_load_errors(void) {
  LOAD_ERR("unknown_key.yaml", "model:\n  dim: 64\n  dimm: 3\n", 0, NULL, "unknown_key.yaml:3:", "'model.dimm'",
           "did you mean 'model.dim'?", "keys of model: dim, n_layers");
  LOAD_ERR("wrong_section.yaml", "train:\n  dim: 64\n", 0, NULL, "wrong_section.yaml:2:", "'train.dim'",
           "did you mean 'model.dim'?");
  LOAD_ERR("unknown_section.yaml", "model:\n  dim: 64\nmodle:\n  dim: 3\n", 0, NULL, "unknown_section.yaml:3:",
           "unknown section 'modle'", "did you mean 'model'?");
  LOAD_ERR("type_int.yaml", "model:\n  n_layers: 2\n  dim: abc\n", 0, NULL, "type_int.yaml:3:",
           "model.dim: expected an integer, found 'abc'");
  LOAD_ERR("type_int2.yaml", "model:\n  dim: 3.5\n", 0, NULL, "model.dim: expected an integer, found '3.5'");
  LOAD_ERR("type_float.yaml", "train:\n  lr: fast\n", 0, NULL, "type_float.yaml:2:", "train.lr: expected a number");
  LOAD_ERR("type_bool.yaml", "model:\n  tie_embeddings: maybe\n", 0, NULL, "type_bool.yaml:2:",
           "model.tie_embeddings: expected a boolean");
  LOAD_ERR("type_u64.yaml", "train:\n  seed: -1\n", 0, NULL, "train.seed: expected an unsigned 64-bit integer");
  LOAD_ERR("type_u64b.yaml", "train:\n  seed: 18446744073709551616\n", 0, NULL, "train.seed");
  LOAD_ERR("nested.yaml", "model:\n  dim:\n    a: 1\n", 0, NULL, "nested.yaml:3:", "model.dim", "found a mapping");
  LOAD_ERR("list.yaml", "model:\n  dim: [1, 2]\n", 0, NULL, "list.yaml:2:", "model.dim", "found a list");
  LOAD_ERR("range.yaml", "\nmodel:\n  dim: 0\n", 0, NULL, "range.yaml:3:", "model.dim = 0 is out of range [1, 1048576]");
  LOAD_ERR("range_f.yaml", "train:\n  beta2: 1.5\n", 0, NULL, "train.beta2 = 1.5 is out of range");
  LOAD_ERR("range_big.yaml", "model:\n  dim: 99999999999999999999\n", 0, NULL, "model.dim", "out of range");
  LOAD_ERR("dup.yaml", "model:\n  dim: 64\n  dim: 32\n", 0, NULL, "dup.yaml:3:", "model.dim is set twice",
           "(lines 2 and 3)");
  LOAD_ERR("dup_flow.yaml", "model: {dim: 64,\n  dim: 32}\n", 0, NULL, "dup_flow.yaml:2:", "model.dim is set twice",
           "(lines 1 and 2)");
  LOAD_ERR("dup_quoted.yaml", "model:\n  dim: 64\n  \"dim\": 32\n", 0, NULL, "dup_quoted.yaml:3:",
           "model.dim is set twice");
  // Anchors, aliases and tags are refused at their line, wherever they are.
  LOAD_ERR("anchor.yaml", "model:\n  dim: &w 64\n  ffn_dim: *w\n", 0, NULL, "anchor.yaml:2:",
           "YAML anchor '&w' is not supported");
  LOAD_ERR("alias.yaml", "model:\n  dim: 64\ntrain:\n  steps: *w\n", 0, NULL, "alias.yaml:4:",
           "YAML alias '*w' is not supported");
  LOAD_ERR("anchor_section.yaml", "model: &m\n  dim: 64\n", 0, NULL, "anchor_section.yaml:1:",
           "YAML anchor '&m' is not supported");
  LOAD_ERR("merge.yaml", "model: &m {dim: 64}\ntrain:\n  <<: *m\n", 0, NULL, "merge.yaml:1:", "YAML anchor '&m'");
  LOAD_ERR("tag.yaml", "model:\n  n_layers: 2\n  dim: !!int 64\n", 0, NULL, "tag.yaml:3:",
           "YAML tag 'tag:yaml.org,2002:int' is not supported");
  LOAD_ERR("tag_local.yaml", "data: !paths\n  train: a.bin\n", 0, NULL, "tag_local.yaml:1:", "YAML tag '!paths'");
  char *not_utf8[] = {"data.train=a\xff.bin"};
  LOAD_ERR("not_utf8", "", 1, not_utf8, "override 'data.train=a", "data.train: byte 1 (0xff) is not UTF-8 text");
  LOAD_ERR("newline.yaml", "model:\n  dim: \"6\\n4\"\n", 0, NULL, "newline.yaml:2:", "found '6?4'");
  LOAD_ERR("tag_top.yaml", "--- !cfg\nmodel:\n  dim: 64\n", 0, NULL, "tag_top.yaml:1:", "YAML tag '!cfg'");
  LOAD_ERR("top.yaml", "- model\n", 0, NULL, "top.yaml:1:", "expected a mapping of sections");
  LOAD_ERR("flat.yaml", "model: 3\n", 0, NULL, "flat.yaml:1:", "section 'model' must be a mapping");
  LOAD_ERR("malformed.yaml", "model:\n  dim: 64\n  n_layers: 'abc\n", 0, NULL, "malformed.yaml:", "malformed YAML");
  LOAD_ERR("colon.yaml", "model:\n  dim: 64\n  n_layers: a: b\n", 0, NULL, "colon.yaml:3:", "malformed YAML",
           "mapping values are not allowed");
  LOAD_ERR("malformed2.yaml", "model:\n  dim: 64\n n_layers: 2\n", 0, NULL, "malformed2.yaml:3:", "malformed YAML");
  LOAD_ERR("tabs.yaml", "model:\n\tdim: 64\n", 0, NULL, "tabs.yaml:2:", "malformed YAML", "not tabs");
  LOAD_ERR("two_docs.yaml", "model:\n  dim: 64\n---\nmodel:\n  dim: 32\n", 0, NULL, "two_docs.yaml:3:",
           "second YAML document");
  char long_yaml[600];
  snprintf(long_yaml, sizeof long_yaml, "data:\n  train: %0300d\n", 1);
  LOAD_ERR("long.yaml", long_yaml, 0, NULL, "long.yaml:2:", "data.train", "limit is 255 bytes");

  cfg c;
  char err[512] = "";
  char missing[160];
  snprintf(missing, sizeof missing, "%s/missing.yaml", tmp_dir);
  EXPECT(cfg_load(&c, missing, 0, NULL, err, sizeof err) == -1, "missing file loads");
  EXPECT(has(err, missing) && has(err, ": cannot open config file: No such file or directory"), "'%s'", err);

  // Overrides name themselves instead of file:line.
  char *no_eq[] = {"model.dim"};
  LOAD_ERR("ov_no_eq", NULL, 1, no_eq, "override 'model.dim': expected section.key=value");
  char *no_dot[] = {"dim=64"};
  LOAD_ERR("ov_no_dot", NULL, 1, no_dot, "override 'dim=64': expected section.key=value",
           "did you mean 'model.dim'?");
  char *bad_key[] = {"model.dimm=3"};
  LOAD_ERR("ov_key", NULL, 1, bad_key, "override 'model.dimm=3': unknown key 'model.dimm'", "did you mean 'model.dim'?");
  // A replaced key names its successor, in a file and as an override.
  LOAD_ERR("replaced.yaml", "parallel:\n  grad_reduce_bf16: true\n", 0, NULL, "replaced.yaml:2:",
           "parallel.grad_reduce_bf16 was replaced", "parallel.grad_compress: bf16");
  // The config stored in an older checkpoint reads the old key as its successor.
  cfg old;
  char old_err[256] = "";
  EXPECT(cfg_load_string(&old, "parallel:\n  dp: 2\n  grad_reduce_bf16: true\n", "old.h5", old_err,
                         sizeof old_err) == 0 && old.parallel.grad_compress == CFG_GRAD_COMPRESS_BF16 && old.parallel.dp == 2,
         "stored grad_reduce_bf16: true reads as grad_compress bf16: %s", old_err);
  EXPECT(cfg_load_string(&old, "parallel:\n  grad_reduce_bf16: false", "old.h5", old_err, sizeof old_err) == 0 &&
             old.parallel.grad_compress == CFG_GRAD_COMPRESS_NONE,
         "stored grad_reduce_bf16: false reads as grad_compress none: %s", old_err);
  char *replaced[] = {"parallel.grad_reduce_bf16=true"};
  LOAD_ERR("ov_replaced", NULL, 1, replaced, "parallel.grad_reduce_bf16 was replaced", "parallel.grad_compress");
  LOAD_ERR("replaced_zero.yaml", "parallel:\n  distributed_optimizer: true\n", 0, NULL, "replaced_zero.yaml:2:",
           "parallel.distributed_optimizer was replaced", "parallel.shard: optimizer");
  EXPECT(cfg_load_string(&old, "parallel:\n  dp: 2\n  distributed_optimizer: true\n", "old.h5", old_err,
                         sizeof old_err) == 0 && old.parallel.shard == CFG_SHARD_OPTIMIZER && old.parallel.dp == 2,
         "stored distributed_optimizer: true reads as shard optimizer: %s", old_err);
  EXPECT(cfg_load_string(&old, "parallel:\n  distributed_optimizer: false", "old.h5", old_err, sizeof old_err) == 0 &&
             old.parallel.shard == CFG_SHARD_NONE,
         "stored distributed_optimizer: false reads as shard none: %s", old_err);
  char *bad_sec[] = {"modl.dim=3"};
  LOAD_ERR("ov_sec", NULL, 1, bad_sec, "override 'modl.dim=3': unknown section 'modl'");
  char *bad_type[] = {"train.steps=ten"};
  LOAD_ERR("ov_type", NULL, 1, bad_type, "override 'train.steps=ten': train.steps: expected an integer, found 'ten'");
  char *bad_range[] = {"model.dim=-4"};
  LOAD_ERR("ov_range", NULL, 1, bad_range, "override 'model.dim=-4': model.dim = -4 is out of range");
  char *ok_then_bad[] = {"model.dim=64", "model.dim="};
  LOAD_ERR("ov_empty", NULL, 2, ok_then_bad, "override 'model.dim=': model.dim: expected an integer, found ''");

  // A choice key takes one of its words, exactly (case included); the message lists them.
  char *choices[][2] = {
      {"train.device=gpu", "train.device = 'gpu' is not one of: auto, cpu, cuda"},
      {"train.recompute=some", "train.recompute = 'some' is not one of: none, selective, full"},
      {"train.precision=fp16", "train.precision = 'fp16' is not one of: auto, fp32, tf32, bf16, fp8"},
      {"train.attention=flash", "train.attention = 'flash' is not one of: cudnn, cudnn_atomic, own"},
      {"train.cpu_isa=neon", "train.cpu_isa = 'neon' is not one of: auto, avx512, avx2, sse"},
      {"fp8.recipe=tensorwise", "fp8.recipe = 'tensorwise' is not one of: delayed, current, block"},
      {"fp8.amax_compute=mean", "fp8.amax_compute = 'mean' is not one of: max, most_recent"},
      {"fp8.format=e5m2", "fp8.format = 'e5m2' is not one of: hybrid, e4m3"},
      {"optimizer.offload=gpu", "optimizer.offload = 'gpu' is not one of: none, host"},
      {"optimizer.offload_update=disk", "optimizer.offload_update = 'disk' is not one of: gpu, cpu"},
      {"parallel.gpu_comm=gloo", "parallel.gpu_comm = 'gloo' is not one of: nccl, mpi"},
      {"parallel.grad_compress=fp8", "parallel.grad_compress = 'fp8' is not one of: none, bf16, fp16, int8"},
      {"parallel.grad_error_feedback=yes", "parallel.grad_error_feedback = 'yes' is not one of: auto, on, off"},
      {"train.device=CPU", "train.device = 'CPU' is not one of"},
      {"train.device=", "train.device = '' is not one of"},
  };
  for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++)
    LOAD_ERR(choices[i][0], NULL, 1, choices[i], choices[i][1]);
  LOAD_ERR("choice.yaml", "train:\n  steps: 3\n  precision: fp16\n", 0, NULL, "choice.yaml:3:",
           "train.precision = 'fp16' is not one of: auto, fp32, tf32, bf16, fp8");
  // Quoted or not, in a file or an override, a word reads as its enum value.
  cfg c2;
  char *words[] = {"train.precision=fp8", "fp8.amax_compute=most_recent", "optimizer.offload=host"};
  EXPECT(load_text(&c2, "words.yaml", "train:\n  device: \"cpu\"\n  recompute: selective\n", 3, words, err,
                   sizeof err) == 0, "%s", err);
  EXPECT(c2.train.device == CFG_DEVICE_CPU && c2.train.recompute == CFG_RECOMPUTE_SELECTIVE &&
         c2.train.precision == CFG_PRECISION_FP8 && c2.fp8.amax_compute == CFG_AMAX_COMPUTE_MOST_RECENT &&
         c2.optimizer.offload == CFG_OFFLOAD_HOST, "choices as enums");
  EXPECT(cfg_find_choice(cfg_precision_names, "bf16") == CFG_PRECISION_BF16 &&
         cfg_find_choice(cfg_precision_names, "BF16") == -1, "cfg_find_choice");
  EXPECT(cfg_list_choices("fp8.format") == cfg_fp8_format_names && !cfg_list_choices("model.dim") &&
         !cfg_list_choices("train") && !cfg_list_choices("fp8.formats"), "cfg_list_choices");
}

// Expects cfg_validate to fail on c with a message holding each substring.
static void expect_invalid(const char *what, cfg *c, int world, const char *const *subs, int n_subs) {
  char err[512] = "";
  EXPECT(cfg_validate(c, world, err, sizeof err) == -1, "%s: validate should fail", what);
  for (int i = 0; i < n_subs; i++) EXPECT(has(err, subs[i]), "%s: message '%s' lacks '%s'", what, err, subs[i]);
}
// Loads defaults plus the overrides, then expects cfg_validate(world) to fail.
#define INVALID(world, overrides, ...)                                                         \
  do {                                                                                         \
    char *ov_[] = overrides;                                                                   \
    const char *const subs_[] = {__VA_ARGS__};                                                 \
    cfg c_;                                                                                    \
    char e_[512];                                                                              \
    int rc_ = cfg_load(&c_, NULL, (int)(sizeof ov_ / sizeof ov_[0]), ov_, e_, sizeof e_);      \
    EXPECT(rc_ == 0, "%s", e_);                                                                \
    expect_invalid(#overrides, &c_, world, subs_, (int)(sizeof subs_ / sizeof subs_[0]));      \
  } while (0)
#define OV(...) {__VA_ARGS__}

static int validates(int world, int n_ov, char **ov, cfg *out) {
  char err[512];
  if (cfg_load(out, NULL, n_ov, ov, err, sizeof err)) return fprintf(stderr, "%s\n", err), 0;
  if (cfg_validate(out, world, err, sizeof err)) return fprintf(stderr, "validate: %s\n", err), 0;
  return 1;
}

static void test_validate(void) {
  // Model and training rules, checked whatever the world size.
  INVALID(0, OV("model.n_kv_heads=3"), "model.n_heads = 8", "model.n_kv_heads = 3");
  INVALID(0, OV("model.dim=250"), "model.dim = 250", "model.n_heads = 8");
  INVALID(0, OV("model.dim=24"), "model.dim / model.n_heads", "= 3", "even");
  INVALID(0, OV("train.micro_batch=64"), "train.micro_batch = 64", "train.global_batch = 32");
  INVALID(0, OV("checkpoint.resume="), "checkpoint.resume", "none, auto");
  INVALID(0, OV("train.min_lr=0.01"), "train.min_lr", "train.lr");
  INVALID(0, OV("train.warmup_steps=301"), "train.warmup_steps = 301", "train.steps = 300");
  cfg c;
  char *resume_path[] = {"checkpoint.resume=runs/x/ckpt_00000100.h5", "train.recompute=full", "train.device=cpu"};
  EXPECT(validates(0, 3, resume_path, &c), "a checkpoint path, full and cpu are valid");

  // Layout rules.
  INVALID(6, OV("parallel.tp=2", "parallel.pp=2"), "world size 6 is not divisible by parallel.tp * parallel.pp = 4");
  INVALID(8, OV("parallel.tp=2", "parallel.dp=2"), "parallel.tp * parallel.pp * parallel.dp", "world size 8",
          "is laid out for 4 ranks (mpirun -np 4)", "add the override parallel.dp=0 (dp = 8 / (tp * pp) = 4)");
  INVALID(6, OV("parallel.tp=4", "parallel.dp=1"), "= 4 does not match the world size 6", "laid out for 4 ranks",
          "6 ranks do not divide into tp * pp = 4: launch a multiple of 4");
  INVALID(2, OV("parallel.tp=2", "model.n_kv_heads=1"), "model.n_heads = 8", "model.n_kv_heads = 1",
          "parallel.tp = 2");
  INVALID(16, OV("parallel.tp=16"), "model.n_heads = 8", "model.n_kv_heads = 4", "parallel.tp = 16");
  INVALID(2, OV("parallel.tp=2", "model.ffn_dim=769"), "model.ffn_dim = 769", "parallel.tp = 2");
  INVALID(2, OV("parallel.tp=2", "model.vocab_size=255"), "model.vocab_size = 255", "parallel.tp = 2");
  INVALID(3, OV("parallel.pp=3"), "model.n_layers = 4", "parallel.pp * parallel.vpp");
  INVALID(4, OV("parallel.pp=2", "parallel.vpp=4"), "model.n_layers = 4", "parallel.pp * parallel.vpp = 2 * 4");
  INVALID(2, OV("parallel.sequence_parallel=true"), "parallel.sequence_parallel", "parallel.tp > 1");
  INVALID(2, OV("parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=127"), "parallel.sequence_parallel",
          "model.seq_len = 127", "parallel.tp = 2");
  INVALID(3, OV("train.global_batch=32"), "train.global_batch = 32", "parallel.dp * train.micro_batch = 3 * 8");
  INVALID(1, OV("parallel.vpp=2"), "parallel.vpp = 2", "parallel.pp > 1");
  INVALID(2, OV("parallel.pp=2", "model.tie_embeddings=true"), "model.tie_embeddings", "parallel.pp = 2",
          "set model.tie_embeddings=false");
  // FP8 GEMMs take multiples of 16 only: the dimension and the nearest legal value.
  INVALID(2, OV("train.precision=fp8", "parallel.tp=2", "model.ffn_dim=824"), "model.ffn_dim / parallel.tp",
          "= 412 is not a multiple of 16", "nearest legal value is 416");
  INVALID(2, OV("train.precision=fp8", "parallel.tp=2", "model.ffn_dim=808"), "model.ffn_dim / parallel.tp",
          "= 404 is not a multiple of 16", "nearest legal value is 400");
  INVALID(1, OV("train.precision=fp8", "fp8.head=true", "model.vocab_size=1000"), "model.vocab_size / parallel.tp",
          "fp8.head", "= 1000 is not a multiple of 16", "nearest legal value is 1008");
  char *fp8_no_head[] = {"train.precision=fp8", "model.vocab_size=1000"};
  EXPECT(validates(1, 2, fp8_no_head, &c), "fp8 without fp8.head takes a vocabulary of 1000");
  // parallel.shard=grads reduces each layer in fp32 or bf16 (no error feedback): int8 and fp16 refused.
  INVALID(0, OV("parallel.shard=grads", "parallel.grad_compress=int8"), "parallel.shard = grads",
          "parallel.grad_compress = int8", "set parallel.grad_compress=bf16 or none, or parallel.shard=optimizer");
  INVALID(0, OV("parallel.shard=weights", "parallel.grad_compress=fp16"), "parallel.shard = weights",
          "parallel.grad_compress = fp16", "set parallel.grad_compress=bf16 or none");
  INVALID(0, OV("parallel.shard=weights", "parallel.reshard_after_forward=false", "train.precision=fp8"),
          "parallel.reshard_after_forward = false", "set parallel.reshard_after_forward=true, or train.precision=bf16");
  INVALID(0, OV("parallel.shard=grads", "parallel.grad_compress=bf16", "parallel.grad_error_feedback=on"),
          "parallel.shard = grads", "in bf16 without error feedback", "parallel.grad_error_feedback=auto or off");
  char *sgrads[] = {"parallel.shard=grads", "parallel.dp=2"};
  EXPECT(validates(2, 2, sgrads, &c) && c.optim.shard == OPT_SHARD_GRADS && cfg_model_layout(&c).grads_in_optimizer,
         "parallel.shard=grads on dp 2: the optimizer holds the gradients");
  // fp8.param_gather: FP8, per-tensor scales and the distributed optimizer; with dp 1 it has nothing to do.
  INVALID(0, OV("fp8.param_gather=true", "parallel.shard=optimizer"), "fp8.param_gather = true",
          "train.precision = auto", "set train.precision=fp8 or fp8.param_gather=false");
  INVALID(0, OV("fp8.param_gather=true", "parallel.shard=optimizer", "train.precision=fp8",
                "fp8.recipe=block"), "fp8.param_gather = true", "fp8.recipe = block",
          "set fp8.recipe to delayed or current, or fp8.param_gather=false");
  INVALID(0, OV("fp8.param_gather=true", "train.precision=fp8"), "fp8.param_gather = true",
          "parallel.shard = none", "set parallel.shard=optimizer or fp8.param_gather=false");
  char *pgather[] = {"train.precision=fp8", "fp8.recipe=current", "parallel.shard=optimizer",
                     "fp8.param_gather=true"};
  EXPECT(validates(2, 4, pgather, &c) && c.optim.fp8_param_gather, "fp8.param_gather with current scaling on dp 2");
  EXPECT(validates(1, 4, pgather, &c) && c.parallel.dp == 1, "fp8.param_gather with dp 1 (no effect)");
  // Rules with no world size are not layout rules.
  char *layout_only[] = {"parallel.tp=3", "parallel.vpp=2"};
  EXPECT(validates(0, 2, layout_only, &c), "world_size 0 skips layout rules");
  // Valid layouts: dp inferred, distributed optimizer with dp 1 is allowed (a no-op).
  char *tp_sp[] = {"parallel.tp=2", "parallel.sequence_parallel=true"};
  EXPECT(validates(4, 2, tp_sp, &c) && c.parallel.dp == 2, "tp 2 sp on 4 ranks: dp %d", c.parallel.dp);
  char *pp_vpp[] = {"parallel.pp=2", "parallel.vpp=2", "parallel.shard=optimizer"};
  EXPECT(validates(2, 3, pp_vpp, &c) && c.parallel.dp == 1, "pp 2 vpp 2, dist-opt with dp 1");
  // Gradient compression: error feedback's auto is on for int8 only, and off means off.
  char *int8[] = {"parallel.grad_compress=int8"}, *fp16[] = {"parallel.grad_compress=fp16"},
       *fp16_ef[] = {"parallel.grad_compress=fp16", "parallel.grad_error_feedback=on"},
       *int8_off[] = {"parallel.grad_compress=int8", "parallel.grad_error_feedback=off"};
  EXPECT(validates(2, 1, int8, &c) && c.optim.grad_compress == COMM_COMPRESS_INT8 && c.optim.grad_error_feedback, "int8");
  EXPECT(validates(2, 1, fp16, &c) && c.optim.grad_compress == COMM_COMPRESS_FP16 && !c.optim.grad_error_feedback, "fp16");
  EXPECT(validates(2, 2, fp16_ef, &c) && c.optim.grad_error_feedback, "fp16 with feedback");
  EXPECT(validates(2, 2, int8_off, &c) && !c.optim.grad_error_feedback, "int8 without feedback");
  char *explicit_dp[] = {"parallel.dp=4"};
  EXPECT(validates(4, 1, explicit_dp, &c) && c.parallel.dp == 4, "explicit dp");
  // A struct filled by code is range-checked before any rule divides by it.
  char err[512] = "";
  cfg_load(&c, NULL, 0, NULL, err, sizeof err);
  c.model.n_heads = 0;
  EXPECT(cfg_validate(&c, 1, err, sizeof err) == -1 && has(err, "model.n_heads = 0 is out of range"), "'%s'", err);
  cfg_load(&c, NULL, 0, NULL, err, sizeof err);
  c.train.precision = (cfg_precision)5;
  EXPECT(cfg_validate(&c, 1, err, sizeof err) == -1 &&
         has(err, "train.precision = 5 is out of range [0, 4] (the enum of: auto, fp32, tf32, bf16, fp8)"), "'%s'", err);
}

static void test_round_trip(void) {
  cfg a, b;
  char err[512];
  char *ov[] = {"model.dim=96", "model.norm_eps=1.2345678e-6", "model.rope_theta=500000", "model.init_std=0.0123",
                "train.lr=0.1", "train.min_lr=1e-7", "train.beta2=0.999", "train.seed=18446744073709551615",
                "model.tie_embeddings=true", "parallel.dp=3", "data.train=a \"quoted\" path\\with: colon #x",
                "data.val=", "checkpoint.resume=yes", "log.metrics=123", "checkpoint.dir=tab\there",
                // UTF-8 that YAML takes only escaped (U+0085, U+FEFF, U+2028 a line break) beside é
                "checkpoint.init_from=\xc2\x85 \xef\xbb\xbf \xc3\xa9 \xe2\x80\xa8 \xe2\x80\xa9."};
  int n_ov = (int)(sizeof ov / sizeof ov[0]);
  EXPECT(cfg_load(&a, NULL, n_ov, ov, err, sizeof err) == 0, "%s", err);
  size_t need = cfg_to_yaml(&a, NULL, 0);
  char *buf = malloc(need + 1);
  size_t n = cfg_to_yaml(&a, buf, need + 1);
  EXPECT(n == need && strlen(buf) == n, "to_yaml size %zu vs %zu", n, need);
  EXPECT(has(buf, "model:\n  dim: 96\n") && has(buf, "\nlog:\n"), "layout of the dump");
  // Floats read as written: the shortest text that gives the same float back.
  EXPECT(has(buf, "  init_std: 0.0123\n") && has(buf, "  min_lr: 1e-07\n") && has(buf, "  lr: 0.1\n") &&
         has(buf, "  norm_eps: 1.2345678e-06\n") && has(buf, "  rope_theta: 500000\n"),
         "floats as written:\n%s", buf);
  EXPECT(cfg_load_string(&b, buf, "ckpt:/config", err, sizeof err) == 0, "%s\n%s", err, buf);
  EXPECT(!strcmp(b.path, "ckpt:/config"), "path '%s'", b.path);
  memcpy(b.path, a.path, sizeof a.path);
  EXPECT(memcmp(&a, &b, sizeof a) == 0, "round trip differs:\n%s", buf);
  EXPECT(!strcmp(b.data.train, "a \"quoted\" path\\with: colon #x") && !strcmp(b.checkpoint.resume, "yes"),
         "strings");
  // Defaults round-trip too, and a short buffer is cut but reports the full size.
  cfg_load(&a, NULL, 0, NULL, err, sizeof err);
  char small[16];
  size_t full = cfg_to_yaml(&a, small, sizeof small);
  EXPECT(full > sizeof small && strlen(small) == sizeof small - 1, "short buffer");
  buf = realloc(buf, full + 1);
  n = cfg_to_yaml(&a, buf, full + 1);
  EXPECT(n == full, "sizes %zu %zu", n, full);
  EXPECT(cfg_load_string(&b, buf, NULL, err, sizeof err) == 0, "%s", err);
  memcpy(b.path, a.path, sizeof a.path);
  EXPECT(memcmp(&a, &b, sizeof a) == 0, "defaults round trip");
  EXPECT(has(buf, "  lr: 0.003\n") && has(buf, "  min_lr: 0.0003\n") && has(buf, "  eps: 1e-08\n") &&
         has(buf, "  beta2: 0.95\n"), "defaults as written:\n%s", buf);
  // cfg_load_string reports errors under its name.
  EXPECT(cfg_load_string(&b, "model:\n  dimm: 1\n", "ckpt.h5", err, sizeof err) == -1 && has(err, "ckpt.h5:2:"),
         "'%s'", err);
  free(buf);
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  s[fread(s, 1, (size_t)n, f)] = '\0';
  fclose(f);
  return s;
}

// configs/default.yaml must be the defaults with every key written out; docs/config.md must
// document every key, a choice key with its words and default as the table has them. The key
// list comes from cfg_to_yaml (one "  key: value" line per key).
static void test_shipped_files(void) {
  const char *src = getenv("TRAINER_SOURCE_DIR");
  char path[512], err[512];
  if (!src) src = ".";
  cfg def, c;
  cfg_load(&def, NULL, 0, NULL, err, sizeof err);

  snprintf(path, sizeof path, "%s/configs/default.yaml", src);
  EXPECT(cfg_load(&c, path, 0, NULL, err, sizeof err) == 0, "%s", err);
  memcpy(c.path, def.path, sizeof c.path);
  EXPECT(memcmp(&c, &def, sizeof c) == 0, "configs/default.yaml differs from the defaults in app/config.c");
  char *default_text = read_all(path);
  snprintf(path, sizeof path, "%s/docs/config.md", src);
  char *doc = read_all(path);
  EXPECT(default_text && doc, "cannot read configs/default.yaml or docs/config.md under %s", src);

  size_t n = cfg_to_yaml(&def, NULL, 0);
  char *dump = malloc(n + 1), section[64] = "";
  cfg_to_yaml(&def, dump, n + 1);
  for (char *line = strtok(dump, "\n"); line && default_text && doc; line = strtok(NULL, "\n")) {
    char name[64], want[160];
    if (line[0] != ' ') {
      snprintf(section, sizeof section, "%.*s", (int)(strchr(line, ':') - line), line);
      continue;
    }
    snprintf(name, sizeof name, "%.*s", (int)(strchr(line, ':') - line - 2), line + 2);
    snprintf(want, sizeof want, "\n  %s:", name);
    EXPECT(has(default_text, want), "configs/default.yaml lacks %s.%s", section, name);
    snprintf(want, sizeof want, "`%s.%s`", section, name);
    EXPECT(has(doc, want), "docs/config.md lacks %s", want);
    snprintf(want, sizeof want, "%s.%s", section, name);
    const char *const *words = cfg_list_choices(want);
    if (!words) continue;
    char row[512];
    int n = snprintf(row, sizeof row, "| `%s` | choice | ", want);
    for (int i = 0; words[i]; i++) n += snprintf(row + n, sizeof row - (size_t)n, "%s%s", i ? " \\| " : "", words[i]);
    const char *value = strchr(line, ':') + 2;  // the default's word, quoted
    snprintf(row + n, sizeof row - (size_t)n, " | `%.*s` |", (int)strlen(value) - 2, value + 1);
    EXPECT(has(doc, row), "docs/config.md lacks the row '%s'", row);
  }
  free(dump);
  free(default_text);
  free(doc);

  snprintf(path, sizeof path, "%s/configs/tiny.yaml", src);
  EXPECT(cfg_load(&c, path, 0, NULL, err, sizeof err) == 0, "%s", err);
  EXPECT(c.model.dim == 64 && c.train.steps == 6 && c.checkpoint.dir[0] == '\0' && c.log.metrics[0] == '\0', "tiny");
  EXPECT(cfg_validate(&c, 1, err, sizeof err) == 0, "tiny on 1 rank: %s", err);
  char *tiny_layouts[][2] = {{"parallel.tp=2", "parallel.sequence_parallel=true"}, {"parallel.pp=2", "parallel.vpp=2"}};
  for (int i = 0; i < 2; i++) {
    EXPECT(cfg_load(&c, path, 2, tiny_layouts[i], err, sizeof err) == 0 && cfg_validate(&c, 4, err, sizeof err) == 0,
           "tiny with %s %s on 4 ranks: %s", tiny_layouts[i][0], tiny_layouts[i][1], err);
  }
}

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/test_config_XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_defaults();
  test_file_and_overrides();
  test_load_errors();
  test_validate();
  test_round_trip();
  test_shipped_files();
  for (int i = 0; i < n_tmp_paths; i++) unlink(tmp_paths[i]);
  rmdir(tmp_dir);
  return test_summary();
}
