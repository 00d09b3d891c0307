// Safetensors files (the Hugging Face weight format), read and written without Python: an
// 8-byte little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "F32", "shape": [r, c], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt"}}
// and the tensors' raw little-endian bytes, offsets counted from the end of the header.
// The reader validates the whole header before anything is read (bounded length, strict JSON,
// known dtypes, shape products matching byte lengths, offsets inside the file and not
// overlapping), so a damaged or truncated file is one clear message naming the file.
// Layout and tensor names of an export: docs/hf.md.
#ifndef TRAINER_SAFETENSORS_H
#define TRAINER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES (100 << 20)  // the limit of the reference implementation

// Every dtype of the format; only F32, BF16 and F16 convert to fp32 (st_read_block).
typedef enum st_dtype {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_F64,
  ST_I64, ST_U64, ST_N_DTYPES
} st_dtype;

const char *st_dtype_name(st_dtype d);
int st_dtype_bytes(st_dtype d);

typedef struct st_tensor {
  char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  int64_t begin, end;  // byte offsets in the data region, [begin, end)
} st_tensor;

typedef struct st_file {
  char path[1024];
  int fd;                 // -1 when closed
  int64_t n_file_bytes;
  int64_t data_start;     // 8 + header length: where the data region starts
  st_tensor *tensors;     // (n_tensors) in header order
  int n_tensors;
} st_file;

// Opens and validates path. 0, or -1 with one line in err naming the file and what is wrong.
int st_open(st_file *f, const char *path, char *err, size_t n_err);
// Safe to call twice.
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
// Reads the block [start, start + count) of a 1-D or 2-D tensor (1-D: index 0 only) as fp32,
// dense, row-major into out. F32, BF16 and F16 tensors; others are refused with a message.
int st_read_block(const st_file *f, const st_tensor *t, const int64_t start[2], const int64_t count[2], float *out,
                  char *err, size_t n_err);

// Half-precision (IEEE binary16) to float, exact for every value.
float st_f16_to_f32(uint16_t h);

// Writing: the header is written first from the list of entries, then each entry's data in
// list order with st_writer_put. The file appears at its path (through a temporary beside it
// and a rename) only when st_writer_close succeeds.
typedef struct st_entry {
  char name[128];
  st_dtype dtype;         // ST_F32 or ST_BF16 (fp32 data rounded to nearest even)
  int ndim;
  int64_t shape[ST_MAX_DIMS];
} st_entry;

typedef struct st_writer {
  FILE *f;
  char path[1024], tmp[1040];
  const st_entry *entries;
  int n_entries, next;
  int64_t n_data_bytes;   // the data region's size
} st_writer;

// Bytes of an entry's data.
int64_t st_entry_bytes(const st_entry *e);
int st_writer_open(st_writer *w, const char *path, const st_entry *entries, int n_entries, char *err, size_t n_err);
// The next entry's elements (its shape's product) as fp32, converted to the entry's dtype.
int st_writer_put(st_writer *w, const float *data, char *err, size_t n_err);
// Flushes, syncs and renames the temporary to the path; every entry must have been put.
int st_writer_close(st_writer *w, char *err, size_t n_err);
// Drops an unfinished file (removes the temporary). Safe after close and twice.
void st_writer_abort(st_writer *w);

#endif
