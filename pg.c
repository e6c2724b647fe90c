/*
 * pg.c: the top of the PostgreSQL backend: the schema and its migrations, streams, storage
 * handles, waiting for a checkpoint, the lifecycle slots, and the method tables and the
 * constructor, whose slots are the functions of the files below (pg_read.c, pg_write.c,
 * pg_wcp.c, pg_save.c, pg_compact.c, pg_verify.c, pg_backup.c), all of them on pg_codec.c (how
 * C values are stored in the rows) and pg_conn.c (statements, the pool); no
 * file below uses this one (make layercheck).
 * A bs_db is a connection string and a pool of connections: any call takes an idle connection
 * (or opens one), runs its statements and gives it back, so reader threads never share one.
 */
#include "pg_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- Schema ---------------------------------------------------------------------------------- */

/* Migration i (1-based) takes the schema from version i - 1 to i. Appended only: a released
 * step never changes, so every database reaches the same schema. None creates bs_meta again:
 * its OID is part of the recorded history (HISTORY_SQL). */
static const char *const migrations[BS_PG_SCHEMA_VERSION] = {
    /* 1: streams, buckets, ops, parameter entries, change records */
    "CREATE TABLE bs_streams ("
    " id integer PRIMARY KEY, name bytea NOT NULL, state smallint NOT NULL,"
    " hash smallint NOT NULL, created_ms bigint NOT NULL,"
    " snapshot_done boolean NOT NULL DEFAULT false, op_head bigint NOT NULL DEFAULT 0,"
    " checkpoint bigint NOT NULL DEFAULT 0, last_checkpoint_op bigint NOT NULL DEFAULT 0,"
    " checkpoint_lsn bytea, resume_lsn bytea, no_checkpoint_before bytea,"
    " param_horizon bigint NOT NULL DEFAULT 0, changes_fence bigint NOT NULL DEFAULT 0,"
    " last_error bytea NOT NULL DEFAULT '');"
    "CREATE TABLE bs_buckets ("
    " stream integer NOT NULL REFERENCES bs_streams (id), name bytea NOT NULL,"
    " id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,"
    " checksum bigint NOT NULL DEFAULT 0, count bigint NOT NULL DEFAULT 0,"
    " bytes bigint NOT NULL DEFAULT 0, last_op bigint NOT NULL DEFAULT 0,"
    " generation bigint NOT NULL DEFAULT 0, clear_start bigint NOT NULL DEFAULT 0,"
    " clear_op bigint NOT NULL DEFAULT 0, compacted_count bigint NOT NULL DEFAULT 0,"
    " compacted_op bigint NOT NULL DEFAULT 0, PRIMARY KEY (stream, name));"
    "CREATE TABLE bs_ops ("
    " bucket bigint NOT NULL, op_id bigint NOT NULL, type smallint NOT NULL,"
    " checksum bigint NOT NULL, target_op bigint NOT NULL DEFAULT 0,"
    " object_type bytea, object_id bytea, subkey bytea, data bytea,"
    " PRIMARY KEY (bucket, op_id) INCLUDE (type, checksum));"
    "CREATE TABLE bs_params ("
    " stream integer NOT NULL, lookup bytea NOT NULL, op_id bigint NOT NULL,"
    " table_id integer NOT NULL, replica_id bytea NOT NULL, rows bytea[] NOT NULL,"
    " PRIMARY KEY (stream, lookup, op_id));"
    "CREATE TABLE bs_changes ("
    " stream integer NOT NULL, op_id bigint NOT NULL, seq bigint NOT NULL,"
    " first_op bigint NOT NULL, flags smallint NOT NULL DEFAULT 0,"
    " buckets bytea[] NOT NULL DEFAULT '{}', lookups bytea[] NOT NULL DEFAULT '{}',"
    " users bytea[] NOT NULL DEFAULT '{}', PRIMARY KEY (stream, op_id, seq));",
    /* 2: write checkpoints */
    "CREATE TABLE bs_wcp_managed ("
    " user_id bytea PRIMARY KEY, id bigint NOT NULL, head_conns bytea[] NOT NULL,"
    " head_lsns bytea[] NOT NULL, requested_at bigint, processed boolean NOT NULL DEFAULT false,"
    " processed_lsn bytea, gone boolean NOT NULL DEFAULT false);"
    "CREATE INDEX bs_wcp_pending ON bs_wcp_managed (user_id) WHERE NOT processed AND NOT gone;"
    "CREATE TABLE bs_wcp_custom ("
    " stream integer NOT NULL, event bytea NOT NULL, user_id bytea NOT NULL,"
    " value bigint NOT NULL, requested_at bigint, PRIMARY KEY (stream, event, user_id));",
    /* 3: source tables and records (the writer) */
    "ALTER TABLE bs_streams ADD next_table_id integer NOT NULL DEFAULT 1;"
    "CREATE TABLE bs_tables ("
    " stream integer NOT NULL, name bytea NOT NULL, id integer NOT NULL,"
    " PRIMARY KEY (stream, name));"
    "CREATE TABLE bs_source ("
    " stream integer NOT NULL, table_id integer NOT NULL, replica_id bytea NOT NULL,"
    " soft boolean NOT NULL, mark bigint NOT NULL, members bytea NOT NULL,"
    " has_data boolean NOT NULL, data bytea, PRIMARY KEY (stream, table_id, replica_id));"
    "CREATE INDEX bs_source_soft ON bs_source (stream, mark) WHERE soft;",
    /* 4: compaction (pg_compact.c): the writer's log of superseded ops (incremental compaction),
     * checkpoint times (its min_age_ms horizon), the parameter-compaction cursor */
    "CREATE TABLE bs_superseded ("
    " stream integer NOT NULL, bucket bigint NOT NULL, old_op bigint NOT NULL,"
    " new_op bigint NOT NULL, PRIMARY KEY (stream, bucket, old_op));"
    "ALTER TABLE bs_changes ADD time_ms bigint NOT NULL DEFAULT 0;"
    "ALTER TABLE bs_streams ADD param_cursor bigint NOT NULL DEFAULT 0;",
    /* 5: fewer bytes per op (sizes measured after bsbench --pg's ingest): an op's
     * checksum as integer (the 32-bit value stored signed: its bigint and the alignment padding
     * before it were 8 of a row's bytes) and a primary key without INCLUDE (type, checksum) (40
     * of its 50 bytes per op; the checksums read only the ops above C, from the heap); the
     * source records' members in varints (47 -> 22 bytes for a row in one bucket: u32 and u64
     * fields held small numbers); bs_buckets.max_op_bytes, which sizes bucket_data's pages
     * (pg_read.c). Each table is rewritten once (ALTER ... USING); the old members are decoded
     * here only, by the functions this step drops again. */
    "ALTER TABLE bs_ops DROP CONSTRAINT bs_ops_pkey, ALTER checksum TYPE integer USING"
    " (checksum - CASE WHEN checksum >= 2147483648 THEN 4294967296 ELSE 0 END)::integer,"
    " ADD PRIMARY KEY (bucket, op_id);"
    "ALTER TABLE bs_buckets ADD max_op_bytes bigint NOT NULL DEFAULT 0;"
    "UPDATE bs_buckets b SET max_op_bytes = m.n FROM (SELECT bucket, max("
    " coalesce(octet_length(object_type), 0) + coalesce(octet_length(object_id), 0)"
    " + coalesce(octet_length(subkey), 0) + coalesce(octet_length(data), 0)) AS n"
    " FROM bs_ops GROUP BY bucket) m WHERE m.bucket = b.id;"
    "CREATE FUNCTION pg_temp.bs_varint(x bigint) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$"
    " DECLARE r bytea := ''::bytea; BEGIN"
    "  WHILE x >= 128 LOOP"
    "   r := r || set_byte('\\x00'::bytea, 0, ((x & 127) | 128)::integer); x := x >> 7;"
    "  END LOOP;"
    "  RETURN r || set_byte('\\x00'::bytea, 0, x::integer); END $$;"
    "CREATE FUNCTION pg_temp.bs_members5(m bytea) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$"
    " DECLARE p integer := 5; n integer; l integer; r bytea; BEGIN"
    "  n := ('x' || encode(substring(m FROM 1 FOR 4), 'hex'))::bit(32)::integer;"
    "  r := pg_temp.bs_varint(n);"
    "  FOR i IN 1..n LOOP"
    "   FOR k IN 1..2 LOOP" /* bucket id, op id */
    "    r := r || pg_temp.bs_varint(('x' || encode(substring(m FROM p FOR 8), 'hex'))::bit(64)"
    "     ::bigint); p := p + 8;"
    "   END LOOP;"
    "   FOR k IN 1..2 LOOP" /* object_type, object_id */
    "    l := ('x' || encode(substring(m FROM p FOR 4), 'hex'))::bit(32)::integer;"
    "    r := r || pg_temp.bs_varint(l) || substring(m FROM p + 4 FOR l); p := p + 4 + l;"
    "   END LOOP;"
    "  END LOOP;"
    "  n := ('x' || encode(substring(m FROM p FOR 4), 'hex'))::bit(32)::integer; p := p + 4;"
    "  r := r || pg_temp.bs_varint(n);"
    "  FOR i IN 1..n LOOP" /* lookup keys */
    "   l := ('x' || encode(substring(m FROM p FOR 4), 'hex'))::bit(32)::integer;"
    "   r := r || pg_temp.bs_varint(l) || substring(m FROM p + 4 FOR l); p := p + 4 + l;"
    "  END LOOP;"
    "  RETURN r; END $$;"
    "ALTER TABLE bs_source ALTER members TYPE bytea USING pg_temp.bs_members5(members);"
    "DROP FUNCTION pg_temp.bs_members5(bytea), pg_temp.bs_varint(bigint);",
    /* 6: the superseded log in a row per bucket and flush (a row per entry was 39
     * bytes per op after bsbench --pg's ingest, a tuple and an index entry for 16 bytes): at
     * most BS_PG_SUP_ROW (4096) entries, ascending by old op, in varint pairs (pg_codec.c's
     * bs__pg_sups_put), keyed by the lowest new op; stored uncompressed. The old rows become
     * rows of 4096 entries of a bucket in old-op order, encoded by this step's functions. */
    "CREATE FUNCTION pg_temp.bs_varint(x bigint) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$"
    " DECLARE r bytea := ''::bytea; BEGIN"
    "  WHILE x >= 128 LOOP"
    "   r := r || set_byte('\\x00'::bytea, 0, ((x & 127) | 128)::integer); x := x >> 7;"
    "  END LOOP;"
    "  RETURN r || set_byte('\\x00'::bytea, 0, x::integer); END $$;"
    "CREATE FUNCTION pg_temp.bs_pairs6(o bigint[], n bigint[], f bigint) RETURNS bytea"
    " LANGUAGE plpgsql IMMUTABLE AS $$"
    " DECLARE r bytea := ''::bytea; p bigint := 0; BEGIN"
    "  FOR i IN 1..cardinality(o) LOOP"
    "   r := r || pg_temp.bs_varint(o[i] - p) || pg_temp.bs_varint(n[i] - f); p := o[i];"
    "  END LOOP;"
    "  RETURN r; END $$;"
    "CREATE TABLE bs_superseded6 ("
    " stream integer NOT NULL, bucket bigint NOT NULL, first_new bigint NOT NULL,"
    " pairs bytea NOT NULL);"
    "INSERT INTO bs_superseded6 SELECT stream, bucket, min(new_op),"
    " pg_temp.bs_pairs6(array_agg(old_op ORDER BY old_op), array_agg(new_op ORDER BY old_op),"
    "  min(new_op))"
    " FROM (SELECT stream, bucket, old_op, new_op, (row_number() OVER"
    "  (PARTITION BY stream, bucket ORDER BY old_op) - 1) / 4096 AS g FROM bs_superseded) e"
    " GROUP BY stream, bucket, g;"
    "DROP TABLE bs_superseded;"
    "ALTER TABLE bs_superseded6 RENAME TO bs_superseded;"
    "ALTER TABLE bs_superseded ADD PRIMARY KEY (stream, bucket, first_new),"
    " ALTER pairs SET STORAGE EXTERNAL;"
    "DROP FUNCTION pg_temp.bs_pairs6(bigint[], bigint[], bigint), pg_temp.bs_varint(bigint);",
    /* 7: smaller source records (88 bytes per op after bsbench --pg's ingest, a row of
     * 80 bytes per record): soft and has_data go (a soft-deleted record is one with a mark, NULL
     * otherwise, which the tuple's null bitmap holds for free; has_data was data IS NOT NULL),
     * and a membership's object_id equal to the record's replica id takes one byte (0; else its
     * length + 1 and its bytes: pg_codec.c's bs__pg_srec_encode). The table is built anew (columns in
     * alignment order, the mark first); the members are converted by this step's functions. */
    "CREATE FUNCTION pg_temp.bs_varint(x bigint) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$"
    " DECLARE r bytea := ''::bytea; BEGIN"
    "  WHILE x >= 128 LOOP"
    "   r := r || set_byte('\\x00'::bytea, 0, ((x & 127) | 128)::integer); x := x >> 7;"
    "  END LOOP;"
    "  RETURN r || set_byte('\\x00'::bytea, 0, x::integer); END $$;"
    "CREATE FUNCTION pg_temp.bs_vget(m bytea, p integer, OUT v bigint, OUT q integer)"
    " LANGUAGE plpgsql IMMUTABLE AS $$" /* the varint at byte p (from 0), the byte after it */
    " DECLARE b integer; s integer := 0; BEGIN"
    "  v := 0; q := p;"
    "  LOOP"
    "   b := get_byte(m, q); q := q + 1; v := v | ((b & 127)::bigint << s); s := s + 7;"
    "   EXIT WHEN b < 128;"
    "  END LOOP; END $$;"
    "CREATE FUNCTION pg_temp.bs_members7(m bytea, rid bytea) RETURNS bytea LANGUAGE plpgsql"
    " IMMUTABLE AS $$"
    " DECLARE p integer; s integer; n bigint; l bigint; oi bytea; r bytea; BEGIN"
    "  SELECT g.v, g.q INTO n, p FROM pg_temp.bs_vget(m, 0) g;"
    "  r := substring(m FROM 1 FOR p);"
    "  FOR i IN 1..n LOOP"
    "   s := p;" /* bucket id, op id, object_type: as they are */
    "   SELECT g.q INTO p FROM pg_temp.bs_vget(m, p) g;"
    "   SELECT g.q INTO p FROM pg_temp.bs_vget(m, p) g;"
    "   SELECT g.v, g.q INTO l, p FROM pg_temp.bs_vget(m, p) g; p := p + l::integer;"
    "   r := r || substring(m FROM s + 1 FOR p - s);"
    "   SELECT g.v, g.q INTO l, p FROM pg_temp.bs_vget(m, p) g;"
    "   oi := substring(m FROM p + 1 FOR l::integer); p := p + l::integer;"
    "   IF oi = rid THEN r := r || '\\x00'::bytea;"
    "   ELSE r := r || pg_temp.bs_varint(l + 1) || oi; END IF;"
    "  END LOOP;"
    "  RETURN r || substring(m FROM p + 1); END $$;" /* the lookup keys */
    "CREATE TABLE bs_source7 ("
    " stream integer NOT NULL, table_id integer NOT NULL, mark bigint, replica_id bytea NOT NULL,"
    " members bytea NOT NULL, data bytea);"
    "INSERT INTO bs_source7 SELECT stream, table_id, CASE WHEN soft THEN mark END, replica_id,"
    " pg_temp.bs_members7(members, replica_id), CASE WHEN has_data THEN coalesce(data, '') END"
    " FROM bs_source;"
    "DROP TABLE bs_source;"
    "ALTER TABLE bs_source7 RENAME TO bs_source;"
    "ALTER TABLE bs_source ADD PRIMARY KEY (stream, table_id, replica_id);"
    "CREATE INDEX bs_source_soft ON bs_source (stream, mark) WHERE mark IS NOT NULL;"
    "DROP FUNCTION pg_temp.bs_members7(bytea, bytea), pg_temp.bs_vget(bytea, integer),"
    " pg_temp.bs_varint(bigint);",
};

