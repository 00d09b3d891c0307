// Pipeline executor (see pp_exec.h). Consecutive send/recv steps of a schedule are posted as
// one group and completed together, which is the contract pp_schedule_build is built for.
#include "parallel/step/pp_exec.h"
#include "model/fp8.h"
#include "kernels/base/check.h"
#include "kernels/base/trace.h"
#include <string.h>

// What an activation set carries with parallel.pp_overlap: transfer tickets (comm xfer_*, -1 =
// none) of the receive pending into it, of the sends still reading it, of the compute mark taken
// when it was last released (its previous user's backward) and of the one taken once a received
// bf16 buffer was widened; with pp_comm_bf16 its own staging buffers, made on first use, which
// travel with it between slot and pool.
typedef struct pp_tickets {
  int recv, send_out, send_gin, free, widened;
  uint16_t *in16, *out16;  // (rows_s, d) bf16: the received and the sent transfer
} pp_tickets;

static const pp_tickets no_tickets = {-1, -1, -1, -1, -1, NULL, NULL};

static void clear_tickets(pp_tickets *t) { t->recv = t->send_out = t->send_gin = t->free = t->widened = -1; }

int pp_exec_init(pp_exec *e, model *m, grid *g, int n_micro, char *err, size_t n_err) {
  memset(e, 0, sizeof *e);
  e->m = m;
  e->g = g;
  e->n_micro = n_micro;
  if (pp_schedule_build(&e->sched, m->pp, m->vpp, n_micro, m->pp_rank, err, n_err) != 0) return -1;
  e->slot = XCALLOC((size_t)n_micro * m->vpp, sizeof(model_acts *));
  e->pool_cap = n_micro;
  e->pool = XCALLOC((size_t)m->vpp * e->pool_cap, sizeof(model_acts *));
  e->pool_n = XCALLOC(m->vpp, sizeof(int));
  e->n_stage = pp_schedule_max_group(&e->sched);  // at least 1: the forward-only pass sends one at a time
  e->slot_t = XCALLOC((size_t)n_micro * m->vpp, sizeof(pp_tickets));
  e->pool_t = XCALLOC((size_t)m->vpp * e->pool_cap, sizeof(pp_tickets));
  for (int i = 0; i < n_micro * m->vpp; i++) e->slot_t[i] = e->pool_t[i] = no_tickets;
  return 0;
}

void pp_exec_overlap(pp_exec *e) {
  comm *pc = e->g->pp_c;
  pc->ops->xfer_open(pc);
  e->overlap = 1;
}

void pp_exec_free(pp_exec *e) {
  if (!e->m) return;
  for (int i = 0; i < e->n_micro * e->m->vpp; i++) model_acts_free(e->m, &e->slot[i]);
  for (int c = 0; c < e->m->vpp; c++)
    for (int i = 0; i < e->pool_n[c]; i++) model_acts_free(e->m, &e->pool[c * e->pool_cap + i]);
  free(e->slot);
  free(e->pool);
  free(e->pool_n);
  for (int i = 0; i < e->n_micro * e->m->vpp; i++) {
    pp_tickets *t[2] = {&e->slot_t[i], &e->pool_t[i]};
    for (int k = 0; k < 2; k++) {
      if (t[k]->in16) e->m->be->free(e->m->be, t[k]->in16);
      if (t[k]->out16) e->m->be->free(e->m->be, t[k]->out16);
    }
  }
  free(e->slot_t);
  free(e->pool_t);
  if (e->stage) {
    for (int i = 0; i < e->n_stage; i++) e->m->be->free(e->m->be, e->stage[i]);
    free(e->stage);
  }
  pp_schedule_free(&e->sched);
  e->m = NULL;
}

