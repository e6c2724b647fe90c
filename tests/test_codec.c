/* test_codec: the LMDB codec (lmdb_codec.c, lmdb_internal.h) that the writer, the readers,
 * compaction and verify use: golden bytes of each encoding, round trips, and malformed input
 * (truncated, bad type, lengths past the end), which must give BS_ECORRUPT and never a read past
 * the value: every decoded buffer is a heap copy of exactly its size, so ASan (make check) sees
 * an over-read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lmdb_internal.h"
#include "util_format1.h"

#define V(s) ((bs_val){s, sizeof(s) - 1})

/* A heap copy of exactly n bytes of p (the decoders must stay inside it). */
static MDB_val exact(const void *p, size_t n) {
  MDB_val v;
  v.mv_size = n;
  v.mv_data = malloc(n ? n : 1);
  assert_non_null(v.mv_data);
  if (n) memcpy(v.mv_data, p, n);
  return v;
}

static void val_eq(bs_val got, bs_val want) {
  assert_int_equal(got.size, want.size);
  assert_non_null(got.data); /* a carried field is present, also when empty */
  if (want.size) assert_memory_equal(got.data, want.data, want.size);
}

/* A decoder under test, reduced to its status for one value (or key). */
typedef int (*decode_fn)(const MDB_val *v);

/* The one truncation loop of every family: the prefixes of buf (0..len bytes, each a heap copy
 * of its exact size) decode exactly when their size is in lo..hi. */
static void decodes_iff(const void *buf, size_t len, decode_fn dec, size_t lo, size_t hi) {
  for (size_t n = 0; n <= len; n++) {
    MDB_val v = exact(buf, n);
    int rc = dec(&v);
    free(v.mv_data);
    if (rc != (n >= lo && n <= hi ? BS_OK : BS_ECORRUPT))
      fail_msg("%zu of %zu bytes (decodes iff %zu..%zu): rc %d", n, len, lo, hi, rc);
  }
}

/* buf (n bytes) decodes; every truncation of it and buf with one more byte do not. */
static void whole_only(const unsigned char *buf, size_t n, decode_fn dec) {
  unsigned char *longer = malloc(n + 1);
  assert_non_null(longer);
  memcpy(longer, buf, n);
  longer[n] = 0;
  decodes_iff(longer, n + 1, dec, n, n);
  free(longer);
}

/* Decoders of the families below as decode_fn: the other half of an entry (dec_key, dec_value)
 * and what a decoded value must hold (dec_fixed) are set by the test. */
static MDB_val dec_key, dec_value;
static size_t dec_fixed;
static int dec_op_value(const MDB_val *v) {
  bs_op op;
  int rc = bs__lmdb_op_decode(&dec_key, v, &op);
  if (rc == BS_OK) assert_int_equal(op.data.size, v->mv_size - dec_fixed); /* data shrinks */
  return rc;
}
static int dec_bucket_key(const MDB_val *k) {
  bs_val name;
  uint32_t stream;
  uint64_t id;
  return bs__lmdb_bucket_entry_decode(k, &dec_value, &stream, &name, &id);
}
static int dec_bucket_value(const MDB_val *v) {
  bs_val name;
  uint32_t stream;
  uint64_t id;
  bs_error err = {0, ""};
  int rc = bs__lmdb_bucket_entry_decode(&dec_key, v, &stream, &name, &id);
  assert_int_equal(bs__lmdb_bucket_id_decode(v, &id, &err), rc); /* the same rule */
  return rc;
}
static int dec_param_key(const MDB_val *k) {
  bs_val lookup;
  uint32_t stream;
  uint64_t op;
  return bs__lmdb_param_key_decode(k, &stream, &lookup, &op);
}
static int dec_param_value(const MDB_val *v) {
  const unsigned char *p;
  uint32_t n;
  bs_val r;
  return bs__lmdb_param_value_decode(v, &r, &n, &p);
}
static int dec_table_id(const MDB_val *v) {
  bs_error err = {0, ""};
  uint32_t id = 0;
  int rc = bs__lmdb_table_id_decode(v, &id, &err);
  assert_int_equal(id, rc == BS_OK ? 1 : 0); /* the output only on success */
  return rc;
}
static int dec_wcp_key(const MDB_val *k) {
  bs__wcp_key wk;
  return bs__lmdb_wcp_key_decode(k, &wk);
}
static int dec_source_key(const MDB_val *k) { /* a prefix of test_source_key's golden */
  uint32_t stream, table;
  bs_val rid;
  int rc = bs__lmdb_source_key_decode(k, &stream, &table, &rid);
  if (rc == BS_OK) {
    assert_int_equal(stream, 0x0102);
    assert_int_equal(table, 3);
    val_eq(rid, (bs_val){(const char *)k->mv_data + 8, k->mv_size - 8}); /* "" at 8 bytes */
  }
  return rc;
}
static int dec_softdel_key(const MDB_val *k) {
  unsigned char sk[BS_SOFTDEL_KEY_MAX - 8];
  uint32_t stream;
  uint64_t mark;
  MDB_val src;
  return bs__lmdb_softdel_decode(k, &dec_value, &stream, &mark, sk, &src);
}
static int dec_wcp_hwm(const MDB_val *v) {
  uint64_t id = 0;
  int rc = bs__lmdb_wcp_hwm_decode(v, &id);
  if (rc == BS_OK) assert_true(id == UINT64_MAX);
  return rc;
}

static const unsigned char op_key_golden[16] = {0, 0, 0, 0, 0, 0,    0x01, 0x02,
                                                0, 0, 0, 0, 0, 0x03, 0x04, 0x05};

static void test_op_key(void **state) {
  unsigned char k[BS_OP_KEY_SIZE];
  (void)state;
  bs__lmdb_op_key(k, 0x0102, 0x030405);
  assert_memory_equal(k, op_key_golden, sizeof k);
}

/* PUT type "t", id "ab", subkey "xyz", data "{}", checksum 0x11223344 */
static const unsigned char put_golden[] = {1,   0x44, 0x33, 0x22, 0x11, 0,   0,   0,
                                           0,   0,    0,    0,    0, /* type, cksum, target */
                                           1,   0,    2,    0,    3, /* ot, oi, sk lengths */
                                           't', 'a',  'b',  'x',  'y',  'z', '{', '}'};

static bs_op put_op(void) {
  bs_op op;
  memset(&op, 0, sizeof op);
  op.type = BS_OP_PUT;
  op.checksum = 0x11223344u;
  op.object_type = V("t");
  op.object_id = V("ab");
  op.subkey = V("xyz");
  op.data = V("{}");
  return op;
}

/* Encodes op into a buffer of exactly bs__lmdb_op_size bytes, decodes it under key op_id. */
static void round_trip(const bs_op *op, uint64_t op_id, unsigned char *out, size_t out_size,
                       bs_op *back) {
  unsigned char k[BS_OP_KEY_SIZE];
  MDB_val mk = {sizeof k, k}, mv;
  size_t n = bs__lmdb_op_size(op);
  unsigned char *buf = malloc(n);
  assert_non_null(buf);
  bs__op_value_encode(buf, op);
  assert_true(n <= out_size);
  memcpy(out, buf, n);
  bs__lmdb_op_key(k, 7, op_id);
  mv.mv_size = n;
  mv.mv_data = buf;
  assert_int_equal(bs__lmdb_op_decode(&mk, &mv, back), BS_OK);
  assert_int_equal(back->op_id, op_id);
  assert_int_equal(back->type, op->type);
  assert_int_equal(back->checksum, op->checksum);
  assert_int_equal(back->target_op, op->target_op);
  if (bs__op_carries_row(op->type)) {
    val_eq(back->object_type, op->object_type);
    val_eq(back->object_id, op->object_id);
    val_eq(back->subkey, op->subkey);
  } else {
    assert_null(back->object_type.data);
    assert_null(back->object_id.data);
    assert_null(back->subkey.data);
  }
  if (op->type == BS_OP_PUT)
    val_eq(back->data, op->data);
  else
    assert_true(back->data.data == NULL && back->data.size == 0);
  free(buf);
}

static void test_op_value(void **state) {
  unsigned char out[64];
  bs_op op = put_op(), back;
  (void)state;
  assert_int_equal(bs__lmdb_op_size(&op), sizeof put_golden);
  round_trip(&op, 42, out, sizeof out, &back);
  assert_memory_equal(out, put_golden, sizeof put_golden);

  /* REMOVE keeps the row, drops the data; MOVE and CLEAR keep only the header. */
  op.type = BS_OP_REMOVE;
  assert_int_equal(bs__lmdb_op_size(&op), sizeof put_golden - 2);
  round_trip(&op, 43, out, sizeof out, &back);
  op.type = BS_OP_MOVE;
  op.target_op = 0x0102030405060708ull;
  assert_int_equal(bs__lmdb_op_size(&op), BS_OP_HEADER_SIZE);
  round_trip(&op, 44, out, sizeof out, &back);
  assert_int_equal(out[0], BS_OP_MOVE);
  assert_int_equal(out[5], 0x08); /* target_op little-endian */
  assert_int_equal(out[12], 0x01);
  for (int i = 13; i < 18; i++) assert_int_equal(out[i], 0);
  op.type = BS_OP_CLEAR;
  round_trip(&op, 45, out, sizeof out, &back);

  /* Present empty fields stay present. */
  op = put_op();
  op.object_type = V("");
  op.object_id = V("");
  op.data = V("");
  round_trip(&op, 46, out, sizeof out, &back);
}

static void test_op_value_malformed(void **state) {
  unsigned char k[BS_OP_KEY_SIZE];
  MDB_val mk = {sizeof k, k}, mv;
  const size_t fixed = sizeof put_golden - 2; /* header + type + id + subkey */
  unsigned char bad[sizeof put_golden];
  bs_op op;
  (void)state;
  bs__lmdb_op_key(k, 1, 2);
  /* Every truncation: short of the fixed part it does not decode; past it, data shrinks. */
  dec_key = mk;
  dec_fixed = fixed;
  decodes_iff(put_golden, sizeof put_golden, dec_op_value, fixed, sizeof put_golden);
  /* A type outside PUT..CLEAR. */
  for (int t = 0; t < 256; t++) {
    memcpy(bad, put_golden, sizeof bad);
    bad[0] = (unsigned char)t;
    mv = exact(bad, sizeof bad);
    assert_int_equal(bs__lmdb_op_decode(&mk, &mv, &op),
                     t >= BS_OP_PUT && t <= BS_OP_CLEAR ? BS_OK : BS_ECORRUPT);
    free(mv.mv_data);
  }
  /* Each length field one past what the value holds. */
  for (int f = 0; f < 3; f++) {
    static const int at[3] = {13, 15, 17};
    memcpy(bad, put_golden, sizeof bad);
    bad[at[f]] = (unsigned char)(bad[at[f]] + 3);
    mv = exact(bad, sizeof bad);
    assert_int_equal(bs__lmdb_op_decode(&mk, &mv, &op), BS_ECORRUPT);
    free(mv.mv_data);
    bad[at[f]] = 0xff;
    if (f < 2) bad[at[f] + 1] = 0xff;
    mv = exact(bad, sizeof bad);
    assert_int_equal(bs__lmdb_op_decode(&mk, &mv, &op), BS_ECORRUPT);
    free(mv.mv_data);
  }
  /* A key that is not an ops key. */
  mv = exact(put_golden, sizeof put_golden);
  mk.mv_size = 15;
  assert_int_equal(bs__lmdb_op_decode(&mk, &mv, &op), BS_ECORRUPT);
  mk.mv_size = 17;
  assert_int_equal(bs__lmdb_op_decode(&mk, &mv, &op), BS_ECORRUPT);
  free(mv.mv_data);
}

