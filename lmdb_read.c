/*
 * lmdb_read.c: the read side of the LMDB backend. Checkpoints, bucket data in chunks, bucket
 * checksums (running value in the bucket state minus the tail above C), checksum ranges for the
 * cache, checkpoint changes from the `changes` records, stream status, and the database-wide
 * stat (verify is lmdb_verify.c). Every call runs in exactly one read transaction, so every answer is one
 * consistent snapshot; ops are handed out zero-copy (bs_op fields point into the map) and stay
 * valid only while the callback runs, since the transaction ends when the call returns.
 */
#include "lmdb_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>

static bs__lmdb_db *lmdb_of(bs_storage *st) {
  return ((bs__lmdb_storage *)st)->db;
}

/* ---- Bucket lookup -------------------------------------------------------------------------- */

typedef struct bucket_ref {
  int found;
  uint64_t id;
  bs__bucket_state state;
} bucket_ref;

/* Bucket lookups of one read call. Two cursors (buckets: name -> id; bstate: id -> state)
 * live for the whole call instead of one mdb_get each: on a positioned cursor LMDB's MDB_SET
 * searches the current leaf page before walking down from the root, and mdb_get pays a cursor
 * setup per lookup. The front hands bucket_data its requests sorted by name, so consecutive
 * names mostly sit on the same leaf page. */
typedef struct bucket_finder {
  bs__lmdb_db *db;
  MDB_txn *txn;
  uint32_t stream;
  MDB_cursor *names, *states;
  bs__lmdb_opc ops; /* the ops of the buckets found: every reader of this file walks them */
  int cleared;      /* a clear of the stream is pending: its buckets are deleted (no bucket) */
} bucket_finder;

static int finder_open(bucket_finder *f, bs__lmdb_db *db, MDB_txn *txn, uint32_t stream,
                       bs_error *err) {
  bs__stream_rec rec;
  int mrc;
  f->db = db;
  f->txn = txn;
  f->stream = stream;
  if ((mrc = bs__stream_rec_get(db, txn, stream, &rec, err)) != BS_OK) return mrc;
  f->cleared = rec.clear_pending;
  if ((mrc = mdb_cursor_open(txn, db->buckets, &f->names)) != 0 ||
      (mrc = mdb_cursor_open(txn, db->bstate, &f->states)) != 0)
    return bs__fail_mdb(err, mrc, "opening the bucket cursors");
  return bs__lmdb_opc_open(&f->ops, db, txn, err);
}

/* Closes what finder_open opened; a zeroed finder is a no-op. */
static void finder_close(bucket_finder *f) {
  if (f->names) mdb_cursor_close(f->names);
  if (f->states) mdb_cursor_close(f->states);
  bs__lmdb_opc_close(&f->ops);
  f->names = f->states = NULL;
}

/* The state of bucket id (named name, for the message), through the finder's bstate cursor. A
 * missing or short state is BS_ECORRUPT: every buckets entry has one. */
