// Checkpoint I/O: one HDF5 file per checkpoint holding every tensor at its full logical shape,
// read with collective MPI-IO (each rank its own hyperslab), so a run can resume under another
// tp/pp/dp layout; the helpers the save shares (ckpt_write.c writes, ckpt_async.c in the
// background). Layout and the reasons behind it: docs/checkpoint.md.
#include "model/format/ckpt.h"
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


// ---------------------------------------------------------------------------------------------
// Small helpers

void ckpt_msgf(char *msg, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, CKPT_MSG, fmt, ap);
  va_end(ap);
}

void ckpt_copy_err(char *err, size_t n_err, const char *msg) {
  if (err && n_err > 0) snprintf(err, n_err, "%s", msg);
}

// Warnings go to stderr once per job, not once per rank: ckpt_find_latest may run on every rank.
int ckpt_is_world_root(void) {
  int inited = 0, finalized = 0, rank = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

void ckpt_quiet_begin(ckpt_quiet *q) {
  H5_CHECK(H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data));
  H5_CHECK(H5Eset_auto2(H5E_DEFAULT, NULL, NULL));
}

void ckpt_quiet_end(const ckpt_quiet *q) { H5_CHECK(H5Eset_auto2(H5E_DEFAULT, q->func, q->data)); }

static herr_t ckpt_reason_cb(unsigned n, const H5E_error2_t *e, void *out) {
  (void)n;
  char *s = out;
  if (s[0] == '\0' && e->desc && e->desc[0]) snprintf(s, 256, "%s", e->desc);
  return 0;
}

// The innermost HDF5 error description (the most specific, e.g. the errno text of an open),
// read off the stack while printing is off; call it before anything clears the stack.
void ckpt_h5_reason(char out[256]) {
  out[0] = '\0';
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, ckpt_reason_cb, out);
  if (out[0] == '\0') snprintf(out, 256, "no detail from HDF5");
}

static void ckpt_fmt_shape(char *buf, size_t n_buf, int ndim, const int64_t *dims) {
  size_t used = (size_t)snprintf(buf, n_buf, "(");
  for (int d = 0; d < ndim && used < n_buf; d++)
    used += (size_t)snprintf(buf + used, n_buf - used, "%s%" PRId64, d ? ", " : "", dims[d]);
  if (used < n_buf) snprintf(buf + used, n_buf - used, ")");
}

int ckpt_block_empty(const ckpt_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->count[d] == 0) return 1;
  return 0;
}

// Selects this rank's block in the file space and returns the matching dense memory space, or
// empty selections on both sides: a rank with nothing to move still joins the collective call.
hid_t ckpt_select(const ckpt_tensor *t, int active, hid_t fspace) {
  hsize_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++) {
    start[d] = (hsize_t)t->start[d];
    count[d] = (hsize_t)t->count[d];
  }
  hid_t mspace;
  if (active) {
    H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL));
    mspace = H5Screate_simple(t->ndim, count, NULL);
    H5_CHECK(mspace);
  } else {
    H5_CHECK(H5Sselect_none(fspace));
    mspace = H5Scopy(fspace);
    H5_CHECK(mspace);
    H5_CHECK(H5Sselect_none(mspace));
  }
  return mspace;
}

int ckpt_check_dir(const char *dir, MPI_Comm comm, char *err, size_t n_err) {
  char msg[CKPT_MSG] = "";
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int rc = rank == 0 ? ckpt_probe_dir(dir, msg) : 0;
  if ((rc = ckpt_agree(comm, rc, msg, CKPT_MSG)) != 0) snprintf(err, n_err, "%s", msg);
  return rc;
}

int ckpt_agree(MPI_Comm comm, int rc, char *msg, int n_msg) {
  int rank = 0, n_ranks = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &n_ranks));
  int first = rc != 0 ? rank : n_ranks;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == n_ranks) return 0;
  MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, first, comm));
  MPI_CHECK(MPI_Bcast(msg, n_msg, MPI_CHAR, first, comm));
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Argument checks: a malformed tensor list is a bug in the caller, so these abort.

