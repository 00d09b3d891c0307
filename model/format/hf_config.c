// A Hugging Face Llama's config.json (hf_config.h): the field table, the reader, the check of
// checkpoint.init_from and the writer of the export.
#include "model/format/hf_config.h"
#include "kernels/base/check.h"
#include "model/format/hf.h"
#include "kernels/base/json.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_OFF(member) offsetof(model_config, member)

// In the order the checks report them; defaults are transformers' LlamaConfig's.
const hf_field hf_fields[] = {
    {"hidden_size", "model.dim", HF_INT, HF_OFF(dim), 1, 0, 1},
    {"intermediate_size", "model.ffn_dim", HF_INT, HF_OFF(ffn_dim), 1, 0, 1},
    {"num_hidden_layers", "model.n_layers", HF_INT, HF_OFF(n_layers), 1, 0, 1},
    {"num_attention_heads", "model.n_heads", HF_INT, HF_OFF(n_heads), 1, 0, 1},
    {"num_key_value_heads", "model.n_kv_heads", HF_INT, HF_OFF(n_kv_heads), 0, 0, 1},
    {"vocab_size", "model.vocab_size", HF_INT, HF_OFF(vocab_size), 1, 0, 1},
    {"tie_word_embeddings", "model.tie_embeddings", HF_BOOL, HF_OFF(tie_embeddings), 0, 0, 1},
    {"rms_norm_eps", "model.norm_eps", HF_FLOAT, HF_OFF(norm_eps), 0, 1e-6, 1},
    {"rope_theta", "model.rope_theta", HF_FLOAT, HF_OFF(rope_theta), 0, 1e4, 1},
    {"max_position_embeddings", "model.seq_len", HF_INT, HF_OFF(seq_len), 0, 2048, 0},
    {"initializer_range", "model.init_std", HF_FLOAT, HF_OFF(init_std), 0, 0.02, 0},
};
const int hf_n_fields = (int)(sizeof hf_fields / sizeof hf_fields[0]);

// Fields that change nothing the trainer computes.
static const char *const hf_metadata[] = {"_name_or_path", "torch_dtype", "dtype", "transformers_version", "use_cache",
                                          "bos_token_id", "eos_token_id", "pad_token_id"};

// The bit of hf_config.present of the field named hf_key.
static unsigned hf_bit(const char *hf_key) {
  for (int f = 0; f < hf_n_fields; f++)
    if (strcmp(hf_fields[f].hf_key, hf_key) == 0) return 1u << f;
  CHECK(0, "no config.json field %s in hf_fields", hf_key);
  return 0;
}

static int *hf_int_of(const hf_field *f, model_config *mc) { return (int *)((char *)mc + f->offset); }
static float *hf_float_of(const hf_field *f, model_config *mc) { return (float *)((char *)mc + f->offset); }

void hf_field_text(const hf_field *f, const model_config *mc, char buf[32]) {
  model_config *m = (model_config *)mc;
  if (f->type == HF_FLOAT) json_float_text(*hf_float_of(f, m), buf);
  else if (f->type == HF_BOOL) snprintf(buf, 32, "%s", *hf_int_of(f, m) ? "true" : "false");
  else snprintf(buf, 32, "%d", *hf_int_of(f, m));
}

int hf_field_equal(const hf_field *f, const model_config *a, const model_config *b) {
  model_config *x = (model_config *)a, *y = (model_config *)b;
  if (f->type == HF_FLOAT) return *hf_float_of(f, x) == *hf_float_of(f, y);
  return *hf_int_of(f, x) == *hf_int_of(f, y);
}

// ---------------------------------------------------------------------------------------------
// Reading

