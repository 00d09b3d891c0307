// NCCL implementation of the communicator table over device buffers: what GPU ranks use for
// TP, DP and pipeline traffic. Each communicator is a non-blocking NCCL communicator (so no
// NCCL call can block the host forever) bootstrapped over a duplicate of its MPI group, and
// enqueues every operation on the one CUDA stream of its options. Errors and hangs (a wait
// longer than its timeout_s) end the job with a message that names the group and the
// operation; see comm_nccl.h for what "complete" means here. What the communicators of one
// factory share lives in its comm_nccl_world; there is no file-scope state.
#include "parallel/comm/nccl/comm_nccl.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"
#include "parallel/comm/nccl/nccl_check.h"

// The state the communicators of one factory share (comm_nccl_factory): "world" as in all the
// NCCL communicators of this process, not MPI_COMM_WORLD.
typedef struct comm_nccl_world {
  comm *live;               // its live communicators, all aborted together on a failure
  // NCCL groups span communicators (and belong to the calling thread: the trainer calls from
  // one), so the depth is the factory's, not a communicator's: a collective issued inside any
  // open group is deferred too.
  int group_depth;
  int group_ops;            // send/recv calls in the open group, for the failure message
} comm_nccl_world;

enum { COMM_NCCL_MAX_WINDOWS = 16 };

typedef struct comm_nccl {
  comm_nccl_world *world;   // of the factory that made it
  comm_opts opts;           // as made; the transfer links (xfer_open) are made with them too
  ncclComm_t nccl;          // NULL once destroyed or aborted
  cudaStream_t stream;      // every operation of this communicator is enqueued here (opts.stream)
  cudaStream_t side;        // asynchronous collectives (the *_start calls); made on first use
  cudaEvent_t ready, done;  // stream -> side (work queued before a start), side -> stream (wait)
  int n_started;            // asynchronous collectives started since the last wait
  int *scratch;             // (1) device int, the payload of barrier's all-reduce
  char last_op[96];         // the operation enqueued last, named when a wait fails
  comm *next_live;          // next in world->live
  // Transfers overlapping compute (xfer_*): one communicator, on its own stream, per class of
  // directed link (comm_nccl_link_class); tickets are events, recorded on the compute stream
  // (marks) or on a link's stream after its transfer.
  comm *link[6];
  cudaEvent_t *tickets;
  char *in_flight;          // (cap_tickets) a transfer's ticket not yet waited for (marks: 0)
  int n_tickets, cap_tickets;
  // buffer_alloc's buffers, each registered as a symmetric window of this communicator.
  struct { void *buf; ncclWindow_t win; } windows[COMM_NCCL_MAX_WINDOWS];
  int n_windows;
} comm_nccl;

static const comm_ops comm_nccl_ops;
static comm *comm_nccl_create(comm_nccl_world *w, MPI_Comm mpi, const char *name, const comm_opts *opts);

// ---- device selection -------------------------------------------------------------------------

// This rank's place on its node: rank and size of MPI_COMM_TYPE_SHARED over MPI_COMM_WORLD.
static void comm_nccl_node(int *rank, int *size) {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, rank));
  MPI_CHECK(MPI_Comm_size(node, size));
  MPI_CHECK(MPI_Comm_free(&node));
}

int comm_nccl_local_rank(void) {
  int rank = 0, size = 0;
  comm_nccl_node(&rank, &size);
  return rank;
}

int comm_nccl_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver is an answer here, not an error to leave pending
    n = 0;
  }
  return n;
}

int comm_nccl_set_device(void) {
  int local = 0, local_size = 0, n = comm_nccl_device_count();
  comm_nccl_node(&local, &local_size);
  CHECK(n > 0, "no CUDA device is visible to this rank (node-local rank %d): run on a GPU host, check "
               "CUDA_VISIBLE_DEVICES, or use the CPU backend", local);
  // NCCL refuses two ranks of one communicator on one GPU, so say so before it does, in words.
  CHECK(local_size <= n, "%d ranks run on this node but it has %d visible GPUs: NCCL needs one GPU per rank; start "
                         "at most %d ranks per node (or, to test a layout, parallel.gpu_comm=mpi lets ranks "
                         "share a GPU, slowly)", local_size, n, n);
  int d = local % n;
  CUDA_CHECK(cudaSetDevice(d));
  return d;
}

int comm_nccl_is(const comm *c) { return c && c->ops == &comm_nccl_ops; }

void *comm_nccl_stream(const comm *c) {
  return comm_nccl_is(c) ? (void *)((const comm_nccl *)c->impl)->stream : NULL;
}

// ---- failure path -----------------------------------------------------------------------------

