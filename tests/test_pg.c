/* test_pg: the PostgreSQL backend (pg*.c, issue 14) through the public API, on the server named
 * by BS_TEST_PG_URL (`make test` starts one with tests/pg_server.sh). Each test gets a schema of
 * its own in that database (?options=-csearch_path%3D...), dropped at the end. Covered here:
 * the schema (created, migrated, a newer one refused, read-only opens), connection errors,
 * streams (ids, the PROCESSING rule, listing, edge names), storage_open's stream choice,
 * status, get_checkpoint, report_error, and two handles on one database (two hosts). Without
 * BS_TEST_PG_URL, or in a build without the backend, it says so and passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "storage.h"

#ifdef BS_HAVE_PG
#include <libpq-fe.h>

static const char *base_url;
static int schema_seq;

typedef struct pgt {
  char schema[64];
  char url[1024];
  PGconn *admin; /* on base_url, with search_path set to the test's schema */
} pgt;

static void admin_exec(pgt *t, const char *sql) {
  PGresult *r = PQexec(t->admin, sql);
  ExecStatusType s = PQresultStatus(r);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
}

static long long admin_int(pgt *t, const char *sql) {
  PGresult *r = PQexec(t->admin, sql);
  long long v;
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  v = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

static int setup(void **state) {
  pgt *t = calloc(1, sizeof *t);
  char sql[256];
  assert_non_null(t);
  snprintf(t->schema, sizeof t->schema, "bs_t%ld_%d", (long)getpid(), ++schema_seq);
  snprintf(t->url, sizeof t->url, "%s%coptions=-csearch_path%%3D%s", base_url,
           strchr(base_url, '?') ? '&' : '?', t->schema);
  t->admin = PQconnectdb(base_url);
  assert_int_equal(PQstatus(t->admin), CONNECTION_OK);
  PQclear(PQexec(t->admin, "SET client_min_messages = warning"));
  snprintf(sql, sizeof sql, "CREATE SCHEMA %s; SET search_path = %s", t->schema, t->schema);
  admin_exec(t, sql);
  *state = t;
  return 0;
}

static int teardown(void **state) {
  pgt *t = *state;
  char sql[256];
  snprintf(sql, sizeof sql, "DROP SCHEMA %s CASCADE", t->schema);
  admin_exec(t, sql);
  PQfinish(t->admin);
  free(t);
  return 0;
}

static bs_db *open_ok(pgt *t, unsigned flags) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *db = NULL;
  o.flags = flags;
  int rc = bs_open(&db, t->url, &o, &err);
  if (rc != BS_OK) fail_msg("bs_open: %s (%s)", bs_strerror(rc), err.msg);
  return db;
}

/* ---- schema ---- */

static void t_schema_created_once(void **state) {
  pgt *t = *state;
  bs_db *db = open_ok(t, 0), *db2;
  assert_int_equal(admin_int(t, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 1);
  bs_close(db);
  db2 = open_ok(t, 0); /* a second open finds it and changes nothing */
  assert_int_equal(admin_int(t, "SELECT count(*) FROM bs_meta"), 1);
  assert_int_equal(admin_int(t, "SELECT count(*) FROM bs_streams"), 0);
  bs_close(db2);
}

static void t_schema_newer_refused(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = open_ok(t, 0);
  bs_close(db);
  admin_exec(t, "UPDATE bs_meta SET value = 2 WHERE key = 'schema_version'");
  db = (bs_db *)&err; /* must become NULL */
  assert_int_equal(bs_open(&db, t->url, NULL, &err), BS_ECORRUPT);
  assert_null(db);
  assert_non_null(strstr(err.msg, "version 2, newer than this build's 1"));
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  o.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ECORRUPT);
  /* nothing was touched */
  assert_int_equal(admin_int(t, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 2);
}

static void t_schema_read_only(void **state) {
  pgt *t = *state;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *db = NULL;
  uint32_t id;
  o.flags = BS_OPEN_RDONLY;
  /* no schema yet: read-only creates nothing */
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ENOTFOUND);
  assert_int_equal(admin_int(t, "SELECT count(*) FROM pg_tables WHERE tablename = 'bs_meta'"
                                " AND schemaname = current_schema()"),
                   0);
  db = open_ok(t, 0);
  assert_int_equal(bs_stream_create(&id, db, "s", NULL, &err), BS_OK);
  bs_close(db);
  db = open_ok(t, BS_OPEN_RDONLY);
  assert_int_equal(bs_stream_create(&id, db, "s2", NULL, &err), BS_ESTATE);
  bs_storage *st = NULL;
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_report_error(st, "x", &err), BS_ESTATE);
  bs_storage_close(st);
  bs_close(db);
  /* a schema at version 0 (before migration 1): read-only finds none, read-write migrates it */
  admin_exec(t, "UPDATE bs_meta SET value = 0 WHERE key = 'schema_version';"
                " DROP TABLE bs_changes, bs_params, bs_ops, bs_buckets, bs_streams");
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ENOTFOUND);
  db = open_ok(t, 0);
  assert_int_equal(admin_int(t, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 1);
  assert_int_equal(admin_int(t, "SELECT count(*) FROM bs_streams"), 0);
  bs_close(db);
}

