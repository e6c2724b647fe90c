/*
 * test_sharedenv.c: one database file opened more than once in one process. LMDB forbids two
 * environments on one file in a process (the second open resets the reader table, so the first
 * one's read snapshots are no longer protected and the writer reuses their pages): every bs_open
 * of a file shares one environment, whatever name opened it.
 *  - The reproduction: handle 1 writes rows and commits; an export of handle 1 pauses inside its
 *    first callback (its read snapshot open); a second bs_open of the same file (the same path,
 *    a relative path, a symlink, a hard link); every row is rewritten several times, by handle
 *    1's writer and handle 2's in turn, committing and compacting (through the other handle)
 *    each time; the export continues and must deliver every
 *    record of its snapshot (counted and hashed against an export made before).
 *  - Options that cannot share one environment are refused with BS_EBUSY and the option named.
 *  - The lock file is the real file's: an open through a symlink makes no lock beside the link.
 *  - A handle inherited by a child through fork() is refused (BS_ESTATE); the child's own open
 *    of the file works.
 *  - Opens and closes of one file racing from several threads, by two names.
 *  - Two processes, two names (the real path, a symlink): a read snapshot of one survives the
 *    other's writes and compactions, and there is one lock file.
 *  - One writer per stream across processes: another process's writer makes this one's
 *    BS_EBUSY until that process is killed (SIGKILL), whatever child it forked meanwhile.
 *  - Two processes, two hard-link names: LMDB's lock file goes by name, so the second name is
 *    refused (BS_EBUSY, no lock file made) while another process has the file open by the
 *    first, either way round, and admitted once it has closed it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "util_contract.h"
#include "util_fault.h"
#include "storage.h"

#define NBUCKETS 10

static unsigned n_rows(void) {
  return getenv("BS_TEST_QUICK") ? 2000 : 20000;
}

static unsigned n_rewrites(void) {
  return getenv("BS_TEST_QUICK") ? 3 : 6;
}

static int setup(void **state) {
  *state = ct_env_new(&ct_backends[CT_LMDB]);
  return *state ? 0 : -1;
}

/* Round r of every row (inserted when r == 0) through w, ~120 bytes of data each, then a commit
 * that makes a checkpoint. Returns the first failure (-1: no checkpoint), without asserting: a
 * child process runs it too. */
static int put_round(bs_writer *w, unsigned r) {
  char id[16], data[128], bucket[8];
  bs_commit_result cr;
  int rc;
  for (unsigned i = 0; i < n_rows(); i++) {
    snprintf(id, sizeof id, "r%u", i);
    snprintf(data, sizeof data, "{\"round\":%u,\"row\":%u,\"pad\":\"%0*u\"}", r, i, 80, i);
    snprintf(bucket, sizeof bucket, "b%u", i % NBUCKETS);
    rc = ct_save(w, r ? BS_UPDATE : BS_INSERT, "t", NULL, id, CT_ROWS({bucket, "t", id, data}));
    if (rc) return rc;
  }
  if ((rc = ct_commit(w, ct_lsn(r + 1), &cr))) return rc;
  return cr.checkpoint_created ? BS_OK : -1;
}

static void write_round(bs_writer *w, unsigned r) {
  CT_OK(put_round(w, r));
}

static int compact_all(bs_storage *st) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  o.min_bucket_changes = 1;
  return bs_compact(NULL, st, &o, &ct_err);
}

static void compact(bs_storage *st) {
  CT_OK(compact_all(st));
}

/* ---- An export that pauses in its first callback ---------------------------------------------- */

typedef struct paused_export {
  bs_db *db;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pause, inside, go, rc;
  uint64_t records, hash;
  bs_error err;
} paused_export;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static int on_record(const bs_record *rec, void *payload) {
  paused_export *x = payload;
  if (x->pause && x->records == 0) {
    pthread_mutex_lock(&x->mu);
    x->inside = 1;
    pthread_cond_broadcast(&x->cv);
    while (!x->go) pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
  }
  x->records++;
  x->hash = fnv(x->hash, rec->table, strlen(rec->table) + 1);
  x->hash = fnv(x->hash, rec->key.data, rec->key.size);
  x->hash = fnv(x->hash, rec->value.data, rec->value.size);
  return 0;
}

