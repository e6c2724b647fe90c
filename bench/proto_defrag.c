/*
 * proto_defrag.c (bsbench --defrag): a defragmentation policy measured through the public API
 * (storage.h only), on the LMDB backend (nosync). Many updates of few rows: --buckets buckets of
 * DF_ROWS rows each, inserted, then --updates updates, 90% of them of the first tenth of each
 * bucket's rows (the hot rows), a commit per --commit-changes; a full compaction (bs_compact,
 * its defaults, the horizon at the checkpoint) spread evenly over the update commits (10 or 50
 * of them), with each setting of defragment_ratio (0 = off; given to every compaction or to
 * every n-th only). Measured per setting:
 *   - a fresh client after each compaction: every bucket downloaded from 0 at the checkpoint,
 *     ops downloaded / live rows (the rows it ends with);
 *   - existing clients: one syncing after every commit, one once per compaction period (half
 *     way through it): the ops they downloaded / the ops the writer wrote (1.00 = none again).
 * Every client's per-bucket checksum (the sum of what it holds, a CLEAR replacing what it folds)
 * is checked against bs_get_checksums at the end, and the fresh client's rows against the live
 * rows; bsbench exits 1 on a difference.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DF_ROWS 100u /* rows per bucket */

typedef struct dpolicy {
  double ratio;     /* defragment_ratio */
  unsigned every;   /* given to every n-th compaction only (the others: 0) */
  unsigned periods; /* compactions in the update phase */
} dpolicy;

static const dpolicy g_pol[] = {{0, 1, 10},    {0.1, 1, 10},  {0.25, 1, 10}, {0.5, 1, 10},
                                {0.77, 1, 10}, {0.77, 2, 10}, {0.77, 5, 10}, {0, 1, 50},
                                {0.25, 1, 50}, {0.5, 1, 50},  {0.77, 1, 50}};
#define NPOL (sizeof g_pol / sizeof *g_pol)

typedef struct dclient { /* a client's position and what it holds */
  uint64_t *after;
  uint32_t *sum;
  unsigned char *live; /* per row (fresh client only) */
  uint64_t ops, moves;
} dclient;

typedef struct dstat {
  double fresh_sum, fresh_max, fresh_last, moves_last;
  unsigned samples, compactions;
  uint64_t written, reemitted, cl_ops[2];
  int failed;
} dstat;

typedef struct dread {
  dclient *c;
  unsigned b;
} dread;

static int on_chunk(const bs_chunk *ch, void *payload) {
  dread *d = payload;
  dclient *c = d->c;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    uint64_t row = d->b * DF_ROWS;
    c->moves += o->type == BS_OP_MOVE;
    if (o->type == BS_OP_CLEAR) {
      c->sum[d->b] = o->checksum;
      if (c->live) memset(c->live + row, 0, DF_ROWS);
    } else {
      c->sum[d->b] += o->checksum;
    }
    if (c->live && (o->type == BS_OP_PUT || o->type == BS_OP_REMOVE)) {
      /* object ids are gen_rid's "r" + 8 digits of the row (not NUL-terminated) */
      const char *id = o->object_id.data;
      uint64_t r = 0;
      for (unsigned j = 1; j < RID_LEN && o->object_id.size == RID_LEN; j++)
        r = r * 10 + (uint64_t)(id[j] - '0');
      if (o->object_id.size == RID_LEN && r >= row && r < row + DF_ROWS)
        c->live[r] = o->type == BS_OP_PUT;
    }
  }
  c->ops += ch->n_ops;
  c->after[d->b] = ch->next_after;
  return 0;
}

/* Brings client c up to checkpoint cp in every bucket. */
static int d_sync(bs_storage *st, uint64_t cp, unsigned nb, dclient *c, bs_error *err) {
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bo.limit = 10000;
  for (unsigned b = 0; b < nb; b++) {
    char name[64];
    size_t len;
    bs_bucket_request req;
    dread d = {c, b};
    int more = 1, rc;
    gen_bucket(name, sizeof name, &len, b);
    req.bucket.data = name;
    req.bucket.size = len;
    while (more) {
      req.after = c->after[b];
      if ((rc = bs_get_bucket_data(&more, st, cp, &req, 1, &bo, on_chunk, &d, err)) != BS_OK)
        return rc;
    }
  }
  return BS_OK;
}

