// ckpt_verify: a checkpoint checked on its own, without a run or a config: it opens as HDF5, its
// root attributes are present and in range, every tensor is float32 at most 4-D, every optimizer
// tensor has its parameter of the same shape, and every tensor is finite and matches its crc32c
// (format version 3 on). Each tensor is read in slices of rows, so memory stays bounded.
#include "model/format/ckpt.h"
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define VERIFY_SLICE_BYTES (64 << 20)  // read at most this much of a tensor at a time

typedef struct verify_state {
  const char *path;
  FILE *out;
  int n_problems;
  char **names;  // every dataset, as H5Ovisit found it
  int n_names, cap;
} verify_state;

__attribute__((format(printf, 2, 3))) static void verify_problem(verify_state *v, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(v->out, "error: %s: ", v->path);
  vfprintf(v->out, fmt, ap);
  fprintf(v->out, "\n");
  va_end(ap);
  v->n_problems++;
}

static herr_t verify_collect(hid_t loc, const char *name, const H5O_info_t *info, void *op) {
  (void)loc;
  verify_state *v = op;
  if (info->type != H5O_TYPE_DATASET) return 0;
  if (v->n_names == v->cap) {
    v->cap = v->cap ? 2 * v->cap : 256;
    v->names = realloc(v->names, sizeof *v->names * (size_t)v->cap);
    CHECK(v->names != NULL, "out of host memory listing %s", v->path);
  }
  v->names[v->n_names] = strdup(name);
  CHECK(v->names[v->n_names] != NULL, "out of host memory listing %s", v->path);
  v->n_names++;
  return 0;
}

// Shape of a dataset (ndim, or -1 when it cannot be read).
static int verify_shape(hid_t file, const char *name, hsize_t dims[H5S_MAX_RANK]) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0) return -1;
  hid_t s = H5Dget_space(d);
  int ndim = s < 0 ? -1 : H5Sget_simple_extent_dims(s, dims, NULL);
  if (s >= 0) H5Sclose(s);
  H5Dclose(d);
  return ndim;
}

// optim/<state>/<name> needs model/<name> of the same shape.
static void verify_pairing(verify_state *v, hid_t file, const char *name) {
  if (strncmp(name, "optim/", 6) != 0) return;
  const char *rest = strchr(name + 6, '/');
  if (!rest) return;
  char param[256];
  snprintf(param, sizeof param, "model/%s", rest + 1);
  hsize_t a[H5S_MAX_RANK], b[H5S_MAX_RANK];
  int has_param = H5Lexists(file, "model", H5P_DEFAULT) > 0 && H5Lexists(file, param, H5P_DEFAULT) > 0;
  int na = verify_shape(file, name, a), nb = has_param ? verify_shape(file, param, b) : -1;
  if (nb < 0) verify_problem(v, "tensor '%s' has no parameter '%s'", name, param);
  else if (na != nb || memcmp(a, b, sizeof a[0] * (size_t)na) != 0)
    verify_problem(v, "tensor '%s' and its parameter '%s' differ in shape", name, param);
}

// Reads the tensor slice by slice: its CRC-32C and its first non-finite element. 0, or -1 when a
// read fails (reason in HDF5's stack).
static int verify_read(hid_t dset, hid_t fspace, int ndim, const hsize_t *dims, uint32_t *crc, int64_t *bad) {
  hsize_t row = 1;
  for (int d = 1; d < ndim; d++) row *= dims[d];
  hsize_t rows_per = row ? (VERIFY_SLICE_BYTES / sizeof(float)) / row : 1;
  if (rows_per == 0) rows_per = 1;
  float *buf = XMALLOC((size_t)(rows_per * row * sizeof(float)));
  *crc = 0;
  *bad = -1;
  int rc = 0;
  for (hsize_t r0 = 0; r0 < dims[0] && rc == 0; r0 += rows_per) {
    hsize_t start[H5S_MAX_RANK] = {r0}, count[H5S_MAX_RANK];
    for (int d = 0; d < ndim; d++) count[d] = d ? dims[d] : (r0 + rows_per < dims[0] ? rows_per : dims[0] - r0);
    hid_t mspace = H5Screate_simple(ndim, count, NULL);
    if (H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
        H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, buf) < 0)
      rc = -1;
    H5Sclose(mspace);
    int64_t n = (int64_t)(count[0] * row);
    if (rc == 0) *crc = ckpt_crc32c(*crc, buf, (size_t)n * sizeof(float));
    int64_t i = rc == 0 && *bad < 0 ? ckpt_first_nonfinite(buf, n) : -1;
    if (i >= 0) *bad = (int64_t)(r0 * row) + i;
  }
  free(buf);
  return rc;
}

