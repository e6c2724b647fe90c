/*
 * lmdb_codec.c: the encoders of the LMDB layout (lmdb_internal.h, "The codec"). Each key and
 * value of the layout table is written here and read by the decoder beside its declaration, so
 * the writer, the readers, compaction, verify and the tests cannot disagree on a byte. The
 * decoders that sit in hot read loops are inline in lmdb_internal.h.
 */
#include "lmdb_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- The one field writer and reader the values below are written and read with ----
 * A value is a sequence of little-endian integers (1, 2, 4 or 8 bytes wide) and byte strings,
 * most of them length-prefixed. The writer appends a field and returns where the next one goes;
 * the reader takes the fields in the same order and never reads past the value: a field that
 * does not fit (or a length over its limit) makes the reader bad, after which every field reads
 * as 0 or empty, so that a decoder checks once, at its end (rd_end), that the value was exactly
 * one whole record. */
typedef struct rd {
  const unsigned char *p, *end;
  int bad;
} rd;

static inline rd rd_of(const MDB_val *v) {
  rd r = {v->mv_data, (const unsigned char *)v->mv_data + v->mv_size, 0};
  return r;
}

/* The next n bytes; NULL (r bad) when fewer are left. */
static inline const unsigned char *rd_take(rd *r, size_t n) {
  const unsigned char *p = r->p;
  if (r->bad || (size_t)(r->end - p) < n) {
    r->bad = 1;
    return NULL;
  }
  r->p += n;
  return p;
}

static inline uint64_t rd_uint(rd *r, size_t width) {
  const unsigned char *p = rd_take(r, width);
  if (!p) return 0;
  return width == 8   ? bs__get_u64le(p)
         : width == 4 ? bs__get_u32le(p)
         : width == 2 ? bs__get_u16le(p)
                      : p[0];
}

/* A string with a width-byte length of at most max (borrowed, non-NULL also when empty). */
static inline bs_val rd_str(rd *r, size_t width, size_t max) {
  size_t n = (size_t)rd_uint(r, width);
  bs_val v = {NULL, 0};
  if (n > max) r->bad = 1;
  if ((v.data = rd_take(r, n))) v.size = n;
  return v;
}

/* BS_OK when every field fitted and they took the whole value. */
static inline int rd_end(const rd *r) {
  return !r->bad && r->p == r->end ? BS_OK : BS_ECORRUPT;
}

static inline unsigned char *wr_uint(unsigned char *p, uint64_t v, size_t width) {
  if (width == 8) bs__put_u64le(p, v);
  if (width == 4) bs__put_u32le(p, (uint32_t)v);
  if (width == 2) bs__put_u16le(p, (uint32_t)v);
  if (width == 1) *p = (unsigned char)v;
  return p + width;
}

static inline unsigned char *wr_bytes(unsigned char *p, bs_val v) {
  if (v.size) memcpy(p, v.data, v.size);
  return p + v.size;
}

static inline unsigned char *wr_str(unsigned char *p, size_t width, bs_val v) {
  return wr_bytes(wr_uint(p, v.size, width), v);
}

/* ---- buckets and tables: u32be stream | name (the rest) ---- */

static int named_key(unsigned char *buf, uint32_t stream, bs_val name, size_t max, const char *what,
                     MDB_val *key, bs_error *err) {
  if (name.size > max)
    return bs__fail(err, BS_ETOOBIG, "%s name of %zu bytes, over BS_MAX_%s_NAME", what, name.size,
                    what[0] == 'b' ? "BUCKET" : "TABLE");
  bs__put_u32be(buf, stream);
  if (name.size) memcpy(buf + 4, name.data, name.size);
  key->mv_size = 4 + name.size;
  key->mv_data = buf;
  return BS_OK;
}

/* A whole key of max bytes at most, with a name of at least one byte. */
static int named_entry(const MDB_val *k, size_t max, uint32_t *stream, bs_val *name) {
  if (k->mv_size < 5 || k->mv_size > max) return BS_ECORRUPT;
  *stream = bs__get_u32be(k->mv_data);
  name->data = (const unsigned char *)k->mv_data + 4;
  name->size = k->mv_size - 4;
  return BS_OK;
}

int bs__lmdb_bucket_key(unsigned char buf[BS_BUCKET_KEY_MAX], uint32_t stream, bs_val name,
                        MDB_val *key, bs_error *err) {
  return named_key(buf, stream, name, BS_MAX_BUCKET_NAME, "bucket", key, err);
}

int bs__lmdb_bucket_id_decode(const MDB_val *v, uint64_t *id, bs_error *err) {
  if (v->mv_size != 8)
    return bs__fail(err, BS_ECORRUPT, "bucket id value of %zu bytes", v->mv_size);
  *id = bs__get_u64le(v->mv_data);
  return BS_OK;
}

int bs__lmdb_bucket_entry_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, bs_val *name,
                                 uint64_t *id) {
  if (named_entry(k, BS_BUCKET_KEY_MAX, stream, name) || v->mv_size != 8) return BS_ECORRUPT;
  *id = bs__get_u64le(v->mv_data);
  return BS_OK;
}

int bs__lmdb_table_key(unsigned char buf[BS_TABLE_KEY_MAX], uint32_t stream, bs_val name,
                       MDB_val *key, bs_error *err) {
  return named_key(buf, stream, name, BS_MAX_TABLE_NAME, "table", key, err);
}

