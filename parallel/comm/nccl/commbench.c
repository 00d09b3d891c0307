// commbench: bandwidth and latency of every communicator operation, as the trainer calls them,
// over NCCL (device buffers) or MPI (host buffers, for comparison), so the cost of a TP
// all-reduce or a DP reduce-scatter of a given size can be read off a table. Each result is
// checked (rank-number payloads, known by hand) before it is timed. Numbers follow nccl-tests:
// size is the largest buffer of the call (the gathered output, the scattered input), algbw =
// size / time, busbw = algbw * (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
// (n-1)/n; broadcast and sendrecv 1), GB = 1e9 bytes; time is the slowest rank's mean per call.
//   mpirun -np 8 commbench [--backend nccl|mpi] [--min-bytes 8] [--max-bytes 1073741824]
//          [--factor 2] [--iters 20] [--warmup 5] [--dtype f32|bf16] [--ops all_reduce,...]
//          [--max-ctas 0] [--p2p-matrix] [--p2p-sweep] [--raw] [--compress none,bf16,fp16,int8]
// --raw adds two columns to the all_reduce, all_gather and reduce_scatter tables: the same call
// straight on a blocking NCCL communicator of the same ranks and stream (no polling, no error
// watch), its time and its host issue time, so the communicator's own host cost shows.
// --max-ctas caps the CTAs of every NCCL operation, as parallel.dp_overlap_ctas does for the
// trainer's dp-overlap communicator (0: NCCL's choice).
// --p2p-matrix times every ordered pair of ranks alone: one-way bandwidth of --max-bytes
// messages and half the round trip of --min-bytes ping-pongs.
// --p2p-sweep times the transfer paths between ranks 0 and 1 for each size from --min-bytes to
// --max-bytes: NCCL send/recv and peer copies on the copy engines (cudaMemcpyAsync into the
// peer's buffer, mapped through a CUDA IPC handle), each as a stream of back-to-back one-way
// transfers (time per transfer, bandwidth) and as a ping-pong (half the round trip: a transfer's
// latency as a waiting receiver sees it). The peer copies' ping-pong signals on the GPU: after
// its copy a rank writes a counter into the peer's memory (cuStreamWriteValue64) and the peer's
// stream waits for it (cuStreamWaitValue64), so no host takes part, as a chunked exchange would
// run (the primitives of parallel.tp_overlap=p2p, comm_peer.h). Only the NCCL backend.
// --compress none,bf16,fp16,int8 adds the compressed reductions of the DP gradients
// (parallel/comm/compress.h, the trainer's code): for each format an all-reduce (plain DP) and a
// reduce-scatter (distributed optimizer) of an fp32 gradient of each size, quantise, exchange and
// dequantise included (on the backend's stream: CUDA for nccl, CPU for mpi); none is the fp32
// started collective the trainer runs uncompressed. Columns: the logical fp32 size, time, the
// bytes this rank sends (wire), and the effective bus bandwidth of the fp32 gradient (size / time
// times the fp32 operation's bus factor), so formats compare on one scale. On one rank the
// exchange is a local copy and the time is the quantise / dequantise cost (docs/compression.md).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <mpi.h>

#include "kernels/base/check.h"
#include "kernels/cuda/backend_cuda.h"
#include "parallel/comm/compress.h"
#include "kernels/base/mpi_check.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/comm_payload.h"
#include "parallel/comm/nccl/comm_nccl.h"
#include "parallel/comm/nccl/comm_peer.h"
#include "parallel/comm/nccl/nccl_check.h"

typedef enum bench_op { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_SENDRECV, OP_ALL_TO_ALL, N_OPS } bench_op;
static const char *const op_names[N_OPS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv", "all_to_all"};

typedef struct bench_opts {
  int nccl;                  // 1: NCCL over device buffers; 0: MPI over host buffers
  int64_t min_bytes, max_bytes;
  int factor, iters, warmup;
  comm_dtype dtype;
  int ops[N_OPS];            // which operations to run
  int max_ctas;              // NCCL: comm_opts.max_ctas
  int p2p_matrix;
  int p2p_sweep;
  int raw;
  int compress[COMM_COMPRESS_INT8 + 1];  // compressed reductions to time, by comm_compress_mode
  int any_compress;
} bench_opts;

// Where buffers live and how time is taken: device memory and CUDA events on the
// communicator's stream for NCCL, host memory and MPI_Wtime for MPI.
typedef struct bench {
  bench_opts o;
  k_backend *be;  // runs the compressed reductions' quantisation (CUDA for nccl, CPU for mpi)
  comm_factory f;
  comm *c;
  cudaStream_t stream;
  cudaEvent_t ev0, ev1;
  double t0;
  ncclComm_t raw;  // --raw: a blocking NCCL communicator beside c
} bench;

// ---- buffers ----------------------------------------------------------------------------------

static void *bench_alloc(bench *b, size_t n_bytes) {
  void *p = NULL;
  if (b->o.nccl)
    CUDA_CHECK(cudaMalloc(&p, n_bytes ? n_bytes : 1));
  else
    p = XMALLOC(n_bytes);
  return p;
}

static void bench_release(bench *b, void *p) {
  if (b->o.nccl)
    CUDA_CHECK(cudaFree(p));
  else
    free(p);
}

static void bench_put(bench *b, void *dst, const void *host, size_t n_bytes) {
  if (b->o.nccl) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, n_bytes, cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
  } else {
    memcpy(dst, host, n_bytes);
  }
}

