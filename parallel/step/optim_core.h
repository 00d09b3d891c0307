// The optimizer's core: what every part of the data-parallel optimizer shares and nothing above
// it. The DP buckets and their parts (this rank's shard), the update and norm ranges, where each
// element of the optimizer's state lives (backend or host memory), the AdamW of one bucket's part,
// and the helpers of the reduce and gather schedules. On it sit the update engines
// (optim_engine.h), the sharded gradients (grad_shard.h) and weights (weight_shard.h), the FP8
// weight gather (param_gather.h) and the compressed reduction (grad_compress.h); optim.h's step
// drives them all (its opening comment draws the graph). This header declares two small
// interfaces the step fills at opt_init: the update engine (opt_engine) and the after-update
// hooks (opt_hook).
#ifndef TRAINER_OPTIM_CORE_H
#define TRAINER_OPTIM_CORE_H

#include <stdint.h>
#include "model/model.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/timing.h"
#include "parallel/step/optim_config.h"

// A DP bucket: flat elements [lo, hi), overlapping tensors [t_lo, t_hi); cut into parts of len
// elements (one per dp rank with ZeRO), this rank's part at shard_off in its shard.
typedef struct opt_bucket {
  int64_t lo, hi, len, shard_off;
  int t_lo, t_hi;
  int group;                // parallel.shard=grads: the group of tensors it is (opt_group); else -1
} opt_bucket;

// The id of group `layer` of chunk (model.h's hooks: a layer's index, MODEL_GRADS_HEAD or
// MODEL_GRADS_EMBED) in the optimizer's tables.
static inline int opt_group(int chunk, int layer) { return chunk * 4096 + layer + 2; }

// A step's AdamW arguments beside opt_config's: learning rate, bias corrections, and the gradient's
// scale (clipping).
typedef struct opt_hparams {
  float lr, bc1, bc2, g_scale;
} opt_hparams;

typedef struct opt_state opt_state;

// An update engine: how AdamW runs over this rank's shard, chosen once at opt_init
// (optim_engine.h). Every method takes the optimizer; the engine keeps its own state in ctx. A
// method an engine leaves NULL is filled by opt_engine_fill with one that does nothing (returning
// 0, or m->n_params for pending_lo).
typedef struct opt_engine {
  const char *name;
  void *ctx;
  // Backward has made gradients final (model.grads_ready, after the DP buckets it allows started).
  void (*grads_final)(opt_state *o);
  // Every update the engine left in flight or pending is done: the state may be read or written.
  void (*settle)(opt_state *o);
  // The compute stream waits for bucket b's update, where it runs beside (a gather of its weights).
  void (*wait_bucket)(opt_state *o, int b);
  // The step's update begins, grad (this rank's gradient, shard order) reduced: what the last step
  // left running is joined and the gradient's copies start.
  void (*begin)(opt_state *o, const float *grad);
  // Updates piece k (opt_state.piece_first, piece_bucket): queued, before its gathers start.
  void (*update_piece)(opt_state *o, int k, const float *grad, const opt_hparams *h);
  // After the step's hooks: starts what runs beside the next step.
  void (*end)(opt_state *o, const opt_hparams *h);
  // A step whose update is skipped: 1 if weights changed even so (an earlier update's arrived).
  int (*skip)(opt_state *o);
  // After settle: puts in place the results of an update that ran beside; 1 if weights changed.
  int (*flush)(opt_state *o);
  // The first element of m->grads that a pending update still reads (m->n_params: none).
  int64_t (*pending_lo)(const opt_state *o);
  // Ends what runs and frees what init allocated (safe once the engine is set up).
  void (*free)(opt_state *o);
} opt_engine;

// Work that follows a change of the weights (an update, a load, a flush, a skipped step whose
// earlier update arrived), registered at opt_init. The step runs every hook's start in the order
// registered once this rank's parts of the compute copy are queued (and their ZeRO gathers
// started), then waits for those gathers, then every finish in the reverse order.
typedef struct opt_hook {
  const char *name;
  void (*start)(opt_state *o);   // NULL: nothing to start
  void (*finish)(opt_state *o);  // NULL: nothing after the gathers
} opt_hook;

