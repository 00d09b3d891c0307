// NCCL communicator under mpirun -np 2, one GPU per rank (ctest label gpu): the checks of
// tests/test_comm.c on device buffers, with rank-number payloads so every expected value is
// known by hand, for every dtype; stream ordering of sends outside a group; nested groups;
// large and empty transfers; grid_init with NCCL groups. With --staged, the same checks of the
// staged MPI communicator (both ranks may share one GPU). With --timeout-check, rank 0 enters a
// barrier that rank 1 never joins, and the job must end with the timeout message (a second
// ctest entry matches it).
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/comm_payload.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/nccl/comm_nccl.h"
#include "parallel/comm/nccl/comm_staged.h"
#include "parallel/comm/nccl/nccl_check.h"
#include "tests/test_util.h"

// The test's own stream, as the trainer would pass k_cuda_stream(): non-blocking, so nothing
// is ordered with it by accident through the legacy default stream.
static cudaStream_t S;
// The factory of the run's communicators (NCCL or staged), with S as their stream.
static comm_factory F;

// Values are small integers (|x| <= 256) plus, for 64-bit types, a 2^40 offset that a 32-bit
// path would lose; all exact in every dtype, so sums compare with ==.
static const double BIG = 1099511627776.0;  // 2^40

// Host to device, finished before returning (the host buffer is reused right after).
static void up(void *dev, const void *host, size_t n_bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dev, host, n_bytes, cudaMemcpyHostToDevice, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
}

