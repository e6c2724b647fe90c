/* test_pg: the PostgreSQL backend (pg*.c) through the public API, on the server named
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
#include "util_pg.h"

#ifdef BS_HAVE_PG
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pg_internal.h" /* bs__pg_migrate: schema-4 and -5 databases for t_reads_mirror */

/* ---- schema ---- */

static void t_schema_created_once(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0), *db2;
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
  bs_close(db);
  db2 = pgt_open(t->url, 0); /* a second open finds it and changes nothing */
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_meta"), 5); /* + the history */
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_streams"), 0);
  bs_close(db2);
}

static void t_schema_newer_refused(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0);
  bs_close(db);
  pgt_exec(t->admin, "UPDATE bs_meta SET value = 10 WHERE key = 'schema_version'");
  db = (bs_db *)&err; /* must become NULL */
  assert_int_equal(bs_open(&db, t->url, NULL, &err), BS_ECORRUPT);
  assert_null(db);
  assert_non_null(strstr(err.msg, "version 10, newer than this build's 9"));
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  o.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ECORRUPT);
  /* nothing was touched */
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 10);
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
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM pg_tables WHERE tablename = 'bs_meta'"
                                     " AND schemaname = current_schema()"),
                   0);
  db = pgt_open(t->url, 0);
  assert_int_equal(bs_stream_create(&id, db, "s", NULL, &err), BS_OK);
  bs_close(db);
  db = pgt_open(t->url, BS_OPEN_RDONLY);
  assert_int_equal(bs_stream_create(&id, db, "s2", NULL, &err), BS_ESTATE);
  bs_storage *st = NULL;
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_report_error(st, "x", &err), BS_ESTATE);
  bs_storage_close(st);
  bs_close(db);
  /* a schema of version 1 (before the write-checkpoint and source tables): read-only refuses
   * it, a read-write open migrates it and keeps its data */
  pgt_exec(t->admin,
           "UPDATE bs_meta SET value = 1 WHERE key = 'schema_version';"
           " DROP TABLE bs_wcp_managed, bs_wcp_custom, bs_tables, bs_source, bs_superseded;"
           " ALTER TABLE bs_streams DROP COLUMN next_table_id, DROP COLUMN param_cursor;"
           " ALTER TABLE bs_changes DROP COLUMN time_ms;"
           " ALTER TABLE bs_buckets DROP COLUMN max_op_bytes;"
           " DROP TABLE bs_chunks; CREATE TABLE bs_ops ("
           " bucket bigint NOT NULL, op_id bigint NOT NULL, type smallint NOT NULL,"
           " checksum bigint NOT NULL, target_op bigint NOT NULL DEFAULT 0,"
           " object_type bytea, object_id bytea, subkey bytea, data bytea,"
           " PRIMARY KEY (bucket, op_id) INCLUDE (type, checksum))");
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 1, older than this build's 9"));
  db = pgt_open(t->url, 0);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_streams"), 1);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_wcp_managed"), 0);
  assert_int_equal(pgt_int(t->admin, "SELECT next_table_id FROM bs_streams"), 1);
  bs_close(db);
  /* version 0 (bs_meta without migration 1): read-only finds no schema */
  pgt_exec(t->admin,
           "UPDATE bs_meta SET value = 0 WHERE key = 'schema_version';"
           " DROP TABLE bs_changes, bs_params, bs_chunks, bs_buckets, bs_streams, bs_wcp_managed,"
           " bs_wcp_custom, bs_tables, bs_source, bs_superseded");
  assert_int_equal(bs_open(&db, t->url, &o, &err), BS_ENOTFOUND);
  db = pgt_open(t->url, 0);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
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
  const char *base_url = pgt_base_url(), *slash = strrchr(base_url, '/');
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
  bs_db *db = pgt_open(t->url, 0), *other;
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
  other = pgt_open(t->url, 0);
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
  /* a callback's value stops the listing: BS_EUSER (storage.h CONVENTIONS) */
  assert_int_equal(bs_stream_list(db, stop_at_first, &calls, &err), BS_EUSER);
  assert_int_equal(calls, 1);
  bs_close(other);
  bs_close(db);
}

static void t_storage_open(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
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
  pgt_exec(t->admin, "UPDATE bs_streams SET state = 2 WHERE id = 1");
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
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_status s;
  bs_checkpoint cp;
  char msg[400];
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  memset(&cp, 0xff, sizeof cp);
  assert_int_equal(bs_get_checkpoint(&cp, st, &err), BS_OK);
  assert_int_equal(cp.op_id, 0);
  assert_int_equal(cp.has_lsn, 0);
  memset(&s, 0xff, sizeof s);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_int_equal(s.state, BS_STREAM_PROCESSING);
  assert_int_equal(s.snapshot_done, 0);
  assert_int_equal(s.checkpoint, 0);
  assert_int_equal(s.last_persisted_op, 0);
  assert_int_equal(s.has_lsn, 0);
  assert_int_equal(s.has_resume_lsn, 0);
  assert_string_equal(s.last_error, "");
  /* a checkpoint stored by a writer (here: by hand) reads back, an empty LSN is a value */
  pgt_exec(t->admin, "UPDATE bs_streams SET checkpoint = 7, op_head = 9, checkpoint_lsn = '',"
                     " resume_lsn = '\\x00ff'::bytea, snapshot_done = true WHERE id = 1");
  assert_int_equal(bs_get_checkpoint(&cp, st, &err), BS_OK);
  assert_int_equal(cp.op_id, 7);
  assert_int_equal(cp.has_lsn, 1);
  assert_int_equal(cp.lsn_size, 0);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
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
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_int_equal(strlen(s.last_error), 255);
  assert_int_equal(s.state, BS_STREAM_PROCESSING);
  assert_int_equal(bs_report_error(st, "\xc3\xa9", &err), BS_OK);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_string_equal(s.last_error, "\xc3\xa9");
  /* a stream deleted under the handle */
  pgt_exec(t->admin, "DELETE FROM bs_streams");
  assert_int_equal(bs_get_checkpoint(&cp, st, &err), BS_ENOTFOUND);
  assert_int_equal(bs_get_status(&s, st, &err), BS_ENOTFOUND);
  bs_storage_close(st);
  bs_close(db);
}

/* Slots this build does not implement answer BS_EUNSUPPORTED (a NULL slot), never a fake. */
static void t_unsupported_slots(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w = NULL;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  bs_writer_close(w);
  bs_storage_close(st);
  assert_int_equal(bs_backup(db, "/tmp/x", NULL, &err), BS_EUNSUPPORTED);
  bs_close(db);
}

/* ---- reads, on data a writer would leave: mirrored from the memory backend ---- */

/* A stream's data, written through the memory backend's writer (saves, commits, a full
 * compaction: PUT, REMOVE, MOVE and CLEAR ops, a torn span), then copied into PostgreSQL tables
 * of schema 4 as its writer kept them (ops with bigint checksums, source records with the
 * fixed-width members of before), migrated to schema 5 (bs__pg_migrate), given schema 5's
 * superseded log (a row per entry), migrated to schema 6 (the log packed), given a soft-deleted
 * record, and migrated to schema 7 (source records without soft and has_data) by this build's
 * open. Reads of both
 * must then agree at every C, and writes after the migration must agree too (the converted
 * records name the ops their rows' next changes supersede). */
static uint64_t rnd_state;
static uint64_t rnd(void) {
  rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
  return rnd_state >> 33;
}

static const char *const bucket_names[] = {"b", "by_user[\"u1\"]", "\xc3\xa9t\xc3\xa9", "z"};
#define N_BUCKETS 4

/* A save of row r0..r11 of table "t" into up to two random buckets; a DELETE one time in
 * delete_in. */
static void random_save(bs_writer *w, int delete_in) {
  bs_error err = {0};
  char id[16], data[64];
  bs_row rows[2];
  bs_save sv = BS_SAVE_INIT;
  int k = (int)(rnd() % 3);
  snprintf(id, sizeof id, "r%d", (int)(rnd() % 12));
  /* data of every size class the chunking cares about: "", one byte, a few KiB */
  size_t len = rnd() % 4 == 0 ? 0 : rnd() % 4 == 0 ? 1 : 20;
  memset(data, 'a' + (int)(rnd() % 26), sizeof data);
  sv.table = (bs_val){"t", 1};
  sv.tag = rnd() % (uint64_t)delete_in == 0 ? BS_DELETE : BS_UPDATE;
  sv.after_id = (bs_val){id, strlen(id)};
  sv.before_id = sv.after_id;
  for (int i = 0; i < k; i++) {
    const char *b = bucket_names[rnd() % N_BUCKETS];
    rows[i].bucket = (bs_val){b, strlen(b)};
    rows[i].object_type = (bs_val){"todos", 5};
    rows[i].object_id = (bs_val){id, strlen(id)};
    rows[i].data = (bs_val){data, len};
  }
  sv.rows = rows;
  sv.n_rows = (size_t)k;
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
}

static void mem_workload(bs_db **out, uint64_t *head, uint64_t seed) {
  bs_error err = {0};
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  char lsn[32];
  int n_lsn = 0;
  rnd_state = seed;
  assert_int_equal(bs_open_memory(&db, NULL, &err), BS_OK);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, &wo, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, (bs_val){"0", 1}, &err), BS_OK);
  for (int step = 0; step < 120; step++) {
    random_save(w, 7);
    if (rnd() % 5 == 0) {
      snprintf(lsn, sizeof lsn, "%08d", ++n_lsn);
      assert_int_equal(bs_writer_commit(NULL, w, (bs_val){lsn, 8}, NULL, &err), BS_OK);
    }
    if (step == 80) {
      bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
      co.min_bucket_changes = 1;
      co.min_change_ratio = 0;
      assert_int_equal(bs_compact(NULL, st, &co, &err), BS_OK);
    }
  }
  snprintf(lsn, sizeof lsn, "%08d", ++n_lsn);
  assert_int_equal(bs_writer_commit(NULL, w, (bs_val){lsn, 8}, NULL, &err), BS_OK);
  bs_status status;
  assert_int_equal(bs_get_status(&status, st, &err), BS_OK);
  *head = status.last_persisted_op;
  bs_writer_close(w);
  bs_storage_close(st);
  *out = db;
}

/* text parameter of a number */
#define NUM(buf, v) (snprintf(buf, sizeof buf, "%llu", (unsigned long long)(v)), buf)

static int mirror_chunk(const bs_chunk *ch, void *payload) {
  pgt *t = payload;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    char id[24], type[24], ck[24], tgt[24];
    const char *v[9] = {ch->bucket.data,      NUM(id, o->op_id),      NUM(type, o->type),
                        NUM(ck, o->checksum), NUM(tgt, o->target_op), o->object_type.data,
                        o->object_id.data,    o->subkey.data,         o->data.data};
    int len[9] = {(int)ch->bucket.size,
                  0,
                  0,
                  0,
                  0,
                  (int)o->object_type.size,
                  (int)o->object_id.size,
                  (int)o->subkey.size,
                  (int)o->data.size};
    /* binary bytea, text numbers: $2..$5 are sent as text below */
    int fmt[9] = {1, 0, 0, 0, 0, 1, 1, 1, 1};
    for (int k = 5; k < 9; k++)
      if (!v[k] && len[k] == 0 && (o->type == BS_OP_PUT || (o->type == BS_OP_REMOVE && k < 8)))
        v[k] = ""; /* a carried field is present, also when empty */
    PGresult *r = PQexecParams(
        t->admin,
        "INSERT INTO bs_ops SELECT b.id, $2::bigint, $3::smallint, $4::bigint, $5::bigint,"
        " $6, $7, $8, $9 FROM bs_buckets b WHERE b.stream = 1 AND b.name = $1",
        9, NULL, v, len, fmt, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) fail_msg("mirror: %s", PQresultErrorMessage(r));
    PQclear(r);
  }
  return 0;
}

/* Schema 4's source records of the mirrored ops, and the buckets' running bytes: a row's memberships are the buckets whose
 * latest PUT/REMOVE of it is a PUT, in op order (the order of the save that wrote them), in
 * that schema's members encoding (u32be n, n x (u64be bucket, u64be op, u32be len, object_type,
 * u32be len, object_id), u32be 0 lookups). The ops' subkeys are of table 1, "t". */
static void mirror_records(pgt *t) {
  pgt_exec(t->admin,
           "INSERT INTO bs_tables VALUES (1, 't', 1); UPDATE bs_streams SET next_table_id = 2;"
           " UPDATE bs_buckets b SET bytes = (SELECT sum(coalesce(octet_length(object_type), 0)"
           "  + coalesce(octet_length(object_id), 0) + coalesce(octet_length(subkey), 0)"
           "  + coalesce(octet_length(data), 0)) FROM bs_ops o WHERE o.bucket = b.id);"
           " INSERT INTO bs_source (stream, table_id, replica_id, soft, mark, members, has_data)"
           " SELECT 1, 1, object_id, false, 0, int4send(count(*)::integer)"
           "  || string_agg(int8send(bucket) || int8send(op_id) || int4send(length(object_type))"
           "  || object_type || int4send(length(object_id)) || object_id, ''::bytea ORDER BY op_id)"
           "  || int4send(0), false"
           " FROM (SELECT DISTINCT ON (bucket, object_id) * FROM bs_ops WHERE type IN (1, 2)"
           "  ORDER BY bucket, object_id, op_id DESC) l WHERE type = 1 GROUP BY object_id");
}

/* The same saves and commit on a memory and a PostgreSQL writer (after the migration): updates
 * of the mirrored rows into other buckets, deletes. */
static void more_saves(bs_storage *st) {
  bs_error err = {0};
  bs_writer *w = NULL;
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  rnd_state = 99;
  for (int step = 0; step < 40; step++) random_save(w, 5);
  assert_int_equal(bs_writer_commit(NULL, w, (bs_val){"99999999", 8}, NULL, &err), BS_OK);
  bs_writer_close(w);
}

