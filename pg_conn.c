/*
 * pg_conn.c: the bottom of the PostgreSQL backend, under every other pg*.c file: statements
 * (binary parameters and result columns, prepared statements kept per session, transactions,
 * errors) and connections (the pool, a session's settings, the test seam). It holds no slot of
 * a method table and uses no other pg*.c file.
 */
#include "pg_internal.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Statements ------------------------------------------------------------------------------ */

static void arg_int(bs__pg_args *a, uint64_t v, int size, Oid type) {
  int i = a->n++;
  for (int k = 0; k < size; k++) a->ints[i][k] = (unsigned char)(v >> (8 * (size - 1 - k)));
  a->values[i] = (const char *)a->ints[i];
  a->lengths[i] = size;
  a->formats[i] = 1;
  a->types[i] = type;
}

void bs__pg_arg_i64(bs__pg_args *a, int64_t v) {
  arg_int(a, (uint64_t)v, 8, 20 /* int8 */);
}
void bs__pg_arg_i32(bs__pg_args *a, int32_t v) {
  arg_int(a, (uint64_t)(uint32_t)v, 4, 23 /* int4 */);
}
void bs__pg_arg_bool(bs__pg_args *a, int v) {
  arg_int(a, v ? 1u : 0u, 1, 16 /* bool */);
}
void bs__pg_arg_text(bs__pg_args *a, const char *s) {
  int i = a->n++;
  a->values[i] = s;
  a->lengths[i] = (int)strlen(s);
  a->formats[i] = 1;
  a->types[i] = 25 /* text */;
}
void bs__pg_arg_states(bs__pg_args *a, const uint8_t map[BS__STREAM_STATES],
                       char buf[BS_PG_STATES_TEXT]) {
  size_t n = 0;
  for (unsigned s = 1; s < BS__STREAM_STATES; s++)
    n += (size_t)snprintf(buf + n, BS_PG_STATES_TEXT - n, "%c%u", s == 1 ? '{' : ',', map[s]);
  snprintf(buf + n, BS_PG_STATES_TEXT - n, "}");
  bs__pg_arg_text(a, buf);
}
void bs__pg_arg_lock(bs__pg_args *a, const bs__pg_schema *s, uint32_t stream, int kind) {
  bs__pg_arg_i32(a, (int32_t)s->oid);
  bs__pg_arg_i32(a, bs__pg_lock_key(stream, kind));
}
void bs__pg_arg_bytes(bs__pg_args *a, bs_val v) {
  int i = a->n++;
  a->values[i] = v.data ? (v.size ? (const char *)v.data : "") : NULL;
  a->lengths[i] = (int)v.size;
  a->formats[i] = 1;
  a->types[i] = 17 /* bytea */;
}

int bs__pg_arg_bytes_array(bs__pg_args *a, const bs_val *v, size_t n, const bs_allocator *al,
                           unsigned char **buf, bs_error *err) {
  size_t size = n ? 20 : 12, at;
  unsigned char *p;
  for (size_t i = 0; i < n; i++) size += 4 + v[i].size;
  if (size > (1u << 30)) return bs__fail(err, BS_ETOOBIG, "an array of %zu bytes", size);
  if (!(p = bs__malloc(al, size))) return bs__fail(err, BS_ENOMEM, "an array of %zu bytes", size);
  bs__put_u32be(p, n ? 1 : 0); /* dimensions */
  bs__put_u32be(p + 4, 0);     /* flags (ignored by the server) */
  bs__put_u32be(p + 8, 17);    /* element type: bytea */
  at = 12;
  if (n) {
    bs__put_u32be(p + 12, (uint32_t)n);
    bs__put_u32be(p + 16, 1); /* lower bound */
    at = 20;
  }
  for (size_t i = 0; i < n; i++) {
    bs__put_u32be(p + at, v[i].data ? (uint32_t)v[i].size : 0xffffffffu); /* -1: NULL */
    if (v[i].size) memcpy(p + at + 4, v[i].data, v[i].size);
    at += 4 + v[i].size;
  }
  *buf = p;
  a->values[a->n] = (const char *)p;
  a->lengths[a->n] = (int)size;
  a->formats[a->n] = 1;
  a->types[a->n++] = 1001 /* bytea[] */;
  return BS_OK;
}