static void ckpt_check_tensor(const ckpt_tensor *t, int i, int saving) {
  size_t len = strnlen(t->name, sizeof t->name);
  CHECK(len > 0 && len < sizeof t->name, "tensor %d: name is empty or not NUL-terminated within %zu bytes", i,
        sizeof t->name);
  CHECK(t->name[0] != '/' && t->name[len - 1] != '/' && !strstr(t->name, "//"),
        "tensor %d '%s': expected a relative path like 'model/layers.wq' without empty components", i, t->name);
  CHECK(t->ndim >= 1 && t->ndim <= CKPT_MAX_DIMS, "tensor '%s': ndim is %d, expected 1..%d", t->name, t->ndim,
        CKPT_MAX_DIMS);
  for (int d = 0; d < t->ndim; d++)
    CHECK(t->full[d] >= 0 && t->start[d] >= 0 && t->count[d] >= 0 && t->start[d] + t->count[d] <= t->full[d],
          "tensor '%s' dim %d: block [%" PRId64 ", %" PRId64 ") does not fit the full extent %" PRId64, t->name, d,
          t->start[d], t->start[d] + t->count[d], t->full[d]);
  if (!ckpt_block_empty(t) && (!saving || t->write))
    CHECK(t->data != NULL, "tensor '%s': data is NULL but this rank %s a non-empty block", t->name,
          saving ? "writes" : "reads");
}

static uint64_t ckpt_fnv(uint64_t h, const void *p, size_t n_bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n_bytes; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Dataset creation and opening are collective metadata operations: every rank must make the same
// calls in the same order, or the file is corrupt or the job hangs. A hash of the list (names
// and full shapes) compared across ranks turns that bug into an immediate, named abort.
void ckpt_check_list(MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors, int saving, const char *fn) {
  CHECK(n_tensors >= 0 && (n_tensors == 0 || tensors != NULL), "%s: %d tensors but tensors is NULL", fn, n_tensors);
  uint64_t h = ckpt_fnv(1469598103934665603ull, &n_tensors, sizeof n_tensors);
  for (int i = 0; i < n_tensors; i++) {
    const ckpt_tensor *t = &tensors[i];
    ckpt_check_tensor(t, i, saving);
    h = ckpt_fnv(h, t->name, strlen(t->name) + 1);
    h = ckpt_fnv(h, &t->ndim, sizeof t->ndim);
    h = ckpt_fnv(h, t->full, sizeof t->full[0] * (size_t)t->ndim);
    for (int j = 0; j < i; j++) {
      if (strcmp(tensors[j].name, t->name) != 0) continue;
      // A repeated name is one more block of the same dataset, so the shapes must agree.
      CHECK(tensors[j].ndim == t->ndim && !memcmp(tensors[j].full, t->full, sizeof t->full[0] * (size_t)t->ndim),
            "%s: tensor '%s' appears twice (entries %d and %d) with different full shapes", fn, t->name, j, i);
      break;
    }
  }
  uint64_t mm[2] = {h, ~h};  // max of h and max of ~h: every rank sees a mismatch if any exists
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_UINT64_T, MPI_MAX, comm));
  CHECK(mm[0] == h && mm[1] == ~h,
        "%s: ranks passed different tensor lists; every rank must pass the same names and full shapes in the "
        "same order (only start, count, data and write differ between ranks)",
        fn);
}

int ckpt_first_index(const ckpt_tensor *tensors, int i) {
  for (int j = 0; j < i; j++)
    if (strcmp(tensors[j].name, tensors[i].name) == 0) return j;
  return i;
}

int64_t ckpt_n_elem(int ndim, const int64_t *dims) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= dims[d];
  return n;
}

hid_t ckpt_fapl(MPI_Comm comm) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5_CHECK(fapl);
  H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
  // Metadata read once and broadcast, written collectively: thousands of ranks each reading the
  // superblock and every object header would hammer the metadata server of a parallel file system.
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, 1));
  H5_CHECK(H5Pset_coll_metadata_write(fapl, 1));
  // Large tensors start on 1 MiB boundaries, which file-system stripes are multiples of.
  H5_CHECK(H5Pset_alignment(fapl, 1 << 20, 1 << 20));
  return fapl;
}

// ---------------------------------------------------------------------------------------------
// Load. A damaged file can make any HDF5 call fail, so every call on the file's contents is
// checked softly: the load runs with HDF5's printing off and a failure becomes CKPT_DAMAGED with
// HDF5's innermost reason in the message.

int ckpt_attr_read(hid_t loc, const char *name, hid_t mem_type, void *out) {
  htri_t e = H5Aexists(loc, name);
  if (e <= 0) return e < 0 ? -1 : 0;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t space = H5Aget_space(a);
  hssize_t n_points = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (space >= 0) H5Sclose(space);
  // More points would overflow `out`; a string where a number belongs fails conversion.
  int ok = n_points == 1 && H5Aread(a, mem_type, out) >= 0 ? 1 : -1;
  H5Aclose(a);
  return ok;
}

