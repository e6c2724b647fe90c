/*
 * proto_pg.c (bsbench --pg URL|start --pg-proto): layout prototypes on PostgreSQL, not the
 * schema. The --pg ingest (--pg-rows inserts, then half as many random updates of those rows, a
 * commit per --commit-changes) written with raw libpq, the rows spread over 1, --buckets and
 * 10 x --buckets buckets (row i in bucket i % nb; --quick: 1 and --buckets), in two layouts of the ops; everything else as
 * bench_pg.c's raw baseline writes it (the rows' old records read, source records upserted, the
 * bucket states and the stream row updated: one transaction per commit; the "source" rows write
 * the library's source records instead, in one of three layouts, see SRC_*):
 *   a: today's layout, a row per op keyed (bucket, op_id), written by COPY (the baseline);
 *   b: chunks, a row per bucket per flush keyed (bucket, min_op) holding the flush's ops of
 *      that bucket packed in a bytea, with their count, checksum sum and max op id beside it,
 *      a chunk's packed ops at most cap bytes (a flush's ops beyond it start further rows), new
 *      rows written by COPY. On the bucket's tail chunk (its last) the writer either leaves it
 *      and writes new rows ("new rows"), or extends it while it is under the cap ("tail
 *      extended": UPDATE ... SET ops = ops || the new ops, one statement for every tail of the
 *      flush). Keyed by the first op, an extension changes no indexed column, so PostgreSQL may
 *      update it in place (HOT); the writer knows each tail from its own state (a new writer
 *      would read the bucket's last chunk and its octet_length, which the TOAST header holds).
 *   c: schema 8's candidate: b's new rows, each chunk in the op chunk encoding LMDB format 5
 *      stores (opchunk.c: its 21-byte header, then per op varint id delta | varint size | op
 *      value with its 18-byte header), at most cap bytes with the header and BS_CHUNK_MAX_OPS
 *      ops, keyed (bucket, last_op) as LMDB's records are, its first op, count and checksum
 *      sum (integer, stored signed as schema 5's op checksums) beside it for the statements;
 *      its "compact" variants in LMDB format 6's compact op values (BS_CHUNK_COMPACT), and
 *      "tail < N" ones rewriting a bucket's last chunk of fewer than N bytes with the flush's
 *      first ops (one UPDATE per flush; the writer keeps the tail's bytes) instead of a new row.
 * Then every bucket read whole from 0 to the checkpoint in calls of --read-limit ops (b, c:
 * whole chunks, until their counts reach the limit), twice, and each bucket's checksum at the
 * checkpoint (a: the ops' SUM; b, c: the chunks' sums, whole since the checkpoint is the head).
 * BSBENCH_PG_LAYOUTS=i,j,... runs only those layouts of the list below (0-based; a, the
 * ratios' base, always).
 * Both layouts' hand-outs are cross-checked against each other and against the writer's bucket
 * states (ops, bytes, checksum sums); bsbench exits 1 on a difference. Each (layout, buckets)
 * runs in a schema of its own (bsbench_<pid>_proto), dropped after it unless --keep.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifndef BS_HAVE_PG

int proto_pg(void) {
  fprintf(stderr, "bsbench: built without the PostgreSQL backend (make PG=1 with libpq-dev)\n");
  return 1;
}

#else

#include <libpq-fe.h>

#include "lmdb_internal.h" /* format 3's source-record codec */
#include "pg_internal.h"   /* schema 7's */
#include "pgq.h"

/* The source records: the raw baseline's (a row per replica id: bucket, op, data, upserted),
 * or the library's, written as pg_save.c writes them (the rows' records probed by key, one LATERAL
 * lookup each, stored ones updated by the ctid read, new ones COPYed; no stored data, as the
 * library keeps none for these saves) in one of three layouts:
 *   7:   schema 7's bs_source, (stream, table_id, replica_id) | mark | members, the members in
 *        pg_codec.c's encoding (a count, then bucket, op, object type, object id code);
 *   7h:  the same row, the members in LMDB format 3's rules (lmdb_codec.c: the counts in a head
 *        byte, an object type that is the table's name not written);
 *   7hk: those members, keyed (table key, replica_id): one database-wide integer for the
 *        stream's table instead of stream and table id;
 *   9:   schema 9's bs_source: 7hk's key, the members in pg_codec.c's schema-9 encoding (the
 *        counts in a head byte, a first object type that is the table's name not written). */
enum { SRC_RAW, SRC_7, SRC_7H, SRC_7HK, SRC_9 };

typedef struct pglayout {
  const char *name;
  size_t cap;   /* 0: a row per op */
  int extend;   /* b: extend the tail chunk while under the cap */
  int compress; /* b: TOAST may compress the chunks (pglz); else STORAGE EXTERNAL; 2 (c): a
                 * chunk stays in its heap row (toast_tuple_target = 8160, as schema 8) */
  int src;      /* SRC_* */
  int codec;    /* c: opchunk.c's chunks keyed (bucket, last_op); else b's packing; 2: in the
                 * compact op encoding (BS_CHUNK_COMPACT, LMDB format 6's) */
  size_t tailx; /* c: a tail chunk of fewer bytes than this is rewritten with the flush's first
                 * ops (one UPDATE of every such tail) instead of a new row; 0: never */
} pglayout;

static const pglayout g_pl[] = {
    {"a: row per op", 0, 0, 0, SRC_RAW, 0, 0},
    {"b: 8 KiB, new rows", 8192, 0, 0, SRC_RAW, 0, 0},
    {"b: 8 KiB, tail extended", 8192, 1, 0, SRC_RAW, 0, 0},
    {"b: 64 KiB, new rows", 65536, 0, 0, SRC_RAW, 0, 0},
    {"b: 64 KiB, tail extended", 65536, 1, 0, SRC_RAW, 0, 0},
    {"b: 64 KiB, new rows, pglz", 65536, 0, 1, SRC_RAW, 0, 0},
    {"a, source 7", 0, 0, 0, SRC_7, 0, 0},
    {"a, source 7h", 0, 0, 0, SRC_7H, 0, 0},
    {"a, source 7hk", 0, 0, 0, SRC_7HK, 0, 0},
    {"b: 8 KiB, new, source 7", 8192, 0, 0, SRC_7, 0, 0},
    {"b: 8 KiB, new, source 7h", 8192, 0, 0, SRC_7H, 0, 0},
    {"b: 8 KiB, new, source 7hk", 8192, 0, 0, SRC_7HK, 0, 0},
    {"c: 8 KiB opchunk", 8192, 0, 0, SRC_RAW, 1, 0},
    {"c: 8 KiB opchunk, source 7", 8192, 0, 0, SRC_7, 1, 0},
    {"c: 4 KiB opchunk", 4096, 0, 0, SRC_RAW, 1, 0},
    {"c: 4 KiB compact", 4096, 0, 0, SRC_RAW, 2, 0},
    {"c: 8 KiB compact", 8192, 0, 0, SRC_RAW, 2, 0},
    {"c: 4 KiB compact, source 7", 4096, 0, 0, SRC_7, 2, 0},
    {"c: 4 KiB compact, tail < 2 KiB", 4096, 0, 0, SRC_RAW, 2, 2048},
    {"c: 4 KiB compact, tail < 1 KiB, s7", 4096, 0, 0, SRC_7, 2, 1024},
    {"c: 4 KiB compact, tail < 2 KiB, s7", 4096, 0, 0, SRC_7, 2, 2048},
    {"c: 4000 B compact, in row", 4000, 0, 2, SRC_RAW, 2, 0},
    {"c: 4000 B compact, in row, s7", 4000, 0, 2, SRC_7, 2, 0},
    {"c: 8000 B compact, in row, s7", 8000, 0, 2, SRC_7, 2, 0},
    {"c: 4000 B compact, in row, s7hk", 4000, 0, 2, SRC_7HK, 2, 0},
    {"c: 4000 B compact, in row, s9", 4000, 0, 2, SRC_9, 2, 0},
};
#define NPL (sizeof g_pl / sizeof *g_pl)

