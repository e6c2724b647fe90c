/*
 * lmdb_compact.c: the LMDB backend's compaction primitives (contract.md section 6) for the loop of
 * compact_run.c, which decides what is compacted in what order, walks each bucket through its
 * phases and reports progress; the decisions about each op come from compact.c. This file gives
 * the cursors and writes, and owns the transactions.
 *
 * Every change is made in short write transactions (at most max_ops_per_txn ops changed and
 * VISIT_FACTOR times that many visited per transaction, over as many buckets as fit: see "Bucket
 * jobs"), and every transaction leaves each bucket consistent on its own:
 *  - a MOVE is written over its op in place (same key, same checksum), so a bucket with some of
 *    its superseded ops moved and others not is a valid bucket;
 *  - a fold replaces the first k ops of the leading run by one CLEAR at the k-th op's id, so an
 *    interrupted fold leaves a shorter leading run starting with a CLEAR (the next share folds
 *    that CLEAR again);
 *  - the bucket state (count, bytes, generation, CLEAR span) is read and rewritten inside the
 *    same transaction as the ops, so a writer appending to the bucket in between (in this or
 *    another process) is never overwritten.
 * Each transaction re-reads what it changes (op types, the leading run), so a second compactor
 * running at the same time can only make the other one find less to do. Scans resume across
 * transactions by key (the job's pos; parameter compaction the next group key).
 */
#include "lmdb_internal.h"

#include <stdlib.h>

typedef struct cctx {
  bs__lmdb_db *db;
  bs_storage *st;
  uint32_t stream;
  bs_compact_options o; /* resolved */
  bs_compact_stats *stats;
  /* the run's: a job's row identities; in parameter compaction, a group's replica ids */
  bs__seen_set *seen;
  bs__compact_run *run; /* the call's (compact_step) */
  bs_error *err;
  bs__compact_txn t; /* the current transaction's bounds */
  /* a bucket-job transaction (work_step) with cursors on ops and superseded */
  MDB_txn *txn;
  bs__lmdb_opc oc;
  MDB_cursor *ec;
  /* the superseded entry ec handed out last (its bucket and old op), and whether it was deleted
   * since, ec then standing on the entry after it */
  uint64_t sup_bucket, sup_old;
  int sup_deleted;
  /* jobs are numbered as they start; seen_job: the job whose rows the seen-set holds */
  uint64_t job_seq, seen_job;
  struct work *w;       /* the bucket jobs (compact_step) */
  struct param_arg *pa; /* the parameter pass (compact_param_step) */
} cctx;

/* ---- Small encoders ------------------------------------------------------------------------- */

/* MDB_MAP_FULL becomes BS_LMDB_MAPFULL: run_write grows the map and runs the step again */
static int mdb_err(cctx *c, int mrc, const char *what) {
  return bs__lmdb_fail(c->err, mrc, what);
}

/* Positions cur on the greatest key <= key (MDB_NOTFOUND when none). */
static int seek_le(MDB_cursor *cur, const void *key, size_t n, MDB_val *k, MDB_val *v) {
  MDB_val want = {n, (void *)key};
  int mrc;
  *k = want;
  mrc = mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
  if (mrc == MDB_NOTFOUND) return mdb_cursor_get(cur, k, v, MDB_LAST);
  if (mrc) return mrc;
  if (k->mv_size == n && memcmp(k->mv_data, key, n) == 0) return 0;
  return mdb_cursor_get(cur, k, v, MDB_PREV);
}

/* Positions cur on the smallest key >= key. */
static int seek_ge(MDB_cursor *cur, const void *key, size_t n, MDB_val *k, MDB_val *v) {
  MDB_val want = {n, (void *)key};
  *k = want;
  return mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
}

/* A read snapshot with a cursor on dbi; read_end ends both. */
static int read_begin(cctx *c, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **cur) {
  int mrc, rc = bs__lmdb_txn_begin(c->db, MDB_RDONLY, txn, c->err);
  if (rc) return rc;
  if ((mrc = mdb_cursor_open(*txn, dbi, cur))) {
    bs__lmdb_txn_abort(c->db, *txn);
    return mdb_err(c, mrc, "compact: cursor");
  }
  return BS_OK;
}

static int read_end(cctx *c, MDB_txn *txn, MDB_cursor *cur, int rc) {
  mdb_cursor_close(cur);
  bs__lmdb_txn_abort(c->db, txn);
  return rc;
}

static inline int in_bucket(const MDB_val *k, uint64_t bucket) {
  return k->mv_size == BS_SUP_KEY_SIZE &&
         bs__get_u64be((const unsigned char *)k->mv_data) == bucket;
}

/* ---- Bucket state -------------------------------------------------------------------------- */

typedef struct bstate {
  bs__bucket_state s;
  unsigned char name[BS_MAX_BUCKET_NAME];
} bstate;