static int ckpt_attr_read_string_open(hid_t a, char **out) {
  hid_t ftype = H5Aget_type(a), space = H5Aget_space(a);
  int ok = -1;
  if (ftype >= 0 && space >= 0 && H5Tget_class(ftype) == H5T_STRING && H5Sget_simple_extent_npoints(space) == 1) {
    htri_t vl = H5Tis_variable_str(ftype);
    if (vl > 0) {
      char *s = NULL;
      if (H5Aread(a, ftype, &s) >= 0) {
        *out = strdup(s ? s : "");
        CHECK(*out != NULL, "out of host memory copying a string attribute");
        ok = 1;
      }
      H5free_memory(s);
    } else if (vl == 0) {
      size_t n = H5Tget_size(ftype);
      *out = XMALLOC(n + 1);
      (*out)[n] = '\0';
      if (n > 0 && H5Aread(a, ftype, *out) >= 0) ok = 1;
      else free(*out), *out = NULL;
    }
  }
  if (space >= 0) H5Sclose(space);
  if (ftype >= 0) H5Tclose(ftype);
  return ok;
}

int ckpt_attr_read_string(hid_t loc, const char *name, char **out) {
  *out = NULL;
  htri_t e = H5Aexists(loc, name);
  if (e <= 0) return e < 0 ? -1 : 0;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return -1;
  int ok = ckpt_attr_read_string_open(a, out);
  H5Aclose(a);
  return ok;
}

// step and samples_seen in range: every step consumes at least one window (train.global_batch >= 1).
static int ckpt_check_position(const char *path, const ckpt_meta *m, char *msg) {
  if (m->step >= 0 && m->samples_seen >= m->step) return 0;
  ckpt_msgf(msg, "checkpoint %s: root attributes step = %" PRId64 " and samples_seen = %" PRId64 " are out of range "
                 "(expected 0 <= step <= samples_seen): the file is damaged; resume from an earlier checkpoint",
            path, m->step, m->samples_seen);
  return CKPT_DAMAGED;
}

int ckpt_read_root(hid_t file, const char *path, ckpt_meta *meta, int32_t *version_out, char *msg) {
  char *magic = NULL;
  int32_t version = 0;
  int has_magic = ckpt_attr_read_string(file, "format", &magic);
  int good_magic = has_magic == 1 && strcmp(magic, CKPT_MAGIC) == 0;
  free(magic);
  int has_version = ckpt_attr_read(file, "format_version", H5T_NATIVE_INT32, &version);
  if (has_magic < 0 || has_version < 0) {
    ckpt_msgf(msg, "checkpoint %s: the root attributes format and format_version cannot be read: the file is "
                   "damaged; resume from an earlier checkpoint", path);
    return CKPT_DAMAGED;
  }
  if (!good_magic || has_version != 1) {
    ckpt_msgf(msg, "%s is an HDF5 file but not a checkpoint of this trainer (expected root attributes "
                   "format = '%s' and format_version): check checkpoint.resume",
              path, CKPT_MAGIC);
    return -1;
  }
  if (version < CKPT_FORMAT_VERSION_MIN || version > CKPT_FORMAT_VERSION) {
    ckpt_msgf(msg, "checkpoint %s has format version %d, this trainer reads versions %d to %d: use the trainer "
                   "version that wrote it, or start a fresh run",
              path, (int)version, CKPT_FORMAT_VERSION_MIN, CKPT_FORMAT_VERSION);
    return -1;
  }
  if (version_out) *version_out = version;
  int32_t complete = 0;
  if (ckpt_attr_read(file, "complete", H5T_NATIVE_INT32, &complete) != 1 || complete != 1) {
    ckpt_msgf(msg, "checkpoint %s is incomplete (root attribute complete is not 1): its write was interrupted; "
                   "resume from an earlier checkpoint",
              path);
    return CKPT_DAMAGED;
  }
  ckpt_meta m = {0};
  char *yaml = NULL;
  const char *bad = NULL;
  if (ckpt_attr_read(file, "step", H5T_NATIVE_INT64, &m.step) != 1) bad = "step";
  else if (ckpt_attr_read(file, "samples_seen", H5T_NATIVE_INT64, &m.samples_seen) != 1) bad = "samples_seen";
  else if (ckpt_attr_read(file, "seed", H5T_NATIVE_UINT64, &m.seed) != 1) bad = "seed";
  else if (ckpt_attr_read_string(file, "config_yaml", &yaml) != 1) bad = "config_yaml";
  if (bad) {
    free(yaml);
    ckpt_msgf(msg, "checkpoint %s: root attribute '%s' is missing or of the wrong type: the file is damaged; "
                   "resume from an earlier checkpoint",
              path, bad);
    return CKPT_DAMAGED;
  }
  int rc = ckpt_check_position(path, &m, msg);
  if (rc != 0 || !meta) {
    free(yaml);
    return rc;
  }
  m.config_yaml = yaml;
  *meta = m;
  return 0;
}

