/*
 * util_model.c: the naive reference model and the client's reduce (see util_model.h).
 * Obviously correct before fast: linear searches everywhere.
 */
#include "util_model.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <nettle/sha2.h>

/* ---- Hashes ----------------------------------------------------------------------------------- */

uint32_t md_hash(bs_hash h, const void *p, size_t n) {
  if (h == BS_HASH_SHA256) {
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, n, p);
    sha256_digest(&c, sizeof d, d);
    return (uint32_t)d[0] | ((uint32_t)d[1] << 8) | ((uint32_t)d[2] << 16) | ((uint32_t)d[3] << 24);
  }
  return (uint32_t)XXH3_64bits(p, n);
}

void md_subkey(char out[BS_SUBKEY_SIZE + 1], uint32_t table_id, const void *rid, size_t n) {
  XXH128_canonical_t c;
  int i;
  XXH128_canonicalFromHash(&c, XXH3_128bits(rid, n));
  snprintf(out, 10, "%08x/", table_id);
  for (i = 0; i < 16; i++) snprintf(out + 9 + 2 * i, 3, "%02x", c.digest[i]);
}

/* contract.md 3: hash("put." type "." id "." data) of the bytes as they are (NULs too) */
static uint32_t put_checksum_n(bs_hash h, const ct_buf *ot, const ct_buf *oid, const ct_buf *data) {
  size_t n = 4 + ot->n + 1 + oid->n + 1 + data->n, k = 0;
  char *s = malloc(n + 1);
  uint32_t v;
  assert_non_null(s);
  memcpy(s + k, "put.", 4), k += 4;
  if (ot->n) memcpy(s + k, ot->p, ot->n), k += ot->n;
  s[k++] = '.';
  if (oid->n) memcpy(s + k, oid->p, oid->n), k += oid->n;
  s[k++] = '.';
  if (data->n) memcpy(s + k, data->p, data->n), k += data->n;
  v = md_hash(h, s, n);
  free(s);
  return v;
}

static uint32_t put_checksum(bs_hash h, const char *ot, const char *oid, const char *data) {
  ct_buf a = {(char *)ot, strlen(ot)}, b = {(char *)oid, strlen(oid)},
         c = {(char *)data, strlen(data)};
  return put_checksum_n(h, &a, &b, &c);
}

static uint32_t remove_checksum(bs_hash h, const char *subkey) {
  char s[64];
  int n = snprintf(s, sizeof s, "delete.%s", subkey);
  return md_hash(h, s, (size_t)n);
}

int md_op_checksum(bs_hash h, const ct_op *op, uint32_t *out) {
  if (op->type == BS_OP_PUT) {
    *out = put_checksum_n(h, &op->object_type, &op->object_id, &op->data);
    return 1;
  }
  if (op->type == BS_OP_REMOVE && op->subkey.p) {
    *out = remove_checksum(h, op->subkey.p);
    return 1;
  }
  return 0;
}

/* ---- Small helpers ---------------------------------------------------------------------------- */

static char *dupn(const void *p, size_t n) {
  char *s = malloc(n + 1);
  assert_non_null(s);
  if (n) memcpy(s, p, n);
  s[n] = 0;
  return s;
}
static char *dupv(bs_val v) {
  return dupn(v.data, v.size);
}

static void *grow(void *v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return v;
  *cap = *cap ? *cap * 2 : 16;
  v = realloc(v, *cap * elem);
  assert_non_null(v);
  return v;
}

static int val_eq_str(bs_val v, const char *s) {
  return v.size == strlen(s) && (v.size == 0 || memcmp(v.data, s, v.size) == 0);
}

void md_init(md_stream *m, bs_hash hash) {
  memset(m, 0, sizeof *m);
  m->hash = hash;
}

