/*
 * pg_verify.c: bs_db_verify on the PostgreSQL backend (the LMDB backend's checks, lmdb_verify.c,
 * on the schema of pg_internal.h). It runs in one READ ONLY REPEATABLE READ transaction (one
 * snapshot; it writes nothing) and reads the tables a page at a time (cursors of PAGE rows; the
 * ops, whose data can be large, in keyset pages of the primary key also cut at PAGE_BYTES), so its memory is a page, whatever the database's size. Every
 * inconsistency is a problem passed to the caller (naming the table, stream, bucket and op id
 * at fault) and counted; only a server error or a failed allocation ends the call. The problems
 * are kept (the first SHOWN_BYTES of their text) and passed on after the transaction ended, so
 * the caller's callback never holds the snapshot open (and back vacuum). Checked:
 *  - bs_meta: the schema version is this build's, no other key but the server history's;
 *  - streams: name and state known (the hash mode and the checkpoint: verify.c), no op id at or above 2^63, the last
 *    checkpoint, the parameter horizon and the changes fence within the op head, a checkpoint
 *    with an LSN, LSNs of at most BS_MAX_LSN bytes, next_table_id above the stream's table ids;
 *    at most one PROCESSING and one served (ACTIVE or ERRORED) stream (contract.md 4.4);
 *  - source tables: a known stream, a name of 1..BS_MAX_TABLE_NAME bytes, a positive id of one
 *    table only;
 *  - buckets and ops, in one merged walk by bucket id: each bucket's state and ops against the
 *    rules of verify.c (as on LMDB and memory), a checksum column of 32 bits, a PUT's and
 *    REMOVE's columns present as their type carries them; ops of no bucket;
 *  - op ids unique in a stream, across its ops and parameter entries (contract.md 2);
 *  - source records: a known stream and table, the replica id's size, a soft-deleted record
 *    (one with a mark) without content and with its mark within the op head, members that
 *    decode, and every membership a PUT of a bucket of the same stream with the record's
 *    subkey, object_type and object_id;
 *  - the superseded log: a known stream and a bucket of it, pairs that decode (old ops ascending),
 *    1..BS_PG_SUP_ROW entries a row, each new op above its old op and within the op head;
 *  - parameter entries, change records, managed and custom write checkpoints: their shapes,
 *    their stream, their op ids within its op head (one statement each, returning only the rows
 *    at fault); a parameter entry's table id one the stream gave out, not one of a table that
 *    exists: drop forgets the table, and its tombstones stay in the index as every entry does,
 *    until parameter compaction (contract.md 4.2, 6; LMDB and memory keep them too).
 * Beyond reach, as on LMDB: a MOVE's or CLEAR's checksum (its payload is gone; the bucket's
 * running checksum covers it) and a REMOVE's object_type and object_id.
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define PAGE        500      /* rows per FETCH */
#define CHUNKS      200      /* chunks per keyset page */
#define PAGE_BYTES  16777216 /* about the payload bytes of a page of ops (16 MiB) */
#define STR_(x)     #x
#define STR(x)      STR_(x)
#define MEMBERS     2000   /* memberships checked per statement */
#define SHOWN_BYTES 262144 /* problem text kept for the caller: the rest is counted only */

/* the limits the statements below spell out (storage.h's carry a u suffix) */
_Static_assert(BS_MAX_STREAM_NAME == 255 && BS_MAX_LSN == 255 && BS_MAX_CONNECTION_NAME == 255 &&
                   BS_MAX_TABLE_NAME == 256 && BS_MAX_REPLICA_ID == 256 &&
                   BS_MAX_LOOKUP_KEY == 480 && BS_MAX_USER_ID == 480,
               "pg_verify.c's statements name these limits");

/* One membership of a source record, checked in batches (members_check). Strings are borrowed
 * from the page of source records they came from. */
typedef struct member {
  uint64_t bucket, op, stream;
  uint32_t table;
  bs_val ot, oi, rid;
  char sk[BS_SUBKEY_SIZE]; /* the record's subkey */
} member;

typedef struct verifier {
  bs__verify v;
  PGconn *c;
  const bs_allocator *a;
  member *m; /* the memberships not checked yet */
  size_t n_m, cap_m;
  struct opid *ids; /* verify_buckets' op ids (opids_check) */
  size_t n_ids, cap_ids;
  /* the caller's callback, and the problems kept for it: NUL-terminated texts one after the
   * other (n_shown bytes), then how many more were found; oom: keeping one failed */
  void (*fn)(const char *, void *);
  void *payload;
  char *shown;
  size_t n_shown, cap_shown;
  uint64_t hidden;
  int oom;
} verifier;

#define problem(vf, ...) bs__verify_problem(&(vf)->v, __VA_ARGS__)

static int oom(bs_error *err) {
  return bs__fail(err, BS_ENOMEM, "verify: out of memory");
}

/* ---- Problems, kept until the transaction ended ------------------------------------------------ */

/* verify.c's problem callback: keeps the text. */
static void keep(const char *problem, void *payload) {
  verifier *vf = payload;
  size_t n = strlen(problem) + 1;
  if (vf->n_shown + n > SHOWN_BYTES) {
    vf->hidden++;
    return;
  }
  if (BS_GROW(vf->a, vf->shown, vf->cap_shown, vf->n_shown + n)) {
    vf->oom = 1;
    return;
  }
  memcpy(vf->shown + vf->n_shown, problem, n);
  vf->n_shown += n;
}

