// MPI implementation of the communicator table over host buffers: what CPU ranks use for every
// collective and pipeline transfer, and the reference the NCCL backend is tested against.
// bf16 travels as uint16 and is reduced by user-defined MPI ops that accumulate in float.
// Counts are int64 but MPI 3 counts are int, so every call is cut into chunks of at most
// chunk_elems elements (comm_opts.mpi_chunk_elems; INT_MAX by default, and tests lower it to
// exercise the chunked paths with small buffers). Also the options and factory shared by
// every implementation (comm.h).
#include "parallel/comm/comm.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/cpu/quant_cpu.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

typedef struct comm_req_list {
  MPI_Request *r;
  int n, cap;
} comm_req_list;

typedef struct comm_mpi {
  MPI_Op bf16_sum;       // user ops: MPI has no bf16 type, predefined ops would sum bit patterns
  MPI_Op bf16_max;
  MPI_Op f16_sum, f16_max;
  int64_t chunk_elems;   // largest count passed to one MPI call
  int in_group;          // between group_start and group_end: p2p calls only post requests
  comm_req_list group;    // requests posted in the open group
  struct comm_mpi_started *started;  // (n_started) collectives started since the last wait, in order
  int n_started, cap_started;
  int xfer_opened;        // xfer_open was called
  comm_req_list xfer;     // requests of the transfers started since xfer_reset
  int *xfirst;            // (n_tickets + 1) ticket i owns xfer.r[xfirst[i], xfirst[i + 1])
  int n_tickets, cap_tickets;
} comm_mpi;

int comm_dtype_bytes(comm_dtype t) {
  switch (t) {
    case COMM_F32: return 4;
    case COMM_BF16: return 2;
    case COMM_F64: return 8;
    case COMM_I32: return 4;
    case COMM_I64: return 8;
    case COMM_F16: return 2;
    case COMM_I8: return 1;
  }
  CHECK(0, "unknown comm_dtype %d", (int)t);
  return 0;
}

static MPI_Datatype comm_mpi_type(comm_dtype t) {
  switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_BF16: return MPI_UINT16_T;  // data movement only; reductions use the user ops
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I32: return MPI_INT32_T;
    case COMM_I64: return MPI_INT64_T;
    case COMM_F16: return MPI_UINT16_T;  // as bf16: user ops reduce it
    case COMM_I8: return MPI_INT8_T;
  }
  CHECK(0, "unknown comm_dtype %d", (int)t);
  return MPI_DATATYPE_NULL;
}

static MPI_Op comm_mpi_op(const comm *c, comm_dtype t, comm_redop op) {
  const comm_mpi *m = c->impl;
  CHECK(op == COMM_SUM || op == COMM_MAX, "comm %s: unknown comm_redop %d", c->name, (int)op);
  if (t == COMM_BF16) return op == COMM_SUM ? m->bf16_sum : m->bf16_max;
  if (t == COMM_F16) return op == COMM_SUM ? m->f16_sum : m->f16_max;
  return op == COMM_SUM ? MPI_SUM : MPI_MAX;
}

// ---- bf16 reductions -----------------------------------------------------------------------

static void comm_bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = k_f32_to_bf16(k_bf16_to_f32(a[i]) + k_bf16_to_f32(b[i]));
}

static void comm_bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = k_bf16_to_f32(a[i]), y = k_bf16_to_f32(b[i]);
    if (x > y || x != x) b[i] = a[i];  // NaN wins, so a diverged rank is not hidden by the max
  }
}

// fp16: each pair summed in fp32 and rounded once, as NCCL's fp16 sum does.
static void comm_f16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = k_f32_to_f16(k_f16_to_f32(a[i]) + k_f16_to_f32(b[i]));
}

static void comm_f16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) {
    float x = k_f16_to_f32(a[i]), y = k_f16_to_f32(b[i]);
    if (x > y || x != x) b[i] = a[i];
  }
}

// ---- collectives -----------------------------------------------------------------------------

static int64_t comm_chunk(const comm *c) { return ((const comm_mpi *)c->impl)->chunk_elems; }

