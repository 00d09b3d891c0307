// sample: text from a trainer checkpoint, generated in fp32 with a KV cache (model/decode.h) on
// the CPU or a GPU (--device, named as train.device). The prompt is encoded with the byte-level
// vocabulary of the default corpus (docs/data.md: token = byte), the continuation printed as
// text, non-printable bytes escaped; or, with --tokenizer, with the byte-level BPE tokenizer the
// data was prepared with (data/bpe.h; by default the one build/prepare recorded beside the
// checkpoint's data.train shards), the continuation printed as the bytes it decodes to.
//   build/sample CKPT --prompt TEXT [--tokenizer JSON] [--tokens N] [--temperature T] [--top-p P] [--seed S] [--device D]
//   build/sample CKPT --stream-loss [--data GLOB] [--device D]
// --stream-loss prints the mean cross-entropy, decoded token by token through the cache, of the
// global_batch training windows the checkpoint's next step would read: the trainer's step loss.
#include "app/config.h"
#include "app/factory.h"
#include "data/bpe.h"
#include "data/data.h"
#include "kernels/base/check.h"
#include "model/format/ckpt.h"
#include "model/decode.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct sample_args {
  const char *ckpt, *prompt, *data, *tokenizer;
  cfg_device device;
  long tokens;
  float temperature, top_p;
  uint64_t seed;
  int have_seed, stream_loss;
} sample_args;

static void usage(void) {
  fprintf(stderr,
          "usage: sample CKPT --prompt TEXT [--tokenizer JSON] [--tokens N] [--temperature T] [--top-p P] [--seed S] [--device D]\n"
          "       sample CKPT --stream-loss [--data GLOB] [--device D]\n"
          "  generates text from trainer checkpoint CKPT (fp32, KV cache); prompt bytes are tokens\n"
          "  --tokenizer JSON the Hugging Face tokenizer.json the data was prepared with (build/prepare\n"
          "                   --tokenizer): the prompt is encoded and the output decoded with it; default:\n"
          "                   tokenizer.json beside the checkpoint's data.train shards, where prepare wrote one\n"
          "  --tokens N       tokens to generate (default 200; generation also stops at the model's seq_len)\n"
          "  --temperature T  softmax temperature (default 0.8); 0 = greedy\n"
          "  --top-p P        nucleus sampling: keep the most likely tokens up to mass P (default 0.95)\n"
          "  --seed S         seed of the sampler (default: from the clock, printed)\n"
          "  --stream-loss    mean cross-entropy of the training windows the checkpoint's next step reads\n"
          "  --data GLOB      with --stream-loss: the training shards (default: the checkpoint's data.train)\n"
          "  --device D       auto | cpu | cuda, as train.device (default auto: GPU 0 when one is visible); fp32 on\n"
          "                   either, no TF32, so greedy text is the same\n");
}

// Parses a number of the form strtod accepts into *v within [lo, hi]; 0 or -1.
static int parse_num(const char *s, double lo, double hi, double *v) {
  char *end = NULL;
  errno = 0;
  *v = strtod(s, &end);
  return end != s && *end == '\0' && errno == 0 && *v >= lo && *v <= hi ? 0 : -1;
}

