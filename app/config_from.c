// model.from: hf:DIR (config_from.h): the model keys from a Hugging Face Llama's config.json.
#include "app/config_from.h"
#include "kernels/base/check.h"
#include "model/format/hf_config.h"

#include <stdio.h>
#include <string.h>

// Whether cfg_key ("model.dim") is among the keys of section model that were set ("dim").
static int cfg_key_was_set(const char *cfg_key, const char *const *set_keys, int n_set) {
  const char *name = strchr(cfg_key, '.') + 1;
  for (int i = 0; i < n_set; i++)
    if (strcmp(set_keys[i], name) == 0) return 1;
  return 0;
}

static void cfg_copy_field(const hf_field *f, model_config *dst, const model_config *src) {
  memcpy((char *)dst + f->offset, (const char *)src + f->offset, f->type == HF_FLOAT ? sizeof(float) : sizeof(int));
}

// A key set in the config against the directory's value of field f. 0, or -1 with a message.
static int cfg_check_set_key(const hf_field *f, int present, const model_config *set, const hf_config *hc,
                             const char *from, char *err, size_t n_err) {
  char have[32], want[32];
  hf_field_text(f, &hc->mc, have);
  hf_field_text(f, set, want);
  int is_seq_len = strcmp(f->cfg_key, "model.seq_len") == 0;
  if (is_seq_len && set->seq_len <= hc->mc.seq_len) return 0;
  if (is_seq_len)
    return check_errf(err, n_err, "model.seq_len = %s is longer than max_position_embeddings = %s of %s (model.from=%s): "
                      "set model.seq_len to at most %s", want, have, hc->path, from, have);
  if (hf_field_equal(f, set, &hc->mc)) return 0;
  return check_errf(err, n_err, "model.from=%s: %s has %s = %s%s, but the config sets %s = %s: remove %s or set it to %s",
                    from, hc->path, f->hf_key, have, present ? "" : " (the default)", f->cfg_key, want, f->cfg_key, have);
}

int cfg_resolve_model_from(cfg *c, const char *const *set_keys, int n_set, char *err, size_t n_err) {
  const char *from = c->model_from;
  if (strncmp(from, "hf:", 3) != 0 || !from[3])
    return check_errf(err, n_err, "model.from = '%s': expected hf:DIR (a Hugging Face Llama directory whose config.json "
                      "gives the model section) or empty", from);
  hf_config hc;
  char msg[1536];
  if (hf_read_config(from + 3, &hc, msg, sizeof msg) != 0) return check_errf(err, n_err, "model.from: %s", msg);
  for (int f = 0; f < hf_n_fields; f++) {
    const hf_field *h = &hf_fields[f];
    if (!cfg_key_was_set(h->cfg_key, set_keys, n_set)) cfg_copy_field(h, &c->model, &hc.mc);
    else if (cfg_check_set_key(h, hc.present & (1u << f), &c->model, &hc, from, err, n_err) != 0) return -1;
  }
  return 0;
}
