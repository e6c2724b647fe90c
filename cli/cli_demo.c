/*
 * cli_demo.c: `bucketstore demo`, the main job end to end. It replicates a synthetic workload
 * (users, lists and todos; todos and lists live in the bucket of their list, users in one global
 * bucket; lists also produce an owner lookup) first as a snapshot, then as rounds of updates,
 * deletes and bucket moves, each round committed as a checkpoint. Clients then download buckets
 * the way the sync protocol does (batches, after = next_after, reducing PUT/REMOVE/MOVE/CLEAR)
 * and every bucket is checked twice: its checksum against get_checksums, and its reduced rows
 * against the model of what was written. Compaction runs in between (skipped when the backend
 * does not have it yet) and must change neither.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_LIST_BUCKETS 100
#define GLOBAL         N_LIST_BUCKETS /* index of the users' bucket */
#define N_BUCKETS      (N_LIST_BUCKETS + 1)

/* ---- A small string-keyed hash map: one per client bucket, row identity -> row ------------- */

typedef struct slot {
  char *key; /* object_type '\0' object_id */
  size_t klen;
  uint32_t checksum;
  char *data;
  int live;
} slot;

typedef struct map {
  slot *s;
  size_t cap, used;
} map;

static uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  while (n--) h = (h ^ (unsigned char)*p++) * 1099511628211ull;
  return h;
}

static void map_free(map *m) {
  size_t i;
  for (i = 0; i < m->cap; i++) {
    free(m->s[i].key);
    free(m->s[i].data);
  }
  free(m->s);
  memset(m, 0, sizeof *m);
}

