/*
 * pg_compact.c: the PostgreSQL backend's compaction primitives (contract.md section 6) for the
 * loop of compact_run.c, which decides what is compacted in what order and reports progress.
 * Every decision about an op (MOVE, CLEAR, what initial replication deletes, which parameter
 * entries go) comes from compact.c, as for the other backends; this file walks the tables by
 * keyset and owns the transactions.
 *
 * One compaction of a stream at a time: a call holds the stream's session advisory lock
 * (BS_PG_LOCK_COMPACT) on its connection for its whole run, so a second one (in this or another process
 * or host) waits for it. Ops at or below the horizon then change only through this call (a
 * writer appends above the op head; a clear deletes the bucket's rows, and the updates below then
 * find nothing), so the read-only scans between write transactions see what the writes will
 * change. Every write transaction changes at most max_ops_per_txn ops and leaves each bucket
 * consistent on its own:
 *  - a MOVE is an UPDATE of its row (same key, same checksum, the payload columns NULL);
 *  - a fold deletes the first k - 1 ops of the leading run and turns the k-th into the CLEAR, so
 *    an interrupted fold leaves a shorter run starting with a CLEAR (the next share folds it);
 *  - the bucket state (count, bytes, generation, the CLEAR's torn span) is updated by deltas in
 *    the same transaction as its ops, so a writer's concurrent appends are never overwritten,
 *    once, as the transaction's last statement (state_write says why).
 * Memory: one page of ops (without their data), one of log entries, a transaction's writes
 * (max_ops_per_txn of each kind) and the seen-set bounded by memory_limit_mb; a bucket is never
 * read whole.
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#define PAGE         10000 /* ops or entries read per statement */
#define VISIT_FACTOR 8u    /* ops visited per changed op in one transaction, as LMDB */

typedef struct pgroup pgroup;

typedef struct cctx {
  bs__pg_db *db;
  bs_storage *st;
  PGconn *c; /* holding the stream's compaction lock (compact_stream) */
  uint32_t stream;
  bs_compact_options o; /* resolved */
  bs_compact_stats *stats;
  bs__seen_set *seen; /* the run's */
  bs__compact_run *run;
  bs_error *err;
  const bs_allocator *a;
  pgroup *g; /* the parameter pass: where it stopped */
} cctx;

/* ---- Statements ------------------------------------------------------------------------------ */

static int nomem(cctx *c) {
  return bs__fail(c->err, BS_ENOMEM, "compact: out of memory");
}

static int exec(cctx *c, const char *sql, const bs__pg_args *a, PGresult **r, const char *what) {
  return bs__pg_exec(c->c, sql, a, r, what, c->err);
}

static int run(cctx *c, const char *sql, const bs__pg_args *a, const char *what) {
  return bs__pg_run(c->c, sql, a, what, c->err);
}

static int begin(cctx *c) {
  return bs__pg_begin_write(c->db, c->c, NULL, c->err);
}

/* Commits the transaction (rolled back on failure) and reports progress. */
static int commit(cctx *c, int rc) {
  if (!rc) rc = bs__pg_commit(c->c, c->err);
  if (rc) {
    bs__pg_rollback(c->c);
    return rc;
  }
  return bs__compact_report(c->run);
}

/* An op as the planner sees it: op i of an ops page (borrowed from the page's chunks), and its
 * payload bytes. */
static bs_op op_of(const bs__pg_opset *r, int i, uint64_t *bytes) {
  if (bytes) *bytes = r->bytes[i];
  return r->ops[i];
}

/* Ops of bucket with lo <= op_id <= hi, at most limit, ascending or descending (from hi). */
static int ops_page(cctx *c, uint64_t bucket, uint64_t lo, uint64_t hi, int desc, size_t limit,
                    bs__pg_opset *r) {
  return bs__pg_opset_page(c->c, c->a, r, bucket, lo, hi, desc, limit, c->err);
}

/* ---- Bucket state ---------------------------------------------------------------------------- */

/* The bucket's stored torn span (0/0 when the bucket is gone). Only compaction, one at a time,
 * writes it: a plain read in the transaction is the value its UPDATE replaces. */
static int span_load(cctx *c, uint64_t bucket, uint64_t *start, uint64_t *op) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  *start = *op = 0;
  bs__pg_arg_i64(&a, (int64_t)bucket);
  if ((rc = exec(c, "SELECT clear_start, clear_op FROM bs_buckets WHERE id = $1", &a, &r,
                 "compact: bucket state")))
    return rc;
  if (PQntuples(r) == 1) {
    *start = (uint64_t)bs__pg_i64(r, 0, 0);
    *op = (uint64_t)bs__pg_i64(r, 0, 1);
  }
  PQclear(r);
  return BS_OK;
}

/* What a transaction's phases did to its bucket's state, written by state_write. */
typedef struct pstate {
  bs__compact_delta d; /* the sums of the phases' deltas (count, bytes, checksum_sub, flags) */
  int span;            /* start/op: the torn span to store */
  uint64_t start, op;
} pstate;

static int state_add(cctx *c, uint64_t bucket, pstate *s, const bs__compact_delta *d) {
  int rc;
  if (d->clear.n >= BS_CLEAR_MIN_RUN || d->clear_dropped) { /* compact.c's rule, phase by phase */
    if (!s->span && (rc = span_load(c, bucket, &s->start, &s->op))) return rc;
    s->span = 1;
    bs__compact_span(d, &s->start, &s->op);
  }
  s->d.count += d->count;
  s->d.bytes += d->bytes;
  s->d.checksum_sub = bs__cksum_add(s->d.checksum_sub, d->checksum_sub);
  s->d.changed |= d->changed;
  s->d.deleted |= d->deleted;
  s->d.mark |= d->mark; /* the job's last phase: the mark takes the figures after the others */
  return BS_OK;
}

/* The transaction's changes to the bucket's state by deltas (a writer may have appended
 * meanwhile; a bucket cleared meanwhile has no row left to update), and its mark at the
 * horizon: one UPDATE, the transaction's last statement. A writer's flush locks the stream row,
 * then its buckets' rows; updating a row a second time in one transaction (a row version of its
 * own) makes PostgreSQL's foreign-key check lock the stream row (KEY SHARE) while this
 * transaction holds the bucket's row: a deadlock with such a flush. */
