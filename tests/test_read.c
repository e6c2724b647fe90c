/*
 * test_read.c: the LMDB backend's read side (lmdb_read.c), called directly through its
 * bs_lmdb_* entry points (no checksum cache, no front), on databases filled by the real writer.
 * Reads at op ids that are not checkpoints, empty and unknown buckets, chunk boundaries, a single
 * op larger than chunk_bytes, limit across buckets, chunking invariance over random options,
 * checksums against the ops read, checksum ranges, checkpoint changes, torn reads, stat, and
 * verify finding deliberately corrupted records. Randomized tests draw streams of the run's seed
 * (ct_run_seed "read": make test's seed block; BS_SEED replays one).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "lmdb_internal.h"
#include "util_contract.h"

/* ---- Fixture: a temp file with one stream whose snapshot is done ---------------------------- */

typedef struct rt_env {
  char dir[64], path[96];
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
} rt_env;

static bs_error rt_err;
static uint64_t rt_seed; /* the run's (ct_run_seed "read"), named in every failure */

#define RT_OK(expr)                                                                                \
  do {                                                                                             \
    int rt_rc_ = (expr);                                                                           \
    if (rt_rc_ != BS_OK)                                                                           \
      fail_msg("%s -> %s (%s) [seed %llu]", #expr, bs_strerror(rt_rc_), rt_err.msg,                \
               (unsigned long long)rt_seed);                                                       \
  } while (0)

#define RT_EQ(a, b)                                                                                \
  do {                                                                                             \
    uint64_t rt_a_ = (uint64_t)(a), rt_b_ = (uint64_t)(b);                                         \
    if (rt_a_ != rt_b_)                                                                            \
      fail_msg("%s == %s: got %llu, expected %llu [seed %llu]", #a, #b, (unsigned long long)rt_a_, \
               (unsigned long long)rt_b_, (unsigned long long)rt_seed);                            \
  } while (0)

static bs_val V(const char *s) {
  return bs__val_str(s);
}

static int quick(void) {
  const char *q = getenv("BS_TEST_QUICK");
  return q && *q && strcmp(q, "0") != 0;
}

/* The start of test k's generator, a stream of the run's seed (rt_seed). */
static uint64_t seed_stream(uint64_t k) {
  return ct_seed(rt_seed, k).s;
}

/* splitmix64 */
static uint64_t rnd(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint64_t below(uint64_t *s, uint64_t n) {
  return n ? rnd(s) % n : 0;
}

static void env_open(rt_env *e) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  uint32_t id;
  oo.flags = BS_OPEN_NOSYNC;
  memset(e, 0, sizeof *e);
  snprintf(e->dir, sizeof e->dir, "/tmp/bs_test_read.XXXXXX");
  assert_non_null(mkdtemp(e->dir));
  snprintf(e->path, sizeof e->path, "%s/db", e->dir);
  RT_OK(bs_open(&e->db, e->path, &oo, &rt_err));
  RT_OK(bs_stream_create(&id, e->db, "s1", NULL, &rt_err));
  RT_OK(bs_storage_open(&e->st, e->db, id, &rt_err));
  RT_OK(bs_writer_open(&e->w, e->st, NULL, &rt_err));
  RT_OK(bs_writer_snapshot_done(e->w, V("0000"), &rt_err));
}

static void env_close(rt_env *e) {
  char p[128];
  bs_writer_close(e->w);
  bs_storage_close(e->st);
  bs_close(e->db);
  unlink(e->path);
  snprintf(p, sizeof p, "%s-lock", e->path);
  unlink(p);
  rmdir(e->dir);
}

/* One row change: table "t", replica id rid, n rows of (bucket[i], "item", oid, data). */
static void save(rt_env *e, bs_tag tag, const char *rid, const char *const *buckets, size_t n,
                 const char *oid, const char *data) {
  bs_row rows[8];
  bs_save s = BS_SAVE_INIT;
  assert_true(n <= 8);
  for (size_t i = 0; i < n; i++) {
    rows[i].bucket = V(buckets[i]);
    rows[i].object_type = V("item");
    rows[i].object_id = V(oid);
    rows[i].data = V(data);
  }
  s.table = V("t");
  s.tag = tag;
  s.before_id = V(rid);
  s.after_id = V(rid);
  s.rows = rows;
  s.n_rows = tag == BS_DELETE ? 0 : n;
  RT_OK(bs_writer_save(e->w, &s, &rt_err));
}

static void put1(rt_env *e, const char *bucket, const char *rid, const char *data) {
  const char *b[1] = {bucket};
  save(e, BS_INSERT, rid, b, 1, rid, data);
}