int bs__lmdb_table_id_decode(const MDB_val *v, uint32_t *id, bs_error *err) {
  if (v->mv_size != 4 || bs__get_u32le(v->mv_data) == 0)
    return bs__fail(err, BS_ECORRUPT, "table id value of %zu bytes is not an id", v->mv_size);
  *id = bs__get_u32le(v->mv_data);
  return BS_OK;
}

int bs__lmdb_table_entry_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, bs_val *name,
                                uint32_t *id) {
  if (named_entry(k, BS_TABLE_KEY_MAX, stream, name) || bs__lmdb_table_id_decode(v, id, NULL))
    return BS_ECORRUPT;
  return BS_OK;
}

/* ---- bstate ---- */

int bs__bucket_state_decode(const MDB_val *v, bs__bucket_state *s) {
  const unsigned char *p = v->mv_data;
  if (v->mv_size < BS_BUCKET_STATE_FIXED || v->mv_size > BS_BUCKET_STATE_FIXED + BS_MAX_BUCKET_NAME)
    return BS_ECORRUPT;
  s->stream = bs__get_u32le(p);
  s->checksum = bs__get_u32le(p + 4);
  s->count = bs__get_u64le(p + 8);
  s->bytes = bs__get_u64le(p + 16);
  s->last_op = bs__get_u64le(p + 24);
  s->generation = bs__get_u64le(p + 32);
  s->clear_start = bs__get_u64le(p + 40);
  s->clear_op = bs__get_u64le(p + 48);
  s->compacted_count = bs__get_u64le(p + 56);
  s->compacted_op = bs__get_u64le(p + 64);
  for (int i = 0; i < 3; i++) s->reserved[i] = bs__get_u64le(p + 72 + 8 * i);
  s->name.data = p + BS_BUCKET_STATE_FIXED; /* non-NULL, also when empty */
  s->name.size = v->mv_size - BS_BUCKET_STATE_FIXED;
  return BS_OK;
}

void bs__bucket_state_encode(unsigned char *p, const bs__bucket_state *s) {
  bs__put_u32le(p, s->stream);
  bs__put_u32le(p + 4, s->checksum);
  bs__put_u64le(p + 8, s->count);
  bs__put_u64le(p + 16, s->bytes);
  bs__put_u64le(p + 24, s->last_op);
  bs__put_u64le(p + 32, s->generation);
  bs__put_u64le(p + 40, s->clear_start);
  bs__put_u64le(p + 48, s->clear_op);
  bs__put_u64le(p + 56, s->compacted_count);
  bs__put_u64le(p + 64, s->compacted_op);
  for (int i = 0; i < 3; i++) bs__put_u64le(p + 72 + 8 * i, s->reserved[i]);
  if (s->name.size) memcpy(p + BS_BUCKET_STATE_FIXED, s->name.data, s->name.size);
}

/* ---- params ---- */

size_t bs__lmdb_param_prefix(unsigned char *out, uint32_t stream, bs_val lookup) {
  bs__put_u32be(out, stream);
  out[4] = (unsigned char)(lookup.size >> 8);
  out[5] = (unsigned char)lookup.size;
  if (lookup.size) memcpy(out + 6, lookup.data, lookup.size);
  return 6 + lookup.size;
}

size_t bs__lmdb_param_key(unsigned char *out, uint32_t stream, bs_val lookup, uint32_t table_id,
                          bs_val replica_id, uint64_t op_id) {
  size_t n = bs__lmdb_param_prefix(out, stream, lookup);
  uint64_t h = XXH3_64bits(replica_id.size ? replica_id.data : "", replica_id.size);
  bs__put_u32be(out + n, table_id);
  bs__put_u64be(out + n + 4, h);
  bs__put_u64be(out + n + 12, op_id);
  return n + BS_PARAM_GROUP_SIZE + 8;
}

int bs__lmdb_param_key_decode(const MDB_val *k, uint32_t *stream, bs_val *lookup, uint64_t *op_id) {
  const unsigned char *p = (const unsigned char *)k->mv_data;
  size_t klen = k->mv_size >= 6 ? (size_t)p[4] << 8 | p[5] : 0;
  if (k->mv_size < 6 || klen > BS_MAX_LOOKUP_KEY ||
      k->mv_size != 6 + klen + BS_PARAM_GROUP_SIZE + 8)
    return BS_ECORRUPT;
  *stream = bs__get_u32be(p);
  lookup->data = p + 6;
  lookup->size = klen;
  *op_id = bs__get_u64be(p + k->mv_size - 8);
  return BS_OK;
}

size_t bs__lmdb_param_value_size(bs_val replica_id, const bs_val *rows, size_t n) {
  size_t size = 2 + replica_id.size + 4;
  for (size_t i = 0; i < n; i++) size += 4 + rows[i].size;
  return size;
}

void bs__lmdb_param_value(unsigned char *p, bs_val replica_id, const bs_val *rows, size_t n) {
  p = wr_str(p, 2, replica_id);
  p = wr_uint(p, n, 4);
  for (size_t i = 0; i < n; i++) p = wr_str(p, 4, rows[i]);
}

int bs__lmdb_param_value_decode(const MDB_val *v, bs_val *replica_id, uint32_t *n_rows,
                                const unsigned char **rows_out) {
  rd r = rd_of(v);
  bs_val rid = rd_str(&r, 2, BS_MAX_REPLICA_ID);
  uint32_t n = (uint32_t)rd_uint(&r, 4);
  const unsigned char *rows = r.p;
  /* every row length must fit, and the rows must end exactly at the value's end */
  for (uint32_t i = 0; i < n && !r.bad; i++) rd_str(&r, 4, UINT32_MAX);
  if (rd_end(&r)) return BS_ECORRUPT;
  *replica_id = rid;
  *n_rows = n;
  if (rows_out) *rows_out = rows;
  return BS_OK;
}

