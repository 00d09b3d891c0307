// Fuzz target: the token-shard reader (data/data.c). The input is written as a shard file and
// opened with a seq_len from its last byte; when it opens, windows across the first epochs are
// read and every token must lie within 0..max_token. Whatever the bytes, data_open either
// succeeds or returns a one-line message naming the file.
#include "data/data.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const fuzz_dict[] = {
  "TRNTOK\0\0", "\x01\0\0\0", "\x02\0\0\0", "\x04\0\0\0", "\x88\xd8\x34\x01", "\xc1\xcf\x34\x01",
  "\0\0\0\0\0\0\0\0", "\xff\xff\xff\xff\xff\xff\xff\x7f", "\xff\xff\xff\xff",
};
const int fuzz_n_dict = (int)(sizeof fuzz_dict / sizeof fuzz_dict[0]);

static char fuzz_dir[64], fuzz_path[256];

static void fuzz_cleanup(void) {
  unlink(fuzz_path);
  rmdir(fuzz_dir);
}

static void fuzz_fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_shard: %s: %s\n", what, detail);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fuzz_path[0]) {
    snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/fuzz_shard_XXXXXX");
    if (!mkdtemp(fuzz_dir)) fuzz_fail("mkdtemp", "cannot create a temporary folder");
    snprintf(fuzz_path, sizeof fuzz_path, "%s/shard.bin", fuzz_dir);
    atexit(fuzz_cleanup);
  }
  FILE *f = fopen(fuzz_path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) fuzz_fail("write", fuzz_path);
  int seq_len = size ? 1 + data[size - 1] % 16 : 4;
  data_loader d;
  char err[1024] = "";
  if (data_open(&d, fuzz_path, seq_len, 7, err, sizeof err) != 0) {
    if (strchr(err, '\n') || !strstr(err, fuzz_path)) fuzz_fail("a message that is not one line naming the shard", err);
    data_close(&d);
    return 0;
  }
  int32_t *window = malloc((size_t)(seq_len + 1) * sizeof *window);
  int64_t n_read = d.n_windows * 2 < 64 ? d.n_windows * 2 : 64;
  for (int64_t s = 0; s < n_read; s++) {
    if (data_get_window(&d, s * 7919 % (d.n_windows * 3), window, err, sizeof err) != 0)
      fuzz_fail("a window of an unchanged shard does not read", err);
    for (int i = 0; i <= seq_len; i++)
      if (window[i] < 0 || window[i] > d.max_token) fuzz_fail("a token outside 0..max_token", fuzz_path);
  }
  free(window);
  data_close(&d);
  data_close(&d);
  return 0;
}
