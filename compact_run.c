/*
 * compact_run.c: the compaction loop (contract.md section 6), one for every backend. What a call
 * does and in what order (old checkpoint requests, the horizon, the buckets, defragmentation,
 * parameters, the backend's end), which buckets it visits (named, due by compact.c's rule, or
 * queued) a batch after a cursor at a time, where the incremental op budget stops, which
 * buckets are defragmentation candidates, when the parameter pass can be skipped, and the
 * progress reports (cancel included) live here; so does a bucket's job: its phases, where a
 * transaction stops inside them, what each phase changes and how that counts. A backend
 * (lmdb_compact.c, mem_compact.c, pg_compact.c) gives its storage primitives
 * (bs__compact_store, internal.h): the stream's figures, bucket listings, its transactions, and
 * a bucket's cursors and writes (bs__op_cursor), asking compact.c what each op becomes.
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

/* ---- The bucket walk ------------------------------------------------------------------------
 * What a phase did to a bucket, in its delta: a deleted op (size: its stored size), an op of size
 * rewritten as a MOVE, the fold d->clear describes (bare: the stored size of a MOVE or CLEAR),
 * and what the statistics take of it. */

static void delta_drop(bs__compact_delta *d, const bs_op *op, uint64_t size) {
  d->count--;
  d->bytes -= (int64_t)size;
  d->checksum_sub = bs__cksum_add(d->checksum_sub, op->checksum);
  d->removed++;
  d->deleted = d->changed = 1;
  if (op->type == BS_OP_CLEAR) d->clear_dropped = 1;
}

static void delta_move(bs__compact_delta *d, uint64_t size, uint64_t bare) {
  d->bytes += (int64_t)bare - (int64_t)size;
  d->moved++;
  d->changed = 1;
}

static void delta_fold(bs__compact_delta *d, uint64_t bare) {
  /* the run's last op becomes the CLEAR, the others go */
  d->changed = 1;
  d->count = -(int64_t)(d->clear.n - 1);
  d->bytes = (int64_t)bare - (int64_t)d->clear.bytes;
  d->cleared = d->clear.n_folded;
  d->moved = d->clear.n_moved;
}

void bs__compact_span(const bs__compact_delta *d, uint64_t *start, uint64_t *op) {
  if (d->clear.n >= BS_CLEAR_MIN_RUN) {
    if (!(*op && *start && *start < d->clear.first_op)) *start = d->clear.first_op;
    *op = d->clear.last_op;
  }
  if (d->clear_dropped) *start = *op = 0;
}

static void delta_stats(bs_compact_stats *s, const bs__compact_delta *d) {
  s->ops_moved += d->moved;
  s->ops_cleared += d->cleared;
  s->ops_removed += d->removed;
  s->bytes_after = (uint64_t)((int64_t)s->bytes_after + d->bytes);
}

/* SCAN: the reverse scan of a bucket from *pos down, within t: full feeds r->seen and scan,
 * writing nothing; initial replication deletes what bs__compact_initial_drop says, into d. Stops
 * when t is full (*pos: where to go on) or at the end of the scan (*done). */