/* Passes the kept problems to the caller, then says how many more were found. */
static void show(verifier *vf) {
  char more[160];
  for (size_t at = 0; at < vf->n_shown; at += strlen(vf->shown + at) + 1)
    vf->fn(vf->shown + at, vf->payload);
  if (!vf->hidden) return;
  snprintf(more, sizeof more,
           "%" PRIu64 " more problems, not shown (verify passes on the first %d bytes of their"
           " text)",
           vf->hidden, SHOWN_BYTES);
  vf->fn(more, vf->payload);
}

/* ---- Cursors: one page of rows at a time ------------------------------------------------------ */

typedef struct scan {
  PGconn *c;
  const char *name;         /* a cursor's: FETCH PAGE rows at a time */
  const char *first, *next; /* or keyset pages: next continues after the last (bucket, op_id) */
  PGresult *r;              /* the current page */
  int row, n, done;
} scan;

static int scan_open(verifier *vf, scan *s, const char *name, const char *sql, bs_error *err) {
  size_t n = strlen(sql) + 64;
  char *q = bs__malloc(vf->a, n);
  int rc;
  memset(s, 0, sizeof *s);
  s->c = vf->c;
  s->name = name;
  if (!q) return oom(err);
  snprintf(q, n, "DECLARE %s NO SCROLL CURSOR FOR %s", name, sql);
  rc = bs__pg_run(vf->c, q, NULL, "verify: opening a cursor", err);
  bs__free(vf->a, q);
  return rc;
}

static void scan_keyset(verifier *vf, scan *s, const char *first, const char *next) {
  memset(s, 0, sizeof *s);
  s->c = vf->c;
  s->first = first;
  s->next = next;
}

/* 1 when a row is current (s->r, s->row), 0 after the last one, or a failure. The current row
 * stays until scan_next; a page's strings stay valid until its last row is passed. */
static int scan_get(scan *s, bs_error *err) {
  char q[96];
  int rc;
  if (s->r && s->row < s->n) return 1;
  if (s->done) {
    PQclear(s->r);
    s->r = NULL;
    return 0;
  }
  if (s->first) {
    bs__pg_args a = {0};
    PGresult *r;
    if (s->r) { /* after the last row of this page */
      bs__pg_arg_i64(&a, bs__pg_i64(s->r, s->n - 1, 0));
      bs__pg_arg_i64(&a, bs__pg_i64(s->r, s->n - 1, 1));
    }
    rc = bs__pg_exec(s->c, s->r ? s->next : s->first, s->r ? &a : NULL, &r, "verify: reading", err);
    PQclear(s->r);
    s->r = rc ? NULL : r;
    if (rc) return rc;
    s->n = PQntuples(s->r);
    s->done = s->n == 0; /* a page may end early: at its byte budget */
  } else {
    PQclear(s->r);
    snprintf(q, sizeof q, "FETCH %d FROM %s", PAGE, s->name);
    if ((rc = bs__pg_exec(s->c, q, NULL, &s->r, "verify: reading", err))) return rc;
    s->n = PQntuples(s->r);
    s->done = s->n < PAGE;
  }
  s->row = 0;
  return s->n > 0;
}

static void scan_next(scan *s) {
  s->row++;
}

/* the current row is its page's last: its strings go with the next scan_get */
static int scan_page_end(const scan *s) {
  return s->row + 1 == s->n;
}

static void scan_close(scan *s) {
  PQclear(s->r);
  s->r = NULL;
}

/* ---- Checks that one statement makes ---------------------------------------------------------- */

/* sql's rows: column 0 names the row (text), columns f1..fN are booleans, one per fault (NULL
 * counts as false); each true one is a problem. Only rows with a fault come back. */
typedef struct row_check {
  const char *cursor;
  const char *sql;
  const char *faults[14]; /* NULL-terminated */
} row_check;

static int run_row_check(verifier *vf, const row_check *ck, bs_error *err) {
  char where[512], *sql;
  size_t n = 0, at = 0;
  scan s;
  int rc;
  while (ck->faults[n]) n++;
  at = (size_t)snprintf(where, sizeof where, "SELECT * FROM (%%s) x WHERE false");
  for (size_t i = 1; i <= n; i++)
    at += (size_t)snprintf(where + at, sizeof where - at, " OR coalesce(f%zu, false)", i);
  if (!(sql = bs__malloc(vf->a, strlen(ck->sql) + at + 1))) return oom(err);
  snprintf(sql, strlen(ck->sql) + at + 1, where, ck->sql);
  rc = scan_open(vf, &s, ck->cursor, sql, err);
  bs__free(vf->a, sql);
  if (rc) return rc;
  while ((rc = scan_get(&s, err)) == 1) {
    bs_val w = bs__pg_bytes(s.r, s.row, 0);
    for (size_t i = 0; i < n; i++)
      if (!PQgetisnull(s.r, s.row, (int)i + 1) && bs__pg_bool(s.r, s.row, (int)i + 1))
        problem(vf, "%.*s: %s", (int)w.size, w.size ? (const char *)w.data : "", ck->faults[i]);
    scan_next(&s);
  }
  scan_close(&s);
  return rc;
}

