// Causal bf16 attention (forward and backward) on cuDNN's fused flash-attention engines,
// through cuDNN 9's graph API in its C form (backend descriptors): each direction is one
// operation graph of matmuls, pointwise ops and reductions that cuDNN recognises as its SDPA
// pattern and runs as a fused kernel. Contract and layouts: kernels/cuda/attn_cudnn.h.
//
// Nothing here needs a cuDNN newer than 9.14 (the GPU hosts' runtime): the single-node SDPA
// descriptors of newer releases (OPERATION_SDPA_FWD/BWD) are not used, since on Hopper with
// 9.14 only the composite pattern below is served.
//
// Forward graph, per (batch, head), scores S (T, T) never leave the chip:
//   S = Q K^T * scale, causal-masked (row >= col keeps, else -FLT_MAX)
//   M = rowmax S, Z = rowsum exp(S - M), stats = M + log Z (natural log: our lse exactly)
//   O = (exp(S - M) / Z) V
// Backward graph (flash-attention backward, P recomputed from the saved stats):
//   delta = rowsum(dO * O)  -> fp32 buffer in our workspace (the engine wants it in memory)
//   P = exp(Q K^T * scale - stats), causal-masked;  dV = P^T dO
//   dS = P * (dO V^T - delta) * scale;  dK = dS^T Q;  dQ = dS K
//   with nkv < nh, dK and dV are produced per query head and summed over each group by a
//   reduction in the graph.
// dQ either comes from one matmul (deterministic: cuDNN keeps dP in its workspace) or
// accumulates in an fp32 buffer with atomics, then converts (less memory, not reproducible).
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_check.h"

#include <cudnn_graph.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Execution-time failures are bugs or broken devices, not unsupported shapes: they end the job
// like every other check, with cuDNN's status name and its last error message.
#define CUDNN_CHECK(call)                                                                           \
  do {                                                                                              \
    cudnnStatus_t cudnn_rc_ = (call);                                                               \
    if (cudnn_rc_ != CUDNN_STATUS_SUCCESS) {                                                        \
      char cudnn_msg_[256] = "";                                                                    \
      cudnnGetLastErrorString(cudnn_msg_, sizeof cudnn_msg_);                                       \
      k_cuda_fail(__FILE__, __LINE__, __func__, #call, "cuDNN", cudnnGetErrorString(cudnn_rc_),     \
                  cudnn_msg_);                                                                      \
    }                                                                                               \
  } while (0)

typedef cudnnBackendDescriptor_t desc_t;

// Unique ids of the tensors the caller's pointers (or our workspace, or host scalars) back.
// Virtual tensors take ids from UID_VIRTUAL up.
enum {
  UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
  UID_SCALE, UID_NEG, UID_ONE, UID_DELTA, UID_DQ_ACC, UID_SEQ_Q, UID_SEQ_KV,
  UID_VIRTUAL = 100
};

enum { ATTN_CACHE = 32, ATTN_MAX_DEV = 64, ATTN_ALIGN = 256 };

typedef struct {
  int64_t d[4], s[4];
} shape4;

// One operation graph under construction. Every descriptor made for it is kept until the plan
// is freed: the plan was finalised against them and cuDNN documents no ownership transfer.
// The first failing call is remembered in why, later calls do nothing.
typedef struct {
  desc_t *all;
  int n_all, cap_all;
  desc_t ops[48];
  int n_ops;
  int64_t next_uid;
  int failed;
  char why[512];
} attn_graph;

// A problem's shape: B sequences of T rows, nh query and nkv kv heads of hd. A backward run in
// pieces (bwd_piece) is a piece of a larger problem: rows of B_all sequences (row t of sequence b
// is row t * B_all + b) and o, dO and the stats of nh_all heads, of which the piece's pointers
// start at the piece's first sequence and head.
typedef struct {
  int B, T, nh, nkv, hd;
  int64_t ld;  // row stride of q, k, v and their gradients
  int B_all, nh_all;
} attn_shape;

typedef struct {
  int used, dir, det_req, device;
  attn_shape sh;
  int status;  // 0 planned, -1 refused by cuDNN (kept so refusals stay cheap)
  uint64_t last_use;
  attn_graph g;
  desc_t plan;
  int64_t engine;
  int64_t ws_cudnn;            // cuDNN's own workspace, at offset 0
  int64_t off_delta, off_dqacc, ws_total;
  int det_graph, nondet_note, padded;
  int32_t *seq_len;            // (2, sh.B) device: T for every batch, for the padding-mask workaround
  float scale, neg, one;       // host values of the by-value scalars
} attn_plan;

// The state of one k_cudnn_attn (one per CUDA backend that runs bf16 attention).
struct k_cudnn_attn {
  int version;                          // runtime cuDNN version, 0 if unusable
  int det;                              // requested backward flavour for new plans
  cudnnHandle_t handle[ATTN_MAX_DEV];
  int handle_state[ATTN_MAX_DEV];       // 0 untried, 1 ready, -1 cudnnCreate failed
  attn_plan cache[ATTN_CACHE];
  uint64_t clock;
  void *ws;
  size_t ws_bytes;
  size_t bwd_cap;                       // the deterministic backward's workspace, at most (bwd_piece)
};

// The deterministic backward keeps dP, (B, nh, T, T), in its workspace: where its plan asks for
// more than this, the backward runs in pieces of fewer sequences and heads (bwd_piece).
enum { ATTN_BWD_CAP_MIB = 512 };

