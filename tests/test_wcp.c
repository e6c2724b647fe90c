/*
 * test_wcp.c: write checkpoints on the LMDB backend (contract.md section 7), through the public
 * API: managed ids (supplied and generated sharing one counter, monotonic supplied ids, batch
 * de-duplication), last_write_checkpoint against heads, commit marking processed and
 * should_advance, custom mode, cleanup, persistence across reopen.
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
#include "storage.h"
#include "lmdb_internal.h" /* bs__lmdb_set_wcp_read_hook */

/* Each test: an LMDB file with stream "s1", snapshot done, writer open (util_contract.c). */
static int setup(void **state) {
  *state = ct_env_new(&ct_backends[CT_LMDB]);
  return *state ? 0 : -1;
}

/* One managed request on connection "1"; req < 0 = generated. Returns the id. */
static uint64_t managed(ct_env *f, const char *user, const char *lsn, int64_t req, int *adv) {
  bs_head h = {ct_v("1"), ct_v(lsn)};
  bs_managed_request r = {ct_v(user), &h, 1, req >= 0, req >= 0 ? (uint64_t)req : 0, 0};
  uint64_t id = 0;
  int a = -1;
  CT_OK(bs_create_managed_write_checkpoints(&id, &a, f->st, &r, 1, &ct_err));
  assert_true(a == 0 || a == 1);
  if (adv) *adv = a;
  return id;
}

/* last_write_checkpoint at heads {"1": lsn}; 0 = none */
static uint64_t last(ct_env *f, const char *user, const char *lsn) {
  bs_head h = {ct_v("1"), ct_v(lsn)};
  uint64_t id = 12345;
  int found = -1;
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v(user), &h, lsn ? 1 : 0, &ct_err));
  assert_true(found == 0 || found == 1);
  return found ? id : 0;
}

static void commit(ct_env *f, const char *lsn) {
  bs_commit_result r;
  CT_OK(bs_writer_commit(&r, f->w, ct_v(lsn), NULL, &ct_err));
}

/* ---- tests ---- */

static void test_managed_ids(void **state) {
  ct_env *f = *state;
  int adv;
  assert_int_equal(managed(f, "u", "00000005", 42, &adv), 42);
  assert_true(adv);
  /* a stale supplied id returns the stored one and does not move the head */
  assert_int_equal(managed(f, "u", "00000009", 41, &adv), 42);
  assert_int_equal(last(f, "u", "00000005"), 42);
  assert_int_equal(managed(f, "u", "00000007", 43, &adv), 43);
  assert_int_equal(last(f, "u", "00000006"), 0); /* below the new head: none */
  assert_int_equal(last(f, "u", "00000007"), 43);
  /* generated ids continue the same counter */
  assert_int_equal(managed(f, "u", "00000008", -1, &adv), 44);
  assert_true(adv);
  assert_int_equal(last(f, "u", "00000007"), 0);
  assert_int_equal(last(f, "u", "00000008"), 44);
  assert_int_equal(last(f, "u", "00000100"), 44);
  /* a new user's first generated id is 1; users are independent, full ids are distinct */
  assert_int_equal(managed(f, "v", "00000001", -1, NULL), 1);
  assert_int_equal(managed(f, "v", "00000001", -1, NULL), 2);
  assert_int_equal(managed(f, "u/client", "00000001", -1, NULL), 1);
  assert_int_equal(last(f, "u", "00000100"), 44);
  assert_int_equal(last(f, "nobody", "00000100"), 0);
}

static void test_last_heads(void **state) {
  ct_env *f = *state;
  bs_head two[2] = {{ct_v("1"), ct_v("00000005")}, {ct_v("2"), ct_v("0010")}};
  bs_managed_request r = {ct_v("m"), two, 2, 1, 7, 0};
  uint64_t id;
  int found;
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &r, 1, &ct_err));
  assert_int_equal(id, 7);
  /* missing connection 2: not satisfied */
  assert_int_equal(last(f, "m", "00000005"), 0);
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("m"), two, 2, &ct_err));
  assert_true(found);
  assert_int_equal(id, 7);
  two[1].lsn = ct_v("0009");
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("m"), two, 2, &ct_err));
  assert_false(found);
}

