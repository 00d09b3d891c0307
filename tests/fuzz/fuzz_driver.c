// A plain mutation fuzzer for the readers of untrusted input (config text and overrides, token
// shards, checkpoint metadata). Each target file defines the libFuzzer entry point
// LLVMFuzzerTestOneInput and a dictionary; this driver feeds it the seed corpus, then mutated
// copies (bit flips, interesting bytes and integers, insertions, deletions, splices, dictionary
// words) from a fixed seed, for a bounded number of inputs and seconds. The targets are built
// with AddressSanitizer and UBSan (tests/cmake/fuzz.cmake): a crash, a sanitizer report or a leak
// ends the run non-zero, and an input that runs longer than --timeout-ms is a hang. The input
// at fault is written to --crash-dir so `fuzz_X FILE` replays it.
//
//   fuzz_X --corpus DIR [--runs N] [--max-seconds S] [--seed N] [--timeout-ms T] [--max-len B]
//          [--crash-dir DIR]
//   fuzz_X FILE...   (replay: each file once)
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern const char *const fuzz_dict[];  // words the mutator inserts (a target's syntax)
extern const int fuzz_n_dict;

typedef struct fuzz_input {
  uint8_t *data;
  size_t n_bytes;
} fuzz_input;

// The input being run, for the hang and crash handlers.
static const uint8_t *fuzz_current;
static size_t fuzz_current_n;
static char fuzz_crash_path[4096];

static void fuzz_save_current(const char *why) {
  int fd = fuzz_crash_path[0] ? open(fuzz_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
  if (fd >= 0) {
    ssize_t n = write(fd, fuzz_current, fuzz_current_n);
    (void)n;
    close(fd);
  }
  char line[4300];
  int n = snprintf(line, sizeof line, "fuzz: %s; the input (%zu bytes) is in %s\n", why, fuzz_current_n,
                   fuzz_crash_path[0] ? fuzz_crash_path : "(no --crash-dir)");
  ssize_t w = write(2, line, (size_t)n);
  (void)w;
}

static void fuzz_on_alarm(int sig) {
  (void)sig;
  fuzz_save_current("an input ran past --timeout-ms (a hang)");
  _exit(3);
}

// Called by the sanitizers before they end the process.
void __sanitizer_set_death_callback(void (*callback)(void));
static void fuzz_on_death(void) { fuzz_save_current("the sanitizer reported an error"); }

static void fuzz_on_fatal_signal(int sig) {
  fuzz_save_current(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "SIGABRT");
  signal(sig, SIG_DFL);
  raise(sig);
}

// xorshift64*: the whole run is a function of --seed.
static uint64_t fuzz_rng;
static uint64_t fuzz_next(void) {
  fuzz_rng ^= fuzz_rng >> 12;
  fuzz_rng ^= fuzz_rng << 25;
  fuzz_rng ^= fuzz_rng >> 27;
  return fuzz_rng * 0x2545F4914F6CDD1Dull;
}
static size_t fuzz_below(size_t n) { return n ? (size_t)(fuzz_next() % n) : 0; }

static int fuzz_read_file(const char *path, fuzz_input *in) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  in->data = buf;
  in->n_bytes = n;
  return 0;
}

static int fuzz_cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Every regular file of dir, in name order (so the run does not depend on the directory's order).
static int fuzz_read_corpus(const char *dir, fuzz_input **out) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  char **names = NULL;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    names = realloc(names, (size_t)(n + 1) * sizeof *names);
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, fuzz_cmp_name);
  *out = calloc((size_t)n + 1, sizeof **out);
  int k = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (fuzz_read_file(path, &(*out)[k]) == 0) k++;
    free(names[i]);
  }
  free(names);
  return k;
}