// ---------------------------------------------------------------------------------------------
// Graph building: thin checked wrappers over the backend descriptor calls

static void g_fail(attn_graph *g, const char *what, cudnnStatus_t st) {
  if (g->failed) return;
  g->failed = 1;
  char last[384] = "";
  cudnnGetLastErrorString(last, sizeof last);
  snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, cudnnGetErrorString(st), last[0] ? " - " : "", last);
}

static desc_t g_new(attn_graph *g, cudnnBackendDescriptorType_t type) {
  if (g->failed) return NULL;
  desc_t d = NULL;
  const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
  if (st != CUDNN_STATUS_SUCCESS) {
    g_fail(g, "cudnnBackendCreateDescriptor", st);
    return NULL;
  }
  if (g->n_all == g->cap_all) {
    g->cap_all = g->cap_all ? 2 * g->cap_all : 128;
    g->all = (desc_t *)realloc(g->all, sizeof(desc_t) * (size_t)g->cap_all);
    CHECK(g->all != NULL, "out of host memory for %d cuDNN descriptors", g->cap_all);
  }
  g->all[g->n_all++] = d;
  return d;
}

static void g_set(attn_graph *g, desc_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t n, const void *v) {
  if (g->failed) return;
  const cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, n, v);
  if (st != CUDNN_STATUS_SUCCESS) {
    char what[64];
    snprintf(what, sizeof what, "cudnnBackendSetAttribute(attribute %d)", (int)name);
    g_fail(g, what, st);
  }
}

static void g_finalize(attn_graph *g, desc_t d, const char *what) {
  if (g->failed) return;
  const cudnnStatus_t st = cudnnBackendFinalize(d);
  if (st != CUDNN_STATUS_SUCCESS) {
    char w[96];
    snprintf(w, sizeof w, "cudnnBackendFinalize(%s)", what);
    g_fail(g, w, st);
  }
}

static void g_free(attn_graph *g) {
  for (int i = g->n_all - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->all[i]);
  free(g->all);
  memset(g, 0, sizeof *g);
}

static desc_t g_tensor(attn_graph *g, int64_t uid, cudnnDataType_t dt, const shape4 *sh, bool is_virtual,
                       bool by_value) {
  desc_t t = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;  // the header asks callers for 16-byte aligned pointers
  g_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  g_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, sh->d);
  g_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, sh->s);
  g_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  g_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  g_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) g_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  g_finalize(g, t, "tensor");
  return t;
}

static desc_t g_virt(attn_graph *g, cudnnDataType_t dt, const shape4 *sh) {
  return g_tensor(g, g->next_uid++, dt, sh, true, false);
}

static void g_op(attn_graph *g, desc_t op, const char *what) {
  g_finalize(g, op, what);
  if (g->failed) return;
  CHECK(g->n_ops < (int)(sizeof g->ops / sizeof g->ops[0]), "attention graph has more than %d operations",
        (int)(sizeof g->ops / sizeof g->ops[0]));
  g->ops[g->n_ops++] = op;
}

// y = mode(x [, b [, t]]). axis >= 0 only for GEN_INDEX. For BINARY_SELECT, t is the predicate:
// y = t ? x : b.
static void g_pw(attn_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, desc_t x, desc_t b, desc_t t,
                 desc_t y, int64_t axis) {
  desc_t pw = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  g_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  g_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  if (axis >= 0) g_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  g_finalize(g, pw, "pointwise");
  desc_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  g_op(g, op, "pointwise operation");
}

// Fp32 pointwise op into a new virtual fp32 tensor of shape sh.
static desc_t g_pwf(attn_graph *g, cudnnPointwiseMode_t mode, desc_t x, desc_t b, const shape4 *sh) {
  desc_t y = g_virt(g, CUDNN_DATA_FLOAT, sh);
  g_pw(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
  return y;
}

// c = a b over the last two dims, batched over the first two (b may have fewer heads: grouped
// query). The overrides (per-batch row counts, or NULL) go with the padding-mask workaround.
static void g_matmul(attn_graph *g, desc_t a, desc_t b, desc_t c, desc_t m_ovr, desc_t n_ovr, desc_t k_ovr) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  desc_t mm = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  g_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  g_finalize(g, mm, "matmul");
  desc_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
  if (m_ovr) g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m_ovr);
  if (n_ovr) g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n_ovr);
  if (k_ovr) g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k_ovr);
  g_op(g, op, "matmul operation");
}

// y = reduce(x) over the dims where y is smaller (the last dim, or the heads of a kv group).
static void g_reduce(attn_graph *g, cudnnReduceTensorOp_t red, desc_t x, desc_t y) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  desc_t r = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  g_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
  g_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
  g_finalize(g, r, "reduction");
  desc_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  g_op(g, op, "reduction operation");
}

// A transposed view (same elements, y's dims and strides): how the graph says "use X^T".
static void g_reshape(attn_graph *g, desc_t x, desc_t y) {
  desc_t op = g_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  g_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  g_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  g_op(g, op, "reshape operation");
}

