// The communicator suite: one set of checks run over whichever communicator the command line
// names, through a small buffer layer (tests/unit/test_comm_buf.h: host memory for MPI; device memory,
// with copies, for NCCL and staged), so the three implementations answer the same questions:
//   mpirun -np 4 test_comm --comm mpi      MPI over host buffers (CI), once with whole calls and
//                                          once with comm_opts.mpi_chunk_elems = 2, so the paths
//                                          that cut counts above INT_MAX run on small buffers
//   mpirun -np 2 test_comm --comm nccl     NCCL, one GPU per rank (ctest label gpu)
//   mpirun -np 2 test_comm --comm staged   the staged MPI communicator (both ranks may share a GPU)
//   mpirun -np 2 test_comm --comm peer     NCCL under the peer copies of parallel.tp_overlap=p2p
//                                          (GPUs of one host with peer access)
//   mpirun -np 2 test_comm --comm nccl --timeout-check
//     rank 0 enters a barrier that rank 1 never joins; the job must end with the timeout
//     message (a ctest entry matches it)
// Every collective and point-to-point pattern carries rank-number payloads, so each expected
// value is known by hand, for every dtype; then started collectives, overlapping transfers,
// stream order, nested groups, large and empty transfers, and grid_init (with dp-overlap) for
// every layout of 2 or 4 ranks. Checks that hold for one kind only (what the host-staged
// implementations promise beyond comm.h; the NCCL kind and stream) run only there.
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"
#include "kernels/bf16.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/comm_payload.h"
#include "parallel/comm/grid.h"
#include "tests/unit/test_comm_buf.h"
#include "tests/unit/test_util.h"
#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/backend_cuda.h"
#include "parallel/comm/nccl/comm_nccl.h"
#include "parallel/comm/nccl/comm_peer.h"
#include "parallel/comm/nccl/comm_staged.h"
#include "parallel/comm/nccl/nccl_check.h"
#endif

// Values are small integers (|x| <= 256) plus, for 64-bit types, a 2^40 offset that a 32-bit
// path would lose; all exact in every dtype, so sums compare with ==.
static const double BIG = 1099511627776.0;  // 2^40

// Counts the elements of host buf[0..n) that differ from want(i); reports the first.
#define CHECK_ALL(what, buf, n, t, want_expr)                                                            \
  do {                                                                                                   \
    int64_t bad_ = 0;                                                                                    \
    for (int64_t i = 0; i < (n); i++) {                                                                  \
      double want_ = (want_expr), got_ = comm_payload_get((buf), i, (t));                                \
      if (got_ != want_ && bad_++ == 0)                                                                  \
        fprintf(stderr, "rank %d %s: %s %s: [%lld] = %.17g, want %.17g\n", c->rank, s->label, what,      \
                comm_dtype_name(t), (long long)i, got_, want_);                                          \
    }                                                                                                    \
    EXPECT(bad_ == 0, "%s: %s %s: %lld wrong elements of %lld", s->label, what, comm_dtype_name(t),      \
           (long long)bad_, (long long)(n));                                                             \
  } while (0)

// ---- checks on every communicator --------------------------------------------------------------

static void test_dtype(const suite *s, comm *c, comm_dtype t) {
  const int n = c->size, r = c->rank;
  const int64_t N = 5;                      // per-rank block: 2 + 2 + 1 when chunked
  const int64_t cap = (n > 2 ? n : 2) * N;  // crossed pairs need 2N
  const double off = (t == COMM_I64 || t == COMM_F64) ? BIG : 0.0;
  const size_t esz = (size_t)comm_dtype_bytes(t), bytes = (size_t)cap * esz;
  char *a = XCALLOC((size_t)cap, esz), *b = XCALLOC((size_t)cap, esz);
  char *da = buf_alloc(s, bytes), *db = buf_alloc(s, bytes);

  // all_reduce sum of rank + i: n(n-1)/2 + n*i; max: n - 1 + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  buf_put(s, da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_SUM);
  buf_down(s, c, a, da, bytes);
  CHECK_ALL("all_reduce sum", a, N, t, n * off + n * (n - 1) / 2 + n * i);
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  buf_put(s, da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_MAX);
  buf_down(s, c, a, da, bytes);
  CHECK_ALL("all_reduce max", a, N, t, off + n - 1 + i);
  // Negative values: max picks the least negative, sum stays exact.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, -(double)(r + 1) * (i + 1));
  buf_put(s, da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_MAX);
  buf_down(s, c, a, da, bytes);
  CHECK_ALL("all_reduce max of negatives", a, N, t, -(double)(i + 1));

  // all_gather: rank q's block holds 10q + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i);
  buf_put(s, da, a, bytes);
  c->ops->all_gather(c, da, db, N, t);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("all_gather", b, n * N, t, off + 10 * (i / N) + i % N);

  // reduce_scatter: rank r sends 10q + r + i in block q; block q reduced lands on rank q:
  // sum = n(10q + i) + n(n-1)/2, max = 10q + i + n - 1.
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 10 * q + r + i);
  buf_put(s, da, a, bytes);
  c->ops->reduce_scatter(c, da, db, N, t, COMM_SUM);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("reduce_scatter sum", b, N, t, n * off + n * (10.0 * r + i) + n * (n - 1) / 2);
  c->ops->reduce_scatter(c, da, db, N, t, COMM_MAX);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("reduce_scatter max", b, N, t, off + 10.0 * r + i + n - 1);

  // broadcast from every root: everyone ends with 100 + 10 root + i.
  for (int root = 0; root < n; root++) {
    char what[32];
    snprintf(what, sizeof what, "broadcast root %d", root);
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, r == root ? off + 100 + 10 * root + i : -1);
    buf_put(s, da, a, bytes);
    c->ops->broadcast(c, da, N, t, root);
    buf_down(s, c, a, da, bytes);
    CHECK_ALL(what, a, N, t, off + 100 + 10 * root + i);
  }

  // all_to_all: rank r's block q (for rank q) holds 16r + 4q + i, so rank r finds 16s + 4r + i
  // in block s (values stay below 256: bf16-exact).
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 16 * r + 4 * q + i);
  buf_put(s, da, a, bytes);
  c->ops->all_to_all(c, da, db, N, t);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("all_to_all", b, n * N, t, off + 16.0 * (i / N) + 4 * r + i % N);

  // Ring inside one group: everyone sends right and receives from the left, which would
  // deadlock as blocking calls once messages are large (rendezvous).
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  buf_put(s, da, a, bytes);
  buf_put(s, db, b, bytes);
  c->ops->group_start(c);
  c->ops->send(c, da, N, t, right);
  c->ops->recv(c, db, N, t, left);
  c->ops->group_end(c);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("ring send/recv in a group", b, N, t, off + 10 * left + i);

  // Crossed pairs (0,1), (2,3): both send first, then receive, two messages each way, with
  // the receive posted before the send on odd ranks: matching is per pair in posting order.
  const int mate = r ^ 1;
  for (int64_t i = 0; i < 2 * N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  buf_put(s, da, a, bytes);
  buf_put(s, db, b, bytes);
  c->ops->group_start(c);
  if (r % 2) c->ops->recv(c, db, N, t, mate);
  c->ops->send(c, da, N, t, mate);
  c->ops->send(c, da + N * esz, N, t, mate);
  if (r % 2 == 0) c->ops->recv(c, db, N, t, mate);
  c->ops->recv(c, db + N * esz, N, t, mate);
  c->ops->group_end(c);
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("crossed pairs in a group", b, 2 * N, t, off + 10 * mate + i);

  // Outside a group each call completes: even ranks send then receive, odd ranks the reverse.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  buf_put(s, da, a, bytes);
  buf_put(s, db, b, bytes);
  if (r % 2 == 0) {
    c->ops->send(c, da, N, t, mate);
    c->ops->recv(c, db, N, t, mate);
  } else {
    c->ops->recv(c, db, N, t, mate);
    c->ops->send(c, da, N, t, mate);
  }
  buf_down(s, c, b, db, bytes);
  CHECK_ALL("send/recv outside a group", b, N, t, off + 10 * mate + i);

  free(a);
  free(b);
  buf_free(s, da);
  buf_free(s, db);
}

