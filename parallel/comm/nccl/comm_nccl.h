// NCCL implementation of the communicator table (parallel/comm/comm.h) over device buffers, plus
// the device selection it needs. Every operation is enqueued on one CUDA stream (comm_opts.stream:
// the compute stream, so collectives are ordered with the kernels without extra
// synchronisation) and returns without waiting for the GPU; comm_nccl_wait is the one blocking
// wait, bounded by comm_opts.timeout_s so a dead or hung peer ends the job with a message
// instead of a silent hang.
//
// What "completes" means here: parallel/comm/comm.h says p2p calls outside a group, and the calls
// of a group at group_end, complete before returning. For NCCL that is "enqueued in stream
// order": every later kernel, copy or collective on the same stream sees the data, and the
// send buffer may be overwritten by later work on that stream; the host sees the result only
// after comm_nccl_wait (or a stream/event synchronisation). Host code reading a device buffer
// straight after a call must wait first.
#ifndef TRAINER_COMM_NCCL_H
#define TRAINER_COMM_NCCL_H

#include <mpi.h>

#include "parallel/comm/comm.h"

// Node-local rank (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) over MPI_COMM_WORLD), so the same
// command picks distinct GPUs on every node. Collective over MPI_COMM_WORLD (every call).
int comm_nccl_local_rank(void);
// Number of visible CUDA devices (0 when there is no driver or GPU; never aborts).
int comm_nccl_device_count(void);
// cudaSetDevice(local_rank % device_count) and returns that device; aborts with a message when
// there is no GPU or fewer GPUs than ranks on the node. Collective over MPI_COMM_WORLD.
int comm_nccl_set_device(void);

// A factory (comm.h) of NCCL communicators with opts (copied; NULL: comm_opts_default): stream,
// timeout_s and max_ctas apply. Its shared state, which every communicator it makes points to,
// holds the list of its live communicators (a failure or timeout in one aborts them all before
// the job ends) and the depth of the open NCCL group (NCCL's groups span communicators).
// One factory alive per process at a time: NCCL's group state is the calling thread's, and the
// trainer makes every communicator call from its main thread. Free it with comm_factory_free after every
// communicator it made.
//
// Its create makes a non-blocking NCCL communicator over the ranks of mpi (duplicated: the
// caller may free mpi right after), on opts->stream. The NCCL unique id is made on group rank 0
// and broadcast over the duplicate. The CUDA device must be set before (comm_nccl_set_device, or
// the backend's). Sets NCCL_NVLS_ENABLE=0 unless the user set it: NVLink multicast is never
// turned on by this code.
comm_factory comm_nccl_factory(const comm_opts *opts);
// True when c is an NCCL communicator.
int comm_nccl_is(const comm *c);
// The stream c enqueues on (NULL for a communicator that is not NCCL).
void *comm_nccl_stream(const comm *c);
// Blocks until all work enqueued on c's stream has run. Polls the stream and NCCL's
// asynchronous error state; when an error appears or c's timeout passes, aborts every NCCL
// communicator of c's factory and the job, naming the group and the last operation this group
// enqueued. A no-op for a communicator that is not NCCL (host calls complete on return).
void comm_nccl_wait(comm *c);

#endif