// A set taken from the pool may still be read by its previous user's sends (overlap): compute
// waits for them before writing it; its tickets stay with it for the receives posted into it.
static model_acts *acts_get(pp_exec *e, int micro, int chunk) {
  int i = micro * e->m->vpp + chunk;
  model_acts **s = &e->slot[i];
  if (!*s) {
    if (e->pool_n[chunk] > 0) {
      int k = chunk * e->pool_cap + --e->pool_n[chunk];
      *s = e->pool[k];
      e->slot_t[i] = e->pool_t[k];
      e->pool_t[k] = no_tickets;  // the staging buffers now belong to the slot
      comm *pc = e->g->pp_c;
      if (e->overlap) {
        pc->ops->xfer_wait(pc, e->slot_t[i].send_out);
        pc->ops->xfer_wait(pc, e->slot_t[i].send_gin);
      }
    } else {
      *s = model_acts_create(e->m, chunk);
      e->slot_t[i] = no_tickets;
      e->n_created++;
    }
  }
  return *s;
}

static void acts_put(pp_exec *e, int micro, int chunk) {
  int i = micro * e->m->vpp + chunk;
  model_acts **s = &e->slot[i];
  CHECK(*s, "pipeline executor: release of (micro %d, chunk %d) which holds no activations", micro, chunk);
  int k = chunk * e->pool_cap + e->pool_n[chunk]++;
  e->pool[k] = *s;
  e->pool_t[k] = e->slot_t[i];
  e->slot_t[i] = no_tickets;
  comm *pc = e->g->pp_c;
  if (e->overlap) e->pool_t[k].free = pc->ops->xfer_mark(pc);
  *s = NULL;
}

static int is_comm(pp_op op) { return op != PP_FWD && op != PP_BWD; }

// The fp32 buffer a transfer step reads (sends) or fills (receives).
static float *comm_buf(pp_exec *e, const pp_step *s) {
  model_acts *a = acts_get(e, s->micro, s->chunk);
  switch (s->op) {
    case PP_SEND_ACT: return model_acts_output(e->m, a);
    case PP_RECV_ACT: return model_acts_input(a);
    case PP_SEND_GRAD: return model_acts_input_grad(a);
    case PP_RECV_GRAD: return model_acts_output_grad(a);
    default: return NULL;
  }
}

static uint16_t *stage_buf(pp_exec *e, int k) {
  k_backend *be = e->m->be;
  if (!e->stage) {
    e->stage = XCALLOC(e->n_stage, sizeof(uint16_t *));
    for (int i = 0; i < e->n_stage; i++)
      e->stage[i] = be->alloc(be, (size_t)(e->m->dims.rows_s * e->m->dims.d) * k_dtype_bytes(K_BF16));
  }
  return e->stage[k];
}

// With comm_bf16 a send first rounds its buffer into staging buffer k (stage_send, on the
// compute stream, before its group opens: a group holds transfers only), a receive lands in
// staging buffer k and is widened once its group has ended (stage_recv).
static void stage_send(pp_exec *e, const float *buf, int k) {
  if (e->comm_bf16) e->m->be->cast(e->m->be, stage_buf(e, k), K_BF16, buf, K_F32, e->m->dims.rows_s * e->m->dims.d);
}

static void post(pp_exec *e, pp_op op, float *buf, int peer, int k) {
  comm *pc = e->g->pp_c;
  int64_t n = e->m->dims.rows_s * e->m->dims.d;
  void *p = e->comm_bf16 ? (void *)stage_buf(e, k) : (void *)buf;
  comm_dtype t = e->comm_bf16 ? COMM_BF16 : COMM_F32;
  if (op == PP_SEND_ACT || op == PP_SEND_GRAD) pc->ops->send(pc, p, n, t, peer);
  else pc->ops->recv(pc, p, n, t, peer);
}

static void stage_recv(pp_exec *e, float *buf, int k) {
  if (e->comm_bf16) e->m->be->cast(e->m->be, buf, K_F32, stage_buf(e, k), K_BF16, e->m->dims.rows_s * e->m->dims.d);
}

// Overlap: compute waits for send ticket t (a send still reading a buffer it writes); the host
// first waits for the compute queued so far, so the time measured is the wait alone.
static void wait_transfer(pp_exec *e, int *t) {
  if (*t < 0) return;
  comm *pc = e->g->pp_c;
  step_timing *tm = e->timing;
  double t0 = tm ? timing_now(e->m->be) : 0;
  pc->ops->xfer_wait(pc, *t);
  if (tm) tm->pp_comm += timing_now(e->m->be) - t0;
  *t = -1;
}

