/*
 * pg_format.c: the PostgreSQL backend's format layer, as lmdb_format.c is LMDB's: the schema's
 * versions and the migration steps between them (a read-write open brings an older schema to
 * this build's in one transaction; a read-only one, or BS_OPEN_NOMIGRATE, needs it current and
 * says why not), the schema a handle's tables live in, the server's version and history checks
 * of an open. It sits on pg_conn.c; pg.c's constructor calls it.
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdio.h>

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
    /* 8: a bucket's ops in chunk rows (pg_chunk.c; pg_internal.h "Op chunks"): a flush writes
     * a few rows per bucket instead of one per op (a tuple header and an index entry each), and
     * checksums add chunks' sums. ops_to_chunks (below) then fills the table from bs_ops, in this
     * step's transaction, and drops bs_ops. A chunk of up to BS_PG_CHUNK_BYTES stays in its heap
     * row (toast_tuple_target: two to a page, no TOAST lookup per read); a larger one (a large op
     * of its own) goes out of line uncompressed (EXTERNAL: the reads slice no value, but pglz would
     * spend the writer's time on data the client compresses if it wants to). */
    "CREATE TABLE bs_chunks ("
    " bucket bigint NOT NULL, last_op bigint NOT NULL, first_op bigint NOT NULL,"
    " n integer NOT NULL, checksum integer NOT NULL, ops bytea NOT NULL,"
    " PRIMARY KEY (bucket, last_op)) WITH (toast_tuple_target = 8160);"
    "ALTER TABLE bs_chunks ALTER ops SET STORAGE EXTERNAL;",
    /* 9: smaller source records (70 bytes per op after bsbench --pg's ingest, 106 a record:
     * bench/README.md "Schema 9"): keyed by one database-wide table key instead of (stream,
     * table id), which takes the primary key's entry from 32 to 24 bytes, and the members with
     * their counts in a head byte and a first object type that is the table's name not spelled
     * out (pg_codec.c), which takes the heap tuple from 56 to 48. Each table gets its key here
     * (the identity fills the existing rows); source_to_keys (below) then converts every record
     * into bs_source9 and puts it in bs_source's place, in this step's transaction. Columns in
     * alignment order: the mark (NULL unless soft-deleted, so mostly free) first. */
    "ALTER TABLE bs_tables ADD key integer GENERATED ALWAYS AS IDENTITY UNIQUE;"
    "CREATE TABLE bs_source9 (mark bigint, tkey integer NOT NULL, replica_id bytea NOT NULL,"
    " members bytea NOT NULL, data bytea);",
};

/* Step 8's data: every bs_ops row, read in (bucket, op_id) order through a cursor (at most
 * MIG_FETCH rows in memory), appended to its bucket's chunks as the writer builds them, COPYed
 * into bs_chunks every MIG_FETCH rows; then bs_ops goes. In the step's transaction: a crash
 * leaves schema 7 whole, or schema 8 whole. */
#define MIG_FETCH 10000 /* the FETCH below */
static int ops_to_chunks(PGconn *c, bs_error *err) {
  const bs_allocator *a = &bs__default_allocator;
  bs__pg_chunkb k;
  bs__pg_buf rows = {0};
  uint64_t bucket = 0;
  int rc, n;
  memset(&k, 0, sizeof k);
  rc = bs__pg_run(c,
                  "DECLARE bs_ops8 NO SCROLL CURSOR FOR SELECT bucket, " BS_PG_OP_COLS ", data"
                  " FROM bs_ops ORDER BY bucket, op_id",
                  NULL, "migrating the schema: ops to chunks", err);
  do {
    PGresult *r;
    if (rc || (rc = bs__pg_exec(c, "FETCH 10000 FROM bs_ops8", NULL, &r,
                                "migrating the schema: ops to chunks", err)))
      break;
    n = PQntuples(r);
    for (int i = 0; i < n && !rc; i++) {
      uint64_t b = (uint64_t)bs__pg_i64(r, i, 0);
      bs_op op = bs__pg_op_row(r, i, 1, 1);
      if (b != bucket) rc = bs__pg_chunkb_end(&k, a, &rows, bucket);
      bucket = b;
      if (!rc) rc = bs__pg_chunkb_add(&k, a, &rows, b, &op);
    }
    if (!rc && n < MIG_FETCH) rc = bs__pg_chunkb_end(&k, a, &rows, bucket);
    PQclear(r);
    if (!rc) rc = bs__pg_copy_in(c, BS_PG_CHUNK_COPY, &rows, a, err);
    rows.n = 0;
    if (rc == BS_ENOMEM || rc == BS_ECORRUPT)
      rc = bs__fail(err, rc, "migrating the schema: ops to chunks: %s",
                    rc == BS_ENOMEM ? "out of memory" : "an op does not encode");
  } while (!rc && n == MIG_FETCH);
  bs__pg_chunkb_free(&k, a);
  bs__free(a, rows.p);
  if (!rc)
    rc = bs__pg_run(c, "CLOSE bs_ops8; DROP TABLE bs_ops", NULL,
                    "migrating the schema: ops to chunks", err);
  return rc;
}

