// Folders the trainer and its tools write into (checkpoints, metrics, event files, exports,
// shards): one `mkdir -p` for every layer; and one file copy.
#ifndef TRAINER_FS_H
#define TRAINER_FS_H

#include <stddef.h>

// Creates dir and each missing folder above it (mode 0777 less the umask). 0, or -1 with errno
// set: ENAMETOOLONG for a path of FS_PATH_MAX bytes or more, ENOTDIR when dir (or a folder above
// it) exists and is not a folder, else the failing mkdir's; failed (may be NULL) then names the
// folder that could not be made.
#define FS_PATH_MAX 4096
int fs_make_dirs(const char *dir, char *failed, size_t n_failed);
// The folders above the file at path (its dirname), as fs_make_dirs; nothing for a bare name.
int fs_make_parent_dirs(const char *path, char *failed, size_t n_failed);
// Copies the file src to dst (created or replaced). 0, or -1 with errno set.
int fs_copy_file(const char *src, const char *dst);

#endif