// Causal mask on scores x (b, h, s_q, s_kv): keeps row >= col, writes -FLT_MAX elsewhere (not
// -inf: exp of it is 0 all the same, and max/sub stay finite).
static desc_t g_causal(attn_graph *g, desc_t x, const shape4 *sh, desc_t neg) {
  desc_t row = g_virt(g, CUDNN_DATA_INT32, sh), col = g_virt(g, CUDNN_DATA_INT32, sh);
  g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, row, 2);
  g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, col, 3);
  desc_t keep = g_virt(g, CUDNN_DATA_BOOLEAN, sh);
  g_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
  desc_t y = g_virt(g, CUDNN_DATA_FLOAT, sh);
  g_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg, keep, y, -1);
  return y;
}

// Padding mask (row < seq_q[b] and col < seq_kv[b] keep). With seq lengths equal to T it masks
// nothing; NVIDIA's own frontend adds it to the backward for cuDNN <= 9.15 when T % 128 != 0,
// as a workaround for the backend's handling of partial tiles, and so do we.
static desc_t g_padding(attn_graph *g, desc_t x, const shape4 *sh, desc_t seq_q, desc_t seq_kv, desc_t neg) {
  desc_t row = g_virt(g, CUDNN_DATA_INT32, sh), col = g_virt(g, CUDNN_DATA_INT32, sh);
  g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, row, 2);
  g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, x, NULL, NULL, col, 3);
  desc_t row_ok = g_virt(g, CUDNN_DATA_BOOLEAN, sh), col_ok = g_virt(g, CUDNN_DATA_BOOLEAN, sh);
  g_pw(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, seq_q, NULL, row_ok, -1);
  g_pw(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, seq_kv, NULL, col_ok, -1);
  desc_t keep = g_virt(g, CUDNN_DATA_BOOLEAN, sh);
  g_pw(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_ok, col_ok, NULL, keep, -1);
  desc_t y = g_virt(g, CUDNN_DATA_FLOAT, sh);
  g_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg, keep, y, -1);
  return y;
}

// The engine behind a finalised plan: its global index and whether cuDNN flags it as
// nondeterministic.
static void engine_info(attn_graph *g, desc_t cfg, int64_t *engine, int *nondet) {
  *engine = -1;
  *nondet = 0;
  desc_t eng = g_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!eng) return;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
      CUDNN_STATUS_SUCCESS)
    return;
  cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, engine);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  n = 0;
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < n; i++)
      if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) *nondet = 1;
}

// Operation graph -> heuristics -> the first engine configuration that finalises into a plan.
static void g_make_plan(attn_plan *p, cudnnHandle_t h) {
  attn_graph *g = &p->g;
  desc_t og = g_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
  g_finalize(g, og, "operation graph");
  const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (int m = 0; m < 2 && !g->failed && !p->plan; m++) {
    desc_t heur = g_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    g_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    g_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
    g_finalize(g, heur, "engine heuristics");
    if (g->failed) {
      // No heuristics for this graph in this mode (fallback may still have some): try the next.
      if (m == 0) g->failed = 0;
      continue;
    }
    int64_t n = 0;
    if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL) !=
            CUDNN_STATUS_SUCCESS ||
        n <= 0)
      continue;
    if (n > 16) n = 16;
    desc_t cfg[16];
    for (int64_t i = 0; i < n; i++) cfg[i] = g_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->failed) return;
    int64_t got = 0;
    if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    for (int64_t i = 0; i < got && !p->plan; i++) {
      desc_t plan = NULL;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
        continue;
      cudnnStatus_t st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      1, &cfg[i]);
      if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
      int64_t ws = 0, cnt = 0;
      if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
      if (st != CUDNN_STATUS_SUCCESS) {
        last = st;
        cudnnBackendDestroyDescriptor(plan);
        continue;
      }
      p->plan = plan;
      p->ws_cudnn = ws;
      engine_info(g, cfg[i], &p->engine, &p->nondet_note);
    }
  }
  if (!p->plan && !g->failed) g_fail(g, "no engine configuration finalised into an execution plan", last);
}

// ---------------------------------------------------------------------------------------------
// The two graphs. Dims are in cuDNN's order (b, h, s, d); our sequence-major rows (t, b) of L
// elements (heads of D at the row start) give strides (L, D, B_all*L, 1): L = ld for q, k, v and
// their gradients (column blocks of the fused QKV rows), nh_all*D for o and dO. K^T and V^T are
// the same memory with the last two dims swapped. The stats are (B_all, nh_all, T) packed.

static shape4 sh_sbhd(int64_t B, int64_t H, int64_t T, int64_t D, int64_t L, int64_t B_all) {
  shape4 s = {{B, H, T, D}, {L, D, B_all * L, 1}};
  return s;
}
static shape4 sh_sbhd_t(int64_t B, int64_t H, int64_t T, int64_t D, int64_t L, int64_t B_all) {
  shape4 s = {{B, H, D, T}, {L, D, 1, B_all * L}};
  return s;
}
static shape4 sh_stats(int64_t B, int64_t H, int64_t T, int64_t H_all) {
  shape4 s = {{B, H, T, 1}, {H_all * T, T, 1, 1}};
  return s;
}
static shape4 sh_packed(int64_t B, int64_t H, int64_t R, int64_t C) {
  shape4 s = {{B, H, R, C}, {H * R * C, R * C, C, 1}};
  return s;
}
static shape4 sh_scalar(void) {
  shape4 s = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  return s;
}

