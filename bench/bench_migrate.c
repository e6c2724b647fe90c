/*
 * bench_migrate: the LMDB format migrations (lmdb_format.c) on a large file of the oldest format,
 * at several transaction sizes. Built apart from bsbench (make build/bench/bench_migrate).
 *
 *   build/bench/bench_migrate [--rows N] [--data-size N] [--batches A,B,...] [--reps R]
 *                             [--dir DIR] [--keep]
 *
 * It writes a database of --rows rows with the library (each row in one bucket of 1,000, object
 * id = replica id, as bsbench's rows; --data-size bytes of stored row data, 0 = none), turns it
 * into the file a format-1 build wrote (every source record re-encoded as format 1 with
 * tests/util_format1.h, the format record 1), and then, for each batch size (records a
 * transaction; 0 = no bound) and each repetition, in its own forked child, upgrades a copy by a
 * read-write bs_open with the migration's byte bound lifted (the record count alone cuts
 * transactions). That open runs the whole chain to this build's format: 1 -> 2 and 2 -> 3 each
 * rewrite every source record (format 2: smaller records; 3: the table's name left out), 3 -> 4
 * only stamps the version (a clear's fence flag), timed with the ops steps after it (4 -> 5 and
 * 5 -> 6: the ops, one a record in the format-1 file, regrouped into chunks, then recoded). It reports per step and for the whole open the
 * median time and the transactions (a step ends in the transaction that converts its last
 * record, so the seam's record count says where each step ended), the whole open's time against
 * the first batch size given (the baseline: the shipped 10,000), the peak anonymous memory
 * (sampled from /proc/self/statm every 256 records: LMDB keeps a transaction's dirty pages in
 * malloc'd memory) and the child's peak RSS (getrusage; it includes the mapped file pages the
 * migration touched). Repetitions alternate the order of the batch sizes, so drift in the
 * machine's load spreads over all of them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tests/util_format1.h"
#include "lmdb_internal.h"

#define MAX_BATCHES 16
#define MAX_REPS    15

static void die(const char *what, const char *detail) {
  fprintf(stderr, "bench_migrate: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bs_val v(const char *s) {
  return (bs_val){(const unsigned char *)s, strlen(s)};
}

static void check(int rc, const char *what, const bs_error *err) {
  if (rc != BS_OK) die(what, err->msg);
}

/* rows rows into a new database at path, committed every 10,000. */
static void write_rows(const char *path, uint64_t rows, size_t data_size) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_error err = {0};
  bs_commit_result cr;
  char id[32], bucket[32], data[128], lsn[32], *stored = malloc(data_size + 1);
  bs_storage *st;
  bs_writer *w;
  uint32_t stream;
  bs_db *db;
  if (!stored) die("out of memory", NULL);
  memset(stored, 'x', data_size);
  o.flags = BS_OPEN_NOSYNC;
  check(bs_open(&db, path, &o, &err), "open", &err);
  check(bs_stream_create(&stream, db, "bench", NULL, &err), "stream_create", &err);
  check(bs_storage_open(&st, db, stream, &err), "storage_open", &err);
  check(bs_writer_open(&w, st, &wo, &err), "writer_open", &err);
  for (uint64_t i = 0; i < rows; i++) {
    bs_save s = BS_SAVE_INIT;
    bs_row row;
    snprintf(id, sizeof id, "%024llu", (unsigned long long)i);
    snprintf(bucket, sizeof bucket, "b%llu", (unsigned long long)(i % 1000));
    snprintf(data, sizeof data, "{\"id\":\"%s\",\"n\":%llu,\"text\":\"a todo item of the list\"}",
             id, (unsigned long long)i);
    row = (bs_row){v(bucket), v("todos"), v(id), v(data)};
    s.table = v("todos");
    s.tag = BS_INSERT;
    s.after_id = v(id);
    s.rows = &row;
    s.n_rows = 1;
    if (data_size) s.stored_data = (bs_val){(const unsigned char *)stored, data_size};
    check(bs_writer_save(w, &s, &err), "save", &err);
    if (i % 10000 == 9999 || i + 1 == rows) {
      snprintf(lsn, sizeof lsn, "%016llu", (unsigned long long)i);
      check(bs_writer_commit(&cr, w, v(lsn), NULL, &err), "commit", &err);
    }
  }
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  free(stored);
}

