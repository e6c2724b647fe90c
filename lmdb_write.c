/*
 * lmdb_write.c: everything that writes a stream of the LMDB backend. The writer (flush and
 * commit of the front's batch, truncate, its LSN calls), defragmentation's re-emission through
 * the writer's path (bs__lmdb_reemit, for lmdb_compact.c), and the lifecycle calls (clear,
 * terminate, report_error). It sits on lmdb_env.c and lmdb_wcp.c; lmdb.c sets its slots.
 */
#include "lmdb_internal.h"

#include <stdlib.h>

#define LM_BATCH_RECORDS 1000u /* source records per txn of a truncate */
/* f_begin's answer on a stream whose clear is not finished (never returned to the host) */
#define LM_CLEAR_PENDING (-1001)

static const unsigned char lm_empty[1] = {0}; /* non-NULL data for present empty values */

/* ---- Arena: each flush allocates from one (bs__arena); no malloc per op --------------------- */

/* Growable array of fixed-size items, capacity kept across flushes. */
typedef struct vec {
  void *p;
  size_t n, cap, size;
} vec;

static void *vec_push(const bs_allocator *a, vec *v) {
  if (v->n == v->cap && bs__grow(a, &v->p, &v->cap, v->n + 1, v->size)) return NULL;
  return (unsigned char *)v->p + v->size * v->n++;
}

/* ---- The writer: queue ------------------------------------------------------------------------ */

/* A pending op of one flush (its strings borrowed from the queue or the arena); written in key
 * order (bucket id, op id) at the end. */
typedef struct pop {
  struct pop *next;
  bs_op op;
} pop;

/* A bucket seen by this flush: its state is loaded once, updated in memory, written once. */
typedef struct bent {
  uint64_t id;
  bs__bucket_state st;
  unsigned char idkey[8]; /* u64be id: key of the by-id map */
  int is_new, touched;
  pop *head, *tail;
} bent;

/* The flush's copy of a source record (its value: the codec's, lmdb_internal.h). */
typedef struct srec {
  bs_val key;   /* u32be stream | u32be table | replica id */
  bs_val table; /* the table's name (f->tname when it was made), for the codec */
  int dirty, new_mark;
  bs__srec r; /* arrays in the flush arena, strings in the arena, the queue or the map copy */
} srec;

/* A parameter or superseded entry, encoded in the arena; written in key order at the end. */
typedef struct kv {
  bs_val key, val;
} kv;

/* Per-flush state; lives in the writer so that maps and arrays keep their capacity. */
typedef struct fctx {
  bs__lmdb_db *db;
  uint32_t stream;
  MDB_txn *txn;
  /* Lookup cursors of the apply phase (bs__lmdb_get), opened on first use; NULL when closed */
  MDB_cursor *src, *bst, *bnm; /* source records, bucket states, bucket names */
  bs__stream_rec rec;
  bs__arena ar;
  /* bs__val_hash of a key -> bent * by name and by id, srec * by key, ptable * by name, lkeys
   * index + 1; the caller compares the key */
  bs__htab by_name, by_id, recs, tables, lookups;
  vec bents;           /* bent * */
  vec dirty;           /* srec * */
  vec pars;            /* kv */
  vec sups;            /* kv */
  vec lkeys;           /* bs_val: lookup keys changed */
  bs__effects fx;      /* effects.c, calling back into this flush (fx_ops) */
  uint32_t tid;        /* table of the save being applied */
  bs_val tname;        /* its name (source records hold it as the first member's type) */
  bent *last_b;        /* the bucket of the last op, a one-entry cache of by_id */
  srec *last_rec;      /* the record fx_load gave last: what fx_store mostly stores again */
  const char *last_sk; /* the arena copy of the last op's subkey */
  uint64_t first_op;
  uint64_t seq_bucket;
  int seq_loaded, seq_dirty;
  int emitted;
} fctx;

typedef struct lm_writer {
  bs_writer base;
  bs__lmdb_db *db;
  const bs_write_batch *batch; /* the front's queue, during a flush or commit */
  fctx f;
} lm_writer;

static int copy_val(bs__arena *ar, bs_val *dst, bs_val src) {
  dst->size = src.size;
  if (!src.data) {
    dst->data = NULL;
    return BS_OK;
  }
  dst->data = src.size ? bs__arena_dup(ar, src.data, src.size) : lm_empty;
  return dst->data ? BS_OK : BS_ENOMEM;
}

/* ---- The writer: flush context ---------------------------------------------------------------- */

static void fctx_reset(fctx *f) {
  bs__arena_reset(&f->ar);
  bs__htab_clear(&f->by_name);
  bs__htab_clear(&f->by_id);
  bs__htab_clear(&f->recs);
  bs__htab_clear(&f->tables);
  bs__htab_clear(&f->lookups);
  f->bents.n = f->dirty.n = f->pars.n = f->sups.n = f->lkeys.n = 0;
  f->first_op = 0;
  f->seq_loaded = f->seq_dirty = f->emitted = 0;
  f->last_b = NULL;
  f->last_rec = NULL;
  f->last_sk = NULL;
  f->tname.data = NULL;
  f->tname.size = 0;
  f->txn = NULL;
  /* Not closed here: a write txn's cursors are freed by LMDB when it ends, and the read-only
   * user (lw_source_row) closes it itself. Every path that keeps the txn closes it. */
  f->src = f->bst = f->bnm = NULL;
}

/* Closes the lookup cursors while their txn is still live. */
static void f_close_src(fctx *f) {
  if (f->src) mdb_cursor_close(f->src);
  if (f->bst) mdb_cursor_close(f->bst);
  if (f->bnm) mdb_cursor_close(f->bnm);
  f->src = f->bst = f->bnm = NULL;
}

static const bs__effects_ops fx_ops;

static void fctx_init(fctx *f, bs__lmdb_db *db, uint32_t stream, int snapshot) {
  const bs_allocator *a = &db->base.alloc;
  memset(f, 0, sizeof *f);
  f->db = db;
  f->stream = stream;
  f->fx.ops = &fx_ops;
  f->fx.ctx = f;
  f->fx.alloc = a;
  f->fx.snapshot = snapshot;
  f->ar.a = a;
  f->bents.size = sizeof(bent *);
  f->dirty.size = sizeof(srec *);
  f->pars.size = f->sups.size = sizeof(kv);
  f->lkeys.size = sizeof(bs_val);
}

static void fctx_free(fctx *f) {
  const bs_allocator *a = &f->db->base.alloc;
  bs__arena_free(&f->ar);
  bs__htab_free(&f->by_name, a);
  bs__htab_free(&f->by_id, a);
  bs__htab_free(&f->recs, a);
  bs__htab_free(&f->tables, a);
  bs__htab_free(&f->lookups, a);
  bs__free(a, f->bents.p);
  bs__free(a, f->dirty.p);
  bs__free(a, f->pars.p);
  bs__free(a, f->sups.p);
  bs__free(a, f->lkeys.p);
  bs__effects_free(&f->fx);
}

/* Whether the stream's state takes a writer's call (lifecycle.c). */
static int check_live(const bs__stream_rec *r, bs_error *err) {
  bs__stream_step step;
  return bs__stream_transition(&step, r->id, r->state, BS__STREAM_WRITE, err);
}

/* Starts a unit of work of the writer on its (live) stream in txn. */
static int f_begin(fctx *f, MDB_txn *txn, bs_error *err) {
  int rc;
  fctx_reset(f);
  f->txn = txn;
  rc = bs__stream_rec_get(f->db, txn, f->stream, &f->rec, err);
  f->fx.hash = (bs_hash)f->rec.hash;
  f->fx.snapshot_done = f->rec.snapshot_done;
  if (rc == BS_OK && f->rec.clear_pending) return LM_CLEAR_PENDING;
  return rc ? rc : check_live(&f->rec, err);
}

/* Runs a unit of work of the writer. One that finds its stream's clear unfinished finishes the
 * deletion first and runs again: nothing is written among records the deletion removes. */
static int w_write(lm_writer *w, int (*fn)(MDB_txn *txn, void *payload, bs_error *err),
                   void *payload, bs_error *err) {
  int rc;
  while ((rc = bs__lmdb_write(w->db, fn, payload, err)) == LM_CLEAR_PENDING)
    if ((rc = bs__lmdb_clear_finish(w->db, w->f.stream, err)) != BS_OK) return rc;
  return rc;
}

static int oom(bs_error *err) {
  return bs__fail(err, BS_ENOMEM, "out of memory in the writer");
}

static int seq_load(fctx *f, bs_error *err) {
  MDB_val key = bs__lmdb_seq_key(), val;
  int mrc, rc;
  if (f->seq_loaded) return BS_OK;
  f->seq_bucket = 0;
  mrc = mdb_get(f->txn, f->db->meta, &key, &val);
  if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "reading seq.bucket");
  if (!mrc && (rc = bs__lmdb_bucket_id_decode(&val, &f->seq_bucket, err))) return rc;
  f->seq_loaded = 1;
  return BS_OK;
}

