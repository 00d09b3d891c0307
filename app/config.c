// Run configuration: the table of every key (section, name, type, offset, range, default, doc,
// and a choice key's words), YAML loading with libyaml's event API, `section.key=value`
// overrides, the table's range check and the YAML dump that checkpoints store. The rules between
// keys are in config_rules.c. Key reference: docs/config.md.
#include "app/config.h"
#include "app/config_from.h"
#include "kernels/base/json.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

typedef enum { CFG_T_INT, CFG_T_FLOAT, CFG_T_BOOL, CFG_T_STRING, CFG_T_UINT64, CFG_T_CHOICE } cfg_type;

typedef struct cfg_key {
  const char *section;
  const char *key;
  cfg_type type;
  size_t offset;        // offsetof(cfg, section.key)
  double min, max;      // inclusive range of int and float keys
  double def;           // default of numeric, bool and choice keys (a uint64 default must be exact in a double)
  const char *def_str;  // default of string keys
  const char *doc;      // one line, shown in docs/config.md and configs/default.yaml
  const char *const *words;  // choice keys: the words, NULL-terminated, in the order of the field's enum
} cfg_key;

// A choice key's words, once: the loader turns a word into its index (the enum value), and the
// dump, the error for another word and docs/config.md's range column (checked by test_config)
// come from the same list. Each list must name every enumerator of its enum, in order.
#define CFG_WORDS(etype, last, ...)                                                \
  const char *const etype##_names[] = {__VA_ARGS__, NULL};                        \
  _Static_assert(sizeof etype##_names / sizeof etype##_names[0] == (size_t)(last) + 2, \
                 #etype "_names: one word per enumerator of " #etype ", in order")
CFG_WORDS(cfg_device, CFG_DEVICE_CUDA, "auto", "cpu", "cuda");
CFG_WORDS(cfg_precision, CFG_PRECISION_FP8, "auto", "fp32", "tf32", "bf16", "fp8");
CFG_WORDS(cfg_attention, CFG_ATTENTION_OWN, "cudnn", "cudnn_atomic", "own");
CFG_WORDS(cfg_cpu_isa, CFG_CPU_ISA_SSE, "auto", "avx512", "avx2", "sse");
CFG_WORDS(cfg_recompute, CFG_RECOMPUTE_FULL, "none", "selective", "full");
CFG_WORDS(cfg_fp8_recipe, CFG_FP8_RECIPE_BLOCK, "delayed", "current", "block");
CFG_WORDS(cfg_amax_compute, CFG_AMAX_COMPUTE_MOST_RECENT, "max", "most_recent");
CFG_WORDS(cfg_fp8_format, CFG_FP8_FORMAT_E4M3, "hybrid", "e4m3");
CFG_WORDS(cfg_offload, CFG_OFFLOAD_HOST, "none", "host");
CFG_WORDS(cfg_offload_update, CFG_OFFLOAD_UPDATE_CPU, "gpu", "cpu");
CFG_WORDS(cfg_gpu_comm, CFG_GPU_COMM_MPI, "nccl", "mpi");
CFG_WORDS(cfg_tp_overlap, CFG_TP_OVERLAP_NONE, "auto", "nccl", "p2p", "none");
CFG_WORDS(cfg_tp_reduce, CFG_TP_REDUCE_BF16, "auto", "fp32", "bf16");
CFG_WORDS(cfg_shard, CFG_SHARD_WEIGHTS, "none", "optimizer", "grads", "weights");
CFG_WORDS(cfg_grad_compress, CFG_GRAD_COMPRESS_INT8, "none", "bf16", "fp16", "int8");
CFG_WORDS(cfg_error_feedback, CFG_ERROR_FEEDBACK_OFF, "auto", "on", "off");

// A row whose declared type differs from the struct field's would silently write the wrong
// bytes, so each row checks its field's C type at compile time: a _Generic selection with no
// matching association does not compile. String fields decay to char * there.
#define CFG_TYPE_CHECK(field, ctype) (0 * _Generic(((cfg *)0)->field, ctype: 1))
#define CFG_OFF(field, ctype) (offsetof(cfg, field) + CFG_TYPE_CHECK(field, ctype))

#define CFG_INT(sec, k, lo, hi, d, doc) {#sec, #k, CFG_T_INT, CFG_OFF(sec.k, int), lo, hi, d, NULL, doc, NULL}
#define CFG_FLOAT(sec, k, lo, hi, d, doc) {#sec, #k, CFG_T_FLOAT, CFG_OFF(sec.k, float), lo, hi, d, NULL, doc, NULL}
#define CFG_BOOL(sec, k, d, doc) {#sec, #k, CFG_T_BOOL, CFG_OFF(sec.k, int), 0, 1, d, NULL, doc, NULL}
// Keys whose field belongs to a module's own config struct (the optimizer's, cfg.optim).
#define CFG_INT_IN(sec, k, field, lo, hi, d, doc) {#sec, #k, CFG_T_INT, CFG_OFF(field, int), lo, hi, d, NULL, doc, NULL}
#define CFG_FLOAT_IN(sec, k, field, lo, hi, d, doc) \
  {#sec, #k, CFG_T_FLOAT, CFG_OFF(field, float), lo, hi, d, NULL, doc, NULL}
#define CFG_BOOL_IN(sec, k, field, d, doc) {#sec, #k, CFG_T_BOOL, CFG_OFF(field, int), 0, 1, d, NULL, doc, NULL}
#define CFG_STRING_IN(sec, k, field, d, doc) {#sec, #k, CFG_T_STRING, CFG_OFF(field, char *), 0, 0, 0, d, doc, NULL}
#define CFG_U64(sec, k, d, doc) {#sec, #k, CFG_T_UINT64, CFG_OFF(sec.k, uint64_t), 0, 0, d, NULL, doc, NULL}
#define CFG_STRING(sec, k, d, doc) {#sec, #k, CFG_T_STRING, CFG_OFF(sec.k, char *), 0, 0, 0, d, doc, NULL}
// A choice key's field has the enum type etype (checked), whose words are etype##_names; the
// loader writes it as an int, so the enum must be int-sized.
#define CFG_INT_SIZED(etype) (0 * sizeof(char[sizeof(etype) == sizeof(int) ? 1 : -1]))
#define CFG_CHOICE(sec, k, etype, d, doc) \
  {#sec, #k, CFG_T_CHOICE, CFG_OFF(sec.k, etype) + CFG_INT_SIZED(etype), 0, 0, d, NULL, doc, etype##_names}

static const char *const cfg_sections[] = {"model", "parallel", "train", "fp8", "optimizer", "data", "checkpoint", "log"};
#define CFG_N_SECTIONS ((int)(sizeof cfg_sections / sizeof cfg_sections[0]))

// Rows are grouped by section, in cfg_sections order; cfg_to_yaml relies on it.
static const cfg_key cfg_keys[] = {
  CFG_INT(model, dim, 1, 1048576, 256, "model width d (hidden size)"),
  CFG_INT(model, n_layers, 1, 4096, 4, "transformer blocks"),
  CFG_INT(model, n_heads, 1, 4096, 8, "query heads; divides dim, and dim / n_heads is even (rotary)"),
  CFG_INT(model, n_kv_heads, 1, 4096, 4, "key/value heads (grouped-query attention); divides n_heads"),
  CFG_INT(model, ffn_dim, 1, 4194304, 768, "SwiGLU hidden width"),
  CFG_INT(model, vocab_size, 1, CFG_MAX_VOCAB, 256, "vocabulary size (256: byte-level tokens)"),
  CFG_INT(model, seq_len, 1, 1048576, 128, "tokens per sequence (context length)"),
  CFG_FLOAT(model, norm_eps, 1e-12, 1, 1e-5, "epsilon of RMSNorm"),
  CFG_FLOAT(model, rope_theta, 1, 1e9, 10000, "base of the rotary position frequencies"),
  CFG_BOOL(model, tie_embeddings, 0, "LM head shares the token-embedding table (needs parallel.pp 1)"),
  CFG_FLOAT(model, init_std, 0, 1, 0.02, "std of the normal init of weight matrices"),
  CFG_STRING_IN(model, from, model_from, "",
                "hf:DIR: the other model keys come from DIR's config.json (a Hugging Face Llama directory, "
                "docs/hf.md); a model key also set here must agree with it; empty = the keys as written"),

  CFG_INT(parallel, tp, 1, 1024, 1, "tensor-parallel ranks (split heads, FFN and vocabulary)"),
  CFG_INT(parallel, pp, 1, 1024, 1, "pipeline stages"),
  CFG_INT(parallel, dp, 0, 1048576, 0, "data-parallel replicas; 0 = world size / (tp * pp)"),
  CFG_INT(parallel, vpp, 1, 64, 1, "virtual pipeline chunks per rank (1 = plain 1F1B; > 1 needs pp > 1)"),
  CFG_INT(parallel, last_stage_layers, 0, 4096, 0,
          "layers of the last pipeline stage, which also runs the LM head and loss; 0 = an even split"),
  CFG_BOOL(parallel, pp_comm_bf16, 0,
           "send pipeline activations and gradients between stages in bf16, rounded from the fp32 residual "
           "stream: half the traffic; false = fp32; no effect with pp 1"),
  CFG_BOOL(parallel, pp_overlap, 0,
           "run pipeline transfers on their own channel per direction, overlapping compute: a stage waits only "
           "for the transfer it reads; false = each group of transfers completes before the next compute; no "
           "effect with pp 1"),
  CFG_BOOL(parallel, sequence_parallel, 0, "shard activations outside TP regions along the sequence (needs tp > 1)"),
  CFG_CHOICE(parallel, shard, cfg_shard, CFG_SHARD_NONE,
             "what each dp rank holds only its part of: none (every rank holds all of the optimizer's state); "
             "optimizer: the fp32 master weights and the AdamW moments (ZeRO-1: DP buckets are reduce-scattered, each "
             "rank updates its part and the compute copy is all-gathered); grads: the fp32 gradients too (ZeRO-2: each "
             "layer's gradients are reduce-scattered as backward finishes them, from a staging slot, into the "
             "owner's part; no whole gradient buffer); weights: the bf16 compute copy too (ZeRO-3: each layer's "
             "weights are all-gathered into a slot just before its forward and its backward, the next layer's while "
             "this one computes); no effect with dp 1"),
  CFG_INT(parallel, shard_prefetch, 1, 8, 1,
          "parallel.shard=weights: groups (layers) gathered ahead of the one computing, each in a slot of its own "
          "and on a communicator of its own; 1 = the next one; no effect in the other modes"),
  CFG_BOOL(parallel, reshard_after_forward, 1,
           "parallel.shard=weights: true frees each layer's gathered weights after its forward (at most "
           "shard_prefetch + 1 layers gathered at a time) and gathers them again for its backward; false keeps "
           "every layer gathered from its forward to its backward (the whole compute copy on every rank, as FSDP's "
           "reshard_after_forward=False), so backward gathers nothing; not with FP8 or gather_copy_engine"),
  CFG_BOOL(parallel, gather_copy_engine, 0,
           "parallel.shard=weights on GPUs of one node: the layers' all-gathers run on the GPUs' copy engines "
           "(NCCL's zero-CTA policy, slots in registered symmetric memory, a communicator per slot), leaving "
           "every SM to the compute beside them; false = NCCL's kernels; no effect in the other modes or on "
           "CPU ranks"),
  CFG_INT(parallel, shard_group, 0, 1048576, 0,
          "dp ranks that share out what parallel.shard shards (hybrid sharding): 0 = all of dp; a divisor of dp "
          "shards inside groups of that many consecutive dp ranks (a node's) and keeps a replica in each group, "
          "the gradients' parts then summed over the groups"),
  CFG_FLOAT_IN(parallel, bucket_mb, optim.bucket_mb, 0.001, 4096, 100, "DP gradient bucket size in MiB"),
  CFG_CHOICE(parallel, grad_compress, cfg_grad_compress, CFG_GRAD_COMPRESS_NONE,
             "wire format of the DP gradient reduction (none: fp32; fp16: a per-bucket power-of-two scale agreed "
             "over dp; int8: blocks of 256 with an fp32 scale, all-to-all then all-gather); docs/compression.md; no "
             "effect with dp 1"),
  CFG_CHOICE(parallel, grad_error_feedback, cfg_error_feedback, CFG_ERROR_FEEDBACK_AUTO,
             "carry what the gradient compression dropped on each rank into the next step (auto: on for int8); "
             "stored in checkpoints"),
  CFG_CHOICE(parallel, gpu_comm, cfg_gpu_comm, CFG_GPU_COMM_NCCL,
             "communicator of GPU ranks (mpi: device buffers copied through host memory, slow, but several ranks "
             "may share a GPU, e.g. to test a layout on one GPU; nccl needs one GPU per rank)"),
  CFG_CHOICE(parallel, tp_overlap, cfg_tp_overlap, CFG_TP_OVERLAP_AUTO,
             "the tensor-parallel gathers and reduce-scatters (sequence parallelism), each run beside the "
             "GEMMs: p2p: peer copies on the copy engines in ring order, no SMs taken, the GEMM over each "
             "rank's rows as they arrive (GPUs of one host with peer access, over NCCL); nccl: NCCL's kernels "
             "beside the GEMM over this rank's own rows; none: each waited for before the GEMM, not overlapped "
             "(a baseline); auto: p2p where every GPU of the tp group has peer access to the others, else nccl; "
             "docs/tensor-parallel.md"),
  CFG_CHOICE(parallel, tp_reduce_dtype, cfg_tp_reduce, CFG_TP_REDUCE_AUTO,
             "with sequence parallelism, the dtype of the partial sums the tp reduce-scatters send (the attention "
             "output and MLP down projections' outputs in the forward, the QKV and gate/up projections' data "
             "gradients in the backward), summed in fp32 on arrival: bf16 (half the bytes) | fp32 | auto (the "
             "activations' dtype: bf16 on GPUs, fp32 on CPU ranks); docs/tensor-parallel.md"),
  CFG_INT(parallel, dp_overlap_ctas, 0, 64, 0,
          "GPUs: at most this many CTAs (SMs) for the DP reductions that overlap backward, on a communicator of "
          "their own; 0 = NCCL's choice, on the dp communicator"),
  CFG_FLOAT(parallel, comm_timeout_s, 0.001, 1e6, 600,
            "GPUs: seconds a collective or transfer may wait for its peers before the job ends with a message "
            "naming the group and the operation (a dead or stuck rank)"),
  CFG_INT(parallel, mpi_chunk_elems, 0, 2147483647, 0,
          "MPI communicator: the largest message in elements, longer ones are sent in pieces; 0 = no limit"),

  CFG_INT(train, steps, 1, 1000000000, 300, "optimizer steps"),
  CFG_INT(train, stop_at, 0, 1000000000, 0, "stop after this step, schedule unchanged (split a run over jobs); 0 = off"),
  CFG_INT(train, global_batch, 1, 100000000, 32, "sequences per optimizer step, over all dp ranks"),
  CFG_INT(train, micro_batch, 1, 1000000, 8, "sequences per micro-batch on one rank"),
  CFG_FLOAT_IN(train, lr, optim.lr, 0, 10, 3e-3, "peak learning rate, reached after warmup"),
  CFG_FLOAT_IN(train, min_lr, optim.min_lr, 0, 10, 3e-4, "floor of the cosine decay; <= lr"),
  CFG_INT_IN(train, warmup_steps, optim.warmup_steps, 0, 1000000000, 30, "linear warmup steps; <= steps"),
  CFG_FLOAT_IN(train, weight_decay, optim.weight_decay, 0, 10, 0.1, "AdamW decoupled weight decay"),
  CFG_FLOAT_IN(train, beta1, optim.beta1, 0, 0.9999999, 0.9, "AdamW first-moment decay"),
  CFG_FLOAT_IN(train, beta2, optim.beta2, 0, 0.9999999, 0.95, "AdamW second-moment decay"),
  CFG_FLOAT_IN(train, eps, optim.eps, 1e-30, 1, 1e-8, "AdamW denominator epsilon; > 0"),
  CFG_FLOAT_IN(train, grad_clip, optim.grad_clip, 0, 1e6, 1.0, "clip of the global gradient norm; 0 = off"),
  CFG_INT(train, skip_nonfinite, 0, 1000000000, 0,
          "steps whose gradient norm is NaN or Inf, or whose update would make weights non-finite (each "
          "update then tried first on copies), that are skipped (no update, a warning each) before the run "
          "stops; 0 = the first such step stops the run"),
  CFG_U64(train, seed, 1234, "seed of the init and of the data order"),
  CFG_CHOICE(train, device, cfg_device, CFG_DEVICE_AUTO, "where ranks compute (auto: cuda when a GPU is visible)"),
  CFG_CHOICE(train, precision, cfg_precision, CFG_PRECISION_AUTO,
             "arithmetic of activations and GEMMs (auto: bf16 on GPUs, fp32 on CPU ranks; tf32: fp32 activations "
             "with TF32 GEMMs, GPUs only; fp8: bf16 activations and the four projections of every block in FP8 (the "
             "fp8 section), emulated exactly on CPU ranks); master weights, gradients and optimizer state are fp32 "
             "in every case"),
  CFG_CHOICE(train, attention, cfg_attention, CFG_ATTENTION_CUDNN,
             "GPU attention kernel (cudnn: cuDNN's fused attention with bf16 activations, its deterministic "
             "backward, the own kernel for fp32 or a shape cuDNN refuses; cudnn_atomic: the same with cuDNN's "
             "backward accumulating dq with fp32 atomics, faster and with less workspace, but the last bits of its "
             "gradients vary from run to run, so runs and resumes are not bitwise reproducible; own: the project's "
             "own kernel always)"),
  CFG_CHOICE(train, cpu_isa, cfg_cpu_isa, CFG_CPU_ISA_AUTO,
             "widest vector instruction set of the CPU GEMM and AdamW (auto: the widest the CPU has)"),
  CFG_CHOICE(train, recompute, cfg_recompute, CFG_RECOMPUTE_NONE, "activation recomputation"),

  CFG_CHOICE(fp8, recipe, cfg_fp8_recipe, CFG_FP8_RECIPE_DELAYED,
             "scaling of activations and gradients (delayed: per tensor, from the amax history of earlier steps; "
             "current: per tensor, from its own amax, reduced over its tensor-parallel group, before each cast; "
             "block: a scale per 1x128 tile of activations and gradients and per 128x128 tile of weights, each from "
             "its own amax; all E4M3)"),
  CFG_INT(fp8, amax_history, 1, 4096, 1024, "delayed: steps of amax history per tensor"),
  CFG_CHOICE(fp8, amax_compute, cfg_amax_compute, CFG_AMAX_COMPUTE_MAX,
             "delayed: the amax of the history a scale comes from (max: the largest; most_recent: the last step's)"),
  CFG_INT(fp8, margin, 0, 32, 0, "scale = largest FP8 value / amax / 2^margin"),
  CFG_CHOICE(fp8, format, cfg_fp8_format, CFG_FP8_FORMAT_HYBRID,
             "FP8 formats (hybrid: E4M3 weights and activations, E5M2 gradients; e4m3: all E4M3)"),
  CFG_BOOL(fp8, fast_accum, 1, "forward FP8 GEMMs accumulate in the tensor cores' fast mode (GPUs; backward never)"),
  CFG_BOOL(fp8, bf16_edge_layers, 0, "keep the first and the last block in bf16"),
  CFG_BOOL(fp8, head, 0, "the LM head's GEMMs (forward, data and weight gradient) in FP8 too, with scaling of its own"),
  CFG_BOOL_IN(fp8, param_gather, optim.fp8_param_gather, 0,
              "the sharded optimizer all-gathers the updated FP8 weights as FP8 codes instead of the bf16 "
              "compute copy (half the bytes; bitwise the same training); needs parallel.shard=optimizer and "
              "fp8.recipe delayed or current; no effect with dp 1"),

  CFG_CHOICE(optimizer, offload, cfg_offload, CFG_OFFLOAD_NONE,
             "where the fp32 master weights and AdamW moments live (none: backend memory; host: pinned host memory, "
             "sharded over dp like the distributed optimizer; the bf16 compute copy and the gradients stay on the "
             "GPU; on CPU ranks there is nothing to offload: the same bookkeeping runs in plain memory)"),
  CFG_CHOICE(optimizer, offload_update, cfg_offload_update, CFG_OFFLOAD_UPDATE_CPU,
             "offload=host: who updates the host share (cpu: gradients copied to host per bucket, AdamW on the "
             "rank's cores, new weights copied back per bucket; gpu: the AdamW kernel reads and writes the host "
             "memory in place over NVLink-C2C or PCIe, no staging copies)"),
  CFG_FLOAT_IN(optimizer, offload_fraction, optim.offload_fraction, 0, 1, 1,
               "offload=host: share of the gradient buckets (the last layers first) whose master weights and "
               "moments live and update in host memory; the rest stay in backend memory and update on the GPU"),
  CFG_INT_IN(optimizer, offload_delay, optim.offload_delay, 0, 1, 0,
             "1: the host update of step k runs during step k + 1 (one-step delayed update: step k + 1 computes "
             "its gradients on the weights before step k's update, which changes the arithmetic); needs "
             "offload=host and offload_update=cpu; 0 = the update completes within its step"),
  CFG_BOOL_IN(optimizer, offload_layer_wait, optim.offload_layer_wait, 1,
              "offload_update=cpu without delay, with dp 1: the host update of each bucket runs "
              "in the next forward just before the first layer that reads it, beside the forward of the layers "
              "before it (the same arithmetic); false = the whole update before the next step starts"),
  CFG_BOOL_IN(optimizer, update_overlap, optim.update_overlap, 1,
              "parallel.shard=weights with the update in backend memory: each group's update runs on a second "
              "stream beside the next forward, which waits only for the groups it reads (the same arithmetic); "
              "false = the whole update before the next step starts; no effect in the other modes"),

  CFG_STRING(data, train, "data/corpus/train_*.bin", "training token shards: path or glob"),
  CFG_STRING(data, val, "data/corpus/val_*.bin", "validation token shards: path or glob; empty = no evaluation"),

  CFG_STRING(checkpoint, dir, "runs/default/ckpt", "checkpoint folder; empty = no checkpoints"),
  CFG_INT(checkpoint, every, 0, 1000000000, 100, "steps between checkpoints; 0 = only at the end"),
  CFG_STRING(checkpoint, resume, "none", "none | auto (newest in dir) | path of a checkpoint file"),
  CFG_INT(checkpoint, keep, 0, 1000000, 3, "newest checkpoints kept; 0 = all"),
  CFG_STRING(checkpoint, init_from, "",
             "start from these weights instead of the random init, with fresh optimizer state: hf:DIR (a Hugging "
             "Face Llama directory, docs/hf.md); empty = random init; ignored when a checkpoint is resumed"),
  CFG_BOOL(checkpoint, at_start, 0,
           "also write the checkpoint of step 0 (the initial weights) before the first update; no effect without "
           "checkpoint.dir"),
  CFG_BOOL(checkpoint, async, 0,
           "write checkpoints in the background: the training thread copies the state to pinned host memory and "
           "goes on while a thread writes the file (at most one write in flight); false = training waits for the "
           "write"),

  CFG_INT(log, every, 1, 1000000000, 10, "steps between log lines"),
  CFG_STRING(log, metrics, "runs/default/metrics.jsonl", "JSON-lines metrics file; empty = none"),
  CFG_STRING(log, tensorboard, "",
             "folder for TensorBoard event files (the same scalars as log.metrics, a new file per start); empty = "
             "none"),
  CFG_INT(log, eval_every, 0, 1000000000, 50, "steps between val-loss evaluations; 0 = only at the end"),
  CFG_INT(log, eval_batches, 1, 1000000, 8, "micro-batches (of micro_batch sequences) per evaluation"),
  CFG_BOOL(log, time_tp, 0,
           "time the tensor-parallel collectives in the run report (a GPU sync around each, which slows the step); "
           "false = they count as compute"),
  CFG_BOOL(log, time_dp, 0,
           "time what forward and backward wait for of sharded data parallelism (parallel.shard=weights all-gathers, "
           "grads and weights reduce-scatters) in the run report's exposed dp comm (a GPU sync around each wait, "
           "which slows the step); false = it counts as compute"),
  CFG_FLOAT(log, peak_tflops, 0, 1e6, 0,
            "dense peak TFLOP/s of one rank's device, for MFU; 0 = the device's known bf16 peak (989.4 for H100 "
            "and H200), else no MFU"),
};
#define CFG_N_KEYS ((int)(sizeof cfg_keys / sizeof cfg_keys[0]))

// ---------------------------------------------------------------------------------------------
// Messages

// Where a value came from: a file line (line 0: the file as a whole) or a command-line override.
typedef struct cfg_site {
  const char *name;      // file name, or the name given to cfg_load_string
  size_t line;           // 1-based
  const char *override;  // the override argument, when the value came from one
} cfg_site;

// Writes "<site>: <message>" into err; always returns -1 so callers can `return cfg_fail(...)`.
static int cfg_fail(char *err, size_t n_err, const cfg_site *s, const char *fmt, ...) {
  if (!err || n_err == 0) return -1;
  size_t n = 0;
  if (s && s->override)
    n = (size_t)snprintf(err, n_err, "override '%s': ", s->override);
  else if (s && s->line)
    n = (size_t)snprintf(err, n_err, "%s:%zu: ", s->name, s->line);
  else if (s)
    n = (size_t)snprintf(err, n_err, "%s: ", s->name);
  if (n < n_err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, n_err - n, fmt, ap);
    va_end(ap);
  }
  return -1;
}

// Values echoed in messages are cut, and their control characters (a newline in a quoted
// value) shown as '?', so one stray value can neither flood the terminal nor split the line.
static const char *cfg_shorten(const char *s, char *buf, size_t n_buf) {
  size_t n = strlen(s), keep = n < n_buf ? n : n_buf - 4;
  for (size_t i = 0; i < keep; i++) buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  snprintf(buf + keep, n_buf - keep, "%s", keep < n ? "..." : "");
  return buf;
}

// Length of the UTF-8 sequence at s (1 to 4) with its code point in *cp, or 0 when the bytes
// are not UTF-8 (overlong forms, surrogates and values past U+10FFFF included) or s is at its end.
static int cfg_utf8_next(const unsigned char *s, uint32_t *cp) {
  int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || s[0] == 0) return 0;
  uint32_t v = n == 1 ? s[0] : s[0] & (0x7Fu >> n);
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3Fu);
  }
  static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < smallest[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Edit distance counting insertions, deletions, substitutions and swaps of neighbours
// (optimal string alignment), for "did you mean" hints; names over 63 bytes get no hint.
static int cfg_edit_distance(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  if (na > 63 || nb > 63) return 1000;
  int d[64][64];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[na][nb];
}

// A typo is close enough for a hint when a third of the name (at least one edit) fixes it.
static int cfg_is_close(const char *typed, const char *known) {
  int limit = (int)strlen(known) / 3;
  return cfg_edit_distance(typed, known) <= (limit < 1 ? 1 : limit);
}

static int cfg_find_section(const char *name) {
  for (int i = 0; i < CFG_N_SECTIONS; i++)
    if (strcmp(cfg_sections[i], name) == 0) return i;
  return -1;
}

static const cfg_key *cfg_find_key(const char *section, const char *key) {
  for (int i = 0; i < CFG_N_KEYS; i++)
    if (strcmp(cfg_keys[i].section, section) == 0 && strcmp(cfg_keys[i].key, key) == 0) return &cfg_keys[i];
  return NULL;
}

static int cfg_unknown_section(char *err, size_t n_err, const cfg_site *s, const char *section) {
  char shortbuf[72], hint[96] = "";
  int best = -1, best_d = 1000;
  for (int i = 0; i < CFG_N_SECTIONS; i++) {
    int d = cfg_edit_distance(section, cfg_sections[i]);
    if (cfg_is_close(section, cfg_sections[i]) && d < best_d) best = i, best_d = d;
  }
  if (best >= 0) snprintf(hint, sizeof hint, "did you mean '%s'? ", cfg_sections[best]);
  return cfg_fail(err, n_err, s,
                  "unknown section '%s' (%ssections: model, parallel, train, fp8, optimizer, data, checkpoint, log)",
                  cfg_shorten(section, shortbuf, sizeof shortbuf), hint);
}

// Keys that were replaced: what to tell a user who still sets one, and how the config stored in
// an older checkpoint (cfg_to_yaml's lines, "  key: value") reads in the new keys.
static const struct {
  const char *section, *key, *instead;
  const char *stored_true, *stored_false;  // the new line for the old bool's true and false
} cfg_replaced[] = {
    {"parallel", "grad_reduce_bf16", "set parallel.grad_compress: bf16 (true) or none (false)",
     "  grad_compress: \"bf16\"", "  grad_compress: \"none\""},
    {"parallel", "distributed_optimizer", "set parallel.shard: optimizer (true) or none (false)",
     "  shard: \"optimizer\"", "  shard: \"none\""},
};

// Hint order: a replaced key's successor; a close name in the same section, else the same name
// in another section (a key put under the wrong section is a common slip).
static int cfg_unknown_key(char *err, size_t n_err, const cfg_site *s, const char *section, const char *key) {
  for (size_t i = 0; i < sizeof cfg_replaced / sizeof *cfg_replaced; i++)
    if (strcmp(cfg_replaced[i].section, section) == 0 && strcmp(cfg_replaced[i].key, key) == 0)
      return cfg_fail(err, n_err, s, "%s.%s was replaced: %s", section, key, cfg_replaced[i].instead);
  char shortbuf[72], hint[128] = "", list[512] = "";
  const cfg_key *best = NULL;
  int best_d = 1000;
  size_t n_list = 0;
  for (int i = 0; i < CFG_N_KEYS; i++) {
    const cfg_key *k = &cfg_keys[i];
    if (strcmp(k->section, section) != 0) continue;
    int d = cfg_edit_distance(key, k->key);
    if (cfg_is_close(key, k->key) && d < best_d) best = k, best_d = d;
    if (n_list < sizeof list)
      n_list += (size_t)snprintf(list + n_list, sizeof list - n_list, "%s%s", n_list ? ", " : "", k->key);
  }
  for (int i = 0; !best && i < CFG_N_KEYS; i++)
    if (strcmp(cfg_keys[i].key, key) == 0) best = &cfg_keys[i];
  if (best) snprintf(hint, sizeof hint, "did you mean '%s.%s'? ", best->section, best->key);
  return cfg_fail(err, n_err, s, "unknown key '%s.%s' (%skeys of %s: %s)", section,
                  cfg_shorten(key, shortbuf, sizeof shortbuf), hint, section, list);
}

// ---------------------------------------------------------------------------------------------
// Values

// Zeroing first makes the struct (padding included) comparable with memcmp.
static void cfg_set_defaults(cfg *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < CFG_N_KEYS; i++) {
    const cfg_key *k = &cfg_keys[i];
    char *p = (char *)c + k->offset;
    switch (k->type) {
      case CFG_T_INT:
      case CFG_T_BOOL:
      case CFG_T_CHOICE: *(int *)p = (int)k->def; break;
      case CFG_T_FLOAT: *(float *)p = (float)k->def; break;
      case CFG_T_UINT64: *(uint64_t *)p = (uint64_t)k->def; break;
      case CFG_T_STRING: snprintf(p, CFG_STR, "%s", k->def_str); break;
    }
  }
}

