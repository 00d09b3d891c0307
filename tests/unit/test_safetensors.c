// The Hugging Face interop pieces on inputs whose answer is known: the strict JSON reader
// (what it accepts and every kind of text it refuses), the shortest float text, bf16 and fp16
// conversions at their edges, safetensors written and read back (whole and by blocks), every
// header defect the reader must refuse with a message naming the file, and the HF naming,
// shard plan and config.json checks.
#include "kernels/bf16.h"
#include "model/format/hf.h"
#include "model/format/hf_config.h"
#include "kernels/base/json.h"
#include "model/format/safetensors.h"
#include "tests/unit/test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[256];

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

static json_value *parse(const char *text, char *err, size_t n_err) {
  return json_parse(text, strlen(text), 8, err, n_err);
}

static void test_json_accepts(void) {
  char err[256];
  json_value *v = parse(" {\"a\": [1, -2.5e3, true, false, null], \"b\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\","
                        " \"big\": 9223372036854775807, \"huge\": 9223372036854775808, \"o\": {}} ", err, sizeof err);
  EXPECT(v != NULL, "valid JSON refused: %s", err);
  if (!v) return;
  const json_value *a = json_get(v, "a"), *b = json_get(v, "b"), *big = json_get(v, "big"), *huge = json_get(v, "huge");
  EXPECT(a && a->type == JSON_ARRAY && a->n == 5, "array");
  EXPECT(a && a->items[0].is_int && a->items[0].integer == 1 && !a->items[1].is_int && a->items[1].number == -2500,
         "numbers");
  EXPECT(a && a->items[2].type == JSON_BOOL && a->items[2].boolean && a->items[4].type == JSON_NULL, "literals");
  EXPECT(b && !strcmp(b->string, "x\xc3\xa9\xf0\x9f\x98\x80\n\""), "escapes and surrogate pair: '%s'", b ? b->string : "");
  EXPECT(big && big->is_int && big->integer == INT64_MAX, "int64 max");
  EXPECT(huge && !huge->is_int && huge->number > 9e18, "beyond int64 stays a double");
  EXPECT(json_get(v, "o") && json_get(v, "o")->type == JSON_OBJECT && !json_get(v, "missing"), "object lookups");
  json_free(v);
}

static void test_json_refuses(void) {
  static const struct {
    const char *text, *why;
  } bad[] = {
      {"", "expected a value"},
      {"[1, 2,]", "expected a value"},
      {"{\"a\": 1,}", "expected a string"},
      {"{\"a\": 1, \"a\": 2}", "appears twice"},
      {"[01]", "leading zero"},
      {"[1.]", "after the decimal point"},
      {"[1e]", "exponent"},
      {"[NaN]", "expected a value"},
      {"['a']", "expected a value"},
      {"\"abc", "not closed"},
      {"\"a\tb\"", "control character"},
      {"\"\\x\"", "unknown escape"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800x\"", "not followed by a low surrogate"},
      {"\"\\u0000\"", "NUL"},
      {"\"\xc3\x28\"", "invalid UTF-8"},
      {"\"\xed\xa0\x80\"", "invalid UTF-8"},
      {"{} x", "end of the text after the value"},
      {"[[[[[[[[[[1]]]]]]]]]]", "nesting deeper"},
      {"{\"a\" 1}", "':'"},
      {"// c\n{}", "expected a value"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    char err[256] = "";
    json_value *v = parse(bad[k].text, err, sizeof err);
    EXPECT(v == NULL && has(err, bad[k].why) && has(err, "at byte"), "'%s': %s (wanted '%s')", bad[k].text, err,
           bad[k].why);
    json_free(v);
  }
}

static void test_float_text(void) {
  static const struct {
    float x;
    const char *want;
  } cases[] = {{3e-4f, "0.0003"}, {1e-5f, "1e-05"}, {0.1f, "0.1"}, {10000.0f, "10000"}, {0.95f, "0.95"},
               {1e-8f, "1e-08"}, {0.0f, "0"}};
  char buf[32];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    json_float_text(cases[k].x, buf);
    EXPECT(!strcmp(buf, cases[k].want), "%.9g gave '%s', expected '%s'", (double)cases[k].x, buf, cases[k].want);
  }
  int bad = 0;
  uint32_t u = 12345;
  for (int k = 0; k < 200000; k++) {
    u = u * 1664525u + 1013904223u;
    float x;
    memcpy(&x, &u, sizeof x);
    if (!isfinite(x)) continue;
    json_float_text(x, buf);
    bad += (float)strtod(buf, NULL) != x || strlen(buf) > 16;
  }
  EXPECT(bad == 0, "%d random floats did not read back as themselves", bad);
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void test_conversions(void) {
  // bf16 rounds to nearest, ties to even; NaN stays NaN; the largest float rounds to infinity.
  EXPECT(k_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80, "tie rounds down to even");
  EXPECT(k_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82, "tie rounds up to even");
  EXPECT(k_f32_to_bf16(bits_f32(0x3f808001u)) == 0x3f81, "above the tie rounds up");
  EXPECT(k_f32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80, "float max rounds to inf");
  EXPECT(isnan(k_bf16_to_f32(k_f32_to_bf16(NAN))), "NaN stays NaN");
  static const struct {
    uint16_t h;
    float f;
  } f16[] = {{0x3c00, 1.0f}, {0xc000, -2.0f}, {0x0001, 0x1p-24f}, {0x03ff, 1023 * 0x1p-24f}, {0x0400, 0x1p-14f},
             {0x7bff, 65504.0f}, {0x7c00, INFINITY}, {0xfc00, -INFINITY}, {0x3555, 0x1.554p-2f}};
  for (size_t k = 0; k < sizeof f16 / sizeof f16[0]; k++)
    EXPECT(st_f16_to_f32(f16[k].h) == f16[k].f, "f16 0x%04x gave %a, expected %a", f16[k].h,
           (double)st_f16_to_f32(f16[k].h), (double)f16[k].f);
  EXPECT(isnan(st_f16_to_f32(0x7e00)) && signbit(st_f16_to_f32(0x8000)), "f16 NaN and -0");
}

static void path_in_tmp(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmp_dir, name); }

