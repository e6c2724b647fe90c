/*
 * pg_codec.c: the PostgreSQL backend's codec, how the C values are stored in the rows of the
 * schema (pg_internal.h): the SQL spellings of the C enums, the stream row (read by
 * bs__pg_stream_row, stored by bs__pg_stream_args), an op's columns (read back by
 * bs__pg_op_row, written by bs__pg_op_copy), a source record's row and its members value, the
 * superseded log's pairs, and the binary COPY stream the writer fills. The other files name the
 * columns and decode the rows through it, so a stored field changes here and in a migration
 * (pg.c).
 */
#include "pg_internal.h"

/* ---- The SQL spellings of the C enums ------------------------------------------------------------ */

static const bs__pg_enum enums[] = {
    {"op type PUT", BS_PG_SQL_PUT, BS_OP_PUT},
    {"op type REMOVE", BS_PG_SQL_REMOVE, BS_OP_REMOVE},
    {"op type MOVE", BS_PG_SQL_MOVE, BS_OP_MOVE},
    {"op type CLEAR", BS_PG_SQL_CLEAR, BS_OP_CLEAR},
    {"change flag checkpoint", BS_PG_SQL_CHG_CHECKPOINT, BS_PG_CHG_CHECKPOINT},
    {"change flag too many buckets", BS_PG_SQL_CHG_BUCKETS, BS_PG_CHG_BUCKETS},
    {"change flag too many lookups", BS_PG_SQL_CHG_LOOKUPS, BS_PG_CHG_LOOKUPS},
    {"chunk header flags byte (1-based)", BS_PG_SQL_CHUNK_FLAGS_AT, BS_CHUNK_HDR},
    {"chunk flag CLEAR", BS_PG_SQL_CHUNK_CLEAR, BS_CHUNK_CLEAR},
    {NULL, NULL, 0},
};

const bs__pg_enum *bs__pg_enums(void) {
  return enums;
}

/* ---- The binary COPY stream ---------------------------------------------------------------------- */

unsigned char *bs__pg_buf_grow(bs__pg_buf *b, const bs_allocator *a, size_t n) {
  size_t cap = b->cap ? b->cap : 4096;
  unsigned char *p;
  if (b->oom) return NULL;
  while (cap < b->n + n) cap *= 2;
  if (!(p = bs__realloc(a, b->p, cap))) {
    b->oom = 1;
    return NULL;
  }
  b->p = p;
  b->cap = cap;
  b->n += n;
  return b->p + b->n - n;
}

/* ---- Ops ------------------------------------------------------------------------------------------ */

bs_op bs__pg_op_row(const PGresult *r, int row, int col, int data) {
  bs_op op;
  op.op_id = (uint64_t)bs__pg_i64(r, row, col);
  op.type = (bs_op_type)bs__pg_i16(r, row, col + 1);
  op.checksum = (uint32_t)bs__pg_i32(r, row, col + 2); /* stored signed: the same 32 bits */
  op.target_op = (uint64_t)bs__pg_i64(r, row, col + 3);
  op.object_type = bs__pg_bytes(r, row, col + 4);
  op.object_id = bs__pg_bytes(r, row, col + 5);
  op.subkey = bs__pg_bytes(r, row, col + 6);
  op.data = data ? bs__pg_bytes(r, row, col + BS_PG_OP_NCOLS) : (bs_val){NULL, 0};
  return op;
}

/* A field a call needs reads {NULL, 0} as "" (storage.h CONVENTIONS). */
static bs_val present(bs_val v) {
  return v.data ? v : bs__val_str("");
}

