/*
 * test_sync.c: the sync contract end to end. A writer runs a random workload (saves, truncates,
 * flushes, commits), compactions run at random (full, by thresholds, on named buckets,
 * incremental with min_age_ms 0 and op budgets, parameter compaction, older horizons), the LMDB
 * file is reopened, and several clients (util_client) talk to a server driver (util_server):
 * they connect at random times, read a random number of lines, disconnect at any line, change
 * their bucket set, and resume from stale positions (a saved copy of an earlier state, or a fork
 * of another client). Checked:
 *  - a client never sees a checksum mismatch, nor a line the protocol does not allow;
 *  - at every checkpoint_complete (partial: buckets of that priority or higher) the client's
 *    reduced state of every validated bucket equals the model's reduce of the full history at
 *    that checkpoint (same live rows, op ids, data, and remainder checksum), and the checksum
 *    served equals the history's;
 *  - bs_get_checkpoint_changes never misses a bucket that has an op in the range;
 *  - at the end every client converges to the last checkpoint, incrementally and from scratch.
 * Backends: memory, lmdb, lmdb+passthrough, and postgres with BS_TEST_PG_URL (without the
 * compactions and truncates while its ct_backend lacks them).
 *
 * Seeds: BS_SEED (first; default: each backend's block, ct_first_seed), BS_SEEDS (how many: 12
 * quick / 32 full, on postgres 3 / 8), BS_STEPS (steps per seed: 600 quick / 1500 full). The seed
 * is printed; reproduce with BS_SEED=n BS_SEEDS=1, and BS_BACKEND=name to run one backend. BS_VERBOSE=1 prints per-seed statistics.
 */
#include "util_client.h"
#include "util_edge.h"
#include "util_head.h"
#include "util_model.h"
#include "util_server.h"

#include <stdlib.h>
#include <string.h>

#define N_TABLES    3
#define N_RIDS      16
#define N_BUCKETS   7 /* the last one is never written */
#define N_WRITTEN   6
#define N_KEYS      3
#define MAX_CLIENTS 6

static const sv_sub BUCKETS[N_BUCKETS] = {
    {"b0", 0},       {"b1", 1},      {"b2", 3}, {"by_user[\"u1\"]", 2}, {"by_user[\"u2\"]", 3},
    {"global[]", 3}, {"never[]", 1},
};

typedef struct tclient {
  cl_client c;
  sv_conn *conn; /* NULL: disconnected */
  unsigned subs; /* bit i: BUCKETS[i] */
  cl_client snap;
  int has_snap;
} tclient;

typedef struct stats {
  unsigned long saves, commits, checkpoints, compactions, reopens, connects, disconnects, restores,
      forks, races, lines, validations, partials, rows_checked;
  sv_stats sv;
} stats;

typedef struct run {
  const ct_backend *be;
  ct_env e;
  ct_rng rng;
  uint64_t seed;
  size_t step;
  md_stream m;
  uint64_t lsn, cp;
  uint64_t cps[4096];
  size_t n_cps;
  tclient cl[MAX_CLIENTS];
  int n_cl;
  unsigned char keys[N_KEYS][BS_MAX_LOOKUP_KEY];
  bs_val key[N_KEYS];
  char table[N_TABLES][BS_MAX_TABLE_NAME + 1]; /* t0.., r0..; in some runs edge values */
  char rid[N_RIDS][BS_MAX_REPLICA_ID + 1];
  uint64_t conn_seq;
  stats s;
} run;

#define FAILR(r, fmt, ...)                                                                         \
  fail_msg("[%s seed %llu step %zu] " fmt, (r)->be->name, (unsigned long long)(r)->seed,           \
           (r)->step, __VA_ARGS__)

static void lsn_fmt(char *out, uint64_t n) {
  snprintf(out, 32, "%016llx", (unsigned long long)n);
}

/* ---- Model checks --------------------------------------------------------------------------- */

static void model_reduce(const run *r, const char *name, uint64_t C, md_reduced *out) {
  md_bucket *b = md_find_bucket((md_stream *)&r->m, name);
  size_t i;
  md_reduce_init(out);
  if (!b) return;
  for (i = 0; i < b->n && b->ops[i].op_id <= C; i++) md_reduce_op(out, &b->ops[i]);
}

