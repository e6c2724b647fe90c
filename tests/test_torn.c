/*
 * test_torn.c: torn reads (contract.md 5.5) constructed on purpose, on every backend ("memory",
 * "lmdb", "lmdb+passthrough", and "postgres" with BS_TEST_PG_URL; BS_BACKEND=name runs one).
 *
 * Compaction with horizon H can fold ops <= C into a leading CLEAR whose id is > C. Each bucket
 * remembers the span [clear_start, clear_op] of its leading CLEAR; a checksum or data read at C
 * with clear_start <= C < clear_op must fail with BS_EINVALIDATED, every other C must give the
 * exact answer (checksum = sum of the original history at C, count = stored ops <= C, data that
 * reduces to the model), and a client told "invalidated" or "target_op > C" must converge by
 * reading a newer checkpoint (contract.md 9, property 3).
 *
 * How the expectation is computed: the model (util_model.h) keeps the original history of the
 * bucket; `sim_*` replays contract.md 6 (MOVE pass, then the leading run of REMOVE/MOVE/CLEAR at
 * or below H folded into one CLEAR when it has 2 or more ops) on that history for every
 * compaction done so far, independently of the library. The expected stored ops, counts, chunk
 * target_op and the torn span at every C follow from it. clear_start is the bucket's first op:
 * a leading run always starts there, and a later CLEAR that folds an earlier one keeps its start.
 *
 * `after`, torn C: contract.md 5.5 defines the error by C only ("a checksum or data read at C with
 * clear_start <= C < clear_op returns BS_EINVALIDATED"); it makes no exception for a request
 * whose `after` >= C, although its range (after, C] is empty. So such a read fails too, and a
 * read at an untorn C with after >= C succeeds with no chunk (contract.md 5.2).
 *
 * The checksum cache: every check pass first reads checksums at every C through the cached
 * storage, so after the next compaction the cache holds entries from the old generation at
 * every C, torn or not; those must never be served (contract.md 5.3 generation rule). On the file
 * backends a second handle with its own cache is checked the same way (a compaction "in another
 * process").
 *
 * Seeds: each backend's block (ct_first_seed), BS_SEED replays one; BS_TEST_QUICK=1 keeps the
 * random part to well under a second (100 scenarios, 20 on postgres; without it 400 and 80). A failing scenario prints its seed and the command that
 * replays it from the teardown.
 */
#include "util_contract.h"
#include "util_model.h"

#include <stdlib.h>
#include <string.h>

#define BUCKET "b"
#define NOISE  "o"

/* ---- Simulated stored state of bucket BUCKET (contract.md 6 replayed on the model's history) - */
typedef struct sim_op {
  uint64_t id;
  bs_op_type type;
  uint32_t checksum;
  uint64_t target;
  long h; /* index in the model's history for PUT/REMOVE, -1 for MOVE/CLEAR */
} sim_op;

typedef struct tt {
  ct_env e;
  bs_storage *nc; /* the same stream without the checksum cache */
  bs_db *db2;     /* file backends: a second handle with its own cache */
  bs_storage *st2;
  md_stream m;
  int has_model;
  uint64_t cp; /* last checkpoint */
  unsigned lsn;
  uint64_t horizons[8];
  size_t n_h;
  sim_op *sim;
  size_t n_sim;
  /* failure context, printed by the teardown */
  uint64_t seed;
  int scenario;
  int done;
  char where[160];
  /* statistics (printed with BS_TORN_VERBOSE) */
  unsigned long n_torn_cks, n_torn_data, n_target_reports, n_clears, n_extended, n_ok_reads;
} tt;

static int setup(void **state) {
  const ct_backend *be = *state;
  tt *t = calloc(1, sizeof *t);
  int rc;
  if (!t) return -1;
  rc = ct_env_open(&t->e, be, 0); /* 0 = the default cache (100,000 entries) */
  if (rc) {
    fprintf(stderr, "setup on %s failed: %s (%s)\n", be->name, bs_strerror(rc), ct_err.msg);
    ct_env_close(&t->e);
    free(t);
    return -1;
  }
  if (be->persistent && ct_open_second(&t->e, 0, &t->db2) != BS_OK) {
    fprintf(stderr, "second handle on %s failed: %s\n", be->name, ct_err.msg);
    ct_env_close(&t->e);
    free(t);
    return -1;
  }
  *state = t;
  return 0;
}