static void bench_get(bench *b, void *host, const void *src, size_t n_bytes) {
  if (b->o.nccl) {
    comm_nccl_wait(b->c);  // bounded: a hung peer ends the job with a message
    CUDA_CHECK(cudaMemcpyAsync(host, src, n_bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
  } else {
    memcpy(host, src, n_bytes);
  }
}

static void bench_zero(bench *b, void *p, size_t n_bytes) {
  if (b->o.nccl)
    CUDA_CHECK(cudaMemsetAsync(p, 0, n_bytes, b->stream));
  else
    memset(p, 0, n_bytes);
}

// ---- timing -----------------------------------------------------------------------------------

static void bench_start(bench *b) {
  if (b->o.nccl)
    CUDA_CHECK(cudaEventRecord(b->ev0, b->stream));
  else
    b->t0 = MPI_Wtime();
}

// Microseconds since bench_start on this rank.
static double bench_stop(bench *b) {
  if (b->o.nccl) {
    CUDA_CHECK(cudaEventRecord(b->ev1, b->stream));
    comm_nccl_wait(b->c);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, b->ev0, b->ev1));
    return 1e3 * ms;
  }
  return 1e6 * (MPI_Wtime() - b->t0);
}

// ---- payloads ---------------------------------------------------------------------------------

// Every payload is a small integer (< 256 for up to 64 ranks), exact in bf16, and every
// partial sum of a reduction stays below 256 for up to 200 ranks, so results compare with ==
// whatever order NCCL adds in. Rank 0 is the odd one out of reductions so a dropped or doubled
// contribution shows. Returns the expected value of element i of the output.
static float payload_in(bench_op op, int r, int n, int64_t i, int64_t per_rank) {
  switch (op) {
    case OP_ALL_REDUCE: return r == 0 ? (float)(i % 8) : 1.0f;
    case OP_ALL_GATHER: return (float)(r % 64 + i % 4);
    case OP_REDUCE_SCATTER: return r == 0 ? (float)((i / per_rank + i) % 8) : 1.0f;
    case OP_BROADCAST: return r == n - 1 ? (float)(n % 64 + i % 8) : -1.0f;
    case OP_SENDRECV: return (float)(r % 64 + i % 4);
    case OP_ALL_TO_ALL: return (float)((r % 16) * 8 + (i / per_rank) % 8 + i % 2);
    default: return 0;
  }
}

static float payload_out(bench_op op, int r, int n, int64_t i, int64_t per_rank) {
  switch (op) {
    case OP_ALL_REDUCE: return (float)(n - 1 + i % 8);
    case OP_ALL_GATHER: return (float)((i / per_rank) % 64 + (i % per_rank) % 4);
    // Output block r holds input elements r * per_rank + i.
    case OP_REDUCE_SCATTER: return (float)(n - 1 + (r + r * per_rank + i) % 8);
    case OP_BROADCAST: return (float)(n % 64 + i % 8);
    case OP_SENDRECV: return (float)(((r + n - 1) % n) % 64 + i % 4);
    // Block s came from rank s's block r.
    case OP_ALL_TO_ALL: return (float)(((i / per_rank) % 16) * 8 + r % 8 + (r * per_rank + i % per_rank) % 2);
    default: return 0;
  }
}

// ---- one operation at one size ----------------------------------------------------------------

typedef struct bench_case {
  int64_t in_elem, out_elem;  // elements of the input and output buffer of this rank
  int64_t per_rank;           // count passed to the call
  int64_t size_bytes;         // nccl-tests "size": the largest buffer
  double bus_factor;
} bench_case;

// Counts in nccl-tests fashion: the size is rounded down to a multiple of n elements where the
// call splits it by rank. Returns 0 when the size holds too few elements for this op.
static int bench_shape(bench_op op, int64_t bytes, int n, int esz, bench_case *k) {
  int64_t count = bytes / esz;
  const double nm1 = (double)(n - 1) / n;
  memset(k, 0, sizeof *k);
  switch (op) {
    case OP_ALL_REDUCE: k->per_rank = count; k->in_elem = k->out_elem = count; k->bus_factor = 2 * nm1; break;
    case OP_BROADCAST: k->per_rank = count; k->in_elem = k->out_elem = count; k->bus_factor = 1; break;
    case OP_SENDRECV: k->per_rank = count; k->in_elem = k->out_elem = count; k->bus_factor = 1; break;
    case OP_ALL_GATHER:
      k->per_rank = count / n; k->in_elem = k->per_rank; k->out_elem = k->per_rank * n; k->bus_factor = nm1; break;
    case OP_REDUCE_SCATTER:
      k->per_rank = count / n; k->in_elem = k->per_rank * n; k->out_elem = k->per_rank; k->bus_factor = nm1; break;
    case OP_ALL_TO_ALL:
      k->per_rank = count / n; k->in_elem = k->out_elem = k->per_rank * n; k->bus_factor = nm1; break;
    default: return 0;
  }
  k->size_bytes = (k->in_elem > k->out_elem ? k->in_elem : k->out_elem) * esz;
  return k->per_rank > 0;
}