static void count_problem(const char *problem, void *payload) {
  fprintf(stderr, "verify: %s\n", problem);
  ++*(int *)payload;
}

/* the first C of a torn span: the memory backend answers BS_EINVALIDATED from there */
static uint64_t torn_start(bs_storage *mst, bs_val b, uint64_t clear_op) {
  bs_checksum cs;
  bs_error err;
  uint64_t c = clear_op;
  while (c > 0 && bs_get_checksums(&cs, mst, c - 1, &b, 1, &err) == BS_EINVALIDATED) c--;
  return c;
}

static int first_op_cb(const bs_chunk *ch, void *payload) {
  bs_op *first = payload;
  if (first->op_id == 0 && ch->n_ops) *first = ch->ops[0];
  return 0;
}

static int mirror_bucket(const bs_bucket_info *info, void *payload) {
  void **ctx = payload;
  pgt *t = ctx[0];
  bs_storage *mst = ctx[1];
  uint64_t head = *(uint64_t *)ctx[2];
  bs_error err = {0};
  bs_bucket_request req = {info->name, 0};
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_op first = {0};
  char ck[24], n[24], last[24], cs[24], co[24];
  int more = 1;
  uint64_t clear_start = 0, clear_op = 0;
  bo.limit = 1;
  bs_get_bucket_data(&more, mst, head, &req, 1, &bo, first_op_cb, &first, &err);
  if (first.type == BS_OP_CLEAR) {
    clear_op = first.op_id;
    clear_start = torn_start(mst, info->name, clear_op);
    if (clear_start == clear_op) clear_op = clear_start = 0; /* no span left */
  }
  const char *v[6] = {info->name.data,          NUM(ck, info->checksum), NUM(n, info->count),
                      NUM(last, info->last_op), NUM(cs, clear_start),    NUM(co, clear_op)};
  int len[6] = {(int)info->name.size, 0, 0, 0, 0, 0};
  int fmt[6] = {1, 0, 0, 0, 0, 0};
  PGresult *r = PQexecParams(t->admin,
                             "INSERT INTO bs_buckets (stream, name, checksum, count, last_op,"
                             " clear_start, clear_op) VALUES (1, $1, $2::bigint, $3::bigint,"
                             " $4::bigint, $5::bigint, $6::bigint)",
                             6, NULL, v, len, fmt, 0);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) fail_msg("mirror: %s", PQresultErrorMessage(r));
  PQclear(r);
  bo.limit = 1000000;
  do {
    assert_int_equal(bs_get_bucket_data(&more, mst, head, &req, 1, &bo, mirror_chunk, t, &err),
                     BS_OK);
  } while (more);
  return 0;
}

/* Every chunk of a read as text, for comparing two backends. */
typedef struct dump {
  char *s;
  size_t n, cap;
} dump;

static void dump_add(dump *d, const char *fmt, ...) {
  va_list ap;
  char buf[512];
  int k;
  va_start(ap, fmt);
  k = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (d->n + (size_t)k + 1 > d->cap) {
    d->cap = (d->n + (size_t)k + 1) * 2;
    d->s = realloc(d->s, d->cap);
    assert_non_null(d->s);
  }
  memcpy(d->s + d->n, buf, (size_t)k + 1);
  d->n += (size_t)k;
}

static void dump_val(dump *d, bs_val v) {
  if (!v.data) {
    dump_add(d, " -");
    return;
  }
  if (v.size > 64) { /* t_reads_sizes' large ops: their size and hash */
    dump_add(d, " %zu:%016llx", v.size, (unsigned long long)XXH3_64bits(v.data, v.size));
    return;
  }
  dump_add(d, " '");
  for (size_t i = 0; i < v.size; i++) dump_add(d, "%02x", ((const unsigned char *)v.data)[i]);
  dump_add(d, "'");
}

static int dump_chunk(const bs_chunk *ch, void *payload) {
  dump *d = payload;
  dump_add(d, "chunk");
  dump_val(d, ch->bucket);
  dump_add(d, " %llu %llu %d %llu\n", (unsigned long long)ch->after,
           (unsigned long long)ch->next_after, ch->has_more, (unsigned long long)ch->target_op);
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    dump_add(d, "  %llu %d %u %llu", (unsigned long long)o->op_id, (int)o->type, o->checksum,
             (unsigned long long)o->target_op);
    dump_val(d, o->object_type);
    dump_val(d, o->object_id);
    dump_val(d, o->subkey);
    dump_val(d, o->data);
    dump_add(d, "\n");
  }
  return 0;
}

/* Reads every bucket from after with (limit, chunk_bytes, max_bytes), calling again while
 * has_more, at most max_calls times (0: no bound). */
static int read_all(bs_storage *st, uint64_t c, const uint64_t *after, size_t limit,
                    size_t chunk_bytes, size_t max_bytes, int max_calls, dump *d) {
  bs_bucket_request req[N_BUCKETS + 1];
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_error err = {0};
  int more = 0, rc, calls = 0;
  uint64_t pos[N_BUCKETS + 1];
  bo.limit = limit;
  bo.chunk_bytes = chunk_bytes;
  bo.max_bytes = max_bytes;
  for (int i = 0; i <= N_BUCKETS; i++) {
    const char *b = i < N_BUCKETS ? bucket_names[i] : "unknown";
    req[i].bucket = (bs_val){b, strlen(b)};
    pos[i] = after[i];
  }
  do {
    size_t mark;
    for (int i = 0; i <= N_BUCKETS; i++) req[i].after = pos[i];
    mark = d->n;
    rc = bs_get_bucket_data(&more, st, c, req, N_BUCKETS + 1, &bo, dump_chunk, d, &err);
    dump_add(d, "call %d rc %d more %d\n", calls++, rc, more);
    if (rc) return rc;
    /* the next call resumes each bucket after its last op served */
    for (const char *p = d->s + mark; (p = strstr(p, "chunk ")) != NULL; p++) {
      char hex[2 * 600 + 1] = {0};
      unsigned long long a, na;
      int hm;
      unsigned long long tg;
      if (sscanf(p, "chunk '%1200[0-9a-f]' %llu %llu %d %llu", hex, &a, &na, &hm, &tg) != 5)
        continue;
      for (int i = 0; i <= N_BUCKETS; i++) {
        char want[2 * 600 + 1] = {0};
        for (size_t k = 0; k < req[i].bucket.size; k++)
          sprintf(want + 2 * k, "%02x", ((const unsigned char *)req[i].bucket.data)[k]);
        if (!strcmp(want, hex)) pos[i] = na;
      }
    }
  } while (more && calls != max_calls);
  return BS_OK;
}

/* Schema 5's superseded log of the mirrored ops, a row per entry (migration 6 packs it): a PUT's
 * next PUT or REMOVE of its row in its bucket, a MOVE's target. */
static void mirror_log(pgt *t) {
  pgt_exec(t->admin,
           "INSERT INTO bs_superseded SELECT 1, bucket, op_id, nx FROM (SELECT bucket, op_id, type,"
           "  lead(op_id) OVER (PARTITION BY bucket, object_type, object_id ORDER BY op_id) AS nx"
           "  FROM bs_ops WHERE type IN (1, 2)) x WHERE type = 1 AND nx IS NOT NULL"
           " UNION ALL SELECT 1, bucket, op_id, target_op FROM bs_ops WHERE type = 3");
}

/* The superseded log as text, "bucket old new" lines by (bucket, old op): schema 5's rows
 * (packed 0) or schema 6's, decoded. */
static char *log_text(pgt *t, int packed) {
  PGresult *r = PQexecParams(t->admin,
                             packed ? "SELECT bucket, first_new, pairs FROM bs_superseded"
                                      " ORDER BY bucket, first_new"
                                    : "SELECT bucket, old_op, new_op FROM bs_superseded"
                                      " ORDER BY bucket, old_op",
                             0, NULL, NULL, NULL, NULL, 1);
  typedef struct ent {
    int64_t b;
    uint64_t o, n;
  } ent;
  ent *e = NULL;
  size_t n = 0, cap = 0;
  dump d = {0};
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  for (int i = 0; i < PQntuples(r); i++) {
    bs__pg_sups it;
    uint64_t o, nw;
    int k;
    bs__pg_sups_open(&it, bs__pg_bytes(r, i, 2), (uint64_t)bs__pg_i64(r, i, 1));
    if (!packed) {
      o = (uint64_t)bs__pg_i64(r, i, 1);
      nw = (uint64_t)bs__pg_i64(r, i, 2);
    }
    while (packed ? (k = bs__pg_sups_next(&it, &o, &nw)) == 1 : (k = 0, 1)) {
      if (n == cap) {
        cap = cap ? 2 * cap : 64;
        e = realloc(e, cap * sizeof *e);
        assert_non_null(e);
      }
      e[n++] = (ent){bs__pg_i64(r, i, 0), o, nw};
      if (!packed) break;
    }
    assert_int_equal(k, 0);
  }
  PQclear(r);
  for (size_t i = 1; i < n; i++) /* by (bucket, old op): rows of a bucket hold runs of it */
    for (size_t j = i;
         j > 0 && (e[j - 1].b > e[j].b || (e[j - 1].b == e[j].b && e[j - 1].o > e[j].o)); j--) {
      ent x = e[j];
      e[j] = e[j - 1];
      e[j - 1] = x;
    }
  dump_add(&d, "%zu entries\n", n);
  for (size_t i = 0; i < n; i++)
    dump_add(&d, "%lld %llu %llu\n", (long long)e[i].b, (unsigned long long)e[i].o,
             (unsigned long long)e[i].n);
  free(e);
  return d.s;
}

/* Every source record, decoded as schema 8 (bs__pg_srec8_decode) or 9 (bs__pg_srec_decode, its
 * table's name given) stores it, in (stream, table id, replica id) order: the text of each
 * record's key, mark, data flag, memberships and lookup keys. */
static char *records_text(pgt *t, int schema9) {
  const bs_allocator *a = &bs__default_allocator;
  dump d = {0};
  PGresult *r = PQexecParams(
      t->admin,
      schema9 ? "SELECT t.stream, t.id, t.name, s.replica_id, s.mark, s.members,"
                " s.data IS NOT NULL FROM bs_source s JOIN bs_tables t ON t.key = s.tkey"
                " ORDER BY 1, 2, s.replica_id"
              : "SELECT t.stream, t.id, t.name, s.replica_id, s.mark, s.members,"
                " s.data IS NOT NULL FROM bs_source s JOIN bs_tables t"
                " ON t.stream = s.stream AND t.id = s.table_id ORDER BY 1, 2, s.replica_id",
      0, NULL, NULL, NULL, NULL, 1);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  dump_add(&d, "%d records\n", PQntuples(r));
  for (int i = 0; i < PQntuples(r); i++) {
    bs_val rid = bs__pg_bytes(r, i, 3), v = bs__pg_bytes(r, i, 5);
    bs__srec rec = {0};
    int rc = schema9 ? bs__pg_srec_decode(a, v, bs__pg_bytes(r, i, 2), rid, &rec)
                     : bs__pg_srec8_decode(a, v, rid, &rec);
    assert_int_equal(rc, BS_OK);
    dump_add(&d, "%d %d", bs__pg_i32(r, i, 0), bs__pg_i32(r, i, 1));
    dump_val(&d, rid);
    dump_add(&d, " mark %s data %d:", PQgetisnull(r, i, 4) ? "-" : "set", bs__pg_bool(r, i, 6));
    if (!PQgetisnull(r, i, 4)) dump_add(&d, " %lld", (long long)bs__pg_i64(r, i, 4));
    for (uint32_t k = 0; k < rec.nm; k++) {
      dump_add(&d, " [%llu %llu", (unsigned long long)rec.m[k].bucket,
               (unsigned long long)rec.m[k].op);
      dump_val(&d, rec.m[k].object_type);
      dump_val(&d, rec.m[k].object_id);
      dump_add(&d, "]");
    }
    dump_add(&d, " lookups");
    for (uint32_t k = 0; k < rec.nl; k++) dump_val(&d, rec.lk[k]);
    dump_add(&d, "\n");
    bs__free(a, rec.m);
    bs__free(a, rec.lk);
  }
  PQclear(r);
  return d.s;
}

/* The ops of bs_chunks (schema 8), decoded: bucket id and op each, in (bucket, op id) order,
 * borrowed from *res (the caller clears it). */
typedef struct cop {
  int64_t bucket;
  bs_op op;
} cop;
static size_t chunk_ops(PGconn *c, const char *where, PGresult **res, cop **out) {
  char sql[512];
  static bs__pg_chunkr ch;
  size_t n = 0, cap = 0;
  cop *o = NULL;
  snprintf(sql, sizeof sql,
           "SELECT k.bucket, k.ops FROM bs_chunks k JOIN bs_buckets b ON b.id = k.bucket %s"
           " ORDER BY k.bucket, k.last_op",
           where);
  *res = PQexecParams(c, sql, 0, NULL, NULL, NULL, NULL, 1);
  assert_int_equal(PQresultStatus(*res), PGRES_TUPLES_OK);
  for (int i = 0; i < PQntuples(*res); i++) {
    assert_int_equal(bs__pg_chunk_open(&ch, bs__pg_bytes(*res, i, 1)), BS_OK);
    for (uint32_t j = 0; j < ch.n; j++) {
      if (n == cap) {
        cap = cap ? 2 * cap : 64;
        o = realloc(o, cap * sizeof *o);
        assert_non_null(o);
      }
      o[n].bucket = bs__pg_i64(*res, i, 0);
      assert_int_equal(bs__pg_chunk_op(&ch, j, &o[n].op), BS_OK);
      n++;
    }
  }
  *out = o;
  return n;
}

