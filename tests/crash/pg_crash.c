/*
 * pg_crash: the crash test on PostgreSQL. Usage: pg_crash BINDIR KILLS SEED (BS_TEST_PG_URL names
 * the server: tests/pg_server.sh run starts one; BS_SEED_LOG as crashtest.sh).
 *
 * On PostgreSQL the server survives; what can die is the client, between any two of its
 * statements, with a transaction open. So BINDIR/crash_writer (the LMDB crash test's writer and
 * workload: commits forever, a compaction every 5th commit) runs against a schema of its own and
 * is SIGKILLed KILLS times, each time at a point chosen by count, never by time: the N-th time
 * the backend reaches one of its test seams (pg_internal.h, BS_CRASH_PG_KILL=POINT:N, N drawn
 * from SEED): a flush that read its records ("flush.loaded"), a flush's or commit's statements
 * run ("flush", "commit"), its COMMIT sent and the reply not read ("commit.sent"), a compaction
 * transaction's writes done ("compact.apply"); the points take turns. At the kill point the
 * writer first runs a rival process, whose bs_writer_open of the stream must be refused
 * (BS_EBUSY). Each run goes on from the checkpoint the last one left.
 *
 * After each kill the dead client's server sessions are waited for (they end when the server
 * finds the socket closed; pg_terminate_backend(pid, 60000) waits for it), then BINDIR/crash_check
 * judges the database as it judges an LMDB file: verify clean, the checkpoint the last one the
 * writer logged (or, killed with a commit's COMMIT sent, possibly the next), and what a client
 * reads there equal to the naive model of the workload and to the memory backend's replay. A kill
 * before a COMMIT was sent must leave exactly the logged checkpoint. Prints a summary; exit 1 on
 * a failure, 77 when it cannot run (no PostgreSQL backend, BS_TEST_PG_URL unset).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef BS_HAVE_PG
#include <libpq-fe.h>

static uint64_t next_rand(uint64_t *s) { /* splitmix64, as crash_workload.h's cw_next */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static const char *const points[] = {"flush.loaded", "flush", "commit", "commit.sent",
                                     "compact.apply"};
enum { N_POINTS = sizeof points / sizeof points[0] };
/* N is drawn in 1..range[point]: a commit has 3-30 saves flushed 8 at a time (several flushes
 * a commit), one "commit" each; a compaction runs every 5th commit, in transactions of 20 ops */
static const unsigned range[N_POINTS] = {25, 25, 8, 30, 12};

