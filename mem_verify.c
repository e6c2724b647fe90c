/*
 * mem_verify.c: the memory backend's verify: its buckets' ops through verify.c's rules, and real
 * checks on the rest of the naive store (every derived value recomputed, every index entry found
 * where it points).
 */
#include "mem_internal.h"

/* The problems found under the lock, handed to the caller's fn after it (fn may call db). */
typedef struct vlist {
  bs__verify v; /* its fn: collect */
  char **msgs;
  size_t n, cap;
  int oom;
} vlist;

#define problem(l, ...) bs__verify_problem(&(l)->v, __VA_ARGS__)

static void collect(const char *msg, void *payload) {
  vlist *l = payload;
  size_t n = strlen(msg) + 1;
  char *p;
  if (BS_GROW(l->v.a, l->msgs, l->cap, l->n + 1) || !(p = bs__malloc(l->v.a, n))) {
    l->oom = 1;
    return;
  }
  l->msgs[l->n++] = memcpy(p, msg, n);
}

static void verify_stream(vlist *v, mem_db *db, const mem_stream *s) {
  const bs_allocator *a = v->v.a;
  size_t nids = s->nparams, k = 0;
  uint64_t *ids, nsoft = 0;
  if (bs__verify_stream_add(&v->v, s->id, s->m.row.op_head, s->m.row.checkpoint, s->m.hash)) {
    v->oom = 1;
    return;
  }
  /* the ops through the engine's walk (reads.c), on this stream's read primitives */
  if (bs__read_verify(&v->v, &bs__mem_reads, &(mem_storage){.db = db, .s = (mem_stream *)s},
                      &v->v.streams[v->v.n_streams - 1], NULL))
    v->oom = 1;
  for (size_t i = 0; i < s->nbuckets; i++) nids += s->buckets[i]->n;
  /* op ids are unique across the stream's buckets and parameter entries */
  ids = bs__calloc(a, nids ? nids : 1, sizeof *ids);
  if (!ids) {
    v->oom = 1;
    return;
  }
  for (size_t i = 0; i < s->nbuckets; i++)
    for (size_t j = 0; j < s->buckets[i]->n; j++) ids[k++] = s->buckets[i]->ops[j].op_id;
  for (size_t i = 0; i < s->nparams; i++) {
    ids[k++] = s->params[i].id;
    if (i && param_cmp(&s->params[i - 1], &s->params[i]) >= 0)
      problem(v, "stream %u: parameter entries out of order", (unsigned)s->id);
    if (s->params[i].id > s->m.row.op_head)
      problem(v, "stream %u: parameter entry above the op head", (unsigned)s->id);
  }
  qsort(ids, nids, sizeof *ids, u64_cmp);
  for (size_t i = 1; i < nids; i++)
    if (ids[i] == ids[i - 1])
      problem(v, "stream %u: op id %llu used twice", (unsigned)s->id, (unsigned long long)ids[i]);
  bs__free(a, ids);
  /* the bucket index: each bucket is found at its own slot (so names are also unique), and it
   * indexes nothing else */
  for (size_t i = 0; i < s->nbuckets; i++) {
    size_t at = SIZE_MAX;
    if (!bucket_find(s, s->buckets[i]->name, &at) || at != i)
      problem(v, "stream %u: bucket %zu duplicate or not indexed", (unsigned)s->id, i);
  }
  if (s->bidx.n != s->nbuckets)
    problem(v, "stream %u: bucket index holds %zu of %zu", (unsigned)s->id, s->bidx.n, s->nbuckets);
  /* source records (their index is their store): each found by its key (unique keys, each in
   * its probe chain), known tables, memberships in existing buckets */
  for (size_t i = 0; i < s->ridx.cap; i++) {
    const mem_rec *r = rec_at(s, i);
    int known = 0;
    if (!r) continue;
    for (size_t t = 0; t < s->ntables; t++)
      known |= !s->tables[t]->dropped && s->tables[t]->id == r->table;
    if (!known)
      problem(v, "stream %u: source record of unknown table %u", (unsigned)s->id,
              (unsigned)r->table);
    if (rec_find(s, r->table, r->rid) != r)
      problem(v, "stream %u: source record in table %u duplicate or misplaced", (unsigned)s->id,
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

int bs__mem_verify(uint64_t *problems, bs_db *bdb, void (*fn)(const char *, void *), void *payload,
                   bs_error *err) {
  mem_db *db = MDB(bdb);
  vlist v;
  int rc = BS_OK;
  memset(&v, 0, sizeof v);
  v.v.a = ALLOC(db);
  v.v.fn = collect;
  v.v.payload = &v;
  lock(db);
  for (size_t i = 0; i < db->nstreams; i++) verify_stream(&v, db, db->streams[i]);
  unlock(db);
  if (v.oom) rc = enomem(err, "verify");
  for (size_t i = 0; i < v.n; i++) {
    if (!rc && fn) fn(v.msgs[i], payload);
    bs__free(v.v.a, v.msgs[i]);
  }
  bs__free(v.v.a, v.msgs);
  bs__free(v.v.a, v.v.streams);
  if (!rc) *problems = v.n;
  return rc;
}
