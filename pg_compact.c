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
 *    the same transaction as its ops, so a writer's concurrent appends are never overwritten.
 * Memory: one page of ops (without their data) and the seen-set bounded by memory_limit_mb; a
 * bucket is never read whole.
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

enum { W_FULL = BS__COMPACT_FULL, W_INC = BS__COMPACT_INC, W_INITIAL = BS__COMPACT_INITIAL };

/* What one transaction did to one bucket: applied to its state in the same transaction. */
typedef bs__compact_delta bdelta;

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

/* An op as the planner sees it, from a result row of OP_COLS (borrowed from r): its columns but
 * the data, then its payload bytes. */
#define OP_COLS BS_PG_OP_COLS ", " BS_PG_OP_BYTES "::bigint"

static bs_op op_of(const PGresult *r, int i, uint64_t *bytes) {
  if (bytes) *bytes = (uint64_t)bs__pg_i64(r, i, BS_PG_OP_NCOLS);
  return bs__pg_op_row(r, i, 0, 0);
}

/* Ops of bucket with from < op_id <= to (desc: to > op_id >= from... see the callers), at most
 * limit, ascending or descending. */
static int ops_page(cctx *c, uint64_t bucket, uint64_t lo, uint64_t hi, int desc, size_t limit,
                    PGresult **r) {
  bs__pg_args a = {0};
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, (int64_t)lo);
  bs__pg_arg_i64(&a, (int64_t)hi);
  bs__pg_arg_i64(&a, (int64_t)limit);
  return exec(c,
              desc ? "SELECT " OP_COLS " FROM bs_ops WHERE bucket = $1 AND op_id >= $2"
                     " AND op_id <= $3 ORDER BY op_id DESC LIMIT $4"
                   : "SELECT " OP_COLS " FROM bs_ops WHERE bucket = $1 AND op_id >= $2"
                     " AND op_id <= $3 ORDER BY op_id LIMIT $4",
              &a, r, "compact: reading ops");
}

/* ---- Bucket state ---------------------------------------------------------------------------- */

/* Applies d to the bucket's state (by deltas: a writer may have appended meanwhile). *gone = 1
 * when the bucket no longer exists (the stream was cleared). */
static int state_apply(cctx *c, uint64_t bucket, const bdelta *d, int *gone) {
  bs__pg_args a = {0};
  PGresult *r;
  uint64_t cs = 0, co = 0;
  int rc;
  *gone = 0;
  if (d->clear.n >= BS_CLEAR_MIN_RUN) { /* the torn span: compact.c's rule on the stored span */
    bs__pg_arg_i64(&a, (int64_t)bucket);
    rc = exec(c, "SELECT clear_start, clear_op FROM bs_buckets WHERE id = $1 FOR UPDATE", &a, &r,
              "compact: bucket state");
    if (rc) return rc;
    if (PQntuples(r) == 1) {
      cs = bs__clear_span_start(&d->clear, (uint64_t)bs__pg_i64(r, 0, 0),
                                (uint64_t)bs__pg_i64(r, 0, 1));
      co = d->clear.last_op;
    }
    PQclear(r);
    memset(&a, 0, sizeof a);
  }
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, d->count);
  bs__pg_arg_i64(&a, d->bytes);
  bs__pg_arg_i64(&a, (int64_t)d->checksum_sub);
  bs__pg_arg_i64(&a, (int64_t)cs);
  bs__pg_arg_i64(&a, (int64_t)co);
  bs__pg_arg_bool(&a, d->clear_dropped);
  bs__pg_arg_bool(&a, d->deleted);
  rc = exec(c,
            "UPDATE bs_buckets SET count = count + $2, bytes = bytes + $3,"
            " checksum = (checksum - $4 + 4294967296) % 4294967296, generation = generation + 1,"
            " clear_start = CASE WHEN $7 THEN 0 WHEN $6 = 0 THEN clear_start ELSE $5 END,"
            " clear_op = CASE WHEN $7 THEN 0 WHEN $6 = 0 THEN clear_op ELSE $6 END,"
            " last_op = CASE WHEN $8 THEN coalesce((SELECT max(op_id) FROM bs_ops"
            "  WHERE bucket = $1), 0) ELSE last_op END"
            " WHERE id = $1 RETURNING id",
            &a, &r, "compact: bucket state");
  if (rc) return rc;
  *gone = PQntuples(r) != 1;
  PQclear(r);
  bs__compact_delta_stats(c->stats, d);
  return BS_OK;
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

