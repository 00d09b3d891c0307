// Whole-model check of the CUDA backend (label gpu): the same initial weights and batch on
// the CPU reference (fp32) and on the GPU (its default activation dtype, bf16): the loss must
// agree to 1e-2 relative and every parameter gradient must have cosine similarity >= 0.99
// with the reference.
#include "app/config.h"
#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "model/model.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/tp.h"
#include "tests/unit/test_util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_out {
  double loss;
  float *grads;  // host copy of the flat gradient buffer
} run_out;

static run_out run_once(const cfg *c, grid *g, k_backend *be, const int32_t *tok_h, const int32_t *tgt_h) {
  model m;
  const model_layout ml = cfg_model_layout(c);
  const model_place at = tp_model_place(g);
  model_init(&m, &c->model, &ml, &at, be);
  tp_model_comm tpc;
  tp_bind_model(&tpc, &m, g);
  model_init_weights(&m, c->train.seed);
  size_t n_tok = (size_t)m.dims.rows * sizeof(int32_t);
  int32_t *tok = be->alloc(be, n_tok), *tgt = be->alloc(be, n_tok);
  be->from_host(be, tok, tok_h, n_tok);
  be->from_host(be, tgt, tgt_h, n_tok);
  model_acts *a = model_acts_create(&m, 0);
  run_out r;
  r.loss = model_chunk_fwd(&m, 0, a, tok, tgt) / (double)m.dims.rows;
  model_chunk_bwd(&m, 0, a, tok, tgt, 1.0f / (float)m.dims.rows);
  r.grads = malloc((size_t)m.n_params * sizeof(float));
  be->to_host(be, r.grads, m.grads, (size_t)m.n_params * sizeof(float));
  model_acts_free(&m, &a);
  be->free(be, tok);
  be->free(be, tgt);
  model_free(&m);
  return r;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (k_cuda_device_count() == 0) {
    fprintf(stderr, "test_model_gpu: no GPU visible; this test needs one (ctest label gpu)\n");
    MPI_Finalize();
    return 1;
  }
  char *over[] = {"model.dim=256", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
                  "model.ffn_dim=512", "model.vocab_size=512", "model.seq_len=128", "train.micro_batch=4",
                  "train.global_batch=4"};
  cfg c;
  char err[512];
  int ok = cfg_load(&c, NULL, (int)(sizeof over / sizeof over[0]), over, err, sizeof err) == 0 &&
           cfg_validate(&c, 1, err, sizeof err) == 0;
  EXPECT(ok, "config: %s", err);
  grid g;
  comm_factory cf = comm_mpi_factory(NULL);
  grid_init(&g, 1, 1, 1, &cf);
  int64_t rows = (int64_t)c.model.seq_len * c.train.micro_batch;
  int32_t *tok = malloc(rows * sizeof(int32_t)), *tgt = malloc(rows * sizeof(int32_t));
  srand(7);
  for (int64_t i = 0; i < rows; i++) {
    tok[i] = rand() % c.model.vocab_size;
    tgt[i] = rand() % c.model.vocab_size;
  }
  k_backend *cpu = k_backend_cpu_create(NULL), *gpu = k_backend_cuda_create(&(k_backend_opts){.act = K_BF16});
  run_out ref = run_once(&c, &g, cpu, tok, tgt), got = run_once(&c, &g, gpu, tok, tgt);
  double rel = fabs(got.loss - ref.loss) / fabs(ref.loss);
  printf("loss: cpu fp32 %.6f, gpu (act dtype %s) %.6f, relative difference %.2e\n", ref.loss,
         gpu->act == K_BF16 ? "bf16" : "fp32", got.loss, rel);
  EXPECT(rel <= 1e-2, "loss differs by %.3g relative", rel);

  // Per tensor cosine similarity, over the tensor list of a model laid out like both runs.
  model layout;
  const model_layout ml = cfg_model_layout(&c);
  const model_place at = tp_model_place(&g);
  model_init(&layout, &c.model, &ml, &at, cpu);
  double worst = 1;
  const char *worst_name = "";
  for (int i = 0; i < layout.n_tensors; i++) {
    const model_tensor *t = &layout.tensors[i];
    double dot = 0, na = 0, nb = 0;
    for (int64_t j = 0; j < t->n_elem; j++) {
      double x = ref.grads[t->offset + j], y = got.grads[t->offset + j];
      dot += x * y;
      na += x * x;
      nb += y * y;
    }
    double cosine = dot / (sqrt(na) * sqrt(nb) + 1e-30);
    EXPECT(cosine >= 0.99, "gradient of %s: cosine similarity %.4f < 0.99", t->name, cosine);
    if (cosine < worst) {
      worst = cosine;
      worst_name = t->name;
    }
  }
  printf("gradients: %d tensors, lowest cosine similarity %.5f (%s)\n", layout.n_tensors, worst, worst_name);
  model_free(&layout);
  free(ref.grads);
  free(got.grads);
  free(tok);
  free(tgt);
  grid_free(&g);
  comm_factory_free(&cf);
  int rc = test_summary();
  MPI_Finalize();
  return rc;
}
