/*
 * bench_pg.c: the PostgreSQL workloads (bsbench --pg URL|start). Each runs
 * through bucketstore's public API on a postgresql:// database and, on the same server in the
 * same run, as the minimal SQL for the same work through raw libpq (the baseline):
 *
 *   ingest     the sync service's orientation workload: 100k inserts (--pg-rows), then half as
 *              many random updates of those rows, all into one bucket, a streaming writer
 *              committing (with a checkpoint) every 1k rows; plus bytes per op
 *              (pg_total_relation_size of every table of the schema / ops) and the same ingest
 *              on the LMDB backend for its bytes per op
 *   reads      the whole bucket downloaded from 0 in calls of --read-limit ops, twice
 *   checksums  cold (checksum cache off) checksums of the big bucket and of a bucket 100x
 *              smaller, at the latest checkpoint: flat in bucket size means equal costs
 *   compact    full compaction of the stream, and of the same ingest on the LMDB backend
 *              (memory_limit_mb: --compact-memory-mb)
 *   changes    checkpoint changes on a large bs_changes: a stream of 300k checkpoints
 *              (--pg-changes) of two ops and one bucket each, a reader 5 checkpoints behind its
 *              head; the records are written by SQL (through the library they would take the
 *              whole run), in a stream of their own, and ANALYZEd
 *
 * The raw baseline's schema is what this work needs and no more: ops keyed (bucket, op_id),
 * source records keyed by replica id (bucket, op and data), one state row per bucket (running
 * checksum and count), one stream row (op head, checkpoint, LSN). A commit of 1k rows reads the
 * rows' previous records (the old op is what the new one supersedes), COPYs the ops, upserts
 * the records and updates the bucket and the stream rows: one transaction, six round trips.
 *
 * Both schemas are VACUUM ANALYZEd after the ingest, before their sizes are taken (the raw one
 * would otherwise be read with the plans of tables without statistics; the library's writer
 * analyzes its tables itself). Each database gets a schema of its own (bsbench_<pid>_bs,
 * bsbench_<pid>_raw), dropped at the end unless --keep.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef BS_HAVE_PG

int pg_prepare(void) {
  fprintf(stderr, "bsbench: built without the PostgreSQL backend (make PG=1 with libpq-dev)\n");
  return -1;
}
void pg_cleanup(void) {}
int pg_bs_ingest(int lmdb) {
  (void)lmdb;
  return -1;
}
int pg_raw_ingest(int a) {
  (void)a;
  return -1;
}
int pg_bs_reads(int a) {
  (void)a;
  return -1;
}
int pg_raw_reads(int a) {
  (void)a;
  return -1;
}
int pg_bs_checksums(int a) {
  (void)a;
  return -1;
}
int pg_raw_checksums(int a) {
  (void)a;
  return -1;
}
int pg_bs_compact(int a) {
  (void)a;
  return -1;
}
int pg_bs_changes(int a) {
  (void)a;
  return -1;
}
int pg_raw_changes(int a) {
  (void)a;
  return -1;
}

#else

#include "pg_internal.h" /* bs__pg_conn_get: the plans of the library's own sessions */
#include "pgq.h"

#define BIG_BUCKET 0u
#define SMALL      1u /* bucket index of the small bucket */

static char url_bs[1024], url_raw[1024], schema_bs[64], schema_raw[64];

/* ---- Shared helpers ---- */

void schema_url(char *out, size_t cap, const char *schema) {
  const char *u = g_cfg->pg_url;
  snprintf(out, cap, "%s%coptions=-csearch_path%%3D%s", u, strchr(u, '?') ? '&' : '?', schema);
}

static void names_init(void) {
  snprintf(schema_bs, sizeof schema_bs, "bsbench_%ld_bs", (long)g_cfg->pg_tag);
  snprintf(schema_raw, sizeof schema_raw, "bsbench_%ld_raw", (long)g_cfg->pg_tag);
  schema_url(url_bs, sizeof url_bs, schema_bs);
  schema_url(url_raw, sizeof url_raw, schema_raw);
}

int pq_fail(bres *r, PGconn *c, PGresult *res, const char *what) {
  r->status = BR_FAILED;
  snprintf(r->note, sizeof r->note, "%s: %s", what,
           res && PQresultErrorMessage(res)[0] ? PQresultErrorMessage(res) : PQerrorMessage(c));
  if (res) PQclear(res);
  return -1;
}

int pq_run(bres *r, PGconn *c, const char *sql) {
  PGresult *res = PQexec(c, sql);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) return pq_fail(r, c, res, sql);
  PQclear(res);
  return 0;
}

PGconn *pq_connect(bres *r, const char *url) {
  PGconn *c = PQconnectdb(url);
  if (PQstatus(c) != CONNECTION_OK) {
    pq_fail(r, c, NULL, "connect");
    PQfinish(c);
    return NULL;
  }
  return c;
}

double schema_bytes(PGconn *c) {
  PGresult *res = PQexec(c, "SELECT sum(pg_total_relation_size(c.oid))::float8 FROM pg_class c"
                            " JOIN pg_namespace n ON n.oid = c.relnamespace"
                            " WHERE n.nspname = current_schema() AND c.relkind = 'r'");
  double v = -1;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    v = strtod(PQgetvalue(res, 0, 0), NULL);
  PQclear(res);
  return v;
}

/* Appends to note where the bytes of the connection's schema are, per table (pg_total_relation_size:
 * heap, indexes, TOAST) over ops: the tables of at least 1 byte per op, the others summed. */
static void table_bytes(PGconn *c, double ops, char *note, size_t cap) {
  PGresult *res =
      PQexec(c, "SELECT c.relname, pg_total_relation_size(c.oid)::float8 FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY 2 DESC");
  size_t at = strlen(note);
  double rest = 0;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && ops > 0) {
    at += (size_t)snprintf(note + at, at < cap ? cap - at : 0, "; bytes/op by table:");
    for (int i = 0; i < PQntuples(res); i++) {
      double b = strtod(PQgetvalue(res, i, 1), NULL) / ops;
      if (b < 1) {
        rest += b;
        continue;
      }
      if (at < cap)
        at += (size_t)snprintf(note + at, cap - at, " %s %.0f", PQgetvalue(res, i, 0), b);
    }
    if (at < cap) snprintf(note + at, cap - at, ", the other tables %.0f", rest);
  }
  PQclear(res);
}

/* CPU seconds (user + system) of this process so far */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void set_lat(bres *r, double *lat, size_t n) {
  r->p50_us = pct(lat, n, 0.50) * 1e6;
  r->p99_us = pct(lat, n, 0.99) * 1e6;
}