int bs__pg_arg_i64_array(bs__pg_args *a, const uint64_t *v, size_t n, const bs_allocator *al,
                         unsigned char **buf, bs_error *err) {
  size_t size = n ? 20 + 12 * n : 12;
  unsigned char *p;
  if (!(p = bs__malloc(al, size))) return bs__fail(err, BS_ENOMEM, "an array of %zu bytes", size);
  bs__put_u32be(p, n ? 1 : 0);
  bs__put_u32be(p + 4, 0);
  bs__put_u32be(p + 8, 20); /* int8 */
  if (n) {
    bs__put_u32be(p + 12, (uint32_t)n);
    bs__put_u32be(p + 16, 1);
  }
  for (size_t i = 0; i < n; i++) {
    bs__put_u32be(p + 20 + 12 * i, 8);
    bs__put_u64be(p + 24 + 12 * i, v[i]);
  }
  *buf = p;
  a->values[a->n] = (const char *)p;
  a->lengths[a->n] = (int)size;
  a->formats[a->n] = 1;
  a->types[a->n++] = 1016 /* int8[] */;
  return BS_OK;
}

int bs__pg_array_open(bs_val v, bs__pg_array *it, bs_error *err) {
  const unsigned char *p = v.data;
  uint32_t dims;
  memset(it, 0, sizeof *it);
  if (!p || v.size < 12) goto bad;
  dims = bs__get_u32be(p);
  it->end = p + v.size;
  if (dims == 0) {
    it->p = p + 12;
    return BS_OK;
  }
  if (dims != 1 || v.size < 20) goto bad;
  it->n = bs__get_u32be(p + 12);
  it->p = p + 20;
  return BS_OK;
bad:
  return bs__fail(err, BS_ECORRUPT, "an array value of %zu bytes does not decode", v.size);
}

int bs__pg_array_next(bs__pg_array *it, bs_val *out) {
  uint32_t len;
  if (it->i == it->n) return 0;
  if (it->end - it->p < 4) return BS_ECORRUPT;
  len = bs__get_u32be(it->p);
  it->p += 4;
  it->i++;
  if (len == 0xffffffffu) {
    out->data = NULL;
    out->size = 0;
    return 1;
  }
  if ((size_t)(it->end - it->p) < len) return BS_ECORRUPT;
  out->data = it->p;
  out->size = len;
  it->p += len;
  return 1;
}

int bs__pg_fail(PGconn *c, const PGresult *res, const char *what, bs_error *err) {
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *msg = res ? PQresultErrorMessage(res) : NULL;
  int code = BS_EIO, n;
  if (!msg || !*msg) msg = c ? PQerrorMessage(c) : "no connection";
  n = (int)strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) n--; /* libpq ends with "\n" */
  /* 55P03 lock_not_available, 40001 serialization_failure, 40P01 deadlock_detected */
  if (state && (!strcmp(state, "55P03") || !strcmp(state, "40001") || !strcmp(state, "40P01")))
    code = BS_EBUSY;
  return bs__fail(err, code, "%s: PostgreSQL%s%s: %.*s", what, state ? " " : "", state ? state : "",
                  n, msg);
}

/* A statement's result r: *res, or the failure mapped. */
static int result(PGconn *c, PGresult *r, PGresult **res, const char *what, bs_error *err) {
  ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  int rc;
  if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
    *res = r;
    return BS_OK;
  }
  *res = NULL;
  rc = r ? bs__pg_fail(c, r, what, err)
         : (PQstatus(c) == CONNECTION_OK ? bs__fail(err, BS_ENOMEM, "%s: out of memory", what)
                                         : bs__pg_fail(c, NULL, what, err));
  PQclear(r);
  return rc;
}

