/*
 * mem_compact.c: the memory backend's compaction primitives (contract.md 6) for the loop of
 * compact_run.c, which decides what is compacted in what order and reports progress; compact.c
 * plans every op, as for LMDB and PostgreSQL. A step is a transaction of a bucket's job under the
 * lock, bounded by max_ops_per_txn as LMDB's (m_step). Bucket ids are the stream's bucket
 * indexes. The parameter pass is compact_params.c's and defragmentation compact_defrag.c's,
 * over this store's cursor of entries and its source records, a transaction under the lock at a
 * time.
 */
#include "mem_internal.h"

#include <stddef.h>
#include <stdlib.h>

typedef struct mcx {
  mem_storage *ms;
  bs__mem_reemit_fn reemit;
  bs__param_pos ppos;  /* where the parameter pass resumes */
  bs__compact_job job; /* the bucket job in progress (r->busy) */
  uint64_t clears;     /* the stream's clears when it started */
} mcx;

static int sup_cmp(const void *x, const void *y) {
  return u64_cmp(&((const mem_sup *)x)->old_op, &((const mem_sup *)y)->old_op);
}

/* The job's bucket (bs__op_cursor) under the lock: ops[k] is the current op (k == n: none), and
 * sups (sorted by old op) the log, sups[e] its current entry. A deleted op is only marked (drop),
 * and apply closes up the array; a consumed entry gets new_op 0, and the step closes up the log. */
typedef struct mcur {
  const bs_allocator *a;
  mem_stream *s;
  mem_bucket *b;
  uint64_t horizon;
  size_t k, e;
  unsigned char *drop;
  bs_error *err;
} mcur;

static int mcur_at(mcur *m, size_t k, bs_op *op, uint64_t *size, int *found) {
  m->k = k < m->b->n ? k : m->b->n;
  if ((*found = m->k < m->b->n)) {
    *op = m->b->ops[m->k];
    *size = op_size(&m->b->ops[m->k]);
  }
  return BS_OK;
}

/* The first of n records (of stride bytes, each starting with a uint64_t key) whose key is >=
 * key: ops by id, log entries by old op. */
_Static_assert(offsetof(bs_op, op_id) == 0 && offsetof(mem_sup, old_op) == 0,
               "lower: the key first");