/* In the statements: a name or key is shown as encode(substr(x, 1, 100), 'escape') (text, at
 * most 100 bytes); a bytea[] list is bad when it has more than one dimension or a NULL. */
static const row_check checks[] = {
    {"v_streams",
     "SELECT format('stream %s', s.id), octet_length(name) NOT BETWEEN 1 AND 255 AS f1,"
     " op_head < 0 AS f2,"
     " last_checkpoint_op < checkpoint OR last_checkpoint_op > op_head AS f3,"
     " checkpoint > 0 AND checkpoint_lsn IS NULL AS f4,"
     " octet_length(checkpoint_lsn) > 255 OR octet_length(resume_lsn) > 255"
     "  OR octet_length(no_checkpoint_before) > 255 AS f5,"
     " param_horizon < 0 OR param_horizon > op_head AS f6,"
     " changes_fence < 0 OR changes_fence > op_head AS f7,"
     " next_table_id <= coalesce((SELECT max(t.id) FROM bs_tables t WHERE t.stream = s.id), 0)"
     "  AS f8, octet_length(last_error) > 255 AS f9 FROM bs_streams s",
     {"name not of 1..255 bytes", "op head at or above 2^63",
      "last checkpoint op outside checkpoint..op head", "a checkpoint without an LSN",
      "an LSN over 255 bytes", "parameter horizon outside 0..op head",
      "changes fence outside 0..op head", "next_table_id not above the stream's table ids",
      "last error over 255 bytes", NULL}},
    {"v_tables",
     "SELECT format('table \"%s\" of stream %s', encode(substr(t.name, 1, 100), 'escape'),"
     "  t.stream),"
     " s.id IS NULL AS f1, octet_length(t.name) NOT BETWEEN 1 AND 256 AS f2, t.id < 1 AS f3,"
     " EXISTS (SELECT 1 FROM bs_tables u WHERE u.stream = t.stream AND u.id = t.id"
     "  AND u.name <> t.name) AS f4"
     " FROM bs_tables t LEFT JOIN bs_streams s ON s.id = t.stream",
     {"unknown stream", "name not of 1..256 bytes", "id below 1", "id of another table too", NULL}},
    {"v_params",
     "SELECT format('parameter entry (stream %s, lookup \"%s\", op %s)', p.stream,"
     "  encode(substr(p.lookup, 1, 100), 'escape'), p.op_id),"
     " s.id IS NULL AS f1, p.op_id < 1 OR p.op_id > s.op_head AS f2,"
     " octet_length(p.lookup) > 480 AS f3, octet_length(p.replica_id) > 256 AS f4,"
     " CASE WHEN array_ndims(p.rows) > 1 THEN true"
     "  ELSE array_position(p.rows, NULL) IS NOT NULL END AS f5,"
     " p.table_id < 1 OR p.table_id >= s.next_table_id AS f6"
     " FROM bs_params p LEFT JOIN bs_streams s ON s.id = p.stream",
     {"unknown stream", "op id outside 1..op head", "lookup key over 480 bytes",
      "replica id over 256 bytes", "rows with a NULL or of more than one dimension",
      "a table id the stream never gave out", NULL}},
    {"v_changes",
     "SELECT format('change record (stream %s, op %s, seq %s)', c.stream, c.op_id, c.seq),"
     " s.id IS NULL AS f1, c.op_id < 0 OR c.op_id > s.op_head AS f2,"
     " c.first_op < 0 OR c.first_op > c.op_id::numeric + 1 AS f3," /* no int8 overflow */
     " c.flags & ~(" BS_PG_SQL_CHG_CHECKPOINT " | " BS_PG_SQL_CHG_BUCKETS
     " | " BS_PG_SQL_CHG_LOOKUPS ") <> 0 AS f4,"
     " CASE WHEN greatest(array_ndims(c.buckets), array_ndims(c.lookups),"
     "  array_ndims(c.users)) > 1 THEN true"
     "  ELSE array_position(c.buckets, NULL) IS NOT NULL"
     "  OR array_position(c.lookups, NULL) IS NOT NULL"
     "  OR array_position(c.users, NULL) IS NOT NULL END AS f5"
     " FROM bs_changes c LEFT JOIN bs_streams s ON s.id = c.stream",
     {"unknown stream", "op id outside 0..op head", "first op above its op id", "unknown flags",
      "a list with a NULL or of more than one dimension", NULL}},
    {"v_managed",
     "SELECT format('managed write checkpoint of user \"%s\"',"
     "  encode(substr(user_id, 1, 100), 'escape')),"
     " octet_length(user_id) > 480 AS f1, id < 1 AS f2,"
     " coalesce(array_ndims(head_conns), 1) <> 1 OR coalesce(array_ndims(head_lsns), 1) <> 1"
     "  OR cardinality(head_conns) <> cardinality(head_lsns) AS f3,"
     " EXISTS (SELECT 1 FROM unnest(head_conns) h WHERE h IS NULL OR octet_length(h) > 255)"
     "  OR EXISTS (SELECT 1 FROM unnest(head_lsns) h WHERE h IS NULL OR octet_length(h) > 255)"
     "  AS f4, processed <> (processed_lsn IS NOT NULL) AS f5, requested_at < 1 AS f6"
     " FROM bs_wcp_managed",
     {"user id over 480 bytes", "id outside 1..2^63-1",
      "heads' connections and LSNs do not pair up", "a head with a NULL or over 255 bytes",
      "processed and processed_lsn disagree", "requested_at before the epoch", NULL}},
    {"v_custom",
     "SELECT format('custom write checkpoint (stream %s, event \"%s\", user \"%s\")', c.stream,"
     "  encode(substr(c.event, 1, 100), 'escape'), encode(substr(c.user_id, 1, 100), 'escape')),"
     " s.id IS NULL AS f1, octet_length(c.user_id) > 480 AS f2,"
     " octet_length(c.event) > 255 AS f3, c.value < 0 AS f4, c.requested_at < 0 AS f5"
     " FROM bs_wcp_custom c LEFT JOIN bs_streams s ON s.id = c.stream",
     {"unknown stream", "user id over 480 bytes", "event over 255 bytes", "value at or above 2^63",
      "requested_at before the epoch", NULL}},
};

