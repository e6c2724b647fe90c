/*
 * pg_save.c: the PostgreSQL writer's flush (contract.md 4). The front hands over its queue as a
 * bs_write_batch; a flush applies the whole batch in one transaction: the source records the
 * batch needs and its buckets are loaded in a few statements, effects.c decides every save's
 * effects (contract.md 4.1-4.3) against them in memory, and the result goes to the server as
 * binary COPY streams (ops, parameter entries, source records) plus one statement each for the
 * bucket states, the stream's op-id head and the change record. A failed flush rolls back; the
 * queue is the front's (writer.c), which keeps it.
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static bs_val val_put(unsigned char **p, bs_val v) {
  bs_val out = {NULL, 0};
  if (!v.data) return out;
  out.data = *p;
  out.size = v.size;
  if (v.size) memcpy(*p, v.data, v.size);
  *p += v.size;
  return out;
}

/* A field a call needs reads {NULL, 0} as "" (storage.h CONVENTIONS): the front's copy of a
 * save is verbatim. */
static bs_val present(bs_val v) {
  return v.data ? v : bs__val_str("");
}

/* ---- One flush: the batch in memory ------------------------------------------------------------ */

typedef struct rec_ent {
  uint32_t table;
  bs_val rid; /* owned */
  bs__srec r; /* arrays and strings in blob */
  void *blob;
  int dirty;
  int stored;           /* a row of bs_source when the batch began: the flush replaces it */
  unsigned char tid[6]; /* that row's ctid (binary: block u32be, item u16be), as loaded */
} rec_ent;

typedef struct bucket_ent {
  uint64_t id;
  bs_val name; /* owned */
  uint32_t d_checksum;
  uint64_t d_count, d_bytes, last_op, max_bytes; /* max_bytes: of the batch's ops */
  int touched;
  int fresh;        /* created by this batch: id 0 until its first use takes a reserved id */
  bs__pg_chunkb ck; /* the batch's ops of the bucket: its chunk being built (pg_chunk.c) */
} bucket_ent;

typedef struct sup_ent {
  uint64_t bucket, old_op, new_op;
} sup_ent;

/* A source table the batch's records belong to: its id in the stream, its key (bs_source's
 * key, schema 9) and name (a record's members elide it, pg_codec.c). A flush names few. */
typedef struct tab_ent {
  uint32_t id, key;
  bs_val name; /* owned */
} tab_ent;

typedef struct batch {
  bs__pg_writer *w;
  const bs_write_batch *in;
  const bs_allocator *a;
  PGconn *c;
  uint32_t stream, table;
  uint64_t head, first;
  rec_ent **recs; /* each entry allocated on its own: load's pointers must survive growth */
  size_t nrecs, crecs;
  bs__htab rmap;
  bucket_ent *bk;
  size_t nbk, cbk;
  /* ids reserved for the batch's new buckets (ascending), taken in order of first use, as the
   * LMDB backend numbers its buckets: so both order a stream's buckets alike by id (the order of
   * defragmentation and incremental compaction) */
  uint64_t *reserved;
  size_t n_reserved, used_reserved;
  bs__htab bname, bid;
  bs__pg_buf ops, params; /* COPY streams: bs_chunks, bs_params */
  sup_ent *sups; /* the superseded log's entries, written as bs_superseded rows (sups_copy) */
  size_t nsups, csups;
  bs_val *lookups; /* changed lookup keys, distinct (owned copies: a tombstone's key may live
                    * in a record that a later store of the batch replaces) */
  size_t nlk, clk;
  bs__htab lmap;
  tab_ent *tabs;
  size_t ntabs, ctabs;
} batch;

static uint64_t rec_hash(uint32_t table, bs_val rid) {
  return XXH3_64bits_withSeed(rid.data, rid.size, table);
}

static rec_ent *rec_find(batch *b, uint32_t table, bs_val rid) {
  bs__hprobe p = bs__htab_probe(&b->rmap, rec_hash(table, rid));
  for (uintptr_t v; (v = bs__htab_next(&p));) {
    rec_ent *e = b->recs[v - 1];
    if (e->table == table && bs__val_eq(e->rid, rid)) return e;
  }
  return NULL;
}

/* Sets e's record to a copy of r (one blob for its arrays and strings). */
static int rec_set(batch *b, rec_ent *e, const bs__srec *r) {
  size_t n = r->nm * sizeof(bs__member) + r->nl * sizeof(bs_val) + r->data.size;
  unsigned char *p, *blob;
  bs__srec c = *r;
  for (uint32_t i = 0; i < r->nm; i++) n += r->m[i].object_type.size + r->m[i].object_id.size;
  for (uint32_t i = 0; i < r->nl; i++) n += r->lk[i].size;
  if (!(blob = bs__malloc(b->a, n))) return BS_ENOMEM;
  c.m = (bs__member *)blob;
  c.lk = (bs_val *)(c.m + r->nm);
  p = (unsigned char *)(c.lk + r->nl);
  for (uint32_t i = 0; i < r->nm; i++) {
    c.m[i] = r->m[i];
    c.m[i].object_type = val_put(&p, r->m[i].object_type);
    c.m[i].object_id = val_put(&p, r->m[i].object_id);
  }
  for (uint32_t i = 0; i < r->nl; i++) c.lk[i] = val_put(&p, r->lk[i]);
  c.data = val_put(&p, r->data);
  if (r->has_data && !c.data.data) c.data.data = p; /* present, empty */
  if (!r->nm) c.m = NULL;
  if (!r->nl) c.lk = NULL;
  bs__free(b->a, e->blob);
  e->blob = blob;
  e->r = c;
  return BS_OK;
}

static rec_ent *rec_add(batch *b, uint32_t table, bs_val rid) {
  rec_ent *e;
  unsigned char *copy;
  if (b->nrecs == b->crecs) {
    size_t cap = b->crecs ? b->crecs * 2 : 64;
    rec_ent **p = bs__realloc(b->a, b->recs, cap * sizeof *p);
    if (!p) return NULL;
    b->recs = p;
    b->crecs = cap;
  }
  if (bs__htab_reserve(&b->rmap, b->a, b->nrecs + 1)) return NULL;
  if (!(e = bs__calloc(b->a, 1, sizeof *e))) return NULL;
  if (!(copy = bs__malloc(b->a, rid.size))) {
    bs__free(b->a, e);
    return NULL;
  }
  if (rid.size) memcpy(copy, rid.data, rid.size);
  b->recs[b->nrecs++] = e;
  e->table = table;
  e->rid.data = copy;
  e->rid.size = rid.size;
  bs__htab_put(&b->rmap, rec_hash(table, rid), b->nrecs);
  return e;
}

static bucket_ent *bucket_by_name(batch *b, bs_val name) {
  bs__hprobe p = bs__htab_probe(&b->bname, XXH3_64bits(name.data, name.size));
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (bs__val_eq(b->bk[v - 1].name, name)) return &b->bk[v - 1];
  return NULL;
}

static bucket_ent *bucket_by_id(batch *b, uint64_t id) {
  bs__hprobe p = bs__htab_probe(&b->bid, id * 0x9e3779b97f4a7c15ull);
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (b->bk[v - 1].id == id) return &b->bk[v - 1];
  return NULL;
}

static int bucket_add(batch *b, uint64_t id, bs_val name) {
  bucket_ent *e;
  unsigned char *copy;
  if (id ? bucket_by_id(b, id) != NULL : bucket_by_name(b, name) != NULL) return BS_OK;
  if (b->nbk == b->cbk) {
    size_t cap = b->cbk ? b->cbk * 2 : 64;
    bucket_ent *p = bs__realloc(b->a, b->bk, cap * sizeof *p);
    if (!p) return BS_ENOMEM;
    b->bk = p;
    b->cbk = cap;
  }
  if (bs__htab_reserve(&b->bname, b->a, b->nbk + 1) || bs__htab_reserve(&b->bid, b->a, b->nbk + 1))
    return BS_ENOMEM;
  if (!(copy = bs__malloc(b->a, name.size))) return BS_ENOMEM;
  memcpy(copy, name.data, name.size);
  e = &b->bk[b->nbk++];
  memset(e, 0, sizeof *e);
  e->id = id;
  e->name.data = copy;
  e->name.size = name.size;
  bs__htab_put(&b->bname, XXH3_64bits(name.data, name.size), b->nbk);
  if (id)
    bs__htab_put(&b->bid, id * 0x9e3779b97f4a7c15ull, b->nbk);
  else
    e->fresh = 1;
  return BS_OK;
}

