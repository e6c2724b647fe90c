/* test_lookup: the canonical lookup-key encoding (contract.md 5.4): normalisation of numbers,
 * round trips both ways, rejection of malformed keys, limits, and injectivity on random lists
 * (seeded: the run's seed, ct_run_seed; BS_SEED replays it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h> /* NAN, INFINITY (macros only: no libm) */
#include <cmocka.h>

#include "lmdb_internal.h" /* internal.h, and the params key of test_param_row_order */
#include "util_edge.h"

static uint64_t g_seed; /* the run's (ct_run_seed) */

static bs_scalar I(int64_t i) {
  bs_scalar s = {BS_SCALAR_INT, i, 0, {NULL, 0}};
  return s;
}
static bs_scalar D(double d) {
  bs_scalar s = {BS_SCALAR_DOUBLE, 0, d, {NULL, 0}};
  return s;
}
static bs_scalar S(const char *str) {
  bs_scalar s = {BS_SCALAR_STRING, 0, 0, {str, strlen(str)}};
  return s;
}
static bs_scalar T(bs_scalar_type t) {
  bs_scalar s = {t, 0, 0, {NULL, 0}};
  return s;
}

typedef struct enc {
  unsigned char b[BS_MAX_LOOKUP_KEY];
  size_t n;
} enc;

static enc encode(const bs_scalar *v, size_t n) {
  enc e;
  bs_error err;
  int rc = bs_lookup_encode(e.b, sizeof e.b, &e.n, v, n, &err);
  if (rc) fprintf(stderr, "encode: %s\n", err.msg);
  assert_int_equal(rc, BS_OK);
  return e;
}

static int enc_eq(enc a, enc b) {
  return a.n == b.n && memcmp(a.b, b.b, a.n) == 0;
}

static void test_integral_numbers_normalise(void **state) {
  (void)state;
  bs_scalar a[] = {I(314)}, b[] = {D(314.0)}, c[] = {D(3.14e2)}, d[] = {D(3.14)}, e[] = {I(3)};
  assert_true(enc_eq(encode(a, 1), encode(b, 1)));
  assert_true(enc_eq(encode(a, 1), encode(c, 1)));
  assert_false(enc_eq(encode(d, 1), encode(e, 1)));
  assert_false(enc_eq(encode(d, 1), encode(a, 1)));
  /* 2^60 stays exact, and 2^60 + 1 is a different key */
  bs_scalar p60[] = {I((int64_t)1 << 60)}, p60d[] = {D(1152921504606846976.0)},
            p60p1[] = {I(((int64_t)1 << 60) + 1)};
  assert_true(enc_eq(encode(p60, 1), encode(p60d, 1)));
  assert_false(enc_eq(encode(p60, 1), encode(p60p1, 1)));
  /* -0.0 == 0 */
  bs_scalar z[] = {I(0)}, nz[] = {D(-0.0)}, pz[] = {D(0.0)};
  assert_true(enc_eq(encode(z, 1), encode(nz, 1)));
  assert_true(enc_eq(encode(z, 1), encode(pz, 1)));
  /* int64 extremes: -2^63 as a double is an INT; 2^63 is not representable, stays DOUBLE */
  bs_scalar mn[] = {I(INT64_MIN)}, mnd[] = {D(-9223372036854775808.0)};
  assert_true(enc_eq(encode(mn, 1), encode(mnd, 1)));
  bs_scalar mx[] = {I(INT64_MAX)}, p63[] = {D(9223372036854775808.0)};
  assert_false(enc_eq(encode(mx, 1), encode(p63, 1)));
  /* a number is never a string, a bool never a number */
  bs_scalar s1[] = {S("1")}, one[] = {I(1)}, tr[] = {T(BS_SCALAR_TRUE)};
  assert_false(enc_eq(encode(s1, 1), encode(one, 1)));
  assert_false(enc_eq(encode(tr, 1), encode(one, 1)));
}

/* The randomized suites' lookup values (util_edge.c): two encode alike exactly when the pool says
 * they are the same key (1 and 1.0, 2^53 and the double 2^53; never 2^53 + 1 and 2^53). */
