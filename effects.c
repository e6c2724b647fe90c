/*
 * effects.c: what one save does (contract.md 4.1 - 4.3), decided here once for every backend.
 * From the row's previous source records (which the backend loads), the save and the writer's
 * mode, it emits the REMOVEs and PUTs in contract op-id order, the superseded (old op -> new op)
 * pairs of incremental compaction, the parameter entries and tombstones, and the new, deleted or
 * soft-deleted records, each as one call of the backend's bs__effects_ops (internal.h). The
 * backend allocates op ids in the order of those calls, indexes and stores; it re-decides nothing.
 */
#include "internal.h"

static const bs_val fx_absent = {NULL, 0};

static int nomem(bs_error *err) {
  return bs__fail(err, BS_ENOMEM, "out of memory computing a save's effects");
}

static int emit(bs__effects *e, uint64_t bucket, bs_op_type type, bs_val ot, bs_val oi,
                const char *sk, bs_val data, uint64_t *id, bs_error *err) {
  bs_op op = {0, type, 0, 0, ot, oi, {sk, BS_SUBKEY_SIZE}, data};
  if (e->hash != BS__HASH_NONE)
    op.checksum = type == BS_OP_PUT ? bs_checksum_put(e->hash, ot, oi, data)
                                    : bs_checksum_remove(e->hash, op.subkey);
  return e->ops->op(e->ctx, bucket, &op, id, err);
}

static int sup_note(bs__effects *e, uint64_t bucket, uint64_t old_op, uint64_t new_op,
                    bs_error *err) {
  return e->ops->superseded ? e->ops->superseded(e->ctx, bucket, old_op, new_op, err) : BS_OK;
}

static int param_note(bs__effects *e, bs_val key, bs_val rid, const bs_val *params, size_t n,
                      bs_error *err) {
  return e->ops->param ? e->ops->param(e->ctx, key, rid, params, n, err) : BS_OK;
}

/* A REMOVE of membership m of the row whose subkey is sk; m's last op is superseded by it. */
static int remove_member(bs__effects *e, const bs__member *m, const char *sk, bs_error *err) {
  uint64_t id;
  int rc = emit(e, m->bucket, BS_OP_REMOVE, m->object_type, m->object_id, sk, fx_absent, &id, err);
  return rc ? rc : sup_note(e, m->bucket, m->op, id, err);
}

int bs__effects_unlink(bs__effects *e, uint32_t table_id, bs_val rid, const bs__srec *r,
                       bs_error *err) {
  char sk[BS_SUBKEY_SIZE];
  int rc;
  if (!r->nm && !r->nl) return BS_OK;
  bs_subkey(sk, table_id, rid);
  for (uint32_t i = 0; i < r->nm; i++)
    if ((rc = remove_member(e, &r->m[i], sk, err)) != BS_OK) return rc;
  for (uint32_t i = 0; i < r->nl; i++)
    if ((rc = param_note(e, r->lk[i], rid, NULL, 0, err)) != BS_OK) return rc;
  return BS_OK;
}

/* Membership key (contract.md 4.1): (bucket, object_type, object_id). */
static int same_member(const bs__member *m, uint64_t bucket, const bs_row *row) {
  return m->bucket == bucket && bs__val_eq(m->object_type, row->object_type) &&
         bs__val_eq(m->object_id, row->object_id);
}