// Device to host after c's work: comm_nccl_wait is the bounded wait the trainer uses.
static void down(comm *c, void *host, const void *dev, size_t n_bytes) {
  comm_nccl_wait(c);
  CUDA_CHECK(cudaMemcpyAsync(host, dev, n_bytes, cudaMemcpyDeviceToHost, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
}

static void *dev_alloc(size_t n_bytes) {
  void *p = NULL;
  CUDA_CHECK(cudaMalloc(&p, n_bytes ? n_bytes : 1));
  return p;
}

// Counts the elements of buf[0..n) that differ from want(i); reports the first.
#define CHECK_ALL(what, buf, n, t, want_expr)                                                          \
  do {                                                                                                 \
    int bad_ = 0;                                                                                      \
    for (int64_t i = 0; i < (n); i++) {                                                                \
      double want_ = (want_expr), got_ = comm_payload_get((buf), i, (t));                                           \
      if (got_ != want_ && bad_++ == 0)                                                                \
        fprintf(stderr, "rank %d %s %s: [%lld] = %.17g, want %.17g\n", c->rank, what, comm_dtype_name(t),   \
                (long long)i, got_, want_);                                                            \
    }                                                                                                  \
    EXPECT(bad_ == 0, "%s %s: %d wrong elements", what, comm_dtype_name(t), bad_);                          \
  } while (0)

static void test_dtype(comm *c, comm_dtype t) {
  const int n = c->size, r = c->rank;
  const int64_t N = 5;                       // per-rank block
  const int64_t cap = (n > 2 ? n : 2) * N;   // crossed pairs need 2N
  const double off = (t == COMM_I64 || t == COMM_F64) ? BIG : 0.0;
  const size_t esz = (size_t)comm_dtype_bytes(t), bytes = (size_t)cap * esz;
  char *a = calloc((size_t)cap, esz), *b = calloc((size_t)cap, esz);
  char *da = dev_alloc(bytes), *db = dev_alloc(bytes);

  // all_reduce sum of rank + i: n(n-1)/2 + n*i; max: n - 1 + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  up(da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_SUM);
  down(c, a, da, bytes);
  CHECK_ALL("all_reduce sum", a, N, t, n * off + n * (n - 1) / 2 + n * i);
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  up(da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_MAX);
  down(c, a, da, bytes);
  CHECK_ALL("all_reduce max", a, N, t, off + n - 1 + i);
  // Negative values: max picks the least negative.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, -(double)(r + 1) * (i + 1));
  up(da, a, bytes);
  c->ops->all_reduce(c, da, N, t, COMM_MAX);
  down(c, a, da, bytes);
  CHECK_ALL("all_reduce max of negatives", a, N, t, -(double)(i + 1));

  // all_gather: rank q's block holds 10q + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i);
  up(da, a, bytes);
  c->ops->all_gather(c, da, db, N, t);
  down(c, b, db, bytes);
  CHECK_ALL("all_gather", b, n * N, t, off + 10 * (i / N) + i % N);

  // reduce_scatter: rank r sends 10q + r + i in block q; block q reduced lands on rank q.
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 10 * q + r + i);
  up(da, a, bytes);
  c->ops->reduce_scatter(c, da, db, N, t, COMM_SUM);
  down(c, b, db, bytes);
  CHECK_ALL("reduce_scatter sum", b, N, t, n * off + n * (10.0 * r + i) + n * (n - 1) / 2);
  c->ops->reduce_scatter(c, da, db, N, t, COMM_MAX);
  down(c, b, db, bytes);
  CHECK_ALL("reduce_scatter max", b, N, t, off + 10.0 * r + i + n - 1);

  // broadcast from every root: everyone ends with 100 + 10 root + i.
  for (int root = 0; root < n; root++) {
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, r == root ? off + 100 + 10 * root + i : -1);
    up(da, a, bytes);
    c->ops->broadcast(c, da, N, t, root);
    down(c, a, da, bytes);
    CHECK_ALL(root ? "broadcast root 1" : "broadcast root 0", a, N, t, off + 100 + 10 * root + i);
  }

  // all_to_all: rank r's block q holds 16r + 4q + i, so rank r finds 16s + 4r + i in block s.
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 16 * r + 4 * q + i);
  up(da, a, bytes);
  c->ops->all_to_all(c, da, db, N, t);
  down(c, b, db, bytes);
  CHECK_ALL("all_to_all", b, n * N, t, off + 16.0 * (i / N) + 4 * r + i % N);

  // Ring in one group: send right, receive from the left.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  up(da, a, bytes);
  up(db, b, bytes);
  c->ops->group_start(c);
  c->ops->send(c, da, N, t, right);
  c->ops->recv(c, db, N, t, left);
  c->ops->group_end(c);
  down(c, b, db, bytes);
  CHECK_ALL("ring send/recv in a group", b, N, t, off + 10 * left + i);

  // Crossed pairs: both send first, two messages each way, the receive posted before the send
  // on odd ranks: matching is per pair in posting order.
  const int mate = r ^ 1;
  for (int64_t i = 0; i < 2 * N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  up(da, a, bytes);
  up(db, b, bytes);
  c->ops->group_start(c);
  if (r % 2) c->ops->recv(c, db, N, t, mate);
  c->ops->send(c, da, N, t, mate);
  c->ops->send(c, da + N * esz, N, t, mate);
  if (r % 2 == 0) c->ops->recv(c, db, N, t, mate);
  c->ops->recv(c, db + N * esz, N, t, mate);
  c->ops->group_end(c);
  down(c, b, db, bytes);
  CHECK_ALL("crossed pairs in a group", b, 2 * N, t, off + 10 * mate + i);

  // Outside a group: even ranks send then receive, odd ranks the reverse.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  up(da, a, bytes);
  up(db, b, bytes);
  if (r % 2 == 0) {
    c->ops->send(c, da, N, t, mate);
    c->ops->recv(c, db, N, t, mate);
  } else {
    c->ops->recv(c, db, N, t, mate);
    c->ops->send(c, da, N, t, mate);
  }
  down(c, b, db, bytes);
  CHECK_ALL("send/recv outside a group", b, N, t, off + 10 * mate + i);

  free(a);
  free(b);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
}

// "Complete" outside a group means complete in stream order: a copy enqueued on the stream
// right after a send may overwrite its buffer, and the peer still gets the old contents.
static void test_stream_order(comm *c) {
  const int r = c->rank, mate = r ^ 1;
  const int64_t N = 1 << 20;  // 4 MiB: beyond NCCL's eager buffers, so the send really reads late
  float *h = malloc((size_t)N * sizeof *h), *h2 = malloc((size_t)N * sizeof *h2);
  float *d = dev_alloc((size_t)N * sizeof *d), *d2 = dev_alloc((size_t)N * sizeof *d2);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + 1), h2[i] = -5.0f;
  up(d, h, (size_t)N * sizeof *h);
  if (r % 2 == 0) {
    c->ops->send(c, d, N, COMM_F32, mate);
    CUDA_CHECK(cudaMemcpyAsync(d, h2, (size_t)N * sizeof *h2, cudaMemcpyHostToDevice, S));
    c->ops->send(c, d, N, COMM_F32, mate);
    comm_nccl_wait(c);
  } else {
    c->ops->recv(c, d, N, COMM_F32, mate);
    c->ops->recv(c, d2, N, COMM_F32, mate);
    down(c, h, d, (size_t)N * sizeof *h);
    down(c, h2, d2, (size_t)N * sizeof *h2);
    int bad1 = 0, bad2 = 0;
    for (int64_t i = 0; i < N; i++) bad1 += h[i] != (float)(mate + 1), bad2 += h2[i] != -5.0f;
    EXPECT(bad1 == 0, "stream order: first send delivered %d elements not from before the overwrite", bad1);
    EXPECT(bad2 == 0, "stream order: second send delivered %d elements not from after the overwrite", bad2);
  }
  free(h);
  free(h2);
  CUDA_CHECK(cudaFree(d));
  CUDA_CHECK(cudaFree(d2));
}

