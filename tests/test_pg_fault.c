/* test_pg_fault: the PostgreSQL backend across hosts and under faults, on the server
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
#include "util_fault.h"
#include "util_pg.h"

#ifdef BS_HAVE_PG
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "pg_internal.h"

/* every test under alarm(): a deadlock fails it instead of hanging it */
static int setup(void **state) {
  alarm(300);
  return pgt_setup(state);
}

static int teardown(void **state) {
  alarm(0);
  return pgt_teardown(state);
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
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str(lsn), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* One save updating row id of table t (in place) with data, into bucket b; no commit. */
static void save_update(bs_writer *w, const char *b, const char *id, const char *data) {
  bs_error err = {0};
  bs_row row;
  bs_save sv = BS_SAVE_INIT;
  row.bucket = bs__val_str(b);
  row.object_type = bs__val_str("t");
  row.object_id = bs__val_str(id);
  row.data = bs__val_str(data);
  sv.table = bs__val_str("t");
  sv.tag = BS_UPDATE;
  sv.after_id = bs__val_str(id);
  sv.rows = &row;
  sv.n_rows = 1;
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
}

/* ---- the seam: counts a point's calls, lets the test wait for the n-th, acts there ---- */

typedef struct seam {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char *point;
  int calls;
  /* at the act_at-th call: terminate the connection's server process (pg_terminate_backend),
   * or with restart set, restart the server (the command of BS_TEST_PG_RESTART) */
  int act_at;
  PGconn *admin;
  const char *restart;
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

static void seam_fn(const char *point, PGconn *c, void *payload) {
  seam *s = payload;
  int n;
  if (strcmp(point, s->point)) return;
  pthread_mutex_lock(&s->mu);
  n = ++s->calls;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (n != s->act_at) return;
  if (s->restart)
    assert_int_equal(system(s->restart), 0);
  else
    pgt_terminate(s->admin, PQbackendPID(c));
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
  w->rc = bs_wait_checkpoint(&w->out, w->st, &w->known, w->timeout_ms, &w->err);
  return NULL;
}

static void wait_start(waiter *w, bs_storage *st) {
  bs_error err = {0};
  memset(w, 0, sizeof *w);
  w->st = st;
  w->timeout_ms = INT_MAX; /* only a notification ends it (alarm() guards a lost one) */
  assert_int_equal(bs_get_checkpoint(&w->known, st, &err), BS_OK);
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
  bs_db *a = pgt_open(t->url, 0), *b = pgt_open(t->url, 0);
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
  assert_int_equal(bs_writer_keepalive(NULL, wa, bs__val_str("00000003"), &err), BS_OK);
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
  assert_int_equal(bs_wait_checkpoint(&w.out, sb, &w.known, INT_MAX, &err), BS_OK);
  assert_checkpoint(&w.out, cp, "00000004");
  /* timeout 0 and a short one: the current checkpoint, unchanged */
  assert_int_equal(bs_wait_checkpoint(&w.out, sb, &w.out, 0, &err), BS_OK);
  assert_checkpoint(&w.out, cp, "00000004");
  assert_int_equal(bs_wait_checkpoint(&w.out, sb, &w.out, 1, &err), BS_OK);
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
  bs_db *a = pgt_open(t->url, 0), *b = pgt_open(t->url, 0);
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
  assert_int_equal(bs_wait_checkpoint(&out, sb, NULL, 0, &err), BS_OK);
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

/* ---- 2. the writer lock across hosts ---- */

/* The server process of the session holding stream 1's streaming writer lock (pg_internal.h:
 * the keys schema oid and 4 * stream), 0 when none holds it. */
static int lock_pid(pgt *t) {
  return (int)pgt_int(t->admin,
                      "SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory'"
                      " AND granted AND objsubid = 2 AND objid = 4 AND classid ="
                      " (SELECT oid FROM pg_namespace WHERE nspname = current_schema())");
}

static void save_put(bs_writer *w, const char *b, const char *id) {
  bs_error err = {0};
  bs_row row;
  bs_save sv = BS_SAVE_INIT;
  row.bucket = bs__val_str(b);
  row.object_type = bs__val_str("t");
  row.object_id = bs__val_str(id);
  row.data = bs__val_str("{}");
  sv.table = bs__val_str("t");
  sv.after_id = bs__val_str(id);
  sv.rows = &row;
  sv.n_rows = 1;
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
}

/* The stream's persisted op head and the checksum count of bucket b at it. */
static void head_and_count(bs_storage *st, const char *b, uint64_t *head, uint32_t *count) {
  bs_error err = {0};
  bs_status s;
  bs_checksum c;
  bs_val name = bs__val_str(b);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_int_equal(bs_get_checksums(&c, st, s.last_persisted_op, &name, 1, &err), BS_OK);
  *head = s.last_persisted_op;
  *count = (uint32_t)c.count;
}

/* Host A's writer has saves queued when the server ends the session holding its lock; host B
 * takes the lock and commits. A's commit fails before sending anything (BS_EIO, libpq's
 * message), A's next one finds the lock taken (BS_EBUSY); once B's writer closed, A's commit
 * applies its whole queue, once. */
static void t_writer_lock_lost(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0), *b = pgt_open(t->url, 0);
  bs_storage *sa, *sb;
  bs_writer *wa, *wb = NULL;
  bs_error err = {0};
  bs_commit_result r;
  uint64_t head, head0;
  uint32_t count, count0;
  int pid;
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_EBUSY);
  save_put(wa, "b", "r1");
  save_put(wa, "b", "r2");
  assert_true((pid = lock_pid(t)) > 0);
  pgt_terminate(t->admin, pid);
  assert_int_equal(lock_pid(t), 0);
  /* host B takes the lock meanwhile and commits */
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_OK);
  assert_int_equal(lock_pid(t) > 0 && lock_pid(t) != pid, 1);
  put_commit(wb, "b", "x", "00000002");
  head_and_count(sa, "b", &head0, &count0);
  assert_int_equal(count0, 2);
  /* A's commit: the lost session is found before anything is sent */
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000003"), NULL, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "writer: the session holding the stream's writer lock was lost"
                                  ": PostgreSQL"));
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0);
  assert_int_equal(count, count0);
  /* the next call reconnects and finds B holding the lock: the queue is still A's */
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000003"), NULL, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "already has a streaming writer in another process or host"));
  bs_writer_close(wb);
  memset(&r, 0, sizeof r);
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000003"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0 + 2); /* r1 and r2, once */
  assert_int_equal(count, count0 + 2);
  assert_int_equal(r.checkpoint, head);
  assert_true(lock_pid(t) > 0); /* A holds it again */
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_EBUSY);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
}