/* SUPERSEDED_PUTS on schema 8's chunks */
static long long superseded_puts(PGconn *c) {
  PGresult *r;
  cop *o;
  size_t n = chunk_ops(c, "", &r, &o);
  long long k = 0;
  for (size_t i = 0; i < n; i++) {
    if (o[i].op.type != BS_OP_PUT) continue;
    for (size_t j = i + 1; j < n && o[j].bucket == o[i].bucket; j++)
      if (bs__op_carries_row(o[j].op.type) &&
          bs__val_eq(o[j].op.object_type, o[i].op.object_type) &&
          bs__val_eq(o[j].op.object_id, o[i].op.object_id)) {
        k++;
        break;
      }
  }
  free(o);
  PQclear(r);
  return k;
}

/* The mirrored PUTs that a later PUT or REMOVE of their row in their bucket superseded (and so a
 * log entry names): incremental compaction turns them all into MOVEs. */
#define SUPERSEDED_PUTS                                                                            \
  "SELECT count(*) FROM (SELECT type, lead(op_id) OVER (PARTITION BY bucket, object_type,"         \
  " object_id ORDER BY op_id) AS nx FROM bs_ops WHERE type IN (1, 2)) x"                           \
  " WHERE type = 1 AND nx IS NOT NULL"

/* Every op as text, "bucket op type checksum target object_type object_id subkey data" lines
 * in (bucket, op) order: schema 7's rows (chunks 0) or schema 8's chunks, decoded. */
static char *ops_text(pgt *t, int chunks) {
  dump d = {0};
  PGresult *r;
  cop *o = NULL;
  size_t n;
  if (chunks) {
    n = chunk_ops(t->admin, "", &r, &o);
  } else {
    r = PQexecParams(t->admin,
                     "SELECT bucket, " BS_PG_OP_COLS ", data FROM bs_ops ORDER BY bucket, op_id", 0,
                     NULL, NULL, NULL, NULL, 1);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    n = (size_t)PQntuples(r);
    o = calloc(n ? n : 1, sizeof *o);
    assert_non_null(o);
    for (size_t i = 0; i < n; i++) {
      o[i].bucket = bs__pg_i64(r, (int)i, 0);
      o[i].op = bs__pg_op_row(r, (int)i, 1, 1);
      bs__op_fields(&o[i].op);
    }
  }
  dump_add(&d, "%zu ops\n", n);
  for (size_t i = 0; i < n; i++) {
    const bs_op *p = &o[i].op;
    dump_add(&d, "%lld %llu %d %u %llu '%.*s' '%.*s' '%.*s' '%.*s'%s\n", (long long)o[i].bucket,
             (unsigned long long)p->op_id, (int)p->type, (unsigned)p->checksum,
             (unsigned long long)p->target_op, (int)p->object_type.size,
             p->object_type.data ? (const char *)p->object_type.data : "", (int)p->object_id.size,
             p->object_id.data ? (const char *)p->object_id.data : "", (int)p->subkey.size,
             p->subkey.data ? (const char *)p->subkey.data : "", (int)p->data.size,
             p->data.data ? (const char *)p->data.data : "", p->data.data ? "" : " nodata");
  }
  free(o);
  PQclear(r);
  return d.s;
}

static void t_reads_mirror(void **state) {
  pgt *t = *state;
  bs_open_options nocache = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0};
  bs_db *mdb, *pdb, *pdb_cached;
  bs_storage *mst, *pst, *pcst;
  uint64_t head;
  int torn_seen = 0, checked = 0;
  int problems = 0;
  uint64_t verified = 0;
  nocache.checksum_cache_entries = (size_t)-1;
  mem_workload(&mdb, &head, 7);
  assert_int_equal(bs_storage_open(&mst, mdb, 1, &err), BS_OK);
  assert_int_equal(bs__pg_migrate(t->admin, 4, &err), BS_OK);
  pgt_exec(t->admin,
           "INSERT INTO bs_streams (id, name, state, hash, created_ms, snapshot_done, op_head,"
           " checkpoint, last_checkpoint_op, checkpoint_lsn)"
           " VALUES (1, 's', %d, %d, 0, true, %llu, %llu, %llu, '00000000')",
           BS_STREAM_ACTIVE, BS_HASH_XXH3, (unsigned long long)head, (unsigned long long)head,
           (unsigned long long)head);
  void *ctx[3] = {t, mst, &head};
  assert_int_equal(bs_list_buckets(mst, (bs_val){NULL, 0}, mirror_bucket, ctx, &err), BS_OK);
  mirror_records(t);
  /* read-only: refused before the migration; read-write: migrated, the data as it was */
  bs_open_options ro = BS_OPEN_OPTIONS_INIT;
  ro.flags = BS_OPEN_RDONLY;
  assert_int_equal(bs_open(&pdb, t->url, &ro, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 4, older than this build's 9"));
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_source") >= 3);
  /* a record of two memberships */
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_source WHERE get_byte(members, 3) > 1"));
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_ops WHERE checksum >= 2147483648") > 0);
  /* schema 5 (migration 5: integer checksums, varint members), then its superseded log */
  assert_int_equal(bs__pg_migrate(t->admin, 5, &err), BS_OK);
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_ops WHERE checksum < 0") > 0);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_buckets WHERE max_op_bytes = 0"), 0);
  mirror_log(t);
  char *log5 = log_text(t, 0);
  long long rows5 = pgt_int(t->admin, "SELECT count(*) FROM bs_superseded");
  long long buckets5 = pgt_int(t->admin, "SELECT count(DISTINCT bucket) FROM bs_superseded");
  assert_true(rows5 > 2 * buckets5); /* buckets of several entries */
  assert_true(pgt_int(t->admin, SUPERSEDED_PUTS) > 0);
  assert_int_equal(bs_open(&pdb, t->url, &ro, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 5, older than this build's 9"));
  /* migration 6: a row per bucket (fewer than 4096 entries each), the same entries */
  assert_int_equal(bs__pg_migrate(t->admin, 6, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_superseded"), buckets5);
  char *log6 = log_text(t, 1);
  assert_string_equal(log6, log5);
  free(log5);
  free(log6);
  /* schema 6's source records, and a soft-deleted one (marked at the op head; the next
   * checkpoint purges it), for migration 7 */
  pgt_exec(t->admin,
           "INSERT INTO bs_source (stream, table_id, replica_id, soft, mark, members, has_data)"
           " VALUES (1, 1, 'gone', true, %llu, '\\x0000', false)",
           (unsigned long long)head);
  long long records = pgt_int(t->admin, "SELECT count(*) FROM bs_source");
  /* every mirrored membership's object_id is its record's replica id (count below 128) */
  long long members7 = pgt_int(t->admin, "SELECT sum(octet_length(members)"
                                         " - get_byte(members, 0) * octet_length(replica_id))"
                                         " FROM bs_source");
  assert_int_equal(bs_open(&pdb, t->url, &ro, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 6, older than this build's 9"));
  long long ops7 = pgt_int(t->admin, "SELECT count(*) FROM bs_ops"),
            sum7 = pgt_int(t->admin, "SELECT (sum(checksum::bigint) %% 4294967296 + 4294967296)"
                                     " %% 4294967296 FROM bs_ops");
  char *ops_dump7 = ops_text(t, 0);
  /* migrations 7 and 8 (below), then 9 by the open: every record decoded as schema 9 stores it
   * equal to the schema-8 one, in fewer bytes */
  assert_int_equal(bs__pg_migrate(t->admin, 8, &err), BS_OK);
  char *records8 = records_text(t, 0);
  long long members8 = pgt_int(t->admin, "SELECT sum(octet_length(members)) FROM bs_source");
  /* migration 7: the mark only on the soft-deleted record, object_ids of one byte */
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), records);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source WHERE mark IS NULL"),
                   records - 1);
  assert_int_equal(pgt_int(t->admin, "SELECT mark FROM bs_source WHERE replica_id = 'gone'"),
                   (long long)head);
  assert_int_equal(members8, members7);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM information_schema.columns WHERE"
                                     " table_schema = current_schema() AND table_name = 'bs_source'"
                                     " AND column_name IN ('soft', 'has_data')"),
                   0);
  assert_int_equal(bs_open(&pdb, t->url, &ro, &err), BS_ECORRUPT);
  assert_non_null(strstr(err.msg, "version 8, older than this build's 9"));
  assert_int_equal(bs_open(&pdb, t->url, &nocache, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin, "SELECT value FROM bs_meta WHERE key = 'schema_version'"), 9);
  {
    char *records9 = records_text(t, 1);
    assert_string_equal(records9, records8);
    free(records9);
  }
  free(records8);
  assert_true(pgt_int(t->admin, "SELECT sum(octet_length(members)) FROM bs_source") < members8);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM information_schema.columns WHERE"
                                     " table_schema = current_schema() AND table_name = 'bs_source'"
                                     " AND column_name IN ('stream', 'table_id')"),
                   0);
  /* migration 8: bs_ops gone, its ops in chunks, each op as it was */
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM pg_class WHERE relname = 'bs_ops'"
                                     " AND relnamespace = current_schema()::regnamespace"),
                   0);
  assert_int_equal(pgt_int(t->admin, "SELECT sum(n) FROM bs_chunks"), ops7);
  assert_int_equal(pgt_int(t->admin, "SELECT (sum(checksum::bigint) %% 4294967296 + 4294967296)"
                                     " %% 4294967296 FROM bs_chunks"),
                   sum7);
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_chunks") < ops7); /* runs, not rows */
  {
    char *ops_dump8 = ops_text(t, 1);
    assert_string_equal(ops_dump8, ops_dump7);
    free(ops_dump8);
  }
  free(ops_dump7);
  assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source"), records);
  assert_int_equal(bs_db_verify(&verified, pdb, count_problem, &problems, &err), BS_OK);
  assert_int_equal(problems, 0);
  assert_int_equal(bs_storage_open(&pst, pdb, 1, &err), BS_OK);
  pdb_cached = pgt_open(t->url, 0);
  assert_int_equal(bs_storage_open(&pcst, pdb_cached, 1, &err), BS_OK);
  /* checksums at every C, uncached and through the cache (which extends cached bases with
   * checksum_ranges); equal results, equal torn-read refusals */
  for (uint64_t c = 0; c <= head + 1; c++) {
    bs_val names[N_BUCKETS + 1];
    bs_checksum m[N_BUCKETS + 1], p[N_BUCKETS + 1], pc[N_BUCKETS + 1];
    for (int i = 0; i < N_BUCKETS; i++)
      names[i] = (bs_val){bucket_names[i], strlen(bucket_names[i])};
    names[N_BUCKETS] = (bs_val){"unknown", 7};
    for (int i = 0; i <= N_BUCKETS; i++) {
      int rm = bs_get_checksums(&m[i], mst, c, &names[i], 1, &err);
      int rp = bs_get_checksums(&p[i], pst, c, &names[i], 1, &err);
      int rpc = bs_get_checksums(&pc[i], pcst, c, &names[i], 1, &err);
      assert_int_equal(rp, rm);
      assert_int_equal(rpc, rm);
      torn_seen += rm == BS_EINVALIDATED;
      if (rm) continue;
      assert_int_equal(p[i].checksum, m[i].checksum);
      assert_int_equal(p[i].count, m[i].count);
      assert_int_equal(pc[i].checksum, m[i].checksum);
      assert_int_equal(pc[i].count, m[i].count);
      checked++;
    }
  }
  assert_true(torn_seen > 0); /* the compaction left a torn span: the check was exercised */
  assert_true(checked > 100);
  /* bucket data: every C, several positions, limits and chunk sizes; also one op per chunk
   * (chunk_bytes 0) and a byte cap per call */
  static const size_t limits[] = {1, 3, 1000};
  static const size_t chunks[] = {0, 30, 1024 * 1024};
  for (uint64_t c = 0; c <= head + 1; c += 1 + c / 8) {
    for (int li = 0; li < 3; li++)
      for (int ci = 0; ci < 3; ci++) {
        uint64_t after[N_BUCKETS + 1] = {0, c / 2, 0, c / 3, 0};
        dump dm = {0}, dp = {0};
        int rm = read_all(mst, c, after, limits[li], chunks[ci], li == 2 ? 50 : 0, 0, &dm);
        int rp = read_all(pst, c, after, limits[li], chunks[ci], li == 2 ? 50 : 0, 0, &dp);
        assert_int_equal(rp, rm);
        if (strcmp(dm.s, dp.s)) {
          fprintf(stderr, "C=%llu limit %zu chunk %zu\nmemory:\n%s\npostgres:\n%s\n",
                  (unsigned long long)c, limits[li], chunks[ci], dm.s, dp.s);
          fail();
        }
        free(dm.s);
        free(dp.s);
      }
  }
  /* writes after the migration: the REMOVEs of the converted memberships, the same ops */
  more_saves(mst);
  more_saves(pst);
  {
    bs_status ms, ps;
    uint64_t after[N_BUCKETS + 1] = {0, 0, 0, 0, 0};
    dump dm = {0}, dp = {0};
    assert_int_equal(bs_get_status(&ms, mst, &err), BS_OK);
    assert_int_equal(bs_get_status(&ps, pst, &err), BS_OK);
    assert_int_equal(ps.last_persisted_op, ms.last_persisted_op);
    assert_true(ms.last_persisted_op > head);
    assert_int_equal(read_all(mst, ms.last_persisted_op, after, 1000, 1024 * 1024, 0, 0, &dm),
                     BS_OK);
    assert_int_equal(read_all(pst, ms.last_persisted_op, after, 1000, 1024 * 1024, 0, 0, &dp),
                     BS_OK);
    assert_string_equal(dp.s, dm.s);
    free(dm.s);
    free(dp.s);
    /* the commit's checkpoint purged the soft-deleted record */
    assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_source WHERE replica_id = 'gone'"),
                     0);
    assert_int_equal(bs_db_verify(&verified, pdb, count_problem, &problems, &err), BS_OK);
    assert_int_equal(problems, 0);
  }
  /* incremental compaction reads the migrated log (and the writer's since): every superseded PUT
   * becomes a MOVE, the log is consumed, checksums stay the memory backend's, verify is clean */
  {
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats cs;
    bs_status ms;
    co.incremental_only = 1;
    co.min_age_ms = 0;
    assert_int_equal(bs_compact(&cs, pst, &co, &err), BS_OK);
    assert_true(cs.ops_moved > 0);
    assert_int_equal(superseded_puts(t->admin), 0);
    assert_int_equal(pgt_int(t->admin, "SELECT count(*) FROM bs_superseded"), 0);
    assert_int_equal(bs_get_status(&ms, mst, &err), BS_OK);
    for (int i = 0; i < N_BUCKETS; i++) {
      bs_val name = {bucket_names[i], strlen(bucket_names[i])};
      bs_checksum m, p;
      assert_int_equal(bs_get_checksums(&m, mst, ms.last_persisted_op, &name, 1, &err), BS_OK);
      assert_int_equal(bs_get_checksums(&p, pst, ms.last_persisted_op, &name, 1, &err), BS_OK);
      assert_int_equal(p.checksum, m.checksum); /* the count: a fold makes one CLEAR of many */
    }
    assert_int_equal(bs_db_verify(&verified, pdb, count_problem, &problems, &err), BS_OK);
    assert_int_equal(problems, 0);
  }
  bs_storage_close(pcst);
  bs_close(pdb_cached);
  bs_storage_close(pst);
  bs_close(pdb);
  bs_storage_close(mst);
  bs_close(mdb);
}