static void test_edge_pool_keys(void **state) {
  size_t n, i, j;
  const ue_scalar *v = ue_scalars(&n);
  (void)state;
  for (i = 0; i < n; i++)
    for (j = 0; j < i; j++) {
      size_t ci = v[i].same_as < 0 ? i : (size_t)v[i].same_as;
      size_t cj = v[j].same_as < 0 ? j : (size_t)v[j].same_as;
      if (enc_eq(encode(&v[i].v, 1), encode(&v[j].v, 1)) != (ci == cj))
        fail_msg("%s and %s: %s keys", v[i].label, v[j].label, ci == cj ? "different" : "equal");
    }
}

static void test_nan_inf_rejected(void **state) {
  unsigned char buf[64];
  size_t n = 99;
  bs_error err;
  bs_scalar bad[] = {S("x"), D(NAN)};
  (void)state;
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, bad, 2, &err), BS_EINVAL);
  assert_int_equal(err.code, BS_EINVAL);
  assert_non_null(strstr(err.msg, "values[1]"));
  bad[1] = D(INFINITY);
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, bad, 2, &err), BS_EINVAL);
  bad[1] = D(-INFINITY);
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, bad, 2, &err), BS_EINVAL);
  bad[1] = T((bs_scalar_type)42);
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, bad, 2, &err), BS_EINVAL);
  assert_non_null(strstr(err.msg, "values[1].type"));
  bad[1].type = BS_SCALAR_STRING;
  bad[1].s.data = NULL;
  bad[1].s.size = 3;
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, bad, 2, &err), BS_EINVAL);
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, NULL, bad, 1, &err), BS_EINVAL);
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, NULL, 1, &err), BS_EINVAL);
  assert_int_equal(bs_lookup_encode(NULL, 5, &n, bad, 1, &err), BS_EINVAL);
}

static void test_structure_is_injective(void **state) {
  (void)state;
  bs_scalar ab[] = {S("ab")}, a_b[] = {S("a"), S("b")};
  assert_false(enc_eq(encode(ab, 1), encode(a_b, 2)));
  bs_scalar empty_s[] = {S("")}, null1[] = {T(BS_SCALAR_NULL)};
  enc none = encode(NULL, 0);
  assert_int_equal(none.n, 0);
  assert_false(enc_eq(encode(empty_s, 1), encode(null1, 1)));
  assert_false(enc_eq(encode(empty_s, 1), none));
  bs_scalar nul[] = {{BS_SCALAR_STRING, 0, 0, {"a\0", 2}}}, a[] = {S("a")};
  assert_false(enc_eq(encode(nul, 1), encode(a, 1)));
  bs_scalar two_empty[] = {S(""), S("")};
  assert_false(enc_eq(encode(two_empty, 2), encode(empty_s, 1)));
}

static void test_size_limits(void **state) {
  char big[480];
  unsigned char buf[600];
  size_t n = 0;
  bs_error err;
  (void)state;
  memset(big, 'k', sizeof big);
  bs_scalar v[] = {{BS_SCALAR_STRING, 0, 0, {big, 477}}};
  /* tag + 2-byte length + 477 = 480: exactly the limit */
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, v, 1, &err), BS_OK);
  assert_int_equal(n, 480);
  v[0].s.size = 478;
  assert_int_equal(bs_lookup_encode(buf, sizeof buf, &n, v, 1, &err), BS_ETOOBIG);
  assert_int_equal(n, 481);
  assert_non_null(strstr(err.msg, "BS_MAX_LOOKUP_KEY"));
  /* too small a buffer: the needed size is reported */
  bs_scalar w[] = {S("hello"), I(5)};
  assert_int_equal(bs_lookup_encode(buf, 4, &n, w, 2, &err), BS_ETOOBIG);
  assert_int_equal(n, 1 + 1 + 5 + 9);
  assert_int_equal(bs_lookup_encode(NULL, 0, &n, w, 2, &err), BS_ETOOBIG);
  assert_int_equal(n, 16);
}

