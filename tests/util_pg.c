/*
 * util_pg.c: the PostgreSQL test harness (see util_pg.h). Public API and libpq only.
 */
#include "util_fault.h"
#include "util_pg.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

int pgt_skipped(const char *prog) {
#ifdef BS_HAVE_PG
  char why[200];
  if (pgt_base_url()) return 0;
  snprintf(why, sizeof why,
           "%s: BS_TEST_PG_URL is not set (tests/pg_server.sh run starts a server)", prog);
  ft_skip_note(why);
#else
  printf("%s: this build has no PostgreSQL backend\n", prog);
#endif
  return 1;
}

#ifdef BS_HAVE_PG
const char *pgt_base_url(void) {
  const char *url = getenv("BS_TEST_PG_URL");
  return url && *url ? url : NULL;
}

void pgt_schema_url(char *out, size_t cap, const char *schema) {
  const char *base = pgt_base_url();
  snprintf(out, cap, "%s%coptions=-csearch_path%%3D%s", base, strchr(base, '?') ? '&' : '?',
           schema);
}

/* sql on c: BS_OK, or BS_EIO with the server's message in msg. */
static int run(PGconn *c, const char *sql, char *msg, size_t cap) {
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = PQresultStatus(r);
  int rc = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK ? BS_OK : BS_EIO;
  if (rc) snprintf(msg, cap, "%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return rc;
}

/* A new connection to the base URL (warnings only) that ran sql; NULL with the failure in msg. */
static PGconn *connect_run(const char *sql, char *msg, size_t cap) {
  PGconn *c = PQconnectdb(pgt_base_url());
  if (PQstatus(c) != CONNECTION_OK)
    snprintf(msg, cap, "connecting: %s", PQerrorMessage(c));
  else if (!run(c, "SET client_min_messages = warning", msg, cap) && !run(c, sql, msg, cap))
    return c;
  PQfinish(c);
  return NULL;
}

int pgt_admin_try(const char *sql, char *msg, size_t cap) {
  PGconn *c = connect_run(sql, msg, cap);
  PQfinish(c);
  return c ? BS_OK : BS_EIO;
}

/* connect_run, or the test fails */
static PGconn *connect_ok(const char *sql) {
  char msg[1024];
  PGconn *c = connect_run(sql, msg, sizeof msg);
  if (!c) fail_msg("%s", msg);
  return c;
}

int pgt_setup(void **state) {
  static int seq;
  pgt *t = calloc(1, sizeof *t);
  char sql[200];
  assert_non_null(t);
  snprintf(t->schema, sizeof t->schema, "bs_t%ld_%d", (long)getpid(), ++seq);
  pgt_schema_url(t->url, sizeof t->url, t->schema);
  snprintf(sql, sizeof sql, "CREATE SCHEMA %s; SET search_path = %s", t->schema, t->schema);
  t->admin = connect_ok(sql);
  *state = t;
  return 0;
}

void pgt_reset(pgt *t) {
  char sql[100];
  PQfinish(t->admin);
  snprintf(sql, sizeof sql, "SET search_path = %s", t->schema);
  t->admin = connect_ok(sql);
}

int pgt_teardown(void **state) {
  pgt *t = *state;
  PQclear(PQexec(t->admin, "SELECT 1")); /* finds out whether a restart cut it */
  if (PQstatus(t->admin) != CONNECTION_OK) pgt_reset(t);
  pgt_exec(t->admin, "DROP SCHEMA %s CASCADE", t->schema);
  PQfinish(t->admin);
  free(t);
  return 0;
}

/* The result of the SQL (printf format, ap) on c; a failed command fails the test. */
static PGresult *exec_v(PGconn *c, const char *fmt, va_list ap) {
  char sql[8192];
  int n = vsnprintf(sql, sizeof sql, fmt, ap);
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = PQresultStatus(r);
  assert_true(n >= 0 && (size_t)n < sizeof sql);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  return r;
}

void pgt_exec(PGconn *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PQclear(exec_v(c, fmt, ap));
  va_end(ap);
}

long long pgt_int(PGconn *c, const char *fmt, ...) {
  va_list ap;
  PGresult *r;
  long long v;
  va_start(ap, fmt);
  r = exec_v(c, fmt, ap);
  va_end(ap);
  if (PQntuples(r) != 1) fail_msg("%s: %d rows, one expected", fmt, PQntuples(r));
  v = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

void pgt_terminate(PGconn *admin, int pid) {
  /* waits (up to 10 s) until the process is gone */
  pgt_exec(admin, "SELECT pg_terminate_backend(%d, 10000)", pid);
}

bs_db *pgt_open(const char *url, unsigned flags) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *db = NULL;
  int rc;
  o.flags = flags;
  rc = bs_open(&db, url, &o, &err);
  if (rc != BS_OK) fail_msg("bs_open: %s (%s)", bs_strerror(rc), err.msg);
  return db;
}
#endif