/* bs_meta holds the schema version, this build's (a newer one was refused at open), and the
 * history pg.c records (history_system, _timeline, _table, _epoch), only. */
static int verify_meta(verifier *vf, bs_error *err) {
  PGresult *r;
  int found = 0;
  int rc = bs__pg_exec(vf->c, "SELECT key, value FROM bs_meta ORDER BY key", NULL, &r,
                       "verify: bs_meta", err);
  if (rc) return rc;
  for (int i = 0; i < PQntuples(r); i++) {
    bs_val k = bs__pg_bytes(r, i, 0);
    int64_t v = bs__pg_i64(r, i, 1);
    if (k.size > 8 && !memcmp(k.data, "history_", 8)) continue;
    if (!bs__val_eq(k, bs__val_str("schema_version"))) {
      problem(vf, "bs_meta \"%.*s\": unknown key", bs__name_shown(k), (const char *)k.data);
      continue;
    }
    found = 1;
    if (v != BS_PG_SCHEMA_VERSION)
      problem(vf, "bs_meta: schema version %" PRId64 ", this build's is %d", v,
              BS_PG_SCHEMA_VERSION);
  }
  PQclear(r);
  if (!found) problem(vf, "bs_meta: no schema_version");
  return BS_OK;
}

/* ---- Streams: their states, and the op heads and hashes the other checks need ---------------- */

/* Each state one of lifecycle.c's, and at most one PROCESSING and one served stream (contract.md
 * 4.4). */
static int load_streams(verifier *vf, bs_error *err) {
  PGresult *r;
  unsigned processing = 0, served = 0;
  int rc = bs__pg_exec(vf->c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams ORDER BY id", NULL, &r,
                       "verify: streams", err);
  for (int i = 0; !rc && i < PQntuples(r); i++) {
    bs__pg_stream s = bs__pg_stream_row(r, i);
    int state = (int)s.row.state;
    if (!bs__stream_known(state)) problem(vf, "stream %" PRIu32 ": unknown state", s.id);
    processing += state == BS_STREAM_PROCESSING;
    served += bs__stream_known(state) && bs__stream_served((unsigned)state);
    if (bs__verify_stream_add(&vf->v, s.id, s.row.op_head, s.row.checkpoint, (unsigned)s.hash))
      rc = oom(err);
  }
  PQclear(r);
  if (processing > 1) problem(vf, "streams: more than one PROCESSING stream");
  if (served > 1) problem(vf, "streams: more than one ACTIVE or ERRORED stream");
  return rc;
}

/* ---- Buckets and their ops --------------------------------------------------------------------- */

/* Op ids of every op and parameter entry, by stream: one op id is never two of them (opids_check
 * sorts them once every chunk was read). */
typedef struct opid {
  uint64_t stream, op;
} opid;

static int opid_add(verifier *vf, uint64_t stream, uint64_t op) {
  if (BS_GROW(vf->a, vf->ids, vf->cap_ids, vf->n_ids + 1)) return BS_ENOMEM;
  vf->ids[vf->n_ids].stream = stream;
  vf->ids[vf->n_ids++].op = op;
  return BS_OK;
}

static int cmp_opid(const void *x, const void *y) {
  const opid *a = x, *b = y;
  if (a->stream != b->stream) return a->stream < b->stream ? -1 : 1;
  return a->op < b->op ? -1 : a->op > b->op;
}

static int opids_check(verifier *vf, bs_error *err) {
  PGresult *r;
  int rc = bs__pg_exec(vf->c, "SELECT stream, op_id FROM bs_params", NULL, &r,
                       "verify: parameter entries' op ids", err);
  for (int i = 0; !rc && i < PQntuples(r); i++)
    if (opid_add(vf, (uint64_t)bs__pg_i32(r, i, 0), (uint64_t)bs__pg_i64(r, i, 1))) rc = oom(err);
  PQclear(r);
  if (rc) return rc;
  if (vf->n_ids) qsort(vf->ids, vf->n_ids, sizeof *vf->ids, cmp_opid);
  for (size_t i = 1; i < vf->n_ids; i++)
    if (!cmp_opid(&vf->ids[i - 1], &vf->ids[i]) &&
        (i == 1 || cmp_opid(&vf->ids[i - 2], &vf->ids[i])))
      problem(vf,
              "stream %" PRIu64 " op id %" PRIu64 ": used by more than one op or parameter entry",
              vf->ids[i].stream, vf->ids[i].op);
  return BS_OK;
}

