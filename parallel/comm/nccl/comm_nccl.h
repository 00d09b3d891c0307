// NCCL implementation of the communicator table (parallel/comm/comm.h) over device buffers, plus
// the device-selection, stream and timeout settings it needs. Every operation is enqueued on
// one CUDA stream (the compute stream, so collectives are ordered with the kernels without
// extra synchronisation) and returns without waiting for the GPU; comm_nccl_wait is the one
// blocking wait, bounded by a timeout so a dead or hung peer ends the job with a message
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
// command picks distinct GPUs on every node. Collective over MPI_COMM_WORLD the first time;
// cached afterwards.
int comm_nccl_local_rank(void);
// Number of visible CUDA devices (0 when there is no driver or GPU; never aborts).
int comm_nccl_device_count(void);
// cudaSetDevice(local_rank % device_count) and returns that device; aborts with a message when
// there is no GPU. Collective over MPI_COMM_WORLD the first time (see comm_nccl_local_rank).
int comm_nccl_set_device(void);

// The stream (a cudaStream_t) that communicators created from now on enqueue on. Must be set
// before comm_nccl_create; in the trainer, comm_nccl_set_stream(k_cuda_stream()). NULL is
// accepted and means the legacy default stream.
void comm_nccl_set_stream(void *cuda_stream);
// At most this many CTAs (so SMs) for every operation of the communicators created from now on;
// 0 (the default) leaves it to NCCL.
void comm_nccl_set_max_ctas(int max_ctas);
// The stream c enqueues on (NULL for a communicator that is not NCCL).
void *comm_nccl_stream(const comm *c);
// The stream of the last comm_nccl_set_stream (the staged MPI communicator uses it too);
// aborts, naming who asked, when none was set.
void *comm_nccl_stream_setting(const char *who);

// Longest time any blocking wait (comm_nccl_wait, barrier, communicator set-up and tear-down)
// may take before the job is aborted as hung. Default 600 s. The environment variable
// TRAINER_NCCL_TIMEOUT_S, when set, wins over both the default and this call: it is the
// operator's last word at launch time.
void comm_nccl_set_timeout(double seconds);
double comm_nccl_timeout(void);

// Communicator over the ranks of mpi (duplicated: the caller may free mpi right after). The
// NCCL unique id is made on group rank 0 and broadcast over the duplicate. The CUDA device must
// be set before (comm_nccl_set_device). Sets NCCL_NVLS_ENABLE=0 unless the user set it:
// NVLink multicast is never turned on by this code. Returns a communicator to comm_free.
comm *comm_nccl_create(MPI_Comm mpi, const char *name);
// True when c was made by comm_nccl_create.
int comm_nccl_is(const comm *c);
// Blocks until all work enqueued on c's stream has run. Polls the stream and NCCL's
// asynchronous error state; when an error appears or the timeout passes, aborts every NCCL
// communicator of this process and the job, naming the group and the last operation this
// group enqueued. A no-op for a communicator that is not NCCL (host calls complete on return).
void comm_nccl_wait(comm *c);

#endif