typedef struct pgstat { /* what one (layout, buckets) run measured */
  double ingest_s, cpu_s, bytes, op_bytes, src_bytes, rows, raw_bytes, stored_bytes, read_s, ck_s;
  double lat[2]; /* p50, p99 of a commit, s */
  uint64_t read_ops, read_bytes, ck_n, ck_calls;
  uint32_t read_sum, ck_sum;
  int failed;
} pgstat;

typedef struct pbk { /* the writer's running state of a bucket */
  uint32_t ck;
  uint64_t n, last, tail_min;
  size_t tail_bytes;
  unsigned char *tail; /* c with tailx: the bucket's last chunk as written (tail_bytes bytes) */
} pbk;

typedef struct pop { /* one op of a flush */
  uint64_t row, version, op;
  unsigned b;
} pop;

typedef struct pgw { /* a run's writer */
  PGconn *c;
  const pglayout *L;
  unsigned nb;
  uint64_t head;
  pbk *bk;
  pop *ops, *sorted;
  size_t *start;      /* nb + 1 bucket offsets into sorted */
  struct srow *srows; /* the flush's rows (the library's source records) */
} pgw;

static uint64_t p_steps(void) {
  return g_cfg->pg_rows + g_cfg->pg_rows / 2;
}

/* bench_pg.c's workload: step k < rows inserts row k, then a random earlier row is updated */
static uint64_t p_step_row(uint64_t k, uint64_t *version) {
  uint64_t s;
  if (k < g_cfg->pg_rows) {
    *version = 0;
    return k;
  }
  s = g_cfg->seed ^ (k * 0x2545f4914f6cdd1dull);
  *version = k;
  return rng_next(&s) % g_cfg->pg_rows;
}

static void put_u32le(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32le(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void pb_var(pbuf *b, uint64_t v) {
  for (; v >= 0x80; v >>= 7) *pb_room(b, 1) = (char)(v | 0x80);
  *pb_room(b, 1) = (char)v;
}
static size_t var_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}
static unsigned char *p_varint(unsigned char *p, uint64_t v) {
  for (; v >= 0x80; v >>= 7) *p++ = (unsigned char)(v | 0x80);
  *p++ = (unsigned char)v;
  return p;
}
/* 0 when the varint runs past end. */
static size_t get_var(const unsigned char *p, const unsigned char *end, uint64_t *v) {
  size_t n = 0;
  *v = 0;
  for (unsigned sh = 0; p + n < end && sh < 64; sh += 7) {
    unsigned char c = p[n++];
    *v |= (uint64_t)(c & 0x7f) << sh;
    if (!(c & 0x80)) return n;
  }
  return 0;
}

/* An op's fields, as both layouts store them (a: columns; b: packed). */
typedef struct opf {
  char rid[RID_LEN + 1], sub[BS_SUBKEY_SIZE], data[65536];
  uint32_t ck;
} opf;

static void op_fields(opf *f, const pop *o) {
  bs_val ot = {OBJ_TYPE, OBJ_TYPE_LEN}, oi = {f->rid, RID_LEN}, dv = {f->data, g_cfg->data_size};
  gen_rid(f->rid, o->row);
  gen_data(f->data, o->row, o->version, g_cfg->data_size);
  f->ck = bs_checksum_put(BS_HASH_XXH3, ot, oi, dv);
  bs_subkey(f->sub, 1, oi);
}

/* A packed op: varint(op id - the previous op's in the chunk, the first's - (min_op - 1)) | u8
 * type | u32 checksum | varint length + bytes of object type, object id, subkey, data. */
static size_t packed_size(uint64_t delta) {
  size_t d = g_cfg->data_size;
  return var_len(delta) + 5 + var_len(OBJ_TYPE_LEN) + OBJ_TYPE_LEN + var_len(RID_LEN) + RID_LEN +
         var_len(BS_SUBKEY_SIZE) + BS_SUBKEY_SIZE + var_len(d) + d;
}
static void pack_op(pbuf *b, uint64_t delta, const opf *f) {
  unsigned char *p;
  pb_var(b, delta);
  p = (unsigned char *)pb_room(b, 5);
  p[0] = BS_OP_PUT;
  put_u32le(p + 1, f->ck);
  pb_var(b, OBJ_TYPE_LEN), memcpy(pb_room(b, OBJ_TYPE_LEN), OBJ_TYPE, OBJ_TYPE_LEN);
  pb_var(b, RID_LEN), memcpy(pb_room(b, RID_LEN), f->rid, RID_LEN);
  pb_var(b, BS_SUBKEY_SIZE), memcpy(pb_room(b, BS_SUBKEY_SIZE), f->sub, BS_SUBKEY_SIZE);
  pb_var(b, g_cfg->data_size), memcpy(pb_room(b, g_cfg->data_size), f->data, g_cfg->data_size);
}

static int p_exec(bres *r, PGconn *c, const char *sql, int n, const char *const *v, const int *len,
                  PGresult **out) {
  int fmt[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  PGresult *res = PQexecParams(c, sql, n, NULL, v, len, fmt, 1);
  ExecStatusType s = PQresultStatus(res);
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) return pq_fail(r, c, res, sql);
  if (out)
    *out = res;
  else
    PQclear(res);
  return 0;
}

static void be64s(char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (char)(v >> (56 - 8 * i));
}

static int p_copy(bres *r, PGconn *c, const char *sql, pbuf *rows) {
  PGresult *res = PQexec(c, sql);
  if (PQresultStatus(res) != PGRES_COPY_IN) return pq_fail(r, c, res, sql);
  PQclear(res);
  memcpy(pb_room(rows, 2), "\xff\xff", 2);
  if (PQputCopyData(c, rows->p, (int)rows->n) != 1 || PQputCopyEnd(c, NULL) != 1)
    return pq_fail(r, c, NULL, sql);
  res = PQgetResult(c);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) return pq_fail(r, c, res, sql);
  PQclear(res);
  while ((res = PQgetResult(c))) PQclear(res);
  return 0;
}

static void copy_start(pbuf *b) {
  static const unsigned char hdr[19] = {'P', 'G', 'C', 'O', 'P', 'Y', '\n', 0xff, '\r', '\n', 0};
  b->n = 0;
  memcpy(pb_room(b, 19), hdr, 19);
}
static void copy_fields(pbuf *b, unsigned n) {
  char *p = pb_room(b, 2);
  p[0] = (char)(n >> 8), p[1] = (char)n;
}

/* Layout a: the flush's ops as rows (COPY). */
static int a_ops(pgw *w, size_t n, bres *r) {
  pbuf rows = {0};
  opf *f = malloc(sizeof *f);
  int rc;
  if (!f) die("out of memory");
  copy_start(&rows);
  for (size_t i = 0; i < n; i++) {
    const pop *o = &w->sorted[i];
    op_fields(f, o);
    w->bk[o->b].ck += f->ck;
    copy_fields(&rows, 8);
    pb_int(&rows, o->b + 1, 8);
    pb_int(&rows, o->op, 8);
    pb_int(&rows, BS_OP_PUT, 2);
    pb_int(&rows, f->ck, 8);
    pb_bytes(&rows, OBJ_TYPE, OBJ_TYPE_LEN);
    pb_bytes(&rows, f->rid, RID_LEN);
    pb_bytes(&rows, f->sub, BS_SUBKEY_SIZE);
    pb_bytes(&rows, f->data, g_cfg->data_size);
  }
  rc = p_copy(r, w->c, "COPY pops FROM STDIN (FORMAT binary)", &rows);
  free(rows.p);
  free(f);
  return rc;
}

/* A chunk row for COPY: bucket, min_op, max_op, n, checksum, ops. */
static void chunk_row(pbuf *rows, unsigned b, uint64_t min_op, uint64_t max_op, uint32_t n,
                      uint32_t ck, const pbuf *ops) {
  copy_fields(rows, 6);
  pb_int(rows, b + 1, 8);
  pb_int(rows, min_op, 8);
  pb_int(rows, max_op, 8);
  pb_int(rows, n, 4);
  pb_int(rows, ck, 8);
  pb_bytes(rows, ops->p, ops->n);
}

