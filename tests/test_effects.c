/* test_effects: effects.c, the one module that decides a save's effects (contract.md 4.1 - 4.3),
 * on a backend that records every call it gets as a line of text. Each case sets up the previous
 * records, runs one save (or truncate's unlink) and compares the whole trace: the op-id order of
 * 4.1, the superseded pairs, the lookup entries and tombstones, the records stored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

#define V(s)  ((bs_val){s, sizeof(s) - 1})
#define TABLE 7u

/* ---- the recording backend: records by replica id, op ids from head ---- */
static char trace[4096];
static uint64_t head;
static bs__srec recs[4]; /* the record of rid "A", "B", ...; exists 0 = none */
static bs__member rec_m[4][8];
static bs_val rec_lk[4][8];

static void say(const char *fmt, ...) {
  size_t n = strlen(trace);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(trace + n, sizeof trace - n, fmt, ap);
  va_end(ap);
}

static int slot(bs_val rid) {
  assert_int_equal(rid.size, 1);
  assert_true(((const char *)rid.data)[0] >= 'A' && ((const char *)rid.data)[0] <= 'D');
  return ((const char *)rid.data)[0] - 'A';
}

static const char *s(bs_val v) { /* a short string of the test, for the trace */
  static char buf[8][64];
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%.*s", (int)v.size, v.size ? (const char *)v.data : "");
  return buf[k];
}

static int f_load(void *ctx, bs_val rid, const bs__srec **out, bs_error *err) {
  (void)ctx, (void)err;
  say("load %s\n", s(rid));
  *out = &recs[slot(rid)];
  return BS_OK;
}

static int f_bucket(void *ctx, bs_val name, uint64_t *bucket, bs_error *err) {
  (void)ctx, (void)err;
  assert_true(name.size == 2 && ((const char *)name.data)[0] == 'b');
  *bucket = (uint64_t)(((const char *)name.data)[1] - '0'); /* "b1" -> 1 */
  return BS_OK;
}

static int f_op(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *id, bs_error *err) {
  char sk[BS_SUBKEY_SIZE], rid[2] = {0};
  (void)ctx, (void)err;
  assert_int_equal(op->subkey.size, BS_SUBKEY_SIZE);
  for (rid[0] = 'A'; rid[0] <= 'D'; rid[0]++) { /* whose subkey it is */
    bs_subkey(sk, TABLE, (bs_val){rid, 1});
    if (memcmp(sk, op->subkey.data, BS_SUBKEY_SIZE) == 0) break;
  }
  assert_true(rid[0] <= 'D');
  if (op->type == BS_OP_PUT)
    assert_int_equal(op->checksum,
                     bs_checksum_put(BS_HASH_XXH3, op->object_type, op->object_id, op->data));
  else
    assert_int_equal(op->checksum, bs_checksum_remove(BS_HASH_XXH3, op->subkey));
  *id = ++head;
  say("%llu %s b%llu %s/%s of %s%s%s\n", (unsigned long long)*id,
      op->type == BS_OP_PUT ? "PUT" : "REMOVE", (unsigned long long)bucket, s(op->object_type),
      s(op->object_id), rid, op->type == BS_OP_PUT ? " " : "", s(op->data));
  return BS_OK;
}

static int f_sup(void *ctx, uint64_t bucket, uint64_t old_op, uint64_t new_op, bs_error *err) {
  (void)ctx, (void)err;
  say("sup b%llu %llu>%llu\n", (unsigned long long)bucket, (unsigned long long)old_op,
      (unsigned long long)new_op);
  return BS_OK;
}

static int f_param(void *ctx, bs_val key, bs_val rid, const bs_val *params, size_t n,
                   bs_error *err) {
  (void)ctx, (void)err;
  ++head;
  if (!n)
    say("%llu tombstone %s of %s\n", (unsigned long long)head, s(key), s(rid));
  else
    say("%llu param %s of %s: %s x%zu\n", (unsigned long long)head, s(key), s(rid), s(params[0]),
        n);
  return BS_OK;
}

static int f_store(void *ctx, bs_val rid, const bs__srec *r, bs_error *err) {
  int k = slot(rid);
  (void)ctx, (void)err;
  say("store %s:", s(rid));
  if (!r->exists) say(" gone");
  if (r->soft) say(" soft@%llu", (unsigned long long)r->mark);
  for (uint32_t i = 0; i < r->nm; i++)
    say(" b%llu:%s/%s@%llu", (unsigned long long)r->m[i].bucket, s(r->m[i].object_type),
        s(r->m[i].object_id), (unsigned long long)r->m[i].op);
  for (uint32_t i = 0; i < r->nl; i++) say(" [%s]", s(r->lk[i]));
  if (r->has_data) say(" data=%s", s(r->data));
  say("\n");
  assert_true(r->nm <= 8 && r->nl <= 8);
  recs[k] = *r;
  if (r->nm) memcpy(rec_m[k], r->m, r->nm * sizeof *r->m); /* valid during the call only */
  if (r->nl) memcpy(rec_lk[k], r->lk, r->nl * sizeof *r->lk);
  recs[k].m = rec_m[k];
  recs[k].lk = rec_lk[k];
  return BS_OK;
}

