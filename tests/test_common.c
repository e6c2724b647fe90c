/* test_common: the common layer (common.c). The one hash table (bs__htab): lookups through
 * colliding hashes and probe runs that wrap around the end of the table, the backward-shift
 * removal, a randomized run against a plain-array model (the run's seed, ct_run_seed; BS_SEED replays it), growth
 * that fails cleanly under a failing allocator, the compaction seen-set built on it (rows compared
 * in full, the memory bound), the set of borrowed strings (bs__vset); the one growth rule of arrays (BS_GROW); and the
 * constructors' allocator rule (bs__db_base_set, by bs__allocator_resolve): three NULL functions
 * mean the default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "util_contract.h"
#include "util_fault.h"

/* How many times value v is stored under hash h. */
static size_t count(const bs__htab *t, uint64_t h, uintptr_t v) {
  bs__hprobe p = bs__htab_probe(t, h);
  size_t n = 0;
  for (uintptr_t x; (x = bs__htab_next(&p));) n += x == v;
  return n;
}

static void test_empty(void **state) {
  bs__htab t = {0};
  bs__hprobe p = bs__htab_probe(&t, 42);
  (void)state;
  assert_int_equal(bs__htab_next(&p), 0);
  bs__htab_remove(&t, 42, 1); /* absent: nothing happens */
  bs__htab_replace(&t, 42, 1, 2);
  bs__htab_clear(&t);
  assert_int_equal(t.n, 0);
  bs__htab_free(&t, &bs__default_allocator);
}

/* Every value under one hash: a probe returns each once, and only values of that hash. */
static void test_collisions(void **state) {
  const bs_allocator *a = &bs__default_allocator;
  bs__htab t = {0};
  (void)state;
  for (uintptr_t v = 1; v <= 100; v++) assert_int_equal(bs__htab_add(&t, a, 7, v), BS_OK);
  /* same low bits as 7, another hash: never returned for 7 */
  assert_int_equal(bs__htab_add(&t, a, 7 + ((uint64_t)1 << 40), 1000), BS_OK);
  assert_int_equal(t.n, 101);
  assert_true(t.n * 2 <= t.cap);
  for (uintptr_t v = 1; v <= 100; v++) assert_int_equal(count(&t, 7, v), 1);
  assert_int_equal(count(&t, 7, 1000), 0);
  assert_int_equal(count(&t, 7 + ((uint64_t)1 << 40), 1000), 1);
  /* removal from the middle of the run keeps everything after it reachable */
  for (uintptr_t v = 2; v <= 100; v += 2) bs__htab_remove(&t, 7, v);
  for (uintptr_t v = 1; v <= 100; v++) assert_int_equal(count(&t, 7, v), v % 2);
  assert_int_equal(count(&t, 7 + ((uint64_t)1 << 40), 1000), 1);
  bs__htab_replace(&t, 7, 3, 3000);
  assert_int_equal(count(&t, 7, 3), 0);
  assert_int_equal(count(&t, 7, 3000), 1);
  bs__htab_free(&t, a);
}

/* Runs that wrap: homes at the last entries of the table, removals of each position. */
static void test_wraparound(void **state) {
  const bs_allocator *a = &bs__default_allocator;
  (void)state;
  for (size_t gone = 0; gone < 6; gone++) {
    bs__htab t = {0};
    uint64_t h[6];
    assert_int_equal(bs__htab_reserve(&t, a, 6), BS_OK);
    assert_int_equal(t.cap, 16);
    /* homes 15, 15, 14, 0, 15, 1: the run wraps from 14 over 15 into 0.. */
    h[0] = 15, h[1] = 31, h[2] = 14, h[3] = 0, h[4] = 47, h[5] = 1;
    for (size_t i = 0; i < 6; i++) bs__htab_put(&t, h[i], i + 1);
    assert_int_equal(t.cap, 16); /* room was reserved: put never grows */
    bs__htab_remove(&t, h[gone], gone + 1);
    assert_int_equal(t.n, 5);
    for (size_t i = 0; i < 6; i++) assert_int_equal(count(&t, h[i], i + 1), i != gone);
    bs__htab_free(&t, a);
  }
}

