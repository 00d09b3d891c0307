// Token shards and the reader that feeds training: shards read with pread, windows of
// seq_len + 1 tokens in an order fixed by the seed and independent of the number of ranks.
// Format (docs/data.md): this project's shards ("TRNTOK" header, version, dtype, count) and
// llm.c shards (256 int32 header, magic 20240520, version 1, uint16 tokens) and Megatron
// indexed datasets (PREFIX.bin of bare uint16 or int32 tokens, PREFIX.idx with magic "MMIDIDX").
#ifndef TRAINER_DATA_H
#define TRAINER_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct data_shard {
  char path[512];
  int fd;               // open read-only for the whole run; -1 = closed
  int64_t n_file_bytes; // size at open: a window read checks the file still has it
  int64_t mtime_ns;     // modification time at open, likewise
  int64_t header_bytes; // offset of the first token (0 for a Megatron .bin)
  int token_bytes;      // 2 or 4
  int64_t n_tokens;
} data_shard;

typedef struct data_loader {
  data_shard *shards;
  int n_shards;
  int seq_len;
  uint64_t seed;
  int64_t n_windows;     // windows of seq_len + 1 tokens (non-overlapping, stride seq_len)
  int64_t *window_start; // (n_windows) global token offset of each window
  int64_t *window_shard; // (n_windows) shard of each window
  int32_t max_token;     // largest token id seen in any shard
  int64_t *perm;         // (n_windows) permutation of the current epoch
  int64_t perm_epoch;    // epoch perm belongs to; -1 none yet
} data_loader;

// Opens every shard matching pattern (a path or a glob, sorted), validates headers and sizes.
// Returns 0, or -1 with a message naming the file, what was expected, what was found and what
// to do (missing file, truncated shard, wrong magic, unknown version, too few tokens for one
// window; for a Megatron .bin, its .idx missing or damaged or disagreeing with the .bin).
int data_open(data_loader *d, const char *pattern, int seq_len, uint64_t seed, char *err, size_t n_err);
// Window number `sample` of the infinite stream (epoch = sample / n_windows, reshuffled each
// epoch from (seed, epoch)): writes seq_len + 1 tokens to out. Same answer on every rank.
// Returns 0, or -1 with a message naming the shard when it changed since data_open (another
// size or modification time, a read that comes back short, or a token above max_token): a
// shard rewritten under a running job is reported, never read as garbage or faulted on.
int data_get_window(data_loader *d, int64_t sample, int32_t *out, char *err, size_t n_err);
// Safe to call twice.
void data_close(data_loader *d);

// Writes tokens as a shard of this project's format (uint16 when every token < 65536, else
// int32). Writes to path.tmp, then renames. Returns 0, or -1 with a message.
int data_write_shard(const char *path, const int32_t *tokens, int64_t n_tokens, char *err, size_t n_err);

#endif
