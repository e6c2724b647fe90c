/*
 * mem_wcp.c: the memory backend's write checkpoints (contract.md 7): the mode, managed
 * checkpoints (database-wide records), the last write checkpoint and the cleanup.
 */
#include "mem_internal.h"

/* ---- Write checkpoints (contract.md 7) ------------------------------------------------------- */

int bs__mem_set_wcp_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                         bs_error *err) {
  BS_UNUSED(err);
  mem_storage *ms = MS(st);
  BS_ASSERT(event.size <= sizeof ms->event); /* the front checks mode and event */
  lock(ms->db);
  ms->mode = mode;
  ms->event_n = event.size;
  if (event.size) memcpy(ms->event, event.data, event.size);
  unlock(ms->db);
  return BS_OK;
}

static mem_mwcp *mwcp_find(mem_db *db, bs_val user, size_t *idx) {
  for (size_t i = 0; i < db->nmw; i++)
    if (bs__val_eq(db->mw[i]->user, user)) {
      if (idx) *idx = i;
      return db->mw[i];
    }
  return NULL;
}

/* bs__managed_find_fn over the records (the caller holds the lock). */
static int mwcp_live(void *db, bs_val user, int *live, uint64_t *id, int *processed,
                     bs_error *err) {
  const mem_mwcp *r = mwcp_find(db, user, NULL);
  BS_UNUSED(err);
  if ((*live = r && !r->gone)) {
    *id = r->id;
    *processed = r->processed;
  }
  return BS_OK;
}

/* The record request r leaves for its user (BS_WCP_REPLACE): its heads, the id, not processed,
 * requested_at at (bs__managed_requested_at). */
static mem_mwcp *mwcp_new(const bs_allocator *a, const bs_managed_request *r, uint64_t id,
                          int64_t at) {
  size_t bytes = 0;
  unsigned char *p;
  mem_mwcp *w = bs__calloc(a, 1, sizeof *w + r->user_id.size);
  for (size_t i = 0; i < r->n_heads; i++)
    bytes += r->heads[i].connection.size + r->heads[i].lsn.size;
  if (!w || !(w->heads = bs__malloc(a, r->n_heads * sizeof *w->heads + bytes + 1))) {
    bs__free(a, w);
    return NULL;
  }
  p = (unsigned char *)(w + 1);
  w->user = bs__val_put(&p, r->user_id);
  p = (unsigned char *)(w->heads + r->n_heads);
  for (size_t i = 0; i < r->n_heads; i++) {
    w->heads[i].connection = bs__val_put(&p, r->heads[i].connection);
    w->heads[i].lsn = bs__val_put(&p, r->heads[i].lsn);
  }
  w->nheads = r->n_heads;
  w->id = id;
  w->req_ms = at;
  return w;
}