static void free_record(md_record *r) {
  size_t i;
  for (i = 0; i < r->nm; i++) {
    free(r->m[i].bucket);
    free(r->m[i].otype);
    free(r->m[i].oid);
  }
  for (i = 0; i < r->nlk; i++) free(r->lk[i].p);
  free(r->m);
  free(r->lk);
  free(r->rid);
  memset(r, 0, sizeof *r);
}

void md_free(md_stream *m) {
  size_t i, j;
  for (i = 0; i < m->n_tables; i++) free(m->tables[i]);
  for (i = 0; i < m->n_rec; i++) free_record(&m->rec[i]);
  for (i = 0; i < m->n_b; i++) {
    for (j = 0; j < m->b[i].n; j++) ct_op_free(&m->b[i].ops[j]);
    free(m->b[i].ops);
    free(m->b[i].name);
  }
  for (i = 0; i < m->n_p; i++) {
    for (j = 0; j < m->p[i].n; j++) free(m->p[i].params[j]);
    free(m->p[i].params);
    free(m->p[i].key.p);
    free(m->p[i].rid);
  }
  free(m->rec);
  free(m->b);
  free(m->p);
  free(m->g);
  memset(m, 0, sizeof *m);
}

/* The id of table name in the stream, 0 when it was never registered. */
static uint32_t table_known(const md_stream *m, bs_val name) {
  uint32_t i;
  for (i = 0; i < m->n_tables; i++)
    if (val_eq_str(name, m->tables[i])) return m->table_base + i + 1;
  return 0;
}

/* contract.md 1: a save registers its table on first use (ids 1, 2, ... in that order). */
static uint32_t table_id(md_stream *m, bs_val name) {
  uint32_t t = table_known(m, name);
  if (t) return t;
  assert_true(m->n_tables < 64);
  m->tables[m->n_tables++] = dupv(name);
  return m->table_base + m->n_tables;
}

void md_clear(md_stream *m) {
  md_stream kept;
  md_init(&kept, m->hash);
  kept.head = m->head;
  kept.table_base = m->table_base + m->n_tables;
  md_free(m);
  *m = kept;
}

static md_record *find_record(md_stream *m, uint32_t t, bs_val rid) {
  size_t i;
  for (i = 0; i < m->n_rec; i++)
    if (m->rec[i].table == t && val_eq_str(rid, m->rec[i].rid)) return &m->rec[i];
  return NULL;
}

/* The row's record if it is not soft-deleted. */
static md_record *find_live(md_stream *m, uint32_t t, bs_val rid) {
  md_record *r = find_record(m, t, rid);
  return r && !r->soft ? r : NULL;
}

static void drop_record(md_stream *m, md_record *r) {
  size_t i = (size_t)(r - m->rec);
  free_record(r);
  m->rec[i] = m->rec[m->n_rec - 1];
  m->n_rec--;
}

md_bucket *md_find_bucket(md_stream *m, const char *name) {
  size_t i;
  for (i = 0; i < m->n_b; i++)
    if (strcmp(m->b[i].name, name) == 0) return &m->b[i];
  return NULL;
}

static md_bucket *bucket_of(md_stream *m, const char *name) {
  md_bucket *b = md_find_bucket(m, name);
  if (b) return b;
  m->b = grow(m->b, &m->cap_b, m->n_b, sizeof *m->b);
  b = &m->b[m->n_b++];
  memset(b, 0, sizeof *b);
  b->name = dupn(name, strlen(name));
  return b;
}

static void emit(md_stream *m, const char *bucket, bs_op_type type, const char *ot, const char *oid,
                 const char *subkey, const char *data) {
  md_bucket *b = bucket_of(m, bucket);
  bs_op op;
  memset(&op, 0, sizeof op);
  op.op_id = ++m->head;
  op.type = type;
  op.object_type = ct_v(ot);
  op.object_id = ct_v(oid);
  op.subkey = ct_v(subkey);
  if (type == BS_OP_PUT) {
    op.data = ct_v(data);
    op.checksum = put_checksum(m->hash, ot, oid, data);
  } else {
    op.checksum = remove_checksum(m->hash, subkey);
  }
  b->ops = grow(b->ops, &b->cap, b->n, sizeof *b->ops);
  ct_op_copy(&b->ops[b->n++], &op);
}

