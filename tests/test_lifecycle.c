/* test_lifecycle: lifecycle.c, the one state machine of a stream (contract.md 1, 4.4, 8), on
 * every event from every state, against a table written from the contract: the stream's next
 * state, what happens to the database's other streams, and which states refuse the event; and
 * the plan of a commit (4.4): blocked or not, a checkpoint or not, the states, the resume LSN,
 * what its checkpoint purges (4.3); the change-record cap (5.1); aged checkpoints and requests
 * (6, 7). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

enum {
  P = BS_STREAM_PROCESSING,
  A = BS_STREAM_ACTIVE,
  E = BS_STREAM_ERRORED,
  S = BS_STREAM_STOPPED,
  T = BS_STREAM_TERMINATED
};

#define NONE                                                                                       \
  { 0, P, A, E, S, T } /* the other streams keep their states */

typedef struct want {
  bs__stream_event ev;
  unsigned from;
  int rc;            /* BS_OK, BS_ESTATE (refused), BS_ECORRUPT (no state) */
  unsigned to;       /* when BS_OK */
  uint8_t others[6]; /* when BS_OK */
} want;

static const want CASES[] = {
    /* create: the new stream PROCESSING; an older PROCESSING one stops (4.4) */
    {BS__STREAM_CREATE, 0, BS_OK, P, {0, S, A, E, S, T}},
    {BS__STREAM_CREATE, P, BS_ECORRUPT, 0, NONE},
    {BS__STREAM_CREATE, T, BS_ECORRUPT, 0, NONE},
    /* a writer's call: allowed until the stream is terminated; changes no state */
    {BS__STREAM_WRITE, P, BS_OK, P, NONE},
    {BS__STREAM_WRITE, A, BS_OK, A, NONE},
    {BS__STREAM_WRITE, E, BS_OK, E, NONE},
    {BS__STREAM_WRITE, S, BS_OK, S, NONE},
    {BS__STREAM_WRITE, T, BS_ESTATE, 0, NONE},
    /* a checkpoint: the first of a PROCESSING stream activates it and stops the served ones */
    {BS__STREAM_CHECKPOINT, P, BS_OK, A, {0, P, S, S, S, T}},
    {BS__STREAM_CHECKPOINT, A, BS_OK, A, NONE},
    {BS__STREAM_CHECKPOINT, E, BS_OK, E, NONE},
    {BS__STREAM_CHECKPOINT, S, BS_OK, S, NONE},
    {BS__STREAM_CHECKPOINT, T, BS_ESTATE, 0, NONE},
    /* report_error: ACTIVE becomes ERRORED (still served), nothing else changes (8) */
    {BS__STREAM_ERROR, P, BS_OK, P, NONE},
    {BS__STREAM_ERROR, A, BS_OK, E, NONE},
    {BS__STREAM_ERROR, E, BS_OK, E, NONE},
    {BS__STREAM_ERROR, S, BS_OK, S, NONE},
    {BS__STREAM_ERROR, T, BS_OK, T, NONE},
    /* terminate: from anywhere, for good */
    {BS__STREAM_TERMINATE, P, BS_OK, T, NONE},
    {BS__STREAM_TERMINATE, A, BS_OK, T, NONE},
    {BS__STREAM_TERMINATE, E, BS_OK, T, NONE},
    {BS__STREAM_TERMINATE, S, BS_OK, T, NONE},
    {BS__STREAM_TERMINATE, T, BS_OK, T, NONE},
};

static void test_every_case(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
    const want *c = &CASES[i];
    bs__stream_step st;
    bs_error err;
    int rc, same = 1;
    memset(&st, 0xee, sizeof st);
    rc = bs__stream_transition(&st, 7, c->from, c->ev, &err);
    if (rc != c->rc) fail_msg("case %zu: status %d, expected %d", i, rc, c->rc);
    if (rc == BS_ESTATE) assert_string_equal(err.msg, "stream 7 is terminated");
    if (rc != BS_OK) {
      assert_int_equal(st.others[0], 0xee); /* *out untouched */
      continue;
    }
    if ((unsigned)st.to != c->to) fail_msg("case %zu: to %u, expected %u", i, st.to, c->to);
    for (unsigned s = 0; s < BS__STREAM_STATES; s++) {
      if (st.others[s] != c->others[s])
        fail_msg("case %zu: another stream in %u goes to %u, expected %u", i, s, st.others[s],
                 c->others[s]);
      same &= c->others[s] == s;
    }
    assert_int_equal(st.others_change, !same);
  }
}

