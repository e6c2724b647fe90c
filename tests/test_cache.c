/* test_cache: the checksum cache (contract.md 5.3) against a fake backend with a counting vtable:
 * misses batched into one call, bases extended by ranges, a CLEAR in the range replacing the
 * base, generation invalidation, LRU eviction at capacity, no caching above the known
 * checkpoint, and seeded random differential runs against the uncached answer (the run's seed:
 * ct_run_seed, BS_SEED replays it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "util_contract.h"

static uint64_t g_seed; /* the run's (ct_run_seed); each test seeds rand() from a stream of it */

/* rand()'s seed for the test of stream k */
static unsigned test_seed(uint64_t k) {
  return (unsigned)ct_seed(g_seed, k).s;
}

#define NB     8 /* buckets b0..b7 */
#define MAXOPS 4096

typedef struct fake_op {
  uint64_t id;
  uint32_t cksum;
  int clear;
} fake_op;

typedef struct fake_bucket {
  fake_op ops[MAXOPS];
  size_t n;
  uint64_t gen;
} fake_bucket;

typedef struct fake {
  bs_storage base;
  bs_db db; /* the front finds the cache through base.db->front */
  struct bs__db_front front;
  fake_bucket b[NB];
  uint64_t head, checkpoint;
  /* counters */
  int n_checksums, n_ranges, n_get_checkpoint;
  size_t buckets_checksums, buckets_ranges;
  uint64_t last_from[16];
  int fail_ranges; /* return this code from checksum_ranges */
} fake;

static int bucket_index(bs_val name) {
  assert_int_equal(name.size, 2);
  assert_int_equal(((const char *)name.data)[0], 'b');
  return ((const char *)name.data)[1] - '0';
}

static bs_checksum value_in(const fake_bucket *b, uint64_t from, uint64_t to) {
  bs_checksum v = {0, 0};
  for (size_t i = 0; i < b->n; i++)
    if (b->ops[i].id > from && b->ops[i].id <= to) {
      v.checksum = bs__cksum_add(v.checksum, b->ops[i].cksum);
      v.count++;
    }
  return v;
}

static int f_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t cp,
                       const bs_val *buckets, size_t n, bs_error *err) {
  fake *f = (fake *)st;
  f->n_checksums++;
  f->buckets_checksums += n;
  for (size_t i = 0; i < n; i++) {
    fake_bucket *b = &f->b[bucket_index(buckets[i])];
    out[i] = value_in(b, 0, cp);
    if (gen) gen[i] = b->gen;
  }
  return BS_OK;
}

static int f_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st, uint64_t from,
                    uint64_t to, const bs_val *buckets, size_t n, bs_error *err) {
  fake *f = (fake *)st;
  if (f->fail_ranges) return bs__fail(err, f->fail_ranges, "fake ranges failure");
  if (f->n_ranges < 16) f->last_from[f->n_ranges] = from;
  f->n_ranges++;
  f->buckets_ranges += n;
  for (size_t i = 0; i < n; i++) {
    fake_bucket *b = &f->b[bucket_index(buckets[i])];
    int has_clear = 0;
    for (size_t k = 0; k < b->n; k++)
      if (b->ops[k].clear && b->ops[k].id > from && b->ops[k].id <= to) has_clear = 1;
    cleared[i] = has_clear;
    out[i] = has_clear ? value_in(b, 0, to) : value_in(b, from, to);
    gen[i] = b->gen;
  }
  return BS_OK;
}

static int f_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  fake *f = (fake *)st;
  f->n_get_checkpoint++;
  memset(out, 0, sizeof *out);
  out->checkpoint = f->checkpoint;
  return BS_OK;
}

static bs_storage_vtable fake_vt;

static void fake_reset_counters(fake *f) {
  f->n_checksums = f->n_ranges = f->n_get_checkpoint = 0;
  f->buckets_checksums = f->buckets_ranges = 0;
}

