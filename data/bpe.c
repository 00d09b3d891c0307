// Byte-level BPE (see bpe.h). The pre-tokenizers' patterns are matched by hand, alternative by
// alternative in the pattern's order as a backtracking regex engine tries them, over code points;
// \p{L}, \p{N} and \s come from data/unicode_ranges.h.
#include "data/bpe.h"
#include "data/unicode_ranges.h"
#include "kernels/base/check.h"
#include "kernels/base/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// A hash map from byte strings to ids: the vocab, the merges (keyed by the pair's two ids) and the
// cache of encoded pre-tokens.

typedef struct strmap {
  char **keys;
  size_t *lens;
  int32_t *vals;
  size_t cap, n;  // cap: a power of two, at most half full
} strmap;

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static size_t strmap_slot(const strmap *m, const char *k, size_t n) {
  size_t i = fnv(k, n) & (m->cap - 1);
  while (m->keys[i] && (m->lens[i] != n || memcmp(m->keys[i], k, n) != 0)) i = (i + 1) & (m->cap - 1);
  return i;
}

static void strmap_grow(strmap *m) {
  strmap old = *m;
  m->cap = old.cap ? old.cap * 2 : 1024;
  m->keys = XCALLOC(m->cap, sizeof *m->keys);
  m->lens = XCALLOC(m->cap, sizeof *m->lens);
  m->vals = XCALLOC(m->cap, sizeof *m->vals);
  for (size_t i = 0; i < old.cap; i++) {
    if (!old.keys[i]) continue;
    size_t j = strmap_slot(m, old.keys[i], old.lens[i]);
    m->keys[j] = old.keys[i], m->lens[j] = old.lens[i], m->vals[j] = old.vals[i];
  }
  free(old.keys), free(old.lens), free(old.vals);
}

// Sets k -> v (the key copied); returns 0, or -1 when k was there already.
static int strmap_put(strmap *m, const char *k, size_t n, int32_t v) {
  if (2 * (m->n + 1) > m->cap) strmap_grow(m);
  size_t i = strmap_slot(m, k, n);
  if (m->keys[i]) return -1;
  m->keys[i] = XMALLOC(n + 1);
  memcpy(m->keys[i], k, n);
  m->keys[i][n] = '\0';
  m->lens[i] = n, m->vals[i] = v, m->n++;
  return 0;
}

static int32_t strmap_get(const strmap *m, const char *k, size_t n) {
  if (!m->cap) return -1;
  size_t i = strmap_slot(m, k, n);
  return m->keys[i] ? m->vals[i] : -1;
}

static void strmap_free(strmap *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
  free(m->keys), free(m->lens), free(m->vals);
  memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// Unicode.

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < r[mid][0]) hi = mid;
    else if (c > r[mid][1]) lo = mid + 1;
    else return 1;
  }
  return 0;
}
#define N_OF(a) (sizeof(a) / sizeof(a[0]))
static int is_letter(uint32_t c) { return in_ranges(unicode_letters, N_OF(unicode_letters), c); }
static int is_number(uint32_t c) { return in_ranges(unicode_numbers, N_OF(unicode_numbers), c); }
static int is_space(uint32_t c) { return in_ranges(unicode_spaces, N_OF(unicode_spaces), c); }
static int is_other(uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }
static int is_newline(uint32_t c) { return c == '\r' || c == '\n'; }

// The code point at s[0, n) and its length in bytes; a byte that does not start valid UTF-8 is
// a code point of its own, outside Unicode (so in no category), of length 1.
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
  uint32_t c = s[0];
  if (c < 0x80) return *len = 1, c;
  int k = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (k < 0 || (size_t)k >= n) return *len = 1, 0x110000 + c;
  c &= 0x3F >> k;
  for (int i = 1; i <= k; i++) {
    if ((s[i] & 0xC0) != 0x80) return *len = 1, 0x110000 + s[0];
    c = c << 6 | (s[i] & 0x3F);
  }
  static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
  if (c < min[k] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return *len = 1, 0x110000 + s[0];
  return *len = (size_t)k + 1, c;
}

static size_t utf8_put(uint32_t c, char *out) {
  if (c < 0x80) return out[0] = (char)c, 1;
  if (c < 0x800) return out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), 2;
  return out[0] = (char)(0xE0 | c >> 12), out[1] = (char)(0x80 | (c >> 6 & 0x3F)), out[2] = (char)(0x80 | (c & 0x3F)), 3;
}

