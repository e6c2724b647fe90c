/*
 * lmdb_ops.c: the op records, the one file that knows how a bucket's ops lie in the `ops`
 * sub-database. The writer appends a flush's ops through a bs__lmdb_opw; readers, verify, stat,
 * defragmentation and compaction walk and change a bucket's ops through a bs__lmdb_opc; the
 * migration from format 4 regroups the ops it wrote one a record (bs__lmdb_ops_rechunk), and the
 * one from format 5 recodes the chunks (bs__lmdb_ops_recode).
 *
 * Format 5: a record is a chunk, a strictly ordered run of one bucket's ops, keyed u64be bucket
 * id | u64be the run's last op id (docs/format.md 4.3). Its value is an op chunk, encoded and
 * checked by opchunk.c (internal.h "Op chunks"): u32 n ops, u32 the wrapping sum of their
 * checksums, u64 the first op id, u32 the ops' bytes (the sum of their op values' sizes in the
 * format-4 encoding, the bucket state's measure), u8 flags (1: one of them is a CLEAR; 2: its op
 * values are compact, format 6), then per op varint(op id - the previous op's id; 0 for the
 * first) | varint(value size) | op value (the format-4 op value, or format 6's compact one: the
 * writer writes those, and a chunk's ops are all of one encoding). A
 * flush appends a bucket's new ops to its last chunk while
 * that stays within CHUNK_CAP bytes, and starts new chunks past it; so a commit of 10,000 rows into
 * 100 buckets writes about 100 records, not 10,000 (bench/README.md "Layout prototypes").
 *
 * Ops come out decoded in place (zero-copy: their fields point into the map), valid until the
 * transaction writes or ends. A cursor decodes the chunk it stands on once (its ops' ids and
 * offsets), so stepping within a chunk costs no LMDB call. Compaction's changes (a delete, a
 * MOVE or CLEAR written over an op) go into a copy of the chunk, written once when the cursor
 * leaves it and then joined with a neighbouring chunk of the bucket where both fit in one.
 */
#include "lmdb_internal.h"

#include <inttypes.h>
#include <stdio.h>

/* A chunk's bytes a flush or the migration fills, at most: one 4 KiB LMDB overflow page (its
 * 16-byte header and the value; bench/README.md "Layout prototypes": larger tails cost the write
 * path more than they buy the reads). A single larger op takes a chunk of its own. */
#define CHUNK_CAP 4080u

/* ---- The chunk codec (opchunk.c's, keyed here) ---------------------------------------------- */

/* Decodes the chunk (key k, value v) into c: BS_ECORRUPT unless it is one whole chunk
 * (bs__chunk_decode) whose last op id is the key's. The sums are verify's to check. */
static int chunk_decode(bs__lmdb_opc *c, const MDB_val *k, const MDB_val *v) {
  uint32_t n;
  c->n = 0; /* none decoded, until this one is */
  if (k->mv_size != BS_OP_KEY_SIZE ||
      bs__chunk_decode(v->mv_data, v->mv_size, c->ids, c->off, c->len, &n) ||
      c->ids[n - 1] != bs__get_u64be((const unsigned char *)k->mv_data + 8))
    return BS_ECORRUPT;
  c->val = v->mv_data;
  c->vsize = v->mv_size;
  c->n = n;
  memset(c->dead, 0, n);
  return BS_OK;
}

/* Op i of the chunk under c, decoded in place, in the chunk's encoding. */
static int chunk_op(const bs__lmdb_opc *c, uint32_t i, bs_op *op) {
  return bs__op_value_decode_as(c->val + c->off[i], c->len[i], c->ids[i], bs__chunk_flags(c->val),
                                op);
}

static unsigned char *grow(const bs_allocator *a, unsigned char **buf, size_t *cap, size_t n) {
  return BS_GROW(a, *buf, *cap, n) == BS_OK ? *buf : NULL;
}

/* ---- The cursor ----------------------------------------------------------------------------- */

static int opr_corrupt(uint64_t bucket, const MDB_val *k, bs_error *err) {
  return bs__fail(
      err, BS_ECORRUPT, "bucket id %" PRIu64 ": the ops up to %" PRIu64 " do not decode", bucket,
      k->mv_size == BS_OP_KEY_SIZE ? bs__get_u64be((const unsigned char *)k->mv_data + 8) : 0);
}

/* The chunk after an LMDB move (mrc): c->n 0 when none or another bucket's. */
static int opr_load(bs__lmdb_opc *c, int mrc, const MDB_val *k, const MDB_val *v, bs_error *err) {
  c->n = 0;
  if (mrc == MDB_NOTFOUND) return BS_OK;
  if (mrc) return bs__lmdb_fail(err, mrc, "reading ops");
  if (k->mv_size < 8 || bs__get_u64be(k->mv_data) != c->bucket) return BS_OK;
  if (chunk_decode(c, k, v)) return opr_corrupt(c->bucket, k, err);
  return BS_OK;
}

