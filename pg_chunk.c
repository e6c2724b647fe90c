/*
 * pg_chunk.c: schema 8's op chunks (bs_chunks, pg_internal.h): a bucket's ops in rows of runs,
 * each row's ops in opchunk.c's encoding (the compact op values of LMDB format 6), keyed
 * (bucket, last_op) with first_op, n and the checksum sum beside the bytes for the statements.
 * The one file that builds chunk rows (the writer's flush, the migration from schema 7,
 * compaction's rewrites) and decodes them (reads, checksums' edges, compaction, verify, export).
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Building --------------------------------------------------------------------------------- */

void bs__pg_chunk_row(bs__pg_buf *rows, const bs_allocator *a, uint64_t bucket,
                      const unsigned char *chunk, size_t size, uint64_t last) {
  bs__pg_copy_tuple(rows, a, 6);
  bs__pg_copy_int(rows, a, bucket, 8);
  bs__pg_copy_int(rows, a, last, 8);
  bs__pg_copy_int(rows, a, bs__chunk_first(chunk), 8);
  bs__pg_copy_int(rows, a, bs__chunk_n(chunk), 4);
  bs__pg_copy_int(rows, a, bs__chunk_sum(chunk), 4); /* integer: the same 32 bits, signed */
  bs__pg_copy_bytes(rows, a, (bs_val){chunk, size});
}

/* Seals k's chunk and appends it to rows as a row of bucket; k is empty after. */
static int chunkb_emit(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket) {
  if (!k->nops) return BS_OK;
  if (bs__chunk_seal_as(k->p, k->n, k->first, BS_CHUNK_COMPACT)) return BS_ECORRUPT;
  bs__pg_chunk_row(rows, a, bucket, k->p, k->n, k->last);
  k->nops = 0;
  k->n = 0;
  return rows->oom ? BS_ENOMEM : BS_OK;
}

int bs__pg_chunkb_value(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket,
                        uint64_t id, const bs_op *op, const unsigned char *val, size_t vs) {
  size_t need;
  int rc;
  BS_ASSERT(!k->nops || id > k->last);
  need = bs__varint_len(k->nops ? id - k->last : 0) + bs__varint_len(vs) + vs;
  /* a chunk holds at most BS_PG_CHUNK_BYTES with its header (one larger op alone) and
   * BS_CHUNK_MAX_OPS ops: the next op starts a new one */
  if (k->nops && (k->nops == BS_CHUNK_MAX_OPS || k->n + need > BS_PG_CHUNK_BYTES) &&
      (rc = chunkb_emit(k, a, rows, bucket)))
    return rc;
  if (!k->nops) k->n = BS_CHUNK_HDR, k->first = id;
  need = bs__varint_len(k->nops ? id - k->last : 0) + bs__varint_len(vs) + vs;
  if (k->n + need > k->cap) {
    size_t cap = k->cap ? k->cap : BS_PG_CHUNK_BYTES;
    unsigned char *p;
    while (cap < k->n + need) cap *= 2;
    if (!(p = bs__realloc(a, k->p, cap))) return BS_ENOMEM;
    k->p = p;
    k->cap = cap;
  }
  k->n += bs__chunk_add_as(k->p + k->n, k->nops ? id - k->last : 0, op, val, vs, BS_CHUNK_COMPACT);
  k->nops++;
  k->last = id;
  return BS_OK;
}

int bs__pg_chunkb_add(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket,
                      const bs_op *op) {
  bs_op f = *op;
  bs__op_fields(&f); /* the fields the type carries */
  return bs__pg_chunkb_value(k, a, rows, bucket, op->op_id, &f, NULL, bs__op_value_csize(&f));
}

int bs__pg_chunkb_end(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket) {
  return chunkb_emit(k, a, rows, bucket);
}

void bs__pg_chunkb_free(bs__pg_chunkb *k, const bs_allocator *a) {
  bs__free(a, k->p);
  memset(k, 0, sizeof *k);
}

