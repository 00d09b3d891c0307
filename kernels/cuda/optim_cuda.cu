// Multi-tensor ops on the GPU (see optim_cuda.h). The ranges are laid end to end in
// a virtual concatenation; each block takes a fixed slice of it, finds its first range by
// binary search and walks on, so one launch covers every tensor whatever their sizes. The range
// table lives on the device and is uploaded only when the list changes (the optimizer's lists
// are fixed for a run); the tables and the partial-sum buffers are cached in the backend's
// context (k_cuda_ctx.optim). The sum of squares is deterministic: fixed per-block partials,
// then one block reduces them in a fixed order.
#include "kernels/cuda/optim_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_cuda.cuh"

namespace {

// A k_range, or a k_span (offset and p_offset its at, tensor its tensor).
struct dev_range {
  int64_t offset, n_elem, vstart;  // vstart: where the range begins in the concatenation
  int64_t p_offset;
  int decay, tensor;
};

// One entry i of a caller's list (k_range or k_span) as a dev_range, vstart aside.
typedef void (*range_fill)(const void *list, int i, dev_range *d);

void fill_range(const void *list, int i, dev_range *d) {
  const k_range *r = (const k_range *)list + i;
  d->offset = r->offset, d->n_elem = r->n_elem, d->p_offset = r->p_offset, d->decay = r->decay, d->tensor = 0;
}

void fill_span(const void *list, int i, dev_range *d) {
  const k_span *s = (const k_span *)list + i;
  d->offset = d->p_offset = s->at, d->n_elem = s->n_elem, d->decay = 0, d->tensor = s->tensor;
}

// A device copy of one host range list, refreshed when the list differs from what was uploaded.
struct range_table {
  const void *key;     // the caller's list this copy is for
  char *host;          // (n entries of the caller's type) what was uploaded
  dev_range *dev;      // (n)
  int n, cap;
  int64_t total;       // elements of all ranges
};

// One copy per caller list (the optimizer passes fixed lists every step: one per piece of its
// shard, and with optimizer.offload one per bucket of the host share); a list not seen before
// takes the least recently used slot.
enum { RANGE_TABLES = 1024 };
struct range_cache {
  range_table t[RANGE_TABLES];
  unsigned long long used[RANGE_TABLES], clock;
};

// The device table of the caller's list r (n entries of elem bytes, made by fill).
const range_table *table_get(range_cache *c, const void *r, int n, size_t elem, range_fill fill, cudaStream_t s) {
  int slot = 0;
  for (int i = 0; i < RANGE_TABLES; i++) {
    if (c->t[i].key == r) {
      slot = i;
      break;
    }
    if (c->used[i] < c->used[slot]) slot = i;
  }
  c->used[slot] = ++c->clock;
  range_table *t = &c->t[slot];
  t->key = r;
  if (n == t->n && t->host && memcmp(t->host, r, elem * (size_t)n) == 0) return t;
  CUDA_CHECK(cudaStreamSynchronize(s));  // earlier launches may still read the old table
  if (n > t->cap) {
    if (t->dev) CUDA_CHECK(cudaFree(t->dev));
    free(t->host);
    CUDA_CHECK(cudaMalloc((void **)&t->dev, sizeof(dev_range) * (size_t)n));
    t->host = (char *)malloc(elem * (size_t)n);
    CHECK(t->host, "optimizer ranges: out of host memory for %d ranges", n);
    t->cap = n;
  }
  dev_range *d = (dev_range *)malloc(sizeof(dev_range) * (size_t)(n ? n : 1));
  CHECK(d, "optimizer ranges: out of host memory for %d ranges", n);
  int64_t v = 0;
  for (int i = 0; i < n; i++) {
    fill(r, i, &d[i]);
    d[i].vstart = v;
    v += d[i].n_elem;
  }
  if (n) CUDA_CHECK(cudaMemcpy(t->dev, d, sizeof(dev_range) * (size_t)n, cudaMemcpyHostToDevice));
  free(d);
  memcpy(t->host, r, elem * (size_t)n);
  t->n = n;
  t->total = v;
  return t;
}

// Index of the range holding virtual element j: the last range with vstart <= j.
__device__ int find_range(const dev_range *r, int n, int64_t j) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (r[mid].vstart <= j) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

enum { OPT_THREADS = 256, OPT_PER_THREAD = 16, OPT_SLICE = OPT_THREADS * OPT_PER_THREAD };

// AdamW on element i of the moments and gradient, ip of the weights.
template <typename PC>
__device__ __forceinline__ void adamw_elem(float *p, PC *pc, const float *g, float *m, float *v, int64_t i, int64_t ip,
                                           float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                                           float g_scale) {
  const float gi = g[i] * g_scale;
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float pi = p[ip] - lr * (mi / bc1 / (sqrtf(vi / bc2) + eps) + wd * p[ip]);
  p[ip] = pi;
  if (pc) pc[ip] = k_st<PC>(pi);
}

// Each block: virtual elements [blockIdx.x * OPT_SLICE, + OPT_SLICE), thread t takes every
// OPT_THREADS-th, so consecutive threads touch consecutive addresses inside a range. A slice
// inside one range (nearly every one) takes a path with no range walk, whose unrolled
// iterations keep several loads in flight; a slice across ranges walks them element by element.
template <typename PC>
__global__ void adamw_ranges_kernel(float *p, PC *pc, const float *g, float *m, float *v, const dev_range *r, int n,
                                    int64_t total, float lr, float beta1, float beta2, float eps, float weight_decay,
                                    float bc1, float bc2, float g_scale) {
  const int64_t j0 = (int64_t)blockIdx.x * OPT_SLICE;
  int k = find_range(r, n, j0 + threadIdx.x < total ? j0 + threadIdx.x : total - 1);
  if (j0 + OPT_SLICE <= r[k].vstart + r[k].n_elem) {
    const int64_t base = r[k].offset - r[k].vstart, pbase = r[k].p_offset - r[k].vstart;
    const float wd = r[k].decay ? weight_decay : 0.0f;
#pragma unroll 4
    for (int it = 0; it < OPT_PER_THREAD; it++) {
      const int64_t j = j0 + (int64_t)it * OPT_THREADS + threadIdx.x;
      adamw_elem(p, pc, g, m, v, base + j, pbase + j, lr, beta1, beta2, eps, wd, bc1, bc2, g_scale);
    }
    return;
  }
  for (int it = 0; it < OPT_PER_THREAD; it++) {
    const int64_t j = j0 + (int64_t)it * OPT_THREADS + threadIdx.x;
    if (j >= total) break;
    while (j >= r[k].vstart + r[k].n_elem) k++;
    adamw_elem(p, pc, g, m, v, r[k].offset + (j - r[k].vstart), r[k].p_offset + (j - r[k].vstart), lr, beta1, beta2,
               eps, r[k].decay ? weight_decay : 0.0f, bc1, bc2, g_scale);
  }
}

// The same slices; the sum runs in the same order on both paths.
__global__ void sumsq_ranges_part(const float *x, const dev_range *r, int n, int64_t total, double *part) {
  __shared__ double sh[32];
  const int64_t j0 = (int64_t)blockIdx.x * OPT_SLICE;
  int k = find_range(r, n, j0 + threadIdx.x < total ? j0 + threadIdx.x : total - 1);
  double s = 0.0;
  if (j0 + OPT_SLICE <= r[k].vstart + r[k].n_elem) {
    const float *xs = x + (r[k].offset - r[k].vstart) + j0 + threadIdx.x;
    float xv[OPT_PER_THREAD];
#pragma unroll
    for (int it = 0; it < OPT_PER_THREAD; it++) xv[it] = xs[it * OPT_THREADS];
#pragma unroll
    for (int it = 0; it < OPT_PER_THREAD; it++) s += (double)xv[it] * xv[it];
  } else {
    for (int it = 0; it < OPT_PER_THREAD; it++) {
      const int64_t j = j0 + (int64_t)it * OPT_THREADS + threadIdx.x;
      if (j >= total) break;
      while (j >= r[k].vstart + r[k].n_elem) k++;
      const float xi = x[r[k].offset + (j - r[k].vstart)];
      s += (double)xi * xi;
    }
  }
  s = k_block_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sumsq_ranges_total(const double *part, int64_t n_part, double *total) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n_part; i += blockDim.x) s += part[i];
  s = k_block_sum(s, sh);
  if (threadIdx.x == 0) *total = s;
}

