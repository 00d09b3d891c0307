// Peer copies on the copy engines for the tp group's gathers and reduce-scatters (comm_peer.h).
#include "parallel/comm/nccl/comm_peer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "parallel/comm/nccl/comm_nccl.h"

// ---- primitives -------------------------------------------------------------------------------

// The driver's stream memory operations (the runtime has none), looked up once.
typedef CUresult (*stream_value64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
static stream_value64_fn write_value64, wait_value64;

static stream_value64_fn driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  CHECK(q == cudaDriverEntryPointSuccess && fn, "comm_peer: the CUDA driver has no %s (parallel.tp_overlap=nccl "
        "needs none)", name);
  return (stream_value64_fn)fn;
}

static void stream_values_load(void) {
  if (write_value64) return;
  write_value64 = driver_fn("cuStreamWriteValue64");
  wait_value64 = driver_fn("cuStreamWaitValue64");
}

#define CU_CHECK(call, what)                                                                         \
  do {                                                                                               \
    CUresult cu_rc_ = (call);                                                                        \
    CHECK(cu_rc_ == CUDA_SUCCESS, "comm_peer: %s failed (CUresult %d): the GPU cannot signal a peer " \
          "through its memory; use parallel.tp_overlap=nccl", what, (int)cu_rc_);                    \
  } while (0)

void peer_signal(void *stream, uint64_t *flag, uint64_t v) {
  stream_values_load();
  CU_CHECK(write_value64((CUstream)stream, (CUdeviceptr)flag, v, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue64");
}

void peer_await(void *stream, const uint64_t *flag, uint64_t v) {
  stream_values_load();
  CU_CHECK(wait_value64((CUstream)stream, (CUdeviceptr)flag, v, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64");
}

void peer_map_all(MPI_Comm mpi, void *local, void **every) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(mpi, &rank));
  MPI_CHECK(MPI_Comm_size(mpi, &size));
  cudaIpcMemHandle_t mine, *all = XCALLOC((size_t)size, sizeof *all);
  CUDA_CHECK(cudaIpcGetMemHandle(&mine, local));
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, mpi));
  for (int i = 0; i < size; i++) {
    every[i] = local;
    if (i != rank) CUDA_CHECK(cudaIpcOpenMemHandle(&every[i], all[i], cudaIpcMemLazyEnablePeerAccess));
  }
  free(all);
}

void peer_unmap_all(MPI_Comm mpi, void **every) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(mpi, &rank));
  MPI_CHECK(MPI_Comm_size(mpi, &size));
  MPI_CHECK(MPI_Barrier(mpi));  // every rank done with the others' memory
  for (int i = 0; i < size; i++)
    if (i != rank && every[i]) CUDA_CHECK(cudaIpcCloseMemHandle(every[i]));
  MPI_CHECK(MPI_Barrier(mpi));  // every mapping of this rank's memory closed before it is freed
}

// Tries what the transport needs, without ending the job on a failure: an IPC handle of a small
// allocation opened by every other rank of mpi (containers may forbid it) and a counter written
// and awaited on the GPU. Collective. 1 when it all worked here, else 0 with why set.
static int peer_probe(MPI_Comm mpi, int rank, int size, char *why, size_t n_why) {
  int ok = 1;
  void *buf = NULL;
  cudaIpcMemHandle_t mine, *all = XCALLOC((size_t)size, sizeof *all);
  memset(&mine, 0, sizeof mine);
  cudaError_t e = cudaMalloc(&buf, 256);
  if (e == cudaSuccess) e = cudaMemset(buf, 0, 256);
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine, buf);
  if (e != cudaSuccess) {
    snprintf(why, n_why, "rank %d cannot export its memory through CUDA IPC: %s", rank, cudaGetErrorString(e));
    ok = 0;
  }
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, mpi));
  int all_exported = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_exported, 1, MPI_INT, MPI_MIN, mpi));
  for (int i = 0; i < size && all_exported && ok; i++) {
    if (i == rank) continue;
    void *q = NULL;
    e = cudaIpcOpenMemHandle(&q, all[i], cudaIpcMemLazyEnablePeerAccess);
    if (e == cudaSuccess) e = cudaIpcCloseMemHandle(q);
    if (e != cudaSuccess) {
      snprintf(why, n_why, "rank %d cannot map rank %d's memory through CUDA IPC: %s", rank, i, cudaGetErrorString(e));
      ok = 0;
    }
  }
  if (ok && buf) {
    stream_values_load();
    CUresult r = write_value64(NULL, (CUdeviceptr)buf, 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r == CUDA_SUCCESS) r = wait_value64(NULL, (CUdeviceptr)buf, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS && cudaDeviceSynchronize() != cudaSuccess) r = CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS) {
      snprintf(why, n_why, "rank %d's GPU cannot write and await counters in its memory (CUresult %d)", rank, (int)r);
      ok = 0;
    }
  }
  (void)cudaGetLastError();  // a failure above is reported, not left for the next call
  MPI_CHECK(MPI_Barrier(mpi));  // every mapping closed before the memory goes
  if (buf) CUDA_CHECK(cudaFree(buf));
  free(all);
  return ok;
}

