/*
 * test_compact.c: compaction through the public API (contract.md section 6, properties 1-3 and 6
 * of section 9) on every backend the run selects (ct_backends_selected: memory, LMDB, LMDB behind
 * the pass-through, and PostgreSQL when BS_TEST_PG_URL names a server; BS_BACKEND=name picks one).
 * Compaction's orchestration is the engine's, its storage each backend's, so each runs it. The
 * tests of LMDB's own storage (its chunks, its map growing) run on LMDB only. Randomized tests
 * draw streams of the backend's seed (ct_first_seed, printed with the command that replays it;
 * BS_SEED sets it) and print it on failure; BS_TEST_QUICK=1 keeps them to a few seconds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lmdb_internal.h" /* test_merge_chunks counts a bucket's chunks */
#include "storage.h"
#include "util_contract.h"
#include "util_head.h"
#include "util_model.h"

#include <pthread.h>
#include <stdatomic.h>

static unsigned long long
    g_seed;                    /* the backend's (ct_first_seed); each test draws a stream of it */
static const ct_backend *g_be; /* the backend under test */
static int g_quick;

#define CHECK(call)                                                                                \
  do {                                                                                             \
    bs_error e_ = {0, ""};                                                                         \
    int rc_ = (call);                                                                              \
    if (rc_ != BS_OK) {                                                                            \
      print_error("%s failed: %s (%s) seed=%llu\n", #call, bs_strerror(rc_), e_.msg, g_seed);      \
      fail();                                                                                      \
    }                                                                                              \
  } while (0)
#define ERR (&e_)

/* ---- Environment ---------------------------------------------------------------------------- */

typedef struct env {
  char dir[64], path[96];
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  unsigned lsn;
  ct_env ce; /* a backend other than LMDB: its db, opened by util_contract.c (ce.be set) */
} env;

static size_t g_map_size; /* 0 = the library default */

static void env_open(env *e) {
  uint32_t id;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  oo.map_size = g_map_size;
  memset(e, 0, sizeof *e);
  if (g_be != &ct_backends[CT_LMDB]) {
    /* the backend's own db (a schema of its own on PostgreSQL); the same stream as on LMDB */
    if (ct_env_open(&e->ce, g_be, 0) != BS_OK) fail_msg("%s: %s", g_be->name, ct_err.msg);
    e->db = e->ce.db;
    CHECK(bs_stream_create(&id, e->db, "s1", NULL, ERR));
    if (ct_storage_open(&e->ce, e->db, id, &e->st) != BS_OK)
      fail_msg("%s: storage: %s", g_be->name, ct_err.msg);
    CHECK(bs_writer_open(&e->w, e->st, NULL, ERR));
    return;
  }
  strcpy(e->dir, "/tmp/bs_compact_XXXXXX");
  assert_non_null(mkdtemp(e->dir));
  snprintf(e->path, sizeof e->path, "%s/db", e->dir);
  oo.flags = BS_OPEN_NOSYNC;
  CHECK(bs_open(&e->db, e->path, &oo, ERR));
  CHECK(bs_stream_create(&id, e->db, "s1", NULL, ERR));
  CHECK(bs_storage_open(&e->st, e->db, id, ERR));
  CHECK(bs_writer_open(&e->w, e->st, NULL, ERR));
}

static void env_close(env *e) {
  char cmd[160];
  if (e->w) bs_writer_close(e->w);
  if (e->st) bs_storage_close(e->st);
  if (e->ce.be) { /* ct_env_close closes the db and removes what it made */
    ct_env_close(&e->ce);
    return;
  }
  if (e->db) bs_close(e->db);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", e->dir);
}

static bs_val S(const char *s) {
  bs_val v = {s, s ? strlen(s) : 0};
  return v;
}

/* UPDATE of row `id`: a PUT in each of the n buckets (REMOVEs where it left one), of the table's
 * name as its type (as most rows are: LMDB's source record then holds no type). */
static void save_row(env *e, const char *id, const char *const *buckets, size_t n,
                     const char *data) {
  bs_row rows[8];
  bs_save s = BS_SAVE_INIT;
  for (size_t i = 0; i < n; i++) {
    rows[i].bucket = S(buckets[i]);
    rows[i].object_type = S("t");
    rows[i].object_id = S(id);
    rows[i].data = S(data);
  }
  s.table = S("t");
  s.tag = BS_UPDATE;
  s.after_id = S(id);
  s.rows = rows;
  s.n_rows = n;
  CHECK(bs_writer_save(e->w, &s, ERR));
}

static void put(env *e, const char *bucket, const char *id, const char *data) {
  save_row(e, id, &bucket, 1, data);
}

static void del(env *e, const char *id) {
  bs_save s = BS_SAVE_INIT;
  s.table = S("t");
  s.tag = BS_DELETE;
  s.before_id = S(id);
  CHECK(bs_writer_save(e->w, &s, ERR));
}

static uint64_t flush(env *e) {
  uint64_t last = 0;
  CHECK(bs_writer_flush(&last, e->w, ERR));
  return last;
}

static uint64_t commit(env *e) {
  char lsn[32];
  bs_commit_result r;
  if (e->lsn == 0) {
    CHECK(bs_writer_snapshot_done(e->w, S("00000000"), ERR));
  }
  snprintf(lsn, sizeof lsn, "%08u", ++e->lsn);
  CHECK(bs_writer_commit(&r, e->w, S(lsn), NULL, ERR));
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* ---- Reading into owned ops ---------------------------------------------------------------- */

typedef struct mop {
  uint64_t op_id, target;
  bs_op_type type;
  uint32_t checksum;
  char row[128]; /* object_type / object_id / subkey; "" for MOVE/CLEAR */
  char data[64];
} mop;

typedef struct oplist {
  mop *v;
  size_t n, cap;
  uint64_t max_target;
} oplist;

static void ol_push(oplist *l, const mop *m) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 64;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    assert_non_null(l->v);
  }
  l->v[l->n++] = *m;
}

static void ol_free(oplist *l) {
  free(l->v);
  memset(l, 0, sizeof *l);
}

static void to_mop(const bs_op *op, mop *m) {
  memset(m, 0, sizeof *m);
  m->op_id = op->op_id;
  m->target = op->target_op;
  m->type = op->type;
  m->checksum = op->checksum;
  if (op->type == BS_OP_PUT || op->type == BS_OP_REMOVE)
    snprintf(m->row, sizeof m->row, "%.*s/%.*s/%.*s", (int)op->object_type.size,
             (const char *)op->object_type.data, (int)op->object_id.size,
             (const char *)op->object_id.data, (int)op->subkey.size, (const char *)op->subkey.data);
  if (op->type == BS_OP_PUT)
    snprintf(m->data, sizeof m->data, "%.*s", (int)op->data.size, (const char *)op->data.data);
}

static int on_chunk(const bs_chunk *c, void *payload) {
  oplist *l = payload;
  if (c->target_op > l->max_target) l->max_target = c->target_op;
  for (size_t i = 0; i < c->n_ops; i++) {
    mop m;
    to_mop(&c->ops[i], &m);
    ol_push(l, &m);
  }
  return 0;
}

/* Ops of bucket in (after, C], in several calls of a small limit. Returns the status. */
static int read_ops(env *e, const char *bucket, uint64_t after, uint64_t c, oplist *out) {
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_bucket_request req = {S(bucket), after};
  int more = 1, rc = BS_OK;
  memset(out, 0, sizeof *out);
  bo.limit = 7;
  while (more && rc == BS_OK) {
    size_t before = out->n;
    rc = bs_get_bucket_data(&more, e->st, c, &req, 1, &bo, on_chunk, out, NULL);
    if (out->n > before)
      req.after = out->v[out->n - 1].op_id;
    else if (more)
      break;
  }
  return rc;
}

static int checksum_at(env *e, const char *bucket, uint64_t c, bs_checksum *out) {
  bs_val b = S(bucket);
  return bs_get_checksums(out, e->st, c, &b, 1, NULL);
}

/* ---- The client's reduce (the reference test suite's reduceBucket) ------------------------- */

typedef struct rslot {
  int state; /* 0 empty, 1 live, 2 deleted */
  mop op;
} rslot;

typedef struct reduced {
  uint32_t other; /* checksum of everything not a live PUT */
  rslot *t;       /* live PUTs by row (open addressing) */
  size_t cap, n, used;
} reduced;

static size_t row_hash(const char *s) {
  size_t h = 1469598103934665603ull;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

static rslot *r_find(reduced *r, const char *row, int insert) {
  size_t i, first_free = SIZE_MAX;
  if (insert && (r->used + 1) * 2 > r->cap) { /* rebuild */
    reduced nr = {r->other, NULL, r->cap ? r->cap * 2 : 64, 0, 0};
    nr.t = calloc(nr.cap, sizeof(rslot));
    assert_non_null(nr.t);
    for (i = 0; i < r->cap; i++)
      if (r->t[i].state == 1) {
        size_t j = row_hash(r->t[i].op.row) & (nr.cap - 1);
        while (nr.t[j].state) j = (j + 1) & (nr.cap - 1);
        nr.t[j] = r->t[i];
        nr.n++;
        nr.used++;
      }
    free(r->t);
    *r = nr;
  }
  if (!r->cap) return NULL;
  for (i = row_hash(row) & (r->cap - 1);; i = (i + 1) & (r->cap - 1)) {
    if (r->t[i].state == 0) {
      if (!insert) return NULL;
      return first_free != SIZE_MAX ? &r->t[first_free] : &r->t[i];
    }
    if (r->t[i].state == 2 && first_free == SIZE_MAX) first_free = i;
    if (r->t[i].state == 1 && strcmp(r->t[i].op.row, row) == 0) return &r->t[i];
  }
}

static void reduce_apply(reduced *r, const mop *op) {
  rslot *sl;
  switch (op->type) {
  case BS_OP_PUT:
  case BS_OP_REMOVE:
    if ((sl = r_find(r, op->row, 0)) != NULL) {
      r->other += sl->op.checksum;
      sl->state = 2;
      r->n--;
    }
    if (op->type == BS_OP_PUT) {
      sl = r_find(r, op->row, 1);
      if (sl->state == 0) r->used++;
      sl->state = 1;
      sl->op = *op;
      r->n++;
    } else {
      r->other += op->checksum;
    }
    break;
  case BS_OP_MOVE:
    r->other += op->checksum;
    break;
  case BS_OP_CLEAR:
    if (r->t) memset(r->t, 0, r->cap * sizeof(rslot));
    r->n = r->used = 0;
    r->other = op->checksum;
    break;
  }
}

static void reduce_free(reduced *r) {
  free(r->t);
  memset(r, 0, sizeof *r);
}

static void reduce_list(reduced *r, const oplist *l, uint64_t upto) {
  for (size_t i = 0; i < l->n; i++)
    if (l->v[i].op_id <= upto) reduce_apply(r, &l->v[i]);
}

static void assert_reduced_equal(reduced *a, reduced *b, const char *what) {
  int ok = a->other == b->other && a->n == b->n;
  for (size_t i = 0; ok && i < a->cap; i++) {
    rslot *o;
    if (a->t[i].state != 1) continue;
    o = r_find(b, a->t[i].op.row, 0);
    ok = o && o->op.op_id == a->t[i].op.op_id && o->op.checksum == a->t[i].op.checksum &&
         strcmp(o->op.data, a->t[i].op.data) == 0;
  }
  if (!ok) {
    print_error("reduce mismatch (%s): other %u vs %u, puts %zu vs %zu, seed=%llu\n", what,
                a->other, b->other, a->n, b->n, g_seed);
    fail();
  }
}

static void print_problem(const char *problem, void *payload) {
  (void)payload;
  print_error("verify: %s\n", problem);
}

static void verify_db(env *e) {
  uint64_t problems = 0;
  bs_error err;
  int rc = bs_db_verify(&problems, e->db, print_problem, NULL, &err);
  if (rc == BS_EUNSUPPORTED) return; /* verify not built yet */
  if (rc) fail_msg("verify: %s (%s)", bs_strerror(rc), err.msg);
  if (problems) fail_msg("verify: %llu problems, seed=%llu", (unsigned long long)problems, g_seed);
}

static bs_compact_options bucket_opts(const char **buckets, size_t n) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  static bs_val names[8];
  for (size_t i = 0; i < n; i++) names[i] = S(buckets[i]);
  o.buckets = names;
  o.n_buckets = n;
  return o;
}

