// mkdir -p and a file copy (see fs.h).
#include "kernels/base/fs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int fs_fail(const char *at, char *failed, size_t n_failed) {
  if (failed && n_failed) snprintf(failed, n_failed, "%s", at);
  return -1;
}

int fs_make_dirs(const char *dir, char *failed, size_t n_failed) {
  char p[FS_PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, fs_fail(dir, failed, n_failed);
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    const char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return fs_fail(p, failed, n_failed);
    *s = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0) return fs_fail(dir, failed, n_failed);
  return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, fs_fail(dir, failed, n_failed));
}

int fs_make_parent_dirs(const char *path, char *failed, size_t n_failed) {
  char p[FS_PATH_MAX];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return errno = ENAMETOOLONG, fs_fail(path, failed, n_failed);
  char *slash = strrchr(p, '/');
  if (!slash || slash == p) return 0;
  *slash = '\0';
  return fs_make_dirs(p, failed, n_failed);
}

int fs_copy_file(const char *src, const char *dst) {
  FILE *in = fopen(src, "rb");
  if (!in) return -1;
  FILE *out = fopen(dst, "wb");
  char buf[1 << 16];
  size_t k;
  int ok = out != NULL, saved = out ? 0 : errno;
  while (ok && (k = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, k, out) != k) ok = 0, saved = errno;
  if (ok && ferror(in)) ok = 0, saved = EIO;
  if (out && fclose(out) != 0 && ok) ok = 0, saved = errno;
  fclose(in);
  if (!ok) errno = saved;
  return ok ? 0 : -1;
}