/* Layout b: per bucket, its ops of the flush packed into its tail (when extending and under
 * the cap) and then into new chunks of at most cap packed bytes. */
static int b_ops(pgw *w, bres *r) {
  pbuf rows = {0}, ops = {0}, tb = {0}, tm = {0}, to = {0}, tx = {0}, tn = {0}, tc = {0};
  opf *f = malloc(sizeof *f);
  uint32_t ntails = 0;
  int rc = 0;
  if (!f) die("out of memory");
  copy_start(&rows);
  for (int pass = 0; pass < 2; pass++) { /* count the tails, then write their arrays */
    if (pass) {
      pb_array(&tb, 20, ntails), pb_array(&tm, 20, ntails), pb_array(&to, 17, ntails);
      pb_array(&tx, 20, ntails), pb_array(&tn, 23, ntails), pb_array(&tc, 20, ntails);
    }
    for (unsigned b = 0; b < w->nb; b++) {
      pbk *k = &w->bk[b];
      size_t i = w->start[b], e = w->start[b + 1];
      int tail;
      if (i == e) continue;
      tail = w->L->extend && k->n &&
             k->tail_bytes + packed_size(w->sorted[i].op - k->last) <= w->L->cap;
      if (!pass) {
        ntails += (uint32_t)tail;
        continue;
      }
      while (i < e) { /* one chunk (or the tail's extension) */
        uint64_t prev = tail ? k->last : w->sorted[i].op - 1, min_op = w->sorted[i].op;
        size_t have = tail ? k->tail_bytes : 0;
        uint32_t n = 0, ck = 0;
        ops.n = 0;
        while (i < e && (!n || have + packed_size(w->sorted[i].op - prev) <= w->L->cap)) {
          op_fields(f, &w->sorted[i]);
          have += packed_size(w->sorted[i].op - prev);
          pack_op(&ops, w->sorted[i].op - prev, f);
          prev = w->sorted[i].op;
          ck += f->ck;
          n++;
          i++;
        }
        k->ck += ck;
        if (tail) { /* its first op fits, so n >= 1 */
          pb_be32(&tb, 8), pb_be64(&tb, b + 1);
          pb_be32(&tm, 8), pb_be64(&tm, k->tail_min);
          pb_bytes(&to, ops.p, ops.n);
          pb_be32(&tx, 8), pb_be64(&tx, prev);
          pb_be32(&tn, 4), pb_be32(&tn, n);
          pb_be32(&tc, 8), pb_be64(&tc, ck);
          k->tail_bytes = have;
          tail = 0;
        } else {
          chunk_row(&rows, b, min_op, prev, n, ck, &ops);
          k->tail_min = min_op;
          k->tail_bytes = have;
        }
        k->last = prev;
      }
    }
  }
  if (ntails) {
    const char *v[6] = {tb.p, tm.p, to.p, tx.p, tn.p, tc.p};
    int len[6] = {(int)tb.n, (int)tm.n, (int)to.n, (int)tx.n, (int)tn.n, (int)tc.n};
    PGresult *res;
    rc = p_exec(r, w->c,
                "UPDATE pchunks c SET ops = c.ops || u.o, max_op = u.x, n = c.n + u.n,"
                " checksum = (c.checksum + u.c) % 4294967296 FROM unnest($1::int8[], $2::int8[],"
                " $3::bytea[], $4::int8[], $5::int4[], $6::int8[]) AS u(b, m, o, x, n, c)"
                " WHERE c.bucket = u.b AND c.min_op = u.m",
                6, v, len, &res);
    if (!rc) {
      if (strtoul(PQcmdTuples(res), NULL, 10) != ntails) {
        snprintf(r->note, sizeof r->note, "tail update: %s rows of %u", PQcmdTuples(res), ntails);
        r->status = BR_FAILED;
        rc = -1;
      }
      PQclear(res);
    }
  }
  if (!rc && rows.n > 19) rc = p_copy(r, w->c, "COPY pchunks FROM STDIN (FORMAT binary)", &rows);
  free(rows.p), free(ops.p), free(tb.p), free(tm.p), free(to.p), free(tx.p), free(tn.p);
  free(tc.p), free(f);
  return rc;
}

/* Layout c: per bucket, its ops of the flush in new chunks of opchunk.c's encoding (at most cap
 * bytes with the header, and BS_CHUNK_MAX_OPS ops; a larger op alone), as schema 8 would write
 * them: a COPY row (bucket, last_op, first_op, n, checksum, ops) each. With tailx, a bucket whose
 * last chunk holds fewer bytes than tailx has it rewritten with the flush's first ops (the writer
 * keeps its bytes: no read), one UPDATE for every such tail of the flush, keyed by the old last
 * op. */
static int c_ops(pgw *w, bres *r) {
  pbuf rows = {0}, tb = {0}, to = {0}, tx = {0}, tf = {0}, tn = {0}, tc = {0}, tv = {0};
  opf *f = malloc(sizeof *f);
  unsigned char *chunk = NULL;
  size_t cap = 0;
  unsigned fl = w->L->codec == 2 ? BS_CHUNK_COMPACT : 0;
  uint32_t ntails = 0;
  int rc = 0;
  if (!f) die("out of memory");
  copy_start(&rows);
  for (int pass = 0; pass < 2; pass++) { /* count the tails, then write */
    if (pass && ntails) {
      pb_array(&tb, 20, ntails), pb_array(&to, 20, ntails), pb_array(&tx, 20, ntails);
      pb_array(&tf, 20, ntails), pb_array(&tn, 23, ntails), pb_array(&tc, 23, ntails);
      pb_array(&tv, 17, ntails);
    }
    for (unsigned b = 0; b < w->nb; b++) {
      pbk *k = &w->bk[b];
      size_t i = w->start[b], e = w->start[b + 1];
      int tail = w->L->tailx && k->tail && i < e && k->tail_bytes < w->L->tailx &&
                 bs__chunk_n(k->tail) < BS_CHUNK_MAX_OPS;
      if (!pass) {
        ntails += (uint32_t)tail;
        continue;
      }
      while (i < e) { /* one chunk (or the tail's rewrite) */
        size_t size = BS_CHUNK_HDR;
        uint64_t first = w->sorted[i].op, prev = first, old_last = k->last;
        uint32_t n = 0;
        if (tail) {
          if (k->tail_bytes > cap && !(chunk = realloc(chunk, cap = 2 * k->tail_bytes)))
            die("out of memory");
          memcpy(chunk, k->tail, k->tail_bytes);
          size = k->tail_bytes, n = bs__chunk_n(k->tail), first = bs__chunk_first(k->tail);
          prev = k->last;
        }
        for (; i < e && n < BS_CHUNK_MAX_OPS; i++, n++) {
          bs_op op;
          size_t vs;
          op_fields(f, &w->sorted[i]);
          memset(&op, 0, sizeof op);
          op.op_id = w->sorted[i].op;
          op.type = BS_OP_PUT;
          op.checksum = f->ck;
          op.object_type = (bs_val){OBJ_TYPE, OBJ_TYPE_LEN};
          op.object_id = (bs_val){f->rid, RID_LEN};
          op.subkey = (bs_val){f->sub, BS_SUBKEY_SIZE};
          op.data = (bs_val){f->data, g_cfg->data_size};
          vs = bs__op_value_size_as(&op, fl);
          if (n && size + BS_CHUNK_ADD_MAX(vs) > w->L->cap) break;
          if (size + BS_CHUNK_ADD_MAX(vs) > cap) {
            cap = 2 * (size + BS_CHUNK_ADD_MAX(vs));
            if (!(chunk = realloc(chunk, cap))) die("out of memory");
          }
          size += bs__chunk_add_as(chunk + size, n ? op.op_id - prev : 0, &op, NULL, vs, fl);
          prev = op.op_id;
          k->ck += f->ck;
        }
        if (bs__chunk_seal_as(chunk, size, first, fl)) die("proto_pg: a chunk does not seal");
        if (tail) {
          pb_be32(&tb, 8), pb_be64(&tb, b + 1);
          pb_be32(&to, 8), pb_be64(&to, old_last);
          pb_be32(&tx, 8), pb_be64(&tx, prev);
          pb_be32(&tf, 8), pb_be64(&tf, first);
          pb_be32(&tn, 4), pb_be32(&tn, n);
          pb_be32(&tc, 4), pb_be32(&tc, bs__chunk_sum(chunk));
          pb_be32(&tv, (uint32_t)size), memcpy(pb_room(&tv, size), chunk, size);
          tail = 0;
        } else {
          copy_fields(&rows, 6);
          pb_int(&rows, b + 1, 8);
          pb_int(&rows, prev, 8);
          pb_int(&rows, first, 8);
          pb_int(&rows, n, 4);
          pb_int(&rows, bs__chunk_sum(chunk), 4);
          pb_bytes(&rows, chunk, size);
        }
        k->last = prev;
        if (w->L->tailx) { /* the bucket's last chunk, kept while a rewrite may take it */
          free(k->tail);
          k->tail = NULL;
          if (size < w->L->tailx) {
            if (!(k->tail = malloc(size))) die("out of memory");
            memcpy(k->tail, chunk, size);
          }
          k->tail_bytes = size;
        }
      }
    }
  }
  if (ntails) {
    const char *v[7] = {tb.p, to.p, tx.p, tf.p, tn.p, tc.p, tv.p};
    int len[7] = {(int)tb.n, (int)to.n, (int)tx.n, (int)tf.n, (int)tn.n, (int)tc.n, (int)tv.n};
    PGresult *res;
    rc = p_exec(r, w->c,
                "UPDATE pchunks c SET last_op = u.x, first_op = u.f, n = u.n, checksum = u.c,"
                " ops = u.v FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[],"
                " $5::int4[], $6::int4[], $7::bytea[]) AS u(b, o, x, f, n, c, v)"
                " WHERE c.bucket = u.b AND c.last_op = u.o",
                7, v, len, &res);
    if (!rc) {
      if (strtoul(PQcmdTuples(res), NULL, 10) != ntails) {
        snprintf(r->note, sizeof r->note, "tail update: %s rows of %u", PQcmdTuples(res), ntails);
        r->status = BR_FAILED;
        rc = -1;
      }
      PQclear(res);
    }
  }
  if (!rc && rows.n > 19) rc = p_copy(r, w->c, "COPY pchunks FROM STDIN (FORMAT binary)", &rows);
  free(rows.p), free(chunk), free(f), free(tb.p), free(to.p), free(tx.p), free(tf.p);
  free(tn.p), free(tc.p), free(tv.p);
  return rc;
}

