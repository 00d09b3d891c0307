// MPI communicator and process grid, under mpirun -np 4: every collective and point-to-point
// pattern with rank-number payloads, so each expected value is known by hand, for every dtype;
// once with whole calls and once with comm_opts.mpi_chunk_elems = 2 so the paths that cut counts
// above INT_MAX into pieces run on small buffers. Then grid_init for every 4-rank layout.
#include <stdlib.h>
#include <string.h>

#include "parallel/comm/comm.h"
#include "parallel/comm/comm_payload.h"
#include "parallel/comm/grid.h"
#include "tests/test_util.h"

// Values are small integers (|x| <= 256) plus, for 64-bit types, a 2^40 offset that a 32-bit
// path would lose; all exact in every dtype, so sums compare with ==.
static const double BIG = 1099511627776.0;  // 2^40

// Counts the elements of buf[0..n) that differ from want(i); reports the first.
#define CHECK_ALL(what, buf, n, t, want_expr)                                                          \
  do {                                                                                                 \
    int bad_ = 0;                                                                                      \
    for (int64_t i = 0; i < (n); i++) {                                                                \
      double want_ = (want_expr), got_ = comm_payload_get((buf), i, (t));                                           \
      if (got_ != want_ && bad_++ == 0)                                                                \
        fprintf(stderr, "rank %d %s %s chunk %s: [%lld] = %.17g, want %.17g\n", c->rank, what,         \
                comm_dtype_name(t), chunked ? "2" : "off", (long long)i, got_, want_);                       \
    }                                                                                                  \
    EXPECT(bad_ == 0, "%s %s: %d wrong elements", what, comm_dtype_name(t), bad_);                          \
  } while (0)

static void test_dtype(comm *c, comm_dtype t, int chunked) {
  const int n = c->size, r = c->rank;
  const int64_t N = 5;  // per-rank block: 2 + 2 + 1 when chunked
  const double off = (t == COMM_I64 || t == COMM_F64) ? BIG : 0.0;
  const size_t esz = (size_t)comm_dtype_bytes(t);
  char *a = calloc((size_t)(n * N), esz), *b = calloc((size_t)(n * N), esz);

  // all_reduce sum of rank + i: n(n-1)/2 + n*i; max: n - 1 + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  c->ops->all_reduce(c, a, N, t, COMM_SUM);
  CHECK_ALL("all_reduce sum", a, N, t, n * off + n * (n - 1) / 2 + n * i);
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + r + i);
  c->ops->all_reduce(c, a, N, t, COMM_MAX);
  CHECK_ALL("all_reduce max", a, N, t, off + n - 1 + i);
  // Negative values: max picks the least negative, sum stays exact.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, -(double)(r + 1) * (i + 1));
  c->ops->all_reduce(c, a, N, t, COMM_MAX);
  CHECK_ALL("all_reduce max of negatives", a, N, t, -(double)(i + 1));

  // all_gather: rank q's block holds 10q + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i);
  c->ops->all_gather(c, a, b, N, t);
  CHECK_ALL("all_gather", b, n * N, t, off + 10 * (i / N) + i % N);

  // reduce_scatter: rank r sends 10q + r + i in block q; block q reduced lands on rank q:
  // sum = n(10q + i) + n(n-1)/2, max = 10q + i + n - 1.
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 10 * q + r + i);
  c->ops->reduce_scatter(c, a, b, N, t, COMM_SUM);
  CHECK_ALL("reduce_scatter sum", b, N, t, n * off + n * (10.0 * r + i) + n * (n - 1) / 2);
  c->ops->reduce_scatter(c, a, b, N, t, COMM_MAX);
  CHECK_ALL("reduce_scatter max", b, N, t, off + 10.0 * r + i + n - 1);

  // broadcast from root 2: everyone ends with 100 + i.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, r == 2 ? off + 100 + i : -1);
  c->ops->broadcast(c, a, N, t, 2);
  CHECK_ALL("broadcast root 2", a, N, t, off + 100 + i);

  // all_to_all: rank r's block q (for rank q) holds 16r + 4q + i, so rank r finds 16s + 4r + i
  // in block s (values stay below 256: bf16-exact).
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < N; i++) comm_payload_set(a, q * N + i, t, off + 16 * r + 4 * q + i);
  c->ops->all_to_all(c, a, b, N, t);
  CHECK_ALL("all_to_all", b, n * N, t, off + 16.0 * (i / N) + 4 * r + i % N);

  // Ring inside one group: everyone sends right and receives from the left, which would
  // deadlock as blocking calls once messages are large (rendezvous).
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  c->ops->group_start(c);
  c->ops->send(c, a, N, t, right);
  c->ops->recv(c, b, N, t, left);
  c->ops->group_end(c);
  CHECK_ALL("ring send/recv in a group", b, N, t, off + 10 * left + i);

  // Crossed pairs (0,1), (2,3): both send first, then receive, two messages each way, with
  // the receive posted before the send on odd ranks: matching is per pair in posting order.
  const int mate = r ^ 1;
  for (int64_t i = 0; i < 2 * N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  c->ops->group_start(c);
  if (r % 2) c->ops->recv(c, b, N, t, mate);
  c->ops->send(c, a, N, t, mate);
  c->ops->send(c, a + N * esz, N, t, mate);
  if (r % 2 == 0) c->ops->recv(c, b, N, t, mate);
  c->ops->recv(c, b + N * esz, N, t, mate);
  c->ops->group_end(c);
  CHECK_ALL("crossed pairs in a group", b, 2 * N, t, off + 10 * mate + i);

  // Outside a group calls block: even ranks send then receive, odd ranks the reverse.
  for (int64_t i = 0; i < N; i++) comm_payload_set(a, i, t, off + 10 * r + i), comm_payload_set(b, i, t, -1);
  if (r % 2 == 0) {
    c->ops->send(c, a, N, t, mate);
    c->ops->recv(c, b, N, t, mate);
  } else {
    c->ops->recv(c, b, N, t, mate);
    c->ops->send(c, a, N, t, mate);
  }
  CHECK_ALL("blocking send/recv", b, N, t, off + 10 * mate + i);

  free(a);
  free(b);
}