static double comm_nccl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Busy-polls for the first few thousand rounds (collectives of small messages finish within
// microseconds), then sleeps briefly so a long wait does not burn a core next to the data loader.
static void comm_nccl_pause(long spin) {
  if (spin < 4096) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
}

// Kills every NCCL communicator of w (in the trainer: of this process): kernels waiting on a dead
// peer only return once their communicator is aborted, and MPI_Abort should not have to tear
// down spinning GPUs.
static void comm_nccl_abort_all(comm_nccl_world *w) {
  for (comm *c = w->live; c; c = ((comm_nccl *)c->impl)->next_live) {
    comm_nccl *m = c->impl;
    if (m->nccl) {
      ncclComm_t n = m->nccl;
      m->nccl = NULL;
      (void)ncclCommAbort(n);
    }
  }
}

#define COMM_NCCL_ABORT_S 10  // longest wait for the communicators' abort before the process ends

// Same layout as check_fail (kernels/base/check.c), but the message is printed before the
// communicators are aborted: ncclCommAbort can block on a wedged GPU, and the reason must be
// out by then. Never returns.
static void comm_nccl_die(const comm *c, const char *func, const char *file, int line, const char *what,
                          const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int rank = 0, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "[rank %d] error in %s (%s:%d): %s\n  group '%s' rank %d of %d, device %d\n  failed: %s\n", rank,
          func, file, line, msg, c->name, c->rank, c->size, nccl_check_device(), what);
  fflush(stderr);
  // A peer that is stopped rather than dead (SIGSTOP, a wedged host) can hold NCCL's teardown
  // forever: past COMM_NCCL_ABORT_S the process ends on SIGALRM, which the launcher sees as a dead
  // rank and ends the job for.
  alarm(COMM_NCCL_ABORT_S);
  comm_nccl_abort_all(((const comm_nccl *)c->impl)->world);
  if (inited) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

static void comm_nccl_die_rc(const comm *c, ncclResult_t rc, const char *what, const char *func, const char *file,
                             int line) {
  const comm_nccl *m = c->impl;
  comm_nccl_die(c, func, file, line, what, "nccl: group '%s' %s failed: %s (%s)", c->name, m->last_op,
                ncclGetErrorString(rc), ncclGetLastError(m->nccl));
}

static void comm_nccl_die_timeout(const comm *c, double waited, const char *what, const char *func, const char *file,
                                  int line) {
  const comm_nccl *m = c->impl;
  comm_nccl_die(c, func, file, line, what,
                "nccl: group '%s' %s did not complete within %g s: a peer rank died or hung; the first error is "
                "in the other ranks' output; if the work is legitimately this slow, raise the communicator timeout "
                "(parallel.comm_timeout_s)",
                c->name, m->last_op, waited);
}

// Records what the next call enqueues, for the messages above.
static void comm_nccl_note(comm *c, const char *fmt, ...) {
  comm_nccl *m = c->impl;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->last_op, sizeof m->last_op, fmt, ap);
  va_end(ap);
}

// A non-blocking communicator may answer any call with ncclInProgress: NCCL finishes the call
// in the background (connection set-up, init, finalize) and the communicator must not be used
// again until ncclCommGetAsyncError stops saying so. Calls inside an open group only record
// work, which ncclGroupEnd launches, so there is nothing to poll yet.
static void comm_nccl_settle(comm *c, ncclResult_t rc, const char *what, const char *func, const char *file,
                             int line) {
  comm_nccl *m = c->impl;
  if (rc != ncclSuccess && rc != ncclInProgress) comm_nccl_die_rc(c, rc, what, func, file, line);
  if (rc == ncclSuccess && m->world->group_depth > 0) return;
  double start = 0, limit = m->opts.timeout_s;
  for (long spin = 0;; spin++) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(m->nccl, &st);
    if (q != ncclSuccess) comm_nccl_die_rc(c, q, "ncclCommGetAsyncError", func, file, line);
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) comm_nccl_die_rc(c, st, what, func, file, line);
    if (spin == 0) {
      start = comm_nccl_now();
    } else if (comm_nccl_now() - start > limit) {
      comm_nccl_die_timeout(c, limit, what, func, file, line);
    }
    comm_nccl_pause(spin);
  }
}

#define COMM_NCCL_CALL(c, call) comm_nccl_settle((c), (call), #call, __func__, __FILE__, __LINE__)

// Waits for c's stream to drain, watching NCCL's error state and the clock meanwhile.
static void comm_nccl_drain_stream(comm *c, cudaStream_t stream, const char *func, const char *file, int line) {
  comm_nccl *m = c->impl;
  double start = comm_nccl_now(), limit = m->opts.timeout_s;
  for (long spin = 0;; spin++) {
    cudaError_t e = cudaStreamQuery(stream);
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(m->nccl, &st);
    if (q != ncclSuccess) comm_nccl_die_rc(c, q, "ncclCommGetAsyncError", func, file, line);
    // An NCCL error can also make its kernels return early, so the stream drains with wrong
    // data: the error state is checked on the way out too.
    if (st != ncclSuccess && st != ncclInProgress) comm_nccl_die_rc(c, st, "cudaStreamQuery (waiting)", func, file, line);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady)
      comm_nccl_die(c, func, file, line, "cudaStreamQuery(stream)",
                    "nccl: group '%s' stream failed while waiting for %s: %s: %s (a kernel on the same stream may "
                    "have faulted)", c->name, m->last_op, cudaGetErrorName(e), cudaGetErrorString(e));
    if (comm_nccl_now() - start > limit) comm_nccl_die_timeout(c, limit, "cudaStreamQuery (waiting)", func, file, line);
    comm_nccl_pause(spin);
  }
}

