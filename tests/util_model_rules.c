/*
 * util_model_rules.c: the rules the engine's shared code owns, as the naive model states them
 * from contract.md (util_model.h): checkpoint creation and the LSN rules, write checkpoints,
 * chunk bounds and torn reads. Written from the contract alone, linear and obvious; it never
 * calls the library's rules (rules.c, compact.c, internal.h), which it is there to check.
 */
#include "util_model.h"

#include <stdlib.h>
#include <string.h>

/* ---- LSNs and checkpoints (contract.md 1, 4.4) ------------------------------------------------ */

int md_lsn_cmp(const char *a, const char *b) {
  size_t an = strlen(a), bn = strlen(b);
  int c = memcmp(a, b, an < bn ? an : bn);
  if (c) return c < 0 ? -1 : 1;
  return an < bn ? -1 : an > bn;
}

static void lsn_copy(char dst[64], const char *src) {
  assert_true(strlen(src) < 64);
  strcpy(dst, src);
}

void md_cp_snapshot_done(md_cpstate *c, const char *lsn) {
  c->snapshot_done = 1;
  if (!c->has_nocb || md_lsn_cmp(lsn, c->nocb) > 0) lsn_copy(c->nocb, lsn);
  c->has_nocb = 1;
}

void md_cp_resume_lsn(md_cpstate *c, const char *lsn) {
  lsn_copy(c->resume, lsn);
  c->has_resume = 1;
}

bs_block_reason md_cp_commit(md_cpstate *c, uint64_t head, const char *lsn, int create_empty,
                             int *created) {
  bs_block_reason why = BS_BLOCKED_NONE;
  *created = 0;
  if (!c->has_resume || md_lsn_cmp(lsn, c->resume) > 0) lsn_copy(c->resume, lsn);
  c->has_resume = 1;
  if (!c->snapshot_done)
    why = BS_BLOCKED_SNAPSHOT;
  else if (c->has_nocb && md_lsn_cmp(lsn, c->nocb) < 0)
    why = BS_BLOCKED_NO_CHECKPOINT_BEFORE;
  else if (c->has_cp && md_lsn_cmp(lsn, c->cp_lsn) < 0)
    why = BS_BLOCKED_CHECKPOINT_LSN;
  if (why != BS_BLOCKED_NONE) return why;
  /* create_empty = 0: nothing persisted since the last checkpoint changes nothing, but the
   * first unblocked commit always makes one */
  if (!create_empty && c->has_cp && head == c->cp) return why;
  *created = 1;
  c->has_cp = 1;
  c->cp = head;
  lsn_copy(c->cp_lsn, lsn);
  return why;
}

/* ---- Stream states (contract.md 1, 4.4, 8) ---------------------------------------------------- */

void md_states_create(md_states *m) {
  assert_true(m->n < MD_STREAMS);
  /* only the newest deployment is kept in flight */
  for (size_t i = 0; i < m->n; i++)
    if (m->s[i] == BS_STREAM_PROCESSING) m->s[i] = BS_STREAM_STOPPED;
  m->s[m->n++] = BS_STREAM_PROCESSING;
}

void md_states_checkpoint(md_states *m, uint32_t id) {
  assert_true(id >= 1 && id <= m->n);
  if (m->s[id - 1] != BS_STREAM_PROCESSING) return;
  /* the first checkpoint: this stream is served from now on, the ones served before stop */
  for (size_t i = 0; i < m->n; i++)
    if (m->s[i] == BS_STREAM_ACTIVE || m->s[i] == BS_STREAM_ERRORED) m->s[i] = BS_STREAM_STOPPED;
  m->s[id - 1] = BS_STREAM_ACTIVE;
}

void md_states_error(md_states *m, uint32_t id) {
  assert_true(id >= 1 && id <= m->n);
  if (m->s[id - 1] == BS_STREAM_ACTIVE) m->s[id - 1] = BS_STREAM_ERRORED;
}

void md_states_terminate(md_states *m, uint32_t id) {
  assert_true(id >= 1 && id <= m->n);
  m->s[id - 1] = BS_STREAM_TERMINATED;
}

/* ---- Write checkpoints (contract.md 7) -------------------------------------------------------- */

void md_wcp_free(md_wcp *w) {
  free(w->acks);
  memset(w, 0, sizeof *w);
}

static md_managed *managed_of(md_wcp *w, const char *user) {
  for (size_t i = 0; i < w->nm; i++)
    if (strcmp(w->m[i].user, user) == 0) return &w->m[i];
  assert_true(w->nm < MD_WCP_MAX && strlen(user) < sizeof w->m[0].user);
  memset(&w->m[w->nm], 0, sizeof w->m[0]);
  strcpy(w->m[w->nm].user, user);
  return &w->m[w->nm++];
}

/* Does request c replace the chosen request b of the same user? A supplied id beats a generated
 * one; of two supplied the greater wins (the first of equals stays); of two generated the later
 * (its heads are the newest). */
