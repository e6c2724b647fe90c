/*
 * mem_internal.h: what the memory backend's files share (mem.c: the store, its transactions, the
 * writer, compaction, lifecycle; mem_read.c: reads; mem_wcp.c: write checkpoints; mem_verify.c:
 * verify): the data structures and the helpers more than one of them uses. mem.c's comment says
 * how the store works.
 */
#ifndef BUCKETSTORE_MEM_INTERNAL_H
#define BUCKETSTORE_MEM_INTERNAL_H

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define MEM_MAX_OP_ID ((uint64_t)INT64_MAX)

/* ---- Data structures ------------------------------------------------------------------------ */

/* Incremental compaction's log (LMDB's `superseded`), one per bucket: op new_op replaced op old_op
 * of the same row there, as the source record said; at most one entry per old_op. */
typedef struct mem_sup {
  uint64_t old_op, new_op;
} mem_sup;

typedef struct mem_bucket {
  bs_val name; /* its bytes follow the struct (one allocation) */
  bs_op *ops;  /* ascending op id; each owns its strings (none: {NULL, 0}) */
  size_t n, cap;
  uint64_t generation;  /* changes whenever a compaction changed the bucket */
  uint64_t clear_start; /* torn span of the leading CLEAR: reads at C with */
  uint64_t clear_op;    /*   clear_start <= C < clear_op fail (0/0 = none) */
  /* the last full or initial-replication compaction: its horizon (capped at the bucket's last
   * op) and the bucket's op count after it; selection weighs the growth since (as LMDB) */
  uint64_t compacted_op, compacted_count;
  mem_sup *sups; /* appended by the writer, consumed by compaction */
  size_t nsups, csups;
} mem_bucket;

/* A source record; immutable once stored (a change stores a new object). One allocation holds it
 * with r's arrays and every byte (rec_copy in mem.c; bs__free frees it whole); a membership's
 * bucket is the bucket's index in mem_stream.buckets. */
typedef struct mem_rec {
  uint32_t table;
  bs_val rid;
  bs__srec r;
} mem_rec;

/* A parameter-index entry; nrows == 0 is a tombstone. */
typedef struct mem_param {
  bs_val key;
  uint32_t table;
  bs_val rid;
  uint64_t id;
  bs_val *rows;
  size_t nrows;
} mem_param;

typedef struct mem_table { /* one allocation with the name's bytes */
  bs_val name;
  uint32_t id;
  int dropped;
} mem_table;

typedef struct mem_bchange {
  uint64_t id;
  size_t bucket;
} mem_bchange; /* an op in a bucket */
typedef struct mem_uchange {
  uint64_t id;
  bs_val user;
} mem_uchange; /* user acked at cp id */
typedef struct mem_cp {
  uint64_t id;
  int64_t ms;
} mem_cp;                 /* checkpoint history */
typedef struct mem_cwcp { /* one allocation with the event's and the user's bytes */
  bs_val event, user;
  uint64_t value;
  int64_t req_ms; /* < 0: persistent; else created from a client request at this time */
} mem_cwcp;

/* Scalar stream state: saved and restored as a whole by a transaction. row is the stream's row
 * as lifecycle.c decides it (internal.h bs__stream_row), stored as it is: op_head the highest
 * allocated (= persisted) op id, checkpoint_lsn set once a checkpoint exists; its LSNs, when
 * set, hold the bytes of lsn[] (mem_lsn_set), which stay with the struct (a stream never moves). */
typedef struct mem_meta {
  bs__stream_row row;
  unsigned char lsn[3][BS_MAX_LSN]; /* checkpoint, resume, no_checkpoint_before */
  bs_hash hash;
  uint64_t gen_seq; /* source of bucket generations (survives clear) */
  uint64_t clears;  /* how many clears the stream had (a compaction job spans no clear) */
  uint64_t nsoft;   /* soft-deleted records (4.3), awaiting their purge */
  uint32_t next_table_id;
  char last_error[256];
} mem_meta;