static void verify_tensor(verify_state *v, hid_t file, const char *name, int32_t version) {
  char reason[256];
  hid_t dset = H5Dopen2(file, name, H5P_DEFAULT);
  hid_t ftype = dset < 0 ? -1 : H5Dget_type(dset), fspace = dset < 0 ? -1 : H5Dget_space(dset);
  hsize_t dims[H5S_MAX_RANK] = {0};
  int ndim = fspace < 0 ? -1 : H5Sget_simple_extent_dims(fspace, dims, NULL);
  if (ndim < 0 || ftype < 0) {
    ckpt_h5_reason(reason);
    verify_problem(v, "tensor '%s' cannot be opened (HDF5: %s): the file is damaged", name, reason);
  } else if (H5Tget_class(ftype) != H5T_FLOAT || ndim < 1 || ndim > CKPT_MAX_DIMS) {
    verify_problem(v, "tensor '%s' is not a 1- to %d-dimensional float tensor", name, CKPT_MAX_DIMS);
  } else {
    uint32_t crc = 0, stored = 0;
    int64_t bad = -1;
    if (verify_read(dset, fspace, ndim, dims, &crc, &bad) != 0) {
      ckpt_h5_reason(reason);
      verify_problem(v, "tensor '%s' cannot be read (HDF5: %s): the file is damaged or truncated", name, reason);
    } else {
      if (bad >= 0) verify_problem(v, "tensor '%s' holds a NaN or Inf (element %" PRId64 ")", name, bad);
      int has = ckpt_attr_read(dset, "crc32c", H5T_NATIVE_UINT32, &stored);
      if (version >= CKPT_FORMAT_VERSION_CRC && has != 1)
        verify_problem(v, "tensor '%s' has no readable crc32c attribute (format version %d has one per tensor)", name,
                       (int)version);
      else if (has == 1 && stored != crc)
        verify_problem(v, "tensor '%s' fails its checksum (crc32c stored %08x, computed %08x)", name, stored, crc);
    }
  }
  if (fspace >= 0) H5Sclose(fspace);
  if (ftype >= 0) H5Tclose(ftype);
  if (dset >= 0) H5Dclose(dset);
}

static void verify_tensors(verify_state *v, hid_t file, int32_t version) {
  if (H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, verify_collect, v) < 0) {
    char reason[256];
    ckpt_h5_reason(reason);
    verify_problem(v, "its list of tensors cannot be read (HDF5: %s): the file is damaged", reason);
  }
  int n_model = 0;
  for (int i = 0; i < v->n_names; i++) {
    n_model += strncmp(v->names[i], "model/", 6) == 0;
    verify_pairing(v, file, v->names[i]);
    verify_tensor(v, file, v->names[i], version);
  }
  if (n_model == 0) verify_problem(v, "it holds no model/ tensors");
}

// A load message without its leading "checkpoint PATH" (the problem line names the file already).
static const char *verify_own_words(const char *msg, const char *path) {
  size_t n = strlen("checkpoint ");
  if (strncmp(msg, "checkpoint ", n) != 0 || strncmp(msg + n, path, strlen(path)) != 0) return msg;
  const char *rest = msg + n + strlen(path);
  return rest[0] == ':' ? rest + 2 : rest[0] == ' ' ? rest + 1 : msg;
}

int ckpt_verify(const char *path, FILE *out) {
  verify_state v = {.path = path, .out = out};
  H5E_auto2_t func;
  void *data;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  char reason[256] = "not an HDF5 file";
  hid_t file = H5Fis_hdf5(path) > 0 ? ckpt_open_serial(path, reason) : -1;
  if (file < 0) {
    verify_problem(&v, "does not open as HDF5 (%s): not a checkpoint, or damaged or truncated", reason);
  } else {
    char msg[CKPT_MSG] = "";
    ckpt_meta meta = {0};
    int32_t version = 0;
    int rc = ckpt_read_root(file, path, &meta, &version, msg);
    if (rc != 0) verify_problem(&v, "%s", verify_own_words(msg, path));
    if (rc == 0 || rc == CKPT_DAMAGED) verify_tensors(&v, file, version);
    const char *what = version >= CKPT_FORMAT_VERSION_CRC ? "checksums and finiteness"
                                                          : "finiteness only: no checksums before format version 3";
    if (v.n_problems == 0)
      fprintf(out, "ok: %s: step %" PRId64 ", format version %d, %d tensors verified (%s)\n", path, meta.step,
              (int)version, v.n_names, what);
    free((void *)meta.config_yaml);
    H5Fclose(file);
  }
  for (int i = 0; i < v.n_names; i++) free(v.names[i]);
  free(v.names);
  H5Eset_auto2(H5E_DEFAULT, func, data);
  return v.n_problems;
}