/* A second writer of stream 1 on the same handle, opened from inside the first writer's open
 * (when its session has just taken the lock, "writer.lock") or close (before its unlock,
 * "writer.unlock"), is BS_EBUSY like any other handle's, and never waits for the first; once the
 * close returned the lock is free at once. */
typedef struct race {
  const char *at; /* the point that runs the second open, once */
  bs_storage *st;
  int ran, rc;
  bs_writer *w;
  bs_error err;
} race;

static void race_fn(const char *point, PGconn *c, void *payload) {
  race *r = payload;
  if (strcmp(point, r->at) || r->ran) return;
  r->ran = 1;
  r->rc = bs_writer_open(&r->w, r->st, NULL, &r->err);
}

static void race_check(const race *r) {
  assert_true(r->ran);
  if (r->rc != BS_EBUSY) fail_msg("the second open: %s (%s)", bs_strerror(r->rc), r->err.msg);
  assert_null(r->w);
  assert_non_null(strstr(r->err.msg, "already has a streaming writer"));
}

static void t_writer_open_race(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0), *b = pgt_open(t->url, 0);
  bs_storage *sa, *sb;
  bs_writer *w1 = NULL, *wb = NULL;
  bs_error err = {0};
  race r = {"writer.lock", NULL, 0, 0, NULL, {0}};
  int pid;
  assert_int_equal(bs_stream_create(NULL, a, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sa, a, 1, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  r.st = sa;
  bs__pg_set_hook(a, race_fn, &r);
  assert_int_equal(bs_writer_open(&w1, sa, NULL, &err), BS_OK);
  bs__pg_set_hook(a, NULL, NULL);
  race_check(&r);
  assert_true((pid = lock_pid(t)) > 0);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_EBUSY); /* another host can't either */
  save_put(w1, "b", "r1");
  assert_int_equal(bs_writer_commit(NULL, w1, bs__val_str("1"), NULL, &err), BS_OK);
  assert_int_equal(lock_pid(t), pid);
  r = (race){"writer.unlock", sa, 0, 0, NULL, {0}};
  bs__pg_set_hook(a, race_fn, &r);
  bs_writer_close(w1);
  bs__pg_set_hook(a, NULL, NULL);
  race_check(&r);
  /* closed: free for another host at once */
  assert_int_equal(lock_pid(t), 0);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_OK);
  bs_writer_close(wb);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
}

/* ---- 3. faults ---- */

/* The server ends the writer's session between a flush's statements and its COMMIT, or between
 * a commit's saves and its checkpoint: BS_EIO with libpq's message, nothing persisted, the queue
 * intact; the next call opens a new session (the lock is free) and persists it once. */
static void t_session_lost_in_flight(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0);
  bs_storage *sa;
  bs_writer *wa;
  bs_error err = {0};
  bs_commit_result r;
  uint64_t head, head0, last = 0;
  uint32_t count, count0;
  seam s;
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  head_and_count(sa, "b", &head0, &count0);
  for (int round = 0; round < 2; round++) {
    const char *point = round ? "commit" : "flush";
    seam_init(&s, point);
    s.admin = t->admin;
    s.act_at = 1;
    bs__pg_set_hook(a, seam_fn, &s);
    save_put(wa, "b", round ? "c1" : "f1");
    save_put(wa, "b", round ? "c2" : "f2");
    if (round)
      assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000002"), NULL, &err), BS_EIO);
    else
      assert_int_equal(bs_writer_flush(&last, wa, &err), BS_EIO);
    assert_int_equal(seam_calls(&s), 1);
    assert_non_null(strstr(err.msg, "commit: PostgreSQL")); /* the next statement failed */
    head_and_count(sa, "b", &head, &count);
    assert_int_equal(head, head0);
    assert_int_equal(count, count0);
    /* the retry: a new session, the queue persisted once */
    if (round) {
      memset(&r, 0, sizeof r);
      assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000002"), NULL, &err), BS_OK);
      assert_true(r.checkpoint_created);
      assert_int_equal(r.checkpoint, head0 + 2);
    } else {
      assert_int_equal(bs_writer_flush(&last, wa, &err), BS_OK);
      assert_int_equal(last, head0 + 2);
    }
    assert_int_equal(seam_calls(&s), 2);
    head_and_count(sa, "b", &head, &count);
    assert_int_equal(head, head0 + 2);
    assert_int_equal(count, count0 + 2);
    head0 = head;
    count0 = count;
    bs__pg_set_hook(a, NULL, NULL);
    seam_free(&s);
  }
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_close(a);
}

/* The server restarts (as after a crash: pg_ctl stop -m immediate, then start) between a
 * flush's statements and its COMMIT: the flush fails with BS_EIO, nothing of it persisted, the
 * queue intact; reads on another host's handle work at once (its pooled connections were cut:
 * new ones are opened); the next flush opens a new session (the restart freed the lock) and
 * persists the queue once. A restart while the writer is idle: its next call fails before
 * sending anything (the lock may have been taken meanwhile), the one after reconnects. */
static void t_server_restart(void **state) {
  pgt *t = *state;
  const char *restart = getenv("BS_TEST_PG_RESTART");
  bs_db *a, *b;
  bs_storage *sa, *sb;
  bs_writer *wa;
  bs_error err = {0};
  bs_commit_result r;
  uint64_t head, head0, last = 0;
  uint32_t count;
  seam s;
  if (!restart || !*restart) {
    ft_skip_note("t_server_restart: BS_TEST_PG_RESTART is not set (pg_server.sh run sets it)");
    skip();
  }
  a = pgt_open(t->url, 0);
  b = pgt_open(t->url, 0);
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  head_and_count(sb, "b", &head0, &count);
  assert_int_equal(count, 1);
  seam_init(&s, "flush");
  s.act_at = 1;
  s.restart = restart;
  bs__pg_set_hook(a, seam_fn, &s);
  save_put(wa, "b", "r1");
  save_put(wa, "b", "r2");
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "commit: PostgreSQL"));
  assert_int_equal(seam_calls(&s), 1);
  pgt_reset(t);
  head_and_count(sb, "b", &head, &count); /* host B reads on new connections */
  assert_int_equal(head, head0);
  assert_int_equal(count, 1);
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_OK);
  assert_int_equal(last, head0 + 2);
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000002"), NULL, &err), BS_OK);
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(count, 3);
  /* a restart while the writer is idle, with a save queued */
  save_put(wa, "b", "r3");
  assert_int_equal(system(restart), 0);
  pgt_reset(t);
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000003"), NULL, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "writer: the session holding the stream's writer lock was lost"));
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(count, 3);
  memset(&r, 0, sizeof r);
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000003"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(count, 4);
  assert_int_equal(r.checkpoint, head);
  bs__pg_set_hook(a, NULL, NULL);
  seam_free(&s);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
}

