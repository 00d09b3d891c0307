// TensorBoard event files (see tensorboard.h): TFRecord framing and the few protobuf fields of
// Event and Summary the scalars need, encoded by hand.
#include "app/tensorboard.h"
#include "model/format/ckpt_crc.h"
#include <errno.h>
#include <fcntl.h>
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

// mkdir -p: each missing component in turn. 0, or -1 with errno set by the failing mkdir.
static int tb_mkdir_parents(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return errno = ENAMETOOLONG, -1;
  for (char *p = tmp + 1;; p++) {
    if (*p != '/' && *p != 0) continue;
    char c = *p;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = c;
    if (!c) break;
  }
  struct stat st;
  if (stat(dir, &st) != 0) return -1;
  return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, -1);
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
  w->f = NULL;
  char path[4096 + 512] = "";
  const char *fix = "set log.tensorboard to a folder this user can write, or log.tensorboard= (empty) to write no "
                    "TensorBoard events";
  if (tb_mkdir_parents(dir) != 0)
    return snprintf(err, n_err, "log.tensorboard: cannot create folder %s (%s): %s", dir, strerror(errno), fix), -1;
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

int tb_write_scalars(tb_writer *w, int64_t step, const tb_scalar *s, int n) {
  if (!w->f) return 0;
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
