/*
 * mem.c: the memory backend. A naive, obviously correct implementation of contract.md, used as the
 * reference model for differential tests against the LMDB backend and as a dependency-free test
 * double. Everything is a plain growable array but the source records, which are kept in a hash
 * table by (table, replica id) (common.c's; a save finds a record without a scan); every derived
 * value (bucket checksums, counts, parameter sets, changes) is recomputed from the stored ops and
 * entries on each read (the engine's reads, reads.c, over mem_read.c's primitives), never kept
 * as a running total. The only acceleration: a hash index of the buckets by name, and a count of
 * soft-deleted records so a checkpoint scans the records for purges only while there are any. The caller of a lookup compares the real key, and verify()
 * checks that every record and bucket is found where it is, and the counts. One mutex
 * (mem_db.mu) guards the whole store; callbacks are always called after it is released, on
 * copies of the data.
 *
 * Atomicity: a writer's flush/commit runs as a "transaction" (mem_tx) over one stream. Everything
 * a flush does is either an insert of something numbered by a new op id (ops, the compaction log,
 * parameter entries: undone by dropping those above the old op head), an append (buckets,
 * tables, change log: undone by truncating to the saved lengths), a change of the scalar stream
 * state (mem_meta: saved and restored as a whole), or the replacement of an immutable object
 * (a source record: journaled as (old, new) and the hash table changed; a custom write
 * checkpoint: journaled as (slot, old pointer)). A failure (ENOMEM) at any point rolls all of it
 * back, so a failed call changes nothing. A commit frees what was replaced. Compaction and the
 * other maintenance calls build the new state first and swap it in.
 */
#include "mem_internal.h"

/* ---- Small helpers -------------------------------------------------------------------------- */

/* Keeps the bytes of m->row's three LSNs in m->lsn (in the row's order), after lifecycle.c set
 * one to the call's. */
static void lsn_keep(mem_meta *m) {
  bs_val *f[3] = {&m->row.checkpoint_lsn, &m->row.resume_lsn, &m->row.no_checkpoint_before};
  for (int k = 0; k < 3; k++)
    if (f[k]->data && f[k]->data != m->lsn[k]) {
      f[k]->size = f[k]->size < BS_MAX_LSN ? f[k]->size : BS_MAX_LSN;
      memmove(m->lsn[k], f[k]->data, f[k]->size);
      f[k]->data = m->lsn[k];
    }
}

static void bucket_free(const bs_allocator *a, mem_bucket *b) {
  if (!b) return;
  for (size_t i = 0; i < b->n; i++) op_free(a, &b->ops[i]);
  bs__free(a, b->ops);
  bs__free(a, b->sups);
  bs__free(a, b); /* and the name */
}

/* Drops every piece of data of s (not its meta, name or id). */
static void stream_data_free(const bs_allocator *a, mem_stream *s) {
  for (size_t i = 0; i < s->ntables; i++) bs__free(a, s->tables[i]);
  bs__free(a, s->tables);
  for (size_t i = 0; i < s->nbuckets; i++) bucket_free(a, s->buckets[i]);
  bs__free(a, s->buckets);
  for (size_t i = 0; i < s->ridx.cap; i++) bs__free(a, rec_at(s, i));
  for (size_t i = 0; i < s->nparams; i++) param_free(a, &s->params[i]);
  bs__free(a, s->params);
  bs__free(a, s->bch);
  for (size_t i = 0; i < s->nuch; i++) val_free(a, &s->uch[i].user);
  bs__free(a, s->uch);
  bs__free(a, s->cps);
  for (size_t i = 0; i < s->ncw; i++) bs__free(a, s->cw[i]);
  bs__free(a, s->cw);
  bs__htab_free(&s->ridx, a);
  bs__htab_free(&s->bidx, a);
  /* every other field is data: empty arrays and indexes are all zero */
  mem_stream kept = {.id = s->id, .name = s->name, .m = s->m, .writers = s->writers};
  *s = kept;
}

static void stream_free(const bs_allocator *a, mem_stream *s) {
  if (!s) return;
  stream_data_free(a, s);
  val_free(a, &s->name);
  bs__free(a, s);
}

static mem_table *table_find(mem_stream *s, bs_val name) {
  for (size_t i = 0; i < s->ntables; i++)
    if (!s->tables[i]->dropped && bs__val_eq(s->tables[i]->name, name)) return s->tables[i];
  return NULL;
}

/* ---- Transactions over one stream (see the file comment) ------------------------------------ */

enum { J_REC, J_CWCP, J_DROP, J_MWCP };
typedef struct mem_jent {
  int kind;
  size_t idx;
  void *old, *now; /* J_REC: the record replaced (NULL: none) and the one stored (NULL: none) */
} mem_jent;

typedef struct mem_tx {
  mem_db *db;
  mem_stream *s;
  mem_meta meta;
  size_t ntables, nbuckets, nbch, nuch, ncps, ncw;
  mem_jent *j;
  size_t nj, cj;
} mem_tx;

static void tx_begin(mem_tx *tx, mem_db *db, mem_stream *s) {
  *tx = (mem_tx){.db = db,
                 .s = s,
                 .meta = s->m,
                 .ntables = s->ntables,
                 .nbuckets = s->nbuckets,
                 .nbch = s->nbch,
                 .nuch = s->nuch,
                 .ncps = s->ncps,
                 .ncw = s->ncw};
}

/* Journals slot idx of kind (the caller then stores the new pointer there). */
static int tx_journal(mem_tx *tx, int kind, size_t idx, void *old) {
  mem_jent e = {kind, idx, old, NULL};
  if (BS_GROW(ALLOC(tx->db), tx->j, tx->cj, tx->nj + 1)) return BS_ENOMEM;
  tx->j[tx->nj++] = e;
  return BS_OK;
}