enum { OPT_MAX_HOOKS = 4 };
enum { OPT_TRIAL_MAX = 1 << 24 };  // elements of a block of the update's trial (cfg.check_update)
// The trial's block for a shard of shard_n elements: the whole shard up to OPT_TRIAL_MAX (its
// buffer holds four arrays of it: weights, both moments, gradient).
static inline int64_t opt_trial_elems(int64_t shard_n) {
  return shard_n < OPT_TRIAL_MAX ? (shard_n > 0 ? shard_n : 1) : OPT_TRIAL_MAX;
}

// Which part of this rank's optimizer state (opt_state_at).
typedef enum opt_state_part { OPT_MASTER, OPT_EXP_AVG, OPT_EXP_AVG_SQ } opt_state_part;

struct opt_state {
  model *m;
  grid *g;
  opt_config cfg;
  int zero;                 // distributed optimizer over dp
  int64_t bucket_elem;      // DP bucket size
  int parts, part_rank;     // each bucket's parts (the shard group's size, dp unless parallel.shard_group, with
                            // ZeRO; else 1), and which is this rank's
  comm *replica;            // parallel.shard_group: the ranks holding the same parts in the other groups; else NULL
  int64_t shard_n;          // elements this rank updates: its part of every bucket (see opt_bucket)
  opt_engine engine;        // the update engine (optim_engine.h)
  const opt_hook *hooks[OPT_MAX_HOOKS];  // after-update hooks, in the order registered
  int n_hooks;
  // The state, in shard order: the device share [0, dev_n) in backend memory (dev_master only
  // where the optimizer holds the master weights, m->master_in_optimizer; else m->params is the
  // master), the host share [dev_n, shard_n) in host memory (optimizer.offload=host; the offload
  // engine allocates it), each indexed from dev_n. opt_state_at finds an element in either.
  int64_t dev_n;
  float *exp_avg, *exp_avg_sq;  // (dev_n) backend memory
  float *dev_master;        // (dev_n) backend memory, master_in_optimizer only
  float *host_master;       // (shard_n - dev_n) backend host memory
  float *host_m, *host_v;   // (shard_n - dev_n) backend host memory
  int64_t host_bytes;       // backend host memory the optimizer's state takes on this rank
  void *part_pc;            // (shard_n) act dtype, with parallel.shard=weights where the update writes the compute
                            // weights (offload): this rank's part of every bucket in shard order; else NULL
  int layer_wait;           // the host update finishes in the next forward, layer by layer (optim_offload.c)
  float *grad_shard;        // (shard_n) ZeRO only
  struct grad_shard *gs;    // parallel.shard=grads: the gradients' staging (grad_shard.h); NULL = m->grads
  struct weight_shard *ws;  // parallel.shard=weights: the compute copy's slots (weight_shard.h); NULL = m->params_c
  struct grad_compress *gc;  // parallel.grad_compress (dp > 1): grad_compress.h; NULL = fp32
  struct param_gather *pg;  // fp8.param_gather (ZeRO, FP8): param_gather.h; NULL = the compute copy gathered
  float *norm_pack;         // (norm_pack_n) ZeRO with a separate compute copy: see opt_share_norms (optim.c)
  float *trial;             // cfg.check_update: 4 x trial_n floats, the update tried on copies (optim.c); else NULL
  int64_t trial_n;
  int update_refused;       // the last opt_step refused an update that would have left non-finite values
  int64_t norm_pack_n;      // elements of all norm tensors
  step_timing *timing;      // gradient-sync and update time are added here; NULL = not timed
  int time_waits;           // log.time_dp: also the waits of forward and backward for sharded gradients' and
                            // weights' collectives (a sync around each), into timing->dp_comm
  // Overlap of the DP reduction with backward (model.grads_ready): a tensor's gradient is final
  // once its group was reported n_micro times in a step; a bucket is started once every tensor
  // it overlaps is final. Buckets start in a fixed order (last first), the same on every rank.
  int n_micro;              // backward passes per chunk and step
  int *t_group;             // (n_tensors) chunk * 4096 + (layer + 2): what model_chunk_bwd reports
  int *t_count;             // (n_tensors) reports received this step
  char *t_final;            // (n_tensors) final this step (tp-reduced under SP)
  opt_bucket *buckets;      // (n_buckets) from the end of the flat buffer to its start
  int n_buckets, next_bucket;
  k_range *norm_ranges, *upd_ranges;  // counted in the norm; updated (offset in the shard, p_offset flat)
  int n_norm_ranges, n_upd_ranges;
  int n_pieces;             // the update's pieces: 1, or with ZeRO's gathers a few (see opt_init)
  int *piece_first;         // (n_pieces + 1) piece k's update ranges start at upd_ranges[piece_first[k]]
  int *piece_bucket;        // (n_pieces + 1) and its buckets, counted from the lowest
  int64_t *bucket_lo, *bucket_len;  // (n_buckets) each bucket's lo and part length, lowest first
  k_range *norm_all;        // every norm tensor: offset in norm_pack, p_offset flat
  k_range *norm_own;        // the norm elements this rank updates, the same way
  int n_norm_all, n_norm_own;
  // Where the optimizer holds the master weights: every bucket's update ranges, offsets from the
  // start of its part (part_ranges from part_first[b]); and the norm elements of every part,
  // offset in the shard, p_offset in m->norm_copy (master_norms).
  k_range *part_ranges;
  int *part_first;          // (n_buckets + 1)
  k_range *master_norms;
  int n_master_norms;
};