/* The ops of this build's chunks (format 6) as a format-1 build wrote them: an op a record, keyed
 * bucket id | op id, its value format 5's op value (docs/format.md 4.3), in transactions of
 * 10,000 chunks. */
static void unchunk_ops(MDB_env *env, const char *path) {
  unsigned char next[16] = {0}, kb[16], *buf = malloc(1 << 20), *ov = malloc(2 << 20);
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS], n;
  int mrc = 0;
  if (!buf || !ov) die("out of memory", NULL);
  while (mrc != MDB_NOTFOUND) {
    MDB_txn *txn;
    MDB_dbi ops;
    MDB_cursor *cur;
    MDB_val k = {16, next}, v;
    if (mdb_txn_begin(env, NULL, 0, &txn) || mdb_dbi_open(txn, "ops", 0, &ops) ||
        mdb_cursor_open(txn, ops, &cur))
      die("cannot begin a transaction", path);
    /* a chunk's ops take keys up to the chunk's, and the next chunk's key is above it */
    for (unsigned c = 0; c < 10000 && (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)) == 0;
         c++, k = (MDB_val){16, next}) {
      uint64_t bucket = bs__get_u64be(k.mv_data);
      if (v.mv_size > (size_t)1 << 20) die("a chunk larger than 1 MiB", path);
      memcpy(buf, v.mv_data, v.mv_size);
      if (bs__chunk_decode(buf, v.mv_size, ids, off, len, &n) ||
          !(bs__chunk_flags(buf) & BS_CHUNK_COMPACT) || mdb_cursor_del(cur, 0))
        die("a chunk does not decode", path);
      for (uint32_t i = 0; i < n; i++) {
        MDB_val ok = {16, kb}, ovv;
        bs_op op;
        /* (an op of a chunk of at most 1 MiB takes at most 2 MiB in format 5's encoding) */
        if (bs__op_value_cdecode(buf + off[i], len[i], ids[i], &op))
          die("an op does not decode", path);
        bs__op_value_encode(ov, &op);
        ovv = (MDB_val){bs__op_value_size(&op), ov};
        bs__put_u64be(kb, bucket);
        bs__put_u64be(kb + 8, ids[i]);
        if (mdb_put(txn, ops, &ok, &ovv, MDB_NOOVERWRITE)) die("cannot write an op", path);
      }
      bs__put_u64be(next, bucket);
      bs__put_u64be(next + 8, ids[n - 1] + 1);
    }
    if (mrc && mrc != MDB_NOTFOUND) die("cannot read the ops", path);
    mdb_cursor_close(cur);
    if (mdb_txn_commit(txn)) die("cannot commit", path);
  }
  free(buf);
  free(ov);
}

/* Rewrites the file at path as a format-1 build wrote it: the ops one a record, each source
 * record in format 1 (in transactions of 100,000), then the format record 1. Returns how many
 * source records it holds. */
static uint64_t to_format1(const char *path) {
  unsigned char f1[BS_FORMAT_VALUE_SIZE], kc[BS_SOURCE_KEY_MAX], *buf = malloc(1 << 20);
  bs__member *m = malloc(1024 * sizeof *m);
  MDB_val k, val, fk = bs__lmdb_format_key(), fv;
  MDB_dbi meta, src;
  MDB_cursor *cur;
  MDB_txn *txn;
  MDB_env *env;
  bs_val lk[64];
  int mrc = 0, done = 0;
  uint64_t total = 0;
  if (!buf || !m) die("out of memory", NULL);
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) ||
      mdb_env_set_mapsize(env, (size_t)1 << 40) ||
      mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOSYNC, 0644))
    die("cannot open the file with LMDB", path);
  unchunk_ops(env, path);
  k.mv_size = 0;
  while (!done) {
    size_t n = 0;
    if (mdb_txn_begin(env, NULL, 0, &txn) || mdb_dbi_open(txn, "meta", 0, &meta) ||
        mdb_dbi_open(txn, "source", 0, &src) || mdb_cursor_open(txn, src, &cur))
      die("cannot begin a transaction", path);
    if (k.mv_size) { /* after the last key rewritten */
      k.mv_data = kc;
      mrc = mdb_cursor_get(cur, &k, &val, MDB_SET);
      if (!mrc) mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT);
    } else {
      mrc = mdb_cursor_get(cur, &k, &val, MDB_FIRST);
    }
    for (; mrc == 0 && n < 100000; n++, mrc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
      bs_val key = {k.mv_data, k.mv_size};
      MDB_val out;
      bs__srec r;
      if (bs__lmdb_srec_head(&val, &r) || r.nm > 1024 || r.nl > 64 ||
          bs__lmdb_srec_decode(&val, v("todos"), bs__lmdb_source_rid(key), &r, m, lk))
        die("a source record does not decode", path);
      out.mv_size = srec1_encode(buf, &r);
      out.mv_data = buf;
      memcpy(kc, k.mv_data, k.mv_size); /* a put that changes the value's size moves the node */
      k.mv_data = kc;
      if (mdb_cursor_put(cur, &k, &out, MDB_CURRENT)) die("cannot rewrite a source record", path);
    }
    if (mrc && mrc != MDB_NOTFOUND) die("cannot read the source records", path);
    total += n;
    done = mrc == MDB_NOTFOUND;
    mdb_cursor_close(cur);
    if (done) {
      bs__lmdb_format_value(f1, 1);
      fv = (MDB_val){sizeof f1, f1};
      if (mdb_put(txn, meta, &fk, &fv, 0)) die("cannot write the format record", path);
    }
    if (mdb_txn_commit(txn)) die("cannot commit", path);
  }
  mdb_env_sync(env, 1);
  mdb_env_close(env);
  free(buf);
  free(m);
  return total;
}