int comm_peer_possible(MPI_Comm mpi, char *why, size_t n_why) {
  int rank = 0, size = 0, dev = 0, node_size = 0;
  MPI_CHECK(MPI_Comm_rank(mpi, &rank));
  MPI_CHECK(MPI_Comm_size(mpi, &size));
  CUDA_CHECK(cudaGetDevice(&dev));
  // Ranks on other nodes cannot map each other's memory: the group must share one node, as MPI
  // sees nodes (MPI_COMM_TYPE_SHARED, the project's notion of a node: launch.c, comm_nccl.c).
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  MPI_CHECK(MPI_Comm_free(&node));
  int *devs = XCALLOC((size_t)size, sizeof *devs);
  MPI_CHECK(MPI_Allgather(&dev, 1, MPI_INT, devs, 1, MPI_INT, mpi));
  char mine[256] = "";
  if (node_size < size)
    snprintf(mine, sizeof mine, "the group's %d ranks span nodes (rank %d shares its node with %d of them)", size, rank,
             node_size);
  for (int i = 0; i < size && !mine[0]; i++) {
    int can = 0;
    if (i != rank && devs[i] != dev) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, devs[i]));
    if (i != rank && !can)
      snprintf(mine, sizeof mine, "rank %d (GPU %d) cannot access the memory of rank %d (GPU %d)", rank, dev, i, devs[i]);
  }
  int all_ok = !mine[0], ok = 0;
  MPI_CHECK(MPI_Allreduce(&all_ok, &ok, 1, MPI_INT, MPI_MIN, mpi));
  if (ok) {
    all_ok = peer_probe(mpi, rank, size, mine, sizeof mine);
    MPI_CHECK(MPI_Allreduce(&all_ok, &ok, 1, MPI_INT, MPI_MIN, mpi));
  }
  if (!ok && why) snprintf(why, n_why, "%s", mine[0] ? mine : "another rank of the group cannot reach a peer's memory");
  free(devs);
  return ok;
}

// ---- the communicator -------------------------------------------------------------------------

typedef enum peer_op { PEER_GATHER, PEER_REDUCE } peer_op;

#define PEER_MAX_REGIONS 8
#define PEER_MAX_PENDING 4

// Where peers put what they send for one operation: size slots of slot_bytes, slot s holding
// what rank s sent here; mapped on every rank. last_seq: the operation that used it last (the
// same on every rank: every rank starts the same operations in the same order).
typedef struct peer_staging {
  char *mine;
  void **of;
  size_t slot_bytes;
  uint64_t last_seq;
} peer_staging;

// An operation started and not yet waited for; the i-th pending one uses staging i.
typedef struct peer_pending {
  peer_op op;
  uint64_t seq;
  uint64_t prev_seq; // the operation that used the same staging before (0: none)
  char *buf;         // gather: the buffer; reduce: recv
  const char *own;   // reduce: this rank's block of send; NULL: recv accumulates
  int n_regions;
  int64_t at_bytes[PEER_MAX_REGIONS], block_bytes[PEER_MAX_REGIONS];  // gather: region i's start and block
  int64_t n_elem;    // reduce: elements of a block
  k_dtype elem;      // reduce: the blocks' dtype (fp32, or bf16 added into fp32 recv)
  uint64_t placed;   // bit r: rank r's blocks are in place (queued on the compute stream); the group is
                     // the GPUs of one host (comm_peer_possible), far fewer than 64
} peer_pending;