/* Hands out op i of the chunk (c->n 0 or i past it: none). */
static int opr_give(bs__lmdb_opc *c, uint32_t i, bs_op *op, int *found, bs_error *err) {
  *found = 0;
  if (i >= c->n) return BS_OK;
  c->i = i;
  if (chunk_op(c, i, op))
    return bs__fail(err, BS_ECORRUPT, "bucket id %" PRIu64 ": op %" PRIu64 " does not decode",
                    c->bucket, c->ids[i]);
  *found = 1;
  return BS_OK;
}

/* The chunk's first op at or after index i not deleted (c->n: none). */
static uint32_t live_from(const bs__lmdb_opc *c, uint32_t i) {
  while (i < c->n && c->dead[i]) i++;
  return i;
}

/* The chunk's last op below index i not deleted (UINT32_MAX: none). */
static uint32_t live_below(const bs__lmdb_opc *c, uint32_t i) {
  while (i-- > 0)
    if (!c->dead[i]) return i;
  return UINT32_MAX;
}

/* Whether id falls in the chunk under c (of bucket): no other chunk holds an op from its first
 * to its last, so a seek there is answered from it without LMDB. */
static int in_chunk(const bs__lmdb_opc *c, uint64_t bucket, uint64_t id) {
  return c->n && c->bucket == bucket && c->ids[0] <= id && id <= c->ids[c->n - 1];
}

int bs__lmdb_opc_open(bs__lmdb_opc *c, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err) {
  int mrc;
  memset(c, 0, offsetof(bs__lmdb_opc, ids));
  c->a = &db->base.alloc;
  if ((mrc = mdb_cursor_open(txn, db->ops, &c->cur)) != 0)
    return bs__lmdb_fail(err, mrc, "opening a cursor on ops");
  return BS_OK;
}

void bs__lmdb_opc_close(bs__lmdb_opc *c) {
  if (c->cur) mdb_cursor_close(c->cur);
  c->cur = NULL;
  if (c->buf) bs__free(c->a, c->buf);
  if (c->wbuf) bs__free(c->a, c->wbuf);
  c->buf = c->wbuf = NULL;
  c->cap = c->wcap = 0;
  c->dirty = 0;
}

int bs__lmdb_opc_seek_ge(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  uint32_t i = 0;
  int rc;
  if (in_chunk(c, bucket, id)) {
    while (c->ids[i] < id) i++;
    if ((i = live_from(c, i)) < c->n) return opr_give(c, i, op, found, err);
    /* the rest of the chunk was deleted: the next chunk */
    id = c->ids[c->n - 1] + 1;
  }
  if ((rc = bs__lmdb_opc_flush(c, err))) return rc;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, id);
  /* the first chunk whose last op is at or above id holds the first op at or above it */
  if ((rc = opr_load(c, mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE), &k, &v, err))) return rc;
  i = 0;
  while (i < c->n && c->ids[i] < id) i++;
  return opr_give(c, i, op, found, err);
}

int bs__lmdb_opc_seek_le(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc, rc;
  if (in_chunk(c, bucket, id)) {
    uint32_t i = c->n - 1;
    while (c->ids[i] > id) i--;
    if (!c->dead[i] || (i = live_below(c, i)) != UINT32_MAX) return opr_give(c, i, op, found, err);
  }
  if ((rc = bs__lmdb_opc_flush(c, err))) return rc;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, id);
  mrc = mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE);
  if ((rc = opr_load(c, mrc, &k, &v, err))) return rc;
  if (c->n && c->ids[0] <= id) { /* the chunk holding id's place has an op at or below it */
    uint32_t i = c->n - 1;
    while (c->ids[i] > id) i--;
    return opr_give(c, i, op, found, err);
  }
  mrc = mrc == MDB_NOTFOUND ? mdb_cursor_get(c->cur, &k, &v, MDB_LAST)
        : mrc == 0          ? mdb_cursor_get(c->cur, &k, &v, MDB_PREV)
                            : mrc;
  if ((rc = opr_load(c, mrc, &k, &v, err))) return rc;
  return opr_give(c, c->n ? c->n - 1 : 0, op, found, err);
}

int bs__lmdb_opc_next(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err) {
  MDB_val k, v;
  uint32_t i = c->n ? live_from(c, c->i + 1) : 0;
  int rc;
  if (i < c->n) return opr_give(c, i, op, found, err);
  if (c->dirty) { /* written, the chunk is found again by its ops' ids */
    uint64_t last = c->ids[c->n - 1];
    *found = 0;
    return last == UINT64_MAX ? bs__lmdb_opc_flush(c, err)
                              : bs__lmdb_opc_seek_ge(c, c->bucket, last + 1, op, found, err);
  }
  if ((rc = opr_load(c, mdb_cursor_get(c->cur, &k, &v, MDB_NEXT), &k, &v, err))) return rc;
  return opr_give(c, 0, op, found, err);
}

int bs__lmdb_opc_prev(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err) {
  MDB_val k, v;
  uint32_t i = c->n ? live_below(c, c->i) : UINT32_MAX;
  int rc;
  if (i != UINT32_MAX) return opr_give(c, i, op, found, err);
  if (c->dirty) {
    uint64_t first = c->ids[0];
    *found = 0;
    return first == 0 ? bs__lmdb_opc_flush(c, err)
                      : bs__lmdb_opc_seek_le(c, c->bucket, first - 1, op, found, err);
  }
  if ((rc = opr_load(c, mdb_cursor_get(c->cur, &k, &v, MDB_PREV), &k, &v, err))) return rc;
  return opr_give(c, c->n ? c->n - 1 : 0, op, found, err);
}

