/*
 * cli_buckets.c: the one piece of the CLI that reads the LMDB layout directly (as mdb_stat reads
 * LMDB's pages): the public API serves buckets by name but has no call that lists them, and
 * `stat`, `dump` and `compact` need the list. It walks the `buckets` sub-database of a stream in
 * one read transaction of the library's own environment (never a second one: LMDB forbids two
 * environments on one file in a process) and copies the names out, so the caller may then read
 * through the public API (which opens its own transactions).
 */
#include "cli.h"
#include "internal.h"

#include <stdlib.h>

static void free_list(cli_bucket *b, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) free(b[i].name);
  free(b);
}

void cli_buckets_free(cli_bucket *b, size_t n) { free_list(b, n); }

/* Appends one bucket (name copied) to the growing list. */
static int push(cli_bucket **list, size_t *n, size_t *cap, const MDB_val *name,
                const bs_bucket_state *s) {
  cli_bucket *b;
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    cli_bucket *p = realloc(*list, ncap * sizeof *p);
    if (!p) return BS_ENOMEM;
    *list = p;
    *cap = ncap;
  }
  b = &(*list)[*n];
  if (!(b->name = malloc(name->mv_size + 1))) return BS_ENOMEM;
  memcpy(b->name, name->mv_data, name->mv_size);
  b->name[name->mv_size] = '\0';
  b->name_size = name->mv_size;
  b->ops = s->count;
  b->bytes = s->bytes;
  b->due = 0;
  b->compacted_count = s->compacted_count;
  b->compacted_op = s->compacted_op;
  b->last_op = s->last_op;
  (*n)++;
  return BS_OK;
}

static int walk(bs_lmdb_db *db, MDB_txn *txn, uint32_t stream, cli_bucket **list, size_t *n,
                size_t *cap, bs_error *err) {
  unsigned char prefix[4];
  MDB_cursor *cur = NULL;
  MDB_val k, v, sk, sv;
  int mrc, rc = BS_OK;
  bs_put_u32be(prefix, stream);
  if ((mrc = mdb_cursor_open(txn, db->buckets, &cur)))
    return bs_fail_mdb(err, mrc, "opening a cursor on buckets");
  k.mv_data = prefix;
  k.mv_size = sizeof prefix;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); !mrc && rc == BS_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    unsigned char idk[8];
    bs_bucket_state s;
    MDB_val name;
    uint64_t id = 0;
    int i;
    if (k.mv_size < 4 || memcmp(k.mv_data, prefix, 4) != 0) break;
    if (v.mv_size != 8) {
      rc = bs_fail(err, BS_ECORRUPT, "bucket id value of %zu bytes", v.mv_size);
      break;
    }
    for (i = 7; i >= 0; i--) id = id << 8 | ((const unsigned char *)v.mv_data)[i];
    bs_put_u64be(idk, id);
    sk.mv_data = idk;
    sk.mv_size = sizeof idk;
    memset(&s, 0, sizeof s);
    mrc = mdb_get(txn, db->bstate, &sk, &sv);
    if (mrc == 0 && sv.mv_size >= BS_BUCKET_STATE_FIXED) {
      bs_bucket_state_decode(&sv, &s);
    } else if (mrc && mrc != MDB_NOTFOUND) {
      rc = bs_fail_mdb(err, mrc, "reading a bucket state");
      break;
    }
    name.mv_data = (unsigned char *)k.mv_data + 4;
    name.mv_size = k.mv_size - 4;
    rc = push(list, n, cap, &name, &s);
  }
  if (rc == BS_OK && mrc && mrc != MDB_NOTFOUND) rc = bs_fail_mdb(err, mrc, "walking buckets");
  mdb_cursor_close(cur);
  return rc;
}

int cli_buckets_list(bs_db *db, uint32_t stream, cli_bucket **out, size_t *n_out,
                     bs_error *err) {
  bs_lmdb_db *ldb = (bs_lmdb_db *)db;
  MDB_txn *txn = NULL;
  cli_bucket *list = NULL;
  size_t n = 0, cap = 0;
  int rc;
  *out = NULL;
  *n_out = 0;
  if ((rc = bs_lmdb_txn_begin(ldb, MDB_RDONLY, &txn, err))) return rc;
  rc = walk(ldb, txn, stream, &list, &n, &cap, err);
  bs_lmdb_txn_abort(ldb, txn);
  if (rc) {
    free_list(list, n);
    return rc == BS_ENOMEM ? bs_fail(err, rc, "out of memory listing buckets") : rc;
  }
  *out = list;
  *n_out = n;
  return BS_OK;
}

int cli_bucket_due(const cli_bucket *b, uint64_t min_changes, double min_ratio) {
  return bs_compact_bucket_due(b->ops, b->compacted_count, b->last_op, b->compacted_op,
                               min_changes ? min_changes : BS_COMPACT_MIN_CHANGES,
                               min_ratio < 0 ? BS_COMPACT_MIN_RATIO : min_ratio);
}
