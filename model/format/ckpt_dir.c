// Checkpoint files on disk: listing by step and finding the newest complete one, creating the
// directory and reserving the file's space, publishing a finished write by fsync + atomic rename,
// and rotating old checkpoints.
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"
#include "kernels/base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

// Parses "<prefix><digits><suffix>"; returns the step or -1.
static int64_t ckpt_parse_name(const char *name, const char *prefix, const char *suffix) {
  size_t np = strlen(prefix), ns = strlen(suffix), n = strlen(name);
  if (n <= np + ns || strncmp(name, prefix, np) != 0 || strcmp(name + n - ns, suffix) != 0) return -1;
  size_t n_digits = n - np - ns;
  if (n_digits > 18) return -1;  // keeps the value inside int64
  int64_t step = 0;
  for (size_t i = np; i < np + n_digits; i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

static int ckpt_entry_cmp(const void *a, const void *b) {
  const ckpt_entry *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? 1 : -1;  // newest first
  return strcmp(y->name, x->name);
}

// Lists files of dir matching prefix<digits>suffix, newest step first. Returns the count, or -1
// with errno set (ENOENT when dir does not exist).
int ckpt_list(const char *dir, const char *prefix, const char *suffix, ckpt_entry **out) {
  *out = NULL;
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0, cap = 0;
  ckpt_entry *v = NULL;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t step = ckpt_parse_name(e->d_name, prefix, suffix);
    if (step < 0 || strlen(e->d_name) >= sizeof v[0].name) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      ckpt_entry *nv = realloc(v, sizeof *v * (size_t)cap);
      CHECK(nv != NULL, "out of host memory listing %s", dir);
      v = nv;
    }
    v[n].step = step;
    snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
    n++;
  }
  closedir(d);
  if (n > 1) qsort(v, (size_t)n, sizeof *v, ckpt_entry_cmp);
  *out = v;
  return n;
}

static int ckpt_mkdir_p(const char *dir, char *msg) {
  char at[CKPT_PATH];
  if (fs_make_dirs(dir, at, sizeof at) == 0) return 0;
  const int e = errno;
  struct stat st;
  if (e == ENAMETOOLONG)
    ckpt_msgf(msg, "checkpoint directory path is too long (%zu bytes, at most %d): use a shorter checkpoint.dir",
              strlen(dir), FS_PATH_MAX - 1);
  else if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
    ckpt_msgf(msg, "checkpoint directory %s exists but is not a directory: point checkpoint.dir elsewhere", dir);
  else
    ckpt_msgf(msg, "cannot create checkpoint directory %s (at %s: %s): check checkpoint.dir and its permissions",
              dir, at, strerror(e));
  return -1;
}

// Where the file system cannot preallocate: refuse when statvfs shows too little room.
static int ckpt_check_room(const char *dir, const char *tmp, int64_t n_bytes_needed, char *msg) {
  struct statvfs vfs;
  if (statvfs(dir, &vfs) != 0) return 0;
  int64_t n_bytes_free = (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
  if (n_bytes_free >= n_bytes_needed) return 0;
  unlink(tmp);
  ckpt_msgf(msg,
            "checkpoint needs about %.1f MiB in %s but only %.1f MiB are free: free space, lower "
            "checkpoint.keep, or point checkpoint.dir at a larger file system",
            n_bytes_needed / 1048576.0, dir, n_bytes_free / 1048576.0);
  return -1;
}

// Rank 0 before the write: make the directory and reserve the file's space. HDF5 cannot recover
// from a write error while it closes a file (it hangs on some ranks or crashes at exit), so a full
// disk must never show up inside HDF5: the temporary file gets its blocks allocated up front
// (fallocate, keeping its size 0 so that H5Fcreate finds it empty and keeps the blocks), and every
// later write of the checkpoint lands in them. Where the file system cannot preallocate, a
// free-space check is the best that can be done.
int ckpt_prepare_dir(const char *dir, const char *tmp, int64_t n_bytes_needed, char *msg) {
  if (ckpt_mkdir_p(dir, msg) != 0) return -1;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    ckpt_msgf(msg, "cannot create checkpoint file %s (%s): check that %s is writable", tmp, strerror(errno), dir);
    return -1;
  }
  int err = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)n_bytes_needed) == 0 ? 0 : errno;
  close(fd);
  if (err == 0) return 0;
  // Any other error (EOPNOTSUPP, ENOSYS, EINVAL, ...) means no preallocation here, not no room.
  if (err != ENOSPC && err != EDQUOT && err != EFBIG && err != EIO)
    return ckpt_check_room(dir, tmp, n_bytes_needed, msg);
  unlink(tmp);
  ckpt_msgf(msg,
            "checkpoint needs about %.1f MiB in %s but the file system cannot hold it (%s): free space, lower "
            "checkpoint.keep, or point checkpoint.dir at a larger file system",
            n_bytes_needed / 1048576.0, dir, strerror(err));
  return -1;
}

int ckpt_probe_dir(const char *dir, char *msg) {
  if (ckpt_mkdir_p(dir, msg) != 0) return -1;
  char probe[CKPT_PATH];
  if (snprintf(probe, sizeof probe, "%s/.ckpt_write_test.%ld", dir, (long)getpid()) >= (int)sizeof probe) {
    ckpt_msgf(msg, "checkpoint directory path is too long (%zu bytes): use a shorter checkpoint.dir", strlen(dir));
    return -1;
  }
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, "x", 1) != 1) {
    ckpt_msgf(msg, "checkpoint directory %s is not writable (cannot create a file in it: %s): check "
                   "checkpoint.dir and its permissions, or set checkpoint.dir= (empty) to run without checkpoints",
              dir, strerror(errno));
    if (fd >= 0) close(fd), unlink(probe);
    return -1;
  }
  close(fd);
  unlink(probe);
  return 0;
}

