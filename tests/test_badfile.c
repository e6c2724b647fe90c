/*
 * test_badfile.c: files that are not (or no longer) a bucketstore database get BS_ECORRUPT with
 * a message that says what is wrong, never a crash, and are never changed: the file's bytes are
 * compared before and after every open, and no PATH-lock may appear beside them.
 *  - truncations of a real database (a few thousand ops) at every page boundary, one byte to
 *    either side of it, the middle of every page, and small sizes from 0 up;
 *  - zero bytes, a directory, random bytes (seeded), a valid first meta page then garbage;
 *  - foreign LMDB files made with the LMDB API (data in the main database, a "meta" sub-database
 *    without the format record, a "meta" key that is no sub-database);
 *  - the format record rewritten to an older (0) and newer version, or to foreign bytes;
 *  - an LMDB file without data (what mdb_env_open alone leaves);
 *  - a source record whose table id no tables entry names: it opens, and verify reports it;
 *  - a missing path: BS_ENOTFOUND read-only (nothing created), created by a writable open;
 *  - the CLI's commands on a zero-byte and a foreign file: exit 1, the file unchanged, no
 *    backup written.
 * Each open is tried read-only and writable.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../storage.h"
#include "util_contract.h"
#include "util_fault.h"

static char g_dir[256], g_real[320], g_path[320], g_cli[512];
static const char *g_argv0;
static uint64_t g_seed;       /* the run's (ct_run_seed "badfile") */
static unsigned char *g_orig; /* the real database's bytes */
static size_t g_orig_size;

/* ---- Files ---------------------------------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *n) {
  struct stat sb;
  unsigned char *p;
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(fstat(fd, &sb), 0);
  *n = (size_t)sb.st_size;
  p = malloc(*n ? *n : 1);
  assert_non_null(p);
  assert_int_equal(pread(fd, p, *n, 0), (ssize_t)*n);
  close(fd);
  return p;
}

static void lock_name(char *buf, size_t cap, const char *path) {
  snprintf(buf, cap, "%s-lock", path);
}

static int has_lock(const char *path) {
  char lock[400];
  lock_name(lock, sizeof lock, path);
  return access(lock, F_OK) == 0;
}

static void drop_lock(const char *path) {
  char lock[400];
  lock_name(lock, sizeof lock, path);
  unlink(lock);
}

/* Writes path with exactly n bytes of p, without a lock file beside it. */
static void put_file(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, p, n), (ssize_t)n);
  close(fd);
  drop_lock(path);
}

/* bs_open of g_path, read-only and writable: BS_ECORRUPT, a message containing want, the bytes
 * unchanged and no lock file (unless one was there before: a foreign program's own). */
static void expect_refused(const char *want) {
  size_t n0, n1;
  unsigned char *before = slurp(g_path, &n0), *after;
  int had_lock = has_lock(g_path);
  for (int rw = 0; rw < 2; rw++) {
    bs_open_options o = BS_OPEN_OPTIONS_INIT;
    bs_error e = {0, ""};
    bs_db *db = (bs_db *)&e; /* must come back NULL */
    int rc;
    o.flags = rw ? 0 : BS_OPEN_RDONLY;
    rc = bs_open(&db, g_path, &o, &e);
    if (rc != BS_ECORRUPT || !strstr(e.msg, want))
      fail_msg("%zu-byte file, %s: got %s \"%s\", want BS_ECORRUPT \"%s\"", n0,
               rw ? "writable" : "read-only", bs_strerror(rc), e.msg, want);
    assert_null(db);
    assert_int_equal(e.code, BS_ECORRUPT);
    assert_int_equal(has_lock(g_path), had_lock);
    after = slurp(g_path, &n1);
    assert_int_equal(n1, n0);
    if (n0) assert_memory_equal(after, before, n0);
    free(after);
  }
  free(before);
}

/* ---- The real database ---------------------------------------------------------------------- */

