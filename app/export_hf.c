// export_hf: a trainer checkpoint as a Hugging Face Llama model directory that
// transformers' LlamaForCausalLM.from_pretrained(OUT_DIR) loads.
//   build/export_hf CKPT OUT_DIR [--dtype bf16|fp32] [--force] [--shard-mb N] [--tokenizer JSON]
// Writes OUT_DIR/config.json and the weights in safetensors: model.safetensors, or past
// --shard-mb (MB = 10^6 bytes, default 5000, as the Hub's 5GB) files model-0000k-of-0000n.safetensors
// with model.safetensors.index.json; with --tokenizer, that tokenizer.json beside them, so that
// AutoTokenizer loads the export too. One tensor is in memory at a time. docs/hf.md.
#include "app/config.h"
#include "data/bpe.h"
#include "kernels/base/check.h"
#include "kernels/base/fs.h"
#include "model/format/ckpt.h"
#include "model/format/hf.h"
#include "model/format/hf_config.h"
#include "model/format/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct export_args {
  const char *ckpt, *out, *tokenizer;
  st_dtype dtype;
  int force;
  double shard_mb;
} export_args;

static void usage(void) {
  fprintf(stderr,
          "usage: export_hf CKPT OUT_DIR [--dtype bf16|fp32] [--force] [--shard-mb N] [--tokenizer JSON]\n"
          "  writes the model of trainer checkpoint CKPT as a Hugging Face Llama directory (docs/hf.md)\n"
          "  --dtype      weights in fp32 (default, exact) or bf16 (rounded to nearest even)\n"
          "  --force      write into OUT_DIR even if it exists (its earlier export files are replaced)\n"
          "  --shard-mb N largest safetensors file in MB (10^6 bytes) before sharding; default 5000\n"
          "  --tokenizer JSON  the tokenizer.json the data was prepared with, copied into OUT_DIR\n");
}

// 0, or 2 after printing what is wrong with the command line.
static int parse_args(export_args *a, int argc, char **argv) {
  *a = (export_args){.dtype = ST_F32, .shard_mb = 5000};
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "--force") == 0) {
      a->force = 1;
    } else if (strcmp(s, "--dtype") == 0 && i + 1 < argc) {
      const char *d = argv[++i];
      if (strcmp(d, "fp32") && strcmp(d, "bf16"))
        return fprintf(stderr, "error: --dtype %s: expected fp32 or bf16\n", d), 2;
      a->dtype = strcmp(d, "bf16") == 0 ? ST_BF16 : ST_F32;
    } else if (strcmp(s, "--tokenizer") == 0 && i + 1 < argc) {
      a->tokenizer = argv[++i];
    } else if (strcmp(s, "--shard-mb") == 0 && i + 1 < argc) {
      char *end = NULL;
      a->shard_mb = strtod(argv[++i], &end);
      if (!end || *end || !(a->shard_mb > 0) || a->shard_mb > 1e9)
        return fprintf(stderr, "error: --shard-mb %s: expected a number of MB above 0\n", argv[i]), 2;
    } else if (s[0] == '-') {
      return fprintf(stderr, "error: unknown or incomplete option '%s'\n", s), usage(), 2;
    } else if (!a->ckpt) {
      a->ckpt = s;
    } else if (!a->out) {
      a->out = s;
    } else {
      return fprintf(stderr, "error: unexpected argument '%s'\n", s), usage(), 2;
    }
  }
  if (!a->out) return usage(), 2;
  return 0;
}

// The model config stored in the checkpoint. 0, or -1 with a message.
static int read_config(const char *ckpt, cfg *c, int64_t *step, char *err, size_t n_err) {
  struct stat st;
  if (stat(ckpt, &st) != 0)
    return snprintf(err, n_err, "cannot open checkpoint %s (%s): expected a trainer checkpoint such as "
                    "ckpt/ckpt_00001000.h5", ckpt, strerror(errno)), -1;
  ckpt_meta meta = {0};
  if (ckpt_load(ckpt, MPI_COMM_SELF, NULL, 0, &meta, err, n_err) != 0) return -1;
  char msg[1024];
  int rc = cfg_load_string(c, meta.config_yaml, ckpt, msg, sizeof msg);
  if (rc == 0) rc = cfg_validate(c, 0, msg, sizeof msg);
  if (rc != 0) snprintf(err, n_err, "the config stored in %s does not load: %s", ckpt, msg);
  *step = meta.step;
  free((void *)meta.config_yaml);
  return rc;
}

static int prepare_dir(const char *out, int force, char *err, size_t n_err) {
  struct stat st;
  if (stat(out, &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      return snprintf(err, n_err, "%s exists and is not a directory: choose another output path", out), -1;
    if (!force)
      return snprintf(err, n_err, "%s exists: pass --force to write the export into it (replacing an earlier "
                      "export's files), or choose a new path", out), -1;
    return 0;
  }
  if (fs_make_dirs(out, NULL, 0) != 0) return snprintf(err, n_err, "cannot create %s (%s)", out, strerror(errno)), -1;
  return 0;
}

// Whether name is a file an export writes (weights, index), and is not among the n_shards just written.
static int is_stale(const char *name, int n_shards) {
  int a = 0, b = 0, used = 0;
  if (strcmp(name, HF_SINGLE_FILE) == 0) return n_shards > 1;
  if (strcmp(name, HF_INDEX_FILE) == 0) return n_shards <= 1;
  if (sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && name[used] == '\0')
    return n_shards <= 1 || b != n_shards;
  return 0;
}

// An earlier export in the same directory must not leave weights a loader would pick instead.
static void remove_stale(const char *out, int n_shards) {
  DIR *d = opendir(out);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!is_stale(e->d_name, n_shards)) continue;
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", out, e->d_name);
    if (unlink(path) == 0) printf("export_hf: removed %s of an earlier export\n", path);
  }
  closedir(d);
}

