/*
 * verify.c: the rules of bs_db_verify (storage.h, contract.md 8), once for every backend. A
 * backend walks its own storage in one snapshot and hands each stream, each op of a bucket (in
 * op id order) and the end of each bucket here, which decides what is a problem: an op's shape
 * by its type (contract.md 1, 3, 6), its checksum recomputed with the stream's hash, op ids, and
 * the bucket's stored running values (the only check a MOVE's or CLEAR's checksum can get: their
 * payload is gone). What only one backend's storage can get wrong (a key that does not decode,
 * a NULL column, an index) that backend checks itself.
 */
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>

void bs__verify_problem(bs__verify *v, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  ++v->problems;
  if (!v->fn) return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  v->fn(buf, v->payload);
}

/* A problem of bucket b, of its op op (NULL: of the bucket). */
static void problem(bs__verify *v, const bs__vbucket *b, const bs_op *op, const char *fmt, ...)
    BS_PRINTF(4, 5);
static void problem(bs__verify *v, const bs__vbucket *b, const bs_op *op, const char *fmt, ...) {
  char buf[512];
  int ns = bs__name_shown(b->name), n;
  const char *nm = b->name.size ? (const char *)b->name.data : "";
  va_list ap;
  n = op ? snprintf(buf, sizeof buf, "bucket \"%.*s\" op %" PRIu64 ": ", ns, nm, op->op_id)
         : snprintf(buf, sizeof buf, "bucket \"%.*s\" (id %" PRIu64 "): ", ns, nm, b->id);
  va_start(ap, fmt);
  vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  bs__verify_problem(v, "%s", buf);
}

int bs__verify_stream_add(bs__verify *v, uint32_t id, uint64_t op_head, uint64_t checkpoint,
                          unsigned hash) {
  bs__vstream *s;
  if (BS_GROW(v->a, v->streams, v->cap_streams, v->n_streams + 1)) return BS_ENOMEM;
  s = &v->streams[v->n_streams++];
  s->id = id;
  s->op_head = op_head;
  s->hash = (bs_hash)hash;
  s->hash_known = hash == BS_HASH_XXH3 || hash == BS_HASH_SHA256;
  if (!s->hash_known) bs__verify_problem(v, "stream %" PRIu32 ": unknown hash mode %u", id, hash);
  if (checkpoint > op_head)
    bs__verify_problem(v, "stream %" PRIu32 ": checkpoint %" PRIu64 " above op head %" PRIu64, id,
                       checkpoint, op_head);
  return BS_OK;
}

const bs__vstream *bs__verify_stream(const bs__verify *v, uint32_t id) {
  for (size_t i = 0; i < v->n_streams; i++)
    if (v->streams[i].id == id) return &v->streams[i];
  return NULL;
}