static int fail(const char *what, const char *detail) {
  fprintf(stderr, "pg_crash: FAIL: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

static int sql_ok(PGconn *c, const char *sql, char *msg, size_t cap) {
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = PQresultStatus(r);
  int ok = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
  if (!ok) snprintf(msg, cap, "%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}

/* The sessions of the dead writer (and its rival, whose exit closed them already) end: each is
 * waited for up to 60 s, and none may be left. */
static int sessions_gone(PGconn *admin, const char *app, char *msg, size_t cap) {
  char sql[512];
  PGresult *r;
  int left;
  snprintf(sql, sizeof sql,
           "SELECT pg_terminate_backend(pid, 60000) FROM pg_stat_activity WHERE "
           "application_name = '%s'",
           app);
  if (!sql_ok(admin, sql, msg, cap)) return 0;
  snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'",
           app);
  r = PQexec(admin, sql);
  left = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  if (left != 0) snprintf(msg, cap, "%d sessions of the killed writer are still there", left);
  return left == 0;
}

/* Runs prog args with stdout into out (cap bytes, NUL-terminated); returns the wait status. */
static int run(char *const argv[], const char *env_kill, char *out, size_t cap) {
  int fds[2], status = -1;
  size_t n = 0;
  ssize_t got;
  pid_t pid;
  if (pipe(fds) != 0) return -1;
  fflush(NULL);
  if ((pid = fork()) == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    if (env_kill)
      setenv("BS_CRASH_PG_KILL", env_kill, 1);
    else
      unsetenv("BS_CRASH_PG_KILL");
    execv(argv[0], argv);
    _exit(127);
  }
  close(fds[1]);
  while (pid > 0 && (got = read(fds[0], out + n, cap - 1 - n)) > 0) n += (size_t)got;
  out[n] = 0;
  close(fds[0]);
  if (pid > 0) waitpid(pid, &status, 0);
  return status;
}

int main(int argc, char **argv) {
  const char *base = getenv("BS_TEST_PG_URL");
  char schema[64], app[64], url[2048], log[4200], dir[4096], writer[4200], check[4200];
  char msg[2048], out[4096], spec[64], seed_s[32], sql[256];
  unsigned kills, per_point[N_POINTS] = {0}, inflight = 0;
  uint64_t seed, rng;
  PGconn *admin;
  int rc = 0;
  if (argc != 4) {
    fprintf(stderr, "usage: pg_crash BINDIR KILLS SEED\n");
    return 2;
  }
  if (!base || !*base) {
    printf("pg_crash: skipped: BS_TEST_PG_URL is not set (tests/pg_server.sh run starts a "
           "server)\n");
    return 77;
  }
  kills = (unsigned)strtoul(argv[2], NULL, 10);
  seed = strtoull(argv[3], NULL, 10);
  rng = seed;
  snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
  if (getenv("BS_SEED_LOG") && *getenv("BS_SEED_LOG")) {
    FILE *f = fopen(getenv("BS_SEED_LOG"), "a");
    if (!f) return fail("cannot append to BS_SEED_LOG", getenv("BS_SEED_LOG"));
    fprintf(f, "pg_crash crash_writer %s\n", seed_s);
    fclose(f);
  }
  snprintf(schema, sizeof schema, "bs_crash%ld", (long)getpid());
  /* the writer's sessions carry a name of their own, so that only they are waited for */
  snprintf(app, sizeof app, "bs_crash%ld", (long)getpid());
  snprintf(url, sizeof url, "%s%coptions=-csearch_path%%3D%s&application_name=%s", base,
           strchr(base, '?') ? '&' : '?', schema, app);
  snprintf(dir, sizeof dir, "%s/bs_pgcrash_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return fail("mkdtemp", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  snprintf(writer, sizeof writer, "%s/crash_writer", argv[1]);
  snprintf(check, sizeof check, "%s/crash_check", argv[1]);
  admin = PQconnectdb(base);
  if (PQstatus(admin) != CONNECTION_OK) return fail("connecting", PQerrorMessage(admin));
  snprintf(sql, sizeof sql, "SET client_min_messages = error; CREATE SCHEMA %s", schema);
  if (!sql_ok(admin, sql, msg, sizeof msg)) return fail("creating the schema", msg);
  printf("pg_crash: %u kills of the client, seed %s (reproduce: pg_crash %s %u %s), schema %s\n",
         kills, seed_s, argv[1], kills, seed_s, schema);
  for (unsigned i = 0; i < kills && !rc; i++) {
    unsigned p = i % N_POINTS, at = 1 + (unsigned)(next_rand(&rng) % range[p]);
    char *wargv[] = {writer, url, log, seed_s, NULL}, *cargv[] = {check, url, log, seed_s, NULL};
    int status;
    snprintf(spec, sizeof spec, "%s:%u", points[p], at);
    status = run(wargv, spec, out, sizeof out);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
      fprintf(stderr, "pg_crash: kill %u at %s: the writer was not killed there (status %d)\n",
              i + 1, spec, status);
      rc = 1;
      break;
    }
    if (!sessions_gone(admin, app, msg, sizeof msg)) {
      rc = fail(spec, msg);
      break;
    }
    status = run(cargv, NULL, out, sizeof out);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "pg_crash: kill %u at %s: crash_check failed (seed %s)\n", i + 1, spec,
              seed_s);
      rc = 1;
      break;
    }
    if (strstr(out, "inflight=1")) {
      /* only a COMMIT that was sent may have landed unlogged */
      if (strcmp(points[p], "commit.sent") != 0) {
        fprintf(stderr, "pg_crash: kill %u at %s: a commit landed that was never sent: %s", i + 1,
                spec, out);
        rc = 1;
        break;
      }
      inflight++;
    }
    per_point[p]++;
    printf("pg_crash: kill %u at %s: %s", i + 1, spec, out);
  }
  snprintf(sql, sizeof sql, "DROP SCHEMA %s CASCADE", schema);
  if (!sql_ok(admin, sql, msg, sizeof msg) && !rc) rc = fail("dropping the schema", msg);
  PQfinish(admin);
  unlink(log);
  rmdir(dir);
  if (!rc)
    printf("pg_crash: %u kills survived (%u at flush.loaded, %u flush, %u commit, %u commit.sent, "
           "%u compact.apply); %u commits landed with their reply lost\n",
           kills, per_point[0], per_point[1], per_point[2], per_point[3], per_point[4], inflight);
  return rc;
}
#else
int main(void) {
  printf("pg_crash: skipped: this build has no PostgreSQL backend\n");
  return 77;
}
#endif