/* A statement that runs into statement_timeout (set through the URL's options): a trigger the
 * test installs blocks the flush's bs_streams update on an advisory lock the test holds, so the
 * timeout fires whatever the machine's speed. BS_EIO with the SQLSTATE (57014) and libpq's
 * message, nothing persisted, the writer's session still usable: once the test lets go, the
 * retry persists the queue once. */
static void t_statement_timeout(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0), *c = NULL;
  bs_storage *sa, *sc;
  bs_writer *wa, *wc;
  bs_error err = {0};
  uint64_t head, head0, last = 0;
  uint32_t count;
  char url[1100];
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  bs_writer_close(wa);
  head_and_count(sa, "b", &head0, &count);
  snprintf(url, sizeof url, "%s%%20-cstatement_timeout%%3D2000", t->url);
  assert_int_equal(bs_open(&c, url, NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sc, c, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wc, sc, NULL, &err), BS_OK);
  pgt_exec(t->admin, "CREATE FUNCTION bs_test_block() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242);"
                     " RETURN NEW; END$$;"
                     "CREATE TRIGGER bs_test_block BEFORE UPDATE ON bs_streams FOR EACH ROW"
                     " EXECUTE FUNCTION bs_test_block();"
                     "SELECT pg_advisory_lock(4242)");
  save_put(wc, "b", "r1");
  assert_int_equal(bs_writer_flush(&last, wc, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "PostgreSQL 57014"));
  assert_non_null(strstr(err.msg, "statement timeout"));
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0);
  assert_int_equal(count, 1);
  pgt_exec(t->admin, "SELECT pg_advisory_unlock(4242); DROP TRIGGER bs_test_block ON bs_streams");
  assert_int_equal(bs_writer_flush(&last, wc, &err), BS_OK);
  assert_int_equal(last, head0 + 1);
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(count, 2);
  bs_writer_close(wc);
  bs_storage_close(sc);
  bs_storage_close(sa);
  bs_close(c);
  bs_close(a);
}

/* A COMMIT whose reply is lost. Committed: the hook waits until the server has finished the
 * COMMIT (the session is idle again), then swaps the client's socket for a closed one; the flush finds
 * out with txid_status that it committed and succeeds, once. Aborted: a deferred trigger blocks
 * the COMMIT on an advisory lock the test holds and the test terminates the session there; the
 * flush fails (BS_EIO) with nothing persisted, and the retry persists the queue once. */
typedef struct lost_reply {
  PGconn *admin;
  int blocked; /* 0: cut the socket once the COMMIT is done; 1: terminate while it is blocked */
  int calls;
} lost_reply;

static void lost_reply_fn(const char *point, PGconn *c, void *payload) {
  lost_reply *l = payload;
  char sql[200];
  if (strcmp(point, "commit.sent") || l->calls++) return;
  snprintf(sql, sizeof sql,
           l->blocked ? "SELECT count(*) FROM pg_stat_activity WHERE pid = %d"
                        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                      : "SELECT count(*) FROM pg_stat_activity WHERE pid = %d"
                        " AND state = 'idle' AND query = 'COMMIT'",
           PQbackendPID(c));
  while (pgt_int(l->admin, "%s", sql) != 1) usleep(1000); /* until the server is there */
  if (l->blocked)
    pgt_terminate(l->admin, PQbackendPID(c));
  else { /* the reply waits in the socket's buffer: lose it with the socket (a closed pair) */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(dup2(sv[0], PQsocket(c)), PQsocket(c));
    close(sv[0]);
    close(sv[1]);
  }
}

static void t_commit_reply_lost(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0);
  bs_storage *sa;
  bs_writer *wa;
  bs_error err = {0};
  uint64_t head, head0, last = 0;
  uint32_t count, count0;
  lost_reply l = {t->admin, 0, 0};
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  head_and_count(sa, "b", &head0, &count0);
  bs__pg_set_hook(a, lost_reply_fn, &l);
  save_put(wa, "b", "r1");
  save_put(wa, "b", "r2");
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_OK); /* it did commit */
  assert_int_equal(l.calls, 1);
  assert_int_equal(last, head0 + 2);
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0 + 2);
  assert_int_equal(count, count0 + 2);
  /* the queue was emptied: the next commit adds nothing */
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_OK); /* a new session */
  assert_int_equal(last, head0 + 2);
  head0 = head;
  count0 = count;

  pgt_exec(t->admin, "CREATE FUNCTION bs_test_block() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242);"
                     " RETURN NEW; END$$;"
                     "CREATE CONSTRAINT TRIGGER bs_test_block AFTER UPDATE ON bs_streams"
                     " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bs_test_block();"
                     "SELECT pg_advisory_lock(4242)");
  l.blocked = 1;
  l.calls = 0;
  save_put(wa, "b", "r3");
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_EIO); /* it did not */
  assert_int_equal(l.calls, 1);
  assert_non_null(strstr(err.msg, "commit: PostgreSQL"));
  pgt_exec(t->admin, "SELECT pg_advisory_unlock(4242); DROP TRIGGER bs_test_block ON bs_streams");
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0);
  assert_int_equal(count, count0);
  assert_int_equal(bs_writer_flush(&last, wa, &err), BS_OK);
  assert_int_equal(last, head0 + 1);
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(count, count0 + 1);
  bs__pg_set_hook(a, NULL, NULL);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_close(a);
}

/* A writer session lost while its server process lives on and keeps the writer lock (a cut
 * network the server is not told of: here the client's socket is swapped for a closed one while
 * the test keeps the real one open, so the server process waits on it, idle). The next call finds
 * the loss (BS_EIO, nothing sent); the one after finds the lock held by that orphan, ends it and
 * takes the lock again, instead of answering BS_EBUSY until keepalives end it. (Another host's
 * holder is never ended: t_writer_lock_lost.) */
static void record_conn(const char *point, PGconn *c, void *payload) {
  if (!strcmp(point, "commit")) *(PGconn **)payload = c;
}

