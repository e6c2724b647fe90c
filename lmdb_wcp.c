/*
 * lmdb_wcp.c: write checkpoints of the LMDB backend (contract.md section 7).
 *
 * Managed records are database-wide, one per full user id, in the `wcp` sub-database:
 *   'M' | user id      -> u64 id | u8 flags (1 = has requested_at, 2 = processed)
 *                         | i64 requested_at ms | u8 len, processed-at lsn
 *                         | u16 n heads, n x (u16 len, connection | u8 len, lsn)   (little-endian)
 *   'P' | user id      -> (empty) present iff the 'M' record is not processed yet: the commit's
 *                         marking pass walks only these, never every record.
 *   'H' | user id      -> u64 the id of the user's last record that cleanup deleted: a new
 *                         record continues above it, so ids never go backwards (contract.md 7).
 * Custom records (one per stream, event and user; overwritten by each flush):
 *   'C' | u32be stream | u16be event len | event | user id -> u64 value [| i64 requested_at ms]
 *                         (16 bytes: created from a client request, deleted by cleanup once
 *                         older than its cut-off; 8 bytes: persistent)
 */
#include "lmdb_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define WCP_HAS_REQUESTED 1u
#define WCP_PROCESSED     2u
#define WCP_KEY_MAX       511u

/* A decoded managed record. heads point into the value it was decoded from (or the request). */
typedef struct wcp_rec {
  uint64_t id;
  unsigned flags;
  int64_t requested_at;
  bs_val processed_lsn;
  const unsigned char *heads; /* encoded heads (decoded record) */
  size_t heads_size;
  uint32_t n_heads;
} wcp_rec;

/* ---- Records ------------------------------------------------------------------------------- */

/* Checks the encoded heads and counts them. */
static int heads_check(const unsigned char *p, size_t size, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    size_t c, l;
    if (size < 2) return BS_ECORRUPT;
    c = (size_t)bs__get_u16le(p);
    if (size < 2 + c + 1) return BS_ECORRUPT;
    l = p[2 + c];
    if (size < 3 + c + l) return BS_ECORRUPT;
    p += 3 + c + l;
    size -= 3 + c + l;
  }
  return size == 0 ? BS_OK : BS_ECORRUPT;
}

static int rec_decode(const MDB_val *v, wcp_rec *r) {
  const unsigned char *p = (const unsigned char *)v->mv_data;
  size_t size = v->mv_size, l;
  if (size < 18) return BS_ECORRUPT;
  r->id = bs__get_u64le(p);
  r->flags = p[8];
  r->requested_at = (int64_t)bs__get_u64le(p + 9);
  l = p[17];
  if (size < 18 + l + 2) return BS_ECORRUPT;
  r->processed_lsn.data = l ? p + 18 : NULL;
  r->processed_lsn.size = l;
  r->n_heads = (uint32_t)bs__get_u16le(p + 18 + l);
  r->heads = p + 20 + l;
  r->heads_size = size - 20 - l;
  return heads_check(r->heads, r->heads_size, r->n_heads);
}

/* Iterates encoded heads: fills conn/lsn from *p and advances it. Input already checked. */
static void heads_next(const unsigned char **p, bs_val *conn, bs_val *lsn) {
  const unsigned char *q = *p;
  conn->size = (size_t)bs__get_u16le(q);
  conn->data = q + 2;
  lsn->size = q[2 + conn->size];
  lsn->data = q + 3 + conn->size;
  *p = q + 3 + conn->size + lsn->size;
}

static size_t heads_encoded_size(const bs_head *heads, size_t n) {
  size_t size = 0;
  for (size_t i = 0; i < n; i++) size += 3 + heads[i].connection.size + heads[i].lsn.size;
  return size;
}

static void heads_encode(unsigned char *p, const bs_head *heads, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bs__put_u16le(p, (uint32_t)heads[i].connection.size);
    bs_val c = heads[i].connection;
    if (c.size) memcpy(p + 2, c.data, c.size);
    p += 2 + heads[i].connection.size;
    *p++ = (unsigned char)heads[i].lsn.size;
    if (heads[i].lsn.size) memcpy(p, heads[i].lsn.data, heads[i].lsn.size);
    p += heads[i].lsn.size;
  }
}