/* The workload: step k < rows inserts row k, then updates[k - rows] a random earlier row. */
static uint64_t ingest_rows(void) {
  return g_cfg->pg_rows;
}
static uint64_t ingest_updates(void) {
  return ingest_rows() / 2;
}
static uint64_t small_rows(void) {
  return ingest_rows() / 100 + ingest_updates() / 100;
}
static uint64_t step_row(uint64_t k, uint64_t *version) {
  uint64_t s;
  if (k < ingest_rows()) {
    *version = 0;
    return k;
  }
  s = g_cfg->seed ^ (k * 0x2545f4914f6cdd1dull);
  *version = k;
  return rng_next(&s) % ingest_rows();
}

int pg_prepare(void) {
  bres scratch;
  PGconn *c;
  char sql[512];
  int rc;
  memset(&scratch, 0, sizeof scratch);
  names_init();
  if (!(c = pq_connect(&scratch, g_cfg->pg_url))) {
    fprintf(stderr, "bsbench: %s: %s\n", g_cfg->pg_url, scratch.note);
    return -1;
  }
  snprintf(sql, sizeof sql,
           "DROP SCHEMA IF EXISTS %s CASCADE; DROP SCHEMA IF EXISTS %s CASCADE;"
           " CREATE SCHEMA %s; CREATE SCHEMA %s",
           schema_bs, schema_raw, schema_bs, schema_raw);
  rc = pq_run(&scratch, c, sql);
  if (rc) fprintf(stderr, "bsbench: %s\n", scratch.note);
  PQfinish(c);
  return rc;
}

void pg_cleanup(void) {
  bres scratch;
  PGconn *c;
  char sql[512];
  memset(&scratch, 0, sizeof scratch);
  names_init();
  if (!(c = pq_connect(&scratch, g_cfg->pg_url))) return;
  snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE; DROP SCHEMA IF EXISTS %s CASCADE",
           schema_bs, schema_raw);
  pq_run(&scratch, c, sql);
  PQfinish(c);
}

/* ---- Through bucketstore ---- */

typedef struct bsh {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
} bsh;

static void h_close(bsh *h) {
  if (h->w) bs_writer_close(h->w);
  if (h->st) bs_storage_close(h->st);
  if (h->db) bs_close(h->db);
  memset(h, 0, sizeof *h);
}

/* lmdb: a file of the run's directory (created fresh) instead of the PostgreSQL schema. */
static int h_open(bsh *h, int lmdb, int create, size_t cache, bres *r) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err;
  uint32_t sid = 1;
  char path[600];
  int rc;
  memset(h, 0, sizeof *h);
  if (lmdb) {
    bench_path(path, sizeof path, "pg_same.bs");
    if (create) unlink(path);
    o.flags = BS_OPEN_NOSYNC; /* the test server runs with fsync off */
  }
  o.checksum_cache_entries = cache;
  if ((rc = bs_open(&h->db, lmdb ? path : url_bs, &o, &err)) != BS_OK) {
    res_fail(r, rc, "bs_open", &err);
    return rc;
  }
  if (create && (rc = bs_stream_create(&sid, h->db, "bench", NULL, &err)) != BS_OK) {
    res_fail(r, rc, "bs_stream_create", &err);
    return rc;
  }
  if ((rc = bs_storage_open(&h->st, h->db, sid, &err)) != BS_OK)
    res_fail(r, rc, "bs_storage_open", &err);
  return rc;
}

static int h_commit(bsh *h, uint64_t n, uint64_t *cp, bres *r) {
  char lsn[17];
  bs_val l = {lsn, 16};
  bs_commit_result cr;
  bs_error err;
  int rc;
  gen_lsn(lsn, n);
  if ((rc = bs_writer_commit(&cr, h->w, l, NULL, &err)) != BS_OK) {
    res_fail(r, rc, "bs_writer_commit", &err);
    return rc;
  }
  if (!cr.checkpoint_created) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "commit made no checkpoint (blocked %d)", cr.blocked_reason);
    return -1;
  }
  if (cp) *cp = cr.checkpoint;
  return 0;
}

static int save_row(bs_writer *w, uint64_t row, unsigned bucket, uint64_t version, bres *r) {
  bs_error err;
  int rc = save_generated(w, version ? BS_UPDATE : BS_INSERT, row, bucket, version, &err);
  if (rc != BS_OK) res_fail(r, rc, "bs_writer_save", &err);
  return rc;
}

/* Rows [from, to) of the workload into bucket b, a commit every commit_changes. */
static int bs_steps(bsh *h, uint64_t from, uint64_t to, unsigned b, uint64_t row_base, double *lat,
                    size_t *nl, bres *r) {
  uint64_t every = g_cfg->commit_changes, lsn_base = row_base ? 2 * ingest_rows() : 0;
  for (uint64_t k = from; k < to; k++) {
    uint64_t v, row = step_row(k, &v) + row_base;
    if (save_row(h->w, row, b, v, r)) return -1;
    if ((k + 1 - from) % every == 0 || k + 1 == to) {
      double t = now_s();
      if (h_commit(h, 16 + lsn_base + k, NULL, r)) return -1;
      if (lat) lat[(*nl)++] = now_s() - t;
    }
  }
  return 0;
}

static int h_writer(bsh *h, bres *r) {
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_val lsn = {"0000000000000001", 16};
  bs_error err;
  int rc;
  if ((rc = bs_writer_open(&h->w, h->st, &wo, &err)) != BS_OK) {
    res_fail(r, rc, "bs_writer_open", &err);
    return rc;
  }
  if ((rc = bs_writer_snapshot_done(h->w, lsn, &err)) != BS_OK)
    res_fail(r, rc, "bs_writer_snapshot_done", &err);
  return rc;
}

/* The ingest (lmdb: the same on the LMDB backend, reported as one note row), then the small
 * bucket the checksum workload compares with (not timed). */
