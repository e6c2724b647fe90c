/*
 * cache.c: the front's checksum cache (contract.md 5.3): bs_get_checksums answered from earlier
 * answers plus the ops since, above every backend. Only the front (storage.c) calls it; it asks
 * the backend through the storage's table (checksums, checksum_ranges, get_status).
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- The cache ----------------------------------------------------------------------------------
 *
 * An LRU of (stream, bucket, C) -> (checksum, count, generation), shared by every storage of a
 * db and by threads (one mutex; backend calls are made outside it). Entries are grouped per
 * (stream, bucket) in a hash table; a group keeps its entries sorted by C so that the nearest
 * cached C' <= C is a binary search. Memory is bounded: at most `capacity` entries, a group
 * lives only while it has an entry, and per-call scratch is O(n) of the request.
 *
 * WHY AN ENTRY IS EXACT, AND WHEN IT MAY BE REUSED
 *  1. A value at C can change for three reasons: (a) ops with op_id <= C are persisted after
 *     it was read (possible when C is above the stream's head: tests read at checkpoint + 1);
 *     (b) compaction rewrites the bucket (MOVE keeps the count, but a CLEAR fold lowers it, and
 *     below the horizon it may tear C); (c) the stream is cleared (ids may restart).
 *  2. (a) No op id <= the stream's checkpoint K is ever allocated again, so a value at C <= K
 *     is final except for compaction. The cache stores an entry only if C <= a checkpoint of
 *     the stream observed BEFORE the backend read (`known`, fed by bs_get_checkpoint through the
 *     front, by in-process commits, and by one vt->get_status call when C is above it).
 *  3. (b) Every compaction that changes a bucket bumps the bucket's generation, persisted in
 *     its bucket state, so a compaction by another process is seen too. An entry is reused only
 *     after the backend has confirmed, in the same read snapshot that produced the delta, that
 *     the bucket's generation still equals the entry's: every reuse goes through
 *     vt->checksum_ranges(C', C), which returns the delta over (C', C] and the generation. An
 *     exact hit is the case C' = C (an empty range: zero delta, just the generation). That
 *     costs one backend call per distinct C' per request (normally one: a client's buckets
 *     were cached at its previous checkpoint), but it never serves a stale count. The saving is
 *     the walk back from the bucket's end to an old C, and the range is typically a few ops.
 *     A generation mismatch drops the bucket's entries and recomputes it with vt->checksums.
 *  4. A range holding a CLEAR (cleared[i]) returns the value at C from zero: it replaces the
 *     base instead of being added to it.
 *  5. (c) bs_clear/bs_terminate drop the stream's entries and its `known` checkpoint. A clear
 *     made by another process is not seen (documented in storage.h under bs_clear).
 *  6. Torn reads: a backend answers BS_EINVALIDATED for C inside a bucket's compacted span from
 *     both checksums and checksum_ranges; the error is returned as is and nothing is cached.
 *  A backend without checksum_ranges (NULL slot or BS_EUNSUPPORTED) just gets every bucket
 *  recomputed with vt->checksums: still exact, only slower.
 * ---------------------------------------------------------------------------------------------- */

typedef struct cache_group cache_group;

typedef struct cache_entry {
  struct cache_entry *prev, *next; /* LRU list: head = most recent */
  cache_group *group;
  uint64_t checkpoint;
  uint64_t count;
  uint64_t generation;
  uint32_t checksum;
} cache_entry;

struct cache_group {
  uint64_t hash; /* its key in the table of groups */
  uint32_t stream;
  size_t n, cap; /* entries, sorted by checkpoint */
  cache_entry **entries;
  size_t name_size;
  unsigned char name[]; /* bucket name */
};

typedef struct known_cp {
  uint32_t stream;
  uint64_t checkpoint;
} known_cp;