static int finder_state(bucket_finder *f, uint64_t id, bs_val name, bs__bucket_state *out,
                        bs_error *err) {
  unsigned char kb[BS_STATE_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc;
  bs__lmdb_state_key(kb, id);
  mrc = mdb_cursor_get(f->states, &k, &v, MDB_SET);
  if (mrc == MDB_NOTFOUND || (mrc == 0 && bs__bucket_state_decode(&v, out)))
    return bs__fail(err, BS_ECORRUPT, "bucket \"%.*s\" (id %" PRIu64 ") has no valid state",
                    bs__name_shown(name), (const char *)name.data, id);
  if (mrc) return bs__fail_mdb(err, mrc, "reading a bucket state");
  return BS_OK;
}

/* Looks up a bucket of the stream and its state. Unknown bucket: ref->found = 0, BS_OK. */
static int bucket_get(bucket_finder *f, bs_val name, bucket_ref *ref, bs_error *err) {
  int rc;

  ref->found = 0;
  if (f->cleared) return BS_OK;
  rc = bs__lmdb_bucket_id(f->db, f->txn, &f->names, f->stream, name, &ref->id, err);
  if (rc == BS_ENOTFOUND) return BS_OK; /* quiet: err was not written */
  if (rc) return rc;
  if ((rc = finder_state(f, ref->id, name, &ref->state, err))) return rc;
  ref->found = 1;
  return BS_OK;
}

/* ---- Checkpoint and status ------------------------------------------------------------------ */

static void copy_lsn(unsigned char *dst, size_t *dst_size, bs_val src) {
  size_t n = src.size < BS_MAX_LSN ? src.size : BS_MAX_LSN;
  if (n) memcpy(dst, src.data, n);
  *dst_size = n;
}

/* out: zeroed by the front */
int bs__lmdb_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  bs__lmdb_db *db = lmdb_of(st);
  MDB_txn *txn;
  bs__stream_rec rec;
  int rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err);
  if (rc) return rc;
  rc = bs__stream_rec_get(db, txn, st->stream_id, &rec, err);
  if (rc == BS_OK) {
    size_t n = rec.last_error.size < sizeof out->last_error - 1 ? rec.last_error.size
                                                                : sizeof out->last_error - 1;
    out->state = (bs_stream_state)rec.state;
    out->snapshot_done = rec.snapshot_done; /* the front: once a checkpoint exists */
    out->checkpoint = rec.checkpoint;
    out->last_persisted_op = rec.op_head;
    out->has_lsn = rec.has_checkpoint_lsn; /* a checkpoint may sit at op 0 */
    if (out->has_lsn) copy_lsn(out->lsn, &out->lsn_size, rec.checkpoint_lsn);
    out->has_resume_lsn = rec.has_resume_lsn;
    if (rec.has_resume_lsn) copy_lsn(out->resume_lsn, &out->resume_lsn_size, rec.resume_lsn);
    if (n) memcpy(out->last_error, rec.last_error.data, n); /* zeroed: terminated */
  }
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

/* ---- Bucket data ---------------------------------------------------------------------------- */

/* Serves the ops of one bucket in (after, C] to the call's chunker (rules.c), until it stops. */
static int read_bucket(bs__chunker *r, bs__lmdb_opc *oc, uint64_t checkpoint, bs_val name,
                       uint64_t id, uint64_t after, bs_error *err) {
  bs_op op;
  int rc, found;

  bs__chunker_bucket(r, name, after);
  for (rc = bs__lmdb_opc_seek_ge(oc, id, after + 1, &op, &found, err);
       rc == BS_OK && found && !r->stopped && op.op_id <= checkpoint;
       rc = bs__lmdb_opc_next(oc, &op, &found, err))
    if ((rc = bs__chunker_add(r, &op, err)) != 0) return rc;
  return rc ? rc : bs__chunker_end(r);
}

/* read_bucket in column mode (bs__chunker's cols): each chunk's ops laid out from their op
 * values as they lie in the map, without a bs_op each. The cursor hands out the first op of each
 * chunk (seek, next: a chunk that does not decode is BS_ECORRUPT as ever); the rest of the chunk
 * is walked here, in a read transaction where no op is deleted. */
static int read_bucket_cols(bs__chunker *r, bs__lmdb_opc *oc, uint64_t checkpoint, bs_val name,
                            uint64_t id, uint64_t after, bs_error *err) {
  bs_op op;
  int rc, found;
  bs__chunker_bucket(r, name, after);
  for (rc = bs__lmdb_opc_seek_ge(oc, id, after + 1, &op, &found, err); rc == BS_OK && found;
       rc = bs__lmdb_opc_next(oc, &op, &found, err)) {
    unsigned flags = bs__chunk_flags(oc->val);
    for (uint32_t i = oc->i; i < oc->n; i++) {
      if (r->stopped || oc->ids[i] > checkpoint) return bs__chunker_end(r);
      if ((rc = bs__chunker_add_value(r, oc->ids[i], oc->val + oc->off[i], oc->len[i], flags, err)))
        return rc;
    }
    oc->i = oc->n - 1; /* next: the next chunk's first op */
  }
  return rc ? rc : bs__chunker_end(r);
}