static void comm_mpi_all_reduce(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  CHECK(n_elem >= 0, "comm %s: all_reduce of %lld elements", c->name, (long long)n_elem);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  // Elementwise, so chunks are independent.
  for (int64_t o = 0; o < n_elem; o += step) {
    int n = (int)(n_elem - o < step ? n_elem - o : step);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + o * esz, n, comm_mpi_type(t), comm_mpi_op(c, t, op), c->mpi));
  }
}

// A type that covers n contiguous elements but whose extent is one whole per-rank block
// (block_elems), so "the next rank's block" starts one block later while a call moves only
// the current chunk of each block.
static MPI_Datatype comm_block_chunk_type(comm_dtype t, int n, int64_t block_elems) {
  MPI_Datatype contig, resized;
  MPI_CHECK(MPI_Type_contiguous(n, comm_mpi_type(t), &contig));
  MPI_CHECK(MPI_Type_create_resized(contig, 0, (MPI_Aint)(block_elems * comm_dtype_bytes(t)), &resized));
  MPI_CHECK(MPI_Type_commit(&resized));
  MPI_CHECK(MPI_Type_free(&contig));
  return resized;
}

static void comm_mpi_all_gather(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  CHECK(n_elem >= 0, "comm %s: all_gather of %lld elements", c->name, (long long)n_elem);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  if (n_elem <= step) {
    MPI_CHECK(MPI_Allgather(send, (int)n_elem, comm_mpi_type(t), recv, (int)n_elem, comm_mpi_type(t), c->mpi));
    return;
  }
  for (int64_t o = 0; o < n_elem; o += step) {
    int n = (int)(n_elem - o < step ? n_elem - o : step);
    MPI_Datatype rt = comm_block_chunk_type(t, n, n_elem);
    MPI_CHECK(MPI_Allgather((const char *)send + o * esz, n, comm_mpi_type(t), (char *)recv + o * esz, 1, rt, c->mpi));
    MPI_CHECK(MPI_Type_free(&rt));
  }
}

static void comm_mpi_reduce_scatter(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, comm_redop op) {
  CHECK(n_elem >= 0, "comm %s: reduce_scatter of %lld elements", c->name, (long long)n_elem);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  if (n_elem <= step) {
    MPI_CHECK(MPI_Reduce_scatter_block(send, recv, (int)n_elem, comm_mpi_type(t), comm_mpi_op(c, t, op), c->mpi));
    return;
  }
  // Reductions only accept derived types with user ops, so instead pack chunk o of every
  // rank's block into a contiguous staging buffer per call, of at most 256 MiB.
  int64_t piece = ((int64_t)256 << 20) / esz / c->size;
  if (piece > step) piece = step;
  if (piece < 1) piece = 1;
  char *pack = XMALLOC((size_t)(c->size * piece * esz));
  for (int64_t o = 0; o < n_elem; o += piece) {
    int n = (int)(n_elem - o < piece ? n_elem - o : piece);
    for (int r = 0; r < c->size; r++)
      memcpy(pack + (int64_t)r * n * esz, (const char *)send + ((int64_t)r * n_elem + o) * esz, (size_t)(n * esz));
    MPI_CHECK(MPI_Reduce_scatter_block(pack, (char *)recv + o * esz, n, comm_mpi_type(t), comm_mpi_op(c, t, op), c->mpi));
  }
  free(pack);
}

static void comm_mpi_all_gather_regions(comm *c, void *buf, const int64_t *at, const int64_t *n_elem, int n_regions,
                                        comm_dtype t) {
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  for (int i = 0; i < n_regions; i++) {
    CHECK(n_elem[i] >= 0 && at[i] >= 0, "comm %s: all_gather_regions region %d: %lld elements at %lld", c->name, i,
          (long long)n_elem[i], (long long)at[i]);
    char *region = (char *)buf + at[i] * esz;
    for (int64_t o = 0; o < n_elem[i]; o += step) {
      int n = (int)(n_elem[i] - o < step ? n_elem[i] - o : step);
      MPI_Datatype rt = comm_block_chunk_type(t, n, n_elem[i]);
      MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, region + o * esz, 1, rt, c->mpi));
      MPI_CHECK(MPI_Type_free(&rt));
    }
  }
}