static fake *fake_new(size_t capacity, int with_ranges) {
  fake *f = calloc(1, sizeof *f);
  bs__cksum_cache *c;
  assert_non_null(f);
  memset(&fake_vt, 0, sizeof fake_vt);
  fake_vt.version = BS_STORAGE_VTABLE_VERSION;
  fake_vt.checksums = f_checksums;
  fake_vt.checksum_ranges = with_ranges ? f_ranges : NULL;
  fake_vt.get_status = f_get_status; /* the checkpoint's one source */
  f->base.vt = &fake_vt;
  f->base.stream_id = 3;
  assert_int_equal(bs__cksum_cache_new(&c, &bs__default_allocator, capacity), BS_OK);
  f->front.cache = c;
  f->db.front = &f->front;
  f->base.db = &f->db;
  return f;
}

static void fake_free(fake *f) {
  bs__cksum_cache_free(f->front.cache);
  free(f);
}

/* appends one op (next id) to bucket i */
static void add_op(fake *f, int i, uint32_t cksum) {
  fake_bucket *b = &f->b[i];
  assert_true(b->n < MAXOPS);
  b->ops[b->n].id = ++f->head;
  b->ops[b->n].cksum = cksum;
  b->ops[b->n].clear = 0;
  b->n++;
}

/* Folds the ops of bucket i with id <= upto into one CLEAR at the last of them (checksum kept,
 * count lowered), as compaction does; bump: whether the generation moves. */
static void fold_clear(fake *f, int i, uint64_t upto, int bump) {
  fake_bucket *b = &f->b[i];
  size_t k = 0, m;
  uint32_t sum = 0;
  uint64_t last = 0;
  while (k < b->n && b->ops[k].id <= upto) {
    sum = bs__cksum_add(sum, b->ops[k].cksum);
    last = b->ops[k].id;
    k++;
  }
  if (k < 2) return;
  b->ops[0].id = last;
  b->ops[0].cksum = sum;
  b->ops[0].clear = 1;
  m = b->n - k;
  memmove(&b->ops[1], &b->ops[k], m * sizeof b->ops[0]);
  b->n = m + 1;
  if (bump) b->gen++;
}

static bs_val names[NB] = {{"b0", 2}, {"b1", 2}, {"b2", 2}, {"b3", 2},
                           {"b4", 2}, {"b5", 2}, {"b6", 2}, {"b7", 2}};

static void get(fake *f, uint64_t cp, const int *idx, size_t n, bs_checksum *out) {
  bs_val req[16];
  bs_error err;
  int rc;
  for (size_t i = 0; i < n; i++) req[i] = names[idx[i]];
  rc = bs_get_checksums(out, &f->base, cp, req, n, &err);
  if (rc) fprintf(stderr, "get_checksums: %s\n", err.msg);
  assert_int_equal(rc, BS_OK);
}

/* the truth: the fake's own uncached answer */
static void expect_truth(fake *f, uint64_t cp, const int *idx, size_t n, const bs_checksum *got) {
  for (size_t i = 0; i < n; i++) {
    bs_checksum t = value_in(&f->b[idx[i]], 0, cp);
    assert_int_equal(got[i].checksum, t.checksum);
    assert_int_equal(got[i].count, t.count);
  }
}

static void fill(fake *f, int ops_per_bucket) {
  for (int k = 0; k < ops_per_bucket; k++)
    for (int i = 0; i < NB; i++) add_op(f, i, (uint32_t)(0x9e3779b9u * (unsigned)(k * NB + i + 1)));
  f->checkpoint = f->head;
}

static void test_misses_batched_then_exact_hits(void **state) {
  fake *f = fake_new(1000, 1);
  int idx[] = {4, 0, 2, 6, 1};
  bs_checksum out[5];
  (void)state;
  fill(f, 3);
  get(f, f->checkpoint, idx, 5, out);
  expect_truth(f, f->checkpoint, idx, 5, out);
  assert_int_equal(f->n_checksums, 1); /* one batch for all misses */
  assert_int_equal(f->buckets_checksums, 5);
  assert_int_equal(f->n_ranges, 0);
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 5, out);
  expect_truth(f, f->checkpoint, idx, 5, out);
  assert_int_equal(f->n_checksums, 0);
  assert_int_equal(f->n_ranges, 1); /* exact hits: validated in one batch, empty range */
  assert_int_equal(f->buckets_ranges, 5);
  assert_true(f->last_from[0] == f->checkpoint);
  assert_int_equal(f->n_get_checkpoint, 0);
  fake_free(f);
}

