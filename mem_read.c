/*
 * mem_read.c: the memory backend's reads (contract.md 5): bucket data, checksums,
 * checkpoint changes, parameter sets and the bucket listing, each under the store's lock on
 * copies that the callbacks get after it is released.
 */
#include "mem_internal.h"

/* ---- Reads ----------------------------------------------------------------------------------- */

/* The chunks of one call, kept (copied) while the lock is held and handed out after it. */
typedef struct mem_kept {
  const bs_allocator *a;
  bs_chunk *v; /* each chunk's ops and their bytes are one allocation */
  size_t n, cap;
  int oom;
} mem_kept;

/* The chunker's on_chunk (rules.c): copies the chunk, its ops and their strings. */
static int keep_chunk(const bs_chunk *ch, void *payload) {
  mem_kept *k = payload;
  size_t bytes = 0;
  bs_op *ops;
  unsigned char *p;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    bytes += o->object_type.size + o->object_id.size + o->subkey.size + o->data.size;
  }
  if (BS_GROW(k->a, k->v, k->cap, k->n + 1) ||
      !(ops = bs__malloc(k->a, ch->n_ops * sizeof *ops + bytes + 1))) {
    k->oom = 1;
    return BS_ENOMEM;
  }
  p = (unsigned char *)(ops + ch->n_ops);
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *o = &ch->ops[i];
    ops[i] = *o;
    ops[i].object_type = arena_put(&p, o->object_type);
    ops[i].object_id = arena_put(&p, o->object_id);
    ops[i].subkey = arena_put(&p, o->subkey);
    ops[i].data = arena_put(&p, o->data);
  }
  k->v[k->n] = *ch;
  k->v[k->n++].ops = ops;
  return BS_OK;
}

int bs__mem_bucket_data(int *has_more_out, bs_storage *st, uint64_t c, const bs_bucket_request *req,
                        size_t n_req, const bs_batch_options *opts,
                        int (*on_chunk)(const bs_chunk *, void *), void *payload, bs_error *err) {
  mem_storage *ms = MS(st);
  mem_kept kept = {ALLOC(ms->db), NULL, 0, 0, 0};
  bs__chunker k;
  int rc = BS_OK;
  bs__chunker_init(&k, kept.a, opts, keep_chunk, &kept); /* the chunking rule of every backend */
  lock(ms->db);
  for (size_t i = 0; i < n_req && !rc; i++) { /* a torn read fails before any chunk */
    mem_bucket *b = bucket_find(ms->s, req[i].bucket, NULL);
    if (b) rc = bs__torn_check(b->clear_start, b->clear_op, c, req[i].bucket, err);
  }
  for (size_t i = 0; i < n_req && !rc && !k.stopped; i++) {
    mem_bucket *b = bucket_find(ms->s, req[i].bucket, NULL);
    if (!b) continue;
    bs__chunker_bucket(&k, req[i].bucket, req[i].after);
    for (size_t j = 0; j < b->n && b->ops[j].op_id <= c && !rc && !k.stopped; j++)
      if (b->ops[j].op_id > req[i].after) rc = bs__chunker_add(&k, &b->ops[j], err);
    if (!rc) rc = bs__chunker_end(&k);
  }
  unlock(ms->db);
  if (kept.oom) rc = enomem(err, "bucket data");
  /* Callbacks outside the lock, on the copies. */
  for (size_t i = 0; i < kept.n && !rc; i++) rc = on_chunk(&kept.v[i], payload);
  if (!rc) *has_more_out = k.stopped;
  for (size_t i = 0; i < kept.n; i++) bs__free(kept.a, (void *)kept.v[i].ops);
  bs__free(kept.a, kept.v);
  bs__chunker_free(&k);
  return rc;
}

/* Sum and count of b's ops in (from, to]; *cleared: the range holds a CLEAR, and the value is
 * then the one at `to` from zero (the cache's base is replaced, contract.md 5.3). */
