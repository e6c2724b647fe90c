/* test_pg_deploy: the PostgreSQL backend as a production server runs it, on the server named by
 * BS_TEST_PG_URL (`make pg-test` starts one with tests/pg_server.sh): roles that are not
 * superusers, schemas shared with other roles, several search paths, schema names that need
 * quoting. Each test gets a schema of its own (util_pg.h); the roles and other schemas a test
 * creates are dropped by its teardown. The connections a handle holds are counted in
 * pg_stat_activity by application_name, at points the backend's test seam (bs__pg_set_hook)
 * reports. Without BS_TEST_PG_URL, or in a build without the backend,
 * it says so and passes. */
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
#include "util_pg.h"

#ifdef BS_HAVE_PG
#include <limits.h>
#include <pthread.h>

#include "pg_internal.h" /* the test seam: bs__pg_set_hook */

/* call, which must answer BS_OK: else the test fails with err's message */
#define OK(call)                                                                                   \
  do {                                                                                             \
    int rc_ = (call);                                                                              \
    if (rc_ != BS_OK) fail_msg("%s: %d: %s", #call, rc_, err.msg);                                 \
  } while (0)

static bs_val str(const char *s) {
  return (bs_val){s, strlen(s)};
}

/* A test's extra objects: roles r<pid>_<name> and schemas, dropped by teardown. */
typedef struct deploy {
  pgt *t;
  char extra_sql[2048]; /* run by the teardown (as the superuser), before the schema drops */
} deploy;

static int setup(void **state) {
  deploy *d = calloc(1, sizeof *d);
  alarm(300);
  assert_non_null(d);
  pgt_setup((void **)&d->t);
  *state = d;
  return 0;
}

static int teardown(void **state) {
  deploy *d = *state;
  alarm(0);
  if (d->extra_sql[0]) pgt_exec(d->t->admin, "%s", d->extra_sql);
  pgt_teardown((void **)&d->t);
  free(d);
  return 0;
}

static void on_teardown(deploy *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void on_teardown(deploy *d, const char *fmt, ...) {
  size_t n = strlen(d->extra_sql);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->extra_sql + n, sizeof d->extra_sql - n, fmt, ap);
  va_end(ap);
}

/* The base URL with the given (already URL-encoded) query parameters appended. */
static void url_with(char *out, size_t cap, const char *params) {
  const char *base = pgt_base_url();
  snprintf(out, cap, "%s%c%s", base, strchr(base, '?') ? '&' : '?', params);
}

/* ---- one pass over every kind of call ---- */

static int count_chunk(const bs_chunk *ch, void *payload) {
  *(size_t *)payload += ch->n_ops;
  return 0;
}
static int count_row(const bs_val *v, void *payload) {
  (void)v;
  (*(size_t *)payload)++;
  return 0;
}
static int count_changes(const bs_checkpoint_changes *c, void *payload) {
  *(size_t *)payload += c->n_updated_buckets;
  return 0;
}
static int count_bucket(const bs_bucket_info *i, void *payload) {
  (void)i;
  (*(size_t *)payload)++;
  return 0;
}

static void save(bs_writer *w, bs_tag tag, const char *id, const char *bucket, const char *lk) {
  bs_error err = {0};
  bs_row row;
  bs_val params[1] = {{"{\"p\":1}", 7}};
  bs_lookup l;
  bs_save sv = BS_SAVE_INIT;
  row.bucket = str(bucket);
  row.object_type = str("todos");
  row.object_id = str(id);
  row.data = str("{\"a\":1}");
  l.key = str(lk);
  l.params = params;
  l.n_params = 1;
  sv.table = str("t");
  sv.tag = tag;
  sv.after_id = str(id);
  sv.rows = tag == BS_DELETE ? NULL : &row;
  sv.n_rows = tag == BS_DELETE ? 0 : 1;
  sv.lookups = tag == BS_DELETE ? NULL : &l;
  sv.n_lookups = tag == BS_DELETE ? 0 : 1;
  sv.stored_data = str("d");
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
}

/* Creates a stream on db and runs every kind of call on it: writer lock and unlock (snapshot
 * and streaming), inserts, updates and deletes with lookups, flushes, commits, write
 * checkpoints, every read, a wait, compaction, stat and verify. */
static void exercise(bs_db *db) {
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w;
  bs_writer_options so = BS_WRITER_OPTIONS_INIT;
  bs_checkpoint cp, now;
  bs_bucket_request req[2] = {{{"a", 1}, 0}, {{"b", 1}, 0}};
  bs_val buckets[2] = {{"a", 1}, {"b", 1}}, lookups[1] = {{"k1", 2}};
  bs_checksum ck[2];
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_managed_request mr = {{"u", 1}, NULL, 0, 0, 0, 0};
  bs_stat s;
  uint64_t id, problems = 99;
  size_t n = 0;
  int more;
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  so.snapshot = 1;
  OK(bs_writer_open(&w, st, &so, &err));
  for (int i = 0; i < 20; i++) {
    char id_s[16];
    snprintf(id_s, sizeof id_s, "r%d", i);
    save(w, BS_INSERT, id_s, i % 2 ? "a" : "b", "k1");
  }
  OK(bs_writer_flush(NULL, w, &err));
  bs_writer_close(w);
  OK(bs_writer_open(&w, st, NULL, &err));
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  OK(bs_create_managed_write_checkpoints(&id, NULL, st, &mr, 1, &err));
  for (int round = 0; round < 3; round++) {
    char lsn[16];
    for (int i = 0; i < 10; i++) {
      char id_s[16];
      snprintf(id_s, sizeof id_s, "r%d", i + round);
      save(w, i == 3 ? BS_DELETE : BS_UPDATE, id_s, i % 3 ? "a" : "b", "k1");
    }
    OK(bs_writer_flush(NULL, w, &err));
    snprintf(lsn, sizeof lsn, "%04d", round + 1);
    OK(bs_writer_commit(NULL, w, str(lsn), NULL, &err));
  }
  bs_writer_close(w);
  OK(bs_get_checkpoint(&cp, st, &err));
  assert_true(cp.op_id > 0);
  assert_int_equal(bs_get_bucket_data(&more, st, cp.op_id, req, 2, NULL, count_chunk, &n, &err),
                   BS_OK);
  assert_true(n > 0);
  OK(bs_get_checksums(ck, st, cp.op_id, buckets, 2, &err));
  assert_true(ck[0].count > 0);
  n = 0;
  assert_int_equal(bs_get_parameter_sets(st, cp.op_id, lookups, 1, 100, count_row, &n, &err),
                   BS_OK);
  assert_true(n > 0);
  n = 0;
  OK(bs_get_checkpoint_changes(st, 1, cp.op_id, count_changes, &n, &err));
  n = 0;
  OK(bs_list_buckets(st, (bs_val){NULL, 0}, count_bucket, &n, &err));
  assert_int_equal(n, 2);
  OK(bs_wait_checkpoint(&now, st, &cp, 0, &err));
  co.min_bucket_changes = 1;
  co.compact_parameters = 1;
  OK(bs_compact(NULL, st, &co, &err));
  co.incremental_only = 1;
  co.min_age_ms = 0;
  OK(bs_compact(NULL, st, &co, &err));
  OK(bs_db_stat(&s, db, &err));
  assert_int_equal(s.streams, 1);
  assert_true(s.ops_put > 0 && s.file_bytes > 0);
  OK(bs_db_verify(&problems, db, NULL, NULL, &err));
  assert_int_equal(problems, 0);
  bs_storage_close(st);
}

/* ---- 1. the schema is fixed at open ---- */

/* A role with nothing but CREATE on public (every role's default up to PostgreSQL 14) puts
 * functions there that match the backend's calls better than pg_catalog's (||(name, text),
 * unnest(bytea[])) and that record that they ran. The service's URL names
 * search_path=<schema>,public: across every kind of call, none of them ever runs. */
static void t_shadowing_role(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char svc[32], evil[32], url[1200], params[200];
  bs_db *db;
  snprintf(svc, sizeof svc, "r%ld_svc", (long)getpid());
  snprintf(evil, sizeof evil, "r%ld_evil", (long)getpid());
  on_teardown(d,
              "DROP OWNED BY %s CASCADE; REASSIGN OWNED BY %s TO CURRENT_USER;"
              " DROP OWNED BY %s; DROP ROLE %s; DROP ROLE %s;",
              evil, svc, svc, evil, svc);
  pgt_exec(t->admin, "CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN", svc, evil);
  pgt_exec(t->admin, "ALTER SCHEMA %s OWNER TO %s; GRANT CREATE ON SCHEMA public TO %s", t->schema,
           svc, evil);
  pgt_exec(t->admin, "SET ROLE %s", evil);
  pgt_exec(t->admin, "CREATE TABLE public.bs_ran (what text);"
                     " GRANT INSERT ON public.bs_ran TO PUBLIC;"
                     "CREATE FUNCTION public.unnest(bytea[]) RETURNS SETOF bytea LANGUAGE sql AS"
                     " $$ INSERT INTO public.bs_ran VALUES ('unnest');"
                     " SELECT pg_catalog.unnest($1) $$;"
                     "CREATE FUNCTION public.bs_cat(name, text) RETURNS text LANGUAGE sql AS"
                     " $$ INSERT INTO public.bs_ran VALUES ('||');"
                     " SELECT pg_catalog.textcat($1::text, $2) $$;"
                     "CREATE OPERATOR public.|| (LEFTARG = name, RIGHTARG = text,"
                     " FUNCTION = public.bs_cat);"
                     "RESET ROLE");
  /* the shadows work: a session with public on its path runs them */
  pgt_exec(t->admin, "SET search_path = %s, public", t->schema);
  pgt_exec(t->admin, "SELECT current_schema() || 'x'; SELECT unnest('{a}'::bytea[])");
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM public.bs_ran"), 2);
  pgt_exec(t->admin, "DELETE FROM public.bs_ran; SET search_path = %s", t->schema);

  snprintf(params, sizeof params, "user=%s&options=-csearch_path%%3D%s%%2Cpublic", svc, t->schema);
  url_with(url, sizeof url, params);
  db = pgt_open(url, 0);
  exercise(db);
  bs_close(db);
  db = pgt_open(url, BS_OPEN_RDONLY);
  {
    bs_stat s;
    bs_error err = {0};
    assert_int_equal(bs_db_stat(&s, db, &err), BS_OK);
  }
  bs_close(db);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM public.bs_ran"), 0);
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM pg_class WHERE relname = 'bs_chunks'"
                           " AND relnamespace = '%s'::regnamespace",
                           t->schema),
                   1);
}