/* ---- reads of ops of very different sizes: the page bounds of bucket_data ---- */

/* One save on both writers: row id of table "t" into bucket b with len bytes of data, or (del)
 * the row's DELETE. */
static void save_both(bs_writer *const w[2], const char *b, const char *id, const char *data,
                      size_t len, int del) {
  bs_error err = {0};
  bs_row row = {{b, strlen(b)}, {"todos", 5}, {id, strlen(id)}, {data, len}};
  bs_save sv = BS_SAVE_INIT;
  sv.table = (bs_val){"t", 1};
  sv.tag = del ? BS_DELETE : BS_UPDATE;
  sv.after_id = (bs_val){id, strlen(id)};
  sv.before_id = sv.after_id;
  sv.rows = &row;
  sv.n_rows = del ? 0 : 1;
  for (int i = 0; i < 2; i++) assert_int_equal(bs_writer_save(w[i], &sv, &err), BS_OK);
}

/* A bucket's ops from 0: their sizes and ids (at most 999). */
typedef struct opsz {
  size_t n, size[999];
  uint64_t id[999];
} opsz;

static int sizes_cb(const bs_chunk *ch, void *payload) {
  opsz *z = payload;
  for (size_t i = 0; i < ch->n_ops; i++, z->n++) {
    const bs_op *o = &ch->ops[i];
    z->size[z->n] = o->object_type.size + o->object_id.size + o->subkey.size + o->data.size;
    z->id[z->n] = o->op_id;
  }
  return 0;
}

static void op_sizes(bs_storage *st, uint64_t c, const char *b, opsz *z) {
  bs_bucket_request req = {{b, strlen(b)}, 0};
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_error err = {0};
  int more;
  bo.limit = 999;
  z->n = 0;
  assert_int_equal(bs_get_bucket_data(&more, st, c, &req, 1, &bo, sizes_cb, z, &err), BS_OK);
  assert_false(more);
}

/* Bucket data of ops from 48 bytes to 15 MiB in one bucket, read with byte caps at and
 * around the sizes and running sums of the ops, equal on PostgreSQL and on the memory backend:
 * bucket "b" holds one op of BS_MAX_OP_DATA bytes of data among 1-byte and "" ones (its
 * max_op_bytes is larger than a page's bytes: every page of it is cut by the server);
 * "by_user[\"u1\"]" ops of 0..2000 bytes of data (small caps cut its pages on the server, the
 * others are plain keyset pages the chunker cuts); "z" only a CLEAR after a compaction, whose
 * max_op_bytes is then set to 0 (migration 5 leaves that for a bucket of ops without payload,
 * and it is an upper bound: verify agrees). */
static void t_reads_sizes(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db[2];
  bs_storage *st[2];
  bs_writer *w[2];
  char *data = malloc(BS_MAX_OP_DATA), id[16];
  opsz *sb = calloc(1, sizeof *sb), *su = calloc(1, sizeof *su);
  uint64_t head;
  size_t big = 0;
  int problems = 0;
  assert_non_null(data);
  memset(data, 'x', BS_MAX_OP_DATA);
  assert_int_equal(bs_open_memory(&db[0], NULL, &err), BS_OK);
  db[1] = pgt_open(t->url, 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(bs_stream_create(NULL, db[i], "s", NULL, &err), BS_OK);
    assert_int_equal(bs_storage_open(&st[i], db[i], 1, &err), BS_OK);
    assert_int_equal(bs_writer_open(&w[i], st[i], NULL, &err), BS_OK);
    assert_int_equal(bs_writer_snapshot_done(w[i], (bs_val){"0", 1}, &err), BS_OK);
  }
  rnd_state = 5;
  for (int k = 0; k < 120; k++) {
    snprintf(id, sizeof id, "r%d", k);
    save_both(w, "b", id, data, k == 60 ? BS_MAX_OP_DATA : k % 3 == 0 ? 0 : 1, 0);
    snprintf(id, sizeof id, "u%d", k % 40); /* updates: earlier ops become MOVEs */
    save_both(w, "by_user[\"u1\"]", id, data, (size_t)(rnd() % 2001), 0);
    snprintf(id, sizeof id, "z%d", k % 4);
    if (k < 8) save_both(w, "z", id, data, 3, k >= 4); /* 4 rows, then their DELETEs */
  }
  for (int i = 0; i < 2; i++) {
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
    bs_val zb = {"z", 1};
    bs_status s;
    assert_int_equal(bs_writer_commit(NULL, w[i], (bs_val){"00000001", 8}, NULL, &err), BS_OK);
    co.buckets = &zb;
    co.n_buckets = 1;
    assert_int_equal(bs_compact(NULL, st[i], &co, &err), BS_OK);
    assert_int_equal(bs_get_status(&s, st[i], &err), BS_OK);
    head = s.checkpoint;
  }
  assert_true(pgt_int(t->admin, "SELECT max_op_bytes FROM bs_buckets WHERE name = 'b'") >
              4 * 1024 * 1024);
  {
    PGresult *r;
    cop *o;
    size_t n = chunk_ops(t->admin, "WHERE b.name = 'z'", &r, &o), kept = 0;
    for (size_t i = 0; i < n; i++) kept += o[i].op.type != BS_OP_CLEAR;
    assert_int_equal(kept, 0);
    free(o);
    PQclear(r);
  }
  pgt_exec(t->admin, "UPDATE bs_buckets SET max_op_bytes = 0 WHERE name = 'z'");
  assert_int_equal(bs_db_verify(NULL, db[1], count_problem, &problems, &err), BS_OK);
  assert_int_equal(problems, 0);
  op_sizes(st[0], head, "b", sb);
  op_sizes(st[0], head, "by_user[\"u1\"]", su);
  assert_int_equal(sb->n, 120);
  for (size_t i = 0; i < sb->n; i++)
    if (sb->size[i] > BS_MAX_OP_DATA) big = i;
  assert_int_equal(big, 60);
  /* byte caps: each op size of "b", the big op's, the running sums of by_user's first ops, and
   * one byte either side of each */
  size_t caps[64], n_caps = 0;
  caps[n_caps++] = sb->size[0];
  caps[n_caps++] = sb->size[1];
  caps[n_caps++] = sb->size[big];
  for (size_t i = 0, next = 0, sum = 0; i < su->n && n_caps < 12; i++) {
    sum += su->size[i];
    if (i == next) caps[n_caps++] = sum, next += 1 + next / 2;
  }
  caps[n_caps++] = 4 * 1024 * 1024;
  for (size_t i = 0, n = n_caps; i < n; i++) {
    caps[n_caps++] = caps[i] + 1;
    if (caps[i] > 1) caps[n_caps++] = caps[i] - 1;
  }
  caps[n_caps++] = 0; /* the default: 16 MiB */
  static const size_t limits[] = {1, 3, 1000, 100000};
  static const size_t chunks[] = {0, 100, 1024 * 1024};
  int compared = 0;
  for (size_t ci = 0; ci < n_caps; ci++)
    for (int li = 0; li < 4; li++)
      /* from the start; "b" resumed just before its big op; "b" done, by_user from 0 */
      for (int from = 0; from < 3; from++) {
        uint64_t after[N_BUCKETS + 1] = {0, 0, 0, 0, 0};
        size_t chunk = chunks[(ci + (size_t)li + (size_t)from) % 3];
        dump dm = {0}, dp = {0};
        if (from == 1 && li % 2) continue; /* each read of the big op moves 15 MiB */
        after[0] = from == 1 ? sb->id[big - 1] : from == 2 ? sb->id[sb->n - 1] : 0;
        after[1] = from == 1 ? su->id[7] : 0;
        int rm = read_all(st[0], head, after, limits[li], chunk, caps[ci], 4, &dm);
        int rp = read_all(st[1], head, after, limits[li], chunk, caps[ci], 4, &dp);
        assert_int_equal(rp, rm);
        assert_int_equal(rm, BS_OK);
        if (strcmp(dm.s, dp.s)) {
          fprintf(stderr, "max_bytes %zu limit %zu chunk %zu from %d\nmemory:\n%s\npostgres:\n%s\n",
                  caps[ci], limits[li], chunk, from, dm.s, dp.s);
          fail();
        }
        compared++;
        free(dm.s);
        free(dp.s);
      }
  assert_true(compared > 300);
  for (int i = 0; i < 2; i++) {
    bs_writer_close(w[i]);
    bs_storage_close(st[i]);
    bs_close(db[i]);
  }
  free(sb);
  free(su);
  free(data);
}

/* ---- parameter sets, checkpoint changes, the bucket list: entries as a writer keeps them ---- */

static void hex(char *out, const void *p, size_t n) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
  out[2 * n] = '\0';
}

/* One parameter entry of stream 1; rows NULL = a tombstone. */
static void param(pgt *t, bs_val key, uint64_t op, int table, const char *rid,
                  const char *const *rows, int n) {
  char sql[4096], k[2 * 481], r[2 * 64], *p;
  hex(k, key.data, key.size);
  hex(r, rid, strlen(rid));
  p = sql + sprintf(sql, "INSERT INTO bs_params VALUES (1, '\\x%s', %llu, %d, '\\x%s', ", k,
                    (unsigned long long)op, table, r);
  if (!n) p += sprintf(p, "'{}'");
  for (int i = 0; i < n; i++) {
    char h[2 * 64 + 1];
    hex(h, rows[i], strlen(rows[i]));
    p += sprintf(p, "%s'\\x%s'::bytea%s", i ? ", " : "ARRAY[", h, i == n - 1 ? "]" : "");
  }
  sprintf(p, ")");
  pgt_exec(t->admin, "%s", sql);
}

typedef struct rowlist {
  int n;
  char row[32][64];
  size_t size[32];
  int null_seen;
} rowlist;

static int collect_row(const bs_val *v, void *payload) {
  rowlist *l = payload;
  assert_true(l->n < 32);
  if (!v->data) l->null_seen = 1;
  memcpy(l->row[l->n], v->data, v->size);
  l->size[l->n++] = v->size;
  return 0;
}

static int stop_row(const bs_val *v, void *payload) {
  (*(int *)payload)++;
  return 9;
}

static void t_parameter_sets(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  unsigned char big[BS_MAX_LOOKUP_KEY];
  bs_val k_empty = {"", 0}, k1 = {"k", 1}, k_big = {big, sizeof big}, k_utf = {"\xc3\xa9", 2},
         none = {"none", 4};
  const char *r1[] = {"{\"a\":1}"}, *r2[] = {"{\"b\":2}", ""}, *r3[] = {"{\"c\":3}"};
  rowlist l;
  int calls = 0;
  memset(big, 0xfe, sizeof big);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  /* k1: row (1,"a") put at 2, replaced at 6, tombstoned at 9; row (1,"b") at 3; row (2,"a") at 4 */
  param(t, k1, 2, 1, "a", r1, 1);
  param(t, k1, 3, 1, "b", r2, 2);
  param(t, k1, 4, 2, "a", r3, 1);
  param(t, k1, 6, 1, "a", r3, 1);
  param(t, k1, 9, 1, "a", NULL, 0);
  param(t, k_empty, 5, 1, "x", r1, 1);
  param(t, k_big, 7, 3, "", r2, 2); /* an empty replica id is a value */
  param(t, k_utf, 8, 1, "y", r3, 1);
  /* at C = 1 nothing; at 2 one row */
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_get_parameter_sets(st, 1, &k1, 1, 100, collect_row, &l, &err), BS_OK);
  assert_int_equal(l.n, 0);
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_get_parameter_sets(st, 2, &k1, 1, 100, collect_row, &l, &err), BS_OK);
  assert_int_equal(l.n, 1);
  assert_memory_equal(l.row[0], "{\"a\":1}", 7);
  /* at 8: (1,"a") is its entry of 6; the rows come in (table, XXH3 of the replica id) order:
   * table 1's two rows first, in the order of their hashes, then table 2's */
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_get_parameter_sets(st, 8, &k1, 1, 100, collect_row, &l, &err), BS_OK);
  assert_int_equal(l.n, 4);
  {
    uint64_t ha = XXH3_64bits("a", 1), hb = XXH3_64bits("b", 1);
    int a_first = ha < hb, ia = a_first ? 0 : 2, ib = a_first ? 1 : 0;
    assert_memory_equal(l.row[ia], "{\"c\":3}", 7);
    assert_int_equal(l.size[ib], 7);
    assert_memory_equal(l.row[ib], "{\"b\":2}", 7);
    assert_int_equal(l.size[ib + 1], 0); /* "" stays a present, empty row */
    assert_memory_equal(l.row[3], "{\"c\":3}", 7);
  }
  assert_int_equal(l.null_seen, 0);
  /* at 9 the tombstone drops (1,"a") */
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_get_parameter_sets(st, 9, &k1, 1, 100, collect_row, &l, &err), BS_OK);
  assert_int_equal(l.n, 3);
  /* several lookups: request order, a repeated key once, unknown keys nothing; edge keys */
  {
    bs_val ks[5] = {k_utf, k_empty, none, k_big, k_utf};
    memset(&l, 0, sizeof l);
    assert_int_equal(bs_get_parameter_sets(st, 100, ks, 5, 100, collect_row, &l, &err), BS_OK);
    assert_int_equal(l.n, 4);
    assert_memory_equal(l.row[0], "{\"c\":3}", 7);
    assert_memory_equal(l.row[1], "{\"a\":1}", 7);
    assert_memory_equal(l.row[2], "{\"b\":2}", 7);
    assert_int_equal(l.size[3], 0);
  }
  /* the limit: exactly reached is fine; one over fails before fn sees a row */
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_get_parameter_sets(st, 8, &k1, 1, 4, collect_row, &l, &err), BS_OK);
  assert_int_equal(bs_get_parameter_sets(st, 8, &k1, 1, 3, stop_row, &calls, &err), BS_ELIMIT);
  assert_string_equal(err.msg, "too many parameter results (limit was 3)");
  assert_int_equal(bs_get_parameter_sets(st, 8, &k1, 1, 0, stop_row, &calls, &err), BS_ELIMIT);
  assert_int_equal(calls, 0);
  /* fn's value stops the call: BS_EUSER */
  assert_int_equal(bs_get_parameter_sets(st, 8, &k1, 1, 100, stop_row, &calls, &err), BS_EUSER);
  assert_int_equal(calls, 1);
  /* below the parameter-compaction horizon: BS_ESTALE */
  pgt_exec(t->admin, "UPDATE bs_streams SET param_horizon = 5 WHERE id = 1");
  assert_int_equal(bs_get_parameter_sets(st, 4, &k1, 1, 100, collect_row, &l, &err), BS_ESTALE);
  assert_int_equal(bs_get_parameter_sets(st, 5, &k1, 1, 100, stop_row, &calls, &err), BS_EUSER);
  bs_storage_close(st);
  bs_close(db);
}