/* ---- superseded ---- */

void bs__lmdb_sup_key(unsigned char k[BS_SUP_KEY_SIZE], uint64_t bucket, uint64_t old_op) {
  bs__put_u64be(k, bucket);
  bs__put_u64be(k + 8, old_op);
}

void bs__lmdb_sup_value(unsigned char v[BS_SUP_VALUE_SIZE], uint64_t new_op) {
  bs__put_u64le(v, new_op);
}

int bs__lmdb_sup_decode(const MDB_val *k, const MDB_val *v, uint64_t *bucket, uint64_t *old_op,
                        uint64_t *new_op) {
  if (k->mv_size != BS_SUP_KEY_SIZE || v->mv_size != BS_SUP_VALUE_SIZE) return BS_ECORRUPT;
  *bucket = bs__get_u64be(k->mv_data);
  *old_op = bs__get_u64be((const unsigned char *)k->mv_data + 8);
  *new_op = bs__get_u64le(v->mv_data);
  return BS_OK;
}

/* ---- meta: stream records ---- */

_Static_assert(BS_MAX_STREAM_NAME <= BS_STREAM_STR_MAX && BS_MAX_LSN <= BS_STREAM_STR_MAX,
               "a stream record string holds a stream name and an LSN");

int bs__lmdb_stream_key_decode(const MDB_val *k, uint32_t *id) {
  const unsigned char *p = (const unsigned char *)k->mv_data;
  if (k->mv_size != BS_STREAM_KEY_SIZE || p[0] != 'S') return BS_ECORRUPT;
  *id = bs__get_u32be(p + 1);
  return BS_OK;
}

/* The record's five strings and eight u64 fields, in their order in the value. */
#define STREAM_STRS(r)                                                                             \
  {                                                                                                \
    &(r)->name, &(r)->checkpoint_lsn, &(r)->resume_lsn, &(r)->no_checkpoint_before,                \
        &(r)->last_error                                                                           \
  }
#define STREAM_U64S(r)                                                                             \
  {                                                                                                \
    &(r)->op_head, &(r)->checkpoint, &(r)->last_checkpoint_op, &(r)->change_seq,                   \
        &(r)->param_horizon, &(r)->param_cursor, &(r)->changes_fence, &(r)->compact_horizon        \
  }

size_t bs__stream_rec_encode(unsigned char out[BS_STREAM_REC_MAX], const bs__stream_rec *r) {
  const bs_val *strs[5] = STREAM_STRS(r);
  const uint64_t *u64s[8] = STREAM_U64S(r);
  unsigned char *p = out + BS_STREAM_REC_FIXED;
  memset(out, 0, BS_STREAM_REC_FIXED);
  out[0] = BS_STREAM_REC_VERSION;
  out[1] = r->state;
  out[2] = r->hash;
  out[3] = r->snapshot_done;
  out[4] = (unsigned char)((r->has_checkpoint_lsn ? 1 : 0) | (r->has_resume_lsn ? 2 : 0) |
                           (r->has_no_checkpoint_before ? 4 : 0) | (r->clear_pending ? 8 : 0));
  bs__put_u32le(out + 8, r->id);
  bs__put_u32le(out + 12, r->next_table_id);
  for (int i = 0; i < 8; i++) bs__put_u64le(out + 16 + 8 * i, *u64s[i]);
  bs__put_u64le(out + 80, (uint64_t)r->created_ms);
  for (int i = 0; i < 5; i++) {
    if (strs[i]->size > BS_STREAM_STR_MAX) return 0;
    p = wr_str(p, 2, *strs[i]);
  }
  return (size_t)(p - out);
}

int bs__stream_rec_decode(const MDB_val *v, bs__stream_rec *r) {
  const unsigned char *p = (const unsigned char *)v->mv_data;
  rd q = rd_of(v);
  bs_val *strs[5] = STREAM_STRS(r);
  uint64_t *u64s[8] = STREAM_U64S(r);
  memset(r, 0, sizeof *r);
  if (v->mv_size < BS_STREAM_REC_FIXED || p[0] != BS_STREAM_REC_VERSION ||
      p[1] < BS_STREAM_PROCESSING || p[1] > BS_STREAM_TERMINATED)
    return BS_ECORRUPT;
  r->state = p[1];
  r->hash = p[2];
  r->snapshot_done = p[3];
  r->has_checkpoint_lsn = p[4] & 1;
  r->has_resume_lsn = (p[4] >> 1) & 1;
  r->has_no_checkpoint_before = (p[4] >> 2) & 1;
  r->clear_pending = (p[4] >> 3) & 1;
  r->id = bs__get_u32le(p + 8);
  r->next_table_id = bs__get_u32le(p + 12);
  for (int i = 0; i < 8; i++) *u64s[i] = bs__get_u64le(p + 16 + 8 * i);
  r->created_ms = (int64_t)bs__get_u64le(p + 80);
  rd_take(&q, BS_STREAM_REC_FIXED);
  for (int i = 0; i < 5; i++) *strs[i] = rd_str(&q, 2, BS_STREAM_STR_MAX);
  return rd_end(&q);
}

/* ---- changes ---- */

