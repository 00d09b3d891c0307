// MPI_CHECK: an MPI call that fails ends the job through check_fail with MPI's own message.
#ifndef TRAINER_MPI_CHECK_H
#define TRAINER_MPI_CHECK_H

#include <mpi.h>
#include "kernels/base/check.h"

#define MPI_CHECK(call)                                                               \
  do {                                                                                \
    int mpi_rc_ = (call);                                                             \
    if (mpi_rc_ != MPI_SUCCESS) {                                                     \
      char mpi_msg_[MPI_MAX_ERROR_STRING]; int mpi_len_ = 0;                          \
      MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                 \
      check_fail(__FILE__, __LINE__, __func__, #call, mpi_msg_);                      \
    }                                                                                 \
  } while (0)

#endif