static void *export_thread(void *arg) {
  paused_export *x = arg;
  x->rc = bs_db_export(x->db, 0, on_record, x, &x->err);
  return NULL;
}

static void export_init(paused_export *x, bs_db *db, int pause) {
  memset(x, 0, sizeof *x);
  x->db = db;
  x->pause = pause;
  x->hash = 0xcbf29ce484222325ull;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cv, NULL);
}

static void export_destroy(paused_export *x) {
  pthread_cond_destroy(&x->cv);
  pthread_mutex_destroy(&x->mu);
}

/* ---- The reproduction ------------------------------------------------------------------------- */

typedef enum how { SAME_PATH, RELATIVE, SYMLINK, HARDLINK } how;

/* The options of the fixture's handle (util_contract.c) */
static const bs_open_options nosync = {BS_OPEN_OPTIONS_VERSION, BS_OPEN_NOSYNC, 0, 0, NULL, 0};

/* Opens e's file a second time, named as how says. */
static int open_again(ct_env *e, how h, bs_db **out) {
  char other[256], cwd[512];
  int rc;
  if (h == SAME_PATH) return bs_open(out, e->path, &nosync, &ct_err);
  if (h == RELATIVE) {
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(e->dir), 0);
    rc = bs_open(out, strrchr(e->path, '/') + 1, &nosync, &ct_err);
    assert_int_equal(chdir(cwd), 0);
    return rc;
  }
  snprintf(other, sizeof other, "%s/other.bsdb", e->dir);
  assert_int_equal(h == SYMLINK ? symlink(e->path, other) : link(e->path, other), 0);
  return bs_open(out, other, &nosync, &ct_err);
}

static void reproduction(void **state, how h) {
  ct_env *e = *state;
  paused_export before, x;
  pthread_t t;
  bs_db *db2 = NULL;
  bs_storage *st2 = NULL;
  bs_writer *w2 = NULL;

  write_round(e->w, 0);
  export_init(&before, e->db, 0);
  CT_OK(bs_db_export(e->db, 0, on_record, &before, &ct_err));

  export_init(&x, e->db, 1);
  assert_int_equal(pthread_create(&t, NULL, export_thread, &x), 0);
  pthread_mutex_lock(&x.mu);
  while (!x.inside) pthread_cond_wait(&x.cv, &x.mu);
  pthread_mutex_unlock(&x.mu);

  CT_OK(open_again(e, h, &db2));
  CT_OK(bs_storage_open(&st2, db2, e->stream, &ct_err));
  /* one writer per stream, whatever name opened the other handle */
  CT_RC(BS_EBUSY, bs_writer_open(&w2, st2, NULL, &ct_err));
  bs_writer_close(e->w);
  e->w = NULL;
  /* Rounds alternate between the two handles' writers: each must see the other's snapshot. */
  for (unsigned r = 1; r <= n_rewrites(); r++) {
    CT_OK(bs_writer_open(&w2, r % 2 ? e->st : st2, NULL, &ct_err));
    write_round(w2, r);
    bs_writer_close(w2);
    compact(r % 2 ? st2 : e->st);
  }
  w2 = NULL;

  pthread_mutex_lock(&x.mu);
  x.go = 1;
  pthread_cond_broadcast(&x.cv);
  pthread_mutex_unlock(&x.mu);
  assert_int_equal(pthread_join(t, NULL), 0);
  if (x.rc) fail_msg("export: %s (%s)", bs_strerror(x.rc), x.err.msg);
  CT_EQ_U64(x.records, before.records);
  CT_EQ_U64(x.hash, before.hash);

  bs_writer_close(w2);
  bs_storage_close(st2);
  bs_close(db2);
  export_destroy(&x);
  export_destroy(&before);
}

static void t_same_path(void **state) {
  reproduction(state, SAME_PATH);
}
static void t_relative_path(void **state) {
  reproduction(state, RELATIVE);
}
static void t_symlink(void **state) {
  reproduction(state, SYMLINK);
}
static void t_hardlink(void **state) {
  reproduction(state, HARDLINK);
}

/* ---- Options that cannot share one environment -------------------------------------------- */

