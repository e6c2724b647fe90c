/* test_planner: the compaction planner (compact.c) that every backend follows, on hand-made op
 * sequences: the horizon, the reverse scan's MOVE and leading-run decisions with the contract's
 * examples (contract.md 6), what a CLEAR carries, initial replication's deletions (also with a
 * full seen-set), incremental log entries, defragmentation's threshold, parameter entries, and
 * row identities made of edge values (empty, one byte, maximum lengths, non-ASCII, the same bytes
 * split differently) that must never be taken for one another. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

static bs_val str(const char *s) {
  bs_val v = {s, strlen(s)};
  return v;
}

static bs_op mk(uint64_t id, bs_op_type t, const char *row, uint32_t checksum, uint64_t target) {
  bs_op op;
  memset(&op, 0, sizeof op);
  op.op_id = id;
  op.type = t;
  op.checksum = checksum;
  op.target_op = target;
  if (t == BS_OP_PUT || t == BS_OP_REMOVE) {
    op.object_type = str("t");
    op.object_id = str(row);
    op.subkey = str("sk");
  }
  return op;
}

static void test_horizon(void **state) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  (void)state;
  /* full: the checkpoint, or max_op_id (also above it), never above op_head */
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 10);
  o.max_op_id = 15;
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 15);
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 12), 12);
  o.max_op_id = 0;
  assert_int_equal(bs__compact_horizon(&o, 0, 0, 20), 0);
  /* incremental: the aged checkpoint, the checkpoint itself at min_age 0, max_op_id only lowers */
  o.incremental_only = 1;
  o.min_age_ms = 1000;
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 7);
  o.max_op_id = 15;
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 7);
  o.max_op_id = 5;
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 5);
  o.max_op_id = 0;
  o.min_age_ms = 0;
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 20), 10);
  assert_int_equal(bs__compact_horizon(&o, 10, 7, 3), 3);
}

/* Initial replication's options and horizon: the defaults, ratio 0, max_op_id above and below
 * the last op, 0 = the last op, and the largest max_op_id the front lets through. */
static void test_initial_plan(void **state) {
  bs_compact_options o, d;
  const uint64_t top = (1ull << 63) - 1;
  bs_error err = {0};
  (void)state;
  bs__compact_options_resolve(&d, NULL, NULL);
  bs__compact_initial_options(&o, 0, 1);
  assert_int_equal(o.min_bucket_changes, 1);
  assert_true(o.min_change_ratio == 0.0);
  assert_false(o.incremental_only);
  assert_null(o.buckets);
  assert_int_equal(o.memory_limit_mb, d.memory_limit_mb);
  assert_int_equal(o.max_ops_per_txn, d.max_ops_per_txn);
  assert_int_equal(bs__compact_horizon(&o, 20, 0, 20), 20); /* 0: the last op */
  assert_int_equal(bs__compact_horizon(&o, 0, 0, 0), 0);    /* nothing written */
  bs__compact_initial_options(&o, 1, 5);
  assert_int_equal(o.min_bucket_changes, 5);
  assert_int_equal(bs__compact_horizon(&o, 20, 0, 20), 1);
  bs__compact_initial_options(&o, 15, 1);
  assert_int_equal(bs__compact_horizon(&o, 20, 0, 20), 15); /* below the last op */
  bs__compact_initial_options(&o, 25, 1);
  assert_int_equal(bs__compact_horizon(&o, 20, 0, 20), 20); /* above it: capped */
  bs__compact_initial_options(&o, top, 1);
  assert_int_equal(bs__compact_horizon(&o, top, 0, top), top);
  assert_int_equal(bs__compact_horizon(&o, 3, 0, 3), 3);
  /* refused once a checkpoint exists, one at op 0 too; the message names stream and checkpoint */
  assert_int_equal(bs__compact_initial_check(7, 0, 0, &err), BS_OK);
  assert_int_equal(bs__compact_initial_check(7, 1, 0, &err), BS_ESTATE);
  assert_string_equal(err.msg, "stream 7 has a checkpoint (0): initial-replication compaction "
                               "only runs before the first one");
  assert_int_equal(bs__compact_initial_check(UINT32_MAX, 1, top, &err), BS_ESTATE);
  assert_non_null(strstr(err.msg, "stream 4294967295 has a checkpoint (9223372036854775807)"));
}

