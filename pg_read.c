/*
 * pg_read.c: the PostgreSQL backend's reads (contract.md 5): bucket data by keyset pages of a
 * bucket's chunks (bs_chunks, pg_chunk.c; the ops decoded in place), checksums as the bucket's
 * running value minus the ops above C (the sums of the chunks above it, and the part above C of
 * the one chunk C cuts), checksum ranges for the cache above, parameter sets, checkpoint changes
 * and the bucket list. Every statement is a snapshot of its own and no transaction is open while
 * a callback runs, so a slow host never holds back vacuum: the calls that page (bucket data, the
 * bucket list) run each page as one statement (bucket_page says why a read stays correct when a
 * compaction commits between two of its pages).
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdlib.h>

static bs__pg_db *db_of(bs_storage *st) {
  return ((bs__pg_storage *)st)->db;
}

/* A bucket's chunks wholly above $3 (t) and wholly in ($4, $3] (g) are summed by the server from
 * their columns (a CLEAR among g's: its header's flag byte); the chunk that holds $3 + 1 with ops
 * at or below $3 (e3), and the one that holds $4 + 1 with ops at or below $4 (e4, when $4 < $3),
 * come whole, for the client to add their ops' part (value_at, sums). */
static const bs__pg_stmt states_stmt = {
    BS_PG_STMT_STATES,
    "SELECT r.ord, b.id, b.checksum, b.count, b.last_op, b.generation,"
    " b.clear_start, b.clear_op, t.s, t.n, g.s, g.n, g.cleared, b.max_op_bytes,"
    " e3.ops, e3.last_op, e4.ops, e4.last_op"
    " FROM unnest($2::bytea[]) WITH ORDINALITY AS r(name, ord)"
    " JOIN bs_buckets b ON b.stream = $1 AND b.name = r.name"
    " CROSS JOIN LATERAL (SELECT coalesce(sum(o.checksum), 0)::bigint AS s,"
    "  coalesce(sum(o.n), 0)::bigint AS n FROM bs_chunks o"
    "  WHERE b.last_op > $3 AND o.bucket = b.id AND o.first_op > $3) t"
    " CROSS JOIN LATERAL (SELECT coalesce(sum(o.checksum), 0)::bigint AS s,"
    "  coalesce(sum(o.n), 0)::bigint AS n,"
    "  coalesce(bool_or(get_byte(substring(o.ops FROM " BS_PG_SQL_CHUNK_FLAGS_AT " FOR 1), 0)"
    "  & " BS_PG_SQL_CHUNK_CLEAR " <> 0), false) AS cleared"
    "  FROM bs_chunks o WHERE $4 < $3 AND b.last_op > $4 AND o.bucket = b.id"
    "  AND o.first_op > $4 AND o.last_op <= $3) g"
    /* the first chunk past the edge, which holds ops at or below it when it starts there */
    " LEFT JOIN LATERAL (SELECT o.ops, o.last_op, o.first_op FROM bs_chunks o"
    "  WHERE b.last_op > $3 AND o.bucket = b.id AND o.last_op > $3"
    "  ORDER BY o.last_op LIMIT 1) e3 ON e3.first_op <= $3"
    " LEFT JOIN LATERAL (SELECT o.ops, o.last_op, o.first_op FROM bs_chunks o"
    "  WHERE $4 < $3 AND b.last_op > $4 AND o.bucket = b.id AND o.last_op > $4"
    "  ORDER BY o.last_op LIMIT 1) e4 ON e4.first_op <= $4"
    " ORDER BY r.ord"};

