/*
 * util_contract.c: fixtures and helpers of the conformance tests (see util_contract.h).
 * Public API only.
 */
#include "util_contract.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util_pg.h"

/* ---- Backends --------------------------------------------------------------------------------- */

static int passthrough_open_storage(const ct_backend *be, bs_db *db, uint32_t id, bs_storage **out,
                                    bs_error *err) {
  bs_storage *st = NULL;
  int rc = bs_storage_open(&st, db, id, err);
  if (rc) return rc;
  rc = ct_passthrough_wrap(out, st);
  if (rc) bs_storage_close(st);
  return rc;
}

const ct_backend ct_backends[CT_N_BACKENDS] = {
    {"memory", 0, NULL, NULL, NULL, 0, NULL},
    {"lmdb", 1, NULL, NULL, NULL, 0, NULL},
    {"lmdb+passthrough", 1, NULL, passthrough_open_storage, NULL, 0, NULL},
};

int ct_lacks(const ct_backend *be, unsigned cap) {
  return (be->lacks & cap) != 0;
}

#ifdef BS_HAVE_PG
/* The schema of a test env: from its temporary directory's name (unique while it exists, and
 * the same for every open of one env), hex-encoded so that case cannot fold two into one. */
void ct_pg_schema_of(const char *path, char *out, size_t cap) {
  const char *end = strrchr(path, '/'), *p = end;
  size_t n;
  while (p > path && p[-1] != '/') p--;
  n = (size_t)snprintf(out, cap, "bsct_%ld_", (long)getpid());
  for (; p < end && n + 3 < cap; p++)
    n += (size_t)snprintf(out + n, cap - n, "%02x", (unsigned char)*p);
}

static int pg_open_db(const ct_backend *be, const char *path, const bs_open_options *opts,
                      bs_db **out, bs_error *err) {
  char schema[96], sql[160], url[1024];
  (void)be;
  ct_pg_schema_of(path, schema, sizeof schema);
  snprintf(sql, sizeof sql, "CREATE SCHEMA IF NOT EXISTS %s", schema);
  if (pgt_admin_try(sql, err->msg, sizeof err->msg)) return err->code = BS_EIO;
  pgt_schema_url(url, sizeof url, schema);
  return bs_open(out, url, opts, err);
}

static void pg_remove_db(const ct_backend *be, const char *path) {
  char schema[96], sql[160], msg[512];
  (void)be;
  ct_pg_schema_of(path, schema, sizeof schema);
  snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
  if (pgt_admin_try(sql, msg, sizeof msg)) fprintf(stderr, "postgres: %s\n", msg);
}

static const ct_backend ct_pg = {
    .name = "postgres",
    .persistent = 1,
    .open_db = pg_open_db,
    .remove_db = pg_remove_db,
};
#endif

const ct_backend *ct_postgres(void) {
#ifdef BS_HAVE_PG
  if (pgt_base_url()) return &ct_pg;
#endif
  return NULL;
}

size_t ct_backends_selected(const ct_backend *out[CT_MAX_BACKENDS]) {
  const char *only = getenv("BS_BACKEND");
  size_t i, n = 0;
  for (i = 0; i <= CT_N_BACKENDS; i++) {
    const ct_backend *be = i < CT_N_BACKENDS ? &ct_backends[i] : ct_postgres();
    if (be && (!only || !*only || strcmp(only, be->name) == 0)) out[n++] = be;
  }
  if (!n)
    fprintf(stderr, "BS_BACKEND=%s: no such backend here (postgres needs BS_TEST_PG_URL)\n", only);
  return n;
}

bs_error ct_err;

/* ---- Environment ------------------------------------------------------------------------------ */

static int open_db(const ct_env *e, size_t cache_entries, bs_db **out) {
  const ct_backend *be = e->be;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  o.checksum_cache_entries = cache_entries;
  memset(&ct_err, 0, sizeof ct_err);
  if (be->persistent) o.flags = BS_OPEN_NOSYNC;
  if (be->open_db) return be->open_db(be, be->persistent ? e->path : NULL, &o, out, &ct_err);
  if (!be->persistent) return bs_open_memory(out, &o, &ct_err);
  return bs_open(out, e->path, &o, &ct_err);
}