static void tx_rollback(mem_tx *tx) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  size_t kept = 0;
  for (size_t k = tx->nj; k-- > 0;) {
    mem_jent *e = &tx->j[k];
    if (e->kind == J_REC) {
      mem_rec *now = e->now, *old = e->old;
      if (now) bs__htab_remove(&s->ridx, rec_hash(now->table, now->rid), (uintptr_t)now);
      bs__free(a, now);
      /* cannot fail: the index held this many entries at that point of the transaction */
      if (old) bs__htab_put(&s->ridx, rec_hash(old->table, old->rid), (uintptr_t)old);
    } else if (e->kind == J_CWCP) {
      if (s->cw[e->idx] != e->old) bs__free(a, s->cw[e->idx]);
      s->cw[e->idx] = e->old;
    } else if (e->kind == J_MWCP) {
      tx->db->mw[e->idx]->processed = 0;
    } else {
      s->tables[e->idx]->dropped = 0;
    }
  }
  s->ncw = tx->ncw;
  for (size_t i = tx->ntables; i < s->ntables; i++) bs__free(a, s->tables[i]);
  s->ntables = tx->ntables;
  for (size_t i = tx->nbuckets; i < s->nbuckets; i++) {
    bs__htab_remove(&s->bidx, name_hash(s->buckets[i]->name), i + 1);
    bucket_free(a, s->buckets[i]);
  }
  s->nbuckets = tx->nbuckets;
  for (size_t i = 0; i < s->nbuckets; i++) { /* the ops and log entries appended: above the head */
    mem_bucket *b = s->buckets[i];
    while (b->n && b->ops[b->n - 1].op_id > tx->meta.row.op_head) op_free(a, &b->ops[--b->n]);
    while (b->nsups && b->sups[b->nsups - 1].new_op > tx->meta.row.op_head) b->nsups--;
  }
  for (size_t i = 0; i < s->nparams; i++) /* the entries inserted: those above the old head */
    if (s->params[i].id > tx->meta.row.op_head)
      param_free(a, &s->params[i]);
    else
      s->params[kept++] = s->params[i];
  s->nparams = kept;
  s->nbch = tx->nbch;
  for (size_t i = tx->nuch; i < s->nuch; i++) val_free(a, &s->uch[i].user);
  s->nuch = tx->nuch;
  s->ncps = tx->ncps;
  s->m = tx->meta;
  bs__free(a, tx->j);
}

static void tx_commit(mem_tx *tx) {
  const bs_allocator *a = ALLOC(tx->db);
  for (size_t i = 0; i < tx->nj; i++) /* the replaced records and custom checkpoints */
    if (tx->j[i].kind == J_REC || tx->j[i].kind == J_CWCP) bs__free(a, tx->j[i].old);
  bs__free(a, tx->j);
}

/* Ends tx: commits it when rc is BS_OK, else rolls all of it back and fails with rc (ENOMEM,
 * ELIMIT: the op ids ran out, ECORRUPT: defragmentation found a record's op not a PUT) for what. */
static int tx_end(mem_tx *tx, int rc, const char *what, bs_error *err) {
  if (rc == BS_OK) {
    tx_commit(tx);
    return BS_OK;
  }
  tx_rollback(tx);
  if (rc == BS_ELIMIT) return bs__fail(err, rc, "%s: op id sequence exhausted (2^63)", what);
  if (rc == BS_ECORRUPT) return bs__fail(err, rc, "%s: a source record's op is not its PUT", what);
  return enomem(err, what);
}

/* Stores r in place of old, the stored record of its key (NULL: none; r NULL deletes old).
 * Journals both and keeps the index and the soft-deleted count in step. */
static int tx_rec_set(mem_tx *tx, mem_rec *old, mem_rec *r) {
  mem_stream *s = tx->s;
  if ((!old && r && bs__htab_reserve(&s->ridx, ALLOC(tx->db), s->ridx.n + 1)) ||
      tx_journal(tx, J_REC, 0, old)) /* so a delete never moves the index's entries */
    return BS_ENOMEM;
  tx->j[tx->nj - 1].now = r;
  if (old) bs__htab_remove(&s->ridx, rec_hash(old->table, old->rid), (uintptr_t)old);
  if (r) bs__htab_put(&s->ridx, rec_hash(r->table, r->rid), (uintptr_t)r);
  s->m.nsoft -= old && old->r.soft;
  s->m.nsoft += r && r->r.soft;
  return BS_OK;
}

static int next_op_id(mem_tx *tx, uint64_t *id) {
  if (tx->s->m.row.op_head >= MEM_MAX_OP_ID) return BS_ELIMIT;
  *id = ++tx->s->m.row.op_head;
  return BS_OK;
}

/* Appends op (PUT or REMOVE, with its checksum) to bucket bi, with the next op id (*id), and logs
 * the change. */
static int tx_append(mem_tx *tx, size_t bi, const bs_op *op, uint64_t *id) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  mem_bucket *b = s->buckets[bi];
  bs_op o = *op; /* its scalars; the strings are copied below (data only a PUT's) */
  int rc;
  if (BS_GROW(a, b->ops, b->cap, b->n + 1)) return BS_ENOMEM;
  if (BS_GROW(a, s->bch, s->cbch, s->nbch + 1)) return BS_ENOMEM;
  o.object_type = o.object_id = o.subkey = o.data = (bs_val){NULL, 0};
  if (val_dup(a, op->object_type, &o.object_type) || val_dup(a, op->object_id, &o.object_id) ||
      val_dup(a, op->subkey, &o.subkey) ||
      (op->type == BS_OP_PUT && val_dup(a, op->data, &o.data))) {
    op_free(a, &o);
    return BS_ENOMEM;
  }
  if ((rc = next_op_id(tx, &o.op_id))) {
    op_free(a, &o);
    return rc;
  }
  b->ops[b->n++] = o;
  s->bch[s->nbch].id = o.op_id;
  s->bch[s->nbch].bucket = bi;
  s->nbch++;
  *id = o.op_id;
  return BS_OK;
}