static void build_fwd(attn_plan *p, cudnnHandle_t h) {
  attn_graph *g = &p->g;
  const attn_shape *a = &p->sh;
  const int64_t B = a->B, T = a->T, H = a->nh, Hk = a->nkv, D = a->hd, L = a->ld, Ba = a->B_all;
  const shape4 q_sh = sh_sbhd(B, H, T, D, L, Ba), kt_sh = sh_sbhd_t(B, Hk, T, D, L, Ba);
  const shape4 kv_sh = sh_sbhd(B, Hk, T, D, L, Ba), o_sh = sh_sbhd(B, H, T, D, a->nh_all * D, Ba);
  const shape4 s_sh = sh_packed(B, H, T, T), r_sh = sh_packed(B, H, T, 1), one_sh = sh_scalar();
  const shape4 st_sh = sh_stats(B, H, T, a->nh_all);
  desc_t q = g_tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, &q_sh, false, false);
  desc_t kt = g_tensor(g, UID_K, CUDNN_DATA_BFLOAT16, &kt_sh, false, false);
  desc_t v = g_tensor(g, UID_V, CUDNN_DATA_BFLOAT16, &kv_sh, false, false);
  desc_t o = g_tensor(g, UID_O, CUDNN_DATA_BFLOAT16, &o_sh, false, false);
  desc_t stats = g_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, &st_sh, false, false);
  desc_t scale = g_tensor(g, UID_SCALE, CUDNN_DATA_FLOAT, &one_sh, false, true);
  desc_t neg = g_tensor(g, UID_NEG, CUDNN_DATA_FLOAT, &one_sh, false, true);

  desc_t s = g_virt(g, CUDNN_DATA_FLOAT, &s_sh);
  g_matmul(g, q, kt, s, NULL, NULL, NULL);
  desc_t ss = g_pwf(g, CUDNN_POINTWISE_MUL, s, scale, &s_sh);
  desc_t sm = g_causal(g, ss, &s_sh, neg);
  desc_t mx = g_virt(g, CUDNN_DATA_FLOAT, &r_sh);
  g_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sm, mx);
  desc_t e = g_pwf(g, CUDNN_POINTWISE_EXP, g_pwf(g, CUDNN_POINTWISE_SUB, sm, mx, &s_sh), NULL, &s_sh);
  desc_t z = g_virt(g, CUDNN_DATA_FLOAT, &r_sh);
  g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
  desc_t logz = g_pwf(g, CUDNN_POINTWISE_LOG, z, NULL, &r_sh);
  g_pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, logz, NULL, stats, -1);
  desc_t prob = g_virt(g, CUDNN_DATA_BFLOAT16, &s_sh);  // the second matmul takes P in the io type
  g_pw(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, NULL, prob, -1);
  g_matmul(g, prob, v, o, NULL, NULL, NULL);
  if (!g->failed) g_make_plan(p, h);
}