static void comm_nccl_drain(comm *c, const char *func, const char *file, int line) {
  comm_nccl_drain_stream(c, ((comm_nccl *)c->impl)->stream, func, file, line);
}

// ---- operations -------------------------------------------------------------------------------

static const char *comm_nccl_dtype_name(comm_dtype t) {
  switch (t) {
    case COMM_F32: return "f32";
    case COMM_BF16: return "bf16";
    case COMM_F64: return "f64";
    case COMM_I32: return "i32";
    case COMM_I64: return "i64";
    case COMM_F16: return "f16";
    case COMM_I8: return "i8";
  }
  return "?";
}

static ncclDataType_t comm_nccl_type(const comm *c, comm_dtype t) {
  switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_BF16: return ncclBfloat16;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    case COMM_F16: return ncclFloat16;
    case COMM_I8: return ncclInt8;
  }
  CHECK(0, "comm %s: unknown comm_dtype %d", c->name, (int)t);
  return ncclFloat32;
}

static ncclRedOp_t comm_nccl_op(const comm *c, comm_redop op) {
  CHECK(op == COMM_SUM || op == COMM_MAX, "comm %s: unknown comm_redop %d", c->name, (int)op);
  return op == COMM_SUM ? ncclSum : ncclMax;
}

static comm_nccl *comm_nccl_live_impl(const comm *c, const char *what) {
  comm_nccl *m = c->impl;
  CHECK(m && m->nccl, "comm %s: %s on a communicator that was freed or aborted", c->name, what);
  return m;
}

// The three collectives on a given stream: the communicator's own (blocking forms) or its side
// stream (the *_start forms). `how` is "" or " (started)", for the failure message.
static void comm_nccl_ar_on(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op, cudaStream_t s,
                            const char *how) {
  CHECK(n_elem >= 0, "comm %s: all_reduce of %lld elements", c->name, (long long)n_elem);
  comm_nccl *m = comm_nccl_live_impl(c, "all_reduce");
  comm_nccl_note(c, "all_reduce of %lld %s%s", (long long)n_elem, comm_nccl_dtype_name(t), how);
  COMM_NCCL_CALL(c, ncclAllReduce(buf, buf, (size_t)n_elem, comm_nccl_type(c, t), comm_nccl_op(c, op), m->nccl, s));
}

static void comm_nccl_ag_on(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, cudaStream_t s,
                            const char *how) {
  CHECK(n_elem >= 0, "comm %s: all_gather of %lld elements", c->name, (long long)n_elem);
  comm_nccl *m = comm_nccl_live_impl(c, "all_gather");
  comm_nccl_note(c, "all_gather of %lld %s per rank%s", (long long)n_elem, comm_nccl_dtype_name(t), how);
  COMM_NCCL_CALL(c, ncclAllGather(send, recv, (size_t)n_elem, comm_nccl_type(c, t), m->nccl, s));
}

static void comm_nccl_rs_on(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, comm_redop op,
                            cudaStream_t s, const char *how) {
  CHECK(n_elem >= 0, "comm %s: reduce_scatter of %lld elements", c->name, (long long)n_elem);
  comm_nccl *m = comm_nccl_live_impl(c, "reduce_scatter");
  comm_nccl_note(c, "reduce_scatter of %lld %s per rank%s", (long long)n_elem, comm_nccl_dtype_name(t), how);
  COMM_NCCL_CALL(c, ncclReduceScatter(send, recv, (size_t)n_elem, comm_nccl_type(c, t), comm_nccl_op(c, op), m->nccl, s));
}

static void comm_nccl_all_reduce(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  comm_nccl_ar_on(c, buf, n_elem, t, op, comm_nccl_live_impl(c, "all_reduce")->stream, "");
}

static void comm_nccl_all_gather(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_nccl_ag_on(c, send, recv, n_elem, t, comm_nccl_live_impl(c, "all_gather")->stream, "");
}

static void comm_nccl_reduce_scatter(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                     comm_redop op) {
  comm_nccl_rs_on(c, send, recv, n_elem, t, op, comm_nccl_live_impl(c, "reduce_scatter")->stream, "");
}

// ---- asynchronous collectives ------------------------------------------------------------------
// A start makes the side stream wait for what is queued on the communicator's stream so far
// (the gradients it reduces were written there), then enqueues the collective on the side
// stream, where it runs while later kernels of the main stream run. NCCL orders the operations
// of one communicator whatever stream they are on, so blocking and started calls may mix.

// Highest priority: a collective's or transfer's kernel should get SMs as soon as it is ready,
// not after the compute kernels queued before it.
static cudaStream_t comm_nccl_priority_stream(void) {
  int lo = 0, hi = 0;
  cudaStream_t s;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  return s;
}

