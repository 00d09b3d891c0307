// Communicator interface: the collectives and point-to-point calls the parallel layer uses,
// as a table of functions plus a context, so an MPI implementation (host buffers, CPU ranks)
// and an NCCL one (device buffers) are interchangeable. Buffers are in the memory of the
// backend that owns the communicator. Counts are in elements. A communicator takes all its
// settings (stream, timeout, CTAs, MPI message size) at creation, from a comm_opts, and is made
// through a comm_factory, which grid_init calls for every group.
#ifndef TRAINER_COMM_H
#define TRAINER_COMM_H

#include <stdint.h>
#include <mpi.h>

// COMM_F16 (IEEE binary16) and COMM_I8 carry the compressed DP gradients (grad_compress.c).
typedef enum comm_dtype { COMM_F32, COMM_BF16, COMM_F64, COMM_I32, COMM_I64, COMM_F16, COMM_I8 } comm_dtype;
typedef enum comm_redop { COMM_SUM, COMM_MAX } comm_redop;

typedef struct comm comm;
typedef struct comm_ops {
  void (*all_reduce)(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op);
  // recv holds size * n_elem, rank r's send lands at recv + r * n_elem.
  void (*all_gather)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t);
  // send holds size * n_elem; rank r gets the reduction of everyone's block r in recv (n_elem).
  void (*reduce_scatter)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, comm_redop op);
  void (*broadcast)(comm *c, void *buf, int64_t n_elem, comm_dtype t, int root);
  // send holds size * n_elem; block r goes to rank r; recv gets block c->rank of every rank.
  void (*all_to_all)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t);
  // Point-to-point. Between group_start and group_end they are only posted; group_end
  // completes them all, so a group may hold crossed sends and receives without deadlock.
  // Outside a group each call completes before returning. "Completes" means done for MPI, and
  // enqueued in stream order for NCCL (later work on the stream sees the result). There are no tags: between two
  // ranks, sends and receives are matched in the order they are posted. Buffers posted in a
  // group must stay valid until group_end. One group at a time (no nesting in the MPI backend).
  void (*send)(comm *c, const void *buf, int64_t n_elem, comm_dtype t, int peer);
  void (*recv)(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer);
  void (*group_start)(comm *c);
  void (*group_end)(comm *c);
  void (*barrier)(comm *c);
  void (*free)(comm *c);
  // Asynchronous collectives, to overlap communication with compute (DP gradient buckets during
  // backward). A start takes the data as the work queued before it leaves it (on GPUs: the
  // communicator's stream, which is the compute stream) and returns at once; its buffers must not
  // be touched until wait. No groups around them. Every rank starts the same calls in the same
  // order. MPI (host buffers): a start copies what it reads and the next wait or drain runs it,
  // as the blocking call (the same bits; a result read before its wait is stale and data
  // written after its start is not sent, as on GPUs). NCCL: the collective runs on a side stream.
  void (*all_reduce_start)(comm *c, void *buf, int64_t n_elem, comm_dtype t, comm_redop op);
  void (*reduce_scatter_start)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, comm_redop op);
  // recv (n_elem, fp32) += the sum over the other ranks of their block c->rank of send (size *
  // n_elem of dtype t: COMM_F32, or COMM_BF16, widened as added), started block by block: each call says send's block for rank `to` is written
  // (the work queued so far wrote it) and sends it, so the first blocks travel while the next are
  // computed. Every rank calls it for to = rank + 1, rank + 2, ... (mod size), all but itself, in
  // that order; the first call starts the operation and the wait completes it. This rank's block
  // of send is not read, and recv is read and written only by the wait, so work queued between
  // the calls and the wait may write recv (the sequence-parallel row-parallel projection's own
  // rows). NULL where the communicator has no such operation (all but the peer copies): tp.c
  // composes it from reduce_scatter_start.
  void (*reduce_scatter_add_block)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t, int to);
  // all_to_all, started (the int8 gradient reduction's exchange of blocks).
  void (*all_to_all_start)(comm *c, const void *send, void *recv, int64_t n_elem, comm_dtype t);
  // In place, over regions: region i starts at element at[i] of buf and holds size blocks of
  // n_elem[i] elements; rank r's block of every region reaches every rank. One operation (NCCL:
  // one group) for all the regions.
  void (*all_gather_regions_start)(comm *c, void *buf, const int64_t *at, const int64_t *n_elem, int n_regions,
                                   comm_dtype t);
  // Work queued after wait (compute stream) sees the results of every collective started
  // before it. Never blocks the host.
  void (*wait)(comm *c);
  // Where the only collective started is an all_gather_regions_start: work queued after it sees
  // rank `from`'s blocks in place (the others may still be on their way), so the GEMM over those
  // rows can start; wait after the last. Anything else started: as wait. NULL where the
  // communicator cannot wait for one rank's blocks (all but the peer copies): tp.c waits for all.
  void (*wait_from)(comm *c, int from);
  // Blocks the host until every started collective has completed. NCCL bounds the wait by the
  // communicator timeout and ends the job with a message naming the group and the operation.
  void (*drain)(comm *c);
  // Transfers that overlap compute (the pipeline with parallel.pp_overlap). xfer_open, called
  // once by every rank together, sets up one channel per direction between neighbours (peer =
  // rank +- 1 mod size); a channel's transfers run in posting order, concurrently with compute
  // and with the other channels (NCCL: a communicator and a stream per directed link), and
  // between two ranks they are matched in posting order, as for send/recv. xfer_start posts one
  // send or receive, to start once the work behind each of the n_after tickets is done, and
  // returns its ticket; its buffer must stay untouched until that ticket has been waited for.
  // xfer_mark returns a ticket for the compute queued so far. xfer_wait makes the compute
  // queued from now on wait for a ticket (MPI: the host waits for the transfer). xfer_reset
  // forgets every ticket; each one must have been waited for by then.
  void (*xfer_open)(comm *c);
  int (*xfer_start)(comm *c, void *buf, int64_t n_elem, comm_dtype t, int peer, int is_send, const int *after,
                    int n_after);
  int (*xfer_mark)(comm *c);
  void (*xfer_wait)(comm *c, int ticket);
  void (*xfer_reset)(comm *c);
  // Memory this communicator's all-gathers move through the copy engines, using no SMs (NCCL
  // with comm_opts.zero_cta on one node: ncclMemAlloc memory registered as a symmetric window;
  // an in-place gather whose region lies in it runs so). buffer_alloc is collective: every rank
  // asks for the same size, in the same order; zero-filled. NULL where the communicator has no
  // such memory (MPI, staged, NCCL without zero_cta): the caller then takes its backend's.
  // buffer_free deregisters and frees one (collective too), before the communicator is freed.
  void *(*buffer_alloc)(comm *c, size_t n_bytes);
  void (*buffer_free)(comm *c, void *buf);
} comm_ops;