/* On a failure: the history, what the engine serves now, and the client's rows. */
static void dump_bucket(run *r, int ci, const char *name, uint64_t C) {
  md_bucket *b = md_find_bucket(&r->m, name);
  const cl_bucket *cb = cl_find(&r->cl[ci].c, name);
  ct_oplist hist, now;
  size_t i;
  memset(&hist, 0, sizeof hist);
  memset(&now, 0, sizeof now);
  for (i = 0; b && i < b->n && b->ops[i].op_id <= C; i++) {
    bs_op op;
    const ct_op *o = &b->ops[i];
    memset(&op, 0, sizeof op);
    op.op_id = o->op_id;
    op.type = o->type;
    op.checksum = o->checksum;
    op.object_type = (bs_val){o->object_type.p, o->object_type.n};
    op.object_id = (bs_val){o->object_id.p, o->object_id.n};
    op.subkey = (bs_val){o->subkey.p, o->subkey.n};
    ct_oplist_push(&hist, &op);
  }
  ct_dump_ops("history", &hist);
  if (ct_read_bucket(r->e.st, C, name, 0, &now) == BS_OK)
    ct_dump_ops("engine now", &now);
  else
    fprintf(stderr, "engine now: %s\n", ct_err.msg);
  for (i = 0; cb && i < cb->n; i++)
    fprintf(stderr, "client row %s op %llu\n", cb->rows[i].key,
            (unsigned long long)cb->rows[i].op_id);
  ct_oplist_free(&hist);
  ct_oplist_free(&now);
}

/* The client's state of bucket `name` equals the reduce of the history at C. */
static void check_client_bucket(run *r, int ci, const sl_bucket_checksum *t, uint64_t C) {
  tclient *tc = &r->cl[ci];
  const cl_bucket *b = cl_find(&tc->c, t->name);
  md_reduced want;
  bs_checksum hist;
  size_t i, n = b ? b->n : 0;
  md_checksum(&r->m, t->name, C, &hist);
  if (t->checksum != hist.checksum)
    FAILR(r, "client %d: checkpoint %llu served checksum %u for %s, history says %u", ci,
          (unsigned long long)C, t->checksum, t->name, hist.checksum);
  model_reduce(r, t->name, C, &want);
  if (n != want.n || (b ? b->add_checksum : 0) != want.remainder) {
    dump_bucket(r, ci, t->name, C);
    for (i = 0; i < want.cap; i++)
      if (want.rows[i].key && !(b && cl_row_find(b, want.rows[i].key)))
        fprintf(stderr, "model row missing at the client: %s op %llu\n", want.rows[i].key,
                (unsigned long long)want.rows[i].op_id);
  }
  if (n != want.n || (b ? b->add_checksum : 0) != want.remainder)
    FAILR(r,
          "client %d at %llu, bucket %s: %zu live rows, remainder %u; model %zu rows, "
          "remainder %u",
          ci, (unsigned long long)C, t->name, n, b ? b->add_checksum : 0, want.n, want.remainder);
  for (i = 0; i < n; i++) {
    const cl_row *row = &b->rows[i];
    const md_row *mr = md_reduced_get(&want, row->key);
    if (!mr || mr->op_id != row->op_id || mr->checksum != row->checksum ||
        strcmp(mr->data, row->data) != 0)
      FAILR(r,
            "client %d at %llu, bucket %s, row %s: client op %llu cs %u, model %s op %llu "
            "cs %u",
            ci, (unsigned long long)C, t->name, row->key, (unsigned long long)row->op_id,
            row->checksum, mr ? "has" : "lacks it:", (unsigned long long)(mr ? mr->op_id : 0),
            mr ? mr->checksum : 0);
    r->s.rows_checked++;
  }
  md_reduce_free(&want);
}

static void check_validated(run *r, int ci) {
  cl_client *c = &r->cl[ci].c;
  size_t i;
  for (i = 0; i < c->target.n; i++) {
    const sl_bucket_checksum *t = &c->target.b[i];
    if (c->validated_priority >= 0 && t->priority > c->validated_priority) continue;
    check_client_bucket(r, ci, t, c->validated_cp);
  }
}