static void bench_call(bench *b, bench_op op, const bench_case *k, void *in, void *out) {
  comm *c = b->c;
  const comm_dtype t = b->o.dtype;
  switch (op) {
    case OP_ALL_REDUCE: c->ops->all_reduce(c, in, k->per_rank, t, COMM_SUM); break;
    case OP_ALL_GATHER: c->ops->all_gather(c, in, out, k->per_rank, t); break;
    case OP_REDUCE_SCATTER: c->ops->reduce_scatter(c, in, out, k->per_rank, t, COMM_SUM); break;
    case OP_BROADCAST: c->ops->broadcast(c, in, k->per_rank, t, c->size - 1); break;
    case OP_SENDRECV:
      c->ops->group_start(c);
      c->ops->send(c, in, k->per_rank, t, (c->rank + 1) % c->size);
      c->ops->recv(c, out, k->per_rank, t, (c->rank + c->size - 1) % c->size);
      c->ops->group_end(c);
      break;
    case OP_ALL_TO_ALL: c->ops->all_to_all(c, in, out, k->per_rank, t); break;
    default: break;
  }
}

// In-place operations leave their result in the input buffer.
static int bench_in_place(bench_op op) { return op == OP_ALL_REDUCE || op == OP_BROADCAST; }

// Checks one call on known payloads, then times iters calls after warmup ones. Returns the
// slowest rank's mean microseconds per call; *n_wrong gets the wrong elements of all ranks and
// *issue_us the slowest rank's host time per call up to the last launch (NCCL: returns before
// the GPU is done; MPI: the whole call).
static double bench_one(bench *b, bench_op op, const bench_case *k, void *in, void *out, void *host,
                        long long *n_wrong, double *issue_us) {
  const int r = b->c->rank, n = b->c->size, esz = comm_dtype_bytes(b->o.dtype);
  for (int64_t i = 0; i < k->in_elem; i++) comm_payload_set(host, i, b->o.dtype, payload_in(op, r, n, i, k->per_rank));
  bench_put(b, in, host, (size_t)(k->in_elem * esz));
  bench_call(b, op, k, in, out);
  bench_get(b, host, bench_in_place(op) ? in : out, (size_t)(k->out_elem * esz));
  long long bad = 0;
  for (int64_t i = 0; i < k->out_elem; i++) {
    float want = payload_out(op, r, n, i, k->per_rank), got = comm_payload_get(host, i, b->o.dtype);
    if (got != want && bad++ == 0)
      fprintf(stderr, "rank %d: %s of %lld bytes: [%lld] = %g, want %g\n", r, op_names[op],
              (long long)k->size_bytes, (long long)i, got, want);
  }
  MPI_CHECK(MPI_Allreduce(&bad, n_wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));

  // Timed calls run on zeros: repeated in-place sums would otherwise grow to Inf, and the data
  // never changes the speed of a transfer.
  bench_zero(b, in, (size_t)(k->in_elem * esz));
  for (int w = 0; w < b->o.warmup; w++) bench_call(b, op, k, in, out);
  b->c->ops->barrier(b->c);  // everyone starts the clock together
  bench_start(b);
  double h0 = MPI_Wtime();
  for (int it = 0; it < b->o.iters; it++) bench_call(b, op, k, in, out);
  // Host time to issue a call: when it is close to the GPU time, launches, not links, set
  // the pace (small messages).
  double h1 = MPI_Wtime();
  double t[2] = {bench_stop(b) / b->o.iters, 1e6 * (h1 - h0) / b->o.iters};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  *issue_us = t[1];
  return t[0];
}

// --raw: one call of op straight on the blocking communicator. 0 when op has no raw form here.
static int bench_raw_call(bench *b, bench_op op, const bench_case *k, void *in, void *out) {
  const ncclDataType_t t = b->o.dtype == COMM_BF16 ? ncclBfloat16 : ncclFloat32;
  switch (op) {
    case OP_ALL_REDUCE: NCCL_CHECK(ncclAllReduce(in, in, (size_t)k->per_rank, t, ncclSum, b->raw, b->stream)); return 1;
    case OP_ALL_GATHER: NCCL_CHECK(ncclAllGather(in, out, (size_t)k->per_rank, t, b->raw, b->stream)); return 1;
    case OP_REDUCE_SCATTER:
      NCCL_CHECK(ncclReduceScatter(in, out, (size_t)k->per_rank, t, ncclSum, b->raw, b->stream));
      return 1;
    default: return 0;
  }
}

