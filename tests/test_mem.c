/*
 * test_mem.c: the memory backend (mem.c) through the public API: golden checksums, the diff
 * rules of contract.md 4.1, chunking (5.2), the compaction examples of section 6, torn reads,
 * write checkpoints, initial-replication compaction, allocation-failure atomicity (with the
 * record and bucket indexes checked by verify after every rollback), and report_error.
 * The conformance suite (all backends) lives elsewhere; this file stays focused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"
#include "util_contract.h"

#include "mem_internal.h" /* test_verify_walk reaches into the store to break it */

static unsigned long long g_seed; /* the run's (ct_run_seed); each test draws a stream of it */

/* ---- Fixture and helpers ----------------------------------------------------------------- */

typedef struct fx {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
} fx;

static bs_val V(const char *s) {
  bs_val v = {s, strlen(s)};
  return v;
}

static void fx_open(fx *f, bs_hash hash, const bs_open_options *oo) {
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  bs_error e = {0, ""};
  uint32_t id;
  so.hash = hash;
  memset(f, 0, sizeof *f);
  assert_int_equal(bs_open_memory(&f->db, oo, &e), BS_OK);
  assert_int_equal(bs_stream_create(&id, f->db, "s1", &so, &e), BS_OK);
  assert_int_equal(bs_storage_open(&f->st, f->db, id, &e), BS_OK);
  assert_int_equal(bs_writer_open(&f->w, f->st, NULL, &e), BS_OK);
}

static void fx_close(fx *f) {
  bs_writer_close(f->w);
  bs_storage_close(f->st);
  bs_close(f->db);
}

/* save(table "t", tag, id, rows "bucket:type:id:data" ...) */
static int save(fx *f, bs_tag tag, const char *before, const char *id, int nrows,
                const char **rows) {
  bs_save s = BS_SAVE_INIT;
  bs_row r[8];
  char buf[8][4][64];
  bs_error e = {0, ""};
  int rc;
  s.table = V("t");
  s.tag = tag;
  if (before) s.before_id = V(before);
  if (id) s.after_id = V(id);
  for (int i = 0; i < nrows; i++) {
    sscanf(rows[i], "%63[^:]:%63[^:]:%63[^:]:%63[^\n]", buf[i][0], buf[i][1], buf[i][2], buf[i][3]);
    r[i].bucket = V(buf[i][0]);
    r[i].object_type = V(buf[i][1]);
    r[i].object_id = V(buf[i][2]);
    r[i].data = V(buf[i][3]);
  }
  s.rows = r;
  s.n_rows = (size_t)nrows;
  rc = bs_writer_save(f->w, &s, &e);
  if (rc) fprintf(stderr, "save: %s\n", e.msg);
  return rc;
}

static uint64_t commit(fx *f, const char *lsn) {
  bs_commit_result r;
  bs_error e = {0, ""};
  int rc = bs_writer_commit(&r, f->w, V(lsn), NULL, &e);
  if (rc) fprintf(stderr, "commit: %s\n", e.msg);
  assert_int_equal(rc, BS_OK);
  return r.checkpoint;
}

static void start(fx *f) {
  assert_int_equal(bs_writer_snapshot_done(f->w, V("0001"), NULL), BS_OK);
}

/* Collected ops of one bucket_data walk. */
#define MAXOPS 512
typedef struct rop {
  uint64_t id, target;
  bs_op_type type;
  uint32_t checksum;
  char oid[32], data[64], bucket[8];
} rop;
typedef struct coll {
  rop ops[MAXOPS];
  size_t n, chunks;
  uint64_t last_next_after, max_target;
  size_t chunk_bytes; /* when set: every chunk must respect it (or hold a single op) */
} coll;

static int on_chunk(const bs_chunk *c, void *p) {
  coll *k = p;
  size_t bytes = 0;
  assert_true(c->n_ops > 0);
  for (size_t i = 0; i < c->n_ops; i++) {
    rop *o = &k->ops[k->n++];
    assert_true(k->n < MAXOPS);
    if (i) assert_true(c->ops[i].op_id > c->ops[i - 1].op_id);
    assert_true(c->ops[i].op_id > c->after);
    o->id = c->ops[i].op_id;
    snprintf(o->bucket, sizeof o->bucket, "%.*s", (int)c->bucket.size,
             (const char *)c->bucket.data);
    o->type = c->ops[i].type;
    o->checksum = c->ops[i].checksum;
    o->target = c->ops[i].target_op;
    snprintf(o->oid, sizeof o->oid, "%.*s", (int)c->ops[i].object_id.size,
             (const char *)c->ops[i].object_id.data);
    snprintf(o->data, sizeof o->data, "%.*s", (int)c->ops[i].data.size,
             (const char *)c->ops[i].data.data);
    bytes += c->ops[i].data.size + c->ops[i].object_type.size + c->ops[i].object_id.size +
             c->ops[i].subkey.size;
  }
  if (k->chunk_bytes && c->n_ops > 1) assert_true(bytes <= k->chunk_bytes);
  assert_int_equal(c->next_after, c->ops[c->n_ops - 1].op_id);
  if (c->target_op > k->max_target) k->max_target = c->target_op;
  k->last_next_after = c->next_after;
  k->chunks++;
  return 0;
}

/* Reads all of bucket b in (after, cp] with one call, unlimited. */
static int read_all(fx *f, const char *b, uint64_t after, uint64_t cp, coll *k) {
  bs_bucket_request rq = {V(b), after};
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  int more = 0, rc;
  o.limit = MAXOPS - 1;
  memset(k, 0, sizeof *k);
  rc = bs_get_bucket_data(&more, f->st, cp, &rq, 1, &o, on_chunk, k, NULL);
  if (rc == BS_OK) assert_false(more);
  return rc;
}

static bs_checksum cks(fx *f, const char *b, uint64_t cp) {
  bs_val v = V(b);
  bs_checksum c = {0, 0};
  assert_int_equal(bs_get_checksums(&c, f->st, cp, &v, 1, NULL), BS_OK);
  return c;
}

/* ---- contract.md 3: the golden sha256 vector ------------------------------------------------- */