/* name (size bytes, at most 63) quoted as an identifier, its quotes doubled */
static void quote_ident(char *out, bs_val name) {
  const char *p = name.data;
  *out++ = '"';
  for (size_t i = 0; i < name.size; i++) {
    if (p[i] == '"') *out++ = '"';
    *out++ = p[i];
  }
  *out++ = '"';
  *out = 0;
}

int bs__pg_schema_resolve(PGconn *c, bs__pg_schema *out, bs_error *err) {
  PGresult *r;
  bs_val name;
  int rc = bs__pg_exec(
      c,
      "SELECT n.oid, n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=)"
      " coalesce((SELECT t.relnamespace FROM pg_catalog.pg_class t"
      "   WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('bs_meta')),"
      "  (SELECT s.oid FROM pg_catalog.pg_namespace s"
      "   WHERE s.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()))",
      NULL, &r, "resolving the schema", err);
  if (rc) return rc;
  if (PQntuples(r) != 1) {
    PQclear(r);
    return bs__fail(err, BS_ENOTFOUND,
                    "no schema of the connection's search_path exists (name one: "
                    "?options=-csearch_path%%3Dname)");
  }
  memset(out, 0, sizeof *out);
  out->oid = (uint32_t)bs__pg_i32(r, 0, 0);
  name = bs__pg_bytes(r, 0, 1);
  if (name.size > 63 || memchr(name.data, 0, name.size)) { /* a name is at most 63 bytes */
    PQclear(r);
    return bs__fail(err, BS_ECORRUPT, "the schema's name does not decode");
  }
  _Static_assert(sizeof out->quoted >= 2 * 63 + 3, "a quoted name of 63 bytes");
  quote_ident(out->quoted, name);
  PQclear(r);
  snprintf(out->channel, sizeof out->channel, "bs_cp_%u", (unsigned)out->oid);
  snprintf(out->set_path, sizeof out->set_path, "SET search_path = pg_catalog, %s, pg_temp",
           out->quoted);
  return BS_OK;
}

