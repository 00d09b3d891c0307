// Checkpoint round trip under 2 ranks: save under one split, load under another and compare
// exactly; metadata; rotation (keep); newest-complete selection skipping junk and temporaries;
// the clean errors (wrong shape, missing tensor, missing or non-HDF5 file, wrong version), and that a
// version-1 file still loads. The asynchronous save writes the same checkpoint, and its failures
// end like the synchronous save's.
#include "model/format/ckpt.h"
#include "tests/unit/test_util.h"

#include <ftw.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define D0 4
#define D1 6
#define D2 8

static int rank, n_ranks;
static char root[256];  // per-run scratch directory, removed at the end

// Every element distinct and exact in fp32, so a misplaced block cannot compare equal.
static float a_value(int i, int j, int k) { return (float)(i * 100 + j * 10 + k) + 0.25f; }
static float b_value(int i) { return -1.5f * (float)i - 3.0f; }
static float c_value(int i, int j) { return 1000.0f + (float)(i * 5 + j); }

static int exists(const char *path) { return access(path, F_OK) == 0; }

static void write_bytes(const char *path, const char *bytes) {
  FILE *f = fopen(path, "wb");
  if (!f) return;
  fputs(bytes, f);
  fclose(f);
}

// Rank 0's string on every rank, to check that a result is the same everywhere.
static int same_everywhere(const char *s) {
  char r0[2048];
  snprintf(r0, sizeof r0, "%s", s);
  MPI_Bcast(r0, sizeof r0, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = strcmp(r0, s) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same;
}

static void tensor(ckpt_tensor *t, const char *name, int ndim, const int64_t *full, const int64_t *start,
                   const int64_t *count, float *data, int write) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) {
    t->full[d] = full[d];
    t->start[d] = start[d];
    t->count[d] = count[d];
  }
  t->data = data;
  t->write = write;
}

// The save-side layout: A split on dim 1 across the ranks; B replicated, only rank 0 writes;
// C (2, 5) saved as two blocks per rank (a flat shard spanning rows), the second empty on rank 1.
typedef struct saved {
  float a[D0 * D1 * D2], b[D2], c0[5], c1[3];
  ckpt_tensor t[4];
} saved;

static void make_saved(saved *s, float bump) {
  int64_t fa[3] = {D0, D1, D2}, sa[3] = {0, rank * (D1 / 2), 0}, ca[3] = {D0, D1 / 2, D2};
  for (int i = 0; i < D0; i++)
    for (int j = 0; j < D1 / 2; j++)
      for (int k = 0; k < D2; k++) s->a[(i * (D1 / 2) + j) * D2 + k] = a_value(i, sa[1] + j, k) + bump;
  tensor(&s->t[0], "model/layers.wq", 3, fa, sa, ca, s->a, 1);
  int64_t fb[1] = {D2}, sb[1] = {0}, cb[1] = {D2};
  // Rank 1 holds different numbers: the file must hold rank 0's, proving write=0 writes nothing.
  for (int i = 0; i < D2; i++) s->b[i] = rank == 0 ? b_value(i) + bump : 777.0f;
  tensor(&s->t[1], "optim/exp_avg/final_norm", 1, fb, sb, cb, s->b, rank == 0);
  int64_t fc[2] = {2, 5};
  if (rank == 0) {  // flat elements 0..7: row 0, then row 1 columns 0..2
    for (int j = 0; j < 5; j++) s->c0[j] = c_value(0, j) + bump;
    for (int j = 0; j < 3; j++) s->c1[j] = c_value(1, j) + bump;
    tensor(&s->t[2], "optim/flat", 2, fc, (int64_t[]){0, 0}, (int64_t[]){1, 5}, s->c0, 1);
    tensor(&s->t[3], "optim/flat", 2, fc, (int64_t[]){1, 0}, (int64_t[]){1, 3}, s->c1, 1);
  } else {  // flat elements 8..9: row 1 columns 3..4
    for (int j = 0; j < 2; j++) s->c0[j] = c_value(1, 3 + j) + bump;
    tensor(&s->t[2], "optim/flat", 2, fc, (int64_t[]){1, 3}, (int64_t[]){1, 2}, s->c0, 1);
    tensor(&s->t[3], "optim/flat", 2, fc, (int64_t[]){0, 0}, (int64_t[]){0, 0}, NULL, 0);
  }
}