/* ---- contract.md section 6 examples ---------------------------------------------------------- */

static void test_spec_move(void **state) {
  env e;
  oplist l;
  bs_checksum before, after;
  bs_compact_stats stats;
  const char *b = "b";
  bs_compact_options o = bucket_opts(&b, 1);
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "{\"id\":\"t1\"}");
  put(&e, "b", "t2", "{\"id\":\"t2\"}");
  put(&e, "b", "t2", "{\"id\":\"t2\",\"v\":2}");
  assert_int_equal(commit(&e), 3);
  CHECK(checksum_at(&e, "b", 3, &before));
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved, 1);
  assert_int_equal(stats.buckets_compacted, 1);
  assert_true(stats.bytes_after < stats.bytes_before);
  CHECK(read_ops(&e, "b", 0, 3, &l));
  assert_int_equal(l.n, 3);
  assert_int_equal(l.v[0].type, BS_OP_PUT);
  assert_int_equal(l.v[1].type, BS_OP_MOVE);
  assert_int_equal(l.v[1].target, 3);
  assert_string_equal(l.v[1].row, "");
  assert_int_equal(l.v[2].type, BS_OP_PUT);
  CHECK(checksum_at(&e, "b", 3, &after));
  assert_int_equal(after.checksum, before.checksum);
  assert_int_equal(after.count, 3);
  ol_free(&l);
  /* a second pass finds nothing more */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved + stats.ops_cleared, 0);
  verify_db(&e);
  env_close(&e);
}

static void test_spec_clear(void **state) {
  env e;
  oplist l;
  bs_checksum c2, c4, after, x;
  bs_compact_stats stats;
  const char *b = "b";
  bs_compact_options o = bucket_opts(&b, 1);
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "{\"id\":\"t1\"}");
  put(&e, "b", "t2", "{\"id\":\"t2\"}");
  del(&e, "t1");
  put(&e, "b", "t2", "{\"id\":\"t2\",\"v\":2}");
  assert_int_equal(commit(&e), 4);
  CHECK(checksum_at(&e, "b", 2, &c2)); /* cached below the CLEAR to come */
  CHECK(checksum_at(&e, "b", 4, &c4));
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved, 2);
  assert_int_equal(stats.ops_cleared, 3);
  CHECK(read_ops(&e, "b", 0, 4, &l));
  assert_int_equal(l.n, 2);
  assert_int_equal(l.v[0].type, BS_OP_CLEAR);
  assert_int_equal(l.v[0].op_id, 3);
  assert_int_equal(l.v[0].target, 4); /* the largest target replaced (MOVE of op 2) */
  assert_int_equal(l.v[1].type, BS_OP_PUT);
  assert_int_equal(l.v[1].op_id, 4);
  CHECK(checksum_at(&e, "b", 4, &after));
  assert_int_equal(after.checksum, c4.checksum);
  assert_int_equal(after.count, 2);
  CHECK(checksum_at(&e, "b", 3, &after));
  assert_int_equal(after.count, 1);
  ol_free(&l);
  /* torn reads: inside [clear_start, clear_op) */
  assert_int_equal(checksum_at(&e, "b", 2, &x), BS_EINVALIDATED);
  assert_int_equal(checksum_at(&e, "b", 1, &x), BS_EINVALIDATED);
  assert_int_equal(read_ops(&e, "b", 0, 2, &l), BS_EINVALIDATED);
  ol_free(&l);
  /* below the span: the bucket was empty then and still is */
  CHECK(checksum_at(&e, "b", 0, &x));
  assert_int_equal(x.count, 0);
  (void)c2;
  verify_db(&e);
  env_close(&e);
}

static void test_default_horizon(void **state) {
  env e;
  oplist l;
  bs_compact_stats stats;
  const char *b = "b";
  bs_compact_options o = bucket_opts(&b, 1);
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "a");
  put(&e, "b", "t2", "a");
  put(&e, "b", "t2", "b");
  assert_int_equal(commit(&e), 3);
  put(&e, "b", "t2", "c");
  put(&e, "b", "t1", "b");
  assert_int_equal(flush(&e), 5); /* persisted, not committed */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  CHECK(read_ops(&e, "b", 0, 5, &l));
  assert_int_equal(l.n, 5);
  assert_int_equal(l.v[0].type, BS_OP_PUT); /* superseded only above the horizon */
  assert_int_equal(l.v[1].type, BS_OP_MOVE);
  assert_int_equal(l.v[1].target, 3);
  assert_int_equal(l.v[2].type, BS_OP_PUT);
  assert_int_equal(l.v[3].type, BS_OP_PUT);
  assert_string_equal(l.v[3].data, "c");
  assert_int_equal(l.v[4].type, BS_OP_PUT);
  ol_free(&l);
  env_close(&e);
}

/* ---- Which buckets are due ------------------------------------------------------------------ */

typedef struct due_list {
  char names[4][8];
  uint64_t count[4], changes[4];
  size_t n;
} due_list;

static int on_bucket_info(const bs_bucket_info *b, void *payload) {
  due_list *d = payload;
  assert_true(d->n < 4 && b->name.size < sizeof d->names[0]);
  memcpy(d->names[d->n], b->name.data, b->name.size);
  d->names[d->n][b->name.size] = 0;
  d->count[d->n] = b->count;
  d->changes[d->n++] = b->changes;
  return 0;
}

/* What bs_compact_bucket_due answers for each listed bucket, as a bit per bucket. */
static unsigned due_mask(env *e, const bs_compact_options *o, due_list *d) {
  unsigned mask = 0;
  memset(d, 0, sizeof *d);
  CHECK(bs_list_buckets(e->st, S(NULL), on_bucket_info, d, ERR));
  for (size_t i = 0; i < d->n; i++) {
    bs_bucket_info info = {{NULL, 0}, 0, d->count[i], 0, 0, 0, d->changes[i]};
    int due = -1;
    CHECK(bs_compact_bucket_due(&due, o, &info, ERR));
    if (due) mask |= 1u << i;
  }
  return mask;
}

/* bs_compact_bucket_due answers what a full compaction then selects: buckets "few" (8 ops, under
 * the default BS_COMPACT_MIN_BUCKET_CHANGES), "half" (40 ops, then 20 more after a compaction: ratio about 0.5) and
 * "many" (60 ops). */
static void test_bucket_due(void **state) {
  env e;
  due_list d;
  bs_compact_stats stats;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_bucket_info info = {{NULL, 0}, 0, 10, 0, 0, 0, 10};
  char id[16];
  int due = -1;
  (void)state;
  env_open(&e);
  for (int pass = 0; pass < 2; pass++) /* every row written twice: compaction has work */
    for (int i = 0; i < 30; i++) {
      snprintf(id, sizeof id, "f%d", i);
      if (i < 4) put(&e, "few", id, pass ? "y" : "x");
      id[0] = 'h';
      if (i < 20) put(&e, "half", id, pass ? "y" : "x");
      id[0] = 'm';
      put(&e, "many", id, pass ? "y" : "x");
    }
  commit(&e);
  assert_int_equal(due_mask(&e, NULL, &d), 6); /* half, many: every op is new */
  CHECK(bs_compact(&stats, e.st, NULL, ERR));
  assert_int_equal(stats.buckets_compacted, 2);
  assert_int_equal(due_mask(&e, NULL, &d), 0);
  for (int i = 0; i < 20; i++) { /* "half": 20 more ops over 41 (a CLEAR and 20 PUTs) */
    snprintf(id, sizeof id, "h%d", i);
    put(&e, "half", id, "z");
  }
  commit(&e);
  assert_string_equal(d.names[1], "half");
  assert_int_equal(due_mask(&e, NULL, &d), 2);
  o.min_change_ratio = 0.6;
  assert_int_equal(due_mask(&e, &o, &d), 0);
  o.min_change_ratio = -1.0;
  o.min_bucket_changes = 3;
  assert_int_equal(due_mask(&e, &o, &d), 3); /* "few" was never compacted: 8 changes of 8 */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.buckets_compacted, 2);
  /* bad arguments */
  assert_int_equal(bs_compact_bucket_due(NULL, NULL, &info, NULL), BS_EINVAL);
  assert_int_equal(bs_compact_bucket_due(&due, NULL, NULL, NULL), BS_EINVAL);
  assert_int_equal(due, 0);
  o.min_change_ratio = 0.0 / 0.0;
  due = -1;
  assert_int_equal(bs_compact_bucket_due(&due, &o, &info, NULL), BS_EINVAL);
  assert_int_equal(due, 0);
  env_close(&e);
}

/* ---- Initial replication ------------------------------------------------------------------- */

static void test_initial_replication(void **state) {
  env e;
  oplist l;
  uint64_t n = 99;
  bs_checksum cs;
  bs_error err;
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "a");
  put(&e, "b", "t2", "a");
  put(&e, "b", "t1", "b");
  del(&e, "t2");
  put(&e, "c", "t3", "a");
  assert_int_equal(flush(&e), 5);
  CHECK(bs_compact_initial_replication(&n, e.st, 0, 0, ERR));
  assert_int_equal(n, 2);
  CHECK(read_ops(&e, "b", 0, 5, &l));
  assert_int_equal(l.n, 1); /* t1's old PUT, t2's PUT and its REMOVE are gone */
  assert_int_equal(l.v[0].op_id, 3);
  assert_string_equal(l.v[0].data, "b");
  CHECK(checksum_at(&e, "b", 5, &cs));
  assert_int_equal(cs.count, 1);
  assert_int_equal(cs.checksum, l.v[0].checksum);
  ol_free(&l);
  CHECK(bs_compact_initial_replication(&n, e.st, 0, 0, ERR));
  assert_int_equal(n, 0);
  verify_db(&e);
  commit(&e);
  assert_int_equal(bs_compact_initial_replication(&n, e.st, 0, 0, &err), BS_ESTATE);
  env_close(&e);
}

/* ---- Incremental ---------------------------------------------------------------------------- */