static void expect_busy(const char *path, unsigned flags, size_t map_size, const char *names) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  o.flags = flags;
  o.map_size = map_size;
  CT_RC(BS_EBUSY, bs_open(&db, path, &o, &ct_err));
  assert_null(db);
  if (!strstr(ct_err.msg, names)) fail_msg("the message does not name %s: %s", names, ct_err.msg);
}

/* Closes the fixture's handles (teardown then only removes the files). */
static void close_fixture(ct_env *e) {
  bs_writer_close(e->w);
  bs_storage_close(e->st);
  bs_close(e->db);
  e->w = NULL;
  e->st = NULL;
  e->db = NULL;
}

static void t_conflicts(void **state) {
  ct_env *e = *state;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *ro = NULL, *rw = NULL, *small = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_checkpoint cp;

  write_round(e->w, 0);
  /* the fixture's handle is read-write with BS_OPEN_NOSYNC */
  expect_busy(e->path, 0, 0, "BS_OPEN_NOSYNC");
  expect_busy(e->path, BS_OPEN_NOSYNC, (size_t)1 << 44, "map_size");
  o.flags = BS_OPEN_NOSYNC;
  o.map_size = (size_t)1 << 20; /* below the map: it is already as large */
  CT_OK(bs_open(&small, e->path, &o, &ct_err));
  /* a read-only handle uses the read-write environment, and stays read-only */
  o.flags = BS_OPEN_RDONLY;
  o.map_size = 0;
  CT_OK(bs_open(&ro, e->path, &o, &ct_err));
  CT_OK(bs_storage_open(&st, ro, e->stream, &ct_err));
  CT_OK(bs_get_checkpoint(&cp, st, &ct_err));
  assert_true(cp.op_id > 0);
  CT_RC(BS_ESTATE, bs_writer_open(&w, st, NULL, &ct_err));
  bs_storage_close(st);
  bs_close(small);
  close_fixture(e);
  /* the read-only handle outlives the one that opened the environment */
  CT_OK(bs_storage_open(&st, ro, e->stream, &ct_err));
  CT_OK(bs_get_checkpoint(&cp, st, &ct_err));
  bs_storage_close(st);
  bs_close(ro);

  /* opened read-only first: the environment is read-only, a read-write open must wait */
  CT_OK(bs_open(&ro, e->path, &o, &ct_err));
  expect_busy(e->path, BS_OPEN_NOSYNC, 0, "read-only");
  bs_close(ro);
  CT_OK(bs_open(&rw, e->path, &nosync, &ct_err));
  bs_close(rw);
}

/* ---- The lock file of a file opened through a symlink ------------------------------------- */

