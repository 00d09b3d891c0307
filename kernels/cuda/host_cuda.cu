// Pinned, mapped host memory, the copy stream and the side stream (see host_cuda.h). Memory from cudaHostAlloc
// with cudaHostAllocMapped | cudaHostAllocPortable: under unified addressing its host pointer is
// also its device pointer, so kernels read and write it over the host link (NVLink-C2C or PCIe)
// and cudaMemcpyDefault finds the direction of every copy from the pointers.
#include "kernels/cuda/host_cuda.h"
#include "kernels/cuda/cuda_common.cuh"

#include <stdlib.h>

// A stream beside the compute stream (the copy stream, the side stream) with its tickets: events
// in a ring. Tickets older than the ring are waited for through a later event of the same slot:
// the stream runs in order, so a later piece of work's end implies an earlier one's.
enum { LANE_EVENTS = 256 };

struct k_cuda_lane {
  cudaStream_t stream;
  cudaStream_t main;                // the side stream: the compute stream while the side one stands in
  cudaEvent_t compute_mark;         // the compute stream's work queued before the lane's next work
  cudaEvent_t done[LANE_EVENTS];    // ticket t's end at done[t % LANE_EVENTS]
  int64_t next_ticket;
};

static k_cuda_lane *lane_of(k_cuda_lane **slot) {
  if (*slot) return *slot;
  k_cuda_lane *k = (k_cuda_lane *)XCALLOC(1, sizeof *k);
  CUDA_CHECK(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&k->compute_mark, cudaEventDisableTiming));
  for (int i = 0; i < LANE_EVENTS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&k->done[i], cudaEventDisableTiming));
  *slot = k;
  return k;
}

static k_cuda_lane *copy_of(k_cuda_ctx *c) { return lane_of(&c->copy); }

void k_cuda_lane_free(k_cuda_lane **kp) {
  if (!kp || !*kp) return;
  k_cuda_lane *k = *kp;
  CUDA_CHECK(cudaStreamSynchronize(k->stream));
  CUDA_CHECK(cudaEventDestroy(k->compute_mark));
  for (int i = 0; i < LANE_EVENTS; i++) CUDA_CHECK(cudaEventDestroy(k->done[i]));
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
  k_cuda_lane *k = copy_of(c);
  CUDA_CHECK(cudaEventRecord(k->compute_mark, c->stream));
  CUDA_CHECK(cudaStreamWaitEvent(k->stream, k->compute_mark, 0));
  if (n_bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDefault, k->stream));
  int64_t t = k->next_ticket++;
  CUDA_CHECK(cudaEventRecord(k->done[t % LANE_EVENTS], k->stream));
  return t;
}

extern "C" void k_cuda_copy_wait(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = copy_of(c);
  CUDA_CHECK(cudaSetDevice(c->device));  // the caller may be a thread of its own (optimizer.offload_delay)
  CHECK(ticket >= 0 && ticket < k->next_ticket, "copy_wait: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  CUDA_CHECK(cudaEventSynchronize(k->done[ticket % LANE_EVENTS]));
}

extern "C" void k_cuda_copy_join(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = c->copy;
  if (!k || k->next_ticket == 0) return;  // no copy was ever queued
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[(k->next_ticket - 1) % LANE_EVENTS], 0));
}

extern "C" void k_cuda_copy_join_ticket(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = copy_of(c);
  CHECK(ticket >= 0 && ticket < k->next_ticket, "copy_join_ticket: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[ticket % LANE_EVENTS], 0));
}

// ---- the side stream -------------------------------------------------------------------------

extern "C" void k_cuda_side_begin(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = lane_of(&c->side);
  CHECK(!k->main, "side_begin: the side stream is in use already (side_end missing)");
  CUDA_CHECK(cudaEventRecord(k->compute_mark, c->stream));
  CUDA_CHECK(cudaStreamWaitEvent(k->stream, k->compute_mark, 0));
  k->main = c->stream;
  c->stream = k->stream;
}

extern "C" int64_t k_cuda_side_end(k_backend *b) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = c->side;
  CHECK(k && k->main, "side_end without side_begin");
  const int64_t t = k->next_ticket++;
  CUDA_CHECK(cudaEventRecord(k->done[t % LANE_EVENTS], k->stream));
  c->stream = k->main;
  k->main = NULL;
  return t;
}

extern "C" void k_cuda_side_join_ticket(k_backend *b, int64_t ticket) {
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_lane *k = c->side;
  if (!k || k->next_ticket == 0) return;  // no side work was ever queued
  CHECK(!k->main, "side_join_ticket between side_begin and side_end");
  CHECK(ticket >= -1 && ticket < k->next_ticket, "side_join_ticket: ticket %lld was never issued (next %lld)",
        (long long)ticket, (long long)k->next_ticket);
  const int64_t t = ticket < 0 ? k->next_ticket - 1 : ticket;
  CUDA_CHECK(cudaStreamWaitEvent(c->stream, k->done[t % LANE_EVENTS], 0));
}