unsigned char *bs__lmdb_change_head(unsigned char *p, uint64_t first, int64_t time_ms,
                                    unsigned flags) {
  p = wr_uint(p, first, 8);
  p = wr_uint(p, (uint64_t)time_ms, 8);
  return wr_uint(p, flags, 1);
}

unsigned char *bs__lmdb_change_count(unsigned char *p, uint32_t n) {
  return wr_uint(p, n, 4);
}

unsigned char *bs__lmdb_change_item(unsigned char *p, bs_val item) {
  return wr_str(p, 2, item);
}

/* One list of items of at most max bytes each, checked; a capped kind never has too many (the
 * writer stores the flag instead). */
static bs__change_list change_list(rd *r, size_t max, int capped) {
  bs__change_list l;
  l.n = (uint32_t)rd_uint(r, 4);
  l.p = r->p;
  if (capped && bs__changes_too_many(l.n)) r->bad = 1;
  for (uint32_t i = 0; i < l.n && !r->bad; i++) rd_str(r, 2, max);
  return l;
}

int bs__lmdb_change_decode(const MDB_val *k, const MDB_val *v, bs__change_rec *out) {
  const unsigned char *kp = (const unsigned char *)k->mv_data;
  const unsigned known =
      BS_CHANGE_CHECKPOINT | BS_CHANGE_TOO_MANY_BUCKETS | BS_CHANGE_TOO_MANY_LOOKUPS;
  rd r = rd_of(v);
  if (k->mv_size != BS_CHANGE_KEY_SIZE) return BS_ECORRUPT;
  out->stream = bs__get_u32be(kp);
  out->last = bs__get_u64be(kp + 4);
  out->seq = bs__get_u64be(kp + 12);
  out->first = rd_uint(&r, 8);
  out->time_ms = (int64_t)rd_uint(&r, 8);
  out->flags = (unsigned)rd_uint(&r, 1);
  if (out->flags & ~known) return BS_ECORRUPT;
  out->buckets = change_list(&r, BS_MAX_BUCKET_NAME, 1);
  out->lookups = change_list(&r, BS_MAX_LOOKUP_KEY, 1);
  out->users = change_list(&r, BS_MAX_USER_ID, 0);
  return rd_end(&r);
}

/* ---- source ----
 * Format 3 (lmdb_internal.h): varints, the counts in the head byte while small, the mark only
 * when set, and an object type that repeats the previous membership's or (the first) is the
 * table's name, or an object id that is the replica id, not written again. */

#define SREC_SOFT     1u
#define SREC_DATA     2u
#define SREC_MARK     4u
#define SREC_FLAGS    7u
#define SREC_NM_SHIFT 3 /* bits 3-5: n members, 7 = a varint follows */
#define SREC_NM_BIG   7u
#define SREC_NL_SHIFT 6 /* bits 6-7: n lookups, 3 = a varint follows */
#define SREC_NL_BIG   3u

static const unsigned char srec_empty[1] = {0}; /* data of present empty fields */

static bs_val srec_str(const unsigned char *p, size_t n) {
  bs_val v = {n ? p : srec_empty, n};
  return v;
}

static size_t var_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static unsigned char *wr_var(unsigned char *p, uint64_t v) {
  while (v >= 0x80) *p++ = (unsigned char)(v | 0x80), v >>= 7;
  *p++ = (unsigned char)v;
  return p;
}

/* A varint of at most 10 bytes whose value fits 64 bits, else r bad. */
static uint64_t rd_var(rd *r) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    const unsigned char *p = rd_take(r, 1);
    if (!p) return 0;
    if (shift == 63 && *p > 1) break;
    v |= (uint64_t)(*p & 0x7f) << shift;
    if (!(*p & 0x80)) return v;
  }
  r->bad = 1;
  return 0;
}

/* A membership's code: (type code << 1) | 1 when its object id follows (a varint length and the
 * bytes), 0 when it is the replica id; type code 0 = the previous member's type, or for the
 * first the table's name, else the length + 1 and the bytes. */
static uint64_t srec_code(const bs__member *m, uint32_t i, bs_val table, bs_val rid) {
  bs_val same = i ? m[i - 1].object_type : table;
  uint64_t t = bs__val_eq(m[i].object_type, same) ? 0 : m[i].object_type.size + 1;
  return t << 1 | !bs__val_eq(m[i].object_id, rid);
}

static unsigned srec_head(const bs__srec *r) {
  unsigned nm = r->nm < SREC_NM_BIG ? r->nm : SREC_NM_BIG;
  unsigned nl = r->nl < SREC_NL_BIG ? r->nl : SREC_NL_BIG;
  return (r->soft ? SREC_SOFT : 0) | (r->has_data ? SREC_DATA : 0) | (r->mark ? SREC_MARK : 0) |
         nm << SREC_NM_SHIFT | nl << SREC_NL_SHIFT;
}

size_t bs__lmdb_srec_size(const bs__srec *r, bs_val table, bs_val rid) {
  size_t n = 1 + (r->mark ? var_size(r->mark) : 0) + (r->has_data ? r->data.size : 0);
  n += (r->nm >= SREC_NM_BIG ? var_size(r->nm) : 0) + (r->nl >= SREC_NL_BIG ? var_size(r->nl) : 0);
  for (uint32_t i = 0; i < r->nm; i++) {
    const bs__member *m = &r->m[i];
    uint64_t c = srec_code(r->m, i, table, rid);
    n += var_size(m->bucket) + var_size(m->op) + var_size(c) + (c >> 1 ? m->object_type.size : 0);
    if (c & 1) n += var_size(m->object_id.size) + m->object_id.size;
  }
  for (uint32_t i = 0; i < r->nl; i++) n += var_size(r->lk[i].size) + r->lk[i].size;
  return n;
}

