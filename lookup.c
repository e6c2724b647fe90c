/*
 * lookup.c: the canonical encoding of parameter-lookup keys (contract.md 5.4). A key is a list of
 * JSON scalars; lookups compare keys as bytes, so the encoding must be canonical (equal lists
 * give equal bytes: 314, 314.0 and 3.14e2 are one value, so are -0.0 and 0) and injective
 * (different lists never share bytes).
 *
 * Layout: the concatenation of one element per scalar, each starting with a type tag:
 *   0x00 null | 0x01 false | 0x02 true
 *   0x03 int:    8 bytes, big-endian, sign bit flipped (so bytes order as numbers)
 *   0x04 double: 8 bytes, big-endian IEEE-754 bits; only for values that are not an integer in
 *                int64 range (those are always written as 0x03), never NaN or infinite
 *   0x05 string: length as minimal LEB128, then the bytes (UTF-8 as given; not validated)
 * Each element is self-delimiting (prefix-free), so the list is uniquely decodable, and the
 * decoder rejects every non-canonical form (a double tag holding an integer, a padded length),
 * so decode(bytes) re-encodes to exactly bytes.
 */
#include "internal.h"

#include <math.h>

enum { TAG_NULL = 0, TAG_FALSE = 1, TAG_TRUE = 2, TAG_INT = 3, TAG_DOUBLE = 4, TAG_STRING = 5 };

#define INT64_SIGN 0x8000000000000000ull

/* Writes the bytes of one element at buf + off when they fit in cap; always advances *off. */
static void emit(unsigned char *buf, size_t cap, size_t *off, const void *p, size_t n) {
  if (*off <= cap && n <= cap - *off && n) memcpy(buf + *off, p, n);
  *off += n;
}

static void emit_u64(unsigned char *buf, size_t cap, size_t *off, unsigned char tag, uint64_t v) {
  unsigned char b[9];
  b[0] = tag;
  bs__put_u64be(b + 1, v);
  emit(buf, cap, off, b, 9);
}

static int double_as_int(double d, int64_t *out) {
  /* [-2^63, 2^63): the range where the cast below is defined */
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return 0;
  *out = (int64_t)d;
  return (double)*out == d; /* integral; -0.0 compares equal to 0 and becomes 0 */
}

static uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static int encode_one(unsigned char *buf, size_t cap, size_t *off, const bs_scalar *v, size_t i,
                      bs_error *err) {
  unsigned char b[11];
  size_t len, k = 0;
  int64_t iv;
  switch (v->type) {
  case BS_SCALAR_NULL:
  case BS_SCALAR_FALSE:
  case BS_SCALAR_TRUE: /* the tag alone */
    b[0] = v->type == BS_SCALAR_NULL ? TAG_NULL : v->type == BS_SCALAR_FALSE ? TAG_FALSE : TAG_TRUE;
    emit(buf, cap, off, b, 1);
    return BS_OK;
  case BS_SCALAR_INT:
    emit_u64(buf, cap, off, TAG_INT, (uint64_t)v->i ^ INT64_SIGN);
    return BS_OK;
  case BS_SCALAR_DOUBLE:
    if (!isfinite(v->d)) return bs__fail(err, BS_EINVAL, "values[%zu]: NaN or infinite number", i);
    if (double_as_int(v->d, &iv))
      emit_u64(buf, cap, off, TAG_INT, (uint64_t)iv ^ INT64_SIGN);
    else
      emit_u64(buf, cap, off, TAG_DOUBLE, double_bits(v->d));
    return BS_OK;
  case BS_SCALAR_STRING:
    if (v->s.size && !v->s.data)
      return bs__fail(err, BS_EINVAL, "values[%zu].s: NULL data with size %zu", i, v->s.size);
    b[k++] = TAG_STRING;
    for (len = v->s.size; len >= 0x80; len >>= 7) b[k++] = (unsigned char)(0x80 | (len & 0x7f));
    b[k++] = (unsigned char)len;
    emit(buf, cap, off, b, k);
    emit(buf, cap, off, v->s.data, v->s.size);
    return BS_OK;
  }
  return bs__fail(err, BS_EINVAL, "values[%zu].type: unknown scalar type %d", i, (int)v->type);
}