static void close_views(tt *t) {
  if (t->nc) bs_storage_close(t->nc);
  if (t->st2) bs_storage_close(t->st2);
  t->nc = t->st2 = NULL;
}

static int teardown(void **state) {
  tt *t = *state;
  if (!t->done && t->scenario < 0)
    fprintf(stderr, "test_torn failed on %s (deterministic case) at %s\n", t->e.be->name, t->where);
  else if (!t->done)
    fprintf(stderr,
            "test_torn failed on %s: scenario %d of seed %llu, at %s (reproduce: BS_SEED=%llu "
            "BS_CONTRACT_ONLY=%s/t_random_histories build/tests/test_torn)\n",
            t->e.be->name, t->scenario, (unsigned long long)t->seed, t->where,
            (unsigned long long)t->seed, t->e.be->name);
  if (getenv("BS_TORN_VERBOSE"))
    fprintf(stderr,
            "%s: torn checksums %lu, torn data reads %lu, target_op > C reports %lu, "
            "CLEARs made %lu (of which extended %lu), converging reads %lu\n",
            t->e.be->name, t->n_torn_cks, t->n_torn_data, t->n_target_reports, t->n_clears,
            t->n_extended, t->n_ok_reads);
  close_views(t);
  if (t->has_model) md_free(&t->m);
  free(t->sim);
  ct_env_close(&t->e);
  if (t->db2) bs_close(t->db2);
  free(t);
  return 0;
}

/* A fresh stream (one per scenario), its uncached view and its view on the second handle. */
static void new_stream(tt *t, const char *name) {
  bs_storage *raw = NULL;
  close_views(t);
  if (t->has_model) md_free(&t->m);
  md_init(&t->m, BS_HASH_XXH3);
  t->has_model = 1;
  t->cp = 0;
  t->n_h = 0;
  t->n_sim = 0;
  CT_OK(ct_env_stream(&t->e, name, BS_HASH_XXH3, "00000000"));
  CT_OK(bs_storage_open(&raw, t->e.db, t->e.stream, &ct_err));
  CT_OK(ct_passthrough_wrap_uncached(&t->nc, raw));
  if (t->db2) CT_OK(ct_storage_open(&t->e, t->db2, t->e.stream, &t->st2));
}

static void reopen(tt *t) {
  bs_storage *raw = NULL;
  close_views(t);
  CT_OK(ct_env_reopen(&t->e));
  CT_OK(bs_storage_open(&raw, t->e.db, t->e.stream, &ct_err));
  CT_OK(ct_passthrough_wrap_uncached(&t->nc, raw));
  if (t->db2) CT_OK(ct_storage_open(&t->e, t->db2, t->e.stream, &t->st2));
}

/* ---- Writing (engine and model together) ---------------------------------------------------- */

/* One save of row `rid` of table "t": bucket NULL = no output rows. */
static void save(tt *t, bs_tag tag, const char *rid, const char *bucket, const char *data) {
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  row.bucket = ct_v(bucket);
  row.object_type = ct_v("t");
  row.object_id = ct_v(rid);
  row.data = ct_v(data);
  s.table = ct_v("t");
  s.tag = tag;
  s.before_id = ct_v(rid);
  s.after_id = tag == BS_DELETE ? ct_v(NULL) : ct_v(rid);
  s.rows = bucket ? &row : NULL;
  s.n_rows = bucket ? 1 : 0;
  memset(&ct_err, 0, sizeof ct_err);
  CT_OK(bs_writer_save(t->e.w, &s, &ct_err));
  md_save(&t->m, &s);
}

static uint64_t commit(tt *t) {
  bs_commit_result r;
  char lsn[16];
  memset(&r, 0, sizeof r);
  snprintf(lsn, sizeof lsn, "%08u", ++t->lsn);
  CT_OK(ct_commit(t->e.w, lsn, &r));
  if (!r.checkpoint_created) fail_msg("commit(%s) made no checkpoint", lsn);
  CT_EQ_U64(r.checkpoint, t->m.head);
  t->cp = r.checkpoint;
  md_reconcile(&t->m, t->e.st, t->cp);
  return t->cp;
}

/* ---- The simulation ------------------------------------------------------------------------- */

static md_bucket *hist(tt *t) {
  return md_find_bucket(&t->m, BUCKET);
}

static int buf_same(const ct_buf *a, const ct_buf *b) {
  size_t an = a->p ? a->n : 0, bn = b->p ? b->n : 0;
  return an == bn && (an == 0 || memcmp(a->p, b->p, an) == 0);
}