/* ---- One measured migration, in a child ---------------------------------------------------- */

#define STEPS 3 /* 1 -> 2, 2 -> 3, 3 -> 4 and the ops steps after it */

typedef struct result {
  double secs, step_secs[STEPS], anon_mb, rss_mb;
  unsigned batches, step_txns[STEPS];
} result;

static long anon_peak;                 /* pages */
static unsigned batches;               /* transactions of the migration */
static uint64_t n_source, converted;   /* source records; records converted so far */
static unsigned step, step_end[STEPS]; /* the step under way; the transactions before each end */
static double t_end[STEPS];

static void sample(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size, res, shr;
  if (!f) return;
  if (fscanf(f, "%ld %ld %ld", &size, &res, &shr) == 3 && res - shr > anon_peak)
    anon_peak = res - shr;
  fclose(f);
}
static void on_record(uint64_t n) {
  converted = n + 1;
  if (n % 256 == 0) sample();
}
/* Before transaction n: the steps that rewrite the source records end with their last record,
 * the stamp in the transaction after them (then one more finds nothing to do). */
static void on_batch(unsigned n) {
  double t = now_s();
  batches = n + 1;
  sample();
  if (step < STEPS - 1 && converted == n_source * (step + 1)) {
    step_end[step] = n;
    t_end[step++] = t;
  }
  step_end[STEPS - 1] = n;
  t_end[STEPS - 1] = t;
}