/* A writer open on schema t1; a second handle whose search_path is t2,t1 (t2 exists and is
 * empty) finds the database in t1 and gets BS_EBUSY for the same stream's writer: one schema
 * decides the tables, the lock and the channel alike. Nothing is created in t2. */
static void t_two_search_paths(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1200], params[200];
  bs_error err = {0};
  bs_db *a, *b;
  bs_storage *sa, *sb;
  bs_writer *wa, *wb = NULL;
  bs_checkpoint cp;
  on_teardown(d, "DROP SCHEMA %s_t2 CASCADE;", t->schema);
  pgt_exec(t->admin, "CREATE SCHEMA %s_t2", t->schema);
  a = pgt_open(t->url, 0);
  assert_int_equal(bs_stream_create(NULL, a, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sa, a, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wa, sa, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(wa, str("0"), &err), BS_OK);
  save(wa, BS_INSERT, "r1", "a", "k1");
  assert_int_equal(bs_writer_commit(NULL, wa, str("1"), NULL, &err), BS_OK);

  snprintf(params, sizeof params, "options=-csearch_path%%3D%s_t2%%2C%s", t->schema, t->schema);
  url_with(url, sizeof url, params);
  b = pgt_open(url, 0);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_EBUSY);
  assert_null(wb);
  assert_int_equal(bs_get_checkpoint(&cp, sb, &err), BS_OK); /* t1's checkpoint */
  assert_true(cp.op_id > 0);
  bs_writer_close(wa);
  /* once a's writer is gone, b's takes the same lock and writes t1's tables */
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_OK);
  save(wb, BS_INSERT, "r2", "a", "k1");
  assert_int_equal(bs_writer_commit(NULL, wb, str("2"), NULL, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wa, sa, NULL, &err), BS_EBUSY);
  bs_writer_close(wb);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), 2);
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM pg_class WHERE relnamespace ="
                           " '%s_t2'::regnamespace",
                           t->schema),
                   0);
  bs_storage_close(sb);
  bs_storage_close(sa);
  bs_close(b);
  bs_close(a);
}

/* Schema names that need quoting (upper case, a space, a double quote) hold a database each:
 * open, every kind of call, bs_db_stat, and the tables are in that schema. */
static void t_quoted_schema_names(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  /* the name (SQL), the same in search_path as the URL's options spell it */
  const char *names[][2] = {
      {"\"%s Tenant\"", "%%22%s%%5C%%20Tenant%%22"},
      {"\"%sT\"\"q\"", "%%22%sT%%22%%22q%%22"},
      {"\"%sUPPER\"", "%%22%sUPPER%%22"},
  };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char sql_name[128], opt[256], params[300], url[1400];
    bs_db *db;
    snprintf(sql_name, sizeof sql_name, names[i][0], t->schema);
    snprintf(opt, sizeof opt, names[i][1], t->schema);
    snprintf(params, sizeof params, "options=-csearch_path%%3D%s", opt);
    url_with(url, sizeof url, params);
    on_teardown(d, "DROP SCHEMA %s CASCADE;", sql_name);
    pgt_exec(t->admin, "CREATE SCHEMA %s", sql_name);
    db = pgt_open(url, 0);
    exercise(db);
    bs_close(db);
    assert_int_equal(pgt_int(t->admin,
                             "SELECT count(*) FROM pg_class WHERE relname = 'bs_chunks'"
                             " AND relnamespace = (SELECT oid FROM pg_namespace WHERE"
                             " quote_ident(nspname) = '%s')",
                             sql_name),
                     1);
  }
}

/* ---- 2. bounded, observable connections ---- */

static bs_db *open_max(const char *url, size_t max) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *db = NULL;
  o.pg_max_connections = max;
  if (bs_open(&db, url, &o, &err)) fail_msg("bs_open: %s", err.msg);
  return db;
}

/* The test's URL with application_name=<schema>_<what> (name: that name). */
static void app_url(pgt *t, const char *what, char *url, size_t cap, char *name, size_t ncap) {
  char params[300];
  snprintf(name, ncap, "%s_%s", t->schema, what);
  snprintf(params, sizeof params, "options=-csearch_path%%3D%s&application_name=%s", t->schema,
           name);
  url_with(url, cap, params);
}