// The whole tensor `model/<name>` of the checkpoint, as fp32.
static int load_tensor(const char *ckpt, const hf_tensor *t, float *buf, char *err, size_t n_err) {
  ckpt_tensor ct = {.ndim = t->ndim, .data = buf};
  snprintf(ct.name, sizeof ct.name, "model/%s", t->name);
  for (int d = 0; d < t->ndim; d++) ct.full[d] = ct.count[d] = t->full[d];
  return ckpt_load(ckpt, MPI_COMM_SELF, &ct, 1, NULL, err, n_err);
}

// Writes shard k: every tensor whose shard_of is k, in list order.
static int write_shard(const export_args *a, const hf_tensor *list, const st_entry *entries, const int *shard_of, int n,
                       int k, int n_shards, float *buf, char *err, size_t n_err) {
  char name[64], path[1200];
  hf_shard_name(k, n_shards, name, sizeof name);
  snprintf(path, sizeof path, "%s/%s", a->out, name);
  int first = 0, count = 0;
  while (shard_of[first] != k) first++;
  while (first + count < n && shard_of[first + count] == k) count++;
  st_writer w;
  if (st_writer_open(&w, path, entries + first, count, err, n_err) != 0) return -1;
  for (int i = first; i < first + count; i++) {
    if (load_tensor(a->ckpt, &list[i], buf, err, n_err) != 0 || st_writer_put(&w, buf, err, n_err) != 0) {
      st_writer_abort(&w);
      return -1;
    }
  }
  if (st_writer_close(&w, err, n_err) != 0) return -1;
  printf("export_hf: wrote %s (%d tensors, %.1f MB)\n", path, count, w.n_data_bytes / 1e6);
  return 0;
}

// The tokenizer at path, checked (it loads; its ids fit the model's vocab_size), copied to
// dir/tokenizer.json. 0 or -1.
static int copy_tokenizer(const char *path, const model_config *mc, const char *dir, char *err, size_t n_err) {
  bpe *b = bpe_load(path, err, n_err);
  if (!b) return -1;
  int32_t n = bpe_vocab_size(b);
  bpe_free(b);
  if (n > mc->vocab_size)
    return snprintf(err, n_err, "tokenizer %s has %d tokens, more than the model's vocab_size %d: it is not the one "
                    "the model was trained with", path, n, mc->vocab_size), -1;
  char dst[4352];
  snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
  if (fs_copy_file(path, dst) != 0)
    return snprintf(err, n_err, "cannot copy %s into %s: %s", path, dir, strerror(errno)), -1;
  printf("export_hf: wrote %s (%d tokens)\n", dst, n);
  return 0;
}

static int export_model(const export_args *a, char *err, size_t n_err) {
  cfg c;
  int64_t step = 0;
  if (read_config(a->ckpt, &c, &step, err, n_err) != 0 || prepare_dir(a->out, a->force, err, n_err) != 0) return -1;
  if (a->tokenizer && copy_tokenizer(a->tokenizer, &c.model, a->out, err, n_err) != 0) return -1;
  hf_tensor *list = NULL;
  int n = hf_tensor_list(&c.model, &list);
  st_entry *entries = XCALLOC((size_t)n, sizeof(st_entry));
  int64_t *n_bytes = XCALLOC((size_t)n, sizeof(int64_t)), total = 0, max_elem = 0, n_params = 0;
  int *shard_of = XCALLOC((size_t)n, sizeof(int));
  for (int i = 0; i < n; i++) {
    st_entry *e = &entries[i];
    snprintf(e->name, sizeof e->name, "%s", list[i].hf_name);
    e->dtype = a->dtype;
    e->ndim = list[i].ndim;
    int64_t n_elem = 1;
    for (int d = 0; d < e->ndim; d++) n_elem *= e->shape[d] = list[i].full[d];
    n_bytes[i] = st_entry_bytes(e);
    total += n_bytes[i];
    n_params += n_elem;
    if (n_elem > max_elem) max_elem = n_elem;
  }
  int n_shards = hf_plan_shards(n_bytes, n, (int64_t)(a->shard_mb * 1e6), shard_of);
  float *buf = XMALLOC((size_t)max_elem * sizeof(float));
  int rc = 0;
  for (int k = 0; k < n_shards && rc == 0; k++)
    rc = write_shard(a, list, entries, shard_of, n, k, n_shards, buf, err, n_err);
  if (rc == 0 && n_shards > 1) rc = hf_write_index(a->out, list, shard_of, n, n_shards, total, err, n_err);
  if (rc == 0) rc = hf_write_config(a->out, &c.model, a->dtype == ST_BF16 ? "bfloat16" : "float32", err, n_err);
  if (rc == 0) {
    remove_stale(a->out, n_shards);
    printf("export_hf: %s (step %lld): %d tensors, %.2fM parameters in %s, %d file%s in %s\n", a->ckpt,
           (long long)step, n, n_params / 1e6, a->dtype == ST_BF16 ? "bf16" : "fp32", n_shards, n_shards > 1 ? "s" : "",
           a->out);
  }
  free(buf);
  free(shard_of);
  free(n_bytes);
  free(entries);
  free(list);
  return rc;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  export_args a;
  int rc = parse_args(&a, argc, argv);
  if (rc == 0) {
    char err[2048] = "";
    if (export_model(&a, err, sizeof err) != 0) {
      fprintf(stderr, "error: %s\n", err);
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