static bs_checksum sum_range(const mem_bucket *b, uint64_t from, uint64_t to, int *cleared) {
  bs_checksum r = {0, 0}, all = {0, 0};
  *cleared = 0;
  for (size_t k = 0; b && k < b->n && b->ops[k].op_id <= to; k++) { /* ops ascend by id */
    const bs_op *o = &b->ops[k];
    all.checksum = bs__cksum_add(all.checksum, o->checksum);
    all.count++;
    if (o->op_id <= from) continue;
    *cleared |= o->type == BS_OP_CLEAR;
    r.checksum = bs__cksum_add(r.checksum, o->checksum);
    r.count++;
  }
  return *cleared ? all : r;
}

int bs__mem_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st,
                            uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                            bs_error *err) {
  mem_storage *ms = MS(st);
  int rc = BS_OK;
  lock(ms->db);
  for (size_t i = 0; i < n; i++) {
    mem_bucket *b = bucket_find(ms->s, buckets[i], NULL);
    int cl;
    if (b && (rc = bs__torn_check(b->clear_start, b->clear_op, to, buckets[i], err))) break;
    out[i] = sum_range(b, from, to, &cl);
    if (cleared) cleared[i] = cl;
    if (gen) gen[i] = b ? b->generation : 0;
  }
  unlock(ms->db);
  return rc;
}

/* The value at C is the range (0, C]. */
int bs__mem_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t c,
                      const bs_val *buckets, size_t n, bs_error *err) {
  return bs__mem_checksum_ranges(out, NULL, gen, st, 0, c, buckets, n, err);
}

int bs__mem_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                               int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                               bs_error *err) {
  mem_storage *ms = MS(st);
  mem_stream *s = ms->s;
  const bs_allocator *a = ALLOC(ms->db);
  bs__vset sets[3];                     /* buckets, lookups, users, in this snapshot's memory */
  bs_val *copy[3] = {NULL, NULL, NULL}; /* of the sets, handed out after the lock */
  bs_checkpoint_changes ch;
  int rc = BS_OK;
  memset(&ch, 0, sizeof ch);
  memset(sets, 0, sizeof sets);
  lock(ms->db);
  /* below a fence the range is not known; a kind too many (bs__changes_too_many) the front
   * reports as invalidate-all (storage.c changes_capped), so collecting stops there */
  ch.invalidate_data_buckets = ch.invalidate_parameter_buckets =
      bs__changes_fenced(from, s->m.row.changes_fence);
  for (size_t i = 0; i < s->nbch && !bs__changes_too_many(sets[0].n); i++)
    if (s->bch[i].id > from && s->bch[i].id <= to &&
        bs__vset_add(&sets[0], a, s->buckets[s->bch[i].bucket]->name))
      goto nomem;
  for (size_t i = 0; i < s->nparams && !bs__changes_too_many(sets[1].n); i++)
    if (s->params[i].id > from && s->params[i].id <= to &&
        bs__vset_add(&sets[1], a, s->params[i].key))
      goto nomem;
  /* users are filed under a flush's op head (custom) or a checkpoint (managed) */
  for (size_t i = 0; i < s->nuch; i++)
    if (s->uch[i].id >= bs__changes_users_from(from) && s->uch[i].id <= to &&
        bs__vset_add(&sets[2], a, s->uch[i].user))
      goto nomem;
  for (int i = 0; i < 3; i++)
    if (vals_copy(a, sets[i].v, sets[i].n, &copy[i])) goto nomem;
  unlock(ms->db);
  ch.updated_buckets = copy[0];
  ch.n_updated_buckets = sets[0].n;
  ch.updated_lookups = copy[1];
  ch.n_updated_lookups = sets[1].n;
  ch.updated_write_checkpoint_users = copy[2];
  ch.n_updated_write_checkpoint_users = sets[2].n;
  rc = fn(&ch, payload);
  goto out;
nomem:
  unlock(ms->db);
  rc = enomem(err, "checkpoint changes");
out:
  for (int i = 0; i < 3; i++) {
    bs__vset_free(&sets[i], a);
    bs__free(a, copy[i]);
  }
  return rc;
}

