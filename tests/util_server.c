/*
 * util_server.c: the sync service's side of one connection (see util_server.h).
 *
 * Per connection it keeps, for every bucket of the client: the client's position (`after`,
 * from the request, then each sent chunk's next_after), the checksum sent in the last
 * checkpoint / diff line, and whether the bucket still has to be downloaded up to the checkpoint
 * being served (`pending`). A new checkpoint re-sums only the buckets that
 * bs_get_checkpoint_changes reports (all of them when it says "invalidate"), sends the ones whose
 * checksum changed in a checkpoint_diff, and fetches those plus any still pending.
 */
#include "util_server.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SV_EENGINE (-1000) /* the engine broke the chunk contract; message in err */

typedef struct sv_bucket {
  char *name;
  int priority;
  int in_line;      /* sent to the client in a checkpoint / diff line */
  uint64_t after;   /* the client's position */
  int pending;      /* to be downloaded up to the checkpoint being served */
  int refetch;      /* served a MOVE/CLEAR with target_op > C: fetch again at the next one */
  bs_checksum sent; /* as in the last checkpoint / diff line */
  int got_chunk, last_has_more; /* during one read call */
} sv_bucket;

struct sv_conn {
  bs_storage *st;
  ct_rng rng;
  sv_options o;
  sv_bucket *b; /* sorted by name */
  size_t n, cap;
  sv_sub *subs; /* names owned */
  size_t n_subs;
  uint64_t seen[64]; /* observed checkpoints above sent_cp, ascending */
  size_t n_seen;
  uint64_t newest_seen;
  uint64_t sent_cp; /* checkpoint of the last checkpoint / diff line */
  uint64_t min_cp;  /* the largest target_op sent: no checkpoint below it can complete */
  int baseline;     /* the sent checksums are a valid base for a diff */
  int fetching;
  uint64_t C;
  int target_bad;
  int incomplete; /* the client's checkpoint (sent_cp) has not been completed */
  sl_line *q;     /* lines ready to send, FIFO */
  size_t q_head, q_n, q_cap;
  bs_error *err; /* during one sv_next */
  sv_stats stats;
};

static char *dupv(bs_val v) {
  return ct_strndup(v.data, v.size);
}

static int engine_error(sv_conn *c, const char *fmt, const char *bucket, uint64_t a, uint64_t b) {
  if (c->err) {
    c->err->code = SV_EENGINE;
    snprintf(c->err->msg, sizeof c->err->msg, fmt, bucket, (unsigned long long)a,
             (unsigned long long)b);
  }
  return SV_EENGINE;
}

/* ---- Buckets -------------------------------------------------------------------------------- */

static size_t bpos(const sv_conn *c, const char *name, size_t len, int *found) {
  return ct_sorted_pos(c->b, c->n, sizeof *c->b, offsetof(sv_bucket, name), name, len, found);
}

static sv_bucket *bfind(const sv_conn *c, const char *name) {
  int found;
  size_t i = bpos(c, name, strlen(name), &found);
  return found ? &c->b[i] : NULL;
}

static sv_bucket *badd(sv_conn *c, const char *name, uint64_t after) {
  int found;
  size_t i = bpos(c, name, strlen(name), &found);
  if (found) return &c->b[i];
  c->b = ct_insert_at(c->b, &c->n, &c->cap, i, sizeof *c->b);
  c->b[i].name = ct_strdup(name);
  c->b[i].after = after;
  return &c->b[i];
}

static void bdel(sv_conn *c, size_t i) {
  free(c->b[i].name);
  ct_remove_at(c->b, &c->n, i, sizeof *c->b);
}

static const sv_sub *sub_of(const sv_conn *c, const char *name) {
  size_t i;
  for (i = 0; i < c->n_subs; i++)
    if (strcmp(c->subs[i].name, name) == 0) return &c->subs[i];
  return NULL;
}

/* ---- Line queue ----------------------------------------------------------------------------- */