// Builds the buckets, the shard's ranges, the pieces, the norm packing and (master_in_optimizer)
// the part ranges from o->m, o->parts, o->part_rank, o->bucket_elem and o->n_pieces
// (optim_layout.c).
void opt_layout_build(opt_state *o);
void opt_layout_free(opt_state *o);
// This rank's part of bucket k: its first element in the flat buffer.
int64_t opt_part_lo(const opt_state *o, const opt_bucket *k);
// Where the compute copy of this rank's part of bucket k lives: in m->params_c at opt_part_lo,
// or with parallel.shard=weights in part_pc (NULL without it: the update writes the masters only).
void *opt_part_pc(const opt_state *o, const opt_bucket *k);
// The bucket that is group grp (opt_group) when buckets are groups (model.grads_in_optimizer).
int opt_bucket_of_group(const opt_state *o, int grp);

// The wire type of the compute copy's all-gather: the backend's activation dtype.
static inline comm_dtype opt_act_comm(const opt_state *o) { return o->m->be->act == K_BF16 ? COMM_BF16 : COMM_F32; }
// Under sequence parallelism the gradients of tp-replicated tensors (norms) are partial per tp
// rank (each saw only its sequence shard): tensor i's is summed over tp here (compute stream);
// a no-op for the others.
void opt_sum_sp_partial(opt_state *o, int i);
// comm's wait (the compute stream waits for the collectives started on comm); with time_waits
// timed into timing->dp_comm, with a sync before and after (parallel/comm/timing.h).
// gather: the wait is for a weights' all-gather (also into timing->dp_gather).
void opt_comm_wait(opt_state *o, comm *c, int gather);
// The compute stream waits for bucket b's update, if the engine runs it beside (a no-op otherwise).
static inline void opt_update_wait(opt_state *o, int b) { o->engine.wait_bucket(o, b); }
// Gives the methods the engine left NULL their do-nothing defaults.
void opt_engine_fill(opt_engine *e);

// Element shard_off of this rank's master weights or moments, in the device or the host share.
float *opt_state_at(const opt_state *o, opt_state_part which, int64_t shard_off);
// The device share (dev_n, set by the engine) in backend memory: the moments, and the master
// weights where the optimizer holds them; freed by opt_state_free.
void opt_state_alloc(opt_state *o);
void opt_state_free(opt_state *o);
// AdamW over n ranges r of bucket b's part (offsets from the part's start) by the backend, its
// state wherever it lives (mapped host memory for the host share): master weights, moments and
// this rank's part of the compute copy. opt_update_bucket: over the whole part (part_ranges).
void opt_update_part(opt_state *o, int b, const k_range *r, int n, const float *grad, const opt_hparams *h);
void opt_update_bucket(opt_state *o, int b, const float *grad, const opt_hparams *h);
// This rank's shard of the master weights or a moment, device share then host share, into host
// memory (shard_n elements); and a moment back. After the engine's settle.
void opt_state_to_host(opt_state *o, opt_state_part which, float *shard_host);
void opt_state_from_host(opt_state *o, opt_state_part which, const float *shard_host);
// n_elem master weights at shard offset shard_off (within one bucket part) from host memory.
void opt_master_set(opt_state *o, int64_t shard_off, const float *src_host, int64_t n_elem);
// This rank's part of every bucket of the compute copy, cast from the master weights.
void opt_master_cast(opt_state *o);
// The master's norm elements this rank updates at shard offsets [lo, hi) into pack (laid out as
// m->norm_copy).
void opt_master_norms_out(opt_state *o, float *pack, int64_t lo, int64_t hi);

#endif
