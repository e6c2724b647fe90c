/*
 * lmdb_codec.c: the encoders of the LMDB layout (lmdb_internal.h, "The codec"). Each key and
 * value of the layout table is written here and read by the decoder beside its declaration, so
 * the writer, the readers, compaction, verify and the tests cannot disagree on a byte. The
 * decoders that sit in hot read loops are inline in lmdb_internal.h.
 */
#include "lmdb_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

void bs__lmdb_op_encode(unsigned char *out, const bs_op *op) {
  int row = bs__op_carries_row(op->type);
  size_t ot = row ? op->object_type.size : 0, oi = row ? op->object_id.size : 0;
  size_t sk = row ? op->subkey.size : 0;
  out[0] = (unsigned char)op->type;
  bs__put_u32le(out + 1, op->checksum);
  bs__put_u64le(out + 5, op->target_op);
  bs__put_u16le(out + 13, (uint32_t)ot);
  bs__put_u16le(out + 15, (uint32_t)oi);
  out[17] = (unsigned char)sk;
  out += BS_OP_HEADER_SIZE;
  if (ot) memcpy(out, op->object_type.data, ot);
  out += ot;
  if (oi) memcpy(out, op->object_id.data, oi);
  out += oi;
  if (sk) memcpy(out, op->subkey.data, sk);
  out += sk;
  if (op->type == BS_OP_PUT && op->data.size) memcpy(out, op->data.data, op->data.size);
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

void bs__lmdb_param_value(unsigned char *out, bs_val replica_id, const bs_val *rows, size_t n) {
  bs__put_u16le(out, (uint32_t)replica_id.size);
  out += 2;
  if (replica_id.size) memcpy(out, replica_id.data, replica_id.size);
  out += replica_id.size;
  bs__put_u32le(out, (uint32_t)n);
  out += 4;
  for (size_t i = 0; i < n; i++) {
    bs__put_u32le(out, (uint32_t)rows[i].size);
    if (rows[i].size) memcpy(out + 4, rows[i].data, rows[i].size);
    out += 4 + rows[i].size;
  }
}

int bs__lmdb_param_value_decode(const MDB_val *v, bs_val *replica_id, uint32_t *n_rows,
                                const unsigned char **rows_out) {
  const unsigned char *p = (const unsigned char *)v->mv_data, *end = p + v->mv_size, *rows;
  size_t rid;
  uint32_t n;
  if (v->mv_size < 6) return BS_ECORRUPT;
  rid = bs__get_u16le(p);
  if (rid > BS_MAX_REPLICA_ID || (size_t)(end - p) < 6 + rid) return BS_ECORRUPT;
  replica_id->data = p + 2; /* non-NULL, also when empty */
  replica_id->size = rid;
  n = bs__get_u32le(p + 2 + rid);
  rows = p + 6 + rid;
  /* every row length must fit, and the rows must end exactly at the value's end */
  p = rows;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t len;
    if ((size_t)(end - p) < 4) return BS_ECORRUPT;
    len = bs__get_u32le(p);
    if ((size_t)(end - p) - 4 < len) return BS_ECORRUPT;
    p += 4 + len;
  }
  if (p != end) return BS_ECORRUPT;
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
                           (r->has_no_checkpoint_before ? 4 : 0));
  bs__put_u32le(out + 8, r->id);
  bs__put_u32le(out + 12, r->next_table_id);
  for (int i = 0; i < 8; i++) bs__put_u64le(out + 16 + 8 * i, *u64s[i]);
  bs__put_u64le(out + 80, (uint64_t)r->created_ms);
  for (int i = 0; i < 5; i++) {
    size_t n = strs[i]->size;
    if (n > BS_STREAM_STR_MAX) return 0;
    bs__put_u16le(p, (uint32_t)n);
    if (n) memcpy(p + 2, strs[i]->data, n);
    p += 2 + n;
  }
  return (size_t)(p - out);
}