typedef struct comm_peer {
  comm *inner;  // NCCL: every other call
  k_backend *be;
  cudaStream_t stream;        // the compute stream
  cudaStream_t *copy;         // (size) this rank's copies to rank r on copy[r], one stream per peer so the
                              // copies to several peers run at once, each on a copy engine
  cudaEvent_t queued;         // the compute queued before the newest operation
  cudaEvent_t *pushed;        // (size) copy[r]'s copies of the newest operation done
  uint64_t *flags;            // this rank's counters: [i size, (i + 1) size) for staging i, the last operation
                              // each rank has consumed from it there; [PEER_MAX_PENDING size, + size) the
                              // last operation arrived from each rank
  void **flags_of;            // every rank's counters, mapped
  peer_staging stage[PEER_MAX_PENDING];
  uint64_t seq;               // operations started so far (the same on every rank)
  peer_pending pending[PEER_MAX_PENDING];
  int n_pending;
} comm_peer;

static const comm_ops comm_peer_ops;
int comm_peer_is(const comm *c) { return c && c->ops == &comm_peer_ops; }

static comm_peer *impl(const comm *c) { return c->impl; }

// Every copy stream of this rank drained.
static void copies_synchronize(const comm *c) {
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) CUDA_CHECK(cudaStreamSynchronize(impl(c)->copy[r]));
}

// The copies queued so far on the copy stream to rank r (on every copy stream where r < 0),
// marked for peer_wait.
static void copies_mark(const comm *c, int r) {
  for (int q = 0; q < c->size; q++)
    if (q != c->rank && (r < 0 || q == r)) CUDA_CHECK(cudaEventRecord(impl(c)->pushed[q], impl(c)->copy[q]));
}
// In of_rank's memory, written by from: the last operation of which from has consumed what
// of_rank put into from's staging i.
static uint64_t *freed_flag(comm_peer *p, int of_rank, int i, int from, int size) {
  return (uint64_t *)p->flags_of[of_rank] + (size_t)i * (size_t)size + from;
}
// In of_rank's memory, written by from: the last operation whose blocks from has put there.
static uint64_t *arrived_flag(comm_peer *p, int of_rank, int from, int size) {
  return (uint64_t *)p->flags_of[of_rank] + (size_t)PEER_MAX_PENDING * (size_t)size + from;
}

static void staging_free(comm *c, peer_staging *st) {
  if (!st->mine) return;
  peer_unmap_all(c->mpi, st->of);
  impl(c)->be->free(impl(c)->be, st->mine);
  free(st->of);
  memset(st, 0, sizeof *st);
}

// Staging i for n_bytes per slot. Growing is collective (every rank asks for the same sizes in
// the same order); no operation is pending on it, and this rank's streams drain first, so every
// peer copy into the old staging has landed and been consumed.
static void staging_reserve(comm *c, int i, size_t n_bytes) {
  comm_peer *p = impl(c);
  peer_staging *st = &p->stage[i];
  if (n_bytes <= st->slot_bytes) return;
  CUDA_CHECK(cudaStreamSynchronize(p->stream));
  copies_synchronize(c);
  staging_free(c, st);
  st->slot_bytes = (n_bytes + 255) / 256 * 256;
  st->mine = k_alloc_as(p->be, st->slot_bytes * (size_t)c->size, K_MEM_WORKSPACE);
  st->of = XCALLOC((size_t)c->size, sizeof *st->of);
  CUDA_CHECK(cudaStreamSynchronize(p->stream));  // the zero fill done before a peer writes
  peer_map_all(c->mpi, st->mine, st->of);
}

// The copy stream to rank r (to every peer where r < 0) waits for the compute queued so far (the
// data of the next push).
static void copies_after_compute(comm *c, int r) {
  comm_peer *p = impl(c);
  CUDA_CHECK(cudaEventRecord(p->queued, p->stream));
  for (int q = 0; q < c->size; q++)
    if (q != c->rank && (r < 0 || q == r)) CUDA_CHECK(cudaStreamWaitEvent(p->copy[q], p->queued, 0));
}