// bf16 sums accumulate in float and round to nearest even: 256 + 3 = 259 lies halfway between
// the bf16 neighbours 258 and 260 and must become 260 (truncation would give 258), whatever
// order the reduction tree adds the zeros in; 256 + 1 ties to 256.
static void test_bf16_rounding(const suite *s, comm *c) {
  uint16_t v[2] = {k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 3.0f : 0.0f),
                   k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 1.0f : 0.0f)};
  uint16_t *d = buf_alloc(s, sizeof v);
  buf_put(s, d, v, sizeof v);
  c->ops->all_reduce(c, d, 2, COMM_BF16, COMM_SUM);
  buf_down(s, c, v, d, sizeof v);
  EXPECT(k_bf16_to_f32(v[0]) == 260.0f, "%s: bf16 256 + 3 = %g, want 260 (round to nearest even)", s->label,
         k_bf16_to_f32(v[0]));
  EXPECT(k_bf16_to_f32(v[1]) == 256.0f, "%s: bf16 256 + 1 = %g, want 256 (tie to even)", s->label, k_bf16_to_f32(v[1]));
  buf_free(s, d);
}

// "Complete" outside a group means complete in stream order: an upload queued right after a
// send may overwrite its buffer, and the peer still gets the old contents (on host buffers
// the send is done when it returns).
static void test_stream_order(const suite *s, comm *c) {
  const int r = c->rank, mate = r ^ 1;
  const int64_t N = 1 << 20;  // 4 MiB: beyond NCCL's eager buffers, so the send really reads late
  const size_t bytes = (size_t)N * sizeof(float);
  float *h = XMALLOC(bytes), *h2 = XMALLOC(bytes);
  float *d = buf_alloc(s, bytes), *d2 = buf_alloc(s, bytes);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + 1), h2[i] = -5.0f;
  buf_put(s, d, h, bytes);
  if (r % 2 == 0) {
    c->ops->send(c, d, N, COMM_F32, mate);
    buf_put_queued(s, d, h2, bytes);
    c->ops->send(c, d, N, COMM_F32, mate);
    suite_wait(c);
  } else {
    c->ops->recv(c, d, N, COMM_F32, mate);
    c->ops->recv(c, d2, N, COMM_F32, mate);
    buf_down(s, c, h, d, bytes);
    buf_down(s, c, h2, d2, bytes);
    int64_t bad1 = 0, bad2 = 0;
    for (int64_t i = 0; i < N; i++) bad1 += h[i] != (float)(mate + 1), bad2 += h2[i] != -5.0f;
    EXPECT(bad1 == 0, "%s: stream order: first send delivered %lld elements not from before the overwrite", s->label,
           (long long)bad1);
    EXPECT(bad2 == 0, "%s: stream order: second send delivered %lld elements not from after the overwrite", s->label,
           (long long)bad2);
  }
  free(h);
  free(h2);
  buf_free(s, d);
  buf_free(s, d2);
}

// all_to_all inside a caller's group, with a ring of sends beside it: NCCL nests all_to_all's
// own group and runs everything at the outer group_end; MPI (and staged) run the all_to_all at
// once and the ring at group_end. Either way, the results are the same.
static void test_nested_group(const suite *s, comm *c) {
  const int n = c->size, r = c->rank, N = 3;
  int32_t a[2 * 3 * 8], b[2 * 3 * 8], p[3], q[3];
  CHECK(n <= 8, "test_nested_group: at most 8 ranks");
  int32_t *da = buf_alloc(s, sizeof a), *db = buf_alloc(s, sizeof b), *dp = buf_alloc(s, sizeof p),
          *dq = buf_alloc(s, sizeof q);
  for (int k = 0; k < n * N; k++) a[k] = 100 * r + k, b[k] = -1;
  for (int k = 0; k < N; k++) p[k] = 7 * r + k, q[k] = -1;
  buf_put(s, da, a, sizeof a);
  buf_put(s, db, b, sizeof b);
  buf_put(s, dp, p, sizeof p);
  buf_put(s, dq, q, sizeof q);
  c->ops->group_start(c);
  c->ops->all_to_all(c, da, db, N, COMM_I32);
  c->ops->send(c, dp, N, COMM_I32, (r + 1) % n);
  c->ops->recv(c, dq, N, COMM_I32, (r + n - 1) % n);
  c->ops->group_end(c);
  buf_down(s, c, b, db, sizeof b);
  buf_down(s, c, q, dq, sizeof q);
  int bad = 0;
  for (int k = 0; k < n; k++)
    for (int i = 0; i < N; i++) bad += b[k * N + i] != 100 * k + r * N + i;
  for (int i = 0; i < N; i++) bad += q[i] != 7 * ((r + n - 1) % n) + i;
  EXPECT(bad == 0, "%s: all_to_all and a ring inside one outer group: %d wrong elements", s->label, bad);
  buf_free(s, da);
  buf_free(s, db);
  buf_free(s, dp);
  buf_free(s, dq);
}

// Large counts take NCCL's multi-channel, pipelined paths that 5 elements never reach (and, on
// host buffers, MPI's large-message protocols, or many chunks when chunked).
static void test_large(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = s->chunked ? 1001 : sized(s, 3000001, 300001);  // odd: no channel or chunk size divides it
  float *h = XMALLOC((size_t)(n * N) * sizeof *h);
  float *d = buf_alloc(s, (size_t)(n * N) * sizeof *d), *dg = buf_alloc(s, (size_t)(n * N) * sizeof *d);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + i % 7);
  buf_put(s, d, h, (size_t)N * sizeof *h);
  c->ops->all_reduce(c, d, N, COMM_F32, COMM_SUM);
  buf_down(s, c, h, d, (size_t)N * sizeof *h);
  int64_t bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * (i % 7));
  EXPECT(bad == 0, "%s: all_reduce of %lld f32: %lld wrong", s->label, (long long)N, (long long)bad);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(1000 * r + i % 1000);
  buf_put(s, d, h, (size_t)N * sizeof *h);
  c->ops->all_gather(c, d, dg, N, COMM_F32);
  buf_down(s, c, h, dg, (size_t)(n * N) * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < n * N; i++) bad += h[i] != (float)(1000 * (i / N) + (i % N) % 1000);
  EXPECT(bad == 0, "%s: all_gather of %lld f32 per rank: %lld wrong", s->label, (long long)N, (long long)bad);
  free(h);
  buf_free(s, d);
  buf_free(s, dg);
}