/* A flush's ops in the run's layout. */
static int flush_ops(pgw *w, size_t n, bres *r) {
  return w->L->codec ? c_ops(w, r) : w->L->cap ? b_ops(w, r) : a_ops(w, n, r);
}

/* ---- The library's source records (SRC_7, SRC_7H, SRC_7HK, SRC_9) ---- */

typedef struct srow { /* a row of the flush, its last op */
  uint64_t row, op;
  unsigned b;
  char rid[RID_LEN + 1];
  unsigned char tid[6];
  int stored;
} srow;

static int cmp_srow(const void *x, const void *y) {
  const srow *a = x, *b = y;
  if (a->row != b->row) return a->row < b->row ? -1 : 1;
  return a->op < b->op ? -1 : a->op > b->op;
}

/* The members of a row's record: one membership, of its bucket's last op, object type the
 * table's name, object id the replica id; no lookups. */
static size_t src_members(const pglayout *L, const srow *s, unsigned char *out) {
  bs__member m = {0};
  bs__srec rec = {0};
  bs_val rid = {s->rid, RID_LEN}, table = {OBJ_TYPE, OBJ_TYPE_LEN};
  m.bucket = s->b + 1;
  m.op = s->op;
  m.object_type = table;
  m.object_id = rid;
  rec.exists = 1;
  rec.m = &m;
  rec.nm = 1;
  if (L->src == SRC_7) { /* schema 7-8's members (pg_codec.c bs__pg_srec8_decode's) */
    unsigned char *p = out;
    *p++ = 1; /* one membership */
    p = p_varint(p, m.bucket);
    p = p_varint(p, m.op);
    *p++ = (unsigned char)table.size;
    memcpy(p, table.data, table.size);
    p += table.size;
    *p++ = 0; /* the object id is the replica id */
    *p++ = 0; /* no lookups */
    return (size_t)(p - out);
  }
  if (L->src == SRC_9) {
    bs__pg_srec_encode(out, &rec, table, rid);
    return bs__pg_srec_size(&rec, table, rid);
  }
  bs__lmdb_srec_encode(out, &rec, table, rid);
  return bs__lmdb_srec_size(&rec, table, rid);
}

/* A stored record's members, decoded as its layout's reader would (0: they do not). */
static int src_decodes(const pglayout *L, const char *v, int len, const char *rid) {
  bs_val r = {rid, RID_LEN}, table = {OBJ_TYPE, OBJ_TYPE_LEN};
  bs__srec rec;
  if (L->src == SRC_7) {
    const bs_allocator *a = &bs__default_allocator;
    int ok = bs__pg_srec8_decode(a, (bs_val){v, (size_t)len}, r, &rec) == BS_OK && rec.nm == 1;
    bs__free(a, rec.m), bs__free(a, rec.lk);
    return ok;
  }
  if (L->src == SRC_9) {
    const bs_allocator *a = &bs__default_allocator;
    int ok = bs__pg_srec_decode(a, (bs_val){v, (size_t)len}, table, r, &rec) == BS_OK &&
             rec.nm == 1 && bs__val_eq(rec.m[0].object_type, table) &&
             bs__val_eq(rec.m[0].object_id, r);
    bs__free(a, rec.m), bs__free(a, rec.lk);
    return ok;
  }
  {
    MDB_val mv = {(size_t)len, (void *)v};
    bs__member m[2];
    bs_val lk[1];
    if (bs__lmdb_srec_head(&mv, &rec) != BS_OK || rec.nm != 1 || rec.nl != 0) return 0;
    return bs__lmdb_srec_decode(&mv, table, r, &rec, m, lk) == BS_OK &&
           bs__val_eq(m[0].object_id, r) && bs__val_eq(m[0].object_type, table);
  }
}

/* The flush's rows, each once with its last op, sorted by row (so by replica id), their stored
 * records probed as pg_save.c's load_records does: one statement. */