static int state_write(cctx *c, uint64_t bucket, pstate *s) {
  bs__pg_args a = {0};
  int rc;
  if (!s->d.changed && !s->d.mark) return BS_OK;
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, s->d.count);
  bs__pg_arg_i64(&a, s->d.bytes);
  bs__pg_arg_i64(&a, (int64_t)s->d.checksum_sub);
  bs__pg_arg_bool(&a, s->span);
  bs__pg_arg_i64(&a, (int64_t)s->start);
  bs__pg_arg_i64(&a, (int64_t)s->op);
  bs__pg_arg_bool(&a, s->d.deleted);
  bs__pg_arg_bool(&a, s->d.changed);
  bs__pg_arg_bool(&a, s->d.mark);
  bs__pg_arg_i64(&a, (int64_t)c->run->horizon);
  rc = run(c,
           "UPDATE bs_buckets SET count = count + $2, bytes = bytes + $3,"
           " checksum = (checksum - $4 + 4294967296) % 4294967296,"
           " generation = generation + $9::int,"
           " clear_start = CASE WHEN $5 THEN $6 ELSE clear_start END,"
           " clear_op = CASE WHEN $5 THEN $7 ELSE clear_op END,"
           " last_op = coalesce(n.last, last_op),"
           " compacted_count = CASE WHEN $10 THEN count + $2 ELSE compacted_count END,"
           " compacted_op = CASE WHEN $10 THEN least($11, coalesce(n.last, last_op))"
           "  ELSE compacted_op END"
           " FROM (SELECT CASE WHEN $8 THEN coalesce((SELECT max(last_op) FROM bs_chunks"
           "  WHERE bucket = $1), 0) END AS last) n"
           " WHERE id = $1",
           &a, "compact: bucket state");
  memset(s, 0, sizeof *s);
  return rc;
}

typedef struct bstate {
  int exists;
  uint64_t count, bytes, last_op, compacted_count, compacted_op;
} bstate;

static int state_load(cctx *c, uint64_t bucket, bstate *b) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  memset(b, 0, sizeof *b);
  bs__pg_arg_i64(&a, (int64_t)bucket);
  rc = exec(c,
            "SELECT count, bytes, last_op, compacted_count, compacted_op FROM bs_buckets"
            " WHERE id = $1",
            &a, &r, "compact: bucket state");
  if (rc) return rc;
  if ((b->exists = PQntuples(r) == 1)) {
    b->count = (uint64_t)bs__pg_i64(r, 0, 0);
    b->bytes = (uint64_t)bs__pg_i64(r, 0, 1);
    b->last_op = (uint64_t)bs__pg_i64(r, 0, 2);
    b->compacted_count = (uint64_t)bs__pg_i64(r, 0, 3);
    b->compacted_op = (uint64_t)bs__pg_i64(r, 0, 4);
  }
  PQclear(r);
  return BS_OK;
}

/* ---- Writes ---------------------------------------------------------------------------------- */

/* MOVEs: ids[i] becomes a MOVE to targets[i] (a PUT or REMOVE still: the checksum stays),
 * inside the chunks that hold them. */
static int write_moves(cctx *c, uint64_t bucket, const uint64_t *ids, const uint64_t *targets,
                       size_t n) {
  bs__pg_edit *e = bs__calloc(c->a, n, sizeof *e);
  uint64_t del, ed;
  int rc;
  if (!e) return nomem(c);
  for (size_t i = 0; i < n; i++) {
    e[i].lo = e[i].hi = ids[i];
    e[i].target = targets[i];
    e[i].kind = BS_PG_EDIT_MOVE;
  }
  rc = bs__pg_chunks_edit(c->c, c->a, bucket, e, n, &del, &ed, c->err);
  bs__free(c->a, e);
  return rc;
}

/* The fold of clear (n ops, the first of the bucket, ending at last_op): deletes all but the
 * last, which becomes the CLEAR. BS_ECORRUPT when the run changed under it. */
static int write_fold(cctx *c, uint64_t bucket, const bs__clear_acc *clear) {
  bs__pg_edit e[2];
  uint64_t del, ed;
  size_t n = 0;
  int rc;
  memset(e, 0, sizeof e);
  if (clear->first_op < clear->last_op) {
    e[n].lo = clear->first_op;
    e[n].hi = clear->last_op - 1;
    e[n++].kind = BS_PG_EDIT_DELETE;
  }
  e[n].lo = e[n].hi = clear->last_op;
  e[n].clear = clear;
  e[n++].kind = BS_PG_EDIT_CLEAR;
  if ((rc = bs__pg_chunks_edit(c->c, c->a, bucket, e, n, &del, &ed, c->err))) return rc;
  if (del + 1 != clear->n || ed != 1)
    rc = bs__fail(c->err, BS_ECORRUPT, "bucket id %" PRIu64 ": leading run changed under the fold",
                  bucket);
  return rc;
}

/* Deletes ops ids[0..n) (initial replication). */
static int write_deletes(cctx *c, uint64_t bucket, const uint64_t *ids, size_t n) {
  bs__pg_edit *e = bs__calloc(c->a, n, sizeof *e);
  uint64_t del, ed;
  int rc;
  if (!e) return nomem(c);
  for (size_t i = 0; i < n; i++) {
    e[i].lo = e[i].hi = ids[i];
    e[i].kind = BS_PG_EDIT_DELETE;
  }
  rc = bs__pg_chunks_edit(c->c, c->a, bucket, e, n, &del, &ed, c->err);
  bs__free(c->a, e);
  return rc;
}

/* ---- The superseded log (bs_superseded: rows of varint pairs, pg_internal.h) ----------------- */

/* Ops or entries visited for one transaction's changes: VISIT_FACTOR per change, as LMDB, but
 * never more than a page (a result set is held whole: 8 x 10000 ops took 20 MB). */
static size_t visit_page(const cctx *c) {
  size_t max = c->o.max_ops_per_txn;
  return max < PAGE / VISIT_FACTOR ? max * VISIT_FACTOR : PAGE;
}