// Element i of test_started's all_gather_regions buffer: what rank `own` puts there before (-1
// outside its blocks), or every rank's data after (own = -1).
static float ag_want(int64_t i, int64_t N, int n, int own) {
  int64_t region = i < n * N / 2 ? 0 : i < n * N / 2 + n * N / 4 ? 1 : 2, len = region == 0 ? N / 2 : N / 4;
  if (region == 2) return -1.0f;
  int64_t j = region == 0 ? i : i - n * N / 2;
  int block = (int)(j / len);
  if (own >= 0 && block != own) return -1.0f;
  return (float)(100 * region + block + (j % len) % 5);
}

// Started collectives (NCCL: on the side stream) each take the data queued before them (an
// unsynchronised upload here), several may be in flight, and after wait a copy in stream order
// alone sees every result, without a host wait in between; a drain makes the host wait.
static void test_started(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = sized(s, 1 << 21, 1000);  // 8 MiB per buffer on GPUs: still running when the copy is queued
  float *h = XMALLOC((size_t)(n * N) * sizeof *h);
  float *da = buf_alloc(s, (size_t)N * sizeof *h), *db = buf_alloc(s, (size_t)(n * N) * sizeof *h);
  float *dc = buf_alloc(s, (size_t)N * sizeof *h), *dg = buf_alloc(s, (size_t)(n * N) * sizeof *h);
  // all_gather_regions input: two regions, of n blocks of N/2 then n blocks of N/4 (the last
  // quarter of dg is in neither); rank r fills its block of each, -1 everywhere else.
  const int64_t at[2] = {0, n * N / 2}, len[2] = {N / 2, N / 4};
  for (int64_t i = 0; i < n * N; i++) h[i] = ag_want(i, N, n, r);
  buf_put(s, dg, h, (size_t)(n * N) * sizeof *h);
  float *hb = XMALLOC((size_t)(n * N) * sizeof *h), *ha = XMALLOC((size_t)N * sizeof *h);
  for (int64_t i = 0; i < n * N; i++) hb[i] = (float)(r + (i / N) * 10);
  buf_put_queued(s, db, hb, (size_t)(n * N) * sizeof *h);
  for (int64_t i = 0; i < N; i++) ha[i] = (float)(r + i % 5);
  buf_put_queued(s, da, ha, (size_t)N * sizeof *h);
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->reduce_scatter_start(c, db, dc, N, COMM_F32, COMM_SUM);
  c->ops->all_gather_regions_start(c, dg, at, len, 2, COMM_F32);
  c->ops->wait(c);
  c->ops->wait(c);  // nothing new started: a no-op
  buf_get(s, h, da, (size_t)N * sizeof *h);
  int64_t bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * (i % 5));
  EXPECT(bad == 0, "%s: all_reduce_start + wait: %lld wrong of %lld", s->label, (long long)bad, (long long)N);
  buf_get(s, h, dc, (size_t)N * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * 10 * r);
  EXPECT(bad == 0, "%s: reduce_scatter_start + wait: %lld wrong of %lld", s->label, (long long)bad, (long long)N);
  buf_get(s, h, dg, (size_t)(n * N) * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < n * N; i++) bad += h[i] != ag_want(i, N, n, -1);
  EXPECT(bad == 0, "%s: all_gather_regions_start + wait: %lld wrong of %lld", s->label, (long long)bad,
         (long long)(n * N));
  // drain: the host waits (bounded) for the started work, so a copy in stream order sees the
  // result without a wait (every rank held the same da: the sum is n times it).
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->drain(c);
  buf_get(s, h, da, (size_t)N * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)n * (float)(n * (n - 1) / 2 + n * (i % 5));
  EXPECT(bad == 0, "%s: all_reduce_start + drain: %lld wrong of %lld", s->label, (long long)bad, (long long)N);
  c->ops->wait(c);
  c->ops->drain(c);  // nothing started: nothing to do
  free(h);
  free(ha);
  free(hb);
  buf_free(s, da);
  buf_free(s, db);
  buf_free(s, dc);
  buf_free(s, dg);
}

// Transfers that overlap compute (xfer_*). First around the ring: every rank posts its receives
// before its sends, forward (from rank - 1) and backward (from rank + 1), the sends after a mark
// of the compute so far, and waits for them in the opposite order (with 2 ranks both directions
// join the same pair, in posting order). Then with its pair partner, in two rounds (so tickets
// are reused after xfer_reset): the receive is posted first, which only works because each
// direction has its own channel; the send waits for the ticket of the compute that writes its
// buffer (32 chained copies, on GPUs still running when it is posted), and the buffer is
// overwritten once the send's ticket has been waited for, which the peer must not see.
static void test_xfer(const suite *s, comm *c) {
  const int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n, mate = r ^ 1;
  c->ops->xfer_open(c);

  float hf[5], hb[5], init[5];
  float *out_f = buf_alloc(s, sizeof hf), *out_b = buf_alloc(s, sizeof hf);
  float *in_f = buf_alloc(s, sizeof hf), *in_b = buf_alloc(s, sizeof hf);
  for (int i = 0; i < 5; i++) hf[i] = (float)(10 * r + i), hb[i] = (float)(-10 * r - i), init[i] = -1000.0f;
  buf_put(s, out_f, hf, sizeof hf);
  buf_put(s, out_b, hb, sizeof hb);
  buf_put(s, in_f, init, sizeof init);
  buf_put(s, in_b, init, sizeof init);
  int rf = c->ops->xfer_start(c, in_f, 5, COMM_F32, prev, 0, NULL, 0);
  int rb = c->ops->xfer_start(c, in_b, 5, COMM_F32, next, 0, NULL, 0);
  int mark = c->ops->xfer_mark(c);
  int sf = c->ops->xfer_start(c, out_f, 5, COMM_F32, next, 1, &mark, 1);
  int sb = c->ops->xfer_start(c, out_b, 5, COMM_F32, prev, 1, &mark, 1);
  c->ops->xfer_wait(c, sb);
  c->ops->xfer_wait(c, sf);
  c->ops->xfer_wait(c, rb);
  c->ops->xfer_wait(c, rf);
  buf_down(s, c, hf, in_f, sizeof hf);
  buf_down(s, c, hb, in_b, sizeof hb);
  CHECK_ALL("xfer ring forward", hf, 5, COMM_F32, 10 * prev + i);
  CHECK_ALL("xfer ring backward", hb, 5, COMM_F32, -10 * next - i);
  c->ops->xfer_reset(c);
  buf_free(s, out_f);
  buf_free(s, out_b);
  buf_free(s, in_f);
  buf_free(s, in_b);

  const int64_t N = sized(s, 1 << 24, 1 << 12);  // 64 MiB on GPUs
  const size_t bytes = (size_t)N * sizeof(float);
  float *h = XMALLOC(bytes);
  float *d = buf_alloc(s, bytes), *src = buf_alloc(s, bytes), *junk = buf_alloc(s, bytes), *dr = buf_alloc(s, bytes);
  for (int round = 0; round < 2; round++) {
    for (int64_t i = 0; i < N; i++) h[i] = -1.0f;
    buf_put(s, junk, h, bytes);
    buf_put(s, d, h, bytes);
    buf_put(s, dr, h, bytes);
    for (int64_t i = 0; i < N; i++) h[i] = (float)(1000 * r + 100 * round + i % 7);
    buf_put(s, src, h, bytes);
    for (int k = 0; k < 31; k++) buf_copy_queued(s, d, junk, bytes);
    buf_copy_queued(s, d, src, bytes);
    int written = c->ops->xfer_mark(c);
    int tr = c->ops->xfer_start(c, dr, N, COMM_F32, mate, 0, NULL, 0);
    int ts = c->ops->xfer_start(c, d, N, COMM_F32, mate, 1, &written, 1);
    c->ops->xfer_wait(c, ts);
    buf_copy_queued(s, d, junk, bytes);
    c->ops->xfer_wait(c, tr);
    buf_down(s, c, h, dr, bytes);
    CHECK_ALL("xfer with the pair partner (receive posted first, send after its writer)", h, N, COMM_F32,
              1000 * mate + 100 * round + i % 7);
    c->ops->xfer_reset(c);
  }
  free(h);
  buf_free(s, d);
  buf_free(s, src);
  buf_free(s, junk);
  buf_free(s, dr);
}

