/*
 * reads.c: the reads of contract.md 5 written once over a backend's storage primitives
 * (internal.h, "Generic reads"): bucket data, checksums and checksum ranges, the bucket listing,
 * checkpoint changes and parameter sets, and verify's op walk. A backend gives a snapshot
 * (begin/end), its buckets and their ops, its change log and its parameter entries; the rules
 * (torn reads, the chunking, a range holding a CLEAR, the listing's figures, the change-record
 * cap and fence, the parameter horizon and limit, verify.c's op rules) are applied here.
 * Nothing of the caller runs inside the snapshot: what a call hands out is copied in it and
 * handed out after end, so a callback may call the library (the memory backend's snapshot is
 * its one mutex). A backend that can do better in bulk keeps
 * an executor of its own for a slot (LMDB's chunked op reads and running sums, PostgreSQL's SQL);
 * the memory backend runs these.
 */
#include "internal.h"

#include <stdlib.h>

static int nomem(bs_error *err, const char *what) {
  return bs__fail(err, BS_ENOMEM, "out of memory (%s)", what);
}

/* ---- Bucket data ---------------------------------------------------------------------------- */

/* The chunks of one call, copied in the snapshot and handed out after it. */
typedef struct kept {
  const bs_allocator *a;
  bs_chunk *v; /* each chunk's ops and their bytes are one allocation */
  size_t n, cap;
  int oom;
} kept;

/* The chunker's on_chunk (rules.c): copies the chunk, its ops and their strings. */
static int keep_chunk(const bs_chunk *ch, void *payload) {
  kept *k = payload;
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
    ops[i].object_type = bs__val_put(&p, o->object_type);
    ops[i].object_id = bs__val_put(&p, o->object_id);
    ops[i].subkey = bs__val_put(&p, o->subkey);
    ops[i].data = bs__val_put(&p, o->data);
  }
  k->v[k->n] = *ch;
  k->v[k->n++].ops = ops;
  return BS_OK;
}

typedef struct chunk_walk {
  bs__chunker *k;
  bs_error *err;
} chunk_walk;

static int chunk_op(void *arg, const bs_op *op) {
  chunk_walk *w = arg;
  int rc = bs__chunker_add(w->k, op, w->err);
  return rc ? rc : w->k->stopped; /* stopped: the walk ends, has_more */
}

int bs__read_bucket_data(const bs__read_store *s, void *x, const bs_allocator *a, int *has_more,
                         uint64_t c, const bs_bucket_request *req, size_t n_req,
                         const bs_batch_options *opts, int (*on_chunk)(const bs_chunk *, void *),
                         void *payload, bs_error *err) {
  kept kp = {a, NULL, 0, 0, 0};
  bs__chunker k;
  bs__read_bucket *b = bs__calloc(a, n_req ? n_req : 1, sizeof *b);
  int *found = bs__calloc(a, n_req ? n_req : 1, sizeof *found);
  chunk_walk w = {&k, err};
  int rc;
  bs__chunker_init(&k, a, opts, keep_chunk, &kp); /* the chunking rule of every backend */
  if (!b || !found) {
    rc = nomem(err, "bucket data");
    goto out;
  }
  if ((rc = s->begin(x, err))) goto out;
  for (size_t i = 0; i < n_req && !rc; i++) /* a torn read fails before any chunk */
    if (!(rc = s->bucket(x, req[i].bucket, &b[i], &found[i], err)) && found[i])
      rc = bs__torn_check(b[i].clear_start, b[i].clear_op, c, req[i].bucket, err);
  for (size_t i = 0; i < n_req && !rc && !k.stopped; i++) {
    if (!found[i]) continue;
    bs__chunker_bucket(&k, req[i].bucket, req[i].after);
    rc = s->ops(x, &b[i], req[i].after, c, chunk_op, &w, err);
    if (rc == 1) rc = BS_OK; /* the walk stopped at the call's limit */
    if (!rc) rc = bs__chunker_end(&k);
  }
  s->end(x);
  if (kp.oom) rc = nomem(err, "bucket data");
  for (size_t i = 0; i < kp.n && !rc; i++) rc = on_chunk(&kp.v[i], payload);
  if (!rc) *has_more = k.stopped;
out:
  for (size_t i = 0; i < kp.n; i++) bs__free(a, (void *)kp.v[i].ops);
  bs__free(a, kp.v);
  bs__free(a, b);
  bs__free(a, found);
  bs__chunker_free(&k);
  return rc;
}

