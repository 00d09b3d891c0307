// The communicator suite's buffer layer (tests/unit/test_comm.c): one run of the suite, and where its
// buffers live. Host memory for MPI, where every copy is a memcpy, done at once (so is host
// "compute"); device memory for NCCL and staged, with copies on the suite's stream. The CUDA
// parts build only where the toolkit was found.
#ifndef TRAINER_TEST_COMM_BUF_H
#define TRAINER_TEST_COMM_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "parallel/comm/comm.h"
#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_check.h"
#include "parallel/comm/nccl/comm_nccl.h"
#endif

typedef enum comm_kind { KIND_MPI, KIND_NCCL, KIND_STAGED, KIND_PEER } comm_kind;

// One run of the suite: the communicators a factory makes, and where their buffers live.
typedef struct suite {
  comm_kind kind;
  const char *label;        // "mpi", "mpi chunk 2", "nccl", "staged", "peer": in failure messages
  int device;               // buffers in device memory, copied through `stream`
  int chunked;              // mpi_chunk_elems is small: the large sizes shrink (host calls per chunk)
  comm_factory f;
  void *stream;             // device: a non-blocking cudaStream_t, the communicators' stream too, as
                            // the trainer passes its compute stream: nothing is ordered with it by
                            // accident through the legacy default stream
  int (*is)(const comm *);  // device kinds: whether a communicator is of this kind; MPI: NULL
} suite;

static inline void *buf_alloc(const suite *s, size_t n_bytes) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, n_bytes ? n_bytes : 1));
    return p;
  }
#endif
  (void)s;
  return XCALLOC(1, n_bytes ? n_bytes : 1);
}

static inline void buf_free(const suite *s, void *p) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    CUDA_CHECK(cudaFree(p));
    return;
  }
#endif
  (void)s;
  free(p);
}

// Host to buffer, finished before returning (the host memory is reused right after).
static inline void buf_put(const suite *s, void *dst, const void *host, size_t n_bytes) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, n_bytes, cudaMemcpyHostToDevice, (cudaStream_t)s->stream));
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s->stream));
    return;
  }
#endif
  memcpy(dst, host, n_bytes);
}

// Host to buffer, queued behind the work on the stream and not waited for (an unsynchronised
// upload: what a communicator call after it must see); host memory must stay as it is until
// the next wait.
static inline void buf_put_queued(const suite *s, void *dst, const void *host, size_t n_bytes) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, n_bytes, cudaMemcpyHostToDevice, (cudaStream_t)s->stream));
    return;
  }
#endif
  memcpy(dst, host, n_bytes);
}

// Buffer to buffer, queued (the stand-in for a compute kernel writing dst).
static inline void buf_copy_queued(const suite *s, void *dst, const void *src, size_t n_bytes) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s->stream));
    return;
  }
#endif
  memcpy(dst, src, n_bytes);
}

// Buffer to host in stream order only: what the stream has done so far, without waiting for
// the communicator (so a result it shows came through the stream's ordering).
static inline void buf_get(const suite *s, void *host, const void *src, size_t n_bytes) {
#ifdef TRAINER_HAVE_CUDA
  if (s->device) {
    CUDA_CHECK(cudaMemcpyAsync(host, src, n_bytes, cudaMemcpyDeviceToHost, (cudaStream_t)s->stream));
    CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)s->stream));
    return;
  }
#endif
  memcpy(host, src, n_bytes);
}

// The bounded wait the trainer uses before the host reads (a no-op but for NCCL).
static inline void suite_wait(comm *c) {
#ifdef TRAINER_HAVE_CUDA
  comm_nccl_wait(c);
#else
  (void)c;
#endif
}

// Buffer to host after c's work.
static inline void buf_down(const suite *s, comm *c, void *host, const void *src, size_t n_bytes) {
  suite_wait(c);
  buf_get(s, host, src, n_bytes);
}

// Element count for a check whose size matters on GPUs (to still be running when the next call
// is queued, or to take NCCL's pipelined paths) but not on host buffers, where the chunked run
// would cut it into millions of MPI calls.
static inline int64_t sized(const suite *s, int64_t device_n, int64_t host_n) { return s->device ? device_n : host_n; }

#endif
