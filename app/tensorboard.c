// TensorBoard event files (see tensorboard.h): TFRecord framing and the few protobuf fields of
// Event and Summary the scalars need, encoded by hand.
#include "app/tensorboard.h"
#include "kernels/base/fs.h"
#include "model/format/ckpt_crc.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

// Protobuf wire types (encoding.md): varint, 64-bit, length-delimited, 32-bit.
enum { TB_VARINT = 0, TB_I64 = 1, TB_LEN = 2, TB_I32 = 5 };
// Field numbers: Event (event.proto) and Summary / Summary.Value (summary.proto).
enum { TB_EVENT_WALL_TIME = 1, TB_EVENT_STEP = 2, TB_EVENT_FILE_VERSION = 3, TB_EVENT_SUMMARY = 5 };
enum { TB_SUMMARY_VALUE = 1, TB_VALUE_TAG = 1, TB_VALUE_SIMPLE = 2 };
#define TB_TAG_MAX 128  // longest tag written
#define TB_MAX_SCALARS 64

// A growing byte buffer on the stack: big enough for the largest event the trainer writes.
typedef struct tb_buf {
  uint8_t b[TB_MAX_SCALARS * (TB_TAG_MAX + 16) + 64];
  size_t n;
} tb_buf;

static void tb_put_bytes(tb_buf *o, const void *p, size_t n) {
  if (o->n + n > sizeof o->b) return;  // unreachable: tags and counts are bounded by the callers
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void tb_put_varint(tb_buf *o, uint64_t v) {
  uint8_t b[10];
  int n = 0;
  do {
    b[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  tb_put_bytes(o, b, (size_t)n);
}

static void tb_put_key(tb_buf *o, int field, int wire) { tb_put_varint(o, (uint64_t)field << 3 | (uint64_t)wire); }

static void tb_put_le(tb_buf *o, uint64_t v, int n_bytes) {
  uint8_t b[8];
  for (int i = 0; i < n_bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
  tb_put_bytes(o, b, (size_t)n_bytes);
}

static void tb_put_double(tb_buf *o, int field, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  tb_put_key(o, field, TB_I64);
  tb_put_le(o, u, 8);
}

static void tb_put_string(tb_buf *o, int field, const void *p, size_t n) {
  tb_put_key(o, field, TB_LEN);
  tb_put_varint(o, n);
  tb_put_bytes(o, p, n);
}

// TFRecord's checksum: the CRC-32C rotated right by 15 bits plus a constant.
static uint32_t tb_masked_crc(const void *p, size_t n) {
  uint32_t crc = ckpt_crc32c(0, p, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// One TFRecord around data, then a flush. 0 or -1.
static int tb_write_record(tb_writer *w, const tb_buf *data) {
  tb_buf head = {.n = 0};
  tb_put_le(&head, (uint64_t)data->n, 8);
  tb_put_le(&head, tb_masked_crc(head.b, 8), 4);
  tb_buf tail = {.n = 0};
  tb_put_le(&tail, tb_masked_crc(data->b, data->n), 4);
  int ok = fwrite(head.b, 1, head.n, w->f) == head.n && fwrite(data->b, 1, data->n, w->f) == data->n &&
           fwrite(tail.b, 1, tail.n, w->f) == tail.n;
  return ok && fflush(w->f) == 0 ? 0 : -1;
}

static double tb_wall_time(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

// A varint at *p (before end): its value, *p moved past it; -1 when it runs past end.
static int64_t tb_get_varint(const uint8_t **p, const uint8_t *end) {
  uint64_t v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return (int64_t)(v & INT64_MAX);
  }
  return -1;
}

// The n_bytes-byte little-endian integer at b (tb_put_le's inverse).
static uint64_t tb_get_le(const uint8_t *b, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

// The step of an Event (0 without one): its fields walked by wire type.
static int64_t tb_event_step(const uint8_t *p, const uint8_t *end) {
  int64_t step = 0;
  while (p < end) {
    int64_t key = tb_get_varint(&p, end), len = 0;
    if (key < 0) break;
    switch (key & 7) {
      case TB_VARINT: {
        int64_t v = tb_get_varint(&p, end);
        if (v < 0) return step;
        if ((key >> 3) == TB_EVENT_STEP) step = v;
        break;
      }
      case TB_I64: len = 8; break;
      case TB_I32: len = 4; break;
      case TB_LEN: len = tb_get_varint(&p, end); break;
      default: return step;
    }
    if (len < 0 || len > end - p) break;
    p += len;
  }
  return step;
}

// The largest step of one event file; a record whose length or CRC does not check (the end of a
// file a crash cut short) ends the reading.
static int64_t tb_file_last_step(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  int64_t last = 0;
  uint8_t head[12], crc[4];
  while (fread(head, 1, 12, f) == 12) {
    const uint64_t n = tb_get_le(head, 8);
    const uint32_t want = (uint32_t)tb_get_le(head + 8, 4);
    if (tb_masked_crc(head, 8) != want || n > (1u << 26)) break;
    uint8_t *data = malloc(n ? n : 1);
    int ok = data && fread(data, 1, n, f) == n && fread(crc, 1, 4, f) == 4;
    const uint32_t got = ok ? (uint32_t)tb_get_le(crc, 4) : 0;
    if (ok && tb_masked_crc(data, n) == got) {
      int64_t step = tb_event_step(data, data + n);
      if (step > last) last = step;
    } else {
      ok = 0;
    }
    free(data);
    if (!ok) break;
  }
  fclose(f);
  return last;
}

// The largest step in the event files of dir (0: none).
static int64_t tb_folder_last_step(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int64_t last = 0;
  const char *prefix = "events.out.tfevents.";
  char path[4096 + 512];
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int64_t step = tb_file_last_step(path);
    if (step > last) last = step;
  }
  closedir(d);
  return last;
}

// A new file: the first name of events.out.tfevents.<time>.<host>[.k] that does not exist.
static FILE *tb_create_file(const char *dir, char *path, size_t n_path) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
  long now = (long)tb_wall_time();
  for (int k = 0; k < 1000; k++) {
    if (k == 0) snprintf(path, n_path, "%s/events.out.tfevents.%010ld.%s", dir, now, host);
    else snprintf(path, n_path, "%s/events.out.tfevents.%010ld.%s.%d", dir, now, host, k);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return fdopen(fd, "wb");
    if (errno != EEXIST) return NULL;
  }
  return NULL;
}

int tb_open(tb_writer *w, const char *dir, char *err, size_t n_err) {
  *w = (tb_writer){0};
  char path[4096 + 512] = "";
  const char *fix = "set log.tensorboard to a folder this user can write, or log.tensorboard= (empty) to write no "
                    "TensorBoard events";
  if (fs_make_dirs(dir, NULL, 0) != 0)
    return snprintf(err, n_err, "log.tensorboard: cannot create folder %s (%s): %s", dir, strerror(errno), fix), -1;
  w->last_step = tb_folder_last_step(dir);
  if (!(w->f = tb_create_file(dir, path, sizeof path)))
    return snprintf(err, n_err, "log.tensorboard: cannot create an event file in %s (%s): %s", dir, strerror(errno),
                    fix), -1;
  tb_buf ev = {.n = 0};
  tb_put_double(&ev, TB_EVENT_WALL_TIME, tb_wall_time());
  tb_put_string(&ev, TB_EVENT_FILE_VERSION, "brain.Event:2", strlen("brain.Event:2"));
  if (tb_write_record(w, &ev) != 0) {
    snprintf(err, n_err, "log.tensorboard: cannot write %s (%s): %s", path, strerror(errno), fix);
    tb_close(w);
    return -1;
  }
  return 0;
}

void tb_resume(tb_writer *w) { w->skip_through = w->last_step; }

int tb_write_scalars(tb_writer *w, int64_t step, const tb_scalar *s, int n) {
  if (!w->f || step <= w->skip_through) return 0;
  tb_buf summary = {.n = 0};
  for (int i = 0; i < n && i < TB_MAX_SCALARS; i++) {
    tb_buf value = {.n = 0};
    tb_put_string(&value, TB_VALUE_TAG, s[i].tag, strnlen(s[i].tag, TB_TAG_MAX));
    float v = (float)s[i].value;
    uint32_t u;
    memcpy(&u, &v, 4);
    tb_put_key(&value, TB_VALUE_SIMPLE, TB_I32);
    tb_put_le(&value, u, 4);
    tb_put_string(&summary, TB_SUMMARY_VALUE, value.b, value.n);
  }
  tb_buf ev = {.n = 0};
  tb_put_double(&ev, TB_EVENT_WALL_TIME, tb_wall_time());
  tb_put_key(&ev, TB_EVENT_STEP, TB_VARINT);
  tb_put_varint(&ev, (uint64_t)step);
  tb_put_string(&ev, TB_EVENT_SUMMARY, summary.b, summary.n);
  return tb_write_record(w, &ev);
}

void tb_close(tb_writer *w) {
  if (w->f) fclose(w->f);
  w->f = NULL;
}