static long long sessions(pgt *t, const char *app, const char *query_like) {
  return pgt_int(t->admin,
                 "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
                 " AND query LIKE '%s'",
                 app, query_like);
}

/* Threads that reached the seam's point (each counted once), and a gate they may wait at. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const char *point;
  pthread_t seen[16];
  int n_seen, open;
} gate;

static void gate_init(gate *g, const char *point) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->point = point;
}

static void gate_arrive(gate *g) {
  int known = 0;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->n_seen; i++) known |= pthread_equal(g->seen[i], pthread_self());
  if (!known && g->n_seen < 16) g->seen[g->n_seen++] = pthread_self();
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_until(gate *g, int n) {
  pthread_mutex_lock(&g->mu);
  while (g->n_seen < n) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* blocks the caller until gate_open (a thread inside a callback holds its connection) */
static void gate_hold(gate *g) {
  gate_arrive(g);
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_fn(const char *point, PGconn *c, void *payload) {
  gate *g = payload;
  (void)c;
  if (!strcmp(point, g->point)) gate_arrive(g);
}

typedef struct waiter {
  pthread_t th;
  bs_storage *st;
  bs_checkpoint known, out;
  int rc;
} waiter;

static void *wait_main(void *arg) {
  waiter *w = arg;
  bs_error err = {0};
  w->rc = bs_wait_checkpoint(&w->out, w->st, &w->known, INT_MAX, &err);
  return NULL;
}

/* Eight threads wait for a checkpoint on one handle: one LISTEN connection serves them all, and
 * the handle holds no more than it and its pool's two connections. One commit on another
 * handle ends every wait with its checkpoint. A handle whose URL names no application_name is
 * "bucketstore" in pg_stat_activity. */
static void t_waiters_share_one_connection(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], app[128];
  bs_error err = {0};
  bs_db *a = pgt_open(t->url, 0), *b;
  bs_storage *sa, *sb;
  bs_writer *w;
  bs_checkpoint cp;
  waiter ws[8];
  gate g;
  assert_true(sessions(t, "bucketstore", "%") >= 1);
  app_url(t, "waits", url, sizeof url, app, sizeof app);
  b = open_max(url, 2);
  assert_int_equal(bs_stream_create(NULL, a, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sa, a, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, sa, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, str("0"), &err), BS_OK);
  save(w, BS_INSERT, "r1", "a", "k1");
  assert_int_equal(bs_writer_commit(NULL, w, str("1"), NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  gate_init(&g, "wait");
  bs__pg_set_hook(b, gate_fn, &g);
  for (int i = 0; i < 8; i++) {
    memset(&ws[i], 0, sizeof ws[i]);
    ws[i].st = sb;
    assert_int_equal(bs_get_checkpoint(&ws[i].known, sb, &err), BS_OK);
    assert_int_equal(pthread_create(&ws[i].th, NULL, wait_main, &ws[i]), 0);
  }
  gate_until(&g, 8); /* every waiter is about to block */
  assert_true(sessions(t, app, "%") <= 3);
  assert_int_equal(sessions(t, app, "LISTEN%"), 1);
  save(w, BS_INSERT, "r2", "a", "k1");
  assert_int_equal(bs_writer_commit(NULL, w, str("2"), NULL, &err), BS_OK);
  assert_int_equal(bs_get_checkpoint(&cp, sa, &err), BS_OK);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(pthread_join(ws[i].th, NULL), 0);
    assert_int_equal(ws[i].rc, BS_OK);
    assert_int_equal(ws[i].out.op_id, cp.op_id);
  }
  bs__pg_set_hook(b, NULL, NULL);
  bs_writer_close(w);
  bs_storage_close(sb);
  bs_storage_close(sa);
  bs_close(b);
  bs_close(a);
}

typedef struct lister {
  pthread_t th;
  bs_storage *st;
  gate *g;
  int rc;
} lister;

static int hold_bucket(const bs_bucket_info *i, void *payload) {
  (void)i;
  gate_hold(payload);
  return 0;
}

static void *list_main(void *arg) {
  lister *l = arg;
  bs_error err = {0};
  l->rc = bs_list_buckets(l->st, (bs_val){NULL, 0}, hold_bucket, l->g, &err);
  return NULL;
}

static void *checkpoint_main(void *arg) {
  lister *l = arg;
  bs_error err = {0};
  bs_checkpoint cp;
  l->rc = bs_get_checkpoint(&cp, l->st, &err);
  return NULL;
}

/* A handle of at most two connections: two calls hold both (inside bs_list_buckets callbacks);
 * a third call waits for one ("pool.wait") instead of opening a third, and runs once one is
 * given back. Writers' sessions do not count. */
static void t_pool_bound(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], app[128], wurl[1400], wapp[128];
  bs_error err = {0};
  bs_db *db, *wdb;
  bs_storage *st;
  bs_writer *w;
  lister ls[3];
  gate hold, pool;
  app_url(t, "pool", url, sizeof url, app, sizeof app);
  /* The first checkpoint is written through a handle of another application name: the server
   * ends a closed session after the client has gone, so a writer's session closed here could
   * still be listed below among the pool's. */
  app_url(t, "poolw", wurl, sizeof wurl, wapp, sizeof wapp);
  wdb = open_max(wurl, 2);
  assert_int_equal(bs_stream_create(NULL, wdb, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, wdb, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, str("0"), &err), BS_OK);
  save(w, BS_INSERT, "r1", "a", "k1");
  assert_int_equal(bs_writer_commit(NULL, w, str("1"), NULL, &err), BS_OK);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(wdb);
  db = open_max(url, 2);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  gate_init(&hold, "");
  gate_init(&pool, "pool.wait");
  bs__pg_set_hook(db, gate_fn, &pool);
  for (int i = 0; i < 2; i++) {
    ls[i].st = st;
    ls[i].g = &hold;
    assert_int_equal(pthread_create(&ls[i].th, NULL, list_main, &ls[i]), 0);
  }
  gate_until(&hold, 2); /* both connections are in calls */
  ls[2].st = st;
  assert_int_equal(pthread_create(&ls[2].th, NULL, checkpoint_main, &ls[2]), 0);
  gate_until(&pool, 1); /* the third call waits for one */
  assert_int_equal(sessions(t, app, "%"), 2);
  gate_open(&hold);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(pthread_join(ls[i].th, NULL), 0);
    assert_int_equal(ls[i].rc, BS_OK);
  }
  assert_true(sessions(t, app, "%") <= 2);
  bs__pg_set_hook(db, NULL, NULL);
  /* writers' sessions are not the calls' connections: one thread holding a streaming and a
   * snapshot writer (two sessions) still gets both for its calls */
  {
    bs_writer_options so = BS_WRITER_OPTIONS_INIT;
    bs_writer *ws;
    bs_checkpoint cp;
    so.snapshot = 1;
    assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
    assert_int_equal(bs_writer_open(&ws, st, &so, &err), BS_OK);
    save(w, BS_INSERT, "r2", "a", "k1");
    assert_int_equal(bs_writer_commit(NULL, w, str("2"), NULL, &err), BS_OK);
    ls[0].g = &hold; /* open: the callback returns at once */
    list_main(&ls[0]);
    assert_int_equal(ls[0].rc, BS_OK);
    assert_int_equal(bs_get_checkpoint(&cp, st, &err), BS_OK);
    assert_true(sessions(t, app, "%") <= 4);
    bs_writer_close(ws);
    bs_writer_close(w);
  }
  bs_storage_close(st);
  bs_close(db);
}