// Blocks reserved past the file's end (the reservation's slack) stay allocated until the file is
// truncated below them; growing it by one byte and shrinking it back frees them on any file system.
static void ckpt_release_reserve(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || ftruncate(fd, st.st_size + 1) != 0 || ftruncate(fd, st.st_size) != 0)
    fprintf(stderr, "warning: cannot release the space reserved beyond the end of a checkpoint (%s)\n",
            strerror(errno));
}

// Rank 0 after every rank closed the file: make the bytes durable, then publish them under the
// final name in one atomic rename, then make the rename itself durable.
int ckpt_publish(const char *tmp, const char *final, const char *dir, char *msg) {
  int fd = open(tmp, O_WRONLY);
  if (fd >= 0) ckpt_release_reserve(fd);
  if (fd < 0 || fsync(fd) != 0) {
    ckpt_msgf(msg, "cannot sync checkpoint %s to disk (%s): the file system may be full or failing; free space "
                   "and retry",
              tmp, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  if (rename(tmp, final) != 0) {
    ckpt_msgf(msg, "cannot rename %s to %s (%s): check the permissions of %s", tmp, final, strerror(errno), dir);
    return -1;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  // Some file systems cannot fsync a directory (EINVAL); the rename is then as durable as they allow.
  if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS))
    fprintf(stderr, "warning: cannot sync directory %s after publishing %s (%s)\n", dir, final, strerror(errno));
  if (dfd >= 0) close(dfd);
  return 0;
}

// Rank 0 after a successful save: keep the newest `keep` checkpoints by step, never the one just
// written, and drop temporaries left by crashed writes (they can be as large as a checkpoint).
void ckpt_rotate(const char *dir, int keep, int64_t step) {
  char path[CKPT_PATH];
  ckpt_entry *v = NULL;
  int n = ckpt_list(dir, ".ckpt_", ".h5.tmp", &v);
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, v[i].name);
    if (unlink(path) != 0 && errno != ENOENT)
      fprintf(stderr, "warning: cannot remove stale temporary %s (%s)\n", path, strerror(errno));
  }
  free(v);
  n = ckpt_list(dir, "ckpt_", ".h5", &v);
  for (int i = 0; i < n; i++) {
    if (v[i].step > step)
      fprintf(stderr,
              "warning: %s/%s is newer (step %" PRId64 ") than the checkpoint just written (step %" PRId64
              "); resume=auto will pick it: remove it if it belongs to an abandoned run\n",
              dir, v[i].name, v[i].step, step);
    if (keep <= 0 || i < keep || v[i].step == step) continue;
    snprintf(path, sizeof path, "%s/%s", dir, v[i].name);
    if (unlink(path) != 0 && errno != ENOENT)
      fprintf(stderr, "warning: cannot remove old checkpoint %s (%s)\n", path, strerror(errno));
  }
  free(v);
}

hid_t ckpt_open_serial(const char *path, char reason[256]) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5_CHECK(fapl);
  H5_CHECK(H5Pset_file_locking(fapl, 1, 1));  // lock where supported; Lustre without flock still opens
  hid_t file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (file < 0) ckpt_h5_reason(reason);
  H5Pclose(fapl);
  return file;
}

// Serial read-only open: safe from every rank at once (shared lock, or no lock where the file
// system has none). Returns 1 if the file has complete == 1, else 0 with the reason in why.
static int ckpt_is_complete(const char *path, char *why, size_t n_why) {
  ckpt_quiet q;
  ckpt_quiet_begin(&q);
  char reason[256];
  hid_t file = ckpt_open_serial(path, reason);
  int32_t complete = 0;
  int ok = file >= 0 && ckpt_attr_read(file, "complete", H5T_NATIVE_INT32, &complete) == 1 && complete == 1;
  if (file < 0) snprintf(why, n_why, "not a readable HDF5 file");
  else if (!ok) snprintf(why, n_why, "root attribute complete is not 1 (its write was interrupted)");
  if (file >= 0) H5Fclose(file);
  ckpt_quiet_end(&q);
  return ok;
}

int ckpt_find_latest(const char *dir, int64_t before_step, char *path_out, size_t n_path, int64_t *step_out) {
  CHECK(dir != NULL && path_out != NULL && n_path > 0, "ckpt_find_latest: dir or path_out is NULL");
  path_out[0] = '\0';
  ckpt_entry *v = NULL;
  int n = ckpt_list(dir, "ckpt_", ".h5", &v);
  if (n < 0) {
    if (errno == ENOENT) return 1;  // a fresh run with resume=auto: nothing written yet
    snprintf(path_out, n_path, "cannot list checkpoint directory %s (%s): check checkpoint.dir and its permissions",
             dir, strerror(errno));
    return -1;
  }
  int found = 1;
  for (int i = 0; i < n && found == 1; i++) {
    char path[CKPT_PATH], why[128];
    if (v[i].step >= before_step) continue;
    snprintf(path, sizeof path, "%s/%s", dir, v[i].name);
    if (!ckpt_is_complete(path, why, sizeof why)) {
      if (ckpt_is_world_root())
        fprintf(stderr, "warning: skipping checkpoint %s: %s; trying an older one\n", path, why);
      continue;
    }
    if (strlen(path) >= n_path) {
      snprintf(path_out, n_path, "checkpoint path too long for the caller's buffer");
      found = -1;
    } else {
      snprintf(path_out, n_path, "%s", path);
      if (step_out) *step_out = v[i].step;
      found = 0;
    }
  }
  free(v);
  return found;
}