static void batch_free(batch *b) {
  for (size_t i = 0; i < b->nrecs; i++) {
    bs__free(b->a, (void *)b->recs[i]->rid.data);
    bs__free(b->a, b->recs[i]->blob);
    bs__free(b->a, b->recs[i]);
  }
  for (size_t i = 0; i < b->nbk; i++) {
    bs__free(b->a, (void *)b->bk[i].name.data);
    bs__pg_chunkb_free(&b->bk[i].ck, b->a);
  }
  for (size_t i = 0; i < b->nlk; i++) bs__free(b->a, (void *)b->lookups[i].data);
  for (size_t i = 0; i < b->ntabs; i++) bs__free(b->a, (void *)b->tabs[i].name.data);
  bs__free(b->a, b->tabs);
  bs__free(b->a, b->recs);
  bs__free(b->a, b->bk);
  bs__free(b->a, b->reserved);
  bs__free(b->a, b->lookups);
  bs__free(b->a, b->ops.p);
  bs__free(b->a, b->params.p);
  bs__free(b->a, b->sups);
  bs__htab_free(&b->rmap, b->a);
  bs__htab_free(&b->bname, b->a);
  bs__htab_free(&b->bid, b->a);
  bs__htab_free(&b->lmap, b->a);
}

static int oom(bs_error *err) {
  return bs__fail(err, BS_ENOMEM, "flush: out of memory");
}

/* Adds table id's key and name (copied) to the batch's tables; NULL when out of memory. */
static const tab_ent *tab_add(batch *b, uint32_t id, uint32_t key, bs_val name) {
  tab_ent *t;
  unsigned char *copy;
  if (b->ntabs == b->ctabs) {
    size_t cap = b->ctabs ? b->ctabs * 2 : 8;
    tab_ent *p = bs__realloc(b->a, b->tabs, cap * sizeof *p);
    if (!p) return NULL;
    b->tabs = p;
    b->ctabs = cap;
  }
  if (!(copy = bs__malloc(b->a, name.size ? name.size : 1))) return NULL;
  if (name.size) memcpy(copy, name.data, name.size);
  t = &b->tabs[b->ntabs++];
  t->id = id;
  t->key = key;
  t->name = (bs_val){copy, name.size};
  return t;
}

/* The stream's table id: known to the batch (resolve_tables, an earlier call), else read from
 * bs_tables (truncate, defragmentation and source_row name tables by id). */
static int tab_get(batch *b, uint32_t id, const tab_ent **out, bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  for (size_t i = 0; i < b->ntabs; i++)
    if (b->tabs[i].id == id) {
      *out = &b->tabs[i];
      return BS_OK;
    }
  bs__pg_arg_i32(&a, (int32_t)b->stream);
  bs__pg_arg_i32(&a, (int32_t)id);
  if ((rc = bs__pg_exec(b->c, "SELECT key, name FROM bs_tables WHERE stream = $1 AND id = $2", &a,
                        &r, "source table", err)))
    return rc;
  if (PQntuples(r) != 1)
    rc =
        bs__fail(err, BS_ECORRUPT, "stream %u: source table %u is not in bs_tables", b->stream, id);
  else if (!(*out = tab_add(b, id, (uint32_t)bs__pg_i32(r, 0, 0), bs__pg_bytes(r, 0, 1))))
    rc = oom(err);
  PQclear(r);
  return rc;
}

/* ---- effects.c's side -------------------------------------------------------------------------- */

static int fx_load(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  batch *b = ctx;
  rec_ent *e = rec_find(b, b->table, rid);
  if (!e) /* every record the batch names was loaded up front */
    return bs__fail(err, BS_ECORRUPT, "flush: a source record was not loaded");
  *out = &e->r;
  return BS_OK;
}

static int fx_bucket(void *ctx, bs_val name, uint64_t *id, bs_error *err) {
  batch *b = ctx;
  bucket_ent *e = bucket_by_name(b, name);
  if (!e) return bs__fail(err, BS_ECORRUPT, "flush: a bucket was not resolved");
  if (!e->id) { /* a new bucket's first use */
    if (b->used_reserved == b->n_reserved)
      return bs__fail(err, BS_ECORRUPT, "flush: no bucket id reserved");
    e->id = b->reserved[b->used_reserved++];
    bs__htab_put(&b->bid, e->id * 0x9e3779b97f4a7c15ull, (uintptr_t)(e - b->bk) + 1);
  }
  *id = e->id;
  return BS_OK;
}

/* The next op id of the batch: op ids stay below 2^63 (contract.md 2; op_id is a bigint). The
 * refusal rolls the transaction back, so the head stays where it was. */
static int next_op(batch *b, uint64_t *id, bs_error *err) {
  if (b->head >= (UINT64_C(1) << 63) - 1)
    return bs__fail(err, BS_ELIMIT, "op ids of stream %u exhausted", b->stream);
  *id = ++b->head;
  return BS_OK;
}

static int fx_op(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *op_id, bs_error *err) {
  batch *b = ctx;
  bucket_ent *e = bucket_by_id(b, bucket);
  int rc;
  if (!e) return bs__fail(err, BS_ECORRUPT, "flush: bucket %" PRIu64 " is not known", bucket);
  if ((rc = next_op(b, op_id, err))) return rc;
  {
    bs_op o = *op;
    o.op_id = *op_id;
    /* a bucket's ops come in op-id order: each goes to the end of its bucket's chunk */
    if (bs__pg_chunkb_add(&e->ck, b->a, &b->ops, bucket, &o) || b->ops.oom) return oom(err);
  }
  e->d_checksum = bs__cksum_add(e->d_checksum, op->checksum);
  e->d_count++;
  e->d_bytes += bs__pg_op_bytes(op);
  if (bs__pg_op_bytes(op) > e->max_bytes) e->max_bytes = bs__pg_op_bytes(op);
  e->last_op = *op_id;
  e->touched = 1;
  return BS_OK;
}

/* The log of incremental compaction (contract.md 6): old_op of the row was superseded by new_op. */
static int fx_superseded(void *ctx, uint64_t bucket, uint64_t old_op, uint64_t new_op,
                         bs_error *err) {
  batch *b = ctx;
  if (BS_GROW(b->a, b->sups, b->csups, b->nsups + 1)) return oom(err);
  b->sups[b->nsups++] = (sup_ent){bucket, old_op, new_op};
  return BS_OK;
}

static int fx_param(void *ctx, bs_val key, bs_val rid, const bs_val *params, size_t n,
                    bs_error *err) {
  batch *b = ctx;
  size_t arr = n ? 20 : 12;
  key = present(key);
  unsigned char *p;
  uint64_t h = XXH3_64bits(key.data, key.size), id = 0;
  bs__hprobe pr = bs__htab_probe(&b->lmap, h);
  int known = 0, rc;
  if ((rc = next_op(b, &id, err))) return rc;
  for (size_t i = 0; i < n; i++) arr += 4 + params[i].size;
  bs__pg_copy_tuple(&b->params, b->a, 6);
  bs__pg_copy_int(&b->params, b->a, b->stream, 4);
  bs__pg_copy_bytes(&b->params, b->a, key);
  bs__pg_copy_int(&b->params, b->a, id, 8);
  bs__pg_copy_int(&b->params, b->a, b->table, 4);
  bs__pg_copy_bytes(&b->params, b->a, rid.data ? rid : bs__val_str(""));
  if ((p = bs__pg_buf_room(&b->params, b->a,
                           4 + arr))) { /* rows bytea[] in the array binary form */
    bs__put_u32be(p, (uint32_t)arr);
    bs__put_u32be(p + 4, n ? 1 : 0);
    bs__put_u32be(p + 8, 0);
    bs__put_u32be(p + 12, 17);
    p += 16;
    if (n) {
      bs__put_u32be(p, (uint32_t)n);
      bs__put_u32be(p + 4, 1);
      p += 8;
    }
    for (size_t i = 0; i < n; i++) {
      bs__put_u32be(p, (uint32_t)params[i].size);
      if (params[i].size) memcpy(p + 4, params[i].data, params[i].size);
      p += 4 + params[i].size;
    }
  }
  if (b->params.oom) return oom(err);
  /* the change record's lookups: distinct, until they are too many (then the record says so) */
  for (uintptr_t v; !known && (v = bs__htab_next(&pr));) known = bs__val_eq(b->lookups[v - 1], key);
  if (known || bs__changes_too_many(b->nlk)) return BS_OK;
  if (b->nlk == b->clk) {
    size_t cap = b->clk ? b->clk * 2 : 16;
    bs_val *q = bs__realloc(b->a, b->lookups, cap * sizeof *q);
    if (!q) return oom(err);
    b->lookups = q;
    b->clk = cap;
  }
  if (bs__htab_reserve(&b->lmap, b->a, b->nlk + 1) || !(p = bs__malloc(b->a, key.size)))
    return oom(err);
  if (key.size) memcpy(p, key.data, key.size);
  bs__htab_put(&b->lmap, h, b->nlk + 1);
  b->lookups[b->nlk].data = p;
  b->lookups[b->nlk++].size = key.size;
  return BS_OK;
}