/* ---- Decoding --------------------------------------------------------------------------------- */

int bs__pg_chunk_open(bs__pg_chunkr *r, bs_val v) {
  r->p = (const unsigned char *)v.data;
  r->size = v.size;
  r->n = 0;
  if (!v.data || bs__chunk_decode(r->p, r->size, r->ids, r->off, r->len, &r->n)) return BS_ECORRUPT;
  r->flags = bs__chunk_flags(r->p);
  return BS_OK;
}

int bs__pg_chunk_op(const bs__pg_chunkr *r, uint32_t i, bs_op *op) {
  if (bs__op_value_decode_as(r->p + r->off[i], r->len[i], r->ids[i], r->flags, op))
    return BS_ECORRUPT;
  bs__op_fields(op);
  return BS_OK;
}

uint32_t bs__pg_chunk_cksum(const bs__pg_chunkr *r, uint32_t i) {
  return bs__get_u32le(r->p + r->off[i] + 1);
}

int bs__pg_chunk_is_clear(const bs__pg_chunkr *r, uint32_t i) {
  unsigned t = r->p[r->off[i]];
  return (r->flags & BS_CHUNK_COMPACT ? t & 7u : t) == BS_OP_CLEAR;
}

int bs__pg_chunk_range(bs_val v, uint64_t lo, uint64_t hi, uint32_t *sum, uint64_t *count,
                       int *cleared) {
  bs__pg_chunkr r;
  if (!v.data) return BS_OK; /* no chunk crosses the edge */
  if (bs__pg_chunk_open(&r, v)) return BS_ECORRUPT;
  for (uint32_t i = 0; i < r.n; i++) {
    if (r.ids[i] <= lo || r.ids[i] > hi) continue;
    *sum = bs__cksum_add(*sum, bs__pg_chunk_cksum(&r, i));
    ++*count;
    if (cleared && bs__pg_chunk_is_clear(&r, i)) *cleared = 1;
  }
  return BS_OK;
}

/* ---- Walking every chunk ---------------------------------------------------------------------- */

int bs__pg_chunks_walk(PGconn *c, const char *where, const bs__pg_args *args,
                       int (*fn)(uint64_t bucket, uint64_t last, const bs__pg_chunkr *ch,
                                 void *payload),
                       void *payload, bs_error *err) {
  char sql[512];
  bs__pg_chunkr *ch = bs__malloc(&bs__default_allocator, sizeof *ch);
  int rc, n;
  if (!ch) return bs__fail(err, BS_ENOMEM, "reading chunks: out of memory");
  snprintf(sql, sizeof sql,
           "DECLARE bs_walk NO SCROLL CURSOR FOR SELECT bucket, last_op, ops FROM bs_chunks%s%s"
           " ORDER BY bucket, last_op",
           where ? " WHERE " : "", where ? where : "");
  rc = bs__pg_run(c, sql, args, "reading chunks", err);
  do {
    PGresult *r;
    if (rc || (rc = bs__pg_exec(c, "FETCH 1000 FROM bs_walk", NULL, &r, "reading chunks", err)))
      break;
    n = PQntuples(r);
    for (int i = 0; i < n && !rc; i++) {
      uint64_t b = (uint64_t)bs__pg_i64(r, i, 0), last = (uint64_t)bs__pg_i64(r, i, 1);
      if (bs__pg_chunk_open(ch, bs__pg_bytes(r, i, 2)) || ch->ids[ch->n - 1] != last)
        rc = bs__fail(err, BS_ECORRUPT,
                      "bs_chunks: the chunk of bucket id %" PRIu64 " keyed %" PRIu64
                      " does not decode",
                      b, last);
      else
        rc = fn(b, last, ch, payload);
    }
    PQclear(r);
  } while (!rc && n == 1000);
  if (!rc) rc = bs__pg_run(c, "CLOSE bs_walk", NULL, "reading chunks", err);
  bs__free(&bs__default_allocator, ch);
  return rc;
}

