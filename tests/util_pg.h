/*
 * util_pg.h: the PostgreSQL test harness shared by test_pg*.c and util_contract's
 * "postgres" backend: the server that BS_TEST_PG_URL names (tests/pg_server.sh starts one), a
 * schema of its own per test (selected by the URL's search_path, dropped at the end), and the
 * test's admin connection for raw SQL (pgt_exec, pgt_int; a failure fails the test).
 *
 * Linked into every test binary: no main() here. In a build without the PostgreSQL backend
 * only pgt_skipped exists.
 */
#ifndef BS_TESTS_UTIL_PG_H
#define BS_TESTS_UTIL_PG_H

#include <stddef.h>

#include "../storage.h"

/* Whether the PostgreSQL tests of program prog cannot run (a build without the backend, or
 * BS_TEST_PG_URL unset): then it prints why (prog: skipped ...) and returns 1. */
int pgt_skipped(const char *prog);

#ifdef BS_HAVE_PG
#include <libpq-fe.h>

/* BS_TEST_PG_URL (NULL when unset or empty). */
const char *pgt_base_url(void);
/* out = the base URL with search_path set to schema (a URL of one bucketstore database). */
void pgt_schema_url(char *out, size_t cap, const char *schema);

/* Runs sql on a connection of its own to the base URL: BS_OK, or BS_EIO with the server's
 * message in msg (for code outside a cmocka test: util_contract.c). */
int pgt_admin_try(const char *sql, char *msg, size_t cap);

/* A test's schema and its admin connection (search_path = schema, client_min_messages =
 * warning). */
typedef struct pgt {
  char schema[64];
  char url[1024]; /* the URL of the test's database */
  PGconn *admin;
} pgt;

/* cmocka setup / teardown: a new schema bs_t<pid>_<n> and its admin connection in *state; the
 * teardown reconnects when the connection was cut (a server restart, a terminated session),
 * then drops the schema. */
int pgt_setup(void **state);
int pgt_teardown(void **state);
/* Reconnects t's admin connection (after a server restart) and sets its search_path again. */
void pgt_reset(pgt *t);

/* Runs the SQL (printf format) on c; a failed command fails the test. */
void pgt_exec(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The single value of a one-row query, as an integer; else the test fails. */
long long pgt_int(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends server process pid (pg_terminate_backend) and waits until it is gone, so the client
 * sees a closed connection. */
void pgt_terminate(PGconn *admin, int pid);

/* bs_open of url with flags; a failure fails the test. */
bs_db *pgt_open(const char *url, unsigned flags);
#endif

#endif
