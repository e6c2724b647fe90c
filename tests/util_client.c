/*
 * util_client.c: the reference client's algorithm (see util_client.h).
 *
 * Applying one op to a bucket, as the client's oplog does:
 *  - PUT / REMOVE of a row key: a stored op of that key is superseded (its checksum moves from
 *    op_checksum to add_checksum and it is deleted); a PUT is then stored (op_checksum += its
 *    checksum); a REMOVE is not stored (add_checksum += its checksum).
 *  - MOVE: add_checksum += its checksum (it stands for an op the client may never have seen).
 *  - CLEAR: every stored op goes; add_checksum = its checksum, op_checksum = 0.
 *  - last_op = the op's id.
 * A bucket's checksum is add_checksum + op_checksum (mod 2^32).
 */
#include "util_client.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- Lines ---------------------------------------------------------------------------------- */

void sl_line_free(sl_line *l) {
  size_t i;
  for (i = 0; i < l->n_buckets; i++) free(l->buckets[i].name);
  free(l->buckets);
  for (i = 0; i < l->n_removed; i++) free(l->removed[i]);
  free(l->removed);
  free(l->bucket);
  ct_oplist_free(&l->ops);
  memset(l, 0, sizeof *l);
}

const char *sl_kind_name(sl_kind k) {
  switch (k) {
  case SL_CHECKPOINT:
    return "checkpoint";
  case SL_CHECKPOINT_DIFF:
    return "checkpoint_diff";
  case SL_DATA:
    return "data";
  case SL_CHECKPOINT_COMPLETE:
    return "checkpoint_complete";
  case SL_PARTIAL_COMPLETE:
    return "partial_checkpoint_complete";
  }
  return "?";
}

/* ---- Local bucket state --------------------------------------------------------------------- */

static void bucket_free(cl_bucket *b) {
  size_t i;
  for (i = 0; i < b->n; i++) {
    free(b->rows[i].key);
    free(b->rows[i].data);
  }
  free(b->rows);
  free(b->name);
  memset(b, 0, sizeof *b);
}

/* Index of name in c->b, or the insertion point with *found = 0. */
static size_t bucket_pos(const cl_client *c, const char *name, int *found) {
  return ct_sorted_pos(c->b, c->n, sizeof *c->b, offsetof(cl_bucket, name), name, strlen(name),
                       found);
}

cl_bucket *cl_find(const cl_client *c, const char *name) {
  int found;
  size_t i = bucket_pos(c, name, &found);
  return found ? &c->b[i] : NULL;
}

static cl_bucket *bucket_get(cl_client *c, const char *name) {
  int found;
  size_t i = bucket_pos(c, name, &found);
  if (found) return &c->b[i];
  c->b = ct_insert_at(c->b, &c->n, &c->cap, i, sizeof *c->b);
  c->b[i].name = ct_strdup(name);
  return &c->b[i];
}

/* removeBuckets: the local state of a bucket that left the checkpoint is deleted. */
static void bucket_remove(cl_client *c, const char *name) {
  int found;
  size_t i = bucket_pos(c, name, &found);
  if (!found) return;
  bucket_free(&c->b[i]);
  ct_remove_at(c->b, &c->n, i, sizeof *c->b);
}

static size_t row_pos(const cl_bucket *b, const char *key, int *found) {
  return ct_sorted_pos(b->rows, b->n, sizeof *b->rows, offsetof(cl_row, key), key, strlen(key),
                       found);
}

const cl_row *cl_row_find(const cl_bucket *b, const char *key) {
  int found;
  size_t i = row_pos(b, key, &found);
  return found ? &b->rows[i] : NULL;
}

uint32_t cl_checksum(const cl_bucket *b) {
  return b ? (uint32_t)(b->add_checksum + b->op_checksum) : 0;
}

static void apply_op(cl_bucket *b, const ct_op *op) {
  size_t i;
  int found;
  char *key;
  b->last_op = op->op_id;
  if (op->type == BS_OP_MOVE) {
    b->add_checksum += op->checksum;
    return;
  }
  if (op->type == BS_OP_CLEAR) {
    for (i = 0; i < b->n; i++) {
      free(b->rows[i].key);
      free(b->rows[i].data);
    }
    b->n = 0;
    b->add_checksum = op->checksum;
    b->op_checksum = 0;
    return;
  }
  key = ct_row_key(op);
  i = row_pos(b, key, &found);
  if (found) { /* superseded */
    b->add_checksum += b->rows[i].checksum;
    b->op_checksum -= b->rows[i].checksum;
    free(b->rows[i].key);
    free(b->rows[i].data);
    ct_remove_at(b->rows, &b->n, i, sizeof *b->rows);
  }
  if (op->type == BS_OP_REMOVE) {
    b->add_checksum += op->checksum;
    free(key);
    return;
  }
  b->rows = ct_insert_at(b->rows, &b->n, &b->cap, i, sizeof *b->rows);
  b->rows[i].key = key;
  b->rows[i].op_id = op->op_id;
  b->rows[i].checksum = op->checksum;
  b->rows[i].data = ct_strndup(op->data.p ? op->data.p : "", op->data.n);
  b->op_checksum += op->checksum;
}