#define SUP_ROWS 16 /* log rows read per statement (each at most BS_PG_SUP_ROW entries) */

typedef struct sent {
  uint64_t old_op, new_op;
} sent;

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

static int cmp_sent(const void *x, const void *y) {
  const sent *a = x, *b = y;
  return a->old_op < b->old_op ? -1 : a->old_op > b->old_op;
}

/* Keeps in the max-heap h (by old op, *n of at most m) the m lowest entries offered. */
static void heap_offer(sent *h, size_t *n, size_t m, sent e) {
  size_t i;
  if (*n == m) {
    if (e.old_op >= h[0].old_op) return;
    for (i = 0;;) { /* the root goes: e sifts down from it */
      size_t k = 2 * i + 1;
      if (k >= m) break;
      if (k + 1 < m && h[k + 1].old_op > h[k].old_op) k++;
      if (h[k].old_op <= e.old_op) break;
      h[i] = h[k];
      i = k;
    }
  } else
    for (i = (*n)++; i && h[(i - 1) / 2].old_op < e.old_op; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
  h[i] = e;
}

/* The next page of the bucket's log rows that can hold an entry due at the horizon (first_new
 * at or below it), after the row keyed *after (advanced). */
static int sups_page(cctx *c, uint64_t bucket, uint64_t horizon, int64_t *after, PGresult **r) {
  bs__pg_args a = {0};
  int rc, n;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, *after);
  bs__pg_arg_i64(&a, (int64_t)horizon);
  bs__pg_arg_i32(&a, SUP_ROWS);
  if ((rc = exec(c,
                 "SELECT first_new, pairs FROM bs_superseded WHERE stream = $1 AND bucket = $2"
                 " AND first_new > $3 AND first_new <= $4 ORDER BY first_new LIMIT $5",
                 &a, r, "compact: superseded entries")))
    return rc;
  if ((n = PQntuples(*r))) *after = bs__pg_i64(*r, n - 1, 0);
  return BS_OK;
}

static int sups_corrupt(cctx *c, uint64_t bucket, int64_t first) {
  return bs__fail(c->err, BS_ECORRUPT,
                  "compact: bucket %" PRIu64 ": the superseded log row at %" PRId64
                  " does not decode",
                  bucket, first);
}

/* The bucket's log entries due at the horizon with an old op above pos: the (at most) m lowest
 * by old op, ascending, in e[0..*n). Memory: a page of rows and e. */
static int sups_select(cctx *c, uint64_t bucket, uint64_t horizon, uint64_t pos, sent *e, size_t m,
                       size_t *n) {
  int64_t after = -1;
  int rc = BS_OK, rows = SUP_ROWS;
  *n = 0;
  while (!rc && rows == SUP_ROWS) {
    PGresult *r;
    if ((rc = sups_page(c, bucket, horizon, &after, &r))) break;
    rows = PQntuples(r);
    for (int i = 0; i < rows && !rc; i++) {
      bs__pg_sups it;
      sent x;
      int k;
      bs__pg_sups_open(&it, bs__pg_bytes(r, i, 1), (uint64_t)bs__pg_i64(r, i, 0));
      while ((k = bs__pg_sups_next(&it, &x.old_op, &x.new_op)) == 1)
        if (x.old_op > pos && bs__compact_entry_due(x.new_op, horizon)) heap_offer(e, n, m, x);
      if (k) rc = sups_corrupt(c, bucket, bs__pg_i64(r, i, 0));
    }
    PQclear(r);
  }
  qsort(e, *n, sizeof *e, cmp_sent);
  return rc;
}

/* In the caller's transaction: the bucket's log entries due at the horizon with an old op among
 * olds[0..n) (ascending) go; a row that held any is rewritten with the rest, or deleted when none
 * is left. */
static int sups_consume(cctx *c, uint64_t bucket, uint64_t horizon, const uint64_t *olds,
                        size_t n) {
  int64_t after = -1;
  int rc = BS_OK, rows = SUP_ROWS;
  uint64_t keys[SUP_ROWS], gone[SUP_ROWS];
  bs_val vals[SUP_ROWS];
  unsigned char *out = NULL;
  while (!rc && rows == SUP_ROWS) {
    PGresult *r;
    size_t nk = 0, ng = 0, size = 0;
    unsigned char *p;
    if ((rc = sups_page(c, bucket, horizon, &after, &r))) break;
    rows = PQntuples(r);
    /* what is left of a row never takes more bytes than the row: the next entry's old-op delta
     * grows by fewer bytes than the entry that goes took */
    for (int i = 0; i < rows; i++) size += (size_t)PQgetlength(r, i, 1);
    bs__free(c->a, out);
    if (!(p = out = bs__malloc(c->a, size + 1))) rc = nomem(c);
    for (int i = 0; i < rows && !rc; i++) {
      uint64_t first = (uint64_t)bs__pg_i64(r, i, 0), prev = 0, o, nw;
      unsigned char *start = p;
      bs__pg_sups it;
      int k, drop = 0;
      bs__pg_sups_open(&it, bs__pg_bytes(r, i, 1), first);
      while ((k = bs__pg_sups_next(&it, &o, &nw)) == 1) {
        if (bs__compact_entry_due(nw, horizon) && bsearch(&o, olds, n, sizeof o, cmp_u64))
          drop = 1;
        else
          p = bs__pg_sups_put(p, &prev, first, o, nw);
      }
      if (k) rc = sups_corrupt(c, bucket, (int64_t)first);
      if (rc || !drop) {
        p = start;
        continue;
      }
      if (p == start)
        gone[ng++] = first;
      else {
        keys[nk] = first;
        vals[nk].data = start;
        vals[nk++].size = (size_t)(p - start);
      }
    }
    if (!rc && nk) {
      bs__pg_args a = {0};
      unsigned char *b1 = NULL, *b2 = NULL;
      bs__pg_arg_i32(&a, (int32_t)c->stream);
      bs__pg_arg_i64(&a, (int64_t)bucket);
      if (!(rc = bs__pg_arg_i64_array(&a, keys, nk, c->a, &b1, c->err)) &&
          !(rc = bs__pg_arg_bytes_array(&a, vals, nk, c->a, &b2, c->err)))
        rc = run(c,
                 "UPDATE bs_superseded s SET pairs = u.p FROM unnest($3::int8[], $4::bytea[])"
                 " AS u(k, p) WHERE s.stream = $1 AND s.bucket = $2 AND s.first_new = u.k",
                 &a, "compact: consuming superseded entries");
      bs__free(c->a, b1);
      bs__free(c->a, b2);
    }
    PQclear(r);
    if (!rc && ng) {
      bs__pg_args a = {0};
      unsigned char *b1 = NULL;
      bs__pg_arg_i32(&a, (int32_t)c->stream);
      bs__pg_arg_i64(&a, (int64_t)bucket);
      if (!(rc = bs__pg_arg_i64_array(&a, gone, ng, c->a, &b1, c->err)))
        rc = run(c,
                 "DELETE FROM bs_superseded WHERE stream = $1 AND bucket = $2"
                 " AND first_new = ANY($3)",
                 &a, "compact: consuming superseded entries");
      bs__free(c->a, b1);
    }
  }
  bs__free(c->a, out);
  return rc;
}

