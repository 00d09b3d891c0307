// Checkpoint files on disk: listing by step, creating the directory with a free-space check,
// publishing a finished write by fsync + atomic rename, and rotating old checkpoints.
#include "model/ckpt_internal.h"
#include "kernels/check.h"

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
  char p[CKPT_PATH];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
    ckpt_msgf(msg, "checkpoint directory path is too long (%zu bytes, at most %d): use a shorter checkpoint.dir",
              strlen(dir), CKPT_PATH - 1);
    return -1;
  }
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) {
      ckpt_msgf(msg, "cannot create checkpoint directory %s (at %s: %s): check checkpoint.dir and its permissions",
                dir, p, strerror(errno));
      return -1;
    }
    *s = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    ckpt_msgf(msg, "checkpoint directory %s exists but is not a directory: point checkpoint.dir elsewhere", dir);
    return -1;
  }
  return 0;
}

// Rank 0 before the write: make the directory and refuse early when the file cannot fit, rather
// than fail half-way through a multi-gigabyte collective write.
int ckpt_prepare_dir(const char *dir, int64_t n_bytes_needed, char *msg) {
  if (ckpt_mkdir_p(dir, msg) != 0) return -1;
  struct statvfs vfs;
  if (statvfs(dir, &vfs) == 0) {
    int64_t n_bytes_free = (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
    if (n_bytes_free < n_bytes_needed) {
      ckpt_msgf(msg,
                "checkpoint needs about %.1f MiB in %s but only %.1f MiB are free: free space, lower "
                "checkpoint.keep, or point checkpoint.dir at a larger file system",
                n_bytes_needed / 1048576.0, dir, n_bytes_free / 1048576.0);
      return -1;
    }
  }
  return 0;
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

// Rank 0 after every rank closed the file: make the bytes durable, then publish them under the
// final name in one atomic rename, then make the rename itself durable.
int ckpt_publish(const char *tmp, const char *final, const char *dir, char *msg) {
  int fd = open(tmp, O_RDONLY);  // fsync through a read-only descriptor flushes the file on Linux
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