int bs__lmdb_opc_get(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                     bs_error *err) {
  int rc = bs__lmdb_opc_seek_ge(c, bucket, id, op, found, err);
  if (rc == BS_OK && *found && op->op_id != id) *found = 0;
  return rc;
}

/* The chunk under c becomes a copy of its own, which compaction's changes go into. */
static int chunk_own(bs__lmdb_opc *c, bs_error *err) {
  if (c->dirty) return BS_OK;
  if (!grow(c->a, &c->wbuf, &c->wcap, c->vsize))
    return bs__fail(err, BS_ENOMEM, "rewriting ops: out of memory");
  memcpy(c->wbuf, c->val, c->vsize);
  c->val = c->wbuf;
  c->dirty = 1;
  return BS_OK;
}

int bs__lmdb_opc_del(bs__lmdb_opc *c, bs_error *err) {
  int rc;
  BS_ASSERT(c->n && !c->dead[c->i]);
  if ((rc = chunk_own(c, err))) return rc;
  c->dead[c->i] = 1;
  return BS_OK;
}

int bs__lmdb_opc_bare(bs__lmdb_opc *c, const bs_op *bare, bs_error *err) {
  uint32_t i = c->i;
  unsigned f = bs__chunk_flags(c->val);
  size_t size = bs__op_value_size_as(bare, f);
  int rc;
  BS_ASSERT(c->n && !c->dead[i] && c->ids[i] == bare->op_id);
  BS_ASSERT(bare->type == BS_OP_MOVE || bare->type == BS_OP_CLEAR);
  if ((rc = chunk_own(c, err))) return rc;
  /* a MOVE or CLEAR is written over the op: in the first encoding an op header alone, which
   * every op value holds; a compact one's target (a varint) can outgrow a small op, and then
   * goes after the copy's end (the flush packs the ops again; no op handed out from the chunk
   * is kept past this call, compaction copies what it keeps) */
  if (size > c->len[i]) {
    if (!grow(c->a, &c->wbuf, &c->wcap, c->vsize + size))
      return bs__fail(err, BS_ENOMEM, "rewriting ops: out of memory");
    c->val = c->wbuf;
    c->off[i] = (uint32_t)c->vsize;
    c->vsize += size;
  }
  if (f & BS_CHUNK_COMPACT)
    bs__op_value_cencode(c->wbuf + c->off[i], bare);
  else
    bs__op_value_encode(c->wbuf + c->off[i], bare);
  c->len[i] = (uint32_t)size;
  return BS_OK;
}

/* The bucket's chunk the cursor moved to (mrc) when it decodes and joined with the chunk of
 * size bytes, n ops (first..last) that it precedes (before) or follows fits the writer's bounds;
 * its key and value in k, v. */
static int neighbour_fits(bs__lmdb_opc *c, int mrc, const MDB_val *k, const MDB_val *v, int before,
                          size_t size, uint32_t n, uint64_t first, uint64_t last, unsigned f,
                          int *fits, bs_error *err) {
  uint64_t nb_first, nb_last;
  uint32_t nb_n;
  *fits = 0;
  if (mrc == MDB_NOTFOUND) return BS_OK;
  if (mrc) return bs__lmdb_fail(err, mrc, "rewriting ops");
  if (k->mv_size != BS_OP_KEY_SIZE || bs__get_u64be(k->mv_data) != c->bucket) return BS_OK;
  /* one that does not decode stays as it is, for verify to report; a join copies the later
   * chunk's ops after its first delta, which must be the one-byte 0 the writers write */
  if (chunk_decode(c, k, v) || (!before && ((const unsigned char *)v->mv_data)[BS_CHUNK_HDR] != 0))
    return BS_OK;
  nb_n = c->n;
  nb_first = c->ids[0];
  nb_last = c->ids[nb_n - 1];
  c->n = 0; /* decoded to check it only: the cursor stands on no chunk of its own */
  /* a chunk's ops are of one encoding: a format-5 chunk joins only another */
  if (nb_n + n > BS_CHUNK_MAX_OPS || ((bs__chunk_flags(v->mv_data) ^ f) & BS_CHUNK_COMPACT))
    return BS_OK;
  *fits = (before ? bs__chunk_join_size(v->mv_size, nb_last, size, first)
                  : bs__chunk_join_size(size, last, v->mv_size, nb_first)) <= CHUNK_CAP;
  return BS_OK;
}

/* Positions the LMDB cursor on the chunk of key bucket | last (which must be there); k: that
 * key, in c->buf's last bytes. */
