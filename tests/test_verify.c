/*
 * test_verify.c: bs_db_verify finds damaged op values. A real file with PUT, REMOVE,
 * MOVE and CLEAR ops in an xxh3 and a sha256 stream (rows inserted, updated, deleted, moved
 * between buckets, then fully compacted so every superseded op is a MOVE and a leading run a
 * CLEAR) is verified clean; then:
 *  - one PUT's data byte edited in place (the case): verify names the bucket and op and
 *    the recomputed checksum; reads still work;
 *  - a seeded random byte of a random op value XORed with a random non-zero value, hundreds of
 *    times (BS_TEST_QUICK: fewer): verify reports a problem naming that op's bucket every time,
 *    and neither verify nor reading the bucket crashes. Bytes no check can reach are left out,
 *    with the reason: a MOVE's or CLEAR's target_op (a hint whose value the file does not
 *    repeat; verify checks its bounds) and a REMOVE's object_type/object_id (its checksum covers
 *    only the subkey, contract.md 3; in format 6 also the byte holding both their lengths).
 * Then verify.c's rules (every backend's verify applies them to its walk) on ops and bucket states
 * built in the test, each fault alone: checksums (data "" and one byte, 1 vs 1.0), op ids, target_op
 * bounds, subkey form (one byte short, uppercase hex), a REMOVE's data, MOVE/CLEAR payloads and
 * placement, unknown types; bucket names of 0, 1, 480 and 481 bytes (non-ASCII), running values,
 * CLEAR spans; unknown hash modes and a checkpoint above the op head.
 * The op values are found through LMDB's map: a value pointer lies in a page whose header starts
 * with its page number (LMDB's MDB_page), so its file offset is that number times the page size
 * plus its place in the page.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../internal.h"
#include "util_contract.h"
#include "util_fault.h"

typedef struct op_loc {
  size_t off, size; /* of the op value in the file */
  unsigned char type;
  uint64_t op_id;
  size_t ot, oi; /* object_type and object_id lengths */
  size_t tl;     /* the bytes of its target op, from byte 5 (0: none stored) */
  size_t hdr;    /* where its strings start */
  size_t split;  /* format 6's one byte of both lengths (0: none) */
  char bucket[64];
  uint32_t stream;
} op_loc;

static char g_dir[256], g_path[320];
static op_loc *g_ops;
static size_t g_n_ops;
static uint64_t g_checkpoint[3]; /* per stream id (1, 2) */

/* ---- The real database ---------------------------------------------------------------------- */

static void bucket_name(char *out, size_t cap, int b) {
  snprintf(out, cap, "by_user[\"\xc3\xbc%d\"]", b); /* non-ASCII: u-umlaut */
}

static void save(bs_writer *w, bs_tag tag, int id, int bucket, int round) {
  char rid[32], oid[32], bk[64], data[128];
  const char *table = id % 2 ? "todos" : "lists";
  snprintf(rid, sizeof rid, "r%d", id);
  snprintf(oid, sizeof oid, "o%d", id);
  bucket_name(bk, sizeof bk, bucket);
  snprintf(data, sizeof data, "{\"id\":\"o%d\",\"round\":%d,\"v\":%d.0}", id, round, id * 7);
  if (tag == BS_DELETE)
    CT_OK(ct_save(w, tag, table, rid, NULL, CT_NOROWS));
  else
    CT_OK(ct_save(w, tag, table, NULL, rid, CT_ROWS({bk, "todos", oid, data})));
}

static void commit(bs_writer *w, int round, uint64_t *cp) {
  char lsn[16];
  bs_commit_result cr;
  snprintf(lsn, sizeof lsn, "%08d", round + 1);
  if (round == 0) assert_int_equal(bs_writer_snapshot_done(w, ct_v(lsn), NULL), BS_OK);
  assert_int_equal(bs_writer_commit(&cr, w, ct_v(lsn), NULL, NULL), BS_OK);
  assert_true(cr.checkpoint_created);
  *cp = cr.checkpoint;
}