/* Selection: the growth of the count since the last compaction, nothing when no op came since;
 * due from min_bucket_changes of it and min_change_ratio of the count (0 and 1.0 included). */
static void test_selection(void **state) {
  const uint64_t top = (1ull << 63) - 1;
  bs_compact_options o;
  (void)state;
  assert_int_equal(bs__compact_changes(0, 0, 0, 0), 0);
  assert_int_equal(bs__compact_changes(1, 0, 1, 0), 1);
  assert_int_equal(bs__compact_changes(10, 4, 12, 8), 6);
  assert_int_equal(bs__compact_changes(10, 4, 8, 8), 0); /* no op since the last compaction */
  assert_int_equal(bs__compact_changes(3, 4, 12, 8), 0); /* the count fell (a fold) */
  assert_int_equal(bs__compact_changes(top, 0, top, top - 1), top);
  assert_int_equal(bs__compact_changes(top, top, top, 0), 0);
  bs__compact_options_resolve(&o, NULL, NULL);
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0.0;
  assert_false(bs__compact_bucket_due(&o, 0, 0, 0, 0)); /* an empty bucket */
  assert_true(bs__compact_bucket_due(&o, 1, 0, 1, 0));
  assert_true(bs__compact_bucket_due(&o, top, top - 1, top, 0)); /* 1 of 2^63-1, ratio 0 */
  assert_false(bs__compact_bucket_due(&o, top, top, top, 0));
  o.min_bucket_changes = 2;
  assert_false(bs__compact_bucket_due(&o, 1, 0, 1, 0));
  assert_true(bs__compact_bucket_due(&o, 2, 0, 2, 0));
  o.min_change_ratio = 1.0; /* every op of the bucket new */
  assert_true(bs__compact_bucket_due(&o, 2, 0, 2, 0));
  assert_false(bs__compact_bucket_due(&o, 3, 1, 3, 0));
  o.min_change_ratio = 0.5; /* inclusive */
  assert_true(bs__compact_bucket_due(&o, 4, 2, 5, 1));
  assert_false(bs__compact_bucket_due(&o, 5, 3, 5, 1));
  assert_false(bs__compact_bucket_due(&o, 4, 0, 5, 5)); /* marked at its last op */
}

static int stop_at(const bs_compact_stats *so_far, void *payload) {
  return so_far->ops_moved >= *(const uint64_t *)payload;
}

/* The op budget (incremental only, 0 = unbounded) and the progress callback's cancel. */
static void test_budget_progress(void **state) {
  bs_compact_options o;
  bs_compact_stats st = {0};
  bs_error err = {0};
  uint64_t limit = 1;
  (void)state;
  bs__compact_options_resolve(&o, NULL, NULL);
  o.op_budget = 5;
  assert_true(bs__compact_budget(&o) == UINT64_MAX); /* full compaction has no budget */
  o.incremental_only = 1;
  assert_int_equal(bs__compact_budget(&o), 5);
  o.op_budget = 0;
  assert_true(bs__compact_budget(&o) == UINT64_MAX);
  assert_int_equal(bs__compact_progress(&o, &st, &err), BS_OK); /* no callback */
  o.progress = stop_at;
  o.progress_payload = &limit;
  assert_int_equal(bs__compact_progress(&o, &st, &err), BS_OK);
  st.ops_moved = 1;
  assert_int_equal(bs__compact_progress(&o, &st, &err), BS_ECANCELED);
  assert_string_equal(err.msg, "bs_compact's opts->progress returned 1, which cancels the call");
}