// all_to_all opens its own group; inside a caller's group it nests, and everything runs at the
// outer group_end.
static void test_nested_group(comm *c) {
  const int n = c->size, r = c->rank, N = 3;
  int32_t a[2 * 3 * 8], b[2 * 3 * 8], p[3], q[3];
  CHECK(n <= 8, "test_nested_group: at most 8 ranks");
  int32_t *da = dev_alloc(sizeof a), *db = dev_alloc(sizeof b), *dp = dev_alloc(sizeof p), *dq = dev_alloc(sizeof q);
  for (int k = 0; k < n * N; k++) a[k] = 100 * r + k, b[k] = -1;
  for (int k = 0; k < N; k++) p[k] = 7 * r + k, q[k] = -1;
  up(da, a, sizeof a);
  up(db, b, sizeof b);
  up(dp, p, sizeof p);
  up(dq, q, sizeof q);
  c->ops->group_start(c);
  c->ops->all_to_all(c, da, db, N, COMM_I32);
  c->ops->send(c, dp, N, COMM_I32, (r + 1) % n);
  c->ops->recv(c, dq, N, COMM_I32, (r + n - 1) % n);
  c->ops->group_end(c);
  down(c, b, db, sizeof b);
  down(c, q, dq, sizeof q);
  int bad = 0;
  for (int s = 0; s < n; s++)
    for (int k = 0; k < N; k++) bad += b[s * N + k] != 100 * s + r * N + k;
  for (int k = 0; k < N; k++) bad += q[k] != 7 * ((r + n - 1) % n) + k;
  EXPECT(bad == 0, "all_to_all and a ring inside one outer group: %d wrong elements", bad);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dp));
  CUDA_CHECK(cudaFree(dq));
}

// Large counts take NCCL's multi-channel, pipelined paths that 5 elements never reach.
static void test_large(comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = 3000001;  // odd: no channel or chunk size divides it
  float *h = malloc((size_t)(n * N) * sizeof *h);
  float *d = dev_alloc((size_t)(n * N) * sizeof *d), *dg = dev_alloc((size_t)(n * N) * sizeof *d);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + i % 7);
  up(d, h, (size_t)N * sizeof *h);
  c->ops->all_reduce(c, d, N, COMM_F32, COMM_SUM);
  down(c, h, d, (size_t)N * sizeof *h);
  int64_t bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * (i % 7));
  EXPECT(bad == 0, "all_reduce of %lld f32: %lld wrong", (long long)N, (long long)bad);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(1000 * r + i % 1000);
  up(d, h, (size_t)N * sizeof *h);
  c->ops->all_gather(c, d, dg, N, COMM_F32);
  down(c, h, dg, (size_t)(n * N) * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < n * N; i++) bad += h[i] != (float)(1000 * (i / N) + (i % N) % 1000);
  EXPECT(bad == 0, "all_gather of %lld f32 per rank: %lld wrong", (long long)N, (long long)bad);
  free(h);
  CUDA_CHECK(cudaFree(d));
  CUDA_CHECK(cudaFree(dg));
}

// bf16 sums round to nearest even: 256 + 3 = 259 lies halfway between 258 and 260 and must
// become 260; 256 + 1 ties to 256.
static void test_bf16_rounding(comm *c) {
  uint16_t v[2] = {k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 3.0f : 0.0f),
                   k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 1.0f : 0.0f)};
  uint16_t *d = dev_alloc(sizeof v);
  up(d, v, sizeof v);
  c->ops->all_reduce(c, d, 2, COMM_BF16, COMM_SUM);
  down(c, v, d, sizeof v);
  EXPECT(k_bf16_to_f32(v[0]) == 260.0f, "bf16 256 + 3 = %g, want 260 (round to nearest even)", k_bf16_to_f32(v[0]));
  EXPECT(k_bf16_to_f32(v[1]) == 256.0f, "bf16 256 + 1 = %g, want 256 (tie to even)", k_bf16_to_f32(v[1]));
  CUDA_CHECK(cudaFree(d));
}

