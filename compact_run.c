/*
 * compact_run.c: the compaction loop (contract.md section 6), one for every backend. What a call
 * does and in what order (old checkpoint requests, the horizon, the buckets, defragmentation,
 * parameters, the backend's end), which buckets it visits (named, due by compact.c's rule, or
 * queued) a batch after a cursor at a time, where the incremental op budget stops, which
 * buckets are defragmentation candidates, when the parameter pass can be skipped, and the
 * progress reports (cancel included) live here. A backend (lmdb_compact.c, mem_compact.c,
 * pg_compact.c) gives its storage primitives (bs__compact_store, internal.h): the stream's
 * figures, bucket listings, and steps that walk a bucket's ops in its own bounded transactions
 * asking compact.c what each op becomes.
 */
#include "internal.h"

#include <stdlib.h>

int bs__compact_report(bs__compact_run *r) {
  if (memcmp(&r->reported, r->stats, sizeof r->reported) == 0) return BS_OK;
  r->reported = *r->stats;
  return bs__compact_progress(r->o, r->stats, r->err);
}

typedef struct idvec {
  const bs_allocator *a;
  uint64_t *v;
  size_t n, cap;
} idvec;

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Works the batch ids[0..n), a step (a transaction or more) at a time; the buckets finished
 * become defragmentation candidates (cand NULL: none wanted). */
static int work_batch(const bs__compact_store *s, void *x, bs__compact_run *r, const uint64_t *ids,
                      size_t n, idvec *cand) {
  int rc = BS_OK;
  r->ids = ids;
  r->n = n;
  r->i = 0;
  r->busy = 0;
  while (!rc && r->i < r->n && (r->budget || r->busy)) {
    size_t from = r->i;
    if ((rc = s->step(x, r))) break;
    if (cand && BS_GROW(cand->a, cand->v, cand->cap, cand->n + (r->i - from)))
      rc = bs__fail(r->err, BS_ENOMEM, "compact: defragmentation candidates");
    for (size_t k = from; cand && !rc && k < r->i; k++) cand->v[cand->n++] = ids[k];
    if (!rc) rc = bs__compact_report(r);
  }
  r->ids = NULL; /* the caller's array: not kept past this call */
  return rc;
}

/* A bucket the call compacts: one with an op at or below the horizon (a bucket max_op_id leaves
 * untouched is neither counted nor marked), and named (opts->buckets), queued (incremental) or
 * due. */
static int selected(const bs__compact_run *r, const bs__compact_bucket *b, int named) {
  if (r->mode == BS__COMPACT_INC) return 1; /* queued: its log says what is due */
  if (!(b->first_op && b->first_op <= r->horizon)) return 0;
  return named ||
         bs__compact_bucket_due(r->o, b->count, b->compacted_count, b->last_op, b->compacted_op);
}

/* The buckets of the call, a batch at a time while the budget lasts: incremental, the queue;
 * else the named ones (opts->buckets, unknown names skipped), or every bucket that is due. */
static int compact_buckets(const bs__compact_store *s, void *x, bs__compact_run *r, idvec *cand) {
  const bs_compact_options *o = r->o;
  uint64_t ids[BS__COMPACT_BATCH];
  bs__compact_bucket b[BS__COMPACT_BATCH];
  bs__compact_cursor cur;
  int rc = BS_OK, queued = r->mode == BS__COMPACT_INC, named = o->buckets && !queued;
  memset(&cur, 0, sizeof cur);
  while (!rc && !cur.done && r->budget) {
    size_t n = 0, nb = 0;
    if (named) {
      for (; cur.from < o->n_buckets && nb < BS__COMPACT_BATCH && !rc; cur.from++) {
        int found = 0;
        rc = s->find(x, o->buckets[cur.from], &b[nb], &found, r->err);
        nb += !rc && found;
      }
      cur.done = cur.from == o->n_buckets;
    } else {
      rc = s->list(x, queued, &cur, b, &nb, r->err);
    }
    for (size_t k = 0; !rc && k < nb; k++)
      if (selected(r, &b[k], named)) ids[n++] = b[k].id;
    if (!rc && n) rc = work_batch(s, x, r, ids, n, cand);
  }
  return rc;
}

static int defragment(const bs__compact_store *s, void *x, bs__compact_run *r, idvec *cand) {
  size_t n = 0;
  if (!cand->n) return BS_OK;
  qsort(cand->v, cand->n, sizeof *cand->v, cmp_u64);
  for (size_t i = 0; i < cand->n; i++) /* a bucket named twice is defragmented once */
    if (!n || cand->v[n - 1] != cand->v[i]) cand->v[n++] = cand->v[i];
  return s->defragment(x, r, cand->v, n);
}

static int compact_params(const bs__compact_store *s, void *x, bs__compact_run *r,
                          uint64_t cursor) {
  int rc, done = 0;
  if ((rc = s->param_fence(x, r->horizon, r->err))) return rc;
  /* everything at or below the cursor was reduced by an earlier pass at that horizon */
  if (r->horizon <= cursor) return BS_OK;
  while (!rc && !done)
    if (!(rc = s->param_step(x, r, &done))) rc = bs__compact_report(r);
  if (!rc && s->param_mark) rc = s->param_mark(x, r->horizon, r->err);
  return rc;
}