/* Removes every file of the test's temporary directory (whatever names the backend used), then
 * the directory. */
static void remove_dir(const char *dir) {
  char p[512];
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

int ct_env_open(ct_env *e, const ct_backend *be, size_t cache_entries) {
  memset(e, 0, sizeof *e);
  e->be = be;
  e->cache_entries = cache_entries;
  if (be->persistent) {
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/bsct.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir)) {
      e->dir[0] = 0;
      snprintf(ct_err.msg, sizeof ct_err.msg, "mkdtemp failed");
      return BS_EIO;
    }
    snprintf(e->path, sizeof e->path, "%s/db.bs", e->dir);
  }
  return open_db(e, cache_entries, &e->db);
}

int ct_open_second(const ct_env *e, size_t cache_entries, bs_db **out) {
  if (!e->be->persistent) return BS_EUNSUPPORTED;
  return open_db(e, cache_entries, out);
}

int ct_storage_open(const ct_env *e, bs_db *db, uint32_t id, bs_storage **out) {
  memset(&ct_err, 0, sizeof ct_err);
  if (e->be->open_storage) return e->be->open_storage(e->be, db, id, out, &ct_err);
  return bs_storage_open(out, db, id, &ct_err);
}

int ct_env_writer(ct_env *e, const bs_writer_options *opts) {
  if (e->w) bs_writer_close(e->w);
  e->w = NULL;
  memset(&ct_err, 0, sizeof ct_err);
  return bs_writer_open(&e->w, e->st, opts, &ct_err);
}

int ct_env_stream(ct_env *e, const char *name, bs_hash hash, const char *snapshot_lsn) {
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  int rc;
  so.hash = hash;
  if (e->w) bs_writer_close(e->w);
  if (e->st) bs_storage_close(e->st);
  e->w = NULL;
  e->st = NULL;
  memset(&ct_err, 0, sizeof ct_err);
  rc = bs_stream_create(&e->stream, e->db, name, &so, &ct_err);
  if (rc) return rc;
  rc = ct_storage_open(e, e->db, e->stream, &e->st);
  if (rc) return rc;
  rc = ct_env_writer(e, NULL);
  if (rc) return rc;
  if (snapshot_lsn) rc = bs_writer_snapshot_done(e->w, ct_v(snapshot_lsn), &ct_err);
  return rc;
}

int ct_env_reopen(ct_env *e) {
  int rc;
  if (!e->be->persistent) return BS_EUNSUPPORTED;
  if (e->w) bs_writer_close(e->w);
  if (e->st) bs_storage_close(e->st);
  bs_close(e->db);
  e->w = NULL;
  e->st = NULL;
  e->db = NULL;
  rc = open_db(e, e->cache_entries, &e->db);
  if (rc) return rc;
  if (!e->stream) return BS_OK;
  rc = ct_storage_open(e, e->db, e->stream, &e->st);
  if (rc) return rc;
  return ct_env_writer(e, NULL);
}

void ct_env_close(ct_env *e) {
  if (e->w) bs_writer_close(e->w);
  if (e->st) bs_storage_close(e->st);
  if (e->db) bs_close(e->db);
  e->w = NULL;
  e->st = NULL;
  e->db = NULL;
  if (e->dir[0] && e->be->remove_db) e->be->remove_db(e->be, e->path);
  if (e->dir[0]) {
    remove_dir(e->dir);
    e->dir[0] = 0;
  }
}

ct_env *ct_env_new(const ct_backend *be) {
  ct_env *e = calloc(1, sizeof *e);
  int rc;
  if (!e) return NULL;
  rc = ct_env_open(e, be, 0);
  if (rc == BS_OK) rc = ct_env_stream(e, "s1", BS_HASH_XXH3, "00000000");
  if (rc) {
    fprintf(stderr, "setup on %s failed: %s (%s)\n", be->name, bs_strerror(rc), ct_err.msg);
    ct_env_close(e);
    free(e);
    return NULL;
  }
  return e;
}

int ct_env_teardown(void **state) {
  ct_env *e = *state;
  ct_env_close(e);
  free(e);
  return 0;
}

/* ---- Writing ---------------------------------------------------------------------------------- */

