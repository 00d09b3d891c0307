// Token-shard reader and writer. Each shard stays open and a window is one pread of its
// seq_len + 1 tokens (through the page cache, which every rank on a node shares). Not mmap: a
// shard truncated or rewritten in place under a mapping kills the process with SIGBUS, while a
// pread comes back short, and the size and modification time checked after each read name the
// shard that changed. The window order is a pure function of (seed, sample): any rank, any call
// order, any resume point sees the same tokens. The three formats (this project's, llm.c's,
// Megatron's indexed datasets) are documented byte by byte in docs/data.md.
#include "data/data.h"
#include "kernels/base/check.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// int32 tokens are read straight into the window in host byte order; the formats are
// little-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "data.c reads little-endian int32 tokens in place and needs a little-endian host"
#endif

#define DATA_TRN_MAGIC "TRNTOK\0\0"       // 8 bytes, this project's shards
#define DATA_TRN_VERSION 1u
#define DATA_TRN_HEADER_BYTES 64
#define DATA_LLMC_MAGIC 20240520          // llm.c GPT-2 shards (uint16 tokens)
#define DATA_LLMC_LLAMA3_MAGIC 20240801   // llm.c Llama-3 shards: recognised only to say so
#define DATA_LLMC_VERSION 1
#define DATA_LLMC_HEADER_BYTES (256 * 4)

#define DATA_ACCEPTED_FORMATS                                                            \
  "this project's shard (magic \"TRNTOK\\0\\0\" = 54 52 4e 54 4f 4b 00 00, written by "  \
  "build/prepare or data_write_shard) or an llm.c GPT-2 shard (int32 magic 20240520 = "  \
  "88 d8 34 01)"

static uint32_t data_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t data_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return (int64_t)v;
}

static void data_put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void data_put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// ---------------------------------------------------------------------------------------------
// Reading

// Exactly n_bytes at offset: 0, or -1 when the file ends first (it shrank) or a read fails.
static int data_read_at(int fd, void *buf, size_t n_bytes, int64_t offset) {
  size_t done = 0;
  while (done < n_bytes) {
    ssize_t n = pread(fd, (char *)buf + done, n_bytes - done, (off_t)(offset + (int64_t)done));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;  // end of file: no error code to report
    if (n <= 0) return -1;
    done += (size_t)n;
  }
  return 0;
}

static int64_t data_mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

// Whether the open shard still has the size and modification time it had at open: -1 with a
// message naming it when not (or when fstat fails), else 0.
static int data_shard_check_unchanged(const data_shard *s, char *err, size_t n_err) {
  struct stat st;
  if (fstat(s->fd, &st) != 0)
    return check_errf(err, n_err, "cannot stat data shard %s while reading it: %s; expected the file opened at "
                      "start-up: check the file system", s->path, strerror(errno));
  if ((int64_t)st.st_size == s->n_file_bytes && data_mtime_ns(&st) == s->mtime_ns) return 0;
  return check_errf(err, n_err, "data shard %s changed while the run reads it (%lld bytes at start-up, %lld now%s): "
                    "a shard must not be rewritten during a run; restore it (write new shards to another "
                    "directory) and resume with checkpoint.resume=auto", s->path, (long long)s->n_file_bytes,
                    (long long)st.st_size, data_mtime_ns(&st) != s->mtime_ns ? ", modified since" : "");
}

// ---------------------------------------------------------------------------------------------
// Megatron indexed datasets: PREFIX.bin holds the tokens with no header, PREFIX.idx describes
// them (docs/data.md). Read as one shard of header_bytes 0: the index is checked at open and
// not kept, since the sequences are contiguous and windows ignore document boundaries.

#define DATA_MMIDX_MAGIC "MMIDIDX\0\0" // 9 bytes, at the start of the .idx
#define DATA_MMIDX_MAGIC_BYTES 9
#define DATA_MMIDX_VERSION 1
#define DATA_MMIDX_HEADER_BYTES 34     // magic 9, version 8, dtype 1, sequence and document counts 8 + 8
#define DATA_MMIDX_SUPPORTED "8 (uint16) or 4 (int32), the two that Megatron's preprocess_data.py writes"