static void test_incremental(void **state) {
  env e;
  oplist l;
  bs_compact_stats stats;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_checksum before, after;
  uint64_t c;
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "a"); /* 1 */
  put(&e, "b", "t2", "a"); /* 2 */
  put(&e, "b", "t1", "b"); /* 3: 1 -> 3 */
  put(&e, "b", "t3", "a"); /* 4 */
  c = commit(&e);
  put(&e, "b", "t2", "b"); /* 5: 2 -> 5, above the horizon */
  flush(&e);
  /* every checkpoint is younger than a day (a minute was a wall-clock window a slow run can
   * exceed): nothing happens */
  o.incremental_only = 1;
  o.min_age_ms = 24 * 3600 * 1000;
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved, 0);
  o.min_age_ms = 0;
  CHECK(checksum_at(&e, "b", c, &before));
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved, 1);
  CHECK(read_ops(&e, "b", 0, 5, &l));
  assert_int_equal(l.v[0].type, BS_OP_MOVE);
  assert_int_equal(l.v[0].target, 3);
  assert_int_equal(l.v[1].type, BS_OP_PUT); /* op 2: superseded only above the horizon */
  ol_free(&l);
  CHECK(checksum_at(&e, "b", c, &after));
  assert_int_equal(after.checksum, before.checksum);
  c = commit(&e);
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved, 1);
  assert_int_equal(stats.ops_cleared, 2); /* MOVE 1, MOVE 2 -> CLEAR(2) */
  CHECK(read_ops(&e, "b", 0, c, &l));
  assert_int_equal(l.n, 4);
  assert_int_equal(l.v[0].type, BS_OP_CLEAR);
  assert_int_equal(l.v[0].op_id, 2);
  assert_int_equal(l.v[0].target, 5);
  ol_free(&l);
  /* the log is consumed: nothing more to do */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.ops_moved + stats.ops_cleared, 0);
  verify_db(&e);
  env_close(&e);
}

/* ---- Chunks (LMDB format 5, docs/format.md 4.3) --------------------------------------------- */

#define CHUNK_CAP 4080u /* lmdb_ops.c: the writer's bound of a chunk's bytes (and 256 ops) */

typedef struct chunk_count {
  size_t n;   /* the bucket's chunks */
  size_t fit; /* adjacent pairs that would fit the writer's bounds as one */
} chunk_count;

static size_t varint_bytes(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}

/* The bucket's chunk records, read raw: their number, and how many neighbours could be one (a
 * join: the two values less the later one's header and its first op's one-byte delta 0, plus
 * the delta from the earlier one's last op id, the key's). */
static chunk_count count_chunks(env *e, const char *bucket) {
  bs__lmdb_db *db = (bs__lmdb_db *)e->db;
  chunk_count cc = {0, 0};
  MDB_txn *txn;
  MDB_cursor *cur;
  unsigned char kb[BS_OP_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  uint64_t id = 0, prev_last = 0;
  size_t prev_size = 0;
  uint32_t prev_n = 0;
  int mrc;
  CHECK(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, ERR));
  CHECK(bs__lmdb_bucket_id(db, txn, NULL, bs_storage_stream_id(e->st), S(bucket), &id, ERR));
  assert_int_equal(mdb_cursor_open(txn, db->ops, &cur), 0);
  bs__lmdb_op_key(kb, id, 0);
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const unsigned char *p = v.mv_data;
    uint32_t n;
    if (bs__get_u64be(k.mv_data) != id) break;
    assert_true(v.mv_size > 21);
    n = bs__get_u32le(p);
    if (cc.n && prev_n + n <= 256 &&
        prev_size + v.mv_size - 22 + varint_bytes(bs__get_u64le(p + 8) - prev_last) <= CHUNK_CAP)
      cc.fit++;
    cc.n++;
    prev_n = n;
    prev_size = v.mv_size;
    prev_last = bs__get_u64be((const unsigned char *)k.mv_data + 8);
  }
  assert_int_equal(mrc == 0 || mrc == MDB_NOTFOUND, 1);
  mdb_cursor_close(cur);
  bs__lmdb_txn_abort(db, txn);
  return cc;
}

/* Compaction joins the small chunks it leaves: a bucket whose PUTs became MOVEs (a chunk of ~20
 * PUTs of ~180 bytes shrinks to ~450 bytes) ends with no two neighbouring chunks that fit in one,
 * in full and in incremental compaction. What a client reduces the bucket to, its checksum, and
 * the torn read below the CLEAR are unchanged by it; buckets around it keep their own chunks. */
static void merge_scenario(int incremental) {
  enum { N = 400, HEAD = 12 };
  char id[16], data[200];
  env e;
  oplist before_ops, after_ops;
  reduced ra, rb;
  bs_checksum cb, ca, x;
  bs_compact_stats stats;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  chunk_count b0, b1, a0, a1;
  uint64_t c_mid = 0, c1, c2;
  env_open(&e);
  memset(data, 'x', sizeof data - 1);
  data[sizeof data - 1] = '\0';
  put(&e, "a", "a1", data);
  /* r0..r(HEAD-1), the leading run compaction folds (a checkpoint inside it), then keep */
  for (int i = 0; i < N; i++) {
    if (i == HEAD) put(&e, "b", "keep", data); /* a live PUT: the ops after it are MOVEd */
    snprintf(id, sizeof id, "r%d", i);
    data[0] = (char)('a' + i % 26);
    put(&e, "b", id, data);
    if (i == HEAD / 2) c_mid = commit(&e);
  }
  put(&e, "c", "c1", data);
  c1 = commit(&e);
  for (int i = 0; i < N; i++) { /* every r updated: its first PUT is superseded */
    snprintf(id, sizeof id, "r%d", i);
    data[0] = (char)('A' + i % 26);
    put(&e, "b", id, data);
    if (i % 97 == 0) flush(&e);
  }
  put(&e, "a", "a1", "a2");
  put(&e, "c", "c1", "c2");
  c2 = commit(&e);
  b0 = count_chunks(&e, "b");
  a0 = count_chunks(&e, "a");
  assert_true(b0.n >= 2 * N * 180 / CHUNK_CAP); /* the writer's chunks: full */
  assert_true(b0.fit <= 1);
  CHECK(read_ops(&e, "b", 0, c2, &before_ops));
  CHECK(checksum_at(&e, "b", c2, &cb));
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0;
  o.min_age_ms = 0;
  o.incremental_only = incremental;
  o.max_ops_per_txn = 64; /* several transactions: a chunk written at each one's end */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_true(stats.ops_moved >= N - HEAD);
  b1 = count_chunks(&e, "b");
  a1 = count_chunks(&e, "a");
  /* MOVEs of ~22 bytes: N of them fill about 3 chunks, the N new PUTs their own */
  assert_true(b1.n < b0.n - (N - HEAD) * 180 / CHUNK_CAP + 4);
  if (b1.fit)
    fail_msg("%zu neighbouring chunks of %zu fit in one (seed=%llu)", b1.fit, b1.n, g_seed);
  assert_int_equal(a1.n, a0.n);
  /* what a client reduces the bucket to, and its checksum, are unchanged */
  CHECK(read_ops(&e, "b", 0, c2, &after_ops));
  memset(&ra, 0, sizeof ra);
  memset(&rb, 0, sizeof rb);
  reduce_list(&ra, &before_ops, c2);
  reduce_list(&rb, &after_ops, c2);
  assert_reduced_equal(&ra, &rb, incremental ? "merge, incremental" : "merge, full");
  assert_true(after_ops.n < before_ops.n);
  CHECK(checksum_at(&e, "b", c2, &ca));
  assert_int_equal(ca.checksum, cb.checksum);
  assert_int_equal(ca.count, after_ops.n);
  /* a read at a checkpoint inside the folded run is torn, one at c1 above it is not */
  if (!incremental) {
    assert_int_equal(checksum_at(&e, "b", c_mid, &x), BS_EINVALIDATED);
    ol_free(&after_ops);
    assert_int_equal(read_ops(&e, "b", 0, c_mid, &after_ops), BS_EINVALIDATED);
  }
  ol_free(&after_ops);
  CHECK(read_ops(&e, "b", 0, c1, &after_ops));
  verify_db(&e);
  reduce_free(&ra);
  reduce_free(&rb);
  ol_free(&before_ops);
  ol_free(&after_ops);
  env_close(&e);
}

static void test_merge_chunks(void **state) {
  (void)state;
  merge_scenario(0);
  merge_scenario(1);
}

/* ---- Random workloads against the history -------------------------------------------------- */

static unsigned long long rng_state;
static unsigned rnd(unsigned n) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (unsigned)((rng_state >> 33) % n);
}

#define NB 3
static const char *const BUCKETS[NB] = {"b0", "b1", "b2"};

typedef struct model {
  oplist hist[NB]; /* every op ever written, as first read */
  uint64_t read_upto;
  uint64_t horizon; /* highest compaction horizon used */
} model;

/* Records the ops of (read_upto, c] (fresh: above every horizon used so far). */
static void model_capture(env *e, model *m, uint64_t c) {
  for (int b = 0; b < NB; b++) {
    oplist l;
    CHECK(read_ops(e, BUCKETS[b], m->read_upto, c, &l));
    for (size_t i = 0; i < l.n; i++) {
      assert_true(l.v[i].type == BS_OP_PUT || l.v[i].type == BS_OP_REMOVE);
      ol_push(&m->hist[b], &l.v[i]);
    }
    ol_free(&l);
  }
  m->read_upto = c;
}

static void model_free(model *m) {
  for (int b = 0; b < NB; b++) ol_free(&m->hist[b]);
}

/* Properties 1-3 at checkpoint c (>= every horizon used). */
static void model_check(env *e, model *m, uint64_t c) {
  for (int b = 0; b < NB; b++) {
    const oplist *h = &m->hist[b];
    uint32_t sum = 0;
    uint64_t n = 0;
    size_t i = 0;
    oplist full;
    reduced r1 = {0, NULL, 0, 0, 0}, r2 = {0, NULL, 0, 0, 0};
    /* 1: checksum = history at C in [horizon, c]: both ends and a sample between */
    for (uint64_t x = m->horizon, step = 1 + (c - m->horizon) / 24; x <= c;
         x = (x < c && x + step > c) ? c : x + step) {
      bs_checksum cs;
      while (i < h->n && h->v[i].op_id <= x) sum += h->v[i++].checksum, n++;
      CHECK(checksum_at(e, BUCKETS[b], x, &cs));
      if (cs.checksum != sum || cs.count > n) {
        print_error("bucket %s at %llu: checksum %u/%llu, history %u/%llu seed=%llu\n", BUCKETS[b],
                    (unsigned long long)x, cs.checksum, (unsigned long long)cs.count, sum,
                    (unsigned long long)n, g_seed);
        fail();
      }
    }
    /* 2: reduce equality */
    CHECK(read_ops(e, BUCKETS[b], 0, c, &full));
    for (i = 1; i < full.n; i++) assert_true(full.v[i].op_id > full.v[i - 1].op_id);
    for (i = 0; i < full.n; i++) { /* 6: shape */
      if (full.v[i].type == BS_OP_CLEAR) assert_int_equal(i, 0);
      if (full.v[i].type == BS_OP_MOVE || full.v[i].type == BS_OP_CLEAR) {
        assert_string_equal(full.v[i].row, "");
        assert_true(full.v[i].target <= c);
      }
    }
    reduce_list(&r1, h, c);
    reduce_list(&r2, &full, c);
    assert_reduced_equal(&r1, &r2, "reduce(history) vs reduce(read)");
    reduce_free(&r2);
    ol_free(&full);
    /* 3: resume from a few positions */
    for (int k = 0; k < 4; k++) {
      uint64_t x = c ? rnd((unsigned)c + 1) : 0;
      reduced r3 = {0, NULL, 0, 0, 0};
      oplist tail;
      int rc = read_ops(e, BUCKETS[b], x, c, &tail);
      reduce_list(&r3, h, x);
      if (rc == BS_OK && tail.max_target <= c) {
        for (i = 0; i < tail.n; i++) reduce_apply(&r3, &tail.v[i]);
        assert_reduced_equal(&r1, &r3, "resume");
      } else if (rc != BS_OK && rc != BS_EINVALIDATED) {
        fail_msg("resume read: %s seed=%llu", bs_strerror(rc), g_seed);
      }
      reduce_free(&r3);
      ol_free(&tail);
    }
    reduce_free(&r1);
  }
}