static int req_beats(const md_mreq *c, const md_mreq *b) {
  if (c->has_id != b->has_id) return c->has_id;
  return c->has_id ? c->id > b->id : 1;
}

static void apply_request(md_managed *r, const md_mreq *q) {
  uint64_t stored = r->exists ? r->id : r->high; /* never backwards, also after cleanup */
  if (q->has_id && r->exists && q->id <= stored) {
    if (q->id == stored) { /* a retry of the stored id refreshes requested_at only */
      r->has_at = 1;
      r->at = q->at;
    }
    return; /* a lower id changes nothing */
  }
  /* replaced: id and heads, not processed, requested_at iff the id was supplied */
  r->id = !q->has_id ? stored + 1 : q->id > stored ? q->id : stored;
  r->exists = 1;
  r->processed = 0;
  r->has_at = q->has_id;
  r->at = q->at;
  memcpy(r->heads, q->heads, sizeof r->heads);
  r->nh = q->nh;
}

int md_wcp_managed_refused(int custom) {
  return custom ? BS_ESTATE : BS_OK; /* contract.md 7: managed calls in managed mode only */
}

int md_wcp_managed(md_wcp *w, const md_mreq *req, size_t n, uint64_t *ids_out) {
  int advance = 0;
  for (size_t i = 0; i < n; i++) {
    size_t win = i, j;
    for (j = 0; j < i && strcmp(req[j].user, req[i].user) != 0; j++) {
    }
    if (j < i) continue; /* the user's first request decides for all of them */
    for (j = i + 1; j < n; j++)
      if (strcmp(req[j].user, req[i].user) == 0 && req_beats(&req[j], &req[win])) win = j;
    apply_request(managed_of(w, req[i].user), &req[win]);
  }
  for (size_t i = 0; i < n; i++) {
    md_managed *r = managed_of(w, req[i].user);
    ids_out[i] = r->id;
    if (!r->processed) advance = 1;
  }
  return advance;
}

/* Every stored head is reached: the given heads name its connection at an LSN at or above. */
static int heads_reached(const md_managed *r, const md_whead *given, size_t n) {
  for (size_t i = 0; i < r->nh; i++) {
    size_t j;
    for (j = 0; j < n && strcmp(given[j].conn, r->heads[i].conn) != 0; j++) {
    }
    if (j == n || md_lsn_cmp(r->heads[i].lsn, given[j].lsn) > 0) return 0;
  }
  return 1;
}

int md_wcp_last_managed(const md_wcp *w, const char *user, const md_whead *given, size_t n,
                        uint64_t *id) {
  for (size_t i = 0; i < w->nm; i++)
    if (w->m[i].exists && strcmp(w->m[i].user, user) == 0 && heads_reached(&w->m[i], given, n)) {
      *id = w->m[i].id;
      return 1;
    }
  return 0;
}

static md_custom *custom_of(md_wcp *w, uint32_t stream, const char *user) {
  for (size_t i = 0; i < w->nc; i++)
    if (w->c[i].stream == stream && strcmp(w->c[i].user, user) == 0) return &w->c[i];
  assert_true(w->nc < MD_WCP_MAX && strlen(user) < sizeof w->c[0].user);
  memset(&w->c[w->nc], 0, sizeof w->c[0]);
  w->c[w->nc].stream = stream;
  strcpy(w->c[w->nc].user, user);
  return &w->c[w->nc++];
}

void md_wcp_custom(md_wcp *w, uint32_t stream, const char *user, uint64_t value, int has_at,
                   int64_t at) {
  md_custom *c = custom_of(w, stream, user);
  c->exists = c->pending = 1;
  c->value = value; /* overwrites, not max */
  c->has_at = has_at;
  c->at = at;
}

int md_wcp_last_custom(const md_wcp *w, uint32_t stream, const char *user, uint64_t *value) {
  for (size_t i = 0; i < w->nc; i++)
    if (w->c[i].exists && w->c[i].stream == stream && strcmp(w->c[i].user, user) == 0) {
      *value = w->c[i].value;
      return 1;
    }
  return 0;
}

static void ack(md_wcp *w, uint32_t stream, uint64_t op, const char *user) {
  if (w->nacks == w->cap_acks) {
    w->cap_acks = w->cap_acks ? 2 * w->cap_acks : 64;
    w->acks = realloc(w->acks, w->cap_acks * sizeof *w->acks);
    assert_non_null(w->acks);
  }
  w->acks[w->nacks].stream = stream;
  w->acks[w->nacks].op = op;
  strcpy(w->acks[w->nacks++].user, user);
}

void md_wcp_flushed(md_wcp *w, uint32_t stream, uint64_t head) {
  for (size_t i = 0; i < w->nc; i++)
    if (w->c[i].stream == stream && w->c[i].pending) {
      w->c[i].pending = 0;
      ack(w, stream, head, w->c[i].user);
    }
}