static int scan_walk(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
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
    delta_drop(d, &op, size);
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

/* ---- The bucket job ------------------------------------------------------------------------- */

static int scan_phase(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                      bs__compact_job *j, bs__compact_delta *d) {
  int rc, done;
  if ((rc = scan_walk(cur, x, r, t, &j->scan, d, &j->pos, &done)) || !done) return rc;
  if (r->mode == BS__COMPACT_INITIAL)
    j->phase = BS__JOB_INC; /* FORGET */
  else
    j->phase = j->scan.run >= BS_CLEAR_MIN_RUN ? BS__JOB_FOLD
               : j->scan.max_moved             ? BS__JOB_MOVE
                                               : BS__JOB_MARK;
  return BS_OK;
}

/* The phase after a fold: IFOLD hands over to INC (final: the run is final and INC only changes
 * ops above it, so no FOLD follows), FOLD goes on to MOVE or MARK (full) or ends the job. */
static void fold_next(const bs__compact_run *r, bs__compact_job *j, int final) {
  if (j->phase == BS__JOB_IFOLD) {
    j->ifold_done = final;
    j->phase = BS__JOB_INC;
    return;
  }
  j->pos = 0;
  j->phase = r->mode != BS__COMPACT_FULL ? BS__JOB_DONE
             : j->scan.max_moved         ? BS__JOB_MOVE
                                         : BS__JOB_MARK;
}

/* An entry the walk consumes: due at the horizon, within the budget (which it takes from). */
static int take_entry(const bs__compact_run *r, uint64_t nw, uint64_t *budget) {
  if (!bs__compact_entry_due(nw, r->horizon) || *budget == 0) return 0;
  if (*budget != UINT64_MAX) --*budget;
  return 1;
}

/* FOLD and IFOLD: the bucket's first ops, while they are in the leading run, become one CLEAR at
 * the last one's id, at most the transaction's room at a time (a CLEAR left by an earlier share
 * is folded again by the next). In the run: REMOVE/MOVE/CLEAR, and the PUT/REMOVEs that are
 * superseded: in full compaction by the seen-set; in IFOLD (incremental, before INC) by a log
 * entry that INC would consume and turn into a MOVE (target = the entry's new op). IFOLD consumes
 * those entries, so each of them costs a delete instead of a MOVE write and then a delete.
 * Entries are consumed in old-op order exactly as INC would (entries of ops no longer stored
 * included, within the op budget), so the result is the one INC then FOLD would give. When
 * IFOLD's share is not worth it (nothing for this job to consume, a run shorter than 2) it
 * changes nothing and hands over to INC then FOLD. A share shorter than 2 that does not fit
 * waits for a fresh transaction. pos (IFOLD): the first entry not yet consumed. */
static int fold_phase(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                      bs__compact_job *j, uint64_t *budget_io, bs__compact_delta *d) {
  int inc = j->phase == BS__JOB_IFOLD, full = r->mode == BS__COMPACT_FULL;
  size_t room = t->max_changes - t->changes, n = 0, kn = 0, del = 0;
  int fresh = t->changes == 0 && t->visits == 0, found, has_e = 0, rc, ended = 0, cut = 0;
  uint64_t budget = *budget_io, stop = j->pos, last = 0, eold = 0, enw = 0, size = 0;
  bs_op op;
  /* pass 1: this transaction's share of the run, the entries it consumes, the CLEAR */
  if ((rc = cur->seek_ge(x, 0, &op, &size, &found))) return rc;
  if (inc && (rc = cur->sup_seek(x, j->pos, &eold, &enw, &has_e))) return rc;
  for (;;) {
    uint64_t target = 0, b = budget;
    int mine, at;
    if (inc && !has_e && !j->consumed && kn == 0) break; /* nothing to consume: INC finds nothing */
    if (!found || op.op_id > r->horizon) {               /* the whole bucket is one run */
      ended = 1;
      stop = found ? op.op_id : last + 1;
      break;
    }
    /* entries of ops no longer stored (folded or deleted earlier), then this op's own */
    for (; has_e && eold < op.op_id; rc = cur->sup_next(x, &eold, &enw, &has_e)) {
      if (rc) return rc;
      b = budget;
      at = take_entry(r, enw, &b);
      if (n + kn + (size_t)at > room || t->visits >= t->max_visits) {
        cut = 1;
        stop = eold;
        break;
      }
      t->visits++;
      kn += (size_t)at;
      budget = b;
    }
    if (rc) return rc;
    if (cut) break;
    mine = has_e && eold == op.op_id;
    b = budget;
    at = mine && take_entry(r, enw, &b);
    /* superseded: INC would write it as a MOVE to enw (full: the seen-set's target); a
     * REMOVE/MOVE/CLEAR is in the run as it is (its entry consumed if due); any other PUT
     * survives and ends the run */
    if (full)
      bs__compact_superseded(&r->seen, &op, &target);
    else if (at && bs__compact_entry_moves(&op, enw))
      target = enw;
    if (!bs__compact_in_run(&op, target)) {
      ended = 1;
      stop = op.op_id;
      break;
    }
    if (n + 1 + kn + (size_t)at > room || t->visits >= t->max_visits) {
      cut = 1;
      stop = op.op_id;
      break;
    }
    t->visits += 1 + (size_t)mine;
    bs__clear_acc_add(&d->clear, &op, target, size);
    n++;
    last = op.op_id;
    kn += (size_t)at;
    budget = b;
    if (mine && (rc = cur->sup_next(x, &eold, &enw, &has_e))) return rc;
    if ((rc = cur->next(x, &op, &size, &found))) return rc;
  }
  if (n < BS_CLEAR_MIN_RUN || (inc && !j->consumed && kn == 0)) {
    if (cut && n < BS_CLEAR_MIN_RUN && !fresh) { /* no room left in this transaction: the next */
      t->changes = t->max_changes;
      return BS_OK;
    }
    /* IFOLD goes on to INC, then FOLD unless the run is final and short */
    fold_next(r, j, ended && n < BS_CLEAR_MIN_RUN);
    return BS_OK;
  }
  /* pass 2: the fold, then the first kn due entries from pos */
  if ((rc = cur->fold(x, &d->clear))) return rc;
  delta_fold(d, cur->bare);
  found = 0;
  if (kn && (rc = cur->sup_seek(x, j->pos, &eold, &enw, &found))) return rc;
  while (del < kn && found) {
    if (!bs__compact_entry_due(enw, r->horizon)) {
      rc = cur->sup_next(x, &eold, &enw, &found);
    } else if (!(rc = cur->sup_del(x))) {
      del++;
      rc = cur->sup_seek(x, eold + 1, &eold, &enw, &found);
    }
    if (rc) return rc;
  }
  if (del < kn)
    return bs__fail(r->err, BS_ECORRUPT, "compact: superseded entries changed under the fold");
  *budget_io = budget;
  t->changes += n + kn;
  if (kn) j->consumed = 1;
  j->pos = stop;
  if (ended) fold_next(r, j, 1);
  return BS_OK;
}

/* MOVE, full compaction: the superseded ops the fold left (above the run), in op order. */
static int move_phase(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                      bs__compact_job *j, bs__compact_delta *d) {
  uint64_t last = j->scan.max_moved < r->horizon ? j->scan.max_moved : r->horizon, size, target;
  bs_op op;
  int found, rc = cur->seek_ge(x, j->pos, &op, &size, &found);
  for (; !rc && found && op.op_id <= last; rc = cur->next(x, &op, &size, &found)) {
    if (bs__compact_txn_full(t)) {
      j->pos = op.op_id;
      return BS_OK;
    }
    t->visits++;
    if (!bs__compact_superseded(&r->seen, &op, &target)) continue;
    delta_move(d, size, cur->bare);
    t->changes++;
    if ((rc = cur->move(x, &op, target))) return rc;
  }
  if (!rc) j->phase = BS__JOB_MARK;
  return rc;
}

/* INC: converts the bucket's logged superseded ops at the horizon to MOVE and consumes their
 * entries (an op already gone or moved just consumes its entry). FORGET, initial replication:
 * only drops the entries at the horizon (their old ops are gone), then marks the bucket. */
static int inc_phase(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                     bs__compact_job *j, uint64_t *budget, bs__compact_delta *d) {
  int initial = r->mode == BS__COMPACT_INITIAL, found, rc;
  uint64_t old, nw;
  rc = cur->sup_seek(x, j->pos, &old, &nw, &found);
  while (!rc && found) {
    bs_op op;
    uint64_t size = 0;
    int at = 0;
    if (*budget == 0) { /* out of budget: fold what was consumed, then stop */
      j->pos = old;
      j->phase = j->consumed && !j->ifold_done ? BS__JOB_FOLD : BS__JOB_DONE;
      return BS_OK;
    }
    if (bs__compact_txn_full(t)) {
      j->pos = old;
      return BS_OK;
    }
    t->visits++;
    if (!take_entry(r, nw, budget)) { /* a later pass takes it */
      rc = cur->sup_next(x, &old, &nw, &found);
      continue;
    }
    if (!initial && (rc = cur->get(x, old, &op, &size, &at))) return rc;
    if (at && bs__compact_entry_moves(&op, nw)) {
      delta_move(d, size, cur->bare);
      t->changes++;
      if ((rc = cur->move(x, &op, nw))) return rc;
    }
    j->consumed = 1;
    t->changes++;
    if (!(rc = cur->sup_del(x))) rc = cur->sup_seek(x, old + 1, &old, &nw, &found);
  }
  if (!rc && cur->sup_end) rc = cur->sup_end(x);
  if (rc) return rc;
  j->pos = 0;
  j->phase = j->consumed && !j->ifold_done && !initial ? BS__JOB_FOLD : BS__JOB_DONE;
  d->mark = initial;
  return BS_OK;
}

static int start_phase(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_job *j) {
  uint64_t bytes = 0;
  int exists = 0, rc = cur->start(x, &bytes, &exists);
  if (rc) return rc;
  if (!exists) { /* cleared meanwhile: nothing to do */
    j->gone = 1;
    j->phase = BS__JOB_DONE;
    return BS_OK;
  }
  r->stats->bytes_before += bytes;
  r->stats->bytes_after += bytes;
  if (r->mode == BS__COMPACT_INC) {
    j->phase = BS__JOB_IFOLD;
    return BS_OK;
  }
  bs__seen_clear(&r->seen);
  j->phase = BS__JOB_SCAN;
  j->pos = r->horizon;
  return BS_OK;
}

int bs__compact_job_run(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                        bs__compact_job *j, uint64_t *budget, uint64_t *processed) {
  int rc = BS_OK, started = j->phase != BS__JOB_DONE;
  while (!rc && j->phase != BS__JOB_DONE && !bs__compact_txn_full(t)) {
    bs__compact_delta d;
    memset(&d, 0, sizeof d);
    switch (j->phase) {
    case BS__JOB_START:
      rc = start_phase(cur, x, r, j);
      break;
    case BS__JOB_SCAN:
      rc = scan_phase(cur, x, r, t, j, &d);
      break;
    case BS__JOB_FOLD:
    case BS__JOB_IFOLD:
      rc = fold_phase(cur, x, r, t, j, budget, &d);
      break;
    case BS__JOB_MOVE:
      rc = move_phase(cur, x, r, t, j, &d);
      break;
    case BS__JOB_INC:
      rc = inc_phase(cur, x, r, t, j, budget, &d);
      break;
    case BS__JOB_MARK:
      j->phase = BS__JOB_DONE;
      d.mark = 1;
      break;
    default:
      rc = bs__fail(r->err, BS_ECORRUPT, "compact: bad job phase %d", j->phase);
    }
    if (rc || (!d.changed && !d.mark) || (rc = cur->apply(x, &d))) continue;
    delta_stats(r->stats, &d);
    j->changed |= d.changed;
    t->changes++; /* the bucket state */
  }
  if (!rc && started && j->phase == BS__JOB_DONE && !j->gone) {
    ++*processed;
    r->stats->buckets_compacted += (uint64_t)j->changed;
  }
  return rc;
}
