// The execution environment of a run (see factory.h).
#include "app/factory.h"
#include "kernels/base/check.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "parallel/comm/nccl/comm_nccl.h"
#include "parallel/comm/nccl/comm_peer.h"
#include "parallel/comm/nccl/comm_staged.h"
#endif
#include <stdio.h>
#include <string.h>

k_backend_opts factory_backend_opts(const cfg *c, int on_gpu) {
  static const k_isa isas[] = {[CFG_CPU_ISA_AUTO] = K_ISA_AUTO, [CFG_CPU_ISA_AVX512] = K_ISA_AVX512,
                               [CFG_CPU_ISA_AVX2] = K_ISA_AVX2, [CFG_CPU_ISA_SSE] = K_ISA_SSE};
  return (k_backend_opts){
      .act = on_gpu && cfg_act_bf16(c) ? K_BF16 : K_F32,
      .tf32 = c->train.precision == CFG_PRECISION_TF32,
      .attn_own = c->train.attention == CFG_ATTENTION_OWN,
      .attn_atomic = c->train.attention == CFG_ATTENTION_CUDNN_ATOMIC,
      .cpu_isa = isas[c->train.cpu_isa],
      .peak_tflops = c->log.peak_tflops,
  };
}

static int factory_gpu_count(void) {
#ifdef TRAINER_HAVE_CUDA
  return k_cuda_device_count();
#else
  return 0;
#endif
}

// Whether device dev (set by `option`, e.g. "train.device=") uses a GPU: cuda, or auto with one
// visible. -1 with a message when cuda is asked for and none is there.
static int factory_wants_gpu(const char *option, cfg_device dev, int n_gpus, char *err, size_t n_err) {
  int gpu = dev == CFG_DEVICE_CUDA || (dev == CFG_DEVICE_AUTO && n_gpus > 0);
  if (gpu && n_gpus == 0) {
#ifdef TRAINER_HAVE_CUDA
    const char *why = "no GPU is visible";
#else
    const char *why = "this build has no CUDA backend (no CUDA toolkit at configure time)";
#endif
    return snprintf(err, n_err, "%scuda but %s; use %scpu (or auto)", option, why, option), -1;
  }
  return gpu;
}

// Whether this run uses GPUs: train.device=cuda, or auto with a GPU visible. -1 with a message
// when it cannot run as configured.
static int factory_use_gpu(const cfg *c, int n_gpus, char *err, size_t n_err) {
  const cfg_precision prec = c->train.precision;
  int gpu = factory_wants_gpu("train.device=", c->train.device, n_gpus, err, n_err);
  if (gpu < 0) return -1;
  if (!gpu && (prec == CFG_PRECISION_TF32 || prec == CFG_PRECISION_BF16))
    return snprintf(err, n_err, "train.precision=%s needs a GPU, and this rank runs on the CPU (train.device=%s, "
                    "%d GPU%s visible): CPU ranks compute in fp32, set train.precision=fp32 or auto",
                    cfg_precision_names[prec], cfg_device_names[c->train.device], n_gpus, n_gpus == 1 ? "" : "s"), -1;
  return gpu;
}

k_backend *factory_tool_backend(cfg_device device, char *err, size_t n_err) {
  const k_backend_opts fp32 = {.act = K_F32};  // tf32 off, GPU 0
  int gpu = factory_wants_gpu("--device ", device, factory_gpu_count(), err, n_err);
  if (gpu < 0) return NULL;
#ifdef TRAINER_HAVE_CUDA
  if (gpu) return k_backend_cuda_create(&fp32);
#endif
  return k_backend_cpu_create(&fp32);
}