/* 600 rows in 6 buckets; updates, deletes, moves to the next bucket; the first rows of bucket 0
 * all deleted (a leading run for a CLEAR); then full compaction at the checkpoint. */
static void fill_stream(bs_db *db, bs_hash hash) {
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_storage *st;
  bs_writer *w;
  uint32_t stream;
  so.hash = hash;
  assert_int_equal(bs_stream_create(&stream, db, hash ? "sha" : "xxh", &so, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, stream, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);
  for (int i = 0; i < 600; i++) save(w, BS_INSERT, i, i % 6, 0);
  commit(w, 0, &g_checkpoint[stream]);
  for (int i = 0; i < 600; i++) {
    if (i % 7 == 0)
      save(w, BS_DELETE, i, i % 6, 1);
    else if (i % 11 == 0)
      save(w, BS_UPDATE, i, (i + 1) % 6, 1);
    else if (i % 3 == 0)
      save(w, BS_UPDATE, i, i % 6, 1);
  }
  commit(w, 1, &g_checkpoint[stream]);
  for (int i = 0; i < 180; i += 6)
    if (i % 7) save(w, BS_DELETE, i, 0, 2);
  commit(w, 2, &g_checkpoint[stream]);
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  co.min_age_ms = 0;
  assert_int_equal(bs_compact(NULL, st, &co, NULL), BS_OK);
  bs_writer_close(w);
  bs_storage_close(st);
}

/* A varint of a chunk (docs/format.md 4.3). */
static uint64_t chunk_varint(const unsigned char *p, size_t *pos) {
  uint64_t r = 0;
  for (unsigned sh = 0;; sh += 7) {
    unsigned char b = p[(*pos)++];
    r |= (uint64_t)(b & 0x7f) << sh;
    if (!(b & 0x80)) return r;
  }
}

/* Every op value's place in the file, through the LMDB API: a chunk's value lies in one page or
 * in contiguous overflow pages, and its ops follow its 21-byte header (docs/format.md 4.3), in
 * format 5's op encoding (u8 type | u32 checksum | u64 target | u16, u16, u8 lengths) or, header
 * flag 2, format 6's (u8 head: type in bits 0-2, 8: a target follows | u32 checksum | varint
 * target | the lengths for PUT and REMOVE, internal.h "Op chunks"). */
static void locate_ops(void) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi ops, bstate;
  MDB_cursor *cur;
  MDB_stat es;
  MDB_val k, d;
  size_t cap = 0, ps;
  int first = 1;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
  assert_int_equal(mdb_env_open(env, g_path, MDB_NOSUBDIR | MDB_RDONLY, 0644), 0);
  assert_int_equal(mdb_env_stat(env, &es), 0);
  ps = es.ms_psize;
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "ops", 0, &ops), 0);
  assert_int_equal(mdb_dbi_open(txn, "bstate", 0, &bstate), 0);
  assert_int_equal(mdb_cursor_open(txn, ops, &cur), 0);
  while (mdb_cursor_get(cur, &k, &d, first ? MDB_FIRST : MDB_NEXT) == 0) {
    const unsigned char *c = d.mv_data;
    MDB_val sk = {8, k.mv_data}, sv;
    size_t base, pos = 21, n = (size_t)c[0] | (size_t)c[1] << 8;
    uint64_t id = 0;
    first = 0;
    {
      uintptr_t in_page = (uintptr_t)c % ps;
      size_t pgno;
      memcpy(&pgno, c - in_page, sizeof pgno);
      base = pgno * ps + in_page;
    }
    for (int i = 15; i >= 8; i--) id = id << 8 | c[i]; /* the first op id, u64le */
    assert_int_equal(mdb_get(txn, bstate, &sk, &sv), 0);
    assert_true(sv.mv_size > 96 && sv.mv_size - 96 < sizeof g_ops[0].bucket);
    for (size_t j = 0; j < n; j++) {
      uint64_t delta = chunk_varint(c, &pos), size = chunk_varint(c, &pos);
      const unsigned char *p = c + pos;
      op_loc *o;
      if (g_n_ops == cap) {
        cap = cap ? 2 * cap : 1024;
        op_loc *grown = realloc(g_ops, cap * sizeof *g_ops);
        assert_non_null(grown);
        g_ops = grown;
      }
      o = &g_ops[g_n_ops++];
      id += delta;
      o->off = base + pos;
      o->size = size;
      o->split = 0;
      if (c[20] & 2) {
        size_t q = 5;
        o->type = p[0] & 7;
        o->tl = 0;
        if (p[0] & 8) {
          (void)chunk_varint(p, &q);
          o->tl = q - 5;
        }
        o->ot = o->oi = 0;
        if (o->type <= 2) { /* 32: both lengths in one byte; 16: the subkey's not stored */
          if (p[0] & 32) {
            o->split = q;
            o->ot = p[q] >> 4;
            o->oi = p[q++] & 15;
          } else {
            o->ot = chunk_varint(p, &q);
            o->oi = chunk_varint(p, &q);
          }
          q += !(p[0] & 16);
        }
        o->hdr = q;
      } else {
        o->type = p[0];
        o->tl = 8;
        o->ot = (size_t)p[13] | (size_t)p[14] << 8;
        o->oi = (size_t)p[15] | (size_t)p[16] << 8;
        o->hdr = 18;
      }
      o->op_id = id;
      memcpy(o->bucket, (const char *)sv.mv_data + 96, sv.mv_size - 96);
      o->bucket[sv.mv_size - 96] = '\0';
      o->stream = (uint32_t)((const unsigned char *)sv.mv_data)[0] |
                  (uint32_t)((const unsigned char *)sv.mv_data)[1] << 8;
      pos += size;
    }
    assert_int_equal(pos, d.mv_size);
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

static int group_setup(void **state) {
  bs_db *db;
  bs_stat s;
  (void)state;
  if (ft_tmpdir(g_dir, sizeof g_dir, "verify") != 0) return -1;
  snprintf(g_path, sizeof g_path, "%s/db", g_dir);
  assert_int_equal(bs_open(&db, g_path, NULL, NULL), BS_OK);
  fill_stream(db, BS_HASH_XXH3);
  fill_stream(db, BS_HASH_SHA256);
  assert_int_equal(bs_db_stat(&s, db, NULL), BS_OK);
  assert_true(s.ops_put > 0 && s.ops_remove > 0 && s.ops_move > 0 && s.ops_clear > 0);
  bs_close(db);
  locate_ops();
  assert_int_equal(g_n_ops, s.ops_put + s.ops_remove + s.ops_move + s.ops_clear);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  free(g_ops);
  ft_rm_db(g_dir, g_path);
  rmdir(g_dir);
  return 0;
}

/* ---- Verify and read ------------------------------------------------------------------------ */

typedef struct problems {
  char text[8192];
  size_t n, len;
} problems;

static void collect(const char *problem, void *payload) {
  problems *p = payload;
  int w;
  p->n++;
  if (p->len >= sizeof p->text) return;
  w = snprintf(p->text + p->len, sizeof p->text - p->len, "%s\n", problem);
  if (w > 0) p->len += (size_t)w;
}

static int on_chunk(const bs_chunk *c, void *payload) {
  size_t *bytes = payload;
  for (size_t i = 0; i < c->n_ops; i++) *bytes += c->ops[i].data.size;
  return 0;
}

/* Verifies g_path into *p; reads bucket of stream (data and checksum) and returns the status of
 * the data read. */
static int verify_and_read(problems *p, const char *bucket, uint32_t stream) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error e = {0, ""};
  bs_db *db;
  bs_storage *st;
  bs_bucket_request rq = {ct_v(bucket), 0};
  bs_checksum ck;
  size_t bytes = 0;
  int more, rc;
  memset(p, 0, sizeof *p);
  o.flags = BS_OPEN_RDONLY;
  rc = bs_open(&db, g_path, &o, &e);
  if (rc != BS_OK) fail_msg("open: %s %s", bs_strerror(rc), e.msg);
  assert_int_equal(bs_db_verify(NULL, db, collect, p, &e), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, stream, NULL), BS_OK);
  rc = bs_get_bucket_data(&more, st, g_checkpoint[stream], &rq, 1, NULL, on_chunk, &bytes, &e);
  (void)bs_get_checksums(&ck, st, g_checkpoint[stream], &rq.bucket, 1, &e);
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