int bs__pg_exec(PGconn *c, const char *sql, const bs__pg_args *args, PGresult **res,
                const char *what, bs_error *err) {
  PGresult *r;
  if (args)
    r = PQexecParams(c, sql, args->n, args->types, args->values, args->lengths, args->formats, 1);
  else
    r = PQexecParams(c, sql, 0, NULL, NULL, NULL, NULL, 1);
  return result(c, r, res, what, err);
}

/* The integer argument i (int2, int4, int8 or bool) as SQL text: a typed literal. */
static int arg_literal(const bs__pg_args *a, int i, char *out, size_t cap) {
  const unsigned char *p = a->ints[i];
  uint64_t v = 0;
  int size = a->lengths[i];
  if (a->values[i] != (const char *)p) return 0; /* not an integer argument */
  for (int k = 0; k < size; k++) v = v << 8 | p[k];
  switch (a->types[i]) {
  case 16:
    return snprintf(out, cap, "%s", v ? "true" : "false");
  case 20:
    return snprintf(out, cap, "(%lld::int8)", (long long)(int64_t)v);
  case 23:
    return snprintf(out, cap, "(%d::int4)", (int)(int32_t)(uint32_t)v);
  default:
    return 0;
  }
}

int bs__pg_exec_custom(PGconn *c, const char *sql, const bs__pg_args *args, PGresult **res,
                       const char *what, bs_error *err) {
  char text[4096];
  size_t n = 0;
  *res = NULL;
  for (const char *p = sql; *p;) {
    int len = 1;
    if (*p == '$' && p[1] >= '1' && p[1] <= '9') {
      char *end;
      long i = strtol(p + 1, &end, 10) - 1;
      if (i >= args->n || !(len = arg_literal(args, (int)i, text + n, sizeof text - n)) ||
          (size_t)len >= sizeof text - n)
        return bs__fail(err, BS_EINVAL, "%s: argument %ld is not an integer", what, i + 1);
      n += (size_t)len;
      p = end;
      continue;
    }
    if (n + 1 >= sizeof text) return bs__fail(err, BS_ETOOBIG, "%s: statement too long", what);
    text[n++] = *p++;
  }
  text[n] = 0;
  return bs__pg_exec(c, text, NULL, res, what, err);
}

/* ---- Prepared statements: the set of a session's, kept with its connection -------------------
 * A libpq event procedure gives every connection conn_open makes an instance datum (the bits of
 * the statements prepared in its session), freed with the connection (PQfinish) and emptied by a
 * reset (PQreset starts a new session). */

typedef struct conn_data {
  uint64_t prepared; /* bit BS_PG_STMT_* set: prepared in this session as "bs<id>" */
  int history_ok;    /* the session's server history matched bs_meta's (bs__pg_begin_write) */
} conn_data;

static int conn_events(PGEventId id, void *info, void *pass) {
  bs__pg_db *db = pass;
  conn_data *d;
  switch (id) {
  case PGEVT_REGISTER:
    if (!(d = bs__calloc(&db->base.alloc, 1, sizeof *d))) return 0;
    if (PQsetInstanceData(((PGEventRegister *)info)->conn, conn_events, d)) return 1;
    bs__free(&db->base.alloc, d);
    return 0;
  case PGEVT_CONNRESET:
    if ((d = PQinstanceData(((PGEventConnReset *)info)->conn, conn_events))) {
      d->prepared = 0;
      d->history_ok = 0;
    }
    return 1;
  case PGEVT_CONNDESTROY:
    bs__free(&db->base.alloc, PQinstanceData(((PGEventConnDestroy *)info)->conn, conn_events));
    return 1;
  default:
    return 1;
  }
}

_Static_assert(BS_PG_STMT_N <= 64, "a session's prepared statements are the bits of a uint64_t");