static uint64_t commit(rt_env *e, const char *lsn) {
  bs_commit_result r;
  RT_OK(bs_writer_commit(&r, e->w, V(lsn), NULL, &rt_err));
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* ---- Collecting reads ----------------------------------------------------------------------- */

typedef struct rt_op {
  uint64_t op_id, target_op;
  int type;
  uint32_t checksum;
  size_t size;           /* the chunking size */
  size_t ot, oi, sk, dl; /* field sizes */
  char bucket[64];
  char data[64]; /* prefix of data, for spot checks */
} rt_op;

typedef struct rt_read {
  rt_op *ops;
  size_t n, cap;
  size_t chunks;
  size_t chunk_bytes; /* for the invariant checks; 0 = none */
  int stop_after;     /* on_chunk returns 42 after this many chunks (0 = never) */
  /* per call: the last chunk per bucket (to chain after/next_after) */
  uint64_t last_next_after[16];
  int last_has_more[16];
  size_t last_bytes[16]; /* chunking size of the bucket's previous chunk */
  char names[16][64];
  size_t n_names;
} rt_read;

static size_t name_slot(rt_read *r, bs_val name) {
  for (size_t i = 0; i < r->n_names; i++)
    if (strlen(r->names[i]) == name.size && memcmp(r->names[i], name.data, name.size) == 0)
      return i;
  assert_true(r->n_names < 16 && name.size < 64);
  memcpy(r->names[r->n_names], name.data, name.size);
  r->names[r->n_names][name.size] = '\0';
  r->last_next_after[r->n_names] = UINT64_MAX;
  return r->n_names++;
}

static int collect(const bs_chunk *ch, void *payload) {
  rt_read *r = payload;
  size_t bytes = 0, slot = name_slot(r, ch->bucket);
  uint64_t target = 0;
  assert_true(ch->n_ops > 0);
  /* a continuation chunk in the same call starts where the previous one ended */
  if (r->last_next_after[slot] != UINT64_MAX) {
    const bs_op *f = &ch->ops[0];
    size_t fsz = f->data.size + f->object_type.size + f->object_id.size + f->subkey.size;
    RT_EQ(ch->after, r->last_next_after[slot]);
    assert_true(r->last_has_more[slot]);
    /* a chunk is cut only when its next op would not fit */
    if (r->chunk_bytes && r->last_bytes[slot] + fsz <= r->chunk_bytes)
      fail_msg("chunk cut at %zu bytes, next op %zu, chunk_bytes %zu [seed %llu]",
               r->last_bytes[slot], fsz, r->chunk_bytes, (unsigned long long)rt_seed);
  }
  RT_EQ(ch->next_after, ch->ops[ch->n_ops - 1].op_id);
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *op = &ch->ops[i];
    rt_op *o;
    size_t sz = op->data.size + op->object_type.size + op->object_id.size + op->subkey.size;
    assert_true(op->op_id > (i ? ch->ops[i - 1].op_id : ch->after));
    if (op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR)
      target = op->target_op > target ? op->target_op : target;
    if (r->chunk_bytes && i > 0 && bytes + sz > r->chunk_bytes)
      fail_msg("chunk of %zu bytes over chunk_bytes %zu [seed %llu]", bytes + sz, r->chunk_bytes,
               (unsigned long long)rt_seed);
    bytes += sz;
    if (r->n == r->cap) {
      r->cap = r->cap ? r->cap * 2 : 64;
      r->ops = realloc(r->ops, r->cap * sizeof *r->ops);
      assert_non_null(r->ops);
    }
    o = &r->ops[r->n++];
    memset(o, 0, sizeof *o);
    o->op_id = op->op_id;
    o->target_op = op->target_op;
    o->type = op->type;
    o->checksum = op->checksum;
    o->size = sz;
    o->ot = op->object_type.size;
    o->oi = op->object_id.size;
    o->sk = op->subkey.size;
    o->dl = op->data.size;
    memcpy(o->bucket, ch->bucket.data, ch->bucket.size < 63 ? ch->bucket.size : 63);
    if (op->data.size) memcpy(o->data, op->data.data, op->data.size < 63 ? op->data.size : 63);
  }
  RT_EQ(ch->target_op, target);
  r->last_bytes[slot] = bytes;
  r->last_next_after[slot] = ch->next_after;
  r->last_has_more[slot] = ch->has_more;
  r->chunks++;
  if (r->stop_after && (int)r->chunks >= r->stop_after) return 42;
  return 0;
}

static void read_reset_call(rt_read *r) {
  for (size_t i = 0; i < 16; i++) r->last_next_after[i] = UINT64_MAX;
}

static void read_free(rt_read *r) {
  free(r->ops);
}

/* One call over the given buckets (sorted by the caller). */
static int read_call(rt_env *e, uint64_t C, const bs_bucket_request *req, size_t n, size_t limit,
                     size_t chunk_bytes, size_t max_bytes, rt_read *r, int *has_more) {
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  o.limit = limit ? limit : BS_BATCH_LIMIT_DEFAULT; /* this helper's 0: the default */
  if (chunk_bytes) o.chunk_bytes = chunk_bytes;     /* 0 here: the default (0 itself is honoured) */
  o.max_bytes = max_bytes ? max_bytes : BS_DEFAULT_BATCH_BYTES; /* the front's default */
  r->chunk_bytes = chunk_bytes;
  read_reset_call(r);
  return bs__lmdb_bucket_data(has_more, e->st, C, req, n, &o, collect, r, &rt_err);
}

/* Everything of one bucket in (after, C] in a single unlimited call. */
static void read_all(rt_env *e, uint64_t C, const char *bucket, uint64_t after, rt_read *r) {
  bs_bucket_request req = {V(bucket), after};
  int more = -1;
  RT_OK(read_call(e, C, &req, 1, SIZE_MAX / 2, SIZE_MAX / 2, SIZE_MAX / 2, r, &more));
  RT_EQ(more, 0);
}

static bs_checksum checksum(rt_env *e, uint64_t C, const char *bucket) {
  bs_checksum c;
  bs_val b = V(bucket);
  uint64_t gen = 99;
  RT_OK(bs__lmdb_checksums(&c, &gen, e->st, C, &b, 1, &rt_err));
  return c;
}