int bs_lookup_encode(void *buf, size_t cap, size_t *size_out, const bs_scalar *values, size_t n,
                     bs_error *err) {
  size_t off = 0;
  int rc;
  if (!size_out) return bs__fail(err, BS_EINVAL, "size_out: NULL");
  *size_out = 0;
  if (cap && !buf) return bs__fail(err, BS_EINVAL, "buf: NULL with cap %zu", cap);
  if (n && !values) return bs__fail(err, BS_EINVAL, "values: NULL with n %zu", n);
  for (size_t i = 0; i < n; i++)
    if ((rc = encode_one(buf, cap, &off, &values[i], i, err)) != BS_OK) return rc;
  *size_out = off;
  if (off > BS_MAX_LOOKUP_KEY)
    return bs__fail(err, BS_ETOOBIG, "lookup key is %zu bytes encoded, over BS_MAX_LOOKUP_KEY (%u)",
                    off, BS_MAX_LOOKUP_KEY);
  if (off > cap)
    return bs__fail(err, BS_ETOOBIG, "buf: lookup key needs %zu bytes, cap is %zu", off, cap);
  return BS_OK;
}

/* Reads a minimal LEB128 length. 0 on malformed input. */
static int read_len(const unsigned char *p, size_t avail, size_t *used, size_t *len) {
  size_t v = 0;
  unsigned shift = 0;
  for (size_t k = 0; k < avail && k < 10; k++) {
    if (shift >= sizeof(size_t) * 8 || ((size_t)(p[k] & 0x7f) << shift) >> shift != (p[k] & 0x7fu))
      return 0;
    v |= (size_t)(p[k] & 0x7f) << shift;
    if (!(p[k] & 0x80)) {
      if (k > 0 && p[k] == 0) return 0; /* padded: not canonical */
      *used = k + 1;
      *len = v;
      return 1;
    }
    shift += 7;
  }
  return 0;
}

static int decode_one(const unsigned char *p, size_t avail, size_t *used, bs_scalar *v) {
  uint64_t u;
  double d;
  int64_t iv;
  size_t lu, len;
  memset(v, 0, sizeof *v);
  switch (p[0]) {
  case TAG_NULL:
  case TAG_FALSE:
  case TAG_TRUE:
    v->type = p[0] == TAG_NULL    ? BS_SCALAR_NULL
              : p[0] == TAG_FALSE ? BS_SCALAR_FALSE
                                  : BS_SCALAR_TRUE;
    *used = 1;
    return 1;
  case TAG_INT:
    if (avail < 9) return 0;
    v->type = BS_SCALAR_INT;
    v->i = (int64_t)(bs__get_u64be(p + 1) ^ INT64_SIGN);
    *used = 9;
    return 1;
  case TAG_DOUBLE:
    if (avail < 9) return 0;
    u = bs__get_u64be(p + 1);
    memcpy(&d, &u, sizeof d);
    if (!isfinite(d) || double_as_int(d, &iv)) return 0; /* the encoder never writes these */
    v->type = BS_SCALAR_DOUBLE;
    v->d = d;
    *used = 9;
    return 1;
  case TAG_STRING:
    if (!read_len(p + 1, avail - 1, &lu, &len) || len > avail - 1 - lu) return 0;
    v->type = BS_SCALAR_STRING;
    v->s.data = len ? p + 1 + lu : (const void *)"";
    v->s.size = len;
    *used = 1 + lu + len;
    return 1;
  default:
    return 0;
  }
}

int bs_lookup_decode(bs_scalar *values, size_t cap, size_t *n_out, bs_val key, bs_error *err) {
  const unsigned char *p = key.data;
  size_t off = 0, n = 0, used;
  bs_scalar tmp;
  if (!n_out) return bs__fail(err, BS_EINVAL, "n_out: NULL");
  *n_out = 0;
  if (cap && !values) return bs__fail(err, BS_EINVAL, "values: NULL with cap %zu", cap);
  if (key.size && !p) return bs__fail(err, BS_EINVAL, "key: NULL data with size %zu", key.size);
  while (off < key.size) {
    if (!decode_one(p + off, key.size - off, &used, n < cap ? &values[n] : &tmp))
      return bs__fail(err, BS_ECORRUPT, "key: malformed lookup key at byte %zu", off);
    off += used;
    n++;
  }
  *n_out = n;
  if (n > cap) return bs__fail(err, BS_ETOOBIG, "values: key holds %zu values, cap is %zu", n, cap);
  return BS_OK;
}

int bs__param_row_cmp(uint32_t table_a, bs_val rid_a, uint32_t table_b, bs_val rid_b) {
  uint64_t ha, hb;
  if (table_a != table_b) return table_a < table_b ? -1 : 1;
  ha = bs__val_hash(rid_a);
  hb = bs__val_hash(rid_b);
  if (ha != hb) return ha < hb ? -1 : 1;
  return bs__val_cmp(rid_a, rid_b);
}