/* Records a full or initial-replication compaction of the bucket at the horizon. */
static int state_mark(cctx *c, uint64_t bucket, uint64_t horizon) {
  bs__pg_args a = {0};
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, (int64_t)horizon);
  return run(c,
             "UPDATE bs_buckets SET compacted_count = count,"
             " compacted_op = least($2, last_op) WHERE id = $1",
             &a, "compact: marking a bucket");
}

/* ---- Writes ---------------------------------------------------------------------------------- */

/* MOVEs: ids[i] becomes a MOVE to targets[i] (a PUT or REMOVE still: the checksum stays). */
static int write_moves(cctx *c, uint64_t bucket, const uint64_t *ids, const uint64_t *targets,
                       size_t n) {
  bs__pg_args a = {0};
  unsigned char *b1 = NULL, *b2 = NULL;
  int rc;
  bs__pg_arg_i64(&a, (int64_t)bucket);
  if (!(rc = bs__pg_arg_i64_array(&a, ids, n, c->a, &b1, c->err)) &&
      !(rc = bs__pg_arg_i64_array(&a, targets, n, c->a, &b2, c->err)))
    rc = run(c,
             "UPDATE bs_ops o SET type = " BS_PG_SQL_MOVE ", target_op = d.t,"
             " " BS_PG_OP_NO_PAYLOAD " FROM unnest($2::int8[], $3::int8[]) AS d(id, t)"
             " WHERE o.bucket = $1 AND o.op_id = d.id"
             " AND o.type IN (" BS_PG_SQL_PUT ", " BS_PG_SQL_REMOVE ")",
             &a, "compact: writing MOVEs");
  bs__free(c->a, b1);
  bs__free(c->a, b2);
  return rc;
}

/* The fold of d->clear (n ops, the first of the bucket, ending at last_op): deletes all but the
 * last, which becomes the CLEAR. BS_ECORRUPT when the run changed under it. */
static int write_fold(cctx *c, uint64_t bucket, bdelta *d) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  bs__pg_arg_i64(&a, (int64_t)bucket);
  bs__pg_arg_i64(&a, (int64_t)d->clear.first_op);
  bs__pg_arg_i64(&a, (int64_t)d->clear.last_op);
  bs__pg_arg_i32(&a, (int32_t)d->clear.checksum); /* bs_ops.checksum is an integer */
  bs__pg_arg_i64(&a, (int64_t)d->clear.target_op);
  rc = exec(c,
            "WITH del AS (DELETE FROM bs_ops WHERE bucket = $1 AND op_id >= $2 AND op_id < $3"
            "  RETURNING 1),"
            " cl AS (UPDATE bs_ops SET type = " BS_PG_SQL_CLEAR ", checksum = $4, target_op = $5,"
            "  " BS_PG_OP_NO_PAYLOAD " WHERE bucket = $1 AND op_id = $3 RETURNING 1)"
            " SELECT (SELECT count(*) FROM del), (SELECT count(*) FROM cl)",
            &a, &r, "compact: fold");
  if (rc) return rc;
  if ((uint64_t)bs__pg_i64(r, 0, 0) + 1 != d->clear.n || bs__pg_i64(r, 0, 1) != 1)
    rc = bs__fail(c->err, BS_ECORRUPT, "bucket id %" PRIu64 ": leading run changed under the fold",
                  bucket);
  PQclear(r);
  bs__compact_delta_fold(d, 0); /* a CLEAR has no payload bytes */
  return rc;
}

/* Deletes ops ids[0..n) (initial replication). */
static int write_deletes(cctx *c, uint64_t bucket, const uint64_t *ids, size_t n) {
  bs__pg_args a = {0};
  unsigned char *b1 = NULL;
  int rc;
  bs__pg_arg_i64(&a, (int64_t)bucket);
  if (!(rc = bs__pg_arg_i64_array(&a, ids, n, c->a, &b1, c->err)))
    rc = run(c, "DELETE FROM bs_ops WHERE bucket = $1 AND op_id = ANY($2)", &a,
             "compact: deleting ops");
  bs__free(c->a, b1);
  return rc;
}