/* ---- Ops read from chunks (compaction) -------------------------------------------------------- */

void bs__pg_opset_clear(bs__pg_opset *s) {
  for (size_t i = 0; i < s->nheld; i++) PQclear(s->held[i]);
  s->nheld = 0;
  s->n = 0;
}

void bs__pg_opset_free(bs__pg_opset *s, const bs_allocator *a) {
  bs__pg_opset_clear(s);
  bs__free(a, s->held);
  bs__free(a, s->ops);
  bs__free(a, s->bytes);
  memset(s, 0, sizeof *s);
}

static int opset_hold(bs__pg_opset *s, const bs_allocator *a, PGresult *r) {
  if (s->nheld == s->cheld) {
    size_t cap = s->cheld ? s->cheld * 2 : 4;
    PGresult **p = bs__realloc(a, s->held, cap * sizeof *p);
    if (!p) {
      PQclear(r);
      return BS_ENOMEM;
    }
    s->held = p;
    s->cheld = cap;
  }
  s->held[s->nheld++] = r;
  return BS_OK;
}

static int opset_push(bs__pg_opset *s, const bs_allocator *a, const bs_op *op) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    bs_op *o = bs__realloc(a, s->ops, cap * sizeof *o);
    uint64_t *b;
    if (!o) return BS_ENOMEM;
    s->ops = o;
    if (!(b = bs__realloc(a, s->bytes, cap * sizeof *b))) return BS_ENOMEM;
    s->bytes = b;
    s->cap = cap;
  }
  s->ops[s->n] = *op;
  s->bytes[s->n++] = bs__pg_op_bytes(op);
  return BS_OK;
}

static int opset_fail(int rc, bs_error *err) {
  return bs__fail(
      err, rc, rc == BS_ENOMEM ? "compact: out of memory" : "bs_chunks: a chunk does not decode");
}

/* The ops of result r's chunks (column 0, in the page's order) in [lo, hi] pushed in that
 * direction while fewer than limit are in s; *more: the last chunk was passed whole. */
static int opset_take(bs__pg_opset *s, const bs_allocator *a, PGresult *r, uint64_t lo, uint64_t hi,
                      int desc, size_t limit, bs__pg_chunkr *ch) {
  int rows = PQntuples(r);
  for (int i = 0; i < rows && s->n < limit; i++) {
    if (bs__pg_chunk_open(ch, bs__pg_bytes(r, i, 0))) return BS_ECORRUPT;
    for (uint32_t k = 0; k < ch->n && s->n < limit; k++) {
      uint32_t j = desc ? ch->n - 1 - k : k;
      bs_op op;
      if (ch->ids[j] < lo || ch->ids[j] > hi) continue;
      if (bs__pg_chunk_op(ch, j, &op)) return BS_ECORRUPT;
      if (opset_push(s, a, &op)) return BS_ENOMEM;
    }
  }
  return BS_OK;
}