// Whether every component of a "/"-separated path exists. H5Lexists fails (rather than saying no)
// when an intermediate group is missing, so walk it component by component.
static int ckpt_path_exists(hid_t file, const char *name) {
  char p[sizeof((ckpt_tensor *)0)->name];
  snprintf(p, sizeof p, "%s", name);
  for (char *s = p;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (H5Lexists(file, p, H5P_DEFAULT) <= 0) return 0;  // fails if a component is a dataset, not a group
    *s = c;
    if (c == '\0') return 1;
  }
}

// Chunks of 64 Ki floats, shared by the OpenMP threads; the exponent test (all ones: Inf or NaN)
// vectorizes where isfinite may not, and isfinite runs only in a chunk that has one.
int64_t ckpt_first_nonfinite(const float *x, int64_t n) {
  const int64_t chunk = 1 << 16;
  int64_t first = INT64_MAX;
#pragma omp parallel for reduction(min : first) schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    int64_t i1 = i0 + chunk < n ? i0 + chunk : n;
    uint32_t bad = 0;
    for (int64_t i = i0; i < i1; i++) {
      uint32_t b;
      memcpy(&b, &x[i], sizeof b);
      bad |= (b & 0x7f800000u) == 0x7f800000u;
    }
    for (int64_t i = i0; bad && i < i1; i++)
      if (!isfinite(x[i])) {
        first = i < first ? i : first;
        break;
      }
  }
  return first == INT64_MAX ? -1 : first;
}

static int ckpt_damaged_read(const char *path, const char *name, char *msg) {
  char reason[256];
  ckpt_h5_reason(reason);
  ckpt_msgf(msg, "checkpoint %s is damaged: reading tensor '%s' failed (HDF5: %s); resume from an earlier "
                 "checkpoint", path, name, reason);
  return CKPT_DAMAGED;
}

// Checks the dataset's shape and type against t. 0, or -1 with msg.
static int ckpt_check_shape(hid_t ftype, hid_t fspace, const char *path, const ckpt_tensor *t, char *msg) {
  int ndim = H5Sget_simple_extent_ndims(fspace);
  hsize_t dims[H5S_MAX_RANK];
  if (ndim < 0 || H5Sget_simple_extent_dims(fspace, dims, NULL) < 0) return ckpt_damaged_read(path, t->name, msg);
  int same = ndim == t->ndim;
  for (int d = 0; same && d < ndim; d++) same = dims[d] == (hsize_t)t->full[d];
  if (!same) {
    int64_t file_dims[H5S_MAX_RANK];
    for (int d = 0; d < ndim; d++) file_dims[d] = (int64_t)dims[d];
    char fs[160], cs[160];
    ckpt_fmt_shape(fs, sizeof fs, ndim, file_dims);
    ckpt_fmt_shape(cs, sizeof cs, t->ndim, t->full);
    ckpt_msgf(msg,
              "checkpoint %s: tensor '%s' has shape %s in the file, the config expects %s: the model in the config "
              "differs from the checkpoint's; use the config the checkpoint was written with (stored in its "
              "config_yaml attribute) or start a fresh run",
              path, t->name, fs, cs);
    return -1;
  }
  if (H5Tget_class(ftype) != H5T_FLOAT) {
    ckpt_msgf(msg, "checkpoint %s: tensor '%s' is not stored as floating point: the file is not a checkpoint of "
                   "this trainer version; start a fresh run",
              path, t->name);
    return -1;
  }
  return 0;
}

