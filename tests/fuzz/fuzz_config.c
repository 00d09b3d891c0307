// Fuzz target: the config reader (app/config.c, app/config_rules.c). The first byte picks the
// path: even, the rest is a YAML file's text (cfg_load_string); odd, the rest is command-line
// overrides, one per line (cfg_load). Whatever the input, an error is one line, and a config
// that loads survives the round trip the checkpoints rely on: cfg_to_yaml, loaded again, gives
// the same text.
#include "app/config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const fuzz_dict[] = {
  "model:\n", "parallel:\n", "train:\n", "data:\n", "checkpoint:\n", "log:\n", "fp8:\n", "  dim: ",
  "  n_layers: ", "  steps: ", "  lr: ", "  seed: ", "  train: ", "  device: ", "  tie_embeddings: ",
  "model.dim=", "train.lr=", "train.seed=", "data.train=", "parallel.tp=", "train.eps=", ": ", "- ",
  "[", "]", "{", "}", ",", "&a ", "*a", "!!str ", "!t ", "<<: ", "---\n", "...\n", "%YAML 1.1\n", "#",
  "\"", "'", "\\x00", "\\u0000", "~", "null", "true", "1e40", "-0", "nan", "inf", "0x10",
  "18446744073709551616", "2147483648", "\t", "\r\n", "? ", "|\n  ", ">\n  ", "\xc2\x85", "\xe2\x80\xa8",
  "\xef\xbb\xbf", "\xff", "\xc3\xa9", "\\u2028", "\\x85", "\\N",
};
const int fuzz_n_dict = (int)(sizeof fuzz_dict / sizeof fuzz_dict[0]);

static void fuzz_check_one_line(const char *err) {
  if (strchr(err, '\n')) {
    fprintf(stderr, "fuzz_config: an error message spans lines: %s\n", err);
    abort();
  }
}

// cfg_to_yaml's text of c, malloc'd.
static char *fuzz_yaml_of(const cfg *c) {
  size_t n = cfg_to_yaml(c, NULL, 0) + 1;
  char *text = malloc(n);
  cfg_to_yaml(c, text, n);
  return text;
}

static void fuzz_round_trip(const cfg *c) {
  char err[1024] = "";
  char *text = fuzz_yaml_of(c);
  cfg again;
  if (cfg_load_string(&again, text, "round trip", err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_config: a loaded config does not load back from its own YAML: %s\n%s", err, text);
    abort();
  }
  char *text2 = fuzz_yaml_of(&again);
  if (strcmp(text, text2) != 0) {
    fprintf(stderr, "fuzz_config: the round trip changed the config:\n%s---\n%s", text, text2);
    abort();
  }
  free(text);
  free(text2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  char *text = malloc(size);  // the rest, NUL-terminated
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  cfg c;
  char err[1024] = "";
  int rc;
  if (data[0] % 2 == 0) {
    rc = cfg_load_string(&c, text, "fuzz.yaml", err, sizeof err);
  } else {
    char *args[64];
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 64; line = strtok(NULL, "\n")) args[n++] = line;
    rc = cfg_load(&c, NULL, n, args, err, sizeof err);
  }
  fuzz_check_one_line(err);
  if (rc == 0) {
    fuzz_round_trip(&c);
    err[0] = '\0';
    if (cfg_check_ranges(&c, err, sizeof err) == 0) cfg_validate(&c, 1 + data[0] % 16, err, sizeof err);
    fuzz_check_one_line(err);
  }
  free(text);
  return 0;
}