static void test_batch_dedup(void **state) {
  ct_env *f = *state;
  bs_head h = {ct_v("1"), ct_v("00000010")};
  bs_managed_request r[5] = {{ct_v("x"), &h, 1, 0, 0, 0},
                             {ct_v("x"), &h, 1, 1, 7, 0},
                             {ct_v("y"), &h, 1, 0, 0, 0},
                             {ct_v("x"), &h, 1, 1, 9, 0},
                             {ct_v("y"), &h, 1, 0, 0, 0}};
  uint64_t ids[5];
  int adv = 0;
  CT_OK(bs_create_managed_write_checkpoints(ids, &adv, f->st, r, 5, &ct_err));
  /* x: supplied beats generated, the greatest supplied wins; y: one generated id, not two */
  assert_int_equal(ids[0], 9);
  assert_int_equal(ids[1], 9);
  assert_int_equal(ids[3], 9);
  assert_int_equal(ids[2], 1);
  assert_int_equal(ids[4], 1);
  assert_true(adv);
  CT_OK(bs_create_managed_write_checkpoints(ids, &adv, f->st, r, 0, &ct_err)); /* empty batch */
  assert_false(adv);
}

static int val_is(bs_val v, const char *s) {
  return v.size == strlen(s) && memcmp(v.data, s, v.size) == 0;
}

/* Saves one bucket row so that the next commit has a new op id. */
static void save_row(ct_env *f, const char *id) {
  bs_save s = BS_SAVE_INIT;
  bs_row row = {ct_v("b"), ct_v("t"), ct_v(id), ct_v("{}")};
  s.table = ct_v("t");
  s.tag = BS_INSERT;
  s.after_id = ct_v(id);
  s.before_id = ct_v(id);
  s.rows = &row;
  s.n_rows = 1;
  CT_OK(bs_writer_save(f->w, &s, &ct_err));
}

static int on_changes(const bs_checkpoint_changes *c, void *payload) {
  int *seen = payload;
  for (size_t i = 0; i < c->n_updated_write_checkpoint_users; i++)
    if (val_is(c->updated_write_checkpoint_users[i], "u")) *seen = 1;
  return 0;
}

static void test_commit_marks_processed(void **state) {
  ct_env *f = *state;
  int adv;
  bs_checkpoint c0, c1;
  CT_OK(bs_get_checkpoint(&c0, f->st, &ct_err));
  assert_int_equal(managed(f, "u", "00000010", 42, &adv), 42);
  assert_true(adv);
  /* an equal retry before any commit passed the head: still pending */
  assert_int_equal(managed(f, "u", "00000010", 42, &adv), 42);
  assert_true(adv);
  commit(f, "00000009");
  assert_int_equal(managed(f, "u", "00000010", 42, &adv), 42);
  assert_true(adv);
  save_row(f, "r1");
  commit(f, "00000010");
  assert_int_equal(managed(f, "u", "00000010", 42, &adv), 42);
  assert_false(adv); /* processed: no need to nudge the source */
  assert_int_equal(managed(f, "u", "00000010", 40, &adv), 42);
  assert_false(adv);
  /* the checkpoint's changes name the user */
  CT_OK(bs_get_checkpoint(&c1, f->st, &ct_err));
  assert_true(c1.op_id > c0.op_id);
  {
    int seen = 0;
    CT_OK(bs_get_checkpoint_changes(f->st, c0.op_id, c1.op_id, on_changes, &seen, &ct_err));
    assert_true(seen);
  }
  /* a new id makes it pending again */
  assert_int_equal(managed(f, "u", "00000011", -1, &adv), 43);
  assert_true(adv);
  commit(f, "00000012");
  assert_int_equal(managed(f, "u", "00000011", 43, &adv), 43);
  assert_false(adv);
}