// bf16 sums accumulate in float and round to nearest even: 256 + 3 = 259 lies halfway between
// the bf16 neighbours 258 and 260 and must become 260 (truncation would give 258), whatever
// order the reduction tree adds the zeros in.
static void test_bf16_rounding(comm *c) {
  uint16_t v[2] = {k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 3.0f : 0.0f),
                   k_f32_to_bf16(c->rank == 0 ? 256.0f : c->rank == 1 ? 1.0f : 0.0f)};
  c->ops->all_reduce(c, v, 2, COMM_BF16, COMM_SUM);
  EXPECT(k_bf16_to_f32(v[0]) == 260.0f, "bf16 256 + 3 = %g, want 260 (round to nearest even)", k_bf16_to_f32(v[0]));
  EXPECT(k_bf16_to_f32(v[1]) == 256.0f, "bf16 256 + 1 = %g, want 256 (tie to even)", k_bf16_to_f32(v[1]));
}

// Transfers that overlap compute (xfer_*) around the ring: every rank posts its receives
// before its sends, forward (from rank - 1) and backward (from rank + 1), and waits for them
// in the opposite order.
static void test_xfer(comm *c, int chunked) {
  const int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const comm_dtype t = COMM_F32;
  float out_f[5], out_b[5], in_f[5], in_b[5];
  for (int i = 0; i < 5; i++) out_f[i] = (float)(10 * r + i), out_b[i] = (float)(-10 * r - i), in_f[i] = in_b[i] = 0;
  c->ops->xfer_open(c);
  int rf = c->ops->xfer_start(c, in_f, 5, t, prev, 0, NULL, 0);
  int rb = c->ops->xfer_start(c, in_b, 5, t, next, 0, NULL, 0);
  int mark = c->ops->xfer_mark(c);
  int sf = c->ops->xfer_start(c, out_f, 5, t, next, 1, &mark, 1);
  int sb = c->ops->xfer_start(c, out_b, 5, t, prev, 1, &mark, 1);
  c->ops->xfer_wait(c, sb);
  c->ops->xfer_wait(c, sf);
  c->ops->xfer_wait(c, rb);
  c->ops->xfer_wait(c, rf);
  CHECK_ALL("xfer forward", in_f, 5, t, 10 * prev + i);
  CHECK_ALL("xfer backward", in_b, 5, t, -10 * next - i);
  c->ops->xfer_reset(c);
}

