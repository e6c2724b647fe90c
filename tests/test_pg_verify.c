/* test_pg_verify: bs_db_verify, bs_db_stat, backup and export on the PostgreSQL backend
 * (pg_verify.c), on the server named by BS_TEST_PG_URL (`make pg-test` starts one). A workload
 * written through the library (two streams, both hashes, edge values) verifies clean; then each
 * kind of damage, made with raw SQL in a copy of its tables, is found and named; verify reads one
 * snapshot and changes nothing; stat counts what the memory backend counts for the same workload;
 * the CLI's stat and verify take a postgresql:// URL. Without BS_TEST_PG_URL, or in a build
 * without the backend, it says so and passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "storage.h"
#include "util_fault.h"
#include "util_pg.h"

#ifdef BS_HAVE_PG
#include "pg_internal.h" /* the test seam: bs__pg_set_hook */

static char cli_path[1024];

/* the tables of a bucketstore database (pg_internal.h), in the order a copy creates them */
static const char *const tables[] = {"bs_meta",   "bs_streams", "bs_buckets",     "bs_chunks",
                                     "bs_params", "bs_changes", "bs_wcp_managed", "bs_wcp_custom",
                                     "bs_tables", "bs_source",  "bs_superseded"};
#define N_TABLES (sizeof tables / sizeof tables[0])

/* ---- The workload: every kind of row the tables hold, with edge values ---- */

#define V(s) ((bs_val){(s), sizeof(s) - 1})

static void save(bs_writer *w, bs_tag tag, bs_val table, bs_val before, bs_val after,
                 const bs_row *rows, size_t n_rows, const bs_lookup *lk, size_t n_lk,
                 bs_val stored) {
  bs_save sv = BS_SAVE_INIT;
  bs_error err = {0};
  sv.table = table;
  sv.tag = tag;
  sv.before_id = before;
  sv.after_id = after;
  sv.rows = rows;
  sv.n_rows = n_rows;
  sv.lookups = lk;
  sv.n_lookups = n_lk;
  sv.stored_data = stored;
  int rc = bs_writer_save(w, &sv, &err);
  if (rc) fail_msg("save: %s (%s)", bs_strerror(rc), err.msg);
}

static void commit(bs_writer *w, const char *lsn) {
  bs_error err = {0};
  int rc = bs_writer_commit(NULL, w, (bs_val){lsn, strlen(lsn)}, NULL, &err);
  if (rc) fail_msg("commit: %s (%s)", bs_strerror(rc), err.msg);
}

static const bs_val NONE = {NULL, 0};

/* Stream 1 (xxh3, ACTIVE): PUTs and REMOVEs in buckets with edge names (one byte, 480 bytes,
 * non-ASCII), object ids and data "" / one byte / "1" / "1.0" / non-ASCII, a key change, a
 * delete, lookups and their tombstones, a record with lookups only, stored row data, a truncated
 * and a dropped table, managed
 * (processed, pending, cleaned up) and custom (persistent, requested) write checkpoints.
 * Stream 2 (sha256, PROCESSING): a few rows. */
