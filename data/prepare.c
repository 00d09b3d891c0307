// build/prepare: turns raw UTF-8 text files into token shards for the trainer. Byte-level
// tokens (token = byte value, vocab 256) by default, so any text works with no tokenizer files;
// or a Hugging Face byte-level BPE tokenizer (--tokenizer tokenizer.json, data/bpe.h), each file
// encoded whole and followed by --eos's token if given. The last --val-fraction of the
// concatenated tokens becomes the validation split.
//   build/prepare --out DIR [--val-fraction 0.05] [--shard-tokens N] [--tokenizer JSON [--eos TOKEN]] FILE...
// Writes DIR/train_000.bin, train_001.bin, ... and DIR/val_000.bin (docs/data.md).
#include "data/bpe.h"
#include "data/data.h"
#include "kernels/base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void prepare_usage(FILE *f) {
  fprintf(f,
          "usage: prepare --out DIR [--val-fraction F] [--shard-tokens N] [--tokenizer JSON [--eos TOKEN]] FILE...\n"
          "  Tokenises text files byte by byte (vocab 256), or with a byte-level BPE tokenizer,\n"
          "  into DIR/train_NNN.bin and DIR/val_NNN.bin (this project's shard format, docs/data.md).\n"
          "  --out DIR           output directory (created if missing)\n"
          "  --val-fraction F    last fraction of the tokens kept for validation, 0 <= F < 1\n"
          "                      (default 0.05; 0 writes no val shard)\n"
          "  --shard-tokens N    at most N tokens per shard (default 100000000)\n"
          "  --tokenizer JSON    a Hugging Face tokenizer.json (byte-level BPE: GPT-2's or Llama 3's\n"
          "                      family); each file is read whole and encoded\n"
          "  --eos TOKEN         with --tokenizer: the token written after each file, e.g.\n"
          "                      '<|endoftext|>' (the document separator)\n");
}

// The input files read as one byte stream, so shards may span file boundaries.
typedef struct prepare_stream {
  char **paths;
  int n_paths;
  int i_path;
  FILE *f;
  const int32_t *tokens;  // with --tokenizer: every file's ids, in memory; NULL: bytes from the files
  int64_t n_tokens, pos;
} prepare_stream;

// Reads up to n bytes as tokens; returns the count (short only at the end of the last file).
static int64_t prepare_read(prepare_stream *s, int32_t *out, int64_t n) {
  static unsigned char buf[1 << 16];
  int64_t got = 0;
  if (s->tokens) {
    got = s->n_tokens - s->pos < n ? s->n_tokens - s->pos : n;
    memcpy(out, s->tokens + s->pos, (size_t)got * sizeof *out);
    s->pos += got;
    return got;
  }
  while (got < n && s->i_path < s->n_paths) {
    if (!s->f) {
      s->f = fopen(s->paths[s->i_path], "rb");
      if (!s->f) {
        fprintf(stderr, "prepare: cannot open %s: %s; expected a readable text file\n",
                s->paths[s->i_path], strerror(errno));
        exit(1);
      }
    }
    size_t want = n - got < (int64_t)sizeof buf ? (size_t)(n - got) : sizeof buf;
    size_t k = fread(buf, 1, want, s->f);
    for (size_t i = 0; i < k; i++) out[got + (int64_t)i] = buf[i];
    got += (int64_t)k;
    if (k < want) {
      if (ferror(s->f)) {
        fprintf(stderr, "prepare: error reading %s: %s; expected a readable text file\n",
                s->paths[s->i_path], strerror(errno));
        exit(1);
      }
      fclose(s->f);
      s->f = NULL;
      s->i_path++;
    }
  }
  return got;
}

// Digits in shard names: three as the docs show, more when needed, so that names always sort
// in shard order (train_1000 would sort before train_101).
static int prepare_width(int n_shards) {
  int width = 3;
  for (long long m = 1000; m <= n_shards - 1; m *= 10) width++;
  return width;
}