/* The op chunk (opchunk.c, shared by every backend that stores ops in runs): golden bytes of a
 * chunk of a PUT, a MOVE and a CLEAR, its round trip, verify's header check, and every malformed
 * shape bs__chunk_decode must refuse inside an exact heap copy. */
static const unsigned char chunk_golden[] = {
    3, 0, 0, 0,             /* n ops */
    0x3c, 0x11, 0x00, 0x00, /* checksum sum: 0x1111 + 0x20 + 0x0b = 0x113c */
    5, 0, 0, 0, 0, 0, 0, 0, /* first op id */
    67, 0, 0, 0,            /* bytes: the three values' sizes, 31 + 18 + 18 */
    1,                      /* flags: a CLEAR */
    /* op 5: delta 0, 31 bytes, PUT */
    0, 31, 1, 0x11, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 0, 1, 't', 'i', 'd', 's', 'd', 'a',
    't', 'a', 'x', 'y', 'z', 'w', 'v',
    /* op 7: delta 2, 18 bytes, MOVE to 9 */
    2, 18, 3, 0x20, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* op 200: delta 193 (a two-byte varint), 18 bytes, CLEAR of 150 */
    0xc1, 0x01, 18, 4, 0x0b, 0, 0, 0, 150, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static int dec_chunk(const void *p, size_t n) {
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS], k;
  return bs__chunk_decode(p, n, ids, off, len, &k);
}

static void test_op_chunk(void **state) {
  bs_op ops[3], got;
  unsigned char buf[256];
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS], n;
  size_t size = BS_CHUNK_HDR;
  MDB_val v;
  (void)state;
  memset(ops, 0, sizeof ops);
  ops[0] = (bs_op){5, BS_OP_PUT, 0x1111, 0, V("t"), V("id"), V("s"), V("dataxyzwv")};
  ops[1].op_id = 7, ops[1].type = BS_OP_MOVE, ops[1].checksum = 0x20, ops[1].target_op = 9;
  ops[2].op_id = 200, ops[2].type = BS_OP_CLEAR, ops[2].checksum = 0x0b, ops[2].target_op = 150;
  for (int i = 0; i < 3; i++) {
    size_t vs = bs__op_value_size(&ops[i]);
    assert_true(size + BS_CHUNK_ADD_MAX(vs) <= sizeof buf);
    size += bs__chunk_add(buf + size, i ? ops[i].op_id - ops[i - 1].op_id : 0, &ops[i], NULL, vs);
  }
  assert_int_equal(bs__chunk_seal(buf, size, 5), BS_OK);
  assert_int_equal(size, sizeof chunk_golden);
  assert_memory_equal(buf, chunk_golden, sizeof chunk_golden);
  v = exact(chunk_golden, sizeof chunk_golden);
  assert_int_equal(bs__chunk_decode(v.mv_data, v.mv_size, ids, off, len, &n), BS_OK);
  assert_int_equal(n, 3);
  for (uint32_t i = 0; i < n; i++) {
    assert_int_equal(ids[i], ops[i].op_id);
    assert_int_equal(bs__op_value_decode((unsigned char *)v.mv_data + off[i], len[i], ids[i], &got),
                     BS_OK);
    assert_int_equal(got.type, ops[i].type);
    assert_int_equal(got.checksum, ops[i].checksum);
    assert_int_equal(got.target_op, ops[i].target_op);
    if (ops[i].type == BS_OP_PUT) {
      val_eq(got.object_id, ops[i].object_id);
      val_eq(got.data, ops[i].data);
    } else {
      assert_null(got.object_id.data);
      assert_null(got.data.data);
    }
  }
  assert_null(bs__chunk_header_problem(v.mv_data, n, ids, off, len, 4));
  assert_non_null(bs__chunk_header_problem(v.mv_data, n, ids, off, len, 5));
  free(v.mv_data);
  /* the header check sees each field of the header the ops disagree with */
  for (int f = 0; f < 3; f++) {
    static const int at[3] = {4, 16, 20};
    memcpy(buf, chunk_golden, sizeof chunk_golden);
    buf[at[f]] ^= 1;
    assert_int_equal(dec_chunk(buf, sizeof chunk_golden), BS_OK);
    assert_int_equal(bs__chunk_decode(buf, sizeof chunk_golden, ids, off, len, &n), BS_OK);
    assert_non_null(bs__chunk_header_problem(buf, n, ids, off, len, 0));
  }
  /* a value copied whole (bs__chunk_add's val) gives the same bytes */
  size = BS_CHUNK_HDR;
  size += bs__chunk_add(buf + size, 0, NULL, chunk_golden + 23, 31);
  assert_memory_equal(buf + BS_CHUNK_HDR, chunk_golden + BS_CHUNK_HDR, size - BS_CHUNK_HDR);
  /* every truncation, and one byte more, is refused */
  for (size_t k = 0; k <= sizeof chunk_golden; k++) {
    unsigned char more[sizeof chunk_golden + 1];
    memcpy(more, chunk_golden, sizeof chunk_golden);
    more[sizeof chunk_golden] = 0;
    v = exact(more, k < sizeof chunk_golden ? k : sizeof more);
    assert_int_equal(dec_chunk(v.mv_data, v.mv_size), BS_ECORRUPT);
    free(v.mv_data);
  }
  /* a count of 0, of more ops than it holds, over BS_CHUNK_MAX_OPS; a first delta not 0, a later
   * one 0; a value shorter than an op header */
  {
    static const struct {
      int at;
      unsigned char b;
    } bad[] = {{0, 0}, {0, 4}, {1, 1}, {21, 1}, {54, 0}, {55, 17}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      memcpy(buf, chunk_golden, sizeof chunk_golden);
      buf[bad[i].at] = bad[i].b;
      v = exact(buf, sizeof chunk_golden);
      assert_int_equal(dec_chunk(v.mv_data, v.mv_size), BS_ECORRUPT);
      free(v.mv_data);
    }
  }
}

/* Format 6's chunk: the same PUT, MOVE and CLEAR and a REMOVE as compact op values (header flag
 * 2), their golden bytes, the round trip, the byte count in the first encoding's measure, and
 * the compact values bs__op_value_cdecode must refuse. */
static const unsigned char cchunk_golden[] = {
    4, 0, 0, 0,             /* n ops */
    0x3d, 0x11, 0x00, 0x00, /* checksum sum: 0x1111 + 0x20 + 0x0b + 0x01 */
    5, 0, 0, 0, 0, 0, 0, 0, /* first op id */
    89, 0, 0, 0,            /* bytes in format 5's measure: 31 + 18 + 18 + 22 */
    3,                      /* flags: a CLEAR, compact */
    /* op 5: delta 0, 20 bytes, PUT (head 1 | 32: short lengths): checksum, the lengths 1 and 2 in
     * one byte, the subkey's 1, strings, data */
    0, 20, 0x21, 0x11, 0x11, 0, 0, 0x12, 1, 't', 'i', 'd', 's', 'd', 'a', 't', 'a', 'x', 'y', 'z',
    'w', 'v',
    /* op 7: delta 2, 6 bytes, MOVE (head 3 | 8: a target follows) to 9 */
    2, 6, 0x0b, 0x20, 0, 0, 0, 9,
    /* op 200: delta 193, 7 bytes, CLEAR of 150 (a two-byte varint) */
    0xc1, 0x01, 7, 0x0c, 0x0b, 0, 0, 0, 0x96, 0x01,
    /* op 201: delta 1, 11 bytes, REMOVE (head 2 | 32): no data */
    1, 11, 0x22, 1, 0, 0, 0, 0x12, 1, 't', 'i', 'd', 's'};