static sl_line *q_push(sv_conn *c, sl_kind kind) {
  sl_line *l;
  if (c->q_head && c->q_head == c->q_n) c->q_head = c->q_n = 0;
  c->q = ct_grow(c->q, &c->q_cap, c->q_n + 1, sizeof *c->q);
  l = &c->q[c->q_n++];
  memset(l, 0, sizeof *l);
  l->kind = kind;
  return l;
}

/* ---- Connection ----------------------------------------------------------------------------- */

int sv_connect(sv_conn **out, bs_storage *st, const bs_bucket_request *req, size_t n_req,
               uint64_t seed, const sv_options *opts) {
  sv_conn *c = calloc(1, sizeof *c);
  size_t i;
  assert_non_null(c);
  c->st = st;
  c->rng = ct_seed(seed, 0x5e7e);
  if (opts) c->o = *opts;
  for (i = 0; i < n_req; i++) {
    char *name = dupv(req[i].bucket);
    badd(c, name, req[i].after);
    free(name);
  }
  *out = c;
  return BS_OK;
}

void sv_set_buckets(sv_conn *c, const sv_sub *subs, size_t n) {
  size_t i;
  for (i = 0; i < c->n_subs; i++) free((char *)c->subs[i].name);
  free(c->subs);
  c->subs = calloc(n ? n : 1, sizeof *c->subs);
  assert_non_null(c->subs);
  for (i = 0; i < n; i++) {
    c->subs[i].name = ct_strdup(subs[i].name);
    c->subs[i].priority = subs[i].priority;
  }
  c->n_subs = n;
}

const sv_stats *sv_get_stats(const sv_conn *c) {
  return &c->stats;
}

void sv_close(sv_conn *c) {
  size_t i;
  if (!c) return;
  for (i = 0; i < c->n; i++) free(c->b[i].name);
  free(c->b);
  sv_set_buckets(c, NULL, 0);
  free(c->subs);
  for (i = c->q_head; i < c->q_n; i++) sl_line_free(&c->q[i]);
  free(c->q);
  free(c);
}

/* ---- Checkpoint lines ----------------------------------------------------------------------- */

typedef struct changes_ctx {
  sv_conn *c;
  uint64_t from, to;
  int invalidate;
  char **names;
  size_t n, cap;
} changes_ctx;

static int on_changes(const bs_checkpoint_changes *ch, void *payload) {
  changes_ctx *x = payload;
  size_t i;
  if (x->c->o.on_changes) x->c->o.on_changes(x->from, x->to, ch, x->c->o.payload);
  if (ch->invalidate_data_buckets) x->invalidate = 1;
  for (i = 0; i < ch->n_updated_buckets; i++) {
    x->names = ct_grow(x->names, &x->cap, x->n + 1, sizeof *x->names);
    x->names[x->n++] = dupv(ch->updated_buckets[i]);
  }
  return 0;
}

static int changed(const changes_ctx *x, const char *name) {
  size_t i;
  if (x->invalidate) return 1;
  for (i = 0; i < x->n; i++)
    if (strcmp(x->names[i], name) == 0) return 1;
  return 0;
}

static void push_checksum(sl_line *l, const sv_sub *s, const bs_checksum *cs) {
  sl_bucket_checksum *bc;
  l->buckets = realloc(l->buckets, (l->n_buckets + 1) * sizeof *l->buckets);
  assert_non_null(l->buckets);
  bc = &l->buckets[l->n_buckets++];
  bc->name = ct_strdup(s->name);
  bc->checksum = cs->checksum;
  bc->count = cs->count;
  bc->priority = s->priority;
}