/* ---- One bucket ------------------------------------------------------------------------------ */

/* FOLD: the leading run (at or below the horizon; in full compaction superseded PUT/REMOVEs too,
 * by the seen-set) becomes one CLEAR, a transaction's share at a time. *changed: it did. */
static int fold_run(cctx *c, uint64_t bucket, uint64_t horizon, int full, int *changed) {
  for (;;) {
    PGresult *r;
    bdelta d;
    int rc, ended = 0, gone, n;
    memset(&d, 0, sizeof d);
    if ((rc = ops_page(c, bucket, 0, horizon, 0, c->o.max_ops_per_txn + 1, &r))) return rc;
    n = PQntuples(r);
    for (int i = 0; i < n; i++) {
      uint64_t bytes, target = 0;
      bs_op op = op_of(r, i, &bytes);
      if ((size_t)i == c->o.max_ops_per_txn) break;
      if (full) bs__compact_superseded(c->seen, &op, &target);
      if (!bs__compact_in_run(&op, target)) {
        ended = 1;
        break;
      }
      bs__clear_acc_add(&d.clear, &op, target, bytes);
    }
    if ((size_t)n <= c->o.max_ops_per_txn) ended = 1;
    PQclear(r);
    if (d.clear.n < BS_CLEAR_MIN_RUN) return BS_OK;
    if ((rc = begin(c))) return rc;
    rc = write_fold(c, bucket, &d);
    if (!rc) rc = state_apply(c, bucket, &d, &gone);
    if ((rc = commit(c, rc))) return rc;
    *changed = 1;
    if (gone || ended) return BS_OK;
  }
}

/* Writes one transaction's MOVEs (ids/tg, d->moved of them). */
static int moves_txn(cctx *c, uint64_t bucket, const uint64_t *ids, const uint64_t *tg,
                     const bdelta *d, int *gone) {
  int rc;
  if ((rc = begin(c))) return rc;
  rc = write_moves(c, bucket, ids, tg, (size_t)d->moved);
  if (!rc) rc = state_apply(c, bucket, d, gone);
  return commit(c, rc);
}

/* Ops or entries visited for one transaction's changes: VISIT_FACTOR per change, as LMDB, but
 * never more than a page (a result set is held whole: 8 x 10000 ops took 20 MB). */
static size_t visit_page(const cctx *c) {
  size_t max = c->o.max_ops_per_txn;
  return max < PAGE / VISIT_FACTOR ? max * VISIT_FACTOR : PAGE;
}

/* MOVE (full): the superseded ops above the run up to last, in op order, max_ops_per_txn per
 * transaction (visit_page visited). */
static int move_rest(cctx *c, uint64_t bucket, uint64_t last, int *changed) {
  size_t max = c->o.max_ops_per_txn, n = 0, page = visit_page(c);
  uint64_t *ids = bs__calloc(c->a, max, sizeof *ids), *tg = bs__calloc(c->a, max, sizeof *tg);
  uint64_t pos = 0;
  bdelta d;
  int rc = BS_OK, done = 0, gone = 0;
  memset(&d, 0, sizeof d);
  if (!ids || !tg) rc = nomem(c);
  while (!rc && !done) {
    PGresult *r;
    int rows;
    if ((rc = ops_page(c, bucket, pos + 1, last, 0, page, &r))) break;
    rows = PQntuples(r);
    done = (size_t)rows < page;
    for (int i = 0; i < rows; i++) {
      uint64_t bytes, target;
      bs_op op = op_of(r, i, &bytes);
      pos = op.op_id;
      if (!bs__compact_superseded(c->seen, &op, &target)) continue;
      ids[n] = op.op_id;
      tg[n++] = target;
      bs__compact_delta_move(&d, bytes, 0); /* a MOVE has no payload bytes */
      if (n == max) {
        if (i + 1 < rows) done = 0;
        break;
      }
    }
    PQclear(r);
    if (n) {
      rc = moves_txn(c, bucket, ids, tg, &d, &gone);
      *changed = 1;
      done = done || gone;
      n = 0;
      memset(&d, 0, sizeof d);
    }
  }
  bs__free(c->a, ids);
  bs__free(c->a, tg);
  return rc;
}