static int exists(const char *dir, const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static void t_lock_file(void **state) {
  ct_env *e = *state;
  char link_path[256], lock[256];
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_checkpoint cp;
  write_round(e->w, 0);
  close_fixture(e);
  snprintf(lock, sizeof lock, "%s-lock", e->path);
  assert_int_equal(unlink(lock), 0); /* nobody has the file open */
  snprintf(link_path, sizeof link_path, "%s/link.bsdb", e->dir);
  assert_int_equal(symlink(e->path, link_path), 0);
  CT_OK(bs_open(&db, link_path, &nosync, &ct_err));
  CT_OK(bs_storage_open(&st, db, e->stream, &ct_err));
  CT_OK(bs_get_checkpoint(&cp, st, &ct_err));
  assert_true(exists(e->dir, strrchr(lock, '/') + 1));
  assert_false(exists(e->dir, "link.bsdb-lock"));
  bs_storage_close(st);
  bs_close(db);
}

/* ---- A handle in a child after fork() ---------------------------------------------------- */

/* The child's checks; its exit status names the first that failed (0: all passed). */
static int child_checks(ct_env *e) {
  bs_error err;
  bs_checkpoint cp;
  bs_stat sb;
  bs_db *mine = NULL;
  bs_storage *st = NULL;
  if (bs_get_checkpoint(&cp, e->st, &err) != BS_ESTATE || !strstr(err.msg, "fork")) return 1;
  if (bs_db_stat(&sb, e->db, &err) != BS_ESTATE) return 2;
  if (ct_save(e->w, BS_INSERT, "t", NULL, "x", CT_ROWS({"b0", "t", "x", "{}"})) != BS_ESTATE)
    return 3;
  /* the child opens the file itself: a new environment, not the parent's */
  if (bs_open(&mine, e->path, &nosync, &err) != BS_OK) return 4;
  bs_writer_close(e->w);
  bs_storage_close(e->st);
  bs_close(e->db);
  if (bs_storage_open(&st, mine, e->stream, &err) != BS_OK) return 5;
  if (bs_get_checkpoint(&cp, st, &err) != BS_OK || cp.op_id == 0) return 6;
  bs_storage_close(st);
  bs_close(mine);
  return 0;
}

static void t_fork(void **state) {
  ct_env *e = *state;
  bs_checkpoint cp;
  int status;
  pid_t pid;
  write_round(e->w, 0);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(child_checks(e));
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  CT_OK(bs_get_checkpoint(&cp, e->st, &ct_err)); /* the parent's handle is unaffected */
  write_round(e->w, 1);
}

/* ---- Opens and closes racing from several threads ------------------------------------------ */

#define RACERS 4

typedef struct racer {
  const char *path; /* the file, or a symlink to it */
  uint32_t stream;
  uint64_t C;
  bs_checksum sum; /* of bucket b0 at C */
  pthread_barrier_t *start;
  unsigned iterations;
  int failed;
  char msg[320];
} racer;

static int race_once(racer *r) {
  bs_val b0 = {"b0", 2};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_checkpoint cp;
  bs_checksum sum;
  bs_error err = {0, ""};
  int rc = bs_open(&db, r->path, &nosync, &err);
  if (rc == BS_OK) rc = bs_storage_open(&st, db, r->stream, &err);
  if (rc == BS_OK) rc = bs_get_checkpoint(&cp, st, &err);
  if (rc == BS_OK) rc = bs_get_checksums(&sum, st, r->C, &b0, 1, &err);
  if (rc != BS_OK)
    snprintf(r->msg, sizeof r->msg, "%s: %s", bs_strerror(rc), err.msg);
  else if (cp.op_id != r->C || sum.checksum != r->sum.checksum || sum.count != r->sum.count)
    snprintf(r->msg, sizeof r->msg, "read checkpoint %llu (%llu ops in b0), expected %llu (%llu)",
             (unsigned long long)cp.op_id, (unsigned long long)sum.count, (unsigned long long)r->C,
             (unsigned long long)r->sum.count),
        rc = -1;
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

static void *racer_run(void *arg) {
  racer *r = arg;
  pthread_barrier_wait(r->start);
  for (unsigned i = 0; i < r->iterations && !r->failed; i++) r->failed = race_once(r) != BS_OK;
  return NULL;
}

/* Threads open, read and close the file, by its path and by a symlink, while no other handle
 * holds it: environments are opened, shared and closed under each other. */
static void t_open_close_race(void **state) {
  ct_env *e = *state;
  char link_path[256];
  pthread_barrier_t start;
  pthread_t t[RACERS];
  racer r[RACERS];
  bs_val b0 = {"b0", 2};
  bs_checkpoint cp;
  bs_checksum sum;
  write_round(e->w, 0);
  CT_OK(bs_get_checkpoint(&cp, e->st, &ct_err));
  CT_OK(bs_get_checksums(&sum, e->st, cp.op_id, &b0, 1, &ct_err));
  close_fixture(e);
  snprintf(link_path, sizeof link_path, "%s/link.bsdb", e->dir);
  assert_int_equal(symlink(e->path, link_path), 0);
  assert_int_equal(pthread_barrier_init(&start, NULL, RACERS), 0);
  for (int i = 0; i < RACERS; i++) {
    r[i] = (racer){.path = i % 2 ? link_path : e->path,
                   .stream = e->stream,
                   .C = cp.op_id,
                   .sum = sum,
                   .start = &start,
                   .iterations = getenv("BS_TEST_QUICK") ? 50 : 200};
    assert_int_equal(pthread_create(&t[i], NULL, racer_run, &r[i]), 0);
  }
  for (int i = 0; i < RACERS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < RACERS; i++)
    if (r[i].failed) fail_msg("thread %d: %s", i, r[i].msg);
  pthread_barrier_destroy(&start);
}

/* ---- Two processes, two names -------------------------------------------------------------- */

/* The child: through the symlink, every row rewritten and compacted; the exit status names the
 * first failure (0: none). */
static int child_rewrite(const char *link_path, uint32_t stream) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err;
  int rc = 0;
  if (bs_open(&db, link_path, &nosync, &err) != BS_OK) return 10;
  if (bs_storage_open(&st, db, stream, &err) != BS_OK) return 11;
  if (bs_writer_open(&w, st, NULL, &err) != BS_OK) return 12;
  for (unsigned r = 1; r <= n_rewrites() && !rc; r++)
    if (put_round(w, r) != BS_OK || compact_all(st) != BS_OK) rc = 13;
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

/* A read snapshot of this process (an export paused in its first callback, through the real
 * path) survives another process's writes and compactions through a symlink: the two share one
 * lock file, so the other's writer sees this reader. */
static void t_two_processes(void **state) {
  ct_env *e = *state;
  char link_path[256], lock[256];
  paused_export before, x;
  int go[2], status;
  pthread_t t;
  pid_t pid;
  char c = 'g';
  write_round(e->w, 0);
  export_init(&before, e->db, 0);
  CT_OK(bs_db_export(e->db, 0, on_record, &before, &ct_err));
  snprintf(link_path, sizeof link_path, "%s/link.bsdb", e->dir);
  assert_int_equal(symlink(e->path, link_path), 0);
  assert_int_equal(pipe(go), 0);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(go[1]);
    _exit(read(go[0], &c, 1) == 1 ? child_rewrite(link_path, e->stream) : 9);
  }
  close(go[0]);

  export_init(&x, e->db, 1);
  assert_int_equal(pthread_create(&t, NULL, export_thread, &x), 0);
  pthread_mutex_lock(&x.mu);
  while (!x.inside) pthread_cond_wait(&x.cv, &x.mu);
  pthread_mutex_unlock(&x.mu);
  bs_writer_close(e->w); /* the child's writer comes next: one per stream */
  e->w = NULL;
  assert_int_equal(write(go[1], &c, 1), 1);
  close(go[1]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  CT_OK(bs_writer_open(&e->w, e->st, NULL, &ct_err));

  pthread_mutex_lock(&x.mu);
  x.go = 1;
  pthread_cond_broadcast(&x.cv);
  pthread_mutex_unlock(&x.mu);
  assert_int_equal(pthread_join(t, NULL), 0);
  if (x.rc) fail_msg("export: %s (%s)", bs_strerror(x.rc), x.err.msg);
  CT_EQ_U64(x.records, before.records);
  CT_EQ_U64(x.hash, before.hash);
  snprintf(lock, sizeof lock, "%s-lock", e->path);
  assert_int_equal(access(lock, F_OK), 0);
  assert_false(exists(e->dir, "link.bsdb-lock"));
  write_round(e->w, n_rewrites() + 1); /* this process's writer goes on after the other's */
  export_destroy(&x);
  export_destroy(&before);
}

/* ---- One writer per stream across processes ---------------------------------------------- */

/* The holder, a child process: opens the file itself and a streaming writer of stream, then
 * forks a grandchild, which inherits the open writer, says so on ready (so it has run: fork()
 * may return in the holder before the grandchild has) and blocks until hold reaches its end; the
 * holder blocks until it is killed. The exit status names the first failure (0: none). */
static int child_hold(const char *path, uint32_t stream, int ready, int hold) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err;
  char c = 'r';
  pid_t g;
  if (bs_open(&db, path, &nosync, &err) != BS_OK) return 10;
  if (bs_storage_open(&st, db, stream, &err) != BS_OK) return 11;
  if (bs_writer_open(&w, st, NULL, &err) != BS_OK) return 12;
  if ((g = fork()) < 0) return 13;
  if (g == 0) {
    if (write(ready, &c, 1) != 1) _exit(1);
    close(ready);
    _exit(read(hold, &c, 1) == 0 ? 0 : 1);
  }
  close(ready);
  return read(hold, &c, 1) == 0 ? 15 : 16; /* SIGKILL comes first */
}

/* Another process's writer of the stream makes this one's BS_EBUSY (the other kind, reads and
 * compaction go on); when that process is killed (SIGKILL) its lock is free at once, also while
 * the child it forked with the writer open still runs. */
static void t_writer_lock_processes(void **state) {
  ct_env *e = *state;
  bs_writer_options so = BS_WRITER_OPTIONS_INIT;
  bs_writer *w = NULL;
  bs_checkpoint cp;
  int ready[2], hold[2], status;
  pid_t pid;
  char c;
  so.snapshot = 1;
  write_round(e->w, 0);
  bs_writer_close(e->w);
  e->w = NULL;
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(pipe(hold), 0);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    close(hold[1]);
    _exit(child_hold(e->path, e->stream, ready[1], hold[0]));
  }
  close(ready[1]);
  close(hold[0]);
  assert_int_equal(read(ready[0], &c, 1), 1);
  CT_RC(BS_EBUSY, bs_writer_open(&w, e->st, NULL, &ct_err));
  assert_null(w);
  assert_non_null(strstr(ct_err.msg, "already has a streaming writer"));
  CT_OK(bs_writer_open(&w, e->st, &so, &ct_err));
  bs_writer_close(w);
  CT_OK(bs_get_checkpoint(&cp, e->st, &ct_err));
  assert_true(cp.op_id > 0);
  compact(e->st);

  assert_int_equal(kill(pid, SIGKILL), 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CT_OK(bs_writer_open(&e->w, e->st, NULL, &ct_err));
  close(hold[1]); /* the grandchild ends */
  close(ready[0]);
  write_round(e->w, 1);
}

/* ---- Two processes, two hard-link names ----------------------------------------------------- */

/* Opens path (read-only when rdonly) in a child process and closes it: 0, or 100 + the code. */
static int open_in_child(const char *path, unsigned flags) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_error err;
  int rc, status;
  pid_t pid;
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    o.flags = flags;
    rc = bs_open(&db, path, &o, &err);
    if (rc == BS_EBUSY && !strstr(err.msg, "by another name")) _exit(99);
    bs_close(db);
    _exit(rc == BS_OK ? 0 : 100 - rc);
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* A child that opens path, says so on ready and holds it until hold is closed. */
static int child_hold_name(const char *path, int ready, int hold) {
  bs_db *db = NULL;
  bs_error err;
  char c = 'r';
  if (bs_open(&db, path, &nosync, &err) != BS_OK) return 10;
  if (write(ready, &c, 1) != 1) return 11;
  (void)read(hold, &c, 1);
  bs_close(db);
  return 0;
}

static void t_hardlink_processes(void **state) {
  ct_env *e = *state;
  char other[256];
  int ready[2], hold[2], status;
  bs_db *db = NULL;
  pid_t pid;
  char c;
  write_round(e->w, 0);
  snprintf(other, sizeof other, "%s/other.bsdb", e->dir);
  assert_int_equal(link(e->path, other), 0);
  /* this process has it open by e->path: another process may use that name, not the other */
  assert_int_equal(open_in_child(e->path, BS_OPEN_NOSYNC), 0);
  assert_int_equal(open_in_child(other, BS_OPEN_NOSYNC), 100 - BS_EBUSY);
  assert_int_equal(open_in_child(other, BS_OPEN_RDONLY), 100 - BS_EBUSY);
  assert_false(exists(e->dir, "other.bsdb-lock"));
  /* in this process, every name shares the one environment */
  CT_OK(bs_open(&db, other, &nosync, &ct_err));
  bs_close(db);
  close_fixture(e);
  assert_int_equal(open_in_child(other, BS_OPEN_NOSYNC), 0);

  /* the other way round: a child holds it by the other name */
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(pipe(hold), 0);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    close(hold[1]);
    _exit(child_hold_name(other, ready[1], hold[0]));
  }
  close(ready[1]);
  close(hold[0]);
  assert_int_equal(read(ready[0], &c, 1), 1);
  CT_RC(BS_EBUSY, bs_open(&db, e->path, &nosync, &ct_err));
  assert_null(db);
  assert_non_null(strstr(ct_err.msg, "by another name"));
  close(hold[1]);
  close(ready[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CT_OK(bs_open(&e->db, e->path, &nosync, &ct_err));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_same_path, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_relative_path, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_symlink, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_hardlink, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_conflicts, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_lock_file, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_fork, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_open_close_race, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_two_processes, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_writer_lock_processes, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(t_hardlink_processes, setup, ct_env_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