/* A stored state that is no state (0, above TERMINATED) is corruption, for every event but
 * create (whose stream has no state yet). */
static void test_no_state(void **state) {
  static const bs__stream_event evs[] = {BS__STREAM_WRITE, BS__STREAM_CHECKPOINT, BS__STREAM_ERROR,
                                         BS__STREAM_TERMINATE};
  (void)state;
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++) {
    bs__stream_step st;
    bs_error err;
    assert_int_equal(bs__stream_transition(&st, 3, 0, evs[i], &err), BS_ECORRUPT);
    assert_int_equal(bs__stream_transition(&st, 3, T + 1, evs[i], &err), BS_ECORRUPT);
    assert_non_null(strstr(err.msg, "stream 3"));
    assert_int_equal(bs__stream_transition(&st, 3, 255, evs[i], NULL), BS_ECORRUPT);
  }
}

/* The maps PostgreSQL's statements apply without reading the state first. */
static void test_maps(void **state) {
  uint8_t m[BS__STREAM_STATES];
  static const uint8_t error[] = {0, P, E, E, S, T}, terminate[] = {0, T, T, T, T, T},
                       write[] = {0, P, A, E, S, 0};
  (void)state;
  bs__stream_map(m, BS__STREAM_ERROR);
  assert_memory_equal(m, error, sizeof m);
  bs__stream_map(m, BS__STREAM_TERMINATE);
  assert_memory_equal(m, terminate, sizeof m);
  bs__stream_map(m, BS__STREAM_WRITE);
  assert_memory_equal(m, write, sizeof m);
}

/* ---- A commit (contract.md 4.4) ---- */

#define L(s) ((bs_val){s, sizeof(s) - 1})
static const bs_val UNSET = {NULL, 0};

static bs__stream_row cin(unsigned st, int snap, bs_val ncb, bs_val cpl, bs_val resume,
                          uint64_t head, uint64_t last) {
  bs__stream_row in = {.state = st,
                       .snapshot_done = snap,
                       .no_checkpoint_before = ncb,
                       .checkpoint_lsn = cpl,
                       .resume_lsn = resume,
                       .op_head = head,
                       .last_checkpoint_op = last};
  return in;
}

static bs__commit_plan plan_of(bs__stream_row in, const char *lsn, int create_empty) {
  bs__commit_plan p;
  bs_error err;
  bs_val l = {lsn, strlen(lsn)};
  if (bs__plan_commit_row(&p, 9, &in, l, create_empty, &err) != BS_OK)
    fail_msg("refused: %s", err.msg);
  return p;
}

/* Blocked, in bs_block_reason's order: the snapshot, no_checkpoint_before, the last checkpoint's
 * LSN (an LSN at either bound is not below it). */
static void test_commit_blocked(void **state) {
  (void)state;
  assert_int_equal(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 5, 0), "5", 1).blocked,
                   BS_BLOCKED_SNAPSHOT);
  assert_int_equal(plan_of(cin(A, 0, L("9"), L("9"), UNSET, 5, 0), "1", 1).blocked,
                   BS_BLOCKED_SNAPSHOT);
  assert_int_equal(plan_of(cin(A, 1, L("5"), L("9"), UNSET, 5, 0), "4", 1).blocked,
                   BS_BLOCKED_NO_CHECKPOINT_BEFORE);
  assert_int_equal(plan_of(cin(A, 1, L("5"), L("9"), UNSET, 5, 0), "5", 1).blocked,
                   BS_BLOCKED_CHECKPOINT_LSN);
  assert_int_equal(plan_of(cin(A, 1, L("5"), L("9"), UNSET, 5, 0), "9", 1).blocked,
                   BS_BLOCKED_NONE);
  /* a shorter prefix sorts first */
  assert_int_equal(plan_of(cin(A, 1, L("55"), UNSET, UNSET, 5, 0), "5", 1).blocked,
                   BS_BLOCKED_NO_CHECKPOINT_BEFORE);
  assert_int_equal(plan_of(cin(A, 1, UNSET, L("55"), UNSET, 5, 0), "56", 1).blocked,
                   BS_BLOCKED_NONE);
  /* an empty LSN that is set bounds nothing from below; unset bounds nothing at all */
  assert_int_equal(plan_of(cin(A, 1, L(""), L(""), UNSET, 5, 0), "", 1).blocked, BS_BLOCKED_NONE);
  for (int ce = 0; ce < 2; ce++) /* a blocked commit makes no checkpoint */
    assert_false(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 5, 0), "5", ce).checkpoint);
}