// Empty transfers are legal and must not hang.
static void test_empty(const suite *s, comm *c) {
  float *d = buf_alloc(s, 32);
  c->ops->all_reduce(c, d, 0, COMM_F32, COMM_SUM);
  c->ops->all_gather(c, d, d + 4, 0, COMM_F32);
  c->ops->group_start(c);
  c->ops->send(c, d, 0, COMM_F32, (c->rank + 1) % c->size);
  c->ops->recv(c, d + 4, 0, COMM_F32, (c->rank + c->size - 1) % c->size);
  c->ops->group_end(c);
  c->ops->barrier(c);
  suite_wait(c);
  EXPECT(1, "empty transfers returned");
  buf_free(s, d);
}

// int8 only moves (the compressed gradients' codes): all_to_all, started and blocking, and
// all_gather. Rank r's block q holds (r - q + i) mod 64 - 32, negative values included.
static int8_t i8_payload(int from, int to, int64_t i) { return (int8_t)((from * 7 - to * 3 + i) % 64 - 32); }

static void test_i8_moves(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = 37;
  int8_t *h = XMALLOC((size_t)(n * N)), *g = XMALLOC((size_t)(n * N));
  char *da = buf_alloc(s, (size_t)(n * N)), *db = buf_alloc(s, (size_t)(n * N));
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) h[q * N + i] = i8_payload(r, q, i);
  for (int started = 0; started < 2; started++) {
    buf_put(s, da, h, (size_t)(n * N));
    if (started) {
      c->ops->all_to_all_start(c, da, db, N, COMM_I8);
      c->ops->wait(c);
    } else {
      c->ops->all_to_all(c, da, db, N, COMM_I8);
    }
    buf_get(s, g, db, (size_t)(n * N));
    int64_t bad = 0;
    for (int q = 0; q < n; q++)
      for (int64_t i = 0; i < N; i++) bad += g[q * N + i] != i8_payload(q, r, i);
    EXPECT(bad == 0, "%s: i8 all_to_all%s: %lld wrong of %lld", s->label, started ? "_start" : "", (long long)bad,
           (long long)(n * N));
  }
  c->ops->all_gather(c, da, db, N, COMM_I8);  // everyone's block 0
  buf_get(s, g, db, (size_t)(n * N));
  int64_t bad = 0;
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) bad += g[q * N + i] != i8_payload(q, 0, i);
  EXPECT(bad == 0, "%s: i8 all_gather: %lld wrong of %lld", s->label, (long long)bad, (long long)(n * N));
  free(h);
  free(g);
  buf_free(s, da);
  buf_free(s, db);
}

// A started reduce-scatter in place (recv = this rank's block of send, as NCCL defines it; the
// backward's tp reductions): the same sums as out of place.
static void test_reduce_in_place(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = sized(s, 1 << 20, 1000);
  float *h = XMALLOC((size_t)(n * N) * sizeof *h), *y = buf_alloc(s, (size_t)(n * N) * sizeof *h);
  for (int64_t i = 0; i < n * N; i++) h[i] = (float)(r * 3 + (i / N) * 10 + i % 5);
  buf_put(s, y, h, (size_t)(n * N) * sizeof *h);
  c->ops->reduce_scatter_start(c, y, y + r * N, N, COMM_F32, COMM_SUM);
  c->ops->wait(c);
  buf_get(s, h, y + r * N, (size_t)N * sizeof *h);
  int64_t bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(3 * n * (n - 1) / 2 + n * (r * 10 + (r * N + i) % 5));
  EXPECT(bad == 0, "%s: reduce_scatter_start in place: %lld wrong of %lld", s->label, (long long)bad, (long long)N);
  free(h);
  buf_free(s, y);
}

static void test_comm_all(const suite *s, comm *c) {
  static const comm_dtype types[] = {COMM_F32, COMM_BF16, COMM_F64, COMM_I32, COMM_I64, COMM_F16};
  for (size_t k = 0; k < sizeof types / sizeof *types; k++) test_dtype(s, c, types[k]);
  test_i8_moves(s, c);
  test_bf16_rounding(s, c);
  test_stream_order(s, c);
  test_nested_group(s, c);
  test_large(s, c);
  test_started(s, c);
  test_reduce_in_place(s, c);
  test_xfer(s, c);
  test_empty(s, c);
}