int bs__mem_create_managed(uint64_t *ids_out, int *should_advance, bs_storage *st,
                           const bs_managed_request *req, size_t n, bs_error *err) {
  mem_storage *ms = MS(st);
  mem_db *db = ms->db;
  const bs_allocator *a = ALLOC(db);
  const bs_managed_request **win = NULL;
  mem_mwcp **neu = NULL;
  size_t nw = 0;
  int64_t now = bs__now_ms();
  int rc = BS_OK;
  if ((rc = bs__managed_mode_check(ms->mode, err))) return rc;
  win = bs__calloc(a, n ? n : 1, sizeof *win);
  neu = bs__calloc(a, n ? n : 1, sizeof *neu);
  if (!win || !neu) {
    rc = enomem(err, "write checkpoints");
    goto out;
  }
  nw = bs__managed_winners(req, n, win);
  lock(db);
  /* Everything that can fail first: the new record of each replaced user (neu[k]); win[k] stays
   * only for a refresh (NULL: kept as it is). */
  for (size_t k = 0; k < nw && !rc; k++) {
    mem_mwcp *old = mwcp_find(db, win[k]->user_id, NULL);
    uint64_t id = 0;
    int action = BS_WCP_KEEP;
    /* a gone record's id is the high-water mark */
    rc = bs__managed_next_id(win[k], old && !old->gone, old ? old->id : 0, &id, &action, err);
    if (rc || action == BS_WCP_REFRESH) continue;
    if (action == BS_WCP_KEEP)
      win[k] = NULL;
    else if (!(neu[k] = mwcp_new(a, win[k], id, bs__managed_requested_at(win[k], now))))
      rc = enomem(err, "write checkpoints");
  }
  if (!rc && BS_GROW(a, db->mw, db->cmw, db->nmw + nw)) rc = enomem(err, "write checkpoints");
  for (size_t k = 0; k < nw && !rc; k++) { /* nothing below fails */
    size_t idx = 0;
    mem_mwcp *old;
    if (!win[k]) continue; /* BS_WCP_KEEP */
    old = mwcp_find(db, win[k]->user_id, &idx);
    if (!neu[k]) { /* BS_WCP_REFRESH: a supplied retry of the stored (live) record's id */
      BS_ASSERT(old && !old->gone);
      old->req_ms = bs__managed_requested_at(win[k], now);
    } else if (old) {
      mwcp_free(a, old);
      db->mw[idx] = neu[k];
    } else {
      db->mw[db->nmw++] = neu[k];
    }
    neu[k] = NULL;
  }
  if (!rc) rc = bs__managed_answer(ids_out, should_advance, req, n, mwcp_live, db, err);
  unlock(db);
out:
  for (size_t k = 0; neu && k < nw; k++) mwcp_free(a, neu[k]);
  bs__free(a, neu);
  bs__free(a, win);
  return rc;
}

int bs__mem_last_wcp(uint64_t *id_out, int *found, bs_storage *st, bs_val user,
                     const bs_head *heads, size_t n_heads, bs_error *err) {
  BS_UNUSED(err);
  mem_storage *ms = MS(st);
  mem_db *db = ms->db;
  int f = 0;
  uint64_t id = 0;
  lock(db);
  if (ms->mode == BS_WCP_CUSTOM) {
    bs_val ev = {ms->event, ms->event_n};
    for (size_t i = 0; i < ms->s->ncw; i++)
      if (bs__val_eq(ms->s->cw[i]->event, ev) && bs__val_eq(ms->s->cw[i]->user, user)) {
        f = 1;
        id = ms->s->cw[i]->value;
      }
  } else {
    mem_mwcp *r = mwcp_find(db, user, NULL);
    bs__head_array h = {r ? r->heads : NULL, r ? r->nheads : 0};
    if ((f = r && !r->gone && bs__heads_passed(bs__head_array_next, &h, NULL, heads, n_heads)))
      id = r->id;
  }
  unlock(db);
  *found = f;
  *id_out = f ? id : 0;
  return BS_OK;
}

/* Deletes the expired managed records (database-wide) and custom records of the stream
 * (bs__request_expired). A managed record stays as its user's high-water mark (gone). Nothing
 * allocates. Compaction runs it too. */
int bs__mem_delete_requests(uint64_t *deleted_out, bs_storage *st, int64_t before_ms,
                            bs_error *err) {
  mem_db *db = MS(st)->db;
  mem_stream *s = MS(st)->s;
  size_t k = 0;
  uint64_t deleted = 0;
  BS_UNUSED(err);
  lock(db);
  for (size_t i = 0; i < db->nmw; i++) {
    mem_mwcp *r = db->mw[i];
    if (r->gone || !bs__request_expired(r->req_ms, r->processed, before_ms)) continue;
    bs__free(ALLOC(db), r->heads);
    r->heads = NULL;
    r->nheads = 0;
    r->gone = 1;
    deleted++;
  }
  for (size_t i = 0; i < s->ncw; i++) {
    mem_cwcp *c = s->cw[i];
    if (bs__request_expired(c->req_ms, 1, before_ms)) {
      bs__free(ALLOC(db), c);
      deleted++;
    } else {
      s->cw[k++] = c;
    }
  }
  s->ncw = k;
  unlock(db);
  *deleted_out = deleted;
  return BS_OK;
}