static int src_load(pgw *w, size_t n, srow *rows, size_t *nrows, bres *r) {
  static const char *sql[2] = {
      "SELECT s.* FROM unnest($1::bytea[]) AS k(r) CROSS JOIN LATERAL (SELECT replica_id,"
      " members, ctid FROM psrc WHERE stream = 1 AND table_id = 1 AND replica_id = k.r LIMIT 1) s",
      "SELECT s.* FROM unnest($1::bytea[]) AS k(r) CROSS JOIN LATERAL (SELECT replica_id,"
      " members, ctid FROM psrc WHERE tkey = 1 AND replica_id = k.r LIMIT 1) s"};
  pbuf rids = {0};
  PGresult *res;
  size_t k = 0;
  int rc;
  for (size_t i = 0; i < n; i++) {
    rows[i].row = w->ops[i].row;
    rows[i].op = w->ops[i].op;
    rows[i].b = w->ops[i].b;
    rows[i].stored = 0;
  }
  qsort(rows, n, sizeof *rows, cmp_srow);
  for (size_t i = 0; i < n; i++) /* the last op of each row */
    if (i + 1 == n || rows[i + 1].row != rows[i].row) rows[k++] = rows[i];
  *nrows = k;
  pb_array(&rids, 17, (uint32_t)k);
  for (size_t i = 0; i < k; i++)
    gen_rid(rows[i].rid, rows[i].row), pb_bytes(&rids, rows[i].rid, RID_LEN);
  {
    const char *v[1] = {rids.p};
    int len[1] = {(int)rids.n};
    rc = p_exec(r, w->c, sql[(w->L->src == SRC_7HK || w->L->src == SRC_9)], 1, v, len, &res);
  }
  free(rids.p);
  if (rc) return rc;
  for (int i = 0; i < PQntuples(res) && !rc; i++) {
    srow key, *f;
    if (PQgetlength(res, i, 0) != RID_LEN || PQgetlength(res, i, 2) != 6) break;
    memcpy(key.rid, PQgetvalue(res, i, 0), RID_LEN);
    key.rid[RID_LEN] = 0;
    key.row = strtoull(key.rid + 1, NULL, 10);
    key.op = 0;
    f = NULL;
    for (size_t lo = 0, hi = k; lo < hi && !f;) { /* rows are sorted by row */
      size_t mid = (lo + hi) / 2;
      if (rows[mid].row == key.row)
        f = &rows[mid];
      else if (rows[mid].row < key.row)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (!f || !src_decodes(w->L, PQgetvalue(res, i, 1), PQgetlength(res, i, 1), key.rid)) {
      snprintf(r->note, sizeof r->note, "source record %s: not asked for, or does not decode",
               key.rid);
      r->status = BR_FAILED;
      rc = -1;
      break;
    }
    memcpy(f->tid, PQgetvalue(res, i, 2), 6);
    f->stored = 1;
  }
  PQclear(res);
  return rc;
}

/* The records written back: stored ones updated by their ctid (one statement), new ones COPYed. */
static int src_write(pgw *w, const srow *rows, size_t k, bres *r) {
  pbuf tids = {0}, mem = {0}, copy = {0};
  unsigned char enc[64];
  uint32_t nst = 0;
  int rc = 0;
  for (size_t i = 0; i < k; i++) nst += (uint32_t)rows[i].stored;
  pb_array(&tids, 27 /* tid */, nst), pb_array(&mem, 17, nst);
  copy_start(&copy);
  for (size_t i = 0; i < k; i++) {
    size_t m = src_members(w->L, &rows[i], enc);
    if (rows[i].stored) {
      pb_bytes(&tids, rows[i].tid, 6);
      pb_bytes(&mem, enc, m);
      continue;
    }
    if (w->L->src == SRC_7HK || w->L->src == SRC_9) {
      copy_fields(&copy, 5);
      pb_int(&copy, 1, 4);
    } else {
      copy_fields(&copy, 6);
      pb_int(&copy, 1, 4);
      pb_int(&copy, 1, 4);
    }
    pb_bytes(&copy, rows[i].rid, RID_LEN);
    memcpy(pb_room(&copy, 4), "\xff\xff\xff\xff", 4); /* mark NULL */
    pb_bytes(&copy, enc, m);
    memcpy(pb_room(&copy, 4), "\xff\xff\xff\xff", 4); /* data NULL */
  }
  if (nst) {
    const char *v[2] = {tids.p, mem.p};
    int len[2] = {(int)tids.n, (int)mem.n};
    PGresult *res;
    rc = p_exec(r, w->c,
                "UPDATE psrc s SET mark = NULL, members = u.mb, data = NULL FROM"
                " unnest($1::tid[], $2::bytea[]) AS u(c, mb) WHERE s.ctid = u.c",
                2, v, len, &res);
    if (!rc) {
      if (strtoul(PQcmdTuples(res), NULL, 10) != nst) {
        snprintf(r->note, sizeof r->note, "source update: %s rows of %u", PQcmdTuples(res), nst);
        r->status = BR_FAILED;
        rc = -1;
      }
      PQclear(res);
    }
  }
  if (!rc && nst < k)
    rc = p_copy(r, w->c,
                (w->L->src == SRC_7HK || w->L->src == SRC_9)
                    ? "COPY psrc (tkey, replica_id, mark, members, data) FROM STDIN (FORMAT binary)"
                    : "COPY psrc (stream, table_id, replica_id, mark, members, data) FROM STDIN"
                      " (FORMAT binary)",
                &copy);
  free(tids.p), free(mem.p), free(copy.p);
  return rc;
}

/* One commit: steps [from, to) of the workload. */
static int p_commit(pgw *w, uint64_t from, uint64_t to, bres *r) {
  pbuf rids = {0}, ub = {0}, uo = {0}, ud = {0}, kb = {0}, kc = {0}, kn = {0}, kl = {0};
  size_t n = (size_t)(to - from), nsrows = 0;
  uint32_t touched = 0;
  char rid[RID_LEN + 1], data[65536], lsn[17], last[8];
  PGresult *res;
  int rc = -1;
  /* the flush's ops, in op order, then grouped by bucket (a counting sort) as a flush writes */
  memset(w->start, 0, (w->nb + 1) * sizeof *w->start);
  for (size_t i = 0; i < n; i++) {
    pop *o = &w->ops[i];
    o->row = p_step_row(from + i, &o->version);
    o->b = (unsigned)(o->row % w->nb);
    o->op = ++w->head;
    w->start[o->b + 1]++;
  }
  for (unsigned b = 0; b < w->nb; b++) w->start[b + 1] += w->start[b];
  for (size_t i = 0; i < n; i++) w->sorted[w->start[w->ops[i].b]++] = w->ops[i];
  for (unsigned b = w->nb; b > 0; b--) w->start[b] = w->start[b - 1];
  w->start[0] = 0;
  if (pq_run(r, w->c, "BEGIN")) return -1;
  if (w->L->src != SRC_RAW) {
    if (!src_load(w, n, w->srows, &nsrows, r) && !flush_ops(w, n, r) &&
        !src_write(w, w->srows, nsrows, r))
      rc = 0;
    goto states;
  }
  pb_array(&rids, 17, (uint32_t)n);
  for (size_t i = 0; i < n; i++) gen_rid(rid, w->ops[i].row), pb_bytes(&rids, rid, RID_LEN);
  { /* the rows' previous records: what the new ops supersede */
    const char *v[1] = {rids.p};
    int len[1] = {(int)rids.n};
    if (p_exec(r, w->c, "SELECT bucket, op_id FROM psource WHERE rid = ANY($1::bytea[])", 1, v, len,
               &res))
      goto out;
    PQclear(res);
  }
  if (flush_ops(w, n, r)) goto out;
  pb_array(&ub, 20, (uint32_t)n), pb_array(&uo, 20, (uint32_t)n), pb_array(&ud, 17, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    const pop *o = &w->ops[i];
    gen_data(data, o->row, o->version, g_cfg->data_size);
    pb_be32(&ub, 8), pb_be64(&ub, o->b + 1);
    pb_be32(&uo, 8), pb_be64(&uo, o->op);
    pb_bytes(&ud, data, g_cfg->data_size);
  }
  {
    const char *v[4] = {rids.p, ub.p, uo.p, ud.p};
    int len[4] = {(int)rids.n, (int)ub.n, (int)uo.n, (int)ud.n};
    if (p_exec(r, w->c,
               "INSERT INTO psource SELECT DISTINCT ON (r) r, b, o, d FROM unnest($1::bytea[],"
               " $2::int8[], $3::int8[], $4::bytea[]) AS u(r, b, o, d) ORDER BY r, o DESC"
               " ON CONFLICT (rid) DO UPDATE SET bucket = excluded.bucket,"
               " op_id = excluded.op_id, data = excluded.data",
               4, v, len, NULL))
      goto out;
  }
  rc = 0;
states:
  if (rc) goto out;
  rc = -1;
  for (unsigned b = 0; b < w->nb; b++) touched += w->start[b + 1] > w->start[b];
  pb_array(&kb, 20, touched), pb_array(&kc, 20, touched), pb_array(&kn, 20, touched);
  pb_array(&kl, 20, touched);
  for (unsigned b = 0; b < w->nb; b++) {
    pbk *k = &w->bk[b];
    if (w->start[b + 1] == w->start[b]) continue;
    k->n += w->start[b + 1] - w->start[b];
    k->last = w->sorted[w->start[b + 1] - 1].op;
    pb_be32(&kb, 8), pb_be64(&kb, b + 1);
    pb_be32(&kc, 8), pb_be64(&kc, k->ck);
    pb_be32(&kn, 8), pb_be64(&kn, k->n);
    pb_be32(&kl, 8), pb_be64(&kl, k->last);
  }
  {
    const char *v[4] = {kb.p, kc.p, kn.p, kl.p};
    int len[4] = {(int)kb.n, (int)kc.n, (int)kn.n, (int)kl.n};
    if (p_exec(r, w->c,
               "UPDATE pbuckets k SET checksum = u.c, count = u.n, last_op = u.l FROM"
               " unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[]) AS u(b, c, n, l)"
               " WHERE k.id = u.b",
               4, v, len, NULL))
      goto out;
  }
  {
    const char *v[2] = {last, lsn};
    int len[2] = {8, 16};
    be64s(last, w->head);
    gen_lsn(lsn, 16 + to);
    if (p_exec(r, w->c, "UPDATE pstream SET op_head = $1, checkpoint = $1, lsn = $2 WHERE id = 1",
               2, v, len, NULL))
      goto out;
  }
  rc = pq_run(r, w->c, "COMMIT");
out:
  if (rc) pq_run(r, w->c, "ROLLBACK");
  free(rids.p), free(ub.p), free(uo.p), free(ud.p), free(kb.p), free(kc.p), free(kn.p);
  free(kl.p);
  return rc;
}

#define P_SCHEMA                                                                                   \
  "CREATE TABLE pstream (id int PRIMARY KEY, op_head bigint NOT NULL, checkpoint bigint"           \
  " NOT NULL, lsn bytea);"                                                                         \
  "CREATE TABLE pbuckets (id bigint PRIMARY KEY, name bytea NOT NULL UNIQUE,"                      \
  " checksum bigint NOT NULL, count bigint NOT NULL, last_op bigint NOT NULL);"                    \
  "INSERT INTO pstream VALUES (1, 0, 0, NULL);"
/* The source table of each SRC_*: the raw baseline's, schema 7's bs_source (pg.c, columns in its
 * order), its key with a table key instead (the soft-delete index as the schema's, empty here). */
static const char *const g_src_schema[] = {
    "CREATE TABLE psource (rid bytea PRIMARY KEY, bucket bigint NOT NULL, op_id bigint NOT"
    " NULL, data bytea NOT NULL)",
    "CREATE TABLE psrc (stream integer NOT NULL, table_id integer NOT NULL, mark bigint,"
    " replica_id bytea NOT NULL, members bytea NOT NULL, data bytea,"
    " PRIMARY KEY (stream, table_id, replica_id));"
    "CREATE INDEX psrc_soft ON psrc (stream, mark) WHERE mark IS NOT NULL",
    "CREATE TABLE psrc (stream integer NOT NULL, table_id integer NOT NULL, mark bigint,"
    " replica_id bytea NOT NULL, members bytea NOT NULL, data bytea,"
    " PRIMARY KEY (stream, table_id, replica_id));"
    "CREATE INDEX psrc_soft ON psrc (stream, mark) WHERE mark IS NOT NULL",
    "CREATE TABLE psrc (tkey integer NOT NULL, mark bigint, replica_id bytea NOT NULL,"
    " members bytea NOT NULL, data bytea, PRIMARY KEY (tkey, replica_id));"
    "CREATE INDEX psrc_soft ON psrc (tkey, mark) WHERE mark IS NOT NULL",
    "CREATE TABLE psrc (mark bigint, tkey integer NOT NULL, replica_id bytea NOT NULL,"
    " members bytea NOT NULL, data bytea, PRIMARY KEY (tkey, replica_id));"
    "CREATE INDEX psrc_soft ON psrc (tkey, mark) WHERE mark IS NOT NULL"};
#define P_SCHEMA_A                                                                                 \
  "CREATE TABLE pops (bucket bigint NOT NULL, op_id bigint NOT NULL, type smallint NOT NULL,"      \
  " checksum bigint NOT NULL, object_type bytea, object_id bytea, subkey bytea, data bytea,"       \
  " PRIMARY KEY (bucket, op_id))"
#define P_SCHEMA_B                                                                                 \
  "CREATE TABLE pchunks (bucket bigint NOT NULL, min_op bigint NOT NULL, max_op bigint NOT NULL,"  \
  " n int NOT NULL, checksum bigint NOT NULL, ops bytea NOT NULL, PRIMARY KEY (bucket, min_op))"
#define P_SCHEMA_C                                                                                 \
  "CREATE TABLE pchunks (bucket bigint NOT NULL, last_op bigint NOT NULL, first_op bigint NOT"     \
  " NULL, n int NOT NULL, checksum int NOT NULL, ops bytea NOT NULL, PRIMARY KEY (bucket,"         \
  " last_op))"

static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int p_ingest(pgw *w, pgstat *ps, bres *r) {
  uint64_t steps = p_steps(), every = g_cfg->commit_changes;
  size_t ncommits = (size_t)((steps + every - 1) / every), nl = 0;
  double *lat = calloc(ncommits + 1, sizeof *lat), t0, c0;
  char sql[256];
  int rc = -1;
  if (!lat) die("out of memory");
  snprintf(sql, sizeof sql,
           "INSERT INTO pbuckets SELECT g, convert_to('bucket' || g, 'UTF8'), 0, 0, 0"
           " FROM generate_series(1, %u) g",
           w->nb);
  if (pq_run(r, w->c, P_SCHEMA) || pq_run(r, w->c, g_src_schema[w->L->src]) ||
      pq_run(r, w->c,
             w->L->codec ? P_SCHEMA_C
             : w->L->cap ? P_SCHEMA_B
                         : P_SCHEMA_A) ||
      (w->L->cap && w->L->compress != 1 &&
       pq_run(r, w->c, "ALTER TABLE pchunks ALTER ops SET STORAGE EXTERNAL")) ||
      (w->L->compress == 2 &&
       pq_run(r, w->c, "ALTER TABLE pchunks SET (toast_tuple_target = 8160)")) ||
      pq_run(r, w->c, sql))
    goto out;
  c0 = cpu_now();
  t0 = now_s();
  for (uint64_t k = 0; k < steps; k += every) {
    double t = now_s();
    if (p_commit(w, k, k + every < steps ? k + every : steps, r)) goto out;
    lat[nl++] = now_s() - t;
  }
  ps->ingest_s = now_s() - t0;
  ps->cpu_s = cpu_now() - c0;
  ps->lat[0] = pct(lat, nl, 0.50);
  ps->lat[1] = pct(lat, nl, 0.99);
  rc = 0;
out:
  free(lat);
  return rc;
}

/* The op store's size: rows, and the ops' bytes as written against as stored (TOAST compresses
 * a chunk's bytea; a's columns are below its threshold). */
static int p_sizes(pgw *w, pgstat *ps, bres *r) {
  PGresult *res;
  const char *sql = w->L->cap ? "SELECT count(*), sum(octet_length(ops))::float8,"
                                " sum(pg_column_size(ops))::float8,"
                                " pg_total_relation_size('pchunks')::float8 FROM pchunks"
                              : "SELECT count(*), sum(octet_length(data))::float8,"
                                " sum(pg_column_size(data))::float8,"
                                " pg_total_relation_size('pops')::float8 FROM pops";
  if (pq_run(r, w->c, "VACUUM (ANALYZE)")) return -1;
  ps->bytes = schema_bytes(w->c);
  res = PQexec(w->c, sql);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) return pq_fail(r, w->c, res, sql);
  ps->rows = strtod(PQgetvalue(res, 0, 0), NULL);
  ps->raw_bytes = strtod(PQgetvalue(res, 0, 1), NULL);
  ps->stored_bytes = strtod(PQgetvalue(res, 0, 2), NULL);
  ps->op_bytes = strtod(PQgetvalue(res, 0, 3), NULL);
  PQclear(res);
  sql = w->L->src == SRC_RAW ? "SELECT pg_total_relation_size('psource')::float8"
                             : "SELECT pg_total_relation_size('psrc')::float8";
  res = PQexec(w->c, sql);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) return pq_fail(r, w->c, res, sql);
  ps->src_bytes = strtod(PQgetvalue(res, 0, 0), NULL);
  PQclear(res);
  return 0;
}