struct comm {
  const comm_ops *ops;
  int rank;
  int size;
  char name[16];     // "world", "tp", "dp", "pp": named in error messages
  MPI_Comm mpi;      // the MPI communicator of this group (kept by every implementation)
  void *impl;        // implementation state
};

// What a communicator is made with, fixed at creation. Every field is used only by the
// implementations it names; comm_opts_make fills one from plain values (the config's).
typedef struct comm_opts {
  double timeout_s;         // NCCL: longest blocking wait (a collective, set-up, tear-down) before the
                            // job ends with a message naming the group and the operation; > 0
  int max_ctas;             // NCCL: CTAs (so SMs) one operation may use; 0 = NCCL's choice
  int64_t mpi_chunk_elems;  // MPI (also under the staged communicator): the largest count of one MPI
                            // call, so counts above INT_MAX work; 0 = INT_MAX; tests lower it to run
                            // the chunked paths on small buffers
  void *stream;             // NCCL, staged: the cudaStream_t every operation is ordered on (the
                            // backend's compute stream); NULL = the legacy default stream
  int zero_cta;             // NCCL: the zero-CTA policy: collectives on buffer_alloc memory that the
                            // copy engines can run (all-gathers) run there (parallel.gather_copy_engine)
} comm_opts;

#define COMM_TIMEOUT_S_DEFAULT 600.0