static int hf_check_arch(const json_value *c, const char *path, char *err, size_t n_err) {
  const json_value *a = json_get(c, "architectures"), *mt = json_get(c, "model_type");
  int llama = a && a->type == JSON_ARRAY && a->n >= 1;
  for (size_t k = 0; llama && k < a->n; k++)
    llama = a->items[k].type == JSON_STRING && strcmp(a->items[k].string, "LlamaForCausalLM") == 0;
  if (!llama) {
    const char *found = a && a->type == JSON_ARRAY && a->n && a->items[0].type == JSON_STRING ? a->items[0].string
                                                                                               : "(none)";
    return check_errf(err, n_err, "%s: architectures is [\"%s\"%s], expected [\"LlamaForCausalLM\"]: only Llama models "
                      "import", path, found, a && a->type == JSON_ARRAY && a->n > 1 ? ", ..." : "");
  }
  if (mt && (mt->type != JSON_STRING || strcmp(mt->string, "llama") != 0))
    return check_errf(err, n_err, "%s: model_type is %s%s%s, expected \"llama\": only Llama models import", path,
                      mt->type == JSON_STRING ? "\"" : "", mt->type == JSON_STRING ? mt->string : json_type_name(mt->type),
                      mt->type == JSON_STRING ? "\"" : "");
  return 0;
}

// One field of hf_fields from its JSON value into hc->mc. 0, or -1 with a message.
static int hf_set_field(hf_config *hc, const hf_field *f, const json_value *v, char *err, size_t n_err) {
  if (f->type == HF_BOOL) {
    if (v->type != JSON_BOOL) return check_errf(err, n_err, "%s: %s is not true or false", hc->path, f->hf_key);
    *hf_int_of(f, &hc->mc) = v->boolean;
  } else if (f->type == HF_INT) {
    if (v->type != JSON_NUMBER || !v->is_int) return check_errf(err, n_err, "%s: %s is not an integer", hc->path, f->hf_key);
    if (v->integer < 1 || v->integer > INT32_MAX)
      return check_errf(err, n_err, "%s: %s is %lld: expected a positive integer", hc->path, f->hf_key,
                        (long long)v->integer);
    *hf_int_of(f, &hc->mc) = (int)v->integer;
  } else {
    float x = v->type == JSON_NUMBER ? (float)v->number : NAN;
    if (!(isfinite(x) && x > 0)) return check_errf(err, n_err, "%s: %s is not a positive number", hc->path, f->hf_key);
    *hf_float_of(f, &hc->mc) = x;
  }
  return 0;
}

// transformers 5's rope_parameters: {"rope_type": "default", "rope_theta": X} is plain RoPE.
static int hf_rope_parameters(hf_config *hc, const json_value *v, float *theta, char *err, size_t n_err) {
  if (v->type == JSON_NULL) return 0;
  if (v->type != JSON_OBJECT) return check_errf(err, n_err, "%s: rope_parameters is not an object", hc->path);
  for (size_t k = 0; k < v->n; k++) {
    const json_value *x = &v->items[k];
    const char *key = v->keys[k];
    if (strcmp(key, "rope_type") == 0 && x->type == JSON_STRING && strcmp(x->string, "default") == 0) continue;
    if (strcmp(key, "rope_theta") == 0 && x->type == JSON_NUMBER && isfinite((float)x->number) && x->number > 0) {
      *theta = (float)x->number;
      continue;
    }
    return check_errf(err, n_err, "%s: rope_parameters.%s is not supported: the trainer has plain rotary embeddings "
                      "(rope_type \"default\" and a positive rope_theta only)", hc->path, key);
  }
  return 0;
}