// Megatron's dtype codes; the token bytes of the two that are read, else 0.
static int data_mmidx_token_bytes(unsigned code) {
  return code == 8 ? 2 : code == 4 ? 4 : 0;
}

static const char *data_mmidx_dtype_name(unsigned code) {
  static const char *names[] = {"unknown", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return code < sizeof names / sizeof *names ? names[code] : "unknown";
}

// The .idx beside a .bin: 1 and its path in idx when path ends in ".bin" and that file exists.
static int data_mmidx_sibling(const char *path, char *idx, size_t n_idx) {
  size_t n = strlen(path);
  if (n < 4 || strcmp(path + n - 4, ".bin") != 0 || n >= n_idx) return 0;
  snprintf(idx, n_idx, "%.*s.idx", (int)(n - 4), path);
  return access(idx, F_OK) == 0;
}

// Checks the fixed header of an .idx of n_idx bytes: 0 with the token bytes and the counts, or -1.
static int data_mmidx_header(const char *idx, const unsigned char *h, int64_t n_idx, int *token_bytes,
                             int64_t *n_seq, int64_t *n_doc, char *err, size_t n_err) {
  // h is zero past the end of a short file, so a short index with the right start is truncated.
  size_t n_cmp = n_idx < DATA_MMIDX_MAGIC_BYTES ? (size_t)n_idx : DATA_MMIDX_MAGIC_BYTES;
  if (n_idx < DATA_MMIDX_HEADER_BYTES && memcmp(h, DATA_MMIDX_MAGIC, n_cmp) == 0)
    return check_errf(err, n_err, "Megatron index %s is truncated: %lld bytes, expected at least the %d-byte header; "
                      "re-create the dataset with Megatron's tools/preprocess_data.py", idx, (long long)n_idx,
                      DATA_MMIDX_HEADER_BYTES);
  if (memcmp(h, DATA_MMIDX_MAGIC, DATA_MMIDX_MAGIC_BYTES) != 0)
    return check_errf(err, n_err, "Megatron index %s has magic %02x %02x %02x %02x %02x %02x %02x %02x %02x; "
                      "expected \"MMIDIDX\\0\\0\" = 4d 4d 49 44 49 44 58 00 00: the .idx beside a .bin must be the "
                      "index Megatron's tools/preprocess_data.py wrote with it", idx, h[0], h[1], h[2], h[3], h[4],
                      h[5], h[6], h[7], h[8]);
  int64_t version = data_le64(h + 9);
  if (version != DATA_MMIDX_VERSION)
    return check_errf(err, n_err, "Megatron index %s has version %lld; expected version %d: re-create the dataset "
                      "with Megatron's tools/preprocess_data.py", idx, (long long)version, DATA_MMIDX_VERSION);
  unsigned code = h[17];
  *token_bytes = data_mmidx_token_bytes(code);
  if (*token_bytes == 0)
    return check_errf(err, n_err, "Megatron index %s has dtype code %u (%s); expected code %s: re-create the "
                      "dataset with token ids stored as uint16 or int32", idx, code, data_mmidx_dtype_name(code),
                      DATA_MMIDX_SUPPORTED);
  *n_seq = data_le64(h + 18);
  *n_doc = data_le64(h + 26);
  return 0;
}

// The .idx size the header implies: the header, int32 lengths, int64 pointers, int64 document
// indices. -1 when the counts are beyond any file.
static int64_t data_mmidx_expect_bytes(int64_t n_seq, int64_t n_doc) {
  if (n_seq < 0 || n_doc < 0 || n_seq > INT64_MAX / 64 || n_doc > INT64_MAX / 64) return -1;
  return DATA_MMIDX_HEADER_BYTES + 12 * n_seq + 8 * n_doc;
}

// Reads the lengths and pointers in chunks: every length >= 0 and every sequence starts where
// the one before it ends (the first at byte 0). 0 with the byte total in n_bytes, or -1.
static int data_mmidx_walk(int fd, const char *idx, int64_t n_seq, int token_bytes, int64_t *n_bytes,
                           char *err, size_t n_err) {
  enum { CHUNK = 1 << 15 };
  unsigned char *len = XMALLOC(CHUNK * 4), *ptr = XMALLOC(CHUNK * 8);
  int64_t at = 0;
  int rc = 0;
  for (int64_t i = 0; rc == 0 && i < n_seq; i += CHUNK) {
    int64_t n = n_seq - i < CHUNK ? n_seq - i : CHUNK;
    if (data_read_at(fd, len, (size_t)n * 4, DATA_MMIDX_HEADER_BYTES + 4 * i) != 0 ||
        data_read_at(fd, ptr, (size_t)n * 8, DATA_MMIDX_HEADER_BYTES + 4 * n_seq + 8 * i) != 0) {
      rc = check_errf(err, n_err, "cannot read the sequence table of Megatron index %s: %s; check the file system",
                      idx, errno ? strerror(errno) : "the file ends early");
      break;
    }
    for (int64_t k = 0; rc == 0 && k < n; k++) {
      int32_t l = (int32_t)data_le32(len + 4 * k);
      int64_t p = data_le64(ptr + 8 * k);
      if (l < 0 || p != at)
        rc = check_errf(err, n_err, "Megatron index %s: sequence %lld has length %d and starts at byte %lld of the "
                        ".bin; expected a length >= 0 and the start %lld, where the sequence before it ends "
                        "(sequences are contiguous from byte 0): re-create the dataset", idx, (long long)(i + k), l,
                        (long long)p, (long long)at);
      at += (int64_t)l * token_bytes;
    }
  }
  free(len);
  free(ptr);
  *n_bytes = at;
  return rc;
}

// Checks path's index idx and fills s (whose fd, size and time are set) as a shard of
// header_bytes 0. Returns 0, or -1 with a message.
static int data_mmidx_open(data_shard *s, const char *idx, char *err, size_t n_err) {
  int fd = open(idx, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int e = errno;
    if (fd >= 0) close(fd);
    return check_errf(err, n_err, "cannot open Megatron index %s of data shard %s: %s; expected a readable regular "
                      "file: check its permissions", idx, s->path, fd < 0 ? strerror(e) : "not a regular file");
  }
  unsigned char h[DATA_MMIDX_HEADER_BYTES] = {0};
  int64_t n_idx = (int64_t)st.st_size, n_seq = 0, n_doc = 0, n_bytes = 0;
  int token_bytes = 0;
  size_t n_head = n_idx < DATA_MMIDX_HEADER_BYTES ? (size_t)n_idx : DATA_MMIDX_HEADER_BYTES;
  int rc = data_read_at(fd, h, n_head, 0) != 0
               ? check_errf(err, n_err, "cannot read Megatron index %s: %s; check the file system", idx,
                            errno ? strerror(errno) : "short read")
               : data_mmidx_header(idx, h, n_idx, &token_bytes, &n_seq, &n_doc, err, n_err);
  int64_t n_expect = rc == 0 ? data_mmidx_expect_bytes(n_seq, n_doc) : 0;
  if (rc == 0 && n_expect != n_idx)
    rc = check_errf(err, n_err, "Megatron index %s is %s: its header says %lld sequences and %lld document indices "
                    "(%lld bytes), the file has %lld bytes%s; re-create the dataset", idx,
                    n_idx < n_expect || n_expect < 0 ? "truncated" : "longer than its header says",
                    (long long)n_seq, (long long)n_doc, (long long)n_expect, (long long)n_idx,
                    n_expect >= 0 && n_idx == n_expect + n_seq ? " (a multimodal dataset's sequence modes: not "
                    "supported)" : "");
  if (rc == 0) rc = data_mmidx_walk(fd, idx, n_seq, token_bytes, &n_bytes, err, n_err);
  close(fd);
  if (rc == 0 && n_bytes != s->n_file_bytes)
    rc = check_errf(err, n_err, "Megatron dataset %s disagrees with its index %s: the sequence lengths add up to "
                    "%lld tokens of %d bytes (%lld bytes), the .bin has %lld bytes; the two files must be the pair "
                    "one run of tools/preprocess_data.py wrote: re-create them", s->path, idx,
                    (long long)(n_bytes / token_bytes), token_bytes, (long long)n_bytes, (long long)s->n_file_bytes);
  if (rc != 0) return -1;
  s->header_bytes = 0;
  s->token_bytes = token_bytes;
  s->n_tokens = n_bytes / token_bytes;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Opening one shard

// Opens path and fills s from its header. Returns 0, or -1 with a message in err.
static int data_shard_open(data_shard *s, const char *path, char *err, size_t n_err) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  if (strlen(path) >= sizeof s->path) {
    snprintf(err, n_err, "data shard path '%s' is %zu characters; at most %zu are supported: "
             "move the shards to a shorter path", path, strlen(path), sizeof s->path - 1);
    return -1;
  }
  snprintf(s->path, sizeof s->path, "%s", path);
  // Non-blocking, so that a FIFO does not wait for a writer before fstat refuses it.
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, n_err, "cannot open data shard %s: %s; expected a readable token shard: "
             "check the path and permissions, or re-create it with build/prepare",
             path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, n_err, "data shard %s is not a regular file; expected a token shard written "
             "by build/prepare: point data.train/data.val at the .bin files", path);
    close(fd);
    return -1;
  }
  int64_t n_file = (int64_t)st.st_size;
  char idx[sizeof s->path + 4] = "";
  if (data_mmidx_sibling(path, idx, sizeof idx)) {
    s->fd = fd;
    s->n_file_bytes = n_file;
    s->mtime_ns = data_mtime_ns(&st);
    return data_mmidx_open(s, idx, err, n_err);
  }
  if (n_file < 4) {
    snprintf(err, n_err, "data shard %s is too short to be a shard: %lld bytes, expected at "
             "least a %d-byte header; re-create it with build/prepare",
             path, (long long)n_file, DATA_TRN_HEADER_BYTES);
    close(fd);
    return -1;
  }
  s->fd = fd;
  s->n_file_bytes = n_file;
  s->mtime_ns = data_mtime_ns(&st);
  // The largest header there is, or the whole file when shorter; the checks below never look
  // past n_file.
  unsigned char h[DATA_LLMC_HEADER_BYTES] = {0};
  size_t n_head = n_file < DATA_LLMC_HEADER_BYTES ? (size_t)n_file : DATA_LLMC_HEADER_BYTES;
  if (data_read_at(fd, h, n_head, 0) != 0) {
    snprintf(err, n_err, "cannot read the header of data shard %s (%lld bytes): %s; expected a readable "
             "regular file: check the file system", path, (long long)n_file, errno ? strerror(errno) : "short read");
    return -1;
  }

  int64_t header_bytes;
  uint32_t magic32 = data_le32(h);
  if (memcmp(h, DATA_TRN_MAGIC, 4) == 0) {
    header_bytes = DATA_TRN_HEADER_BYTES;
    if (n_file < header_bytes) {
      snprintf(err, n_err, "data shard %s is too short: %lld bytes, expected at least the "
               "%lld-byte header of this project's format; re-create it with build/prepare",
               path, (long long)n_file, (long long)header_bytes);
      return -1;
    }
    if (memcmp(h, DATA_TRN_MAGIC, 8) != 0) {
      snprintf(err, n_err, "data shard %s has magic %02x %02x %02x %02x %02x %02x %02x %02x; "
               "expected %s; re-create it with build/prepare",
               path, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], DATA_ACCEPTED_FORMATS);
      return -1;
    }
    uint32_t version = data_le32(h + 8);
    if (version != DATA_TRN_VERSION) {
      snprintf(err, n_err, "data shard %s has format version %u; this build reads version %u: "
               "re-create it with this build's build/prepare", path, version, DATA_TRN_VERSION);
      return -1;
    }
    uint32_t token_bytes = data_le32(h + 12);
    if (token_bytes != 2 && token_bytes != 4) {
      snprintf(err, n_err, "data shard %s says tokens are %u bytes; expected 2 (uint16) or 4 "
               "(int32): the header is damaged, re-create it with build/prepare",
               path, token_bytes);
      return -1;
    }
    s->token_bytes = (int)token_bytes;
    s->n_tokens = data_le64(h + 16);
  } else if (magic32 == DATA_LLMC_MAGIC) {
    header_bytes = DATA_LLMC_HEADER_BYTES;
    if (n_file < header_bytes) {
      snprintf(err, n_err, "data shard %s is too short: %lld bytes, expected at least the "
               "%lld-byte header of an llm.c shard; re-create it with llm.c's data scripts",
               path, (long long)n_file, (long long)header_bytes);
      return -1;
    }
    int32_t version = (int32_t)data_le32(h + 4);
    if (version != DATA_LLMC_VERSION) {
      snprintf(err, n_err, "llm.c data shard %s has version %d; expected version %d (GPT-2, "
               "uint16 tokens): re-create it with llm.c's GPT-2 tokenizer",
               path, version, DATA_LLMC_VERSION);
      return -1;
    }
    s->token_bytes = 2;
    s->n_tokens = (int32_t)data_le32(h + 8);
  } else if (magic32 == DATA_LLMC_LLAMA3_MAGIC) {
    snprintf(err, n_err, "data shard %s is an llm.c Llama-3 shard (magic 20240801); expected "
             "%s: re-tokenize the text with build/prepare or llm.c's GPT-2 tokenizer",
             path, DATA_ACCEPTED_FORMATS);
    return -1;
  } else if (memcmp(h, DATA_MMIDX_MAGIC, DATA_MMIDX_MAGIC_BYTES) == 0) {
    return check_errf(err, n_err, "data shard %s is the index (.idx) of a Megatron dataset; expected the tokens: "
                      "point data.train/data.val at the .bin beside it (a glob like PREFIX*.bin)", path);
  } else {
    snprintf(err, n_err, "data shard %s starts with magic %02x %02x %02x %02x (%lld bytes in "
             "file); expected %s, or the .bin of a Megatron dataset with its .idx beside it (%s%s): "
             "check that data.train/data.val point at token shards, not raw text (convert text "
             "with build/prepare)", path, h[0], h[1], h[2], h[3], (long long)n_file,
             DATA_ACCEPTED_FORMATS, idx[0] ? idx : "the path must end in .bin", idx[0] ? " does not exist" : "");
    return -1;
  }

  if (s->n_tokens < 0 || s->n_tokens > (INT64_MAX - header_bytes) / s->token_bytes) {
    snprintf(err, n_err, "data shard %s says it holds %lld tokens; expected a count between 0 "
             "and the file size: the header is damaged, re-create the shard",
             path, (long long)s->n_tokens);
    return -1;
  }
  int64_t n_expect = header_bytes + s->n_tokens * s->token_bytes;
  if (n_file < n_expect) {
    snprintf(err, n_err, "shard %s is truncated: header says %lld tokens (%lld bytes), file has "
             "%lld bytes; re-create it with build/prepare",
             path, (long long)s->n_tokens, (long long)n_expect, (long long)n_file);
    return -1;
  }
  if (n_file > n_expect) {
    snprintf(err, n_err, "shard %s is longer than its header says: header says %lld tokens "
             "(%lld bytes), file has %lld bytes; the header is damaged or the file was "
             "appended to: re-create it with build/prepare",
             path, (long long)s->n_tokens, (long long)n_expect, (long long)n_file);
    return -1;
  }
  s->header_bytes = header_bytes;
  return 0;
}