static void test_custom(void **state) {
  ct_env *f = *state;
  uint64_t id;
  int found, adv;
  bs_head h = {ct_v("1"), ct_v("1")};
  bs_managed_request r = {ct_v("u"), &h, 1, 0, 0, 0};
  CT_OK(bs_set_write_checkpoint_mode(f->st, BS_WCP_CUSTOM, ct_v(""), &ct_err));
  assert_int_equal(bs_create_managed_write_checkpoints(&id, &adv, f->st, &r, 1, NULL), BS_ESTATE);
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v("u"), 5, ct_v(""), &ct_err));
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_false(found); /* queued, not yet flushed */
  CT_OK(bs_writer_flush(NULL, f->w, &ct_err));
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_true(found);
  assert_int_equal(id, 5);
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v("u"), 3, ct_v(""), &ct_err));
  CT_OK(bs_writer_flush(NULL, f->w, &ct_err));
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_int_equal(id, 3); /* overwritten, even by a lower value */
  /* custom values do not leak into managed mode and back */
  CT_OK(bs_set_write_checkpoint_mode(f->st, BS_WCP_MANAGED, ct_v(""), &ct_err));
  assert_int_equal(last(f, "u", "9"), 0);
  CT_OK(bs_set_write_checkpoint_mode(f->st, BS_WCP_CUSTOM, ct_v(""), &ct_err));
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_true(found);
  assert_int_equal(id, 3);
}

/* Another thread's bs_set_write_checkpoint_mode, run by the hook in the middle of a read. */
static int g_hook_ran;
static void set_mode_e22(bs_storage *st) {
  bs__lmdb_set_wcp_read_hook(NULL);
  g_hook_ran = 1;
  CT_OK(bs_set_write_checkpoint_mode(st, BS_WCP_CUSTOM, ct_v("e22"), &ct_err));
}

/* A read that a mode change overlaps answers as of one mode and event, before or after: the
 * handle's mode and event are one value, never read half old, half new. */
static void test_mode_change_during_read(void **state) {
  ct_env *f = *state;
  uint64_t id = 0;
  int found = 0;
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v("u"), 5, ct_v("e1"), &ct_err));
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v("u"), 9, ct_v("e2"), &ct_err));
  CT_OK(bs_writer_flush(NULL, f->w, &ct_err));
  CT_OK(bs_set_write_checkpoint_mode(f->st, BS_WCP_CUSTOM, ct_v("e1"), &ct_err));
  bs__lmdb_set_wcp_read_hook(set_mode_e22);
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_true(g_hook_ran); /* the change did overlap the read */
  /* before the change: e1's 5; after it: e22 has none; never e2's 9 (e22's size, e1's bytes) */
  if (found) assert_int_equal(id, 5);
  id = 0;
  CT_OK(bs_last_write_checkpoint(&id, &found, f->st, ct_v("u"), NULL, 0, &ct_err));
  assert_false(found); /* e22 */
}

static void test_cleanup(void **state) {
  ct_env *f = *state;
  bs_head h = {ct_v("1"), ct_v("00000005")};
  bs_managed_request old = {ct_v("old"), &h, 1, 1, 10, 1000};
  bs_managed_request recent = {ct_v("recent"), &h, 1, 1, 10, 5000};
  bs_managed_request gen = {ct_v("gen"), &h, 1, 0, 0, 0};
  bs_head h2 = {ct_v("1"), ct_v("00000099")};
  bs_managed_request pending = {ct_v("pending"), &h2, 1, 1, 10, 1000};
  uint64_t id, deleted = 99;
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &old, 1, &ct_err));
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &recent, 1, &ct_err));
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &gen, 1, &ct_err));
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &pending, 1, &ct_err));
  /* nothing processed yet: nothing deleted */
  CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, 3000, &ct_err));
  assert_int_equal(deleted, 0);
  commit(f, "00000006");
  CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, 3000, &ct_err));
  assert_int_equal(deleted, 1);
  assert_int_equal(last(f, "old", "00000006"), 0);
  assert_int_equal(last(f, "recent", "00000006"), 10);
  assert_int_equal(last(f, "gen", "00000006"), 1);      /* no requested_at: kept */
  assert_int_equal(last(f, "pending", "00000099"), 10); /* not processed: kept */
  CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, INT64_MAX, &ct_err));
  assert_int_equal(deleted, 1); /* recent */
  assert_int_equal(last(f, "gen", "00000006"), 1);
  /* an equal retry refreshes requested_at: the record survives a cutoff below the refresh */
  {
    bs_managed_request r1 = {ct_v("retry"), &h, 1, 1, 5, 1000};
    bs_managed_request r2 = {ct_v("retry"), &h, 1, 1, 5, 8000};
    CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &r1, 1, &ct_err));
    commit(f, "00000007");
    CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &r2, 1, &ct_err));
    CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, 5000, &ct_err));
    assert_int_equal(deleted, 0);
    CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, 9000, &ct_err));
    assert_int_equal(deleted, 1);
  }
}