static void comm_mpi_broadcast(comm *c, void *buf, int64_t n_elem, comm_dtype t, int root) {
  CHECK(n_elem >= 0, "comm %s: broadcast of %lld elements", c->name, (long long)n_elem);
  CHECK(root >= 0 && root < c->size, "comm %s: broadcast root %d outside [0, %d)", c->name, root, c->size);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  for (int64_t o = 0; o < n_elem; o += step) {
    int n = (int)(n_elem - o < step ? n_elem - o : step);
    MPI_CHECK(MPI_Bcast((char *)buf + o * esz, n, comm_mpi_type(t), root, c->mpi));
  }
}

static void comm_mpi_all_to_all(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  CHECK(n_elem >= 0, "comm %s: all_to_all of %lld elements", c->name, (long long)n_elem);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  if (n_elem <= step) {
    MPI_CHECK(MPI_Alltoall(send, (int)n_elem, comm_mpi_type(t), recv, (int)n_elem, comm_mpi_type(t), c->mpi));
    return;
  }
  for (int64_t o = 0; o < n_elem; o += step) {
    int n = (int)(n_elem - o < step ? n_elem - o : step);
    MPI_Datatype bt = comm_block_chunk_type(t, n, n_elem);
    MPI_CHECK(MPI_Alltoall((const char *)send + o * esz, 1, bt, (char *)recv + o * esz, 1, bt, c->mpi));
    MPI_CHECK(MPI_Type_free(&bt));
  }
}

// ---- point-to-point --------------------------------------------------------------------------

// Shared by the communicator implementations (comm.h).
void comm_grow(const comm *c, void **p, int *cap, int need, size_t elem, const char *what) {
  if (need <= *cap) return;
  int n = *cap ? *cap : 16;
  while (n < need) n *= 2;
  void *q = realloc(*p, (size_t)n * elem);
  CHECK(q, "comm %s: out of memory growing the %s to %d", c->name, what, n);
  memset((char *)q + (size_t)*cap * elem, 0, (size_t)(n - *cap) * elem);
  *p = q;
  *cap = n;
}

static MPI_Request *comm_push_req(const comm *c, comm_req_list *l) {
  comm_grow(c, (void **)&l->r, &l->cap, l->n + 1, sizeof *l->r, "request list");
  return &l->r[l->n++];
}

// One tag for everything: like NCCL, messages between a pair are matched in posting order,
// so chunk k of a send meets chunk k of the receive, and callers must post in matching order.
enum { COMM_P2P_TAG = 0 };

// A send or receive in chunks of at most chunk_elems: posted into l (non-blocking), or blocking
// when l is NULL. what names it in errors.
static void comm_mpi_p2p(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer, int is_send, int tag,
                         comm_req_list *l, const char *what) {
  CHECK(n_elem >= 0, "comm %s: %s of %lld elements", c->name, what, (long long)n_elem);
  CHECK(peer >= 0 && peer < c->size, "comm %s: %s peer %d outside [0, %d)", c->name, what, peer, c->size);
  const int64_t step = comm_chunk(c), esz = comm_dtype_bytes(t);
  for (int64_t o = 0; o < n_elem || o == 0; o += step) {  // n_elem == 0 still sends one message
    int n = (int)(n_elem - o < step ? n_elem - o : step);
    char *p = (char *)buf + o * esz;
    if (is_send && l) MPI_CHECK(MPI_Isend(p, n, comm_mpi_type(t), peer, tag, c->mpi, comm_push_req(c, l)));
    else if (is_send) MPI_CHECK(MPI_Send(p, n, comm_mpi_type(t), peer, tag, c->mpi));
    else if (l) MPI_CHECK(MPI_Irecv(p, n, comm_mpi_type(t), peer, tag, c->mpi, comm_push_req(c, l)));
    else MPI_CHECK(MPI_Recv(p, n, comm_mpi_type(t), peer, tag, c->mpi, MPI_STATUS_IGNORE));
    if (n_elem == 0) break;
  }
}