int bs__pg_opset_page(PGconn *c, const bs_allocator *a, bs__pg_opset *s, uint64_t bucket,
                      uint64_t lo, uint64_t hi, int desc, size_t limit, bs_error *err) {
  bs__pg_chunkr *ch = bs__malloc(a, sizeof *ch);
  uint64_t pos = desc ? hi : lo;
  int rc = BS_OK;
  bs__pg_opset_clear(s);
  if (!ch) return opset_fail(BS_ENOMEM, err);
  /* chunks a statement at a time (each holds at least one op: at most as many as ops wanted,
   * and few enough that a page of small chunks stays a few MiB) until limit ops are in s */
  while (s->n < limit && (desc ? pos >= lo : pos <= hi)) {
    bs__pg_args q = {0};
    PGresult *r;
    size_t want = (limit - s->n) / 8 + 2;
    uint64_t at = pos; /* this statement's ops: from at on in the direction read */
    int rows;
    bs__pg_arg_i64(&q, (int64_t)bucket);
    bs__pg_arg_i64(&q, (int64_t)pos);
    bs__pg_arg_i64(&q, (int64_t)(desc ? lo : hi));
    bs__pg_arg_i64(&q, (int64_t)want);
    if ((rc = bs__pg_exec(c,
                          /* down from the chunk that holds $2 (the first whose last op is at
                           * or above it): an index range, not a scan of the chunks above */
                          desc ? "SELECT ops, first_op FROM bs_chunks WHERE bucket = $1"
                                 " AND last_op >= $3 AND last_op <= coalesce((SELECT last_op"
                                 " FROM bs_chunks WHERE bucket = $1 AND last_op >= $2"
                                 " ORDER BY last_op LIMIT 1), $2)"
                                 " ORDER BY last_op DESC LIMIT $4"
                               : "SELECT ops, last_op FROM bs_chunks WHERE bucket = $1"
                                 " AND last_op >= $2 AND first_op <= $3"
                                 " ORDER BY last_op LIMIT $4",
                          &q, &r, "compact: reading ops", err)))
      break;
    rows = PQntuples(r);
    if (rows) {
      uint64_t edge = (uint64_t)bs__pg_i64(r, rows - 1, 1);
      if (desc && edge == 0) rows = 0; /* nothing below: done */
      pos = desc ? edge - 1 : edge + 1;
    }
    if ((rc = opset_hold(s, a, r))) break;
    if ((rc = opset_take(s, a, r, desc ? lo : at, desc ? at : hi, desc, limit, ch))) break;
    if ((size_t)rows < want) break; /* the range's last chunk */
  }
  bs__free(a, ch);
  return rc == BS_ENOMEM || rc == BS_ECORRUPT ? opset_fail(rc, err) : rc;
}

int bs__pg_opset_ids(PGconn *c, const bs_allocator *a, bs__pg_opset *s, uint64_t bucket,
                     const uint64_t *ids, size_t n, bs_error *err) {
  bs__pg_args q = {0};
  bs__pg_chunkr *ch;
  unsigned char *arr = NULL;
  PGresult *r;
  size_t at = 0;
  int rc;
  bs__pg_opset_clear(s);
  if (!n) return BS_OK;
  if (!(ch = bs__malloc(a, sizeof *ch))) return opset_fail(BS_ENOMEM, err);
  bs__pg_arg_i64(&q, (int64_t)bucket);
  if ((rc = bs__pg_arg_i64_array(&q, ids, n, a, &arr, err)) ||
      (rc = bs__pg_exec(c,
                        "SELECT DISTINCT ON (k.last_op) k.ops FROM unnest($2::int8[]) AS e(id)"
                        " CROSS JOIN LATERAL (SELECT ops, last_op, first_op FROM bs_chunks"
                        "  WHERE bucket = $1 AND last_op >= e.id ORDER BY last_op LIMIT 1) k"
                        " WHERE k.first_op <= e.id ORDER BY k.last_op",
                        &q, &r, "compact: reading ops", err))) {
    bs__free(a, arr);
    bs__free(a, ch);
    return rc;
  }
  bs__free(a, arr);
  if ((rc = opset_hold(s, a, r))) goto out;
  /* ids ascending (the callers'), the chunks too: a merge */
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    if (bs__pg_chunk_open(ch, bs__pg_bytes(r, i, 0))) {
      rc = BS_ECORRUPT;
      break;
    }
    for (uint32_t j = 0; j < ch->n && !rc; j++) {
      bs_op op;
      while (at < n && ids[at] < ch->ids[j]) at++;
      if (at == n || ids[at] != ch->ids[j]) continue;
      if (bs__pg_chunk_op(ch, j, &op))
        rc = BS_ECORRUPT;
      else
        rc = opset_push(s, a, &op);
    }
  }