static void test_op_chunk_compact(void **state) {
  bs_op ops[4], got;
  unsigned char buf[256];
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS], n;
  size_t size = BS_CHUNK_HDR;
  MDB_val v;
  (void)state;
  memset(ops, 0, sizeof ops);
  ops[0] = (bs_op){5, BS_OP_PUT, 0x1111, 0, V("t"), V("id"), V("s"), V("dataxyzwv")};
  ops[1].op_id = 7, ops[1].type = BS_OP_MOVE, ops[1].checksum = 0x20, ops[1].target_op = 9;
  ops[2].op_id = 200, ops[2].type = BS_OP_CLEAR, ops[2].checksum = 0x0b, ops[2].target_op = 150;
  ops[3] = (bs_op){201, BS_OP_REMOVE, 0x01, 0, V("t"), V("id"), V("s"), {NULL, 0}};
  for (int i = 0; i < 4; i++) {
    size_t vs = bs__op_value_size_as(&ops[i], BS_CHUNK_COMPACT);
    assert_int_equal(vs, bs__op_value_csize(&ops[i]));
    assert_true(size + BS_CHUNK_ADD_MAX(vs) <= sizeof buf);
    size += bs__chunk_add_as(buf + size, i ? ops[i].op_id - ops[i - 1].op_id : 0, &ops[i], NULL, vs,
                             BS_CHUNK_COMPACT);
  }
  assert_int_equal(bs__chunk_seal_as(buf, size, 5, BS_CHUNK_COMPACT), BS_OK);
  assert_int_equal(size, sizeof cchunk_golden);
  assert_memory_equal(buf, cchunk_golden, sizeof cchunk_golden);
  v = exact(cchunk_golden, sizeof cchunk_golden);
  assert_int_equal(bs__chunk_decode(v.mv_data, v.mv_size, ids, off, len, &n), BS_OK);
  assert_int_equal(n, 4);
  for (uint32_t i = 0; i < n; i++) {
    const unsigned char *p = (unsigned char *)v.mv_data + off[i];
    assert_int_equal(ids[i], ops[i].op_id);
    assert_int_equal(bs__op_value_decode_as(p, len[i], ids[i], BS_CHUNK_COMPACT, &got), BS_OK);
    assert_int_equal(got.op_id, ops[i].op_id);
    assert_int_equal(got.type, ops[i].type);
    assert_int_equal(got.checksum, ops[i].checksum);
    assert_int_equal(got.target_op, ops[i].target_op);
    /* the first encoding's size, whatever is stored */
    assert_int_equal(bs__chunk_op_bytes(p, len[i], BS_CHUNK_COMPACT), bs__op_value_size(&ops[i]));
    if (bs__op_carries_row(ops[i].type)) { /* zero-copy: the fields point into the value */
      val_eq(got.object_type, ops[i].object_type);
      val_eq(got.object_id, ops[i].object_id);
      val_eq(got.subkey, ops[i].subkey);
      assert_true((const unsigned char *)got.subkey.data > p &&
                  (const unsigned char *)got.subkey.data < p + len[i]);
    } else {
      assert_null(got.object_id.data);
    }
    if (ops[i].type == BS_OP_PUT)
      val_eq(got.data, ops[i].data);
    else
      assert_null(got.data.data);
  }
  assert_null(bs__chunk_header_problem(v.mv_data, n, ids, off, len, 4));
  free(v.mv_data);
  /* lengths of 16 and more as varints; a subkey of bs_subkey's 41 bytes without its length */
  {
    char sk[BS_SUBKEY_SIZE];
    bs_op big = {9, BS_OP_PUT, 7, 0, V("0123456789abcdef"), V("id"), {sk, sizeof sk}, V("d")};
    memset(sk, 'h', sizeof sk);
    bs__op_value_cencode(buf, &big);
    assert_int_equal(bs__op_value_csize(&big), 5 + 2 + 16 + 2 + 41 + 1);
    assert_int_equal(buf[0], BS_OP_PUT | BS_OPC_SUBKEY);
    assert_int_equal(buf[5], 16);
    assert_int_equal(buf[6], 2);
    assert_int_equal(buf[7], '0');
    assert_int_equal(bs__op_value_cdecode(buf, bs__op_value_csize(&big), 9, &got), BS_OK);
    val_eq(got.object_type, big.object_type);
    val_eq(got.subkey, big.subkey);
    val_eq(got.data, big.data);
    assert_int_equal(bs__chunk_op_bytes(buf, bs__op_value_csize(&big), BS_CHUNK_COMPACT),
                     bs__op_value_size(&big));
  }
  /* the writer's common op (short lengths, a bs_subkey subkey: the readers' fast path), as a
   * PUT and a REMOVE, and cut or lengthened by a byte */
  {
    char sk[BS_SUBKEY_SIZE];
    bs_op c = {3, BS_OP_PUT, 5, 0, V("t"), V("id"), {sk, sizeof sk}, V("dd")};
    memset(sk, 'k', sizeof sk);
    for (int type = BS_OP_PUT; type <= BS_OP_REMOVE; type++) {
      size_t cs;
      c.type = (bs_op_type)type;
      cs = bs__op_value_csize(&c);
      assert_int_equal(cs, 5 + 1 + 1 + 2 + 41 + (type == BS_OP_PUT ? 2 : 0));
      memset(buf, 0, sizeof buf);
      bs__op_value_cencode(buf, &c);
      assert_int_equal(buf[0], type | BS_OPC_SHORT | BS_OPC_SUBKEY);
      assert_int_equal(buf[5], 0x12);
      assert_int_equal(bs__op_value_cdecode(buf, cs, 3, &got), BS_OK);
      assert_int_equal(got.type, type);
      assert_int_equal(got.checksum, 5);
      val_eq(got.object_type, c.object_type);
      val_eq(got.object_id, c.object_id);
      val_eq(got.subkey, c.subkey);
      if (type == BS_OP_PUT)
        val_eq(got.data, c.data);
      else
        assert_null(got.data.data);
      assert_int_equal(bs__chunk_op_bytes(buf, cs, BS_CHUNK_COMPACT), bs__op_value_size(&c));
      v = exact(buf, type == BS_OP_PUT ? 5 + 1 + 3 + 40 : cs + 1);
      assert_int_equal(bs__op_value_cdecode(v.mv_data, v.mv_size, 3, &got), BS_ECORRUPT);
      free(v.mv_data);
    }
  }
  /* the header check sees the sum, the bytes, the CLEAR flag and the encoding flag */
  for (int f = 0; f < 4; f++) {
    static const unsigned char at[4] = {4, 16, 20, 20}, x[4] = {1, 1, 1, 2};
    memcpy(buf, cchunk_golden, sizeof cchunk_golden);
    buf[at[f]] ^= x[f];
    if (dec_chunk(buf, sizeof cchunk_golden) != BS_OK) continue; /* (the flag: values too short) */
    assert_int_equal(bs__chunk_decode(buf, sizeof cchunk_golden, ids, off, len, &n), BS_OK);
    assert_non_null(bs__chunk_header_problem(buf, n, ids, off, len, 0));
  }
  /* every truncation is refused */
  for (size_t k = 0; k < sizeof cchunk_golden; k++) {
    v = exact(cchunk_golden, k);
    assert_int_equal(dec_chunk(v.mv_data, v.mv_size), BS_ECORRUPT);
    free(v.mv_data);
  }
  /* a flag no build knows */
  memcpy(buf, cchunk_golden, sizeof cchunk_golden);
  buf[20] |= 4;
  assert_int_equal(dec_chunk(buf, sizeof cchunk_golden), BS_ECORRUPT);
  /* compact values that do not decode: a head bit that means nothing, a type 0 or 5, a target
   * flag with a target of 0, a CLEAR with a row's flag, a MOVE with a byte after its target, a
   * REMOVE with data, a PUT whose strings pass its end, one shorter than head and checksum */
  {
    static const unsigned char bad[][9] = {{0x4b, 0, 0, 0, 0, 9},
                                           {0x08, 0, 0, 0, 0, 9},
                                           {0x0d, 0, 0, 0, 0, 9},
                                           {0x14, 0, 0, 0, 0},
                                           {0x0b, 0, 0, 0, 0, 0},
                                           {0x0b, 0, 0, 0, 0, 9, 0},
                                           {0x02, 0, 0, 0, 0, 0, 0, 0, 'x'},
                                           {0x01, 0, 0, 0, 0, 1, 0, 0},
                                           {0x03, 0, 0, 0}};
    static const size_t bn[] = {6, 6, 6, 5, 6, 7, 9, 8, 4};
    for (size_t i = 0; i < sizeof bn / sizeof bn[0]; i++) {
      v = exact(bad[i], bn[i]);
      assert_int_equal(bs__op_value_cdecode(v.mv_data, v.mv_size, 1, &got), BS_ECORRUPT);
      free(v.mv_data);
    }
    /* and the same shapes that do: a MOVE to 9, a REMOVE of empty strings, a PUT of no data */
    v = exact((const unsigned char[]){0x0b, 0, 0, 0, 0, 9}, 6);
    assert_int_equal(bs__op_value_cdecode(v.mv_data, v.mv_size, 1, &got), BS_OK);
    assert_int_equal(got.target_op, 9);
    free(v.mv_data);
    v = exact((const unsigned char[]){0x02, 0, 0, 0, 0, 0, 0, 0}, 8);
    assert_int_equal(bs__op_value_cdecode(v.mv_data, v.mv_size, 1, &got), BS_OK);
    assert_true(got.subkey.data != NULL && got.subkey.size == 0);
    free(v.mv_data);
  }
}