static int state_load(cctx *c, MDB_txn *txn, uint64_t id, bstate *b) {
  unsigned char kb[BS_STATE_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc;
  /* callers read b only on success, but the analyzer cannot see that bs__fail returns nonzero */
  memset(&b->s, 0, sizeof b->s);
  bs__lmdb_state_key(kb, id);
  mrc = mdb_get(txn, c->db->bstate, &k, &v);
  if (mrc == MDB_NOTFOUND)
    return bs__fail(c->err, BS_ENOTFOUND, "bucket id %llu: no bucket state",
                    (unsigned long long)id);
  if (mrc) return mdb_err(c, mrc, "compact: bucket state");
  if (bs__bucket_state_decode(&v, &b->s))
    return bs__fail(c->err, BS_ECORRUPT, "bucket id %llu: bucket state does not decode",
                    (unsigned long long)id);
  /* copy the name out of the map: writes in this transaction may move it */
  if (b->s.name.size > sizeof b->name)
    return bs__fail(c->err, BS_ECORRUPT, "bucket id %llu: bucket name too long",
                    (unsigned long long)id);
  if (b->s.name.size) memcpy(b->name, b->s.name.data, b->s.name.size);
  b->s.name.data = b->name;
  return BS_OK;
}

/* The highest op id stored in the bucket (0 if none), through the job cursor on ops. */
static int last_op_of(cctx *c, uint64_t id, uint64_t *out) {
  bs_op op;
  int found, rc = bs__lmdb_opc_seek_le(&c->oc, id, UINT64_MAX, &op, &found, c->err);
  *out = rc == BS_OK && found ? op.op_id : 0;
  return rc;
}

/* Applies d to the bucket's state inside txn. */
static int state_apply(cctx *c, MDB_txn *txn, uint64_t id, const bs__compact_delta *d,
                       uint64_t compacted_op) {
  bstate b;
  int rc;
  if ((rc = state_load(c, txn, id, &b))) return rc;
  if (d->changed) {
    b.s.count = (uint64_t)((int64_t)b.s.count + d->count);
    b.s.bytes = (uint64_t)((int64_t)b.s.bytes + d->bytes);
    b.s.checksum = bs__cksum_sub(b.s.checksum, d->checksum_sub);
    b.s.generation++;
    bs__compact_span(d, &b.s.clear_start, &b.s.clear_op);
    if (d->deleted && (rc = last_op_of(c, id, &b.s.last_op))) return rc;
  }
  if (d->mark) {
    b.s.compacted_count = b.s.count;
    b.s.compacted_op = compacted_op < b.s.last_op ? compacted_op : b.s.last_op;
  }
  return bs__bucket_state_put(c->db, txn, id, &b.s, c->err);
}

/* ---- Transactions --------------------------------------------------------------------------- */

typedef int (*step_fn)(cctx *c, MDB_txn *txn, void *arg);

#define ARG_MAX 768 /* the largest step argument (param_arg) fits */

/* Runs one write transaction of fn. A failed step leaves nothing behind (aborted). When the
 * map is full, the step's argument and the statistics are restored and the step runs again
 * on a grown map. (The seen-set may keep rows the aborted attempt recorded: visiting an op
 * whose own id is recorded does not move it, so the retry decides the same.) */
static int run_write(cctx *c, step_fn fn, void *arg, size_t arg_size) {
  unsigned char saved[ARG_MAX];
  bs_compact_stats stats = *c->stats;
  for (;;) {
    MDB_txn *txn = NULL;
    int rc = bs__lmdb_txn_begin(c->db, 0, &txn, c->err);
    if (rc) return rc;
    memcpy(saved, arg, arg_size);
    rc = fn(c, txn, arg);
    if (rc)
      bs__lmdb_txn_abort(c->db, txn);
    else
      rc = bs__lmdb_txn_commit(c->db, txn, c->err);
    if (rc != BS_LMDB_MAPFULL) return rc;
    memcpy(arg, saved, arg_size);
    *c->stats = stats;
    if ((rc = bs__lmdb_grow(c->db, c->err))) return rc;
  }
}
#define RUN(c, fn, a) run_write((c), (fn), (a), sizeof *(a))

/* ---- Stream record -------------------------------------------------------------------------- */

typedef struct rec_raise {
  uint64_t compact_horizon, param_horizon, param_cursor, changes_fence;
} rec_raise;

/* Raises the stream record's compaction fields (never lowers them); param_cursor is set. */
static int rec_raise_step(cctx *c, MDB_txn *txn, void *arg) {
  const rec_raise *r = arg;
  bs__stream_rec rec;
  int rc;
  /* the record's strings point into the map: bs__stream_rec_put encodes before it writes */
  if ((rc = bs__stream_rec_get(c->db, txn, c->stream, &rec, c->err))) return rc;
  if (r->compact_horizon > rec.compact_horizon) rec.compact_horizon = r->compact_horizon;
  if (r->param_horizon > rec.param_horizon) rec.param_horizon = r->param_horizon;
  if (r->param_cursor > rec.param_cursor) rec.param_cursor = r->param_cursor;
  if (r->changes_fence > rec.changes_fence) rec.changes_fence = r->changes_fence;
  return bs__stream_rec_put(c->db, txn, &rec, c->err);
}

/* The stream record in txn, or (txn NULL) in a snapshot of its own, after which only its integers
 * are valid. initial: bs__compact_initial_check on it. */
static int read_rec(cctx *c, MDB_txn *txn, int initial, bs__stream_rec *out) {
  MDB_txn *own = NULL;
  int rc = txn ? BS_OK : bs__lmdb_txn_begin(c->db, MDB_RDONLY, &own, c->err);
  if (rc) return rc;
  rc = bs__stream_rec_get(c->db, txn ? txn : own, c->stream, out, c->err);
  if (own) {
    out->name.data = out->checkpoint_lsn.data = out->resume_lsn.data = NULL;
    out->no_checkpoint_before.data = out->last_error.data = NULL;
    bs__lmdb_txn_abort(c->db, own);
  }
  if (rc == BS_OK && initial)
    rc = bs__compact_initial_check(c->stream, out->has_checkpoint_lsn, out->checkpoint, c->err);
  return rc;
}

/* ---- Defragmentation ------------------------------------------------------------------------
 *
 * After the MOVE/CLEAR pass, a bucket whose live rows are a small fraction of its ops (a PUT
 * near the start pins a long tail of MOVEs and REMOVEs) gets its live PUTs re-emitted at the end
 * (bs__lmdb_reemit, the writer's own path), so that the next compaction covering the new ops
 * folds everything before them into one CLEAR. What is live comes from the source records, not
 * from the ops: a record's membership names the row's latest op in the bucket, and the record's
 * key (table id, replica id) is what the re-emission must update, which an op (whose subkey is a
 * hash of the replica id) cannot lead back to. So the pass scans the stream's source records
 * twice in one read snapshot: once counting the live rows and key bytes per candidate bucket,
 * once collecting the rows of the buckets chosen (within memory_limit_mb). Each write
 * transaction re-checks every row against its record (a row the writer changed in between is
 * skipped). Cost: two reads of the stream's source records per run that has a candidate. */

typedef struct dscan {
  const uint64_t *ids; /* candidate buckets, sorted */
  size_t n;
  uint64_t horizon;
  uint64_t *live, *bytes;      /* pass 1: per candidate */
  const unsigned char *chosen; /* pass 2: per candidate */
  bs__lmdb_reemit_row *rows;
  size_t n_rows, cap_rows;
  unsigned char *keys;
  size_t keys_used, keys_cap;
  const MDB_val *key; /* the record being visited */
  int pass;
} dscan;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int dscan_member(uint64_t bucket, uint64_t op, void *payload) {
  dscan *s = payload;
  const uint64_t *at = op > s->horizon ? NULL : bsearch(&bucket, s->ids, s->n, sizeof *at, cmp_u64);
  size_t i = at ? (size_t)(at - s->ids) : 0;
  if (!at) return BS_OK;
  if (s->pass == 1) {
    s->live[i]++;
    s->bytes[i] += sizeof(bs__lmdb_reemit_row) + s->key->mv_size;
    return BS_OK;
  }
  if (!s->chosen[i]) return BS_OK;
  /* pass 1 sized both arrays for the chosen buckets in this same snapshot */
  if (s->n_rows == s->cap_rows || s->keys_cap - s->keys_used < s->key->mv_size) return BS_ECORRUPT;
  memcpy(s->keys + s->keys_used, s->key->mv_data, s->key->mv_size);
  s->rows[s->n_rows].bucket = bucket;
  s->rows[s->n_rows].old_op = op;
  s->rows[s->n_rows].src_key = s->keys + s->keys_used;
  s->rows[s->n_rows].src_key_size = s->key->mv_size;
  s->n_rows++;
  s->keys_used += s->key->mv_size;
  return BS_OK;
}

/* One pass over the stream's source records. */
static int dscan_pass(cctx *c, MDB_txn *txn, dscan *s, int pass) {
  MDB_cursor *cur;
  MDB_val k, v;
  unsigned char kb[4];
  int mrc, rc = BS_OK;
  s->pass = pass;
  if ((mrc = mdb_cursor_open(txn, c->db->source, &cur))) return mdb_err(c, mrc, "compact: cursor");
  bs__put_u32be(kb, c->stream);
  for (mrc = seek_ge(cur, kb, 4, &k, &v); mrc == 0; mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size < 8 || bs__get_u32be(k.mv_data) != c->stream) break;
    /* cppcheck-suppress autoVariables ; reset to NULL before this frame returns */
    s->key = &k;
    if ((rc = bs__lmdb_srec_members(&v, dscan_member, s))) {
      rc = bs__fail(c->err, BS_ECORRUPT, "defragment: a source record does not decode");
      break;
    }
  }
  if (!rc && mrc && mrc != MDB_NOTFOUND) rc = mdb_err(c, mrc, "compact: source records");
  s->key = NULL; /* pointed at this frame's k */
  mdb_cursor_close(cur);
  return rc;
}

