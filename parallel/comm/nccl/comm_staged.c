// The MPI communicator over device buffers, staged through host memory (comm_staged.h): each
// call copies what it reads from the device after the compute stream's queued work, runs the
// MPI communicator on the host copies, and copies the results back on the compute stream.
// Copies the caller must not see early (results of started collectives, received transfers)
// are kept as pending host-to-device copies until the wait that publishes them. Host buffers
// come from a pool of pinned buffers that a step's calls reuse (staged_buf): no page faults and
// full-speed copies after the first step.
#include "parallel/comm/nccl/comm_staged.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/base/check.h"
#include "kernels/cuda/cuda_check.h"

// A result waiting on the host: n_bytes from host to dev when published.
typedef struct staged_copy {
  const char *host;
  void *dev;
  int64_t n_bytes;
} staged_copy;

// Copies to publish together, and the host buffers to free once they are published.
typedef struct staged_list {
  staged_copy *copy;
  int n_copy, cap_copy;
  char **owned;
  int n_owned, cap_owned;
} staged_list;

// A transfer: its host buffer, and for a receive the device buffer it lands in at its wait.
typedef struct staged_xfer {
  char *host;
  void *dev;
  int64_t n_bytes;
} staged_xfer;

// A host buffer of the pool, free or lent out; pinned unless pinning was refused.
typedef struct staged_buf {
  char *p;
  size_t cap;
  int lent, pinned;
} staged_buf;

typedef struct comm_staged {
  comm *mpi;             // the MPI communicator, over the host copies
  staged_buf *pool;      // every host buffer this communicator made
  int n_pool, cap_pool;
  cudaStream_t stream;   // the compute stream: copies are ordered with the kernels on it
  char *scratch[2];      // host operands of the blocking calls
  size_t scratch_bytes[2];
  staged_list group;     // receives of the open group, published at group_end
  staged_list started;   // results of started collectives, published at wait and drain
  int in_group;          // between group_start and group_end
  staged_xfer *xfer;     // by ticket (the MPI communicator's numbering), since xfer_reset
  int cap_xfer;
} comm_staged;

static const comm_ops comm_staged_ops;

int comm_staged_is(const comm *c) { return c && c->ops == &comm_staged_ops; }

static comm_staged *staged(const comm *c) { return c->impl; }

// A host buffer of at least n_bytes: the smallest free one of the pool that fits, else a new
// pinned one (plain memory where pinning is refused).
static char *staged_buf_get(const comm *c, int64_t n_bytes) {
  comm_staged *s = staged(c);
  const size_t nb = (size_t)(n_bytes > 0 ? n_bytes : 1);
  int best = -1;
  for (int i = 0; i < s->n_pool; i++)
    if (!s->pool[i].lent && s->pool[i].cap >= nb && (best < 0 || s->pool[i].cap < s->pool[best].cap)) best = i;
  if (best < 0) {
    comm_grow(c, (void **)&s->pool, &s->cap_pool, s->n_pool + 1, sizeof *s->pool, "staged host buffers");
    staged_buf *h = &s->pool[best = s->n_pool++];
    *h = (staged_buf){NULL, nb, 0, 1};
    if (cudaMallocHost((void **)&h->p, nb) != cudaSuccess) {
      (void)cudaGetLastError();
      *h = (staged_buf){XMALLOC(nb), nb, 0, 0};
    }
  }
  s->pool[best].lent = 1;
  return s->pool[best].p;
}

// Gives a buffer of staged_buf_get back to the pool.
static void staged_buf_put(comm_staged *s, char *p) {
  for (int i = 0; i < s->n_pool; i++)
    if (s->pool[i].p == p) {
      s->pool[i].lent = 0;
      return;
    }
  CHECK(!p, "staged communicator: host buffer %p is not the pool's", (void *)p);
}