static void test_bucket_entry(void **state) {
  unsigned char kb[BS_BUCKET_KEY_MAX], big[BS_MAX_BUCKET_NAME + 1], over[BS_BUCKET_KEY_MAX + 1];
  unsigned char vb[8];
  static const unsigned char golden[] = {0, 0, 1, 2, 'b', '[', '1', ']'};
  MDB_val k, ek, ev;
  bs_error err = {0, ""};
  bs_val name;
  uint32_t stream;
  uint64_t id;
  (void)state;
  assert_int_equal(bs__lmdb_bucket_key(kb, 0x0102, V("b[1]"), &k, &err), BS_OK);
  assert_int_equal(k.mv_size, sizeof golden);
  assert_ptr_equal(k.mv_data, kb);
  assert_memory_equal(kb, golden, sizeof golden);
  bs__put_u64le(vb, 0x0a0b0c);
  ek = exact(golden, sizeof golden);
  ev = exact(vb, sizeof vb);
  assert_int_equal(bs__lmdb_bucket_entry_decode(&ek, &ev, &stream, &name, &id), BS_OK);
  assert_int_equal(stream, 0x0102);
  val_eq(name, V("b[1]"));
  assert_int_equal(id, 0x0a0b0c);
  id = 0;
  assert_int_equal(bs__lmdb_bucket_id_decode(&ev, &id, &err), BS_OK);
  assert_int_equal(id, 0x0a0b0c);
  free(ek.mv_data);
  free(ev.mv_data);

  /* The longest name fits; one byte more is BS_ETOOBIG and names the limit. */
  memset(big, 'x', sizeof big);
  assert_int_equal(bs__lmdb_bucket_key(kb, 1, (bs_val){big, BS_MAX_BUCKET_NAME}, &k, &err), BS_OK);
  assert_int_equal(k.mv_size, BS_BUCKET_KEY_MAX);
  ev = exact(vb, sizeof vb);
  assert_int_equal(bs__lmdb_bucket_entry_decode(&k, &ev, &stream, &name, &id), BS_OK);
  assert_int_equal(name.size, BS_MAX_BUCKET_NAME);
  assert_int_equal(bs__lmdb_bucket_key(kb, 1, (bs_val){big, sizeof big}, &k, &err), BS_ETOOBIG);
  assert_non_null(strstr(err.msg, "BS_MAX_BUCKET_NAME"));
  free(ev.mv_data);

  /* Malformed: a key without a name or over the limit, a value that is not 8 bytes. */
  {
    static const unsigned char raw[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    dec_key = exact(golden, sizeof golden);
    decodes_iff(raw, sizeof raw, dec_bucket_value, 8, 8);
    free(dec_key.mv_data);
  }
  ev = exact(vb, sizeof vb);
  dec_value = ev;
  decodes_iff(golden, 4, dec_bucket_key, sizeof golden, sizeof golden);
  memset(over, 'x', sizeof over);
  memset(over, 0, 4);
  ek = exact(over, sizeof over); /* stream 0, a name one byte over the limit */
  assert_int_equal(bs__lmdb_bucket_entry_decode(&ek, &ev, &stream, &name, &id), BS_ECORRUPT);
  free(ek.mv_data);
  free(ev.mv_data);
}

/* meta "format" and "seq.bucket", the bstate key and the buckets value: golden bytes; a format
 * value decodes only whole and with its tag. */
static int format_status(const MDB_val *v) {
  uint32_t version;
  return bs__lmdb_format_decode(v, &version);
}

static void test_meta_records(void **state) {
  static const unsigned char golden[BS_FORMAT_VALUE_SIZE] = {
      'b', 'k', 't', 's', 't', 'o', 'r', 'e', BS_FORMAT_VERSION, 0, 0, 0};
  static const unsigned char state_golden[BS_STATE_KEY_SIZE] = {0, 0, 0, 0, 0, 0x0a, 0x0b, 0x0c};
  unsigned char v[BS_FORMAT_VALUE_SIZE], kb[BS_STATE_KEY_SIZE], vb[8];
  MDB_val fk = bs__lmdb_format_key(), sk = bs__lmdb_seq_key(), ev;
  uint32_t version = 0;
  uint64_t id = 0;
  (void)state;
  assert_int_equal(fk.mv_size, 6);
  assert_memory_equal(fk.mv_data, "format", 6);
  assert_int_equal(sk.mv_size, 10);
  assert_memory_equal(sk.mv_data, "seq.bucket", 10);
  bs__lmdb_format_value(v, BS_FORMAT_VERSION);
  assert_memory_equal(v, golden, sizeof golden);
  ev = exact(v, sizeof v);
  assert_int_equal(bs__lmdb_format_decode(&ev, &version), BS_OK);
  assert_int_equal(version, BS_FORMAT_VERSION);
  ((unsigned char *)ev.mv_data)[8] = 0xff; /* another version decodes: the caller refuses it */
  assert_int_equal(bs__lmdb_format_decode(&ev, &version), BS_OK);
  assert_int_equal(version, 0xff);
  ((unsigned char *)ev.mv_data)[0] = 'B'; /* another tag: a foreign record */
  assert_int_equal(bs__lmdb_format_decode(&ev, &version), BS_ECORRUPT);
  free(ev.mv_data);
  whole_only(golden, sizeof golden, format_status);
  bs__lmdb_state_key(kb, 0x0a0b0c);
  assert_memory_equal(kb, state_golden, sizeof kb);
  bs__lmdb_bucket_value(vb, UINT64_MAX - 1); /* seq.bucket and buckets values */
  ev = exact(vb, sizeof vb);
  assert_int_equal(bs__lmdb_bucket_id_decode(&ev, &id, NULL), BS_OK);
  assert_int_equal(id, UINT64_MAX - 1);
  assert_int_equal(vb[0], 0xfe); /* little-endian */
  free(ev.mv_data);
}

/* source key: stream | table | replica id (the rest): golden bytes, "" and the longest replica
 * id, non-ASCII bytes; shorter than 8 bytes, table 0 and one byte over do not decode. */
static void test_source_key(void **state) {
  static const unsigned char golden[] = {0, 0, 1, 2, 0, 0, 0, 3, 'r', 0xc3, 0xa9};
  unsigned char kb[BS_SOURCE_KEY_MAX + 1], big[BS_MAX_REPLICA_ID + 1];
  MDB_val k;
  uint32_t stream, table;
  bs_val rid;
  (void)state;
  assert_int_equal(bs__lmdb_source_key(kb, 0x0102, 3, (bs_val){"r\xc3\xa9", 3}), sizeof golden);
  assert_memory_equal(kb, golden, sizeof golden);
  decodes_iff(golden, sizeof golden, dec_source_key, 8, sizeof golden);
  memset(big, 'x', sizeof big);
  assert_int_equal(bs__lmdb_source_key(kb, 1, 1, (bs_val){big, BS_MAX_REPLICA_ID}),
                   BS_SOURCE_KEY_MAX);
  k = exact(kb, BS_SOURCE_KEY_MAX);
  assert_int_equal(bs__lmdb_source_key_decode(&k, &stream, &table, &rid), BS_OK);
  assert_int_equal(rid.size, BS_MAX_REPLICA_ID);
  free(k.mv_data);
  kb[BS_SOURCE_KEY_MAX] = 'x';
  k = exact(kb, BS_SOURCE_KEY_MAX + 1);
  assert_int_equal(bs__lmdb_source_key_decode(&k, &stream, &table, &rid), BS_ECORRUPT);
  free(k.mv_data);
  bs__lmdb_source_key(kb, 1, 0, (bs_val){"r", 1});
  k = exact(kb, 9);
  assert_int_equal(bs__lmdb_source_key_decode(&k, &stream, &table, &rid), BS_ECORRUPT);
  free(k.mv_data);
}

/* stream 0x01020304, lookup "k", table 5, replica id "r", op 9 */
static const unsigned char param_key_golden[] = {
    1, 2, 3, 4, 0, 1, 'k', 0, 0, 0, 5, 0xbd, 0x7b, 0x38, 0xf7, 0xb4, 0xaf, 0x0b, 0x35, /* XXH3 */
    0, 0, 0, 0, 0, 0, 0,   9};

static void test_param_key(void **state) {
  unsigned char kb[BS_PARAM_KEY_MAX + 1], big[BS_MAX_LOOKUP_KEY];
  bs_val lookup;
  uint32_t stream;
  uint64_t op;
  MDB_val k;
  (void)state;
  assert_int_equal(bs__lmdb_param_key(kb, 0x01020304, V("k"), 5, V("r"), 9),
                   sizeof param_key_golden);
  assert_memory_equal(kb, param_key_golden, sizeof param_key_golden);
  assert_int_equal(bs__lmdb_param_prefix(kb, 0x01020304, V("k")), 7);
  whole_only(param_key_golden, sizeof param_key_golden, dec_param_key);
  k = exact(param_key_golden, sizeof param_key_golden);
  assert_int_equal(bs__lmdb_param_key_decode(&k, &stream, &lookup, &op), BS_OK);
  assert_int_equal(stream, 0x01020304);
  val_eq(lookup, V("k"));
  assert_int_equal(op, 9);
  free(k.mv_data);
  /* The longest lookup key makes the longest key; a length field over the limit is refused. */
  memset(big, 'x', sizeof big);
  k.mv_size = bs__lmdb_param_key(kb, 1, (bs_val){big, sizeof big}, 2, V(""), 3);
  assert_int_equal(k.mv_size, BS_PARAM_KEY_MAX);
  k = exact(kb, k.mv_size);
  assert_int_equal(bs__lmdb_param_key_decode(&k, &stream, &lookup, &op), BS_OK);
  assert_int_equal(lookup.size, BS_MAX_LOOKUP_KEY);
  free(k.mv_data);
  memset(kb, 0, sizeof kb);
  kb[4] = (BS_MAX_LOOKUP_KEY + 1) >> 8;
  kb[5] = (BS_MAX_LOOKUP_KEY + 1) & 0xff;
  k = exact(kb, BS_PARAM_KEY_MAX + 1);
  assert_int_equal(bs__lmdb_param_key_decode(&k, &stream, &lookup, &op), BS_ECORRUPT);
  free(k.mv_data);
}

static void test_param_value(void **state) {
  bs_val rows_[2] = {V("{}"), V("{\"a\":1}")}, rid = V("id"), r;
  static const unsigned char golden[] = {2,   0, 'i', 'd', 2, 0,   0,   0,   2,   0,   0,   0,  '{',
                                         '}', 7, 0,   0,   0, '{', '"', 'a', '"', ':', '1', '}'};
  unsigned char buf[64], bad[sizeof golden + 1];
  const unsigned char *p;
  uint32_t n;
  size_t size = bs__lmdb_param_value_size(rid, rows_, 2);
  MDB_val v;
  (void)state;
  assert_int_equal(size, sizeof golden);
  bs__lmdb_param_value(buf, rid, rows_, 2);
  assert_memory_equal(buf, golden, sizeof golden);
  v = exact(buf, size);
  assert_int_equal(bs__lmdb_param_value_decode(&v, &r, &n, &p), BS_OK);
  assert_int_equal(n, 2);
  val_eq(r, rid);
  assert_ptr_equal(p, (unsigned char *)v.mv_data + 8);
  free(v.mv_data);
  /* a tombstone with an empty replica id: the id is present (non-NULL) and empty */
  assert_int_equal(bs__lmdb_param_value_size(V(""), NULL, 0), 6);
  bs__lmdb_param_value(buf, V(""), NULL, 0);
  v = exact(buf, 6);
  assert_int_equal(bs__lmdb_param_value_decode(&v, &r, &n, NULL), BS_OK);
  assert_int_equal(n, 0);
  val_eq(r, V(""));
  free(v.mv_data);
  whole_only(golden, sizeof golden, dec_param_value); /* truncations, a trailing byte */
  /* one row too many, a replica id over BS_MAX_REPLICA_ID */
  memcpy(bad, golden, sizeof golden);
  bad[4] = 3;
  v = exact(bad, sizeof golden);
  assert_int_equal(bs__lmdb_param_value_decode(&v, &r, &n, &p), BS_ECORRUPT);
  free(v.mv_data);
  memcpy(bad, golden, sizeof golden);
  bs__put_u16le(bad, BS_MAX_REPLICA_ID + 1);
  v = exact(bad, sizeof golden);
  assert_int_equal(bs__lmdb_param_value_decode(&v, &r, &n, &p), BS_ECORRUPT);
  free(v.mv_data);
}

static void test_bucket_state(void **state) {
  bs__bucket_state st, back;
  unsigned char buf[BS_BUCKET_STATE_FIXED + BS_MAX_BUCKET_NAME + 1];
  MDB_val v;
  (void)state;
  memset(&st, 0, sizeof st);
  st.stream = 0x01020304;
  st.checksum = 0xa0b0c0d0u;
  st.count = 5;
  st.bytes = 6;
  st.last_op = 7;
  st.generation = 8;
  st.clear_start = 9;
  st.clear_op = 10;
  st.compacted_count = 11;
  st.compacted_op = 12;
  st.reserved[2] = 13;
  st.name = V("b1");
  assert_int_equal(bs__bucket_state_size(&st), BS_BUCKET_STATE_FIXED + 2);
  bs__bucket_state_encode(buf, &st);
  {
    static const unsigned char head[] = {4, 3, 2, 1, 0xd0, 0xc0, 0xb0, 0xa0,
                                         5, 0, 0, 0, 0,    0,    0,    0};
    assert_memory_equal(buf, head, sizeof head);
    assert_int_equal(buf[24], 7);
    assert_int_equal(buf[64], 12);
    assert_int_equal(buf[88], 13);
    assert_memory_equal(buf + BS_BUCKET_STATE_FIXED, "b1", 2);
  }
  v = exact(buf, bs__bucket_state_size(&st));
  assert_int_equal(bs__bucket_state_decode(&v, &back), BS_OK);
  assert_int_equal(back.stream, st.stream);
  assert_int_equal(back.checksum, st.checksum);
  assert_int_equal(back.count, 5);
  assert_int_equal(back.bytes, 6);
  assert_int_equal(back.last_op, 7);
  assert_int_equal(back.generation, 8);
  assert_int_equal(back.clear_start, 9);
  assert_int_equal(back.clear_op, 10);
  assert_int_equal(back.compacted_count, 11);
  assert_int_equal(back.compacted_op, 12);
  assert_int_equal(back.reserved[2], 13);
  val_eq(back.name, V("b1"));
  free(v.mv_data);
  /* sizes: shorter than the fixed part, or a name over BS_MAX_BUCKET_NAME, do not decode */
  memset(buf, 'x', sizeof buf);
  for (size_t n = 0; n <= sizeof buf;
       n += (n < BS_BUCKET_STATE_FIXED + 2 || n > sizeof buf - 3) ? 1 : 97) {
    v = exact(buf, n);
    assert_int_equal(bs__bucket_state_decode(&v, &back),
                     n >= BS_BUCKET_STATE_FIXED && n < sizeof buf ? BS_OK : BS_ECORRUPT);
    if (n == BS_BUCKET_STATE_FIXED) val_eq(back.name, V(""));
    free(v.mv_data);
  }
}

/* The superseded log: golden bytes, round trips over edge op ids, every wrong size. */
static void test_superseded(void **state) {
  static const unsigned char key_golden[16] = {0, 0, 0, 0, 0, 0,    0x01, 0x02,
                                               0, 0, 0, 0, 0, 0x03, 0x04, 0x05};
  static const unsigned char value_golden[8] = {0x08, 0x07, 0x06, 0, 0, 0, 0, 0};
  static const uint64_t edge[] = {0, 1, 0xff, 0x100, (1ull << 63) - 1, 1ull << 63, UINT64_MAX};
  unsigned char kb[BS_SUP_KEY_SIZE + 1], vb[BS_SUP_VALUE_SIZE + 1];
  uint64_t bucket, old_op, new_op;
  MDB_val k, v;
  (void)state;
  bs__lmdb_sup_key(kb, 0x0102, 0x030405);
  bs__lmdb_sup_value(vb, 0x060708);
  assert_memory_equal(kb, key_golden, sizeof key_golden);
  assert_memory_equal(vb, value_golden, sizeof value_golden);
  for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
    for (size_t j = 0; j < sizeof edge / sizeof *edge; j++) {
      uint64_t nw = edge[(i + j) % (sizeof edge / sizeof *edge)];
      bs__lmdb_sup_key(kb, edge[i], edge[j]);
      bs__lmdb_sup_value(vb, nw);
      k = exact(kb, BS_SUP_KEY_SIZE);
      v = exact(vb, BS_SUP_VALUE_SIZE);
      assert_int_equal(bs__lmdb_sup_decode(&k, &v, &bucket, &old_op, &new_op), BS_OK);
      assert_true(bucket == edge[i] && old_op == edge[j] && new_op == nw);
      free(k.mv_data);
      free(v.mv_data);
    }
  }
  /* a bucket's entries sort by old op id, after every entry of a lower bucket id */
  {
    unsigned char a[BS_SUP_KEY_SIZE], b[BS_SUP_KEY_SIZE];
    bs__lmdb_sup_key(a, 1, UINT64_MAX);
    bs__lmdb_sup_key(b, 2, 0);
    assert_true(memcmp(a, b, sizeof a) < 0);
    bs__lmdb_sup_key(a, 2, 0xff);
    bs__lmdb_sup_key(b, 2, 0x100);
    assert_true(memcmp(a, b, sizeof a) < 0);
  }
  /* truncated or overlong keys and values, the empty ones included, do not decode */
  memset(kb, 0xab, sizeof kb);
  memset(vb, 0xcd, sizeof vb);
  for (size_t kn = 0; kn <= sizeof kb; kn++) {
    for (size_t vn = 0; vn <= sizeof vb; vn++) {
      k = exact(kb, kn);
      v = exact(vb, vn);
      assert_int_equal(bs__lmdb_sup_decode(&k, &v, &bucket, &old_op, &new_op),
                       kn == BS_SUP_KEY_SIZE && vn == BS_SUP_VALUE_SIZE ? BS_OK : BS_ECORRUPT);
      free(k.mv_data);
      free(v.mv_data);
    }
  }
}