static void comm_mpi_send(comm *c, const void *buf, int64_t n_elem, comm_dtype t, int peer) {
  comm_mpi *m = c->impl;
  comm_mpi_p2p(c, (void *)buf, n_elem, t, peer, 1, COMM_P2P_TAG, m->in_group ? &m->group : NULL, "send");
}

static void comm_mpi_recv(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer) {
  comm_mpi *m = c->impl;
  comm_mpi_p2p(c, buf, n_elem, t, peer, 0, COMM_P2P_TAG, m->in_group ? &m->group : NULL, "recv");
}

static void comm_mpi_group_start(comm *c) {
  comm_mpi *m = c->impl;
  // NCCL allows nesting groups; one level is all the pipeline needs, and a second start would
  // most likely be a missing group_end, so say so instead of silently nesting.
  CHECK(!m->in_group, "comm %s: group_start inside an open group (missing group_end?)", c->name);
  m->in_group = 1;
  m->group.n = 0;
}

static void comm_mpi_group_end(comm *c) {
  comm_mpi *m = c->impl;
  CHECK(m->in_group, "comm %s: group_end without group_start", c->name);
  m->in_group = 0;
  if (m->group.n) MPI_CHECK(MPI_Waitall(m->group.n, m->group.r, MPI_STATUSES_IGNORE));
  m->group.n = 0;
}

// ---- transfers overlapping compute -----------------------------------------------------------
// Non-blocking sends and receives on their own tag; the host computes meanwhile and waits for a
// ticket's requests in xfer_wait. Compute on CPU ranks is done when its call returns, so marks
// have nothing to order; nor do the pipeline's transfer tickets in `after`, since a buffer is
// handed out again only once the sends reading it were waited for (pp_exec's acts_get), and a
// host wait here could deadlock two ranks whose sends are both still unmatched. The checks are
// the NCCL communicator's, so a layout that passes here does not fail there on them.

enum { COMM_XFER_TAG = 1 };

static void comm_mpi_xfer_open(comm *c) {
  comm_mpi *m = c->impl;
  CHECK(!m->xfer_opened, "comm %s: xfer_open called twice", c->name);
  m->xfer_opened = 1;
}

static int comm_mpi_xfer_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer, int is_send,
                               const int *after, int n_after) {
  comm_mpi *m = c->impl;
  CHECK(m->xfer_opened, "comm %s: xfer_start before xfer_open", c->name);
  CHECK(peer == (c->rank + 1) % c->size || peer == (c->rank + c->size - 1) % c->size,
        "comm %s: transfer between ranks %d and %d, which are not neighbours (rank +- 1 mod %d): only the "
        "pipeline's neighbour transfers overlap compute", c->name, c->rank, peer, c->size);
  for (int i = 0; i < n_after; i++)
    CHECK(after[i] < m->n_tickets, "comm %s: transfer after ticket %d of %d", c->name, after[i], m->n_tickets);
  comm_grow(c, (void **)&m->xfirst, &m->cap_tickets, m->n_tickets + 2, sizeof *m->xfirst, "transfer tickets");
  m->xfirst[m->n_tickets] = m->xfer.n;
  comm_mpi_p2p(c, buf, n_elem, t, peer, is_send, COMM_XFER_TAG, &m->xfer, "transfer");
  m->xfirst[m->n_tickets + 1] = m->xfer.n;
  return m->n_tickets++;
}

static int comm_mpi_xfer_mark(comm *c) {
  (void)c;
  return -1;
}

static void comm_mpi_xfer_wait(comm *c, int ticket) {
  comm_mpi *m = c->impl;
  if (ticket < 0) return;
  CHECK(ticket < m->n_tickets, "comm %s: transfer ticket %d of %d", c->name, ticket, m->n_tickets);
  int a = m->xfirst[ticket];
  MPI_CHECK(MPI_Waitall(m->xfirst[ticket + 1] - a, m->xfer.r + a, MPI_STATUSES_IGNORE));
}