/* The bucket states of names (in order), with the sum and count of each bucket's ops above
 * `above` and, when range_from < above, of its ops in (range_from, above] and whether those
 * hold a CLEAR. Columns: 0 ord (1-based index into names), 1 id, 2 checksum, 3 count, 4 last_op,
 * 5 generation, 6 clear_start, 7 clear_op, 8 tail sum, 9 tail count (chunks wholly above),
 * 10 range sum, 11 range count, 12 range has a CLEAR (chunks wholly inside), 13 max_op_bytes,
 * 14, 15 the chunk cut at `above` and its last op, 16, 17 the one cut at range_from (NULL: none;
 * tail_at and range_at add their parts). Unknown buckets have no row. */
static int bucket_states(PGconn *c, bs_storage *st, const bs_val *names, size_t n, uint64_t above,
                         uint64_t range_from, PGresult **r, bs_error *err) {
  bs__pg_args a = {0};
  unsigned char *buf = NULL;
  int rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  if ((rc = bs__pg_arg_bytes_array(&a, names, n, &db_of(st)->base.alloc, &buf, err))) return rc;
  bs__pg_arg_i64(&a, (int64_t)above);
  bs__pg_arg_i64(&a, (int64_t)range_from);
  rc = bs__pg_execp(c, &states_stmt, &a, r, "reading bucket states", err);
  bs__free(&db_of(st)->base.alloc, buf);
  return rc;
}

static bs_val col_bytes(const PGresult *r, int i, int col) {
  return PQgetisnull(r, i, col) ? (bs_val){NULL, 0} : bs__pg_bytes(r, i, col);
}

static int chunk_corrupt(bs_error *err) {
  return bs__fail(err, BS_ECORRUPT, "bs_chunks: a chunk does not decode");
}

/* Row i's (checksum, count) at `above`: the running value minus the ops above it (the chunks
 * wholly above, and the part above of the chunk cut there). */
static int value_at(const PGresult *r, int i, uint64_t above, bs_checksum *v, bs_error *err) {
  uint32_t s = (uint32_t)bs__pg_i64(r, i, 8);
  uint64_t n = (uint64_t)bs__pg_i64(r, i, 9);
  if (bs__pg_chunk_range(col_bytes(r, i, 14), above, UINT64_MAX, &s, &n, NULL))
    return chunk_corrupt(err);
  v->checksum = bs__cksum_sub((uint32_t)bs__pg_i64(r, i, 2), s);
  v->count = (uint64_t)bs__pg_i64(r, i, 3) - n;
  return BS_OK;
}

/* Row i's ops in (from, to]: the chunks wholly inside, and the parts inside of the (one or two)
 * chunks cut at from and at to. */
static int range_at(const PGresult *r, int i, uint64_t from, uint64_t to, bs_checksum *v,
                    int *cleared, bs_error *err) {
  uint32_t s = (uint32_t)bs__pg_i64(r, i, 10);
  uint64_t n = (uint64_t)bs__pg_i64(r, i, 11);
  int same = !PQgetisnull(r, i, 15) && !PQgetisnull(r, i, 17) &&
             bs__pg_i64(r, i, 15) == bs__pg_i64(r, i, 17);
  *cleared = bs__pg_bool(r, i, 12);
  if (bs__pg_chunk_range(col_bytes(r, i, 14), from, to, &s, &n, cleared) ||
      (!same && bs__pg_chunk_range(col_bytes(r, i, 16), from, to, &s, &n, cleared)))
    return chunk_corrupt(err);
  v->checksum = s;
  v->count = n;
  return BS_OK;
}

/* ---- Checksums ------------------------------------------------------------------------------ */