static void emit_param(md_stream *m, const unsigned char *key, size_t kn, uint32_t t,
                       const char *rid, const bs_val *params, size_t n) {
  md_param *p;
  size_t i;
  m->p = grow(m->p, &m->cap_p, m->n_p, sizeof *m->p);
  p = &m->p[m->n_p++];
  memset(p, 0, sizeof *p);
  p->op_id = ++m->head;
  p->key.p = (unsigned char *)dupn(key, kn);
  p->key.n = kn;
  p->table = t;
  p->rid = dupn(rid, strlen(rid));
  p->n = n;
  if (n) {
    p->params = malloc(n * sizeof *p->params);
    assert_non_null(p->params);
    for (i = 0; i < n; i++) p->params[i] = dupv(params[i]);
  }
}

static void group(md_stream *m, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return; /* zero or one id: nothing open */
  m->g = grow(m->g, &m->cap_g, m->n_g, sizeof *m->g);
  m->g[m->n_g].lo = lo;
  m->g[m->n_g].hi = hi;
  m->n_g++;
}

/* Step 1 of contract.md 4.1 and truncate: REMOVE every membership, tombstone every lookup. */
static void remove_record(md_stream *m, md_record *r, int tombstones) {
  char sk[BS_SUBKEY_SIZE + 1];
  size_t i;
  md_subkey(sk, r->table, r->rid, strlen(r->rid));
  for (i = 0; i < r->nm; i++)
    emit(m, r->m[i].bucket, BS_OP_REMOVE, r->m[i].otype, r->m[i].oid, sk, NULL);
  if (tombstones)
    for (i = 0; i < r->nlk; i++) emit_param(m, r->lk[i].p, r->lk[i].n, r->table, r->rid, NULL, 0);
}

static int member_eq(const md_member *a, const md_member *b) {
  return !strcmp(a->bucket, b->bucket) && !strcmp(a->otype, b->otype) && !strcmp(a->oid, b->oid);
}

static int has_member(const bs_save *s, const md_member *mb) {
  size_t i;
  for (i = 0; i < s->n_rows; i++)
    if (val_eq_str(s->rows[i].bucket, mb->bucket) &&
        val_eq_str(s->rows[i].object_type, mb->otype) && val_eq_str(s->rows[i].object_id, mb->oid))
      return 1;
  return 0;
}

static int has_lookup(const bs_save *s, const md_key *k) {
  size_t i;
  for (i = 0; i < s->n_lookups; i++)
    if (s->lookups[i].key.size == k->n && memcmp(s->lookups[i].key.data, k->p, k->n) == 0) return 1;
  return 0;
}

static void add_soft(md_stream *m, uint32_t t, bs_val rid) {
  m->rec = grow(m->rec, &m->cap_rec, m->n_rec, sizeof *m->rec);
  memset(&m->rec[m->n_rec], 0, sizeof *m->rec);
  m->rec[m->n_rec].table = t;
  m->rec[m->n_rec].rid = dupv(rid);
  m->rec[m->n_rec].soft = 1;
  m->rec[m->n_rec++].mark = m->head;
}

void md_save(md_stream *m, const bs_save *s) {
  md_save_mode(m, s, 0, 1);
}