static uint64_t g_seed; /* the run's (ct_run_seed "common") */

/* Random adds/removes/replaces over few hashes (long runs) against an array model. */
static void test_random_model(void **state) {
  const bs_allocator *a = &bs__default_allocator;
  enum { N = 4000 };
  uint64_t seed = g_seed, x = ct_seed(seed, 1).s | 1; /* xorshift: never 0 */
  static uint64_t mh[N];
  static uintptr_t mv[N];
  size_t n = 0;
  uintptr_t next = 1;
  bs__htab t = {0};
  (void)state;
  for (int step = 0; step < 20000; step++) {
    unsigned r;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    r = (unsigned)(x % 100);
    if (r < 55 && n < N) {
      mh[n] = (x >> 8) % 13 * 0x9e3779b97f4a7c15ull; /* 13 hashes */
      mv[n] = next++;
      if (bs__htab_add(&t, a, mh[n], mv[n]) != BS_OK)
        fail_msg("seed %llu", (unsigned long long)seed);
      n++;
    } else if (r < 90 && n) {
      size_t k = (size_t)(x >> 16) % n;
      bs__htab_remove(&t, mh[k], mv[k]);
      mh[k] = mh[n - 1], mv[k] = mv[--n];
    } else if (n) {
      size_t k = (size_t)(x >> 16) % n;
      bs__htab_replace(&t, mh[k], mv[k], next);
      mv[k] = next++;
    }
    if (t.n != n)
      fail_msg("seed %llu step %d: n %zu, model %zu", (unsigned long long)seed, step, t.n, n);
    if (step % 97 == 0)
      for (size_t k = 0; k < n; k++)
        if (count(&t, mh[k], mv[k]) != 1)
          fail_msg("seed %llu step %d: value %zu not found once", (unsigned long long)seed, step,
                   (size_t)mv[k]);
  }
  bs__htab_clear(&t);
  assert_int_equal(t.n, 0);
  assert_true(t.cap > 0); /* clear keeps the memory */
  assert_int_equal(count(&t, mh[0], mv[0]), 0);
  bs__htab_free(&t, a);
}

/* Growth is the only failure, and it leaves the table as it was. */
static void test_grow_fails_cleanly(void **state) {
  ft_alloc f;
  bs__htab t = {0};
  size_t cap;
  (void)state;
  ft_alloc_init(&f);
  for (uintptr_t v = 1; v <= 8; v++) assert_int_equal(bs__htab_add(&t, &f.a, v, v), BS_OK);
  cap = t.cap;
  ft_alloc_arm(&f, 1, 1);
  assert_int_equal(bs__htab_add(&t, &f.a, 9, 9), BS_ENOMEM);
  assert_int_equal(bs__htab_reserve(&t, &f.a, 1000), BS_ENOMEM);
  assert_int_equal(t.cap, cap);
  assert_int_equal(t.n, 8);
  for (uintptr_t v = 1; v <= 8; v++) assert_int_equal(count(&t, v, v), 1);
  assert_int_equal(bs__htab_reserve(&t, &f.a, cap / 2), BS_OK); /* room already: no allocation */
  ft_alloc_arm(&f, 0, 0);
  assert_int_equal(bs__htab_add(&t, &f.a, 9, 9), BS_OK);
  assert_true(t.cap > cap);
  bs__htab_free(&t, &f.a);
  assert_int_equal(f.live, 0);
}

/* The set of borrowed strings (bs__vset): each string once, in the order first added, equal
 * bytes at other addresses and an absent and a present empty string being one; under the k-th
 * allocation failing, for every k, an add either succeeds or leaves the set as it was. */