/* Initial replication: every transaction that deletes checks that the stream still has no
 * checkpoint. */
static int still_initial(cctx *c) {
  bs__pg_args a = {0};
  PGresult *r;
  bs__stream_row s = {0};
  int rc;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  /* FOR SHARE: a commit (FOR UPDATE of the row) waits for this transaction */
  rc = exec(c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams WHERE id = $1 FOR SHARE", &a, &r,
            "compact: stream");
  if (rc) return rc;
  if (PQntuples(r) == 1) s = bs__pg_stream_row(r, 0).row;
  rc = bs__compact_initial_check(c->stream, s.checkpoint_lsn.data != NULL, s.checkpoint, c->err);
  PQclear(r);
  return rc;
}

/* ---- One bucket -------------------------------------------------------------------------------
 * The job's bucket (bs__op_cursor): its ops a page at a time, up or down; its log's due entries
 * a page at a time (sups_select), with their ops (get) read in one statement per page. Writes are
 * collected and applied by apply in the transaction, which begins with the first of them; each
 * kind in one statement (the bulk executors: write_fold, write_moves, write_deletes,
 * sups_consume). Pages read before a write are read again after it. */
typedef struct pcur {
  cctx *c;
  uint64_t bucket;
  bs__pg_opset r; /* the ops page (rread 0: none read) */
  int rread, i, n, desc;
  bs__pg_opset g; /* the ops of the entries page (get, gread), up to op id ghi */
  int gread;
  int gi;
  uint64_t ghi;
  sent *e; /* the entries page: due entries with an old op > elo */
  size_t ne, ei, max;
  uint64_t elo;
  int eread;
  uint64_t *del, *mid, *mtg, *cons; /* writes: deletes, MOVEs (id, target), consumed entries */
  size_t ndel, nm, ncons;
  const bs__clear_acc *fold; /* the fold (borrowed from the walk's delta until apply) */
  pstate state;              /* the transaction's changes to the bucket's state */
  int txn;
} pcur;

static uint64_t pcur_id(const pcur *p, int i) {
  return op_of(&p->r, i, NULL).op_id;
}

static int pcur_at(pcur *p, bs_op *op, uint64_t *size, int *found) {
  if ((*found = p->i < p->n)) *op = op_of(&p->r, p->i, size);
  return BS_OK;
}

/* A page from pos on in the direction asked. */
static int pcur_read(pcur *p, uint64_t pos, int desc) {
  int rc;
  bs__pg_opset_clear(&p->r);
  p->rread = 0;
  p->i = p->n = 0;
  p->desc = desc;
  if (desc && pos == 0) return BS_OK;
  if ((rc = ops_page(p->c, p->bucket, desc ? 0 : pos, desc ? pos : UINT64_MAX >> 1, desc, PAGE,
                     &p->r)))
    return rc;
  p->rread = 1;
  p->n = (int)p->r.n;
  return BS_OK;
}

/* From the current row on within the page when pos lies ahead of it (a walk only goes one way),
 * else a page from pos. */
static int pcur_seek(pcur *p, uint64_t pos, int desc, bs_op *op, uint64_t *size, int *found) {
  int rc;
  if (p->rread && p->desc == desc && p->i < p->n &&
      (desc ? pcur_id(p, p->i) >= pos : pcur_id(p, p->i) <= pos)) {
    while (p->i < p->n && (desc ? pcur_id(p, p->i) > pos : pcur_id(p, p->i) < pos)) p->i++;
    if (p->i < p->n || p->n < PAGE) return pcur_at(p, op, size, found); /* a short page: the end */
  }
  if ((rc = pcur_read(p, pos, desc))) return rc;
  return pcur_at(p, op, size, found);
}

static int pcur_seek_le(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  return pcur_seek(x, pos, 1, op, size, found);
}

static int pcur_seek_ge(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  return pcur_seek(x, pos, 0, op, size, found);
}

static int pcur_step(pcur *p, bs_op *op, uint64_t *size, int *found) {
  int rc;
  if (++p->i == p->n && p->n == PAGE) { /* a full page: more beyond it */
    uint64_t last = pcur_id(p, p->n - 1);
    if ((rc = pcur_read(p, p->desc ? last - 1 : last + 1, p->desc))) return rc;
  }
  return pcur_at(p, op, size, found);
}

static int pcur_prev(void *x, bs_op *op, uint64_t *size, int *found) {
  return pcur_step(x, op, size, found);
}

static int pcur_next(void *x, bs_op *op, uint64_t *size, int *found) {
  return pcur_step(x, op, size, found);
}

/* The op id exactly, among the ops of the entries page from the current entry on (up to ghi),
 * read in one statement. */
