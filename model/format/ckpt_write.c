// Checkpoint saving (ckpt_save, ckpt.h) in the stages an asynchronous save shares (ckpt_async.c):
// begin (the temporary file, its attributes and every dataset), the blocks (each rank its own with
// plain writes; there in a background thread), end (agree, checksums, close, publish, rotate). Atomic:
// written as dir/.ckpt_<step>.h5.tmp, synced, renamed. Layout: docs/checkpoint.md.
#include "model/format/ckpt.h"
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void ckpt_attr_write(hid_t loc, const char *name, hid_t file_type, hid_t mem_type, const void *value) {
  hid_t space = H5Screate(H5S_SCALAR);
  H5_CHECK(space);
  hid_t a = H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5_CHECK(a);
  H5_CHECK(H5Awrite(a, mem_type, value));
  H5_CHECK(H5Aclose(a));
  H5_CHECK(H5Sclose(space));
}

// Fixed-length rather than variable-length: variable-length data goes through the global heap,
// which parallel HDF5 handles poorly; a fixed string is plain metadata and h5py reads it as bytes.
static void ckpt_attr_write_string(hid_t loc, const char *name, const char *s) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5_CHECK(type);
  H5_CHECK(H5Tset_size(type, strlen(s) + 1));
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLTERM));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  ckpt_attr_write(loc, name, type, type, s);
  H5_CHECK(H5Tclose(type));
}

// An upper bound of the file's size: the tensors, their 1 MiB alignment, object headers and
// attributes (4 KiB a tensor is several times what HDF5 needs), the config and slack.
static int64_t ckpt_file_bytes(const ckpt_tensor *tensors, int n_tensors, long long n_yaml) {
  int64_t n_bytes = (int64_t)n_yaml + (1 << 20);
  for (int i = 0; i < n_tensors; i++) {
    if (ckpt_first_index(tensors, i) != i) continue;
    int64_t n_elem = ckpt_n_elem(tensors[i].ndim, tensors[i].full);
    n_bytes += n_elem * (int64_t)sizeof(float) + (n_elem * 4 >= (1 << 20) ? (1 << 20) : 0) + 4096;
  }
  return n_bytes;
}

// ---------------------------------------------------------------------------------------------
// Test hooks (ckpt_faults)

void ckpt_fault_delay(const ckpt_writer *w) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {  // a signal cuts one sleep short, never the delay
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) >= w->faults.delay_s) return;
    usleep(10000);
  }
}

void ckpt_fault_kill(const ckpt_writer *w, int i) {
  if (i == w->faults.kill_after) raise(SIGKILL);
}

int ckpt_fault_fails(const ckpt_writer *w, int i) { return i == w->faults.fail_at && w->rank == w->n_ranks - 1; }

// ---------------------------------------------------------------------------------------------
// Begin: everything before the data, collective.

// Attributes are collective metadata that every rank writes with identical values, and the file
// name must agree: both come from rank 0 rather than trusting every rank to match. nums: step,
// samples_seen, seed. Returns the config (malloc'd, NUL-terminated) and its length in *n_yaml.
static char *ckpt_bcast_meta(const ckpt_writer *w, const ckpt_meta *meta, int64_t nums[3], long long *n_yaml) {
  nums[0] = meta->step, nums[1] = meta->samples_seen, nums[2] = (int64_t)meta->seed;
  MPI_CHECK(MPI_Bcast(nums, 3, MPI_INT64_T, 0, w->comm));
  *n_yaml = w->rank == 0 && meta->config_yaml ? (long long)strlen(meta->config_yaml) : 0;
  MPI_CHECK(MPI_Bcast(n_yaml, 1, MPI_LONG_LONG, 0, w->comm));
  CHECK(*n_yaml < INT32_MAX, "ckpt_save: config_yaml is %lld bytes, expected under 2 GiB", *n_yaml);
  char *yaml = XMALLOC((size_t)*n_yaml + 1);
  if (w->rank == 0 && *n_yaml) memcpy(yaml, meta->config_yaml, (size_t)*n_yaml);
  if (*n_yaml) MPI_CHECK(MPI_Bcast(yaml, (int)*n_yaml, MPI_CHAR, 0, w->comm));
  yaml[*n_yaml] = '\0';
  return yaml;
}

