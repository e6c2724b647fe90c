/*
 * test_writer.c: the LMDB writer (lmdb_write.c) against contract.md section 4, checked by reading the raw
 * LMDB sub-databases (layout in internal.h), so these tests do not depend on the read module.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lmdb_internal.h"
#include "util_contract.h"

/* ---- Fixture ------------------------------------------------------------------------------- */

typedef struct fx {
  char dir[64], path[96];
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  uint32_t stream;
} fx;

static void fx_open_db(fx *f) {
  bs_error e = {0, ""};
  int rc = bs_open(&f->db, f->path, NULL, &e);
  if (rc) fprintf(stderr, "bs_open: %s\n", e.msg);
  assert_int_equal(rc, BS_OK);
}

static void fx_writer(fx *f, int snapshot) {
  bs_writer_options o = BS_WRITER_OPTIONS_INIT;
  o.snapshot = snapshot;
  if (f->w) bs_writer_close(f->w);
  f->w = NULL;
  assert_int_equal(bs_writer_open(&f->w, f->st, &o, NULL), BS_OK);
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  strcpy(f->dir, "/tmp/bs_writer_XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->path, sizeof f->path, "%s/db", f->dir);
  fx_open_db(f);
  assert_int_equal(bs_stream_create(&f->stream, f->db, "s1", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&f->st, f->db, f->stream, NULL), BS_OK);
  fx_writer(f, 0);
  *state = f;
  return 0;
}

static void fx_close(fx *f) {
  bs_writer_close(f->w);
  bs_storage_close(f->st);
  bs_close(f->db);
  f->w = NULL;
  f->st = NULL;
  f->db = NULL;
}

static void fx_reopen(fx *f) {
  fx_close(f);
  fx_open_db(f);
  assert_int_equal(bs_storage_open(&f->st, f->db, f->stream, NULL), BS_OK);
  fx_writer(f, 0);
}

static int teardown(void **state) {
  fx *f = *state;
  char cmd[128];
  fx_close(f);
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  if (system(cmd) != 0) return -1;
  free(f);
  return 0;
}

/* ---- Save helpers ---------------------------------------------------------------------------- */

static bs_val V(const char *s) {
  return bs__val_str(s);
}

/* rows: "bucket:type:id:data" strings; NULL-terminated */
static int save_v(fx *f, bs_tag tag, const char *table, const char *before, const char *after,
                  const char *const *rows, const char *const *lookups) {
  bs_row r[16];
  bs_lookup l[8];
  bs_val params[8];
  char buf[16][4][64];
  bs_save s = BS_SAVE_INIT;
  bs_error e = {0, ""};
  size_t n = 0, nl = 0;
  int rc;
  for (; rows && rows[n]; n++) {
    char tmp[256], *p = tmp;
    strcpy(tmp, rows[n]);
    for (int k = 0; k < 4; k++) {
      char *c = k < 3 ? strchr(p, ':') : NULL;
      if (c) *c = 0;
      strcpy(buf[n][k], p);
      p = c ? c + 1 : p + strlen(p);
    }
    r[n].bucket = V(buf[n][0]);
    r[n].object_type = V(buf[n][1]);
    r[n].object_id = V(buf[n][2]);
    r[n].data = V(buf[n][3]);
  }
  for (; lookups && lookups[nl]; nl++) {
    l[nl].key = V(lookups[nl]);
    params[nl] = V("{\"p\":1}");
    l[nl].params = &params[nl];
    l[nl].n_params = 1;
  }
  s.table = V(table);
  s.tag = tag;
  if (before) s.before_id = V(before);
  if (after) s.after_id = V(after);
  s.rows = r;
  s.n_rows = n;
  s.lookups = l;
  s.n_lookups = nl;
  rc = bs_writer_save(f->w, &s, &e);
  if (rc) fprintf(stderr, "save: %s\n", e.msg);
  return rc;
}

#define ROWS(...) ((const char *const[]){__VA_ARGS__, NULL})

static uint64_t flush(fx *f) {
  uint64_t last = 0;
  bs_error e = {0, ""};
  int rc = bs_writer_flush(&last, f->w, &e);
  if (rc) fprintf(stderr, "flush: %s\n", e.msg);
  assert_int_equal(rc, BS_OK);
  return last;
}

static bs_commit_result commit(fx *f, const char *lsn, int create_empty) {
  bs_commit_options o = BS_COMMIT_OPTIONS_INIT;
  bs_commit_result r;
  bs_error e = {0, ""};
  int rc;
  o.create_empty = create_empty;
  rc = bs_writer_commit(&r, f->w, V(lsn), &o, &e);
  if (rc) fprintf(stderr, "commit: %s\n", e.msg);
  assert_int_equal(rc, BS_OK);
  return r;
}

/* ---- Raw readers ------------------------------------------------------------------------------ */

typedef struct rop {
  uint64_t id, target;
  int type;
  uint32_t checksum;
  char ot[64], oi[64], subkey[48], data[128];
} rop;

static bs__lmdb_db *LDB(fx *f) {
  return (bs__lmdb_db *)f->db;
}

static void cpy(char *dst, size_t cap, bs_val v) {
  size_t n = v.size < cap - 1 ? v.size : cap - 1;
  if (n) memcpy(dst, v.data, n);
  dst[n] = 0;
}

/* Reads all ops of bucket (name) in stream through the op records' cursor (lmdb_ops.c);
 * returns count (-1 = unknown bucket). */
static int read_ops(fx *f, uint32_t stream, const char *bucket, rop *out, int cap) {
  bs__lmdb_db *db = LDB(f);
  MDB_txn *txn;
  bs__lmdb_opc oc;
  bs_op op;
  uint64_t id;
  int n = 0, found;
  assert_int_equal(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, NULL), BS_OK);
  if (bs__lmdb_bucket_id(db, txn, NULL, stream, V(bucket), &id, NULL) != BS_OK) {
    bs__lmdb_txn_abort(db, txn);
    return -1;
  }
  memset(&op, 0, sizeof op); /* the analyzer cannot see that found implies op */
  assert_int_equal(bs__lmdb_opc_open(&oc, db, txn, NULL), BS_OK);
  for (assert_int_equal(bs__lmdb_opc_seek_ge(&oc, id, 0, &op, &found, NULL), BS_OK); found;
       assert_int_equal(bs__lmdb_opc_next(&oc, &op, &found, NULL), BS_OK)) {
    assert_true(n < cap);
    out[n].id = op.op_id;
    out[n].type = op.type;
    out[n].checksum = op.checksum;
    out[n].target = op.target_op;
    cpy(out[n].ot, sizeof out[n].ot, op.object_type);
    cpy(out[n].oi, sizeof out[n].oi, op.object_id);
    cpy(out[n].subkey, sizeof out[n].subkey, op.subkey);
    cpy(out[n].data, sizeof out[n].data, op.data);
    n++;
  }
  bs__lmdb_opc_close(&oc);
  bs__lmdb_txn_abort(db, txn);
  return n;
}