void md_save_mode(md_stream *m, const bs_save *s, int snapshot, int snapshot_done) {
  uint32_t t = table_id(m, s->table);
  bs_val before = s->before_id.data ? s->before_id : s->after_id;
  int has_after = s->tag != BS_DELETE;
  int same = has_after && before.size == s->after_id.size &&
             (before.size == 0 || memcmp(before.data, s->after_id.data, before.size) == 0);
  /* a delete while a snapshot may still insert the row leaves a soft-deleted record */
  int soft = !has_after && (snapshot || !snapshot_done);
  md_record *old = find_live(m, t, before);
  md_record *prev = NULL, nr;
  char sk[BS_SUBKEY_SIZE + 1];
  uint64_t lo;
  size_t i;

  if (snapshot && s->tag == BS_INSERT && find_record(m, t, s->after_id)) return;
  /* Step 1: the old replica id goes away (a soft-deleted record keeps its mark). */
  if (old && (!has_after || !same)) {
    lo = m->head + 1;
    remove_record(m, old, 0);
    group(m, lo, m->head);
    for (i = 0; i < old->nlk; i++) emit_param(m, old->lk[i].p, old->lk[i].n, t, old->rid, NULL, 0);
    drop_record(m, old);
    if (soft) add_soft(m, t, before);
  } else if (soft && !find_record(m, t, before)) {
    add_soft(m, t, before); /* a row not known yet: the snapshot may not have inserted it */
  }
  if (!has_after) return;

  /* Step 2: PUTs in order, then REMOVEs of memberships left (UPDATE reads the previous). */
  if (s->tag == BS_UPDATE) prev = find_live(m, t, s->after_id);
  memset(&nr, 0, sizeof nr);
  nr.table = t;
  nr.rid = dupv(s->after_id);
  md_subkey(sk, t, s->after_id.data, s->after_id.size);
  for (i = 0; i < s->n_rows; i++) {
    char *bk = dupv(s->rows[i].bucket), *ot = dupv(s->rows[i].object_type);
    char *oid = dupv(s->rows[i].object_id), *data = dupv(s->rows[i].data);
    md_member mb = {bk, ot, oid};
    size_t j;
    emit(m, bk, BS_OP_PUT, ot, oid, sk, data);
    free(data);
    /* A membership is (bucket, object_type, object_id) (contract.md 4.1): the same output twice
     * in one save is two PUTs but one membership, so a later REMOVE of it is one op, not two. */
    for (j = 0; j < nr.nm && !member_eq(&nr.m[j], &mb); j++) continue;
    if (j < nr.nm) {
      free(bk);
      free(ot);
      free(oid);
      continue;
    }
    nr.m = realloc(nr.m, (nr.nm + 1) * sizeof *nr.m);
    assert_non_null(nr.m);
    nr.m[nr.nm++] = mb;
  }
  if (prev) {
    lo = m->head + 1;
    for (i = 0; i < prev->nm; i++)
      if (!has_member(s, &prev->m[i]))
        emit(m, prev->m[i].bucket, BS_OP_REMOVE, prev->m[i].otype, prev->m[i].oid, sk, NULL);
    group(m, lo, m->head);
  }
  /* Step 3: an entry per given lookup, then tombstones of the lookups no longer given. */
  for (i = 0; i < s->n_lookups; i++) {
    const bs_lookup *l = &s->lookups[i];
    size_t j;
    emit_param(m, l->key.data, l->key.size, t, nr.rid, l->params, l->n_params);
    /* the record's lookup keys are a set: a key given twice is two entries (the later wins,
     * 5.4) but one key of the record, so one tombstone when it is no longer given */
    for (j = 0;
         j < nr.nlk && !(nr.lk[j].n == l->key.size &&
                         (l->key.size == 0 || !memcmp(nr.lk[j].p, l->key.data, l->key.size)));
         j++)
      continue;
    if (j < nr.nlk) continue;
    nr.lk = realloc(nr.lk, (nr.nlk + 1) * sizeof *nr.lk);
    assert_non_null(nr.lk);
    nr.lk[nr.nlk].p = (unsigned char *)dupn(l->key.data, l->key.size);
    nr.lk[nr.nlk].n = l->key.size;
    nr.nlk++;
  }
  if (prev) {
    for (i = 0; i < prev->nlk; i++)
      if (!has_lookup(s, &prev->lk[i]))
        emit_param(m, prev->lk[i].p, prev->lk[i].n, t, nr.rid, NULL, 0);
  }
  /* Step 4: store the new record (replacing whatever was stored under after_id). */
  prev = find_record(m, t, s->after_id);
  if (prev) drop_record(m, prev);
  m->rec = grow(m->rec, &m->cap_rec, m->n_rec, sizeof *m->rec);
  m->rec[m->n_rec++] = nr;
}