static dclient *client_new(unsigned nb, int fresh) {
  dclient *c = calloc(1, sizeof *c);
  if (!c || !(c->after = calloc(nb, sizeof *c->after)) || !(c->sum = calloc(nb, sizeof *c->sum)) ||
      (fresh && !(c->live = calloc((size_t)nb * DF_ROWS, 1))))
    die("out of memory");
  return c;
}
static void client_free(dclient *c) {
  free(c->after), free(c->sum), free(c->live), free(c);
}

/* Checks a client's sums against the store's, and the fresh client's rows. */
static int d_check(bs_storage *st, uint64_t cp, unsigned nb, const dclient *c, const char *who,
                   double ratio) {
  bs_error err;
  for (unsigned b = 0; b < nb; b++) {
    char name[64];
    size_t len;
    bs_val v;
    bs_checksum ck;
    gen_bucket(name, sizeof name, &len, b);
    v.data = name;
    v.size = len;
    if (bs_get_checksums(&ck, st, cp, &v, 1, &err) != BS_OK || ck.checksum != c->sum[b]) {
      fprintf(stderr, "bsbench --defrag: ratio %.2f, %s, bucket %u: checksum %u, client's %u\n",
              ratio, who, b, ck.checksum, c->sum[b]);
      return -1;
    }
  }
  if (c->live)
    for (size_t r = 0; r < (size_t)nb * DF_ROWS; r++)
      if (!c->live[r]) {
        fprintf(stderr, "bsbench --defrag: ratio %.2f, %s: row %zu missing\n", ratio, who, r);
        return -1;
      }
  return 0;
}

static int d_run(const dpolicy *p, unsigned nb, dstat *ds) {
  uint64_t rows = (uint64_t)nb * DF_ROWS, every = g_cfg->commit_changes, updates = g_cfg->updates;
  uint64_t steps = rows + updates, ncommits = (steps + every - 1) / every;
  uint64_t first_update = (rows + every - 1) / every; /* the commit index updates start at */
  uint64_t period = (ncommits - first_update) / p->periods, rng = g_cfg->seed, cp = 0, k = 0;
  char path[600];
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err;
  bs_val lsn0 = {"0000000000000001", 16};
  dclient *c0 = client_new(nb, 0), *c1 = client_new(nb, 0);
  uint32_t sid = 0;
  double ratio = p->ratio;
  int rc;
  memset(ds, 0, sizeof *ds);
  if (!period) period = 1;
  bench_path(path, sizeof path, "defrag.bs");
  unlink(path);
  o.flags = BS_OPEN_NOSYNC;
  if ((rc = bs_open(&db, path, &o, &err)) ||
      (rc = bs_stream_create(&sid, db, "bench", NULL, &err)) ||
      (rc = bs_storage_open(&st, db, sid, &err)) || (rc = bs_writer_open(&w, st, &wo, &err)) ||
      (rc = bs_writer_snapshot_done(w, lsn0, &err)))
    goto out;
  for (uint64_t n = 0; n < ncommits; n++) {
    char lsn[17];
    bs_val l = {lsn, 16};
    bs_commit_result cr;
    for (uint64_t e = k + every < steps ? k + every : steps; k < e; k++) {
      uint64_t row = k;
      if (k >= rows) { /* an update: 90% of them of a bucket's first tenth of rows */
        uint64_t b = rng_next(&rng) % nb, hot = rng_next(&rng) % 10 < 9;
        row = b * DF_ROWS + rng_next(&rng) % (hot ? DF_ROWS / 10 : DF_ROWS);
      }
      if ((rc = save_generated(w, k >= rows ? BS_UPDATE : BS_INSERT, row, (unsigned)(row / DF_ROWS),
                               k >= rows ? k : 0, &err)))
        goto out;
    }
    gen_lsn(lsn, 16 + n);
    if ((rc = bs_writer_commit(&cr, w, l, NULL, &err))) goto out;
    cp = cr.checkpoint;
    if ((rc = d_sync(st, cp, nb, c0, &err))) goto out;
    if (n >= first_update && (n - first_update) % period == period / 2 &&
        (rc = d_sync(st, cp, nb, c1, &err)))
      goto out;
    if (n >= first_update && (n + 1 - first_update) % period == 0) {
      bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
      bs_compact_stats cs;
      dclient *f = client_new(nb, 1);
      double x;
      co.defragment_ratio = (ds->compactions + 1) % p->every ? 0 : ratio;
      if ((rc = bs_compact(&cs, st, &co, &err)) || (rc = d_sync(st, cp, nb, f, &err))) {
        client_free(f);
        goto out;
      }
      ds->compactions++;
      ds->reemitted += cs.ops_reemitted;
      x = (double)f->ops / (double)rows;
      ds->fresh_sum += x;
      ds->fresh_last = x;
      ds->moves_last = (double)f->moves / (double)rows;
      if (x > ds->fresh_max) ds->fresh_max = x;
      ds->samples++;
      if (d_check(st, cp, nb, f, "fresh client", ratio)) ds->failed = 1;
      client_free(f);
    }
  }
  ds->written = steps;
  { /* a last checkpoint, so that the clients also download the last compaction's re-emits */
    char lsn[17];
    bs_val l = {lsn, 16};
    bs_commit_result cr;
    gen_lsn(lsn, 16 + ncommits);
    if ((rc = bs_writer_commit(&cr, w, l, NULL, &err))) goto out;
    cp = cr.checkpoint;
  }
  if ((rc = d_sync(st, cp, nb, c0, &err)) || (rc = d_sync(st, cp, nb, c1, &err))) goto out;
  ds->cl_ops[0] = c0->ops;
  ds->cl_ops[1] = c1->ops;
  if (d_check(st, cp, nb, c0, "client syncing every commit", ratio) ||
      d_check(st, cp, nb, c1, "client syncing once a period", ratio))
    ds->failed = 1;
out:
  if (rc) {
    fprintf(stderr, "bsbench --defrag: ratio %.2f: %s (%d)\n", ratio, err.msg, rc);
    ds->failed = 1;
  }
  if (w) bs_writer_close(w);
  if (st) bs_storage_close(st);
  if (db) bs_close(db);
  unlink(path);
  client_free(c0);
  client_free(c1);
  return ds->failed;
}