void bs__lmdb_srec_encode(unsigned char *p, const bs__srec *r, bs_val table, bs_val rid) {
  *p++ = (unsigned char)srec_head(r);
  if (r->mark) p = wr_var(p, r->mark);
  if (r->nm >= SREC_NM_BIG) p = wr_var(p, r->nm);
  if (r->nl >= SREC_NL_BIG) p = wr_var(p, r->nl);
  for (uint32_t i = 0; i < r->nm; i++) {
    const bs__member *m = &r->m[i];
    uint64_t c = srec_code(r->m, i, table, rid);
    p = wr_var(wr_var(wr_var(p, m->bucket), m->op), c);
    if (c & 1) p = wr_var(p, m->object_id.size);
    if (c >> 1) p = wr_bytes(p, m->object_type);
    if (c & 1) p = wr_bytes(p, m->object_id);
  }
  for (uint32_t i = 0; i < r->nl; i++) p = wr_bytes(wr_var(p, r->lk[i].size), r->lk[i]);
  if (r->has_data) wr_bytes(p, r->data);
}

/* The fixed part: head, mark, counts; q is left after it. */
static int srec_fixed(rd *q, bs__srec *r) {
  const unsigned char *f = rd_take(q, 1);
  unsigned nm, nl;
  memset(r, 0, sizeof *r);
  if (!f) return BS_ECORRUPT;
  nm = *f >> SREC_NM_SHIFT & SREC_NM_BIG;
  nl = *f >> SREC_NL_SHIFT & SREC_NL_BIG;
  r->exists = 1;
  r->soft = (*f & SREC_SOFT) != 0;
  r->has_data = (*f & SREC_DATA) != 0;
  if (*f & SREC_MARK) r->mark = rd_var(q);
  r->nm = nm < SREC_NM_BIG ? nm : (uint32_t)rd_var(q);
  r->nl = nl < SREC_NL_BIG ? nl : (uint32_t)rd_var(q);
  /* a count in a varint is one the head could not hold; every membership takes 3 bytes at
   * least, every key 1 */
  if (q->bad || (nm == SREC_NM_BIG && r->nm < SREC_NM_BIG) ||
      (nl == SREC_NL_BIG && r->nl < SREC_NL_BIG) ||
      (uint64_t)r->nm * 3 + r->nl > (uint64_t)(q->end - q->p) || ((*f & SREC_MARK) && !r->mark))
    return BS_ECORRUPT;
  return BS_OK;
}

int bs__lmdb_srec_head(const MDB_val *v, bs__srec *r) {
  rd q = rd_of(v);
  return srec_fixed(&q, r);
}

/* n bytes (NULL, q bad, when n is over BS_U16 or past the end). */
static const unsigned char *srec_take(rd *q, uint64_t n) {
  if (n > UINT16_MAX) {
    q->bad = 1;
    return NULL;
  }
  return rd_take(q, (size_t)n);
}

/* The part after the fixed one: fills m and lk (when given) and the data, calls fn (when given)
 * per membership, and checks that the value ends where r's head says. */
static int srec_walk(const MDB_val *v, bs_val table, bs_val rid, bs__srec *r, bs__member *m,
                     bs_val *lk, int (*fn)(uint64_t, uint64_t, void *), void *payload) {
  rd q = rd_of(v);
  bs_val type = table;
  int rc;
  if (srec_fixed(&q, r) != BS_OK) return BS_ECORRUPT;
  for (uint32_t i = 0; i < r->nm; i++) {
    uint64_t bucket = rd_var(&q), op = rd_var(&q), c = rd_var(&q);
    uint64_t il = c & 1 ? rd_var(&q) : 0;
    const unsigned char *t = c >> 1 ? srec_take(&q, (c >> 1) - 1) : NULL;
    const unsigned char *o = c & 1 ? srec_take(&q, il) : NULL;
    if (q.bad) return BS_ECORRUPT;
    if (t) type = srec_str(t, (size_t)(c >> 1) - 1);
    if (m) {
      m[i].bucket = bucket;
      m[i].op = op;
      m[i].object_type = srec_str(type.data, type.size);
      m[i].object_id = o ? srec_str(o, (size_t)il) : srec_str(rid.data, rid.size);
    }
    if (fn && (rc = fn(bucket, op, payload)) != BS_OK) return rc;
  }
  for (uint32_t i = 0; i < r->nl; i++) {
    uint64_t n = rd_var(&q);
    const unsigned char *k = srec_take(&q, n);
    if (!k) return BS_ECORRUPT;
    if (lk) lk[i] = srec_str(k, (size_t)n);
  }
  if (!r->has_data) return rd_end(&q);
  r->data = srec_str(q.p, (size_t)(q.end - q.p));
  return BS_OK;
}

int bs__lmdb_srec_decode(const MDB_val *v, bs_val table, bs_val rid, bs__srec *r, bs__member *m,
                         bs_val *lk) {
  int rc = srec_walk(v, table, rid, r, m, lk, NULL, NULL);
  r->m = r->nm ? m : NULL;
  r->lk = r->nl ? lk : NULL;
  return rc;
}