static void comm_mpi_xfer_reset(comm *c) {
  comm_mpi *m = c->impl;
  for (int i = 0; i < m->xfer.n; i++)
    CHECK(m->xfer.r[i] == MPI_REQUEST_NULL, "comm %s: xfer_reset with transfer request %d not waited for", c->name, i);
  m->xfer.n = m->n_tickets = 0;
}

static void comm_mpi_barrier(comm *c) { MPI_CHECK(MPI_Barrier(c->mpi)); }

static void comm_mpi_free(comm *c) {
  if (!c) return;
  comm_mpi *m = c->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize the handles are already gone; freeing them would be an error.
  if (!finalized) {
    if (m) {
      CHECK(!m->in_group, "comm %s freed with an open group", c->name);
      CHECK(m->n_started == 0, "comm %s freed with %d started collectives not waited for", c->name, m->n_started);
      MPI_CHECK(MPI_Op_free(&m->bf16_sum));
      MPI_CHECK(MPI_Op_free(&m->bf16_max));
      MPI_CHECK(MPI_Op_free(&m->f16_sum));
      MPI_CHECK(MPI_Op_free(&m->f16_max));
    }
    if (c->mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&c->mpi));
  }
  if (m) {
    free(m->group.r);
    free(m->started);
    free(m->xfer.r);
    free(m->xfirst);
  }
  free(m);
  free(c);
}

// ---- started collectives ----------------------------------------------------------------------
// The start copies what the collective reads (as a GPU's side stream reads it once the work
// queued before the start is done); the next wait or drain runs the recorded calls in order, as
// the blocking calls on those copies: the same bits. So on CPU ranks too, a result read before
// its wait is stale and data written after its start is not sent, and the CPU tests catch both.

typedef enum { STARTED_ALL_REDUCE, STARTED_REDUCE_SCATTER, STARTED_ALL_GATHER_REGIONS, STARTED_ALL_TO_ALL } comm_mpi_started_kind;

typedef struct comm_mpi_started {
  comm_mpi_started_kind kind;
  void *buf;            // all_reduce, all_gather_regions: in place; reduce_scatter: recv
  char *copy;           // what it reads, as of the start: the buffer (all_reduce), the send
                        // buffer (reduce_scatter, all_to_all), this rank's block of each region (all_gather)
  int64_t n_elem;
  comm_dtype t;
  comm_redop op;
  int64_t *at, *len;    // all_gather_regions: copies of the caller's arrays
  int n_regions;
} comm_mpi_started;

static comm_mpi_started *comm_mpi_push_started(comm *c, comm_mpi_started_kind kind, comm_dtype t) {
  comm_mpi *m = c->impl;
  comm_grow(c, (void **)&m->started, &m->cap_started, m->n_started + 1, sizeof *m->started, "started collectives");
  comm_mpi_started *s = &m->started[m->n_started++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->t = t;
  return s;
}

static char *comm_mpi_copy(const void *src, int64_t n_bytes) {
  char *p = XMALLOC((size_t)(n_bytes > 0 ? n_bytes : 1));
  if (n_bytes > 0) memcpy(p, src, (size_t)n_bytes);
  return p;
}

static void comm_mpi_all_reduce_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  comm_mpi_started *s = comm_mpi_push_started(c, STARTED_ALL_REDUCE, t);
  s->buf = buf, s->n_elem = n_elem, s->op = op;
  s->copy = comm_mpi_copy(buf, n_elem * comm_dtype_bytes(t));
}

static void comm_mpi_reduce_scatter_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                          comm_redop op) {
  comm_mpi_started *s = comm_mpi_push_started(c, STARTED_REDUCE_SCATTER, t);
  s->buf = recv, s->n_elem = n_elem, s->op = op;
  s->copy = comm_mpi_copy(send, (int64_t)c->size * n_elem * comm_dtype_bytes(t));
}