static void poke(size_t off, unsigned char x) {
  unsigned char b;
  int fd = open(g_path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
  b ^= x;
  assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
  close(fd);
}

/* ---- Tests ---------------------------------------------------------------------------------- */

static void test_clean(void **state) {
  problems p;
  (void)state;
  assert_int_equal(verify_and_read(&p, g_ops[0].bucket, g_ops[0].stream), BS_OK);
  if (p.n) fail_msg("%zu problems in a sound file:\n%s", p.n, p.text);
}

/* The case: one PUT's data edited in place used to give "0 problems". */
static void test_edited_put_data(void **state) {
  char want[160];
  problems p;
  (void)state;
  for (size_t i = 0; i < g_n_ops; i++) {
    const op_loc *o = &g_ops[i];
    if (o->type != 1 || o->stream != 2) continue; /* a PUT of the sha256 stream */
    /* the byte before the closing brace is the 0 of "v":N.0; 0 -> 1 keeps the JSON valid */
    poke(o->off + o->size - 2, 0x01);
    assert_int_equal(verify_and_read(&p, o->bucket, o->stream), BS_OK);
    poke(o->off + o->size - 2, 0x01);
    snprintf(want, sizeof want, "bucket \"%s\" op %" PRIu64 ": PUT checksum", o->bucket, o->op_id);
    if (!strstr(p.text, want)) fail_msg("want \"%s\" in:\n%s", want, p.text);
    assert_int_equal(p.n, 1);
    return;
  }
  fail_msg("no PUT found");
}

/* A byte offset inside op o that some check covers (see the file comment). */
static size_t pick_byte(const op_loc *o, uint64_t r) {
  if (o->type == 3 || o->type == 4) { /* MOVE, CLEAR: not target_op (bytes 5..5 + tl) */
    size_t i = r % (o->size - o->tl);
    return i < 5 ? i : i + o->tl;
  }
  if (o->type == 2) { /* REMOVE: not object_type / object_id, nor the byte that splits their
                        * lengths (format 6: a flip that keeps their sum moves only that split) */
    size_t i = r % (o->size - o->ot - o->oi - (o->split != 0));
    if (o->split && i >= o->split) i++;
    return i < o->hdr ? i : i + o->ot + o->oi;
  }
  return r % o->size;
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint64_t g_seed; /* the run's (ct_run_seed "verify") */

static void test_random_corruption(void **state) {
  uint64_t seed = g_seed, s = ct_seed(seed, 1).s | 1; /* xorshift: never 0 */
  int trials = getenv("BS_TEST_QUICK") ? 150 : 800;
  unsigned by_type[5] = {0};
  char want[80];
  problems p;
  (void)state;
  for (int t = 0; t < trials; t++) {
    /* op types in turn (CLEARs are few), a random op of that type */
    unsigned want_type = 1 + (unsigned)t % 4;
    const op_loc *o;
    size_t i = rng(&s) % g_n_ops;
    while (g_ops[i].type != want_type) i = (i + 1) % g_n_ops;
    o = &g_ops[i];
    size_t at = pick_byte(o, rng(&s));
    unsigned char x = (unsigned char)(1 + rng(&s) % 255);
    poke(o->off + at, x);
    verify_and_read(&p, o->bucket, o->stream);
    poke(o->off + at, x);
    snprintf(want, sizeof want, "bucket \"%s\"", o->bucket);
    if (p.n == 0 || !strstr(p.text, want))
      fail_msg("trial %d (seed %llu): byte %zu of op %" PRIu64 " (type %u, %zu bytes) ^ 0x%02x: "
               "%zu problems, none naming %s:\n%s",
               t, (unsigned long long)seed, at, o->op_id, o->type, o->size, x, p.n, want, p.text);
    if (o->type <= 4) by_type[o->type]++;
  }
  print_message("%d corruptions (PUT %u, REMOVE %u, MOVE %u, CLEAR %u) all reported, seed %llu\n",
                trials, by_type[1], by_type[2], by_type[3], by_type[4], (unsigned long long)seed);
  assert_true(verify_and_read(&p, g_ops[0].bucket, g_ops[0].stream) == BS_OK && p.n == 0);
}

/* ---- verify.c's rules on ops built here: what every backend's verify applies to its walk ---- */

/* A bucket "b\xc3\xbc" (non-ASCII) of stream 1 (xxh3, op head 100) whose stored state says: last
 * op 9, no CLEAR span; the running values are those of the ops walked. */
static bs__vbucket rule_bucket(const bs__vstream *sh) {
  bs__vbucket b = {.name = {"b\xc3\xbc", 3},
                   .id = 7,
                   .stream_id = 1,
                   .stream = sh,
                   .last_op = 9,
                   .has_state = 1,
                   .header = 18};
  return b;
}

static bs_op put_op(uint64_t id, const char *data, char *sk) {
  bs_op op = {.op_id = id,
              .type = BS_OP_PUT,
              .object_type = ct_v("t"),
              .object_id = ct_v("o"),
              .subkey = {sk, BS_SUBKEY_SIZE},
              .data = ct_v(data)};
  bs_subkey(sk, 1, ct_v("r"));
  op.checksum = bs_checksum_put(BS_HASH_XXH3, op.object_type, op.object_id, op.data);
  return op;
}

/* The problems op yields as the bucket's index-th op, after sound PUTs at ids 1..index. */
static size_t op_problems(problems *p, const bs_op *op, uint64_t index, uint64_t clear_op) {
  bs__vstream sh = {1, 100, BS_HASH_XXH3, 1};
  bs__vbucket b = rule_bucket(&sh);
  bs__verify v = {collect, p, 0, NULL, NULL, 0, 0};
  char sk[BS_SUBKEY_SIZE];
  memset(p, 0, sizeof *p);
  b.clear_op = clear_op;
  for (uint64_t i = 1; i <= index; i++) {
    bs_op ok = put_op(i, "", sk);
    bs__verify_op(&v, &b, &ok, ok.object_type.size + ok.object_id.size + BS_SUBKEY_SIZE);
  }
  bs__verify_op(&v, &b, op,
                op->object_type.size + op->object_id.size + op->subkey.size + op->data.size);
  assert_int_equal(v.problems, p->n);
  return p->n;
}

static void expect_one(problems *p, const char *want) {
  if (p->n != 1 || !strstr(p->text, want))
    fail_msg("want one problem naming \"%s\", got %zu:\n%s", want, p->n, p->text);
}

static void test_rules_ops(void **state) {
  char sk[BS_SUBKEY_SIZE], bad_sk[BS_SUBKEY_SIZE];
  problems p;
  bs_op op;
  (void)state;
  /* sound: a PUT of data "" and of one byte, a REMOVE, a MOVE to the last op, a leading CLEAR */
  op = put_op(1, "", sk);
  assert_int_equal(op_problems(&p, &op, 0, 0), 0);
  op = put_op(2, "x", sk);
  assert_int_equal(op_problems(&p, &op, 1, 0), 0);
  op.type = BS_OP_REMOVE;
  op.data = (bs_val){NULL, 0};
  op.checksum = bs_checksum_remove(BS_HASH_XXH3, op.subkey);
  assert_int_equal(op_problems(&p, &op, 1, 0), 0);
  bs_op mv = {.op_id = 3, .type = BS_OP_MOVE, .checksum = 5, .target_op = 9};
  assert_int_equal(op_problems(&p, &mv, 2, 0), 0);
  bs_op cl = {.op_id = 4, .type = BS_OP_CLEAR, .checksum = 5, .target_op = 9};
  assert_int_equal(op_problems(&p, &cl, 0, 4), 0);
  /* each fault alone */
  op = put_op(2, "{\"v\":1}", sk);
  op.checksum++;
  assert_int_equal(op_problems(&p, &op, 1, 0), 1);
  expect_one(&p, "bucket \"b\xc3\xbc\" op 2: PUT checksum");
  op = put_op(2, "1", sk);
  op.data = ct_v("1.0"); /* 1 and 1.0 are other bytes: another checksum */
  op_problems(&p, &op, 1, 0);
  expect_one(&p, "its payload hashes to");
  op = put_op(1, "", sk);
  op.op_id = 101;
  op_problems(&p, &op, 0, 0);
  expect_one(&p, "op id outside 1..the stream's op head 100");
  op = put_op(1, "", sk);
  op_problems(&p, &op, 1, 0); /* after op 1 */
  expect_one(&p, "not above op 1");
  op = put_op(2, "", sk);
  op.target_op = 9;
  op_problems(&p, &op, 1, 0);
  expect_one(&p, "PUT has a bad target_op 9");
  memcpy(bad_sk, sk, sizeof bad_sk);
  bad_sk[9] = 'A'; /* uppercase hex */
  op = put_op(2, "", sk);
  op.subkey.data = bad_sk;
  op.checksum = bs_checksum_remove(BS_HASH_XXH3, op.subkey);
  op.type = BS_OP_REMOVE;
  op.data = (bs_val){NULL, 0};
  op_problems(&p, &op, 1, 0);
  expect_one(&p, "REMOVE with a malformed subkey (41 bytes)");
  op.subkey = (bs_val){sk, BS_SUBKEY_SIZE - 1}; /* one byte short */
  op.checksum = bs_checksum_remove(BS_HASH_XXH3, op.subkey);
  op_problems(&p, &op, 1, 0);
  expect_one(&p, "malformed subkey (40 bytes)");
  op = put_op(2, "", sk);
  op.type = BS_OP_REMOVE;
  op.data = ct_v("d"); /* a REMOVE carries no data */
  op.checksum = bs_checksum_remove(BS_HASH_XXH3, op.subkey);
  op_problems(&p, &op, 1, 0);
  expect_one(&p, "REMOVE with 1 bytes of data");
  mv.target_op = 3; /* not above its own id */
  op_problems(&p, &mv, 2, 0);
  expect_one(&p, "MOVE has a bad target_op 3");
  mv.target_op = 10; /* above the bucket's last op */
  op_problems(&p, &mv, 2, 0);
  expect_one(&p, "MOVE has a bad target_op 10");
  mv.target_op = 9;
  mv.object_id = ct_v("o");
  op_problems(&p, &mv, 2, 0);
  expect_one(&p, "MOVE with a payload (1 bytes)");
  op_problems(&p, &cl, 1, 4); /* a CLEAR after an op */
  expect_one(&p, "a CLEAR that is not the bucket's leading CLEAR");
  op_problems(&p, &cl, 0, 5); /* the span ends elsewhere */
  expect_one(&p, "the state's CLEAR span ends at 5");
  bs_op odd = {.op_id = 2, .type = (bs_op_type)7};
  op_problems(&p, &odd, 1, 0);
  expect_one(&p, "unknown type 7");
}

static void test_rules_buckets(void **state) {
  bs__vstream sh = {1, 100, BS_HASH_XXH3, 1};
  char name[BS_MAX_BUCKET_NAME + 1], sk[BS_SUBKEY_SIZE];
  problems p;
  bs__verify v = {collect, &p, 0, NULL, NULL, 0, 0};
  bs_op op = put_op(9, "", sk);
  struct {
    const char *what;
    size_t name_size;
    int unknown_stream;
    uint64_t d_checksum, d_count, d_bytes, last_op, clear_start, clear_op;
    const char *want; /* NULL: sound */
  } cases[] = {
      {"sound, a name of one byte", 1, 0, 0, 0, 0, 9, 0, 0, NULL},
      {"the longest name", BS_MAX_BUCKET_NAME, 0, 0, 0, 0, 9, 0, 0, NULL},
      {"a name too long", BS_MAX_BUCKET_NAME + 1, 0, 0, 0, 0, 9, 0, 0, "a name of 481 bytes"},
      {"an empty name", 0, 0, 0, 0, 0, 9, 0, 0, "a name of 0 bytes"},
      {"unknown stream", 1, 1, 0, 0, 0, 9, 0, 0, "unknown stream 1"},
      {"checksum", 1, 0, 1, 0, 0, 9, 0, 0, "running checksum"},
      {"count", 1, 0, 0, 1, 0, 9, 0, 0, "running count 2, 1 ops stored"},
      {"bytes", 1, 0, 0, 0, 1, 9, 0, 0, "running bytes"},
      {"last op", 1, 0, 0, 0, 0, 8, 0, 0, "last op 8, highest stored op 9"},
      {"above the op head", 1, 0, 0, 0, 0, 101, 0, 0, "above the stream's op head 100"},
      {"span", 1, 0, 0, 0, 0, 9, 3, 2, "bad CLEAR span [3, 2]"},
      {"span without a CLEAR", 1, 0, 0, 0, 0, 9, 0, 9, "and no CLEAR"},
  };
  (void)state;
  memset(name, 'n', sizeof name);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bs__vbucket b = rule_bucket(cases[i].unknown_stream ? NULL : &sh);
    memset(&p, 0, sizeof p);
    v.problems = 0;
    b.name = (bs_val){name, cases[i].name_size};
    bs__verify_op(&v, &b, &op, 1 + 1 + BS_SUBKEY_SIZE);
    b.checksum = b.sum + cases[i].d_checksum;
    b.count = b.n + cases[i].d_count;
    b.bytes = b.sum_bytes + cases[i].d_bytes;
    b.last_op = cases[i].last_op;
    b.clear_start = cases[i].clear_start;
    b.clear_op = cases[i].clear_op;
    bs__verify_bucket_end(&v, &b);
    if (cases[i].want ? v.problems < 1 || !strstr(p.text, cases[i].want) : v.problems != 0)
      fail_msg("%s: want %s, got %llu:\n%s", cases[i].what, cases[i].want ? cases[i].want : "none",
               (unsigned long long)v.problems, p.text);
  }
}

static void test_rules_streams(void **state) {
  problems p;
  bs__verify v = {collect, &p, 0, &bs__default_allocator, NULL, 0, 0};
  (void)state;
  memset(&p, 0, sizeof p);
  assert_int_equal(bs__verify_stream_add(&v, 1, 5, 5, BS_HASH_XXH3), BS_OK);
  assert_int_equal(bs__verify_stream_add(&v, 2, 5, 0, BS_HASH_SHA256), BS_OK);
  assert_int_equal(v.problems, 0);
  assert_int_equal(bs__verify_stream_add(&v, 3, 5, 6, 9), BS_OK);
  assert_int_equal(v.problems, 2);
  assert_non_null(strstr(p.text, "stream 3: unknown hash mode 9"));
  assert_non_null(strstr(p.text, "stream 3: checkpoint 6 above op head 5"));
  assert_false(bs__verify_stream(&v, 3)->hash_known);
  assert_int_equal(bs__verify_stream(&v, 2)->hash, BS_HASH_SHA256);
  assert_null(bs__verify_stream(&v, 4));
  bs__free(v.a, v.streams);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_clean),
      cmocka_unit_test(test_edited_put_data),
      cmocka_unit_test(test_random_corruption),
      cmocka_unit_test(test_rules_ops),
      cmocka_unit_test(test_rules_buckets),
      cmocka_unit_test(test_rules_streams),
  };
  g_seed = ct_run_seed("verify");
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
