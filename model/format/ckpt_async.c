// Asynchronous checkpoint saves (ckpt_async_*, ckpt.h): ckpt_save's stages with the blocks
// written by a background thread. Why plain POSIX writes there rather than HDF5: the collective
// MPI-IO writes of ckpt_save would be MPI calls from a second thread while the training thread
// makes its own, which MPI allows only when initialised with MPI_THREAD_MULTIPLE (not every MPI
// offers it, and it slows every call), and parallel HDF5 is not thread-safe. Every dataset is
// created, contiguous and allocated, by the collective begin on the calling thread, so each one's
// place in the file is known there; the thread then needs only pwrite into those bytes, which
// HDF5 itself never writes (no fill values). The collective end runs on the calling thread again,
// after every rank's thread has finished.
#include "model/format/ckpt.h"
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// The write in flight: the writer its stages share, and the thread running the blocks.
typedef struct ckpt_async_job {
  ckpt_writer w;
  pthread_t thread;
  int threaded;       // 0: pthread_create failed and the blocks ran on the calling thread
  int rc;             // the blocks' result on this rank, read after the join
  double seconds;     // the blocks' time on this rank
  atomic_int done;    // set last by the thread: ckpt_async_ready may read it while the thread runs
} ckpt_async_job;

// The file's tensors are float32 little-endian (H5T_IEEE_F32LE): the thread writes memory as is.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ckpt_async writes floats as they lie in memory");

// Writes n_bytes at offset off, resuming after short writes and interrupted calls. 0, or errno.
static int ckpt_pwrite_all(int fd, const char *p, size_t n_bytes, int64_t off) {
  while (n_bytes > 0) {
    ssize_t k = pwrite(fd, p, n_bytes, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? errno : EIO;
    p += k, n_bytes -= (size_t)k, off += k;
  }
  return 0;
}

// Entry i's block, one contiguous run of the file at a time, into its dataset's bytes. 0, or -1
// with w->msg.
static int ckpt_write_block_posix(ckpt_writer *w, int fd, int i) {
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

int ckpt_write_blocks_posix(ckpt_writer *w) {
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
    rc = ckpt_write_block_posix(w, fd, i);
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

static double ckpt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *ckpt_async_main(void *arg) {
  ckpt_async_job *job = arg;
  double t0 = ckpt_now();
  job->rc = ckpt_write_blocks_posix(&job->w);
  job->seconds = ckpt_now() - t0;
  atomic_store_explicit(&job->done, 1, memory_order_release);
  return NULL;
}

int ckpt_async_start(ckpt_async *a, const char *dir, MPI_Comm comm, const ckpt_tensor *tensors, int n_tensors,
                     const ckpt_meta *meta, int keep, const ckpt_faults *faults, char *err, size_t n_err) {
  CHECK(!a->job, "ckpt_async_start: the write of step %lld is still in flight; finish it first", (long long)a->step);
  ckpt_async_job *job = XCALLOC(1, sizeof *job);
  ckpt_quiet q;
  ckpt_quiet_begin(&q);
  int rc = ckpt_write_begin(&job->w, dir, comm, tensors, n_tensors, meta, keep, faults);
  ckpt_quiet_end(&q);
  ckpt_copy_err(err, n_err, rc == 0 ? "" : job->w.msg);
  if (rc != 0) {
    free(job);
    return rc;
  }
  atomic_init(&job->done, 0);
  // The thread blocks every signal (it inherits the mask), so a stop signal reaches the thread
  // that acts on it, and none cuts the write short.
  sigset_t all, caller;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &caller);
  job->threaded = pthread_create(&job->thread, NULL, ckpt_async_main, job) == 0;
  pthread_sigmask(SIG_SETMASK, &caller, NULL);
  if (!job->threaded) ckpt_async_main(job);  // no thread to be had: the same write, in line
  a->job = job, a->step = job->w.step, a->n_bytes = job->w.n_bytes, a->write_s = 0;
  return 0;
}

int ckpt_async_ready(const ckpt_async *a) {
  if (!a->job) return 1;  // the same on every rank: the start agreed
  int done = atomic_load_explicit(&a->job->done, memory_order_acquire);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, a->job->w.comm));
  return done;
}

int ckpt_async_finish(ckpt_async *a, char *err, size_t n_err) {
  ckpt_async_job *job = a->job;
  if (!job) {
    ckpt_copy_err(err, n_err, "");
    return 0;
  }
  if (job->threaded) CHECK(pthread_join(job->thread, NULL) == 0, "ckpt_async_finish: cannot join the write's thread");
  double seconds = job->seconds;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, job->w.comm));
  ckpt_quiet q;
  ckpt_quiet_begin(&q);
  int rc = ckpt_write_end(&job->w, job->rc);
  ckpt_quiet_end(&q);
  ckpt_copy_err(err, n_err, rc == 0 ? "" : job->w.msg);
  free(job);
  a->job = NULL, a->write_s = seconds;
  return rc;
}
