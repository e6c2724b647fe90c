/*
 * opchunk.c: the op chunk, a strictly ordered run of one bucket's ops in one value (internal.h
 * "Op chunks" has the layout). Backend-neutral, so that every backend storing ops in runs writes
 * the same bytes and checks them alike: LMDB's op records (lmdb_ops.c) are these chunks, and
 * where a backend keeps them (key, size bounds, the tail it extends) stays the backend's.
 */
#include "internal.h"

size_t bs__varint_put(unsigned char *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (unsigned char)v;
  return n;
}

int bs__varint_get(const unsigned char *p, size_t size, size_t *pos, uint64_t *v) {
  uint64_t r = 0;
  for (unsigned s = 0; s < 70 && *pos < size; s += 7) {
    unsigned char b = p[(*pos)++];
    if (s == 63 && b > 1) return 0;
    r |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) {
      *v = r;
      return 1;
    }
  }
  return 0;
}

static unsigned char *put_uint(unsigned char *p, uint64_t v, size_t width) {
  if (width == 8) bs__put_u64le(p, v);
  if (width == 4) bs__put_u32le(p, (uint32_t)v);
  if (width == 2) bs__put_u16le(p, (uint32_t)v);
  if (width == 1) *p = (unsigned char)v;
  return p + width;
}

static unsigned char *put_bytes(unsigned char *p, bs_val v) {
  if (v.size) memcpy(p, v.data, v.size);
  return p + v.size;
}

void bs__op_value_encode(unsigned char *p, const bs_op *op) {
  const bs_val none = {NULL, 0};
  int row = bs__op_carries_row(op->type);
  bs_val ot = row ? op->object_type : none, oi = row ? op->object_id : none;
  bs_val sk = row ? op->subkey : none;
  p = put_uint(p, (uint64_t)op->type, 1);
  p = put_uint(p, op->checksum, 4);
  p = put_uint(p, op->target_op, 8);
  p = put_uint(p, ot.size, 2);
  p = put_uint(p, oi.size, 2);
  p = put_uint(p, sk.size, 1);
  p = put_bytes(put_bytes(put_bytes(p, ot), oi), sk);
  if (op->type == BS_OP_PUT) put_bytes(p, op->data);
}

int bs__chunk_decode(const unsigned char *p, size_t size, uint64_t *ids, uint32_t *off,
                     uint32_t *len, uint32_t *n_out) {
  size_t pos = BS_CHUNK_HDR;
  uint64_t id, n;
  if (size < BS_CHUNK_HDR || size > UINT32_MAX) return BS_ECORRUPT;
  n = bs__chunk_n(p);
  if (n == 0 || n > BS_CHUNK_MAX_OPS) return BS_ECORRUPT;
  id = bs__chunk_first(p);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t delta, vs;
    if (!bs__varint_get(p, size, &pos, &delta) || !bs__varint_get(p, size, &pos, &vs))
      return BS_ECORRUPT;
    if ((i && delta == 0) || (i == 0 && delta) || id + delta < id) return BS_ECORRUPT;
    if (vs < BS_OP_HEADER_SIZE || vs > size - pos) return BS_ECORRUPT;
    id += delta;
    ids[i] = id;
    off[i] = (uint32_t)pos;
    len[i] = (uint32_t)vs;
    pos += vs;
  }
  if (pos != size) return BS_ECORRUPT;
  *n_out = (uint32_t)n;
  return BS_OK;
}

size_t bs__chunk_add(unsigned char *p, uint64_t delta, const bs_op *op, const unsigned char *val,
                     size_t vs) {
  size_t n = bs__varint_put(p, delta);
  n += bs__varint_put(p + n, vs);
  if (op)
    bs__op_value_encode(p + n, op);
  else
    memcpy(p + n, val, vs);
  return n + vs;
}

int bs__chunk_seal(unsigned char *p, size_t size, uint64_t first) {
  size_t pos = BS_CHUNK_HDR;
  uint32_t n = 0, sum = 0, flags = 0;
  uint64_t bytes = 0;
  while (pos < size) {
    uint64_t delta, vs;
    if (!bs__varint_get(p, size, &pos, &delta) || !bs__varint_get(p, size, &pos, &vs) ||
        vs > size - pos || vs < BS_OP_HEADER_SIZE)
      return BS_ECORRUPT;
    sum = bs__cksum_add(sum, bs__get_u32le(p + pos + 1));
    if (p[pos] == BS_OP_CLEAR) flags |= BS_CHUNK_CLEAR;
    bytes += vs;
    pos += vs;
    n++;
  }
  bs__put_u32le(p, n);
  bs__put_u32le(p + 4, sum);
  bs__put_u64le(p + 8, first);
  bs__put_u32le(p + 16, (uint32_t)(bytes > UINT32_MAX ? UINT32_MAX : bytes));
  p[20] = (unsigned char)flags;
  return BS_OK;
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

size_t bs__chunk_join_size(size_t xs, uint64_t x_last, size_t ys, uint64_t y_first) {
  return xs + (ys - BS_CHUNK_HDR - 1) + varint_len(y_first - x_last);
}

void bs__chunk_join(unsigned char *out, const unsigned char *x, size_t xs, uint64_t x_last,
                    const unsigned char *y, size_t ys) {
  uint64_t bytes = (uint64_t)bs__chunk_bytes(x) + bs__chunk_bytes(y);
  size_t pos = xs;
  memcpy(out + BS_CHUNK_HDR, x + BS_CHUNK_HDR, xs - BS_CHUNK_HDR);
  pos += bs__varint_put(out + pos, bs__chunk_first(y) - x_last);
  memcpy(out + pos, y + BS_CHUNK_HDR + 1, ys - BS_CHUNK_HDR - 1);
  bs__put_u32le(out, bs__chunk_n(x) + bs__chunk_n(y));
  bs__put_u32le(out + 4, bs__cksum_add(bs__chunk_sum(x), bs__chunk_sum(y)));
  bs__put_u64le(out + 8, bs__chunk_first(x));
  bs__put_u32le(out + 16, (uint32_t)(bytes > UINT32_MAX ? UINT32_MAX : bytes));
  out[20] = (unsigned char)(bs__chunk_flags(x) | bs__chunk_flags(y));
}

const char *bs__chunk_header_problem(const unsigned char *p, uint32_t n, const uint64_t *ids,
                                     const uint32_t *off, const uint32_t *len, uint64_t after) {
  uint32_t sum = 0, flags = 0;
  uint64_t bytes = 0;
  if (ids[0] <= after) return "its first op is not above the bucket's previous chunk";
  for (uint32_t i = 0; i < n; i++) {
    sum = bs__cksum_add(sum, bs__get_u32le(p + off[i] + 1));
    if (p[off[i]] == BS_OP_CLEAR) flags |= BS_CHUNK_CLEAR;
    bytes += len[i];
  }
  if (sum != bs__chunk_sum(p)) return "its checksum sum is not its ops'";
  if ((bytes > UINT32_MAX ? UINT32_MAX : bytes) != bs__chunk_bytes(p))
    return "its byte count is not its ops'";
  if (flags != bs__chunk_flags(p)) return "its flags are not its ops'";
  return NULL;
}