// ---- what the host-staged communicators promise beyond comm.h (MPI, staged) -----------------
// A started collective reads its operands at the start (data written after it is not sent) and
// its result appears at the wait, never before; zero-element starts are legal. Staged only: a
// received transfer appears at its ticket's wait even once the peer's send is done (MPI may
// write a receive buffer any time after posting); zero-element transfers are legal.
static void test_strict(const suite *s, comm *c) {
  const int n = c->size, r = c->rank, mate = r ^ 1;
  const int64_t N = 1000;
  float h[2000], *da = buf_alloc(s, sizeof h), *dc = buf_alloc(s, sizeof h);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + 1);
  buf_put(s, da, h, (size_t)N * sizeof *h);
  for (int64_t i = 0; i < 2 * N; i++) h[i] = -7.0f;
  buf_put(s, dc, h, 2 * (size_t)N * sizeof *h);
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->reduce_scatter_start(c, dc, dc + N, N / n, COMM_F32, COMM_SUM);
  buf_get(s, h, da, (size_t)N * sizeof *h);
  int early = 0;
  for (int64_t i = 0; i < N; i++) early += h[i] != (float)(r + 1);
  EXPECT(early == 0, "%s: all_reduce_start's result appeared before its wait (%d elements)", s->label, early);
  for (int64_t i = 0; i < N; i++) h[i] = 1000.0f;  // written after the start: must not be summed
  buf_put(s, da, h, (size_t)N * sizeof *h);
  buf_get(s, h, dc + N, (size_t)(N / n) * sizeof *h);
  early = 0;
  for (int64_t i = 0; i < N / n; i++) early += h[i] != -7.0f;
  EXPECT(early == 0, "%s: reduce_scatter_start's result appeared before its wait (%d elements)", s->label, early);
  c->ops->all_reduce_start(c, da, 0, COMM_F32, COMM_SUM);  // empty starts are legal
  c->ops->wait(c);
  buf_down(s, c, h, da, (size_t)N * sizeof *h);
  int bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n + 1) / 2);
  EXPECT(bad == 0, "%s: all_reduce_start summed data written after its start (%d elements)", s->label, bad);
  buf_down(s, c, h, dc + N, (size_t)(N / n) * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < N / n; i++) bad += h[i] != (float)(-7 * n);
  EXPECT(bad == 0, "%s: reduce_scatter_start after its wait (%d elements wrong)", s->label, bad);
  c->ops->drain(c);  // nothing started: nothing to do

  if (s->kind == KIND_STAGED) {
    // The peer's send is done (its ticket waited, then a barrier), yet the receive shows
    // nothing until its own ticket is waited for.
    for (int64_t i = 0; i < N; i++) h[i] = (float)(10 * r + 1);
    buf_put(s, da, h, (size_t)N * sizeof *h);
    for (int64_t i = 0; i < N; i++) h[i] = -1.0f;
    buf_put(s, dc, h, (size_t)N * sizeof *h);
    c->ops->xfer_open(c);
    int tr = c->ops->xfer_start(c, dc, N, COMM_F32, mate, 0, NULL, 0);
    int te = c->ops->xfer_start(c, dc + N, 0, COMM_F32, mate, 0, NULL, 0);  // empty transfers are legal
    int mark = c->ops->xfer_mark(c);
    int ts = c->ops->xfer_start(c, da, N, COMM_F32, mate, 1, &mark, 1);
    int tz = c->ops->xfer_start(c, da, 0, COMM_F32, mate, 1, NULL, 0);
    c->ops->xfer_wait(c, ts);
    c->ops->xfer_wait(c, tz);
    c->ops->barrier(c);
    buf_down(s, c, h, dc, (size_t)N * sizeof *h);
    early = 0;
    for (int64_t i = 0; i < N; i++) early += h[i] != -1.0f;
    EXPECT(early == 0, "%s: a received transfer appeared before its ticket's wait (%d elements)", s->label, early);
    c->ops->xfer_wait(c, tr);
    c->ops->xfer_wait(c, te);
    buf_down(s, c, h, dc, (size_t)N * sizeof *h);
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(10 * mate + 1);
    EXPECT(bad == 0, "%s: the received transfer is wrong after its wait (%d elements)", s->label, bad);
    c->ops->xfer_reset(c);
  }
  buf_free(s, da);
  buf_free(s, dc);
}

// ---- process grid -------------------------------------------------------------------------------

// Group sums of world ranks per layout, worked out by hand from
// world = tp_rank + tp * (dp_rank + dp * pp_rank): {tp_c, dp_c, pp_c} sums for each world rank.
typedef struct layout {
  int world, tp, dp, pp;
  int sum[4][3];
} layout;

static const layout layouts[] = {
    // 2 ranks: a group of both sums to 1; a singleton to the rank itself.
    {2, 2, 1, 1, {{1, 0, 0}, {1, 1, 1}}},
    {2, 1, 2, 1, {{0, 1, 0}, {1, 1, 1}}},
    {2, 1, 1, 2, {{0, 0, 1}, {1, 1, 1}}},
    // 4 ranks: tp groups {0,1},{2,3}; dp groups {0,2},{1,3}; pp singletons
    {4, 2, 2, 1, {{1, 2, 0}, {1, 4, 1}, {5, 2, 2}, {5, 4, 3}}},
    // tp groups {0,1},{2,3}; dp singletons; pp groups {0,2},{1,3}
    {4, 2, 1, 2, {{1, 0, 2}, {1, 1, 4}, {5, 2, 2}, {5, 3, 4}}},
    // tp singletons; dp groups {0,1},{2,3}; pp groups {0,2},{1,3}
    {4, 1, 2, 2, {{0, 1, 2}, {1, 1, 4}, {2, 5, 2}, {3, 5, 4}}},
    // one pipeline of 4
    {4, 1, 1, 4, {{0, 0, 6}, {1, 1, 6}, {2, 2, 6}, {3, 3, 6}}},
    // one TP group of 4
    {4, 4, 1, 1, {{6, 0, 0}, {6, 1, 1}, {6, 2, 2}, {6, 3, 3}}},
};

// Sum over c of the world rank w, through a buffer.
static int64_t group_sum(const suite *s, comm *c, int64_t w) {
  int64_t v = w, *d = buf_alloc(s, sizeof v);
  buf_put(s, d, &v, sizeof v);
  c->ops->all_reduce(c, d, 1, COMM_I64, COMM_SUM);
  buf_down(s, c, &v, d, sizeof v);
  buf_free(s, d);
  return v;
}