// The common start: staging for n_bytes, and this rank's copy streams wait for the compute
// queued so far (the data). Returns the operation's record. No rendezvous: a push waits only
// until the peer has consumed the operation that used the same staging before (its peer_wait
// says so), so a rank ahead of its peer delivers early and the peer finds its blocks there.
static peer_pending *op_begin(comm *c, peer_op op, size_t n_bytes) {
  comm_peer *p = impl(c);
  CHECK(p->n_pending < PEER_MAX_PENDING, "comm %s: more than %d gathers and reduce-scatters started before a wait",
        c->name, PEER_MAX_PENDING);
  staging_reserve(c, p->n_pending, n_bytes);
  peer_pending *o = &p->pending[p->n_pending++];
  memset(o, 0, sizeof *o);
  o->op = op;
  o->seq = ++p->seq;
  o->prev_seq = p->stage[p->n_pending - 1].last_seq;
  p->stage[p->n_pending - 1].last_seq = o->seq;
  copies_after_compute(c, -1);
  return o;
}

// On the copy stream, for the newest pending operation: once rank r has consumed the previous
// operation in its staging, n_bytes from src into its slot for this rank at offset; with last,
// r's arrival counter for this rank is raised after.
static void push(comm *c, int r, const void *src, size_t offset, size_t n_bytes, int first, int last) {
  comm_peer *p = impl(c);
  const int i = p->n_pending - 1;
  const uint64_t seq = p->pending[i].seq, prev = p->pending[i].prev_seq;
  if (first && prev) peer_await(p->copy[r], freed_flag(p, c->rank, i, r, c->size), prev);
  char *dst = (char *)p->stage[i].of[r] + (size_t)c->rank * p->stage[i].slot_bytes + offset;
  if (n_bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, p->copy[r]));
  if (last) peer_signal(p->copy[r], arrived_flag(p, r, c->rank, c->size), seq);
}

static void peer_all_gather_regions_start(comm *c, void *buf, const int64_t *at, const int64_t *n_elem, int n_regions,
                                          comm_dtype t) {
  CHECK(n_regions >= 1 && n_regions <= PEER_MAX_REGIONS, "comm %s: %d regions in one gather (1 to %d)", c->name,
        n_regions, PEER_MAX_REGIONS);
  const int64_t esz = comm_dtype_bytes(t);
  size_t total = 0;
  for (int i = 0; i < n_regions; i++) {
    CHECK(at[i] >= 0 && n_elem[i] >= 0, "comm %s: all_gather_regions region %d: %lld elements at %lld", c->name, i,
          (long long)n_elem[i], (long long)at[i]);
    total += (size_t)(n_elem[i] * esz);
  }
  peer_pending *o = op_begin(c, PEER_GATHER, total);
  o->buf = buf;
  o->n_regions = n_regions;
  for (int i = 0; i < n_regions; i++) {
    o->at_bytes[i] = at[i] * esz;
    o->block_bytes[i] = n_elem[i] * esz;
  }
  for (int k = 1; k < c->size; k++) {  // ring order: each rank receives one block at a time
    const int r = comm_ring_to(c, k);
    size_t off = 0;
    for (int i = 0; i < n_regions; i++) {
      const char *mine = o->buf + o->at_bytes[i] + c->rank * o->block_bytes[i];
      push(c, r, mine, off, (size_t)o->block_bytes[i], i == 0, i == n_regions - 1);
      off += (size_t)o->block_bytes[i];
    }
  }
  copies_mark(c, -1);
}