static void test_golden_sha256(void **state) {
  fx f;
  coll k;
  const char *r1[] = {"b:test:t1:{\"id\":\"t1\"}"}, *r2[] = {"b:test:t2:{\"id\":\"t2\"}"};
  bs_checksum c;
  fx_open(&f, BS_HASH_SHA256, NULL);
  start(&f);
  assert_int_equal(save(&f, BS_INSERT, NULL, "t1", 1, r1), BS_OK);
  assert_int_equal(save(&f, BS_INSERT, NULL, "t2", 1, r2), BS_OK);
  assert_int_equal(commit(&f, "0002"), 2);
  assert_int_equal(read_all(&f, "b", 0, 2, &k), BS_OK);
  assert_int_equal(k.n, 2);
  assert_int_equal(k.ops[0].checksum, 2634521662u);
  assert_int_equal(k.ops[1].checksum, 4243212114u);
  c = cks(&f, "b", 2);
  assert_int_equal(c.count, 2);
  assert_int_equal(c.checksum, (uint32_t)(2634521662ull + 4243212114ull));
  c = cks(&f, "b", 1);
  assert_int_equal(c.count, 1);
  assert_int_equal(c.checksum, 2634521662u);
  c = cks(&f, "nope", 2);
  assert_int_equal(c.count, 0);
  assert_int_equal(c.checksum, 0);
  fx_close(&f);
}

/* ---- contract.md 4.1: diff rules and op id order --------------------------------------------- */

static void test_diff_rules(void **state) {
  fx f;
  coll k;
  const char *both[] = {"b1:T:x:{1}", "b2:T:x:{2}"}, *one[] = {"b1:T:x:{3}"};
  const char *moved[] = {"b3:T:y:{4}"};
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  assert_int_equal(save(&f, BS_INSERT, NULL, "r1", 2, both), BS_OK); /* 1: PUT b1, 2: PUT b2 */
  assert_int_equal(save(&f, BS_UPDATE, NULL, "r1", 1, one), BS_OK);  /* 3: PUT b1, 4: REMOVE b2 */
  assert_int_equal(commit(&f, "0002"), 4);
  assert_int_equal(read_all(&f, "b2", 0, 4, &k), BS_OK);
  assert_int_equal(k.n, 2);
  assert_int_equal(k.ops[1].id, 4);
  assert_int_equal(k.ops[1].type, BS_OP_REMOVE);
  assert_string_equal(k.ops[1].oid, "x");
  /* key change: REMOVEs of the old id come first, then the PUTs of the new one */
  assert_int_equal(save(&f, BS_UPDATE, "r1", "r2", 1, moved), BS_OK); /* 5: REMOVE b1, 6: PUT b3 */
  /* a DELETE of an unknown row and a repeated DELETE emit nothing */
  assert_int_equal(save(&f, BS_DELETE, "zz", NULL, 0, NULL), BS_OK);
  assert_int_equal(save(&f, BS_DELETE, "r1", NULL, 0, NULL), BS_OK);
  assert_int_equal(commit(&f, "0003"), 6);
  assert_int_equal(read_all(&f, "b1", 4, 6, &k), BS_OK);
  assert_int_equal(k.n, 1);
  assert_int_equal(k.ops[0].id, 5);
  assert_int_equal(k.ops[0].type, BS_OP_REMOVE);
  assert_int_equal(read_all(&f, "b3", 0, 6, &k), BS_OK);
  assert_int_equal(k.n, 1);
  assert_int_equal(k.ops[0].id, 6);
  /* an unchanged UPDATE still emits its PUT; DELETE then REMOVEs it */
  assert_int_equal(save(&f, BS_UPDATE, NULL, "r2", 1, moved), BS_OK); /* 7 */
  assert_int_equal(save(&f, BS_DELETE, "r2", NULL, 0, NULL), BS_OK);  /* 8 */
  assert_int_equal(commit(&f, "0004"), 8);
  assert_int_equal(read_all(&f, "b3", 6, 8, &k), BS_OK);
  assert_int_equal(k.n, 2);
  assert_int_equal(k.ops[0].type, BS_OP_PUT);
  assert_int_equal(k.ops[1].type, BS_OP_REMOVE);
  /* an INSERT does not read the previous record: no REMOVE for left memberships */
  assert_int_equal(save(&f, BS_INSERT, NULL, "r3", 2, both), BS_OK); /* 9, 10 */
  assert_int_equal(save(&f, BS_INSERT, NULL, "r3", 1, one), BS_OK);  /* 11 */
  assert_int_equal(commit(&f, "0005"), 11);
  fx_close(&f);
}

static int collect_param(const bs_val *p, void *payload) {
  char *out = payload;
  strncat(out, p->data, p->size);
  strcat(out, ";");
  return 0;
}

static void test_parameters(void **state) {
  fx f;
  bs_save s = BS_SAVE_INIT;
  bs_val p1[] = {V("{\"a\":1}")}, p2[] = {V("{\"a\":2}")};
  bs_lookup l1 = {V("k1"), p1, 1}, l2 = {V("k2"), p2, 1};
  bs_val keys[] = {V("k1"), V("k2")};
  char out[256];
  bs_error e;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  s.table = V("t");
  s.after_id = V("r1");
  s.lookups = &l1;
  s.n_lookups = 1;
  assert_int_equal(bs_writer_save(f.w, &s, NULL), BS_OK); /* 1: k1 entry */
  assert_int_equal(commit(&f, "0002"), 1);
  s.tag = BS_UPDATE;
  s.lookups = &l2;
  assert_int_equal(bs_writer_save(f.w, &s, NULL), BS_OK); /* 2: k2 entry, 3: k1 tomb */
  assert_int_equal(commit(&f, "0003"), 3);
  out[0] = 0;
  assert_int_equal(
      bs_get_parameter_sets(f.st, 1, keys, 2, BS_PARAM_LIMIT_DEFAULT, collect_param, out, NULL),
      BS_OK);
  assert_string_equal(out, "{\"a\":1};");
  out[0] = 0;
  assert_int_equal(
      bs_get_parameter_sets(f.st, 2, keys, 2, BS_PARAM_LIMIT_DEFAULT, collect_param, out, NULL),
      BS_OK);
  assert_string_equal(out, "{\"a\":1};{\"a\":2};");
  out[0] = 0;
  assert_int_equal(
      bs_get_parameter_sets(f.st, 3, keys, 2, BS_PARAM_LIMIT_DEFAULT, collect_param, out, NULL),
      BS_OK);
  assert_string_equal(out, "{\"a\":2};");
  assert_int_equal(bs_get_parameter_sets(f.st, 2, keys, 2, 1, collect_param, out, &e), BS_ELIMIT);
  assert_string_equal(e.msg, "too many parameter results (limit was 1)");
  /* parameter compaction at 3 drops the k1 history: reads below it are stale */
  {
    bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats st;
    o.compact_parameters = 1;
    assert_int_equal(bs_compact(&st, f.st, &o, NULL), BS_OK);
    assert_int_equal(st.parameter_entries_removed, 2); /* k1 entry + k1 tombstone */
  }
  out[0] = 0;
  assert_int_equal(
      bs_get_parameter_sets(f.st, 3, keys, 2, BS_PARAM_LIMIT_DEFAULT, collect_param, out, NULL),
      BS_OK);
  assert_string_equal(out, "{\"a\":2};");
  assert_int_equal(
      bs_get_parameter_sets(f.st, 2, keys, 2, BS_PARAM_LIMIT_DEFAULT, collect_param, out, NULL),
      BS_ESTALE);
  fx_close(&f);
}