/* Builds the checkpoint / diff line of checkpoint C. 1: queued; 0: no line for C. */
static int build_line(sv_conn *c, uint64_t C) {
  changes_ctx x;
  bs_val *names = calloc(c->n_subs + 1, sizeof *names);
  bs_checksum *cs = calloc(c->n_subs + 1, sizeof *cs);
  int *need = calloc(c->n_subs + 1, sizeof *need);
  size_t i, k, n_need = 0, n_pending = 0;
  int full = !c->baseline, rc = BS_OK;
  sl_line tmp;
  assert_true(names && cs && need);
  memset(&x, 0, sizeof x);
  memset(&tmp, 0, sizeof tmp);
  x.c = c;
  x.from = c->sent_cp;
  x.to = C;
  if (!full) {
    rc = bs_get_checkpoint_changes(c->st, c->sent_cp, C, on_changes, &x, c->err);
    if (rc) goto done;
  }
  for (i = 0; i < c->n_subs; i++) {
    const sv_bucket *e = bfind(c, c->subs[i].name);
    need[i] = full || !e || !e->in_line || changed(&x, c->subs[i].name);
    if (need[i]) names[n_need++] = ct_v(c->subs[i].name);
  }
  if (n_need) rc = bs_get_checksums(cs, c->st, C, names, n_need, c->err);
  if (rc == BS_EINVALIDATED) {
    /* A compaction split this checkpoint: drop it; the next line re-sums everything. */
    c->stats.checksum_invalidated++;
    c->baseline = 0;
    rc = 0;
    goto done;
  }
  if (rc) goto done;
  tmp.kind = full ? SL_CHECKPOINT : SL_CHECKPOINT_DIFF;
  tmp.last_op_id = C;
  /* buckets the client no longer gets: the client deletes them, so do their positions */
  for (i = 0; i < c->n;) {
    if (sub_of(c, c->b[i].name)) {
      i++;
      continue;
    }
    if (!full && c->b[i].in_line) {
      tmp.removed = realloc(tmp.removed, (tmp.n_removed + 1) * sizeof *tmp.removed);
      assert_non_null(tmp.removed);
      tmp.removed[tmp.n_removed++] = ct_strdup(c->b[i].name);
    }
    bdel(c, i);
  }
  for (i = 0, k = 0; i < c->n_subs; i++) {
    const sv_sub *s = &c->subs[i];
    sv_bucket *e;
    if (!need[i]) continue;
    e = badd(c, s->name, 0);
    if (full || !e->in_line || e->sent.checksum != cs[k].checksum || e->sent.count != cs[k].count) {
      push_checksum(&tmp, s, &cs[k]);
      e->pending = 1;
    }
    e->in_line = 1;
    e->sent = cs[k];
    e->priority = s->priority;
    k++;
  }
  for (i = 0; i < c->n; i++) {
    if (c->b[i].refetch) c->b[i].pending = 1;
    c->b[i].refetch = 0;
    if (c->b[i].pending) n_pending++;
  }
  c->sent_cp = C;
  c->baseline = 1;
  if (!full && !tmp.n_buckets && !tmp.n_removed && !n_pending && !c->incomplete) {
    rc = 0; /* nothing changed for this client: no line (as the service does) */
    goto done;
  }
  *q_push(c, tmp.kind) = tmp;
  memset(&tmp, 0, sizeof tmp);
  if (full)
    c->stats.checkpoints++;
  else
    c->stats.diffs++;
  c->fetching = 1;
  c->C = C;
  c->target_bad = 0;
  c->incomplete = 1;
  rc = 1;
done:
  sl_line_free(&tmp);
  for (i = 0; i < x.n; i++) free(x.names[i]);
  free(x.names);
  free(names);
  free(cs);
  free(need);
  return rc;
}

/* ---- Data ----------------------------------------------------------------------------------- */