static int bent_add(fctx *f, bent *b, uint64_t hname, bs_error *err) {
  const bs_allocator *a = &f->db->base.alloc;
  bent **slot;
  bs__put_u64be(b->idkey, b->id);
  if (bs__htab_add(&f->by_name, a, hname, (uintptr_t)b) ||
      bs__htab_add(&f->by_id, a, bs__val_hash((bs_val){b->idkey, 8}), (uintptr_t)b) ||
      !(slot = vec_push(a, &f->bents)))
    return oom(err);
  *slot = b;
  return BS_OK;
}

static bent *bent_by_name(const fctx *f, bs_val name, uint64_t h) {
  bs__hprobe p = bs__htab_probe(&f->by_name, h);
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (bs__val_eq(((bent *)v)->st.name, name)) return (bent *)v;
  return NULL;
}

/* Loads a bucket's state by id into the flush (the bucket must exist). */
static int bucket_by_id(fctx *f, uint64_t id, bent **out, bs_error *err) {
  unsigned char k[BS_STATE_KEY_SIZE];
  MDB_val key = {sizeof k, k}, val;
  bent *b;
  int mrc;
  bs__lmdb_state_key(k, id);
  for (bs__hprobe p = bs__htab_probe(&f->by_id, bs__val_hash((bs_val){k, 8}));
       (b = (bent *)bs__htab_next(&p));)
    if (b->id == id) {
      *out = b;
      return BS_OK;
    }
  mrc = bs__lmdb_get(f->txn, f->db->bstate, &f->bst, &key, &val);
  if (mrc == MDB_NOTFOUND)
    return bs__fail(err, BS_ECORRUPT, "source record names bucket %llu, which has no state",
                    (unsigned long long)id);
  if (mrc) return bs__lmdb_fail(err, mrc, "reading a bucket state");
  if (!(b = bs__arena_alloc(&f->ar, sizeof *b))) return oom(err);
  memset(b, 0, sizeof *b);
  b->id = id;
  if (bs__bucket_state_decode(&val, &b->st))
    return bs__fail(err, BS_ECORRUPT, "bucket %llu: state does not decode", (unsigned long long)id);
  if (!(b->st.name.data = bs__arena_dup(&f->ar, b->st.name.data, b->st.name.size))) return oom(err);
  if (bent_by_name(f, b->st.name, bs__val_hash(b->st.name)))
    return bs__fail(err, BS_ECORRUPT, "bucket %llu: name maps to another id",
                    (unsigned long long)id);
  *out = b;
  return bent_add(f, b, bs__val_hash(b->st.name), err);
}

/* Resolves a bucket by name, creating it (id from seq.bucket) when unknown. */
static int bucket_by_name(fctx *f, bs_val name, bent **out, bs_error *err) {
  uint64_t h = bs__val_hash(name), id;
  bent *b;
  int rc;
  if ((b = bent_by_name(f, name, h))) {
    *out = b;
    return BS_OK;
  }
  rc = bs__lmdb_bucket_id(f->db, f->txn, &f->bnm, f->stream, name, &id, err);
  if (rc == BS_OK) return bucket_by_id(f, id, out, err);
  if (rc != BS_ENOTFOUND) return rc;
  if ((rc = seq_load(f, err)) != BS_OK) return rc;
  if (!(b = bs__arena_alloc(&f->ar, sizeof *b))) return oom(err);
  memset(b, 0, sizeof *b);
  b->id = ++f->seq_bucket;
  f->seq_dirty = 1;
  b->is_new = 1;
  b->st.stream = f->stream;
  b->st.name = name; /* queue arena: valid through the flush */
  *out = b;
  return bent_add(f, b, h, err);
}

static int next_op(fctx *f, uint64_t *id, bs_error *err) {
  if (f->rec.op_head >= (UINT64_C(1) << 63) - 1)
    return bs__fail(err, BS_ELIMIT, "op ids of stream %u exhausted", f->stream);
  *id = ++f->rec.op_head;
  if (!f->first_op) f->first_op = *id;
  f->emitted = 1;
  return BS_OK;
}

/* Appends op (a PUT or REMOVE; its strings outlive the flush) to b with the next op id. */
static int emit_op(fctx *f, bent *b, const bs_op *op, uint64_t *id_out, bs_error *err) {
  pop *o = bs__arena_alloc(&f->ar, sizeof *o);
  int rc;
  if (!o) return oom(err);
  o->next = NULL;
  o->op = *op;
  o->op.target_op = 0;
  if ((rc = next_op(f, &o->op.op_id, err)) != BS_OK) return rc;
  if (b->tail)
    b->tail->next = o;
  else
    b->head = o;
  b->tail = o;
  b->touched = 1;
  b->st.checksum = bs__cksum_add(b->st.checksum, op->checksum);
  b->st.count++;
  b->st.last_op = o->op.op_id;
  b->st.bytes += bs__lmdb_op_size(&o->op);
  *id_out = o->op.op_id;
  return BS_OK;
}

/* effects.c's superseded slot (bs__effects_ops), and defragmentation's. */
static int fx_superseded(void *ctx, uint64_t bucket, uint64_t old_op, uint64_t new_op,
                         bs_error *err) {
  fctx *f = ctx;
  unsigned char *p = bs__arena_alloc(&f->ar, BS_SUP_KEY_SIZE + BS_SUP_VALUE_SIZE);
  kv *e = p ? vec_push(&f->db->base.alloc, &f->sups) : NULL;
  if (!e) return oom(err);
  bs__lmdb_sup_key(p, bucket, old_op);
  bs__lmdb_sup_value(p + BS_SUP_KEY_SIZE, new_op);
  e->key = (bs_val){p, BS_SUP_KEY_SIZE};
  e->val = (bs_val){p + BS_SUP_KEY_SIZE, BS_SUP_VALUE_SIZE};
  return BS_OK;
}

/* Remembers a changed lookup key for the flush's change record (deduplicated). */
static int note_lookup(fctx *f, bs_val key, bs_error *err) {
  uint64_t h = bs__val_hash(key);
  bs__hprobe p = bs__htab_probe(&f->lookups, h);
  bs_val *slot;
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (bs__val_eq(((const bs_val *)f->lkeys.p)[v - 1], key)) return BS_OK;
  if (bs__htab_add(&f->lookups, &f->db->base.alloc, h, f->lkeys.n + 1) ||
      !(slot = vec_push(&f->db->base.alloc, &f->lkeys)))
    return oom(err);
  *slot = key;
  return BS_OK;
}

/* effects.c's param slot: appends an entry of table f->tid (n_params = 0 and params NULL: a
 * tombstone). */
static int fx_param(void *ctx, bs_val lkey, bs_val rid, const bs_val *params, size_t n_params,
                    bs_error *err) {
  fctx *f = ctx;
  unsigned char kb[BS_PARAM_KEY_MAX], *k, *v;
  size_t ks, vs = bs__lmdb_param_value_size(rid, params, n_params);
  uint64_t id = 0;
  kv *e;
  int rc;
  if ((rc = next_op(f, &id, err)) != BS_OK) return rc;
  ks = bs__lmdb_param_key(kb, f->stream, lkey, f->tid, rid, id);
  if (!(k = bs__arena_alloc(&f->ar, ks)) || !(v = bs__arena_alloc(&f->ar, vs))) return oom(err);
  memcpy(k, kb, ks);
  bs__lmdb_param_value(v, rid, params, n_params);
  if (!(e = vec_push(&f->db->base.alloc, &f->pars))) return oom(err);
  e->key = (bs_val){k, ks};
  e->val = (bs_val){v, vs};
  return note_lookup(f, lkey, err);
}

/* ---- Tables and source records ---------------------------------------------------------------- */

/* A table the flush has resolved: its name (borrowed from the queue) and id. */
typedef struct ptable {
  bs_val name;
  uint32_t id;
} ptable;