static void workload(bs_db *db) {
  static char long_bucket[BS_MAX_BUCKET_NAME];
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w;
  uint32_t id;
  memset(long_bucket, 'L', sizeof long_bucket);
  bs_val t = V("todos"), b1 = V("b"), b2 = {long_bucket, sizeof long_bucket},
         b3 = V("by_user[\"\xc3\xa9t\xc3\xa9\"]");
  bs_val p1[] = {V("{\"x\":1}"), V("")}, p2[] = {V("{\"x\":\"\xe2\x82\xac\"}")};
  bs_lookup lk1[] = {{V("k1"), p1, 2}, {V(""), p2, 1}}, lk2[] = {{V("k1"), p2, 1}};
  assert_int_equal(bs_stream_create(&id, db, "s1", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, id, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, V("0"), &err), BS_OK);
  bs_row r1[] = {{b1, t, V("r1"), V("{\"a\":1}")}, {b2, t, V(""), V("")}, {b3, t, V("r1"), V("1")}};
  save(w, BS_INSERT, t, NONE, V("r1"), r1, 3, lk1, 2, V("stored"));
  bs_row r2[] = {{b1, t, V("r2"), V("1.0")}, {b3, V("\xc3\xa9"), V("r2"), V("x")}};
  save(w, BS_INSERT, t, NONE, V("r2"), r2, 2, NULL, 0, V(""));
  save(w, BS_INSERT, V("lists"), NONE, V(""), NULL, 0, lk2, 1, NONE); /* lookups only */
  commit(w, "00000001");
  bs_row r1b[] = {{b1, t, V("r1"), V("{\"a\":2}")}}; /* leaves b2 and b3: REMOVEs */
  save(w, BS_UPDATE, t, V("r1"), V("r1"), r1b, 1, lk2, 1, V(""));
  bs_row r2b[] = {{b1, t, V("r2b"), V("\xe2\x82\xac")}}; /* key change r2 -> r2b */
  save(w, BS_UPDATE, t, V("r2"), V("r2b"), r2b, 1, NULL, 0, NONE);
  bs_row r3[] = {{b3, t, V("r3"), V("y")}};
  save(w, BS_INSERT, t, NONE, V("r3"), r3, 1, NULL, 0, NONE);
  save(w, BS_DELETE, t, V("r3"), NONE, NULL, 0, NULL, 0, NONE);
  bs_row r4[] = {{b1, t, V("r4"), V("z")}, {b3, t, V("r4"), V("z")}};
  save(w, BS_INSERT, V("tmp"), NONE, V("r4"), r4, 2, lk2, 1, V("d"));
  save(w, BS_INSERT, V("tmp2"), NONE, V("r5"), r4, 1, NULL, 0, NONE);
  assert_int_equal(bs_writer_truncate(w, V("tmp"), &err), BS_OK);
  assert_int_equal(bs_writer_drop(w, V("tmp2"), &err), BS_OK);
  assert_int_equal(bs_writer_custom_write_checkpoint(w, V("u3"), 7, NONE, &err), BS_OK);
  assert_int_equal(
      bs_writer_custom_write_checkpoint_requested(w, V("u\xc3\xa9"), 9, V("ev"), 1000, &err),
      BS_OK);
  commit(w, "00000002");
  bs_head h1 = {V("1"), V("00000002")}, h2 = {V("1"), V("00000009")};
  bs_managed_request mr[] = {{V("u1"), &h1, 1, 1, 42, 5}, {V("u2/c"), &h2, 1, 0, 0, 0}};
  uint64_t ids[2];
  assert_int_equal(bs_create_managed_write_checkpoints(ids, NULL, st, mr, 2, &err), BS_OK);
  commit(w, "00000003"); /* u1 processed, u2/c pending */
  uint64_t deleted = 0;
  assert_int_equal(bs_delete_checkpoint_requests_before(&deleted, st, 6, &err), BS_OK);
  assert_int_equal(deleted, 1); /* u1: gone, kept as its high-water mark */
  bs_writer_close(w);
  bs_storage_close(st);

  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  so.hash = BS_HASH_SHA256;
  assert_int_equal(bs_stream_create(&id, db, "s2", &so, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, id, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  bs_row s2[] = {{b1, t, V("t1"), V("{\"id\":\"t1\"}")}};
  save(w, BS_INSERT, t, NONE, V("t1"), s2, 1, NULL, 0, NONE);
  bs_row s2b[] = {{b1, t, V("t1"), V("{\"id\":\"t2\"}")}};
  save(w, BS_UPDATE, t, V("t1"), V("t1"), s2b, 1, NULL, 0, NONE);
  uint64_t last;
  assert_int_equal(bs_writer_flush(&last, w, &err), BS_OK);
  bs_writer_close(w);
  bs_storage_close(st);
}

/* ---- verify's findings ---- */

typedef struct found {
  int n;
  char msg[64][512];
  char last[512];
  PGconn *repair; /* t_one_snapshot: run repair_sql inside verify's transaction */
  const char *repair_sql;
} found;

static void on_problem(const char *problem, void *payload) {
  found *f = payload;
  if (f->n < 64) snprintf(f->msg[f->n], sizeof f->msg[0], "%s", problem);
  snprintf(f->last, sizeof f->last, "%s", problem);
  f->n++;
}

/* the seam's point between verify's row checks and its bucket walk, in its transaction */
static void repair_at(const char *point, PGconn *c, void *payload) {
  found *f = payload;
  (void)c;
  if (!strcmp(point, "verify.buckets")) pgt_exec(f->repair, "%s", f->repair_sql);
}

static uint64_t verify(bs_db *db, found *f) {
  bs_error err = {0};
  uint64_t n = 12345;
  int rc = bs_db_verify(&n, db, on_problem, f, &err);
  if (rc) fail_msg("bs_db_verify: %s (%s)", bs_strerror(rc), err.msg);
  assert_int_equal((uint64_t)f->n, n);
  return n;
}

static void print_found(const found *f) {
  for (int i = 0; i < f->n && i < 64; i++) printf("  problem: %s\n", f->msg[i]);
}

/* a fingerprint of every row of the schema's tables */
static char *fingerprint(PGconn *c) {
  char sql[4096];
  size_t at = 0;
  at += (size_t)snprintf(sql + at, sizeof sql - at, "SELECT md5(''");
  for (size_t i = 0; i < N_TABLES; i++)
    at += (size_t)snprintf(sql + at, sizeof sql - at,
                           " || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text)"
                           " FROM %s x), '')",
                           tables[i]);
  snprintf(sql + at, sizeof sql - at, ")");
  PGresult *r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s", PQresultErrorMessage(r));
  char *s = strdup(PQgetvalue(r, 0, 0));
  PQclear(r);
  return s;
}

static void t_clean(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0), *ro;
  found f = {0};
  workload(db);
  char *before = fingerprint(t->admin);
  assert_int_equal(verify(db, &f), 0);
  /* a read-only handle verifies too (verify's transaction is READ ONLY) */
  ro = pgt_open(t->url, BS_OPEN_RDONLY);
  assert_int_equal(verify(ro, &f), 0);
  bs_close(ro);
  /* fn and problems_out may be NULL */
  bs_error err = {0};
  assert_int_equal(bs_db_verify(NULL, db, NULL, NULL, &err), BS_OK);
  char *after = fingerprint(t->admin);
  assert_string_equal(before, after); /* verify changed nothing */
  free(before);
  free(after);
  /* the workload is clean on the reference backend too (so the damages below are damages) */
  bs_db *mem;
  uint64_t n = 1;
  assert_int_equal(bs_open_memory(&mem, NULL, &err), BS_OK);
  workload(mem);
  assert_int_equal(bs_db_verify(&n, mem, NULL, NULL, &err), BS_OK);
  assert_int_equal(n, 0);
  bs_close(mem);
  bs_close(db);
}

/* ---- Damage, one kind at a time, each in a copy of the tables ---- */

typedef struct damage {
  const char *sql;   /* run in the copy's schema */
  const char *named; /* a substring of the problem it must cause */
  int problems;      /* how many problems verify reports in all */
} damage;

/* the op id / bucket id of the first membership of the source record of r1 (table 1; the only
 * record of that replica id), from its varints (pg_codec.c): one head byte (the counts), one of
 * bucket id (below 128 here), then the op id (up to three bytes: below 2^21 here) */
#define VARINT_BYTE(i, shift) "(get_byte(members, " #i ") & 127)::bigint << " #shift
#define MEMBER_OP                                                                                  \
  "(" VARINT_BYTE(2, 0) " | CASE WHEN get_byte(members, 2) > 127 THEN " VARINT_BYTE(               \
      3,                                                                                           \
      7) " | CASE WHEN get_byte(members, 3) > 127 THEN " VARINT_BYTE(4,                            \
                                                                     14) " ELSE 0 END ELSE 0 END)"
#define MEMBER_BUCKET "get_byte(members, 1)::bigint"
/* the index of its code: after the head, the bucket id and the op id's 1 to 3 bytes */
#define MEMBER_CODE                                                                                \
  "(3 + (get_byte(members, 2) > 127)::int"                                                         \
  " + (get_byte(members, 2) > 127 AND get_byte(members, 3) > 127)::int)"
/* the first (FIRST_OP) or last (LAST_OP) op of stream 1 that matches cond */
#define OPS_S1(cond)                                                                               \
  " FROM bs_ops WHERE " cond " AND bucket IN (SELECT id FROM bs_buckets WHERE stream = 1)"
#define FIRST_OP(cond)                                                                             \
  "(bucket, op_id) = (SELECT bucket, op_id" OPS_S1(cond) " ORDER BY op_id LIMIT 1)"
#define LAST_OP(cond)                                                                              \
  "(bucket, op_id) = (SELECT bucket, op_id" OPS_S1(cond) " ORDER BY op_id DESC LIMIT 1)"
#define BUCKET_B "(SELECT id FROM bs_buckets WHERE stream = 1 AND name = 'b')"
/* the first row of stream 1's superseded log */
#define FIRST_SUP                                                                                  \
  "(stream, bucket, first_new) = (SELECT stream, bucket, first_new FROM bs_superseded"             \
  " WHERE stream = 1 ORDER BY bucket, first_new LIMIT 1)"

static const damage damages[] = {
    /* bucket states against their ops */
    {"UPDATE bs_buckets SET checksum = (checksum + 1) % 4294967296 WHERE id = " BUCKET_B,
     "running checksum", 1},
    {"UPDATE bs_buckets SET count = count + 1 WHERE id = " BUCKET_B, "running count", 1},
    {"UPDATE bs_buckets SET bytes = bytes + 1 WHERE id = " BUCKET_B, "running bytes", 1},
    {"UPDATE bs_buckets SET last_op = last_op - 1 WHERE id = " BUCKET_B, "highest stored op", 1},
    {"UPDATE bs_buckets SET clear_start = 2, clear_op = 1 WHERE id = " BUCKET_B,
     "bad CLEAR span [2, 1]", 1},
    {"UPDATE bs_buckets SET clear_op = 1 WHERE id = " BUCKET_B, "but op ", 1},
    {"UPDATE bs_buckets SET name = '' WHERE id = " BUCKET_B, "a name of 0 bytes", 1},
    {"UPDATE bs_buckets SET max_op_bytes = 1 WHERE id = " BUCKET_B, "above its max_op_bytes 1", 1},
    /* ops */
    {"UPDATE bs_ops SET object_id = set_byte(object_id, 0, get_byte(object_id, 0) # 1)"
     " WHERE type = 1 AND object_id = 'r2' AND bucket = " BUCKET_B,
     "hashes to", 1},
    {"UPDATE bs_ops SET subkey = set_byte(subkey, 8, 45) WHERE " FIRST_OP("type = 2"),
     "malformed subkey", 2}, /* and its REMOVE checksum, which covers the subkey */
    /* a chunk holds no payload of an op whose type carries none (pg_chunk.c): the bucket's
     * running bytes then disagree too */
    {"UPDATE bs_ops SET type = 7 WHERE " FIRST_OP("type = 2"), "unknown type 7", 2},
    {"UPDATE bs_ops o SET type = 3, target_op = (SELECT last_op FROM bs_buckets b"
     " WHERE b.id = o.bucket) WHERE " FIRST_OP("type = 2 AND bucket = " BUCKET_B),
     "running bytes", 1},
    {"UPDATE bs_ops SET type = 4, target_op = 0 WHERE " LAST_OP("type = 2"),
     "not the bucket's leading CLEAR", 2}, /* and its payload */
    {"UPDATE bs_ops SET target_op = 1 WHERE " FIRST_OP("type = 1"), "bad target_op 1", 1},
    {"UPDATE bs_ops SET op_id = op_id + 1000000 WHERE (bucket, op_id) = (SELECT " MEMBER_BUCKET
     ", " MEMBER_OP " FROM bs_source WHERE replica_id = 'r1')",
     "but no such op", 3}, /* and its op id is above the op head and the bucket's last op */
    {"INSERT INTO bs_ops VALUES (999999, 1, 1, 0, 0, 'a', 'b', NULL, 'c')",
     "ops of bucket id 999999 without a bucket state", 1},
    /* op ids unique in a stream */
    {"UPDATE bs_params SET op_id = (SELECT min(op_id) FROM bs_ops o JOIN bs_buckets b"
     " ON b.id = o.bucket WHERE b.stream = 1) WHERE stream = 1 AND op_id ="
     " (SELECT max(op_id) FROM bs_params WHERE stream = 1)",
     "used by more than one op or parameter entry", 1},
    /* streams */
    {"UPDATE bs_streams SET hash = 9 WHERE id = 1", "stream 1: unknown hash mode", 1},
    {"UPDATE bs_streams SET state = 1 WHERE id = 1", "more than one PROCESSING stream", 1},
    {"UPDATE bs_streams SET state = 6 WHERE id = 1", "stream 1: unknown state", 1},
    {"UPDATE bs_streams SET checkpoint_lsn = NULL WHERE id = 1", "a checkpoint without an LSN", 1},
    {"UPDATE bs_streams SET next_table_id = 2 WHERE id = 1",
     "next_table_id not above the stream's table ids", 4}, /* and table 2's 3 parameter entries */
    {"UPDATE bs_streams SET param_horizon = op_head + 1 WHERE id = 1",
     "parameter horizon outside 0..op head", 1},
    {"UPDATE bs_meta SET value = 2", "schema version 2, this build's is 9", 1},
    {"INSERT INTO bs_meta VALUES ('x', 1)", "bs_meta \"x\": unknown key", 1},
    /* source tables */
    {"INSERT INTO bs_tables OVERRIDING SYSTEM VALUE VALUES (1, 'other', 1, 99)",
     "id of another table too", 2},
    /* source records */
    {"UPDATE bs_source SET members = '\\x01' WHERE replica_id = 'r1'", "do not decode", 1},
    {"UPDATE bs_source SET mark = 0 WHERE replica_id = 'r1'", "soft-deleted with content", 1},
    {"UPDATE bs_source SET mark = -1 WHERE replica_id = 'r1'", "mark -1 outside 0..op head", 2},
    /* r1's first membership: its code 0 (object type the table's name, object id the replica id)
     * becomes 1, an object id of 2 bytes, "r9"; the code is the byte after the op id */
    {"UPDATE bs_source SET members = substring(members FROM 1 FOR " MEMBER_CODE ")"
     " || '\\x01027239'::bytea || substring(members FROM " MEMBER_CODE " + 2)"
     " WHERE replica_id = 'r1'",
     "its object_type or object_id is not the membership's", 1},
    {"UPDATE bs_source SET tkey = 999 WHERE replica_id = ''",
     "(table key 999, replica id \"\"): unknown table", 1},
    {"UPDATE bs_ops SET subkey = set_byte(subkey, 40, CASE get_byte(subkey, 40) WHEN 48 THEN 49"
     " ELSE 48 END) WHERE (bucket, op_id) = (SELECT " MEMBER_BUCKET ", " MEMBER_OP
     " FROM bs_source WHERE replica_id = 'r1')",
     "its subkey is not the source row's", 1},
    {"UPDATE bs_ops SET type = 2, data = NULL WHERE (bucket, op_id) = (SELECT " MEMBER_BUCKET
     ", " MEMBER_OP " FROM bs_source WHERE replica_id = 'r1')",
     "but not a PUT", 3}, /* and its checksum, and the bucket's running bytes */
    {"DELETE FROM bs_buckets WHERE id = (SELECT " MEMBER_BUCKET
     " FROM bs_source WHERE replica_id = 'r1')",
     "but no such bucket", 6}, /* r1's and r2b's; its ops and its 3 superseded log rows */
    /* the superseded log */
    {"UPDATE bs_superseded SET pairs = '\\x00' WHERE " FIRST_SUP, "pairs of 1 bytes do not decode",
     1},
    {"UPDATE bs_superseded SET pairs = '' WHERE " FIRST_SUP, "no entries", 1},
    {"UPDATE bs_superseded SET first_new = 1, pairs = '\\x0500' WHERE " FIRST_SUP,
     "an entry's new op not above its old op", 1},
    {"UPDATE bs_superseded SET first_new = first_new + 1000000 WHERE " FIRST_SUP,
     "an entry's new op above the op head", 1},
    {"UPDATE bs_superseded SET bucket = 999999 WHERE " FIRST_SUP, "not a bucket of the stream", 1},
    {"UPDATE bs_superseded SET stream = 99 WHERE " FIRST_SUP, "(stream 99, bucket", 2},
    /* parameter entries */
    {"UPDATE bs_params SET rows = ARRAY[NULL::bytea] WHERE op_id = (SELECT min(op_id)"
     " FROM bs_params)",
     "rows with a NULL", 1},
    {"UPDATE bs_params SET rows = '{{a},{b}}'::bytea[] WHERE op_id = (SELECT min(op_id)"
     " FROM bs_params)",
     "rows with a NULL or of more than one dimension", 1},
    {"UPDATE bs_params SET op_id = 1000000 WHERE op_id = (SELECT max(op_id) FROM bs_params"
     " WHERE stream = 1)",
     "op id outside 1..op head", 1},
    {"UPDATE bs_params SET table_id = 99 WHERE op_id = (SELECT min(op_id) FROM bs_params)",
     "a table id the stream never gave out", 1},
    /* change records */
    {"UPDATE bs_changes SET flags = 9 WHERE op_id = (SELECT min(op_id) FROM bs_changes)",
     "unknown flags", 1},
    {"UPDATE bs_changes SET buckets = ARRAY[NULL::bytea] WHERE op_id = (SELECT min(op_id)"
     " FROM bs_changes)",
     "a list with a NULL", 1},
    /* write checkpoints */
    {"UPDATE bs_wcp_managed SET processed_lsn = NULL WHERE user_id = 'u1'",
     "processed and processed_lsn disagree", 1},
    {"UPDATE bs_wcp_managed SET head_lsns = '{}' WHERE user_id = 'u2/c'",
     "heads' connections and LSNs do not pair up", 1},
    {"UPDATE bs_wcp_custom SET value = -1 WHERE user_id = 'u3'", "value at or above 2^63", 1},
    {"UPDATE bs_wcp_custom SET stream = 99 WHERE user_id = 'u3'",
     "custom write checkpoint (stream 99, event \"\", user \"u3\"): unknown stream", 1},
};

/* ---- Ops as rows: a damage to ops is written to schema 7's bs_ops (explode: every chunk's ops
 * as rows, the chunks gone), then put back in chunks by migration 8 itself (implode: the schema
 * version set to 7, bs_chunks dropped, bs__pg_migrate), so it lands in the chunks as the
 * writer's encoding holds it. */
static void explode(PGconn *c) {
  static bs__pg_chunkr ch;
  bs__pg_buf rows = {0};
  bs_error err = {0};
  PGresult *r;
  pgt_exec(c, "CREATE TABLE bs_ops (bucket bigint NOT NULL, op_id bigint NOT NULL,"
              " type smallint NOT NULL, checksum integer NOT NULL, target_op bigint NOT NULL"
              " DEFAULT 0, object_type bytea, object_id bytea, subkey bytea, data bytea,"
              " PRIMARY KEY (bucket, op_id))");
  r = PQexecParams(c, "SELECT bucket, ops FROM bs_chunks ORDER BY bucket, last_op", 0, NULL, NULL,
                   NULL, NULL, 1);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  for (int i = 0; i < PQntuples(r); i++) {
    assert_int_equal(bs__pg_chunk_open(&ch, bs__pg_bytes(r, i, 1)), BS_OK);
    for (uint32_t j = 0; j < ch.n; j++) {
      bs_op op;
      assert_int_equal(bs__pg_chunk_op(&ch, j, &op), BS_OK);
      bs__pg_op_copy(&rows, &bs__default_allocator, (uint64_t)bs__pg_i64(r, i, 0), op.op_id, &op);
    }
  }
  PQclear(r);
  pgt_exec(c, "BEGIN");
  assert_int_equal(bs__pg_copy_in(c, BS_PG_OP_COPY, &rows, &bs__default_allocator, &err), BS_OK);
  pgt_exec(c, "DELETE FROM bs_chunks; COMMIT");
  free(rows.p);
}

static void implode(PGconn *c) {
  bs_error err = {0};
  pgt_exec(c, "DROP TABLE bs_chunks; UPDATE bs_meta SET value = 7 WHERE key = 'schema_version'");
  if (bs__pg_migrate(c, 8, &err)) fail_msg("implode: %s", err.msg);
  /* migration 8 alone: the other tables are already schema 9's */
  pgt_exec(c, "UPDATE bs_meta SET value = %d WHERE key = 'schema_version'", BS_PG_SCHEMA_VERSION);
}

/* A copy of the test schema's tables in a new schema; returns its URL in url. */
static void copy_schema(pgt *t, const char *copy, char *url, size_t n) {
  pgt_exec(t->admin, "CREATE SCHEMA %s", copy);
  for (size_t i = 0; i < N_TABLES; i++)
    pgt_exec(t->admin,
             "CREATE TABLE %s.%s (LIKE %s.%s INCLUDING ALL);"
             " INSERT INTO %s.%s OVERRIDING SYSTEM VALUE SELECT * FROM %s.%s",
             copy, tables[i], t->schema, tables[i], copy, tables[i], t->schema, tables[i]);
  pgt_schema_url(url, n, copy);
}

static void t_damage(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  int failed = 0;
  workload(db);
  bs_close(db);
  for (size_t i = 0; i < sizeof damages / sizeof damages[0]; i++) {
    const damage *d = &damages[i];
    char copy[96], url[1200], sql[2048];
    found f = {0};
    int named = 0;
    snprintf(copy, sizeof copy, "%s_d%zu", t->schema, i);
    copy_schema(t, copy, url, sizeof url);
    snprintf(sql, sizeof sql, "SET search_path = %s; %s; SET search_path = %s", copy, d->sql,
             t->schema);
    db = pgt_open(url, BS_OPEN_RDONLY); /* before the damage: bs_meta's would refuse the open */
    if (strstr(d->sql, "bs_ops")) {
      pgt_exec(t->admin, "SET search_path = %s", copy);
      explode(t->admin);
      pgt_exec(t->admin, "%s", d->sql);
      implode(t->admin);
      pgt_exec(t->admin, "SET search_path = %s", t->schema);
    } else {
      pgt_exec(t->admin, "%s", sql);
    }
    uint64_t n = verify(db, &f);
    bs_close(db);
    for (int k = 0; k < f.n && k < 64; k++) named |= strstr(f.msg[k], d->named) != NULL;
    if (!named || n != (uint64_t)d->problems) {
      printf("damage %zu: %s\n  expected %d problem(s) naming \"%s\", got %llu:\n", i, d->sql,
             d->problems, d->named, (unsigned long long)n);
      print_found(&f);
      failed++;
    }
    pgt_exec(t->admin, "DROP SCHEMA %s CASCADE", copy);
  }
  assert_int_equal(failed, 0);
}

/* Verify reads one snapshot: a repair committed while it runs (after the stream checks found
 * their problem, at the seam's "verify.buckets" point) is not seen by its later statements (the
 * bucket walk). */
static void t_one_snapshot(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  found f = {0};
  workload(db);
  pgt_exec(t->admin, "UPDATE bs_streams SET checkpoint_lsn = NULL WHERE id = 1;"
                     " UPDATE bs_buckets SET count = count + 1 WHERE id = " BUCKET_B);
  f.repair = t->admin;
  f.repair_sql = "UPDATE bs_buckets SET count = count - 1 WHERE id = " BUCKET_B;
  bs__pg_set_hook(db, repair_at, &f);
  assert_int_equal(verify(db, &f), 2);
  bs__pg_set_hook(db, NULL, NULL);
  assert_non_null(strstr(f.msg[0], "a checkpoint without an LSN"));
  assert_non_null(strstr(f.msg[1], "running count"));
  /* the next call sees the repair */
  memset(&f, 0, sizeof f);
  assert_int_equal(verify(db, &f), 1);
  bs_close(db);
}

/* ---- Pages: verify walks past every page boundary ---- */

/* 1200 rows in one bucket (ops and source records over three pages of 500) and three ops of
 * 7 MiB (two keyset pages of ops cut at 16 MiB of payload): clean; then a damage on the last
 * page of each walk is found. */
static void t_pages(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w;
  found f = {0};
  size_t big = 7u << 20;
  char *data = malloc(big);
  assert_non_null(data);
  memset(data, 'd', big);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  for (int i = 0; i < 1203; i++) {
    char id[16];
    snprintf(id, sizeof id, "r%04d", i);
    bs_row row = {V("b"),
                  V("todos"),
                  {id, strlen(id)},
                  i < 1200 ? (bs_val){id, strlen(id)} : (bs_val){data, big}};
    save(w, BS_INSERT, V("t"), NONE, (bs_val){id, strlen(id)}, &row, 1, NULL, 0, NONE);
    if (i >= 1200) assert_int_equal(bs_writer_flush(NULL, w, &err), BS_OK); /* one at a time */
  }
  commit(w, "1");
  bs_writer_close(w);
  bs_storage_close(st);
  free(data);
  assert_int_equal(verify(db, &f), 0);
  /* the last op (past two pages of 500 ops and one cut at 16 MiB): its checksum; the last
   * source record's membership (past two pages of records) */
  explode(t->admin);
  pgt_exec(t->admin, "UPDATE bs_ops SET checksum = checksum # 1"
                     " WHERE op_id = (SELECT max(op_id) FROM bs_ops);"
                     " UPDATE bs_ops SET subkey = set_byte(subkey, 40, CASE get_byte(subkey, 40)"
                     " WHEN 48 THEN 49 ELSE 48 END) WHERE op_id = 1200");
  implode(t->admin);
  assert_int_equal(verify(db, &f), 3);
  assert_non_null(strstr(f.msg[0], "op 1203: PUT checksum"));
  assert_non_null(strstr(f.msg[1], "running checksum"));
  assert_non_null(strstr(f.msg[2], "op 1200: held by the source record of table 1 replica id"
                                   " \"r1199\" (stream 1), but its subkey is not the source"
                                   " row's"));
  bs_close(db);
}

/* ---- Problems passed on after the transaction ---- */

/* Verify keeps its problems' first 256 KiB of text for the callback, which runs after its
 * transaction ended: 10,000 ops of buckets that do not exist (a problem each, about 50 bytes)
 * are counted, the first of them passed on, then one last call says how many more there were. */
static void t_problems_kept(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  found f = {0};
  uint64_t n = 0;
  unsigned long long more = 0;
  explode(t->admin);
  pgt_exec(t->admin, "INSERT INTO bs_ops (bucket, op_id, type, checksum)"
                     " SELECT g, 1, 3, 0 FROM generate_series(1000001, 1010000) g");
  implode(t->admin);
  assert_int_equal(bs_db_verify(&n, db, on_problem, &f, &err), BS_OK);
  assert_int_equal(n, 10000);
  assert_true(f.n > 1000 && f.n < 10000);
  assert_non_null(strstr(f.msg[0], "ops of bucket id 1000001 without a bucket state"));
  assert_int_equal(sscanf(f.last, "%llu more problems, not shown", &more), 1);
  assert_int_equal(more + (unsigned long long)f.n - 1, 10000);
  bs_close(db);
}

/* ---- stat ---- */

static void t_stat(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0), *mem;
  bs_error err = {0};
  bs_stat s, m;
  assert_int_equal(bs_db_stat(&s, db, &err), BS_OK);
  assert_int_equal(s.streams + s.buckets + s.ops_put + s.source_records, 0);
  workload(db);
  assert_int_equal(bs_open_memory(&mem, NULL, &err), BS_OK);
  workload(mem);
  assert_int_equal(bs_db_stat(&s, db, &err), BS_OK);
  assert_int_equal(bs_db_stat(&m, mem, &err), BS_OK);
  /* the same counts as the reference backend for the same workload */
  assert_int_equal(s.streams, 2);
  assert_int_equal(s.streams, m.streams);
  assert_int_equal(s.buckets, m.buckets);
  assert_int_equal(s.ops_put, m.ops_put);
  assert_int_equal(s.ops_remove, m.ops_remove);
  assert_int_equal(s.ops_move, m.ops_move);
  assert_int_equal(s.ops_clear, m.ops_clear);
  assert_int_equal(s.parameter_entries, m.parameter_entries);
  assert_int_equal(s.source_records, m.source_records);
  assert_int_equal(s.write_checkpoints, m.write_checkpoints);
  assert_int_equal(s.write_checkpoints, 3); /* u2/c, u3, u-acute; u1 was cleaned up */
  /* bytes: the schema's tables with their indexes and TOAST; nothing is "free pages" here */
  assert_true(s.file_bytes > 0);
  assert_int_equal((long long)s.file_bytes,
                   pgt_int(t->admin, "SELECT sum(pg_total_relation_size(c.oid))::bigint"
                                     " FROM pg_class c WHERE c.relkind = 'r'"
                                     " AND c.relnamespace = current_schema()::regnamespace"));
  assert_int_equal(s.reclaimable_bytes, 0);
  bs_close(mem);
  bs_close(db);
  /* a read-only handle */
  db = pgt_open(t->url, BS_OPEN_RDONLY);
  assert_int_equal(bs_db_stat(&m, db, &err), BS_OK);
  assert_int_equal(m.ops_put, s.ops_put);
  bs_close(db);
}