static uint16_t *staging(pp_exec *e, uint16_t **b) {
  if (!*b) *b = e->m->be->alloc(e->m->be, (size_t)(e->m->dims.rows_s * e->m->dims.d) * k_dtype_bytes(K_BF16));
  return *b;
}

// Overlap: posts a group's transfers on the xfer channels, in the listed order. Sends start
// once the compute queued so far (which wrote them, and with comm_bf16 rounded them into the
// set's out16) is done; a receive once its buffer's previous users are done with it, and, when
// this group made its buffer (a new set or staging buffer, zero-filled on the compute stream),
// once that fill is done: else the fill could land after the data.
static void post_group(pp_exec *e, const pp_step *st, int i, int j) {
  comm *pc = e->g->pp_c;
  int64_t n = e->m->dims.rows_s * e->m->dims.d;
  comm_dtype ct = e->comm_bf16 ? COMM_BF16 : COMM_F32;
  int sets_before = e->n_created, fresh = 0;
  for (int k = i; k < j; k++) {
    pp_tickets *t = &e->slot_t[st[k].micro * e->m->vpp + st[k].chunk];
    float *buf = comm_buf(e, &st[k]);
    if (!e->comm_bf16) continue;
    if (st[k].op == PP_SEND_ACT || st[k].op == PP_SEND_GRAD) {
      e->m->be->cast(e->m->be, staging(e, &t->out16), K_BF16, buf, K_F32, n);
    } else {
      fresh |= !t->in16;
      staging(e, &t->in16);
    }
  }
  fresh |= e->n_created != sets_before;
  int written = pc->ops->xfer_mark(pc), filled = fresh ? written : -1;
  for (int k = i; k < j; k++) {
    const pp_step *s = &st[k];
    float *buf = comm_buf(e, s);
    pp_tickets *t = &e->slot_t[s->micro * e->m->vpp + s->chunk];
    if (s->op == PP_SEND_ACT || s->op == PP_SEND_GRAD) {
      int u = pc->ops->xfer_start(pc, e->comm_bf16 ? (void *)t->out16 : buf, n, ct, s->peer, 1, &written, 1);
      *(s->op == PP_SEND_ACT ? &t->send_out : &t->send_gin) = u;
    } else {
      CHECK(t->recv < 0, "pipeline executor: second receive into (micro %d, chunk %d) before the first was read",
            s->micro, s->chunk);
      int after[5] = {t->free, t->send_out, t->send_gin, t->widened, filled};
      t->recv = pc->ops->xfer_start(pc, e->comm_bf16 ? (void *)t->in16 : buf, n, ct, s->peer, 0, after, 5);
    }
  }
}

// Overlap: compute waits for the receive that buf (the input of a forward, the output gradient
// of a backward) holds, widened from in16 with comm_bf16; the cast counts as pipeline time.
static void wait_receive(pp_exec *e, pp_tickets *t, float *buf) {
  if (t->recv < 0) return;
  comm *pc = e->g->pp_c;
  step_timing *tm = e->timing;
  double t0 = tm ? timing_now(e->m->be) : 0;
  pc->ops->xfer_wait(pc, t->recv);
  t->recv = -1;
  if (e->comm_bf16) {
    e->m->be->cast(e->m->be, buf, K_F32, t->in16, K_BF16, e->m->dims.rows_s * e->m->dims.d);
    t->widened = pc->ops->xfer_mark(pc);
  }
  if (tm) tm->pp_comm += timing_now(e->m->be) - t0;
}

// Overlap, end of a step (or of a forward pass, whose marks order nothing past the next step's
// first sync): every send has been waited for, the links have drained (xfer_reset, bounded on
// GPUs) and the host waits for the GPU, so the next step's transfers need no ticket of this one
// (whose numbers start again).
static void finish_transfers(pp_exec *e) {
  comm *pc = e->g->pp_c;
  for (int c = 0; c < e->m->vpp; c++)
    for (int k = c * e->pool_cap; k < c * e->pool_cap + e->pool_n[c]; k++) {
      wait_transfer(e, &e->pool_t[k].send_out);
      wait_transfer(e, &e->pool_t[k].send_gin);
      clear_tickets(&e->pool_t[k]);
    }
  pc->ops->xfer_reset(pc);
  e->m->be->sync(e->m->be);
}