static int sums(bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                bs_checksum *out, int *cleared, uint64_t *generation_out, bs_error *err) {
  PGconn *c;
  PGresult *r = NULL;
  int rc, row = 0, rows;
  for (size_t i = 0; i < n; i++) {
    out[i].checksum = 0;
    out[i].count = 0;
    if (cleared) cleared[i] = 0;
    if (generation_out) generation_out[i] = 0;
  }
  if (n == 0) return BS_OK;
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) return rc;
  rc = bucket_states(c, st, buckets, n, to, cleared ? from : to, &r, err);
  bs__pg_conn_put(db_of(st), c);
  if (rc) return rc;
  rows = PQntuples(r);
  for (size_t i = 0; i < n && !rc; i++) {
    if (row >= rows || bs__pg_i64(r, row, 0) != (int64_t)i + 1) continue; /* unknown bucket */
    rc = bs__torn_check((uint64_t)bs__pg_i64(r, row, 6), (uint64_t)bs__pg_i64(r, row, 7), to,
                        buckets[i], err);
    if (generation_out) generation_out[i] = (uint64_t)bs__pg_i64(r, row, 5);
    if (!rc && !cleared) {
      rc = value_at(r, row, to, &out[i], err);
    } else if (!rc) {
      int cl = 0;
      if (!(rc = range_at(r, row, from, to, &out[i], &cl, err)) && cl) {
        /* a CLEAR replaces what came before it: the value at `to` */
        rc = value_at(r, row, to, &out[i], err);
        cleared[i] = 1;
      }
    }
    row++;
  }
  PQclear(r);
  return rc;
}

int bs__pg_checksums(bs_checksum *out, uint64_t *generation_out, bs_storage *st,
                     uint64_t checkpoint, const bs_val *buckets, size_t n, bs_error *err) {
  return sums(st, checkpoint, checkpoint, buckets, n, out, NULL, generation_out, err);
}

int bs__pg_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *generation_out, bs_storage *st,
                           uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                           bs_error *err) {
  return sums(st, from, to, buckets, n, out, cleared, generation_out, err);
}

/* ---- Bucket data ---------------------------------------------------------------------------- */

/* One call's progress across its buckets: the chunker (rules.c) cuts the chunks. The ops of the
 * chunk being built point into page results; `held` keeps those alive until it is handed out. */
typedef struct data_read {
  const bs_allocator *a;
  PGconn *c;
  uint64_t checkpoint;
  bs__chunker k;
  PGresult **held;
  size_t n_held, cap_held;
  int (*on_chunk)(const bs_chunk *, void *);
  void *payload;
} data_read;

#define BS_PG_PAGE_CHUNKS 1000    /* chunks per page, at most */
#define BS_PG_PAGE_BYTES  4194304 /* op bytes per page (plus the chunk that crosses it) */

static int hold(data_read *r, PGresult *res, bs_error *err) {
  if (r->n_held == r->cap_held) {
    size_t cap = r->cap_held ? r->cap_held * 2 : 8;
    PGresult **p = bs__realloc(r->a, r->held, cap * sizeof *p);
    if (!p) {
      PQclear(res);
      return bs__fail(err, BS_ENOMEM, "bucket data: out of memory");
    }
    r->held = p;
    r->cap_held = cap;
  }
  r->held[r->n_held++] = res;
  return BS_OK;
}

/* Releases every held page but the last (the one being read). */
static void release(data_read *r) {
  if (r->n_held < 2) return;
  for (size_t i = 0; i + 1 < r->n_held; i++) PQclear(r->held[i]);
  r->held[0] = r->held[r->n_held - 1];
  r->n_held = 1;
}

/* The chunker's on_chunk: the caller's, then the pages before the current one go. */
static int handed(const bs_chunk *ch, void *payload) {
  data_read *r = payload;
  int rc = r->on_chunk(ch, r->payload);
  release(r);
  return rc;
}

/* A page of bucket $1 (bucket_page): at most $4 of its chunks from the one holding $2 + 1 (the
 * first whose last op is above $2), none starting above C = $3, in key order, with the bucket's
 * torn span (COL_CLEAR_START, COL_CLEAR_OP) from the same snapshot; an empty page is one row of
 * a NULL chunk, a bucket that is gone (a clear) no row. */