// fp8_cast_spans: the same slices. A slice inside one span (nearly every one) casts with its
// tensor's scale and commits the block's amax once per warp; a slice across spans walks them,
// each thread committing its amax of a span as it leaves it. Integer max on the |x| bits: the
// amax does not depend on the order (fp8_cuda.cuh).
template <typename E, k_fp8 F>
__global__ void fp8_spans_kernel(const E *x, const dev_range *r, int n, int64_t total, const float *scale, uint8_t *out,
                                 float *amax) {
  const int64_t j0 = (int64_t)blockIdx.x * OPT_SLICE;
  int k = find_range(r, n, j0);
  uint32_t m = 0;
  if (j0 + OPT_SLICE <= r[k].vstart + r[k].n_elem) {  // the same for every thread of the block
    const int64_t base = r[k].offset - r[k].vstart;
    const float s = out ? scale[r[k].tensor] : 0.0f;
#pragma unroll 4
    for (int it = 0; it < OPT_PER_THREAD; it++) {
      const int64_t i = base + j0 + (int64_t)it * OPT_THREADS + threadIdx.x;
      const float f = k_ld(x[i]);
      m = max(m, abs_bits(f));
      if (out) out[i] = (uint8_t)fp8x2<F>(f * s, 0.0f);
    }
    if (amax) amax_commit_warp(m, amax + r[k].tensor);
    return;
  }
  for (int it = 0; it < OPT_PER_THREAD; it++) {
    const int64_t j = j0 + (int64_t)it * OPT_THREADS + threadIdx.x;
    if (j >= total) break;
    for (; j >= r[k].vstart + r[k].n_elem; k++, m = 0)
      if (amax && m) atomicMax((unsigned int *)(amax + r[k].tensor), m);
    const int64_t i = r[k].offset + (j - r[k].vstart);
    const float f = k_ld(x[i]);
    m = max(m, abs_bits(f));
    if (out) out[i] = (uint8_t)fp8x2<F>(f * scale[r[k].tensor], 0.0f);
  }
  if (amax && m) atomicMax((unsigned int *)(amax + r[k].tensor), m);
}

}  // namespace

