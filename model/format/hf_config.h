// A Hugging Face Llama's config.json: written from the model config (the export), read into one
// (model.from: hf:DIR) and checked against one (checkpoint.init_from: hf:DIR). Reading knows
// every field of the file. The fields of hf_fields fill a model_config (an absent optional one
// takes transformers' LlamaConfig default); the fields that change what a Llama computes but
// have no model key (biases, rope scaling, dropout, the activation, head_dim) must hold the
// plain Llama's values; metadata that changes nothing (dtype, token ids, versions) is skipped;
// any other field is refused, naming it, since the trainer cannot tell what it would change.
#ifndef TRAINER_HF_CONFIG_H
#define TRAINER_HF_CONFIG_H

#include <stddef.h>

#include "model/model_config.h"

#define HF_CONFIG_FILE "config.json"

typedef enum hf_field_type { HF_INT, HF_FLOAT, HF_BOOL } hf_field_type;

// A config.json field that a model key holds.
typedef struct hf_field {
  const char *hf_key;   // "hidden_size"
  const char *cfg_key;  // "model.dim"
  hf_field_type type;   // the model_config member is an int (HF_INT, HF_BOOL) or a float
  size_t offset;        // of that member in model_config
  int required;         // absent: refused; else dflt applies
  double dflt;          // transformers' default (num_key_value_heads: num_attention_heads)
  int weights;          // the weights' shapes or their meaning depend on it: checkpoint.init_from checks it
} hf_field;

extern const hf_field hf_fields[];
extern const int hf_n_fields;

// What a config.json says about the model section.
typedef struct hf_config {
  model_config mc;   // every field of hf_fields; the other members zero
  unsigned present;  // bit k: hf_fields[k] was in the file (else its default)
  char path[1024];   // DIR/config.json, for messages
} hf_config;

// Reads dir/config.json. 0, or -1 with a one-line message naming the file and the field.
int hf_read_config(const char *dir, hf_config *hc, char *err, size_t n_err);
// Field f of mc as text: an integer, true / false, or the shortest text of the float.
void hf_field_text(const hf_field *f, const model_config *mc, char buf[32]);
// Whether field f is the same in a and b (floats compare as the floats the run uses).
int hf_field_equal(const hf_field *f, const model_config *a, const model_config *b);

// dir/config.json describing mc; torch_dtype "float32" or "bfloat16". 0, or -1 with a message.
int hf_write_config(const char *dir, const model_config *mc, const char *torch_dtype, char *err, size_t n_err);
// Checks dir/config.json against mc: a Llama whose fields that the weights depend on equal mc's.
// 0, or -1 with a message naming the first field that differs, both values and the key to set.
int hf_check_config(const char *dir, const model_config *mc, char *err, size_t n_err);

#endif