static int pcur_get(void *x, uint64_t id, bs_op *op, uint64_t *size, int *found) {
  pcur *p = x;
  int rc, n = p->gread ? (int)p->g.n : 0;
  if (!p->gread || id > p->ghi) {
    uint64_t *olds = p->del; /* free: deletes are initial replication's, which gets no op */
    size_t k = 0;
    for (size_t i = p->ei; i < p->ne; i++) olds[k++] = p->e[i].old_op;
    p->gread = 0;
    p->gi = 0;
    p->ghi = k ? olds[k - 1] : id;
    if ((rc = bs__pg_opset_ids(p->c->c, p->c->a, &p->g, p->bucket, olds, k, p->c->err))) return rc;
    p->gread = 1;
    n = (int)p->g.n;
  }
  while (p->gi < n && op_of(&p->g, p->gi, NULL).op_id < id) p->gi++;
  if ((*found = p->gi < n && op_of(&p->g, p->gi, NULL).op_id == id))
    *op = op_of(&p->g, p->gi, size);
  return BS_OK;
}

static int pcur_del(void *x) {
  pcur *p = x;
  p->del[p->ndel++] = pcur_id(p, p->i);
  return BS_OK;
}

static int pcur_move(void *x, const bs_op *op, uint64_t target) {
  pcur *p = x;
  p->mid[p->nm] = op->op_id;
  p->mtg[p->nm++] = target;
  return BS_OK;
}

static int pcur_fold(void *x, const bs__clear_acc *clear) {
  ((pcur *)x)->fold = clear;
  return BS_OK;
}

static int pcur_sup_at(pcur *p, uint64_t *old, uint64_t *nw, int *found) {
  if ((*found = p->ei < p->ne)) {
    *old = p->e[p->ei].old_op;
    *nw = p->e[p->ei].new_op;
  }
  return BS_OK;
}

/* The entries page from old on: the one held when old lies in it, else a new one. */
static int pcur_sup_seek(void *x, uint64_t old, uint64_t *old_out, uint64_t *nw, int *found) {
  pcur *p = x;
  int rc;
  if (!p->eread || old <= p->elo || (p->ne == p->max && p->e[p->ne - 1].old_op < old)) {
    p->elo = old ? old - 1 : 0;
    p->eread = 1;
    p->ei = 0;
    if ((rc = sups_select(p->c, p->bucket, p->c->run->horizon, p->elo, p->e, p->max, &p->ne)))
      return rc;
  }
  for (p->ei = 0; p->ei < p->ne && p->e[p->ei].old_op < old;) p->ei++;
  return pcur_sup_at(p, old_out, nw, found);
}

static int pcur_sup_next(void *x, uint64_t *old, uint64_t *nw, int *found) {
  pcur *p = x;
  if (++p->ei == p->ne && p->ne == p->max) /* a full page: more beyond it */
    return pcur_sup_seek(x, p->e[p->ne - 1].old_op + 1, old, nw, found);
  return pcur_sup_at(p, old, nw, found);
}

static int pcur_sup_del(void *x) {
  pcur *p = x;
  p->cons[p->ncons++] = p->e[p->ei].old_op;
  return BS_OK;
}

/* The transaction, begun at its first write. */
static int pcur_begin(pcur *p) {
  int rc;
  if (p->txn) return BS_OK;
  if ((rc = begin(p->c))) return rc;
  p->txn = 1;
  return p->c->run->mode == BS__COMPACT_INITIAL ? still_initial(p->c) : BS_OK;
}

/* The collected writes, in the transaction; the pages held are read again after them. */
static int pcur_flush(pcur *p) {
  cctx *c = p->c;
  int rc;
  if (!p->fold && !p->nm && !p->ndel && !p->ncons) return BS_OK;
  if ((rc = pcur_begin(p))) return rc;
  if (p->fold) rc = write_fold(c, p->bucket, p->fold);
  if (!rc && p->nm) rc = write_moves(c, p->bucket, p->mid, p->mtg, p->nm);
  if (!rc && p->ndel) rc = write_deletes(c, p->bucket, p->del, p->ndel);
  if (p->ncons) qsort(p->cons, p->ncons, sizeof *p->cons, cmp_u64);
  if (!rc && p->ncons) rc = sups_consume(c, p->bucket, c->run->horizon, p->cons, p->ncons);
  p->fold = NULL;
  p->nm = p->ndel = p->ncons = 0;
  bs__pg_opset_clear(&p->r);
  bs__pg_opset_clear(&p->g);
  p->rread = p->gread = 0;
  p->eread = 0;
  return rc;
}

static int pcur_start(void *x, uint64_t *bytes, int *exists) {
  pcur *p = x;
  bstate b;
  int rc = state_load(p->c, p->bucket, &b);
  *exists = b.exists;
  *bytes = b.bytes;
  return rc;
}

static int pcur_apply(void *x, const bs__compact_delta *d) {
  pcur *p = x;
  int rc = pcur_begin(p);
  if (!rc) rc = pcur_flush(p);
  if (!rc) rc = state_add(p->c, p->bucket, &p->state, d);
  if (!rc) bs__pg_hook(p->c->db, "compact.apply", p->c->c);
  return rc;
}

static const bs__op_cursor pcur_ops = {
    pcur_seek_le,  pcur_prev,    pcur_seek_ge,
    pcur_next,     pcur_get,     pcur_del,
    pcur_move,     pcur_fold,    pcur_sup_seek,
    pcur_sup_next, pcur_sup_del, NULL,
    pcur_start,    pcur_apply,   0 /* a MOVE or CLEAR has no payload bytes */};