int pg_bs_ingest(int lmdb) {
  uint64_t n = ingest_rows(), m = ingest_updates();
  double *lat = calloc((n + m) / g_cfg->commit_changes + 4, sizeof *lat), t0, t1, t2, c0;
  size_t nl = 0;
  char name[72];
  bres *ri, *ru, *rt, loc[3];
  bsh h;
  bs_stat s;
  bs_error err;
  names_init();
  snprintf(name, sizeof name, "%lluk inserts, 1 bucket, commit/%llu", (unsigned long long)n / 1000,
           (unsigned long long)g_cfg->commit_changes);
  if (lmdb) { /* reported as one line of context below, not as rows of the table */
    memset(loc, 0, sizeof loc);
    ri = &loc[0], ru = &loc[1], rt = &loc[2];
  } else {
    ri = res_new("ingest", name, "bs");
    snprintf(name, sizeof name, "  then %lluk random updates", (unsigned long long)m / 1000);
    ru = res_new("ingest", name, "bs");
    rt = res_new("ingest", "  all ops (bytes/op: every table)", "bs");
  }
  snprintf(ri->unit, sizeof ri->unit, "ops/s");
  snprintf(ru->unit, sizeof ru->unit, "ops/s");
  snprintf(rt->unit, sizeof rt->unit, "ops/s");
  if (h_open(&h, lmdb, 1, 0, rt) || h_writer(&h, rt)) goto out;
  mem_sampler_start();
  c0 = cpu_s();
  t0 = now_s();
  if (bs_steps(&h, 0, n, BIG_BUCKET, 0, lat, &nl, rt)) goto out;
  t1 = now_s();
  if (bs_steps(&h, n, n + m, BIG_BUCKET, 0, lat, &nl, rt)) goto out;
  t2 = now_s();
  mem_sampler_stop();
  ri->count = (double)n, ri->secs = t1 - t0, ri->value = ri->count / ri->secs;
  ru->count = (double)m, ru->secs = t2 - t1, ru->value = ru->count / ru->secs;
  rt->count = (double)(n + m), rt->secs = t2 - t0, rt->value = rt->count / rt->secs;
  set_lat(rt, lat, nl);
  snprintf(rt->note, sizeof rt->note,
           "latency = one commit of %llu rows (flush + checkpoint); client CPU %.1f us/op",
           (unsigned long long)g_cfg->commit_changes, (cpu_s() - c0) / rt->count * 1e6);
  res_mem(rt);
  if (bs_db_stat(&s, h.db, &err) == BS_OK) {
    double ops = (double)(s.ops_put + s.ops_remove + s.ops_move + s.ops_clear), bytes = -1;
    if (lmdb) {
      char path[600];
      bench_path(path, sizeof path, "pg_same.bs");
      bytes = file_bytes(path);
    } else {
      bres scratch;
      PGconn *c = pq_connect(&scratch, url_bs);
      if (c) {
        pq_run(&scratch, c, "VACUUM (ANALYZE)");
        bytes = schema_bytes(c);
        table_bytes(c, ops, rt->note, sizeof rt->note);
        PQfinish(c);
      }
    }
    if (ops > 0 && bytes > 0) rt->bytes_per_op = bytes / ops;
  }
  if (lmdb) {
    bres *l = res_new("ingest", "  the same on the LMDB backend (nosync)", "note");
    snprintf(l->note, sizeof l->note,
             "%.0fk ops/s (inserts %.0fk, updates %.0fk), %.0f bytes/op (file size / ops)",
             rt->value / 1e3, ri->value / 1e3, ru->value / 1e3, rt->bytes_per_op);
    g_sh->lmdb_bytes_per_op = rt->bytes_per_op;
    goto out;
  }
  /* the small bucket: rows after the big bucket's, inserted then updated in the same shape */
  nl = 0;
  if (bs_steps(&h, 0, small_rows() * 2 / 3, SMALL, n, NULL, NULL, rt) ||
      bs_steps(&h, small_rows() * 2 / 3, small_rows(), SMALL, n, NULL, NULL, rt))
    goto out;
out:
  if (lmdb && rt->status != BR_OK) {
    bres *l = res_new("ingest", "  the same on the LMDB backend (nosync)", "note");
    snprintf(l->note, sizeof l->note, "FAILED: %.300s", rt->note);
  }
  h_close(&h);
  free(lat);
  return rt->status == BR_FAILED;
}

typedef struct dl {
  uint64_t ops, bytes, next_after, sum;
} dl;

static int on_chunk(const bs_chunk *ch, void *payload) {
  dl *d = payload;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    d->bytes += o->data.size + o->object_type.size + o->object_id.size + o->subkey.size;
    d->sum += o->checksum;
  }
  d->ops += ch->n_ops;
  d->next_after = ch->next_after;
  return 0;
}

int pg_bs_reads(int a) {
  bres *r[2];
  bsh h;
  bs_error err;
  bs_status stt;
  int rc;
  (void)a;
  names_init();
  r[0] = res_new("reads", "whole bucket from 0, first pass", "bs");
  r[1] = res_new("reads", "whole bucket from 0, second pass", "bs");
  for (int p = 0; p < 2; p++) snprintf(r[p]->unit, sizeof r[p]->unit, "ops/s");
  if (h_open(&h, 0, 0, 0, r[0])) goto out;
  if ((rc = bs_get_status(&stt, h.st, &err)) != BS_OK) {
    res_fail(r[0], rc, "bs_get_status", &err);
    goto out;
  }
  for (int p = 0; p < 2; p++) {
    char bname[64];
    size_t blen;
    bs_bucket_request req;
    bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
    dl d = {0, 0, 0, 0};
    double t0 = now_s(), *lat = calloc(1024, sizeof *lat);
    size_t nl = 0;
    int more = 1;
    gen_bucket(bname, sizeof bname, &blen, BIG_BUCKET);
    req.bucket.data = bname;
    req.bucket.size = blen;
    req.after = 0;
    bo.limit = g_cfg->read_limit;
    mem_sampler_start();
    while (more) {
      double tc = now_s();
      d.next_after = req.after;
      if ((rc = bs_get_bucket_data(&more, h.st, stt.checkpoint, &req, 1, &bo, on_chunk, &d,
                                   &err)) != BS_OK) {
        res_fail(r[p], rc, "bs_get_bucket_data", &err);
        break;
      }
      if (nl < 1024) lat[nl++] = now_s() - tc;
      req.after = d.next_after;
    }
    mem_sampler_stop();
    if (r[p]->status == BR_OK) {
      r[p]->secs = now_s() - t0;
      r[p]->count = (double)d.ops;
      r[p]->value = (double)d.ops / r[p]->secs;
      r[p]->mbps = (double)d.bytes / r[p]->secs / 1e6;
      set_lat(r[p], lat, nl);
      res_mem(r[p]);
      snprintf(r[p]->note, sizeof r[p]->note, "%llu ops in calls of %llu; latency = one call",
               (unsigned long long)d.ops, (unsigned long long)g_cfg->read_limit);
      g_sh->pg_read_sum[0] = d.sum + d.ops;
    }
    free(lat);
  }
out:
  h_close(&h);
  return r[0]->status == BR_FAILED;
}

