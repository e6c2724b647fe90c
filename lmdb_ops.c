/*
 * lmdb_ops.c: the op records, the one file that knows how a bucket's ops lie in the `ops`
 * sub-database. The writer appends a flush's ops through a bs__lmdb_opw; readers, verify, stat,
 * defragmentation and compaction walk and change a bucket's ops through a bs__lmdb_opc. Today
 * a record holds one op, keyed u64be bucket id | u64be op id (lmdb_internal.h); ops come out
 * decoded in place (zero-copy), valid until the transaction writes or ends.
 */
#include "lmdb_internal.h"

#include <inttypes.h>
#include <stdio.h>

static int opr_corrupt(uint64_t bucket, const MDB_val *k, bs_error *err) {
  return bs__fail(
      err, BS_ECORRUPT, "bucket id %" PRIu64 ": op %" PRIu64 " does not decode", bucket,
      k->mv_size == BS_OP_KEY_SIZE ? bs__get_u64be((const unsigned char *)k->mv_data + 8) : 0);
}

/* The op under the cursor after an LMDB step (mrc): *found 0 past the bucket's ops. */
static int opr_got(bs__lmdb_opc *c, int mrc, const MDB_val *k, const MDB_val *v, bs_op *op,
                   int *found, bs_error *err) {
  *found = 0;
  if (mrc == MDB_NOTFOUND) return BS_OK;
  if (mrc) return bs__lmdb_fail(err, mrc, "reading ops");
  if (k->mv_size < 8 || bs__get_u64be(k->mv_data) != c->bucket) return BS_OK;
  if (bs__lmdb_op_decode(k, v, op)) return opr_corrupt(c->bucket, k, err);
  c->size = v->mv_size;
  *found = 1;
  return BS_OK;
}

int bs__lmdb_opc_open(bs__lmdb_opc *c, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err) {
  int mrc;
  c->bucket = 0;
  c->cur = NULL;
  if ((mrc = mdb_cursor_open(txn, db->ops, &c->cur)) != 0)
    return bs__lmdb_fail(err, mrc, "opening a cursor on ops");
  return BS_OK;
}

void bs__lmdb_opc_close(bs__lmdb_opc *c) {
  if (c->cur) mdb_cursor_close(c->cur);
  c->cur = NULL;
}

int bs__lmdb_opc_seek_ge(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, id);
  return opr_got(c, mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE), &k, &v, op, found, err);
}

int bs__lmdb_opc_seek_le(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, id);
  mrc = mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE);
  if (mrc == MDB_NOTFOUND)
    mrc = mdb_cursor_get(c->cur, &k, &v, MDB_LAST);
  else if (mrc == 0 && (k.mv_size != sizeof kb || memcmp(k.mv_data, kb, sizeof kb) != 0))
    mrc = mdb_cursor_get(c->cur, &k, &v, MDB_PREV);
  return opr_got(c, mrc, &k, &v, op, found, err);
}

int bs__lmdb_opc_next(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err) {
  MDB_val k, v;
  return opr_got(c, mdb_cursor_get(c->cur, &k, &v, MDB_NEXT), &k, &v, op, found, err);
}

int bs__lmdb_opc_prev(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err) {
  MDB_val k, v;
  return opr_got(c, mdb_cursor_get(c->cur, &k, &v, MDB_PREV), &k, &v, op, found, err);
}

int bs__lmdb_opc_get(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                     bs_error *err) {
  int rc = bs__lmdb_opc_seek_ge(c, bucket, id, op, found, err);
  if (rc == BS_OK && *found && op->op_id != id) *found = 0;
  return rc;
}

int bs__lmdb_opc_del(bs__lmdb_opc *c, bs_error *err) {
  int mrc = mdb_cursor_del(c->cur, 0);
  return mrc ? bs__lmdb_fail(err, mrc, "deleting an op") : BS_OK;
}

int bs__lmdb_opc_bare(bs__lmdb_opc *c, const bs_op *bare, bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE], vb[BS_OP_HEADER_SIZE];
  MDB_val k = {sizeof kb, kb}, v = {sizeof vb, vb};
  int mrc;
  BS_ASSERT(bare->type == BS_OP_MOVE || bare->type == BS_OP_CLEAR);
  bs__lmdb_op_key(kb, c->bucket, bare->op_id);
  bs__lmdb_op_encode(vb, bare);
  mrc = mdb_cursor_put(c->cur, &k, &v, MDB_CURRENT);
  return mrc ? bs__lmdb_fail(err, mrc, "rewriting an op") : BS_OK;
}

int bs__lmdb_ops_sum(bs__lmdb_opc *c, uint64_t bucket, uint64_t from, uint64_t to,
                     int stop_at_clear, bs_checksum *out, int *cleared, bs_error *err) {
  bs_op op;
  int found, rc;
  out->checksum = 0;
  out->count = 0;
  *cleared = 0;
  if (from >= to) return BS_OK;
  for (rc = bs__lmdb_opc_seek_ge(c, bucket, from + 1, &op, &found, err);
       rc == BS_OK && found && op.op_id <= to; rc = bs__lmdb_opc_next(c, &op, &found, err)) {
    if (stop_at_clear && op.type == BS_OP_CLEAR) {
      *cleared = 1;
      return BS_OK;
    }
    out->checksum = bs__cksum_add(out->checksum, op.checksum);
    out->count++;
  }
  return rc;
}