// The other ranks' blocks of send (fp32) pushed to them in ring order; at the wait, recv = this
// rank's block of send plus theirs.
static void peer_reduce_scatter_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                      comm_redop op) {
  comm_peer *p = impl(c);
  if (t != COMM_F32 || op != COMM_SUM) {  // not the tp regions' reduction: NCCL's
    p->inner->ops->reduce_scatter_start(p->inner, send, recv, n_elem, t, op);
    return;
  }
  CHECK(n_elem >= 0, "comm %s: reduce_scatter of %lld elements", c->name, (long long)n_elem);
  const size_t block = (size_t)n_elem * sizeof(float);
  peer_pending *o = op_begin(c, PEER_REDUCE, block);
  o->buf = recv;
  o->own = (const char *)send + (size_t)c->rank * block;
  o->n_elem = n_elem;
  o->elem = K_F32;
  for (int k = 1; k < c->size; k++) {
    const int to = comm_ring_to(c, k);
    push(c, to, (const char *)send + (size_t)to * block, 0, block, 1, 1);
  }
  copies_mark(c, -1);
}

// Block `to` of send pushed as soon as the compute queued so far has written it; the first
// block (to = rank + 1) starts the operation (comm.h: the blocks come in ring order).
static void peer_reduce_scatter_add_block(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                          int to) {
  comm_peer *p = impl(c);
  CHECK(n_elem >= 0 && to >= 0 && to < c->size && to != c->rank && (t == COMM_F32 || t == COMM_BF16),
        "comm %s: reduce_scatter_add_block of %lld elements of dtype %d to rank %d", c->name, (long long)n_elem, (int)t,
        to);
  const size_t block = (size_t)n_elem * (size_t)comm_dtype_bytes(t);
  if (to == comm_ring_to(c, 1)) {
    peer_pending *o = op_begin(c, PEER_REDUCE, block);
    o->buf = recv;
    o->n_elem = n_elem;
    o->elem = t == COMM_BF16 ? K_BF16 : K_F32;
  } else {
    CHECK(p->n_pending && p->pending[p->n_pending - 1].op == PEER_REDUCE && p->pending[p->n_pending - 1].buf == recv,
          "comm %s: reduce_scatter_add_block to rank %d before the block to rank %d", c->name, to, comm_ring_to(c, 1));
    copies_after_compute(c, to);
  }
  push(c, to, (const char *)send + (size_t)to * block, 0, block, 1, 1);
  copies_mark(c, to);
}

// Rank `from`'s blocks of pending operation i into place on the compute stream, once they have
// arrived: a gather's blocks copied from the staging to their rows, a reduction's block added.
static void op_place(comm *c, int i, int from) {
  comm_peer *p = impl(c);
  peer_pending *o = &p->pending[i];
  const peer_staging *st = &p->stage[i];
  if (o->placed >> from & 1) return;
  o->placed |= 1ull << from;
  peer_await(p->stream, arrived_flag(p, c->rank, from, c->size), o->seq);
  const char *slot = st->mine + (size_t)from * st->slot_bytes;
  if (o->op == PEER_REDUCE) {
    p->be->add(p->be, (float *)o->buf, slot, o->elem, o->n_elem);
    return;
  }
  size_t off = 0;
  for (int k = 0; k < o->n_regions; k++) {
    char *dst = o->buf + o->at_bytes[k] + from * o->block_bytes[k];
    if (o->block_bytes[k])
      CUDA_CHECK(cudaMemcpyAsync(dst, slot + off, (size_t)o->block_bytes[k], cudaMemcpyDeviceToDevice, p->stream));
    off += (size_t)o->block_bytes[k];
  }
}

// Every pending operation completes on the compute stream: the blocks put in place as they arrive
// (ring order, the order they are sent in; a reduction adds them after this rank's own block, or
// onto what recv holds: with two ranks the sum of two is the same either way round), the compute
// stream waits for this rank's copies, and each peer may fill the stagings again. Also waits for
// what was started on the NCCL communicator.
static void peer_wait(comm *c) {
  comm_peer *p = impl(c);
  p->inner->ops->wait(p->inner);
  if (!p->n_pending) return;
  for (int i = 0; i < p->n_pending; i++) {
    const peer_pending *o = &p->pending[i];
    if (o->op == PEER_REDUCE && o->own && o->buf != o->own)
      p->be->copy(p->be, o->buf, o->own, (size_t)o->n_elem * sizeof(float));
    for (int k = 1; k < c->size; k++) op_place(c, i, comm_ring_from(c, k));
  }
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) CUDA_CHECK(cudaStreamWaitEvent(p->stream, p->pushed[r], 0));
  for (int i = 0; i < p->n_pending; i++)
    for (int r = 0; r < c->size; r++)  // staging i consumed: each peer may fill it again
      if (r != c->rank) peer_signal(p->stream, freed_flag(p, r, i, c->rank, c->size), p->pending[i].seq);
  p->n_pending = 0;
}