void bs__pg_op_copy(bs__pg_buf *b, const bs_allocator *a, uint64_t bucket, uint64_t op_id,
                    const bs_op *op) {
  bs_op f = *op;
  bs__op_fields(&f); /* the fields the type carries: "" for an empty one, NULL for the others */
  bs__pg_copy_tuple(b, a, 2 + BS_PG_OP_NCOLS);
  bs__pg_copy_int(b, a, bucket, 8);
  bs__pg_copy_int(b, a, op_id, 8);
  bs__pg_copy_int(b, a, (uint64_t)f.type, 2);
  bs__pg_copy_int(b, a, f.checksum, 4); /* integer: the same 32 bits, signed */
  bs__pg_copy_int(b, a, f.target_op, 8);
  bs__pg_copy_bytes(b, a, f.object_type);
  bs__pg_copy_bytes(b, a, f.object_id);
  bs__pg_copy_bytes(b, a, f.subkey);
  bs__pg_copy_bytes(b, a, f.data);
}

/* ---- The stream row ------------------------------------------------------------------------- */

bs__pg_stream bs__pg_stream_row(const PGresult *r, int row) {
  bs__pg_stream s = {.row = {.checkpoint = (uint64_t)bs__pg_i64(r, row, 0),
                             .checkpoint_lsn = bs__pg_bytes(r, row, 1)}};
  s.id = (uint32_t)bs__pg_i32(r, row, 2);
  s.name = bs__pg_bytes(r, row, 3);
  s.hash = (bs_hash)bs__pg_i16(r, row, 4);
  s.row.state = (unsigned)bs__pg_i16(r, row, 5);
  s.row.snapshot_done = bs__pg_bool(r, row, 6);
  s.row.op_head = (uint64_t)bs__pg_i64(r, row, 7);
  s.row.last_checkpoint_op = (uint64_t)bs__pg_i64(r, row, 8);
  s.row.resume_lsn = bs__pg_bytes(r, row, 9);
  s.row.no_checkpoint_before = bs__pg_bytes(r, row, 10);
  s.row.param_horizon = (uint64_t)bs__pg_i64(r, row, 11);
  s.row.param_cursor = (uint64_t)bs__pg_i64(r, row, 12);
  s.row.changes_fence = (uint64_t)bs__pg_i64(r, row, 13);
  s.last_error = bs__pg_bytes(r, row, 14);
  return s;
}

void bs__pg_stream_args(bs__pg_args *a, const bs__stream_row *w) {
  bs__pg_arg_i32(a, (int32_t)w->state);
  bs__pg_arg_bool(a, w->snapshot_done);
  bs__pg_arg_i64(a, (int64_t)w->op_head);
  bs__pg_arg_i64(a, (int64_t)w->checkpoint);
  bs__pg_arg_i64(a, (int64_t)w->last_checkpoint_op);
  bs__pg_arg_bytes(a, w->checkpoint_lsn);
  bs__pg_arg_bytes(a, w->resume_lsn);
  bs__pg_arg_bytes(a, w->no_checkpoint_before);
  bs__pg_arg_i64(a, (int64_t)w->param_horizon);
  bs__pg_arg_i64(a, (int64_t)w->param_cursor);
  bs__pg_arg_i64(a, (int64_t)w->changes_fence);
}

/* ---- Varints ------------------------------------------------------------------------------------- */

static size_t vsize(uint64_t v) {
  size_t n = 1;
  while (v >= 128) v >>= 7, n++;
  return n;
}

static unsigned char *vput(unsigned char *p, uint64_t v) {
  for (; v >= 128; v >>= 7) *p++ = (unsigned char)(v | 128);
  *p++ = (unsigned char)v;
  return p;
}

/* Reads a varint of at most 64 bits at *p (< end): 0 when it is truncated or overlong. */
static int vget(const unsigned char **p, const unsigned char *end, uint64_t *v) {
  uint64_t x = 0;
  for (int s = 0; s < 64 && *p < end; s += 7) {
    unsigned b = *(*p)++;
    if (s == 63 && b > 1) return 0;
    x |= (uint64_t)(b & 127) << s;
    if (!(b & 128)) {
      *v = x;
      return 1;
    }
  }
  return 0;
}

/* A varint length and the string after it (borrowed), within end. */
static int vget_str(const unsigned char **p, const unsigned char *end, bs_val *out) {
  uint64_t n;
  if (!vget(p, end, &n) || n > (uint64_t)(end - *p)) return 0;
  out->data = *p;
  out->size = (size_t)n;
  *p += n;
  return 1;
}