static void test_persistence(void **state) {
  ct_env *f = *state;
  int adv;
  assert_int_equal(managed(f, "u", "00000005", 42, &adv), 42);
  assert_int_equal(managed(f, "p", "00000009", 7, &adv), 7);
  commit(f, "00000006");
  CT_OK(ct_env_reopen(f));
  assert_int_equal(last(f, "u", "00000005"), 42);
  assert_int_equal(managed(f, "u", "00000005", 42, &adv), 42);
  assert_false(adv); /* processed state persisted */
  assert_int_equal(managed(f, "p", "00000009", 7, &adv), 7);
  assert_true(adv);
  assert_int_equal(managed(f, "u", "00000005", -1, &adv), 43);
  /* the pending marker of p survived too: the next commit past its head processes it */
  commit(f, "00000010");
  assert_int_equal(managed(f, "p", "00000009", 7, &adv), 7);
  assert_false(adv);
}

static void on_problem(const char *p, void *payload) {
  print_message("verify: %s\n", p);
}

/* pending markers, processed records, high-water marks of deleted records and custom values
 * (persistent and request-derived, empty user ids too) are all consistent for verify, and stat
 * counts records (one per managed user, one per custom value; not the marks) */
static void test_verify_and_stat(void **state) {
  ct_env *f = *state;
  bs_head h = {ct_v("1"), ct_v("00000001")};
  bs_managed_request gone = {ct_v("gone"), &h, 1, 1, 9, 1000};
  uint64_t problems = 99, id, deleted = 0;
  bs_stat s;
  managed(f, "done", "00000001", 3, NULL);
  managed(f, "", "00000001", 4, NULL);
  managed(f, "waiting", "00000099", -1, NULL);
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, f->st, &gone, 1, &ct_err));
  commit(f, "00000002");
  CT_OK(bs_delete_checkpoint_requests_before(&deleted, f->st, 2000, &ct_err));
  assert_int_equal(deleted, 1); /* "gone": its record leaves a high-water mark */
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v("c"), 5, ct_v(""), &ct_err));
  CT_OK(bs_writer_custom_write_checkpoint(f->w, ct_v(""), 6, ct_v(""), &ct_err));
  CT_OK(bs_writer_custom_write_checkpoint_requested(f->w, ct_v("r"), 7, ct_v(""), 1, &ct_err));
  CT_OK(bs_writer_flush(NULL, f->w, &ct_err));
  CT_OK(bs_db_verify(&problems, f->db, on_problem, NULL, &ct_err));
  assert_int_equal(problems, 0);
  CT_OK(bs_db_stat(&s, f->db, &ct_err));
  assert_int_equal(s.write_checkpoints, 6);
  CT_OK(ct_env_reopen(f));
  assert_int_equal(managed(f, "gone", "00000003", -1, NULL), 10); /* the mark, after reopen */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_managed_ids, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_last_heads, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_batch_dedup, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_commit_marks_processed, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_custom, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_mode_change_during_read, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_cleanup, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_persistence, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_verify_and_stat, setup, ct_env_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