// out = X^T Y with X (b, h, s_q, s_kv) viewed as st_sh (b, h, s_kv, s_q): the dV and dK products.
// grouped (fewer kv heads than query heads): the products of one kv head's query heads, made
// in full_sh, are summed into out.
static void g_grad_kv(attn_graph *g, desc_t x, desc_t y, desc_t out, int grouped, const shape4 *st_sh,
                      const shape4 *full_sh, desc_t seq_q, desc_t seq_kv) {
  desc_t x_t = g_virt(g, CUDNN_DATA_BFLOAT16, st_sh);
  g_reshape(g, x, x_t);
  if (!grouped) {
    g_matmul(g, x_t, y, out, seq_kv, NULL, seq_q);
    return;
  }
  desc_t full = g_virt(g, CUDNN_DATA_BFLOAT16, full_sh);
  g_matmul(g, x_t, y, full, seq_kv, NULL, seq_q);
  g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

// det: dQ from one matmul straight into dq; else through an fp32 accumulator (UID_DQ_ACC).
static void build_bwd(attn_plan *p, cudnnHandle_t h, int det) {
  attn_graph *g = &p->g;
  const attn_shape *a = &p->sh;
  const int64_t B = a->B, T = a->T, H = a->nh, Hk = a->nkv, D = a->hd, L = a->ld, Ba = a->B_all;
  const shape4 q_sh = sh_sbhd(B, H, T, D, L, Ba), kt_sh = sh_sbhd_t(B, Hk, T, D, L, Ba);
  const shape4 kv_sh = sh_sbhd(B, Hk, T, D, L, Ba), o_sh = sh_sbhd(B, H, T, D, a->nh_all * D, Ba);
  const shape4 s_sh = sh_packed(B, H, T, T), r_sh = sh_packed(B, H, T, 1), one_sh = sh_scalar();
  const shape4 stats_sh = sh_stats(B, H, T, a->nh_all);
  const shape4 full_sh = sh_packed(B, H, T, D);
  const shape4 st_sh = {{B, H, T, T}, {H * T * T, T * T, 1, T}};  // (b, h, s_kv, s_q) view of (.., s_q, s_kv)
  const shape4 seq_sh = {{B, 1, 1, 1}, {1, 1, 1, 1}};
  desc_t q = g_tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, &q_sh, false, false);
  desc_t kt = g_tensor(g, UID_K, CUDNN_DATA_BFLOAT16, &kt_sh, false, false);
  desc_t vt = g_tensor(g, UID_V, CUDNN_DATA_BFLOAT16, &kt_sh, false, false);
  desc_t o = g_tensor(g, UID_O, CUDNN_DATA_BFLOAT16, &o_sh, false, false);
  desc_t d_o = g_tensor(g, UID_DO, CUDNN_DATA_BFLOAT16, &o_sh, false, false);
  desc_t stats = g_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, &stats_sh, false, false);
  desc_t dq = g_tensor(g, UID_DQ, CUDNN_DATA_BFLOAT16, &q_sh, false, false);
  desc_t dk = g_tensor(g, UID_DK, CUDNN_DATA_BFLOAT16, &kv_sh, false, false);
  desc_t dv = g_tensor(g, UID_DV, CUDNN_DATA_BFLOAT16, &kv_sh, false, false);
  desc_t scale = g_tensor(g, UID_SCALE, CUDNN_DATA_FLOAT, &one_sh, false, true);
  desc_t neg = g_tensor(g, UID_NEG, CUDNN_DATA_FLOAT, &one_sh, false, true);
  desc_t one = g_tensor(g, UID_ONE, CUDNN_DATA_FLOAT, &one_sh, false, true);
  desc_t delta = g_tensor(g, UID_DELTA, CUDNN_DATA_FLOAT, &r_sh, false, false);
  desc_t seq_q = NULL, seq_kv = NULL;
  if (p->padded) {
    seq_q = g_tensor(g, UID_SEQ_Q, CUDNN_DATA_INT32, &seq_sh, false, false);
    seq_kv = g_tensor(g, UID_SEQ_KV, CUDNN_DATA_INT32, &seq_sh, false, false);
  }

  // delta = rowsum(dO * O); the multiply by one is where a dropout scale would go, and the
  // engine's pattern expects it.
  desc_t doo = g_pwf(g, CUDNN_POINTWISE_MUL, d_o, o, &o_sh);
  desc_t dsum = g_virt(g, CUDNN_DATA_FLOAT, &r_sh);
  g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, doo, dsum);
  g_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dsum, one, NULL, delta, -1);

  // P = exp(S * scale - stats), masked.
  desc_t s = g_virt(g, CUDNN_DATA_FLOAT, &s_sh);
  g_matmul(g, q, kt, s, seq_q, seq_kv, NULL);
  desc_t ss = g_pwf(g, CUDNN_POINTWISE_MUL, s, scale, &s_sh);
  desc_t sl = g_pwf(g, CUDNN_POINTWISE_SUB, ss, stats, &s_sh);
  if (p->padded) sl = g_padding(g, sl, &s_sh, seq_q, seq_kv, neg);
  desc_t sm = g_causal(g, sl, &s_sh, neg);
  desc_t prob = g_pwf(g, CUDNN_POINTWISE_EXP, sm, NULL, &s_sh);

  // dV = P^T dO, summed over the query heads of each kv head.
  g_grad_kv(g, prob, d_o, dv, H != Hk, &st_sh, &full_sh, seq_q, seq_kv);

  // dS = P * (dO V^T - delta) * scale.
  desc_t dp = g_virt(g, CUDNN_DATA_FLOAT, &s_sh);
  g_matmul(g, d_o, vt, dp, seq_q, seq_kv, NULL);
  desc_t ds0 = g_pwf(g, CUDNN_POINTWISE_SUB, dp, delta, &s_sh);
  desc_t ds1 = g_pwf(g, CUDNN_POINTWISE_MUL, ds0, prob, &s_sh);
  desc_t ds = g_pwf(g, CUDNN_POINTWISE_MUL, ds1, scale, &s_sh);

  // dK = dS^T Q, summed over each group like dV.
  g_grad_kv(g, ds, q, dk, H != Hk, &st_sh, &full_sh, seq_q, seq_kv);

  // dQ = dS K, K being K^T viewed back.
  desc_t k = g_virt(g, CUDNN_DATA_BFLOAT16, &kv_sh);
  g_reshape(g, kt, k);
  if (det) {
    g_matmul(g, ds, k, dq, seq_q, NULL, seq_kv);
  } else {
    desc_t acc = g_tensor(g, UID_DQ_ACC, CUDNN_DATA_FLOAT, &full_sh, false, false);
    g_matmul(g, ds, k, acc, seq_q, NULL, seq_kv);
    g_pw(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq, -1);
  }
  if (!g->failed) g_make_plan(p, h);
}

// ---------------------------------------------------------------------------------------------
// Handles, workspace, plan cache

int k_cudnn_attn_version(void) {
  const size_t v = cudnnGetVersion();
  return v >= 90000 ? (int)v : 0;  // the graph pattern below is cuDNN 9's
}

static cudnnHandle_t get_handle(k_cudnn_attn *a, int dev) {
  if (dev < 0 || dev >= ATTN_MAX_DEV) return NULL;
  if (a->handle_state[dev] == 0) {
    const cudnnStatus_t st = cudnnCreate(&a->handle[dev]);
    a->handle_state[dev] = st == CUDNN_STATUS_SUCCESS ? 1 : -1;
    if (st != CUDNN_STATUS_SUCCESS) {
      char msg[256] = "";
      cudnnGetLastErrorString(msg, sizeof msg);
      fprintf(stderr, "attn_cudnn: cudnnCreate failed on device %d: %s %s; using the fallback kernels\n", dev,
              cudnnGetErrorString(st), msg);
    }
  }
  return a->handle_state[dev] == 1 ? a->handle[dev] : NULL;
}