// grid_init with the suite's factory for every layout of this world size, plus the dp-overlap
// communicator (with its own max_ctas; the factory's options stay as they were).
static void test_grid(const suite *s) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
    const layout *L = &layouts[k];
    if (L->world != world) continue;
    grid g;
    grid_init(&g, L->tp, L->dp, L->pp, &s->f);
    grid_add_dp_overlap(&g, &s->f, 4);
    const int w = g.world_rank;
    EXPECT(g.world_size == world && g.tp == L->tp && g.dp == L->dp && g.pp == L->pp, "%s grid %d/%d/%d: sizes",
           s->label, L->tp, L->dp, L->pp);
    EXPECT(g.tp_rank == w % L->tp && g.dp_rank == (w / L->tp) % L->dp && g.pp_rank == w / (L->tp * L->dp),
           "%s grid %d/%d/%d rank %d: coordinates (%d, %d, %d)", s->label, L->tp, L->dp, L->pp, w, g.tp_rank,
           g.dp_rank, g.pp_rank);
    EXPECT(grid_rank_of(&g, g.tp_rank, g.dp_rank, g.pp_rank) == w, "grid_rank_of does not invert the coordinates");
    EXPECT(g.tp_c->size == L->tp && g.dp_c->size == L->dp && g.pp_c->size == L->pp && g.world->size == world &&
               g.dp_overlap->size == L->dp,
           "%s grid %d/%d/%d: group sizes %d %d %d", s->label, L->tp, L->dp, L->pp, g.tp_c->size, g.dp_c->size,
           g.pp_c->size);
    EXPECT(g.tp_c->rank == g.tp_rank && g.dp_c->rank == g.dp_rank && g.pp_c->rank == g.pp_rank &&
               g.world->rank == w && g.dp_overlap->rank == g.dp_rank,
           "%s grid %d/%d/%d rank %d: group ranks", s->label, L->tp, L->dp, L->pp, w);
    EXPECT(!strcmp(g.tp_c->name, "tp") && !strcmp(g.dp_c->name, "dp") && !strcmp(g.pp_c->name, "pp") &&
               !strcmp(g.world->name, "world") && !strcmp(g.dp_overlap->name, "dp-overlap"),
           "group names");
    if (s->is)
      EXPECT(s->is(g.tp_c) && s->is(g.dp_c) && s->is(g.pp_c) && s->is(g.dp_overlap) && !s->is(g.world),
             "%s grid %d/%d/%d: tp/dp/pp/dp-overlap must be the device communicator, world MPI", s->label, L->tp,
             L->dp, L->pp);
    else
      EXPECT(g.tp_c->ops == g.world->ops && g.dp_overlap->ops == g.world->ops,
             "%s grid %d/%d/%d: every group is an MPI communicator, like world", s->label, L->tp, L->dp, L->pp);
    EXPECT(g.opts.max_ctas == s->f.opts.max_ctas && g.opts.mpi_chunk_elems == s->f.opts.mpi_chunk_elems &&
               g.opts.timeout_s == s->f.opts.timeout_s && g.opts.stream == s->f.opts.stream,
           "%s grid: the grid keeps the factory's options (the dp-overlap's max_ctas is its own)", s->label);
    comm *cs[4] = {g.tp_c, g.dp_c, g.pp_c, g.dp_overlap};
    for (int a = 0; a < 4; a++) {
      int64_t v = group_sum(s, cs[a], w), want = L->sum[w][a < 3 ? a : 1];
      EXPECT(v == want, "%s grid %d/%d/%d rank %d: %s group sum of world ranks %lld, want %lld", s->label, L->tp,
             L->dp, L->pp, w, cs[a]->name, (long long)v, (long long)want);
    }
    // Pipeline neighbours by group rank: pass the world rank to pp rank + 1.
    if (g.pp > 1) {
      int32_t io[2] = {w, -1}, *dio = buf_alloc(s, sizeof io);
      buf_put(s, dio, io, sizeof io);
      g.pp_c->ops->group_start(g.pp_c);
      g.pp_c->ops->send(g.pp_c, dio, 1, COMM_I32, (g.pp_rank + 1) % g.pp);
      g.pp_c->ops->recv(g.pp_c, dio + 1, 1, COMM_I32, (g.pp_rank + g.pp - 1) % g.pp);
      g.pp_c->ops->group_end(g.pp_c);
      buf_down(s, g.pp_c, io, dio, sizeof io);
      EXPECT(io[1] == grid_rank_of(&g, g.tp_rank, g.dp_rank, (g.pp_rank + g.pp - 1) % g.pp),
             "%s grid %d/%d/%d rank %d: pp ring got %d", s->label, L->tp, L->dp, L->pp, w, io[1]);
      buf_free(s, dio);
    }
    grid_free(&g);
    grid_free(&g);  // safe twice
    EXPECT(!g.world && !g.tp_c && !g.dp_c && !g.pp_c && !g.dp_overlap, "grid_free leaves communicators behind");
  }
}

// ---- runs ---------------------------------------------------------------------------------------

// A communicator of the suite over the world, which must be a duplicate of MPI_COMM_WORLD.
static comm *suite_comm(const suite *s, const char *name) {
  comm *c = comm_factory_create(&s->f, MPI_COMM_WORLD, name);
  int cmp = MPI_IDENT;
  MPI_Comm_compare(c->mpi, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "%s: the factory's create must duplicate the communicator (compare = %d)", s->label,
         cmp);
  CHECK(c->size == 2 || c->size == 4, "test_comm: run under mpirun -np 2 or 4 (size %d)", c->size);
  if (s->is) EXPECT(s->is(c), "%s: the factory makes this kind", s->label);
  return c;
}

// Every check of the suite over s's communicators: the collectives, the host-staged promises
// where they hold, the grid.
static void run_suite(const suite *s) {
  comm *c = suite_comm(s, "world");
  test_comm_all(s, c);
  comm_free(&c);
  comm_free(&c);  // safe twice
  comm_free(NULL);
  EXPECT(c == NULL, "comm_free leaves the pointer set");
  if (s->kind == KIND_MPI || s->kind == KIND_STAGED) {
    c = suite_comm(s, "strict");
    test_strict(s, c);
    comm_free(&c);
  }
  test_grid(s);
}

static void run_mpi(void) {
  comm_opts o = comm_opts_default();
  EXPECT(o.timeout_s == COMM_TIMEOUT_S_DEFAULT && o.max_ctas == 0 && o.mpi_chunk_elems == 0 && !o.stream,
         "comm_opts_default: timeout %g, max_ctas %d, mpi_chunk_elems %lld", o.timeout_s, o.max_ctas,
         (long long)o.mpi_chunk_elems);
  EXPECT(comm_dtype_bytes(COMM_F32) == 4 && comm_dtype_bytes(COMM_BF16) == 2 && comm_dtype_bytes(COMM_F64) == 8 &&
             comm_dtype_bytes(COMM_I32) == 4 && comm_dtype_bytes(COMM_I64) == 8, "comm_dtype_bytes");
  suite s = {.kind = KIND_MPI, .label = "mpi", .f = comm_mpi_factory(&o)};
  run_suite(&s);
  comm *c = suite_comm(&s, "buffers");
  EXPECT(c->ops->buffer_alloc(c, 64) == NULL, "mpi: no copy-engine memory (buffer_alloc gives NULL)");
  c->ops->buffer_free(c, NULL);
  comm_free(&c);
  comm_factory_free(&s.f);
  comm_factory_free(&s.f);  // safe twice

  // Same checks with every call cut into pieces of 2 elements (5 = 2 + 2 + 1).
  o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 2, NULL);
  s = (suite){.kind = KIND_MPI, .label = "mpi chunk 2", .chunked = 1, .f = comm_mpi_factory(&o)};
  run_suite(&s);
  comm_factory_free(&s.f);
}