/* get_checkpoint_changes: every bucket with an op in (from, to] is reported. */
static void on_changes(uint64_t from, uint64_t to, const bs_checkpoint_changes *ch, void *payload) {
  run *r = payload;
  size_t i, k;
  if (ch->invalidate_data_buckets) return;
  for (i = 0; i < r->m.n_b; i++) {
    const md_bucket *b = &r->m.b[i];
    int has = 0, listed = 0;
    for (k = 0; k < b->n && !has; k++) has = b->ops[k].op_id > from && b->ops[k].op_id <= to;
    if (!has) continue;
    for (k = 0; k < ch->n_updated_buckets && !listed; k++)
      listed = ch->updated_buckets[k].size == strlen(b->name) &&
               memcmp(ch->updated_buckets[k].data, b->name, strlen(b->name)) == 0;
    if (!listed)
      FAILR(r, "get_checkpoint_changes(%llu, %llu) does not report bucket %s (%zu reported)",
            (unsigned long long)from, (unsigned long long)to, b->name, ch->n_updated_buckets);
  }
}

/* ---- Clients -------------------------------------------------------------------------------- */

static size_t subs_of(unsigned mask, sv_sub *out) {
  size_t i, n = 0;
  for (i = 0; i < N_BUCKETS; i++)
    if (mask & (1u << i)) out[n++] = BUCKETS[i];
  return n;
}

static unsigned random_subs(run *r) {
  unsigned m;
  size_t i;
  do {
    m = 0;
    for (i = 0; i < N_BUCKETS; i++)
      if (ct_below(&r->rng, 4) != 0) m |= 1u << i;
  } while (!m);
  return m;
}

static void add_stats(stats *s, const sv_stats *v) {
  s->sv.lines += v->lines;
  s->sv.checkpoints += v->checkpoints;
  s->sv.diffs += v->diffs;
  s->sv.data += v->data;
  s->sv.completes += v->completes;
  s->sv.partials += v->partials;
  s->sv.withheld_target += v->withheld_target;
  s->sv.withheld_invalidated += v->withheld_invalidated;
  s->sv.checksum_invalidated += v->checksum_invalidated;
  s->sv.superseded += v->superseded;
  s->sv.reads += v->reads;
}

static void client_connect(run *r, int ci) {
  tclient *t = &r->cl[ci];
  bs_bucket_request *req;
  size_t n;
  sv_sub subs[N_BUCKETS];
  sv_options o;
  memset(&o, 0, sizeof o);
  o.lag = (int)ct_below(&r->rng, 2);
  o.interrupt = (int)ct_below(&r->rng, 2);
  o.on_changes = on_changes;
  o.payload = r;
  cl_connect(&t->c, &req, &n);
  CT_OK(sv_connect(&t->conn, r->e.st, req, n, r->seed * 1000003u + ++r->conn_seq, &o));
  free(req);
  sv_set_buckets(t->conn, subs, subs_of(t->subs, subs));
  r->s.connects++;
}

static void client_disconnect(run *r, int ci) {
  tclient *t = &r->cl[ci];
  if (!t->conn) return;
  add_stats(&r->s, sv_get_stats(t->conn));
  sv_close(t->conn);
  t->conn = NULL;
  cl_disconnect(&t->c);
  r->s.disconnects++;
}

/* BS_TRACE=<client> (with BS_SEEDS=1): every line that client receives, for debugging. */
static int trace_on(const run *r, int ci) {
  const char *t = getenv("BS_TRACE");
  return t && *t && atoi(t) == ci;
}

static void trace_line(const run *r, int ci, const sl_line *l) {
  size_t i;
  fprintf(stderr, "[step %zu] client %d <- %s %llu", r->step, ci, sl_kind_name(l->kind),
          (unsigned long long)l->last_op_id);
  if (l->kind == SL_DATA)
    fprintf(stderr, " %s (%llu, %llu] more %d target %llu:", l->bucket,
            (unsigned long long)l->after, (unsigned long long)l->next_after, l->has_more,
            (unsigned long long)l->target_op);
  for (i = 0; i < l->ops.n; i++)
    fprintf(stderr, " %llu%s", (unsigned long long)l->ops.v[i].op_id,
            ct_type_name(l->ops.v[i].type));
  for (i = 0; i < l->n_buckets; i++)
    fprintf(stderr, " %s=%u", l->buckets[i].name, l->buckets[i].checksum);
  if (l->kind == SL_PARTIAL_COMPLETE) fprintf(stderr, " priority %d", l->priority);
  fprintf(stderr, "\n");
}