/* Whether an unblocked commit makes a checkpoint: the first one always; later ones when ops were
 * persisted since the last, or create_empty. */
static void test_commit_checkpoint(void **state) {
  (void)state;
  assert_true(plan_of(cin(A, 1, UNSET, UNSET, UNSET, 0, 0), "1", 0).checkpoint);
  assert_true(plan_of(cin(A, 1, UNSET, UNSET, UNSET, 7, 7), "1", 0).checkpoint); /* cleared */
  assert_false(plan_of(cin(A, 1, UNSET, L("1"), UNSET, 7, 7), "2", 0).checkpoint);
  assert_true(plan_of(cin(A, 1, UNSET, L("1"), UNSET, 7, 7), "2", 1).checkpoint);
  assert_true(plan_of(cin(A, 1, UNSET, L("1"), UNSET, 8, 7), "2", 0).checkpoint);
  assert_true(plan_of(cin(A, 1, UNSET, L("2"), UNSET, 8, 7), "2", 0).checkpoint); /* same LSN */
}

/* The states: a checkpoint activates a PROCESSING stream; without one nothing changes; a
 * terminated stream refuses the commit. */
static void test_commit_states(void **state) {
  bs__commit_plan p;
  bs__stream_row in = cin(P, 1, UNSET, UNSET, UNSET, 3, 0);
  bs_error err;
  (void)state;
  p = plan_of(in, "1", 0);
  assert_true(p.checkpoint);
  assert_int_equal(p.step.to, A);
  assert_true(p.step.others_change);
  assert_int_equal(p.step.others[A], S);
  assert_int_equal(p.step.others[E], S);
  in.snapshot_done = 0;
  p = plan_of(in, "1", 0);
  assert_int_equal(p.step.to, P);
  assert_false(p.step.others_change);
  p = plan_of(cin(E, 1, UNSET, UNSET, UNSET, 3, 0), "1", 0);
  assert_true(p.checkpoint);
  assert_int_equal(p.step.to, E);
  assert_false(p.step.others_change);
  in = cin(T, 1, UNSET, UNSET, UNSET, 3, 0);
  memset(&p, 0xee, sizeof p);
  assert_int_equal(bs__plan_commit_row(&p, 9, &in, L("1"), 1, &err), BS_ESTATE);
  assert_string_equal(err.msg, "stream 9 is terminated");
  assert_int_equal(p.step.others[0], 0xee);
}

/* Every commit raises the resume LSN, blocked or not; it never goes down. */
static void test_commit_resume(void **state) {
  (void)state;
  assert_true(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 3, 0), "1", 0).raise_resume);
  assert_true(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 3, 0), "", 0).raise_resume);
  assert_true(plan_of(cin(A, 0, UNSET, UNSET, L("b"), 3, 0), "c", 0).raise_resume);
  assert_true(plan_of(cin(A, 0, UNSET, UNSET, L("b"), 3, 0), "ba", 0).raise_resume);
  assert_false(plan_of(cin(A, 0, UNSET, UNSET, L("b"), 3, 0), "b", 0).raise_resume);
  assert_false(plan_of(cin(A, 0, UNSET, UNSET, L("b"), 3, 0), "a", 0).raise_resume);
  assert_false(plan_of(cin(A, 1, UNSET, UNSET, L("ba"), 3, 0), "b", 0).raise_resume);
  assert_true(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 3, 0), "", 0).raise_resume);
  assert_false(plan_of(cin(A, 0, UNSET, UNSET, L(""), 3, 0), "", 0).raise_resume);
}