// Reads n_bytes at offset off, resuming after short reads and interrupted calls. 0, or -1 at the
// end of the file or an error.
static int ckpt_pread_all(int fd, char *p, size_t n_bytes, int64_t off) {
  while (n_bytes > 0) {
    ssize_t k = pread(fd, p, n_bytes, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n_bytes -= (size_t)k, off += k;
  }
  return 0;
}

// This rank's block of a contiguous float32 dataset whose data starts at byte at, by plain reads
// (each rank at once, not through MPI-IO's aggregators). 0, or -1.
static int ckpt_read_runs(int fd, int64_t at, ckpt_tensor *t) {
  ckpt_runs b;
  if (!ckpt_runs_init(&b, t->ndim, t->full, t->start, t->count)) return 0;
  for (int64_t r = 0; r < b.n_runs; r++)
    if (ckpt_pread_all(fd, (char *)(t->data + r * b.run), (size_t)b.run * sizeof(float),
                       at + ckpt_run_offset(&b, r) * (int64_t)sizeof(float)) != 0)
      return -1;
  return 0;
}

// Where dset's data starts in the file, for plain reads: where it is contiguous little-endian
// float32 with its place in the file allocated, as every file this trainer writes; else
// HADDR_UNDEF (a collective HDF5 read). Depends only on the file, so alike on every rank.
static haddr_t ckpt_plain_offset(hid_t dset, hid_t ftype) {
  return H5Tequal(ftype, H5T_IEEE_F32LE) > 0 ? H5Dget_offset(dset) : HADDR_UNDEF;
}

// The block, by plain reads (fd >= 0) where ckpt_plain_offset has the data's place; else with a
// collective HDF5 read.
static int ckpt_read_block(hid_t dset, hid_t ftype, hid_t fspace, int fd, const char *path, ckpt_tensor *t,
                           hid_t dxpl, char *msg) {
  int reads = !ckpt_block_empty(t);
  haddr_t at = fd >= 0 ? ckpt_plain_offset(dset, ftype) : HADDR_UNDEF;
  herr_t r = 0;
  if (at != HADDR_UNDEF) {
    r = reads && ckpt_read_runs(fd, (int64_t)at, t) != 0 ? -1 : 0;
  } else {
    hid_t mspace = ckpt_select(t, reads, fspace);
    float dummy = 0.0f;
    r = H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, reads ? (void *)t->data : &dummy);
    H5Sclose(mspace);
  }
  return r < 0 ? ckpt_damaged_read(path, t->name, msg) : 0;
}

// The block just read: its share of its tensor's checksum where this rank counts it (*crc,
// *covered), and no NaN or infinity in it, counted in the checksum's pass (else a pass of its own).
static int ckpt_check_block(const ckpt_tensor *t, int counts, uint32_t *crc, int64_t *covered, const char *path,
                            char *msg) {
  if (ckpt_block_empty(t)) return 0;
  const int64_t n = ckpt_n_elem(t->ndim, t->count);
  int64_t n_nonfinite = 1;
  if (counts) {
    *crc ^= ckpt_crc_block(t->data, t->ndim, t->full, t->start, t->count, &n_nonfinite);
    *covered += n;
  }
  const int64_t bad = n_nonfinite ? ckpt_first_nonfinite(t->data, n) : -1;
  if (bad < 0) return 0;
  ckpt_msgf(msg, "checkpoint %s: tensor '%s' holds %s (element %" PRId64 " of the block read here): the file is "
                 "damaged, or was written by a run that had diverged; resume from an earlier checkpoint",
            path, t->name, isnan(t->data[bad]) ? "NaN" : "Inf", bad);
  return CKPT_DAMAGED;
}

static int ckpt_read_tensor(hid_t file, int fd, const char *path, ckpt_tensor *t, hid_t dxpl, char *msg) {
  if (!ckpt_path_exists(file, t->name)) {
    ckpt_msgf(msg, "checkpoint %s has no tensor '%s': it was written by a different model or trainer version",
              path, t->name);
    return -1;
  }
  hid_t dset = H5Dopen2(file, t->name, H5P_DEFAULT);
  if (dset < 0) {
    ckpt_msgf(msg, "checkpoint %s: '%s' is a group, not a tensor: it was written by a different model or trainer "
                   "version",
              path, t->name);
    return -1;
  }
  hid_t ftype = H5Dget_type(dset), fspace = H5Dget_space(dset);
  int rc = ftype < 0 || fspace < 0 ? ckpt_damaged_read(path, t->name, msg)
                                    : ckpt_check_shape(ftype, fspace, path, t, msg);
  if (rc == 0) rc = ckpt_read_block(dset, ftype, fspace, fd, path, t, dxpl, msg);
  if (fspace >= 0) H5Sclose(fspace);
  if (ftype >= 0) H5Tclose(ftype);
  H5Dclose(dset);
  return rc;
}