static int cancel_after(const bs_compact_stats *s, void *payload) {
  int *left = payload;
  (void)s;
  return (*left)-- <= 0;
}

static void random_save(env *e, unsigned rows) {
  char id[16], data[32];
  const char *bs[NB];
  size_t n = 0;
  snprintf(id, sizeof id, "r%u", rnd(rows));
  if (rnd(8) == 0) {
    del(e, id);
    return;
  }
  for (int b = 0; b < NB; b++)
    if (rnd(3) == 0) bs[n++] = BUCKETS[b];
  if (n == 0) bs[n++] = BUCKETS[rnd(NB)];
  snprintf(data, sizeof data, "{\"v\":%u}", rnd(1000));
  save_row(e, id, bs, n, data);
}

static void test_random(void **state) {
  env e;
  model m;
  unsigned rounds = g_quick ? 40 : 200;
  uint64_t c = 0, reemitted = 0;
  (void)state;
  rng_state = ct_seed(g_seed, 1).s;
  memset(&m, 0, sizeof m);
  env_open(&e);
  for (unsigned r = 0; r < rounds; r++) {
    unsigned saves = 1 + rnd(30);
    for (unsigned s = 0; s < saves; s++) random_save(&e, 12);
    c = commit(&e);
    model_capture(&e, &m, c);
    if (rnd(2) == 0) {
      bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
      bs_compact_stats stats;
      int left = (int)rnd(4), rc;
      bs_error err;
      o.min_bucket_changes = 1;
      o.min_change_ratio = 0;
      o.max_ops_per_txn = 2 + rnd(6);
      o.incremental_only = rnd(2);
      o.min_age_ms = 0;
      if (rnd(3) == 0) o.max_op_id = 1 + rnd((unsigned)c);
      if (rnd(4) == 0) o.memory_limit_mb = 1;
      if (rnd(3) == 0) o.defragment_ratio = 0.2 + 0.2 * rnd(4); /* its ops join the history */
      if (rnd(4) == 0) {
        o.progress = cancel_after;
        o.progress_payload = &left;
      }
      rc = bs_compact(&stats, e.st, &o, &err);
      if (rc != BS_OK && rc != BS_ECANCELED) fail_msg("compact: %s (%s)", bs_strerror(rc), err.msg);
      reemitted += stats.ops_reemitted;
      {
        uint64_t h = o.max_op_id ? o.max_op_id : c;
        if (h > m.horizon) m.horizon = h;
      }
    }
    if (rnd(3) == 0) {
      put(&e, BUCKETS[rnd(NB)], "r0", "{\"uncommitted\":1}"); /* persisted above C */
      flush(&e);
    }
    model_check(&e, &m, c);
  }
  /* the workload is fragmented enough that defragmentation takes part */
  if (!g_quick) assert_true(reemitted > 0);
  verify_db(&e);
  model_free(&m);
  env_close(&e);
}

/* Cancellation leaves a database every reader and a later compaction accept. */
static void test_cancel(void **state) {
  env e;
  model m;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats stats;
  int left = 1;
  uint64_t c;
  bs_error err;
  (void)state;
  rng_state = ct_seed(g_seed, 2).s;
  memset(&m, 0, sizeof m);
  env_open(&e);
  for (int i = 0; i < 300; i++) random_save(&e, 20);
  c = commit(&e);
  model_capture(&e, &m, c);
  o.min_bucket_changes = 1;
  o.max_ops_per_txn = 5;
  o.progress = cancel_after;
  o.progress_payload = &left;
  assert_int_equal(bs_compact(&stats, e.st, &o, &err), BS_ECANCELED);
  m.horizon = c;
  model_check(&e, &m, c);
  verify_db(&e);
  o.progress = NULL;
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  model_check(&e, &m, c);
  verify_db(&e);
  model_free(&m);
  env_close(&e);
}

/* A seen-set far smaller than the rows: less is compacted, nothing is wrong. */
static void test_bounded_memory(void **state) {
  env e;
  model m;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats small, full;
  unsigned rows = g_quick ? 20000 : 60000;
  char id[16];
  uint64_t c;
  (void)state;
  memset(&m, 0, sizeof m);
  env_open(&e);
  for (int pass = 0; pass < 2; pass++)
    for (unsigned i = 0; i < rows; i++) {
      snprintf(id, sizeof id, "row%06u", i);
      put(&e, "b0", id, pass ? "{\"v\":2}" : "{\"v\":1}");
    }
  c = commit(&e);
  model_capture(&e, &m, c);
  o.min_bucket_changes = 1;
  o.memory_limit_mb = 1;
  CHECK(bs_compact(&small, e.st, &o, ERR));
  assert_true(small.ops_moved > 0);
  assert_true(small.ops_moved < rows); /* the set filled up: some rows untracked */
  m.horizon = c;
  model_check(&e, &m, c);
  o.memory_limit_mb = 0;
  o.buckets = NULL;
  {
    const char *b = "b0";
    bs_compact_options o2 = bucket_opts(&b, 1);
    CHECK(bs_compact(&full, e.st, &o2, ERR));
  }
  assert_int_equal(small.ops_moved + full.ops_moved, rows);
  model_check(&e, &m, c);
  verify_db(&e);
  model_free(&m);
  env_close(&e);
}

/* A map too small for what compaction writes: transactions hit MDB_MAP_FULL, the map grows and
 * the transaction runs again from the state it began with (several buckets per transaction). */
static void test_map_growth(void **state) {
  env e;
  model m;
  uint64_t c;
  (void)state;
  rng_state = ct_seed(g_seed, 7).s;
  memset(&m, 0, sizeof m);
  g_map_size = 64 * 1024;
  env_open(&e);
  g_map_size = 0;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 400; i++) random_save(&e, 150);
    c = commit(&e);
    model_capture(&e, &m, c);
    for (int pass = 0; pass < 2; pass++) {
      bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
      o.min_bucket_changes = 1;
      o.min_change_ratio = 0;
      o.min_age_ms = 0;
      o.incremental_only = pass;
      o.max_ops_per_txn = 50 + 400 * (unsigned)round;
      CHECK(bs_compact(NULL, e.st, &o, ERR));
    }
    m.horizon = c;
    model_check(&e, &m, c);
  }
  verify_db(&e);
  model_free(&m);
  env_close(&e);
}

/* Many small buckets and a few ops changed per transaction: transactions end inside a bucket,
 * and the next one finishes that bucket's job and goes on with the next buckets. A reader in
 * another process pins the pages of the snapshot it holds, so every transaction needs fresh
 * pages and many of them hit MDB_MAP_FULL and run again, some after a later job cleared the
 * seen-set (the resumed full job then starts again from its bucket as committed). What a client
 * ends with never changes. */
#define MG_BUCKETS 40

static int mg_hold(const bs_chunk *chunk, void *payload) {
  int *fds = payload; /* [0]: write "holding", [1]: read until the parent closes it */
  char b = 1;
  (void)chunk;
  if (write(fds[0], &b, 1) != 1) return 1;
  while (read(fds[1], &b, 1) > 0) {
  }
  return 0;
}

/* The child: waits for go, opens the file, holds a read snapshot until done is closed. */
static void mg_reader(const char *path, int go, int held, int done) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_bucket_request rq = {{"g0", 2}, 0};
  int fds[2] = {held, done}, more = 0, rc;
  char b;
  if (read(go, &b, 1) != 1) _exit(2);
  rc = bs_open(&db, path, NULL, NULL);
  if (rc == BS_OK) rc = bs_storage_open(&st, db, 0, NULL);
  if (rc == BS_OK) rc = bs_get_bucket_data(&more, st, 1u << 30, &rq, 1, NULL, mg_hold, fds, NULL);
  bs_storage_close(st);
  bs_close(db);
  _exit(rc == BS_OK ? 0 : 3);
}

static void test_map_growth_jobs(void **state) {
  unsigned trials = g_quick ? 3 : 12;
  (void)state;
  for (unsigned t = 0; t < trials; t++) {
    char names[MG_BUCKETS][8];
    reduced before[MG_BUCKETS];
    bs_checksum cs_before[MG_BUCKETS];
    bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats stats;
    int go[2], held[2], done[2], status = 0;
    pid_t pid;
    char b = 1;
    env e;
    uint64_t c;
    g_map_size = 64 * 1024;
    env_open(&e);
    g_map_size = 0;
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(held), 0);
    assert_int_equal(pipe(done), 0);
    fflush(NULL);
    if ((pid = fork()) == 0) { /* no handle of the parent is used here */
      close(go[1]), close(held[0]), close(done[1]);
      mg_reader(e.path, go[0], held[1], done[0]);
    }
    assert_true(pid > 0);
    close(go[0]), close(held[1]), close(done[0]);
    for (unsigned bk = 0; bk < MG_BUCKETS; bk++) {
      snprintf(names[bk], sizeof names[bk], "g%u", bk);
      for (unsigned i = 0; i < 12 + (bk + t) % 9; i++) {
        char id[16], data[48];
        snprintf(id, sizeof id, "r%u", (i * 7 + bk) % 5);
        snprintf(data, sizeof data, "{\"b\":%u,\"i\":%u}", bk, i);
        put(&e, names[bk], id, data);
      }
    }
    c = commit(&e);
    for (unsigned bk = 0; bk < MG_BUCKETS; bk++) {
      oplist l;
      memset(&before[bk], 0, sizeof before[bk]);
      CHECK(read_ops(&e, names[bk], 0, c, &l));
      reduce_list(&before[bk], &l, c);
      ol_free(&l);
      CHECK(checksum_at(&e, names[bk], c, &cs_before[bk]));
    }
    /* the reader holds its snapshot (of this state) through the whole compaction */
    assert_int_equal(write(go[1], &b, 1), 1);
    assert_int_equal(read(held[0], &b, 1), 1);
    o.min_bucket_changes = 1;
    o.min_change_ratio = 0;
    o.max_ops_per_txn = 3 + t % 11;
    CHECK(bs_compact(&stats, e.st, &o, ERR));
    close(done[1]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(go[1]), close(held[0]);
    assert_true(stats.ops_moved > 0);
    for (unsigned bk = 0; bk < MG_BUCKETS; bk++) {
      oplist l;
      reduced after = {0, NULL, 0, 0, 0};
      bs_checksum cs;
      CHECK(read_ops(&e, names[bk], 0, c, &l));
      reduce_list(&after, &l, c);
      assert_reduced_equal(&before[bk], &after, names[bk]);
      CHECK(checksum_at(&e, names[bk], c, &cs));
      assert_int_equal(cs.checksum, cs_before[bk].checksum);
      reduce_free(&after);
      reduce_free(&before[bk]);
      ol_free(&l);
    }
    verify_db(&e);
    env_close(&e);
  }
}

/* ---- Parameter compaction ------------------------------------------------------------------- */

static void save_lookup(env *e, const char *id, bs_val key, const char *param) {
  bs_save s = BS_SAVE_INIT;
  bs_lookup lk;
  bs_val pv = S(param);
  lk.key = key;
  lk.params = &pv;
  lk.n_params = 1;
  s.table = S("t");
  s.tag = BS_UPDATE;
  s.after_id = S(id);
  s.lookups = &lk;
  s.n_lookups = 1;
  CHECK(bs_writer_save(e->w, &s, ERR));
}

static int count_param(const bs_val *p, void *payload) {
  char *last = payload;
  snprintf(last, 32, "%.*s", (int)p->size, (const char *)p->data);
  return 0;
}