static slot *map_find(map *m, const char *k, size_t n) {
  size_t i;
  if (!m->cap) return NULL;
  for (i = hash_bytes(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    slot *s = &m->s[i];
    if (!s->key) return NULL;
    if (s->klen == n && memcmp(s->key, k, n) == 0) return s;
  }
}

static slot *map_empty_slot(map *m, const char *k, size_t n) {
  size_t i;
  for (i = hash_bytes(k, n) & (m->cap - 1); m->s[i].key; i = (i + 1) & (m->cap - 1)) {
  }
  return &m->s[i];
}

/* Finds or inserts key k; NULL when out of memory. Keys are never deleted (a removed row is
 * marked not live), so linear probing needs no tombstones. */
static slot *map_put(map *m, const char *k, size_t n) {
  slot *s;
  size_t i;
  if ((s = map_find(m, k, n))) return s;
  if (2 * (m->used + 1) > m->cap) {
    map old = *m;
    m->cap = old.cap ? 2 * old.cap : 64;
    if (!(m->s = calloc(m->cap, sizeof *m->s))) return *m = old, NULL;
    for (i = 0; i < old.cap; i++)
      if (old.s[i].key) *map_empty_slot(m, old.s[i].key, old.s[i].klen) = old.s[i];
    free(old.s);
  }
  s = map_empty_slot(m, k, n);
  if (!(s->key = malloc(n))) return NULL;
  memcpy(s->key, k, n);
  s->klen = n;
  m->used++;
  return s;
}

/* ---- The client: reduces downloaded ops as the sync client does ----------------------------- */

typedef struct cbucket {
  uint64_t after; /* position: the next_after of the last chunk */
  uint32_t rem;   /* checksum of ops that are no longer rows (superseded, removed, moved) */
  uint64_t ops;   /* ops downloaded */
  map rows;
} cbucket;

typedef struct client {
  cbucket b[N_BUCKETS];
  uint64_t ops;
  int failed;
  char why[200];
} client;

static void bucket_name(char *out, size_t cap, int i) {
  if (i == GLOBAL)
    snprintf(out, cap, "global[]");
  else
    snprintf(out, cap, "by_list[\"%d\"]", i);
}

static int bucket_index(bs_val name) {
  char buf[40];
  int i = -1;
  if (name.size >= sizeof buf) return -1;
  memcpy(buf, name.data, name.size);
  buf[name.size] = 0;
  if (strcmp(buf, "global[]") == 0) return GLOBAL;
  if (sscanf(buf, "by_list[\"%d\"]", &i) != 1 || i < 0 || i >= N_LIST_BUCKETS) return -1;
  return i;
}

static void client_free(client *c) {
  int i;
  for (i = 0; i < N_BUCKETS; i++) map_free(&c->b[i].rows);
  memset(c, 0, sizeof *c);
}

static uint32_t client_checksum(const cbucket *b) {
  uint64_t sum = b->rem;
  size_t i;
  for (i = 0; i < b->rows.cap; i++)
    if (b->rows.s[i].live) sum += b->rows.s[i].checksum;
  return (uint32_t)sum;
}

static int key_of(char *buf, size_t cap, const bs_op *op, size_t *n) {
  *n = op->object_type.size + 1 + op->object_id.size;
  if (*n > cap) return -1;
  memcpy(buf, op->object_type.data, op->object_type.size);
  buf[op->object_type.size] = 0;
  memcpy(buf + op->object_type.size + 1, op->object_id.data, op->object_id.size);
  return 0;
}

static int apply_op(cbucket *b, const bs_op *op) {
  char key[256];
  size_t n, i;
  slot *s;
  switch (op->type) {
  case BS_OP_PUT:
    if (key_of(key, sizeof key, op, &n) != 0 || !(s = map_put(&b->rows, key, n))) return -1;
    if (s->live) b->rem += s->checksum; /* the row's earlier op is superseded */
    free(s->data);
    if (!(s->data = malloc(op->data.size + 1))) return -1;
    memcpy(s->data, op->data.data, op->data.size);
    s->data[op->data.size] = 0;
    s->checksum = op->checksum;
    s->live = 1;
    break;
  case BS_OP_REMOVE:
    if (key_of(key, sizeof key, op, &n) != 0) return -1;
    if ((s = map_find(&b->rows, key, n)) && s->live) {
      b->rem += s->checksum;
      s->live = 0;
    }
    b->rem += op->checksum;
    break;
  case BS_OP_MOVE:
    b->rem += op->checksum;
    break;
  case BS_OP_CLEAR:
    /* everything before it is gone; its checksum is the sum of what it replaced */
    for (i = 0; i < b->rows.cap; i++) b->rows.s[i].live = 0;
    b->rem = op->checksum;
    break;
  }
  return 0;
}

static int on_chunk(const bs_chunk *ch, void *payload) {
  client *c = payload;
  int i = bucket_index(ch->bucket);
  size_t k;
  if (i < 0) {
    snprintf(c->why, sizeof c->why, "chunk of unknown bucket %.*s", (int)ch->bucket.size,
             (const char *)ch->bucket.data);
    return BS_ECANCELED;
  }
  if (ch->after != c->b[i].after) {
    snprintf(c->why, sizeof c->why, "bucket %d: chunk after %llu, client at %llu", i,
             (unsigned long long)ch->after, (unsigned long long)c->b[i].after);
    return BS_ECANCELED;
  }
  for (k = 0; k < ch->n_ops; k++)
    if (apply_op(&c->b[i], &ch->ops[k]) != 0) {
      snprintf(c->why, sizeof c->why, "out of memory (or a key over 256 bytes)");
      return BS_ECANCELED;
    }
  c->b[i].ops += ch->n_ops;
  c->ops += ch->n_ops;
  if (ch->n_ops) c->b[i].after = ch->next_after;
  return 0;
}

/* Downloads every bucket up to checkpoint cp, in batches of 1000 ops. */
static int client_sync(client *c, bs_storage *st, uint64_t cp, bs_error *err) {
  bs_bucket_request req[N_BUCKETS];
  bs_batch_options opts = BS_BATCH_OPTIONS_INIT;
  char names[N_BUCKETS][32];
  int i, has_more = 1, rc;
  opts.limit = 1000;
  while (has_more) {
    for (i = 0; i < N_BUCKETS; i++) {
      bucket_name(names[i], sizeof names[i], i);
      req[i].bucket.data = names[i];
      req[i].bucket.size = strlen(names[i]);
      req[i].after = c->b[i].after;
    }
    rc = bs_get_bucket_data(&has_more, st, cp, req, N_BUCKETS, &opts, on_chunk, c, err);
    if (rc == BS_EUSER && c->why[0]) snprintf(err->msg, sizeof err->msg, "%s", c->why);
    if (rc != BS_OK) return rc;
  }
  return BS_OK;
}

/* ---- The model: what was written ------------------------------------------------------------ */

enum { USERS, LISTS, TODOS, N_TABLES };
static const char *table_names[N_TABLES] = {"users", "lists", "todos"};

typedef struct mrow {
  int alive;
  uint32_t version;
  uint32_t ref; /* lists: owner user; todos: list */
} mrow;

typedef struct demo {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  mrow *rows[N_TABLES];
  size_t n[N_TABLES];
  uint64_t rng;
  uint64_t lsn;
  uint64_t saves, checkpoints, last_op;
  int mismatches;
} demo;

static uint64_t rnd(demo *d) { /* xorshift64*: deterministic per seed */
  d->rng ^= d->rng >> 12;
  d->rng ^= d->rng << 25;
  d->rng ^= d->rng >> 27;
  return d->rng * 2685821657736338717ull;
}

static int row_bucket(const demo *d, int t, size_t id) {
  if (t == USERS) return GLOBAL;
  return (int)((t == LISTS ? id : d->rows[t][id].ref) % N_LIST_BUCKETS);
}

static void row_id(char *out, size_t cap, int t, size_t id) {
  snprintf(out, cap, "%c%zu", table_names[t][0], id);
}

static int row_data(char *out, size_t cap, const demo *d, int t, size_t id) {
  const mrow *r = &d->rows[t][id];
  switch (t) {
  case USERS:
    return snprintf(out, cap, "{\"id\":\"u%zu\",\"name\":\"user %zu\",\"v\":%u}", id, id,
                    r->version);
  case LISTS:
    return snprintf(out, cap, "{\"id\":\"l%zu\",\"owner\":\"u%u\",\"name\":\"list %zu\",\"v\":%u}",
                    id, r->ref, id, r->version);
  default:
    return snprintf(out, cap,
                    "{\"id\":\"t%zu\",\"list\":\"l%u\",\"description\":\"todo %zu\","
                    "\"done\":%s,\"v\":%u}",
                    id, r->ref, id, r->version % 2 ? "true" : "false", r->version);
  }
}

static int owner_key(unsigned char *buf, size_t cap, size_t *n, uint32_t user, bs_error *err) {
  char u[24];
  bs_scalar v[2];
  snprintf(u, sizeof u, "u%u", user);
  v[0].type = BS_SCALAR_STRING;
  v[0].s.data = "owner";
  v[0].s.size = 5;
  v[1].type = BS_SCALAR_STRING;
  v[1].s.data = u;
  v[1].s.size = strlen(u);
  return bs_lookup_encode(buf, cap, n, v, 2, err);
}

/* Saves row (t, id) in its current model state (alive: its output; dead: a delete). */
static int save_row(demo *d, int t, size_t id, bs_tag tag, bs_error *err) {
  char rid[24], bucket[32], data[256], param[48];
  unsigned char key[64];
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  bs_lookup lk;
  bs_val pv;
  int rc;
  row_id(rid, sizeof rid, t, id);
  s.table.data = table_names[t];
  s.table.size = strlen(table_names[t]);
  s.tag = tag;
  s.after_id.data = s.before_id.data = rid;
  s.after_id.size = s.before_id.size = strlen(rid);
  if (tag != BS_DELETE) {
    bucket_name(bucket, sizeof bucket, row_bucket(d, t, id));
    row.bucket.data = bucket;
    row.bucket.size = strlen(bucket);
    row.object_type = s.table;
    row.object_id = s.after_id;
    row.data.data = data;
    row.data.size = (size_t)row_data(data, sizeof data, d, t, id);
    s.rows = &row;
    s.n_rows = 1;
    if (t == LISTS) {
      if ((rc = owner_key(key, sizeof key, &lk.key.size, d->rows[t][id].ref, err)) != BS_OK)
        return rc;
      lk.key.data = key;
      pv.data = param;
      pv.size = (size_t)snprintf(param, sizeof param, "{\"list\":\"l%zu\"}", id);
      lk.params = &pv;
      lk.n_params = 1;
      s.lookups = &lk;
      s.n_lookups = 1;
    }
  }
  d->saves++;
  return bs_writer_save(d->w, &s, err);
}

static int commit(demo *d, bs_error *err) {
  char lsn[24];
  bs_commit_result r;
  int rc;
  snprintf(lsn, sizeof lsn, "%08X/%08X", (unsigned)(d->lsn >> 32), (unsigned)d->lsn);
  d->lsn += 0x100;
  {
    bs_val v = {lsn, strlen(lsn)};
    if ((rc = bs_writer_commit(&r, d->w, v, NULL, err)) != BS_OK) return rc;
  }
  if (r.checkpoint_created) d->checkpoints++;
  d->last_op = r.checkpoint;
  return BS_OK;
}

/* The initial snapshot: every row inserted by a snapshot writer, then snapshot_done + commit. */
static int snapshot(demo *d, bs_error *err) {
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  char lsn[24];
  size_t id;
  int t, rc;
  wo.snapshot = 1;
  if ((rc = bs_writer_open(&d->w, d->st, &wo, err)) != BS_OK) return rc;
  for (t = 0; t < N_TABLES; t++)
    for (id = 0; id < d->n[t]; id++) {
      mrow *r = &d->rows[t][id];
      r->alive = 1;
      r->version = 1;
      if (t == LISTS) r->ref = (uint32_t)(rnd(d) % d->n[USERS]);
      if (t == TODOS) r->ref = (uint32_t)(rnd(d) % d->n[LISTS]);
      if ((rc = save_row(d, t, id, BS_INSERT, err)) != BS_OK) return rc;
    }
  snprintf(lsn, sizeof lsn, "%08X/%08X", (unsigned)(d->lsn >> 32), (unsigned)d->lsn);
  {
    bs_val v = {lsn, strlen(lsn)};
    if ((rc = bs_writer_snapshot_done(d->w, v, err)) != BS_OK) return rc;
  }
  rc = commit(d, err);
  bs_writer_close(d->w);
  d->w = NULL;
  return rc;
}

/* One round of streaming changes: updates (60%), bucket moves of todos (20%), deletes of
 * todos (20%); a change to a deleted row re-inserts it. Then a commit. */
static int stream_round(demo *d, size_t changes, bs_error *err) {
  size_t k;
  int rc;
  for (k = 0; k < changes; k++) {
    uint64_t x = rnd(d) % 100;
    int t = x < 10 ? USERS : x < 25 ? LISTS : TODOS;
    size_t id = (size_t)(rnd(d) % d->n[t]);
    mrow *r = &d->rows[t][id];
    bs_tag tag = r->alive ? BS_UPDATE : BS_INSERT;
    if (t == TODOS && x >= 60 && r->alive) {
      if (x < 80) {
        r->ref = (uint32_t)(rnd(d) % d->n[LISTS]); /* move: usually to another bucket */
      } else {
        r->alive = 0;
        tag = BS_DELETE;
      }
    }
    if (tag != BS_DELETE) {
      r->alive = 1;
      r->version++;
    }
    if ((rc = save_row(d, t, id, tag, err)) != BS_OK) return rc;
  }
  return commit(d, err);
}

/* ---- Checks --------------------------------------------------------------------------------- */

static int mismatch(demo *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int mismatch(demo *d, const char *fmt, ...) {
  va_list ap;
  if (++d->mismatches <= 10) {
    fprintf(stderr, "MISMATCH: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
  }
  return 1;
}

/* Every bucket of client c at checkpoint cp: checksum (and, for a client that downloaded from
 * zero, count) equal get_checksums; reduced rows equal the model's live rows. */
static int check_client(demo *d, client *c, uint64_t cp, int fresh, const char *who,
                        uint32_t *sums_out, bs_error *err) {
  bs_val names[N_BUCKETS];
  char buf[N_BUCKETS][32], key[64], data[256];
  bs_checksum sums[N_BUCKETS];
  size_t live[N_BUCKETS] = {0}, id, i;
  int t, b, rc, bad = d->mismatches;
  for (b = 0; b < N_BUCKETS; b++) {
    bucket_name(buf[b], sizeof buf[b], b);
    names[b].data = buf[b];
    names[b].size = strlen(buf[b]);
  }
  if ((rc = bs_get_checksums(sums, d->st, cp, names, N_BUCKETS, err)) != BS_OK) return rc;
  for (b = 0; b < N_BUCKETS; b++) {
    uint32_t mine = client_checksum(&c->b[b]);
    if (sums_out) sums_out[b] = sums[b].checksum;
    if (mine != sums[b].checksum)
      mismatch(d, "%s: bucket %s at %llu: downloaded checksum %u, get_checksums %u", who, buf[b],
               (unsigned long long)cp, mine, sums[b].checksum);
    if (fresh && c->b[b].ops != sums[b].count)
      mismatch(d, "%s: bucket %s: downloaded %llu ops, count %llu", who, buf[b],
               (unsigned long long)c->b[b].ops, (unsigned long long)sums[b].count);
  }
  for (t = 0; t < N_TABLES; t++)
    for (id = 0; id < d->n[t]; id++) {
      size_t n;
      slot *s;
      if (!d->rows[t][id].alive) continue;
      b = row_bucket(d, t, id);
      n = (size_t)snprintf(key, sizeof key, "%s%c", table_names[t], 0);
      row_id(key + n, sizeof key - n, t, id);
      n += strlen(key + n);
      row_data(data, sizeof data, d, t, id);
      live[b]++;
      s = map_find(&c->b[b].rows, key, n);
      if (!s || !s->live || strcmp(s->data, data) != 0)
        mismatch(d, "%s: row %s in %s: %s, expected %s", who, key + strlen(key) + 1, buf[b],
                 !s || !s->live ? "missing" : s->data, data);
    }
  for (b = 0; b < N_BUCKETS; b++) {
    size_t have = 0;
    for (i = 0; i < c->b[b].rows.cap; i++) have += c->b[b].rows.s[i].live;
    if (have != live[b])
      mismatch(d, "%s: bucket %s holds %zu rows, expected %zu", who, buf[b], have, live[b]);
  }
  printf("  %-34s %s\n", who, d->mismatches == bad ? "ok: checksums and rows match" : "MISMATCH");
  return BS_OK;
}

static int count_set(const bs_val *params, void *payload) {
  ++*(size_t *)payload;
  return 0;
}

/* Parameter sets of a few users: one row per list they own (lists are never deleted). */
static int check_parameters(demo *d, uint64_t cp, bs_error *err) {
  size_t u, l, want, got;
  unsigned char key[64];
  bs_val k;
  int rc;
  for (u = 0; u < d->n[USERS]; u += d->n[USERS] / 10 + 1) {
    if ((rc = owner_key(key, sizeof key, &k.size, (uint32_t)u, err)) != BS_OK) return rc;
    k.data = key;
    for (want = 0, l = 0; l < d->n[LISTS]; l++) want += d->rows[LISTS][l].ref == u;
    got = 0;
    if ((rc = bs_get_parameter_sets(d->st, cp, &k, 1, BS_PARAM_LIMIT_DEFAULT, count_set, &got,
                                    err)) != BS_OK)
      return rc;
    if (got != want) mismatch(d, "parameter sets of u%zu: %zu, expected %zu", u, got, want);
  }
  return BS_OK;
}

/* ---- The job -------------------------------------------------------------------------------- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double rate(double n, double secs) {
  return secs > 0 ? n / secs : 0;
}

/* A step that failed: prints what and returns 1 (the exit status). */
static int step_failed(const char *what, int rc, const bs_error *err) {
  fprintf(stderr, "bucketstore demo: %s: %s: %s\n", what, cli_code_name(rc),
          cli_error_text(rc, err));
  return 1;
}

static uint64_t total_count(demo *d, uint64_t cp, bs_error *err, int *rc) {
  bs_val names[N_BUCKETS];
  char buf[N_BUCKETS][32];
  bs_checksum sums[N_BUCKETS];
  uint64_t n = 0;
  int b;
  for (b = 0; b < N_BUCKETS; b++) {
    bucket_name(buf[b], sizeof buf[b], b);
    names[b].data = buf[b];
    names[b].size = strlen(buf[b]);
  }
  if ((*rc = bs_get_checksums(sums, d->st, cp, names, N_BUCKETS, err)) != BS_OK) return 0;
  for (b = 0; b < N_BUCKETS; b++) n += sums[b].count;
  return n;
}

/* Parses the demo's own options; the database ones go to cli_db_option. */
static int demo_options(cli_db *c, int argc, char **argv, size_t *rows, uint64_t *seed) {
  int i;
  for (i = 2; i < argc; i++) {
    int r = cli_db_option(c, argc, argv, &i);
    if (r < 0) return -1;
    if (r > 0) continue;
    if ((strcmp(argv[i], "--rows") == 0 || strcmp(argv[i], "--seed") == 0) && i + 1 < argc) {
      char *end;
      unsigned long long v = strtoull(argv[i + 1], &end, 10);
      if (*end || !argv[i + 1][0]) {
        fprintf(stderr, "bucketstore demo: %s needs a number\n", argv[i]);
        return -1;
      }
      if (argv[i][2] == 'r')
        *rows = (size_t)v;
      else
        *seed = v;
      i++;
      continue;
    }
    fprintf(stderr, "bucketstore demo: unknown option %s\n", argv[i]);
    return -1;
  }
  if (*rows < 100 || *rows > 10000000) {
    fprintf(stderr, "bucketstore demo: --rows must be in [100, 10000000]\n");
    return -1;
  }
  return 0;
}

/* The steps after opening; everything it opens is closed by the caller (cli_demo). */
static int run(demo *d, client *a, client *b, cli_db *c, size_t n_rows) {
  const size_t rounds = 20, per_round = n_rows / 40;
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs;
  bs_error err = {0, ""};
  uint32_t id, before[N_BUCKETS], after[N_BUCKETS];
  uint64_t cp, ops_before = 0, ops_after = 0, problems = 0, snap_ops;
  double t0, t_ingest, t_down;
  size_t r;
  int rc, bk;

  if ((rc = bs_stream_create(&id, d->db, "demo", &so, &err)) ||
      (rc = bs_storage_open(&d->st, d->db, id, &err)))
    return step_failed("create stream", rc, &err);

  printf("bucketstore demo: %zu rows (%zu users, %zu lists, %zu todos) in %d buckets, on %s\n",
         n_rows, d->n[USERS], d->n[LISTS], d->n[TODOS], N_BUCKETS,
         c->memory ? "the memory backend" : cli_db_name(c));
  t0 = now();
  if ((rc = snapshot(d, &err)) != BS_OK) return step_failed("snapshot", rc, &err);
  snap_ops = d->last_op;
  t_ingest = now() - t0;
  printf("  snapshot: %llu ops in %.3f s (%.0f ops/s), checkpoint %llu\n",
         (unsigned long long)snap_ops, t_ingest, rate((double)snap_ops, t_ingest),
         (unsigned long long)d->last_op);

  /* client a downloads the snapshot, and later catches up incrementally */
  cp = d->last_op;
  if ((rc = client_sync(a, d->st, cp, &err)) != BS_OK) return step_failed("download", rc, &err);
  if ((rc = check_client(d, a, cp, 1, "client A, snapshot", NULL, &err)) != BS_OK)
    return step_failed("checksums", rc, &err);

  t0 = now();
  if ((rc = bs_writer_open(&d->w, d->st, NULL, &err)) != BS_OK)
    return step_failed("open writer", rc, &err);
  for (r = 0; r < rounds; r++)
    if ((rc = stream_round(d, per_round, &err)) != BS_OK)
      return step_failed("streaming round", rc, &err);
  t_ingest = now() - t0;
  printf("  streaming: %zu rounds of %zu changes, %llu ops in %.3f s (%.0f ops/s)\n", rounds,
         per_round, (unsigned long long)(d->last_op - snap_ops), t_ingest,
         rate((double)(d->last_op - snap_ops), t_ingest));
  cp = d->last_op;

  if ((rc = client_sync(a, d->st, cp, &err)) != BS_OK) return step_failed("download", rc, &err);
  if ((rc = check_client(d, a, cp, 0, "client A, incremental", NULL, &err)) != BS_OK)
    return step_failed("checksums", rc, &err);
  t0 = now();
  if ((rc = client_sync(b, d->st, cp, &err)) != BS_OK) return step_failed("download", rc, &err);
  t_down = now() - t0;
  ops_before = b->ops;
  printf("  download: %llu ops in %.3f s (%.0f ops/s)\n", (unsigned long long)b->ops, t_down,
         rate((double)b->ops, t_down));
  if ((rc = check_client(d, b, cp, 1, "client B, from zero", before, &err)) != BS_OK)
    return step_failed("checksums", rc, &err);
  if ((rc = check_parameters(d, cp, &err)) != BS_OK) return step_failed("parameter sets", rc, &err);
  printf("  %-34s %s\n", "parameter sets of sampled users",
         d->mismatches ? "checked" : "ok: match the model");

  /* compaction: at the current checkpoint nothing a client ends with may change */
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  memset(&cs, 0, sizeof cs);
  t0 = now();
  if ((rc = bs_compact(&cs, d->st, &co, &err)) != BS_OK) return step_failed("compact", rc, &err);
  ops_after = total_count(d, cp, &err, &rc);
  if (rc != BS_OK) return step_failed("checksums", rc, &err);
  printf("  compaction: %.3f s, %llu buckets, %llu ops moved, %llu cleared, %llu removed; "
         "ops %llu -> %llu\n",
         now() - t0, (unsigned long long)cs.buckets_compacted, (unsigned long long)cs.ops_moved,
         (unsigned long long)cs.ops_cleared, (unsigned long long)cs.ops_removed,
         (unsigned long long)ops_before, (unsigned long long)ops_after);
  client_free(b);
  if ((rc = client_sync(b, d->st, cp, &err)) != BS_OK) return step_failed("download", rc, &err);
  if ((rc = check_client(d, b, cp, 1, "client C, from zero, compacted", after, &err)))
    return step_failed("checksums", rc, &err);
  for (bk = 0; bk < N_BUCKETS; bk++)
    if (before[bk] != after[bk])
      mismatch(d, "bucket %d: checksum %u before compaction, %u after", bk, before[bk], after[bk]);

  /* one more round on top of the compacted history; client A catches up across it */
  if ((rc = stream_round(d, per_round, &err)) != BS_OK)
    return step_failed("streaming round", rc, &err);
  bs_writer_close(d->w);
  d->w = NULL;
  cp = d->last_op;
  if ((rc = client_sync(a, d->st, cp, &err)) != BS_OK) return step_failed("download", rc, &err);
  if ((rc = check_client(d, a, cp, 0, "client A, after one more round", NULL, &err)) != BS_OK)
    return step_failed("checksums", rc, &err);

  if ((rc = bs_db_verify(&problems, d->db, NULL, NULL, &err)) != BS_OK)
    return step_failed("verify", rc, &err);
  if (problems)
    mismatch(d, "verify found %llu problems", (unsigned long long)problems);
  else
    printf("  %-34s ok: no problems\n", "verify");

  printf("summary: %zu rows, %llu saves, %llu op ids, %d buckets, %llu checkpoints; "
         "%llu ops served from zero before compaction; checksums %s\n",
         n_rows, (unsigned long long)d->saves, (unsigned long long)d->last_op, N_BUCKETS,
         (unsigned long long)d->checkpoints, (unsigned long long)ops_before,
         d->mismatches ? "MISMATCHED" : "all verified");
  return d->mismatches ? 1 : 0;
}

int cli_demo(int argc, char **argv) {
  cli_db c;
  demo d;
  client *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  bs_error err = {0, ""};
  size_t n_rows = 20000;
  uint64_t seed = 1;
  int t, rc = 0;
  memset(&c, 0, sizeof c);
  memset(&d, 0, sizeof d);
  if (!a || !b) {
    fprintf(stderr, "bucketstore demo: out of memory\n");
    rc = 1;
    goto done;
  }
  if (demo_options(&c, argc, argv, &n_rows, &seed) != 0) {
    rc = 2;
    goto done;
  }
  d.rng = seed * 0x9E3779B97F4A7C15ull + 1;
  d.lsn = 0x100;
  d.n[USERS] = n_rows / 20;
  d.n[LISTS] = n_rows / 5;
  d.n[TODOS] = n_rows - d.n[USERS] - d.n[LISTS];
  for (t = 0; t < N_TABLES; t++)
    if (!(d.rows[t] = calloc(d.n[t], sizeof *d.rows[t]))) {
      fprintf(stderr, "bucketstore demo: out of memory\n");
      rc = 1;
      goto done;
    }
  if ((rc = cli_db_open(&c, &err)) != BS_OK) {
    rc = step_failed("open the database", rc, &err);
    goto done;
  }
  d.db = c.db;
  rc = run(&d, a, b, &c, n_rows);
done:
  bs_writer_close(d.w);
  bs_storage_close(d.st);
  cli_db_close(&c);
  for (t = 0; t < N_TABLES; t++) free(d.rows[t]);
  if (a) client_free(a);
  if (b) client_free(b);
  free(a);
  free(b);
  return rc;
}
