// A GPU timeline of any CUDA program, for scripts/profile/profile_timeline.sh: loaded through
// CUDA_INJECTION64_PATH, it records with CUPTI's activity API every kernel, copy and memset as
// it ran (start and end on the GPU clock, stream, name; copies between GPUs as "memcpy PtoP")
// and every CUDA runtime call of the host (start and end on the same clock, name), and at exit
// writes them as CSV to $TRAINER_TIMELINE_OUT (default timeline.csv; ".rankR" is appended under
// mpirun, one file per rank). Unlike Nsight Compute's per-kernel replay, kernels run as in a
// normal run: at the clocks a busy GPU holds, overlapping where streams allow, and with the idle
// gaps between them.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cupti.h>

#define CUPTI_OK(call)                                                                   \
  do {                                                                                   \
    CUptiResult r_ = (call);                                                             \
    if (r_ != CUPTI_SUCCESS) {                                                           \
      const char *s_ = NULL;                                                             \
      cuptiGetResultString(r_, &s_);                                                     \
      fprintf(stderr, "cupti_timeline: %s failed: %s\n", #call, s_ ? s_ : "?");          \
      return;                                                                            \
    }                                                                                    \
  } while (0)

static FILE *timeline_out;
static const size_t timeline_buffer_bytes = (size_t)8 << 20;

static void CUPTIAPI timeline_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, timeline_buffer_bytes);
  *size = *buffer ? timeline_buffer_bytes : 0;
  *max_records = 0;
}

static const char *timeline_copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy other";
  }
}

// One CSV row per record: kind, start ns, end ns, stream (-1 for host calls), name.
static void CUPTIAPI timeline_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                               size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *rec = NULL;
  while (timeline_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(timeline_out, "kernel,%llu,%llu,%u,\"%s\"\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->name ? k->name : "?");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
        fprintf(timeline_out, "copy,%llu,%llu,%u,\"%s %llu B\"\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, timeline_copy_kind(m->copyKind),
                (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {  // between devices: the peer copies of parallel.tp_overlap=p2p
        const CUpti_ActivityMemcpyPtoP4 *m = (const CUpti_ActivityMemcpyPtoP4 *)rec;
        fprintf(timeline_out, "copy,%llu,%llu,%u,\"memcpy PtoP %llu B\"\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
        fprintf(timeline_out, "memset,%llu,%llu,%u,\"memset %llu B\"\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
        const char *name = NULL;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS) name = NULL;
        fprintf(timeline_out, "host,%llu,%llu,-1,\"%s\"\n", (unsigned long long)a->start,
                (unsigned long long)a->end, name ? name : "?");
        break;
      }
      default: break;
    }
  }
  free(buffer);
}

static void timeline_finish(void) {
  cuptiActivityFlushAll(1);
  if (timeline_out) fclose(timeline_out);
  timeline_out = NULL;
}

// The entry point CUDA calls for a library named by CUDA_INJECTION64_PATH.
int InitializeInjection(void);

static void timeline_start(void) {
  const char *path = getenv("TRAINER_TIMELINE_OUT");
  char name[4096];
  snprintf(name, sizeof name, "%s", path && *path ? path : "timeline.csv");
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  if (rank)  // several processes: one file each, named by rank
    snprintf(name + strlen(name), sizeof name - strlen(name), ".rank%s", rank);
  timeline_out = fopen(name, "w");
  if (!timeline_out) {
    fprintf(stderr, "cupti_timeline: cannot write %s\n", name);
    return;
  }
  fprintf(timeline_out, "kind,start_ns,end_ns,stream,name\n");
  CUPTI_OK(cuptiActivityRegisterCallbacks(timeline_buffer_requested, timeline_buffer_completed));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  atexit(timeline_finish);
}

int InitializeInjection(void) {
  timeline_start();
  return 1;
}
