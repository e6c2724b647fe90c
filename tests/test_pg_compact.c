/* test_pg_compact: truncate and compaction on the PostgreSQL backend (pg_compact.c, pg_save.c's
 * truncate), judged against the LMDB backend: one seeded random workload runs on both
 * through the public API, call by call with the same arguments (saves with edge values in
 * buckets, ids, data and lookups; commits; truncate and drop; compactions of every kind with
 * small transactions), and after every step every reply and every read (bucket data at, above
 * and below the checkpoint, checksums, parameter sets, bucket listings, compaction statistics)
 * must be the same. Focused tests follow: truncate over several transactions, bounded
 * transactions and progress, cancel, torn reads. Runs on the server BS_TEST_PG_URL names (make
 * pg-test starts one); each test gets a schema of its own. Seeds: BS_SEED (first; default: its
 * block, ct_first_seed), BS_SEEDS (6 quick / 40 full), BS_STEPS (150 quick / 600 full); a failure
 * prints its seed: BS_SEED=n BS_SEEDS=1 reproduces it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "storage.h"
#include "util_contract.h"
#include "util_pg.h"

#ifdef BS_HAVE_PG
#include <pthread.h>

#include "pg_internal.h" /* the test seam: bs__pg_set_hook */

/* ---- A schema of the test's own (util_pg), an LMDB directory beside it ---- */

static char lmdb_dir[64];

static int setup(void **state) {
  snprintf(lmdb_dir, sizeof lmdb_dir, "/tmp/bs-pgc.XXXXXX");
  assert_non_null(mkdtemp(lmdb_dir));
  return pgt_setup(state);
}

/* rm -rf of the LMDB directory with what appended: "" the directory, "/\*" its files */
static void lmdb_dir_clear(const char *what) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'%s", lmdb_dir, what);
  if (system(cmd) != 0) fail_msg("%s failed", cmd);
}

static int teardown(void **state) {
  lmdb_dir_clear("");
  return pgt_teardown(state);
}

/* Both sides empty again: a new schema, an empty LMDB directory. */
static void fresh(pgt *t) {
  pgt_exec(t->admin, "DROP SCHEMA %s CASCADE; CREATE SCHEMA %s; SET search_path = %s", t->schema,
           t->schema, t->schema);
  lmdb_dir_clear("/*");
}

/* ---- Replies as text ---- */

typedef struct sb {
  char *p;
  size_t n, cap;
} sb;

static void sb_add(sb *b, const void *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    b->p = realloc(b->p, cap);
    assert_non_null(b->p);
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  assert_true(n >= 0 && (size_t)n < sizeof tmp);
  sb_add(b, tmp, (size_t)n);
}

/* absent as "-", present as its length and hex (so "" and absent differ) */
static void sb_val(sb *b, bs_val v) {
  if (!v.data) {
    sb_add(b, "-", 1);
    return;
  }
  sb_printf(b, "%zu:", v.size);
  for (size_t i = 0; i < v.size; i++) sb_printf(b, "%02x", ((const unsigned char *)v.data)[i]);
}

static void sb_free(sb *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- The two sides ---- */

enum { LM, PG, N_SIDES };
static const char *const side_name[N_SIDES] = {"lmdb", "postgresql"};

typedef struct pair {
  pgt *t;
  bs_db *db[N_SIDES];
  bs_storage *st[N_SIDES];
  bs_writer *w[N_SIDES];
  uint64_t seed;
  int step;
  char last[N_SIDES][512]; /* the last call's error messages */
} pair;

static void pair_open(pair *p, pgt *t) {
  char path[128];
  bs_error err = {0};
  uint32_t id[N_SIDES];
  memset(p, 0, sizeof *p);
  p->t = t;
  snprintf(path, sizeof path, "%s/db", lmdb_dir);
  if (bs_open(&p->db[LM], path, NULL, &err)) fail_msg("lmdb open: %s", err.msg);
  if (bs_open(&p->db[PG], t->url, NULL, &err)) fail_msg("pg open: %s", err.msg);
  for (int i = 0; i < N_SIDES; i++) {
    if (bs_stream_create(&id[i], p->db[i], "s", NULL, &err) ||
        bs_storage_open(&p->st[i], p->db[i], id[i], &err) ||
        bs_writer_open(&p->w[i], p->st[i], NULL, &err))
      fail_msg("%s: %s", side_name[i], err.msg);
  }
}

static void pair_close(pair *p) {
  for (int i = 0; i < N_SIDES; i++) {
    bs_writer_close(p->w[i]);
    bs_storage_close(p->st[i]);
    bs_close(p->db[i]);
  }
}

/* Both replies must be the same: status and text. */
static void same(pair *p, const char *what, const int rc[N_SIDES], const sb out[N_SIDES]) {
  if (rc[LM] == rc[PG] &&
      (!out || strcmp(out[LM].p ? out[LM].p : "", out[PG].p ? out[PG].p : "") == 0))
    return;
  fail_msg("seed %llu step %d, %s: lmdb %d (%s) '%.300s' / postgresql %d (%s) '%.300s'",
           (unsigned long long)p->seed, p->step, what, rc[LM], p->last[LM],
           out && out[LM].p ? out[LM].p : "", rc[PG], p->last[PG],
           out && out[PG].p ? out[PG].p : "");
}

/* ---- Randomness and edge values ---- */

static uint64_t rnd_state;
static uint64_t rnd(void) {
  rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
  return rnd_state >> 33;
}
static size_t pick(size_t n) {
  return (size_t)(rnd() % n);
}

static char long_bucket[BS_MAX_BUCKET_NAME], long_rid[BS_MAX_REPLICA_ID];
#define V(s) ((bs_val){(s), sizeof(s) - 1})
static bs_val str_val(const char *s) {
  return (bs_val){s, strlen(s)};
}
static bs_val buckets[6], rids[7], datas[6], objs[5];
static const char *const tables[] = {"t", "u", "\xc3\xa9"};

static void pools_init(void) {
  memset(long_bucket, 'b', sizeof long_bucket);
  memset(long_rid, 'r', sizeof long_rid);
  long_rid[0] = 0; /* a NUL byte in a replica id */
  buckets[0] = V("b");
  buckets[1] = V("by_user[\"u1\"]");
  buckets[2] = V("\xc3\xa9t\xc3\xa9");
  buckets[3] = V("z\0nul");
  buckets[4] = (bs_val){long_bucket, sizeof long_bucket};
  buckets[5] = V("x");
  rids[0] = V("");
  rids[1] = V("1");
  rids[2] = V("1.0");
  rids[3] = V("\xe2\x82\xac");
  rids[4] = (bs_val){long_rid, sizeof long_rid};
  rids[5] = V("r5");
  rids[6] = V("r6");
  datas[0] = V("");
  datas[1] = V("1");
  datas[2] = V("1.0");
  datas[3] = V("{\"n\":\"\xc3\xa9\"}");
  datas[4] = (bs_val){NULL, 0};
  datas[5] = V("{\"a\":2}");
  objs[0] = V("");
  objs[1] = V("1");
  objs[2] = V("1.0");
  objs[3] = V("o");
  objs[4] = V("\xf0\x9f\x98\x80");
}

#define N_KEYS 3
static unsigned char key_buf[N_KEYS][64];
static bs_val keys[N_KEYS];

static void keys_init(void) {
  static const char *const s[N_KEYS] = {"", "u1", "\xc3\xa9"};
  for (int i = 0; i < N_KEYS; i++) {
    bs_scalar v = {BS_SCALAR_STRING, 0, 0, {s[i], strlen(s[i])}};
    size_t n;
    assert_int_equal(bs_lookup_encode(key_buf[i], sizeof key_buf[i], &n, &v, 1, NULL), BS_OK);
    keys[i] = (bs_val){key_buf[i], n};
  }
}

/* ---- Reads ---- */

static int on_chunk(const bs_chunk *c, void *payload) {
  sb *o = payload;
  sb_val(o, c->bucket);
  sb_printf(o, " after %llu next %llu more %d target %llu:", (unsigned long long)c->after,
            (unsigned long long)c->next_after, c->has_more, (unsigned long long)c->target_op);
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    sb_printf(o, " [%llu %d %u %llu ", (unsigned long long)op->op_id, (int)op->type,
              (unsigned)op->checksum, (unsigned long long)op->target_op);
    sb_val(o, op->object_type);
    sb_add(o, " ", 1);
    sb_val(o, op->object_id);
    sb_add(o, " ", 1);
    sb_val(o, op->subkey);
    sb_add(o, " ", 1);
    sb_val(o, op->data);
    sb_add(o, "]", 1);
  }
  sb_add(o, "\n", 1);
  return 0;
}

