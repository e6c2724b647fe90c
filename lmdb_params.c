/*
 * lmdb_params.c: the parameter-lookup index of the LMDB backend (contract.md 4.1 step 3, 5.4). The
 * writer (lmdb_write.c) appends one entry per (lookup, source row) per save, and a tombstone (no rows)
 * when a row stops producing a lookup; this file is the read side (the key/value codec of
 * `params` is in lmdb_codec.c). A read is one range scan per requested lookup key: the entries of one lookup are
 * grouped by (table id, hash of the replica id) and ordered by op id inside a group, so the
 * latest entry at or below the checkpoint of each source row is found without an index scan.
 */
#include "lmdb_internal.h"

/* ---- Reading ------------------------------------------------------------------------------- */

/* The latest entry at or below the checkpoint of one source row of the current group. A group
 * normally holds one row; a hash collision interleaves two (or more) rows' entries. */
typedef struct param_best {
  bs_val rid;
  uint32_t n_rows;           /* 0: a tombstone */
  const unsigned char *rows; /* n_rows x (u32 len, bytes), in the map */
} param_best;

/* The rows and groups a lookup holds before it allocates: a lookup of up to 16 rows (most, e.g.
 * bsbench's 10) allocates nothing. Grown from BS_GROW's 8 instead, the rows took a malloc and a
 * realloc a 10-row lookup and the groups a malloc, about 700 of the 10,700 instructions of
 * bsbench's lookup (bench/README.md "Parameter lookups"). */
#define SCAN_ROWS  16u
#define SCAN_BESTS 4u

typedef struct param_scan {
  const bs_allocator *a;
  uint64_t checkpoint;
  size_t limit;
  bs_val *rows; /* borrowed from the map: valid while the read transaction lives */
  size_t n_rows, cap_rows;
  param_best *best;
  size_t n_best, cap_best;
  bs_val rows0[SCAN_ROWS]; /* rows and best start here, on the stack */
  param_best best0[SCAN_BESTS];
} param_scan;

/* BS_GROW of an array that starts in the scan itself (at `local`): the first growth copies it
 * out to the heap. */
static int scan_grow(const bs_allocator *a, void **arr, const void *local, size_t *cap, size_t need,
                     size_t elem) {
  void *heap = NULL;
  size_t hcap = 0;
  if (need <= *cap) return BS_OK;
  if (*arr != local) return bs__grow(a, arr, cap, need, elem);
  if (bs__grow(a, &heap, &hcap, need, elem)) return BS_ENOMEM;
  memcpy(heap, local, *cap * elem);
  *arr = heap;
  *cap = hcap;
  return BS_OK;
}

static int scan_push_row(param_scan *s, const unsigned char *data, size_t size, bs_error *err) {
  int rc;
  if ((rc = bs__param_limit_check(s->n_rows + 1, s->limit, err))) return rc;
  if (s->n_rows == s->cap_rows && /* the call only to grow: it is not inlined */
      scan_grow(s->a, (void **)&s->rows, s->rows0, &s->cap_rows, s->n_rows + 1, sizeof *s->rows))
    return bs__fail(err, BS_ENOMEM, "parameter sets: out of memory");
  s->rows[s->n_rows].data = data; /* into the value: non-NULL, also for an empty row */
  s->rows[s->n_rows].size = size;
  s->n_rows++;
  return BS_OK;
}

/* Emits the rows of every live (non-tombstone) source row of the finished group. */
static int scan_flush_group(param_scan *s, bs_error *err) {
  for (size_t i = 0; i < s->n_best; i++) {
    const unsigned char *p = s->best[i].rows; /* checked by scan_take's decode */
    for (uint32_t j = 0; j < s->best[i].n_rows; j++) {
      uint32_t len = bs__get_u32le(p);
      int rc;
      if ((rc = scan_push_row(s, p + 4, len, err))) return rc;
      p += 4 + len;
    }
  }
  s->n_best = 0;
  return BS_OK;
}

/* Records val as the latest entry (so far) of its source row within the group. */
static int scan_take(param_scan *s, const MDB_val *val, bs_error *err) {
  bs_val rid;
  uint32_t n;
  const unsigned char *rows;
  size_t i;
  if (bs__lmdb_param_value_decode(val, &rid, &n, &rows))
    return bs__fail(err, BS_ECORRUPT, "parameter index: entry does not decode");
  for (i = 0; i < s->n_best && !bs__val_eq(s->best[i].rid, rid); i++) {
  }
  if (i == s->n_best) {
    if (s->n_best == s->cap_best &&
        scan_grow(s->a, (void **)&s->best, s->best0, &s->cap_best, s->n_best + 1, sizeof *s->best))
      return bs__fail(err, BS_ENOMEM, "parameter sets: out of memory");
    s->best[s->n_best++].rid = rid;
  }
  s->best[i].n_rows = n;
  s->best[i].rows = rows;
  return BS_OK;
}

