/*
 * bs__mem_verify.c: the memory backend's verify: real checks on the naive store (every derived value
 * recomputed, every index entry found where it points).
 */
#include "mem_internal.h"

/* ---- verify: real checks on the naive store -------------------------------------------------- */

typedef struct vlist {
  const bs_allocator *a;
  char **msgs;
  size_t n, cap;
  int oom;
} vlist;

static void problem(vlist *v, const char *fmt, ...) BS_PRINTF(2, 3);
static void problem(vlist *v, const char *fmt, ...) {
  char buf[256], *p;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (GROW(v->a, v->msgs, v->n, v->cap, v->n + 1) || !(p = bs__malloc(v->a, strlen(buf) + 1))) {
    v->oom = 1;
    return;
  }
  memcpy(p, buf, strlen(buf) + 1);
  v->msgs[v->n++] = p;
}

static int has_payload(const mem_op *o) {
  return o->ot.size || o->oi.size || o->sk.size || o->data.size;
}

static void verify_bucket(vlist *v, const mem_stream *s, const mem_bucket *b) {
  unsigned sid = (unsigned)s->id;
  int bn = (int)(b->name.size > 64 ? 64 : b->name.size);
  const char *bp = b->name.size ? (const char *)b->name.data : "";
  for (size_t k = 0; k < b->n; k++) {
    const mem_op *o = &b->ops[k];
    unsigned long long id = (unsigned long long)o->id;
    if (o->id == 0 || o->id > s->m.op_head)
      problem(v, "stream %u bucket '%.*s': op %llu outside 1..%llu", sid, bn, bp, id,
              (unsigned long long)s->m.op_head);
    if (k && o->id <= b->ops[k - 1].id)
      problem(v, "stream %u bucket '%.*s': op %llu not above op %llu", sid, bn, bp, id,
              (unsigned long long)b->ops[k - 1].id);
    switch (o->type) {
    case BS_OP_PUT:
      if (o->sk.size != BS_SUBKEY_SIZE || o->target)
        problem(v, "stream %u bucket '%.*s': PUT %llu malformed", sid, bn, bp, id);
      if (o->checksum != bs_checksum_put(s->m.hash, o->ot, o->oi, o->data))
        problem(v, "stream %u bucket '%.*s': PUT %llu checksum mismatch", sid, bn, bp, id);
      break;
    case BS_OP_REMOVE:
      if (o->sk.size != BS_SUBKEY_SIZE || o->data.size || o->target)
        problem(v, "stream %u bucket '%.*s': REMOVE %llu malformed", sid, bn, bp, id);
      if (o->checksum != bs_checksum_remove(s->m.hash, o->sk))
        problem(v, "stream %u bucket '%.*s': REMOVE %llu checksum mismatch", sid, bn, bp, id);
      break;
    case BS_OP_MOVE:
      if (has_payload(o) || o->target <= o->id)
        problem(v, "stream %u bucket '%.*s': MOVE %llu malformed (target %llu)", sid, bn, bp, id,
                (unsigned long long)o->target);
      break;
    case BS_OP_CLEAR:
      if (k != 0 || has_payload(o) || b->clear_op != o->id || b->clear_start > o->id)
        problem(v, "stream %u bucket '%.*s': CLEAR %llu malformed or misplaced", sid, bn, bp, id);
      break;
    default:
      problem(v, "stream %u bucket '%.*s': op %llu has type %d", sid, bn, bp, id, (int)o->type);
    }
  }
  if (b->clear_op && (!b->n || b->ops[0].type != BS_OP_CLEAR))
    problem(v, "stream %u bucket '%.*s': torn span without a leading CLEAR", sid, bn, bp);
}

