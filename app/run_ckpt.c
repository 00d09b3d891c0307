// Checkpoint glue (see run_ckpt.h). Host staging buffers make it backend-independent.
#include "app/run_ckpt.h"
#include "kernels/check.h"
#include "model/ckpt.h"
#include "model/hf.h"
#include "parallel/comm/mpi_check.h"
#include <string.h>

static const char *section_prefix[3] = {"model/", "optim/exp_avg/", "optim/exp_avg_sq/"};

static const model_tensor *find_tensor(const model *m, model_kind k, int layer) {
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].kind == k && m->tensors[i].layer == layer) return &m->tensors[i];
  return NULL;
}

// One entry per (section, tensor of the whole model), identical names and shapes on every
// rank; blocks this rank does not hold have count 0. host[s] are flat host buffers.
static ckpt_tensor *build_list(const model *m, float *host[3], int *n_out) {
  const model_config *mc = &m->cfg;
  int per_section = 1 + 9 * mc->n_layers + 1 + (mc->tie_embeddings ? 0 : 1);
  ckpt_tensor *list = XCALLOC((size_t)3 * per_section, sizeof(ckpt_tensor));
  int n = 0;
  for (int s = 0; s < 3; s++) {
    for (int k = 0; k < MODEL_N_KINDS; k++) {
      if (k == MODEL_LM_HEAD && mc->tie_embeddings) continue;
      int n_layers = model_specs[k].per_layer ? mc->n_layers : 1;
      for (int l = 0; l < n_layers; l++) {
        int layer = model_specs[k].per_layer ? l : -1;
        ckpt_tensor *t = &list[n++];
        int64_t full[2];
        t->ndim = model_full_shape(mc, (model_kind)k, full);
        if (layer >= 0) snprintf(t->name, sizeof t->name, "%slayers.%d.%s", section_prefix[s], l, model_specs[k].name);
        else snprintf(t->name, sizeof t->name, "%s%s", section_prefix[s], model_specs[k].name);
        const model_tensor *mt = find_tensor(m, (model_kind)k, layer);
        for (int dd = 0; dd < t->ndim; dd++) {
          t->full[dd] = full[dd];
          t->start[dd] = mt ? mt->start[dd] : 0;
          t->count[dd] = mt ? mt->count[dd] : 0;
        }
        t->data = mt ? host[s] + mt->offset : NULL;
        t->write = mt && m->g->dp_rank == 0 && (!mt->tp_replicated || m->g->tp_rank == 0);
      }
    }
  }
  // Order: all layers of one kind after another would scatter a layer; sort is not needed
  // for correctness, only identical order on every rank, which the loops above give.
  *n_out = n;
  return list;
}

static void alloc_host(const model *m, float *host[3]) {
  for (int s = 0; s < 3; s++) host[s] = XCALLOC((size_t)m->n_params, sizeof(float));
}

int run_ckpt_save(const cfg *c, model *m, opt_state *o, int64_t step, int64_t samples_seen, int kill_after, char *err,
                  size_t n_err) {
  float *host[3];
  alloc_host(m, host);
  opt_get_params(o, host[0]);
  opt_get_moments(o, host[1], host[2]);
  int n = 0;
  ckpt_tensor *list = build_list(m, host, &n);
  size_t n_yaml = cfg_to_yaml(c, NULL, 0) + 1;
  char *yaml = XMALLOC(n_yaml);
  cfg_to_yaml(c, yaml, n_yaml);
  ckpt_meta meta = {.step = step, .samples_seen = samples_seen, .seed = c->train.seed, .config_yaml = yaml};
  int rc = ckpt_save(c->checkpoint.dir, m->g->world->mpi, list, n, &meta, c->checkpoint.keep, kill_after, err, n_err);
  free(yaml);
  free(list);
  for (int s = 0; s < 3; s++) free(host[s]);
  return rc;
}

int run_ckpt_load(const char *path, const cfg *c, model *m, opt_state *o, int64_t *step, int64_t *samples_seen,
                  char *err, size_t n_err) {
  float *host[3];
  alloc_host(m, host);
  int n = 0;
  ckpt_tensor *list = build_list(m, host, &n);
  ckpt_meta meta = {0};
  int rc = ckpt_load(path, m->g->world->mpi, list, n, &meta, err, n_err);
  if (rc == 0) {
    m->be->from_host(m->be, m->params, host[0], (size_t)m->n_params * sizeof(float));
    model_sync_compute_weights(m);
    opt_set_moments(o, host[1], host[2]);
    *step = meta.step;
    *samples_seen = meta.samples_seen;
    if (meta.seed != c->train.seed && m->g->world_rank == 0)
      fprintf(stderr, "warning: checkpoint %s was trained with train.seed %llu, the config says %llu\n", path,
              (unsigned long long)meta.seed, (unsigned long long)c->train.seed);
  }
  free((void *)meta.config_yaml);
  free(list);
  for (int s = 0; s < 3; s++) free(host[s]);
  return rc;
}

// Every rank ends with the first failing rank's message (msg holds n_msg bytes on every rank).
static int run_agree(MPI_Comm comm, int rc, char *msg, int n_msg) {
  int rank = 0, n_ranks = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &n_ranks));
  int first = rc != 0 ? rank : n_ranks;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == n_ranks) return 0;
  MPI_CHECK(MPI_Bcast(msg, n_msg, MPI_CHAR, first, comm));
  return -1;
}

int run_hf_load(const char *dir, const cfg *c, model *m, char *err, size_t n_err) {
  char msg[1536] = "";
  // Every rank reads the small files and its own blocks itself (a file system all ranks share,
  // as for checkpoints); the checks see the whole model, so ranks fail alike.
  hf_dir h = {0};
  int rc = hf_check_config(dir, &c->model, msg, sizeof msg);
  if (rc == 0) rc = hf_dir_open(&h, dir, msg, sizeof msg);
  float *host = XCALLOC((size_t)m->n_params, sizeof(float));
  if (rc == 0) rc = hf_read_model(&h, m, host, msg, sizeof msg);
  hf_dir_close(&h);
  rc = run_agree(m->g->world->mpi, rc, msg, (int)sizeof msg);
  if (rc == 0) {
    m->be->from_host(m->be, m->params, host, (size_t)m->n_params * sizeof(float));
    model_sync_compute_weights(m);
  }
  free(host);
  snprintf(err, n_err, "%s", rc == 0 ? "" : msg);
  return rc;
}