// ---------------------------------------------------------------------------------------------
// The pre-tokenizers' patterns. Each returns the end of the match at i (code points), > i.

typedef enum bpe_split { SPLIT_GPT2, SPLIT_LLAMA3 } bpe_split;

// GPT-2's and the ByteLevel pre-tokenizer's (use_regex):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Llama 3's Split:
static const char llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static uint32_t lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's 't 're 've 'm 'll 'd at i (fold: any case): the end, or i.
static size_t contraction(const uint32_t *c, size_t n, size_t i, int fold) {
  if (c[i] != '\'' || i + 1 >= n) return i;
  uint32_t a = fold ? lower(c[i + 1]) : c[i + 1], b = i + 2 < n ? (fold ? lower(c[i + 2]) : c[i + 2]) : 0;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return i;
}

static size_t run(const uint32_t *c, size_t n, size_t i, int (*cls)(uint32_t)) {
  while (i < n && cls(c[i])) i++;
  return i;
}

// \s+(?!\S), else \s+, at a whitespace code point i.
static size_t spaces(const uint32_t *c, size_t n, size_t i) {
  size_t k = run(c, n, i, is_space);
  return k == n || k - 1 == i ? k : k - 1;
}

static size_t match_gpt2(const uint32_t *c, size_t n, size_t i) {
  size_t e = contraction(c, n, i, 0);
  if (e > i) return e;
  size_t j = i + (c[i] == ' ' && i + 1 < n);
  if (is_letter(c[j])) return run(c, n, j, is_letter);
  if (is_number(c[j])) return run(c, n, j, is_number);
  if (is_other(c[j])) return run(c, n, j, is_other);
  return spaces(c, n, i);  // c[i] is whitespace: a lone ' ' before whitespace or the end
}

static size_t match_llama3(const uint32_t *c, size_t n, size_t i) {
  size_t e = contraction(c, n, i, 1);
  if (e > i) return e;
  if (is_letter(c[i])) return run(c, n, i, is_letter);
  if (!is_newline(c[i]) && !is_number(c[i]) && i + 1 < n && is_letter(c[i + 1])) return run(c, n, i + 1, is_letter);
  if (is_number(c[i])) return i + 1 < n && is_number(c[i + 1]) ? (i + 2 < n && is_number(c[i + 2]) ? i + 3 : i + 2) : i + 1;
  size_t j = i + (c[i] == ' ' && i + 1 < n);
  if (is_other(c[j])) return run(c, n, run(c, n, j, is_other), is_newline);
  size_t k = run(c, n, i, is_space), last = n;  // \s*[\r\n]+: up to the run's last newline
  for (size_t p = i; p < k; p++)
    if (is_newline(c[p])) last = p;
  if (last < n) return last + 1;
  return spaces(c, n, i);
}

// ---------------------------------------------------------------------------------------------
// The tokenizer.

struct bpe {
  strmap vocab;            // byte-level strings (UTF-8 of the mapped characters) -> id
  strmap merges;           // the ids (a, b) of a merge's parts, as 8 bytes -> its rank
  int32_t *merged;         // (ranks) the id each merge makes
  char **text;             // (n_ids) each id's string: byte-level for the vocab, raw for added tokens
  size_t *text_len;
  unsigned char *added;    // (n_ids) 1 for an added token
  int32_t n_ids;
  int32_t byte_id[256];    // the token of each single byte
  uint32_t byte_char[256]; // GPT-2's bytes_to_unicode
  int16_t char_byte[324];  // its inverse over the characters it uses
  bpe_split split;
  int prefix_space, ignore_merges;
  const char **added_text; // the added tokens, longest first
  size_t *added_len;
  int32_t *added_id;
  int n_added;
  unsigned char added_first[256];  // bytes some added token starts with
  strmap cache;            // a pre-token's bytes -> offset of its ids in cache_ids
  int32_t *cache_ids;
  int64_t n_cache, cap_cache;
};

static void byte_map(bpe *b) {
  int n = 0;
  for (int c = 0; c < 256; c++) {
    int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    b->byte_char[c] = printable ? (uint32_t)c : (uint32_t)(256 + n++);
  }
  memset(b->char_byte, -1, sizeof b->char_byte);
  for (int c = 0; c < 256; c++) b->char_byte[b->byte_char[c]] = (int16_t)c;
}

