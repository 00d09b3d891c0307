// Strict JSON reader (recursive descent over a bounded depth) and writing helpers (json.h).
// Used for files another program wrote (safetensors headers, config.json), so every deviation
// from RFC 8259 is an error with its byte offset rather than a guess.
#include "kernels/base/json.h"
#include "kernels/base/check.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct json_reader {
  const unsigned char *s;
  size_t n, i;
  int depth, max_depth;
  char *err;
  size_t n_err;
} json_reader;

// Records the first error only; always returns -1.
static int json_fail(json_reader *r, const char *fmt, ...) {
  if (r->err && r->n_err && r->err[0] == '\0') {
    size_t k = (size_t)snprintf(r->err, r->n_err, "at byte %zu: ", r->i);
    va_list ap;
    va_start(ap, fmt);
    if (k < r->n_err) vsnprintf(r->err + k, r->n_err - k, fmt, ap);
    va_end(ap);
  }
  return -1;
}

// What stands at the read position, for messages: a printable character, or its byte value.
static const char *json_found(const json_reader *r, char buf[24]) {
  if (r->i >= r->n) return "the end of the text";
  unsigned char c = r->s[r->i];
  if (c >= 0x20 && c < 0x7f) snprintf(buf, 24, "'%c'", c);
  else snprintf(buf, 24, "byte 0x%02x", c);
  return buf;
}

static void json_skip_space(json_reader *r) {
  while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int json_expect(json_reader *r, char c, const char *what) {
  char buf[24];
  json_skip_space(r);
  if (r->i < r->n && r->s[r->i] == c) return r->i++, 0;
  return json_fail(r, "expected %s, found %s", what, json_found(r, buf));
}

// Appends a code point as UTF-8 to out (room for 4 bytes is the caller's).
static size_t json_put_utf8(char *out, uint32_t cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), 2;
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3f)), out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

static int json_hex4(json_reader *r, uint32_t *cp) {
  *cp = 0;
  for (int k = 0; k < 4; k++, r->i++) {
    if (r->i >= r->n) return json_fail(r, "expected 4 hex digits after \\u, found the end of the text");
    unsigned char c = r->s[r->i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) return json_fail(r, "expected 4 hex digits after \\u, found '%c'", c >= 0x20 && c < 0x7f ? c : '?');
    *cp = *cp * 16 + (uint32_t)v;
  }
  return 0;
}

// One escape after the backslash, appended to out; returns bytes written or -1.
static int json_escape(json_reader *r, char *out) {
  if (r->i >= r->n) return json_fail(r, "unfinished escape at the end of the text");
  unsigned char c = r->s[r->i++];
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  const char *p = c ? strchr(from, c) : NULL;
  if (p) return out[0] = to[p - from], 1;
  if (c != 'u') return r->i--, json_fail(r, "unknown escape '\\%c'", c >= 0x20 && c < 0x7f ? c : '?');
  uint32_t cp, lo;
  if (json_hex4(r, &cp)) return -1;
  if (cp >= 0xdc00 && cp <= 0xdfff) return json_fail(r, "\\u%04x is a lone low surrogate", (unsigned)cp);
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (r->i + 1 >= r->n || r->s[r->i] != '\\' || r->s[r->i + 1] != 'u')
      return json_fail(r, "\\u%04x (a high surrogate) is not followed by a low surrogate", (unsigned)cp);
    r->i += 2;
    if (json_hex4(r, &lo)) return -1;
    if (lo < 0xdc00 || lo > 0xdfff) return json_fail(r, "\\u%04x is not a low surrogate", (unsigned)lo);
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
  }
  if (cp == 0) return json_fail(r, "\\u0000 (a NUL character) is not accepted in strings");
  return (int)json_put_utf8(out, cp);
}

// Length of the well-formed UTF-8 sequence at s[0, n) (shortest form, no surrogates), or 0.
static size_t json_utf8_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1fu) : len == 3 ? (c & 0x0fu) : (c & 0x07u);
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[k] & 0x3fu);
  }
  static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

