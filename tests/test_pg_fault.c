/* test_pg_fault: the PostgreSQL backend (issue 14) across hosts and under faults, on the server
 * named by BS_TEST_PG_URL (`make pg-test` starts one with tests/pg_server.sh). Two bs_db handles
 * on one database stand for two hosts. Every interleaving is arranged, never timed: the
 * backend's test seam (bs__pg_set_hook, pg_internal.h) calls back at named points (a waiter
 * about to block on its socket, ...), and the test acts there; alarm() only turns a deadlock
 * into a failure. Each test gets a schema of its own, dropped at the end. Without
 * BS_TEST_PG_URL, or in a build without the backend, it says so and passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "storage.h"

#ifdef BS_HAVE_PG
#include <limits.h>
#include <pthread.h>

#include "pg_internal.h"

static const char *base_url;
static int schema_seq;

typedef struct pgt {
  char schema[64];
  char url[1024];
  PGconn *admin; /* on base_url, with search_path set to the test's schema */
} pgt;

static void admin_exec(PGconn *c, const char *sql) {
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = PQresultStatus(r);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
}

static int setup(void **state) {
  pgt *t = calloc(1, sizeof *t);
  char sql[256];
  assert_non_null(t);
  snprintf(t->schema, sizeof t->schema, "bs_f%ld_%d", (long)getpid(), ++schema_seq);
  snprintf(t->url, sizeof t->url, "%s%coptions=-csearch_path%%3D%s", base_url,
           strchr(base_url, '?') ? '&' : '?', t->schema);
  t->admin = PQconnectdb(base_url);
  assert_int_equal(PQstatus(t->admin), CONNECTION_OK);
  PQclear(PQexec(t->admin, "SET client_min_messages = warning"));
  snprintf(sql, sizeof sql, "CREATE SCHEMA %s; SET search_path = %s", t->schema, t->schema);
  admin_exec(t->admin, sql);
  alarm(300); /* a deadlock fails the test instead of hanging it */
  *state = t;
  return 0;
}

static int teardown(void **state) {
  pgt *t = *state;
  char sql[256];
  alarm(0);
  if (PQstatus(t->admin) != CONNECTION_OK) PQreset(t->admin); /* after a server restart */
  snprintf(sql, sizeof sql, "DROP SCHEMA %s CASCADE", t->schema);
  admin_exec(t->admin, sql);
  PQfinish(t->admin);
  free(t);
  return 0;
}

static bs_db *open_ok(pgt *t) {
  bs_error err = {0};
  bs_db *db = NULL;
  int rc = bs_open(&db, t->url, NULL, &err);
  if (rc != BS_OK) fail_msg("bs_open: %s (%s)", bs_strerror(rc), err.msg);
  return db;
}