/* ---- contract.md 5.2: chunking --------------------------------------------------------------- */

static void test_chunking(void **state) {
  fx f;
  coll whole, part;
  const char *names[] = {"a", "b", "c"};
  uint64_t top;
  unsigned long long seed = g_seed;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  srand((unsigned)ct_seed(seed, 1).s);
  for (int i = 0; i < 60; i++) {
    char row[96], id[16];
    const char *rows[1] = {row};
    snprintf(id, sizeof id, "r%d", rand() % 20);
    snprintf(row, sizeof row, "%s:T:%s:%.*s", names[rand() % 3], id, rand() % 40 + 1,
             "0123456789012345678901234567890123456789");
    assert_int_equal(save(&f, BS_UPDATE, NULL, id, 1, rows), BS_OK);
  }
  top = commit(&f, "0002");
  assert_true(top >= 60);
  for (int round = 0; round < 50; round++) {
    bs_bucket_request rq[3] = {{V("a"), 0}, {V("b"), 0}, {V("c"), 0}};
    bs_batch_options o = BS_BATCH_OPTIONS_INIT;
    size_t calls = 0;
    int more = 1;
    uint64_t cp = (uint64_t)rand() % (top + 1);
    o.limit = (size_t)(rand() % 7 + 1);
    o.chunk_bytes = (size_t)(rand() % 200 + 1);
    memset(&part, 0, sizeof part);
    part.chunk_bytes = o.chunk_bytes;
    while (more) {
      coll one;
      memset(&one, 0, sizeof one);
      one.chunk_bytes = o.chunk_bytes;
      assert_int_equal(bs_get_bucket_data(&more, f.st, cp, rq, 3, &o, on_chunk, &one, NULL), BS_OK);
      assert_true(one.n <= o.limit);
      if (more) assert_int_equal(one.n, o.limit); /* only the limit cuts a small call */
      /* advance every bucket to its last op seen */
      for (size_t i = 0; i < one.n; i++) {
        part.ops[part.n++] = one.ops[i];
        for (int b = 0; b < 3; b++)
          if (!strcmp(one.ops[i].bucket, names[b])) rq[b].after = one.ops[i].id;
      }
      if (!more) break;
      assert_true(++calls < 100);
      if (part.n > 1000) fail_msg("BS_SEED=%llu: no progress", seed);
    }
    /* concatenation == one unlimited read of each bucket, in bucket order */
    {
      size_t at = 0;
      for (int b = 0; b < 3; b++) {
        assert_int_equal(read_all(&f, names[b], 0, cp, &whole), BS_OK);
        for (size_t j = 0; j < whole.n; j++, at++) {
          if (at >= part.n || part.ops[at].id != whole.ops[j].id)
            fail_msg("BS_SEED=%llu round %d: chunked read differs at %zu", seed, round, at);
        }
      }
      if (at != part.n) fail_msg("BS_SEED=%llu round %d: extra ops", seed, round);
    }
  }
  /* a single op larger than chunk_bytes gets a chunk of its own */
  {
    bs_bucket_request rq = {V("a"), 0};
    bs_batch_options o = BS_BATCH_OPTIONS_INIT;
    int more;
    memset(&part, 0, sizeof part);
    o.chunk_bytes = 1;
    assert_int_equal(bs_get_bucket_data(&more, f.st, top, &rq, 1, &o, on_chunk, &part, NULL),
                     BS_OK);
    assert_int_equal(part.chunks, part.n);
  }
  fx_close(&f);
}

/* ---- contract.md 6: compaction examples, torn reads ------------------------------------------ */

static void test_compact_move(void **state) {
  fx f;
  coll k;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats st;
  bs_val b = V("b");
  const char *t1[] = {"b:test:t1:{1}"}, *t2[] = {"b:test:t2:{2}"}, *t2b[] = {"b:test:t2:{3}"};
  bs_checksum before;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  save(&f, BS_INSERT, NULL, "t1", 1, t1);
  save(&f, BS_INSERT, NULL, "t2", 1, t2);
  save(&f, BS_UPDATE, NULL, "t2", 1, t2b);
  assert_int_equal(commit(&f, "0002"), 3);
  before = cks(&f, "b", 3);
  o.buckets = &b;
  o.n_buckets = 1;
  assert_int_equal(bs_compact(&st, f.st, &o, NULL), BS_OK);
  assert_int_equal(st.ops_moved, 1);
  assert_int_equal(st.ops_cleared, 0);
  assert_int_equal(st.buckets_compacted, 1);
  assert_int_equal(read_all(&f, "b", 0, 3, &k), BS_OK);
  assert_int_equal(k.n, 3);
  assert_int_equal(k.ops[0].type, BS_OP_PUT);
  assert_int_equal(k.ops[1].type, BS_OP_MOVE);
  assert_int_equal(k.ops[1].target, 3);
  assert_string_equal(k.ops[1].data, "");
  assert_int_equal(k.ops[2].type, BS_OP_PUT);
  assert_int_equal(k.max_target, 3);
  assert_int_equal(cks(&f, "b", 3).checksum, before.checksum);
  assert_int_equal(cks(&f, "b", 3).count, 3);
  /* reading at 2 serves the MOVE with target 3 > 2: reported, not torn */
  assert_int_equal(read_all(&f, "b", 0, 2, &k), BS_OK);
  assert_int_equal(k.max_target, 3);
  fx_close(&f);
}