/* ---- No transaction open while the host's code runs ---- */

/* What a callback saw of the reader's sessions (its handle's application_name): how many there
 * are, and how many hold a transaction or a snapshot (holding back vacuum). Not counted: a
 * session still running the ANALYZE a writer's commit sent and did not wait for (pg_write.c);
 * the writer's close leaves it to finish on the server, however long the machine takes, and it
 * is no reader's. */
typedef struct watcher {
  pgt *t;
  const char *app;
  int calls;
  long long sessions, in_txn;
} watcher;

static void watch(watcher *wt) {
  long long n = sessions(wt->t, wt->app, "%");
  long long open = pgt_int(wt->t->admin,
                           "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
                           " AND (state LIKE 'idle in transaction%%' OR backend_xmin IS NOT NULL)"
                           " AND NOT (state = 'active' AND query LIKE 'ANALYZE bs_chunks%%')",
                           wt->app);
  wt->calls++;
  if (n > wt->sessions) wt->sessions = n;
  wt->in_txn += open;
}

static int watch_chunk(const bs_chunk *ch, void *payload) {
  (void)ch;
  watch(payload);
  return 0;
}
static int watch_bucket(const bs_bucket_info *i, void *payload) {
  (void)i;
  watch(payload);
  return 0;
}
static void watch_problem(const char *problem, void *payload) {
  (void)problem;
  watch(payload);
}

/* The callbacks of bs_get_bucket_data (a chunk per op, of two buckets: one page each),
 * bs_list_buckets and bs_db_verify (a problem per bucket) run while no session
 * of the reader's handle is in a transaction or holds a snapshot (pg_stat_activity, from the
 * admin connection): a slow host holds back no vacuum. */
static void t_no_transaction_in_callbacks(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], app[128];
  bs_error err = {0};
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_bucket_request req[2] = {{{"a", 1}, 0}, {{"b", 1}, 0}};
  bs_checkpoint cp;
  watcher wt = {t, app, 0, 0, 0};
  uint64_t problems = 0;
  int more = 0;
  app_url(t, "reader", url, sizeof url, app, sizeof app);
  db = pgt_open(url, 0);
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_writer_open(&w, st, NULL, &err));
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  save(w, BS_INSERT, "r1", "a", "k1");
  save(w, BS_INSERT, "r2", "a", "k1");
  save(w, BS_INSERT, "r3", "b", "k1");
  OK(bs_writer_commit(NULL, w, str("1"), NULL, &err));
  bs_writer_close(w);
  OK(bs_get_checkpoint(&cp, st, &err));
  bo.chunk_bytes = 0; /* a chunk per op */
  OK(bs_get_bucket_data(&more, st, cp.op_id, req, 2, &bo, watch_chunk, &wt, &err));
  assert_int_equal(wt.calls, 3);
  OK(bs_list_buckets(st, (bs_val){NULL, 0}, watch_bucket, &wt, &err));
  assert_int_equal(wt.calls, 5);
  pgt_exec(t->admin, "UPDATE bs_buckets SET checksum = checksum + 1"); /* a problem each */
  OK(bs_db_verify(&problems, db, watch_problem, &wt, &err));
  assert_int_equal(problems, 2);
  assert_int_equal(wt.calls, 7);
  assert_true(wt.sessions >= 1); /* the reader's session was there to be seen */
  assert_int_equal(wt.in_txn, 0);
  bs_storage_close(st);
  bs_close(db);
}

/* A stream created on another handle while a writer's flush holds its transaction open (at the
 * "flush" point: its statements ran, its COMMIT not sent). */
typedef struct creator {
  bs_db *db;
  int calls, rc;
  bs_error err;
} creator;

static void create_at_flush(const char *point, PGconn *c, void *payload) {
  creator *cr = payload;
  (void)c;
  if (strcmp(point, "flush") || cr->calls++) return;
  cr->rc = bs_stream_create(NULL, cr->db, "deploy-2", NULL, &cr->err);
}

/* Creating a stream does not wait for another stream's writer: while the ACTIVE stream's writer
 * holds a flush open, a stream is created on another handle whose URL sets lock_timeout=100 ms,
 * so a wait would be BS_EBUSY (55P03), not a hang. The flush then commits, the new stream is
 * PROCESSING beside the ACTIVE one. */
static void t_stream_create_beside_flush(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], params[300];
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  creator cr = {0};
  snprintf(params, sizeof params, "options=-csearch_path%%3D%s%%20-clock_timeout%%3D100",
           t->schema);
  url_with(url, sizeof url, params);
  cr.db = pgt_open(url, 0);
  cr.rc = -1;
  OK(bs_stream_create(NULL, db, "deploy-1", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_writer_open(&w, st, NULL, &err));
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  save(w, BS_INSERT, "r1", "a", "k1");
  OK(bs_writer_commit(NULL, w, str("1"), NULL, &err));
  save(w, BS_INSERT, "r2", "a", "k1");
  bs__pg_set_hook(db, create_at_flush, &cr);
  OK(bs_writer_flush(NULL, w, &err));
  bs__pg_set_hook(db, NULL, NULL);
  assert_int_equal(cr.calls, 1);
  if (cr.rc != BS_OK) fail_msg("stream creation beside a flush: %d: %s", cr.rc, cr.err.msg);
  OK(bs_writer_commit(NULL, w, str("2"), NULL, &err));
  assert_int_equal(pgt_int(t->admin, "SELECT state FROM bs_streams WHERE id = 1"),
                   BS_STREAM_ACTIVE);
  assert_int_equal(pgt_int(t->admin, "SELECT state FROM bs_streams WHERE id = 2"),
                   BS_STREAM_PROCESSING);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(cr.db);
  bs_close(db);
}

/* ---- 3. the operator's controls ---- */

/* A server older than 14 is refused with a message that names both versions; this one passes. */
static void t_server_version(void **state) {
  deploy *d = *state;
  bs_error err = {0};
  bs_db *db;
  assert_int_equal(bs__pg_check_server(130012, &err), BS_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "PostgreSQL 13 "));
  assert_non_null(strstr(err.msg, "needs 14 or newer"));
  assert_int_equal(bs__pg_check_server(140000, &err), BS_OK);
  db = pgt_open(d->t->url, 0);
  bs_close(db);
}

static int open_rc(const char *url, unsigned flags, bs_error *err) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  int rc;
  o.flags = flags;
  rc = bs_open(&db, url, &o, err);
  bs_close(db);
  return rc;
}

/* Migration 8 (ops into chunks) is one transaction with the steps before it: with schema 7's
 * bs_ops held (ACCESS SHARE: its rows read into bs_chunks, then its DROP waits past the URL's
 * lock_timeout) the open fails with BS_EBUSY after the chunks were written, and leaves schema 7
 * whole (no bs_chunks, every op row); the next open migrates every op into chunks. */