static int fail(char *err, size_t n_err, const char *path, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(err, n_err, "tokenizer %s: %s", path, msg);
  return -1;
}

static void set_text(bpe *b, int32_t id, const char *s, size_t n, int added) {
  free(b->text[id]);
  b->text[id] = XMALLOC(n + 1);
  memcpy(b->text[id], s, n);
  b->text[id][n] = '\0';
  b->text_len[id] = n;
  b->added[id] = (unsigned char)added;
}

// The pre-tokenizer: GPT-2's ByteLevel (use_regex) or Llama 3's Split + ByteLevel.
static int read_pre_tokenizer(bpe *b, const json_value *p, const char *path, char *err, size_t n_err) {
  const json_value *type = json_get(p, "type");
  const char *t = type && type->type == JSON_STRING ? type->string : "";
  if (!strcmp(t, "ByteLevel")) {
    const json_value *re = json_get(p, "use_regex"), *ps = json_get(p, "add_prefix_space");
    if (re && re->type == JSON_BOOL && !re->boolean)
      return fail(err, n_err, path, "a ByteLevel pre-tokenizer without its split pattern (use_regex false) is not "
                                    "supported; GPT-2's and Llama 3's byte-level tokenizers are");
    b->split = SPLIT_GPT2;
    b->prefix_space = ps && ps->type == JSON_BOOL && ps->boolean;
    return 0;
  }
  const json_value *list = json_get(p, "pretokenizers");
  if (!strcmp(t, "Sequence") && list && list->type == JSON_ARRAY && list->n == 2) {
    const json_value *s = &list->items[0], *bl = &list->items[1], *pat = json_get(json_get(s, "pattern"), "Regex");
    const json_value *st = json_get(s, "type"), *blt = json_get(bl, "type"), *beh = json_get(s, "behavior");
    const json_value *re = json_get(bl, "use_regex"), *ps = json_get(bl, "add_prefix_space");
    if (st && st->type == JSON_STRING && !strcmp(st->string, "Split") && pat && pat->type == JSON_STRING &&
        !strcmp(pat->string, llama3_pattern) && beh && beh->type == JSON_STRING && !strcmp(beh->string, "Isolated") &&
        blt && blt->type == JSON_STRING && !strcmp(blt->string, "ByteLevel") && re && re->type == JSON_BOOL &&
        !re->boolean) {
      b->split = SPLIT_LLAMA3;
      b->prefix_space = ps && ps->type == JSON_BOOL && ps->boolean;
      return 0;
    }
  }
  return fail(err, n_err, path, "pre-tokenizer '%s' is not one this trainer reads: it reads GPT-2's ByteLevel "
                                "(pattern %s) and Llama 3's Split (pattern %s) followed by ByteLevel",
              t[0] ? t : "(none)", gpt2_pattern, llama3_pattern);
}