static uint64_t rd_be64(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | u[i];
  return v;
}

typedef struct phand { /* what a read handed out */
  uint64_t ops, bytes;
  uint32_t sum;
} phand;

/* Hands out the ops of one chunk above after and at most cp; the last one's id into *last.
 * Returns the chunk's ops (handed or not), or -1 when it does not decode. */
static long chunk_hand(const unsigned char *p, size_t len, uint64_t min_op, uint64_t after,
                       uint64_t cp, phand *h, uint64_t *last) {
  const unsigned char *end = p + len;
  uint64_t op = min_op - 1;
  long n = 0;
  while (p < end) {
    uint64_t d, l[4];
    size_t k = get_var(p, end, &d);
    uint32_t ck;
    if (!k || (size_t)(end - p) < k + 5) return -1;
    p += k;
    op += d;
    ck = get_u32le(p + 1);
    p += 5;
    for (int f = 0; f < 4; f++) {
      if (!(k = get_var(p, end, &l[f])) || (uint64_t)(end - p - k) < l[f]) return -1;
      p += k + l[f];
    }
    n++;
    if (op <= after || op > cp) continue;
    h->ops++;
    h->bytes += l[0] + l[1] + l[2] + l[3];
    h->sum += ck;
    *last = op;
  }
  return n;
}