// The temporary and final names in dir. 0, or -1 with w->msg (the same on every rank).
static int ckpt_name_files(ckpt_writer *w, const char *dir) {
  int n0 = snprintf(w->dir, sizeof w->dir, "%s", dir);
  int n1 = snprintf(w->tmp, sizeof w->tmp, "%s/.ckpt_%08" PRId64 ".h5.tmp", dir, w->step);
  int n2 = snprintf(w->final, sizeof w->final, "%s/ckpt_%08" PRId64 ".h5", dir, w->step);
  if (n0 < (int)sizeof w->dir && n1 < (int)sizeof w->tmp && n2 < (int)sizeof w->final) return 0;
  ckpt_msgf(w->msg, "checkpoint directory path %s is too long (at most about %d bytes): use a shorter "
                    "checkpoint.dir",
            dir, CKPT_PATH - 32);
  return -1;
}

// Collective: the temporary, created on every rank. 0, or -1 with w->msg (nothing left open, the
// temporary removed).
static int ckpt_create_file(ckpt_writer *w) {
  hid_t fapl = ckpt_fapl(w->comm);
  char reason[256] = "";
  w->file = H5Fcreate(w->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (w->file < 0) ckpt_h5_reason(reason);
  H5_CHECK(H5Pclose(fapl));
  if (w->file < 0)
    ckpt_msgf(w->msg, "cannot create checkpoint file %s (HDF5: %s): check that %s is writable and on a file system "
                      "every rank shares",
              w->tmp, reason, w->dir);
  int rc = ckpt_agree(w->comm, w->file < 0 ? -1 : 0, w->msg, CKPT_MSG);
  if (rc != 0) {
    if (w->file >= 0) H5Fclose(w->file);
    w->file = -1;
    if (w->rank == 0) unlink(w->tmp);
  }
  return rc;
}

// The root attributes but complete, which is written last.
static void ckpt_write_root(hid_t file, const int64_t nums[3], const char *yaml) {
  int32_t version = CKPT_FORMAT_VERSION;
  uint64_t seed = (uint64_t)nums[2];
  ckpt_attr_write_string(file, "format", CKPT_MAGIC);
  ckpt_attr_write(file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, &version);
  ckpt_attr_write(file, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &nums[0]);
  ckpt_attr_write(file, "samples_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, &nums[1]);
  ckpt_attr_write(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &seed);
  ckpt_attr_write_string(file, "config_yaml", yaml);
}

// Every dataset, in list order, with its data's place in the file. Creating one is a collective
// metadata operation, so all of them are created before any data is written: the file's layout
// is then the same whoever writes the data and when.
static void ckpt_create_datasets(ckpt_writer *w) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5_CHECK(lcpl);
  H5_CHECK(dcpl);
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));  // "optim/exp_avg/x" makes optim, optim/exp_avg
  // Parallel HDF5 allocates datasets at creation and would otherwise write fill values over the
  // whole file first: a second full pass of I/O for data that is overwritten anyway.
  H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));  // as parallel HDF5 does anyway: the place is known now
  for (int i = 0; i < w->n_tensors; i++) {
    const ckpt_tensor *t = &w->tensors[i];
    if (ckpt_first_index(w->tensors, i) != i) continue;  // another block of a dataset created above
    hsize_t full[CKPT_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) full[d] = (hsize_t)t->full[d];
    hid_t space = H5Screate_simple(t->ndim, full, NULL);
    H5_CHECK(space);
    hid_t dset = H5Dcreate2(w->file, t->name, H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    H5_CHECK(dset);
    int64_t n_elem = ckpt_n_elem(t->ndim, t->full);
    haddr_t at = H5Dget_offset(dset);
    CHECK(at != HADDR_UNDEF || n_elem == 0, "ckpt_save: tensor '%s' got no contiguous storage at creation", t->name);
    w->offset[i] = (int64_t)at;
    w->n_bytes += n_elem * (int64_t)sizeof(float);
    H5_CHECK(H5Dclose(dset));
    H5_CHECK(H5Sclose(space));
  }
  H5_CHECK(H5Pclose(lcpl));
  H5_CHECK(H5Pclose(dcpl));
}