static const char *yaml_text = "model:\n  dim: 64   # \"quoted\" and 'single' \xc3\xa9\ntrain:\n  lr: 3.0e-4\n";

static int save_step(const char *dir, int64_t step, int keep, float bump, char *err, size_t n_err) {
  saved s;
  make_saved(&s, bump);
  ckpt_meta m = {.step = step, .samples_seen = 1000 * step + 7, .seed = 0xDEADBEEFCAFEF00Dull,
                 .config_yaml = yaml_text};
  return ckpt_save(dir, MPI_COMM_WORLD, s.t, 4, &m, keep, NULL, err, n_err);
}

static void check_load(const char *path, int64_t step, float bump);

// save_step through ckpt_async: the caller polls while the background write runs.
static int save_step_async(const char *dir, int64_t step, int keep, float bump, const ckpt_faults *faults, char *err,
                           size_t n_err) {
  saved s;
  make_saved(&s, bump);
  ckpt_meta m = {.step = step, .samples_seen = 1000 * step + 7, .seed = 0xDEADBEEFCAFEF00Dull,
                 .config_yaml = yaml_text};
  ckpt_async a = {0};
  int rc = ckpt_async_start(&a, dir, MPI_COMM_WORLD, s.t, 4, &m, keep, faults, err, n_err);
  EXPECT(rc != 0 || ckpt_async_pending(&a), "a started write is in flight");
  while (rc == 0 && !ckpt_async_ready(&a)) usleep(1000);
  if (rc == 0) rc = ckpt_async_finish(&a, err, n_err);
  EXPECT(!ckpt_async_pending(&a), "nothing in flight after ckpt_async_finish");
  return rc;
}

// The asynchronous save: the checkpoint ckpt_save writes; a failed write on one rank
// (an injected I/O error) and a non-finite value each end with the same message on every rank,
// no temporary and no checkpoint of that step, the previous one intact.
static void test_async(void) {
  char sync_dir[512], async_dir[512], a[1200], b[1200], err[2048];
  snprintf(sync_dir, sizeof sync_dir, "%s/sync", root);
  snprintf(async_dir, sizeof async_dir, "%s/async", root);
  EXPECT(save_step(sync_dir, 70, 0, 0.25f, err, sizeof err) == 0, "sync save 70: %s", err);
  EXPECT(save_step_async(async_dir, 70, 0, 0.25f, NULL, err, sizeof err) == 0, "async save 70: %s", err);
  snprintf(a, sizeof a, "%s/ckpt_00000070.h5", sync_dir);
  snprintf(b, sizeof b, "%s/ckpt_00000070.h5", async_dir);
  // Both hold every tensor, checksum and attribute of the step (the files' bytes differ only in
  // the times HDF5 stamps its objects with; tests/e2e/test_ckpt_async.sh compares the two whole).
  check_load(a, 70, 0.25f);
  check_load(b, 70, 0.25f);

  ckpt_faults fail = {-1, 0, -1, 0}, nan = {-1, -1, 1, 0};
  const char *want_fail[] = {"writing tensor 'model/layers.wq'", "injected write error", ".ckpt_00000080.h5.tmp"};
  const char *want_nan[] = {"step 80 not saved", "'optim/exp_avg/final_norm' holds 1 non-finite value"};
  for (int k = 0; k < 2; k++) {
    const char *const *want = k == 0 ? want_fail : want_nan;
    err[0] = '\0';
    int rc = save_step_async(async_dir, 80, 0, 0.5f, k == 0 ? &fail : &nan, err, sizeof err);
    int named = 1;
    for (int i = 0; i < (k == 0 ? 3 : 2); i++) named = named && strstr(err, want[i]);
    EXPECT(rc == -1 && named, "async save with %s gave %d: %s", k == 0 ? "a write error" : "a NaN", rc, err);
    EXPECT(same_everywhere(err), "ranks disagree on the async save error: '%s'", err);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(a, sizeof a, "%s/.ckpt_00000080.h5.tmp", async_dir);
    snprintf(b, sizeof b, "%s/ckpt_00000080.h5", async_dir);
    EXPECT(!exists(a) && !exists(b), "a failed async save left %s", exists(a) ? a : b);
  }
  snprintf(b, sizeof b, "%s/ckpt_00000070.h5", async_dir);
  check_load(b, 70, 0.25f);
}