static void save(bs_writer *w, bs_tag tag, int id, int bucket, int round) {
  char rid[32], oid[32], bk[32], data[96];
  snprintf(rid, sizeof rid, "r%d", id);
  snprintf(oid, sizeof oid, "o%d", id);
  snprintf(bk, sizeof bk, "bucket[\"%d\"]", bucket);
  snprintf(data, sizeof data, "{\"id\":\"o%d\",\"round\":%d,\"pad\":\"%0*d\"}", id, round,
           20 + id % 17, id);
  if (tag == BS_DELETE)
    CT_OK(ct_save(w, tag, "todos", rid, NULL, CT_NOROWS));
  else
    CT_OK(ct_save(w, tag, "todos", NULL, rid, CT_ROWS({bk, "todos", oid, data})));
}

/* 1500 rows into 12 buckets, then two rounds of updates and some deletes: ~3300 ops, one commit
 * per round. */
static void make_real(const char *path) {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  uint32_t stream;
  char lsn[16];
  assert_int_equal(bs_open(&db, path, NULL, NULL), BS_OK);
  assert_int_equal(bs_stream_create(&stream, db, "badfile", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, stream, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 1500; i++) {
      if (round == 2 && i % 5) continue;
      save(w, round == 0 ? BS_INSERT : i % 50 == 7 ? BS_DELETE : BS_UPDATE, i, i % 12, round);
    }
    snprintf(lsn, sizeof lsn, "%08d", round + 1);
    if (round == 0) assert_int_equal(bs_writer_snapshot_done(w, ct_v(lsn), NULL), BS_OK);
    assert_int_equal(bs_writer_commit(NULL, w, ct_v(lsn), NULL, NULL), BS_OK);
  }
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  drop_lock(path);
}

static int group_setup(void **state) {
  char *slash;
  (void)state;
  if (ft_tmpdir(g_dir, sizeof g_dir, "badfile") != 0) return -1;
  snprintf(g_real, sizeof g_real, "%s/real", g_dir);
  snprintf(g_path, sizeof g_path, "%s/bad", g_dir);
  make_real(g_real);
  g_orig = slurp(g_real, &g_orig_size);
  /* the CLI of this build: $(BUILD)/bucketstore beside $(BUILD)/tests/ */
  snprintf(g_cli, sizeof g_cli, "%s", g_argv0);
  if ((slash = strrchr(g_cli, '/')) != NULL) *slash = '\0';
  if ((slash = strrchr(g_cli, '/')) != NULL)
    strcpy(slash, "/bucketstore");
  else
    snprintf(g_cli, sizeof g_cli, "./bucketstore");
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  free(g_orig);
  ft_rm_db(g_dir, g_real);
  rmdir(g_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  drop_lock(g_path);
  return 0;
}

/* ---- Tests ---------------------------------------------------------------------------------- */

static void test_real_file_opens(void **state) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db;
  uint64_t problems = 1;
  (void)state;
  put_file(g_path, g_orig, g_orig_size);
  o.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&db, g_path, &o, NULL), BS_OK);
  assert_int_equal(bs_db_verify(&problems, db, NULL, NULL, NULL), BS_OK);
  assert_int_equal(problems, 0);
  bs_close(db);
  assert_true(has_lock(g_path)); /* beside a real database the lock file is fine */
  assert_true(g_orig_size >= 64 * 4096);
}

static void expect_truncated(size_t size) {
  char want[96];
  assert_int_equal(truncate(g_path, (off_t)size), 0);
  if (size == 0)
    snprintf(want, sizeof want, "empty file: not a bucketstore database");
  else if (size < 24) /* not even the page header and LMDB's magic: unrecognisable */
    snprintf(want, sizeof want, "not an LMDB/bucketstore file");
  else
    snprintf(want, sizeof want, "truncated: %zu bytes, the meta page", size);
  expect_refused(want);
}