static bs__lsn_plan lsn_plan(unsigned st, bs_val ncb, int snapshot_done, const char *lsn) {
  bs__stream_row row = {.state = st, .no_checkpoint_before = ncb};
  bs__lsn_plan p;
  bs_error err;
  bs_val l = {lsn, strlen(lsn)};
  if (bs__plan_lsn(&p, 9, &row, snapshot_done, l, &err) != BS_OK) fail_msg("refused: %s", err.msg);
  return p;
}

/* snapshot_done raises no_checkpoint_before, never lowers it; resume_lsn sets the resume LSN as
 * given and leaves the rest; both are writes a terminated stream refuses (contract.md 4.4). */
static void test_snapshot_done_resume(void **state) {
  static const unsigned live[] = {P, A, E, S};
  bs__stream_row row = {.state = T};
  bs__lsn_plan p;
  bs_error err;
  (void)state;
  for (size_t i = 0; i < sizeof live / sizeof *live; i++) {
    p = lsn_plan(live[i], UNSET, 1, "");
    assert_true(p.snapshot_done && p.no_checkpoint_before && !p.resume_lsn);
    p = lsn_plan(live[i], L("b"), 1, "ba");
    assert_true(p.snapshot_done && p.no_checkpoint_before && !p.resume_lsn);
    p = lsn_plan(live[i], L("b"), 1, "b");
    assert_true(p.snapshot_done && !p.no_checkpoint_before && !p.resume_lsn);
    p = lsn_plan(live[i], L("b"), 1, "a");
    assert_true(p.snapshot_done && !p.no_checkpoint_before && !p.resume_lsn);
    p = lsn_plan(live[i], L(""), 1, "");
    assert_false(p.no_checkpoint_before);
    p = lsn_plan(live[i], L("b"), 0, "a");
    assert_true(!p.snapshot_done && !p.no_checkpoint_before && p.resume_lsn);
  }
  for (int snap = 0; snap < 2; snap++) {
    memset(&p, 0xee, sizeof p);
    assert_int_equal(bs__plan_lsn(&p, 9, &row, snap, L("1"), &err), BS_ESTATE);
    assert_string_equal(err.msg, "stream 9 is terminated");
    assert_int_equal(p.resume_lsn, (int)0xeeeeeeee);
  }
}

/* What a checkpoint purges (4.3): the soft-deleted records whose mark (the op head at the delete)
 * is at or below its op id; a commit without a checkpoint purges nothing. */
static void test_commit_purge(void **state) {
  (void)state;
  assert_int_equal(plan_of(cin(A, 1, UNSET, UNSET, UNSET, 7, 0), "1", 0).purge_to, 7);
  assert_int_equal(plan_of(cin(A, 1, UNSET, L("1"), UNSET, 7, 7), "2", 1).purge_to, 7);
  assert_int_equal(plan_of(cin(A, 1, UNSET, L("1"), UNSET, 7, 7), "2", 0).purge_to, 0);
  assert_int_equal(plan_of(cin(A, 0, UNSET, UNSET, UNSET, 7, 0), "1", 1).purge_to, 0);
}

static void test_served(void **state) {
  (void)state;
  for (unsigned s = 0; s <= T + 1; s++) assert_int_equal(bs__stream_served(s), s == A || s == E);
}

/* What a clear and a terminate leave of a stream's row: a clear the checkpoint state of a new
 * stream with the op head kept and the change fence at it, its state unchanged (terminated
 * too); terminate only the state, from any state. */
static bs__stream_row full_row(unsigned st) {
  return (bs__stream_row){.state = st,
                          .snapshot_done = 1,
                          .op_head = 40,
                          .checkpoint = 30,
                          .last_checkpoint_op = 30,
                          .checkpoint_lsn = L("c"),
                          .resume_lsn = L("r"),
                          .no_checkpoint_before = L("n"),
                          .param_horizon = 20,
                          .param_cursor = 21,
                          .compact_horizon = 22,
                          .changes_fence = 10};
}