void md_wcp_checkpoint(md_wcp *w, uint32_t stream, uint64_t cp, const char *lsn) {
  for (size_t i = 0; i < w->nm; i++) {
    md_managed *r = &w->m[i];
    size_t h;
    if (!r->exists || r->processed) continue;
    for (h = 0; h < r->nh && md_lsn_cmp(r->heads[h].lsn, lsn) <= 0; h++) {
    }
    if (h < r->nh) continue;
    r->processed = 1;
    ack(w, stream, cp, r->user);
  }
}

void md_wcp_clear(md_wcp *w, uint32_t stream) {
  size_t k = 0;
  for (size_t i = 0; i < w->nc; i++)
    if (w->c[i].stream == stream) w->c[i].exists = w->c[i].pending = 0;
  for (size_t i = 0; i < w->nacks; i++)
    if (w->acks[i].stream != stream) w->acks[k++] = w->acks[i];
  w->nacks = k;
}

uint64_t md_wcp_cleanup(md_wcp *w, uint32_t stream, int64_t t) {
  uint64_t n = 0;
  for (size_t i = 0; i < w->nm; i++) {
    md_managed *r = &w->m[i];
    if (r->exists && r->processed && r->has_at && r->at < t) {
      r->exists = 0;
      r->high = r->id;
      n++;
    }
  }
  for (size_t i = 0; i < w->nc; i++) {
    md_custom *c = &w->c[i];
    if (c->exists && c->stream == stream && c->has_at && c->at < t) {
      c->exists = c->pending = 0;
      n++;
    }
  }
  return n;
}

int md_wcp_lists(const md_wcp *w, uint32_t stream, uint64_t from, uint64_t to, const char *user) {
  for (size_t i = 0; i < w->nacks; i++) {
    const md_ack *a = &w->acks[i];
    if (a->stream == stream && strcmp(a->user, user) == 0 && a->op >= from && a->op <= to) return 1;
  }
  return 0;
}

/* The reference service lists at most 1000 buckets, and as many lookups, of a range. */
int md_changes_too_many(size_t n) {
  return n > 1000;
}

/* ---- Chunks (contract.md 5.2) and torn reads (5.5) -------------------------------------------- */

static size_t op_size(const ct_op *o) {
  return o->data.n + o->object_type.n + o->object_id.n + o->subkey.n;
}

size_t md_chunk_call(const ct_oplist *lists, size_t n_lists, size_t limit, size_t chunk_bytes,
                     size_t max_bytes, md_chunk *out, size_t cap, int *more) {
  size_t n_out = 0, served = 0, bytes = 0;
  int stopped = 0;
  for (size_t k = 0; k < n_lists && !stopped; k++) {
    md_chunk cur = {k, 0, 0, 0, 0};
    size_t csize = 0;
    for (size_t i = 0; i < lists[k].n; i++) {
      const ct_op *o = &lists[k].v[i];
      size_t sz = op_size(o);
      /* the call ends before the op that would pass limit ops or max_bytes (the first op of a
       * call is always served) */
      if (served == limit || (served > 0 && bytes + sz > max_bytes)) {
        stopped = 1;
        break;
      }
      /* a new chunk starts when this op would take the chunk past chunk_bytes */
      if (cur.n > 0 && csize + sz > chunk_bytes) {
        cur.has_more = 1;
        assert_true(n_out < cap);
        out[n_out++] = cur;
        cur = (md_chunk){k, i, 0, 0, 0};
        csize = 0;
      }
      cur.n++;
      csize += sz;
      served++;
      bytes += sz;
      if ((o->type == BS_OP_MOVE || o->type == BS_OP_CLEAR) && o->target_op > cur.target_op)
        cur.target_op = o->target_op;
    }
    if (cur.n > 0) {
      cur.has_more = stopped;
      assert_true(n_out < cap);
      out[n_out++] = cur;
    }
  }
  *more = stopped;
  return n_out;
}

int md_torn(const md_bucket *b, uint64_t clear_op, uint64_t C) {
  return b && b->n && clear_op > C && b->ops[0].op_id <= C;
}

static int field_ok(bs_val v, int carried) {
  return carried ? v.data != NULL : v.data == NULL && v.size == 0;
}

const char *md_op_fields_wrong(const bs_op *op) {
  int row = op->type == BS_OP_PUT || op->type == BS_OP_REMOVE;
  if (!field_ok(op->object_type, row)) return "object_type";
  if (!field_ok(op->object_id, row)) return "object_id";
  if (!field_ok(op->subkey, row)) return "subkey";
  if (!field_ok(op->data, op->type == BS_OP_PUT)) return "data";
  return NULL;
}

uint64_t md_aged_checkpoint(const uint64_t *cps, const int64_t *made_ms, size_t n, int64_t now_ms,
                            int64_t min_age_ms) {
  uint64_t aged = 0;
  for (size_t i = 0; i < n; i++)
    if (now_ms - made_ms[i] >= min_age_ms && cps[i] > aged) aged = cps[i];
  return aged;
}