static int read_state(fx *f, uint32_t stream, const char *bucket, bs__bucket_state *s) {
  bs__lmdb_db *db = LDB(f);
  MDB_txn *txn;
  unsigned char k[8];
  MDB_val key = {8, k}, val;
  uint64_t id;
  int rc;
  assert_int_equal(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, NULL), BS_OK);
  rc = bs__lmdb_bucket_id(db, txn, NULL, stream, V(bucket), &id, NULL);
  if (rc == BS_OK) {
    bs__put_u64be(k, id);
    assert_int_equal(mdb_get(txn, db->bstate, &key, &val), 0);
    assert_int_equal(bs__bucket_state_decode(&val, s), BS_OK);
  }
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

static bs__stream_rec read_rec(fx *f, uint32_t stream, char *lsn_out) {
  bs__lmdb_db *db = LDB(f);
  bs__stream_rec r;
  MDB_txn *txn;
  assert_int_equal(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, NULL), BS_OK);
  assert_int_equal(bs__stream_rec_get(db, txn, stream, &r, NULL), BS_OK);
  if (lsn_out) cpy(lsn_out, 64, r.checkpoint_lsn);
  bs__lmdb_txn_abort(db, txn);
  return r;
}

/* The ops the file holds (bs_db_stat: whatever records they are stored in). */
static uint64_t count_ops(fx *f) {
  bs_stat st;
  assert_int_equal(bs_db_stat(&st, f->db, NULL), BS_OK);
  return st.ops_put + st.ops_remove + st.ops_move + st.ops_clear;
}

static size_t count_dbi(fx *f, MDB_dbi dbi) {
  bs__lmdb_db *db = LDB(f);
  MDB_txn *txn;
  MDB_stat st;
  assert_int_equal(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, NULL), BS_OK);
  assert_int_equal(mdb_stat(txn, dbi, &st), 0);
  bs__lmdb_txn_abort(db, txn);
  return st.ms_entries;
}

static uint32_t put_ck(bs_hash h, const char *ot, const char *oi, const char *data) {
  return bs_checksum_put(h, V(ot), V(oi), V(data));
}

static void subkey_of(char out[48], uint32_t table, const char *rid) {
  bs_subkey(out, table, V(rid));
  out[BS_SUBKEY_SIZE] = 0;
}

static uint32_t rm_ck(uint32_t table, const char *rid) {
  char sk[48];
  subkey_of(sk, table, rid);
  return bs_checksum_remove(BS_HASH_XXH3, V(sk));
}

/* ---- Tests ------------------------------------------------------------------------------------ */