/* A subkey's shape (contract.md 1): 8 lowercase hex digits, '/', 32 lowercase hex digits. */
static int subkey_ok(bs_val sk) {
  const unsigned char *p = sk.data;
  if (!p || sk.size != BS_SUBKEY_SIZE) return 0;
  for (size_t i = 0; i < sk.size; i++)
    if (i == 8 ? p[i] != '/' : !((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
      return 0;
  return 1;
}

void bs__verify_op(bs__verify *v, bs__vbucket *b, const bs_op *op, uint64_t payload) {
  static const char *const names[] = {"?", "PUT", "REMOVE", "MOVE", "CLEAR"};
  uint64_t index = b->n + b->n_bad, id = op->op_id, target = op->target_op;
  /* the bytes beyond the row's fields: a PUT's data, nothing for the others */
  uint64_t rest = payload - op->object_type.size - op->object_id.size - op->subkey.size;
  const char *tn;
  uint32_t want;
  if (id == 0 || (b->stream && id > b->stream->op_head))
    problem(v, b, op, "op id outside 1..the stream's op head %" PRIu64,
            b->stream ? b->stream->op_head : 0);
  if (b->n && id <= b->last_seen) problem(v, b, op, "not above op %" PRIu64, b->last_seen);
  if (index == 0) {
    b->first_op = id;
    b->first_clear = op->type == BS_OP_CLEAR;
  }
  b->sum = bs__cksum_add(b->sum, op->checksum);
  b->n++;
  b->sum_bytes += payload + b->header;
  b->last_seen = id;
  if (op->type < BS_OP_PUT || op->type > BS_OP_CLEAR) {
    problem(v, b, op, "unknown type %d", (int)op->type);
    return;
  }
  tn = names[op->type];
  if (op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR) {
    if (payload) problem(v, b, op, "%s with a payload (%" PRIu64 " bytes)", tn, payload);
    if (op->type == BS_OP_MOVE ? target <= id || target > b->last_op : target > b->last_op)
      problem(v, b, op, "%s has a bad target_op %" PRIu64, tn, target);
    if (op->type == BS_OP_CLEAR && (index != 0 || id != b->clear_op))
      problem(v, b, op,
              "a CLEAR that is not the bucket's leading CLEAR (the state's CLEAR span ends at "
              "%" PRIu64 ")",
              b->clear_op);
    return;
  }
  if (target != 0) problem(v, b, op, "%s has a bad target_op %" PRIu64, tn, target);
  if (!subkey_ok(op->subkey))
    problem(v, b, op, "%s with a malformed subkey (%zu bytes)", tn, op->subkey.size);
  if (op->type == BS_OP_REMOVE && rest != 0)
    problem(v, b, op, "REMOVE with %" PRIu64 " bytes of data", rest);
  if (!b->stream || !b->stream->hash_known) return;
  want = op->type == BS_OP_PUT
             ? bs_checksum_put(b->stream->hash, op->object_type, op->object_id, op->data)
             : bs_checksum_remove(b->stream->hash, op->subkey);
  if (want != op->checksum)
    problem(v, b, op, "%s checksum %" PRIu32 " stored, its payload hashes to %" PRIu32, tn,
            op->checksum, want);
}

void bs__verify_bucket_end(bs__verify *v, const bs__vbucket *b) {
  if (b->name.size < 1 || b->name.size > BS_MAX_BUCKET_NAME)
    problem(v, b, NULL, "a name of %zu bytes", b->name.size);
  if (!b->stream)
    problem(v, b, NULL, "unknown stream %" PRIu32, b->stream_id);
  else if (b->last_op > b->stream->op_head)
    problem(v, b, NULL, "last op %" PRIu64 " above the stream's op head %" PRIu64, b->last_op,
            b->stream->op_head);
  if (b->n_bad) return; /* sums over undecodable ops mean nothing */
  if (b->has_state && b->checksum != b->sum)
    problem(v, b, NULL, "running checksum %" PRIu64 ", ops sum to %" PRIu32, b->checksum, b->sum);
  if (b->has_state && b->count != b->n)
    problem(v, b, NULL, "running count %" PRIu64 ", %" PRIu64 " ops stored", b->count, b->n);
  if (b->has_state && b->bytes != b->sum_bytes)
    problem(v, b, NULL, "running bytes %" PRIu64 ", ops hold %" PRIu64, b->bytes, b->sum_bytes);
  if (b->last_op != b->last_seen)
    problem(v, b, NULL, "last op %" PRIu64 ", highest stored op %" PRIu64, b->last_op,
            b->last_seen);
  if (b->clear_op > b->last_op || b->clear_start > b->clear_op)
    problem(v, b, NULL, "bad CLEAR span [%" PRIu64 ", %" PRIu64 "]", b->clear_start, b->clear_op);
  else if (b->clear_op && !(b->first_clear && b->first_op == b->clear_op))
    problem(v, b, NULL,
            "the state's CLEAR span ends at %" PRIu64 ", but op %" PRIu64
            " is the bucket's first op%s",
            b->clear_op, b->first_op, b->first_clear ? "" : " and no CLEAR");
}