static int fx_store(void *ctx, bs_val rid, const bs__srec *rec, bs_error *err) {
  batch *b = ctx;
  rec_ent *e = rec_find(b, b->table, rid);
  if (!e && !(e = rec_add(b, b->table, rid))) return oom(err);
  if (rec_set(b, e, rec)) return oom(err);
  e->dirty = 1;
  return BS_OK;
}

static uint64_t fx_op_head(void *ctx) {
  return ((batch *)ctx)->head;
}

static const bs__pg_stmt table_stmt = {
    BS_PG_STMT_TABLE,
    "WITH t AS (SELECT id, key FROM bs_tables WHERE stream = $1 AND name = $2),"
    " n AS (UPDATE bs_streams SET next_table_id = next_table_id + 1"
    "  WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM t)"
    "  RETURNING next_table_id - 1 AS id),"
    " i AS (INSERT INTO bs_tables (stream, name, id) SELECT $1, $2, id FROM n RETURNING id, key)"
    " SELECT id, key FROM t UNION ALL SELECT id, key FROM i"};

static const bs__effects_ops pg_effects_ops = {
    .load = fx_load,
    .bucket = fx_bucket,
    .op = fx_op,
    .superseded = fx_superseded,
    .param = fx_param,
    .store = fx_store,
    .op_head = fx_op_head,
};

/* ---- Loading what the batch needs ------------------------------------------------------------- */

/* The table ids of every table the queue names, registering new ones (1, 2, ... per stream; a
 * database-wide key from bs_tables' identity), each known to the batch with its key and name. */
static int resolve_tables(batch *b, uint32_t *ids, bs_error *err) {
  const bs_write_item *q = b->in->items;
  for (size_t i = 0; i < b->in->n; i++) {
    const bs_save *s = q[i].save;
    bs__pg_args a = {0};
    PGresult *r;
    int rc, known = 0;
    if (!s) continue;
    if (i > 0 && q[i - 1].save && bs__val_eq(q[i - 1].save->table, s->table)) {
      ids[i] = ids[i - 1];
      continue;
    }
    bs__pg_arg_i32(&a, (int32_t)b->stream);
    bs__pg_arg_bytes(&a, s->table);
    rc = bs__pg_execp(b->c, &table_stmt, &a, &r, "registering a source table", err);
    if (rc) return rc;
    ids[i] = (uint32_t)bs__pg_i32(r, 0, 0);
    for (size_t k = 0; k < b->ntabs; k++) known |= b->tabs[k].id == ids[i];
    if (!known && !tab_add(b, ids[i], (uint32_t)bs__pg_i32(r, 0, 1), s->table)) rc = BS_ENOMEM;
    PQclear(r);
    if (rc) return oom(err);
  }
  return BS_OK;
}

static const bs__pg_stmt records_stmt = {
    BS_PG_STMT_RECORDS, "SELECT s.* FROM unnest($2::bytea[]) AS k(r) CROSS JOIN LATERAL"
                        " (SELECT " BS_PG_SOURCE_COLS ", data, ctid FROM bs_source"
                        "  WHERE tkey = $1 AND replica_id = k.r LIMIT 1) s"};

/* Loads the source records of (table, rids) that are not loaded yet; rows that have none get an
 * entry with exists 0. Every key is one probe of the primary key, whatever the table's
 * statistics say: a LATERAL subquery with LIMIT is never flattened into a join. Planned freely,
 * `replica_id = ANY($2)` was a filter over the whole (stream, table_id) range while the table
 * had no statistics (a table filling up: the first minutes of a snapshot), and a join with an
 * unnest of the keys a hash join over a sequential scan: O(table) per flush instead of O(batch).
 * The flush writes the stored rows back by the ctids read here (update_records). */
static int load_records(batch *b, uint32_t table, const bs_val *rids, size_t n, bs_error *err) {
  bs__pg_args a = {0};
  unsigned char *arr = NULL;
  const tab_ent *t;
  PGresult *r;
  int rc;
  if (!n) return BS_OK;
  if ((rc = tab_get(b, table, &t, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)t->key);
  if ((rc = bs__pg_arg_bytes_array(&a, rids, n, b->a, &arr, err))) return rc;
  rc = bs__pg_execp(b->c, &records_stmt, &a, &r, "loading source records", err);
  bs__free(b->a, arr);
  if (rc) return rc;
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    bs_val rid = bs__pg_bytes(r, i, 0);
    rec_ent *e = rec_find(b, table, rid);
    bs__srec s = {0};
    if (e) continue;
    if (!(e = rec_add(b, table, rid))) {
      rc = oom(err);
      break;
    }
    e->stored = 1;
    if (PQgetlength(r, i, BS_PG_SOURCE_NCOLS + 1) == (int)sizeof e->tid)
      memcpy(e->tid, PQgetvalue(r, i, BS_PG_SOURCE_NCOLS + 1), sizeof e->tid);
    rc = bs__pg_source_row(&s, b->a, r, i, 0, 1, t->name);
    if (rc == BS_OK && rec_set(b, e, &s)) rc = BS_ENOMEM;
    bs__free(b->a, s.m);
    bs__free(b->a, s.lk);
    if (rc == BS_ECORRUPT)
      rc = bs__fail(err, rc, "a source record of table %u does not decode", table);
    else if (rc)
      rc = oom(err);
  }
  PQclear(r);
  for (size_t i = 0; i < n && !rc; i++)
    if (!rec_find(b, table, rids[i]) && !rec_add(b, table, rids[i])) rc = oom(err);
  return rc;
}

static const bs__pg_stmt reserve_stmt = {
    BS_PG_STMT_RESERVE, "SELECT nextval(pg_get_serial_sequence('bs_buckets', 'id'))"
                        " FROM generate_series(1, $1) ORDER BY 1"};

/* Reserves an id (the identity sequence of bs_buckets) for every new bucket of the batch. */
static int reserve_ids(batch *b, bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  size_t k = 0;
  int rc;
  for (size_t i = 0; i < b->nbk; i++) k += b->bk[i].fresh;
  if (!k) return BS_OK;
  if (!(b->reserved = bs__calloc(b->a, k, sizeof *b->reserved))) return oom(err);
  bs__pg_arg_i64(&a, (int64_t)k);
  rc = bs__pg_execp(b->c, &reserve_stmt, &a, &r, "reserving bucket ids", err);
  if (rc) return rc;
  for (int i = 0; i < PQntuples(r) && (size_t)i < k; i++)
    b->reserved[b->n_reserved++] = (uint64_t)bs__pg_i64(r, i, 0);
  PQclear(r);
  return BS_OK;
}

static const bs__pg_stmt buckets_stmt = {BS_PG_STMT_BUCKETS,
                                         "SELECT id, name FROM bs_buckets WHERE stream = $1"
                                         " AND (name = ANY($2) OR id = ANY($3))"};

/* Every record the queue's saves can load, per table; then the buckets their memberships and
 * the saves' rows name (new ones get an id at their first use). */