#ifdef TRAINER_HAVE_CUDA
// NCCL: one GPU per rank (comm_nccl_set_device), the kind and stream of its communicators, the
// NVLS default, comm_nccl_wait on a host communicator.
// comm_opts.zero_cta: buffer_alloc gives memory (registered as a symmetric window), and an
// in-place all-gather inside it, as parallel.gather_copy_engine runs them (the copy engines on one
// node), gathers every rank's block; twice, as a slot is reused. Then freed before the communicator.
static void test_copy_engine_gather(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = 1 << 20;
  float *buf = c->ops->buffer_alloc(c, (size_t)(n * N) * sizeof(float));
  EXPECT(buf != NULL, "%s: buffer_alloc of a zero-CTA communicator gives memory", s->label);
  if (!buf) return;
  float *h = XMALLOC((size_t)(n * N) * sizeof *h);
  for (int round = 0; round < 2; round++) {
    for (int64_t i = 0; i < n * N; i++) h[i] = i / N == r ? (float)(10 * round + r + (i % N) % 7) : -1.0f;
    buf_put(s, buf, h, (size_t)(n * N) * sizeof *h);
    const int64_t at = 0, len = N;
    c->ops->all_gather_regions_start(c, buf, &at, &len, 1, COMM_F32);
    c->ops->wait(c);
    buf_get(s, h, buf, (size_t)(n * N) * sizeof *h);
    int64_t bad = 0;
    for (int64_t i = 0; i < n * N; i++) bad += h[i] != (float)(10 * round + i / N + (i % N) % 7);
    EXPECT(bad == 0, "%s: in-place all-gather in buffer_alloc memory, round %d: %lld wrong of %lld", s->label, round,
           (long long)bad, (long long)(n * N));
  }
  free(h);
  c->ops->buffer_free(c, buf);
}

static void run_nccl(void) {
  int dev = comm_nccl_set_device(), local = comm_nccl_local_rank(), n_dev = comm_nccl_device_count();
  EXPECT(dev == local % n_dev, "device %d for local rank %d", dev, local);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == 0) {
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    printf("test_comm --comm nccl: device %d of %d, NCCL_NVLS_ENABLE=%s before the first communicator\n", dev, n_dev,
           nvls ? nvls : "(unset)");
  }
  cudaStream_t S;
  CUDA_CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  comm_opts o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, S);
  suite s = {.kind = KIND_NCCL, .label = "nccl", .device = 1, .f = comm_nccl_factory(&o), .stream = S,
             .is = comm_nccl_is};
  comm *c = suite_comm(&s, "kind");
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  EXPECT(nvls && *nvls, "NCCL_NVLS_ENABLE must be set once a communicator exists");
  EXPECT(comm_nccl_is(c) && !comm_staged_is(c) && comm_nccl_stream(c) == (void *)S, "communicator kind and stream");
  comm_free(&c);
  // comm_nccl_wait is a no-op on an MPI communicator, so callers need not ask which they hold.
  comm *m = comm_mpi_create(MPI_COMM_WORLD, "host", NULL);
  comm_nccl_wait(m);
  EXPECT(!comm_nccl_is(m) && comm_nccl_stream(m) == NULL, "an MPI communicator is not NCCL");
  comm_free(&m);

  run_suite(&s);
  comm *plain = suite_comm(&s, "plain");
  EXPECT(plain->ops->buffer_alloc(plain, 64) == NULL, "buffer_alloc without zero_cta gives no memory");
  comm_free(&plain);
  comm_opts z = o;
  z.zero_cta = 1;
  comm *zc = s.f.create(s.f.ctx, MPI_COMM_WORLD, "zero-cta", &z);
  test_copy_engine_gather(&s, zc);
  comm_free(&zc);
  comm_factory_free(&s.f);
  CUDA_CHECK(cudaStreamDestroy(S));
}

// Staged: both ranks may share one GPU, so the device is chosen without comm_nccl_set_device's
// one-GPU-per-rank check.
static void run_staged(void) {
  int n_dev = comm_nccl_device_count(), local = comm_nccl_local_rank();
  CHECK(n_dev > 0, "--comm staged: no CUDA device is visible");
  CUDA_CHECK(cudaSetDevice(local % n_dev));
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank == 0) printf("test_comm --comm staged: device %d of %d\n", local % n_dev, n_dev);
  cudaStream_t S;
  CUDA_CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  comm_opts o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, S);
  suite s = {.kind = KIND_STAGED, .label = "staged", .device = 1, .f = comm_staged_factory(&o), .stream = S,
             .is = comm_staged_is};
  comm *c = suite_comm(&s, "kind");
  EXPECT(comm_staged_is(c) && !comm_nccl_is(c) && comm_nccl_stream(c) == NULL, "communicator kind");
  comm_free(&c);
  run_suite(&s);
  comm_factory_free(&s.f);
  CUDA_CHECK(cudaStreamDestroy(S));
}

// Peer copies: NCCL communicators wrapped by comm_peer_create, on a CUDA backend's stream (its
// adds finish the reduce-scatters), through the whole suite; then gathers and reduce-scatters of
// growing sizes (the staging grows between them) and back-to-back operations, each checked, the
// last round's reduce-scatter completed by a drain instead of a wait.
typedef struct peer_factory {
  comm_factory nccl;
  k_backend *be;
} peer_factory;

static comm *peer_factory_create(void *ctx, MPI_Comm mpi, const char *name, const comm_opts *opts) {
  peer_factory *pf = ctx;
  return comm_peer_create(pf->nccl.create(pf->nccl.ctx, mpi, name, opts), pf->be);
}

static void peer_factory_free(void *ctx) {
  peer_factory *pf = ctx;
  comm_factory_free(&pf->nccl);
  free(pf);
}