/* Writes record r under key; new_heads (if not NULL) replace r's encoded heads. */
static int rec_put(bs__lmdb_db *db, MDB_txn *txn, MDB_val *key, const wcp_rec *r,
                   const bs_head *new_heads, size_t n_new, bs_error *err) {
  size_t hsize = new_heads ? heads_encoded_size(new_heads, n_new) : r->heads_size;
  size_t size = 20 + r->processed_lsn.size + hsize;
  unsigned char stack[1024], *buf = stack;
  MDB_val v;
  int rc;
  if (size > sizeof stack && !(buf = (unsigned char *)bs__malloc(&db->base.alloc, size)))
    return bs__fail(err, BS_ENOMEM, "write checkpoint: out of memory");
  bs__put_u64le(buf, r->id);
  buf[8] = (unsigned char)r->flags;
  bs__put_u64le(buf + 9, (uint64_t)r->requested_at);
  buf[17] = (unsigned char)r->processed_lsn.size;
  if (r->processed_lsn.size) memcpy(buf + 18, r->processed_lsn.data, r->processed_lsn.size);
  bs__put_u16le(buf + 18 + r->processed_lsn.size, (uint32_t)(new_heads ? n_new : r->n_heads));
  if (new_heads)
    heads_encode(buf + 20 + r->processed_lsn.size, new_heads, n_new);
  else if (hsize)
    memcpy(buf + 20 + r->processed_lsn.size, r->heads, hsize);
  v.mv_size = size;
  v.mv_data = buf;
  rc = mdb_put(txn, db->wcp, key, &v, 0);
  if (buf != stack) bs__free(&db->base.alloc, buf);
  return rc ? bs__lmdb_fail(err, rc, "write checkpoint: put") : BS_OK;
}

/* 'M' or 'P' | user id */
static MDB_val user_key(unsigned char *buf, char tag, bs_val user) {
  MDB_val k;
  buf[0] = (unsigned char)tag;
  if (user.size) memcpy(buf + 1, user.data, user.size);
  k.mv_size = 1 + user.size;
  k.mv_data = buf;
  return k;
}

/* Adds or removes the pending marker of user. */
static int pending_set(bs__lmdb_db *db, MDB_txn *txn, bs_val user, int pending, bs_error *err) {
  unsigned char buf[1 + BS_MAX_USER_ID];
  MDB_val k = user_key(buf, 'P', user), v = {0, NULL};
  int rc = pending ? mdb_put(txn, db->wcp, &k, &v, 0) : mdb_del(txn, db->wcp, &k, NULL);
  if (rc == MDB_NOTFOUND) rc = 0;
  return rc ? bs__lmdb_fail(err, rc, "write checkpoint: pending index") : BS_OK;
}

/* Does a head list (lsns per connection) reach every stored head (bs__head_reached)? */
static int heads_reached(const wcp_rec *r, const bs_head *heads, size_t n) {
  const unsigned char *p = r->heads;
  for (uint32_t i = 0; i < r->n_heads; i++) {
    bs_val conn, lsn;
    heads_next(&p, &conn, &lsn);
    if (!bs__head_reached(conn, lsn, heads, n)) return 0;
  }
  return 1;
}

/* Has the commit at lsn passed every stored head of r? */
static int heads_below(const wcp_rec *r, bs_val commit_lsn) {
  const unsigned char *p = r->heads;
  for (uint32_t i = 0; i < r->n_heads; i++) {
    bs_val conn, lsn;
    heads_next(&p, &conn, &lsn);
    if (bs__val_cmp(lsn, commit_lsn) > 0) return 0;
  }
  return 1;
}

/* ---- Verification --------------------------------------------------------------------------- */

int bs__lmdb_wcp_entry_check(const MDB_val *k, const MDB_val *v, char *why, size_t why_size) {
  const unsigned char *kp = (const unsigned char *)k->mv_data;
  wcp_rec r;
  if (k->mv_size >= 1 && kp[0] == 'M') {
    if (rec_decode(v, &r) == BS_OK) return BS_OK;
    snprintf(why, why_size, "wcp: managed record of %zu bytes does not decode", v->mv_size);
  } else if (k->mv_size >= 1 && kp[0] == 'P') {
    if (v->mv_size == 0) return BS_OK;
    snprintf(why, why_size, "wcp: pending marker with a %zu-byte value", v->mv_size);
  } else if (k->mv_size >= 1 && kp[0] == 'H') {
    if (v->mv_size == 8) return BS_OK;
    snprintf(why, why_size, "wcp: high-water mark with a %zu-byte value", v->mv_size);
  } else if (k->mv_size >= 7 && kp[0] == 'C') {
    size_t elen = (size_t)kp[5] << 8 | kp[6];
    if (k->mv_size >= 7 + elen && (v->mv_size == 8 || v->mv_size == 16)) return BS_OK;
    snprintf(why, why_size, "wcp: malformed custom entry (key %zu bytes, value %zu bytes)",
             k->mv_size, v->mv_size);
  } else {
    snprintf(why, why_size, "wcp: malformed key of %zu bytes", k->mv_size);
  }
  return BS_ECORRUPT;
}

