// Minimal test harness: EXPECT checks count passes and failures; test_summary prints the
// closing line "N passed, N failed" and returns the exit code. Under MPI, call it on every
// rank after MPI work; only rank 0 prints the line, and failures on any rank count.
#ifndef TRAINER_TEST_UTIL_H
#define TRAINER_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <mpi.h>

static int test_n_pass, test_n_fail;

#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (cond) {                                                               \
      test_n_pass++;                                                          \
    } else {                                                                  \
      test_n_fail++;                                                          \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
    }                                                                         \
  } while (0)

// Sums counts over MPI_COMM_WORLD when MPI is up; prints on rank 0; returns 0 iff no failure.
static inline int test_summary(void) {
  int counts[2] = {test_n_pass, test_n_fail}, rank = 0, inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  }
  if (rank == 0) printf("%d passed, %d failed\n", counts[0], counts[1]);
  return counts[1] == 0 && counts[0] > 0 ? 0 : 1;
}

#endif