#define COL_CLEAR_START 1
#define COL_CLEAR_OP    2
static const bs__pg_stmt page_stmt = {
    BS_PG_STMT_PAGE,
    "SELECT p.ops, b.clear_start, b.clear_op FROM bs_buckets b LEFT JOIN LATERAL ("
    "SELECT ops, last_op FROM bs_chunks WHERE bucket = b.id AND last_op > $2 AND first_op <= $3"
    " ORDER BY last_op LIMIT $4) p ON true WHERE b.id = $1 ORDER BY p.last_op"};

/* Reads one page of the bucket into *res (held by r until its ops were handed out) and sets
 * *got to its chunks (0: none in range, also when the bucket is gone). Each page is one
 * statement in no transaction, so the callbacks between pages run outside any snapshot, and a
 * compaction may commit between two pages. The pages stay one read of C, as a caller continuing
 * with after = next_after in a new call would read (contract.md 5.2, 6): ops already handed out
 * are never read again (the next page starts at the chunk holding the op after the last one
 * handed out, whatever compaction rewrote meanwhile); a MOVE made since keeps its id and
 * checksum, and its target_op above C says so (5.5); a CLEAR made since at or below C comes in
 * range and stands for everything before it, the ops handed out included. What can no longer be
 * read is a bucket whose ops at or below C a CLEAR above C folded: then it has no op at or below
 * C, so the page is empty, and its torn span, read with it, fails the call (BS_EINVALIDATED). */
static int bucket_page(data_read *r, const bs__pg_args *a, bs_val name, PGresult **res, int *got,
                       bs_error *err) {
  int rc;
  if ((rc = bs__pg_execp(r->c, &page_stmt, a, res, "reading bucket data", err))) return rc;
  if ((rc = hold(r, *res, err))) return rc;
  *got = PQntuples(*res);
  if (*got == 0) return BS_OK;
  if (PQgetisnull(*res, 0, 0)) *got = 0;
  return bs__torn_check((uint64_t)bs__pg_i64(*res, 0, COL_CLEAR_START),
                        (uint64_t)bs__pg_i64(*res, 0, COL_CLEAR_OP), r->checkpoint, name, err);
}

/* Serves one bucket's ops in (after, C] to the chunker, until it stops the call, straight from
 * its chunks (decoded in place: the ops point into the held page). A page holds at most as many
 * chunks as the call may still take ops, and about `want` op bytes: no chunk holds more than
 * BS_PG_CHUNK_BYTES or, alone, the bucket's largest op (max_op, bs_buckets.max_op_bytes), so a
 * call is not read far past what the chunker will serve; the chunker makes the exact cut. */
static int read_bucket(data_read *r, bs_val name, uint64_t bucket, uint64_t after, uint64_t max_op,
                       bs_error *err) {
  bs__chunker *k = &r->k;
  int rc, done = 0;
  bs__pg_chunkr *ch = bs__malloc(r->a, sizeof *ch);
  if (!ch) return bs__fail(err, BS_ENOMEM, "bucket data: out of memory");
  bs__chunker_bucket(k, name, after);
  while (!done && !k->stopped) {
    bs__pg_args a = {0};
    PGresult *res;
    size_t left = k->limit - k->served, rows, want;
    int got;
    want = k->max_bytes - (k->bytes < k->max_bytes ? k->bytes : k->max_bytes);
    if (want > BS_PG_PAGE_BYTES) want = BS_PG_PAGE_BYTES;
    /* one op past the limit tells whether the bucket was cut: at most left + 1 chunks */
    rows = want / (max_op > BS_PG_CHUNK_BYTES ? max_op : BS_PG_CHUNK_BYTES) + 2;
    if (rows > left + 1) rows = left + 1;
    if (rows > BS_PG_PAGE_CHUNKS) rows = BS_PG_PAGE_CHUNKS;
    bs__pg_arg_i64(&a, (int64_t)bucket);
    bs__pg_arg_i64(&a, (int64_t)after);
    bs__pg_arg_i64(&a, (int64_t)r->checkpoint);
    bs__pg_arg_i64(&a, (int64_t)rows);
    if ((rc = bucket_page(r, &a, name, &res, &got, err))) break;
    done = (size_t)got < rows;
    for (int i = 0; i < got && !k->stopped && !rc; i++) {
      if (bs__pg_chunk_open(ch, bs__pg_bytes(res, i, 0))) {
        rc = chunk_corrupt(err);
        break;
      }
      for (uint32_t j = 0; j < ch->n && !k->stopped; j++) {
        bs_op op;
        if (ch->ids[j] <= after) continue;
        if (ch->ids[j] > r->checkpoint) {
          done = 1;
          break;
        }
        if (bs__pg_chunk_op(ch, j, &op)) {
          rc = chunk_corrupt(err);
          break;
        }
        if ((rc = bs__chunker_add(k, &op, err)) != 0) break;
        after = op.op_id;
      }
    }
    if (rc) break;
  }
  bs__free(r->a, ch);
  return rc ? rc : bs__chunker_end(k);
}

