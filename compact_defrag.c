/*
 * compact_defrag.c: defragmentation (contract.md 6, opt-in with defragment_ratio), written once
 * over a backend's primitives (bs__defrag_store, internal.h). compact_run.c hands over the
 * buckets its jobs finished; here: which of them are fragmented enough (compact.c's
 * bs__compact_defrag_due) and fit in the memory bound, which rows are live (a source record's
 * membership at or below the horizon), the order they are written again in, the transactions
 * (max_ops_per_txn rows each) and the report after each. The backend walks its source records
 * and writes a transaction's rows as its writer would.
 */
#include "internal.h"

#include <stdlib.h>

typedef struct dplan {
  const uint64_t *ids; /* the candidates, sorted */
  size_t n;
  uint64_t horizon;
  uint64_t *live, *bytes;      /* pass 1: per candidate */
  const unsigned char *chosen; /* pass 2: per candidate */
  bs__defrag_row *rows;
  size_t n_rows, cap_rows;
  unsigned char *keys;
  size_t keys_used, keys_cap;
  int pass;
} dplan;

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

static int cmp_row(const void *x, const void *y) {
  const bs__defrag_row *a = x, *b = y;
  if (a->bucket != b->bucket) return a->bucket < b->bucket ? -1 : 1;
  return cmp_u64(&a->old_op, &b->old_op);
}

/* A membership: pass 1 counts the candidate's live rows and their bytes, pass 2 keeps the chosen
 * candidates' rows. */
static int member(void *arg, uint64_t bucket, uint64_t op, const unsigned char *key,
                  size_t key_size) {
  dplan *p = arg;
  const uint64_t *at = op > p->horizon ? NULL : bsearch(&bucket, p->ids, p->n, sizeof *at, cmp_u64);
  size_t i = at ? (size_t)(at - p->ids) : 0;
  if (!at) return BS_OK;
  if (p->pass == 1) {
    p->live[i]++;
    p->bytes[i] += sizeof(bs__defrag_row) + key_size;
    return BS_OK;
  }
  if (!p->chosen[i]) return BS_OK;
  /* pass 1 sized both arrays for the chosen buckets in this same snapshot */
  if (p->n_rows == p->cap_rows || p->keys_cap - p->keys_used < key_size) return BS_ECORRUPT;
  if (key_size) memcpy(p->keys + p->keys_used, key, key_size);
  p->rows[p->n_rows].bucket = bucket;
  p->rows[p->n_rows].old_op = op;
  p->rows[p->n_rows].key = p->keys + p->keys_used;
  p->rows[p->n_rows].key_size = key_size;
  p->n_rows++;
  p->keys_used += key_size;
  return BS_OK;
}

static int walk(const bs__defrag_store *s, void *x, dplan *p, int pass, bs_error *err) {
  int rc;
  p->pass = pass;
  rc = s->members(x, member, p, err);
  if (rc == BS_ECORRUPT && pass == 2)
    return bs__fail(err, rc, "defragment: the source records changed within one snapshot");
  return rc;
}

/* Chooses the buckets (in id order, while their rows fit in the memory limit) and collects their
 * rows, sorted by (bucket, op), in one snapshot. */
static int plan(const bs__defrag_store *s, void *x, const bs_allocator *a, bs__compact_run *r,
                dplan *p) {
  unsigned char *chosen = NULL;
  uint64_t budget = (uint64_t)r->o->memory_limit_mb * 1024u * 1024u, used = 0;
  size_t rows = 0;
  int rc;
  if (!(p->live = bs__calloc(a, p->n, sizeof *p->live)) ||
      !(p->bytes = bs__calloc(a, p->n, sizeof *p->bytes)) || !(chosen = bs__calloc(a, p->n, 1)))
    return bs__fail(r->err, BS_ENOMEM, "defragment: plan");
  p->chosen = chosen;
  if ((rc = s->begin(x, r->err))) goto out;
  if ((rc = walk(s, x, p, 1, r->err))) goto end;
  for (size_t i = 0; i < p->n; i++) {
    uint64_t count = 0;
    int found = 0;
    if ((rc = s->count(x, p->ids[i], &count, &found, r->err))) goto end;
    if (!found || !bs__compact_defrag_due(p->live[i], count, r->o->defragment_ratio)) continue;
    if (used + p->bytes[i] > budget) continue;
    used += p->bytes[i];
    chosen[i] = 1;
    rows += p->live[i];
  }
  if (!rows) goto end;
  if (!(p->rows = bs__calloc(a, rows, sizeof *p->rows)) || !(p->keys = bs__malloc(a, used))) {
    rc = bs__fail(r->err, BS_ENOMEM, "defragment: %zu rows", rows);
    goto end;
  }
  p->cap_rows = rows;
  p->keys_cap = used;
  if (!(rc = walk(s, x, p, 2, r->err))) qsort(p->rows, p->n_rows, sizeof *p->rows, cmp_row);
end:
  s->end(x);
out:
  p->chosen = NULL;
  bs__free(a, chosen);
  return rc;
}

int bs__compact_defrag(const bs__defrag_store *s, void *x, const bs_allocator *a,
                       bs__compact_run *r, const uint64_t *ids, size_t n) {
  dplan p;
  int rc;
  memset(&p, 0, sizeof p);
  p.ids = ids;
  p.n = n;
  p.horizon = r->horizon;
  rc = plan(s, x, a, r, &p);
  for (size_t i = 0, k; !rc && i < p.n_rows; i += k) {
    uint64_t emitted = 0;
    k = p.n_rows - i < r->o->max_ops_per_txn ? p.n_rows - i : r->o->max_ops_per_txn;
    if ((rc = s->reemit(x, p.rows + i, k, &emitted, r->err))) break;
    r->stats->ops_reemitted += emitted;
    rc = bs__compact_report(r);
  }
  bs__free(a, p.live);
  bs__free(a, p.bytes);
  bs__free(a, p.rows);
  bs__free(a, p.keys);
  return rc;
}