static cudaStream_t comm_nccl_side_ready(comm *c, const char *what) {
  comm_nccl *m = comm_nccl_live_impl(c, what);
  CHECK(m->world->group_depth == 0, "comm %s: %s inside an open group", c->name, what);
  if (!m->side) {
    m->side = comm_nccl_priority_stream();
    CUDA_CHECK(cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaEventRecord(m->ready, m->stream));
  CUDA_CHECK(cudaStreamWaitEvent(m->side, m->ready, 0));
  m->n_started++;
  return m->side;
}

static void comm_nccl_all_reduce_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op) {
  comm_nccl_ar_on(c, buf, n_elem, t, op, comm_nccl_side_ready(c, "all_reduce_start"), " (started)");
}

// In-place all-gathers, one per region, in one group: one launch.
static void comm_nccl_all_gather_regions_start(comm *c, void *buf, const int64_t *at, const int64_t *n_elem,
                                               int n_regions, comm_dtype t) {
  cudaStream_t s = comm_nccl_side_ready(c, "all_gather_regions_start");
  const int64_t esz = comm_dtype_bytes(t);
  NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n_regions; i++) {
    CHECK(at[i] >= 0, "comm %s: all_gather_regions region %d at %lld", c->name, i, (long long)at[i]);
    char *region = (char *)buf + at[i] * esz;
    comm_nccl_ag_on(c, region + c->rank * n_elem[i] * esz, region, n_elem[i], t, s, " (started, in a group)");
  }
  COMM_NCCL_CALL(c, ncclGroupEnd());
}

static void comm_nccl_reduce_scatter_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t,
                                           comm_redop op) {
  comm_nccl_rs_on(c, send, recv, n_elem, t, op, comm_nccl_side_ready(c, "reduce_scatter_start"), " (started)");
}

// The main stream waits for everything started so far; the host does not.
static void comm_nccl_wait_started(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "wait");
  if (!m->n_started) return;
  CUDA_CHECK(cudaEventRecord(m->done, m->side));
  CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->done, 0));
  m->n_started = 0;
}

// The host waits for the side stream, with the same deadline and error watch as every wait.
static void comm_nccl_drain_started(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "drain");
  if (m->side) comm_nccl_drain_stream(c, m->side, __func__, __FILE__, __LINE__);
}

static void comm_nccl_broadcast(comm *c, void *buf, int64_t n_elem, comm_dtype t, int root) {
  CHECK(n_elem >= 0, "comm %s: broadcast of %lld elements", c->name, (long long)n_elem);
  CHECK(root >= 0 && root < c->size, "comm %s: broadcast root %d outside [0, %d)", c->name, root, c->size);
  comm_nccl *m = comm_nccl_live_impl(c, "broadcast");
  comm_nccl_note(c, "broadcast of %lld %s from rank %d", (long long)n_elem, comm_nccl_dtype_name(t), root);
  COMM_NCCL_CALL(c, ncclBroadcast(buf, buf, (size_t)n_elem, comm_nccl_type(c, t), root, m->nccl, m->stream));
}

// ---- groups and point-to-point ----------------------------------------------------------------

static void comm_nccl_group_start(comm *c) {
  comm_nccl_world *w = comm_nccl_live_impl(c, "group_start")->world;
  NCCL_CHECK(ncclGroupStart());
  if (w->group_depth++ == 0) w->group_ops = 0;
}

// Ends a group; the outermost end launches everything the group recorded and settles c.
// Groups may nest (NCCL allows it, and all_to_all opens its own inside a caller's group).
static void comm_nccl_group_finish(comm *c, const char *func, const char *file, int line) {
  comm_nccl_world *w = ((comm_nccl *)c->impl)->world;
  CHECK(w->group_depth > 0, "comm %s: group_end without group_start", c->name);
  w->group_depth--;
  comm_nccl_settle(c, ncclGroupEnd(), "ncclGroupEnd()", func, file, line);
}

static void comm_nccl_group_end(comm *c) {
  const comm_nccl_world *w = comm_nccl_live_impl(c, "group_end")->world;
  if (w->group_depth == 1) comm_nccl_note(c, "group of %d send/recv calls", w->group_ops);
  comm_nccl_group_finish(c, __func__, __FILE__, __LINE__);
}

static void comm_nccl_send(comm *c, const void *buf, int64_t n_elem, comm_dtype t, int peer) {
  CHECK(n_elem >= 0, "comm %s: send of %lld elements", c->name, (long long)n_elem);
  CHECK(peer >= 0 && peer < c->size, "comm %s: send peer %d outside [0, %d)", c->name, peer, c->size);
  comm_nccl *m = comm_nccl_live_impl(c, "send");
  comm_nccl_note(c, "send of %lld %s to rank %d", (long long)n_elem, comm_nccl_dtype_name(t), peer);
  m->world->group_ops++;
  // Outside a group NCCL makes this a group of one: enqueued (complete in stream order) on return.
  COMM_NCCL_CALL(c, ncclSend(buf, (size_t)n_elem, comm_nccl_type(c, t), peer, m->nccl, m->stream));
}