/* Every bucket of the pool from 0 to C, in calls of limit ops. */
static int data_of(bs_storage *st, uint64_t C, size_t limit, sb *o, bs_error *err) {
  bs_bucket_request req[6];
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  int more = 1, rc = BS_OK;
  for (int i = 0; i < 6; i++) req[i] = (bs_bucket_request){buckets[i], 0};
  bo.limit = limit;
  bo.chunk_bytes = 300;
  while (more && !rc) {
    size_t mark = o->n;
    rc = bs_get_bucket_data(&more, st, C, req, 6, &bo, on_chunk, o, err);
    /* the next call resumes each bucket after its last op served */
    for (const char *s = o->p ? o->p + mark : NULL; !rc && s && *s;) {
      const char *nl = strchr(s, '\n');
      for (int i = 0; i < 6; i++) {
        sb tmp = {0};
        sb_val(&tmp, buckets[i]);
        if (strncmp(s, tmp.p, tmp.n) == 0 && s[tmp.n] == ' ') {
          unsigned long long a, nx;
          if (sscanf(s + tmp.n, " after %llu next %llu", &a, &nx) == 2) req[i].after = nx;
        }
        sb_free(&tmp);
      }
      s = nl ? nl + 1 : NULL;
    }
  }
  return rc;
}

static int checksums_of(bs_storage *st, uint64_t C, sb *o, bs_error *err) {
  bs_checksum cs[6];
  int rc = bs_get_checksums(cs, st, C, buckets, 6, err);
  for (int i = 0; !rc && i < 6; i++)
    sb_printf(o, "%u/%llu ", (unsigned)cs[i].checksum, (unsigned long long)cs[i].count);
  return rc;
}

static int on_params(const bs_val *params, void *payload) {
  sb_val(payload, *params);
  sb_add(payload, ",", 1);
  return 0;
}

static int params_of(bs_storage *st, uint64_t C, sb *o, bs_error *err) {
  int rc = BS_OK;
  for (int i = 0; i < N_KEYS && !rc; i++) {
    size_t mark = o->n;
    rc = bs_get_parameter_sets(st, C, &keys[i], 1, 100, on_params, o, err);
    /* the rows of one key in any order: sort them as text */
    if (!rc && o->n > mark) {
      char *s = strndup(o->p + mark, o->n - mark), *tok, *save = NULL, *parts[64];
      size_t n = 0;
      for (tok = strtok_r(s, ",", &save); tok && n < 64; tok = strtok_r(NULL, ",", &save))
        parts[n++] = tok;
      for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && strcmp(parts[b - 1], parts[b]) > 0; b--) {
          char *x = parts[b];
          parts[b] = parts[b - 1];
          parts[b - 1] = x;
        }
      o->n = mark;
      for (size_t a = 0; a < n; a++) sb_printf(o, "%s,", parts[a]);
      free(s);
    }
    sb_add(o, ";", 1);
  }
  return rc;
}

static int on_info(const bs_bucket_info *i, void *payload) {
  sb_val(payload, i->name);
  sb_printf(payload, " %u %llu %llu %llu\n", (unsigned)i->checksum, (unsigned long long)i->count,
            (unsigned long long)i->last_op, (unsigned long long)i->changes);
  return 0;
}