static int chunk_find(bs__lmdb_opc *c, uint64_t last, MDB_val *k, MDB_val *v, bs_error *err) {
  unsigned char *kb = c->buf + c->cap - BS_OP_KEY_SIZE;
  int mrc;
  bs__lmdb_op_key(kb, c->bucket, last);
  k->mv_size = BS_OP_KEY_SIZE;
  k->mv_data = kb;
  /* MDB_SET: k stays this buffer, which a put at the cursor then copies (a key pointing into the
   * page would be moved under LMDB's feet when the value's size changes) */
  mrc = mdb_cursor_get(c->cur, k, v, MDB_SET);
  if (mrc == MDB_NOTFOUND) return bs__fail(err, BS_ECORRUPT, "rewriting ops: the chunk went");
  return mrc ? bs__lmdb_fail(err, mrc, "rewriting ops") : BS_OK;
}

int bs__lmdb_opc_flush(bs__lmdb_opc *c, bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE], *p, *q;
  MDB_val k, v, nk = {sizeof kb, kb};
  size_t size = BS_CHUNK_HDR, room;
  uint64_t prev = 0, first = 0, last = 0, old_last;
  uint32_t n = 0;
  unsigned f;
  int mrc, rc, fits;
  if (!c->dirty) return BS_OK;
  c->dirty = 0;
  f = bs__chunk_flags(c->val) & BS_CHUNK_COMPACT;
  old_last = c->ids[c->n - 1];
  /* the buffer holds this chunk joined with a neighbour on either side, and a key at its end */
  room = 3 * (size_t)CHUNK_CAP + c->vsize + BS_OP_KEY_SIZE;
  if (!grow(c->a, &c->buf, &c->cap, room))
    return bs__fail(err, BS_ENOMEM, "rewriting ops: out of memory");
  p = c->buf;
  q = c->buf + c->vsize + CHUNK_CAP;    /* a join is built here */
  for (uint32_t i = 0; i < c->n; i++) { /* the ops not deleted, packed from the copy */
    if (c->dead[i]) continue;
    if (!n) first = c->ids[i];
    size += bs__chunk_add(p + size, n ? c->ids[i] - prev : 0, NULL, c->val + c->off[i], c->len[i]);
    prev = last = c->ids[i];
    n++;
  }
  c->n = 0; /* from here the cursor stands on no decoded chunk */
  if (!n) { /* no op left: the record goes (the LMDB cursor is still on it) */
    mrc = mdb_cursor_del(c->cur, 0);
    return mrc ? bs__lmdb_fail(err, mrc, "deleting ops") : BS_OK;
  }
  if (bs__chunk_seal_as(p, size, first, f))
    return bs__fail(err, BS_ECORRUPT, "rewriting ops: a bad chunk");
  /* compaction shrinks chunks: one that fits with the bucket's chunk before it becomes one with
   * it, so that a bucket's chunks stay about as few as the writer's (docs/format.md 4.3) */
  mrc = mdb_cursor_get(c->cur, &k, &v, MDB_PREV);
  if ((rc = neighbour_fits(c, mrc, &k, &v, 1, size, n, first, last, f, &fits, err))) return rc;
  if (fits) {
    uint64_t pl = bs__get_u64be((const unsigned char *)k.mv_data + 8);
    size_t js = bs__chunk_join_size(v.mv_size, pl, size, first);
    bs__chunk_join(q, v.mv_data, v.mv_size, pl, p, size);
    memcpy(p, q, js);
    size = js;
    n = bs__chunk_n(p);
    first = bs__chunk_first(p);
    if ((mrc = mdb_cursor_del(c->cur, 0)) != 0) return bs__lmdb_fail(err, mrc, "rewriting ops");
  }
  if ((rc = chunk_find(c, old_last, &k, &v, err))) return rc;
  /* and one that fits with the chunk after it */
  mrc = mdb_cursor_get(c->cur, &k, &v, MDB_NEXT);
  if ((rc = neighbour_fits(c, mrc, &k, &v, 0, size, n, first, last, f, &fits, err))) return rc;
  if (fits) { /* written over the next chunk (its key stays), this one's record goes */
    size_t js = bs__chunk_join_size(size, last, v.mv_size, bs__chunk_first(v.mv_data));
    bs__chunk_join(q, p, size, last, v.mv_data, v.mv_size);
    memcpy(kb, k.mv_data, sizeof kb); /* out of the page, as chunk_find says */
    k = nk;
    v.mv_size = js;
    v.mv_data = q;
    if ((mrc = mdb_cursor_put(c->cur, &k, &v, MDB_CURRENT)) != 0)
      return bs__lmdb_fail(err, mrc, "rewriting ops");
    if ((rc = chunk_find(c, old_last, &k, &v, err))) return rc;
    mrc = mdb_cursor_del(c->cur, 0);
    return mrc ? bs__lmdb_fail(err, mrc, "rewriting ops") : BS_OK;
  }
  if ((rc = chunk_find(c, old_last, &k, &v, err))) return rc;
  v.mv_size = size;
  v.mv_data = p;
  if (last == old_last) {
    mrc = mdb_cursor_put(c->cur, &k, &v, MDB_CURRENT);
  } else { /* the last op went: the key with it */
    bs__lmdb_op_key(kb, c->bucket, last);
    if ((mrc = mdb_cursor_del(c->cur, 0)) == 0) mrc = mdb_cursor_put(c->cur, &nk, &v, 0);
  }
  return mrc ? bs__lmdb_fail(err, mrc, "rewriting ops") : BS_OK;
}