static uint64_t f_head(void *ctx) {
  (void)ctx;
  return head;
}

static const bs__effects_ops ops = {f_load, f_bucket, f_op, f_sup, f_param, f_store, f_head};
static bs__effects fx;

static int setup(void **state) {
  (void)state;
  memset(recs, 0, sizeof recs);
  trace[0] = 0;
  head = 100;
  memset(&fx, 0, sizeof fx);
  fx.ops = &ops;
  fx.alloc = &bs__default_allocator;
  fx.hash = BS_HASH_XXH3;
  fx.snapshot_done = 1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  bs__effects_free(&fx);
  return 0;
}

/* Record A: in b1 and b2 as t/a (ops 5 and 6), lookups k1 and k2. */
static void given_a(void) {
  bs__member m[2] = {{1, 5, V("t"), V("a")}, {2, 6, V("t"), V("a")}};
  bs_val lk[2] = {V("k1"), V("k2")};
  bs__srec r = {1, 0, 0, m, 2, lk, 2, 0, {NULL, 0}};
  f_store(NULL, V("A"), &r, NULL);
  trace[0] = 0;
}

static void expect(const char *want) {
  if (strcmp(trace, want) != 0) fail_msg("trace:\n%s\nwanted:\n%s", trace, want);
}

static void run(const bs_save *save) {
  assert_int_equal(bs__effects_save(&fx, TABLE, save, NULL), BS_OK);
}

/* Step 2 and 3 of an UPDATE: a PUT per row in order (the same row twice: the later supersedes
 * the earlier), the REMOVEs of memberships left, entries then tombstones; a deduplicated record. */
static void test_update(void **state) {
  bs_val p1 = V("{\"x\":1}");
  bs_row rows[3] = {{V("b1"), V("t"), V("a"), V("d1")},
                    {V("b1"), V("t"), V("a"), V("d2")},
                    {V("b3"), V("t"), V("a"), V("")}};
  bs_lookup lks[3] = {{V("k2"), &p1, 1}, {V("k3"), &p1, 1}, {V("k2"), &p1, 1}};
  bs_save save = BS_SAVE_INIT;
  (void)state;
  given_a();
  save.table = V("tbl"), save.tag = BS_UPDATE, save.after_id = V("A");
  save.rows = rows, save.n_rows = 3, save.lookups = lks, save.n_lookups = 3;
  save.stored_data = V("");
  run(&save);
  expect("load A\n"
         "101 PUT b1 t/a of A d1\nsup b1 5>101\n"
         "102 PUT b1 t/a of A d2\nsup b1 101>102\n"
         "103 PUT b3 t/a of A \n"
         "104 REMOVE b2 t/a of A\nsup b2 6>104\n"
         "105 param k2 of A: {\"x\":1} x1\n106 param k3 of A: {\"x\":1} x1\n"
         "107 param k2 of A: {\"x\":1} x1\n108 tombstone k1 of A\n"
         "store A: b1:t/a@102 b3:t/a@103 [k2] [k3] data=\n");
}

/* An INSERT does not read the previous record: PUTs only, the record replaced. */
static void test_insert(void **state) {
  bs_row row = {V("b2"), V("u"), V("a"), V("d")};
  bs_save save = BS_SAVE_INIT;
  (void)state;
  given_a();
  save.table = V("tbl"), save.tag = BS_INSERT, save.after_id = V("A");
  save.rows = &row, save.n_rows = 1;
  run(&save);
  expect("101 PUT b2 u/a of A d\nstore A: b2:u/a@101\n");
}

/* A changed key (step 1): REMOVEs with the old row's subkey and tombstones, the old record
 * deleted; then the new row as an UPDATE without a previous record. */
static void test_key_change(void **state) {
  bs_row row = {V("b1"), V("t"), V("a"), V("d")};
  bs_save save = BS_SAVE_INIT;
  (void)state;
  given_a();
  save.table = V("tbl"), save.tag = BS_UPDATE, save.before_id = V("A"), save.after_id = V("B");
  save.rows = &row, save.n_rows = 1;
  run(&save);
  expect("load A\n101 REMOVE b1 t/a of A\nsup b1 5>101\n102 REMOVE b2 t/a of A\nsup b2 6>102\n"
         "103 tombstone k1 of A\n104 tombstone k2 of A\nstore A: gone\n"
         "load B\n105 PUT b1 t/a of B d\nstore B: b1:t/a@105\n");
}

/* DELETE: the record goes (its before_id defaults to after_id); a repeated DELETE emits nothing. */
static void test_delete(void **state) {
  bs_save save = BS_SAVE_INIT;
  (void)state;
  given_a();
  save.table = V("tbl"), save.tag = BS_DELETE, save.after_id = V("A");
  run(&save);
  run(&save);
  expect("load A\n101 REMOVE b1 t/a of A\nsup b1 5>101\n102 REMOVE b2 t/a of A\nsup b2 6>102\n"
         "103 tombstone k1 of A\n104 tombstone k2 of A\nstore A: gone\nload A\n");
}