static void test_put_remove_diff(void **state) {
  fx *f = *state;
  rop a[16], b[16];
  char sk[48];
  bs__bucket_state s;
  assert_int_equal(
      save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}", "B:todo:1:{a}"), NULL), 0);
  assert_int_equal(save_v(f, BS_UPDATE, "t", NULL, "r1", ROWS("A:todo:1:{b}"), NULL), 0);
  assert_int_equal(flush(f), 4);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 2);
  assert_int_equal(read_ops(f, f->stream, "B", b, 16), 2);
  subkey_of(sk, 1, "r1");
  /* op ids: PUT A (1), PUT B (2), then the update: PUT A (3), REMOVE B (4) */
  assert_int_equal(a[0].id, 1);
  assert_int_equal(a[0].type, BS_OP_PUT);
  assert_int_equal(a[0].checksum, put_ck(BS_HASH_XXH3, "todo", "1", "{a}"));
  assert_string_equal(a[0].subkey, sk);
  assert_string_equal(a[0].data, "{a}");
  assert_int_equal(b[0].id, 2);
  assert_int_equal(a[1].id, 3);
  assert_int_equal(a[1].type, BS_OP_PUT);
  assert_string_equal(a[1].data, "{b}");
  assert_int_equal(b[1].id, 4);
  assert_int_equal(b[1].type, BS_OP_REMOVE);
  assert_string_equal(b[1].ot, "todo");
  assert_string_equal(b[1].oi, "1");
  assert_string_equal(b[1].subkey, sk);
  assert_int_equal(b[1].checksum, rm_ck(1, "r1"));
  assert_int_equal(read_state(f, f->stream, "B", &s), BS_OK);
  assert_int_equal(s.count, 2);
  assert_int_equal(s.last_op, 4);
  assert_int_equal(s.checksum, bs__cksum_add(b[0].checksum, b[1].checksum));
  assert_int_equal(s.stream, f->stream);
  /* superseded: A 1 -> 3, B 2 -> 4; both buckets queued */
  assert_int_equal(count_dbi(f, LDB(f)->superseded), 2);
  assert_int_equal(count_dbi(f, LDB(f)->cqueue), 2);
}

static void test_object_id_change_leaves(void **state) {
  fx *f = *state;
  rop a[16];
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), NULL), 0);
  /* same bucket, different object id: PUT new, REMOVE old (with the old object id) */
  assert_int_equal(save_v(f, BS_UPDATE, "t", NULL, "r1", ROWS("A:todo:2:{a}"), NULL), 0);
  flush(f);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 3);
  assert_int_equal(a[1].type, BS_OP_PUT);
  assert_string_equal(a[1].oi, "2");
  assert_int_equal(a[2].type, BS_OP_REMOVE);
  assert_string_equal(a[2].oi, "1");
}

static void test_insert_does_not_diff(void **state) {
  fx *f = *state;
  rop a[16], b[16];
  assert_int_equal(
      save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}", "B:todo:1:{a}"), NULL), 0);
  flush(f);
  /* A second INSERT of the same row does not read the previous record: no REMOVE in B. */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{b}"), NULL), 0);
  flush(f);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 2);
  assert_int_equal(read_ops(f, f->stream, "B", b, 16), 1);
}

static void test_replica_id_change(void **state) {
  fx *f = *state;
  rop a[16], b[16];
  char sk1[48], sk2[48];
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), ROWS("k1")), 0);
  assert_int_equal(
      save_v(f, BS_UPDATE, "t", "r1", "r2", ROWS("A:todo:1:{a}", "B:todo:1:{a}"), NULL), 0);
  assert_int_equal(flush(f), 6);
  subkey_of(sk1, 1, "r1");
  subkey_of(sk2, 1, "r2");
  /* 1 PUT A, 2 param k1; then REMOVE A(r1) 3, tombstone k1 4, PUT A(r2) 5, PUT B(r2) 6 */
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 3);
  assert_int_equal(read_ops(f, f->stream, "B", b, 16), 1);
  assert_int_equal(a[1].id, 3);
  assert_int_equal(a[1].type, BS_OP_REMOVE);
  assert_string_equal(a[1].subkey, sk1);
  assert_int_equal(a[2].id, 5);
  assert_int_equal(a[2].type, BS_OP_PUT);
  assert_string_equal(a[2].subkey, sk2);
  assert_int_equal(b[0].id, 6);
  assert_int_equal(count_dbi(f, LDB(f)->params), 2);
  /* the old record is gone, the new one exists */
  assert_int_equal(count_dbi(f, LDB(f)->source), 1);
}