int bs__mem_parameter_sets(bs_storage *st, uint64_t c, const bs_val *lookups, size_t n,
                           size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                           bs_error *err) {
  mem_storage *ms = MS(st);
  mem_stream *s = ms->s;
  const bs_allocator *a = ALLOC(ms->db);
  bs_val *rows = NULL, *copy = NULL;
  size_t nrows = 0, crows = 0;
  int rc = BS_OK;
  lock(ms->db);
  if ((rc = bs__param_horizon_check(c, s->m.row.param_horizon, err))) goto locked_out;
  for (size_t i = 0; i < n; i++) {
    mem_param first = {.key = lookups[i]}; /* table 0 names no table: before the lookup's rows */
    /* the lookup's run, its rows in the order handed out: each row's entry at C is its newest
     * at or below C */
    for (size_t k = param_lower(s, &first);
         k < s->nparams && bs__val_eq(s->params[k].key, lookups[i]); k++) {
      if (s->params[k].id > c || param_newer(s, k, c)) continue;
      for (size_t r = 0; r < s->params[k].nrows; r++) {
        if (BS_GROW(a, rows, crows, nrows + 1)) goto nomem;
        rows[nrows++] = s->params[k].rows[r];
      }
    }
  }
  if ((rc = bs__param_limit_check(nrows, limit, err))) goto locked_out;
  if (vals_copy(a, rows, nrows, &copy)) goto nomem;
  unlock(ms->db);
  for (size_t i = 0; i < nrows && !rc; i++) rc = fn(&copy[i], payload);
  goto out;
nomem:
  rc = enomem(err, "parameter sets");
locked_out:
  unlock(ms->db);
out:
  bs__free(a, rows);
  bs__free(a, copy);
  return rc;
}

/* ---- Listing buckets ------------------------------------------------------------------------ */

static int info_cmp(const void *x, const void *y) {
  return bs__val_cmp(((const bs_bucket_info *)x)->name, ((const bs_bucket_info *)y)->name);
}

/* Naive: under the lock, copy the figures and names of every bucket after start_after; sort;
 * then call fn without the lock (so that fn may call back into the library). Buckets left
 * empty (a rolled-back transaction created them; compaction emptied them) are skipped. */
int bs__mem_list_buckets(bs_storage *st, bs_val start_after,
                         int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                         bs_error *err) {
  mem_storage *ms = MS(st);
  const bs_allocator *a = ALLOC(ms->db);
  mem_stream *s;
  bs_bucket_info *v;
  unsigned char *arena = NULL, *p;
  size_t n = 0, bytes = 0;
  int rc = BS_OK;

  lock(ms->db);
  s = ms->s;
  v = bs__malloc(a, (s->nbuckets ? s->nbuckets : 1) * sizeof *v); /* room for every bucket */
  for (size_t i = 0; v && i < s->nbuckets; i++) {
    const mem_bucket *b = s->buckets[i];
    bs_bucket_info *in = &v[n];
    bs_checksum sum;
    int cl;
    if (!b->n || bs__val_cmp(b->name, start_after) <= 0) continue;
    sum = sum_range(b, 0, UINT64_MAX, &cl);
    in->name = b->name; /* the store's: copied into the arena below */
    in->checksum = sum.checksum;
    in->count = sum.count;
    in->last_op = last_op_of(b);
    in->bytes = bucket_bytes(b);
    in->generation = b->generation;
    in->changes = bs__compact_changes(b->n, b->compacted_count, in->last_op, b->compacted_op);
    bytes += b->name.size;
    n++;
  }
  if (v && (p = arena = bs__malloc(a, bytes)))
    for (size_t i = 0; i < n; i++) v[i].name = arena_put(&p, v[i].name);
  unlock(ms->db);
  if (!arena) rc = enomem(err, "list buckets");
  if (!rc) qsort(v, n, sizeof *v, info_cmp);
  for (size_t i = 0; i < n && !rc; i++) rc = fn(&v[i], payload); /* the caller's value, unchanged */
  bs__free(a, v);
  bs__free(a, arena);
  return rc;
}