void md_purge(md_stream *m, uint64_t cp) {
  size_t i = 0;
  while (i < m->n_rec)
    if (m->rec[i].soft && m->rec[i].mark <= cp)
      drop_record(m, &m->rec[i]);
    else
      i++;
}

void md_truncate(md_stream *m, const char *table) {
  /* a table no save named has no records: its truncate registers nothing (no id is taken,
   * contract.md 1 and 4.2), so the next table a save names still gets the next id */
  uint32_t t = table_known(m, ct_v(table));
  uint64_t lo = m->head + 1;
  size_t i = 0;
  if (!t) return;
  while (i < m->n_rec) {
    if (m->rec[i].table == t) {
      remove_record(m, &m->rec[i], 1);
      drop_record(m, &m->rec[i]);
    } else {
      i++;
    }
  }
  group(m, lo, m->head);
}

/* ---- Reconciling open groups with the engine ------------------------------------------------ */

static int op_same(const ct_op *a, const ct_op *b) {
  return a->type == b->type && a->checksum == b->checksum &&
         ct_buf_eq(&a->object_type, b->object_type.p) && ct_buf_eq(&a->object_id, b->object_id.p) &&
         ct_buf_eq(&a->subkey, b->subkey.p) && ct_buf_eq(&a->data, b->data.p);
}

static int cmp_op(const void *a, const void *b) {
  const ct_op *x = a, *y = b;
  return x->op_id < y->op_id ? -1 : x->op_id > y->op_id;
}

static int cmp_param(const void *a, const void *b) {
  const md_param *x = a, *y = b;
  return x->op_id < y->op_id ? -1 : x->op_id > y->op_id;
}

static void reconcile_group(md_stream *m, bs_storage *st, md_group g) {
  size_t bi, i, j, found = 0, n_bucket_ops = 0;
  uint64_t used_lo = g.lo, next_param;
  char *taken;
  (void)used_lo;
  /* Bucket ops: read each touched bucket's range and match it as a multiset. */
  taken = calloc(g.hi - g.lo + 1, 1);
  assert_non_null(taken);
  for (bi = 0; bi < m->n_b; bi++) {
    md_bucket *b = &m->b[bi];
    ct_oplist got = {0};
    size_t n_model = 0;
    char *used;
    for (i = 0; i < b->n; i++)
      if (b->ops[i].op_id >= g.lo && b->ops[i].op_id <= g.hi) n_model++;
    if (!n_model) continue;
    n_bucket_ops += n_model;
    {
      int rc = ct_read_bucket(st, g.hi, b->name, g.lo - 1, &got);
      if (rc)
        fail_msg("reconcile: reading %s at %llu: %s (%s)", b->name, (unsigned long long)g.hi,
                 bs_strerror(rc), ct_err.msg);
    }
    used = calloc(got.n + 1, 1);
    assert_non_null(used);
    if (got.n != n_model) {
      ct_dump_ops("engine", &got);
      fail_msg("bucket %s: engine wrote %zu ops in [%llu, %llu], the model expects %zu", b->name,
               got.n, (unsigned long long)g.lo, (unsigned long long)g.hi, n_model);
    }
    for (i = 0; i < b->n; i++) {
      ct_op *mo = &b->ops[i];
      if (mo->op_id < g.lo || mo->op_id > g.hi) continue;
      for (j = 0; j < got.n; j++)
        if (!used[j] && op_same(mo, &got.v[j])) break;
      if (j == got.n) {
        ct_dump_ops("engine", &got);
        fail_msg("bucket %s: the engine has no op matching the model's %s %s/%s/%s in [%llu, "
                 "%llu]",
                 b->name, ct_type_name(mo->type), mo->object_type.p, mo->object_id.p, mo->subkey.p,
                 (unsigned long long)g.lo, (unsigned long long)g.hi);
      }
      used[j] = 1;
      mo->op_id = got.v[j].op_id;
      if (taken[mo->op_id - g.lo]) fail_msg("op id %llu used twice", (unsigned long long)mo->op_id);
      taken[mo->op_id - g.lo] = 1;
      found++;
    }
    if (b->n) qsort(b->ops, b->n, sizeof *b->ops, cmp_op);
    free(used);
    ct_oplist_free(&got);
  }
  assert_int_equal(found, n_bucket_ops);
  /* Parameter entries of the group take the ids left over (only read at checkpoints). */
  next_param = g.lo;
  for (i = 0; i < m->n_p; i++) {
    md_param *p = &m->p[i];
    if (p->op_id < g.lo || p->op_id > g.hi) continue;
    while (taken[next_param - g.lo]) next_param++;
    p->op_id = next_param++;
  }
  if (m->n_p) qsort(m->p, m->n_p, sizeof *m->p, cmp_param);
  free(taken);
}