static int load_batch(batch *b, const uint32_t *tables, bs_error *err) {
  const bs_write_item *q = b->in->items;
  size_t nq = b->in->n;
  bs_val *rids = NULL, *names = NULL;
  size_t nr = 0, nn = 0, cn = 0;
  uint64_t *ids = NULL;
  size_t nid = 0, cid = 0;
  unsigned char *arr = NULL;
  int rc = BS_OK;
  if (!(rids = bs__calloc(b->a, 2 * nq + 1, sizeof *rids))) return oom(err);
  for (size_t i = 0; i < nq && !rc; i++) {
    const bs_save *s = q[i].save;
    if (!s) continue;
    if (s->before_id.data) rids[nr++] = s->before_id;
    if (s->after_id.data) rids[nr++] = s->after_id;
    /* one statement per run of saves of one table */
    if (i + 1 == nq || !q[i + 1].save || tables[i + 1] != tables[i]) {
      rc = load_records(b, tables[i], rids, nr, err);
      nr = 0;
    }
  }
  bs__free(b->a, rids);
  if (rc) return rc;
  /* bucket names of the rows, ids of the memberships */
  for (size_t i = 0; i < nq; i++) {
    const bs_save *s = q[i].save;
    if (!s) continue;
    for (size_t k = 0; k < s->n_rows; k++) {
      if (nn == cn) {
        size_t cap = cn ? cn * 2 : 64;
        bs_val *p = bs__realloc(b->a, names, cap * sizeof *p);
        if (!p) goto nomem;
        names = p;
        cn = cap;
      }
      names[nn++] = s->rows[k].bucket;
    }
  }
  for (size_t i = 0; i < b->nrecs; i++)
    for (uint32_t k = 0; k < b->recs[i]->r.nm; k++) {
      if (nid == cid) {
        size_t cap = cid ? cid * 2 : 64;
        uint64_t *p = bs__realloc(b->a, ids, cap * sizeof *p);
        if (!p) goto nomem;
        ids = p;
        cid = cap;
      }
      ids[nid++] = b->recs[i]->r.m[k].bucket;
    }
  {
    bs__pg_args a = {0};
    unsigned char *arr2 = NULL;
    PGresult *r;
    bs__pg_arg_i32(&a, (int32_t)b->stream);
    if ((rc = bs__pg_arg_bytes_array(&a, names, nn, b->a, &arr, err)) ||
        (rc = bs__pg_arg_i64_array(&a, ids, nid, b->a, &arr2, err)))
      goto out;
    rc = bs__pg_execp(b->c, &buckets_stmt, &a, &r, "resolving buckets", err);
    bs__free(b->a, arr2);
    if (rc) goto out;
    for (int i = 0; i < PQntuples(r) && !rc; i++)
      if (bucket_add(b, (uint64_t)bs__pg_i64(r, i, 0), bs__pg_bytes(r, i, 1))) rc = oom(err);
    PQclear(r);
    /* the names not stored yet: new buckets, created by batch_write if an op uses them */
    for (size_t i = 0; i < nn && !rc; i++)
      if (!bucket_by_name(b, names[i]) && bucket_add(b, 0, names[i])) rc = oom(err);
    if (!rc) rc = reserve_ids(b, err);
  }
  goto out;
nomem:
  rc = oom(err);
out:
  bs__free(b->a, arr);
  bs__free(b->a, names);
  bs__free(b->a, ids);
  return rc;
}

/* ---- Writing the batch -------------------------------------------------------------------------- */

static const bs__pg_stmt rec_delete_stmt = {BS_PG_STMT_REC_DELETE,
                                            "DELETE FROM bs_source WHERE ctid = ANY($1::tid[])"};

/* tid[] of the rows' ctids as load_records read them: the binary array of bytea[] with the
 * element type of tid (whose binary form is those 6 bytes). */
static int arg_tids(bs__pg_args *a, const bs_val *tids, size_t n, const bs_allocator *al,
                    unsigned char **out, bs_error *err) {
  int rc = bs__pg_arg_bytes_array(a, tids, n, al, out, err);
  if (rc) return rc;
  bs__put_u32be(*out + 8, 27 /* tid */);
  a->types[a->n - 1] = 1010 /* tid[] */;
  return BS_OK;
}

/* The number of rows a statement on the loaded ctids wrote: fewer than n when another session
 * changed one of them since (the ctid names its old version, which the statement skips). */
static int rows_written(PGresult *r, size_t n, bs_error *err) {
  unsigned long long done = strtoull(PQcmdTuples(r), NULL, 10);
  if (done == n) return BS_OK;
  return bs__fail(err, BS_EBUSY,
                  "flush: %llu of %zu source records changed since the flush read them (another "
                  "session wrote them); nothing was applied",
                  (unsigned long long)n - done, n);
}

/* The stored rows of the records the batch deleted (of every table: a ctid names a row of the
 * table), in one statement, by the ctids load_records read (see update_records). */
static int delete_records(batch *b, bs_error *err) {
  bs__pg_args a = {0};
  unsigned char *ra = NULL;
  bs_val *tids;
  PGresult *r = NULL;
  size_t n = 0;
  int rc;
  if (!(tids = bs__calloc(b->a, b->nrecs + 1, sizeof *tids))) return oom(err);
  for (size_t i = 0; i < b->nrecs; i++) {
    rec_ent *e = b->recs[i];
    if (e->dirty && e->stored && !e->r.exists)
      tids[n].data = e->tid, tids[n++].size = sizeof e->tid;
  }
  rc = n ? arg_tids(&a, tids, n, b->a, &ra, err) : BS_OK;
  if (n && !rc) rc = bs__pg_execp(b->c, &rec_delete_stmt, &a, &r, "flush: source records", err);
  if (n && !rc) rc = rows_written(r, n, err);
  PQclear(r);
  bs__free(b->a, ra);
  bs__free(b->a, tids);
  return rc;
}

static const bs__pg_stmt rec_update_stmt = {
    BS_PG_STMT_REC_UPDATE,
    "UPDATE bs_source s SET mark = CASE WHEN u.s <> 0 THEN u.m END, members = u.mb, data = u.d"
    " FROM unnest($1::tid[], $2::int8[], $3::int8[], $4::bytea[], $5::bytea[])"
    " AS u(c, s, m, mb, d) WHERE s.ctid = u.c"};

/* The stored records the batch changed and kept, replaced in one statement: each row found by
 * the ctid load_records read (a TID fetch). The upsert this was (INSERT ... ON CONFLICT) probed
 * the primary key and locked each row first: 6.7k buffer hits and 2.3k WAL records per 1000
 * records against 3.9k and 1.4k, 17.5 ms against 10.2 (bsbench --pg's updates, schema 7), the
 * largest statement of a flush of updates on the server. The ctid still names the row: the
 * batch's transaction read it, holds the stream row, which every writer of a stream's records
 * locks first (batch_open), and a flush writes a record once. A row that changed anyway (another
 * session wrote it) is not updated, and the flush fails. Planned with statistics (the writer's
 * ANALYZE after its first flush, pg_write.c), a TID scan per row in a nested loop; only a table
 * of a few pages is read whole. */
static int update_records(batch *b, bs_error *err) {
  enum { SOFT, MARK, NCOL };
  uint64_t *v = NULL;
  bs_val *tids = NULL, *members = NULL, *data = NULL;
  unsigned char *arr[NCOL + 3] = {NULL}, *enc = NULL;
  size_t n = 0, bytes = 0, at = 0;
  bs__pg_args a = {0};
  PGresult *r = NULL;
  int rc = BS_OK;
  for (size_t i = 0; i < b->nrecs; i++) {
    const rec_ent *e = b->recs[i];
    const tab_ent *t;
    if (!e->dirty || !e->stored || !e->r.exists) continue;
    if ((rc = tab_get(b, e->table, &t, err))) return rc;
    n++, bytes += bs__pg_srec_size(&e->r, t->name, e->rid);
  }
  if (!n) return BS_OK;
  if (!(v = bs__calloc(b->a, NCOL * n, sizeof *v)) || !(tids = bs__calloc(b->a, n, sizeof *tids)) ||
      !(members = bs__calloc(b->a, n, sizeof *members)) ||
      !(data = bs__calloc(b->a, n, sizeof *data)) || !(enc = bs__malloc(b->a, bytes))) {
    rc = oom(err);
    goto out;
  }
  for (size_t i = 0, k = 0; i < b->nrecs; i++) {
    const rec_ent *e = b->recs[i];
    const tab_ent *t;
    if (!e->dirty || !e->stored || !e->r.exists) continue;
    if ((rc = tab_get(b, e->table, &t, err))) goto out;
    v[SOFT * n + k] = e->r.soft != 0;
    v[MARK * n + k] = e->r.mark;
    tids[k].data = e->tid;
    tids[k].size = sizeof e->tid;
    members[k].data = enc + at;
    members[k].size = bs__pg_srec_size(&e->r, t->name, e->rid);
    bs__pg_srec_encode(enc + at, &e->r, t->name, e->rid);
    at += members[k].size;
    data[k] = e->r.has_data ? present(e->r.data) : (bs_val){NULL, 0};
    k++;
  }
  if ((rc = arg_tids(&a, tids, n, b->a, &arr[NCOL], err))) goto out;
  for (int c = 0; c < NCOL && !rc; c++)
    rc = bs__pg_arg_i64_array(&a, v + (size_t)c * n, n, b->a, &arr[c], err);
  if (rc || (rc = bs__pg_arg_bytes_array(&a, members, n, b->a, &arr[NCOL + 1], err)) ||
      (rc = bs__pg_arg_bytes_array(&a, data, n, b->a, &arr[NCOL + 2], err)))
    goto out;
  rc = bs__pg_execp(b->c, &rec_update_stmt, &a, &r, "flush: source records", err);
  if (!rc) rc = rows_written(r, n, err);
out:
  PQclear(r);
  for (int c = 0; c < NCOL + 3; c++) bs__free(b->a, arr[c]);
  bs__free(b->a, enc);
  bs__free(b->a, data);
  bs__free(b->a, members);
  bs__free(b->a, tids);
  bs__free(b->a, v);
  return rc;
}

