/*
 * compact.c: the compaction planner (contract.md section 6), one for every backend. Option
 * defaults (initial replication's too), the horizon, the op budget, bucket selection, initial
 * replication's refusal, the progress cancel, the bounded set of row identities seen by a reverse
 * scan, and every decision about an op: which PUT/REMOVE becomes a MOVE and its target, what
 * folds into a CLEAR and what the CLEAR carries, what initial replication deletes, when
 * defragmentation re-emits, which parameter entries go. compact_run.c walks each bucket over a
 * backend's cursors asking these; everything here is pure logic.
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- Options -------------------------------------------------------------------------------- */

int bs__compact_options_resolve(bs_compact_options *out, const bs_compact_options *in,
                                bs_error *err) {
  static const bs_compact_options defaults = BS_COMPACT_OPTIONS_INIT;
  int rc;
  *out = defaults;
  if (in && (rc = BS_VERSIONED_COPY(out, in, bs_compact_options, "opts->version", err))) return rc;
  if (out->buckets == NULL && out->n_buckets)
    return bs__fail(err, BS_EINVAL, "opts->buckets: NULL with n_buckets = %zu", out->n_buckets);
  if (out->max_op_id >= (1ull << 63))
    return bs__fail(err, BS_EINVAL, "opts->max_op_id: must be < 2^63");
  if (!(out->min_change_ratio == out->min_change_ratio)) /* NaN */
    return bs__fail(err, BS_EINVAL, "opts->min_change_ratio: NaN");
  if (out->min_bucket_changes == 0) out->min_bucket_changes = BS_COMPACT_MIN_BUCKET_CHANGES;
  if (out->min_change_ratio < 0) out->min_change_ratio = BS_COMPACT_MIN_CHANGE_RATIO;
  if (out->memory_limit_mb == 0) out->memory_limit_mb = BS_COMPACT_MEMORY_LIMIT_MB;
  if (out->memory_limit_mb > SIZE_MAX / (1024u * 1024u))
    return bs__fail(err, BS_EINVAL, "opts->memory_limit_mb: %zu is too large",
                    out->memory_limit_mb);
  if (out->min_age_ms < 0) out->min_age_ms = BS_COMPACT_MIN_AGE_MS;
  if (out->max_ops_per_txn == 0) out->max_ops_per_txn = BS_COMPACT_MAX_OPS_PER_TXN;
  /* a fold needs two ops in one transaction */
  if (out->max_ops_per_txn < 2) out->max_ops_per_txn = 2;
  if (out->delete_checkpoint_requests_before_ms < 0)
    return bs__fail(err, BS_EINVAL, "opts->delete_checkpoint_requests_before_ms: negative");
  return BS_OK;
}

void bs__compact_initial_options(bs_compact_options *o, uint64_t max_op_id,
                                 uint64_t min_bucket_changes) {
  bs__compact_options_resolve(o, NULL, NULL); /* the defaults: cannot fail */
  o->max_op_id = max_op_id;
  o->min_bucket_changes = min_bucket_changes;
  o->min_change_ratio = 0.0; /* the snapshot's buckets: any share of new ops */
}

int bs__compact_initial_check(uint32_t stream, int has_checkpoint, uint64_t checkpoint,
                              bs_error *err) {
  if (!has_checkpoint) return BS_OK;
  return bs__fail(err, BS_ESTATE,
                  "stream %u has a checkpoint (%llu): initial-replication compaction only runs "
                  "before the first one",
                  stream, (unsigned long long)checkpoint);
}

int bs__compact_progress(const bs_compact_options *o, const bs_compact_stats *so_far,
                         bs_error *err) {
  int value = o->progress ? o->progress(so_far, o->progress_payload) : 0;
  return value ? bs__callback_fail(err, BS_ECANCELED, "bs_compact's opts->progress", value) : BS_OK;
}

/* The growth of the count since the last full or initial compaction (the reference service's
 * estimate_since_compact / compacted_state figures); nothing when no op came since. */
uint64_t bs__compact_changes(uint64_t count, uint64_t compacted_count, uint64_t last_op,
                             uint64_t compacted_op) {
  if (last_op <= compacted_op || count <= compacted_count) return 0;
  return count - compacted_count;
}

int bs__compact_due(const bs_compact_options *o, uint64_t changes, uint64_t count) {
  if (changes < o->min_bucket_changes || changes == 0) return 0;
  return (double)changes / (double)count >= o->min_change_ratio;
}

int bs__compact_bucket_due(const bs_compact_options *o, uint64_t count, uint64_t compacted_count,
                           uint64_t last_op, uint64_t compacted_op) {
  return bs__compact_due(o, bs__compact_changes(count, compacted_count, last_op, compacted_op),
                         count);
}