int cfg_find_choice(const char *const *words, const char *word) {
  for (int i = 0; words[i]; i++)
    if (strcmp(words[i], word) == 0) return i;
  return -1;
}

static int cfg_n_words(const char *const *words) {
  int n = 0;
  while (words[n]) n++;
  return n;
}

// "auto, fp32, tf32" from a choice key's words, cut to fit.
static const char *cfg_join_words(const char *const *words, char *buf, size_t n_buf) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; words[i] && n < n_buf; i++)
    n += (size_t)snprintf(buf + n, n_buf - n, "%s%s", i ? ", " : "", words[i]);
  return buf;
}

static int cfg_parse_bool(const char *t, int *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(t, yes[i]) == 0) return *out = 1, 0;
    if (strcasecmp(t, no[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

// Sets one key from its text. `plain` marks an unquoted YAML scalar, where an empty value,
// `~` and `null` mean an empty string (so `dir: null` turns checkpoints off rather than
// writing to a folder named "null"); override text is always taken literally.
static int cfg_set_value(cfg *c, const cfg_key *k, const char *text, int plain, const cfg_site *s, char *err,
                         size_t n_err) {
  char shortbuf[72];
  const char *shown = cfg_shorten(text, shortbuf, sizeof shortbuf);
  char *p = (char *)c + k->offset;
  char *end = NULL;
  // strtol and friends skip leading blanks and accept odd forms; a value must start like a number.
  int numeric_start = text[0] == '-' || text[0] == '+' || text[0] == '.' || isdigit((unsigned char)text[0]);
  switch (k->type) {
    case CFG_T_INT: {
      errno = 0;
      long long v = numeric_start ? strtoll(text, &end, 10) : 0;
      if (!numeric_start || *end != '\0' || end == text || text[0] == '.')
        return cfg_fail(err, n_err, s, "%s.%s: expected an integer, found '%s'", k->section, k->key, shown);
      if (errno == ERANGE || v < (long long)k->min || v > (long long)k->max)
        return cfg_fail(err, n_err, s, "%s.%s = %s is out of range [%.10g, %.10g]", k->section, k->key, shown,
                        k->min, k->max);
      *(int *)p = (int)v;
      return 0;
    }
    case CFG_T_FLOAT: {
      double v = numeric_start ? strtod(text, &end) : 0;
      if (!numeric_start || *end != '\0' || end == text || isnan(v))
        return cfg_fail(err, n_err, s, "%s.%s: expected a number, found '%s'", k->section, k->key, shown);
      // The range applies to the value the run will use, after rounding to float; the bounds
      // are rounded the same way so that typing a bound itself is accepted.
      float f = (float)v;
      if (!isfinite(f) || f < (float)k->min || f > (float)k->max)
        return cfg_fail(err, n_err, s, "%s.%s = %s is out of range [%.10g, %.10g]", k->section, k->key, shown,
                        k->min, k->max);
      *(float *)p = f;
      return 0;
    }
    case CFG_T_BOOL: {
      int v;
      if (cfg_parse_bool(text, &v) != 0)
        return cfg_fail(err, n_err, s, "%s.%s: expected a boolean (true/false, yes/no, on/off, 1/0), found '%s'",
                        k->section, k->key, shown);
      *(int *)p = v;
      return 0;
    }
    case CFG_T_UINT64: {
      errno = 0;
      // strtoull would wrap a leading '-' around to a huge value, so only digits are taken.
      unsigned long long v = isdigit((unsigned char)text[0]) ? strtoull(text, &end, 10) : 0;
      if (!isdigit((unsigned char)text[0]) || *end != '\0' || errno == ERANGE)
        return cfg_fail(err, n_err, s, "%s.%s: expected an unsigned 64-bit integer, found '%s'", k->section,
                        k->key, shown);
      *(uint64_t *)p = (uint64_t)v;
      return 0;
    }
    case CFG_T_STRING: {
      if (plain && (strcmp(text, "~") == 0 || strcmp(text, "null") == 0)) text = "";
      size_t n = strlen(text);
      if (n >= CFG_STR)
        return cfg_fail(err, n_err, s, "%s.%s: value is %zu bytes long, the limit is %d bytes ('%s')", k->section,
                        k->key, n, CFG_STR - 1, shown);
      // YAML text is UTF-8 (libyaml checks a file); an override must be too, or the config that
      // checkpoints store would not read back.
      uint32_t cp;
      for (size_t i = 0, len; i < n; i += len)
        if ((len = (size_t)cfg_utf8_next((const unsigned char *)text + i, &cp)) == 0)
          return cfg_fail(err, n_err, s, "%s.%s: byte %zu (0x%02x) is not UTF-8 text; config strings are UTF-8",
                          k->section, k->key, i, (unsigned char)text[i]);
      memcpy(p, text, n + 1);
      return 0;
    }
    case CFG_T_CHOICE: {
      int v = cfg_find_choice(k->words, text);
      char words[256];
      if (v < 0)
        return cfg_fail(err, n_err, s, "%s.%s = '%s' is not one of: %s", k->section, k->key, shown,
                        cfg_join_words(k->words, words, sizeof words));
      *(int *)p = v;
      return 0;
    }
  }
  return cfg_fail(err, n_err, s, "%s.%s: internal error: unknown key type", k->section, k->key);
}

// ---------------------------------------------------------------------------------------------
// YAML: a two-level mapping, section -> key -> scalar

// Bounds on what is read, so that a wrong path or a hostile file ends in a message rather than
// a hang or an exhausted memory: the file's size, and the nesting of mappings and lists (a
// config needs two levels; libyaml keeps a stack per level).
enum { CFG_MAX_FILE_BYTES = 1 << 20, CFG_MAX_DEPTH = 64 };

typedef struct cfg_reader {
  yaml_parser_t parser;
  yaml_event_t ev;
  int have_ev;  // ev holds an event to delete
  cfg_site site;
  char *err;
  size_t n_err;
  const char *text;  // the whole input, for hints about the line of a syntax error
  size_t n_text;
  unsigned char *key_set;  // (CFG_N_KEYS) marks each key the text sets; NULL: not kept
} cfg_reader;

// libyaml calls a tab in indentation "found character that cannot start any token"; say
// what it is when the offending line is indented with one.
static const char *cfg_tab_hint(const cfg_reader *r, size_t line) {
  const char *q = r->text, *end = r->text + r->n_text;
  for (size_t l = 1; l < line && q < end; q++)
    if (*q == '\n') l++;
  for (; q < end && (*q == ' ' || *q == '\t'); q++)
    if (*q == '\t') return "; YAML indents with spaces, not tabs";
  return "";
}

// Next event into r->ev (the previous one is freed); a libyaml error becomes one message
// with the line of the problem.
static int cfg_next(cfg_reader *r) {
  if (r->have_ev) yaml_event_delete(&r->ev);
  r->have_ev = 0;
  if (yaml_parser_parse(&r->parser, &r->ev)) {
    r->have_ev = 1;
    r->site.line = r->ev.start_mark.line + 1;
    return 0;
  }
  const yaml_parser_t *p = &r->parser;
  const char *problem = p->problem ? p->problem : "unknown error";
  if (p->error == YAML_READER_ERROR) {
    r->site.line = 0;
    return cfg_fail(r->err, r->n_err, &r->site, "malformed YAML: %s at byte %zu", problem, p->problem_offset);
  }
  r->site.line = p->problem_mark.line + 1;
  const char *hint = cfg_tab_hint(r, r->site.line);
  if (p->context)
    return cfg_fail(r->err, r->n_err, &r->site, "malformed YAML: %s (%s that started at line %zu)%s", problem,
                    p->context, p->context_mark.line + 1, hint);
  return cfg_fail(r->err, r->n_err, &r->site, "malformed YAML: %s%s", problem, hint);
}

static const char *cfg_event_name(const yaml_event_t *ev) {
  switch (ev->type) {
    case YAML_SCALAR_EVENT: return "a scalar";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "the end of a block";
  }
}

static const char *cfg_scalar(const yaml_event_t *ev) { return (const char *)ev->data.scalar.value; }

static int cfg_is_null_scalar(const yaml_event_t *ev) {
  return ev->type == YAML_SCALAR_EVENT && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         (ev->data.scalar.length == 0 || strcmp(cfg_scalar(ev), "~") == 0 || strcmp(cfg_scalar(ev), "null") == 0);
}

// The keys of one section, after its MAPPING_START. seen_line[] catches a key set twice,
// which YAML forbids and which would otherwise let the later line win silently.
static int cfg_read_section(cfg_reader *r, cfg *c, const char *section, size_t *seen_line) {
  char key[CFG_STR];
  for (;;) {
    if (cfg_next(r)) return -1;
    if (r->ev.type == YAML_MAPPING_END_EVENT) return 0;
    if (r->ev.type != YAML_SCALAR_EVENT)
      return cfg_fail(r->err, r->n_err, &r->site, "section '%s': expected a key name, found %s", section,
                      cfg_event_name(&r->ev));
    snprintf(key, sizeof key, "%s", cfg_scalar(&r->ev));
    const cfg_key *k = cfg_find_key(section, key);
    if (!k) return cfg_unknown_key(r->err, r->n_err, &r->site, section, key);
    size_t *seen = &seen_line[k - cfg_keys];
    if (*seen)
      return cfg_fail(r->err, r->n_err, &r->site, "%s.%s is set twice (lines %zu and %zu): keep one", section, key,
                      *seen, r->site.line);
    *seen = r->site.line;
    if (r->key_set) r->key_set[k - cfg_keys] = 1;
    if (cfg_next(r)) return -1;
    if (r->ev.type != YAML_SCALAR_EVENT)
      return cfg_fail(r->err, r->n_err, &r->site, "%s.%s: expected a single value, found %s", section, key,
                      cfg_event_name(&r->ev));
    int plain = r->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (cfg_set_value(c, k, cfg_scalar(&r->ev), plain, &r->site, r->err, r->n_err)) return -1;
  }
}

static int cfg_read_document(cfg_reader *r, cfg *c) {
  size_t seen_line[CFG_N_KEYS] = {0}, section_line[CFG_N_SECTIONS] = {0};
  char section[CFG_STR];
  if (cfg_next(r)) return -1;  // STREAM_START
  if (cfg_next(r)) return -1;
  if (r->ev.type == YAML_STREAM_END_EVENT) return 0;  // empty file: defaults
  if (cfg_next(r)) return -1;                         // the root node, after DOCUMENT_START
  if (cfg_is_null_scalar(&r->ev)) {
    // a document holding nothing but `---` or `~`
  } else if (r->ev.type != YAML_MAPPING_START_EVENT) {
    return cfg_fail(r->err, r->n_err, &r->site,
                    "expected a mapping of sections (model:, parallel:, train:, ...) at the top level, found %s",
                    cfg_event_name(&r->ev));
  } else {
    for (;;) {
      if (cfg_next(r)) return -1;
      if (r->ev.type == YAML_MAPPING_END_EVENT) break;
      if (r->ev.type != YAML_SCALAR_EVENT)
        return cfg_fail(r->err, r->n_err, &r->site, "expected a section name, found %s", cfg_event_name(&r->ev));
      snprintf(section, sizeof section, "%s", cfg_scalar(&r->ev));
      int si = cfg_find_section(section);
      if (si < 0) return cfg_unknown_section(r->err, r->n_err, &r->site, section);
      // As for a key set twice: YAML forbids it, and libyaml would let the second win silently.
      if (section_line[si])
        return cfg_fail(r->err, r->n_err, &r->site, "section '%s' appears twice (lines %zu and %zu): merge its keys "
                        "into one section", section, section_line[si], r->site.line);
      section_line[si] = r->site.line;
      if (cfg_next(r)) return -1;
      if (cfg_is_null_scalar(&r->ev)) continue;  // `model:` with nothing under it
      if (r->ev.type != YAML_MAPPING_START_EVENT)
        return cfg_fail(r->err, r->n_err, &r->site,
                        "section '%s' must be a mapping of indented `key: value` lines, found %s", section,
                        cfg_event_name(&r->ev));
      if (cfg_read_section(r, c, section, seen_line)) return -1;
    }
  }
  if (cfg_next(r)) return -1;  // DOCUMENT_END
  if (cfg_next(r)) return -1;
  if (r->ev.type != YAML_STREAM_END_EVENT)
    return cfg_fail(r->err, r->n_err, &r->site, "a second YAML document starts here; a config holds one");
  return 0;
}

// A config is plain YAML: anchors (&name), aliases (*name, so merge keys `<<: *name` too) and
// tags (!!str, !custom) are refused at the line that uses them, so a value is always the text
// at its key. -1 with the message, else 0.
static int cfg_refuse_yaml_extras(cfg_reader *r) {
  const yaml_event_t *ev = &r->ev;
  const yaml_char_t *anchor = NULL, *tag = NULL;
  if (ev->type == YAML_ALIAS_EVENT)
    return cfg_fail(r->err, r->n_err, &r->site, "YAML alias '*%s' is not supported: write the value out at each "
                    "key", (const char *)ev->data.alias.anchor);
  if (ev->type == YAML_SCALAR_EVENT) {
    anchor = ev->data.scalar.anchor;
    tag = ev->data.scalar.tag;
  } else if (ev->type == YAML_MAPPING_START_EVENT) {
    anchor = ev->data.mapping_start.anchor;
    tag = ev->data.mapping_start.tag;
  } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
    anchor = ev->data.sequence_start.anchor;
    tag = ev->data.sequence_start.tag;
  }
  char shortbuf[72];
  if (anchor)
    return cfg_fail(r->err, r->n_err, &r->site, "YAML anchor '&%s' is not supported: write the value out at each "
                    "key", cfg_shorten((const char *)anchor, shortbuf, sizeof shortbuf));
  if (tag)
    return cfg_fail(r->err, r->n_err, &r->site, "YAML tag '%s' is not supported: write the plain value (each key's "
                    "type is fixed, docs/config.md)", cfg_shorten((const char *)tag, shortbuf, sizeof shortbuf));
  return 0;
}

// Runs cfg_read_document (or, with c NULL, only the parser to the end of the stream) over
// n_text bytes of text; name is what messages call it.
static int cfg_parse_pass(cfg *c, const char *text, size_t n_text, const char *name, unsigned char *key_set, char *err,
                          size_t n_err) {
  cfg_reader r;
  memset(&r, 0, sizeof r);
  r.site.name = name;
  r.err = err;
  r.n_err = n_err;
  r.text = text;
  r.n_text = n_text;
  r.key_set = key_set;
  if (!yaml_parser_initialize(&r.parser)) return cfg_fail(err, n_err, &r.site, "cannot initialise the YAML parser");
  yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, n_text);
  int rc = 0;
  int depth = 0;
  if (c)
    rc = cfg_read_document(&r, c);
  else
    do {
      rc = cfg_next(&r) || cfg_refuse_yaml_extras(&r) ? -1 : 0;
      if (rc) break;
      if (r.ev.type == YAML_MAPPING_START_EVENT || r.ev.type == YAML_SEQUENCE_START_EVENT) {
        if (++depth > CFG_MAX_DEPTH)
          rc = cfg_fail(err, n_err, &r.site, "YAML nested deeper than %d levels; a config is sections of keys "
                        "(two levels)", CFG_MAX_DEPTH);
      } else if (r.ev.type == YAML_MAPPING_END_EVENT || r.ev.type == YAML_SEQUENCE_END_EVENT) {
        depth--;
      }
    } while (rc == 0 && r.ev.type != YAML_STREAM_END_EVENT);
  if (r.have_ev) yaml_event_delete(&r.ev);
  yaml_parser_delete(&r.parser);
  return rc;
}

// Events stream out before libyaml has seen the rest of the text, so in one pass a value
// like `n_layers: a: b` would be reported as "expected an integer, found 'a'". A first pass
// over the whole text makes a syntax error win, with libyaml's own words and line.
// key_set (CFG_N_KEYS, or NULL) marks the keys the text sets.
static int cfg_read_yaml(cfg *c, const char *text, size_t n_text, const char *name, unsigned char *key_set, char *err,
                         size_t n_err) {
  if (cfg_parse_pass(NULL, text, n_text, name, NULL, err, n_err)) return -1;
  return cfg_parse_pass(c, text, n_text, name, key_set, err, n_err);
}

// The whole file, NUL-terminated, in a malloc'd buffer (config files are small); reading stops
// past CFG_MAX_FILE_BYTES, which the caller refuses.
static char *cfg_read_file(FILE *f, size_t *n_text) {
  size_t n = 0, cap = 4096;
  char *buf = malloc(cap);
  while (buf && n <= CFG_MAX_FILE_BYTES) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    char *grown = realloc(buf, cap *= 2);
    if (!grown) free(buf);
    buf = grown;
  }
  if (!buf || ferror(f)) return free(buf), NULL;
  buf[n] = '\0';
  *n_text = n;
  return buf;
}