static unsigned char *vput_str(unsigned char *p, bs_val v) {
  p = vput(p, v.size);
  if (v.size) memcpy(p, v.data, v.size);
  return p + v.size;
}

/* ---- Source records ----------------------------------------------------------------------------
 * The members value (memberships and lookups; mark and data are columns) since schema 9, in
 * unsigned LEB128 varints: a head byte, its low 4 bits the membership count and its high 4 bits
 * the lookup count (15: the count follows as a varint, at least 15); then per membership its
 * bucket id, op id and a code, and when the code's bit 0 is set the object id's length; then its
 * object_type (code >> 1, less 1, bytes) unless code >> 1 is 0, which stands for the previous
 * membership's object type, and for the first for the record's table's name (bs_tables.name);
 * then its object_id (bit 0 only; clear: the record's replica id). Then per lookup its length
 * and key. The common record, one membership whose object type is its table's name and whose
 * object id its replica id, takes 1 + bucket + op + 1 bytes (6 in bsbench --pg), where schema 8
 * took 13 (its count, the type's length and bytes, a byte for the object id, the lookup count):
 * with the record keyed by one table key (schema 9), that takes its heap tuple from 56 to 48
 * bytes (bench/README.md "Schema 9"). A count the head could hold but given as a varint, or one
 * whose members cannot fit, does not decode. */

static uint64_t srec_code(const bs__srec *r, uint32_t i, bs_val table, bs_val rid) {
  bs_val prev = i ? r->m[i - 1].object_type : table;
  uint64_t c = bs__val_eq(r->m[i].object_type, prev) ? 0 : (r->m[i].object_type.size + 1) << 1;
  return c | !bs__val_eq(r->m[i].object_id, rid);
}

static size_t srec_count_size(uint64_t n) {
  return n < 15 ? 0 : vsize(n);
}

size_t bs__pg_srec_size(const bs__srec *r, bs_val table, bs_val rid) {
  size_t n = 1 + srec_count_size(r->nm) + srec_count_size(r->nl);
  for (uint32_t i = 0; i < r->nm; i++) {
    const bs__member *m = &r->m[i];
    uint64_t c = srec_code(r, i, table, rid);
    n += vsize(m->bucket) + vsize(m->op) + vsize(c);
    if (c >> 1) n += m->object_type.size;
    if (c & 1) n += vsize(m->object_id.size) + m->object_id.size;
  }
  for (uint32_t i = 0; i < r->nl; i++) n += vsize(r->lk[i].size) + r->lk[i].size;
  return n;
}

void bs__pg_srec_encode(unsigned char *p, const bs__srec *r, bs_val table, bs_val rid) {
  *p++ = (unsigned char)((r->nm < 15 ? r->nm : 15) | (r->nl < 15 ? r->nl : 15) << 4);
  if (r->nm >= 15) p = vput(p, r->nm);
  if (r->nl >= 15) p = vput(p, r->nl);
  for (uint32_t i = 0; i < r->nm; i++) {
    const bs__member *m = &r->m[i];
    uint64_t c = srec_code(r, i, table, rid);
    p = vput(vput(vput(p, m->bucket), m->op), c);
    if (c & 1) p = vput(p, m->object_id.size);
    if ((c >> 1) && m->object_type.size) memcpy(p, m->object_type.data, m->object_type.size);
    if (c >> 1) p += m->object_type.size;
    if ((c & 1) && m->object_id.size) memcpy(p, m->object_id.data, m->object_id.size);
    if (c & 1) p += m->object_id.size;
  }
  for (uint32_t i = 0; i < r->nl; i++) p = vput_str(p, r->lk[i]);
}

/* A count of the head (h, 15: a varint of at least 15 follows). */
static int srec_count(const unsigned char **p, const unsigned char *end, unsigned h, uint64_t *n) {
  if (h < 15) {
    *n = h;
    return 1;
  }
  return vget(p, end, n) && *n >= 15;
}