static void test_vset(void **state) {
  static const char *const words[] = {"b", "", "\xc3\xa9t\xc3\xa9", "a", "b", "1", "1.0", "a"};
  char big[300], copy[] = "\xc3\xa9t\xc3\xa9";
  bs_val in[64];
  size_t n = 0, want = 0;
  (void)state;
  memset(big, 'x', sizeof big);
  for (size_t i = 0; i < 8; i++) in[n++] = bs__val_str(words[i]);
  in[n++] = (bs_val){NULL, 0};
  in[n++] = (bs_val){copy, sizeof copy - 1};
  for (size_t i = 0; n < 64; i++) in[n++] = (bs_val){big, i % 27}; /* prefixes, repeated */
  for (unsigned long k = 1;; k++) {
    ft_alloc f;
    bs__vset vs = {0};
    int failed = 0;
    ft_alloc_init(&f);
    ft_alloc_arm(&f, k, 0);
    want = 0;
    for (size_t i = 0; i < n; i++) {
      size_t before = vs.n;
      int seen = 0;
      for (size_t j = 0; j < i && !seen; j++) seen = bs__val_eq(in[j], in[i]);
      if (bs__vset_add(&vs, &f.a, in[i]) != BS_OK) {
        failed = 1;
        assert_int_equal(vs.n, before);                          /* nothing added */
        assert_int_equal(bs__vset_add(&vs, &f.a, in[i]), BS_OK); /* a transient failure */
      }
      if (!seen) assert_true(bs__val_eq(vs.v[want++], in[i]));
      assert_int_equal(vs.n, want);
    }
    bs__vset_free(&vs, &f.a);
    assert_int_equal(f.live, 0);
    if (!failed) break; /* the run no longer reaches k */
  }
  assert_int_equal(want, 6 + 26); /* b, "", été, a, 1, 1.0 and the 26 non-empty prefixes */
}

/* The one growth rule: room for need, doubling from 8; a failure or an overflow changes nothing. */
static void test_grow(void **state) {
  ft_alloc f;
  uint64_t *v = NULL;
  size_t cap = 0;
  (void)state;
  ft_alloc_init(&f);
  assert_int_equal(bs__grow(&f.a, (void **)&v, &cap, 0, sizeof *v), BS_OK); /* no allocation */
  assert_null(v);
  assert_int_equal(BS_GROW(&f.a, v, cap, 1), BS_OK);
  assert_int_equal(cap, 8);
  v[7] = 7;
  assert_int_equal(BS_GROW(&f.a, v, cap, 8), BS_OK);
  assert_int_equal(cap, 8);
  assert_int_equal(BS_GROW(&f.a, v, cap, 9), BS_OK);
  assert_int_equal(cap, 16);
  assert_int_equal(BS_GROW(&f.a, v, cap, 100), BS_OK);
  assert_int_equal(cap, 128);
  assert_int_equal(v[7], 7);                                        /* the contents move along */
  assert_int_equal(BS_GROW(&f.a, v, cap, SIZE_MAX / 4), BS_ENOMEM); /* would overflow */
  ft_alloc_arm(&f, 1, 0);
  assert_int_equal(BS_GROW(&f.a, v, cap, 129), BS_ENOMEM);
  assert_int_equal(cap, 128);
  assert_int_equal(v[7], 7);
  f.a.free_fn(f.a.opaque, v);
  assert_int_equal(f.live, 0);
}

static bs_op row_op(const char *type, const char *id, const char *subkey, uint64_t op_id) {
  bs_op o;
  memset(&o, 0, sizeof o);
  o.op_id = op_id;
  o.type = BS_OP_PUT;
  o.object_type = bs__val_str(type);
  o.object_id = bs__val_str(id);
  o.subkey = bs__val_str(subkey);
  return o;
}

/* The compaction seen-set over the table: a row is its three fields compared in full (bytes
 * cannot move between fields), the first visit's op id is kept, and the memory bound holds. */