// A string at the read position (on its opening quote), into a malloc'd copy.
static char *json_string(json_reader *r) {
  if (json_expect(r, '"', "a string")) return NULL;
  size_t start = r->i, cap = 16, len = 0;
  char *out = malloc(cap);
  CHECK(out != NULL, "out of host memory reading JSON");
  for (;;) {
    if (len + 8 > cap) {
      out = realloc(out, cap *= 2);
      CHECK(out != NULL, "out of host memory reading JSON");
    }
    if (r->i >= r->n) {
      r->i = start - 1;
      json_fail(r, "string is not closed: expected '\"' before the end of the text");
      return free(out), NULL;
    }
    unsigned char c = r->s[r->i];
    if (c == '"') {
      r->i++;
      out[len] = '\0';
      return out;
    }
    if (c < 0x20) {
      json_fail(r, "control character 0x%02x inside a string (write it as an escape)", c);
      return free(out), NULL;
    }
    if (c == '\\') {
      r->i++;
      int k = json_escape(r, out + len);
      if (k < 0) return free(out), NULL;
      len += (size_t)k;
      continue;
    }
    size_t k = json_utf8_len(r->s + r->i, r->n - r->i);
    if (k == 0) {
      json_fail(r, "invalid UTF-8 inside a string");
      return free(out), NULL;
    }
    memcpy(out + len, r->s + r->i, k);
    len += k;
    r->i += k;
  }
}

static int json_is_digit(const json_reader *r, size_t i) { return i < r->n && r->s[i] >= '0' && r->s[i] <= '9'; }

// RFC 8259 number grammar; the value through strtod, integers also exactly.
static int json_number(json_reader *r, json_value *v) {
  size_t start = r->i, i = r->i;
  if (i < r->n && r->s[i] == '-') i++;
  if (!json_is_digit(r, i)) return r->i = i, json_fail(r, "expected a digit in a number");
  if (r->s[i] == '0' && json_is_digit(r, i + 1)) return r->i = i, json_fail(r, "number with a leading zero");
  while (json_is_digit(r, i)) i++;
  int is_int = 1;
  if (i < r->n && r->s[i] == '.') {
    is_int = 0;
    if (!json_is_digit(r, ++i)) return r->i = i, json_fail(r, "expected a digit after the decimal point");
    while (json_is_digit(r, i)) i++;
  }
  if (i < r->n && (r->s[i] == 'e' || r->s[i] == 'E')) {
    is_int = 0;
    i++;
    if (i < r->n && (r->s[i] == '+' || r->s[i] == '-')) i++;
    if (!json_is_digit(r, i)) return r->i = i, json_fail(r, "expected a digit in the exponent");
    while (json_is_digit(r, i)) i++;
  }
  char buf[64];
  if (i - start >= sizeof buf) return json_fail(r, "number longer than %zu characters", sizeof buf - 1);
  memcpy(buf, r->s + start, i - start);
  buf[i - start] = '\0';
  v->type = JSON_NUMBER;
  v->number = strtod(buf, NULL);
  if (is_int) {
    errno = 0;
    long long x = strtoll(buf, NULL, 10);
    v->is_int = errno != ERANGE;
    v->integer = v->is_int ? (int64_t)x : 0;
  }
  r->i = i;
  return 0;
}

static int json_value_at(json_reader *r, json_value *v);

static int json_array(json_reader *r, json_value *v) {
  size_t cap = 0;
  v->type = JSON_ARRAY;
  r->i++;
  json_skip_space(r);
  if (r->i < r->n && r->s[r->i] == ']') return r->i++, 0;
  for (;;) {
    if (v->n == cap) {
      cap = cap ? 2 * cap : 4;
      v->items = realloc(v->items, cap * sizeof *v->items);
      CHECK(v->items != NULL, "out of host memory reading JSON");
    }
    memset(&v->items[v->n], 0, sizeof *v->items);
    if (json_value_at(r, &v->items[v->n++])) return -1;
    json_skip_space(r);
    if (r->i < r->n && r->s[r->i] == ']') return r->i++, 0;
    if (json_expect(r, ',', "',' or ']' in an array")) return -1;
  }
}

static int json_object(json_reader *r, json_value *v) {
  size_t cap = 0;
  v->type = JSON_OBJECT;
  r->i++;
  json_skip_space(r);
  if (r->i < r->n && r->s[r->i] == '}') return r->i++, 0;
  for (;;) {
    if (v->n == cap) {
      cap = cap ? 2 * cap : 4;
      v->items = realloc(v->items, cap * sizeof *v->items);
      v->keys = realloc(v->keys, cap * sizeof *v->keys);
      CHECK(v->items && v->keys, "out of host memory reading JSON");
    }
    json_skip_space(r);
    size_t key_at = r->i;
    char *key = json_string(r);
    if (!key) return -1;
    memset(&v->items[v->n], 0, sizeof *v->items);
    v->keys[v->n++] = key;
    if (json_get(&(json_value){.type = JSON_OBJECT, .n = v->n - 1, .items = v->items, .keys = v->keys}, key))
      return r->i = key_at, json_fail(r, "key \"%s\" appears twice in one object", key);
    if (json_expect(r, ':', "':' after an object key")) return -1;
    if (json_value_at(r, &v->items[v->n - 1])) return -1;
    json_skip_space(r);
    if (r->i < r->n && r->s[r->i] == '}') return r->i++, 0;
    if (json_expect(r, ',', "',' or '}' in an object")) return -1;
  }
}

