/*
 * test_concurrency.c: readers in several threads and in a second process while a writer streams
 * and a compactor runs, all on one LMDB file.
 *  - Every read is a consistent snapshot: a reader takes the checkpoint C, reads every bucket's
 *    data and checksums at C, and the checksum must equal the sum of the op checksums it read
 *    (ft_fingerprint checks it); the reduced rows must be the same each time C is read again.
 *    BS_EINVALIDATED (compaction tore C, contract.md 5.5) is allowed and then a newer C is read.
 *  - No deadlock: the whole test runs under alarm().
 *  - Stale readers: a reader process is SIGKILLed inside a read transaction (in a callback); its
 *    LMDB reader slot stays behind; opening the file again (bs_open runs mdb_reader_check)
 *    clears it, which a raw LMDB check in a third process confirms.
 *  - Opening beside a writer in another process: that writer's commit lands between bs_open's
 *    look at the file size and its read of the meta pages (this binary's pread arranges it).
 * The binary re-executes itself for the child processes (argv[1] = role).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../storage.h"
#include "util_contract.h"
#include "util_fault.h"

static uint64_t g_seed; /* the run's (ct_run_seed) */

#define NB 6
static char bnames[NB][16];
static bs_val buckets[NB];
static const char *self_path;

static bs_val v(const char *s) {
  bs_val x = {s, s ? strlen(s) : 0};
  return x;
}

static void init_names(void) {
  for (int i = 0; i < NB; i++) {
    snprintf(bnames[i], sizeof bnames[i], "b%d", i);
    buckets[i] = v(bnames[i]);
  }
}

/* One consistent read at the current checkpoint. 0 ok, 1 torn (retry newer), -1 failure. */
static int read_once(bs_storage *st, uint64_t *C_out, char **fp_out, bs_error *err) {
  bs_checkpoint cp;
  int rc;
  *fp_out = NULL;
  if ((rc = bs_get_checkpoint(&cp, st, err))) return -1;
  *C_out = cp.op_id;
  rc = ft_fingerprint(st, cp.op_id, buckets, NB, NULL, 0, fp_out, err);
  if (rc == BS_EINVALIDATED) return 1;
  return rc ? -1 : 0;
}

/* ---- The threads --------------------------------------------------------------------------- */

typedef struct shared {
  bs_db *db;
  bs_storage *st;  /* shared by every reader thread */
  atomic_int stop; /* read by every thread while another sets it */
  uint64_t seed;
  unsigned long commits, compactions, reads, torn;
  atomic_ulong failures; /* counted under mu, read by the main thread while it waits */
  char failure[512];
  pthread_mutex_t mu;
} shared;

static void set_failure(shared *s, const char *what, const bs_error *err) {
  pthread_mutex_lock(&s->mu);
  if (!s->failures++) snprintf(s->failure, sizeof s->failure, "%s: %s", what, err ? err->msg : "");
  pthread_mutex_unlock(&s->mu);
  s->stop = 1;
}

/* Saves commit c's 20 random updates and deletes (r: the generator's state). */
static int save_batch(bs_writer *w, unsigned long c, uint64_t *r, bs_error *err) {
  char id[16], data[64];
  for (int i = 0; i < 20; i++) {
    bs_save sv = BS_SAVE_INIT;
    bs_row row;
    int rc;
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    snprintf(id, sizeof id, "r%llu", (unsigned long long)((*r >> 33) % 60));
    snprintf(data, sizeof data, "{\"c\":%lu,\"i\":%d}", c, i);
    sv.table = v("t");
    sv.tag = (*r >> 20) % 9 == 0 ? BS_DELETE : BS_UPDATE;
    if (sv.tag == BS_DELETE) {
      sv.before_id = v(id);
    } else {
      sv.after_id = v(id);
      row.bucket = buckets[(*r >> 40) % NB];
      row.object_type = v("t");
      row.object_id = v(id);
      row.data = v(data);
      sv.rows = &row;
      sv.n_rows = 1;
    }
    if ((rc = bs_writer_save(w, &sv, err)) != BS_OK) return rc;
  }
  return BS_OK;
}

