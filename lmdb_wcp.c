/*
 * lmdb_wcp.c: write checkpoints of the LMDB backend (contract.md section 7).
 *
 * Managed records are database-wide, one per full user id ('M', with a 'P' marker while a commit
 * has still to process it, and an 'H' high-water mark once cleanup deleted it, so ids never go
 * backwards); custom records are per stream, event and user ('C'), overwritten by each flush.
 * Their keys and values are the codec's (bs__lmdb_wcp_*, lmdb_internal.h).
 */
#include "lmdb_internal.h"

typedef bs__wcp_rec wcp_rec;

/* Writes record r under key; new_heads (if not NULL) replace r's encoded heads. */
static int rec_put(bs__lmdb_db *db, MDB_txn *txn, MDB_val *key, const wcp_rec *r,
                   const bs_head *new_heads, size_t n_new, bs_error *err) {
  size_t size = bs__lmdb_wcp_rec_size(r, new_heads, n_new);
  unsigned char stack[1024], *buf = stack;
  MDB_val v;
  int rc;
  if (size > sizeof stack && !(buf = (unsigned char *)bs__malloc(&db->base.alloc, size)))
    return bs__fail(err, BS_ENOMEM, "write checkpoint: out of memory");
  bs__lmdb_wcp_rec_encode(buf, r, new_heads, n_new);
  v.mv_size = size;
  v.mv_data = buf;
  rc = mdb_put(txn, db->wcp, key, &v, 0);
  if (buf != stack) bs__free(&db->base.alloc, buf);
  return rc ? bs__lmdb_fail(err, rc, "write checkpoint: put") : BS_OK;
}

/* The managed record of user into r (borrowed from the map), its key into kb and *k; *exists 0
 * when there is none. */
static int rec_get(bs__lmdb_db *db, MDB_txn *txn, bs_val user, unsigned char *kb, MDB_val *k,
                   wcp_rec *r, int *exists, bs_error *err) {
  MDB_val v;
  int rc;
  *k = bs__lmdb_wcp_user_key(kb, BS_WCP_MANAGED_TAG, user);
  rc = mdb_get(txn, db->wcp, k, &v);
  *exists = rc == 0;
  if (rc == MDB_NOTFOUND) return BS_OK;
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: get");
  if (bs__lmdb_wcp_rec_decode(&v, r))
    return bs__fail(err, BS_ECORRUPT, "write checkpoint of user %.*s does not decode",
                    (int)user.size, (const char *)user.data);
  return BS_OK;
}

/* Adds or removes the pending marker of user. */
static int pending_set(bs__lmdb_db *db, MDB_txn *txn, bs_val user, int pending, bs_error *err) {
  unsigned char buf[BS_WCP_USER_KEY_MAX];
  MDB_val k = bs__lmdb_wcp_user_key(buf, BS_WCP_PENDING_TAG, user), v = {0, NULL};
  int rc = pending ? mdb_put(txn, db->wcp, &k, &v, 0) : mdb_del(txn, db->wcp, &k, NULL);
  if (rc == MDB_NOTFOUND) rc = 0;
  return rc ? bs__lmdb_fail(err, rc, "write checkpoint: pending index") : BS_OK;
}

/* bs__head_next_fn over a record's encoded heads. */
typedef struct enc_heads {
  const unsigned char *p;
  uint32_t n;
} enc_heads;

static int enc_head_next(void *it, bs_val *conn, bs_val *lsn) {
  enc_heads *h = it;
  if (!h->n) return 0;
  bs__lmdb_wcp_head_next(&h->p, conn, lsn);
  h->n--;
  return 1;
}

/* Keys found by a scan, written after it (the cursor is not reused across writes): entries of
 * u16 key length, key, u64 an id (the record's, for cleanup). */
typedef struct key_list {
  const bs_allocator *a;
  unsigned char *p;
  size_t used, cap;
} key_list;

static int key_list_add(key_list *l, const MDB_val *k, uint64_t id, bs_error *err) {
  if (BS_GROW(l->a, l->p, l->cap, l->used + 10 + k->mv_size))
    return bs__fail(err, BS_ENOMEM, "write checkpoint: out of memory");
  bs__put_u16le(l->p + l->used, (uint32_t)k->mv_size);
  memcpy(l->p + l->used + 2, k->mv_data, k->mv_size);
  bs__put_u64le(l->p + l->used + 2 + k->mv_size, id);
  l->used += 10 + k->mv_size;
  return BS_OK;
}

