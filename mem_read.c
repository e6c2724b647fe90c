/*
 * mem_read.c: the memory backend's reads (contract.md 5): checkpoint, bucket data, checksums,
 * checkpoint changes, parameter sets and the bucket listing, each under the store's lock on
 * copies that the callbacks get after it is released.
 */
#include "mem_internal.h"

/* ---- Reads ----------------------------------------------------------------------------------- */

int bs__mem_get_checkpoint(bs_storage *st, bs_checkpoint *out, bs_error *err) {
  BS_UNUSED(err);
  mem_storage *ms = MS(st);
  lock(ms->db);
  memset(out, 0, sizeof *out);
  out->op_id = ms->s->m.checkpoint;
  out->has_lsn = ms->s->m.cp_lsn.has;
  out->lsn_size = ms->s->m.cp_lsn.n;
  memcpy(out->lsn, ms->s->m.cp_lsn.b, ms->s->m.cp_lsn.n);
  unlock(ms->db);
  return BS_OK;
}

typedef struct mem_cplan {
  size_t req;
  uint64_t after, next_after, target;
  int has_more;
  size_t first, n, bytes;
} mem_cplan;

/* Plans the call's chunks (contract.md 5.2) under the lock: which ops, cut where. */
static int plan_chunks(mem_stream *s, uint64_t c, const bs_bucket_request *req, size_t n_req,
                       size_t limit, size_t chunk_bytes, size_t max_bytes, const mem_op ***picks,
                       size_t *npicks, mem_cplan **plans, size_t *nplans, int *call_more,
                       const bs_allocator *a) {
  size_t cpick = 0, cplan = 0, total = 0, bytes = 0;
  int stop = 0;
  *call_more = 0;
  for (size_t i = 0; i < n_req && !stop; i++) {
    mem_bucket *b = bucket_find(s, req[i].bucket, NULL);
    mem_cplan *cur = NULL;
    if (!b) continue;
    for (size_t k = 0; k < b->n; k++) {
      const mem_op *o = &b->ops[k];
      size_t sz = op_size(o);
      if (o->id <= req[i].after || o->id > c) continue;
      /* the call's first op is always served, however large (and however small the ops
       * before it: zero-size MOVEs count as served too, as in LMDB) */
      if (total >= limit || (total > 0 && bytes + sz > max_bytes)) {
        *call_more = 1;
        stop = 1;
        if (cur) cur->has_more = 1;
        break;
      }
      if (cur && cur->bytes + sz > chunk_bytes) {
        cur->has_more = 1;
        cur = NULL;
      }
      if (!cur) {
        uint64_t after = *nplans && (*plans)[*nplans - 1].req == i
                             ? (*plans)[*nplans - 1].next_after
                             : req[i].after;
        if (GROW(a, *plans, *nplans, cplan, *nplans + 1)) return BS_ENOMEM;
        cur = &(*plans)[(*nplans)++];
        memset(cur, 0, sizeof *cur);
        cur->req = i;
        cur->after = after;
        cur->first = *npicks;
      }
      if (GROW(a, *picks, *npicks, cpick, *npicks + 1)) return BS_ENOMEM;
      (*picks)[(*npicks)++] = o;
      cur->n++;
      cur->bytes += sz;
      cur->next_after = o->id;
      if ((o->type == BS_OP_MOVE || o->type == BS_OP_CLEAR) && o->target > cur->target)
        cur->target = o->target;
      total++;
      bytes += sz;
    }
  }
  return BS_OK;
}