static void *writer_thread(void *arg) {
  shared *s = arg;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  uint64_t r = ct_seed(s->seed, 1).s;
  char lsn[16];
  if (bs_writer_open(&w, s->st, NULL, &err)) {
    set_failure(s, "writer_open", &err);
    return NULL;
  }
  for (unsigned long c = 1; !s->stop; c++) {
    if (save_batch(w, c, &r, &err)) set_failure(s, "save", &err);
    snprintf(lsn, sizeof lsn, "%08lu", c);
    if (!s->stop && bs_writer_commit(NULL, w, v(lsn), NULL, &err))
      set_failure(s, "commit", &err);
    else
      __atomic_add_fetch(&s->commits, 1, __ATOMIC_RELAXED);
    usleep(500); /* lets the compactor take the write lock now and then */
  }
  bs_writer_close(w);
  return NULL;
}

static void *compactor_thread(void *arg) {
  shared *s = arg;
  bs_error err = {0, ""};
  for (unsigned long n = 0; !s->stop; n++) {
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
    co.min_bucket_changes = 1;
    co.min_change_ratio = 0;
    co.max_ops_per_txn = 25; /* short transactions, interleaved with the writer */
    if (n % 2) {
      co.incremental_only = 1;
      co.min_age_ms = 0;
    }
    if (bs_compact(NULL, s->st, &co, &err)) {
      set_failure(s, "compact", &err);
      break;
    }
    __atomic_add_fetch(&s->compactions, 1, __ATOMIC_RELAXED);
    usleep(2000);
  }
  return NULL;
}

static void *reader_thread(void *arg) {
  shared *s = arg;
  bs_error err = {0, ""};
  uint64_t lastC = 0;
  char *lastfp = NULL;
  while (!s->stop) {
    uint64_t C;
    char *fp;
    int rc = read_once(s->st, &C, &fp, &err);
    if (rc < 0) {
      set_failure(s, "read", &err);
      break;
    }
    if (rc == 1) {
      __atomic_add_fetch(&s->torn, 1, __ATOMIC_RELAXED);
      continue;
    }
    if (C < lastC) set_failure(s, "the checkpoint went backwards", NULL);
    /* the same C read twice shows the same rows: snapshots are stable under compaction,
     * unless the read reported a MOVE/CLEAR above C (compaction to a newer horizon) */
    if (C == lastC && lastfp && strcmp(fp, lastfp) != 0 && !strstr(fp, "target>C"))
      set_failure(s, "two reads of one checkpoint differ", NULL);
    free(lastfp);
    lastfp = fp;
    lastC = C;
    __atomic_add_fetch(&s->reads, 1, __ATOMIC_RELAXED);
  }
  free(lastfp);
  return NULL;
}

/* ---- Child processes ------------------------------------------------------------------------ */

/* role "reader": reads consistent snapshots until it has read n different checkpoints (the
 * parent's writer commits until this child has exited); exit 0 / 1, prints the count */
static int child_reader(const char *path, long n) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_error err = {0, ""};
  unsigned long reads = 0, torn = 0;
  uint64_t lastC = 0;
  long seen = 0;
  init_names();
  if (bs_open(&db, path, NULL, &err) || bs_storage_open(&st, db, 0, &err)) {
    fprintf(stderr, "child reader: open: %s\n", err.msg);
    return 1;
  }
  while (seen < n) {
    uint64_t C;
    char *fp;
    int rc = read_once(st, &C, &fp, &err);
    if (rc < 0) {
      fprintf(stderr, "child reader: %s\n", err.msg);
      return 1;
    }
    if (rc == 1) {
      torn++;
    } else {
      reads++;
      if (C != lastC) seen++;
      lastC = C;
    }
    free(fp);
  }
  bs_storage_close(st);
  bs_close(db);
  printf("child reader: %lu consistent reads of %ld checkpoints (%lu torn, retried)\n", reads, seen,
         torn);
  return 0;
}