static void test_truncations(void **state) {
  size_t ps = (size_t)sysconf(_SC_PAGESIZE), pages = g_orig_size / ps;
  (void)state;
  assert_int_equal(g_orig_size % ps, 0);
  put_file(g_path, g_orig, g_orig_size);
  /* largest first: each truncate leaves a prefix of the real file */
  for (size_t k = pages; k-- > 0;) {
    size_t base = k * ps;
    expect_truncated(base + ps - 1);
    if (k > 0) expect_truncated(base + ps / 2 + 1);
    if (k > 0 && base > ps) expect_truncated(base + 1);
    expect_truncated(base > 0 ? base : 0);
  }
  assert_int_equal(truncate(g_path, 0), 0);
  put_file(g_path, g_orig, 200);
  for (size_t n = 200; n-- > 1;) expect_truncated(n);
}

/* A free DB of 16 pages, each of the first 15 a branch page naming the next 200 times, in a file
 * shorter than its meta page says: the walk that looks for the missing pages on the free list
 * must stay bounded by the file's pages, not follow each of the 200^15 paths to the last (an
 * empty leaf). Offsets are LMDB's (lmdb_file.c's lf_page_head and lf_meta): a page header is
 * 16 bytes (flags at 10, lower and upper at 12 and 14); in the meta record the free DB's page
 * size is at 24, its root at 64, the last page at 120. */
static void test_free_db_fan(void **state) {
  enum { LEVELS = 16, FAN = 200 };
  unsigned char *f = malloc(g_orig_size);
  uint32_t psize;
  uint64_t first, last;
  (void)state;
  assert_non_null(f);
  memcpy(f, g_orig, g_orig_size);
  memcpy(&psize, f + 16 + 24, sizeof psize);
  first = g_orig_size / psize - LEVELS;
  last = first + LEVELS + 8;
  for (size_t i = 0; i < 2; i++) {
    memcpy(f + i * psize + 16 + 64, &first, sizeof first);
    memcpy(f + i * psize + 16 + 120, &last, sizeof last);
  }
  for (uint64_t pgno = first; pgno < first + LEVELS; pgno++) {
    unsigned char *pg = f + pgno * psize;
    uint64_t next = pgno + 1;
    uint16_t n = pgno + 1 < first + LEVELS ? FAN : 0, lower = (uint16_t)(16 + 2 * n);
    uint16_t node[4] = {(uint16_t)next, (uint16_t)(next >> 16), (uint16_t)(next >> 32), 0};
    memset(pg, 0, psize);
    memcpy(pg, &pgno, sizeof pgno);
    pg[10] = n ? 0x01 : 0x02; /* P_BRANCH, P_LEAF */
    memcpy(pg + 12, &lower, 2);
    memcpy(pg + 14, &lower, 2);
    for (uint16_t i = 0; i < n; i++) {
      uint16_t at = (uint16_t)(lower + 8 * i);
      memcpy(pg + 16 + 2 * i, &at, 2);
      memcpy(pg + at, node, sizeof node);
    }
  }
  put_file(g_path, f, g_orig_size);
  free(f);
  expect_refused("truncated");
}

static void test_zero_bytes(void **state) {
  (void)state;
  put_file(g_path, "", 0);
  expect_refused("empty file: not a bucketstore database");
}