int bs__pg_execp(PGconn *c, const bs__pg_stmt *s, const bs__pg_args *args, PGresult **res,
                 const char *what, bs_error *err) {
  static const bs__pg_args none = {0};
  conn_data *d = PQinstanceData(c, conn_events);
  uint64_t bit = 1ull << s->id;
  char name[16];
  PGresult *r;
  int rc;
  if (!args) args = &none;
  if (!d) return bs__pg_exec(c, s->sql, args, res, what, err);
  snprintf(name, sizeof name, "bs%d", s->id);
  if (!(d->prepared & bit)) {
    r = PQprepare(c, name, s->sql, args->n, args->types);
    if ((rc = result(c, r, &r, what, err))) {
      *res = NULL;
      return rc;
    }
    PQclear(r);
    d->prepared |= bit;
  }
  r = PQexecPrepared(c, name, args->n, args->values, args->lengths, args->formats, 1);
  return result(c, r, res, what, err);
}

int bs__pg_runp(PGconn *c, const bs__pg_stmt *s, const bs__pg_args *args, const char *what,
                bs_error *err) {
  PGresult *r;
  int rc = bs__pg_execp(c, s, args, &r, what, err);
  PQclear(r);
  return rc;
}

int bs__pg_run(PGconn *c, const char *sql, const bs__pg_args *args, const char *what,
               bs_error *err) {
  PGresult *r;
  int rc;
  if (!args) { /* the simple protocol: sql may be several statements (the migrations) */
    ExecStatusType s;
    r = PQexec(c, sql);
    s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    rc = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK ? BS_OK : bs__pg_fail(c, r, what, err);
  } else {
    rc = bs__pg_exec(c, sql, args, &r, what, err);
  }
  PQclear(r);
  return rc;
}

static uint64_t col_be(const PGresult *r, int row, int col, int size) {
  const unsigned char *p = (const unsigned char *)PQgetvalue(r, row, col);
  uint64_t v = 0;
  if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != size) return 0;
  for (int k = 0; k < size; k++) v = v << 8 | p[k];
  return v;
}
int64_t bs__pg_i64(const PGresult *r, int row, int col) {
  return (int64_t)col_be(r, row, col, 8);
}
int32_t bs__pg_i32(const PGresult *r, int row, int col) {
  return (int32_t)(uint32_t)col_be(r, row, col, 4);
}
int bs__pg_i16(const PGresult *r, int row, int col) {
  return (int16_t)(uint16_t)col_be(r, row, col, 2);
}
int bs__pg_bool(const PGresult *r, int row, int col) {
  return col_be(r, row, col, 1) != 0;
}
bs_val bs__pg_bytes(const PGresult *r, int row, int col) {
  bs_val v = {NULL, 0};
  if (PQgetisnull(r, row, col)) return v;
  v.data = PQgetvalue(r, row, col); /* never NULL, also for an empty value */
  v.size = (size_t)PQgetlength(r, row, col);
  return v;
}

int bs__pg_begin(PGconn *c, int read_only, bs_error *err) {
  return bs__pg_run(c, read_only ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN",
                    NULL, "begin", err);
}
int bs__pg_commit(PGconn *c, bs_error *err) {
  return bs__pg_run(c, "COMMIT", NULL, "commit", err);
}
void bs__pg_rollback(PGconn *c) {
  PQclear(PQexec(c, "ROLLBACK"));
}

int bs__pg_schema_current(int64_t v, bs_error *err) {
  if (v == BS_PG_SCHEMA_VERSION) return BS_OK;
  if (v > BS_PG_SCHEMA_VERSION)
    return bs__fail(err, BS_ECORRUPT,
                    "the PostgreSQL schema has version %lld, newer than this build's %d: "
                    "upgrade bucketstore",
                    (long long)v, BS_PG_SCHEMA_VERSION);
  return bs__fail(err, BS_ECORRUPT, "the PostgreSQL schema has version %lld, not this build's %d",
                  (long long)v, BS_PG_SCHEMA_VERSION);
}

/* The history result columns at col (stored system, timeline and table, then the server's):
 * BS_ESTATE when bs_meta holds a history (the open records one) that is not the server's; a
 * value not recorded is not compared. */