struct bs__cksum_cache {
  bs_allocator alloc;
  pthread_mutex_t mu;
  size_t capacity, n_entries;
  cache_entry *lru_head, *lru_tail;
  bs__htab groups; /* value: the cache_group */
  known_cp *known;
  size_t n_known, cap_known;
  bs__cksum_cache_stats stats;
};

int bs__cksum_cache_new(bs__cksum_cache **out, const bs_allocator *a, size_t capacity) {
  bs__cksum_cache *c = bs__calloc(a, 1, sizeof *c);
  if (!c) return BS_ENOMEM;
  c->alloc = *a;
  c->capacity = capacity ? capacity : 1;
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    bs__free(a, c);
    return BS_ENOMEM;
  }
  *out = c;
  return BS_OK;
}

static void group_free(bs__cksum_cache *c, cache_group *g) {
  for (size_t i = 0; i < g->n; i++) bs__free(&c->alloc, g->entries[i]);
  bs__free(&c->alloc, g->entries);
  bs__free(&c->alloc, g);
}

void bs__cksum_cache_free(bs__cksum_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->groups.cap; i++)
    if (c->groups.e[i].value) group_free(c, (cache_group *)c->groups.e[i].value);
  bs__htab_free(&c->groups, &c->alloc);
  bs__free(&c->alloc, c->known);
  pthread_mutex_destroy(&c->mu);
  bs__free(&c->alloc, c);
}

static uint64_t group_hash(uint32_t stream, bs_val name) {
  return XXH3_64bits_withSeed(name.size ? name.data : "", name.size, stream);
}

static cache_group *group_find(bs__cksum_cache *c, uint32_t stream, bs_val name, uint64_t h) {
  bs__hprobe p = bs__htab_probe(&c->groups, h);
  for (uintptr_t v; (v = bs__htab_next(&p));) {
    cache_group *g = (cache_group *)v;
    if (g->stream == stream && g->name_size == name.size &&
        (name.size == 0 || memcmp(g->name, name.data, name.size) == 0))
      return g;
  }
  return NULL;
}