static void t_lost_session_orphan(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0);
  bs_storage *sa;
  bs_writer *wa;
  bs_error err = {0};
  bs_commit_result r;
  PGconn *c = NULL;
  uint64_t head, head0;
  uint32_t count, count0;
  int pid, keep, sv[2];
  stream_ready(a, "s", 1, &sa, &wa);
  bs__pg_set_hook(a, record_conn, &c);
  put_commit(wa, "b", "r0", "00000001");
  bs__pg_set_hook(a, NULL, NULL);
  assert_non_null(c);
  assert_true((pid = lock_pid(t)) > 0);
  assert_int_equal(pid, PQbackendPID(c));
  head_and_count(sa, "b", &head0, &count0);
  assert_true((keep = dup(PQsocket(c))) >= 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  assert_int_equal(dup2(sv[0], PQsocket(c)), PQsocket(c));
  close(sv[0]);
  close(sv[1]);
  save_put(wa, "b", "r1");
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000002"), NULL, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "writer: the session holding the stream's writer lock was lost"));
  assert_int_equal(lock_pid(t), pid); /* the orphan lives on, locked */
  memset(&r, 0, sizeof r);
  assert_int_equal(bs_writer_commit(&r, wa, bs__val_str("00000002"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %d", pid),
                   0);
  assert_true(lock_pid(t) > 0 && lock_pid(t) != pid);
  head_and_count(sa, "b", &head, &count);
  assert_int_equal(head, head0 + 1);
  assert_int_equal(count, count0 + 1);
  close(keep);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_close(a);
}

/* A full disk, on a server of the test's own whose files cannot grow past 8 MiB (pg_server.sh
 * start DIR full). bs_chunks is filled up to that with rows of a bucket no stream has (about 60
 * bytes each: no page keeps room for the writer's 1.5 kB op), so the commit must extend it and cannot:
 * BS_EIO with the server's message, nothing persisted (the head and the bucket's count as
 * before), the writer's queue intact (a second try fails alike). Once space returns (the filler
 * deleted, VACUUM) verify is clean and the same writer's commit persists the queue once. */
static void save_big(bs_writer *w, const char *id) {
  static char data[1500];
  bs_error err = {0};
  bs_row row;
  bs_save sv = BS_SAVE_INIT;
  memset(data, 'd', sizeof data);
  row.bucket = bs__val_str("b");
  row.object_type = bs__val_str("t");
  row.object_id = bs__val_str(id);
  row.data = (bs_val){data, sizeof data};
  sv.table = bs__val_str("t");
  sv.after_id = bs__val_str(id);
  sv.rows = &row;
  sv.n_rows = 1;
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
}

static void verify_clean(bs_db *db) {
  bs_error err = {0};
  uint64_t problems = 1;
  assert_int_equal(bs_db_verify(&problems, db, NULL, NULL, &err), BS_OK);
  assert_int_equal(problems, 0);
}

/* A server of the test's own (pg_server.sh, which BS_TEST_PG_SERVER names), in own_dir: stopped
 * and removed by own_teardown; inside BS_TEST_PG_DIR when set, so that the suite's server's
 * stop stops it too if this process is killed first (by its alarm). */
static char own_dir[512];

/* Runs `pg_server.sh cmd DIR arg` in a new directory; url = the URL it prints. Without
 * BS_TEST_PG_SERVER the test is skipped. */
static void own_server(const char *cmd, const char *arg, char *url, int cap) {
  const char *server = getenv("BS_TEST_PG_SERVER"), *parent = getenv("BS_TEST_PG_DIR");
  char line[1400];
  FILE *f;
  if (!server || !*server) {
    ft_skip_note("test_pg_fault: BS_TEST_PG_SERVER is not set (pg_server.sh run sets it)");
    skip();
  }
  if (parent && *parent)
    assert_true(snprintf(own_dir, sizeof own_dir, "%s/own.XXXXXX", parent) < (int)sizeof own_dir);
  else
    snprintf(own_dir, sizeof own_dir, "/tmp/bs-pgown.XXXXXX");
  assert_non_null(mkdtemp(own_dir));
  snprintf(line, sizeof line, "%s %s %s '%s' >%s/url", server, cmd, own_dir, arg, own_dir);
  assert_int_equal(system(line), 0);
  snprintf(line, sizeof line, "%s/url", own_dir);
  assert_non_null(f = fopen(line, "r"));
  url[0] = '\0';
  assert_non_null(fgets(url, cap, f));
  fclose(f);
  url[strcspn(url, "\n")] = '\0';
}

/* Runs `pg_server.sh cmd own_dir` on the test's own server. */
static void own_cmd(const char *cmd) {
  char line[1200];
  snprintf(line, sizeof line, "%s %s %s", getenv("BS_TEST_PG_SERVER"), cmd, own_dir);
  assert_int_equal(system(line), 0);
}

static int own_teardown(void **state) {
  if (own_dir[0]) {
    own_cmd("stop");
    own_dir[0] = '\0';
  }
  return teardown(state);
}

static void t_disk_full(void **state) {
  char cmd[1200], url[256];
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  bs_error err = {0};
  bs_commit_result r;
  uint64_t head, head0;
  uint32_t count, count0;
  PGconn *admin;
  int filled = 0;
  own_server("start", "full", url, sizeof url);
  admin = PQconnectdb(url);
  assert_int_equal(PQstatus(admin), CONNECTION_OK);
  db = pgt_open(url, 0);
  stream_ready(db, "s", 1, &st, &w);
  put_commit(w, "b", "r0", "00000001");
  head_and_count(st, "b", &head0, &count0);
  /* fill bs_chunks, 5000 rows a statement, until the server cannot extend it */
  for (int i = 0; !filled; i++) {
    PGresult *res;
    assert_true(i < 100); /* 8 MiB are about 100,000 rows */
    snprintf(cmd, sizeof cmd,
             "INSERT INTO bs_chunks SELECT -1, g, g, 1, 0, '\\x00'"
             " FROM generate_series(%d, %d) g",
             i * 5000 + 1, (i + 1) * 5000);
    res = PQexec(admin, cmd);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      assert_string_equal(PQresultErrorField(res, PG_DIAG_SQLSTATE), "53100");
      filled = 1;
    }
    PQclear(res);
  }
  save_big(w, "r1");
  save_big(w, "r2");
  for (int i = 0; i < 2; i++) {
    assert_int_equal(bs_writer_commit(&r, w, bs__val_str("00000002"), NULL, &err), BS_EIO);
    assert_non_null(strstr(err.msg, "PostgreSQL 53100"));
    assert_non_null(strstr(err.msg, "could not extend file"));
    head_and_count(st, "b", &head, &count);
    assert_int_equal(head, head0);
    assert_int_equal(count, count0);
  }
  /* space returns */
  pgt_exec(admin, "DELETE FROM bs_chunks WHERE bucket = -1");
  pgt_exec(admin, "VACUUM bs_chunks");
  verify_clean(db);
  memset(&r, 0, sizeof r);
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("00000002"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, head0 + 2); /* r1 and r2, once */
  head_and_count(st, "b", &head, &count);
  assert_int_equal(count, count0 + 2);
  verify_clean(db);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  PQfinish(admin);
}

/* A hot standby of the test's server (pg_server.sh standby: pg_basebackup, streaming its WAL).
 * A read-write open there is refused with BS_ESTATE (the standby would grant the writer lock,
 * an advisory lock of its own, beside the primary's writer; every write then failed with
 * SQLSTATE 25006); a read-only open reads. The standby cannot LISTEN ("cannot execute LISTEN
 * during recovery"): bs_wait_checkpoint on a read-only handle there reads the checkpoint every
 * BS_WAIT_POLL_MS instead (the seam's "wait" point before each sleep). A wait with an unbounded
 * timeout has polled at least once when the primary commits; the commit, once replayed, ends it
 * with that checkpoint. */
static void t_standby(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0), *b;
  bs_storage *sa, *sb;
  bs_writer *wa, *wb;
  bs_error err = {0};
  bs_checkpoint out;
  char url[256], schema_url[1024];
  uint64_t cp, head;
  uint32_t count;
  waiter w;
  seam s;
  stream_ready(a, "s", 1, &sa, &wa);
  cp = put_commit(wa, "b", "r0", "00000001");
  own_server("standby", pgt_base_url(), url, sizeof url);
  snprintf(schema_url, sizeof schema_url, "%s?options=-csearch_path%%3D%s", url, t->schema);
  assert_int_equal(bs_open(&b, schema_url, NULL, &err), BS_ESTATE);
  assert_string_equal(err.msg,
                      "the server is a hot standby (in recovery): open it with BS_OPEN_RDONLY");
  b = pgt_open(schema_url, BS_OPEN_RDONLY);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_ESTATE);
  assert_int_equal(bs_wait_checkpoint(&out, sb, NULL, 0, &err), BS_OK); /* the backup's */
  assert_checkpoint(&out, cp, "00000001");
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(head, cp);
  assert_int_equal(count, 1);
  seam_init(&s, "wait");
  bs__pg_set_hook(b, seam_fn, &s);
  wait_start(&w, sb);
  seam_wait(&s, 1);
  cp = put_commit(wa, "b", "r1", "00000002");
  assert_int_equal(pthread_join(w.th, NULL), 0);
  if (w.rc != BS_OK) fail_msg("wait on the standby: %s (%s)", bs_strerror(w.rc), w.err.msg);
  assert_checkpoint(&w.out, cp, "00000002");
  bs__pg_set_hook(b, NULL, NULL);
  seam_free(&s);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
}

