/*
 * crash_writer: the victim of the crash test. Usage: crash_writer DB LOG SEED
 *
 * Opens DB (durable mode: fsync at every commit), continues the deterministic workload of
 * crash_workload.h from the commit after the file's checkpoint, and commits forever; every 5th
 * commit it also compacts (in short transactions) and sometimes runs an incremental pass. After
 * each bs_writer_commit() returns BS_OK (and at start, for the checkpoint it finds) it appends
 * "k OPID\n" to LOG and fsyncs it, so LOG's last line is a durable commit and at most one
 * commit (the one in flight) is durable and not yet logged. The harness SIGKILLs it at random
 * moments.
 *
 * DB may be a PostgreSQL URL (tests/crash/pg_crash.c): the client process is then the victim,
 * killed at a point chosen by count, not by time. BS_CRASH_PG_KILL=POINT:N makes it raise
 * SIGKILL at the N-th time the backend reaches its test seam POINT (pg_internal.h: "flush",
 * "commit", "commit.sent", "compact.apply", ...); just before, it runs a rival (this program as
 * `crash_writer DB - SEED rival`), a second process whose bs_writer_open of the stream must be
 * refused with BS_EBUSY while the writer is stopped there, its transaction open, and waits for
 * it: a rival that is not refused makes the writer exit 4 instead of dying.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crash_workload.h"
#ifdef BS_HAVE_PG
#include "pg_internal.h"
#endif

static int die(const char *what, int rc, const bs_error *err) {
  fprintf(stderr, "crash_writer: %s: %s (%s)\n", what, bs_strerror(rc), err ? err->msg : "");
  return 2;
}

/* The rival: another process opening a streaming writer of the stream (contract.md 4: one writer
 * per stream and kind, in any process or host). Exit 0 when refused with BS_EBUSY. */
static int rival(const char *path) {
  bs_error err = {0, ""};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  int rc;
  if ((rc = bs_open(&db, path, NULL, &err))) return die("rival: open", rc, &err);
  if ((rc = bs_storage_open(&st, db, 0, &err))) return die("rival: storage_open", rc, &err);
  rc = bs_writer_open(&w, st, NULL, &err);
  if (rc != BS_EBUSY) {
    fprintf(stderr,
            "crash_writer: rival: bs_writer_open beside the writer gave %s (%s), not "
            "BS_EBUSY\n",
            bs_strerror(rc), err.msg);
    bs_writer_close(w);
    return 3;
  }
  bs_storage_close(st);
  bs_close(db);
  return 0;
}

#ifdef BS_HAVE_PG
typedef struct pg_kill {
  char point[32];
  unsigned long at, seen;
  const char *self, *path;
} pg_kill;

/* The seam: at the at-th hit of point, the rival runs to its end, then this process dies. */
static void pg_kill_hook(const char *point, PGconn *c, void *payload) {
  pg_kill *k = payload;
  pid_t pid;
  int status;
  (void)c;
  if (strcmp(point, k->point) != 0 || ++k->seen != k->at) return;
  fflush(NULL);
  if ((pid = fork()) == 0) {
    execl(k->self, k->self, k->path, "-", "0", "rival", (char *)NULL);
    _exit(127);
  }
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    fprintf(stderr, "crash_writer: at %s #%lu: the rival was not refused\n", k->point, k->at);
    _exit(4);
  }
  raise(SIGKILL);
}
#endif