static void comm_mpi_all_to_all_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_mpi_started *s = comm_mpi_push_started(c, STARTED_ALL_TO_ALL, t);
  s->buf = recv, s->n_elem = n_elem;
  s->copy = comm_mpi_copy(send, (int64_t)c->size * n_elem * comm_dtype_bytes(t));
}

static void comm_mpi_all_gather_regions_start(comm *c, void *buf, const int64_t *at, const int64_t *n_elem,
                                              int n_regions, comm_dtype t) {
  comm_mpi_started *s = comm_mpi_push_started(c, STARTED_ALL_GATHER_REGIONS, t);
  const int64_t esz = comm_dtype_bytes(t);
  int64_t total = 0;
  for (int i = 0; i < n_regions; i++) total += n_elem[i];
  s->buf = buf, s->n_regions = n_regions;
  s->at = (int64_t *)comm_mpi_copy(at, n_regions * (int64_t)sizeof *at);
  s->len = (int64_t *)comm_mpi_copy(n_elem, n_regions * (int64_t)sizeof *n_elem);
  s->copy = XMALLOC((size_t)(total > 0 ? total * esz : 1));
  int64_t o = 0;
  for (int i = 0; i < n_regions; o += n_elem[i], i++)
    memcpy(s->copy + o * esz, (char *)buf + (at[i] + c->rank * n_elem[i]) * esz, (size_t)(n_elem[i] * esz));
}

static void comm_mpi_wait(comm *c) {
  comm_mpi *m = c->impl;
  for (int i = 0; i < m->n_started; i++) {
    comm_mpi_started *s = &m->started[i];
    const int64_t esz = comm_dtype_bytes(s->t);
    switch (s->kind) {
      case STARTED_ALL_REDUCE:
        memcpy(s->buf, s->copy, (size_t)(s->n_elem * esz));
        comm_mpi_all_reduce(c, s->buf, s->n_elem, s->t, s->op);
        break;
      case STARTED_REDUCE_SCATTER: comm_mpi_reduce_scatter(c, s->copy, s->buf, s->n_elem, s->t, s->op); break;
      case STARTED_ALL_TO_ALL: comm_mpi_all_to_all(c, s->copy, s->buf, s->n_elem, s->t); break;
      case STARTED_ALL_GATHER_REGIONS: {
        int64_t o = 0;
        for (int k = 0; k < s->n_regions; o += s->len[k], k++)
          memcpy((char *)s->buf + (s->at[k] + c->rank * s->len[k]) * esz, s->copy + o * esz, (size_t)(s->len[k] * esz));
        comm_mpi_all_gather_regions(c, s->buf, s->at, s->len, s->n_regions, s->t);
        free(s->at);
        free(s->len);
        break;
      }
    }
    free(s->copy);
  }
  m->n_started = 0;
}

static const comm_ops comm_mpi_ops = {
    .all_reduce = comm_mpi_all_reduce,
    .all_gather = comm_mpi_all_gather,
    .reduce_scatter = comm_mpi_reduce_scatter,
    .broadcast = comm_mpi_broadcast,
    .all_to_all = comm_mpi_all_to_all,
    .send = comm_mpi_send,
    .recv = comm_mpi_recv,
    .group_start = comm_mpi_group_start,
    .group_end = comm_mpi_group_end,
    .barrier = comm_mpi_barrier,
    .free = comm_mpi_free,
    .all_reduce_start = comm_mpi_all_reduce_start,
    .reduce_scatter_start = comm_mpi_reduce_scatter_start,
    .all_to_all_start = comm_mpi_all_to_all_start,
    .all_gather_regions_start = comm_mpi_all_gather_regions_start,
    .wait = comm_mpi_wait,
    .drain = comm_mpi_wait,
    .xfer_open = comm_mpi_xfer_open,
    .xfer_start = comm_mpi_xfer_start,
    .xfer_mark = comm_mpi_xfer_mark,
    .xfer_wait = comm_mpi_xfer_wait,
    .xfer_reset = comm_mpi_xfer_reset,
    .buffer_alloc = comm_no_buffer_alloc,
    .buffer_free = comm_no_buffer_free,
};

