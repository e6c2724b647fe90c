/*
 * capi.c: the C-API side of bench/bench_node.mjs. It runs the benchmark's workload straight on
 * storage.h, so that the binding and the JSON driver are measured against the same work:
 *   capi ingest DB ROWS BUCKETS COMMIT_ROWS DATA_SIZE NOSYNC   snapshot ingest, one commit per
 *                                                             COMMIT_ROWS rows
 *   capi read DB BUCKETS READ_LIMIT [PASSES]                  every bucket downloaded from 0,
 *                                                             PASSES times (1 if left out)
 * and prints one JSON line {"secs":..., "cpu":..., "count":...} (cpu: this process's CPU seconds;
 * reads add "sink", the sum on_chunk computes over every pass, and "pass", each pass's seconds).
 * Passes repeat in one process, as the binding's do in one node process, so that a measurement
 * lasts long enough to be steady (one pass of 200k ops is about 13 ms). Rows are those of bench_node.mjs's row():
 * replica id "r%08u", bucket by_list["l%05u"] (row % BUCKETS), object type "todos", data the
 * JSON of {"id","v":0,"done":false,"d":<letters>} padded to DATA_SIZE bytes.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "storage.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds of this process (user + system). */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static size_t gen_data(char *out, size_t size, unsigned row) {
  static const char fill[] = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";
  int n = snprintf(out, size, "{\"id\":\"r%08u\",\"v\":0,\"done\":false,\"d\":\"", row);
  size_t p = (size_t)n, off = row % 26;
  for (; p < size - 2; p++) out[p] = fill[off + (p - (size_t)n) % 26];
  out[size - 2] = '"', out[size - 1] = '}';
  return size;
}

static int fail(int rc, const bs_error *err) {
  fprintf(stderr, "capi: %s (%s)\n", bs_strerror(rc), err->msg);
  return 1;
}

typedef struct dl {
  unsigned long long ops, sink;
  uint64_t next_after;
} dl;

/* Each op read as a client reads it: its op id, type, object id and data (their lengths summed
 * into sink, which bench_node.mjs checks against the binding's). */
static int on_chunk(const bs_chunk *c, void *payload) {
  dl *d = payload;
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *o = &c->ops[i];
    d->sink += (o->op_id & 1) + (o->type == BS_OP_PUT) + o->object_id.size + o->data.size;
  }
  d->ops += c->n_ops;
  d->next_after = c->next_after;
  return 0;
}

#define TRY(call)                                                                                  \
  if ((rc = (call)) != BS_OK) return fail(rc, &err)

int main(int argc, char **argv) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0};
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  int rc;
  double t0, c0 = cpu_s();
  if (argc == 8 && !strcmp(argv[1], "ingest")) {
    unsigned rows = (unsigned)atol(argv[3]), nb = (unsigned)atol(argv[4]);
    unsigned every = (unsigned)atol(argv[5]);
    size_t size = (size_t)atol(argv[6]);
    bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
    static char data[1 << 16];
    char rid[16], bucket[32];
    if (size < 64 || size > sizeof data) return 2;
    oo.flags = atoi(argv[7]) ? BS_OPEN_NOSYNC : 0;
    wo.snapshot = 1;
    TRY(bs_open(&db, argv[2], &oo, &err));
    TRY(bs_stream_create(NULL, db, "bench", NULL, &err));
    TRY(bs_storage_open(&st, db, 0, &err));
    TRY(bs_writer_open(&w, st, &wo, &err));
    t0 = now_s();
    for (unsigned i = 0; i < rows; i++) {
      bs_row row;
      bs_save s = BS_SAVE_INIT;
      snprintf(rid, sizeof rid, "r%08u", i);
      snprintf(bucket, sizeof bucket, "by_list[\"l%05u\"]", i % nb);
      row.bucket = (bs_val){bucket, strlen(bucket)};
      row.object_type = (bs_val){"todos", 5};
      row.object_id = (bs_val){rid, strlen(rid)};
      row.data = (bs_val){data, gen_data(data, size, i)};
      s.table = (bs_val){"todos", 5}, s.tag = BS_INSERT, s.after_id = row.object_id;
      s.rows = &row, s.n_rows = 1;
      TRY(bs_writer_save(w, &s, &err));
      if ((i + 1) % every == 0 || i + 1 == rows) {
        char lsn[16];
        snprintf(lsn, sizeof lsn, "%08u", i + 1);
        if (i + 1 == rows) TRY(bs_writer_snapshot_done(w, (bs_val){lsn, strlen(lsn)}, &err));
        TRY(bs_writer_commit(NULL, w, (bs_val){lsn, strlen(lsn)}, NULL, &err));
      }
    }
    printf("{\"secs\":%.6f,\"cpu\":%.6f,\"count\":%u}\n", now_s() - t0, cpu_s() - c0, rows);
  } else if ((argc == 5 || argc == 6) && !strcmp(argv[1], "read")) {
    unsigned nb = (unsigned)atol(argv[3]), passes = argc == 6 ? (unsigned)atol(argv[5]) : 1;
    dl d = {0, 0, 0};
    double pass[64];
    if (passes < 1 || passes > sizeof pass / sizeof *pass) return 2;
    bs_checkpoint cp;
    bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
    bo.limit = (size_t)atol(argv[4]);
    TRY(bs_open(&db, argv[2], NULL, &err));
    TRY(bs_storage_open(&st, db, 0, &err));
    TRY(bs_get_checkpoint(&cp, st, &err));
    t0 = now_s(), c0 = cpu_s();
    for (unsigned p = 0; p < passes; p++) {
      double p0 = now_s();
      for (unsigned b = 0; b < nb; b++) {
        char bucket[32];
        bs_bucket_request req;
        int more = 1;
        snprintf(bucket, sizeof bucket, "by_list[\"l%05u\"]", b);
        req.bucket = (bs_val){bucket, strlen(bucket)}, req.after = 0;
        while (more) { /* one bucket per call, as a client resuming at next_after */
          TRY(bs_get_bucket_data(&more, st, cp.op_id, &req, 1, &bo, on_chunk, &d, &err));
          req.after = d.next_after;
        }
      }
      pass[p] = now_s() - p0;
    }
    printf("{\"secs\":%.6f,\"cpu\":%.6f,\"count\":%llu,\"sink\":%llu,\"pass\":[", now_s() - t0,
           cpu_s() - c0, d.ops, d.sink);
    for (unsigned p = 0; p < passes; p++) printf("%s%.6f", p ? "," : "", pass[p]);
    printf("]}\n");
  } else {
    fprintf(stderr, "usage: capi ingest DB ROWS BUCKETS COMMIT_ROWS DATA_SIZE NOSYNC\n"
                    "       capi read DB BUCKETS READ_LIMIT [PASSES]\n");
    return 2;
  }
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return 0;
}
