// Hugging Face Llama interop (hf.h): names, the shard plan and index, and reading a model
// directory into this rank's parameter blocks. config.json is model/format/hf_config.c.
#include "model/format/hf.h"
#include "kernels/base/check.h"
#include "kernels/base/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// transformers' LlamaForCausalLM state-dict names of each parameter kind.
static const char *const hf_patterns[MODEL_N_KINDS] = {
    [MODEL_EMBED] = "model.embed_tokens.weight",
    [MODEL_ATTN_NORM] = "model.layers.%d.input_layernorm.weight",
    [MODEL_WQ] = "model.layers.%d.self_attn.q_proj.weight",
    [MODEL_WK] = "model.layers.%d.self_attn.k_proj.weight",
    [MODEL_WV] = "model.layers.%d.self_attn.v_proj.weight",
    [MODEL_WO] = "model.layers.%d.self_attn.o_proj.weight",
    [MODEL_MLP_NORM] = "model.layers.%d.post_attention_layernorm.weight",
    [MODEL_W_GATE] = "model.layers.%d.mlp.gate_proj.weight",
    [MODEL_W_UP] = "model.layers.%d.mlp.up_proj.weight",
    [MODEL_W_DOWN] = "model.layers.%d.mlp.down_proj.weight",
    [MODEL_FINAL_NORM] = "model.norm.weight",
    [MODEL_LM_HEAD] = "lm_head.weight",
};

void hf_tensor_name(model_kind k, int layer, char *out, size_t n_out) {
  CHECK(k >= 0 && k < MODEL_N_KINDS, "hf_tensor_name: kind %d", (int)k);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  if (model_specs[k].per_layer) snprintf(out, n_out, hf_patterns[k], layer);
  else snprintf(out, n_out, "%s", hf_patterns[k]);
#pragma GCC diagnostic pop
}

static void hf_add(hf_tensor *t, const model_config *mc, model_kind k, int layer) {
  t->kind = k;
  t->layer = layer;
  hf_tensor_name(k, layer, t->hf_name, sizeof t->hf_name);
  if (layer >= 0) snprintf(t->name, sizeof t->name, "layers.%d.%s", layer, model_specs[k].name);
  else snprintf(t->name, sizeof t->name, "%s", model_specs[k].name);
  t->ndim = model_full_shape(mc, k, t->full);
}

int hf_tensor_list(const model_config *mc, hf_tensor **out) {
  hf_tensor *t = XCALLOC((size_t)9 * mc->n_layers + 3, sizeof(hf_tensor));
  int n = 0;
  hf_add(&t[n++], mc, MODEL_EMBED, -1);
  for (int l = 0; l < mc->n_layers; l++)
    for (int k = 0; k < MODEL_N_KINDS; k++)
      if (model_specs[k].per_layer) hf_add(&t[n++], mc, (model_kind)k, l);
  hf_add(&t[n++], mc, MODEL_FINAL_NORM, -1);
  if (!mc->tie_embeddings) hf_add(&t[n++], mc, MODEL_LM_HEAD, -1);
  *out = t;
  return n;
}

int hf_plan_shards(const int64_t *n_bytes, int n, int64_t max_bytes, int *shard_of) {
  int shard = 0;
  int64_t used = 0;
  for (int i = 0; i < n; i++) {
    if (used > 0 && used + n_bytes[i] > max_bytes) shard++, used = 0;
    shard_of[i] = shard;
    used += n_bytes[i];
  }
  return n > 0 ? shard + 1 : 0;
}