/* Reads up to max lines (0 = until idle). Returns the number of lines read. */
static size_t client_pump(run *r, int ci, size_t max) {
  tclient *t = &r->cl[ci];
  size_t n = 0;
  while (!max || n < max) {
    sl_line l;
    int rc;
    memset(&l, 0, sizeof l);
    memset(&ct_err, 0, sizeof ct_err);
    rc = sv_next(t->conn, &l, &ct_err);
    if (rc < 0) FAILR(r, "client %d: server: %s (%s)", ci, bs_strerror(rc), ct_err.msg);
    if (rc == 0) break;
    n++;
    r->s.lines++;
    if (trace_on(r, ci)) trace_line(r, ci, &l);
    rc = cl_apply(&t->c, &l);
    if (rc == CL_MISMATCH || rc == CL_PROTOCOL)
      FAILR(r, "client %d, %s line (%s): %s", ci, sl_kind_name(l.kind),
            rc == CL_MISMATCH ? "CHECKSUM MISMATCH" : "protocol", t->c.why);
    if (rc == CL_VALIDATED) {
      if (t->c.validated_priority < 0)
        r->s.validations++;
      else
        r->s.partials++;
      check_validated(r, ci);
    }
    sl_line_free(&l);
    if (max == 0 && n > 1000000) FAILR(r, "client %d: the server does not go idle", ci);
  }
  return n;
}

static void client_step(run *r) {
  int ci = (int)ct_below(&r->rng, (uint64_t)r->n_cl), a = (int)ct_below(&r->rng, 100);
  tclient *t = &r->cl[ci];
  if (!t->conn) {
    if (a < 50) {
      client_connect(r, ci);
      client_pump(r, ci, 1 + ct_below(&r->rng, 8));
    } else if (a < 60 && t->has_snap) { /* resume from an older state of this client */
      cl_free(&t->c);
      cl_clone(&t->c, &t->snap);
      r->s.restores++;
    } else if (a < 66 && r->n_cl < MAX_CLIENTS) { /* a new client that starts from this one's */
      tclient *f = &r->cl[r->n_cl++];
      memset(f, 0, sizeof *f);
      cl_clone(&f->c, &t->c);
      f->subs = ct_below(&r->rng, 2) ? t->subs : random_subs(r);
      r->s.forks++;
    }
    return;
  }
  if (a < 80) {
    client_pump(r, ci, 1 + ct_below(&r->rng, ct_below(&r->rng, 4) == 0 ? 60 : 10));
  } else if (a < 90) {
    client_disconnect(r, ci);
  } else if (a < 95) {
    sv_sub subs[N_BUCKETS];
    unsigned m = t->subs ^ (1u << ct_below(&r->rng, N_BUCKETS));
    if (m) t->subs = m;
    sv_set_buckets(t->conn, subs, subs_of(t->subs, subs));
  } else {
    if (t->has_snap) cl_free(&t->snap);
    cl_clone(&t->snap, &t->c);
    t->has_snap = 1;
  }
}

/* ---- Writer --------------------------------------------------------------------------------- */

