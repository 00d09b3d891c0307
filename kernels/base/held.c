// The table of a backend's buffers by pointer (see held.h). A scan on removal: frees are rare.
#include "kernels/base/held.h"
#include "kernels/base/check.h"
#include <stdlib.h>

const char *const k_mem_kind_names[K_MEM_KINDS] = {"other", "weights", "gradients", "optimizer", "activations",
                                                   "fp8", "workspaces"};

void k_held_add(k_held *h, void *p, int64_t n_bytes) {
  if (h->n == h->cap) {
    h->cap = h->cap ? 2 * h->cap : 64;
    h->ptr = realloc(h->ptr, (size_t)h->cap * sizeof *h->ptr);
    h->size = realloc(h->size, (size_t)h->cap * sizeof *h->size);
    h->kind = realloc(h->kind, (size_t)h->cap * sizeof *h->kind);
    CHECK(h->ptr && h->size && h->kind, "out of host memory for the table of %d buffers", h->cap);
  }
  h->ptr[h->n] = p, h->size[h->n] = n_bytes, h->kind[h->n++] = (uint8_t)h->current;
  h->bytes[h->current] += n_bytes;
  h->total += n_bytes;
}

void k_held_remove(k_held *h, void *p) {
  for (int i = 0; i < h->n; i++)
    if (h->ptr[i] == p) {
      h->bytes[h->kind[i]] -= h->size[i];
      h->total -= h->size[i];
      h->n--;
      h->ptr[i] = h->ptr[h->n], h->size[i] = h->size[h->n], h->kind[i] = h->kind[h->n];
      return;
    }
}

k_mem_kind k_held_set_kind(k_held *h, k_mem_kind kind) {
  const k_mem_kind before = h->current;
  h->current = kind;
  return before;
}

void k_held_by_kind(const k_held *h, int64_t bytes[K_MEM_KINDS]) {
  for (int k = 0; k < K_MEM_KINDS; k++) bytes[k] = h->bytes[k];
}

void k_held_free(k_held *h) {
  free(h->ptr);
  free(h->size);
  free(h->kind);
  *h = (k_held){0};
}