static void t_migration8_atomic(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], params[300];
  bs_error err = {0};
  assert_int_equal(bs__pg_migrate(t->admin, 7, &err), BS_OK);
  pgt_exec(t->admin, "INSERT INTO bs_ops SELECT 1 + g / 300, g, 1, g, 0, 't', convert_to('id' || "
                     "g, 'UTF8'), 's', 'x'"
                     " FROM generate_series(1, 1000) g");
  snprintf(params, sizeof params, "options=-csearch_path%%3D%s%%20-clock_timeout%%3D100",
           t->schema);
  url_with(url, sizeof url, params);
  pgt_exec(t->admin, "BEGIN; LOCK TABLE bs_ops IN ACCESS SHARE MODE");
  assert_int_equal(open_rc(url, 0, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "55P03"));
  pgt_exec(t->admin, "ROLLBACK");
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 7);
  assert_int_equal(pgt_int(t->admin, "SELECT (to_regclass('bs_chunks') IS NULL)::int"), 1);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_ops"), 1000);
  assert_int_equal(open_rc(url, 0, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
  assert_int_equal(pgt_int(t->admin, "SELECT (to_regclass('bs_ops') IS NULL)::int"), 1);
  assert_int_equal(pgt_int(t->admin, "SELECT sum(n) FROM bs_chunks"), 1000);
  assert_int_equal(pgt_int(t->admin, "SELECT count(DISTINCT bucket) FROM bs_chunks"), 4);
  assert_int_equal(pgt_int(t->admin, "SELECT sum(checksum::bigint) FROM bs_chunks"), 500500);
}

/* Schema 8's source records of test 9: 1000 of two streams' two tables each ("t" and "todos",
 * table ids 1 and 2), record g keyed "r<g>" in stream 1 + g % 2, table 1 + (g % 3 > 0), one
 * membership (bucket g % 100, op g % 128, object type "todos", object id the replica id), no
 * lookups, a mark on every tenth, data on every seventh. */
#define SOURCE8                                                                                    \
  "INSERT INTO bs_tables VALUES (1, 't', 1), (1, 'todos', 2), (2, 't', 1), (2, 'todos', 2);"       \
  "INSERT INTO bs_source (stream, table_id, mark, replica_id, members, data)"                      \
  " SELECT 1 + g %% 2, 1 + (g %% 3 > 0)::int, CASE WHEN g %% 10 = 0 THEN g END,"                   \
  "  convert_to('r' || g, 'UTF8'), '\\x01'::bytea || set_byte('\\x00'::bytea, 0, g %% 100)"        \
  "  || set_byte('\\x00'::bytea, 0, g %% 128) || '\\x05746f646f730000'::bytea,"                    \
  "  CASE WHEN g %% 7 = 0 THEN convert_to('d' || g, 'UTF8') END FROM generate_series(1, 1000) g"
/* ... and the records of schema 9 that stand for them: each under its table's key, its members
 * in schema 9's encoding (the head byte; the object type not spelled out in table "todos") */
#define SOURCE9_SAME                                                                               \
  "SELECT count(*) FROM bs_source s JOIN bs_tables t ON t.key = s.tkey,"                           \
  " LATERAL (SELECT substring(convert_from(s.replica_id, 'UTF8') FROM 2)::int AS g) x"             \
  " WHERE t.stream = 1 + x.g %% 2 AND t.id = 1 + (x.g %% 3 > 0)::int"                              \
  " AND s.members = '\\x01'::bytea || set_byte('\\x00'::bytea, 0, x.g %% 100)"                     \
  "  || set_byte('\\x00'::bytea, 0, x.g %% 128) || CASE WHEN t.name = 'todos' THEN '\\x00'::bytea" \
  "  ELSE '\\x0c746f646f73'::bytea END"                                                            \
  " AND s.mark IS NOT DISTINCT FROM CASE WHEN x.g %% 10 = 0 THEN x.g END"                          \
  " AND s.data IS NOT DISTINCT FROM CASE WHEN x.g %% 7 = 0 THEN convert_to('d' || x.g, 'UTF8') "   \
  "END"

/* Migration 9 (source records under a table key, their members re-encoded) is one transaction:
 * with schema 8's bs_source held (ACCESS SHARE: its records read into bs_source9, then its DROP
 * waits past the URL's lock_timeout) the open fails with BS_EBUSY after every record was
 * converted, and leaves schema 8 whole (bs_tables without keys, no bs_source9, every record as
 * it was); the next open converts every record, each to the one that stands for it. */
static void t_migration9_atomic(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], params[300];
  bs_error err = {0};
  assert_int_equal(bs__pg_migrate(t->admin, 8, &err), BS_OK);
  pgt_exec(t->admin, SOURCE8);
  snprintf(params, sizeof params, "options=-csearch_path%%3D%s%%20-clock_timeout%%3D100",
           t->schema);
  url_with(url, sizeof url, params);
  pgt_exec(t->admin, "BEGIN; LOCK TABLE bs_source IN ACCESS SHARE MODE");
  assert_int_equal(open_rc(url, 0, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "55P03"));
  pgt_exec(t->admin, "ROLLBACK");
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 8);
  assert_int_equal(pgt_int(t->admin, "SELECT (to_regclass('bs_source9') IS NULL)::int"), 1);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM information_schema.columns WHERE"
                                     " table_schema = current_schema() AND ((table_name ="
                                     " 'bs_tables' AND column_name = 'key') OR (table_name ="
                                     " 'bs_source' AND column_name = 'tkey'))"),
                   0);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source s JOIN bs_tables t"
                                     " ON t.stream = s.stream AND t.id = s.table_id"
                                     " WHERE octet_length(s.members) = 11"),
                   1000);
  assert_int_equal(open_rc(url, 0, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), 1000);
  assert_int_equal(pgt_int(t->admin, SOURCE9_SAME), 1000);
  assert_int_equal(pgt_int(t->admin, "SELECT count(DISTINCT key) FROM bs_tables"), 4);
}

/* A source record whose table bs_tables does not hold has no key to go under: migration 9 fails
 * (BS_ECORRUPT, naming it), and schema 8 stays as it was, for verify to name it there. */
static void t_migration9_orphan(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  bs_error err = {0};
  assert_int_equal(bs__pg_migrate(t->admin, 8, &err), BS_OK);
  pgt_exec(t->admin, SOURCE8 "; DELETE FROM bs_tables WHERE stream = 2 AND id = 1");
  assert_int_equal(open_rc(t->url, 0, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "a source record of stream 2 names table 1, which bs_tables"));
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 8);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), 1000);
}

/* BS_OPEN_NOMIGRATE: a read-write open neither creates a schema nor migrates an older one (both
 * refused, saying how to migrate); a migration step waits for a table's lock at most
 * lock_timeout (the URL's 100 ms here: BS_EBUSY, nothing applied); an open without the flag
 * migrates, after which the flag opens it. */
static void t_migrations_controlled(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char url[1400], params[300];
  bs_error err = {0};
  bs_db *db;
  long long meta;
  assert_int_equal(open_rc(t->url, BS_OPEN_NOMIGRATE, &err), BS_ENOTFOUND);
  assert_non_null(strstr(err.msg, "bucketstore migrate"));
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM pg_class WHERE relnamespace ="
                           " '%s'::regnamespace",
                           t->schema),
                   0);
  assert_int_equal(bs__pg_migrate(t->admin, 1, &err), BS_OK);
  meta = pgt_int(t->admin, "SELECT 'bs_meta'::regclass::oid::bigint");
  assert_int_equal(bs__pg_migrate(t->admin, 4, &err), BS_OK);
  assert_int_equal(open_rc(t->url, BS_OPEN_NOMIGRATE, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 4, older than"));
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 4);
  snprintf(params, sizeof params, "options=-csearch_path%%3D%s%%20-clock_timeout%%3D100",
           t->schema);
  url_with(url, sizeof url, params);
  pgt_exec(t->admin, "BEGIN; LOCK TABLE bs_ops IN ACCESS SHARE MODE");
  assert_int_equal(open_rc(url, 0, &err), BS_EBUSY);
  assert_non_null(strstr(err.msg, "55P03"));
  pgt_exec(t->admin, "ROLLBACK");
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 4);
  assert_int_equal(open_rc(url, 0, &err), BS_OK);
  assert_int_equal(open_rc(t->url, BS_OPEN_NOMIGRATE, &err), BS_OK);
  assert_true(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'") > 4);
  /* no step created bs_meta again: the history recorded at the version reached is its own */
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_table'"),
                   meta);
  db = pgt_open(t->url, BS_OPEN_NOMIGRATE);
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  bs_close(db);
}