// The most shards one split may have: names and counts stay small, and a shard size that would
// need more is almost surely a typo.
enum { PREPARE_MAX_SHARDS = 1000000 };

// Writes n_tokens from the stream as shards DIR/NAME_%0*d.bin; returns the number written.
static int prepare_write_split(prepare_stream *s, const char *dir, const char *name, int64_t n_tokens,
                               int64_t shard_tokens, int32_t *buf) {
  int n_shards = (int)(n_tokens / shard_tokens + (n_tokens % shard_tokens != 0));
  int width = prepare_width(n_shards);
  for (int i = 0; i < n_shards; i++) {
    int64_t n = n_tokens - (int64_t)i * shard_tokens < shard_tokens ? n_tokens - (int64_t)i * shard_tokens
                                                                   : shard_tokens;
    int64_t got = prepare_read(s, buf, n);
    if (got != n) {
      fprintf(stderr, "prepare: the input ended early (read %lld of %lld expected bytes for "
              "%s shard %d); expected the files not to change while prepare runs: run it again\n",
              (long long)got, (long long)n, name, i);
      exit(1);
    }
    char path[4352], err[1024];
    if (snprintf(path, sizeof path, "%s/%s_%0*d.bin", dir, name, width, i) >= (int)sizeof path) {
      fprintf(stderr, "prepare: output path %s/... is too long; expected under %zu characters: "
              "choose a shorter --out\n", dir, sizeof path - 32);
      exit(1);
    }
    if (data_write_shard(path, buf, n, err, sizeof err) != 0) {
      fprintf(stderr, "prepare: %s\n", err);
      exit(1);
    }
    printf("wrote %s: %lld tokens\n", path, (long long)n);
  }
  return n_shards;
}

// Removes NAME_<digits>.bin shards that this run did not write (left by an earlier, larger
// run): data.train globs the directory, and a stale shard would silently join the new data.
static void prepare_remove_stale(const char *dir, const char *name, int n_written) {
  int width = prepare_width(n_written);
  DIR *dd = opendir(dir);
  if (!dd) return;
  size_t n_name = strlen(name);
  struct dirent *e;
  while ((e = readdir(dd))) {
    const char *f = e->d_name;
    if (strncmp(f, name, n_name) != 0 || f[n_name] != '_') continue;
    const char *digits = f + n_name + 1;
    size_t n_digits = strspn(digits, "0123456789");
    if (n_digits == 0 || strcmp(digits + n_digits, ".bin") != 0) continue;
    if ((int)n_digits == width && atoll(digits) < n_written) continue;  // written just now
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", dir, f);
    if (remove(path) == 0) printf("removed stale %s\n", path);
    else fprintf(stderr, "prepare: warning: cannot remove stale %s: %s; remove it by hand, "
                 "or data.train globs will include it\n", path, strerror(errno));
  }
  closedir(dd);
}

// Every file read whole and encoded with the tokenizer at path, eos's id after each (eos NULL:
// none), into *tokens; returns the count. Errors end the program with one line.
static int64_t prepare_encode(char **files, int n_files, const char *path, const char *eos, int32_t **tokens,
                              int32_t *vocab) {
  char err[1024];
  bpe *b = bpe_load(path, err, sizeof err);
  if (!b) {
    fprintf(stderr, "prepare: %s\n", err);
    exit(1);
  }
  int32_t eos_id = eos ? bpe_token_id(b, eos) : -1;
  if (eos && eos_id < 0) {
    fprintf(stderr, "prepare: --eos '%s' is not a token of %s: name one of its added tokens, e.g. "
            "'<|endoftext|>' (GPT-2) or '<|end_of_text|>' (Llama 3)\n", eos, path);
    exit(1);
  }
  int64_t n = 0, cap = 0;
  for (int i = 0; i < n_files; i++) {
    FILE *f = fopen(files[i], "rb");
    char *text = NULL;
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
      text = malloc((size_t)size + 1);
      if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) size = -1;
    }
    if (f) fclose(f);
    if (size < 0) {
      fprintf(stderr, "prepare: cannot read %s: %s; expected a readable text file\n", files[i], strerror(errno));
      exit(1);
    }
    bpe_encode(b, text, (size_t)size, tokens, &n, &cap);
    if (eos) {
      if (n == cap) {
        *tokens = realloc(*tokens, (size_t)(cap = cap ? 2 * cap : 1) * sizeof **tokens);
        if (!*tokens) {
          fprintf(stderr, "prepare: out of memory for %lld tokens\n", (long long)n);
          exit(1);
        }
      }
      (*tokens)[n++] = eos_id;
    }
    printf("%s: %ld bytes, %lld tokens so far\n", files[i], size, (long long)n);
    free(text);
  }
  *vocab = bpe_vocab_size(b);
  bpe_free(b);
  return n;
}