// Device to host, once the work queued on the compute stream is done.
static void staged_down(comm_staged *s, void *host, const void *dev, int64_t n_bytes) {
  if (n_bytes > 0) CUDA_CHECK(cudaMemcpyAsync(host, dev, (size_t)n_bytes, cudaMemcpyDeviceToHost, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

// A new host buffer holding n_bytes of dev, as the compute stream leaves them.
static char *staged_copy_down(const comm *c, const void *dev, int64_t n_bytes) {
  char *h = staged_buf_get(c, n_bytes);
  staged_down(staged(c), h, dev, n_bytes);
  return h;
}

// Bytes of n_elem elements of t; a negative count is named as such, not as a failed allocation.
static int64_t staged_bytes(const comm *c, int64_t n_elem, comm_dtype t, const char *what) {
  CHECK(n_elem >= 0, "comm %s: %s of %lld elements", c->name, what, (long long)n_elem);
  return n_elem * comm_dtype_bytes(t);
}

// Scratch buffer i of at least n_bytes, for the blocking calls.
static char *staged_scratch(const comm *c, int i, int64_t n_bytes) {
  comm_staged *s = staged(c);
  if ((size_t)n_bytes > s->scratch_bytes[i]) {
    staged_buf_put(s, s->scratch[i]);
    s->scratch[i] = staged_buf_get(c, n_bytes);
    s->scratch_bytes[i] = (size_t)n_bytes;
  }
  return s->scratch[i];
}

// Host to device on the compute stream, done before returning (the host buffer is reused).
static void staged_up(comm_staged *s, void *dev, const void *host, int64_t n_bytes) {
  if (n_bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dev, host, (size_t)n_bytes, cudaMemcpyHostToDevice, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static void staged_list_copy(const comm *c, staged_list *l, const char *host, void *dev, int64_t n_bytes) {
  comm_grow(c, (void **)&l->copy, &l->cap_copy, l->n_copy + 1, sizeof *l->copy, "staged copies");
  l->copy[l->n_copy++] = (staged_copy){host, dev, n_bytes};
}

static void staged_list_own(const comm *c, staged_list *l, char *host) {
  comm_grow(c, (void **)&l->owned, &l->cap_owned, l->n_owned + 1, sizeof *l->owned, "staged host buffers");
  l->owned[l->n_owned++] = host;
}

// Publishes l's copies on the compute stream and frees its host buffers.
static void staged_list_publish(comm_staged *s, staged_list *l) {
  for (int i = 0; i < l->n_copy; i++)
    if (l->copy[i].n_bytes > 0)
      CUDA_CHECK(cudaMemcpyAsync(l->copy[i].dev, l->copy[i].host, (size_t)l->copy[i].n_bytes, cudaMemcpyHostToDevice,
                                 s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  for (int i = 0; i < l->n_owned; i++) staged_buf_put(s, l->owned[i]);
  l->n_copy = l->n_owned = 0;
}

static void staged_list_free(staged_list *l) {  // its host buffers are the pool's
  free(l->copy);
  free(l->owned);
}

// ---- blocking collectives --------------------------------------------------------------------

static void staged_all_reduce(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "all_reduce");
  char *h = staged_scratch(c, 0, nb);
  staged_down(s, h, buf, nb);
  s->mpi->ops->all_reduce(s->mpi, h, n_elem, t, op);
  staged_up(s, buf, h, nb);
}

static void staged_all_gather(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "all_gather");
  char *hs = staged_scratch(c, 0, nb), *hr = staged_scratch(c, 1, c->size * nb);
  staged_down(s, hs, send, nb);
  s->mpi->ops->all_gather(s->mpi, hs, hr, n_elem, t);
  staged_up(s, recv, hr, c->size * nb);
}

static void staged_reduce_scatter(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                  comm_redop op) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "reduce_scatter");
  char *hs = staged_scratch(c, 0, c->size * nb), *hr = staged_scratch(c, 1, nb);
  staged_down(s, hs, send, c->size * nb);
  s->mpi->ops->reduce_scatter(s->mpi, hs, hr, n_elem, t, op);
  staged_up(s, recv, hr, nb);
}

static void staged_broadcast(comm *c, void *buf, int64_t n_elem, comm_dtype t, int root) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "broadcast");
  char *h = staged_scratch(c, 0, nb);
  staged_down(s, h, buf, nb);
  s->mpi->ops->broadcast(s->mpi, h, n_elem, t, root);
  staged_up(s, buf, h, nb);
}

static void staged_all_to_all(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_staged *s = staged(c);
  const int64_t nb = c->size * staged_bytes(c, n_elem, t, "all_to_all");
  char *hs = staged_scratch(c, 0, nb), *hr = staged_scratch(c, 1, nb);
  staged_down(s, hs, send, nb);
  s->mpi->ops->all_to_all(s->mpi, hs, hr, n_elem, t);
  staged_up(s, recv, hr, nb);
}

// ---- point-to-point: a send copies its buffer at posting, a receive lands at group_end --------
// (outside a group, both complete before returning, as the MPI communicator's do)

static void staged_send(comm *c, const void *buf, int64_t n_elem, comm_dtype t, int peer) {
  comm_staged *s = staged(c);
  char *h = staged_copy_down(c, buf, staged_bytes(c, n_elem, t, "send"));
  s->mpi->ops->send(s->mpi, h, n_elem, t, peer);
  staged_list_own(c, &s->group, h);  // a posted send reads it until group_end
  if (!s->in_group) staged_list_publish(s, &s->group);
}

static void staged_recv(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "recv");
  char *h = staged_buf_get(c, nb);
  s->mpi->ops->recv(s->mpi, h, n_elem, t, peer);
  staged_list_copy(c, &s->group, h, buf, nb);
  staged_list_own(c, &s->group, h);
  if (!s->in_group) staged_list_publish(s, &s->group);
}