int bs__lmdb_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                         const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                         int (*on_chunk)(const bs_chunk *, void *), void *payload, bs_error *err) {
  bs__lmdb_db *db = lmdb_of(st);
  const bs_allocator *a = &db->base.alloc;
  MDB_txn *txn = NULL;
  bucket_ref *refs = NULL;
  bucket_finder f;
  bs__chunker r;
  int rc;

  BS_ASSERT(opts && opts->limit && opts->max_bytes && n_req && has_more_out); /* the front's */
  memset(&f, 0, sizeof f);
  bs__chunker_init(&r, a, opts, on_chunk, payload);
  refs = bs__calloc(a, n_req, sizeof *refs);
  if (!refs) return bs__fail(err, BS_ENOMEM, "bucket data: %zu requests", n_req);
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != 0) goto done;
  if ((rc = finder_open(&f, db, txn, st->stream_id, err)) != 0) goto done;
  /* Resolve and check every bucket first, so that a torn read fails before any chunk. */
  for (size_t i = 0; i < n_req; i++) {
    if ((rc = bucket_get(&f, req[i].bucket, &refs[i], err)) != 0) goto done;
    if (refs[i].found && (rc = bs__torn_check(refs[i].state.clear_start, refs[i].state.clear_op,
                                              checkpoint, req[i].bucket, err)) != 0)
      goto done;
  }
  for (size_t i = 0; i < n_req && !r.stopped; i++) {
    uint64_t after = req[i].after;
    if (!refs[i].found || after >= checkpoint || refs[i].state.last_op <= after) continue;
    if ((rc = (r.cols ? read_bucket_cols : read_bucket)(&r, &f.ops, checkpoint, req[i].bucket,
                                                        refs[i].id, after, err)) != 0)
      goto done;
  }
  *has_more_out = r.stopped;
done:
  finder_close(&f);
  bs__lmdb_txn_abort(db, txn);
  bs__chunker_free(&r);
  bs__free(a, refs);
  return rc;
}

/* ---- Checksums ------------------------------------------------------------------------------ */

/* Sum and count of the bucket's ops in (from, to] (bs__lmdb_ops_sum). */
static int ops_sum(bs__lmdb_opc *oc, const bucket_ref *ref, uint64_t from, uint64_t to,
                   int stop_at_clear, bs_checksum *out, int *cleared, bs_error *err) {
  if (ref->state.last_op <= from) {
    out->checksum = 0;
    out->count = 0;
    *cleared = 0;
    return BS_OK;
  }
  return bs__lmdb_ops_sum(oc, ref->id, from, to, stop_at_clear, out, cleared, err);
}

/* The bucket's (checksum, count) at C: its running value minus the ops above C. Only the tail
 * above C is read, so the cost does not depend on the bucket's size. */
static int checksum_at(bs__lmdb_opc *oc, const bucket_ref *ref, uint64_t c, bs_val name,
                       bs_checksum *out, bs_error *err) {
  bs_checksum above;
  int rc, cleared;
  if ((rc = ops_sum(oc, ref, c, UINT64_MAX, 0, &above, &cleared, err))) return rc;
  if (above.count > ref->state.count)
    return bs__fail(
        err, BS_ECORRUPT,
        "bucket \"%.*s\": its state counts %" PRIu64 " ops, %" PRIu64 " are above %" PRIu64,
        bs__name_shown(name), (const char *)name.data, ref->state.count, above.count, c);
  out->checksum = bs__cksum_sub(ref->state.checksum, above.checksum);
  out->count = ref->state.count - above.count;
  return BS_OK;
}

/* checksums (range 0: each bucket's value at `to`) and checksum_ranges (range 1: the sum over
 * (from, to], or at a CLEAR, which replaces what came before it, the whole value at `to` with
 * cleared[i] set), in one snapshot. */