typedef struct mem_stream {
  uint32_t id;
  bs_val name;
  mem_meta m;
  mem_table **tables;
  size_t ntables, ctables;
  mem_bucket **buckets;
  size_t nbuckets, cbuckets;
  mem_param *params; /* in param_cmp's order */
  size_t nparams, cparams;
  mem_bchange *bch;
  size_t nbch, cbch;
  mem_uchange *uch;
  size_t nuch, cuch;
  mem_cp *cps;
  size_t ncps, ccps;
  mem_cwcp **cw;
  size_t ncw, ccw;
  bs__htab ridx;    /* the source records by (table, rid) (value: the mem_rec *): their store */
  bs__htab bidx;    /* buckets by name (value: index + 1) */
  unsigned writers; /* the writer locks held: 1 << snapshot (under the db's mu) */
} mem_stream;

/* A managed write checkpoint (database-wide). A new id or new heads store a new record; the
 * flags (processed, gone) and requested_at change in place, where nothing can fail. */
typedef struct mem_mwcp {
  bs_val user;
  uint64_t id;
  bs_head *heads;
  size_t nheads;
  int64_t req_ms; /* < 0: none (a generated id) */
  int processed;
  int gone; /* deleted by cleanup: kept (without heads) only as the user's high-water mark, so a
               new record's id continues above it (contract.md 7); invisible to every read */
} mem_mwcp;

typedef struct mem_db {
  bs_db base;
  pthread_mutex_t mu;
  mem_stream **streams; /* index = id - 1 */
  size_t nstreams, cstreams;
  mem_mwcp **mw;
  size_t nmw, cmw;
} mem_db;

typedef struct mem_storage {
  bs__read_storage rs; /* base first: reads.c's slots answer the reads */
  mem_db *db;
  mem_stream *s;
  bs_write_checkpoint_mode mode;
  size_t event_n;
  unsigned char event[BS_MAX_USER_ID];
} mem_storage;

typedef struct mem_writer {
  bs_writer base;
  mem_storage *ms;
  int snapshot;
} mem_writer;

#define ALLOC(db) (&(db)->base.alloc)

#define MS(st)  ((mem_storage *)(st))
#define MW(w)   ((mem_writer *)(w))
#define MDB(db) ((mem_db *)(db))

/* ---- Helpers (static inline: every file that needs one compiles its own) ---- */

static inline int val_dup(const bs_allocator *a, bs_val in, bs_val *out) {
  void *p;
  out->data = NULL;
  out->size = 0;
  if (!in.size) return BS_OK;
  p = bs__malloc(a, in.size);
  if (!p) return BS_ENOMEM;
  memcpy(p, in.data, in.size);
  out->data = p;
  out->size = in.size;
  return BS_OK;
}

static inline void val_free(const bs_allocator *a, bs_val *v) {
  bs__free(a, (void *)v->data);
  v->data = NULL;
  v->size = 0;
}

static inline void op_free(const bs_allocator *a, bs_op *o) {
  val_free(a, &o->object_type);
  val_free(a, &o->object_id);
  val_free(a, &o->subkey);
  val_free(a, &o->data);
}

static inline void param_free(const bs_allocator *a, mem_param *p) {
  val_free(a, &p->key);
  val_free(a, &p->rid);
  bs__free(a, p->rows); /* one allocation (bs__vals_copy) */
}

/* The order of parameter entries, LMDB's key order: lookup, then row in the order the reads hand
 * rows out (bs__param_row_cmp), then op id. So a lookup's entries are one run, a parameter set
 * read is a walk of it, and a row's entries follow each other oldest first. */
static inline int param_cmp(const mem_param *x, const mem_param *y) {
  int c = bs__val_cmp(x->key, y->key);
  if (!c) c = bs__param_row_cmp(x->table, x->rid, y->table, y->rid);
  return c ? c : (x->id > y->id) - (x->id < y->id);
}

