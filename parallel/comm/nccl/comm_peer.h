// The tensor-parallel group's in-place all-gathers and reduce-scatters as peer copies on the
// copy engines (parallel.tp_overlap=p2p): GPUs of one host that can reach each other's memory
// (cudaDeviceCanAccessPeer) copy their blocks into each other's staging memory, mapped through
// CUDA IPC handles, so the transfers take no SMs from the GEMMs they run beside and start as
// soon as their data is written, whatever kernel holds the SMs. NCCL's collectives are kernels:
// beside a GEMM that fills every SM they start only as its blocks drain.
//
// A start (all_gather_regions_start, reduce_scatter_start of f32, each reduce_scatter_add_block)
// on rank r, in stream order on the compute stream: r's copy stream to each peer q (one per
// peer), once the data is written and q has consumed the operation that used the same staging
// before (a counter q writes into r's memory with cuStreamWriteValue64 after that operation's
// wait), copies r's block into q's staging slot for r and raises q's arrival counter for r. No
// rendezvous: a rank ahead of its peers delivers early. Each rank sends in ring order (r + 1,
// r + 2, ...; the copy engines run one copy at a time at the link's full rate), so a rank
// receives one block at a time, from r - 1 first, and what was computed first travels first.
// The waits run on the compute stream (cuStreamWaitValue64: no host takes part): wait_from waits
// for one peer's arrival and moves its block into the gathered buffer, so the GEMM over those rows
// can start while the next block travels; the wait does the same for every peer not yet placed,
// in ring order, waits for r's own copies and tells each peer its staging is free again. A
// reduction is this rank's block (or what recv holds, for reduce_scatter_add_block) plus the
// peers' blocks in the order they arrive (two ranks: the bits NCCL's sum gives).
// Operations are numbered in the order every rank starts them, so the counters match without
// any host exchange. Up to four operations may be started before a wait, each with staging of its
// own (the tp regions start one at a time).
//
// Every other call goes to the NCCL communicator it wraps, which it owns.
#ifndef TRAINER_COMM_PEER_H
#define TRAINER_COMM_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "kernels/backend.h"
#include "parallel/comm/comm.h"

// Whether every pair of the ranks of mpi reaches the other's GPU memory (same host, peer access);
// collective over mpi. When not, why names the first pair that cannot (a one-line reason).
int comm_peer_possible(MPI_Comm mpi, char *why, size_t n_why);
// Wraps inner (an NCCL communicator, on be's compute stream), taking ownership: the result's
// free frees inner too. Collective over inner's ranks; comm_peer_possible must hold. Staging
// memory comes from be (counted as a workspace) and grows on first use of each larger size.
comm *comm_peer_create(comm *inner, k_backend *be);
// True when c was made by comm_peer_create.
int comm_peer_is(const comm *c);

// The primitives, also for commbench --p2p-sweep.
// On stream (a cudaStream_t): after the work queued before, *flag (local or a peer's, mapped) = v.
void peer_signal(void *stream, uint64_t *flag, uint64_t v);
// On stream: the work queued after waits until *flag (this GPU's memory) >= v.
void peer_await(void *stream, const uint64_t *flag, uint64_t v);
// every[i] = rank i's allocation local (each rank passes its own cudaMalloc'd pointer), mapped
// into this process through an IPC handle; every[own rank] = local. Collective over mpi.
void peer_map_all(MPI_Comm mpi, void *local, void **every);
// Unmaps what peer_map_all mapped (not own). Collective over mpi: every rank's work on the
// mapped memory must be done before.
void peer_unmap_all(MPI_Comm mpi, void **every);

#endif