// Started collectives run on the side stream: each takes the data queued on the main stream
// before it (an unsynchronised upload here), several may be in flight, and after wait a copy
// on the main stream alone sees every result, without a host wait in between.
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

static void test_started(comm *c) {
  const int n = c->size, r = c->rank;
  const int64_t N = 1 << 21;  // 8 MiB per buffer: long enough to still run when the copy is queued
  float *h = malloc((size_t)(n * N) * sizeof *h);
  float *da = dev_alloc((size_t)N * sizeof *h), *db = dev_alloc((size_t)(n * N) * sizeof *h);
  float *dc = dev_alloc((size_t)N * sizeof *h), *dg = dev_alloc((size_t)(n * N) * sizeof *h);
  // all_gather_regions input: two regions, of n blocks of N/2 then n blocks of N/4 (the last
  // quarter of dg is in neither); rank r fills its block of each, -1 everywhere else.
  const int64_t at[2] = {0, n * N / 2}, len[2] = {N / 2, N / 4};
  for (int64_t i = 0; i < n * N; i++) h[i] = ag_want(i, N, n, r);
  CUDA_CHECK(cudaMemcpy(dg, h, (size_t)(n * N) * sizeof *h, cudaMemcpyHostToDevice));
  for (int64_t i = 0; i < n * N; i++) h[i] = (float)(r + (i / N) * 10);
  CUDA_CHECK(cudaMemcpyAsync(db, h, (size_t)(n * N) * sizeof *h, cudaMemcpyHostToDevice, S));
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + i % 5);
  CUDA_CHECK(cudaMemcpyAsync(da, h, (size_t)N * sizeof *h, cudaMemcpyHostToDevice, S));
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->reduce_scatter_start(c, db, dc, N, COMM_F32, COMM_SUM);
  c->ops->all_gather_regions_start(c, dg, at, len, 2, COMM_F32);
  c->ops->wait(c);
  c->ops->wait(c);  // nothing new started: a no-op
  CUDA_CHECK(cudaMemcpyAsync(h, da, (size_t)N * sizeof *h, cudaMemcpyDeviceToHost, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
  int64_t bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * (i % 5));
  EXPECT(bad == 0, "all_reduce_start + wait: %lld wrong of %lld", (long long)bad, (long long)N);
  CUDA_CHECK(cudaMemcpyAsync(h, dc, (size_t)N * sizeof *h, cudaMemcpyDeviceToHost, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
  bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n - 1) / 2 + n * 10 * r);
  EXPECT(bad == 0, "reduce_scatter_start + wait: %lld wrong of %lld", (long long)bad, (long long)N);
  CUDA_CHECK(cudaMemcpyAsync(h, dg, (size_t)(n * N) * sizeof *h, cudaMemcpyDeviceToHost, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
  bad = 0;
  for (int64_t i = 0; i < n * N; i++) bad += h[i] != ag_want(i, N, n, -1);
  EXPECT(bad == 0, "all_gather_regions_start + wait: %lld wrong of %lld", (long long)bad, (long long)(n * N));
  // drain: the host waits (bounded) for the side stream, so a copy on the main stream sees the
  // result without a wait (every rank held the same da: the sum is n times it).
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->drain(c);
  CUDA_CHECK(cudaMemcpyAsync(h, da, (size_t)N * sizeof *h, cudaMemcpyDeviceToHost, S));
  CUDA_CHECK(cudaStreamSynchronize(S));
  bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)n * (float)(n * (n - 1) / 2 + n * (i % 5));
  EXPECT(bad == 0, "all_reduce_start + drain: %lld wrong of %lld", (long long)bad, (long long)N);
  c->ops->wait(c);
  free(h);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dc));
  CUDA_CHECK(cudaFree(dg));
}