/* Asks c the query (one int) until it answers 1: a wait for a state the test brought about,
 * decided by the server's answer; the tries (up to 6000, 10 ms apart) only bound it. */
static void until_true(PGconn *c, const char *sql) {
  for (int i = 0; pgt_int(c, "%s", sql) != 1; i++) {
    if (i == 6000) fail_msg("still not true after 6000 tries: %s", sql);
    usleep(10000);
  }
}

/* A failover to an asynchronous standby that lacked the last commit. The standby (pg_server.sh
 * standby) replays the commits made after its base backup (waited for by LSN); it is then cut
 * off from the primary (pg_server.sh detach: started again without primary_conninfo), the
 * primary commits once more, and the standby is promoted (pg_promote: a new timeline) with the
 * op head before that commit. There every write is refused (BS_ESTATE, "history rewound", the
 * new timeline) and nothing is written, until the acknowledgement; then the writer commits from
 * the standby's head, handing out again the op id the lost commit has on the old primary. */
static void t_failover(void **state) {
  pgt *t = *state;
  bs_db *a = pgt_open(t->url, 0), *b;
  bs_storage *sa, *sb;
  bs_writer *wa, *wb;
  bs_error err = {0};
  bs_commit_result r;
  char url[256], schema_url[1024], sql[256], msg[512];
  PGconn *sby;
  uint64_t cp, lost, head;
  uint32_t count;
  long long sys, tl, ops;
  stream_ready(a, "s", 1, &sa, &wa);
  put_commit(wa, "b", "r0", "00000001");
  own_server("standby", pgt_base_url(), url, sizeof url);
  cp = put_commit(wa, "b", "r1", "00000002"); /* reaches the standby by streaming */
  snprintf(sql, sizeof sql, "SELECT (pg_last_wal_replay_lsn() - '0/0' >= %lld)::int",
           pgt_int(t->admin, "SELECT (pg_current_wal_lsn() - '0/0')::bigint"));
  sby = PQconnectdb(url);
  assert_int_equal(PQstatus(sby), CONNECTION_OK);
  until_true(sby, sql);
  PQfinish(sby);
  own_cmd("detach");
  lost = put_commit(wa, "b", "r2", "00000003"); /* the standby never gets it */
  assert_int_equal(lost, cp + 1);
  sby = PQconnectdb(url);
  assert_int_equal(PQstatus(sby), CONNECTION_OK);
  assert_int_equal(pgt_int(sby, "SELECT pg_promote()::int"), 1); /* waits until promoted */
  sys = pgt_int(t->admin, "SELECT system_identifier FROM pg_control_system()");
  tl = pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_timeline'");

  snprintf(schema_url, sizeof schema_url, "%s?options=-csearch_path%%3D%s", url, t->schema);
  b = pgt_open(schema_url, 0);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(head, cp); /* r0 and r1, not r2 */
  assert_int_equal(count, 2);
  ops = pgt_int(sby, "SELECT coalesce(sum(n), 0) FROM %s.bs_chunks", t->schema);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_OK);
  save_update(wb, "b", "r1", "{\"v\":2}");
  assert_int_equal(bs_writer_flush(NULL, wb, &err), BS_ESTATE);
  snprintf(msg, sizeof msg,
           "history rewound: the data was written on timeline %lld of PostgreSQL system %lld, the"
           " server is on timeline %lld of system %lld (a failover or a restore)",
           tl, sys, tl + 1, sys);
  if (!strstr(err.msg, msg)) fail_msg("%s\nis not\n%s", err.msg, msg);
  assert_int_equal(bs_writer_commit(&r, wb, bs__val_str("00000003"), NULL, &err), BS_ESTATE);
  assert_non_null(strstr(err.msg, "history rewound"));
  head_and_count(sb, "b", &head, &count);
  assert_int_equal(head, cp);
  assert_int_equal(count, 2);
  assert_int_equal(pgt_int(sby, "SELECT coalesce(sum(n), 0) FROM %s.bs_chunks", t->schema), ops);

  bs_close(pgt_open(schema_url, BS_OPEN_ACK_REWIND));
  assert_int_equal(
      pgt_int(sby, "SELECT value FROM %s.bs_meta WHERE key = 'history_timeline'", t->schema),
      tl + 1);
  memset(&r, 0, sizeof r);
  assert_int_equal(bs_writer_commit(&r, wb, bs__val_str("00000003"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(r.checkpoint, lost);
  verify_clean(b);
  PQfinish(sby);
  bs_writer_close(wb);
  bs_writer_close(wa);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(a);
  bs_close(b);
}

/* ---- 4. two processes (two hosts): a writer streaming commits, a reader waiting and reading ---- */

#define N_TWO_BUCKETS 3
static const char *const two_buckets[N_TWO_BUCKETS] = {"b0", "by_user[\"\xc3\xa9\"]", "b2"};

/* The writer process: seeded saves (inserts, updates that move rows between buckets, deletes;
 * data "", "1", "1.0", non-ASCII), a commit after each 1..4, until it made `commits` commits and
 * the reader has reported `reads` distinct checkpoints on the pipe; then a last commit at LSN
 * "99999999". Exits 0, or 1 + the step that failed (no cmocka in a child). */
static int writer_process(const char *url, int commits, int reads, int pipe_rd) {
  static const char *const data[] = {"", "1", "1.0", "{\"t\":\"\xc3\xa9\"}"};
  bs_error err = {0};
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  uint64_t rnd = 77;
  int seen = 0, n = 0;
  char lsn[16];
  if (bs_open(&db, url, NULL, &err) || bs_storage_open(&st, db, 1, &err) ||
      bs_writer_open(&w, st, NULL, &err))
    return 2;
  while (n < commits || seen < reads) {
    int k = 1 + (int)((rnd = rnd * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 4;
    char c;
    for (int i = 0; i < k; i++) {
      char id[8];
      bs_row row;
      bs_save sv = BS_SAVE_INIT;
      rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
      snprintf(id, sizeof id, "r%d", (int)(rnd >> 40) % 10);
      row.bucket = bs__val_str(two_buckets[(rnd >> 20) % N_TWO_BUCKETS]);
      row.object_type = bs__val_str("t");
      row.object_id = bs__val_str(id);
      row.data = bs__val_str(data[(rnd >> 24) % 4]);
      sv.table = bs__val_str("t");
      sv.tag = (rnd >> 28) % 5 == 0 ? BS_DELETE : BS_UPDATE;
      sv.after_id = bs__val_str(id);
      sv.rows = &row;
      sv.n_rows = 1;
      if (bs_writer_save(w, &sv, &err)) return 3;
    }
    snprintf(lsn, sizeof lsn, "%08d", ++n);
    if (bs_writer_commit(NULL, w, bs__val_str(lsn), NULL, &err)) return 4;
    while (read(pipe_rd, &c, 1) == 1) seen++; /* non-blocking: what the reader has reported */
  }
  if (bs_writer_commit(NULL, w, bs__val_str("99999999"), NULL, &err)) return 5;
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return 0;
}

typedef struct sums {
  uint64_t checkpoint;
  uint32_t sum[N_TWO_BUCKETS];
  uint64_t count[N_TWO_BUCKETS], after[N_TWO_BUCKETS], last_op;
  int bad;
} sums;

static int sum_chunk(const bs_chunk *ch, void *payload) {
  sums *s = payload;
  int b = 0;
  while (b < N_TWO_BUCKETS && (strlen(two_buckets[b]) != ch->bucket.size ||
                               memcmp(two_buckets[b], ch->bucket.data, ch->bucket.size)))
    b++;
  if (b == N_TWO_BUCKETS || ch->after != s->after[b]) return s->bad = 1;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *op = &ch->ops[i];
    if (op->op_id <= s->after[b] || op->op_id > s->checkpoint) return s->bad = 1;
    s->after[b] = op->op_id;
    s->sum[b] = (uint32_t)(((uint64_t)s->sum[b] + op->checksum) & 0xffffffffu);
    s->count[b]++;
  }
  return 0;
}

/* Reads every bucket at cp in pages of 50 ops and checks the checksums at cp against the ops. */
static void read_consistent(bs_storage *st, uint64_t cp) {
  bs_error err = {0};
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  bs_checksum cs[N_TWO_BUCKETS];
  bs_val names[N_TWO_BUCKETS];
  sums s;
  int more = 1;
  memset(&s, 0, sizeof s);
  s.checkpoint = cp;
  o.limit = 50;
  while (more) {
    bs_bucket_request req[N_TWO_BUCKETS];
    for (int b = 0; b < N_TWO_BUCKETS; b++) {
      req[b].bucket = bs__val_str(two_buckets[b]);
      req[b].after = s.after[b];
    }
    assert_int_equal(bs_get_bucket_data(&more, st, cp, req, N_TWO_BUCKETS, &o, sum_chunk, &s, &err),
                     BS_OK);
    assert_false(s.bad);
  }
  for (int b = 0; b < N_TWO_BUCKETS; b++) names[b] = bs__val_str(two_buckets[b]);
  assert_int_equal(bs_get_checksums(cs, st, cp, names, N_TWO_BUCKETS, &err), BS_OK);
  for (int b = 0; b < N_TWO_BUCKETS; b++) {
    assert_int_equal(cs[b].checksum, s.sum[b]);
    assert_int_equal(cs[b].count, s.count[b]);
  }
}

/* The reader (this process) waits for each new checkpoint with bs_wait_checkpoint (woken by
 * the writer process's NOTIFY), reads it whole and checks it, and reports each distinct one on
 * a pipe; the writer commits until it made its commits and the reader read its checkpoints
 * (counted: however slow either side is, both counts are reached). */
static void t_two_processes(void **state) {
  pgt *t = *state;
  int quick = getenv("BS_TEST_QUICK") != NULL;
  int commits = quick ? 40 : 200, reads = quick ? 15 : 60, fds[2], status, n_reads = 0;
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  bs_error err = {0};
  bs_checkpoint known, cp;
  pid_t pid;
  stream_ready(db, "s", 1, &st, &w);
  bs_writer_close(w);
  assert_int_equal(pipe(fds), 0);
  signal(SIGPIPE, SIG_IGN);
  fflush(NULL);
  if ((pid = fork()) == 0) {
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    _exit(writer_process(t->url, commits, reads, fds[0])); /* _exit: the parent's sessions stay */
  }
  assert_true(pid > 0);
  close(fds[0]);
  memset(&known, 0, sizeof known);
  for (;;) {
    char one = 1;
    assert_int_equal(bs_wait_checkpoint(&cp, st, &known, 1000, &err), BS_OK);
    if (cp.op_id == known.op_id && cp.lsn_size == known.lsn_size &&
        !memcmp(cp.lsn, known.lsn, cp.lsn_size)) {
      /* no news for a while: a writer that failed would leave this loop waiting forever */
      pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) fail_msg("the writer process exited early: status %d", status);
      continue;
    }
    read_consistent(st, cp.op_id);
    n_reads++;
    if (cp.has_lsn && cp.lsn_size == 8 && !memcmp(cp.lsn, "99999999", 8)) break;
    /* EPIPE once the writer has exited (it may have read enough before this one) */
    assert_true(write(fds[1], &one, 1) == 1 || errno == EPIPE);
    known = cp;
  }
  close(fds[1]);
  signal(SIGPIPE, SIG_DFL);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_true(n_reads > reads);
  {
    bs_status s;
    assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
    assert_int_equal(s.checkpoint, cp.op_id); /* the last read was the final state */
    assert_true(s.checkpoint > (uint64_t)commits);
  }
  bs_storage_close(st);
  bs_close(db);
}

/* ---- 9. prepared statements and the writer's ANALYZE (pgspeed) ---- */

/* At a commit's "commit" point, in the writer's session: its server process and what
 * pg_prepared_statements says of the backend's statements ("bs<id>"). */
typedef struct plans {
  int pid, statements;
  long long generic, custom;
} plans;

static void plans_fn(const char *point, PGconn *c, void *payload) {
  plans *p = payload;
  PGresult *r;
  if (strcmp(point, "commit")) return;
  r = PQexec(c, "SELECT count(*), coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)"
                " FROM pg_prepared_statements WHERE name LIKE 'bs%'");
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  p->pid = PQbackendPID(c);
  p->statements = atoi(PQgetvalue(r, 0, 0));
  p->generic = atoll(PQgetvalue(r, 0, 1));
  p->custom = atoll(PQgetvalue(r, 0, 2));
  PQclear(r);
}

/* The hot statements are prepared once per session and run on generic plans (never planned
 * again per call); a session the server ended is replaced by one that prepares them again. */
static void t_prepared_per_session(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  bs_error err = {0};
  bs_commit_result r;
  plans p = {0};
  int first_pid;
  stream_ready(db, "s", 1, &st, &w);
  bs__pg_set_hook(db, plans_fn, &p);
  put_commit(w, "b", "r1", "1");
  /* the first commit prepared them; at the second they are there already and run generic */
  put_commit(w, "b", "r2", "2");
  assert_true(p.statements >= 5); /* batch_open, table, records, buckets, commit_read at least */
  assert_true(p.generic >= p.statements);
  assert_int_equal(p.custom, 0);
  first_pid = p.pid;
  pgt_terminate(t->admin, first_pid);
  /* the next call finds the session gone (BS_EIO), the one after opens a new one */
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("3"), NULL, &err), BS_EIO);
  memset(&p, 0, sizeof p);
  put_commit(w, "b", "r3", "4");
  assert_true(p.pid != 0 && p.pid != first_pid);
  assert_true(p.statements >= 5);
  assert_int_equal(p.custom, 0);
  {
    bs_val name = bs__val_str("b");
    bs_checksum cs;
    assert_int_equal(bs_get_checksums(&cs, st, 1000, &name, 1, &err), BS_OK);
    assert_int_equal(cs.count, 3);
  }
  bs__pg_set_hook(db, NULL, NULL);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* The ANALYZE a writer has run when what it wrote doubled is not waited for by its commit: with
 * bs_chunks locked against it (SHARE UPDATE EXCLUSIVE, as a VACUUM holds it), the ANALYZE sent after
 * the first commit waits for the lock on a session of its own while the writer commits on; it
 * completes once the lock goes. A synchronous one would block the commit until alarm() fails the
 * test. */
static void t_analyze_not_waited_for(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  seam s;
  char sql[256];
  PGconn *locker = PQconnectdb(t->url);
  assert_int_equal(PQstatus(locker), CONNECTION_OK);
  stream_ready(db, "s", 1, &st, &w);
  /* a failed assertion leaves it in its transaction: the server ends it, so the teardown's DROP
   * does not wait for it forever */
  pgt_exec(locker, "SET idle_in_transaction_session_timeout = '60s'");
  pgt_exec(locker, "BEGIN; LOCK TABLE bs_chunks IN SHARE UPDATE EXCLUSIVE MODE");
  seam_init(&s, "analyze");
  bs__pg_set_hook(db, seam_fn, &s);
  put_commit(w, "b", "r1", "1"); /* the first write: an ANALYZE is due */
  assert_int_equal(seam_calls(&s), 1);
  /* until the ANALYZE waits for the lock (it was sent before the commit returned) */
  while (pgt_int(t->admin, "SELECT count(*) FROM pg_locks WHERE NOT granted"
                           " AND relation = 'bs_chunks'::regclass") == 0)
    usleep(1000);
  assert_int_equal(pgt_int(t->admin, "SELECT (reltuples < 0)::int FROM pg_class"
                                     " WHERE oid = 'bs_chunks'::regclass"),
                   1);
  put_commit(w, "b", "r2", "2"); /* commits on; one ANALYZE at a time */
  put_commit(w, "b", "r3", "3");
  assert_int_equal(seam_calls(&s), 1);
  pgt_exec(locker, "COMMIT");
  snprintf(sql, sizeof sql,
           "SELECT (reltuples >= 1)::int FROM pg_class WHERE oid = 'bs_chunks'::regclass");
  while (pgt_int(t->admin, sql) == 0) usleep(1000); /* it completes (alarm() guards) */
  bs__pg_set_hook(db, NULL, NULL);
  seam_free(&s);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  PQfinish(locker);
}

/* A stored source record another session changes while a flush has it read: the flush updates
 * or deletes the rows it read by their ctid, finds one gone and fails (BS_EBUSY, nothing applied,
 * the queue kept) instead of writing over the other session's row; the next commit applies the
 * queue. */
typedef struct meddle {
  PGconn *admin;
  int calls;
} meddle;

static void meddle_fn(const char *point, PGconn *c, void *payload) {
  meddle *m = payload;
  (void)c;
  if (strcmp(point, "flush.loaded") || ++m->calls != 1) return;
  pgt_exec(m->admin, "UPDATE bs_source SET mark = mark");
}

static void t_record_changed_under_flush(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  bs_error err = {0};
  bs_save sv = BS_SAVE_INIT;
  bs_commit_result r;
  bs_checksum cs;
  bs_val name = bs__val_str("b");
  meddle m = {t->admin, 0};
  stream_ready(db, "s", 1, &st, &w);
  put_commit(w, "b", "r1", "1");
  save_update(w, "b", "r1", "{\"v\":2}");
  bs__pg_set_hook(db, meddle_fn, &m);
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("2"), NULL, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "1 source records changed since the flush read them"));
  assert_int_equal(m.calls, 1);
  assert_int_equal(bs_get_checksums(&cs, st, 1000, &name, 1, &err), BS_OK);
  assert_int_equal(cs.count, 1); /* nothing of the failed commit */
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("2"), NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  assert_int_equal(m.calls, 2);
  assert_int_equal(bs_get_checksums(&cs, st, r.checkpoint, &name, 1, &err), BS_OK);
  assert_int_equal(cs.count, 2); /* the first PUT and the update's */
  /* the same for a record the flush deletes */
  {
    bs_save init = BS_SAVE_INIT;
    sv = init;
  }
  sv.table = bs__val_str("t");
  sv.tag = BS_DELETE;
  sv.before_id = bs__val_str("r1");
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
  m.calls = 0;
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("3"), NULL, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "1 of 1 source records changed since the flush read them"));
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("3"), NULL, &err), BS_OK);
  assert_int_equal(m.calls, 2);
  assert_int_equal(bs_get_checksums(&cs, st, r.checkpoint, &name, 1, &err), BS_OK);
  assert_int_equal(cs.count, 3); /* and the REMOVE */
  bs__pg_set_hook(db, NULL, NULL);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* ---- a clear while a flush is under way ---- */