int bs__mem_bucket_data(bs_storage *st, uint64_t c, const bs_bucket_request *req, size_t n_req,
                        const bs_batch_options *opts, int (*on_chunk)(const bs_chunk *, void *),
                        void *payload, int *has_more_out, bs_error *err) {
  mem_storage *ms = MS(st);
  const bs_allocator *a = ALLOC(ms->db);
  /* the front (bs_get_bucket_data) has applied the defaults: no field is zero */
  size_t limit = opts->limit, chunk_bytes = opts->chunk_bytes, max_bytes = opts->max_bytes;
  const mem_op **picks = NULL;
  mem_cplan *plans = NULL;
  size_t npicks = 0, nplans = 0, arena_n = 0;
  bs_op *ops = NULL;
  unsigned char *arena = NULL, *p;
  int call_more = 0, rc = BS_OK;

  lock(ms->db);
  for (size_t i = 0; i < n_req; i++) {
    mem_bucket *b = bucket_find(ms->s, req[i].bucket, NULL);
    if (torn(b, c)) {
      rc = torn_fail(err, c, req[i].bucket);
      goto locked_out;
    }
  }
  if (plan_chunks(ms->s, c, req, n_req, limit, chunk_bytes, max_bytes, &picks, &npicks, &plans,
                  &nplans, &call_more, a))
    goto nomem;
  for (size_t i = 0; i < npicks; i++) arena_n += op_size(picks[i]);
  ops = bs__calloc(a, npicks ? npicks : 1, sizeof *ops);
  arena = bs__malloc(a, arena_n ? arena_n : 1);
  if (!ops || !arena) goto nomem;
  p = arena;
  for (size_t i = 0; i < npicks; i++) {
    const mem_op *o = picks[i];
    ops[i].op_id = o->id;
    ops[i].type = o->type;
    ops[i].checksum = o->checksum;
    ops[i].target_op = o->target;
    ops[i].object_type = arena_put(&p, o->ot);
    ops[i].object_id = arena_put(&p, o->oi);
    ops[i].subkey = arena_put(&p, o->sk);
    ops[i].data = arena_put(&p, o->data);
    if (bs__op_carries_row(o->type)) { /* carried fields are present: empty, not none */
      if (!ops[i].object_type.data) ops[i].object_type.data = "";
      if (!ops[i].object_id.data) ops[i].object_id.data = "";
      if (!ops[i].subkey.data) ops[i].subkey.data = "";
    }
    if (o->type == BS_OP_PUT && !ops[i].data.data) ops[i].data.data = "";
  }
  unlock(ms->db);
  /* Callbacks outside the lock, on the copies. */
  for (size_t i = 0; i < nplans && !rc; i++) {
    bs_chunk ch;
    ch.bucket = req[plans[i].req].bucket;
    ch.after = plans[i].after;
    ch.next_after = plans[i].next_after;
    ch.has_more = plans[i].has_more;
    ch.target_op = plans[i].target;
    ch.ops = ops + plans[i].first;
    ch.n_ops = plans[i].n;
    rc = on_chunk(&ch, payload);
  }
  if (!rc && has_more_out) *has_more_out = call_more;
  goto out;
nomem:
  rc = enomem(err, "bucket data");
locked_out:
  unlock(ms->db);
out:
  bs__free(a, picks);
  bs__free(a, plans);
  bs__free(a, ops);
  bs__free(a, arena);
  return rc;
}

/* The value at C: sum and count of the stored ops with op_id <= C. */
static bs_checksum sum_upto(const mem_bucket *b, uint64_t c) {
  bs_checksum r = {0, 0};
  if (!b) return r;
  for (size_t i = 0; i < b->n; i++)
    if (b->ops[i].id <= c) {
      r.checksum = bs__cksum_add(r.checksum, b->ops[i].checksum);
      r.count++;
    }
  return r;
}

int bs__mem_checksums(bs_storage *st, uint64_t c, const bs_val *buckets, size_t n, bs_checksum *out,
                      uint64_t *gen, bs_error *err) {
  mem_storage *ms = MS(st);
  int rc = BS_OK;
  lock(ms->db);
  for (size_t i = 0; i < n; i++) {
    mem_bucket *b = bucket_find(ms->s, buckets[i], NULL);
    if (torn(b, c)) {
      rc = torn_fail(err, c, buckets[i]);
      break;
    }
    out[i] = sum_upto(b, c);
    if (gen) gen[i] = b ? b->generation : 0;
  }
  unlock(ms->db);
  return rc;
}

int bs__mem_checksum_ranges(bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets,
                            size_t n, bs_checksum *out, int *cleared, uint64_t *gen,
                            bs_error *err) {
  mem_storage *ms = MS(st);
  int rc = BS_OK;
  lock(ms->db);
  for (size_t i = 0; i < n; i++) {
    mem_bucket *b = bucket_find(ms->s, buckets[i], NULL);
    bs_checksum r = {0, 0};
    int cl = 0;
    if (torn(b, to)) {
      rc = torn_fail(err, to, buckets[i]);
      break;
    }
    for (size_t k = 0; b && k < b->n; k++) {
      const mem_op *o = &b->ops[k];
      if (o->id <= from || o->id > to) continue;
      if (o->type == BS_OP_CLEAR) cl = 1;
      r.checksum = bs__cksum_add(r.checksum, o->checksum);
      r.count++;
    }
    if (cl) r = sum_upto(b, to); /* a CLEAR replaces the base: the value from zero */
    out[i] = r;
    if (cleared) cleared[i] = cl;
    if (gen) gen[i] = b ? b->generation : 0;
  }
  unlock(ms->db);
  return rc;
}