/* ---- Commit hook: marking processed -------------------------------------------------------- */

int bs__lmdb_wcp_mark_processed(bs__lmdb_db *db, MDB_txn *txn, bs_val lsn,
                                int (*fn)(bs_val user, void *payload), void *payload,
                                bs_error *err) {
  const bs_allocator *a = &db->base.alloc;
  MDB_cursor *cur = NULL;
  MDB_val k = {1, (void *)"P"}, v;
  unsigned char *users = NULL; /* pending user ids copied out: (u16 len, bytes)... */
  size_t used = 0, cap = 0;
  int rc = mdb_cursor_open(txn, db->wcp, &cur);
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: cursor");
  /* Collect first, update after: the cursor is not reused across puts and deletes. */
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size < 1 || ((const unsigned char *)k.mv_data)[0] != 'P') break;
    if (BS_GROW(a, users, cap, used + 2 + k.mv_size)) {
      rc = bs__fail(err, BS_ENOMEM, "write checkpoint: out of memory");
      goto fail;
    }
    bs__put_u16le(users + used, (uint32_t)k.mv_size - 1);
    memcpy(users + used + 2, (const unsigned char *)k.mv_data + 1, k.mv_size - 1);
    used += 2 + k.mv_size - 1;
  }
  if (rc && rc != MDB_NOTFOUND) {
    rc = bs__fail_mdb(err, rc, "write checkpoint: pending scan");
    goto fail;
  }
  mdb_cursor_close(cur);
  cur = NULL;
  for (size_t off = 0; off < used;) {
    bs_val user = {users + off + 2, (size_t)bs__get_u16le(users + off)};
    unsigned char kb[1 + BS_MAX_USER_ID];
    MDB_val mk = user_key(kb, 'M', user), mv;
    wcp_rec r;
    off += 2 + user.size;
    rc = mdb_get(txn, db->wcp, &mk, &mv);
    if (rc == MDB_NOTFOUND) { /* record gone: drop the stale marker */
      if ((rc = pending_set(db, txn, user, 0, err))) goto fail;
      continue;
    }
    if (rc) {
      rc = bs__fail_mdb(err, rc, "write checkpoint: get");
      goto fail;
    }
    if (rec_decode(&mv, &r)) {
      rc = bs__fail(err, BS_ECORRUPT, "write checkpoint of user %.*s does not decode",
                    (int)user.size, (const char *)user.data);
      goto fail;
    }
    if (!heads_below(&r, lsn)) continue;
    r.flags |= WCP_PROCESSED;
    r.processed_lsn = lsn;
    /* r.heads points into the map: rec_put copies them into its own buffer before mdb_put */
    if ((rc = rec_put(db, txn, &mk, &r, NULL, 0, err))) goto fail;
    if ((rc = pending_set(db, txn, user, 0, err))) goto fail;
    if (fn && (rc = fn(user, payload))) goto fail;
  }
  rc = BS_OK;
fail:
  if (cur) mdb_cursor_close(cur);
  bs__free(a, users);
  return rc;
}

/* ---- Custom mode --------------------------------------------------------------------------- */

static int custom_key(unsigned char *buf, MDB_val *k, uint32_t stream, bs_val event, bs_val user,
                      bs_error *err) {
  size_t size = 1 + 4 + 2 + event.size + user.size;
  if (size > WCP_KEY_MAX || event.size > 0xffff)
    return bs__fail(err, BS_ETOOBIG, "user_id + event: %zu bytes (limit %u together)",
                    user.size + event.size, WCP_KEY_MAX - 7);
  buf[0] = 'C';
  bs__put_u32be(buf + 1, stream);
  buf[5] = (unsigned char)(event.size >> 8);
  buf[6] = (unsigned char)event.size;
  if (event.size) memcpy(buf + 7, event.data, event.size);
  if (user.size) memcpy(buf + 7 + event.size, user.data, user.size);
  k->mv_size = size;
  k->mv_data = buf;
  return BS_OK;
}