static void data_shard_close(data_shard *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

// n tokens of the shard from token `first` into out, widened to int32. 0, or -1 with a message
// when the read comes back short or the shard changed since open.
static int data_shard_read(const data_shard *s, int64_t first, int64_t n, int32_t *out, char *err, size_t n_err) {
  int rc = data_read_at(s->fd, out, (size_t)n * (size_t)s->token_bytes, s->header_bytes + first * s->token_bytes);
  int read_errno = errno;
  if (data_shard_check_unchanged(s, err, n_err) != 0) return -1;
  if (rc != 0)
    return check_errf(err, n_err, "cannot read tokens %lld..%lld of data shard %s: %s; check the file system",
                      (long long)first, (long long)(first + n - 1), s->path,
                      read_errno ? strerror(read_errno) : "the file ends early");
  if (s->token_bytes == 2) {
    // Widen in place from the last token: token i's int32 slot (bytes 4i..4i+3) overwrites the
    // uint16 tokens 2i and 2i+1, which are widened already (i = 0: read before the write).
    const unsigned char *b = (const unsigned char *)out;
    for (int64_t i = n - 1; i >= 0; i--) out[i] = (int32_t)(b[2 * i] | b[2 * i + 1] << 8);
  }
  return 0;
}

// Largest token of a shard, or -1 with a message when an int32 shard holds a negative token
// (an id the embedding table cannot index), or the read fails.
static int data_shard_max_token(const data_shard *s, int32_t *max_token, char *err, size_t n_err) {
  enum { CHUNK = 1 << 16 };
  int32_t *buf = XMALLOC(CHUNK * sizeof *buf);
  int32_t m = 0, lo = 0;
  int rc = 0;
  for (int64_t i = 0; rc == 0 && i < s->n_tokens; i += CHUNK) {
    int64_t n = s->n_tokens - i < CHUNK ? s->n_tokens - i : CHUNK;
    rc = data_shard_read(s, i, n, buf, err, n_err);
    for (int64_t k = 0; rc == 0 && k < n; k++) {
      m = buf[k] > m ? buf[k] : m;
      lo = buf[k] < lo ? buf[k] : lo;
    }
  }
  free(buf);
  if (rc != 0) return -1;
  if (lo < 0)
    return check_errf(err, n_err, "data shard %s holds token id %d; expected ids >= 0: the shard is damaged or was "
                      "written by another tool, re-create it with build/prepare", s->path, lo);
  *max_token = m;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Loader

static int data_cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int data_open(data_loader *d, const char *pattern, int seq_len, uint64_t seed, char *err, size_t n_err) {
  memset(d, 0, sizeof *d);
  d->perm_epoch = -1;
  if (seq_len < 1) {
    snprintf(err, n_err, "data_open: seq_len is %d; expected >= 1: set model.seq_len", seq_len);
    return -1;
  }
  if (!pattern || !pattern[0]) {
    snprintf(err, n_err, "no data shard pattern given (empty string); expected a shard path or "
             "glob: set data.train (e.g. data/corpus/train_*.bin)");
    return -1;
  }
  d->seq_len = seq_len;
  d->seed = seed;

  glob_t g;
  int rc = glob(pattern, 0, NULL, &g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    if (rc == 0) globfree(&g);
    snprintf(err, n_err, "no data shard matches '%s': run scripts/setup/get_corpus.sh (or "
             "build/prepare) first, or set data.train", pattern);
    return -1;
  }
  if (rc != 0) {
    snprintf(err, n_err, "cannot expand data shard pattern '%s' (glob error %d: %s); expected "
             "a readable path or glob: check the directory permissions", pattern, rc,
             rc == GLOB_NOSPACE ? "out of memory" : "read error");
    return -1;
  }
  // glob sorts by the locale's collation; re-sort bytewise so every rank and host, whatever
  // its locale, sees the shards (and so the windows) in one order.
  qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, data_cmp_str);

  d->shards = XCALLOC(g.gl_pathc, sizeof *d->shards);
  int64_t n_windows = 0, n_tokens_all = 0, n_tokens_max = 0;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    data_shard *s = &d->shards[i];
    if (data_shard_open(s, g.gl_pathv[i], err, n_err) != 0) {
      data_shard_close(s);
      goto fail;
    }
    d->n_shards++;
    int32_t m = 0;
    if (data_shard_max_token(s, &m, err, n_err) != 0) goto fail;
    d->max_token = m > d->max_token ? m : d->max_token;
    if (s->n_tokens > 0) n_windows += (s->n_tokens - 1) / seq_len;
    n_tokens_all += s->n_tokens;
    n_tokens_max = s->n_tokens > n_tokens_max ? s->n_tokens : n_tokens_max;
  }
  if (n_windows == 0) {
    snprintf(err, n_err, "data shards matching '%s' are too short: a window needs seq_len + 1 "
             "= %lld tokens within one shard, found %d shard(s) with %lld tokens in all (largest "
             "%lld); use more text (build/prepare) or a smaller model.seq_len",
             pattern, (long long)seq_len + 1, d->n_shards, (long long)n_tokens_all,
             (long long)n_tokens_max);
    goto fail;
  }
  globfree(&g);

  d->n_windows = n_windows;
  d->window_start = XMALLOC((size_t)n_windows * sizeof *d->window_start);
  d->window_shard = XMALLOC((size_t)n_windows * sizeof *d->window_shard);
  d->perm = XMALLOC((size_t)n_windows * sizeof *d->perm);
  int64_t w = 0, base = 0;
  for (int i = 0; i < d->n_shards; i++) {
    const data_shard *s = &d->shards[i];
    int64_t n = s->n_tokens > 0 ? (s->n_tokens - 1) / seq_len : 0;
    for (int64_t k = 0; k < n; k++, w++) {
      d->window_start[w] = base + k * seq_len;
      d->window_shard[w] = i;
    }
    base += s->n_tokens;
  }
  return 0;

fail:
  globfree(&g);
  data_close(d);
  return -1;
}