static int parse_option(sample_args *a, const char *opt, const char *val) {
  double v;
  if (strcmp(opt, "--prompt") == 0) {
    a->prompt = val;
  } else if (strcmp(opt, "--tokenizer") == 0) {
    a->tokenizer = val;
  } else if (strcmp(opt, "--data") == 0) {
    a->data = val;
  } else if (strcmp(opt, "--device") == 0) {
    int device = cfg_find_choice(cfg_device_names, val);
    if (device < 0) return fprintf(stderr, "error: --device %s: expected auto, cpu or cuda\n", val), 2;
    a->device = (cfg_device)device;
  } else if (strcmp(opt, "--tokens") == 0) {
    if (parse_num(val, 0, 1e9, &v) || v != floor(v))
      return fprintf(stderr, "error: --tokens %s: expected a whole number from 0 to 1e9\n", val), 2;
    a->tokens = (long)v;
  } else if (strcmp(opt, "--temperature") == 0) {
    if (parse_num(val, 0, 100, &v))
      return fprintf(stderr, "error: --temperature %s: expected a number from 0 (greedy) to 100\n", val), 2;
    a->temperature = (float)v;
  } else if (strcmp(opt, "--top-p") == 0) {
    if (parse_num(val, 0, 1, &v) || v == 0)
      return fprintf(stderr, "error: --top-p %s: expected a number above 0 and at most 1\n", val), 2;
    a->top_p = (float)v;
  } else if (strcmp(opt, "--seed") == 0) {
    char *end = NULL;
    errno = 0;
    a->seed = strtoull(val, &end, 10);
    if (end == val || *end || errno || val[0] == '-')
      return fprintf(stderr, "error: --seed %s: expected a whole number from 0 to 2^64-1\n", val), 2;
    a->have_seed = 1;
  } else {
    return fprintf(stderr, "error: unknown option '%s'\n", opt), usage(), 2;
  }
  return 0;
}

// 0, or 2 after printing what is wrong with the command line.
static int parse_args(sample_args *a, int argc, char **argv) {
  *a = (sample_args){.tokens = 200, .temperature = 0.8f, .top_p = 0.95f, .device = CFG_DEVICE_AUTO};
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "--stream-loss") == 0) {
      a->stream_loss = 1;
    } else if (s[0] == '-' && s[1] == '-') {
      if (i + 1 >= argc) return fprintf(stderr, "error: option '%s' needs a value\n", s), usage(), 2;
      int rc = parse_option(a, s, argv[++i]);
      if (rc) return rc;
    } else if (!a->ckpt) {
      a->ckpt = s;
    } else {
      return fprintf(stderr, "error: unexpected argument '%s'\n", s), usage(), 2;
    }
  }
  if (!a->ckpt || (!a->prompt && !a->stream_loss)) return usage(), 2;
  return 0;
}

// The config and data position stored in the checkpoint. 0, or -1 with a message.
static int read_config(const char *ckpt, cfg *c, ckpt_meta *meta, char *err, size_t n_err) {
  struct stat st;
  if (stat(ckpt, &st) != 0)
    return snprintf(err, n_err, "cannot open checkpoint %s (%s): expected a trainer checkpoint such as "
                    "ckpt/ckpt_00001000.h5", ckpt, strerror(errno)), -1;
  if (ckpt_load(ckpt, MPI_COMM_SELF, NULL, 0, meta, err, n_err) != 0) return -1;
  char msg[1024];
  int rc = cfg_load_string(c, meta->config_yaml, ckpt, msg, sizeof msg);
  if (rc == 0) rc = cfg_validate(c, 0, msg, sizeof msg);
  if (rc != 0) snprintf(err, n_err, "the config stored in %s does not load: %s", ckpt, msg);
  free((void *)meta->config_yaml);
  meta->config_yaml = NULL;
  return rc;
}

// The prompt's bytes as tokens, checked against the model's vocabulary and context. 0 or -1.
static int encode_prompt(const char *prompt, const model_config *mc, int32_t *tokens, int *n, char *err,
                         size_t n_err) {
  size_t len = strlen(prompt);
  if (len == 0) return snprintf(err, n_err, "the prompt is empty: give at least one byte"), -1;
  if (len > (size_t)mc->seq_len)
    return snprintf(err, n_err, "the prompt is %zu bytes (tokens), longer than the model's seq_len %d: shorten it",
                    len, mc->seq_len), -1;
  for (size_t i = 0; i < len; i++) {
    int b = (unsigned char)prompt[i];
    if (b >= mc->vocab_size)
      return snprintf(err, n_err, "prompt byte 0x%02x at offset %zu is outside the model's vocabulary (vocab_size %d, "
                      "tokens are bytes): use bytes below %d", b, i, mc->vocab_size, mc->vocab_size), -1;
    tokens[i] = b;
  }
  *n = (int)len;
  return 0;
}