// Transfers that overlap compute (xfer_*): both ranks post their receive first, which only
// works because each direction has its own channel; a send waits for the ticket of the compute
// that writes its buffer (32 chained copies, still running when it is posted), and the buffer is
// overwritten once the send's ticket has been waited for, which the peer must not see. Two
// rounds, so tickets are reused after xfer_reset.
static void test_xfer(comm *c) {
  const int r = c->rank, mate = r ^ 1;
  const int64_t N = 1 << 24;  // 64 MiB
  const size_t bytes = (size_t)N * sizeof(float);
  float *h = malloc(bytes);
  float *d = dev_alloc(bytes), *src = dev_alloc(bytes), *junk = dev_alloc(bytes), *dr = dev_alloc(bytes);
  c->ops->xfer_open(c);
  for (int round = 0; round < 2; round++) {
    for (int64_t i = 0; i < N; i++) h[i] = -1.0f;
    up(junk, h, bytes);
    up(d, h, bytes);
    up(dr, h, bytes);
    for (int64_t i = 0; i < N; i++) h[i] = (float)(1000 * r + 100 * round + i % 7);
    up(src, h, bytes);
    for (int k = 0; k < 31; k++) CUDA_CHECK(cudaMemcpyAsync(d, junk, bytes, cudaMemcpyDeviceToDevice, S));
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyDeviceToDevice, S));
    int written = c->ops->xfer_mark(c);
    int tr = c->ops->xfer_start(c, dr, N, COMM_F32, mate, 0, NULL, 0);
    int ts = c->ops->xfer_start(c, d, N, COMM_F32, mate, 1, &written, 1);
    c->ops->xfer_wait(c, ts);
    CUDA_CHECK(cudaMemcpyAsync(d, junk, bytes, cudaMemcpyDeviceToDevice, S));
    c->ops->xfer_wait(c, tr);
    down(c, h, dr, bytes);
    CHECK_ALL("xfer (receive posted first, send after its writer)", h, N, COMM_F32, 1000 * mate + 100 * round + i % 7);
    c->ops->xfer_reset(c);
  }
  free(h);
  CUDA_CHECK(cudaFree(d));
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(junk));
  CUDA_CHECK(cudaFree(dr));
}

static void test_comm_all(comm *c) {
  EXPECT(c->size == 2, "run under mpirun -np 2 (size %d)", c->size);
  static const comm_dtype types[] = {COMM_F32, COMM_BF16, COMM_F64, COMM_I32, COMM_I64};
  for (size_t k = 0; k < sizeof types / sizeof *types; k++) test_dtype(c, types[k]);
  test_bf16_rounding(c);
  test_stream_order(c);
  test_nested_group(c);
  test_large(c);
  test_started(c);
  test_xfer(c);
  // Empty transfers are legal and must not hang.
  float *d = dev_alloc(16);
  c->ops->all_reduce(c, d, 0, COMM_F32, COMM_SUM);
  c->ops->all_gather(c, d, d, 0, COMM_F32);
  c->ops->group_start(c);
  c->ops->send(c, d, 0, COMM_F32, (c->rank + 1) % c->size);
  c->ops->recv(c, d, 0, COMM_F32, (c->rank + c->size - 1) % c->size);
  c->ops->group_end(c);
  c->ops->barrier(c);
  comm_nccl_wait(c);
  CUDA_CHECK(cudaFree(d));
}