// --raw: the slowest rank's microseconds per raw call (t[0]) and host issue time (t[1]); -1 without.
static void bench_raw(bench *b, bench_op op, const bench_case *k, void *in, void *out, double t[2]) {
  t[0] = t[1] = -1;
  if (!b->raw || !bench_raw_call(b, op, k, in, out)) return;
  for (int w = 0; w < b->o.warmup; w++) bench_raw_call(b, op, k, in, out);
  CUDA_CHECK(cudaStreamSynchronize(b->stream));
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  bench_start(b);
  double h0 = MPI_Wtime();
  for (int it = 0; it < b->o.iters; it++) bench_raw_call(b, op, k, in, out);
  double h1 = MPI_Wtime();
  t[0] = bench_stop(b) / b->o.iters;
  t[1] = 1e6 * (h1 - h0) / b->o.iters;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
}

static int bench_run_ops(bench *b) {
  const int n = b->c->size, r = b->c->rank, esz = comm_dtype_bytes(b->o.dtype);
  // The largest buffer any op needs at max_bytes, for two buffers and a host copy.
  const size_t cap = (size_t)b->o.max_bytes + (size_t)n * esz;
  void *in = bench_alloc(b, cap), *out = bench_alloc(b, cap), *host = XMALLOC(cap);
  long long total_wrong = 0;
  for (int op = 0; op < N_OPS; op++) {
    if (!b->o.ops[op]) continue;
    if (r == 0) {
      printf("\n# %s, %s backend, %d ranks, %s, %d iterations after %d warm-up\n", op_names[op],
             b->o.nccl ? "nccl" : "mpi", n, b->o.dtype == COMM_BF16 ? "bf16" : "f32", b->o.iters, b->o.warmup);
      printf("%14s %12s %12s %12s %12s %8s %10s%s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
             "#wrong", "issue(us)", b->raw ? "    raw(us) raw_issue(us)" : "");
    }
    double last_bus = 0;
    int64_t last_size = 0;
    for (int64_t bytes = b->o.min_bytes; bytes <= b->o.max_bytes; bytes *= b->o.factor) {
      bench_case k;
      if (!bench_shape((bench_op)op, bytes, n, esz, &k)) continue;
      long long wrong = 0;
      double issue_us = 0;
      double us = bench_one(b, (bench_op)op, &k, in, out, host, &wrong, &issue_us), raw[2];
      bench_raw(b, (bench_op)op, &k, in, out, raw);
      double algbw = (double)k.size_bytes / (us * 1e-6) / 1e9, busbw = algbw * k.bus_factor;
      total_wrong += wrong;
      last_bus = busbw;
      last_size = k.size_bytes;
      if (r == 0) {
        printf("%14lld %12lld %12.2f %12.2f %12.2f %8lld %10.2f", (long long)k.size_bytes,
               (long long)(k.in_elem > k.out_elem ? k.in_elem : k.out_elem), us, algbw, busbw, wrong, issue_us);
        if (raw[0] >= 0) printf(" %10.2f %14.2f", raw[0], raw[1]);
        printf("\n");
        fflush(stdout);
      }
    }
    if (r == 0 && last_size) printf("# %s busbw at %lld bytes: %.2f GB/s\n", op_names[op], (long long)last_size, last_bus);
  }
  if (r == 0) printf("\n# %s: %lld wrong elements in all checks\n", total_wrong ? "FAILED" : "ok", total_wrong);
  bench_release(b, in);
  bench_release(b, out);
  free(host);
  return total_wrong != 0;
}

// ---- compressed reductions ---------------------------------------------------------------------

static const char *const compress_names[] = {"none", "bf16", "fp16", "int8"};

// Gradient payloads: integers in [-127, 127] that differ by rank (each block of 256 holds every
// value), so int8's first quantisation is exact but in a chunk's last, partial block, and every
// format's error has a bound by hand: bf16 rounds each ring step (2^-8 of the sum per rank), fp16
// is exact up to 16 ranks (sums below 2048, scaled by a power of two), int8 is off by at most half
// a step (<= 0.5) per rank and half a step of the re-quantised sum (<= 127 n / 127 / 2).
static float compress_payload(int r, int64_t i) { return (float)((r * 37 + i) % 255 - 127); }

static double compress_tolerance(comm_compress_mode m, int n, double want) {
  switch (m) {
    case COMM_COMPRESS_BF16: return fabs(want) * n * 0x1p-8;
    case COMM_COMPRESS_FP16: return fabs(want) * n * 0x1p-11;
    case COMM_COMPRESS_INT8: return 1.001 * n;
    default: return 0;
  }
}

typedef struct bench_compress_bufs {
  comm_compress_span s;
  float *x, *out;  // (n) the gradient; the result (n plain, chunk scattered)
} bench_compress_bufs;

static void bench_compress_call(bench *b, bench_compress_bufs *z) {
  comm *c = b->c;
  if (z->s.mode == COMM_COMPRESS_NONE) {
    if (z->s.scatter) c->ops->reduce_scatter_start(c, z->x, z->out, z->s.chunk, COMM_F32, COMM_SUM);
    else c->ops->all_reduce_start(c, z->x, z->s.n, COMM_F32, COMM_SUM);
    c->ops->wait(c);
    return;
  }
  comm_compress_start(b->be, c, &z->s, z->x, NULL);
  c->ops->wait(c);
  comm_compress_finish(b->be, c, &z->s, z->out);
}