/* Logs that the last op of bucket bi replaced old_op (0: the row had none, nothing to log). */
static int tx_sup(mem_tx *tx, size_t bi, uint64_t old_op, uint64_t new_op) {
  mem_bucket *b = tx->s->buckets[bi];
  if (!old_op) return BS_OK;
  if (BS_GROW(ALLOC(tx->db), b->sups, b->csups, b->nsups + 1)) return BS_ENOMEM;
  b->sups[b->nsups].old_op = old_op;
  b->sups[b->nsups++].new_op = new_op;
  return BS_OK;
}

static mem_table *tx_table(mem_tx *tx, bs_val name) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  mem_table *t = table_find(s, name);
  unsigned char *p;
  if (t) return t;
  if (BS_GROW(a, s->tables, s->ctables, s->ntables + 1)) return NULL;
  if (!(t = bs__calloc(a, 1, sizeof *t + name.size))) return NULL;
  p = (unsigned char *)(t + 1);
  t->name = bs__val_put(&p, name);
  t->id = s->m.next_table_id++;
  s->tables[s->ntables++] = t;
  return t;
}

/* ---- Applying the writer's queue (contract.md 4.1 - 4.3) ------------------------------------- */

/* The queue's side of effects.c (internal.h, bs__effects_ops): a bucket's handle is its index
 * in s->buckets, and every call applies at once inside the transaction. */
typedef struct mem_fx {
  mem_tx *tx;
  uint32_t table;
} mem_fx;

static const bs__srec mem_no_rec; /* exists 0 */

static int mfx_load(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  mem_fx *c = ctx;
  const mem_rec *r = rec_find(c->tx->s, c->table, rid);
  BS_UNUSED(err);
  *out = r ? &r->r : &mem_no_rec;
  return BS_OK;
}

/* The bucket's index, the bucket created when it is new. */
static int mfx_bucket(void *ctx, bs_val name, uint64_t *bucket, bs_error *err) {
  mem_tx *tx = ((mem_fx *)ctx)->tx;
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  size_t bi = s->nbuckets;
  mem_bucket *b;
  unsigned char *p;
  BS_UNUSED(err);
  if (!bucket_find(s, name, &bi)) {
    if (BS_GROW(a, s->buckets, s->cbuckets, s->nbuckets + 1) ||
        bs__htab_reserve(&s->bidx, a, s->nbuckets + 1) ||
        !(b = bs__calloc(a, 1, sizeof *b + name.size)))
      return BS_ENOMEM;
    p = (unsigned char *)(b + 1);
    b->name = bs__val_put(&p, name);
    b->generation = ++s->m.gen_seq;
    bs__htab_put(&s->bidx, name_hash(b->name), s->nbuckets + 1);
    s->buckets[s->nbuckets++] = b;
  }
  *bucket = bi;
  return BS_OK;
}

static int mfx_op(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *id, bs_error *err) {
  BS_UNUSED(err);
  return tx_append(((mem_fx *)ctx)->tx, (size_t)bucket, op, id);
}

/* Inserts a parameter entry of the current table (rows NULL/0 = tombstone) in its place. */
static int mfx_param(void *ctx, bs_val key, bs_val rid, const bs_val *rows, size_t nrows,
                     bs_error *err) {
  mem_fx *c = ctx;
  const bs_allocator *a = ALLOC(c->tx->db);
  mem_stream *s = c->tx->s;
  mem_param p;
  size_t at;
  int rc;
  BS_UNUSED(err);
  if (BS_GROW(a, s->params, s->cparams, s->nparams + 1)) return BS_ENOMEM;
  memset(&p, 0, sizeof p);
  p.table = c->table;
  p.nrows = nrows;
  if (val_dup(a, key, &p.key) || val_dup(a, rid, &p.rid) ||
      (nrows && bs__vals_copy(a, rows, nrows, &p.rows)))
    rc = BS_ENOMEM;
  else
    rc = next_op_id(c->tx, &p.id);
  if (rc) {
    param_free(a, &p);
    return rc;
  }
  at = param_lower(s, &p);
  memmove(s->params + at + 1, s->params + at, (s->nparams++ - at) * sizeof *s->params);
  s->params[at] = p;
  return BS_OK;
}

/* new_op replaced old_op, the op of the row's membership in the record (the row's latest there:
 * defragmentation moves the membership to the op it re-emits, as LMDB). */
static int mfx_superseded(void *ctx, uint64_t bucket, uint64_t old_op, uint64_t new_op,
                          bs_error *err) {
  BS_UNUSED(err);
  return tx_sup(((mem_fx *)ctx)->tx, (size_t)bucket, old_op, new_op);
}

/* A stored copy of record in: one allocation (mem_rec), the record, its arrays, then the bytes. */
static mem_rec *rec_copy(const bs_allocator *a, uint32_t table, bs_val rid, const bs__srec *in) {
  size_t bytes = rid.size + (in->has_data ? in->data.size : 0);
  mem_rec *r;
  unsigned char *p;
  for (uint32_t i = 0; i < in->nm; i++)
    bytes += in->m[i].object_type.size + in->m[i].object_id.size;
  for (uint32_t i = 0; i < in->nl; i++) bytes += in->lk[i].size;
  r = bs__malloc(a, sizeof *r + in->nm * sizeof *in->m + in->nl * sizeof *in->lk + bytes + 1);
  if (!r) return NULL;
  r->table = table;
  r->r = *in; /* the scalars; every pointer is replaced */
  r->r.exists = 1;
  r->r.m = (bs__member *)(r + 1);
  r->r.lk = (bs_val *)(r->r.m + in->nm);
  p = (unsigned char *)(r->r.lk + in->nl);
  r->rid = bs__val_put(&p, rid);
  for (uint32_t i = 0; i < in->nm; i++) {
    r->r.m[i] = in->m[i];
    r->r.m[i].object_type = bs__val_put(&p, in->m[i].object_type);
    r->r.m[i].object_id = bs__val_put(&p, in->m[i].object_id);
  }
  for (uint32_t i = 0; i < in->nl; i++) {
    r->r.lk[i] = bs__val_put(&p, in->lk[i]);
    if (!r->r.lk[i].data) r->r.lk[i].data = p; /* an empty key: non-NULL (as bs__vals_copy) */
  }
  r->r.data = in->has_data ? bs__val_put(&p, in->data) : (bs_val){NULL, 0};
  return r;
}