static int history_check(const PGresult *r, int col, bs_error *err) {
  const char *v[6];
  for (int i = 0; i < 6; i++) v[i] = PQgetisnull(r, 0, col + i) ? NULL : PQgetvalue(r, 0, col + i);
  if (v[0] && v[1] && (strcmp(v[0], v[3]) || strcmp(v[1], v[4])))
    return bs__fail(err, BS_ESTATE,
                    "history rewound: the data was written on timeline %s of PostgreSQL system "
                    "%s, the server is on timeline %s of system %s (a failover or a restore): "
                    "clients must sync again; then run bucketstore ack-rewind URL",
                    v[1], v[0], v[4], v[3]);
  if (v[2] && strcmp(v[2], v[5]))
    return bs__fail(err, BS_ESTATE,
                    "history rewound: the tables are not the ones the data was written in "
                    "(bs_meta was table %s, is %s: restored from a dump): clients must sync "
                    "again; then run bucketstore ack-rewind URL",
                    v[2], v[5]);
  return BS_OK;
}

/* The schema's OID in column col is the one this handle resolved at open: every write checks it,
 * since the advisory lock keys and the notification channel derive from it. A schema dropped and
 * created again under a running process (a dump restored) has a new OID; this handle's writers
 * would then take the old keys while a process opened since takes the new ones, two writers of
 * one stream. */
static int schema_same(const bs__pg_db *db, const PGresult *r, int col, bs_error *err) {
  long long oid = PQgetisnull(r, 0, col) ? 0 : strtoll(PQgetvalue(r, 0, col), NULL, 10);
  if (oid == (long long)db->schema.oid) return BS_OK;
  return bs__fail(err, BS_ESTATE,
                  "schema %s was created again since this handle opened it (OID %u, now %lld: "
                  "a restore): close and open the handle again",
                  db->schema.quoted, (unsigned)db->schema.oid, oid);
}

int bs__pg_begin_write(bs__pg_db *db, PGconn *c, int64_t *xid, bs_error *err) {
  conn_data *d = PQinstanceData(c, conn_events);
  int history = !d || !d->history_ok; /* once per session: its server cannot change */
  char sql[1024];
  PGresult *r;
  int rc = BS_OK;
  /* the simple protocol's statements each take their snapshot when they start, so the last one
   * reads bs_meta after the lock was granted; its result is the one returned, in text */
  snprintf(sql, sizeof sql,
           "BEGIN; SELECT pg_advisory_xact_lock_shared(%d, %d);"
           " SELECT %s, (SELECT value FROM bs_meta WHERE key = 'schema_version'),"
           " (SELECT c.relnamespace FROM pg_catalog.pg_class c"
           "   WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('bs_meta'))%s",
           (int)(int32_t)db->schema.oid, (int)bs__pg_lock_key(0, BS_PG_LOCK_SCHEMA),
           xid ? "txid_current()" : "0",
           history ? ", (SELECT value FROM bs_meta WHERE key = 'history_system'),"
                     " (SELECT value FROM bs_meta WHERE key = 'history_timeline'),"
                     " (SELECT value FROM bs_meta WHERE key = 'history_table'), " HISTORY_SQL
                   : "");
  r = PQexec(c, sql);
  if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
    rc = bs__pg_fail(c, r, "begin", err);
  else if (!(rc = bs__pg_schema_current(strtoll(PQgetvalue(r, 0, 1), NULL, 10), err)) &&
           !(rc = schema_same(db, r, 2, err)) && history && !(rc = history_check(r, 3, err)) && d)
    d->history_ok = 1;
  if (!rc && xid) *xid = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  PQclear(r);
  if (rc && PQtransactionStatus(c) != PQTRANS_IDLE) bs__pg_rollback(c);
  return rc;
}

/* ---- Connections ----------------------------------------------------------------------------- */

/* Notices (e.g. "relation already exists, skipping") would go to stderr: a library prints
 * nothing. */