// The tokenizer beside the shards (DIR/tokenizer.json), where build/sample and export_hf find
// it; without one, an earlier run's is removed, as stale shards are.
static void prepare_record_tokenizer(const char *dir, const char *tokenizer) {
  char path[4352];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (!tokenizer) {
    if (remove(path) == 0) printf("removed stale %s (these shards are byte-level)\n", path);
    return;
  }
  struct stat a, b;
  if (stat(tokenizer, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return;
  if (fs_copy_file(tokenizer, path) != 0) {
    fprintf(stderr, "prepare: cannot copy %s to %s: %s; the shards are written, pass --tokenizer to build/sample "
            "yourself\n", tokenizer, path, strerror(errno));
    exit(1);
  }
  printf("wrote %s: the tokenizer, recorded with the data for build/sample\n", path);
}

int main(int argc, char **argv) {
  const char *out = NULL, *tokenizer = NULL, *eos = NULL;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100000000;
  char **files = calloc((size_t)argc, sizeof *files);
  int n_files = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      prepare_usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--out") || !strcmp(a, "--val-fraction") || !strcmp(a, "--shard-tokens") ||
        !strcmp(a, "--tokenizer") || !strcmp(a, "--eos")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "prepare: %s expects a value, found the end of the arguments\n", a);
        prepare_usage(stderr);
        return 2;
      }
      const char *v = argv[++i];
      char *end;
      if (!strcmp(a, "--out")) {
        out = v;
      } else if (!strcmp(a, "--tokenizer")) {
        tokenizer = v;
      } else if (!strcmp(a, "--eos")) {
        eos = v;
      } else if (!strcmp(a, "--val-fraction")) {
        val_fraction = strtod(v, &end);
        if (end == v || *end || !(val_fraction >= 0 && val_fraction < 1)) {
          fprintf(stderr, "prepare: --val-fraction expects a number in [0, 1), found '%s'\n", v);
          return 2;
        }
      } else {
        errno = 0;
        long long st = strtoll(v, &end, 10);
        if (end == v || *end || errno == ERANGE || st < 2) {
          fprintf(stderr, "prepare: --shard-tokens expects an integer in [2, %lld], found '%s'\n", LLONG_MAX, v);
          return 2;
        }
        shard_tokens = st;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "prepare: unknown option '%s'; expected --out, --val-fraction, --shard-tokens, "
              "--tokenizer or --eos\n", a);
      prepare_usage(stderr);
      return 2;
    } else {
      files[n_files++] = argv[i];
    }
  }
  if (eos && !tokenizer) {
    fprintf(stderr, "prepare: --eos names a token of a tokenizer: pass --tokenizer too (byte-level tokens have "
            "no separator)\n");
    return 2;
  }
  if (!out || n_files == 0) {
    fprintf(stderr, "prepare: expected --out DIR and at least one text file, found %s\n",
            !out ? "no --out" : "no input file");
    prepare_usage(stderr);
    return 2;
  }

  // Sizes first: the split point must be known before the first train shard is written, and
  // stat lets the input stream through a fixed buffer instead of being held in memory.
  int64_t n_total = 0;
  for (int i = 0; i < n_files; i++) {
    struct stat st;
    if (stat(files[i], &st) != 0) {
      fprintf(stderr, "prepare: cannot read %s: %s; expected a text file: check the path\n",
              files[i], strerror(errno));
      return 1;
    }
    if (!S_ISREG(st.st_mode)) {
      fprintf(stderr, "prepare: %s is not a regular file; expected a text file (pipes are not "
              "supported: save the text to a file first)\n", files[i]);
      return 1;
    }
    n_total += (int64_t)st.st_size;
  }
  if (n_total == 0) {
    fprintf(stderr, "prepare: the %d input file(s) are empty; expected some text\n", n_files);
    return 1;
  }
  int32_t *tokens = NULL, vocab = 256;
  if (tokenizer) n_total = prepare_encode(files, n_files, tokenizer, eos, &tokens, &vocab);
  int64_t n_val = (int64_t)((double)n_total * val_fraction);
  int64_t n_train = n_total - n_val;
  if (val_fraction > 0 && n_val == 0) {
    fprintf(stderr, "prepare: warning: %lld tokens x val fraction %g rounds to 0 val tokens; "
            "no val shard written\n", (long long)n_total, val_fraction);
  }
  if (fs_make_dirs(out, NULL, 0) != 0) {
    fprintf(stderr, "prepare: cannot create output directory %s: %s; expected a writable path\n",
            out, strerror(errno));
    return 1;
  }

  // Shards of the larger split, counted without overflow (shard_tokens may be near INT64_MAX).
  const int64_t n_most = n_train > n_val ? n_train : n_val;
  const int64_t n_shards_max = n_most / shard_tokens + (n_most % shard_tokens != 0);
  if (n_shards_max > PREPARE_MAX_SHARDS) {
    fprintf(stderr, "prepare: --shard-tokens %lld cuts %lld tokens into %lld shards, more than %d; expected "
            "at least %lld tokens a shard: pass a larger --shard-tokens\n", (long long)shard_tokens,
            (long long)n_most, (long long)n_shards_max, PREPARE_MAX_SHARDS,
            (long long)(n_most / PREPARE_MAX_SHARDS + 1));
    return 2;
  }
  int64_t n_buf = shard_tokens < n_total ? shard_tokens : n_total;
  int32_t *buf = malloc((size_t)n_buf * sizeof *buf);
  if (!buf) {
    fprintf(stderr, "prepare: out of memory for a %lld-token shard buffer; expected to fit: "
            "pass a smaller --shard-tokens\n", (long long)n_buf);
    return 1;
  }
  prepare_stream s = {files, n_files, 0, NULL, tokens, n_total, 0};
  int n_train_shards = prepare_write_split(&s, out, "train", n_train, shard_tokens, buf);
  int n_val_shards = n_val > 0 ? prepare_write_split(&s, out, "val", n_val, shard_tokens, buf) : 0;
  int32_t extra;
  if (prepare_read(&s, &extra, 1) != 0) {
    fprintf(stderr, "prepare: the input grew while prepare ran (more than the %lld bytes "
            "stat reported); expected the files not to change: run it again\n", (long long)n_total);
    return 1;
  }
  prepare_remove_stale(out, "train", n_train_shards);
  prepare_remove_stale(out, "val", n_val_shards);
  prepare_record_tokenizer(out, tokenizer);
  printf("prepare: %lld tokens from %d file(s): %lld train in %d shard(s), %lld val in %d "
         "shard(s); %s vocab: set model.vocab_size >= %d\n", (long long)n_total, n_files,
         (long long)n_train, n_train_shards, (long long)n_val, n_val_shards, tokenizer ? "the tokenizer's" : "byte-level",
         vocab);
  free(tokens);
  free(buf);
  free(files);
  return 0;
}