static void test_range_extension(void **state) {
  fake *f = fake_new(1000, 1);
  int idx[] = {0, 1, 2};
  bs_checksum out[3];
  uint64_t c1;
  (void)state;
  fill(f, 4);
  c1 = f->checkpoint;
  get(f, c1, idx, 3, out);
  for (int k = 0; k < 5; k++) add_op(f, k % 3, 1000u + (unsigned)k);
  add_op(f, 5, 77);
  f->checkpoint = f->head;
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 3, out);
  expect_truth(f, f->checkpoint, idx, 3, out);
  assert_int_equal(f->n_checksums, 0);
  assert_int_equal(f->n_ranges, 1);
  assert_true(f->last_from[0] == c1);
  /* two different bases: one range call per base */
  int idx2[] = {0, 3};
  fake_reset_counters(f);
  get(f, f->checkpoint, idx2 + 1, 1, out); /* b3 cached at the new checkpoint */
  uint64_t c2 = f->checkpoint;
  add_op(f, 0, 5);
  add_op(f, 3, 6);
  f->checkpoint = f->head;
  fake_reset_counters(f);
  get(f, f->checkpoint, idx2, 2, out);
  expect_truth(f, f->checkpoint, idx2, 2, out);
  assert_int_equal(f->n_ranges, 1); /* b0 and b3 both have a base at c2 now */
  assert_true(f->last_from[0] == c2);
  /* an older C than every entry: a plain miss */
  fake_reset_counters(f);
  get(f, 2, idx, 3, out);
  expect_truth(f, 2, idx, 3, out);
  assert_int_equal(f->n_checksums, 1);
  assert_int_equal(f->n_ranges, 0);
  fake_free(f);
}

static void test_clear_replaces_base(void **state) {
  fake *f = fake_new(1000, 1);
  int idx[] = {2};
  bs_checksum out[1], before;
  uint64_t c1;
  (void)state;
  fill(f, 5);
  c1 = f->checkpoint;
  get(f, c1, idx, 1, out);
  before = out[0];
  for (int k = 0; k < 4; k++) add_op(f, 2, 500u + (unsigned)k);
  f->checkpoint = f->head;
  /* a CLEAR inside (c1, C] that folded ops <= c1 too; the generation deliberately not bumped,
   * so only `cleared` tells the cache that the base must not be added */
  fold_clear(f, 2, f->head - 1, 0);
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 1, out);
  expect_truth(f, f->checkpoint, idx, 1, out);
  assert_int_equal(f->n_ranges, 1);
  assert_int_equal(f->n_checksums, 0);
  assert_true(out[0].count == 2); /* CLEAR + the last op */
  assert_true(out[0].count < before.count + 4);
  fake_free(f);
}

static void test_generation_invalidates(void **state) {
  fake *f = fake_new(1000, 1);
  int idx[] = {0, 1, 2};
  bs_checksum out[3];
  bs__cksum_cache_stats s;
  (void)state;
  fill(f, 6);
  get(f, f->checkpoint, idx, 3, out);
  /* compaction below the checkpoint in another process: checksum unchanged, count lower */
  fold_clear(f, 1, f->checkpoint - NB, 1);
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 3, out);
  expect_truth(f, f->checkpoint, idx, 3, out);
  assert_int_equal(f->n_ranges, 1);
  assert_int_equal(f->n_checksums, 1); /* only b1 recomputed */
  assert_int_equal(f->buckets_checksums, 1);
  bs__cksum_cache_get_stats(f->front.cache, &s);
  assert_true(s.stale == 1);
  /* the fresh entry (new generation) is used again */
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 3, out);
  expect_truth(f, f->checkpoint, idx, 3, out);
  assert_int_equal(f->n_checksums, 0);
  fake_free(f);
}