int bs__stream_rec_decode(const MDB_val *v, bs__stream_rec *r) {
  const unsigned char *p = (const unsigned char *)v->mv_data, *end = p + v->mv_size, *q;
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
  r->id = bs__get_u32le(p + 8);
  r->next_table_id = bs__get_u32le(p + 12);
  for (int i = 0; i < 8; i++) *u64s[i] = bs__get_u64le(p + 16 + 8 * i);
  r->created_ms = (int64_t)bs__get_u64le(p + 80);
  q = p + BS_STREAM_REC_FIXED;
  for (int i = 0; i < 5; i++) {
    size_t n;
    if (end - q < 2 || (n = bs__get_u16le(q)) > BS_STREAM_STR_MAX || (size_t)(end - q) - 2 < n)
      return BS_ECORRUPT;
    strs[i]->data = q + 2; /* non-NULL, also when empty */
    strs[i]->size = n;
    q += 2 + n;
  }
  return q == end ? BS_OK : BS_ECORRUPT;
}

/* ---- changes ---- */

unsigned char *bs__lmdb_change_head(unsigned char *out, uint64_t first, int64_t time_ms,
                                    unsigned flags) {
  bs__put_u64le(out, first);
  bs__put_u64le(out + 8, (uint64_t)time_ms);
  out[16] = (unsigned char)flags;
  return out + BS_CHANGE_FIXED;
}

unsigned char *bs__lmdb_change_count(unsigned char *p, uint32_t n) {
  bs__put_u32le(p, n);
  return p + 4;
}

unsigned char *bs__lmdb_change_item(unsigned char *p, bs_val item) {
  bs__put_u16le(p, (uint32_t)item.size);
  if (item.size) memcpy(p + 2, item.data, item.size);
  return p + 2 + item.size;
}

/* Checks one list at *p (items of at most max bytes, at most max_n of them) and moves past it. */
static int change_list(const unsigned char **p, const unsigned char *end, size_t max,
                       uint32_t max_n, bs__change_list *out) {
  const unsigned char *q = *p;
  if (end - q < 4) return BS_ECORRUPT;
  out->n = bs__get_u32le(q);
  out->p = q += 4;
  if (out->n > max_n) return BS_ECORRUPT;
  for (uint32_t i = 0; i < out->n; i++) {
    size_t len;
    if (end - q < 2 || (len = bs__get_u16le(q)) > max || (size_t)(end - q) - 2 < len)
      return BS_ECORRUPT;
    q += 2 + len;
  }
  *p = q;
  return BS_OK;
}

int bs__lmdb_change_decode(const MDB_val *k, const MDB_val *v, bs__change_rec *out) {
  const unsigned char *kp = (const unsigned char *)k->mv_data;
  const unsigned char *p = (const unsigned char *)v->mv_data, *end = p + v->mv_size;
  const unsigned known =
      BS_CHANGE_CHECKPOINT | BS_CHANGE_TOO_MANY_BUCKETS | BS_CHANGE_TOO_MANY_LOOKUPS;
  if (k->mv_size != BS_CHANGE_KEY_SIZE || v->mv_size < BS_CHANGE_FIXED || (p[16] & ~known))
    return BS_ECORRUPT;
  out->stream = bs__get_u32be(kp);
  out->last = bs__get_u64be(kp + 4);
  out->seq = bs__get_u64be(kp + 12);
  out->first = bs__get_u64le(p);
  out->time_ms = (int64_t)bs__get_u64le(p + 8);
  out->flags = p[16];
  p += BS_CHANGE_FIXED;
  if (change_list(&p, end, BS_MAX_BUCKET_NAME, BS_CHANGES_MAX, &out->buckets) ||
      change_list(&p, end, BS_MAX_LOOKUP_KEY, BS_CHANGES_MAX, &out->lookups) ||
      change_list(&p, end, BS_MAX_USER_ID, UINT32_MAX, &out->users))
    return BS_ECORRUPT;
  return p == end ? BS_OK : BS_ECORRUPT;
}

/* ---- source ---- */

static const unsigned char srec_empty[1] = {0}; /* data of present empty fields */

static bs_val srec_str(const unsigned char *p, size_t n) {
  bs_val v = {n ? p : srec_empty, n};
  return v;
}