static void test_compact_clear(void **state) {
  fx f;
  coll k;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats st;
  bs_val b = V("b");
  bs_checksum before, c;
  bs_error e;
  uint64_t problems = 1;
  const char *t1[] = {"b:test:t1:{1}"}, *t2[] = {"b:test:t2:{2}"}, *t2b[] = {"b:test:t2:{3}"};
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  save(&f, BS_INSERT, NULL, "t1", 1, t1);   /* 1 */
  save(&f, BS_INSERT, NULL, "t2", 1, t2);   /* 2 */
  save(&f, BS_DELETE, "t1", NULL, 0, NULL); /* 3 */
  save(&f, BS_UPDATE, NULL, "t2", 1, t2b);  /* 4 */
  assert_int_equal(commit(&f, "0002"), 4);
  before = cks(&f, "b", 4);
  o.buckets = &b;
  o.n_buckets = 1;
  assert_int_equal(bs_compact(&st, f.st, &o, NULL), BS_OK);
  assert_int_equal(st.ops_moved, 2);
  assert_int_equal(st.ops_cleared, 3);
  assert_int_equal(read_all(&f, "b", 0, 4, &k), BS_OK);
  assert_int_equal(k.n, 2);
  assert_int_equal(k.ops[0].type, BS_OP_CLEAR);
  assert_int_equal(k.ops[0].id, 3);
  assert_int_equal(k.ops[0].target, 4);
  assert_int_equal(k.ops[1].type, BS_OP_PUT);
  assert_string_equal(k.ops[1].oid, "t2");
  c = cks(&f, "b", 4);
  assert_int_equal(c.checksum, before.checksum);
  assert_int_equal(c.count, 2);
  /* torn: reads at C in [1, 3) fail; at 3 the CLEAR is served (target 4 reported) */
  assert_int_equal(read_all(&f, "b", 0, 2, &k), BS_EINVALIDATED);
  assert_int_equal(bs_get_checksums(&c, f.st, 1, &b, 1, &e), BS_EINVALIDATED);
  assert_int_equal(read_all(&f, "b", 0, 3, &k), BS_OK);
  assert_int_equal(k.n, 1);
  assert_int_equal(k.max_target, 4);
  assert_int_equal(read_all(&f, "b", 0, 0, &k), BS_OK);
  assert_int_equal(k.n, 0);
  /* a second compaction changes nothing; the store verifies clean */
  assert_int_equal(bs_compact(&st, f.st, &o, NULL), BS_OK);
  assert_int_equal(st.buckets_compacted, 0);
  assert_int_equal(bs_db_verify(&problems, f.db, NULL, NULL, NULL), BS_OK);
  assert_int_equal(problems, 0);
  fx_close(&f);
}

static void test_initial_replication(void **state) {
  fx f;
  coll k;
  uint64_t n = 99;
  const char *a1[] = {"b:T:a:{1}"}, *a2[] = {"b:T:a:{2}"}, *c1[] = {"b:T:c:{1}"};
  fx_open(&f, BS_HASH_XXH3, NULL);
  save(&f, BS_INSERT, NULL, "a", 1, a1);   /* 1 */
  save(&f, BS_UPDATE, NULL, "a", 1, a2);   /* 2 */
  save(&f, BS_INSERT, NULL, "c", 1, c1);   /* 3 */
  save(&f, BS_DELETE, "c", NULL, 0, NULL); /* 4 */
  assert_int_equal(bs_writer_flush(NULL, f.w, NULL), BS_OK);
  assert_int_equal(bs_compact_initial_replication(&n, f.st, 0, 0, NULL), BS_OK);
  assert_int_equal(n, 1);
  assert_int_equal(bs_compact_initial_replication(&n, f.st, 0, 0, NULL), BS_OK);
  assert_int_equal(n, 0);
  start(&f);
  assert_int_equal(commit(&f, "0002"), 4);
  assert_int_equal(read_all(&f, "b", 0, 4, &k), BS_OK);
  assert_int_equal(k.n, 1);
  assert_int_equal(k.ops[0].id, 2);
  assert_string_equal(k.ops[0].data, "{2}");
  assert_int_equal(cks(&f, "b", 4).count, 1);
  assert_int_equal(bs_compact_initial_replication(&n, f.st, 0, 0, NULL), BS_ESTATE);
  fx_close(&f);
}

/* ---- contract.md 4.4: commit rules, activation ----------------------------------------------- */

static void test_commit_rules(void **state) {
  fx f;
  bs_commit_result r;
  bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
  bs_status s;
  const char *t1[] = {"b:T:a:{1}"};
  fx_open(&f, BS_HASH_XXH3, NULL);
  save(&f, BS_INSERT, NULL, "a", 1, t1);
  /* snapshot not done: blocked, but the ops are persisted */
  assert_int_equal(bs_writer_commit(&r, f.w, V("0005"), NULL, NULL), BS_OK);
  assert_true(r.checkpoint_blocked);
  assert_false(r.checkpoint_created);
  assert_int_equal(bs_writer_snapshot_done(f.w, V("0003"), NULL), BS_OK);
  assert_int_equal(bs_writer_commit(&r, f.w, V("0002"), NULL, NULL), BS_OK); /* below ncb */
  assert_true(r.checkpoint_blocked);
  co.create_empty = 0; /* the first unblocked commit always creates one */
  assert_int_equal(bs_writer_commit(&r, f.w, V("0003"), &co, NULL), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, 1);
  assert_int_equal(bs_get_status(&s, f.st, NULL), BS_OK);
  assert_int_equal(s.state, BS_STREAM_ACTIVE);
  assert_true(s.snapshot_done);
  assert_int_equal(bs_writer_commit(&r, f.w, V("0004"), &co, NULL), BS_OK);
  assert_false(r.checkpoint_created);
  assert_int_equal(bs_writer_keepalive(&r, f.w, V("0004"), NULL), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, 1);
  assert_int_equal(bs_writer_commit(&r, f.w, V("0001"), NULL, NULL), BS_OK); /* below last */
  assert_true(r.checkpoint_blocked);
  fx_close(&f);
}