static int mfx_store(void *ctx, bs_val rid, const bs__srec *rec, bs_error *err) {
  mem_fx *c = ctx;
  const bs_allocator *a = ALLOC(c->tx->db);
  mem_rec *old = rec_find(c->tx->s, c->table, rid), *r = NULL;
  int rc;
  BS_UNUSED(err);
  if (rec->exists && !(r = rec_copy(a, c->table, rid, rec))) return BS_ENOMEM;
  if (!r && !old) return BS_OK;
  if ((rc = tx_rec_set(c->tx, old, r))) {
    bs__free(a, r);
    return rc;
  }
  return BS_OK;
}

static uint64_t mfx_op_head(void *ctx) {
  return ((mem_fx *)ctx)->tx->s->m.row.op_head;
}

static const bs__effects_ops mem_fx_ops = {mfx_load,  mfx_bucket, mfx_op,     mfx_superseded,
                                           mfx_param, mfx_store,  mfx_op_head};

/* One save of the front's batch, as the caller gave it (contract.md 4.1 - 4.3: effects.c). */
static int apply_save(mem_tx *tx, bs__effects *e, const bs_save *s) {
  mem_table *t = tx_table(tx, s->table);
  if (!t) return BS_ENOMEM;
  ((mem_fx *)e->ctx)->table = t->id;
  return bs__effects_save(e, t->id, s, NULL);
}

static int rec_cmp_rid(const void *x, const void *y) {
  const mem_rec *a = *(mem_rec *const *)x, *b = *(mem_rec *const *)y;
  return bs__val_cmp(a->rid, b->rid);
}

/* Truncate (4.2): per record in replica-id byte order, REMOVEs of its memberships then
 * tombstones of its lookups; then the records go (hard delete). Drop forgets the table. */
static int apply_truncate(mem_tx *tx, bs__effects *e, bs_val table, int drop) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  mem_table *t = table_find(s, table);
  mem_rec **list = NULL;
  size_t n = 0;
  int rc = BS_OK;
  if (!t) return BS_OK;
  ((mem_fx *)e->ctx)->table = t->id;
  list = bs__calloc(a, s->ridx.n ? s->ridx.n : 1, sizeof *list);
  if (!list) return BS_ENOMEM;
  for (size_t i = 0; i < s->ridx.cap; i++)
    if (rec_at(s, i) && rec_at(s, i)->table == t->id) list[n++] = rec_at(s, i);
  qsort(list, n, sizeof *list, rec_cmp_rid);
  for (size_t i = 0; i < n && !rc; i++)
    rc = bs__effects_unlink(e, t->id, list[i]->rid, &list[i]->r, NULL);
  for (size_t i = 0; i < n && !rc; i++) /* a deleted record is freed by the commit */
    rc = tx_rec_set(tx, list[i], NULL);
  bs__free(a, list);
  if (rc) return rc;
  if (drop) {
    size_t ti = 0;
    while (s->tables[ti] != t) ti++;
    if ((rc = tx_journal(tx, J_DROP, ti, NULL))) return rc;
    t->dropped = 1;
  }
  return BS_OK;
}

static int apply_cwcp(mem_tx *tx, const bs_queued_wcp *q) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  mem_cwcp *c;
  unsigned char *p;
  size_t idx = s->ncw; /* the (event, user) record's slot, else a new one */
  for (size_t i = 0; i < s->ncw; i++)
    if (bs__val_eq(s->cw[i]->event, q->event) && bs__val_eq(s->cw[i]->user, q->user_id)) idx = i;
  if (BS_GROW(a, s->cw, s->ccw, s->ncw + 1) ||
      !(c = bs__malloc(a, sizeof *c + q->event.size + q->user_id.size)))
    return BS_ENOMEM;
  p = (unsigned char *)(c + 1);
  c->event = bs__val_put(&p, q->event);
  c->user = bs__val_put(&p, q->user_id);
  c->value = q->checkpoint;
  c->req_ms = q->requested_at_ms;
  if (tx_journal(tx, J_CWCP, idx, idx < s->ncw ? s->cw[idx] : NULL)) {
    bs__free(a, c);
    return BS_ENOMEM;
  }
  if (idx == s->ncw) s->ncw++;
  s->cw[idx] = c;
  return BS_OK;
}

/* Files user in the change log under op id id (checkpoint_changes names it from there). */
static int uch_add(mem_tx *tx, uint64_t id, bs_val user) {
  mem_stream *s = tx->s;
  if (BS_GROW(ALLOC(tx->db), s->uch, s->cuch, s->nuch + 1)) return BS_ENOMEM;
  if (val_dup(ALLOC(tx->db), user, &s->uch[s->nuch].user)) return BS_ENOMEM;
  s->uch[s->nuch++].id = id;
  return BS_OK;
}

/* The effects context of one transaction of writer w (bs__effects_free after it). */
static bs__effects mem_effects(mem_tx *tx, mem_fx *c, const mem_writer *w) {
  bs__effects e = {.ops = &mem_fx_ops,
                   .ctx = c,
                   .alloc = ALLOC(tx->db),
                   .hash = tx->s->m.hash,
                   .snapshot = w->snapshot,
                   .snapshot_done = tx->s->m.row.snapshot_done};
  c->tx = tx;
  c->table = 0;
  return e;
}