static void comm_nccl_recv(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer) {
  CHECK(n_elem >= 0, "comm %s: recv of %lld elements", c->name, (long long)n_elem);
  CHECK(peer >= 0 && peer < c->size, "comm %s: recv peer %d outside [0, %d)", c->name, peer, c->size);
  comm_nccl *m = comm_nccl_live_impl(c, "recv");
  comm_nccl_note(c, "recv of %lld %s from rank %d", (long long)n_elem, comm_nccl_dtype_name(t), peer);
  m->world->group_ops++;
  COMM_NCCL_CALL(c, ncclRecv(buf, (size_t)n_elem, comm_nccl_type(c, t), peer, m->nccl, m->stream));
}

// Grouped sends and receives: NCCL runs them as one launch, and every pair's transfer proceeds
// concurrently (no ordering between peers, so no deadlock however ranks post them).
// On stream s: the communicator's own, or its side stream (all_to_all_start).
static void comm_nccl_a2a_on(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, cudaStream_t s,
                             const char *how) {
  CHECK(n_elem >= 0, "comm %s: all_to_all of %lld elements", c->name, (long long)n_elem);
  comm_nccl *m = comm_nccl_live_impl(c, "all_to_all");
  const size_t block = (size_t)n_elem * (size_t)comm_dtype_bytes(t);
  const ncclDataType_t nt = comm_nccl_type(c, t);
  comm_nccl_group_start(c);
  for (int q = 0; q < c->size; q++) {
    COMM_NCCL_CALL(c, ncclSend((const char *)send + q * block, (size_t)n_elem, nt, q, m->nccl, s));
    COMM_NCCL_CALL(c, ncclRecv((char *)recv + q * block, (size_t)n_elem, nt, q, m->nccl, s));
  }
  comm_nccl_note(c, "all_to_all of %lld %s per rank pair%s", (long long)n_elem, comm_nccl_dtype_name(t), how);
  comm_nccl_group_finish(c, __func__, __FILE__, __LINE__);
}

static void comm_nccl_all_to_all(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_nccl_a2a_on(c, send, recv, n_elem, t, comm_nccl_live_impl(c, "all_to_all")->stream, "");
}

static void comm_nccl_all_to_all_start(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t) {
  comm_nccl_a2a_on(c, send, recv, n_elem, t, comm_nccl_side_ready(c, "all_to_all_start"), " (started)");
}

// One-element all-reduce, then a bounded wait: when it returns every rank has reached the
// barrier and this rank's stream has drained. Unlike MPI_Barrier, a dead peer ends in a
// message after the timeout instead of a hang.
static void comm_nccl_barrier(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "barrier");
  CHECK(m->world->group_depth == 0, "comm %s: barrier inside an open group would wait for itself", c->name);
  comm_nccl_note(c, "barrier");
  COMM_NCCL_CALL(c, ncclAllReduce(m->scratch, m->scratch, 1, ncclInt32, ncclSum, m->nccl, m->stream));
  comm_nccl_drain(c, __func__, __FILE__, __LINE__);
}

void comm_nccl_wait(comm *c) {
  if (!comm_nccl_is(c)) return;
  comm_nccl *m = comm_nccl_live_impl(c, "wait");
  if (m->side) comm_nccl_drain_stream(c, m->side, __func__, __FILE__, __LINE__);
  comm_nccl_drain(c, __func__, __FILE__, __LINE__);
}

// ---- transfers overlapping compute ------------------------------------------------------------

// Directed links between neighbours (src -> src + 1 forward, src -> src - 1 backward, mod size;
// with 2 ranks both are forward) are split into classes so that every rank uses each class's
// communicator in one role with one peer: by the sender's parity, the wrap-around link getting
// its own class when size is odd. Each communicator then carries one FIFO of transfers, which
// nothing else on either rank orders, so transfers run as soon as both sides have posted them.
static int comm_nccl_link_class(const comm *c, int src, int dst) {
  int n = c->size;
  if (dst == (src + 1) % n) return (n % 2 && src == n - 1) ? 2 : src % 2;
  CHECK(dst == (src + n - 1) % n, "comm %s: transfer between ranks %d and %d, which are not neighbours (rank +- 1 mod "
                                  "%d): only the pipeline's neighbour transfers overlap compute", c->name, src, dst, n);
  return 3 + ((n % 2 && src == 0) ? 2 : src % 2);
}