/* ---- Checksums ------------------------------------------------------------------------------ */

/* A bucket's sums: over (from, to] (range) and over (0, to] (all), its ops, bytes and last op. */
typedef struct sums {
  uint64_t from;
  bs_checksum range, all;
  int cleared; /* the range holds a CLEAR */
  uint64_t bytes, last_op;
} sums;

static int sum_op(void *arg, const bs_op *o) {
  sums *m = arg;
  m->all.checksum = bs__cksum_add(m->all.checksum, o->checksum);
  m->all.count++;
  m->bytes += o->data.size + o->object_type.size + o->object_id.size + o->subkey.size;
  m->last_op = o->op_id;
  if (o->op_id > m->from) {
    m->cleared |= o->type == BS_OP_CLEAR;
    m->range.checksum = bs__cksum_add(m->range.checksum, o->checksum);
    m->range.count++;
  }
  return 0;
}

int bs__read_checksum_ranges(const bs__read_store *s, void *x, bs_checksum *out, int *cleared,
                             uint64_t *gen, uint64_t from, uint64_t to, const bs_val *buckets,
                             size_t n, bs_error *err) {
  int rc;
  if ((rc = s->begin(x, err))) return rc;
  for (size_t i = 0; i < n && !rc; i++) {
    bs__read_bucket b;
    sums m = {from, {0, 0}, {0, 0}, 0, 0, 0};
    int found = 0;
    if (!(rc = s->bucket(x, buckets[i], &b, &found, err)) && found &&
        !(rc = bs__torn_check(b.clear_start, b.clear_op, to, buckets[i], err)))
      rc = s->ops(x, &b, 0, to, sum_op, &m, err);
    /* a range holding a CLEAR: the value at `to` from zero (the cache's base is replaced,
     * contract.md 5.3) */
    out[i] = m.cleared ? m.all : m.range;
    if (cleared) cleared[i] = m.cleared;
    if (gen) gen[i] = found ? b.generation : 0;
  }
  s->end(x);
  return rc;
}

/* ---- Listing buckets ------------------------------------------------------------------------ */

typedef struct listing {
  const bs__read_store *s;
  void *x;
  const bs_allocator *a;
  bs_val after;
  bs_bucket_info *v;
  size_t n, cap, bytes;
  bs_error *err;
} listing;

/* One bucket's figures, when it lies after start_after and has ops (a bucket compaction emptied,
 * or one a rolled-back transaction made, is not listed); its name stays the store's until the
 * copy at the end of the snapshot. */
static int list_one(void *arg, const bs__read_bucket *b) {
  listing *l = arg;
  sums m = {UINT64_MAX, {0, 0}, {0, 0}, 0, 0, 0};
  bs_bucket_info *in;
  int rc;
  if (bs__val_cmp(b->name, l->after) <= 0) return BS_OK;
  if ((rc = l->s->ops(l->x, b, 0, UINT64_MAX, sum_op, &m, l->err))) return rc;
  if (!m.all.count) return BS_OK;
  if (BS_GROW(l->a, l->v, l->cap, l->n + 1)) return nomem(l->err, "list buckets");
  in = &l->v[l->n++];
  in->name = b->name;
  in->checksum = m.all.checksum;
  in->count = m.all.count;
  in->last_op = m.last_op;
  in->bytes = m.bytes;
  in->generation = b->generation;
  in->changes = bs__compact_changes(m.all.count, b->compacted_count, m.last_op, b->compacted_op);
  l->bytes += b->name.size;
  return BS_OK;
}

static int info_cmp(const void *x, const void *y) {
  return bs__val_cmp(((const bs_bucket_info *)x)->name, ((const bs_bucket_info *)y)->name);
}