static int checksum_call(bs_storage *st, uint64_t from, uint64_t to, int range,
                         const bs_val *buckets, size_t n, bs_checksum *out, int *cleared,
                         uint64_t *generation_out, bs_error *err) {
  bs__lmdb_db *db = lmdb_of(st);
  MDB_txn *txn = NULL;
  bucket_finder f;
  int rc;

  memset(&f, 0, sizeof f);
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != 0) return rc;
  if ((rc = finder_open(&f, db, txn, st->stream_id, err)) != 0) goto done;
  for (size_t i = 0; i < n; i++) {
    bucket_ref ref;
    int cl = 0;
    if ((rc = bucket_get(&f, buckets[i], &ref, err)) != 0) goto done;
    out[i].checksum = 0;
    out[i].count = 0;
    if (generation_out) generation_out[i] = ref.found ? ref.state.generation : 0;
    if (ref.found &&
        ((rc = bs__torn_check(ref.state.clear_start, ref.state.clear_op, to, buckets[i], err)) !=
             0 ||
         (range && (rc = ops_sum(&f.ops, &ref, from, to, 1, &out[i], &cl, err)) != 0) ||
         ((!range || cl) && (rc = checksum_at(&f.ops, &ref, to, buckets[i], &out[i], err)) != 0)))
      goto done;
    if (cleared) cleared[i] = cl;
  }
done:
  finder_close(&f);
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

int bs__lmdb_checksums(bs_checksum *out, uint64_t *generation_out, bs_storage *st,
                       uint64_t checkpoint, const bs_val *buckets, size_t n, bs_error *err) {
  return checksum_call(st, 0, checkpoint, 0, buckets, n, out, NULL, generation_out, err);
}

int bs__lmdb_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *generation_out,
                             bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets,
                             size_t n, bs_error *err) {
  return checksum_call(st, from, to, 1, buckets, n, out, cleared, generation_out, err);
}

/* ---- Checkpoint changes --------------------------------------------------------------------- */

/* Adds a record's list to set; a capped kind only until it is too many (bs__changes_too_many),
 * after which the front reports invalidate-all (storage.c changes_capped). */
static int add_list(bs__vset *s, const bs_allocator *a, const bs__change_list *l, int capped) {
  const unsigned char *q = l->p;
  for (uint32_t i = 0; i < l->n && !(capped && bs__changes_too_many(s->n)); i++)
    if (bs__vset_add(s, a, bs__lmdb_change_next(&q))) return BS_ENOMEM;
  return BS_OK;
}

/* Records are keyed by the highest op id they cover and store the first one. A record counts
 * when its ops [first, last] meet (from, to]; its users also when it lies in
 * [bs__changes_users_from(from), to] (a record without ops among them). */
static int collect_changes(MDB_cursor *cur, uint32_t stream, uint64_t from, uint64_t to,
                           const bs_allocator *a, bs__vset sets[3], bs_checkpoint_changes *ch,
                           bs_error *err) {
  unsigned char kb[BS_CHANGE_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  uint64_t users_from = bs__changes_users_from(from);
  int mrc;

  bs__lmdb_change_key(kb, stream, users_from < from ? users_from : from, 0);
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs__change_rec r;
    int ops_meet, users_meet;
    if (!bs__lmdb_in_stream(&k, stream)) break;
    if (bs__lmdb_change_decode(&k, &v, &r))
      return bs__fail(err, BS_ECORRUPT,
                      "change record of stream %" PRIu32 " (key %zu bytes, value %zu bytes) does "
                      "not decode",
                      stream, k.mv_size, v.mv_size);
    if (r.last > to && r.first > to) break; /* later records start later still */
    ops_meet = r.first <= r.last && r.first <= to && r.last > from;
    users_meet = ops_meet || (r.last >= users_from && r.last <= to);
    if (ops_meet) {
      if (r.flags & BS_CHANGE_TOO_MANY_BUCKETS) ch->invalidate_data_buckets = 1;
      if (r.flags & BS_CHANGE_TOO_MANY_LOOKUPS) ch->invalidate_parameter_buckets = 1;
      if (add_list(&sets[0], a, &r.buckets, 1) || add_list(&sets[1], a, &r.lookups, 1))
        return bs__fail(err, BS_ENOMEM, "checkpoint changes: out of memory");
    }
    if (users_meet && add_list(&sets[2], a, &r.users, 0))
      return bs__fail(err, BS_ENOMEM, "checkpoint changes: out of memory");
  }
  if (mrc != 0 && mrc != MDB_NOTFOUND) return bs__fail_mdb(err, mrc, "reading checkpoint changes");
  return BS_OK;
}

