// Tests of the token-shard reader and writer: round trips of both dtypes and of llm.c shards,
// globs over several shards, every error path (missing, truncated, wrong magic, too short),
// and the window order: deterministic per seed, a permutation per epoch, random access.
#define _XOPEN_SOURCE 700
#include "data/data.h"
#include "tests/unit/test_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static void path_in(char *out, size_t n_out, const char *name) {
  snprintf(out, n_out, "%s/%s", tmpdir, name);
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(1); }
  fclose(f);
}

static long file_bytes(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  return n;
}

// An llm.c GPT-2 shard, built by hand as llm.c's data_common.py writes it.
static void write_llmc(const char *path, const uint16_t *tokens, int32_t n, int32_t magic, int32_t version) {
  int32_t header[256] = {0};
  header[0] = magic;
  header[1] = version;
  header[2] = n;
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(1); }
  fwrite(header, 4, 256, f);
  fwrite(tokens, 2, (size_t)n, f);
  fclose(f);
}

static int32_t *seq_tokens(int64_t n, int32_t first) {
  int32_t *t = malloc((size_t)n * sizeof *t);
  for (int64_t i = 0; i < n; i++) t[i] = first + (int32_t)i;
  return t;
}

// A window that must read: a failure is a test failure with the reader's message.
static void get_window(data_loader *d, int64_t sample, int32_t *out) {
  char err[1024] = "";
  int rc = data_get_window(d, sample, out, err, sizeof err);
  EXPECT(rc == 0, "window %lld: %s", (long long)sample, err);
}

// Opens pattern expecting failure; returns whether the message holds every needle.
static int open_fails_with(const char *pattern, int seq_len, const char *needle1, const char *needle2) {
  data_loader d;
  char err[1024] = "";
  int rc = data_open(&d, pattern, seq_len, 1, err, sizeof err);
  int ok = rc == -1 && strstr(err, needle1) && (!needle2 || strstr(err, needle2));
  if (!ok) fprintf(stderr, "  pattern %s rc %d message: %s\n", pattern, rc, err);
  EXPECT(d.n_shards == 0 && d.shards == NULL && d.n_windows == 0, "failed open leaves a closed loader");
  data_close(&d);  // safe after a failed open
  return ok;
}

static void test_roundtrip_uint16(void) {
  char path[512], err[1024] = "";
  path_in(path, sizeof path, "u16.bin");
  int64_t n = 1000;
  int32_t *src = malloc(n * sizeof *src);
  for (int64_t i = 0; i < n; i++) src[i] = (int32_t)((i * 7919) % 65536);
  EXPECT(data_write_shard(path, src, n, err, sizeof err) == 0, "write: %s", err);
  EXPECT(file_bytes(path) == 64 + n * 2, "uint16 shard is 64 + 2n bytes, got %ld", file_bytes(path));
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  EXPECT(access(tmp, F_OK) != 0, "no .tmp left behind");

  data_loader d;
  int seq = 16;
  EXPECT(data_open(&d, path, seq, 42, err, sizeof err) == 0, "open: %s", err);
  EXPECT(d.n_shards == 1 && d.shards[0].token_bytes == 2 && d.shards[0].n_tokens == n, "shard fields");
  EXPECT(d.n_windows == (n - 1) / seq, "n_windows %lld", (long long)d.n_windows);
  int32_t mx = 0;
  for (int64_t i = 0; i < n; i++) mx = src[i] > mx ? src[i] : mx;
  EXPECT(d.max_token == mx, "max_token %d, expected %d", d.max_token, mx);
  int32_t out[17];
  int bad = 0;
  for (int64_t s = 0; s < d.n_windows; s++) {
    get_window(&d, s, out);
    int64_t start = d.window_start[d.perm[s]];
    bad += start % seq != 0 || memcmp(out, src + start, sizeof out) != 0;
  }
  EXPECT(bad == 0, "%d uint16 windows differ from the source tokens", bad);
  data_close(&d);
  data_close(&d);  // safe twice
  EXPECT(d.shards == NULL && d.perm == NULL, "closed loader is empty");
  free(src);
}