void md_reconcile(md_stream *m, bs_storage *st, uint64_t C) {
  size_t i = 0;
  while (i < m->n_g) {
    if (m->g[i].hi <= C) {
      reconcile_group(m, st, m->g[i]);
      m->g[i] = m->g[--m->n_g];
    } else {
      i++;
    }
  }
}

/* ---- Reads of the model ----------------------------------------------------------------------- */

void md_checksum(const md_stream *m, const char *bucket, uint64_t C, bs_checksum *out) {
  const md_bucket *b = md_find_bucket((md_stream *)m, bucket);
  uint64_t sum = 0, count = 0;
  size_t i;
  if (b)
    for (i = 0; i < b->n && b->ops[i].op_id <= C; i++) {
      sum += b->ops[i].checksum;
      count++;
    }
  out->checksum = (uint32_t)sum;
  out->count = count;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int key_before(const md_stream *m, size_t i, uint64_t from) {
  for (size_t j = 0; j < i; j++)
    if (m->p[j].op_id > from && m->p[j].key.n == m->p[i].key.n &&
        (!m->p[i].key.n || memcmp(m->p[j].key.p, m->p[i].key.p, m->p[i].key.n) == 0))
      return 1;
  return 0;
}

size_t md_changed(const md_stream *m, int lookups, uint64_t from, uint64_t to,
                  void (*fn)(const void *p, size_t n, void *payload), void *payload) {
  size_t count = 0;
  if (!lookups) {
    for (size_t i = 0; i < m->n_b; i++)
      for (size_t k = 0; k < m->b[i].n; k++)
        if (m->b[i].ops[k].op_id > from && m->b[i].ops[k].op_id <= to) {
          if (fn) fn(m->b[i].name, strlen(m->b[i].name), payload);
          count++;
          break;
        }
    return count;
  }
  /* m->p is in ascending op id: a key counts at its first entry in the range */
  for (size_t i = 0; i < m->n_p && m->p[i].op_id <= to; i++)
    if (m->p[i].op_id > from && !key_before(m, i, from)) {
      if (fn) fn(m->p[i].key.p, m->p[i].key.n, payload);
      count++;
    }
  return count;
}

char *md_params(const md_stream *m, uint64_t C, const bs_val *keys, size_t n, size_t *n_rows) {
  char **rows = NULL, *out;
  size_t nr = 0, i, j, k, len = 1;
  for (k = 0; k < n; k++) {
    /* a key asked twice (equal bytes: 1 and 1.0 encode alike) is answered once */
    for (j = 0; j < k; j++)
      if (keys[j].size == keys[k].size &&
          (!keys[k].size || memcmp(keys[j].data, keys[k].data, keys[k].size) == 0))
        break;
    if (j < k) continue;
    /* Latest entry per source row with op_id <= C (m->p is in ascending op id). */
    for (i = 0; i < m->n_p; i++) {
      const md_param *p = &m->p[i], *latest = p;
      if (p->op_id > C) break;
      if (p->key.n != keys[k].size || memcmp(p->key.p, keys[k].data, p->key.n) != 0) continue;
      for (j = 0; j < i; j++) { /* skip if an earlier entry of this row was already emitted */
        const md_param *q = &m->p[j];
        if (q->table == p->table && strcmp(q->rid, p->rid) == 0 && q->key.n == p->key.n &&
            memcmp(q->key.p, p->key.p, p->key.n) == 0)
          break;
      }
      if (j < i) continue;
      for (j = i + 1; j < m->n_p && m->p[j].op_id <= C; j++) {
        const md_param *q = &m->p[j];
        if (q->table == p->table && strcmp(q->rid, p->rid) == 0 && q->key.n == p->key.n &&
            memcmp(q->key.p, p->key.p, p->key.n) == 0)
          latest = q;
      }
      for (j = 0; j < latest->n; j++) {
        char **grown = realloc(rows, (nr + 1) * sizeof *rows);
        assert_non_null(grown);
        rows = grown;
        rows[nr++] = latest->params[j];
      }
    }
  }
  if (nr) qsort(rows, nr, sizeof *rows, cmp_str);
  for (i = 0; i < nr; i++) len += strlen(rows[i]) + 1;
  out = malloc(len);
  assert_non_null(out);
  out[0] = 0;
  for (i = 0; i < nr; i++) {
    strcat(out, rows[i]);
    if (i + 1 < nr) strcat(out, "\n");
  }
  free(rows);
  if (n_rows) *n_rows = nr;
  return out;
}

/* ---- Reduce ----------------------------------------------------------------------------------- */

void md_reduce_init(md_reduced *r) {
  memset(r, 0, sizeof *r);
}

void md_reduce_free(md_reduced *r) {
  size_t i;
  for (i = 0; i < r->cap; i++)
    if (r->rows[i].key) {
      free(r->rows[i].key);
      free(r->rows[i].data);
    }
  free(r->rows);
  memset(r, 0, sizeof *r);
}

static char *row_key(const ct_op *op) {
  size_t n = op->object_type.n + op->object_id.n + op->subkey.n + 3;
  char *k = malloc(n);
  assert_non_null(k);
  snprintf(k, n, "%s\x1f%s\x1f%s", op->object_type.p ? op->object_type.p : "",
           op->object_id.p ? op->object_id.p : "", op->subkey.p ? op->subkey.p : "");
  return k;
}

static size_t slot_of(const md_reduced *r, const char *key) {
  size_t h = (size_t)XXH3_64bits(key, strlen(key)), i = h & (r->cap - 1);
  while (r->rows[i].key && strcmp(r->rows[i].key, key) != 0) i = (i + 1) & (r->cap - 1);
  return i;
}

static void rehash(md_reduced *r) {
  md_reduced n;
  size_t i;
  memset(&n, 0, sizeof n);
  n.cap = r->cap ? r->cap * 2 : 64;
  n.rows = calloc(n.cap, sizeof *n.rows);
  assert_non_null(n.rows);
  n.remainder = r->remainder;
  for (i = 0; i < r->cap; i++)
    if (r->rows[i].key) {
      n.rows[slot_of(&n, r->rows[i].key)] = r->rows[i];
      n.n++;
    }
  free(r->rows);
  *r = n;
}

/* Deletes slot i keeping the probe chains intact (backward-shift deletion). */
static void del_slot(md_reduced *r, size_t i) {
  size_t j = i;
  free(r->rows[i].key);
  free(r->rows[i].data);
  memset(&r->rows[i], 0, sizeof r->rows[i]);
  r->n--;
  for (;;) {
    size_t home;
    j = (j + 1) & (r->cap - 1);
    if (!r->rows[j].key) return;
    home = (size_t)XXH3_64bits(r->rows[j].key, strlen(r->rows[j].key)) & (r->cap - 1);
    /* move j to i if home is not cyclically in (i, j] */
    if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
      r->rows[i] = r->rows[j];
      memset(&r->rows[j], 0, sizeof r->rows[j]);
      i = j;
    }
  }
}