out:
  bs__free(a, ch);
  return rc == BS_ENOMEM || rc == BS_ECORRUPT ? opset_fail(rc, err) : rc;
}

/* ---- Rewriting chunks (compaction) ------------------------------------------------------------ */

static int cmp_edit(const void *x, const void *y) {
  const bs__pg_edit *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* The edit of op id among e (sorted by lo, disjoint), or NULL; *at moves ahead (ids ascend). */
static const bs__pg_edit *edit_of(const bs__pg_edit *e, size_t n, size_t *at, uint64_t id) {
  while (*at < n && e[*at].hi < id) ++*at;
  return *at < n && e[*at].lo <= id ? &e[*at] : NULL;
}

/* Cut chunks read, rewritten and replaced per statement: at most about 256 KiB of chunks of the
 * usual size in memory twice (read, rewritten), whatever a transaction's edits cut (10,000 MOVEs
 * spread over a bucket cut thousands of chunks: read in one statement, they and their rewrite
 * were most of compaction's peak memory, bench/README.md "Compaction on schema 9"). */
#define EDIT_GROUP  64
/* A chunk below this many bytes beside a cut one is rewritten with it (merged): the chunks
 * compaction leaves (a cut chunk's ops made MOVEs or deleted) then fill up again as the
 * writer's, instead of staying small. */
#define SMALL_CHUNK (BS_PG_CHUNK_BYTES / 2)

/* One group of the chunks to rewrite (keys[0..n), ascending; prev[i] the key of the chunk before
 * keys[i] in the bucket when they were listed): read locked, their ops edited and appended to
 * k, the run continued from the last chunk consumed (*tail) when the next is right after it,
 * else sealed first; then the group's chunks are deleted and the chunks sealed so far COPYed.
 * end: the last group (k sealed after it). */
static int edit_group(PGconn *c, const bs_allocator *a, uint64_t bucket, const bs__pg_edit *e,
                      size_t n, size_t *at, const uint64_t *keys, const uint64_t *prev, size_t nk,
                      int end, uint64_t *tail, bs__pg_chunkb *k, bs__pg_chunkr *ch,
                      uint64_t *deleted, uint64_t *edited, bs_error *err) {
  bs__pg_args q = {0};
  bs__pg_buf rows = {0};
  unsigned char *arr = NULL;
  uint64_t *got = NULL;
  size_t ngot = 0, ki = 0;
  PGresult *r = NULL;
  int rc;
  bs__pg_arg_i64(&q, (int64_t)bucket);
  if ((rc = bs__pg_arg_i64_array(&q, keys, nk, a, &arr, err)) ||
      (rc = bs__pg_exec(c,
                        /* locked: a clear that deleted one meanwhile leaves it unread, so it
                         * is not written again */
                        "SELECT last_op, ops FROM bs_chunks WHERE bucket = $1"
                        " AND last_op = ANY($2) ORDER BY last_op FOR UPDATE",
                        &q, &r, "compact: rewriting chunks", err)))
    goto out;
  if (!(got = bs__calloc(a, (size_t)PQntuples(r) + 1, 8))) {
    rc = opset_fail(BS_ENOMEM, err);
    goto out;
  }
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    uint64_t key = (uint64_t)bs__pg_i64(r, i, 0);
    while (ki < nk && keys[ki] < key) ki++;
    if (ki == nk || bs__pg_chunk_open(ch, bs__pg_bytes(r, i, 1)) || ch->ids[ch->n - 1] != key) {
      rc = BS_ECORRUPT;
      break;
    }
    /* a run goes on only over a chunk right after the last one consumed: joined across a
     * chunk no edit touched, its ops would span that chunk's */
    if (k->nops && prev[ki] != *tail && (rc = bs__pg_chunkb_end(k, a, &rows, bucket))) break;
    got[ngot++] = key;
    *tail = key;
    for (uint32_t j = 0; j < ch->n && !rc; j++) {
      const bs__pg_edit *x = edit_of(e, n, at, ch->ids[j]);
      bs_op op;
      if (!x) { /* kept as it is */
        rc = bs__pg_chunkb_value(k, a, &rows, bucket, ch->ids[j], NULL, ch->p + ch->off[j],
                                 ch->len[j]);
        if (rc == BS_OK && !(ch->flags & BS_CHUNK_COMPACT)) rc = BS_ECORRUPT;
        continue;
      }
      if (x->kind == BS_PG_EDIT_DELETE) {
        ++*deleted;
        continue;
      }
      if ((rc = bs__pg_chunk_op(ch, j, &op))) break;
      if (x->kind == BS_PG_EDIT_MOVE && bs__op_carries_row(op.type)) {
        op = bs__compact_move_op(&op, x->target);
        ++*edited;
      } else if (x->kind == BS_PG_EDIT_CLEAR) {
        op = bs__compact_clear_op(x->clear);
        ++*edited;
      }
      rc = bs__pg_chunkb_add(k, a, &rows, bucket, &op);
    }
  }
  if (!rc && end) rc = bs__pg_chunkb_end(k, a, &rows, bucket);
  if (rc == BS_ENOMEM || rc == BS_ECORRUPT) {
    rc = opset_fail(rc, err);
    goto out;
  }
  PQclear(r);
  r = NULL;
  if (!rc && ngot) {
    bs__pg_args d = {0};
    bs__free(a, arr);
    arr = NULL;
    bs__pg_arg_i64(&d, (int64_t)bucket);
    if ((rc = bs__pg_arg_i64_array(&d, got, ngot, a, &arr, err)) ||
        (rc = bs__pg_run(c, "DELETE FROM bs_chunks WHERE bucket = $1 AND last_op = ANY($2)", &d,
                         "compact: rewriting chunks", err)))
      goto out;
  }
  if (!rc && rows.n) rc = bs__pg_copy_in(c, BS_PG_CHUNK_COPY, &rows, a, err);
out:
  PQclear(r);
  bs__free(a, arr);
  bs__free(a, got);
  bs__free(a, rows.p);
  return rc;
}