// vocab, merges and added tokens.
static int read_vocab(bpe *b, const json_value *model, const json_value *added, const char *path, char *err,
                      size_t n_err) {
  const json_value *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
  if (!vocab || vocab->type != JSON_OBJECT || !merges || merges->type != JSON_ARRAY)
    return fail(err, n_err, path, "model.vocab (an object) or model.merges (an array) is missing");
  int64_t max_id = -1;
  for (size_t i = 0; i < vocab->n; i++) {
    const json_value *v = &vocab->items[i];
    if (v->type != JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer >= INT32_MAX)
      return fail(err, n_err, path, "vocab entry '%s' has no valid id", vocab->keys[i]);
    if (v->integer > max_id) max_id = v->integer;
  }
  for (size_t i = 0; added && i < added->n; i++) {
    const json_value *id = json_get(&added->items[i], "id"), *c = json_get(&added->items[i], "content");
    if (!id || id->type != JSON_NUMBER || !id->is_int || id->integer < 0 || id->integer >= INT32_MAX || !c ||
        c->type != JSON_STRING || !c->string[0])
      return fail(err, n_err, path, "added_tokens entry %zu has no valid id or content", i);
    if (id->integer > max_id) max_id = id->integer;
  }
  b->n_ids = (int32_t)(max_id + 1);
  b->text = XCALLOC((size_t)b->n_ids, sizeof *b->text);
  b->text_len = XCALLOC((size_t)b->n_ids, sizeof *b->text_len);
  b->added = XCALLOC((size_t)b->n_ids, 1);
  for (size_t i = 0; i < vocab->n; i++) {
    const char *k = vocab->keys[i];
    if (strmap_put(&b->vocab, k, strlen(k), (int32_t)vocab->items[i].integer) != 0)
      return fail(err, n_err, path, "vocab entry '%s' appears twice", k);
    set_text(b, (int32_t)vocab->items[i].integer, k, strlen(k), 0);
  }
  b->merged = XCALLOC(merges->n + 1, sizeof *b->merged);
  for (size_t r = 0; r < merges->n; r++) {
    const json_value *m = &merges->items[r];
    const char *a = NULL, *bb = NULL;
    char buf[1024];
    if (m->type == JSON_STRING) {  // "a b"
      const char *sp = strchr(m->string, ' ');
      if (sp && strlen(m->string) < sizeof buf) {
        memcpy(buf, m->string, strlen(m->string) + 1);
        buf[sp - m->string] = '\0';
        a = buf, bb = buf + (sp - m->string) + 1;
      }
    } else if (m->type == JSON_ARRAY && m->n == 2 && m->items[0].type == JSON_STRING && m->items[1].type == JSON_STRING) {
      a = m->items[0].string, bb = m->items[1].string;
    }
    if (!a) return fail(err, n_err, path, "merge %zu is neither \"a b\" nor [\"a\", \"b\"]", r);
    char joined[2048];
    size_t la = strlen(a), lb = strlen(bb);
    if (la + lb >= sizeof joined) return fail(err, n_err, path, "merge %zu is too long", r);
    memcpy(joined, a, la), memcpy(joined + la, bb, lb);
    int32_t ia = strmap_get(&b->vocab, a, la), ib = strmap_get(&b->vocab, bb, lb),
            ij = strmap_get(&b->vocab, joined, la + lb);
    if (ia < 0 || ib < 0 || ij < 0)
      return fail(err, n_err, path, "merge %zu ('%s' + '%s') refers to a token not in the vocab ('%s'): the merges "
                                    "and the vocab do not belong together", r, a, bb, ia < 0 ? a : ib < 0 ? bb : "the merged one");
    const int32_t key[2] = {ia, ib};
    b->merged[r] = ij;
    (void)strmap_put(&b->merges, (const char *)key, sizeof key, (int32_t)r);  // a repeated merge keeps its first rank
  }
  return 0;
}

static int read_added(bpe *b, const json_value *added) {
  b->n_added = added ? (int)added->n : 0;
  b->added_text = XCALLOC((size_t)b->n_added + 1, sizeof *b->added_text);
  b->added_len = XCALLOC((size_t)b->n_added + 1, sizeof *b->added_len);
  b->added_id = XCALLOC((size_t)b->n_added + 1, sizeof *b->added_id);
  for (int i = 0; i < b->n_added; i++) {
    const char *c = json_get(&added->items[i], "content")->string;
    int32_t id = (int32_t)json_get(&added->items[i], "id")->integer;
    b->added_text[i] = c, b->added_len[i] = strlen(c), b->added_id[i] = id;
    set_text(b, id, c, strlen(c), 1);
    b->added_first[(unsigned char)c[0]] = 1;
  }
  for (int i = 1; i < b->n_added; i++)  // longest first: the longest match wins
    for (int j = i; j > 0 && b->added_len[j] > b->added_len[j - 1]; j--) {
      const char *t = b->added_text[j];
      size_t l = b->added_len[j];
      int32_t d = b->added_id[j];
      b->added_text[j] = b->added_text[j - 1], b->added_len[j] = b->added_len[j - 1], b->added_id[j] = b->added_id[j - 1];
      b->added_text[j - 1] = t, b->added_len[j - 1] = l, b->added_id[j - 1] = d;
    }
  return 0;
}