// One gather pending: rank from's blocks in place (the rest at the wait); else peer_wait.
static void peer_wait_from(comm *c, int from) {
  comm_peer *p = impl(c);
  CHECK(from >= 0 && from < c->size, "comm %s: wait_from rank %d of %d", c->name, from, c->size);
  if (p->n_pending != 1 || p->pending[0].op != PEER_GATHER) {
    peer_wait(c);
    return;
  }
  p->inner->ops->wait(p->inner);
  if (from != c->rank) op_place(c, 0, from);
}

// A started gather or reduce-scatter completes on the compute stream (its wait puts the blocks in
// place), so a drain with one pending waits for it there, bounded as NCCL's waits are.
static void peer_drain(comm *c) {
  comm_peer *p = impl(c);
  p->inner->ops->drain(p->inner);
  if (p->n_pending) {
    peer_wait(c);
    comm_nccl_wait(p->inner);
  }
  copies_synchronize(c);
}

static void peer_free(comm *c) {
  comm_peer *p = impl(c);
  CUDA_CHECK(cudaStreamSynchronize(p->stream));
  copies_synchronize(c);
  for (int i = 0; i < PEER_MAX_PENDING; i++) staging_free(c, &p->stage[i]);
  peer_unmap_all(c->mpi, p->flags_of);
  p->be->free(p->be, p->flags);
  CUDA_CHECK(cudaEventDestroy(p->queued));
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    CUDA_CHECK(cudaEventDestroy(p->pushed[r]));
    CUDA_CHECK(cudaStreamDestroy(p->copy[r]));
  }
  free(p->pushed);
  free(p->copy);
  comm_free(&p->inner);
  MPI_CHECK(MPI_Comm_free(&c->mpi));
  free(p->flags_of);
  free(p);
  free(c);
}

// ---- everything else: the NCCL communicator ---------------------------------------------------

#define INNER(c) (impl(c)->inner)
static void fwd_all_reduce(comm *c, void *buf, int64_t n, comm_dtype t, comm_redop op) {
  INNER(c)->ops->all_reduce(INNER(c), buf, n, t, op);
}
static void fwd_all_gather(comm *c, const void *send, void *recv, int64_t n, comm_dtype t) {
  INNER(c)->ops->all_gather(INNER(c), send, recv, n, t);
}
static void fwd_reduce_scatter(comm *c, const void *send, void *recv, int64_t n, comm_dtype t, comm_redop op) {
  INNER(c)->ops->reduce_scatter(INNER(c), send, recv, n, t, op);
}
static void fwd_broadcast(comm *c, void *buf, int64_t n, comm_dtype t, int root) {
  INNER(c)->ops->broadcast(INNER(c), buf, n, t, root);
}
static void fwd_all_to_all(comm *c, const void *send, void *recv, int64_t n, comm_dtype t) {
  INNER(c)->ops->all_to_all(INNER(c), send, recv, n, t);
}
static void fwd_send(comm *c, const void *buf, int64_t n, comm_dtype t, int peer) {
  INNER(c)->ops->send(INNER(c), buf, n, t, peer);
}
static void fwd_recv(comm *c, void *buf, int64_t n, comm_dtype t, int peer) {
  INNER(c)->ops->recv(INNER(c), buf, n, t, peer);
}
static void fwd_group_start(comm *c) { INNER(c)->ops->group_start(INNER(c)); }
static void fwd_group_end(comm *c) { INNER(c)->ops->group_end(INNER(c)); }
static void fwd_barrier(comm *c) { INNER(c)->ops->barrier(INNER(c)); }
static void fwd_all_reduce_start(comm *c, void *buf, int64_t n, comm_dtype t, comm_redop op) {
  INNER(c)->ops->all_reduce_start(INNER(c), buf, n, t, op);
}
static void fwd_all_to_all_start(comm *c, const void *send, void *recv, int64_t n, comm_dtype t) {
  INNER(c)->ops->all_to_all_start(INNER(c), send, recv, n, t);
}
static void fwd_xfer_open(comm *c) { INNER(c)->ops->xfer_open(INNER(c)); }
static int fwd_xfer_start(comm *c, void *buf, int64_t n, comm_dtype t, int peer, int is_send, const int *after,
                          int n_after) {
  return INNER(c)->ops->xfer_start(INNER(c), buf, n, t, peer, is_send, after, n_after);
}
static int fwd_xfer_mark(comm *c) { return INNER(c)->ops->xfer_mark(INNER(c)); }
static void fwd_xfer_wait(comm *c, int ticket) { INNER(c)->ops->xfer_wait(INNER(c), ticket); }
static void fwd_xfer_reset(comm *c) { INNER(c)->ops->xfer_reset(INNER(c)); }
static void *fwd_buffer_alloc(comm *c, size_t n) { return INNER(c)->ops->buffer_alloc(INNER(c), n); }
static void fwd_buffer_free(comm *c, void *buf) { INNER(c)->ops->buffer_free(INNER(c), buf); }