static void clear_rows(md_reduced *r) {
  size_t i;
  for (i = 0; i < r->cap; i++)
    if (r->rows[i].key) {
      free(r->rows[i].key);
      free(r->rows[i].data);
      memset(&r->rows[i], 0, sizeof r->rows[i]);
    }
  r->n = 0;
}

void md_reduce_op(md_reduced *r, const ct_op *op) {
  char *key;
  size_t i;
  if (op->type == BS_OP_CLEAR) {
    clear_rows(r);
    r->remainder = op->checksum;
    return;
  }
  if (op->type == BS_OP_MOVE) {
    r->remainder += op->checksum;
    return;
  }
  if ((r->n + 1) * 2 > r->cap) rehash(r);
  key = row_key(op);
  i = slot_of(r, key);
  if (r->rows[i].key) { /* the previous op of the row is superseded */
    r->remainder += r->rows[i].checksum;
    if (op->type == BS_OP_PUT) {
      free(r->rows[i].data);
      free(key);
      r->rows[i].op_id = op->op_id;
      r->rows[i].checksum = op->checksum;
      r->rows[i].data = dupn(op->data.p ? op->data.p : "", op->data.n);
    } else {
      free(key);
      del_slot(r, i);
      r->remainder += op->checksum;
    }
    return;
  }
  if (op->type == BS_OP_PUT) {
    r->rows[i].key = key;
    r->rows[i].op_id = op->op_id;
    r->rows[i].checksum = op->checksum;
    r->rows[i].data = dupn(op->data.p ? op->data.p : "", op->data.n);
    r->n++;
  } else {
    free(key);
    r->remainder += op->checksum;
  }
}