// parallel.tp_overlap: the tp group's gathers and reduce-scatters as peer copies where asked (p2p)
// or possible (auto) and the group's GPUs reach each other; collective over the tp group. Sets
// f->tp_overlap to what runs. 0, or -1 with a message in err (p2p that cannot be served).
static int factory_tp_overlap(factory *f, const cfg *c, char *err, size_t n_err) {
  const cfg_tp_overlap want = c->parallel.tp_overlap;
  f->tp_overlap = want == CFG_TP_OVERLAP_NONE ? CFG_TP_OVERLAP_NONE : CFG_TP_OVERLAP_NCCL;
  if (f->g.tp == 1 || (want != CFG_TP_OVERLAP_P2P && want != CFG_TP_OVERLAP_AUTO)) return 0;
  const int nccl = f->device >= 0 && c->parallel.gpu_comm == CFG_GPU_COMM_NCCL;
  char why[256] = "the ranks are not GPU ranks over NCCL (train.device=cuda, parallel.gpu_comm=nccl)";
#ifdef TRAINER_HAVE_CUDA
  if (nccl && comm_peer_possible(f->g.tp_c->mpi, why, sizeof why)) {
    f->g.tp_c = comm_peer_create(f->g.tp_c, f->be);
    f->tp_overlap = CFG_TP_OVERLAP_P2P;
    return 0;
  }
#else
  (void)nccl;
#endif
  if (want == CFG_TP_OVERLAP_P2P)
    return check_errf(err, n_err, "parallel.tp_overlap = p2p copies between the tp group's GPUs, but %s: set "
                      "parallel.tp_overlap=nccl (or auto)", why);
  return 0;
}

int factory_init(factory *f, const cfg *c, char *err, size_t n_err) {
  memset(f, 0, sizeof *f);
  f->device = -1;
  launch_place_init(&f->place);
  int n_gpus = factory_gpu_count(), gpu = factory_use_gpu(c, n_gpus, err, n_err);
  if (gpu < 0) return -1;
  const cfg_parallel *p = &c->parallel;
  comm_opts co = comm_opts_make(p->comm_timeout_s, 0, p->mpi_chunk_elems, NULL);
  k_backend_opts bo = factory_backend_opts(c, gpu);
#ifdef TRAINER_HAVE_CUDA
  if (gpu) {
    // One GPU per rank, chosen by the node-local rank, so the same command works on many nodes
    // (and where a launcher shows each rank one GPU, that one). NCCL refuses two ranks on one
    // GPU; the staged MPI communicator lets them share it. Both order their work on the
    // backend's compute stream.
    bo.device = f->device = f->place.local_rank % n_gpus;
    if (c->train.precision == CFG_PRECISION_FP8 && k_cuda_device_fp8_check(bo.device, err, n_err) != 0) return -1;
    f->be = k_backend_cuda_create(&bo);
    co.stream = k_cuda_stream_of(f->be);
    f->comms = p->gpu_comm == CFG_GPU_COMM_MPI ? comm_staged_factory(&co) : comm_nccl_factory(&co);
  }
#endif
  if (!f->be) {
    f->be = k_backend_cpu_create(&bo);
    f->comms = comm_mpi_factory(&co);
  }
  grid_init(&f->g, p->tp, p->dp, p->pp, &f->comms);
  f->have_grid = 1;
  if (factory_tp_overlap(f, c, err, n_err) != 0) return -1;
  // The reductions that run beside backward take SMs from its kernels: fewer CTAs, on a
  // communicator of their own, slow the backward less (the rest keep NCCL's choice). CPU ranks
  // have no SMs to spare; there the second communicator only exercises the same code path.
  if (p->shard_group > 1 && p->shard_group < p->dp) grid_set_shard_group(&f->g, &f->comms, p->shard_group);
  // parallel.shard=weights gathers weights on the dp communicator while the gradients' reduce-scatters
  // run on this one: a wait for one does not wait for the other.
  if ((p->dp_overlap_ctas > 0 || p->shard == CFG_SHARD_WEIGHTS) && p->dp > 1)
    grid_add_dp_overlap(&f->g, &f->comms, p->dp_overlap_ctas);
  // Each gather of parallel.shard=weights in flight has a communicator: the shard group's, then these;
  // on the copy engines, one of these per slot (the slots are registered with it).
  if (p->shard == CFG_SHARD_WEIGHTS && p->dp > 1 && p->gather_copy_engine)
    grid_add_gathers(&f->g, &f->comms, p->shard_prefetch + 1, 1);
  else if (p->shard == CFG_SHARD_WEIGHTS && p->dp > 1 && p->shard_prefetch > 1)
    grid_add_gathers(&f->g, &f->comms, p->shard_prefetch - 1, 0);
  return 0;
}

void factory_free(factory *f) {
  if (f->have_grid) grid_free(&f->g);
  f->have_grid = 0;
  comm_factory_free(&f->comms);
  k_backend_free(&f->be);
}
