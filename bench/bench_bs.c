/*
 * bench_bs.c: the workloads through bucketstore's public API (storage.h only).
 * Every function runs in a phase child (see bsbench.c) and appends its results.
 */
#include "bench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct bsh {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  char path[600];
} bsh;

static void h_close(bsh *h) {
  if (h->w) bs_writer_close(h->w);
  if (h->st) bs_storage_close(h->st);
  if (h->db) bs_close(h->db);
  h->w = NULL;
  h->st = NULL;
  h->db = NULL;
}

/* Opens file `name` in the run's directory; create = 1 makes a fresh stream. */
static int h_open(bsh *h, const char *name, unsigned flags, size_t cache, int create, bres *r,
                  bs_error *err) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  uint32_t sid = 0;
  int rc;
  memset(h, 0, sizeof *h);
  bench_path(h->path, sizeof h->path, name);
  if (create) unlink(h->path);
  o.flags = flags;
  o.checksum_cache_entries = cache;
  o.map_size = (size_t)g_cfg->map_mb << 20;
  if ((rc = bs_open(&h->db, h->path, &o, err)) != BS_OK) {
    res_fail(r, rc, "bs_open", err);
    return rc;
  }
  if (create && (rc = bs_stream_create(&sid, h->db, "bench", NULL, err)) != BS_OK) {
    res_fail(r, rc, "bs_stream_create", err);
    return rc;
  }
  if ((rc = bs_storage_open(&h->st, h->db, sid, err)) != BS_OK) {
    res_fail(r, rc, "bs_storage_open", err);
    return rc;
  }
  return BS_OK;
}

static int h_writer(bsh *h, int snapshot, size_t max_records, bres *r, bs_error *err) {
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  int rc;
  wo.snapshot = snapshot;
  wo.max_records = max_records;
  wo.max_bytes = 256u << 20; /* the record bound decides when to flush */
  if ((rc = bs_writer_open(&h->w, h->st, &wo, err)) != BS_OK)
    res_fail(r, rc, "bs_writer_open", err);
  return rc;
}

static int h_commit(bsh *h, uint64_t n, uint64_t *cp_out, bres *r, bs_error *err) {
  char lsn[17];
  bs_val l;
  bs_commit_result cr;
  int rc;
  gen_lsn(lsn, n);
  l.data = lsn;
  l.size = 16;
  if ((rc = bs_writer_commit(&cr, h->w, l, NULL, err)) != BS_OK)
    res_fail(r, rc, "bs_writer_commit", err);
  if (cp_out) *cp_out = cr.checkpoint;
  return rc;
}

static double stored_ops(bs_db *db, double *file_out) {
  bs_stat s;
  if (bs_db_stat(&s, db, NULL) != BS_OK) return -1;
  if (file_out) *file_out = (double)s.file_bytes;
  return (double)(s.ops_put + s.ops_remove + s.ops_move + s.ops_clear);
}

static void set_lat(bres *r, double *lat, size_t n) {
  r->p50_us = pct(lat, n, 0.50) * 1e6;
  r->p99_us = pct(lat, n, 0.99) * 1e6;
}

static void hist_push(uint64_t cp) {
  g_sh->hist_bs[g_sh->nhist_bs % 256] = cp;
  g_sh->nhist_bs++;
}