static void staged_group_start(comm *c) {
  comm_staged *s = staged(c);
  s->mpi->ops->group_start(s->mpi);
  s->in_group = 1;
}

static void staged_group_end(comm *c) {
  comm_staged *s = staged(c);
  s->mpi->ops->group_end(s->mpi);
  s->in_group = 0;
  staged_list_publish(s, &s->group);
}

static void staged_barrier(comm *c) {
  comm_staged *s = staged(c);
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  s->mpi->ops->barrier(s->mpi);
}

// ---- started collectives: operands copied at the start, results published at the wait --------

static void staged_all_reduce_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "all_reduce_start");
  char *h = staged_copy_down(c, buf, nb);
  s->mpi->ops->all_reduce_start(s->mpi, h, n_elem, t, op);
  staged_list_copy(c, &s->started, h, buf, nb);
  staged_list_own(c, &s->started, h);
}

static void staged_reduce_scatter_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                        comm_redop op) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "reduce_scatter_start");
  char *hs = staged_copy_down(c, send, c->size * nb), *hr = staged_buf_get(c, nb);
  s->mpi->ops->reduce_scatter_start(s->mpi, hs, hr, n_elem, t, op);  // copies hs
  staged_buf_put(s, hs);
  staged_list_copy(c, &s->started, hr, recv, nb);
  staged_list_own(c, &s->started, hr);
}

static void staged_all_to_all_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_staged *s = staged(c);
  const int64_t nb = c->size * staged_bytes(c, n_elem, t, "all_to_all_start");
  char *hs = staged_copy_down(c, send, nb), *hr = staged_buf_get(c, nb);
  s->mpi->ops->all_to_all_start(s->mpi, hs, hr, n_elem, t);  // copies hs
  staged_buf_put(s, hs);
  staged_list_copy(c, &s->started, hr, recv, nb);
  staged_list_own(c, &s->started, hr);
}