static int cmp_row(const void *a, const void *b) {
  const bs__lmdb_reemit_row *x = a, *y = b;
  if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
  return x->old_op < y->old_op ? -1 : x->old_op > y->old_op;
}

/* Chooses the buckets to defragment (in id order, while their rows fit in the memory limit) and
 * collects their rows, sorted by (bucket, op). */
static int defrag_plan(cctx *c, dscan *s) {
  const bs_allocator *a = &c->db->base.alloc;
  unsigned char *chosen = NULL;
  uint64_t budget = (uint64_t)c->o.memory_limit_mb * 1024u * 1024u, used = 0;
  size_t rows = 0;
  MDB_txn *txn = NULL;
  int rc;
  if (!(s->live = bs__calloc(a, s->n, sizeof *s->live)) ||
      !(s->bytes = bs__calloc(a, s->n, sizeof *s->bytes)) || !(chosen = bs__calloc(a, s->n, 1))) {
    rc = bs__fail(c->err, BS_ENOMEM, "defragment: plan");
    goto out;
  }
  s->chosen = chosen;
  if ((rc = bs__lmdb_txn_begin(c->db, MDB_RDONLY, &txn, c->err))) goto out;
  if ((rc = dscan_pass(c, txn, s, 1))) goto out;
  for (size_t i = 0; i < s->n; i++) {
    bstate b;
    if ((rc = state_load(c, txn, s->ids[i], &b)) == BS_ENOTFOUND) continue;
    if (rc) goto out;
    if (!bs__compact_defrag_due(s->live[i], b.s.count, c->o.defragment_ratio)) continue;
    if (used + s->bytes[i] > budget) continue;
    used += s->bytes[i];
    chosen[i] = 1;
    rows += s->live[i];
  }
  rc = BS_OK;
  if (!rows) goto out;
  if (!(s->rows = bs__calloc(a, rows, sizeof *s->rows)) ||
      !(s->keys = bs__malloc(a, used ? used : 1))) {
    rc = bs__fail(c->err, BS_ENOMEM, "defragment: %zu rows", rows);
    goto out;
  }
  s->cap_rows = rows;
  s->keys_cap = used;
  if ((rc = dscan_pass(c, txn, s, 2))) goto out;
  qsort(s->rows, s->n_rows, sizeof *s->rows, cmp_row);
out:
  bs__lmdb_txn_abort(c->db, txn);
  s->chosen = NULL;
  bs__free(a, chosen);
  return rc;
}

typedef struct reemit_arg {
  const bs__lmdb_reemit_row *rows;
  size_t n, i;
} reemit_arg;