/* ---- contract.md 7: managed write checkpoints ------------------------------------------------ */

static void test_write_checkpoints(void **state) {
  fx f;
  bs_head h5 = {V("1"), V("0005")}, h9 = {V("1"), V("0009")};
  bs_managed_request rq[3];
  uint64_t ids[3], id;
  int adv, found;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  memset(rq, 0, sizeof rq);
  rq[0].user_id = V("u1");
  rq[0].heads = &h5;
  rq[0].n_heads = 1;
  rq[1].user_id = V("u1");
  rq[1].heads = &h9;
  rq[1].n_heads = 1;
  rq[1].has_request_id = 1;
  rq[1].request_id = 7; /* supplied beats generated */
  rq[2].user_id = V("u2");
  rq[2].heads = &h5;
  rq[2].n_heads = 1;
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, rq, 3, NULL), BS_OK);
  assert_int_equal(ids[0], 7);
  assert_int_equal(ids[1], 7);
  assert_int_equal(ids[2], 1);
  assert_true(adv);
  assert_int_equal(bs_last_write_checkpoint(&id, &found, f.st, V("u1"), &h5, 1, NULL), BS_OK);
  assert_false(found); /* head 0009 > 0005 */
  assert_int_equal(bs_last_write_checkpoint(&id, &found, f.st, V("u1"), &h9, 1, NULL), BS_OK);
  assert_true(found);
  assert_int_equal(id, 7);
  /* generated after supplied: one counter */
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, rq, 1, NULL), BS_OK);
  assert_int_equal(ids[0], 8);
  /* a commit at 0005 processes u1 (head 0005 now) and u2 */
  commit(&f, "0005");
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, &rq[2], 1, NULL), BS_OK);
  assert_int_equal(ids[0], 2);
  assert_true(adv);
  rq[1].request_id = 2; /* lower than stored 8: nothing */
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, &rq[1], 1, NULL), BS_OK);
  assert_int_equal(ids[0], 8);
  assert_false(adv); /* u1's 8 was processed */
  assert_int_equal(bs_set_write_checkpoint_mode(f.st, BS_WCP_CUSTOM, V(""), NULL), BS_OK);
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, rq, 1, NULL), BS_ESTATE);
  fx_close(&f);
}

/* ---- Atomicity: fail the k-th allocation of a commit ---------------------------------------- */

typedef struct failer {
  long countdown; /* < 0: never fail */
  long live;
} failer;

static void *f_malloc(void *o, size_t n) {
  failer *f = o;
  void *p;
  if (f->countdown == 0) return NULL;
  if (f->countdown > 0) f->countdown--;
  p = malloc(n);
  if (p) f->live++;
  return p;
}
static void *f_realloc(void *o, void *q, size_t n) {
  failer *f = o;
  void *p;
  if (f->countdown == 0) return NULL;
  if (f->countdown > 0) f->countdown--;
  p = realloc(q, n);
  if (p && !q) f->live++;
  return p;
}
static void f_free(void *o, void *p) {
  failer *f = o;
  if (p) f->live--;
  free(p);
}

/* The users a checkpoint_changes answer lists: their count into *payload (size_t). */
static int count_users(const bs_checkpoint_changes *ch, void *payload) {
  *(size_t *)payload = ch->n_updated_write_checkpoint_users;
  return BS_OK;
}

/* A failed commit leaves everything as it was, the managed write checkpoint its checkpoint
 * would have processed too: the retry processes it and lists its user. */
static void test_alloc_failure(void **state) {
  failer fl = {-1, 0};
  bs_allocator al = {f_malloc, f_realloc, f_free, &fl};
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  const char *rows[] = {"b1:T:x:{1}", "b2:T:x:{2}"}, *rows2[] = {"b1:T:x:{3}", "b3:T:x:{4}"};
  long k;
  oo.allocator = &al;
  oo.checksum_cache_entries = (size_t)-1;
  for (k = 0;; k++) {
    fx f;
    bs_commit_result r;
    bs_error e;
    int rc;
    fl.countdown = -1;
    bs_head h3 = {V("c"), V("0003")};
    bs_managed_request rq = {.user_id = V("u"), .heads = &h3, .n_heads = 1};
    uint64_t id;
    size_t users = 0;
    int adv;
    fx_open(&f, BS_HASH_XXH3, &oo);
    start(&f);
    assert_int_equal(save(&f, BS_INSERT, NULL, "x", 2, rows), BS_OK);
    commit(&f, "0002");
    assert_int_equal(save(&f, BS_UPDATE, NULL, "x", 2, rows2), BS_OK);
    assert_int_equal(bs_create_managed_write_checkpoints(&id, &adv, f.st, &rq, 1, NULL), BS_OK);
    fl.countdown = k;
    rc = bs_writer_commit(&r, f.w, V("0003"), NULL, &e);
    fl.countdown = -1;
    if (rc == BS_OK) {
      assert_int_equal(r.checkpoint, 5);
      assert_int_equal(bs_get_checkpoint_changes(f.st, 2, 5, count_users, &users, NULL), BS_OK);
      assert_int_equal(users, 1);
      fx_close(&f);
      break;
    }
    assert_int_equal(rc, BS_ENOMEM);
    /* nothing changed: same checkpoint, same data; the queue is intact, so a retry works */
    assert_int_equal(cks(&f, "b2", 10).count, 1);
    assert_int_equal(cks(&f, "b3", 10).count, 0);
    assert_int_equal(commit(&f, "0003"), 5);
    assert_int_equal(cks(&f, "b2", 10).count, 2);
    assert_int_equal(cks(&f, "b3", 10).count, 1);
    assert_int_equal(bs_get_checkpoint_changes(f.st, 2, 5, count_users, &users, NULL), BS_OK);
    assert_int_equal(users, 1); /* u, processed by the retry */
    fx_close(&f);
    assert_int_equal(fl.live, 0);
    assert_true(k < 10000);
  }
  assert_true(k > 5); /* the loop really failed allocations inside the commit */
  assert_int_equal(fl.live, 0);
}