/* Applies the front's batch inside tx, in queue order; the custom write checkpoints' users are
 * filed under the op head it ends at (the flush's change record, as every backend). */
static int apply_batch(mem_tx *tx, const mem_writer *w, const bs_write_batch *batch) {
  mem_fx c;
  bs__effects e = mem_effects(tx, &c, w);
  int rc = BS_OK;
  for (size_t i = 0; i < batch->n && !rc; i++)
    rc = batch->items[i].save ? apply_save(tx, &e, batch->items[i].save)
                              : apply_cwcp(tx, batch->items[i].wcp);
  bs__effects_free(&e);
  for (size_t i = 0; i < batch->n && !rc; i++)
    if (batch->items[i].wcp) rc = uch_add(tx, tx->s->m.row.op_head, batch->items[i].wcp->user_id);
  return rc;
}

/* ---- Locking ------------------------------------------------------------------------------- */

/* Takes the lock for a call of a writer of ms (or writer_open), when the stream's state takes
 * one (lifecycle.c); else not locked. */
static int wlock(const mem_storage *ms, bs_error *err) {
  bs__stream_step step;
  int rc;
  lock(ms->db);
  if ((rc = bs__stream_transition(&step, ms->s->id, ms->s->m.row.state, BS__STREAM_WRITE, err)))
    unlock(ms->db);
  return rc;
}

/* Moves every stream of db but except from state s to map[s]. */
static void streams_map(mem_db *db, const mem_stream *except, const uint8_t *map) {
  for (size_t i = 0; i < db->nstreams; i++)
    if (db->streams[i] != except) db->streams[i]->m.row.state = map[db->streams[i]->m.row.state];
}

/* ---- Writer vtable slots --------------------------------------------------------------------- */

static const bs_writer_vtable mem_writer_vt;

static int mem_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *o,
                           bs_error *err) {
  mem_storage *ms = MS(st);
  mem_writer *w;
  int rc;
  BS_ASSERT(o && o->max_records && o->max_bytes);    /* resolved by the front */
  BS_ASSERT(!(ms->db->base.flags & BS_OPEN_RDONLY)); /* refused by the front */
  if ((rc = wlock(ms, err))) return rc;
  unlock(ms->db);
  w = bs__calloc(ALLOC(ms->db), 1, sizeof *w);
  if (!w) return enomem(err, "writer");
  w->base.vt = &mem_writer_vt;
  w->base.st = st;
  w->ms = ms;
  w->snapshot = o->snapshot;
  *out = &w->base;
  return BS_OK;
}

/* The memory store lives in one process: its writer locks are a set in the stream. */
static int mem_writer_lock(bs_storage *st, int snapshot, int take, bs_error *err) {
  mem_storage *ms = MS(st);
  unsigned bit = 1u << (snapshot != 0);
  int rc = BS_OK;
  lock(ms->db);
  if (!take)
    ms->s->writers &= ~bit;
  else if (ms->s->writers & bit)
    rc = bs__fail(err, BS_EBUSY, "the writer lock is held");
  else
    ms->s->writers |= bit;
  unlock(ms->db);
  return rc;
}

static void mem_writer_close(bs_writer *bw) {
  bs__free(ALLOC(MW(bw)->ms->db), bw); /* never NULL: the front calls it for an open writer */
}

static int mem_writer_truncate(bs_writer *bw, bs_val table, int drop, bs_error *err) {
  mem_writer *w = MW(bw);
  mem_tx tx;
  mem_fx c;
  bs__effects e;
  int rc;
  /* persisted at once; the front has flushed what was queued before it (contract.md 4.2) */
  if ((rc = wlock(w->ms, err))) return rc;
  tx_begin(&tx, w->ms->db, w->ms->s);
  e = mem_effects(&tx, &c, w);
  rc = apply_truncate(&tx, &e, table, drop);
  bs__effects_free(&e);
  rc = tx_end(&tx, rc, "truncate", err);
  unlock(w->ms->db);
  return rc;
}

static int mem_writer_flush(uint64_t *last_op, bs_writer *bw, const bs_write_batch *batch,
                            bs_error *err) {
  mem_writer *w = MW(bw);
  mem_tx tx;
  int rc;
  if ((rc = wlock(w->ms, err))) return rc;
  tx_begin(&tx, w->ms->db, w->ms->s);
  if (!(rc = tx_end(&tx, apply_batch(&tx, w, batch), "flush", err)))
    *last_op = w->ms->s->m.row.op_head;
  unlock(w->ms->db);
  return rc;
}

/* The commit's side of bs__managed_commit: a record waits while it is not processed (a gone one
 * is), and becomes processed in the transaction (journaled). */
typedef struct mem_cmt {
  mem_tx *tx;
  size_t i; /* the next record to look at */
  bs__head_array heads;
} mem_cmt;

static int mwcp_waiting(void *ctx, bs__wcp_waiting *w, bs_error *err) {
  mem_cmt *c = ctx;
  const mem_db *db = c->tx->db;
  const mem_mwcp *r;
  BS_UNUSED(err);
  while (c->i < db->nmw && db->mw[c->i]->processed) c->i++;
  if (c->i == db->nmw) return 0;
  r = db->mw[c->i++];
  c->heads = (bs__head_array){r->heads, r->nheads};
  *w = (bs__wcp_waiting){r->user, bs__head_array_next, &c->heads};
  return 1;
}

static int mwcp_done(void *ctx, bs_val user, bs_error *err) {
  mem_cmt *c = ctx;
  BS_UNUSED(err);
  if (tx_journal(c->tx, J_MWCP, c->i - 1, NULL)) return BS_ENOMEM;
  c->tx->db->mw[c->i - 1]->processed = 1;
  return uch_add(c->tx, c->tx->s->m.row.op_head, user);
}