int bs__compact_drive(const bs__compact_store *s, void *x, const bs_allocator *a,
                      const bs_compact_options *o, int mode, bs_compact_stats *stats,
                      uint64_t *processed, bs_error *err) {
  bs__compact_run r;
  bs__compact_stream sr;
  idvec cand = {a, NULL, 0, 0};
  int64_t cutoff = bs__aged_cutoff(bs__now_ms(), o->min_age_ms);
  uint64_t aged = 0;
  int rc = BS_OK, initial = mode == BS__COMPACT_INITIAL, has_aged = 0;
  BS_ASSERT(o && o->version && o->max_ops_per_txn >= 2 && o->memory_limit_mb && stats);
  memset(&r, 0, sizeof r);
  memset(&sr, 0, sizeof sr);
  memset(stats, 0, sizeof *stats);
  r.o = o;
  r.mode = mode;
  r.stats = stats;
  r.err = err;
  r.budget = bs__compact_budget(o);
  bs__seen_init(&r.seen, a, o->memory_limit_mb * 1024u * 1024u);
  if (!initial && o->delete_checkpoint_requests_before_ms > 0 && s->delete_requests)
    rc = s->delete_requests(x, o->delete_checkpoint_requests_before_ms,
                            &stats->checkpoint_requests_deleted, err);
  if (!rc) rc = s->stream(x, &sr, err);
  if (!rc && initial) rc = bs__compact_initial_check(sr.id, sr.has_checkpoint, sr.checkpoint, err);
  if (!rc && o->incremental_only && o->min_age_ms) {
    rc = s->aged(x, cutoff, &aged, err);
    has_aged = 1;
  }
  if (!rc)
    r.horizon = bs__compact_horizon(o, initial ? sr.op_head : sr.checkpoint, aged, sr.op_head);
  /* horizon 0 (no checkpoint yet): nothing to compact, no bucket marked */
  if (!rc && r.horizon && !initial && s->begin) rc = s->begin(x, r.horizon, err);
  if (!rc && r.horizon)
    rc = compact_buckets(s, x, &r, o->defragment_ratio > 0 && !initial ? &cand : NULL);
  if (!rc && r.horizon && o->defragment_ratio > 0 && !initial) rc = defragment(s, x, &r, &cand);
  if (!rc && r.horizon && o->compact_parameters && !initial)
    rc = compact_params(s, x, &r, sr.param_cursor);
  if (!rc && !initial && s->end) {
    if (!has_aged) rc = s->aged(x, cutoff, &aged, err);
    if (!rc) rc = s->end(x, &r, aged);
  }
  if (!rc) rc = bs__compact_report(&r);
  bs__seen_free(&r.seen);
  bs__free(a, cand.v);
  if (processed) *processed = r.processed;
  return rc;
}

/* ---- The bucket walk ------------------------------------------------------------------------ */

void bs__compact_delta_drop(bs__compact_delta *d, const bs_op *op, uint64_t size) {
  d->count--;
  d->bytes -= (int64_t)size;
  d->checksum_sub = bs__cksum_add(d->checksum_sub, op->checksum);
  d->removed++;
  d->deleted = d->changed = 1;
  if (op->type == BS_OP_CLEAR) d->clear_dropped = 1;
}

void bs__compact_delta_move(bs__compact_delta *d, uint64_t size, uint64_t bare) {
  d->bytes += (int64_t)bare - (int64_t)size;
  d->moved++;
  d->changed = 1;
}

void bs__compact_delta_fold(bs__compact_delta *d, uint64_t bare) {
  /* the run's last op becomes the CLEAR, the others go */
  d->changed = 1;
  d->count = -(int64_t)(d->clear.n - 1);
  d->bytes = (int64_t)bare - (int64_t)d->clear.bytes;
  d->cleared = d->clear.n_folded;
  d->moved = d->clear.n_moved;
}

void bs__compact_delta_stats(bs_compact_stats *s, const bs__compact_delta *d) {
  s->ops_moved += d->moved;
  s->ops_cleared += d->cleared;
  s->ops_removed += d->removed;
  s->bytes_after = (uint64_t)((int64_t)s->bytes_after + d->bytes);
}

int bs__compact_scan_walk(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                          bs__compact_scan *scan, bs__compact_delta *d, uint64_t *pos, int *done) {
  int initial = r->mode == BS__COMPACT_INITIAL, found = 0, rc;
  uint64_t size = 0;
  bs_op op;
  *done = 0;
  rc = *pos ? cur->seek_le(x, *pos, &op, &size, &found) : BS_OK;
  while (!rc && found) {
    if (bs__compact_txn_full(t)) {
      *pos = op.op_id;
      return BS_OK;
    }
    t->visits++;
    if (!initial && !bs__compact_scan_op(scan, &r->seen, &op)) break;
    if (!initial || !bs__compact_initial_drop(&r->seen, &op)) {
      rc = cur->prev(x, &op, &size, &found);
      continue;
    }
    /* every decision depends only on the ops above: delete as the scan goes */
    bs__compact_delta_drop(d, &op, size);
    t->changes++;
    if ((rc = cur->del(x))) break;
    found = 0;
    if (op.op_id > 1) rc = cur->seek_le(x, op.op_id - 1, &op, &size, &found);
  }
  if (rc) return rc;
  *pos = 0;
  *done = 1;
  return BS_OK;
}