// Collective: each tensor whose counted blocks cover it exactly is checked against its crc32c.
static int ckpt_check_checksums(hid_t file, MPI_Comm comm, const char *path, int32_t version,
                                const ckpt_tensor *tensors, int n_tensors, uint32_t *crc, int64_t *covered, char *msg) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, crc, n_tensors, MPI_UINT32_T, MPI_BXOR, comm));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, covered, n_tensors, MPI_INT64_T, MPI_SUM, comm));
  if (version < CKPT_FORMAT_VERSION_CRC) {
    if (n_tensors > 0 && ckpt_is_world_root())
      printf("note: checkpoint %s has format version %d, without checksums: its tensors are loaded unverified\n",
             path, (int)version);
    return 0;
  }
  for (int i = 0; i < n_tensors; i++) {
    const ckpt_tensor *t = &tensors[i];
    int64_t n_elem = ckpt_n_elem(t->ndim, t->full);
    if (ckpt_first_index(tensors, i) != i || covered[i] != n_elem) continue;
    uint32_t stored = 0, computed = ckpt_crc_finish(crc[i], (uint64_t)n_elem * sizeof(float));
    hid_t dset = H5Dopen2(file, t->name, H5P_DEFAULT);
    int has = dset < 0 ? -1 : ckpt_attr_read(dset, "crc32c", H5T_NATIVE_UINT32, &stored);
    if (dset >= 0) H5Dclose(dset);
    if (has != 1) {
      ckpt_msgf(msg, "checkpoint %s: tensor '%s' has no readable crc32c attribute, which format version %d "
                     "requires: the file is damaged; resume from an earlier checkpoint", path, t->name, (int)version);
      return CKPT_DAMAGED;
    }
    if (stored != computed) {
      ckpt_msgf(msg, "checkpoint %s: tensor '%s' fails its checksum (crc32c stored %08x, computed %08x): the file "
                     "is damaged; resume from an earlier checkpoint", path, t->name, stored, computed);
      return CKPT_DAMAGED;
    }
  }
  return 0;
}

// Whether every tensor of the list is a dataset that plain reads take (ckpt_plain_offset): then
// no rank takes part in another's reads. Anything else (a missing tensor, another layout) is 0,
// and the reads find and name it.
static int ckpt_all_plain(hid_t file, const ckpt_tensor *tensors, int n_tensors) {
  for (int i = 0; i < n_tensors; i++) {
    if (!ckpt_path_exists(file, tensors[i].name)) return 0;
    hid_t dset = H5Dopen2(file, tensors[i].name, H5P_DEFAULT);
    if (dset < 0) return 0;
    hid_t ftype = H5Dget_type(dset);
    const int plain = ftype >= 0 && ckpt_plain_offset(dset, ftype) != HADDR_UNDEF;
    if (ftype >= 0) H5Tclose(ftype);
    H5Dclose(dset);
    if (!plain) return 0;
  }
  return 1;
}

// Rank 0, before the collective open: tells a missing, non-regular, non-HDF5 or damaged file apart.
static int ckpt_check_file(const char *path, char *msg) {
  struct stat st;
  if (stat(path, &st) != 0) {
    ckpt_msgf(msg, "checkpoint %s cannot be read (%s): check checkpoint.resume (a checkpoint file, or 'auto' "
                   "for the newest in checkpoint.dir)",
              path, strerror(errno));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    ckpt_msgf(msg, "checkpoint %s is not a regular file: checkpoint.resume takes a checkpoint file such as "
                   "dir/ckpt_00001000.h5, or 'auto'",
              path);
    return -1;
  }
  if (H5Fis_hdf5(path) <= 0) {
    ckpt_msgf(msg, "%s is not an HDF5 file, so not a checkpoint of this trainer: check checkpoint.resume "
                   "(a crashed write leaves only a .tmp file, which is never a checkpoint)",
              path);
    return -1;
  }
  char reason[256];
  hid_t file = ckpt_open_serial(path, reason);
  if (file < 0) {
    ckpt_msgf(msg, "checkpoint %s is damaged: it does not open as HDF5 (%s), e.g. truncated by a full disk or a "
                   "copy cut short; resume from an earlier checkpoint", path, reason);
    return CKPT_DAMAGED;
  }
  H5Fclose(file);
  return 0;
}