int bs__lmdb_wcp_put_custom(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, bs_val event,
                            bs_val user, uint64_t value, int64_t requested_at, bs_error *err) {
  unsigned char kb[WCP_KEY_MAX], vb[16];
  MDB_val k, v = {requested_at < 0 ? 8 : 16, vb};
  int rc = custom_key(kb, &k, stream, event, user, err);
  if (rc) return rc;
  bs__put_u64le(vb, value);
  bs__put_u64le(vb + 8, (uint64_t)requested_at);
  rc = mdb_put(txn, db->wcp, &k, &v, 0);
  return rc ? bs__lmdb_fail(err, rc, "custom write checkpoint: put") : BS_OK;
}

int bs__lmdb_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                       bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  if (mode != BS_WCP_MANAGED && mode != BS_WCP_CUSTOM)
    return bs__fail(err, BS_EINVAL, "mode: %d is not a write checkpoint mode", (int)mode);
  if (event.size > sizeof ls->wcp_event - 1)
    return bs__fail(err, BS_ETOOBIG, "event: %zu bytes (limit %zu)", event.size,
                    sizeof ls->wcp_event - 1);
  ls->wcp_mode = mode;
  if (event.size) memcpy(ls->wcp_event, event.data, event.size);
  ls->wcp_event_size = event.size;
  return BS_OK;
}

/* ---- Managed mode: creating ---------------------------------------------------------------- */

typedef struct req_ref {
  const bs_managed_request *req;
  size_t index;
} req_ref;

static int req_ref_cmp(const void *a, const void *b) {
  const req_ref *x = (const req_ref *)a, *y = (const req_ref *)b;
  int c = bs__val_cmp(x->req->user_id, y->req->user_id);
  if (c) return c;
  return x->index < y->index ? -1 : x->index > y->index;
}

typedef struct create_ctx {
  bs__lmdb_db *db;
  req_ref *refs;
  size_t n;
  uint64_t *ids_out;
  int should_advance;
  int64_t now;
} create_ctx;

/* The id of the user's last record that cleanup deleted ('H'), 0 when none. */
static int hwm_get(bs__lmdb_db *db, MDB_txn *txn, bs_val user, uint64_t *out, bs_error *err) {
  unsigned char kb[1 + BS_MAX_USER_ID];
  MDB_val k = user_key(kb, 'H', user), v;
  int rc = mdb_get(txn, db->wcp, &k, &v);
  *out = 0;
  if (rc == MDB_NOTFOUND) return BS_OK;
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: high-water mark");
  if (v.mv_size != 8) return bs__fail(err, BS_ECORRUPT, "write checkpoint: high-water mark");
  *out = bs__get_u64le((const unsigned char *)v.mv_data);
  return BS_OK;
}

/* Applies the winning request w of one user (bs__managed_next_id); *id_out: the stored id after
 * it; *pending_out: the record is not processed. */
static int apply_one(bs__lmdb_db *db, MDB_txn *txn, const bs_managed_request *w, int64_t now,
                     uint64_t *id_out, int *pending_out, bs_error *err) {
  unsigned char kb[1 + BS_MAX_USER_ID];
  MDB_val k = user_key(kb, 'M', w->user_id), v;
  wcp_rec r;
  uint64_t hwm = 0;
  int rc = mdb_get(txn, db->wcp, &k, &v), exists = (rc == 0), action, replace, refresh;
  if (rc && rc != MDB_NOTFOUND) return bs__fail_mdb(err, rc, "write checkpoint: get");
  if (exists && rec_decode(&v, &r))
    return bs__fail(err, BS_ECORRUPT, "write checkpoint of user %.*s does not decode",
                    (int)w->user_id.size, (const char *)w->user_id.data);
  if (!exists) {
    memset(&r, 0, sizeof r);
    if ((rc = hwm_get(db, txn, w->user_id, &hwm, err))) return rc;
  }
  if ((rc = bs__managed_next_id(w, exists, exists ? r.id : hwm, &r.id, &action, err))) return rc;
  replace = action == BS_WCP_REPLACE;
  refresh = action == BS_WCP_REFRESH || (replace && w->has_request_id);
  if (replace && !w->has_request_id) { /* generated: no requested_at */
    r.flags &= ~WCP_HAS_REQUESTED;
    r.requested_at = 0;
  }
  if (refresh) {
    r.flags |= WCP_HAS_REQUESTED;
    r.requested_at = w->requested_at_ms ? w->requested_at_ms : now;
  }
  if (replace) { /* a new head: not processed until a commit passes it */
    r.flags &= ~WCP_PROCESSED;
    r.processed_lsn.data = NULL;
    r.processed_lsn.size = 0;
  }
  if (replace || refresh) {
    if ((rc = rec_put(db, txn, &k, &r, replace ? w->heads : NULL, replace ? w->n_heads : 0, err)))
      return rc;
    if (replace && (rc = pending_set(db, txn, w->user_id, 1, err))) return rc;
  }
  *id_out = r.id;
  *pending_out = !(r.flags & WCP_PROCESSED);
  return BS_OK;
}