/* ---- meta: stream records ---- */

static int dec_stream_key(const MDB_val *k) {
  uint32_t id;
  return bs__lmdb_stream_key_decode(k, &id);
}

static int dec_stream_rec(const MDB_val *v) {
  bs__stream_rec r;
  return bs__stream_rec_decode(v, &r);
}

static void test_stream_key(void **state) {
  static const unsigned char golden[BS_STREAM_KEY_SIZE] = {'S', 0, 0, 1, 2};
  unsigned char k[BS_STREAM_KEY_SIZE];
  MDB_val mk;
  uint32_t id = 0;
  (void)state;
  bs__lmdb_stream_key(k, 0x0102);
  assert_memory_equal(k, golden, sizeof golden);
  whole_only(golden, sizeof golden, dec_stream_key);
  mk = exact(golden, sizeof golden);
  assert_int_equal(bs__lmdb_stream_key_decode(&mk, &id), BS_OK);
  assert_int_equal(id, 0x0102);
  ((unsigned char *)mk.mv_data)[0] = 's'; /* "seq.bucket" and the like */
  assert_int_equal(bs__lmdb_stream_key_decode(&mk, &id), BS_ECORRUPT);
  free(mk.mv_data);
}

static bs__stream_rec stream_rec_sample(bs_val lsn_max) {
  bs__stream_rec r;
  memset(&r, 0, sizeof r);
  r.id = 0x01020304;
  r.state = BS_STREAM_ACTIVE;
  r.hash = BS_HASH_SHA256;
  r.snapshot_done = 1;
  r.has_checkpoint_lsn = r.has_no_checkpoint_before = 1;
  r.op_head = 0x7fffffffffffffffull; /* the largest op id */
  r.checkpoint = 9;
  r.last_checkpoint_op = 8;
  r.change_seq = 7;
  r.param_horizon = 6;
  r.param_cursor = 5;
  r.changes_fence = 4;
  r.compact_horizon = 3;
  r.next_table_id = 2;
  r.created_ms = -1;          /* before the epoch: the i64 survives */
  r.name = V("str\xc3\xb6m"); /* non-ASCII */
  r.checkpoint_lsn = V("");   /* a set LSN can be empty */
  r.resume_lsn = V("1");      /* one byte */
  r.no_checkpoint_before = lsn_max;
  r.last_error = V("");
  return r;
}

static void test_stream_record(void **state) {
  unsigned char big[BS_STREAM_STR_MAX + 1], buf[BS_STREAM_REC_MAX], bad[BS_STREAM_REC_MAX];
  static const unsigned char head[16] = {1, 2, 1, 1, 5, 0, 0, 0, 4, 3, 2, 1, 2, 0, 0, 0};
  bs__stream_rec r, back;
  size_t n;
  MDB_val v;
  (void)state;
  memset(big, 'x', sizeof big);
  r = stream_rec_sample((bs_val){big, BS_STREAM_STR_MAX});
  n = bs__stream_rec_encode(buf, &r);
  assert_int_equal(n, BS_STREAM_REC_FIXED + 5 * 2 + 6 + 0 + 1 + BS_STREAM_STR_MAX + 0);
  assert_memory_equal(buf, head, sizeof head);
  assert_int_equal(buf[16 + 7], 0x7f); /* op_head, little-endian */
  assert_int_equal(buf[80], 0xff);     /* created_ms -1 */
  assert_memory_equal(buf + BS_STREAM_REC_FIXED,
                      "\x06\0str\xc3\xb6m\0\0\x01\0"
                      "1",
                      13);
  v = exact(buf, n);
  assert_int_equal(bs__stream_rec_decode(&v, &back), BS_OK);
  assert_int_equal(back.id, r.id);
  assert_int_equal(back.state, r.state);
  assert_int_equal(back.hash, r.hash);
  assert_int_equal(back.snapshot_done, 1);
  assert_true(back.has_checkpoint_lsn && !back.has_resume_lsn && back.has_no_checkpoint_before);
  assert_int_equal(back.op_head, r.op_head);
  assert_int_equal(back.checkpoint, 9);
  assert_int_equal(back.last_checkpoint_op, 8);
  assert_int_equal(back.change_seq, 7);
  assert_int_equal(back.param_horizon, 6);
  assert_int_equal(back.param_cursor, 5);
  assert_int_equal(back.changes_fence, 4);
  assert_int_equal(back.compact_horizon, 3);
  assert_int_equal(back.next_table_id, 2);
  assert_true(back.created_ms == -1);
  val_eq(back.name, r.name);
  val_eq(back.checkpoint_lsn, V(""));
  val_eq(back.resume_lsn, V("1"));
  val_eq(back.no_checkpoint_before, r.no_checkpoint_before);
  val_eq(back.last_error, V(""));
  free(v.mv_data);
  whole_only(buf, n, dec_stream_rec);

  /* A string over BS_STREAM_STR_MAX is not encoded, and its length field is refused. */
  r.last_error = (bs_val){big, sizeof big};
  assert_int_equal(bs__stream_rec_encode(buf, &r), 0);
  r = stream_rec_sample(V(""));
  n = bs__stream_rec_encode(buf, &r);
  memcpy(bad, buf, n);
  bs__put_u16le(bad + n - 2, BS_STREAM_STR_MAX + 1); /* last_error's length */
  memset(bad + n, 'x', BS_STREAM_STR_MAX + 1);
  v = exact(bad, n + BS_STREAM_STR_MAX + 1);
  assert_int_equal(bs__stream_rec_decode(&v, &back), BS_ECORRUPT);
  free(v.mv_data);
  /* Another record version, a state outside PROCESSING..TERMINATED. */
  for (int t = 0; t < 2; t++)
    for (int x = 0; x < 256; x++) {
      int ok = t == 0 ? x == BS_STREAM_REC_VERSION
                      : x >= BS_STREAM_PROCESSING && x <= BS_STREAM_TERMINATED;
      memcpy(bad, buf, n);
      bad[t] = (unsigned char)x;
      v = exact(bad, n);
      assert_int_equal(bs__stream_rec_decode(&v, &back), ok ? BS_OK : BS_ECORRUPT);
      free(v.mv_data);
    }
}

/* ---- tables ---- */

static int dec_table_entry(const MDB_val *k) {
  static const unsigned char id[4] = {7, 0, 0, 0};
  MDB_val v = exact(id, sizeof id);
  uint32_t stream, tid;
  bs_val name;
  int rc = bs__lmdb_table_entry_decode(k, &v, &stream, &name, &tid);
  free(v.mv_data);
  return rc;
}

static void test_table_entry(void **state) {
  unsigned char kb[BS_TABLE_KEY_MAX + 1], big[BS_MAX_TABLE_NAME + 1], vb[4];
  static const unsigned char golden[] = {0, 0, 1, 2, 0xc3, 0xa9, 't'}; /* "\xc3\xa9t" */
  static const unsigned char one[] = {0, 0, 0, 9, 't'};
  bs_error err = {0, ""};
  MDB_val k, v;
  bs_val name;
  uint32_t stream, id;
  (void)state;
  assert_int_equal(bs__lmdb_table_key(kb, 0x0102, V("\xc3\xa9t"), &k, &err), BS_OK);
  assert_int_equal(k.mv_size, sizeof golden);
  assert_memory_equal(kb, golden, sizeof golden);
  bs__lmdb_table_value(vb, 0x01020304);
  assert_memory_equal(vb, "\x04\x03\x02\x01", 4);
  /* one byte, the longest name (one more does not decode); the key of an empty name does not
   * decode (table names are 1.. bytes) */
  decodes_iff(one, sizeof one, dec_table_entry, sizeof one, sizeof one);
  memset(big, 'x', sizeof big);
  assert_int_equal(bs__lmdb_table_key(kb, 1, (bs_val){big, BS_MAX_TABLE_NAME}, &k, &err), BS_OK);
  assert_int_equal(k.mv_size, BS_TABLE_KEY_MAX);
  k = exact(kb, BS_TABLE_KEY_MAX + 1);
  assert_int_equal(dec_table_entry(&k), BS_ECORRUPT);
  free(k.mv_data);
  k = exact(kb, BS_TABLE_KEY_MAX);
  v = exact(vb, sizeof vb);
  assert_int_equal(bs__lmdb_table_entry_decode(&k, &v, &stream, &name, &id), BS_OK);
  assert_int_equal(stream, 1);
  assert_int_equal(id, 0x01020304);
  val_eq(name, (bs_val){big, BS_MAX_TABLE_NAME});
  free(k.mv_data);
  free(v.mv_data);
  assert_int_equal(bs__lmdb_table_key(kb, 1, (bs_val){big, sizeof big}, &k, &err), BS_ETOOBIG);
  assert_non_null(strstr(err.msg, "BS_MAX_TABLE_NAME"));
  /* values: only 4 bytes holding an id from 1 */
  decodes_iff("\1\0\0\0\0", 5, dec_table_id, 4, 4);
  v = exact("\0\0\0\0", 4);
  assert_int_equal(bs__lmdb_table_id_decode(&v, &id, &err), BS_ECORRUPT);
  free(v.mv_data);
}

/* ---- changes ---- */

static int dec_change_value(const MDB_val *v) {
  unsigned char kb[BS_CHANGE_KEY_SIZE];
  MDB_val k = {sizeof kb, kb};
  bs__change_rec r;
  bs__lmdb_change_key(kb, 1, 2, 3);
  return bs__lmdb_change_decode(&k, v, &r);
}

/* Encodes a record of flags and the three lists the way the writer does; returns its size. */
static size_t change_encode(unsigned char *out, unsigned flags, const bs_val *l[3],
                            const size_t n[3]) {
  unsigned char *p = bs__lmdb_change_head(out, 5, -7, flags);
  size_t size = BS_CHANGE_FIXED;
  for (int i = 0; i < 3; i++) {
    size_t bytes = 0;
    p = bs__lmdb_change_count(p, (uint32_t)n[i]);
    for (size_t j = 0; j < n[i]; j++) {
      p = bs__lmdb_change_item(p, l[i][j]);
      bytes += l[i][j].size;
    }
    size += bs__lmdb_change_list_size(n[i], bytes);
  }
  assert_int_equal((size_t)(p - out), size);
  return size;
}