int ckpt_write_begin(ckpt_writer *w, const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors,
                     const ckpt_meta *meta, int keep, const ckpt_faults *faults) {
  CHECK(dir != NULL && dir[0] != '\0', "ckpt_save: dir is empty");
  CHECK(meta != NULL, "ckpt_save: meta is NULL");
  CHECK(meta->step >= 0, "ckpt_save: step is %" PRId64 ", expected >= 0", meta->step);
  ckpt_check_list(comm, tensors, n_tensors, 1, "ckpt_save");
  memset(w, 0, sizeof *w);
  w->comm = comm, w->keep = keep, w->tensors = tensors, w->n_tensors = n_tensors, w->file = -1;
  w->faults = faults ? *faults : (ckpt_faults){-1, -1, -1, 0};
  MPI_CHECK(MPI_Comm_rank(comm, &w->rank));
  MPI_CHECK(MPI_Comm_size(comm, &w->n_ranks));
  int64_t nums[3];
  long long n_yaml = 0;
  char *yaml = ckpt_bcast_meta(w, meta, nums, &n_yaml);
  w->step = nums[0];
  int rc = ckpt_name_files(w, dir);
  if (rc == 0 && w->rank == 0) rc = ckpt_prepare_dir(dir, w->tmp, ckpt_file_bytes(tensors, n_tensors, n_yaml), w->msg);
  rc = ckpt_agree(comm, rc, w->msg, CKPT_MSG);
  if (rc == 0) rc = ckpt_create_file(w);
  if (rc == 0) {
    size_t n = (size_t)n_tensors + 1;
    w->offset = XCALLOC(n, sizeof *w->offset);
    w->crc = XCALLOC(n, sizeof *w->crc);
    w->covered = XCALLOC(n, sizeof *w->covered);
    w->nonfinite = XCALLOC(n, sizeof *w->nonfinite);
    ckpt_write_root(w->file, nums, yaml);
    ckpt_create_datasets(w);
  }
  free(yaml);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The blocks: each rank writes its own with plain writes at its datasets' offsets.

void ckpt_write_failed(ckpt_writer *w, int i, const char *reason) {
  ckpt_msgf(w->msg,
            "writing tensor '%s' to %s failed (%s): the disk may be full or the file system unavailable; free "
            "space in %s (or lower checkpoint.keep) and retry",
            w->tensors[i].name, w->tmp, reason, w->dir);
}

void ckpt_write_count(ckpt_writer *w, int i) {
  const ckpt_tensor *t = &w->tensors[i];
  int first = ckpt_first_index(w->tensors, i);
  if (i == w->faults.nan_in && w->rank == w->n_ranks - 1) w->nonfinite[first]++;
  if (!t->write || ckpt_block_empty(t)) return;
  int64_t nf = 0;
  w->crc[first] ^= ckpt_crc_block(t->data, t->ndim, t->full, t->start, t->count, &nf);
  w->covered[first] += ckpt_n_elem(t->ndim, t->count);
  w->nonfinite[first] += nf;
}

// The file's tensors are float32 little-endian (H5T_IEEE_F32LE): the thread writes memory as is.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ckpt_async writes floats as they lie in memory");

// Writes n_bytes at offset off, resuming after short writes and interrupted calls, then starts
// their writeback to the disk (Linux's sync_file_range, a hint: the fsync at the end makes the
// data durable and reports any failure): the disk works while the next blocks are written and
// checksummed, instead of from the fsync on. 0, or errno.
static int ckpt_pwrite_all(int fd, const char *p, size_t n_bytes, int64_t off) {
  const int64_t at = off;
  const size_t n = n_bytes;
  while (n_bytes > 0) {
    ssize_t k = pwrite(fd, p, n_bytes, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? errno : EIO;
    p += k, n_bytes -= (size_t)k, off += k;
  }
  (void)sync_file_range(fd, (off_t)at, (off_t)n, SYNC_FILE_RANGE_WRITE);
  return 0;
}

// Entry i's block, one contiguous run of the file at a time, into its dataset's bytes. 0, or -1
// with w->msg.
static int ckpt_write_block(ckpt_writer *w, int fd, int i) {
  const ckpt_tensor *t = &w->tensors[i];
  ckpt_runs b;
  int e = 0;
  if (t->write && ckpt_runs_init(&b, t->ndim, t->full, t->start, t->count)) {
    const int64_t base = w->offset[ckpt_first_index(w->tensors, i)];
    const size_t n_run = (size_t)b.run * sizeof(float);
    for (int64_t r = 0; r < b.n_runs && e == 0; r++)
      e = ckpt_pwrite_all(fd, (const char *)(t->data + r * b.run), n_run,
                          base + ckpt_run_offset(&b, r) * (int64_t)sizeof(float));
  }
  if (e == 0 && !ckpt_fault_fails(w, i)) return 0;
  ckpt_write_failed(w, i, e ? strerror(e) : "injected write error (test hook)");
  return -1;
}

int ckpt_write_blocks(ckpt_writer *w) {
  ckpt_fault_delay(w);
  int fd = open(w->tmp, O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    ckpt_msgf(w->msg, "cannot open checkpoint file %s to write this rank's tensors (%s): check that %s is on a file "
                      "system every rank shares", w->tmp, strerror(errno), w->dir);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < w->n_tensors && rc == 0; i++) {
    ckpt_fault_kill(w, i);
    rc = ckpt_write_block(w, fd, i);
    if (rc == 0) ckpt_write_count(w, i);
  }
  // This rank's data is durable before the end publishes the file: the flush there syncs only
  // what went through MPI-IO.
  if (rc == 0 && fsync(fd) != 0) {
    ckpt_msgf(w->msg, "cannot sync checkpoint file %s to disk (%s): the file system may be full or failing; free "
                      "space in %s and retry", w->tmp, strerror(errno), w->dir);
    rc = -1;
  }
  close(fd);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// End: agree, checksums, close, publish, collective.

// Combines every rank's contributions and writes each dataset's crc32c attribute. A tensor
// holding a NaN or an infinity is never saved: -1 with w->msg naming the first such tensor (the
// same on every rank), and no attribute written.
static int ckpt_write_checksums(ckpt_writer *w) {
  const int n = w->n_tensors;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w->crc, n, MPI_UINT32_T, MPI_BXOR, w->comm));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w->covered, n, MPI_INT64_T, MPI_SUM, w->comm));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w->nonfinite, n, MPI_INT64_T, MPI_SUM, w->comm));
  for (int i = 0; i < n; i++) {
    if (w->nonfinite[i] == 0) continue;
    ckpt_msgf(w->msg, "step %" PRId64 " not saved: tensor '%s' holds %" PRId64 " non-finite value%s (NaN or Inf) "
                      "after that step's update; the previous checkpoint stays. The update overflowed: lower "
                      "train.lr, set train.grad_clip, or resume from the previous checkpoint",
              w->step, w->tensors[i].name, w->nonfinite[i], w->nonfinite[i] == 1 ? "" : "s");
    return -1;
  }
  for (int i = 0; i < n; i++) {
    const ckpt_tensor *t = &w->tensors[i];
    if (ckpt_first_index(w->tensors, i) != i) continue;
    int64_t n_elem = ckpt_n_elem(t->ndim, t->full);
    CHECK(w->covered[i] == n_elem, "ckpt_save: the blocks written of '%s' cover %" PRId64 " of its %" PRId64
          " elements; exactly one rank must write each element (write = 1)", t->name, w->covered[i], n_elem);
    uint32_t value = ckpt_crc_finish(w->crc[i], (uint64_t)n_elem * sizeof(float));
    hid_t dset = H5Dopen2(w->file, t->name, H5P_DEFAULT);
    H5_CHECK(dset);
    ckpt_attr_write(dset, "crc32c", H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
    H5_CHECK(H5Dclose(dset));
  }
  return 0;
}

