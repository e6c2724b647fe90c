/*
 * mem_read.c: the memory backend's reads (contract.md 5), the engine's (reads.c, whose slots
 * are in the table) over this store: the call's snapshot is the store's lock, and the primitives
 * walk its arrays. The rules of the reads are all in reads.c.
 */
#include "mem_internal.h"

static int r_begin(void *x, bs_error *err) {
  BS_UNUSED(err);
  lock(MS(x)->db);
  return BS_OK;
}

static void r_end(void *x) {
  unlock(MS(x)->db);
}

static void r_row(void *x, bs__stream_row *out) {
  *out = MS(x)->s->m.row;
}

static bs__read_bucket rbucket(const mem_bucket *b) {
  bs__read_bucket r = {b->name,         b->clear_start,     b->clear_op,   b->generation,
                       b->compacted_op, b->compacted_count, last_op_of(b), b};
  return r;
}

static int r_bucket(void *x, bs_val name, bs__read_bucket *out, int *found, bs_error *err) {
  const mem_bucket *b = bucket_find(MS(x)->s, name, NULL);
  BS_UNUSED(err);
  if ((*found = b != NULL)) *out = rbucket(b);
  return BS_OK;
}

static int r_buckets(void *x, int (*fn)(void *, const bs__read_bucket *), void *arg,
                     bs_error *err) {
  const mem_stream *s = MS(x)->s;
  int rc = BS_OK;
  BS_UNUSED(err);
  for (size_t i = 0; i < s->nbuckets && !rc; i++) {
    bs__read_bucket b = rbucket(s->buckets[i]);
    rc = fn(arg, &b);
  }
  return rc;
}

static int r_ops(void *x, const bs__read_bucket *rb, uint64_t after, uint64_t to,
                 int (*fn)(void *, const bs_op *), void *arg, bs_error *err) {
  const mem_bucket *b = rb->h;
  int rc = BS_OK;
  BS_UNUSED(x);
  BS_UNUSED(err);
  for (size_t k = 0; k < b->n && b->ops[k].op_id <= to && !rc; k++) /* ops ascend by id */
    if (b->ops[k].op_id > after) rc = fn(arg, &b->ops[k]);
  return rc;
}

/* The change log (bch: an op's bucket; uch: a user filed under an op id) and the parameter
 * entries, each scanned whole. */
static int r_changes(void *x, int kind, uint64_t lo, uint64_t hi, int (*fn)(void *, bs_val),
                     void *arg, bs_error *err) {
  const mem_stream *s = MS(x)->s;
  int rc = BS_OK;
  BS_UNUSED(err);
  for (size_t i = 0; kind == 0 && i < s->nbch && !rc; i++)
    if (s->bch[i].id >= lo && s->bch[i].id <= hi) rc = fn(arg, s->buckets[s->bch[i].bucket]->name);
  for (size_t i = 0; kind == 1 && i < s->nparams && !rc; i++)
    if (s->params[i].id >= lo && s->params[i].id <= hi) rc = fn(arg, s->params[i].key);
  for (size_t i = 0; kind == 2 && i < s->nuch && !rc; i++)
    if (s->uch[i].id >= lo && s->uch[i].id <= hi) rc = fn(arg, s->uch[i].user);
  return rc;
}

/* The lookup's run of entries (param_cmp's order: its rows in the order handed out), each row's
 * entry at C its newest at or below C. */
static int r_params(void *x, bs_val lookup, uint64_t c, int (*fn)(void *, const bs_val *, size_t),
                    void *arg) {
  const mem_stream *s = MS(x)->s;
  mem_param first = {.key = lookup}; /* table 0 names no table: before the lookup's rows */
  int rc = BS_OK;
  for (size_t k = param_lower(s, &first);
       k < s->nparams && bs__val_eq(s->params[k].key, lookup) && !rc; k++)
    if (s->params[k].id <= c && !param_newer(s, k, c))
      rc = fn(arg, s->params[k].rows, s->params[k].nrows);
  return rc;
}

const bs__read_store bs__mem_reads = {r_begin,   r_end, r_row,     r_bucket,
                                      r_buckets, r_ops, r_changes, r_params};