/* The schema's version: 0 when bs_meta does not exist (a database bucketstore never used). */
static int schema_version(PGconn *c, int64_t *out, bs_error *err) {
  PGresult *r;
  int rc = bs__pg_exec(c, "SELECT to_regclass('bs_meta') IS NOT NULL", NULL, &r,
                       "reading the schema version", err);
  if (rc) return rc;
  *out = 0;
  if (bs__pg_bool(r, 0, 0)) {
    PQclear(r);
    rc = bs__pg_exec(c, "SELECT value FROM bs_meta WHERE key = 'schema_version'", NULL, &r,
                     "reading the schema version", err);
    if (rc) return rc;
    if (PQntuples(r) == 1) *out = bs__pg_i64(r, 0, 0);
  }
  PQclear(r);
  return BS_OK;
}

/* Brings schema s to version `to` in one transaction. Two processes opening a new database at
 * once serialise on the schema's migration lock. The schema comes first in the transaction's
 * search_path, so the steps create their tables there (its objects are its owner's). */
static int migrate(PGconn *c, const bs__pg_schema *s, int64_t to, bs_error *err) {
  bs__pg_args lk = {0};
  char path[sizeof s->set_path];
  int64_t v;
  int rc;
  snprintf(path, sizeof path, "SET LOCAL search_path = %s, pg_catalog, pg_temp", s->quoted);
  bs__pg_arg_lock(&lk, s, 0, BS_PG_LOCK_SCHEMA);
  if ((rc = bs__pg_begin(c, 0, err))) return rc;
  rc = bs__pg_run(c, path, NULL, "migrating the schema", err);
  /* a schema at `to` already needs no lock: an open then never waits for the write
   * transactions, which hold the lock shared (bs__pg_begin_write) */
  if (!rc && !(rc = schema_version(c, &v, err)) && v < to &&
      !(rc = bs__pg_run(c, "SELECT pg_advisory_xact_lock($1, $2)", &lk, "locking the schema", err)))
    rc = schema_version(c, &v, err);
  if (!rc && v > BS_PG_SCHEMA_VERSION) rc = bs__pg_schema_current(v, err);
  if (!rc && v == 0)
    rc = bs__pg_run(c,
                    "CREATE TABLE IF NOT EXISTS bs_meta (key text PRIMARY KEY,"
                    " value bigint NOT NULL);"
                    "INSERT INTO bs_meta VALUES ('schema_version', 0) ON CONFLICT DO NOTHING",
                    NULL, "creating the schema", err);
  /* a step waits for its tables' locks at most lock_timeout (10 s unless the URL set one) */
  if (!rc && v < to)
    rc = bs__pg_run(c,
                    "SELECT set_config('lock_timeout', '10s', true)"
                    " WHERE current_setting('lock_timeout') = '0'",
                    NULL, "migrating the schema", err);
  for (; !rc && v < to && v < BS_PG_SCHEMA_VERSION; v++) {
    bs__pg_args a = {0};
    bs__pg_arg_i64(&a, v + 1);
    rc = bs__pg_run(c, migrations[v], NULL, "migrating the schema", err);
    if (!rc)
      rc = bs__pg_run(c, "UPDATE bs_meta SET value = $1 WHERE key = 'schema_version'", &a,
                      "migrating the schema", err);
  }
  if (!rc) return bs__pg_commit(c, err);
  bs__pg_rollback(c);
  return rc;
}

