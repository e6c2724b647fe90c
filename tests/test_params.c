/*
 * test_params.c: parameter lookups on the LMDB backend (contract.md 4.1 step 3, 5.4), through the
 * public API: reads at older checkpoints, moves between lookups, tombstones, number
 * normalisation of lookup keys, truncate, the result limit, persistence; plus a forged hash
 * collision in the index (through internal.h) to prove rows are grouped by full replica id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util_contract.h"
#include "lmdb_internal.h"

/* Each test: an LMDB file with stream "s1", snapshot done, writer open (util_contract.c). */
static unsigned lsn_counter; /* the last LSN committed by commit() */

static int setup(void **state) {
  lsn_counter = 0;
  *state = ct_env_new(&ct_backends[CT_LMDB]);
  return *state ? 0 : -1;
}

/* ---- helpers ---- */

/* An encoded lookup key: ("by_user", s) */
typedef struct key {
  unsigned char b[BS_MAX_LOOKUP_KEY];
  size_t n;
} key;

static key key_of(const bs_scalar *v, size_t n) {
  key k;
  CT_OK(bs_lookup_encode(k.b, sizeof k.b, &k.n, v, n, &ct_err));
  return k;
}
static key skey(const char *s) {
  bs_scalar v[2] = {{BS_SCALAR_STRING, 0, 0, {"by_user", 7}}, {BS_SCALAR_STRING, 0, 0, {0, 0}}};
  v[1].s = bs__val_str(s);
  return key_of(v, 2);
}
static key ikey(int64_t i) {
  bs_scalar v = {BS_SCALAR_INT, i, 0, {0, 0}};
  return key_of(&v, 1);
}
static key dkey(double d) {
  bs_scalar v = {BS_SCALAR_DOUBLE, 0, d, {0, 0}};
  return key_of(&v, 1);
}
static bs_val kval(const key *k) {
  bs_val v = {k->b, k->n};
  return v;
}

/* Saves row id of table with up to 4 lookups, each with one params row. */
static void save(ct_env *f, const char *table, bs_tag tag, const char *id, const key *keys,
                 const char **params, size_t n) {
  bs_save s = BS_SAVE_INIT;
  bs_lookup l[4];
  bs_val p[4];
  assert_true(n <= 4);
  for (size_t i = 0; i < n; i++) {
    p[i] = bs__val_str(params[i]);
    l[i].key = kval(&keys[i]);
    l[i].params = &p[i];
    l[i].n_params = 1;
  }
  s.table = bs__val_str(table);
  s.tag = tag;
  s.after_id = bs__val_str(id);
  s.before_id = bs__val_str(id);
  s.lookups = l;
  s.n_lookups = n;
  CT_OK(bs_writer_save(f->w, &s, &ct_err));
}