/* The chunk of the current row of os (columns: 0 bucket, 1 last_op, 2 first_op, 3 n, 4 checksum,
 * 5 ops) of bucket b: its columns against its header, its header against its ops, its place after
 * the bucket's previous chunk (*prev: that one's last op), then each op by verify.c's rules.
 * *max: the largest op's payload bytes. */
static int check_chunk(verifier *vf, bs__vbucket *b, const PGresult *r, int row, uint64_t *prev,
                       uint64_t *max, bs__pg_chunkr *ch) {
  const char *nm = b->name.size ? (const char *)b->name.data : "";
  int ns = bs__name_shown(b->name);
  uint64_t last = (uint64_t)bs__pg_i64(r, row, 1);
  const char *why;
  if (bs__pg_chunk_open(ch, bs__pg_bytes(r, row, 5))) {
    problem(vf, "bucket \"%.*s\" chunk %" PRIu64 ": does not decode", ns, nm, last);
    return BS_OK;
  }
  if (ch->ids[ch->n - 1] != last || bs__chunk_first(ch->p) != (uint64_t)bs__pg_i64(r, row, 2) ||
      bs__chunk_n(ch->p) != (uint32_t)bs__pg_i32(r, row, 3) ||
      bs__chunk_sum(ch->p) != (uint32_t)bs__pg_i32(r, row, 4))
    problem(vf, "bucket \"%.*s\" chunk %" PRIu64 ": its columns are not its header's", ns, nm,
            last);
  if ((why = bs__chunk_header_problem(ch->p, ch->n, ch->ids, ch->off, ch->len, *prev)))
    problem(vf, "bucket \"%.*s\" chunk %" PRIu64 ": %s", ns, nm, last, why);
  *prev = last;
  for (uint32_t i = 0; i < ch->n; i++) {
    bs_op op;
    if (bs__pg_chunk_op(ch, i, &op)) {
      unsigned t = ch->p[ch->off[i]] & (ch->flags & BS_CHUNK_COMPACT ? 7u : 255u);
      if (t >= BS_OP_PUT && t <= BS_OP_CLEAR) {
        problem(vf, "bucket \"%.*s\" op %" PRIu64 ": does not decode", ns, nm, ch->ids[i]);
        continue;
      }
      /* an op of a type this build does not know: verify.c names it, and counts its checksum
       * (its header's) so the bucket's sums do not report it again */
      memset(&op, 0, sizeof op);
      op.op_id = ch->ids[i];
      op.type = (bs_op_type)t;
      op.checksum = bs__pg_chunk_cksum(ch, i);
    }
    bs__verify_op(&vf->v, b, &op, bs__pg_op_bytes(&op));
    if (bs__pg_op_bytes(&op) > *max) *max = bs__pg_op_bytes(&op);
    if (b->stream_id && opid_add(vf, b->stream_id, op.op_id)) return BS_ENOMEM;
  }
  return BS_OK;
}

/* Passes the chunks of buckets below hi (every bucket when all), one problem per bucket id: they
 * have no bucket state. */
static int skip_orphans(verifier *vf, scan *os, int64_t hi, int all, bs_error *err) {
  int64_t last = 0;
  int rc, any = 0;
  while ((rc = scan_get(os, err)) == 1) {
    int64_t bucket = bs__pg_i64(os->r, os->row, 0);
    if (!all && bucket >= hi) break;
    if (!any || bucket != last)
      problem(vf, "ops of bucket id %" PRId64 " without a bucket state", bucket);
    any = 1;
    last = bucket;
    scan_next(os);
  }
  return rc < 0 ? rc : BS_OK;
}

/* A page of chunks in (bucket, last_op) order (the primary key's range after where). */
#define CHUNKS_PAGE(where)                                                                         \
  "SELECT bucket, last_op, first_op, n, checksum, ops FROM bs_chunks " where                       \
  " ORDER BY bucket, last_op LIMIT " STR(CHUNKS)