/* n bytes at *p (borrowed), within end */
static int srec_bytes(const unsigned char **p, const unsigned char *end, uint64_t n, bs_val *out) {
  if (n > (uint64_t)(end - *p)) return 0;
  out->data = *p;
  out->size = (size_t)n;
  *p += n;
  return 1;
}

int bs__pg_srec_decode(const bs_allocator *a, bs_val v, bs_val table, bs_val rid, bs__srec *r) {
  const unsigned char *p = v.data, *end;
  uint64_t nm, nl;
  unsigned head;
  int rc = BS_ECORRUPT;
  r->m = NULL;
  r->lk = NULL;
  r->nm = r->nl = 0;
  if (!p || !v.size) return BS_ECORRUPT;
  end = p + v.size;
  head = *p++;
  /* a membership takes at least 3 bytes, a key 1: counts that cannot fit are refused before
   * they size an allocation */
  if (!srec_count(&p, end, head & 15u, &nm) || !srec_count(&p, end, head >> 4, &nl) ||
      nm > v.size / 3 || nl > v.size)
    return BS_ECORRUPT;
  if (!(r->m = bs__calloc(a, (size_t)nm + 1, sizeof *r->m)) ||
      !(r->lk = bs__calloc(a, (size_t)nl + 1, sizeof *r->lk))) {
    rc = BS_ENOMEM;
    goto fail;
  }
  for (uint64_t i = 0; i < nm; i++) {
    bs__member *m = &r->m[i];
    uint64_t c, oil = 0;
    if (!vget(&p, end, &m->bucket) || !vget(&p, end, &m->op) || !vget(&p, end, &c) ||
        ((c & 1) && !vget(&p, end, &oil)))
      goto fail;
    if (c >> 1) {
      if (!srec_bytes(&p, end, (c >> 1) - 1, &m->object_type)) goto fail;
    } else {
      m->object_type = i ? r->m[i - 1].object_type : table;
    }
    if (c & 1) {
      if (!srec_bytes(&p, end, oil, &m->object_id)) goto fail;
    } else {
      m->object_id = rid;
    }
  }
  for (uint64_t i = 0; i < nl; i++)
    if (!vget_str(&p, end, &r->lk[i])) goto fail;
  if (p == end) {
    r->nm = (uint32_t)nm;
    r->nl = (uint32_t)nl;
    return BS_OK;
  }
fail:
  bs__free(a, r->m);
  bs__free(a, r->lk);
  r->m = NULL;
  r->lk = NULL;
  return rc;
}

/* Schema 5-8's members value, which migration 9 (pg_format.c) reads: nm, nm x (bucket, op, len,
 * object_type, object_id), nl, nl x (len, key), all varints, where an object_id is 0 when it is
 * the record's replica id, else its length + 1 and its bytes (schema 7). */

/* An object_id: the replica id (0), or a length + 1 and the string (borrowed), within end. */
static int vget_oid(const unsigned char **p, const unsigned char *end, bs_val rid, bs_val *out) {
  uint64_t n;
  if (!vget(p, end, &n)) return 0;
  if (n == 0) {
    *out = rid;
    return 1;
  }
  if (n - 1 > (uint64_t)(end - *p)) return 0;
  out->data = *p;
  out->size = (size_t)(n - 1);
  *p += n - 1;
  return 1;
}