static void do_save(run *r) {
  bs_save sv = BS_SAVE_INIT;
  bs_row rows[4];
  bs_lookup lk;
  bs_val params[1];
  char data[4][1200], prm[64];
  size_t nrows = ct_below(&r->rng, 4), i, t = ct_below(&r->rng, N_TABLES);
  size_t ri = ct_below(&r->rng, N_RIDS);
  int kind = (int)ct_below(&r->rng, 100);
  unsigned used = 0;
  const char *tname = r->table[t], *rid = r->rid[ri], *rid2 = r->rid[ct_below(&r->rng, N_RIDS)];
  const char *oid = ct_below(&r->rng, 8) == 0 ? "shared" : rid;
  /* sometimes an edge value ("", one byte, the maximum length, non-ASCII, quotes; no NUL: the
   * model and the client keep NUL-terminated strings) */
  bs_val oidv = ct_below(&r->rng, 8) == 0
                    ? ue_str_pick(&r->rng, BS_MAX_OBJECT_NAME, UE_NUL | UE_OVER, NULL)
                    : ct_v(oid);
  sv.table = ct_v(tname);
  if (kind < 30)
    sv.tag = BS_INSERT;
  else if (kind < 75)
    sv.tag = BS_UPDATE;
  else if (kind < 82) {
    sv.tag = BS_UPDATE; /* the replica id changes rid2 -> rid */
    sv.before_id = ct_v(rid2);
  } else
    sv.tag = BS_DELETE;
  if (sv.tag == BS_DELETE) {
    sv.before_id = ct_v(rid);
  } else {
    sv.after_id = ct_v(rid);
    for (i = 0; i < nrows; i++) {
      unsigned bi;
      size_t pad =
          ct_below(&r->rng, 20) == 0 ? 500 + ct_below(&r->rng, 600) : ct_below(&r->rng, 60);
      int L;
      /* now and then the previous output again: two PUTs, one membership (contract.md 4.1) */
      if (i > 0 && ct_below(&r->rng, 8) == 0) {
        for (bi = 0; rows[i - 1].bucket.data != BUCKETS[bi].name; bi++) continue;
      } else {
        do bi = (unsigned)ct_below(&r->rng, N_WRITTEN);
        while (used & (1u << bi));
      }
      used |= 1u << bi;
      L = snprintf(data[i], 64, "{\"v\":%llu,\"p\":\"", (unsigned long long)ct_below(&r->rng, 4));
      memset(data[i] + L, 'x', pad);
      strcpy(data[i] + L + pad, "\"}");
      rows[i].bucket = ct_v(BUCKETS[bi].name);
      rows[i].object_type = ct_v(tname);
      rows[i].object_id = oidv;
      rows[i].data = ct_below(&r->rng, 10) == 0 ? ue_str_pick(&r->rng, 4000, UE_NUL | UE_OVER, NULL)
                     : ct_below(&r->rng, 20) == 0 ? ue_data(&r->rng, UE_DATA_MAX) /* edge sizes */
                                                  : ct_v(data[i]);
    }
    sv.rows = rows;
    sv.n_rows = nrows;
    if (ct_below(&r->rng, 3) == 0) { /* something for parameter compaction to do */
      snprintf(prm, sizeof prm, "{\"r\":\"t%zu/r%zu\",\"n\":%llu}", t, ri,
               (unsigned long long)ct_below(&r->rng, 3));
      params[0] =
          ct_below(&r->rng, 8) == 0 ? ue_str_pick(&r->rng, 200, UE_NUL | UE_OVER, NULL) : ct_v(prm);
      lk.key = r->key[ct_below(&r->rng, N_KEYS)];
      lk.params = params;
      lk.n_params = 1;
      sv.lookups = &lk;
      sv.n_lookups = 1;
    }
  }
  CT_OK(bs_writer_save(r->e.w, &sv, &ct_err));
  md_save(&r->m, &sv);
  r->s.saves++;
}

static void do_commit(run *r, int create_empty) {
  char lsn[32];
  bs_commit_result res;
  int i;
  lsn_fmt(lsn, ++r->lsn);
  memset(&res, 0, sizeof res);
  CT_OK(ct_commit_ce(r->e.w, lsn, create_empty, &res));
  r->s.commits++;
  if (res.checkpoint_created) {
    if (res.checkpoint != r->m.head)
      FAILR(r, "commit made checkpoint %llu, the model's head is %llu",
            (unsigned long long)res.checkpoint, (unsigned long long)r->m.head);
    r->cp = res.checkpoint;
    if (r->n_cps < sizeof r->cps / sizeof r->cps[0]) r->cps[r->n_cps++] = r->cp;
    md_reconcile(&r->m, r->e.st, r->cp);
    r->s.checkpoints++;
    for (i = 0; i < r->n_cl; i++) /* the service's checkpoint watcher */
      if (r->cl[i].conn) CT_OK(sv_observe(r->cl[i].conn, &ct_err));
  }
}