int bs__lmdb_srec_members(const MDB_val *v, int (*fn)(uint64_t bucket, uint64_t op, void *),
                          void *payload) {
  bs__srec r;
  bs_val none = {srec_empty, 0}; /* the types and ids are not read */
  return srec_walk(v, none, none, &r, NULL, NULL, fn, payload);
}

/* Format 2's record (docs/format.md 4.4 before format 3): u8 flags (1 soft, 2 data, 4 mark) |
 * varint n members | varint n keys | varint mark (flag 4) | n x (varint bucket | varint op |
 * varint type code | varint id code | type | id) | n x (varint length | key) | data (the rest,
 * flag 2). Type code 0: the previous member's type (never the first's); id code 0: the replica
 * id; else the length + 1. Rewritten field by field, in order, as format 3, so no member array
 * is needed whatever the record holds. */
size_t bs__lmdb_srec2_bound(const MDB_val *v) {
  return 2 * v->mv_size + 32; /* a member's code may take a byte more, never the rest */
}

int bs__lmdb_srec2_convert(const MDB_val *k, const MDB_val *v, bs_val table, unsigned char *out,
                           size_t *n) {
  rd q = rd_of(v);
  bs_val prev = table; /* an id code 0 (the replica id) stays one: the key holds it */
  unsigned flags = (unsigned)rd_uint(&q, 1);
  uint64_t nm = rd_var(&q), nl = rd_var(&q), mark = flags & SREC_MARK ? rd_var(&q) : 0;
  bs__srec head = {1,
                   (flags & SREC_SOFT) != 0,
                   mark,
                   NULL,
                   (uint32_t)nm,
                   NULL,
                   (uint32_t)nl,
                   (flags & SREC_DATA) != 0,
                   {NULL, 0}};
  unsigned char *p = out + 1;
  if (k->mv_size < 8 || q.bad || (flags & ~SREC_FLAGS) || nm > UINT32_MAX || nl > UINT32_MAX ||
      ((flags & SREC_MARK) && !mark))
    return BS_ECORRUPT;
  out[0] = (unsigned char)srec_head(&head);
  if (mark) p = wr_var(p, mark);
  if (nm >= SREC_NM_BIG) p = wr_var(p, nm);
  if (nl >= SREC_NL_BIG) p = wr_var(p, nl);
  for (uint64_t i = 0; i < nm && !q.bad; i++) {
    uint64_t bucket = rd_var(&q), op = rd_var(&q), t = rd_var(&q), o = rd_var(&q);
    const unsigned char *ts = t ? srec_take(&q, t - 1) : NULL;
    const unsigned char *os = o ? srec_take(&q, o - 1) : NULL;
    bs_val type = ts ? (bs_val){ts, (size_t)t - 1} : prev;
    uint64_t c;
    if (q.bad || (!i && !t)) return BS_ECORRUPT;
    c = (bs__val_eq(type, prev) ? 0 : t) << 1 | (o != 0);
    p = wr_var(wr_var(wr_var(p, bucket), op), c);
    if (o) p = wr_var(p, o - 1);
    if (c >> 1) p = wr_bytes(p, type);
    if (o) p = wr_bytes(p, (bs_val){os, (size_t)o - 1});
    prev = type;
  }
  for (uint64_t i = 0; i < nl && !q.bad; i++) {
    uint64_t len = rd_var(&q);
    const unsigned char *key = srec_take(&q, len);
    if (key) p = wr_bytes(wr_var(p, len), (bs_val){key, (size_t)len});
  }
  if (q.bad || (!(flags & SREC_DATA) && q.p != q.end)) return BS_ECORRUPT;
  if (flags & SREC_DATA) p = wr_bytes(p, srec_str(q.p, (size_t)(q.end - q.p)));
  *n = (size_t)(p - out);
  return BS_OK;
}

/* Format 1's record (docs/format.md 4.4 before format 2): u8 flags (1 soft, 2 data) | u32 n
 * members | u32 n keys | u64 mark | n x (u64 bucket | u64 op | u16 type length | u16 id length |
 * type | id) | n x (u16 length | key) | data (the rest, flag 2). Rewritten field by field, in
 * order, as format 2, so no member array is needed whatever the record holds. */
size_t bs__lmdb_srec1_bound(const MDB_val *v) {
  return 2 * v->mv_size + 32; /* a 20-byte member becomes at most 22 bytes, a key 1 more */
}

int bs__lmdb_srec1_convert(const MDB_val *k, const MDB_val *v, unsigned char *out, size_t *n) {
  rd q = rd_of(v);
  bs_val rid = {(const unsigned char *)k->mv_data + 8, k->mv_size - 8}, prev = {NULL, 0};
  unsigned char *p = out + 1;
  unsigned flags = (unsigned)rd_uint(&q, 1);
  uint32_t nm = (uint32_t)rd_uint(&q, 4), nl = (uint32_t)rd_uint(&q, 4);
  uint64_t mark = rd_uint(&q, 8);
  if (k->mv_size < 8 || q.bad || (flags & ~3u)) return BS_ECORRUPT;
  out[0] = (unsigned char)(flags | (mark ? SREC_MARK : 0));
  p = wr_var(wr_var(p, nm), nl);
  if (mark) p = wr_var(p, mark);
  for (uint32_t i = 0; i < nm && !q.bad; i++) {
    uint64_t bucket = rd_uint(&q, 8), op = rd_uint(&q, 8);
    size_t tl = (size_t)rd_uint(&q, 2), il = (size_t)rd_uint(&q, 2);
    const unsigned char *s = rd_take(&q, tl + il);
    bs_val type = {s, tl}, id = {s ? s + tl : NULL, il};
    uint64_t t, o;
    if (!s) break;
    t = i && bs__val_eq(type, prev) ? 0 : tl + 1;
    o = bs__val_eq(id, rid) ? 0 : il + 1;
    p = wr_var(wr_var(wr_var(wr_var(p, bucket), op), t), o);
    if (t) p = wr_bytes(p, type);
    if (o) p = wr_bytes(p, id);
    prev = type;
  }
  for (uint32_t i = 0; i < nl && !q.bad; i++) {
    bs_val key = rd_str(&q, 2, UINT16_MAX);
    p = wr_bytes(wr_var(p, key.size), key);
  }
  if (q.bad || (!(flags & SREC_DATA) && q.p != q.end)) return BS_ECORRUPT;
  if (flags & SREC_DATA) p = wr_bytes(p, srec_str(q.p, (size_t)(q.end - q.p)));
  *n = (size_t)(p - out);
  return BS_OK;
}