static void test_lru_eviction(void **state) {
  fake *f = fake_new(3, 1);
  bs_checksum out[1];
  bs__cksum_cache_stats s;
  int a[] = {0}, b[] = {1}, c[] = {2}, d[] = {3};
  (void)state;
  fill(f, 2);
  get(f, f->checkpoint, a, 1, out);
  get(f, f->checkpoint, b, 1, out);
  get(f, f->checkpoint, c, 1, out);
  get(f, f->checkpoint, a, 1, out); /* a is now the most recent; b the least */
  get(f, f->checkpoint, d, 1, out); /* evicts b */
  bs__cksum_cache_get_stats(f->front.cache, &s);
  assert_true(s.entries == 3);
  assert_true(s.evictions == 1);
  fake_reset_counters(f);
  get(f, f->checkpoint, a, 1, out);
  get(f, f->checkpoint, c, 1, out);
  get(f, f->checkpoint, d, 1, out);
  assert_int_equal(f->n_checksums, 0);
  assert_int_equal(f->n_ranges, 3);
  get(f, f->checkpoint, b, 1, out);
  assert_int_equal(f->n_checksums, 1);
  expect_truth(f, f->checkpoint, b, 1, out);
  /* several checkpoints of one bucket count against the capacity too */
  for (int k = 0; k < 5; k++) {
    add_op(f, 0, 9);
    f->checkpoint = f->head;
    get(f, f->checkpoint, a, 1, out);
    expect_truth(f, f->checkpoint, a, 1, out);
  }
  bs__cksum_cache_get_stats(f->front.cache, &s);
  assert_true(s.entries == 3);
  fake_free(f);
}

static void test_no_caching_above_checkpoint(void **state) {
  fake *f = fake_new(1000, 1);
  int idx[] = {0};
  bs_checksum out[1];
  uint64_t c;
  (void)state;
  fill(f, 2);
  c = f->checkpoint + 1;
  get(f, c, idx, 1, out); /* above the checkpoint: asks it, does not cache */
  assert_int_equal(f->n_get_checkpoint, 1);
  expect_truth(f, c, idx, 1, out);
  add_op(f, 0, 31337); /* op id c is persisted later: the value at c changes */
  fake_reset_counters(f);
  get(f, c, idx, 1, out);
  expect_truth(f, c, idx, 1, out);
  assert_int_equal(f->n_checksums, 1);
  /* once the checkpoint reaches c, it is cached */
  f->checkpoint = f->head;
  get(f, c, idx, 1, out);
  fake_reset_counters(f);
  get(f, c, idx, 1, out);
  assert_int_equal(f->n_checksums, 0);
  assert_int_equal(f->n_get_checkpoint, 0);
  expect_truth(f, c, idx, 1, out);
  fake_free(f);
}

static void test_without_ranges_and_errors(void **state) {
  fake *f = fake_new(1000, 0);
  int idx[] = {0, 1};
  bs_checksum out[2];
  bs_error err;
  (void)state;
  fill(f, 3);
  get(f, f->checkpoint, idx, 2, out);
  get(f, f->checkpoint, idx, 2, out);
  expect_truth(f, f->checkpoint, idx, 2, out);
  assert_int_equal(f->n_checksums, 2); /* no ranges slot: always recomputed */
  fake_free(f);

  f = fake_new(1000, 1);
  fill(f, 3);
  get(f, f->checkpoint, idx, 2, out);
  f->fail_ranges = BS_EUNSUPPORTED; /* falls back to checksums */
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 2, out);
  expect_truth(f, f->checkpoint, idx, 2, out);
  assert_int_equal(f->n_checksums, 1);
  f->fail_ranges = BS_EINVALIDATED; /* a torn read is returned as is */
  assert_int_equal(bs_get_checksums(out, &f->base, f->checkpoint, names, 2, &err), BS_EINVALIDATED);
  assert_int_equal(err.code, BS_EINVALIDATED);
  /* drop_stream forgets everything of the stream */
  f->fail_ranges = 0;
  bs__cksum_cache_drop_stream(f->front.cache, f->base.stream_id);
  fake_reset_counters(f);
  get(f, f->checkpoint, idx, 2, out);
  assert_int_equal(f->n_checksums, 1);
  assert_int_equal(f->n_get_checkpoint, 1); /* known checkpoint forgotten too */
  fake_free(f);
}

