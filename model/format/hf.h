// Hugging Face Llama interop: the trainer's parameters under transformers' LlamaForCausalLM
// names, the shard plan and index of a sharded export, and reading a model directory (one safetensors file, or several
// with model.safetensors.index.json) into this rank's blocks of the parameters.
// The conventions already agree (docs/hf.md): matrices are (out, in) as nn.Linear.weight,
// q/k/v and gate/up are separate, and rotary embeddings use the "rotate half" pairing, so
// every tensor maps one to one with no permutation.
#ifndef TRAINER_HF_H
#define TRAINER_HF_H

#include <stddef.h>
#include <stdint.h>
#include "model/model.h"
#include "model/format/safetensors.h"

#define HF_SINGLE_FILE "model.safetensors"
#define HF_INDEX_FILE "model.safetensors.index.json"

// One parameter of the whole model (every layer, whatever the layout).
typedef struct hf_tensor {
  char hf_name[96];       // e.g. "model.layers.0.self_attn.q_proj.weight"
  char name[64];          // the trainer's, e.g. "layers.0.wq" (checkpoint dataset "model/layers.0.wq")
  model_kind kind;
  int layer;              // -1 for non-layer tensors
  int ndim;
  int64_t full[2];
} hf_tensor;

// The HF name of a parameter kind (layer ignored for non-layer kinds).
void hf_tensor_name(model_kind k, int layer, char *out, size_t n_out);
// Every parameter of a model of this config, in the trainer's order (the embedding, each layer,
// the final norm, the head unless tied). Returns the count; *out is malloc'd.
int hf_tensor_list(const model_config *mc, hf_tensor **out);

// Shards: tensors in order, a new file whenever the next tensor would take the current one
// past max_bytes (a tensor larger than max_bytes gets a file of its own). Fills shard_of;
// returns the number of files.
int hf_plan_shards(const int64_t *n_bytes, int n, int64_t max_bytes, int *shard_of);
// "model.safetensors" for one file, else "model-00001-of-00003.safetensors" (k from 0).
void hf_shard_name(int k, int n_shards, char *out, size_t n_out);
// Writes text to dir/name through a synced temporary and a rename. 0, or -1 with a message.
int hf_write_file(const char *dir, const char *name, const char *text, size_t n_text, char *err, size_t n_err);
// dir/model.safetensors.index.json: total_size (tensor bytes) and each tensor's file.
int hf_write_index(const char *dir, const hf_tensor *t, const int *shard_of, int n, int n_shards, int64_t total_bytes,
                   char *err, size_t n_err);

// A model directory, its safetensors files opened and validated.
typedef struct hf_dir {
  char dir[512];
  st_file *files;
  int n_files;
  char **map_names;       // (n_map) the index's weight_map: tensor name -> map_file
  int *map_file;
  int n_map;              // 0 without an index (one file)
} hf_dir;

// Opens dir/model.safetensors, or else every file dir/model.safetensors.index.json names.
int hf_dir_open(hf_dir *h, const char *dir, char *err, size_t n_err);
void hf_dir_close(hf_dir *h);
// Fills this rank's blocks of m's parameters into host (m->n_params floats, at each tensor's
// offset) from the directory, in fp32. Every tensor of the whole model is looked up and its
// shape checked, so every rank fails alike. 0, or -1 with a message.
int hf_read_model(const hf_dir *h, const model *m, float *host, char *err, size_t n_err);

#endif