// The 2-rank layouts; group sums of world ranks are 1 for a group of both ranks and the rank
// itself for a singleton.
static void test_grid(int (*is)(const comm *)) {
  static const int layouts[][3] = {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
  for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
    const int *L = layouts[k];
    grid g;
    grid_init(&g, L[0], L[1], L[2], &F);
    const int w = g.world_rank;
    EXPECT(is(g.tp_c) && is(g.dp_c) && is(g.pp_c) && !is(g.world),
           "grid %d/%d/%d: tp/dp/pp must be the device communicator, world MPI", L[0], L[1], L[2]);
    comm *cs[3] = {g.tp_c, g.dp_c, g.pp_c};
    int64_t *d = dev_alloc(sizeof(int64_t));
    for (int a = 0; a < 3; a++) {
      int64_t v = w;
      up(d, &v, sizeof v);
      cs[a]->ops->all_reduce(cs[a], d, 1, COMM_I64, COMM_SUM);
      down(cs[a], &v, d, sizeof v);
      int64_t want = L[a] == 2 ? 1 : w;
      EXPECT(v == want, "grid %d/%d/%d rank %d: %s group sum %lld, want %lld", L[0], L[1], L[2], w, cs[a]->name,
             (long long)v, (long long)want);
    }
    if (g.pp > 1) {
      int32_t out = w, in = -1, *dio = dev_alloc(2 * sizeof(int32_t));
      up(dio, &out, sizeof out);
      up(dio + 1, &in, sizeof in);
      g.pp_c->ops->group_start(g.pp_c);
      g.pp_c->ops->send(g.pp_c, dio, 1, COMM_I32, (g.pp_rank + 1) % g.pp);
      g.pp_c->ops->recv(g.pp_c, dio + 1, 1, COMM_I32, (g.pp_rank + g.pp - 1) % g.pp);
      g.pp_c->ops->group_end(g.pp_c);
      down(g.pp_c, &in, dio + 1, sizeof in);
      EXPECT(in == 1 - w, "grid 1/1/2 rank %d: pp ring got %d", w, in);
      CUDA_CHECK(cudaFree(dio));
    }
    CUDA_CHECK(cudaFree(d));
    grid_free(&g);
    grid_free(&g);  // safe twice
    EXPECT(!g.world && !g.tp_c && !g.dp_c && !g.pp_c, "grid_free leaves communicators behind");
  }
}