static void do_compact(run *r) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats st;
  bs_val names[3];
  int kind = (int)ct_below(&r->rng, 4), rc;
  if (!r->cp || ct_lacks(r->be, CT_LACKS_COMPACT)) return;
  if (kind != 1) {
    o.min_bucket_changes = 1;
    o.min_change_ratio = 0;
  }
  if (kind == 2) {
    o.incremental_only = 1;
    o.min_age_ms = 0;
    if (ct_below(&r->rng, 3) == 0) o.op_budget = 1 + ct_below(&r->rng, 20);
  }
  if (kind == 3) {
    size_t n = 1 + ct_below(&r->rng, 3), i;
    for (i = 0; i < n; i++) names[i] = ct_v(BUCKETS[ct_below(&r->rng, N_BUCKETS)].name);
    if (n == 3 && names[2].data == names[1].data) n = 2;
    if (n >= 2 && names[1].data == names[0].data) names[1] = ct_v(BUCKETS[N_BUCKETS - 1].name);
    o.buckets = names;
    o.n_buckets = n;
  }
  if (ct_below(&r->rng, 4) == 0 && r->n_cps) o.max_op_id = r->cps[ct_below(&r->rng, r->n_cps)];
  if (ct_below(&r->rng, 2) == 0) o.max_ops_per_txn = 1 + ct_below(&r->rng, 40);
  o.compact_parameters = ct_below(&r->rng, 3) == 0;
  memset(&ct_err, 0, sizeof ct_err);
  rc = bs_compact(&st, r->e.st, &o, &ct_err);
  if (rc)
    FAILR(r, "bs_compact (kind %d, horizon %llu): %s (%s)", kind, (unsigned long long)o.max_op_id,
          bs_strerror(rc), ct_err.msg);
  r->s.compactions++;
}

static void do_reopen(run *r) {
  int i;
  if (!r->be->persistent) return;
  do_commit(r, -1); /* a reopen discards the writer's queue: persist it first */
  for (i = 0; i < r->n_cl; i++) client_disconnect(r, i);
  CT_OK(ct_env_reopen(&r->e));
  r->s.reopens++;
}

static void do_truncate(run *r) {
  const char *t = r->table[ct_below(&r->rng, N_TABLES)];
  if (ct_lacks(r->be, CT_LACKS_TRUNCATE)) return;
  /* also of a table no save named yet: it registers nothing (contract.md 4.2) */
  CT_OK(bs_writer_truncate(r->e.w, ct_v(t), &ct_err));
  md_truncate(&r->m, t);
}

/* A client has just been sent a checkpoint line; before it reads the data, history is
 * rewritten under it: rows go, new ones come, a newer checkpoint is made and compacted. Its
 * data reads at the old checkpoint then meet MOVEs / CLEARs above it (target_op) or a torn
 * bucket (BS_EINVALIDATED). */
static void do_race(run *r) {
  int ci = (int)ct_below(&r->rng, (uint64_t)r->n_cl), n;
  tclient *t = &r->cl[ci];
  size_t k;
  if (!t->conn) client_connect(r, ci);
  for (k = 0; k < 200; k++) {
    size_t before = t->c.lines;
    sl_kind last;
    if (!client_pump(r, ci, 1)) break;
    last = t->c.last_kind;
    if (t->c.lines != before && (last == SL_CHECKPOINT || last == SL_CHECKPOINT_DIFF)) break;
  }
  /* a checkpoint the connection notes (a lagging one may serve it after the compaction) */
  for (n = (int)ct_below(&r->rng, 6); n > 0; n--) do_save(r);
  do_commit(r, 1);
  if (ct_below(&r->rng, 2)) do_truncate(r);
  for (n = (int)ct_below(&r->rng, 10); n > 0; n--) do_save(r);
  do_commit(r, 1);
  do_compact(r);
  r->s.races++;
}

/* ---- One seed ------------------------------------------------------------------------------- */