static int cfg_apply_override(cfg *c, char *arg, unsigned char *key_set, char *err, size_t n_err) {
  cfg_site s = {.override = arg};
  char section[CFG_STR], key[CFG_STR];
  const char *eq = strchr(arg, '=');
  const char *dot = eq ? memchr(arg, '.', (size_t)(eq - arg)) : NULL;
  if (!eq || !dot || dot == arg || dot + 1 == eq || (size_t)(eq - arg) >= CFG_STR) {
    // A bare key name (`dim=64`) gets its section suggested when only one section has it.
    const cfg_key *only = NULL;
    int n_match = 0;
    size_t n_name = eq ? (size_t)(eq - arg) : strlen(arg);
    for (int i = 0; !dot && i < CFG_N_KEYS; i++)
      if (strlen(cfg_keys[i].key) == n_name && strncmp(cfg_keys[i].key, arg, n_name) == 0)
        only = &cfg_keys[i], n_match++;
    if (n_match == 1)
      return cfg_fail(err, n_err, &s, "expected section.key=value (did you mean '%s.%s'?)", only->section, only->key);
    return cfg_fail(err, n_err, &s, "expected section.key=value");
  }
  snprintf(section, sizeof section, "%.*s", (int)(dot - arg), arg);
  snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
  if (cfg_find_section(section) < 0) return cfg_unknown_section(err, n_err, &s, section);
  const cfg_key *k = cfg_find_key(section, key);
  if (!k) return cfg_unknown_key(err, n_err, &s, section, key);
  key_set[k - cfg_keys] = 1;
  return cfg_set_value(c, k, eq + 1, 0, &s, err, n_err);
}