static bs_checksum sum_ops(const rt_read *r) {
  bs_checksum c = {0, 0};
  for (size_t i = 0; i < r->n; i++) {
    c.checksum = bs__cksum_add(c.checksum, r->ops[i].checksum);
    c.count++;
  }
  return c;
}

/* ---- Raw access for corruption tests -------------------------------------------------------- */

static bs__lmdb_db *lm(rt_env *e) {
  return (bs__lmdb_db *)e->db;
}

static uint64_t bucket_id(rt_env *e, const char *bucket) {
  MDB_txn *txn;
  uint64_t id = 0;
  RT_OK(bs__lmdb_txn_begin(lm(e), MDB_RDONLY, &txn, &rt_err));
  RT_OK(bs__lmdb_bucket_id(lm(e), txn, NULL, bs_storage_stream_id(e->st), V(bucket), &id, &rt_err));
  bs__lmdb_txn_abort(lm(e), txn);
  return id;
}

/* Reads a bucket state, lets edit change it, writes it back with a raw mdb_put. */
static void edit_state(rt_env *e, const char *bucket, void (*edit)(bs__bucket_state *, void *),
                       void *arg) {
  MDB_txn *txn;
  unsigned char kb[8], buf[BS_BUCKET_STATE_FIXED + BS_MAX_BUCKET_NAME];
  unsigned char out[BS_BUCKET_STATE_FIXED + BS_MAX_BUCKET_NAME];
  MDB_val k = {8, kb}, v;
  bs__bucket_state s;
  uint64_t id = bucket_id(e, bucket);
  bs__put_u64be(kb, id);
  RT_OK(bs__lmdb_txn_begin(lm(e), 0, &txn, &rt_err));
  assert_int_equal(mdb_get(txn, lm(e)->bstate, &k, &v), 0);
  assert_true(v.mv_size <= sizeof buf);
  memcpy(buf, v.mv_data, v.mv_size);
  v.mv_data = buf;
  RT_OK(bs__bucket_state_decode(&v, &s));
  edit(&s, arg);
  bs__bucket_state_encode(out, &s);
  v.mv_size = bs__bucket_state_size(&s);
  v.mv_data = out;
  assert_int_equal(mdb_put(txn, lm(e)->bstate, &k, &v, 0), 0);
  RT_OK(bs__lmdb_txn_commit(lm(e), txn, &rt_err));
}

static void raw_put(rt_env *e, MDB_dbi dbi, const void *key, size_t klen, const void *val,
                    size_t vlen) {
  MDB_txn *txn;
  MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
  RT_OK(bs__lmdb_txn_begin(lm(e), 0, &txn, &rt_err));
  assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
  RT_OK(bs__lmdb_txn_commit(lm(e), txn, &rt_err));
}

/* The ops of bucket in (0, C] walked through the op records' cursor (lmdb_ops.c), compared field by
 * field with what bucket_data served (chunking, cursors and limits must not change an op). */
static void compare_with_reference(rt_env *e, const char *bucket, uint64_t C, const rt_read *got) {
  MDB_txn *txn;
  bs__lmdb_opc oc;
  bs_op op;
  size_t i = 0;
  int found;
  RT_OK(bs__lmdb_txn_begin(lm(e), MDB_RDONLY, &txn, &rt_err));
  RT_OK(bs__lmdb_opc_open(&oc, lm(e), txn, &rt_err));
  RT_OK(bs__lmdb_opc_seek_ge(&oc, bucket_id(e, bucket), 1, &op, &found, &rt_err));
  while (found && op.op_id <= C) {
    const rt_op *o;
    assert_true(i < got->n);
    o = &got->ops[i++];
    RT_EQ(o->op_id, op.op_id);
    RT_EQ(o->type, op.type);
    RT_EQ(o->checksum, op.checksum);
    RT_EQ(o->target_op, op.target_op);
    RT_EQ(o->ot, op.object_type.size);
    RT_EQ(o->oi, op.object_id.size);
    RT_EQ(o->sk, op.subkey.size);
    RT_EQ(o->dl, op.data.size);
    if (op.data.size)
      assert_memory_equal(o->data, op.data.data, op.data.size < 63 ? op.data.size : 63);
    RT_OK(bs__lmdb_opc_next(&oc, &op, &found, &rt_err));
  }
  RT_EQ(i, got->n);
  bs__lmdb_opc_close(&oc);
  bs__lmdb_txn_abort(lm(e), txn);
}

/* ---- Tests ---------------------------------------------------------------------------------- */

