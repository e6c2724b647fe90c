/* test_lifecycle: lifecycle.c, the one state machine of a stream (contract.md 1, 4.4, 8), on
 * every event from every state, against a table written from the contract: the stream's next
 * state, what happens to the database's other streams, and which states refuse the event. */
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

static void test_served(void **state) {
  (void)state;
  for (unsigned s = 0; s <= T + 1; s++) assert_int_equal(bs__stream_served(s), s == A || s == E);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_case),
      cmocka_unit_test(test_no_state),
      cmocka_unit_test(test_maps),
      cmocka_unit_test(test_served),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