// splitmix64 (Steele, Lea, Flood 2014): a counter-based generator, so the stream of an epoch is
// a function of (seed, epoch) alone and costs nothing to re-create on any rank.
static uint64_t data_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t data_next64(uint64_t *state) {
  *state += 0x9E3779B97F4A7C15ull;
  return data_mix64(*state);
}

// Uniform in [0, bound) without modulo bias: reject the low values that would over-weight the
// small residues. Integer-only, so every platform draws the same numbers.
static uint64_t data_below(uint64_t *state, uint64_t bound) {
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = data_next64(state);
    if (r >= threshold) return r % bound;
  }
}

static void data_build_perm(data_loader *d, int64_t epoch) {
  int64_t n = d->n_windows;
  for (int64_t i = 0; i < n; i++) d->perm[i] = i;
  // Mixing epoch before combining keeps (seed, epoch) pairs apart: seed ^ epoch alone would give
  // seed 1 epoch 0 the same order as seed 0 epoch 1.
  uint64_t state = data_mix64(d->seed ^ data_mix64((uint64_t)epoch + 0x632BE59BD9B4E019ull));
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)data_below(&state, (uint64_t)i + 1);
    int64_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->perm_epoch = epoch;
}

int data_get_window(data_loader *d, int64_t sample, int32_t *out, char *err, size_t n_err) {
  CHECK(d->n_windows > 0, "data_get_window on a loader with no windows; expected data_open to "
        "have succeeded first");
  CHECK(sample >= 0, "data_get_window: sample %lld is negative; expected >= 0 (a bug in the "
        "caller's sample counter)", (long long)sample);
  int64_t epoch = sample / d->n_windows, j = sample % d->n_windows;
  if (epoch != d->perm_epoch) data_build_perm(d, epoch);
  int64_t w = d->perm[j];
  int shard = (int)d->window_shard[w];
  // window_start is a global offset (over all shards in order); the shard base is the sum of
  // the shards before it. n_shards is small, so the sum costs nothing next to the copy.
  int64_t base = 0;
  for (int i = 0; i < shard; i++) base += d->shards[i].n_tokens;
  const data_shard *s = &d->shards[shard];
  int64_t off = d->window_start[w] - base;
  int n = d->seq_len + 1;
  if (data_shard_read(s, off, n, out, err, n_err) != 0) return -1;
  // Every id was checked against the vocabulary at open; one beyond max_token means the bytes
  // changed within the same size and modification time (a write in the same clock tick).
  for (int i = 0; i < n; i++)
    if (out[i] < 0 || out[i] > d->max_token)
      return check_errf(err, n_err, "data shard %s changed while the run reads it: token %lld is %d, outside the "
                        "0..%d found at start-up; restore the shard and resume with checkpoint.resume=auto",
                        s->path, (long long)(off + i), out[i], d->max_token);
  return 0;
}

