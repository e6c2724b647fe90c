/*
 * opchunk.c: the op chunk, a strictly ordered run of one bucket's ops in one value (internal.h
 * "Op chunks" has the layout, in either op encoding: format 5's, or format 6's compact one, which
 * a chunk's header flag names). Backend-neutral, so that every backend storing ops in runs writes
 * the same bytes and checks them alike: LMDB's op records (lmdb_ops.c) are these chunks, and
 * where a backend keeps them (key, size bounds, the tail it extends) stays the backend's.
 * An op value's encoders and decoders, both encodings, are inline in internal.h side by side:
 * a field of a stored op is written and read back in that one place.
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

/* A compact op value's header: the bytes before its strings (and so its size in format 5's
 * measure, less BS_OP_HEADER_SIZE, is vs less these); 0 when the header does not fit in vs. Read
 * without decoding the op: the seal runs it on every op of every chunk written. */
static size_t cheader(const unsigned char *v, size_t vs) {
  size_t pos = BS_OPC_MIN;
  unsigned head;
  if (vs < BS_OPC_MIN) return 0;
  head = v[0];
  if (head & BS_OPC_TARGET)
    while (pos < vs && v[pos++] & 0x80) continue;
  if (bs__op_carries_row((bs_op_type)(head & 7u))) {
    if (head & BS_OPC_SHORT) {
      pos++;
    } else {
      while (pos < vs && v[pos++] & 0x80) continue; /* the object_type length */
      while (pos < vs && v[pos++] & 0x80) continue; /* the object_id length */
    }
    pos += !(head & BS_OPC_SUBKEY);
  }
  return pos <= vs ? pos : 0;
}

size_t bs__chunk_op_bytes(const unsigned char *v, size_t vs, unsigned f) {
  size_t h;
  if (!(f & BS_CHUNK_COMPACT)) return vs >= BS_OP_HEADER_SIZE ? vs : 0;
  return (h = cheader(v, vs)) ? vs - h + BS_OP_HEADER_SIZE : 0;
}

/* Asks for the chunk's first PREFETCH_MAX bytes at once. The loop below finds each op's varints
 * only by reading the previous op's size, a chain of dependent loads about three cache lines
 * apart: on a chunk not in the cache each one waits for memory, which the hardware prefetchers
 * hid or not depending on the ops' size (format 6's file read 1.08x format 5's time with the
 * same instruction count). Issued together, the misses overlap: warm whole-bucket reads take
 * 0.59x the time (docs/format.md 4.3, "Reads and the cache"). Readers then read the op values
 * the loop skips. A chunk over a page holds one large op, whose varints are its first bytes. */
#define PREFETCH_MAX 4160u
static void prefetch(const unsigned char *p, size_t size) {
#if defined(__GNUC__) || defined(__clang__)
  for (size_t o = 0; o < size && o < PREFETCH_MAX; o += 64) __builtin_prefetch(p + o);
#else
  (void)p, (void)size;
#endif
}

int bs__chunk_decode(const unsigned char *p, size_t size, uint64_t *ids, uint32_t *off,
                     uint32_t *len, uint32_t *n_out) {
  size_t pos = BS_CHUNK_HDR, least;
  uint64_t id, n;
  if (size < BS_CHUNK_HDR || size > UINT32_MAX) return BS_ECORRUPT;
  prefetch(p, size);
  n = bs__chunk_n(p);
  if (n == 0 || n > BS_CHUNK_MAX_OPS) return BS_ECORRUPT;
  /* a flag this build does not know: the chunk is not one it can read */
  if (bs__chunk_flags(p) & ~(BS_CHUNK_CLEAR | BS_CHUNK_COMPACT)) return BS_ECORRUPT;
  least = BS_OP_MIN_SIZE(bs__chunk_flags(p));
  id = bs__chunk_first(p);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t delta, vs;
    if (!bs__varint_get(p, size, &pos, &delta) || !bs__varint_get(p, size, &pos, &vs))
      return BS_ECORRUPT;
    if ((i && delta == 0) || (i == 0 && delta) || id + delta < id) return BS_ECORRUPT;
    if (vs < least || vs > size - pos) return BS_ECORRUPT;
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

size_t bs__chunk_add_as(unsigned char *p, uint64_t delta, const bs_op *op, const unsigned char *val,
                        size_t vs, unsigned f) {
  size_t n = bs__varint_put(p, delta);
  n += bs__varint_put(p + n, vs);
  if (!op)
    memcpy(p + n, val, vs);
  else if (f & BS_CHUNK_COMPACT)
    bs__op_value_cencode(p + n, op);
  else
    bs__op_value_encode(p + n, op);
  return n + vs;
}

size_t bs__chunk_add(unsigned char *p, uint64_t delta, const bs_op *op, const unsigned char *val,
                     size_t vs) {
  return bs__chunk_add_as(p, delta, op, val, vs, 0);
}

int bs__chunk_seal(unsigned char *p, size_t size, uint64_t first) {
  return bs__chunk_seal_as(p, size, first, 0);
}

/* An op value's type: its first byte, of which a compact one's head keeps bits 0-2. */
static unsigned op_type(const unsigned char *v, unsigned f) {
  return f & BS_CHUNK_COMPACT ? v[0] & 7u : v[0];
}

int bs__chunk_seal_as(unsigned char *p, size_t size, uint64_t first, unsigned f) {
  size_t pos = BS_CHUNK_HDR;
  uint32_t n = 0, sum = 0, flags = f & BS_CHUNK_COMPACT;
  uint64_t bytes = 0;
  while (pos < size) {
    uint64_t delta, vs;
    size_t b;
    if (!bs__varint_get(p, size, &pos, &delta) || !bs__varint_get(p, size, &pos, &vs) ||
        vs > size - pos || vs < BS_OP_MIN_SIZE(f) || !(b = bs__chunk_op_bytes(p + pos, vs, f)))
      return BS_ECORRUPT;
    sum = bs__cksum_add(sum, bs__get_u32le(p + pos + 1));
    if (op_type(p + pos, f) == BS_OP_CLEAR) flags |= BS_CHUNK_CLEAR;
    bytes += b;
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

size_t bs__chunk_join_size(size_t xs, uint64_t x_last, size_t ys, uint64_t y_first) {
  return xs + (ys - BS_CHUNK_HDR - 1) + bs__varint_len(y_first - x_last);
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
  unsigned f = bs__chunk_flags(p) & BS_CHUNK_COMPACT;
  uint32_t sum = 0, flags = f;
  uint64_t bytes = 0;
  if (ids[0] <= after) return "its first op is not above the bucket's previous chunk";
  for (uint32_t i = 0; i < n; i++) {
    sum = bs__cksum_add(sum, bs__get_u32le(p + off[i] + 1));
    if (op_type(p + off[i], f) == BS_OP_CLEAR) flags |= BS_CHUNK_CLEAR;
    bytes += bs__chunk_op_bytes(p + off[i], len[i], f);
  }
  if (sum != bs__chunk_sum(p)) return "its checksum sum is not its ops'";
  if ((bytes > UINT32_MAX ? UINT32_MAX : bytes) != bs__chunk_bytes(p))
    return "its byte count is not its ops'";
  if (flags != bs__chunk_flags(p)) return "its flags are not its ops'";
  return NULL;
}