static int same_row(const ct_op *a, const ct_op *b) {
  return buf_same(&a->object_type, &b->object_type) && buf_same(&a->object_id, &b->object_id) &&
         buf_same(&a->subkey, &b->subkey);
}

/* contract.md 6 full compaction of the simulated ops at horizon h. */
static void sim_compact(tt *t, uint64_t h) {
  const md_bucket *b = hist(t);
  size_t k, j, run = 0;
  for (k = 0; k < t->n_sim; k++) {
    sim_op *o = &t->sim[k];
    if (o->id > h || (o->type != BS_OP_PUT && o->type != BS_OP_REMOVE)) continue;
    for (j = t->n_sim; j-- > k + 1;) {
      const sim_op *p = &t->sim[j];
      if (p->id <= h && (p->type == BS_OP_PUT || p->type == BS_OP_REMOVE) &&
          same_row(&b->ops[o->h], &b->ops[p->h]))
        break;
    }
    if (j > k) { /* superseded: MOVE to the row's latest op at or below h */
      o->type = BS_OP_MOVE;
      o->target = t->sim[j].id;
      o->h = -1;
    }
  }
  while (run < t->n_sim && t->sim[run].id <= h && t->sim[run].type != BS_OP_PUT) run++;
  if (run >= 2) {
    sim_op c = {t->sim[run - 1].id, BS_OP_CLEAR, 0, 0, -1};
    for (k = 0; k < run; k++) {
      c.checksum += t->sim[k].checksum;
      if (t->sim[k].target > c.target) c.target = t->sim[k].target;
    }
    t->sim[0] = c;
    memmove(&t->sim[1], &t->sim[run], (t->n_sim - run) * sizeof *t->sim);
    t->n_sim -= run - 1;
  }
}

/* Rebuilds the simulated stored state: the history with every compaction so far replayed (ops
 * written after a compaction are above its horizon, so replaying it later changes nothing). */
static void sim_rebuild(tt *t) {
  const md_bucket *b = hist(t);
  size_t k;
  free(t->sim);
  t->sim = NULL;
  t->n_sim = 0;
  if (!b || !b->n) return;
  t->sim = calloc(b->n, sizeof *t->sim);
  assert_non_null(t->sim);
  for (k = 0; k < b->n; k++) {
    t->sim[k].id = b->ops[k].op_id;
    t->sim[k].type = b->ops[k].type;
    t->sim[k].checksum = b->ops[k].checksum;
    t->sim[k].target = 0;
    t->sim[k].h = (long)k;
  }
  t->n_sim = b->n;
  for (k = 0; k < t->n_h; k++) sim_compact(t, t->horizons[k]);
}

static void span(tt *t, uint64_t *start, uint64_t *op) {
  *start = *op = 0;
  if (t->n_sim && t->sim[0].type == BS_OP_CLEAR) {
    *start = hist(t)->ops[0].op_id;
    *op = t->sim[0].id;
  }
}

static int is_torn(tt *t, uint64_t C) {
  uint64_t s, o;
  span(t, &s, &o);
  return o && s <= C && C < o;
}

static void compact(tt *t, uint64_t h) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats st;
  bs_val names[2] = {ct_v(BUCKET), ct_v(NOISE)};
  uint64_t s0, op0, s1, op1;
  span(t, &s0, &op0);
  o.max_op_id = h;
  o.buckets = names;
  o.n_buckets = 2;
  o.min_bucket_changes = 1;
  o.min_change_ratio = 0;
  snprintf(t->where, sizeof t->where, "compact(H=%llu)", (unsigned long long)h);
  CT_OK(bs_compact(&st, t->e.st, &o, &ct_err));
  assert_true(t->n_h < sizeof t->horizons / sizeof t->horizons[0]);
  t->horizons[t->n_h++] = h;
  sim_rebuild(t);
  span(t, &s1, &op1);
  if (op1 > op0) t->n_clears++;
  if (op0 && op1 > op0) t->n_extended++;
  if (op0 && (s1 != s0 || op1 < op0)) /* a bug of this test's simulation (contract.md 6) */
    fail_msg("simulation: span [%llu, %llu] became [%llu, %llu]", (unsigned long long)s0,
             (unsigned long long)op0, (unsigned long long)s1, (unsigned long long)op1);
  snprintf(t->where, sizeof t->where, "after compact(H=%llu)", (unsigned long long)h);
}

