/*
 * compact.c: the compaction planner (contract.md section 6), one for every backend. Option
 * defaults, the horizon, bucket selection, the bounded set of row identities seen by a reverse
 * scan, and every decision about an op: which PUT/REMOVE becomes a MOVE and its target, what
 * folds into a CLEAR and what the CLEAR carries, what initial replication deletes, when
 * defragmentation re-emits, which parameter entries go. Backends (lmdb_compact.c, mem.c) walk
 * their storage in their own order and transactions and apply; everything here is pure logic.
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- Options -------------------------------------------------------------------------------- */

int bs__compact_options_resolve(bs_compact_options *out, const bs_compact_options *in,
                                bs_error *err) {
  static const bs_compact_options defaults = BS_COMPACT_OPTIONS_INIT;
  *out = in ? *in : defaults;
  if (out->version < 1)
    return bs__fail(err, BS_EINVAL, "opts->version: %u is not a version", out->version);
  if (out->buckets == NULL && out->n_buckets)
    return bs__fail(err, BS_EINVAL, "opts->buckets: NULL with n_buckets = %zu", out->n_buckets);
  if (out->max_op_id >= (1ull << 63))
    return bs__fail(err, BS_EINVAL, "opts->max_op_id: must be < 2^63");
  if (!(out->min_change_ratio == out->min_change_ratio)) /* NaN */
    return bs__fail(err, BS_EINVAL, "opts->min_change_ratio: NaN");
  if (out->min_bucket_changes == 0) out->min_bucket_changes = BS_COMPACT_MIN_CHANGES;
  if (out->min_change_ratio < 0) out->min_change_ratio = BS_COMPACT_MIN_RATIO;
  if (out->memory_limit_mb == 0) out->memory_limit_mb = BS_COMPACT_MEMORY_MB;
  if (out->memory_limit_mb > SIZE_MAX / (1024u * 1024u))
    return bs__fail(err, BS_EINVAL, "opts->memory_limit_mb: %zu is too large",
                    out->memory_limit_mb);
  if (out->min_age_ms < 0) out->min_age_ms = BS_COMPACT_MIN_AGE_MS;
  if (out->max_ops_per_txn == 0) out->max_ops_per_txn = BS_COMPACT_OPS_PER_TXN;
  /* a fold needs two ops in one transaction */
  if (out->max_ops_per_txn < 2) out->max_ops_per_txn = 2;
  if (out->delete_checkpoint_requests_before_ms < 0)
    return bs__fail(err, BS_EINVAL, "opts->delete_checkpoint_requests_before_ms: negative");
  return BS_OK;
}

/* Ops written since the last compaction, and their share of the bucket (the reference
 * service's estimate_since_compact / compacted_state figures). */
int bs__compact_bucket_due(uint64_t count, uint64_t compacted_count, uint64_t last_op,
                           uint64_t compacted_op, uint64_t min_changes, double min_ratio) {
  uint64_t since;
  if (last_op <= compacted_op) return 0; /* nothing new since the last compaction */
  since = count > compacted_count ? count - compacted_count : 0;
  if (since < min_changes || count == 0) return 0;
  return (double)since / (double)count >= min_ratio;
}

/* ---- The seen-set ----------------------------------------------------------------------------
 * Open addressing over (hash, op id, arena offset). The arena holds each row identity as
 * u16 object_type len | u16 object_id len | u8 subkey len | bytes. Identities are compared in
 * full, so a hash collision can never turn the wrong op into a MOVE. Memory (slots + arena
 * capacity) never exceeds the limit: once the next growth would, the set stops accepting new
 * rows (a reverse scan then compacts less, never wrongly). */

typedef struct bs__seen_slot {
  uint64_t hash; /* 0 = empty (real hashes are forced non-zero) */
  uint64_t op_id;
  size_t off;
} bs__seen_slot;

#define SEEN_HDR       5u
#define SEEN_MIN_SLOTS 64u /* first table: 1.5 KiB, so one-op buckets stay cheap */