// Replaces buf[at, at + n_old) by n_new bytes of src (src may be NULL: random bytes), within max.
static size_t fuzz_splice(uint8_t *buf, size_t n, size_t max, size_t at, size_t n_old, const uint8_t *src,
                          size_t n_new) {
  if (n - at < n_old) n_old = n - at;
  if (n - n_old + n_new > max) n_new = max - (n - n_old);
  memmove(buf + at + n_new, buf + at + n_old, n - at - n_old);
  for (size_t i = 0; i < n_new; i++) buf[at + i] = src ? src[i] : (uint8_t)fuzz_next();
  return n - n_old + n_new;
}

// One random edit of buf (n bytes, room for max); returns the new length.
static size_t fuzz_mutate_once(uint8_t *buf, size_t n, size_t max, const fuzz_input *corpus, int n_corpus) {
  static const int64_t interesting[] = {0, 1, -1, 2, 4, 64, 127, 128, 255, 256, 1024, 32767, 65535, 65536,
                                        INT32_MAX, INT32_MIN, (int64_t)UINT32_MAX, INT64_MAX, INT64_MIN,
                                        20240520, 20240801};
  size_t at = fuzz_below(n + 1);
  switch (fuzz_below(9)) {
    case 0:  // flip a bit
      if (n) buf[fuzz_below(n)] ^= (uint8_t)(1u << fuzz_below(8));
      return n;
    case 1:  // an interesting byte
      if (n) buf[fuzz_below(n)] = (uint8_t[]){0, 0xff, 0x7f, 0x80, '\n', ' ', ':', '"'}[fuzz_below(8)];
      return n;
    case 2: {  // an interesting integer, little-endian, 1 to 8 bytes
      int64_t v = interesting[fuzz_below(sizeof interesting / sizeof *interesting)];
      size_t w = (size_t[]){1, 2, 4, 8}[fuzz_below(4)];
      uint8_t le[8];
      for (size_t i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)v >> (8 * i));
      return fuzz_splice(buf, n, max, at, w, le, w);
    }
    case 3:  // insert random bytes
      return fuzz_splice(buf, n, max, at, 0, NULL, 1 + fuzz_below(8));
    case 4:  // delete a range
      return fuzz_splice(buf, n, max, at, 1 + fuzz_below(n / 4 + 1), NULL, 0);
    case 5: {  // duplicate a range of the input itself
      if (!n) return n;
      size_t from = fuzz_below(n), len = 1 + fuzz_below(n - from);
      uint8_t *copy = malloc(len);
      memcpy(copy, buf + from, len);
      n = fuzz_splice(buf, n, max, at, 0, copy, len);
      free(copy);
      return n;
    }
    case 6: {  // splice in a piece of another corpus input
      const fuzz_input *o = &corpus[fuzz_below((size_t)n_corpus)];
      if (!o->n_bytes) return n;
      size_t from = fuzz_below(o->n_bytes), len = 1 + fuzz_below(o->n_bytes - from);
      return fuzz_splice(buf, n, max, at, fuzz_below(len + 1), o->data + from, len);
    }
    case 7:  // truncate
      return at;
    default: {  // a dictionary word, inserted or overwriting
      const char *w = fuzz_dict[fuzz_below((size_t)fuzz_n_dict)];
      return fuzz_splice(buf, n, max, at, fuzz_below(2) ? strlen(w) : 0, (const uint8_t *)w, strlen(w));
    }
  }
}

static void fuzz_run_one(const uint8_t *data, size_t n, long timeout_ms) {
  fuzz_current = data;
  fuzz_current_n = n;
  struct itimerval t = {.it_value = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000}};
  setitimer(ITIMER_REAL, &t, NULL);
  LLVMFuzzerTestOneInput(data, n);
  struct itimerval off = {0};
  setitimer(ITIMER_REAL, &off, NULL);
}