/* ---- Client --------------------------------------------------------------------------------- */

void cl_init(cl_client *c) {
  memset(c, 0, sizeof *c);
  c->validated_priority = -1;
}

static void target_free(cl_checkpoint *t) {
  size_t i;
  for (i = 0; i < t->n; i++) free(t->b[i].name);
  free(t->b);
  memset(t, 0, sizeof *t);
}

void cl_free(cl_client *c) {
  size_t i;
  for (i = 0; i < c->n; i++) bucket_free(&c->b[i]);
  free(c->b);
  target_free(&c->target);
  memset(c, 0, sizeof *c);
}

void cl_clone(cl_client *dst, const cl_client *src) {
  size_t i, j;
  cl_init(dst);
  dst->applied_cp = src->applied_cp;
  for (i = 0; i < src->n; i++) {
    const cl_bucket *s = &src->b[i];
    cl_bucket *d = bucket_get(dst, s->name);
    d->last_op = s->last_op;
    d->add_checksum = s->add_checksum;
    d->op_checksum = s->op_checksum;
    d->rows = ct_grow(NULL, &d->cap, s->n, sizeof *d->rows);
    for (j = 0; j < s->n; j++) {
      d->rows[j] = s->rows[j];
      d->rows[j].key = ct_strdup(s->rows[j].key);
      d->rows[j].data = ct_strdup(s->rows[j].data);
    }
    d->n = s->n;
  }
}

void cl_connect(cl_client *c, bs_bucket_request **req_out, size_t *n_out) {
  size_t i;
  bs_bucket_request *req = calloc(c->n ? c->n : 1, sizeof *req);
  assert_non_null(req);
  for (i = 0; i < c->n; i++) {
    req[i].bucket = ct_v(c->b[i].name);
    req[i].after = c->b[i].last_op;
  }
  c->connected = 1;
  c->has_target = 0;
  target_free(&c->target);
  *req_out = req;
  *n_out = c->n;
}

void cl_disconnect(cl_client *c) {
  c->connected = 0;
  c->has_target = 0;
  target_free(&c->target);
}

static size_t target_pos(const cl_checkpoint *t, const char *name, int *found) {
  return ct_sorted_pos(t->b, t->n, sizeof *t->b, offsetof(sl_bucket_checksum, name), name,
                       strlen(name), found);
}

const sl_bucket_checksum *cl_target_bucket(const cl_client *c, const char *name) {
  int found;
  size_t i = target_pos(&c->target, name, &found);
  return found ? &c->target.b[i] : NULL;
}

static void target_set(cl_checkpoint *t, const sl_bucket_checksum *bc) {
  int found;
  size_t i = target_pos(t, bc->name, &found);
  if (!found) {
    t->b = ct_insert_at(t->b, &t->n, &t->cap, i, sizeof *t->b);
    t->b[i].name = ct_strdup(bc->name);
  }
  t->b[i].checksum = bc->checksum;
  t->b[i].count = bc->count;
  t->b[i].priority = bc->priority;
}

static void target_del(cl_checkpoint *t, const char *name) {
  int found;
  size_t i = target_pos(t, name, &found);
  if (!found) return;
  free(t->b[i].name);
  ct_remove_at(t->b, &t->n, i, sizeof *t->b);
}

/* syncLocalDatabase's validation: every bucket of the target with priority <= prio (-1: all). */
static int validate(cl_client *c, uint64_t last_op_id, int prio) {
  size_t i;
  if (!c->has_target) {
    snprintf(c->why, sizeof c->why, "%s without a checkpoint",
             prio < 0 ? "checkpoint_complete" : "partial_checkpoint_complete");
    return CL_PROTOCOL;
  }
  if (last_op_id != c->target.last_op_id) {
    snprintf(c->why, sizeof c->why, "completion of %llu while the target checkpoint is %llu",
             (unsigned long long)last_op_id, (unsigned long long)c->target.last_op_id);
    return CL_PROTOCOL;
  }
  for (i = 0; i < c->target.n; i++) {
    const sl_bucket_checksum *t = &c->target.b[i];
    const cl_bucket *b;
    if (prio >= 0 && t->priority > prio) continue;
    b = cl_find(c, t->name);
    if (cl_checksum(b) != t->checksum) {
      snprintf(c->why, sizeof c->why,
               "checksum mismatch at %s %llu (priority %d): bucket %s local %u (add %u + op %u, "
               "%zu rows, last_op %llu), checkpoint %u (count %llu)",
               prio < 0 ? "checkpoint_complete" : "partial_checkpoint_complete",
               (unsigned long long)last_op_id, prio, t->name, cl_checksum(b),
               b ? b->add_checksum : 0, b ? b->op_checksum : 0, b ? b->n : 0,
               (unsigned long long)(b ? b->last_op : 0), t->checksum, (unsigned long long)t->count);
      return CL_MISMATCH;
    }
  }
  c->validated_cp = last_op_id;
  c->validated_priority = prio;
  if (prio < 0) {
    c->applied_cp = last_op_id;
    c->completes++;
  } else {
    c->partials++;
  }
  return CL_VALIDATED;
}