int proto_defrag(void) {
  unsigned nb = g_cfg->buckets_small;
  int bad = 0;
  printf("defragmentation policies, LMDB (nosync): %u buckets of %u rows, %llu updates (90%% of "
         "the first tenth of each bucket's rows), a commit per %llu, full compactions spread "
         "evenly over the update commits\n\n",
         nb, DF_ROWS, (unsigned long long)g_cfg->updates,
         (unsigned long long)g_cfg->commit_changes);
  printf("%-26s %5s %-27s %7s %9s %10s %22s %22s\n", "defragment_ratio", "comp.",
         "fresh ops/live: mean max last", "MOVEs", "written", "re-emitted", "every commit: ops (x)",
         "once a period: ops (x)");
  for (size_t i = 0; i < NPOL; i++) {
    char name[48];
    dstat ds;
    bad += d_run(&g_pol[i], nb, &ds);
    snprintf(name, sizeof name, "%.2f, %u compactions", g_pol[i].ratio, g_pol[i].periods);
    if (g_pol[i].every > 1)
      snprintf(name + strlen(name), sizeof name - strlen(name), ", every %u.", g_pol[i].every);
    if (ds.failed) {
      printf("%-26s FAILED\n", name);
      continue;
    }
    printf("%-26s %5u %9.2f %8.2f %8.2f %7.2f %9llu %10llu %14llu (%5.3f) %14llu (%5.3f)\n", name,
           ds.compactions, ds.samples ? ds.fresh_sum / ds.samples : 0, ds.fresh_max, ds.fresh_last,
           ds.moves_last, (unsigned long long)ds.written, (unsigned long long)ds.reemitted,
           (unsigned long long)ds.cl_ops[0], (double)ds.cl_ops[0] / (double)ds.written,
           (unsigned long long)ds.cl_ops[1], (double)ds.cl_ops[1] / (double)ds.written);
  }
  printf("\ncolumns: fresh = a new client downloading every bucket from 0 right after each "
         "compaction (the ops that compaction re-emitted are visible from the next checkpoint "
         "on and fold at the next compaction): ops / live rows; MOVEs = the MOVEs of the last "
         "such download / live rows; written = ops the writer wrote (inserts + updates); every "
         "commit / once a period = what an existing client syncing that often downloaded, and "
         "that over written\n");
  return bad;
}