static void verify_stream(vlist *v, const mem_stream *s) {
  const bs_allocator *a = v->a;
  size_t nids = s->nparams, k = 0;
  uint64_t *ids, nsoft = 0;
  for (size_t i = 0; i < s->nbuckets; i++) {
    verify_bucket(v, s, s->buckets[i]);
    nids += s->buckets[i]->n;
  }
  /* op ids are unique across the stream's buckets and parameter entries */
  ids = bs__calloc(a, nids ? nids : 1, sizeof *ids);
  if (!ids) {
    v->oom = 1;
    return;
  }
  for (size_t i = 0; i < s->nbuckets; i++)
    for (size_t j = 0; j < s->buckets[i]->n; j++) ids[k++] = s->buckets[i]->ops[j].id;
  for (size_t i = 0; i < s->nparams; i++) {
    ids[k++] = s->params[i].id;
    if (i && s->params[i].id <= s->params[i - 1].id)
      problem(v, "stream %u: parameter entries out of op id order", (unsigned)s->id);
    if (s->params[i].id > s->m.op_head)
      problem(v, "stream %u: parameter entry above the op head", (unsigned)s->id);
  }
  qsort(ids, nids, sizeof *ids, u64_cmp);
  for (size_t i = 1; i < nids; i++)
    if (ids[i] == ids[i - 1])
      problem(v, "stream %u: op id %llu used twice", (unsigned)s->id, (unsigned long long)ids[i]);
  bs__free(a, ids);
  if (s->m.checkpoint > s->m.op_head)
    problem(v, "stream %u: checkpoint above the op head", (unsigned)s->id);
  /* the indexes: each bucket and record is found at its own slot (so keys are also unique),
   * and they index nothing else */
  for (size_t i = 0; i < s->nbuckets; i++) {
    size_t at = SIZE_MAX;
    if (!bucket_find(s, s->buckets[i]->name, &at) || at != i)
      problem(v, "stream %u: bucket %zu duplicate or not indexed", (unsigned)s->id, i);
  }
  if (s->bidx.n != s->nbuckets)
    problem(v, "stream %u: bucket index holds %zu of %zu", (unsigned)s->id, s->bidx.n, s->nbuckets);
  if (s->ridx.n != s->nrecs)
    problem(v, "stream %u: record index holds %zu of %zu", (unsigned)s->id, s->ridx.n, s->nrecs);
  /* source records: unique keys, known tables, memberships in existing buckets */
  for (size_t i = 0; i < s->nrecs; i++) {
    const mem_rec *r = s->recs[i];
    int known = 0;
    for (size_t t = 0; t < s->ntables; t++)
      known |= !s->tables[t]->dropped && s->tables[t]->id == r->table;
    if (!known)
      problem(v, "stream %u: source record of unknown table %u", (unsigned)s->id,
              (unsigned)r->table);
    if (rec_find(s, r->table, r->rid) != (long)i)
      problem(v, "stream %u: source record in table %u duplicate or not indexed", (unsigned)s->id,
              (unsigned)r->table);
    if (r->r.soft && (r->r.nm || r->r.nl || r->r.has_data))
      problem(v, "stream %u: soft-deleted record with content", (unsigned)s->id);
    nsoft += (uint64_t)r->r.soft;
    for (size_t j = 0; j < r->r.nm; j++) {
      const mem_bucket *b = r->r.m[j].bucket < s->nbuckets ? s->buckets[r->r.m[j].bucket] : NULL;
      size_t at = b ? op_index(b, r->r.m[j].op) : 0;
      if (!b || at == b->n || b->ops[at].type != BS_OP_PUT)
        problem(v, "stream %u: source record names a missing bucket or op", (unsigned)s->id);
    }
  }
  if (nsoft != s->m.nsoft)
    problem(v, "stream %u: %llu soft-deleted records, counted %llu", (unsigned)s->id,
            (unsigned long long)nsoft, (unsigned long long)s->m.nsoft);
}

int bs__mem_verify(bs_db *bdb, void (*fn)(const char *, void *), void *payload, uint64_t *problems,
                   bs_error *err) {
  mem_db *db = MDB(bdb);
  vlist v;
  int rc = BS_OK;
  memset(&v, 0, sizeof v);
  v.a = ALLOC(db);
  lock(db);
  for (size_t i = 0; i < db->nstreams; i++) verify_stream(&v, db->streams[i]);
  unlock(db);
  if (v.oom) rc = enomem(err, "verify");
  for (size_t i = 0; i < v.n; i++) {
    if (!rc && fn) fn(v.msgs[i], payload);
    bs__free(v.a, v.msgs[i]);
  }
  bs__free(v.a, v.msgs);
  if (!rc) *problems = v.n;
  return rc;
}