/* A managed batch that replaces (u2: a generated id), creates (u3), refreshes (u1: its stored id
 * again, a later requested_at) and keeps (u5: a lower id) fails its k-th allocation: all of it or
 * nothing, no leak. The cleanup at 2000 shows the requested_at each record was left with. */
static void test_wcp_alloc_failure(void **state) {
  failer fl = {-1, 0};
  bs_allocator al = {f_malloc, f_realloc, f_free, &fl};
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_head h5 = {V("c"), V("0005")}, h9 = {V("c"), V("0009")};
  bs_managed_request base[3], rq[4];
  long k;
  (void)state;
  oo.allocator = &al;
  memset(base, 0, sizeof base);
  for (int i = 0; i < 3; i++) {
    base[i].user_id = V(i == 0 ? "u1" : i == 1 ? "u2" : "u5");
    base[i].heads = &h5;
    base[i].n_heads = 1;
    base[i].has_request_id = i != 1;
    base[i].request_id = i == 0 ? 5 : 8;
    base[i].requested_at_ms = 1000;
  }
  memcpy(rq, base, sizeof base);
  rq[0].requested_at_ms = 5000; /* u1 5 again */
  rq[1].heads = &h9;            /* u2 generated: 2 */
  rq[2].request_id = 4;         /* u5 4 < 8 */
  rq[3] = rq[1];
  rq[3].user_id = V("u3");
  rq[3].has_request_id = 1;
  rq[3].request_id = 9;
  for (k = 0;; k++) {
    fx f;
    uint64_t ids[4], id, deleted;
    int adv = -1, found, rc;
    fx_open(&f, BS_HASH_XXH3, &oo);
    start(&f);
    assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, f.st, base, 3, NULL), BS_OK);
    commit(&f, "0005"); /* processes all three */
    fl.countdown = k;
    rc = bs_create_managed_write_checkpoints(ids, &adv, f.st, rq, 4, NULL);
    fl.countdown = -1;
    assert_int_equal(bs_last_write_checkpoint(&id, &found, f.st, V("u2"), &h9, 1, NULL), BS_OK);
    assert_true(found);
    if (rc == BS_OK) {
      assert_true(ids[0] == 5 && ids[1] == 2 && ids[2] == 8 && ids[3] == 9);
      assert_int_equal(adv, 1); /* u2 and u3 are new */
      assert_int_equal(id, 2);
    } else {
      assert_int_equal(rc, BS_ENOMEM);
      assert_int_equal(id, 1); /* u2 as it was */
      assert_int_equal(bs_last_write_checkpoint(&id, &found, f.st, V("u3"), &h9, 1, NULL), BS_OK);
      assert_false(found);
    }
    /* processed with requested_at 1000: u5, and u1 unless it was refreshed to 5000 */
    assert_int_equal(bs_delete_checkpoint_requests_before(&deleted, f.st, 2000, NULL), BS_OK);
    assert_int_equal(deleted, rc == BS_OK ? 1 : 2);
    fx_close(&f);
    assert_int_equal(fl.live, 0);
    if (rc == BS_OK) break;
    assert_true(k < 1000);
  }
  assert_true(k > 3); /* the loop really failed allocations inside the batch */
}

/* ---- Snapshot mode, soft deletes, source rows ------------------------------------------------- */

static int got_data(const bs_val *d, void *p) {
  snprintf(p, 32, "%.*s", d ? (int)d->size : 4, d ? (const char *)d->data : "NULL");
  return 0;
}

static void test_snapshot_and_source_rows(void **state) {
  fx f;
  bs_writer *snap;
  bs_writer_options so = BS_WRITER_OPTIONS_INIT;
  bs_save s = BS_SAVE_INIT;
  char buf[32];
  const char *r1[] = {"b:T:a:{1}"};
  bs_stat stat;
  fx_open(&f, BS_HASH_XXH3, NULL);
  so.snapshot = 1;
  assert_int_equal(bs_writer_open(&snap, f.st, &so, NULL), BS_OK);
  s.table = V("t");
  s.after_id = V("a");
  s.stored_data = V("row-a");
  assert_int_equal(bs_writer_save(f.w, &s, NULL), BS_OK);
  /* the writer sees its own queued save */
  assert_int_equal(bs_writer_source_row(f.w, V("t"), V("a"), got_data, buf, NULL), BS_OK);
  assert_string_equal(buf, "row-a");
  assert_int_equal(bs_writer_source_row(snap, V("t"), V("a"), got_data, buf, NULL), BS_ENOTFOUND);
  assert_int_equal(save(&f, BS_DELETE, "a", NULL, 0, NULL), BS_OK);
  assert_int_equal(bs_writer_flush(NULL, f.w, NULL), BS_OK);
  assert_int_equal(bs_writer_source_row(f.w, V("t"), V("a"), got_data, buf, NULL), BS_ENOTFOUND);
  /* the soft-deleted record makes the snapshot skip its INSERT */
  s.tag = BS_UPDATE;
  assert_int_equal(bs_writer_save(snap, &s, NULL), BS_ESTATE);
  {
    fx g = f;
    g.w = snap;
    assert_int_equal(save(&g, BS_INSERT, NULL, "a", 1, r1), BS_OK);
  }
  assert_int_equal(bs_writer_flush(NULL, snap, NULL), BS_OK);
  assert_int_equal(cks(&f, "b", 100).count, 0);
  assert_int_equal(bs_db_stat(&stat, f.db, NULL), BS_OK);
  assert_int_equal(stat.source_records, 1);
  bs_writer_close(snap);
  fx_close(&f);
}

/* ---- Indexes under rollback: a failed commit (or any source_row) leaves every index in step -- */

