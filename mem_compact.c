/*
 * mem_compact.c: the memory backend's compaction primitives (contract.md 6) for the loop of
 * compact_run.c, which decides what is compacted in what order and reports progress; compact.c
 * plans every op, as for LMDB and PostgreSQL. A step compacts one bucket under the lock (the
 * backend's transaction): the reverse scan with the planner's seen-set, in the same order and
 * with the same memory bound as LMDB, then the new op array, built first, so that the bucket
 * changes only when everything is allocated. Bucket ids are the stream's bucket indexes.
 */
#include "mem_internal.h"

#include <stdlib.h>

typedef struct mcx {
  mem_storage *ms;
  bs__mem_reemit_fn reemit;
} mcx;

static int sup_cmp(const void *x, const void *y) {
  return u64_cmp(&((const mem_sup *)x)->old_op, &((const mem_sup *)y)->old_op);
}

#define DROP UINT64_MAX /* a plan's target: the op is deleted (initial replication) */

/* Applies a plan to b (target: b->n entries, each op's MOVE target, DROP or 0 = kept): with fold,
 * the leading run at or below h becomes one CLEAR first. Counts into stats. In place (the CLEAR
 * replaces two ops or more), so nothing can fail. A dropped CLEAR takes the torn span with it. */
static void apply_plan(const bs_allocator *a, mem_stream *s, mem_bucket *b, uint64_t h,
                       const uint64_t *target, int fold, bs_compact_stats *stats) {
  bs__clear_acc clear;
  size_t run = 0, nn = 0, drop = 0, moved = 0;
  memset(&clear, 0, sizeof clear);
  for (; fold && run < b->n && b->ops[run].id <= h; run++) {
    bs_op op = op_view(&b->ops[run]);
    if (!bs__compact_in_run(&op, target[run])) break;
    bs__clear_acc_add(&clear, &op, target[run], op_size(&b->ops[run]));
  }
  if (run < BS_CLEAR_MIN_RUN) {
    run = 0;
    clear.n_folded = 0;
  }
  for (size_t k = 0; k < b->n; k++) {
    drop += target[k] == DROP;
    moved += target[k] && target[k] != DROP; /* counted also when folded (as LMDB) */
  }
  if (!moved && !run && !drop) return;
  for (size_t k = 0; k < b->n; k++) { /* nn <= k: ops[k] is read before ops[nn] is written */
    mem_op m = {.id = b->ops[k].id,
                .type = BS_OP_MOVE,
                .checksum = b->ops[k].checksum,
                .target = target[k]};
    if (k >= run && !target[k]) {
      b->ops[nn++] = b->ops[k];
      continue;
    }
    if (target[k] == DROP && b->ops[k].type == BS_OP_CLEAR) b->clear_start = b->clear_op = 0;
    op_free(a, &b->ops[k]);
    if (k + 1 == run) { /* the run's last op: the CLEAR takes its place and id */
      mem_op c = {.id = clear.last_op,
                  .type = BS_OP_CLEAR,
                  .checksum = clear.checksum,
                  .target = clear.target_op};
      b->ops[nn++] = c;
    } else if (k >= run && target[k] != DROP) {
      b->ops[nn++] = m;
    }
  }
  if (run) {
    b->clear_start = bs__clear_span_start(&clear, b->clear_start, b->clear_op);
    b->clear_op = clear.last_op;
  }
  b->n = nn;
  if (nn < b->cap / 4) { /* give the space back; on failure the array just stays larger */
    mem_op *p = bs__realloc(a, b->ops, (nn ? nn : 1) * sizeof *p);
    if (p) {
      b->ops = p;
      b->cap = nn ? nn : 1;
    }
  }
  b->generation = ++s->m.gen_seq;
  stats->buckets_compacted++;
  stats->ops_moved += moved;
  stats->ops_cleared += clear.n_folded;
  stats->ops_removed += drop;
}

/* Removes the log entries of b before end that are due at h. */
static void log_consume(mem_bucket *b, size_t end, uint64_t h) {
  size_t k = 0;
  for (size_t i = 0; i < b->nsups; i++)
    if (i >= end || !bs__compact_entry_due(b->sups[i].new_op, h)) b->sups[k++] = b->sups[i];
  b->nsups = k;
}

/* The walk's cursor (bs__op_cursor) on a bucket's op array: ops[k - 1] is the current op; a
 * deleted op is only marked in the plan (target DROP), which apply_plan carries out. */
typedef struct mcur {
  const mem_bucket *b;
  size_t k;
  uint64_t *target;
} mcur;