int bs__pg_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                       const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                       int (*on_chunk)(const bs_chunk *, void *), void *payload, bs_error *err) {
  const bs_allocator *a = &db_of(st)->base.alloc;
  bs_val *names;
  PGresult *states = NULL;
  data_read r;
  int rc, row = 0, rows;
  memset(&r, 0, sizeof r);
  r.a = a;
  r.checkpoint = checkpoint;
  BS_ASSERT(n_req && has_more_out); /* the front's, as the resolved opts */
  bs__chunker_init(&r.k, a, opts, handed, &r);
  r.on_chunk = on_chunk;
  r.payload = payload;
  if (!(names = bs__calloc(a, n_req, sizeof *names)))
    return bs__fail(err, BS_ENOMEM, "bucket data: %zu requests", n_req);
  for (size_t i = 0; i < n_req; i++) names[i] = req[i].bucket;
  if ((rc = bs__pg_conn_get(db_of(st), &r.c, err))) goto out;
  if ((rc = bucket_states(r.c, st, names, n_req, checkpoint, checkpoint, &states, err))) goto out;
  rows = PQntuples(states);
  /* every bucket checked first, so that a torn read fails before any chunk */
  for (int i = 0; i < rows && !rc; i++) {
    int64_t ord = bs__pg_i64(states, i, 0);
    rc = bs__torn_check((uint64_t)bs__pg_i64(states, i, 6), (uint64_t)bs__pg_i64(states, i, 7),
                        checkpoint, names[ord - 1], err);
  }
  for (size_t i = 0; i < n_req && !rc && !r.k.stopped; i++) {
    uint64_t after = req[i].after;
    if (row >= rows || bs__pg_i64(states, row, 0) != (int64_t)i + 1) continue;
    row++;
    if (after >= checkpoint || (uint64_t)bs__pg_i64(states, row - 1, 4) <= after) continue;
    rc = read_bucket(&r, req[i].bucket, (uint64_t)bs__pg_i64(states, row - 1, 1), after,
                     (uint64_t)bs__pg_i64(states, row - 1, 13), err);
  }
  if (!rc) *has_more_out = r.k.stopped;
out:
  for (size_t i = 0; i < r.n_held; i++) PQclear(r.held[i]);
  bs__free(a, r.held);
  bs__chunker_free(&r.k);
  PQclear(states);
  bs__pg_conn_put(db_of(st), r.c);
  bs__free(a, names);
  return rc;
}

/* ---- Parameter sets ------------------------------------------------------------------------- */

typedef struct param_row {
  int32_t table;
  bs_val rid, rows;
} param_row;