int main(int argc, char **argv) {
  bs_error err = {0, ""};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_checkpoint cp;
  cw_state state = {0};
  uint64_t seed, k = 0;
  int rc, log;
  if (argc == 5 && strcmp(argv[4], "rival") == 0) return rival(argv[1]);
  if (argc != 4) {
    fprintf(stderr, "usage: crash_writer DB LOG SEED\n");
    return 2;
  }
  seed = strtoull(argv[3], NULL, 10);
#ifdef BS_HAVE_PG
  static pg_kill kill_at;
  const char *spec = getenv("BS_CRASH_PG_KILL");
  if (spec && *spec) {
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : 0;
    if (!colon || n >= sizeof kill_at.point || !(kill_at.at = strtoul(colon + 1, NULL, 10))) {
      fprintf(stderr, "crash_writer: BS_CRASH_PG_KILL=%s: POINT:N expected\n", spec);
      return 2;
    }
    memcpy(kill_at.point, spec, n);
    kill_at.self = argv[0];
    kill_at.path = argv[1];
    bs__pg_set_open_hook(pg_kill_hook, &kill_at);
  }
#endif
  if ((log = open(argv[2], O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
    perror(argv[2]);
    return 2;
  }
#ifdef CRASH_NOSYNC
  /* tests/crash/powercut.sh's control: commits that return before anything is synced */
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  oo.flags = BS_OPEN_NOSYNC;
  if ((rc = bs_open(&db, argv[1], &oo, &err))) return die("open", rc, &err);
#else
  if ((rc = bs_open(&db, argv[1], NULL, &err))) return die("open", rc, &err);
#endif
  rc = bs_storage_open(&st, db, 0, &err);
  if (rc == BS_ENOTFOUND) {
    if ((rc = bs_stream_create(NULL, db, "crash", NULL, &err))) return die("stream", rc, &err);
    rc = bs_storage_open(&st, db, 0, &err);
  }
  if (rc) return die("storage_open", rc, &err);
  if ((rc = bs_get_checkpoint(&cp, st, &err))) return die("checkpoint", rc, &err);
  if (cp.has_lsn) {
    char buf[32];
    size_t n = cp.lsn_size < sizeof buf - 1 ? cp.lsn_size : sizeof buf - 1;
    memcpy(buf, cp.lsn, n);
    buf[n] = 0;
    k = strtoull(buf, NULL, 10);
  }
  /* The checkpoint found is durable: log it, so that the log trails the file by at most the
   * one commit in flight when this run is killed (a previous run may have died between its
   * commit and its log line). */
  if (k) {
    char line[64];
    int len = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)k,
                       (unsigned long long)cp.op_id);
    if (write(log, line, (size_t)len) != len || fsync(log) != 0) {
      perror("log");
      return 2;
    }
  }
  /* rebuild the workload's state up to the file's checkpoint (no writes) */
  for (uint64_t c = 1; c <= k; c++)
    if ((rc = cw_commit_saves(&state, seed, c, NULL, &err))) return die("replay", rc, &err);
  wo.max_records = 8; /* auto-flushes inside a commit: persisted, not yet committed ops */
  if ((rc = bs_writer_open(&w, st, &wo, &err))) return die("writer_open", rc, &err);
  if ((rc = bs_writer_snapshot_done(w, cw_v("00000000"), &err))) return die("snapshot", rc, &err);
  for (uint64_t c = k + 1;; c++) {
    bs_commit_result res;
    char lsn[32], line[64];
    int len;
    if ((rc = cw_commit_saves(&state, seed, c, w, &err))) return die("save", rc, &err);
    cw_lsn(lsn, sizeof lsn, c);
    if ((rc = bs_writer_commit(&res, w, cw_v(lsn), NULL, &err))) return die("commit", rc, &err);
    if (!res.checkpoint_created) return die("commit made no checkpoint", BS_ESTATE, NULL);
    len = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)c,
                   (unsigned long long)res.checkpoint);
    if (write(log, line, (size_t)len) != len || fsync(log) != 0) {
      perror("log");
      return 2;
    }
    if (c % 5 == 0) {
      bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
      co.min_bucket_changes = 1;
      co.min_change_ratio = 0;
      co.compact_parameters = 1;
      co.max_ops_per_txn = 20;
      if (c % 10 == 0) {
        co.incremental_only = 1;
        co.min_age_ms = 0;
      }
      if ((rc = bs_compact(NULL, st, &co, &err))) return die("compact", rc, &err);
    }
  }
}