static void test_directory(void **state) {
  bs_error e = {0, ""};
  bs_db *db = NULL;
  (void)state;
  assert_int_equal(bs_open(&db, g_dir, NULL, &e), BS_ECORRUPT);
  assert_non_null(strstr(e.msg, "not a regular file"));
  assert_null(db);
  assert_false(has_lock(g_dir));
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_random_bytes(void **state) {
  static const size_t sizes[] = {1, 7, 23, 24, 151, 152, 4095, 4096, 8192, 65536 + 3};
  uint64_t seed = g_seed, s = ct_seed(seed, 1).s | 1; /* xorshift: never 0 */
  unsigned char *buf = malloc(65536 + 3);
  (void)state;
  assert_non_null(buf);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (size_t j = 0; j < sizes[i]; j++) buf[j] = (unsigned char)rng(&s);
    put_file(g_path, buf, sizes[i]);
    print_message("random bytes: %zu, seed %llu\n", sizes[i], (unsigned long long)seed);
    expect_refused("not an LMDB/bucketstore file");
  }
  /* a real first meta page, garbage after it */
  memcpy(buf, g_orig, 4096);
  for (size_t j = 4096; j < 65536; j++) buf[j] = (unsigned char)rng(&s);
  put_file(g_path, buf, 65536);
  expect_refused("damaged: LMDB meta page 1");
  /* text */
  for (size_t j = 0; j < 65536; j++) buf[j] = "not a database\n"[j % 15];
  put_file(g_path, buf, 65536);
  expect_refused("not an LMDB/bucketstore file");
  free(buf);
}

