// Check macros shared by every module: on failure they print rank, function, file:line, the
// failed call and the library's own message, then end the whole job (MPI_Abort) cleanly.
// The library-specific ones build on check_fail where their library is: MPI_CHECK in
// kernels/base/mpi_check.h, H5_CHECK in model/format/ckpt_internal.h, CUDA's in kernels/cuda/cuda_check.h.
// Asserts are always compiled in; there is no NDEBUG path.
#ifndef TRAINER_CHECK_H
#define TRAINER_CHECK_H

#include <stdio.h>
#include <stdlib.h>

void check_fail(const char *file, int line, const char *func, const char *what, const char *msg);

// Plain condition with a printf-style message.
#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      char check_msg_[512];                                                           \
      snprintf(check_msg_, sizeof check_msg_, __VA_ARGS__);                           \
      check_fail(__FILE__, __LINE__, __func__, #cond, check_msg_);                    \
    }                                                                                 \
  } while (0)

// Formats a one-line message into err (n_err bytes; NULL or 0: nothing) and returns -1, so a
// function that reports errors through (err, n_err) can `return check_errf(err, n_err, ...)`.
int check_errf(char *err, size_t n_err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *check_malloc(size_t n_bytes, const char *file, int line);
#define XMALLOC(n_bytes) check_malloc((n_bytes), __FILE__, __LINE__)
void *check_calloc(size_t n_elem, size_t elem_bytes, const char *file, int line);
#define XCALLOC(n_elem, elem_bytes) check_calloc((n_elem), (elem_bytes), __FILE__, __LINE__)

#endif