/* ---- The seen-set ----------------------------------------------------------------------------
 * The hash table (common.c) maps a row's hash to its arena offset + 1. The arena holds each row
 * as u64le op id | u16 object_type len | u16 object_id len | u8 subkey len | bytes. Identities
 * are compared in full, so a hash collision can never turn the wrong op into a MOVE. Memory
 * (table + arena capacity) never exceeds the limit: once the next growth would, the set stops
 * accepting new rows (a reverse scan then compacts less, never wrongly). */

#define SEEN_HDR       13u
#define SEEN_MIN_SLOTS 64u /* first table: 1 KiB, so one-op buckets stay cheap */

void bs__seen_init(bs__seen_set *s, const bs_allocator *a, size_t limit_bytes) {
  memset(s, 0, sizeof *s);
  s->alloc = a;
  s->limit = limit_bytes;
}

void bs__seen_free(bs__seen_set *s) {
  bs__htab_free(&s->rows, s->alloc);
  bs__free(s->alloc, s->arena);
  s->arena = NULL;
  s->arena_size = s->arena_cap = 0;
  s->full = 0;
}

void bs__seen_clear(bs__seen_set *s) {
  /* A table grown for a big bucket is dropped, not wiped again for every small bucket after
   * it: wiping costs its capacity, regrowing costs what the next bucket uses. */
  if (s->rows.cap > SEEN_MIN_SLOTS && s->rows.n < s->rows.cap / 8)
    bs__htab_free(&s->rows, s->alloc);
  bs__htab_clear(&s->rows);
  s->arena_size = 0;
  s->full = 0;
}

static uint64_t seen_hash(const bs_op *op) {
  uint64_t h =
      XXH3_64bits_withSeed(op->object_type.data, op->object_type.size, op->object_type.size);
  h = XXH3_64bits_withSeed(op->object_id.data, op->object_id.size, h ^ op->object_id.size);
  return XXH3_64bits_withSeed(op->subkey.data, op->subkey.size, h + op->subkey.size);
}

static int seen_equal(const unsigned char *p, const bs_op *op) {
  size_t ot = bs__get_u16le(p + 8), oi = bs__get_u16le(p + 10), sk = p[12];
  if (ot != op->object_type.size || oi != op->object_id.size || sk != op->subkey.size) return 0;
  p += SEEN_HDR;
  if (ot && memcmp(p, op->object_type.data, ot)) return 0;
  p += ot;
  if (oi && memcmp(p, op->object_id.data, oi)) return 0;
  p += oi;
  return !sk || memcmp(p, op->subkey.data, sk) == 0;
}

/* The arena record of op's row, or NULL. */
static const unsigned char *seen_lookup(const bs__seen_set *s, uint64_t h, const bs_op *op) {
  bs__hprobe p = bs__htab_probe(&s->rows, h);
  for (uintptr_t v; (v = bs__htab_next(&p));)
    if (seen_equal(s->arena + v - 1, op)) return s->arena + v - 1;
  return NULL;
}

/* Room for one more row (table and arena) within the limit; 0 when there is none. */
static int seen_reserve(bs__seen_set *s, size_t need) {
  size_t tcap = s->rows.cap, ncap;
  unsigned char *p;
  if ((s->rows.n + 1) * 2 > tcap) tcap = tcap ? tcap * 2 : SEEN_MIN_SLOTS;
  if (tcap > SIZE_MAX / sizeof(bs__hent) || tcap * sizeof(bs__hent) > s->limit) return 0;
  if (s->arena_cap - s->arena_size < need) {
    ncap = s->arena_cap ? s->arena_cap : 4096;
    while (ncap - s->arena_size < need) {
      if (ncap > SIZE_MAX / 2) return 0;
      ncap *= 2;
    }
    if (tcap * sizeof(bs__hent) + ncap > s->limit) {
      /* the last step may use what is left below the limit */
      ncap = s->limit - tcap * sizeof(bs__hent);
      if (ncap < s->arena_size + need) return 0;
    }
    if (!(p = bs__realloc(s->alloc, s->arena, ncap))) return 0;
    s->arena = p;
    s->arena_cap = ncap;
  }
  if (tcap * sizeof(bs__hent) + s->arena_cap > s->limit) return 0;
  return bs__htab_reserve(&s->rows, s->alloc, tcap / 2) == BS_OK;
}

int bs__seen_find(const bs__seen_set *s, const bs_op *op, uint64_t *latest) {
  const unsigned char *p = seen_lookup(s, seen_hash(op), op);
  if (!p) return 0;
  *latest = bs__get_u64le(p);
  return 1;
}

