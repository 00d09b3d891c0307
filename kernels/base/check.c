// Failure path of the check macros: one message naming the rank and the place, then MPI_Abort.
#include "kernels/base/check.h"
#include <mpi.h>
#include <stdarg.h>
#include <string.h>

void check_fail(const char *file, int line, const char *func, const char *what, const char *msg) {
  int rank = 0, inited = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "[rank %d] error in %s (%s:%d): %s\n  failed: %s\n", rank, func, file, line, msg, what);
  fflush(stderr);
  if (inited) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

int check_errf(char *err, size_t n_err, const char *fmt, ...) {
  if (err && n_err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n_err, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void *check_malloc(size_t n_bytes, const char *file, int line) {
  void *p = malloc(n_bytes ? n_bytes : 1);
  if (!p) {
    char msg[128];
    snprintf(msg, sizeof msg, "out of host memory allocating %zu bytes", n_bytes);
    check_fail(file, line, "malloc", "malloc", msg);
  }
  return p;
}

void *check_calloc(size_t n_elem, size_t elem_bytes, const char *file, int line) {
  void *p = calloc(n_elem ? n_elem : 1, elem_bytes ? elem_bytes : 1);
  if (!p) {
    char msg[128];
    snprintf(msg, sizeof msg, "out of host memory allocating %zu x %zu bytes", n_elem, elem_bytes);
    check_fail(file, line, "calloc", "calloc", msg);
  }
  return p;
}