/* A stream with a writer whose commits make checkpoints. */
static void stream_ready(bs_db *db, const char *name, uint32_t id, bs_storage **st, bs_writer **w) {
  bs_error err = {0};
  assert_int_equal(bs_stream_create(NULL, db, name, NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(st, db, id, &err), BS_OK);
  assert_int_equal(bs_writer_open(w, *st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(*w, (bs_val){"", 0}, &err), BS_OK);
}

/* One save of row id into bucket b (a PUT), then a commit at lsn; returns the checkpoint. */
static uint64_t put_commit(bs_writer *w, const char *b, const char *id, const char *lsn) {
  bs_error err = {0};
  bs_row row;
  bs_save sv = BS_SAVE_INIT;
  bs_commit_result r;
  row.bucket = bs__val_str(b);
  row.object_type = bs__val_str("t");
  row.object_id = bs__val_str(id);
  row.data = bs__val_str("{}");
  sv.table = bs__val_str("t");
  sv.after_id = bs__val_str(id);
  sv.rows = &row;
  sv.n_rows = 1;
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
  assert_int_equal(bs_writer_commit(w, bs__val_str(lsn), NULL, &r, &err), BS_OK);
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* ---- the seam: counts a point's calls, lets the test wait for the n-th, acts there ---- */

typedef struct seam {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char *point;
  int calls;
  /* at the act_at-th call: terminate the connection's server process (pg_terminate_backend) */
  int act_at;
  PGconn *admin;
} seam;

static void seam_init(seam *s, const char *point) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->point = point;
}

static void seam_free(seam *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
}

static void terminate_backend(PGconn *admin, int pid) {
  char sql[96];
  /* waits (up to 10 s) until the process is gone, so the client sees a closed connection */
  snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d, 10000)", pid);
  admin_exec(admin, sql);
}

static void seam_fn(const char *point, PGconn *c, void *payload) {
  seam *s = payload;
  int n;
  if (strcmp(point, s->point)) return;
  pthread_mutex_lock(&s->mu);
  n = ++s->calls;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (n == s->act_at) terminate_backend(s->admin, PQbackendPID(c));
}

static void seam_wait(seam *s, int calls) {
  pthread_mutex_lock(&s->mu);
  while (s->calls < calls) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static int seam_calls(seam *s) {
  int n;
  pthread_mutex_lock(&s->mu);
  n = s->calls;
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* ---- 1. checkpoint notification across hosts ---- */

typedef struct waiter {
  pthread_t th;
  bs_storage *st;
  bs_checkpoint known, out;
  int timeout_ms, rc;
  bs_error err;
} waiter;

static void *wait_main(void *arg) {
  waiter *w = arg;
  w->rc = bs_wait_checkpoint(w->st, &w->known, w->timeout_ms, &w->out, &w->err);
  return NULL;
}

static void wait_start(waiter *w, bs_storage *st) {
  bs_error err = {0};
  memset(w, 0, sizeof *w);
  w->st = st;
  w->timeout_ms = INT_MAX; /* only a notification ends it (alarm() guards a lost one) */
  assert_int_equal(bs_get_checkpoint(st, &w->known, &err), BS_OK);
  assert_int_equal(pthread_create(&w->th, NULL, wait_main, w), 0);
}

static void assert_checkpoint(const bs_checkpoint *cp, uint64_t op, const char *lsn) {
  assert_int_equal(cp->op_id, op);
  assert_true(cp->has_lsn);
  assert_int_equal(cp->lsn_size, strlen(lsn));
  assert_memory_equal(cp->lsn, lsn, cp->lsn_size);
}

/* A waiter on host B blocks on its socket; host A commits; the wait returns that checkpoint. A
 * commit of another stream of the same database wakes the socket but not the wait. The wait
 * never polls: with an unbounded timeout, only the notification can end it. */
static void t_wait_across_hosts(void **state) {
  pgt *t = *state;
  bs_db *a = open_ok(t), *b = open_ok(t);
  bs_storage *sa, *sa2, *sb;
  bs_writer *wa, *wa2;
  bs_error err = {0};
  waiter w;
  seam s;
  uint64_t cp;
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  seam_init(&s, "wait");
  bs__pg_set_hook(b, seam_fn, &s);

  wait_start(&w, sb);
  seam_wait(&s, 1); /* the waiter is about to block: its read saw the old checkpoint */
  /* another stream's checkpoint (stream 2's first: it becomes ACTIVE, stream 1 STOPPED) */
  stream_ready(a, "s2", 2, &sa2, &wa2);
  put_commit(wa2, "b", "x", "00000001");
  seam_wait(&s, 2); /* woken by stream 2's notification, blocked again */
  cp = put_commit(wa, "b", "r1", "00000002");
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_int_equal(w.rc, BS_OK);
  assert_checkpoint(&w.out, cp, "00000002");
  assert_int_equal(seam_calls(&s), 2);

  /* an LSN-only change (an empty commit at the same op id) ends a wait too */
  wait_start(&w, sb);
  seam_wait(&s, 3);
  assert_int_equal(bs_writer_keepalive(wa, bs__val_str("00000003"), NULL, &err), BS_OK);
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_int_equal(w.rc, BS_OK);
  assert_checkpoint(&w.out, cp, "00000003");

  /* a commit in the waiter's own process (the same handle) wakes it the same way */
  bs__pg_set_hook(a, seam_fn, &s);
  wait_start(&w, sa);
  seam_wait(&s, 4);
  cp = put_commit(wa, "b", "r2", "00000004");
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_checkpoint(&w.out, cp, "00000004");

  /* a known checkpoint that is already old returns at once, without blocking */
  w.known.op_id = 0;
  assert_int_equal(bs_wait_checkpoint(sb, &w.known, INT_MAX, &w.out, &err), BS_OK);
  assert_checkpoint(&w.out, cp, "00000004");
  /* timeout 0 and a short one: the current checkpoint, unchanged */
  assert_int_equal(bs_wait_checkpoint(sb, &w.out, 0, &w.out, &err), BS_OK);
  assert_checkpoint(&w.out, cp, "00000004");
  assert_int_equal(bs_wait_checkpoint(sb, &w.out, 1, &w.out, &err), BS_OK);
  assert_checkpoint(&w.out, cp, "00000004");
  bs__pg_set_hook(a, NULL, NULL);
  bs__pg_set_hook(b, NULL, NULL);
  bs_writer_close(wa2);
  bs_writer_close(wa);
  bs_storage_close(sa2);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
  seam_free(&s);
}

/* Before the first checkpoint (known NULL): a commit on the other host ends the wait. The
 * server terminating the waiter's connection ends it with BS_EIO and libpq's message; the next
 * wait opens a new connection. */
static void t_wait_first_and_lost(void **state) {
  pgt *t = *state;
  bs_db *a = open_ok(t), *b = open_ok(t);
  bs_storage *sa, *sb;
  bs_writer *wa;
  bs_error err = {0};
  bs_checkpoint out;
  waiter w;
  seam s;
  uint64_t cp;
  int calls;
  stream_ready(a, "s", 1, &sa, &wa);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  assert_int_equal(bs_wait_checkpoint(sb, NULL, 0, &out, &err), BS_OK);
  assert_int_equal(out.op_id, 0);
  assert_false(out.has_lsn);
  seam_init(&s, "wait");
  bs__pg_set_hook(b, seam_fn, &s);
  wait_start(&w, sb);
  seam_wait(&s, 1);
  cp = put_commit(wa, "b", "r0", "");
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_int_equal(w.rc, BS_OK);
  assert_checkpoint(&w.out, cp, ""); /* the empty LSN is a value */

  s.admin = t->admin;
  s.act_at = 2; /* the next block: its connection is terminated under it */
  wait_start(&w, sb);
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_int_equal(w.rc, BS_EIO);
  assert_non_null(strstr(w.err.msg, "waiting for a checkpoint: PostgreSQL"));
  /* the next wait works on a new connection and is woken again */
  s.act_at = 0;
  calls = seam_calls(&s);
  wait_start(&w, sb);
  seam_wait(&s, calls + 1);
  cp = put_commit(wa, "b", "r1", "1");
  assert_int_equal(pthread_join(w.th, NULL), 0);
  assert_int_equal(w.rc, BS_OK);
  assert_checkpoint(&w.out, cp, "1");
  bs__pg_set_hook(b, NULL, NULL);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
  seam_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_wait_across_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(t_wait_first_and_lost, setup, teardown),
  };
  base_url = getenv("BS_TEST_PG_URL");
  if (!base_url || !*base_url) {
    printf("test_pg_fault: skipped (BS_TEST_PG_URL is not set; tests/pg_server.sh run starts a "
           "server)\n");
    return 0;
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  printf("test_pg_fault: this build has no PostgreSQL backend\n");
  return 0;
}
#endif
