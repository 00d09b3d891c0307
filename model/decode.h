// Autoregressive decoding of a checkpoint's model on the CPU in fp32, one token at a time with a
// KV cache: the keys and values of every layer for every position so far, so each new token runs
// one row through the blocks. The math is the trainer's (docs/checkpoint.md: rotate-half RoPE,
// grouped-query attention, RMSNorm, SwiGLU) on the CPU reference kernels; only the attention of
// one row over the cache is written here. Also the sampler: temperature, top-p, a seeded RNG.
#ifndef TRAINER_DECODE_H
#define TRAINER_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model_config.h"

typedef struct decode_layer {
  float *attn_norm;  // (d)
  float *wq;         // (H*hd, d)
  float *wk, *wv;    // (Hkv*hd, d)
  float *wo;         // (d, H*hd)
  float *mlp_norm;   // (d)
  float *w_gate;     // (F, d)
  float *w_up;       // (F, d)
  float *w_down;     // (d, F)
} decode_layer;

typedef struct decode_model {
  model_config cfg;
  float *weights;        // one allocation holding every tensor below
  float *embed;          // (V, d)
  float *final_norm;     // (d)
  float *lm_head;        // (V, d); == embed when tie_embeddings
  decode_layer *layers;  // (L)
  float *k_cache;        // (L, seq_len, Hkv*hd), roped keys
  float *v_cache;        // (L, seq_len, Hkv*hd)
  int n_pos;             // positions in the cache
  float *x, *h;          // (d) residual row and its normed copy
  float *q;              // (H*hd)
  float *att;            // (H*hd) attention output, heads concatenated
  float *scores;         // (seq_len)
  float *gu;             // (2F) gate | up
  float *act;            // (F)
  float *logits;         // (V)
} decode_model;

// Reads the model tensors of checkpoint path for the config mc (the one stored in it). Returns 0,
// or -1 with a message in err (the checkpoint's own load errors).
int decode_init(decode_model *m, const model_config *mc, const char *path, char *err, size_t n_err);
void decode_free(decode_model *m);
// Empties the KV cache (a new sequence starts at position 0).
void decode_reset(decode_model *m);
// Runs token at the next position (m->n_pos, < seq_len) through the model, appending its keys
// and values to the cache; returns the logits (V) of the next token, valid until the next call.
const float *decode_step(decode_model *m, int32_t token);

// splitmix64: a small, seedable generator; the same seed gives the same stream everywhere.
typedef struct decode_rng {
  uint64_t state;
} decode_rng;
uint64_t decode_rng_next(decode_rng *r);
// Uniform in [0, 1), 53 bits.
double decode_rng_uniform(decode_rng *r);
// The next token from logits (n): temperature 0 takes the argmax (lowest id on ties); otherwise
// softmax(logits / temperature) cut to the smallest set of most likely tokens whose mass reaches
// top_p (nucleus), drawn with r.
int32_t decode_sample(const float *logits, int n, float temperature, float top_p, decode_rng *r);

#endif