static void plan_free(attn_plan *p) {
  if (!p->used) return;
  if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
  g_free(&p->g);
  if (p->seq_len) CUDA_CHECK(cudaFree(p->seq_len));
  memset(p, 0, sizeof *p);
}

extern "C" k_cudnn_attn *k_cudnn_attn_create(void) {
  k_cudnn_attn *a = (k_cudnn_attn *)calloc(1, sizeof *a);
  CHECK(a != NULL, "out of host memory for the cuDNN attention state");
  a->version = k_cudnn_attn_version();
  if (!a->version)
    fprintf(stderr, "attn_cudnn: cuDNN %zu found, 9.x needed; using the fallback kernels\n", cudnnGetVersion());
  a->det = 1;
  a->bwd_cap = (size_t)ATTN_BWD_CAP_MIB << 20;
  return a;
}

extern "C" void k_cudnn_attn_free(k_cudnn_attn **ap) {
  if (!ap || !*ap) return;
  k_cudnn_attn *a = *ap;
  for (int i = 0; i < ATTN_CACHE; i++) plan_free(&a->cache[i]);
  if (a->ws) CUDA_CHECK(cudaFree(a->ws));
  for (int d = 0; d < ATTN_MAX_DEV; d++)
    if (a->handle_state[d] == 1) cudnnDestroy(a->handle[d]);
  free(a);
  *ap = NULL;
}

extern "C" void k_cudnn_attn_set_deterministic(k_cudnn_attn *a, int on) { a->det = on ? 1 : 0; }
extern "C" void k_cudnn_attn_set_bwd_cap(k_cudnn_attn *a, size_t n_bytes) {
  a->bwd_cap = n_bytes ? n_bytes : (size_t)ATTN_BWD_CAP_MIB << 20;
}

// The piece of a backward problem (whole) one call computes, given the workspace the whole one's
// plan asks for: the whole one where that fits a->bwd_cap, else the most heads (a divisor of nh,
// whole kv groups) of all B sequences whose share of it fits, else of one sequence at a time (at
// least one kv group's heads even where that does not fit). Each (sequence, head) is computed
// alone, so the pieces change no value.
static attn_shape bwd_piece(const k_cudnn_attn *a, const attn_shape *whole, int64_t ws_whole) {
  attn_shape sh = *whole;
  if ((double)ws_whole <= (double)a->bwd_cap) return sh;
  const int B = sh.B, nh = sh.nh, group = sh.nh / sh.nkv;
  const double per_head = (double)ws_whole / ((double)B * nh);
  const int seqs[2] = {B, 1};  // all sequences a call, else one
  for (int i = 0; i < 2; i++)
    for (int hc = nh; hc >= group; hc -= group)
      if (nh % hc == 0 && (double)seqs[i] * hc * per_head <= (double)a->bwd_cap) {
        sh.B = seqs[i], sh.nh = hc, sh.nkv = hc / group;
        return sh;
      }
  sh.B = 1, sh.nh = group, sh.nkv = 1;
  return sh;
}

static int shape_eq(const attn_shape *x, const attn_shape *y) {
  return x->B == y->B && x->T == y->T && x->nh == y->nh && x->nkv == y->nkv && x->hd == y->hd && x->ld == y->ld &&
         x->B_all == y->B_all && x->nh_all == y->nh_all;
}

// The index in a->cache of the plan of a shape, or -1.
static int cache_find(const k_cudnn_attn *a, int dir, int det, int dev, const attn_shape *sh) {
  for (int i = 0; i < ATTN_CACHE; i++) {
    const attn_plan *p = &a->cache[i];
    if (p->used && p->dir == dir && p->det_req == det && p->device == dev && shape_eq(&p->sh, sh)) return i;
  }
  return -1;
}