/* The entry at *off (advanced past it): its key, and its id into *id. */
static MDB_val key_list_next(const key_list *l, size_t *off, uint64_t *id) {
  MDB_val k = {bs__get_u16le(l->p + *off), l->p + *off + 2};
  *id = bs__get_u64le(l->p + *off + 2 + k.mv_size);
  *off += 10 + k.mv_size;
  return k;
}

/* ---- Commit hook: marking processed -------------------------------------------------------- */

/* The commit's side of bs__managed_commit: the records waiting are those of a pending marker. */
typedef struct commit_ctx {
  bs__lmdb_db *db;
  MDB_txn *txn;
  bs_val lsn;
  key_list l; /* the pending markers' keys */
  size_t off;
  unsigned char kb[BS_WCP_USER_KEY_MAX];
  MDB_val mk; /* the current record's key (in kb) */
  wcp_rec r;  /* the current record (borrowed from the map) */
  enc_heads heads;
  int (*fn)(bs_val user, void *payload);
  void *payload;
} commit_ctx;

static int waiting_next(void *ctx, bs__wcp_waiting *w, bs_error *err) {
  commit_ctx *c = ctx;
  while (c->off < c->l.used) {
    uint64_t unused;
    MDB_val pending = key_list_next(&c->l, &c->off, &unused);
    bs__wcp_key wk;
    int exists, rc;
    bs__lmdb_wcp_key_decode(&pending, &wk); /* decoded by the scan */
    if ((rc = rec_get(c->db, c->txn, wk.user, c->kb, &c->mk, &c->r, &exists, err))) return rc;
    if (!exists) { /* record gone: drop the stale marker */
      if ((rc = pending_set(c->db, c->txn, wk.user, 0, err))) return rc;
      continue;
    }
    c->heads = (enc_heads){c->r.heads, c->r.n_heads};
    *w = (bs__wcp_waiting){wk.user, enc_head_next, &c->heads};
    return 1;
  }
  return 0;
}

static int waiting_done(void *ctx, bs_val user, bs_error *err) {
  commit_ctx *c = ctx;
  int rc;
  c->r.flags |= BS_WCP_PROCESSED;
  c->r.processed_lsn = c->lsn;
  /* r.heads points into the map: rec_put copies them into its own buffer before mdb_put */
  if ((rc = rec_put(c->db, c->txn, &c->mk, &c->r, NULL, 0, err)) ||
      (rc = pending_set(c->db, c->txn, user, 0, err)))
    return rc;
  return c->fn ? c->fn(user, c->payload) : BS_OK;
}

int bs__lmdb_wcp_mark_processed(bs__lmdb_db *db, MDB_txn *txn, bs_val lsn,
                                int (*fn)(bs_val user, void *payload), void *payload,
                                bs_error *err) {
  commit_ctx c = {.db = db, .txn = txn, .lsn = lsn, .fn = fn, .payload = payload};
  MDB_cursor *cur = NULL;
  unsigned char pk[1] = {BS_WCP_PENDING_TAG};
  MDB_val k = {sizeof pk, pk}, v;
  int rc = BS_OK, mrc = mdb_cursor_open(txn, db->wcp, &cur);
  if (mrc) return bs__fail_mdb(err, mrc, "write checkpoint: cursor");
  c.l.a = &db->base.alloc;
  /* Collect first, update after: the cursor is not reused across puts and deletes. */
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0 && rc == BS_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs__wcp_key wk;
    if (bs__lmdb_wcp_key_decode(&k, &wk) || wk.tag != BS_WCP_PENDING_TAG) break;
    rc = key_list_add(&c.l, &k, 0, err);
  }
  mdb_cursor_close(cur);
  if (rc == BS_OK && mrc && mrc != MDB_NOTFOUND)
    rc = bs__fail_mdb(err, mrc, "write checkpoint: pending scan");
  if (rc == BS_OK) rc = bs__managed_commit(lsn, waiting_next, waiting_done, &c, err);
  bs__free(c.l.a, c.l.p);
  return rc;
}

/* ---- Custom mode --------------------------------------------------------------------------- */

int bs__lmdb_wcp_put_custom(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, bs_val event,
                            bs_val user, uint64_t value, int64_t requested_at, bs_error *err) {
  unsigned char kb[BS_WCP_KEY_MAX], vb[16];
  MDB_val k, v = {bs__lmdb_wcp_custom_value(vb, value, requested_at), vb};
  int rc = bs__lmdb_wcp_custom_key(kb, &k, stream, event, user, err);
  if (rc) return rc;
  rc = mdb_put(txn, db->wcp, &k, &v, 0);
  return rc ? bs__lmdb_fail(err, rc, "custom write checkpoint: put") : BS_OK;
}