/* Cold checksums of one bucket (big or small) at the latest checkpoint, one bucket per call. */
static int ck_calls(void) {
  return g_cfg->quick ? 200 : 2000;
}

/* The plans of c's session, for the checksum rows' cross-check (raw: 0 bucketstore's, 1 raw
 * libpq's): its plan_cache_mode and the custom plans its prepared statements made. */
static int record_plans(bres *r, PGconn *c, int raw) {
  PGresult *res = PQexec(c, "SELECT current_setting('plan_cache_mode'),"
                            " coalesce(sum(custom_plans), 0) FROM pg_prepared_statements");
  const char *m;
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
    return pq_fail(r, c, res, "plans");
  m = PQgetvalue(res, 0, 0);
  g_sh->pg_plan_mode[raw] = !strcmp(m, "force_generic_plan")  ? 1
                            : !strcmp(m, "force_custom_plan") ? 2
                            : !strcmp(m, "auto")              ? 3
                                                              : 4;
  g_sh->pg_custom_plans[raw] = strtoull(PQgetvalue(res, 0, 1), NULL, 10);
  PQclear(res);
  return 0;
}

int pg_bs_checksums(int a) {
  bres *r[2];
  bsh h;
  bs_error err;
  bs_status stt;
  int rc;
  (void)a;
  names_init();
  for (int big = 1; big >= 0; big--) {
    char name[72];
    snprintf(name, sizeof name, "cold, %llu-op bucket, latest",
             (unsigned long long)(big ? ingest_rows() + ingest_updates() : small_rows()));
    r[big] = res_new("checksums", name, "bs");
    snprintf(r[big]->unit, sizeof r[big]->unit, "us/bucket");
    r[big]->lower_better = 1;
  }
  if (h_open(&h, 0, 0, (size_t)-1, r[1])) goto out;
  if ((rc = bs_get_status(&stt, h.st, &err)) != BS_OK) {
    res_fail(r[1], rc, "bs_get_status", &err);
    goto out;
  }
  for (int big = 1; big >= 0; big--) {
    char bname[64];
    size_t blen;
    bs_val bv;
    bs_checksum ck;
    double t0, *lat = calloc((size_t)ck_calls(), sizeof *lat);
    gen_bucket(bname, sizeof bname, &blen, big ? BIG_BUCKET : SMALL);
    bv.data = bname;
    bv.size = blen;
    t0 = now_s();
    for (int i = 0; i < ck_calls(); i++) {
      double tc = now_s();
      if ((rc = bs_get_checksums(&ck, h.st, stt.checkpoint, &bv, 1, &err)) != BS_OK) {
        res_fail(r[big], rc, "bs_get_checksums", &err);
        break;
      }
      lat[i] = now_s() - tc;
    }
    if (r[big]->status == BR_OK) {
      r[big]->secs = now_s() - t0;
      r[big]->count = ck_calls();
      r[big]->value = r[big]->secs / r[big]->count * 1e6;
      set_lat(r[big], lat, (size_t)ck_calls());
      res_mem(r[big]);
      snprintf(r[big]->note, sizeof r[big]->note,
               "checksum cache off; checksum %u count %llu; latency = one call", ck.checksum,
               (unsigned long long)ck.count);
      g_sh->pg_ck_sum[0][big] = ck.checksum + ck.count;
    }
    free(lat);
  }
  { /* a session of the library's pool, the one the calls above used */
    PGconn *c;
    if ((rc = bs__pg_conn_get((bs__pg_db *)h.db, &c, &err)) != BS_OK) {
      res_fail(r[1], rc, "a pool session", &err);
      goto out;
    }
    record_plans(r[1], c, 0);
    bs__pg_conn_put((bs__pg_db *)h.db, c);
  }
out:
  h_close(&h);
  return r[1]->status == BR_FAILED;
}

/* Full compaction of the ingested stream, on PostgreSQL (lmdb = 0) or on the LMDB backend's
 * copy of the same ingest (lmdb = 1, a note row: that copy has no small bucket). */
int pg_bs_compact(int lmdb) {
  bres *r = lmdb ? res_new("compact", "  the same on the LMDB backend (nosync)", "note")
                 : res_new("compact", "full, 1 bucket, 1/3 superseded", "bs");
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs;
  bs_error err;
  bsh h;
  double t0;
  int rc;
  names_init();
  co.memory_limit_mb = g_cfg->compact_memory_mb;
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (h_open(&h, lmdb, 0, 0, r)) goto out;
  memset(&cs, 0, sizeof cs);
  mem_sampler_start();
  t0 = now_s();
  rc = bs_compact(&cs, h.st, &co, &err);
  mem_sampler_stop();
  if (rc != BS_OK) {
    res_fail(r, rc, "bs_compact", &err);
    goto out;
  }
  r->secs = now_s() - t0;
  r->count = (double)(ingest_rows() + ingest_updates() + (lmdb ? 0 : small_rows()));
  r->value = r->count / r->secs;
  res_mem(r);
  /* the rate leads: a note row prints only its note */
  snprintf(r->note, sizeof r->note,
           "%.0fk ops/s, %.2f s for the stream's %.0f ops (%llu moved, %llu cleared);"
           " anon peak %.1f MB, memory_limit_mb %zu (0: the library's default)",
           r->value / 1e3, r->secs, r->count, (unsigned long long)cs.ops_moved,
           (unsigned long long)cs.ops_cleared, r->anon_peak_mb, co.memory_limit_mb);
out:
  h_close(&h);
  return r->status == BR_FAILED;
}

/* ---- Checkpoint changes on a large bs_changes ---- */

#define CHANGES_BEHIND 5 /* checkpoints the reader is behind the head */

static int changes_calls(void) {
  return g_cfg->quick ? 200 : 2000;
}

/* The case's name and the SQL expression of record g's one bucket (b0 .. b999). */
static void changes_name(char *out, size_t cap) {
  snprintf(out, cap, "%lluk checkpoints, reader %d behind",
           (unsigned long long)g_cfg->pg_changes / 1000, CHANGES_BEHIND);
}
#define CHANGE_BUCKET  "ARRAY[convert_to('b' || g %% 1000, 'UTF8')]" /* in a format */

static void changes_done(bres *r, double t0, double *lat, size_t n, const char *what) {
  r->secs = now_s() - t0;
  r->count = (double)changes_calls();
  r->value = r->secs / r->count * 1e6;
  set_lat(r, lat, (size_t)changes_calls());
  res_mem(r);
  snprintf(r->note, sizeof r->note, "%zu buckets a call; %s", n, what);
}