static int push_val(const bs_allocator *a, bs_val **list, size_t *n, size_t *cap, bs_val v) {
  if (val_in(*list, *n, v)) return BS_OK;
  if (GROW(a, *list, *n, *cap, *n + 1)) return BS_ENOMEM;
  (*list)[(*n)++] = v;
  return BS_OK;
}

int bs__mem_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                               int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                               bs_error *err) {
  mem_storage *ms = MS(st);
  mem_stream *s = ms->s;
  const bs_allocator *a = ALLOC(ms->db);
  bs_val *b = NULL, *l = NULL, *u = NULL, *bc = NULL, *lc = NULL, *uc = NULL;
  size_t nb = 0, cb = 0, nl = 0, cl = 0, nu = 0, cu = 0;
  bs_checkpoint_changes ch;
  int rc = BS_OK;
  memset(&ch, 0, sizeof ch);
  lock(ms->db);
  if (from < s->m.data_fence) ch.invalidate_data_buckets = 1;
  for (size_t i = 0; i < s->nbch && !ch.invalidate_data_buckets; i++)
    if (s->bch[i].id > from && s->bch[i].id <= to) {
      if (push_val(a, &b, &nb, &cb, s->buckets[s->bch[i].bucket]->name)) goto nomem;
      if (nb > BS_CHANGES_MAX) ch.invalidate_data_buckets = 1;
    }
  if (ch.invalidate_data_buckets) nb = 0;
  if (from < s->m.param_fence) ch.invalidate_parameter_buckets = 1;
  for (size_t i = 0; i < s->nparams && !ch.invalidate_parameter_buckets; i++)
    if (s->params[i].id > from && s->params[i].id <= to) {
      if (push_val(a, &l, &nl, &cl, s->params[i].key)) goto nomem;
      if (nl > BS_CHANGES_MAX) ch.invalidate_parameter_buckets = 1;
    }
  if (ch.invalidate_parameter_buckets) nl = 0;
  /* users are keyed by the id of the checkpoint that acknowledged them; an empty checkpoint
   * keeps its op id, so a range from == to still reports that checkpoint's users */
  for (size_t i = 0; i < s->nuch; i++) {
    uint64_t id = s->uch[i].id;
    if ((id > from && id <= to) || (from == to && id == to))
      if (push_val(a, &u, &nu, &cu, s->uch[i].user)) goto nomem;
  }
  if (vals_copy(a, b, nb, &bc) || vals_copy(a, l, nl, &lc) || vals_copy(a, u, nu, &uc)) goto nomem;
  unlock(ms->db);
  ch.updated_buckets = bc;
  ch.n_updated_buckets = nb;
  ch.updated_lookups = lc;
  ch.n_updated_lookups = nl;
  ch.updated_write_checkpoint_users = uc;
  ch.n_updated_write_checkpoint_users = nu;
  rc = fn ? fn(&ch, payload) : BS_OK;
  goto out;
nomem:
  unlock(ms->db);
  rc = enomem(err, "checkpoint changes");
out:
  bs__free(a, b);
  bs__free(a, l);
  bs__free(a, u);
  bs__free(a, bc);
  bs__free(a, lc);
  bs__free(a, uc);
  return rc;
}

/* Source-row order of parameter results: (table id, XXH3_64 of replica id, replica id), the
 * key order of the LMDB backend's params sub-db. */
static int param_row_cmp(const mem_param *x, const mem_param *y) {
  uint64_t hx, hy;
  if (x->table != y->table) return x->table < y->table ? -1 : 1;
  hx = XXH3_64bits(x->rid.data, x->rid.size);
  hy = XXH3_64bits(y->rid.data, y->rid.size);
  if (hx != hy) return hx < hy ? -1 : 1;
  return bs__val_cmp(x->rid, y->rid);
}