/* ---- W1: initial snapshot ---- */
int bs_ingest(int mode) {
  const bench_cfg *c = g_cfg;
  int large = mode == 1, nosync = mode == 2;
  unsigned nb = large ? c->buckets_large : c->buckets_small;
  uint64_t n = c->rows, every = c->commit_rows, cp = 0, nbk = 0;
  char name[72];
  bres *r, *rc2;
  bsh h;
  bs_error err;
  double *lat = calloc(n / every + 2, sizeof *lat), t0, t1, file = 0, ops;
  size_t nl = 0;
  int rc;

  snprintf(name, sizeof name, "snapshot %lluk rows -> %u buckets%s", (unsigned long long)n / 1000,
           nb, nosync ? ", nosync" : "");
  r = res_new("ingest", name, "bs");
  snprintf(r->unit, sizeof r->unit, "rows/s");
  if (h_open(&h,
             large    ? "s10k.bs"
             : nosync ? "s100ns.bs"
                      : "s100.bs",
             nosync ? BS_OPEN_NOSYNC : 0, 0, 1, r, &err) ||
      h_writer(&h, 1, every, r, &err))
    goto out;
  mem_sampler_start();
  t0 = now_s();
  for (uint64_t i = 0; i < n; i++) {
    if ((rc = save_generated(h.w, BS_INSERT, i, (unsigned)(i % nb), 0, &err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_save", &err);
      goto out;
    }
    if ((i + 1) % every == 0 || i + 1 == n) {
      double tc = now_s();
      if (h_commit(&h, 1, NULL, r, &err)) goto out;
      lat[nl++] = now_s() - tc;
    }
  }
  t1 = now_s();
  mem_sampler_stop();
  r->count = (double)n;
  r->secs = t1 - t0;
  r->value = (double)n / r->secs;
  r->mbps = (double)n * (double)c->data_size / r->secs / 1e6;
  set_lat(r, lat, nl);
  res_mem(r);
  snprintf(r->note, sizeof r->note, "%s commit every %llu rows (one txn each); latency = commit",
           nosync ? "nosync" : "durable", (unsigned long long)every);
  if (nosync) {
    ops = stored_ops(h.db, &file);
    if (ops > 0) r->bytes_per_op = file_bytes(h.path) / ops;
    goto out;
  }

  /* compact_initial_replication, then the first checkpoint. It commits a few transactions per
   * bucket; durable that is a few fsyncs per bucket (minutes for 10,000 buckets on this
   * machine), so the many-bucket run compacts through a nosync handle. */
  h_close(&h);
  snprintf(name, sizeof name, "  + compact_initial (%u buckets%s)", nb, large ? ", nosync" : "");
  rc2 = res_new("ingest", name, "bs");
  snprintf(rc2->unit, sizeof rc2->unit, "ops/s");
  if (h_open(&h, large ? "s10k.bs" : "s100.bs", large ? BS_OPEN_NOSYNC : 0, 0, 0, r, &err))
    goto out;
  mem_sampler_start();
  t0 = now_s();
  rc = bs_compact_initial_replication(&nbk, h.st, 0, 0, &err);
  t1 = now_s();
  mem_sampler_stop();
  if (rc != BS_OK) {
    res_fail(rc2, rc, "bs_compact_initial_replication", &err);
  } else {
    rc2->count = (double)n;
    rc2->secs = t1 - t0;
    rc2->value = (double)n / rc2->secs;
    snprintf(rc2->note, sizeof rc2->note,
             "%llu buckets in %.3f s = %.2f ms/bucket (nothing "
             "superseded: a scan)",
             (unsigned long long)nbk, t1 - t0, (t1 - t0) * 1e3 / nb);
    res_mem(rc2);
  }
  if (h_writer(&h, 0, 0, r, &err)) goto out;
  {
    bs_val l = {"0000000000000001", 16};
    if ((rc = bs_writer_snapshot_done(h.w, l, &err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_snapshot_done", &err);
      goto out;
    }
  }
  if (h_commit(&h, 2, &cp, r, &err)) goto out;
  if (!cp) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "no checkpoint after snapshot_done + commit");
    goto out;
  }
  ops = stored_ops(h.db, &file);
  if (ops > 0) r->bytes_per_op = file_bytes(h.path) / ops;
  if (!large) {
    for (uint64_t i = 0; i < n; i++) g_state_bs[i] = (int32_t)(i % nb);
    g_sh->nhist_bs = 0;
    g_sh->change_seq_bs = 0;
    hist_push(cp);
    g_sh->built[ST_S100] |= 1;
  }
out:
  h_close(&h);
  free(lat);
  return r->status == BR_FAILED;
}

/* ---- W2: streaming changes ---- */
static int apply_change(bs_writer *w, const change *ch, uint64_t version, bs_error *err) {
  switch (ch->kind) {
  case CH_INSERT:
    return save_generated(w, BS_INSERT, ch->row, (unsigned)ch->new_bucket, version, err);
  case CH_DELETE:
    return save_generated(w, BS_DELETE, ch->row, 0, version, err);
  default:
    return save_generated(w, BS_UPDATE, ch->row, (unsigned)ch->new_bucket, version, err);
  }
}

/* Applies m changes with a commit every commit_changes; latencies into lat (may be NULL). */
static int stream_changes(bsh *h, uint64_t m, double *lat, size_t *nl, volatile int *stop, bres *r,
                          bs_error *err) {
  const bench_cfg *c = g_cfg;
  uint64_t k, every = c->commit_changes, cp;
  int rc;
  for (k = 0; k < m && !(stop && *stop && k % every == 0); k++) {
    change ch;
    uint64_t seq = g_sh->change_seq_bs++;
    gen_change(&ch, seq, g_state_bs, c->rows, c->buckets_small);
    if ((rc = apply_change(h->w, &ch, seq + 1, err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_save", err);
      return rc;
    }
    if ((k + 1) % every == 0) {
      double tc = now_s();
      if ((rc = h_commit(h, 10 + seq, &cp, r, err))) return rc;
      if (lat) lat[(*nl)++] = now_s() - tc;
      hist_push(cp);
    }
  }
  if (k % every) {
    if ((rc = h_commit(h, 10 + g_sh->change_seq_bs, &cp, r, err))) return rc;
    hist_push(cp);
  }
  return BS_OK;
}

int bs_stream(int nosync, int report) {
  const bench_cfg *c = g_cfg;
  uint64_t m = c->updates;
  char name[72];
  bres *r;
  bsh h;
  bs_error err;
  double *lat = calloc(m / c->commit_changes + 2, sizeof *lat), t0, file = 0, ops;
  size_t nl = 0;

  snprintf(name, sizeof name, "%llu changes/commit, %s", (unsigned long long)c->commit_changes,
           nosync ? "nosync" : "durable");
  r = res_new("stream", name, "bs");
  snprintf(r->unit, sizeof r->unit, "chg/s");
  if (h_open(&h, "s100.bs", nosync ? BS_OPEN_NOSYNC : 0, 0, 0, r, &err) ||
      h_writer(&h, 0, c->commit_changes > 2000 ? c->commit_changes : 0, r, &err))
    goto out;
  mem_sampler_start();
  t0 = now_s();
  if (stream_changes(&h, m, lat, &nl, NULL, r, &err)) goto out;
  r->secs = now_s() - t0;
  mem_sampler_stop();
  r->count = (double)m;
  r->value = (double)m / r->secs;
  set_lat(r, lat, nl);
  res_mem(r);
  ops = stored_ops(h.db, &file);
  if (ops > 0) r->bytes_per_op = file_bytes(h.path) / ops;
  snprintf(r->note, sizeof r->note,
           "60%% update, 20%% move, 20%% delete (re-insert); latency = commit");
  g_sh->built[ST_STREAMED] |= 1;
  (void)report;
out:
  h_close(&h);
  free(lat);
  return r->status == BR_FAILED;
}

/* ---- W3: sync reads ---- */
typedef struct dl {
  uint64_t ops, bytes, next_after;
  int cut;       /* the last chunk's bucket has more */
  char last[24]; /* the last chunk's bucket (catch-up's names are shorter) */
} dl;

static int on_chunk(const bs_chunk *ch, void *payload) {
  dl *d = payload;
  size_t len = ch->bucket.size < sizeof d->last - 1 ? ch->bucket.size : sizeof d->last - 1;
  memcpy(d->last, ch->bucket.data, len);
  d->last[len] = 0;
  d->cut = ch->has_more;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    d->bytes += o->data.size + o->object_type.size + o->object_id.size + o->subkey.size;
  }
  d->ops += ch->n_ops;
  d->next_after = ch->next_after;
  return 0;
}

/* Downloads one whole bucket from after to checkpoint cp in calls of read_limit ops. */
static int download(bs_storage *st, uint64_t cp, unsigned b, uint64_t after, dl *d, bs_error *err) {
  char bname[64];
  size_t blen;
  bs_bucket_request req;
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  int more = 1, rc;
  gen_bucket(bname, sizeof bname, &blen, b);
  req.bucket.data = bname;
  req.bucket.size = blen;
  req.after = after;
  bo.limit = g_cfg->read_limit;
  while (more) {
    d->next_after = req.after;
    if ((rc = bs_get_bucket_data(&more, st, cp, &req, 1, &bo, on_chunk, d, err)) != BS_OK)
      return rc;
    req.after = d->next_after;
  }
  return BS_OK;
}

/* Catch-up: the buckets changed in (from, cp], then their ops from `from`. */
typedef struct cu {
  int all;
  size_t n;
  char names[4096][24];
} cu;

static int on_changes(const bs_checkpoint_changes *ch, void *payload) {
  cu *u = payload;
  if (ch->invalidate_data_buckets) u->all = 1;
  for (size_t i = 0; i < ch->n_updated_buckets && u->n < 4096; i++) {
    size_t len = ch->updated_buckets[i].size < 23 ? ch->updated_buckets[i].size : 23;
    memcpy(u->names[u->n], ch->updated_buckets[i].data, len);
    u->names[u->n][len] = 0;
    u->n++;
  }
  return 0;
}

static int catch_up(bs_storage *st, uint64_t from, uint64_t cp, dl *d, size_t *nbk, bs_error *err) {
  static cu u;
  bs_bucket_request *req;
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  size_t n;
  int more = 1, rc;
  u.all = 0;
  u.n = 0;
  if ((rc = bs_get_checkpoint_changes(st, from, cp, on_changes, &u, err)) != BS_OK) return rc;
  n = u.all ? g_cfg->buckets_small : u.n;
  req = calloc(n ? n : 1, sizeof *req);
  for (size_t i = 0; i < n; i++) {
    if (u.all) {
      size_t len;
      gen_bucket(u.names[i], sizeof u.names[i], &len, (unsigned)i);
    }
    req[i].bucket.data = u.names[i];
    req[i].bucket.size = strlen(u.names[i]);
    req[i].after = from;
  }
  bo.limit = g_cfg->read_limit;
  /* the reads below continue a cut bucket from its last op: chunks come in request order */
  while (more && n) {
    dl part = {0};
    size_t i = 0;
    if ((rc = bs_get_bucket_data(&more, st, cp, req, n, &bo, on_chunk, &part, err)) != BS_OK) break;
    d->ops += part.ops;
    d->bytes += part.bytes;
    if (!more) break;
    /* the buckets up to the last one served are done, that one too unless it was cut; the rest
     * are asked for again from where they stood */
    while (i < n && strcmp(req[i].bucket.data, part.last) != 0) i++;
    if (i == n) break; /* nothing served: cannot happen while more is set */
    for (size_t j = 0; j < i; j++) req[j].after = cp;
    req[i].after = part.cut ? part.next_after : cp;
  }
  *nbk = n;
  free(req);
  return rc;
}

int bs_reads(void) {
  const bench_cfg *c = g_cfg;
  unsigned nb = c->buckets_small;
  bres *r, *r2;
  bsh h;
  bs_error err;
  bs_checkpoint cp;
  double *lat = calloc(nb + 64, sizeof *lat), t0;
  dl tot = {0};
  int rc;
  char name[72];

  r = res_new("reads", "whole buckets from 0, cold map", "bs");
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (h_open(&h, "s100.bs", 0, 0, 0, r, &err)) goto out;
  if ((rc = bs_get_checkpoint(&cp, h.st, &err)) != BS_OK) {
    res_fail(r, rc, "bs_get_checkpoint", &err);
    goto out;
  }
  for (int pass = 0; pass < 2; pass++) {
    if (pass) {
      r = res_new("reads", "whole buckets from 0, warm map", "bs");
      snprintf(r->unit, sizeof r->unit, "ops/s");
    }
    memset(&tot, 0, sizeof tot);
    mem_sampler_start();
    t0 = now_s();
    for (unsigned b = 0; b < nb; b++) {
      double tb = now_s();
      if ((rc = download(h.st, cp.op_id, b, 0, &tot, &err)) != BS_OK) {
        res_fail(r, rc, "bs_get_bucket_data", &err);
        goto out;
      }
      lat[b] = now_s() - tb;
    }
    r->secs = now_s() - t0;
    mem_sampler_stop();
    r->count = (double)tot.ops;
    r->value = (double)tot.ops / r->secs;
    r->mbps = (double)tot.bytes / r->secs / 1e6;
    set_lat(r, lat, nb);
    res_mem(r);
    snprintf(r->note, sizeof r->note,
             "%u buckets, %.0f ops each, %llu ops/call; %.0f MB/s; "
             "latency = one whole bucket%s",
             nb, (double)tot.ops / nb, (unsigned long long)c->read_limit, r->mbps,
             pass ? "; second pass: map pages already faulted in" : "; first touch of the map");
  }

  uint64_t behind = g_sh->nhist_bs > c->catchup_commits ? c->catchup_commits : g_sh->nhist_bs - 1;
  snprintf(name, sizeof name, "catch-up, %llu commits behind", (unsigned long long)behind);
  r2 = res_new("reads", name, "bs");
  snprintf(r2->unit, sizeof r2->unit, "ops/s");
  if (!behind) {
    r2->status = BR_FAILED;
    snprintf(r2->note, sizeof r2->note, "no earlier checkpoint recorded");
    goto out;
  }
  {
    uint64_t from = g_sh->hist_bs[(g_sh->nhist_bs - 1 - behind) % 256];
    int reps = c->quick ? 5 : 40;
    size_t nbk = 0;
    dl d = {0};
    t0 = now_s();
    for (int i = 0; i < reps; i++) {
      double tc = now_s();
      if ((rc = catch_up(h.st, from, cp.op_id, &d, &nbk, &err)) != BS_OK) {
        res_fail(r2, rc, "catch-up", &err);
        goto out;
      }
      lat[i] = now_s() - tc;
    }
    r2->secs = now_s() - t0;
    r2->count = (double)d.ops;
    r2->value = (double)d.ops / r2->secs;
    r2->mbps = (double)d.bytes / r2->secs / 1e6;
    set_lat(r2, lat, (size_t)reps);
    res_mem(r2);
    snprintf(r2->note, sizeof r2->note,
             "checkpoint %llu -> %llu: %.0f ops in %zu buckets per "
             "catch-up (changes + bucket data); latency = one catch-up",
             (unsigned long long)from, (unsigned long long)cp.op_id, (double)d.ops / reps, nbk);
  }
out:
  h_close(&h);
  free(lat);
  return 0;
}

typedef struct cctx {
  bsh *h;
  volatile int stop;
  uint64_t ops, changes, seed;
  int rc;
  bs_error err;
  bres *r;
} cctx;

static void *reader(void *arg) {
  cctx *x = arg;
  uint64_t s = x->seed;
  while (!x->stop) {
    bs_checkpoint cp;
    dl d = {0};
    if ((x->rc = bs_get_checkpoint(&cp, x->h->st, &x->err)) != BS_OK) break;
    if ((x->rc = download(x->h->st, cp.op_id, (unsigned)(rng_next(&s) % g_cfg->buckets_small), 0,
                          &d, &x->err)) != BS_OK)
      break;
    x->ops += d.ops;
  }
  return NULL;
}

static void *writer(void *arg) {
  cctx *x = arg;
  uint64_t before = g_sh->change_seq_bs;
  x->rc = stream_changes(x->h, UINT64_MAX / 2, NULL, NULL, &x->stop, x->r, &x->err);
  x->changes = g_sh->change_seq_bs - before;
  return NULL;
}

int bs_concurrent(int threads) {
  char name[72];
  bres *r;
  bsh h;
  bs_error err;
  cctx rd[8], wr;
  pthread_t rt[8], wt;
  double t0;
  uint64_t ops = 0;

  snprintf(name, sizeof name, "%d reader%s + streaming writer", threads, threads > 1 ? "s" : "");
  r = res_new("reads", name, "bs");
  r->timed = 1;
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (h_open(&h, "s100.bs", 0, 0, 0, r, &err) || h_writer(&h, 0, 0, r, &err)) goto out;
  memset(&wr, 0, sizeof wr);
  wr.h = &h;
  wr.r = r;
  mem_sampler_start();
  t0 = now_s();
  pthread_create(&wt, NULL, writer, &wr);
  for (int i = 0; i < threads; i++) {
    memset(&rd[i], 0, sizeof rd[i]);
    rd[i].h = &h;
    rd[i].seed = g_cfg->seed + (uint64_t)i * 7919;
    pthread_create(&rt[i], NULL, reader, &rd[i]);
  }
  usleep((useconds_t)(g_cfg->read_secs * 1e6));
  for (int i = 0; i < threads; i++) rd[i].stop = 1;
  for (int i = 0; i < threads; i++) {
    pthread_join(rt[i], NULL);
    ops += rd[i].ops;
    if (rd[i].rc) res_fail(r, rd[i].rc, "reader", &rd[i].err);
  }
  r->secs = now_s() - t0;
  wr.stop = 1;
  pthread_join(wt, NULL);
  mem_sampler_stop();
  if (wr.rc && r->status == BR_OK) res_fail(r, wr.rc, "writer", &wr.err);
  if (r->status != BR_OK) goto out;
  r->count = (double)ops;
  r->value = (double)ops / r->secs;
  res_mem(r);
  snprintf(r->note, sizeof r->note,
           "whole random buckets at the latest checkpoint; writer "
           "meanwhile %.0f changes/s (durable, commit per %llu)",
           (double)wr.changes / r->secs, (unsigned long long)g_cfg->commit_changes);
out:
  h_close(&h);
  return 0;
}

/* ---- W4: checksums ---- */
static void ck_shape(int big, uint64_t *nbk, uint64_t *per) {
  *nbk = big ? g_cfg->ck_big_buckets : g_cfg->ck_requests;
  *per = big ? g_cfg->ck_big_ops : g_cfg->ck_small_ops;
}

int bs_ck_build(int big) {
  uint64_t nbk, per, total, every = 1000, cp = 0, prev = 0;
  bres *r = res_new("checksums", "build", "bs");
  bsh h;
  bs_error err;
  int rc;
  ck_shape(big, &nbk, &per);
  total = nbk * per;
  if (h_open(&h, big ? "ckb.bs" : "cks.bs", BS_OPEN_NOSYNC, 0, 1, r, &err) ||
      h_writer(&h, 0, every, r, &err))
    goto out;
  {
    bs_val l = {"0000000000000001", 16};
    if ((rc = bs_writer_snapshot_done(h.w, l, &err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_snapshot_done", &err);
      goto out;
    }
  }
  for (uint64_t i = 0; i < total; i++) {
    char rid[RID_LEN + 1], bname[64], data[64];
    size_t blen;
    bs_row out;
    bs_save s = BS_SAVE_INIT;
    gen_rid(rid, i);
    gen_bucket(bname, sizeof bname, &blen, (unsigned)(i % nbk));
    gen_data(data, i, 0, sizeof data);
    s.table.data = TABLE;
    s.table.size = strlen(TABLE);
    s.after_id.data = rid;
    s.after_id.size = RID_LEN;
    out.bucket.data = bname;
    out.bucket.size = blen;
    out.object_type.data = OBJ_TYPE;
    out.object_type.size = OBJ_TYPE_LEN;
    out.object_id.data = rid;
    out.object_id.size = RID_LEN;
    out.data.data = data;
    out.data.size = sizeof data;
    s.rows = &out;
    s.n_rows = 1;
    if ((rc = bs_writer_save(h.w, &s, &err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_save", &err);
      goto out;
    }
    if ((i + 1) % every == 0 || i + 1 == total) {
      prev = cp;
      if (h_commit(&h, 2 + i, &cp, r, &err)) goto out;
    }
  }
  g_sh->ck_cp[0][big][0] = cp;
  g_sh->ck_cp[0][big][1] = prev;
out:
  h_close(&h);
  return r->status == BR_FAILED;
}

int bs_checksums(int big) {
  uint64_t nbk, per, n = g_cfg->ck_requests;
  size_t per_call;
  char(*names)[24];
  bs_val *bv;
  bs_checksum *out;
  int rc = 0;
  ck_shape(big, &nbk, &per);
  per_call = (size_t)(nbk < n ? nbk : n);
  names = calloc(per_call, sizeof *names);
  bv = calloc(per_call, sizeof *bv);
  out = calloc(per_call, sizeof *out);
  for (size_t i = 0; i < per_call; i++) {
    size_t len;
    gen_bucket(names[i], sizeof names[i], &len, (unsigned)i);
    bv[i].data = names[i];
    bv[i].size = len;
  }
  for (int cached = 0; cached <= 1; cached++) {
    for (int older = 0; older <= 1; older++) {
      char name[72];
      bres *r;
      bsh h;
      bs_error err;
      uint64_t cp = g_sh->ck_cp[0][big][older], sum = 0, calls = (n + per_call - 1) / per_call;
      int reps = g_cfg->quick ? 2 : 5;
      double t0, *lat = calloc(calls * (size_t)reps, sizeof *lat);
      size_t nl = 0;
      snprintf(name, sizeof name, "%llu x %llu-op bkts, %s, %s", (unsigned long long)nbk,
               (unsigned long long)per, older ? "older" : "latest", cached ? "cached" : "cold");
      r = res_new("checksums", name, "bs");
      snprintf(r->unit, sizeof r->unit, "us/bucket");
      r->lower_better = 1;
      if (h_open(&h, big ? "ckb.bs" : "cks.bs", 0, cached ? 0 : (size_t)-1, 0, r, &err)) {
        h_close(&h);
        free(lat);
        continue;
      }
      if (cached && (rc = bs_get_checksums(out, h.st, cp, bv, per_call, &err)) != BS_OK) {
        res_fail(r, rc, "bs_get_checksums", &err);
      }
      t0 = now_s();
      for (int rep = 0; rep < reps && r->status == BR_OK; rep++) {
        for (uint64_t k = 0; k < calls; k++) {
          double tc = now_s();
          if ((rc = bs_get_checksums(out, h.st, cp, bv, per_call, &err)) != BS_OK) {
            res_fail(r, rc, "bs_get_checksums", &err);
            break;
          }
          lat[nl++] = now_s() - tc;
          if (rep == 0)
            for (size_t i = 0; i < per_call; i++) sum += out[i].checksum + out[i].count;
        }
      }
      if (r->status == BR_OK) {
        r->secs = now_s() - t0;
        r->count = (double)(calls * per_call * (uint64_t)reps);
        r->value = r->secs / r->count * 1e6;
        set_lat(r, lat, nl);
        res_mem(r);
        snprintf(r->note, sizeof r->note,
                 "at checkpoint %llu; %zu buckets per call; "
                 "latency = one call",
                 (unsigned long long)cp, per_call);
        g_sh->ck_sum[0][big][older] = sum;
      }
      h_close(&h);
      free(lat);
    }
  }
  free(names);
  free(bv);
  free(out);
  return 0;
}

/* ---- W5: parameter lookups ---- */
static size_t lookup_key(unsigned char *buf, uint64_t k) {
  bs_scalar v[2];
  size_t size = 0;
  memset(v, 0, sizeof v);
  v[0].type = BS_SCALAR_STRING;
  v[0].s.data = "org";
  v[0].s.size = 3;
  v[1].type = BS_SCALAR_INT;
  v[1].i = (int64_t)k;
  bs_lookup_encode(buf, 64, &size, v, 2, NULL);
  return size;
}

static int count_row(const bs_val *params, void *payload) {
  *(uint64_t *)payload += params->size ? 1 : 0;
  return 0;
}

int bs_params(void) {
  const bench_cfg *c = g_cfg;
  uint64_t n = c->params, keys = n / 10 ? n / 10 : 1, every = 10000, cp = 0, rows = 0;
  bres *rb, *r;
  bsh h;
  bs_error err;
  double t0, *lat = calloc(c->param_queries, sizeof *lat), file = 0, ops;
  int rc;
  char name[72];

  snprintf(name, sizeof name, "build %lluk-entry index", (unsigned long long)n / 1000);
  rb = res_new("params", name, "bs");
  snprintf(rb->unit, sizeof rb->unit, "entries/s");
  if (h_open(&h, "params.bs", BS_OPEN_NOSYNC, 0, 1, rb, &err) || h_writer(&h, 0, every, rb, &err))
    goto out;
  {
    bs_val l = {"0000000000000001", 16};
    if ((rc = bs_writer_snapshot_done(h.w, l, &err)) != BS_OK) {
      res_fail(rb, rc, "bs_writer_snapshot_done", &err);
      goto out;
    }
  }
  mem_sampler_start();
  t0 = now_s();
  for (uint64_t i = 0; i < n; i++) {
    unsigned char key[64];
    char rid[24], js[48];
    bs_val pv;
    bs_lookup lk;
    bs_save s = BS_SAVE_INIT;
    snprintf(rid, sizeof rid, "p%08llu", (unsigned long long)i);
    pv.size = (size_t)snprintf(js, sizeof js, "{\"list\":\"l%07llu\"}", (unsigned long long)i);
    pv.data = js;
    lk.key.data = key;
    lk.key.size = lookup_key(key, i % keys);
    lk.params = &pv;
    lk.n_params = 1;
    s.table.data = "members";
    s.table.size = 7;
    s.after_id.data = rid;
    s.after_id.size = strlen(rid);
    s.lookups = &lk;
    s.n_lookups = 1;
    if ((rc = bs_writer_save(h.w, &s, &err)) != BS_OK) {
      res_fail(rb, rc, "bs_writer_save", &err);
      goto out;
    }
    if (((i + 1) % every == 0 || i + 1 == n) && h_commit(&h, 2 + i, &cp, rb, &err)) goto out;
  }
  rb->secs = now_s() - t0;
  mem_sampler_stop();
  rb->count = (double)n;
  rb->value = (double)n / rb->secs;
  res_mem(rb);
  ops = stored_ops(h.db, &file);
  (void)ops;
  rb->bytes_per_op = file_bytes(h.path) / (double)n;
  snprintf(rb->note, sizeof rb->note,
           "nosync, commit every %llu; %llu keys x 10 rows; B/op = per entry",
           (unsigned long long)every, (unsigned long long)keys);
  h_close(&h);

  snprintf(name, sizeof name, "lookup 1 key (10 rows) in %lluk", (unsigned long long)n / 1000);
  r = res_new("params", name, "bs");
  snprintf(r->unit, sizeof r->unit, "lookups/s");
  if (h_open(&h, "params.bs", 0, 0, 0, r, &err)) goto out;
  {
    uint64_t s = c->seed;
    mem_sampler_start();
    t0 = now_s();
    for (uint64_t q = 0; q < c->param_queries; q++) {
      unsigned char key[64];
      bs_val kv;
      double tq = now_s();
      kv.data = key;
      kv.size = lookup_key(key, rng_next(&s) % keys);
      rc = bs_get_parameter_sets(h.st, cp, &kv, 1, BS_PARAM_LIMIT_DEFAULT, count_row, &rows, &err);
      if (rc != BS_OK) {
        res_fail(r, rc, "bs_get_parameter_sets", &err);
        goto out;
      }
      lat[q] = now_s() - tq;
    }
    r->secs = now_s() - t0;
    mem_sampler_stop();
  }
  r->count = (double)c->param_queries;
  r->value = r->count / r->secs;
  set_lat(r, lat, c->param_queries);
  res_mem(r);
  snprintf(r->note, sizeof r->note, "%.2f rows per lookup; latency = one call",
           (double)rows / r->count);
  g_sh->param_rows[0] = rows;
out:
  h_close(&h);
  free(lat);
  return 0;
}

/* ---- W6: compaction ---- */
int bs_compact_build(void) {
  const bench_cfg *c = g_cfg;
  uint64_t n = c->compact_rows, every = 10000;
  bres *r = res_new("compact", "build", "bs");
  bsh h;
  bs_error err;
  char full[600], inc[600];
  int rc;
  if (h_open(&h, "cmp.bs", BS_OPEN_NOSYNC, 0, 1, r, &err) || h_writer(&h, 0, every, r, &err))
    goto out;
  {
    bs_val l = {"0000000000000001", 16};
    if ((rc = bs_writer_snapshot_done(h.w, l, &err)) != BS_OK) {
      res_fail(r, rc, "bs_writer_snapshot_done", &err);
      goto out;
    }
  }
  for (uint64_t pass = 0; pass < 2; pass++)
    for (uint64_t i = 0; i < n; i++) {
      if ((rc = save_generated(h.w, pass ? BS_UPDATE : BS_INSERT, i,
                               (unsigned)(i % c->buckets_small), pass, &err)) != BS_OK) {
        res_fail(r, rc, "bs_writer_save", &err);
        goto out;
      }
      if (((i + 1) % every == 0 || i + 1 == n) && h_commit(&h, 2 + pass * n + i, NULL, r, &err))
        goto out;
    }
  h_close(&h);
  bench_path(full, sizeof full, "cmp_full.bs");
  bench_path(inc, sizeof inc, "cmp_inc.bs");
  if (copy_file(h.path, full) || copy_file(h.path, inc)) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "copying the store failed");
  }
  bench_path(full, sizeof full, "cmp_ns.bs");
  if (copy_file(h.path, full)) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "copying the store failed");
  }
out:
  h_close(&h);
  return r->status == BR_FAILED;
}

int bs_compaction(int mode) {
  static const char *names[] = {"full, 50% superseded", "incremental, 50% superseded",
                                "full, 50% superseded, nosync"};
  static const char *files[] = {"cmp_full.bs", "cmp_inc.bs", "cmp_ns.bs"};
  int incremental = mode == 1;
  bres *r = res_new("compact", names[mode], "bs");
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs;
  bsh h;
  bs_error err;
  double before, after, fb = 0, fa = 0, t0;
  int rc;
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (h_open(&h, files[mode], mode == 2 ? BS_OPEN_NOSYNC : 0, 0, 0, r, &err)) goto out;
  before = stored_ops(h.db, &fb);
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0;
  o.incremental_only = incremental;
  o.min_age_ms = 0;
  o.memory_limit_mb = g_cfg->compact_memory_mb;
  memset(&cs, 0, sizeof cs);
  mem_sampler_start();
  t0 = now_s();
  rc = bs_compact(&cs, h.st, &o, &err);
  r->secs = now_s() - t0;
  mem_sampler_stop();
  if (rc != BS_OK) {
    res_fail(r, rc, "bs_compact", &err);
    goto out;
  }
  after = stored_ops(h.db, &fa);
  r->count = before;
  r->value = before / r->secs;
  res_mem(r);
  r->bytes_per_op = fa / after;
  snprintf(r->note, sizeof r->note,
           "ops %.0f -> %.0f (moved %llu, cleared %llu, removed %llu), "
           "op bytes %llu -> %llu, file %.0f MB; anon peak %.1f MB",
           before, after, (unsigned long long)cs.ops_moved, (unsigned long long)cs.ops_cleared,
           (unsigned long long)cs.ops_removed, (unsigned long long)cs.bytes_before,
           (unsigned long long)cs.bytes_after, fa / 1048576.0, r->anon_peak_mb);
out:
  h_close(&h);
  return 0;
}