static int count_changes(const bs_checkpoint_changes *ch, void *payload) {
  *(size_t *)payload = ch->invalidate_data_buckets ? (size_t)-1 : ch->n_updated_buckets;
  return 0;
}

int pg_bs_changes(int a) {
  char name[72], sql[1024];
  uint64_t head = 2 * g_cfg->pg_changes;
  double t0, *lat = calloc((size_t)changes_calls(), sizeof *lat);
  size_t n = 0;
  uint32_t sid;
  bres *r, scratch;
  bsh h;
  bs_error err;
  PGconn *c = NULL;
  int rc;
  (void)a;
  names_init();
  changes_name(name, sizeof name);
  r = res_new("changes", name, "bs");
  snprintf(r->unit, sizeof r->unit, "us/call");
  r->lower_better = 1;
  memset(&h, 0, sizeof h);
  memset(&scratch, 0, sizeof scratch);
  if ((rc = bs_open(&h.db, url_bs, NULL, &err)) != BS_OK) {
    res_fail(r, rc, "bs_open", &err);
    goto out;
  }
  if ((rc = bs_stream_create(&sid, h.db, "changes", NULL, &err)) != BS_OK ||
      (rc = bs_storage_open(&h.st, h.db, sid, &err)) != BS_OK) {
    res_fail(r, rc, "a stream", &err);
    goto out;
  }
  snprintf(sql, sizeof sql,
           "INSERT INTO bs_changes (stream, op_id, seq, first_op, flags, buckets, time_ms)"
           " SELECT %u, 2 * g, 1, 2 * g - 1, 1, " CHANGE_BUCKET ", 0"
           " FROM generate_series(1, %llu) g;"
           "UPDATE bs_streams SET op_head = %llu, checkpoint = %llu,"
           " last_checkpoint_op = %llu, checkpoint_lsn = '\\x01' WHERE id = %u;"
           "ANALYZE bs_changes",
           (unsigned)sid, (unsigned long long)g_cfg->pg_changes, (unsigned long long)head,
           (unsigned long long)head, (unsigned long long)head, (unsigned)sid);
  if (!(c = pq_connect(r, url_bs)) || pq_run(r, c, sql)) goto out;
  /* the first call opens the pool's connection */
  if ((rc = bs_get_checkpoint_changes(h.st, head - 2 * CHANGES_BEHIND, head, count_changes, &n,
                                      &err)) != BS_OK) {
    res_fail(r, rc, "bs_get_checkpoint_changes", &err);
    goto out;
  }
  mem_sampler_start();
  t0 = now_s();
  for (int i = 0; i < changes_calls(); i++) {
    double tc = now_s();
    if ((rc = bs_get_checkpoint_changes(h.st, head - 2 * CHANGES_BEHIND, head, count_changes, &n,
                                        &err)) != BS_OK) {
      res_fail(r, rc, "bs_get_checkpoint_changes", &err);
      break;
    }
    lat[i] = now_s() - tc;
  }
  mem_sampler_stop();
  if (r->status == BR_OK)
    changes_done(r, t0, lat, n, "buckets, lookups, users and flags, prepared");
out:
  if (c) PQfinish(c);
  h_close(&h);
  free(lat);
  return r->status == BR_FAILED;
}

/* The same records in a table of what the question needs, asked the buckets changed in
 * (from, to] with a statement planned per call (unnamed, as PQexecParams sends it). */
int pg_raw_changes(int a) {
  char name[72], sql[1024], f8[8], t8[8];
  const char *v[2] = {f8, t8};
  int len[2] = {8, 8}, fmt[2] = {1, 1};
  uint64_t head = 2 * g_cfg->pg_changes;
  double t0, *lat = calloc((size_t)changes_calls(), sizeof *lat);
  size_t n = 0;
  bres *r;
  PGconn *c;
  PGresult *res;
  (void)a;
  names_init();
  changes_name(name, sizeof name);
  r = res_new("changes", name, "libpq");
  snprintf(r->unit, sizeof r->unit, "us/call");
  r->lower_better = 1;
  snprintf(sql, sizeof sql,
           "CREATE TABLE raw_changes (op_id bigint PRIMARY KEY, first_op bigint NOT NULL,"
           " buckets bytea[] NOT NULL);"
           "INSERT INTO raw_changes SELECT 2 * g, 2 * g - 1, " CHANGE_BUCKET
           " FROM generate_series(1, %llu) g;"
           "ANALYZE raw_changes",
           (unsigned long long)g_cfg->pg_changes);
  if (!(c = pq_connect(r, url_raw))) goto out;
  if (pq_run(r, c, sql)) goto out;
  for (int i = 0; i < 8; i++) {
    f8[i] = (char)((head - 2 * CHANGES_BEHIND) >> (56 - 8 * i));
    t8[i] = (char)(head >> (56 - 8 * i));
  }
  t0 = now_s();
  for (int i = -1; i < changes_calls(); i++) { /* i = -1: not timed */
    double tc = now_s();
    res = PQexecParams(c,
                       "SELECT DISTINCT b FROM raw_changes c, unnest(c.buckets) b"
                       " WHERE c.op_id > $1 AND c.first_op <= $2 LIMIT 1001",
                       2, NULL, v, len, fmt, 1);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      pq_fail(r, c, res, "changes");
      break;
    }
    n = (size_t)PQntuples(res);
    PQclear(res);
    if (i < 0)
      t0 = now_s();
    else
      lat[i] = now_s() - tc;
  }
  if (r->status == BR_OK) changes_done(r, t0, lat, n, "the buckets alone");
out:
  if (c) PQfinish(c);
  free(lat);
  return r->status == BR_FAILED;
}

/* ---- Raw libpq: the minimal SQL for the same work ---- */

char *pb_room(pbuf *b, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->n + n) cap *= 2;
    if (!(b->p = realloc(b->p, cap))) die("out of memory");
    b->cap = cap;
  }
  b->n += n;
  return b->p + b->n - n;
}
void pb_be32(pbuf *b, uint32_t v) {
  unsigned char *p = (unsigned char *)pb_room(b, 4);
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}
void pb_be64(pbuf *b, uint64_t v) {
  pb_be32(b, (uint32_t)(v >> 32));
  pb_be32(b, (uint32_t)v);
}
void pb_bytes(pbuf *b, const void *v, size_t n) {
  pb_be32(b, (uint32_t)n);
  memcpy(pb_room(b, n), v, n);
}
void pb_int(pbuf *b, uint64_t v, int size) {
  pb_be32(b, (uint32_t)size);
  if (size == 8)
    pb_be64(b, v);
  else if (size == 4)
    pb_be32(b, (uint32_t)v);
  else {
    unsigned char *p = (unsigned char *)pb_room(b, 2);
    p[0] = (unsigned char)(v >> 8), p[1] = (unsigned char)v;
  }
}
void pb_array(pbuf *b, uint32_t oid, uint32_t n) {
  pb_be32(b, 1);
  pb_be32(b, 0);
  pb_be32(b, oid);
  pb_be32(b, n);
  pb_be32(b, 1);
}