/* Every read of both sides at C must agree. */
static void read_at(pair *p, uint64_t C) {
  sb o[N_SIDES] = {{0}};
  int rc[N_SIDES];
  size_t limit = 1 + pick(7);
  char what[64];
  bs_error err[N_SIDES] = {{0}};
  for (int i = 0; i < N_SIDES; i++) rc[i] = data_of(p->st[i], C, limit, &o[i], &err[i]);
  snprintf(what, sizeof what, "bucket data at %llu", (unsigned long long)C);
  for (int i = 0; i < N_SIDES; i++) snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  same(p, what, rc, o);
  for (int i = 0; i < N_SIDES; i++) {
    sb_free(&o[i]);
    rc[i] = checksums_of(p->st[i], C, &o[i], &err[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  snprintf(what, sizeof what, "checksums at %llu", (unsigned long long)C);
  same(p, what, rc, o);
  for (int i = 0; i < N_SIDES; i++) {
    sb_free(&o[i]);
    rc[i] = params_of(p->st[i], C, &o[i], &err[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  snprintf(what, sizeof what, "parameter sets at %llu", (unsigned long long)C);
  same(p, what, rc, o);
  for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
}

static void on_problem(const char *problem, void *payload) {
  fprintf(stderr, "%s: %s\n", (const char *)payload, problem);
}

static void check(pair *p) {
  sb o[N_SIDES] = {{0}};
  int rc[N_SIDES];
  bs_checkpoint cp[N_SIDES];
  bs_error err[N_SIDES] = {{0}};
  for (int i = 0; i < N_SIDES; i++) {
    rc[i] = bs_get_checkpoint(&cp[i], p->st[i], &err[i]);
    if (!rc[i]) sb_printf(&o[i], "%llu", (unsigned long long)cp[i].op_id);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, "checkpoint", rc, o);
  for (int i = 0; i < N_SIDES; i++) {
    sb_free(&o[i]);
    rc[i] = bs_list_buckets(p->st[i], (bs_val){NULL, 0}, on_info, &o[i], &err[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, "list_buckets", rc, o);
  for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
  for (int i = 0; i < N_SIDES; i++) { /* both stores verify clean (running figures = ops) */
    uint64_t problems = 0;
    rc[i] = bs_db_verify(&problems, p->db[i], on_problem, (void *)side_name[i], &err[i]);
    if (rc[i] || problems)
      fail_msg("seed %llu step %d: %s verify: %d, %llu problem(s)", (unsigned long long)p->seed,
               p->step, side_name[i], rc[i], (unsigned long long)problems);
  }
  read_at(p, cp[LM].op_id);
  read_at(p, cp[LM].op_id + 1);
  if (cp[LM].op_id > 1) read_at(p, 1 + pick(cp[LM].op_id - 1));
}

/* ---- The workload ---- */

static void do_save(pair *p) {
  bs_row rows[3];
  bs_lookup lk[2];
  bs_val params[2] = {V("{\"g\":1}"), V("{\"g\":\"\xc3\xa9\"}")};
  bs_save s = BS_SAVE_INIT;
  int rc[N_SIDES];
  bs_error err[N_SIDES] = {{0}};
  size_t nr = pick(4), nl = pick(3);
  int tag = (int)pick(4);
  s.table = str_val(tables[pick(3)]);
  s.tag = tag == 3 ? BS_DELETE : tag == 2 ? BS_UPDATE : BS_INSERT;
  s.after_id = rids[pick(7)];
  if (pick(5) == 0) s.before_id = rids[pick(7)];
  for (size_t k = 0; k < nr && k < 3; k++)
    rows[k] = (bs_row){buckets[pick(6)], pick(4) ? V("t") : V(""), objs[pick(5)], datas[pick(6)]};
  for (size_t k = 0; k < nl; k++) lk[k] = (bs_lookup){keys[pick(N_KEYS)], params, 1 + pick(2)};
  s.rows = rows;
  s.n_rows = nr < 3 ? nr : 3;
  s.lookups = lk;
  s.n_lookups = nl;
  if (pick(3) == 0) s.stored_data = datas[pick(4)];
  for (int i = 0; i < N_SIDES; i++) {
    rc[i] = bs_writer_save(p->w[i], &s, &err[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, "save", rc, NULL);
}

static uint64_t lsn_seq;

static void do_commit(pair *p) {
  char lsn[32];
  bs_commit_result cr[N_SIDES];
  sb o[N_SIDES] = {{0}};
  int rc[N_SIDES];
  bs_error err[N_SIDES] = {{0}};
  snprintf(lsn, sizeof lsn, "%016llx", (unsigned long long)++lsn_seq);
  for (int i = 0; i < N_SIDES; i++) {
    rc[i] = bs_writer_commit(&cr[i], p->w[i], str_val(lsn), NULL, &err[i]);
    if (!rc[i])
      sb_printf(&o[i], "%d %llu", cr[i].checkpoint_created, (unsigned long long)cr[i].checkpoint);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, "commit", rc, o);
  for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
}

static void do_flush(pair *p) {
  uint64_t last[N_SIDES];
  sb o[N_SIDES] = {{0}};
  int rc[N_SIDES];
  bs_error err[N_SIDES] = {{0}};
  for (int i = 0; i < N_SIDES; i++) {
    rc[i] = bs_writer_flush(&last[i], p->w[i], &err[i]);
    if (!rc[i]) sb_printf(&o[i], "%llu", (unsigned long long)last[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, "flush", rc, o);
  for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
}

static void do_truncate(pair *p) {
  bs_val t = str_val(tables[pick(3)]);
  int drop = (int)pick(2), rc[N_SIDES];
  bs_error err[N_SIDES] = {{0}};
  for (int i = 0; i < N_SIDES; i++) {
    rc[i] = drop ? bs_writer_drop(p->w[i], t, &err[i]) : bs_writer_truncate(p->w[i], t, &err[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, drop ? "drop" : "truncate", rc, NULL);
}

static void stats_out(sb *o, const bs_compact_stats *s) {
  sb_printf(o, "buckets %llu moved %llu cleared %llu removed %llu params %llu reemitted %llu",
            (unsigned long long)s->buckets_compacted, (unsigned long long)s->ops_moved,
            (unsigned long long)s->ops_cleared, (unsigned long long)s->ops_removed,
            (unsigned long long)s->parameter_entries_removed, (unsigned long long)s->ops_reemitted);
}

/* A compaction of a random kind, with small transactions. */
static void do_compact(pair *p) {
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs[N_SIDES];
  bs_val sel[2];
  sb o[N_SIDES] = {{0}};
  int rc[N_SIDES], kind = (int)pick(6);
  uint64_t n[N_SIDES];
  bs_checkpoint cp;
  bs_error err[N_SIDES] = {{0}};
  assert_int_equal(bs_get_checkpoint(&cp, p->st[LM], NULL), BS_OK);
  co.max_ops_per_txn = pick(2) ? 2 + pick(5) : 0;
  co.min_age_ms = 0;
  co.compact_parameters = pick(2) == 0;
  if (pick(4) == 0 && cp.op_id > 1) co.max_op_id = 1 + pick(cp.op_id);
  if (pick(3) == 0) co.defragment_ratio = 0.5 + 0.1 * (double)pick(5);
  switch (kind) {
  case 0: /* named buckets */
    sel[0] = buckets[pick(6)];
    sel[1] = buckets[pick(6)];
    co.buckets = sel;
    co.n_buckets = 1 + pick(2);
    break;
  case 1: /* selection by the thresholds */
    co.min_bucket_changes = 1 + pick(6);
    co.min_change_ratio = 0.1 * (double)pick(6);
    break;
  case 2:
  case 3: /* incremental */
    co.incremental_only = 1;
    if (pick(2)) co.op_budget = 1 + pick(6);
    break;
  case 4: /* initial replication: refused once a checkpoint exists */
    uint64_t max_op = pick(3) ? 0 : co.max_op_id, min_changes = pick(3);
    for (int i = 0; i < N_SIDES; i++) {
      n[i] = 0;
      rc[i] = bs_compact_initial_replication(&n[i], p->st[i], max_op, min_changes, &err[i]);
      sb_printf(&o[i], "%llu", (unsigned long long)n[i]);
      snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
    }
    same(p, "compact_initial_replication", rc, o);
    for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
    return;
  default: /* everything due by the defaults */
    break;
  }
  for (int i = 0; i < N_SIDES; i++) {
    memset(&cs[i], 0, sizeof cs[i]);
    rc[i] = bs_compact(&cs[i], p->st[i], &co, &err[i]);
    stats_out(&o[i], &cs[i]);
    snprintf(p->last[i], sizeof p->last[i], "%s", err[i].msg);
  }
  same(p, co.incremental_only ? "incremental compaction" : "compaction", rc, o);
  for (int i = 0; i < N_SIDES; i++) sb_free(&o[i]);
}

/* DIFF_COMPACT 0: the workload stays clear of compaction (until pg_compact.c has every kind) */
#ifndef DIFF_COMPACT
#define DIFF_COMPACT 1
#endif

static unsigned env_u(const char *name, unsigned dflt) {
  const char *v = getenv(name);
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

static int quick(void) {
  const char *v = getenv("BS_TEST_QUICK");
  return v && *v && strcmp(v, "0") != 0;
}

static void run_seed(pgt *t, uint64_t seed, unsigned steps) {
  pair p;
  pair_open(&p, t);
  p.seed = seed;
  rnd_state = ct_seed(seed, 1).s;
  lsn_seq = 0;
  for (p.step = 0; p.step < (int)steps; p.step++) {
    size_t k = pick(100);
    if (k < 55) {
      do_save(&p);
    } else if (k < 70) {
      do_commit(&p);
      check(&p);
    } else if (k < 75) {
      do_flush(&p);
    } else if (k < 79) {
      do_truncate(&p);
      check(&p);
    } else if (k < 93 && DIFF_COMPACT) {
      do_compact(&p);
      check(&p);
    } else if (k == 99) {
      bs_writer_snapshot_done(p.w[LM], str_val("0000000000000000"), NULL);
      bs_writer_snapshot_done(p.w[PG], str_val("0000000000000000"), NULL);
    }
  }
  do_commit(&p);
  check(&p);
  pair_close(&p);
}

/* A schema per seed: each run starts from an empty database. */
static void t_diff(void **state) {
  pgt *t = *state;
  unsigned first = (unsigned)ct_first_seed("pg_compact", ct_postgres());
  unsigned n = env_u("BS_SEEDS", quick() ? 6 : 40), steps = env_u("BS_STEPS", quick() ? 150 : 600);
  for (unsigned s = first; s < first + n; s++) {
    ct_seed_log("pg_compact", "lmdb/postgres", s);
    run_seed(t, s, steps);
    fresh(t);
  }
}

/* Truncate over several transactions (2500 records, 1000 per transaction), a soft-deleted record
 * among them, then drop: the same ops, op ids and tombstones as LMDB. */
static void t_truncate_many(void **state) {
  pair p;
  bs_error err = {0};
  pair_open(&p, *state);
  rnd_state = 7;
  for (int i = 0; i < N_SIDES; i++) {
    bs_writer_snapshot_done(p.w[i], str_val("0000000000000000"), &err);
    for (int k = 0; k < 2500; k++) {
      char rid[16], oid[16];
      bs_row rows[2] = {{buckets[k % 6], V("t"), {oid, 0}, datas[k % 4]},
                        {buckets[(k + 1) % 6], V("t"), {oid, 0}, V("1")}};
      bs_lookup lk = {keys[k % N_KEYS], &datas[1], 1};
      bs_save s = BS_SAVE_INIT;
      snprintf(rid, sizeof rid, "r%05d", k);
      rows[0].object_id.size = rows[1].object_id.size = (size_t)snprintf(oid, sizeof oid, "%d", k);
      s.table = V("t");
      s.after_id = str_val(rid);
      s.rows = rows;
      s.n_rows = 1 + (size_t)(k % 2);
      s.lookups = &lk;
      s.n_lookups = k % 3 == 0;
      assert_int_equal(bs_writer_save(p.w[i], &s, &err), BS_OK);
    }
    assert_int_equal(bs_writer_commit(NULL, p.w[i], V("0000000000000001"), NULL, &err), BS_OK);
    {
      bs_save d = BS_SAVE_INIT; /* a soft delete would need a snapshot; a plain delete */
      d.table = V("t");
      d.tag = BS_DELETE;
      d.before_id = V("r00007");
      assert_int_equal(bs_writer_save(p.w[i], &d, &err), BS_OK);
    }
  }
  p.seed = 7;
  do_flush(&p);
  for (int i = 0; i < N_SIDES; i++)
    if (bs_writer_truncate(p.w[i], V("t"), &err)) fail_msg("%s: %s", side_name[i], err.msg);
  do_commit(&p);
  check(&p);
  /* the records are gone: an UPDATE emits PUTs only, nothing is removed twice */
  do_save(&p);
  for (int i = 0; i < N_SIDES; i++)
    if (bs_writer_drop(p.w[i], V("t"), &err)) fail_msg("%s: %s", side_name[i], err.msg);
  do_commit(&p);
  check(&p);
  assert_int_equal(pgt_int(p.t->admin, "SELECT count(*) FROM bs_tables"), 0);
  assert_int_equal(pgt_int(p.t->admin, "SELECT count(*) FROM bs_source"), 0);
  pair_close(&p);
}

/* ---- Focused tests ---- */

/* A bucket of n ops on both sides: rows r0..r(rows-1) inserted, then updates of random rows
 * (every fourth a delete and re-insert), committed every 50 saves. */
static void fill(pair *p, int n, int rows_n) {
  bs_error err = {0};
  for (int i = 0; i < N_SIDES; i++)
    assert_int_equal(bs_writer_snapshot_done(p->w[i], V("0000000000000000"), &err), BS_OK);
  rnd_state = 11;
  for (int k = 0; k < n; k++) {
    char rid[16], data[32];
    int row = k < rows_n ? k : (int)pick((size_t)rows_n);
    bs_row r = {buckets[k % 3 == 0 ? 1 : 0], V("t"), {rid, 0}, {data, 0}};
    bs_save s = BS_SAVE_INIT;
    r.object_id.size = (size_t)snprintf(rid, sizeof rid, "r%d", row);
    r.data.size = (size_t)snprintf(data, sizeof data, "{\"v\":%d}", k);
    s.table = V("t");
    s.tag = k < rows_n ? BS_INSERT : k % 4 == 0 ? BS_DELETE : BS_UPDATE;
    s.after_id = s.before_id = r.object_id;
    s.rows = &r;
    s.n_rows = 1;
    for (int i = 0; i < N_SIDES; i++) assert_int_equal(bs_writer_save(p->w[i], &s, &err), BS_OK);
    if (k % 50 == 49) do_commit(p);
  }
  do_commit(p);
}

typedef struct prog {
  int calls, cancel_at;
  uint64_t last_moved, last_cleared;
  int monotonic;
} prog;

static int on_progress(const bs_compact_stats *s, void *payload) {
  prog *g = payload;
  g->calls++;
  if (s->ops_moved < g->last_moved || s->ops_cleared < g->last_cleared) g->monotonic = 0;
  g->last_moved = s->ops_moved;
  g->last_cleared = s->ops_cleared;
  return g->cancel_at && g->calls == g->cancel_at;
}

/* Bounded transactions: with max_ops_per_txn 3, progress comes after every transaction (at least
 * one per 3 ops changed, figures never going back), and a compaction cancelled by it at every
 * possible point leaves a valid store that a second compaction takes to the end LMDB reaches in
 * one go; reads agree with LMDB's after each (checksums at the checkpoint never change). */
static void t_bounded_and_cancel(void **state) {
  pgt *t = *state;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats lm, pg;
  bs_error err = {0};
  prog g = {0, 0, 0, 0, 1};
  pair p;
  int total;
  pair_open(&p, t);
  fill(&p, 300, 60);
  check(&p);
  co.max_ops_per_txn = 3;
  co.progress = on_progress;
  co.progress_payload = &g;
  assert_int_equal(bs_compact(&pg, p.st[PG], &co, &err), BS_OK);
  total = g.calls;
  assert_true(g.monotonic);
  assert_true((uint64_t)total * 3 >= pg.ops_moved && (uint64_t)total * 3 >= pg.ops_cleared);
  assert_true(pg.ops_moved > 0 && pg.ops_cleared > 0);
  co.progress = NULL;
  assert_int_equal(bs_compact(&lm, p.st[LM], &co, &err), BS_OK);
  assert_int_equal(lm.ops_moved, pg.ops_moved);
  assert_int_equal(lm.ops_cleared, pg.ops_cleared);
  check(&p);
  pair_close(&p);
  /* cancelled at the k-th transaction, then completed */
  for (int k = 1; k <= total; k += 1 + total / 6) {
    fresh(t);
    pair_open(&p, t);
    p.seed = (uint64_t)k;
    fill(&p, 300, 60);
    memset(&g, 0, sizeof g);
    g.cancel_at = k;
    co.progress = on_progress;
    assert_int_equal(bs_compact(&pg, p.st[PG], &co, &err), BS_ECANCELED);
    assert_int_equal(g.calls, k);
    co.progress = NULL;
    assert_int_equal(bs_compact(&pg, p.st[PG], &co, &err), BS_OK);
    assert_int_equal(bs_compact(&lm, p.st[LM], &co, &err), BS_OK);
    check(&p);
    pair_close(&p);
  }
}

/* Compaction merges the small chunks it cuts with the small ones beside them: a bucket written
 * two ops a flush (a chunk a flush), 39 of its 40 rows updated over and over, is compacted (every
 * superseded PUT becomes a MOVE) into far fewer chunks, in one transaction (its cut chunks read a
 * group at a time: a run continues across groups) and in transactions of 7 ops (a run continues
 * over the small chunk the previous transaction left); the same moves as LMDB, reads agree,
 * verify is clean. */
static void t_merges_small_chunks(void **state) {
  pgt *t = *state;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats lm, pg;
  bs_error err = {0};
  pair p;
  for (int pass = 0; pass < 2; pass++) {
    long long before, after;
    if (pass) fresh(t);
    pair_open(&p, t);
    rnd_state = 5;
    for (int i = 0; i < N_SIDES; i++)
      assert_int_equal(bs_writer_snapshot_done(p.w[i], V("0000000000000000"), &err), BS_OK);
    for (int k = 0; k < 400; k++) {
      char rid[16], data[32];
      bs_row r = {V("b"), V("t"), {rid, 0}, {data, 0}};
      bs_save s = BS_SAVE_INIT;
      /* r0 is never updated: its PUT, the bucket's first op, keeps compaction from folding the
       * MOVEs before it into a CLEAR (which would delete their chunks, not merge them) */
      r.object_id.size = (size_t)snprintf(rid, sizeof rid, "r%d", k < 40 ? k : 1 + k % 39);
      r.data.size = (size_t)snprintf(data, sizeof data, "{\"v\":%d}", k);
      s.table = V("t");
      s.tag = k < 40 ? BS_INSERT : BS_UPDATE;
      s.after_id = s.before_id = r.object_id;
      s.rows = &r;
      s.n_rows = 1;
      for (int i = 0; i < N_SIDES; i++) assert_int_equal(bs_writer_save(p.w[i], &s, &err), BS_OK);
      if (k % 2 == 1) do_flush(&p);
    }
    do_commit(&p);
    check(&p);
    before = pgt_int(t->admin, "SELECT count(*) FROM bs_chunks");
    assert_true(before >= 200);
    co.max_ops_per_txn = pass ? 7 : 0;
    assert_int_equal(bs_compact(&pg, p.st[PG], &co, &err), BS_OK);
    assert_int_equal(bs_compact(&lm, p.st[LM], &co, &err), BS_OK);
    assert_int_equal(pg.ops_moved, 360);
    assert_int_equal(lm.ops_moved, pg.ops_moved);
    check(&p);
    after = pgt_int(t->admin, "SELECT count(*) FROM bs_chunks");
    printf("max_ops_per_txn %zu: %lld chunks before compaction, %lld after\n", co.max_ops_per_txn,
           before, after);
    if (after * 8 > before)
      fail_msg("max_ops_per_txn %zu: %lld chunks after compaction, %lld before", co.max_ops_per_txn,
               after, before);
    pair_close(&p);
  }
}

/* Initial replication deletes superseded ops outright and recomputes the running checksum and
 * count as LMDB does; a second run does nothing; a checkpoint ends it (BS_ESTATE). */
static void t_initial_replication(void **state) {
  pair p;
  bs_error err = {0};
  uint64_t n[N_SIDES];
  pair_open(&p, *state);
  p.seed = 3;
  rnd_state = 3;
  for (int k = 0; k < 200; k++) do_save(&p);
  do_flush(&p);
  for (int i = 0; i < N_SIDES; i++)
    assert_int_equal(bs_compact_initial_replication(&n[i], p.st[i], 0, 0, &err), BS_OK);
  assert_int_equal(n[LM], n[PG]);
  assert_true(n[PG] > 0);
  for (int i = 0; i < N_SIDES; i++)
    assert_int_equal(bs_writer_snapshot_done(p.w[i], V("0000000000000000"), &err), BS_OK);
  do_commit(&p);
  check(&p);
  for (int i = 0; i < N_SIDES; i++)
    assert_int_equal(bs_compact_initial_replication(&n[i], p.st[i], 0, 0, &err), BS_ESTATE);
  pair_close(&p);
}

/* ---- bs_changes pruned below the aged checkpoint ---- */

typedef struct seen_changes {
  int inv_b, inv_p, user;
  size_t nb;
  char first[16];
} seen_changes;

static int on_changes(const bs_checkpoint_changes *c, void *payload) {
  seen_changes *s = payload;
  s->inv_b = c->invalidate_data_buckets;
  s->inv_p = c->invalidate_parameter_buckets;
  s->nb = c->n_updated_buckets;
  if (s->nb)
    snprintf(s->first, sizeof s->first, "%.*s", (int)c->updated_buckets[0].size,
             (const char *)c->updated_buckets[0].data);
  for (size_t i = 0; i < c->n_updated_write_checkpoint_users; i++)
    s->user |= c->updated_write_checkpoint_users[i].size == 1;
  return 0;
}

static seen_changes changes(bs_storage *st, uint64_t from, uint64_t to) {
  bs_error err = {0};
  seen_changes s;
  memset(&s, 0, sizeof s);
  assert_int_equal(bs_get_checkpoint_changes(st, from, to, on_changes, &s, &err), BS_OK);
  return s;
}

static uint64_t commit_in(bs_writer *w, const char *bucket, int n) {
  bs_error err = {0};
  bs_row row = {V(""), V("t"), V(""), V("{}")};
  bs_save sv = BS_SAVE_INIT;
  bs_commit_result r;
  char lsn[16];
  row.bucket = (bs_val){bucket, strlen(bucket)};
  row.object_id = (bs_val){bucket, strlen(bucket)};
  sv.table = V("t");
  sv.after_id = row.object_id;
  sv.rows = &row;
  sv.n_rows = 1;
  snprintf(lsn, sizeof lsn, "%04d", n);
  assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
  assert_int_equal(bs_writer_commit(&r, w, (bs_val){lsn, 4}, NULL, &err), BS_OK);
  assert_true(r.checkpoint_created);
  return r.checkpoint;
}

/* A compaction deletes the change records below the aged checkpoint (min_age_ms 0: the newest)
 * and raises the fence to it: a reader from below it is told to invalidate, the write-checkpoint
 * user of a pruned checkpoint is still named (its record stays, emptied), and a reader from the
 * aged checkpoint on gets exact lists. */
static void t_changes_pruned(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0);
  bs_storage *st;
  bs_writer *w;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_managed_request mr = {V("u"), NULL, 0, 0, 0, 0};
  uint64_t cp[6], id;
  seen_changes s;
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, V("0"), &err), BS_OK);
  for (int i = 0; i < 5; i++) {
    char b[16];
    snprintf(b, sizeof b, "b%d", i);
    if (i == 2)
      assert_int_equal(bs_create_managed_write_checkpoints(&id, NULL, st, &mr, 1, &err), BS_OK);
    cp[i] = commit_in(w, b, i + 1);
  }
  s = changes(st, cp[0], cp[4]);
  assert_false(s.inv_b);
  assert_int_equal(s.nb, 4);
  assert_true(s.user);
  assert_true(pgt_int(t->admin, "SELECT count(*) FROM bs_changes") >= 5);
  co.incremental_only = 1;
  co.min_age_ms = 0;
  co.max_ops_per_txn = 2; /* several transactions */
  assert_int_equal(bs_compact(NULL, st, &co, &err), BS_OK);
  assert_int_equal(pgt_int(t->admin, "SELECT changes_fence FROM bs_streams"), (long long)cp[4]);
  assert_int_equal(pgt_int(t->admin,
                           "SELECT count(*) FROM bs_changes WHERE op_id < %llu AND"
                           " (cardinality(users) = 0 OR cardinality(buckets) > 0)",
                           (unsigned long long)cp[4]),
                   0);
  s = changes(st, cp[0], cp[4]);
  assert_true(s.inv_b && s.inv_p && s.user);
  s = changes(st, cp[4], cp[4]);
  assert_false(s.inv_b || s.inv_p);
  cp[5] = commit_in(w, "z", 6);
  s = changes(st, cp[4], cp[5]);
  assert_false(s.inv_b || s.inv_p);
  assert_int_equal(s.nb, 1);
  assert_string_equal(s.first, "z");
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* ---- A read that a compaction divides ---- */

/* A client of one bucket, reducing the chunks it is handed as the sync protocol does: rows (bit
 * k: object id "k") and checksum, a CLEAR standing for everything before it. After chunk
 * compact_at, another handle (another process) compacts the bucket, between two pages of the
 * read (bs_get_bucket_data runs each page as a statement of its own). */
typedef struct client {
  bs_storage *other;
  bs_val bucket;
  int compact_at, chunks, clear_at; /* clear_at: the chunk that brought a CLEAR, 0 none */
  unsigned rows;
  uint32_t checksum;
  uint64_t target;
} client;

static int reduce(const bs_chunk *ch, void *payload) {
  client *c = payload;
  bs_error err = {0};
  c->chunks++;
  for (size_t i = 0; i < ch->n_ops; i++) {
    const bs_op *op = &ch->ops[i];
    unsigned bit = op->object_id.size ? 1u << (((const char *)op->object_id.data)[0] - '0') : 0;
    if (op->type == BS_OP_CLEAR) {
      c->rows = 0;
      c->checksum = op->checksum;
      c->clear_at = c->chunks;
      continue;
    }
    c->checksum += op->checksum;
    if (op->type == BS_OP_PUT) c->rows |= bit;
    if (op->type == BS_OP_REMOVE) c->rows &= ~bit;
  }
  if (ch->target_op > c->target) c->target = ch->target_op;
  if (c->chunks == c->compact_at) {
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT; /* horizon: the current checkpoint */
    co.buckets = &c->bucket;
    co.n_buckets = 1;
    assert_int_equal(bs_compact(NULL, c->other, &co, &err), BS_OK);
  }
  return 0;
}

/* Rows "1".."5" of 1 MiB in buckets b and c (checkpoint C1: more than one page of ops, 4 MiB),
 * then removed, and row "6" saved (C2). Reading b at C2, a compaction after the third chunk
 * (during the first page) folds b's ops up to the last REMOVE into a CLEAR: the second page
 * brings that CLEAR (the ops handed out before it included), and the client ends with the rows
 * and checksum at C2. Reading c at C1, the same compaction (horizon C2) folds c's ops at or below
 * C1 into a CLEAR above it: the read fails with BS_EINVALIDATED instead of ending short, and a
 * read at C2 is exact. */
static void t_read_across_compaction(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0), *db2 = pgt_open(t->url, 0);
  bs_storage *st, *st2;
  bs_writer *w;
  bs_commit_result cr;
  char *big = malloc(1u << 20);
  uint64_t c1 = 0, c2 = 0;
  bs_checksum want[2];
  bs_val names[2] = {V("b"), V("c")};
  client cl;
  int more;
  assert_non_null(big);
  memset(big, 'a', 1u << 20);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 1, &err), BS_OK);
  assert_int_equal(bs_storage_open(&st2, db2, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, V("0"), &err), BS_OK);
  for (int pass = 0; pass < 2; pass++) {
    for (char id = '1'; id <= (pass ? '6' : '5'); id++) {
      bs_row rows[2] = {{V("b"), V("t"), {&id, 1}, {big, pass ? 2 : 1u << 20}},
                        {V("c"), V("t"), {&id, 1}, {big, pass ? 2 : 1u << 20}}};
      bs_save sv = BS_SAVE_INIT;
      sv.table = V("t");
      sv.tag = pass && id < '6' ? BS_DELETE : BS_INSERT;
      sv.before_id = sv.after_id = (bs_val){&id, 1};
      sv.rows = sv.tag == BS_DELETE ? NULL : rows;
      sv.n_rows = sv.tag == BS_DELETE ? 0 : 2;
      assert_int_equal(bs_writer_save(w, &sv, &err), BS_OK);
    }
    assert_int_equal(bs_writer_commit(&cr, w, pass ? V("0002") : V("0001"), NULL, &err), BS_OK);
    *(pass ? &c2 : &c1) = cr.checkpoint;
  }
  bs_writer_close(w);
  assert_int_equal(bs_get_checksums(want, st, c2, names, 2, &err), BS_OK);
  memset(&cl, 0, sizeof cl);
  cl.other = st2;
  cl.bucket = names[0];
  cl.compact_at = 3;
  assert_int_equal(bs_get_bucket_data(&more, st, c2, &(bs_bucket_request){names[0], 0}, 1, NULL,
                                      reduce, &cl, &err),
                   BS_OK);
  assert_true(cl.clear_at > cl.compact_at); /* the CLEAR came in a later page */
  assert_int_equal(cl.rows, 1u << 6);
  assert_int_equal(cl.checksum, want[0].checksum);
  assert_true(cl.target <= c2);
  memset(&cl, 0, sizeof cl);
  cl.other = st2;
  cl.bucket = names[1];
  cl.compact_at = 2;
  assert_int_equal(bs_get_bucket_data(&more, st, c1, &(bs_bucket_request){names[1], 0}, 1, NULL,
                                      reduce, &cl, &err),
                   BS_EINVALIDATED);
  assert_true(cl.chunks >= cl.compact_at);
  memset(&cl, 0, sizeof cl);
  cl.bucket = names[1];
  assert_int_equal(bs_get_bucket_data(&more, st, c2, &(bs_bucket_request){names[1], 0}, 1, NULL,
                                      reduce, &cl, &err),
                   BS_OK);
  assert_int_equal(cl.rows, 1u << 6);
  assert_int_equal(cl.checksum, want[1].checksum);
  free(big);
  bs_storage_close(st2);
  bs_storage_close(st);
  bs_close(db2);
  bs_close(db);
}

/* ---- A flush beside a compaction's transaction ---- */

/* The writer's flush (pg_save.c) locks the stream row FOR UPDATE, then updates its buckets'
 * rows. At the first change a compaction's transaction applies to its bucket (the seam
 * "compact.apply"), the test's connection becomes such a flush: it locks the stream row and
 * sends the update of the bucket's row without waiting for it. */
typedef struct flusher {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  PGconn *c; /* the compaction's thread's until done */
  long long bucket;
  int calls, locked, sent, done;
} flusher;

static void flush_at_apply(const char *point, PGconn *c, void *payload) {
  flusher *f = payload;
  char sql[128];
  PGresult *r;
  (void)c;
  if (strcmp(point, "compact.apply") || ++f->calls != 1) return;
  r = PQexec(f->c, "BEGIN; SELECT 1 FROM bs_streams WHERE id = 1 FOR UPDATE");
  f->locked = PQresultStatus(r) == PGRES_TUPLES_OK;
  PQclear(r);
  snprintf(sql, sizeof sql, "UPDATE bs_buckets SET generation = generation + 1 WHERE id = %lld",
           f->bucket);
  f->sent = f->locked && PQsendQuery(f->c, sql);
  pthread_mutex_lock(&f->mu);
  f->done = 1;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

typedef struct compactor {
  bs_storage *st;
  bs_compact_stats stats;
  bs_error err;
  int rc;
} compactor;

static void *compact_main(void *x) {
  compactor *k = x;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_val b = V("b");
  co.buckets = &b;
  co.n_buckets = 1;
  k->rc = bs_compact(&k->stats, k->st, &co, &k->err);
  return NULL;
}

/* A compaction beside a flush: the bucket's fold and mark in one transaction while a flush has
 * locked the stream row and waits for the bucket's row. The compaction must take no lock the
 * flush holds once it holds the bucket's row (PostgreSQL's foreign-key check of a row updated
 * twice in one transaction locks the stream row: a deadlock, 40P01, for one of the two). Both
 * finish, in either order of the two updates of the bucket's row. alarm() only turns a hang
 * into a failure. */
static void t_beside_flush(void **state) {
  pgt *t = *state;
  bs_error err = {0};
  bs_db *db = pgt_open(t->url, 0);
  bs_writer *w;
  compactor k;
  flusher f;
  pthread_t th;
  PGresult *r;
  int updated = 0;
  memset(&k, 0, sizeof k);
  memset(&f, 0, sizeof f);
  pthread_mutex_init(&f.mu, NULL);
  pthread_cond_init(&f.cv, NULL);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, &err), BS_OK);
  assert_int_equal(bs_storage_open(&k.st, db, 1, &err), BS_OK);
  assert_int_equal(bs_writer_open(&w, k.st, NULL, &err), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, V("0"), &err), BS_OK);
  for (int i = 1; i <= 3; i++) commit_in(w, "b", i); /* ops 1 and 2 superseded: a fold */
  f.c = t->admin;
  f.bucket = pgt_int(t->admin, "SELECT id FROM bs_buckets WHERE name = 'b'");
  bs__pg_set_hook(db, flush_at_apply, &f);
  alarm(120);
  assert_int_equal(pthread_create(&th, NULL, compact_main, &k), 0);
  pthread_mutex_lock(&f.mu);
  while (!f.done) pthread_cond_wait(&f.cv, &f.mu);
  pthread_mutex_unlock(&f.mu);
  /* the flush's update ends when it got the row, and the compaction only when it may go on */
  while ((r = PQgetResult(t->admin)) != NULL) {
    updated |= PQresultStatus(r) == PGRES_COMMAND_OK;
    if (PQresultStatus(r) == PGRES_FATAL_ERROR) print_message("%s", PQresultErrorMessage(r));
    PQclear(r);
  }
  r = PQexec(t->admin, updated ? "COMMIT" : "ROLLBACK");
  PQclear(r);
  assert_int_equal(pthread_join(th, NULL), 0);
  alarm(0);
  bs__pg_set_hook(db, NULL, NULL);
  pthread_mutex_destroy(&f.mu);
  pthread_cond_destroy(&f.cv);
  if (k.rc) print_message("compact: %s\n", k.err.msg);
  assert_int_equal(f.calls >= 1 && f.locked && f.sent, 1);
  assert_int_equal(k.rc, BS_OK);
  assert_true(updated);
  assert_int_equal(k.stats.ops_cleared, 2);
  assert_int_equal(pgt_int(t->admin, "SELECT count FROM bs_buckets WHERE id = %lld", f.bucket), 2);
  bs_writer_close(w);
  bs_storage_close(k.st);
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_truncate_many, setup, teardown),
      cmocka_unit_test_setup_teardown(t_bounded_and_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(t_merges_small_chunks, setup, teardown),
      cmocka_unit_test_setup_teardown(t_initial_replication, setup, teardown),
      cmocka_unit_test_setup_teardown(t_changes_pruned, setup, teardown),
      cmocka_unit_test_setup_teardown(t_read_across_compaction, setup, teardown),
      cmocka_unit_test_setup_teardown(t_beside_flush, setup, teardown),
      cmocka_unit_test_setup_teardown(t_diff, setup, teardown),
  };
  if (pgt_skipped("test_pg_compact")) return 0;
  pools_init();
  keys_init();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  return !pgt_skipped("test_pg_compact");
}
#endif