static void test_parameters(void **state) {
  env e;
  unsigned char kb[64];
  size_t ks;
  bs_scalar sc;
  bs_val key;
  char got[32] = "";
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats stats;
  uint64_t c;
  bs_error err;
  (void)state;
  memset(&sc, 0, sizeof sc);
  sc.type = BS_SCALAR_STRING;
  sc.s = S("k1");
  CHECK(bs_lookup_encode(kb, sizeof kb, &ks, &sc, 1, ERR));
  key.data = kb;
  key.size = ks;
  env_open(&e);
  save_lookup(&e, "p1", key, "{\"a\":1}");
  save_lookup(&e, "p1", key, "{\"a\":2}");
  del(&e, "p1"); /* tombstone */
  save_lookup(&e, "p2", key, "{\"b\":1}");
  save_lookup(&e, "p2", key, "{\"b\":2}");
  c = commit(&e);
  CHECK(bs_get_parameter_sets(e.st, c, &key, 1, BS_PARAM_LIMIT_DEFAULT, count_param, got, ERR));
  assert_string_equal(got, "{\"b\":2}");
  o.compact_parameters = 1;
  o.min_bucket_changes = 1000; /* no bucket work */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.parameter_entries_removed, 4);
  got[0] = 0;
  CHECK(bs_get_parameter_sets(e.st, c, &key, 1, BS_PARAM_LIMIT_DEFAULT, count_param, got, ERR));
  assert_string_equal(got, "{\"b\":2}");
  assert_int_equal(
      bs_get_parameter_sets(e.st, c - 1, &key, 1, BS_PARAM_LIMIT_DEFAULT, count_param, got, &err),
      BS_ESTALE);
  /* a second pass at the same horizon has nothing to do */
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.parameter_entries_removed, 0);
  verify_db(&e);
  env_close(&e);
}

/* During the parameter pass (at each of its reports), a read below the new horizon is refused
 * (BS_ESTALE), never answered from half-compacted entries. */
typedef struct stale_probe {
  bs_storage *st;
  bs_val key;
  uint64_t below;
  int reports, answered;
  uint64_t removed, max_step; /* entries removed at the last report; the most between two */
} stale_probe;

static int probe_stale(const bs_compact_stats *s, void *payload) {
  stale_probe *p = payload;
  char got[32];
  bs_error err;
  p->reports++;
  if (s->parameter_entries_removed - p->removed > p->max_step)
    p->max_step = s->parameter_entries_removed - p->removed;
  p->removed = s->parameter_entries_removed;
  if (bs_get_parameter_sets(p->st, p->below, &p->key, 1, BS_PARAM_LIMIT_DEFAULT, count_param, got,
                            &err) != BS_ESTALE)
    p->answered++;
  return 0;
}

static void test_parameters_fenced(void **state) {
  env e;
  unsigned char kb[64];
  size_t ks;
  bs_scalar sc;
  char id[16], v[32];
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats stats;
  stale_probe p;
  (void)state;
  memset(&sc, 0, sizeof sc);
  memset(&p, 0, sizeof p);
  sc.type = BS_SCALAR_STRING;
  sc.s = S("k1");
  CHECK(bs_lookup_encode(kb, sizeof kb, &ks, &sc, 1, ERR));
  p.key.data = kb;
  p.key.size = ks;
  env_open(&e);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 20; i++) {
      snprintf(id, sizeof id, "p%d", i);
      snprintf(v, sizeof v, "{\"v\":%d}", round);
      save_lookup(&e, id, p.key, v);
    }
    if (round == 0) p.below = commit(&e);
  }
  commit(&e);
  p.st = e.st;
  o.compact_parameters = 1;
  o.min_bucket_changes = 1000; /* no bucket work */
  o.max_ops_per_txn = 2;       /* a transaction per group or two */
  o.progress = probe_stale;
  o.progress_payload = &p;
  CHECK(bs_compact(&stats, e.st, &o, ERR));
  assert_int_equal(stats.parameter_entries_removed, 20);
  /* contract.md 6: transactions of at most max_ops_per_txn entries, a report after each, on
   * every backend: so no report saw more than 2 removed since the one before, and the 20 took
   * 10 reports or more */
  assert_true(p.max_step <= o.max_ops_per_txn);
  assert_true(p.reports >= 10);
  assert_int_equal(p.answered, 0);
  verify_db(&e);
  env_close(&e);
}

/* ---- A writer and a compactor at the same time ---------------------------------------------- */

#define CC_NB    4
#define CC_ROWS  60
#define CC_EVERY 5 /* rounds of the writer per compaction pass it waits for */

typedef struct cc_shared {
  env *e;
  md_stream m;        /* written by the writer thread only, read after join */
  uint64_t cps[4096]; /* checkpoints made, in order */
  size_t n_cps;
  atomic_int writer_done;
  uint64_t max_horizon; /* the compactor's, read after join */
  /* The interleaving the test asserts is arranged, not hoped for: every CC_EVERY rounds the
   * writer waits (mu/cv) until the compactor has finished one more pass. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned passes; /* under mu */
  atomic_int failed;
  char why[400];
  unsigned long long seed;
} cc_shared;

/* Each row lives in one bucket at a time, so every save writes a PUT and at most one REMOVE:
 * the model predicts every op id exactly (no reordered groups). */
static void *cc_writer(void *arg) {
  cc_shared *sh = arg;
  env *e = sh->e;
  unsigned long long r = ct_seed(sh->seed, 3).s;
  unsigned rounds = g_quick ? 60 : 300;
  for (unsigned k = 0; k < rounds && !sh->failed; k++) {
    unsigned saves = 1 + (unsigned)((r = r * 6364136223846793005ull + 1) >> 33) % 25;
    bs_error err;
    bs_commit_result cr;
    char lsn[32];
    int rc;
    for (unsigned i = 0; i < saves; i++) {
      char id[16], data[32], bucket[8];
      unsigned x;
      bs_row row;
      bs_save s = BS_SAVE_INIT;
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      x = (unsigned)(r >> 33);
      snprintf(id, sizeof id, "r%u", x % CC_ROWS);
      snprintf(bucket, sizeof bucket, "c%u", (x / CC_ROWS) % CC_NB);
      snprintf(data, sizeof data, "{\"v\":%u}", x % 997);
      s.table = S("t");
      if (x % 11 == 0) {
        s.tag = BS_DELETE;
        s.before_id = S(id);
      } else {
        row.bucket = S(bucket);
        row.object_type = S("test");
        row.object_id = S(id);
        row.data = S(data);
        s.tag = BS_UPDATE;
        s.after_id = S(id);
        s.rows = &row;
        s.n_rows = 1;
      }
      md_save(&sh->m, &s);
      if ((rc = bs_writer_save(e->w, &s, &err)) != BS_OK) {
        snprintf(sh->why, sizeof sh->why, "save: %s (%s)", bs_strerror(rc), err.msg);
        sh->failed = 1;
        break;
      }
    }
    if (sh->failed) break;
    if (e->lsn == 0 && (rc = bs_writer_snapshot_done(e->w, S("00000000"), &err)) != BS_OK) {
      snprintf(sh->why, sizeof sh->why, "snapshot_done: %s (%s)", bs_strerror(rc), err.msg);
      sh->failed = 1;
      break;
    }
    snprintf(lsn, sizeof lsn, "%08u", ++e->lsn);
    if ((rc = bs_writer_commit(&cr, e->w, S(lsn), NULL, &err)) != BS_OK || !cr.checkpoint_created ||
        cr.checkpoint != sh->m.head) {
      snprintf(sh->why, sizeof sh->why, "commit: %s (%s), checkpoint %llu, model head %llu",
               bs_strerror(rc), err.msg, (unsigned long long)cr.checkpoint,
               (unsigned long long)sh->m.head);
      sh->failed = 1;
      break;
    }
    if (sh->n_cps < sizeof sh->cps / sizeof sh->cps[0]) sh->cps[sh->n_cps++] = cr.checkpoint;
    if ((k + 1) % CC_EVERY == 0) { /* a pass at a horizon this round's commit made possible */
      pthread_mutex_lock(&sh->mu);
      while (sh->passes < (k + 1) / CC_EVERY && !sh->failed) pthread_cond_wait(&sh->cv, &sh->mu);
      pthread_mutex_unlock(&sh->mu);
    }
  }
  atomic_store(&sh->writer_done, 1);
  return NULL;
}

static void cc_fail(cc_shared *sh) {
  pthread_mutex_lock(&sh->mu);
  sh->failed = 1;
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
}

/* Full and incremental passes in a loop on its own storage handle, at the checkpoint it read
 * just before (the horizon is then known exactly). */
static void *cc_compactor(void *arg) {
  cc_shared *sh = arg;
  bs_storage *st = NULL;
  bs_error err;
  int rc;
  unsigned k = 0;
  rc = bs_storage_open(&st, sh->e->db, bs_storage_stream_id(sh->e->st), &err);
  if (rc != BS_OK) goto fail;
  /* the horizon lags: the checkpoint seen LAG passes ago, so the checks after the run cover
   * several checkpoints above the last horizon */
  enum { LAG = 4 };
  uint64_t seen_cps[LAG] = {0};
  while (!sh->failed && !atomic_load(&sh->writer_done)) {
    bs_checkpoint cp;
    bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats stats;
    uint64_t h;
    if ((rc = bs_get_checkpoint(&cp, st, &err)) != BS_OK) goto fail;
    h = seen_cps[k % LAG];
    seen_cps[k % LAG] = cp.op_id;
    if (!h) h = cp.op_id / 2;
    if (h) {
      o.max_op_id = h;
      o.min_bucket_changes = 1;
      o.min_change_ratio = 0;
      o.min_age_ms = 0;
      o.incremental_only = k % 3 == 1;
      o.max_ops_per_txn = 2 + k % 13;
      if (k % 5 == 4) o.memory_limit_mb = 1;
      if ((rc = bs_compact(&stats, st, &o, &err)) != BS_OK) goto fail;
      if (h > sh->max_horizon) sh->max_horizon = h;
      pthread_mutex_lock(&sh->mu);
      sh->passes++;
      pthread_cond_broadcast(&sh->cv);
      pthread_mutex_unlock(&sh->mu);
    }
    k++;
  }
  bs_storage_close(st);
  return NULL;
fail:
  snprintf(sh->why, sizeof sh->why, "compactor: %s (%s)", bs_strerror(rc), err.msg);
  cc_fail(sh);
  if (st) bs_storage_close(st);
  return NULL;
}

