/*
 * pg_wcp.c: the PostgreSQL backend's write checkpoints (contract.md 7): the mode (a setting of
 * the handle), managed checkpoints (bs_wcp_managed, database-wide records, one batch at a time
 * under a schema-wide advisory lock), the last write checkpoint (custom ones are bs_wcp_custom's,
 * written by the flush) and the cleanup. A commit processes managed ones in its checkpoint
 * statement (pg_write.c).
 */
#include "pg_internal.h"

static bs__pg_db *db_of(bs_storage *st) {
  return ((bs__pg_storage *)st)->db;
}

int bs__pg_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                     bs_error *err) {
  bs__pg_storage *s = (bs__pg_storage *)st;
  if (mode != BS_WCP_MANAGED && mode != BS_WCP_CUSTOM)
    return bs__fail(err, BS_EINVAL, "mode: unknown write checkpoint mode %d", (int)mode);
  if (event.size > sizeof s->event)
    return bs__fail(err, BS_ETOOBIG, "event: longer than %zu bytes", sizeof s->event);
  pthread_mutex_lock(&s->mu);
  s->mode = mode;
  s->event_size = event.size;
  if (event.size) memcpy(s->event, event.data, event.size);
  pthread_mutex_unlock(&s->mu);
  return BS_OK;
}

static bs_write_checkpoint_mode mode_of(bs__pg_storage *s, unsigned char *event, size_t *size) {
  bs_write_checkpoint_mode m;
  pthread_mutex_lock(&s->mu);
  m = s->mode;
  *size = s->event_size;
  if (s->event_size) memcpy(event, s->event, s->event_size);
  pthread_mutex_unlock(&s->mu);
  return m;
}

/* One user's record, locked: exists/gone/id/processed. */
static int managed_get(PGconn *c, bs_val user, int *exists, int *gone, uint64_t *id,
                       bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  bs__pg_arg_bytes(&a, user);
  rc = bs__pg_exec(c, "SELECT id, gone FROM bs_wcp_managed WHERE user_id = $1 FOR UPDATE", &a, &r,
                   "reading a write checkpoint", err);
  if (rc) return rc;
  *exists = PQntuples(r) == 1;
  *id = *exists ? (uint64_t)bs__pg_i64(r, 0, 0) : 0;
  *gone = *exists && bs__pg_bool(r, 0, 1);
  PQclear(r);
  return BS_OK;
}

/* bs__managed_find_fn in the batch's transaction (on connection c). */
static int managed_live(void *c, bs_val user, int *live, uint64_t *id, int *processed,
                        bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  bs__pg_arg_bytes(&a, user);
  rc = bs__pg_exec(c, "SELECT id, processed FROM bs_wcp_managed WHERE user_id = $1 AND NOT gone",
                   &a, &r, "reading a write checkpoint", err);
  if (rc) return rc;
  if ((*live = PQntuples(r) == 1)) {
    *id = (uint64_t)bs__pg_i64(r, 0, 0);
    *processed = bs__pg_bool(r, 0, 1);
  }
  PQclear(r);
  return BS_OK;
}

static int managed_apply(PGconn *c, const bs_managed_request *w, uint64_t id, int action,
                         int64_t at, const bs_allocator *al, bs_error *err) {
  bs__pg_args a = {0};
  bs_val *conns = NULL, *lsns = NULL;
  unsigned char *b1 = NULL, *b2 = NULL;
  int rc;
  if (action == BS_WCP_REFRESH) { /* a supplied retry of the stored id: requested_at only */
    bs__pg_arg_bytes(&a, w->user_id);
    bs__pg_arg_i64(&a, at);
    return bs__pg_run(c, "UPDATE bs_wcp_managed SET requested_at = $2 WHERE user_id = $1", &a,
                      "storing a write checkpoint", err);
  }
  if (w->n_heads && (!(conns = bs__calloc(al, w->n_heads, sizeof *conns)) ||
                     !(lsns = bs__calloc(al, w->n_heads, sizeof *lsns)))) {
    rc = bs__fail(err, BS_ENOMEM, "write checkpoints: out of memory");
    goto out;
  }
  for (size_t i = 0; i < w->n_heads; i++) {
    conns[i] = w->heads[i].connection;
    lsns[i] = w->heads[i].lsn;
    if (!conns[i].data) conns[i].data = ""; /* an absent value reads as "" */
    if (!lsns[i].data) lsns[i].data = "";
  }
  bs__pg_arg_bytes(&a, w->user_id);
  bs__pg_arg_i64(&a, (int64_t)id);
  if ((rc = bs__pg_arg_bytes_array(&a, conns, w->n_heads, al, &b1, err)) ||
      (rc = bs__pg_arg_bytes_array(&a, lsns, w->n_heads, al, &b2, err)))
    goto out;
  bs__pg_arg_i64(&a, at); /* < 0: none (a generated id) */
  rc = bs__pg_run(c,
                  "INSERT INTO bs_wcp_managed (user_id, id, head_conns, head_lsns, requested_at)"
                  " VALUES ($1, $2, $3, $4, CASE WHEN $5 >= 0 THEN $5 END) ON CONFLICT (user_id)"
                  " DO UPDATE SET id = $2, head_conns = $3, head_lsns = $4, requested_at = CASE"
                  " WHEN $5 >= 0 THEN $5 END, processed = false, processed_lsn = NULL,"
                  " gone = false",
                  &a, "storing a write checkpoint", err);
out:
  bs__free(al, conns);
  bs__free(al, lsns);
  bs__free(al, b1);
  bs__free(al, b2);
  return rc;
}