static const comm_ops comm_peer_ops = {
    .all_reduce = fwd_all_reduce,
    .all_gather = fwd_all_gather,
    .reduce_scatter = fwd_reduce_scatter,
    .broadcast = fwd_broadcast,
    .all_to_all = fwd_all_to_all,
    .send = fwd_send,
    .recv = fwd_recv,
    .group_start = fwd_group_start,
    .group_end = fwd_group_end,
    .barrier = fwd_barrier,
    .free = peer_free,
    .all_reduce_start = fwd_all_reduce_start,
    .reduce_scatter_start = peer_reduce_scatter_start,
    .reduce_scatter_add_block = peer_reduce_scatter_add_block,
    .all_to_all_start = fwd_all_to_all_start,
    .all_gather_regions_start = peer_all_gather_regions_start,
    .wait = peer_wait,
    .wait_from = peer_wait_from,
    .drain = peer_drain,
    .xfer_open = fwd_xfer_open,
    .xfer_start = fwd_xfer_start,
    .xfer_mark = fwd_xfer_mark,
    .xfer_wait = fwd_xfer_wait,
    .xfer_reset = fwd_xfer_reset,
    .buffer_alloc = fwd_buffer_alloc,
    .buffer_free = fwd_buffer_free,
};

comm *comm_peer_create(comm *inner, k_backend *be) {
  CHECK(inner && be, "comm_peer_create: no communicator or backend");
  comm *c = XCALLOC(1, sizeof *c);
  comm_peer *p = XCALLOC(1, sizeof *p);
  c->ops = &comm_peer_ops;
  c->impl = p;
  c->rank = inner->rank;
  c->size = inner->size;
  snprintf(c->name, sizeof c->name, "%s", inner->name);
  MPI_CHECK(MPI_Comm_dup(inner->mpi, &c->mpi));
  p->inner = inner;
  p->be = be;
  p->stream = (cudaStream_t)k_cuda_stream_of(be);
  stream_values_load();
  int lo = 0, hi = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  p->copy = XCALLOC((size_t)c->size, sizeof *p->copy);
  p->pushed = XCALLOC((size_t)c->size, sizeof *p->pushed);
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    CUDA_CHECK(cudaStreamCreateWithPriority(&p->copy[r], cudaStreamNonBlocking, hi));
    CUDA_CHECK(cudaEventCreateWithFlags(&p->pushed[r], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaEventCreateWithFlags(&p->queued, cudaEventDisableTiming));
  p->flags_of = XCALLOC((size_t)c->size, sizeof *p->flags_of);
  p->flags = k_alloc_as(be, (PEER_MAX_PENDING + 1) * (size_t)c->size * sizeof(uint64_t), K_MEM_WORKSPACE);  // zero-filled
  CUDA_CHECK(cudaStreamSynchronize(p->stream));
  peer_map_all(c->mpi, p->flags, p->flags_of);
  return c;
}