/* ---- Checks --------------------------------------------------------------------------------- */

static size_t hist_upto(tt *t, uint64_t x) {
  const md_bucket *b = hist(t);
  size_t n = 0;
  while (b && n < b->n && b->ops[n].op_id <= x) n++;
  return n;
}

static void reduce_hist(tt *t, uint64_t x, md_reduced *r) {
  md_reduce_init(r);
  if (hist(t)) md_reduce_ops(r, hist(t)->ops, hist_upto(t, x));
}

/* The stored ops in (after, C] must be exactly the simulated ones. */
static void expect_sim_range(tt *t, const ct_oplist *l, uint64_t after, uint64_t C) {
  const md_bucket *b = hist(t);
  size_t k, i = 0;
  uint64_t tmax = 0;
  for (k = 0; k < t->n_sim; k++) {
    const sim_op *s = &t->sim[k];
    const ct_op *o;
    if (s->id <= after || s->id > C) continue;
    if (i >= l->n) {
      ct_dump_ops("got", l);
      fail_msg("%s: op %llu (%s) missing", t->where, (unsigned long long)s->id,
               ct_type_name(s->type));
    }
    o = &l->v[i++];
    if (o->op_id != s->id || o->type != s->type || o->checksum != s->checksum ||
        o->target_op != s->target) {
      ct_dump_ops("got", l);
      fail_msg("%s: got op %llu %s cs %u target %llu, expected %llu %s cs %u target %llu", t->where,
               (unsigned long long)o->op_id, ct_type_name(o->type), o->checksum,
               (unsigned long long)o->target_op, (unsigned long long)s->id, ct_type_name(s->type),
               s->checksum, (unsigned long long)s->target);
    }
    if (s->h >= 0) {
      const ct_op *h = &b->ops[s->h];
      if (!same_row(o, h) || (s->type == BS_OP_PUT && !buf_same(&o->data, &h->data)))
        fail_msg("%s: op %llu: row identity or data differs from the history", t->where,
                 (unsigned long long)o->op_id);
    } else if (o->data.p && o->data.n) {
      fail_msg("%s: %s op %llu carries data", t->where, ct_type_name(o->type),
               (unsigned long long)o->op_id);
    }
    if (s->type == BS_OP_MOVE || s->type == BS_OP_CLEAR)
      if (s->target > tmax) tmax = s->target;
  }
  if (i != l->n) {
    ct_dump_ops("got", l);
    fail_msg("%s: %zu ops, expected %zu", t->where, l->n, i);
  }
  if (l->max_target != tmax)
    fail_msg("%s: chunk target_op %llu, expected %llu (contract.md 5.5 first bullet)", t->where,
             (unsigned long long)l->max_target, (unsigned long long)tmax);
}

/* Expected (checksum, count) at an untorn C. */
static bs_checksum expect_cks(tt *t, uint64_t C) {
  bs_checksum want, hsum;
  size_t k;
  want.checksum = 0;
  want.count = 0;
  for (k = 0; k < t->n_sim && t->sim[k].id <= C; k++) {
    want.checksum += t->sim[k].checksum;
    want.count++;
  }
  md_checksum(&t->m, BUCKET, C, &hsum);
  if (hsum.checksum != want.checksum) /* a bug of this test's simulation, not of the backend */
    fail_msg("simulation: checksum at %llu is %u, history %u", (unsigned long long)C, want.checksum,
             hsum.checksum);
  return want;
}

static void check_cks_on(tt *t, bs_storage *st, const char *view, uint64_t C) {
  bs_checksum got;
  int rc;
  snprintf(t->where, sizeof t->where, "checksum at C=%llu via %s", (unsigned long long)C, view);
  rc = ct_checksum(st, C, BUCKET, &got);
  if (is_torn(t, C)) {
    if (rc != BS_EINVALIDATED) {
      uint64_t s, o;
      span(t, &s, &o);
      fail_msg("%s: got %s (checksum %u count %llu), expected BS_EINVALIDATED: C is inside the "
               "compacted span [%llu, %llu] (contract.md 5.5)",
               t->where, bs_strerror(rc), got.checksum, (unsigned long long)got.count,
               (unsigned long long)s, (unsigned long long)o);
    }
    t->n_torn_cks++;
    return;
  }
  if (rc != BS_OK) fail_msg("%s: %s (%s)", t->where, bs_strerror(rc), ct_err.msg);
  {
    bs_checksum want = expect_cks(t, C);
    if (got.checksum != want.checksum || got.count != want.count)
      fail_msg("%s: got checksum %u count %llu, expected %u count %llu", t->where, got.checksum,
               (unsigned long long)got.count, want.checksum, (unsigned long long)want.count);
  }
}