static size_t align_up(size_t n) { return (n + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN; }

// Builds the plan of a shape (the deterministic backward first when det, the atomic one if that
// cannot be planned). Refusals are cached too, with one line on stderr saying why.
static attn_plan *plan_get(k_cudnn_attn *a, int dir, int dev, cudnnHandle_t h, const attn_shape *sh) {
  const int det = dir == 1 ? a->det : 0;
  const int found = cache_find(a, dir, det, dev, sh);
  const int B = sh->B, T = sh->T, nh = sh->nh, nkv = sh->nkv, hd = sh->hd;
  attn_plan *p = found >= 0 ? &a->cache[found] : NULL;
  if (!p) {
    attn_plan *slot = NULL;
    for (int i = 0; i < ATTN_CACHE && !slot; i++)
      if (!a->cache[i].used) slot = &a->cache[i];
    if (!slot) {  // evict the least recently used plan
      slot = &a->cache[0];
      for (int i = 1; i < ATTN_CACHE; i++)
        if (a->cache[i].last_use < slot->last_use) slot = &a->cache[i];
      plan_free(slot);
    }
    p = slot;
    p->used = 1, p->dir = dir, p->det_req = det, p->device = dev;
    p->sh = *sh;
    p->scale = 1.0f / sqrtf((float)hd), p->neg = -FLT_MAX, p->one = 1.0f;
    // cuDNN up to 9.15 needs the padding-mask workaround in backward when T % 128 != 0.
    p->padded = dir == 1 && T % 128 != 0 && a->version < 91600;
    char why_det[512] = "";
    for (int attempt = det ? 0 : 1; attempt < 2; attempt++) {
      g_free(&p->g);
      p->g.next_uid = UID_VIRTUAL;
      if (dir == 0) {
        build_fwd(p, h);
        attempt = 2;
      } else {
        p->det_graph = attempt == 0;
        build_bwd(p, h, p->det_graph);
      }
      if (p->plan) break;
      if (attempt == 0) snprintf(why_det, sizeof why_det, "%s", p->g.why);
    }
    if (!p->plan) {
      p->status = -1;
      fprintf(stderr, "attn_cudnn: cuDNN cannot plan causal attention %s B=%d T=%d nh=%d nkv=%d hd=%d (%s); using "
              "the fallback kernel\n", dir ? "backward" : "forward", B, T, nh, nkv, hd, p->g.why);
      g_free(&p->g);  // nothing to keep for a refused shape
    } else {
      if (dir == 1 && det && !p->det_graph)
        fprintf(stderr, "attn_cudnn: no deterministic cuDNN backward for B=%d T=%d nh=%d nkv=%d hd=%d (%s); using "
                "the atomic one\n", B, T, nh, nkv, hd, why_det);
      size_t off = align_up((size_t)p->ws_cudnn);
      if (dir == 1) {
        p->off_delta = (int64_t)off;
        off = align_up(off + sizeof(float) * (size_t)B * nh * T);
        if (!p->det_graph) {
          p->off_dqacc = (int64_t)off;
          off = align_up(off + sizeof(float) * (size_t)B * nh * T * hd);
        }
      }
      p->ws_total = (int64_t)off;
      if (p->padded) {
        int32_t *lens = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)B);
        CHECK(lens != NULL, "out of host memory");
        for (int i = 0; i < 2 * B; i++) lens[i] = T;
        CUDA_CHECK(cudaMalloc((void **)&p->seq_len, sizeof(int32_t) * 2 * (size_t)B));
        CUDA_CHECK(cudaMemcpy(p->seq_len, lens, sizeof(int32_t) * 2 * (size_t)B, cudaMemcpyHostToDevice));
        free(lens);
      }
    }
  }
  p->last_use = ++a->clock;
  return p->status == 0 ? p : NULL;
}

// Grows the shared workspace; cudaFree waits for the device, so work in flight on the old one
// finishes first.
static void *workspace(k_cudnn_attn *a, size_t n_bytes) {
  if (n_bytes > a->ws_bytes) {
    if (a->ws) CUDA_CHECK(cudaFree(a->ws));
    a->ws = NULL;
    const size_t want = n_bytes + n_bytes / 8;  // some headroom so a slightly larger shape does not realloc
    CUDA_CHECK(cudaMalloc(&a->ws, want));
    a->ws_bytes = want;
  }
  return a->ws;
}

static void execute(attn_plan *p, cudnnHandle_t h, int n, const int64_t *uids, void **ptrs, void *ws) {
  desc_t vp = NULL;
  CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
  CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
  CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
  CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
  CUDNN_CHECK(cudnnBackendFinalize(vp));
  CUDNN_CHECK(cudnnBackendExecute(h, p->plan, vp));
  CUDNN_CHECK(cudnnBackendDestroyDescriptor(vp));
}

// Shapes and pointers cuDNN's fused engines cannot take at all, refused before any planning.
static int shape_ok(int B, int T, int nh, int nkv, int hd, int64_t ld, const void *const *ptrs, int n_ptrs) {
  if (B <= 0 || T <= 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0) return 0;
  if (ld < (int64_t)nh * hd || ld < (int64_t)nkv * hd || ld % 8 != 0) return 0;  // 16-byte row starts
  if (hd % 8 != 0 || hd > 256) return 0;  // 16-byte rows; the engines stop at head dim 256
  for (int i = 0; i < n_ptrs; i++)
    if (!ptrs[i] || (uintptr_t)ptrs[i] % 16 != 0) return 0;
  return 1;
}

// The handle of the current device bound to the stream, or NULL if cuDNN is unusable here.
static cudnnHandle_t handle_for(k_cudnn_attn *a, void *cuda_stream, int *dev) {
  if (!a->version) return NULL;
  CUDA_CHECK(cudaGetDevice(dev));
  cudnnHandle_t h = get_handle(a, *dev);
  if (h) CUDNN_CHECK(cudnnSetStream(h, (cudaStream_t)cuda_stream));
  return h;
}

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" int k_cudnn_attn_fwd(k_cudnn_attn *a, const void *q, const void *k, const void *v, int64_t ld, void *o,
                                float *lse, int B, int T, int nh, int nkv, int hd, void *cuda_stream) {
  const void *ptrs[5] = {q, k, v, o, lse};
  if (!shape_ok(B, T, nh, nkv, hd, ld, ptrs, 5)) return -1;
  int dev = 0;
  cudnnHandle_t h = handle_for(a, cuda_stream, &dev);
  if (!h) return -1;
  const attn_shape sh = {B, T, nh, nkv, hd, ld, B, nh};
  attn_plan *p = plan_get(a, 0, dev, h, &sh);
  if (!p) return -1;
  void *ws = workspace(a, (size_t)p->ws_total);
  int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG};
  void *vals[7] = {(void *)q, (void *)k, (void *)v, o, lse, &p->scale, &p->neg};
  execute(p, h, 7, uids, vals, ws);
  return 0;
}

// The caller's tensors of a backward problem (attn_shape's layouts).
typedef struct {
  const void *dout, *q, *k, *v, *o;
  const float *lse;
  void *dq, *dk, *dv;
} attn_bwd_io;