/* The index of the first entry of s at or after p in param_cmp's order. */
static inline size_t param_lower(const mem_stream *s, const mem_param *p) {
  size_t lo = 0, hi = s->nparams;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (param_cmp(&s->params[mid], p) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Whether entry k of s has a newer entry of its row at or below op id c (then it is not the
 * row's entry at c). */
static inline int param_newer(const mem_stream *s, size_t k, uint64_t c) {
  const mem_param *p = &s->params[k];
  return k + 1 < s->nparams && p[1].id <= c && p[1].table == p->table &&
         bs__val_eq(p[1].key, p->key) && bs__val_eq(p[1].rid, p->rid);
}

static inline int u64_cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

static inline int enomem(bs_error *err, const char *what) {
  return bs__fail(err, BS_ENOMEM, "out of memory (%s)", what);
}

static inline size_t op_size(const bs_op *o) {
  return o->data.size + o->object_type.size + o->object_id.size + o->subkey.size;
}

/* Index of op id in b, or b->n. */
static inline size_t op_index(const mem_bucket *b, uint64_t id) {
  size_t lo = 0, hi = b->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (b->ops[mid].op_id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < b->n && b->ops[lo].op_id == id ? lo : b->n;
}

static inline void mwcp_free(const bs_allocator *a, mem_mwcp *w) {
  if (!w) return;
  bs__free(a, w->heads); /* one allocation: the heads with their bytes (mem_wcp.c mwcp_new) */
  bs__free(a, w);        /* one allocation: the record with its user id */
}

static inline uint64_t rec_hash(uint32_t table, bs_val rid) {
  return XXH3_64bits_withSeed(rid.data, rid.size, table);
}

static inline uint64_t name_hash(bs_val name) {
  return XXH3_64bits(name.data, name.size);
}

static inline mem_bucket *bucket_find(const mem_stream *s, bs_val name, size_t *idx) {
  bs__hprobe p = bs__htab_probe(&s->bidx, name_hash(name));
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (bs__val_eq(s->buckets[v - 1]->name, name)) {
      if (idx) *idx = v - 1;
      return s->buckets[v - 1];
    }
  return NULL;
}

static inline mem_rec *rec_find(const mem_stream *s, uint32_t table, bs_val rid) {
  bs__hprobe p = bs__htab_probe(&s->ridx, rec_hash(table, rid));
  for (uintptr_t v; (v = bs__htab_next(&p));) {
    mem_rec *r = (mem_rec *)v;
    if (r->table == table && bs__val_eq(r->rid, rid)) return r;
  }
  return NULL;
}

/* Entry i of the records' index: a record, or NULL (a free entry); i < ridx.cap. */
static inline mem_rec *rec_at(const mem_stream *s, size_t i) {
  return (mem_rec *)s->ridx.e[i].value;
}

static inline void lock(mem_db *db) {
  pthread_mutex_lock(&db->mu);
}

static inline void unlock(mem_db *db) {
  pthread_mutex_unlock(&db->mu);
}

static inline uint64_t bucket_bytes(const mem_bucket *b) {
  uint64_t n = 0;
  for (size_t k = 0; k < b->n; k++) n += op_size(&b->ops[k]);
  return n;
}

static inline uint64_t last_op_of(const mem_bucket *b) {
  return b->n ? b->ops[b->n - 1].op_id : 0; /* ops ascend by id */
}

/* mem_read.c: the storage primitives of reads.c (x: the stream's mem_storage), whose slots answer
 * this backend's reads (BS__READ_SLOTS); verify walks with them too */
extern const bs__read_store bs__mem_reads;
/* mem_wcp.c: write checkpoints (contract.md 7); compaction runs the cleanup too */
int bs__mem_set_wcp_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                         bs_error *err);
int bs__mem_create_managed(uint64_t *ids_out, int *should_advance, bs_storage *st,
                           const bs_managed_request *req, size_t n, bs_error *err);
int bs__mem_last_wcp(uint64_t *id_out, int *found, bs_storage *st, bs_val user,
                     const bs_head *heads, size_t n_heads, bs_error *err);
int bs__mem_delete_requests(uint64_t *deleted, bs_storage *st, int64_t before_ms, bs_error *err);
/* mem_compact.c: compaction's primitives for compact_run.c. Defragmentation's re-emission is a
 * writer's transaction, which mem.c (the top) hands down as reemit: it re-emits rows (their keys:
 * the table id, 4 bytes in native order, and the replica id) in one transaction under the lock
 * (bs__defrag_store reemit). */
typedef int (*bs__mem_reemit_fn)(mem_db *db, mem_stream *s, const bs__defrag_row *rows, size_t n,
                                 uint64_t *emitted, bs_error *err);
int bs__mem_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *o,
                    bs__mem_reemit_fn reemit, bs_error *err);
int bs__mem_compact_initial(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                            uint64_t min_changes, bs_error *err);
/* mem_verify.c */
int bs__mem_verify(uint64_t *problems, bs_db *bdb, void (*fn)(const char *, void *), void *payload,
                   bs_error *err);

#endif /* BUCKETSTORE_MEM_INTERNAL_H */