void hf_shard_name(int k, int n_shards, char *out, size_t n_out) {
  if (n_shards <= 1) snprintf(out, n_out, "%s", HF_SINGLE_FILE);
  else snprintf(out, n_out, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
}

int hf_write_file(const char *dir, const char *name, const char *text, size_t n_text, char *err, size_t n_err) {
  char path[1024], tmp[1040];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return check_errf(err, n_err, "cannot create %s (%s)", tmp, strerror(errno));
  int ok = fwrite(text, 1, n_text, f) == n_text && fflush(f) == 0 && fsync(fileno(f)) == 0;
  int eno = errno;
  ok = fclose(f) == 0 && ok;
  if (ok && rename(tmp, path) != 0) ok = 0, eno = errno;
  if (!ok) {
    unlink(tmp);
    return check_errf(err, n_err, "writing %s failed (%s): is the disk full?", path, strerror(eno));
  }
  return 0;
}

int hf_write_index(const char *dir, const hf_tensor *t, const int *shard_of, int n, int n_shards, int64_t total_bytes,
                   char *err, size_t n_err) {
  char *text = NULL, file[64];
  size_t n_text = 0;
  FILE *m = open_memstream(&text, &n_text);
  CHECK(m != NULL, "open_memstream failed: out of host memory");
  fprintf(m, "{\n  \"metadata\": {\"total_size\": %" PRId64 "},\n  \"weight_map\": {", total_bytes);
  for (int i = 0; i < n; i++) {
    hf_shard_name(shard_of[i], n_shards, file, sizeof file);
    fprintf(m, "%s\n    ", i ? "," : "");
    json_put_string(m, t[i].hf_name);
    fprintf(m, ": ");
    json_put_string(m, file);
  }
  fprintf(m, "\n  }\n}\n");
  CHECK(fclose(m) == 0, "open_memstream: out of host memory");
  int rc = hf_write_file(dir, HF_INDEX_FILE, text, n_text, err, n_err);
  free(text);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Model directories

static int hf_file_exists(const char *dir, const char *name) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0;
}

static int hf_open_file(hf_dir *h, const char *name, char *err, size_t n_err) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", h->dir, name);
  h->files = realloc(h->files, (size_t)(h->n_files + 1) * sizeof *h->files);
  CHECK(h->files != NULL, "out of host memory");
  if (st_open(&h->files[h->n_files], path, err, n_err) != 0) return -1;
  h->n_files++;
  return 0;
}

// The index's weight_map; each file it names is opened once.
static int hf_open_index(hf_dir *h, char *err, size_t n_err) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", h->dir, HF_INDEX_FILE);
  json_value *ix = json_read_file(path, 64 << 20, 64, err, n_err);
  if (!ix) return -1;
  const json_value *map = json_get(ix, "weight_map");
  int rc = 0;
  if (!map || map->type != JSON_OBJECT) rc = check_errf(err, n_err, "%s has no weight_map object", path);
  h->map_names = XCALLOC(map ? map->n + 1 : 1, sizeof(char *));
  h->map_file = XCALLOC(map ? map->n + 1 : 1, sizeof(int));
  for (size_t k = 0; rc == 0 && k < map->n; k++) {
    const json_value *v = &map->items[k];
    if (v->type != JSON_STRING || !v->string[0] || strchr(v->string, '/') || v->string[0] == '.') {
      rc = check_errf(err, n_err, "%s: weight_map[\"%s\"] must name a file in the same directory", path, map->keys[k]);
      break;
    }
    int f = 0;
    while (f < h->n_files && strcmp(strrchr(h->files[f].path, '/') + 1, v->string) != 0) f++;
    if (f == h->n_files && (rc = hf_open_file(h, v->string, err, n_err)) != 0) break;
    h->map_names[k] = strdup(map->keys[k]);
    CHECK(h->map_names[k] != NULL, "out of host memory");
    h->map_file[k] = f;
    h->n_map++;
  }
  json_free(ix);
  return rc;
}