static void comm_nccl_xfer_open(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "xfer_open");
  CHECK(!m->link[0], "comm %s: xfer_open called twice", c->name);
  for (int k = 0; k < 6; k++) {
    int used = c->size == 2 ? k < 2 : c->size % 2 ? 1 : k != 2 && k != 5;  // the classes link_class returns
    if (!used) continue;
    comm_opts lo = m->opts;  // c's timeout and CTAs, on a stream of the link's own
    lo.stream = comm_nccl_priority_stream();
    char name[16];
    snprintf(name, sizeof name, "%.9s.link%d", c->name, k);
    m->link[k] = comm_nccl_create(m->world, c->mpi, name, &lo);
  }
  // Connect every link of this rank now, one element each way in one group spanning the link
  // communicators (both ends post the same group), so that no transfer of a step waits on the
  // host for a peer to reach its own first transfer on a link.
  int n = c->size, r = c->rank, peers[2] = {(r + 1) % n, (r + n - 1) % n};
  comm *used[8];
  int n_used = 0;
  NCCL_CHECK(ncclGroupStart());
  m->world->group_depth++;
  for (int i = 0; i < (n == 2 ? 1 : 2); i++) {
    comm *snd = m->link[comm_nccl_link_class(c, r, peers[i])], *rcv = m->link[comm_nccl_link_class(c, peers[i], r)];
    comm_nccl *sm = snd->impl, *rm = rcv->impl;
    comm_nccl_note(snd, "link set-up (send of 1 i32 to rank %d)", peers[i]);
    COMM_NCCL_CALL(snd, ncclSend(sm->scratch, 1, ncclInt32, peers[i], sm->nccl, sm->stream));
    comm_nccl_note(rcv, "link set-up (recv of 1 i32 from rank %d)", peers[i]);
    COMM_NCCL_CALL(rcv, ncclRecv(rm->scratch, 1, ncclInt32, peers[i], rm->nccl, rm->stream));
    used[n_used++] = snd, used[n_used++] = rcv;
  }
  m->world->group_depth--;
  COMM_NCCL_CALL(c, ncclGroupEnd());
  for (int i = 0; i < n_used; i++) {
    comm_nccl_settle(used[i], ncclSuccess, "link set-up", __func__, __FILE__, __LINE__);
    comm_nccl_drain(used[i], __func__, __FILE__, __LINE__);
  }
}

static int comm_nccl_ticket(comm *c) {
  comm_nccl *m = c->impl;
  if (m->n_tickets == m->cap_tickets) {
    int cap = m->cap_tickets ? 2 * m->cap_tickets : 64;
    cudaEvent_t *t = realloc(m->tickets, (size_t)cap * sizeof *t);
    char *f = realloc(m->in_flight, (size_t)cap);
    CHECK(t && f, "comm %s: out of memory growing the transfer tickets to %d", c->name, cap);
    for (int i = m->cap_tickets; i < cap; i++) CUDA_CHECK(cudaEventCreateWithFlags(&t[i], cudaEventDisableTiming));
    m->tickets = t;
    m->in_flight = f;
    m->cap_tickets = cap;
  }
  m->in_flight[m->n_tickets] = 0;
  return m->n_tickets++;
}

static int comm_nccl_xfer_start(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer, int is_send,
                                const int *after, int n_after) {
  CHECK(n_elem >= 0, "comm %s: transfer of %lld elements", c->name, (long long)n_elem);
  CHECK(peer >= 0 && peer < c->size, "comm %s: transfer peer %d outside [0, %d)", c->name, peer, c->size);
  comm_nccl *m = comm_nccl_live_impl(c, "xfer_start");
  CHECK(m->link[0], "comm %s: xfer_start before xfer_open", c->name);
  // In a group the transfer would only be recorded, and its ticket would complete before it ran.
  CHECK(m->world->group_depth == 0, "comm %s: xfer_start inside an open group", c->name);
  comm *l = m->link[is_send ? comm_nccl_link_class(c, c->rank, peer) : comm_nccl_link_class(c, peer, c->rank)];
  comm_nccl *lm = comm_nccl_live_impl(l, "xfer_start");
  for (int i = 0; i < n_after; i++) {
    if (after[i] < 0) continue;
    CHECK(after[i] < m->n_tickets, "comm %s: transfer after ticket %d of %d", c->name, after[i], m->n_tickets);
    CUDA_CHECK(cudaStreamWaitEvent(lm->stream, m->tickets[after[i]], 0));
  }
  const char *dt = comm_nccl_dtype_name(t);
  if (is_send) {
    comm_nccl_note(l, "send of %lld %s to rank %d", (long long)n_elem, dt, peer);
    COMM_NCCL_CALL(l, ncclSend(buf, (size_t)n_elem, comm_nccl_type(c, t), peer, lm->nccl, lm->stream));
  } else {
    comm_nccl_note(l, "recv of %lld %s from rank %d", (long long)n_elem, dt, peer);
    COMM_NCCL_CALL(l, ncclRecv(buf, (size_t)n_elem, comm_nccl_type(c, t), peer, lm->nccl, lm->stream));
  }
  snprintf(m->last_op, sizeof m->last_op, "%.72s (on %.15s)", lm->last_op, l->name);
  int k = comm_nccl_ticket(c);
  CUDA_CHECK(cudaEventRecord(m->tickets[k], lm->stream));
  m->in_flight[k] = 1;
  return k;
}

static int comm_nccl_xfer_mark(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "xfer_mark");
  int k = comm_nccl_ticket(c);
  CUDA_CHECK(cudaEventRecord(m->tickets[k], m->stream));
  return k;
}