/* Steps 2 to 4 for the new state of row after; prev: its previous record (UPDATE) or NULL. */
static int put_after(bs__effects *e, uint32_t table_id, const bs_save *s, bs_val after,
                     const bs__srec *prev, bs_error *err) {
  uint32_t pnm = prev ? prev->nm : 0, pnl = prev ? prev->nl : 0, nm = 0, nl = 0;
  const bs_allocator *a = e->alloc;
  char sk[BS_SUBKEY_SIZE] = {0};
  bs__srec rec = {0};
  int rc;

  /* the scratch is kept across saves */
  if (BS_GROW(a, e->m, e->cap_m, s->n_rows) || BS_GROW(a, e->lk, e->cap_lk, s->n_lookups) ||
      BS_GROW(a, e->kept, e->cap_kept, pnm))
    return nomem(err);
  if (pnm) memset(e->kept, 0, pnm);
  if (e->hash != BS__HASH_NONE) bs_subkey(sk, table_id, after);
  for (size_t i = 0; i < s->n_rows; i++) {
    const bs_row *row = &s->rows[i];
    uint64_t b, id;
    uint32_t j;
    if ((rc = e->ops->bucket(e->ctx, row->bucket, &b, err)) != BS_OK ||
        (rc = emit(e, b, BS_OP_PUT, row->object_type, row->object_id, sk, row->data, &id, err)))
      return rc;
    for (j = 0; j < pnm; j++)
      if (!e->kept[j] && same_member(&prev->m[j], b, row)) break;
    if (j < pnm) {
      e->kept[j] = 1;
      if ((rc = sup_note(e, b, prev->m[j].op, id, err)) != BS_OK) return rc;
    }
    for (j = 0; j < nm; j++)
      if (same_member(&e->m[j], b, row)) break;
    if (j < nm) { /* the same row twice in one save: the later PUT supersedes the earlier */
      if ((rc = sup_note(e, b, e->m[j].op, id, err)) != BS_OK) return rc;
      e->m[j].op = id;
    } else {
      bs__member nw = {b, id, row->object_type, row->object_id};
      e->m[nm++] = nw;
    }
  }
  for (uint32_t j = 0; j < pnm; j++) /* memberships the row left */
    if (!e->kept[j] && (rc = remove_member(e, &prev->m[j], sk, err)) != BS_OK) return rc;
  for (size_t i = 0; i < s->n_lookups; i++) { /* step 3 */
    const bs_lookup *l = &s->lookups[i];
    uint32_t j;
    if ((rc = param_note(e, l->key, after, l->params, l->n_params, err)) != BS_OK) return rc;
    for (j = 0; j < nl; j++)
      if (bs__val_eq(e->lk[j], l->key)) break;
    if (j == nl) e->lk[nl++] = l->key;
  }
  for (uint32_t j = 0; j < pnl; j++) {
    uint32_t i;
    for (i = 0; i < nl; i++)
      if (bs__val_eq(e->lk[i], prev->lk[j])) break;
    if (i == nl && (rc = param_note(e, prev->lk[j], after, NULL, 0, err)) != BS_OK) return rc;
  }
  rec.exists = 1; /* step 4 */
  rec.m = e->m;
  rec.nm = nm;
  rec.lk = e->lk;
  rec.nl = nl;
  rec.has_data = s->stored_data.data != NULL;
  rec.data = s->stored_data;
  return e->ops->store(e->ctx, after, &rec, err);
}

int bs__effects_save(bs__effects *e, uint32_t table_id, const bs_save *s, bs_error *err) {
  int has_after = s->tag != BS_DELETE;
  bs_val after = has_after ? s->after_id : fx_absent;
  bs_val before = s->before_id.data ? s->before_id : s->after_id; /* defaults to after_id */
  /* Deletes leave soft-deleted records while a snapshot may still be inserting (4.3). */
  int soft = e->snapshot || !e->snapshot_done;
  const bs__srec *r, *prev = NULL;
  int rc;

  if (e->snapshot && s->tag == BS_INSERT) {
    if ((rc = e->ops->load(e->ctx, after, &r, err)) != BS_OK) return rc;
    if (r->exists) return BS_OK; /* skip_existing (a soft-deleted record counts) */
  }
  if (before.data && (!has_after || !bs__val_eq(before, after))) { /* step 1 */
    if ((rc = e->ops->load(e->ctx, before, &r, err)) != BS_OK) return rc;
    if (r->exists && !r->soft && (rc = bs__effects_unlink(e, table_id, before, r, err)) != BS_OK)
      return rc;
    if ((r->exists && !r->soft) || (!r->exists && soft && !has_after)) {
      /* deleted, or soft-deleted: also a row not known yet, so that a concurrent snapshot
       * cannot resurrect it; a soft-deleted record keeps its mark */
      bs__srec gone = {0};
      if (soft && !has_after) {
        gone.exists = gone.soft = 1;
        gone.mark = e->ops->op_head(e->ctx);
      }
      if ((rc = e->ops->store(e->ctx, before, &gone, err)) != BS_OK) return rc;
    }
  }
  if (!has_after) return BS_OK;
  if (s->tag == BS_UPDATE) { /* an INSERT does not read the previous record (step 2) */
    if ((rc = e->ops->load(e->ctx, after, &r, err)) != BS_OK) return rc;
    if (r->exists && !r->soft) prev = r;
  }
  return put_after(e, table_id, s, after, prev, err);
}

void bs__effects_free(bs__effects *e) {
  bs__free(e->alloc, e->m);
  bs__free(e->alloc, e->lk);
  bs__free(e->alloc, e->kept);
  e->m = NULL;
  e->lk = NULL;
  e->kept = NULL;
  e->cap_m = e->cap_lk = e->cap_kept = 0;
}

/* ---- source_row: the row as the flush would leave it ------------------------------------------
 * The answer runs the batch's saves of the table through bs__effects_save itself, on a shadow
 * backend that keeps the records of the rows those saves touch (read once from the backend's
 * stored ones, then as the saves leave them; a save's fate can depend on another row: a snapshot
 * INSERT is skipped when its new key exists, and then does not unlink its old one), so it cannot
 * disagree with what the flush will store. */
typedef struct shadow_row {
  bs_val rid;
  bs__srec cur;
} shadow_row;