static int param_ptr_cmp(const void *x, const void *y) {
  return param_row_cmp(*(const mem_param *const *)x, *(const mem_param *const *)y);
}

int bs__mem_parameter_sets(bs_storage *st, uint64_t c, const bs_val *lookups, size_t n,
                           size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                           bs_error *err) {
  mem_storage *ms = MS(st);
  mem_stream *s = ms->s;
  const bs_allocator *a = ALLOC(ms->db);
  const mem_param **latest = NULL;
  bs_val *rows = NULL, *copy = NULL;
  size_t nrows = 0, crows = 0;
  int rc = BS_OK;
  lock(ms->db);
  if (c < s->m.param_horizon) {
    rc = bs__fail(err, BS_ESTALE, "checkpoint %llu is below the parameter-compaction horizon %llu",
                  (unsigned long long)c, (unsigned long long)s->m.param_horizon);
    goto locked_out;
  }
  latest = bs__calloc(a, s->nparams ? s->nparams : 1, sizeof *latest);
  if (!latest) goto nomem;
  for (size_t i = 0; i < n; i++) {
    size_t nl = 0;
    if (val_in(lookups, i, lookups[i])) continue; /* a repeated key is served once */
    /* latest entry per source row with op_id <= C (params are in op id order) */
    for (size_t k = 0; k < s->nparams; k++) {
      const mem_param *p = &s->params[k];
      size_t j;
      if (p->id > c || !bs__val_eq(p->key, lookups[i])) continue;
      for (j = 0; j < nl; j++)
        if (latest[j]->table == p->table && bs__val_eq(latest[j]->rid, p->rid)) break;
      latest[j] = p;
      if (j == nl) nl++;
    }
    qsort(latest, nl, sizeof *latest, param_ptr_cmp);
    for (size_t j = 0; j < nl; j++)
      for (size_t r = 0; r < latest[j]->nrows; r++) {
        if (GROW(a, rows, nrows, crows, nrows + 1)) goto nomem;
        rows[nrows++] = latest[j]->rows[r];
      }
  }
  if (nrows > limit) {
    rc = bs__fail(err, BS_ELIMIT, "too many parameter results (limit was %zu)", limit);
    goto locked_out;
  }
  if (vals_copy(a, rows, nrows, &copy)) goto nomem;
  unlock(ms->db);
  for (size_t i = 0; i < nrows && !rc; i++) rc = fn ? fn(&copy[i], payload) : BS_OK;
  goto out;
nomem:
  rc = enomem(err, "parameter sets");
locked_out:
  unlock(ms->db);
out:
  bs__free(a, latest);
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
  bs_bucket_info *v = NULL;
  unsigned char *arena = NULL, *p;
  size_t n = 0, k = 0, bytes = 0;
  int rc = BS_OK;

  lock(ms->db);
  s = ms->s;
  for (size_t i = 0; i < s->nbuckets; i++) {
    const mem_bucket *b = s->buckets[i];
    if (b->n && bs__val_cmp(b->name, start_after) > 0) {
      n++;
      bytes += b->name.size;
    }
  }
  v = bs__malloc(a, (n ? n : 1) * sizeof *v);
  arena = bs__malloc(a, bytes ? bytes : 1);
  if (!v || !arena) {
    unlock(ms->db);
    rc = enomem(err, "list buckets");
    goto out;
  }
  p = arena;
  for (size_t i = 0; i < s->nbuckets; i++) {
    const mem_bucket *b = s->buckets[i];
    bs_bucket_info *in = &v[k];
    bs_checksum sum;
    if (!b->n || bs__val_cmp(b->name, start_after) <= 0) continue;
    memcpy(p, b->name.data, b->name.size);
    in->name.data = p;
    in->name.size = b->name.size;
    p += b->name.size;
    sum = sum_upto(b, UINT64_MAX);
    in->checksum = sum.checksum;
    in->count = sum.count;
    in->last_op = last_op_of(b);
    in->bytes = bucket_bytes(b);
    in->generation = b->generation;
    in->changes = changes_since(b);
    k++;
  }
  unlock(ms->db);
  qsort(v, n, sizeof *v, info_cmp);
  for (size_t i = 0; i < n; i++)
    if ((rc = fn(&v[i], payload)) != 0) break; /* the caller's value, unchanged */
out:
  bs__free(a, v);
  bs__free(a, arena);
  return rc;
}