// Loads A split on dim 0 (rows), B and C whole on each rank, verifying their checksums; compares
// exactly with `bump`.
static void check_load(const char *path, int64_t step, float bump) {
  float a[D0 / 2 * D1 * D2], b[D2], c[10];
  memset(a, 0, sizeof a);
  ckpt_tensor t[3];
  int64_t fa[3] = {D0, D1, D2}, sa[3] = {rank * (D0 / 2), 0, 0}, ca[3] = {D0 / 2, D1, D2};
  // write = 1 marks the blocks whose checksums are verified: each tensor covered once, in another
  // split than the save's, so the crc32c written from dim-1 blocks is checked from dim-0 blocks.
  tensor(&t[0], "model/layers.wq", 3, fa, sa, ca, a, 1);
  tensor(&t[1], "optim/exp_avg/final_norm", 1, (int64_t[]){D2}, (int64_t[]){0}, (int64_t[]){D2}, b, rank == 0);
  tensor(&t[2], "optim/flat", 2, (int64_t[]){2, 5}, (int64_t[]){0, 0}, (int64_t[]){2, 5}, c, rank == 0);
  ckpt_meta m;
  char err[2048];
  int rc = ckpt_load(path, MPI_COMM_WORLD, t, 3, &m, err, sizeof err);
  EXPECT(rc == 0, "load %s: %s", path, err);
  if (rc != 0) return;
  int bad_a = 0, bad_b = 0, bad_c = 0;
  for (int i = 0; i < D0 / 2; i++)
    for (int j = 0; j < D1; j++)
      for (int k = 0; k < D2; k++) bad_a += a[(i * D1 + j) * D2 + k] != a_value((int)sa[0] + i, j, k) + bump;
  for (int i = 0; i < D2; i++) bad_b += b[i] != b_value(i) + bump;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 5; j++) bad_c += c[i * 5 + j] != c_value(i, j) + bump;
  EXPECT(bad_a == 0, "rank %d: %d elements of A differ after a dim-1 save and dim-0 load", rank, bad_a);
  EXPECT(bad_b == 0, "rank %d: %d elements of B differ (rank 1's write=0 data leaked in?)", rank, bad_b);
  EXPECT(bad_c == 0, "rank %d: %d elements of the two-block tensor differ", rank, bad_c);
  EXPECT(m.step == step, "step %lld", (long long)m.step);
  EXPECT(m.samples_seen == 1000 * step + 7, "samples_seen %lld", (long long)m.samples_seen);
  EXPECT(m.seed == 0xDEADBEEFCAFEF00Dull, "seed %llx", (unsigned long long)m.seed);
  EXPECT(m.config_yaml && strcmp(m.config_yaml, yaml_text) == 0, "config_yaml '%s'",
         m.config_yaml ? m.config_yaml : "(null)");
  free((void *)m.config_yaml);
}

// A load expected to fail (-1 or CKPT_DAMAGED): same failure and message on every rank, containing
// each of want[].
static void expect_load_fails(const char *path, ckpt_tensor *t, int n, const char *const *want, int n_want) {
  char err[2048] = "";
  ckpt_meta m = {.config_yaml = (const char *)1};
  int rc = ckpt_load(path, MPI_COMM_WORLD, t, n, &m, err, sizeof err);
  EXPECT(rc == -1 || rc == CKPT_DAMAGED, "load of %s should fail, gave %d", path, rc);
  EXPECT(m.config_yaml == NULL, "config_yaml must be NULL after a failed load");
  EXPECT(same_everywhere(err), "ranks disagree on the message: '%s'", err);
  for (int i = 0; i < n_want; i++) EXPECT(strstr(err, want[i]) != NULL, "message lacks '%s': %s", want[i], err);
}

