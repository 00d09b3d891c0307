// What a backend's buffers hold, and a table of them by pointer, so that the memory a run holds
// can be told apart by use (k_backend.mem_kind, mem_held_by_kind): the caller names the kind
// before it allocates, and a buffer counts under that kind until it is freed.
#ifndef TRAINER_HELD_H
#define TRAINER_HELD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k_mem_kind {
  K_MEM_OTHER,        // anything not named below (batches, communication staging, ...)
  K_MEM_WEIGHTS,      // the model's weights: fp32 masters it holds, the compute copy, the norms' copy
  K_MEM_GRADS,        // the model's whole gradient buffer
  K_MEM_OPTIMIZER,    // the optimizer's state and its sharding buffers (moments, masters of a part, gradient
                      // parts and staging, gathered layers' slots)
  K_MEM_ACTIVATIONS,  // the activations saved for backward
  K_MEM_FP8,          // FP8 weight copies, casts and scaling state
  K_MEM_WORKSPACE,    // the model's working buffers of one layer
  K_MEM_KINDS
} k_mem_kind;

extern const char *const k_mem_kind_names[K_MEM_KINDS];  // "other", "weights", ...

typedef struct k_held {
  void **ptr;
  int64_t *size;
  uint8_t *kind;
  int n, cap;
  k_mem_kind current;              // the kind of the next buffers added
  int64_t bytes[K_MEM_KINDS];      // held now, by kind
  int64_t total;
} k_held;

// p (n_bytes) counts under h->current until removed.
void k_held_add(k_held *h, void *p, int64_t n_bytes);
// p no longer counts (nothing if p was never added).
void k_held_remove(k_held *h, void *p);
// The kind of the buffers added from now on; returns the kind before (k_backend.mem_kind).
k_mem_kind k_held_set_kind(k_held *h, k_mem_kind kind);
// bytes[k] = what h holds of kind k now (k_backend.mem_held_by_kind).
void k_held_by_kind(const k_held *h, int64_t bytes[K_MEM_KINDS]);
void k_held_free(k_held *h);

#ifdef __cplusplus
}
#endif

#endif
