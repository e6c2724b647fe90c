/*
 * cli_buckets.c: the list of a stream's buckets that `stat`, `dump` and `compact` work from,
 * collected through bs_list_buckets (the public API, so any backend, --memory included) into
 * an array the caller owns. It pages through the listing, so no read snapshot lives long
 * however many buckets the stream has, and copies the names out, so that the caller then reads
 * each bucket with calls of its own.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE      4096u /* buckets per bs_list_buckets call */
#define PAGE_FULL 1     /* our callback's "stop here" (positive: never a BS_* code) */

typedef struct collector {
  cli_bucket *v;
  size_t n, cap;
  size_t in_page;
  int stop; /* why collect stopped the call (PAGE_FULL, BS_ENOMEM): the library says BS_EUSER */
} collector;

void cli_buckets_free(cli_bucket *b, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) free(b[i].name);
  free(b);
}

/* Appends one bucket (name copied: info is borrowed); stops the call when the page is full. */
static int collect(const bs_bucket_info *info, void *payload) {
  collector *c = payload;
  cli_bucket *b;
  if (c->n == c->cap) {
    size_t ncap = c->cap ? c->cap * 2 : 64;
    cli_bucket *p = realloc(c->v, ncap * sizeof *p);
    if (!p) return c->stop = BS_ENOMEM;
    c->v = p;
    c->cap = ncap;
  }
  b = &c->v[c->n];
  if (!(b->name = malloc(info->name.size + 1))) return c->stop = BS_ENOMEM;
  memcpy(b->name, info->name.data, info->name.size);
  b->name[info->name.size] = '\0';
  b->name_size = info->name.size;
  b->ops = info->count;
  b->bytes = info->bytes;
  b->last_op = info->last_op;
  b->changes = info->changes;
  b->due = 0;
  c->n++;
  return ++c->in_page == PAGE ? (c->stop = PAGE_FULL) : 0;
}

int cli_buckets_list(bs_storage *st, cli_bucket **out, size_t *n_out, bs_error *err) {
  collector c = {NULL, 0, 0, 0, 0};
  bs_val after = {NULL, 0};
  int rc;
  *out = NULL;
  *n_out = 0;
  do {
    c.in_page = 0;
    c.stop = 0;
    if ((rc = bs_list_buckets(st, after, collect, &c, err)) == BS_EUSER) rc = c.stop;
    /* the next page starts after the last name collected (a copy we own) */
    if (c.n) {
      after.data = c.v[c.n - 1].name;
      after.size = c.v[c.n - 1].name_size;
    }
  } while (rc == PAGE_FULL);
  if (rc) {
    cli_buckets_free(c.v, c.n);
    if (c.stop == BS_ENOMEM) cli_fail(err, rc, "out of memory listing buckets");
    return rc;
  }
  *out = c.v;
  *n_out = c.n;
  return BS_OK;
}

/* bs_compact's selection of b with the default ratio and min_changes (0 = the default). */
int cli_bucket_due(const cli_bucket *b, uint64_t min_changes) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_bucket_info info = {{NULL, 0}, 0, 0, 0, 0, 0, 0};
  int due = 0;
  o.min_bucket_changes = min_changes;
  info.count = b->ops;
  info.changes = b->changes;
  return bs_compact_bucket_due(&due, &o, &info, NULL) == BS_OK && due;
}