static void test_round_trip(void **state) {
  bs_scalar in[] = {T(BS_SCALAR_NULL),
                    T(BS_SCALAR_FALSE),
                    T(BS_SCALAR_TRUE),
                    I(-42),
                    D(2.5),
                    D(7.0),
                    S("héllo"),
                    S(""),
                    I(INT64_MAX)};
  bs_scalar out[16];
  size_t n = 0;
  bs_error err;
  (void)state;
  enc e = encode(in, 9);
  bs_val key = {e.b, e.n};
  assert_int_equal(bs_lookup_decode(out, 16, &n, key, &err), BS_OK);
  assert_int_equal(n, 9);
  assert_int_equal(out[0].type, BS_SCALAR_NULL);
  assert_int_equal(out[1].type, BS_SCALAR_FALSE);
  assert_int_equal(out[2].type, BS_SCALAR_TRUE);
  assert_int_equal(out[3].type, BS_SCALAR_INT);
  assert_true(out[3].i == -42);
  assert_int_equal(out[4].type, BS_SCALAR_DOUBLE);
  assert_true(out[4].d == 2.5);
  assert_int_equal(out[5].type, BS_SCALAR_INT); /* normalised */
  assert_true(out[5].i == 7);
  assert_int_equal(out[6].type, BS_SCALAR_STRING);
  assert_int_equal(out[6].s.size, strlen("héllo"));
  assert_memory_equal(out[6].s.data, "héllo", out[6].s.size);
  assert_int_equal(out[7].type, BS_SCALAR_STRING);
  assert_int_equal(out[7].s.size, 0);
  assert_true(out[8].i == INT64_MAX);
  /* and back: the decoded list re-encodes to the same bytes */
  assert_true(enc_eq(encode(out, n), e));
  /* cap too small: BS_ETOOBIG with the count */
  assert_int_equal(bs_lookup_decode(out, 3, &n, key, &err), BS_ETOOBIG);
  assert_int_equal(n, 9);
}

static void expect_corrupt(const void *bytes, size_t size) {
  bs_scalar out[8];
  size_t n = 0;
  bs_error err;
  bs_val key = {bytes, size};
  assert_int_equal(bs_lookup_decode(out, 8, &n, key, &err), BS_ECORRUPT);
  assert_int_equal(err.code, BS_ECORRUPT);
}

static void test_malformed_rejected(void **state) {
  (void)state;
  expect_corrupt("\x09", 1);                                 /* unknown tag */
  expect_corrupt("\x03\x00\x00", 3);                         /* short int */
  expect_corrupt("\x04\x40\x1c\x00\x00\x00\x00\x00\x00", 9); /* double 7.0: not canonical */
  expect_corrupt("\x04\x7f\xf8\x00\x00\x00\x00\x00\x00", 9); /* NaN */
  expect_corrupt("\x05\x05"
                 "abc",
                 5); /* length past the end */
  expect_corrupt("\x05\x81\x00"
                 "a",
                 4);             /* padded length */
  expect_corrupt("\x00\x05", 2); /* truncated string */
  /* a valid double decodes */
  bs_scalar out[2];
  size_t n;
  bs_val ok = {"\x04\x40\x04\x00\x00\x00\x00\x00\x00", 9}; /* 2.5 */
  assert_int_equal(bs_lookup_decode(out, 2, &n, ok, NULL), BS_OK);
  assert_true(out[0].d == 2.5);
}

/* Random lists from a small domain, so that equal lists (after normalisation) are common:
 * encode(a) == encode(b) exactly when a and b are equal as JSON values. */
static bs_scalar random_scalar(void) {
  static const char *strs[] = {"", "a", "b", "ab", "1", "\x03", "\x05\x01"};
  static const double dbls[] = {0.0, -0.0, 1.0, 2.0, 0.5, -1.0, 1e300, 3.0};
  switch (rand() % 6) {
  case 0:
    return T((bs_scalar_type)(rand() % 3));
  case 1:
    return I(rand() % 5 - 1);
  case 2:
    return D(dbls[rand() % 8]);
  default:
    return S(strs[rand() % 7]);
  }
}

/* normal form: integral doubles become ints */
static bs_scalar norm(bs_scalar s) {
  if (s.type == BS_SCALAR_DOUBLE && s.d > -9.2e18 && s.d < 9.2e18 && (double)(int64_t)s.d == s.d)
    return I((int64_t)s.d);
  return s;
}