// ---------------------------------------------------------------------------------------------
// Public interface

// model.from: the model keys set in the file or by overrides (marked in key_set), by name, for
// cfg_resolve_model_from (app/config_from.c).
static int cfg_apply_model_from(cfg *c, const unsigned char *key_set, char *err, size_t n_err) {
  if (!c->model_from[0]) return 0;
  const char *set[CFG_N_KEYS];
  int n_set = 0;
  for (int i = 0; i < CFG_N_KEYS; i++)
    if (key_set[i] && strcmp(cfg_keys[i].section, "model") == 0) set[n_set++] = cfg_keys[i].key;
  return cfg_resolve_model_from(c, set, n_set, err, n_err);
}

int cfg_load(cfg *c, const char *path, int n_overrides, char **overrides, char *err, size_t n_err) {
  unsigned char key_set[CFG_N_KEYS] = {0};
  cfg_set_defaults(c);
  if (err && n_err) err[0] = '\0';
  if (path) {
    cfg_site s = {.name = path};
    if (strlen(path) >= CFG_STR)
      return cfg_fail(err, n_err, &s, "config path is longer than %d bytes: use a shorter path", CFG_STR - 1);
    snprintf(c->path, sizeof c->path, "%s", path);
    // Non-blocking, so that a FIFO does not wait for a writer before fstat refuses it.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return cfg_fail(err, n_err, &s, "cannot open config file: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return cfg_fail(err, n_err, &s, "config file is %s, not a regular file: expected a YAML file",
                      S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                      : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not readable as a file");
    }
    if (st.st_size > CFG_MAX_FILE_BYTES) {
      close(fd);
      return cfg_fail(err, n_err, &s, "config file is %lld bytes, more than the %d (1 MiB) a config may hold: "
                      "expected a YAML file of sections and keys", (long long)st.st_size, CFG_MAX_FILE_BYTES);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
      int open_errno = errno;
      close(fd);
      return cfg_fail(err, n_err, &s, "cannot open config file: %s", strerror(open_errno));
    }
    size_t n_text = 0;
    char *text = cfg_read_file(f, &n_text);
    int read_errno = errno;
    fclose(f);
    if (!text) return cfg_fail(err, n_err, &s, "cannot read config file: %s", strerror(read_errno));
    if (n_text > CFG_MAX_FILE_BYTES) {  // it grew after fstat
      free(text);
      return cfg_fail(err, n_err, &s, "config file is more than the %d bytes (1 MiB) a config may hold",
                      CFG_MAX_FILE_BYTES);
    }
    int rc = cfg_read_yaml(c, text, n_text, path, key_set, err, n_err);
    free(text);
    if (rc) return -1;
  }
  for (int i = 0; i < n_overrides; i++)
    if (cfg_apply_override(c, overrides[i], key_set, err, n_err)) return -1;
  return cfg_apply_model_from(c, key_set, err, n_err);
}

