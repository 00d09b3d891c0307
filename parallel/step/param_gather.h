// The FP8 weight gather (fp8.param_gather; docs/config.md, FP8 training): with the distributed
// optimizer and per-tensor FP8 scales, the buckets of the updated weights reach the other dp
// ranks as FP8 codes (one byte an element) instead of the compute copy (bf16, fp32 on CPU ranks),
// and the FP8 copies that the next step reads come out bit for bit as the compute copy's cast
// would make them.
// After the update each rank takes the amax of its part of every FP8 weight (of the new compute
// copy), the amaxes of all weights are maxed over dp in one all-reduce (and over tp), each weight
// is scaled from its amax as model_fp8_begin_step scales it, and each rank casts its parts to
// codes in a flat buffer (model_fp8_codes_flat, where the weights' codes live). A bucket whose
// elements are all FP8 weights (whose compute copy nothing else reads), norms (shared in fp32 by
// the optimizer, opt_share_norms) or padding is all-gathered as codes; any other bucket (the
// embedding, a bf16 head, bf16 edge layers, a tied FP8 head) in the act dtype as before, and the
// FP8 weights' parts in it are cast from the gathered copy. Then the transposes are made from the
// codes. A bucket's parts are flat ranges, so buckets and parts cut weights and rows anywhere.
// The compute copy of the FP8 weights in code buckets is then stale outside this rank's parts:
// only the FP8 GEMMs read those weights, and checkpoints take the fp32 masters (opt_get_shard).
#ifndef TRAINER_PARAM_GATHER_H
#define TRAINER_PARAM_GATHER_H

#include <stdint.h>
#include "parallel/step/optim_core.h"

typedef struct param_gather {
  char *bucket_codes;         // (n_buckets) counted from the lowest, as bucket_lo: 1 = gathered as codes
  int *act_first;             // (n_buckets + 1) act-dtype buckets among the lowest b: an index into act_at
  int64_t *act_at, *act_len;  // (n_act) the act-dtype buckets' regions of the compute copy, lowest first
  int64_t *code_at, *code_len;  // (n_code) the code buckets' regions of the codes buffer, lowest first
  int n_act, n_code;
  int64_t lo;                 // flat element of the codes buffer's first byte (a multiple of 16)
  uint8_t *codes;             // model_fp8_codes_flat's buffer; NULL without FP8 weights
  // Spans of FP8 weights (k_span.at counted from lo, tensor the weight slot): this rank's parts of
  // every bucket (their amax), of the code buckets (cast before the gather), and the whole of the
  // act-dtype buckets (cast after it).
  k_span *own, *own_code, *rest;
  int n_own, n_own_code, n_rest;
  // Bytes a rank receives per step: as codes, in the act dtype, and without fp8.param_gather.
  double bytes_codes, bytes_act, bytes_plain;
} param_gather;

// Whether opt_init makes one: fp8.param_gather with ZeRO (dp > 1) and FP8.
static inline int param_gather_on(const opt_config *oc, const model *m, int zero) {
  return oc->fp8_param_gather && zero && m->fp8;
}
// After opt_layout_build (it needs the buckets); moves the weights' codes into its buffer.
param_gather *param_gather_init(const opt_state *o);
void param_gather_free(param_gather **pg);  // safe twice
// Starts the all-gather of the act-dtype buckets among buckets [b0, b0 + nb) (counted from the
// lowest) of the compute copy: a piece's, as its update is done.
void param_gather_start_act(opt_state *o, int b0, int nb);
// Collective over dp and tp, after every piece's update: the amaxes, the scales, this rank's
// parts cast to codes, and the all-gather of the code buckets started.
void param_gather_start_codes(opt_state *o);
// After the wait: the FP8 weights' parts of the act-dtype buckets cast from the gathered compute
// copy, and the transposes; the FP8 copies are current (the next step does not remake them).
void param_gather_finish(opt_state *o);

#endif
