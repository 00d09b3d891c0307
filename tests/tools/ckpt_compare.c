// Test tool: compares the float32 datasets of two checkpoints.
//   ckpt_compare A.h5 B.h5 [--rtol X] [--prefix model/]
// With --rtol 0 (the default) every dataset must be bitwise equal; otherwise each dataset's
// relative error ||a - b|| / ||b|| must be at most X. Prints the worst dataset; exit 0 iff all pass.
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cmp_state {
  hid_t b;
  const char *prefix;
  double rtol, worst;
  char worst_name[256];
  int n_checked, n_failed;
} cmp_state;

static float *read_all(hid_t file, const char *name, hsize_t *n) {
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0) return NULL;
  hid_t s = H5Dget_space(d);
  *n = (hsize_t)H5Sget_simple_extent_npoints(s);
  float *buf = malloc(*n * sizeof(float) + 1);
  H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  H5Sclose(s);
  H5Dclose(d);
  return buf;
}

static herr_t visit(hid_t a, const char *name, const H5O_info_t *info, void *op) {
  cmp_state *st = op;
  if (info->type != H5O_TYPE_DATASET || strncmp(name, st->prefix, strlen(st->prefix)) != 0) return 0;
  hsize_t na = 0, nb = 0;
  float *x = read_all(a, name, &na), *y = read_all(st->b, name, &nb);
  st->n_checked++;
  double rel;
  if (!y || na != nb) {
    fprintf(stderr, "%s: missing in the second file or a different size\n", name);
    rel = INFINITY;
  } else if (st->rtol == 0) {
    rel = memcmp(x, y, na * sizeof(float)) == 0 ? 0 : INFINITY;
  } else {
    double num = 0, den = 0;
    for (hsize_t i = 0; i < na; i++) {
      double dd = (double)x[i] - y[i];
      num += dd * dd;
      den += (double)y[i] * y[i];
    }
    rel = sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
  }
  if (rel > st->rtol || isnan(rel)) {
    st->n_failed++;
    fprintf(stderr, "%s: relative difference %.3g exceeds %.3g\n", name, rel, st->rtol);
  }
  if (rel > st->worst || isnan(rel)) {
    st->worst = rel;
    snprintf(st->worst_name, sizeof st->worst_name, "%s", name);
  }
  free(x);
  free(y);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ckpt_compare A.h5 B.h5 [--rtol X] [--prefix model/]\n");
    return 2;
  }
  cmp_state st = {.prefix = "model/"};
  for (int i = 3; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--rtol") == 0) st.rtol = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--prefix") == 0) st.prefix = argv[i + 1];
  }
  hid_t a = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT), b = H5Fopen(argv[2], H5F_ACC_RDONLY, H5P_DEFAULT);
  if (a < 0 || b < 0) {
    fprintf(stderr, "ckpt_compare: cannot open %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  st.b = b;
  H5Ovisit(a, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &st);
  printf("ckpt_compare: %d datasets under '%s', %d over rtol %g, worst %.3g (%s)\n", st.n_checked, st.prefix,
         st.n_failed, st.rtol, st.worst, st.worst_name);
  H5Fclose(a);
  H5Fclose(b);
  return st.n_failed == 0 && st.n_checked > 0 ? 0 : 1;
}