bpe *bpe_load(const char *path, char *err, size_t n_err) {
  json_value *root = json_read_file(path, (size_t)1 << 30, 64, err, n_err);
  if (!root) return NULL;
  bpe *b = XCALLOC(1, sizeof *b);
  byte_map(b);
  const json_value *model = json_get(root, "model"), *type = json_get(model, "type");
  const json_value *norm = json_get(root, "normalizer"), *pre = json_get(root, "pre_tokenizer");
  const json_value *added = json_get(root, "added_tokens"), *im = json_get(model, "ignore_merges");
  int rc = 0;
  if (!model || !type || type->type != JSON_STRING)
    rc = fail(err, n_err, path, "no model.type: not a Hugging Face tokenizer.json");
  else if (strcmp(type->string, "BPE") != 0)
    rc = fail(err, n_err, path, "model type %s is not supported: only byte-level BPE tokenizers (model type BPE) are",
              type->string);
  else if (norm && norm->type != JSON_NULL)
    rc = fail(err, n_err, path, "a normalizer is not supported (GPT-2's and Llama 3's tokenizers have none)");
  else if (!pre || pre->type != JSON_OBJECT)
    rc = fail(err, n_err, path, "no pre_tokenizer: a byte-level BPE tokenizer has one (ByteLevel)");
  else if (added && added->type != JSON_ARRAY)
    rc = fail(err, n_err, path, "added_tokens is not an array");
  if (rc == 0) rc = read_pre_tokenizer(b, pre, path, err, n_err);
  if (rc == 0) rc = read_vocab(b, model, added, path, err, n_err);
  if (rc == 0) rc = read_added(b, added);
  b->ignore_merges = im && im->type == JSON_BOOL && im->boolean;
  for (int c = 0; rc == 0 && c < 256; c++) {
    char s[4];
    size_t n = utf8_put(b->byte_char[c], s);
    if ((b->byte_id[c] = strmap_get(&b->vocab, s, n)) < 0)
      rc = fail(err, n_err, path, "the vocab has no token for byte 0x%02x: not a byte-level vocab", c);
  }
  if (rc != 0) {
    json_free(root);
    b->n_added = 0;
    bpe_free(b);
    return NULL;
  }
  // The added tokens' texts point into the parsed file: copy them out, then drop it.
  for (int i = 0; i < b->n_added; i++) b->added_text[i] = b->text[b->added_id[i]];
  json_free(root);
  return b;
}

void bpe_free(bpe *b) {
  if (!b) return;
  strmap_free(&b->vocab);
  strmap_free(&b->cache);
  strmap_free(&b->merges);
  free(b->merged);
  for (int32_t i = 0; i < b->n_ids; i++) free(b->text[i]);
  free(b->text), free(b->text_len), free(b->added);
  free(b->added_text), free(b->added_len), free(b->added_id);
  free(b->cache_ids);
  free(b);
}

int32_t bpe_vocab_size(const bpe *b) { return b->n_ids; }

int32_t bpe_token_id(const bpe *b, const char *s) {
  for (int i = 0; i < b->n_added; i++)
    if (!strcmp(b->added_text[i], s)) return b->added_id[i];
  return strmap_get(&b->vocab, s, strlen(s));
}

// ---------------------------------------------------------------------------------------------
// Encoding.

// The merge of the ids (a, c): its rank, *merged the id it makes; or -1.
static int32_t pair_get(const bpe *b, int32_t a, int32_t c, int32_t *merged) {
  const int32_t key[2] = {a, c};
  const int32_t r = strmap_get(&b->merges, (const char *)key, sizeof key);
  if (r >= 0) *merged = b->merged[r];
  return r;
}

// p grown to n_bytes (realloc), or the run ends with a message.
static void *grow(void *p, size_t n_bytes) {
  void *q = realloc(p, n_bytes);
  CHECK(q != NULL, "tokenizer: out of memory growing a buffer to %zu bytes", n_bytes);
  return q;
}

static void push(int32_t **ids, int64_t *n, int64_t *cap, int32_t v) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 4096;
    *ids = grow(*ids, (size_t)*cap * sizeof **ids);
  }
  (*ids)[(*n)++] = v;
}