bs_val ct_v(const char *s) {
  bs_val v = {s, s ? strlen(s) : 0};
  return v;
}

int ct_save_lk(bs_writer *w, bs_tag tag, const char *table, const char *before, const char *after,
               const ct_r *rows, size_t n_rows, const bs_lookup *lookups, size_t n_lookups) {
  bs_save s = BS_SAVE_INIT;
  bs_row rv[64];
  size_t i;
  if (n_rows > 64) return BS_EINVAL;
  for (i = 0; i < n_rows; i++) {
    rv[i].bucket = ct_v(rows[i].bucket);
    rv[i].object_type = ct_v(rows[i].type);
    rv[i].object_id = ct_v(rows[i].id);
    rv[i].data = ct_v(rows[i].data);
  }
  s.table = ct_v(table);
  s.tag = tag;
  s.before_id = ct_v(before);
  s.after_id = tag == BS_DELETE ? ct_v(NULL) : ct_v(after);
  s.rows = n_rows ? rv : NULL;
  s.n_rows = n_rows;
  s.lookups = lookups;
  s.n_lookups = n_lookups;
  memset(&ct_err, 0, sizeof ct_err);
  return bs_writer_save(w, &s, &ct_err);
}

int ct_save(bs_writer *w, bs_tag tag, const char *table, const char *before, const char *after,
            const ct_r *rows, size_t n_rows) {
  return ct_save_lk(w, tag, table, before, after, rows, n_rows, NULL, 0);
}

int ct_commit_ce(bs_writer *w, const char *lsn, int create_empty, bs_commit_result *out) {
  bs_commit_options o = BS_COMMIT_OPTIONS_INIT;
  o.create_empty = create_empty;
  memset(&ct_err, 0, sizeof ct_err);
  return bs_writer_commit(out, w, ct_v(lsn), &o, &ct_err);
}

int ct_commit(bs_writer *w, const char *lsn, bs_commit_result *out) {
  return ct_commit_ce(w, lsn, -1, out);
}

const char *ct_lsn(unsigned n) {
  static char buf[8][16];
  static int i;
  i = (i + 1) % 8;
  snprintf(buf[i], sizeof buf[i], "%08u", n);
  return buf[i];
}

static bs_val key_of(unsigned char *buf, size_t cap, const bs_scalar *sc) {
  size_t n = 0;
  bs_val v = {buf, 0};
  if (bs_lookup_encode(buf, cap, &n, sc, 1, &ct_err) == BS_OK)
    v.size = n;
  else
    fail_msg("bs_lookup_encode failed: %s", ct_err.msg);
  return v;
}

bs_val ct_key_str(unsigned char *buf, size_t cap, const char *s) {
  bs_scalar sc = {.type = BS_SCALAR_STRING, .s = ct_v(s)};
  return key_of(buf, cap, &sc);
}

bs_val ct_key_int(unsigned char *buf, size_t cap, int64_t i) {
  bs_scalar sc = {.type = BS_SCALAR_INT, .i = i};
  return key_of(buf, cap, &sc);
}

bs_val ct_key_double(unsigned char *buf, size_t cap, double d) {
  bs_scalar sc = {.type = BS_SCALAR_DOUBLE, .d = d};
  return key_of(buf, cap, &sc);
}

/* ---- Reading ---------------------------------------------------------------------------------- */

static void buf_copy(ct_buf *b, bs_val v) {
  if (!v.data) {
    b->p = NULL;
    b->n = 0;
    return;
  }
  b->p = ct_strndup(v.data, v.size);
  b->n = v.size;
}

int ct_buf_eq(const ct_buf *b, const char *s) {
  if (!s) return b->p == NULL || b->n == 0;
  return b->p && b->n == strlen(s) && memcmp(b->p, s, b->n) == 0;
}

void ct_op_copy(ct_op *d, const bs_op *s) {
  d->op_id = s->op_id;
  d->type = s->type;
  d->checksum = s->checksum;
  d->target_op = s->target_op;
  buf_copy(&d->object_type, s->object_type);
  buf_copy(&d->object_id, s->object_id);
  buf_copy(&d->subkey, s->subkey);
  buf_copy(&d->data, s->data);
}