/* ---- cqueue and softdel ---- */

int bs__lmdb_cqueue_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, uint64_t *bucket) {
  if (k->mv_size != BS_CQUEUE_KEY_SIZE || v->mv_size != 0) return BS_ECORRUPT;
  *stream = bs__get_u32be(k->mv_data);
  *bucket = bs__get_u64be((const unsigned char *)k->mv_data + 4);
  return BS_OK;
}

size_t bs__lmdb_softdel_key(unsigned char out[BS_SOFTDEL_KEY_MAX], uint64_t mark, bs_val src) {
  memcpy(out, src.data, 4);
  bs__put_u64be(out + 4, mark);
  memcpy(out + 12, (const unsigned char *)src.data + 4, src.size - 4);
  return src.size + 8;
}

int bs__lmdb_softdel_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, uint64_t *mark,
                            unsigned char src_buf[BS_SOFTDEL_KEY_MAX - 8], MDB_val *src) {
  const unsigned char *p = (const unsigned char *)k->mv_data;
  if (k->mv_size < 16 || k->mv_size > BS_SOFTDEL_KEY_MAX || v->mv_size != 0 ||
      bs__get_u32be(p + 12) == 0)
    return BS_ECORRUPT;
  *stream = bs__get_u32be(p);
  *mark = bs__get_u64be(p + 4);
  memcpy(src_buf, p, 4);
  memcpy(src_buf + 4, p + 12, k->mv_size - 12);
  src->mv_size = k->mv_size - 8;
  src->mv_data = src_buf;
  return BS_OK;
}

/* ---- meta "format" ---- */

#define FORMAT_TAG "bktstore"

void bs__lmdb_format_value(unsigned char v[BS_FORMAT_VALUE_SIZE], uint32_t version) {
  memcpy(v, FORMAT_TAG, 8);
  bs__put_u32le(v + 8, version);
}

int bs__lmdb_format_decode(const MDB_val *v, uint32_t *version) {
  if (v->mv_size != BS_FORMAT_VALUE_SIZE || memcmp(v->mv_data, FORMAT_TAG, 8) != 0)
    return BS_ECORRUPT;
  *version = bs__get_u32le((const unsigned char *)v->mv_data + 8);
  return BS_OK;
}

MDB_val bs__lmdb_format_step_value(unsigned char *buf, uint32_t from, MDB_val key) {
  MDB_val v = {BS_FORMAT_STEP_FIXED + key.mv_size, buf};
  bs__put_u32le(buf, from);
  buf[4] = key.mv_size != 0;
  if (key.mv_size) memcpy(buf + BS_FORMAT_STEP_FIXED, key.mv_data, key.mv_size);
  return v;
}

int bs__lmdb_format_step_decode(const MDB_val *v, uint32_t *from, MDB_val *key) {
  const unsigned char *p = (const unsigned char *)v->mv_data;
  if (v->mv_size < BS_FORMAT_STEP_FIXED || p[4] > 1 ||
      (p[4] == 1) != (v->mv_size > BS_FORMAT_STEP_FIXED))
    return BS_ECORRUPT;
  *from = bs__get_u32le(p);
  key->mv_size = v->mv_size - BS_FORMAT_STEP_FIXED;
  key->mv_data = (void *)(p + BS_FORMAT_STEP_FIXED);
  return BS_OK;
}

/* ---- wcp ---- */

MDB_val bs__lmdb_wcp_user_key(unsigned char buf[BS_WCP_USER_KEY_MAX], int tag, bs_val user) {
  MDB_val k;
  buf[0] = (unsigned char)tag;
  if (user.size) memcpy(buf + 1, user.data, user.size);
  k.mv_size = 1 + user.size;
  k.mv_data = buf;
  return k;
}

int bs__lmdb_wcp_custom_key(unsigned char buf[BS_WCP_KEY_MAX], MDB_val *k, uint32_t stream,
                            bs_val event, bs_val user, bs_error *err) {
  size_t size = 1 + 4 + 2 + event.size + user.size;
  if (size > BS_WCP_KEY_MAX)
    return bs__fail(err, BS_ETOOBIG, "user_id + event: %zu bytes (limit %u together)",
                    user.size + event.size, BS_WCP_KEY_MAX - 7);
  buf[0] = BS_WCP_CUSTOM_TAG;
  bs__put_u32be(buf + 1, stream);
  buf[5] = (unsigned char)(event.size >> 8);
  buf[6] = (unsigned char)event.size;
  if (event.size) memcpy(buf + 7, event.data, event.size);
  if (user.size) memcpy(buf + 7 + event.size, user.data, user.size);
  k->mv_size = size;
  k->mv_data = buf;
  return BS_OK;
}