static int reemit_step(cctx *c, MDB_txn *txn, void *arg) {
  reemit_arg *r = arg;
  size_t k = r->n - r->i;
  uint64_t emitted;
  int rc;
  if (k > c->o.max_ops_per_txn) k = c->o.max_ops_per_txn;
  if ((rc = bs__lmdb_reemit(c->db, txn, c->stream, r->rows + r->i, k, &emitted, c->err))) return rc;
  r->i += k;
  c->stats->ops_reemitted += emitted;
  return BS_OK;
}

/* Re-emits the live PUTs of the fragmented buckets among ids (sorted, unique). */
static int compact_defragment(void *x, bs__compact_run *run, uint64_t *ids, size_t n) {
  cctx *c = x;
  const bs_allocator *a = &c->db->base.alloc;
  dscan s;
  int rc;
  memset(&s, 0, sizeof s);
  s.ids = ids;
  s.n = n;
  s.horizon = run->horizon;
  rc = defrag_plan(c, &s);
  if (!rc && s.n_rows) {
    reemit_arg r = {s.rows, s.n_rows, 0};
    while (!rc && r.i < r.n) {
      rc = RUN(c, reemit_step, &r);
      if (!rc) rc = bs__compact_report(run);
    }
  }
  bs__free(a, s.live);
  bs__free(a, s.bytes);
  bs__free(a, s.rows);
  bs__free(a, s.keys);
  return rc;
}

/* ---- Bucket jobs: every kind of bucket compaction, many buckets per transaction ------------
 *
 * compact_run.c's job walks a bucket through its phases over the cursors below; a transaction
 * runs jobs (the current one, then the next buckets) until it has changed max_ops_per_txn ops or
 * visited VISIT_FACTOR times that many, then commits. So the number of commits (each an fsync
 * when durable) follows the number of ops changed, not the number of buckets.
 *
 * The seen-set belongs to the current job and is cleared only when a job starts. A map-full retry
 * restores the work as it was when the transaction began; its job's seen-set must then hold at
 * least everything the job recorded in committed transactions (rows an aborted attempt recorded
 * on top are recorded at their own latest op: a retry decides the same). A job that completes
 * goes on to the next bucket in the same transaction, and when that next job has cleared the
 * seen-set before a retry, the retried job (full) starts again from its bucket as committed: every
 * committed transaction leaves a compacted bucket that a new full pass compacts correctly. Not so
 * initial replication, whose SCAN deletes a row's latest REMOVE on the strength of the rows it
 * recorded: a resumed initial job still ends its transaction when it completes. Incremental jobs
 * use no seen-set. (Ending each resumed job's transaction cost one more commit, an fsync, per
 * transaction boundary that fell inside a bucket: about twice the commits of the raw baseline.) */

#define VISIT_FACTOR 8u /* a visit without a change costs a fraction of a write */

static size_t max_visits(size_t max_ops) {
  return max_ops > SIZE_MAX / VISIT_FACTOR ? SIZE_MAX : max_ops * VISIT_FACTOR;
}

typedef struct work {
  size_t i;           /* the run's batch: the next bucket */
  uint64_t budget;    /* incremental op budget left (UINT64_MAX = unbounded) */
  uint64_t processed; /* jobs completed on an existing bucket */
  bs__compact_job j;
  uint64_t seq;             /* the job's number (cctx.job_seq) */
  int rerun, rerun_changed; /* full: j starts again (work_step), j had changed the bucket */
} work;

/* The job's bucket (bs__op_cursor) on the transaction's cursors: c->oc on ops, c->ec on
 * superseded. */
typedef struct ocur {
  cctx *c;
  uint64_t bucket;
} ocur;

/* The op the ops layer handed out (its size in the bucket state's measure beside it). */
static int ocur_got(ocur *o, int rc, uint64_t *size) {
  *size = rc == BS_OK ? bs__lmdb_opc_bytes(&o->c->oc) : 0;
  return rc;
}

static int ocur_seek_le(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  ocur *o = x;
  return ocur_got(o, bs__lmdb_opc_seek_le(&o->c->oc, o->bucket, pos, op, found, o->c->err), size);
}

static int ocur_seek_ge(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  ocur *o = x;
  return ocur_got(o, bs__lmdb_opc_seek_ge(&o->c->oc, o->bucket, pos, op, found, o->c->err), size);
}

static int ocur_get(void *x, uint64_t id, bs_op *op, uint64_t *size, int *found) {
  ocur *o = x;
  return ocur_got(o, bs__lmdb_opc_get(&o->c->oc, o->bucket, id, op, found, o->c->err), size);
}

static int ocur_prev(void *x, bs_op *op, uint64_t *size, int *found) {
  ocur *o = x;
  return ocur_got(o, bs__lmdb_opc_prev(&o->c->oc, op, found, o->c->err), size);
}

static int ocur_next(void *x, bs_op *op, uint64_t *size, int *found) {
  ocur *o = x;
  return ocur_got(o, bs__lmdb_opc_next(&o->c->oc, op, found, o->c->err), size);
}

static int ocur_del(void *x) {
  ocur *o = x;
  return bs__lmdb_opc_del(&o->c->oc, o->c->err);
}

/* Rewrites the op under the cursor (op) as a MOVE or CLEAR (compact.c makes it). */
static int ocur_move(void *x, const bs_op *op, uint64_t target) {
  ocur *o = x;
  bs_op mv = bs__compact_move_op(op, target);
  return bs__lmdb_opc_bare(&o->c->oc, &mv, o->c->err);
}