/* The checkpoint part of a commit, as plan p decided, inside tx. */
static int make_checkpoint(mem_tx *tx, bs_val lsn, const bs__commit_plan *p) {
  mem_db *db = tx->db;
  mem_stream *s = tx->s;
  mem_cmt cmt = {tx, 0, {NULL, 0}};
  int rc;
  if ((rc = bs__managed_commit(lsn, mwcp_waiting, mwcp_done, &cmt, NULL))) return rc;
  if (BS_GROW(ALLOC(db), s->cps, s->ccps, s->ncps + 1)) return BS_ENOMEM;
  s->cps[s->ncps].id = s->m.row.op_head;
  s->cps[s->ncps++].ms = bs__now_ms();
  /* the purge (a scan only while there are soft-deleted records: a delete makes them while a
   * snapshot may insert, and the next checkpoint purges them) */
  for (size_t i = 0; s->m.nsoft && i < s->ridx.cap;) {
    mem_rec *r = rec_at(s, i);
    if (!r || !r->r.soft || r->r.mark > p->purge_to)
      i++;
    else if ((rc = tx_rec_set(tx, r, NULL))) /* the index's backward shift may move a record */
      return rc;                             /* after i into i: it is looked at next */
  }
  streams_map(db, s, p->step.others); /* nothing below fails: the row is the caller's */
  return BS_OK;
}

static int mem_writer_commit(bs_commit_result *out, bs_writer *bw, const bs_write_batch *batch,
                             bs_val lsn, int create_empty, bs_error *err) {
  mem_writer *w = MW(bw);
  mem_db *db = w->ms->db;
  mem_stream *s = w->ms->s;
  mem_tx tx;
  bs__commit_plan p = {0};
  int rc, refused = 0;
  uint64_t cp;
  BS_ASSERT(create_empty == 0 || create_empty == 1); /* resolved by the front */
  if ((rc = wlock(w->ms, err))) return rc;
  tx_begin(&tx, db, s);
  if (!(rc = apply_batch(&tx, w, batch)))
    refused = rc = bs__plan_commit_row(&p, s->id, &s->m.row, lsn, create_empty, err);
  if (!rc && p.checkpoint) rc = make_checkpoint(&tx, lsn, &p);
  if (!rc) { /* the row as lifecycle.c makes it */
    bs__commit_row(&s->m.row, &p, lsn);
    lsn_keep(&s->m);
  }
  if (refused) /* keeps the plan's status and message */
    tx_rollback(&tx);
  else
    rc = tx_end(&tx, rc, "commit", err);
  cp = s->m.row.checkpoint;
  unlock(db);
  if (rc) return rc;
  out->checkpoint_blocked = p.blocked != BS_BLOCKED_NONE;
  out->blocked_reason = p.blocked;
  out->checkpoint_created = p.checkpoint;
  out->checkpoint = cp;
  return BS_OK;
}

/* snapshot_done (1) and resume_lsn (0): the fields lifecycle.c's plan names, stored at once; the
 * queue stays as it is (as LMDB). */
static int lsn_call(bs_writer *bw, int snapshot_done, bs_val lsn, bs_error *err) {
  mem_storage *ms = MW(bw)->ms;
  mem_meta *m = &ms->s->m;
  bs__lsn_plan p;
  int rc;
  lock(ms->db);
  if ((rc = bs__plan_lsn(&p, ms->s->id, &m->row, snapshot_done, lsn, err)) == BS_OK) {
    bs__lsn_row(&m->row, &p, lsn);
    lsn_keep(m);
  }
  unlock(ms->db);
  return rc;
}

static int mem_writer_snapshot_done(bs_writer *bw, bs_val lsn, bs_error *err) {
  return lsn_call(bw, 1, lsn, err);
}

static int mem_writer_resume_lsn(bs_writer *bw, bs_val lsn, bs_error *err) {
  return lsn_call(bw, 0, lsn, err);
}

static int mem_writer_source_row(bs_writer *bw, const bs_write_batch *batch, bs_val table,
                                 bs_val rid, int (*fn)(const bs_val *, void *), void *payload,
                                 bs_error *err) {
  mem_writer *w = MW(bw);
  mem_db *db = w->ms->db;
  mem_stream *s = w->ms->s;
  int rc;
  bs__srec now;
  bs_val *data = NULL;  /* one allocation (bs__vals_copy): zero bytes stored are non-NULL */
  mem_tx tx = {.s = s}; /* only read: the stored records, by mfx_load */
  mem_fx c = {&tx, 0};  /* table 0 names no table: no record */
  const mem_table *t;
  lock(db);
  if ((t = table_find(s, table))) c.table = t->id;
  /* the queue as the flush would apply it (effects.c), over the stored records */
  rc = bs__effects_source_row(ALLOC(db), w->snapshot, batch, table, rid, mfx_load, &c, &now, err);
  if (rc == BS_OK && now.has_data && bs__vals_copy(ALLOC(db), &now.data, 1, &data))
    rc = enomem(err, "source_row");
  unlock(db); /* fn runs unlocked: it may call into this db */
  if (rc == BS_OK) rc = fn(data, payload);
  bs__free(ALLOC(db), data);
  return rc;
}

static const bs_writer_vtable mem_writer_vt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = mem_writer_close,
    .truncate = mem_writer_truncate,
    .flush = mem_writer_flush,
    .commit = mem_writer_commit,
    .snapshot_done = mem_writer_snapshot_done,
    .resume_lsn = mem_writer_resume_lsn,
    .source_row = mem_writer_source_row,
};

/* ---- Compaction (mem_compact.c) ---------------------------------------------------------------
 * Defragmentation's re-emission is a writer's transaction: each live row's PUT is appended again
 * with a new op id, logged as superseding the old one, and the membership takes the new op (as
 * LMDB), so that the writer's next change of the row supersedes that one. A row whose record no
 * longer holds that membership (changed since the plan) is left alone. */