static int mcur_at(const mcur *m, bs_op *op, uint64_t *size, int *found) {
  if ((*found = m->k > 0)) {
    *op = op_view(&m->b->ops[m->k - 1]);
    *size = op_size(&m->b->ops[m->k - 1]);
  }
  return BS_OK;
}

static int mcur_seek_le(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  while (m->k > 0 && m->b->ops[m->k - 1].id > pos) m->k--; /* ids ascend; pos only comes down */
  return mcur_at(m, op, size, found);
}

static int mcur_prev(void *x, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  m->k--;
  return mcur_at(m, op, size, found);
}

static int mcur_del(void *x) {
  mcur *m = x;
  m->target[m->k - 1] = DROP;
  return BS_OK;
}

static const bs__op_cursor mcur_ops = {mcur_seek_le, mcur_prev, mcur_del};

/* Full or initial-replication compaction of one bucket at r's horizon: the walk's reverse scan,
 * then (full) the fold and the MOVEs, or (initial) the deletions it planned (no residue,
 * contract.md 6) and the log entries at the horizon go with the old ops they name (FORGET). One
 * transaction (the lock): no bound. */
static int scan_bucket(const bs_allocator *a, mem_stream *s, mem_bucket *b, bs__compact_run *r) {
  bs__compact_scan scan = {0, 0};
  bs__compact_txn t = {0, 0, SIZE_MAX, SIZE_MAX};
  bs__compact_delta d;
  uint64_t h = r->horizon, pos = h;
  mcur m = {b, b->n, bs__calloc(a, b->n ? b->n : 1, sizeof *m.target)};
  int done;
  if (!m.target) return BS_ENOMEM;
  memset(&d, 0, sizeof d);
  bs__seen_clear(&r->seen);
  bs__compact_scan_walk(&mcur_ops, &m, r, &t, &scan, &d, &pos, &done); /* cannot fail */
  for (size_t k = 0; scan.max_moved && k < b->n && b->ops[k].id <= h; k++) {
    bs_op op = op_view(&b->ops[k]);
    bs__compact_superseded(&r->seen, &op, &m.target[k]);
  }
  apply_plan(a, s, b, h, m.target, scan.run >= BS_CLEAR_MIN_RUN, r->stats);
  if (r->mode == BS__COMPACT_INITIAL) log_consume(b, b->nsups, h);
  bs__free(a, m.target);
  return BS_OK;
}

/* Incremental compaction of bucket bi at h: its logged entries due at h (in old op order,
 * within *budget) turn their ops into MOVEs and are consumed; then the leading run folds. */
static int incremental_bucket(const bs_allocator *a, mem_stream *s, size_t bi, uint64_t h,
                              uint64_t *budget, bs_compact_stats *stats) {
  mem_bucket *b = s->buckets[bi];
  uint64_t *target = bs__calloc(a, b->n ? b->n : 1, sizeof *target), left = *budget;
  size_t end, nc = 0;
  if (!target) return BS_ENOMEM;
  /* the log's order means nothing (a transaction only appends to it, under the lock) */
  if (b->nsups) qsort(b->sups, b->nsups, sizeof *b->sups, sup_cmp);
  for (end = 0; end < b->nsups && left; end++) {
    const mem_sup *e = &b->sups[end];
    size_t k = op_index(b, e->old_op);
    bs_op op;
    if (!bs__compact_entry_due(e->new_op, h)) continue;
    if (left != UINT64_MAX) left--;
    nc++;
    if (k == b->n) continue; /* folded or deleted since: the entry just goes */
    op = op_view(&b->ops[k]);
    if (bs__compact_entry_moves(&op, e->new_op)) target[k] = e->new_op;
  }
  apply_plan(a, s, b, h, target, nc > 0, stats);
  log_consume(b, end, h);
  *budget = left;
  bs__free(a, target);
  return BS_OK;
}

/* Parameter compaction at h: per (lookup, table, replica id) group, newest first, the planner's
 * bs__compact_param_drop. Caller holds the lock. */
static int param_ident_cmp(const void *x, const void *y) {
  const mem_param *a = *(const mem_param *const *)x, *b = *(const mem_param *const *)y;
  int c = bs__val_cmp(a->key, b->key);
  if (!c) c = a->table < b->table ? -1 : a->table > b->table;
  if (!c) c = bs__val_cmp(a->rid, b->rid);
  if (!c) c = a->id < b->id ? 1 : a->id > b->id ? -1 : 0; /* newest first */
  return c;
}

static int same_param_row(const mem_param *a, const mem_param *b) {
  return bs__val_eq(a->key, b->key) && a->table == b->table && bs__val_eq(a->rid, b->rid);
}