static void test_seen_set(void **state) {
  const bs_allocator *a = &bs__default_allocator;
  bs__seen_set s;
  bs_op o;
  uint64_t latest = 0;
  char id[16];
  (void)state;
  bs__seen_init(&s, a, SIZE_MAX);
  o = row_op("ab", "", "", 9);
  assert_int_equal(bs__seen_visit(&s, &o, &latest), 0);
  o = row_op("a", "b", "", 8);
  assert_int_equal(bs__seen_visit(&s, &o, &latest), 0); /* not the row ("ab", "") */
  o = row_op("", "", "ab", 7);
  assert_int_equal(bs__seen_visit(&s, &o, &latest), 0);
  o = row_op("ab", "", "", 5);
  assert_int_equal(bs__seen_visit(&s, &o, &latest), 1);
  assert_int_equal(latest, 9);
  o = row_op("a", "b", "", 1);
  assert_int_equal(bs__seen_find(&s, &o, &latest), 1);
  assert_int_equal(latest, 8);
  o = row_op("", "", "", 1);
  assert_int_equal(bs__seen_find(&s, &o, &latest), 0);
  o = row_op("t\xc3\xa9", "\xff", "", 4); /* non-ASCII */
  assert_int_equal(bs__seen_visit(&s, &o, &latest), 0);
  assert_int_equal(bs__seen_find(&s, &o, &latest), 1);
  assert_int_equal(latest, 4);
  for (int i = 0; i < 5000; i++) { /* growth keeps every row */
    snprintf(id, sizeof id, "r%d", i);
    o = row_op("t", id, "", 100 + (uint64_t)i);
    assert_int_equal(bs__seen_visit(&s, &o, &latest), 0);
  }
  for (int i = 0; i < 5000; i += 7) {
    snprintf(id, sizeof id, "r%d", i);
    o = row_op("t", id, "", 1);
    assert_int_equal(bs__seen_find(&s, &o, &latest), 1);
    assert_int_equal(latest, 100 + (uint64_t)i);
  }
  bs__seen_clear(&s);
  o = row_op("ab", "", "", 1);
  assert_int_equal(bs__seen_find(&s, &o, &latest), 0);
  bs__seen_free(&s);

  /* a bound of 8 KiB: table and arena stay within it; once full, new rows are not recorded
   * but the recorded ones are still found */
  bs__seen_init(&s, a, 8192);
  int recorded = 0;
  for (int i = 0; i < 2000; i++) {
    snprintf(id, sizeof id, "row-%d", i);
    o = row_op("type", id, "00000001/0123456789abcdef", (uint64_t)i + 1);
    bs__seen_visit(&s, &o, &latest);
    assert_true(s.rows.cap * sizeof(bs__hent) + s.arena_cap <= 8192);
    if (!s.full) recorded = i + 1;
  }
  assert_true(s.full);
  assert_true(recorded > 10 && recorded < 2000);
  for (int i = 0; i < 2000; i++) {
    snprintf(id, sizeof id, "row-%d", i);
    o = row_op("type", id, "00000001/0123456789abcdef", 1);
    assert_int_equal(bs__seen_find(&s, &o, &latest), i < recorded);
  }
  bs__seen_free(&s);
}

/* "Set all three functions or none": none is the default allocator, for every backend. */
static void test_open_allocator_none(void **state) {
  bs_allocator none = {NULL, NULL, NULL, NULL};
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL, base;
  uint32_t id;
  (void)state;
  o.allocator = &none;
  bs__db_base_set(&base, NULL, &o);
  assert_memory_equal(&base.alloc, &bs__default_allocator, sizeof base.alloc);
  bs__db_base_set(&base, NULL, NULL);
  assert_memory_equal(&base.alloc, &bs__default_allocator, sizeof base.alloc);
  assert_int_equal(bs_open_memory(&db, &o, NULL), BS_OK);
  assert_int_equal(bs_stream_create(&id, db, "s", NULL, NULL), BS_OK);
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_collisions),
      cmocka_unit_test(test_wraparound),
      cmocka_unit_test(test_random_model),
      cmocka_unit_test(test_grow_fails_cleanly),
      cmocka_unit_test(test_grow),
      cmocka_unit_test(test_seen_set),
      cmocka_unit_test(test_vset),
      cmocka_unit_test(test_open_allocator_none),
  };
  g_seed = ct_run_seed("common");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