/* One write transaction; bs__lmdb_write may run it again after growing the map. */
static int create_body(MDB_txn *txn, void *ctx_, bs_error *err) {
  create_ctx *c = (create_ctx *)ctx_;
  c->should_advance = 0;
  for (size_t i = 0; i < c->n;) {
    size_t j = i + 1, w = i;
    uint64_t id = 0;
    int pending = 0, rc;
    while (j < c->n && bs__val_eq(c->refs[j].req->user_id, c->refs[i].req->user_id)) {
      if (bs__managed_req_beats(c->refs[j].req, c->refs[w].req)) w = j;
      j++;
    }
    if ((rc = apply_one(c->db, txn, c->refs[w].req, c->now, &id, &pending, err))) return rc;
    if (pending) c->should_advance = 1;
    for (; i < j; i++) c->ids_out[c->refs[i].index] = id;
  }
  return BS_OK;
}

int bs__lmdb_create_managed_write_checkpoints(bs_storage *st, const bs_managed_request *req,
                                              size_t n, uint64_t *ids_out, int *should_advance,
                                              bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  const bs_allocator *a = &ls->db->base.alloc;
  create_ctx c;
  int rc;
  if (should_advance) *should_advance = 0;
  if (ls->wcp_mode != BS_WCP_MANAGED)
    return bs__fail(err, BS_ESTATE, "managed write checkpoint on a storage in custom mode");
  /* requests were checked by the front (bs_create_managed_write_checkpoints): sizes within
   * BS_MAX_USER_ID / BS_MAX_CONNECTION_NAME / BS_MAX_LSN, n_heads within the u16 BS_MAX_HEADS */
  if (n == 0) return BS_OK;
  memset(&c, 0, sizeof c);
  if (!(c.refs = (req_ref *)bs__malloc(a, n * sizeof *c.refs)))
    return bs__fail(err, BS_ENOMEM, "write checkpoints: out of memory");
  for (size_t i = 0; i < n; i++) {
    c.refs[i].req = &req[i];
    c.refs[i].index = i;
  }
  /* group the batch by user (stable: equal users keep request order) */
  qsort(c.refs, n, sizeof *c.refs, req_ref_cmp);
  c.n = n;
  c.ids_out = ids_out;
  c.now = bs__now_ms();
  c.db = ls->db;
  rc = bs__lmdb_write(ls->db, create_body, &c, err);
  if (rc == BS_OK && should_advance) *should_advance = c.should_advance;
  bs__free(a, c.refs);
  return rc;
}

/* ---- Reading ------------------------------------------------------------------------------- */