int bs__pg_chunks_edit(PGconn *c, const bs_allocator *a, uint64_t bucket, bs__pg_edit *e, size_t n,
                       uint64_t *deleted, uint64_t *edited, bs_error *err) {
  bs__pg_args q = {0};
  unsigned char *b1 = NULL, *b2 = NULL, *b3 = NULL;
  uint64_t *lo = NULL, *hi = NULL, *kind = NULL, *keys = NULL, *prev = NULL, tail = 0;
  size_t nk = 0, at = 0;
  bs__pg_chunkr *ch = NULL;
  bs__pg_chunkb k;
  PGresult *r = NULL;
  int rc = BS_OK;
  memset(&k, 0, sizeof k);
  *deleted = *edited = 0;
  if (!n) return BS_OK;
  qsort(e, n, sizeof *e, cmp_edit);
  if (!(lo = bs__calloc(a, n, 8)) || !(hi = bs__calloc(a, n, 8)) || !(kind = bs__calloc(a, n, 8)) ||
      !(ch = bs__malloc(a, sizeof *ch))) {
    rc = opset_fail(BS_ENOMEM, err);
    goto out;
  }
  for (size_t i = 0; i < n; i++) lo[i] = e[i].lo, hi[i] = e[i].hi, kind[i] = (uint64_t)e[i].kind;
  bs__pg_arg_i64(&q, (int64_t)bucket);
  if ((rc = bs__pg_arg_i64_array(&q, lo, n, a, &b1, err)) ||
      (rc = bs__pg_arg_i64_array(&q, hi, n, a, &b2, err)) ||
      (rc = bs__pg_arg_i64_array(&q, kind, n, a, &b3, err)))
    goto out;
  /* chunks wholly inside a deleted range go without being read */
  if ((rc = bs__pg_exec(c,
                        "WITH d AS (DELETE FROM bs_chunks k USING unnest($2::int8[], $3::int8[],"
                        " $4::int8[]) AS e(lo, hi, kind) WHERE k.bucket = $1"
                        " AND e.kind = 0 AND k.first_op >= e.lo"
                        " AND k.last_op <= e.hi RETURNING k.n)"
                        " SELECT coalesce(sum(n), 0)::bigint FROM d",
                        &q, &r, "compact: rewriting chunks", err)))
    goto out;
  *deleted = (uint64_t)bs__pg_i64(r, 0, 0);
  PQclear(r);
  r = NULL;
  /* then the keys of the chunks an edit cuts (at most two a range, its edges; one a single op)
   * and of the small chunks right beside them, each with the key of the chunk before it: they
   * are read a group at a time, their ops edited and written again as the writer would chunk
   * them, a run of adjacent ones as one run */
  bs__pg_arg_i64(&q, (int64_t)SMALL_CHUNK);
  if ((rc = bs__pg_exec(c,
                        "WITH c AS (SELECT DISTINCT k.last_op FROM unnest($2::int8[], $3::int8[],"
                        "  $4::int8[]) AS e(lo, hi, kind) CROSS JOIN LATERAL (SELECT last_op,"
                        "  first_op FROM bs_chunks WHERE bucket = $1 AND last_op >= e.lo"
                        "  ORDER BY last_op LIMIT 2) k WHERE k.first_op <= e.hi),"
                        " s AS (SELECT last_op FROM c"
                        "  UNION SELECT p.last_op FROM c CROSS JOIN LATERAL (SELECT last_op, ops"
                        "   FROM bs_chunks WHERE bucket = $1 AND last_op < c.last_op"
                        "   ORDER BY last_op DESC LIMIT 1) p WHERE octet_length(p.ops) < $5"
                        "  UNION SELECT x.last_op FROM c CROSS JOIN LATERAL (SELECT last_op, ops"
                        "   FROM bs_chunks WHERE bucket = $1 AND last_op > c.last_op"
                        "   ORDER BY last_op LIMIT 1) x WHERE octet_length(x.ops) < $5)"
                        " SELECT s.last_op, coalesce((SELECT max(p.last_op) FROM bs_chunks p"
                        "  WHERE p.bucket = $1 AND p.last_op < s.last_op), 0) FROM s ORDER BY 1",
                        &q, &r, "compact: rewriting chunks", err)))
    goto out;
  nk = (size_t)PQntuples(r);
  if (!(keys = bs__calloc(a, nk + 1, 8)) || !(prev = bs__calloc(a, nk + 1, 8))) {
    rc = opset_fail(BS_ENOMEM, err);
    goto out;
  }
  for (size_t i = 0; i < nk; i++) {
    keys[i] = (uint64_t)bs__pg_i64(r, (int)i, 0);
    prev[i] = (uint64_t)bs__pg_i64(r, (int)i, 1);
  }
  PQclear(r);
  r = NULL;
  for (size_t g = 0; g < nk && !rc; g += EDIT_GROUP) {
    size_t m = nk - g < EDIT_GROUP ? nk - g : EDIT_GROUP;
    rc = edit_group(c, a, bucket, e, n, &at, keys + g, prev + g, m, g + m == nk, &tail, &k, ch,
                    deleted, edited, err);
  }
out:
  PQclear(r);
  bs__free(a, b1);
  bs__free(a, b2);
  bs__free(a, b3);
  bs__free(a, lo);
  bs__free(a, hi);
  bs__free(a, kind);
  bs__free(a, keys);
  bs__free(a, prev);
  bs__free(a, ch);
  bs__pg_chunkb_free(&k, a);
  return rc;
}