static double fuzz_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  const char *corpus_dir = NULL, *crash_dir = NULL;
  long runs = 10000, timeout_ms = 5000;
  double max_seconds = 60;
  size_t max_len = 4096;
  uint64_t seed = 1;
  int first_file = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--corpus") == 0 && v) corpus_dir = argv[++i];
    else if (strcmp(argv[i], "--crash-dir") == 0 && v) crash_dir = argv[++i];
    else if (strcmp(argv[i], "--runs") == 0 && v) runs = atol(argv[++i]);
    else if (strcmp(argv[i], "--max-seconds") == 0 && v) max_seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && v) seed = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--timeout-ms") == 0 && v) timeout_ms = atol(argv[++i]);
    else if (strcmp(argv[i], "--max-len") == 0 && v) max_len = (size_t)atol(argv[++i]);
    else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: %s --corpus DIR [--runs N] [--max-seconds S] [--seed N] [--timeout-ms T] "
              "[--max-len B] [--crash-dir DIR] | FILE...\n", argv[0]);
      return 2;
    } else if (!first_file) first_file = i;
  }
  signal(SIGALRM, fuzz_on_alarm);
  signal(SIGSEGV, fuzz_on_fatal_signal);
  signal(SIGBUS, fuzz_on_fatal_signal);
  signal(SIGFPE, fuzz_on_fatal_signal);
  signal(SIGABRT, fuzz_on_fatal_signal);
  __sanitizer_set_death_callback(fuzz_on_death);
  if (crash_dir) {
    const char *name = strrchr(argv[0], '/');
    snprintf(fuzz_crash_path, sizeof fuzz_crash_path, "%s/crash-%s-seed%llu", crash_dir, name ? name + 1 : argv[0],
             (unsigned long long)seed);
  }

  if (!corpus_dir) {  // replay files
    if (!first_file) return fprintf(stderr, "%s: give --corpus DIR or input files\n", argv[0]), 2;
    for (int i = first_file; i < argc; i++) {
      if (argv[i][0] == '-') { i++; continue; }
      fuzz_input in;
      if (fuzz_read_file(argv[i], &in) != 0) return fprintf(stderr, "%s: cannot read %s\n", argv[0], argv[i]), 2;
      fuzz_run_one(in.data, in.n_bytes, timeout_ms);
      free(in.data);
      printf("%s: ran %s (%zu bytes)\n", argv[0], argv[i], in.n_bytes);
    }
    return 0;
  }

  fuzz_input *corpus = NULL;
  int n_corpus = fuzz_read_corpus(corpus_dir, &corpus);
  if (n_corpus <= 0) return fprintf(stderr, "%s: no seed inputs in %s\n", argv[0], corpus_dir), 2;
  fuzz_rng = seed * 0x9E3779B97F4A7C15ull + 1;
  double t0 = fuzz_now();
  long done = 0;
  for (int i = 0; i < n_corpus; i++, done++) fuzz_run_one(corpus[i].data, corpus[i].n_bytes, timeout_ms);
  uint8_t *buf = malloc(max_len + 1);
  size_t largest = 0;
  for (; done < runs && fuzz_now() - t0 < max_seconds; done++) {
    const fuzz_input *base = &corpus[fuzz_below((size_t)n_corpus)];
    size_t n = base->n_bytes < max_len ? base->n_bytes : max_len;
    memcpy(buf, base->data, n);
    for (size_t k = 1 + fuzz_below(4); k > 0; k--) n = fuzz_mutate_once(buf, n, max_len, corpus, n_corpus);
    largest = n > largest ? n : largest;
    fuzz_run_one(buf, n, timeout_ms);
  }
  printf("%s: %ld inputs (%d seeds from %s, then mutations; seed %llu, largest %zu bytes) in %.1f s: no crash, "
         "hang or sanitizer report\n", argv[0], done, n_corpus, corpus_dir, (unsigned long long)seed, largest,
         fuzz_now() - t0);
  free(buf);
  for (int i = 0; i < n_corpus; i++) free(corpus[i].data);
  free(corpus);
  return 0;
}