void bs__seen_init(bs__seen_set *s, const bs_allocator *a, size_t limit_bytes) {
  memset(s, 0, sizeof *s);
  s->alloc = a;
  s->limit = limit_bytes;
}

void bs__seen_free(bs__seen_set *s) {
  bs__free(s->alloc, s->slots);
  bs__free(s->alloc, s->arena);
  s->slots = NULL;
  s->arena = NULL;
  s->cap = s->n = s->arena_size = s->arena_cap = 0;
  s->full = 0;
}

void bs__seen_clear(bs__seen_set *s) {
  /* A table grown for a big bucket is dropped, not wiped again for every small bucket after
   * it: wiping costs its capacity, regrowing costs what the next bucket uses. */
  if (s->slots && s->cap > SEEN_MIN_SLOTS && s->n < s->cap / 8) {
    bs__free(s->alloc, s->slots);
    s->slots = NULL;
    s->cap = 0;
  }
  if (s->slots) memset(s->slots, 0, s->cap * sizeof(bs__seen_slot));
  s->n = 0;
  s->arena_size = 0;
  s->full = 0;
}

static uint64_t seen_hash(const bs_op *op) {
  uint64_t h =
      XXH3_64bits_withSeed(op->object_type.data, op->object_type.size, op->object_type.size);
  h = XXH3_64bits_withSeed(op->object_id.data, op->object_id.size, h ^ op->object_id.size);
  h = XXH3_64bits_withSeed(op->subkey.data, op->subkey.size, h + op->subkey.size);
  return h ? h : 1;
}

static int seen_equal(const bs__seen_set *s, size_t off, const bs_op *op) {
  const unsigned char *p = s->arena + off;
  size_t ot = (size_t)p[0] | (size_t)p[1] << 8, oi = (size_t)p[2] | (size_t)p[3] << 8;
  size_t sk = p[4];
  if (ot != op->object_type.size || oi != op->object_id.size || sk != op->subkey.size) return 0;
  p += SEEN_HDR;
  if (ot && memcmp(p, op->object_type.data, ot)) return 0;
  p += ot;
  if (oi && memcmp(p, op->object_id.data, oi)) return 0;
  p += oi;
  return !sk || memcmp(p, op->subkey.data, sk) == 0;
}

static bs__seen_slot *seen_probe(const bs__seen_set *s, uint64_t h, const bs_op *op) {
  bs__seen_slot *slots = s->slots;
  size_t mask = s->cap - 1, i = (size_t)h & mask;
  for (;;) {
    if (slots[i].hash == 0) return &slots[i];
    if (slots[i].hash == h && seen_equal(s, slots[i].off, op)) return &slots[i];
    i = (i + 1) & mask;
  }
}

/* Doubles the slot table (or creates it) when the load passes 1/2 and memory allows. */
static int seen_grow_slots(bs__seen_set *s) {
  size_t ncap = s->cap ? s->cap * 2 : SEEN_MIN_SLOTS, i;
  bs__seen_slot *old = s->slots, *fresh;
  if (ncap > SIZE_MAX / sizeof(bs__seen_slot)) return 0;
  if (ncap * sizeof(bs__seen_slot) + s->arena_cap > s->limit) return 0;
  fresh = bs__calloc(s->alloc, ncap, sizeof(bs__seen_slot));
  if (!fresh) return 0;
  s->slots = fresh;
  for (i = 0; i < s->cap; i++) {
    if (old[i].hash) {
      size_t j = (size_t)old[i].hash & (ncap - 1);
      while (fresh[j].hash) j = (j + 1) & (ncap - 1);
      fresh[j] = old[i];
    }
  }
  s->cap = ncap;
  bs__free(s->alloc, old);
  return 1;
}