static void test_empty_and_unknown(void **state) {
  rt_env e;
  bs_checkpoint cp;
  bs_status stt;
  rt_read r = {0};
  bs_bucket_request req = {V("nope"), 0};
  bs_val b = V("nope");
  bs_checksum c = {7, 7};
  uint64_t gen = 7;
  int more = -1;
  (void)state;
  env_open(&e);
  RT_OK(bs_get_checkpoint(&cp, e.st, &rt_err));
  RT_EQ(cp.op_id, 0);
  RT_EQ(cp.has_lsn, 0);
  RT_OK(bs_get_status(&stt, e.st, &rt_err)); /* out zeroed by the front */
  RT_EQ(stt.checkpoint, 0);
  RT_EQ(stt.snapshot_done, 0); /* snapshot done, but no checkpoint yet */
  RT_EQ(stt.state, BS_STREAM_PROCESSING);
  RT_OK(read_call(&e, 100, &req, 1, 0, 0, 0, &r, &more));
  RT_EQ(r.chunks, 0);
  RT_EQ(more, 0);
  RT_OK(bs__lmdb_checksums(&c, &gen, e.st, 100, &b, 1, &rt_err));
  RT_EQ(c.checksum, 0);
  RT_EQ(c.count, 0);
  RT_EQ(gen, 0);
  /* a bucket with ops, read outside its range, yields no chunk */
  put1(&e, "b", "r1", "{\"a\":1}");
  RT_EQ(commit(&e, "0001"), 1);
  req.bucket = V("b");
  req.after = 1;
  RT_OK(read_call(&e, 5, &req, 1, 0, 0, 0, &r, &more));
  RT_EQ(r.chunks, 0);
  RT_EQ(more, 0);
  req.after = 0;
  RT_OK(read_call(&e, 0, &req, 1, 0, 0, 0, &r, &more));
  RT_EQ(r.chunks, 0);
  RT_OK(bs_get_status(&stt, e.st, &rt_err));
  RT_EQ(stt.snapshot_done, 1);
  RT_EQ(stt.checkpoint, 1);
  RT_EQ(stt.last_persisted_op, 1);
  RT_EQ(stt.state, BS_STREAM_ACTIVE);
  assert_true(stt.has_lsn && stt.lsn_size == 4 && memcmp(stt.lsn, "0001", 4) == 0);
  read_free(&r);
  env_close(&e);
}

static void test_read_at_any_op_id(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_checkpoint cp;
  char rid[16], data[32];
  uint64_t C;
  (void)state;
  env_open(&e);
  for (int i = 0; i < 10; i++) {
    snprintf(rid, sizeof rid, "r%d", i);
    snprintf(data, sizeof data, "{\"i\":%d}", i);
    put1(&e, "b", rid, data);
  }
  C = commit(&e, "0001");
  RT_EQ(C, 10);
  RT_OK(bs_get_checkpoint(&cp, e.st, &rt_err));
  RT_EQ(cp.op_id, 10);
  assert_true(cp.has_lsn && cp.lsn_size == 4 && memcmp(cp.lsn, "0001", 4) == 0);

  read_all(&e, C, "b", 0, &r);
  RT_EQ(r.n, 10);
  for (size_t i = 0; i < r.n; i++) {
    char want[32];
    uint32_t ck;
    snprintf(rid, sizeof rid, "r%d", (int)i);
    snprintf(want, sizeof want, "{\"i\":%d}", (int)i);
    RT_EQ(r.ops[i].op_id, i + 1);
    RT_EQ(r.ops[i].type, BS_OP_PUT);
    assert_string_equal(r.ops[i].data, want);
    ck = bs_checksum_put(BS_HASH_XXH3, V("item"), V(rid), V(want));
    RT_EQ(r.ops[i].checksum, ck);
    RT_EQ(r.ops[i].size, strlen(want) + 4 + strlen(rid) + BS_SUBKEY_SIZE);
  }
  RT_EQ(sum_ops(&r).checksum, checksum(&e, C, "b").checksum);
  /* C + 1 (not a checkpoint) and an op id in the middle */
  r.n = 0;
  read_all(&e, C + 1, "b", 0, &r);
  RT_EQ(r.n, 10);
  r.n = 0;
  read_all(&e, 7, "b", 3, &r);
  RT_EQ(r.n, 4);
  RT_EQ(r.ops[0].op_id, 4);
  RT_EQ(r.ops[3].op_id, 7);

  /* ops persisted above the checkpoint: reads below it do not see them, reads above do */
  put1(&e, "b", "r10", "{\"i\":10}");
  put1(&e, "b", "r11", "{\"i\":11}");
  RT_OK(bs_writer_flush(NULL, e.w, &rt_err));
  for (uint64_t c = 0; c <= 13; c++) {
    bs_checksum got = checksum(&e, c, "b");
    r.n = 0;
    read_all(&e, c, "b", 0, &r);
    RT_EQ(r.n, c < 12 ? c : 12);
    RT_EQ(got.count, r.n);
    RT_EQ(got.checksum, sum_ops(&r).checksum);
  }
  read_free(&r);
  env_close(&e);
}

/* data lengths chosen so that each op's chunking size is exactly 100 bytes */
static void fixed_size_ops(rt_env *e, const char *bucket, int n, int big_at, size_t big) {
  char rid[16], *data;
  data = malloc(big + 1 > 200 ? big + 1 : 200);
  assert_non_null(data);
  for (int i = 0; i < n; i++) {
    size_t len;
    snprintf(rid, sizeof rid, "%c%03d", bucket[0], i); /* 4 bytes; object_id = rid */
    len = i == big_at ? big : 100 - 4 - 4 - BS_SUBKEY_SIZE;
    memset(data, 'x', len);
    data[0] = '"';
    data[len - 1] = '"';
    data[len] = '\0';
    put1(e, bucket, rid, data);
  }
  free(data);
}