static int json_literal(json_reader *r, const char *word) {
  size_t k = strlen(word);
  if (r->n - r->i < k || memcmp(r->s + r->i, word, k) != 0) return -1;
  r->i += k;
  return 0;
}

static int json_value_at(json_reader *r, json_value *v) {
  char buf[24];
  json_skip_space(r);
  if (r->i >= r->n) return json_fail(r, "expected a value, found the end of the text");
  unsigned char c = r->s[r->i];
  if (c == '{' || c == '[') {
    if (++r->depth > r->max_depth) return json_fail(r, "nesting deeper than %d levels", r->max_depth);
    int rc = c == '{' ? json_object(r, v) : json_array(r, v);
    r->depth--;
    return rc;
  }
  if (c == '"') {
    v->type = JSON_STRING;
    v->string = json_string(r);
    return v->string ? 0 : -1;
  }
  if (c == '-' || (c >= '0' && c <= '9')) return json_number(r, v);
  if (json_literal(r, "true") == 0) return v->type = JSON_BOOL, v->boolean = 1, 0;
  if (json_literal(r, "false") == 0) return v->type = JSON_BOOL, 0;
  if (json_literal(r, "null") == 0) return v->type = JSON_NULL, 0;
  return json_fail(r, "expected a value (object, array, string, number, true, false or null), found %s",
                   json_found(r, buf));
}

static void json_free_children(json_value *v) {
  for (size_t k = 0; k < v->n; k++) {
    json_free_children(&v->items[k]);
    if (v->keys) free(v->keys[k]);
  }
  free(v->items);
  free(v->keys);
  free(v->string);
}

json_value *json_parse(const char *text, size_t n_text, int max_depth, char *err, size_t n_err) {
  if (err && n_err) err[0] = '\0';
  json_reader r = {(const unsigned char *)text, n_text, 0, 0, max_depth, err, n_err};
  json_value *v = calloc(1, sizeof *v);
  CHECK(v != NULL, "out of host memory reading JSON");
  int rc = json_value_at(&r, v);
  if (rc == 0) {
    json_skip_space(&r);
    char buf[24];
    if (r.i < r.n) rc = json_fail(&r, "expected the end of the text after the value, found %s", json_found(&r, buf));
  }
  if (rc != 0) {
    json_free(v);
    return NULL;
  }
  return v;
}

void json_free(json_value *v) {
  if (!v) return;
  json_free_children(v);
  free(v);
}

const json_value *json_get(const json_value *v, const char *key) {
  if (!v || v->type != JSON_OBJECT) return NULL;
  for (size_t k = 0; k < v->n; k++)
    if (strcmp(v->keys[k], key) == 0) return &v->items[k];
  return NULL;
}

const char *json_type_name(json_type t) {
  static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
  return t <= JSON_OBJECT ? names[t] : "an unknown value";
}

json_value *json_read_file(const char *path, size_t max_bytes, int max_depth, char *err, size_t n_err) {
  FILE *f = fopen(path, "rb");
  if (!f) return check_errf(err, n_err, "cannot open %s (%s)", path, strerror(errno)), NULL;
  char *text = XMALLOC(max_bytes + 1);
  size_t n = fread(text, 1, max_bytes + 1, f);
  int bad_read = ferror(f);
  fclose(f);
  json_value *v = NULL;
  char msg[512];
  if (bad_read) check_errf(err, n_err, "reading %s failed", path);
  else if (n > max_bytes) check_errf(err, n_err, "%s is larger than %zu bytes: not a model's JSON file", path, max_bytes);
  else if (!(v = json_parse(text, n, max_depth, msg, sizeof msg))) check_errf(err, n_err, "%s is not valid JSON: %s", path, msg);
  free(text);
  return v;
}

void json_put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
    if (*q == '"' || *q == '\\') fprintf(f, "\\%c", *q);
    else if (*q < 0x20) fprintf(f, "\\u%04x", *q);
    else fputc(*q, f);
  }
  fputc('"', f);
}

void json_float_text(float x, char buf[32]) {
  for (int digits = 6; digits <= 9; digits++) {
    snprintf(buf, 32, "%.*g", digits, (double)x);
    if ((float)strtod(buf, NULL) == x) return;
  }
}