/* The records the batch changed: stored ones deleted or updated (a statement each), new ones
 * COPYed. */
static int write_records(batch *b, bs_error *err) {
  bs__pg_buf out = {0};
  int rc = delete_records(b, err);
  if (!rc) rc = update_records(b, err);
  for (size_t i = 0; i < b->nrecs && !rc; i++) {
    const rec_ent *e = b->recs[i];
    const tab_ent *t;
    if (e->dirty && !e->stored && e->r.exists && !(rc = tab_get(b, e->table, &t, err)))
      bs__pg_source_copy(&out, b->a, t->key, t->name, e->rid, &e->r);
  }
  if (!rc && out.oom) rc = oom(err);
  if (!rc) rc = bs__pg_copy_in(b->c, BS_PG_SOURCE_COPY, &out, b->a, err);
  bs__free(b->a, out.p);
  return rc;
}

static const bs__pg_stmt bk_create_stmt = {
    BS_PG_STMT_BK_CREATE, "INSERT INTO bs_buckets (stream, name, id) OVERRIDING SYSTEM VALUE"
                          " SELECT $1, x, i FROM unnest($2::bytea[], $3::int8[]) AS d(x, i)"};

/* The new buckets the batch used, with the ids their first use took. */
static int create_buckets(batch *b, bs_error *err) {
  bs_val *names = NULL;
  uint64_t *ids = NULL;
  unsigned char *na = NULL, *ia = NULL;
  bs__pg_args a = {0};
  size_t n = 0;
  int rc = BS_OK;
  if (!b->used_reserved) return BS_OK;
  if (!(names = bs__calloc(b->a, b->used_reserved, sizeof *names)) ||
      !(ids = bs__calloc(b->a, b->used_reserved, sizeof *ids)))
    rc = oom(err);
  for (size_t i = 0; i < b->nbk && !rc; i++)
    if (b->bk[i].fresh && b->bk[i].id && n < b->used_reserved) {
      names[n] = b->bk[i].name;
      ids[n++] = b->bk[i].id;
    }
  bs__pg_arg_i32(&a, (int32_t)b->stream);
  if (!rc && !(rc = bs__pg_arg_bytes_array(&a, names, n, b->a, &na, err)) &&
      !(rc = bs__pg_arg_i64_array(&a, ids, n, b->a, &ia, err)))
    rc = bs__pg_runp(b->c, &bk_create_stmt, &a, "flush: new buckets", err);
  bs__free(b->a, na);
  bs__free(b->a, ia);
  bs__free(b->a, names);
  bs__free(b->a, ids);
  return rc;
}

static const bs__pg_stmt bk_update_stmt = {
    BS_PG_STMT_BK_UPDATE, "UPDATE bs_buckets b SET checksum = (b.checksum + d.ck) % 4294967296,"
                          " count = b.count + d.n, bytes = b.bytes + d.sz,"
                          " last_op = greatest(b.last_op, d.last),"
                          " max_op_bytes = greatest(b.max_op_bytes, d.mx)"
                          " FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],"
                          " $6::int8[]) AS d(id, ck, n, sz, last, mx) WHERE b.id = d.id"};

static const bs__pg_stmt bk_changes_stmt = {
    BS_PG_STMT_BK_CHANGES,
    "INSERT INTO bs_changes (stream, op_id, seq, first_op, flags, buckets, lookups)"
    " SELECT $1, $2, coalesce(max(seq), 0) + 1, $3, $4, $5, $6 FROM bs_changes"
    " WHERE stream = $1 AND op_id = $2"};