static void lru_unlink(bs__cksum_cache *c, cache_entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    c->lru_head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    c->lru_tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push(bs__cksum_cache *c, cache_entry *e) {
  e->prev = NULL;
  e->next = c->lru_head;
  if (c->lru_head) c->lru_head->prev = e;
  c->lru_head = e;
  if (!c->lru_tail) c->lru_tail = e;
}

/* Index of the first entry with checkpoint > cp (so [idx-1] is the nearest <= cp). */
static size_t group_upper(const cache_group *g, uint64_t cp) {
  size_t lo = 0, hi = g->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (g->entries[mid]->checkpoint <= cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Removes entry e (from its group, the LRU and memory); frees the group when it empties. */
static void entry_remove(bs__cksum_cache *c, cache_entry *e) {
  cache_group *g = e->group;
  size_t i = group_upper(g, e->checkpoint) - 1; /* checkpoints are unique within a group */
  memmove(&g->entries[i], &g->entries[i + 1], (g->n - i - 1) * sizeof *g->entries);
  g->n--;
  lru_unlink(c, e);
  bs__free(&c->alloc, e);
  c->n_entries--;
  if (g->n == 0) {
    bs__htab_remove(&c->groups, g->hash, (uintptr_t)g);
    group_free(c, g);
  }
}

static void group_drop(bs__cksum_cache *c, cache_group *g) {
  while (g->n > 1) entry_remove(c, g->entries[g->n - 1]);
  entry_remove(c, g->entries[0]); /* frees g */
}

static known_cp *known_find(bs__cksum_cache *c, uint32_t stream) {
  for (size_t i = 0; i < c->n_known; i++)
    if (c->known[i].stream == stream) return &c->known[i];
  return NULL;
}

void bs__cksum_cache_note_checkpoint(bs__cksum_cache *c, uint32_t stream, uint64_t checkpoint) {
  known_cp *k;
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  k = known_find(c, stream);
  /* on failure the checkpoint is simply not remembered: less caching */
  if (!k && BS_GROW(&c->alloc, c->known, c->cap_known, c->n_known + 1) == BS_OK) {
    k = &c->known[c->n_known++];
    k->stream = stream;
    k->checkpoint = 0;
  }
  if (k && checkpoint > k->checkpoint) k->checkpoint = checkpoint;
  pthread_mutex_unlock(&c->mu);
}

void bs__cksum_cache_drop_stream(bs__cksum_cache *c, uint32_t stream) {
  known_cp *k;
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->groups.cap;) {
    cache_group *g = (cache_group *)c->groups.e[i].value;
    if (g && g->stream == stream)
      group_drop(c, g); /* a later entry may shift into i: look at i again */
    else
      i++;
  }
  if ((k = known_find(c, stream)) != NULL) *k = c->known[--c->n_known];
  pthread_mutex_unlock(&c->mu);
}

/* Inserts or refreshes (stream, name, cp). Allocation failure just skips caching. */
static void cache_put(bs__cksum_cache *c, uint32_t stream, bs_val name, uint64_t cp,
                      const bs_checksum *v, uint64_t generation) {
  uint64_t h = group_hash(stream, name);
  cache_group *g = group_find(c, stream, name, h);
  cache_entry *e;
  size_t at;

  /* Entries of an older generation can never be reused: drop them now (so the entries of a
   * group share one generation). */
  if (g && g->entries[0]->generation != generation) {
    group_drop(c, g);
    g = NULL;
  }
  if (g) {
    at = group_upper(g, cp);
    if (at > 0 && g->entries[at - 1]->checkpoint == cp) {
      e = g->entries[at - 1];
      e->checksum = v->checksum;
      e->count = v->count;
      lru_unlink(c, e);
      lru_push(c, e);
      return;
    }
  }
  if (c->n_entries >= c->capacity) {
    cache_entry *victim = c->lru_tail;
    if (g && victim->group == g && g->n == 1) g = NULL; /* the victim frees g */
    entry_remove(c, victim);
    c->stats.evictions++;
  }
  if (!g) {
    g = bs__malloc(&c->alloc, sizeof *g + name.size);
    if (!g) return;
    memset(g, 0, sizeof *g);
    g->hash = h;
    g->stream = stream;
    g->name_size = name.size;
    if (name.size) memcpy(g->name, name.data, name.size);
    if (bs__htab_add(&c->groups, &c->alloc, h, (uintptr_t)g)) {
      bs__free(&c->alloc, g);
      return;
    }
  }
  if (BS_GROW(&c->alloc, g->entries, g->cap, g->n + 1)) goto fail;
  e = bs__calloc(&c->alloc, 1, sizeof *e);
  if (!e) goto fail;
  e->group = g;
  e->checkpoint = cp;
  e->checksum = v->checksum;
  e->count = v->count;
  e->generation = generation;
  at = group_upper(g, cp);
  memmove(&g->entries[at + 1], &g->entries[at], (g->n - at) * sizeof *g->entries);
  g->entries[at] = e;
  g->n++;
  c->n_entries++;
  lru_push(c, e);
  return;
fail:
  if (g->n == 0) {
    bs__htab_remove(&c->groups, g->hash, (uintptr_t)g);
    group_free(c, g);
  }
}

/* Per requested bucket: its cached base (if any) and where its answer comes from. */
typedef struct req_plan {
  size_t index;     /* position in the request */
  uint64_t base_cp; /* nearest cached C' <= C; meaningful when has_base */
  bs_checksum base;
  uint64_t base_gen;
  int has_base;
  int done;
} req_plan;

static int plan_cmp(const void *a, const void *b) {
  const req_plan *x = a, *y = b;
  if (x->has_base != y->has_base) return x->has_base ? -1 : 1;
  if (x->base_cp != y->base_cp) return x->base_cp < y->base_cp ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* Scratch of one call: one allocation. */
typedef struct call_scratch {
  req_plan *plan;
  bs_val *names;
  bs_checksum *vals;
  uint64_t *gens;
  uint64_t *gens_out; /* generation per request, for cache_put */
  int *cleared;
} call_scratch;

static int scratch_alloc(bs__cksum_cache *c, size_t n, call_scratch *s, void **block) {
  size_t each =
      sizeof(req_plan) + sizeof(bs_val) + sizeof(bs_checksum) + 2 * sizeof(uint64_t) + sizeof(int);
  if (n > SIZE_MAX / each || !(*block = bs__malloc(&c->alloc, n * each))) return BS_ENOMEM;
  s->plan = *block; /* each array's elements are a multiple of the next one's alignment */
  s->vals = (bs_checksum *)(s->plan + n);
  s->gens = (uint64_t *)(s->vals + n);
  s->gens_out = s->gens + n;
  s->names = (bs_val *)(s->gens_out + n);
  s->cleared = (int *)(s->names + n);
  return BS_OK;
}

/* Looks up the nearest base of every bucket under the lock. */
static void plan_lookup(bs__cksum_cache *c, uint32_t stream, uint64_t cp, const bs_val *buckets,
                        size_t n, req_plan *plan) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < n; i++) {
    cache_group *g = group_find(c, stream, buckets[i], group_hash(stream, buckets[i]));
    size_t at = g ? group_upper(g, cp) : 0;
    memset(&plan[i], 0, sizeof plan[i]);
    plan[i].index = i;
    if (at > 0) {
      cache_entry *e = g->entries[at - 1];
      plan[i].has_base = 1;
      plan[i].base_cp = e->checkpoint;
      plan[i].base.checksum = e->checksum;
      plan[i].base.count = e->count;
      plan[i].base_gen = e->generation;
      lru_unlink(c, e);
      lru_push(c, e);
    }
  }
  pthread_mutex_unlock(&c->mu);
}

/* Extends the bases of plan[0..m) (all with base_cp == from) by the range (from, cp]. Buckets
 * whose generation moved stay not done (recomputed by the caller). */
static int extend_group(bs__cksum_cache *c, bs_storage *st, uint64_t cp, req_plan *plan, size_t m,
                        const bs_val *buckets, bs_checksum *out, uint64_t *gens_out,
                        call_scratch *s, bs_error *err) {
  uint64_t from = plan[0].base_cp;
  int rc;
  for (size_t j = 0; j < m; j++) {
    s->names[j] = buckets[plan[j].index];
    s->gens[j] = 0;
    s->cleared[j] = 0;
  }
  rc = st->vt->checksum_ranges(s->vals, s->cleared, s->gens, st, from, cp, s->names, m, err);
  if (rc != BS_OK) return rc;
  for (size_t j = 0; j < m; j++) {
    req_plan *p = &plan[j];
    bs_checksum *o = &out[p->index];
    if (s->gens[j] != p->base_gen) {
      pthread_mutex_lock(&c->mu);
      c->stats.stale++;
      pthread_mutex_unlock(&c->mu);
      continue;
    }
    if (s->cleared[j]) {
      *o = s->vals[j];
    } else {
      o->checksum = bs__cksum_add(p->base.checksum, s->vals[j].checksum);
      o->count = p->base.count + s->vals[j].count;
    }
    gens_out[p->index] = s->gens[j];
    p->done = 1;
  }
  return BS_OK;
}

/* Asks the cache-less backend for every plan entry not done, in one batch. */
static int compute_misses(bs_storage *st, uint64_t cp, const bs_val *buckets, req_plan *plan,
                          size_t n, bs_checksum *out, uint64_t *gens_out, call_scratch *s,
                          bs_error *err) {
  size_t m = 0;
  int rc;
  for (size_t i = 0; i < n; i++)
    if (!plan[i].done) s->names[m++] = buckets[plan[i].index];
  if (m == 0) return BS_OK;
  memset(s->gens, 0, m * sizeof *s->gens);
  rc = st->vt->checksums(s->vals, s->gens, st, cp, s->names, m, err);
  if (rc != BS_OK) return rc;
  m = 0;
  for (size_t i = 0; i < n; i++) {
    if (plan[i].done) continue;
    out[plan[i].index] = s->vals[m];
    gens_out[plan[i].index] = s->gens[m];
    m++;
  }
  return BS_OK;
}

static int refresh_known(bs__cksum_cache *c, bs_storage *st, uint64_t cp, uint64_t *known,
                         bs_error *err) {
  bs_status now; /* the checkpoint is the status's (the storage table has no slot for it) */
  int rc;
  known_cp *k;
  pthread_mutex_lock(&c->mu);
  *known = (k = known_find(c, st->stream_id)) ? k->checkpoint : 0;
  pthread_mutex_unlock(&c->mu);
  if (cp <= *known || !st->vt->get_status) return BS_OK;
  memset(&now, 0, sizeof now);
  rc = st->vt->get_status(&now, st, err);
  if (rc == BS_EUNSUPPORTED) return BS_OK;
  if (rc != BS_OK) return rc;
  bs__cksum_cache_note_checkpoint(c, st->stream_id, now.checkpoint);
  if (now.checkpoint > *known) *known = now.checkpoint;
  return BS_OK;
}

int bs__cksum_cache_get(bs__cksum_cache *c, bs_storage *st, uint64_t checkpoint,
                        const bs_val *buckets, size_t n, bs_checksum *out, bs_error *err) {
  call_scratch s;
  void *block = NULL;
  uint64_t *gens_out, known = 0;
  size_t i, j;
  int rc, use_ranges;

  if (n == 0) return BS_OK;
  if ((rc = refresh_known(c, st, checkpoint, &known, err)) != BS_OK) return rc;
  if ((rc = scratch_alloc(c, n, &s, &block)) != BS_OK)
    return bs__fail(err, rc, "checksum cache: cannot allocate %zu request slots", n);
  gens_out = s.gens_out;

  plan_lookup(c, st->stream_id, checkpoint, buckets, n, s.plan);
  qsort(s.plan, n, sizeof *s.plan, plan_cmp);
  use_ranges = st->vt->checksum_ranges != NULL;
  for (i = 0; i < n && s.plan[i].has_base && use_ranges; i = j) {
    for (j = i + 1; j < n && s.plan[j].has_base && s.plan[j].base_cp == s.plan[i].base_cp;) j++;
    rc = extend_group(c, st, checkpoint, s.plan + i, j - i, buckets, out, gens_out, &s, err);
    if (rc == BS_EUNSUPPORTED)
      use_ranges = 0; /* recompute the rest from scratch */
    else if (rc != BS_OK)
      goto done;
  }
  if ((rc = compute_misses(st, checkpoint, buckets, s.plan, n, out, gens_out, &s, err))) goto done;

  pthread_mutex_lock(&c->mu);
  for (i = 0; i < n; i++) {
    const req_plan *p = &s.plan[i];
    if (p->done)
      c->stats.hits++;
    else
      c->stats.misses++;
    if (checkpoint <= known)
      cache_put(c, st->stream_id, buckets[p->index], checkpoint, &out[p->index],
                gens_out[p->index]);
  }
  pthread_mutex_unlock(&c->mu);
  rc = BS_OK;
done:
  bs__free(&c->alloc, block);
  return rc;
}

void bs__cksum_cache_get_stats(bs__cksum_cache *c, bs__cksum_cache_stats *out) {
  pthread_mutex_lock(&c->mu);
  *out = c->stats;
  out->entries = c->n_entries;
  pthread_mutex_unlock(&c->mu);
}
