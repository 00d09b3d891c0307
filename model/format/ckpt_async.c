// Asynchronous checkpoint saves (ckpt_async_*, ckpt.h): ckpt_save's stages with the blocks
// written by a background thread. The blocks are plain POSIX writes (ckpt_write_blocks) for a
// save of either kind: no MPI call from a second thread, which MPI allows only when initialised
// with MPI_THREAD_MULTIPLE (not every MPI offers it, and it slows every call), and no HDF5 call,
// which parallel HDF5 does not allow from two threads. Every dataset is created, contiguous and
// allocated, by the collective begin on the calling thread, so each one's place in the file is
// known there. The collective end runs on the calling thread again, after every rank's thread
// has finished.
#include "model/format/ckpt.h"
#include "model/format/ckpt_crc.h"
#include "model/format/ckpt_internal.h"
#include "kernels/base/check.h"
#include "kernels/base/mpi_check.h"

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

static double ckpt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *ckpt_async_main(void *arg) {
  ckpt_async_job *job = arg;
  double t0 = ckpt_now();
  job->rc = ckpt_write_blocks(&job->w);
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