/* chunk_hand for layout c: the chunk decoded by opchunk.c, each op in range decoded in place. */
static long codec_hand(const unsigned char *p, size_t len, uint64_t after, uint64_t cp, phand *h,
                       uint64_t *last) {
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], sz[BS_CHUNK_MAX_OPS], n;
  if (bs__chunk_decode(p, len, ids, off, sz, &n)) return -1;
  for (uint32_t i = 0; i < n; i++) {
    bs_op op;
    if (ids[i] <= after || ids[i] > cp) continue;
    if (bs__op_value_decode_as(p + off[i], sz[i], ids[i], bs__chunk_flags(p), &op)) return -1;
    h->ops++;
    h->bytes += op.object_type.size + op.object_id.size + op.subkey.size + op.data.size;
    h->sum += op.checksum;
    *last = ids[i];
  }
  return (long)n;
}

/* Every bucket whole from 0 to cp, in calls of read_limit ops. */
static int p_reads(pgw *w, uint64_t cp, phand *h, bres *r) {
  static const char *sql[3] = {
      "SELECT op_id, checksum, object_type, object_id, subkey, data FROM pops"
      " WHERE bucket = $1 AND op_id > $2 AND op_id <= $3 ORDER BY op_id LIMIT $4",
      /* whole chunks from the one holding $2 + 1, until their counts reach $4 */
      "SELECT min_op, ops, before FROM (SELECT min_op, ops, sum(n) OVER (ORDER BY min_op) - n"
      " AS before FROM pchunks WHERE bucket = $1 AND min_op <= $3 AND min_op >= coalesce("
      "(SELECT CASE WHEN t.max_op > $2 THEN t.min_op END FROM (SELECT min_op, max_op FROM pchunks"
      " WHERE bucket = $1 AND min_op <= $2 ORDER BY min_op DESC LIMIT 1) t), $2 + 1)) s"
      " WHERE before < $4 ORDER BY min_op",
      /* c: whole chunks from the one holding $2 + 1 (the first whose last op is above $2) */
      "SELECT ops, before FROM (SELECT ops, last_op, sum(n) OVER (ORDER BY last_op) - n AS before"
      " FROM pchunks WHERE bucket = $1 AND last_op > $2 AND first_op <= $3) s WHERE before < $4"
      " ORDER BY last_op"};
  int b_layout = w->L->cap != 0;
  PGresult *res = PQprepare(w->c, "", sql[w->L->codec ? 2 : b_layout], 4, NULL);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) return pq_fail(r, w->c, res, "prepare");
  PQclear(res);
  for (unsigned b = 0; b < w->nb; b++) {
    uint64_t after = 0;
    int more = 1;
    while (more) {
      char b8[8], a8[8], c8[8], l8[8];
      const char *v[4] = {b8, a8, c8, l8};
      int len[4] = {8, 8, 8, 8}, fmt[4] = {1, 1, 1, 1}, nt;
      uint64_t seen = 0, handed = h->ops;
      be64s(b8, b + 1), be64s(a8, after), be64s(c8, cp), be64s(l8, g_cfg->read_limit);
      res = PQexecPrepared(w->c, "", 4, v, len, fmt, 1);
      if (PQresultStatus(res) != PGRES_TUPLES_OK) return pq_fail(r, w->c, res, "read");
      nt = PQntuples(res);
      for (int i = 0; i < nt; i++) {
        if (!b_layout) {
          h->sum += (uint32_t)rd_be64(PQgetvalue(res, i, 1));
          for (int f = 2; f < 6; f++) h->bytes += (uint64_t)PQgetlength(res, i, f);
          h->ops++;
          after = rd_be64(PQgetvalue(res, i, 0));
          seen++;
        } else {
          long k = w->L->codec ? codec_hand((const unsigned char *)PQgetvalue(res, i, 0),
                                            (size_t)PQgetlength(res, i, 0), after, cp, h, &after)
                               : chunk_hand((const unsigned char *)PQgetvalue(res, i, 1),
                                            (size_t)PQgetlength(res, i, 1),
                                            rd_be64(PQgetvalue(res, i, 0)), after, cp, h, &after);
          if (k < 0) {
            PQclear(res);
            snprintf(r->note, sizeof r->note, "bucket %u: a chunk does not decode", b + 1);
            r->status = BR_FAILED;
            return -1;
          }
          seen += (uint64_t)k;
        }
      }
      PQclear(res);
      more = seen >= g_cfg->read_limit && h->ops > handed;
    }
  }
  return 0;
}