int hf_dir_open(hf_dir *h, const char *dir, char *err, size_t n_err) {
  memset(h, 0, sizeof *h);
  snprintf(h->dir, sizeof h->dir, "%s", dir);
  struct stat st;
  if (stat(dir, &st) != 0)
    return check_errf(err, n_err, "cannot open %s (%s): expected a Hugging Face model directory", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return check_errf(err, n_err, "%s is not a directory: expected a Hugging Face model directory", dir);
  int rc;
  if (hf_file_exists(dir, HF_SINGLE_FILE)) rc = hf_open_file(h, HF_SINGLE_FILE, err, n_err);
  else if (hf_file_exists(dir, HF_INDEX_FILE)) rc = hf_open_index(h, err, n_err);
  else
    rc = check_errf(err, n_err, "%s holds neither %s nor %s: not a Hugging Face model directory in safetensors (export "
                 "one with build/export_hf)", dir, HF_SINGLE_FILE, HF_INDEX_FILE);
  if (rc != 0) hf_dir_close(h);
  return rc;
}

void hf_dir_close(hf_dir *h) {
  for (int k = 0; k < h->n_files; k++) st_close(&h->files[k]);
  for (int k = 0; k < h->n_map; k++) free(h->map_names[k]);
  free(h->files);
  free(h->map_names);
  free(h->map_file);
  h->files = NULL;
  h->map_names = NULL;
  h->map_file = NULL;
  h->n_files = h->n_map = 0;
}

// The file and tensor of an HF name. 0, or -1 with a message.
static int hf_find(const hf_dir *h, const char *name, const st_file **f, const st_tensor **t, char *err, size_t n_err) {
  *f = NULL;
  if (h->n_map == 0) {
    *f = &h->files[0];
  } else {
    for (int k = 0; k < h->n_map && !*f; k++)
      if (strcmp(h->map_names[k], name) == 0) *f = &h->files[h->map_file[k]];
    if (!*f) return check_errf(err, n_err, "%s/%s does not list tensor '%s'", h->dir, HF_INDEX_FILE, name);
  }
  *t = st_find(*f, name);
  if (!*t) return check_errf(err, n_err, "%s has no tensor '%s'%s", (*f)->path, name,
                          strcmp(name, "lm_head.weight") == 0 ? " (a model with tie_word_embeddings has none: check "
                                                                "model.tie_embeddings)" : "");
  return 0;
}

static int hf_check_tensor(const st_file *f, const st_tensor *st, const hf_tensor *t, char *err, size_t n_err) {
  int same = st->ndim == t->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = st->shape[d] == t->full[d];
  if (!same)
    return check_errf(err, n_err, "%s: tensor '%s' has shape (%lld%s%lld) in the file, the config expects (%lld%s%lld)",
                   f->path, t->hf_name, (long long)st->shape[0], st->ndim > 1 ? ", " : "",
                   st->ndim > 1 ? (long long)st->shape[1] : 0LL, (long long)t->full[0], t->ndim > 1 ? ", " : "",
                   t->ndim > 1 ? (long long)t->full[1] : 0LL);
  if (st->dtype != ST_F32 && st->dtype != ST_BF16 && st->dtype != ST_F16)
    return check_errf(err, n_err, "%s: tensor '%s' has dtype %s; weights load from F32, BF16 or F16", f->path, t->hf_name,
                   st_dtype_name(st->dtype));
  return 0;
}

int hf_read_model(const hf_dir *h, const model *m, float *host, char *err, size_t n_err) {
  hf_tensor *list = NULL;
  int n = hf_tensor_list(&m->cfg, &list), rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const st_file *f;
    const st_tensor *st;
    rc = hf_find(h, list[i].hf_name, &f, &st, err, n_err);
    if (rc == 0) rc = hf_check_tensor(f, st, &list[i], err, n_err);
  }
  for (int i = 0; i < m->n_tensors && rc == 0; i++) {
    const model_tensor *mt = &m->tensors[i];
    char name[96];
    const st_file *f;
    const st_tensor *st;
    hf_tensor_name(mt->kind, mt->layer, name, sizeof name);
    rc = hf_find(h, name, &f, &st, err, n_err);
    if (rc == 0) rc = st_read_block(f, st, mt->start, mt->count, host + mt->offset, err, n_err);
  }
  free(list);
  return rc;
}