void data_close(data_loader *d) {
  if (d->shards) {
    for (int i = 0; i < d->n_shards; i++) data_shard_close(&d->shards[i]);
    free(d->shards);
  }
  free(d->window_start);
  free(d->window_shard);
  free(d->perm);
  memset(d, 0, sizeof *d);
  d->perm_epoch = -1;
}

// ---------------------------------------------------------------------------------------------
// Writer

int data_write_shard(const char *path, const int32_t *tokens, int64_t n_tokens, char *err, size_t n_err) {
  if (n_tokens < 0 || (n_tokens > 0 && !tokens)) {
    snprintf(err, n_err, "data_write_shard %s: %lld tokens at %p; expected a count >= 0 and a "
             "token array (a bug in the caller)", path, (long long)n_tokens, (const void *)tokens);
    return -1;
  }
  int32_t lo = 0, hi = 0;
  for (int64_t i = 0; i < n_tokens; i++) {
    lo = tokens[i] < lo ? tokens[i] : lo;
    hi = tokens[i] > hi ? tokens[i] : hi;
  }
  if (lo < 0) {
    snprintf(err, n_err, "data_write_shard %s: token id %d is negative; expected ids >= 0: fix "
             "the tokenizer output", path, lo);
    return -1;
  }
  uint32_t token_bytes = hi < 65536 ? 2 : 4;

  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
    snprintf(err, n_err, "data_write_shard: path '%s' is too long (%zu characters); expected "
             "at most %zu: write to a shorter path", path, strlen(path), sizeof tmp - 5);
    return -1;
  }
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(err, n_err, "cannot create %s: %s; expected a writable directory: create it or "
             "check its permissions", tmp, strerror(errno));
    return -1;
  }
  unsigned char h[DATA_TRN_HEADER_BYTES] = {0};
  memcpy(h, DATA_TRN_MAGIC, 8);
  data_put_le32(h + 8, DATA_TRN_VERSION);
  data_put_le32(h + 12, token_bytes);
  data_put_le64(h + 16, (uint64_t)n_tokens);
  int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
  if (token_bytes == 4) {
    ok = ok && fwrite(tokens, 4, (size_t)n_tokens, f) == (size_t)n_tokens;
  } else {
    // Narrow through a small buffer so a 100M-token shard never needs a second full copy.
    uint16_t buf[1 << 14];
    for (int64_t i = 0; ok && i < n_tokens; i += (int64_t)(sizeof buf / sizeof *buf)) {
      int64_t n = n_tokens - i < (int64_t)(sizeof buf / sizeof *buf) ? n_tokens - i
                                                                    : (int64_t)(sizeof buf / sizeof *buf);
      for (int64_t k = 0; k < n; k++) buf[k] = (uint16_t)tokens[i + k];
      ok = fwrite(buf, 2, (size_t)n, f) == (size_t)n;
    }
  }
  int write_errno = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    write_errno = errno;
  }
  if (!ok) {
    snprintf(err, n_err, "cannot write %lld tokens to %s: %s; expected %lld bytes to fit: free "
             "disk space or choose another output directory", (long long)n_tokens, tmp,
             strerror(write_errno), (long long)(DATA_TRN_HEADER_BYTES + n_tokens * token_bytes));
    remove(tmp);
    return -1;
  }
  // Rename is atomic: a reader sees the old shard or the whole new one, never half of it.
  if (rename(tmp, path) != 0) {
    snprintf(err, n_err, "cannot rename %s to %s: %s; expected a writable directory: check its "
             "permissions", tmp, path, strerror(errno));
    remove(tmp);
    return -1;
  }
  return 0;
}