/* The walk's cursor (bs__op_cursor): the bucket's ops a descending page at a time; a deleted op
 * is collected (ids) for the transaction that deletes them all in one statement. */
typedef struct pcur {
  cctx *c;
  uint64_t bucket;
  PGresult *r; /* the page (NULL: none read) */
  int i, n;    /* the current row, the page's rows */
  uint64_t *ids;
  size_t nids;
} pcur;

static int pcur_at(pcur *p, bs_op *op, uint64_t *size, int *found) {
  if ((*found = p->i < p->n)) *op = op_of(p->r, p->i, size);
  return BS_OK;
}

static int pcur_read(pcur *p, uint64_t pos) {
  int rc;
  PQclear(p->r);
  p->r = NULL;
  p->i = p->n = 0;
  if (pos == 0) return BS_OK;
  if ((rc = ops_page(p->c, p->bucket, 0, pos, 1, PAGE, &p->r))) return rc;
  p->n = PQntuples(p->r);
  return BS_OK;
}

static uint64_t pcur_id(const pcur *p, int i) {
  return op_of(p->r, i, NULL).op_id;
}

/* From the current row down within the page when pos is at or below it (the walk only goes
 * down), else a page from pos. */
static int pcur_seek_le(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  pcur *p = x;
  int rc;
  if (p->r && p->i < p->n && pcur_id(p, p->i) >= pos) {
    while (p->i < p->n && pcur_id(p, p->i) > pos) p->i++;
    if (p->i < p->n || p->n < PAGE) return pcur_at(p, op, size, found); /* a short page: the end */
  }
  if ((rc = pcur_read(p, pos))) return rc;
  return pcur_at(p, op, size, found);
}

static int pcur_prev(void *x, bs_op *op, uint64_t *size, int *found) {
  pcur *p = x;
  uint64_t below;
  int rc;
  if (++p->i == p->n && p->n == PAGE) { /* a full page: more below it */
    below = pcur_id(p, p->n - 1) - 1;
    if ((rc = pcur_read(p, below))) return rc;
  }
  return pcur_at(p, op, size, found);
}

static int pcur_del(void *x) {
  pcur *p = x;
  p->ids[p->nids++] = pcur_id(p, p->i);
  return BS_OK;
}

static const bs__op_cursor pcur_ops = {pcur_seek_le, pcur_prev, pcur_del};

/* Full compaction of one bucket at the horizon: the walk's reverse scan (read only: the seen-set,
 * the leading run, the highest superseded op), the fold, the MOVEs, the mark. */
static int full_bucket(cctx *c, uint64_t bucket, uint64_t horizon, int *changed) {
  bs__compact_scan scan = {0, 0};
  bs__compact_txn t = {0, 0, SIZE_MAX, SIZE_MAX}; /* read only: no transaction to bound */
  bs__compact_delta d;
  pcur p = {c, bucket, NULL, 0, 0, NULL, 0};
  uint64_t pos = horizon;
  int rc, done;
  memset(&d, 0, sizeof d);
  bs__seen_clear(c->seen);
  rc = bs__compact_scan_walk(&pcur_ops, &p, c->run, &t, &scan, &d, &pos, &done);
  PQclear(p.r);
  if (rc) return rc;
  if (scan.run >= BS_CLEAR_MIN_RUN && (rc = fold_run(c, bucket, horizon, 1, changed))) return rc;
  if (scan.max_moved &&
      (rc = move_rest(c, bucket, scan.max_moved < horizon ? scan.max_moved : horizon, changed)))
    return rc;
  return state_mark(c, bucket, horizon);
}

/* ---- The superseded log (bs_superseded: rows of varint pairs, pg_internal.h) ----------------- */

#define SUP_ROWS 16 /* log rows read per statement (each at most BS_PG_SUP_ROW entries) */

typedef struct sent {
  uint64_t old_op, new_op;
} sent;

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