// The open file's part of ckpt_load: root attributes, then each tensor, then the checksums.
static int ckpt_load_open(hid_t file, const char *path, MPI_Comm comm, ckpt_tensor *tensors, int n_tensors,
                          ckpt_meta *meta, char *msg) {
  int n_ranks = 1;
  MPI_CHECK(MPI_Comm_size(comm, &n_ranks));
  int32_t version = 0;
  // All ranks see the same metadata, so these checks fail alike everywhere; agreeing anyway
  // keeps every rank on the same collective path if that ever stops being true.
  int rc = ckpt_agree(comm, ckpt_read_root(file, path, meta, &version, msg), msg, CKPT_MSG);
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5_CHECK(dxpl);
  H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  uint32_t *crc = XCALLOC((size_t)n_tensors + 1, sizeof *crc);
  int64_t *covered = XCALLOC((size_t)n_tensors + 1, sizeof *covered);
  // Plain reads where every rank can open the file for them (else HDF5's reads on every rank).
  int fd = open(path, O_RDONLY | O_CLOEXEC), all_open = fd >= 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_open, 1, MPI_INT, MPI_MIN, comm));
  if (!all_open && fd >= 0) close(fd), fd = -1;
  // With plain reads only, each rank reads its blocks at its own pace and the ranks agree once,
  // after the last (a rank stops at its first failure; no collective waits for it). Else they
  // agree after each tensor, so that none is left alone in a collective read.
  int plain = rc == 0 && fd >= 0 && ckpt_all_plain(file, tensors, n_tensors);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &plain, 1, MPI_INT, MPI_MIN, comm));
  for (int i = 0; i < n_tensors && rc == 0; i++) {
    ckpt_tensor *t = &tensors[i];
    const int first = ckpt_first_index(tensors, i);
    rc = ckpt_read_tensor(file, fd, path, t, dxpl, msg);
    if (rc == 0) rc = ckpt_check_block(t, t->write || n_ranks == 1, &crc[first], &covered[first], path, msg);
    if (!plain) rc = ckpt_agree(comm, rc, msg, CKPT_MSG);
  }
  if (plain) rc = ckpt_agree(comm, rc, msg, CKPT_MSG);
  if (rc == 0)
    rc = ckpt_agree(comm, ckpt_check_checksums(file, comm, path, version, tensors, n_tensors, crc, covered, msg), msg,
                    CKPT_MSG);
  if (fd >= 0) close(fd);
  free(crc);
  free(covered);
  H5Pclose(dxpl);
  if (rc != 0 && meta) {
    free((void *)meta->config_yaml);
    meta->config_yaml = NULL;
  }
  return rc;
}

int ckpt_load(const char *path, MPI_Comm comm, ckpt_tensor *tensors, int n_tensors, ckpt_meta *meta, char *err,
              size_t n_err) {
  CHECK(path != NULL && path[0] != '\0', "ckpt_load: path is empty");
  ckpt_check_list(comm, tensors, n_tensors, 0, "ckpt_load");
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  char msg[CKPT_MSG] = "";
  if (meta) meta->config_yaml = NULL;
  ckpt_quiet q;
  ckpt_quiet_begin(&q);
  int rc = ckpt_agree(comm, rank == 0 ? ckpt_check_file(path, msg) : 0, msg, CKPT_MSG);
  if (rc == 0) {
    hid_t fapl = ckpt_fapl(comm);
    char reason[256] = "";
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (file < 0) ckpt_h5_reason(reason);
    H5Pclose(fapl);
    if (file < 0)
      ckpt_msgf(msg, "cannot open checkpoint %s on every rank (HDF5: %s), though rank 0 can: it must be on a file "
                     "system all ranks share",
                path, reason);
    rc = ckpt_agree(comm, file < 0 ? -1 : 0, msg, CKPT_MSG);
    if (rc == 0) rc = ckpt_load_open(file, path, comm, tensors, n_tensors, meta, msg);
    if (file >= 0) H5Fclose(file);  // read-only: nothing to lose if closing complains
  }
  ckpt_quiet_end(&q);
  ckpt_copy_err(err, n_err, rc == 0 ? "" : msg);
  return rc;
}