static void run_seed(const ct_backend *be, uint64_t seed, size_t steps) {
  run *r = calloc(1, sizeof *r);
  size_t k;
  int i;
  assert_non_null(r);
  r->be = be;
  r->seed = seed;
  r->rng = ct_seed(seed, 0x5eed);
  /* names: in about half the runs one table is an edge value, and two replica ids in every run
   * ("", one byte, the maximum length, non-ASCII, astral, not UTF-8) */
  for (k = 0; k < N_TABLES; k++) snprintf(r->table[k], sizeof r->table[k], "t%zu", k);
  for (k = 0; k < N_RIDS; k++) snprintf(r->rid[k], sizeof r->rid[k], "r%zu", k);
  if (ct_below(&r->rng, 2))
    ue_name(&r->rng, r->table[ct_below(&r->rng, N_TABLES)], BS_MAX_TABLE_NAME, UE_EMPTY,
            r->table[0], N_TABLES, sizeof r->table[0]);
  for (k = N_RIDS - 2; k < N_RIDS; k++)
    ue_name(&r->rng, r->rid[k], BS_MAX_REPLICA_ID, 0, r->rid[0], N_RIDS, sizeof r->rid[0]);
  for (k = 0; k < N_KEYS; k++) {
    char s[8];
    snprintf(s, sizeof s, "k%zu", k);
    /* the last key is a lookup value of the edge pool (1 / 1.0, -0, true, null, ...) */
    r->key[k] = k + 1 < N_KEYS ? ct_key_str(r->keys[k], sizeof r->keys[k], s)
                               : ue_lookup_key(&r->rng, r->keys[k], sizeof r->keys[k], 1);
  }
  /* half the seeds without the checksum cache: every checksum from the backend */
  CT_OK(ct_env_open(&r->e, be, ct_below(&r->rng, 2) ? 0 : (size_t)-1));
  {
    bs_hash h = ct_below(&r->rng, 4) == 0 ? BS_HASH_SHA256 : BS_HASH_XXH3;
    char lsn[32];
    lsn_fmt(lsn, 0);
    CT_OK(ct_env_stream(&r->e, "sync", h, lsn));
    md_init(&r->m, h);
    /* op ids from 1, or from near 2^32, 2^53 or 2^63 (contract.md 2's bound): the clients see
     * them in every line that carries one */
    r->m.head = ct_draw_start_head(&r->rng);
    if (r->m.head)
      CT_OK(ct_set_op_head(r->e.be, r->e.db, r->e.path, r->e.stream, r->m.head, &ct_err));
  }
  r->n_cl = 2 + (int)ct_below(&r->rng, 3);
  for (i = 0; i < r->n_cl; i++) r->cl[i].subs = random_subs(r);

  for (r->step = 0; r->step < steps; r->step++) {
    uint64_t a = ct_below(&r->rng, 1000);
    if (a < 450)
      do_save(r);
    else if (a < 460) {
      do_truncate(r);
    } else if (a < 480) {
      CT_OK(bs_writer_flush(NULL, r->e.w, &ct_err));
    } else if (a < 570) {
      do_commit(r, ct_below(&r->rng, 4) == 0 ? 0 : -1);
    } else if (a < 600) {
      do_compact(r);
    } else if (a < 606) {
      do_reopen(r);
    } else if (a < 626) {
      do_race(r);
    } else {
      client_step(r);
    }
  }

  /* The end: everything committed; each client converges, first on its open connection (a diff
   * or nothing at all), then from scratch on a new one. */
  do_commit(r, 1);
  if (r->cp != r->m.head)
    FAILR(r, "final checkpoint %llu, head %llu", (unsigned long long)r->cp,
          (unsigned long long)r->m.head);
  if (ct_below(&r->rng, 2)) do_compact(r);
  for (i = 0; i < r->n_cl; i++) {
    tclient *t = &r->cl[i];
    cl_client *c = &t->c;
    int pass;
    for (pass = 0; pass < 2; pass++) {
      size_t j;
      if (pass == 1) client_disconnect(r, i);
      if (!t->conn) client_connect(r, i);
      client_pump(r, i, 0);
      if (pass == 1 && (c->applied_cp != r->cp || c->target.last_op_id != r->cp))
        FAILR(r, "client %d did not converge: applied %llu, target %llu, checkpoint %llu", i,
              (unsigned long long)c->applied_cp, (unsigned long long)c->target.last_op_id,
              (unsigned long long)r->cp);
      if (!c->has_target) FAILR(r, "client %d: no checkpoint at the end", i);
      if (pass == 0) {
        /* idle: the last checkpoint sent was completed, and nothing the client syncs changed
         * after it (else a diff would have come); a new bucket set waits for a new checkpoint */
        if (c->applied_cp != c->target.last_op_id)
          FAILR(r, "client %d idle with checkpoint %llu not completed (applied %llu)", i,
                (unsigned long long)c->target.last_op_id, (unsigned long long)c->applied_cp);
        for (j = 0; j < c->target.n; j++) check_client_bucket(r, i, &c->target.b[j], r->cp);
        continue;
      }
      for (j = 0; j < N_BUCKETS; j++) {
        int sub = (t->subs >> j) & 1;
        const sl_bucket_checksum *tb = cl_target_bucket(c, BUCKETS[j].name);
        if (sub != (tb != NULL))
          FAILR(r, "client %d: bucket %s %s in the final checkpoint", i, BUCKETS[j].name,
                sub ? "missing" : "unexpected");
        if (!sub && cl_find(c, BUCKETS[j].name))
          FAILR(r, "client %d keeps bucket %s it no longer syncs", i, BUCKETS[j].name);
        if (sub) check_client_bucket(r, i, tb, r->cp);
      }
    }
    client_disconnect(r, i);
  }
  if (getenv("BS_VERBOSE") && atoi(getenv("BS_VERBOSE")))
    fprintf(stderr,
            "  %s seed %llu: %lu saves, %lu checkpoints, %lu compactions, %lu reopens, %lu "
            "connects, %lu restores, %lu forks, %lu races, %lu lines (%lu checkpoint, %lu diff, "
            "%lu data), "
            "%lu complete + %lu partial validations, %lu rows checked; withheld: %lu target_op, "
            "%lu invalidated reads; %lu checksum-invalidated, %lu superseded\n",
            be->name, (unsigned long long)seed, r->s.saves, r->s.checkpoints, r->s.compactions,
            r->s.reopens, r->s.connects, r->s.restores, r->s.forks, r->s.races, r->s.lines,
            r->s.sv.checkpoints, r->s.sv.diffs, r->s.sv.data, r->s.validations, r->s.partials,
            r->s.rows_checked, r->s.sv.withheld_target, r->s.sv.withheld_invalidated,
            r->s.sv.checksum_invalidated, r->s.sv.superseded);
  if (r->s.validations == 0) FAILR(r, "%s", "no checkpoint was ever validated");
  for (i = 0; i < r->n_cl; i++) {
    cl_free(&r->cl[i].c);
    if (r->cl[i].has_snap) cl_free(&r->cl[i].snap);
  }
  md_free(&r->m);
  ct_env_close(&r->e);
  free(r);
}