// Rank 0 writes value into element 5 of model/layers.wq (the crc32c untouched); then every rank
// loads the file, which must fail as damaged with a message containing want.
static void expect_damaged(const char *path, float value, const char *want) {
  if (rank == 0) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), d = H5Dopen2(f, "model/layers.wq", H5P_DEFAULT);
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, (hsize_t[]){1}, NULL);
    H5Sselect_elements(fs, H5S_SELECT_SET, 1, (hsize_t[]){0, 0, 5});
    H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, &value);
    H5Sclose(ms), H5Sclose(fs), H5Dclose(d), H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  float a[D0 / 2 * D1 * D2];
  ckpt_tensor t;
  tensor(&t, "model/layers.wq", 3, (int64_t[]){D0, D1, D2}, (int64_t[]){rank * (D0 / 2), 0, 0},
         (int64_t[]){D0 / 2, D1, D2}, a, 1);
  char err[2048] = "";
  int rc = ckpt_load(path, MPI_COMM_WORLD, &t, 1, NULL, err, sizeof err);
  EXPECT(rc == CKPT_DAMAGED && strstr(err, want), "damaged load gave %d: %s", rc, err);
  EXPECT(same_everywhere(err), "ranks disagree on the damage: '%s'", err);
}

// Serial HDF5 file with a chosen format_version and optional complete flag (rank 0 only).
static void write_fake(const char *path, int version, int with_complete) {
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t sp = H5Screate(H5S_SCALAR), ty = H5Tcopy(H5T_C_S1);
  H5Tset_size(ty, strlen("trainer-checkpoint") + 1);
  hid_t a = H5Acreate2(f, "format", ty, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, ty, "trainer-checkpoint");
  H5Aclose(a);
  a = H5Acreate2(f, "format_version", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT, &version);
  H5Aclose(a);
  if (with_complete) {
    int one = 1;
    a = H5Acreate2(f, "complete", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &one);
    H5Aclose(a);
  }
  H5Tclose(ty);
  H5Sclose(sp);
  H5Fclose(f);
}