static int seen_reserve_arena(bs__seen_set *s, size_t need) {
  size_t ncap;
  unsigned char *p;
  if (s->arena_cap - s->arena_size >= need) return 1;
  ncap = s->arena_cap ? s->arena_cap : 4096;
  while (ncap - s->arena_size < need) {
    if (ncap > SIZE_MAX / 2) return 0;
    ncap *= 2;
  }
  if (s->cap * sizeof(bs__seen_slot) + ncap > s->limit) {
    /* the last step may use what is left below the limit */
    size_t room = s->limit - s->cap * sizeof(bs__seen_slot);
    if (s->limit < s->cap * sizeof(bs__seen_slot) || room < s->arena_size + need) return 0;
    ncap = room;
  }
  p = bs__realloc(s->alloc, s->arena, ncap);
  if (!p) return 0;
  s->arena = p;
  s->arena_cap = ncap;
  return 1;
}

int bs__seen_find(const bs__seen_set *s, const bs_op *op, uint64_t *latest) {
  bs__seen_slot *slot;
  if (!s->cap) return 0;
  slot = seen_probe(s, seen_hash(op), op);
  if (!slot->hash) return 0;
  *latest = slot->op_id;
  return 1;
}

int bs__seen_visit(bs__seen_set *s, const bs_op *op, uint64_t *latest) {
  uint64_t h = seen_hash(op);
  size_t need = SEEN_HDR + op->object_type.size + op->object_id.size + op->subkey.size;
  bs__seen_slot *slot;
  unsigned char *p;
  if (s->cap) {
    slot = seen_probe(s, h, op);
    if (slot->hash) {
      *latest = slot->op_id;
      return 1;
    }
  }
  if (s->full) return 0;
  if ((s->n + 1) * 2 > s->cap && !seen_grow_slots(s)) {
    s->full = 1;
    return 0;
  }
  /* lengths fit the header: ops decode with u16/u16/u8 lengths */
  if (!seen_reserve_arena(s, need)) {
    s->full = 1;
    return 0;
  }
  p = s->arena + s->arena_size;
  p[0] = (unsigned char)op->object_type.size;
  p[1] = (unsigned char)(op->object_type.size >> 8);
  p[2] = (unsigned char)op->object_id.size;
  p[3] = (unsigned char)(op->object_id.size >> 8);
  p[4] = (unsigned char)op->subkey.size;
  p += SEEN_HDR;
  if (op->object_type.size) memcpy(p, op->object_type.data, op->object_type.size);
  p += op->object_type.size;
  if (op->object_id.size) memcpy(p, op->object_id.data, op->object_id.size);
  p += op->object_id.size;
  if (op->subkey.size) memcpy(p, op->subkey.data, op->subkey.size);
  slot = seen_probe(s, h, op); /* the table may have been rebuilt */
  slot->hash = h;
  slot->op_id = op->op_id;
  slot->off = s->arena_size;
  s->arena_size += need;
  s->n++;
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

int bs__compact_plan_move(bs__seen_set *s, const bs_op *op, uint64_t *target_out) {
  uint64_t latest;
  if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) return 0;
  /* latest == op_id: the scan met this op again (a retried transaction); it is the row's
   * latest, not superseded. */
  if (bs__seen_visit(s, op, &latest) && latest > op->op_id) {
    *target_out = latest;
    return 1;
  }
  return 0;
}

int bs__compact_superseded(const bs__seen_set *s, const bs_op *op, uint64_t *target_out) {
  uint64_t latest;
  if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) return 0;
  if (!bs__seen_find(s, op, &latest) || latest <= op->op_id) return 0;
  *target_out = latest;
  return 1;
}

int bs__compact_scan_op(bs__compact_scan *p, bs__seen_set *s, const bs_op *op) {
  uint64_t target;
  p->run++;
  if (op->type == BS_OP_CLEAR) return 0; /* a CLEAR has nothing before it */
  if (bs__compact_plan_move(s, op, &target)) {
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

uint64_t bs__clear_span_start(const bs__clear_acc *a, uint64_t clear_start, uint64_t clear_op) {
  if (clear_op && clear_start && clear_start < a->first_op) return clear_start;
  return a->first_op;
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