static void test_deletes(void **state) {
  fx *f = *state;
  rop a[16];
  assert_int_equal(bs_writer_snapshot_done(f->w, V("0"), NULL), BS_OK);
  assert_int_equal(save_v(f, BS_DELETE, "t", "nobody", NULL, NULL, NULL), 0);
  assert_int_equal(flush(f), 0); /* unknown row: nothing */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), ROWS("k")), 0);
  assert_int_equal(save_v(f, BS_DELETE, "t", "r1", NULL, NULL, NULL), 0);
  assert_int_equal(save_v(f, BS_DELETE, "t", "r1", NULL, NULL, NULL), 0);
  assert_int_equal(flush(f), 4); /* PUT, param, REMOVE, tombstone; repeated delete: nothing */
  assert_int_equal(save_v(f, BS_DELETE, "t", "r1", NULL, NULL, NULL), 0);
  assert_int_equal(flush(f), 4);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 2);
  assert_int_equal(a[1].type, BS_OP_REMOVE);
  assert_int_equal(count_dbi(f, LDB(f)->source), 0);
  assert_int_equal(count_dbi(f, LDB(f)->softdel), 0);
}

static void test_commit_rules(void **state) {
  fx *f = *state;
  bs_commit_result r;
  bs__stream_rec rec;
  char lsn[64];
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), NULL), 0);
  r = commit(f, "1", -1);
  assert_true(r.checkpoint_blocked); /* snapshot not done */
  assert_false(r.checkpoint_created);
  assert_int_equal(bs_writer_snapshot_done(f->w, V("5"), NULL), BS_OK);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r2", ROWS("A:todo:2:{a}"), NULL), 0);
  r = commit(f, "3", -1);
  assert_true(r.checkpoint_blocked); /* below no_checkpoint_before */
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.checkpoint, 0);
  assert_int_equal(rec.op_head, 2);
  assert_int_equal(rec.state, BS_STREAM_PROCESSING);
  /* the first unblocked commit creates one even with create_empty = 0, folding blocked ops */
  r = commit(f, "5", 0);
  assert_false(r.checkpoint_blocked);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, 2);
  rec = read_rec(f, f->stream, lsn);
  assert_string_equal(lsn, "5");
  assert_int_equal(rec.state, BS_STREAM_ACTIVE);
  /* nothing new, create_empty = 0: nothing */
  r = commit(f, "6", 0);
  assert_false(r.checkpoint_created);
  rec = read_rec(f, f->stream, lsn);
  assert_string_equal(lsn, "5");
  /* create_empty = 1: same op id, newer lsn */
  r = commit(f, "7", 1);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, 2);
  rec = read_rec(f, f->stream, lsn);
  assert_string_equal(lsn, "7");
  /* an lsn below the last checkpoint's is blocked */
  r = commit(f, "65", 1);
  assert_true(r.checkpoint_blocked);
  /* keepalive = create_empty 1 */
  assert_int_equal(bs_writer_keepalive(&r, f->w, V("8"), NULL), BS_OK);
  assert_true(r.checkpoint_created);
  /* resume lsn raised to the max of commits */
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.resume_lsn.size, 1);
  assert_int_equal(((const char *)rec.resume_lsn.data)[0], '8');
  /* a checkpoint change record per checkpoint plus flush records */
  assert_true(count_dbi(f, LDB(f)->changes) >= 4);
}

static int state_of(const bs_stream_info *info, void *payload) {
  int *states = payload;
  states[info->id] = info->state;
  return 0;
}

static void test_activation(void **state) {
  fx *f = *state;
  bs_storage *st2;
  bs_writer *w2;
  uint32_t id2, id3;
  int states[8] = {0};
  assert_int_equal(bs_writer_snapshot_done(f->w, V("1"), NULL), BS_OK);
  commit(f, "1", 1);
  assert_int_equal(bs_stream_create(&id2, f->db, "s2", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st2, f->db, id2, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w2, st2, NULL, NULL), BS_OK);
  assert_int_equal(bs_stream_list(f->db, state_of, states, NULL), BS_OK);
  assert_int_equal(states[f->stream], BS_STREAM_ACTIVE);
  assert_int_equal(states[id2], BS_STREAM_PROCESSING);
  /* id 0 = the active stream */
  {
    bs_storage *s0;
    assert_int_equal(bs_storage_open(&s0, f->db, 0, NULL), BS_OK);
    assert_int_equal(bs_storage_stream_id(s0), f->stream);
    bs_storage_close(s0);
  }
  assert_int_equal(bs_writer_snapshot_done(w2, V("2"), NULL), BS_OK);
  assert_int_equal(bs_writer_commit(NULL, w2, V("2"), NULL, NULL), BS_OK);
  assert_int_equal(bs_stream_list(f->db, state_of, states, NULL), BS_OK);
  assert_int_equal(states[f->stream], BS_STREAM_STOPPED);
  assert_int_equal(states[id2], BS_STREAM_ACTIVE);
  /* a new stream stops an older PROCESSING one */
  assert_int_equal(bs_stream_create(&id3, f->db, "s3", NULL, NULL), BS_OK);
  {
    uint32_t id4;
    assert_int_equal(bs_stream_create(&id4, f->db, "s4", NULL, NULL), BS_OK);
    assert_int_equal(bs_stream_list(f->db, state_of, states, NULL), BS_OK);
    assert_int_equal(states[id3], BS_STREAM_STOPPED);
    assert_int_equal(states[id4], BS_STREAM_PROCESSING);
    assert_int_equal(states[id2], BS_STREAM_ACTIVE);
  }
  bs_writer_close(w2);
  bs_storage_close(st2);
}