/* Deletes the bucket's first n ops and writes the CLEAR over the n-th. */
static int ocur_fold(void *x, const bs__clear_acc *clear) {
  ocur *o = x;
  cctx *c = o->c;
  bs_op op;
  size_t i;
  int found, rc = bs__lmdb_opc_seek_ge(&c->oc, o->bucket, 0, &op, &found, c->err);
  for (i = 0; i < clear->n && rc == BS_OK && found; i++) {
    if (i + 1 < clear->n) {
      if ((rc = bs__lmdb_opc_del(&c->oc, c->err)) == BS_OK)
        rc = bs__lmdb_opc_next(&c->oc, &op, &found, c->err);
    } else {
      bs_op cl = bs__compact_clear_op(clear);
      if (op.op_id != cl.op_id) break;
      rc = bs__lmdb_opc_bare(&c->oc, &cl, c->err);
    }
  }
  if (rc) return rc;
  if (i < clear->n)
    return bs__fail(c->err, BS_ECORRUPT, "bucket id %llu: leading run changed under the fold",
                    (unsigned long long)o->bucket);
  return BS_OK;
}

static int ocur_sup_got(ocur *o, int mrc, const MDB_val *k, const MDB_val *v, uint64_t *old,
                        uint64_t *nw, int *found) {
  uint64_t b;
  *found = mrc == 0 && in_bucket(k, o->bucket);
  o->c->sup_deleted = 0;
  if (mrc && mrc != MDB_NOTFOUND) return mdb_err(o->c, mrc, "compact: superseded entries");
  if (*found && (bs__lmdb_sup_decode(k, v, &b, old, nw) || b != o->bucket))
    return bs__fail(o->c->err, BS_ECORRUPT, "compact: superseded entry of bucket id %llu",
                    (unsigned long long)o->bucket);
  o->c->sup_bucket = *found ? o->bucket : 0;
  o->c->sup_old = *found ? *old : 0;
  return BS_OK;
}

static int ocur_sup_seek(void *x, uint64_t old, uint64_t *old_out, uint64_t *nw, int *found) {
  ocur *o = x;
  unsigned char kb[BS_SUP_KEY_SIZE];
  MDB_val k, v;
  /* the walks consume an entry and go on from the one after it: after mdb_cursor_del, ec stands
   * there already and MDB_NEXT gives it, without a search */
  if (o->c->sup_deleted && o->c->sup_bucket == o->bucket && o->c->sup_old + 1 == old)
    return ocur_sup_got(o, mdb_cursor_get(o->c->ec, &k, &v, MDB_NEXT), &k, &v, old_out, nw, found);
  bs__lmdb_sup_key(kb, o->bucket, old);
  return ocur_sup_got(o, seek_ge(o->c->ec, kb, sizeof kb, &k, &v), &k, &v, old_out, nw, found);
}

static int ocur_sup_next(void *x, uint64_t *old, uint64_t *nw, int *found) {
  ocur *o = x;
  MDB_val k, v;
  BS_ASSERT(!o->c->sup_deleted); /* the walks seek after a delete */
  return ocur_sup_got(o, mdb_cursor_get(o->c->ec, &k, &v, MDB_NEXT), &k, &v, old, nw, found);
}

static int ocur_sup_del(void *x) {
  ocur *o = x;
  int mrc = mdb_cursor_del(o->c->ec, 0);
  o->c->sup_deleted = mrc == 0;
  return mrc ? mdb_err(o->c, mrc, "compact: delete superseded entry") : BS_OK;
}

/* Dequeues the bucket when it has no `superseded` entry left. Checked by key inside the
 * transaction, so an entry a writer added between two of our transactions keeps it queued. */
static int ocur_sup_end(void *x) {
  ocur *o = x;
  unsigned char qk[BS_CQUEUE_KEY_SIZE];
  MDB_val q = {sizeof qk, qk};
  uint64_t old, nw;
  int found, mrc, rc = ocur_sup_seek(x, 0, &old, &nw, &found);
  if (rc || found) return rc;
  bs__lmdb_cqueue_key(qk, o->c->stream, o->bucket);
  mrc = mdb_del(o->c->txn, o->c->db->cqueue, &q, NULL);
  if (mrc && mrc != MDB_NOTFOUND) return mdb_err(o->c, mrc, "compact: dequeue bucket");
  return BS_OK;
}

/* A job's start: a rerun's bucket (work_step) is counted already. */
static int ocur_start(void *x, uint64_t *bytes, int *exists) {
  ocur *o = x;
  cctx *c = o->c;
  bstate b;
  int rc = state_load(c, c->txn, o->bucket, &b), rerun = c->w->rerun;
  c->w->rerun = 0;
  if ((*exists = rc != BS_ENOTFOUND) == 0 || rc) return *exists ? rc : BS_OK;
  *bytes = rerun ? 0 : b.s.bytes;
  c->w->seq = ++c->job_seq;
  c->seen_job = c->w->seq; /* cleared now by all but incremental jobs, which use none */
  return BS_OK;
}

static int ocur_apply(void *x, const bs__compact_delta *d) {
  ocur *o = x;
  return state_apply(o->c, o->c->txn, o->bucket, d, o->c->run->horizon);
}

static const bs__op_cursor ocur_ops = {ocur_seek_le,  ocur_prev,     ocur_seek_ge,     ocur_next,
                                       ocur_get,      ocur_del,      ocur_move,        ocur_fold,
                                       ocur_sup_seek, ocur_sup_next, ocur_sup_del,     ocur_sup_end,
                                       ocur_start,    ocur_apply,    BS_OP_HEADER_SIZE};

/* Runs jobs in this transaction until it is full (see the top of this section). */
static int work_jobs(cctx *c, work *w) {
  const bs__compact_run *r = c->run;
  int rc;
  while (w->i < r->n && !bs__compact_txn_full(&c->t)) {
    int resumed = w->j.phase != BS__JOB_START;
    ocur o = {c, r->ids[w->i]};
    if ((rc = bs__compact_job_run(&ocur_ops, &o, c->run, &c->t, &w->j, &w->budget, &w->processed)))
      return rc;
    if (w->j.phase != BS__JOB_DONE) break;
    memset(&w->j, 0, sizeof w->j);
    w->i++;
    if (r->mode == BS__COMPACT_INC && w->budget == 0) break; /* the loop stops between buckets */
    /* see the top of this section: an initial-replication job's seen-set must survive a retry */
    if (resumed && r->mode == BS__COMPACT_INITIAL) break;
  }
  return BS_OK;
}