// Flushes (rc 0) and closes the file on every rank; rc, or the agreed failure of either. The
// temporary is removed on any failure: a partial file only wastes space; the previous checkpoint
// stays.
static int ckpt_close_file(ckpt_writer *w, int rc) {
  char reason[256] = "";
  // An explicit flush is where MPI_File_sync happens (HDF5 skips it inside close): it makes every
  // rank's data durable, not only what rank 0's fsync in ckpt_publish can reach.
  herr_t f = rc == 0 ? H5Fflush(w->file, H5F_SCOPE_GLOBAL) : 0;
  herr_t c = H5Fclose(w->file);
  w->file = -1;
  if (f < 0 || c < 0) ckpt_h5_reason(reason);
  if (rc == 0 && (f < 0 || c < 0))
    ckpt_msgf(w->msg, "finishing checkpoint %s failed (HDF5: %s): the disk may be full or the file system "
                      "unavailable; free space in %s (or lower checkpoint.keep) and retry",
              w->tmp, reason, w->dir);
  if (rc == 0) rc = ckpt_agree(w->comm, f < 0 || c < 0 ? -1 : 0, w->msg, CKPT_MSG);
  if (rc != 0 && w->rank == 0) unlink(w->tmp);
  return rc;
}

// Rank 0 renames the closed temporary to the checkpoint's name, then rotates.
static int ckpt_publish_closed(ckpt_writer *w) {
  MPI_CHECK(MPI_Barrier(w->comm));  // every rank's close has returned before the file is published
  int rc = 0;
  if (w->rank == 0 && (rc = ckpt_publish(w->tmp, w->final, w->dir, w->msg)) != 0) unlink(w->tmp);
  // Broadcasting rank 0's result is also the barrier: no rank returns before the rename is done.
  rc = ckpt_agree(w->comm, rc, w->msg, CKPT_MSG);
  if (rc == 0 && w->rank == 0) ckpt_rotate(w->dir, w->keep, w->step);
  return rc;
}