static void test_snapshot_mode(void **state) {
  fx *f = *state;
  rop a[16];
  bs_commit_result r;
  /* replication writer: a delete of a row the snapshot has not reached yet */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{new}"), NULL), 0);
  assert_int_equal(save_v(f, BS_DELETE, "t", "r2", NULL, NULL, NULL), 0);
  flush(f);
  assert_int_equal(count_dbi(f, LDB(f)->softdel), 1);
  fx_writer(f, 1);
  assert_int_equal(save_v(f, BS_UPDATE, "t", NULL, "r1", ROWS("A:todo:1:{x}"), NULL), BS_ESTATE);
  /* snapshot rows: r1 exists (skipped), r2 soft-deleted (skipped), r3 new */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{old}"), NULL), 0);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r2", ROWS("A:todo:2:{old}"), NULL), 0);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r3", ROWS("A:todo:3:{old}"), NULL), 0);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r3", ROWS("A:todo:3:{dup}"), NULL), 0);
  flush(f);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 2);
  assert_string_equal(a[0].data, "{new}");
  assert_string_equal(a[1].data, "{old}");
  assert_string_equal(a[1].oi, "3");
  /* a snapshot writer takes INSERT only (contract.md 4.3) */
  assert_int_equal(save_v(f, BS_DELETE, "t", "r3", NULL, NULL, NULL), BS_ESTATE);
  /* replication delete of a known row before the snapshot is done: REMOVE, soft delete */
  fx_writer(f, 0);
  assert_int_equal(save_v(f, BS_DELETE, "t", "r3", NULL, NULL, NULL), 0);
  flush(f);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 3);
  assert_int_equal(a[2].type, BS_OP_REMOVE);
  assert_int_equal(count_dbi(f, LDB(f)->softdel), 2);
  assert_int_equal(count_dbi(f, LDB(f)->source), 3); /* r1, r2 (soft), r3 (soft) */
  /* the first checkpoint purges soft-deleted records */
  assert_int_equal(bs_writer_snapshot_done(f->w, V("1"), NULL), BS_OK);
  r = commit(f, "1", 1);
  assert_true(r.checkpoint_created);
  assert_int_equal(count_dbi(f, LDB(f)->softdel), 0);
  assert_int_equal(count_dbi(f, LDB(f)->source), 1);
}

static int got_data(const bs_val *d, void *payload) {
  char *out = payload;
  if (!d)
    strcpy(out, "(null)");
  else
    cpy(out, 64, *d);
  return 0;
}

static void test_source_row(void **state) {
  fx *f = *state;
  bs_save s = BS_SAVE_INIT;
  char out[64] = "";
  s.table = V("t");
  s.tag = BS_INSERT;
  s.after_id = V("r1");
  s.stored_data = V("{\"v\":1}");
  assert_int_equal(bs_writer_save(f->w, &s, NULL), BS_OK);
  /* queued, not flushed: seen */
  assert_int_equal(bs_writer_source_row(f->w, V("t"), V("r1"), got_data, out, NULL), BS_OK);
  assert_string_equal(out, "{\"v\":1}");
  flush(f);
  strcpy(out, "");
  assert_int_equal(bs_writer_source_row(f->w, V("t"), V("r1"), got_data, out, NULL), BS_OK);
  assert_string_equal(out, "{\"v\":1}");
  assert_int_equal(bs_writer_source_row(f->w, V("t"), V("r2"), got_data, out, NULL), BS_ENOTFOUND);
  assert_int_equal(save_v(f, BS_DELETE, "t", "r1", NULL, NULL, NULL), 0);
  assert_int_equal(bs_writer_source_row(f->w, V("t"), V("r1"), got_data, out, NULL), BS_ENOTFOUND);
}