static void test_write_read(void) {
  char path[512], err[512];
  path_in_tmp(path, sizeof path, "rw.safetensors");
  st_entry e[2] = {{"m", ST_F32, 2, {5, 7}}, {"v", ST_BF16, 1, {9}}};
  float m[35], v[9];
  for (int i = 0; i < 35; i++) m[i] = (float)i * 0.25f - 3;
  for (int i = 0; i < 9; i++) v[i] = 1.0f + (float)i / 256;  // some are bf16 ties
  st_writer w;
  EXPECT(st_writer_open(&w, path, e, 2, err, sizeof err) == 0, "%s", err);
  EXPECT(st_writer_put(&w, m, err, sizeof err) == 0 && st_writer_put(&w, v, err, sizeof err) == 0, "%s", err);
  EXPECT(st_writer_close(&w, err, sizeof err) == 0, "%s", err);
  st_file f;
  EXPECT(st_open(&f, path, err, sizeof err) == 0, "%s", err);
  if (f.fd < 0) return;
  EXPECT(f.n_tensors == 2 && f.data_start % 8 == 0, "%d tensors, data at %lld", f.n_tensors, (long long)f.data_start);
  const st_tensor *tm = st_find(&f, "m"), *tv = st_find(&f, "v");
  float out[35];
  int bad = 0;
  EXPECT(tm && st_read_block(&f, tm, (int64_t[]){0, 0}, (int64_t[]){5, 7}, out, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 35; i++) bad += out[i] != m[i];
  EXPECT(tm && st_read_block(&f, tm, (int64_t[]){1, 2}, (int64_t[]){3, 4}, out, err, sizeof err) == 0, "%s", err);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 4; c++) bad += out[r * 4 + c] != m[(1 + r) * 7 + 2 + c];
  EXPECT(tv && st_read_block(&f, tv, (int64_t[]){3, 0}, (int64_t[]){4, 1}, out, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 4; i++) bad += out[i] != k_bf16_to_f32(k_f32_to_bf16(v[3 + i]));
  EXPECT(bad == 0, "%d values differ after the round trip", bad);
  st_close(&f);
  st_close(&f);
}

// Writes a file of the given header text (its length field says n_len, or the true length when
// n_len is 0) followed by n_data zero bytes.
static void write_raw(const char *path, const char *header, uint64_t n_len, size_t n_data) {
  FILE *f = fopen(path, "wb");
  uint64_t n = n_len ? n_len : strlen(header);
  for (int k = 0; k < 8; k++) fputc((int)(n >> (8 * k) & 0xff), f);
  fputs(header, f);
  for (size_t k = 0; k < n_data; k++) fputc(0, f);
  fclose(f);
}

static void expect_open_fails(const char *header, uint64_t n_len, size_t n_data, const char *why) {
  char path[512], err[512] = "";
  path_in_tmp(path, sizeof path, "bad.safetensors");
  write_raw(path, header, n_len, n_data);
  st_file f;
  EXPECT(st_open(&f, path, err, sizeof err) == -1 && has(err, why) && has(err, path), "'%s': %s (wanted '%s')", header,
         err, why);
  EXPECT(f.fd == -1, "a failed open leaves the file closed");
}

static void test_bad_files(void) {
  const char *ok = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  expect_open_fails(ok, 0, 4, "truncated: tensor 't' ends at byte 8");
  expect_open_fails(ok, 4096, 0, "truncated header: the length field says 4096 bytes");
  expect_open_fails(ok, (uint64_t)1 << 40, 0, "limit");
  expect_open_fails("{\"t\":", 0, 0, "not valid JSON");
  expect_open_fails("[1]", 0, 0, "must be a JSON object");
  expect_open_fails("{\"t\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "unknown dtype \"F33\"");
  expect_open_fails("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8, "give 12 bytes");
  expect_open_fails("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8, "data_offsets");
  expect_open_fails("{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8, "shape");
  expect_open_fails("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 0, 8,
                    "unexpected field \"x\"");
  expect_open_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12, "overlap");
  expect_open_fails("{\"__metadata__\":{\"format\":1}}", 0, 0, "__metadata__");
  expect_open_fails("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "appears twice");
  char path[512], err[512] = "";
  path_in_tmp(path, sizeof path, "short.safetensors");
  FILE *f = fopen(path, "wb");
  fputs("abc", f);
  fclose(f);
  st_file sf;
  EXPECT(st_open(&sf, path, err, sizeof err) == -1 && has(err, "truncated: 3 bytes"), "%s", err);
  // A valid file whose tensor is not a float type opens, but does not load as weights.
  path_in_tmp(path, sizeof path, "ints.safetensors");
  write_raw(path, "{\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 0, 8);
  EXPECT(st_open(&sf, path, err, sizeof err) == 0, "%s", err);
  float x;
  EXPECT(st_read_block(&sf, &sf.tensors[0], (int64_t[]){0, 0}, (int64_t[]){1, 1}, &x, err, sizeof err) == -1 &&
         has(err, "dtype I64"), "%s", err);
  st_close(&sf);
}

static const model_config tiny = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 128,
                                  .vocab_size = 256, .seq_len = 32, .norm_eps = 1e-5f, .rope_theta = 10000,
                                  .init_std = 0.02f};

static void test_names_and_shards(void) {
  hf_tensor *t = NULL;
  int n = hf_tensor_list(&tiny, &t);
  EXPECT(n == 1 + 2 * 9 + 2, "%d tensors", n);
  EXPECT(!strcmp(t[0].hf_name, "model.embed_tokens.weight") && !strcmp(t[0].name, "embed"), "embed first");
  EXPECT(!strcmp(t[3].hf_name, "model.layers.0.self_attn.k_proj.weight") && !strcmp(t[3].name, "layers.0.wk") &&
         t[3].full[0] == 32 && t[3].full[1] == 64, "k_proj (%s, %lld x %lld)", t[3].hf_name, (long long)t[3].full[0],
         (long long)t[3].full[1]);
  EXPECT(!strcmp(t[10].hf_name, "model.layers.1.input_layernorm.weight"), "layer 1 starts at 10: %s", t[10].hf_name);
  EXPECT(!strcmp(t[n - 2].hf_name, "model.norm.weight") && !strcmp(t[n - 1].hf_name, "lm_head.weight"), "tail");
  free(t);
  model_config tied = tiny;
  tied.tie_embeddings = 1;
  n = hf_tensor_list(&tied, &t);
  EXPECT(n == 20 && strcmp(t[n - 1].hf_name, "lm_head.weight") != 0, "tied: no lm_head");
  free(t);
  int64_t bytes[5] = {40, 50, 20, 200, 10};
  int shard[5];
  EXPECT(hf_plan_shards(bytes, 5, 100, shard) == 4 && shard[0] == 0 && shard[1] == 0 && shard[2] == 1 &&
         shard[3] == 2 && shard[4] == 3, "plan %d %d %d %d %d", shard[0], shard[1], shard[2], shard[3], shard[4]);
  EXPECT(hf_plan_shards(bytes, 5, 1000, shard) == 1 && shard[4] == 0, "one file");
  char name[64];
  hf_shard_name(1, 3, name, sizeof name);
  EXPECT(!strcmp(name, "model-00002-of-00003.safetensors"), "%s", name);
  hf_shard_name(0, 1, name, sizeof name);
  EXPECT(!strcmp(name, "model.safetensors"), "%s", name);
}

// Rewrites one line of dir/config.json (the line holding `key`) to `line`, or drops it when line is "".
static void edit_config(const char *dir, const char *key, const char *line) {
  char path[512], text[4096] = "", out[4096] = "";
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "rb");
  text[fread(text, 1, sizeof text - 1, f)] = '\0';
  fclose(f);
  for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
    const char *use = strstr(l, key) ? line : l;
    if (use[0]) strcat(strcat(out, use), "\n");
  }
  f = fopen(path, "wb");
  fputs(out, f);
  fclose(f);
}

static void expect_config(const char *dir, const model_config *mc, const char *why) {
  char err[1024] = "";
  int rc = hf_check_config(dir, mc, err, sizeof err);
  if (!why) EXPECT(rc == 0, "config refused: %s", err);
  else EXPECT(rc == -1 && has(err, why), "wanted '%s', got %d: %s", why, rc, err);
}

static void test_config_checks(void) {
  char dir[512], err[512];
  path_in_tmp(dir, sizeof dir, "hf");
  mkdir(dir, 0755);
  EXPECT(hf_write_config(dir, &tiny, "float32", err, sizeof err) == 0, "%s", err);
  expect_config(dir, &tiny, NULL);
  model_config other = tiny;
  other.dim = 128;
  other.ffn_dim = 256;
  expect_config(dir, &other, "hidden_size is 64 but model.dim is 128");
  other = tiny;
  other.n_kv_heads = 4;
  expect_config(dir, &other, "num_key_value_heads is 2 but model.n_kv_heads is 4");
  other = tiny;
  other.norm_eps = 1e-6f;
  expect_config(dir, &other, "rms_norm_eps is 1e-05 but model.norm_eps is 1e-06");
  other = tiny;
  other.tie_embeddings = 1;
  expect_config(dir, &other, "tie_word_embeddings is false but model.tie_embeddings is true");
  edit_config(dir, "\"num_key_value_heads\"", "");  // absent: as many kv heads as heads
  expect_config(dir, &tiny, "num_key_value_heads is 4 (the default) but model.n_kv_heads is 2");
  edit_config(dir, "\"rms_norm_eps\"", "");  // absent: transformers' default 1e-6
  edit_config(dir, "\"architectures\"", "  \"architectures\": [\"MistralForCausalLM\"],");
  expect_config(dir, &tiny, "architectures is [\"MistralForCausalLM\"], expected [\"LlamaForCausalLM\"]");
  EXPECT(hf_write_config(dir, &tiny, "float32", err, sizeof err) == 0, "%s", err);
  edit_config(dir, "\"rms_norm_eps\"", "");
  expect_config(dir, &tiny, "rms_norm_eps is 1e-06 (the default) but model.norm_eps is 1e-05");
  EXPECT(hf_write_config(dir, &tiny, "float32", err, sizeof err) == 0, "%s", err);
  edit_config(dir, "\"mlp_bias\"", "  \"mlp_bias\": true,");
  expect_config(dir, &tiny, "mlp_bias is true");
  edit_config(dir, "\"hidden_size\"", "  \"hidden_size\": 64.5,");
  expect_config(dir, &tiny, "hidden_size is not an integer");
  hf_dir h;
  EXPECT(hf_dir_open(&h, dir, err, sizeof err) == -1 && has(err, "holds neither model.safetensors"), "%s", err);
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  FILE *f = fopen(path, "wb");
  fputs("{\"weight_map\": {\"a\": \"../x.safetensors\"}}", f);
  fclose(f);
  EXPECT(hf_dir_open(&h, dir, err, sizeof err) == -1 && has(err, "must name a file in the same directory"), "%s", err);
}

// hf_read_config: every field mapped, defaults, transformers 5's rope_parameters, and the
// fields it refuses, each named.
static void expect_read(const char *dir, const char *why) {
  char err[1024] = "";
  hf_config hc;
  int rc = hf_read_config(dir, &hc, err, sizeof err);
  EXPECT(rc == -1 && has(err, why), "wanted '%s', got %d: %s", why, rc, err);
}

static void test_config_read(void) {
  char dir[512], err[1024] = "";
  path_in_tmp(dir, sizeof dir, "hfread");
  mkdir(dir, 0755);
  model_config m = tiny;
  m.n_kv_heads = 1, m.norm_eps = 3e-6f, m.rope_theta = 5e5f, m.tie_embeddings = 1, m.init_std = 0.01f, m.seq_len = 77;
  EXPECT(hf_write_config(dir, &m, "float32", err, sizeof err) == 0, "%s", err);
  hf_config hc;
  EXPECT(hf_read_config(dir, &hc, err, sizeof err) == 0, "%s", err);
  for (int f = 0; f < hf_n_fields; f++) {
    char a[32], b[32];
    hf_field_text(&hf_fields[f], &hc.mc, a);
    hf_field_text(&hf_fields[f], &m, b);
    EXPECT(hf_field_equal(&hf_fields[f], &hc.mc, &m) && (hc.present >> f & 1), "%s read back as %s, written %s",
           hf_fields[f].hf_key, a, b);
  }
  edit_config(dir, "\"rope_theta\"", "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 250000.0},");
  edit_config(dir, "\"initializer_range\"", "");
  edit_config(dir, "\"max_position_embeddings\"", "  \"bos_token_id\": 1, \"eos_token_id\": 2, \"transformers_version\": \"5.17.0\",");
  EXPECT(hf_read_config(dir, &hc, err, sizeof err) == 0 && hc.mc.rope_theta == 250000.0f && hc.mc.init_std == 0.02f &&
         hc.mc.seq_len == 2048 && !(hc.present >> 9 & 1), "rope_parameters, defaults and metadata: %s", err);
  edit_config(dir, "\"rope_parameters\"", "  \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0},");
  expect_read(dir, "rope_parameters.rope_type is not supported");
  static const struct {
    const char *key, *line, *why;
  } bad[] = {
      {"\"use_cache\"", "  \"sliding_window\": 4096,", "config.json: field 'sliding_window' is not one the trainer knows"},
      {"\"rope_scaling\"", "  \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0},", "rope_scaling is set"},
      {"\"attention_dropout\"", "  \"attention_dropout\": 0.1,", "attention_dropout is not 0"},
      {"\"head_dim\"", "  \"head_dim\": 32,", "head_dim is not hidden_size / num_attention_heads = 64 / 4"},
      {"\"hidden_act\"", "  \"hidden_act\": \"gelu\",", "hidden_act is not \"silu\""},
      {"\"attention_bias\"", "  \"attention_bias\": true,", "attention_bias is true"},
      {"\"num_hidden_layers\"", "  \"num_hidden_layers\": 0,", "num_hidden_layers is 0: expected a positive integer"},
      {"\"num_hidden_layers\"", "", "has no num_hidden_layers: not a Llama config"},
      {"\"model_type\"", "  \"model_type\": \"mistral\",", "model_type is \"mistral\", expected \"llama\""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    EXPECT(hf_write_config(dir, &m, "float32", err, sizeof err) == 0, "%s", err);
    edit_config(dir, bad[i].key, bad[i].line);
    expect_read(dir, bad[i].why);
  }
}

int main(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/test_safetensors_XXXXXX", base);
  if (!mkdtemp(tmp_dir)) return perror("mkdtemp"), 1;
  test_json_accepts();
  test_json_refuses();
  test_float_text();
  test_conversions();
  test_write_read();
  test_bad_files();
  test_names_and_shards();
  test_config_checks();
  test_config_read();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return test_summary();
}