/* A change record of stream 1: ops [first, last], flags, lists as SQL array literals. */
static void change(pgt *t, uint64_t first, uint64_t last, int seq, int flags, const char *buckets,
                   const char *lookups, const char *users) {
  char sql[1024];
  snprintf(sql, sizeof sql,
           "INSERT INTO bs_changes VALUES (1, %llu, %d, %llu, %d, %s::bytea[], %s::bytea[],"
           " %s::bytea[])",
           (unsigned long long)last, seq, (unsigned long long)first, flags, buckets, lookups,
           users);
  pgt_exec(t->admin, "%s", sql);
}

typedef struct changes_seen {
  int inv_data, inv_params;
  size_t n_buckets;
  char got[3][512];
} changes_seen;

static void join_sorted(char *out, const bs_val *v, size_t n) {
  char items[64][64];
  size_t k = 0;
  assert_true(n <= 64);
  for (size_t i = 0; i < n; i++) {
    snprintf(items[i], sizeof items[i], "%.*s", (int)v[i].size, (const char *)v[i].data);
  }
  for (size_t i = 0; i < n; i++) /* insertion sort: a set compares in any order */
    for (size_t j = i; j > 0 && strcmp(items[j - 1], items[j]) > 0; j--) {
      char tmp[64];
      strcpy(tmp, items[j]);
      strcpy(items[j], items[j - 1]);
      strcpy(items[j - 1], tmp);
    }
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) k += (size_t)sprintf(out + k, "%s%s", i ? "," : "", items[i]);
}

static int collect_changes(const bs_checkpoint_changes *c, void *payload) {
  changes_seen *s = payload;
  s->inv_data = c->invalidate_data_buckets;
  s->inv_params = c->invalidate_parameter_buckets;
  s->n_buckets = c->n_updated_buckets;
  if (c->n_updated_buckets <= 64) join_sorted(s->got[0], c->updated_buckets, c->n_updated_buckets);
  join_sorted(s->got[1], c->updated_lookups, c->n_updated_lookups);
  join_sorted(s->got[2], c->updated_write_checkpoint_users, c->n_updated_write_checkpoint_users);
  return 0;
}

#define BS_CHANGES_MAX_TEST                                                                        \
  1000 /* the change-record cap (contract.md 5.1), the reference service's */

static changes_seen changes_of(bs_storage *st, uint64_t from, uint64_t to) {
  changes_seen s;
  bs_error err = {0};
  memset(&s, 0, sizeof s);
  int rc = bs_get_checkpoint_changes(st, from, to, collect_changes, &s, &err);
  if (rc) fail_msg("checkpoint_changes: %s", err.msg);
  return s;
}

static void t_checkpoint_changes(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  changes_seen s;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  change(t, 1, 4, 1, 0, "'{a,b}'", "'{k1}'", "'{}'");
  change(t, 5, 4, 2, 1, "'{}'", "'{}'", "'{u1}'"); /* a checkpoint record without ops at 4 */
  change(t, 5, 7, 3, 0, "'{b,c}'", "'{}'", "'{}'");
  change(t, 8, 9, 4, 0, "'{\"\"}'", "'{k2}'", "'{u2,u1}'"); /* an empty name is a value */
  s = changes_of(st, 0, 4);
  assert_string_equal(s.got[0], "a,b");
  assert_string_equal(s.got[1], "k1");
  assert_string_equal(s.got[2], "u1");
  assert_int_equal(s.inv_data + s.inv_params, 0);
  /* (4, 7]: only the second flush; users of the record at exactly `from` count (extras are
   * allowed, misses are not) */
  s = changes_of(st, 4, 7);
  assert_string_equal(s.got[0], "b,c");
  assert_string_equal(s.got[1], "");
  assert_string_equal(s.got[2], "u1");
  s = changes_of(st, 6, 9); /* a record that only partly meets the range counts */
  assert_string_equal(s.got[0], ",b,c");
  assert_string_equal(s.got[1], "k2");
  assert_string_equal(s.got[2], "u1,u2");
  s = changes_of(st, 9, 9);
  assert_string_equal(s.got[0], "");
  assert_string_equal(s.got[2], "u1,u2");
  s = changes_of(st, 10, 20);
  assert_string_equal(s.got[0], "");
  assert_string_equal(s.got[2], "");
  /* a too-many flag invalidates its kind only */
  change(t, 10, 12, 5, 2, "'{}'", "'{k3}'", "'{}'");
  s = changes_of(st, 9, 12);
  assert_int_equal(s.inv_data, 1);
  assert_int_equal(s.inv_params, 0);
  assert_string_equal(s.got[0], "");
  assert_string_equal(s.got[1], "k3");
  change(t, 13, 13, 6, 4, "'{d}'", "'{}'", "'{}'");
  s = changes_of(st, 12, 13);
  assert_int_equal(s.inv_data, 0);
  assert_int_equal(s.inv_params, 1);
  assert_string_equal(s.got[0], "d");
  /* more than the cap of distinct buckets: invalidate; exactly that many: listed */
  pgt_exec(t->admin,
           "INSERT INTO bs_changes SELECT 1, 20, 7, 14, 0,"
           " (SELECT array_agg(convert_to('x' || g, 'UTF8')) FROM generate_series(1, 1000) g),"
           " '{}', '{}'");
  pgt_exec(t->admin, "INSERT INTO bs_changes SELECT 1, 21, 8, 21, 0, '{x1, x2, y}', '{}', '{}'");
  s = changes_of(st, 13, 20);
  assert_int_equal(s.inv_data, 0);
  assert_int_equal(s.n_buckets, BS_CHANGES_MAX_TEST);
  s = changes_of(st, 13, 21);
  assert_int_equal(s.inv_data, 1);
  /* below the fence (a clear dropped the records): everything invalidated */
  pgt_exec(t->admin, "UPDATE bs_streams SET changes_fence = 5 WHERE id = 1");
  s = changes_of(st, 4, 7);
  assert_int_equal(s.inv_data, 1);
  assert_int_equal(s.inv_params, 1);
  assert_string_equal(s.got[2], "u1");
  s = changes_of(st, 5, 7);
  assert_int_equal(s.inv_data + s.inv_params, 0);
  /* a range of more than 10,000 ops (planned for its values) and a nearer one (the prepared
   * statement) give the same answers, also from inside a record that spans them */
  change(t, 22, 30004, 9, 0, "'{e}'", "'{k4}'", "'{}'");
  change(t, 30005, 30004, 10, 0, "'{}'", "'{}'", "'{u3}'");
  for (int wide = 0; wide < 2; wide++) {
    s = changes_of(st, wide ? 21 : 29990, wide ? 29000 : 29995);
    assert_int_equal(s.inv_data + s.inv_params, 0);
    assert_string_equal(s.got[0], "e");
    assert_string_equal(s.got[1], "k4");
    assert_string_equal(s.got[2], "");
    s = changes_of(st, wide ? 21 : 30000, 30004);
    assert_string_equal(s.got[0], "e");
    assert_string_equal(s.got[2], "u3");
    s = changes_of(st, 30004, wide ? 40005 : 30004);
    assert_string_equal(s.got[0], "");
    assert_string_equal(s.got[2], "u3");
  }
  bs_storage_close(st);
  bs_close(db);
}

typedef struct listed {
  int n, stop_after;
  char names[8][64];
  bs_bucket_info info[8];
} listed;

static int collect_bucket(const bs_bucket_info *info, void *payload) {
  listed *l = payload;
  assert_true(l->n < 8);
  snprintf(l->names[l->n], sizeof l->names[0], "%.*s", (int)info->name.size,
           (const char *)info->name.data);
  l->info[l->n++] = *info;
  return l->n == l->stop_after ? 5 : 0;
}

static void t_list_buckets(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  listed l;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_stream_create(NULL, db, "other", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  /* byte order, shorter prefix first; an emptied bucket (count 0) is not listed; another
   * stream's bucket of the same name is its own */
  pgt_exec(t->admin,
           "INSERT INTO bs_buckets (stream, name, checksum, count, last_op, bytes,"
           " generation, compacted_count, compacted_op) VALUES"
           " (1, 'b', 4294967295, 3, 9, 100, 2, 1, 5), (1, 'a', 1, 1, 1, 10, 0, 0, 0),"
           " (1, 'ab', 2, 2, 4, 20, 0, 0, 0), (1, '\\xc3a9'::bytea, 3, 1, 6, 30, 0, 0, 0),"
           " (1, 'gone', 0, 0, 8, 0, 1, 0, 8), (2, 'a', 7, 7, 7, 7, 7, 7, 7),"
           " (1, 'c', 5, 4, 8, 40, 1, 4, 8)");
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_list_buckets(st, (bs_val){NULL, 0}, collect_bucket, &l, &err), BS_OK);
  assert_int_equal(l.n, 5);
  assert_string_equal(l.names[0], "a");
  assert_string_equal(l.names[1], "ab");
  assert_string_equal(l.names[2], "b");
  assert_string_equal(l.names[3], "c");
  assert_string_equal(l.names[4], "\xc3\xa9");
  assert_int_equal(l.info[2].checksum, 4294967295u);
  assert_int_equal(l.info[2].count, 3);
  assert_int_equal(l.info[2].last_op, 9);
  assert_int_equal(l.info[2].bytes, 100);
  assert_int_equal(l.info[2].generation, 2);
  assert_int_equal(l.info[2].changes, 2); /* 3 ops now, 1 after its compaction at 5 */
  assert_int_equal(l.info[3].changes, 0); /* nothing since its compaction */
  assert_int_equal(l.info[0].changes, 1); /* never compacted: all of them */
  /* strictly after start_after, which need not exist; "" lists everything */
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_list_buckets(st, (bs_val){"a", 1}, collect_bucket, &l, &err), BS_OK);
  assert_int_equal(l.n, 4);
  assert_string_equal(l.names[0], "ab");
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_list_buckets(st, (bs_val){"b0", 2}, collect_bucket, &l, &err), BS_OK);
  assert_int_equal(l.n, 2);
  assert_string_equal(l.names[0], "c");
  memset(&l, 0, sizeof l);
  assert_int_equal(bs_list_buckets(st, (bs_val){"", 0}, collect_bucket, &l, &err), BS_OK);
  assert_int_equal(l.n, 5);
  /* fn's value stops the listing: BS_EUSER */
  memset(&l, 0, sizeof l);
  l.stop_after = 2;
  assert_int_equal(bs_list_buckets(st, (bs_val){NULL, 0}, collect_bucket, &l, &err), BS_EUSER);
  assert_int_equal(l.n, 2);
  bs_storage_close(st);
  /* more than a page (1000 per statement): every bucket once, in order */
  pgt_exec(t->admin, "INSERT INTO bs_buckets (stream, name, checksum, count, last_op)"
                     " SELECT 2, convert_to(lpad(g::text, 5, '0'), 'UTF8'), g, 1, g"
                     " FROM generate_series(1, 2500) g");
  assert_int_equal(bs_storage_open(&st, db, 2, &err), BS_OK);
  {
    long long n = pgt_int(t->admin, "SELECT count(*) FROM bs_buckets WHERE stream = 2");
    int total = 0, rc;
    bs_val after = {NULL, 0};
    char last[64] = "";
    /* page through with start_after, 8 at a time, as storage.h suggests */
    do {
      memset(&l, 0, sizeof l);
      l.stop_after = 8;
      rc = bs_list_buckets(st, after, collect_bucket, &l, &err);
      assert_true(rc == BS_EUSER || rc == BS_OK);
      for (int i = 0; i < l.n; i++) {
        assert_true(strcmp(l.names[i], last) > 0);
        strcpy(last, l.names[i]);
      }
      total += l.n;
      after = (bs_val){last, strlen(last)};
    } while (rc == BS_EUSER);
    assert_int_equal(total, n);
  }
  bs_storage_close(st);
  bs_close(db);
}