// The optimizer ops' state in a backend's context, made on the first call.
struct k_cuda_optim {
  range_cache sumsq_tables, adamw_tables, fp8_tables;
  double *part;        // device partial sums, then the total
  int64_t part_cap;
  double *total_host;  // pinned: the one read of the step
};

static k_cuda_optim *optim_of(k_cuda_ctx *c) {
  if (!c->optim) {
    c->optim = (k_cuda_optim *)calloc(1, sizeof *c->optim);
    CHECK(c->optim != NULL, "out of host memory for the optimizer ops' state");
  }
  return c->optim;
}

void k_cuda_optim_free(k_cuda_optim **op) {
  if (!op || !*op) return;
  k_cuda_optim *o = *op;
  range_cache *caches[3] = {&o->sumsq_tables, &o->adamw_tables, &o->fp8_tables};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < RANGE_TABLES; i++) {
      if (caches[k]->t[i].dev) CUDA_CHECK(cudaFree(caches[k]->t[i].dev));
      free(caches[k]->t[i].host);
    }
  if (o->part) CUDA_CHECK(cudaFree(o->part));
  if (o->total_host) CUDA_CHECK(cudaFreeHost(o->total_host));
  free(o);
  *op = NULL;
}

extern "C" double k_cuda_sumsq_ranges(k_backend *b, const float *x, const k_range *r, int n_ranges) {
  if (n_ranges <= 0) return 0.0;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  k_cuda_optim *o = optim_of(c);
  cudaStream_t s = c->stream;
  const range_table *t = table_get(&o->sumsq_tables, r, n_ranges, sizeof *r, fill_range, s);
  if (t->total == 0) return 0.0;
  const int64_t nb = (t->total + OPT_SLICE - 1) / OPT_SLICE;
  if (nb + 1 > o->part_cap) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    if (o->part) CUDA_CHECK(cudaFree(o->part));
    CUDA_CHECK(cudaMalloc((void **)&o->part, sizeof(double) * (size_t)(nb + 1)));
    o->part_cap = nb + 1;
  }
  if (!o->total_host) CUDA_CHECK(cudaMallocHost((void **)&o->total_host, sizeof(double)));
  CHECK(nb < (int64_t)1 << 31, "sumsq_ranges: %lld elements is too many for one launch", (long long)t->total);
  sumsq_ranges_part<<<(unsigned)nb, OPT_THREADS, 0, s>>>(x, t->dev, t->n, t->total, o->part);
  CUDA_LAUNCH_CHECK("sumsq_ranges_part");
  sumsq_ranges_total<<<1, 1024, 0, s>>>(o->part, nb, o->part + nb);
  CUDA_LAUNCH_CHECK("sumsq_ranges_total");
  CUDA_CHECK(cudaMemcpyAsync(o->total_host, o->part + nb, sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return *o->total_host;
}

extern "C" void k_cuda_adamw_ranges(k_backend *b, float *p, void *pc, k_dtype pc_type, const float *g, float *m, float *v,
                                    const k_range *r, int n_ranges, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float bc1, float bc2, float g_scale) {
  if (n_ranges <= 0) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  cudaStream_t s = c->stream;
  const range_table *t = table_get(&optim_of(c)->adamw_tables, r, n_ranges, sizeof *r, fill_range, s);
  if (t->total == 0) return;
  const int64_t nb = (t->total + OPT_SLICE - 1) / OPT_SLICE;
  CHECK(nb < (int64_t)1 << 31, "adamw_ranges: %lld elements is too many for one launch", (long long)t->total);
  if (pc && pc_type == K_BF16) {
    adamw_ranges_kernel<k_bf16><<<(unsigned)nb, OPT_THREADS, 0, s>>>(p, (k_bf16 *)pc, g, m, v, t->dev, t->n, t->total, lr,
                                                                    beta1, beta2, eps, weight_decay, bc1, bc2, g_scale);
  } else {
    CHECK(!pc || pc_type == K_F32, "adamw_ranges: unknown compute-copy dtype %d", (int)pc_type);
    adamw_ranges_kernel<float><<<(unsigned)nb, OPT_THREADS, 0, s>>>(p, (float *)pc, g, m, v, t->dev, t->n, t->total, lr,
                                                                   beta1, beta2, eps, weight_decay, bc1, bc2, g_scale);
  }
  CUDA_LAUNCH_CHECK("adamw_ranges_kernel");
}

template <typename E>
static void fp8_spans_go(const E *x, const range_table *t, const float *scale, k_fp8 fmt, uint8_t *out, float *amax,
                         cudaStream_t s) {
  const int64_t nb = (t->total + OPT_SLICE - 1) / OPT_SLICE;
  CHECK(nb < (int64_t)1 << 31, "fp8_cast_spans: %lld elements is too many for one launch", (long long)t->total);
  if (fmt == K_E4M3)
    fp8_spans_kernel<E, K_E4M3><<<(unsigned)nb, OPT_THREADS, 0, s>>>(x, t->dev, t->n, t->total, scale, out, amax);
  else
    fp8_spans_kernel<E, K_E5M2><<<(unsigned)nb, OPT_THREADS, 0, s>>>(x, t->dev, t->n, t->total, scale, out, amax);
  CUDA_LAUNCH_CHECK("fp8_spans_kernel");
}

extern "C" void k_cuda_fp8_cast_spans(k_backend *b, const void *x, const k_span *spans, int n_spans, const float *scale,
                                      k_fp8 fmt, uint8_t *out, float *amax) {
  CHECK(n_spans >= 0 && (fmt == K_E4M3 || fmt == K_E5M2), "fp8_cast_spans: %d spans, format %d", n_spans, (int)fmt);
  for (int k = 0; k < n_spans; k++)
    CHECK(spans[k].at >= 0 && spans[k].n_elem >= 0 && spans[k].tensor >= 0,
          "fp8_cast_spans: span %d (%lld elements at %lld, tensor %d)", k, (long long)spans[k].n_elem,
          (long long)spans[k].at, spans[k].tensor);
  if (n_spans == 0 || (!out && !amax)) return;
  k_cuda_ctx *c = k_cuda_ctx_of(b);
  const range_table *t = table_get(&optim_of(c)->fp8_tables, spans, n_spans, sizeof *spans, fill_span, c->stream);
  if (t->total == 0) return;
  if (c->act == K_BF16) fp8_spans_go((const k_bf16 *)x, t, scale, fmt, out, amax, c->stream);
  else fp8_spans_go((const float *)x, t, scale, fmt, out, amax, c->stream);
}