static int block_in_read(const bs_chunk *c, void *payload) {
  int fd = *(int *)payload;
  (void)c;
  if (write(fd, "x", 1) != 1) return 1;
  for (;;) pause(); /* inside the read transaction until SIGKILL */
  return 0;
}

/* role "stuck": starts a read and blocks inside it; the parent kills it */
static int child_stuck(const char *path, int fd) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_checkpoint cp;
  bs_bucket_request req;
  int more;
  init_names();
  if (bs_open(&db, path, NULL, NULL) || bs_storage_open(&st, db, 0, NULL) ||
      bs_get_checkpoint(&cp, st, NULL))
    return 1;
  req.bucket = buckets[0];
  req.after = 0;
  for (int i = 0; i < NB; i++) { /* find a bucket with ops so the callback runs */
    req.bucket = buckets[i];
    bs_get_bucket_data(&more, st, cp.op_id, &req, 1, NULL, block_in_read, &fd, NULL);
  }
  return 1;
}

/* role "open": bs_open + bs_close (runs the library's stale-reader check) */
static int child_open(const char *path) {
  bs_db *db = NULL;
  if (bs_open(&db, path, NULL, NULL)) return 1;
  bs_close(db);
  return 0;
}

/* role "rawcheck": plain LMDB: exit status = the number of stale reader slots it cleared */
static int child_rawcheck(const char *path) {
  MDB_env *env;
  int dead = -1;
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 32) ||
      mdb_env_open(env, path, MDB_NOSUBDIR | MDB_RDONLY, 0644))
    return 100;
  if (mdb_reader_check(env, &dead)) dead = 101;
  mdb_env_close(env);
  return dead;
}

static long long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* role "grow": commits batches until the file is longer than min bytes; exit 0, or 1 */
static int child_grow(const char *path, long long min) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  uint64_t r = 1;
  char lsn[16];
  int rc = 1;
  init_names();
  oo.flags = BS_OPEN_NOSYNC;
  if (bs_open(&db, path, &oo, &err) || bs_storage_open(&st, db, 0, &err) ||
      bs_writer_open(&w, st, NULL, &err))
    goto done;
  for (unsigned long c = 1; c <= 10000 && rc; c++) {
    snprintf(lsn, sizeof lsn, "%08lu", c);
    if (save_batch(w, c, &r, &err) || bs_writer_commit(NULL, w, v(lsn), NULL, &err)) goto done;
    if (file_size(path) > min) rc = 0;
  }
done:
  if (rc) fprintf(stderr, "child grow: %s\n", err.msg[0] ? err.msg : "the file did not grow");
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