int bs__lmdb_last_write_checkpoint(bs_storage *st, bs_val user_id, const bs_head *heads,
                                   size_t n_heads, uint64_t *id_out, int *found, bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  bs__lmdb_db *db = ls->db;
  unsigned char kb[WCP_KEY_MAX];
  MDB_txn *txn = NULL;
  MDB_val k, v;
  int rc;
  *found = 0;
  *id_out = 0;
  if (user_id.size > BS_MAX_USER_ID)
    return bs__fail(err, BS_ETOOBIG, "user_id: %zu bytes (limit %u)", user_id.size, BS_MAX_USER_ID);
  if (ls->wcp_mode == BS_WCP_CUSTOM) {
    bs_val ev = {ls->wcp_event, ls->wcp_event_size};
    if ((rc = custom_key(kb, &k, st->stream_id, ev, user_id, err))) return rc;
  } else {
    k = user_key(kb, 'M', user_id);
  }
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err))) return rc;
  rc = mdb_get(txn, db->wcp, &k, &v);
  if (rc == MDB_NOTFOUND) {
    rc = BS_OK;
  } else if (rc) {
    rc = bs__fail_mdb(err, rc, "write checkpoint: get");
  } else if (ls->wcp_mode == BS_WCP_CUSTOM) {
    if (v.mv_size != 8 && v.mv_size != 16) {
      rc = bs__fail(err, BS_ECORRUPT, "custom write checkpoint: value of %zu bytes", v.mv_size);
    } else {
      *id_out = bs__get_u64le((const unsigned char *)v.mv_data);
      *found = 1;
    }
  } else {
    wcp_rec r;
    if (rec_decode(&v, &r)) {
      rc = bs__fail(err, BS_ECORRUPT, "write checkpoint of user %.*s does not decode",
                    (int)user_id.size, (const char *)user_id.data);
    } else if (heads_reached(&r, heads, n_heads)) {
      *id_out = r.id;
      *found = 1;
    }
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

/* Keys found by a scan, deleted after it (the cursor is not reused across writes): entries of
 * u16 key length, key, u64 the record's id. */
typedef struct key_list {
  const bs_allocator *a;
  unsigned char *p;
  size_t used, cap;
} key_list;

static int key_list_add(key_list *l, const MDB_val *k, uint64_t id, bs_error *err) {
  if (BS_GROW(l->a, l->p, l->cap, l->used + 10 + k->mv_size))
    return bs__fail(err, BS_ENOMEM, "write checkpoint cleanup: out of memory");
  bs__put_u16le(l->p + l->used, (uint32_t)k->mv_size);
  memcpy(l->p + l->used + 2, k->mv_data, k->mv_size);
  bs__put_u64le(l->p + l->used + 2 + k->mv_size, id);
  l->used += 10 + k->mv_size;
  return BS_OK;
}

/* Collects the expired records under prefix ('M': managed, 'C' | stream: custom): those with
 * requested_at < before, managed ones only once processed (a pending record still has a client
 * waiting for it). Records without requested_at are kept. */
static int collect_expired(bs__lmdb_db *db, MDB_txn *txn, const unsigned char *prefix, size_t n,
                           int64_t before, key_list *l, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k = {n, (void *)prefix}, v;
  int rc = mdb_cursor_open(txn, db->wcp, &cur), mrc;
  if (rc) return bs__fail_mdb(err, rc, "write checkpoint: cursor");
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0 && rc == BS_OK;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const unsigned char *vp = (const unsigned char *)v.mv_data;
    wcp_rec r;
    if (k.mv_size < n || memcmp(k.mv_data, prefix, n) != 0) break;
    if (prefix[0] == 'C') {
      if (v.mv_size == 16 && (int64_t)bs__get_u64le(vp + 8) < before)
        rc = key_list_add(l, &k, bs__get_u64le(vp), err);
    } else if (rec_decode(&v, &r)) {
      rc = bs__fail(err, BS_ECORRUPT, "write checkpoint record does not decode");
    } else if ((r.flags & WCP_HAS_REQUESTED) && (r.flags & WCP_PROCESSED) &&
               r.requested_at < before) {
      rc = key_list_add(l, &k, r.id, err);
    }
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
  unsigned char custom[5] = {'C'}, managed[1] = {'M'};
  int rc;
  c->deleted = 0;
  bs__put_u32be(custom + 1, c->stream);
  if ((rc = collect_expired(db, txn, managed, 1, c->before, &l, err)) ||
      (rc = collect_expired(db, txn, custom, 5, c->before, &l, err)))
    goto out;
  for (size_t off = 0; off < l.used;) {
    unsigned char *key = l.p + off + 2, vb[8];
    MDB_val k = {bs__get_u16le(l.p + off), key}, v = {8, vb};
    off += 10 + k.mv_size;
    memcpy(vb, key + k.mv_size, 8);
    if ((rc = mdb_del(txn, db->wcp, &k, NULL)) ||
        (key[0] == 'M' && (key[0] = 'H', rc = mdb_put(txn, db->wcp, &k, &v, 0)))) {
      rc = bs__lmdb_fail(err, rc, "write checkpoint: cleanup");
      goto out;
    }
    c->deleted++;
  }
out:
  bs__free(l.a, l.p);
  return rc;
}

int bs__lmdb_delete_checkpoint_requests_before(bs_storage *st, int64_t before_ms, uint64_t *deleted,
                                               bs_error *err) {
  bs__lmdb_storage *ls = (bs__lmdb_storage *)st;
  delete_ctx c = {ls->db, st->stream_id, before_ms, 0};
  int rc = bs__lmdb_write(ls->db, delete_body, &c, err);
  if (deleted) *deleted = rc == BS_OK ? c.deleted : 0;
  return rc;
}
