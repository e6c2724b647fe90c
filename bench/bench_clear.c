/*
 * bench_clear: what an LMDB clear costs (lmdb_write.c). Usage: bench_clear DIR [OPS [BUCKETS]]
 *
 * Writes a stream of OPS ops (1,000,000 by default; one PUT a row, BUCKETS buckets, 1,000 by
 * default) into a new DIR/clear.mdb (without fsync; removed at the end), closes it, then opens it
 * durable and reports:
 *  - read: the mean CPU time of 100,000 bs_get_checksums calls of one bucket (the fence check
 *    every read now makes);
 *  - visible: from bs_clear's start until the clear is what readers see (the fence's commit,
 *    the seam's first call; before the fence, the row's reset at the end: the whole clear);
 *  - clear: bs_clear's whole time (the fence and the deletion's durable transactions);
 *  - first read: the first bs_get_checksums after bs_clear returned.
 * Build: make build/bench/bench_clear. Built with -DBENCH_CLEAR_NO_SEAM against a tree without
 * the fence (bench_clear.c copied into it), it measures that tree ("visible" is then the clear).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lmdb_internal.h"

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double now_s(void) {
  return clock_s(CLOCK_MONOTONIC);
}

/* CPU time: what the reads cost, less what a loaded machine makes them wait */
static double cpu_s(void) {
  return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static void ok(int rc, const char *what, const bs_error *err) {
  if (rc == BS_OK) return;
  fprintf(stderr, "bench_clear: %s: %s\n", what, err->msg);
  exit(1);
}

static bs_val str(const char *s) {
  return (bs_val){s, strlen(s)};
}

/* The file and its lock file, so that every run starts from a new file and leaves none. */
static void remove_file(const char *path) {
  char lock[4200];
  snprintf(lock, sizeof lock, "%s-lock", path);
  (void)unlink(path);
  (void)unlink(lock);
}

static double t_start, t_visible;
#ifndef BENCH_CLEAR_NO_SEAM
static int on_batch(unsigned n) {
  if (n == 0) t_visible = now_s();
  return BS_OK;
}
#endif

static void ingest(const char *path, unsigned long ops, unsigned buckets) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_commit_result cr;
  bs_storage *st;
  bs_writer *w;
  bs_db *db;
  uint32_t id;
  char rid[24], bucket[16], lsn[16];
  o.flags = BS_OPEN_NOSYNC;
  ok(bs_open(&db, path, &o, &err), "open", &err);
  ok(bs_stream_create(&id, db, "s", NULL, &err), "stream", &err);
  ok(bs_storage_open(&st, db, id, &err), "storage", &err);
  ok(bs_writer_open(&w, st, NULL, &err), "writer", &err);
  ok(bs_writer_snapshot_done(w, str("00000000"), &err), "snapshot_done", &err);
  for (unsigned long i = 0; i < ops; i++) {
    bs_save s = BS_SAVE_INIT;
    bs_row row;
    snprintf(rid, sizeof rid, "r%lu", i);
    snprintf(bucket, sizeof bucket, "b%lu", i % buckets);
    row.bucket = str(bucket);
    row.object_type = str("todo");
    row.object_id = str(rid);
    row.data = str("{\"description\":\"a row of the benchmark\",\"done\":false}");
    s.tag = BS_INSERT;
    s.table = str("todos");
    s.after_id = str(rid);
    s.rows = &row;
    s.n_rows = 1;
    ok(bs_writer_save(w, &s, &err), "save", &err);
    if (i % 100000 == 99999 || i + 1 == ops) {
      snprintf(lsn, sizeof lsn, "%08lu", i / 100000 + 1);
      ok(bs_writer_commit(&cr, w, str(lsn), NULL, &err), "commit", &err);
    }
  }
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

int main(int argc, char **argv) {
  unsigned long ops = argc > 2 ? strtoul(argv[2], NULL, 10) : 1000000ul;
  unsigned buckets = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 1000u;
  bs_error err = {0};
  bs_checksum c;
  bs_storage *st;
  bs_db *db;
  char path[4096];
  bs_val b0 = str("b0");
  double t0, t_read, t_clear, t_first;
  const int reads = 100000;
  if (argc < 2 || !ops || !buckets) {
    fprintf(stderr, "usage: bench_clear DIR [OPS [BUCKETS]]\n");
    return 2;
  }
  snprintf(path, sizeof path, "%s/clear.mdb", argv[1]);
  remove_file(path);
  ingest(path, ops, buckets);
  ok(bs_open(&db, path, NULL, &err), "open", &err);
  ok(bs_storage_open(&st, db, 0, &err), "storage", &err);
  t0 = cpu_s();
  for (int i = 0; i < reads; i++)
    ok(bs_get_checksums(&c, st, UINT64_MAX >> 1, &b0, 1, &err), "checksums", &err);
  t_read = (cpu_s() - t0) / reads;
  if (c.count != (ops + buckets - 1) / buckets) return fprintf(stderr, "wrong count\n"), 1;
#ifndef BENCH_CLEAR_NO_SEAM
  bs__lmdb_set_clear_seam(&(bs__lmdb_clear_seam){0, on_batch});
#endif
  t_visible = 0;
  t_start = now_s();
  ok(bs_clear(st, &err), "clear", &err);
  t_clear = now_s() - t_start;
  if (!t_visible) t_visible = now_s();
  t0 = now_s();
  ok(bs_get_checksums(&c, st, UINT64_MAX >> 1, &b0, 1, &err), "checksums", &err);
  t_first = now_s() - t0;
  if (c.count) return fprintf(stderr, "cleared, yet ops are read\n"), 1;
  printf("bench_clear: %lu ops in %u buckets: read %.0f ns, visible after %.3f s, clear %.3f s, "
         "first read after it %.1f us\n",
         ops, buckets, t_read * 1e9, t_visible - t_start, t_clear, t_first * 1e6);
  bs_storage_close(st);
  bs_close(db);
  remove_file(path);
  return 0;
}