double pp_exec_train_step(pp_exec *e, const int32_t *tokens, const int32_t *targets, float loss_scale) {
  model *m = e->m;
  model_fp8_begin_step(m, 1);
  comm *pc = e->g->pp_c;
  int64_t rows = m->dims.rows;
  double loss = 0;
  const pp_step *st = e->sched.steps;
  for (int i = 0; i < e->sched.n_steps;) {
    step_timing *tm = e->timing;
    if (!is_comm(st[i].op)) {
      const pp_step *s = &st[i++];
      model_acts *a = acts_get(e, s->micro, s->chunk);
      pp_tickets *t = &e->slot_t[s->micro * m->vpp + s->chunk];
      wait_receive(e, t, s->op == PP_FWD ? model_acts_input(a) : model_acts_output_grad(a));
      if (s->op == PP_BWD) wait_transfer(e, &t->send_out);
      const int32_t *tok = tokens + s->micro * rows, *tgt = targets + s->micro * rows;
      if (s->op == PP_FWD) {
        trace_push_range("forward");
        loss += model_chunk_fwd(m, s->chunk, a, tok, tgt);
        trace_pop_range();
      } else {
        trace_push_range("backward");
        model_chunk_bwd(m, s->chunk, a, tok, tgt, loss_scale);
        trace_pop_range();
        if (m->chunks[s->chunk].vstage == 0) acts_put(e, s->micro, s->chunk);
      }
      continue;
    }
    // A group waits for the compute before it (its sends read it) and for the peer: the time
    // from the queue being drained to the group's end is the pipeline's communication and bubble.
    // Transfer k of the group goes through staging buffer k - i (comm_bf16); the casts count as
    // pipeline communication.
    int j = i;
    while (j < e->sched.n_steps && is_comm(st[j].op)) j++;
    if (e->overlap) {
      post_group(e, st, i, j);
      for (; i < j; i++)
        if (st[i].op == PP_SEND_GRAD) acts_put(e, st[i].micro, st[i].chunk);
      continue;
    }
    double t0 = tm ? timing_now(m->be) : 0;
    for (int k = i; k < j; k++)
      if (st[k].op == PP_SEND_ACT || st[k].op == PP_SEND_GRAD) stage_send(e, comm_buf(e, &st[k]), k - i);
    pc->ops->group_start(pc);
    for (int k = i; k < j; k++) post(e, st[k].op, comm_buf(e, &st[k]), st[k].peer, k - i);
    pc->ops->group_end(pc);
    for (int k = i; k < j; k++)
      if (st[k].op == PP_RECV_ACT || st[k].op == PP_RECV_GRAD) stage_recv(e, comm_buf(e, &st[k]), k - i);
    if (tm) tm->pp_comm += timing_now(m->be) - t0;
    for (; i < j; i++)
      if (st[i].op == PP_SEND_GRAD) acts_put(e, st[i].micro, st[i].chunk);
  }
  if (e->overlap) finish_transfers(e);
  return loss;
}

double pp_exec_forward(pp_exec *e, const int32_t *tokens, const int32_t *targets) {
  model *m = e->m;
  model_fp8_begin_step(m, 0);
  int n_vstages = m->pp * m->vpp;
  double loss = 0;
  // Virtual stages run one after the other; each waits for its input, so plain blocking
  // send/recv along the chain cannot deadlock.
  for (int s = m->pp_rank; s < n_vstages; s += m->pp) {
    int chunk = s / m->pp;
    model_acts *a = acts_get(e, 0, chunk);
    if (s > 0) {
      post(e, PP_RECV_ACT, model_acts_input(a), (s - 1) % m->pp, 0);
      stage_recv(e, model_acts_input(a), 0);
    }
    loss += model_chunk_fwd(m, chunk, a, tokens, targets);
    if (s < n_vstages - 1) {
      stage_send(e, model_acts_output(m, a), 0);
      post(e, PP_SEND_ACT, model_acts_output(m, a), (s + 1) % m->pp, 0);
    }
    acts_put(e, 0, chunk);
  }
  if (e->overlap) finish_transfers(e);
  return loss;
}