static int verify_buckets(verifier *vf, bs_error *err) {
  scan bs, os;
  bs__pg_chunkr *ch = bs__malloc(vf->a, sizeof *ch);
  int rc;
  if (!ch) return oom(err);
  if ((rc = scan_open(vf, &bs, "v_buckets",
                      "SELECT id, stream, name, checksum, count, bytes, last_op, clear_start,"
                      " clear_op, max_op_bytes FROM bs_buckets ORDER BY id",
                      err))) {
    bs__free(vf->a, ch);
    return rc;
  }
  scan_keyset(vf, &os, CHUNKS_PAGE(""), CHUNKS_PAGE("WHERE (bucket, last_op) > ($1, $2)"));
  while ((rc = scan_get(&bs, err)) == 1) {
    /* the columns are bigint: a negative value is a huge one here, outside every bound */
    bs__vbucket b = {.id = (uint64_t)bs__pg_i64(bs.r, bs.row, 0),
                     .stream_id = (uint32_t)bs__pg_i32(bs.r, bs.row, 1),
                     .name = bs__pg_bytes(bs.r, bs.row, 2),
                     .has_state = 1,
                     .checksum = (uint64_t)bs__pg_i64(bs.r, bs.row, 3),
                     .count = (uint64_t)bs__pg_i64(bs.r, bs.row, 4),
                     .bytes = (uint64_t)bs__pg_i64(bs.r, bs.row, 5),
                     .last_op = (uint64_t)bs__pg_i64(bs.r, bs.row, 6),
                     .clear_start = (uint64_t)bs__pg_i64(bs.r, bs.row, 7),
                     .clear_op = (uint64_t)bs__pg_i64(bs.r, bs.row, 8)};
    uint64_t max = (uint64_t)bs__pg_i64(bs.r, bs.row, 9), seen = 0, prev = 0;
    b.stream = bs__verify_stream(&vf->v, b.stream_id);
    if ((rc = skip_orphans(vf, &os, (int64_t)b.id, 0, err))) break;
    for (; (rc = scan_get(&os, err)) == 1 && bs__pg_i64(os.r, os.row, 0) == (int64_t)b.id;
         scan_next(&os))
      if (check_chunk(vf, &b, os.r, os.row, &prev, &seen, ch)) {
        rc = oom(err);
        break;
      }
    if (rc < 0) break;
    if (seen > max) /* an upper bound the writer keeps (pg_internal.h) */
      problem(vf,
              "bucket \"%.*s\": an op of %" PRIu64
              " payload bytes, above its max_op_bytes %" PRIu64,
              bs__name_shown(b.name), b.name.size ? (const char *)b.name.data : "", seen, max);
    bs__verify_bucket_end(&vf->v, &b);
    scan_next(&bs);
  }
  if (rc == 0) rc = skip_orphans(vf, &os, 0, 1, err);
  scan_close(&bs);
  scan_close(&os);
  bs__free(vf->a, ch);
  if (rc == 0) rc = opids_check(vf, err);
  return rc < 0 ? rc : BS_OK;
}

/* ---- Source records ------------------------------------------------------------------------------ */

static int members_add(verifier *vf, uint32_t stream, uint32_t table, bs_val rid,
                       const char *subkey, const bs__member *mb) {
  member *e;
  if (BS_GROW(vf->a, vf->m, vf->cap_m, vf->n_m + 1)) return BS_ENOMEM;
  e = &vf->m[vf->n_m++];
  e->bucket = mb->bucket;
  e->op = mb->op;
  e->stream = stream;
  e->table = table;
  e->ot = mb->object_type;
  e->oi = mb->object_id;
  e->rid = rid;
  memcpy(e->sk, subkey, BS_SUBKEY_SIZE);
  return BS_OK;
}

/* The memberships gathered so far, in one statement: each must be a PUT of a bucket of the
 * record's stream, with the record's subkey and the membership's object. */