// Plan p's backward over its piece of the problem io describes, from sequence b0 and head h0.
static void bwd_run(attn_plan *p, cudnnHandle_t h, k_cudnn_attn *a, const attn_bwd_io *io, int b0, int h0,
                    cudaStream_t stream) {
  const attn_shape *sh = &p->sh;
  const int64_t hd = sh->hd, row = (int64_t)b0 * sh->ld, kh = h0 / (sh->nh / sh->nkv);
  const int64_t at_q = row + h0 * hd, at_kv = row + kh * hd, at_o = ((int64_t)b0 * sh->nh_all + h0) * hd;
  const size_t eb = 2;  // bf16
  char *ws = (char *)workspace(a, (size_t)p->ws_total);
  int64_t uids[17] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV,
                      UID_SCALE, UID_NEG, UID_ONE, UID_DELTA};
  void *vals[17] = {(char *)io->q + at_q * eb, (char *)io->k + at_kv * eb, (char *)io->v + at_kv * eb,
                    (char *)io->o + at_o * eb, (char *)io->dout + at_o * eb,
                    (void *)(io->lse + ((int64_t)b0 * sh->nh_all + h0) * sh->T), (char *)io->dq + at_q * eb,
                    (char *)io->dk + at_kv * eb, (char *)io->dv + at_kv * eb, &p->scale, &p->neg, &p->one,
                    ws + p->off_delta};
  int n = 13;
  if (!p->det_graph) {
    // NVIDIA's frontend stops clearing the accumulator from cuDNN 9.6 on (the engine does it);
    // we clear it anyway: a stale one would silently corrupt dq, and the memset costs microseconds.
    const size_t acc_bytes = sizeof(float) * (size_t)sh->B * sh->nh * sh->T * hd;
    CUDA_CHECK(cudaMemsetAsync(ws + p->off_dqacc, 0, acc_bytes, stream));
    uids[n] = UID_DQ_ACC, vals[n++] = ws + p->off_dqacc;
  }
  if (p->padded) {
    uids[n] = UID_SEQ_Q, vals[n++] = p->seq_len;
    uids[n] = UID_SEQ_KV, vals[n++] = p->seq_len + sh->B;
  }
  execute(p, h, n, uids, vals, ws);
}

// The shape a backward runs its calls in, given the plan of the whole one: the whole shape for
// the atomic graph, else bwd_piece's.
static attn_shape bwd_call_shape(const k_cudnn_attn *a, const attn_plan *whole) {
  return whole->det_graph ? bwd_piece(a, &whole->sh, whole->ws_total) : whole->sh;
}

// The plan of the piece a backward of the whole shape runs in, or NULL if cuDNN refuses the shape.
static attn_plan *bwd_plan(k_cudnn_attn *a, int dev, cudnnHandle_t h, const attn_shape *whole) {
  attn_plan *p = plan_get(a, 1, dev, h, whole);
  if (!p) return NULL;
  const attn_shape piece = bwd_call_shape(a, p);
  return shape_eq(&piece, whole) ? p : plan_get(a, 1, dev, h, &piece);
}

extern "C" int k_cudnn_attn_bwd(k_cudnn_attn *a, const void *dout, const void *q, const void *k, const void *v,
                                int64_t ld, const void *o, const float *lse, void *dq, void *dk, void *dv, int B, int T,
                                int nh, int nkv, int hd, void *cuda_stream) {
  const void *ptrs[9] = {dout, q, k, v, o, lse, dq, dk, dv};
  if (!shape_ok(B, T, nh, nkv, hd, ld, ptrs, 9)) return -1;
  int dev = 0;
  cudnnHandle_t h = handle_for(a, cuda_stream, &dev);
  if (!h) return -1;
  const attn_shape whole = {B, T, nh, nkv, hd, ld, B, nh};
  attn_plan *p = bwd_plan(a, dev, h, &whole);
  if (!p) return -1;
  const attn_bwd_io io = {dout, q, k, v, o, lse, dq, dk, dv};
  for (int b0 = 0; b0 < B; b0 += p->sh.B)
    for (int h0 = 0; h0 < nh; h0 += p->sh.nh) bwd_run(p, h, a, &io, b0, h0, (cudaStream_t)cuda_stream);
  return 0;
}

extern "C" int k_cudnn_attn_info_get(const k_cudnn_attn *a, int dir, int B, int T, int nh, int nkv, int hd,
                                     int64_t ld, k_cudnn_attn_info *info) {
  if (!a) return -1;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const attn_shape whole = {B, T, nh, nkv, hd, ld, B, nh};
  const int det = dir == 1 ? a->det : 0;
  int found = cache_find(a, dir, det, dev, &whole);
  if (found < 0 || a->cache[found].status != 0) return -1;
  if (dir == 1) {  // the plan of the calls the backward runs in (bwd_plan)
    const attn_shape piece = bwd_call_shape(a, &a->cache[found]);
    found = cache_find(a, dir, det, dev, &piece);
    if (found < 0 || a->cache[found].status != 0) return -1;
  }
  const attn_plan *p = &a->cache[found];
  info->engine = p->engine;
  info->workspace = p->ws_total;
  info->deterministic = dir == 1 && p->det_graph && !p->nondet_note;
  info->padded = p->padded;
  info->pieces = (B / p->sh.B) * (nh / p->sh.nh);
  return 0;
}