// A stored config with its replaced keys' lines rewritten to their successors (cfg_replaced),
// in a malloc'd copy; lines keep their numbers.
static char *cfg_upgrade_stored(const char *yaml) {
  size_t n = strlen(yaml), cap = n + 1;
  for (size_t i = 0; i < sizeof cfg_replaced / sizeof *cfg_replaced; i++) cap += 64;
  char *out = malloc(cap), *o = out;
  if (!out) return NULL;
  for (const char *line = yaml; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line + 1) : strlen(line);
    const char *repl = NULL;
    for (size_t i = 0; i < sizeof cfg_replaced / sizeof *cfg_replaced; i++) {
      char old[96];
      snprintf(old, sizeof old, "  %s: ", cfg_replaced[i].key);
      if (strncmp(line, old, strlen(old)) == 0)
        repl = strncmp(line + strlen(old), "true", 4) == 0 ? cfg_replaced[i].stored_true : cfg_replaced[i].stored_false;
    }
    if (repl) o += sprintf(o, "%s%s", repl, end ? "\n" : "");
    else memcpy(o, line, len), o += len;
    line += len;
  }
  *o = '\0';
  return out;
}

int cfg_load_string(cfg *c, const char *yaml, const char *name, char *err, size_t n_err) {
  cfg_set_defaults(c);
  if (err && n_err) err[0] = '\0';
  if (!name) name = "<config text>";
  snprintf(c->path, sizeof c->path, "%s", name);
  char *text = cfg_upgrade_stored(yaml ? yaml : "");
  if (!text) return cfg_fail(err, n_err, NULL, "%s: out of memory reading the config", name);
  int rc = cfg_read_yaml(c, text, strlen(text), name, NULL, err, n_err);
  free(text);
  return rc;
}