int bs__lmdb_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                bs_error *err) {
  bs__lmdb_db *db = lmdb_of(st);
  const bs_allocator *a = &db->base.alloc;
  MDB_txn *txn = NULL;
  MDB_cursor *cur = NULL;
  bs__stream_rec rec;
  bs_checkpoint_changes ch;
  bs__vset sets[3];
  int rc;

  memset(&ch, 0, sizeof ch);
  memset(sets, 0, sizeof sets);
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != 0) return rc;
  if ((rc = bs__stream_rec_get(db, txn, st->stream_id, &rec, err)) != 0) goto done;
  if (bs__changes_fenced(from, rec.changes_fence))
    ch.invalidate_data_buckets = ch.invalidate_parameter_buckets = 1;
  if ((rc = mdb_cursor_open(txn, db->changes, &cur)) != 0) {
    rc = bs__fail_mdb(err, rc, "opening the changes cursor");
    goto done;
  }
  if (!rec.clear_pending &&
      (rc = collect_changes(cur, st->stream_id, from, to, a, sets, &ch, err)) != 0)
    goto done;
  ch.updated_buckets = sets[0].v;
  ch.n_updated_buckets = sets[0].n;
  ch.updated_lookups = sets[1].v;
  ch.n_updated_lookups = sets[1].n;
  ch.updated_write_checkpoint_users = sets[2].v;
  ch.n_updated_write_checkpoint_users = sets[2].n;
  rc = fn(&ch, payload);
done:
  if (cur) mdb_cursor_close(cur);
  bs__lmdb_txn_abort(db, txn);
  for (int i = 0; i < 3; i++) bs__vset_free(&sets[i], a);
  return rc;
}

/* ---- Listing buckets ------------------------------------------------------------------------ */

/* The stream's part of `buckets` (u32be stream | name -> u64 id) is already in name order, so
 * the listing is one cursor walk from stream | start_after, with each bucket's figures taken
 * from its state in bstate; all in one read txn. Buckets whose ops compaction removed entirely
 * (count 0) are skipped, like the memory backend's. */
int bs__lmdb_list_buckets(bs_storage *st, bs_val start_after,
                          int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                          bs_error *err) {
  bs__lmdb_db *db = lmdb_of(st);
  unsigned char kb[BS_BUCKET_KEY_MAX];
  MDB_txn *txn = NULL;
  bucket_finder f;
  MDB_val k, v;
  int mrc, rc;

  memset(&f, 0, sizeof f);
  BS_ASSERT(start_after.size <= BS_MAX_BUCKET_NAME); /* checked by the front */
  if ((rc = bs__lmdb_bucket_key(kb, st->stream_id, start_after, &k, err))) return rc;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != 0) return rc;
  if ((rc = finder_open(&f, db, txn, st->stream_id, err)) != 0) goto done;
  mrc = f.cleared ? MDB_NOTFOUND : mdb_cursor_get(f.names, &k, &v, MDB_SET_RANGE);
  for (; mrc == 0; mrc = mdb_cursor_get(f.names, &k, &v, MDB_NEXT)) {
    bs_bucket_info info;
    bs__bucket_state s;
    uint32_t stream;
    uint64_t id;
    if (k.mv_size < 4 || memcmp(k.mv_data, kb, 4) != 0) break; /* past the stream */
    if (bs__lmdb_bucket_entry_decode(&k, &v, &stream, &info.name, &id)) {
      rc = bs__fail(err, BS_ECORRUPT, "buckets entry of stream %" PRIu32 " does not decode",
                    st->stream_id);
      goto done;
    }
    if (bs__val_eq(info.name, start_after)) continue; /* strictly after */
    if ((rc = finder_state(&f, id, info.name, &s, err))) goto done;
    if (s.count == 0) continue;
    info.checksum = s.checksum;
    info.count = s.count;
    info.last_op = s.last_op;
    info.bytes = s.bytes;
    info.generation = s.generation;
    info.changes = bs__compact_changes(s.count, s.compacted_count, s.last_op, s.compacted_op);
    if ((rc = fn(&info, payload)) != 0) goto done; /* the caller's value, unchanged */
  }
  rc = mrc == MDB_NOTFOUND || mrc == 0 ? BS_OK : bs__fail_mdb(err, mrc, "walking buckets");