static void t_open_errors(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = NULL;
  assert_int_equal(bs_open_postgres(&db, NULL, NULL, &err), BS_EINVAL);
  assert_non_null(strstr(err.msg, "url"));
  assert_int_equal(bs_open_postgres(&db, "", NULL, &err), BS_EINVAL);
  assert_int_equal(bs_open_postgres(NULL, t->url, NULL, &err), BS_EINVAL);
  bs_open_options bad = BS_OPEN_OPTIONS_INIT;
  bad.flags = 0x80;
  assert_int_equal(bs_open_postgres(&db, t->url, &bad, &err), BS_EINVAL);
  /* nobody listens on port 1: libpq's message comes back with BS_EIO */
  assert_int_equal(bs_open(&db, "postgresql://bs@127.0.0.1:1/bs?connect_timeout=5", NULL, &err),
                   BS_EIO);
  assert_null(db);
  assert_non_null(strstr(err.msg, "connecting to PostgreSQL"));
  /* a database that does not exist */
  char url[1100];
  const char *slash = strrchr(base_url, '/');
  snprintf(url, sizeof url, "%.*s/bs_no_such_db", (int)(slash - base_url), base_url);
  assert_int_equal(bs_open(&db, url, NULL, &err), BS_EIO);
  assert_non_null(strstr(err.msg, "bs_no_such_db"));
  /* postgres:// is the other URI prefix libpq knows */
  char alt[1100];
  assert_true(strncmp(t->url, "postgresql://", 13) == 0);
  snprintf(alt, sizeof alt, "postgres://%s", t->url + 13);
  assert_int_equal(bs_open(&db, alt, NULL, &err), BS_OK);
  bs_close(db);
}

/* ---- streams ---- */

typedef struct seen {
  int n;
  uint32_t id[8];
  bs_stream_state state[8];
  bs_hash hash[8];
  char name[8][300];
  size_t name_size[8];
} seen;

static int collect(const bs_stream_info *info, void *payload) {
  seen *s = payload;
  assert_true(s->n < 8);
  s->id[s->n] = info->id;
  s->state[s->n] = info->state;
  s->hash[s->n] = info->hash;
  assert_true(info->name.size < sizeof s->name[0]);
  memcpy(s->name[s->n], info->name.data, info->name.size);
  s->name_size[s->n] = info->name.size;
  s->n++;
  return 0;
}

static int stop_at_first(const bs_stream_info *info, void *payload) {
  (*(int *)payload)++;
  return 42;
}