static void t_sync(void **state) {
  const ct_backend *be = *state;
  uint64_t pg = be == ct_postgres(), first = ct_first_seed("sync", be), i;
  uint64_t n = ct_env_u64("BS_SEEDS", (ct_quick() ? 3 : 8) * (pg ? 1 : 4));
  size_t steps = (size_t)ct_env_u64("BS_STEPS", ct_quick() ? 600 : 1500);
  for (i = 0; i < n; i++) {
    fprintf(stderr,
            "sync %s: seed %llu (reproduce: BS_SEED=%llu BS_SEEDS=1 BS_BACKEND=%s "
            "build/tests/test_sync)\n",
            be->name, (unsigned long long)(first + i), (unsigned long long)(first + i), be->name);
    ct_seed_log("sync", be->name, first + i);
    run_seed(be, first + i, steps);
  }
}

/* Every selected backend (ct_backends_selected: BS_BACKEND=name runs one). */
int main(void) {
  const ct_backend *be[CT_MAX_BACKENDS];
  struct CMUnitTest t[CT_MAX_BACKENDS];
  size_t i, n = ct_backends_selected(be);
  for (i = 0; i < n; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].name = be[i]->name;
    t[i].test_func = t_sync;
    t[i].initial_state = (void *)be[i];
  }
  return _cmocka_run_group_tests("sync", t, n, NULL, NULL) ? 1 : 0;
}