static uint64_t rd64(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | u[i];
  return v;
}

#define RAW_SCHEMA                                                                                 \
  "CREATE TABLE raw_stream (id int PRIMARY KEY, op_head bigint NOT NULL, checkpoint bigint"        \
  " NOT NULL, lsn bytea);"                                                                         \
  "CREATE TABLE raw_buckets (id bigint PRIMARY KEY, name bytea NOT NULL UNIQUE,"                   \
  " checksum bigint NOT NULL, count bigint NOT NULL, last_op bigint NOT NULL);"                    \
  "CREATE TABLE raw_ops (bucket bigint NOT NULL, op_id bigint NOT NULL, type smallint NOT NULL,"   \
  " checksum bigint NOT NULL, object_type bytea, object_id bytea, subkey bytea, data bytea,"       \
  " PRIMARY KEY (bucket, op_id));"                                                                 \
  "CREATE TABLE raw_source (rid bytea PRIMARY KEY, bucket bigint NOT NULL, op_id bigint NOT"       \
  " NULL, data bytea NOT NULL);"                                                                   \
  "INSERT INTO raw_stream VALUES (1, 0, 0, NULL)"

typedef struct rawst {
  PGconn *c;
  uint64_t head;
  struct {
    uint32_t checksum;
    uint64_t count;
    int exists;
  } bk[2];
} rawst;

static int raw_exec(bres *r, PGconn *c, const char *sql, int n, const char *const *v,
                    const int *len, const int *fmt, PGresult **out) {
  PGresult *res = PQexecParams(c, sql, n, NULL, v, len, fmt, 1);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) return pq_fail(r, c, res, sql);
  if (out)
    *out = res;
  else
    PQclear(res);
  return 0;
}

/* One commit: the steps [from, to) of the workload into bucket b (rows offset by row_base). */
static int raw_commit(rawst *s, uint64_t from, uint64_t to, unsigned b, uint64_t row_base,
                      uint64_t lsn_n, bres *r) {
  static const unsigned char hdr[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};
  pbuf rids = {0}, ops = {0}, ub = {0}, uo = {0}, ud = {0};
  uint32_t n = (uint32_t)(to - from), ck_sum = 0;
  char bname[64], data[65536], rid[RID_LEN + 1], sub[BS_SUBKEY_SIZE];
  size_t blen;
  PGresult *res = NULL;
  int rc = -1;
  gen_bucket(bname, sizeof bname, &blen, b);
  if (pq_run(r, s->c, "BEGIN")) return -1;
  if (!s->bk[b].exists) {
    char id[8];
    const char *v[2] = {id, bname};
    int len[2] = {8, (int)blen}, fmt[2] = {1, 1};
    for (int i = 0; i < 8; i++) id[i] = (char)((uint64_t)(b + 1) >> (56 - 8 * i));
    if (raw_exec(r, s->c, "INSERT INTO raw_buckets VALUES ($1, $2, 0, 0, 0)", 2, v, len, fmt, NULL))
      goto out;
    s->bk[b].exists = 1;
  }
  pb_array(&rids, 17, n);
  for (uint64_t k = from; k < to; k++) {
    uint64_t v, row = step_row(k, &v) + row_base;
    gen_rid(rid, row);
    pb_bytes(&rids, rid, RID_LEN);
  }
  { /* the rows' previous records: what the new ops supersede */
    const char *v[1] = {rids.p};
    int len[1] = {(int)rids.n}, fmt[1] = {1};
    if (raw_exec(r, s->c, "SELECT bucket, op_id FROM raw_source WHERE rid = ANY($1::bytea[])", 1, v,
                 len, fmt, &res))
      goto out;
    PQclear(res);
  }
  memcpy(pb_room(&ops, 19), hdr, 19);
  pb_array(&ub, 20, n);
  pb_array(&uo, 20, n);
  pb_array(&ud, 17, n);
  for (uint64_t k = from; k < to; k++) {
    uint64_t v, row = step_row(k, &v) + row_base, op = ++s->head;
    bs_val ot = {OBJ_TYPE, OBJ_TYPE_LEN}, oi = {rid, RID_LEN}, dv = {data, g_cfg->data_size};
    uint32_t ck;
    gen_rid(rid, row);
    gen_data(data, row, v, g_cfg->data_size);
    ck = bs_checksum_put(BS_HASH_XXH3, ot, oi, dv);
    bs_subkey(sub, 1, oi);
    ck_sum += ck;
    pb_room(&ops, 2)[0] = 0, ops.p[ops.n - 1] = 8;
    pb_int(&ops, b + 1, 8);
    pb_int(&ops, op, 8);
    pb_int(&ops, 1, 2);
    pb_int(&ops, ck, 8);
    pb_bytes(&ops, OBJ_TYPE, OBJ_TYPE_LEN);
    pb_bytes(&ops, rid, RID_LEN);
    pb_bytes(&ops, sub, BS_SUBKEY_SIZE);
    pb_bytes(&ops, data, g_cfg->data_size);
    pb_be32(&ub, 8), pb_be64(&ub, b + 1);
    pb_be32(&uo, 8), pb_be64(&uo, op);
    pb_bytes(&ud, data, g_cfg->data_size);
  }
  memcpy(pb_room(&ops, 2), "\xff\xff", 2);
  res = PQexec(s->c, "COPY raw_ops FROM STDIN (FORMAT binary)");
  if (PQresultStatus(res) != PGRES_COPY_IN) {
    pq_fail(r, s->c, res, "COPY raw_ops");
    goto out;
  }
  PQclear(res);
  if (PQputCopyData(s->c, ops.p, (int)ops.n) != 1 || PQputCopyEnd(s->c, NULL) != 1) {
    pq_fail(r, s->c, NULL, "COPY raw_ops");
    goto out;
  }
  res = PQgetResult(s->c);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    pq_fail(r, s->c, res, "COPY raw_ops");
    goto out;
  }
  PQclear(res);
  while ((res = PQgetResult(s->c))) PQclear(res);
  {
    const char *v[4] = {rids.p, ub.p, uo.p, ud.p};
    int len[4] = {(int)rids.n, (int)ub.n, (int)uo.n, (int)ud.n}, fmt[4] = {1, 1, 1, 1};
    if (raw_exec(r, s->c,
                 "INSERT INTO raw_source SELECT DISTINCT ON (r) r, b, o, d FROM unnest($1::bytea[],"
                 " $2::int8[], $3::int8[], $4::bytea[]) AS u(r, b, o, d) ORDER BY r, o DESC"
                 " ON CONFLICT (rid) DO UPDATE SET bucket = excluded.bucket,"
                 " op_id = excluded.op_id, data = excluded.data",
                 4, v, len, fmt, NULL))
      goto out;
  }
  {
    char id[8], ck[8], cnt[8], last[8], lsn[17];
    const char *v[4] = {id, ck, cnt, last};
    int len[4] = {8, 8, 8, 8}, fmt[4] = {1, 1, 1, 1};
    for (int i = 0; i < 8; i++) {
      id[i] = (char)((uint64_t)(b + 1) >> (56 - 8 * i));
      ck[i] = (char)((uint64_t)ck_sum >> (56 - 8 * i));
      cnt[i] = (char)((uint64_t)n >> (56 - 8 * i));
      last[i] = (char)(s->head >> (56 - 8 * i));
    }
    if (raw_exec(
            r, s->c,
            "UPDATE raw_buckets SET checksum = (checksum + $2) % 4294967296, count = count + $3,"
            " last_op = $4 WHERE id = $1",
            4, v, len, fmt, NULL))
      goto out;
    gen_lsn(lsn, lsn_n);
    v[0] = last;
    v[1] = lsn;
    len[1] = 16;
    if (raw_exec(r, s->c,
                 "UPDATE raw_stream SET op_head = $1, checkpoint = $1, lsn = $2 WHERE id = 1", 2, v,
                 len, fmt, NULL))
      goto out;
  }
  rc = pq_run(r, s->c, "COMMIT");