static int on_chunk(const bs_chunk *ch, void *payload) {
  sv_conn *c = payload;
  char *name = dupv(ch->bucket);
  int found;
  size_t i = bpos(c, ch->bucket.data, ch->bucket.size, &found), k;
  sv_bucket *e;
  sl_line *l;
  if (!found || !c->b[i].pending) {
    int rc = engine_error(c, "chunk of bucket %s, which was not requested (%llu, %llu)", name,
                          ch->after, ch->next_after);
    free(name);
    return rc;
  }
  e = &c->b[i];
  if (ch->after != e->after) {
    int rc = engine_error(c, "bucket %s: chunk after %llu, requested / continued at %llu", name,
                          ch->after, e->after);
    free(name);
    return rc;
  }
  for (k = 0; k < ch->n_ops; k++)
    if (ch->ops[k].op_id <= (k ? ch->ops[k - 1].op_id : ch->after) || ch->ops[k].op_id > c->C) {
      int rc = engine_error(c, "bucket %s: op %llu out of order or above checkpoint %llu", name,
                            ch->ops[k].op_id, c->C);
      free(name);
      return rc;
    }
  {
    uint64_t mt = 0;
    for (k = 0; k < ch->n_ops; k++)
      if ((ch->ops[k].type == BS_OP_MOVE || ch->ops[k].type == BS_OP_CLEAR) &&
          ch->ops[k].target_op > mt)
        mt = ch->ops[k].target_op;
    if (mt != ch->target_op) {
      int rc = engine_error(c, "bucket %s: chunk target_op %llu, its ops' largest is %llu", name,
                            ch->target_op, mt);
      free(name);
      return rc;
    }
  }
  if (ch->n_ops && ch->next_after != ch->ops[ch->n_ops - 1].op_id) {
    int rc = engine_error(c, "bucket %s: next_after %llu is not the last op %llu", name,
                          ch->next_after, ch->ops[ch->n_ops - 1].op_id);
    free(name);
    return rc;
  }
  if (ch->target_op > c->newest_seen) { /* the horizon is at most the current checkpoint */
    int rc = engine_error(c, "bucket %s: target_op %llu above the current checkpoint %llu", name,
                          ch->target_op, c->newest_seen);
    free(name);
    return rc;
  }
  if (ch->target_op > c->C) {
    c->target_bad = 1;
    e->refetch = 1;
  }
  if (ch->target_op > c->min_cp) c->min_cp = ch->target_op;
  e->got_chunk = 1;
  e->last_has_more = ch->has_more;
  if (!ch->n_ops) { /* nothing to send; the position still advances */
    e->after = ch->next_after > e->after ? ch->next_after : e->after;
    free(name);
    return 0;
  }
  e->after = ch->next_after;
  l = q_push(c, SL_DATA);
  l->bucket = name;
  l->after = ch->after;
  l->next_after = ch->next_after;
  l->has_more = ch->has_more;
  l->target_op = ch->target_op;
  l->last_op_id = c->C;
  for (k = 0; k < ch->n_ops; k++) ct_oplist_push(&l->ops, &ch->ops[k]);
  c->stats.data++;
  return 0;
}

/* One bucket_data call for the highest priority that still has pending buckets, or the
 * completion line when none is left. */