static void test_roundtrip_int32(void) {
  char path[512], err[1024] = "";
  path_in(path, sizeof path, "i32.bin");
  int64_t n = 333;
  int32_t *src = seq_tokens(n, 70000);  // ids past 65535 force int32
  EXPECT(data_write_shard(path, src, n, err, sizeof err) == 0, "write: %s", err);
  EXPECT(file_bytes(path) == 64 + n * 4, "int32 shard is 64 + 4n bytes, got %ld", file_bytes(path));
  data_loader d;
  EXPECT(data_open(&d, path, 10, 3, err, sizeof err) == 0, "open: %s", err);
  EXPECT(d.shards[0].token_bytes == 4, "token_bytes %d", d.shards[0].token_bytes);
  EXPECT(d.max_token == 70000 + n - 1, "max_token %d", d.max_token);
  EXPECT(d.n_windows == 33, "n_windows %lld", (long long)d.n_windows);
  int32_t out[11];
  int bad = 0;
  for (int64_t s = 0; s < d.n_windows; s++) {
    get_window(&d, s, out);
    int64_t start = out[0] - 70000;
    bad += start % 10 != 0 || memcmp(out, src + start, sizeof out) != 0;
  }
  EXPECT(bad == 0, "%d int32 windows differ from the source tokens", bad);
  data_close(&d);
  free(src);

  int32_t neg[3] = {1, -2, 3};
  path_in(path, sizeof path, "neg.bin");
  EXPECT(data_write_shard(path, neg, 3, err, sizeof err) == -1 && strstr(err, "-2"),
         "negative token refused: %s", err);
  char nodir[512];
  path_in(nodir, sizeof nodir, "no/such/dir/x.bin");
  EXPECT(data_write_shard(nodir, neg, 1, err, sizeof err) == -1 && strstr(err, "cannot create"),
         "unwritable path refused: %s", err);
}

static void test_llmc(void) {
  char path[512], err[1024] = "";
  path_in(path, sizeof path, "llmc.bin");
  int32_t n = 257;
  uint16_t src[257];
  for (int i = 0; i < n; i++) src[i] = (uint16_t)(50000 + i);  // GPT-2 range
  write_llmc(path, src, n, 20240520, 1);
  data_loader d;
  EXPECT(data_open(&d, path, 8, 7, err, sizeof err) == 0, "open llm.c: %s", err);
  EXPECT(d.shards[0].token_bytes == 2 && d.shards[0].n_tokens == n, "llm.c shard fields");
  EXPECT(d.n_windows == 32, "n_windows %lld", (long long)d.n_windows);
  EXPECT(d.max_token == 50256, "max_token %d", d.max_token);
  int32_t out[9];
  int bad = 0;
  for (int64_t s = 0; s < d.n_windows; s++) {
    get_window(&d, s, out);
    int64_t start = out[0] - 50000;
    for (int k = 0; k < 9; k++) bad += out[k] != src[start + k];
    bad += start % 8 != 0;
  }
  EXPECT(bad == 0, "%d llm.c tokens differ", bad);
  data_close(&d);

  path_in(path, sizeof path, "llmc_v2.bin");
  write_llmc(path, src, n, 20240520, 2);
  EXPECT(open_fails_with(path, 8, "version 2", "llmc_v2.bin"), "llm.c version 2 refused");
  path_in(path, sizeof path, "llama3.bin");
  write_llmc(path, src, n, 20240801, 7);
  EXPECT(open_fails_with(path, 8, "Llama-3", "20240520"), "llm.c Llama-3 shard named");
}