static void test_change_record(void **state) {
  static const unsigned char key_golden[BS_CHANGE_KEY_SIZE] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
                                                               0, 2, 0, 0, 0, 0, 0, 0, 0, 3};
  static const unsigned char golden[] = {
      5,    0,    0,    0,    0,    0,    0,    0, 0xf9,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, /* first 5, time -7, checkpoint */
      1,    0,    0,    0,    1,    0,    'b',     /* buckets: "b" */
      0,    0,    0,    0,                         /* no lookups */
      1,    0,    0,    0,    0,    0};            /* users: "" */
  static unsigned char big[BS_MAX_BUCKET_NAME + 1], buf[4096];
  bs_val buckets[2] = {V("b"), V("\xe2\x82\xac")}, users[1] = {V("")};
  const bs_val *l[3] = {buckets, NULL, users};
  size_t n[3] = {1, 0, 1}, size;
  unsigned char kb[BS_CHANGE_KEY_SIZE];
  const unsigned char *q;
  bs__change_rec r;
  MDB_val k, v;
  (void)state;
  bs__lmdb_change_key(kb, 1, 2, 3);
  assert_memory_equal(kb, key_golden, sizeof kb);
  size = change_encode(buf, BS_CHANGE_CHECKPOINT, l, n);
  assert_int_equal(size, sizeof golden);
  assert_memory_equal(buf, golden, sizeof golden);
  whole_only(golden, sizeof golden, dec_change_value);
  k = exact(kb, sizeof kb);
  v = exact(golden, sizeof golden);
  assert_int_equal(bs__lmdb_change_decode(&k, &v, &r), BS_OK);
  assert_int_equal(r.stream, 1);
  assert_int_equal(r.last, 2);
  assert_int_equal(r.seq, 3);
  assert_int_equal(r.first, 5);
  assert_true(r.time_ms == -7);
  assert_int_equal(r.flags, BS_CHANGE_CHECKPOINT);
  assert_int_equal(r.buckets.n, 1);
  assert_int_equal(r.lookups.n, 0);
  assert_int_equal(r.users.n, 1);
  q = r.buckets.p;
  val_eq(bs__lmdb_change_next(&q), V("b"));
  q = r.users.p;
  val_eq(bs__lmdb_change_next(&q), V(""));
  free(v.mv_data);
  /* a key of another size; flags other than the three known */
  for (size_t kn = BS_CHANGE_KEY_SIZE - 1; kn <= BS_CHANGE_KEY_SIZE + 1; kn += 2) {
    unsigned char longer[BS_CHANGE_KEY_SIZE + 1] = {0};
    MDB_val bk = exact(longer, kn);
    v = exact(golden, sizeof golden);
    assert_int_equal(bs__lmdb_change_decode(&bk, &v, &r), BS_ECORRUPT);
    free(bk.mv_data);
    free(v.mv_data);
  }
  for (unsigned f = 0; f < 256; f++) {
    memcpy(buf, golden, sizeof golden);
    buf[16] = (unsigned char)f;
    v = exact(buf, sizeof golden);
    assert_int_equal(bs__lmdb_change_decode(&k, &v, &r), f < 8 ? BS_OK : BS_ECORRUPT);
    free(v.mv_data);
  }
  /* the longest item of each list decodes, one byte more does not (non-ASCII items too) */
  memset(big, 'x', sizeof big);
  for (int list = 0; list < 3; list++) {
    static const size_t max[3] = {BS_MAX_BUCKET_NAME, BS_MAX_LOOKUP_KEY, BS_MAX_USER_ID};
    bs_val items[2] = {V("\xe2\x82\xac"), {big, max[list]}};
    const bs_val *ll[3] = {items, items, items};
    size_t nn[3] = {0, 0, 0};
    nn[list] = 2;
    v.mv_size = change_encode(buf, 0, ll, nn);
    v.mv_data = buf;
    assert_int_equal(bs__lmdb_change_decode(&k, &v, &r), BS_OK);
    items[1].size++;
    v = exact(buf, change_encode(buf, 0, ll, nn));
    assert_int_equal(bs__lmdb_change_decode(&k, &v, &r), BS_ECORRUPT);
    free(v.mv_data);
  }
  /* too many buckets or lookups (the cap, lifecycle.c) is refused: the writer sets the flag
   * instead; one fewer decodes; users have no cap */
  {
    size_t enough = bs__changes_enough();
    bs_val *many = calloc(enough, sizeof *many);
    unsigned char *mbuf = malloc(BS_CHANGE_FIXED + 12 + 2 * enough);
    assert_non_null(many);
    assert_non_null(mbuf);
    for (size_t i = 0; i < enough; i++) many[i] = V("");
    for (int list = 0; list < 3; list++)
      for (size_t m = enough - 1; m <= enough; m++) {
        const bs_val *ll[3] = {many, many, many};
        size_t nn[3] = {0, 0, 0};
        nn[list] = m;
        v = exact(mbuf, change_encode(mbuf, 0, ll, nn));
        assert_int_equal(bs__lmdb_change_decode(&k, &v, &r),
                         list == 2 || m < enough ? BS_OK : BS_ECORRUPT);
        free(v.mv_data);
      }
    free(mbuf);
    free(many);
  }
  free(k.mv_data);
}

/* ---- source records ---- */

/* The replica id and the table's name of the records below (a code's bit 0 clear stands for the
 * id, a first member's type code 0 for the table's name). */
#define SREC_RID   V("r1")
#define SREC_TABLE V("t")

/* data | 1 member | 1 lookup | bucket 0x0102, op 0x0304, type "t" (the table), id "" | "" | "{}" */
static const unsigned char srec_golden[] = {
    2 | 1 << 3 | 1 << 6, /* head: data, 1 member, 1 lookup (no mark) */
    0x82,
    0x02,
    0x84,
    0x06, /* bucket id, op id (varints) */
    1,
    0, /* code (type code 0: the table's name; bit 0: an id), id length 0 */
    0,
    '{',
    '}'}; /* lookup "", data */
/* The same record in format 2 (what the migration from format 1 writes). */
static const unsigned char srec2_golden[] = {
    2,    1,    1,          /* flags, n members, n keys (no mark: flag 4 unset) */
    0x82, 0x02, 0x84, 0x06, /* bucket id, op id (varints) */
    2,    1,    't',        /* type code (1 byte + 1), id code (0 bytes + 1: not rid) */
    0,    '{',  '}'};       /* lookup "", data */

/* Decodes v (of table SREC_TABLE) and compares every field with r. */
static void srec_check(const MDB_val *v, const bs__srec *r) {
  bs__member m[300];
  bs_val lk[8];
  bs__srec back;
  assert_int_equal(bs__lmdb_srec_head(v, &back), BS_OK);
  assert_true(back.exists);
  assert_int_equal(back.soft, r->soft);
  assert_int_equal(back.mark, r->mark);
  assert_int_equal(back.has_data, r->has_data);
  assert_int_equal(back.nm, r->nm);
  assert_int_equal(back.nl, r->nl);
  assert_true(back.nm <= 300 && back.nl <= 8);
  assert_int_equal(bs__lmdb_srec_decode(v, SREC_TABLE, SREC_RID, &back, m, lk), BS_OK);
  for (uint32_t i = 0; i < r->nm; i++) {
    assert_int_equal(back.m[i].bucket, r->m[i].bucket);
    assert_int_equal(back.m[i].op, r->m[i].op);
    val_eq(back.m[i].object_type, r->m[i].object_type);
    val_eq(back.m[i].object_id, r->m[i].object_id);
  }
  for (uint32_t i = 0; i < r->nl; i++) val_eq(back.lk[i], r->lk[i]);
  if (r->has_data) val_eq(back.data, r->data);
}

/* Encodes r, checks the size, decodes an exact copy and compares every field. */
static MDB_val srec_round_trip(const bs__srec *r) {
  size_t n = bs__lmdb_srec_size(r, SREC_TABLE, SREC_RID);
  unsigned char *buf = malloc(n);
  MDB_val v;
  assert_non_null(buf);
  bs__lmdb_srec_encode(buf, r, SREC_TABLE, SREC_RID);
  v = exact(buf, n);
  free(buf);
  srec_check(&v, r);
  return v;
}

static int count_member(uint64_t bucket, uint64_t op, void *payload) {
  uint64_t *seen = payload;
  seen[0]++;
  seen[1] += bucket;
  seen[2] += op;
  return seen[0] == seen[3] ? BS_ENOMEM : BS_OK; /* seen[3]: stop at that member */
}

static void test_srec_golden(void **state) {
  bs__member m = {0x0102, 0x0304, V("t"), V("")};
  bs_val lk = V("");
  bs__srec r = {1, 0, 0, &m, 1, &lk, 1, 1, V("{}")};
  uint64_t seen[4] = {0, 0, 0, 0};
  unsigned char buf[sizeof srec_golden];
  MDB_val v;
  (void)state;
  assert_int_equal(bs__lmdb_srec_size(&r, SREC_TABLE, SREC_RID), sizeof srec_golden);
  bs__lmdb_srec_encode(buf, &r, SREC_TABLE, SREC_RID);
  assert_memory_equal(buf, srec_golden, sizeof srec_golden);
  v = srec_round_trip(&r);
  assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_OK);
  assert_int_equal(seen[0], 1);
  assert_int_equal(seen[1], 0x0102);
  assert_int_equal(seen[2], 0x0304);
  free(v.mv_data);
}

static void test_srec_edges(void **state) {
  static bs__member m[300];
  static char big[BS_MAX_OBJECT_NAME], key[BS_MAX_LOOKUP_KEY];
  bs_val lk[4] = {V(""), V("\xc3\xa9"), V("1"), V("1.0")};
  bs__srec none = {0}, soft = {0}, empty_data = {0}, r = {0};
  uint64_t seen[4] = {0, 0, 0, 2};
  MDB_val v;
  (void)state;
  memset(big, 0xff, sizeof big);
  memset(key, 'k', sizeof key);
  /* nothing at all; a soft-deleted record's mark; data present but empty: the head alone */
  none.exists = 1;
  v = srec_round_trip(&none);
  assert_int_equal(v.mv_size, 1);
  free(v.mv_data);
  soft.exists = soft.soft = 1;
  soft.mark = UINT64_C(0x7fffffffffffffff);
  free(srec_round_trip(&soft).mv_data);
  empty_data.exists = empty_data.has_data = 1;
  empty_data.data = V("");
  v = srec_round_trip(&empty_data);
  assert_int_equal(v.mv_size, 1);
  free(v.mv_data);
  /* maximum lengths, non-ASCII bytes, empty ids, the table's name, counts past the head's, many
   * members */
  for (uint32_t i = 0; i < 300; i++) {
    m[i].bucket = UINT64_MAX - i;
    m[i].op = i;
    m[i].object_type = i % 3 ? V("t\xc3\xa9") : i % 5 ? (bs_val){big, sizeof big} : SREC_TABLE;
    m[i].object_id = i % 2 ? V("") : i % 4 ? (bs_val){big, i} : SREC_RID;
  }
  r.exists = r.has_data = 1;
  r.m = m;
  r.nm = 300;
  lk[3] = (bs_val){key, sizeof key};
  r.lk = lk;
  r.nl = 4;
  r.data = V("\x00\xff");
  v = srec_round_trip(&r);
  /* the iterator stops at fn's non-zero return and returns it */
  assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_ENOMEM);
  assert_int_equal(seen[0], 2);
  assert_int_equal(seen[1], UINT64_MAX + (UINT64_MAX - 1));
  free(v.mv_data);
  /* a first member of another type than the table's, counts the head holds (6 and 2) */
  m[0].object_type = V("other");
  r.nm = 6;
  r.nl = 2;
  v = srec_round_trip(&r);
  assert_int_equal(((const unsigned char *)v.mv_data)[0], 2 | 6 << 3 | 2 << 6);
  free(v.mv_data);
}