const char *const *cfg_list_choices(const char *name) {
  char section[CFG_STR];
  const char *dot = strchr(name, '.');
  if (!dot || (size_t)(dot - name) >= sizeof section) return NULL;
  snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
  const cfg_key *k = cfg_find_key(section, dot + 1);
  return k ? k->words : NULL;
}

int cfg_check_ranges(const cfg *c, char *err, size_t n_err) {
  for (int i = 0; i < CFG_N_KEYS; i++) {
    const cfg_key *k = &cfg_keys[i];
    const char *v = (const char *)c + k->offset;
    if (k->type == CFG_T_FLOAT) {
      float x = *(const float *)v;
      if (!(x >= (float)k->min && x <= (float)k->max))
        return cfg_fail(err, n_err, NULL, "%s.%s = %.9g is out of range [%.10g, %.10g]", k->section, k->key,
                        (double)x, k->min, k->max);
    } else if (k->type == CFG_T_INT || k->type == CFG_T_BOOL) {
      int x = *(const int *)v;
      if (!(x >= k->min && x <= k->max))
        return cfg_fail(err, n_err, NULL, "%s.%s = %d is out of range [%.10g, %.10g]", k->section, k->key, x,
                        k->min, k->max);
    } else if (k->type == CFG_T_CHOICE) {
      int x = *(const int *)v, n = cfg_n_words(k->words);
      char words[256];
      if (x < 0 || x >= n)
        return cfg_fail(err, n_err, NULL, "%s.%s = %d is out of range [0, %d] (the enum of: %s)", k->section, k->key,
                        x, n - 1, cfg_join_words(k->words, words, sizeof words));
    }
  }
  return 0;
}