/* Runs the reverse scan over ops[0..n) (ascending) and the forward fold; fills target[] (0 = kept)
 * and returns the run length folded (0: none). */
static size_t plan(bs__seen_set *s, const bs_op *ops, size_t n, uint64_t *target,
                   bs__compact_scan *scan, bs__clear_acc *clear) {
  size_t run = 0;
  memset(scan, 0, sizeof *scan);
  memset(clear, 0, sizeof *clear);
  bs__seen_clear(s);
  for (size_t k = n; k-- > 0;)
    if (!bs__compact_scan_op(scan, s, &ops[k])) break;
  for (size_t k = 0; k < n; k++) {
    target[k] = 0;
    bs__compact_superseded(s, &ops[k], &target[k]);
  }
  if (scan->run < BS_CLEAR_MIN_RUN) return 0;
  while (run < n && bs__compact_in_run(&ops[run], target[run])) {
    bs__clear_acc_add(clear, &ops[run], target[run], 10);
    run++;
  }
  return run >= BS_CLEAR_MIN_RUN ? run : 0;
}

/* contract.md 6: PUT r1, PUT r2, PUT r1, REMOVE r2, PUT r3 -> ops 1 and 2 become MOVEs to 3 and 4,
 * then fold into a CLEAR at 2 (targets 3 and 4: the CLEAR carries 4); 3, 4, 5 stay. */
static void test_move_and_clear(void **state) {
  bs_op ops[5] = {mk(1, BS_OP_PUT, "r1", 1, 0), mk(2, BS_OP_PUT, "r2", 2, 0),
                  mk(3, BS_OP_PUT, "r1", 4, 0), mk(4, BS_OP_REMOVE, "r2", 8, 0),
                  mk(5, BS_OP_PUT, "r3", 16, 0)};
  uint64_t target[5], start = 1, op = 2;
  bs__compact_scan scan;
  bs__clear_acc clear;
  bs__compact_delta d;
  bs__seen_set s;
  (void)state;
  bs__seen_init(&s, &bs__default_allocator, 1u << 20);
  assert_int_equal(plan(&s, ops, 5, target, &scan, &clear), 2);
  assert_int_equal(scan.max_moved, 2);
  assert_int_equal(target[0], 3);
  assert_int_equal(target[1], 4);
  assert_int_equal(target[2] + target[3] + target[4], 0);
  assert_int_equal(clear.first_op, 1);
  assert_int_equal(clear.last_op, 2);
  assert_int_equal(clear.checksum, 3);
  assert_int_equal(clear.target_op, 4);
  assert_int_equal(clear.n_folded, 2);
  assert_int_equal(clear.n_moved, 2);
  assert_int_equal(clear.bytes, 20);
  /* the compacted bucket: CLEAR(2, target 4), PUT r1 3, REMOVE r2 4, PUT r3 5. A second pass
   * folds the CLEAR with nothing (a run of one): no change */
  ops[1] = mk(2, BS_OP_CLEAR, NULL, 3, 4);
  assert_int_equal(plan(&s, ops + 1, 4, target, &scan, &clear), 0);
  assert_int_equal(scan.run, 1);
  assert_int_equal(scan.max_moved, 0);
  /* a REMOVE above the CLEAR, then a PUT: CLEAR + REMOVE fold again; n_folded counts the REMOVE
   * only, the span starts where the old CLEAR's did */
  ops[2] = mk(3, BS_OP_REMOVE, "r9", 4, 0);
  assert_int_equal(plan(&s, ops + 1, 4, target, &scan, &clear), 3);
  assert_int_equal(clear.last_op, 4);
  assert_int_equal(clear.n_folded, 2);
  assert_int_equal(clear.checksum, 3 + 4 + 8);
  assert_int_equal(clear.target_op, 4);
  memset(&d, 0, sizeof d);
  d.clear = clear;
  bs__compact_span(&d, &start, &op); /* the bucket's span 1..2 before the fold */
  assert_int_equal(start, 1);
  assert_int_equal(op, 4);
  start = op = 0;
  bs__compact_span(&d, &start, &op);
  assert_int_equal(start, 2);
  d.clear_dropped = 1; /* initial replication deleted the CLEAR */
  bs__compact_span(&d, &start, &op);
  assert_int_equal(start + op, 0);
  bs__seen_free(&s);
}

