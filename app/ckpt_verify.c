// ckpt_verify: checks checkpoints without training, for scripts and for people moving checkpoints
// between clusters (docs/checkpoint.md, "Verifying a checkpoint").
//   build/ckpt_verify CKPT.h5 [CKPT.h5 ...]
// Checks each file's structure, root attributes, every tensor's checksum and finiteness; prints one
// line per problem ("error: FILE: ...") or one "ok: FILE: ..." line. Exit 0 if every file is sound,
// 1 if any is not, 2 on a bad command line.
#include "model/format/ckpt.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rc = argc < 2 ? 2 : 0;
  if (rc == 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fprintf(stderr, "usage: ckpt_verify CKPT.h5 [CKPT.h5 ...]\n"
                    "  checks each checkpoint's structure, root attributes, and every tensor's checksum (crc32c)\n"
                    "  and finiteness, without training; exit 0 if all are sound, else 1\n");
  } else {
    for (int i = 1; i < argc; i++)
      if (ckpt_verify(argv[i], stdout) != 0) rc = 1;
  }
  MPI_Finalize();
  return rc;
}
