// Test tool: damages a checkpoint in one known way, for the tests of verified loading.
//   ckpt_damage FILE flip DATASET             flip one bit of the dataset's middle element on disk
//   ckpt_damage FILE set DATASET INDEX VALUE  write VALUE (e.g. inf) at a flat index and refresh the
//                                             dataset's crc32c, so only finiteness is wrong
//   ckpt_damage FILE attr NAME VALUE          set an int64 root attribute (step, samples_seen)
//   ckpt_damage FILE v2                       remove every crc32c and say format_version 2
// Exit 0 when done, 1 when the file could not be changed.
#include "model/format/ckpt_crc.h"

#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int flip_bit(const char *path, hid_t file, const char *name) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0) return 1;
  haddr_t off = H5Dget_offset(d);
  hid_t s = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(s);
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(file);
  if (off == HADDR_UNDEF) return 1;
  int fd = open(path, O_RDWR);
  off_t at = (off_t)off + (off_t)(n / 2) * 4 + 1;
  unsigned char b;
  int ok = fd >= 0 && pread(fd, &b, 1, at) == 1;
  b ^= 0x10;
  ok = ok && pwrite(fd, &b, 1, at) == 1;
  if (fd >= 0) close(fd);
  return !ok;
}

static int set_value(hid_t file, const char *name, long long index, float value) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0) return 1;
  hid_t s = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(s);
  float *x = malloc((size_t)n * sizeof(float));
  int rc = index < 0 || index >= n || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) < 0;
  if (!rc) {
    x[index] = value;
    uint32_t crc = ckpt_crc32c(0, x, (size_t)n * sizeof(float));
    hid_t a = H5Aopen(d, "crc32c", H5P_DEFAULT);
    rc = H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) < 0 || a < 0 ||
         H5Awrite(a, H5T_NATIVE_UINT32, &crc) < 0;
    if (a >= 0) H5Aclose(a);
  }
  free(x);
  H5Sclose(s);
  H5Dclose(d);
  return rc;
}

static int set_attr(hid_t file, const char *name, long long value) {
  hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  int64_t v = value;
  int rc = a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &v) < 0;
  if (a >= 0) H5Aclose(a);
  return rc;
}

static herr_t strip_crc(hid_t loc, const char *name, const H5O_info_t *info, void *op) {
  (void)op;
  if (info->type == H5O_TYPE_DATASET && H5Aexists_by_name(loc, name, "crc32c", H5P_DEFAULT) > 0)
    return H5Adelete_by_name(loc, name, "crc32c", H5P_DEFAULT) < 0 ? -1 : 0;
  return 0;
}

static int make_v2(hid_t file) {
  int32_t v = 2;
  hid_t a = H5Aopen(file, "format_version", H5P_DEFAULT);
  int rc = a < 0 || H5Awrite(a, H5T_NATIVE_INT32, &v) < 0;
  if (a >= 0) H5Aclose(a);
  return rc || H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, strip_crc, NULL) < 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ckpt_damage FILE flip DATASET | set DATASET INDEX VALUE | attr NAME VALUE | v2\n");
    return 2;
  }
  hid_t file = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return 1;
  const char *op = argv[2];
  if (strcmp(op, "flip") == 0 && argc == 4) return flip_bit(argv[1], file, argv[3]);
  int rc = 2;
  if (strcmp(op, "set") == 0 && argc == 6) rc = set_value(file, argv[3], atoll(argv[4]), strtof(argv[5], NULL));
  else if (strcmp(op, "attr") == 0 && argc == 5) rc = set_attr(file, argv[3], atoll(argv[4]));
  else if (strcmp(op, "v2") == 0) rc = make_v2(file);
  H5Fclose(file);
  return rc;
}