// The ids of one pre-token w[0, n) (its bytes), from the cache or by merging.
static void encode_word(bpe *b, const unsigned char *w, size_t n, int32_t **ids, int64_t *n_ids, int64_t *cap) {
  int32_t at = strmap_get(&b->cache, (const char *)w, n);
  if (at < 0) {
    int32_t *sym = XMALLOC(n * sizeof *sym);
    size_t ns = 0;
    if (b->ignore_merges) {  // the whole pre-token, where the vocab has it
      char *s = XMALLOC(2 * n + 1);
      size_t k = 0;
      for (size_t i = 0; i < n; i++) k += utf8_put(b->byte_char[w[i]], s + k);
      int32_t whole = strmap_get(&b->vocab, s, k);
      free(s);
      if (whole >= 0) sym[ns++] = whole;
    }
    if (!ns) {
      for (size_t i = 0; i < n; i++) sym[ns++] = b->byte_id[w[i]];
      for (;;) {  // merge every occurrence of the lowest-ranked pair, left to right
        int32_t best = -1, merged = -1, m;
        for (size_t i = 0; i + 1 < ns; i++) {
          int32_t r = pair_get(b, sym[i], sym[i + 1], &m);
          if (r >= 0 && (best < 0 || r < best)) best = r, merged = m;
        }
        if (best < 0) break;
        int32_t a = sym[0], x = -1;
        size_t k = 0;
        for (size_t i = 0; i < ns; i++) {
          a = sym[i];
          if (i + 1 < ns && pair_get(b, a, sym[i + 1], &x) == best) sym[k++] = merged, i++;
          else sym[k++] = a;
        }
        ns = k;
      }
    }
    at = (int32_t)b->n_cache;
    push(&b->cache_ids, &b->n_cache, &b->cap_cache, (int32_t)ns);
    for (size_t i = 0; i < ns; i++) push(&b->cache_ids, &b->n_cache, &b->cap_cache, sym[i]);
    strmap_put(&b->cache, (const char *)w, n, at);
    free(sym);
  }
  for (int32_t i = 0; i < b->cache_ids[at]; i++) push(ids, n_ids, cap, b->cache_ids[at + 1 + i]);
}

// Text without added tokens: pre-tokens, each encoded.
static void encode_plain(bpe *b, const unsigned char *s, size_t n, int32_t **ids, int64_t *n_ids, int64_t *cap) {
  if (!n) return;
  uint32_t *cp = XMALLOC((n + 1) * sizeof *cp);
  size_t *off = XMALLOC((n + 2) * sizeof *off), nc = 0;
  for (size_t i = 0, len; i < n; i += len) off[nc] = i, cp[nc++] = utf8_next(s + i, n - i, &len);
  off[nc] = n;
  for (size_t i = 0; i < nc;) {
    size_t e = b->split == SPLIT_GPT2 ? match_gpt2(cp, nc, i) : match_llama3(cp, nc, i);
    encode_word(b, s + off[i], off[e] - off[i], ids, n_ids, cap);
    i = e;
  }
  free(cp), free(off);
}

void bpe_encode(bpe *b, const char *text, size_t n, int32_t **ids, int64_t *n_ids, int64_t *cap) {
  const unsigned char *s = (const unsigned char *)text;
  unsigned char *with_space = NULL;
  if (b->prefix_space && n && s[0] != ' ') {  // ByteLevel's add_prefix_space
    with_space = XMALLOC(n + 1);
    with_space[0] = ' ';
    memcpy(with_space + 1, s, n);
    s = with_space, n++;
  }
  size_t start = 0;
  for (size_t i = 0; i < n; i++) {
    if (!b->added_first[s[i]]) continue;
    for (int k = 0; k < b->n_added; k++) {
      if (b->added_len[k] > n - i || memcmp(s + i, b->added_text[k], b->added_len[k]) != 0) continue;
      encode_plain(b, s + start, i - start, ids, n_ids, cap);
      push(ids, n_ids, cap, b->added_id[k]);
      start = i + b->added_len[k];
      i = start - 1;
      break;
    }
  }
  encode_plain(b, s + start, n - start, ids, n_ids, cap);
  free(with_space);
}

// ---------------------------------------------------------------------------------------------
// Decoding.

int bpe_decode(const bpe *b, const int32_t *ids, int64_t n, char **out, size_t *n_out, size_t *cap) {
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= b->n_ids || !b->text[ids[i]]) return -1;
    const unsigned char *t = (const unsigned char *)b->text[ids[i]];
    size_t len = b->text_len[ids[i]];
    if (*n_out + len + 1 > *cap) {
      *cap = (*n_out + len + 1) * 2;
      *out = grow(*out, *cap);
    }
    if (b->added[ids[i]]) {
      memcpy(*out + *n_out, t, len);
      *n_out += len;
      continue;
    }
    for (size_t j = 0, l; j < len; j += l) {
      uint32_t c = utf8_next(t + j, len - j, &l);
      (*out)[(*n_out)++] = c < N_OF(b->char_byte) && b->char_byte[c] >= 0 ? (char)b->char_byte[c] : '?';
    }
  }
  return 0;
}