int bs__pg_migrate(PGconn *c, int64_t to, bs_error *err) {
  bs__pg_schema s;
  int rc = bs__pg_schema_resolve(c, &s, err);
  return rc ? rc : migrate(c, &s, to, err);
}

/* A hot standby refuses every write (SQLSTATE 25006) but grants advisory locks of its own, so a
 * writer there would not exclude the primary's: a read-write open is refused at once. */
static int refuse_standby(PGconn *c, bs_error *err) {
  PGresult *r;
  int rc = bs__pg_exec(c, "SELECT pg_is_in_recovery()", NULL, &r, "open", err);
  if (rc) return rc;
  if (bs__pg_bool(r, 0, 0))
    rc = bs__fail(err, BS_ESTATE,
                  "the server is a hot standby (in recovery): open it with BS_OPEN_RDONLY");
  PQclear(r);
  return rc;
}

/* A read-write open records the data's history in bs_meta when none is (a new database, or
 * one written before this check; what is recorded stays). BS_OPEN_ACK_REWIND records it
 * whatever is there and raises history_epoch, which the running writers compare (pg_save.c
 * batch_open): the operator's word that clients re-sync after a rewind. */
static int history_record(bs__pg_db *db, PGconn *c, bs_error *err) {
  int ack = (db->base.flags & BS_OPEN_ACK_REWIND) != 0, rc;
  PGresult *r;
  if (ack && (db->base.flags & BS_OPEN_RDONLY))
    return bs__fail(err, BS_EINVAL, "opts->flags: BS_OPEN_ACK_REWIND needs a read-write open");
  if (db->base.flags & BS_OPEN_RDONLY) return BS_OK;
  /* looked up first: a role that may not write bs_meta opens a recorded database */
  if (!ack) {
    if ((rc = bs__pg_exec(c, "SELECT 1 FROM bs_meta WHERE key = 'history_table'", NULL, &r,
                          "open: reading the server's history", err)))
      return rc;
    rc = PQntuples(r);
    PQclear(r);
    if (rc) return BS_OK;
  }
#define HISTORY_ROWS                                                                               \
  "INSERT INTO bs_meta SELECT x.k, x.v FROM (SELECT " HISTORY_SQL ") AS h (s, t, o) CROSS JOIN"    \
  " LATERAL (VALUES ('history_system', h.s), ('history_timeline', h.t), ('history_table', h.o),"   \
  " ('history_epoch', 0::bigint)) AS x (k, v) ON CONFLICT (key) DO "
  return bs__pg_run(c,
                    ack ? HISTORY_ROWS "UPDATE SET value = CASE WHEN bs_meta.key = 'history_epoch'"
                                       " THEN bs_meta.value + 1 ELSE excluded.value END"
                        : HISTORY_ROWS "NOTHING",
                    NULL, "open: recording the server's history", err);
#undef HISTORY_ROWS
}

/* A read-only open, and one with BS_OPEN_NOMIGRATE, migrates nothing: it needs the schema at
 * this build's version. */
static int check_schema(bs__pg_db *db, PGconn *c, bs_error *err) {
  const char *how =
      db->base.flags & BS_OPEN_RDONLY ? "open it once read-write" : "run bucketstore migrate URL";
  int64_t v;
  int rc;
  if (!(db->base.flags & BS_OPEN_RDONLY) && (rc = refuse_standby(c, err))) return rc;
  if (!(db->base.flags & (BS_OPEN_RDONLY | BS_OPEN_NOMIGRATE)))
    return (rc = migrate(c, &db->schema, BS_PG_SCHEMA_VERSION, err)) ? rc
                                                                     : history_record(db, c, err);
  if ((rc = schema_version(c, &v, err))) return rc;
  if (v > BS_PG_SCHEMA_VERSION) return bs__pg_schema_current(v, err);
  if (v == 0)
    return bs__fail(err, BS_ENOTFOUND, "no bucketstore schema in this database (%s to create it)",
                    how);
  if (v < BS_PG_SCHEMA_VERSION)
    return bs__fail(err, BS_ECORRUPT,
                    "the PostgreSQL schema has version %lld, older than this build's %d: %s to "
                    "migrate it",
                    (long long)v, BS_PG_SCHEMA_VERSION, how);
  return history_record(db, c, err);
}

int bs__pg_check_server(int version, bs_error *err) {
  if (version >= BS_PG_MIN_SERVER) return BS_OK;
  return bs__fail(err, BS_EUNSUPPORTED,
                  "the server is PostgreSQL %d (server_version_num %d): this backend needs %d or "
                  "newer",
                  version / 10000, version, BS_PG_MIN_SERVER / 10000);
}

/* ---- Streams --------------------------------------------------------------------------------- */

static bs__pg_db *pg_of(bs_db *db) {
  return (bs__pg_db *)db;
}

static struct {
  void (*fn)(const char *point, PGconn *c, void *payload);
  void *payload;
} open_hook;

void bs__pg_set_open_hook(void (*fn)(const char *point, PGconn *c, void *payload), void *payload) {
  open_hook.fn = fn;
  open_hook.payload = fn ? payload : NULL;
}

void bs__pg_set_hook(bs_db *db, void (*fn)(const char *point, PGconn *c, void *payload),
                     void *payload) {
  pg_of(db)->hook = fn;
  pg_of(db)->hook_payload = fn ? payload : NULL;
}

