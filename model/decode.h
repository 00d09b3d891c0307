// Autoregressive decoding of a checkpoint's model, one token at a time with a KV cache: the keys
// and values of every layer for every position so far, so each new token runs one row through
// the blocks. Every op goes through a backend (kernels/backend.h): the same code decodes on the
// CPU backend and on the CUDA backend, with the weights, the cache and the row's tensors in the
// backend's memory and only the logits coming back to the host. The math is the trainer's
// (docs/checkpoint.md: rotate-half RoPE, grouped-query attention, RMSNorm, SwiGLU), in fp32: the
// backend must have fp32 activations (and on GPUs no TF32), so that greedy text agrees between
// the two. Also the sampler: temperature, top-p, a seeded RNG.
#ifndef TRAINER_DECODE_H
#define TRAINER_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "model/model_config.h"

// Pointers into the backend's memory. As the checkpoint orders them, wq, wk, wv are adjacent (one
// fused (H*hd + 2*Hkv*hd, d) projection) and so are w_gate, w_up ((2F, d), gate rows first).
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
  k_backend *be;         // not owned
  float *weights;        // backend memory: one allocation holding every tensor below
  float *embed;          // (V, d)
  float *final_norm;     // (d)
  float *lm_head;        // (V, d); == embed when tie_embeddings
  decode_layer *layers;  // (L), host array of backend pointers
  float *k_cache;        // (L, seq_len, Hkv*hd), roped keys, backend memory
  float *v_cache;        // (L, seq_len, Hkv*hd)
  int n_pos;             // positions in the cache
  float *row;            // backend scratch, one allocation for the row's tensors below
  float *x, *h;          // (d) residual row and its normed copy
  float *qkv;            // (H*hd + 2*Hkv*hd) q | k | v of the row
  float *att;            // (H*hd) attention output, heads concatenated
  float *gu;             // (2F) gate | up
  float *act;            // (F)
  float *rstd;           // (1)
  float *logits_dev;     // (V)
  float *logits;         // (V) host copy
} decode_model;

// One whole model tensor decode_init asks for, by its checkpoint name ("embed", "layers.0.wq",
// "final_norm", "lm_head"), with its logical shape ((rows, 1) for a vector), and where in host
// memory to put it (fp32).
typedef struct decode_tensor {
  char name[96];
  int ndim;
  int64_t shape[2];
  float *host;
} decode_tensor;
// Fills every tensor of list: 0, or -1 with a message in err. A checkpoint reader:
// model/format/ckpt.h's ckpt_read_decode, ctx the checkpoint's path.
typedef int (*decode_read_fn)(void *ctx, decode_tensor *list, int n, char *err, size_t n_err);

// Reads the model tensors for the config mc through read into the memory of be, whose
// activations must be fp32. Returns 0, or -1 with read's message in err.
int decode_init(decode_model *m, k_backend *be, const model_config *mc, decode_read_fn read, void *read_ctx, char *err,
                size_t n_err);
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