static void test_concurrent(void **state) {
  static cc_shared sh;
  pthread_t tw, tc;
  env e;
  (void)state;
  memset(&sh, 0, sizeof sh);
  env_open(&e);
  md_init(&sh.m, BS_HASH_XXH3);
  sh.e = &e;
  sh.seed = g_seed;
  pthread_mutex_init(&sh.mu, NULL);
  pthread_cond_init(&sh.cv, NULL);
  assert_int_equal(pthread_create(&tw, NULL, cc_writer, &sh), 0);
  assert_int_equal(pthread_create(&tc, NULL, cc_compactor, &sh), 0);
  pthread_join(tw, NULL);
  pthread_join(tc, NULL);
  pthread_mutex_destroy(&sh.mu);
  pthread_cond_destroy(&sh.cv);
  if (sh.failed) fail_msg("%s seed=%llu", sh.why, g_seed);
  assert_true(sh.passes >= sh.n_cps / CC_EVERY); /* arranged by the writer's waits */
  assert_true(sh.passes > 0);
  if (getenv("BS_VERBOSE"))
    fprintf(stderr, "concurrent: %u passes, horizon %llu, %zu checkpoints, head %llu\n", sh.passes,
            (unsigned long long)sh.max_horizon, sh.n_cps, (unsigned long long)sh.m.head);
  /* property 1 at every checkpoint at or above the horizon */
  for (size_t i = 0; i < sh.n_cps; i++) {
    if (sh.cps[i] < sh.max_horizon) continue;
    for (unsigned b = 0; b < CC_NB; b++) {
      char name[8];
      bs_checksum got, want;
      snprintf(name, sizeof name, "c%u", b);
      md_checksum(&sh.m, name, sh.cps[i], &want);
      CHECK(checksum_at(&e, name, sh.cps[i], &got));
      if (got.checksum != want.checksum || got.count > want.count)
        fail_msg("bucket %s at %llu: %u/%llu, history %u/%llu seed=%llu", name,
                 (unsigned long long)sh.cps[i], got.checksum, (unsigned long long)got.count,
                 want.checksum, (unsigned long long)want.count, g_seed);
    }
  }
  /* property 2 at the last checkpoint */
  for (unsigned b = 0; b < CC_NB && sh.n_cps; b++) {
    char name[8], why[256];
    uint64_t c = sh.cps[sh.n_cps - 1];
    md_bucket *mb;
    ct_oplist l;
    md_reduced r1, r2;
    size_t n = 0;
    snprintf(name, sizeof name, "c%u", b);
    memset(&l, 0, sizeof l);
    CHECK(ct_read_bucket(e.st, c, name, 0, &l));
    md_reduce_init(&r1);
    md_reduce_init(&r2);
    if ((mb = md_find_bucket(&sh.m, name)) != NULL)
      while (n < mb->n && mb->ops[n].op_id <= c) n++;
    if (mb) md_reduce_ops(&r1, mb->ops, n);
    md_reduce_ops(&r2, l.v, l.n);
    if (!md_reduced_eq(&r1, &r2, why, sizeof why))
      fail_msg("bucket %s: reduce(history) != reduce(read): %s seed=%llu", name, why, g_seed);
    md_reduce_free(&r1);
    md_reduce_free(&r2);
    ct_oplist_free(&l);
  }
  verify_db(&e);
  md_free(&sh.m);
  env_close(&e);
}

/* ---- Defragmentation (defragment_ratio) ---------------------------------------------------- */

/* The same stream on the memory backend (e->dir empty: nothing to remove). */
static void env_open_mem(env *e) {
  uint32_t id;
  memset(e, 0, sizeof *e);
  CHECK(bs_open_memory(&e->db, NULL, ERR));
  CHECK(bs_stream_create(&id, e->db, "s1", NULL, ERR));
  CHECK(bs_storage_open(&e->st, e->db, id, ERR));
  CHECK(bs_writer_open(&e->w, e->st, NULL, ERR));
}

static void env_close_any(env *e) {
  if (e->dir[0]) {
    env_close(e);
    return;
  }
  bs_writer_close(e->w);
  bs_storage_close(e->st);
  bs_close(e->db);
}

static int changes_has_b(const bs_checkpoint_changes *ch, void *payload) {
  int *found = payload;
  for (size_t i = 0; i < ch->n_updated_buckets; i++)
    if (ch->updated_buckets[i].size == 1 && *(const char *)ch->updated_buckets[i].data == 'b')
      *found = 1;
  if (ch->invalidate_data_buckets) *found = 1;
  return 0;
}

static void compact_with(env *e, int incremental, double ratio, bs_compact_stats *stats) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0;
  o.incremental_only = incremental;
  o.min_age_ms = 0;
  o.defragment_ratio = ratio;
  CHECK(bs_compact(stats, e->st, &o, ERR));
}

static void assert_same_ops(const oplist *a, const oplist *b, const char *what) {
  int ok = a->n == b->n;
  for (size_t i = 0; ok && i < a->n; i++)
    ok = a->v[i].op_id == b->v[i].op_id && a->v[i].type == b->v[i].type &&
         a->v[i].checksum == b->v[i].checksum && a->v[i].target == b->v[i].target &&
         strcmp(a->v[i].row, b->v[i].row) == 0 && strcmp(a->v[i].data, b->v[i].data) == 0;
  if (!ok) fail_msg("%s: the backends disagree (%zu vs %zu ops)", what, a->n, b->n);
}

/* One PUT at the start pins a long history of another row: MOVE/CLEAR cannot fold it, the
 * defragmentation re-emits both live rows, and the next compaction folds the rest. Runs on
 * LMDB and on the memory backend, which must agree op for op. */
static void defrag_scenario(env *e, int incremental, oplist *final_ops) {
  oplist l, tail, full;
  bs_compact_stats st;
  bs_checksum at1, at1b, at2, before2;
  reduced r_old = {0, NULL, 0, 0, 0}, r_new = {0, NULL, 0, 0, 0}, r_fold = {0, NULL, 0, 0, 0};
  uint64_t c1, c2, c3, last;
  char data[32];
  put(e, "b", "t1", "{\"x\":1}"); /* 1 */
  for (int i = 0; i < 20; i++) {
    snprintf(data, sizeof data, "{\"v\":%d}", i);
    put(e, "b", "t2", data); /* 2..21 */
  }
  put(e, "other", "t9", "{}"); /* 22: another bucket, compact */
  c1 = commit(e);
  assert_int_equal(c1, 22);
  CHECK(checksum_at(e, "b", c1, &at1));
  /* a first pass without defragmentation: MOVEs, no fold (a PUT leads) */
  compact_with(e, 0, 0, &st);
  assert_int_equal(st.ops_reemitted, 0);
  CHECK(read_ops(e, "b", 0, c1, &l));
  assert_int_equal(l.n, 21);
  assert_int_equal(l.v[0].type, BS_OP_PUT);
  ol_free(&l);
  /* t2 changes above the horizon before the defragmentation: it is not re-emitted */
  put(e, "b", "t2", "{\"v\":99}"); /* 23 */
  flush(e);
  compact_with(e, 0, 0.5, &st);
  assert_int_equal(st.ops_reemitted, 1); /* t1 only: t2's latest op is above the horizon */
  CHECK(bs_writer_flush(&last, e->w, ERR));
  assert_int_equal(last, 24); /* the re-emitted op took the next id */
  /* invisible until the next checkpoint: the checksum at c1 is as before */
  CHECK(checksum_at(e, "b", c1, &at1b));
  assert_int_equal(at1b.checksum, at1.checksum);
  CHECK(read_ops(e, "b", c1, 24, &tail));
  assert_int_equal(tail.n, 2);
  assert_int_equal(tail.v[1].op_id, 24);
  assert_int_equal(tail.v[1].type, BS_OP_PUT);
  assert_string_equal(tail.v[1].data, "{\"x\":1}");
  CHECK(read_ops(e, "b", 0, 1, &l)); /* the old PUT: same row, payload and checksum */
  assert_string_equal(l.v[0].row, tail.v[1].row);
  assert_int_equal(l.v[0].checksum, tail.v[1].checksum);
  ol_free(&l);
  c2 = commit(e);
  assert_int_equal(c2, 24);
  {
    int found = 0;
    CHECK(bs_get_checkpoint_changes(e->st, c1, c2, changes_has_b, &found, ERR));
    assert_true(found);
  }
  /* checksum at c2 = the history: c1's plus the two new ops (the re-emitted one included) */
  CHECK(checksum_at(e, "b", c2, &at2));
  assert_int_equal(at2.checksum,
                   (uint32_t)(at1.checksum + tail.v[0].checksum + tail.v[1].checksum));
  /* a client at c1 that downloads (c1, c2] ends where a new client does */
  CHECK(read_ops(e, "b", 0, c1, &l));
  reduce_list(&r_old, &l, c1);
  for (size_t i = 0; i < tail.n; i++) reduce_apply(&r_old, &tail.v[i]);
  CHECK(read_ops(e, "b", 0, c2, &full));
  reduce_list(&r_new, &full, c2);
  assert_reduced_equal(&r_old, &r_new, "client at c1 + (c1, c2] vs a new client");
  assert_int_equal(r_new.n, 2);
  ol_free(&l);
  ol_free(&full);
  ol_free(&tail);
  /* the next compaction at c2 folds everything below the live PUTs */
  CHECK(checksum_at(e, "b", c2, &before2));
  compact_with(e, incremental, 0, &st);
  CHECK(checksum_at(e, "b", c2, &at2));
  assert_int_equal(at2.checksum, before2.checksum);
  assert_int_equal(at2.count, 3); /* CLEAR, PUT t2 (23), PUT t1 (24) */
  CHECK(read_ops(e, "b", 0, c2, &full));
  assert_int_equal(full.n, 3);
  assert_int_equal(full.v[0].type, BS_OP_CLEAR);
  assert_int_equal(full.v[0].op_id, 21); /* the last replaced op (22 is in "other") */
  reduce_list(&r_fold, &full, c2);
  assert_reduced_equal(&r_new, &r_fold, "after the fold");
  reduce_free(&r_fold);
  ol_free(&full);
  /* the source record follows the new op: the next change of t1 supersedes op 24 */
  put(e, "b", "t1", "{\"x\":2}"); /* 25 */
  c3 = commit(e);
  compact_with(e, incremental, 0, &st);
  CHECK(read_ops(e, "b", 0, c3, final_ops));
  /* CLEAR (.. 21), PUT t2 (23), MOVE (24 -> 25), PUT t1 (25): an incremental pass finds 24
   * only through the `superseded` entry the writer logged from the record's membership */
  assert_int_equal(final_ops->n, 4);
  assert_int_equal(final_ops->v[0].type, BS_OP_CLEAR);
  assert_int_equal(final_ops->v[1].op_id, 23);
  assert_int_equal(final_ops->v[2].op_id, 24);
  assert_int_equal(final_ops->v[2].type, BS_OP_MOVE);
  assert_int_equal(final_ops->v[2].target, 25);
  assert_int_equal(final_ops->v[3].op_id, 25);
  reduce_free(&r_old);
  reduce_free(&r_new);
  verify_db(e);
}

static void test_defragment(void **state) {
  env e, m;
  oplist a, b;
  (void)state;
  for (int incremental = 0; incremental < 2; incremental++) {
    env_open(&e);
    defrag_scenario(&e, incremental, &a);
    env_close(&e);
    env_open_mem(&m); /* its incremental pass too: the log from the record's membership */
    defrag_scenario(&m, incremental, &b);
    assert_same_ops(&a, &b, "defragmentation");
    ol_free(&b);
    env_close_any(&m);
    ol_free(&a);
  }
}

/* A bucket whose live rows are not a small enough fraction is left alone; so is a bucket not
 * selected. */
static void test_defragment_threshold(void **state) {
  env e;
  bs_compact_stats st;
  (void)state;
  env_open(&e);
  put(&e, "b", "t1", "{}");
  for (int i = 0; i < 4; i++) put(&e, "b", "t2", i % 2 ? "{\"a\":1}" : "{\"a\":2}");
  commit(&e);
  compact_with(&e, 0, 0.2, &st); /* 2 live of 5 ops, then 5 ops after MOVE: 0.4 >= 0.2 */
  assert_int_equal(st.ops_reemitted, 0);
  compact_with(&e, 0, 0.5, &st); /* not selected: nothing changed since the last pass */
  assert_int_equal(st.ops_reemitted, 0);
  {
    const char *bn[] = {"b"};
    bs_compact_options o = bucket_opts(bn, 1);
    o.defragment_ratio = 0.5;
    CHECK(bs_compact(&st, e.st, &o, ERR));
    assert_int_equal(st.ops_reemitted, 2);
  }
  verify_db(&e);
  env_close(&e);
}