static void check_cks(tt *t, uint64_t C) {
  check_cks_on(t, t->e.st, "the cached storage", C);
  check_cks_on(t, t->nc, "the uncached view", C);
  if (t->st2) check_cks_on(t, t->st2, "the second handle", C);
}

/* A client at x (holding reduce(history[..x])) reads (x, C]; contract.md 9 property 3. */
static void check_resume(tt *t, uint64_t x, uint64_t C) {
  ct_oplist l;
  md_reduced full, res;
  char why[256];
  int rc;
  snprintf(t->where, sizeof t->where, "read (%llu, %llu]", (unsigned long long)x,
           (unsigned long long)C);
  memset(&l, 0, sizeof l);
  rc = ct_read_bucket(t->e.st, C, BUCKET, x, &l);
  if (is_torn(t, C)) {
    if (rc != BS_EINVALIDATED) {
      uint64_t s, o;
      span(t, &s, &o);
      fail_msg("%s: got %s with %zu ops, expected BS_EINVALIDATED (C inside [%llu, %llu], "
               "contract.md 5.5; `after` makes no difference)",
               t->where, bs_strerror(rc), l.n, (unsigned long long)s, (unsigned long long)o);
    }
    t->n_torn_data++;
  } else {
    if (rc != BS_OK) fail_msg("%s: %s (%s)", t->where, bs_strerror(rc), ct_err.msg);
    expect_sim_range(t, &l, x, C);
    if (x >= C && l.n) fail_msg("%s: empty range served %zu ops", t->where, l.n);
  }
  if (x >= C) { /* nothing to converge: the range is empty */
    ct_oplist_free(&l);
    return;
  }
  if (rc == BS_OK && l.max_target <= C) {
    t->n_ok_reads++;
  } else {
    /* Told to read a newer checkpoint: the latest one must succeed and converge there. */
    if (rc == BS_OK) t->n_target_reports++;
    ct_oplist_free(&l);
    C = t->cp;
    snprintf(t->where, sizeof t->where,
             "retry of the read from %llu at the newer checkpoint "
             "%llu",
             (unsigned long long)x, (unsigned long long)C);
    rc = ct_read_bucket(t->e.st, C, BUCKET, x, &l);
    if (rc != BS_OK) fail_msg("%s: %s (%s)", t->where, bs_strerror(rc), ct_err.msg);
    if (l.max_target > C)
      fail_msg("%s: target_op %llu > C", t->where, (unsigned long long)l.max_target);
  }
  reduce_hist(t, C, &full);
  reduce_hist(t, x, &res);
  md_reduce_ops(&res, l.v, l.n);
  if (!md_reduced_eq(&full, &res, why, sizeof why)) {
    ct_dump_ops("read", &l);
    fail_msg("%s: the client does not converge (contract.md 9 property 3): %s", t->where, why);
  }
  if (x == 0 && md_reduced_total(&res) != expect_cks(t, C).checksum)
    fail_msg("%s: reduced total != bucket checksum", t->where);
  md_reduce_free(&full);
  md_reduce_free(&res);
  ct_oplist_free(&l);
}

/* Every C in [0, cp + 2] (also non-checkpoints), every position x in [0, C + 2]. */
static void check_all(tt *t) {
  uint64_t C, x, top = t->cp + 2;
  for (C = 0; C <= top; C++) check_cks(t, C);
  for (C = 0; C <= top; C++)
    for (x = 0; x <= C + 2; x++) check_resume(t, x, C);
}

/* ==== Deterministic cases ==================================================================== */

/* The span, then a second compaction that extends it (contract.md 5.5, 6), with the cache full of
 * entries from before each compaction. */