// Appends to a buffer that may be too small, counting what the whole text needs.
typedef struct cfg_out {
  char *buf;
  size_t n_buf, n;
} cfg_out;

static void cfg_put(cfg_out *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = o->n < o->n_buf ? o->buf + o->n : NULL;
  int n = vsnprintf(dst, dst ? o->n_buf - o->n : 0, fmt, ap);
  va_end(ap);
  if (n > 0) o->n += (size_t)n;
}

// Strings are always double-quoted, so values like "yes", "123", "" or "a: b" come back as the
// same string. UTF-8 characters pass through, except those YAML does not allow in a file or
// reads as line breaks (controls, U+0085, U+2028, U+2029, U+FEFF, U+FFFE, U+FFFF), which are
// written as escapes of the same code point. Bytes
// that are not UTF-8 (a struct filled by code; loading refuses them) become \xNN escapes.
static void cfg_put_string(cfg_out *o, const char *s) {
  cfg_put(o, "\"");
  for (const unsigned char *q = (const unsigned char *)s; *q;) {
    uint32_t cp = 0;
    int n = cfg_utf8_next(q, &cp);
    if (n == 0)
      cfg_put(o, "\\x%02x", *q), n = 1;
    else if (cp == '"' || cp == '\\')
      cfg_put(o, "\\%c", (int)cp);
    else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
      cfg_put(o, "\\x%02x", (unsigned)cp);
    else if (cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe || cp == 0xffff)
      cfg_put(o, "\\u%04x", (unsigned)cp);
    else
      cfg_put(o, "%.*s", n, (const char *)q);
    q += n;
  }
  cfg_put(o, "\"");
}