static void comm_nccl_xfer_wait(comm *c, int ticket) {
  comm_nccl *m = comm_nccl_live_impl(c, "xfer_wait");
  if (ticket < 0) return;
  CHECK(ticket < m->n_tickets, "comm %s: wait for transfer ticket %d of %d", c->name, ticket, m->n_tickets);
  CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->tickets[ticket], 0));
  m->in_flight[ticket] = 0;
}

// Every transfer must have been waited for (comm.h). The host then waits, bounded by the
// timeout, for each link's stream: compute waits for links, so a dead or stuck peer would
// otherwise leave the next host sync waiting forever instead of ending the job with a message.
// Events may be recorded again once forgotten: a stream already told to wait for one waits for
// the recording it saw.
static void comm_nccl_xfer_reset(comm *c) {
  comm_nccl *m = comm_nccl_live_impl(c, "xfer_reset");
  for (int i = 0; i < m->n_tickets; i++)
    CHECK(!m->in_flight[i], "comm %s: xfer_reset with transfer ticket %d not waited for", c->name, i);
  for (int k = 0; k < 6; k++)
    if (m->link[k]) comm_nccl_drain(m->link[k], __func__, __FILE__, __LINE__);
  m->n_tickets = 0;
}

// ---- life cycle -------------------------------------------------------------------------------

static void comm_nccl_unlink(comm *c) {
  for (comm **p = &((comm_nccl *)c->impl)->world->live; *p; p = &((comm_nccl *)(*p)->impl)->next_live) {
    if (*p == c) {
      *p = ((comm_nccl *)c->impl)->next_live;
      return;
    }
  }
}

// comm_opts.zero_cta: memory from ncclMemAlloc (cuMem, which windows need), registered as a
// symmetric window (every rank the same size, in the same order), so that an all-gather inside it
// runs on the copy engines. Where NCCL has no symmetric memory (several nodes, no peer access) the
// registration does nothing and the gathers run NCCL's kernels as without it. Without zero_cta:
// none (the caller takes its backend's).
static void *comm_nccl_buffer_alloc(comm *c, size_t n_bytes) {
  comm_nccl *m = comm_nccl_live_impl(c, "buffer_alloc");
  if (!m->opts.zero_cta) return NULL;
  CHECK(m->n_windows < COMM_NCCL_MAX_WINDOWS, "comm %s: more than %d copy-engine buffers", c->name,
        COMM_NCCL_MAX_WINDOWS);
  void *buf = NULL;
  COMM_NCCL_CALL(c, ncclMemAlloc(&buf, n_bytes ? n_bytes : 1));
  CUDA_CHECK(cudaMemset(buf, 0, n_bytes));
  ncclWindow_t win = NULL;  // stays NULL where NCCL cannot register (no symmetric support): plain memory
  comm_nccl_note(c, "window registration of %zu bytes (ncclCommWindowRegister)", n_bytes);
  COMM_NCCL_CALL(c, ncclCommWindowRegister(m->nccl, buf, n_bytes ? n_bytes : 1, &win, NCCL_WIN_COLL_SYMMETRIC));
  m->windows[m->n_windows].buf = buf;
  m->windows[m->n_windows].win = win;
  m->n_windows++;
  return buf;
}

static void comm_nccl_buffer_free(comm *c, void *buf) {
  if (!buf) return;
  comm_nccl *m = comm_nccl_live_impl(c, "buffer_free");
  int k = 0;
  while (k < m->n_windows && m->windows[k].buf != buf) k++;
  CHECK(k < m->n_windows, "comm %s: buffer_free of a buffer it did not allocate", c->name);
  if (m->side) CUDA_CHECK(cudaStreamSynchronize(m->side));  // no gather in flight reads it
  COMM_NCCL_CALL(c, ncclCommWindowDeregister(m->nccl, m->windows[k].win));
  NCCL_CHECK(ncclMemFree(buf));
  m->windows[k] = m->windows[--m->n_windows];
}