// Rank 0 waits in a barrier that rank 1 never enters (rank 1 sits in an MPI barrier instead):
// the job must end with the timeout message, not hang. Returns only if that failed.
static int run_timeout_check(void) {
  comm_opts o = comm_opts_make(2.0, 0, 0, S);
  F = comm_nccl_factory(&o);
  comm *c = comm_factory_create(&F, MPI_COMM_WORLD, "stuck");
  if (c->rank == 0) {
    fprintf(stderr, "rank 0: barrier that rank 1 never joins; expecting the timeout message\n");
    c->ops->barrier(c);
    fprintf(stderr, "FAIL: the barrier returned although rank 1 never joined\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return 1;
}

// What the staged communicator promises beyond comm.h (comm_staged.h), which NCCL does not: a
// started collective reads its operand at the start, its result appears at the wait and not
// before, and a received transfer appears at its ticket's wait even once the peer's send is
// done; zero-element starts and transfers are legal.
static void test_staged_strict(comm *c) {
  const int n = c->size, r = c->rank, mate = r ^ 1;
  const int64_t N = 1000;
  float h[2000], *da = dev_alloc(sizeof h), *dc = dev_alloc(sizeof h);
  for (int64_t i = 0; i < N; i++) h[i] = (float)(r + 1);
  up(da, h, (size_t)N * sizeof *h);
  for (int64_t i = 0; i < 2 * N; i++) h[i] = -7.0f;
  up(dc, h, 2 * (size_t)N * sizeof *h);
  c->ops->all_reduce_start(c, da, N, COMM_F32, COMM_SUM);
  c->ops->reduce_scatter_start(c, dc, dc + N, N / n, COMM_F32, COMM_SUM);
  for (int64_t i = 0; i < N; i++) h[i] = 1000.0f;  // written after the start: must not be summed
  up(da, h, (size_t)N * sizeof *h);
  down(c, h, dc + N, (size_t)(N / n) * sizeof *h);
  int early = 0;
  for (int64_t i = 0; i < N / n; i++) early += h[i] != -7.0f;
  EXPECT(early == 0, "staged: reduce_scatter_start's result appeared before its wait (%d elements)", early);
  c->ops->all_reduce_start(c, da, 0, COMM_F32, COMM_SUM);  // empty starts are legal
  c->ops->wait(c);
  down(c, h, da, (size_t)N * sizeof *h);
  int bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(n * (n + 1) / 2);
  EXPECT(bad == 0, "staged: all_reduce_start summed data written after its start (%d elements)", bad);
  // A transfer: the peer's send is done (its ticket waited, then a barrier), yet the receive
  // shows nothing until its own ticket is waited for.
  for (int64_t i = 0; i < N; i++) h[i] = (float)(10 * r + 1);
  up(da, h, (size_t)N * sizeof *h);
  for (int64_t i = 0; i < N; i++) h[i] = -1.0f;
  up(dc, h, (size_t)N * sizeof *h);
  c->ops->xfer_open(c);
  int tr = c->ops->xfer_start(c, dc, N, COMM_F32, mate, 0, NULL, 0);
  int te = c->ops->xfer_start(c, dc + N, 0, COMM_F32, mate, 0, NULL, 0);  // empty transfers are legal
  int mark = c->ops->xfer_mark(c);
  int ts = c->ops->xfer_start(c, da, N, COMM_F32, mate, 1, &mark, 1);
  int tz = c->ops->xfer_start(c, da, 0, COMM_F32, mate, 1, NULL, 0);
  c->ops->xfer_wait(c, ts);
  c->ops->xfer_wait(c, tz);
  c->ops->barrier(c);
  down(c, h, dc, (size_t)N * sizeof *h);
  early = 0;
  for (int64_t i = 0; i < N; i++) early += h[i] != -1.0f;
  EXPECT(early == 0, "staged: a received transfer appeared before its ticket's wait (%d elements)", early);
  c->ops->xfer_wait(c, tr);
  c->ops->xfer_wait(c, te);
  down(c, h, dc, (size_t)N * sizeof *h);
  bad = 0;
  for (int64_t i = 0; i < N; i++) bad += h[i] != (float)(10 * mate + 1);
  EXPECT(bad == 0, "staged: the received transfer is wrong after its wait (%d elements)", bad);
  c->ops->xfer_reset(c);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(dc));
}

// --staged: the staged MPI communicator (comm_staged.h) instead of NCCL, on the same device
// buffers; both ranks may share one GPU.
static int run_staged(void) {
  const int n_dev = comm_nccl_device_count(), local = comm_nccl_local_rank();
  CHECK(n_dev > 0, "--staged: no CUDA device is visible");
  CUDA_CHECK(cudaSetDevice(local % n_dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  comm_opts o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, S);
  F = comm_staged_factory(&o);
  comm *c = comm_factory_create(&F, MPI_COMM_WORLD, "world");
  int cmp = MPI_IDENT;
  MPI_Comm_compare(c->mpi, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "the staged factory must duplicate the communicator (compare = %d)", cmp);
  EXPECT(comm_staged_is(c) && !comm_nccl_is(c) && comm_nccl_stream(c) == NULL, "communicator kind");
  if (c->rank == 0) printf("test_comm_nccl --staged: device %d of %d\n", local % n_dev, n_dev);
  test_comm_all(c);
  comm_free(&c);
  c = comm_factory_create(&F, MPI_COMM_WORLD, "strict");
  test_staged_strict(c);
  comm_free(&c);
  test_grid(comm_staged_is);
  comm_factory_free(&F);
  CUDA_CHECK(cudaStreamDestroy(S));
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc > 1 && !strcmp(argv[1], "--staged")) return run_staged();
  int dev = comm_nccl_set_device();
  CUDA_CHECK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  if (argc > 1 && !strcmp(argv[1], "--timeout-check")) return run_timeout_check();
  comm_opts o = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, S);
  F = comm_nccl_factory(&o);

  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const int local = comm_nccl_local_rank();
  EXPECT(dev == local % comm_nccl_device_count(), "device %d for local rank %d", dev, local);
  if (world_rank == 0) {
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    printf("test_comm_nccl: device %d of %d, NCCL_NVLS_ENABLE=%s before the first communicator\n", dev,
           comm_nccl_device_count(), nvls ? nvls : "(unset)");
  }

  comm *c = comm_factory_create(&F, MPI_COMM_WORLD, "world");
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  EXPECT(nvls && *nvls, "NCCL_NVLS_ENABLE must be set once a communicator exists");
  int cmp = MPI_IDENT;
  MPI_Comm_compare(c->mpi, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "the NCCL factory must duplicate the communicator (compare = %d)", cmp);
  EXPECT(comm_nccl_is(c) && comm_nccl_stream(c) == (void *)S, "communicator kind and stream");
  test_comm_all(c);
  comm_free(&c);
  comm_free(&c);  // safe twice
  EXPECT(c == NULL, "comm_free leaves the pointer set");

  // comm_nccl_wait is a no-op on an MPI communicator, so callers need not ask which they hold.
  comm *m = comm_mpi_create(MPI_COMM_WORLD, "host", NULL);
  comm_nccl_wait(m);
  EXPECT(!comm_nccl_is(m) && comm_nccl_stream(m) == NULL, "an MPI communicator is not NCCL");
  comm_free(&m);

  test_grid(comm_nccl_is);
  comm_factory_free(&F);
  CUDA_CHECK(cudaStreamDestroy(S));
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}