void md_reduce_ops(md_reduced *r, const ct_op *ops, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) md_reduce_op(r, &ops[i]);
}

uint32_t md_reduced_total(const md_reduced *r) {
  uint32_t s = r->remainder;
  size_t i;
  for (i = 0; i < r->cap; i++)
    if (r->rows[i].key) s += r->rows[i].checksum;
  return s;
}

const md_row *md_reduced_get(const md_reduced *r, const char *key) {
  size_t i;
  if (!r->cap) return NULL;
  i = slot_of(r, key);
  return r->rows[i].key ? &r->rows[i] : NULL;
}

int md_reduced_eq(const md_reduced *a, const md_reduced *b, char *why, size_t cap) {
  size_t i;
  if (a->n != b->n) {
    if (why) snprintf(why, cap, "%zu live rows vs %zu", a->n, b->n);
    return 0;
  }
  if (a->remainder != b->remainder) {
    if (why) snprintf(why, cap, "remainder checksum %u vs %u", a->remainder, b->remainder);
    return 0;
  }
  for (i = 0; i < a->cap; i++) {
    const md_row *x = &a->rows[i], *y;
    if (!x->key) continue;
    if (!b->cap) {
      if (why) snprintf(why, cap, "row %s missing", x->key);
      return 0;
    }
    y = &b->rows[slot_of(b, x->key)];
    if (!y->key) {
      if (why) snprintf(why, cap, "row %s missing on one side", x->key);
      return 0;
    }
    if (x->op_id != y->op_id || x->checksum != y->checksum || strcmp(x->data, y->data) != 0) {
      if (why)
        snprintf(why, cap, "row %s: op %llu cs %u vs op %llu cs %u", x->key,
                 (unsigned long long)x->op_id, x->checksum, (unsigned long long)y->op_id,
                 y->checksum);
      return 0;
    }
  }
  return 1;
}