/* A write transaction holds the schema's migration lock shared: a migration's exclusive try
 * fails while a flush is between its statements and its COMMIT. */
static void lock_probe(const char *point, PGconn *c, void *payload) {
  pgt *t = payload;
  (void)c;
  if (strcmp(point, "flush")) return;
  assert_int_equal(pgt_int(t->admin,
                           "SELECT pg_try_advisory_xact_lock('%s'::regnamespace::oid::int, %d)"
                           "::int",
                           t->schema, (int)bs__pg_lock_key(0, BS_PG_LOCK_SCHEMA)),
                   0);
}

/* A process that opened at this build's schema version keeps running while a newer build
 * migrates the schema (as it would: the migration lock taken, the version raised, committed).
 * Every write of the old process is then refused with BS_ECORRUPT, saying to upgrade, and
 * writes nothing: a flush, a commit, snapshot_done, a compaction, a clear, a new writer, a new
 * stream. Reads go on. */
static void t_older_build_refused(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w, *w2;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_checkpoint cp;
  long long ops, head;
  char newer[64];
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_writer_open(&w, st, NULL, &err));
  bs__pg_set_hook(db, lock_probe, t);
  save(w, BS_INSERT, "r1", "a", "k1");
  OK(bs_writer_flush(NULL, w, &err));
  bs__pg_set_hook(db, NULL, NULL);
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  save(w, BS_UPDATE, "r1", "a", "k1"); /* something to compact */
  save(w, BS_UPDATE, "r1", "a", "k1");
  OK(bs_writer_commit(NULL, w, str("0001"), NULL, &err));
  /* the newer build's migration */
  pgt_exec(t->admin,
           "BEGIN; SELECT pg_advisory_xact_lock('%s'::regnamespace::oid::int, %d);"
           " UPDATE bs_meta SET value = %d WHERE key = 'schema_version'; COMMIT",
           t->schema, (int)bs__pg_lock_key(0, BS_PG_LOCK_SCHEMA), BS_PG_SCHEMA_VERSION + 1);
  ops = pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks");
  head = pgt_int(t->admin, "SELECT op_head FROM bs_streams");
  snprintf(newer, sizeof newer, "version %d, newer than this build's %d: upgrade",
           BS_PG_SCHEMA_VERSION + 1, BS_PG_SCHEMA_VERSION);
  save(w, BS_INSERT, "r2", "a", "k1");
  assert_int_equal(bs_writer_flush(NULL, w, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, newer));
  assert_int_equal(bs_writer_commit(NULL, w, str("0002"), NULL, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, newer));
  assert_int_equal(bs_writer_snapshot_done(w, str("0003"), &err), BS_ECORRUPT);
  co.min_bucket_changes = 1;
  assert_int_equal(bs_compact(NULL, st, &co, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, newer));
  assert_int_equal(bs_clear(st, &err), BS_ECORRUPT);
  assert_int_equal(bs_stream_create(NULL, db, "s2", NULL, &err), BS_ECORRUPT);
  bs_writer_close(w);
  assert_int_equal(bs_writer_open(&w2, st, NULL, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, newer));
  assert_int_equal(pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks"), ops);
  assert_int_equal(pgt_int(t->admin, "SELECT op_head FROM bs_streams"), head);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_streams"), 1);
  assert_int_equal(pgt_int(t->admin, "SELECT (no_checkpoint_before = '0')::int FROM bs_streams"),
                   1);
  OK(bs_get_checkpoint(&cp, st, &err));
  assert_int_equal(cp.op_id, head);
  bs_storage_close(st);
  bs_close(db);
}

/* The tables a restore rewinds (all but bs_meta, which a real one rewinds too, to the same
 * values here) */
static const char *const restored[] = {
    "bs_streams", "bs_buckets",    "bs_chunks", "bs_params",      "bs_changes",
    "bs_source",  "bs_superseded", "bs_tables", "bs_wcp_managed", "bs_wcp_custom"};

static void write_some(bs_writer *w, int from, int n, const char *lsn) {
  bs_error err = {0};
  for (int i = from; i < from + n; i++) {
    char id[16], bucket[16];
    snprintf(id, sizeof id, "r%d", i);
    snprintf(bucket, sizeof bucket, "b%d", i % 4);
    save(w, BS_INSERT, id, bucket, "k1");
  }
  OK(bs_writer_commit(NULL, w, str(lsn), NULL, &err));
}

static void ack_rewind(const char *url) {
  bs_error err = {0};
  assert_int_equal(open_rc(url, BS_OPEN_ACK_REWIND | BS_OPEN_RDONLY, &err), BS_EINVAL);
  assert_int_equal(open_rc(url, BS_OPEN_ACK_REWIND, &err), BS_OK);
}

/* History that cannot rewind silently. In a running process: the tables (and the bucket id
 * sequence) restored to a copy taken two commits ago, as a failover to a standby that lacked them
 * leaves them; the writer that saw the later op head refuses (BS_ESTATE) and writes nothing,
 * until an open with BS_OPEN_ACK_REWIND; then the same writer goes on from the restored head.
 * In a fresh process: bs_meta's history names another system than the server's (the data came
 * from another cluster, or a point-in-time restore: another timeline); every write transaction
 * refuses, until the acknowledgement records the server's history. verify is clean after. */