static int compact_params(const bs_allocator *a, mem_stream *s, uint64_t h, uint64_t *removed) {
  mem_param **v = bs__calloc(a, s->nparams ? s->nparams : 1, sizeof *v);
  size_t n = 0, nn = 0;
  if (!v) return BS_ENOMEM;
  for (size_t k = 0; k < s->nparams; k++)
    if (s->params[k].id <= h) v[n++] = &s->params[k];
  qsort(v, n, sizeof *v, param_ident_cmp);
  for (size_t i = 0; i < n; i++) /* id 0 (op ids start at 1) marks a dropped entry */
    if (bs__compact_param_drop(i > 0 && same_param_row(v[i - 1], v[i]), (uint32_t)v[i]->nrows))
      v[i]->id = 0;
  for (size_t k = 0; k < s->nparams; k++) { /* closes up in place, in op id order */
    if (s->params[k].id)
      s->params[nn++] = s->params[k];
    else
      param_free(a, &s->params[k]);
  }
  *removed += s->nparams - nn;
  s->nparams = nn;
  bs__free(a, v);
  return BS_OK;
}

/* ---- Primitives (bs__compact_store) ------------------------------------------------------- */

static int m_delete_requests(void *x, int64_t before_ms, uint64_t *deleted, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  (void)err;
  lock(ms->db);
  *deleted = bs__mem_delete_requests_before(ms->db, ms->s, before_ms);
  unlock(ms->db);
  return BS_OK;
}

static int m_stream(void *x, bs__compact_stream *out, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  (void)err;
  lock(ms->db);
  out->id = ms->s->id;
  out->checkpoint = ms->s->m.checkpoint;
  out->op_head = ms->s->m.op_head;
  out->has_checkpoint = ms->s->m.cp_lsn.has;
  out->param_cursor = 0; /* no cursor: every parameter pass scans everything */
  unlock(ms->db);
  return BS_OK;
}

/* The newest checkpoint aged at cutoff_ms (bs__aged). */
static int m_aged(void *x, int64_t cutoff_ms, uint64_t *out, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  const mem_stream *s = ms->s;
  (void)err;
  lock(ms->db);
  *out = 0;
  for (size_t i = 0; i < s->ncps; i++)
    if (bs__aged(s->cps[i].ms, cutoff_ms) && s->cps[i].id > *out) *out = s->cps[i].id;
  unlock(ms->db);
  return BS_OK;
}

static bs__compact_bucket bucket_entry(const mem_stream *s, size_t i) {
  const mem_bucket *b = s->buckets[i];
  bs__compact_bucket e = {
      i, b->n, b->compacted_count, last_op_of(b), b->compacted_op, b->n ? b->ops[0].id : 0};
  return e;
}

static int m_find(void *x, bs_val name, bs__compact_bucket *out, int *found, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  size_t idx = 0;
  (void)err;
  lock(ms->db);
  if ((*found = bucket_find(ms->s, name, &idx) != NULL)) *out = bucket_entry(ms->s, idx);
  unlock(ms->db);
  return BS_OK;
}

/* In bucket index order (LMDB's bucket-id order). */
static int m_list(void *x, int queued, bs__compact_cursor *cur, bs__compact_bucket *out, size_t *n,
                  bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  const mem_stream *s = ms->s;
  size_t i;
  (void)err;
  *n = 0;
  lock(ms->db);
  for (i = (size_t)cur->from; i < s->nbuckets && *n < BS__COMPACT_BATCH; i++)
    if (!queued || s->buckets[i]->nsups > 0) out[(*n)++] = bucket_entry(s, i);
  cur->from = i;
  cur->done = i == s->nbuckets;
  unlock(ms->db);
  return BS_OK;
}

/* One bucket, under the lock. Bucket indexes stay valid: buckets are only appended, and a
 * clear (which takes the lock) leaves fewer. */
static int m_step(void *x, bs__compact_run *r) {
  mem_storage *ms = ((mcx *)x)->ms;
  mem_stream *s = ms->s;
  const bs_allocator *a = ALLOC(ms->db);
  size_t idx = (size_t)r->ids[r->i];
  int rc = BS_OK;
  lock(ms->db);
  /* initial replication: a writer may have committed the first checkpoint meanwhile */
  if (r->mode == BS__COMPACT_INITIAL)
    rc = bs__compact_initial_check(s->id, s->m.cp_lsn.has, s->m.checkpoint, r->err);
  if (!rc && idx < s->nbuckets) { /* else the stream was cleared meanwhile */
    mem_bucket *b = s->buckets[idx];
    r->stats->bytes_before += bucket_bytes(b);
    if (r->mode == BS__COMPACT_INC) {
      rc = incremental_bucket(a, s, idx, r->horizon, &r->budget, r->stats);
    } else if (!(rc = scan_bucket(a, s, b, r))) {
      b->compacted_count = b->n; /* the mark, for selection */
      b->compacted_op = r->horizon < last_op_of(b) ? r->horizon : last_op_of(b);
    }
    r->stats->bytes_after += bucket_bytes(b);
    if (rc) rc = enomem(r->err, "compact");
    r->processed++;
  }
  unlock(ms->db);
  if (!rc) r->i++;
  return rc;
}