/* One random save on table "t" or "u": rows in up to two of 24 buckets, sometimes none (a
 * row with no memberships: its delete emits nothing, so its soft record outlives a commit). */
static void rand_save(fx *f, unsigned *seed) {
  bs_save s = BS_SAVE_INIT;
  bs_row r[2];
  char bk[2][16], id[16], before[16], data[16];
  int tag = rand_r(seed) % 3, nrows = rand_r(seed) % 3;
  snprintf(id, sizeof id, "r%d", rand_r(seed) % 48);
  snprintf(before, sizeof before, "r%d", rand_r(seed) % 48);
  snprintf(data, sizeof data, "{%d}", rand_r(seed) % 1000);
  s.table = V(rand_r(seed) % 4 ? "t" : "u");
  s.tag = tag == 0 ? BS_INSERT : tag == 1 ? BS_UPDATE : BS_DELETE;
  if (s.tag == BS_DELETE)
    s.before_id = V(id);
  else
    s.after_id = V(id);
  if (s.tag == BS_UPDATE && rand_r(seed) % 4 == 0) s.before_id = V(before); /* key change */
  for (int i = 0; i < nrows && s.tag != BS_DELETE; i++) {
    snprintf(bk[i], sizeof bk[i], "b%d", rand_r(seed) % 24);
    r[i].bucket = V(bk[i]);
    r[i].object_type = V("T");
    r[i].object_id = V(id);
    r[i].data = V(data);
  }
  s.rows = r;
  s.n_rows = s.tag == BS_DELETE ? 0 : (size_t)nrows;
  assert_int_equal(bs_writer_save(f->w, &s, NULL), BS_OK);
}

static int ignore_row(const bs_val *d, void *p) {
  return 0;
}

static void no_problems(fx *f, unsigned long long seed, int round) {
  uint64_t problems = 1;
  assert_int_equal(bs_db_verify(&problems, f->db, NULL, NULL, NULL), BS_OK);
  if (problems)
    fail_msg("BS_SEED=%llu round %d: verify found %llu problems", seed, round,
             (unsigned long long)problems);
}

static void test_index_rollback(void **state) {
  failer fl = {-1, 0};
  bs_allocator al = {f_malloc, f_realloc, f_free, &fl};
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  unsigned long long seed = g_seed;
  unsigned s1, s2;
  int rounds = getenv("BS_TEST_QUICK") ? 150 : 800, failed = 0;
  fx f, g; /* f fails allocations, g (the default allocator) never does */
  oo.allocator = &al;
  oo.checksum_cache_entries = (size_t)-1;
  fx_open(&f, BS_HASH_XXH3, &oo);
  fx_open(&g, BS_HASH_XXH3, NULL);
  s1 = (unsigned)ct_seed(seed, 2).s;
  for (int round = 0; round < rounds; round++) {
    char lsn[16];
    int n = 1 + rand_r(&s1) % 12, rc;
    if (round == rounds / 2) { /* deletes leave soft-deleted records until then (4.3) */
      start(&f);
      start(&g);
    }
    s2 = s1; /* g gets the very same saves */
    for (int i = 0; i < n; i++) rand_save(&f, &s1);
    for (int i = 0; i < n; i++) rand_save(&g, &s2);
    if (rand_r(&s1) % 10 == 0) {
      assert_int_equal(bs_writer_truncate(f.w, V("u"), NULL), BS_OK);
      assert_int_equal(bs_writer_truncate(g.w, V("u"), NULL), BS_OK);
    }
    /* source_row applies the queue and rolls it back */
    (void)bs_writer_source_row(f.w, V("t"), V("r1"), ignore_row, NULL, NULL);
    snprintf(lsn, sizeof lsn, "%08d", round + 2);
    fl.countdown = rand_r(&s1) % 60;
    rc = bs_writer_commit(NULL, f.w, V(lsn), NULL, NULL);
    fl.countdown = -1;
    if (rc != BS_OK) {
      if (rc != BS_ENOMEM) fail_msg("BS_SEED=%llu round %d: commit rc %d", seed, round, rc);
      failed++;
      no_problems(&f, seed, round);
      assert_int_equal(bs_writer_commit(NULL, f.w, V(lsn), NULL, NULL), BS_OK);
    }
    assert_int_equal(bs_writer_commit(NULL, g.w, V(lsn), NULL, NULL), BS_OK);
    no_problems(&f, seed, round);
    if (round % 10 == 0 || round == rounds - 1) {
      bs_stat a, b;
      no_problems(&g, seed, round);
      assert_int_equal(bs_db_stat(&a, f.db, NULL), BS_OK);
      assert_int_equal(bs_db_stat(&b, g.db, NULL), BS_OK);
      if (a.source_records != b.source_records || a.ops_put != b.ops_put ||
          a.ops_remove != b.ops_remove || a.buckets != b.buckets)
        fail_msg("BS_SEED=%llu round %d: records %llu/%llu puts %llu/%llu after rollbacks", seed,
                 round, (unsigned long long)a.source_records, (unsigned long long)b.source_records,
                 (unsigned long long)a.ops_put, (unsigned long long)b.ops_put);
      for (int i = 0; i < 24; i++) {
        char bk[16];
        bs_checksum x, y;
        snprintf(bk, sizeof bk, "b%d", i);
        x = cks(&f, bk, 1u << 30);
        y = cks(&g, bk, 1u << 30);
        if (x.checksum != y.checksum || x.count != y.count)
          fail_msg("BS_SEED=%llu round %d: bucket %s differs after rollbacks", seed, round, bk);
      }
    }
  }
  assert_true(failed > rounds / 4); /* the loop really rolled back commits */
  { /* the superseded logs rolled back too: an incremental pass moves the same ops */
    bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats a, b;
    o.incremental_only = 1;
    o.min_age_ms = 0;
    /* the rounds' LSNs sort below the snapshot's "0001": this is the first checkpoint, and it
     * purges the soft-deleted records (verify counts them) */
    assert_int_equal(commit(&f, "9999"), commit(&g, "9999"));
    no_problems(&f, seed, rounds);
    assert_int_equal(bs_compact(&a, f.st, &o, NULL), BS_OK);
    assert_int_equal(bs_compact(&b, g.st, &o, NULL), BS_OK);
    assert_true(a.ops_moved > 0);
    assert_int_equal(a.ops_moved, b.ops_moved);
    assert_int_equal(a.ops_cleared, b.ops_cleared);
  }
  fx_close(&f);
  fx_close(&g);
  assert_int_equal(fl.live, 0);
}