int bs__read_list_buckets(const bs__read_store *s, void *x, const bs_allocator *a,
                          bs_val start_after, int (*fn)(const bs_bucket_info *, void *),
                          void *payload, bs_error *err) {
  listing l = {s, x, a, start_after, NULL, 0, 0, 0, err};
  unsigned char *arena = NULL, *p;
  int rc;
  if ((rc = s->begin(x, err))) return rc;
  rc = s->buckets(x, list_one, &l, err);
  if (!rc && !(p = arena = bs__malloc(a, l.bytes + 1))) rc = nomem(err, "list buckets");
  for (size_t i = 0; i < l.n && !rc; i++) l.v[i].name = bs__val_put(&p, l.v[i].name);
  s->end(x);
  if (!rc && l.n) qsort(l.v, l.n, sizeof *l.v, info_cmp);            /* l.v NULL: no bucket */
  for (size_t i = 0; i < l.n && !rc; i++) rc = fn(&l.v[i], payload); /* the caller's value */
  bs__free(a, l.v);
  bs__free(a, arena);
  return rc;
}

/* ---- Checkpoint changes --------------------------------------------------------------------- */

typedef struct change_set {
  bs__vset set;
  const bs_allocator *a;
  int capped; /* buckets and lookups: collecting stops at too many (bs__changes_too_many) */
} change_set;

static int change_add(void *arg, bs_val name) {
  change_set *c = arg;
  if (c->capped && bs__changes_too_many(c->set.n)) return 1; /* the front invalidates all */
  return bs__vset_add(&c->set, c->a, name) ? BS_ENOMEM : BS_OK;
}

int bs__read_checkpoint_changes(const bs__read_store *s, void *x, const bs_allocator *a,
                                uint64_t from, uint64_t to,
                                int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                bs_error *err) {
  change_set sets[3] = {{{0}, a, 1}, {{0}, a, 1}, {{0}, a, 0}}; /* buckets, lookups, users */
  bs_val *copy[3] = {NULL, NULL, NULL};
  bs_checkpoint_changes ch;
  bs__stream_row row;
  int rc;
  memset(&ch, 0, sizeof ch);
  if ((rc = s->begin(x, err))) return rc;
  s->row(x, &row);
  /* below a fence the range is not known (storage.c reports invalidate-all) */
  ch.invalidate_data_buckets = ch.invalidate_parameter_buckets =
      bs__changes_fenced(from, row.changes_fence);
  /* ops and parameter entries in (from, to]; users filed in [users_from, to] (a flush's op head
   * for custom write checkpoints, a checkpoint for managed ones) */
  for (int k = 0; k < 2 && !rc && from < to; k++) {
    rc = s->changes(x, k, from + 1, to, change_add, &sets[k], err);
    if (rc == 1) rc = BS_OK; /* capped */
  }
  if (!rc && bs__changes_users_from(from) <= to)
    rc = s->changes(x, 2, bs__changes_users_from(from), to, change_add, &sets[2], err);
  for (int k = 0; k < 3 && !rc; k++)
    if (bs__vals_copy(a, sets[k].set.v, sets[k].set.n, &copy[k])) rc = BS_ENOMEM;
  s->end(x);
  if (rc == BS_ENOMEM) rc = nomem(err, "checkpoint changes");
  ch.updated_buckets = copy[0];
  ch.n_updated_buckets = sets[0].set.n;
  ch.updated_lookups = copy[1];
  ch.n_updated_lookups = sets[1].set.n;
  ch.updated_write_checkpoint_users = copy[2];
  ch.n_updated_write_checkpoint_users = sets[2].set.n;
  if (!rc) rc = fn(&ch, payload);
  for (int k = 0; k < 3; k++) {
    bs__vset_free(&sets[k].set, a);
    bs__free(a, copy[k]);
  }
  return rc;
}

/* ---- Parameter sets ------------------------------------------------------------------------- */

typedef struct rowset {
  const bs_allocator *a;
  bs_val *rows; /* their bytes the store's, until the copy at the end of the snapshot */
  size_t n, cap;
} rowset;

static int row_add(void *arg, const bs_val *rows, size_t n) {
  rowset *r = arg;
  if (!n) return BS_OK; /* a tombstone: its rows are NULL */
  if (BS_GROW(r->a, r->rows, r->cap, r->n + n)) return BS_ENOMEM;
  memcpy(r->rows + r->n, rows, n * sizeof *rows);
  r->n += n;
  return BS_OK;
}