/* A retried transaction meets an op again: the row's latest is not superseded by itself. */
static void test_rescan(void **state) {
  bs_op a = mk(7, BS_OP_PUT, "r", 0, 0), b = mk(3, BS_OP_PUT, "r", 0, 0);
  bs_op mv = mk(5, BS_OP_MOVE, NULL, 0, 7);
  bs__compact_scan scan = {0, 0};
  uint64_t t = 0;
  bs__seen_set s;
  (void)state;
  bs__seen_init(&s, &bs__default_allocator, 1u << 20);
  assert_true(bs__compact_scan_op(&scan, &s, &a));
  assert_true(bs__compact_scan_op(&scan, &s, &a));
  assert_int_equal(scan.max_moved, 0); /* met again: still the row's latest */
  assert_int_equal(scan.run, 0);       /* a surviving PUT */
  assert_true(bs__compact_scan_op(&scan, &s, &mv));
  assert_true(bs__compact_scan_op(&scan, &s, &b));
  assert_int_equal(scan.max_moved, 3);
  assert_int_equal(scan.run, 2); /* the MOVE and the superseded PUT */
  assert_true(bs__compact_superseded(&s, &b, &t));
  assert_int_equal(t, 7);
  assert_false(bs__compact_superseded(&s, &mv, &t)); /* only PUT/REMOVE move */
  assert_false(bs__compact_superseded(&s, &a, &t));
  bs__seen_free(&s);
}

/* Initial replication: MOVE/CLEAR residue, superseded ops and a row's latest REMOVE go; with a
 * seen-set that can record nothing (limit 0), every PUT/REMOVE stays. */
static void test_initial(void **state) {
  const bs_op ops[6] = {mk(1, BS_OP_CLEAR, NULL, 0, 1), mk(2, BS_OP_PUT, "a", 0, 0),
                        mk(3, BS_OP_PUT, "b", 0, 0),    mk(4, BS_OP_REMOVE, "a", 0, 0),
                        mk(5, BS_OP_MOVE, NULL, 0, 6),  mk(6, BS_OP_PUT, "b", 0, 0)};
  const int want[6] = {1, 1, 1, 1, 1, 0}, want_full[6] = {1, 0, 0, 0, 1, 0};
  bs__seen_set s;
  (void)state;
  bs__seen_init(&s, &bs__default_allocator, 1u << 20);
  for (size_t k = 6; k-- > 0;) assert_int_equal(bs__compact_initial_drop(&s, &ops[k]), want[k]);
  /* a retried scan: the latest REMOVE is met again and still goes */
  assert_int_equal(bs__compact_initial_drop(&s, &ops[3]), 1);
  bs__seen_free(&s);
  bs__seen_init(&s, &bs__default_allocator, 0);
  for (size_t k = 6; k-- > 0;)
    assert_int_equal(bs__compact_initial_drop(&s, &ops[k]), want_full[k]);
  assert_true(s.full);
  bs__seen_free(&s);
}