static void test_glob(void) {
  char dir[512], path[600], pattern[600], err[1024] = "";
  path_in(dir, sizeof dir, "multi");
  mkdir(dir, 0700);
  // Three shards written out of name order, one empty shard, one llm.c shard: sorted by name
  // they hold global positions 1.. in order, so each window's first token says where it is.
  int64_t sizes[5] = {50, 33, 0, 100, 41};
  const char *names[5] = {"s_000.bin", "s_001.bin", "s_002.bin", "s_003.bin", "s_004.bin"};
  int order[5] = {3, 0, 4, 2, 1};
  int64_t base[5], b = 1;
  for (int i = 0; i < 5; i++) { base[i] = b; b += sizes[i]; }
  for (int k = 0; k < 5; k++) {
    int i = order[k];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    int32_t *t = seq_tokens(sizes[i], (int32_t)base[i]);
    if (i == 4) {
      uint16_t t16[41];
      for (int j = 0; j < 41; j++) t16[j] = (uint16_t)t[j];
      write_llmc(path, t16, 41, 20240520, 1);
    } else {
      EXPECT(data_write_shard(path, t, sizes[i], err, sizeof err) == 0, "write: %s", err);
    }
    free(t);
  }
  snprintf(pattern, sizeof pattern, "%s/s_*.bin", dir);
  int seq = 8;
  data_loader d;
  EXPECT(data_open(&d, pattern, seq, 99, err, sizeof err) == 0, "open glob: %s", err);
  int64_t expect_w = 0;
  for (int i = 0; i < 5; i++) expect_w += sizes[i] > 0 ? (sizes[i] - 1) / seq : 0;
  EXPECT(d.n_shards == 5 && d.n_windows == expect_w, "shards %d windows %lld, expected 5 and %lld",
         d.n_shards, (long long)d.n_windows, (long long)expect_w);
  int sorted = 1;
  for (int i = 0; i < d.n_shards; i++) sorted &= strstr(d.shards[i].path, names[i]) != NULL;
  EXPECT(sorted, "shards opened in sorted name order");
  EXPECT(d.max_token == b - 1, "max_token %d, expected %lld", d.max_token, (long long)b - 1);
  int32_t out[9];
  int bad_content = 0, bad_align = 0, bad_cross = 0;
  char *seen = calloc((size_t)b, 1);
  for (int64_t s = 0; s < d.n_windows; s++) {
    get_window(&d, s, out);
    for (int k = 0; k < 9; k++) bad_content += out[k] != out[0] + k;
    int sh = 0;
    while (sh < 4 && out[0] >= base[sh + 1]) sh++;
    bad_align += (out[0] - base[sh]) % seq != 0;
    bad_cross += out[8] >= base[sh] + sizes[sh];  // last token still in the same shard
    seen[out[0]]++;
  }
  int n_seen = 0, dup = 0;
  for (int64_t i = 0; i < b; i++) { n_seen += seen[i] > 0; dup += seen[i] > 1; }
  EXPECT(bad_content == 0 && bad_align == 0 && bad_cross == 0,
         "glob windows: %d content, %d alignment, %d cross-shard errors", bad_content, bad_align, bad_cross);
  EXPECT(n_seen == expect_w && dup == 0, "every window once: %d distinct, %d repeated", n_seen, dup);
  free(seen);
  data_close(&d);
}