static void test_truncate_drop(void **state) {
  fx *f = *state;
  rop a[4000];
  int n;
  char id[32];
  assert_int_equal(bs_writer_snapshot_done(f->w, V("0"), NULL), BS_OK);
  for (int i = 0; i < 1500; i++) {
    snprintf(id, sizeof id, "r%d", i);
    assert_int_equal(save_v(f, BS_INSERT, "t", NULL, id, ROWS("A:todo:x:{}"), ROWS("k")), 0);
  }
  assert_int_equal(save_v(f, BS_INSERT, "u", NULL, "other", ROWS("A:u:1:{}"), NULL), 0);
  flush(f);
  assert_int_equal(bs_writer_truncate(f->w, V("t"), NULL), BS_OK);
  n = read_ops(f, f->stream, "A", a, 4000);
  assert_int_equal(n, 1501 + 1500);
  for (int i = 1501; i < n; i++) {
    assert_int_equal(a[i].type, BS_OP_REMOVE);
    assert_true(a[i].id > a[i - 1].id);
  }
  assert_int_equal(count_dbi(f, LDB(f)->source), 1);
  assert_int_equal(count_dbi(f, LDB(f)->params), 3000); /* entries + tombstones */
  assert_int_equal(count_dbi(f, LDB(f)->tables), 2);
  assert_int_equal(bs_writer_drop(f->w, V("t"), NULL), BS_OK);
  assert_int_equal(count_dbi(f, LDB(f)->tables), 1);
  /* re-registered tables get a fresh id */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r0", ROWS("A:todo:x:{}"), NULL), 0);
  flush(f);
  n = read_ops(f, f->stream, "A", a, 4000);
  {
    char sk[48];
    subkey_of(sk, 3, "r0");
    assert_string_equal(a[n - 1].subkey, sk);
  }
}

static void test_persistence(void **state) {
  fx *f = *state;
  rop a[16];
  bs__stream_rec rec;
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), NULL), 0);
  assert_int_equal(bs_writer_snapshot_done(f->w, V("1"), NULL), BS_OK);
  commit(f, "1", 1);
  /* queued but never flushed: discarded by close */
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r2", ROWS("A:todo:2:{a}"), NULL), 0);
  fx_reopen(f);
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.checkpoint, 1);
  assert_int_equal(rec.op_head, 1);
  assert_int_equal(rec.state, BS_STREAM_ACTIVE);
  assert_int_equal(save_v(f, BS_UPDATE, "t", NULL, "r1", ROWS("B:todo:1:{b}"), NULL), 0);
  assert_int_equal(flush(f), 3);
  assert_int_equal(read_ops(f, f->stream, "A", a, 16), 2);
  assert_int_equal(a[1].type, BS_OP_REMOVE);
}

static void test_lifecycle(void **state) {
  fx *f = *state;
  bs__stream_rec rec;
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), ROWS("k")), 0);
  assert_int_equal(bs_writer_snapshot_done(f->w, V("1"), NULL), BS_OK);
  commit(f, "1", 1);
  assert_int_equal(bs_report_error(f->st, "boom", NULL), BS_OK);
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.state, BS_STREAM_ERRORED);
  assert_int_equal(rec.last_error.size, 4);
  assert_int_equal(bs_clear(f->st, NULL), BS_OK);
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.checkpoint, 0);
  assert_false(rec.snapshot_done);
  assert_int_equal(count_ops(f), 0);
  assert_int_equal(count_dbi(f, LDB(f)->source), 0);
  assert_int_equal(count_dbi(f, LDB(f)->params), 0);
  assert_int_equal(count_dbi(f, LDB(f)->bstate), 0);
  assert_int_equal(count_dbi(f, LDB(f)->buckets), 0);
  assert_int_equal(read_ops(f, f->stream, "A", NULL, 0), -1);
  assert_int_equal(bs_terminate(f->st, 0, NULL), BS_OK);
  rec = read_rec(f, f->stream, NULL);
  assert_int_equal(rec.state, BS_STREAM_TERMINATED);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "r1", ROWS("A:todo:1:{a}"), NULL), 0);
  {
    uint64_t last;
    assert_int_equal(bs_writer_flush(&last, f->w, NULL), BS_ESTATE);
  }
}

static uint64_t g_seed; /* the run's (ct_run_seed "writer") */