/* Defragmentation (the planner's bs__compact_defrag_due, as LMDB): a bucket's live rows are the
 * memberships of the source records in it whose op (the row's latest, a PUT) is at or below h;
 * the backend's transaction (reemit) appends their PUTs again in op order with new op ids. */
static int live_cmp(const void *x, const void *y) {
  const mem_live *a = x, *b = y;
  if (a->bucket != b->bucket) return a->bucket < b->bucket ? -1 : 1;
  return u64_cmp(&a->op, &b->op);
}

static int m_defragment(void *x, bs__compact_run *r, uint64_t *ids, size_t n) {
  mcx *c = x;
  mem_db *db = c->ms->db;
  mem_stream *s = c->ms->s;
  const bs_allocator *a = ALLOC(db);
  mem_live *live = NULL;
  size_t nlive = 0, cap = 0, k = 0;
  int rc = BS_OK;
  lock(db);
  for (size_t i = 0; i < s->nrecs && !rc; i++)
    for (uint32_t j = 0; s->recs[i] && j < s->recs[i]->r.nm && !rc; j++) {
      const bs__member *m = &s->recs[i]->r.m[j];
      mem_live l = {(size_t)m->bucket, i, j, m->op};
      uint64_t bucket = m->bucket;
      if (m->op > r->horizon || !bsearch(&bucket, ids, n, sizeof *ids, u64_cmp)) continue;
      if (BS_GROW(a, live, cap, nlive + 1))
        rc = BS_ENOMEM;
      else
        live[nlive++] = l;
    }
  if (nlive) qsort(live, nlive, sizeof *live, live_cmp);
  for (size_t i = 0, j; i < nlive && !rc; i = j) { /* keeps the due buckets' rows */
    for (j = i + 1; j < nlive && live[j].bucket == live[i].bucket;) j++;
    if (!bs__compact_defrag_due(j - i, s->buckets[live[i].bucket]->n, r->o->defragment_ratio))
      continue;
    memmove(live + k, live + i, (j - i) * sizeof *live);
    k += j - i;
  }
  if (rc)
    rc = enomem(r->err, "defragment");
  else if (k)
    rc = c->reemit(db, s, live, k, r->err);
  if (!rc) r->stats->ops_reemitted += k;
  unlock(db);
  bs__free(a, live);
  return rc;
}

static int m_param_fence(void *x, uint64_t h, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  (void)err;
  lock(ms->db);
  if (h > ms->s->m.param_horizon) ms->s->m.param_horizon = h;
  if (h > ms->s->m.changes_fence) ms->s->m.changes_fence = h;
  unlock(ms->db);
  return BS_OK;
}

/* The whole pass under the lock (one transaction). */
static int m_param_step(void *x, bs__compact_run *r, int *done) {
  mem_storage *ms = ((mcx *)x)->ms;
  int rc;
  lock(ms->db);
  rc = compact_params(ALLOC(ms->db), ms->s, r->horizon, &r->stats->parameter_entries_removed);
  unlock(ms->db);
  *done = 1;
  return rc ? enomem(r->err, "compact parameters") : BS_OK;
}

static const bs__compact_store mem_store = {
    m_delete_requests, m_stream,      m_aged,       NULL, m_find, m_list, m_step,
    m_defragment,      m_param_fence, m_param_step, NULL, NULL};

int bs__mem_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *o,
                    bs__mem_reemit_fn reemit, bs_error *err) {
  mcx c = {MS(st), reemit};
  return bs__compact_drive(&mem_store, &c, ALLOC(c.ms->db), o,
                           o->incremental_only ? BS__COMPACT_INC : BS__COMPACT_FULL, stats, NULL,
                           err);
}

int bs__mem_compact_initial(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                            uint64_t min_changes, bs_error *err) {
  mcx c = {MS(st), NULL};
  bs_compact_options o;
  bs_compact_stats stats;
  bs__compact_initial_options(&o, max_op_id, min_changes);
  return bs__compact_drive(&mem_store, &c, ALLOC(c.ms->db), &o, BS__COMPACT_INITIAL, &stats,
                           buckets_out, err);
}