static uint64_t commit(ct_env *f) {
  char lsn[16];
  bs_commit_result r;
  snprintf(lsn, sizeof lsn, "%08u", ++lsn_counter);
  CT_OK(bs_writer_commit(&r, f->w, bs__val_str(lsn), NULL, &ct_err));
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* The result rows of a call, sorted and joined by '|', for order-free comparison. */
typedef struct rows {
  char *v[64];
  size_t n;
  char joined[2048];
} rows;

static int on_row(const bs_val *p, void *payload) {
  rows *r = payload;
  if (r->n == 64) return -100;
  r->v[r->n++] = ct_strndup(p->data, p->size);
  return 0;
}
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ps_rc(ct_env *f, uint64_t c, const key *keys, size_t n, size_t limit, rows *r,
                 bs_error *err) {
  bs_val l[8];
  int rc;
  memset(r, 0, sizeof *r);
  for (size_t i = 0; i < n; i++) l[i] = kval(&keys[i]);
  rc = bs_get_parameter_sets(f->st, c, l, n, limit, on_row, r, err);
  qsort(r->v, r->n, sizeof r->v[0], cmp_str);
  for (size_t i = 0; i < r->n; i++) {
    if (i) strcat(r->joined, "|");
    strcat(r->joined, r->v[i]);
    free(r->v[i]);
  }
  return rc;
}
/* "|"-joined sorted rows of lookup k at checkpoint c */
static const char *ps(ct_env *f, uint64_t c, key k) {
  static rows r;
  bs_error e = {0, ""};
  int rc = ps_rc(f, c, &k, 1, BS_PARAM_LIMIT_DEFAULT, &r, &e);
  if (rc) fail_msg("parameter sets at %llu: %d %s", (unsigned long long)c, rc, e.msg);
  return r.joined;
}

/* ---- tests ---- */

static void test_older_checkpoint(void **state) {
  ct_env *f = *state;
  key k = skey("u1");
  const char *a1[] = {"{\"g\":1}"}, *a2[] = {"{\"g\":2}"};
  uint64_t c1, c2;
  assert_string_equal(ps(f, 0, k), "");
  save(f, "t", BS_INSERT, "r1", &k, a1, 1);
  c1 = commit(f);
  save(f, "t", BS_UPDATE, "r1", &k, a2, 1);
  c2 = commit(f);
  assert_true(c2 > c1);
  assert_string_equal(ps(f, c1, k), "{\"g\":1}");
  assert_string_equal(ps(f, c2, k), "{\"g\":2}");
  assert_string_equal(ps(f, c2 + 1, k), "{\"g\":2}"); /* any C, not only checkpoints */
  assert_string_equal(ps(f, c1 - 1, k), "");
  /* an unchanged re-save still appends (and serves the same rows) */
  save(f, "t", BS_UPDATE, "r1", &k, a2, 1);
  assert_true(commit(f) > c2);
  assert_string_equal(ps(f, c2 + 1, k), "{\"g\":2}");
}

static void test_move_between_lookups(void **state) {
  ct_env *f = *state;
  key a = skey("A"), b = skey("B");
  const char *p1[] = {"{\"r\":1}"}, *p2[] = {"{\"r\":2}"}, *p1b[] = {"{\"r\":\"1b\"}"};
  uint64_t c1, c2;
  save(f, "t", BS_INSERT, "r1", &a, p1, 1);
  save(f, "t", BS_INSERT, "r2", &a, p2, 1);
  c1 = commit(f);
  save(f, "t", BS_UPDATE, "r1", &b, p1b, 1); /* r1 now produces only B: A is tombstoned */
  c2 = commit(f);
  assert_string_equal(ps(f, c1, a), "{\"r\":1}|{\"r\":2}");
  assert_string_equal(ps(f, c1, b), "");
  assert_string_equal(ps(f, c2, a), "{\"r\":2}"); /* r2 untouched */
  assert_string_equal(ps(f, c2, b), "{\"r\":\"1b\"}");
  /* a row with no lookups at all: everything tombstoned; a delete of r2 too */
  save(f, "t", BS_UPDATE, "r1", NULL, NULL, 0);
  save(f, "t", BS_DELETE, "r2", NULL, NULL, 0);
  c2 = commit(f);
  assert_string_equal(ps(f, c2, a), "");
  assert_string_equal(ps(f, c2, b), "");
  /* several lookups in one call are concatenated; a repeated key is served once */
  save(f, "t", BS_INSERT, "r3", &a, p1, 1);
  save(f, "t", BS_INSERT, "r4", &b, p2, 1);
  c2 = commit(f);
  {
    key ks[3] = {a, b, a};
    rows r;
    CT_OK(ps_rc(f, c2, ks, 3, BS_PARAM_LIMIT_DEFAULT, &r, &ct_err));
    assert_string_equal(r.joined, "{\"r\":1}|{\"r\":2}");
  }
}

static void test_number_normalisation(void **state) {
  ct_env *f = *state;
  const char *p[] = {"{\"n\":314}"}, *q[] = {"{\"n\":\"d\"}"}, *big[] = {"{\"n\":\"2^60\"}"};
  key i314 = ikey(314), d314 = dkey(314.0), e314 = dkey(3.14e2);
  key d7 = dkey(7.0), i7 = ikey(7);
  key two60 = ikey(INT64_C(1) << 60);
  uint64_t c;
  assert_memory_equal(i314.b, d314.b, i314.n);
  save(f, "t", BS_INSERT, "ri", &i314, p, 1); /* written as an integer */
  save(f, "t", BS_INSERT, "rd", &d7, q, 1);   /* written as a double */
  save(f, "t", BS_INSERT, "rb", &two60, big, 1);
  c = commit(f);
  assert_string_equal(ps(f, c, d314), "{\"n\":314}");
  assert_string_equal(ps(f, c, e314), "{\"n\":314}");
  assert_string_equal(ps(f, c, i314), "{\"n\":314}");
  assert_string_equal(ps(f, c, i7), "{\"n\":\"d\"}");
  assert_string_equal(ps(f, c, dkey(3.14)), "");
  assert_string_equal(ps(f, c, ikey(3)), "");
  assert_string_equal(ps(f, c, dkey(3.0)), "");
  /* 2^60 stays exact: 2^60 + 1 is a different key, 2^60 as a double is the same */
  assert_string_equal(ps(f, c, two60), "{\"n\":\"2^60\"}");
  assert_string_equal(ps(f, c, ikey((INT64_C(1) << 60) + 1)), "");
  assert_string_equal(ps(f, c, dkey(1152921504606846976.0)), "{\"n\":\"2^60\"}");
  /* the string "314" is not the number 314 */
  {
    bs_scalar v = {BS_SCALAR_STRING, 0, 0, {"314", 3}};
    assert_string_equal(ps(f, c, key_of(&v, 1)), "");
  }
}

static void test_truncate(void **state) {
  ct_env *f = *state;
  key k = skey("t");
  const char *p1[] = {"{\"x\":1}"}, *p2[] = {"{\"x\":2}"}, *p3[] = {"{\"x\":3}"};
  uint64_t c1, c2;
  save(f, "t1", BS_INSERT, "r1", &k, p1, 1);
  save(f, "t1", BS_INSERT, "r2", &k, p2, 1);
  save(f, "t2", BS_INSERT, "r1", &k, p3, 1); /* same replica id, other table: a distinct row */
  c1 = commit(f);
  assert_string_equal(ps(f, c1, k), "{\"x\":1}|{\"x\":2}|{\"x\":3}");
  CT_OK(bs_writer_truncate(f->w, bs__val_str("t1"), &ct_err));
  c2 = commit(f);
  assert_string_equal(ps(f, c1, k), "{\"x\":1}|{\"x\":2}|{\"x\":3}");
  assert_string_equal(ps(f, c2, k), "{\"x\":3}");
}

static void test_limit(void **state) {
  ct_env *f = *state;
  key k = skey("many"), other = skey("other");
  const char *p[] = {"{\"i\":0}"};
  char ids[8][16];
  rows r;
  bs_error err = {0, ""};
  uint64_t c;
  for (int i = 0; i < 5; i++) {
    snprintf(ids[i], sizeof ids[i], "r%d", i);
    save(f, "t", BS_INSERT, ids[i], &k, p, 1);
  }
  save(f, "t", BS_INSERT, "o", &other, p, 1);
  c = commit(f);
  assert_int_equal(ps_rc(f, c, &k, 1, 4, &r, &err), BS_ELIMIT);
  assert_string_equal(err.msg, "too many parameter results (limit was 4)");
  assert_int_equal(r.n, 0); /* nothing was handed out */
  CT_OK(ps_rc(f, c, &k, 1, 5, &r, &ct_err));
  assert_int_equal(r.n, 5);
  /* 0 is a limit: any matching row is over it; none matching is fine */
  assert_int_equal(ps_rc(f, c, &k, 1, 0, &r, &err), BS_ELIMIT);
  assert_string_equal(err.msg, "too many parameter results (limit was 0)");
  {
    key none = skey("none");
    CT_OK(ps_rc(f, c, &none, 1, 0, &r, &ct_err));
    assert_int_equal(r.n, 0);
  }
  /* the limit is over the whole call, not per lookup */
  {
    key ks[2] = {k, other};
    assert_int_equal(ps_rc(f, c, ks, 2, 5, &r, &err), BS_ELIMIT);
    CT_OK(ps_rc(f, c, ks, 2, 6, &r, &ct_err));
    assert_int_equal(r.n, 6);
  }
}

static void test_persistence(void **state) {
  ct_env *f = *state;
  key k = skey("p");
  const char *p1[] = {"{\"v\":1}"}, *p2[] = {"{\"v\":2}"};
  uint64_t c1, c2;
  save(f, "t", BS_INSERT, "r1", &k, p1, 1);
  c1 = commit(f);
  save(f, "t", BS_UPDATE, "r1", &k, p2, 1);
  c2 = commit(f);
  save(f, "t", BS_DELETE, "r1", NULL, NULL, 0); /* never committed: gone at reopen */
  CT_OK(ct_env_reopen(f));
  assert_string_equal(ps(f, c1, k), "{\"v\":1}");
  assert_string_equal(ps(f, c2 + 5, k), "{\"v\":2}");
  /* the writer after reopen sees the persisted lookups: an update drops them */
  save(f, "t", BS_UPDATE, "r1", NULL, NULL, 0);
  assert_string_equal(ps(f, commit(f), k), "");
}

/* Counts the calls that allocate of a handle's allocator. */
static size_t g_allocs;
static void *cnt_malloc(void *o, size_t n) {
  (void)o;
  g_allocs++;
  return malloc(n);
}
static void *cnt_realloc(void *o, void *p, size_t n) {
  (void)o;
  g_allocs++;
  return realloc(p, n);
}
static void cnt_free(void *o, void *p) {
  (void)o;
  free(p);
}

/* The allocations of one lookup of k at c, through a handle with the counting allocator; its
 * rows must be n. */
static size_t lookup_allocs(bs_storage *st, uint64_t c, key k, size_t n) {
  bs_val kv = kval(&k);
  rows r;
  memset(&r, 0, sizeof r);
  g_allocs = 0;
  CT_OK(bs_get_parameter_sets(st, c, &kv, 1, BS_PARAM_LIMIT_DEFAULT, on_row, &r, &ct_err));
  assert_int_equal(r.n, n);
  for (size_t i = 0; i < r.n; i++) free(r.v[i]);
  return g_allocs;
}

/* A lookup's rows cost no allocation while they are few (lmdb_params.c SCAN_ROWS: 16): 10 rows
 * take as many as 1. Past that the arrays move to the heap and every row still comes out. */
static void test_lookup_allocations(void **state) {
  ct_env *f = *state;
  key one = skey("one"), ten = skey("ten"), many = skey("many");
  const char *p[] = {"{\"i\":0}"};
  bs_allocator cnt = {cnt_malloc, cnt_realloc, cnt_free, NULL};
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db;
  bs_storage *st;
  uint64_t c;
  size_t base;
  char id[16];
  save(f, "t", BS_INSERT, "one", &one, p, 1);
  for (int i = 0; i < 10; i++) {
    snprintf(id, sizeof id, "ten%d", i);
    save(f, "t", BS_INSERT, id, &ten, p, 1);
  }
  for (int i = 0; i < 40; i++) {
    snprintf(id, sizeof id, "many%d", i);
    save(f, "t", BS_INSERT, id, &many, p, 1);
  }
  c = commit(f);
  o.flags = BS_OPEN_NOSYNC; /* as ct_env opened the file: one environment a file */
  o.allocator = &cnt;
  CT_OK(bs_open(&db, f->path, &o, &ct_err));
  CT_OK(bs_storage_open(&st, db, f->stream, &ct_err));
  base = lookup_allocs(st, c, one, 1);
  assert_int_equal(lookup_allocs(st, c, ten, 10), base);
  assert_true(lookup_allocs(st, c, many, 40) > base);
  bs_storage_close(st);
  bs_close(db);
}

/* Forges two replica ids with the same hash in the index: their entries interleave in one
 * group, and each row keeps its own latest entry (r1's tombstone must not hide r2). */
static void test_hash_collision(void **state) {
  ct_env *f = *state;
  bs__lmdb_db *db = ((bs__lmdb_storage *)f->st)->db;
  key k = skey("col");
  bs_val v1 = bs__val_str("{\"c\":1}"), v2 = bs__val_str("{\"c\":2}");
  struct {
    const char *rid;
    const bs_val *row;
    size_t n;
    uint64_t op;
  } e[] = {{"r1", &v1, 1, 1}, {"r2", &v2, 1, 2}, {"r1", NULL, 0, 3}};
  MDB_txn *txn;
  CT_OK(bs__lmdb_txn_begin(db, 0, &txn, &ct_err));
  for (size_t i = 0; i < 3; i++) {
    unsigned char kb[BS_PARAM_KEY_MAX], vb[64];
    bs_val rid = bs__val_str(e[i].rid);
    size_t kn = bs__lmdb_param_key(kb, f->stream, kval(&k), 1, rid, e[i].op);
    MDB_val mk = {kn, kb}, mv = {bs__lmdb_param_value_size(rid, e[i].row, e[i].n), vb};
    memset(kb + kn - 16, 0xab, 8); /* same hash for both replica ids */
    bs__lmdb_param_value(vb, rid, e[i].row, e[i].n);
    assert_int_equal(mdb_put(txn, db->params, &mk, &mv, 0), 0);
  }
  CT_OK(bs__lmdb_txn_commit(db, txn, &ct_err));
  assert_string_equal(ps(f, 1, k), "{\"c\":1}");
  assert_string_equal(ps(f, 2, k), "{\"c\":1}|{\"c\":2}");
  assert_string_equal(ps(f, 3, k), "{\"c\":2}");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_older_checkpoint, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_move_between_lookups, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_number_normalisation, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_truncate, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_limit, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_persistence, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_hash_collision, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_lookup_allocations, setup, ct_env_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