// A field without a model key: it must hold the plain Llama's value. 1 when key is one of
// them (0 or -1 in *rc), 0 when it is not.
static int hf_fixed_field(const hf_config *hc, const char *key, const json_value *v, int *rc, char *err, size_t n_err) {
  static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
  *rc = 0;
  for (int i = 0; i < 2; i++)
    if (strcmp(key, no_bias[i]) == 0) {
      if (v->type != JSON_BOOL) *rc = check_errf(err, n_err, "%s: %s is not true or false", hc->path, key);
      else if (v->boolean) *rc = check_errf(err, n_err, "%s: %s is true: the trainer's Llama has no biases", hc->path, key);
      return 1;
    }
  if (strcmp(key, "hidden_act") == 0) {
    if (v->type != JSON_STRING || strcmp(v->string, "silu") != 0)
      *rc = check_errf(err, n_err, "%s: hidden_act is not \"silu\": the trainer's MLP is SwiGLU", hc->path);
  } else if (strcmp(key, "rope_scaling") == 0) {
    if (v->type != JSON_NULL)
      *rc = check_errf(err, n_err, "%s: rope_scaling is set: the trainer has plain rotary embeddings only", hc->path);
  } else if (strcmp(key, "attention_dropout") == 0) {
    if (v->type != JSON_NUMBER || v->number != 0)
      *rc = check_errf(err, n_err, "%s: attention_dropout is not 0: the trainer has no dropout", hc->path);
  } else if (strcmp(key, "pretraining_tp") == 0) {
    if (v->type != JSON_NUMBER || v->number != 1)
      *rc = check_errf(err, n_err, "%s: pretraining_tp is not 1: the trainer computes the projections whole", hc->path);
  } else {
    return 0;
  }
  return 1;
}

static int hf_is_metadata(const char *key) {
  for (size_t i = 0; i < sizeof hf_metadata / sizeof hf_metadata[0]; i++)
    if (strcmp(key, hf_metadata[i]) == 0) return 1;
  return 0;
}

// Every member of the object: a field of hf_fields, a fixed field, metadata, or refused.
static int hf_read_fields(hf_config *hc, const json_value *c, float *rope_theta, char *err, size_t n_err) {
  for (size_t k = 0; k < c->n; k++) {
    const char *key = c->keys[k];
    const json_value *v = &c->items[k];
    int f = 0, rc = 0;
    while (f < hf_n_fields && strcmp(hf_fields[f].hf_key, key) != 0) f++;
    if (f < hf_n_fields) {
      if (hf_set_field(hc, &hf_fields[f], v, err, n_err)) return -1;
      hc->present |= 1u << f;
    } else if (strcmp(key, "rope_parameters") == 0) {
      if (hf_rope_parameters(hc, v, rope_theta, err, n_err)) return -1;
    } else if (hf_fixed_field(hc, key, v, &rc, err, n_err)) {
      if (rc) return -1;
    } else if (!hf_is_metadata(key) && strcmp(key, "architectures") != 0 && strcmp(key, "model_type") != 0 &&
               strcmp(key, "head_dim") != 0) {
      return check_errf(err, n_err, "%s: field '%s' is not one the trainer knows: it cannot tell what the field "
                        "changes, so the model does not import (docs/hf.md lists the fields it reads)", hc->path, key);
    }
  }
  return 0;
}

// Absent fields take their defaults; required ones are refused.
static int hf_fill_defaults(hf_config *hc, char *err, size_t n_err) {
  for (int f = 0; f < hf_n_fields; f++) {
    const hf_field *h = &hf_fields[f];
    if (hc->present & (1u << f)) continue;
    if (h->required) return check_errf(err, n_err, "%s has no %s: not a Llama config", hc->path, h->hf_key);
    if (h->type == HF_FLOAT) *hf_float_of(h, &hc->mc) = (float)h->dflt;
    else *hf_int_of(h, &hc->mc) = (int)h->dflt;
  }
  if (!(hc->present & hf_bit("num_key_value_heads"))) hc->mc.n_kv_heads = hc->mc.n_heads;
  return 0;
}

// head_dim, where given, must be what the trainer derives: hidden_size / num_attention_heads.
static int hf_check_head_dim(const hf_config *hc, const json_value *c, char *err, size_t n_err) {
  const json_value *v = json_get(c, "head_dim");
  if (!v || v->type == JSON_NULL) return 0;
  int derived = hc->mc.dim / hc->mc.n_heads;
  if (v->type != JSON_NUMBER || !v->is_int || v->integer != derived || hc->mc.dim % hc->mc.n_heads)
    return check_errf(err, n_err, "%s: head_dim is not hidden_size / num_attention_heads = %d / %d: the trainer's heads "
                      "are model.dim / model.n_heads wide", hc->path, hc->mc.dim, hc->mc.n_heads);
  return 0;
}