int bs__lmdb_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                       bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  BS_UNUSED(err);
  BS_ASSERT((mode == BS_WCP_MANAGED || mode == BS_WCP_CUSTOM) && event.size < sizeof ls->wcp_event);
  pthread_mutex_lock(&ls->wcp_mu);
  ls->wcp_mode = mode;
  if (event.size) memcpy(ls->wcp_event, event.data, event.size);
  ls->wcp_event_size = event.size;
  pthread_mutex_unlock(&ls->wcp_mu);
  return BS_OK;
}

/* The handle's mode, and its event into event (sizeof ls->wcp_event bytes; NULL: not needed). */
static bs_write_checkpoint_mode wcp_mode_of(bs__lmdb_storage *ls, char *event, size_t *size) {
  bs_write_checkpoint_mode m;
  pthread_mutex_lock(&ls->wcp_mu);
  m = ls->wcp_mode;
  if (event) {
    *size = ls->wcp_event_size;
    if (*size) memcpy(event, ls->wcp_event, *size);
  }
  pthread_mutex_unlock(&ls->wcp_mu);
  return m;
}

/* ---- Managed mode: creating ---------------------------------------------------------------- */

typedef struct create_ctx {
  bs__lmdb_db *db;
  const bs_managed_request *req, **win; /* the batch and its winner per user */
  size_t n, nw;
  uint64_t *ids_out;
  int should_advance;
  int64_t now;
  MDB_txn *txn; /* the batch's */
} create_ctx;

/* The id of the user's last record that cleanup deleted ('H'), 0 when none. */
static int hwm_get(bs__lmdb_db *db, MDB_txn *txn, bs_val user, uint64_t *out, bs_error *err) {
  unsigned char kb[BS_WCP_USER_KEY_MAX];
  MDB_val k = bs__lmdb_wcp_user_key(kb, BS_WCP_HWM_TAG, user), v;
  int rc = mdb_get(txn, db->wcp, &k, &v);
  *out = 0;
  if (rc == MDB_NOTFOUND) return BS_OK;
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: high-water mark");
  if (bs__lmdb_wcp_hwm_decode(&v, out))
    return bs__fail(err, BS_ECORRUPT, "write checkpoint: high-water mark");
  return BS_OK;
}

/* Applies the winning request w of one user (bs__managed_next_id). */
static int apply_one(bs__lmdb_db *db, MDB_txn *txn, const bs_managed_request *w, int64_t now,
                     bs_error *err) {
  unsigned char kb[BS_WCP_USER_KEY_MAX];
  MDB_val k;
  wcp_rec r;
  uint64_t hwm = 0;
  int64_t at = bs__managed_requested_at(w, now);
  int exists, action;
  int rc = rec_get(db, txn, w->user_id, kb, &k, &r, &exists, err);
  if (rc) return rc;
  if (!exists) {
    memset(&r, 0, sizeof r);
    if ((rc = hwm_get(db, txn, w->user_id, &hwm, err))) return rc;
  }
  if ((rc = bs__managed_next_id(w, exists, exists ? r.id : hwm, &r.id, &action, err))) return rc;
  if (action == BS_WCP_KEEP) return BS_OK;
  r.flags = at < 0 ? r.flags & ~BS_WCP_HAS_REQUESTED : r.flags | BS_WCP_HAS_REQUESTED;
  r.requested_at = at < 0 ? 0 : at;
  if (action == BS_WCP_REFRESH) return rec_put(db, txn, &k, &r, NULL, 0, err);
  r.flags &= ~BS_WCP_PROCESSED; /* a new head: not processed until a commit passes it */
  r.processed_lsn.data = NULL;
  r.processed_lsn.size = 0;
  if ((rc = rec_put(db, txn, &k, &r, w->heads, w->n_heads, err))) return rc;
  return pending_set(db, txn, w->user_id, 1, err);
}

/* bs__managed_find_fn in the batch's transaction. */
static int rec_live(void *ctx_, bs_val user, int *live, uint64_t *id, int *processed,
                    bs_error *err) {
  create_ctx *c = (create_ctx *)ctx_;
  unsigned char kb[BS_WCP_USER_KEY_MAX];
  MDB_val k;
  wcp_rec r;
  int rc = rec_get(c->db, c->txn, user, kb, &k, &r, live, err);
  if (rc == BS_OK && *live) {
    *id = r.id;
    *processed = (r.flags & BS_WCP_PROCESSED) != 0;
  }
  return rc;
}