static int table_id(fctx *f, bs_val name, int create, uint32_t *out, bs_error *err) {
  unsigned char k[BS_TABLE_KEY_MAX];
  MDB_val key, val;
  uint64_t h = bs__val_hash(name);
  bs__hprobe p = bs__htab_probe(&f->tables, h);
  ptable *t;
  int mrc, rc;
  while ((t = (ptable *)bs__htab_next(&p)))
    if (bs__val_eq(t->name, name)) {
      *out = t->id;
      return BS_OK;
    }
  if ((rc = bs__lmdb_table_key(k, f->stream, name, &key, err))) return rc;
  mrc = mdb_get(f->txn, f->db->tables, &key, &val);
  if (mrc == 0) {
    if ((rc = bs__lmdb_table_id_decode(&val, out, err))) return rc;
  } else if (mrc != MDB_NOTFOUND) {
    return bs__lmdb_fail(err, mrc, "looking up a table");
  } else if (!create) {
    return BS_ENOTFOUND;
  } else {
    unsigned char v[4];
    if (f->rec.next_table_id == 0) f->rec.next_table_id = 1;
    *out = f->rec.next_table_id++;
    bs__lmdb_table_value(v, *out);
    val.mv_size = 4;
    val.mv_data = v;
    if ((mrc = mdb_put(f->txn, f->db->tables, &key, &val, 0)) != 0)
      return bs__lmdb_fail(err, mrc, "registering a table");
  }
  if (!(t = bs__arena_alloc(&f->ar, sizeof *t))) return oom(err);
  t->name = name;
  t->id = *out;
  return bs__htab_add(&f->tables, &f->db->base.alloc, h, (uintptr_t)t) ? oom(err) : BS_OK;
}

/* Decodes a source value of table f->tname into r, on an arena copy (this txn's writes may move
 * the map's). */
static int srec_decode(fctx *f, srec *r, const MDB_val *val, bs_error *err) {
  MDB_val copy = {val->mv_size, bs__arena_dup(&f->ar, val->mv_data, val->mv_size)};
  bs__member *m = NULL;
  bs_val *lk = NULL;
  if (!copy.mv_data) return oom(err);
  if (bs__lmdb_srec_head(&copy, &r->r) != BS_OK) goto bad;
  if ((r->r.nm && !(m = bs__arena_alloc(&f->ar, r->r.nm * sizeof *m))) ||
      (r->r.nl && !(lk = bs__arena_alloc(&f->ar, r->r.nl * sizeof *lk))))
    return oom(err);
  if (bs__lmdb_srec_decode(&copy, f->tname, bs__lmdb_source_rid(r->key), &r->r, m, lk) == BS_OK)
    return BS_OK;
bad:
  return bs__fail(err, BS_ECORRUPT, "source record of %zu bytes does not decode", val->mv_size);
}

/* A record of the flush for key (copied behind it), not in the map and not read yet. */
static srec *srec_new(fctx *f, const void *key, size_t n) {
  srec *r = bs__arena_alloc(&f->ar, sizeof *r + n);
  if (!r) return NULL;
  memset(r, 0, sizeof *r);
  r->key.data = memcpy(r + 1, key, n);
  r->key.size = n;
  r->table = f->tname;
  return r;
}

static int mark_dirty(fctx *f, srec *r, bs_error *err) {
  srec **slot;
  if (r->dirty) return BS_OK;
  if (!(slot = vec_push(&f->db->base.alloc, &f->dirty))) return oom(err);
  *slot = r;
  r->dirty = 1;
  return BS_OK;
}

/* The flush's copy of a source record; read_db = 0 skips the LMDB read (a record about to be
 * overwritten), but an earlier save of this flush is still seen. */
static int rec_load(fctx *f, uint32_t tid, bs_val rid, int read_db, srec **out, bs_error *err) {
  unsigned char kbuf[BS_SOURCE_KEY_MAX];
  MDB_val key = {bs__lmdb_source_key(kbuf, f->stream, tid, rid), kbuf}, val;
  uint64_t h = bs__val_hash((bs_val){kbuf, key.mv_size});
  srec *r;
  int mrc, rc;
  for (bs__hprobe p = bs__htab_probe(&f->recs, h); (r = (srec *)bs__htab_next(&p));)
    if (r->key.size == key.mv_size && memcmp(r->key.data, kbuf, key.mv_size) == 0) {
      *out = r;
      return BS_OK;
    }
  if (!(r = srec_new(f, kbuf, key.mv_size))) return oom(err);
  if (read_db) {
    mrc = bs__lmdb_get(f->txn, f->db->source, &f->src, &key, &val);
    if (mrc == 0) {
      if ((rc = srec_decode(f, r, &val, err)) != BS_OK) return rc;
    } else if (mrc != MDB_NOTFOUND) {
      return bs__lmdb_fail(err, mrc, "reading a source record");
    }
  }
  if (bs__htab_add(&f->recs, &f->db->base.alloc, h, (uintptr_t)r)) return oom(err);
  *out = r;
  return BS_OK;
}

/* ---- The flush's side of effects.c (internal.h, bs__effects_ops): a bucket's handle is its id */

static int fx_load(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  fctx *f = ctx;
  srec *r;
  int rc = rec_load(f, f->tid, rid, 1, &r, err);
  if (rc == BS_OK) *out = &(f->last_rec = r)->r;
  return rc;
}

static int fx_bucket(void *ctx, bs_val name, uint64_t *id, bs_error *err) {
  fctx *f = ctx;
  int rc = bucket_by_name(f, name, &f->last_b, err);
  if (rc == BS_OK) *id = f->last_b->id;
  return rc;
}

/* The subkey of a save's ops, copied into the arena once (pops keep a pointer to it). */
static const char *keep_subkey(fctx *f, bs_val sk) {
  char *p;
  if (f->last_sk && memcmp(f->last_sk, sk.data, BS_SUBKEY_SIZE) == 0) return f->last_sk;
  if ((p = bs__arena_dup(&f->ar, sk.data, BS_SUBKEY_SIZE))) f->last_sk = p;
  return p;
}

static int fx_op(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *id, bs_error *err) {
  fctx *f = ctx;
  bs_op kept = *op;
  int rc;
  if ((!f->last_b || f->last_b->id != bucket) &&
      (rc = bucket_by_id(f, bucket, &f->last_b, err)) != BS_OK)
    return rc;
  if (!(kept.subkey.data = keep_subkey(f, op->subkey))) return oom(err);
  return emit_op(f, f->last_b, &kept, id, err);
}

static int fx_store(void *ctx, bs_val rid, const bs__srec *rec, bs_error *err) {
  fctx *f = ctx;
  unsigned char kb[BS_SOURCE_KEY_MAX];
  bs_val key = {kb, bs__lmdb_source_key(kb, f->stream, f->tid, rid)};
  srec *r = f->last_rec;
  int rc;
  if ((!r || !bs__val_eq(r->key, key)) && (rc = rec_load(f, f->tid, rid, 0, &r, err)) != BS_OK)
    return rc;
  r->r = *rec;
  r->r.m = rec->nm ? bs__arena_dup(&f->ar, rec->m, rec->nm * sizeof *rec->m) : NULL;
  r->r.lk = rec->nl ? bs__arena_dup(&f->ar, rec->lk, rec->nl * sizeof *rec->lk) : NULL;
  if ((rec->nm && !r->r.m) || (rec->nl && !r->r.lk)) return oom(err);
  r->new_mark = rec->soft; /* effects.c stores a soft-deleted record only when it is new */
  return mark_dirty(f, r, err);
}

static uint64_t fx_op_head(void *ctx) {
  return ((fctx *)ctx)->rec.op_head;
}

static const bs__effects_ops fx_ops = {fx_load,  fx_bucket, fx_op,     fx_superseded,
                                       fx_param, fx_store,  fx_op_head};

/* ---- Flush write-out: everything in key order, each bucket state once ------------------------- */

static int cmp_bent(const void *a, const void *b) {
  uint64_t x = (*(bent *const *)a)->id, y = (*(bent *const *)b)->id;
  return x < y ? -1 : x > y;
}
static int cmp_srec(const void *a, const void *b) {
  const srec *x = *(srec *const *)a, *y = *(srec *const *)b;
  return bs__val_cmp(x->key, y->key);
}
static int cmp_kv(const void *a, const void *b) {
  return bs__val_cmp(((const kv *)a)->key, ((const kv *)b)->key);
}

/* Sorts unless already sorted: flushes often arrive in key order (snapshots by primary key). */
static void sort_if_needed(void *base, size_t n, size_t size,
                           int (*cmp)(const void *, const void *)) {
  const unsigned char *p = base;
  size_t i;
  for (i = 1; i < n; i++)
    if (cmp(p + (i - 1) * size, p + i * size) > 0) break;
  if (i < n) qsort(base, n, size, cmp);
}

/* A cursor for keys written in rising order: once they are past the last key the database had
 * (copied into last; nlast 0 when it was empty, SIZE_MAX when too long to keep: nothing
 * appends) they go in with MDB_APPEND, which skips the search for the slot and splits a full
 * page by starting a new one instead of moving half of it. */
typedef struct appender {
  MDB_cursor *cur;
  unsigned char last[BS_SOURCE_KEY_MAX];
  size_t nlast;
  unsigned app;
} appender;