static void test_chunk_boundaries(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_bucket_request req = {V("b"), 0};
  uint64_t C;
  int more;
  (void)state;
  env_open(&e);
  fixed_size_ops(&e, "b", 10, -1, 0);
  C = commit(&e, "0001");
  /* exactly 3 ops per chunk at 300 bytes, 2 at 299 */
  RT_OK(read_call(&e, C, &req, 1, 100, 300, 0, &r, &more));
  RT_EQ(r.n, 10);
  RT_EQ(r.chunks, 4);
  RT_EQ(more, 0);
  RT_EQ(r.last_has_more[0], 0);
  r.n = r.chunks = 0;
  RT_OK(read_call(&e, C, &req, 1, 100, 299, 0, &r, &more));
  RT_EQ(r.n, 10);
  RT_EQ(r.chunks, 5);
  /* chunk_bytes smaller than one op: one op per chunk */
  r.n = r.chunks = 0;
  RT_OK(read_call(&e, C, &req, 1, 100, 1, 0, &r, &more));
  RT_EQ(r.chunks, 10);
  /* max_bytes cuts the call: 450 bytes -> 4 ops, has_more */
  r.n = r.chunks = 0;
  RT_OK(read_call(&e, C, &req, 1, 100, 1000, 450, &r, &more));
  RT_EQ(r.n, 4);
  RT_EQ(more, 1);
  RT_EQ(r.last_has_more[0], 1);
  RT_EQ(r.last_next_after[0], 4);
  read_free(&r);
  env_close(&e);
}

static void test_large_op(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_bucket_request req = {V("b"), 0};
  uint64_t C;
  int more;
  (void)state;
  env_open(&e);
  fixed_size_ops(&e, "b", 7, 3, 5000); /* op 4 is ~5 kB */
  C = commit(&e, "0001");
  RT_OK(read_call(&e, C, &req, 1, 100, 250, 0, &r, &more));
  /* [1,2] [3] [4 alone] [5,6] [7] */
  RT_EQ(r.n, 7);
  RT_EQ(r.chunks, 5);
  RT_EQ(r.ops[3].size, 5000 + 4 + 4 + BS_SUBKEY_SIZE);
  /* a large op as the first op of a call passes even a small byte cap */
  r.n = r.chunks = 0;
  req.after = 3;
  RT_OK(read_call(&e, C, &req, 1, 100, 250, 1000, &r, &more));
  RT_EQ(r.n, 1);
  RT_EQ(r.ops[0].op_id, 4);
  RT_EQ(more, 1);
  read_free(&r);
  env_close(&e);
}

static void test_limit_across_buckets(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_bucket_request req[4] = {{V("a"), 0}, {V("b"), 0}, {V("c"), 0}, {V("d"), 0}};
  uint64_t C;
  int more;
  (void)state;
  env_open(&e);
  fixed_size_ops(&e, "a", 5, -1, 0); /* ops 1..5 */
  fixed_size_ops(&e, "c", 5, -1, 0); /* ops 6..10; "b" and "d" unknown */
  C = commit(&e, "0001");
  /* limit 7: all of a, 2 of c */
  RT_OK(read_call(&e, C, req, 4, 7, 0, 0, &r, &more));
  RT_EQ(r.n, 7);
  RT_EQ(r.chunks, 2);
  RT_EQ(more, 1);
  RT_EQ(r.last_has_more[0], 0);
  RT_EQ(r.last_has_more[1], 1);
  RT_EQ(r.last_next_after[1], 7);
  /* limit 5 ends exactly at a's end: a complete, c untouched, the call says more */
  r.n = r.chunks = 0;
  r.n_names = 0;
  RT_OK(read_call(&e, C, req, 4, 5, 0, 0, &r, &more));
  RT_EQ(r.n, 5);
  RT_EQ(r.chunks, 1);
  RT_EQ(r.last_has_more[0], 0);
  RT_EQ(more, 1);
  /* limit 10: everything, and the call knows it is done */
  r.n = r.chunks = 0;
  RT_OK(read_call(&e, C, req, 4, 10, 0, 0, &r, &more));
  RT_EQ(r.n, 10);
  RT_EQ(more, 0);
  /* the callback's non-zero return stops the call and comes back unchanged */
  r.n = r.chunks = 0;
  r.stop_after = 1;
  assert_int_equal(read_call(&e, C, req, 4, 10, 0, 0, &r, &more), 42);
  RT_EQ(r.chunks, 1);
  read_free(&r);
  env_close(&e);
}

/* A random workload over a few buckets: inserts, updates moving rows between buckets (REMOVEs),
 * deletes, several commits and a flushed tail above the last checkpoint. */
static uint64_t random_workload(rt_env *e, uint64_t *s, int n_saves) {
  static const char *const names[] = {"b0", "b1", "b2", "b3", "b4"};
  int live[64] = {0};
  char rid[16], data[200];
  uint64_t C = 0;
  for (int i = 0; i < n_saves; i++) {
    int row = (int)below(s, 64);
    const char *bk[2];
    size_t nb = 1 + below(s, 2), dl = below(s, 150);
    snprintf(rid, sizeof rid, "row%d", row);
    bk[0] = names[below(s, 5)];
    bk[1] = names[below(s, 5)];
    if (nb == 2 && bk[0] == bk[1]) nb = 1;
    memset(data, 'a' + (int)below(s, 26), dl);
    data[dl] = '\0';
    if (live[row] && below(s, 4) == 0) {
      save(e, BS_DELETE, rid, bk, 0, rid, "");
      live[row] = 0;
    } else {
      save(e, live[row] ? BS_UPDATE : BS_INSERT, rid, bk, nb, rid, data);
      live[row] = 1;
    }
    if (below(s, 20) == 0) {
      char lsn[16];
      snprintf(lsn, sizeof lsn, "%08d", i + 1);
      C = commit(e, lsn);
    }
  }
  if (C == 0) C = commit(e, "99999999");
  RT_OK(bs_writer_flush(NULL, e->w, &rt_err));
  return C;
}

static int op_cmp(const void *a, const void *b) {
  const rt_op *x = a, *y = b;
  int c = strcmp(x->bucket, y->bucket);
  if (c) return c;
  return x->op_id < y->op_id ? -1 : x->op_id > y->op_id;
}