/* ---- the writer without saves, write checkpoints, clear: against the memory backend ---- */

typedef struct pair {
  bs_db *db[2]; /* 0: memory, 1: PostgreSQL */
  bs_storage *st[2];
  bs_writer *w[2];
} pair;

static int same_conn(const bs_head *a, const bs_head *b) {
  return a->connection.size == b->connection.size &&
         !memcmp(a->connection.data, b->connection.data, a->connection.size);
}

static void pair_open(pair *p, pgt *t) {
  bs_error err = {0};
  assert_int_equal(bs_open_memory(&p->db[0], NULL, &err), BS_OK);
  p->db[1] = pgt_open(t->url, 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(bs_stream_create(NULL, p->db[i], "s", NULL, &err), BS_OK);
    assert_int_equal(bs_storage_open(&p->st[i], p->db[i], 1, &err), BS_OK);
    assert_int_equal(bs_writer_open(&p->w[i], p->st[i], NULL, &err), BS_OK);
  }
}

static void pair_close(pair *p) {
  for (int i = 0; i < 2; i++) {
    bs_writer_close(p->w[i]);
    bs_storage_close(p->st[i]);
    bs_close(p->db[i]);
  }
}

static void same_status(pair *p) {
  bs_status s[2];
  bs_checkpoint cp[2];
  bs_error err = {0};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(bs_get_status(&s[i], p->st[i], &err), BS_OK);
    assert_int_equal(bs_get_checkpoint(&cp[i], p->st[i], &err), BS_OK);
  }
  assert_int_equal(s[1].state, s[0].state);
  assert_int_equal(s[1].snapshot_done, s[0].snapshot_done);
  assert_int_equal(s[1].checkpoint, s[0].checkpoint);
  assert_int_equal(s[1].has_lsn, s[0].has_lsn);
  assert_int_equal(s[1].lsn_size, s[0].lsn_size);
  assert_memory_equal(s[1].lsn, s[0].lsn, s[0].lsn_size);
  assert_int_equal(s[1].has_resume_lsn, s[0].has_resume_lsn);
  assert_int_equal(s[1].resume_lsn_size, s[0].resume_lsn_size);
  assert_memory_equal(s[1].resume_lsn, s[0].resume_lsn, s[0].resume_lsn_size);
  assert_int_equal(cp[1].op_id, cp[0].op_id);
  assert_int_equal(cp[1].has_lsn, cp[0].has_lsn);
}

static void t_writer_commits(void **state) {
  pgt *t = *state;
  pair p;
  bs_error err = {0};
  /* LSNs with edge values: "", one byte, a shorter prefix, 255 bytes, non-ASCII */
  char longest[BS_MAX_LSN];
  memset(longest, 'z', sizeof longest);
  const bs_val lsns[] = {{"", 0},         {"5", 1}, {"50", 2},
                         {"4", 1},        {"9", 1}, {longest, sizeof longest},
                         {"\xc3\xa9", 2}, {"5", 1}};
  pair_open(&p, t);
  rnd_state = 3;
  int created = 0, skipped_empty = 0, blocked = 0;
  for (int step = 0; step < 200; step++) {
    bs_val lsn = lsns[rnd() % 8];
    int what = (int)(rnd() % 12), rc[2];
    if (what == 0 && step > 20) lsn = lsns[rnd() % 3]; /* keep later snapshots low */
    if (what > 5) what = 4 + what % 2;
    bs_commit_result r[2];
    uint64_t last[2] = {0, 0};
    memset(r, 0x55, sizeof r);
    for (int i = 0; i < 2; i++) {
      bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
      co.create_empty = (int)(rnd_state % 3) - 1;
      switch (what) {
      case 0:
        rc[i] = bs_writer_snapshot_done(p.w[i], lsn, &err);
        break;
      case 1:
        rc[i] = bs_writer_resume_lsn(p.w[i], lsn, &err);
        break;
      case 2:
        rc[i] = bs_writer_keepalive(&r[i], p.w[i], lsn, &err);
        break;
      case 3:
        rc[i] = bs_writer_flush(&last[i], p.w[i], &err);
        break;
      default:
        rc[i] = bs_writer_commit(&r[i], p.w[i], lsn, &co, &err);
        break;
      }
    }
    assert_int_equal(rc[1], rc[0]);
    if (what >= 2 && what != 3) {
      assert_int_equal(r[1].checkpoint_blocked, r[0].checkpoint_blocked);
      assert_int_equal(r[1].checkpoint_created, r[0].checkpoint_created);
      assert_int_equal(r[1].checkpoint, r[0].checkpoint);
      assert_int_equal(r[1].blocked_reason, r[0].blocked_reason);
      created += r[0].checkpoint_created;
      blocked += r[0].checkpoint_blocked;
      skipped_empty += !r[0].checkpoint_created && !r[0].checkpoint_blocked;
    }
    assert_int_equal(last[1], last[0]);
    same_status(&p);
  }
  /* every outcome was seen: created, blocked, and an empty commit that made none */
  assert_true(created > 0 && blocked > 0 && skipped_empty > 0);
  /* the first checkpoint activated the stream; a newer stream's first checkpoint stops it */
  {
    bs_status s;
    bs_storage *st2;
    bs_writer *w2;
    assert_int_equal(bs_get_status(&s, p.st[1], &err), BS_OK);
    assert_int_equal(s.state, BS_STREAM_ACTIVE);
    assert_int_equal(bs_stream_create(NULL, p.db[1], "s2", NULL, &err), BS_OK);
    assert_int_equal(bs_storage_open(&st2, p.db[1], 2, &err), BS_OK);
    assert_int_equal(bs_writer_open(&w2, st2, NULL, &err), BS_OK);
    assert_int_equal(bs_writer_snapshot_done(w2, (bs_val){"1", 1}, &err), BS_OK);
    assert_int_equal(bs_writer_commit(NULL, w2, (bs_val){"1", 1}, NULL, &err), BS_OK);
    assert_int_equal(bs_get_status(&s, st2, &err), BS_OK);
    assert_int_equal(s.state, BS_STREAM_ACTIVE);
    assert_int_equal(bs_get_status(&s, p.st[1], &err), BS_OK);
    assert_int_equal(s.state, BS_STREAM_STOPPED);
    bs_writer_close(w2);
    bs_storage_close(st2);
  }
  pair_close(&p);
}

/* One streaming and one snapshot writer per stream across processes and hosts (two handles
 * stand for two hosts): another handle's writer, as a second one of the same handle, is
 * BS_EBUSY until the holder closes. */