int bs__lmdb_ops_stat(const bs__lmdb_db *db, MDB_txn *txn, const uint64_t *bucket, bs_stat *out,
                      bs_error *err) {
  unsigned char kb[8];
  MDB_cursor *cur;
  MDB_val k = {sizeof kb, kb}, v;
  int mrc;
  if ((mrc = mdb_cursor_open(txn, db->ops, &cur)) != 0) return bs__fail_mdb(err, mrc, "stat");
  if (bucket) bs__put_u64be(kb, *bucket);
  /* one pass reading only each value's first byte: the op type */
  for (mrc = mdb_cursor_get(cur, &k, &v, bucket ? MDB_SET_RANGE : MDB_FIRST);
       mrc == 0 && (!bucket || (k.mv_size >= 8 && memcmp(k.mv_data, kb, 8) == 0));
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    bs__stat_op(out, v.mv_size ? ((const unsigned char *)v.mv_data)[0] : 0);
  mdb_cursor_close(cur);
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "stat");
}

int bs__lmdb_ops_verify(bs__lmdb_opc *c, uint64_t bucket, const bs__lmdb_ops_check *chk,
                        bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  char what[128];
  int mrc;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, 0);
  for (mrc = mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(c->cur, &k, &v, MDB_NEXT)) {
    bs_op op;
    if (k.mv_size < 8 || memcmp(k.mv_data, kb, 8) != 0) break;
    if (bs__lmdb_op_decode(&k, &v, &op) == BS_OK) {
      chk->op(chk->payload, &op, v.mv_size - BS_OP_HEADER_SIZE);
      continue;
    }
    snprintf(what, sizeof what, "op %" PRIu64 " does not decode (key %zu bytes, value %zu bytes)",
             k.mv_size == BS_OP_KEY_SIZE ? bs__get_u64be((const unsigned char *)k.mv_data + 8) : 0,
             k.mv_size, v.mv_size);
    chk->bad(chk->payload, bucket, what);
  }
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "verify: ops");
}

int bs__lmdb_ops_orphans(bs__lmdb_opc *c, uint64_t lo, uint64_t hi, const bs__lmdb_ops_check *chk,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  char what[64];
  int mrc;
  bs__lmdb_op_key(kb, lo, 0);
  while ((mrc = mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE)) == 0) {
    uint64_t id;
    if (k.mv_size < 8) {
      snprintf(what, sizeof what, "ops: key of %zu bytes", k.mv_size);
      chk->bad(chk->payload, 0, what);
      return BS_OK;
    }
    id = bs__get_u64be(k.mv_data);
    if (id >= hi) break;
    chk->bad(chk->payload, id, NULL);
    if (id == UINT64_MAX) break;
    bs__lmdb_op_key(kb, id + 1, 0);
    k.mv_size = sizeof kb;
    k.mv_data = kb;
  }
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "verify: ops");
}

/* ---- The writer's appends ------------------------------------------------------------------- */

int bs__lmdb_opw_open(bs__lmdb_opw *w, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err) {
  MDB_val k, v;
  int mrc;
  w->cur = NULL;
  w->app = 0;
  w->has_last = 0;
  if ((mrc = mdb_cursor_open(txn, db->ops, &w->cur)) != 0)
    return bs__lmdb_fail(err, mrc, "opening a cursor on ops");
  if ((mrc = mdb_cursor_get(w->cur, &k, &v, MDB_LAST)) == 0) {
    w->has_last = 1;
    /* a key of another length sorts by its bytes: a shorter one below an equal prefix */
    memset(w->last, 0xff, sizeof w->last);
    memcpy(w->last, k.mv_data, k.mv_size < sizeof w->last ? k.mv_size : sizeof w->last);
  } else if (mrc != MDB_NOTFOUND) {
    bs__lmdb_opw_close(w);
    return bs__lmdb_fail(err, mrc, "reading the last op");
  }
  return BS_OK;
}

void bs__lmdb_opw_close(bs__lmdb_opw *w) {
  if (w->cur) mdb_cursor_close(w->cur);
  w->cur = NULL;
}

/* Ops come in rising (bucket, op id): once past the last key the file had they go in with
 * MDB_APPEND, which skips the search for the slot and splits a full page by starting a new one
 * instead of moving half of it. The value is encoded straight into the page (MDB_RESERVE). */
int bs__lmdb_opw_put(bs__lmdb_opw *w, uint64_t bucket, const bs_op *(*next)(void *it), void *it,
                     bs_error *err) {
  for (const bs_op *op = next(it); op; op = next(it)) {
    unsigned char kb[BS_OP_KEY_SIZE];
    MDB_val k = {sizeof kb, kb}, v = {bs__lmdb_op_size(op), NULL};
    int mrc;
    bs__lmdb_op_key(kb, bucket, op->op_id);
    if (!w->app && (!w->has_last || memcmp(kb, w->last, sizeof kb) > 0)) w->app = MDB_APPEND;
    if ((mrc = mdb_cursor_put(w->cur, &k, &v, MDB_RESERVE | w->app)) != 0)
      return bs__lmdb_fail(err, mrc, "writing an op");
    bs__lmdb_op_encode(v.mv_data, op);
  }
  return BS_OK;
}