static void test_comm_all(comm *c, int chunked) {
  EXPECT(c->size == 4, "run under mpirun -np 4 (size %d)", c->size);
  static const comm_dtype types[] = {COMM_F32, COMM_BF16, COMM_F64, COMM_I32, COMM_I64};
  for (size_t k = 0; k < sizeof types / sizeof *types; k++) test_dtype(c, types[k], chunked);
  test_bf16_rounding(c);
  test_xfer(c, chunked);
  // Started forms run at the wait, not before (so the CPU tests catch a result read early);
  // a drain with nothing started does nothing.
  int32_t v[8];
  for (int i = 0; i < 8; i++) v[i] = c->rank + i;
  c->ops->all_reduce_start(c, v, 2, COMM_I32, COMM_SUM);
  EXPECT(v[0] == c->rank && v[1] == c->rank + 1, "all_reduce_start ran before its wait: %d %d", v[0], v[1]);
  c->ops->wait(c);
  c->ops->drain(c);
  EXPECT(v[0] == c->size * (c->size - 1) / 2 && v[1] == v[0] + c->size, "all_reduce_start: %d %d", v[0], v[1]);
  int32_t ga[9] = {-1, -1, -1, -1, -1, -1, -1, -1, -1}, rs = -1;
  const int64_t at[2] = {0, 4}, len[2] = {1, 1};  // two regions of one element per rank; ga[8] in neither
  ga[c->rank] = 7 * c->rank;
  ga[4 + c->rank] = 100 + c->rank;
  c->ops->all_gather_regions_start(c, ga, at, len, 2, COMM_I32);
  c->ops->reduce_scatter_start(c, v + 4, &rs, 1, COMM_I32, COMM_SUM);
  c->ops->wait(c);
  EXPECT(ga[0] == 0 && ga[3] == 21 && ga[4] == 100 && ga[7] == 103 && ga[8] == -1,
         "all_gather_regions_start: %d %d %d %d %d", ga[0], ga[3], ga[4], ga[7], ga[8]);
  EXPECT(rs == c->size * (c->size - 1) / 2 + c->size * (4 + c->rank), "reduce_scatter_start: %d", rs);
  // Empty transfers are legal and must not hang.
  float dummy = 0;
  c->ops->all_reduce(c, &dummy, 0, COMM_F32, COMM_SUM);
  c->ops->group_start(c);
  c->ops->send(c, &dummy, 0, COMM_F32, (c->rank + 1) % c->size);
  c->ops->recv(c, &dummy, 0, COMM_F32, (c->rank + c->size - 1) % c->size);
  c->ops->group_end(c);
  c->ops->barrier(c);
}

// Group sums of world ranks per layout, worked out by hand from
// world = tp_rank + tp * (dp_rank + dp * pp_rank): {tp_c, dp_c, pp_c} sums for world rank 0..3.
typedef struct layout {
  int tp, dp, pp;
  int sum[4][3];
} layout;

static const layout layouts[] = {
    // tp groups {0,1},{2,3}; dp groups {0,2},{1,3}; pp singletons
    {2, 2, 1, {{1, 2, 0}, {1, 4, 1}, {5, 2, 2}, {5, 4, 3}}},
    // tp groups {0,1},{2,3}; dp singletons; pp groups {0,2},{1,3}
    {2, 1, 2, {{1, 0, 2}, {1, 1, 4}, {5, 2, 2}, {5, 3, 4}}},
    // tp singletons; dp groups {0,1},{2,3}; pp groups {0,2},{1,3}
    {1, 2, 2, {{0, 1, 2}, {1, 1, 4}, {2, 5, 2}, {3, 5, 4}}},
    // one pipeline of 4
    {1, 1, 4, {{0, 0, 6}, {1, 1, 6}, {2, 2, 6}, {3, 3, 6}}},
    // one TP group of 4
    {4, 1, 1, {{6, 0, 0}, {6, 1, 1}, {6, 2, 2}, {6, 3, 3}}},
};