static void t_span_and_extension(void **state) {
  tt *t = *state;
  uint64_t s, o;
  bs_checksum c;
  t->scenario = -1;
  new_stream(t, "ext");
  /* 1 PUT r1 [cp 1]; 2 PUT r1; 3 REMOVE r1 [cp 3]; 4 PUT r2 [cp 4]; 5 PUT r2 [cp 5];
   * 6 PUT n in the other bucket [cp 6] */
  save(t, BS_INSERT, "r1", BUCKET, "1");
  CT_EQ_U64(commit(t), 1);
  save(t, BS_UPDATE, "r1", BUCKET, "2");
  save(t, BS_DELETE, "r1", NULL, NULL);
  CT_EQ_U64(commit(t), 3);
  save(t, BS_INSERT, "r2", BUCKET, "a");
  CT_EQ_U64(commit(t), 4);
  save(t, BS_UPDATE, "r2", BUCKET, "b");
  CT_EQ_U64(commit(t), 5);
  save(t, BS_INSERT, "n", NOISE, "x");
  CT_EQ_U64(commit(t), 6);
  sim_rebuild(t);
  check_all(t); /* fills the cache at every C */

  /* H = 4: ops 1..3 fold into CLEAR(3); op 4 stays a PUT (its successor 5 is above H). */
  compact(t, 4);
  span(t, &s, &o);
  CT_EQ_U64(s, 1);
  CT_EQ_U64(o, 3);
  CT_RC(BS_EINVALIDATED, ct_checksum(t->e.st, 1, BUCKET, &c));
  CT_RC(BS_EINVALIDATED, ct_checksum(t->e.st, 2, BUCKET, &c));
  CT_OK(ct_checksum(t->e.st, 3, BUCKET, &c));
  CT_EQ_U64(c.count, 1);
  CT_OK(ct_checksum(t->e.st, 0, BUCKET, &c));
  CT_EQ_U64(c.count, 0);
  check_all(t);

  /* H = 5: op 4 becomes MOVE(target 5), the run CLEAR(3), MOVE(4) folds into CLEAR(4) with
   * target 5: the span grows to [1, 4] (start kept, end moved up). C = 3, readable and cached a
   * moment ago, is torn now; at C = 4 the CLEAR's target 5 > 4 is reported. */
  compact(t, 5);
  span(t, &s, &o);
  CT_EQ_U64(s, 1);
  CT_EQ_U64(o, 4);
  CT_EQ_U64(t->sim[0].target, 5);
  CT_RC(BS_EINVALIDATED, ct_checksum(t->e.st, 3, BUCKET, &c));
  CT_OK(ct_checksum(t->e.st, 4, BUCKET, &c));
  CT_EQ_U64(c.count, 1); /* was 2 (CLEAR, PUT) before: a stale cached count would show */
  CT_OK(ct_checksum(t->e.st, 5, BUCKET, &c));
  CT_EQ_U64(c.count, 2);
  check_all(t);

  /* A third compaction at the same horizon changes nothing. */
  compact(t, 5);
  check_all(t);
  if (t->e.be->persistent) {
    reopen(t);
    check_all(t);
  }
  t->done = 1;
}

/* A read at C below a MOVE's target reports it (contract.md 5.5 first bullet); no CLEAR here. */
static void t_move_target_above_C(void **state) {
  tt *t = *state;
  ct_oplist l;
  t->scenario = -1;
  new_stream(t, "move");
  /* 1 PUT r1 [cp 1]; 2 PUT r2 [cp 2]; 3 PUT r1 [cp 3] -> MOVE(1, target 3), PUT 2, PUT 3 */
  save(t, BS_INSERT, "r1", BUCKET, "1");
  CT_EQ_U64(commit(t), 1);
  save(t, BS_INSERT, "r2", BUCKET, "x");
  CT_EQ_U64(commit(t), 2);
  save(t, BS_UPDATE, "r1", BUCKET, "2");
  CT_EQ_U64(commit(t), 3);
  sim_rebuild(t);
  check_all(t);
  compact(t, 3);
  assert_int_equal(t->sim[0].type, BS_OP_MOVE);
  CT_EQ_U64(t->sim[0].target, 3);
  memset(&l, 0, sizeof l);
  CT_OK(ct_read_bucket(t->e.st, 1, BUCKET, 0, &l));
  CT_EQ_U64(l.n, 1);
  CT_EQ_U64(l.max_target, 3);
  ct_oplist_free(&l);
  memset(&l, 0, sizeof l);
  CT_OK(ct_read_bucket(t->e.st, 2, BUCKET, 1, &l)); /* the MOVE is not in (1, 2] */
  CT_EQ_U64(l.n, 1);
  CT_EQ_U64(l.max_target, 0);
  ct_oplist_free(&l);
  check_all(t);
  /* Then r2 goes away: 4 REMOVE r2 [cp 4]; H = 4 folds MOVE(1), MOVE(2) -> CLEAR(2) with
   * target 4 (r2's REMOVE), span [1, 2]: C = 1 torn, C = 2 reports target 4 > 2. */
  save(t, BS_DELETE, "r2", NULL, NULL);
  CT_EQ_U64(commit(t), 4);
  compact(t, 4);
  assert_int_equal(t->sim[0].type, BS_OP_CLEAR);
  CT_EQ_U64(t->sim[0].id, 2);
  CT_EQ_U64(t->sim[0].target, 4);
  check_all(t);
  t->done = 1;
}

