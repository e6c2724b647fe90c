/*
 * migrate_kill: SIGKILL inside an LMDB format migration, at points chosen by count, never by
 * time. Usage: migrate_kill OLD_FILE DIR
 *
 * OLD_FILE is a file an older build wrote (tests/data/formatN.mdb). A copy migrated without
 * interruption gives the reference: its records (bs_db_export, byte for byte). Then, for each
 * point of a migration run in transactions of BATCH records (the seam of lmdb_format.c), before
 * each transaction and before each record's put, a child process opens a fresh copy read-write
 * and raises SIGKILL at that point. The file it leaves is the old one (nothing committed yet),
 * or one whose migration stopped halfway (a read-only open says so), or one between two steps
 * (a format between the old one and this build's), or, killed before the last transaction that
 * finds nothing left, a finished one. Then the next read-write open finishes the migration,
 * bs_db_verify finds no problem, and the records equal the reference.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lmdb_internal.h"
#define KILL_PROG "migrate_kill"
#include "kill_files.h"

#define BATCH 8 /* records a transaction: several transactions on the small file */

/* Opens path read-write (the migration finishes), verifies it and returns its records. */
static bytes finish(const char *path) {
  bs_error err = {0};
  bytes b = {NULL, 0, 0};
  uint64_t problems = 1;
  bs_db *db;
  if (bs_open(&db, path, NULL, &err) != BS_OK) die("the read-write open failed", err.msg);
  if (bs_db_verify(&problems, db, NULL, NULL, &err) != BS_OK) die("verify failed", err.msg);
  if (problems) die("verify found problems", path);
  if (bs_db_export(db, 0, add_record, &b, &err) != BS_OK) die("export failed", err.msg);
  bs_close(db);
  return b;
}

/* The point the child dies at: before transaction kill_batch, or before the put of record
 * kill_record (UINT64_MAX / UINT32_MAX: not that kind). */
static unsigned kill_batch = UINT32_MAX;
static uint64_t kill_record = UINT64_MAX;
static unsigned batches;
static uint64_t records;

static void on_batch(unsigned n) {
  batches = n + 1;
  if (n == kill_batch) raise(SIGKILL);
}
static void on_record(uint64_t n) {
  records = n + 1;
  if (n == kill_record) raise(SIGKILL);
}

/* The old file's format (what a read-only open of it names). */
static unsigned old_format;

/* What a read-only open says of the file a kill left: 0 the old file (it refuses the old
 * format), 1 a migration stopped halfway, 2 a finished one (it opens), 3 one between two steps
 * (it refuses a format newer than the old one). */
static int left(const char *path) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *db = NULL;
  const char *at;
  unsigned v;
  int rc;
  o.flags = BS_OPEN_RDONLY;
  rc = bs_open(&db, path, &o, &err);
  bs_close(db);
  if (rc == BS_OK) return 2;
  if (strstr(err.msg, "stopped halfway: a read-write open of this build finishes it")) return 1;
  if ((at = strstr(err.msg, ": format ")) && sscanf(at, ": format %u is older than", &v) == 1 &&
      v < BS_FORMAT_VERSION) {
    if (!old_format) old_format = v;
    if (v == old_format) return 0;
    if (v > old_format) return 3;
  }
  die("a read-only open after the kill", err.msg);
  return -1;
}

/* Kills a child migrating a fresh copy at the point set above; checks what it left (expect: as
 * left() answers, 1 also 3: under way, not finished) and that the next open finishes it with the
 * reference's records. */
static void kill_at(const char *old, const char *work, int expect, const bytes *want,
                    const char *point) {
  bs__lmdb_migrate_seam seam = {BATCH, 0, on_batch, on_record};
  int status;
  pid_t pid;
  bytes got;
  fresh(old, work);
  fflush(NULL);
  if ((pid = fork()) < 0) die("fork", NULL);
  if (pid == 0) {
    bs_db *db;
    bs__lmdb_set_migrate_seam(&seam);
    (void)bs_open(&db, work, NULL, NULL);
    _exit(3); /* the migration ended before the point */
  }
  if (waitpid(pid, &status, 0) != pid) die("waitpid", point);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) die("the child was not killed", point);
  if (expect == 1 ? left(work) == 0 || left(work) == 2 : left(work) != expect)
    die("the file left is not the one expected", point);
  if (expect == 0 && !same_file(old, work)) die("nothing committed, yet the file changed", point);
  got = finish(work);
  if (got.n != want->n || memcmp(got.p, want->p, got.n) != 0)
    die("the records differ from those of the uninterrupted migration", point);
  free(got.p);
}

int main(int argc, char **argv) {
  bs__lmdb_migrate_seam count = {BATCH, 0, on_batch, on_record};
  char work[4096], point[64];
  unsigned n_batches;
  uint64_t n_records;
  bytes want, counted;
  if (argc != 3) {
    fprintf(stderr, "usage: migrate_kill OLD_FILE DIR\n");
    return 2;
  }
  snprintf(work, sizeof work, "%s/work.mdb", argv[2]);
  /* the reference: one migration with the default bounds, not interrupted */
  fresh(argv[1], work);
  if (left(work) != 0) die("the file given is not of an older format", argv[1]);
  want = finish(work);
  /* the same in transactions of BATCH records: the points to kill at */
  fresh(argv[1], work);
  bs__lmdb_set_migrate_seam(&count);
  counted = finish(work);
  bs__lmdb_set_migrate_seam(NULL);
  n_batches = batches;
  n_records = records;
  if (counted.n != want.n || memcmp(counted.p, want.p, want.n) != 0)
    die("transactions of BATCH records give other records", NULL);
  if (n_batches < 3) die("the migration took fewer than two transactions", NULL);
  free(counted.p);
  for (kill_batch = 0; kill_batch < n_batches; kill_batch++) {
    snprintf(point, sizeof point, "before transaction %u", kill_batch);
    kill_at(argv[1], work, kill_batch == 0 ? 0 : kill_batch + 1 < n_batches ? 1 : 2, &want, point);
  }
  kill_batch = UINT32_MAX;
  for (kill_record = 0; kill_record < n_records; kill_record++) {
    snprintf(point, sizeof point, "before the put of record %llu", (unsigned long long)kill_record);
    kill_at(argv[1], work, kill_record < BATCH ? 0 : 1, &want, point);
  }
  free(want.p);
  printf("migrate_kill: format %u: %u kills between transactions and %llu inside them "
         "(transactions of %d records): each migration finished by the next open, verify clean, "
         "the records of the uninterrupted one\n",
         old_format, n_batches, (unsigned long long)n_records, BATCH);
  return 0;
}