static void test_incremental_entries(void **state) {
  bs_op put = mk(3, BS_OP_PUT, "r", 0, 0), rm = mk(3, BS_OP_REMOVE, "r", 0, 0);
  bs_op mv = mk(3, BS_OP_MOVE, NULL, 0, 4), cl = mk(3, BS_OP_CLEAR, NULL, 0, 4);
  (void)state;
  assert_true(bs__compact_entry_due(5, 5));
  assert_false(bs__compact_entry_due(6, 5));
  assert_true(bs__compact_entry_moves(&put, 4));
  assert_true(bs__compact_entry_moves(&rm, 4));
  assert_false(bs__compact_entry_moves(&put, 3)); /* not below its new op */
  assert_false(bs__compact_entry_moves(&put, 2));
  assert_false(bs__compact_entry_moves(&mv, 9)); /* already moved or folded */
  assert_false(bs__compact_entry_moves(&cl, 9));
  /* a PUT due to move is in the run (as its MOVE), one that is not ends it */
  assert_true(bs__compact_in_run(&put, 4));
  assert_false(bs__compact_in_run(&put, 0));
  assert_true(bs__compact_in_run(&rm, 0));
}

static void test_defrag_and_params(void **state) {
  (void)state;
  assert_false(bs__compact_defrag_due(0, 10, 0.5)); /* nothing live: nothing to re-emit */
  assert_false(bs__compact_defrag_due(1, 2, 1.0));  /* nothing would fold beyond the CLEAR */
  assert_true(bs__compact_defrag_due(1, 3, 0.5));
  assert_false(bs__compact_defrag_due(5, 10, 0.5)); /* the ratio is exclusive */
  assert_true(bs__compact_defrag_due(4, 10, 0.5));
  assert_false(bs__compact_defrag_due(1, 100, 0.0));
  assert_true(bs__compact_param_drop(1, 3));
  assert_true(bs__compact_param_drop(0, 0)); /* the newest is a tombstone */
  assert_false(bs__compact_param_drop(0, 1));
}

/* Row identities from edge values: every pair of distinct identities stays distinct, also when
 * the bytes are the same split differently across the three fields. */
static void test_identities(void **state) {
  static char big[BS_MAX_OBJECT_NAME], big2[BS_MAX_OBJECT_NAME];
  static char sk[255];
  const bs_val vals[] = {{"", 0},    {"a", 1},           {"ab", 2},
                         {"b", 1},   {"caf\xc3\xa9", 5}, {"1", 1},
                         {"1.0", 3}, {big, sizeof big},  {big2, sizeof big2}};
  const size_t nv = sizeof vals / sizeof *vals;
  bs__seen_set s;
  uint64_t id = 0, latest;
  (void)state;
  memset(big, 'x', sizeof big);
  memcpy(big2, big, sizeof big2);
  big2[sizeof big2 - 1] = 'y';
  memset(sk, 0xff, sizeof sk);
  bs__seen_init(&s, &bs__default_allocator, 64u << 20);
  /* every (object_type, object_id) pair, with a 0- and a 255-byte subkey: each is new once */
  for (int pass = 0; pass < 2; pass++) {
    id = 0;
    for (size_t i = 0; i < nv; i++)
      for (size_t j = 0; j < nv; j++)
        for (size_t k = 0; k < 2; k++) {
          bs_op op = mk(++id, BS_OP_PUT, "", 0, 0);
          op.object_type = vals[i];
          op.object_id = vals[j];
          op.subkey.data = k ? sk : NULL;
          op.subkey.size = k ? sizeof sk : 0;
          assert_int_equal(bs__seen_visit(&s, &op, &latest), pass);
          if (pass) assert_int_equal(latest, id);
        }
  }
  assert_false(s.full);
  assert_int_equal(s.rows.n, nv * nv * 2);
  bs__seen_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_horizon),           cmocka_unit_test(test_initial_plan),
      cmocka_unit_test(test_selection),         cmocka_unit_test(test_budget_progress),
      cmocka_unit_test(test_move_and_clear),    cmocka_unit_test(test_rescan),
      cmocka_unit_test(test_initial),           cmocka_unit_test(test_incremental_entries),
      cmocka_unit_test(test_defrag_and_params), cmocka_unit_test(test_identities),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
