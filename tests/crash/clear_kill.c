/*
 * clear_kill: SIGKILL inside an LMDB clear (bs_clear), between its bounded transactions, at
 * points chosen by count, never by time. Usage: clear_kill DIR
 *
 * A database of two streams is written in DIR; a copy cleared without interruption gives the
 * reference: its records (bs_db_export, byte for byte). Then, for each of the deletion's
 * transactions (BATCH records each, the seam of lmdb_write.c), a child process clears stream s1
 * of a fresh copy and raises SIGKILL before that transaction. The file it leaves has the clear
 * pending: a read-only open (which leaves the file as it was) sees stream s1 empty (no bucket
 * data, checksums (0, 0), no bucket, no parameter set, checkpoint 0), stream s2 as it was, and
 * bs_db_verify finds no problem but says the clear is pending. The next read-write open finishes
 * the deletion: verify clean, no clear pending, and the records equal the reference.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lmdb_internal.h"
#define KILL_PROG "clear_kill"
#include "kill_files.h"

#define BATCH   64 /* records a transaction: many transactions on a small file */
#define ROWS    300u
#define BUCKETS 15u
#define LOOKUPS 7u

static void ok(int rc, const char *what, const bs_error *err) {
  if (rc != BS_OK) die(what, err->msg);
}

static bs_val str(const char *s) {
  return (bs_val){s, strlen(s)};
}

/* Lookup key i (an encoded integer) in buf. */
static bs_val lookup_key(unsigned char buf[16], unsigned i) {
  bs_scalar sc = {.type = BS_SCALAR_INT, .i = i};
  bs_error err = {0};
  size_t n;
  ok(bs_lookup_encode(buf, 16, &n, &sc, 1, &err), "lookup key", &err);
  return (bs_val){buf, n};
}

static void save(bs_writer *w, unsigned i, unsigned buckets, bs_error *err) {
  const bs_val params[1] = {{(const unsigned char *)"{\"p\":1}", 7}};
  char id[16], bucket[16];
  unsigned char key[16];
  bs_save s = BS_SAVE_INIT;
  bs_lookup lk;
  bs_row row;
  snprintf(id, sizeof id, "r%u", i);
  snprintf(bucket, sizeof bucket, "b%u", i % buckets);
  memset(&row, 0, sizeof row);
  row.bucket = str(bucket);
  row.object_type = str("t");
  row.object_id = str(id);
  row.data = str("{}");
  lk.key = lookup_key(key, i % LOOKUPS);
  lk.params = params;
  lk.n_params = 1;
  s.tag = BS_INSERT;
  s.table = str("t");
  s.after_id = str(id);
  s.rows = &row;
  s.n_rows = 1;
  s.lookups = &lk;
  s.n_lookups = 1;
  ok(bs_writer_save(w, &s, err), "save", err);
}

/* Stream s1: ROWS rows in BUCKETS buckets with lookups, a checkpoint; stream s2 (created after
 * it): a few rows flushed. */
static void make_base(const char *path) {
  bs_error err = {0};
  bs_commit_result cr;
  bs_storage *st;
  bs_writer *w;
  bs_db *db;
  uint64_t last;
  uint32_t id;
  ok(bs_open(&db, path, NULL, &err), "open", &err);
  for (unsigned s = 1; s <= 2; s++) {
    ok(bs_stream_create(&id, db, s == 1 ? "s1" : "s2", NULL, &err), "stream", &err);
    ok(bs_storage_open(&st, db, id, &err), "storage", &err);
    ok(bs_writer_open(&w, st, NULL, &err), "writer", &err);
    ok(bs_writer_snapshot_done(w, str("00000001"), &err), "snapshot_done", &err);
    for (unsigned i = 0; i < (s == 1 ? ROWS : 10u); i++) save(w, i, s == 1 ? BUCKETS : 2u, &err);
    if (s == 1)
      ok(bs_writer_commit(&cr, w, str("00000002"), NULL, &err), "commit", &err);
    else
      ok(bs_writer_flush(&last, w, &err), "flush", &err);
    bs_writer_close(w);
    bs_storage_close(st);
  }
  bs_close(db);
}