static int apply_data(cl_client *c, const sl_line *l) {
  cl_bucket *b;
  size_t i;
  uint64_t last;
  if (!c->has_target) {
    snprintf(c->why, sizeof c->why, "data line before any checkpoint");
    return CL_PROTOCOL;
  }
  if (!cl_target_bucket(c, l->bucket)) {
    snprintf(c->why, sizeof c->why, "data for %s, which is not in the checkpoint", l->bucket);
    return CL_PROTOCOL;
  }
  b = cl_find(c, l->bucket);
  last = b ? b->last_op : 0;
  /* Not something the reference client checks, but a server that honours the requested
   * positions always continues exactly where the client is. */
  if (l->after != last) {
    snprintf(c->why, sizeof c->why, "data for %s after %llu, but the client is at %llu", l->bucket,
             (unsigned long long)l->after, (unsigned long long)last);
    return CL_PROTOCOL;
  }
  if (!l->ops.n || l->next_after != l->ops.v[l->ops.n - 1].op_id) {
    snprintf(c->why, sizeof c->why, "data for %s: %zu ops, next_after %llu", l->bucket, l->ops.n,
             (unsigned long long)l->next_after);
    return CL_PROTOCOL;
  }
  b = bucket_get(c, l->bucket);
  for (i = 0; i < l->ops.n; i++) {
    const ct_op *op = &l->ops.v[i];
    if (op->op_id <= b->last_op || op->op_id > c->target.last_op_id) {
      snprintf(c->why, sizeof c->why, "data for %s: op %llu after %llu, checkpoint %llu", l->bucket,
               (unsigned long long)op->op_id, (unsigned long long)b->last_op,
               (unsigned long long)c->target.last_op_id);
      return CL_PROTOCOL;
    }
    apply_op(b, op);
    c->data_ops++;
  }
  return CL_OK;
}

int cl_apply(cl_client *c, const sl_line *l) {
  size_t i, j;
  c->lines++;
  c->last_kind = l->kind;
  switch (l->kind) {
  case SL_CHECKPOINT:
    /* buckets not in the new checkpoint are removed; the target is replaced */
    for (i = 0; i < c->n;) {
      int keep = 0;
      for (j = 0; j < l->n_buckets && !keep; j++)
        keep = strcmp(l->buckets[j].name, c->b[i].name) == 0;
      if (keep)
        i++;
      else
        bucket_remove(c, c->b[i].name);
    }
    target_free(&c->target);
    for (j = 0; j < l->n_buckets; j++) target_set(&c->target, &l->buckets[j]);
    c->target.last_op_id = l->last_op_id;
    c->has_target = 1;
    return CL_OK;
  case SL_CHECKPOINT_DIFF:
    if (!c->has_target) {
      snprintf(c->why, sizeof c->why, "checkpoint_diff without a previous checkpoint");
      return CL_PROTOCOL;
    }
    if (l->last_op_id < c->target.last_op_id) {
      snprintf(c->why, sizeof c->why, "checkpoint_diff %llu goes back from %llu",
               (unsigned long long)l->last_op_id, (unsigned long long)c->target.last_op_id);
      return CL_PROTOCOL;
    }
    for (j = 0; j < l->n_buckets; j++) target_set(&c->target, &l->buckets[j]);
    for (j = 0; j < l->n_removed; j++) {
      target_del(&c->target, l->removed[j]);
      bucket_remove(c, l->removed[j]);
    }
    c->target.last_op_id = l->last_op_id;
    return CL_OK;
  case SL_DATA:
    return apply_data(c, l);
  case SL_CHECKPOINT_COMPLETE:
    return validate(c, l->last_op_id, -1);
  case SL_PARTIAL_COMPLETE:
    return validate(c, l->last_op_id, l->priority);
  }
  snprintf(c->why, sizeof c->why, "unknown line kind %d", (int)l->kind);
  return CL_PROTOCOL;
}