/* Every prefix of a record without data, the record plus one byte, counts that cannot fit, a
 * count in a varint the head could hold, a mark flag without a mark, an overlong varint:
 * BS_ECORRUPT from the decoder and the iterator alike. */
static void test_srec_malformed(void **state) {
  bs__member m[2] = {{1, 2, V("type"), V("id")}, {3, 4, V(""), V("x")}}, mm[2];
  bs_val lk[2] = {V("k"), V("")}, lkb[2];
  bs__srec r = {1, 0, 0, m, 2, lk, 2, 0, {NULL, 0}}, back;
  unsigned char buf[128];
  size_t n = bs__lmdb_srec_size(&r, SREC_TABLE, SREC_RID);
  uint64_t seen[4] = {0, 0, 0, 99};
  MDB_val v;
  (void)state;
  assert_true(n + 1 <= sizeof buf);
  bs__lmdb_srec_encode(buf, &r, SREC_TABLE, SREC_RID);
  buf[n] = 0;
  for (size_t len = 0; len <= n + 1; len++) {
    int want = len == n ? BS_OK : BS_ECORRUPT, rc;
    v = exact(buf, len);
    rc = bs__lmdb_srec_head(&v, &back);
    if (rc == BS_OK) rc = bs__lmdb_srec_decode(&v, SREC_TABLE, SREC_RID, &back, mm, lkb);
    assert_int_equal(rc, want);
    assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), want);
    free(v.mv_data);
  }
  /* with the data flag the rest is data: only a cut into the lookups is refused */
  assert_int_equal(buf[0], 2 << 3 | 2 << 6);
  buf[0] |= 2;
  v = exact(buf, n - 1);
  assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_ECORRUPT);
  free(v.mv_data);
  v = exact(buf, n + 1);
  assert_int_equal(bs__lmdb_srec_head(&v, &back), BS_OK);
  assert_int_equal(bs__lmdb_srec_decode(&v, SREC_TABLE, SREC_RID, &back, mm, lkb), BS_OK);
  val_eq(back.data, (bs_val){"", 1});
  free(v.mv_data);
  buf[0] = 2 << 3 | 1 << 6; /* one lookup less: a byte left after the record */
  v = exact(buf, n);
  assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_ECORRUPT);
  free(v.mv_data);
  buf[0] = 6 << 3 | 2 << 6; /* members that cannot fit */
  v = exact(buf, n);
  assert_int_equal(bs__lmdb_srec_head(&v, &back), BS_ECORRUPT);
  assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_ECORRUPT);
  free(v.mv_data);
  {
    static const unsigned char no_mark[] = {4, 0, 0, 0},
                               small_varint[] = {7 << 3, 2, 1, 2, 1, 3, 4, 1},
                               overlong[] = {7 << 3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                             0x80,   0x80, 0x80, 0x80, 0x01, 0};
    v = exact(no_mark, sizeof no_mark); /* flag 4, mark 0 */
    assert_int_equal(bs__lmdb_srec_head(&v, &back), BS_ECORRUPT);
    free(v.mv_data);
    v = exact(small_varint, sizeof small_varint); /* 2 members, in a varint */
    assert_int_equal(bs__lmdb_srec_head(&v, &back), BS_ECORRUPT);
    assert_int_equal(bs__lmdb_srec_members(&v, count_member, seen), BS_ECORRUPT);
    free(v.mv_data);
    v = exact(overlong, sizeof overlong); /* an 11-byte member count */
    assert_int_equal(bs__lmdb_srec_head(&v, &back), BS_ECORRUPT);
    free(v.mv_data);
  }
}

/* The migrations' conversions: a format-1 record becomes the format-2 record of the same fields
 * (the golden one byte for byte), which becomes the format-3 one (likewise), and each decodes
 * to the fields written; every prefix of a format-1 or format-2 record is refused. */
static void test_srec_convert(void **state) {
  bs__member gm = {0x0102, 0x0304, V("t"), V("")};
  bs__member m[3] = {{7, 1u << 20, V("t"), V("r1")},
                     {UINT64_MAX, UINT64_MAX, V("todos"), V("other")},
                     {1, 2, V(""), V("r1")}};
  bs__member m2[2] = {{7, 1, V("todos"), V("r1")}, {8, 2, V("t"), V("r1")}};
  bs_val lk[2] = {V("k\xc3\xa9"), V("")}, glk = V("");
  bs__srec golden = {1, 0, 0, &gm, 1, &glk, 1, 1, V("{}")};
  bs__srec rs[] = {{1, 0, 0, m, 3, lk, 2, 1, V("\x00\xff")},
                   {1, 0, 0, m2, 2, NULL, 0, 0, {NULL, 0}},
                   {1, 1, UINT64_C(0x123456789), NULL, 0, NULL, 0, 0, {NULL, 0}},
                   {1, 0, 0, NULL, 0, NULL, 0, 0, {NULL, 0}}};
  unsigned char kb[10] = {0, 0, 0, 1, 0, 0, 0, 1, 'r', '1'}, in[512], mid[1100], out[2300];
  MDB_val k = {sizeof kb, kb}, v;
  size_t n, mn, on;
  (void)state;
  v = (MDB_val){srec1_encode(in, &golden), in};
  assert_true(bs__lmdb_srec1_bound(&v) <= sizeof mid);
  assert_int_equal(bs__lmdb_srec1_convert(&k, &v, mid, &mn), BS_OK);
  assert_int_equal(mn, sizeof srec2_golden);
  assert_memory_equal(mid, srec2_golden, mn);
  v = (MDB_val){mn, mid};
  assert_int_equal(bs__lmdb_srec2_convert(&k, &v, SREC_TABLE, out, &on), BS_OK);
  assert_int_equal(on, sizeof srec_golden);
  assert_memory_equal(out, srec_golden, on);
  for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
    const bs__srec *r = &rs[i];
    n = srec1_encode(in, r);
    v = (MDB_val){n, in};
    assert_true(bs__lmdb_srec1_bound(&v) <= sizeof mid);
    assert_int_equal(bs__lmdb_srec1_convert(&k, &v, mid, &mn), BS_OK);
    v = (MDB_val){mn, mid};
    assert_true(bs__lmdb_srec2_bound(&v) <= sizeof out);
    assert_int_equal(bs__lmdb_srec2_convert(&k, &v, SREC_TABLE, out, &on), BS_OK);
    assert_int_equal(on, bs__lmdb_srec_size(r, SREC_TABLE, SREC_RID));
    v = exact(out, on);
    srec_check(&v, r);
    free(v.mv_data);
  }
  /* the first record: without data, every prefix and one byte more are not format 1 or 2 */
  rs[0].has_data = 0;
  n = srec1_encode(in, &rs[0]);
  in[n] = 0;
  for (size_t len = 0; len <= n + 1; len++) {
    v = exact(in, len);
    assert_int_equal(bs__lmdb_srec1_convert(&k, &v, mid, &mn), len == n ? BS_OK : BS_ECORRUPT);
    free(v.mv_data);
  }
  v = (MDB_val){n, in};
  assert_int_equal(bs__lmdb_srec1_convert(&k, &v, mid, &mn), BS_OK);
  mid[mn] = 0;
  for (size_t len = 0; len <= mn + 1; len++) {
    v = exact(mid, len);
    assert_int_equal(bs__lmdb_srec2_convert(&k, &v, SREC_TABLE, out, &on),
                     len == mn ? BS_OK : BS_ECORRUPT);
    free(v.mv_data);
  }
  mid[0] = 8; /* no such flag in format 2 */
  v = (MDB_val){mn, mid};
  assert_int_equal(bs__lmdb_srec2_convert(&k, &v, SREC_TABLE, out, &on), BS_ECORRUPT);
  in[0] = 4; /* no such flag in format 1 */
  v = (MDB_val){n, in};
  assert_int_equal(bs__lmdb_srec1_convert(&k, &v, mid, &mn), BS_ECORRUPT);
}

/* ---- cqueue and softdel ---- */

static void test_cqueue_entry(void **state) {
  static const unsigned char golden[BS_CQUEUE_KEY_SIZE] = {0,    0,    0,    7,    0xff, 0xff,
                                                           0xff, 0xff, 0xff, 0xff, 0xff, 0xfe};
  unsigned char k[BS_CQUEUE_KEY_SIZE + 1];
  uint32_t stream;
  uint64_t bucket;
  MDB_val mk, mv;
  (void)state;
  bs__lmdb_cqueue_key(k, 7, UINT64_MAX - 1);
  assert_memory_equal(k, golden, sizeof golden);
  for (size_t n = 0; n <= sizeof k; n++) { /* only the exact key size, only an empty value */
    for (size_t vn = 0; vn <= 1; vn++) {
      k[BS_CQUEUE_KEY_SIZE] = 0;
      mk = exact(k, n);
      mv = exact("x", vn);
      assert_int_equal(bs__lmdb_cqueue_decode(&mk, &mv, &stream, &bucket),
                       n == BS_CQUEUE_KEY_SIZE && vn == 0 ? BS_OK : BS_ECORRUPT);
      if (n == BS_CQUEUE_KEY_SIZE && vn == 0) {
        assert_int_equal(stream, 7);
        assert_true(bucket == UINT64_MAX - 1);
      }
      free(mk.mv_data);
      free(mv.mv_data);
    }
  }
  /* the stream every per-stream key starts with, the bucket every bucket-keyed key starts with */
  for (size_t n = 0; n <= 9; n++) {
    mk = exact(golden, n);
    stream = 0;
    bucket = 0;
    assert_int_equal(bs__lmdb_key_stream(&mk, &stream), n >= 4 ? BS_OK : BS_ECORRUPT);
    assert_int_equal(bs__lmdb_in_stream(&mk, 7), n >= 4);
    assert_int_equal(bs__lmdb_in_stream(&mk, 8), 0);
    assert_int_equal(bs__lmdb_key_bucket(&mk, &bucket), n >= 8 ? BS_OK : BS_ECORRUPT);
    assert_int_equal(stream, n >= 4 ? 7 : 0);
    assert_true(bucket == (n >= 8 ? 0x00000007ffffffffull : 0));
    free(mk.mv_data);
  }
}