out:
  if (rc) pq_run(r, s->c, "ROLLBACK");
  free(rids.p);
  free(ops.p);
  free(ub.p);
  free(uo.p);
  free(ud.p);
  return rc;
}

static int raw_steps(rawst *s, uint64_t from, uint64_t to, unsigned b, uint64_t row_base,
                     double *lat, size_t *nl, bres *r) {
  uint64_t every = g_cfg->commit_changes, lsn_base = row_base ? 2 * ingest_rows() : 0;
  for (uint64_t k = from; k < to; k += every) {
    uint64_t e = k + every < to ? k + every : to;
    double t = now_s();
    if (raw_commit(s, k, e, b, row_base, 16 + lsn_base + e, r)) return -1;
    if (lat) lat[(*nl)++] = now_s() - t;
  }
  return 0;
}

int pg_raw_ingest(int a) {
  uint64_t n = ingest_rows(), m = ingest_updates();
  double *lat = calloc((n + m) / g_cfg->commit_changes + 4, sizeof *lat), t0, t1, t2, c0;
  size_t nl = 0;
  char name[72];
  bres *ri, *ru, *rt;
  rawst s;
  (void)a;
  names_init();
  memset(&s, 0, sizeof s);
  snprintf(name, sizeof name, "%lluk inserts, 1 bucket, commit/%llu", (unsigned long long)n / 1000,
           (unsigned long long)g_cfg->commit_changes);
  ri = res_new("ingest", name, "libpq");
  snprintf(name, sizeof name, "  then %lluk random updates", (unsigned long long)m / 1000);
  ru = res_new("ingest", name, "libpq");
  rt = res_new("ingest", "  all ops (bytes/op: every table)", "libpq");
  snprintf(ri->unit, sizeof ri->unit, "ops/s");
  snprintf(ru->unit, sizeof ru->unit, "ops/s");
  snprintf(rt->unit, sizeof rt->unit, "ops/s");
  if (!(s.c = pq_connect(rt, url_raw)) || pq_run(rt, s.c, RAW_SCHEMA)) goto out;
  mem_sampler_start();
  c0 = cpu_s();
  t0 = now_s();
  if (raw_steps(&s, 0, n, BIG_BUCKET, 0, lat, &nl, rt)) goto out;
  t1 = now_s();
  if (raw_steps(&s, n, n + m, BIG_BUCKET, 0, lat, &nl, rt)) goto out;
  t2 = now_s();
  mem_sampler_stop();
  ri->count = (double)n, ri->secs = t1 - t0, ri->value = ri->count / ri->secs;
  ru->count = (double)m, ru->secs = t2 - t1, ru->value = ru->count / ru->secs;
  rt->count = (double)(n + m), rt->secs = t2 - t0, rt->value = rt->count / rt->secs;
  set_lat(rt, lat, nl);
  res_mem(rt);
  snprintf(rt->note, sizeof rt->note, "client CPU %.1f us/op", (cpu_s() - c0) / rt->count * 1e6);
  if (!pq_run(rt, s.c, "VACUUM (ANALYZE)")) {
    rt->bytes_per_op = schema_bytes(s.c) / rt->count;
    table_bytes(s.c, rt->count, rt->note, sizeof rt->note);
  }
  /* the small bucket */
  raw_steps(&s, 0, small_rows() * 2 / 3, SMALL, n, NULL, NULL, rt);
  raw_steps(&s, small_rows() * 2 / 3, small_rows(), SMALL, n, NULL, NULL, rt);
out:
  if (s.c) PQfinish(s.c);
  free(lat);
  return rt->status == BR_FAILED;
}