void ct_op_free(ct_op *op) {
  free(op->object_type.p);
  free(op->object_id.p);
  free(op->subkey.p);
  free(op->data.p);
  memset(op, 0, sizeof *op);
}

void ct_oplist_push(ct_oplist *l, const bs_op *op) {
  l->v = ct_grow(l->v, &l->cap, l->n + 1, sizeof *l->v);
  ct_op_copy(&l->v[l->n++], op);
}

void ct_oplist_free(ct_oplist *l) {
  size_t i;
  for (i = 0; i < l->n; i++) ct_op_free(&l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

typedef struct read_ctx {
  ct_oplist *out;
  const char *bucket;
  size_t blen;
  uint64_t C;
  uint64_t pos; /* expected `after` of the next chunk */
  size_t chunk_bytes;
  size_t limit;
  size_t ops_this_call;
  int last_has_more;
  int got_chunk;
} read_ctx;

static size_t op_size(const bs_op *op) {
  return op->data.size + op->object_type.size + op->object_id.size + op->subkey.size;
}

static int on_chunk(const bs_chunk *c, void *payload) {
  read_ctx *r = payload;
  size_t i, bytes = 0;
  uint64_t tmax = 0;
  if (c->bucket.size != r->blen || memcmp(c->bucket.data, r->bucket, r->blen) != 0)
    fail_msg("chunk of another bucket (%.*s) for a one-bucket request", (int)c->bucket.size,
             (const char *)c->bucket.data);
  if (c->n_ops == 0) fail_msg("empty chunk (contract.md 5.2: a bucket without ops has no chunk)");
  if (c->after != r->pos)
    fail_msg("chunk after=%llu, expected %llu (requested position / previous next_after)",
             (unsigned long long)c->after, (unsigned long long)r->pos);
  for (i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    uint64_t prev = i ? c->ops[i - 1].op_id : c->after;
    if (op->op_id <= prev)
      fail_msg("op ids not ascending in chunk: %llu after %llu", (unsigned long long)op->op_id,
               (unsigned long long)prev);
    if (op->op_id > r->C)
      fail_msg("op %llu above the requested checkpoint %llu", (unsigned long long)op->op_id,
               (unsigned long long)r->C);
    if ((op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR) && op->target_op > tmax)
      tmax = op->target_op;
    bytes += op_size(op);
    ct_oplist_push(r->out, op);
  }
  if (c->next_after != c->ops[c->n_ops - 1].op_id)
    fail_msg("next_after=%llu, expected the last op id %llu", (unsigned long long)c->next_after,
             (unsigned long long)c->ops[c->n_ops - 1].op_id);
  if (c->target_op != tmax)
    fail_msg("chunk target_op=%llu, expected max target_op of its MOVE/CLEAR ops %llu",
             (unsigned long long)c->target_op, (unsigned long long)tmax);
  /* A chunk goes past chunk_bytes only when it is a single op (contract.md 5.2). */
  if (r->chunk_bytes && c->n_ops > 1 && bytes > r->chunk_bytes)
    fail_msg("chunk of %zu ops holds %zu bytes > chunk_bytes %zu", c->n_ops, bytes, r->chunk_bytes);
  if (c->target_op > r->out->max_target) r->out->max_target = c->target_op;
  r->out->n_chunks++;
  r->pos = c->next_after;
  r->ops_this_call += c->n_ops;
  r->last_has_more = c->has_more;
  r->got_chunk = 1;
  return 0;
}

int ct_read_bucket_opts(bs_storage *st, uint64_t C, const char *bucket, size_t blen, uint64_t after,
                        size_t limit, size_t chunk_bytes, ct_oplist *out) {
  read_ctx r;
  bs_bucket_request req;
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  int rc, more = 0, rounds = 0;
  memset(&r, 0, sizeof r);
  r.out = out;
  r.bucket = bucket;
  r.blen = blen;
  r.C = C;
  r.pos = after;
  r.chunk_bytes = chunk_bytes ? chunk_bytes : 1024 * 1024;
  r.limit = limit ? limit : BS_BATCH_LIMIT_DEFAULT; /* this helper's 0: the default */
  o.limit = r.limit;
  o.chunk_bytes = chunk_bytes;
  do {
    req.bucket.data = bucket;
    req.bucket.size = blen;
    req.after = r.pos;
    r.ops_this_call = 0;
    r.got_chunk = 0;
    more = 0;
    memset(&ct_err, 0, sizeof ct_err);
    rc = bs_get_bucket_data(&more, st, C, &req, 1, &o, on_chunk, &r, &ct_err);
    if (rc) return rc;
    if (r.ops_this_call > r.limit)
      fail_msg("one call returned %zu ops > limit %zu", r.ops_this_call, r.limit);
    if (more && !r.got_chunk) fail_msg("has_more without progress");
    if (++rounds > 1000000) fail_msg("read does not terminate");
  } while (more);
  return BS_OK;
}

int ct_read_bucket(bs_storage *st, uint64_t C, const char *bucket, uint64_t after, ct_oplist *out) {
  return ct_read_bucket_opts(st, C, bucket, strlen(bucket), after, 0, 0, out);
}

int ct_checksum_n(bs_storage *st, uint64_t C, const char *bucket, size_t blen, bs_checksum *out) {
  bs_val b = {bucket, blen};
  memset(&ct_err, 0, sizeof ct_err);
  memset(out, 0xa5, sizeof *out); /* a backend that leaves it unset must not pass */
  return bs_get_checksums(out, st, C, &b, 1, &ct_err);
}

int ct_checksum(bs_storage *st, uint64_t C, const char *bucket, bs_checksum *out) {
  return ct_checksum_n(st, C, bucket, strlen(bucket), out);
}

typedef struct params_ctx {
  char **v;
  size_t n, cap;
} params_ctx;

static int on_param(const bs_val *p, void *payload) {
  params_ctx *c = payload;
  c->v = ct_grow(c->v, &c->cap, c->n + 1, sizeof *c->v);
  c->v[c->n++] = ct_strndup(p->data, p->size);
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int ct_params(bs_storage *st, uint64_t C, const bs_val *lookups, size_t n, size_t limit,
              char **out) {
  params_ctx c = {NULL, 0, 0};
  size_t i, len = 1;
  int rc;
  memset(&ct_err, 0, sizeof ct_err);
  rc = bs_get_parameter_sets(st, C, lookups, n, limit, on_param, &c, &ct_err);
  if (c.n) qsort(c.v, c.n, sizeof *c.v, cmp_str);
  for (i = 0; i < c.n; i++) len += strlen(c.v[i]) + 1;
  *out = malloc(len);
  assert_non_null(*out);
  (*out)[0] = 0;
  for (i = 0; i < c.n; i++) {
    strcat(*out, c.v[i]);
    if (i + 1 < c.n) strcat(*out, "\n");
    free(c.v[i]);
  }
  free(c.v);
  return rc;
}

void ct_expect_params(bs_storage *st, uint64_t C, const bs_val *lookups, size_t n,
                      const char *want) {
  char *got = NULL;
  int rc = ct_params(st, C, lookups, n, BS_PARAM_LIMIT_DEFAULT, &got);
  if (rc != BS_OK) {
    free(got);
    fail_msg("parameter sets at %llu: %s (%s)", (unsigned long long)C, bs_strerror(rc), ct_err.msg);
    return; /* not reached: fail_msg jumps out */
  }
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "parameter sets at %llu: got \"%s\", expected \"%s\"\n", (unsigned long long)C,
            got, want);
    free(got);
    fail();
    return; /* not reached */
  }
  free(got);
}

const char *ct_type_name(bs_op_type t) {
  switch (t) {
  case BS_OP_PUT:
    return "PUT";
  case BS_OP_REMOVE:
    return "REMOVE";
  case BS_OP_MOVE:
    return "MOVE";
  case BS_OP_CLEAR:
    return "CLEAR";
  default:
    return "?";
  }
}

void ct_dump_ops(const char *what, const ct_oplist *l) {
  size_t i;
  fprintf(stderr, "  %s (%zu ops):\n", what, l->n);
  for (i = 0; i < l->n; i++) {
    const ct_op *o = &l->v[i];
    fprintf(stderr, "    %llu %s cs=%u target=%llu %s/%s/%s %s\n", (unsigned long long)o->op_id,
            ct_type_name(o->type), o->checksum, (unsigned long long)o->target_op,
            o->object_type.p ? o->object_type.p : "-", o->object_id.p ? o->object_id.p : "-",
            o->subkey.p ? o->subkey.p : "-", o->data.p ? o->data.p : "-");
  }
}

/* ---- Small containers ------------------------------------------------------------------------- */

char *ct_strndup(const void *p, size_t n) {
  char *s = malloc(n + 1);
  assert_non_null(s);
  if (n) memcpy(s, p, n);
  s[n] = 0;
  return s;
}

char *ct_strdup(const char *s) {
  return ct_strndup(s, strlen(s));
}

void *ct_grow(void *v, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return v;
  *cap = *cap ? *cap * 2 : 8;
  if (*cap < need) *cap = need;
  v = realloc(v, *cap * elem);
  assert_non_null(v);
  return v;
}

size_t ct_sorted_pos(const void *v, size_t n, size_t elem, size_t name_off, const char *name,
                     size_t len, int *found) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const char *m;
    size_t ml;
    int d;
    memcpy(&m, (const char *)v + mid * elem + name_off, sizeof m);
    ml = strlen(m);
    d = memcmp(m, name, ml < len ? ml : len);
    if (d == 0) d = ml < len ? -1 : ml > len ? 1 : 0;
    if (d == 0) {
      *found = 1;
      return mid;
    }
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = 0;
  return lo;
}