/* Step: one bucket's job, a transaction at a time (each reports progress as it commits). */
static int compact_step(void *x, bs__compact_run *r) {
  cctx *c = x;
  size_t max = c->o.max_ops_per_txn;
  pcur p;
  bs__compact_job j;
  int rc = BS_OK;
  memset(&p, 0, sizeof p);
  memset(&j, 0, sizeof j);
  c->seen = &r->seen;
  c->run = r;
  p.c = c;
  p.bucket = r->ids[r->i];
  p.max = max;
  if (!(p.e = bs__calloc(c->a, max, sizeof *p.e)) || !(p.del = bs__calloc(c->a, max, 8)) ||
      !(p.mid = bs__calloc(c->a, max, 8)) || !(p.mtg = bs__calloc(c->a, max, 8)) ||
      !(p.cons = bs__calloc(c->a, max, 8)))
    rc = nomem(c);
  while (!rc && j.phase != BS__JOB_DONE) {
    bs__compact_txn t = {0, 0, max, max > SIZE_MAX / VISIT_FACTOR ? SIZE_MAX : max * VISIT_FACTOR};
    rc = bs__compact_job_run(&pcur_ops, &p, r, &t, &j, &r->budget, &r->processed);
    if (!rc) rc = pcur_flush(&p); /* entries consumed with no change to the bucket */
    if (!rc && p.txn) rc = state_write(c, p.bucket, &p.state);
    if (p.txn) rc = commit(c, rc);
    p.txn = 0;
  }
  bs__pg_opset_free(&p.r, c->a);
  bs__pg_opset_free(&p.g, c->a);
  bs__free(c->a, p.e);
  bs__free(c->a, p.del);
  bs__free(c->a, p.mid);
  bs__free(c->a, p.mtg);
  bs__free(c->a, p.cons);
  if (!rc) r->i++;
  return rc;
}

/* Buckets in name order with their figures: the one named name (exact) or up to a batch after
 * it, into out[*n...]; *last: the last one's name (cur->name, at most its size). */
#define BUCKETS_SQL(where)                                                                         \
  "SELECT id, count, compacted_count, last_op, compacted_op,"                                      \
  " coalesce((SELECT first_op FROM bs_chunks WHERE bucket = b.id ORDER BY last_op LIMIT 1), 0),"   \
  " name"                                                                                          \
  " FROM bs_buckets b WHERE stream = $1 AND " where " ORDER BY name LIMIT $3"

static int buckets_read(cctx *c, int exact, bs__compact_cursor *cur, bs_val name,
                        bs__compact_bucket *out, size_t *n) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc, rows;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_bytes(&a, name);
  bs__pg_arg_i32(&a, BS__COMPACT_BATCH);
  if ((rc = exec(c, exact ? BUCKETS_SQL("name = $2") : BUCKETS_SQL("name > $2"), &a, &r,
                 "compact: buckets")))
    return rc;
  rows = PQntuples(r);
  cur->done = rows < BS__COMPACT_BATCH;
  for (int i = 0; i < rows; i++) {
    bs_val last = bs__pg_bytes(r, i, 6);
    bs__compact_bucket *e = &out[(*n)++];
    e->id = (uint64_t)bs__pg_i64(r, i, 0);
    e->count = (uint64_t)bs__pg_i64(r, i, 1);
    e->compacted_count = (uint64_t)bs__pg_i64(r, i, 2);
    e->last_op = (uint64_t)bs__pg_i64(r, i, 3);
    e->compacted_op = (uint64_t)bs__pg_i64(r, i, 4);
    e->first_op = (uint64_t)bs__pg_i64(r, i, 5);
    if (i + 1 == rows && last.size <= sizeof cur->name) {
      memcpy(cur->name, last.data, last.size);
      cur->name_size = last.size;
    }
  }
  PQclear(r);
  return BS_OK;
}

static int compact_find(void *x, bs_val name, bs__compact_bucket *out, int *found, bs_error *err) {
  bs__compact_cursor cur;
  size_t n = 0;
  int rc;
  (void)err;
  memset(&cur, 0, sizeof cur);
  rc = buckets_read(x, 1, &cur, name, out, &n);
  *found = n == 1;
  return rc;
}

/* The buckets with logged entries after bucket id cur->from, in id order (a loose index scan of
 * bs_superseded). */
static int list_queued(cctx *c, bs__compact_cursor *cur, bs__compact_bucket *out, size_t *n) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc, rows;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_i64(&a, (int64_t)cur->from);
  bs__pg_arg_i32(&a, BS__COMPACT_BATCH);
  if ((rc = exec(c,
                 "WITH RECURSIVE q(b) AS ("
                 " SELECT (SELECT min(bucket) FROM bs_superseded WHERE stream = $1"
                 "  AND bucket > $2)"
                 " UNION ALL SELECT (SELECT min(bucket) FROM bs_superseded WHERE stream = $1"
                 "  AND bucket > q.b) FROM q WHERE q.b IS NOT NULL)"
                 " SELECT b FROM q WHERE b IS NOT NULL LIMIT $3",
                 &a, &r, "compact: queued buckets")))
    return rc;
  rows = PQntuples(r);
  cur->done = rows < BS__COMPACT_BATCH;
  for (int i = 0; i < rows; i++) {
    memset(&out[*n], 0, sizeof out[*n]);
    out[(*n)++].id = cur->from = (uint64_t)bs__pg_i64(r, i, 0);
  }
  PQclear(r);
  return BS_OK;
}

static int compact_list(void *x, int queued, bs__compact_cursor *cur, bs__compact_bucket *out,
                        size_t *n, bs_error *err) {
  (void)err;
  *n = 0;
  if (queued) return list_queued(x, cur, out, n);
  return buckets_read(x, 0, cur, (bs_val){cur->name, cur->name_size}, out, n);
}

static int compact_defragment(void *x, bs__compact_run *r, uint64_t *ids, size_t n) {
  cctx *c = x;
  c->run = r;
  return bs__pg_defragment(&c->o, c->c, c->st, ids, n, r->horizon, c->stats, c->err);
}

/* ---- Parameter compaction ---------------------------------------------------------------------
 * The stream's entries at or below the horizon by (lookup, table, replica id), newest first, a
 * page at a time (keyset); compact.c's bs__compact_param_drop decides, a transaction deletes. The
 * parameter horizon and the change fence are raised first (a reader below them gets BS_ESTALE
 * rather than a half-compacted answer); the cursor, after the pass, says the pass is complete. */

struct pgroup {
  unsigned char lookup[BS_MAX_LOOKUP_KEY], rid[BS_MAX_REPLICA_ID];
  size_t lookup_size, rid_size;
  int32_t table;
  int64_t op;
  int any;
};