int bs__seen_visit(bs__seen_set *s, const bs_op *op, uint64_t *latest) {
  uint64_t h = seen_hash(op);
  size_t need = SEEN_HDR + op->object_type.size + op->object_id.size + op->subkey.size;
  const unsigned char *hit = seen_lookup(s, h, op);
  unsigned char *p;
  if (hit) {
    *latest = bs__get_u64le(hit);
    return 1;
  }
  if (s->full) return 0;
  if (!seen_reserve(s, need)) {
    s->full = 1;
    return 0;
  }
  /* lengths fit the header: ops decode with u16/u16/u8 lengths */
  p = s->arena + s->arena_size;
  bs__put_u64le(p, op->op_id);
  bs__put_u16le(p + 8, (uint32_t)op->object_type.size);
  bs__put_u16le(p + 10, (uint32_t)op->object_id.size);
  p[12] = (unsigned char)op->subkey.size;
  p += SEEN_HDR;
  if (op->object_type.size) memcpy(p, op->object_type.data, op->object_type.size);
  p += op->object_type.size;
  if (op->object_id.size) memcpy(p, op->object_id.data, op->object_id.size);
  p += op->object_id.size;
  if (op->subkey.size) memcpy(p, op->subkey.data, op->subkey.size);
  bs__htab_put(&s->rows, h, s->arena_size + 1);
  s->arena_size += need;
  return 0;
}

/* ---- Planning ------------------------------------------------------------------------------- */

uint64_t bs__compact_horizon(const bs_compact_options *o, uint64_t checkpoint, uint64_t aged,
                             uint64_t op_head) {
  uint64_t h;
  if (o->incremental_only) {
    h = o->min_age_ms == 0 ? checkpoint : aged;
    if (o->max_op_id && o->max_op_id < h) h = o->max_op_id;
  } else {
    h = o->max_op_id ? o->max_op_id : checkpoint;
  }
  return h < op_head ? h : op_head;
}

int bs__compact_superseded(const bs__seen_set *s, const bs_op *op, uint64_t *target_out) {
  uint64_t latest;
  if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) return 0;
  if (!bs__seen_find(s, op, &latest) || latest <= op->op_id) return 0;
  *target_out = latest;
  return 1;
}

int bs__compact_scan_op(bs__compact_scan *p, bs__seen_set *s, const bs_op *op) {
  uint64_t latest;
  p->run++;
  if (op->type == BS_OP_CLEAR) return 0; /* a CLEAR has nothing before it */
  if (op->type == BS_OP_MOVE) return 1;  /* residue: in the run, nothing to record */
  /* latest == op_id: the scan met this op again (a retried transaction); it is the row's
   * latest, not superseded. */
  if (bs__seen_visit(s, op, &latest) && latest > op->op_id) {
    if (op->op_id > p->max_moved) p->max_moved = op->op_id;
  } else if (op->type == BS_OP_PUT) {
    p->run = 0; /* a surviving PUT: the leading run starts below it */
  }
  return 1;
}

void bs__clear_acc_add(bs__clear_acc *a, const bs_op *op, uint64_t move_target,
                       uint64_t value_bytes) {
  uint64_t target = move_target ? move_target : op->target_op;
  if (a->n == 0) a->first_op = op->op_id;
  a->last_op = op->op_id;
  a->n++;
  if (op->type != BS_OP_CLEAR) a->n_folded++;
  if (move_target) a->n_moved++; /* counted as the MOVE it would otherwise have become */
  a->checksum = bs__cksum_add(a->checksum, op->checksum);
  /* A REMOVE carries no target (0): a reader that reaches the CLEAR at C >= its op id has
   * everything the REMOVE said. MOVE and CLEAR carry theirs over. */
  if (target > a->target_op) a->target_op = target;
  a->bytes += value_bytes;
}

bs_op bs__compact_move_op(const bs_op *op, uint64_t target) {
  bs_op mv = {
      .op_id = op->op_id, .type = BS_OP_MOVE, .checksum = op->checksum, .target_op = target};
  return mv;
}

bs_op bs__compact_clear_op(const bs__clear_acc *clear) {
  bs_op c = {.op_id = clear->last_op,
             .type = BS_OP_CLEAR,
             .checksum = clear->checksum,
             .target_op = clear->target_op};
  return c;
}

int bs__compact_initial_drop(bs__seen_set *s, const bs_op *op) {
  uint64_t latest = 0;
  int seen;
  if (op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR) return 1; /* residue of superseded ops */
  seen = bs__seen_visit(s, op, &latest);
  if (seen && latest > op->op_id) return 1;
  /* the row's latest (recorded now, or met again by a retried scan): a REMOVE says nothing to
   * anyone, every earlier op of its row goes too */
  if (seen ? latest == op->op_id : !s->full) return op->type == BS_OP_REMOVE;
  return 0; /* an untracked row (the set is full): keep everything of it */
}

int bs__compact_defrag_due(uint64_t live, uint64_t count, double ratio) {
  /* re-emitting pays only when the rest of the bucket can fold: ops beyond the live rows and
   * the CLEAR they would leave */
  return live > 0 && count > live + 1 && (double)live / (double)count < ratio;
}