static void test_chunking_invariance(void **state) {
  rt_env e;
  uint64_t s = seed_stream(1), head;
  bs_status stt;
  int rounds = quick() ? 40 : 400;
  (void)state;
  env_open(&e);
  random_workload(&e, &s, quick() ? 400 : 3000);
  RT_OK(bs_get_status(&stt, e.st, &rt_err));
  head = stt.last_persisted_op;
  for (int round = 0; round < rounds; round++) {
    bs_bucket_request req[6];
    const char *all[6] = {"b0", "b1", "b2", "b3", "b4", "zz"};
    uint64_t C = below(&s, head + 3), after[6];
    size_t limit = 1 + below(&s, 50), cb = 1 + below(&s, 2000), mb = 1 + below(&s, 5000);
    rt_read ref = {0}, got = {0};
    size_t n = 0;
    for (int i = 0; i < 6; i++) {
      after[i] = below(&s, 3) == 0 ? below(&s, C + 1) : 0;
      if (below(&s, 4)) {
        req[n].bucket = V(all[i]);
        req[n++].after = after[i];
      }
    }
    /* reference: one unlimited call per bucket */
    for (size_t i = 0; i < n; i++) read_all(&e, C, req[i].bucket.data, req[i].after, &ref);
    /* chunked: repeated calls, each with the remaining buckets */
    for (int calls = 0; n > 0; calls++) {
      int more = -1;
      size_t before = got.n, m = 0;
      assert_true(calls < 100000);
      got.n_names = 0;
      RT_OK(read_call(&e, C, req, n, limit, cb, mb, &got, &more));
      if (!more) break;
      assert_true(got.n > before); /* progress */
      for (size_t i = 0; i < n; i++) {
        size_t j;
        for (j = 0; j < got.n_names; j++)
          if (strcmp(got.names[j], req[i].bucket.data) == 0) break;
        if (j < got.n_names) {
          if (!got.last_has_more[j]) continue; /* finished */
          req[i].after = got.last_next_after[j];
        }
        req[m++] = req[i];
      }
      n = m;
    }
    qsort(ref.ops, ref.n, sizeof *ref.ops, op_cmp);
    qsort(got.ops, got.n, sizeof *got.ops, op_cmp);
    RT_EQ(got.n, ref.n);
    for (size_t i = 0; i < ref.n; i++) {
      assert_string_equal(got.ops[i].bucket, ref.ops[i].bucket);
      RT_EQ(got.ops[i].op_id, ref.ops[i].op_id);
      RT_EQ(got.ops[i].checksum, ref.ops[i].checksum);
    }
    read_free(&ref);
    read_free(&got);
  }
  env_close(&e);
}

static void test_checksums_match_reads(void **state) {
  rt_env e;
  uint64_t s = seed_stream(2), head;
  const char *names[5] = {"b0", "b1", "b2", "b3", "b4"};
  bs_val vals[6] = {V("b0"), V("b1"), V("b2"), V("b3"), V("b4"), V("unknown")};
  bs_status stt;
  (void)state;
  env_open(&e);
  random_workload(&e, &s, quick() ? 300 : 2000);
  RT_OK(bs_get_status(&stt, e.st, &rt_err));
  head = stt.last_persisted_op;
  for (uint64_t C = 0; C <= head + 1; C += 1 + below(&s, 7)) {
    bs_checksum cs[6], rg[6];
    uint64_t gen[6];
    int cleared[6];
    uint64_t from = below(&s, C + 1);
    RT_OK(bs__lmdb_checksums(cs, gen, e.st, C, vals, 6, &rt_err));
    RT_EQ(cs[5].count, 0);
    RT_OK(bs__lmdb_checksum_ranges(rg, cleared, gen, e.st, from, C, vals, 6, &rt_err));
    for (int i = 0; i < 5; i++) {
      rt_read r = {0}, rf = {0};
      bs_checksum want;
      read_all(&e, C, names[i], 0, &r);
      want = sum_ops(&r);
      RT_EQ(cs[i].checksum, want.checksum);
      RT_EQ(cs[i].count, want.count);
      read_all(&e, C, names[i], from, &rf);
      want = sum_ops(&rf);
      RT_EQ(cleared[i], 0);
      RT_EQ(rg[i].checksum, want.checksum);
      RT_EQ(rg[i].count, want.count);
      read_free(&r);
      read_free(&rf);
    }
  }
  for (int i = 0; i < 5; i++) {
    rt_read r = {0};
    read_all(&e, head, names[i], 0, &r);
    compare_with_reference(&e, names[i], head, &r);
    read_free(&r);
  }
  env_close(&e);
}

static void bump_checksum(bs__bucket_state *s, void *arg) {
  (void)arg;
  s->checksum += 1;
  s->count += 2;
}

typedef struct span {
  uint64_t start, op;
} span;
static void set_span(bs__bucket_state *s, void *arg) {
  const span *sp = arg;
  s->clear_start = sp->start;
  s->clear_op = sp->op;
}

static void count_problem(const char *msg, void *payload) {
  int *n = payload;
  (*n)++;
  if (getenv("BS_TEST_VERBOSE")) fprintf(stderr, "  verify: %s\n", msg);
}