static int write_buckets(batch *b, bs_error *err) {
  uint64_t *v = NULL;
  unsigned char *arr[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  bs_val *names = NULL;
  unsigned char *narr = NULL;
  size_t n = 0, nb = 0;
  bs__pg_args a = {0};
  int rc = BS_OK, too_many, too_many_lookups = bs__changes_too_many(b->nlk);
  for (size_t i = 0; i < b->nbk; i++) n += b->bk[i].touched;
  if (!(v = bs__calloc(b->a, 6 * n + 1, sizeof *v)) ||
      !(names = bs__calloc(b->a, n + 1, sizeof *names))) {
    rc = oom(err);
    goto out;
  }
  for (size_t i = 0, k = 0; i < b->nbk; i++) {
    const bucket_ent *e = &b->bk[i];
    if (!e->touched) continue;
    v[k] = e->id;
    v[n + k] = e->d_checksum;
    v[2 * n + k] = e->d_count;
    v[3 * n + k] = e->d_bytes;
    v[4 * n + k] = e->last_op;
    v[5 * n + k] = e->max_bytes;
    k++;
    names[nb++] = e->name;
  }
  too_many = bs__changes_too_many(nb);
  for (int c = 0; c < 6 && !rc; c++)
    rc = bs__pg_arg_i64_array(&a, v + c * n, n, b->a, &arr[c], err);
  if (rc) goto out;
  rc = bs__pg_runp(b->c, &bk_update_stmt, &a, "flush: bucket states", err);
  if (rc) goto out;
  {
    bs__pg_args c = {0};
    unsigned char *larr = NULL;
    bs__pg_arg_i32(&c, (int32_t)b->stream);
    bs__pg_arg_i64(&c, (int64_t)b->head);
    bs__pg_arg_i64(&c, (int64_t)b->first);
    bs__pg_arg_i32(&c,
                   (too_many ? BS_PG_CHG_BUCKETS : 0) | (too_many_lookups ? BS_PG_CHG_LOOKUPS : 0));
    if ((rc = bs__pg_arg_bytes_array(&c, too_many ? NULL : names, too_many ? 0 : nb, b->a, &narr,
                                     err)) ||
        (rc = bs__pg_arg_bytes_array(&c, too_many_lookups ? NULL : b->lookups,
                                     too_many_lookups ? 0 : b->nlk, b->a, &larr, err)))
      goto out;
    rc = bs__pg_runp(b->c, &bk_changes_stmt, &c, "flush: change record", err);
    bs__free(b->a, larr);
  }
out:
  for (int c = 0; c < 6; c++) bs__free(b->a, arr[c]);
  bs__free(b->a, narr);
  bs__free(b->a, names);
  bs__free(b->a, v);
  return rc;
}

static int write_custom(batch *b, bs_error *err) {
  for (size_t i = 0; i < b->in->n; i++) {
    const bs_queued_wcp *q = b->in->items[i].wcp;
    bs__pg_args a = {0};
    int rc;
    if (!q) continue;
    bs__pg_arg_i32(&a, (int32_t)b->stream);
    bs__pg_arg_bytes(&a, q->event);
    bs__pg_arg_bytes(&a, q->user_id);
    bs__pg_arg_i64(&a, (int64_t)q->checkpoint);
    bs__pg_arg_i64(&a, q->requested_at_ms);
    rc = bs__pg_run(b->c,
                    "INSERT INTO bs_wcp_custom VALUES ($1, $2, $3, $4,"
                    " CASE WHEN $5 >= 0 THEN $5 END) ON CONFLICT (stream, event, user_id) DO"
                    " UPDATE SET value = $4, requested_at = CASE WHEN $5 >= 0 THEN $5 END",
                    &a, "flush: custom write checkpoint", err);
    if (rc) return rc;
    /* the user's checkpoint changed: the next checkpoint's change record names it */
    rc = bs__pg_run(b->c,
                    "INSERT INTO bs_changes (stream, op_id, seq, first_op, users)"
                    " SELECT $1, op_head, coalesce((SELECT max(seq) FROM bs_changes WHERE"
                    " stream = $1 AND op_id = s.op_head), 0) + 1,"
                    " least(op_head, 9223372036854775806) + 1, ARRAY[$3::bytea]"
                    " FROM bs_streams s WHERE id = $1 AND $2::bytea IS NOT NULL"
                    " AND $4::int8 IS NOT NULL AND $5::int8 IS NOT NULL",
                    &a, "flush: custom write checkpoint", err);
    if (rc) return rc;
  }
  return BS_OK;
}

static const bs__pg_stmt batch_open_stmt = {
    BS_PG_STMT_BATCH_OPEN,
    "SELECT " BS_PG_STREAM_COLS ", coalesce((SELECT value FROM bs_meta"
    " WHERE key = 'history_epoch'), 0) FROM bs_streams WHERE id = $1 FOR UPDATE"};

int bs__pg_head_seen(bs_storage *st, uint64_t head, int64_t epoch, bs_error *err) {
  bs__pg_storage *s = (bs__pg_storage *)st;
  uint64_t seen;
  int rc = BS_OK;
  pthread_mutex_lock(&s->mu);
  seen = s->seen_head;
  if (epoch < 0) {
    if (head > seen) s->seen_head = head;
  } else if (head >= seen || epoch != s->seen_epoch) {
    s->seen_head = head;
    s->seen_epoch = epoch;
  } else {
    rc = bs__fail(err, BS_ESTATE,
                  "history rewound: stream %u's op head went back from %llu to %llu (the tables "
                  "restored, or a failover): clients must sync again; then run bucketstore "
                  "ack-rewind URL",
                  (unsigned)st->stream_id, (unsigned long long)seen, (unsigned long long)head);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* Starts a batch inside the caller's open transaction: locks the stream row (refused when the
 * stream is terminated, unless reading: source_row, which rolls back, answers on a terminated
 * stream too, storage.h), reads its op head and hash into b and fx. */
static int batch_open(bs__pg_writer *w, const bs_write_batch *in, batch *b, bs__effects *fx,
                      int reading, bs_error *err) {
  bs__pg_args a = {0};
  bs__stream_step step;
  bs__pg_stream s = {0};
  PGresult *r;
  int rc;
  memset(b, 0, sizeof *b);
  memset(fx, 0, sizeof *fx);
  b->w = w;
  b->in = in;
  b->a = &w->db->base.alloc;
  b->c = w->c;
  b->stream = w->base.st->stream_id;
  fx->ops = &pg_effects_ops;
  fx->ctx = b;
  fx->alloc = b->a;
  fx->snapshot = w->snapshot;
  bs__pg_arg_i32(&a, (int32_t)b->stream);
  rc = bs__pg_execp(w->c, &batch_open_stmt, &a, &r, "flush", err);
  if (rc) return rc;
  if (PQntuples(r) != 1) {
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", b->stream);
  } else {
    s = bs__pg_stream_row(r, 0);
    if (!reading) rc = bs__stream_transition(&step, b->stream, s.row.state, BS__STREAM_WRITE, err);
  }
  if (!rc)
    rc = bs__pg_head_seen(w->base.st, s.row.op_head, bs__pg_i64(r, 0, BS_PG_STREAM_NCOLS), err);
  if (!rc) {
    b->head = s.row.op_head;
    b->first = b->head + 1;
    fx->hash = s.hash;
    fx->snapshot_done = s.row.snapshot_done;
  }
  PQclear(r);
  return rc;
}

static int cmp_sup(const void *x, const void *y) {
  const sup_ent *a = x, *b = y;
  if (a->bucket != b->bucket) return a->bucket < b->bucket ? -1 : 1;
  return a->old_op < b->old_op ? -1 : a->old_op > b->old_op;
}

/* The batch's superseded entries as bs_superseded rows: per bucket, ascending by old op, at most
 * BS_PG_SUP_ROW entries a row, keyed by the row's lowest new op. */
static int sups_copy(batch *b, bs_error *err) {
  bs__pg_buf out = {0};
  unsigned char *pairs = NULL;
  int rc;
  if (!b->nsups) return BS_OK;
  if (!(pairs = bs__malloc(b->a, 20 * (b->nsups < BS_PG_SUP_ROW ? b->nsups : BS_PG_SUP_ROW))))
    return oom(err);
  qsort(b->sups, b->nsups, sizeof *b->sups, cmp_sup);
  for (size_t i = 0, j; i < b->nsups; i = j) {
    uint64_t first = UINT64_MAX, prev = 0;
    unsigned char *p = pairs;
    for (j = i; j < b->nsups && j - i < BS_PG_SUP_ROW && b->sups[j].bucket == b->sups[i].bucket;
         j++)
      if (b->sups[j].new_op < first) first = b->sups[j].new_op;
    for (size_t k = i; k < j; k++)
      p = bs__pg_sups_put(p, &prev, first, b->sups[k].old_op, b->sups[k].new_op);
    bs__pg_copy_tuple(&out, b->a, 4);
    bs__pg_copy_int(&out, b->a, b->stream, 4);
    bs__pg_copy_int(&out, b->a, b->sups[i].bucket, 8);
    bs__pg_copy_int(&out, b->a, first, 8);
    bs__pg_copy_bytes(&out, b->a, (bs_val){pairs, (size_t)(p - pairs)});
  }
  bs__free(b->a, pairs);
  rc = out.oom ? oom(err)
               : bs__pg_copy_in(b->c,
                                "COPY bs_superseded (stream, bucket, first_new, pairs) FROM STDIN"
                                " (FORMAT binary)",
                                &out, b->a, err);
  bs__free(b->a, out.p);
  return rc;
}

static const bs__pg_stmt op_head_stmt = {BS_PG_STMT_OP_HEAD,
                                         "UPDATE bs_streams SET op_head = $2 WHERE id = $1"};

/* Writes what the batch's effects produced: ops, parameter entries, records, bucket states, the
 * op head and the change record, the custom write checkpoints. */
static int batch_write(batch *b, bs_error *err) {
  int rc;
  if (b->ops.oom || b->params.oom) return oom(err);
  for (size_t i = 0; i < b->nbk; i++)
    if (b->bk[i].ck.nops && bs__pg_chunkb_end(&b->bk[i].ck, b->a, &b->ops, b->bk[i].id))
      return oom(err);
  if ((rc = sups_copy(b, err)) ||
      (rc = bs__pg_copy_in(b->c, BS_PG_CHUNK_COPY, &b->ops, b->a, err)) ||
      (rc = bs__pg_copy_in(b->c,
                           "COPY bs_params (stream, lookup, op_id, table_id, replica_id, rows)"
                           " FROM STDIN (FORMAT binary)",
                           &b->params, b->a, err)) ||
      (rc = write_records(b, err)))
    return rc;
  if (b->head >= b->first) { /* something was persisted */
    bs__pg_args h = {0};
    bs__pg_arg_i32(&h, (int32_t)b->stream);
    bs__pg_arg_i64(&h, (int64_t)b->head);
    if ((rc = create_buckets(b, err)) || (rc = write_buckets(b, err)) ||
        (rc = bs__pg_runp(b->c, &op_head_stmt, &h, "flush: op head", err)))
      return rc;
  }
  return write_custom(b, err);
}

/* Applies the queue inside the caller's open transaction (the stream row is locked by it).
 * The batch's records stay for the caller (source_row), freed by batch_free. */
static int apply(bs__pg_writer *w, const bs_write_batch *in, batch *b, int reading, bs_error *err) {
  uint32_t *tables = NULL;
  bs__effects fx;
  int rc, saves = 0;
  if ((rc = batch_open(w, in, b, &fx, reading, err))) return rc;
  for (size_t i = 0; i < in->n; i++) saves += in->items[i].save != NULL;
  if (saves) {
    if (!(tables = bs__calloc(b->a, in->n, sizeof *tables))) return oom(err);
    if (!(rc = resolve_tables(b, tables, err)) && !(rc = load_batch(b, tables, err))) {
      bs__pg_hook(w->db, "flush.loaded", b->c);
      for (size_t i = 0; i < in->n && !rc; i++) {
        if (!in->items[i].save) continue;
        b->table = tables[i];
        rc = bs__effects_save(&fx, tables[i], in->items[i].save, err);
      }
    }
    bs__effects_free(&fx);
    bs__free(b->a, tables);
    if (rc) return rc;
  }
  return batch_write(b, err);
}

int bs__pg_flush_in_txn(bs__pg_writer *w, const bs_write_batch *in, uint64_t *head, bs_error *err) {
  batch b;
  int rc = apply(w, in, &b, 0, err);
  if (!rc) { /* what the writer wrote, for its ANALYZE (pg_write.c) */
    w->written += b.head >= b.first ? b.head - b.first + 1 : 0;
    for (size_t i = 0; i < b.nrecs; i++) w->written += b.recs[i]->dirty != 0;
  }
  if (!rc && head) *head = b.head;
  batch_free(&b);
  return rc;
}

/* Reads back a source record, seeing the queue: applies it in the writer's open transaction
 * (the caller rolls it back) and reads the record the batch ends with. */
int bs__pg_source_row_read(bs_val *data, int *has_data, bs__pg_writer *w, const bs_write_batch *in,
                           bs_val table, bs_val rid, bs_error *err) {
  batch b;
  rec_ent *e = NULL;
  void *copy = NULL;
  int rc = apply(w, in, &b, 1, err);
  *has_data = 0;
  *data = (bs_val){NULL, 0};
  if (!rc) {
    bs__pg_args a = {0};
    PGresult *r;
    uint32_t t = 0;
    bs__pg_arg_i32(&a, (int32_t)b.stream);
    bs__pg_arg_bytes(&a, table);
    rc = bs__pg_exec(w->c, "SELECT id FROM bs_tables WHERE stream = $1 AND name = $2", &a, &r,
                     "source_row", err);
    if (!rc && PQntuples(r) == 1) t = (uint32_t)bs__pg_i32(r, 0, 0);
    PQclear(r);
    if (!rc && t && !(e = rec_find(&b, t, rid)) && !(rc = load_records(&b, t, &rid, 1, err)))
      e = rec_find(&b, t, rid);
    if (!rc && e && e->r.exists && !e->r.soft) {
      *has_data = e->r.has_data;
      if (*has_data && e->r.data.size && !(copy = bs__malloc(b.a, e->r.data.size))) rc = oom(err);
      if (copy) memcpy(copy, e->r.data.data, e->r.data.size);
      *data = (bs_val){copy ? copy : "", e->r.data.size};
    } else if (!rc) {
      e = NULL;
    }
  }
  batch_free(&b);
  if (!rc && !e) rc = bs__source_row_missing(table, err);
  if (rc) {
    bs__free(&w->db->base.alloc, copy);
    *data = (bs_val){NULL, 0};
  }
  return rc;
}

/* ---- Truncate and drop (contract.md 4.2) -------------------------------------------------------
 * In bounded transactions of TRUNCATE_RECORDS source records, in replica-id byte order (the
 * LMDB backend's key order, so both allocate the same op ids): effects.c's bs__effects_unlink
 * emits each record's REMOVEs and lookup tombstones, then the record goes (a soft-deleted one
 * just goes). The last transaction of a drop forgets the table. */

#define TRUNCATE_RECORDS 1000

int bs__pg_truncate_share(bs__pg_writer *w, bs_val table, int drop, int *done, bs_error *err) {
  static const bs_write_batch none = {NULL, 0};
  static const bs__srec gone = {0};
  batch b;
  bs__effects fx;
  bs__pg_args a = {0};
  PGresult *r = NULL;
  bs_val *rids = NULL;
  int rc, n = 0;
  if ((rc = batch_open(w, &none, &b, &fx, 0, err))) goto out;
  bs__pg_arg_i32(&a, (int32_t)b.stream);
  bs__pg_arg_bytes(&a, table);
  bs__pg_arg_i32(&a, TRUNCATE_RECORDS);
  rc = bs__pg_exec(w->c,
                   "SELECT t.id, s.replica_id FROM bs_tables t LEFT JOIN LATERAL"
                   " (SELECT replica_id FROM bs_source WHERE tkey = t.key"
                   "  ORDER BY replica_id LIMIT $3) s ON true WHERE t.stream = $1 AND t.name = $2"
                   " ORDER BY s.replica_id",
                   &a, &r, "truncate: source records", err);
  if (rc) goto out;
  if (PQntuples(r) == 0) { /* an unknown table: nothing to truncate */
    *done = 1;
    goto out;
  }
  b.table = (uint32_t)bs__pg_i32(r, 0, 0);
  if (!(rids = bs__calloc(b.a, (size_t)PQntuples(r), sizeof *rids))) {
    rc = oom(err);
    goto out;
  }
  for (int i = 0; i < PQntuples(r); i++)
    if (!PQgetisnull(r, i, 1)) rids[n++] = bs__pg_bytes(r, i, 1);
  *done = n < TRUNCATE_RECORDS;
  if ((rc = load_records(&b, b.table, rids, (size_t)n, err)) || (rc = load_batch(&b, NULL, err)))
    goto out;
  for (int i = 0; i < n && !rc; i++) {
    rec_ent *e = rec_find(&b, b.table, rids[i]);
    if (!e) {
      rc = bs__fail(err, BS_ECORRUPT, "truncate: a source record was not loaded");
      break;
    }
    if (e->r.exists && !e->r.soft) rc = bs__effects_unlink(&fx, b.table, rids[i], &e->r, err);
    if (!rc) rc = fx_store(&b, rids[i], &gone, err);
  }
  if (!rc && *done && drop)
    rc = bs__pg_run(w->c, "DELETE FROM bs_tables WHERE stream = $1 AND name = $2 AND $3 > 0", &a,
                    "drop: forgetting the table", err);
  if (!rc) rc = batch_write(&b, err);
out:
  bs__free(b.a, rids);
  PQclear(r);
  bs__effects_free(&fx);
  batch_free(&b);
  return rc;
}

/* ---- Defragmentation (contract.md 6; pg_compact.c calls it) -------------------------------------
 * As the LMDB backend's (lmdb_compact.c, lmdb_write.c's bs__lmdb_reemit): what is live comes from the
 * source records (a membership names the row's latest op in the bucket, and the record's key is
 * what the re-emission must update), so the stream's records are scanned twice in one read
 * snapshot, counting the live rows of each candidate bucket, then collecting the rows of the
 * buckets bs__compact_defrag_due chooses (within memory_limit_mb). The rows are re-emitted in
 * (bucket, old op) order through the writer's path (batch_open / batch_write: new op ids from the
 * op head, the bucket state, the change record, the superseded log), max_ops_per_txn per
 * transaction; a row is re-emitted only when its record still has the membership at the old op,
 * which then takes the new op. */

typedef struct drow {
  uint64_t bucket, old_op;
  uint32_t table;
  bs_val rid; /* in dscan.keys */
} drow;

typedef struct dscan {
  const uint64_t *ids; /* candidate buckets, sorted */
  size_t n;
  uint64_t horizon;
  uint64_t *live, *bytes;
  unsigned char *chosen;
  drow *rows;
  size_t n_rows, cap_rows;
  unsigned char *keys;
  size_t keys_used, keys_cap;
} dscan;

static int find_id(const uint64_t *ids, size_t n, uint64_t id, size_t *at) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  *at = lo;
  return lo < n && ids[lo] == id;
}

/* One pass over the stream's (not soft-deleted) records, a page at a time, in (table key,
 * replica id) order: each table's records in a LATERAL range of bs_source's primary key. */
static int dscan_pass(PGconn *c, const bs_allocator *al, uint32_t stream, dscan *s, int pass,
                      bs_error *err) {
  unsigned char last[BS_MAX_REPLICA_ID];
  bs_val after = {"", 0};
  int32_t table = -1;
  int rc = BS_OK, more = 1;
  while (more && !rc) {
    bs__pg_args a = {0};
    PGresult *r;
    int rows;
    bs__pg_arg_i32(&a, (int32_t)stream);
    bs__pg_arg_i32(&a, table);
    bs__pg_arg_bytes(&a, after);
    if ((rc = bs__pg_exec(c,
                          "SELECT t.id, s.replica_id, s.members, t.key, t.name FROM bs_tables t"
                          " CROSS JOIN LATERAL (SELECT replica_id, members FROM bs_source"
                          "  WHERE tkey = t.key AND mark IS NULL AND (tkey, replica_id) > ($2, $3)"
                          "  ORDER BY replica_id LIMIT 1000) s"
                          " WHERE t.stream = $1 AND t.key >= $2 ORDER BY t.key, s.replica_id"
                          " LIMIT 1000",
                          &a, &r, "defragment: source records", err)))
      break;
    rows = PQntuples(r);
    more = rows == 1000;
    for (int i = 0; i < rows && !rc; i++) {
      bs__srec rec = {0};
      bs_val rid = bs__pg_bytes(r, i, 1);
      uint32_t t = (uint32_t)bs__pg_i32(r, i, 0);
      rc = bs__pg_srec_decode(al, bs__pg_bytes(r, i, 2), bs__pg_bytes(r, i, 4), rid, &rec);
      for (uint32_t k = 0; !rc && k < rec.nm; k++) {
        size_t at;
        if (rec.m[k].op > s->horizon || !find_id(s->ids, s->n, rec.m[k].bucket, &at)) continue;
        if (pass == 1) {
          s->live[at]++;
          s->bytes[at] += sizeof(drow) + rid.size;
        } else if (s->chosen[at] && s->n_rows < s->cap_rows &&
                   s->keys_cap - s->keys_used >= rid.size) {
          drow *d = &s->rows[s->n_rows++];
          d->bucket = rec.m[k].bucket;
          d->old_op = rec.m[k].op;
          d->table = t;
          if (rid.size) memcpy(s->keys + s->keys_used, rid.data, rid.size);
          d->rid.data = s->keys + s->keys_used;
          d->rid.size = rid.size;
          s->keys_used += rid.size;
        }
      }
      bs__free(al, rec.m);
      bs__free(al, rec.lk);
      if (rc == BS_ECORRUPT)
        rc = bs__fail(err, rc, "defragment: a source record of table %u does not decode", t);
      else if (rc)
        rc = bs__fail(err, rc, "defragment: out of memory");
      if (i + 1 == rows && rid.size <= sizeof last) {
        table = bs__pg_i32(r, i, 3);
        if (rid.size) memcpy(last, rid.data, rid.size);
        after.data = last;
        after.size = rid.size;
      }
    }
    PQclear(r);
  }
  return rc;
}

static int cmp_drow(const void *x, const void *y) {
  const drow *a = x, *b = y;
  if (a->bucket != b->bucket) return a->bucket < b->bucket ? -1 : 1;
  return a->old_op < b->old_op ? -1 : a->old_op > b->old_op;
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Chooses the buckets (in id order, while their rows fit the memory limit) and collects their
 * rows, sorted by (bucket, old op), in one read snapshot. */
static int defrag_plan(const bs_compact_options *o, PGconn *c, const bs_allocator *al,
                       uint32_t stream, dscan *s, bs_error *err) {
  uint64_t budget = (uint64_t)o->memory_limit_mb * 1024u * 1024u, used = 0;
  size_t rows = 0;
  int rc;
  if (!(s->live = bs__calloc(al, s->n, sizeof *s->live)) ||
      !(s->bytes = bs__calloc(al, s->n, sizeof *s->bytes)) ||
      !(s->chosen = bs__calloc(al, s->n, 1)))
    return bs__fail(err, BS_ENOMEM, "defragment: plan");
  if ((rc = bs__pg_begin(c, 1, err))) return rc;
  rc = dscan_pass(c, al, stream, s, 1, err);
  for (size_t i = 0; i < s->n && !rc; i++) {
    bs__pg_args a = {0};
    PGresult *r;
    bs__pg_arg_i64(&a, (int64_t)s->ids[i]);
    if ((rc = bs__pg_exec(c, "SELECT count FROM bs_buckets WHERE id = $1", &a, &r,
                          "defragment: bucket state", err)))
      break;
    if (PQntuples(r) == 1 &&
        bs__compact_defrag_due(s->live[i], (uint64_t)bs__pg_i64(r, 0, 0), o->defragment_ratio) &&
        used + s->bytes[i] <= budget) {
      used += s->bytes[i];
      s->chosen[i] = 1;
      rows += s->live[i];
    }
    PQclear(r);
  }
  if (!rc && rows) {
    if (!(s->rows = bs__calloc(al, rows, sizeof *s->rows)) ||
        !(s->keys = bs__malloc(al, used ? used : 1)))
      rc = bs__fail(err, BS_ENOMEM, "defragment: %zu rows", rows);
    s->cap_rows = rows;
    s->keys_cap = used;
    if (!rc) rc = dscan_pass(c, al, stream, s, 2, err);
    if (!rc) qsort(s->rows, s->n_rows, sizeof *s->rows, cmp_drow);
  }
  bs__pg_rollback(c);
  return rc;
}

/* Re-emits rows[0..n) in one transaction of the writer's path; *emitted: how many. */
static int reemit_txn(bs__pg_writer *w, const drow *rows, size_t n, uint64_t *emitted,
                      bs_error *err) {
  static const bs_write_batch none = {NULL, 0};
  batch b;
  bs__effects fx;
  bs__pg_opset ops;
  bs_val *rids = NULL;
  uint64_t *op = NULL;
  bs__member *m = NULL;
  int rc;
  *emitted = 0;
  memset(&ops, 0, sizeof ops);
  if ((rc = batch_open(w, &none, &b, &fx, 0, err))) goto out;
  if (!(rids = bs__calloc(b.a, n, sizeof *rids)) || !(op = bs__calloc(b.a, n, sizeof *op))) {
    rc = oom(err);
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++) { /* the records, one statement per table */
    size_t k = 0;
    if (rec_find(&b, rows[i].table, rows[i].rid)) continue;
    for (size_t j = i; j < n; j++)
      if (rows[j].table == rows[i].table) rids[k++] = rows[j].rid;
    rc = load_records(&b, rows[i].table, rids, k, err);
  }
  if (rc || (rc = load_batch(&b, NULL, err))) goto out;
  for (size_t i = 0, k = 0; !rc && i < n; i++) { /* rows in (bucket, op) order */
    const drow *d = &rows[i];
    rec_ent *e = rec_find(&b, d->table, d->rid);
    bs__srec nr;
    bs_op put = {0};
    uint64_t id;
    uint32_t mi;
    if (i == 0 || d->bucket != rows[i - 1].bucket) { /* the bucket's ops of its rows */
      size_t j = i, m_ = 0;
      for (; j < n && rows[j].bucket == d->bucket; j++) op[m_++] = rows[j].old_op;
      if ((rc = bs__pg_opset_ids(w->c, b.a, &ops, d->bucket, op, m_, err))) break;
      k = 0;
    }
    while (k < ops.n && ops.ops[k].op_id < d->old_op) k++;
    if (!e || !e->r.exists || e->r.soft) continue;
    for (mi = 0; mi < e->r.nm; mi++)
      if (e->r.m[mi].bucket == d->bucket && e->r.m[mi].op == d->old_op) break;
    if (mi == e->r.nm) continue; /* the row changed since it was planned */
    if (k < ops.n) put = ops.ops[k];
    if (k == ops.n || put.op_id != d->old_op || put.type != BS_OP_PUT ||
        !bs__val_eq(put.object_type, e->r.m[mi].object_type) ||
        !bs__val_eq(put.object_id, e->r.m[mi].object_id)) {
      rc = bs__fail(err, BS_ECORRUPT,
                    "defragment: bucket %" PRIu64 ": op %" PRIu64
                    " of a source record is not its PUT",
                    d->bucket, d->old_op);
      break;
    }
    b.table = d->table; /* put keeps its checksum and payload; fx_op gives it a new id */
    if ((rc = fx_op(&b, d->bucket, &put, &id, err)) ||
        (rc = fx_superseded(&b, d->bucket, d->old_op, id, err)))
      break;
    /* the membership takes the new op: the writer's next change supersedes it */
    if (!(m = bs__calloc(b.a, e->r.nm, sizeof *m))) {
      rc = oom(err);
      break;
    }
    memcpy(m, e->r.m, e->r.nm * sizeof *m);
    m[mi].op = id;
    nr = e->r;
    nr.m = m;
    rc = fx_store(&b, d->rid, &nr, err);
    bs__free(b.a, m);
    m = NULL;
    if (!rc) ++*emitted;
  }
  if (!rc) rc = batch_write(&b, err);
out:
  bs__pg_opset_free(&ops, b.a);
  bs__free(b.a, rids);
  bs__free(b.a, op);
  bs__effects_free(&fx);
  batch_free(&b);
  return rc;
}

int bs__pg_defragment(const bs_compact_options *o, PGconn *c, bs_storage *st, uint64_t *ids,
                      size_t n, uint64_t horizon, bs_compact_stats *stats, bs_error *err) {
  bs__pg_writer w;
  const bs_allocator *al;
  dscan s;
  size_t k = 0;
  int rc;
  memset(&w, 0, sizeof w);
  w.base.st = st;
  w.db = ((bs__pg_storage *)st)->db;
  w.c = c;
  al = &w.db->base.alloc;
  qsort(ids, n, sizeof *ids, cmp_u64);
  for (size_t i = 0; i < n; i++) /* a bucket named twice is processed once */
    if (!k || ids[k - 1] != ids[i]) ids[k++] = ids[i];
  memset(&s, 0, sizeof s);
  s.ids = ids;
  s.n = k;
  s.horizon = horizon;
  rc = defrag_plan(o, c, al, st->stream_id, &s, err);
  for (size_t i = 0; !rc && i < s.n_rows; i += o->max_ops_per_txn) {
    size_t m = s.n_rows - i < o->max_ops_per_txn ? s.n_rows - i : o->max_ops_per_txn;
    uint64_t emitted = 0;
    if ((rc = bs__pg_begin_write(w.db, c, NULL, err))) break;
    rc = reemit_txn(&w, s.rows + i, m, &emitted, err);
    if (!rc) rc = bs__pg_commit(c, err);
    if (rc) {
      bs__pg_rollback(c);
      break;
    }
    stats->ops_reemitted += emitted;
    rc = bs__compact_progress(o, stats, err);
  }
  bs__free(al, s.live);
  bs__free(al, s.bytes);
  bs__free(al, s.chosen);
  bs__free(al, s.rows);
  bs__free(al, s.keys);
  return rc;
}