/* An incremental job that spans transactions while the writer logs a superseded op older than the
 * job's position (row a's first op, after b's many): the job still ends, and the bucket reads as
 * its history. The writer writes from the progress report, between two transactions. */
typedef struct between {
  env *e;
  int reports, writes;
} between;

static int write_between(const bs_compact_stats *s, void *payload) {
  between *b = payload;
  (void)s;
  if (++b->reports > 1000) return 1; /* a job that never ends: cancelled, the test fails */
  if (b->writes < 3) {
    char data[32];
    snprintf(data, sizeof data, "{\"w\":%d}", b->writes++);
    put(b->e, "b", "a", data);
    commit(b->e);
  }
  return 0;
}

static void test_incremental_between(void **state) {
  env e;
  bs_compact_stats st;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  between b = {&e, 0, 0};
  (void)state;
  env_open(&e);
  put(&e, "b", "a", "{}");
  for (int i = 0; i < 40; i++) put(&e, "b", "b", i % 2 ? "{\"b\":1}" : "{\"b\":2}");
  commit(&e);
  o.incremental_only = 1;
  o.min_age_ms = 0;
  o.max_ops_per_txn = 2;
  o.progress = write_between;
  o.progress_payload = &b;
  CHECK(bs_compact(&st, e.st, &o, ERR));
  assert_true(b.writes > 0);
  assert_int_equal(st.ops_moved, 39);
  verify_db(&e);
  env_close(&e);
}

/* Defragmentation writes in transactions of at most max_ops_per_txn rows, with a progress report
 * after each (contract.md 6), on every backend. */
typedef struct reemit_probe {
  int reports;             /* those that saw more rows re-emitted */
  uint64_t last, max_step; /* re-emitted at the last report; the most between two */
} reemit_probe;

static void probe_step(reemit_probe *p, uint64_t now) {
  p->reports += now != p->last;
  if (now - p->last > p->max_step) p->max_step = now - p->last;
  p->last = now;
}

static int probe_reemit(const bs_compact_stats *s, void *payload) {
  probe_step(payload, s->ops_reemitted);
  return 0;
}

static int probe_moved(const bs_compact_stats *s, void *payload) {
  probe_step(payload, s->ops_moved);
  return 0;
}

/* So does a bucket's job: 39 superseded ops (a fold counts those it takes as moved, and as
 * cleared) at 4 ops a transaction. */
static void test_bucket_txns(void **state) {
  env e;
  bs_compact_stats st;
  reemit_probe p = {0, 0, 0};
  const char *bn[] = {"b"};
  bs_compact_options o = bucket_opts(bn, 1);
  (void)state;
  env_open(&e);
  for (int i = 0; i < 41; i++)
    put(&e, "b", i == 20 ? "keep" : "hot", i % 2 ? "{\"a\":1}" : "{\"a\":2}");
  commit(&e);
  o.max_ops_per_txn = 4;
  o.progress = probe_moved;
  o.progress_payload = &p;
  CHECK(bs_compact(&st, e.st, &o, ERR));
  /* the 20 before keep fold into a CLEAR, the 19 after it but the last become MOVEs */
  assert_int_equal(st.ops_moved, 39);
  assert_int_equal(p.last, 39);
  assert_true(p.max_step <= 4);
  assert_true(p.reports >= 10);
  verify_db(&e);
  env_close(&e);
}

static void test_defragment_txns(void **state) {
  env e;
  bs_compact_stats st;
  reemit_probe p = {0, 0, 0};
  const char *bn[] = {"b"};
  bs_compact_options o = bucket_opts(bn, 1);
  char id[16];
  (void)state;
  env_open(&e);
  for (int i = 0; i < 10; i++) {
    snprintf(id, sizeof id, "r%d", i);
    put(&e, "b", id, "{}");
  }
  for (int i = 0; i < 30; i++) put(&e, "b", "hot", i % 2 ? "{\"a\":1}" : "{\"a\":2}");
  commit(&e);
  /* after the MOVEs: 10 PUTs, 29 MOVEs, the hot row's PUT; 11 live of 40 */
  o.defragment_ratio = 0.5;
  o.max_ops_per_txn = 3;
  o.progress = probe_reemit;
  o.progress_payload = &p;
  CHECK(bs_compact(&st, e.st, &o, ERR));
  assert_int_equal(st.ops_reemitted, 11);
  assert_true(p.max_step <= 3);
  assert_true(p.reports >= 4);
  verify_db(&e);
  env_close(&e);
}

/* Defragmentation while a writer changes the same rows (its own storage handle): a row changed
 * between the plan and the re-emission must not come back with old data. At the end, a client
 * reading the whole bucket holds exactly the writer's last state of every row. */
#define DC_ROWS  16
#define DC_EVERY 6 /* rounds of the writer per compaction pass it waits for (arranged) */
typedef struct dc_shared {
  env *e;
  char last[DC_ROWS][32]; /* "" = deleted / never written */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned passes; /* under mu */
  atomic_int done, failed;
  char why[512];
  uint64_t reemitted;
} dc_shared;

static void *dc_writer(void *arg) {
  dc_shared *sh = arg;
  unsigned long long r = ct_seed(g_seed, 4).s;
  unsigned rounds = g_quick ? 60 : 300;
  bs_error err;
  int rc = BS_OK;
  for (unsigned k = 0; k < rounds && rc == BS_OK; k++) {
    bs_commit_result cr;
    char lsn[32];
    for (unsigned i = 0; i < 1 + k % 7 && rc == BS_OK; i++) {
      char id[16];
      unsigned x;
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      x = (unsigned)(r >> 33);
      /* a few rows change rarely (they are the ones defragmentation re-emits) */
      x = x % 4 ? x % 4 : x % DC_ROWS;
      snprintf(id, sizeof id, "r%u", x);
      if (k % 13 == 5 && i == 0) {
        bs_save s = BS_SAVE_INIT;
        s.table = S("t");
        s.tag = BS_DELETE;
        s.before_id = S(id);
        rc = bs_writer_save(sh->e->w, &s, &err);
        sh->last[x][0] = 0;
      } else {
        const char *b = "d";
        char data[32];
        snprintf(data, sizeof data, "{\"k\":%u}", k);
        save_row(sh->e, id, &b, 1, data);
        strcpy(sh->last[x], data);
      }
    }
    if (rc == BS_OK && k == 0) rc = bs_writer_snapshot_done(sh->e->w, S("00000000"), &err);
    snprintf(lsn, sizeof lsn, "%08u", ++sh->e->lsn);
    if (rc == BS_OK) rc = bs_writer_commit(&cr, sh->e->w, S(lsn), NULL, &err);
    if (rc == BS_OK && (k + 1) % DC_EVERY == 0) {
      pthread_mutex_lock(&sh->mu);
      while (sh->passes < (k + 1) / DC_EVERY && !atomic_load(&sh->failed))
        pthread_cond_wait(&sh->cv, &sh->mu);
      pthread_mutex_unlock(&sh->mu);
    }
  }
  if (rc != BS_OK) {
    snprintf(sh->why, sizeof sh->why, "writer: %s (%s)", bs_strerror(rc), err.msg);
    atomic_store(&sh->failed, 1);
  }
  atomic_store(&sh->done, 1);
  return NULL;
}

static void *dc_compactor(void *arg) {
  dc_shared *sh = arg;
  bs_storage *st = NULL;
  bs_error err;
  int rc = bs_storage_open(&st, sh->e->db, bs_storage_stream_id(sh->e->st), &err);
  for (unsigned k = 0; rc == BS_OK && !atomic_load(&sh->done) && !atomic_load(&sh->failed); k++) {
    bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats stats;
    o.min_bucket_changes = 1;
    o.min_change_ratio = 0;
    o.defragment_ratio = 0.9;
    o.max_ops_per_txn = 2 + k % 5;
    o.incremental_only = k % 2;
    o.min_age_ms = 0;
    rc = bs_compact(&stats, st, &o, &err);
    sh->reemitted += stats.ops_reemitted;
    pthread_mutex_lock(&sh->mu);
    sh->passes++;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
  }
  if (rc != BS_OK) {
    snprintf(sh->why, sizeof sh->why, "compactor: %s (%s)", bs_strerror(rc), err.msg);
    pthread_mutex_lock(&sh->mu);
    atomic_store(&sh->failed, 1);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
  }
  if (st) bs_storage_close(st);
  return NULL;
}

static void test_defragment_concurrent(void **state) {
  env e;
  dc_shared sh;
  pthread_t tw, tc;
  oplist l;
  reduced r = {0, NULL, 0, 0, 0};
  size_t live = 0;
  uint64_t c;
  (void)state;
  env_open(&e);
  memset(&sh, 0, sizeof sh);
  sh.e = &e;
  pthread_mutex_init(&sh.mu, NULL);
  pthread_cond_init(&sh.cv, NULL);
  assert_int_equal(pthread_create(&tw, NULL, dc_writer, &sh), 0);
  assert_int_equal(pthread_create(&tc, NULL, dc_compactor, &sh), 0);
  pthread_join(tw, NULL);
  pthread_join(tc, NULL);
  pthread_mutex_destroy(&sh.mu);
  pthread_cond_destroy(&sh.cv);
  if (atomic_load(&sh.failed)) fail_msg("%s seed=%llu", sh.why, g_seed);
  assert_true(sh.passes >= (g_quick ? 60u : 300u) / DC_EVERY); /* arranged by the writer */
  c = commit(&e); /* the re-emitted ops of the last passes become visible */
  CHECK(read_ops(&e, "d", 0, c, &l));
  for (size_t i = 1; i < l.n; i++) assert_true(l.v[i].op_id > l.v[i - 1].op_id);
  reduce_list(&r, &l, c);
  for (unsigned x = 0; x < DC_ROWS; x++) {
    rslot *sl;
    char row[128], sk[BS_SUBKEY_SIZE + 1], id[16];
    snprintf(id, sizeof id, "r%u", x);
    bs_subkey(sk, 1, S(id));
    sk[BS_SUBKEY_SIZE] = 0;
    snprintf(row, sizeof row, "t/%s/%s", id, sk); /* save_row's type */
    sl = r_find(&r, row, 0);
    if (!sh.last[x][0]) {
      if (sl) fail_msg("row %s: deleted, but a client holds %s seed=%llu", id, sl->op.data, g_seed);
      continue;
    }
    live++;
    if (!sl || strcmp(sl->op.data, sh.last[x]) != 0)
      fail_msg("row %s: written last %s, a client holds %s seed=%llu", id, sh.last[x],
               sl ? sl->op.data : "nothing", g_seed);
  }
  assert_int_equal(r.n, live);
  reduce_free(&r);
  ol_free(&l);
  verify_db(&e);
  fprintf(stderr, "test_defragment_concurrent: %llu ops re-emitted\n",
          (unsigned long long)sh.reemitted);
  env_close(&e);
}

/* ---- A MOVE or CLEAR written over the op it replaces ----------------------------------------- */

/* One save of replica rid: a PUT of (type, id, data) in bucket "b" (UPDATE), or a DELETE. */
static void save_edge(env *e, bs_tag tag, const char *rid, const char *type, const char *id,
                      const char *data) {
  bs_row row = {S("b"), S(type), S(id), S(data)};
  bs_save s = BS_SAVE_INIT;
  s.table = S("t");
  s.tag = tag;
  if (tag == BS_DELETE) {
    s.before_id = S(rid);
  } else {
    s.after_id = S(rid);
    s.rows = &row;
    s.n_rows = 1;
  }
  CHECK(bs_writer_save(e->w, &s, ERR));
}