/* ---- backup and export: the LMDB format's, which this backend does not store ---- */

static int no_record(const bs_record *r, void *payload) {
  (void)r;
  ++*(int *)payload;
  return 0;
}

static void t_backup_export(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  int calls = 0;
  char path[64];
  workload(db);
  snprintf(path, sizeof path, "/tmp/bs-pgv-%ld.db", (long)getpid());
  assert_int_equal(bs_backup(db, path, NULL, &err), BS_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "pg_dump"));
  assert_int_equal(access(path, F_OK), -1); /* nothing was written */
  assert_int_equal(bs_db_export(db, 0, no_record, &calls, &err), BS_EUNSUPPORTED);
  assert_non_null(strstr(err.msg, "LMDB file format"));
  assert_int_equal(bs_db_export(db, 1, no_record, &calls, &err), BS_EUNSUPPORTED);
  assert_int_equal(calls, 0);
  bs_close(db);
}

/* ---- the CLI: stat and verify take a postgresql:// URL ---- */

static int run_cli(const char *args, char *out, size_t n) {
  char cmd[2048];
  size_t at = 0;
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", cli_path, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  while (at + 1 < n && fgets(out + at, (int)(n - at), p)) at += strlen(out + at);
  out[at] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void t_cli(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  char args[1200], out[8192];
  workload(db);
  bs_close(db);
  if (ft_cli_path(cli_path, sizeof cli_path) != 0)
    fail_msg("no CLI beside this test (BUILD/bucketstore): make builds it before the tests");
  snprintf(args, sizeof args, "verify '%s'", t->url);
  assert_int_equal(run_cli(args, out, sizeof out), 0);
  assert_string_equal(out, "0 problems\n");
  snprintf(args, sizeof args, "stat '%s' --no-buckets", t->url);
  assert_int_equal(run_cli(args, out, sizeof out), 0);
  assert_non_null(strstr(out, "streams            2\n"));
  assert_non_null(strstr(out, "write checkpoints  3\n"));
  pgt_exec(t->admin, "UPDATE bs_buckets SET count = count + 1 WHERE id = " BUCKET_B);
  snprintf(args, sizeof args, "verify '%s'", t->url);
  assert_int_equal(run_cli(args, out, sizeof out), 1);
  assert_non_null(strstr(out, "problem: bucket \"b\""));
  assert_non_null(strstr(out, "1 problem\n"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_clean, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_damage, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_one_snapshot, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_pages, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_problems_kept, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_stat, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_backup_export, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_cli, pgt_setup, pgt_teardown),
  };
  if (pgt_skipped("test_pg_verify")) return 0;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  return !pgt_skipped("test_pg_verify");
}
#endif