static void t_writer_lock(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *a = pgt_open(t->url, 0), *b = pgt_open(t->url, 0);
  bs_storage *sa, *sb, *sb2;
  bs_writer *wa, *wa2 = NULL, *wb = NULL, *snap_a, *snap_b = NULL;
  bs_writer_options snap = BS_WRITER_OPTIONS_INIT;
  snap.snapshot = 1;
  assert_int_equal(bs_stream_create(NULL, a, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_stream_create(NULL, a, "t", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sa, a, 1, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sb, b, 1, &err), BS_OK);
  assert_int_equal(bs_storage_open(&sb2, b, 2, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wa, sa, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_EBUSY);
  assert_null(wb);
  assert_non_null(strstr(err.msg, "already has a streaming writer"));
  assert_int_equal(bs_writer_open(&wa2, sa, NULL, &err), BS_EBUSY); /* the same handle */
  assert_null(wa2);
  /* a snapshot writer beside the streaming one (storage.h, bs_writer_open), one per host */
  assert_int_equal(bs_writer_open(&snap_a, sa, &snap, &err), BS_OK);
  assert_int_equal(bs_writer_open(&snap_b, sb, &snap, &err), BS_EBUSY);
  /* another stream is free */
  assert_int_equal(bs_writer_open(&wb, sb2, NULL, &err), BS_OK);
  bs_writer_close(wb);
  bs_writer_close(wa);
  assert_int_equal(bs_writer_open(&wb, sb, NULL, &err), BS_OK);
  bs_writer_close(wb);
  bs_writer_close(snap_a);
  assert_int_equal(bs_writer_open(&snap_b, sb, &snap, &err), BS_OK);
  bs_writer_close(snap_b);
  /* a terminated stream takes no writer */
  assert_int_equal(bs_terminate(sb2, 0, &err), BS_OK);
  assert_int_equal(bs_writer_open(&wb, sb2, NULL, &err), BS_ESTATE);
  bs_storage_close(sb2);
  bs_storage_close(sb);
  bs_storage_close(sa);
  bs_close(b);
  bs_close(a);
}

static void t_write_checkpoints(void **state) {
  pgt *t = *state;
  pair p;
  bs_error err = {0};
  static const char *const users[] = {"u1", "u1/c1", "", "\xc3\xa9"};
  static const char *const conns[] = {"main", "", "other"};
  pair_open(&p, t);
  for (int i = 0; i < 2; i++)
    assert_int_equal(bs_writer_snapshot_done(p.w[i], (bs_val){"0", 1}, &err), BS_OK);
  int stored = 0, deleted = 0, hits = 0;
  rnd_state = 11;
  for (int step = 0; step < 500; step++) {
    int what = (int)(rnd() % 5);
    if (what == 0) { /* a batch of managed requests, with duplicates per user */
      bs_managed_request req[4];
      bs_head heads[4][2];
      uint64_t ids[2][4];
      int adv[2], rc[2];
      size_t n = 1 + rnd() % 4;
      for (size_t k = 0; k < n; k++) {
        const char *u = users[rnd() % 4];
        memset(&req[k], 0, sizeof req[k]);
        req[k].user_id = (bs_val){u, strlen(u)};
        req[k].n_heads = rnd() % 3;
        for (size_t h = 0; h < req[k].n_heads; h++) {
          static const char *const l[] = {"1", "3", "5", "7"};
          const char *c = conns[(h + rnd()) % 3], *x = l[rnd() % 4];
          heads[k][h].connection = (bs_val){c, strlen(c)};
          heads[k][h].lsn = (bs_val){x, 1};
        }
        if (req[k].n_heads == 2 && same_conn(&heads[k][0], &heads[k][1])) req[k].n_heads = 1;
        req[k].heads = heads[k];
        req[k].has_request_id = rnd() % 4 != 0;
        req[k].request_id = rnd() % 6;
        req[k].requested_at_ms = 1000 + (int64_t)step * 10 + (int64_t)(rnd() % 3);
      }
      for (int i = 0; i < 2; i++)
        rc[i] = bs_create_managed_write_checkpoints(ids[i], &adv[i], p.st[i], req, n, &err);
      assert_int_equal(rc[1], rc[0]);
      stored += rc[0] == BS_OK;
      if (!rc[0]) {
        assert_memory_equal(ids[1], ids[0], n * sizeof ids[0][0]);
        assert_int_equal(adv[1], adv[0]);
      }
    } else if (what <= 2) { /* a commit processes the records whose heads it reached */
      static const char *const l[] = {"1", "2", "3", "4", "5", "6", "7", "8"};
      bs_val lsn = {l[rnd() % 8], 1};
      for (int i = 0; i < 2; i++)
        assert_int_equal(bs_writer_keepalive(NULL, p.w[i], lsn, &err), BS_OK);
    } else if (what == 3) {
      uint64_t d[2];
      int64_t before = 1000 + (int64_t)step * 10 + 3 - (int64_t)(rnd() % 60);
      for (int i = 0; i < 2; i++)
        assert_int_equal(bs_delete_checkpoint_requests_before(&d[i], p.st[i], before, &err), BS_OK);
      assert_int_equal(d[1], d[0]);
      deleted += d[0];
    }
    /* every user's last write checkpoint, for some heads */
    for (int u = 0; u < 4; u++) {
      bs_head given[2] = {{{"main", 4}, {"4", 1}}, {{"other", 5}, {"9", 1}}};
      size_t ng = rnd() % 3;
      uint64_t id[2];
      int found[2];
      bs_val user = {users[u], strlen(users[u])};
      for (int i = 0; i < 2; i++)
        assert_int_equal(
            bs_last_write_checkpoint(&id[i], &found[i], p.st[i], user, given, ng, &err), BS_OK);
      assert_int_equal(found[1], found[0]);
      assert_int_equal(id[1], id[0]);
      hits += found[0];
    }
  }
  /* each kind of outcome happened often enough for a wrong rule to show */
  assert_true(stored > 30 && deleted > 5 && hits > 100);
  /* the edges, exactly: a head at the commit's LSN is reached; a request made at t is deleted
   * by a cleanup before t + 1, not before t */
  for (int i = 0; i < 2; i++) {
    bs_head h = {{"main", 4}, {"5", 1}};
    bs_managed_request r = {{"edge", 4}, &h, 1, 1, 50, 100}, keep = r;
    uint64_t id, d;
    int adv;
    bs_storage *est;
    bs_writer *ew;
    uint32_t sid;
    /* a stream of its own, whose commits are not blocked by the LSNs above */
    assert_int_equal(bs_stream_create(&sid, p.db[i], "edge", NULL, &err), BS_OK);
    assert_int_equal(bs_storage_open(&est, p.db[i], sid, &err), BS_OK);
    assert_int_equal(bs_writer_open(&ew, est, NULL, &err), BS_OK);
    assert_int_equal(bs_writer_snapshot_done(ew, (bs_val){"0", 1}, &err), BS_OK);
    keep.request_id = 1; /* lower than the stored id: changes nothing */
    assert_int_equal(bs_create_managed_write_checkpoints(&id, &adv, p.st[i], &r, 1, &err), BS_OK);
    assert_int_equal(id, 50);
    assert_int_equal(adv, 1);
    assert_int_equal(bs_writer_keepalive(NULL, ew, (bs_val){"5", 1}, &err), BS_OK);
    bs_writer_close(ew);
    bs_storage_close(est);
    assert_int_equal(bs_create_managed_write_checkpoints(&id, &adv, p.st[i], &keep, 1, &err),
                     BS_OK);
    assert_int_equal(id, 50);
    assert_int_equal(adv, 0); /* processed by the commit at "5" */
    assert_int_equal(bs_delete_checkpoint_requests_before(&d, p.st[i], 100, &err), BS_OK);
    assert_int_equal(d, 0);
    assert_int_equal(bs_delete_checkpoint_requests_before(&d, p.st[i], 101, &err), BS_OK);
    assert_int_equal(d, 1);
    /* ids never go backwards after cleanup: a generated id continues above 50 */
    r.has_request_id = 0;
    assert_int_equal(bs_create_managed_write_checkpoints(&id, &adv, p.st[i], &r, 1, &err), BS_OK);
    assert_int_equal(id, 51);
  }
  /* custom mode: no managed batches; reads the (empty) custom table */
  for (int i = 0; i < 2; i++) {
    bs_managed_request one = {{"u", 1}, NULL, 0, 0, 0, 0};
    uint64_t id;
    int found;
    assert_int_equal(bs_set_write_checkpoint_mode(p.st[i], BS_WCP_CUSTOM, (bs_val){"ev", 2}, &err),
                     BS_OK);
    assert_int_equal(bs_create_managed_write_checkpoints(&id, NULL, p.st[i], &one, 1, &err),
                     BS_ESTATE);
    assert_int_equal(
        bs_last_write_checkpoint(&id, &found, p.st[i], (bs_val){"u1", 2}, NULL, 0, &err), BS_OK);
    assert_int_equal(found, 0);
  }
  {
    bs_stat s;
    assert_int_equal(bs_db_stat(&s, p.db[1], &err), BS_OK);
    assert_int_equal(s.streams, 2);
    assert_true(s.file_bytes > 0);
  }
  pair_close(&p);
}

/* Puts one chunk into bs_chunks: ops first..last of bucket `name` (stream 1), PUTs of empty
 * strings whose checksum is their op id, as the writer encodes them (pg_chunk.c). */
static void put_chunk(PGconn *c, const char *name, uint64_t first, uint64_t last) {
  bs__pg_chunkb k;
  bs__pg_buf rows = {0};
  PGresult *r;
  char sql[256];
  int64_t id;
  memset(&k, 0, sizeof k);
  snprintf(sql, sizeof sql, "SELECT id FROM bs_buckets WHERE stream = 1 AND name = '%s'", name);
  id = pgt_int(c, "%s", sql);
  for (uint64_t i = first; i <= last; i++) {
    bs_op op = {0};
    op.op_id = i;
    op.type = BS_OP_PUT;
    op.checksum = (uint32_t)i;
    assert_int_equal(bs__pg_chunkb_add(&k, &bs__default_allocator, &rows, (uint64_t)id, &op),
                     BS_OK);
  }
  assert_int_equal(bs__pg_chunkb_end(&k, &bs__default_allocator, &rows, (uint64_t)id), BS_OK);
  r = PQexec(c, "BEGIN");
  PQclear(r);
  bs_error err = {0};
  assert_int_equal(bs__pg_copy_in(c, BS_PG_CHUNK_COPY, &rows, &bs__default_allocator, &err), BS_OK);
  r = PQexec(c, "COMMIT");
  PQclear(r);
  bs__pg_chunkb_free(&k, &bs__default_allocator);
  free(rows.p);
}

static void t_clear(void **state) {
  pgt *t = *state;
  bs_db *db = pgt_open(t->url, 0);
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w;
  bs_status s;
  bs_checksum cs;
  bs_val b = {"b", 1};
  bs_stat stat;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, (bs_val){"1", 1}, &err), BS_OK);
  pgt_exec(
      t->admin,
      "UPDATE bs_streams SET op_head = 3 WHERE id = 1;"
      " INSERT INTO bs_buckets (stream, name, checksum, count, last_op) VALUES (1, 'b', 6, 3, 3);"
      " INSERT INTO bs_params VALUES (1, 'k', 2, 1, 'r', '{x}');");
  put_chunk(t->admin, "b", 1, 3); /* ops 1..3: PUTs of checksum = op id */
  assert_int_equal(bs_writer_commit(NULL, w, (bs_val){"2", 1}, NULL, &err), BS_OK);
  assert_int_equal(bs_get_checksums(&cs, st, 3, &b, 1, &err), BS_OK);
  assert_int_equal(cs.count, 3);
  assert_int_equal(bs_db_stat(&stat, db, &err), BS_OK);
  assert_int_equal(stat.ops_put, 3);
  assert_int_equal(stat.buckets, 1);
  assert_int_equal(stat.parameter_entries, 1);
  assert_int_equal(bs_clear(st, &err), BS_OK);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_int_equal(s.checkpoint, 0);
  assert_int_equal(s.has_lsn, 0);
  assert_int_equal(s.snapshot_done, 0);
  assert_int_equal(s.last_persisted_op, 3); /* op ids are never reused */
  assert_int_equal(bs_get_checksums(&cs, st, 3, &b, 1, &err), BS_OK);
  assert_int_equal(cs.count, 0);
  assert_int_equal(bs_db_stat(&stat, db, &err), BS_OK);
  assert_int_equal(stat.ops_put + stat.buckets + stat.parameter_entries, 0);
  /* changes below the clear are unknown */
  {
    changes_seen c = changes_of(st, 0, 3);
    assert_int_equal(c.inv_data, 1);
  }
  assert_int_equal(bs_terminate(st, 0, &err), BS_OK);
  assert_int_equal(bs_writer_flush(NULL, w, &err), BS_ESTATE);
  assert_int_equal(bs_writer_commit(NULL, w, (bs_val){"3", 1}, NULL, &err), BS_ESTATE);
  assert_int_equal(bs_writer_snapshot_done(w, (bs_val){"3", 1}, &err), BS_ESTATE);
  assert_int_equal(bs_get_status(&s, st, &err), BS_OK);
  assert_int_equal(s.state, BS_STREAM_TERMINATED);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* ---- the writer's saves: one workload through memory and PostgreSQL, every read equal ---- */

static void workload(bs_db *db, uint64_t seed, int flush_often) {
  bs_error err = {0};
  bs_storage *st;
  bs_writer *w;
  bs_writer_options so = BS_WRITER_OPTIONS_INIT;
  char lsn[32];
  int n_lsn = 0;
  rnd_state = seed;
  so.snapshot = 1;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  /* a snapshot phase: INSERTs, repeated ones skipped */
  assert_int_equal(bs_writer_open(&w, st, &so, &err), BS_OK);
  for (int i = 0; i < 30; i++) {
    char id[16];
    bs_row row;
    bs_save sv = BS_SAVE_INIT;
    const char *b = bucket_names[rnd() % N_BUCKETS];
    snprintf(id, sizeof id, "r%d", (int)(rnd() % 12));
    row.bucket = (bs_val){b, strlen(b)};
    row.object_type = (bs_val){"todos", 5};
    row.object_id = (bs_val){id, strlen(id)};
    row.data = (bs_val){"{\"snap\":1}", 10};
    sv.table = (bs_val){"t", 1};
    sv.after_id = (bs_val){id, strlen(id)};
    sv.rows = &row;
    sv.n_rows = 1;
    sv.stored_data = (bs_val){"snap", 4};
    assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
  }
  assert_int_equal(bs_writer_flush(NULL, w, &err), BS_OK);
  bs_writer_close(w);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, (bs_val){"0", 1}, &err), BS_OK);
  for (int step = 0; step < 150; step++) {
    char id[16], id2[16], data[64], lk[16];
    bs_row rows[3];
    bs_val params[2] = {{"{\"p\":1}", 7}, {"", 0}};
    bs_lookup lks[2];
    bs_save sv = BS_SAVE_INIT;
    int k = (int)(rnd() % 4), tag = (int)(rnd() % 8);
    snprintf(id, sizeof id, "r%d", (int)(rnd() % 12));
    snprintf(id2, sizeof id2, "r%d", (int)(rnd() % 12));
    size_t len = rnd() % 4 == 0 ? 0 : rnd() % 4 == 0 ? 1 : 20;
    memset(data, 'a' + (int)(rnd() % 26), sizeof data);
    sv.table = rnd() % 5 == 0 ? (bs_val){"other", 5} : (bs_val){"t", 1};
    sv.tag = tag == 0 ? BS_DELETE : tag == 1 ? BS_INSERT : BS_UPDATE;
    sv.after_id = (bs_val){id, strlen(id)};
    sv.before_id = tag == 2 ? (bs_val){id2, strlen(id2)} : (bs_val){NULL, 0}; /* a key change */
    for (int i = 0; i < k; i++) {
      const char *b = bucket_names[rnd() % N_BUCKETS];
      rows[i].bucket = (bs_val){b, strlen(b)};
      rows[i].object_type = rnd() % 3 ? (bs_val){"todos", 5} : (bs_val){"", 0};
      rows[i].object_id = (bs_val){id, strlen(id)};
      rows[i].data = (bs_val){data, len};
    }
    sv.rows = rows;
    sv.n_rows = (size_t)k;
    for (int i = 0; i < 2; i++) {
      snprintf(lk, sizeof lk, "k%d", (int)(rnd() % 4));
      lks[i].key = (bs_val){strdup(lk), strlen(lk)};
      lks[i].params = params;
      lks[i].n_params = rnd() % 3;
    }
    sv.lookups = lks;
    sv.n_lookups = rnd() % 3;
    if (rnd() % 2) sv.stored_data = (bs_val){data, len};
    assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
    for (int i = 0; i < 2; i++) free((void *)lks[i].key.data);
    if (rnd() % 4 == 0 && flush_often) assert_int_equal(bs_writer_flush(NULL, w, &err), BS_OK);
    if (rnd() % 5 == 0) {
      snprintf(lsn, sizeof lsn, "%08d", ++n_lsn);
      assert_int_equal(bs_writer_commit(NULL, w, (bs_val){lsn, 8}, NULL, &err), BS_OK);
    }
    if (rnd() % 17 == 0)
      assert_int_equal(bs_writer_custom_write_checkpoint(w, (bs_val){"u", 1}, (uint64_t)step,
                                                         (bs_val){"e", 1}, &err),
                       BS_OK);
  }
  snprintf(lsn, sizeof lsn, "%08d", ++n_lsn);
  assert_int_equal(bs_writer_commit(NULL, w, (bs_val){lsn, 8}, NULL, &err), BS_OK);
  bs_writer_close(w);
  bs_storage_close(st);
}

typedef struct src_seen {
  int found;
  char data[64];
  size_t size;
  int null;
} src_seen;

static int src_cb(const bs_val *d, void *payload) {
  src_seen *s = payload;
  s->found = 1;
  s->null = d == NULL;
  if (d) {
    memcpy(s->data, d->data, d->size);
    s->size = d->size;
  }
  return 0;
}

static void t_writer_saves(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db[2];
  bs_storage *st[2];
  bs_status status[2];
  assert_int_equal(bs_open_memory(&db[0], NULL, &err), BS_OK);
  db[1] = pgt_open(t->url, 0);
  for (int i = 0; i < 2; i++) {
    workload(db[i], 5, i); /* the PostgreSQL side flushes more often: same result */
    assert_int_equal(bs_storage_open(&st[i], db[i], 1, &err), BS_OK);
    assert_int_equal(bs_get_status(&status[i], st[i], &err), BS_OK);
  }
  assert_int_equal(status[1].last_persisted_op, status[0].last_persisted_op);
  assert_int_equal(status[1].checkpoint, status[0].checkpoint);
  assert_true(status[0].last_persisted_op > 200);
  for (uint64_t c = 0; c <= status[0].last_persisted_op + 1; c++) {
    uint64_t after[N_BUCKETS + 1] = {0, c / 2, 0, c / 3, 0};
    dump dm = {0}, dp = {0};
    bs_val names[N_BUCKETS];
    bs_checksum cs[2][N_BUCKETS];
    for (int i = 0; i < N_BUCKETS; i++)
      names[i] = (bs_val){bucket_names[i], strlen(bucket_names[i])};
    assert_int_equal(read_all(st[0], c, after, 7, 100, 0, 0, &dm), BS_OK);
    assert_int_equal(read_all(st[1], c, after, 7, 100, 0, 0, &dp), BS_OK);
    if (strcmp(dm.s, dp.s)) {
      fprintf(stderr, "C=%llu\nmemory:\n%s\npostgres:\n%s\n", (unsigned long long)c, dm.s, dp.s);
      fail();
    }
    free(dm.s);
    free(dp.s);
    for (int i = 0; i < 2; i++)
      assert_int_equal(bs_get_checksums(cs[i], st[i], c, names, N_BUCKETS, &err), BS_OK);
    for (int i = 0; i < N_BUCKETS; i++) { /* by field: the padding is not part of the answer */
      assert_int_equal(cs[1][i].checksum, cs[0][i].checksum);
      assert_int_equal(cs[1][i].count, cs[0][i].count);
    }
    for (int k = 0; k < 4; k++) {
      char key[16];
      rowlist l[2];
      snprintf(key, sizeof key, "k%d", k);
      bs_val kv = {key, 2};
      for (int i = 0; i < 2; i++) {
        memset(&l[i], 0, sizeof l[i]);
        assert_int_equal(bs_get_parameter_sets(st[i], c, &kv, 1, 100, collect_row, &l[i], &err),
                         BS_OK);
      }
      assert_int_equal(l[1].n, l[0].n);
      for (int r = 0; r < l[0].n; r++) {
        assert_int_equal(l[1].size[r], l[0].size[r]);
        assert_memory_equal(l[1].row[r], l[0].row[r], l[0].size[r]);
      }
    }
  }
  /* the source records each backend ends with */
  for (int r = 0; r < 12; r++) {
    char id[16];
    src_seen s[2];
    int rc[2];
    snprintf(id, sizeof id, "r%d", r);
    for (int tb = 0; tb < 2; tb++) {
      bs_writer *w;
      for (int i = 0; i < 2; i++) {
        memset(&s[i], 0, sizeof s[i]);
        assert_int_equal(bs_writer_open(&w, st[i], NULL, &err), BS_OK);
        rc[i] = bs_writer_source_row(w, tb ? (bs_val){"other", 5} : (bs_val){"t", 1},
                                     (bs_val){id, strlen(id)}, src_cb, &s[i], &err);
        bs_writer_close(w);
      }
      assert_int_equal(rc[1], rc[0]);
      assert_int_equal(s[1].found, s[0].found);
      assert_int_equal(s[1].null, s[0].null);
      assert_int_equal(s[1].size, s[0].size);
      assert_memory_equal(s[1].data, s[0].data, s[0].size);
    }
  }
  for (int i = 0; i < 2; i++) {
    bs_storage_close(st[i]);
    bs_close(db[i]);
  }
}