// The regions are packed one after another on the host; only this rank's block of each is read
// now, and only the other ranks' blocks are written back.
static void staged_all_gather_regions_start(comm *c, void *buf, const int64_t *at, const int64_t *n_elem,
                                            int n_regions, comm_dtype t) {
  comm_staged *s = staged(c);
  const int64_t esz = comm_dtype_bytes(t);
  int64_t total = 0;
  int64_t *host_at = XMALLOC(sizeof *host_at * (size_t)(n_regions > 0 ? n_regions : 1));
  for (int i = 0; i < n_regions; i++) {
    staged_bytes(c, n_elem[i], t, "all_gather_regions_start region");
    host_at[i] = total;
    total += c->size * n_elem[i];
  }
  char *h = staged_buf_get(c, total * esz);
  for (int i = 0; i < n_regions; i++)
    if (n_elem[i] > 0)
      CUDA_CHECK(cudaMemcpyAsync(h + (host_at[i] + c->rank * n_elem[i]) * esz,
                                 (const char *)buf + (at[i] + c->rank * n_elem[i]) * esz, (size_t)(n_elem[i] * esz),
                                 cudaMemcpyDeviceToHost, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  s->mpi->ops->all_gather_regions_start(s->mpi, h, host_at, n_elem, n_regions, t);
  for (int i = 0; i < n_regions; i++)
    for (int r = 0; r < c->size; r++)
      if (r != c->rank)
        staged_list_copy(c, &s->started, h + (host_at[i] + r * n_elem[i]) * esz,
                         (char *)buf + (at[i] + r * n_elem[i]) * esz, n_elem[i] * esz);
  staged_list_own(c, &s->started, h);
  free(host_at);
}

static void staged_wait(comm *c) {
  comm_staged *s = staged(c);
  s->mpi->ops->wait(s->mpi);
  staged_list_publish(s, &s->started);
}

// ---- transfers: a send copies its buffer at the start, a receive lands at its ticket's wait ---
// The device-to-host copy of a send waits for all the compute queued so far, which includes
// the work behind its `after` marks; a receive among its `after` tickets lands first (a send
// among them needs nothing: its buffer was copied when it started).

static void staged_xfer_open(comm *c) { staged(c)->mpi->ops->xfer_open(staged(c)->mpi); }

static void staged_xfer_wait(comm *c, int ticket);

static int staged_xfer_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer, int is_send,
                             const int *after, int n_after) {
  comm_staged *s = staged(c);
  const int64_t nb = staged_bytes(c, n_elem, t, "transfer");
  for (int i = 0; i < n_after; i++)
    if (after[i] >= 0 && after[i] < s->cap_xfer && s->xfer[after[i]].host && s->xfer[after[i]].dev)
      staged_xfer_wait(c, after[i]);
  char *h = is_send ? staged_copy_down(c, buf, nb) : staged_buf_get(c, nb);
  int ticket = s->mpi->ops->xfer_start(s->mpi, h, n_elem, t, peer, is_send, after, n_after);
  CHECK(ticket >= 0, "comm %s (staged): transfer ticket %d", c->name, ticket);
  comm_grow(c, (void **)&s->xfer, &s->cap_xfer, ticket + 1, sizeof *s->xfer, "staged transfers");  // zeroed: no host
  s->xfer[ticket] = (staged_xfer){h, is_send ? NULL : buf, nb};
  return ticket;
}

static int staged_xfer_mark(comm *c) { return staged(c)->mpi->ops->xfer_mark(staged(c)->mpi); }

static void staged_xfer_wait(comm *c, int ticket) {
  comm_staged *s = staged(c);
  s->mpi->ops->xfer_wait(s->mpi, ticket);  // checks the ticket
  if (ticket < 0 || !s->xfer[ticket].host) return;  // a mark, or waited for already
  staged_xfer *x = &s->xfer[ticket];
  if (x->dev) staged_up(s, x->dev, x->host, x->n_bytes);
  staged_buf_put(s, x->host);
  x->host = NULL;
}

static void staged_xfer_reset(comm *c) {
  comm_staged *s = staged(c);
  s->mpi->ops->xfer_reset(s->mpi);  // checks that every transfer was waited for
  for (int i = 0; i < s->cap_xfer; i++) {
    staged_buf_put(s, s->xfer[i].host);
    s->xfer[i].host = NULL;
  }
}

static void staged_free(comm *c) {
  if (!c) return;
  comm_staged *s = c->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (s && !finalized)  // MPI may still be writing a buffer of a transfer not waited for
    for (int i = 0; i < s->cap_xfer; i++)
      CHECK(!s->xfer[i].host, "comm %s freed with transfer ticket %d not waited for", c->name, i);
  if (s) {
    comm_free(&s->mpi);  // checks for open groups and collectives not waited for
    staged_list_free(&s->group);
    staged_list_free(&s->started);
    free(s->xfer);
    for (int i = 0; i < s->n_pool; i++) {
      if (!s->pool[i].pinned) free(s->pool[i].p);
      else if (cudaFreeHost(s->pool[i].p) != cudaSuccess) (void)cudaGetLastError();  // at exit the context may be gone
    }
    free(s->pool);
    free(s);
  }
  free(c);
}

static const comm_ops comm_staged_ops = {
    .all_reduce = staged_all_reduce,
    .all_gather = staged_all_gather,
    .reduce_scatter = staged_reduce_scatter,
    .broadcast = staged_broadcast,
    .all_to_all = staged_all_to_all,
    .send = staged_send,
    .recv = staged_recv,
    .group_start = staged_group_start,
    .group_end = staged_group_end,
    .barrier = staged_barrier,
    .free = staged_free,
    .all_reduce_start = staged_all_reduce_start,
    .reduce_scatter_start = staged_reduce_scatter_start,
    .all_to_all_start = staged_all_to_all_start,
    .all_gather_regions_start = staged_all_gather_regions_start,
    .wait = staged_wait,
    .drain = staged_wait,
    .xfer_open = staged_xfer_open,
    .xfer_start = staged_xfer_start,
    .xfer_mark = staged_xfer_mark,
    .xfer_wait = staged_xfer_wait,
    .xfer_reset = staged_xfer_reset,
    .buffer_alloc = comm_no_buffer_alloc,
    .buffer_free = comm_no_buffer_free,
};

comm *comm_staged_create(MPI_Comm mpi, const char *name, const comm_opts *opts) {
  const comm_opts o = opts ? *opts : comm_opts_default();
  comm *c = XCALLOC(1, sizeof *c);
  comm_staged *s = XCALLOC(1, sizeof *s);
  s->mpi = comm_mpi_create(mpi, name, &o);  // checks o
  s->stream = (cudaStream_t)o.stream;
  c->ops = &comm_staged_ops;
  c->impl = s;
  snprintf(c->name, sizeof c->name, "%s", s->mpi->name);
  c->mpi = s->mpi->mpi;  // the MPI communicator's duplicate, freed with it
  c->rank = s->mpi->rank;
  c->size = s->mpi->size;
  return c;
}

static comm *comm_staged_factory_create(void *ctx, MPI_Comm mpi, const char *name, const comm_opts *opts) {
  (void)ctx;
  return comm_staged_create(mpi, name, opts);
}

comm_factory comm_staged_factory(const comm_opts *opts) {
  comm_factory f = {.create = comm_staged_factory_create, .opts = opts ? *opts : comm_opts_default()};
  comm_opts_check(&f.opts, "comm_staged_factory");
  return f;
}