/* Sums whole chunks from their headers, an op at a time only where the range cuts a chunk (or,
 * stop_at_clear, a chunk holds a CLEAR). */
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
    if (!c->dirty && c->i == 0 && c->ids[c->n - 1] <= to &&
        !(stop_at_clear && (bs__chunk_flags(c->val) & BS_CHUNK_CLEAR))) {
      out->checksum = bs__cksum_add(out->checksum, bs__chunk_sum(c->val));
      out->count += c->n;
      c->i = c->n - 1; /* the next step leaves the chunk */
      continue;
    }
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
  /* each op's type, its value's first byte (a chunk that does not decode is verify's) */
  for (mrc = mdb_cursor_get(cur, &k, &v, bucket ? MDB_SET_RANGE : MDB_FIRST);
       mrc == 0 && (!bucket || (k.mv_size >= 8 && memcmp(k.mv_data, kb, 8) == 0));
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const unsigned char *p = v.mv_data;
    size_t pos = BS_CHUNK_HDR;
    uint64_t delta, size;
    /* a compact op's type is its head's bits 0-2 */
    unsigned mask = v.mv_size > 20 && (p[20] & BS_CHUNK_COMPACT) ? 7u : 0xffu;
    while (pos < v.mv_size && bs__varint_get(p, v.mv_size, &pos, &delta) &&
           bs__varint_get(p, v.mv_size, &pos, &size) && size && size <= v.mv_size - pos) {
      bs__stat_op(out, (int)(p[pos] & mask));
      pos += size;
    }
  }
  mdb_cursor_close(cur);
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "stat");
}

int bs__lmdb_ops_verify(bs__lmdb_opc *c, uint64_t bucket, const bs__lmdb_ops_check *chk,
                        bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  char what[160];
  uint64_t after = 0;
  int mrc;
  c->bucket = bucket;
  bs__lmdb_op_key(kb, bucket, 0);
  for (mrc = mdb_cursor_get(c->cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(c->cur, &k, &v, MDB_NEXT)) {
    uint64_t last =
        k.mv_size == BS_OP_KEY_SIZE ? bs__get_u64be((const unsigned char *)k.mv_data + 8) : 0;
    const char *bad;
    if (k.mv_size < 8 || memcmp(k.mv_data, kb, 8) != 0) break;
    if (chunk_decode(c, &k, &v)) {
      snprintf(what, sizeof what,
               "the ops up to %" PRIu64 " do not decode (key %zu bytes, value %zu bytes)", last,
               k.mv_size, v.mv_size);
      chk->bad(chk->payload, bucket, what);
      continue;
    }
    if ((bad = bs__chunk_header_problem(c->val, c->n, c->ids, c->off, c->len, after))) {
      snprintf(what, sizeof what, "the chunk of ops %" PRIu64 "-%" PRIu64 ": %s", c->ids[0], last,
               bad);
      chk->bad(chk->payload, bucket, what);
    }
    for (uint32_t i = 0; i < c->n; i++) {
      bs_op op;
      if (chunk_op(c, i, &op) == BS_OK) {
        /* the bytes past the op header of the first encoding: the bucket state's measure */
        size_t b = bs__chunk_op_bytes(c->val + c->off[i], c->len[i], bs__chunk_flags(c->val));
        chk->op(chk->payload, &op, b - BS_OP_HEADER_SIZE);
        continue;
      }
      snprintf(what, sizeof what, "op %" PRIu64 " does not decode (%" PRIu32 " bytes)", c->ids[i],
               c->len[i]);
      chk->bad(chk->payload, bucket, what);
    }
    after = last;
  }
  c->n = 0; /* the LMDB cursor has gone past the chunk decoded last */
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "verify: ops");
}