/* Random differential: appends, compactions (folds with and without a generation bump),
 * duplicate buckets in one request, reads at random C up to checkpoint + 2. */
static void test_random_differential(void **state) {
  int iters = getenv("BS_TEST_QUICK") ? 3000 : 30000;
  fake *f = fake_new(40, 1);
  (void)state;
  srand(test_seed(777));
  for (int it = 0; it < iters && f->head < NB * MAXOPS / 2; it++) {
    int r = rand() % 10;
    if (r < 4) {
      add_op(f, rand() % NB, (uint32_t)rand() * 2654435761u);
      if (rand() % 3 == 0) f->checkpoint = f->head;
    } else if (r == 4 && f->checkpoint > 2) {
      /* only fold at or below the checkpoint, like compaction's horizon; bump unless the
       * fold changed nothing a reader could have cached (always bump: the contract's rule) */
      fold_clear(f, rand() % NB, 1 + (uint64_t)rand() % f->checkpoint, 1);
    } else {
      int idx[6];
      bs_checksum out[6];
      size_t n = 1 + (size_t)(rand() % 6);
      uint64_t cp = (uint64_t)rand() % (f->checkpoint + 3);
      for (size_t i = 0; i < n; i++) idx[i] = rand() % NB;
      get(f, cp, idx, n, out);
      for (size_t i = 0; i < n; i++) {
        bs_checksum t = value_in(&f->b[idx[i]], 0, cp);
        if (t.checksum != out[i].checksum || t.count != out[i].count)
          fprintf(stderr, "BS_SEED=%llu iter %d bucket %d cp %llu\n", (unsigned long long)g_seed,
                  it, idx[i], (unsigned long long)cp);
        assert_int_equal(t.checksum, out[i].checksum);
        assert_int_equal(t.count, out[i].count);
      }
    }
  }
  bs__cksum_cache_stats s;
  bs__cksum_cache_get_stats(f->front.cache, &s);
  assert_true(s.hits > 0 && s.misses > 0 && s.entries <= 40);
  fake_free(f);
}

/* The real backends through the front: the cached answer equals the backend's uncached one
 * (st->vt->checksums) on a random workload with updates, deletes, commits and compactions,
 * for C from 0 to checkpoint + 2 (contract.md 9, property 1 "with and without the cache"). */