static pid_t spawn(const char *role, const char *path, const char *arg, int keep_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    (void)keep_fd;
    execl(self_path, self_path, role, path, arg, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int wait_status(pid_t pid) {
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The interleaving test_open_while_growing asserts, arranged: this binary's pread comes before
 * libc's (the static library binds to it; it reaches the real one through dlsym(RTLD_NEXT)).
 * Once armed, the first read at offset 0 of the armed file, which is bs_open's read of meta page
 * 0 after it took the file's size, first waits for a "grow" child that commits in another process
 * until the file is longer than that size. */
static struct {
  const char *path;
  int armed, fired, status;
} grow;

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  static __typeof__(pread) *real;
  struct stat a, b;
  char size[32];
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pread");
  if (grow.armed && off == 0 && fstat(fd, &a) == 0 && stat(grow.path, &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    grow.armed = 0;
    snprintf(size, sizeof size, "%lld", (long long)a.st_size);
    grow.status = wait_status(spawn("grow", grow.path, size, -1));
    grow.fired++;
  }
  return real(fd, buf, n, off);
}

/* ---- Tests ---------------------------------------------------------------------------------- */

typedef struct cx {
  char dir[256], path[320];
} cx;

static void open_shared(cx *x, shared *s) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_writer *w = NULL;
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  assert_int_equal(ft_tmpdir(x->dir, sizeof x->dir, "conc"), 0);
  snprintf(x->path, sizeof x->path, "%s/db", x->dir);
  oo.flags = BS_OPEN_NOSYNC;
  oo.map_size = 1 << 20; /* small: the map grows while readers run */
  assert_int_equal(bs_open(&s->db, x->path, &oo, NULL), BS_OK);
  assert_int_equal(bs_stream_create(NULL, s->db, "s", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&s->st, s->db, 0, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w, s->st, NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, v("00000000"), NULL), BS_OK);
  assert_int_equal(bs_writer_keepalive(NULL, w, v("00000000"), NULL), BS_OK);
  bs_writer_close(w);
  s->seed = g_seed;
}

static void close_shared(cx *x, shared *s) {
  uint64_t problems = 1;
  assert_int_equal(bs_db_verify(&problems, s->db, NULL, NULL, NULL), BS_OK);
  assert_int_equal(problems, 0);
  bs_storage_close(s->st);
  bs_close(s->db);
  pthread_mutex_destroy(&s->mu);
  ft_rm_db(x->dir, x->path);
}

/* Runs until every party has done its share, counted, not timed: the child reader has read 40
 * (quick) or 400 different checkpoints, the writer made as many commits, the compactor 3 runs
 * and the reader threads as many reads. A slow machine (valgrind, a loaded CI) takes longer;
 * alarm() only catches a deadlock. */
static void test_readers_writer_compactor(void **state) {
  cx x;
  shared s;
  pthread_t tw, tc, tr[3];
  pid_t child;
  char n[32];
  long want = getenv("BS_TEST_QUICK") ? 40 : 400;
  int rc = -1;
  (void)state;
  open_shared(&x, &s);
  snprintf(n, sizeof n, "%ld", want);
  alarm(900); /* a deadlock fails the test instead of hanging it */
  assert_int_equal(pthread_create(&tw, NULL, writer_thread, &s), 0);
  assert_int_equal(pthread_create(&tc, NULL, compactor_thread, &s), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&tr[i], NULL, reader_thread, &s), 0);
  child = spawn("reader", x.path, n, -1);
  for (;;) {
    int st;
    if (rc < 0 && waitpid(child, &st, WNOHANG) == child)
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 200 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (s.failures && rc < 0) { /* the writer stopped: the child would wait for it forever */
      kill(child, SIGKILL);
      rc = wait_status(child);
    }
    if (s.failures ||
        (rc >= 0 && __atomic_load_n(&s.commits, __ATOMIC_RELAXED) >= (unsigned long)want &&
         __atomic_load_n(&s.compactions, __ATOMIC_RELAXED) >= 3 &&
         __atomic_load_n(&s.reads, __ATOMIC_RELAXED) >= (unsigned long)want))
      break;
    usleep(1000);
  }
  s.stop = 1;
  pthread_join(tw, NULL);
  pthread_join(tc, NULL);
  for (int i = 0; i < 3; i++) pthread_join(tr[i], NULL);
  alarm(0);
  printf("concurrency (seed %llu): %lu commits, %lu compactions, %lu consistent reads in 3 "
         "threads (%lu torn, retried); child reader exit %d\n",
         (unsigned long long)s.seed, s.commits, s.compactions, s.reads, s.torn, rc);
  if (s.failures) fail_msg("BS_SEED=%llu: %s", (unsigned long long)s.seed, s.failure);
  assert_int_equal(rc, 0);
  close_shared(&x, &s);
}

static void test_stale_reader(void **state) {
  cx x;
  shared s;
  pthread_t tw;
  int fds[2], dead;
  char c, fdbuf[16];
  pid_t stuck;
  (void)state;
  open_shared(&x, &s);
  alarm(900); /* a deadlock guard only, as above */
  /* some data, so that the stuck reader's callback runs */
  assert_int_equal(pthread_create(&tw, NULL, writer_thread, &s), 0);
  while (__atomic_load_n(&s.commits, __ATOMIC_RELAXED) < 3) usleep(1000);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(pipe(fds), 0);
    snprintf(fdbuf, sizeof fdbuf, "%d", fds[1]);
    stuck = spawn("stuck", x.path, fdbuf, fds[1]);
    close(fds[1]);
    assert_int_equal(read(fds[0], &c, 1), 1); /* it is inside its read txn */
    close(fds[0]);
    kill(stuck, SIGKILL);
    assert_int_equal(wait_status(stuck), 200 + SIGKILL);
    /* the writer keeps committing beside the stale slot: two more commits, counted */
    for (unsigned long c0 = __atomic_load_n(&s.commits, __ATOMIC_RELAXED);
         __atomic_load_n(&s.commits, __ATOMIC_RELAXED) < c0 + 2 && !s.failures;)
      usleep(1000);
    if (round == 1) /* the library's open clears it */
      assert_int_equal(wait_status(spawn("open", x.path, "", -1)), 0);
    dead = wait_status(spawn("rawcheck", x.path, "", -1));
    /* round 0: the slot was stale until this raw check; round 1: bs_open had cleared it */
    assert_int_equal(dead, round == 0 ? 1 : 0);
  }
  s.stop = 1;
  pthread_join(tw, NULL);
  alarm(0);
  if (s.failures) fail_msg("%s", s.failure);
  printf("stale reader: killed 2 readers inside a read txn; bs_open cleared the stale slot\n");
  close_shared(&x, &s);
}