size_t cfg_to_yaml(const cfg *c, char *buf, size_t n_buf) {
  cfg_out o = {buf, n_buf, 0};
  if (buf && n_buf) buf[0] = '\0';
  for (int i = 0; i < CFG_N_KEYS; i++) {
    const cfg_key *k = &cfg_keys[i];
    const char *p = (const char *)c + k->offset;
    if (i == 0 || strcmp(k->section, cfg_keys[i - 1].section) != 0) cfg_put(&o, "%s:\n", k->section);
    cfg_put(&o, "  %s: ", k->key);
    switch (k->type) {
      case CFG_T_INT: cfg_put(&o, "%d", *(const int *)p); break;
      case CFG_T_BOOL: cfg_put(&o, "%s", *(const int *)p ? "true" : "false"); break;
      case CFG_T_FLOAT: {  // the shortest text that reads back as the same float: 3e-4 stays 0.0003
        char text[32];
        json_float_text(*(const float *)p, text);
        cfg_put(&o, "%s", text);
        break;
      }
      case CFG_T_UINT64: cfg_put(&o, "%" PRIu64, *(const uint64_t *)p); break;
      case CFG_T_STRING: cfg_put_string(&o, p); break;
      case CFG_T_CHOICE: {  // the word, quoted as strings are; a struct filled by code may hold any number
        int x = *(const int *)p;
        if (x >= 0 && x < cfg_n_words(k->words)) cfg_put_string(&o, k->words[x]);
        else cfg_put(&o, "%d", x);
        break;
      }
    }
    cfg_put(&o, "\n");
  }
  // Too small: the contract is to return the size needed (the caller retries with n + 1).
  if (buf && n_buf && o.n >= n_buf) buf[n_buf - 1] = '\0';
  return o.n;
}