/* The order of a lookup's rows (bs__param_row_cmp: as every backend). */
static int param_row_cmp(const void *x, const void *y) {
  const param_row *a = x, *b = y;
  return bs__param_row_cmp((uint32_t)a->table, a->rid, (uint32_t)b->table, b->rid);
}
static const bs__pg_stmt params_stmt = {
    BS_PG_STMT_PARAMS, "SELECT 0::bigint, 0, NULL::bytea, param_horizon::bigint, NULL::bytea[]"
                       " FROM bs_streams WHERE id = $1 UNION ALL"
                       " SELECT * FROM (SELECT DISTINCT ON (l.ord, p.table_id, p.replica_id)"
                       "  l.ord, p.table_id, p.replica_id, p.op_id, p.rows"
                       "  FROM (SELECT min(ord) AS ord, lookup FROM unnest($2::bytea[])"
                       "   WITH ORDINALITY AS u(lookup, ord) GROUP BY lookup) l"
                       "  JOIN bs_params p ON p.stream = $1 AND p.lookup = l.lookup"
                       "  AND p.op_id <= $3"
                       "  ORDER BY l.ord, p.table_id, p.replica_id, p.op_id DESC) e"
                       " WHERE cardinality(e.rows) > 0"};

int bs__pg_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,
                          size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                          bs_error *err) {
  const bs_allocator *a = &db_of(st)->base.alloc;
  bs__pg_args args = {0};
  unsigned char *buf = NULL;
  PGconn *c = NULL;
  PGresult *r = NULL;
  param_row *v = NULL;
  size_t total = 0;
  int rc, nr;
  bs__pg_arg_i32(&args, (int32_t)st->stream_id);
  if ((rc = bs__pg_arg_bytes_array(&args, lookups, n, a, &buf, err))) return rc;
  bs__pg_arg_i64(&args, (int64_t)checkpoint);
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) goto out;
  /* per (lookup, source row) the latest entry at or below C; the horizon row comes first */
  rc = bs__pg_execp(c, &params_stmt, &args, &r, "reading parameter sets", err);
  bs__pg_conn_put(db_of(st), c);
  if (rc) goto out;
  nr = PQntuples(r);
  if (nr == 0) {
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)st->stream_id);
    goto out;
  }
  if ((rc = bs__param_horizon_check(checkpoint, (uint64_t)bs__pg_i64(r, 0, 3), err))) goto out;
  if (!(v = bs__calloc(a, (size_t)nr, sizeof *v))) {
    rc = bs__fail(err, BS_ENOMEM, "parameter sets: out of memory");
    goto out;
  }
  for (int i = 1; i < nr; i++) {
    bs__pg_array it;
    param_row *p = &v[i - 1];
    p->table = bs__pg_i32(r, i, 1);
    p->rid = bs__pg_bytes(r, i, 2);
    p->rows = bs__pg_bytes(r, i, 4);
    if ((rc = bs__pg_array_open(p->rows, &it, err))) goto out;
    total += it.n;
  }
  if ((rc = bs__param_limit_check(total, limit, err))) goto out;
  /* rows of one lookup in their order; lookups in request order (the query's ord) */
  for (int i = 1, j; i < nr; i = j) {
    for (j = i + 1; j < nr && bs__pg_i64(r, j, 0) == bs__pg_i64(r, i, 0); j++) continue;
    qsort(&v[i - 1], (size_t)(j - i), sizeof *v, param_row_cmp);
  }
  for (int i = 0; i + 1 < nr && !rc; i++) {
    bs__pg_array it;
    bs_val row;
    bs__pg_array_open(v[i].rows, &it, NULL);
    while (!rc && bs__pg_array_next(&it, &row) == 1) rc = fn(&row, payload);
  }
out:
  bs__free(a, v);
  bs__free(a, buf);
  PQclear(r);
  return rc;
}

/* ---- Checkpoint changes --------------------------------------------------------------------- */