// Options from plain values, checked (comm_opts_check). The defaults: timeout
// COMM_TIMEOUT_S_DEFAULT, max_ctas 0, mpi_chunk_elems 0, stream NULL.
comm_opts comm_opts_make(double timeout_s, int max_ctas, int64_t mpi_chunk_elems, void *stream);
static inline comm_opts comm_opts_default(void) { return comm_opts_make(COMM_TIMEOUT_S_DEFAULT, 0, 0, NULL); }
// Aborts with a message naming the field (and its config key) when o is out of range; who
// names the caller.
void comm_opts_check(const comm_opts *o, const char *who);

// Makes the communicators of one kind: grid_init calls create for every group, with opts (or
// its own copy of them, changed, for a second communicator such as dp-overlap). ctx is the
// state that all the communicators of the factory share (NCCL: the list of live communicators
// aborted together on a failure, the depth of the open NCCL group); NULL for MPI and staged.
// A factory is made once per process by comm_mpi_factory, comm_nccl_factory (comm_nccl.h) or
// comm_staged_factory (comm_staged.h) and freed by comm_factory_free after every communicator it
// made.
typedef struct comm_factory {
  // Over the ranks of mpi, which it duplicates (the caller may free mpi right after). Collective
  // over mpi. Returns a communicator to comm_free.
  comm *(*create)(void *ctx, MPI_Comm mpi, const char *name, const comm_opts *opts);
  void (*free_ctx)(void *ctx);  // NULL: ctx needs no freeing
  void *ctx;
  comm_opts opts;               // what create is given unless the caller says otherwise
} comm_factory;

// f->create with f's own options.
static inline comm *comm_factory_create(const comm_factory *f, MPI_Comm mpi, const char *name) {
  return f->create(f->ctx, mpi, name, &f->opts);
}
// Frees f's shared state; every communicator it made must be freed before. Safe twice.
void comm_factory_free(comm_factory *f);

// MPI implementation over host buffers. Duplicates mpi; opts (NULL: comm_opts_default) gives
// mpi_chunk_elems. Returns a communicator to comm_free.
comm *comm_mpi_create(MPI_Comm mpi, const char *name, const comm_opts *opts);
// A factory of MPI communicators with opts (copied; NULL: comm_opts_default).
comm_factory comm_mpi_factory(const comm_opts *opts);
// Safe with NULL and twice (sets *c to NULL).
void comm_free(comm **c);
// buffer_alloc and buffer_free of a communicator without copy-engine memory (MPI, staged).
void *comm_no_buffer_alloc(comm *c, size_t n_bytes);
void comm_no_buffer_free(comm *c, void *buf);
int comm_dtype_bytes(comm_dtype t);
// The other ranks in ring order from c's, k = 1 .. size - 1: the k-th to send to (rank + k) and
// the k-th to hear from (rank - k), every rank sending in its own ring order (reduce_scatter_add_block,
// wait_from).
static inline int comm_ring_to(const comm *c, int k) { return (c->rank + k) % c->size; }
static inline int comm_ring_from(const comm *c, int k) { return (c->rank - k + c->size) % c->size; }
// Makes room for need entries of elem bytes in the array *p of capacity *cap (doubling; new
// entries zeroed), for the lists a communicator implementation keeps; what names it in errors.
void comm_grow(const comm *c, void **p, int *cap, int need, size_t elem, const char *what);

#endif