static int same_group(const pgroup *g, bs_val lookup, int32_t table, bs_val rid) {
  return g->any && g->table == table && g->lookup_size == lookup.size && g->rid_size == rid.size &&
         (!lookup.size || !memcmp(g->lookup, lookup.data, lookup.size)) &&
         (!rid.size || !memcmp(g->rid, rid.data, rid.size));
}

static int params_page(cctx *c, uint64_t horizon, pgroup *g, int *done) {
  size_t max = c->o.max_ops_per_txn;
  bs__pg_args a = {0};
  PGresult *r;
  bs_val *lk = NULL;
  uint64_t *ops = NULL;
  unsigned char *b1 = NULL, *b2 = NULL;
  size_t n = 0;
  int rc, rows;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_i64(&a, (int64_t)horizon);
  bs__pg_arg_bytes(&a, (bs_val){g->lookup, g->lookup_size});
  bs__pg_arg_i32(&a, g->table);
  bs__pg_arg_bytes(&a, (bs_val){g->rid, g->rid_size});
  bs__pg_arg_i64(&a, g->op);
  bs__pg_arg_bool(&a, g->any);
  bs__pg_arg_i64(&a, (int64_t)visit_page(c));
  rc = exec(c,
            "SELECT lookup, table_id, replica_id, op_id, cardinality(rows) FROM bs_params"
            " WHERE stream = $1 AND op_id <= $2"
            " AND (NOT $7 OR (lookup, table_id, replica_id, -op_id) > ($3, $4, $5, -$6))"
            " ORDER BY lookup, table_id, replica_id, op_id DESC LIMIT $8",
            &a, &r, "compact: parameter entries");
  if (rc) return rc;
  rows = PQntuples(r);
  *done = (size_t)rows < visit_page(c);
  if (!(lk = bs__calloc(c->a, max, sizeof *lk)) || !(ops = bs__calloc(c->a, max, sizeof *ops)))
    rc = nomem(c);
  for (int i = 0; i < rows && !rc; i++) {
    bs_val lookup = bs__pg_bytes(r, i, 0), rid = bs__pg_bytes(r, i, 2);
    int32_t table = bs__pg_i32(r, i, 1);
    int newer = same_group(g, lookup, table, rid);
    if (lookup.size > sizeof g->lookup || rid.size > sizeof g->rid) {
      rc = bs__fail(c->err, BS_ECORRUPT, "compact: a parameter entry's key is too long");
      break;
    }
    if (!newer) {
      memcpy(g->lookup, lookup.data, lookup.size);
      memcpy(g->rid, rid.data, rid.size);
      g->lookup_size = lookup.size;
      g->rid_size = rid.size;
      g->table = table;
      g->any = 1;
    }
    g->op = bs__pg_i64(r, i, 3);
    if (bs__compact_param_drop(newer, (uint32_t)bs__pg_i32(r, i, 4))) {
      lk[n] = lookup;
      ops[n++] = (uint64_t)g->op;
    }
    if (n == max) {
      if (i + 1 < rows) *done = 0;
      break;
    }
  }
  if (!rc && n) {
    bs__pg_args d = {0};
    bs__pg_arg_i32(&d, (int32_t)c->stream);
    if (!(rc = bs__pg_arg_bytes_array(&d, lk, n, c->a, &b1, c->err)) &&
        !(rc = bs__pg_arg_i64_array(&d, ops, n, c->a, &b2, c->err)) && !(rc = begin(c))) {
      rc = run(c,
               "DELETE FROM bs_params p USING unnest($2::bytea[], $3::int8[]) AS d(l, o)"
               " WHERE p.stream = $1 AND p.lookup = d.l AND p.op_id = d.o",
               &d, "compact: deleting parameter entries");
      if (!rc) c->stats->parameter_entries_removed += n;
      rc = commit(c, rc);
    }
  }
  PQclear(r);
  bs__free(c->a, b1);
  bs__free(c->a, b2);
  bs__free(c->a, lk);
  bs__free(c->a, ops);
  return rc;
}

static int compact_param_fence(void *x, uint64_t horizon, bs_error *err) {
  bs__pg_args a = {0};
  (void)err;
  bs__pg_arg_i32(&a, (int32_t)((cctx *)x)->stream);
  bs__pg_arg_i64(&a, (int64_t)horizon);
  return run(x,
             "UPDATE bs_streams SET param_horizon = greatest(param_horizon, $2),"
             " changes_fence = greatest(changes_fence, $2) WHERE id = $1",
             &a, "compact: parameter horizon");
}

static int compact_param_step(void *x, bs__compact_run *r, int *done) {
  cctx *c = x;
  c->run = r;
  return params_page(c, r->horizon, c->g, done);
}

static int compact_param_mark(void *x, uint64_t horizon, bs_error *err) {
  bs__pg_args a = {0};
  (void)err;
  bs__pg_arg_i32(&a, (int32_t)((cctx *)x)->stream);
  bs__pg_arg_i64(&a, (int64_t)horizon);
  return run(x, "UPDATE bs_streams SET param_cursor = greatest(param_cursor, $2) WHERE id = $1", &a,
             "compact: parameter cursor");
}

/* ---- Entry points ---------------------------------------------------------------------------- */

#define LOCK_SQL   "SELECT pg_advisory_lock($1, $2)"
#define UNLOCK_SQL "SELECT pg_advisory_unlock($1, $2)"

/* Takes the stream's compaction lock on a connection of the pool and reads its record. */
static int compact_stream(void *x, bs__compact_stream *s, bs_error *err) {
  cctx *c = x;
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  if ((rc = bs__pg_conn_get(c->db, &c->c, err))) return rc;
  bs__pg_arg_lock(&a, &c->db->schema, c->stream, BS_PG_LOCK_COMPACT);
  if ((rc = run(c, LOCK_SQL, &a, "compact: locking the stream's compaction"))) {
    bs__pg_conn_drop(c->db, c->c); /* whatever its state, no lock is left behind */
    c->c = NULL;
    return rc;
  }
  a.n = 0;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  rc = exec(c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams WHERE id = $1", &a, &r,
            "compact: stream");
  if (rc) return rc;
  if (PQntuples(r) != 1) {
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)c->stream);
  } else {
    bs__stream_row row = bs__pg_stream_row(r, 0).row;
    s->id = c->stream;
    s->checkpoint = row.checkpoint;
    s->op_head = row.op_head;
    s->param_cursor = row.param_cursor;
    s->has_checkpoint = row.checkpoint_lsn.data != NULL;
  }
  PQclear(r);
  return rc;
}