size_t bs__lmdb_srec_size(const bs__srec *r) {
  size_t n = BS_SREC_FIXED + (r->has_data ? r->data.size : 0);
  for (uint32_t i = 0; i < r->nm; i++)
    n += BS_SREC_MEMBER + r->m[i].object_type.size + r->m[i].object_id.size;
  for (uint32_t i = 0; i < r->nl; i++) n += 2 + r->lk[i].size;
  return n;
}

void bs__lmdb_srec_encode(unsigned char *p, const bs__srec *r) {
  p[0] = (unsigned char)((r->soft ? 1 : 0) | (r->has_data ? 2 : 0));
  bs__put_u32le(p + 1, r->nm);
  bs__put_u32le(p + 5, r->nl);
  bs__put_u64le(p + 9, r->mark);
  p += BS_SREC_FIXED;
  for (uint32_t i = 0; i < r->nm; i++) {
    const bs__member *m = &r->m[i];
    bs__put_u64le(p, m->bucket);
    bs__put_u64le(p + 8, m->op);
    bs__put_u16le(p + 16, (uint32_t)m->object_type.size);
    bs__put_u16le(p + 18, (uint32_t)m->object_id.size);
    p += BS_SREC_MEMBER;
    if (m->object_type.size) memcpy(p, m->object_type.data, m->object_type.size);
    p += m->object_type.size;
    if (m->object_id.size) memcpy(p, m->object_id.data, m->object_id.size);
    p += m->object_id.size;
  }
  for (uint32_t i = 0; i < r->nl; i++) {
    bs__put_u16le(p, (uint32_t)r->lk[i].size);
    if (r->lk[i].size) memcpy(p + 2, r->lk[i].data, r->lk[i].size);
    p += 2 + r->lk[i].size;
  }
  if (r->has_data && r->data.size) memcpy(p, r->data.data, r->data.size);
}

int bs__lmdb_srec_head(const MDB_val *v, bs__srec *r) {
  const unsigned char *p = (const unsigned char *)v->mv_data;
  memset(r, 0, sizeof *r);
  if (v->mv_size < BS_SREC_FIXED || (p[0] & ~3u)) return BS_ECORRUPT;
  r->exists = 1;
  r->soft = p[0] & 1;
  r->has_data = (p[0] >> 1) & 1;
  r->nm = bs__get_u32le(p + 1);
  r->nl = bs__get_u32le(p + 5);
  r->mark = bs__get_u64le(p + 9);
  /* every membership and key takes its fixed part at least */
  if ((uint64_t)r->nm * BS_SREC_MEMBER + (uint64_t)r->nl * 2 > v->mv_size - BS_SREC_FIXED)
    return BS_ECORRUPT;
  return BS_OK;
}

/* The part after the fixed one: fills m and lk (when given) and the data, calls fn (when given)
 * per membership, and checks that the value ends where r's flags say. */
static int srec_walk(const MDB_val *v, bs__srec *r, bs__member *m, bs_val *lk,
                     int (*fn)(uint64_t, uint64_t, void *), void *payload) {
  const unsigned char *p = (const unsigned char *)v->mv_data, *end = p + v->mv_size;
  int rc;
  p += BS_SREC_FIXED;
  for (uint32_t i = 0; i < r->nm; i++) {
    size_t ot, oi;
    if ((size_t)(end - p) < BS_SREC_MEMBER) return BS_ECORRUPT;
    ot = bs__get_u16le(p + 16);
    oi = bs__get_u16le(p + 18);
    if ((size_t)(end - p) - BS_SREC_MEMBER < ot + oi) return BS_ECORRUPT;
    if (m) {
      m[i].bucket = bs__get_u64le(p);
      m[i].op = bs__get_u64le(p + 8);
      m[i].object_type = srec_str(p + BS_SREC_MEMBER, ot);
      m[i].object_id = srec_str(p + BS_SREC_MEMBER + ot, oi);
    }
    if (fn && (rc = fn(bs__get_u64le(p), bs__get_u64le(p + 8), payload)) != BS_OK) return rc;
    p += BS_SREC_MEMBER + ot + oi;
  }
  for (uint32_t i = 0; i < r->nl; i++) {
    size_t n;
    if ((size_t)(end - p) < 2) return BS_ECORRUPT;
    n = bs__get_u16le(p);
    if ((size_t)(end - p) - 2 < n) return BS_ECORRUPT;
    if (lk) lk[i] = srec_str(p + 2, n);
    p += 2 + n;
  }
  if (!r->has_data) return p == end ? BS_OK : BS_ECORRUPT;
  r->data = srec_str(p, (size_t)(end - p));
  return BS_OK;
}