static void t_streams(void **state) {
  pgt *t = *state;
  bs_db *db = open_ok(t, 0), *other;
  bs_error err = {0};
  bs_stream_options sha = BS_STREAM_OPTIONS_INIT;
  char longest[BS_MAX_STREAM_NAME + 2];
  uint32_t id;
  seen s = {0};
  int calls = 0;
  memset(longest, 'n', sizeof longest);
  longest[BS_MAX_STREAM_NAME] = '\0';
  sha.hash = BS_HASH_SHA256;
  assert_int_equal(bs_stream_create(&id, db, "a", NULL, &err), BS_OK);
  assert_int_equal(id, 1);
  assert_int_equal(bs_stream_create(&id, db, "r\xc3\xa9gles-\xe2\x9c\x93", &sha, &err), BS_OK);
  assert_int_equal(id, 2);
  assert_int_equal(bs_stream_create(&id, db, longest, NULL, &err), BS_OK);
  assert_int_equal(id, 3);
  longest[BS_MAX_STREAM_NAME] = 'n';
  longest[BS_MAX_STREAM_NAME + 1] = '\0';
  assert_int_equal(bs_stream_create(&id, db, longest, NULL, &err), BS_ETOOBIG);
  assert_int_equal(bs_stream_create(&id, db, "", NULL, &err), BS_EINVAL);
  /* a second handle (another host) sees them, and its streams continue the ids */
  other = open_ok(t, 0);
  assert_int_equal(bs_stream_create(NULL, other, "b", NULL, &err), BS_OK);
  assert_int_equal(bs_stream_list(db, collect, &s, &err), BS_OK);
  assert_int_equal(s.n, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(s.id[i], i + 1);
  /* only the newest stays PROCESSING */
  assert_int_equal(s.state[0], BS_STREAM_STOPPED);
  assert_int_equal(s.state[2], BS_STREAM_STOPPED);
  assert_int_equal(s.state[3], BS_STREAM_PROCESSING);
  assert_int_equal(s.hash[0], BS_HASH_XXH3);
  assert_int_equal(s.hash[1], BS_HASH_SHA256);
  assert_int_equal(s.name_size[0], 1);
  assert_memory_equal(s.name[0], "a", 1);
  assert_int_equal(s.name_size[1], strlen("r\xc3\xa9gles-\xe2\x9c\x93"));
  assert_memory_equal(s.name[1], "r\xc3\xa9gles-\xe2\x9c\x93", s.name_size[1]);
  assert_int_equal(s.name_size[2], BS_MAX_STREAM_NAME);
  /* a callback's value stops the listing and comes back unchanged */
  assert_int_equal(bs_stream_list(db, stop_at_first, &calls, &err), 42);
  assert_int_equal(calls, 1);
  bs_close(other);
  bs_close(db);
}

static void t_storage_open(void **state) {
  pgt *t = *state;
  bs_db *db = open_ok(t, 0);
  bs_error err = {0};
  bs_storage *st = (bs_storage *)&err;
  assert_int_equal(bs_storage_open(&st, db, 0, &err), BS_ENOTFOUND);
  assert_null(st);
  assert_non_null(strstr(err.msg, "no stream"));
  assert_int_equal(bs_stream_create(NULL, db, "one", NULL, &err), BS_OK);
  assert_int_equal(bs_stream_create(NULL, db, "two", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 3, &err), BS_ENOTFOUND);
  assert_non_null(strstr(err.msg, "stream 3"));
  /* nothing served yet: the newest */
  assert_int_equal(bs_storage_open(&st, db, 0, &err), BS_OK);
  assert_int_equal(bs_storage_stream_id(st), 2);
  bs_storage_close(st);
  /* a served stream wins over a newer unserved one: ACTIVE, and ERRORED too */
  admin_exec(t, "UPDATE bs_streams SET state = 2 WHERE id = 1");
  assert_int_equal(bs_storage_open(&st, db, 0, &err), BS_OK);
  assert_int_equal(bs_storage_stream_id(st), 1);
  assert_int_equal(bs_report_error(st, "source gone", &err), BS_OK);
  bs_storage_close(st);
  assert_int_equal(bs_storage_open(&st, db, 0, &err), BS_OK);
  assert_int_equal(bs_storage_stream_id(st), 1);
  bs_storage_close(st);
  assert_int_equal(bs_storage_open(&st, db, 2, &err), BS_OK);
  assert_int_equal(bs_storage_stream_id(st), 2);
  bs_storage_close(st);
  bs_close(db);
}

static void t_status(void **state) {
  pgt *t = *state;
  bs_db *db = open_ok(t, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_status s;
  bs_checkpoint cp;
  char msg[400];
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  memset(&cp, 0xff, sizeof cp);
  assert_int_equal(bs_get_checkpoint(st, &cp, &err), BS_OK);
  assert_int_equal(cp.op_id, 0);
  assert_int_equal(cp.has_lsn, 0);
  memset(&s, 0xff, sizeof s);
  assert_int_equal(bs_get_status(st, &s, &err), BS_OK);
  assert_int_equal(s.state, BS_STREAM_PROCESSING);
  assert_int_equal(s.snapshot_done, 0);
  assert_int_equal(s.checkpoint, 0);
  assert_int_equal(s.last_persisted_op, 0);
  assert_int_equal(s.has_lsn, 0);
  assert_int_equal(s.has_resume_lsn, 0);
  assert_string_equal(s.last_error, "");
  /* a checkpoint stored by a writer (here: by hand) reads back, an empty LSN is a value */
  admin_exec(t, "UPDATE bs_streams SET checkpoint = 7, op_head = 9, checkpoint_lsn = '',"
                " resume_lsn = '\\x00ff'::bytea, snapshot_done = true WHERE id = 1");
  assert_int_equal(bs_get_checkpoint(st, &cp, &err), BS_OK);
  assert_int_equal(cp.op_id, 7);
  assert_int_equal(cp.has_lsn, 1);
  assert_int_equal(cp.lsn_size, 0);
  assert_int_equal(bs_get_status(st, &s, &err), BS_OK);
  assert_int_equal(s.snapshot_done, 1);
  assert_int_equal(s.checkpoint, 7);
  assert_int_equal(s.last_persisted_op, 9);
  assert_int_equal(s.has_resume_lsn, 1);
  assert_int_equal(s.resume_lsn_size, 2);
  assert_memory_equal(s.resume_lsn, "\x00\xff", 2);
  /* report_error: cut to 255 bytes; a PROCESSING stream stays PROCESSING */
  memset(msg, 'e', sizeof msg - 1);
  msg[sizeof msg - 1] = '\0';
  assert_int_equal(bs_report_error(st, msg, &err), BS_OK);
  assert_int_equal(bs_get_status(st, &s, &err), BS_OK);
  assert_int_equal(strlen(s.last_error), 255);
  assert_int_equal(s.state, BS_STREAM_PROCESSING);
  assert_int_equal(bs_report_error(st, "\xc3\xa9", &err), BS_OK);
  assert_int_equal(bs_get_status(st, &s, &err), BS_OK);
  assert_string_equal(s.last_error, "\xc3\xa9");
  /* a stream deleted under the handle */
  admin_exec(t, "DELETE FROM bs_streams");
  assert_int_equal(bs_get_checkpoint(st, &cp, &err), BS_ENOTFOUND);
  assert_int_equal(bs_get_status(st, &s, &err), BS_ENOTFOUND);
  bs_storage_close(st);
  bs_close(db);
}

/* Slots this build does not implement answer BS_EUNSUPPORTED (a NULL slot), never a fake. */
static void t_unsupported_slots(void **state) {
  pgt *t = *state;
  bs_db *db = open_ok(t, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w = NULL;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_EUNSUPPORTED);
  assert_null(w);
  assert_int_equal(bs_compact(st, NULL, NULL, &err), BS_EUNSUPPORTED);
  bs_storage_close(st);
  assert_int_equal(bs_backup(db, "/tmp/x", NULL, &err), BS_EUNSUPPORTED);
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_schema_created_once, setup, teardown),
      cmocka_unit_test_setup_teardown(t_schema_newer_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(t_schema_read_only, setup, teardown),
      cmocka_unit_test_setup_teardown(t_open_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(t_streams, setup, teardown),
      cmocka_unit_test_setup_teardown(t_storage_open, setup, teardown),
      cmocka_unit_test_setup_teardown(t_status, setup, teardown),
      cmocka_unit_test_setup_teardown(t_unsupported_slots, setup, teardown),
  };
  base_url = getenv("BS_TEST_PG_URL");
  if (!base_url || !*base_url) {
    printf("test_pg: skipped (BS_TEST_PG_URL is not set; tests/pg_server.sh run starts a "
           "server)\n");
    return 0;
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  bs_db *db = NULL;
  bs_error err = {0};
  /* a build without the backend says so */
  int rc = bs_open_postgres(&db, "postgresql://localhost/x", NULL, &err);
  if (rc != BS_EUNSUPPORTED || db) {
    fprintf(stderr, "test_pg: bs_open_postgres without the backend returned %d\n", rc);
    return 1;
  }
  printf("test_pg: this build has no PostgreSQL backend (BS_EUNSUPPORTED checked)\n");
  return 0;
}
#endif
