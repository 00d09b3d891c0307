// Safetensors reader and writer (safetensors.h). The reader trusts nothing in the header: the
// length is bounded by the file and a fixed limit, the JSON is parsed strictly, and every
// tensor's dtype, shape and byte range are checked against each other and the file before a
// byte of data is read.
#include "model/format/safetensors.h"
#include "kernels/bf16.h"
#include "kernels/base/check.h"
#include "kernels/base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies bytes as they are"
#endif

static const struct {
  const char *name;
  int n_bytes;
} st_dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},   [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8}, [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(st_dtype d) { return d < ST_N_DTYPES ? st_dtypes[d].name : "?"; }
int st_dtype_bytes(st_dtype d) { return d < ST_N_DTYPES ? st_dtypes[d].n_bytes : 0; }

// "safetensors file <path>: <message>" into err; returns -1.
static int st_fail(const char *path, char *err, size_t n_err, const char *fmt, ...) {
  if (!err || !n_err) return -1;
  size_t k = (size_t)snprintf(err, n_err, "safetensors file %s: ", path);
  if (k < n_err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, n_err - k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

// Reads exactly n bytes at off; 0, or -1 with errno set (EIO standing for an early end).
static int st_pread_all(int fd, void *buf, size_t n, int64_t off) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = pread(fd, p, n, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;
      return -1;
    }
    p += k, n -= (size_t)k, off += k;
  }
  return 0;
}

float st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = h >> 10 & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | man << 13;  // inf, NaN (payload kept)
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise into float's range
      int e = -1;
      do man <<= 1, e++;
      while (!(man & 0x400u));
      u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Header validation

static int st_dims(const json_value *a, int64_t *out, int max, int *n_out) {
  if (!a || a->type != JSON_ARRAY || (int)a->n > max) return -1;
  for (size_t k = 0; k < a->n; k++) {
    const json_value *x = &a->items[k];
    if (x->type != JSON_NUMBER || !x->is_int || x->integer < 0) return -1;
    out[k] = x->integer;
  }
  *n_out = (int)a->n;
  return 0;
}

// One member of the header: name -> {dtype, shape, data_offsets}. n_data: bytes after the header.
static int st_parse_entry(st_file *f, const char *name, const json_value *v, int64_t n_data, st_tensor *t, char *err,
                          size_t n_err) {
  if (!name[0]) return st_fail(f->path, err, n_err, "a tensor has an empty name in the header");
  if (v->type != JSON_OBJECT)
    return st_fail(f->path, err, n_err, "tensor '%s': expected an object {dtype, shape, data_offsets}, found %s",
                   name, json_type_name(v->type));
  for (size_t k = 0; k < v->n; k++)
    if (strcmp(v->keys[k], "dtype") && strcmp(v->keys[k], "shape") && strcmp(v->keys[k], "data_offsets"))
      return st_fail(f->path, err, n_err, "tensor '%s': unexpected field \"%s\" (expected dtype, shape, data_offsets)",
                     name, v->keys[k]);
  const json_value *dt = json_get(v, "dtype");
  if (!dt || dt->type != JSON_STRING) return st_fail(f->path, err, n_err, "tensor '%s': dtype missing or not a string", name);
  t->dtype = ST_N_DTYPES;
  for (int d = 0; d < ST_N_DTYPES; d++)
    if (strcmp(dt->string, st_dtypes[d].name) == 0) t->dtype = (st_dtype)d;
  if (t->dtype == ST_N_DTYPES)
    return st_fail(f->path, err, n_err, "tensor '%s': unknown dtype \"%s\"", name, dt->string);
  if (st_dims(json_get(v, "shape"), t->shape, ST_MAX_DIMS, &t->ndim) != 0)
    return st_fail(f->path, err, n_err, "tensor '%s': shape must be a list of at most %d non-negative integers", name,
                   ST_MAX_DIMS);
  int64_t off[2];
  int n_off = 0;
  if (st_dims(json_get(v, "data_offsets"), off, 2, &n_off) != 0 || n_off != 2 || off[0] > off[1])
    return st_fail(f->path, err, n_err, "tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end", name);
  t->begin = off[0], t->end = off[1];
  int64_t n_bytes = st_dtypes[t->dtype].n_bytes;
  for (int d = 0; d < t->ndim; d++)
    if (__builtin_mul_overflow(n_bytes, t->shape[d], &n_bytes))
      return st_fail(f->path, err, n_err, "tensor '%s': shape too large", name);
  if (n_bytes != t->end - t->begin)
    return st_fail(f->path, err, n_err, "tensor '%s': shape and dtype %s give %lld bytes but data_offsets [%lld, %lld] "
                   "span %lld",
                   name, st_dtypes[t->dtype].name, (long long)n_bytes, (long long)t->begin, (long long)t->end,
                   (long long)(t->end - t->begin));
  if (t->end > n_data)
    return st_fail(f->path, err, n_err, "truncated: tensor '%s' ends at byte %lld of the data but the file holds only "
                   "%lld bytes of data (%lld missing); copy or download the file again",
                   name, (long long)t->end, (long long)n_data, (long long)(t->end - n_data));
  t->name = strdup(name);
  CHECK(t->name != NULL, "out of host memory");
  return 0;
}

static int st_cmp_begin(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

// No two tensors share a byte (empty tensors share nothing).
static int st_check_overlap(st_file *f, char *err, size_t n_err) {
  const st_tensor **v = XMALLOC((size_t)f->n_tensors * sizeof *v + 1);
  for (int k = 0; k < f->n_tensors; k++) v[k] = &f->tensors[k];
  qsort(v, (size_t)f->n_tensors, sizeof *v, st_cmp_begin);
  int rc = 0;
  const st_tensor *prev = NULL;
  for (int k = 0; k < f->n_tensors && rc == 0; k++) {
    if (v[k]->begin == v[k]->end) continue;
    if (prev && v[k]->begin < prev->end)
      rc = st_fail(f->path, err, n_err, "tensors '%s' [%lld, %lld) and '%s' [%lld, %lld) overlap in the data",
                   prev->name, (long long)prev->begin, (long long)prev->end, v[k]->name, (long long)v[k]->begin,
                   (long long)v[k]->end);
    prev = v[k];
  }
  free(v);
  return rc;
}

static int st_parse_header(st_file *f, const char *text, size_t n_text, char *err, size_t n_err) {
  char msg[512];
  json_value *root = json_parse(text, n_text, 8, msg, sizeof msg);
  if (!root) return st_fail(f->path, err, n_err, "header is not valid JSON (%s)", msg);
  int rc = 0;
  if (root->type != JSON_OBJECT)
    rc = st_fail(f->path, err, n_err, "header must be a JSON object, found %s", json_type_name(root->type));
  f->tensors = XCALLOC(root->n + 1, sizeof *f->tensors);
  int64_t n_data = f->n_file_bytes - f->data_start;
  for (size_t k = 0; k < root->n && rc == 0; k++) {
    const json_value *v = &root->items[k];
    if (strcmp(root->keys[k], "__metadata__") == 0) {
      for (size_t j = 0; v->type == JSON_OBJECT && j < v->n && rc == 0; j++)
        if (v->items[j].type != JSON_STRING) rc = -1;
      if (v->type != JSON_OBJECT || rc != 0)
        rc = st_fail(f->path, err, n_err, "__metadata__ must be an object of strings");
      continue;
    }
    rc = st_parse_entry(f, root->keys[k], v, n_data, &f->tensors[f->n_tensors], err, n_err);
    if (rc == 0) f->n_tensors++;
  }
  json_free(root);
  return rc == 0 ? st_check_overlap(f, err, n_err) : rc;
}

int st_open(st_file *f, const char *path, char *err, size_t n_err) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  snprintf(f->path, sizeof f->path, "%s", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return st_fail(path, err, n_err, "cannot open it (%s)", strerror(errno));
  f->fd = fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return st_close(f), st_fail(path, err, n_err, "not a regular file");
  f->n_file_bytes = st.st_size;
  uint8_t len_le[8];
  if (f->n_file_bytes < 8 || st_pread_all(fd, len_le, 8, 0) != 0)
    return st_close(f), st_fail(path, err, n_err, "truncated: %lld bytes, but a safetensors file starts with an "
                                "8-byte header length", (long long)f->n_file_bytes);
  uint64_t n_header = 0;
  for (int k = 7; k >= 0; k--) n_header = n_header << 8 | len_le[k];
  uint64_t n_after = (uint64_t)f->n_file_bytes - 8;
  if (n_header > ST_MAX_HEADER_BYTES)
    return st_close(f), st_fail(path, err, n_err, "header length %llu is over the %d MiB limit: not a safetensors "
                                "file, or a damaged one", (unsigned long long)n_header, ST_MAX_HEADER_BYTES >> 20);
  if (n_header > n_after)
    return st_close(f), st_fail(path, err, n_err, "truncated header: the length field says %llu bytes but only %llu "
                                "follow; copy or download the file again",
                                (unsigned long long)n_header, (unsigned long long)n_after);
  if (n_header < 2) return st_close(f), st_fail(path, err, n_err, "header of %llu bytes cannot hold a JSON object",
                                                (unsigned long long)n_header);
  f->data_start = 8 + (int64_t)n_header;
  char *text = XMALLOC((size_t)n_header);
  int rc = st_pread_all(fd, text, (size_t)n_header, 8);
  if (rc != 0) rc = st_fail(path, err, n_err, "reading the header failed (%s)", strerror(errno));
  if (rc == 0) rc = st_parse_header(f, text, (size_t)n_header, err, n_err);
  free(text);
  if (rc != 0) st_close(f);
  return rc;
}

void st_close(st_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  for (int k = 0; f->tensors && k < f->n_tensors; k++) free(f->tensors[k].name);
  free(f->tensors);
  f->tensors = NULL;
  f->n_tensors = 0;
}

const st_tensor *st_find(const st_file *f, const char *name) {
  for (int k = 0; k < f->n_tensors; k++)
    if (strcmp(f->tensors[k].name, name) == 0) return &f->tensors[k];
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// Reading data

// n elements from element index first of t, converted to fp32, in pieces of bounded size.
static int st_read_span(const st_file *f, const st_tensor *t, int64_t first, int64_t n, float *out, char *err,
                        size_t n_err) {
  enum { PIECE = 1 << 20 };
  const int es = st_dtypes[t->dtype].n_bytes;
  uint8_t *buf = t->dtype == ST_F32 ? NULL : XMALLOC((size_t)(n < PIECE ? n : PIECE) * (size_t)es + 1);
  int rc = 0;
  for (int64_t done = 0; done < n && rc == 0; done += PIECE) {
    int64_t k = n - done < PIECE ? n - done : PIECE;
    float *dst = out + done;
    void *raw = buf ? (void *)buf : (void *)dst;  // fp32 lands in place
    if (st_pread_all(f->fd, raw, (size_t)(k * es), f->data_start + t->begin + (first + done) * es) != 0) {
      rc = st_fail(f->path, err, n_err, "reading tensor '%s' failed (%s): the file changed or is damaged", t->name,
                   errno == EIO ? "it ended early" : strerror(errno));
      break;
    }
    const uint16_t *h = (const uint16_t *)buf;
    if (t->dtype == ST_BF16)
      for (int64_t i = 0; i < k; i++) dst[i] = k_bf16_to_f32(h[i]);
    else if (t->dtype == ST_F16)
      for (int64_t i = 0; i < k; i++) dst[i] = st_f16_to_f32(h[i]);
  }
  free(buf);
  return rc;
}

int st_read_block(const st_file *f, const st_tensor *t, const int64_t start[2], const int64_t count[2], float *out,
                  char *err, size_t n_err) {
  if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
    return st_fail(f->path, err, n_err, "tensor '%s' has dtype %s; weights load from F32, BF16 or F16", t->name,
                   st_dtypes[t->dtype].name);
  if (t->ndim != 1 && t->ndim != 2)
    return st_fail(f->path, err, n_err, "tensor '%s' has %d dimensions, expected 1 or 2", t->name, t->ndim);
  // A vector is one row.
  int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
  int64_t r0 = t->ndim == 2 ? start[0] : 0, nr = t->ndim == 2 ? count[0] : 1;
  int64_t c0 = start[t->ndim - 1], nc = count[t->ndim - 1];
  CHECK(r0 >= 0 && nr >= 0 && r0 + nr <= rows && c0 >= 0 && nc >= 0 && c0 + nc <= cols,
        "st_read_block: block rows [%lld, %lld) cols [%lld, %lld) outside tensor '%s' (%lld, %lld)", (long long)r0,
        (long long)(r0 + nr), (long long)c0, (long long)(c0 + nc), t->name, (long long)rows, (long long)cols);
  if (c0 == 0 && nc == cols) return st_read_span(f, t, r0 * cols, nr * cols, out, err, n_err);
  for (int64_t r = 0; r < nr; r++)
    if (st_read_span(f, t, (r0 + r) * cols + c0, nc, out + r * nc, err, n_err) != 0) return -1;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Writing

int64_t st_entry_bytes(const st_entry *e) {
  int64_t n = st_dtypes[e->dtype].n_bytes;
  for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
  return n;
}

// The JSON header, padded with spaces so that the data starts 8-byte aligned.
static char *st_header_text(const st_entry *entries, int n_entries, size_t *n_text) {
  char *text = NULL;
  FILE *m = open_memstream(&text, n_text);
  CHECK(m != NULL, "open_memstream failed: out of host memory");
  fprintf(m, "{\"__metadata__\":{\"format\":\"pt\"}");
  int64_t off = 0;
  for (int k = 0; k < n_entries; k++) {
    const st_entry *e = &entries[k];
    fputc(',', m);
    json_put_string(m, e->name);
    fprintf(m, ":{\"dtype\":\"%s\",\"shape\":[", st_dtypes[e->dtype].name);
    for (int d = 0; d < e->ndim; d++) fprintf(m, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    int64_t n = st_entry_bytes(e);
    fprintf(m, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + n));
    off += n;
  }
  fputc('}', m);
  CHECK(fclose(m) == 0, "open_memstream: out of host memory");
  size_t padded = (*n_text + 7) / 8 * 8;
  text = realloc(text, padded + 1);
  CHECK(text != NULL, "out of host memory");
  memset(text + *n_text, ' ', padded - *n_text);
  *n_text = padded;
  return text;
}

int st_writer_open(st_writer *w, const char *path, const st_entry *entries, int n_entries, char *err, size_t n_err) {
  memset(w, 0, sizeof *w);
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
  w->entries = entries;
  w->n_entries = n_entries;
  for (int k = 0; k < n_entries; k++) {
    CHECK(entries[k].dtype == ST_F32 || entries[k].dtype == ST_BF16, "st_writer: entry '%s' has dtype %s; writes F32 "
          "or BF16", entries[k].name, st_dtypes[entries[k].dtype].name);
    w->n_data_bytes += st_entry_bytes(&entries[k]);
  }
  size_t n_text = 0;
  char *text = st_header_text(entries, n_entries, &n_text);
  w->f = fopen(w->tmp, "wb");
  if (!w->f) return free(text), st_fail(w->tmp, err, n_err, "cannot create it (%s)", strerror(errno));
  uint8_t len_le[8];
  for (int k = 0; k < 8; k++) len_le[k] = (uint8_t)((uint64_t)n_text >> (8 * k));
  int ok = fwrite(len_le, 1, 8, w->f) == 8 && fwrite(text, 1, n_text, w->f) == n_text;
  free(text);
  if (!ok) {
    int e = errno;
    st_writer_abort(w);
    return st_fail(path, err, n_err, "writing the header failed (%s): is the disk full?", strerror(e));
  }
  return 0;
}

int st_writer_put(st_writer *w, const float *data, char *err, size_t n_err) {
  CHECK(w->f && w->next < w->n_entries, "st_writer_put: no entry left to write in %.400s", w->path);
  const st_entry *e = &w->entries[w->next++];
  int64_t n = st_entry_bytes(e) / st_dtypes[e->dtype].n_bytes;
  int ok = 1;
  if (e->dtype == ST_F32) {
    ok = fwrite(data, sizeof(float), (size_t)n, w->f) == (size_t)n;
  } else {
    enum { PIECE = 1 << 16 };
    uint16_t buf[PIECE];
    for (int64_t done = 0; done < n && ok; done += PIECE) {
      int64_t k = n - done < PIECE ? n - done : PIECE;
      for (int64_t i = 0; i < k; i++) buf[i] = k_f32_to_bf16(data[done + i]);
      ok = fwrite(buf, sizeof(uint16_t), (size_t)k, w->f) == (size_t)k;
    }
  }
  if (!ok) {
    int eno = errno;
    st_writer_abort(w);
    return st_fail(w->path, err, n_err, "writing tensor '%s' failed (%s): is the disk full?", e->name, strerror(eno));
  }
  return 0;
}

int st_writer_close(st_writer *w, char *err, size_t n_err) {
  CHECK(w->f && w->next == w->n_entries, "st_writer_close: %d of %d entries written to %.400s", w->next, w->n_entries,
        w->path);
  int ok = fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
  int eno = errno;
  ok = fclose(w->f) == 0 && ok;
  w->f = NULL;
  if (ok && rename(w->tmp, w->path) != 0) ok = 0, eno = errno;
  if (!ok) {
    unlink(w->tmp);
    return st_fail(w->path, err, n_err, "finishing the file failed (%s): is the disk full?", strerror(eno));
  }
  return 0;
}

void st_writer_abort(st_writer *w) {
  if (w->f) {
    fclose(w->f);
    w->f = NULL;
    unlink(w->tmp);
  }
}