static int fetch_step(sv_conn *c) {
  bs_bucket_request *req;
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  size_t i, n = 0;
  int p = 1 << 30, more = 0, rc, progress = 0, left_p = 0, left_any = 0;
  for (i = 0; i < c->n; i++)
    if (c->b[i].pending && c->b[i].priority < p) p = c->b[i].priority;
  if (p == 1 << 30) { /* everything downloaded */
    c->fetching = 0;
    if (c->target_bad) {
      c->stats.withheld_target++;
      return 0;
    }
    q_push(c, SL_CHECKPOINT_COMPLETE)->last_op_id = c->C;
    c->stats.completes++;
    c->incomplete = 0;
    return 0;
  }
  req = calloc(c->n, sizeof *req);
  assert_non_null(req);
  for (i = 0; i < c->n; i++) {
    sv_bucket *e = &c->b[i];
    if (!e->pending || e->priority != p) continue;
    req[n].bucket = ct_v(e->name);
    req[n].after = e->after;
    e->got_chunk = e->last_has_more = 0;
    n++;
  }
  o.limit = ct_below(&c->rng, 3) == 0 ? BS_BATCH_LIMIT_DEFAULT : 1 + ct_below(&c->rng, 30);
  o.chunk_bytes = ct_below(&c->rng, 3) == 0 ? 0 : 1 + ct_below(&c->rng, 4000);
  if (ct_below(&c->rng, 6) == 0) o.max_bytes = 1 + ct_below(&c->rng, 6000);
  c->stats.reads++;
  rc = bs_get_bucket_data(&more, c->st, c->C, req, n, &o, on_chunk, c, c->err);
  free(req);
  if (rc == BS_EINVALIDATED) {
    /* torn: the chunks already sent stay sent; no completion for this checkpoint */
    c->stats.withheld_invalidated++;
    c->fetching = 0;
    return 0;
  }
  if (rc) return rc;
  for (i = 0; i < c->n; i++) {
    sv_bucket *e = &c->b[i];
    if (!e->pending || e->priority != p) continue;
    if (e->got_chunk) progress = 1;
    if (e->got_chunk && e->last_has_more && !more)
      return engine_error(c, "bucket %s: last chunk has_more, but the call says done (%llu, %llu)",
                          e->name, e->after, c->C);
    if ((e->got_chunk && !e->last_has_more) || (!e->got_chunk && !more))
      e->pending = 0;
    else
      left_p = 1;
  }
  if (more && !progress)
    return engine_error(c, "%s: has_more without a chunk (after %llu, checkpoint %llu)", "call", 0,
                        c->C);
  if (left_p) return 0;
  for (i = 0; i < c->n; i++)
    if (c->b[i].pending) left_any = 1;
  if (c->target_bad) { /* withheld: wait for a newer checkpoint */
    c->fetching = 0;
    c->stats.withheld_target++;
    return 0;
  }
  if (left_any) {
    sl_line *l = q_push(c, SL_PARTIAL_COMPLETE);
    l->last_op_id = c->C;
    l->priority = p;
    c->stats.partials++;
  }
  return 0;
}

/* ---- Driving -------------------------------------------------------------------------------- */

static int observe(sv_conn *c) {
  bs_checkpoint cp;
  int rc = bs_get_checkpoint(&cp, c->st, c->err);
  if (rc) return rc;
  if (cp.op_id > c->newest_seen && cp.op_id > c->sent_cp) {
    if (c->n_seen == sizeof c->seen / sizeof c->seen[0]) {
      ct_remove_at(c->seen, &c->n_seen, 0, sizeof *c->seen);
    }
    c->seen[c->n_seen++] = cp.op_id;
    c->newest_seen = cp.op_id;
  }
  return 0;
}

int sv_observe(sv_conn *c, bs_error *err) {
  c->err = err;
  return observe(c);
}

int sv_next(sv_conn *c, sl_line *line, bs_error *err) {
  int rc, rounds = 0;
  c->err = err;
  rc = observe(c);
  if (rc) return rc;
  for (;;) {
    if (++rounds > 100000)
      return engine_error(c, "%s: no progress after %llu rounds at %llu", "sv_next", 100000, c->C);
    if (c->q_head < c->q_n) {
      *line = c->q[c->q_head++];
      c->stats.lines++;
      return 1;
    }
    if (c->fetching) {
      if (c->o.interrupt && c->newest_seen > c->C && ct_below(&c->rng, 4) == 0) {
        c->stats.superseded++;
        c->fetching = 0;
        continue;
      }
      rc = fetch_step(c);
      if (rc < 0) return rc;
      continue;
    }
    /* A lagging service may serve an older checkpoint, but none below a target_op it has
     * sent: the client holds a MOVE / CLEAR standing for an op above it. */
    while (c->n_seen && (c->seen[0] <= c->sent_cp || c->seen[0] < c->min_cp)) {
      ct_remove_at(c->seen, &c->n_seen, 0, sizeof *c->seen);
    }
    if (!c->n_seen) return 0;
    {
      size_t idx =
          c->o.lag && ct_below(&c->rng, 3) == 0 ? ct_below(&c->rng, c->n_seen) : c->n_seen - 1;
      uint64_t C = c->seen[idx];
      memmove(c->seen, c->seen + idx + 1, (c->n_seen - idx - 1) * sizeof *c->seen);
      c->n_seen -= idx + 1;
      rc = build_line(c, C);
      if (rc < 0) return rc;
    }
  }
}