static int work_step(cctx *c, MDB_txn *txn, void *arg) {
  work *w = arg;
  bs__stream_rec rec;
  int rc, mrc, mode = c->run->mode;
  c->t.changes = c->t.visits = 0;
  c->txn = txn;
  /* a map-full retry of a transaction in which a later job cleared the seen-set: the full job
   * it resumes starts again from its bucket as committed (see the top of this section) */
  if (mode == BS__COMPACT_FULL && w->j.phase != BS__JOB_START && w->seq != c->seen_job) {
    w->rerun = 1;
    w->rerun_changed = w->j.changed;
    memset(&w->j, 0, sizeof w->j);
    w->j.changed = w->rerun_changed;
  }
  if (mode == BS__COMPACT_INITIAL && (rc = read_rec(c, txn, 1, &rec))) return rc;
  if ((rc = bs__lmdb_opc_open(&c->oc, c->db, txn, c->err))) return rc;
  c->sup_deleted = 0;
  if ((mrc = mdb_cursor_open(txn, c->db->superseded, &c->ec))) {
    rc = mdb_err(c, mrc, "compact: cursor");
  } else {
    rc = work_jobs(c, w);
    if (rc == BS_OK) rc = bs__lmdb_opc_flush(&c->oc, c->err); /* the chunk changed last */
    mdb_cursor_close(c->ec);
  }
  bs__lmdb_opc_close(&c->oc);
  c->ec = NULL;
  return rc;
}

/* Step: the jobs of the run's batch from r->i, in one write transaction (see "Bucket jobs"). */
static int compact_step(void *x, bs__compact_run *r) {
  cctx *c = x;
  work *w = c->w;
  int rc;
  c->seen = &r->seen;
  c->run = r;
  w->i = r->i;
  w->budget = r->budget;
  w->processed = r->processed;
  rc = run_write(c, work_step, w, sizeof *w);
  r->i = w->i;
  r->budget = w->budget;
  r->processed = w->processed;
  r->busy = w->j.phase != BS__JOB_START;
  return rc;
}

/* ---- Streams and buckets -------------------------------------------------------------------- */

static int compact_delete_requests(void *x, int64_t before_ms, uint64_t *deleted, bs_error *err) {
  cctx *c = x;
  return bs__lmdb_delete_checkpoint_requests_before(deleted, c->st, before_ms, err);
}

static int compact_stream(void *x, bs__compact_stream *out, bs_error *err) {
  cctx *c = x;
  bs__stream_rec rec;
  int rc = read_rec(c, NULL, 0, &rec);
  (void)err;
  if (rc) return rc;
  out->id = c->stream;
  out->checkpoint = rec.checkpoint;
  out->op_head = rec.op_head;
  out->param_cursor = rec.param_cursor;
  out->has_checkpoint = rec.has_checkpoint_lsn;
  return BS_OK;
}

/* Raised before any op changes, so whoever sees a change also sees the horizon. */
static int compact_begin(void *x, uint64_t horizon, bs_error *err) {
  rec_raise r = {horizon, 0, 0, 0};
  (void)err;
  return RUN((cctx *)x, rec_raise_step, &r);
}

/* The lowest op id stored in the bucket (0 if none), through oc. */
static int first_op_of(cctx *c, bs__lmdb_opc *oc, uint64_t id, uint64_t *out) {
  bs_op op;
  int found, rc = bs__lmdb_opc_seek_ge(oc, id, 0, &op, &found, c->err);
  *out = rc == BS_OK && found ? op.op_id : 0;
  return rc;
}

/* The bucket id as the selection sees it, in txn (oc: a cursor on ops in txn). */
static int bucket_entry(cctx *c, MDB_txn *txn, bs__lmdb_opc *oc, uint64_t id,
                        bs__compact_bucket *out) {
  bstate b;
  int rc = state_load(c, txn, id, &b);
  if (rc) return rc;
  *out = (bs__compact_bucket){id, b.s.count, b.s.compacted_count, b.s.last_op, b.s.compacted_op, 0};
  return first_op_of(c, oc, id, &out->first_op);
}

static int compact_find(void *x, bs_val name, bs__compact_bucket *out, int *found, bs_error *err) {
  cctx *c = x;
  MDB_txn *txn;
  bs__lmdb_opc oc = {0};
  uint64_t id;
  int rc = bs__lmdb_txn_begin(c->db, MDB_RDONLY, &txn, c->err);
  if (rc) return rc;
  if ((rc = bs__lmdb_opc_open(&oc, c->db, txn, c->err)) == BS_OK) {
    rc = bs__lmdb_bucket_id(c->db, txn, NULL, c->stream, name, &id, err);
    *found = rc == BS_OK;
    if (rc == BS_ENOTFOUND) rc = BS_OK; /* an unknown bucket has nothing to compact */
    if (*found) rc = bucket_entry(c, txn, &oc, id, out);
  }
  bs__lmdb_opc_close(&oc);
  bs__lmdb_txn_abort(c->db, txn);
  return rc;
}

/* Every bucket of the stream with its state, in name order (the bucket index), after cur's
 * name, in one read snapshot. */
