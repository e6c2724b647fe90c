/*
 * columns.c: bucket data in columns (bs_get_bucket_columns; internal.h "Column mode"): the
 * columns a chunker in column mode fills (its stop and cut rules stay in rules.c, with
 * bs__chunker_add_value for an op stored as an op value). A chunker
 * in column mode writes each op's id, type, checksum, target, field offsets and field bytes into
 * arrays reused from chunk to chunk, instead of keeping a bs_op per op that the host then copies
 * field by field: a binding that copies a chunk out whole (the Node addon) pays one bulk copy per
 * column instead (bench/README.md: about 100 instructions an op less for Node's raw reads).
 */
#include "internal.h"

#include <inttypes.h>

/* Room for op i (and the end offset after it) in every op column: each grows to the same
 * capacity, doubling. */
int bs__cols_room(bs__cols *s, size_t i, bs_error *err) {
  size_t nc = s->cap ? s->cap : 64;
  void *p;
  while (nc <= i) {
    if (nc > SIZE_MAX / 64) goto nomem;
    nc *= 2;
  }
#define COLS_GROW(col, n)                                                                          \
  if (!(p = bs__realloc(s->a, s->col, (n) * sizeof *s->col))) goto nomem;                          \
  s->col = p
  COLS_GROW(ids, nc);
  COLS_GROW(targets, nc);
  COLS_GROW(types, nc);
  COLS_GROW(sums, nc);
  COLS_GROW(offs, 4 * nc + 1);
#undef COLS_GROW
  s->cap = nc;
  return BS_OK;
nomem:
  return bs__fail(err, BS_ENOMEM, "bucket columns: %zu ops", i + 1);
}

/* Room for need bytes of fields. The first block is first bytes (the chunker's bound on a chunk:
 * one op larger grows it), so that a call does not copy its chunk's bytes again and again while
 * it doubles (1 MiB by default). */
int bs__cols_bytes(bs__cols *s, size_t first, size_t need, bs_error *err) {
  size_t cap = s->bcap;
  if (!cap) {
    cap = first;
    if (cap > BS_DEFAULT_BATCH_BYTES) cap = BS_DEFAULT_BATCH_BYTES;
  }
  if (cap < 4096) cap = 4096;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) goto nomem;
    cap *= 2;
  }
  void *p = bs__realloc(s->a, s->bytes, cap);
  if (!p) goto nomem;
  s->bytes = p;
  s->bcap = cap;
  return BS_OK;
nomem:
  return bs__fail(err, BS_ENOMEM, "bucket columns: a chunk of %zu bytes", need);
}

/* Copies n bytes: in words for the short fields most ops carry (an object type, an id), where a
 * call to memcpy costs more than the copy. */
static inline void copy_short(unsigned char *d, const unsigned char *p, size_t n) {
  uint64_t x, y;
  uint32_t a, z;
  if (n > 16) {
    memcpy(d, p, n);
  } else if (n >= 8) {
    memcpy(&x, p, 8), memcpy(&y, p + n - 8, 8), memcpy(d, &x, 8), memcpy(d + n - 8, &y, 8);
  } else if (n >= 4) {
    memcpy(&a, p, 4), memcpy(&z, p + n - 4, 4), memcpy(d, &a, 4), memcpy(d + n - 4, &z, 4);
  } else {
    for (size_t k = 0; k < n; k++) d[k] = p[k];
  }
}

int bs__cols_add(bs__cols *s, size_t i, const bs_op *op, bs_error *err) {
  int row = bs__op_carries_row(op->type), put = op->type == BS_OP_PUT;
  size_t ts = row ? op->object_type.size : 0, is = row ? op->object_id.size : 0;
  size_t ss = row ? op->subkey.size : 0, ds = put ? op->data.size : 0;
  size_t need = ts + is + ss + ds, at = s->blen;
  const unsigned char *t = op->object_type.data, *id = op->object_id.data;
  const unsigned char *sk = op->subkey.data, *d = op->data.data;
  uint32_t *f;
  unsigned char *out;
  int rc;
  if (i >= s->cap && (rc = bs__cols_room(s, i, err))) return rc;
  if (need > s->bcap - at && (rc = bs__cols_bytes(s, 0, at + need, err))) return rc;
  s->ids[i] = op->op_id;
  s->types[i] = (uint8_t)op->type;
  s->sums[i] = op->checksum;
  s->targets[i] = op->target_op;
  f = s->offs + 4 * i;
  f[0] = (uint32_t)at, f[1] = (uint32_t)(at + ts), f[2] = (uint32_t)(at + ts + is);
  f[3] = (uint32_t)(at + ts + is + ss);
  out = s->bytes + at;
  /* LMDB's op value and the memory backend's ops hold the four one after another: one copy */
  if (need && t && id == t + ts && sk == id + is && (!put || d == sk + ss)) {
    memcpy(out, t, need);
  } else {
    if (ts) copy_short(out, t, ts);
    if (is) copy_short(out + ts, id, is);
    if (ss) copy_short(out + ts + is, sk, ss);
    if (ds) memcpy(out + ts + is + ss, d, ds);
  }
  s->blen = at + need;
  return BS_OK;
}

int bs__cols_emit(bs__cols *s, const bs_chunk *ch, size_t n) {
  bs_chunk_columns c;
  s->offs[4 * n] = (uint32_t)s->blen; /* room: cols_room made 4 * n + 1 */
  c.bucket = ch->bucket;
  c.after = ch->after;
  c.next_after = ch->next_after;
  c.has_more = ch->has_more;
  c.target_op = ch->target_op;
  c.n_ops = n;
  c.op_id = s->ids;
  c.type = s->types;
  c.checksum = s->sums;
  c.op_target = s->targets;
  c.field = s->offs;
  c.bytes = s->bytes;
  s->blen = 0; /* the next chunk's offsets start from 0 again */
  return s->on_chunk(&c, s->payload);
}

/* A chunk a backend cut itself (it does not use bs__chunker): laid out op by op. Its bytes are
 * within chunk_bytes, which the front capped at UINT32_MAX; a backend that broke that is told so
 * (BS_ELIMIT: the offsets are 32-bit) rather than handed on wrapped. Errors go to s->err (the
 * call's), and their status to the backend, which passes on
 * what on_chunk returns. */
int bs__cols_chunk(const bs_chunk *c, void *payload) {
  bs__cols *s = payload;
  uint64_t bytes = 0;
  s->blen = 0;
  for (size_t i = 0; i < c->n_ops; i++) {
    bs_op op = c->ops[i];
    bs__op_fields(&op);
    bytes += op.object_type.size + op.object_id.size + op.subkey.size + op.data.size;
    if (bytes > UINT32_MAX)
      return bs__fail(s->err, BS_ELIMIT, "bucket columns: the backend's chunk passes 4 GiB");
    if (bs__cols_add(s, i, &op, s->err)) return BS_ENOMEM;
  }
  if (c->n_ops == 0) return BS_OK;
  return bs__cols_emit(s, c, c->n_ops);
}

void bs__cols_free(bs__cols *s) {
  bs__free(s->a, s->ids);
  bs__free(s->a, s->targets);
  bs__free(s->a, s->types);
  bs__free(s->a, s->sums);
  bs__free(s->a, s->offs);
  bs__free(s->a, s->bytes);
}