static void test_softdel_entry(void **state) {
  static const unsigned char src_golden[] = {0, 0, 0, 3,    0,
                                             0, 0, 2, 0xc3, 0xbc}; /* rid "\xc3\xbc" */
  static const unsigned char golden[] = {0, 0, 0, 3, 0, 0, 0, 0,    0,
                                         0, 1, 0, 0, 0, 0, 2, 0xc3, 0xbc};
  unsigned char k[BS_SOFTDEL_KEY_MAX + 1], src[BS_MAX_REPLICA_ID + 9], sk[BS_SOFTDEL_KEY_MAX - 8];
  uint32_t stream;
  uint64_t mark;
  MDB_val mk, mv = {0, src}, back;
  size_t n;
  (void)state;
  n = bs__lmdb_softdel_key(k, 0x100, (bs_val){src_golden, sizeof src_golden});
  assert_int_equal(n, sizeof golden);
  assert_memory_equal(k, golden, sizeof golden);
  mk = exact(golden, sizeof golden);
  assert_int_equal(bs__lmdb_softdel_decode(&mk, &mv, &stream, &mark, sk, &back), BS_OK);
  assert_int_equal(stream, 3);
  assert_int_equal(mark, 0x100);
  assert_int_equal(back.mv_size, sizeof src_golden);
  assert_memory_equal(back.mv_data, src_golden, sizeof src_golden);
  free(mk.mv_data);
  /* an empty replica id (the shortest key) and the longest one; one byte more is refused */
  for (size_t rid = 0; rid <= BS_MAX_REPLICA_ID + 1; rid += rid == 1 ? BS_MAX_REPLICA_ID - 1 : 1) {
    memset(src, 'r', sizeof src);
    bs__put_u32be(src, 9);
    bs__put_u32be(src + 4, 1);
    n = bs__lmdb_softdel_key(k, UINT64_MAX, (bs_val){src, 8 + rid});
    assert_int_equal(n, 16 + rid);
    mk = exact(k, n);
    assert_int_equal(bs__lmdb_softdel_decode(&mk, &mv, &stream, &mark, sk, &back),
                     rid <= BS_MAX_REPLICA_ID ? BS_OK : BS_ECORRUPT);
    if (rid <= BS_MAX_REPLICA_ID) {
      assert_true(mark == UINT64_MAX);
      assert_int_equal(back.mv_size, 8 + rid);
      assert_memory_equal(back.mv_data, src, 8 + rid);
    }
    free(mk.mv_data);
  }
  /* shorter than a key with an empty replica id, table id 0, a value */
  dec_value = mv;
  decodes_iff(golden, 15, dec_softdel_key, 16, 16);
  memcpy(k, golden, sizeof golden);
  bs__put_u32be(k + 12, 0);
  mk = exact(k, sizeof golden);
  assert_int_equal(bs__lmdb_softdel_decode(&mk, &mv, &stream, &mark, sk, &back), BS_ECORRUPT);
  free(mk.mv_data);
  mk = exact(golden, sizeof golden);
  mv = exact("x", 1);
  assert_int_equal(bs__lmdb_softdel_decode(&mk, &mv, &stream, &mark, sk, &back), BS_ECORRUPT);
  free(mk.mv_data);
  free(mv.mv_data);
}

/* ---- wcp ---- */

static int dec_wcp_rec(const MDB_val *v) {
  bs__wcp_rec r;
  return bs__lmdb_wcp_rec_decode(v, &r);
}

static void test_wcp_keys(void **state) {
  static const unsigned char custom_golden[] = {'C', 0, 0, 0, 2, 0, 1, 'e', 'u', 0xc3, 0xa4};
  unsigned char kb[BS_WCP_KEY_MAX + 1], big[BS_WCP_KEY_MAX + 1];
  static const int tags[3] = {BS_WCP_MANAGED_TAG, BS_WCP_PENDING_TAG, BS_WCP_HWM_TAG};
  bs_error err = {0, ""};
  bs__wcp_key wk;
  MDB_val k;
  (void)state;
  memset(big, 'u', sizeof big);
  for (int t = 0; t < 3; t++) {
    k = bs__lmdb_wcp_user_key(kb, tags[t], V("u\xc3\xa4"));
    assert_int_equal(k.mv_size, 4);
    assert_memory_equal(kb + 1, "u\xc3\xa4", 3);
    assert_int_equal(kb[0], tags[t]);
    k = exact(kb, k.mv_size);
    assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_OK);
    assert_int_equal(wk.tag, tags[t]);
    val_eq(wk.user, V("u\xc3\xa4"));
    free(k.mv_data);
    /* "" and the longest user id decode; one byte more does not */
    for (size_t n = 0; n <= BS_MAX_USER_ID + 1; n += n == 0 ? BS_MAX_USER_ID : 1) {
      k = bs__lmdb_wcp_user_key(kb, tags[t], (bs_val){big, n});
      k = exact(kb, k.mv_size);
      assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), n <= BS_MAX_USER_ID ? BS_OK : BS_ECORRUPT);
      if (n <= BS_MAX_USER_ID) assert_int_equal(wk.user.size, n);
      free(k.mv_data);
    }
  }
  /* no key, an unknown tag */
  k = exact("", 0);
  assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_ECORRUPT);
  free(k.mv_data);
  k = exact("Xu", 2);
  assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_ECORRUPT);
  free(k.mv_data);
  /* custom: golden bytes, every truncation of the fixed part, an event length past the end */
  assert_int_equal(bs__lmdb_wcp_custom_key(kb, &k, 2, V("e"), V("u\xc3\xa4"), &err), BS_OK);
  assert_int_equal(k.mv_size, sizeof custom_golden);
  assert_memory_equal(kb, custom_golden, sizeof custom_golden);
  decodes_iff(custom_golden, sizeof custom_golden, dec_wcp_key, 8, sizeof custom_golden);
  k = exact(custom_golden, sizeof custom_golden);
  assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_OK);
  assert_int_equal(wk.tag, BS_WCP_CUSTOM_TAG);
  assert_int_equal(wk.stream, 2);
  val_eq(wk.event, V("e"));
  val_eq(wk.user, V("u\xc3\xa4"));
  free(k.mv_data);
  assert_int_equal(bs__lmdb_wcp_custom_key(kb, &k, 2, V(""), V(""), &err), BS_OK);
  k = exact(kb, k.mv_size);
  assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_OK);
  val_eq(wk.event, V(""));
  val_eq(wk.user, V(""));
  free(k.mv_data);
  /* the longest key fits, one byte more is BS_ETOOBIG (encoder) and BS_ECORRUPT (decoder) */
  assert_int_equal(bs__lmdb_wcp_custom_key(kb, &k, 2, (bs_val){big, 255},
                                           (bs_val){big, BS_WCP_KEY_MAX - 7 - 255}, &err),
                   BS_OK);
  assert_int_equal(k.mv_size, BS_WCP_KEY_MAX);
  assert_int_equal(bs__lmdb_wcp_custom_key(kb, &k, 2, (bs_val){big, 255},
                                           (bs_val){big, BS_WCP_KEY_MAX - 7 - 254}, &err),
                   BS_ETOOBIG);
  memcpy(big, custom_golden, 7);
  k = exact(big, BS_WCP_KEY_MAX + 1);
  assert_int_equal(bs__lmdb_wcp_key_decode(&k, &wk), BS_ECORRUPT);
  free(k.mv_data);
}

static void test_wcp_values(void **state) {
  static const unsigned char golden[] = {
      9, 0,   0,   0,   0, 0,   0,   0, 3, 123, 0, 0, 0, 0, 0, 0, 0, /* id, flags, requested_at */
      1, 'x',                                                        /* processed at "x" */
      2, 0,                                                          /* two heads */
      2, 0,   'c', '1', 2, 'L', '1', 0, 0, 0};                       /* c1 at L1, "" at "" */
  bs_head heads[2] = {{V("c1"), V("L1")}, {V(""), V("")}};
  unsigned char buf[64], big[23 + BS_MAX_CONNECTION_NAME + 1 + 1];
  bs__wcp_rec r, back;
  const unsigned char *q;
  bs_val conn, lsn;
  uint64_t id;
  int64_t at;
  MDB_val v;
  (void)state;
  memset(&r, 0, sizeof r);
  r.id = 9;
  r.flags = BS_WCP_HAS_REQUESTED | BS_WCP_PROCESSED;
  r.requested_at = 123;
  r.processed_lsn = V("x");
  assert_int_equal(bs__lmdb_wcp_rec_size(&r, heads, 2), sizeof golden);
  bs__lmdb_wcp_rec_encode(buf, &r, heads, 2);
  assert_memory_equal(buf, golden, sizeof golden);
  whole_only(golden, sizeof golden, dec_wcp_rec);
  v = exact(golden, sizeof golden);
  assert_int_equal(bs__lmdb_wcp_rec_decode(&v, &back), BS_OK);
  assert_int_equal(back.id, 9);
  assert_int_equal(back.flags, r.flags);
  assert_true(back.requested_at == 123);
  val_eq(back.processed_lsn, V("x"));
  assert_int_equal(back.n_heads, 2);
  q = back.heads;
  bs__lmdb_wcp_head_next(&q, &conn, &lsn);
  val_eq(conn, V("c1"));
  val_eq(lsn, V("L1"));
  bs__lmdb_wcp_head_next(&q, &conn, &lsn);
  val_eq(conn, V(""));
  val_eq(lsn, V(""));
  /* re-encoded with its own heads, a decoded record is the same bytes */
  assert_int_equal(bs__lmdb_wcp_rec_size(&back, NULL, 0), sizeof golden);
  bs__lmdb_wcp_rec_encode(buf, &back, NULL, 0);
  assert_memory_equal(buf, golden, sizeof golden);
  free(v.mv_data);
  /* unknown flags; a connection over BS_MAX_CONNECTION_NAME (the bytes are there) */
  memcpy(buf, golden, sizeof golden);
  buf[8] = 4;
  v = exact(buf, sizeof golden);
  assert_int_equal(bs__lmdb_wcp_rec_decode(&v, &back), BS_ECORRUPT);
  free(v.mv_data);
  memset(big, 'c', sizeof big);
  memcpy(big, golden, 19);
  bs__put_u16le(big + 19, 1);
  bs__put_u16le(big + 21, BS_MAX_CONNECTION_NAME + 1);
  big[sizeof big - 1] = 0; /* lsn length 0 */
  v = exact(big, 23 + BS_MAX_CONNECTION_NAME + 1 + 1);
  assert_int_equal(bs__lmdb_wcp_rec_decode(&v, &back), BS_ECORRUPT);
  free(v.mv_data);
  /* 'H': 8 bytes; 'C': 8 bytes (persistent) or 16 with a requested_at >= 0 */
  assert_int_equal(bs__lmdb_wcp_hwm_value(buf, UINT64_MAX), 8);
  decodes_iff(buf, 17, dec_wcp_hwm, 8, 8);
  assert_int_equal(bs__lmdb_wcp_custom_value(buf, 5, -1), 8);
  assert_int_equal(bs__lmdb_wcp_custom_value(buf, 5, 0), 16);
  for (size_t n = 0; n <= 17; n++) {
    v = exact(buf, n);
    assert_int_equal(bs__lmdb_wcp_custom_decode(&v, &id, &at),
                     n == 8 || n == 16 ? BS_OK : BS_ECORRUPT);
    if (n == 8 || n == 16) {
      assert_int_equal(id, 5);
      assert_true(at == (n == 8 ? -1 : 0));
    }
    free(v.mv_data);
  }
  bs__put_u64le(buf + 8, (uint64_t)-2);
  v = exact(buf, 16);
  assert_int_equal(bs__lmdb_wcp_custom_decode(&v, &id, &at), BS_ECORRUPT);
  free(v.mv_data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_key),
      cmocka_unit_test(test_op_value),
      cmocka_unit_test(test_op_value_malformed),
      cmocka_unit_test(test_op_chunk),
      cmocka_unit_test(test_op_chunk_compact),
      cmocka_unit_test(test_bucket_entry),
      cmocka_unit_test(test_meta_records),
      cmocka_unit_test(test_source_key),
      cmocka_unit_test(test_bucket_state),
      cmocka_unit_test(test_param_key),
      cmocka_unit_test(test_param_value),
      cmocka_unit_test(test_superseded),
      cmocka_unit_test(test_stream_key),
      cmocka_unit_test(test_stream_record),
      cmocka_unit_test(test_table_entry),
      cmocka_unit_test(test_change_record),
      cmocka_unit_test(test_srec_golden),
      cmocka_unit_test(test_srec_edges),
      cmocka_unit_test(test_srec_malformed),
      cmocka_unit_test(test_srec_convert),
      cmocka_unit_test(test_cqueue_entry),
      cmocka_unit_test(test_softdel_entry),
      cmocka_unit_test(test_wcp_keys),
      cmocka_unit_test(test_wcp_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