static void test_peer_sizes(const suite *s, comm *c) {
  const int n = c->size, r = c->rank;
  for (int64_t N = 1000; N <= (1 << 22); N *= 8) {
    float *h = XMALLOC((size_t)(n * N) * sizeof *h), *g = buf_alloc(s, (size_t)(n * N) * sizeof *h);
    float *y = buf_alloc(s, (size_t)(n * N) * sizeof *h), *ys = buf_alloc(s, (size_t)N * sizeof *h);
    float *aside = buf_alloc(s, (size_t)(n * N) * sizeof *h);
    for (int round = 0; round < 3; round++) {
      for (int64_t i = 0; i < n * N; i++) h[i] = i / N == r ? (float)(round + r + i % 7) : -1.0f;
      buf_put_queued(s, g, h, (size_t)(n * N) * sizeof *h);
      for (int64_t i = 0; i < n * N; i++) h[i] = (float)(r * 3 + round + (i / N) * 10 + i % 5);
      buf_put_queued(s, y, h, (size_t)(n * N) * sizeof *h);
      const int64_t at = 0;
      c->ops->all_gather_regions_start(c, g, &at, &N, 1, COMM_F32);
      if (round == 1) {  // wait_from in ring order: each rank's block copied aside once it is there
        for (int k = 1; k < n; k++) {
          const int from = (r - k + n) % n;
          c->ops->wait_from(c, from);
          buf_copy_queued(s, aside + from * N, g + from * N, (size_t)N * sizeof *h);
        }
      }
      c->ops->wait(c);
      if (round == 1) {
        float *ha = XMALLOC((size_t)(n * N) * sizeof *ha);
        buf_get(s, ha, aside, (size_t)(n * N) * sizeof *ha);
        int64_t bad_aside = 0;
        for (int64_t i = 0; i < n * N; i++) bad_aside += i / N != r && ha[i] != (float)(round + i / N + i % 7);
        EXPECT(bad_aside == 0, "%s: gather of %lld per rank, each rank's block read after its wait_from: %lld wrong",
               s->label, (long long)N, (long long)bad_aside);
        free(ha);
      }
      c->ops->reduce_scatter_start(c, y, ys, N, COMM_F32, COMM_SUM);
      if (round == 2) c->ops->drain(c);  // a drain completes a started operation as its wait does
      else c->ops->wait(c);
      buf_get(s, h, g, (size_t)(n * N) * sizeof *h);
      int64_t bad = 0;
      for (int64_t i = 0; i < n * N; i++) bad += h[i] != (float)(round + i / N + i % 7);
      EXPECT(bad == 0, "%s: gather of %lld per rank, round %d: %lld wrong", s->label, (long long)N, round, (long long)bad);
      buf_get(s, h, ys, (size_t)N * sizeof *h);
      bad = 0;
      for (int64_t i = 0; i < N; i++)
        bad += h[i] != (float)(3 * n * (n - 1) / 2 + n * (round + r * 10 + (r * N + i) % 5));
      EXPECT(bad == 0, "%s: reduce-scatter of %lld per rank, round %d: %lld wrong", s->label, (long long)N, round,
             (long long)bad);
      // reduce_scatter_add_block: each other rank's block written just before its call (a block
      // sent early would carry the NaN there before), added onto what ys holds at the wait
      // (written after the last block here); this rank's own block (NaN) is not read. The last
      // round sends bf16 blocks (the values are small integers, exact in bf16).
      const int bf16 = round == 2;
      const size_t esz = bf16 ? 2 : sizeof(float);
      for (int64_t i = 0; i < n * N; i++) h[i] = i / N == r ? NAN : (float)(r * 3 + round + (i / N) * 10 + i % 5);
      char *blocks = XMALLOC((size_t)(n * N) * esz), *nan_block = XMALLOC((size_t)(n * N) * esz);
      for (int64_t i = 0; i < n * N; i++) {
        const float nan = NAN;
        if (bf16) {
          ((uint16_t *)blocks)[i] = k_f32_to_bf16(h[i]);
          ((uint16_t *)nan_block)[i] = k_f32_to_bf16(nan);
        } else {
          ((float *)blocks)[i] = h[i];
          ((float *)nan_block)[i] = nan;
        }
      }
      buf_put_queued(s, y, nan_block, (size_t)(n * N) * esz);
      for (int k = 1; k < n; k++) {
        const int to = (r + k) % n;
        buf_put_queued(s, (char *)y + to * N * esz, blocks + to * N * esz, (size_t)N * esz);
        c->ops->reduce_scatter_add_block(c, y, ys, N, bf16 ? COMM_BF16 : COMM_F32, to);
      }
      float *h_ys = XMALLOC((size_t)N * sizeof *h_ys);
      for (int64_t i = 0; i < N; i++) h_ys[i] = (float)(i % 3);
      buf_put_queued(s, ys, h_ys, (size_t)N * sizeof *h);
      c->ops->wait(c);
      buf_get(s, h, ys, (size_t)N * sizeof *h);
      bad = 0;
      for (int64_t i = 0; i < N; i++)
        bad += h[i] != (float)(i % 3 + 3 * n * (n - 1) / 2 - 3 * r + (n - 1) * (round + r * 10 + (r * N + i) % 5));
      EXPECT(bad == 0, "%s: reduce-scatter added into recv, %lld per rank, round %d (%s blocks): %lld wrong", s->label,
             (long long)N, round, bf16 ? "bf16" : "fp32", (long long)bad);
      free(blocks);
      free(nan_block);
      free(h_ys);
    }
    free(h);
    buf_free(s, g);
    buf_free(s, y);
    buf_free(s, ys);
    buf_free(s, aside);
  }
}

static void run_peer(void) {
  int dev = comm_nccl_set_device();
  char why[256] = "";
  const int ok = comm_peer_possible(MPI_COMM_WORLD, why, sizeof why);
  EXPECT(ok, "peer: every pair of GPUs reaches the other's memory: %s", why);
  if (!ok) return;
  k_backend_opts bo = {.device = dev};
  peer_factory *pf = XCALLOC(1, sizeof *pf);
  pf->be = k_backend_cuda_create(&bo);
  cudaStream_t S = (cudaStream_t)k_cuda_stream_of(pf->be);
  comm_opts o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, S);
  pf->nccl = comm_nccl_factory(&o);
  k_backend *be = pf->be;
  suite s = {.kind = KIND_PEER, .label = "peer", .device = 1, .stream = S, .is = comm_peer_is,
             .f = {.create = peer_factory_create, .free_ctx = peer_factory_free, .ctx = pf, .opts = o}};
  run_suite(&s);
  comm *c = suite_comm(&s, "sizes");
  test_peer_sizes(&s, c);
  comm_free(&c);
  comm_factory_free(&s.f);
  k_backend_free(&be);
}

// Rank 0 waits in a barrier that rank 1 never enters (rank 1 sits in an MPI barrier instead):
// the job must end with the timeout message (2 s, from the factory's options), not hang.
// Returns only if that failed.
static void run_timeout_check(void) {
  comm_nccl_set_device();
  cudaStream_t S;
  CUDA_CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  comm_opts o = comm_opts_make(2.0, 0, 0, S);
  comm_factory f = comm_nccl_factory(&o);
  comm *c = comm_factory_create(&f, MPI_COMM_WORLD, "stuck");
  if (c->rank == 0) {
    fprintf(stderr, "rank 0: barrier that rank 1 never joins; expecting the timeout message\n");
    c->ops->barrier(c);
    fprintf(stderr, "FAIL: the barrier returned although rank 1 never joined\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT(0, "the barrier returned instead of ending the job with the timeout message");
}
#endif

static void usage_fail(const char *msg, const char *arg) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == 0)
    fprintf(stderr, "test_comm: %s%s\nusage: test_comm [--comm mpi|nccl|staged|peer] [--timeout-check (nccl)]\n", msg,
            arg);
  MPI_Finalize();
  exit(2);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  comm_kind kind = KIND_MPI;
  int timeout_check = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--timeout-check")) {
      timeout_check = 1;
    } else if (!strcmp(argv[i], "--comm") && i + 1 < argc) {
      const char *v = argv[++i];
      if (!strcmp(v, "mpi")) kind = KIND_MPI;
      else if (!strcmp(v, "nccl")) kind = KIND_NCCL;
      else if (!strcmp(v, "staged")) kind = KIND_STAGED;
      else if (!strcmp(v, "peer")) kind = KIND_PEER;
      else usage_fail("--comm takes mpi, nccl, staged or peer, not ", v);
    } else {
      usage_fail("unknown argument ", argv[i]);
    }
  }
  if (timeout_check && kind != KIND_NCCL) usage_fail("--timeout-check is for --comm nccl", "");
#ifdef TRAINER_HAVE_CUDA
  if (timeout_check) run_timeout_check();
  else if (kind == KIND_NCCL) run_nccl();
  else if (kind == KIND_STAGED) run_staged();
  else if (kind == KIND_PEER) run_peer();
  else run_mpi();
#else
  if (kind != KIND_MPI) usage_fail("this build has no CUDA (no toolkit at configure time): ", "--comm mpi only");
  run_mpi();
#endif
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}