int bs__read_parameter_sets(const bs__read_store *s, void *x, const bs_allocator *a, uint64_t c,
                            const bs_val *lookups, size_t n, size_t limit,
                            int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  rowset r = {a, NULL, 0, 0};
  bs_val *copy = NULL;
  bs__stream_row row;
  int rc;
  if ((rc = s->begin(x, err))) return rc;
  s->row(x, &row);
  rc = bs__param_horizon_check(c, row.param_horizon, err);
  for (size_t i = 0; i < n && !rc; i++)
    if (s->params(x, lookups[i], c, row_add, &r)) rc = nomem(err, "parameter sets");
  if (!rc) rc = bs__param_limit_check(r.n, limit, err);
  if (!rc && bs__vals_copy(a, r.rows, r.n, &copy)) rc = nomem(err, "parameter sets");
  s->end(x);
  for (size_t i = 0; i < r.n && !rc; i++) rc = fn(&copy[i], payload);
  bs__free(a, r.rows);
  bs__free(a, copy);
  return rc;
}

/* ---- Verify's op walk ----------------------------------------------------------------------- */

typedef struct vwalk {
  bs__verify *v;
  const bs__read_store *s;
  void *x;
  const bs__vstream *sh;
  bs__vbucket vb;
  uint64_t i;
  bs_error *err;
} vwalk;

static int verify_op(void *arg, const bs_op *op) {
  vwalk *w = arg;
  bs__verify_op(w->v, &w->vb, op,
                op->data.size + op->object_type.size + op->object_id.size + op->subkey.size);
  return 0;
}

static int verify_bucket(void *arg, const bs__read_bucket *b) {
  vwalk *w = arg;
  bs__vbucket vb = {.name = b->name,
                    .id = w->i++,
                    .stream_id = w->sh->id,
                    .stream = w->sh,
                    .last_op = b->last_op,
                    .clear_start = b->clear_start,
                    .clear_op = b->clear_op};
  int rc;
  w->vb = vb;
  rc = w->s->ops(w->x, b, 0, UINT64_MAX, verify_op, w, w->err);
  bs__verify_bucket_end(w->v, &w->vb);
  return rc;
}

int bs__read_verify(bs__verify *v, const bs__read_store *s, void *x, const bs__vstream *sh,
                    bs_error *err) {
  vwalk w = {.v = v, .s = s, .x = x, .sh = sh, .err = err};
  return s->buckets(x, verify_bucket, &w, err);
}

/* ---- The slots of a storage answered by these reads (bs__read_storage) ---------------------- */

#define RS(st) ((bs__read_storage *)(st))

int bs__read_slot_bucket_data(int *has_more_out, bs_storage *st, uint64_t c,
                              const bs_bucket_request *req, size_t n_req,
                              const bs_batch_options *opts,
                              int (*on_chunk)(const bs_chunk *, void *), void *payload,
                              bs_error *err) {
  return bs__read_bucket_data(RS(st)->reads, st, RS(st)->a, has_more_out, c, req, n_req, opts,
                              on_chunk, payload, err);
}

int bs__read_slot_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t c,
                            const bs_val *buckets, size_t n, bs_error *err) {
  return bs__read_checksum_ranges(RS(st)->reads, st, out, NULL, gen, 0, c, buckets, n, err);
}

int bs__read_slot_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st,
                                  uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                                  bs_error *err) {
  return bs__read_checksum_ranges(RS(st)->reads, st, out, cleared, gen, from, to, buckets, n, err);
}

int bs__read_slot_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                     int (*fn)(const bs_checkpoint_changes *, void *),
                                     void *payload, bs_error *err) {
  return bs__read_checkpoint_changes(RS(st)->reads, st, RS(st)->a, from, to, fn, payload, err);
}

int bs__read_slot_parameter_sets(bs_storage *st, uint64_t c, const bs_val *lookups, size_t n,
                                 size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                                 bs_error *err) {
  return bs__read_parameter_sets(RS(st)->reads, st, RS(st)->a, c, lookups, n, limit, fn, payload,
                                 err);
}

int bs__read_slot_list_buckets(bs_storage *st, bs_val start_after,
                               int (*fn)(const bs_bucket_info *, void *), void *payload,
                               bs_error *err) {
  return bs__read_list_buckets(RS(st)->reads, st, RS(st)->a, start_after, fn, payload, err);
}