static void differential_on(bs_db *db, uint64_t stream, int rounds) {
  bs_storage *st;
  bs_writer *w;
  bs_error err;
  uint32_t id;
  bs_commit_result cr = {0, 0, 0, BS_BLOCKED_NONE};
  static const char *bnames[] = {"a", "b", "c", "d"};
  char rid[16], data[32], lsn[24];
  int lsn_n = 0;
  srand(test_seed(stream));
  assert_int_equal(bs_stream_create(&id, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, id, &err), BS_OK);
  assert_non_null(st->db->front->cache);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  snprintf(lsn, sizeof lsn, "%08d", lsn_n++);
  assert_int_equal(bs_writer_snapshot_done(w, bs__val_str(lsn), &err), BS_OK);
  for (int r = 0; r < rounds; r++) {
    int nsaves = 1 + rand() % 4;
    for (int k = 0; k < nsaves; k++) {
      bs_row rows[2];
      bs_save sv = BS_SAVE_INIT;
      int nr = rand() % 3;
      snprintf(rid, sizeof rid, "r%d", rand() % 6);
      snprintf(data, sizeof data, "{\"v\":%d}", rand() % 100);
      for (int j = 0; j < nr && j < 2; j++) {
        rows[j].bucket = bs__val_str(bnames[rand() % 4]);
        rows[j].object_type = bs__val_str("t");
        rows[j].object_id = bs__val_str(rid);
        rows[j].data = bs__val_str(data);
      }
      sv.table = bs__val_str("tbl");
      sv.tag = rand() % 5 == 0 ? BS_DELETE : BS_UPDATE;
      sv.after_id = bs__val_str(rid);
      sv.before_id = bs__val_str(rid);
      sv.rows = rows;
      sv.n_rows = sv.tag == BS_DELETE ? 0 : (size_t)(nr > 2 ? 2 : nr);
      int rc = bs_writer_save(w, &sv, &err);
      if (rc) fprintf(stderr, "save: %s\n", err.msg);
      assert_int_equal(rc, BS_OK);
    }
    snprintf(lsn, sizeof lsn, "%08d", lsn_n++);
    assert_int_equal(bs_writer_commit(&cr, w, bs__val_str(lsn), NULL, &err), BS_OK);
    if (rand() % 6 == 0 && cr.checkpoint) {
      bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
      co.min_bucket_changes = 1;
      co.min_change_ratio = 0;
      co.max_op_id = (uint64_t)(1 + rand() % (int)cr.checkpoint);
      int rc = bs_compact(NULL, st, &co, &err);
      if (rc) fprintf(stderr, "compact: %s\n", err.msg);
      assert_int_equal(rc, BS_OK);
    }
    for (int q = 0; q < 3; q++) {
      bs_val req[4];
      bs_checksum got[4], want[4];
      size_t n = 1 + (size_t)(rand() % 4);
      uint64_t cp = (uint64_t)rand() % (cr.checkpoint + 3);
      int rc1, rc2;
      for (size_t i = 0; i < n; i++) req[i] = bs__val_str(bnames[rand() % 4]);
      rc1 = bs_get_checksums(got, st, cp, req, n, &err);
      rc2 = st->vt->checksums(want, NULL, st, cp, req, n, &err);
      if (rc1 != rc2)
        fprintf(stderr, "BS_SEED=%llu round %d cp %llu: rc %d vs %d\n", (unsigned long long)g_seed,
                r, (unsigned long long)cp, rc1, rc2);
      assert_int_equal(rc1, rc2);
      for (size_t i = 0; rc1 == BS_OK && i < n; i++) {
        if (got[i].checksum != want[i].checksum || got[i].count != want[i].count)
          fprintf(stderr, "BS_SEED=%llu round %d cp %llu bucket %s: %u/%llu vs %u/%llu\n",
                  (unsigned long long)g_seed, r, (unsigned long long)cp, (const char *)req[i].data,
                  got[i].checksum, (unsigned long long)got[i].count, want[i].checksum,
                  (unsigned long long)want[i].count);
        assert_int_equal(got[i].checksum, want[i].checksum);
        assert_true(got[i].count == want[i].count);
      }
    }
  }
  bs__cksum_cache_stats s;
  bs__cksum_cache_get_stats(st->db->front->cache, &s);
  assert_true(s.hits > 0);
  bs_writer_close(w);
  bs_storage_close(st);
}

static void test_memory_backend_differential(void **state) {
  bs_db *db;
  (void)state;
  assert_int_equal(bs_open_memory(&db, NULL, NULL), BS_OK);
  differential_on(db, 99, getenv("BS_TEST_QUICK") ? 60 : 400);
  bs_close(db);
}

static void test_lmdb_backend_differential(void **state) {
  char path[] = "/tmp/bs_test_cache_XXXXXX";
  char file[64], lock[80];
  bs_db *db;
  bs_error err;
  int fd = mkstemp(path);
  (void)state;
  assert_true(fd >= 0);
  close(fd);
  unlink(path);
  snprintf(file, sizeof file, "%s", path);
  int rc = bs_open(&db, file, NULL, &err);
  if (rc) fprintf(stderr, "open: %s\n", err.msg);
  assert_int_equal(rc, BS_OK);
  differential_on(db, 98, getenv("BS_TEST_QUICK") ? 60 : 400);
  bs_close(db);
  unlink(file);
  snprintf(lock, sizeof lock, "%s-lock", file);
  unlink(lock);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_misses_batched_then_exact_hits),
      cmocka_unit_test(test_range_extension),
      cmocka_unit_test(test_clear_replaces_base),
      cmocka_unit_test(test_generation_invalidates),
      cmocka_unit_test(test_lru_eviction),
      cmocka_unit_test(test_no_caching_above_checkpoint),
      cmocka_unit_test(test_without_ranges_and_errors),
      cmocka_unit_test(test_random_differential),
      cmocka_unit_test(test_memory_backend_differential),
      cmocka_unit_test(test_lmdb_backend_differential),
  };
  g_seed = ct_run_seed("cache");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