static void test_verify_and_stat(void **state) {
  rt_env e;
  bs_stat stat;
  uint64_t problems = 99;
  int seen = 0;
  const char *two[2] = {"a", "b"};
  unsigned char key[16], bad[3] = {9, 9, 9};
  (void)state;
  env_open(&e);
  save(&e, BS_INSERT, "r1", two, 2, "r1", "{}"); /* PUT a 1, PUT b 2 */
  put1(&e, "a", "r2", "{}");                     /* PUT a 3 */
  save(&e, BS_UPDATE, "r1", two, 1, "r1", "{}"); /* PUT a 4, REMOVE b 5 */
  commit(&e, "0001");
  RT_OK(bs_db_stat(&stat, e.db, &rt_err)); /* out zeroed by the front */
  RT_EQ(stat.streams, 1);
  RT_EQ(stat.buckets, 2);
  RT_EQ(stat.ops_put, 4);
  RT_EQ(stat.ops_remove, 1);
  RT_EQ(stat.ops_move + stat.ops_clear, 0);
  RT_EQ(stat.source_records, 2);
  assert_true(stat.file_bytes > 0);

  RT_OK(bs__lmdb_verify(&problems, e.db, count_problem, &seen, &rt_err));
  RT_EQ(problems, 0);
  RT_EQ(seen, 0);
  /* a wrong running checksum and count */
  edit_state(&e, "a", bump_checksum, NULL);
  RT_OK(bs__lmdb_verify(&problems, e.db, count_problem, &seen, &rt_err));
  RT_EQ(problems, 2);
  RT_EQ(seen, 2);
  /* an op that does not decode, in bucket b */
  bs__put_u64be(key, bucket_id(&e, "b"));
  bs__put_u64be(key + 8, 6);
  raw_put(&e, lm(&e)->ops, key, 16, bad, sizeof bad);
  seen = 0;
  RT_OK(bs__lmdb_verify(&problems, e.db, count_problem, &seen, &rt_err));
  assert_true(problems >= 3);
  RT_EQ((uint64_t)seen, problems);
  /* ops of a bucket id without a state */
  bs__put_u64be(key, 1000);
  raw_put(&e, lm(&e)->ops, key, 16, bad, sizeof bad);
  RT_OK(bs__lmdb_verify(&problems, e.db, NULL, NULL, &rt_err));
  assert_true(problems >= 4);
  env_close(&e);
}

static void test_torn_reads(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_bucket_request req = {V("b"), 0};
  bs_val b = V("b");
  bs_checksum c;
  span sp = {3, 6};
  int more, cleared;
  (void)state;
  env_open(&e);
  fixed_size_ops(&e, "b", 8, -1, 0);
  commit(&e, "0001");
  edit_state(&e, "b", set_span, &sp);
  for (uint64_t C = 0; C <= 9; C++) {
    int torn = C >= 3 && C < 6;
    int want = torn ? BS_EINVALIDATED : BS_OK;
    memset(&rt_err, 0, sizeof rt_err);
    RT_EQ(read_call(&e, C, &req, 1, 0, 0, 0, &r, &more), want);
    if (torn) assert_non_null(strstr(rt_err.msg, "was compacted; read a newer checkpoint"));
    if (torn) assert_non_null(strstr(rt_err.msg, "\"b\""));
    RT_EQ(bs__lmdb_checksums(&c, NULL, e.st, C, &b, 1, &rt_err), want);
    RT_EQ(bs__lmdb_checksum_ranges(&c, &cleared, NULL, e.st, 0, C, &b, 1, &rt_err), want);
  }
  read_free(&r);
  env_close(&e);
}

/* Rewrites op `op_id` of bucket as a MOVE / CLEAR (payload dropped, checksum kept), the way
 * compaction does, through the op records' cursor. */
static void rewrite_op(rt_env *e, const char *bucket, uint64_t op_id, int type, uint64_t target) {
  MDB_txn *txn;
  bs__lmdb_opc oc;
  bs_op op, bare;
  int found;
  memset(&bare, 0, sizeof bare);
  RT_OK(bs__lmdb_txn_begin(lm(e), 0, &txn, &rt_err));
  RT_OK(bs__lmdb_opc_open(&oc, lm(e), txn, &rt_err));
  RT_OK(bs__lmdb_opc_get(&oc, bucket_id(e, bucket), op_id, &op, &found, &rt_err));
  assert_true(found);
  bare.op_id = op_id;
  bare.type = (bs_op_type)type;
  bare.checksum = op.checksum;
  bare.target_op = target;
  RT_OK(bs__lmdb_opc_bare(&oc, &bare, &rt_err));
  RT_OK(bs__lmdb_opc_flush(&oc, &rt_err)); /* the change is written when the cursor leaves */
  bs__lmdb_opc_close(&oc);
  RT_OK(bs__lmdb_txn_commit(lm(e), txn, &rt_err));
}