static void comm_nccl_free(comm *c) {
  if (!c) return;
  comm_nccl *m = c->impl;
  if (m) {
    while (m->nccl && m->n_windows > 0) comm_nccl_buffer_free(c, m->windows[m->n_windows - 1].buf);
    if (m->nccl) {
      // Finalize first: it flushes this rank's outstanding operations and lets us wait for
      // them with the timeout, where a bare ncclCommDestroy could block without a bound.
      comm_nccl_note(c, "tear-down (ncclCommFinalize)");
      COMM_NCCL_CALL(c, ncclCommFinalize(m->nccl));
      NCCL_CHECK(ncclCommDestroy(m->nccl));
      m->nccl = NULL;
    }
    comm_nccl_unlink(c);
    for (int k = 0; k < 6; k++) {
      if (!m->link[k]) continue;
      cudaStream_t s = ((comm_nccl *)m->link[k]->impl)->stream;
      comm_free(&m->link[k]);
      CUDA_CHECK(cudaStreamDestroy(s));
    }
    for (int i = 0; i < m->cap_tickets; i++) CUDA_CHECK(cudaEventDestroy(m->tickets[i]));
    free(m->tickets);
    free(m->in_flight);
    if (m->scratch) CUDA_CHECK(cudaFree(m->scratch));
    if (m->side) {
      CUDA_CHECK(cudaStreamSynchronize(m->side));
      CUDA_CHECK(cudaEventDestroy(m->ready));
      CUDA_CHECK(cudaEventDestroy(m->done));
      CUDA_CHECK(cudaStreamDestroy(m->side));
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize the handle is already gone; freeing it would be an error.
  if (!finalized && c->mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&c->mpi));
  free(m);
  free(c);
}

static const comm_ops comm_nccl_ops = {
    .all_reduce = comm_nccl_all_reduce,
    .all_gather = comm_nccl_all_gather,
    .reduce_scatter = comm_nccl_reduce_scatter,
    .broadcast = comm_nccl_broadcast,
    .all_to_all = comm_nccl_all_to_all,
    .send = comm_nccl_send,
    .recv = comm_nccl_recv,
    .group_start = comm_nccl_group_start,
    .group_end = comm_nccl_group_end,
    .barrier = comm_nccl_barrier,
    .free = comm_nccl_free,
    .all_reduce_start = comm_nccl_all_reduce_start,
    .reduce_scatter_start = comm_nccl_reduce_scatter_start,
    .all_to_all_start = comm_nccl_all_to_all_start,
    .all_gather_regions_start = comm_nccl_all_gather_regions_start,
    .wait = comm_nccl_wait_started,
    .drain = comm_nccl_drain_started,
    .xfer_open = comm_nccl_xfer_open,
    .xfer_start = comm_nccl_xfer_start,
    .xfer_mark = comm_nccl_xfer_mark,
    .xfer_wait = comm_nccl_xfer_wait,
    .xfer_reset = comm_nccl_xfer_reset,
    .buffer_alloc = comm_nccl_buffer_alloc,
    .buffer_free = comm_nccl_buffer_free,
};

static comm *comm_nccl_create(comm_nccl_world *w, MPI_Comm mpi, const char *name, const comm_opts *opts) {
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service; it stays off unless
  // the user explicitly asked otherwise. Set before the first NCCL call, which reads it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  char who[48];
  snprintf(who, sizeof who, "comm_nccl_create(%s)", name ? name : "?");
  CHECK(w && opts, "%s: no factory state or options (make communicators through comm_nccl_factory)", who);
  comm_opts_check(opts, who);
  comm *c = XCALLOC(1, sizeof *c);
  comm_nccl *m = XCALLOC(1, sizeof *m);
  c->ops = &comm_nccl_ops;
  c->impl = m;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
  m->world = w;
  m->opts = *opts;
  m->stream = (cudaStream_t)opts->stream;
  // The caller may free mpi right after (grid_init does), so the bootstrap below and anyone
  // reading c->mpi later use a private duplicate.
  MPI_CHECK(MPI_Comm_dup(mpi, &c->mpi));
  MPI_CHECK(MPI_Comm_rank(c->mpi, &c->rank));
  MPI_CHECK(MPI_Comm_size(c->mpi, &c->size));

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // every call returns; hangs are caught by our polling with a deadline
  cfg.commName = c->name;
  if (opts->max_ctas > 0) cfg.maxCTAs = opts->max_ctas;
  if (opts->zero_cta) cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  // The usual cause of a failed set-up on one host is two ranks on one GPU: say what to do.
  comm_nccl_note(c, "set-up (ncclCommInitRankConfig over %d ranks; one GPU each, else parallel.gpu_comm=mpi)",
                 c->size);
  COMM_NCCL_CALL(c, ncclCommInitRankConfig(&m->nccl, c->size, id, c->rank, &cfg));
  CUDA_CHECK(cudaMalloc((void **)&m->scratch, sizeof *m->scratch));
  CUDA_CHECK(cudaMemsetAsync(m->scratch, 0, sizeof *m->scratch, m->stream));
  m->next_live = w->live;
  w->live = c;
  comm_nccl_note(c, "work on its stream (no operation of this group yet)");
  return c;
}

// ---- factory ----------------------------------------------------------------------------------

static comm *comm_nccl_factory_create(void *ctx, MPI_Comm mpi, const char *name, const comm_opts *opts) {
  return comm_nccl_create(ctx, mpi, name, opts);
}

// Every communicator of the factory must be gone: they point to w.
static void comm_nccl_world_free(void *ctx) {
  comm_nccl_world *w = ctx;
  CHECK(!w->live, "comm_factory_free: NCCL communicator '%s' of this factory is still alive; free the "
        "communicators (grid_free) first", w->live->name);
  CHECK(w->group_depth == 0, "comm_factory_free: an NCCL group is still open (missing group_end)");
  free(w);
}

comm_factory comm_nccl_factory(const comm_opts *opts) {
  comm_factory f = {.create = comm_nccl_factory_create, .free_ctx = comm_nccl_world_free,
                    .opts = opts ? *opts : comm_opts_default()};
  comm_opts_check(&f.opts, "comm_nccl_factory");
  f.ctx = XCALLOC(1, sizeof(comm_nccl_world));
  return f;
}