static int list_all(cctx *c, bs__compact_cursor *cur, bs__compact_bucket *out, size_t *n) {
  unsigned char kb[BS_BUCKET_KEY_MAX];
  MDB_txn *txn;
  MDB_cursor *mc;
  bs__lmdb_opc oc = {0};
  MDB_val k, v;
  int rc, mrc;
  if ((rc = read_begin(c, c->db->buckets, &txn, &mc))) return rc;
  if ((rc = bs__lmdb_opc_open(&oc, c->db, txn, c->err))) goto out;
  bs__put_u32be(kb, c->stream);
  if (cur->name_size) memcpy(kb + 4, cur->name, cur->name_size);
  mrc = seek_ge(mc, kb, 4 + cur->name_size, &k, &v);
  if (mrc == 0 && cur->name_size && k.mv_size == 4 + cur->name_size &&
      memcmp(k.mv_data, kb, k.mv_size) == 0)
    mrc = mdb_cursor_get(mc, &k, &v, MDB_NEXT);
  for (; mrc == 0 && *n < BS__COMPACT_BATCH; mrc = mdb_cursor_get(mc, &k, &v, MDB_NEXT)) {
    uint64_t id;
    uint32_t stream;
    bs_val name;
    if (k.mv_size < 4 || bs__get_u32be(k.mv_data) != c->stream) break;
    if (bs__lmdb_bucket_entry_decode(&k, &v, &stream, &name, &id)) {
      rc = bs__fail(c->err, BS_ECORRUPT, "compact: bad bucket index entry");
      goto out;
    }
    memcpy(cur->name, name.data, name.size);
    cur->name_size = name.size;
    if ((rc = bucket_entry(c, txn, &oc, id, &out[(*n)++]))) goto out;
  }
  if (mrc && mrc != MDB_NOTFOUND) rc = mdb_err(c, mrc, "compact: bucket index");
  cur->done = *n < BS__COMPACT_BATCH;
out:
  bs__lmdb_opc_close(&oc);
  return read_end(c, txn, mc, rc);
}

/* The queued bucket ids from cur->from on, which becomes the id after the last. */
static int list_queued(cctx *c, bs__compact_cursor *cur, bs__compact_bucket *out, size_t *n) {
  MDB_txn *txn;
  MDB_cursor *mc;
  MDB_val k, v;
  unsigned char kb[BS_CQUEUE_KEY_SIZE];
  int rc, mrc;
  if ((rc = read_begin(c, c->db->cqueue, &txn, &mc))) return rc;
  bs__lmdb_cqueue_key(kb, c->stream, cur->from);
  for (mrc = seek_ge(mc, kb, sizeof kb, &k, &v); mrc == 0 && *n < BS__COMPACT_BATCH;
       mrc = mdb_cursor_get(mc, &k, &v, MDB_NEXT)) {
    uint32_t stream;
    uint64_t id;
    if (!bs__lmdb_in_stream(&k, c->stream)) break;
    if (bs__lmdb_cqueue_decode(&k, &v, &stream, &id)) {
      rc = bs__fail(c->err, BS_ECORRUPT, "compact: a cqueue entry does not decode");
      break;
    }
    memset(&out[*n], 0, sizeof out[*n]);
    out[(*n)++].id = id;
    cur->from = id + 1; /* bucket ids come from a sequence: never UINT64_MAX */
  }
  if (!rc && mrc && mrc != MDB_NOTFOUND) rc = mdb_err(c, mrc, "compact: queue");
  cur->done = *n < BS__COMPACT_BATCH;
  return read_end(c, txn, mc, rc);
}

static int compact_list(void *x, int queued, bs__compact_cursor *cur, bs__compact_bucket *out,
                        size_t *n, bs_error *err) {
  (void)err;
  *n = 0;
  return queued ? list_queued(x, cur, out, n) : list_all(x, cur, out, n);
}

/* The newest checkpoint aged at cutoff_ms (bs__aged), from the `changes` records (flag 1). */
static int compact_aged(void *x, int64_t cutoff_ms, uint64_t *out, bs_error *err) {
  cctx *c = x;
  MDB_txn *txn;
  MDB_cursor *cur;
  MDB_val k, v;
  unsigned char kb[BS_CHANGE_KEY_SIZE];
  int rc, mrc;
  (void)err;
  *out = 0;
  if ((rc = read_begin(c, c->db->changes, &txn, &cur))) return rc;
  bs__lmdb_change_key(kb, c->stream, UINT64_MAX, UINT64_MAX);
  for (mrc = seek_le(cur, kb, sizeof kb, &k, &v); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_PREV)) {
    bs__change_rec r;
    if (!bs__lmdb_in_stream(&k, c->stream)) break;
    if (bs__lmdb_change_decode(&k, &v, &r)) {
      rc = bs__fail(c->err, BS_ECORRUPT, "compact: a change record does not decode");
      break;
    }
    if ((r.flags & BS_CHANGE_CHECKPOINT) && bs__aged(r.time_ms, cutoff_ms)) {
      *out = r.last;
      break;
    }
  }
  if (!rc && mrc && mrc != MDB_NOTFOUND) rc = mdb_err(c, mrc, "compact: change records");
  return read_end(c, txn, cur, rc);
}

/* ---- Parameter compaction ------------------------------------------------------------------- */

typedef struct param_arg {
  uint64_t horizon;
  unsigned char resume[BS_PARAM_KEY_MAX];
  size_t resume_size;
  int done;
} param_arg;
_Static_assert(sizeof(param_arg) <= ARG_MAX, "run_write saves step arguments in ARG_MAX");

/* Walks the stream's entries downwards from the resume key, one (lookup, table, row hash)
 * group at a time: per replica id the newest entry at or below the horizon is kept (dropped
 * too if a tombstone), older ones are deleted. Stops at a group boundary. A group holds more
 * than one replica id only on a hash collision: the seen-set tells them apart (a replica id is
 * the row identity of an entry; a full set keeps more, never less). */
