// Byte-level BPE (data/bpe.c) against the fixtures of tests/fixtures/bpe: two small tokenizers
// trained on KJV text, one with GPT-2's pre-tokenizer and "a b" merges, one with Llama 3's
// Split pattern, [a, b] merges and ignore_merges, and the ids of 163 texts (KJV verses, then
// contractions in both cases, numbers, runs of spaces, tabs and newlines, CRLF, letters and
// digits outside ASCII, emoji, an added token inside and between words) as the independent
// reference (tests/tools/bpe_reference.py, the patterns run by Python's regex module) gives
// them. Then the same texts against the Hugging Face tokenizers library itself: two tokenizers its
// BpeTrainer made from the whole KJV text (the same two pre-tokenizers, the added token at id 0)
// and the ids its encode() gives (scripts/tools/bpe_hf_fixtures.py). Each text must encode to the
// same ids and decode back to itself byte for byte. Then the bad inputs: a WordPiece model, a merge of unknown tokens, another pre-tokenizer, a vocab
// without every byte, a file that is not JSON.
#include "data/bpe.h"
#include "kernels/base/json.h"
#include "tests/unit/test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *src_dir(void) {
  const char *s = getenv("TRAINER_SOURCE_DIR");
  return s ? s : ".";
}

// style names the fixture pair <style>_style.json and <style>_cases.json; eot_id is where the
// trainer that made it put the added token <|endoftext|>.
static void check_cases(const char *style, int eot_id) {
  char tok_path[1024], cases_path[1024], err[1024] = "";
  snprintf(tok_path, sizeof tok_path, "%s/tests/fixtures/bpe/%s_style.json", src_dir(), style);
  snprintf(cases_path, sizeof cases_path, "%s/tests/fixtures/bpe/%s_cases.json", src_dir(), style);
  bpe *b = bpe_load(tok_path, err, sizeof err);
  EXPECT(b != NULL, "%s: %s", style, err);
  json_value *cases = json_read_file(cases_path, (size_t)1 << 24, 8, err, sizeof err);
  EXPECT(cases && cases->type == JSON_ARRAY && cases->n > 100, "%s: cases: %s", style, err);
  if (!b || !cases) return;
  int n_same = 0, n_round = 0;
  int64_t n_tokens = 0;
  for (size_t i = 0; i < cases->n; i++) {
    const char *text = json_get(&cases->items[i], "text")->string;
    const json_value *want = json_get(&cases->items[i], "ids");
    int32_t *ids = NULL;
    int64_t n_ids = 0, cap = 0;
    bpe_encode(b, text, strlen(text), &ids, &n_ids, &cap);
    int same = n_ids == (int64_t)want->n;
    for (int64_t k = 0; same && k < n_ids; k++) same = ids[k] == (int32_t)want->items[k].integer;
    if (!same) {
      fprintf(stderr, "%s case %zu: '%.60s': %lld ids, want %zu; first difference:", style, i, text,
              (long long)n_ids, want->n);
      for (int64_t k = 0; k < n_ids && k < (int64_t)want->n; k++)
        if (ids[k] != (int32_t)want->items[k].integer) {
          fprintf(stderr, " at %lld: %d, want %lld", (long long)k, ids[k], (long long)want->items[k].integer);
          break;
        }
      fprintf(stderr, "\n");
    }
    n_same += same;
    char *out = NULL;
    size_t n_out = 0, cap_out = 0;
    int rc = bpe_decode(b, ids, n_ids, &out, &n_out, &cap_out);
    n_round += rc == 0 && n_out == strlen(text) && memcmp(out, text, n_out) == 0;
    n_tokens += n_ids;
    free(out);
    free(ids);
  }
  EXPECT(n_same == (int)cases->n, "%s: %d of %zu texts encode to the fixture's ids", style, n_same, cases->n);
  EXPECT(n_round == (int)cases->n, "%s: %d of %zu texts decode back to themselves", style, n_round, cases->n);
  EXPECT(bpe_token_id(b, "<|endoftext|>") == (eot_id < 0 ? bpe_vocab_size(b) - 1 : eot_id), "%s: the added token's id",
         style);
  printf("%s: %zu texts, %lld tokens, vocab %d\n", style, cases->n, (long long)n_tokens, bpe_vocab_size(b));
  json_free(cases);
  bpe_free(b);
}

// Writes text to a temporary file and loads it as a tokenizer: the error, "" when it loads.
static void load_text(const char *text, char *err, size_t n_err) {
  char path[] = "/tmp/test_bpe_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
    perror("test_bpe: temporary file");
    exit(1);
  }
  close(fd);
  err[0] = '\0';
  bpe *b = bpe_load(path, err, n_err);
  bpe_free(b);
  unlink(path);
}

static void check_bad_input(void) {
  char err[1024];
  // The smallest byte-level vocab: every byte's character; then variants of it.
  char vocab[8192] = "{";
  for (int c = 0, n = 0; c < 256; c++) {
    int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    unsigned cp = printable ? (unsigned)c : 256u + (unsigned)n++;
    char u[8];
    if (cp == '"' || cp == '\\') snprintf(u, sizeof u, "\\%c", (char)cp);
    else if (cp < 0x80) snprintf(u, sizeof u, "%c", (char)cp);
    else snprintf(u, sizeof u, "%c%c", (char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)));
    snprintf(vocab + strlen(vocab), sizeof vocab - strlen(vocab), "%s\"%s\": %d", c ? ", " : "", u, c);
  }
  strcat(vocab, "}");
  const char *pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
  char text[16384];
  snprintf(text, sizeof text, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"a b\"]}, \"pre_tokenizer\": %s}",
           vocab, pre);
  load_text(text, err, sizeof err);
  EXPECT(strstr(err, "merge 0 ('a' + 'b') refers to a token not in the vocab"), "unknown merge: '%s'", err);
  snprintf(text, sizeof text, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": []}, \"pre_tokenizer\": %s}",
           vocab, pre);
  load_text(text, err, sizeof err);
  EXPECT(err[0] == '\0', "the byte vocab alone loads: '%s'", err);
  load_text("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", err, sizeof err);
  EXPECT(strstr(err, "model type WordPiece is not supported"), "WordPiece: '%s'", err);
  snprintf(text, sizeof text, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": []}, \"pre_tokenizer\": "
           "{\"type\": \"Metaspace\"}}", vocab);
  load_text(text, err, sizeof err);
  EXPECT(strstr(err, "pre-tokenizer 'Metaspace' is not one this trainer reads"), "Metaspace: '%s'", err);
  load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
            "{\"type\": \"ByteLevel\"}}", err, sizeof err);
  EXPECT(strstr(err, "the vocab has no token for byte 0x00"), "byte vocab: '%s'", err);
  load_text("not json", err, sizeof err);
  EXPECT(err[0] != '\0', "not JSON: no error");
}

int main(void) {
  check_cases("gpt2", -1);  // the reference puts the added token last
  check_cases("llama3", -1);
  check_cases("hf_gpt2", 0);  // tokenizers' BpeTrainer puts its special tokens first
  check_cases("hf_llama3", 0);
  check_bad_input();
  return test_summary();
}