/* 4.3: before the snapshot is done a DELETE leaves a soft-deleted record marked with the op head
 * after its REMOVEs, also for a row not known yet; a soft-deleted record keeps its mark; a
 * snapshot writer's INSERT of a key with a record (soft-deleted too) is skipped. */
static void test_soft(void **state) {
  bs_row row = {V("b1"), V("t"), V("c"), V("d")};
  bs_save del = BS_SAVE_INIT, ins = BS_SAVE_INIT;
  (void)state;
  given_a();
  fx.snapshot_done = 0;
  del.table = V("tbl"), del.tag = BS_DELETE, del.before_id = V("A");
  run(&del);
  del.before_id = V("C");
  run(&del);
  run(&del);
  expect("load A\n101 REMOVE b1 t/a of A\nsup b1 5>101\n102 REMOVE b2 t/a of A\nsup b2 6>102\n"
         "103 tombstone k1 of A\n104 tombstone k2 of A\nstore A: soft@104\n"
         "load C\nstore C: soft@104\nload C\n");
  trace[0] = 0;
  fx.snapshot = 1;
  ins.table = V("tbl"), ins.tag = BS_INSERT, ins.after_id = V("C");
  ins.rows = &row, ins.n_rows = 1;
  run(&ins);
  ins.after_id = V("D");
  run(&ins);
  expect("load C\nload D\n105 PUT b1 t/c of D d\nstore D: b1:t/c@105\n");
}

/* Truncate's unlink: the REMOVEs and tombstones of one record, which it leaves to the caller. */
static void test_unlink(void **state) {
  (void)state;
  given_a();
  assert_int_equal(bs__effects_unlink(&fx, TABLE, V("A"), &recs[0], NULL), BS_OK);
  expect("101 REMOVE b1 t/a of A\nsup b1 5>101\n102 REMOVE b2 t/a of A\nsup b2 6>102\n"
         "103 tombstone k1 of A\n104 tombstone k2 of A\n");
}

/* bs__managed_next_id (rules.c), contract.md 7: the id and action per case; a failure (the id
 * would reach 2^63) leaves both outputs as they were. */
static void test_managed_next_id(void **state) {
  static const uint64_t top = (UINT64_C(1) << 63) - 1;
  static const struct {
    int has_id;
    uint64_t req;
    int exists;
    uint64_t stored, id;
    int action, rc;
  } cases[] = {
      {0, 0, 0, 0, 1, BS_WCP_REPLACE, BS_OK},         /* generated, new user: 1 */
      {0, 0, 1, 7, 8, BS_WCP_REPLACE, BS_OK},         /* generated: stored + 1 */
      {0, 0, 0, 7, 8, BS_WCP_REPLACE, BS_OK},         /* generated over a high-water mark */
      {1, 5, 1, 3, 5, BS_WCP_REPLACE, BS_OK},         /* supplied above the stored id */
      {1, 3, 1, 3, 3, BS_WCP_REFRESH, BS_OK},         /* a supplied retry */
      {1, 2, 1, 3, 3, BS_WCP_KEEP, BS_OK},            /* a lower supplied id */
      {1, 2, 0, 3, 3, BS_WCP_REPLACE, BS_OK},         /* lower than the high-water mark */
      {1, 1, 0, 0, 1, BS_WCP_REPLACE, BS_OK},         /* the smallest supplied id */
      {1, top, 1, 3, top, BS_WCP_REPLACE, BS_OK},     /* the largest id */
      {0, 0, 1, top - 1, top, BS_WCP_REPLACE, BS_OK}, /* generated up to the largest */
      {0, 0, 1, top, 0, 0, BS_EINVAL},                /* generated past it */
      {0, 0, 0, top, 0, 0, BS_EINVAL},                /* past it from a high-water mark */
      {1, top + 1, 0, 0, 0, 0, BS_EINVAL},            /* a supplied id of 2^63 */
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bs_managed_request w = {0};
    bs_error err = {0};
    uint64_t id = 0xdeadbeef;
    int action = -7, rc;
    w.user_id = (bs_val){"\xc3\xbc/c", 4}; /* non-ASCII user id */
    w.has_request_id = cases[i].has_id;
    w.request_id = cases[i].req;
    rc = bs__managed_next_id(&w, cases[i].exists, cases[i].stored, &id, &action, &err);
    if (rc != cases[i].rc) fail_msg("case %zu: rc %d, want %d", i, rc, cases[i].rc);
    if (rc != BS_OK) {
      assert_true(id == 0xdeadbeef && action == -7); /* untouched */
      assert_non_null(strstr(err.msg, "\xc3\xbc/c"));
      continue;
    }
    if (id != cases[i].id || action != cases[i].action)
      fail_msg("case %zu: id %llu action %d, want %llu %d", i, (unsigned long long)id, action,
               (unsigned long long)cases[i].id, cases[i].action);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_update, setup, teardown),
      cmocka_unit_test_setup_teardown(test_insert, setup, teardown),
      cmocka_unit_test_setup_teardown(test_key_change, setup, teardown),
      cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
      cmocka_unit_test_setup_teardown(test_soft, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unlink, setup, teardown),
      cmocka_unit_test(test_managed_next_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
