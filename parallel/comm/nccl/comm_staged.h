// The MPI communicator over device buffers, staged through host memory: what GPU ranks use with
// parallel.gpu_comm=mpi. Every call waits for the work queued on the compute stream, copies
// what it reads to the host, runs the MPI communicator (parallel/comm/comm.c) there and copies the
// results back, so it is slow; but it needs no NCCL and lets several ranks share one GPU, which
// NCCL refuses: the layouts of the parallel layer can then be tested against one GPU on a
// machine with one GPU (scripts/validate/test_gpu.sh does when it sees one).
// Semantics are comm.h's, as strict as the MPI communicator's: a started collective reads its
// operands at the start and writes its results at the wait, a receive lands in its buffer when
// its ticket is waited for, never earlier.
#ifndef TRAINER_COMM_STAGED_H
#define TRAINER_COMM_STAGED_H

#include <mpi.h>

#include "parallel/comm/comm.h"

// Over the ranks of mpi (duplicated), ordered on opts->stream (the compute stream; NULL: the
// legacy default stream); the MPI communicator under it takes opts->mpi_chunk_elems. timeout_s
// and max_ctas do not apply: the waits are MPI's and CUDA's own. opts NULL: comm_opts_default.
// Returns a communicator to comm_free.
comm *comm_staged_create(MPI_Comm mpi, const char *name, const comm_opts *opts);
// A factory (comm.h) of staged communicators with opts (copied; NULL: comm_opts_default).
comm_factory comm_staged_factory(const comm_opts *opts);
// True when c was made by comm_staged_create.
int comm_staged_is(const comm *c);

#endif