static void test_move_clear(void **state) {
  rt_env e;
  rt_read r = {0};
  bs_bucket_request req = {V("b"), 0};
  bs_val b = V("b");
  bs_checksum full, c;
  int more, cleared = -1;
  (void)state;
  env_open(&e);
  fixed_size_ops(&e, "b", 8, -1, 0);
  commit(&e, "0001");
  full = checksum(&e, 8, "b");
  rewrite_op(&e, "b", 2, BS_OP_MOVE, 7);
  rewrite_op(&e, "b", 3, BS_OP_CLEAR, 12);
  rewrite_op(&e, "b", 5, BS_OP_MOVE, 6);
  /* chunks of at most 100 bytes: a MOVE/CLEAR has size 0, so [1,2,3] [4,5] [6] [7] [8] */
  RT_OK(read_call(&e, 8, &req, 1, 100, 100, 0, &r, &more));
  RT_EQ(r.chunks, 5);
  RT_EQ(r.ops[1].type, BS_OP_MOVE);
  RT_EQ(r.ops[1].size, 0);
  RT_EQ(r.ops[2].type, BS_OP_CLEAR);
  RT_EQ(r.ops[2].target_op, 12);
  compare_with_reference(&e, "b", 8, &r);
  /* the chunk's target_op is checked in collect(); spot-check the values per chunk */
  r.n = r.chunks = 0;
  RT_OK(read_call(&e, 8, &req, 1, 100, 200, 0, &r, &more)); /* [1,2,3,4] [5,6,7] [8] */
  RT_EQ(r.chunks, 3);
  /* checksums are unchanged by MOVE/CLEAR; a range holding the CLEAR says so */
  c = checksum(&e, 8, "b");
  RT_EQ(c.checksum, full.checksum);
  RT_OK(bs__lmdb_checksum_ranges(&c, &cleared, NULL, e.st, 1, 6, &b, 1, &rt_err));
  RT_EQ(cleared, 1);
  full = checksum(&e, 6, "b");
  RT_EQ(c.checksum, full.checksum);
  RT_EQ(c.count, 6);
  RT_OK(bs__lmdb_checksum_ranges(&c, &cleared, NULL, e.st, 3, 6, &b, 1, &rt_err));
  RT_EQ(cleared, 0);
  RT_EQ(c.count, 3);
  read_free(&r);
  env_close(&e);
}

/* Change records are written by the writer; these only check what the reads make of them
 * (through the front, which owns the "too many" rule). */
typedef struct changes_seen {
  int inv_b, inv_l;
  size_t nb, nl, nu;
  char buckets[2048][8];
} changes_seen;

static int grab_changes(const bs_checkpoint_changes *ch, void *payload) {
  changes_seen *c = payload;
  c->inv_b = ch->invalidate_data_buckets;
  c->inv_l = ch->invalidate_parameter_buckets;
  c->nb = ch->n_updated_buckets;
  c->nl = ch->n_updated_lookups;
  c->nu = ch->n_updated_write_checkpoint_users;
  for (size_t i = 0; i < ch->n_updated_buckets && i < 2048; i++) {
    size_t n = ch->updated_buckets[i].size < 7 ? ch->updated_buckets[i].size : 7;
    memcpy(c->buckets[i], ch->updated_buckets[i].data, n);
    c->buckets[i][n] = '\0';
  }
  return 0;
}

static int has_bucket(const changes_seen *c, const char *name) {
  for (size_t i = 0; i < c->nb; i++)
    if (strcmp(c->buckets[i], name) == 0) return 1;
  return 0;
}

static void test_checkpoint_changes(void **state) {
  rt_env e;
  changes_seen *c = calloc(1, sizeof *c);
  uint64_t C1, C2, C3;
  char name[16], rid[16];
  (void)state;
  assert_non_null(c);
  env_open(&e);
  put1(&e, "b1", "r1", "{}");
  put1(&e, "b2", "r2", "{}");
  C1 = commit(&e, "0001");
  put1(&e, "b3", "r3", "{}");
  put1(&e, "b3", "r4", "{}");
  C2 = commit(&e, "0002");
  RT_OK(bs_get_checkpoint_changes(e.st, C1, C2, grab_changes, c, &rt_err));
  RT_EQ(c->inv_b, 0);
  assert_true(has_bucket(c, "b3"));
  RT_EQ(c->nb, 1); /* duplicates removed, nothing from before C1 */
  RT_OK(bs_get_checkpoint_changes(e.st, 0, C2, grab_changes, c, &rt_err));
  assert_true(has_bucket(c, "b1") && has_bucket(c, "b2") && has_bucket(c, "b3"));
  /* a range ending inside a flush */
  RT_OK(bs_get_checkpoint_changes(e.st, C1, C1 + 1, grab_changes, c, &rt_err));
  assert_true(has_bucket(c, "b3"));
  RT_OK(bs_get_checkpoint_changes(e.st, C2, C2, grab_changes, c, &rt_err));
  RT_EQ(c->nb, 0);
  /* more than 1000 buckets in one range: invalidate */
  for (int i = 0; i < 1100; i++) {
    snprintf(name, sizeof name, "m%d", i);
    snprintf(rid, sizeof rid, "x%d", i);
    put1(&e, name, rid, "{}");
    if (i == 600) RT_OK(bs_writer_flush(NULL, e.w, &rt_err));
  }
  C3 = commit(&e, "0003");
  RT_OK(bs_get_checkpoint_changes(e.st, C2, C3, grab_changes, c, &rt_err));
  RT_EQ(c->inv_b, 1);
  RT_EQ(c->nb, 0);
  RT_OK(bs_get_checkpoint_changes(e.st, C1, C2, grab_changes, c, &rt_err));
  RT_EQ(c->inv_b, 0);
  env_close(&e);
  free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty_and_unknown),
      cmocka_unit_test(test_read_at_any_op_id),
      cmocka_unit_test(test_chunk_boundaries),
      cmocka_unit_test(test_large_op),
      cmocka_unit_test(test_limit_across_buckets),
      cmocka_unit_test(test_chunking_invariance),
      cmocka_unit_test(test_checksums_match_reads),
      cmocka_unit_test(test_verify_and_stat),
      cmocka_unit_test(test_torn_reads),
      cmocka_unit_test(test_checkpoint_changes),
      cmocka_unit_test(test_move_clear),
  };
  rt_seed = ct_run_seed("read");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