int bs__lmdb_srec_decode(const MDB_val *v, bs__srec *r, bs__member *m, bs_val *lk) {
  int rc = srec_walk(v, r, m, lk, NULL, NULL);
  r->m = r->nm ? m : NULL;
  r->lk = r->nl ? lk : NULL;
  return rc;
}

int bs__lmdb_srec_members(const MDB_val *v, int (*fn)(uint64_t bucket, uint64_t op, void *),
                          void *payload) {
  bs__srec r;
  int rc = bs__lmdb_srec_head(v, &r);
  return rc ? rc : srec_walk(v, &r, NULL, NULL, fn, payload);
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

void bs__lmdb_format_value(unsigned char v[BS_FORMAT_VALUE_SIZE]) {
  memcpy(v, FORMAT_TAG, 8);
  bs__put_u32le(v + 8, BS_FORMAT_VERSION);
}

int bs__lmdb_format_decode(const MDB_val *v, uint32_t *version) {
  if (v->mv_size != BS_FORMAT_VALUE_SIZE || memcmp(v->mv_data, FORMAT_TAG, 8) != 0)
    return BS_ECORRUPT;
  *version = bs__get_u32le((const unsigned char *)v->mv_data + 8);
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

void bs__lmdb_wcp_rec_encode(unsigned char *out, const bs__wcp_rec *r, const bs_head *new_heads,
                             size_t n_new) {
  unsigned char *p = out + 20 + r->processed_lsn.size;
  bs__put_u64le(out, r->id);
  out[8] = (unsigned char)r->flags;
  bs__put_u64le(out + 9, (uint64_t)r->requested_at);
  out[17] = (unsigned char)r->processed_lsn.size;
  if (r->processed_lsn.size) memcpy(out + 18, r->processed_lsn.data, r->processed_lsn.size);
  bs__put_u16le(out + 18 + r->processed_lsn.size, (uint32_t)(new_heads ? n_new : r->n_heads));
  if (!new_heads) {
    if (r->heads_size) memcpy(p, r->heads, r->heads_size);
    return;
  }
  for (size_t i = 0; i < n_new; i++) {
    bs_val c = new_heads[i].connection, l = new_heads[i].lsn;
    bs__put_u16le(p, (uint32_t)c.size);
    if (c.size) memcpy(p + 2, c.data, c.size);
    p += 2 + c.size;
    *p++ = (unsigned char)l.size;
    if (l.size) memcpy(p, l.data, l.size);
    p += l.size;
  }
}

int bs__lmdb_wcp_rec_decode(const MDB_val *v, bs__wcp_rec *r) {
  const unsigned char *p = (const unsigned char *)v->mv_data, *q;
  size_t size = v->mv_size, l, rest;
  if (size < 20 || (p[8] & ~(BS_WCP_HAS_REQUESTED | BS_WCP_PROCESSED))) return BS_ECORRUPT;
  r->id = bs__get_u64le(p);
  r->flags = p[8];
  r->requested_at = (int64_t)bs__get_u64le(p + 9);
  l = p[17];
  if (size < 20 + l) return BS_ECORRUPT;
  r->processed_lsn.data = p + 18; /* non-NULL, also when empty */
  r->processed_lsn.size = l;
  r->n_heads = (uint32_t)bs__get_u16le(p + 18 + l);
  r->heads = q = p + 20 + l;
  r->heads_size = rest = size - 20 - l;
  for (uint32_t i = 0; i < r->n_heads; i++) {
    size_t c;
    if (rest < 3 || (c = bs__get_u16le(q)) > BS_MAX_CONNECTION_NAME || rest < 3 + c ||
        rest - 3 - c < q[2 + c])
      return BS_ECORRUPT;
    rest -= 3 + c + q[2 + c];
    q += 3 + c + q[2 + c];
  }
  return rest == 0 ? BS_OK : BS_ECORRUPT;
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