static void test_reset(void **state) {
  bs__stream_row w, cleared = {.op_head = 40, .changes_fence = 40};
  bs_error err;
  (void)state;
  for (unsigned s = P; s <= T; s++) {
    w = full_row(s);
    assert_int_equal(bs__stream_reset(&w, 3, 1, 0, &err), BS_OK);
    cleared.state = s;
    assert_memory_equal(&w, &cleared, sizeof w);
    w = full_row(s);
    assert_int_equal(bs__stream_reset(&w, 3, 0, 1, &err), BS_OK);
    assert_int_equal(w.state, T);
    w.state = s;
    {
      bs__stream_row kept = full_row(s);
      assert_memory_equal(&w, &kept, sizeof w);
    }
    w = full_row(s);
    assert_int_equal(bs__stream_reset(&w, 3, 1, 1, &err), BS_OK);
    cleared.state = T;
    assert_memory_equal(&w, &cleared, sizeof w);
  }
  for (unsigned s = 0; s <= T + 1; s += T + 1) { /* no state: corruption, the row untouched */
    bs__stream_row kept = full_row(s);
    w = kept;
    assert_int_equal(bs__stream_reset(&w, 3, 1, 1, &err), BS_ECORRUPT);
    assert_memory_equal(&w, &kept, sizeof w);
  }
}

/* The cap of contract.md 5.1: 1000 names of a kind are listed, 1001 and more are too many, and a
 * collector that stops at bs__changes_enough() names has seen enough to say so. */
static void test_changes_cap(void **state) {
  (void)state;
  for (size_t n = 0; n <= 1000; n++) assert_false(bs__changes_too_many(n));
  assert_true(bs__changes_too_many(1001));
  assert_true(bs__changes_too_many(SIZE_MAX));
  assert_int_equal(bs__changes_enough(), 1001);
}

/* Contract.md 5.1: a range from below the fence invalidates, one from the fence does not; the
 * users filed at `from` itself are listed. */
static void test_changes_range(void **state) {
  (void)state;
  assert_true(bs__changes_fenced(4, 5));
  assert_false(bs__changes_fenced(5, 5));
  assert_false(bs__changes_fenced(0, 0));
  assert_int_equal(bs__changes_users_from(7), 7);
  assert_int_equal(bs__changes_users_from(0), 0);
}

/* Contract.md 6: a compaction at now with min_age_ms ages the checkpoints made at or before
 * now - min_age_ms (min_age_ms 0: every one up to now). Contract.md 7: a request made at t is
 * deleted by delete_checkpoint_requests_before(t + 1), not by (t); a record without a time
 * never; a managed one only once processed. */
static void test_aged(void **state) {
  (void)state;
  assert_true(bs__aged(5000 - 300, bs__aged_cutoff(5000, 300)));
  assert_false(bs__aged(5000 - 299, bs__aged_cutoff(5000, 300)));
  assert_true(bs__aged(5000, bs__aged_cutoff(5000, 0)));
  assert_false(bs__aged(5001, bs__aged_cutoff(5000, 0)));
  assert_false(bs__aged(-1, bs__aged_cutoff(5000, 0)));
  assert_false(bs__aged(0, bs__aged_cutoff(5000, INT64_MAX)));
  assert_true(bs__request_expired(1999, 1, 2000));
  assert_false(bs__request_expired(2000, 1, 2000));
  assert_false(bs__request_expired(1999, 0, 2000)); /* pending */
  assert_false(bs__request_expired(-1, 1, 2000));   /* no requested_at */
  assert_true(bs__request_expired(0, 1, 1));
  assert_false(bs__request_expired(0, 1, 0));
  assert_false(bs__request_expired(0, 1, INT64_MIN));
  assert_true(bs__request_expired(INT64_MAX - 1, 1, INT64_MAX));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_case),     cmocka_unit_test(test_no_state),
      cmocka_unit_test(test_maps),           cmocka_unit_test(test_served),
      cmocka_unit_test(test_commit_blocked), cmocka_unit_test(test_commit_checkpoint),
      cmocka_unit_test(test_commit_states),  cmocka_unit_test(test_commit_resume),
      cmocka_unit_test(test_reset),          cmocka_unit_test(test_commit_purge),
      cmocka_unit_test(test_changes_cap),    cmocka_unit_test(test_aged),
      cmocka_unit_test(test_changes_range),  cmocka_unit_test(test_snapshot_done_resume),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