/* One write transaction; bs__lmdb_write may run it again after growing the map. */
static int create_body(MDB_txn *txn, void *ctx_, bs_error *err) {
  create_ctx *c = (create_ctx *)ctx_;
  int rc;
  for (size_t k = 0; k < c->nw; k++)
    if ((rc = apply_one(c->db, txn, c->win[k], c->now, err))) return rc;
  c->txn = txn;
  return bs__managed_answer(c->ids_out, &c->should_advance, c->req, c->n, rec_live, c, err);
}

int bs__lmdb_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance,
                                              bs_storage *st, const bs_managed_request *req,
                                              size_t n, bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  const bs_allocator *a = &ls->db->base.alloc;
  create_ctx c = {ls->db, req, NULL, n, 0, ids_out, 0, bs__now_ms(), NULL};
  int rc;
  if ((rc = bs__managed_mode_check(wcp_mode_of(ls, NULL, NULL), err))) return rc;
  /* requests were checked by the front (bs_create_managed_write_checkpoints): sizes within
   * BS_MAX_USER_ID / BS_MAX_CONNECTION_NAME / BS_MAX_LSN, n_heads within the u16 BS_MAX_HEADS */
  if (n == 0) return BS_OK;
  if (!(c.win = bs__malloc(a, n * sizeof *c.win)))
    return bs__fail(err, BS_ENOMEM, "write checkpoints: out of memory");
  c.nw = bs__managed_winners(req, n, c.win);
  rc = bs__lmdb_write(ls->db, create_body, &c, err);
  if (rc == BS_OK) *should_advance = c.should_advance;
  bs__free(a, c.win);
  return rc;
}

/* ---- Reading ------------------------------------------------------------------------------- */

static void (*wcp_read_hook)(bs_storage *st);

void bs__lmdb_set_wcp_read_hook(void (*hook)(bs_storage *st)) {
  wcp_read_hook = hook;
}

int bs__lmdb_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user_id,
                                   const bs_head *heads, size_t n_heads, bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  bs__lmdb_db *db = ls->db;
  char evb[sizeof ls->wcp_event];
  bs_val ev = {evb, 0};
  bs_write_checkpoint_mode mode = wcp_mode_of(ls, evb, &ev.size);
  unsigned char kb[BS_WCP_KEY_MAX];
  MDB_txn *txn = NULL;
  MDB_val k, v;
  wcp_rec r;
  bs__stream_rec sr;
  int64_t requested_at;
  int rc;
  BS_ASSERT(user_id.size <= BS_MAX_USER_ID && !*found && !*id_out); /* the front's */
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err))) return rc;
  if (wcp_read_hook) wcp_read_hook(st);
  if (mode == BS_WCP_MANAGED) {
    rc = rec_get(db, txn, user_id, kb, &k, &r, found, err);
    enc_heads h = {r.heads, r.n_heads};
    if (rc == BS_OK && *found &&
        (*found = bs__heads_passed(enc_head_next, &h, NULL, heads, n_heads)))
      *id_out = r.id;
  } else if (user_id.size + ev.size > BS_MAX_USER_EVENT) {
    /* none: no custom write checkpoint has a user and an event that long together */
  } else if ((rc = bs__lmdb_wcp_custom_key(kb, &k, st->stream_id, ev, user_id, err)) == BS_OK &&
             (rc = bs__stream_rec_get(db, txn, st->stream_id, &sr, err)) == BS_OK &&
             !sr.clear_pending) { /* pending: the stream's custom records are deleted */
    rc = mdb_get(txn, db->wcp, &k, &v);
    if (rc == MDB_NOTFOUND)
      rc = BS_OK;
    else if (rc)
      rc = bs__fail_mdb(err, rc, "write checkpoint: get");
    else if (bs__lmdb_wcp_custom_decode(&v, id_out, &requested_at))
      rc = bs__fail(err, BS_ECORRUPT, "custom write checkpoint: value of %zu bytes", v.mv_size);
    else
      *found = 1;
  }
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

/* ---- Cleanup ------------------------------------------------------------------------------- */

typedef struct delete_ctx {
  bs__lmdb_db *db;
  uint32_t stream;
  int64_t before;
  uint64_t deleted;
} delete_ctx;