static int app_open(fctx *f, MDB_dbi dbi, appender *ap, bs_error *err) {
  MDB_val key, val;
  int mrc;
  ap->nlast = ap->app = 0;
  if ((mrc = mdb_cursor_open(f->txn, dbi, &ap->cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  if ((mrc = mdb_cursor_get(ap->cur, &key, &val, MDB_LAST)) == 0) {
    ap->nlast = key.mv_size > sizeof ap->last ? SIZE_MAX : key.mv_size;
    if (ap->nlast != SIZE_MAX) memcpy(ap->last, key.mv_data, key.mv_size);
  } else if (mrc != MDB_NOTFOUND) {
    mdb_cursor_close(ap->cur);
    return bs__lmdb_fail(err, mrc, "reading the last key");
  }
  return BS_OK;
}

/* MDB_APPEND once key is past the last key, else 0. */
static inline unsigned app_flag(appender *ap, const MDB_val *key) {
  bs_val k = {key->mv_data, key->mv_size}, last = {ap->last, ap->nlast};
  if (!ap->app && ap->nlast != SIZE_MAX && (!ap->nlast || bs__val_cmp(k, last) > 0))
    ap->app = MDB_APPEND;
  return ap->app;
}

/* The next op of a bucket's list (bs__lmdb_opw_put's iterator: it is the pop to hand out). */
static const bs_op *next_pop(void *it) {
  pop **o = it, *cur = *o;
  if (!cur) return NULL;
  *o = cur->next;
  return &cur->op;
}

static int put_ops(fctx *f, bs_error *err) {
  bent **bl = f->bents.p;
  bs__lmdb_opw w;
  int rc = bs__lmdb_opw_open(&w, f->db, f->txn, err);
  /* buckets sorted by id, each bucket's ops by rising id */
  for (size_t i = 0; i < f->bents.n && rc == BS_OK; i++) {
    pop *o = bl[i]->head;
    if (o) rc = bs__lmdb_opw_put(&w, bl[i]->id, next_pop, &o, err);
  }
  bs__lmdb_opw_close(&w);
  return rc;
}

static int put_buckets(fctx *f, bs_error *err) {
  bent **bl = f->bents.p;
  appender ap;
  /* States in id order through one cursor (the bents are sorted): neighbouring ids share a
   * page, so each put is a compare or two instead of a descent from the root; new buckets
   * have the highest ids and append. */
  int mrc = app_open(f, f->db->bstate, &ap, err);
  if (mrc) return mrc;
  for (size_t i = 0; i < f->bents.n && !mrc; i++) {
    bent *b = bl[i];
    unsigned char k[BS_STATE_KEY_SIZE];
    MDB_val key = {sizeof k, k}, val;
    if (!b->touched) continue;
    BS_ASSERT(b->st.name.size <= BS_MAX_BUCKET_NAME); /* a checked or a stored name */
    bs__lmdb_state_key(k, b->id);
    val.mv_size = bs__bucket_state_size(&b->st);
    if ((mrc = mdb_cursor_put(ap.cur, &key, &val, MDB_RESERVE | app_flag(&ap, &key))) == 0)
      bs__bucket_state_encode(val.mv_data, &b->st);
  }
  mdb_cursor_close(ap.cur);
  if (mrc) return bs__lmdb_fail(err, mrc, "writing a bucket state");
  for (size_t i = 0; i < f->bents.n; i++) {
    unsigned char k[BS_BUCKET_KEY_MAX], v[8];
    MDB_val key, val = {8, v};
    int rc;
    if (!bl[i]->is_new) continue;
    if ((rc = bs__lmdb_bucket_key(k, f->stream, bl[i]->st.name, &key, err))) return rc;
    bs__lmdb_bucket_value(v, bl[i]->id);
    if ((mrc = mdb_put(f->txn, f->db->buckets, &key, &val, 0)) != 0)
      return bs__lmdb_fail(err, mrc, "registering a bucket");
  }
  if (f->seq_dirty) {
    unsigned char v[8];
    MDB_val key = bs__lmdb_seq_key(), val = {8, v};
    bs__lmdb_bucket_value(v, f->seq_bucket);
    if ((mrc = mdb_put(f->txn, f->db->meta, &key, &val, 0)) != 0)
      return bs__lmdb_fail(err, mrc, "writing seq.bucket");
  }
  return BS_OK;
}

/* The parameter or (sup) superseded entries v, each bucket of the latter queued for compaction
 * once (sorted: a bucket's entries are one run, and the key starts with its id). */
static int put_kvs(fctx *f, vec *v, int sup, bs_error *err) {
  kv *e = v->p;
  MDB_cursor *cur;
  int mrc = 0;
  if (!v->n) return BS_OK;
  sort_if_needed(e, v->n, sizeof *e, cmp_kv);
  if ((mrc = mdb_cursor_open(f->txn, sup ? f->db->superseded : f->db->params, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  for (size_t i = 0; i < v->n && !mrc; i++) {
    MDB_val key = {e[i].key.size, (void *)e[i].key.data};
    MDB_val val = {e[i].val.size, (void *)e[i].val.data};
    if ((mrc = mdb_cursor_put(cur, &key, &val, 0)) == 0 && sup &&
        (!i || memcmp(e[i - 1].key.data, key.mv_data, 8) != 0)) {
      unsigned char qk[BS_CQUEUE_KEY_SIZE];
      MDB_val qkey = {sizeof qk, qk}, qval = {0, (void *)lm_empty};
      bs__lmdb_cqueue_key(qk, f->stream, bs__get_u64be(key.mv_data));
      mrc = mdb_put(f->txn, f->db->cqueue, &qkey, &qval, 0);
    }
  }
  mdb_cursor_close(cur);
  return mrc ? bs__lmdb_fail(err, mrc, "writing a parameter, superseded or cqueue entry") : BS_OK;
}

static int put_recs(fctx *f, bs_error *err) {
  srec **d = f->dirty.p;
  appender ap;
  int mrc;
  sort_if_needed(d, f->dirty.n, f->dirty.size, cmp_srec); /* srec pointers */
  if ((mrc = app_open(f, f->db->source, &ap, err))) return mrc;
  for (size_t i = 0; i < f->dirty.n && !mrc; i++) {
    srec *r = d[i];
    MDB_val key = {r->key.size, (void *)r->key.data}, val;
    unsigned app = app_flag(&ap, &key);
    if (!r->r.exists) { /* deleted (past the end: not stored, nothing to delete) */
      if (!app && (mrc = mdb_cursor_get(ap.cur, &key, &val, MDB_SET)) == 0)
        mrc = mdb_cursor_del(ap.cur, 0);
      if (mrc == MDB_NOTFOUND) mrc = 0;
      continue;
    }
    val.mv_size = bs__lmdb_srec_size(&r->r, r->table, bs__lmdb_source_rid(r->key));
    /* A cursor keeps its position: sorted puts mostly land on the page it is already on. */
    if ((mrc = mdb_cursor_put(ap.cur, &key, &val, MDB_RESERVE | app)) != 0) break;
    bs__lmdb_srec_encode(val.mv_data, &r->r, r->table, bs__lmdb_source_rid(r->key));
    if (r->r.soft && r->new_mark) { /* a new soft delete: indexed for its purge */
      unsigned char k[BS_SOFTDEL_KEY_MAX];
      MDB_val skey = {bs__lmdb_softdel_key(k, r->r.mark, r->key), k};
      MDB_val sval = {0, (void *)lm_empty};
      mrc = mdb_put(f->txn, f->db->softdel, &skey, &sval, 0);
    }
  }
  mdb_cursor_close(ap.cur);
  return mrc ? bs__lmdb_fail(err, mrc, "writing a source record or its softdel entry") : BS_OK;
}

/* Appends a change record (the codec: bs__lmdb_change_head, lmdb_internal.h). */
static int put_change(fctx *f, uint64_t first, uint64_t last, unsigned flags, const bs_val *users,
                      size_t n_users, bs_error *err) {
  bent **bl = f->bents.p;
  const bs_val *lk = f->lkeys.p;
  size_t nb = 0, nl = f->lkeys.n, bb = 0, lb = 0, ub = 0;
  unsigned char k[BS_CHANGE_KEY_SIZE], *p;
  MDB_val key = {sizeof k, k}, val;
  int mrc;
  for (size_t i = 0; i < f->bents.n; i++)
    if (bl[i]->head) {
      nb++;
      bb += bl[i]->st.name.size;
    }
  if (bs__changes_too_many(nb)) {
    flags |= BS_CHANGE_TOO_MANY_BUCKETS;
    nb = bb = 0;
  }
  if (bs__changes_too_many(nl)) {
    flags |= BS_CHANGE_TOO_MANY_LOOKUPS;
    nl = 0;
  }
  for (size_t i = 0; i < nl; i++) lb += lk[i].size;
  for (size_t i = 0; i < n_users; i++) ub += users[i].size;
  bs__lmdb_change_key(k, f->stream, last, ++f->rec.change_seq);
  val.mv_size = BS_CHANGE_FIXED + bs__lmdb_change_list_size(nb, bb) +
                bs__lmdb_change_list_size(nl, lb) + bs__lmdb_change_list_size(n_users, ub);
  if ((mrc = mdb_put(f->txn, f->db->changes, &key, &val, MDB_RESERVE)) != 0)
    return bs__lmdb_fail(err, mrc, "writing a change record");
  p = bs__lmdb_change_head(val.mv_data, first, bs__now_ms(), flags);
  p = bs__lmdb_change_count(p, (uint32_t)nb);
  for (size_t i = 0; nb && i < f->bents.n; i++)
    if (bl[i]->head) p = bs__lmdb_change_item(p, bl[i]->st.name);
  p = bs__lmdb_change_count(p, (uint32_t)nl);
  for (size_t i = 0; i < nl; i++) p = bs__lmdb_change_item(p, lk[i]);
  p = bs__lmdb_change_count(p, (uint32_t)n_users);
  for (size_t i = 0; i < n_users; i++) p = bs__lmdb_change_item(p, users[i]);
  return BS_OK;
}

/* Writes everything the flush context accumulated, then the stream record. */
static int f_finish(fctx *f, const bs_val *users, size_t n_users, bs_error *err) {
  int rc;
  sort_if_needed(f->bents.p, f->bents.n, sizeof(bent *), cmp_bent);
  if ((rc = put_ops(f, err)) || (rc = put_buckets(f, err)) || (rc = put_kvs(f, &f->sups, 1, err)) ||
      (rc = put_kvs(f, &f->pars, 0, err)) || (rc = put_recs(f, err)))
    return rc;
  if (f->emitted || n_users) {
    uint64_t first = f->first_op ? f->first_op : f->rec.op_head + 1;
    if ((rc = put_change(f, first, f->rec.op_head, 0, users, n_users, err)) != BS_OK) return rc;
  }
  return bs__stream_rec_put(f->db, f->txn, &f->rec, err);
}

/* ---- Defragmentation (lmdb_compact.c): live PUTs re-emitted through the writer's path ---------
 *
 * A re-emitted PUT is an op like any the writer makes: its id comes from the stream's op_head in
 * this transaction, the bucket state takes its checksum, count and bytes, the flush's change
 * record names the bucket, and (old -> new) goes to `superseded` with the bucket queued, so the
 * next compaction whose horizon covers the new op moves the old one and folds the history.
 * The row's source record is the authority on what is live: a row is re-emitted only when the
 * record still has a membership in that bucket whose op is old_op (so no later op of the row
 * exists, at any op id), and that membership then takes the new op, so that the writer's next
 * change of the row supersedes the new op, not the old one. */

/* Makes tid the table of f (f->tid, and f->tname its name, copied into the arena): re-emission's
 * rows come in key order, so mostly one lookup a table. */
static int table_by_id(fctx *f, uint32_t tid, bs_error *err) {
  bs_val name;
  int rc;
  if (f->tid == tid && f->tname.data) return BS_OK;
  rc = bs__lmdb_table_name(f->db, f->txn, f->stream, tid, &name, err);
  if (rc == BS_ENOTFOUND)
    return bs__fail(err, BS_ECORRUPT, "stream %u: a source record of table %u, which has no name",
                    f->stream, tid);
  if (rc != BS_OK) return rc;
  if (copy_val(&f->ar, &f->tname, name)) return oom(err);
  f->tid = tid;
  return BS_OK;
}

/* One row: re-emits it unless its record says it changed since (then *done stays 0). */
static int reemit_one(fctx *f, const bs__lmdb_reemit_row *row, int *done, bs_error *err) {
  bs__lmdb_opc oc;
  bs_val rid;
  uint32_t tid;
  char *sk;
  bs__member *m = NULL;
  bent *b;
  srec *r;
  bs_op op;
  uint64_t id;
  int found, rc;
  *done = 0;
  MDB_val src = {row->src_key_size, (void *)row->src_key};
  uint32_t stream;
  if (bs__lmdb_source_key_decode(&src, &stream, &tid, &rid) || stream != f->stream)
    return bs__fail(err, BS_EINVAL, "defragment: not a source key of stream %u", f->stream);
  if ((rc = table_by_id(f, tid, err)) != BS_OK || (rc = rec_load(f, tid, rid, 1, &r, err)) != BS_OK)
    return rc;
  if (!r->r.exists || r->r.soft) return BS_OK;
  for (uint32_t i = 0; i < r->r.nm && !m; i++)
    if (r->r.m[i].bucket == row->bucket && r->r.m[i].op == row->old_op) m = &r->r.m[i];
  if (!m) return BS_OK; /* the row changed since it was planned */
  if ((rc = bs__lmdb_opc_open(&oc, f->db, f->txn, err)) != BS_OK) return rc;
  rc = bs__lmdb_opc_get(&oc, row->bucket, row->old_op, &op, &found, err);
  bs__lmdb_opc_close(&oc); /* op stays valid: nothing was written since */
  if (rc != BS_OK) return rc;
  if (!found)
    return bs__fail(err, BS_ECORRUPT, "bucket %llu: op %llu of a source record is missing",
                    (unsigned long long)row->bucket, (unsigned long long)row->old_op);
  if (op.type != BS_OP_PUT || op.subkey.size != BS_SUBKEY_SIZE ||
      !bs__val_eq(op.object_type, m->object_type) || !bs__val_eq(op.object_id, m->object_id))
    return bs__fail(err, BS_ECORRUPT, "bucket %llu: op %llu is not its source record's PUT",
                    (unsigned long long)row->bucket, (unsigned long long)row->old_op);
  if (!(sk = bs__arena_alloc(&f->ar, BS_SUBKEY_SIZE))) return oom(err);
  bs_subkey(sk, tid, rid);
  if (memcmp(sk, op.subkey.data, BS_SUBKEY_SIZE) != 0)
    return bs__fail(err, BS_ECORRUPT, "bucket %llu: op %llu has another row's subkey",
                    (unsigned long long)row->bucket, (unsigned long long)row->old_op);
  /* copies: the op's value is in the map, and this transaction's writes may move it */
  op.subkey.data = sk;
  if (copy_val(&f->ar, &op.object_type, op.object_type) ||
      copy_val(&f->ar, &op.object_id, op.object_id) || copy_val(&f->ar, &op.data, op.data))
    return oom(err);
  if ((rc = bucket_by_id(f, row->bucket, &b, err)) != BS_OK) return rc;
  if ((rc = emit_op(f, b, &op, &id, err)) != BS_OK) return rc;
  if ((rc = fx_superseded(f, b->id, row->old_op, id, err)) != BS_OK) return rc;
  m->op = id;
  *done = 1;
  return mark_dirty(f, r, err);
}

int bs__lmdb_reemit(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, const bs__lmdb_reemit_row *rows,
                    size_t n, uint64_t *emitted_out, bs_error *err) {
  fctx f;
  uint64_t emitted = 0;
  int rc;
  *emitted_out = 0;
  fctx_init(&f, db, stream, 0);
  rc = f_begin(&f, txn, err);
  for (size_t i = 0; i < n && rc == BS_OK; i++) {
    int done;
    rc = reemit_one(&f, &rows[i], &done, err);
    emitted += (uint64_t)done;
  }
  f_close_src(&f);
  if (rc == BS_OK && emitted) rc = f_finish(&f, NULL, 0, err);
  if (rc == LM_CLEAR_PENDING) rc = BS_OK; /* cleared since compaction began: nothing to emit */
  if (rc == BS_OK) *emitted_out = emitted;
  fctx_free(&f);
  return rc;
}

/* ---- Flush ------------------------------------------------------------------------------------ */

/* Applies the whole queue inside txn (the flush's unit of work; commit reuses it). */
static int flush_work(lm_writer *w, MDB_txn *txn, bs_error *err) {
  fctx *f = &w->f;
  bs_val *users = NULL;
  size_t nu = 0;
  int rc;
  if ((rc = f_begin(f, txn, err)) != BS_OK) return rc;
  for (size_t i = 0; i < w->batch->n && rc == BS_OK; i++) {
    const bs_save *s = w->batch->items[i].save; /* contract.md 4.1 - 4.3: effects.c */
    if (s && (rc = table_id(f, s->table, 1, &f->tid, err)) == BS_OK) {
      f->tname = s->table;
      rc = bs__effects_save(&f->fx, f->tid, s, err);
    }
  }
  f_close_src(f);
  if (rc != BS_OK) return rc;
  /* the saves' ops first, then the write checkpoints (what they acknowledge is flushed) */
  for (size_t i = 0; i < w->batch->n; i++) {
    const bs_queued_wcp *c = w->batch->items[i].wcp;
    if (!c) continue;
    if ((rc = bs__lmdb_wcp_put_custom(f->db, txn, f->stream, c->event, c->user_id, c->checkpoint,
                                      c->requested_at_ms, err)))
      return rc;
    nu++;
  }
  if (nu) {
    size_t k = 0;
    if (!(users = bs__arena_alloc(&f->ar, nu * sizeof *users))) return oom(err);
    for (size_t i = 0; i < w->batch->n; i++)
      if (w->batch->items[i].wcp) users[k++] = w->batch->items[i].wcp->user_id;
  }
  return f_finish(f, users, nu, err);
}

static int flush_txn(MDB_txn *txn, void *payload, bs_error *err) {
  return flush_work(payload, txn, err);
}

/* Applies batch in one write transaction (nothing when it is empty). */
static int w_flush(lm_writer *w, const bs_write_batch *batch, bs_error *err) {
  int rc;
  if (!batch->n) return BS_OK;
  w->batch = batch;
  rc = w_write(w, flush_txn, w, err);
  w->batch = NULL;
  fctx_reset(&w->f);
  return rc;
}

static int lw_flush(uint64_t *last_op_out, bs_writer *base, const bs_write_batch *batch,
                    bs_error *err) {
  lm_writer *w = (lm_writer *)base;
  MDB_txn *txn;
  bs__stream_rec rec;
  int rc;
  if ((rc = w_flush(w, batch, err)) != BS_OK) return rc;
  if (batch->n) { /* the flush's txn just committed this head */
    *last_op_out = w->f.rec.op_head;
    return BS_OK;
  }
  /* an empty flush writes nothing, but is refused on a terminated stream like any other */
  if ((rc = bs__lmdb_txn_begin(w->db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  if ((rc = bs__stream_rec_get(w->db, txn, w->f.stream, &rec, err)) == BS_OK &&
      (rc = check_live(&rec, err)) == BS_OK)
    *last_op_out = rec.op_head;
  bs__lmdb_txn_abort(w->db, txn);
  return rc;
}

/* ---- Commit ------------------------------------------------------------------------------------ */

typedef struct commit_ctx {
  lm_writer *w;
  bs_val lsn;
  int create_empty;
  bs_block_reason blocked;
  int created;
  uint64_t checkpoint;
  vec users; /* bs_val, copied into the flush arena */
} commit_ctx;

static int collect_user(bs_val user, void *payload) {
  commit_ctx *c = payload;
  fctx *f = &c->w->f;
  bs_val *slot = vec_push(&f->db->base.alloc, &c->users);
  return slot ? copy_val(&f->ar, slot, user) : BS_ENOMEM;
}

/* Deletes the soft-deleted records whose mark is at or below purge_to (bs__plan_commit_row). */
static int purge_softdel(fctx *f, uint64_t purge_to, bs_error *err) {
  MDB_cursor *cur;
  unsigned char pk[BS_STREAM_PREFIX_SIZE];
  MDB_val key, val;
  int mrc, rc = BS_OK;
  bs__lmdb_stream_prefix(pk, f->stream);
  if ((mrc = mdb_cursor_open(f->txn, f->db->softdel, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  /* Re-seek after each delete: MDB_GET_CURRENT after deleting the last key is EINVAL. */
  for (;;) {
    unsigned char sk[BS_SOFTDEL_KEY_MAX - 8];
    MDB_val skey, sval;
    uint32_t stream;
    uint64_t mark;
    key.mv_size = sizeof pk;
    key.mv_data = pk;
    if ((mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)) != 0) break;
    bs__srec head;
    if (!bs__lmdb_in_stream(&key, f->stream)) break;
    if (bs__lmdb_softdel_decode(&key, &val, &stream, &mark, sk, &skey)) {
      rc = bs__fail(err, BS_ECORRUPT, "stream %u: a softdel entry of %zu bytes does not decode",
                    f->stream, key.mv_size);
      break;
    }
    if (mark > purge_to) break;
    mrc = mdb_get(f->txn, f->db->source, &skey, &sval);
    if (mrc == 0 && bs__lmdb_srec_head(&sval, &head) == BS_OK && head.soft && head.mark == mark)
      mrc = mdb_del(f->txn, f->db->source, &skey, NULL);
    else if (mrc == MDB_NOTFOUND || mrc == 0)
      mrc = 0; /* stale entry: the row was re-inserted or deleted since */
    if (mrc) break;
    if ((mrc = mdb_cursor_del(cur, 0)) != 0) break;
  }
  if (!rc && mrc && mrc != MDB_NOTFOUND)
    rc = bs__lmdb_fail(err, mrc, "purging soft-deleted records");
  mdb_cursor_close(cur);
  return rc;
}

/* The record's fields as lifecycle.c's row (internal.h bs__stream_row), and back: a commit, the
 * LSN calls, a clear and a terminate are planned and applied to the row there, and the record
 * stores what comes back. */
static bs__stream_row rec_row(const bs__stream_rec *r) {
  bs__stream_row w = {.state = r->state,
                      .snapshot_done = r->snapshot_done,
                      .op_head = r->op_head,
                      .checkpoint = r->checkpoint,
                      .last_checkpoint_op = r->last_checkpoint_op,
                      .param_horizon = r->param_horizon,
                      .param_cursor = r->param_cursor,
                      .compact_horizon = r->compact_horizon,
                      .changes_fence = r->changes_fence};
  if (r->has_checkpoint_lsn) w.checkpoint_lsn = r->checkpoint_lsn;
  if (r->has_resume_lsn) w.resume_lsn = r->resume_lsn;
  if (r->has_no_checkpoint_before) w.no_checkpoint_before = r->no_checkpoint_before;
  return w;
}

static void row_rec(bs__stream_rec *r, const bs__stream_row *w) {
  r->state = (uint8_t)w->state;
  r->snapshot_done = (uint8_t)w->snapshot_done;
  r->op_head = w->op_head;
  r->checkpoint = w->checkpoint;
  r->last_checkpoint_op = w->last_checkpoint_op;
  r->param_horizon = w->param_horizon;
  r->param_cursor = w->param_cursor;
  r->compact_horizon = w->compact_horizon;
  r->changes_fence = w->changes_fence;
  r->has_checkpoint_lsn = w->checkpoint_lsn.data != NULL;
  r->checkpoint_lsn = w->checkpoint_lsn;
  r->has_resume_lsn = w->resume_lsn.data != NULL;
  r->resume_lsn = w->resume_lsn;
  r->has_no_checkpoint_before = w->no_checkpoint_before.data != NULL;
  r->no_checkpoint_before = w->no_checkpoint_before;
}

static int commit_txn(MDB_txn *txn, void *payload, bs_error *err) {
  commit_ctx *c = payload;
  fctx *f = &c->w->f;
  bs__stream_rec *r = &f->rec;
  bs__commit_plan p;
  bs__stream_row row;
  int rc;
  c->users.n = 0;
  c->blocked = BS_BLOCKED_NONE;
  c->created = 0;
  /* The queue is flushed in the commit's own txn: one commit (one fsync pair) instead of two,
   * with the same result as flush-then-commit. */
  if (c->w->batch->n && (rc = flush_work(c->w, txn, err)) != BS_OK) return rc;
  if ((rc = f_begin(f, txn, err)) != BS_OK) return rc;
  /* whether it checkpoints, the resume LSN, the checkpoint's fields and the state: lifecycle.c */
  row = rec_row(r);
  if ((rc = bs__plan_commit_row(&p, r->id, &row, c->lsn, c->create_empty, err)) != BS_OK) return rc;
  bs__commit_row(&row, &p, c->lsn);
  row_rec(r, &row);
  c->blocked = p.blocked;
  c->checkpoint = r->checkpoint;
  if (!p.checkpoint) return bs__stream_rec_put(f->db, txn, r, err);
  c->created = 1;
  if (p.step.others_change &&
      (rc = bs__lmdb_streams_map(f->db, txn, f->stream, p.step.others, NULL, err)))
    return rc;
  rc = bs__lmdb_wcp_mark_processed(f->db, txn, c->lsn, collect_user, c, err);
  if (rc == BS_ENOMEM) return oom(err);
  if (rc != BS_OK) return rc;
  if ((rc = purge_softdel(f, p.purge_to, err)) != BS_OK) return rc;
  if ((rc = put_change(f, r->checkpoint, r->checkpoint, BS_CHANGE_CHECKPOINT, c->users.p,
                       c->users.n, err)))
    return rc;
  return bs__stream_rec_put(f->db, txn, r, err);
}

static int lw_commit(bs_commit_result *out, bs_writer *base, const bs_write_batch *batch,
                     bs_val lsn, int create_empty, bs_error *err) {
  lm_writer *w = (lm_writer *)base;
  commit_ctx c = {.w = w,
                  .lsn = lsn.data ? lsn : (bs_val){lm_empty, 0},
                  .create_empty = create_empty,
                  .users = {.size = sizeof(bs_val)}};
  int rc;
  w->batch = batch;
  rc = w_write(w, commit_txn, &c, err);
  w->batch = NULL;
  fctx_reset(&w->f);
  bs__free(&w->db->base.alloc, c.users.p);
  if (rc != BS_OK) return rc;
  out->checkpoint_blocked = c.blocked != BS_BLOCKED_NONE;
  out->checkpoint_created = c.created;
  out->checkpoint = c.checkpoint;
  out->blocked_reason = c.blocked;
  return BS_OK;
}

/* One change of a stream record in its own txn: the writer's LSN calls (on a live stream) and
 * the lifecycle calls below. */
typedef struct state_ctx {
  bs__lmdb_db *db;
  uint32_t stream;
  int clear, terminate;
  const char *error;         /* report_error */
  int snapshot_done, resume; /* snapshot_done(lsn), resume_lsn(lsn) */
  bs_val lsn;
} state_ctx;

static int state_txn(MDB_txn *txn, void *payload, bs_error *err) {
  state_ctx *c = payload;
  bs__stream_rec r;
  int rc;
  if ((rc = bs__stream_rec_get(c->db, txn, c->stream, &r, err)) != BS_OK) return rc;
  if (c->snapshot_done || c->resume) {
    bs__stream_row row = rec_row(&r);
    bs__lsn_plan p;
    if ((rc = bs__plan_lsn(&p, r.id, &row, c->snapshot_done, c->lsn, err)) != BS_OK) return rc;
    bs__lsn_row(&row, &p, c->lsn);
    row_rec(&r, &row);
  }
  if (c->clear || c->terminate) {
    bs__stream_row row = rec_row(&r);
    if ((rc = bs__stream_reset(&row, r.id, c->clear, c->terminate, err)) != BS_OK) return rc;
    row_rec(&r, &row);
    if (c->clear) r.clear_pending = 1; /* the fence: stream_clear */
  }
  if (c->error) {
    bs__stream_step step;
    if ((rc = bs__stream_transition(&step, r.id, r.state, BS__STREAM_ERROR, err)) != BS_OK)
      return rc;
    r.state = (uint8_t)step.to;
    r.last_error = bs__val_str(c->error);
    if (r.last_error.size > 255) r.last_error.size = 255;
  }
  return bs__stream_rec_put(c->db, txn, &r, err);
}

static int lw_lsn(lm_writer *w, bs_val lsn, int snapshot_done, bs_error *err) {
  state_ctx c = {.db = w->db,
                 .stream = w->f.stream,
                 .snapshot_done = snapshot_done,
                 .resume = !snapshot_done,
                 .lsn = lsn.data ? lsn : (bs_val){lm_empty, 0}};
  return bs__lmdb_write(w->db, state_txn, &c, err);
}

static int lw_snapshot_done(bs_writer *base, bs_val lsn, bs_error *err) {
  return lw_lsn((lm_writer *)base, lsn, 1, err);
}

static int lw_resume_lsn(bs_writer *base, bs_val lsn, bs_error *err) {
  return lw_lsn((lm_writer *)base, lsn, 0, err);
}

/* ---- source_row: stored data, seeing the queue ------------------------------------------------- */

/* A row's stored record for effects.c's source_row (in the flush context's read txn, of table
 * f->tid; 0: the table is unknown, so is the row). */
static int lw_stored(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  fctx *f = ctx;
  *out = NULL;
  return f->tid ? fx_load(f, rid.data ? rid : (bs_val){lm_empty, 0}, out, err) : BS_OK;
}

static int lw_source_row(bs_writer *base, const bs_write_batch *batch, bs_val table, bs_val rid,
                         int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  lm_writer *w = (lm_writer *)base;
  bs__srec now;
  MDB_txn *txn;
  int rc;

  BS_ASSERT(rid.size <= BS_MAX_REPLICA_ID && (rid.data || !rid.size));
  if ((rc = bs__lmdb_txn_begin(w->db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  fctx_reset(&w->f);
  w->f.txn = txn;
  w->f.tid = 0;
  w->f.tname = table;
  if ((rc = table_id(&w->f, table, 0, &w->f.tid, err)) == BS_ENOTFOUND) rc = BS_OK;
  /* the queue as the flush would apply it (effects.c), over the stored records */
  if (rc == BS_OK)
    rc = bs__effects_source_row(&w->db->base.alloc, w->f.fx.snapshot, batch, table, rid, lw_stored,
                                &w->f, &now, err);
  f_close_src(&w->f); /* a read-only txn's cursor is not freed by LMDB */
  if (rc == BS_OK) rc = fn(now.has_data ? &now.data : NULL, payload);
  bs__lmdb_txn_abort(w->db, txn);
  fctx_reset(&w->f);
  return rc;
}

/* ---- truncate / drop: bounded transactions over the table's source records ------------------- */

typedef struct trunc_ctx {
  lm_writer *w;
  bs_val table;
  int drop, done;
} trunc_ctx;

static int trunc_txn(MDB_txn *txn, void *payload, bs_error *err) {
  trunc_ctx *c = payload;
  fctx *f = &c->w->f;
  unsigned char pk[BS_SOURCE_KEY_MAX];
  MDB_val key, val;
  MDB_cursor *cur;
  size_t n = 0;
  uint32_t tid;
  int mrc, rc;

  if ((rc = f_begin(f, txn, err)) != BS_OK) return rc;
  rc = table_id(f, c->table, 0, &tid, err);
  if (rc == BS_ENOTFOUND) {
    c->done = 1;
    return BS_OK;
  }
  if (rc != BS_OK) return rc;
  f->tid = tid; /* for effects.c's callbacks and the codec */
  f->tname = c->table;
  key.mv_size = bs__lmdb_source_key(pk, f->stream, tid, (bs_val){NULL, 0}); /* the table's */
  key.mv_data = pk;
  if ((mrc = mdb_cursor_open(txn, f->db->source, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && n < LM_BATCH_RECORDS;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT), n++) {
    srec *r;
    if (key.mv_size < 8 || memcmp(key.mv_data, pk, 8) != 0) {
      mrc = MDB_NOTFOUND;
      break;
    }
    if (!(r = srec_new(f, key.mv_data, key.mv_size))) rc = oom(err);
    if (rc || (rc = srec_decode(f, r, &val, err)) || (rc = mark_dirty(f, r, err))) break;
  }
  mdb_cursor_close(cur);
  if (rc) return rc;
  if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "scanning source records");
  if (mrc == MDB_NOTFOUND) c->done = 1;
  for (size_t i = 0; i < f->dirty.n; i++) {
    srec *r = ((srec **)f->dirty.p)[i];
    bs_val rid = {(const unsigned char *)r->key.data + 8, r->key.size - 8}; /* the key's rest */
    if (!r->r.soft && (rc = bs__effects_unlink(&f->fx, tid, rid, &r->r, err)) != BS_OK) return rc;
    r->r.exists = 0;
  }
  if (c->done && c->drop) {
    unsigned char k[BS_TABLE_KEY_MAX];
    MDB_val tkey;
    if ((rc = bs__lmdb_table_key(k, f->stream, c->table, &tkey, err))) return rc;
    mrc = mdb_del(txn, f->db->tables, &tkey, NULL);
    if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "forgetting a table");
  }
  f_close_src(f); /* the REMOVEs' bucket lookups */
  return f_finish(f, NULL, 0, err);
}

static int lw_truncate(bs_writer *base, bs_val table, int drop, bs_error *err) {
  lm_writer *w = (lm_writer *)base;
  trunc_ctx c = {w, table, drop, 0};
  int rc;
  BS_ASSERT(table.size >= 1 && table.size <= BS_MAX_TABLE_NAME);
  /* the front has flushed what was queued before the truncate (contract.md 4.2) */
  while (!c.done) {
    rc = w_write(w, trunc_txn, &c, err);
    fctx_reset(&w->f);
    if (rc != BS_OK) return rc;
  }
  return BS_OK;
}

/* ---- Writer open / close ------------------------------------------------------------------------ */

static void lw_close(bs_writer *base) {
  lm_writer *w = (lm_writer *)base;
  bs_allocator a;
  if (!w) return;
  a = w->db->base.alloc;
  fctx_free(&w->f);
  bs__free(&a, w);
}

static const bs_writer_vtable lmdb_writer_vt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = lw_close,
    .truncate = lw_truncate,
    .flush = lw_flush,
    .commit = lw_commit,
    .snapshot_done = lw_snapshot_done,
    .resume_lsn = lw_resume_lsn,
    .source_row = lw_source_row,
};

int bs__lmdb_writer_open(bs_writer **out, bs_storage *base, const bs_writer_options *o,
                         bs_error *err) {
  bs__lmdb_storage *st = (bs__lmdb_storage *)base;
  bs__lmdb_db *db = st->db;
  bs__stream_rec rec;
  MDB_txn *txn;
  lm_writer *w;
  int rc;

  *out = NULL;
  BS_ASSERT(o && o->max_records && o->max_bytes); /* resolved by the front */
  BS_ASSERT(!(db->env_flags & MDB_RDONLY));       /* refused by the front */
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  rc = bs__stream_rec_get(db, txn, base->stream_id, &rec, err);
  bs__lmdb_txn_abort(db, txn);
  if (rc != BS_OK || (rc = check_live(&rec, err)) != BS_OK) return rc;
  if (!(w = bs__calloc(&db->base.alloc, 1, sizeof *w)))
    return bs__fail(err, BS_ENOMEM, "cannot allocate the writer");
  w->base.vt = &lmdb_writer_vt;
  w->base.st = base;
  w->db = db;
  fctx_init(&w->f, db, base->stream_id, o->snapshot != 0);
  *out = &w->base;
  return BS_OK;
}

/* ---- Lifecycle: clear, terminate, report_error -------------------------------------------------- */

/* A clear commits, in one transaction, the stream's row reset (lifecycle.c) with clear_pending
 * set: from then on every reader takes the stream's other records as deleted, and every later
 * open too. The records are then deleted in transactions of at most LM_CLEAR_RECORDS, the last of
 * which clears the flag. A clear stopped in between (a kill, an error) is finished by whoever
 * finds the flag: the next write of the stream (f_begin) or the next read-write open. */
#define LM_CLEAR_RECORDS 10000u

static bs__lmdb_clear_seam clear_seam;

void bs__lmdb_set_clear_seam(const bs__lmdb_clear_seam *s) {
  static const bs__lmdb_clear_seam none;
  clear_seam = s ? *s : none;
}

typedef struct clear_ctx {
  bs__lmdb_db *db;
  uint32_t stream;
  size_t budget; /* records the transaction may still delete */
  int done;
} clear_ctx;

/* Deletes the keys of dbi starting with prefix while the budget lasts; *left: some remain. */
static int del_prefix(clear_ctx *c, MDB_txn *txn, MDB_dbi dbi, const unsigned char *prefix,
                      size_t plen, int *left, bs_error *err) {
  MDB_cursor *cur;
  MDB_val key, val;
  int mrc;
  if ((mrc = mdb_cursor_open(txn, dbi, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  /* Re-seek after each delete: MDB_GET_CURRENT after deleting the last key is EINVAL. */
  for (;;) {
    key.mv_size = plen;
    key.mv_data = (void *)prefix;
    if ((mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)) != 0) break;
    if (key.mv_size < plen || memcmp(key.mv_data, prefix, plen) != 0) {
      mrc = MDB_NOTFOUND;
      break;
    }
    if (!c->budget || (mrc = mdb_cursor_del(cur, 0)) != 0) break;
    c->budget--;
  }
  mdb_cursor_close(cur);
  *left = mrc == 0;
  if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "deleting a cleared stream");
  return BS_OK;
}

/* The stream's buckets, one after the other: its ops, superseded entries and state, then its
 * entry in `buckets`, so that a deletion resumed finds there every bucket not yet done. */
static int del_buckets(clear_ctx *c, MDB_txn *txn, int *left, bs_error *err) {
  MDB_dbi per_bucket[3] = {c->db->ops, c->db->superseded, c->db->bstate};
  unsigned char pk[BS_STREAM_PREFIX_SIZE], bk[8];
  MDB_cursor *cur;
  MDB_val key, val;
  uint64_t id = 0;
  int mrc, rc = BS_OK;
  bs__lmdb_stream_prefix(pk, c->stream);
  *left = 0;
  if ((mrc = mdb_cursor_open(txn, c->db->buckets, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  for (;;) {
    key = (MDB_val){sizeof pk, pk};
    if ((mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)) != 0) break;
    if (!bs__lmdb_in_stream(&key, c->stream) || (*left = c->budget == 0)) break;
    if ((rc = bs__lmdb_bucket_id_decode(&val, &id, err)) != BS_OK) break;
    bs__put_u64be(bk, id);
    for (int i = 0; i < 3 && rc == BS_OK && !*left; i++)
      rc = del_prefix(c, txn, per_bucket[i], bk, sizeof bk, left, err);
    if (rc != BS_OK || *left || (*left = c->budget == 0)) break;
    key = (MDB_val){sizeof pk, pk}; /* the stream's first bucket is still this one */
    if ((mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)) != 0 ||
        (mrc = mdb_cursor_del(cur, 0)) != 0)
      break;
    c->budget--;
  }
  mdb_cursor_close(cur);
  if (rc == BS_OK && mrc && mrc != MDB_NOTFOUND)
    rc = bs__lmdb_fail(err, mrc, "deleting a cleared stream's buckets");
  return rc;
}

/* One transaction of a clear's deletion: the buckets, then the stream's other records, at most
 * the budget; the one that finds nothing left clears the flag (c->done). */
static int clear_txn(MDB_txn *txn, void *payload, bs_error *err) {
  clear_ctx *c = payload;
  bs__lmdb_db *db = c->db;
  MDB_dbi per_stream[7] = {db->source, db->params,  db->changes, db->cqueue,
                           db->tables, db->softdel, db->wcp};
  unsigned char pk[1 + BS_STREAM_PREFIX_SIZE];
  bs__stream_rec r;
  int rc, left;
  c->budget = clear_seam.records ? clear_seam.records : LM_CLEAR_RECORDS;
  if ((rc = bs__stream_rec_get(db, txn, c->stream, &r, err)) != BS_OK) return rc;
  if (!r.clear_pending) { /* another handle finished it */
    c->done = 1;
    return BS_OK;
  }
  if ((rc = del_buckets(c, txn, &left, err)) != BS_OK || left) return rc;
  for (size_t i = 0; i < 7; i++) {
    int wcp = per_stream[i] == db->wcp; /* custom checkpoints: 'C' u32be stream */
    pk[0] = BS_WCP_CUSTOM_TAG;
    bs__lmdb_stream_prefix(pk + wcp, c->stream);
    if ((rc = del_prefix(c, txn, per_stream[i], pk, wcp + BS_STREAM_PREFIX_SIZE, &left, err)) ||
        left)
      return rc;
  }
  r.clear_pending = 0;
  c->done = 1;
  return bs__stream_rec_put(db, txn, &r, err);
}

int bs__lmdb_clear_finish(bs__lmdb_db *db, uint32_t stream, bs_error *err) {
  clear_ctx c = {db, stream, 0, 0};
  int rc;
  for (unsigned n = 0; !c.done; n++) {
    if (clear_seam.batch && (rc = clear_seam.batch(n)) != BS_OK)
      return bs__fail(err, rc, "stream %u: the clear's seam stopped it after %u transactions",
                      stream, n);
    if ((rc = bs__lmdb_write(db, clear_txn, &c, err)) != BS_OK) return rc;
  }
  return BS_OK;
}

int bs__lmdb_clear_pending(bs__lmdb_db *db, bs_error *err) {
  bs__stream_rec r;
  uint32_t id = 0;
  MDB_txn *txn;
  int rc;
  for (;;) { /* one read txn a stream found: the deletion commits in between */
    if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
    while ((rc = bs__lmdb_stream_next(db, txn, &id, &r, err)) == 1 && !r.clear_pending) {
    }
    bs__lmdb_txn_abort(db, txn);
    if (rc != 1) return rc;
    if ((rc = bs__lmdb_clear_finish(db, id, err)) != BS_OK) return rc;
  }
}

/* The reset row with its fence in one transaction, then the deletion. */
static int stream_clear(bs__lmdb_db *db, uint32_t stream, int terminate, bs_error *err) {
  state_ctx sc = {.db = db, .stream = stream, .clear = 1, .terminate = terminate};
  int rc;
  BS_ASSERT(!(db->env_flags & MDB_RDONLY)); /* refused by the front */
  if ((rc = bs__lmdb_write(db, state_txn, &sc, err)) != BS_OK) return rc;
  return bs__lmdb_clear_finish(db, stream, err);
}

int bs__lmdb_clear(bs_storage *base, bs_error *err) {
  bs__lmdb_storage *st = (bs__lmdb_storage *)base;
  return stream_clear(st->db, base->stream_id, 0, err);
}

int bs__lmdb_terminate(bs_storage *base, int clear, bs_error *err) {
  bs__lmdb_storage *st = (bs__lmdb_storage *)base;
  state_ctx sc = {.db = st->db, .stream = base->stream_id, .terminate = 1};
  if (clear) return stream_clear(st->db, base->stream_id, 1, err);
  return bs__lmdb_write(st->db, state_txn, &sc, err);
}

int bs__lmdb_report_error(bs_storage *base, const char *message, bs_error *err) {
  bs__lmdb_storage *st = (bs__lmdb_storage *)base;
  state_ctx sc = {.db = st->db, .stream = base->stream_id, .error = message ? message : ""};
  return bs__lmdb_write(st->db, state_txn, &sc, err);
}