static void test_errors(void) {
  char path[512], pattern[600], err[1024] = "";
  int32_t *src = seq_tokens(100, 0);

  path_in(path, sizeof path, "nope.bin");
  EXPECT(open_fails_with(path, 8, "no data shard matches", "scripts/setup/get_corpus.sh"), "missing file");
  snprintf(pattern, sizeof pattern, "%s/*.nothing", tmpdir);
  EXPECT(open_fails_with(pattern, 8, "no data shard matches", "*.nothing"), "glob without match");

  path_in(path, sizeof path, "trunc.bin");
  data_write_shard(path, src, 100, err, sizeof err);
  EXPECT(truncate(path, 64 + 200 - 2) == 0, "truncate");
  EXPECT(open_fails_with(path, 8, "truncated", "trunc.bin"), "truncated shard");
  EXPECT(open_fails_with(path, 8, "header says 100 tokens (264 bytes), file has 262 bytes", NULL),
         "truncated shard counts");

  path_in(path, sizeof path, "long.bin");
  data_write_shard(path, src, 100, err, sizeof err);
  FILE *f = fopen(path, "ab");
  fputs("xx", f);
  fclose(f);
  EXPECT(open_fails_with(path, 8, "longer than its header", "long.bin"), "file longer than header");

  path_in(path, sizeof path, "text.bin");
  const char *text = "hello world, this is raw text and not a token shard at all.......\n";
  write_bytes(path, text, strlen(text));
  EXPECT(open_fails_with(path, 8, "68 65 6c 6c", "20240520"), "wrong magic in hex");
  EXPECT(open_fails_with(path, 8, "text.bin", "TRNTOK"), "wrong magic names file and format");

  path_in(path, sizeof path, "tiny.bin");
  write_bytes(path, "TR", 2);
  EXPECT(open_fails_with(path, 8, "too short", "tiny.bin"), "2-byte file");
  path_in(path, sizeof path, "cut_header.bin");
  write_bytes(path, "TRNTOK\0\0\1\0\0\0", 12);
  EXPECT(open_fails_with(path, 8, "too short", "64-byte header"), "cut header");
  path_in(path, sizeof path, "empty.bin");
  write_bytes(path, "", 0);
  EXPECT(open_fails_with(path, 8, "too short", "empty.bin"), "empty file");

  path_in(path, sizeof path, "few.bin");
  data_write_shard(path, src, 10, err, sizeof err);
  EXPECT(open_fails_with(path, 16, "too short", "seq_len + 1 = 17"), "fewer tokens than a window");
  data_loader d;
  EXPECT(data_open(&d, path, 9, 1, err, sizeof err) == 0 && d.n_windows == 1,
         "exactly seq_len + 1 tokens is one window: %s", err);
  data_close(&d);

  path_in(path, sizeof path, "v2.bin");
  data_write_shard(path, src, 100, err, sizeof err);
  f = fopen(path, "r+b");
  fseek(f, 8, SEEK_SET);
  fputc(2, f);
  fclose(f);
  EXPECT(open_fails_with(path, 8, "version 2", "v2.bin"), "unknown version");

  path_in(path, sizeof path, "dtype.bin");
  data_write_shard(path, src, 100, err, sizeof err);
  f = fopen(path, "r+b");
  fseek(f, 12, SEEK_SET);
  fputc(3, f);
  fclose(f);
  EXPECT(open_fails_with(path, 8, "3 bytes", "dtype.bin"), "bad token width");

  path_in(path, sizeof path, "ok.bin");
  data_write_shard(path, src, 100, err, sizeof err);
  EXPECT(open_fails_with(path, 0, "seq_len is 0", NULL), "seq_len 0 refused");
  EXPECT(open_fails_with("", 8, "data.train", NULL), "empty pattern refused");
  free(src);
}

// Every window of samples [epoch*n, (epoch+1)*n) once; its first token (a position) says which.
static int is_permutation(data_loader *d, int64_t epoch, int32_t first_token) {
  int64_t n = d->n_windows;
  char *seen = calloc((size_t)n, 1);
  int32_t *out = malloc((size_t)(d->seq_len + 1) * sizeof *out);
  int ok = 1;
  for (int64_t j = 0; j < n; j++) {
    get_window(d, epoch * n + j, out);
    int64_t w = (out[0] - first_token) / d->seq_len;
    if (w < 0 || w >= n || seen[w]++) ok = 0;
  }
  free(seen);
  free(out);
  return ok;
}