/* Records are keyed by the highest op id they cover (op_id) and keep the first (first_op). A
 * record's buckets and lookups count when its ops [first_op, op_id] meet (from, to]; its users
 * also when it sits in [$5, to], $5 being bs__changes_users_from(from) (contract.md 5.1). The
 * users' scan says the same in one range: a record above `to` that meets (from, to] is above
 * `from` too (from <= to). Whether `from` lies below the stream's fence is decided in C from the
 * fence the statement returns (bs__changes_fenced).
 *
 * Every scan of bs_changes bounds op_id on both sides, the upper bound the largest int8 (no
 * record lies above it), so that it is a range of the primary key: a generic plan, which does
 * not know `from`, estimates a one-sided bound at a third of the stream's records and so reads
 * them all (a reader 5 ops behind the head of a 300k-record bs_changes: parallel sequential
 * scans, 24,600 buffers, 250 ms), but a range at 0.5% of them, which it walks by the index (22
 * buffers, 0.13 ms); planned for the values, the bound changes nothing. */
#define RANGE(lo) "c.stream = $1 AND c.op_id " lo " AND c.op_id <= 9223372036854775807"
#define MEET      RANGE("> $2") " AND c.first_op <= c.op_id AND c.first_op <= $3"

static const bs__pg_stmt changes_stmt = {
    BS_PG_STMT_CHANGES,
    "(SELECT 3::smallint AS kind, NULL::bytea AS v, coalesce(f.d, false), coalesce(f.p, false),"
    "  s.changes_fence"
    " FROM bs_streams s, (SELECT bool_or(c.flags & " BS_PG_SQL_CHG_BUCKETS " <> 0) AS d,"
    "  bool_or(c.flags & " BS_PG_SQL_CHG_LOOKUPS " <> 0) AS p"
    "  FROM bs_changes c WHERE " MEET ") AS f WHERE s.id = $1)"
    " UNION ALL (SELECT DISTINCT 0::smallint, b, false, false, NULL::int8 FROM bs_changes c,"
    "  unnest(c.buckets) AS b WHERE " MEET " LIMIT $4)"
    " UNION ALL (SELECT DISTINCT 1::smallint, l, false, false, NULL::int8 FROM bs_changes c,"
    "  unnest(c.lookups) AS l WHERE " MEET " LIMIT $4)"
    " UNION ALL (SELECT DISTINCT 2::smallint, u, false, false, NULL::int8 FROM bs_changes c,"
    "  unnest(c.users) AS u WHERE " RANGE(">= $5") " AND (c.op_id <= $3 OR c.first_op <= $3))"};

/* A range of more ops than this is planned for its values (bs__pg_exec_custom): its records may
 * be most of the stream's, which a sequential scan reads faster than the index (a reader at 0 of
 * 300k records: 0.75-0.95 s against 1.6-2.7 s), and the planning (0.3 ms) is small beside
 * reading them. Nearer readers run the prepared statement, planned once per session. */
#define BS_PG_CHANGES_PREPARED 10000