static int param_step(cctx *c, MDB_txn *txn, void *arg) {
  param_arg *a = arg;
  MDB_cursor *cur;
  MDB_val k, v;
  unsigned char group[BS_PARAM_KEY_MAX], cur_key[BS_PARAM_KEY_MAX];
  size_t group_size = 0, visited = 0;
  uint64_t removed = 0;
  int mrc, rc = BS_OK;
  if ((mrc = mdb_cursor_open(txn, c->db->params, &cur))) return mdb_err(c, mrc, "compact: cursor");
  bs__seen_clear(c->seen);
  mrc = seek_le(cur, a->resume, a->resume_size, &k, &v);
  while (mrc == 0) {
    size_t gsize;
    uint64_t op;
    uint32_t stream, n_sets;
    bs_val lookup, rid;
    int del = 0;
    if (k.mv_size < 4 || bs__get_u32be(k.mv_data) != c->stream) break;
    if (bs__lmdb_param_key_decode(&k, &stream, &lookup, &op) ||
        bs__lmdb_param_value_decode(&v, &rid, &n_sets, NULL)) {
      rc = bs__fail(c->err, BS_ECORRUPT, "compact: parameter entry does not decode");
      goto out;
    }
    gsize = k.mv_size - 8;
    if (gsize != group_size || memcmp(group, k.mv_data, gsize) != 0) {
      if (visited >= c->o.max_ops_per_txn) {
        /* resume at this group: its key prefix followed by the largest op id */
        memcpy(a->resume, k.mv_data, gsize);
        memset(a->resume + gsize, 0xff, 8);
        a->resume_size = gsize + 8;
        goto commit;
      }
      memcpy(group, k.mv_data, gsize);
      group_size = gsize;
      bs__seen_clear(c->seen);
    }
    visited++;
    if (op <= a->horizon) {
      bs_op row = {.op_id = op, .object_id = rid};
      uint64_t latest;
      int newer = bs__seen_visit(c->seen, &row, &latest);
      /* a replica id the full set could not record keeps its entries, tombstones too */
      del = (newer || !c->seen->full) && bs__compact_param_drop(newer, n_sets);
    }
    if (del) {
      size_t ks = k.mv_size;
      memcpy(cur_key, k.mv_data, ks);
      if ((mrc = mdb_cursor_del(cur, 0))) {
        rc = mdb_err(c, mrc, "compact: delete parameter entry");
        goto out;
      }
      removed++;
      mrc = seek_le(cur, cur_key, ks, &k, &v); /* the greatest key below the deleted one */
      continue;
    }
    mrc = mdb_cursor_get(cur, &k, &v, MDB_PREV);
  }
  if (mrc && mrc != MDB_NOTFOUND) {
    rc = mdb_err(c, mrc, "compact: parameter entries");
    goto out;
  }
  a->done = 1;
commit:
  mdb_cursor_close(cur);
  c->stats->parameter_entries_removed += removed; /* on failure the whole call fails */
  return BS_OK;
out:
  mdb_cursor_close(cur);
  return rc;
}

static int compact_param_fence(void *x, uint64_t horizon, bs_error *err) {
  rec_raise r = {0, horizon, 0, horizon};
  (void)err;
  return RUN((cctx *)x, rec_raise_step, &r);
}

/* One transaction of the pass, from the top of the stream's entries down. */
static int compact_param_step(void *x, bs__compact_run *r, int *done) {
  cctx *c = x;
  param_arg *a = c->pa;
  int rc;
  c->seen = &r->seen;
  if (!a->horizon) {
    a->horizon = r->horizon;
    bs__put_u32be(a->resume, c->stream + 1u);
    a->resume_size = 4;
    if (c->stream == UINT32_MAX) {
      memset(a->resume, 0xff, sizeof a->resume);
      a->resume_size = sizeof a->resume;
    }
  }
  rc = RUN(c, param_step, a);
  *done = a->done;
  return rc;
}

static int compact_param_mark(void *x, uint64_t horizon, bs_error *err) {
  rec_raise r = {0, 0, horizon, 0};
  (void)err;
  return RUN((cctx *)x, rec_raise_step, &r);
}

/* ---- Entry points --------------------------------------------------------------------------- */

static const bs__compact_store lmdb_store = {compact_delete_requests,
                                             compact_stream,
                                             compact_aged,
                                             compact_begin,
                                             compact_find,
                                             compact_list,
                                             compact_step,
                                             compact_defragment,
                                             compact_param_fence,
                                             compact_param_step,
                                             compact_param_mark,
                                             NULL};

/* Runs mode. The front has resolved the options (o, every default applied), checked every
 * argument and refused a read-only database (docs/backends.md). */
static int run(bs_storage *st, const bs_compact_options *o, int mode, bs_compact_stats *stats,
               uint64_t *processed, bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  cctx c;
  work w;
  param_arg pa;
  int rc;
  BS_ASSERT(!(ls->db->base.flags & BS_OPEN_RDONLY));
  memset(&c, 0, sizeof c);
  memset(&w, 0, sizeof w);
  memset(&pa, 0, sizeof pa);
  c.db = ls->db;
  c.st = st;
  c.stream = st->stream_id;
  c.o = *o;
  c.stats = stats;
  c.err = err;
  c.t.max_changes = o->max_ops_per_txn;
  c.t.max_visits = max_visits(o->max_ops_per_txn);
  c.w = &w;
  c.pa = &pa;
  /* a compaction writes: a clear of the stream left unfinished is finished first (lmdb_write.c) */
  if ((rc = bs__lmdb_clear_finish(c.db, c.stream, err)) != BS_OK) return rc;
  return bs__compact_drive(&lmdb_store, &c, &c.db->base.alloc, o, mode, stats, processed, err);
}

int bs__lmdb_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *opts,
                     bs_error *err) {
  return run(st, opts, opts->incremental_only ? BS__COMPACT_INC : BS__COMPACT_FULL, stats, NULL,
             err);
}

int bs__lmdb_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                         uint64_t min_bucket_changes, bs_error *err) {
  bs_compact_options o;
  bs_compact_stats stats;
  BS_ASSERT(max_op_id < (1ull << 63) && min_bucket_changes > 0); /* checked by the front */
  bs__compact_initial_options(&o, max_op_id, min_bucket_changes);
  return run(st, &o, BS__COMPACT_INITIAL, &stats, buckets_out, err);
}