static void test_order(void) {
  char path[512], err[1024] = "";
  path_in(path, sizeof path, "order.bin");
  int seq = 4;
  int64_t n_tok = 4 * 500 + 1;  // 500 windows
  int32_t *src = seq_tokens(n_tok, 0);
  data_write_shard(path, src, n_tok, err, sizeof err);
  free(src);
  data_loader a, b, c;
  EXPECT(data_open(&a, path, seq, 1234, err, sizeof err) == 0, "open a: %s", err);
  EXPECT(data_open(&b, path, seq, 1234, err, sizeof err) == 0, "open b: %s", err);
  EXPECT(data_open(&c, path, seq, 1235, err, sizeof err) == 0, "open c: %s", err);
  int64_t n = a.n_windows, n_samples = 3 * n;
  EXPECT(n == 500, "n_windows %lld", (long long)n);
  int64_t *first_a = malloc(n_samples * sizeof *first_a);
  int32_t wa[5], wb[5], wc[5];
  int same_ab = 1, same_ac = 0, same_epochs = 0;
  for (int64_t s = 0; s < n_samples; s++) {
    get_window(&a, s, wa);
    get_window(&b, s, wb);
    get_window(&c, s, wc);
    same_ab &= memcmp(wa, wb, sizeof wa) == 0;
    same_ac += memcmp(wa, wc, sizeof wa) == 0;
    first_a[s] = wa[0];
    if (s >= n) same_epochs += first_a[s] == first_a[s - n];
  }
  EXPECT(same_ab, "same seed, same windows");
  EXPECT(same_ac < n_samples / 10, "another seed, another order: %d of %lld samples agree",
         same_ac, (long long)n_samples);
  EXPECT(same_epochs < n / 5, "each epoch reshuffled: %d of %lld positions repeat", same_epochs,
         (long long)(2 * n));
  for (int64_t e = 0; e < 3; e++) {
    EXPECT(is_permutation(&a, e, 0), "epoch %lld of seed 1234 is a permutation", (long long)e);
    EXPECT(is_permutation(&c, e, 0), "epoch %lld of seed 1235 is a permutation", (long long)e);
  }
  EXPECT(is_permutation(&a, 1000000, 0), "a far epoch is a permutation too");

  // Random access: b answers the same samples in a scrambled order (jumping between epochs)
  // and must agree with a's sequential answers.
  int bad = 0;
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 2000; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    int64_t s = (int64_t)(x % (uint64_t)n_samples);
    get_window(&b, s, wb);
    bad += wb[0] != first_a[s];
  }
  for (int64_t s = n_samples - 1; s >= 0; s--) {
    get_window(&b, s, wb);
    bad += wb[0] != first_a[s];
  }
  EXPECT(bad == 0, "%d random-access samples differ from the sequential ones", bad);

  // Pinned order: resume and cross-version runs rely on this exact sequence (docs/data.md).
  // If this fails the window order changed, and a resumed run would see other data.
  int64_t pinned[8] = {0};
  for (int s = 0; s < 8; s++) {
    get_window(&a, s, wa);
    pinned[s] = wa[0] / seq;
  }
  printf("seed 1234 epoch 0 first windows: %lld %lld %lld %lld %lld %lld %lld %lld\n",
         (long long)pinned[0], (long long)pinned[1], (long long)pinned[2], (long long)pinned[3],
         (long long)pinned[4], (long long)pinned[5], (long long)pinned[6], (long long)pinned[7]);
  const int64_t expect_pinned[8] = {165, 90, 118, 279, 494, 408, 248, 38};
  EXPECT(memcmp(pinned, expect_pinned, sizeof pinned) == 0, "window order of seed 1234 changed");
  free(first_a);
  data_close(&a);
  data_close(&b);
  data_close(&c);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(p);
}

// A shard written by data_write_shard with an old modification time, so that a rewrite within
// the same clock tick still changes it.
static void write_old_shard(const char *path, const int32_t *src, int64_t n) {
  char err[1024];
  EXPECT(data_write_shard(path, src, n, err, sizeof err) == 0, "write: %s", err);
  struct timespec old[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  EXPECT(utimensat(AT_FDCWD, path, old, 0) == 0, "set mtime");
}

// A shard changed under an open loader (truncated, or rewritten in place with the same size) is
// reported by the next window read, naming the shard: never SIGBUS, never other tokens.
static void test_changed_under_reader(void) {
  char path[512], err[1024];
  path_in(path, sizeof path, "changing.bin");
  int32_t *src = seq_tokens(1000, 0);
  int32_t out[11];
  for (int rewrite = 0; rewrite < 2; rewrite++) {
    write_old_shard(path, src, 1000);
    data_loader d;
    EXPECT(data_open(&d, path, 10, 5, err, sizeof err) == 0, "open: %s", err);
    get_window(&d, 0, out);
    if (rewrite) {  // the same size, one byte different (as `cp other.bin shard` leaves it)
      FILE *f = fopen(path, "r+b");
      EXPECT(f && fseek(f, 100, SEEK_SET) == 0 && fputc(0x7f, f) != EOF && fclose(f) == 0, "overwrite in place");
    } else {
      EXPECT(truncate(path, 200) == 0, "truncate");
    }
    int rc = data_get_window(&d, 1, out, err, sizeof err);
    EXPECT(rc == -1 && strstr(err, path) && strstr(err, "changed while the run reads it"), "%s: %s",
           rewrite ? "rewritten" : "truncated", err);
    data_close(&d);
  }
  free(src);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/test_data_XXXXXX", base && base[0] ? base : "/tmp");
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
  test_roundtrip_uint16();
  test_roundtrip_int32();
  test_llmc();
  test_glob();
  test_errors();
  test_order();
  test_changed_under_reader();
  nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return test_summary();
}