/* Step 9's data: every bs_source record with its table's key and name, read through a cursor
 * (at most MIG_FETCH rows in memory), its members decoded in schema 8's encoding and written in
 * schema 9's, COPYed into bs_source9 every MIG_FETCH rows; then bs_source9 takes bs_source's
 * place and its indexes. A record whose table is not in bs_tables, or whose members do not
 * decode, fails the step (BS_ECORRUPT: the schema stays 8, whose verify names it): it has no
 * key to go under, and a record is never dropped unseen. */
static int source_to_keys(PGconn *c, bs_error *err) {
  const bs_allocator *a = &bs__default_allocator;
  bs__pg_buf rows = {0};
  int rc, n;
  rc = bs__pg_run(c,
                  "DECLARE bs_source9c NO SCROLL CURSOR FOR SELECT s.stream, s.table_id, t.key,"
                  " t.name, " BS_PG_SOURCE_COLS ", data FROM bs_source s LEFT JOIN bs_tables t"
                  " ON t.stream = s.stream AND t.id = s.table_id",
                  NULL, "migrating the schema: source records", err);
  do {
    PGresult *r;
    if (rc || (rc = bs__pg_exec(c, "FETCH 10000 FROM bs_source9c", NULL, &r,
                                "migrating the schema: source records", err)))
      break;
    n = PQntuples(r);
    for (int i = 0; i < n && !rc; i++) {
      int64_t stream = bs__pg_i32(r, i, 0), table = bs__pg_i32(r, i, 1);
      bs_val rid = bs__pg_bytes(r, i, 4);
      bs__srec rec = {0};
      if (PQgetisnull(r, i, 2)) {
        rc = bs__fail(err, BS_ECORRUPT,
                      "migrating the schema: a source record of stream %" PRId64
                      " names table %" PRId64
                      ", which bs_tables does not hold (bucketstore verify lists it)",
                      stream, table);
        break;
      }
      rec.exists = 1;
      rec.soft = !PQgetisnull(r, i, 5);
      rec.mark = rec.soft ? (uint64_t)bs__pg_i64(r, i, 5) : 0;
      rec.has_data = bs__pg_bool(r, i, 7);
      rec.data = bs__pg_bytes(r, i, 8);
      rc = bs__pg_srec8_decode(a, bs__pg_bytes(r, i, 6), rid, &rec);
      if (rc == BS_ECORRUPT)
        rc = bs__fail(err, rc,
                      "migrating the schema: a source record of stream %" PRId64 ", table %" PRId64
                      " does not decode (bucketstore verify lists it)",
                      stream, table);
      else if (rc)
        rc = bs__fail(err, rc, "migrating the schema: source records: out of memory");
      else
        bs__pg_source_copy(&rows, a, (uint32_t)bs__pg_i32(r, i, 2), bs__pg_bytes(r, i, 3), rid,
                           &rec);
      bs__free(a, rec.m);
      bs__free(a, rec.lk);
    }
    PQclear(r);
    if (!rc && rows.oom)
      rc = bs__fail(err, BS_ENOMEM, "migrating the schema: source records: out of memory");
    if (!rc) rc = bs__pg_copy_in(c, BS_PG_SOURCE_COPY_INTO("bs_source9"), &rows, a, err);
    rows.n = 0;
  } while (!rc && n == MIG_FETCH);
  bs__free(a, rows.p);
  if (!rc)
    rc = bs__pg_run(c,
                    "CLOSE bs_source9c; DROP TABLE bs_source;"
                    "ALTER TABLE bs_source9 RENAME TO bs_source;"
                    "ALTER TABLE bs_source ADD PRIMARY KEY (tkey, replica_id);"
                    "CREATE INDEX bs_source_soft ON bs_source (tkey, mark) WHERE mark IS NOT NULL",
                    NULL, "migrating the schema: source records", err);
  return rc;
}

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
    if (!rc && v + 1 == 8) rc = ops_to_chunks(c, err);
    if (!rc && v + 1 == 9) rc = source_to_keys(c, err);
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
int bs__pg_check_schema(bs__pg_db *db, PGconn *c, bs_error *err) {
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