int bs__pg_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                              int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                              bs_error *err) {
  const bs_allocator *a = &db_of(st)->base.alloc;
  bs__pg_args args = {0};
  bs_checkpoint_changes ch;
  bs_val *lists[3] = {NULL, NULL, NULL};
  size_t counts[3] = {0, 0, 0};
  PGconn *c = NULL;
  PGresult *r = NULL;
  int rc, nr;
  memset(&ch, 0, sizeof ch);
  bs__pg_arg_i32(&args, (int32_t)st->stream_id);
  bs__pg_arg_i64(&args, (int64_t)from);
  bs__pg_arg_i64(&args, (int64_t)to);
  bs__pg_arg_i64(&args, (int64_t)bs__changes_enough());
  bs__pg_arg_i64(&args, (int64_t)bs__changes_users_from(from));
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) return rc;
  /* kind 3: the records' too-many flags and the fence (changes below it were dropped) */
  rc = to - from > BS_PG_CHANGES_PREPARED
           ? bs__pg_exec_custom(c, changes_stmt.sql, &args, &r, "reading checkpoint changes", err)
           : bs__pg_execp(c, &changes_stmt, &args, &r, "reading checkpoint changes", err);
  bs__pg_conn_put(db_of(st), c);
  if (rc) return rc;
  nr = PQntuples(r);
  for (int k = 0; k < 3; k++)
    if (nr && !(lists[k] = bs__calloc(a, (size_t)nr, sizeof *lists[k]))) {
      rc = bs__fail(err, BS_ENOMEM, "checkpoint changes: out of memory");
      goto out;
    }
  for (int i = 0; i < nr; i++) {
    int kind = bs__pg_i16(r, i, 0);
    if (kind == 3) {
      int fenced = bs__changes_fenced(from, (uint64_t)bs__pg_i64(r, i, 4));
      ch.invalidate_data_buckets = fenced || bs__pg_bool(r, i, 2);
      ch.invalidate_parameter_buckets = fenced || bs__pg_bool(r, i, 3);
    } else {
      lists[kind][counts[kind]++] = bs__pg_bytes(r, i, 1);
    }
  }
  ch.updated_buckets = lists[0]; /* too many: invalidate-all (the front's rule) */
  ch.n_updated_buckets = counts[0];
  ch.updated_lookups = lists[1];
  ch.n_updated_lookups = counts[1];
  ch.updated_write_checkpoint_users = lists[2];
  ch.n_updated_write_checkpoint_users = counts[2];
  rc = fn(&ch, payload);
out:
  for (int k = 0; k < 3; k++) bs__free(a, lists[k]);
  PQclear(r);
  return rc;
}

/* ---- Listing buckets ------------------------------------------------------------------------ */

#define BS_PG_LIST_PAGE 1000

/* Keyset pages of the (stream, name) key, each one statement (its own snapshot: storage.h), so
 * fn runs in no transaction; a bucket is still listed once, in order. Buckets whose ops
 * compaction removed (count 0) are skipped, as in the other backends. */
int bs__pg_list_buckets(bs_storage *st, bs_val start_after,
                        int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                        bs_error *err) {
  PGconn *c;
  PGresult *r = NULL;
  bs_val after = start_after;
  int rc, got = BS_PG_LIST_PAGE;
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) return rc;
  if (!after.data) after.data = "";
  while (!rc && got == BS_PG_LIST_PAGE) {
    bs__pg_args a = {0};
    PGresult *next;
    bs__pg_arg_i32(&a, (int32_t)st->stream_id);
    bs__pg_arg_bytes(&a, after);
    bs__pg_arg_i32(&a, BS_PG_LIST_PAGE);
    rc = bs__pg_exec(c,
                     "SELECT name, checksum, count, last_op, bytes, generation,"
                     " CASE WHEN last_op <= compacted_op THEN 0"
                     "  ELSE greatest(count - compacted_count, 0) END"
                     " FROM bs_buckets WHERE stream = $1 AND name > $2 AND count > 0"
                     " ORDER BY name LIMIT $3",
                     &a, &next, "listing buckets", err);
    PQclear(r); /* `after` pointed into the previous page */
    r = next;
    if (rc) break;
    got = PQntuples(r);
    for (int i = 0; i < got && !rc; i++) {
      bs_bucket_info info;
      info.name = bs__pg_bytes(r, i, 0);
      info.checksum = (uint32_t)bs__pg_i64(r, i, 1);
      info.count = (uint64_t)bs__pg_i64(r, i, 2);
      info.last_op = (uint64_t)bs__pg_i64(r, i, 3);
      info.bytes = (uint64_t)bs__pg_i64(r, i, 4);
      info.generation = (uint64_t)bs__pg_i64(r, i, 5);
      info.changes = (uint64_t)bs__pg_i64(r, i, 6);
      rc = fn(&info, payload); /* the caller's value, unchanged */
      after = info.name;
    }
  }
  PQclear(r);
  bs__pg_conn_put(db_of(st), c);
  return rc;
}