int hf_read_config(const char *dir, hf_config *hc, char *err, size_t n_err) {
  memset(hc, 0, sizeof *hc);
  snprintf(hc->path, sizeof hc->path, "%s/%s", dir, HF_CONFIG_FILE);
  struct stat st;
  if (stat(dir, &st) != 0)
    return check_errf(err, n_err, "cannot open %s (%s): expected a Hugging Face model directory", dir, strerror(errno));
  if (stat(hc->path, &st) != 0)
    return check_errf(err, n_err, "%s has no %s: not a Hugging Face model directory (export one with build/export_hf)",
                      dir, HF_CONFIG_FILE);
  json_value *c = json_read_file(hc->path, 1 << 20, 64, err, n_err);
  if (!c) return -1;
  float rope_theta = 0;  // from rope_parameters
  int rc = 0;
  if (c->type != JSON_OBJECT) rc = check_errf(err, n_err, "%s: expected a JSON object", hc->path);
  if (rc == 0) rc = hf_check_arch(c, hc->path, err, n_err);
  if (rc == 0) rc = hf_read_fields(hc, c, &rope_theta, err, n_err);
  if (rc == 0) rc = hf_fill_defaults(hc, err, n_err);
  if (rc == 0) rc = hf_check_head_dim(hc, c, err, n_err);
  if (rc == 0 && rope_theta > 0) {
    int theta_given = json_get(c, "rope_theta") != NULL;
    if (theta_given && rope_theta != hc->mc.rope_theta)
      rc = check_errf(err, n_err, "%s: rope_theta and rope_parameters.rope_theta differ", hc->path);
    hc->mc.rope_theta = rope_theta;
    hc->present |= hf_bit("rope_theta");
  }
  json_free(c);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The check of checkpoint.init_from, and the export's writer

int hf_check_config(const char *dir, const model_config *mc, char *err, size_t n_err) {
  hf_config hc;
  if (hf_read_config(dir, &hc, err, n_err) != 0) return -1;
  for (int f = 0; f < hf_n_fields; f++) {
    const hf_field *h = &hf_fields[f];
    if (!h->weights || hf_field_equal(h, &hc.mc, mc)) continue;
    char have[32], want[32];
    hf_field_text(h, &hc.mc, have);
    hf_field_text(h, mc, want);
    return check_errf(err, n_err, "%s: %s is %s%s but %s is %s: the model section must match the model it starts from "
                      "(set %s=%s, or model.from=hf:%s to take the model section from it)", hc.path, h->hf_key, have,
                      hc.present & (1u << f) ? "" : " (the default)", h->cfg_key, want, h->cfg_key, have, dir);
  }
  return 0;
}

int hf_write_config(const char *dir, const model_config *mc, const char *torch_dtype, char *err, size_t n_err) {
  char *text = NULL, eps[32], theta[32], std[32];
  size_t n_text = 0;
  json_float_text(mc->norm_eps, eps);
  json_float_text(mc->rope_theta, theta);
  json_float_text(mc->init_std, std);
  FILE *m = open_memstream(&text, &n_text);
  CHECK(m != NULL, "open_memstream failed: out of host memory");
  fprintf(m,
          "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
          "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
          "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
          "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"hidden_act\": \"silu\",\n"
          "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n"
          "  \"tie_word_embeddings\": %s,\n  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
          "  \"mlp_bias\": false,\n  \"initializer_range\": %s,\n  \"use_cache\": true,\n  \"torch_dtype\": ",
          mc->dim, mc->ffn_dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->dim / mc->n_heads, mc->vocab_size,
          mc->seq_len, eps, theta, mc->tie_embeddings ? "true" : "false", std);
  json_put_string(m, torch_dtype);
  fprintf(m, "\n}\n");
  CHECK(fclose(m) == 0, "open_memstream: out of host memory");
  int rc = hf_write_file(dir, HF_CONFIG_FILE, text, n_text, err, n_err);
  free(text);
  return rc;
}