int bs__lmdb_ops_orphans(bs__lmdb_opc *c, uint64_t lo, uint64_t hi, const bs__lmdb_ops_check *chk,
                         bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  char what[64];
  int mrc;
  c->n = 0; /* the LMDB cursor leaves the chunk decoded last */
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

/* ---- Building chunks: the writer's appends and the migration -------------------------------- */

/* A chunk being built in w->buf: w->size bytes (BS_CHUNK_HDR of them the header, sealed at the
 * put), w->n ops, the last w->last_id. */
static int build_add(bs__lmdb_opw *w, uint64_t id, const unsigned char *val, size_t vs,
                     const bs_op *op, bs_error *err) {
  size_t need = w->size + BS_CHUNK_ADD_MAX(vs);
  unsigned char *p = grow(w->a, &w->buf, &w->cap, need);
  if (!p) return bs__fail(err, BS_ENOMEM, "writing ops: out of memory");
  if (!w->n) w->first_id = id;
  w->size += bs__chunk_add_as(p + w->size, w->n ? id - w->last_id : 0, op, val, vs, w->f);
  w->last_id = id;
  w->n++;
  return BS_OK;
}

/* Whether op id of vs bytes would take the chunk being built past its bounds: the bytes it
 * packs into, exactly (format 6's benchmark ops fit 22 to a chunk where the bound
 * BS_CHUNK_ADD_MAX would let 21). */
static int build_full(const bs__lmdb_opw *w, uint64_t id, size_t vs) {
  return w->n && (w->n >= BS_CHUNK_MAX_OPS ||
                  w->size + bs__varint_len(id - w->last_id) + bs__varint_len(vs) + vs > CHUNK_CAP);
}

/* Puts the chunk being built (none: nothing) under key bucket | its last op id. */
static int build_put(bs__lmdb_opw *w, uint64_t bucket, bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v = {w->size, w->buf};
  int mrc;
  if (!w->n) return BS_OK;
  if (bs__chunk_seal_as(w->buf, w->size, w->first_id, w->f))
    return bs__fail(err, BS_ECORRUPT, "writing ops: a bad chunk");
  bs__lmdb_op_key(kb, bucket, w->last_id);
  /* past the file's last key (at the open) every later key is too: MDB_APPEND skips the search
   * for the slot and starts a new page instead of splitting a full one */
  if (!w->app && (!w->has_last || memcmp(kb, w->last, sizeof kb) > 0)) w->app = MDB_APPEND;
  mrc = mdb_cursor_put(w->cur, &k, &v, w->app);
  w->n = 0;
  w->size = BS_CHUNK_HDR;
  w->f = w->f_new;
  return mrc ? bs__lmdb_fail(err, mrc, "writing ops") : BS_OK;
}

int bs__lmdb_opw_open(bs__lmdb_opw *w, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err) {
  MDB_val k, v;
  int mrc;
  memset(w, 0, sizeof *w);
  w->a = &db->base.alloc;
  w->size = BS_CHUNK_HDR;
  w->f = w->f_new = BS_CHUNK_COMPACT; /* format 6's chunks */
  if ((mrc = mdb_cursor_open(txn, db->ops, &w->cur)) != 0)
    return bs__lmdb_fail(err, mrc, "opening a cursor on ops");
  if ((mrc = mdb_cursor_get(w->cur, &k, &v, MDB_LAST)) == 0) {
    w->has_last = 1;
    /* a key of another length sorts by its bytes: padded high, no append below it */
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
  if (w->buf) bs__free(w->a, w->buf);
  w->buf = NULL;
  w->cap = 0;
}

/* Starts the chunk being built from the chunk (k, v) when that has room (its ops copied: *took
 * 1, and the caller deletes it, whose key will be the new last op's). */
static int tail_load(bs__lmdb_opw *w, const MDB_val *k, const MDB_val *v, int *took,
                     bs_error *err) {
  uint64_t n;
  *took = 0;
  if (k->mv_size != BS_OP_KEY_SIZE || v->mv_size < BS_CHUNK_HDR) return BS_OK;
  n = bs__chunk_n(v->mv_data);
  if (n == 0 || n >= BS_CHUNK_MAX_OPS || v->mv_size >= CHUNK_CAP) return BS_OK;
  if (!grow(w->a, &w->buf, &w->cap, v->mv_size))
    return bs__fail(err, BS_ENOMEM, "writing ops: out of memory");
  memcpy(w->buf, v->mv_data, v->mv_size);
  w->size = v->mv_size;
  w->n = (uint32_t)n;
  w->first_id = bs__chunk_first(v->mv_data);
  w->last_id = bs__get_u64be((const unsigned char *)k->mv_data + 8);
  /* its ops stay in their encoding, and the new ones join them in it (a file migrated from
   * format 5 appends to its format-5 tail chunks until they are full) */
  w->f = bs__chunk_flags(v->mv_data) & BS_CHUNK_COMPACT;
  *took = 1;
  return BS_OK;
}

/* The bucket's last chunk, when it has room, becomes the start of the one being built. */
static int tail_take(bs__lmdb_opw *w, uint64_t bucket, bs_error *err) {
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc, rc, took;
  bs__lmdb_op_key(kb, bucket, UINT64_MAX);
  mrc = mdb_cursor_get(w->cur, &k, &v, MDB_SET_RANGE);
  mrc = mrc == MDB_NOTFOUND ? mdb_cursor_get(w->cur, &k, &v, MDB_LAST)
        : mrc == 0          ? mdb_cursor_get(w->cur, &k, &v, MDB_PREV)
                            : mrc;
  if (mrc == MDB_NOTFOUND) return BS_OK;
  if (mrc) return bs__lmdb_fail(err, mrc, "reading ops");
  if (k.mv_size < 8 || bs__get_u64be(k.mv_data) != bucket) return BS_OK;
  if ((rc = tail_load(w, &k, &v, &took, err)) || !took) return rc;
  if ((mrc = mdb_cursor_del(w->cur, 0)) != 0) return bs__lmdb_fail(err, mrc, "writing ops");
  return BS_OK;
}

int bs__lmdb_opw_put(bs__lmdb_opw *w, uint64_t bucket, const bs_op *(*next)(void *it), void *it,
                     bs_error *err) {
  const bs_op *op = next(it);
  int rc;
  if (!op) return BS_OK;
  if ((rc = tail_take(w, bucket, err))) return rc;
  for (; op; op = next(it)) {
    size_t vs = bs__op_value_size_as(op, w->f);
    if (build_full(w, op->op_id, vs)) {
      if ((rc = build_put(w, bucket, err))) return rc;
      vs = bs__op_value_size_as(op, w->f); /* the new chunk's encoding */
    }
    if ((rc = build_add(w, op->op_id, NULL, vs, op, err))) return rc;
  }
  return build_put(w, bucket, err);
}

/* ---- The migration from format 4: an op a record becomes chunks ----------------------------- */

/* One chunk from the format-4 records after key (the last chunk's, has_key 0: from the first):
 * the chunk at key taken again when it has room (so that where a batch ended does not show in
 * the chunks: they are what the writer would have built), then a run of one bucket's ops, each
 * deleted as it is copied, put under its last op's key, which goes into key. *got 0 when no
 * record was left. */
typedef struct rechunk {
  void (*record)(uint64_t n);
  uint64_t *records;
  size_t left, bytes_left; /* the batch's bounds */
} rechunk;

static int rechunk_one(bs__lmdb_opw *w, unsigned char key[BS_OP_KEY_SIZE], int has_key, rechunk *r,
                       int *got, bs_error *err) {
  MDB_val k = {BS_OP_KEY_SIZE, key}, v;
  uint64_t bucket = 0, took = 0;
  int mrc, rc = BS_OK, tail;
  *got = 0;
  if (!has_key) {
    mrc = mdb_cursor_get(w->cur, &k, &v, MDB_FIRST);
  } else if ((mrc = mdb_cursor_get(w->cur, &k, &v, MDB_SET_KEY)) == 0) {
    if ((rc = tail_load(w, &k, &v, &tail, err))) return rc;
    bucket = bs__get_u64be(key);
    mrc = tail ? mdb_cursor_del(w->cur, 0) : 0;
    if (mrc == 0) mrc = mdb_cursor_get(w->cur, &k, &v, MDB_NEXT);
  } else if (mrc == MDB_NOTFOUND) {
    return BS_ECORRUPT; /* the step record names a chunk the file does not hold */
  }
  for (; mrc == 0 && r->left && r->bytes_left; mrc = mdb_cursor_get(w->cur, &k, &v, MDB_NEXT)) {
    uint64_t b;
    if (k.mv_size != BS_OP_KEY_SIZE || v.mv_size < BS_OP_HEADER_SIZE) return BS_ECORRUPT;
    b = bs__get_u64be(k.mv_data);
    if (w->n && (b != bucket ||
                 build_full(w, bs__get_u64be((const unsigned char *)k.mv_data + 8), v.mv_size))) {
      if (took) break;
      /* the chunk at key alone so far: it goes back, and the run starts at this record, which
       * the next step (from the chunk put) meets again */
      if ((rc = build_put(w, bucket, err))) return rc;
      continue;
    }
    bucket = b;
    if ((rc = build_add(w, bs__get_u64be((const unsigned char *)k.mv_data + 8), v.mv_data,
                        v.mv_size, NULL, err)))
      return rc;
    if (r->record) r->record(*r->records);
    ++*r->records;
    took++;
    r->left--;
    r->bytes_left -=
        BS_OP_KEY_SIZE + v.mv_size < r->bytes_left ? BS_OP_KEY_SIZE + v.mv_size : r->bytes_left;
    if ((mrc = mdb_cursor_del(w->cur, 0)) != 0) break;
  }
  if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "migrating ops");
  if (!w->n) return BS_OK;
  bs__lmdb_op_key(key, bucket, w->last_id);
  *got = took > 0;
  return build_put(w, bucket, err);
}

int bs__lmdb_ops_rechunk(const bs__lmdb_db *db, MDB_txn *txn, unsigned char key[BS_OP_KEY_SIZE],
                         int has_key, size_t max_records, size_t max_bytes,
                         void (*record)(uint64_t n), uint64_t *records, int *done, bs_error *err) {
  bs__lmdb_opw w;
  rechunk r = {record, records, max_records, max_bytes};
  int got = 1, rc = bs__lmdb_opw_open(&w, db, txn, err);
  if (rc) return rc;
  w.has_last = 1;    /* never MDB_APPEND: format-4 records may lie after a chunk */
  w.f = w.f_new = 0; /* format 5's chunks, which the step to format 6 then recodes */
  memset(w.last, 0xff, sizeof w.last);
  /* the step record's key (the last chunk's) divides chunks below it from format-4 records
   * above; a chunk the bounds cut is taken up again by the next batch */
  while (rc == BS_OK && got && r.left && r.bytes_left) {
    rc = rechunk_one(&w, key, has_key, &r, &got, err);
    has_key = has_key || got;
  }
  *done = rc == BS_OK && !got;
  bs__lmdb_opw_close(&w);
  return rc;
}

/* ---- The migration from format 5: chunks recoded in format 6's op encoding ------------------ */

/* Like rechunk_one, over format-5 chunks: each chunk after key (the chunk at key, this step's
 * last, taken up again when it has room) is deleted and its ops appended, recoded, to chunks of
 * the compact encoding, put as they fill; a batch ends between two input chunks, after the
 * bucket's ops so far are put. So the chunks are those the writer would have built from the
 * same ops, whatever the bounds. */
static int recode_one(bs__lmdb_opw *w, unsigned char key[BS_OP_KEY_SIZE], int has_key, rechunk *r,
                      unsigned char **in, size_t *in_cap, int *got, bs_error *err) {
  MDB_val k = {BS_OP_KEY_SIZE, key}, v;
  uint64_t bucket = 0, took = 0, ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS];
  int mrc, rc = BS_OK, tail;
  *got = 0;
  if (!has_key) {
    mrc = mdb_cursor_get(w->cur, &k, &v, MDB_FIRST);
  } else if ((mrc = mdb_cursor_get(w->cur, &k, &v, MDB_SET_KEY)) == 0) {
    if (!(bs__chunk_flags(v.mv_data) & BS_CHUNK_COMPACT)) return BS_ECORRUPT; /* not this step's */
    if ((rc = tail_load(w, &k, &v, &tail, err))) return rc;
    bucket = bs__get_u64be(key);
    mrc = tail ? mdb_cursor_del(w->cur, 0) : 0;
    if (mrc == 0) mrc = mdb_cursor_get(w->cur, &k, &v, MDB_NEXT);
  } else if (mrc == MDB_NOTFOUND) {
    return BS_ECORRUPT; /* the step record names a chunk the file does not hold */
  }
  for (; mrc == 0 && r->left && r->bytes_left; mrc = mdb_cursor_get(w->cur, &k, &v, MDB_NEXT)) {
    uint32_t n;
    uint64_t b;
    if (k.mv_size != BS_OP_KEY_SIZE || v.mv_size < BS_CHUNK_HDR ||
        (bs__chunk_flags(v.mv_data) & BS_CHUNK_COMPACT))
      return BS_ECORRUPT;
    b = bs__get_u64be(k.mv_data);
    if (w->n && b != bucket) {
      if (took) break;
      /* the chunk at key alone so far: it goes back, and the cursor, on it, meets this record
       * again next */
      if ((rc = build_put(w, bucket, err))) return rc;
      continue;
    }
    /* out of the map: the puts below move pages */
    if (!grow(w->a, in, in_cap, v.mv_size))
      return bs__fail(err, BS_ENOMEM, "migrating ops: out of memory");
    memcpy(*in, v.mv_data, v.mv_size);
    if (bs__chunk_decode(*in, v.mv_size, ids, off, len, &n) ||
        ids[n - 1] != bs__get_u64be((const unsigned char *)k.mv_data + 8))
      return BS_ECORRUPT;
    if (r->record) r->record(*r->records);
    ++*r->records;
    took++;
    r->left--;
    r->bytes_left -=
        BS_OP_KEY_SIZE + v.mv_size < r->bytes_left ? BS_OP_KEY_SIZE + v.mv_size : r->bytes_left;
    if ((mrc = mdb_cursor_del(w->cur, 0)) != 0) break;
    bucket = b;
    for (uint32_t i = 0; i < n; i++) {
      bs_op op;
      size_t vs;
      if (bs__op_value_decode(*in + off[i], len[i], ids[i], &op)) return BS_ECORRUPT;
      bs__op_fields(&op);
      vs = bs__op_value_size_as(&op, w->f);
      if (build_full(w, ids[i], vs)) {
        if ((rc = build_put(w, bucket, err))) return rc;
        vs = bs__op_value_size_as(&op, w->f);
      }
      if ((rc = build_add(w, ids[i], NULL, vs, &op, err))) return rc;
    }
  }
  if (mrc && mrc != MDB_NOTFOUND) return bs__lmdb_fail(err, mrc, "migrating ops");
  if (!w->n) return BS_OK;
  bs__lmdb_op_key(key, bucket, w->last_id);
  *got = took > 0;
  return build_put(w, bucket, err);
}

int bs__lmdb_ops_recode(const bs__lmdb_db *db, MDB_txn *txn, unsigned char key[BS_OP_KEY_SIZE],
                        int has_key, size_t max_records, size_t max_bytes,
                        void (*record)(uint64_t n), uint64_t *records, int *done, bs_error *err) {
  bs__lmdb_opw w;
  rechunk r = {record, records, max_records, max_bytes};
  unsigned char *in = NULL;
  size_t in_cap = 0;
  int got = 1, rc = bs__lmdb_opw_open(&w, db, txn, err);
  if (rc) return rc;
  w.has_last = 1; /* never MDB_APPEND: format-5 chunks lie after the ones recoded */
  memset(w.last, 0xff, sizeof w.last);
  while (rc == BS_OK && got && r.left && r.bytes_left) {
    rc = recode_one(&w, key, has_key, &r, &in, &in_cap, &got, err);
    has_key = has_key || got;
  }
  *done = rc == BS_OK && !got;
  if (in) bs__free(w.a, in);
  bs__lmdb_opw_close(&w);
  return rc;
}