// A token as text: printable ASCII, newline and tab as they are; other bytes as \xHH; ids past
// the byte range as <N>.
static void print_token(int32_t t) {
  if (t > 255)
    printf("<%d>", (int)t);
  else if (t == '\\')
    fputs("\\\\", stdout);
  else if ((t >= 0x20 && t < 0x7f) || t == '\n' || t == '\t')
    putchar(t);
  else
    printf("\\x%02x", (unsigned)t);
}

// The prompt encoded with the tokenizer, checked as encode_prompt does; *ids malloc'd. 0 or -1.
static int encode_prompt_bpe(bpe *tok, const char *prompt, const model_config *mc, int32_t **ids, int *n, char *err,
                             size_t n_err) {
  int64_t n_ids = 0, cap = 0;
  bpe_encode(tok, prompt, strlen(prompt), ids, &n_ids, &cap);
  if (n_ids == 0) return snprintf(err, n_err, "the prompt is empty: give some text"), -1;
  if (n_ids > mc->seq_len)
    return snprintf(err, n_err, "the prompt is %lld tokens, longer than the model's seq_len %d: shorten it",
                    (long long)n_ids, mc->seq_len), -1;
  for (int64_t i = 0; i < n_ids; i++)
    if ((*ids)[i] >= mc->vocab_size)
      return snprintf(err, n_err, "prompt token %d is outside the model's vocabulary (vocab_size %d): the model was "
                      "not trained with this tokenizer", (*ids)[i], mc->vocab_size), -1;
  *n = (int)n_ids;
  return 0;
}

// A token as the bytes the tokenizer decodes it to, or as print_token without one.
static void emit_token(const bpe *tok, int32_t t) {
  if (!tok) {
    print_token(t);
    return;
  }
  char *out = NULL;
  size_t n_out = 0, cap = 0;
  if (bpe_decode(tok, &t, 1, &out, &n_out, &cap) == 0) fwrite(out, 1, n_out, stdout);
  else printf("<%d>", (int)t);
  free(out);
}

// The tokenizer the data was prepared with, where build/prepare recorded it: tokenizer.json in
// the folder of the checkpoint's data.train shards. Written into path (n_path bytes); NULL: none.
static const char *recorded_tokenizer(const cfg *c, char *path, size_t n_path) {
  const char *slash = strrchr(c->data.train, '/');
  int n_dir = slash ? (int)(slash - c->data.train) : 1;
  struct stat st;
  if (snprintf(path, n_path, "%.*s/tokenizer.json", n_dir, slash ? c->data.train : ".") >= (int)n_path ||
      stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return NULL;
  fprintf(stderr, "sample: the tokenizer recorded with the data: %s (--tokenizer names another)\n", path);
  return path;
}

static int generate(const sample_args *a, const cfg *c, decode_model *m, char *err, size_t n_err) {
  const model_config *mc = &m->cfg;
  int32_t *prompt = NULL;
  int n = 0;
  bpe *tok = NULL;
  char recorded[4352];
  const char *tokenizer = a->tokenizer ? a->tokenizer : recorded_tokenizer(c, recorded, sizeof recorded);
  if (tokenizer) {
    if (!(tok = bpe_load(tokenizer, err, n_err))) return -1;
    if (encode_prompt_bpe(tok, a->prompt, mc, &prompt, &n, err, n_err) != 0) return free(prompt), bpe_free(tok), -1;
  } else {
    prompt = XMALLOC((size_t)mc->seq_len * sizeof(int32_t));
    if (encode_prompt(a->prompt, mc, prompt, &n, err, n_err) != 0) return free(prompt), -1;
  }
  decode_rng rng = {a->have_seed ? a->seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32)};
  if (a->temperature > 0)
    fprintf(stderr, "sample: temperature %g, top-p %g, seed %llu\n", a->temperature, a->top_p,
            (unsigned long long)rng.state);
  const float *logits = NULL;
  for (int i = 0; i < n; i++) emit_token(tok, prompt[i]), logits = decode_step(m, prompt[i]);
  long made = 0;
  while (made < a->tokens) {
    int32_t t = decode_sample(logits, mc->vocab_size, a->temperature, a->top_p, &rng);
    emit_token(tok, t);
    fflush(stdout);
    made++;
    if (m->n_pos >= mc->seq_len) break;
    logits = decode_step(m, t);
  }
  putchar('\n');
  if (made < a->tokens)
    fprintf(stderr, "sample: stopped after %ld tokens: the context reached the model's seq_len %d\n", made,
            mc->seq_len);
  free(prompt);
  bpe_free(tok);
  return 0;
}