int bs__pg_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance, bs_storage *st,
                                            const bs_managed_request *req, size_t n,
                                            bs_error *err) {
  bs__pg_storage *s = (bs__pg_storage *)st;
  const bs_allocator *al = &db_of(st)->base.alloc;
  const bs_managed_request **win = NULL;
  unsigned char ev[256];
  size_t evn, nw = 0;
  int64_t now = bs__now_ms();
  PGconn *c = NULL;
  int rc;
  if ((rc = bs__managed_mode_check(mode_of(s, ev, &evn), err))) return rc;
  if (!(win = bs__calloc(al, n ? n : 1, sizeof *win)))
    return bs__fail(err, BS_ENOMEM, "write checkpoints: out of memory");
  /* the batch's winner per user (contract.md 7) */
  nw = bs__managed_winners(req, n, win);
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) goto out;
  if ((rc = bs__pg_begin_write(db_of(st), c, NULL, err))) goto out;
  /* one batch at a time database-wide: a new user's record cannot be created twice */
  {
    bs__pg_args a = {0};
    bs__pg_arg_lock(&a, &db_of(st)->schema, 1, BS_PG_LOCK_SCHEMA);
    rc =
        bs__pg_run(c, "SELECT pg_advisory_xact_lock($1, $2)", &a, "locking write checkpoints", err);
  }
  for (size_t k = 0; k < nw && !rc; k++) {
    uint64_t stored, id;
    int exists, gone, action;
    if ((rc = managed_get(c, win[k]->user_id, &exists, &gone, &stored, err))) break;
    /* a gone record's id is the user's high-water mark */
    if ((rc = bs__managed_next_id(win[k], exists && !gone, stored, &id, &action, err))) break;
    if (action != BS_WCP_KEEP)
      rc = managed_apply(c, win[k], id, action, bs__managed_requested_at(win[k], now), al, err);
  }
  if (!rc) rc = bs__managed_answer(ids_out, should_advance, req, n, managed_live, c, err);
  if (!rc) rc = bs__pg_commit(c, err);
  if (rc) bs__pg_rollback(c);
out:
  bs__pg_conn_put(db_of(st), c);
  bs__free(al, win);
  return rc;
}

/* bs__head_next_fn over a managed row's head_conns and head_lsns. */
typedef struct pg_heads {
  bs__pg_array conns, lsns;
} pg_heads;

static int pg_head_next(void *it, bs_val *conn, bs_val *lsn) {
  pg_heads *h = it;
  return bs__pg_array_next(&h->conns, conn) == 1 && bs__pg_array_next(&h->lsns, lsn) == 1;
}

int bs__pg_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user,
                                 const bs_head *heads, size_t n_heads, bs_error *err) {
  bs__pg_storage *s = (bs__pg_storage *)st;
  unsigned char ev[256];
  size_t evn;
  bs__pg_args a = {0};
  PGconn *c;
  PGresult *r;
  int rc, f = 0;
  uint64_t id = 0;
  bs_write_checkpoint_mode mode = mode_of(s, ev, &evn);
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) return rc;
  if (!user.data) user.data = "";
  bs__pg_arg_bytes(&a, user);
  if (mode == BS_WCP_CUSTOM) {
    bs__pg_arg_i32(&a, (int32_t)st->stream_id);
    bs__pg_arg_bytes(&a, (bs_val){evn ? ev : (const void *)"", evn});
    rc = bs__pg_exec(c,
                     "SELECT value FROM bs_wcp_custom WHERE stream = $2 AND event = $3"
                     " AND user_id = $1",
                     &a, &r, "reading a write checkpoint", err);
  } else {
    rc = bs__pg_exec(c,
                     "SELECT id, head_conns, head_lsns FROM bs_wcp_managed WHERE user_id = $1"
                     " AND NOT gone",
                     &a, &r, "reading a write checkpoint", err);
  }
  bs__pg_conn_put(db_of(st), c);
  if (rc) return rc;
  if (PQntuples(r) == 1) {
    f = 1;
    id = (uint64_t)bs__pg_i64(r, 0, 0);
    if (mode != BS_WCP_CUSTOM) {
      pg_heads h;
      if ((rc = bs__pg_array_open(bs__pg_bytes(r, 0, 1), &h.conns, err)) ||
          (rc = bs__pg_array_open(bs__pg_bytes(r, 0, 2), &h.lsns, err))) {
        PQclear(r);
        return rc;
      }
      f = bs__heads_passed(pg_head_next, &h, NULL, heads, n_heads);
    }
  }
  PQclear(r);
  *found = f;
  *id_out = f ? id : 0;
  return BS_OK;
}

int bs__pg_delete_checkpoint_requests_before(uint64_t *deleted, bs_storage *st, int64_t before_ms,
                                             bs_error *err) {
  bs__pg_args a = {0};
  PGconn *c;
  PGresult *r;
  int rc;
  if ((rc = bs__pg_conn_get(db_of(st), &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  bs__pg_arg_i64(&a, bs__request_cutoff(before_ms));
  /* bs__request_expired in one statement; a managed record stays as its user's high-water mark
   * (gone), so ids never go backwards */
  rc = bs__pg_exec(c,
                   "WITH m AS (UPDATE bs_wcp_managed SET gone = true, head_conns = '{}',"
                   "  head_lsns = '{}' WHERE NOT gone AND processed AND requested_at <= $2"
                   "  RETURNING 1),"
                   " cu AS (DELETE FROM bs_wcp_custom WHERE stream = $1 AND requested_at <= $2"
                   "  RETURNING 1)"
                   " SELECT (SELECT count(*) FROM m) + (SELECT count(*) FROM cu)",
                   &a, &r, "deleting checkpoint requests", err);
  bs__pg_conn_put(db_of(st), c);
  if (rc) return rc;
  if (deleted) *deleted = (uint64_t)bs__pg_i64(r, 0, 0);
  PQclear(r);
  return BS_OK;
}
