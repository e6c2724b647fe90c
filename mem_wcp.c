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

/* A new record: old's fields (or empty), with heads replaced when req is given. */
static mem_mwcp *mwcp_build(const bs_allocator *a, const mem_mwcp *old, bs_val user,
                            const bs_managed_request *heads_from) {
  mem_mwcp *r = bs__calloc(a, 1, sizeof *r);
  const mem_head *oh = old ? old->heads : NULL;
  size_t n = heads_from ? heads_from->n_heads : old ? old->nheads : 0;
  if (!r) return NULL;
  if (old) {
    r->id = old->id;
    r->has_req = old->has_req;
    r->req_ms = old->req_ms;
    r->processed = old->processed;
  }
  if (val_dup(a, user, &r->user)) goto fail;
  if (n) {
    r->heads = bs__calloc(a, n, sizeof *r->heads);
    if (!r->heads) goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    bs_val c = heads_from ? heads_from->heads[i].connection : oh[i].conn;
    bs_val l = heads_from ? heads_from->heads[i].lsn : oh[i].lsn;
    r->nheads = i + 1;
    if (val_dup(a, c, &r->heads[i].conn) || val_dup(a, l, &r->heads[i].lsn)) goto fail;
  }
  return r;
fail:
  mwcp_free(a, r);
  return NULL;
}

int bs__mem_create_managed(bs_storage *st, const bs_managed_request *req, size_t n,
                           uint64_t *ids_out, int *should_advance, bs_error *err) {
  mem_storage *ms = MS(st);
  mem_db *db = ms->db;
  const bs_allocator *a = ALLOC(db);
  const bs_managed_request **win = NULL;
  mem_mwcp **neu = NULL;
  size_t nw = 0, nnew = 0;
  int64_t now = bs__now_ms();
  int rc = BS_OK, adv = 0;
  if (ms->mode != BS_WCP_MANAGED)
    return bs__fail(err, BS_ESTATE, "managed write checkpoints in custom mode");
  win = bs__calloc(a, n ? n : 1, sizeof *win);
  neu = bs__calloc(a, n ? n : 1, sizeof *neu);
  if (!win || !neu) {
    rc = enomem(err, "write checkpoints");
    goto out;
  }
  nw = bs__managed_winners(req, n, win);
  lock(db);
  /* Build every changed record first; swap them in only when all exist. */
  for (size_t k = 0; k < nw; k++) {
    const bs_managed_request *r = win[k];
    mem_mwcp *old = mwcp_find(db, r->user_id, NULL);
    int64_t at = r->requested_at_ms ? r->requested_at_ms : now;
    uint64_t id;
    int action;
    mem_mwcp *nr;
    /* a gone record's id is the high-water mark */
    if ((rc = bs__managed_next_id(r, old && !old->gone, old ? old->id : 0, &id, &action, err)))
      goto fail;
    if (action == BS_WCP_KEEP) continue;
    nr = mwcp_build(a, old, r->user_id, action == BS_WCP_REPLACE ? r : NULL);
    if (!nr) goto nomem;
    if (action == BS_WCP_REPLACE) {
      nr->id = id;
      nr->processed = 0;
      nr->has_req = r->has_request_id; /* a generated id has no requested_at */
      nr->req_ms = r->has_request_id ? at : 0;
    } else {
      nr->has_req = 1;
      nr->req_ms = at;
    }
    neu[nnew++] = nr;
  }
  if (BS_GROW(a, db->mw, db->cmw, db->nmw + nnew)) goto nomem;
  for (size_t k = 0; k < nnew; k++) {
    size_t idx;
    mem_mwcp *old = mwcp_find(db, neu[k]->user, &idx);
    if (old) {
      mwcp_free(a, old);
      db->mw[idx] = neu[k];
    } else {
      db->mw[db->nmw++] = neu[k];
    }
    neu[k] = NULL;
  }
  for (size_t i = 0; i < n; i++) {
    mem_mwcp *r = mwcp_find(db, req[i].user_id, NULL);
    ids_out[i] = r ? r->id : 0;
    if (r && !r->processed) adv = 1;
  }
  unlock(db);
  *should_advance = adv;
  goto out;
nomem:
  rc = enomem(err, "write checkpoints");
fail:
  unlock(db);
out:
  for (size_t k = 0; neu && k < nnew; k++) mwcp_free(a, neu[k]);
  bs__free(a, neu);
  bs__free(a, win);
  return rc;
}

int bs__mem_last_wcp(bs_storage *st, bs_val user, const bs_head *heads, size_t n_heads,
                     uint64_t *id_out, int *found, bs_error *err) {
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
    if (r && !r->gone) {
      f = 1; /* every head of the record must be reached by the given heads */
      for (size_t k = 0; k < r->nheads && f; k++)
        f = bs__head_reached(r->heads[k].conn, r->heads[k].lsn, heads, n_heads);
      if (f) id = r->id;
    }
  }
  unlock(db);
  *found = f;
  *id_out = f ? id : 0;
  return BS_OK;
}

/* Deletes the processed managed records (database-wide) and the custom records of stream s
 * whose requested_at < before_ms; records without requested_at stay. A managed record stays as
 * its user's high-water mark (gone). Caller holds the lock. Nothing allocates. */
uint64_t bs__mem_delete_requests_before(mem_db *db, mem_stream *s, int64_t before_ms) {
  size_t k = 0;
  uint64_t deleted = 0;
  for (size_t i = 0; i < db->nmw; i++) {
    mem_mwcp *r = db->mw[i];
    if (r->gone || !r->processed || !r->has_req || r->req_ms >= before_ms) continue;
    for (size_t h = 0; h < r->nheads; h++) {
      val_free(ALLOC(db), &r->heads[h].conn);
      val_free(ALLOC(db), &r->heads[h].lsn);
    }
    bs__free(ALLOC(db), r->heads);
    r->heads = NULL;
    r->nheads = 0;
    r->gone = 1;
    deleted++;
  }
  for (size_t i = 0; i < s->ncw; i++) {
    mem_cwcp *c = s->cw[i];
    if (c->req_ms >= 0 && c->req_ms < before_ms) {
      cwcp_free(ALLOC(db), c);
      deleted++;
    } else {
      s->cw[k++] = c;
    }
  }
  s->ncw = k;
  return deleted;
}

int bs__mem_delete_requests(bs_storage *st, int64_t before_ms, uint64_t *deleted, bs_error *err) {
  BS_UNUSED(err);
  mem_storage *ms = MS(st);
  lock(ms->db);
  *deleted = bs__mem_delete_requests_before(ms->db, ms->s, before_ms);
  unlock(ms->db);
  return BS_OK;
}