/* Range scan over the entries of one lookup key. */
static int scan_lookup(param_scan *s, MDB_cursor *cur, uint32_t stream, bs_val lookup,
                       bs_error *err) {
  unsigned char seek[BS_PARAM_KEY_MAX], group[BS_PARAM_GROUP_SIZE];
  size_t plen = bs__lmdb_param_prefix(seek, stream, lookup), klen = plen + BS_PARAM_GROUP_SIZE + 8;
  int have_group = 0, rc;
  MDB_val k = {plen, seek}, v;
  MDB_cursor_op op = MDB_SET_RANGE;

  s->n_best = 0;
  for (;;) {
    const unsigned char *kp;
    rc = mdb_cursor_get(cur, &k, &v, op);
    op = MDB_NEXT;
    if (rc == MDB_NOTFOUND) break;
    if (rc) return bs__fail_mdb(err, rc, "parameter sets: cursor");
    kp = (const unsigned char *)k.mv_data;
    if (k.mv_size < plen || memcmp(kp, seek, plen) != 0) break;
    if (k.mv_size != klen)
      return bs__fail(err, BS_ECORRUPT, "parameter index: key of %zu bytes", k.mv_size);
    if (!have_group || memcmp(kp + plen, group, BS_PARAM_GROUP_SIZE) != 0) {
      if ((rc = scan_flush_group(s, err))) return rc;
      memcpy(group, kp + plen, BS_PARAM_GROUP_SIZE);
      have_group = 1;
    }
    if (bs__get_u64be(kp + plen + BS_PARAM_GROUP_SIZE) <= s->checkpoint) {
      if ((rc = scan_take(s, &v, err))) return rc;
      continue;
    }
    /* Entries of a group are in op id order: the rest of this group is above the checkpoint.
     * Jump past it (op ids are < 2^63, so no key equals the all-ones seek key). */
    memcpy(seek + plen, group, BS_PARAM_GROUP_SIZE);
    memset(seek + plen + BS_PARAM_GROUP_SIZE, 0xff, 8);
    k.mv_size = klen;
    k.mv_data = seek;
    op = MDB_SET_RANGE;
  }
  return scan_flush_group(s, err);
}

int bs__lmdb_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,
                            size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                            bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  bs__lmdb_db *db = ls->db;
  param_scan s;
  bs__stream_rec rec;
  MDB_txn *txn = NULL;
  MDB_cursor *cur = NULL;
  int rc;

  memset(&s, 0, offsetof(param_scan, rows0));
  s.rows = s.rows0;
  s.cap_rows = SCAN_ROWS;
  s.best = s.best0;
  s.cap_best = SCAN_BESTS;
  s.a = &db->base.alloc;
  s.checkpoint = checkpoint;
  s.limit = limit; /* 0: the first row is over it */
  for (size_t i = 0; i < n; i++) BS_ASSERT(lookups[i].size <= BS_MAX_LOOKUP_KEY); /* the front's */
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err))) goto fail;
  if ((rc = bs__stream_rec_get(db, txn, st->stream_id, &rec, err))) goto fail;
  if ((rc = bs__param_horizon_check(checkpoint, rec.param_horizon, err))) goto fail;
  if ((rc = mdb_cursor_open(txn, db->params, &cur))) {
    rc = bs__fail_mdb(err, rc, "parameter sets: cursor");
    goto fail;
  }
  for (size_t i = 0; i < n && !rec.clear_pending; i++) /* pending: the entries are deleted */
    if ((rc = scan_lookup(&s, cur, st->stream_id, lookups[i], err))) goto fail;
  /* Rows are handed out only once the limit is known to hold, so a BS_ELIMIT call has not
   * called fn at all. They point into the map: the transaction stays open until the end. */
  for (size_t i = 0; i < s.n_rows; i++)
    if ((rc = fn(&s.rows[i], payload))) goto fail;
  rc = BS_OK;
fail:
  if (cur) mdb_cursor_close(cur);
  bs__lmdb_txn_abort(db, txn);
  if (s.rows != s.rows0) bs__free(s.a, s.rows);
  if (s.best != s.best0) bs__free(s.a, s.best);
  return rc;
}