// Checks one reduction of the payloads; returns this rank's wrong elements.
static long long bench_compress_check(bench *b, bench_compress_bufs *z, float *host) {
  const int n = b->c->size, r = b->c->rank;
  for (int64_t i = 0; i < z->s.n; i++) host[i] = compress_payload(r, i);
  bench_put(b, z->x, host, (size_t)z->s.n * sizeof(float));
  bench_compress_call(b, z);
  const int in_place = z->s.mode == COMM_COMPRESS_NONE && !z->s.scatter;
  const int64_t lo = z->s.scatter ? r * z->s.chunk : 0, len = z->s.scatter ? z->s.chunk : z->s.n;
  bench_get(b, host, in_place ? z->x : z->out, (size_t)len * sizeof(float));
  long long bad = 0;
  for (int64_t i = 0; i < len; i++) {
    double want = 0;
    for (int q = 0; q < n; q++) want += compress_payload(q, lo + i);
    if (!(fabs(host[i] - want) <= compress_tolerance(z->s.mode, n, want)) && bad++ == 0)
      fprintf(stderr, "rank %d: %s %s of %lld floats: [%lld] = %g, want %g\n", r, compress_names[z->s.mode],
              z->s.scatter ? "reduce_scatter" : "all_reduce", (long long)z->s.n, (long long)i, host[i], want);
  }
  return bad;
}

