// Pinned, mapped host memory and the copy stream (see host_cuda.h). Memory from cudaHostAlloc
// with cudaHostAllocMapped | cudaHostAllocPortable: under unified addressing its host pointer is
// also its device pointer, so kernels read and write it over the host link (NVLink-C2C or PCIe)
// and cudaMemcpyDefault finds the direction of every copy from the pointers.
#include "kernels/cuda/host_cuda.h"
#include "kernels/cuda/cuda_common.cuh"

#include <stdlib.h>

// Tickets older than the ring are waited for through a later event of the same slot: the copy
// stream runs in order, so a later copy's end implies an earlier one's.
enum { COPY_EVENTS = 256 };

struct k_cuda_copy {
  cudaStream_t stream;
  cudaEvent_t compute_mark;         // the compute stream's work queued before a copy
  cudaEvent_t done[COPY_EVENTS];    // ticket t's end at done[t % COPY_EVENTS]
  int64_t next_ticket;
};

static k_cuda_copy *copy_of(k_cuda_ctx *c) {
  if (c->copy) return c->copy;
  k_cuda_copy *k = (k_cuda_copy *)XCALLOC(1, sizeof *k);
  CUDA_CHECK(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&k->compute_mark, cudaEventDisableTiming));
  for (int i = 0; i < COPY_EVENTS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&k->done[i], cudaEventDisableTiming));
  c->copy = k;
  return k;
}

void k_cuda_copy_free(k_cuda_copy **kp) {
  if (!kp || !*kp) return;
  k_cuda_copy *k = *kp;
  CUDA_CHECK(cudaStreamSynchronize(k->stream));
  CUDA_CHECK(cudaEventDestroy(k->compute_mark));
  for (int i = 0; i < COPY_EVENTS; i++) CUDA_CHECK(cudaEventDestroy(k->done[i]));
  CUDA_CHECK(cudaStreamDestroy(k->stream));
  free(k);
  *kp = NULL;
}

extern "C" void *k_cuda_host_alloc(k_backend *b, size_t n_bytes) {
  (void)k_cuda_ctx_of(b);
  void *p = NULL;
  if (cudaHostAlloc(&p, n_bytes ? n_bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // refused (too much pinned memory): the caller reports it
    return NULL;
  }
  void *dev = NULL;
  CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
  CHECK(dev == p, "pinned host memory at %p is mapped at %p on the device: kernels need one address (a GPU "
        "without unified addressing)", p, dev);
  memset(p, 0, n_bytes);
  return p;
}

extern "C" void k_cuda_host_free(k_backend *b, void *p) {
  (void)b;
  if (p) CUDA_CHECK(cudaFreeHost(p));  // waits for work in flight that may use p
}

extern "C" int64_t k_cuda_copy_async(k_backend *b, void *dst, const void *src, size_t n_bytes) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_copy *k = copy_of(c);
  CUDA_CHECK(cudaEventRecord(k->compute_mark, c->stream));
  CUDA_CHECK(cudaStreamWaitEvent(k->stream, k->compute_mark, 0));
  if (n_bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDefault, k->stream));
  int64_t t = k->next_ticket++;
  CUDA_CHECK(cudaEventRecord(k->done[t % COPY_EVENTS], k->stream));
  return t;
}

extern "C" void k_cuda_copy_wait(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_copy *k = copy_of(c);
  CUDA_CHECK(cudaSetDevice(c->device));  // the caller may be a thread of its own (optimizer.offload_delay)
  CHECK(ticket >= 0 && ticket < k->next_ticket, "copy_wait: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  CUDA_CHECK(cudaEventSynchronize(k->done[ticket % COPY_EVENTS]));
}

extern "C" void k_cuda_copy_join(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_copy *k = c->copy;
  if (!k || k->next_ticket == 0) return;  // no copy was ever queued
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[(k->next_ticket - 1) % COPY_EVENTS], 0));
}

extern "C" void k_cuda_copy_join_ticket(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_copy *k = copy_of(c);
  CHECK(ticket >= 0 && ticket < k->next_ticket, "copy_join_ticket: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[ticket % COPY_EVENTS], 0));
}

// ---- the side stream -------------------------------------------------------------------------

// Its tickets are events in a ring, as the copy stream's: the side stream runs in order.
enum { SIDE_EVENTS = 256 };

struct k_cuda_side {
  cudaStream_t stream, main;        // the side stream; the compute stream while the side one stands in
  cudaEvent_t compute_mark;         // the compute stream's work queued before side work
  cudaEvent_t done[SIDE_EVENTS];    // ticket t's end at done[t % SIDE_EVENTS]
  int64_t next_ticket;
};

static k_cuda_side *side_of(k_cuda_ctx *c) {
  if (c->side) return c->side;
  k_cuda_side *k = (k_cuda_side *)XCALLOC(1, sizeof *k);
  // The lowest priority: a block of the compute stream's kernels goes first where both wait for SMs.
  int lo = 0, hi = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CUDA_CHECK(cudaStreamCreateWithPriority(&k->stream, cudaStreamNonBlocking, lo));
  CUDA_CHECK(cudaEventCreateWithFlags(&k->compute_mark, cudaEventDisableTiming));
  for (int i = 0; i < SIDE_EVENTS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&k->done[i], cudaEventDisableTiming));
  c->side = k;
  return k;
}

void k_cuda_side_free(k_cuda_side **kp) {
  if (!kp || !*kp) return;
  k_cuda_side *k = *kp;
  CUDA_CHECK(cudaStreamSynchronize(k->stream));
  CUDA_CHECK(cudaEventDestroy(k->compute_mark));
  for (int i = 0; i < SIDE_EVENTS; i++) CUDA_CHECK(cudaEventDestroy(k->done[i]));
  CUDA_CHECK(cudaStreamDestroy(k->stream));
  free(k);
  *kp = NULL;
}

extern "C" void k_cuda_side_begin(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_side *k = side_of(c);
  CHECK(!k->main, "side_begin: the side stream is in use already (side_end missing)");
  CUDA_CHECK(cudaEventRecord(k->compute_mark, c->stream));
  CUDA_CHECK(cudaStreamWaitEvent(k->stream, k->compute_mark, 0));
  k->main = c->stream;
  c->stream = k->stream;
}

extern "C" int64_t k_cuda_side_end(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_side *k = c->side;
  CHECK(k && k->main, "side_end without side_begin");
  const int64_t t = k->next_ticket++;
  CUDA_CHECK(cudaEventRecord(k->done[t % SIDE_EVENTS], k->stream));
  c->stream = k->main;
  k->main = NULL;
  return t;
}

extern "C" void k_cuda_side_join_ticket(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_side *k = c->side;
  if (!k || k->next_ticket == 0) return;  // no side work was ever queued
  CHECK(!k->main, "side_join_ticket between side_begin and side_end");
  CHECK(ticket >= -1 && ticket < k->next_ticket, "side_join_ticket: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  const int64_t t = ticket < 0 ? k->next_ticket - 1 : ticket;
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[t % SIDE_EVENTS], 0));
}