void *ct_insert_at(void *v, size_t *n, size_t *cap, size_t i, size_t elem) {
  char *p = ct_grow(v, cap, *n + 1, elem);
  memmove(p + (i + 1) * elem, p + i * elem, (*n - i) * elem);
  memset(p + i * elem, 0, elem);
  ++*n;
  return p;
}

void ct_remove_at(void *v, size_t *n, size_t i, size_t elem) {
  char *p = v;
  memmove(p + i * elem, p + (i + 1) * elem, (*n - i - 1) * elem);
  --*n;
}

char *ct_row_key(const ct_op *op) {
  size_t n = op->object_type.n + op->object_id.n + op->subkey.n + 3;
  char *k = malloc(n);
  assert_non_null(k);
  snprintf(k, n, "%s\x1f%s\x1f%s", op->object_type.p ? op->object_type.p : "",
           op->object_id.p ? op->object_id.p : "", op->subkey.p ? op->subkey.p : "");
  return k;
}

/* ---- Callbacks' returns ----------------------------------------------------------------------- */

const int ct_callback_values[CT_N_CALLBACK_VALUES] = {0, -1, BS_ECANCELED, BS_EUSER, BS_ENOMEM,
                                                      1, 42, INT_MIN,      INT_MAX};

void ct_expect_stopped(const char *call, int rc, int value, int calls, const char *callback) {
  char want[160];
  int code = strstr(callback, "progress") ? BS_ECANCELED : BS_EUSER;
  if (value == 0) {
    if (rc != BS_OK)
      fail_msg("%s: %s (%s) with a callback returning 0", call, bs_strerror(rc), ct_err.msg);
    return;
  }
  snprintf(want, sizeof want, "%s returned %d, which %s the call", callback, value,
           code == BS_ECANCELED ? "cancels" : "stops");
  if (rc != code || ct_err.code != code || strcmp(ct_err.msg, want) != 0)
    fail_msg("%s with the callback returning %d: got %s (%s), expected %s (%s)", call, value,
             bs_strerror(rc), ct_err.msg, bs_strerror(code), want);
  if (calls != 1) fail_msg("%s: the callback ran %d times after returning %d", call, calls, value);
}