static result migrate(const char *f1, const char *work, unsigned records) {
  bs__lmdb_migrate_seam seam = {records ? records : UINT32_MAX, SIZE_MAX, on_batch, on_record};
  struct rusage ru;
  result r;
  int fd[2], status;
  pid_t pid;
  char lock[4200];
  snprintf(lock, sizeof lock, "%s-lock", work);
  (void)unlink(lock);
  {
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && sync", f1, work);
    if (system(cmd) != 0) die("cannot copy", f1);
  }
  if (pipe(fd)) die("pipe", strerror(errno));
  fflush(NULL);
  if ((pid = fork()) < 0) die("fork", strerror(errno));
  if (pid == 0) {
    bs_error err = {0};
    bs_db *db;
    double t0;
    bs__lmdb_set_migrate_seam(&seam);
    sample();
    t0 = now_s();
    if (bs_open(&db, work, NULL, &err) != BS_OK) die("the migrating open failed", err.msg);
    r.secs = now_s() - t0;
    bs_close(db);
    if (step != STEPS - 1) die("the steps did not convert every source record", NULL);
    for (unsigned i = 0; i < STEPS; i++) {
      r.step_secs[i] = t_end[i] - (i ? t_end[i - 1] : t0);
      r.step_txns[i] = step_end[i] - (i ? step_end[i - 1] : 0);
    }
    r.anon_mb = (double)anon_peak * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
    r.batches = batches;
    if (write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(2);
    _exit(0);
  }
  close(fd[1]);
  if (read(fd[0], &r, sizeof r) != (ssize_t)sizeof r) die("the child failed", NULL);
  close(fd[0]);
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
    die("the child failed", NULL);
  r.rss_mb = (double)ru.ru_maxrss / 1024.0;
  return r;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  unsigned list[MAX_BATCHES] = {10000, 1000, 4000, 40000, 100000, 0}, n_list = 6, reps = 3;
  uint64_t rows = 1000000;
  size_t data_size = 0;
  const char *dir = NULL;
  int keep = 0;
  char f1[4096], work[4096], tmpl[] = "/tmp/bs_migrate_XXXXXX";
  static result res[MAX_BATCHES][MAX_REPS];
  struct stat sb;
  double t0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--keep")) {
      keep = 1;
    } else if (!next) {
      die("usage: bench_migrate [--rows N] [--data-size N] [--batches A,B,...] [--reps R] "
          "[--dir DIR] [--keep]",
          NULL);
    } else if (!strcmp(a, "--rows")) {
      rows = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(a, "--data-size")) {
      data_size = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(a, "--reps")) {
      reps = (unsigned)strtoul(argv[++i], NULL, 10);
      if (reps < 1 || reps > MAX_REPS) die("--reps: 1 to 15", NULL);
    } else if (!strcmp(a, "--dir")) {
      dir = argv[++i];
    } else if (!strcmp(a, "--batches")) {
      char *s = argv[++i], *end;
      for (n_list = 0; *s && n_list < MAX_BATCHES; s = *end ? end + 1 : end)
        list[n_list++] = (unsigned)strtoul(s, &end, 10);
    } else {
      die("unknown option", a);
    }
  }
  if (!dir && !(dir = mkdtemp(tmpl))) die("mkdtemp", strerror(errno));
  snprintf(f1, sizeof f1, "%s/format1.mdb", dir);
  snprintf(work, sizeof work, "%s/work.mdb", dir);
  t0 = now_s();
  write_rows(f1, rows, data_size);
  n_source = to_format1(f1);
  if (stat(f1, &sb)) die("stat", f1);
  printf("bench_migrate: %llu rows (stored data %zu bytes), a format-1 file of %.1f MB made in "
         "%.1f s\n",
         (unsigned long long)rows, data_size, (double)sb.st_size / 1048576.0, now_s() - t0);
  for (unsigned rep = 0; rep < reps; rep++)
    for (unsigned j = 0; j < n_list; j++) {
      unsigned b = rep % 2 ? n_list - 1 - j : j;
      res[b][rep] = migrate(f1, work, list[b]);
    }
  printf("\n| records a transaction | transactions (1->2, 2->3, 3->6) | 1->2 | 2->3 | 3->6 | "
         "whole open (median of %u) | against %u | anon peak | peak RSS |\n"
         "|---|---|---|---|---|---|---|---|---|\n",
         reps, list[0]);
  {
    double base = 0;
    for (unsigned b = 0; b < n_list; b++) {
      double t[MAX_REPS], med[STEPS + 1], anon = 0, rss = 0;
      const result *r0 = &res[b][0];
      for (unsigned i = 0; i <= STEPS; i++) { /* the steps, then the whole open */
        for (unsigned rep = 0; rep < reps; rep++)
          t[rep] = i < STEPS ? res[b][rep].step_secs[i] : res[b][rep].secs;
        qsort(t, reps, sizeof t[0], cmp_double);
        med[i] = t[reps / 2];
      }
      for (unsigned rep = 0; rep < reps; rep++) {
        if (res[b][rep].anon_mb > anon) anon = res[b][rep].anon_mb;
        if (res[b][rep].rss_mb > rss) rss = res[b][rep].rss_mb;
      }
      if (b == 0) base = med[STEPS];
      if (list[b])
        printf("| %u", list[b]);
      else
        printf("| no bound");
      printf(" | %u, %u, %u | %.2f s | %.2f s | %.3f s | %.2f s | %.2fx | %.1f MB | %.0f MB |\n",
             r0->step_txns[0], r0->step_txns[1], r0->step_txns[2], med[0], med[1], med[2],
             med[STEPS], med[STEPS] / base, anon, rss);
    }
  }
  if (!keep) {
    char lock[4200];
    unlink(f1);
    unlink(work);
    snprintf(lock, sizeof lock, "%s-lock", f1);
    unlink(lock);
    snprintf(lock, sizeof lock, "%s-lock", work);
    unlink(lock);
    if (dir == tmpl) rmdir(dir);
  }
  return 0;
}