/* Collects the expired records (bs__request_expired) from first (the smallest 'M' key: managed;
 * the smallest 'C' key of stream: custom) on. */
static int collect_expired(bs__lmdb_db *db, MDB_txn *txn, const MDB_val *first, uint32_t stream,
                           int64_t before, key_list *l, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k = *first, v;
  int tag = ((const unsigned char *)first->mv_data)[0], custom = tag == BS_WCP_CUSTOM_TAG;
  int rc = mdb_cursor_open(txn, db->wcp, &cur), mrc;
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: cursor");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0 && rc == BS_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint64_t value;
    int64_t at;
    bs__wcp_key wk;
    wcp_rec r;
    if (bs__lmdb_wcp_key_decode(&k, &wk) || wk.tag != tag || (custom && wk.stream != stream)) break;
    if (custom ? bs__lmdb_wcp_custom_decode(&v, &value, &at) : bs__lmdb_wcp_rec_decode(&v, &r))
      rc = bs__fail(err, BS_ECORRUPT, "write checkpoint record does not decode");
    else if (custom ? bs__request_expired(at, 1, before)
                    : bs__request_expired(r.flags & BS_WCP_HAS_REQUESTED ? r.requested_at : -1,
                                          (r.flags & BS_WCP_PROCESSED) != 0, before))
      rc = key_list_add(l, &k, custom ? value : r.id, err);
  }
  if (rc == BS_OK && mrc && mrc != MDB_NOTFOUND)
    rc = bs__lmdb_fail(err, mrc, "write checkpoint: cleanup scan");
  mdb_cursor_close(cur);
  return rc;
}

/* Deletes what collect_expired found; a managed record leaves its id as the user's 'H' mark. */
static int delete_body(MDB_txn *txn, void *ctx_, bs_error *err) {
  delete_ctx *c = (delete_ctx *)ctx_;
  bs__lmdb_db *db = c->db;
  key_list l = {&db->base.alloc, NULL, 0, 0};
  unsigned char custom[BS_WCP_KEY_MAX], managed[BS_WCP_USER_KEY_MAX];
  MDB_val cp, mp = bs__lmdb_wcp_user_key(managed, BS_WCP_MANAGED_TAG, (bs_val){NULL, 0});
  bs__stream_rec sr;
  int rc;
  c->deleted = 0;
  /* behind a clear's fence the stream's custom records are deleted already: the clear's own
   * transactions remove them, cleanup neither deletes nor counts them */
  if ((rc = bs__stream_rec_get(db, txn, c->stream, &sr, err)) ||
      (rc = bs__lmdb_wcp_custom_key(custom, &cp, c->stream, (bs_val){NULL, 0}, (bs_val){NULL, 0},
                                    err)) ||
      (rc = collect_expired(db, txn, &mp, c->stream, c->before, &l, err)) ||
      (!sr.clear_pending && (rc = collect_expired(db, txn, &cp, c->stream, c->before, &l, err))))
    goto out;
  for (size_t off = 0; off < l.used;) {
    unsigned char hk[BS_WCP_USER_KEY_MAX], vb[8];
    uint64_t id; /* custom: unused */
    MDB_val k = key_list_next(&l, &off, &id), h, v = {0, vb};
    bs__wcp_key wk;
    if ((rc = mdb_del(txn, db->wcp, &k, NULL)) != 0) goto mdb_fail;
    if (bs__lmdb_wcp_key_decode(&k, &wk) == BS_OK && wk.tag == BS_WCP_MANAGED_TAG) {
      h = bs__lmdb_wcp_user_key(hk, BS_WCP_HWM_TAG, wk.user);
      v.mv_size = bs__lmdb_wcp_hwm_value(vb, id);
      if ((rc = mdb_put(txn, db->wcp, &h, &v, 0)) != 0) goto mdb_fail;
    }
    c->deleted++;
  }
  goto out;
mdb_fail:
  rc = bs__lmdb_fail(err, rc, "write checkpoint: cleanup");
out:
  bs__free(l.a, l.p);
  return rc;
}

int bs__lmdb_delete_checkpoint_requests_before(uint64_t *deleted, bs_storage *st, int64_t before_ms,
                                               bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  delete_ctx c = {ls->db, st->stream_id, before_ms, 0};
  int rc = bs__lmdb_write(ls->db, delete_body, &c, err);
  if (deleted) *deleted = rc == BS_OK ? c.deleted : 0;
  return rc;
}