done:
  finder_close(&f);
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

/* ---- Stat ----------------------------------------------------------------------------------- */

static int dbi_entries(MDB_txn *txn, MDB_dbi dbi, uint64_t *out, const char *what, bs_error *err) {
  MDB_stat s;
  int rc = mdb_stat(txn, dbi, &s);
  if (rc) return bs__fail_mdb(err, rc, what);
  *out = s.ms_entries;
  return BS_OK;
}

/* LMDB's free list is its sub-database 0: each value is an array of page numbers whose first
 * element is their count (mdb_stat -f reads it the same way). */
static int free_bytes(bs__lmdb_db *db, MDB_txn *txn, uint64_t *out, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  MDB_stat ms;
  uint64_t pages = 0;
  int mrc;
  *out = 0;
  if ((mrc = mdb_env_stat(db->env, &ms)) != 0 || (mrc = mdb_cursor_open(txn, 0, &cur)) != 0)
    return bs__fail_mdb(err, mrc, "reading the free list");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    if (v.mv_size >= sizeof(size_t)) {
      size_t n;
      memcpy(&n, v.mv_data, sizeof n);
      pages += n;
    }
  mdb_cursor_close(cur);
  if (mrc != MDB_NOTFOUND) return bs__fail_mdb(err, mrc, "reading the free list");
  *out = pages * ms.ms_psize;
  return BS_OK;
}

/* Counts into *n the entries of dbi whose key starts with prefix. */
static int prefix_entries(MDB_txn *txn, MDB_dbi dbi, const unsigned char *prefix, size_t plen,
                          uint64_t *n, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k = {plen, (void *)prefix}, v;
  int mrc;
  if ((mrc = mdb_cursor_open(txn, dbi, &cur)) != 0) return bs__fail_mdb(err, mrc, "stat");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
       mrc == 0 && k.mv_size >= plen && memcmp(k.mv_data, prefix, plen) == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    ++*n;
  mdb_cursor_close(cur);
  return mrc == 0 || mrc == MDB_NOTFOUND ? BS_OK : bs__fail_mdb(err, mrc, "stat");
}

/* Adds to *f the records of a stream whose clear is pending: still in the file, but deleted for
 * every reader, so stat takes them off its totals. */
static int fenced_records(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, bs_stat *f,
                          bs_error *err) {
  unsigned char pk[1 + BS_STREAM_PREFIX_SIZE];
  MDB_cursor *cur;
  MDB_val k = {BS_STREAM_PREFIX_SIZE, pk}, v;
  int mrc, rc = BS_OK;
  bs__lmdb_stream_prefix(pk, stream);
  if ((mrc = mdb_cursor_open(txn, db->buckets, &cur)) != 0) return bs__fail_mdb(err, mrc, "stat");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
       mrc == 0 && bs__lmdb_in_stream(&k, stream) && rc == BS_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint64_t id = 0;
    f->buckets++;
    if ((rc = bs__lmdb_bucket_id_decode(&v, &id, err)) == BS_OK) {
      rc = bs__lmdb_ops_stat(db, txn, &id, f, err);
    }
  }
  mdb_cursor_close(cur);
  if (rc != BS_OK) return rc;
  if (mrc != 0 && mrc != MDB_NOTFOUND) return bs__fail_mdb(err, mrc, "stat");
  if ((rc = prefix_entries(txn, db->params, pk, BS_STREAM_PREFIX_SIZE, &f->parameter_entries,
                           err)) != BS_OK ||
      (rc = prefix_entries(txn, db->source, pk, BS_STREAM_PREFIX_SIZE, &f->source_records, err)) !=
          BS_OK)
    return rc;
  pk[0] = BS_WCP_CUSTOM_TAG; /* custom checkpoints: 'C' u32be stream */
  bs__lmdb_stream_prefix(pk + 1, stream);
  return prefix_entries(txn, db->wcp, pk, sizeof pk, &f->write_checkpoints, err);
}