typedef struct found {
  const char *name;
  uint32_t id;
} found;

static int find_stream(const bs_stream_info *info, void *payload) {
  found *f = payload;
  if (info->name.size == strlen(f->name) && memcmp(info->name.data, f->name, info->name.size) == 0)
    f->id = info->id;
  return 0;
}

static bs_storage *stream_of(bs_db *db, const char *name, bs_error *err) {
  found f = {name, 0};
  bs_storage *st;
  ok(bs_stream_list(db, find_stream, &f, err), "stream list", err);
  if (!f.id) die("no such stream", name);
  ok(bs_storage_open(&st, db, f.id, err), "storage", err);
  return st;
}

static int count_bucket(const bs_bucket_info *info, void *payload) {
  (void)info;
  ++*(unsigned *)payload;
  return 0;
}

static int count_chunk(const bs_chunk *c, void *payload) {
  *(size_t *)payload += c->n_ops;
  return 0;
}

static int count_row(const bs_val *row, void *payload) {
  (void)row;
  ++*(unsigned *)payload;
  return 0;
}

typedef struct notes {
  unsigned pending, other;
  char first[512];
} notes;

static void on_problem(const char *text, void *payload) {
  notes *n = payload;
  if (strstr(text, "a clear is pending (not a problem)")) {
    n->pending++;
  } else if (!n->other++) {
    snprintf(n->first, sizeof n->first, "%s", text);
  }
}

/* What every reader sees of the file a kill left: s1 empty, s2 whole, verify clean. */
static void check_readers(bs_db *db, const char *point) {
  bs_error err = {0};
  bs_storage *s1 = stream_of(db, "s1", &err), *s2 = stream_of(db, "s2", &err);
  unsigned listed = 0, rows = 0;
  uint64_t problems = 0;
  notes n = {0, 0, ""};
  bs_status status;
  bs_val lookups[LOOKUPS];
  unsigned char keys[LOOKUPS][16];
  for (unsigned i = 0; i < BUCKETS; i++) {
    char bucket[16];
    bs_bucket_request req;
    bs_checksum c;
    bs_val name;
    size_t ops = 0;
    int more;
    snprintf(bucket, sizeof bucket, "b%u", i);
    name = str(bucket);
    memset(&req, 0, sizeof req);
    req.bucket = name;
    ok(bs_get_bucket_data(&more, s1, UINT32_MAX, &req, 1, NULL, count_chunk, &ops, &err), "read",
       &err);
    if (ops) die("a bucket of the cleared stream has ops", point);
    ok(bs_get_checksums(&c, s1, UINT32_MAX, &name, 1, &err), "checksums", &err);
    if (c.count || c.checksum) die("a bucket of the cleared stream has a checksum", point);
  }
  for (unsigned i = 0; i < LOOKUPS; i++) {
    lookups[i] = lookup_key(keys[i], i);
  }
  ok(bs_get_parameter_sets(s1, UINT32_MAX, lookups, LOOKUPS, 1000, count_row, &rows, &err),
     "params", &err);
  if (rows) die("the cleared stream has parameter sets", point);
  ok(bs_list_buckets(s1, (bs_val){NULL, 0}, count_bucket, &listed, &err), "list", &err);
  if (listed) die("the cleared stream lists buckets", point);
  memset(&status, 0, sizeof status);
  ok(bs_get_status(&status, s1, &err), "status", &err);
  if (status.checkpoint || status.has_lsn) die("the cleared stream has a checkpoint", point);
  ok(bs_list_buckets(s2, (bs_val){NULL, 0}, count_bucket, &listed, &err), "list", &err);
  if (listed != 2) die("stream s2 lost buckets", point);
  ok(bs_db_verify(&problems, db, on_problem, &n, &err), "verify", &err);
  if (problems || n.other) die("verify found problems", n.first);
  if (n.pending != 1) die("verify does not say the clear is pending", point);
  bs_storage_close(s1);
  bs_storage_close(s2);
}