static void quiet_notice(void *arg, const PGresult *res) {
  BS_UNUSED(arg);
  BS_UNUSED(res);
}

/* Settings the URL may override (libpq takes the last value of a keyword: these come before
 * the URL's, expand_dbname): a connect that never completes fails after 10 s; keepalives find
 * a server or network that went away under an idle session (a writer's lock, the LISTEN
 * connection) in about two minutes; application_name names the process's sessions in
 * pg_stat_activity. */
static const char *const conn_keys[] = {
    "connect_timeout",  "keepalives",       "keepalives_idle", "keepalives_interval",
    "keepalives_count", "application_name", "dbname",          NULL};

int bs__pg_conn_open(bs__pg_db *db, PGconn **out, bs_error *err) {
  const char *values[] = {"10", "1", "60", "10", "6", "bucketstore", db->url, NULL};
  PGconn *c = PQconnectdbParams(conn_keys, values, 1);
  int rc;
  _Static_assert(sizeof values == sizeof conn_keys, "a value per keyword");
  *out = NULL;
  if (!c) return bs__fail(err, BS_ENOMEM, "connecting to PostgreSQL: out of memory");
  if (PQstatus(c) != CONNECTION_OK) {
    rc = bs__pg_fail(c, NULL, "connecting to PostgreSQL", err);
    if (err) bs__redact_message(err->msg, sizeof err->msg, db->url); /* libpq may quote it */
    PQfinish(c);
    return rc;
  }
  PQsetNoticeReceiver(c, quiet_notice, NULL);
  if (!PQregisterEventProc(c, conn_events, "bucketstore", db)) {
    PQfinish(c);
    return bs__fail(err, BS_ENOMEM, "connecting to PostgreSQL: out of memory");
  }
  /* the handle's one schema (pg_internal.h), once open resolved it */
  if (db->schema.oid && (rc = bs__pg_run(c, db->schema.set_path, NULL,
                                         "connecting to PostgreSQL: search_path", err)) != BS_OK) {
    PQfinish(c);
    return rc;
  }
  /* Generic plans: every statement of the backend walks an index by its key, whatever the
   * values, so a prepared one (bs__pg_execp) is planned once per session. Under the default
   * (auto) a statement whose values narrow its estimates (a checksum's tail above C, a page of
   * one bucket) kept a custom plan, planned again at every call: 0.15 ms of a 0.2 ms checksum.
   * BS_OPEN_NOSYNC: a crash (of the server) may lose recent commits, never half of one. */
  if ((rc = bs__pg_run(c,
                       (db->base.flags & BS_OPEN_NOSYNC)
                           ? "SET plan_cache_mode = force_generic_plan;"
                             " SET synchronous_commit = off"
                           : "SET plan_cache_mode = force_generic_plan",
                       NULL, "connecting to PostgreSQL", err)) != BS_OK) {
    PQfinish(c);
    return rc;
  }
  *out = c;
  return BS_OK;
}

int bs__pg_conn_alive(PGconn *c) {
  for (int i = 0; i < 8 && PQstatus(c) == CONNECTION_OK; i++) {
    struct pollfd p;
    p.fd = PQsocket(c);
    p.events = POLLIN;
    p.revents = 0;
    if (p.fd < 0) return 0;
    if (poll(&p, 1, 0) <= 0) break; /* nothing waiting */
    if (!PQconsumeInput(c)) return 0;
  }
  return PQstatus(c) == CONNECTION_OK;
}

/* Frees a slot of the pool (a connection closed or never opened) for a waiting call. */
static void slot_free(bs__pg_db *db) {
  pthread_mutex_lock(&db->pool_mu);
  db->n_conns--;
  pthread_cond_signal(&db->pool_cv);
  pthread_mutex_unlock(&db->pool_mu);
}

