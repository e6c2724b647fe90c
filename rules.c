/*
 * rules.c: the small rules of the storage contract that the front and every backend apply, each
 * written once: which id a managed write checkpoint takes (contract.md 7), the checks of a read
 * (torn, below the parameter horizon, over the parameter limit: contract.md 5.4, 5.5), and where
 * bucket data is cut into chunks (contract.md 5.2). The larger rule modules are checksum.c, compact.c and lookup.c. Nothing here calls the
 * front or a backend.
 */
#include "internal.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* BS_SIZES (internal.h): one size per version of each struct. */
#define BS_ONE_SIZE_PER_VERSION(T, current)                                                        \
  _Static_assert(sizeof BS_SIZES(T) == (current) * sizeof(size_t), #T ": one size per version")
BS_ONE_SIZE_PER_VERSION(bs_open_options, BS_OPEN_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_stream_options, BS_STREAM_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_save, BS_SAVE_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_writer_options, BS_WRITER_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_commit_options, BS_COMMIT_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_batch_options, BS_BATCH_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_compact_options, BS_COMPACT_OPTIONS_VERSION);
BS_ONE_SIZE_PER_VERSION(bs_backup_options, BS_BACKUP_OPTIONS_VERSION);

int bs__versioned_copy(void *out, const void *in, const size_t *sizes, unsigned current,
                       const char *what, bs_error *err) {
  unsigned v;
  memcpy(&v, in, sizeof v); /* the first member of every options struct */
  if (v < 1 || v > current)
    return bs__fail(err, BS_EINVAL, "%s %u is not supported (this build: %u)", what, v, current);
  memcpy(out, in, sizes[v - 1]);
  memcpy(out, &current, sizeof current);
  return BS_OK;
}

int bs__managed_next_id(const bs_managed_request *w, int exists, uint64_t stored, uint64_t *id,
                        int *action, bs_error *err) {
  int act = BS_WCP_REPLACE;
  uint64_t next;
  if (!w->has_request_id) {
    next = stored + 1; /* stored < 2^63: no wrap */
  } else if (!exists || w->request_id > stored) {
    next = w->request_id > stored ? w->request_id : stored;
  } else {
    next = stored;
    act = w->request_id == stored ? BS_WCP_REFRESH : BS_WCP_KEEP;
  }
  if (next >= (UINT64_C(1) << 63)) {
    /* a constant status, so that a caller inlining this sees the outputs are not used then */
    bs__fail(err, BS_EINVAL, "user %.*s: write checkpoint id would pass 2^63", (int)w->user_id.size,
             (const char *)w->user_id.data);
    return BS_EINVAL;
  }
  *id = next;
  *action = act;
  return BS_OK;
}

/* By user id, then in request order (one array: pointer order is request order). */
static int winner_cmp(const void *a, const void *b) {
  const bs_managed_request *x = *(const bs_managed_request *const *)a;
  const bs_managed_request *y = *(const bs_managed_request *const *)b;
  int c = bs__val_cmp(x->user_id, y->user_id);
  return c ? c : x < y ? -1 : x > y;
}

size_t bs__managed_winners(const bs_managed_request *req, size_t n,
                           const bs_managed_request **win) {
  size_t nw = 0;
  for (size_t i = 0; i < n; i++) win[i] = &req[i];
  qsort(win, n, sizeof *win, winner_cmp); /* a user's requests side by side, O(n log n) */
  for (size_t i = 0; i < n; i++)
    if (nw == 0 || !bs__val_eq(win[nw - 1]->user_id, win[i]->user_id))
      win[nw++] = win[i];
    else if (bs__managed_req_beats(win[i], win[nw - 1]))
      win[nw - 1] = win[i];
  return nw;
}

int bs__managed_mode_check(bs_write_checkpoint_mode mode, bs_error *err) {
  if (mode == BS_WCP_MANAGED) return BS_OK;
  return bs__fail(err, BS_ESTATE, "managed write checkpoints in custom mode");
}

bool bs__heads_passed(bs__head_next_fn next, void *it, const bs_val *commit_lsn,
                      const bs_head *given, size_t n) {
  bs_val conn, lsn;
  while (next(it, &conn, &lsn))
    if (commit_lsn ? !bs__head_passed(lsn, *commit_lsn) : !bs__head_reached(conn, lsn, given, n))
      return false;
  return true;
}

int bs__head_array_next(void *it, bs_val *conn, bs_val *lsn) {
  bs__head_array *a = it;
  if (!a->n) return 0;
  *conn = a->h->connection;
  *lsn = a->h->lsn;
  a->h++;
  a->n--;
  return 1;
}

int bs__managed_commit(bs_val lsn, int (*next)(void *ctx, bs__wcp_waiting *w, bs_error *err),
                       int (*done)(void *ctx, bs_val user, bs_error *err), void *ctx,
                       bs_error *err) {
  bs__wcp_waiting w;
  int rc;
  while ((rc = next(ctx, &w, err)) == 1)
    if (bs__heads_passed(w.next, w.it, &lsn, NULL, 0) && (rc = done(ctx, w.user, err))) return rc;
  return rc;
}

int bs__managed_answer(uint64_t *ids_out, int *should_advance, const bs_managed_request *req,
                       size_t n, bs__managed_find_fn find, void *ctx, bs_error *err) {
  int adv = 0, rc;
  for (size_t i = 0; i < n; i++) {
    uint64_t id = 0;
    int live = 0, processed = 0;
    if ((rc = find(ctx, req[i].user_id, &live, &id, &processed, err))) return rc;
    ids_out[i] = live ? id : 0;
    if (live && !processed) adv = 1; /* it waits for a commit that passes its heads */
  }
  *should_advance = adv;
  return BS_OK;
}

/* ---- Read checks ------------------------------------------------------------------------------ */

int bs__torn_fail(uint64_t c, bs_val name, bs_error *err) {
  return bs__fail(err, BS_EINVALIDATED,
                  "bucket \"%.*s\": checkpoint %" PRIu64 " was compacted; read a newer checkpoint",
                  bs__name_shown(name), name.size ? (const char *)name.data : "", c);
}

int bs__param_horizon_check(uint64_t c, uint64_t horizon, bs_error *err) {
  if (c >= horizon) return BS_OK;
  return bs__fail(err, BS_ESTALE,
                  "checkpoint %" PRIu64 " is below the parameter-compaction horizon %" PRIu64
                  "; read a newer checkpoint",
                  c, horizon);
}

int bs__param_limit_check(size_t n, size_t limit, bs_error *err) {
  if (n <= limit) return BS_OK;
  return bs__fail(err, BS_ELIMIT, "too many parameter results (limit was %zu)", limit);
}

int bs__source_row_missing(bs_val table, bs_error *err) {
  return bs__fail(err, BS_ENOTFOUND, "source row not found in table '%.*s'", bs__name_shown(table),
                  table.size ? (const char *)table.data : "");
}

void bs__stat_op(bs_stat *out, unsigned type) {
  uint64_t *count[] = {NULL, &out->ops_put, &out->ops_remove, &out->ops_move, &out->ops_clear};
  if (type >= BS_OP_PUT && type <= BS_OP_CLEAR) (*count[type])++;
}

/* ---- Bucket data chunks ---------------------------------------------------------------------- */

void bs__chunker_init(bs__chunker *k, const bs_allocator *a, const bs_batch_options *o,
                      int (*on_chunk)(const bs_chunk *, void *), void *payload) {
  memset(k, 0, sizeof *k);
  k->a = a;
  k->limit = o->limit;
  k->chunk_bytes = o->chunk_bytes; /* 0 is honoured: one op per chunk */
  k->max_bytes = o->max_bytes;
  k->on_chunk = on_chunk;
  k->payload = payload;
  if (on_chunk == bs__cols_chunk) k->cols = payload; /* column mode (bs__cols) */
}

void bs__chunker_bucket(bs__chunker *k, bs_val name, uint64_t after) {
  memset(&k->ch, 0, sizeof k->ch);
  k->ch.bucket = name;
  k->ch.after = after;
  k->n = k->csize = 0;
}

static int chunk_emit(bs__chunker *k, int has_more) {
  k->ch.has_more = has_more;
  if (k->cols) {
    k->ch.next_after = k->cols->ids[k->n - 1];
    return bs__cols_emit(k->cols, &k->ch, k->n);
  }
  k->ch.ops = k->ops;
  k->ch.n_ops = k->n;
  k->ch.next_after = k->ops[k->n - 1].op_id;
  return k->on_chunk(&k->ch, k->payload);
}

int bs__chunker_cut(bs__chunker *k) {
  int rc = chunk_emit(k, 1);
  k->ch.after = k->ch.next_after;
  k->ch.target_op = 0;
  k->n = k->csize = 0;
  return rc;
}

int bs__chunker_grow(bs__chunker *k, bs_error *err) {
  if (BS_GROW(k->a, k->ops, k->cap, k->n + 1))
    return bs__fail(err, BS_ENOMEM, "bucket data: op array of %zu ops", k->n + 1);
  return BS_OK;
}

int bs__chunker_end(bs__chunker *k) {
  return k->n > 0 ? chunk_emit(k, k->stopped) : BS_OK;
}

/* bs__chunker_add for an op stored as an op value (internal.h "Op chunks"; LMDB's op records):
 * laid out in the chunker's columns straight from the value, its fields one copy. */
int bs__chunker_add_value(bs__chunker *k, uint64_t id, const unsigned char *p, size_t size,
                          unsigned chunk_flags, bs_error *err) {
  bs__cols *s = k->cols;
  size_t ot = 0, oi = 0, sk = 0, ds = 0, sz, at = s->blen, i = k->n;
  unsigned type;
  uint64_t target;
  uint32_t *f;
  bs_op op;
  int rc;
  /* both encodings keep a row's four fields one after another, from object_type on */
  if (bs__op_value_decode_as(p, size, id, chunk_flags, &op) != BS_OK) goto corrupt;
  type = (unsigned)op.type;
  if (bs__op_carries_row(op.type)) {
    ot = op.object_type.size, oi = op.object_id.size, sk = op.subkey.size;
    ds = op.type == BS_OP_PUT ? op.data.size : 0;
  }
  sz = ot + oi + sk + ds;
  if (k->served >= k->limit || (k->served > 0 && !bs__chunker_fits(k->bytes, sz, k->max_bytes))) {
    k->stopped = 1;
    return BS_OK;
  }
  if (k->n > 0 && !bs__chunker_fits(k->csize, sz, k->chunk_bytes)) {
    if ((rc = bs__chunker_cut(k))) return rc;
    at = s->blen, i = 0;
  }
  if (i >= s->cap && (rc = bs__cols_room(s, i, err))) return rc;
  if (sz > s->bcap - at &&
      (rc = bs__cols_bytes(s, k->chunk_bytes < k->max_bytes ? k->chunk_bytes : k->max_bytes,
                           at + sz, err)))
    return rc;
  target = op.target_op;
  s->ids[i] = id;
  s->types[i] = (uint8_t)type;
  s->sums[i] = op.checksum;
  s->targets[i] = target;
  f = s->offs + 4 * i;
  f[0] = (uint32_t)at, f[1] = (uint32_t)(at + ot), f[2] = (uint32_t)(at + ot + oi);
  f[3] = (uint32_t)(at + ot + oi + sk);
  if (sz) memcpy(s->bytes + at, op.object_type.data, sz);
  s->blen = at + sz;
  k->n = i + 1;
  k->csize += sz;
  k->served++;
  k->bytes += sz;
  if ((type == BS_OP_MOVE || type == BS_OP_CLEAR) && target > k->ch.target_op)
    k->ch.target_op = target;
  return BS_OK;
corrupt:
  return bs__fail(err, BS_ECORRUPT, "bucket \"%.*s\": op %" PRIu64 " does not decode",
                  bs__name_shown(k->ch.bucket), (const char *)k->ch.bucket.data, id);
}

void bs__chunker_free(bs__chunker *k) {
  bs__free(k->a, k->ops);
  k->ops = NULL;
  k->cap = 0;
}
