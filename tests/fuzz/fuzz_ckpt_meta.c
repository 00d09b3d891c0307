// Fuzz target: the checkpoint metadata reader (model/format/ckpt.c's ckpt_load with no tensors, which
// reads and checks the root attributes, and ckpt_find_latest), then the stored config through
// cfg_load_string, as a resume does. The input is not HDF5 bytes (HDF5's own file parser is not
// this project's code): it is a list of root attributes, each
//   [name index] [type] [shape] [length] [length value bytes]
// (names: format, format_version, complete, step, samples_seen, seed, config_yaml; types:
// int8/int32/int64/uint64/float32/float64, fixed and variable-length strings; shape: scalar,
// 1 to 3 points, or the null dataspace), which this target writes with HDF5 into a
// ckpt_00000001.h5. Whatever the attributes, loading either succeeds or returns a one-line
// message; it never aborts.
#include "app/config.h"
#include "model/format/ckpt.h"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const fuzz_dict[] = {
  "trainer-checkpoint", "\x01\x01\x00\x04\x02\x00\x00\x00", "\x02\x01\x00\x04\x01\x00\x00\x00",
  "\x03\x02\x00\x08", "\x06\x05\x00", "model:\n  dim: 64\n", "\xff\xff\xff\xff\xff\xff\xff\x7f",
  "\x00\x00\x00\x80", "\x00\x00\xc0\x7f",
};
const int fuzz_n_dict = (int)(sizeof fuzz_dict / sizeof fuzz_dict[0]);

static const char *const fuzz_names[] = {"format", "format_version", "complete", "step", "samples_seen", "seed",
                                         "config_yaml"};
enum { FUZZ_N_NAMES = 7 };

static char fuzz_dir[64], fuzz_path[128];

static void fuzz_fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_ckpt_meta: %s: %s\n", what, detail);
  abort();
}

// MPI is not finalized: Open MPI unloads its components there, and the leak report would lose
// the names that tests/fuzz/lsan.supp matches its start-up allocations by.
static void fuzz_cleanup(void) {
  unlink(fuzz_path);
  rmdir(fuzz_dir);
}

static void fuzz_init(void) {
  int argc = 0;
  char **argv = NULL;
  MPI_Init(&argc, &argv);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);  // this target's own HDF5 calls fail quietly
  snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/fuzz_ckpt_XXXXXX");
  if (!mkdtemp(fuzz_dir)) fuzz_fail("mkdtemp", "cannot create a temporary folder");
  snprintf(fuzz_path, sizeof fuzz_path, "%s/ckpt_00000001.h5", fuzz_dir);
  atexit(fuzz_cleanup);
}

// One attribute from the record at *p (n bytes left); returns the bytes it used, 0 at the end.
static size_t fuzz_write_attribute(hid_t file, const uint8_t *p, size_t n) {
  if (n < 4) return 0;
  const char *name = fuzz_names[p[0] % FUZZ_N_NAMES];
  int type = p[1] % 8, shape = p[2] % 5;
  size_t len = p[3] < n - 4 ? p[3] : n - 4;
  const uint8_t *value = p + 4;
  static const hid_t *const numeric[6] = {&H5T_NATIVE_INT8_g, &H5T_NATIVE_INT32_g, &H5T_NATIVE_INT64_g,
                                          &H5T_NATIVE_UINT64_g, &H5T_NATIVE_FLOAT_g, &H5T_NATIVE_DOUBLE_g};
  hsize_t n_points = shape == 0 || shape == 4 ? 1 : (hsize_t)shape;
  hid_t space = shape == 0 ? H5Screate(H5S_SCALAR) : shape == 4 ? H5Screate(H5S_NULL)
                                                                : H5Screate_simple(1, &n_points, NULL);
  hid_t dtype;
  char *text = NULL;
  uint8_t numbers[3 * 8] = {0};
  const void *buf;
  if (type < 6) {
    H5open();
    dtype = H5Tcopy(*numeric[type]);
    memcpy(numbers, value, len < sizeof numbers ? len : sizeof numbers);
    buf = numbers;
  } else {
    text = calloc(3, len + 1);  // n_points strings of len bytes (fixed) or one pointer each (variable)
    for (hsize_t i = 0; i < n_points; i++) memcpy(text + i * (len + 1), value, len);
    dtype = H5Tcopy(H5T_C_S1);
    if (type == 6) {
      H5Tset_size(dtype, len + 1);
      buf = text;
    } else {
      H5Tset_size(dtype, H5T_VARIABLE);
      static char *ptrs[3];
      for (hsize_t i = 0; i < 3; i++) ptrs[i] = text + i * (len + 1);
      buf = ptrs;
    }
  }
  if (H5Aexists(file, name) == 0) {
    hid_t a = H5Acreate2(file, name, dtype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      if (shape != 4) H5Awrite(a, dtype, buf);
      H5Aclose(a);
    }
  }
  H5Tclose(dtype);
  H5Sclose(space);
  free(text);
  return 4 + len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fuzz_dir[0]) fuzz_init();
  hid_t file = H5Fcreate(fuzz_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) fuzz_fail("cannot create", fuzz_path);
  for (size_t at = 0, used; at < size && (used = fuzz_write_attribute(file, data + at, size - at)) > 0;) at += used;
  H5Fclose(file);

  char err[1024] = "", latest[512];
  ckpt_meta meta = {0};
  if (ckpt_load(fuzz_path, MPI_COMM_SELF, NULL, 0, &meta, err, sizeof err) == 0) {
    cfg c;
    char cfg_err[1024] = "";
    cfg_load_string(&c, meta.config_yaml, "checkpoint config", cfg_err, sizeof cfg_err);
    if (strchr(cfg_err, '\n')) fuzz_fail("a config message spans lines", cfg_err);
    free((void *)meta.config_yaml);
  } else if (strchr(err, '\n') || !err[0]) {
    fuzz_fail("a load error that is not one line", err);
  }
  // Its warning for a file it skips would come every run: stderr is muted for the call (replay
  // the saved input to see the report of a failure in it).
  fflush(stderr);
  int saved = dup(2), null_fd = open("/dev/null", O_WRONLY);
  dup2(null_fd, 2);
  int found = ckpt_find_latest(fuzz_dir, INT64_MAX, latest, sizeof latest, NULL);
  dup2(saved, 2);
  close(saved);
  close(null_fd);
  if (found < 0) fuzz_fail("ckpt_find_latest", latest);
  return 0;
}