int pg_raw_reads(int a) {
  bres *r[2];
  PGconn *c;
  PGresult *res;
  uint64_t cp = 0;
  (void)a;
  names_init();
  r[0] = res_new("reads", "whole bucket from 0, first pass", "libpq");
  r[1] = res_new("reads", "whole bucket from 0, second pass", "libpq");
  for (int p = 0; p < 2; p++) snprintf(r[p]->unit, sizeof r[p]->unit, "ops/s");
  if (!(c = pq_connect(r[0], url_raw))) return 1;
  res = PQexec(c, "SELECT checkpoint FROM raw_stream WHERE id = 1");
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    cp = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  res = PQprepare(c, "page",
                  "SELECT op_id, type, checksum, object_type, object_id, subkey, data FROM raw_ops"
                  " WHERE bucket = $1 AND op_id > $2 AND op_id <= $3 ORDER BY op_id LIMIT $4",
                  4, NULL);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    pq_fail(r[0], c, res, "prepare");
    PQfinish(c);
    return 1;
  }
  PQclear(res);
  for (int p = 0; p < 2; p++) {
    dl d = {0, 0, 0, 0};
    double t0 = now_s(), *lat = calloc(1024, sizeof *lat);
    size_t nl = 0;
    int more = 1;
    mem_sampler_start();
    while (more) {
      char b8[8], a8[8], c8[8], l8[8];
      const char *v[4] = {b8, a8, c8, l8};
      int len[4] = {8, 8, 8, 8}, fmt[4] = {1, 1, 1, 1}, nt;
      double tc = now_s();
      for (int i = 0; i < 8; i++) {
        b8[i] = (char)((uint64_t)(BIG_BUCKET + 1) >> (56 - 8 * i));
        a8[i] = (char)(d.next_after >> (56 - 8 * i));
        c8[i] = (char)(cp >> (56 - 8 * i));
        l8[i] = (char)(g_cfg->read_limit >> (56 - 8 * i));
      }
      res = PQexecPrepared(c, "page", 4, v, len, fmt, 1);
      if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        pq_fail(r[p], c, res, "page");
        break;
      }
      nt = PQntuples(res);
      for (int i = 0; i < nt; i++) {
        d.sum += rd64(PQgetvalue(res, i, 2));
        for (int f = 3; f < 7; f++) d.bytes += (uint64_t)PQgetlength(res, i, f);
      }
      if (nt) d.next_after = rd64(PQgetvalue(res, nt - 1, 0));
      d.ops += (uint64_t)nt;
      more = (uint64_t)nt == g_cfg->read_limit;
      PQclear(res);
      if (nl < 1024) lat[nl++] = now_s() - tc;
    }
    mem_sampler_stop();
    if (r[p]->status == BR_OK) {
      r[p]->secs = now_s() - t0;
      r[p]->count = (double)d.ops;
      r[p]->value = (double)d.ops / r[p]->secs;
      r[p]->mbps = (double)d.bytes / r[p]->secs / 1e6;
      set_lat(r[p], lat, nl);
      res_mem(r[p]);
      snprintf(r[p]->note, sizeof r[p]->note, "keyset pages of %llu (prepared, binary)",
               (unsigned long long)g_cfg->read_limit);
      g_sh->pg_read_sum[1] = d.sum + d.ops;
    }
    free(lat);
  }
  PQfinish(c);
  return r[0]->status == BR_FAILED;
}

/* The bucket's checksum at the checkpoint: its running state less the ops above it (none at the
 * latest checkpoint); sum = 1: a SUM over its whole history, what a store without running state
 * does (the orientation's 88 ms). */
int pg_raw_checksums(int sum) {
  static const char *sql[2] = {
      /* scalar subqueries: an index range scan of the bucket's ops whatever the plan cache does
       * (a generic plan of the join was a scan of every bucket's ops) */
      "SELECT ((b.checksum - coalesce((SELECT sum(checksum) FROM raw_ops WHERE bucket = b.id"
      " AND op_id > $2), 0)) % 4294967296 + 4294967296) % 4294967296,"
      " b.count - (SELECT count(*) FROM raw_ops WHERE bucket = b.id AND op_id > $2)"
      " FROM raw_buckets b WHERE b.name = $1 AND b.id = $3",
      /* the bucket's id ($3) as a value: a subquery for it was planned as a scan of all ops */
      "SELECT sum(checksum) % 4294967296, count(*) FROM raw_ops"
      " WHERE bucket = $3 AND op_id <= $2 AND $1::bytea IS NOT NULL"};
  bres *r[2];
  PGconn *c;
  PGresult *res;
  uint64_t cp = 0;
  int calls = sum ? (g_cfg->quick ? 5 : 20) : ck_calls();
  names_init();
  for (int big = 1; big >= 0; big--) {
    char name[72];
    snprintf(name, sizeof name, "cold, %llu-op bucket, latest%s",
             (unsigned long long)(big ? ingest_rows() + ingest_updates() : small_rows()),
             sum ? ", SUM over history" : "");
    r[big] = res_new("checksums", name, "libpq");
    snprintf(r[big]->unit, sizeof r[big]->unit, "us/bucket");
    r[big]->lower_better = 1;
  }
  /* planned once per session, as the library's statements are (record_plans checks both) */
  if (!(c = pq_connect(r[1], url_raw)) ||
      pq_run(r[1], c, "SET plan_cache_mode = force_generic_plan")) {
    if (c) PQfinish(c);
    return 1;
  }
  res = PQexec(c, "SELECT checkpoint FROM raw_stream WHERE id = 1");
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    cp = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
  PQclear(res);
  res = PQprepare(c, "ck", sql[sum], 3, NULL);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    pq_fail(r[1], c, res, "prepare");
    PQfinish(c);
    return 1;
  }
  PQclear(res);
  for (int big = 1; big >= 0; big--) {
    char bname[64], c8[8], id8[8];
    size_t blen;
    double t0, *lat = calloc((size_t)calls, sizeof *lat);
    uint64_t ck = 0, cnt = 0;
    gen_bucket(bname, sizeof bname, &blen, big ? BIG_BUCKET : SMALL);
    for (int i = 0; i < 8; i++) {
      c8[i] = (char)(cp >> (56 - 8 * i));
      id8[i] = (char)((uint64_t)((big ? BIG_BUCKET : SMALL) + 1) >> (56 - 8 * i));
    }
    t0 = now_s();
    for (int i = 0; i < calls; i++) {
      const char *v[3] = {bname, c8, id8};
      int len[3] = {(int)blen, 8, 8}, fmt[3] = {1, 1, 1};
      double tc = now_s();
      res = PQexecPrepared(c, "ck", 3, v, len, fmt, 0);
      if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        pq_fail(r[big], c, res, "checksum");
        break;
      }
      ck = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
      cnt = strtoull(PQgetvalue(res, 0, 1), NULL, 10);
      PQclear(res);
      lat[i] = now_s() - tc;
    }
    if (r[big]->status == BR_OK) {
      r[big]->secs = now_s() - t0;
      r[big]->count = calls;
      r[big]->value = r[big]->secs / r[big]->count * 1e6;
      set_lat(r[big], lat, (size_t)calls);
      res_mem(r[big]);
      snprintf(r[big]->note, sizeof r[big]->note, "checksum %llu count %llu",
               (unsigned long long)ck, (unsigned long long)cnt);
      if (!sum) g_sh->pg_ck_sum[1][big] = ck + cnt;
    }
    free(lat);
  }
  if (!sum) record_plans(r[1], c, 1);
  PQfinish(c);
  return r[1]->status == BR_FAILED;
}

#endif /* BS_HAVE_PG */
