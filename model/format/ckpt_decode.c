// The decoder's checkpoint reader (model/format/ckpt.h: ckpt_read_decode): every model tensor
// whole, on one rank, through ckpt_load.
#include "model/format/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/check.h"

int ckpt_read_decode(void *path, decode_tensor *list, int n, char *err, size_t n_err) {
  ckpt_tensor *t = XCALLOC((size_t)n, sizeof(ckpt_tensor));
  for (int i = 0; i < n; i++) {
    snprintf(t[i].name, sizeof t[i].name, "model/%s", list[i].name);
    t[i].ndim = list[i].ndim;
    for (int k = 0; k < list[i].ndim; k++) t[i].full[k] = t[i].count[k] = list[i].shape[k];
    t[i].data = list[i].host;
  }
  int rc = ckpt_load((const char *)path, MPI_COMM_SELF, t, n, NULL, err, n_err);
  free(t);
  return rc;
}