/* `after` >= C at a torn C fails too (contract.md 5.5 names C only); at an untorn C it is empty. */
static void t_after_at_or_above_C(void **state) {
  tt *t = *state;
  ct_oplist l;
  uint64_t after;
  t->scenario = -1;
  new_stream(t, "after");
  /* 1 PUT r1 [cp 1]; 2 PUT r2 [cp 2]; 3 REMOVE r1 [cp 3]; 4 REMOVE r2 [cp 4]; 5 PUT r3 [cp 5]
   * H = 5 -> CLEAR(4) spanning [1, 4], PUT 5 */
  save(t, BS_INSERT, "r1", BUCKET, "1");
  commit(t);
  save(t, BS_INSERT, "r2", BUCKET, "2");
  commit(t);
  save(t, BS_DELETE, "r1", NULL, NULL);
  commit(t);
  save(t, BS_DELETE, "r2", NULL, NULL);
  commit(t);
  save(t, BS_INSERT, "r3", BUCKET, "3");
  CT_EQ_U64(commit(t), 5);
  compact(t, 5);
  CT_EQ_U64(t->sim[0].id, 4);
  for (after = 2; after <= 7; after++) {
    memset(&l, 0, sizeof l);
    CT_RC(BS_EINVALIDATED, ct_read_bucket(t->e.st, 2, BUCKET, after, &l));
    CT_EQ_U64(l.n, 0);
    ct_oplist_free(&l);
  }
  for (after = 4; after <= 7; after++) {
    memset(&l, 0, sizeof l);
    CT_OK(ct_read_bucket(t->e.st, 4, BUCKET, after, &l));
    CT_EQ_U64(l.n, 0);
    CT_EQ_U64(l.n_chunks, 0);
    ct_oplist_free(&l);
  }
  /* The torn bucket does not fail the read of another bucket at the same C. */
  {
    bs_checksum c;
    save(t, BS_INSERT, "n", NOISE, "x");
    commit(t);
    CT_OK(ct_checksum(t->e.st, 2, NOISE, &c));
    CT_EQ_U64(c.count, 0);
  }
  check_all(t);
  t->done = 1;
}

/* ==== Random histories ======================================================================= */

#define MAX_ROWS 4

typedef struct rowst {
  int state; /* 0 no record, 1 record in BUCKET, 2 record without membership */
  unsigned ver;
} rowst;

static void random_step(tt *t, ct_rng *r, rowst *rows, size_t n_rows, rowst *noise) {
  char rid[8], data[24];
  size_t i;
  if (ct_below(r, 100) < 15) { /* noise: interleaves op ids of another bucket */
    i = ct_below(r, 2);
    snprintf(rid, sizeof rid, "n%zu", i);
    snprintf(data, sizeof data, "n%u", ++noise[i].ver);
    save(t, noise[i].state ? BS_UPDATE : BS_INSERT, rid, NOISE, data);
    noise[i].state = 1;
    return;
  }
  i = ct_below(r, n_rows);
  snprintf(rid, sizeof rid, "r%zu", i);
  snprintf(data, sizeof data, "{\"v\":%u}", ++rows[i].ver);
  switch (rows[i].state) {
  case 0:
    save(t, BS_INSERT, rid, BUCKET, data);
    rows[i].state = 1;
    break;
  case 2:
    save(t, BS_UPDATE, rid, BUCKET, data);
    rows[i].state = 1;
    break;
  default: {
    uint64_t p = ct_below(r, 100);
    if (p < 45) {
      save(t, BS_UPDATE, rid, BUCKET, data);
    } else if (p < 80) {
      save(t, BS_DELETE, rid, NULL, NULL);
      rows[i].state = 0;
    } else { /* the row leaves the bucket: REMOVE by step 2 of contract.md 4.1 */
      save(t, BS_UPDATE, rid, NULL, NULL);
      rows[i].state = 2;
    }
  }
  }
}