/* An LMDB environment at g_path made by the LMDB API without a lock file; fn fills it. */
static void make_lmdb(const char *copy_of, void (*fn)(MDB_txn *txn, void *), void *payload) {
  MDB_env *env;
  MDB_txn *txn;
  unlink(g_path);
  if (copy_of) put_file(g_path, g_orig, g_orig_size);
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
  assert_int_equal(mdb_env_open(env, g_path, MDB_NOSUBDIR | MDB_NOLOCK, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  if (fn) fn(txn, payload);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  assert_false(has_lock(g_path));
}

/* Opens and closes g_path with LMDB's lock file, as its own program would: PATH-lock exists. */
static void lmdb_lock_beside(void) {
  MDB_env *env;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
  assert_int_equal(mdb_env_open(env, g_path, MDB_NOSUBDIR | MDB_RDONLY, 0644), 0);
  mdb_env_close(env);
  assert_true(has_lock(g_path));
}

/* payload: the key to put into the main database */
static void put_main(MDB_txn *txn, void *payload) {
  MDB_dbi dbi;
  MDB_val d = {5, "world"};
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  assert_int_equal(mdb_put(txn, dbi, (MDB_val *)payload, &d, 0), 0);
}

static void put_meta_subdb(MDB_txn *txn, void *payload) {
  MDB_dbi dbi;
  MDB_val k = {8, "not-ours"};
  (void)payload;
  assert_int_equal(mdb_dbi_open(txn, "meta", MDB_CREATE, &dbi), 0);
  assert_int_equal(mdb_put(txn, dbi, &k, &k, 0), 0);
}

static void test_foreign_lmdb(void **state) {
  MDB_val hello = {5, "hello"}, meta = {4, "meta"};
  (void)state;
  make_lmdb(NULL, put_main, &hello);
  expect_refused("foreign LMDB file, not a bucketstore database");
  make_lmdb(NULL, put_meta_subdb, NULL);
  expect_refused("foreign LMDB file, not a bucketstore database");
  make_lmdb(NULL, put_main, &meta); /* "meta" as a plain key: MDB_INCOMPATIBLE */
  expect_refused("foreign LMDB file, not a bucketstore database");
  /* with the foreign program's lock file beside it (the check runs in the opened environment) */
  make_lmdb(NULL, put_main, &hello);
  lmdb_lock_beside();
  expect_refused("foreign LMDB file, not a bucketstore database");
  drop_lock(g_path);
}

/* Rewrites the format record of a copy of the real database. */
static void set_format(MDB_txn *txn, void *payload) {
  MDB_dbi dbi;
  MDB_val k = {6, "format"};
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
  if (payload)
    assert_int_equal(mdb_put(txn, dbi, &k, (MDB_val *)payload, 0), 0);
  else
    assert_int_equal(mdb_del(txn, dbi, &k, NULL), 0);
}

static void test_format_versions(void **state) {
  static const uint32_t versions[] = {0, BS_FORMAT_VERSION + 1, 99, UINT32_MAX};
  unsigned char rec[12];
  MDB_val val = {12, rec};
  char want[96];
  (void)state;
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
    uint32_t ver = versions[i];
    memcpy(rec, "bktstore", 8);
    for (int b = 0; b < 4; b++) rec[8 + b] = (unsigned char)(ver >> (8 * b));
    make_lmdb(g_real, set_format, &val);
    snprintf(want, sizeof want, "format %u is %s than this build's %d", ver,
             ver < BS_FORMAT_VERSION ? "older" : "newer", BS_FORMAT_VERSION);
    expect_refused(want);
    lmdb_lock_beside(); /* and with a lock file: the check in the opened environment */
    expect_refused(want);
    drop_lock(g_path);
  }
  memcpy(rec, "sqlite3\0", 8);
  make_lmdb(g_real, set_format, &val);
  expect_refused("foreign LMDB file, not a bucketstore database");
  val.mv_size = 8; /* the magic alone */
  memcpy(rec, "bktstore", 8);
  make_lmdb(g_real, set_format, &val);
  expect_refused("foreign LMDB file, not a bucketstore database");
  make_lmdb(g_real, set_format, NULL); /* no format record */
  expect_refused("foreign LMDB file, not a bucketstore database");
}

/* Deletes the tables entry of the real database's table "todos" (its only stream, 1): its source
 * records keep a table id that no entry names. */
static void drop_table_entry(MDB_txn *txn, void *payload) {
  unsigned char kb[4 + 5] = {0, 0, 0, 1, 't', 'o', 'd', 'o', 's'};
  MDB_val k = {sizeof kb, kb};
  MDB_dbi dbi;
  (void)payload;
  assert_int_equal(mdb_dbi_open(txn, "tables", 0, &dbi), 0);
  assert_int_equal(mdb_del(txn, dbi, &k, NULL), 0);
}

static void on_problem(const char *text, void *payload) {
  if (strstr(text, "no tables entry")) ++*(unsigned *)payload;
}

/* A source record whose table id has no tables entry (its memberships' object types cannot be
 * decoded) is damage that verify reports, once for the table, read-only and writable, without
 * changing the file. */
static void test_source_without_table(void **state) {
  size_t n0, n1;
  unsigned char *before, *after;
  (void)state;
  make_lmdb(g_real, drop_table_entry, NULL);
  before = slurp(g_path, &n0);
  for (int rw = 0; rw < 2; rw++) {
    bs_open_options o = BS_OPEN_OPTIONS_INIT;
    uint64_t problems = 0;
    unsigned named = 0;
    bs_db *db;
    o.flags = rw ? 0 : BS_OPEN_RDONLY;
    CT_OK(bs_open(&db, g_path, &o, &ct_err));
    CT_OK(bs_db_verify(&problems, db, on_problem, &named, &ct_err));
    bs_close(db);
    CT_EQ_U64(named, 1);
    CT_EQ_U64(problems, 1);
    after = slurp(g_path, &n1);
    assert_int_equal(n1, n0);
    assert_memory_equal(after, before, n0);
    free(after);
  }
  free(before);
}

/* What mdb_env_open alone leaves (another program's file, or an old build's creation stopped
 * before its first commit): no command makes it a database. */
static void test_lmdb_without_data(void **state) {
  (void)state;
  make_lmdb(NULL, NULL, NULL);
  expect_refused("LMDB file without data: not a bucketstore database");
}

static void test_missing_path(void **state) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error e = {0, ""};
  bs_db *db;
  (void)state;
  unlink(g_path);
  o.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&db, g_path, &o, &e), BS_ENOTFOUND);
  assert_non_null(strstr(e.msg, "no such file"));
  assert_int_equal(access(g_path, F_OK), -1);
  assert_false(has_lock(g_path));
  assert_int_equal(bs_open(&db, g_path, NULL, &e), BS_OK); /* created */
  bs_close(db);
  assert_int_equal(access(g_path, F_OK), 0);
  { /* built under a temporary name, linked into place: nothing else is left beside it */
    DIR *d = opendir(g_dir);
    struct dirent *de;
    assert_non_null(d);
    while ((de = readdir(d)) != NULL) assert_null(strstr(de->d_name, "bad.new-"));
    closedir(d);
  }
  o.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&db, g_path, &o, &e), BS_OK);
  bs_close(db);
}