/* Defragmentation re-emits every live row of a record in one transaction: a record with rows in
 * two due buckets is stored again once per row, each time from the record the row before
 * stored (the membership of the first row keeps its new op). Then one record per key remains,
 * and the next change of the record supersedes both re-emitted PUTs. */
static void test_defragment_record_rows(void **state) {
  fx f;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats st;
  coll k;
  const char *both[] = {"b1:T:r1:{}", "b2:T:r1:{}"};
  char rows[2][32];
  const char *churn[] = {rows[0], rows[1]};
  uint64_t c;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  assert_int_equal(save(&f, BS_INSERT, NULL, "r1", 2, both), BS_OK);
  for (int i = 0; i < 20; i++) { /* r2's history makes both buckets mostly dead ops */
    snprintf(rows[0], sizeof rows[0], "b1:T:r2:{%d}", i);
    snprintf(rows[1], sizeof rows[1], "b2:T:r2:{%d}", i);
    assert_int_equal(save(&f, i ? BS_UPDATE : BS_INSERT, NULL, "r2", 2, churn), BS_OK);
  }
  commit(&f, "0002");
  o.min_age_ms = 0;
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0;
  o.defragment_ratio = 0.5;
  assert_int_equal(bs_compact(&st, f.st, &o, NULL), BS_OK);
  assert_int_equal(st.ops_reemitted, 4); /* r1's and r2's rows in b1 and b2 */
  no_problems(&f, g_seed, 0);            /* one record per key */
  assert_int_equal(save(&f, BS_UPDATE, NULL, "r1", 0, NULL), BS_OK);
  c = commit(&f, "0003");
  for (int b = 0; b < 2; b++) { /* r1's last op in each bucket is a REMOVE */
    const char *name = b ? "b2" : "b1";
    uint64_t last = 0;
    assert_int_equal(read_all(&f, name, 0, c, &k), BS_OK);
    for (size_t i = 0; i < k.n; i++)
      if (strcmp(k.ops[i].oid, "r1") == 0) last = i + 1;
    assert_true(last > 0);
    assert_int_equal(k.ops[last - 1].type, BS_OP_REMOVE);
  }
  no_problems(&f, g_seed, 1);
  fx_close(&f);
}

/* contract.md 8, as the LMDB backend: report_error marks an ACTIVE stream ERRORED (still served);
 * a stream that is not ACTIVE keeps its state. */
static void test_report_error(void **state) {
  fx f;
  bs_status st;
  fx_open(&f, BS_HASH_XXH3, NULL);
  assert_int_equal(bs_report_error(f.st, "early", NULL), BS_OK);
  assert_int_equal(bs_get_status(&st, f.st, NULL), BS_OK);
  assert_int_equal(st.state, BS_STREAM_PROCESSING);
  assert_string_equal(st.last_error, "early");
  start(&f);
  commit(&f, "0002");
  assert_int_equal(bs_get_status(&st, f.st, NULL), BS_OK);
  assert_int_equal(st.state, BS_STREAM_ACTIVE);
  assert_int_equal(bs_report_error(f.st, "boom", NULL), BS_OK);
  assert_int_equal(bs_get_status(&st, f.st, NULL), BS_OK);
  assert_int_equal(st.state, BS_STREAM_ERRORED);
  assert_string_equal(st.last_error, "boom");
  fx_close(&f);
}

/* Verify walks every bucket's ops (the engine's walk over the memory backend's read primitives,
 * reads.c): an op broken inside the store is reported, and only while it is broken. */
static void count_problem(const char *msg, void *p) {
  (void)msg;
  ++*(int *)p;
}

static void verify_once(fx *f, uint64_t want) {
  uint64_t problems = 99;
  int seen = 0;
  assert_int_equal(bs_db_verify(&problems, f->db, count_problem, &seen, NULL), BS_OK);
  assert_int_equal(problems, want);
  assert_int_equal((uint64_t)seen, want);
}

static void test_verify_walk(void **state) {
  const char *rows[] = {"b1:t:1:x", "b2:t:1:y"};
  fx f;
  mem_bucket *b;
  (void)state;
  fx_open(&f, BS_HASH_XXH3, NULL);
  start(&f);
  assert_int_equal(save(&f, BS_INSERT, NULL, "1", 2, rows), BS_OK);
  commit(&f, "0002");
  verify_once(&f, 0);
  b = ((mem_storage *)f.st)->s->buckets[1]; /* the second bucket: every one is walked */
  b->ops[0].checksum ^= 1;                  /* its payload no longer hashes to it */
  verify_once(&f, 1);
  b->ops[0].checksum ^= 1;
  /* a CLEAR with a payload, not the leading CLEAR of the bucket's span (the walk), and no
   * longer the PUT its source record names (the memory backend's own check) */
  b->ops[0].type = BS_OP_CLEAR;
  verify_once(&f, 3);
  b->ops[0].type = BS_OP_PUT;
  verify_once(&f, 0);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_sha256),
      cmocka_unit_test(test_diff_rules),
      cmocka_unit_test(test_parameters),
      cmocka_unit_test(test_chunking),
      cmocka_unit_test(test_compact_move),
      cmocka_unit_test(test_compact_clear),
      cmocka_unit_test(test_initial_replication),
      cmocka_unit_test(test_commit_rules),
      cmocka_unit_test(test_write_checkpoints),
      cmocka_unit_test(test_alloc_failure),
      cmocka_unit_test(test_wcp_alloc_failure),
      cmocka_unit_test(test_snapshot_and_source_rows),
      cmocka_unit_test(test_index_rollback),
      cmocka_unit_test(test_report_error),
      cmocka_unit_test(test_defragment_record_rows),
      cmocka_unit_test(test_verify_walk),
  };
  g_seed = ct_run_seed("mem");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
