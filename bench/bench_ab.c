/*
 * bench_ab: warm whole-bucket reads through several builds of the library in one process, their
 * passes interleaved, so that every build meets the same machine load (docs/format.md 4.3,
 * "Reads and the cache").
 *
 *   bench_ab PASSES LIB FILE [LIB FILE]...
 *
 * Each LIB (a libbucketstore.so, dlopen'd RTLD_LOCAL | RTLD_DEEPBIND, so that builds of one ABI
 * keep their own code) opens its FILE read-only (a bsbench s100.bs kept with --keep, one copy per
 * LIB: LMDB maps a file once per process) and reads it as bsbench's "whole buckets from 0, warm
 * map" does: bs_get_bucket_data of one bucket from op 0, 10,000 ops a call, over buckets
 * by_list["l00000"].. (NB, default 100) of stream 1. One round is one pass of every LIB, in an
 * order rotated each round. Per LIB: min and median ns per op over the passes, and the median and
 * quartiles of its per-round time over the first LIB's (the A/B ratio, which the load moves far
 * less than the times).
 */
#include "storage.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS 8

typedef struct dl {
  uint64_t ops, bytes, next_after;
} dl;

/* What bsbench's reader does with an op: counts it and its bytes (a field's size, no bytes). */
static int on_chunk(const bs_chunk *ch, void *payload) {
  dl *d = payload;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    d->bytes += o->data.size + o->object_type.size + o->object_id.size + o->subkey.size;
  }
  d->ops += ch->n_ops;
  d->next_after = ch->next_after;
  return 0;
}

typedef struct lib {
  int (*open)(bs_db **, const char *, const bs_open_options *, bs_error *);
  int (*storage_open)(bs_storage **, bs_db *, uint32_t, bs_error *);
  int (*checkpoint)(bs_checkpoint *, bs_storage *, bs_error *);
  int (*bucket_data)(int *, bs_storage *, uint64_t, const bs_bucket_request *, size_t,
                     const bs_batch_options *, int (*)(const bs_chunk *, void *), void *,
                     bs_error *);
  bs_db *db;
  bs_storage *st;
  bs_checkpoint cp;
  double *secs;
  uint64_t ops; /* per pass: every LIB must read the same */
} lib;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int lib_open(lib *l, const char *so, const char *file) {
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err;
  if (!h) {
    fprintf(stderr, "bench_ab: %s\n", dlerror());
    return 1;
  }
  *(void **)&l->open = dlsym(h, "bs_open");
  *(void **)&l->storage_open = dlsym(h, "bs_storage_open");
  *(void **)&l->checkpoint = dlsym(h, "bs_get_checkpoint");
  *(void **)&l->bucket_data = dlsym(h, "bs_get_bucket_data");
  if (!l->open || !l->storage_open || !l->checkpoint || !l->bucket_data) {
    fprintf(stderr, "bench_ab: %s lacks the read calls\n", so);
    return 1;
  }
  o.flags = BS_OPEN_RDONLY;
  if (l->open(&l->db, file, &o, &err) || l->storage_open(&l->st, l->db, 1, &err) ||
      l->checkpoint(&l->cp, l->st, &err)) {
    fprintf(stderr, "bench_ab: %s through %s: %s\n", file, so, err.msg);
    return 1;
  }
  return 0;
}

/* One pass: every bucket from 0 to the checkpoint. */
static int pass(lib *l, unsigned nb, double *secs) {
  double t0 = now_s();
  dl d = {0, 0, 0};
  bs_error err;
  for (unsigned b = 0; b < nb; b++) {
    char name[32];
    bs_bucket_request req;
    bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
    int more = 1;
    snprintf(name, sizeof name, "by_list[\"l%05u\"]", b);
    req.bucket.data = name;
    req.bucket.size = strlen(name);
    req.after = 0;
    bo.limit = 10000;
    while (more) {
      d.next_after = req.after;
      if (l->bucket_data(&more, l->st, l->cp.op_id, &req, 1, &bo, on_chunk, &d, &err)) {
        fprintf(stderr, "bench_ab: read: %s\n", err.msg);
        return 1;
      }
      req.after = d.next_after;
    }
  }
  *secs = now_s() - t0;
  if (l->ops && l->ops != d.ops) {
    fprintf(stderr, "bench_ab: a pass read %llu ops, the first %llu\n", (unsigned long long)d.ops,
            (unsigned long long)l->ops);
    return 1;
  }
  l->ops = d.ops;
  return d.ops == 0;
}

int main(int argc, char **argv) {
  lib libs[MAX_LIBS];
  int passes = argc > 1 ? atoi(argv[1]) : 0, n = (argc - 2) / 2;
  unsigned nb = getenv("NB") ? (unsigned)atoi(getenv("NB")) : 100;
  double *ratio;
  if (passes < 1 || n < 1 || n > MAX_LIBS || argc != 2 + 2 * n) {
    fprintf(stderr, "usage: bench_ab PASSES LIB FILE [LIB FILE]... (at most %d)\n", MAX_LIBS);
    return 2;
  }
  memset(libs, 0, sizeof libs);
  for (int j = 0; j < n; j++) {
    if (lib_open(&libs[j], argv[2 + 2 * j], argv[3 + 2 * j])) return 1;
    if (!(libs[j].secs = calloc((size_t)passes, sizeof(double)))) return 1;
  }
  for (int p = 0; p < passes; p++)
    for (int k = 0; k < n; k++) {
      int j = (k + p) % n;
      if (pass(&libs[j], nb, &libs[j].secs[p])) return 1;
    }
  if (!(ratio = calloc((size_t)passes, sizeof *ratio))) return 1;
  for (int j = n - 1; j >= 0; j--) { /* the first last: the ratios need its times unsorted */
    lib *l = &libs[j];
    for (int p = 0; p < passes; p++) ratio[p] = l->secs[p] / libs[0].secs[p];
    qsort(ratio, (size_t)passes, sizeof *ratio, cmp_double);
    qsort(l->secs, (size_t)passes, sizeof(double), cmp_double);
    printf("%s %s: %llu ops a pass, min %.2f median %.2f ns/op; against the first: median %.3fx "
           "(quartiles %.3f-%.3f)\n",
           argv[2 + 2 * j], argv[3 + 2 * j], (unsigned long long)l->ops,
           l->secs[0] / (double)l->ops * 1e9, l->secs[passes / 2] / (double)l->ops * 1e9,
           ratio[passes / 2], ratio[passes / 4], ratio[3 * passes / 4]);
  }
  return 0;
}