/* Sets the op head (the last id allocated) to head: ids go on from head + 1. With the writer
 * closed and opened again around it, so that no writer holds the head it read. */
static void set_head(env *e, uint64_t head) {
  bs_error err_ = {0, ""};
  const char *path = e->ce.be ? e->ce.path : e->path;
  bs_writer_close(e->w);
  e->w = NULL;
  if (ct_set_op_head(g_be, e->db, path, bs_storage_stream_id(e->st), head, &err_) != BS_OK)
    fail_msg("ct_set_op_head(%llu) on %s: %s", (unsigned long long)head, g_be->name, err_.msg);
  CHECK(bs_writer_open(&e->w, e->st, NULL, ERR));
}

static void expect_mop(const oplist *l, size_t i, uint64_t id, bs_op_type type, uint64_t target,
                       uint32_t checksum, unsigned long long h) {
  if (i >= l->n || l->v[i].op_id != id || l->v[i].type != type || l->v[i].target != target ||
      l->v[i].checksum != checksum)
    fail_msg("head %llu: op #%zu is %llu type %d target %llu checksum %u, expected %llu type %d "
             "target %llu checksum %u (%zu ops)",
             h, i, i < l->n ? (unsigned long long)l->v[i].op_id : 0ULL,
             i < l->n ? (int)l->v[i].type : -1,
             i < l->n ? (unsigned long long)l->v[i].target : 0ULL, i < l->n ? l->v[i].checksum : 0u,
             (unsigned long long)id, (int)type, (unsigned long long)target, checksum, l->n);
}

/* Compaction writes a MOVE or CLEAR over the op it replaces (contract.md 6: same id). LMDB's op
 * values (format 6, opchunk.c) hold a MOVE or CLEAR as a 5-byte header and its target op as a
 * varint (1 byte below 2^7, 9 from 2^56). So a MOVE (at most 14 bytes) is never longer than the
 * op it replaces: the shortest PUT or REMOVE ("" type, id and data) still holds the 41-byte
 * subkey. A CLEAR is written over the last op of the leading run, which may be a MOVE of an
 * earlier pass; its target is the largest of the run, so it is longer than that MOVE when the
 * largest target takes more varint bytes than the MOVE's own: lmdb_ops.c bs__lmdb_opc_bare then
 * moves the value past the chunk's copy. This test makes both happen, growing by one byte at
 * every varint length boundary (the stream's op ids start just below it, util_head.h), by 1 to
 * 8 bytes (the op head jumps from 3 to just below 2^7 .. 2^56 before the op that makes the
 * CLEAR's target), and not at all at the largest ids. Its rows are edge rows (replica "" with ""
 * type, id and data; the longest replica id; the longest object id of the short form, a
 * non-ASCII type; data "1" and "1.0"), all small, so that the op after the rewritten one shares
 * its chunk (an op of a 65535-byte id has a chunk of its own): a CLEAR written in place past its
 * room would overwrite it. Ops: a1 (row A), a2 (row R), a3 (R again: a2 becomes a MOVE with target
 * a3), then B (A again: a1 becomes a MOVE with target B, and [a1, a2] a CLEAR with target B over
 * the MOVE of target a3), then R deleted and inserted again (B+1, B+2: a3 and the REMOVE, the
 * shortest kind of op, become MOVEs with target B+2, and [CLEAR, MOVE a3] one CLEAR). The ops,
 * their checksums and targets, the bucket's checksum and count, and the verifier must all say
 * the same at each step. Runs on every backend: the others rewrite nothing in place, but owe the
 * same answers. */
static void bare_case(uint64_t h, uint64_t jump) {
  static char rid[BS_MAX_REPLICA_ID + 1];
  const char *id15 = "iiiiiiiiiiiiiii"; /* the longest id of the short form (opchunk.c) */
  uint64_t a1 = h + 1, a2 = h + 2, a3 = h + 3, B = (jump ? jump : a3) + 1, sum;
  unsigned long long hh = (unsigned long long)h;
  uint32_t cs[6];
  oplist l;
  bs_checksum got;
  bs_compact_stats stats;
  env e;
  memset(rid, 'r', BS_MAX_REPLICA_ID);
  env_open(&e);
  if (h) set_head(&e, h);
  save_edge(&e, BS_INSERT, "", "", "", "");               /* a1: A, the shortest op */
  save_edge(&e, BS_INSERT, rid, "\xc3\xa9", id15, "1");   /* a2: R */
  save_edge(&e, BS_UPDATE, rid, "\xc3\xa9", id15, "1.0"); /* a3: R again */
  assert_int_equal(commit(&e), a3);
  CHECK(read_ops(&e, "b", 0, a3, &l));
  for (size_t i = 0; i < 3; i++) cs[i] = l.v[i].checksum;
  ol_free(&l);
  compact_with(&e, 0, 0, &stats);
  CHECK(read_ops(&e, "b", 0, a3, &l));
  assert_int_equal(l.n, 3); /* PUT A leads: nothing to fold */
  expect_mop(&l, 0, a1, BS_OP_PUT, 0, cs[0], hh);
  expect_mop(&l, 1, a2, BS_OP_MOVE, a3, cs[1], hh);
  expect_mop(&l, 2, a3, BS_OP_PUT, 0, cs[2], hh);
  ol_free(&l);
  if (jump) set_head(&e, jump);
  save_edge(&e, BS_UPDATE, "", "", "", "1"); /* B: A again */
  assert_int_equal(commit(&e), B);
  CHECK(read_ops(&e, "b", a3, B, &l));
  cs[3] = l.v[0].checksum;
  ol_free(&l);
  compact_with(&e, 0, 0, &stats);
  CHECK(read_ops(&e, "b", 0, B, &l));
  assert_int_equal(l.n, 3);
  expect_mop(&l, 0, a2, BS_OP_CLEAR, B, cs[0] + cs[1], hh); /* over the MOVE (-> a3) */
  expect_mop(&l, 1, a3, BS_OP_PUT, 0, cs[2], hh);
  expect_mop(&l, 2, B, BS_OP_PUT, 0, cs[3], hh);
  assert_int_equal(l.max_target, B);
  assert_string_equal(l.v[1].data, "1.0");
  assert_string_equal(l.v[2].data, "1");
  ol_free(&l);
  CHECK(checksum_at(&e, "b", B, &got));
  sum = (uint64_t)cs[0] + cs[1] + cs[2] + cs[3];
  assert_int_equal(got.checksum, (uint32_t)sum);
  assert_int_equal(got.count, 3);
  verify_db(&e);
  save_edge(&e, BS_DELETE, rid, NULL, NULL, NULL);
  save_edge(&e, BS_INSERT, rid, "\xc3\xa9", id15, "");
  assert_int_equal(commit(&e), B + 2);
  CHECK(read_ops(&e, "b", B, B + 2, &l));
  cs[4] = l.v[0].checksum;
  cs[5] = l.v[1].checksum;
  ol_free(&l);
  compact_with(&e, 0, 0, &stats);
  CHECK(read_ops(&e, "b", 0, B + 2, &l));
  assert_int_equal(l.n, 4);
  expect_mop(&l, 0, a3, BS_OP_CLEAR, B + 2, cs[0] + cs[1] + cs[2], hh);
  expect_mop(&l, 1, B, BS_OP_PUT, 0, cs[3], hh);
  expect_mop(&l, 2, B + 1, BS_OP_MOVE, B + 2, cs[4], hh);
  expect_mop(&l, 3, B + 2, BS_OP_PUT, 0, cs[5], hh);
  assert_string_equal(l.v[1].data, "1");
  assert_string_equal(l.v[3].data, "");
  ol_free(&l);
  CHECK(checksum_at(&e, "b", B + 2, &got));
  assert_int_equal(got.checksum, (uint32_t)(sum + cs[4] + cs[5]));
  assert_int_equal(got.count, 4);
  verify_db(&e);
  env_close(&e);
}

static void test_bare_over_op(void **state) {
  (void)state;
  for (int k = 1; k <= 8; k++) {
    uint64_t bound = (uint64_t)1 << (7 * k);
    bare_case(bound - 4, 0); /* a3 = bound - 1, B = bound: one byte more */
    bare_case(0, bound - 1); /* a3 = 3, B = bound: k bytes more */
  }
  bare_case(((uint64_t)1 << 63) - 8, 0); /* the largest ids: every target 9 bytes */
}

int main(void) {
  const char *q = getenv("BS_TEST_QUICK");
  const ct_backend *be[CT_MAX_BACKENDS];
  size_t n = ct_backends_selected(be);
  int failed = 0;
  /* every backend: compaction's rules and its storage calls */
  const struct CMUnitTest shared[] = {
      cmocka_unit_test(test_spec_move),
      cmocka_unit_test(test_spec_clear),
      cmocka_unit_test(test_default_horizon),
      cmocka_unit_test(test_bucket_due),
      cmocka_unit_test(test_initial_replication),
      cmocka_unit_test(test_incremental),
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_bounded_memory),
      cmocka_unit_test(test_parameters),
      cmocka_unit_test(test_parameters_fenced),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_defragment_threshold),
      cmocka_unit_test(test_defragment_txns),
      cmocka_unit_test(test_bucket_txns),
      cmocka_unit_test(test_incremental_between),
      cmocka_unit_test(test_defragment_concurrent),
      cmocka_unit_test(test_bare_over_op),
  };
  /* LMDB: all of them, and those of its own storage (its chunks, its map); test_defragment
   * compares LMDB with the memory backend op for op */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spec_move),
      cmocka_unit_test(test_spec_clear),
      cmocka_unit_test(test_default_horizon),
      cmocka_unit_test(test_bucket_due),
      cmocka_unit_test(test_initial_replication),
      cmocka_unit_test(test_incremental),
      cmocka_unit_test(test_merge_chunks),
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_bounded_memory),
      cmocka_unit_test(test_parameters),
      cmocka_unit_test(test_parameters_fenced),
      cmocka_unit_test(test_concurrent),
      cmocka_unit_test(test_map_growth),
      cmocka_unit_test(test_map_growth_jobs),
      cmocka_unit_test(test_defragment),
      cmocka_unit_test(test_defragment_threshold),
      cmocka_unit_test(test_defragment_txns),
      cmocka_unit_test(test_bucket_txns),
      cmocka_unit_test(test_incremental_between),
      cmocka_unit_test(test_defragment_concurrent),
      cmocka_unit_test(test_bare_over_op),
  };
  g_quick = q && *q && strcmp(q, "0") != 0;
  for (size_t i = 0; i < n; i++) {
    char name[64];
    g_be = be[i];
    if (ct_lacks(g_be, CT_LACKS_COMPACT)) {
      fprintf(stderr, "compact: %s has no compaction, skipped\n", g_be->name);
      continue;
    }
    g_seed = ct_first_seed("compact", g_be);
    ct_seed_log("compact", g_be->name, g_seed);
    fprintf(stderr,
            "compact on %s: seed %llu (reproduce: BS_SEED=%llu BS_BACKEND=%s "
            "build/tests/test_compact)\n",
            g_be->name, g_seed, g_seed, g_be->name);
    snprintf(name, sizeof name, "compact on %s", g_be->name);
    if (g_be == &ct_backends[CT_LMDB])
      failed |= cmocka_run_group_tests_name(name, tests, NULL, NULL);
    else
      failed |= cmocka_run_group_tests_name(name, shared, NULL, NULL);
  }
  return failed;
}