void *comm_no_buffer_alloc(comm *c, size_t n_bytes) {
  (void)c, (void)n_bytes;
  return NULL;
}

void comm_no_buffer_free(comm *c, void *buf) {
  CHECK(!buf, "comm %s: buffer_free of a buffer it never allocated (it has no copy-engine memory)", c->name);
}

comm *comm_mpi_create(MPI_Comm mpi, const char *name, const comm_opts *opts) {
  const comm_opts o = opts ? *opts : comm_opts_default();
  char who[48];
  snprintf(who, sizeof who, "comm_mpi_create(%s)", name ? name : "?");
  comm_opts_check(&o, who);
  comm *c = XCALLOC(1, sizeof *c);
  comm_mpi *m = XCALLOC(1, sizeof *m);
  c->ops = &comm_mpi_ops;
  c->impl = m;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
  // A private duplicate keeps our point-to-point traffic from ever matching messages that
  // other code sends on the communicator we were given.
  MPI_CHECK(MPI_Comm_dup(mpi, &c->mpi));
  MPI_CHECK(MPI_Comm_rank(c->mpi, &c->rank));
  MPI_CHECK(MPI_Comm_size(c->mpi, &c->size));
  MPI_CHECK(MPI_Op_create(comm_bf16_sum_fn, 1, &m->bf16_sum));
  MPI_CHECK(MPI_Op_create(comm_bf16_max_fn, 1, &m->bf16_max));
  MPI_CHECK(MPI_Op_create(comm_f16_sum_fn, 1, &m->f16_sum));
  MPI_CHECK(MPI_Op_create(comm_f16_max_fn, 1, &m->f16_max));
  m->chunk_elems = o.mpi_chunk_elems > 0 ? o.mpi_chunk_elems : INT_MAX;
  return c;
}

void comm_free(comm **c) {
  if (!c || !*c) return;
  (*c)->ops->free(*c);
  *c = NULL;
}

// ---- options and factories ---------------------------------------------------------------------

void comm_opts_check(const comm_opts *o, const char *who) {
  CHECK(o->timeout_s > 0, "%s: comm_opts.timeout_s = %g: expected a positive number of seconds (config "
        "parallel.comm_timeout_s; default %g)", who, o->timeout_s, COMM_TIMEOUT_S_DEFAULT);
  CHECK(o->max_ctas >= 0, "%s: comm_opts.max_ctas = %d: expected >= 0 (0 leaves it to NCCL; config "
        "parallel.dp_overlap_ctas for the dp-overlap communicator)", who, o->max_ctas);
  CHECK(o->mpi_chunk_elems >= 0 && o->mpi_chunk_elems <= INT_MAX, "%s: comm_opts.mpi_chunk_elems = %lld: expected "
        "an integer in [0, %d], 0 for no limit below MPI's (config parallel.mpi_chunk_elems)", who,
        (long long)o->mpi_chunk_elems, INT_MAX);
}

comm_opts comm_opts_make(double timeout_s, int max_ctas, int64_t mpi_chunk_elems, void *stream) {
  comm_opts o = {.timeout_s = timeout_s, .max_ctas = max_ctas, .mpi_chunk_elems = mpi_chunk_elems, .stream = stream};
  comm_opts_check(&o, "comm_opts_make");
  return o;
}

void comm_factory_free(comm_factory *f) {
  if (!f) return;
  if (f->free_ctx && f->ctx) f->free_ctx(f->ctx);
  f->ctx = NULL;
}

static comm *comm_mpi_factory_create(void *ctx, MPI_Comm mpi, const char *name, const comm_opts *opts) {
  (void)ctx;
  return comm_mpi_create(mpi, name, opts);
}

comm_factory comm_mpi_factory(const comm_opts *opts) {
  comm_factory f = {.create = comm_mpi_factory_create, .opts = opts ? *opts : comm_opts_default()};
  comm_opts_check(&f.opts, "comm_mpi_factory");
  return f;
}