/* Randomized: every bucket state equals the sum over its ops; op ids unique and increasing. */
static void test_random_checksums(void **state) {
  fx *f = *state;
  unsigned long long seed = g_seed;
  int rounds = getenv("BS_TEST_QUICK") ? 3000 : 30000;
  bs__lmdb_db *db = LDB(f);
  MDB_txn *txn;
  MDB_cursor *cur;
  MDB_val key, val;
  uint64_t last_op = 0;
  int mrc;
  srand((unsigned)ct_seed(seed, 1).s);
  assert_int_equal(bs_writer_snapshot_done(f->w, V("0"), NULL), BS_OK);
  for (int i = 0; i < rounds; i++) {
    char rid[16], rows[3][64];
    const char *rp[4] = {NULL, NULL, NULL, NULL};
    int nr = rand() % 4, tag = rand() % 10;
    snprintf(rid, sizeof rid, "r%d", rand() % 200);
    for (int k = 0; k < nr; k++) {
      snprintf(rows[k], sizeof rows[k], "b%d:t:%d:{%d}", rand() % 20, rand() % 3, rand());
      rp[k] = rows[k];
    }
    if (tag < 2) {
      if (save_v(f, BS_DELETE, "t", rid, NULL, NULL, NULL)) goto fail;
    } else if (tag < 3) {
      char rid2[16];
      snprintf(rid2, sizeof rid2, "r%d", rand() % 200);
      if (save_v(f, BS_UPDATE, "t", rid, rid2, rp, NULL)) goto fail;
    } else if (save_v(f, tag < 5 ? BS_INSERT : BS_UPDATE, "t", NULL, rid, rp, NULL)) {
      goto fail;
    }
    if (rand() % 100 == 0) flush(f);
  }
  flush(f);
  /* walk every bucket state and sum its ops */
  assert_int_equal(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, NULL), BS_OK);
  assert_int_equal(mdb_cursor_open(txn, db->bstate, &cur), 0);
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    bs__bucket_state s;
    bs__lmdb_opc oc;
    bs_op op;
    uint32_t sum = 0;
    uint64_t count = 0, prev = 0;
    int found;
    memset(&op, 0, sizeof op);
    assert_int_equal(bs__bucket_state_decode(&val, &s), BS_OK);
    assert_int_equal(bs__lmdb_opc_open(&oc, db, txn, NULL), BS_OK);
    for (assert_int_equal(
             bs__lmdb_opc_seek_ge(&oc, bs__get_u64be(key.mv_data), 0, &op, &found, NULL), BS_OK);
         found; assert_int_equal(bs__lmdb_opc_next(&oc, &op, &found, NULL), BS_OK)) {
      assert_true(op.op_id > prev);
      prev = op.op_id;
      if (op.op_id > last_op) last_op = op.op_id;
      sum = bs__cksum_add(sum, op.checksum);
      count++;
    }
    bs__lmdb_opc_close(&oc);
    if (sum != s.checksum || count != s.count || prev != s.last_op) {
      fprintf(stderr, "BS_SEED=%llu: bucket state mismatch\n", seed);
      fail();
    }
  }
  mdb_cursor_close(cur);
  bs__lmdb_txn_abort(db, txn);
  assert_true(last_op > 0);
  return;
fail:
  fprintf(stderr, "BS_SEED=%llu: save failed\n", seed);
  fail();
}

static void test_map_growth(void **state) {
  fx *f = *state;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  char big[4096];
  bs_row r = {V("A"), V("t"), V("1"), {big, sizeof big}};
  bs_save s = BS_SAVE_INIT;
  uint64_t last = 0;
  fx_close(f);
  o.map_size = 256 * 1024;
  assert_int_equal(bs_open(&f->db, f->path, &o, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&f->st, f->db, f->stream, NULL), BS_OK);
  fx_writer(f, 0);
  memset(big, 'x', sizeof big);
  s.table = V("t");
  s.tag = BS_INSERT;
  s.rows = &r;
  s.n_rows = 1;
  for (int i = 0; i < 2000; i++) {
    char rid[16];
    snprintf(rid, sizeof rid, "r%d", i);
    s.after_id = V(rid);
    assert_int_equal(bs_writer_save(f->w, &s, NULL), BS_OK);
  }
  assert_int_equal(bs_writer_flush(&last, f->w, NULL), BS_OK);
  assert_int_equal(last, 2000);
  assert_true(LDB(f)->e->map_size > 256 * 1024);
}