/* ---- the codec's SQL spellings of the C enums (pg_internal.h, pg_codec.c) ---- */

/* Each spelling the server reads as the value of the C enum it spells, and every op type and
 * change flag has one; then what the writer stores (an op's type as its C value, through COPY)
 * and compaction makes (MOVE and CLEAR, in SQL spellings) is counted by bs_db_stat's statements
 * (SQL spellings) as the memory backend counts it in C, after the same workload. */
static void t_codec_enums(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db[2];
  bs_stat s[2];
  int op_types[BS_OP_CLEAR + 1] = {0}, flags = 0, chunk = 0;
  for (const bs__pg_enum *e = bs__pg_enums(); e->what; e++) {
    long long v = pgt_int(t->admin, "SELECT (%s)::int", e->sql);
    if (v != e->value) fail_msg("%s: SQL %s reads as %lld, C is %d", e->what, e->sql, v, e->value);
    if (!strncmp(e->what, "op type ", 8) && e->value >= BS_OP_PUT && e->value <= BS_OP_CLEAR)
      op_types[e->value]++;
    else if (!strncmp(e->what, "change flag ", 12))
      flags |= e->value;
    else if (!strncmp(e->what, "chunk ", 6))
      chunk++;
    else
      fail_msg("%s: of no enum the test knows", e->what);
  }
  for (int v = BS_OP_PUT; v <= BS_OP_CLEAR; v++) assert_int_equal(op_types[v], 1);
  assert_int_equal(flags, BS_PG_CHG_CHECKPOINT | BS_PG_CHG_BUCKETS | BS_PG_CHG_LOOKUPS);
  assert_int_equal(chunk, 2); /* the flags byte and the CLEAR flag (pg_read.c's "cleared") */
  assert_int_equal(bs_open_memory(&db[0], NULL, &err), BS_OK);
  db[1] = pgt_open(t->url, 0);
  for (int i = 0; i < 2; i++) {
    bs_storage *st;
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
    workload(db[i], 3, i);
    assert_int_equal(bs_storage_open(&st, db[i], 1, &err), BS_OK);
    co.min_bucket_changes = 1;
    assert_int_equal(bs_compact(NULL, st, &co, &err), BS_OK);
    bs_storage_close(st);
    assert_int_equal(bs_db_stat(&s[i], db[i], &err), BS_OK);
  }
  assert_true(s[0].ops_put > 0 && s[0].ops_remove > 0 && s[0].ops_move > 0 && s[0].ops_clear > 0);
  assert_int_equal(s[1].ops_put, s[0].ops_put);
  assert_int_equal(s[1].ops_remove, s[0].ops_remove);
  assert_int_equal(s[1].ops_move, s[0].ops_move);
  assert_int_equal(s[1].ops_clear, s[0].ops_clear);
  for (int i = 0; i < 2; i++) bs_close(db[i]);
}

/* ---- the commit's rule of managed write checkpoints in SQL (BS_PG_SQL_HEADS_PASSED) ---- */

/* The server's answer to the checkpoint statement's predicate ($3 the commit's LSN; $2 unused)
 * equals bs__heads_passed's, for every list of up to 3 heads and commit LSN drawn from short byte
 * strings around the order's edges (a prefix, 0x00, 0xff, the empty LSN), and for no heads. */
static void t_heads_passed(void **state) {
  pgt *t = *state;
  static const bs_val pool[] = {{"", 0},         {"\x00", 1},     {"\x01", 1}, {"\xff", 1},
                                {"\x01\x00", 2}, {"\x01\xff", 2}, {"\x02", 1}};
  const size_t np = sizeof pool / sizeof *pool;
  bs_error err = {0};
  size_t cases = 0;
  for (size_t nh = 0, total = 1; nh <= 3; nh++, total *= np)
    for (size_t code = 0; code < total; code++)
      for (size_t c = 0; c < np; c++) {
        bs_val lsns[3];
        bs_head heads[3];
        bs__head_array it = {heads, nh};
        bs__pg_args a = {0};
        unsigned char *buf = NULL;
        PGresult *r;
        for (size_t i = 0, k = code; i < nh; i++, k /= np) {
          lsns[i] = pool[k % np];
          heads[i] = (bs_head){{"c", 1}, lsns[i]};
        }
        assert_int_equal(bs__pg_arg_bytes_array(&a, lsns, nh, &bs__default_allocator, &buf, &err),
                         BS_OK);
        bs__pg_arg_i32(&a, 0);
        bs__pg_arg_bytes(&a, pool[c]);
        assert_int_equal(bs__pg_exec(t->admin,
                                     "SELECT " BS_PG_SQL_HEADS_PASSED
                                     " FROM (SELECT $1::bytea[] AS head_lsns, $2::int) AS r",
                                     &a, &r, "heads passed", &err),
                         BS_OK);
        if (bs__pg_bool(r, 0, 0) != bs__heads_passed(bs__head_array_next, &it, &pool[c], NULL, 0))
          fail_msg("%zu heads (case %zu), commit LSN %zu: SQL and C disagree", nh, code, c);
        PQclear(r);
        bs__free(&bs__default_allocator, buf);
        cases++;
      }
  assert_int_equal(cases, (1 + 7 + 49 + 343) * 7);
}

/* ---- the codec's stream row (pg_internal.h BS_PG_STREAM_COLS, pg_codec.c) ---- */

/* The stream row of id in t's schema, its columns cols (the codec's list or its prefix, ncols
 * of them) selected and decoded (strings copied into buf: 4 of at most 15 bytes). */
static bs__pg_stream stream_read(pgt *t, int id, const char *cols, int ncols, char buf[4][16]) {
  char sql[512];
  bs__pg_args a = {0};
  bs_error err = {0};
  bs_val *v[4];
  PGresult *r;
  bs__pg_stream s;
  bs__pg_arg_i32(&a, id);
  snprintf(sql, sizeof sql, "SELECT %s FROM bs_streams WHERE id = $1", cols);
  assert_int_equal(bs__pg_exec(t->admin, sql, &a, &r, "stream row", &err), BS_OK);
  assert_int_equal(PQntuples(r), 1);
  assert_int_equal(PQnfields(r), ncols);
  s = bs__pg_stream_row(r, 0);
  v[0] = &s.row.checkpoint_lsn;
  v[1] = &s.row.resume_lsn;
  v[2] = &s.row.no_checkpoint_before;
  v[3] = &s.last_error;
  for (int i = 0; i < 4; i++) {
    if (!v[i]->data) continue;
    assert_true(v[i]->size < 16);
    memcpy(buf[i], v[i]->data, v[i]->size);
    buf[i][v[i]->size] = 0;
    v[i]->data = buf[i];
  }
  s.name = (bs_val){NULL, s.name.size}; /* only its size is compared */
  PQclear(r);
  return s;
}

static void assert_val(bs_val v, const char *want) {
  if (!want) {
    assert_null(v.data);
    return;
  }
  assert_non_null(v.data);
  assert_int_equal(v.size, strlen(want));
  assert_memory_equal(v.data, want, v.size);
}

/* Schema 7's bs_ops (which migration 8 reads, pg_format.c): its columns are its key,
 * BS_PG_OP_COLS and data, so a column of the table the list does not name fails the count, and
 * a row written by column name reads back through bs__pg_op_row. */
static void t_codec_ops(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  PGresult *r;
  bs_op op;
  assert_int_equal(bs__pg_migrate(t->admin, 7, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM information_schema.columns WHERE table_schema ="
                           " current_schema() AND table_name = 'bs_ops'"),
                   2 + BS_PG_OP_NCOLS);
  pgt_exec(t->admin, "INSERT INTO bs_ops (bucket, op_id, type, checksum, target_op, object_type,"
                     " object_id, subkey, data) VALUES (1, 5, " BS_PG_SQL_PUT
                     ", 7, 3, 'ty', 'id', 's', 'data')");
  r = PQexecParams(t->admin, "SELECT bucket, " BS_PG_OP_COLS ", data FROM bs_ops", 0, NULL, NULL,
                   NULL, NULL, 1);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  op = bs__pg_op_row(r, 0, 1, 1);
  assert_int_equal(op.op_id, 5);
  assert_int_equal(op.type, BS_OP_PUT);
  assert_int_equal(op.checksum, 7);
  assert_int_equal(op.target_op, 3);
  assert_int_equal(op.object_type.size + op.object_id.size + op.subkey.size + op.data.size, 9);
  assert_memory_equal(op.data.data, "data", 4);
  PQclear(r);
}

/* The column list, its decoder and the stored row's encoder agree: a row written by column name
 * with a value of its own in every column decodes to those values field by field (and its
 * checkpoint prefix to the first two, nothing else); a row stored
 * through BS_PG_STREAM_SET and bs__pg_stream_args decodes to what was stored; and every column of
 * bs_streams is in the list but the two no call reads back. */
static void t_codec_stream(void **state) {
  pgt *t = *state;
  char buf[4][16];
  bs__pg_stream s;
  bs__stream_row w = {.state = BS_STREAM_STOPPED,
                      .snapshot_done = 1,
                      .op_head = 2006,
                      .checkpoint = 2002,
                      .last_checkpoint_op = 2003,
                      .checkpoint_lsn = bs__val_str("C2"),
                      .resume_lsn = {NULL, 0},
                      .no_checkpoint_before = bs__val_str(""),
                      .param_horizon = 2004,
                      .param_cursor = 2005,
                      .changes_fence = 2001};
  bs__pg_args a = {0};
  bs_error err = {0};
  bs_close(pgt_open(t->url, 0)); /* the schema */
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM information_schema.columns WHERE table_schema ="
                           " current_schema() AND table_name = 'bs_streams' AND column_name NOT IN"
                           " ('created_ms', 'next_table_id')"),
                   BS_PG_STREAM_NCOLS);
  pgt_exec(t->admin,
           "INSERT INTO bs_streams (id, name, state, hash, created_ms, snapshot_done, op_head,"
           " checkpoint, last_checkpoint_op, checkpoint_lsn, resume_lsn, no_checkpoint_before,"
           " param_horizon, param_cursor, changes_fence, last_error) VALUES (7, 'seven', %d, %d,"
           " 1, true, 1006, 1002, 1003, 'C', 'R', 'NCB', 1004, 1005, 1001, 'E')",
           BS_STREAM_ERRORED, BS_HASH_SHA256);
  s = stream_read(t, 7, BS_PG_STREAM_COLS, BS_PG_STREAM_NCOLS, buf);
  assert_int_equal(s.id, 7);
  assert_int_equal(s.name.size, 5);
  assert_int_equal(s.hash, BS_HASH_SHA256);
  assert_int_equal(s.row.state, BS_STREAM_ERRORED);
  assert_int_equal(s.row.snapshot_done, 1);
  assert_int_equal(s.row.op_head, 1006);
  assert_int_equal(s.row.checkpoint, 1002);
  assert_int_equal(s.row.last_checkpoint_op, 1003);
  assert_val(s.row.checkpoint_lsn, "C");
  assert_val(s.row.resume_lsn, "R");
  assert_val(s.row.no_checkpoint_before, "NCB");
  assert_int_equal(s.row.param_horizon, 1004);
  assert_int_equal(s.row.param_cursor, 1005);
  assert_int_equal(s.row.changes_fence, 1001);
  assert_int_equal(s.row.compact_horizon, 0);
  assert_val(s.last_error, "E");
  bs__pg_arg_i32(&a, 7);
  bs__pg_stream_args(&a, &w);
  assert_int_equal(bs__pg_run(t->admin, "UPDATE bs_streams SET " BS_PG_STREAM_SET " WHERE id = $1",
                              &a, "stream row", &err),
                   BS_OK);
  s = stream_read(t, 7, BS_PG_STREAM_COLS, BS_PG_STREAM_NCOLS, buf);
  assert_int_equal(s.row.state, w.state);
  assert_int_equal(s.row.snapshot_done, w.snapshot_done);
  assert_int_equal(s.row.op_head, w.op_head);
  assert_int_equal(s.row.checkpoint, w.checkpoint);
  assert_int_equal(s.row.last_checkpoint_op, w.last_checkpoint_op);
  assert_val(s.row.checkpoint_lsn, "C2");
  assert_val(s.row.resume_lsn, NULL);
  assert_val(s.row.no_checkpoint_before, "");
  assert_int_equal(s.row.param_horizon, w.param_horizon);
  assert_int_equal(s.row.param_cursor, w.param_cursor);
  assert_int_equal(s.row.changes_fence, w.changes_fence);
  assert_val(s.last_error, "E");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_schema_created_once, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_schema_newer_refused, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_schema_read_only, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_open_errors, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_streams, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_storage_open, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_status, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_unsupported_slots, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_reads_mirror, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_reads_sizes, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_parameter_sets, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_checkpoint_changes, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_list_buckets, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_writer_commits, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_writer_lock, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_write_checkpoints, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_clear, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_writer_saves, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_codec_enums, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_codec_ops, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_codec_stream, pgt_setup, pgt_teardown),
      cmocka_unit_test_setup_teardown(t_heads_passed, pgt_setup, pgt_teardown),
  };
  if (pgt_skipped("test_pg")) return 0;
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