// The trainer's step loss, by decoding: the mean over the next global_batch windows of the
// cross-entropy of each target given the tokens before it.
static int stream_loss(const sample_args *a, decode_model *m, const cfg *c, int64_t first, char *err, size_t n_err) {
  const model_config *mc = &m->cfg;
  data_loader dl;
  const char *pattern = a->data ? a->data : c->data.train;
  if (data_open(&dl, pattern, mc->seq_len, c->train.seed, err, n_err) != 0) return -1;
  if (dl.max_token >= mc->vocab_size) {
    snprintf(err, n_err, "%s holds token %d, outside the model's vocabulary (vocab_size %d): give the shards the "
             "model was trained on with --data", pattern, (int)dl.max_token, mc->vocab_size);
    return data_close(&dl), -1;
  }
  int T = mc->seq_len, G = c->train.global_batch;
  int32_t *w = XMALLOC((size_t)(T + 1) * sizeof(int32_t));
  double sum = 0.0;
  for (int s = 0; s < G; s++) {
    if (data_get_window(&dl, first + s, w, err, n_err) != 0) {
      free(w);
      return data_close(&dl), -1;
    }
    decode_reset(m);
    for (int t = 0; t < T; t++) {
      const float *lg = decode_step(m, w[t]);
      float mx = lg[0];
      for (int v = 1; v < mc->vocab_size; v++) mx = lg[v] > mx ? lg[v] : mx;
      double se = 0.0;
      for (int v = 0; v < mc->vocab_size; v++) se += exp((double)lg[v] - mx);
      sum += mx + log(se) - lg[w[t + 1]];
    }
  }
  printf("stream loss: samples %lld..%lld (%d windows of %d targets): %.9g\n", (long long)first,
         (long long)(first + G - 1), G, T, sum / ((double)G * T));
  free(w);
  data_close(&dl);
  return 0;
}

static int run(const sample_args *a, char *err, size_t n_err) {
  cfg c;
  ckpt_meta meta = {0};
  if (read_config(a->ckpt, &c, &meta, err, n_err) != 0) return -1;
  k_backend *be = factory_tool_backend(a->device, err, n_err);
  if (!be) return -1;
  int named = strcmp(be->device_name, be->name) != 0;
  fprintf(stderr, "sample: decoding in fp32 on %s%s%s%s\n", be->name, named ? " (" : "", named ? be->device_name : "",
          named ? ")" : "");
  decode_model m;
  int rc = decode_init(&m, be, &c.model, ckpt_read_decode, (void *)a->ckpt, err, n_err);
  if (rc == 0)
    rc = a->stream_loss ? stream_loss(a, &m, &c, meta.samples_seen, err, n_err) : generate(a, &c, &m, err, n_err);
  decode_free(&m);  // safe after a failed decode_init
  k_backend_free(&be);
  return rc;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  sample_args a;
  int rc = parse_args(&a, argc, argv);
  if (rc == 0) {
    char err[2048] = "";
    if (run(&a, err, sizeof err) != 0) {
      fflush(stdout);
      fprintf(stderr, "error: %s\n", err);
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