static void random_phase(tt *t, ct_rng *r, size_t n, rowst *rows, size_t n_rows, rowst *noise) {
  size_t k;
  for (k = 0; k < n; k++) {
    random_step(t, r, rows, n_rows, noise);
    if (ct_below(r, 2)) commit(t);
  }
  if (t->m.head > t->cp) commit(t);
}

static uint64_t pick_horizon(tt *t, ct_rng *r, uint64_t lo) {
  /* the last checkpoint, or any op id in [lo, cp] (a horizon need not be a checkpoint) */
  if (t->cp <= lo || ct_below(r, 2)) return t->cp;
  return lo + 1 + ct_below(r, t->cp - lo);
}

static void one_scenario(tt *t, uint64_t seed) {
  ct_rng r = {seed};
  rowst rows[MAX_ROWS], noise[2];
  size_t n_rows = 2 + ct_below(&r, MAX_ROWS - 1);
  char name[32];
  uint64_t h1, h2;
  memset(rows, 0, sizeof rows);
  memset(noise, 0, sizeof noise);
  snprintf(name, sizeof name, "s%d", t->scenario);
  new_stream(t, name);
  /* the first op goes to BUCKET so that the history is never empty */
  save(t, BS_INSERT, "r0", BUCKET, "{\"v\":0}");
  rows[0].state = 1;
  random_phase(t, &r, 3 + ct_below(&r, 12), rows, n_rows, noise);
  sim_rebuild(t);
  check_all(t);
  h1 = pick_horizon(t, &r, 0);
  random_phase(t, &r, ct_below(&r, 6), rows, n_rows, noise);
  compact(t, h1);
  check_all(t);
  random_phase(t, &r, 1 + ct_below(&r, 5), rows, n_rows, noise);
  h2 = pick_horizon(t, &r, h1);
  compact(t, h2);
  sim_rebuild(t);
  check_all(t);
  if (t->e.be->persistent && ct_below(&r, 4) == 0) {
    reopen(t);
    check_all(t);
  }
}

static void t_random_histories(void **state) {
  tt *t = *state;
  uint64_t base = ct_first_seed("torn", t->e.be);
  /* a PostgreSQL scenario costs about 15 times a local one (round trips) */
  int pg = t->e.be == ct_postgres(), n = ct_quick() ? (pg ? 20 : 100) : (pg ? 80 : 400), i;
  ct_rng seeds = ct_seed(base, 0);
  ct_seed_log("torn", t->e.be->name, base);
  for (i = 0; i < n; i++) {
    t->scenario = i;
    t->seed = base;
    one_scenario(t, ct_rand(&seeds));
  }
  t->done = 1;
}

/* ==== Runner ================================================================================= */

int main(void) {
  static const struct {
    const char *name;
    CMUnitTestFunction fn;
  } tests[] = {
      {"t_span_and_extension", t_span_and_extension},
      {"t_move_target_above_C", t_move_target_above_C},
      {"t_after_at_or_above_C", t_after_at_or_above_C},
      {"t_random_histories", t_random_histories},
  };
  enum { N = sizeof tests / sizeof tests[0] };
  struct CMUnitTest run[N];
  const char *only = getenv("BS_CONTRACT_ONLY");
  char label[128];
  int failed = 0;
  size_t b, i, n;
  const ct_backend *bes[CT_MAX_BACKENDS];
  size_t n_be = ct_backends_selected(bes);
  if (!n_be) return 1;
  for (b = 0; b < n_be; b++) {
    const ct_backend *be = bes[b];
    for (i = 0, n = 0; i < N; i++) {
      snprintf(label, sizeof label, "%s/%s", be->name, tests[i].name);
      if (only && !strstr(label, only)) continue;
      memset(&run[n], 0, sizeof run[n]);
      run[n].name = tests[i].name;
      run[n].test_func = tests[i].fn;
      run[n].setup_func = setup;
      run[n].teardown_func = teardown;
      run[n].initial_state = (void *)be;
      n++;
    }
    snprintf(label, sizeof label, "torn/%s", be->name);
    if (n) failed += _cmocka_run_group_tests(label, run, n, NULL, NULL);
  }
  return failed ? 1 : 0;
}