int ckpt_write_end(ckpt_writer *w, int rc) {
  // A background write stops at its own rank's first failure, so the ranks agree here (after the
  // collective writes they already do; agreeing again costs one reduction).
  rc = ckpt_agree(w->comm, rc, w->msg, CKPT_MSG);
  if (rc == 0) rc = ckpt_write_checksums(w);
  if (rc == 0) {
    int32_t complete = 1;  // last, so a reader never sees complete == 1 on a file missing data
    ckpt_attr_write(w->file, "complete", H5T_STD_I32LE, H5T_NATIVE_INT32, &complete);
  }
  rc = ckpt_close_file(w, rc);
  if (rc == 0) rc = ckpt_publish_closed(w);
  free(w->offset);
  free(w->crc);
  free(w->covered);
  free(w->nonfinite);
  w->offset = NULL, w->crc = NULL, w->covered = w->nonfinite = NULL;
  return rc;
}

int ckpt_save(const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors, const ckpt_meta *meta,
              int keep, const ckpt_faults *faults, char *err, size_t n_err) {
  ckpt_quiet q;
  ckpt_quiet_begin(&q);
  ckpt_writer *w = XMALLOC(sizeof *w);  // three paths and a message: 14 KiB
  int rc = ckpt_write_begin(w, dir, comm, tensors, n_tensors, meta, keep, faults);
  if (rc == 0) rc = ckpt_write_end(w, ckpt_write_blocks(w));
  ckpt_copy_err(err, n_err, rc == 0 ? "" : w->msg);
  free(w);
  ckpt_quiet_end(&q);
  return rc;
}