// One format and kind at every size: the table of --compress.
static long long bench_compress_table(bench *b, comm_compress_mode mode, int scatter) {
  const int n = b->c->size, r = b->c->rank;
  const int64_t max_n = b->o.max_bytes / 4 + n;
  k_backend *be = b->be;
  bench_compress_bufs z = {.s = {.mode = mode, .scatter = scatter}};
  z.x = bench_alloc(b, (size_t)max_n * sizeof(float));
  z.out = bench_alloc(b, (size_t)max_n * sizeof(float));
  const int64_t max_chunk = (max_n + n - 1) / n;
  z.s.send = be->alloc(be, (size_t)comm_compress_bytes(mode, max_n, max_chunk, n, scatter, 0) + 1);
  z.s.recv = be->alloc(be, (size_t)comm_compress_bytes(mode, max_n, max_chunk, n, scatter, 1) + 1);
  z.s.amax = be->alloc(be, sizeof(float));
  float *host = XMALLOC((size_t)max_n * sizeof(float));
  if (r == 0) {
    printf("\n# compressed %s (%s), %s backend, %d ranks, %d iterations after %d warm-up\n",
           scatter ? "reduce_scatter" : "all_reduce", compress_names[mode], b->o.nccl ? "nccl" : "mpi", n, b->o.iters,
           b->o.warmup);
    printf("%14s %12s %12s %14s %16s %8s\n", "fp32 size(B)", "count", "time(us)", "wire(B/rank)", "eff busbw(GB/s)",
           "#wrong");
  }
  long long total = 0;
  for (int64_t bytes = b->o.min_bytes; bytes <= b->o.max_bytes; bytes *= b->o.factor) {
    z.s.n = bytes / 4 / (scatter ? n : 1) * (scatter ? n : 1);
    z.s.chunk = scatter ? z.s.n / n : (z.s.n + n - 1) / n;
    if (z.s.n < n) continue;
    long long bad = bench_compress_check(b, &z, host), wrong = 0;
    MPI_CHECK(MPI_Allreduce(&bad, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    total += wrong;
    bench_zero(b, z.x, (size_t)z.s.n * sizeof(float));
    for (int w = 0; w < b->o.warmup; w++) bench_compress_call(b, &z);
    b->c->ops->barrier(b->c);
    bench_start(b);
    for (int it = 0; it < b->o.iters; it++) bench_compress_call(b, &z);
    double us = bench_stop(b) / b->o.iters;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const double fp32_bytes = 4.0 * (double)z.s.n, bus = (scatter ? 1.0 : 2.0) * (n - 1) / n;
    if (r == 0) {
      printf("%14.0f %12lld %12.2f %14lld %16.2f %8lld\n", fp32_bytes, (long long)z.s.n, us,
             (long long)comm_compress_wire_bytes(mode, z.s.n, z.s.chunk, n, scatter), fp32_bytes / (us * 1e-6) / 1e9 * bus,
             wrong);
      fflush(stdout);
    }
  }
  bench_release(b, z.x);
  bench_release(b, z.out);
  be->free(be, z.s.send);
  be->free(be, z.s.recv);
  be->free(be, z.s.amax);
  free(host);
  return total;
}

static int bench_run_compressed(bench *b) {
  long long total = 0;
  for (int m = 0; m <= COMM_COMPRESS_INT8; m++)
    for (int scatter = 0; scatter < 2 && b->o.compress[m]; scatter++) total += bench_compress_table(b, (comm_compress_mode)m, scatter);
  if (b->c->rank == 0) printf("\n# compressed: %s: %lld elements outside their format's bound\n", total ? "FAILED" : "ok", total);
  return total != 0;
}

// ---- pairwise matrix --------------------------------------------------------------------------

// Times src -> dst alone (every other rank waits): iters one-way sends of bw_bytes, and iters
// ping-pongs of lat_bytes. Returns the slowest of the two ranks' times in *bw_us and *lat_us.
static void bench_pair(bench *b, int src, int dst, void *buf, int64_t bw_elem, int64_t lat_elem, double *bw_us,
                       double *lat_us) {
  comm *c = b->c;
  const comm_dtype t = b->o.dtype;
  double bw = 0, lat = 0;
  if (c->rank == src || c->rank == dst) {
    const int peer = c->rank == src ? dst : src;
    for (int pass = 0; pass < 2; pass++) {  // pass 0 warms up (NCCL connects a pair lazily)
      const int reps = pass ? b->o.iters : (b->o.warmup > 0 ? b->o.warmup : 1);
      bench_start(b);
      for (int it = 0; it < reps; it++) {
        if (c->rank == src) c->ops->send(c, buf, bw_elem, t, peer);
        else c->ops->recv(c, buf, bw_elem, t, peer);
      }
      bw = bench_stop(b) / reps;
      bench_start(b);
      for (int it = 0; it < reps; it++) {
        if (c->rank == src) {
          c->ops->send(c, buf, lat_elem, t, peer);
          c->ops->recv(c, buf, lat_elem, t, peer);
        } else {
          c->ops->recv(c, buf, lat_elem, t, peer);
          c->ops->send(c, buf, lat_elem, t, peer);
        }
      }
      lat = bench_stop(b) / reps / 2;
    }
  }
  double v[2] = {bw, lat};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  *bw_us = v[0];
  *lat_us = v[1];
}

static void bench_p2p_matrix(bench *b) {
  const int n = b->c->size, r = b->c->rank, esz = comm_dtype_bytes(b->o.dtype);
  const int64_t bw_elem = b->o.max_bytes / esz, lat_elem = b->o.min_bytes / esz > 0 ? b->o.min_bytes / esz : 1;
  void *buf = bench_alloc(b, (size_t)(bw_elem * esz));
  bench_zero(b, buf, (size_t)(bw_elem * esz));
  double *bw = XCALLOC((size_t)n * n, sizeof *bw), *lat = XCALLOC((size_t)n * n, sizeof *lat);
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++) {
      if (s == d) continue;
      double bus, lus;
      bench_pair(b, s, d, buf, bw_elem, lat_elem, &bus, &lus);
      bw[s * n + d] = (double)(bw_elem * esz) / (bus * 1e-6) / 1e9;
      lat[s * n + d] = lus;
    }
  if (r == 0) {
    const char *titles[2] = {"one-way bandwidth (GB/s)", "latency (us, half a ping-pong)"};
    for (int m = 0; m < 2; m++) {
      printf("\n# p2p %s, %s backend, %lld-byte messages; row = sender, column = receiver\n", titles[m],
             b->o.nccl ? "nccl" : "mpi", (long long)((m ? lat_elem : bw_elem) * esz));
      printf("%6s", "src\\dst");
      for (int d = 0; d < n; d++) printf(" %9d", d);
      printf("\n");
      for (int s = 0; s < n; s++) {
        printf("%7d", s);
        for (int d = 0; d < n; d++) {
          if (s == d) printf(" %9s", "-");
          else printf(" %9.2f", m ? lat[s * n + d] : bw[s * n + d]);
        }
        printf("\n");
      }
    }
  }
  free(bw);
  free(lat);
  bench_release(b, buf);
}

// ---- transfer paths between ranks 0 and 1 ----------------------------------------------------

typedef struct sweep_pair {
  int peer;
  MPI_Comm mpi;                  // ranks 0 and 1
  void *buf, *peer_buf;          // max_bytes each
  uint64_t *flag, *peer_flag;    // one counter each, written by the other rank
  uint64_t count;                // the last counter value sent and awaited
} sweep_pair;

// One peer copy of n bytes into the peer's buffer, then the peer's counter raised.
static void ce_send(bench *b, sweep_pair *p, size_t n) {
  CUDA_CHECK(cudaMemcpyAsync(p->peer_buf, p->buf, n, cudaMemcpyDeviceToDevice, b->stream));
  peer_signal(b->stream, p->peer_flag, p->count);
}
static void ce_recv(bench *b, sweep_pair *p) {
  peer_await(b->stream, p->flag, p->count);
}

// Microseconds per call of the four paths at n bytes, the slowest of the two ranks.
static void sweep_size(bench *b, sweep_pair *p, size_t n, double us[4]) {
  comm *c = b->c;
  const int64_t ne = (int64_t)n / comm_dtype_bytes(b->o.dtype);
  const int sender = c->rank == 0;
  for (int path = 0; path < 4; path++) {
    for (int pass = 0; pass < 2; pass++) {  // pass 0 warms up
      const int reps = pass ? b->o.iters : (b->o.warmup > 0 ? b->o.warmup : 1);
      MPI_CHECK(MPI_Barrier(p->mpi));
      bench_start(b);
      for (int it = 0; it < reps; it++) {
        switch (path) {
          case 0:  // NCCL one-way
            if (sender) c->ops->send(c, p->buf, ne, b->o.dtype, p->peer);
            else c->ops->recv(c, p->buf, ne, b->o.dtype, p->peer);
            break;
          case 1:  // NCCL ping-pong
            if (sender) c->ops->send(c, p->buf, ne, b->o.dtype, p->peer);
            c->ops->recv(c, p->buf, ne, b->o.dtype, p->peer);
            if (!sender) c->ops->send(c, p->buf, ne, b->o.dtype, p->peer);
            break;
          case 2:  // peer copies one-way: the receiver only waits for the last
            p->count++;
            if (sender) CUDA_CHECK(cudaMemcpyAsync(p->peer_buf, p->buf, n, cudaMemcpyDeviceToDevice, b->stream));
            if (sender && it == reps - 1) ce_send(b, p, 0);
            if (!sender && it == reps - 1) ce_recv(b, p);
            break;
          case 3:  // peer copies ping-pong, signalled on the GPU
            p->count++;
            if (sender) ce_send(b, p, n);
            ce_recv(b, p);
            if (!sender) ce_send(b, p, n);
            break;
        }
      }
      us[path] = bench_stop(b) / reps / (path == 1 || path == 3 ? 2 : 1);
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &us[path], 1, MPI_DOUBLE, MPI_MAX, p->mpi));
    }
  }
}