/* ---- Seeds ------------------------------------------------------------------------------------ */

int ct_quick(void) {
  const char *q = getenv("BS_TEST_QUICK");
  return q && *q && strcmp(q, "0") != 0;
}

uint64_t ct_env_u64(const char *name, uint64_t dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  return strtoull(s, NULL, 0);
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

ct_rng ct_seed(uint64_t seed, uint64_t stream) {
  ct_rng r = {mix64(mix64(seed) ^ stream)};
  return r;
}

uint64_t ct_rand(ct_rng *r) {
  return mix64(r->s += 0x9e3779b97f4a7c15ull);
}

uint64_t ct_below(ct_rng *r, uint64_t n) {
  return n ? ct_rand(r) % n : 0;
}

void ct_trace(uint64_t *h, const void *p, size_t n) {
  const unsigned char *b = p;
  if (!*h) *h = 0xcbf29ce484222325ull;
  while (n--) *h = (*h ^ *b++) * 0x100000001b3ull;
}

static int cmp_trace(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

size_t ct_repeats(const uint64_t *v, size_t n) {
  uint64_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
  size_t i, dup = 0;
  assert_non_null(sorted);
  memcpy(sorted, v, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_trace);
  for (i = 1; i < n; i++) dup += sorted[i] == sorted[i - 1];
  free(sorted);
  return dup;
}

/* The seed blocks of make test's randomized runs, each CT_SEED_BLOCK seeds above BS_SEED_BASE: a
 * suite run on several backends takes CT_MAX_BACKENDS blocks from its first (ct_backends[] order,
 * then postgres), the others one. Blocks 21-22 are tests/driver_diff.py's (SEED_BLOCKS), 23-25 the
 * crash tests' and 46 tests/crash/pg_crash.c's (the Makefile's seed_block). 34 was "compact"'s
 * while it ran on LMDB only. */
static const struct {
  const char *suite;
  unsigned block, per_backend;
} seed_blocks[] = {
    {"property", 1, 1},    {"differential", 5, 1}, {"sync", 9, 1},         {"diff", 13, 1},
    {"pg_compact", 17, 1}, {"torn", 26, 1},        {"cache", 30, 0},       {"checksum", 31, 0},
    {"lookup", 32, 0},     {"mem", 33, 0},         {"concurrency", 35, 0}, {"fault", 36, 0},
    {"read", 37, 0},       {"writer", 38, 0},      {"badfile", 39, 0},     {"common", 40, 0},
    {"verify", 41, 0},     {"compact", 42, 1},
};

uint64_t ct_first_seed(const char *suite, const ct_backend *be) {
  enum { N = sizeof seed_blocks / sizeof seed_blocks[0] };
  size_t s = 0, b = 0;
  if (getenv("BS_SEED") && *getenv("BS_SEED")) return ct_env_u64("BS_SEED", 1);
  while (s < N && strcmp(seed_blocks[s].suite, suite) != 0) s++;
  if (s == N) {
    fail_msg("ct_first_seed: no seed block for suite %s", suite);
    return 0;
  }
  if (!be != !seed_blocks[s].per_backend)
    fail_msg("ct_first_seed: suite %s takes %s", suite,
             seed_blocks[s].per_backend ? "a backend" : "no backend");
  while (be && b < CT_N_BACKENDS && be != &ct_backends[b]) b++;
  return ct_env_u64("BS_SEED_BASE", 1) + (seed_blocks[s].block + b) * (uint64_t)CT_SEED_BLOCK;
}

uint64_t ct_run_seed(const char *suite) {
  uint64_t seed = ct_first_seed(suite, NULL);
  fprintf(stderr, "%s: seed %llu (reproduce: BS_SEED=%llu build/tests/test_%s)\n", suite,
          (unsigned long long)seed, (unsigned long long)seed, suite);
  ct_seed_log(suite, "-", seed);
  return seed;
}

void ct_seed_log(const char *suite, const char *backend, uint64_t seed) {
  const char *path = getenv("BS_SEED_LOG");
  FILE *f;
  if (!path || !*path) return;
  if (!(f = fopen(path, "a"))) fail_msg("BS_SEED_LOG %s: cannot append", path);
  fprintf(f, "%s %s %llu\n", suite, backend, (unsigned long long)seed);
  fclose(f);
}

void ct_distinct_traces(const char *suite, uint64_t first, const uint64_t *trace, size_t n) {
  size_t i, j, dup = ct_repeats(trace, n);
  for (i = 0; dup && i < n; i++)
    for (j = i + 1; j < n; j++)
      if (trace[i] == trace[j])
        fail_msg("%s: %zu of %zu seeds repeat another's trace, first seeds %llu and %llu", suite,
                 dup, n, (unsigned long long)(first + i), (unsigned long long)(first + j));
}