/* bs_clear on another host while a flush holds the stream: the clear waits for it (the stream
 * row's lock) and then drops the flush's ops too. It used to name the lock in a WITH query that
 * nothing referenced, which PostgreSQL never runs: the clear deleted beside the flush, the
 * flush's writes then waited on the clear's deleted rows and the clear on the stream row (a
 * deadlock), or left ops of a deleted bucket. */
typedef struct clearer {
  pthread_t th;
  bs_storage *st;
  PGconn *admin;
  int rc, started;
  bs_error err;
} clearer;

static void *clear_main(void *arg) {
  clearer *k = arg;
  k->rc = bs_clear(k->st, &k->err);
  return NULL;
}

/* At the flush's first "flush.loaded": starts the clear and returns once the clear's session
 * waits for a lock (the flush's), so the flush goes on with the clear queued behind it. */
static void clear_under_flush(const char *point, PGconn *c, void *payload) {
  clearer *k = payload;
  (void)c;
  if (strcmp(point, "flush.loaded") || k->started++) return;
  assert_int_equal(pthread_create(&k->th, NULL, clear_main, k), 0);
  while (pgt_int(k->admin,
                 "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                 " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()") != 1)
    usleep(1000);
}

static void t_clear_under_flush(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0), *db2 = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  bs_error err = {0};
  bs_commit_result r;
  bs_stat s;
  clearer k;
  uint64_t problems = 1;
  memset(&k, 0, sizeof k);
  k.admin = t->admin;
  stream_ready(db, "s", 1, &st, &w);
  put_commit(w, "b", "r1", "1");
  assert_int_equal(bs_storage_open(&k.st, db2, 1, &err), BS_OK);
  save_update(w, "b", "r1", "{\"v\":2}");
  bs__pg_set_hook(db, clear_under_flush, &k);
  assert_int_equal(bs_writer_commit(&r, w, bs__val_str("2"), NULL, &err), BS_OK);
  bs__pg_set_hook(db, NULL, NULL);
  assert_int_equal(k.started, 1);
  assert_int_equal(pthread_join(k.th, NULL), 0);
  assert_int_equal(k.rc, BS_OK);
  /* the clear came after the flush: nothing of either commit is left, and the file agrees */
  assert_int_equal(bs_db_stat(&s, db, &err), BS_OK);
  assert_int_equal(s.ops_put + s.ops_remove + s.ops_move + s.ops_clear, 0);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_chunks"), 0);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), 0);
  assert_int_equal(bs_db_verify(&problems, db, NULL, NULL, &err), BS_OK);
  assert_int_equal(problems, 0);
  bs_storage_close(k.st);
  bs_close(db2);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_wait_across_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(t_wait_first_and_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(t_writer_lock_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(t_writer_open_race, setup, teardown),
      cmocka_unit_test_setup_teardown(t_session_lost_in_flight, setup, teardown),
      cmocka_unit_test_setup_teardown(t_server_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(t_statement_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(t_commit_reply_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(t_lost_session_orphan, setup, teardown),
      cmocka_unit_test_setup_teardown(t_disk_full, setup, own_teardown),
      cmocka_unit_test_setup_teardown(t_standby, setup, own_teardown),
      cmocka_unit_test_setup_teardown(t_failover, setup, own_teardown),
      cmocka_unit_test_setup_teardown(t_two_processes, setup, teardown),
      cmocka_unit_test_setup_teardown(t_prepared_per_session, setup, teardown),
      cmocka_unit_test_setup_teardown(t_analyze_not_waited_for, setup, teardown),
      cmocka_unit_test_setup_teardown(t_record_changed_under_flush, setup, teardown),
      cmocka_unit_test_setup_teardown(t_clear_under_flush, setup, teardown),
  };
  if (pgt_skipped("test_pg_fault")) return 0;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  return !pgt_skipped("test_pg_fault");
}
#endif