static void bench_p2p_sweep(bench *b) {
  comm *c = b->c;
  CHECK(b->o.nccl, "commbench: --p2p-sweep needs --backend nccl (peer copies between GPUs)");
  CHECK(c->size >= 2, "commbench: --p2p-sweep needs 2 ranks, not %d", c->size);
  sweep_pair p = {.peer = c->rank == 0 ? 1 : 0};
  if (c->rank < 2) {
    CUDA_CHECK(cudaMalloc(&p.buf, (size_t)b->o.max_bytes));
    CUDA_CHECK(cudaMemset(p.buf, 0, (size_t)b->o.max_bytes));
    CUDA_CHECK(cudaMalloc((void **)&p.flag, 64));
    CUDA_CHECK(cudaMemset(p.flag, 0, 64));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->rank < 2 ? 0 : MPI_UNDEFINED, c->rank, &p.mpi));
  void *bufs[2] = {0}, *flags[2] = {0};
  if (c->rank < 2) {
    peer_map_all(p.mpi, p.buf, bufs);
    peer_map_all(p.mpi, p.flag, flags);
    p.peer_buf = bufs[p.peer];
    p.peer_flag = flags[p.peer];
  }
  if (c->rank == 0)
    printf("\n# ranks 0 -> 1: time per transfer (us) and bandwidth (GB/s); one-way = back-to-back transfers, "
           "ping-pong = half a round trip\n%12s %12s %10s %12s %10s %12s %10s %12s %10s\n", "bytes", "nccl 1-way",
           "GB/s", "nccl p-p", "GB/s", "copy 1-way", "GB/s", "copy p-p", "GB/s");
  for (int64_t n = b->o.min_bytes; n <= b->o.max_bytes; n *= b->o.factor) {
    double us[4] = {0};
    if (c->rank < 2) sweep_size(b, &p, (size_t)n, us);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (c->rank == 0) {
      printf("%12lld", (long long)n);
      for (int k = 0; k < 4; k++) printf(" %12.2f %10.2f", us[k], (double)n / (us[k] * 1e-6) / 1e9);
      printf("\n");
      fflush(stdout);
    }
  }
  if (c->rank < 2) {
    CUDA_CHECK(cudaDeviceSynchronize());
    peer_unmap_all(p.mpi, bufs);
    peer_unmap_all(p.mpi, flags);
    CUDA_CHECK(cudaFree(p.buf));
    CUDA_CHECK(cudaFree(p.flag));
    MPI_CHECK(MPI_Comm_free(&p.mpi));
  }
}

// ---- options ----------------------------------------------------------------------------------

static void usage_fail(const char *msg, const char *arg) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == 0)
    fprintf(stderr, "commbench: %s%s\nusage: commbench [--backend nccl|mpi] [--min-bytes N] [--max-bytes N] "
                    "[--factor F] [--iters N] [--warmup N] [--dtype f32|bf16] [--ops name,name,...] [--max-ctas N] "
                    "[--p2p-matrix] [--p2p-sweep] [--raw] [--compress none,bf16,fp16,int8]\n"
                    "ops: all_reduce all_gather reduce_scatter broadcast sendrecv all_to_all\n", msg, arg);
  MPI_Finalize();
  exit(2);
}

static int64_t parse_int(const char *s, const char *name, int64_t lo) {
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < lo) usage_fail("bad value for ", name);
  return v;
}