static int pg_stream_create(uint32_t *id_out, bs_db *base, bs_val name, const bs_stream_options *o,
                            bs_error *err) {
  bs__pg_db *db = pg_of(base);
  bs__pg_args a = {0}, lk = {0}, m = {0};
  bs__stream_step step;
  char others[BS_PG_STATES_TEXT];
  PGconn *c;
  PGresult *r = NULL;
  int rc;
  if ((rc = bs__stream_transition(&step, 0, 0, BS__STREAM_CREATE, err))) return rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_bytes(&a, name);
  bs__pg_arg_i32(&a, (int32_t)o->hash);
  bs__pg_arg_i64(&a, bs__now_ms());
  bs__pg_arg_i32(&a, (int32_t)step.to);
  bs__pg_arg_states(&m, step.others, others);
  /* The schema's stream-creation lock makes id = max + 1 and "only the newest deploy stays
   * PROCESSING" atomic against another process creating a stream (contract.md 4.4), and waits
   * for nothing else: a table lock would also wait for every writer's open flush, and queue
   * every other writer behind itself. The UPDATE waits only for a flush of the PROCESSING
   * stream, whose row it changes. */
  bs__pg_arg_lock(&lk, &db->schema, 2, BS_PG_LOCK_SCHEMA);
  rc = bs__pg_begin_write(db, c, NULL, err);
  if (!rc) rc = bs__pg_run(c, "SELECT pg_advisory_xact_lock($1, $2)", &lk, "stream_create", err);
  if (!rc)
    rc = bs__pg_run(c,
                    "UPDATE bs_streams SET state = ($1::text::int2[])[state]"
                    " WHERE state <> ($1::text::int2[])[state]",
                    &m, "stream_create", err);
  if (!rc)
    rc = bs__pg_exec(c,
                     "INSERT INTO bs_streams (id, name, state, hash, created_ms)"
                     " SELECT coalesce(max(id), 0) + 1, $1, $4, $2, $3 FROM bs_streams"
                     " RETURNING id",
                     &a, &r, "stream_create", err);
  if (!rc) rc = bs__pg_commit(c, err);
  if (rc)
    bs__pg_rollback(c);
  else if (id_out)
    *id_out = (uint32_t)bs__pg_i32(r, 0, 0);
  PQclear(r);
  bs__pg_conn_put(db, c);
  return rc;
}

static int pg_stream_list(bs_db *base, int (*fn)(const bs_stream_info *, void *), void *payload,
                          bs_error *err) {
  bs__pg_db *db = pg_of(base);
  PGconn *c;
  PGresult *r;
  int rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  rc = bs__pg_exec(c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams ORDER BY id", NULL, &r,
                   "stream_list", err);
  bs__pg_conn_put(db, c); /* before fn, which may call back into the library */
  if (rc) return rc;
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    bs__pg_stream s = bs__pg_stream_row(r, i);
    bs_stream_info info = {
        .id = s.id, .name = s.name, .state = (bs_stream_state)s.row.state, .hash = s.hash};
    rc = fn(&info, payload);
  }
  PQclear(r);
  return rc;
}

static const bs_storage_vtable pg_vtable;

static int pg_storage_open(bs_storage **out, bs_db *base, uint32_t id, bs_error *err) {
  bs__pg_db *db = pg_of(base);
  bs__pg_args a = {0};
  bs__pg_storage *st;
  PGconn *c;
  PGresult *r;
  int rc, found;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)id); /* id 0 was resolved by the front (stream_list) */
  rc = bs__pg_exec(c, "SELECT id FROM bs_streams WHERE id = $1", &a, &r, "storage_open", err);
  bs__pg_conn_put(db, c);
  if (rc) return rc;
  found = PQntuples(r) == 1;
  PQclear(r);
  if (!found) return bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)id);
  if (!(st = bs__calloc(&base->alloc, 1, sizeof *st)))
    return bs__fail(err, BS_ENOMEM, "storage: out of memory");
  st->base.vt = &pg_vtable;
  st->base.db = base;
  st->base.stream_id = id;
  st->db = db;
  st->mode = BS_WCP_MANAGED;
  st->seen_epoch = -1;
  if (pthread_mutex_init(&st->mu, NULL)) {
    bs__free(&base->alloc, st);
    return bs__fail(err, BS_ENOMEM, "storage: cannot initialise a mutex");
  }
  *out = &st->base;
  return BS_OK;
}

/* ---- Stream state ---------------------------------------------------------------------------- */

static bs__pg_db *spg(bs_storage *st) {
  return ((bs__pg_storage *)st)->db;
}

static void copy_lsn(unsigned char *dst, size_t *size, int *has, bs_val v) {
  *has = v.data != NULL;
  *size = v.size < BS_MAX_LSN ? v.size : BS_MAX_LSN;
  if (*size) memcpy(dst, v.data, *size);
}

/* One statement on a pooled connection, outside any transaction. */
static int query(bs_storage *st, const char *sql, const bs__pg_args *a, PGresult **r,
                 const char *what, bs_error *err) {
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = bs__pg_exec(c, sql, a, r, what, err);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

static int run(bs_storage *st, const char *sql, const bs__pg_args *a, const char *what,
               bs_error *err) {
  PGresult *r;
  int rc = query(st, sql, a, &r, what, err);
  PQclear(r);
  return rc;
}

static int stream_gone(const bs_storage *st, bs_error *err) {
  return bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)st->stream_id);
}
/* The stream's row by one prepared statement: get_status (the front answers bs_get_checkpoint,
 * which clients poll, from it) and the checkpoint waits. *out borrows from *r, which the caller
 * clears; on a failure *r is NULL. */
static const bs__pg_stmt stream_stmt = {BS_PG_STMT_STREAM, "SELECT " BS_PG_STREAM_COLS
                                                           " FROM bs_streams WHERE id = $1"};

static int stream_read(PGconn *c, bs_storage *st, PGresult **r, bs__pg_stream *out,
                       const char *what, bs_error *err) {
  bs__pg_args a = {0};
  int rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  if ((rc = bs__pg_execp(c, &stream_stmt, &a, r, what, err))) return rc;
  if (PQntuples(*r) != 1) {
    PQclear(*r);
    *r = NULL;
    return stream_gone(st, err);
  }
  *out = bs__pg_stream_row(*r, 0);
  return BS_OK;
}

static int read_checkpoint(PGconn *c, bs_storage *st, bs_checkpoint *out, bs_error *err) {
  PGresult *r;
  bs__pg_stream s;
  int rc = stream_read(c, st, &r, &s, "get_checkpoint", err);
  if (rc) return rc;
  out->op_id = s.row.checkpoint;
  copy_lsn(out->lsn, &out->lsn_size, &out->has_lsn, s.row.checkpoint_lsn);
  PQclear(r);
  return BS_OK;
}