static size_t lower(const void *base, size_t n, size_t stride, uint64_t key) {
  const unsigned char *p = base;
  while (n > 0) {
    size_t half = n / 2;
    uint64_t k;
    memcpy(&k, p + half * stride, sizeof k);
    if (k < key) {
      p += (half + 1) * stride;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  return base ? (size_t)(p - (const unsigned char *)base) / stride : 0;
}

static int mcur_seek_le(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  size_t k = pos == UINT64_MAX ? m->b->n : lower(m->b->ops, m->b->n, sizeof(bs_op), pos + 1);
  return mcur_at(m, k ? k - 1 : m->b->n, op, size, found);
}

static int mcur_prev(void *x, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  return mcur_at(m, m->k ? m->k - 1 : m->b->n, op, size, found);
}

static int mcur_seek_ge(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  return mcur_at(m, lower(m->b->ops, m->b->n, sizeof(bs_op), pos), op, size, found);
}

static int mcur_next(void *x, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  return mcur_at(m, m->k + 1, op, size, found);
}

static int mcur_get(void *x, uint64_t id, bs_op *op, uint64_t *size, int *found) {
  mcur *m = x;
  return mcur_at(m, op_index(m->b, id), op, size, found);
}

static int mcur_del(void *x) {
  mcur *m = x;
  if (!m->drop && !(m->drop = bs__calloc(m->a, m->b->n, 1))) return enomem(m->err, "compact");
  m->drop[m->k] = 1;
  return BS_OK;
}

static int mcur_move(void *x, const bs_op *op, uint64_t target) {
  mcur *m = x;
  bs_op mv = bs__compact_move_op(op, target);
  op_free(m->a, &m->b->ops[m->k]);
  m->b->ops[m->k] = mv;
  return BS_OK;
}

/* In place: the CLEAR replaces two ops or more, so nothing can fail. */
static int mcur_fold(void *x, const bs__clear_acc *clear) {
  mcur *m = x;
  mem_bucket *b = m->b;
  size_t n = (size_t)clear->n;
  bs_op c = bs__compact_clear_op(clear);
  for (size_t k = 0; k < n; k++) op_free(m->a, &b->ops[k]);
  b->ops[0] = c;
  memmove(b->ops + 1, b->ops + n, (b->n - n) * sizeof *b->ops);
  b->n -= n - 1;
  return BS_OK;
}

static int mcur_sup_at(mcur *m, size_t e, uint64_t *old, uint64_t *nw, int *found) {
  while (e < m->b->nsups && !m->b->sups[e].new_op) e++; /* consumed */
  m->e = e;
  if ((*found = e < m->b->nsups)) {
    *old = m->b->sups[e].old_op;
    *nw = m->b->sups[e].new_op;
  }
  return BS_OK;
}

static int mcur_sup_seek(void *x, uint64_t old, uint64_t *old_out, uint64_t *nw, int *found) {
  mcur *m = x;
  return mcur_sup_at(m, lower(m->b->sups, m->b->nsups, sizeof(mem_sup), old), old_out, nw, found);
}

static int mcur_sup_next(void *x, uint64_t *old, uint64_t *nw, int *found) {
  mcur *m = x;
  return mcur_sup_at(m, m->e + 1, old, nw, found);
}

static int mcur_sup_del(void *x) {
  mcur *m = x;
  m->b->sups[m->e].new_op = 0;
  return BS_OK;
}

static int mcur_start(void *x, uint64_t *bytes, int *exists) {
  mcur *m = x;
  *exists = 1;
  *bytes = bucket_bytes(m->b);
  return BS_OK;
}

static int mcur_apply(void *x, const bs__compact_delta *d) {
  mcur *m = x;
  mem_bucket *b = m->b;
  size_t nn = 0;
  if (d->changed) {
    for (size_t k = 0; k < b->n; k++) /* nn <= k: ops[k] is read before ops[nn] is written */
      if (m->drop && m->drop[k])
        op_free(m->a, &b->ops[k]);
      else
        b->ops[nn++] = b->ops[k];
    b->n = nn;
    bs__free(m->a, m->drop);
    m->drop = NULL;
    if (nn < b->cap / 4) { /* give the space back; on failure the array just stays larger */
      bs_op *p = bs__realloc(m->a, b->ops, (nn ? nn : 1) * sizeof *p);
      if (p) {
        b->ops = p;
        b->cap = nn ? nn : 1;
      }
    }
    bs__compact_span(d, &b->clear_start, &b->clear_op);
    b->generation = ++m->s->m.gen_seq;
  }
  if (d->mark) {
    b->compacted_count = b->n;
    b->compacted_op = m->horizon < last_op_of(b) ? m->horizon : last_op_of(b);
  }
  return BS_OK;
}

static const bs__op_cursor mcur_ops = {
    mcur_seek_le, mcur_prev, mcur_seek_ge, mcur_next,     mcur_get,
    mcur_del,     mcur_move, mcur_fold,    mcur_sup_seek, mcur_sup_next,
    mcur_sup_del, NULL,      mcur_start,   mcur_apply,    0};

/* The parameter pass's cursor (bs__param_cursor) under the lock: a group (one row's entries of a
 * lookup) is the run params[g0, g1) of param_cmp's order, walked from its end (newest first);
 * a deleted entry is only marked (drop), and the step closes up the array. */
typedef struct mpar {
  const bs_allocator *a;
  mem_stream *s;
  size_t g0, g1, k;
  unsigned char *drop;
} mpar;

static int mpar_at(mpar *p, size_t k, bs__param_entry *e, int *found) {
  const mem_param *q = &p->s->params[k];
  bs__param_entry x = {q->key, q->rid, q->table, q->id, (uint32_t)q->nrows};
  p->k = k;
  *e = x;
  *found = 1;
  return BS_OK;
}

/* The group starting at g0: its newest entry. */
static int mpar_group(mpar *p, size_t g0, bs__param_entry *e, int *found) {
  const mem_param *q = p->s->params;
  if ((*found = g0 < p->s->nparams) == 0) return BS_OK;
  for (p->g0 = g0, p->g1 = g0 + 1; p->g1 < p->s->nparams; p->g1++)
    if (q[p->g1].table != q[g0].table || !bs__val_eq(q[p->g1].key, q[g0].key) ||
        !bs__val_eq(q[p->g1].rid, q[g0].rid))
      break;
  return mpar_at(p, p->g1 - 1, e, found);
}

static int mpar_seek(void *x, const bs__param_pos *pos, bs__param_entry *e, int *found,
                     bs_error *err) {
  mpar *p = x;
  /* past every entry of pos's group: the greatest op id sorts after them */
  mem_param after = {
      {pos->lookup, pos->lookup_size}, pos->table, {pos->rid, pos->rid_size}, UINT64_MAX, NULL, 0};
  BS_UNUSED(err);
  return mpar_group(p, pos->started ? param_lower(p->s, &after) : 0, e, found);
}

static int mpar_next(void *x, bs__param_entry *e, int *found, bs_error *err) {
  mpar *p = x;
  BS_UNUSED(err);
  return p->k > p->g0 ? mpar_at(p, p->k - 1, e, found) : mpar_group(p, p->g1, e, found);
}

static int mpar_del(void *x, bs_error *err) {
  mpar *p = x;
  if (!p->drop && !(p->drop = bs__calloc(p->a, p->s->nparams, 1))) return enomem(err, "compact");
  p->drop[p->k] = 1;
  return BS_OK;
}

static const bs__param_cursor mpar_ops = {mpar_seek, mpar_next, mpar_del};

/* ---- Primitives (bs__compact_store) ------------------------------------------------------- */

static int m_delete_requests(void *x, int64_t before_ms, uint64_t *deleted, bs_error *err) {
  return bs__mem_delete_requests(deleted, &((mcx *)x)->ms->rs.base, before_ms, err);
}

static int m_stream(void *x, bs__compact_stream *out, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  (void)err;
  lock(ms->db);
  out->id = ms->s->id;
  out->checkpoint = ms->s->m.row.checkpoint;
  out->op_head = ms->s->m.row.op_head;
  out->has_checkpoint = ms->s->m.row.checkpoint_lsn.data != NULL;
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
      i, b->n, b->compacted_count, last_op_of(b), b->compacted_op, b->n ? b->ops[0].op_id : 0};
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

/* A transaction of the job of bucket ids[i] under the lock, bounded as LMDB's: max_ops_per_txn
 * ops changed, 8 times that many visited. The job goes on in the next step (r->busy) from where
 * it stopped: writers only append above the horizon meanwhile (their log entries unsorted: each
 * step sorts the log first). Bucket indexes stay valid but
 * across a clear (which empties the stream and counts itself): the job then ends. */
static int m_step(void *x, bs__compact_run *r) {
  mcx *c = x;
  mem_stream *s = c->ms->s;
  size_t idx = (size_t)r->ids[r->i], max = r->o->max_ops_per_txn;
  bs__compact_txn t = {0, 0, max, max > SIZE_MAX / 8 ? SIZE_MAX : max * 8};
  int rc = BS_OK;
  lock(c->ms->db);
  if (!r->busy) {
    memset(&c->job, 0, sizeof c->job);
    c->clears = s->m.clears;
  }
  /* initial replication: a writer may have committed the first checkpoint meanwhile */
  if (r->mode == BS__COMPACT_INITIAL)
    rc = bs__compact_initial_check(s->id, s->m.row.checkpoint_lsn.data != NULL, s->m.row.checkpoint,
                                   r->err);
  if (!rc && idx < s->nbuckets && c->clears == s->m.clears) {
    mcur m = {ALLOC(c->ms->db), s, s->buckets[idx], r->horizon, 0, 0, NULL, r->err};
    size_t k = 0;
    /* the walks seek the log by old op; a writer only appends to it (in its own order) */
    if (m.b->nsups) qsort(m.b->sups, m.b->nsups, sizeof *m.b->sups, sup_cmp);
    rc = bs__compact_job_run(&mcur_ops, &m, r, &t, &c->job, &r->budget, &r->processed);
    for (size_t i = 0; i < m.b->nsups; i++) /* the log without the consumed entries */
      if (m.b->sups[i].new_op) m.b->sups[k++] = m.b->sups[i];
    m.b->nsups = k;
    bs__free(m.a, m.drop);
  } else {
    c->job.phase = BS__JOB_DONE; /* cleared meanwhile */
  }
  unlock(c->ms->db);
  if (!rc) r->busy = c->job.phase != BS__JOB_DONE;
  if (!rc && !r->busy) r->i++;
  return rc;
}

/* Defragmentation (compact_defrag.c) over this store: a membership's key is the record's table id
 * (4 bytes, native order) and replica id; the re-emission is a writer's transaction, which mem.c
 * (the top) hands down as reemit. */
static int d_begin(void *x, bs_error *err) {
  BS_UNUSED(err);
  lock(((mcx *)x)->ms->db);
  return BS_OK;
}

static void d_end(void *x) {
  unlock(((mcx *)x)->ms->db);
}

static int d_members(void *x, bs__defrag_member_fn fn, void *arg, bs_error *err) {
  const mem_stream *s = ((mcx *)x)->ms->s;
  unsigned char key[4 + BS_MAX_REPLICA_ID];
  int rc = BS_OK;
  BS_UNUSED(err);
  for (size_t i = 0; i < s->ridx.cap && !rc; i++) {
    const mem_rec *r = rec_at(s, i);
    if (!r) continue;
    memcpy(key, &r->table, 4);
    if (r->rid.size) memcpy(key + 4, r->rid.data, r->rid.size);
    for (uint32_t j = 0; j < r->r.nm && !rc; j++)
      rc = fn(arg, r->r.m[j].bucket, r->r.m[j].op, key, 4 + r->rid.size);
  }
  return rc;
}

static int d_count(void *x, uint64_t bucket, uint64_t *count, int *found, bs_error *err) {
  const mem_stream *s = ((mcx *)x)->ms->s;
  BS_UNUSED(err);
  if ((*found = bucket < s->nbuckets)) *count = s->buckets[bucket]->n;
  return BS_OK;
}

static int d_reemit(void *x, const bs__defrag_row *rows, size_t n, uint64_t *emitted,
                    bs_error *err) {
  mcx *c = x;
  return c->reemit(c->ms->db, c->ms->s, rows, n, emitted, err);
}

static const bs__defrag_store mem_defrag = {d_begin, d_end, d_members, d_count, d_reemit};

static int m_defragment(void *x, bs__compact_run *r, uint64_t *ids, size_t n) {
  return bs__compact_defrag(&mem_defrag, x, ALLOC(((mcx *)x)->ms->db), r, ids, n);
}

static int m_param_fence(void *x, uint64_t h, bs_error *err) {
  mem_storage *ms = ((mcx *)x)->ms;
  (void)err;
  lock(ms->db);
  if (h > ms->s->m.row.param_horizon) ms->s->m.row.param_horizon = h;
  if (h > ms->s->m.row.changes_fence) ms->s->m.row.changes_fence = h;
  unlock(ms->db);
  return BS_OK;
}

/* One transaction of the pass under the lock (compact_params.c), its deletions applied at its
 * end (none on failure). */
static int m_param_step(void *x, bs__compact_run *r, int *done) {
  mcx *c = x;
  mem_stream *s = c->ms->s;
  mpar p = {ALLOC(c->ms->db), s, 0, 0, 0, NULL};
  size_t nn = 0;
  int rc;
  lock(c->ms->db);
  rc = bs__compact_param_txn(&mpar_ops, &p, r, &c->ppos);
  for (size_t k = 0; !rc && p.drop && k < s->nparams; k++) /* nn <= k */
    if (p.drop[k])
      param_free(p.a, &s->params[k]);
    else
      s->params[nn++] = s->params[k];
  if (!rc && p.drop) s->nparams = nn;
  unlock(c->ms->db);
  bs__free(p.a, p.drop);
  *done = c->ppos.done;
  return rc;
}

static const bs__compact_store mem_store = {
    m_delete_requests, m_stream,      m_aged,       NULL, m_find, m_list, m_step,
    m_defragment,      m_param_fence, m_param_step, NULL, NULL};

int bs__mem_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *o,
                    bs__mem_reemit_fn reemit, bs_error *err) {
  mcx c;
  memset(&c, 0, sizeof c);
  c.ms = MS(st);
  c.reemit = reemit;
  return bs__compact_drive(&mem_store, &c, ALLOC(c.ms->db), o,
                           o->incremental_only ? BS__COMPACT_INC : BS__COMPACT_FULL, stats, NULL,
                           err);
}

int bs__mem_compact_initial(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                            uint64_t min_changes, bs_error *err) {
  mcx c;
  memset(&c, 0, sizeof c);
  c.ms = MS(st);
  bs_compact_options o;
  bs_compact_stats stats;
  bs__compact_initial_options(&o, max_op_id, min_changes);
  return bs__compact_drive(&mem_store, &c, ALLOC(c.ms->db), &o, BS__COMPACT_INITIAL, &stats,
                           buckets_out, err);
}