static void test_format_refusal(void **state) {
  fx *f = *state;
  char path[128];
  bs_db *db = NULL;
  bs_error e = {0, ""};
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  MDB_val k = {6, "format"}, v;
  unsigned char nv[12];
  FILE *fp;
  fx_close(f);
  /* a newer format version */
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 16);
  assert_int_equal(mdb_env_open(env, f->path, MDB_NOSUBDIR, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
  memcpy(nv, "bktstore", 8);
  nv[8] = 99;
  nv[9] = nv[10] = nv[11] = 0;
  v.mv_size = 12;
  v.mv_data = nv;
  assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  assert_int_equal(bs_open(&db, f->path, NULL, &e), BS_ECORRUPT);
  assert_non_null(strstr(e.msg, "newer"));
  /* a foreign LMDB file */
  snprintf(path, sizeof path, "%s/foreign", f->dir);
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, path, MDB_NOSUBDIR, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  assert_int_equal(mdb_put(txn, dbi, &k, &k, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  assert_int_equal(bs_open(&db, path, NULL, &e), BS_ECORRUPT);
  /* not LMDB at all */
  snprintf(path, sizeof path, "%s/text", f->dir);
  fp = fopen(path, "w");
  assert_non_null(fp);
  for (int i = 0; i < 2000; i++) fputs("hello world, this is not a database\n", fp);
  fclose(fp);
  assert_int_equal(bs_open(&db, path, NULL, &e), BS_ECORRUPT);
  assert_null(db);
  /* reopen for teardown */
  snprintf(f->path, sizeof f->path, "%s/fresh", f->dir);
  fx_open_db(f);
  assert_int_equal(bs_stream_create(&f->stream, f->db, "s", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&f->st, f->db, f->stream, NULL), BS_OK);
  fx_writer(f, 0);
}

static void test_sha256_stream(void **state) {
  fx *f = *state;
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  uint32_t id;
  rop a[4];
  so.hash = BS_HASH_SHA256;
  assert_int_equal(bs_stream_create(&id, f->db, "sha", &so, NULL), BS_OK);
  bs_writer_close(f->w);
  bs_storage_close(f->st);
  f->w = NULL;
  assert_int_equal(bs_storage_open(&f->st, f->db, id, NULL), BS_OK);
  fx_writer(f, 0);
  assert_int_equal(save_v(f, BS_INSERT, "t", NULL, "t1", ROWS("A:test:t1:{\"id\":\"t1\"}"), NULL),
                   0);
  flush(f);
  assert_int_equal(read_ops(f, id, "A", a, 4), 1);
  assert_int_equal(a[0].checksum, 2634521662u);
  /* streams are isolated: the bucket name of stream id does not exist in the first stream */
  assert_int_equal(read_ops(f, f->stream, "A", a, 4), -1);
}

/* Fault loop (SQLite style): fail the k-th allocation of a flush; a failed flush must leave the
 * file and the queue as they were, so that a retry produces exactly the expected result. */
static long g_fail_at = -1, g_allocs;
static void *fail_malloc(void *o, size_t n) {
  (void)o;
  if (g_fail_at >= 0 && ++g_allocs == g_fail_at) return NULL;
  return malloc(n);
}
static void *fail_realloc(void *o, void *p, size_t n) {
  (void)o;
  if (g_fail_at >= 0 && ++g_allocs == g_fail_at) return NULL;
  return realloc(p, n);
}
static void fail_free(void *o, void *p) {
  (void)o;
  free(p);
}

static void test_flush_fault_loop(void **state) {
  fx *f = *state;
  bs_allocator a = {fail_malloc, fail_realloc, fail_free, NULL};
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  int done = 0;
  o.allocator = &a;
  for (long k = 1; !done && k < 5000; k++) {
    bs__stream_rec rec;
    bs_error e = {0, ""};
    uint64_t last = 0;
    char path[256];
    int rc;
    fx_close(f);
    snprintf(path, sizeof path, "rm -f %s %s-lock", f->path, f->path);
    assert_int_equal(system(path), 0);
    g_fail_at = -1;
    assert_int_equal(bs_open(&f->db, f->path, &o, NULL), BS_OK);
    assert_int_equal(bs_stream_create(&f->stream, f->db, "s", NULL, NULL), BS_OK);
    assert_int_equal(bs_storage_open(&f->st, f->db, f->stream, NULL), BS_OK);
    fx_writer(f, 0);
    for (int i = 0; i < 50; i++) {
      char rid[16], row[64];
      snprintf(rid, sizeof rid, "r%d", i % 20);
      snprintf(row, sizeof row, "b%d:t:%d:{%d}", i % 7, i % 20, i);
      assert_int_equal(save_v(f, BS_UPDATE, "t", NULL, rid, ROWS(row), ROWS("k")), 0);
    }
    g_allocs = 0;
    g_fail_at = k;
    rc = bs_writer_flush(&last, f->w, &e);
    g_fail_at = -1;
    if (rc == BS_OK) {
      done = 1;
    } else {
      assert_int_equal(rc, BS_ENOMEM);
      rec = read_rec(f, f->stream, NULL);
      assert_int_equal(rec.op_head, 0);
      assert_int_equal(count_ops(f), 0);
      assert_int_equal(bs_writer_flush(&last, f->w, NULL), BS_OK);
    }
    /* 50 PUTs + 50 parameter entries + REMOVEs of the rows that moved bucket (30 updates) */
    assert_int_equal(last, 130);
    assert_int_equal(count_ops(f), 80);
  }
  assert_true(done);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_put_remove_diff, setup, teardown),
      cmocka_unit_test_setup_teardown(test_object_id_change_leaves, setup, teardown),
      cmocka_unit_test_setup_teardown(test_insert_does_not_diff, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replica_id_change, setup, teardown),
      cmocka_unit_test_setup_teardown(test_deletes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_commit_rules, setup, teardown),
      cmocka_unit_test_setup_teardown(test_activation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_snapshot_mode, setup, teardown),
      cmocka_unit_test_setup_teardown(test_source_row, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncate_drop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lifecycle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_random_checksums, setup, teardown),
      cmocka_unit_test_setup_teardown(test_map_growth, setup, teardown),
      cmocka_unit_test_setup_teardown(test_format_refusal, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sha256_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_flush_fault_loop, setup, teardown),
  };
  g_seed = ct_run_seed("writer");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