static int conn_take(bs__pg_db *db, PGconn **out, int wait, bs_error *err) {
  int rc, waited = 0;
  pthread_mutex_lock(&db->pool_mu);
  for (;;) {
    if (db->n_idle) {
      PGconn *c = db->idle[--db->n_idle];
      pthread_mutex_unlock(&db->pool_mu);
      if (bs__pg_conn_alive(c)) {
        *out = c;
        return BS_OK;
      }
      PQfinish(c); /* the server dropped it while it was idle (a restart drops them all): its
                      slot is this call's */
      break;
    }
    if (db->n_conns < db->max_conns) {
      db->n_conns++;
      pthread_mutex_unlock(&db->pool_mu);
      break;
    }
    if (!wait) {
      pthread_mutex_unlock(&db->pool_mu);
      return BS_EBUSY;
    }
    if (!waited++) { /* the test seam, outside the lock; then the pool is looked at again */
      pthread_mutex_unlock(&db->pool_mu);
      bs__pg_hook(db, "pool.wait", NULL);
      pthread_mutex_lock(&db->pool_mu);
      continue;
    }
    pthread_cond_wait(&db->pool_cv, &db->pool_mu);
  }
  if ((rc = bs__pg_conn_open(db, out, err))) slot_free(db);
  return rc;
}

int bs__pg_conn_get(bs__pg_db *db, PGconn **out, bs_error *err) {
  return conn_take(db, out, 1, err);
}

int bs__pg_conn_try(bs__pg_db *db, PGconn **out) {
  bs_error ignored = {0};
  return conn_take(db, out, 0, &ignored);
}

void bs__pg_conn_drop(bs__pg_db *db, PGconn *c) {
  if (!c) return;
  PQfinish(c);
  slot_free(db);
}

void bs__pg_conn_put(bs__pg_db *db, PGconn *c) {
  int keep;
  if (!c) return;
  keep = PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE;
  pthread_mutex_lock(&db->pool_mu);
  if (keep && db->n_conns <= db->max_conns) { /* an adopted one may find the pool full */
    db->idle[db->n_idle++] = c;               /* n_idle < n_conns <= max_conns */
    c = NULL;
  } else {
    db->n_conns--;
  }
  pthread_cond_signal(&db->pool_cv);
  pthread_mutex_unlock(&db->pool_mu);
  PQfinish(c);
}

void bs__pg_conn_detach(bs__pg_db *db) {
  slot_free(db);
}

void bs__pg_conn_adopt(bs__pg_db *db, PGconn *c) {
  if (!c) return;
  pthread_mutex_lock(&db->pool_mu);
  db->n_conns++;
  pthread_mutex_unlock(&db->pool_mu);
  bs__pg_conn_put(db, c);
}

void bs__pg_hook(bs__pg_db *db, const char *point, PGconn *c) {
  if (db->hook) db->hook(point, c, db->hook_payload);
}

/* A binary COPY ... FROM STDIN of data's tuples (pg_internal.h). */
int bs__pg_copy_in(PGconn *c, const char *sql, bs__pg_buf *data, const bs_allocator *a,
                   bs_error *err) {
  static const unsigned char header[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};
  static const unsigned char trailer[2] = {0xff, 0xff};
  PGresult *r;
  int rc;
  BS_UNUSED(a);
  if (!data->n) return BS_OK;
  r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_COPY_IN) {
    rc = bs__pg_fail(c, r, "flush: COPY", err);
    PQclear(r);
    return rc;
  }
  PQclear(r);
  if (PQputCopyData(c, (const char *)header, 19) != 1 ||
      PQputCopyData(c, (const char *)data->p, (int)data->n) != 1 ||
      PQputCopyData(c, (const char *)trailer, 2) != 1 || PQputCopyEnd(c, NULL) != 1)
    return bs__pg_fail(c, NULL, "flush: COPY", err);
  r = PQgetResult(c);
  rc = PQresultStatus(r) == PGRES_COMMAND_OK ? BS_OK : bs__pg_fail(c, r, "flush: COPY", err);
  PQclear(r);
  while ((r = PQgetResult(c))) PQclear(r);
  return rc;
}