/* Opens path read-write (the deletion finishes), verifies it and returns its records. */
static bytes finish(const char *path) {
  bs_error err = {0};
  bytes b = {NULL, 0, 0};
  uint64_t problems = 1;
  notes n = {0, 0, ""};
  bs_db *db;
  ok(bs_open(&db, path, NULL, &err), "the read-write open", &err);
  ok(bs_db_verify(&problems, db, on_problem, &n, &err), "verify", &err);
  if (problems || n.pending) die("verify after the open", n.pending ? "a clear pending" : n.first);
  ok(bs_db_export(db, 0, add_record, &b, &err), "export", &err);
  bs_close(db);
  return b;
}

static unsigned kill_batch = UINT32_MAX, batches;
static int on_batch(unsigned n) {
  batches = n + 1;
  if (n == kill_batch) raise(SIGKILL);
  return BS_OK;
}

static void clear_s1(const char *path) {
  bs_error err = {0};
  bs_storage *st;
  bs_db *db;
  ok(bs_open(&db, path, NULL, &err), "open", &err);
  st = stream_of(db, "s1", &err);
  ok(bs_clear(st, &err), "clear", &err);
  bs_storage_close(st);
  bs_close(db);
}

static void kill_at(const char *base, const char *work, const char *copy, const bytes *want,
                    const char *point) {
  bs__lmdb_clear_seam seam = {BATCH, on_batch};
  bs_open_options ro = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  int status;
  bs_db *db;
  pid_t pid;
  bytes got;
  fresh(base, work);
  fflush(NULL);
  if ((pid = fork()) < 0) die("fork", NULL);
  if (pid == 0) {
    bs__lmdb_set_clear_seam(&seam);
    clear_s1(work);
    _exit(3); /* the clear ended before the point */
  }
  if (waitpid(pid, &status, 0) != pid) die("waitpid", point);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) die("the child was not killed", point);
  copy_file(work, copy);
  ro.flags = BS_OPEN_RDONLY;
  ok(bs_open(&db, work, &ro, &err), "the read-only open", &err);
  check_readers(db, point);
  bs_close(db);
  if (!same_file(work, copy)) die("a read-only open changed the file", point);
  got = finish(work);
  if (got.n != want->n || memcmp(got.p, want->p, got.n) != 0)
    die("the records differ from those of the uninterrupted clear", point);
  free(got.p);
}

int main(int argc, char **argv) {
  bs__lmdb_clear_seam count = {BATCH, on_batch};
  char base[4096], work[4096], copy[4096], point[64];
  unsigned n_batches;
  bytes want, counted;
  if (argc != 2) {
    fprintf(stderr, "usage: clear_kill DIR\n");
    return 2;
  }
  snprintf(base, sizeof base, "%s/base.mdb", argv[1]);
  snprintf(work, sizeof work, "%s/work.mdb", argv[1]);
  snprintf(copy, sizeof copy, "%s/copy.mdb", argv[1]);
  make_base(base);
  /* the reference: a clear with the default bound, not interrupted */
  fresh(base, work);
  clear_s1(work);
  want = finish(work);
  /* the same in transactions of BATCH records: the points to kill at */
  fresh(base, work);
  bs__lmdb_set_clear_seam(&count);
  clear_s1(work);
  bs__lmdb_set_clear_seam(NULL);
  n_batches = batches;
  counted = finish(work);
  if (counted.n != want.n || memcmp(counted.p, want.p, want.n) != 0)
    die("transactions of BATCH records give other records", NULL);
  if (n_batches < 4) die("the clear took fewer than three transactions", NULL);
  free(counted.p);
  for (kill_batch = 0; kill_batch < n_batches; kill_batch++) {
    snprintf(point, sizeof point, "before deletion transaction %u", kill_batch);
    kill_at(base, work, copy, &want, point);
  }
  free(want.p);
  printf("clear_kill: %u kills between a clear's transactions (of %d records): each left the "
         "clear complete to every reader and verify clean, and the next open finished it with "
         "the records of the uninterrupted clear\n",
         n_batches, BATCH);
  return 0;
}