/* bs_open beside a writer in another process: a commit of that writer grows the file after the
 * open took the file's size and before it read the meta pages, so the newest meta page describes
 * a file longer than that size. The open succeeds and sees the commit. */
static void test_open_while_growing(void **state) {
  cx x;
  shared s;
  bs_checkpoint before, after;
  uint64_t problems = 1;
  bs_error err = {0, ""};
  (void)state;
  open_shared(&x, &s);
  assert_int_equal(bs_get_checkpoint(&before, s.st, NULL), BS_OK);
  bs_storage_close(s.st);
  bs_close(s.db);
  grow.path = x.path;
  grow.armed = 1;
  if (bs_open(&s.db, x.path, NULL, &err) != BS_OK) fail_msg("open beside a writer: %s", err.msg);
  assert_int_equal(grow.armed, 0);
  assert_int_equal(grow.fired, 1);
  assert_int_equal(grow.status, 0); /* the file grew between the open's stat and its read */
  assert_int_equal(bs_storage_open(&s.st, s.db, 0, NULL), BS_OK);
  assert_int_equal(bs_get_checkpoint(&after, s.st, NULL), BS_OK);
  assert_true(after.op_id > before.op_id);
  assert_int_equal(bs_db_verify(&problems, s.db, NULL, NULL, NULL), BS_OK);
  assert_int_equal(problems, 0);
  close_shared(&x, &s);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_readers_writer_compactor),
      cmocka_unit_test(test_stale_reader),
      cmocka_unit_test(test_open_while_growing),
  };
  self_path = argv[0];
  if (argc >= 3 && !strcmp(argv[1], "reader")) return child_reader(argv[2], atol(argv[3]));
  if (argc >= 4 && !strcmp(argv[1], "stuck")) return child_stuck(argv[2], atoi(argv[3]));
  if (argc >= 3 && !strcmp(argv[1], "open")) return child_open(argv[2]);
  if (argc >= 3 && !strcmp(argv[1], "rawcheck")) return child_rawcheck(argv[2]);
  if (argc >= 4 && !strcmp(argv[1], "grow")) return child_grow(argv[2], atoll(argv[3]));
  init_names();
  g_seed = ct_run_seed("concurrency");
  return cmocka_run_group_tests(tests, NULL, NULL);
}