static int pg_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = read_checkpoint(c, st, out, err);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

/* ---- Waiting for a checkpoint (BS_PG_CHANNEL) ------------------------------------------------ */

/* Frees the notifications c has received; 1 when there was one. */
static int drain_notifies(PGconn *c) {
  PGnotify *n;
  int any = 0;
  while ((n = PQnotifies(c)) != NULL) {
    any = 1;
    PQfreemem(n);
  }
  return any;
}

/* The LISTEN connection (l->mu held): opened when there is none. It is not a connection of the
 * pool: waiters never hold one of those while they wait. */
static int listener_open(bs__pg_db *db, bs_error *err) {
  struct bs__pg_listener *l = &db->listen;
  char sql[64];
  PGconn *c;
  int rc;
  if (l->c) return BS_OK;
  if ((rc = bs__pg_conn_open(db, &c, err))) return rc;
  snprintf(sql, sizeof sql, "LISTEN %s", db->schema.channel);
  if ((rc = bs__pg_run(c, sql, NULL, "wait_checkpoint: listen", err))) {
    PQfinish(c);
    return rc;
  }
  l->c = c;
  return BS_OK;
}

/* Reads the LISTEN connection's socket until something arrives or ms pass (l->mu held, released
 * meanwhile: the others wait on l->cv); a notification bumps gen, a loss epoch. */
static void listener_poll(bs__pg_db *db, uint64_t ms) {
  struct bs__pg_listener *l = &db->listen;
  PGconn *c = l->c;
  struct pollfd p;
  int ok;
  l->polling = 1;
  pthread_mutex_unlock(&l->mu);
  bs__pg_hook(db, "wait", c);
  p.fd = PQsocket(c);
  p.events = POLLIN;
  p.revents = 0;
  ok = p.fd >= 0 && (poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms) >= 0 || errno == EINTR) &&
       PQconsumeInput(c) && PQstatus(c) == CONNECTION_OK;
  pthread_mutex_lock(&l->mu);
  l->polling = 0;
  if (!ok) {
    bs__pg_fail(c, NULL, "waiting for a checkpoint", &l->lost);
    PQfinish(c);
    l->c = NULL;
    l->epoch++;
  } else if (drain_notifies(c)) {
    l->gen++;
  }
  pthread_cond_broadcast(&l->cv);
}

/* Waits on l->cv (l->mu held) until the poller or a notification wakes it, or ms pass. */
static void listener_wait(bs__pg_db *db, uint64_t ms) {
  struct bs__pg_listener *l = &db->listen;
  struct timespec ts;
  bs__pg_hook(db, "wait", l->c);
  ts = bs__monotonic_after(ms);
  pthread_cond_timedwait(&l->cv, &l->mu, &ts);
}

/* A hot standby cannot LISTEN (PostgreSQL: "cannot execute LISTEN during recovery"): there the
 * wait reads the checkpoint every BS_WAIT_POLL_MS on c (the "wait" point before each sleep). */
static int wait_standby(bs_storage *st, PGconn *c, const bs_checkpoint *known, uint64_t deadline,
                        bs_checkpoint *out, bs_error *err) {
  int rc;
  for (;;) {
    uint64_t now;
    if ((rc = read_checkpoint(c, st, out, err)) || bs__checkpoint_differs(out, known) ||
        (now = bs__monotonic_ms()) >= deadline)
      return rc;
    bs__pg_hook(spg(st), "wait", c);
    poll(NULL, 0, (int)(deadline - now < BS_WAIT_POLL_MS ? deadline - now : BS_WAIT_POLL_MS));
  }
}

/* On the handle's LISTEN connection (pg_internal.h), opened first: a commit before a read is in
 * it, one after bumps gen (the waiter then reads again). The reads run on connections of the
 * pool, given back before the wait. A waiter whose LISTEN connection was lost (epoch) fails
 * with the loss's BS_EIO. */
static int pg_wait_checkpoint(bs_checkpoint *out, bs_storage *st, const bs_checkpoint *known,
                              uint64_t timeout_ms, bs_error *err) {
  uint64_t deadline = bs__monotonic_ms() + timeout_ms, gen, epoch, now;
  bs__pg_db *db = spg(st);
  struct bs__pg_listener *l = &db->listen;
  PGconn *c;
  PGresult *r;
  int rc, standby = 0;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  if (!(rc = bs__pg_exec(c, "SELECT pg_is_in_recovery()", NULL, &r, "wait_checkpoint", err))) {
    standby = bs__pg_bool(r, 0, 0);
    PQclear(r);
    if (standby) rc = wait_standby(st, c, known, deadline, out, err);
  }
  bs__pg_conn_put(db, c);
  if (rc || standby) return rc;
  pthread_mutex_lock(&l->mu);
  rc = listener_open(db, err);
  epoch = l->epoch;
  while (!rc) {
    gen = l->gen;
    pthread_mutex_unlock(&l->mu);
    rc = pg_get_checkpoint(out, st, err);
    pthread_mutex_lock(&l->mu);
    if (rc || bs__checkpoint_differs(out, known) || (now = bs__monotonic_ms()) >= deadline) break;
    if (l->epoch != epoch) {
      if (err) *err = l->lost;
      rc = BS_EIO;
      break;
    }
    if (l->gen != gen) continue;
    if (l->polling)
      listener_wait(db, deadline - now);
    else
      listener_poll(db, deadline - now);
  }
  pthread_mutex_unlock(&l->mu);
  return rc;
}

static int pg_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  PGresult *r;
  PGconn *c;
  bs__pg_stream s;
  bs_val e;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = stream_read(c, st, &r, &s, "get_status", err);
  bs__pg_conn_put(spg(st), c);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  out->state = (bs_stream_state)s.row.state;
  out->snapshot_done = s.row.snapshot_done; /* the front: once a checkpoint exists */
  out->checkpoint = s.row.checkpoint;
  out->last_persisted_op = s.row.op_head;
  copy_lsn(out->lsn, &out->lsn_size, &out->has_lsn, s.row.checkpoint_lsn);
  copy_lsn(out->resume_lsn, &out->resume_lsn_size, &out->has_resume_lsn, s.row.resume_lsn);
  e = s.last_error;
  if (e.size > sizeof out->last_error - 1) e.size = sizeof out->last_error - 1;
  if (e.size) memcpy(out->last_error, e.data, e.size);
  PQclear(r);
  return BS_OK;
}