typedef struct shadow {
  int (*stored)(void *ctx, bs_val rid, const bs__srec **out, bs_error *err);
  void *ctx;
  const bs_allocator *alloc;
  shadow_row *rows;
  size_t n, cap;
  bs__htab idx; /* rows by bs__val_hash(rid): index + 1 (room reserved for cap) */
  uint64_t head;
} shadow;

/* Makes rec the shadow's record of r: memberships and lookups decide ops, never whether or with
 * what data a record exists, and rec's arrays may not outlive the call. */
static void sh_set(shadow_row *r, const bs__srec *rec) {
  r->cur = *rec;
  r->cur.m = NULL;
  r->cur.nm = 0;
  r->cur.lk = NULL;
  r->cur.nl = 0;
}

/* The shadow row of rid, read from the stored record the first time. */
static int sh_row(shadow *s, bs_val rid, shadow_row **out, bs_error *err) {
  static const bs__srec none;
  uint64_t h = bs__val_hash(rid);
  bs__hprobe p = bs__htab_probe(&s->idx, h);
  const bs__srec *st = NULL;
  shadow_row *r;
  int rc;
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (bs__val_eq(s->rows[v - 1].rid, rid)) {
      *out = &s->rows[v - 1];
      return BS_OK;
    }
  if ((rc = s->stored(s->ctx, rid, &st, err)) != BS_OK) return rc;
  /* rows was sized for every row the batch can touch: it never moves under a returned record */
  BS_ASSERT(s->n < s->cap);
  if (s->n == s->cap) return nomem(err);
  r = &s->rows[s->n++];
  bs__htab_put(&s->idx, h, s->n);
  r->rid = rid;
  sh_set(r, st ? st : &none);
  *out = r;
  return BS_OK;
}

static int sh_load(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  shadow_row *r;
  int rc = sh_row(ctx, rid, &r, err);
  if (rc == BS_OK) *out = &r->cur;
  return rc;
}
static int sh_bucket(void *ctx, bs_val name, uint64_t *bucket, bs_error *err) {
  BS_UNUSED(ctx);
  BS_UNUSED(name);
  BS_UNUSED(err);
  *bucket = 0;
  return BS_OK;
}
static int sh_op(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *op_id, bs_error *err) {
  BS_UNUSED(bucket);
  BS_UNUSED(op);
  BS_UNUSED(err);
  *op_id = ++((shadow *)ctx)->head;
  return BS_OK;
}
static int sh_store(void *ctx, bs_val rid, const bs__srec *rec, bs_error *err) {
  shadow_row *r;
  int rc;
  if ((rc = sh_row(ctx, rid, &r, err)) == BS_OK) sh_set(r, rec);
  return rc;
}
static uint64_t sh_head(void *ctx) {
  return ((shadow *)ctx)->head;
}

int bs__effects_source_row(const bs_allocator *a, int snapshot, const bs_write_batch *batch,
                           bs_val table, bs_val rid,
                           int (*stored)(void *ctx, bs_val rid, const bs__srec **out,
                                         bs_error *err),
                           void *ctx, bs__srec *out, bs_error *err) {
  static const bs__effects_ops ops = {
      .load = sh_load, .bucket = sh_bucket, .op = sh_op, .store = sh_store, .op_head = sh_head};
  const bs__srec *r = NULL;
  shadow s;
  bs__effects e;
  int rc = BS_OK;
  memset(&s, 0, sizeof s);
  s.stored = stored;
  s.ctx = ctx;
  s.alloc = a;
  for (size_t i = 0; i < batch->n; i++) /* a save touches at most two rows: before and after */
    if (batch->items[i].save && bs__val_eq(batch->items[i].save->table, table)) s.cap += 2;
  s.cap++; /* and rid */
  if (!(s.rows = bs__calloc(a, s.cap, sizeof *s.rows)) || bs__htab_reserve(&s.idx, a, s.cap)) {
    bs__free(a, s.rows);
    return nomem(err);
  }
  memset(&e, 0, sizeof e);
  e.ops = &ops;
  e.ctx = &s;
  e.alloc = a;
  e.hash = BS__HASH_NONE;
  e.snapshot = snapshot;
  /* snapshot_done only chooses between a soft and a hard delete, both "no row"; a snapshot
   * writer (the one that treats a soft record differently: skip_existing) deletes softly anyway */
  e.snapshot_done = !snapshot;
  for (size_t i = 0; i < batch->n && rc == BS_OK; i++) {
    const bs_save *q = batch->items[i].save;
    if (q && bs__val_eq(q->table, table)) rc = bs__effects_save(&e, 0, q, err);
  }
  if (rc == BS_OK) rc = sh_load(&s, rid, &r, err);
  if (rc == BS_OK) rc = r->exists && !r->soft ? BS_OK : bs__source_row_missing(table, err);
  if (rc == BS_OK) *out = *r;
  bs__effects_free(&e);
  bs__free(a, s.rows);
  bs__htab_free(&s.idx, a);
  return rc;
}