// Turns a checkpoint into the version-1 layout: format_version 1 and a uint64 rng_counter.
static void make_version_1(const char *path) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), sp = H5Screate(H5S_SCALAR);
  int one = 1;
  uint64_t counter = 0;
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT, &one);
  H5Aclose(a);
  a = H5Acreate2(f, "rng_counter", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_UINT64, &counter);
  H5Aclose(a);
  H5Sclose(sp);
  H5Fclose(f);
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
  if (n_ranks != 2) {
    if (rank == 0) fprintf(stderr, "test_ckpt needs exactly 2 ranks (mpirun -np 2), got %d\n", n_ranks);
    MPI_Finalize();
    return 1;
  }
  if (rank == 0) {
    snprintf(root, sizeof root, "%s/test_ckpt_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) root[0] = '\0';
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!root[0]) {
    if (rank == 0) fprintf(stderr, "cannot create a scratch directory under /tmp\n");
    MPI_Finalize();
    return 1;
  }
  char dir[512], path[1200], err[2048];
  snprintf(dir, sizeof dir, "%s/run/ckpts", root);  // nested: ckpt_save must create both levels

  // Round trip under another split, and rotation with keep=2.
  int rc10 = save_step(dir, 10, 2, 0.0f, err, sizeof err);
  EXPECT(rc10 == 0, "save 10: %s", err);
  snprintf(path, sizeof path, "%s/ckpt_00000010.h5", dir);
  check_load(path, 10, 0.0f);
  EXPECT(save_step(dir, 20, 2, 0.0f, err, sizeof err) == 0, "save 20: %s", err);
  EXPECT(save_step(dir, 30, 2, 0.0f, err, sizeof err) == 0, "save 30: %s", err);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 rotates after the others return
  snprintf(path, sizeof path, "%s/ckpt_00000010.h5", dir);
  EXPECT(!exists(path), "keep=2 should have removed %s", path);
  snprintf(path, sizeof path, "%s/ckpt_00000020.h5", dir);
  EXPECT(exists(path), "keep=2 should keep %s", path);
  snprintf(path, sizeof path, "%s/.ckpt_00000030.h5.tmp", dir);
  EXPECT(!exists(path), "temporary %s left behind", path);
  snprintf(path, sizeof path, "%s/ckpt_00000030.h5", dir);
  check_load(path, 30, 0.0f);

  // A version-1 checkpoint (with the rng_counter attribute that version 2 dropped) still loads.
  if (rank == 0) make_version_1(path);
  MPI_Barrier(MPI_COMM_WORLD);
  check_load(path, 30, 0.0f);

  // Meta only (how the trainer reads the config before building the model).
  ckpt_meta m;
  EXPECT(ckpt_load(path, MPI_COMM_WORLD, NULL, 0, &m, err, sizeof err) == 0, "meta-only load: %s", err);
  EXPECT(m.step == 30 && m.config_yaml && !strcmp(m.config_yaml, yaml_text), "meta-only load gave step %lld",
         (long long)m.step);
  free((void *)m.config_yaml);

  // find_latest: skips junk named like a checkpoint, an incomplete file and temporaries.
  char junk[1024], incomplete[1024], tmp1[1024], tmp2[1024], v2[1024];
  snprintf(junk, sizeof junk, "%s/ckpt_99999999.h5", dir);
  snprintf(incomplete, sizeof incomplete, "%s/ckpt_00000050.h5", dir);
  snprintf(tmp1, sizeof tmp1, "%s/.ckpt_00000040.h5.tmp", dir);
  snprintf(tmp2, sizeof tmp2, "%s/ckpt_00000045.h5.tmp", dir);
  snprintf(v2, sizeof v2, "%s/v2.h5", root);
  if (rank == 0) {
    write_bytes(junk, "this is not an HDF5 file, just junk bytes\n");
    write_fake(incomplete, 1, 0);
    write_fake(tmp1, 1, 1);
    write_fake(tmp2, 1, 1);
    write_fake(v2, CKPT_FORMAT_VERSION + 1, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  char latest[1024] = "";
  int fl = ckpt_find_latest(dir, INT64_MAX, latest, sizeof latest, NULL);  // every rank at once
  snprintf(path, sizeof path, "%s/ckpt_00000030.h5", dir);
  EXPECT(fl == 0 && strcmp(latest, path) == 0, "find_latest gave %d '%s', expected %s", fl, latest, path);
  snprintf(path, sizeof path, "%s/none", root);
  EXPECT(ckpt_find_latest(path, INT64_MAX, latest, sizeof latest, NULL) == 1, "missing dir should mean no checkpoint");
  snprintf(path, sizeof path, "%s/run", root);
  EXPECT(ckpt_find_latest(path, INT64_MAX, latest, sizeof latest, NULL) == 1, "dir without checkpoints should give 1");

  // Clean failures, same on every rank.
  float a[D0 * D1 * D2];
  ckpt_tensor t;
  snprintf(path, sizeof path, "%s/ckpt_00000030.h5", dir);
  tensor(&t, "model/layers.wq", 3, (int64_t[]){D0, 12, D2}, (int64_t[]){0, 0, 0}, (int64_t[]){D0, D1, D2}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"(4, 6, 8)", "(4, 12, 8)", "model/layers.wq", "config_yaml"}, 4);
  tensor(&t, "model/layers.wq", 2, (int64_t[]){D0, D1}, (int64_t[]){0, 0}, (int64_t[]){D0, D1}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"(4, 6, 8)", "(4, 6)"}, 2);
  tensor(&t, "model/nope", 1, (int64_t[]){4}, (int64_t[]){0}, (int64_t[]){4}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"has no tensor 'model/nope'", path}, 2);
  tensor(&t, "missing_group/layers.wq/deeper", 1, (int64_t[]){4}, (int64_t[]){0}, (int64_t[]){4}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"has no tensor 'missing_group/layers.wq/deeper'"}, 1);
  tensor(&t, "model/layers.wq/deeper", 1, (int64_t[]){4}, (int64_t[]){0}, (int64_t[]){4}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"has no tensor 'model/layers.wq/deeper'"}, 1);
  tensor(&t, "model", 1, (int64_t[]){4}, (int64_t[]){0}, (int64_t[]){4}, a, 0);
  expect_load_fails(path, &t, 1, (const char *[]){"not a tensor"}, 1);
  snprintf(path, sizeof path, "%s/ckpt_12345678.h5", dir);
  expect_load_fails(path, NULL, 0, (const char *[]){path, "No such file"}, 2);
  expect_load_fails(junk, NULL, 0, (const char *[]){junk, "not an HDF5 file"}, 2);
  expect_load_fails(incomplete, NULL, 0, (const char *[]){incomplete, "incomplete"}, 2);
  expect_load_fails(v2, NULL, 0, (const char *[]){"has format version 4, this trainer reads versions 1 to 3"}, 1);
  expect_load_fails(dir, NULL, 0, (const char *[]){"not a regular file"}, 1);

  // Saving into a path under a regular file fails cleanly on every rank.
  snprintf(path, sizeof path, "%s/junkdir/sub", junk);
  err[0] = '\0';
  int bad = save_step(path, 60, 2, 0.0f, err, sizeof err);
  EXPECT(bad == -1 && strstr(err, "cannot create checkpoint directory") && strstr(err, path),
         "save under a file gave %d: %s", bad, err);
  EXPECT(same_everywhere(err), "ranks disagree on the save error: '%s'", err);

  // Overwriting an existing checkpoint of the same step; keep=0 keeps everything and removes
  // stale temporaries left by crashed writes.
  if (rank == 0) remove(junk), remove(incomplete);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT(save_step(dir, 30, 0, 0.5f, err, sizeof err) == 0, "overwrite 30: %s", err);
  snprintf(path, sizeof path, "%s/ckpt_00000030.h5", dir);
  check_load(path, 30, 0.5f);
  EXPECT(save_step(dir, 40, 0, 1.0f, err, sizeof err) == 0, "save 40: %s", err);
  MPI_Barrier(MPI_COMM_WORLD);
  snprintf(path, sizeof path, "%s/ckpt_00000020.h5", dir);
  EXPECT(exists(path), "keep=0 should keep %s", path);
  EXPECT(!exists(tmp1), "stale temporary %s should be removed", tmp1);
  EXPECT(exists(tmp2), "%s does not match the temporary pattern and must stay", tmp2);
  fl = ckpt_find_latest(dir, INT64_MAX, latest, sizeof latest, NULL);
  snprintf(path, sizeof path, "%s/ckpt_00000040.h5", dir);
  EXPECT(fl == 0 && strcmp(latest, path) == 0, "find_latest gave %d '%s', expected %s", fl, latest, path);
  check_load(path, 40, 1.0f);
  fl = ckpt_find_latest(dir, 40, latest, sizeof latest, NULL);
  snprintf(path, sizeof path, "%s/ckpt_00000030.h5", dir);
  EXPECT(fl == 0 && strcmp(latest, path) == 0, "find_latest below 40 gave %d '%s', expected %s", fl, latest, path);

  // Damage is named, and reported as CKPT_DAMAGED on every rank: one element changed behind the
  // checksum's back, then a NaN.
  snprintf(path, sizeof path, "%s/ckpt_00000040.h5", dir);
  expect_damaged(path, 123.0f, "tensor 'model/layers.wq' fails its checksum");
  expect_damaged(path, NAN, "tensor 'model/layers.wq' holds NaN");

  test_async();

  // Every path above, failures included, must have closed what it opened.
  ssize_t n_open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  EXPECT(n_open == 0, "rank %d: %zd HDF5 files or objects still open", rank, n_open);

  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  int code = test_summary();
  MPI_Finalize();
  return code;
}