static int pg_report_error(bs_storage *st, const char *message, bs_error *err) {
  bs__pg_args a = {0};
  bs_val m = bs__val_str(message ? message : "");
  uint8_t map[BS__STREAM_STATES];
  char text[BS_PG_STATES_TEXT];
  if (m.size > 255) m.size = 255;
  bs__stream_map(map, BS__STREAM_ERROR);
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  bs__pg_arg_bytes(&a, m);
  bs__pg_arg_states(&a, map, text);
  return run(st,
             "UPDATE bs_streams SET last_error = $2, state = ($3::text::int2[])[state]"
             " WHERE id = $1",
             &a, "report_error", err);
}

/* The stream's row, locked: a flush holds it (pg_save.c batch_open), so the clear waits for the
 * flush and its deletes then see the flush's rows. */
static const char *const reset_read_sql =
    "SELECT " BS_PG_STREAM_COLS " FROM bs_streams WHERE id = $1 FOR UPDATE";

/* Stores the row w of stream id (every field lifecycle.c decides). */
static int reset_store(PGconn *c, uint32_t id, const bs__stream_row *w, bs_error *err) {
  bs__pg_args a = {0};
  bs__pg_arg_i32(&a, (int32_t)id);
  bs__pg_stream_args(&a, w);
  return bs__pg_run(c, "UPDATE bs_streams SET " BS_PG_STREAM_SET " WHERE id = $1", &a, "clear",
                    err);
}

/* Deletes every record of the stream but its row. */
static int reset_delete(PGconn *c, uint32_t id, bs_error *err) {
  bs__pg_args a = {0};
  bs__pg_arg_i32(&a, (int32_t)id);
  return bs__pg_run(c,
                    "WITH o AS (DELETE FROM bs_ops WHERE bucket IN (SELECT id FROM bs_buckets"
                    "  WHERE stream = $1)),"
                    " p AS (DELETE FROM bs_params WHERE stream = $1),"
                    " ch AS (DELETE FROM bs_changes WHERE stream = $1),"
                    " cw AS (DELETE FROM bs_wcp_custom WHERE stream = $1),"
                    " sr AS (DELETE FROM bs_source WHERE stream = $1),"
                    " su AS (DELETE FROM bs_superseded WHERE stream = $1),"
                    " tb AS (DELETE FROM bs_tables WHERE stream = $1)"
                    " DELETE FROM bs_buckets WHERE stream = $1",
                    &a, "clear", err);
}

/* A clear and/or terminate in one transaction: the row read, what lifecycle.c makes of it
 * stored, and for a clear every other record of the stream deleted. */
static int clear_or_terminate(bs_storage *st, int clear, int terminate, bs_error *err) {
  bs__pg_args a = {0};
  bs__stream_row w;
  PGresult *r = NULL;
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  rc = bs__pg_begin_write(spg(st), c, NULL, err);
  if (!rc) rc = bs__pg_exec(c, reset_read_sql, &a, &r, "clear", err);
  if (!rc && PQntuples(r) != 1) rc = stream_gone(st, err);
  if (!rc) {
    w = bs__pg_stream_row(r, 0).row;
    rc = bs__stream_reset(&w, st->stream_id, clear, terminate, err);
  }
  if (!rc && clear) rc = reset_delete(c, st->stream_id, err);
  if (!rc) rc = reset_store(c, st->stream_id, &w, err); /* w borrows from r */
  PQclear(r);
  if (!rc) rc = bs__pg_commit(c, err);
  if (rc) bs__pg_rollback(c);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

static int pg_clear(bs_storage *st, bs_error *err) {
  return clear_or_terminate(st, 1, 0, err);
}

static int pg_terminate(bs_storage *st, int clear, bs_error *err) {
  return clear_or_terminate(st, clear, 1, err);
}

static void pg_storage_destroy(bs_storage *st) {
  if (!st) return;
  pthread_mutex_destroy(&((bs__pg_storage *)st)->mu);
  bs__free(&spg(st)->base.alloc, st);
}

static const bs_storage_vtable pg_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = pg_storage_destroy,
    .writer_open = bs__pg_writer_open,
    .bucket_data = bs__pg_bucket_data,
    .checksums = bs__pg_checksums,
    .checksum_ranges = bs__pg_checksum_ranges,
    .checkpoint_changes = bs__pg_checkpoint_changes,
    .parameter_sets = bs__pg_parameter_sets,
    .set_write_checkpoint_mode = bs__pg_set_write_checkpoint_mode,
    .create_managed_write_checkpoints = bs__pg_create_managed_write_checkpoints,
    .last_write_checkpoint = bs__pg_last_write_checkpoint,
    .delete_checkpoint_requests_before = bs__pg_delete_checkpoint_requests_before,
    .compact = bs__pg_compact,
    .compact_initial_replication = bs__pg_compact_initial_replication,
    .get_status = pg_get_status,
    .report_error = pg_report_error,
    .clear = pg_clear,
    .terminate = pg_terminate,
    .list_buckets = bs__pg_list_buckets,
    .wait_checkpoint = pg_wait_checkpoint,
    .writer_lock = bs__pg_writer_lock,
};

/* ---- Database -------------------------------------------------------------------------------- */

static int backend_pid(PGconn *c, int *pid, bs_error *err) {
  PGresult *r;
  int rc = bs__pg_exec(c, "SELECT pg_backend_pid()", NULL, &r, "open: probing the session", err);
  if (rc) return rc;
  *pid = bs__pg_i32(r, 0, 0);
  PQclear(r);
  return BS_OK;
}

/* Behind a transaction-mode pooler (PgBouncer pool_mode = transaction, managed poolers' transaction
 * mode) a client's statements outside a transaction run on whichever server session is free: the
 * writer's advisory lock, LISTEN, the session's settings and prepared statements would reach
 * other clients' sessions. Seen at open as a server process shared by two of the handle's
 * connections (the pooler hands a second client the session the first just freed: PgBouncer's
 * default, most recently used first), or one connection's server process changing between two
 * statements ("open.probe" point between them, c that connection). The second connection is one
 * of the pool's, kept; with a pool of one, only the first test runs. A pooler in session mode,
 * or none, never shows either. */
static int refuse_pooler(bs__pg_db *db, PGconn *c, bs_error *err) {
  PGconn *c2 = NULL;
  int first, other = 0, again, rc;
  if ((rc = backend_pid(c, &first, err))) return rc;
  bs__pg_hook(db, "open.probe", c);
  if (bs__pg_conn_try(db, &c2) == BS_OK) {
    rc = backend_pid(c2, &other, err);
    bs__pg_conn_put(db, c2);
    if (rc) return rc;
  }
  if ((rc = backend_pid(c, &again, err))) return rc;
  if (first == other || first != again)
    return bs__fail(
        err, BS_EUNSUPPORTED,
        "the connection goes through a pooler in transaction mode (server process %d "
        "%s): connect directly or through a pooler in session mode (PgBouncer "
        "pool_mode = session)",
        first, first == other ? "served two connections at once" : "changed between statements");
  return BS_OK;
}