static int reemit(mem_tx *tx, const bs__defrag_row *row, uint64_t *emitted) {
  const bs_allocator *a = ALLOC(tx->db);
  mem_stream *s = tx->s;
  uint32_t table;
  mem_rec *r, *nr;
  mem_bucket *b;
  size_t k, m = 0;
  uint64_t id;
  int rc;
  memcpy(&table, row->key, 4);
  r = rec_find(s, table, (bs_val){row->key + 4, row->key_size - 4});
  while (r && m < r->r.nm && (r->r.m[m].bucket != row->bucket || r->r.m[m].op != row->old_op)) m++;
  if (!r || m == r->r.nm) return BS_OK;
  b = s->buckets[row->bucket];
  k = op_index(b, row->old_op);
  if (k == b->n || b->ops[k].type != BS_OP_PUT) return BS_ECORRUPT; /* a membership's op is a PUT */
  bs_op op = b->ops[k]; /* by value: tx_append may move b->ops (not the bytes) */
  if ((rc = tx_append(tx, (size_t)row->bucket, &op, &id)) ||
      (rc = tx_sup(tx, (size_t)row->bucket, op.op_id, id)))
    return rc;
  if (!(nr = rec_copy(a, r->table, r->rid, &r->r))) return BS_ENOMEM;
  nr->r.m[m].op = id;
  if ((rc = tx_rec_set(tx, r, nr))) bs__free(a, nr);
  *emitted += !rc;
  return rc;
}

/* Re-emits rows[0..n) in one transaction under the lock. */
static int reemit_rows(mem_db *db, mem_stream *s, const bs__defrag_row *rows, size_t n,
                       uint64_t *emitted, bs_error *err) {
  mem_tx tx;
  int rc = BS_OK;
  lock(db);
  tx_begin(&tx, db, s);
  for (size_t i = 0; i < n && !rc; i++) rc = reemit(&tx, &rows[i], emitted);
  rc = tx_end(&tx, rc, "defragment", err);
  unlock(db);
  if (rc) *emitted = 0;
  return rc;
}

static int mem_compact(bs_compact_stats *out, bs_storage *st, const bs_compact_options *o,
                       bs_error *err) {
  return bs__mem_compact(out, st, o, reemit_rows, err);
}

/* ---- Lifecycle ------------------------------------------------------------------------------- */

/* Copies v (data NULL: not set) to a status's LSN. */
static void status_lsn(int *has, size_t *size, unsigned char *out, bs_val v) {
  *has = v.data != NULL;
  *size = v.size;
  if (v.size) memcpy(out, v.data, v.size);
}

static int mem_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  BS_UNUSED(err);
  mem_storage *ms = MS(st);
  const bs__stream_row *r = &ms->s->m.row;
  lock(ms->db); /* out: zeroed by the front */
  out->state = (bs_stream_state)r->state;
  out->snapshot_done = r->snapshot_done;
  out->checkpoint = r->checkpoint;
  out->last_persisted_op = r->op_head;
  status_lsn(&out->has_lsn, &out->lsn_size, out->lsn, r->checkpoint_lsn);
  status_lsn(&out->has_resume_lsn, &out->resume_lsn_size, out->resume_lsn, r->resume_lsn);
  memcpy(out->last_error, ms->s->m.last_error, sizeof out->last_error);
  unlock(ms->db);
  return BS_OK;
}

static int mem_report_error(bs_storage *st, const char *message, bs_error *err) {
  mem_storage *ms = MS(st);
  bs__stream_step step;
  int rc;
  lock(ms->db);
  snprintf(ms->s->m.last_error, sizeof ms->s->m.last_error, "%s", message ? message : "");
  rc = bs__stream_transition(&step, ms->s->id, ms->s->m.row.state, BS__STREAM_ERROR, err);
  if (!rc) ms->s->m.row.state = step.to;
  unlock(ms->db);
  return rc;
}

/* Stores what a clear or terminate decides (lifecycle.c) of s's row: its LSNs stay in the
 * stream's bytes or become unset. */
static int reset(mem_db *db, mem_stream *s, int clear, int terminate, bs_error *err) {
  int rc;
  lock(db);
  if ((rc = bs__stream_reset(&s->m.row, s->id, clear, terminate, err)) == BS_OK && clear) {
    stream_data_free(ALLOC(db), s); /* the data goes; below the fence no change is known */
    s->m.nsoft = 0;
    s->m.clears++;
  }
  unlock(db);
  return rc;
}

static int mem_clear(bs_storage *st, bs_error *err) {
  return reset(MS(st)->db, MS(st)->s, 1, 0, err);
}

static int mem_terminate(bs_storage *st, int clear, bs_error *err) {
  return reset(MS(st)->db, MS(st)->s, clear, 1, err);
}

static void mem_storage_destroy(bs_storage *st) {
  if (st) bs__free(ALLOC(MS(st)->db), st);
}

static const bs_storage_vtable mem_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = mem_storage_destroy,
    .writer_open = mem_writer_open,
    BS__READ_SLOTS,
    .set_write_checkpoint_mode = bs__mem_set_wcp_mode,
    .create_managed_write_checkpoints = bs__mem_create_managed,
    .last_write_checkpoint = bs__mem_last_wcp,
    .delete_checkpoint_requests_before = bs__mem_delete_requests,
    .compact = mem_compact,
    .compact_initial_replication = bs__mem_compact_initial,
    .get_status = mem_get_status,
    .report_error = mem_report_error,
    .clear = mem_clear,
    .terminate = mem_terminate,
    .writer_lock = mem_writer_lock,
};

/* ---- Database -------------------------------------------------------------------------------- */