int bs__lmdb_wcp_key_decode(const MDB_val *k, bs__wcp_key *out) {
  const unsigned char *p = (const unsigned char *)k->mv_data;
  size_t n = k->mv_size, head = 1;
  memset(out, 0, sizeof *out);
  if (n < 1 || n > BS_WCP_KEY_MAX) return BS_ECORRUPT;
  out->tag = p[0];
  if (p[0] == BS_WCP_CUSTOM_TAG) {
    if (n < 7 || n - 7 < ((size_t)p[5] << 8 | p[6])) return BS_ECORRUPT;
    out->stream = bs__get_u32be(p + 1);
    out->event.data = p + 7;
    out->event.size = (size_t)p[5] << 8 | p[6];
    head = 7 + out->event.size;
  } else if (p[0] != BS_WCP_MANAGED_TAG && p[0] != BS_WCP_PENDING_TAG && p[0] != BS_WCP_HWM_TAG) {
    return BS_ECORRUPT;
  }
  if (n - head > BS_MAX_USER_ID) return BS_ECORRUPT;
  out->user.data = p + head;
  out->user.size = n - head;
  return BS_OK;
}

static size_t wcp_heads_size(const bs_head *heads, size_t n) {
  size_t size = 0;
  for (size_t i = 0; i < n; i++) size += 3 + heads[i].connection.size + heads[i].lsn.size;
  return size;
}

size_t bs__lmdb_wcp_rec_size(const bs__wcp_rec *r, const bs_head *new_heads, size_t n_new) {
  return 20 + r->processed_lsn.size +
         (new_heads ? wcp_heads_size(new_heads, n_new) : r->heads_size);
}

void bs__lmdb_wcp_rec_encode(unsigned char *p, const bs__wcp_rec *r, const bs_head *new_heads,
                             size_t n_new) {
  p = wr_uint(p, r->id, 8);
  p = wr_uint(p, r->flags, 1);
  p = wr_uint(p, (uint64_t)r->requested_at, 8);
  p = wr_str(p, 1, r->processed_lsn);
  p = wr_uint(p, new_heads ? n_new : r->n_heads, 2);
  if (!new_heads) wr_bytes(p, (bs_val){r->heads, r->heads_size});
  for (size_t i = 0; new_heads && i < n_new; i++)
    p = wr_str(wr_str(p, 2, new_heads[i].connection), 1, new_heads[i].lsn);
}

int bs__lmdb_wcp_rec_decode(const MDB_val *v, bs__wcp_rec *r) {
  rd q = rd_of(v);
  r->id = rd_uint(&q, 8);
  r->flags = (unsigned)rd_uint(&q, 1);
  r->requested_at = (int64_t)rd_uint(&q, 8);
  r->processed_lsn = rd_str(&q, 1, 255);
  r->n_heads = (uint32_t)rd_uint(&q, 2);
  r->heads = q.p;
  for (uint32_t i = 0; i < r->n_heads && !q.bad; i++) {
    rd_str(&q, 2, BS_MAX_CONNECTION_NAME);
    rd_str(&q, 1, 255);
  }
  r->heads_size = (size_t)(q.p - r->heads);
  if (r->flags & ~(BS_WCP_HAS_REQUESTED | BS_WCP_PROCESSED)) return BS_ECORRUPT;
  return rd_end(&q);
}

void bs__lmdb_wcp_head_next(const unsigned char **p, bs_val *conn, bs_val *lsn) {
  const unsigned char *q = *p;
  conn->size = bs__get_u16le(q);
  conn->data = q + 2;
  lsn->size = q[2 + conn->size];
  lsn->data = q + 3 + conn->size;
  *p = q + 3 + conn->size + lsn->size;
}

size_t bs__lmdb_wcp_hwm_value(unsigned char out[8], uint64_t id) {
  bs__put_u64le(out, id);
  return 8;
}

int bs__lmdb_wcp_hwm_decode(const MDB_val *v, uint64_t *id) {
  if (v->mv_size != 8) return BS_ECORRUPT;
  *id = bs__get_u64le(v->mv_data);
  return BS_OK;
}

size_t bs__lmdb_wcp_custom_value(unsigned char out[16], uint64_t value, int64_t requested_at) {
  bs__put_u64le(out, value);
  if (requested_at < 0) return 8;
  bs__put_u64le(out + 8, (uint64_t)requested_at);
  return 16;
}

int bs__lmdb_wcp_custom_decode(const MDB_val *v, uint64_t *value, int64_t *requested_at) {
  if (v->mv_size != 8 && v->mv_size != 16) return BS_ECORRUPT;
  *value = bs__get_u64le(v->mv_data);
  *requested_at =
      v->mv_size == 16 ? (int64_t)bs__get_u64le((const unsigned char *)v->mv_data + 8) : -1;
  return v->mv_size == 16 && *requested_at < 0 ? BS_ECORRUPT : BS_OK; /* only 8 bytes mean none */
}

int bs__lmdb_op_decode(const MDB_val *key, const MDB_val *val, bs_op *op) {
  if (key->mv_size != BS_OP_KEY_SIZE) return BS_ECORRUPT;
  return bs__op_value_decode(val->mv_data, val->mv_size,
                             bs__get_u64be((const unsigned char *)key->mv_data + 8), op);
}