static void cctx_close(cctx *c) {
  if (!c->c) return;
  {
    bs__pg_args a = {0};
    PGresult *r;
    bs__pg_arg_lock(&a, &c->db->schema, c->stream, BS_PG_LOCK_COMPACT);
    if (PQtransactionStatus(c->c) != PQTRANS_IDLE) bs__pg_rollback(c->c);
    if (bs__pg_exec(c->c, UNLOCK_SQL, &a, &r, "compact: unlocking", NULL) == BS_OK) {
      PQclear(r);
      bs__pg_conn_put(c->db, c->c);
      return;
    }
  }
  bs__pg_conn_drop(c->db, c->c); /* closing the session releases its lock */
}

/* The newest checkpoint aged at cutoff_ms (change records of flag 1; <= as bs__aged). */
static int compact_aged(void *x, int64_t cutoff_ms, uint64_t *out, bs_error *err) {
  cctx *c = x;
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  (void)err;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_i64(&a, cutoff_ms);
  rc = exec(c,
            "SELECT coalesce(max(op_id), 0) FROM bs_changes WHERE stream = $1"
            " AND flags & " BS_PG_SQL_CHG_CHECKPOINT " <> 0 AND time_ms <= $2",
            &a, &r, "compact: aged checkpoint");
  if (rc) return rc;
  *out = (uint64_t)bs__pg_i64(r, 0, 0);
  PQclear(r);
  return BS_OK;
}

/* Rows of bs_changes that prune_changes still has to delete or empty below $2 (stream $1), a
 * batch of at most $3. */
#define PRUNE_BATCH(cond)                                                                          \
  " WHERE ctid = ANY (ARRAY (SELECT ctid FROM bs_changes WHERE stream = $1 AND op_id < $2"         \
  " AND " cond " LIMIT $3))"

/* The change records below p, the aged checkpoint (the newest at least min_age_ms old): a reader
 * from below it gets the invalidate flags instead (contract.md 5.1), so the table holds only
 * what a recent reader can ask for. The fence rises first, then the records go in transactions
 * of max_ops_per_txn rows. A record that names write-checkpoint users keeps them (no flag
 * stands for a missing user), its lists emptied. */
static int compact_end(void *x, bs__compact_run *done, uint64_t p) {
  cctx *c = x;
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  int64_t n = 0;
  (void)done;
  if (!p) return BS_OK;
  bs__pg_arg_i32(&a, (int32_t)c->stream);
  bs__pg_arg_i64(&a, (int64_t)p);
  bs__pg_arg_i64(&a, (int64_t)c->o.max_ops_per_txn);
  rc = run(c, "UPDATE bs_streams SET changes_fence = greatest(changes_fence, $2) WHERE id = $1", &a,
           "compact: change fence");
  do {
    if (!rc)
      rc = exec(
          c,
          "WITH d AS (DELETE FROM bs_changes" PRUNE_BATCH(
              "cardinality(users) = 0") " RETURNING 1), e AS (UPDATE bs_changes SET buckets = "
                                        "'{}', lookups = '{}',"
                                        " flags = flags & " BS_PG_SQL_CHG_CHECKPOINT PRUNE_BATCH(
                                            "cardinality(users) > 0 AND (flags & "
                                            "(" BS_PG_SQL_CHG_BUCKETS " | " BS_PG_SQL_CHG_LOOKUPS
                                            ") <> 0"
                                            " OR cardinality(buckets) > 0"
                                            " OR cardinality(lookups) > 0)") " RETURNING 1) SELECT "
                                                                             "(SELECT count(*) "
                                                                             "FROM d) + (SELECT "
                                                                             "count(*) FROM e)",
          &a, &r, "compact: pruning change records");
    if (!rc) {
      n = bs__pg_i64(r, 0, 0);
      PQclear(r);
    }
  } while (!rc && n >= (int64_t)c->o.max_ops_per_txn);
  return rc;
}

static int compact_delete_requests(void *x, int64_t before_ms, uint64_t *deleted, bs_error *err) {
  return bs__pg_delete_checkpoint_requests_before(deleted, ((cctx *)x)->st, before_ms, err);
}

static const bs__compact_store pg_store = {compact_delete_requests,
                                           compact_stream,
                                           compact_aged,
                                           NULL,
                                           compact_find,
                                           compact_list,
                                           compact_step,
                                           compact_defragment,
                                           compact_param_fence,
                                           compact_param_step,
                                           compact_param_mark,
                                           compact_end};

/* Runs mode; the front resolved the options (every default applied, docs/backends.md). */
static int compact_run(bs_storage *st, const bs_compact_options *o, int mode,
                       bs_compact_stats *stats, uint64_t *processed, bs_error *err) {
  cctx c;
  pgroup g;
  int rc;
  memset(&c, 0, sizeof c);
  memset(&g, 0, sizeof g);
  c.st = st;
  c.db = ((bs__pg_storage *)st)->db;
  c.a = &c.db->base.alloc;
  c.stream = st->stream_id;
  c.err = err;
  c.o = *o;
  c.stats = stats;
  c.g = &g;
  rc = bs__compact_drive(&pg_store, &c, c.a, o, mode, stats, processed, err);
  cctx_close(&c);
  return rc;
}

int bs__pg_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *opts,
                   bs_error *err) {
  return compact_run(st, opts, opts->incremental_only ? BS__COMPACT_INC : BS__COMPACT_FULL, stats,
                     NULL, err);
}

int bs__pg_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                       uint64_t min_bucket_changes, bs_error *err) {
  bs_compact_options o;
  bs_compact_stats stats;
  BS_ASSERT(min_bucket_changes > 0); /* the front's default */
  bs__compact_initial_options(&o, max_op_id, min_bucket_changes);
  return compact_run(st, &o, BS__COMPACT_INITIAL, &stats, buckets_out, err);
}