static void mem_close(bs_db *bdb) {
  mem_db *db = MDB(bdb);
  bs_allocator a = db->base.alloc;
  for (size_t i = 0; i < db->nstreams; i++) stream_free(&a, db->streams[i]);
  bs__free(&a, db->streams);
  for (size_t i = 0; i < db->nmw; i++) mwcp_free(&a, db->mw[i]);
  bs__free(&a, db->mw);
  pthread_mutex_destroy(&db->mu);
  bs__free(&a, db);
}

static int mem_stream_create(uint32_t *id_out, bs_db *bdb, bs_val name, const bs_stream_options *o,
                             bs_error *err) {
  mem_db *db = MDB(bdb);
  const bs_allocator *a = ALLOC(db);
  mem_stream *s;
  bs__stream_step step;
  int rc;
  BS_ASSERT(!(db->base.flags & BS_OPEN_RDONLY));
  BS_ASSERT(name.size >= 1 && name.size <= BS_MAX_STREAM_NAME);
  BS_ASSERT(o && (o->hash == BS_HASH_XXH3 || o->hash == BS_HASH_SHA256));
  if ((rc = bs__stream_transition(&step, 0, 0, BS__STREAM_CREATE, err))) return rc;
  s = bs__calloc(a, 1, sizeof *s);
  if (!s || val_dup(a, name, &s->name)) {
    bs__free(a, s);
    return enomem(err, "stream");
  }
  s->m.row.state = step.to;
  s->m.hash = o->hash;
  s->m.next_table_id = 1;
  lock(db);
  if (BS_GROW(a, db->streams, db->cstreams, db->nstreams + 1)) {
    unlock(db);
    stream_free(a, s);
    return enomem(err, "stream");
  }
  streams_map(db, s, step.others);
  s->id = (uint32_t)db->nstreams + 1;
  db->streams[db->nstreams++] = s;
  unlock(db);
  *id_out = s->id;
  return BS_OK;
}

static int mem_stream_list(bs_db *bdb, int (*fn)(const bs_stream_info *, void *), void *payload,
                           bs_error *err) {
  mem_db *db = MDB(bdb);
  const bs_allocator *a = ALLOC(db);
  bs_stream_info *infos;
  unsigned char *p;
  size_t n, bytes = 0;
  int rc = BS_OK;
  lock(db); /* copies (infos, then the names: one allocation), for fn to run unlocked */
  n = db->nstreams;
  for (size_t i = 0; i < n; i++) bytes += db->streams[i]->name.size;
  if (!(infos = bs__malloc(a, n * sizeof *infos + bytes + 1))) {
    unlock(db);
    return enomem(err, "stream list");
  }
  p = (unsigned char *)(infos + n);
  for (size_t i = 0; i < n; i++) {
    const mem_stream *s = db->streams[i];
    bs_stream_info in = {s->id, bs__val_put(&p, s->name), s->m.row.state, s->m.hash};
    infos[i] = in; /* a name has 1 byte or more: never NULL */
  }
  unlock(db);
  for (size_t i = 0; i < n && !rc; i++) rc = fn(&infos[i], payload);
  bs__free(a, infos);
  return rc;
}

static int mem_storage_open(bs_storage **out, bs_db *bdb, uint32_t id, bs_error *err) {
  mem_db *db = MDB(bdb);
  mem_storage *ms;
  mem_stream *s = NULL;
  lock(db); /* id 0 was resolved by the front (stream_list) */
  if (id && id <= db->nstreams) s = db->streams[id - 1];
  unlock(db);
  if (!s) return bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)id);
  ms = bs__calloc(ALLOC(db), 1, sizeof *ms);
  if (!ms) return enomem(err, "storage");
  ms->rs.base.vt = &mem_vtable;
  ms->rs.base.db = bdb;
  ms->rs.base.stream_id = s->id;
  ms->rs.reads = &bs__mem_reads;
  ms->rs.a = ALLOC(db);
  ms->db = db;
  ms->s = s;
  ms->mode = BS_WCP_MANAGED;
  *out = &ms->rs.base;
  return BS_OK;
}

static int mem_stat(bs_stat *out, bs_db *bdb, bs_error *err) {
  BS_UNUSED(err);
  mem_db *db = MDB(bdb);
  lock(db); /* out: zeroed by the front */
  out->streams = db->nstreams;
  for (size_t i = 0; i < db->nmw; i++) out->write_checkpoints += !db->mw[i]->gone;
  for (size_t i = 0; i < db->nstreams; i++) {
    mem_stream *s = db->streams[i];
    out->buckets += s->nbuckets;
    out->parameter_entries += s->nparams;
    out->source_records += s->ridx.n;
    out->write_checkpoints += s->ncw;
    for (size_t k = 0; k < s->nbuckets; k++)
      for (size_t j = 0; j < s->buckets[k]->n; j++) bs__stat_op(out, s->buckets[k]->ops[j].type);
  }
  unlock(db);
  return BS_OK;
}

/* backup and export_records: NULL, nothing on disk to copy (BS_EUNSUPPORTED) */
static const bs_db_vtable mem_db_vt = {
    .version = BS_DB_VTABLE_VERSION,
    .destroy = mem_close,
    .stream_create = mem_stream_create,
    .stream_list = mem_stream_list,
    .storage_open = mem_storage_open,
    .stat = mem_stat,
    .verify = bs__mem_verify,
};

int bs__mem_open(bs_db **out, const bs_open_options *opts, bs_error *err) {
  bs_db base;
  mem_db *db;
  bs__db_base_set(&base, &mem_db_vt, opts);
  if (!(db = bs__calloc(&base.alloc, 1, sizeof *db))) return enomem(err, "memory database");
  db->base = base;
  if (pthread_mutex_init(&db->mu, NULL)) {
    bs__free(&base.alloc, db);
    return enomem(err, "memory database mutex");
  }
  *out = &db->base;
  return BS_OK;
}