/* In the caller's transaction: the bucket's log entries due at the horizon with an old op in
 * (lo, hi] go; a row that held any is rewritten with the rest, or deleted when none is left. */
static int sups_consume(cctx *c, uint64_t bucket, uint64_t horizon, uint64_t lo, uint64_t hi) {
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
        if (o > lo && o <= hi && bs__compact_entry_due(nw, horizon))
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

/* Incremental compaction of one queued bucket (mem.c's incremental_bucket, LMDB's INC then FOLD):
 * its logged entries in old-op order, those due at the horizon within *budget, turn their ops
 * into MOVEs (when still a PUT/REMOVE below the new op) and are consumed; when any was consumed,
 * the leading run of REMOVE/MOVE/CLEAR folds. */
static int inc_bucket(cctx *c, uint64_t bucket, uint64_t horizon, uint64_t *budget, int *changed) {
  size_t max = c->o.max_ops_per_txn;
  uint64_t *ids = bs__calloc(c->a, max, sizeof *ids), *tg = bs__calloc(c->a, max, sizeof *tg);
  uint64_t *eold = bs__calloc(c->a, max, sizeof *eold), pos = 0;
  sent *es = bs__calloc(c->a, max, sizeof *es);
  int rc = BS_OK, done = 0, consumed = 0, gone = 0;
  if (!ids || !tg || !eold || !es) rc = nomem(c);
  while (!rc && !done && *budget) {
    bs__pg_args a = {0};
    unsigned char *arr = NULL;
    PGresult *o = NULL;
    size_t ne = 0, n = 0, m = *budget < max ? (size_t)*budget : max;
    uint64_t lo = pos;
    int64_t freed = 0;
    /* the next due entries (a later pass takes the others) */
    if ((rc = sups_select(c, bucket, horizon, pos, es, m, &ne))) break;
    done = ne < max;
    for (size_t i = 0; i < ne; i++) {
      eold[i] = es[i].old_op;
      tg[i] = es[i].new_op;
    }
    if (ne) pos = eold[ne - 1];
    if (*budget != UINT64_MAX) *budget -= ne;
    if (!*budget) done = 1;
    if (!ne) break;
    /* the entries' ops as they are now */
    bs__pg_arg_i64(&a, (int64_t)bucket);
    if ((rc = bs__pg_arg_i64_array(&a, eold, ne, c->a, &arr, c->err))) break;
    rc = exec(c,
              "SELECT " OP_COLS " FROM bs_ops WHERE bucket = $1 AND op_id = ANY($2)"
              " ORDER BY op_id",
              &a, &o, "compact: reading ops");
    bs__free(c->a, arr);
    if (rc) break;
    for (size_t i = 0, k = 0; i < ne; i++) { /* both ascend by op id */
      uint64_t bytes = 0;
      bs_op op;
      while (k < (size_t)PQntuples(o) && (uint64_t)bs__pg_i64(o, (int)k, 0) < eold[i]) k++;
      if (k == (size_t)PQntuples(o) || (uint64_t)bs__pg_i64(o, (int)k, 0) != eold[i]) continue;
      op = op_of(o, (int)k, &bytes);
      if (!bs__compact_entry_moves(&op, tg[i])) continue;
      ids[n] = op.op_id;
      tg[n++] = tg[i]; /* n <= i: tg[i] is read before it can be overwritten */
      freed += (int64_t)bytes;
    }
    PQclear(o);
    /* one transaction: the MOVEs and the consumed entries */
    {
      bdelta d;
      memset(&d, 0, sizeof d);
      d.moved = n;
      d.bytes = -freed;
      if ((rc = begin(c))) break;
      if (n) rc = write_moves(c, bucket, ids, tg, n);
      if (!rc) rc = sups_consume(c, bucket, horizon, lo, pos);
      if (!rc && n) rc = state_apply(c, bucket, &d, &gone);
      if ((rc = commit(c, rc))) break;
      if (n) *changed = 1;
      consumed = 1;
      if (gone) done = 1;
    }
  }
  bs__free(c->a, ids);
  bs__free(c->a, tg);
  bs__free(c->a, eold);
  bs__free(c->a, es);
  if (!rc && consumed && !gone) rc = fold_run(c, bucket, horizon, 0, changed);
  return rc;
}

/* Initial replication of one bucket: the reverse scan deletes what bs__compact_initial_drop says
 * (every decision depends only on the ops above it), in transactions of max_ops_per_txn deletes,
 * each checking that the stream still has no checkpoint; then its superseded entries at the
 * horizon go (their old ops are gone) and the bucket is marked. */
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

static int deletes_txn(cctx *c, uint64_t bucket, const uint64_t *ids, bdelta *d, int *gone) {
  int rc;
  if ((rc = begin(c))) return rc;
  rc = still_initial(c);
  if (!rc) rc = write_deletes(c, bucket, ids, (size_t)d->removed);
  if (!rc) rc = state_apply(c, bucket, d, gone);
  return commit(c, rc);
}

/* The walk's deletions, max_ops_per_txn a transaction (the ops visited are not bounded: the
 * reads are outside it). */
static int initial_bucket(cctx *c, uint64_t bucket, uint64_t horizon, int *changed) {
  size_t max = c->o.max_ops_per_txn;
  pcur p = {c, bucket, NULL, 0, 0, bs__calloc(c->a, max, sizeof *p.ids), 0};
  uint64_t pos = horizon;
  int rc = BS_OK, done = 0, gone = 0;
  if (!p.ids) return nomem(c);
  bs__seen_clear(c->seen);
  while (!rc && !done && !gone) {
    bs__compact_txn t = {0, 0, max, SIZE_MAX};
    bdelta d;
    memset(&d, 0, sizeof d);
    p.nids = 0;
    rc = bs__compact_scan_walk(&pcur_ops, &p, c->run, &t, NULL, &d, &pos, &done);
    if (!rc && d.removed) rc = deletes_txn(c, bucket, p.ids, &d, &gone);
    if (!rc && d.removed) *changed = 1;
  }
  PQclear(p.r);
  bs__free(c->a, p.ids);
  if (!rc && !gone) {
    if (!(rc = begin(c))) {
      rc = still_initial(c);
      if (!rc) rc = sups_consume(c, bucket, horizon, 0, UINT64_MAX);
      if (!rc) rc = state_mark(c, bucket, horizon);
      rc = commit(c, rc);
    }
  }
  return rc;
}

/* ---- Buckets --------------------------------------------------------------------------------- */

/* Step: one bucket (its transactions report progress as they commit). */
static int compact_step(void *x, bs__compact_run *r) {
  cctx *c = x;
  uint64_t bucket = r->ids[r->i];
  bstate b;
  int rc, changed = 0;
  c->seen = &r->seen;
  c->run = r;
  if ((rc = state_load(c, bucket, &b))) return rc;
  if (b.exists) { /* else cleared meanwhile: nothing to do */
    c->stats->bytes_before += b.bytes;
    c->stats->bytes_after += b.bytes;
    if (r->mode == W_FULL)
      rc = full_bucket(c, bucket, r->horizon, &changed);
    else if (r->mode == W_INC)
      rc = inc_bucket(c, bucket, r->horizon, &r->budget, &changed);
    else
      rc = initial_bucket(c, bucket, r->horizon, &changed);
    if (rc) return rc;
    if (changed) c->stats->buckets_compacted++;
    r->processed++;
  }
  r->i++;
  return BS_OK;
}

/* Buckets in name order with their figures: the one named name (exact) or up to a batch after
 * it, into out[*n...]; *last: the last one's name (cur->name, at most its size). */
#define BUCKETS_SQL(where)                                                                         \
  "SELECT id, count, compacted_count, last_op, compacted_op,"                                      \
  " coalesce((SELECT min(op_id) FROM bs_ops WHERE bucket = b.id), 0), name"                        \
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
  return compact_run(st, opts, opts->incremental_only ? W_INC : W_FULL, stats, NULL, err);
}

int bs__pg_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                       uint64_t min_bucket_changes, bs_error *err) {
  bs_compact_options o;
  bs_compact_stats stats;
  BS_ASSERT(min_bucket_changes > 0); /* the front's default */
  bs__compact_initial_options(&o, max_op_id, min_bucket_changes);
  return compact_run(st, &o, W_INITIAL, &stats, buckets_out, err);
}