static void pg_close(bs_db *base) {
  bs__pg_db *db = pg_of(base);
  bs_allocator a = base->alloc;
  for (size_t i = 0; i < db->n_idle; i++) PQfinish(db->idle[i]);
  PQfinish(db->listen.c);
  for (size_t i = 0; i < db->n_locks; i++) { /* writers left open by the host */
    PQfinish(db->locks[i]->c);
    pthread_mutex_destroy(&db->locks[i]->mu);
    bs__free(&a, db->locks[i]);
  }
  bs__free(&a, db->idle);
  bs__free(&a, db->locks);
  bs__free(&a, db->url);
  if (db->sync_ready) {
    pthread_cond_destroy(&db->listen.cv);
    pthread_mutex_destroy(&db->listen.mu);
    pthread_cond_destroy(&db->pool_cv);
    pthread_mutex_destroy(&db->pool_mu);
  }
  bs__free(&a, db);
}

/* The pool's and the listener's mutexes and conditions (the listener's timed waits use the
 * monotonic clock, so a wall-clock jump cannot stall them); 0 or BS_ENOMEM. */
static int sync_init(bs__pg_db *db) {
  pthread_condattr_t ca;
  int ok = 0;
  if (pthread_mutex_init(&db->pool_mu, NULL)) return BS_ENOMEM;
  if (pthread_cond_init(&db->pool_cv, NULL)) goto pool_cv;
  if (pthread_mutex_init(&db->listen.mu, NULL)) goto listen_mu;
  if (pthread_condattr_init(&ca)) goto listen_cv;
  ok = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&db->listen.cv, &ca);
  pthread_condattr_destroy(&ca);
  if (ok) {
    db->sync_ready = 1;
    return BS_OK;
  }
listen_cv:
  pthread_mutex_destroy(&db->listen.mu);
listen_mu:
  pthread_cond_destroy(&db->pool_cv);
pool_cv:
  pthread_mutex_destroy(&db->pool_mu);
  return BS_ENOMEM;
}

/* Counts over every stream in one statement (one snapshot); file_bytes: the bs_ tables' size on
 * the server, indexes and TOAST included. */
static int pg_stat(bs_stat *out, bs_db *base, bs_error *err) {
  bs__pg_db *db = pg_of(base);
  PGconn *c;
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)db->schema.oid);
  rc = bs__pg_exec(c,
                   "SELECT (SELECT count(*) FROM bs_streams), (SELECT count(*) FROM bs_buckets),"
                   " (SELECT count(*) FILTER (WHERE type = " BS_PG_SQL_PUT ") FROM bs_ops),"
                   " (SELECT count(*) FILTER (WHERE type = " BS_PG_SQL_REMOVE ") FROM bs_ops),"
                   " (SELECT count(*) FILTER (WHERE type = " BS_PG_SQL_MOVE ") FROM bs_ops),"
                   " (SELECT count(*) FILTER (WHERE type = " BS_PG_SQL_CLEAR ") FROM bs_ops),"
                   " (SELECT count(*) FROM bs_params), (SELECT count(*) FROM bs_source),"
                   " (SELECT count(*) FROM bs_wcp_managed WHERE NOT gone)"
                   "  + (SELECT count(*) FROM bs_wcp_custom),"
                   " (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint"
                   "  FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'bs\\_%'"
                   "  AND c.relnamespace = $1::oid)",
                   &a, &r, "stat", err);
  bs__pg_conn_put(db, c);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  out->streams = (uint64_t)bs__pg_i64(r, 0, 0);
  out->buckets = (uint64_t)bs__pg_i64(r, 0, 1);
  out->ops_put = (uint64_t)bs__pg_i64(r, 0, 2);
  out->ops_remove = (uint64_t)bs__pg_i64(r, 0, 3);
  out->ops_move = (uint64_t)bs__pg_i64(r, 0, 4);
  out->ops_clear = (uint64_t)bs__pg_i64(r, 0, 5);
  out->parameter_entries = (uint64_t)bs__pg_i64(r, 0, 6);
  out->source_records = (uint64_t)bs__pg_i64(r, 0, 7);
  out->write_checkpoints = (uint64_t)bs__pg_i64(r, 0, 8);
  out->file_bytes = (uint64_t)bs__pg_i64(r, 0, 9);
  PQclear(r);
  return BS_OK;
}

const bs_db_vtable bs__pg_db_vt = {
    .version = BS_DB_VTABLE_VERSION,
    .destroy = pg_close,
    .stat = pg_stat,
    .stream_create = pg_stream_create,
    .stream_list = pg_stream_list,
    .storage_open = pg_storage_open,
    .verify = bs__pg_verify,
    .backup = bs__pg_backup,
    .export_records = bs__pg_export,
    .load = bs__pg_load,
};

int bs__pg_open(bs_db **out, const char *url, const bs_open_options *opts, bs_error *err) {
  size_t n = strlen(url);
  bs__pg_db *db;
  const bs_allocator *a;
  bs_db base;
  PGconn *c;
  int rc;
  bs__db_base_set(&base, &bs__pg_db_vt, opts);
  if (!(db = bs__calloc(&base.alloc, 1, sizeof *db)))
    return bs__fail(err, BS_ENOMEM, "database: out of memory");
  db->base = base;
  db->hook = open_hook.fn;
  db->hook_payload = open_hook.payload;
  a = &db->base.alloc;
  /* opts: the front's copy at the current version (storage.c check_open) */
  db->max_conns = opts->pg_max_connections ? opts->pg_max_connections : BS_PG_MAX_CONNECTIONS;
  if (sync_init(db)) {
    bs__free(a, db);
    return bs__fail(err, BS_ENOMEM, "database: cannot initialise a mutex");
  }
  if (db->max_conns > SIZE_MAX / sizeof *db->idle ||
      !(db->idle = bs__malloc(a, db->max_conns * sizeof *db->idle)) ||
      !(db->url = bs__malloc(a, n + 1))) {
    pg_close(&db->base);
    return bs__fail(err, BS_ENOMEM, "database: out of memory");
  }
  memcpy(db->url, url, n + 1);
  if ((rc = bs__pg_conn_get(db, &c, err)) == BS_OK) {
    if (!(rc = bs__pg_check_server(PQserverVersion(c), err)) && !(rc = refuse_pooler(db, c, err)) &&
        !(rc = bs__pg_schema_resolve(c, &db->schema, err)) &&
        !(rc = bs__pg_run(c, db->schema.set_path, NULL, "open: search_path", err)))
      rc = check_schema(db, c, err);
    bs__pg_conn_put(db, c);
  }
  if (rc) {
    pg_close(&db->base);
    return rc;
  }
  *out = &db->base;
  return BS_OK;
}