static int members_check(verifier *vf, bs_error *err) {
  static const char *const why[] = {"",
                                    "no such bucket",
                                    "the bucket is another stream's",
                                    "no such op",
                                    "not a PUT",
                                    "its subkey is not the source row's",
                                    "its object_type or object_id is not the membership's"};
  const member *m = vf->m;
  size_t n = vf->n_m;
  unsigned char *arr[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  uint64_t *u = NULL;
  bs_val *v = NULL;
  bs__pg_args a = {0};
  PGresult *r = NULL;
  int rc = BS_OK;
  if (!n) return BS_OK;
  if (!(u = bs__calloc(vf->a, 3 * n, sizeof *u)) || !(v = bs__calloc(vf->a, 3 * n, sizeof *v)))
    rc = oom(err);
  for (size_t i = 0; !rc && i < n; i++) {
    u[i] = m[i].bucket;
    u[n + i] = m[i].op;
    u[2 * n + i] = m[i].stream;
    v[i].data = m[i].sk;
    v[i].size = BS_SUBKEY_SIZE;
    v[n + i] = m[i].ot;
    v[2 * n + i] = m[i].oi;
  }
  for (int k = 0; !rc && k < 3; k++)
    rc = bs__pg_arg_i64_array(&a, u + k * n, n, vf->a, &arr[k], err);
  for (int k = 0; !rc && k < 3; k++)
    rc = bs__pg_arg_bytes_array(&a, v + k * n, n, vf->a, &arr[3 + k], err);
  if (!rc)
    rc = bs__pg_exec(
        vf->c,
        "SELECT m.i, CASE WHEN b.id IS NULL THEN 1 WHEN b.stream <> m.st THEN 2 ELSE 0 END,"
        " b.name, k.ops"
        " FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::bytea[], $5::bytea[], $6::bytea[])"
        "  WITH ORDINALITY AS m(bucket, op, st, sk, ot, oi, i)"
        " LEFT JOIN bs_buckets b ON b.id = m.bucket"
        " LEFT JOIN LATERAL (SELECT ops, first_op FROM bs_chunks WHERE bucket = m.bucket"
        "  AND last_op >= m.op ORDER BY last_op LIMIT 1) k ON k.first_op <= m.op"
        " ORDER BY m.i",
        &a, &r, "verify: source records' memberships", err);
  for (int i = 0; !rc && i < PQntuples(r); i++) {
    size_t k = (size_t)bs__pg_i64(r, i, 0) - 1;
    int w = bs__pg_i32(r, i, 1);
    bs_val name = PQgetisnull(r, i, 2) ? (bs_val){NULL, 0} : bs__pg_bytes(r, i, 2);
    if (k >= n) continue;
    if (!w) { /* the op: in the chunk that holds its id, if any */
      bs__pg_chunkr *ch = bs__malloc(vf->a, sizeof *ch);
      bs_op op;
      uint32_t j = 0;
      if (!ch) {
        rc = oom(err);
        break;
      }
      w = 3;
      if (!PQgetisnull(r, i, 3) && !bs__pg_chunk_open(ch, bs__pg_bytes(r, i, 3))) {
        while (j < ch->n && ch->ids[j] < m[k].op) j++;
        if (j < ch->n && ch->ids[j] == m[k].op && !bs__pg_chunk_op(ch, j, &op)) {
          bs_val sk = {m[k].sk, BS_SUBKEY_SIZE};
          w = op.type != BS_OP_PUT                                                         ? 4
              : !bs__val_eq(op.subkey, sk)                                                 ? 5
              : !bs__val_eq(op.object_type, m[k].ot) || !bs__val_eq(op.object_id, m[k].oi) ? 6
                                                                                           : 0;
        }
      }
      bs__free(vf->a, ch);
    }
    if (w < 1 || w > 6) continue;
    problem(vf,
            "bucket \"%.*s\" (id %" PRIu64 ") op %" PRIu64 ": held by the source record of table"
            " %" PRIu32 " replica id \"%.*s\" (stream %" PRIu64 "), but %s",
            bs__name_shown(name), name.size ? (const char *)name.data : "", m[k].bucket, m[k].op,
            m[k].table, bs__name_shown(m[k].rid), m[k].rid.size ? (const char *)m[k].rid.data : "",
            m[k].stream, why[w]);
  }
  PQclear(r);
  for (int k = 0; k < 6; k++) bs__free(vf->a, arr[k]);
  bs__free(vf->a, u);
  bs__free(vf->a, v);
  vf->n_m = 0;
  return rc;
}

/* source columns: 0 stream, 1 table_id (both of its table: NULL when bs_tables has none of its
 * key), then the record's (its data not read), then the table's name and the record's key */
static int check_source(verifier *vf, const PGresult *r, int row, bs_error *err) {
  int64_t stream = bs__pg_i32(r, row, 0), table = bs__pg_i32(r, row, 1), mark;
  bs_val rid = bs__pg_bytes(r, row, 2);
  const bs__vstream *sh = bs__verify_stream(&vf->v, (uint32_t)stream);
  const char *rp = rid.size ? (const char *)rid.data : "";
  int rn = bs__name_shown(rid);
  char subkey[BS_SUBKEY_SIZE];
  bs__srec rec;
  int rc;
  if (PQgetisnull(r, row, 0)) { /* no table to name it by, nor to decode its members with */
    problem(vf, "source record (table key %" PRId64 ", replica id \"%.*s\"): unknown table",
            (int64_t)bs__pg_i32(r, row, 3 + BS_PG_SOURCE_NCOLS), rn, rp);
    return BS_OK;
  }
  rc = bs__pg_source_row(&rec, vf->a, r, row, 2, 0, bs__pg_bytes(r, row, 2 + BS_PG_SOURCE_NCOLS));
  mark = (int64_t)rec.mark;
#define WHO "source record (stream %" PRId64 ", table %" PRId64 ", replica id \"%.*s\"): "
  if (!sh) problem(vf, WHO "unknown stream", stream, table, rn, rp);
  if (rid.size > BS_MAX_REPLICA_ID)
    problem(vf, WHO "replica id of %zu bytes", stream, table, rn, rp, rid.size);
  if (mark < 0 || (sh && (uint64_t)mark > sh->op_head))
    problem(vf, WHO "mark %" PRId64 " outside 0..op head", stream, table, rn, rp, mark);
  if (rc == BS_ECORRUPT) {
    problem(vf, WHO "members of %d bytes do not decode", stream, table, rn, rp,
            PQgetlength(r, row, 4));
    return BS_OK;
  }
  if (rc) return oom(err);
  if (rec.soft && (rec.nm || rec.nl || rec.has_data))
    problem(vf, WHO "soft-deleted with content", stream, table, rn, rp);
  bs_subkey(subkey, (uint32_t)table, rid);
  for (uint32_t i = 0; i < rec.nm && !rc; i++)
    if (members_add(vf, (uint32_t)stream, (uint32_t)table, rid, subkey, &rec.m[i])) rc = oom(err);
#undef WHO
  bs__free(vf->a, rec.m);
  bs__free(vf->a, rec.lk);
  return rc;
}

static int verify_sources(verifier *vf, bs_error *err) {
  scan s;
  int rc = scan_open(vf, &s, "v_source",
                     "SELECT t.stream, t.id, " BS_PG_SOURCE_COLS ", t.name, s.tkey"
                     " FROM bs_source s LEFT JOIN bs_tables t ON t.key = s.tkey"
                     " ORDER BY s.tkey, s.replica_id",
                     err);
  if (rc) return rc;
  while ((rc = scan_get(&s, err)) == 1) {
    if ((rc = check_source(vf, s.r, s.row, err))) break;
    /* the memberships borrow the page: checked before it goes, or when there are enough */
    if ((scan_page_end(&s) || vf->n_m >= MEMBERS) && (rc = members_check(vf, err))) break;
    scan_next(&s);
  }
  if (rc == 0) rc = members_check(vf, err);
  scan_close(&s);
  return rc < 0 ? rc : BS_OK;
}

/* ---- The superseded log -------------------------------------------------------------------- */

/* log columns: 0 stream, 1 bucket, 2 first_new, 3 pairs, 4 the bucket's stream (NULL: none) */
static void check_sups(verifier *vf, const PGresult *r, int row) {
  int64_t stream = bs__pg_i32(r, row, 0), bucket = bs__pg_i64(r, row, 1);
  int64_t first = bs__pg_i64(r, row, 2);
  const bs__vstream *sh = bs__verify_stream(&vf->v, (uint32_t)stream);
  uint64_t old_op, new_op, n = 0;
  int k, order = 0, above = 0;
  bs__pg_sups it;
#define WHO "superseded log row (stream %" PRId64 ", bucket %" PRId64 ", first_new %" PRId64 "): "
  if (!sh) problem(vf, WHO "unknown stream", stream, bucket, first);
  if (PQgetisnull(r, row, 4) || bs__pg_i32(r, row, 4) != stream)
    problem(vf, WHO "not a bucket of the stream", stream, bucket, first);
  if (first < 1) problem(vf, WHO "first_new below 1", stream, bucket, first);
  bs__pg_sups_open(&it, bs__pg_bytes(r, row, 3), (uint64_t)first);
  while ((k = bs__pg_sups_next(&it, &old_op, &new_op)) == 1) {
    n++;
    if (new_op <= old_op) order = 1;
    if (sh && new_op > sh->op_head) above = 1;
  }
  if (k)
    problem(vf, WHO "pairs of %d bytes do not decode", stream, bucket, first,
            PQgetlength(r, row, 3));
  else if (!n)
    problem(vf, WHO "no entries", stream, bucket, first);
  if (n > BS_PG_SUP_ROW)
    problem(vf, WHO "%" PRIu64 " entries, over %d", stream, bucket, first, n, BS_PG_SUP_ROW);
  if (order) problem(vf, WHO "an entry's new op not above its old op", stream, bucket, first);
  if (above) problem(vf, WHO "an entry's new op above the op head", stream, bucket, first);
#undef WHO
}

static int verify_superseded(verifier *vf, bs_error *err) {
  scan s;
  int rc =
      scan_open(vf, &s, "v_superseded",
                "SELECT l.stream, l.bucket, l.first_new, l.pairs, b.stream FROM bs_superseded l"
                " LEFT JOIN bs_buckets b ON b.id = l.bucket"
                " ORDER BY l.stream, l.bucket, l.first_new",
                err);
  if (rc) return rc;
  while ((rc = scan_get(&s, err)) == 1) {
    check_sups(vf, s.r, s.row);
    scan_next(&s);
  }
  scan_close(&s);
  return rc < 0 ? rc : BS_OK;
}

/* ---- The slots ----------------------------------------------------------------------------------- */

int bs__pg_verify(uint64_t *problems, bs_db *base, void (*fn)(const char *, void *), void *payload,
                  bs_error *err) {
  bs__pg_db *db = (bs__pg_db *)base;
  verifier vf;
  int rc;
  memset(&vf, 0, sizeof vf);
  vf.a = vf.v.a = &base->alloc;
  vf.fn = fn;
  vf.payload = payload;
  if (fn) {
    vf.v.fn = keep;
    vf.v.payload = &vf;
  }
  if ((rc = bs__pg_conn_get(db, &vf.c, err))) return rc;
  if (!(rc = bs__pg_begin(vf.c, 1, err))) {
    rc = verify_meta(&vf, err);
    if (!rc) rc = load_streams(&vf, err);
    for (size_t i = 0; !rc && i < sizeof checks / sizeof checks[0]; i++)
      rc = run_row_check(&vf, &checks[i], err);
    if (!rc) bs__pg_hook(db, "verify.buckets", vf.c);
    if (!rc) rc = verify_buckets(&vf, err);
    if (!rc) rc = verify_sources(&vf, err);
    if (!rc) rc = verify_superseded(&vf, err);
    bs__pg_rollback(vf.c); /* read-only: nothing to keep */
  }
  bs__pg_conn_put(db, vf.c);
  if (fn) show(&vf); /* also those found before a failure */
  if (!rc && vf.oom) rc = oom(err);
  bs__free(vf.a, vf.shown);
  bs__free(vf.a, vf.m);
  bs__free(vf.a, vf.ids);
  bs__free(vf.a, vf.v.streams);
  if (problems) *problems = vf.v.problems;
  return rc;
}