static void t_history_rewound(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0), *db2;
  bs_storage *st, *st2;
  bs_writer *w, *w2;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  long long ops, head, seq;
  uint64_t problems = 99;
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_writer_open(&w, st, NULL, &err));
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  write_some(w, 0, 3, "0001");
  for (size_t i = 0; i < sizeof restored / sizeof *restored; i++)
    pgt_exec(t->admin, "CREATE TABLE saved_%s AS SELECT * FROM %s", restored[i], restored[i]);
  seq = pgt_int(t->admin, "SELECT last_value FROM bs_buckets_id_seq");
  write_some(w, 3, 6, "0002");
  write_some(w, 9, 3, "0003");
  pgt_exec(t->admin, "TRUNCATE bs_streams, bs_buckets, bs_chunks, bs_params, bs_changes, bs_source,"
                     " bs_superseded, bs_tables, bs_wcp_managed, bs_wcp_custom");
  for (size_t i = 0; i < sizeof restored / sizeof *restored; i++)
    pgt_exec(t->admin, "INSERT INTO %s %s SELECT * FROM saved_%s", restored[i],
             strcmp(restored[i], "bs_buckets") && strcmp(restored[i], "bs_tables")
                 ? ""
                 : "OVERRIDING SYSTEM VALUE",
             restored[i]);
  pgt_exec(t->admin, "SELECT setval('bs_buckets_id_seq', %lld)", seq);
  ops = pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks");
  head = pgt_int(t->admin, "SELECT op_head FROM bs_streams");
  save(w, BS_INSERT, "r20", "b0", "k1");
  assert_int_equal(bs_writer_flush(NULL, w, &err), BS_ESTATE);
  assert_non_null(strstr(err.msg, "history rewound: stream 1's op head went back from"));
  assert_non_null(strstr(err.msg, "bucketstore ack-rewind"));
  assert_int_equal(bs_writer_commit(NULL, w, str("0004"), NULL, &err), BS_ESTATE);
  assert_int_equal(pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks"), ops);
  assert_int_equal(pgt_int(t->admin, "SELECT op_head FROM bs_streams"), head);
  ack_rewind(t->url);
  save(w, BS_UPDATE, "r0", "b0", "k1"); /* something to compact */
  save(w, BS_UPDATE, "r0", "b0", "k1");
  OK(bs_writer_commit(NULL, w, str("0004"), NULL, &err));
  assert_true(pgt_int(t->admin, "SELECT op_head FROM bs_streams") > head);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_epoch'"), 1);

  bs_writer_close(w);

  /* a fresh process on data written elsewhere */
  pgt_exec(t->admin, "UPDATE bs_meta SET value = 12345 WHERE key = 'history_system'");
  db2 = pgt_open(t->url, BS_OPEN_NOMIGRATE);
  OK(bs_storage_open(&st2, db2, 1, &err));
  OK(bs_writer_open(&w2, st2, NULL, &err));
  ops = pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks");
  head = pgt_int(t->admin, "SELECT op_head FROM bs_streams");
  save(w2, BS_INSERT, "r21", "b1", "k1");
  assert_int_equal(bs_writer_flush(NULL, w2, &err), BS_ESTATE);
  assert_non_null(strstr(err.msg, "history rewound: the data was written on timeline"));
  assert_non_null(strstr(err.msg, "of PostgreSQL system 12345, the server is on"));
  assert_int_equal(bs_writer_commit(NULL, w2, str("0005"), NULL, &err), BS_ESTATE);
  co.min_bucket_changes = 1;
  assert_int_equal(bs_compact(NULL, st2, &co, &err), BS_ESTATE);
  assert_int_equal(bs_clear(st2, &err), BS_ESTATE);
  assert_int_equal(pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks"), ops);
  assert_int_equal(pgt_int(t->admin, "SELECT op_head FROM bs_streams"), head);
  ack_rewind(t->url);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_system'"),
                   pgt_int(t->admin, "SELECT system_identifier FROM pg_control_system()"));
  OK(bs_writer_commit(NULL, w2, str("0005"), NULL, &err));
  assert_true(pgt_int(t->admin, "SELECT op_head FROM bs_streams") > head);
  bs_writer_close(w2);
  bs_storage_close(st2);
  bs_close(db2);
  OK(bs_db_verify(&problems, db, NULL, NULL, &err));
  assert_int_equal(problems, 0);
  bs_storage_close(st);
  bs_close(db);
}

/* A dump restored into the same cluster while no process of the service runs: the same system
 * and timeline, every table created again from the dump (pg_dump of the schema, the schema
 * dropped, psql runs the dump), so bs_meta has a new OID and the one recorded with the history
 * is the old table's. A fresh process opens read-write and reads; its flush, commit, compaction
 * and clear are refused (BS_ESTATE, "history rewound: the tables are not ..."), nothing
 * written, until the acknowledgement records the new table; then the writer commits from the
 * restored head. verify is clean after. A handle of a process that kept running across the
 * restore, whose writer's lock is the old schema's, is refused every write after the
 * acknowledgement too ("created again ... open the handle again"): else it would write beside
 * the new process's writer of the same stream. */
static void t_dump_restored(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0), *db0;
  bs_storage *st, *st0;
  bs_writer *w, *w0;
  bs_checkpoint cp;
  bs_commit_result r;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  char file[32] = "/tmp/bs-dump.XXXXXX", cmd[2200], msg[200];
  long long ops, head, meta;
  uint64_t problems = 99;
  int fd;
  OK(bs_stream_create(NULL, db, "s", NULL, &err));
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_writer_open(&w, st, NULL, &err));
  OK(bs_writer_snapshot_done(w, str("0"), &err));
  write_some(w, 0, 3, "0001");
  save(w, BS_UPDATE, "r0", "b0", "k1"); /* something to compact */
  save(w, BS_UPDATE, "r0", "b0", "k1");
  write_some(w, 3, 3, "0002");
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  db0 = pgt_open(t->url, 0); /* the process that keeps running */
  OK(bs_storage_open(&st0, db0, 1, &err));
  OK(bs_writer_open(&w0, st0, NULL, &err));
  meta = pgt_int(t->admin, "SELECT 'bs_meta'::regclass::oid::bigint");
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_table'"),
                   meta);
  assert_true((fd = mkstemp(file)) >= 0);
  close(fd);
  snprintf(cmd, sizeof cmd, "pg_dump -d '%s' -n %s -f %s", pgt_base_url(), t->schema, file);
  assert_int_equal(system(cmd), 0);
  pgt_exec(t->admin, "DROP SCHEMA %s CASCADE", t->schema);
  snprintf(cmd, sizeof cmd, "psql -X -q -v ON_ERROR_STOP=1 -d '%s' -f %s >/dev/null",
           pgt_base_url(), file);
  assert_int_equal(system(cmd), 0);
  unlink(file);
  assert_true(pgt_int(t->admin, "SELECT 'bs_meta'::regclass::oid::bigint") != meta);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_table'"),
                   meta);
  ops = pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks");
  head = pgt_int(t->admin, "SELECT op_head FROM bs_streams");

  db = pgt_open(t->url, 0);
  OK(bs_storage_open(&st, db, 1, &err));
  OK(bs_get_checkpoint(&cp, st, &err));
  assert_int_equal(cp.op_id, head);
  OK(bs_writer_open(&w, st, NULL, &err));
  save(w, BS_INSERT, "r20", "b0", "k1");
  assert_int_equal(bs_writer_flush(NULL, w, &err), BS_ESTATE);
  snprintf(msg, sizeof msg,
           "history rewound: the tables are not the ones the data was written in (bs_meta was"
           " table %lld, is %lld: restored from a dump)",
           meta, pgt_int(t->admin, "SELECT 'bs_meta'::regclass::oid::bigint"));
  if (!strstr(err.msg, msg)) fail_msg("%s\nis not\n%s", err.msg, msg);
  assert_non_null(strstr(err.msg, "bucketstore ack-rewind"));
  assert_int_equal(bs_writer_commit(NULL, w, str("0003"), NULL, &err), BS_ESTATE);
  co.min_bucket_changes = 1;
  assert_int_equal(bs_compact(NULL, st, &co, &err), BS_ESTATE);
  assert_int_equal(bs_clear(st, &err), BS_ESTATE);
  assert_int_equal(pgt_int(t->admin, "SELECT coalesce(sum(n), 0) FROM bs_chunks"), ops);
  assert_int_equal(pgt_int(t->admin, "SELECT op_head FROM bs_streams"), head);
  ack_rewind(t->url);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'history_table'"),
                   pgt_int(t->admin, "SELECT 'bs_meta'::regclass::oid::bigint"));
  memset(&r, 0, sizeof r);
  OK(bs_writer_commit(&r, w, str("0003"), NULL, &err));
  assert_true(r.checkpoint > (uint64_t)head); /* from the restored head */
  assert_int_equal(r.checkpoint, pgt_int(t->admin, "SELECT op_head FROM bs_streams"));
  head = pgt_int(t->admin, "SELECT op_head FROM bs_streams");
  save(w0, BS_INSERT, "r30", "b0", "k1");
  assert_int_equal(bs_writer_flush(NULL, w0, &err), BS_ESTATE);
  assert_non_null(strstr(err.msg, "was created again since this handle opened it"));
  assert_int_equal(bs_writer_commit(NULL, w0, str("0004"), NULL, &err), BS_ESTATE);
  assert_int_equal(bs_clear(st0, &err), BS_ESTATE);
  assert_int_equal(pgt_int(t->admin, "SELECT op_head FROM bs_streams"), head);
  bs_writer_close(w0);
  bs_storage_close(st0);
  bs_close(db0);
  bs_writer_close(w);
  OK(bs_db_verify(&problems, db, NULL, NULL, &err));
  assert_int_equal(problems, 0);
  bs_storage_close(st);
  bs_close(db);
}

