/* test_checksum: golden vectors for op checksums (xxh3 and sha256 modes), subkeys, and the
 * streaming/one-shot equivalence of bs__hash_parts. Vectors computed independently with the
 * xxhash 0.8.1 CLI (xxhsum -H3, xxh128sum) and Python's hashlib. */
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

static uint64_t g_seed; /* the run's (ct_run_seed) */

static bs_val V(const char *s) {
  return bs__val_str(s);
}

static void test_sha256_reference_vectors(void **state) {
  (void)state;
  /* contract.md section 3: the reference service's PUT checksums */
  assert_int_equal(bs_checksum_put(BS_HASH_SHA256, V("test"), V("t1"), V("{\"id\":\"t1\"}")),
                   2634521662u);
  assert_int_equal(bs_checksum_put(BS_HASH_SHA256, V("test"), V("t2"), V("{\"id\":\"t2\"}")),
                   4243212114u);
  assert_int_equal(
      bs_checksum_remove(BS_HASH_SHA256, V("00000001/26e1c35c30029d295242f654eb7fea09")),
      3757687170u);
}

static void test_xxh3_vectors(void **state) {
  (void)state;
  /* XXH3_64 = b8bb1319082e8642 -> low 32 bits */
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V("test"), V("t1"), V("{\"id\":\"t1\"}")),
                   137266754u);
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V("test"), V("t2"), V("{\"id\":\"t2\"}")),
                   3416079700u);
  assert_int_equal(bs_checksum_remove(BS_HASH_XXH3, V("00000001/26e1c35c30029d295242f654eb7fea09")),
                   1999950173u);
  /* empty parts: "put..." */
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V(""), V(""), V("")), 716115507u);
  bs_val nulls = {NULL, 0};
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, nulls, nulls, nulls), 716115507u);
}

/* An empty object id is a value: the PUT string is "put.<type>..<data>" (contract.md section 3).
 * Expected values: xxhsum -H3 (low 32 bits) and Python hashlib.sha256 (first 4 bytes, LE) of
 * 'put.test..{"id":""}' and 'put.todos..'. */
static void test_empty_object_id_vectors(void **state) {
  (void)state;
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V("test"), V(""), V("{\"id\":\"\"}")),
                   3057245891u); /* XXH3_64 = 451cad93b639dec3 */
  assert_int_equal(bs_checksum_put(BS_HASH_SHA256, V("test"), V(""), V("{\"id\":\"\"}")),
                   3355958312u);
  /* empty id and empty data */
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V("todos"), V(""), V("")),
                   1502539578u); /* XXH3_64 = cc671219598eef3a */
  assert_int_equal(bs_checksum_put(BS_HASH_SHA256, V("todos"), V(""), V("")), 1475884945u);
  /* the id's bytes cannot move between the parts: "te" + "st" differs from "test" + "" */
  assert_true(bs_checksum_put(BS_HASH_XXH3, V("te"), V("st"), V("")) !=
              bs_checksum_put(BS_HASH_XXH3, V("test"), V(""), V("")));
}

static void test_long_input_streams(void **state) {
  char data[1000];
  (void)state;
  memset(data, 'x', sizeof data);
  bs_val d = {data, sizeof data};
  /* over the 256-byte stack buffer: exercises the streaming path */
  assert_int_equal(bs_checksum_put(BS_HASH_XXH3, V("lists"), V("L1"), d), 2869049003u);
  assert_int_equal(bs_checksum_put(BS_HASH_SHA256, V("lists"), V("L1"), d), 106967302u);
}

/* The hash of the concatenation does not depend on how it is split into parts. */
static void test_parts_split_invariance(void **state) {
  unsigned char buf[700];
  (void)state;
  srand((unsigned)ct_seed(g_seed, 1).s);
  for (int iter = 0; iter < 300; iter++) {
    size_t len = (size_t)rand() % sizeof buf;
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)rand();
    for (int h = 0; h < 2; h++) {
      bs_val whole = {buf, len};
      bs_val parts[5];
      size_t cut[4], n = 0, prev = 0;
      uint32_t a = bs__hash_parts((bs_hash)h, &whole, 1), b;
      for (int k = 0; k < 4; k++) cut[k] = len ? (size_t)rand() % (len + 1) : 0;
      for (int k = 0; k < 4; k++) /* sort the cut points */
        for (int j = k + 1; j < 4; j++)
          if (cut[j] < cut[k]) {
            size_t t = cut[j];
            cut[j] = cut[k];
            cut[k] = t;
          }
      for (int k = 0; k < 4; k++) {
        parts[n].data = buf + prev;
        parts[n++].size = cut[k] - prev;
        prev = cut[k];
      }
      parts[n].data = buf + prev;
      parts[n++].size = len - prev;
      b = bs__hash_parts((bs_hash)h, parts, n);
      if (a != b)
        fprintf(stderr, "BS_SEED=%llu iter %d len %zu hash %d\n", (unsigned long long)g_seed, iter,
                len, h);
      assert_int_equal(a, b);
    }
  }
}

static void test_subkey_vectors(void **state) {
  char sk[BS_SUBKEY_SIZE + 1];
  char r256[256];
  (void)state;
  sk[BS_SUBKEY_SIZE] = '#'; /* must stay untouched: no NUL written */
  bs_subkey(sk, 1, V("row-1"));
  assert_memory_equal(sk, "00000001/26e1c35c30029d295242f654eb7fea09", BS_SUBKEY_SIZE);
  assert_int_equal(sk[BS_SUBKEY_SIZE], '#');
  bs_val empty = {NULL, 0};
  bs_subkey(sk, 0xdeadbeefu, empty);
  assert_memory_equal(sk, "deadbeef/99aa06d3014798d86001c324468d497f", BS_SUBKEY_SIZE);
  bs_val bin = {"\x00\x01\x02", 3};
  bs_subkey(sk, 0x00a0000bu, bin);
  assert_memory_equal(sk, "00a0000b/e3b55f57945a17cf5f4299fc161c9cbb", BS_SUBKEY_SIZE);
  memset(r256, 'r', sizeof r256);
  bs_val r = {r256, sizeof r256};
  bs_subkey(sk, 7, r);
  assert_memory_equal(sk, "00000007/0bf4c545df50aec5e8706c371891dfdb", BS_SUBKEY_SIZE);
}

static void test_checksum_arithmetic(void **state) {
  (void)state;
  assert_int_equal(bs__cksum_add(0xffffffffu, 2), 1u);
  assert_int_equal(bs__cksum_sub(1, 2), 0xffffffffu);
  assert_int_equal(bs__cksum_sub(bs__cksum_add(123456789u, 4000000000u), 4000000000u), 123456789u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_reference_vectors), cmocka_unit_test(test_xxh3_vectors),
      cmocka_unit_test(test_empty_object_id_vectors),  cmocka_unit_test(test_long_input_streams),
      cmocka_unit_test(test_parts_split_invariance),   cmocka_unit_test(test_subkey_vectors),
      cmocka_unit_test(test_checksum_arithmetic),
  };
  g_seed = ct_run_seed("checksum");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