int bs__pg_srec8_decode(const bs_allocator *a, bs_val v, bs_val rid, bs__srec *r) {
  const unsigned char *p = v.data, *end;
  uint64_t nm, nl;
  int rc = BS_ECORRUPT;
  r->m = NULL;
  r->lk = NULL;
  r->nm = r->nl = 0;
  if (!p) return BS_ECORRUPT;
  end = p + v.size;
  /* a membership takes at least 4 bytes, a key 1: counts that cannot fit are refused before
   * they size an allocation */
  if (!vget(&p, end, &nm) || nm > v.size / 4) return BS_ECORRUPT;
  if (!(r->m = bs__calloc(a, (size_t)nm + 1, sizeof *r->m))) return BS_ENOMEM;
  for (uint64_t i = 0; i < nm; i++)
    if (!vget(&p, end, &r->m[i].bucket) || !vget(&p, end, &r->m[i].op) ||
        !vget_str(&p, end, &r->m[i].object_type) || !vget_oid(&p, end, rid, &r->m[i].object_id))
      goto fail;
  if (!vget(&p, end, &nl) || nl > v.size) goto fail;
  if (!(r->lk = bs__calloc(a, (size_t)nl + 1, sizeof *r->lk))) {
    rc = BS_ENOMEM;
    goto fail;
  }
  for (uint64_t i = 0; i < nl; i++)
    if (!vget_str(&p, end, &r->lk[i])) goto fail;
  if (p == end) {
    r->nm = (uint32_t)nm;
    r->nl = (uint32_t)nl;
    return BS_OK;
  }
fail:
  bs__free(a, r->m);
  bs__free(a, r->lk);
  r->m = NULL;
  r->lk = NULL;
  return rc;
}

int bs__pg_source_row(bs__srec *out, const bs_allocator *a, const PGresult *r, int row, int col,
                      int data, bs_val table) {
  bs_val rid = bs__pg_bytes(r, row, col);
  memset(out, 0, sizeof *out);
  out->exists = 1;
  out->soft = !PQgetisnull(r, row, col + 1); /* a mark: soft-deleted */
  out->mark = out->soft ? (uint64_t)bs__pg_i64(r, row, col + 1) : 0;
  out->has_data = bs__pg_bool(r, row, col + 3);
  if (data) out->data = bs__pg_bytes(r, row, col + BS_PG_SOURCE_NCOLS);
  return bs__pg_srec_decode(a, bs__pg_bytes(r, row, col + 2), table, rid, out);
}

void bs__pg_source_copy(bs__pg_buf *b, const bs_allocator *a, uint32_t tkey, bs_val table,
                        bs_val rid, const bs__srec *r) {
  size_t sz = bs__pg_srec_size(r, table, rid);
  unsigned char *p;
  bs__pg_copy_tuple(b, a, 5);
  if (r->soft)
    bs__pg_copy_int(b, a, r->mark, 8);
  else
    bs__pg_copy_bytes(b, a, (bs_val){NULL, 0}); /* NULL: not soft-deleted */
  bs__pg_copy_int(b, a, tkey, 4);
  bs__pg_copy_bytes(b, a, rid);
  if ((p = bs__pg_buf_room(b, a, 4 + sz))) {
    bs__put_u32be(p, (uint32_t)sz);
    bs__pg_srec_encode(p + 4, r, table, rid);
  }
  bs__pg_copy_bytes(b, a, r->has_data ? present(r->data) : (bs_val){NULL, 0});
}

/* ---- The superseded log ---------------------------------------------------------------------------
 * A bs_superseded row's pairs (schema 6): its entries ascending by old op, each two varints: the
 * old op minus the previous entry's (0 before the first; so at least 1) and the new op minus the
 * row's first_new. */

unsigned char *bs__pg_sups_put(unsigned char *p, uint64_t *prev_old, uint64_t first_new,
                               uint64_t old_op, uint64_t new_op) {
  p = vput(vput(p, old_op - *prev_old), new_op - first_new);
  *prev_old = old_op;
  return p;
}

void bs__pg_sups_open(bs__pg_sups *it, bs_val v, uint64_t first_new) {
  it->p = v.data;
  it->end = it->p ? it->p + v.size : NULL;
  it->old_op = 0;
  it->first_new = first_new;
}

int bs__pg_sups_next(bs__pg_sups *it, uint64_t *old_op, uint64_t *new_op) {
  uint64_t d, n;
  if (it->p == it->end) return 0;
  if (!vget(&it->p, it->end, &d) || !vget(&it->p, it->end, &n) || !d ||
      d > UINT64_MAX - it->old_op || n > UINT64_MAX - it->first_new)
    return BS_ECORRUPT;
  *old_op = it->old_op += d;
  *new_op = it->first_new + n;
  return 1;
}