/* Each bucket's checksum and count at cp (the head: no chunk holds ops above it). */
static int p_checksums(pgw *w, uint64_t cp, pgstat *ps, bres *r) {
  static const char *sql[3] = {
      "SELECT sum(checksum) % 4294967296, count(*) FROM pops WHERE bucket = $1 AND op_id <= $2",
      "SELECT sum(checksum) % 4294967296, sum(n) FROM pchunks WHERE bucket = $1 AND min_op <= $2",
      "SELECT sum(checksum::bigint & 4294967295) % 4294967296, sum(n) FROM pchunks"
      " WHERE bucket = $1 AND last_op <= $2"};
  uint64_t calls = w->nb < 200 ? 200 : w->nb;
  PGresult *res = PQprepare(w->c, "ck", sql[w->L->codec ? 2 : w->L->cap != 0], 2, NULL);
  double t0;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) return pq_fail(r, w->c, res, "prepare");
  PQclear(res);
  ps->ck_sum = 0;
  ps->ck_n = 0;
  t0 = now_s();
  for (uint64_t i = 0; i < calls; i++) {
    char b8[8], c8[8];
    const char *v[2] = {b8, c8};
    int len[2] = {8, 8}, fmt[2] = {1, 1};
    be64s(b8, i % w->nb + 1), be64s(c8, cp);
    res = PQexecPrepared(w->c, "ck", 2, v, len, fmt, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
      return pq_fail(r, w->c, res, "checksum");
    if (i < w->nb) {
      ps->ck_sum += (uint32_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
      ps->ck_n += strtoull(PQgetvalue(res, 0, 1), NULL, 10);
    }
    PQclear(res);
  }
  ps->ck_s = now_s() - t0;
  ps->ck_calls = calls;
  return 0;
}

static void p_run(const pglayout *L, unsigned nb, pgstat *ps) {
  char schema[64], url[1200], sql[256];
  size_t every = (size_t)g_cfg->commit_changes;
  bres r;
  pgw w;
  memset(ps, 0, sizeof *ps);
  memset(&r, 0, sizeof r);
  memset(&w, 0, sizeof w);
  w.L = L;
  w.nb = nb;
  w.bk = calloc(nb, sizeof *w.bk);
  w.ops = calloc(every, sizeof *w.ops);
  w.sorted = calloc(every, sizeof *w.sorted);
  w.start = calloc(nb + 1, sizeof *w.start);
  w.srows = calloc(every, sizeof *w.srows);
  if (!w.bk || !w.ops || !w.sorted || !w.start || !w.srows) die("out of memory");
  snprintf(schema, sizeof schema, "bsbench_%ld_proto", (long)g_cfg->pg_tag);
  schema_url(url, sizeof url, schema);
  snprintf(sql, sizeof sql,
           "SET client_min_messages = warning; DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s",
           schema, schema);
  if (!(w.c = pq_connect(&r, g_cfg->pg_url)) || pq_run(&r, w.c, sql)) goto out;
  PQfinish(w.c);
  if (!(w.c = pq_connect(&r, url)) || p_ingest(&w, ps, &r) || p_sizes(&w, ps, &r)) goto out;
  for (int pass = 0; pass < 3; pass++) { /* a warming pass, then the best of two */
    phand h = {0, 0, 0};
    double t0 = now_s(), t;
    if (p_reads(&w, w.head, &h, &r)) goto out;
    t = now_s() - t0;
    if (pass == 1 || (pass == 2 && t < ps->read_s)) ps->read_s = t;
    ps->read_ops = h.ops, ps->read_bytes = h.bytes, ps->read_sum = h.sum;
  }
  if (p_checksums(&w, w.head, ps, &r)) goto out;
  {
    uint32_t sum = 0;
    uint64_t n = 0;
    for (unsigned b = 0; b < nb; b++) sum += w.bk[b].ck, n += w.bk[b].n;
    if (sum != ps->read_sum || sum != ps->ck_sum || n != ps->read_ops || n != ps->ck_n ||
        n != p_steps()) {
      snprintf(r.note, sizeof r.note,
               "hand-outs differ from the writer's states: read %llu ops sum %u, checksums %llu"
               " ops sum %u, states %llu ops sum %u",
               (unsigned long long)ps->read_ops, ps->read_sum, (unsigned long long)ps->ck_n,
               ps->ck_sum, (unsigned long long)n, sum);
      r.status = BR_FAILED;
    }
  }
out:
  if (r.status == BR_FAILED) {
    fprintf(stderr, "bsbench --pg-proto: %s, %u buckets: %s\n", L->name, nb, r.note);
    ps->failed = 1;
  }
  if (w.c) PQfinish(w.c);
  if (!g_cfg->keep) {
    bres scratch;
    PGconn *c = pq_connect(&scratch, g_cfg->pg_url);
    snprintf(sql, sizeof sql, "SET client_min_messages = warning; DROP SCHEMA %s CASCADE", schema);
    if (c) pq_run(&scratch, c, sql), PQfinish(c);
  }
  for (unsigned b = 0; w.bk && b < nb; b++) free(w.bk[b].tail);
  free(w.bk), free(w.ops), free(w.sorted), free(w.start), free(w.srows);
}

static void p_print(unsigned nb, const pgstat *ps) {
  double n = (double)p_steps();
  const pgstat *a = &ps[0];
  printf("\n%u bucket(s), %llu inserts + %llu updates, a commit per %llu (x a: ratio to layout "
         "a)\n",
         nb, (unsigned long long)g_cfg->pg_rows, (unsigned long long)g_cfg->pg_rows / 2,
         (unsigned long long)g_cfg->commit_changes);
  printf("%-26s %15s %7s %15s %6s %6s %6s %8s %6s %15s %15s\n", "layout", "ingest ops/s", "cpu us",
         "p50/p99 ms", "B/op", "opsB", "srcB", "op rows", "toast", "reads ops/s", "ck us/bucket");
  for (size_t i = 0; i < NPL; i++) {
    const pgstat *p = &ps[i];
    if (p->failed) {
      if (p->failed > 0) printf("%-26s FAILED\n", g_pl[i].name);
      continue;
    }
    printf("%-26s %8.1fk %5.2fx %7.2f %7.1f/%-7.1f %6.0f %6.0f %6.0f %8.0f %6.2f %8.0fk %5.2fx "
           "%8.1f %5.2fx\n",
           g_pl[i].name, n / p->ingest_s / 1e3, a->ingest_s / p->ingest_s, p->cpu_s / n * 1e6,
           p->lat[0] * 1e3, p->lat[1] * 1e3, p->bytes / n, p->op_bytes / n, p->src_bytes / n,
           p->rows, p->raw_bytes > 0 ? p->stored_bytes / p->raw_bytes : 0,
           (double)p->read_ops / p->read_s / 1e3, a->read_s / p->read_s,
           p->ck_s / (double)p->ck_calls * 1e6, a->ck_s / p->ck_s);
  }
}

/* Whether layout i runs: BSBENCH_PG_LAYOUTS (indices into g_pl, comma-separated) when set; a
 * (index 0), the base of every ratio, always. */
static int layout_on(size_t i) {
  const char *e = getenv("BSBENCH_PG_LAYOUTS");
  if (!e || !*e || i == 0) return 1;
  while (*e) {
    char *end;
    unsigned long k = strtoul(e, &end, 10);
    if (end == e) die("BSBENCH_PG_LAYOUTS: indices separated by commas");
    if (k == i) return 1;
    e = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* The layouts at 1, --buckets and 10 x --buckets buckets (--quick: the first two), their
 * hand-outs cross-checked. Returns the number of failures. */
int proto_pg(void) {
  unsigned sizes[3] = {1, g_cfg->buckets_small, g_cfg->buckets_small * 10};
  int bad = 0, nsizes = g_cfg->quick ? 2 : 3;
  printf("PostgreSQL layout prototypes (not the schema), raw libpq; reads: best of 2 passes after"
         " a warming one\n");
  for (int s = 0; s < nsizes; s++) {
    pgstat ps[NPL];
    for (size_t i = 0; i < NPL; i++) {
      if (!layout_on(i)) {
        memset(&ps[i], 0, sizeof ps[i]);
        ps[i].failed = -1; /* not run */
        continue;
      }
      p_run(&g_pl[i], sizes[s], &ps[i]);
      bad += ps[i].failed > 0;
      if (!ps[i].failed && !ps[0].failed &&
          (ps[i].read_ops != ps[0].read_ops || ps[i].read_bytes != ps[0].read_bytes ||
           ps[i].read_sum != ps[0].read_sum || ps[i].ck_sum != ps[0].ck_sum)) {
        fprintf(stderr, "bsbench --pg-proto: %s, %u buckets: the hand-outs differ from layout a\n",
                g_pl[i].name, sizes[s]);
        bad++;
      }
    }
    p_print(sizes[s], ps);
  }
  printf(
      "\ncolumns: cpu us = this process's CPU per op of the ingest (the server's not counted);"
      " p50/p99 = one commit; B/op = pg_total_relation_size of every table after VACUUM"
      " ANALYZE / ops; opsB = the op table's alone (a: pops, b: pchunks, with TOAST and"
      " index; c: pchunks too); srcB = the source table's (raw: psource, with its data; 7, 7h, "
      "7hk: psrc,"
      " without); op rows = rows of the op table (a: ops, b: chunks); toast = the op"
      " bytes as stored / as written (a: its data column; b: the chunks' bytea, STORAGE"
      " EXTERNAL but in pglz); reads = every bucket from 0 in calls of %llu ops; ck = one bucket's"
      " checksum and count at the head (a: SUM of its ops, b: of its chunks' sums)\n",
      (unsigned long long)g_cfg->read_limit);
  return bad;
}

#endif /* BS_HAVE_PG */