/* A transaction-mode pooler hands the next statement of a connection to whichever server
 * session is free: here the open's connection gets a new session between the two statements
 * that read its server process (PQreset at the "open.probe" point), as such a pooler does when
 * another client took the first one. The open is refused (BS_EUNSUPPORTED) saying what to
 * configure, and creates nothing; without the seam the same URL opens. */
static void new_session(const char *point, PGconn *c, void *payload) {
  (void)payload;
  if (!strcmp(point, "open.probe")) PQreset(c);
}

static void t_transaction_pooler(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  bs_error err = {0};
  bs__pg_set_open_hook(new_session, NULL);
  assert_int_equal(open_rc(t->url, 0, &err), BS_EUNSUPPORTED);
  bs__pg_set_open_hook(NULL, NULL);
  assert_non_null(strstr(err.msg, "pooler in transaction mode"));
  assert_non_null(strstr(err.msg, "changed between statements"));
  assert_non_null(strstr(err.msg, "connect directly or through a pooler in session mode"));
  assert_int_equal(pgt_int(t->admin, "SELECT (to_regclass('bs_meta') IS NULL)::int"), 1);
  assert_int_equal(open_rc(t->url, 0, &err), BS_OK);
}

/* The privileges docs/operations.md lists, with roles that are not superusers: the owner of
 * the schema creates it (a read-write open), default privileges give a read-write role DML on
 * its tables and USAGE on its sequence (bucket ids), a read-only role SELECT; the read-write role (BS_OPEN_NOMIGRATE) runs every
 * kind of call, the read-only role reads and waits (BS_OPEN_RDONLY), and a write through it
 * fails with the server's "permission denied". */
static void t_role_matrix(void **state) {
  deploy *d = *state;
  pgt *t = d->t;
  char own[32], rw[32], ro[32], url[1400], params[300];
  bs_error err = {0};
  bs_db *db;
  snprintf(own, sizeof own, "r%ld_own", (long)getpid());
  snprintf(rw, sizeof rw, "r%ld_rw", (long)getpid());
  snprintf(ro, sizeof ro, "r%ld_ro", (long)getpid());
  on_teardown(d,
              "REASSIGN OWNED BY %s TO CURRENT_USER; DROP OWNED BY %s; DROP OWNED BY %s;"
              " DROP OWNED BY %s; DROP ROLE %s; DROP ROLE %s; DROP ROLE %s;",
              own, own, rw, ro, own, rw, ro);
  pgt_exec(t->admin, "CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN", own, rw,
           ro);
  pgt_exec(t->admin,
           "ALTER SCHEMA %s OWNER TO %s; GRANT USAGE ON SCHEMA %s TO %s, %s;"
           " ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA %s"
           "  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %s;"
           " ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA %s GRANT USAGE ON SEQUENCES TO %s;"
           " ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA %s GRANT SELECT ON TABLES TO %s",
           t->schema, own, t->schema, rw, ro, own, t->schema, rw, own, t->schema, rw, own,
           t->schema, ro);
  snprintf(params, sizeof params, "user=%s&options=-csearch_path%%3D%s", own, t->schema);
  url_with(url, sizeof url, params);
  bs_close(pgt_open(url, 0)); /* the owner creates the schema */

  snprintf(params, sizeof params, "user=%s&options=-csearch_path%%3D%s", rw, t->schema);
  url_with(url, sizeof url, params);
  db = pgt_open(url, BS_OPEN_NOMIGRATE);
  exercise(db);
  bs_close(db);

  snprintf(params, sizeof params, "user=%s&options=-csearch_path%%3D%s", ro, t->schema);
  url_with(url, sizeof url, params);
  db = pgt_open(url, BS_OPEN_RDONLY);
  {
    bs_storage *st;
    bs_checkpoint cp, now;
    bs_val b = {"a", 1};
    bs_checksum ck;
    bs_stat s;
    assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
    assert_int_equal(bs_get_checkpoint(&cp, st, &err), BS_OK);
    assert_int_equal(bs_get_checksums(&ck, st, cp.op_id, &b, 1, &err), BS_OK);
    assert_true(ck.count > 0);
    assert_int_equal(bs_wait_checkpoint(&now, st, &cp, 1, &err), BS_OK);
    assert_int_equal(bs_db_stat(&s, db, &err), BS_OK);
    bs_storage_close(st);
  }
  bs_close(db);
  db = pgt_open(url, BS_OPEN_NOMIGRATE);
  {
    bs_storage *st;
    bs_writer *w;
    assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
    assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
    save(w, BS_INSERT, "r99", "a", "k1");
    assert_int_equal(bs_writer_commit(NULL, w, str("9999"), NULL, &err), BS_EIO);
    assert_non_null(strstr(err.msg, "permission denied"));
    bs_writer_close(w);
    bs_storage_close(st);
  }
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_shadowing_role, setup, teardown),
      cmocka_unit_test_setup_teardown(t_two_search_paths, setup, teardown),
      cmocka_unit_test_setup_teardown(t_quoted_schema_names, setup, teardown),
      cmocka_unit_test_setup_teardown(t_waiters_share_one_connection, setup, teardown),
      cmocka_unit_test_setup_teardown(t_pool_bound, setup, teardown),
      cmocka_unit_test_setup_teardown(t_stream_create_beside_flush, setup, teardown),
      cmocka_unit_test_setup_teardown(t_no_transaction_in_callbacks, setup, teardown),
      cmocka_unit_test_setup_teardown(t_server_version, setup, teardown),
      cmocka_unit_test_setup_teardown(t_migrations_controlled, setup, teardown),
      cmocka_unit_test_setup_teardown(t_migration8_atomic, setup, teardown),
      cmocka_unit_test_setup_teardown(t_migration9_atomic, setup, teardown),
      cmocka_unit_test_setup_teardown(t_migration9_orphan, setup, teardown),
      cmocka_unit_test_setup_teardown(t_older_build_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(t_history_rewound, setup, teardown),
      cmocka_unit_test_setup_teardown(t_dump_restored, setup, teardown),
      cmocka_unit_test_setup_teardown(t_transaction_pooler, setup, teardown),
      cmocka_unit_test_setup_teardown(t_role_matrix, setup, teardown),
  };
  if (pgt_skipped("test_pg_deploy")) return 0;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  return pgt_skipped("test_pg_deploy") ? 0 : 1;
}
#endif