static int lists_equal(const bs_scalar *a, size_t na, const bs_scalar *b, size_t nb) {
  if (na != nb) return 0;
  for (size_t i = 0; i < na; i++) {
    bs_scalar x = norm(a[i]), y = norm(b[i]);
    if (x.type != y.type) return 0;
    if (x.type == BS_SCALAR_INT && x.i != y.i) return 0;
    if (x.type == BS_SCALAR_DOUBLE && x.d != y.d) return 0;
    if (x.type == BS_SCALAR_STRING && !bs__val_eq(x.s, y.s)) return 0;
  }
  return 1;
}

static void test_random_injectivity(void **state) {
  enum { N = 400 };
  static bs_scalar lists[N][4];
  static size_t lens[N];
  static enc encs[N];
  size_t equal_pairs = 0;
  (void)state;
  srand((unsigned)ct_seed(g_seed, 1).s);
  for (int i = 0; i < N; i++) {
    lens[i] = (size_t)(rand() % 4);
    for (size_t k = 0; k < lens[i]; k++) lists[i][k] = random_scalar();
    encs[i] = encode(lists[i], lens[i]);
  }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      int eq = lists_equal(lists[i], lens[i], lists[j], lens[j]);
      if (eq != enc_eq(encs[i], encs[j]))
        fprintf(stderr, "BS_SEED=%llu: lists %d and %d disagree\n", (unsigned long long)g_seed, i,
                j);
      assert_int_equal(eq, enc_eq(encs[i], encs[j]));
      equal_pairs += (size_t)(eq && i != j);
    }
  assert_true(equal_pairs > 0); /* the domain is small enough to produce equal lists */
  /* decode(encode(x)) re-encodes to the same bytes for every list */
  for (int i = 0; i < N; i++) {
    bs_scalar out[4];
    size_t n;
    bs_val key = {encs[i].b, encs[i].n};
    assert_int_equal(bs_lookup_decode(out, 4, &n, key, NULL), BS_OK);
    assert_true(lists_equal(out, n, lists[i], lens[i]));
    assert_true(enc_eq(encode(out, n), encs[i]));
  }
}

/* bs__param_row_cmp, the order of a lookup's source rows in every backend's answer, is the LMDB
 * backend's params key order: over tables 1 and 2 and edge replica ids ("", one byte, non-ASCII,
 * "1" vs "1.0", the maximum length) its sign is memcmp's over the encoded keys. */
static void test_param_row_order(void **state) {
  static unsigned char big[BS_MAX_REPLICA_ID];
  bs_val rids[] = {{"", 0},  {"a", 1},   {"b", 1},  {"\xc3\xa9", 2},
                   {"1", 1}, {"1.0", 3}, {"ab", 2}, {big, sizeof big}};
  const size_t n = sizeof rids / sizeof rids[0];
  bs_val lookup = {"k", 1};
  int below = 0, above = 0;
  (void)state;
  for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 7 + 3);
  for (uint32_t ta = 1; ta <= 2; ta++)
    for (uint32_t tb = 1; tb <= 2; tb++)
      for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
          unsigned char ka[BS_MAX_LOOKUP_KEY + 64], kb[BS_MAX_LOOKUP_KEY + 64];
          size_t na = bs__lmdb_param_key(ka, 1, lookup, ta, rids[i], 7);
          size_t nb = bs__lmdb_param_key(kb, 1, lookup, tb, rids[j], 7);
          int c = bs__param_row_cmp(ta, rids[i], tb, rids[j]), m;
          assert_int_equal(na, nb);
          m = memcmp(ka, kb, na);
          assert_int_equal(c < 0, m < 0);
          assert_int_equal(c > 0, m > 0);
          assert_int_equal(c == 0, ta == tb && i == j);
          below += c < 0;
          above += c > 0;
        }
  assert_int_equal(below, above); /* antisymmetric, and both occur */
  assert_true(below > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integral_numbers_normalise),
      cmocka_unit_test(test_edge_pool_keys),
      cmocka_unit_test(test_nan_inf_rejected),
      cmocka_unit_test(test_structure_is_injective),
      cmocka_unit_test(test_size_limits),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_malformed_rejected),
      cmocka_unit_test(test_random_injectivity),
      cmocka_unit_test(test_param_row_order),
  };
  g_seed = ct_run_seed("lookup");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