/* Runs the CLI command cmd on g_path (then the operands in more); returns its exit status,
 * stderr into err. */
static int cli(const char *args, const char *more, char *err, size_t cap) {
  char cmd[1800], errf[400];
  FILE *fp;
  size_t n;
  int st;
  snprintf(errf, sizeof errf, "%s/cli.err", g_dir);
  snprintf(cmd, sizeof cmd, "%s %s --db %s %s >/dev/null 2>%s", g_cli, args, g_path, more, errf);
  st = system(cmd);
  fp = fopen(errf, "r");
  assert_non_null(fp);
  n = fread(err, 1, cap - 1, fp);
  err[n] = '\0';
  fclose(fp);
  unlink(errf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_cli_commands(void **state) {
  static const char *const cmds[] = {"stat", "verify", "dump", "compact", "checkpoint", "backup"};
  MDB_val hello = {5, "hello"};
  char err[2048], out[400];
  size_t n0, n1;
  unsigned char *before, *after;
  (void)state;
  if (access(g_cli, X_OK) != 0) fail_msg("no CLI at %s", g_cli);
  snprintf(out, sizeof out, "%s/backup-out", g_dir);
  for (int kind = 0; kind < 2; kind++) {
    if (kind == 0)
      put_file(g_path, "", 0);
    else
      make_lmdb(NULL, put_main, &hello);
    before = slurp(g_path, &n0);
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
      int rc = cli(cmds[i], strcmp(cmds[i], "backup") ? "" : out, err, sizeof err);
      if (rc != 1 || !strstr(err, "BS_ECORRUPT") ||
          !strstr(err, kind ? "foreign LMDB file" : "empty file"))
        fail_msg("%s on a %s file: exit %d, stderr: %s", cmds[i], kind ? "foreign" : "zero-byte",
                 rc, err);
      assert_false(has_lock(g_path));
      assert_int_equal(access(out, F_OK), -1); /* backup wrote nothing */
      after = slurp(g_path, &n1);
      assert_int_equal(n1, n0);
      if (n0) assert_memory_equal(after, before, n0);
      free(after);
    }
    free(before);
  }
  /* a read-only command on a missing path creates nothing */
  unlink(g_path);
  assert_int_equal(cli("stat", "", err, sizeof err), 1);
  assert_int_equal(access(g_path, F_OK), -1);
  assert_false(has_lock(g_path));
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_real_file_opens, teardown),
      cmocka_unit_test_teardown(test_truncations, teardown),
      cmocka_unit_test_teardown(test_free_db_fan, teardown),
      cmocka_unit_test_teardown(test_zero_bytes, teardown),
      cmocka_unit_test_teardown(test_directory, teardown),
      cmocka_unit_test_teardown(test_random_bytes, teardown),
      cmocka_unit_test_teardown(test_foreign_lmdb, teardown),
      cmocka_unit_test_teardown(test_format_versions, teardown),
      cmocka_unit_test_teardown(test_lmdb_without_data, teardown),
      cmocka_unit_test_teardown(test_source_without_table, teardown),
      cmocka_unit_test_teardown(test_missing_path, teardown),
      cmocka_unit_test_teardown(test_cli_commands, teardown),
  };
  (void)argc;
  g_argv0 = argv[0];
  g_seed = ct_run_seed("badfile");
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