int bs__lmdb_stat(bs_stat *out, bs_db *base, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  MDB_txn *txn = NULL;
  MDB_cursor *cur = NULL;
  MDB_val k, v;
  unsigned char sk[BS_STREAM_KEY_SIZE];
  bs_stat f = {0}; /* what fenced streams still hold */
  int rc, mrc, fd;
  struct stat sb;

  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != 0) return rc; /* out: zeroed */
  if ((rc = dbi_entries(txn, db->buckets, &out->buckets, "stat of buckets", err)) ||
      (rc = dbi_entries(txn, db->params, &out->parameter_entries, "stat of params", err)) ||
      (rc = dbi_entries(txn, db->source, &out->source_records, "stat of source", err)))
    goto done;
  /* write checkpoints: managed 'M' and custom 'C' records, not the 'P' pending markers */
  if ((mrc = mdb_cursor_open(txn, db->wcp, &cur)) != 0) goto mdb_fail;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs__wcp_key wk;
    if (bs__lmdb_wcp_key_decode(&k, &wk) == BS_OK &&
        (wk.tag == BS_WCP_MANAGED_TAG || wk.tag == BS_WCP_CUSTOM_TAG))
      out->write_checkpoints++;
  }
  if (mrc != MDB_NOTFOUND) goto mdb_fail;
  mdb_cursor_close(cur);
  cur = NULL;
  /* streams: the 'S' keys of meta */
  if ((mrc = mdb_cursor_open(txn, db->meta, &cur)) != 0) goto mdb_fail;
  bs__lmdb_stream_key(sk, 0);
  k.mv_size = sizeof sk;
  k.mv_data = sk;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs__stream_rec r;
    uint32_t id;
    if (bs__lmdb_stream_key_decode(&k, &id) != BS_OK) break;
    out->streams++;
    /* a record that does not decode is verify's to report */
    if (bs__stream_rec_decode(&v, &r) == BS_OK && r.clear_pending &&
        (rc = fenced_records(db, txn, id, &f, err)) != BS_OK)
      goto done;
  }
  if (mrc != MDB_NOTFOUND && mrc != 0) goto mdb_fail;
  mdb_cursor_close(cur);
  cur = NULL;
  if ((rc = bs__lmdb_ops_stat(db, txn, NULL, out, err)) != BS_OK) goto done;
  out->buckets -= f.buckets;
  out->ops_put -= f.ops_put;
  out->ops_remove -= f.ops_remove;
  out->ops_move -= f.ops_move;
  out->ops_clear -= f.ops_clear;
  out->parameter_entries -= f.parameter_entries;
  out->source_records -= f.source_records;
  out->write_checkpoints -= f.write_checkpoints;
  if (mdb_env_get_fd(db->env, &fd) == 0 && fstat(fd, &sb) == 0)
    out->file_bytes = (uint64_t)sb.st_size;
  rc = free_bytes(db, txn, &out->reclaimable_bytes, err);
  goto done;
mdb_fail:
  rc = bs__fail_mdb(err, mrc, "stat");
done:
  if (cur) mdb_cursor_close(cur);
  bs__lmdb_txn_abort(db, txn);
  return rc;
}