static bench_opts parse_opts(int argc, char **argv) {
  bench_opts o = {.nccl = 1, .min_bytes = 8, .max_bytes = (int64_t)1 << 30, .factor = 2, .iters = 20, .warmup = 5,
                  .dtype = COMM_F32};
  int any_op = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--p2p-matrix")) { o.p2p_matrix = 1; continue; }
    if (!strcmp(a, "--p2p-sweep")) { o.p2p_sweep = 1; continue; }
    if (!strcmp(a, "--raw")) { o.raw = 1; continue; }
    if (strncmp(a, "--", 2) != 0) usage_fail("unexpected argument ", a);
    if (i + 1 >= argc) usage_fail("missing value after ", a);
    const char *v = argv[++i];
    if (!strcmp(a, "--backend")) {
      if (!strcmp(v, "nccl")) o.nccl = 1;
      else if (!strcmp(v, "mpi")) o.nccl = 0;
      else usage_fail("--backend takes nccl or mpi, not ", v);
    } else if (!strcmp(a, "--min-bytes")) o.min_bytes = parse_int(v, a, 1);
    else if (!strcmp(a, "--max-bytes")) o.max_bytes = parse_int(v, a, 1);
    else if (!strcmp(a, "--factor")) o.factor = (int)parse_int(v, a, 2);
    else if (!strcmp(a, "--iters")) o.iters = (int)parse_int(v, a, 1);
    else if (!strcmp(a, "--warmup")) o.warmup = (int)parse_int(v, a, 0);
    else if (!strcmp(a, "--max-ctas")) o.max_ctas = (int)parse_int(v, a, 0);
    else if (!strcmp(a, "--dtype")) {
      if (!strcmp(v, "f32")) o.dtype = COMM_F32;
      else if (!strcmp(v, "bf16")) o.dtype = COMM_BF16;
      else usage_fail("--dtype takes f32 or bf16, not ", v);
    } else if (!strcmp(a, "--compress")) {
      char list[256];
      snprintf(list, sizeof list, "%s", v);
      for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int k = 0; k <= COMM_COMPRESS_INT8; k++)
          if (!strcmp(tok, compress_names[k])) o.compress[k] = found = o.any_compress = 1;
        if (!found) usage_fail("unknown compression (none, bf16, fp16, int8): ", tok);
      }
    } else if (!strcmp(a, "--ops")) {
      char list[256];
      snprintf(list, sizeof list, "%s", v);
      for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int k = 0; k < N_OPS; k++)
          if (!strcmp(tok, op_names[k])) o.ops[k] = found = any_op = 1;
        if (!found) usage_fail("unknown op ", tok);
      }
    } else {
      usage_fail("unknown option ", a);
    }
  }
  if (!any_op && !o.any_compress)
    for (int k = 0; k < N_OPS; k++) o.ops[k] = 1;
  if (o.min_bytes > o.max_bytes) usage_fail("--min-bytes is above --max-bytes", "");
  return o;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  bench b;
  memset(&b, 0, sizeof b);
  b.o = parse_opts(argc, argv);
  comm_opts co = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, b.o.max_ctas, 0, NULL);
  if (b.o.nccl) {
    // The backend's stream carries everything, so the quantisation and the collectives are ordered.
    k_backend_opts bo = {.device = comm_nccl_set_device()};
    b.be = k_backend_cuda_create(&bo);
    b.stream = k_cuda_stream_of(b.be);
    CUDA_CHECK(cudaEventCreate(&b.ev0));
    CUDA_CHECK(cudaEventCreate(&b.ev1));
    co.stream = b.stream;
    b.f = comm_nccl_factory(&co);
  } else {
    b.be = k_backend_cpu_create(NULL);
    b.f = comm_mpi_factory(&co);
  }
  b.c = comm_factory_create(&b.f, MPI_COMM_WORLD, "bench");
  CHECK(!b.o.raw || b.o.nccl, "commbench: --raw compares against NCCL: it needs --backend nccl");
  if (b.o.raw) {
    ncclUniqueId id;
    if (b.c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    NCCL_CHECK(ncclCommInitRank(&b.raw, b.c->size, id, b.c->rank));
  }
  if (b.c->rank == 0) {
    printf("# commbench: %d ranks, backend %s", b.c->size, b.o.nccl ? "nccl" : "mpi");
    if (b.o.nccl) {
      int v = 0, dev = 0;
      struct cudaDeviceProp prop;
      NCCL_CHECK(ncclGetVersion(&v));
      CUDA_CHECK(cudaGetDevice(&dev));
      CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
      const char *nvls = getenv("NCCL_NVLS_ENABLE");
      printf(" (NCCL %d.%d.%d, %s, NCCL_NVLS_ENABLE=%s, max CTAs %d)", v / 10000, v / 100 % 100, v % 100,
             prop.name, nvls ? nvls : "(unset)", b.o.max_ctas);
    }
    printf("\n");
  }
  int rc = 0;
  if (b.o.p2p_matrix)
    bench_p2p_matrix(&b);
  else if (b.o.p2p_sweep)
    bench_p2p_sweep(&b);
  else
    rc = bench_run_ops(&b);
  if (b.o.any_compress && !b.o.p2p_matrix && !b.o.p2p_sweep) rc |= bench_run_compressed(&b);
  if (b.raw) NCCL_CHECK(ncclCommDestroy(b.raw));
  comm_free(&b.c);
  comm_factory_free(&b.f);
  if (b.o.nccl) {
    CUDA_CHECK(cudaEventDestroy(b.ev0));
    CUDA_CHECK(cudaEventDestroy(b.ev1));
  }
  k_backend_free(&b.be);
  MPI_Finalize();
  return rc;
}