static void test_grid(void) {
  for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
    const layout *L = &layouts[k];
    grid g;
    comm_factory f = comm_mpi_factory(NULL);
    grid_init(&g, L->tp, L->dp, L->pp, &f);
    int w = g.world_rank;
    EXPECT(g.world_size == 4 && g.tp == L->tp && g.dp == L->dp && g.pp == L->pp, "grid %d/%d/%d: sizes", L->tp, L->dp, L->pp);
    EXPECT(g.tp_rank == w % L->tp && g.dp_rank == (w / L->tp) % L->dp && g.pp_rank == w / (L->tp * L->dp),
           "grid %d/%d/%d rank %d: coordinates (%d, %d, %d)", L->tp, L->dp, L->pp, w, g.tp_rank, g.dp_rank, g.pp_rank);
    EXPECT(grid_rank_of(&g, g.tp_rank, g.dp_rank, g.pp_rank) == w, "grid_rank_of does not invert the coordinates");
    EXPECT(g.tp_c->size == L->tp && g.dp_c->size == L->dp && g.pp_c->size == L->pp && g.world->size == 4,
           "grid %d/%d/%d: group sizes %d %d %d", L->tp, L->dp, L->pp, g.tp_c->size, g.dp_c->size, g.pp_c->size);
    EXPECT(g.tp_c->rank == g.tp_rank && g.dp_c->rank == g.dp_rank && g.pp_c->rank == g.pp_rank && g.world->rank == w,
           "grid %d/%d/%d rank %d: group ranks", L->tp, L->dp, L->pp, w);
    EXPECT(!strcmp(g.tp_c->name, "tp") && !strcmp(g.dp_c->name, "dp") && !strcmp(g.pp_c->name, "pp") &&
               !strcmp(g.world->name, "world"), "group names");
    comm *cs[3] = {g.tp_c, g.dp_c, g.pp_c};
    for (int a = 0; a < 3; a++) {
      int64_t v = w;
      cs[a]->ops->all_reduce(cs[a], &v, 1, COMM_I64, COMM_SUM);
      EXPECT(v == L->sum[w][a], "grid %d/%d/%d rank %d: %s group sum of world ranks %lld, want %d", L->tp, L->dp, L->pp,
             w, cs[a]->name, (long long)v, L->sum[w][a]);
    }
    // Pipeline neighbours by group rank: pass the world rank to pp rank + 1.
    if (g.pp > 1) {
      int32_t out = w, in = -1;
      g.pp_c->ops->group_start(g.pp_c);
      g.pp_c->ops->send(g.pp_c, &out, 1, COMM_I32, (g.pp_rank + 1) % g.pp);
      g.pp_c->ops->recv(g.pp_c, &in, 1, COMM_I32, (g.pp_rank + g.pp - 1) % g.pp);
      g.pp_c->ops->group_end(g.pp_c);
      EXPECT(in == grid_rank_of(&g, g.tp_rank, g.dp_rank, (g.pp_rank + g.pp - 1) % g.pp),
             "grid %d/%d/%d rank %d: pp ring got %d", L->tp, L->dp, L->pp, w, in);
    }
    grid_free(&g);
    grid_free(&g);  // safe twice
    EXPECT(!g.world && !g.tp_c && !g.dp_c && !g.pp_c, "grid_free leaves communicators behind");
    comm_factory_free(&f);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  comm *c = comm_mpi_create(MPI_COMM_WORLD, "world", NULL);
  int cmp = MPI_IDENT;
  MPI_Comm_compare(c->mpi, MPI_COMM_WORLD, &cmp);
  EXPECT(cmp == MPI_CONGRUENT, "comm_mpi_create must duplicate the communicator (compare = %d)", cmp);
  test_comm_all(c, 0);
  comm_free(&c);
  comm_free(&c);  // safe twice
  comm_free(NULL);
  EXPECT(c == NULL, "comm_free leaves the pointer set");

  // Same checks with every call cut into pieces of 2 elements (5 = 2 + 2 + 1).
  comm_opts chunked = comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 2, NULL);
  c = comm_mpi_create(MPI_COMM_WORLD, "chunked", &chunked);
  test_comm_all(c, 1);
  comm_free(&c);

  EXPECT(comm_dtype_bytes(COMM_F32) == 4 && comm_dtype_bytes(COMM_BF16) == 2 && comm_dtype_bytes(COMM_F64) == 8 &&
             comm_dtype_bytes(COMM_I32) == 4 && comm_dtype_bytes(COMM_I64) == 8, "comm_dtype_bytes");

  test_grid();
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}
