/*
 * test_diff.c: the differential test. One seeded random workload generator drives the LMDB
 * backend and the memory backend side by side through the public API, call by call with the
 * same arguments, and compares every reply (status code and outputs) and, at every checkpoint
 * and at random moments, every read: bucket data (chunk by chunk, at the checkpoint, above it
 * and below it), checksums, parameter sets, checkpoint changes (their invalidate flags, and their
 * write-checkpoint users at a checkpoint), write checkpoints, stream list
 * and status, bucket listings, stat counts, verify. The workload covers every writer and
 * reader call: several named writers per stream (a streaming one, a snapshot one, a second
 * streaming one), small auto-flush bounds, truncate and drop, blocked and empty commits,
 * keepalive, snapshot_done, resume_lsn, source rows, write checkpoints in both modes with
 * cleanup, compaction (full on named buckets, parameters, defragmentation, initial replication,
 * horizons below the checkpoint, selection by thresholds, incremental), reopen, several streams, clear, terminate, report_error, explicit limits
 * (0 too). Strings come from the shared edge pool (util_edge.h). Focused tests of the rules
 * the differential run found follow it (t_resume_lsn_at_once, ...).
 *
 * Neither side is the reference: a disagreement is decided from contract.md, and fixed where it is
 * wrong. Where both sides run one shared rule they cannot disagree, so at every full check each
 * side's buckets are also checked against the contract by the tests' own code (check_sums: op
 * checksums from their fields, the bucket checksum as the reduce of its ops). Seeds: BS_SEED (first; default: the pair's block, ct_first_seed), BS_SEEDS (how many:
 * 240 quick / 400 full beside memory, 10 / 50 beside postgres), BS_STEPS
 * (steps per seed: 300 quick / 1500 full). A failure prints the seed, the step and the last
 * calls; reproduce with BS_SEED=n BS_SEEDS=1 (BS_VERBOSE=1 prints every call).
 */
#include "util_contract.h"
#include "util_edge.h"
#include "util_fault.h"
#include "util_head.h"
#include "util_model.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Switches per area: off = the generator stays clear of it (or compares it leniently). The first
 * three were fixed by another change at the same time and are on since it landed. */
#define SW_EMPTY_DISTINCT     1 /* "" served as "", distinct from absent */
#define SW_WCP_CLEANUP        1 /* delete_checkpoint_requests_before */
#define SW_LAST_WCP           1 /* last_write_checkpoint replies */
/* Selection by the thresholds (and the initial-replication count, bs_bucket_info.changes): every
 * backend weighs the growth of the count since the last full or initial compaction with
 * bs__compact_bucket_due (the memory backend used the ops above its horizon until this test). */
#define SW_COMPACT_THRESHOLDS 1
/* Defragmentation: every backend counts a bucket's live rows from the source records'
 * memberships (a PUT orphaned by an INSERT over an existing record is not live: contract.md 4.1,
 * an INSERT does not read the previous record) and decide with bs__compact_defrag_due. */
#define SW_DEFRAG             1
/* Incremental compaction and INSERTs over existing records are always drawn: every backend logs
 * the supersessions the source records name (an INSERT over a record reads none, so logs none)
 * and convert exactly those (compact.c's plan, contract.md 6). */

#define N_SIDES    2
#define MAX_STREAM 3
/* per stream: 0 "main", 1 "snap" (snapshot mode), 2 "w2" (a second streaming writer: BS_EBUSY
 * on both sides while main is open, and main's while w2 is) */
#define N_WRITERS  3
#define N_TABLES   3
#define N_RIDS     10
#define N_BUCKETS  7
#define N_OTYPES   3
#define N_USERS    5
#define N_KEYS     6
#define N_TRACE    24
#define N_CPS      8

/* Side 0 is LMDB; side 1 the backend under comparison (memory; postgres with BS_TEST_PG_URL). */
#define SIDE_NAME(i) (g_run->s[i].be->name)

/* ---- A string builder for replies ------------------------------------------------------------ */
typedef struct sb {
  char *p;
  size_t n, cap;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
  b->p = ct_grow(b->p, &b->cap, b->n + n + 1, 1);
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sb *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Bytes: ~ when absent (data NULL), else quoted with escapes; long values as length + hash. */
static void sb_val(sb *b, bs_val v) {
  const unsigned char *p = v.data;
  size_t i;
  if (!v.data && !SW_EMPTY_DISTINCT) v.data = "";
  if (!v.data) {
    sb_add(b, "~", 1);
    return;
  }
  if (v.size > 48) {
    sb_printf(b, "<%zu:%08x>", v.size, md_hash(BS_HASH_XXH3, v.data, v.size));
    return;
  }
  sb_add(b, "\"", 1);
  for (i = 0; i < v.size; i++) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\')
      sb_add(b, (const char *)p + i, 1);
    else
      sb_printf(b, "\\x%02x", p[i]);
  }
  sb_add(b, "\"", 1);
}

/* ---- The two sides --------------------------------------------------------------------------- */
typedef struct side {
  const ct_backend *be;
  char dir[64], path[96];
  bs_db *db;
  bs_storage *st[MAX_STREAM];
  bs_writer *w[MAX_STREAM][N_WRITERS];
} side;

typedef struct wspec { /* how writer slot (stream, k) is opened: the same on both sides */
  int open;
  bs_writer_options o;
} wspec;

typedef struct pool { /* byte strings owned by the run */
  bs_val v[16];
  size_t n;
} pool;

typedef struct run {
  ct_rng rng;
  uint64_t seed;
  size_t step;
  side s[N_SIDES];
  uint32_t ids[MAX_STREAM];
  bs_hash hash[MAX_STREAM];
  size_t n_streams;
  int terminated[MAX_STREAM];
  wspec ws[MAX_STREAM][N_WRITERS];
  uint64_t lsn; /* LSN counter: LSNs are %08llx of it */
  /* the last N_CPS checkpoints check_stream saw per stream: checkpoint_changes' `from` is often
   * one, as a sync client's is, so that the users filed at `from` itself are reached */
  uint64_t cps[MAX_STREAM][N_CPS];
  size_t n_cps[MAX_STREAM];
  int64_t now_ms; /* the workload's clock for requested_at */
  pool tables, rids, buckets, otypes, users, keys, data;
  char trace[N_TRACE][160];
  size_t n_trace;
  uint64_t calls_hash; /* of every call noted: the seed's call trace */
  int verbose;
  unsigned long calls, reads;
  unsigned lacks; /* CT_LACKS_* of either side: the generator stays clear of those calls */
} run;

static run *g_run; /* for failure messages */

static void dump_trace(void) {
  run *r = g_run;
  size_t i, first = r->n_trace > N_TRACE ? r->n_trace - N_TRACE : 0;
  fprintf(stderr, "last calls (seed %llu, step %zu):\n", (unsigned long long)r->seed, r->step);
  for (i = first; i < r->n_trace; i++) fprintf(stderr, "  %s\n", r->trace[i % N_TRACE]);
}

static void note(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(run *r, const char *fmt, ...) {
  va_list ap;
  char *t = r->trace[r->n_trace++ % N_TRACE];
  va_start(ap, fmt);
  vsnprintf(t, sizeof r->trace[0], fmt, ap);
  va_end(ap);
  ct_trace(&r->calls_hash, t, strlen(t) + 1);
  if (r->verbose) fprintf(stderr, "[%zu] %s\n", r->step, t);
}

#define DIFF_FAIL(...)                                                                             \
  do {                                                                                             \
    dump_trace();                                                                                  \
    fail_msg(__VA_ARGS__);                                                                         \
  } while (0)

/* Compares the two sides' replies of one call: status, then the outputs written to out[]. */
static void same(run *r, const char *what, const int rc[N_SIDES], sb out[N_SIDES]) {
  r->calls++;
  if (r->verbose > 2)
    fprintf(stderr, "    %s -> %s %.300s\n", what, bs_strerror(rc[0]), out[0].p ? out[0].p : "");
  if (rc[0] != rc[1])
    DIFF_FAIL("%s: %s %s, %s %s (seed %llu step %zu; reproduce: BS_SEED=%llu BS_SEEDS=1)", what,
              SIDE_NAME(0), bs_strerror(rc[0]), SIDE_NAME(1), bs_strerror(rc[1]),
              (unsigned long long)r->seed, r->step, (unsigned long long)r->seed);
  const char *a = out[0].p ? out[0].p : "", *b = out[1].p ? out[1].p : "";
  if (strcmp(a, b) != 0) {
    size_t d = 0, from;
    while (a[d] && a[d] == b[d]) d++;
    from = d > 300 ? d - 300 : 0; /* from a little before the first difference */
    fprintf(stderr, "  %s: ...%.900s\n  %s: ...%.900s\n", SIDE_NAME(0),
            a + (from < strlen(a) ? from : strlen(a)), SIDE_NAME(1),
            b + (from < strlen(b) ? from : strlen(b)));
    DIFF_FAIL("%s: replies differ at byte %zu (seed %llu step %zu; reproduce: BS_SEED=%llu "
              "BS_SEEDS=1)",
              what, d, (unsigned long long)r->seed, r->step, (unsigned long long)r->seed);
  }
  for (int i = 0; i < N_SIDES; i++) {
    free(out[i].p);
    memset(&out[i], 0, sizeof out[i]);
  }
}

/* Runs CALL (an expression using `s`, the side, and `o`, its sb) on both sides, then compares.
 * CALL is evaluated once per side: draw random arguments before it, never inside. */
#define BOTH(r, what, CALL)                                                                        \
  do {                                                                                             \
    int rc_[N_SIDES];                                                                              \
    sb out_[N_SIDES];                                                                              \
    memset(out_, 0, sizeof out_);                                                                  \
    for (int i_ = 0; i_ < N_SIDES; i_++) {                                                         \
      side *s = &(r)->s[i_];                                                                       \
      sb *o = &out_[i_];                                                                           \
      bs_error e_ = {0, ""};                                                                       \
      (void)s;                                                                                     \
      (void)o;                                                                                     \
      rc_[i_] = (CALL);                                                                            \
      (void)e_;                                                                                    \
    }                                                                                              \
    same((r), (what), rc_, out_);                                                                  \
  } while (0)
#define E (&e_)

/* ---- Handles --------------------------------------------------------------------------------- */

static int side_open_db(side *s) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0, ""};
  int rc;
  oo.flags = BS_OPEN_NOSYNC;
  if (s->be->open_db)
    rc = s->be->open_db(s->be, s->path, &oo, &s->db, &err);
  else if (s->be->persistent)
    rc = bs_open(&s->db, s->path, &oo, &err);
  else
    rc = bs_open_memory(&s->db, &oo, &err);
  if (rc) fprintf(stderr, "open %s: %s (%s)\n", s->be->name, bs_strerror(rc), err.msg);
  return rc;
}

static void close_writer(run *r, size_t x, int k) {
  for (int i = 0; i < N_SIDES; i++) {
    bs_writer_close(r->s[i].w[x][k]);
    r->s[i].w[x][k] = NULL;
  }
}

/* Opens writer slot (x, k) on both sides with r->ws[x][k]; the replies must agree. */
static void open_writer(run *r, size_t x, int k) {
  wspec *w = &r->ws[x][k];
  close_writer(r, x, k);
  note(r, "writer_open s%zu w%d snapshot %d create_empty %d max_records %zu max_bytes %zu", x, k,
       w->o.snapshot, w->o.create_empty, w->o.max_records, w->o.max_bytes);
  BOTH(r, "writer_open", bs_writer_open(&s->w[x][k], s->st[x], &w->o, E));
  w->open = r->s[0].w[x][k] != NULL;
}

static void random_writer_spec(run *r, size_t x, int k) {
  wspec *w = &r->ws[x][k];
  bs_writer_options o = BS_WRITER_OPTIONS_INIT;
  o.snapshot = k == 1;
  if (ct_below(&r->rng, 4) == 0) o.create_empty = 0;
  if (ct_below(&r->rng, 3) == 0) o.max_records = 1 + ct_below(&r->rng, 6);
  if (ct_below(&r->rng, 5) == 0) o.max_bytes = 1 + ct_below(&r->rng, 3000);
  w->o = o;
}

static void open_storages(run *r) {
  for (size_t x = 0; x < r->n_streams; x++) {
    BOTH(r, "storage_open", bs_storage_open(&s->st[x], s->db, r->ids[x], E));
    for (int k = 0; k < N_WRITERS; k++)
      if (r->ws[x][k].open) open_writer(r, x, k);
  }
}

static void close_all(run *r, int keep_db) {
  for (int i = 0; i < N_SIDES; i++) {
    side *s = &r->s[i];
    for (size_t x = 0; x < MAX_STREAM; x++) {
      for (int k = 0; k < N_WRITERS; k++) bs_writer_close(s->w[x][k]);
      bs_storage_close(s->st[x]);
    }
    memset(s->w, 0, sizeof s->w);
    memset(s->st, 0, sizeof s->st);
    if (!keep_db || s->be->persistent) {
      bs_close(s->db);
      s->db = NULL;
    }
  }
}

/* Like a crash: writers closed without flushing; LMDB reopens its file, the memory backend (no
 * file) keeps its store and only drops the handles (as the driver's `reopen`). */
static void do_reopen(run *r) {
  note(r, "reopen");
  close_all(r, 1);
  for (int i = 0; i < N_SIDES; i++)
    if (!r->s[i].db && side_open_db(&r->s[i]) != BS_OK) DIFF_FAIL("reopen of %s", SIDE_NAME(i));
  open_storages(r);
}

/* ---- Value pools ----------------------------------------------------------------------------- */

static void pool_add(pool *p, bs_val v) {
  char *c = malloc(v.size + 1);
  assert_non_null(c);
  if (v.size) memcpy(c, v.data, v.size);
  c[v.size] = 0;
  p->v[p->n].data = v.data ? c : NULL;
  p->v[p->n].size = v.size;
  if (!v.data) free(c);
  p->n++;
}

static void pool_free(pool *p) {
  for (size_t i = 0; i < p->n; i++) free((void *)p->v[i].data);
  p->n = 0;
}

static bs_val pick(run *r, const pool *p) {
  return p->v[ct_below(&r->rng, p->n)];
}

/* n plain values (prefix + index), then edge values of at most max bytes. */
static void pool_fill(run *r, pool *p, const char *prefix, size_t plain, size_t n, size_t max,
                      unsigned avoid) {
  char tmp[32];
  size_t i;
  for (i = 0; i < plain; i++) {
    snprintf(tmp, sizeof tmp, "%s%zu", prefix, i);
    pool_add(p, ct_v(tmp));
  }
  for (; i < n; i++) pool_add(p, ue_str_pick(&r->rng, max, avoid, NULL));
}

static void pools_init(run *r) {
  pool_fill(r, &r->tables, "t", 2, N_TABLES, BS_MAX_TABLE_NAME, UE_EMPTY);
  pool_fill(r, &r->rids, "r", 6, N_RIDS, BS_MAX_REPLICA_ID, 0);
  pool_fill(r, &r->buckets, "b", 3, N_BUCKETS, BS_MAX_BUCKET_NAME, 0);
  pool_fill(r, &r->otypes, "todos", 1, N_OTYPES, 300, UE_OVER);
  pool_fill(r, &r->users, "u", 2, N_USERS, BS_MAX_USER_ID, 0);
  pool_fill(r, &r->data, "{\"v\":", 3, 8, 4000, UE_OVER);
  /* one value about LMDB's chunk size (not 64 KiB or 1 MiB: the pool's values are drawn often,
   * every check reads every bucket on both sides, and 64 KiB doubled the run's time) */
  pool_add(&r->data, ue_data(&r->rng, 4100));
  for (size_t i = 0; i < N_KEYS; i++) {
    unsigned char buf[BS_MAX_LOOKUP_KEY + 16];
    pool_add(&r->keys, ue_lookup_key(&r->rng, buf, sizeof buf, 1));
  }
}

static void pools_free(run *r) {
  pool_free(&r->tables), pool_free(&r->rids), pool_free(&r->buckets), pool_free(&r->otypes);
  pool_free(&r->users), pool_free(&r->keys), pool_free(&r->data);
}

static int bs_val_eq_(bs_val a, bs_val b) {
  return a.size == b.size && (a.size == 0 || memcmp(a.data, b.data, a.size) == 0);
}

/* ---- Reads ----------------------------------------------------------------------------------- */

static int status_of(bs_storage *st, sb *o, bs_error *err) {
  bs_status s;
  int rc = bs_get_status(&s, st, err);
  if (rc) return rc;
  sb_printf(o, "state %d snapshot_done %d checkpoint %" PRIu64 " last_persisted %" PRIu64 " lsn ",
            (int)s.state, s.snapshot_done, s.checkpoint, s.last_persisted_op);
  if (s.has_lsn) sb_val(o, (bs_val){s.lsn, s.lsn_size});
  sb_printf(o, " resume ");
  if (s.has_resume_lsn) sb_val(o, (bs_val){s.resume_lsn, s.resume_lsn_size});
  sb_printf(o, " error \"%s\"", s.last_error);
  return BS_OK;
}

static int checkpoint_of(bs_storage *st, sb *o, bs_error *err) {
  bs_checkpoint c;
  int rc = bs_get_checkpoint(&c, st, err);
  if (rc) return rc;
  sb_printf(o, "%" PRIu64 " ", c.op_id);
  if (c.has_lsn) sb_val(o, (bs_val){c.lsn, c.lsn_size});
  return BS_OK;
}

static int on_stream(const bs_stream_info *i, void *payload) {
  sb *o = payload;
  sb_printf(o, "[%u ", i->id);
  sb_val(o, i->name);
  sb_printf(o, " state %d hash %d]", (int)i->state, (int)i->hash);
  return 0;
}

static int on_bucket_info(const bs_bucket_info *i, void *payload) {
  sb *o = payload;
  sb_val(o, i->name);
  sb_printf(o, " %u/%" PRIu64 " last %" PRIu64 " ch %" PRIu64 "; ", i->checksum, i->count,
            i->last_op, i->changes);
  return 0;
}

/* Chunks of bucket_data calls, and each bucket's position for the next call of a client. */
typedef struct bd_ctx {
  sb *o;
  bs_bucket_request *req;
  size_t n;
} bd_ctx;

static int on_chunk(const bs_chunk *c, void *payload) {
  bd_ctx *d = payload;
  sb *o = d->o;
  sb_printf(o, "\n chunk ");
  sb_val(o, c->bucket);
  sb_printf(o, " after %" PRIu64 " next %" PRIu64 " more %d target %" PRIu64 ":", c->after,
            c->next_after, c->has_more, c->target_op);
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    sb_printf(o, " {%" PRIu64 " %s %u t%" PRIu64 " ", op->op_id, ct_type_name(op->type),
              op->checksum, op->target_op);
    sb_val(o, op->object_type);
    sb_add(o, " ", 1);
    sb_val(o, op->object_id);
    sb_add(o, " ", 1);
    sb_val(o, op->subkey);
    sb_add(o, " ", 1);
    sb_val(o, op->data);
    sb_add(o, "}", 1);
  }
  for (size_t k = 0; k < d->n; k++)
    if (c->n_ops && bs_val_eq_(d->req[k].bucket, c->bucket)) d->req[k].after = c->next_after;
  return 0;
}

/* bucket_data calls repeated while has_more, as a client does. */
static int bucket_data_all(bs_storage *st, uint64_t C, const bs_bucket_request *req0, size_t n,
                           const bs_batch_options *bo, sb *o, bs_error *err) {
  bs_bucket_request req[N_BUCKETS];
  bd_ctx d = {o, req, n};
  int more = 1, rc = BS_OK, rounds = 0;
  if (n) memcpy(req, req0, n * sizeof *req);
  while (more && rc == BS_OK && rounds++ < 100000) {
    more = 0;
    rc = bs_get_bucket_data(&more, st, C, req, n, bo, on_chunk, &d, err);
    sb_printf(o, "\n more %d", more);
  }
  return rc;
}

static int checksums_of(bs_storage *st, uint64_t C, const bs_val *b, size_t n, sb *o,
                        bs_error *err) {
  bs_checksum cs[N_BUCKETS];
  int rc = bs_get_checksums(cs, st, C, b, n, err);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) sb_printf(o, "%u/%" PRIu64 " ", cs[i].checksum, cs[i].count);
  return BS_OK;
}

/* Parameter rows arrive in an order contract.md does not fix: collect, sort, join. */
static void strs_out(ft_strs *s, sb *o) {
  ft_strs_sort(s);
  for (size_t i = 0; i < s->n; i++) sb_printf(o, "%s,", s->v[i]);
  ft_strs_free(s);
}

static int params_of(bs_storage *st, uint64_t C, const bs_val *keys, size_t n, size_t limit, sb *o,
                     bs_error *err) {
  ft_strs s = {0};
  int rc = bs_get_parameter_sets(st, C, keys, n, limit, ft_strs_add, &s, err);
  strs_out(&s, o); /* on BS_ELIMIT how many came before it is not part of the contract */
  if (rc) {
    free(o->p);
    memset(o, 0, sizeof *o);
  }
  return rc;
}

/* Checkpoint changes: contract.md 5.1 allows extra entries (LMDB reports per flush, the memory backend
 * per op), so the buckets and lookups are not compared with each other: each side must hold every
 * bucket that a read shows an op of in (from, to] and every lookup whose parameter sets differ
 * between from and to, unless it says "invalidate". The two invalidate flags follow one rule (a
 * range from below the change fence; more than 1000 entries, which this workload never reaches)
 * and are compared. The write-checkpoint users are filed at a flush's op head or a checkpoint, so
 * at a checkpoint (no flush spans it) every backend lists the same users, which are compared
 * there; a `to` inside a flush may give one side the flush's users as extras. */
typedef struct changes {
  int inv_b, inv_p;
  ft_strs b, l, u;
} changes;

static int on_changes(const bs_checkpoint_changes *c, void *payload) {
  changes *ch = payload;
  ch->inv_b = c->invalidate_data_buckets;
  ch->inv_p = c->invalidate_parameter_buckets;
  for (size_t i = 0; i < c->n_updated_buckets; i++)
    if (ft_strs_add(&c->updated_buckets[i], &ch->b)) return BS_ENOMEM;
  for (size_t i = 0; i < c->n_updated_lookups; i++)
    if (ft_strs_add(&c->updated_lookups[i], &ch->l)) return BS_ENOMEM;
  for (size_t i = 0; i < c->n_updated_write_checkpoint_users; i++)
    if (ft_strs_add(&c->updated_write_checkpoint_users[i], &ch->u)) return BS_ENOMEM;
  return 0;
}

static int has_ops_in(bs_storage *st, bs_val bucket, uint64_t from, uint64_t to) {
  bs_bucket_request q = {bucket, from};
  sb o = {0};
  bs_error err;
  int rc = bucket_data_all(st, to, &q, 1, NULL, &o, &err), hit = rc == BS_OK && strstr(o.p, " {");
  free(o.p);
  return hit;
}

static int params_differ(bs_storage *st, bs_val key, uint64_t from, uint64_t to) {
  sb a = {0}, b = {0};
  bs_error err;
  int ra = params_of(st, from, &key, 1, 1000000, &a, &err);
  int rb = params_of(st, to, &key, 1, 1000000, &b, &err);
  int differ = ra == BS_OK && rb == BS_OK && strcmp(a.p ? a.p : "", b.p ? b.p : "") != 0;
  free(a.p), free(b.p);
  return differ;
}

/* Checks side_i's checkpoint changes of (from, to] for misses (a failure) and leaves in *ch its
 * flags and users. */
static int changes_of(run *r, int side_i, size_t x, uint64_t from, uint64_t to, changes *ch,
                      bs_error *err) {
  bs_storage *st = r->s[side_i].st[x];
  sb o = {0};
  int rc = bs_get_checkpoint_changes(st, from, to, on_changes, ch, err);
  if (rc == BS_OK) {
    for (size_t i = 0; i < r->buckets.n && !ch->inv_b; i++) {
      bs_val b = r->buckets.v[i];
      if (b.size && b.size <= BS_MAX_BUCKET_NAME && !ft_strs_has(&ch->b, b) &&
          has_ops_in(st, b, from, to)) {
        sb_printf(&o, "misses bucket #%zu ", i);
        sb_val(&o, b);
      }
    }
    for (size_t i = 0; i < r->keys.n && !ch->inv_p; i++)
      if (!ft_strs_has(&ch->l, r->keys.v[i]) && params_differ(st, r->keys.v[i], from, to))
        sb_printf(&o, "misses lookup #%zu ", i);
  }
  ft_strs_free(&ch->b);
  ft_strs_free(&ch->l);
  if (o.n)
    DIFF_FAIL("checkpoint_changes (%" PRIu64 ", %" PRIu64 "] of %s: %s (seed %llu step %zu)", from,
              to, SIDE_NAME(side_i), o.p, (unsigned long long)r->seed, r->step);
  return rc;
}

/* The flags of both sides, and at a checkpoint (users) their users, compared. PostgreSQL also
 * invalidates below the aged checkpoint of its last compaction, which pruned the change records
 * there (contract.md 5.1): it may invalidate where LMDB does not (never less), and its users are
 * then not compared. */
static void compare_changes(run *r, size_t x, uint64_t from, uint64_t to, int users) {
  changes ch[N_SIDES];
  sb out[N_SIDES];
  int rc[N_SIDES], pruned;
  char what[96];
  memset(ch, 0, sizeof ch);
  memset(out, 0, sizeof out);
  for (int i = 0; i < N_SIDES; i++) {
    bs_error err = {0, ""};
    rc[i] = changes_of(r, i, x, from, to, &ch[i], &err);
  }
  pruned = !strcmp(SIDE_NAME(1), "postgres") && (ch[1].inv_b || ch[1].inv_p) &&
           ch[1].inv_b >= ch[0].inv_b && ch[1].inv_p >= ch[0].inv_p;
  for (int i = 0; i < N_SIDES; i++) {
    if (rc[i] == BS_OK && !pruned) {
      sb_printf(&out[i], "invalidate buckets %d lookups %d", ch[i].inv_b, ch[i].inv_p);
      if (users) {
        sb_printf(&out[i], " users ");
        strs_out(&ch[i].u, &out[i]);
      }
    }
    ft_strs_free(&ch[i].u);
  }
  snprintf(what, sizeof what, "checkpoint_changes s%zu (%" PRIu64 ", %" PRIu64 "]", x, from, to);
  same(r, what, rc, out);
}

static int stat_of(bs_db *db, sb *o, bs_error *err) {
  bs_stat s;
  int rc = bs_db_stat(&s, db, err);
  if (rc) return rc;
  /* file_bytes is the backend's own measure */
  sb_printf(o,
            "streams %" PRIu64 " buckets %" PRIu64 " ops %" PRIu64 "/%" PRIu64 "/%" PRIu64
            "/%" PRIu64 " params %" PRIu64 " sources %" PRIu64 " wcp %" PRIu64,
            s.streams, s.buckets, s.ops_put, s.ops_remove, s.ops_move, s.ops_clear,
            s.parameter_entries, s.source_records, s.write_checkpoints);
  return BS_OK;
}

static void on_problem(const char *p, void *payload) {
  sb_printf(payload, "%s; ", p);
}

static int last_wcp_of(bs_storage *st, bs_val user, const bs_head *h, size_t nh, sb *o,
                       bs_error *err) {
  uint64_t id = 0;
  int found = 0, rc = bs_last_write_checkpoint(&id, &found, st, user, h, nh, err);
  if (rc == BS_OK) sb_printf(o, "found %d id %" PRIu64, found, found ? id : 0);
  return rc;
}

/* Reads of stream x at C, with the call shapes drawn at random (the same on both sides). */
static void read_at(run *r, size_t x, uint64_t C) {
  bs_bucket_request req[N_BUCKETS];
  bs_val names[N_BUCKETS];
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  size_t n = 0, i;
  char what[96];
  for (i = 0; i < r->buckets.n; i++)
    if (ct_below(&r->rng, 3) && r->buckets.v[i].size && r->buckets.v[i].size <= BS_MAX_BUCKET_NAME)
      names[n++] = r->buckets.v[i];
  /* the API serves buckets in byte order of name and refuses duplicates the same way on both */
  for (i = 0; i < n; i++) {
    req[i].bucket = names[i];
    req[i].after = ct_below(&r->rng, 4) ? 0 : ue_op_id(&r->rng, C);
  }
  if (ct_below(&r->rng, 2)) bo.limit = ct_below(&r->rng, 30); /* 0: BS_EINVAL */
  if (ct_below(&r->rng, 2)) bo.chunk_bytes = 1 + ct_below(&r->rng, 5000);
  if (ct_below(&r->rng, 4) == 0) bo.max_bytes = 1 + ct_below(&r->rng, 20000);
  r->reads++;
  snprintf(what, sizeof what, "bucket_data s%zu C %" PRIu64 " limit %zu chunk %zu max %zu", x, C,
           bo.limit, bo.chunk_bytes, bo.max_bytes);
  BOTH(r, what, bucket_data_all(s->st[x], C, req, n, &bo, o, E));
  snprintf(what, sizeof what, "checksums s%zu C %" PRIu64, x, C);
  BOTH(r, what, checksums_of(s->st[x], C, names, n, o, E));
  {
    bs_val keys[N_KEYS];
    size_t nk = 0, limit = ct_below(&r->rng, 3) ? 100000 : ct_below(&r->rng, 5); /* 0: no row */
    for (i = 0; i < r->keys.n; i++)
      if (ct_below(&r->rng, 2)) keys[nk++] = r->keys.v[i];
    snprintf(what, sizeof what, "parameter_sets s%zu C %" PRIu64 " limit %zu", x, C, limit);
    BOTH(r, what, params_of(s->st[x], C, keys, nk, limit, o, E));
  }
}

static uint64_t head_of(run *r, size_t x, uint64_t *cp) {
  bs_status st;
  bs_error err;
  if (bs_get_status(&st, r->s[0].st[x], &err) != BS_OK) return 0;
  if (cp) *cp = st.checkpoint;
  return st.last_persisted_op;
}

/* What the contract says of each side's reads at C, by code of the tests' own (util_model.c):
 * the sides agreeing is not enough where they run one shared rule (checksums, the chunker,
 * compaction's MOVEs and CLEARs). Each bucket read whole from 0 (unless torn): every PUT and
 * REMOVE carries the checksum of its fields (contract.md 3), the bucket checksum at C is the
 * reduced ops' (remainder plus live rows: contract.md 9, property 2) and its count the ops'. */
static void check_sums(run *r, size_t x, uint64_t C) {
  for (int i = 0; i < N_SIDES; i++) {
    bs_storage *st = r->s[i].st[x];
    for (size_t b = 0; b < r->buckets.n; b++) {
      bs_val name = r->buckets.v[b];
      ct_oplist l;
      bs_checksum cs;
      md_reduced red;
      int rc;
      if (!name.size || name.size > BS_MAX_BUCKET_NAME) continue;
      memset(&l, 0, sizeof l);
      rc = ct_read_bucket_opts(st, C, name.data, name.size, 0, 0, 0, &l);
      if (rc == BS_OK) rc = ct_checksum_n(st, C, name.data, name.size, &cs);
      if (rc != BS_OK) { /* torn, terminated, ...: compared between the sides only */
        ct_oplist_free(&l);
        continue;
      }
      for (size_t k = 0; k < l.n; k++) {
        uint32_t want;
        if (md_op_checksum(r->hash[x], &l.v[k], &want) && want != l.v[k].checksum)
          DIFF_FAIL("%s s%zu C %" PRIu64 " bucket #%zu: %s %" PRIu64 " carries checksum %u, its "
                    "fields give %u (seed %llu step %zu)",
                    SIDE_NAME(i), x, C, b, ct_type_name(l.v[k].type), l.v[k].op_id, l.v[k].checksum,
                    want, (unsigned long long)r->seed, r->step);
      }
      md_reduce_init(&red);
      md_reduce_ops(&red, l.v, l.n);
      if (cs.checksum != md_reduced_total(&red) || cs.count != l.n)
        DIFF_FAIL("%s s%zu C %" PRIu64 " bucket #%zu: checksum %u count %" PRIu64 ", its %zu ops "
                  "reduce to %u (seed %llu step %zu)",
                  SIDE_NAME(i), x, C, b, cs.checksum, cs.count, l.n, md_reduced_total(&red),
                  (unsigned long long)r->seed, r->step);
      md_reduce_free(&red);
      ct_oplist_free(&l);
    }
  }
}

/* bs_list_buckets by the tests' own code (storage.h bs_bucket_info): each side lists the buckets
 * that have stored ops, each once, in ascending byte order of their names, each with its ops'
 * count, the wrapping sum of their checksums and the highest op id, as the bucket read whole at
 * the op head gives them; a listing after a name is the rest of the whole listing. */
typedef struct listed {
  bs_bucket_info v[64];
  char names[64][BS_MAX_BUCKET_NAME];
  size_t n, over;
} listed;

static int on_listed(const bs_bucket_info *i, void *payload) {
  listed *l = payload;
  if (l->n == 64) return ++l->over, 0;
  l->v[l->n] = *i;
  memcpy(l->names[l->n], i->name.data, i->name.size);
  l->v[l->n].name.data = l->names[l->n];
  l->n++;
  return 0;
}

static int name_cmp(bs_val a, bs_val b) {
  int c = memcmp(a.data, b.data, a.size < b.size ? a.size : b.size);
  return c ? c : (a.size > b.size) - (a.size < b.size);
}

static void check_listing(run *r, size_t x) {
  for (int i = 0; i < N_SIDES; i++) {
    bs_storage *st = r->s[i].st[x];
    bs_status ss;
    uint64_t head;
    listed l, tail;
    size_t cut;
    memset(&l, 0, sizeof l);
    memset(&tail, 0, sizeof tail);
    if (bs_get_status(&ss, st, &ct_err) != BS_OK ||
        bs_list_buckets(st, (bs_val){NULL, 0}, on_listed, &l, &ct_err) != BS_OK || l.over)
      continue; /* terminated, ...: compared between the sides only */
    head = ss.last_persisted_op;
    for (size_t k = 1; k < l.n; k++)
      if (name_cmp(l.v[k - 1].name, l.v[k].name) >= 0)
        DIFF_FAIL("%s s%zu list_buckets: entry %zu not after entry %zu (seed %llu step %zu)",
                  SIDE_NAME(i), x, k, k - 1, (unsigned long long)r->seed, r->step);
    for (size_t b = 0; b < r->buckets.n; b++) {
      bs_val name = r->buckets.v[b];
      ct_oplist ops;
      uint32_t sum = 0;
      size_t at = 0;
      if (!name.size || name.size > BS_MAX_BUCKET_NAME) continue;
      memset(&ops, 0, sizeof ops);
      if (ct_read_bucket_opts(st, head, name.data, name.size, 0, 0, 0, &ops) != BS_OK) {
        ct_oplist_free(&ops);
        continue; /* torn at the head: a compaction running, compared between the sides only */
      }
      for (size_t k = 0; k < ops.n; k++) sum += ops.v[k].checksum;
      while (at < l.n && name_cmp(l.v[at].name, name) != 0) at++;
      if ((at < l.n) != (ops.n > 0) ||
          (ops.n && (l.v[at].count != ops.n || l.v[at].checksum != sum ||
                     l.v[at].last_op != ops.v[ops.n - 1].op_id)))
        DIFF_FAIL("%s s%zu list_buckets: bucket #%zu listed %d (%u/%" PRIu64 " last %" PRIu64
                  "), its %zu ops read at %" PRIu64 " sum %u, last %" PRIu64 " (seed %llu step "
                  "%zu)",
                  SIDE_NAME(i), x, b, at < l.n, at < l.n ? l.v[at].checksum : 0,
                  at < l.n ? l.v[at].count : 0, at < l.n ? l.v[at].last_op : 0, ops.n, head, sum,
                  ops.n ? ops.v[ops.n - 1].op_id : 0, (unsigned long long)r->seed, r->step);
      ct_oplist_free(&ops);
    }
    if (!l.n) continue;
    cut = ct_below(&r->rng, l.n);
    if (bs_list_buckets(st, l.v[cut].name, on_listed, &tail, &ct_err) != BS_OK ||
        tail.n != l.n - cut - 1 || (tail.n && name_cmp(tail.v[0].name, l.v[cut + 1].name) != 0))
      DIFF_FAIL("%s s%zu list_buckets after entry %zu of %zu: %zu entries (seed %llu step %zu)",
                SIDE_NAME(i), x, cut, l.n, tail.n, (unsigned long long)r->seed, r->step);
  }
}

/* Everything of stream x that can be compared, at the checkpoint and around it. */
static void check_stream(run *r, size_t x, int full) {
  uint64_t cp = 0, head = head_of(r, x, &cp);
  char what[64];
  snprintf(what, sizeof what, "get_status s%zu", x);
  BOTH(r, what, status_of(s->st[x], o, E));
  snprintf(what, sizeof what, "get_checkpoint s%zu", x);
  BOTH(r, what, checkpoint_of(s->st[x], o, E));
  read_at(r, x, cp);
  if (cp && (!r->n_cps[x] || r->cps[x][(r->n_cps[x] - 1) % N_CPS] != cp))
    r->cps[x][r->n_cps[x]++ % N_CPS] = cp;
  if (!full) return;
  check_sums(r, x, cp);
  read_at(r, x, cp + 1);
  read_at(r, x, head);
  read_at(r, x, ue_op_id(&r->rng, head)); /* near the head, or an edge: 2^53, 2^63, ... */
  snprintf(what, sizeof what, "list_buckets s%zu", x);
  BOTH(r, what, bs_list_buckets(s->st[x], (bs_val){NULL, 0}, on_bucket_info, o, E));
  check_listing(r, x);
  {
    uint64_t to = ct_below(&r->rng, 2) ? cp : ct_below(&r->rng, head + 2), from = 0;
    size_t n = r->n_cps[x] < N_CPS ? r->n_cps[x] : N_CPS, k = ct_below(&r->rng, 3);
    if (k == 1) from = ct_below(&r->rng, to + 1);
    if (k == 2 && n) from = r->cps[x][ct_below(&r->rng, n)];
    if (from > to) from = to;
    if (ct_below(&r->rng, 6) == 0) /* op id edges, from > to among them */
      to = ue_op_id(&r->rng, head), from = ue_op_id(&r->rng, to);
    compare_changes(r, x, from, to, to == cp);
  }
  if (SW_LAST_WCP) {
    bs_head h = {ct_v("1"), ct_v("")};
    char lsn[32];
    snprintf(lsn, sizeof lsn, "%08llx", (unsigned long long)ct_below(&r->rng, r->lsn + 2));
    h.lsn = ct_v(lsn);
    for (size_t i = 0; i < r->users.n; i++) {
      snprintf(what, sizeof what, "last_write_checkpoint s%zu user #%zu", x, i);
      size_t nh = ct_below(&r->rng, 2); /* drawn once: BOTH evaluates its call per side */
      BOTH(r, what, last_wcp_of(s->st[x], r->users.v[i], &h, nh, o, E));
    }
  }
}

static void check_db(run *r) {
  uint64_t problems[N_SIDES] = {0, 0};
  BOTH(r, "stream_list", bs_stream_list(s->db, on_stream, o, E));
  BOTH(r, "db_stat", stat_of(s->db, o, E));
  BOTH(r, "db_verify", bs_db_verify(&problems[s - r->s], s->db, on_problem, o, E));
  if (problems[0] || problems[1])
    DIFF_FAIL("verify: %llu / %llu problems (seed %llu)", (unsigned long long)problems[0],
              (unsigned long long)problems[1], (unsigned long long)r->seed);
}

/* ---- Writes ---------------------------------------------------------------------------------- */

static void lsn_next(run *r, char *out) {
  unsigned k = (unsigned)ct_below(&r->rng, 40);
  if (k == 0 && r->lsn > 3) /* behind the last checkpoint's: blocked */
    snprintf(out, 32, "%08llx", (unsigned long long)(r->lsn - 1 - ct_below(&r->rng, 3)));
  else if (k == 1) /* the same again */
    snprintf(out, 32, "%08llx", (unsigned long long)r->lsn);
  else
    snprintf(out, 32, "%08llx", (unsigned long long)++r->lsn);
}

/* An LSN value: mostly the counter, sometimes an edge string (empty, maximum, over it). */
static bs_val lsn_val(run *r, char *buf) {
  if (ct_below(&r->rng, 30) == 0) return ue_str_pick(&r->rng, BS_MAX_LSN, UE_NUL, NULL);
  lsn_next(r, buf);
  return ct_v(buf);
}

static size_t pick_stream(run *r) {
  if (r->n_streams > 1 && ct_below(&r->rng, 4) == 0) return ct_below(&r->rng, r->n_streams);
  return r->n_streams - 1;
}

static int pick_writer(run *r, size_t x) {
  int k = (int)(ct_below(&r->rng, 4) % N_WRITERS); /* main twice as often */
  if (!r->ws[x][k].open) {
    random_writer_spec(r, x, k);
    open_writer(r, x, k);
  }
  return r->ws[x][k].open ? k : -1;
}

static void do_save(run *r, size_t x, int k) {
  bs_save sv = BS_SAVE_INIT;
  bs_row rows[4];
  bs_lookup lk[3];
  bs_val params[3][3];
  size_t nrows = ct_below(&r->rng, 5), nlk = ct_below(&r->rng, 4), i, j;
  unsigned kind = (unsigned)ct_below(&r->rng, 100);
  char data[4][64];
  sv.table = pick(r, &r->tables);
  sv.tag = kind < 35 ? BS_INSERT : kind < 80 ? BS_UPDATE : BS_DELETE;
  if (k == 1 && ct_below(&r->rng, 8)) sv.tag = BS_INSERT; /* a snapshot writer inserts */
  sv.after_id = pick(r, &r->rids);
  if (sv.tag == BS_DELETE || (sv.tag == BS_UPDATE && ct_below(&r->rng, 6) == 0))
    sv.before_id = pick(r, &r->rids);
  if (sv.tag == BS_DELETE && ct_below(&r->rng, 2)) sv.after_id = (bs_val){NULL, 0};
  for (i = 0; i < nrows; i++) {
    rows[i].bucket = pick(r, &r->buckets);
    rows[i].object_type = pick(r, &r->otypes);
    rows[i].object_id = ct_below(&r->rng, 3) ? sv.after_id : pick(r, &r->rids);
    if (ct_below(&r->rng, 3)) {
      snprintf(data[i], sizeof data[i], "{\"v\":%llu}", (unsigned long long)ct_below(&r->rng, 9));
      rows[i].data = ct_v(data[i]);
    } else {
      rows[i].data = pick(r, &r->data);
    }
  }
  sv.rows = rows;
  sv.n_rows = nrows;
  for (i = 0; i < nlk; i++) {
    lk[i].key = pick(r, &r->keys);
    lk[i].n_params = ct_below(&r->rng, 4);
    for (j = 0; j < lk[i].n_params; j++) params[i][j] = pick(r, &r->data);
    lk[i].params = params[i];
  }
  sv.lookups = lk;
  sv.n_lookups = nlk;
  if (ct_below(&r->rng, 4) == 0) sv.stored_data = pick(r, &r->data);
  note(r, "save s%zu w%d tag %d table %zuB after %zuB before %s rows %zu lookups %zu", x, k,
       (int)sv.tag, sv.table.size, sv.after_id.size, sv.before_id.data ? "set" : "-", nrows, nlk);
  BOTH(r, "save", bs_writer_save(s->w[x][k], &sv, E));
}

static int commit_out(bs_writer *w, int keepalive, bs_val lsn, const bs_commit_options *co, sb *o,
                      bs_error *err) {
  bs_commit_result cr;
  int rc;
  memset(&cr, 0, sizeof cr);
  rc = keepalive ? bs_writer_keepalive(&cr, w, lsn, err) : bs_writer_commit(&cr, w, lsn, co, err);
  if (rc == BS_OK)
    sb_printf(o, "blocked %d created %d cp %" PRIu64, cr.checkpoint_blocked, cr.checkpoint_created,
              cr.checkpoint);
  return rc;
}

static void do_commit(run *r, size_t x, int k, int keepalive) {
  char buf[32];
  bs_val lsn = lsn_val(r, buf);
  bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
  if (ct_below(&r->rng, 3) == 0) co.create_empty = (int)ct_below(&r->rng, 2);
  note(r, "%s s%zu w%d lsn %.20s create_empty %d", keepalive ? "keepalive" : "commit", x, k,
       lsn.size < 40 ? (const char *)lsn.data : "(long)", co.create_empty);
  BOTH(r, "commit", commit_out(s->w[x][k], keepalive, lsn, &co, o, E));
}

static int flush_out(bs_writer *w, sb *o, bs_error *err) {
  uint64_t last = 0;
  int rc = bs_writer_flush(&last, w, err);
  if (rc == BS_OK) sb_printf(o, "last_op %" PRIu64, last);
  return rc;
}

static int on_source(const bs_val *d, void *payload) {
  sb *o = payload;
  if (!d)
    sb_printf(o, "no data");
  else
    sb_val(o, *d);
  return 0;
}

static int managed_out(bs_storage *st, const bs_managed_request *req, size_t n, sb *o,
                       bs_error *err) {
  uint64_t ids[4];
  int adv = 0, rc = bs_create_managed_write_checkpoints(ids, &adv, st, req, n, err);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) sb_printf(o, "%" PRIu64 " ", ids[i]);
  sb_printf(o, "advance %d", adv);
  return BS_OK;
}

static void do_managed(run *r, size_t x) {
  bs_managed_request req[4];
  bs_head heads[4][2];
  char lsns[4][2][32];
  size_t n = 1 + ct_below(&r->rng, 3);
  memset(req, 0, sizeof req);
  for (size_t i = 0; i < n; i++) {
    req[i].user_id = pick(r, &r->users);
    req[i].n_heads = 1 + ct_below(&r->rng, 2);
    for (size_t h = 0; h < req[i].n_heads; h++) {
      snprintf(lsns[i][h], 32, "%08llx", (unsigned long long)(r->lsn + ct_below(&r->rng, 4)));
      heads[i][h].connection = ct_v(h ? "2" : "1");
      heads[i][h].lsn = ct_v(lsns[i][h]);
    }
    req[i].heads = heads[i];
    if (ct_below(&r->rng, 3) == 0) {
      req[i].has_request_id = 1;
      req[i].request_id = 1 + ct_below(&r->rng, 20);
    }
    req[i].requested_at_ms = r->now_ms - (int64_t)ct_below(&r->rng, 5000);
  }
  note(r, "create_managed s%zu n %zu", x, n);
  for (size_t i = 0; r->verbose && i < n; i++)
    fprintf(stderr,
            "    request %zu: user %zuB \"%.8s\" heads %zu (%.16s) request_id %d/%llu at %lld\n", i,
            req[i].user_id.size, (const char *)req[i].user_id.data, req[i].n_heads, lsns[i][0],
            req[i].has_request_id, (unsigned long long)req[i].request_id,
            (long long)req[i].requested_at_ms);
  BOTH(r, "create_managed_write_checkpoints", managed_out(s->st[x], req, n, o, E));
}

static int compact_out(bs_storage *st, const bs_compact_options *co, sb *o, bs_error *err) {
  bs_compact_stats cs;
  int rc;
  memset(&cs, 0, sizeof cs);
  rc = bs_compact(&cs, st, co, err);
  /* bytes_before/after are each backend's own measure */
  sb_printf(o,
            "buckets %" PRIu64 " moved %" PRIu64 " cleared %" PRIu64 " removed %" PRIu64
            " params %" PRIu64 " wcp %" PRIu64 " reemitted %" PRIu64,
            cs.buckets_compacted, cs.ops_moved, cs.ops_cleared, cs.ops_removed,
            cs.parameter_entries_removed, cs.checkpoint_requests_deleted, cs.ops_reemitted);
  return rc;
}

static void do_compact(run *r, size_t x) {
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_val names[N_BUCKETS];
  uint64_t cp = 0;
  size_t n = 0;
  int all = 0;
  head_of(r, x, &cp);
  switch (ct_below(&r->rng, 4)) {
  case 0:
    if (SW_COMPACT_THRESHOLDS) break; /* the defaults: thresholds */
    all = 1;
    /* fall through */
  case 1:
    if (SW_COMPACT_THRESHOLDS) {
      co.min_bucket_changes = 1, co.min_change_ratio = 0;
      break;
    }
    /* fall through */
  case 2:
    for (size_t i = 0; i < r->buckets.n; i++)
      if ((all || ct_below(&r->rng, 2)) && r->buckets.v[i].size &&
          r->buckets.v[i].size <= BS_MAX_BUCKET_NAME)
        names[n++] = r->buckets.v[i];
    co.buckets = names, co.n_buckets = n;
    break;
  default:
    co.incremental_only = 1, co.min_age_ms = 0;
  }
  if (ct_below(&r->rng, 3) == 0 && cp) /* below the checkpoint, or an edge (2^63: refused) */
    co.max_op_id = ct_below(&r->rng, 4) ? 1 + ct_below(&r->rng, cp) : ue_op_id(&r->rng, cp);
  if (ct_below(&r->rng, 2)) co.max_ops_per_txn = 2 + ct_below(&r->rng, 20);
  if (co.incremental_only && ct_below(&r->rng, 3) == 0) co.op_budget = 1 + ct_below(&r->rng, 30);
  if (ct_below(&r->rng, 3) == 0) co.compact_parameters = 1;
  if (SW_DEFRAG && ct_below(&r->rng, 5) == 0)
    co.defragment_ratio = 0.5 + (double)ct_below(&r->rng, 5) / 10;
  if (SW_WCP_CLEANUP && ct_below(&r->rng, 4) == 0)
    co.delete_checkpoint_requests_before_ms = r->now_ms - (int64_t)ct_below(&r->rng, 4000);
  note(r, "compact s%zu incremental %d buckets %zu max_op %" PRIu64 " params %d defrag %.1f", x,
       co.incremental_only, co.n_buckets, co.max_op_id, co.compact_parameters, co.defragment_ratio);
  BOTH(r, "compact", compact_out(s->st[x], &co, o, E));
}

static int initial_out(bs_storage *st, uint64_t max, uint64_t minc, sb *o, bs_error *err) {
  uint64_t n = 0;
  int rc = bs_compact_initial_replication(&n, st, max, minc, err);
  /* the count is compared with the thresholds only: without them LMDB counts the buckets
   * with anything new since their last compaction, the memory backend those with ops below the
   * horizon (what is left of the buckets is compared by the reads after it) */
  if (rc == BS_OK && SW_COMPACT_THRESHOLDS) sb_printf(o, "buckets %" PRIu64, n);
  return rc;
}

/* A custom write checkpoint's event (the mode's too, user ""): "" or "ev" mostly, else an edge
 * string up to one byte over its own limit (255 bytes), or one that makes user and event
 * together exactly BS_MAX_USER_EVENT bytes, or one over (storage.h: BS_ETOOBIG). */
static bs_val event_of(run *r, bs_val user) {
  unsigned k = (unsigned)ct_below(&r->rng, 8);
  size_t n;
  if (k < 5) return ct_v(k & 1 ? "ev" : "");
  if (k == 5) return ue_str_pick(&r->rng, 255, UE_NUL, NULL);
  n = user.size < BS_MAX_USER_EVENT ? BS_MAX_USER_EVENT - user.size + (k == 7) : 1;
  return ue_str_len(n < 256 ? n : 256, 3);
}

static void new_stream(run *r) {
  char name[16];
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  size_t x = r->n_streams;
  uint32_t ids[N_SIDES] = {0, 0};
  so.hash = ct_below(&r->rng, 3) == 0 ? BS_HASH_SHA256 : BS_HASH_XXH3;
  snprintf(name, sizeof name, "s%zu", x);
  note(r, "stream_create %s hash %d", name, (int)so.hash);
  BOTH(r, "stream_create", bs_stream_create(&ids[s - r->s], s->db, name, &so, E));
  if (ids[0] != ids[1]) DIFF_FAIL("stream ids %u / %u", ids[0], ids[1]);
  r->ids[x] = ids[0];
  r->hash[x] = so.hash;
  r->n_streams++;
  { /* op ids from 1, or from near 2^32, 2^53 or 2^63 (contract.md 2's bound) on both sides */
    uint64_t h = ct_draw_start_head(&r->rng);
    if (h) note(r, "stream %s: op ids from %" PRIu64, name, h + 1);
    for (int i = 0; h && i < N_SIDES; i++) {
      bs_error err = {0, ""};
      if (ct_set_op_head(r->s[i].be, r->s[i].db, r->s[i].path, r->ids[x], h, &err))
        DIFF_FAIL("op head of %s: %s (%s)", SIDE_NAME(i), bs_strerror(err.code), err.msg);
    }
  }
  BOTH(r, "storage_open", bs_storage_open(&s->st[x], s->db, r->ids[x], E));
  random_writer_spec(r, x, 0);
  open_writer(r, x, 0);
}

static void step(run *r) {
  size_t x = pick_stream(r);
  unsigned a = (unsigned)ct_below(&r->rng, 1000);
  char buf[32];
  int k;
  if (r->terminated[x] && a < 900) a = 900 + a % 100; /* reads and lifecycle only */
  r->now_ms += (int64_t)ct_below(&r->rng, 200);
  if (a < 500) {
    if ((k = pick_writer(r, x)) >= 0) do_save(r, x, k);
  } else if (a < 520) {
    if (!(r->lacks & CT_LACKS_TRUNCATE) && (k = pick_writer(r, x)) >= 0) {
      bs_val t = ct_below(&r->rng, 8) ? pick(r, &r->tables) : ue_str_pick(&r->rng, 0, 0, NULL);
      int drop = ct_below(&r->rng, 4) == 0;
      note(r, "%s s%zu w%d", drop ? "drop" : "truncate", x, k);
      BOTH(r, "truncate",
           drop ? bs_writer_drop(s->w[x][k], t, E) : bs_writer_truncate(s->w[x][k], t, E));
    }
  } else if (a < 560) {
    if ((k = pick_writer(r, x)) >= 0) {
      note(r, "flush s%zu w%d", x, k);
      BOTH(r, "flush", flush_out(s->w[x][k], o, E));
    }
  } else if (a < 680) {
    if ((k = pick_writer(r, x)) >= 0) {
      do_commit(r, x, k, ct_below(&r->rng, 6) == 0);
      check_stream(r, x, ct_below(&r->rng, 4) == 0);
    }
  } else if (a < 700) {
    if ((k = pick_writer(r, x)) >= 0) {
      bs_val lsn = lsn_val(r, buf);
      int resume = ct_below(&r->rng, 2);
      note(r, "%s s%zu w%d", resume ? "resume_lsn" : "snapshot_done", x, k);
      BOTH(r, resume ? "resume_lsn" : "snapshot_done",
           resume ? bs_writer_resume_lsn(s->w[x][k], lsn, E)
                  : bs_writer_snapshot_done(s->w[x][k], lsn, E));
      BOTH(r, "get_status after it", status_of(s->st[x], o, E));
    }
  } else if (a < 720) {
    if ((k = pick_writer(r, x)) >= 0) {
      bs_val t = pick(r, &r->tables), id = pick(r, &r->rids);
      note(r, "source_row s%zu w%d", x, k);
      BOTH(r, "source_row", bs_writer_source_row(s->w[x][k], t, id, on_source, o, E));
    }
  } else if (a < 740) { /* reopen a writer slot with new options, or close it */
    k = (int)ct_below(&r->rng, N_WRITERS);
    if (ct_below(&r->rng, 3) == 0) {
      note(r, "writer_close s%zu w%d", x, k);
      close_writer(r, x, k);
      r->ws[x][k].open = 0;
    } else {
      random_writer_spec(r, x, k);
      open_writer(r, x, k);
    }
  } else if (a < 770) {
    unsigned w = (unsigned)ct_below(&r->rng, 5);
    if (w == 0) {
      bs_write_checkpoint_mode m = ct_below(&r->rng, 2) ? BS_WCP_CUSTOM : BS_WCP_MANAGED;
      bs_val ev = event_of(r, ct_v(""));
      note(r, "write_checkpoint_mode s%zu %d", x, (int)m);
      BOTH(r, "set_write_checkpoint_mode", bs_set_write_checkpoint_mode(s->st[x], m, ev, E));
    } else if (w == 1) {
      if ((k = pick_writer(r, x)) >= 0) {
        bs_val u = pick(r, &r->users), ev = event_of(r, u);
        /* an op id, or an edge (2^63 - 1 stored, 2^63 refused) */
        uint64_t value = ct_below(&r->rng, 8) ? 1 + ct_below(&r->rng, 50) : ue_op_id(&r->rng, 50);
        note(r, "custom_write_checkpoint s%zu w%d", x, k);
        BOTH(r, "custom_write_checkpoint",
             bs_writer_custom_write_checkpoint(s->w[x][k], u, value, ev, E));
      }
    } else if (w == 2) {
      do_managed(r, x);
    } else if (w == 3 && SW_WCP_CLEANUP) {
      int64_t before = r->now_ms - (int64_t)ct_below(&r->rng, 4000);
      uint64_t del[N_SIDES] = {0, 0};
      note(r, "delete_checkpoint_requests_before s%zu", x);
      BOTH(r, "delete_checkpoint_requests_before",
           bs_delete_checkpoint_requests_before(&del[s - r->s], s->st[x], before, E));
      if (del[0] != del[1])
        DIFF_FAIL("deleted %llu / %llu", (unsigned long long)del[0], (unsigned long long)del[1]);
    } else if (SW_LAST_WCP) {
      bs_head h = {ct_v("1"), ct_v("")};
      snprintf(buf, sizeof buf, "%08llx", (unsigned long long)r->lsn);
      h.lsn = ct_v(buf);
      bs_val u = pick(r, &r->users);
      size_t nh = ct_below(&r->rng, 3) ? 1 : 0;
      BOTH(r, "last_write_checkpoint", last_wcp_of(s->st[x], u, &h, nh, o, E));
    }
  } else if (a < 810) {
    if (!(r->lacks & CT_LACKS_COMPACT)) do_compact(r, x);
    check_stream(r, x, 1);
  } else if (a < 815 && !(r->lacks & CT_LACKS_COMPACT)) {
    /* (a horizon below the head leaves ops that LMDB's selection no longer counts as changes:
     * SW_COMPACT_THRESHOLDS) */
    uint64_t max = ct_below(&r->rng, 2) || !SW_COMPACT_THRESHOLDS
                       ? 0
                       : ct_below(&r->rng, head_of(r, x, NULL) + 1);
    uint64_t minc = SW_COMPACT_THRESHOLDS ? ct_below(&r->rng, 3) : ct_below(&r->rng, 2);
    note(r, "compact_initial_replication s%zu max %" PRIu64 " min %" PRIu64, x, max, minc);
    BOTH(r, "compact_initial_replication", initial_out(s->st[x], max, minc, o, E));
    check_stream(r, x, 1);
  } else if (a < 830) {
    do_reopen(r);
    check_db(r);
    for (size_t i = 0; i < r->n_streams; i++) check_stream(r, i, 1);
  } else if (a < 835 && r->n_streams < MAX_STREAM) {
    new_stream(r);
    check_db(r);
  } else if (a < 838) {
    note(r, "report_error s%zu", x);
    BOTH(r, "report_error", bs_report_error(s->st[x], "edge \"error\" \xc3\xa9", E));
  } else if (a < 841) {
    note(r, "clear s%zu", x);
    BOTH(r, "clear", bs_clear(s->st[x], E));
    check_stream(r, x, 1);
  } else if (a < 842) {
    int clear = ct_below(&r->rng, 2);
    note(r, "terminate s%zu clear %d", x, clear);
    BOTH(r, "terminate", bs_terminate(s->st[x], clear, E));
    r->terminated[x] = 1;
    check_db(r);
  } else if (a < 900) {
    check_stream(r, x, ct_below(&r->rng, 3) == 0);
  } else if (a < 910) {
    check_db(r);
  } else {
    check_stream(r, x, 0);
  }
}

static void side_dir(side *s) {
  char dir[sizeof s->dir] = "/tmp/bs_diff_XXXXXX";
  assert_non_null(mkdtemp(dir));
  memcpy(s->dir, dir, sizeof dir);
  snprintf(s->path, sizeof s->path, "%s/db", dir);
}

static void side_remove(side *s) {
  char cmd[128];
  if (!s->dir[0]) return;
  if (s->be->remove_db) s->be->remove_db(s->be, s->path);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s->dir);
}

/* One seed: LMDB beside `other`. Returns the hash of its call trace. */
static uint64_t run_seed(const ct_backend *other, uint64_t seed, size_t steps) {
  uint64_t calls_hash;
  run *r = calloc(1, sizeof *r);
  assert_non_null(r);
  g_run = r;
  r->s[0].be = &ct_backends[CT_LMDB];
  r->s[1].be = other;
  r->lacks = r->s[0].be->lacks | other->lacks;
  r->seed = seed;
  r->rng = ct_seed(seed, 7);
  r->verbose = (int)ct_env_u64("BS_VERBOSE", 0);
  r->now_ms = 1700000000000;
  for (int i = 0; i < N_SIDES; i++) {
    if (r->s[i].be->persistent) side_dir(&r->s[i]);
    if (side_open_db(&r->s[i]) != BS_OK) fail_msg("open %s", SIDE_NAME(i));
  }
  pools_init(r);
  new_stream(r);
  {
    char lsn[32];
    lsn_next(r, lsn);
    if (ct_below(&r->rng, 4))
      BOTH(r, "snapshot_done", bs_writer_snapshot_done(s->w[0][0], ct_v(lsn), E));
  }
  for (r->step = 0; r->step < steps; r->step++) {
    step(r);
    if (r->verbose > 1) /* find the first call after which the sides disagree */
      for (size_t x = 0; x < r->n_streams; x++)
        BOTH(r, "paranoid status", status_of(s->st[x], o, E));
  }
  /* the end: every open writer commits, then everything is read once more */
  for (size_t x = 0; x < r->n_streams; x++)
    for (int k = 0; k < N_WRITERS; k++)
      if (r->ws[x][k].open && !r->terminated[x]) do_commit(r, x, k, 1);
  check_db(r);
  for (size_t x = 0; x < r->n_streams; x++) check_stream(r, x, 1);
  do_reopen(r);
  for (size_t x = 0; x < r->n_streams; x++) check_stream(r, x, 1);
  if (r->verbose)
    fprintf(stderr, "seed %llu: %lu calls compared, %lu read rounds\n", (unsigned long long)seed,
            r->calls, r->reads);
  close_all(r, 0);
  pools_free(r);
  for (int i = 0; i < N_SIDES; i++) side_remove(&r->s[i]);
  g_run = NULL;
  calls_hash = r->calls_hash;
  free(r);
  return calls_hash;
}

/* state: the backend beside LMDB. Its seeds: BS_SEEDS, else 240 quick / 400 full against memory
 * and 10 / 50 against a server backend (every call is a round trip there: 4 s a seed at load 6).
 * No two of them may make the same calls. */
static void t_diff(void **state) {
  const ct_backend *other = *state;
  uint64_t first = ct_first_seed("diff", other), n, *traces;
  char pair[64];
  size_t steps = (size_t)ct_env_u64("BS_STEPS", ct_quick() ? 300 : 1500);
  if (other == ct_postgres())
    n = ct_env_u64("BS_SEEDS", ct_quick() ? 10 : 50);
  else
    n = ct_env_u64("BS_SEEDS", ct_quick() ? 240 : 400);
  traces = calloc(n ? n : 1, sizeof *traces);
  assert_non_null(traces);
  snprintf(pair, sizeof pair, "lmdb/%s", other->name);
  for (uint64_t i = 0; i < n; i++) {
    if (n <= 200 || i % 100 == 0)
      fprintf(stderr,
              "diff %s: seed %llu (reproduce: BS_SEED=%llu BS_SEEDS=1 BS_BACKEND=%s "
              "build/tests/test_diff)\n",
              pair, (unsigned long long)(first + i), (unsigned long long)(first + i), other->name);
    ct_seed_log("diff", pair, first + i);
    traces[i] = run_seed(other, first + i, steps);
  }
  ct_distinct_traces("diff", first, traces, n);
  free(traces);
}

/* 200 seeds of every suite's generator (ct_seed's streams) share no draw among their first 1000:
 * no seed replays part of another's run. */
static void t_seeds_share_no_draw(void **state) {
  static const uint64_t streams[] = {0, 1, 7, 0x5eed, 0x5e7e};
  enum { SEEDS = 200, DRAWS = 1000, N_STREAMS = sizeof streams / sizeof streams[0] };
  uint64_t *draws = malloc((size_t)N_STREAMS * SEEDS * DRAWS * sizeof *draws), *d = draws;
  (void)state;
  assert_non_null(draws);
  for (size_t x = 0; x < N_STREAMS; x++)
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
      ct_rng r = ct_seed(seed, streams[x]);
      for (int i = 0; i < DRAWS; i++) *d++ = ct_rand(&r);
    }
  size_t dup = ct_repeats(draws, (size_t)N_STREAMS * SEEDS * DRAWS);
  free(draws);
  if (dup) fail_msg("%zu of %d draws repeat another seed's", dup, N_STREAMS * SEEDS * DRAWS);
}

/* ---- The rules the differential run found, each stated once on every backend ---------------- */

/* The backends the focused tests run on: lmdb, memory and postgres, those selected (main). */
static const ct_backend *g_focus[CT_MAX_BACKENDS];
static size_t g_n_focus;

/* An env on backend be with stream "s1" whose snapshot is not done yet. */
static void env_of(ct_env *e, const ct_backend *be) {
  CT_OK(ct_env_open(e, be, 0));
  CT_OK(ct_env_stream(e, "s1", BS_HASH_XXH3, NULL));
}

static uint64_t persisted(ct_env *e) {
  bs_status st;
  CT_OK(bs_get_status(&st, e->st, &ct_err));
  return st.last_persisted_op;
}

/* resume_lsn and snapshot_done take effect at once and leave the queue alone. */
static void t_resume_lsn_at_once(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_focus; i++) {
    const ct_backend *be = g_focus[i];
    ct_env e;
    bs_status st;
    env_of(&e, be);
    CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, "r1", CT_ROWS({"b", "t", "r1", "{}"})));
    CT_OK(bs_writer_resume_lsn(e.w, ct_v("0/5"), &ct_err));
    CT_OK(bs_get_status(&st, e.st, &ct_err));
    if (!st.has_resume_lsn || st.resume_lsn_size != 3 || memcmp(st.resume_lsn, "0/5", 3) != 0)
      fail_msg("%s: resume_lsn not visible at once", be->name);
    CT_OK(bs_writer_snapshot_done(e.w, ct_v("0/5"), &ct_err));
    CT_EQ_U64(persisted(&e), 0); /* the save is still queued */
    ct_env_close(&e);
  }
}

/* A DELETE the streaming writer sees before the snapshot is done fences the row, also a row
 * the snapshot has not inserted yet: the snapshot writer's later INSERT is skipped (contract.md 4.3). */
static void t_delete_fences_snapshot(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_focus; i++) {
    const ct_backend *be = g_focus[i];
    ct_env e;
    bs_writer *snap = NULL;
    bs_writer_options so = BS_WRITER_OPTIONS_INIT;
    bs_commit_result cr;
    ct_oplist l;
    env_of(&e, be);
    so.snapshot = 1;
    CT_OK(bs_writer_open(&snap, e.st, &so, &ct_err));
    CT_OK(ct_save(e.w, BS_DELETE, "t", "r1", NULL, CT_NOROWS)); /* unknown yet */
    CT_OK(bs_writer_flush(NULL, e.w, &ct_err));
    CT_OK(ct_save(snap, BS_INSERT, "t", NULL, "r1", CT_ROWS({"b", "t", "r1", "{\"old\":1}"})));
    CT_OK(ct_save(snap, BS_INSERT, "t", NULL, "r2", CT_ROWS({"b", "t", "r2", "{}"})));
    CT_OK(bs_writer_snapshot_done(snap, ct_v("0/1"), &ct_err));
    CT_OK(ct_commit(snap, "0/1", &cr));
    memset(&l, 0, sizeof l);
    CT_OK(ct_read_bucket(e.st, cr.checkpoint, "b", 0, &l));
    if (l.n != 1 || !ct_buf_eq(&l.v[0].object_id, "r2"))
      fail_msg("%s: the deleted row came back (%zu ops)", be->name, l.n);
    ct_oplist_free(&l);
    bs_writer_close(snap);
    ct_env_close(&e);
  }
}

/* Auto-flush (storage.h bs_writer_options): a save that finds max_records changes queued
 * flushes them first, the same on every backend. */
static void t_auto_flush_before_queueing(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_focus; i++) {
    const ct_backend *be = g_focus[i];
    ct_env e;
    bs_writer_options o = BS_WRITER_OPTIONS_INIT;
    env_of(&e, be);
    o.max_records = 2;
    CT_OK(ct_env_writer(&e, &o));
    CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, "r1", CT_ROWS({"b", "t", "r1", "{}"})));
    CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, "r2", CT_ROWS({"b", "t", "r2", "{}"})));
    CT_EQ_U64(persisted(&e), 0); /* at the bound, not past it */
    CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, "r3", CT_ROWS({"b", "t", "r3", "{}"})));
    CT_EQ_U64(persisted(&e), 2); /* the first two, before the third was queued */
    /* a snapshot writer refuses an UPDATE before it would auto-flush */
    o.snapshot = 1;
    o.max_records = 1;
    CT_OK(ct_env_writer(&e, &o));
    CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, "r4", CT_ROWS({"b", "t", "r4", "{}"})));
    CT_RC(BS_ESTATE, ct_save(e.w, BS_UPDATE, "t", NULL, "r4", CT_NOROWS));
    CT_EQ_U64(persisted(&e), 2);
    ct_env_close(&e);
  }
}

/* Two generated requests of one user in a batch: the last (newest heads) wins (contract.md 7). */
static void t_managed_last_generated_wins(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_focus; i++) {
    const ct_backend *be = g_focus[i];
    ct_env e;
    bs_head h1 = {ct_v("1"), ct_v("0/1")},
            h2[2] = {{ct_v("1"), ct_v("0/2")}, {ct_v("2"), ct_v("0/9")}};
    bs_managed_request req[2];
    uint64_t ids[2], id = 0;
    int found = 1;
    env_of(&e, be);
    memset(req, 0, sizeof req);
    req[0].user_id = req[1].user_id = ct_v("u1");
    req[0].heads = &h1, req[0].n_heads = 1;
    req[1].heads = h2, req[1].n_heads = 2;
    CT_OK(bs_create_managed_write_checkpoints(ids, NULL, e.st, req, 2, &ct_err));
    CT_EQ_U64(ids[0], 1);
    CT_EQ_U64(ids[1], 1);
    /* connection 1 alone does not reach the winner's heads */
    CT_OK(bs_last_write_checkpoint(&id, &found, e.st, ct_v("u1"), &h2[0], 1, &ct_err));
    if (found) fail_msg("%s: the first request's heads were kept", be->name);
    CT_OK(bs_last_write_checkpoint(&id, &found, e.st, ct_v("u1"), h2, 2, &ct_err));
    if (!found || id != 1) fail_msg("%s: the last request's heads were not kept", be->name);
    ct_env_close(&e);
  }
}

/* Full compaction's seen-set is bounded the same on every backend (compact.c's plan): a row
 * updated early, whose latest op the reverse scan meets only after 20,000 newer rows filled a
 * 1 MB set, is not tracked, so its first PUT stays (less is compacted, never wrongly); with the
 * default, BS_COMPACT_MEMORY_LIMIT_MB, it becomes a MOVE. */
static void t_bounded_seen_set(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_focus; i++) {
    const ct_backend *be = g_focus[i];
    bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
    bs_compact_stats cs;
    bs_commit_result cr;
    bs_val b = ct_v("b");
    ct_env e;
    if (ct_lacks(be, CT_LACKS_COMPACT)) continue;
    env_of(&e, be);
    CT_OK(bs_writer_snapshot_done(e.w, ct_v("0/1"), &ct_err));
    CT_OK(ct_save(e.w, BS_UPDATE, "t", NULL, "x", CT_ROWS({"b", "t", "x", "1"})));
    CT_OK(ct_save(e.w, BS_UPDATE, "t", NULL, "x", CT_ROWS({"b", "t", "x", "2"})));
    for (int k = 0; k < 20000; k++) {
      char rid[16];
      snprintf(rid, sizeof rid, "r%d", k);
      CT_OK(ct_save(e.w, BS_INSERT, "t", NULL, rid, CT_ROWS({"b", "t", rid, "{}"})));
    }
    CT_OK(ct_commit(e.w, "0/1", &cr));
    co.buckets = &b, co.n_buckets = 1, co.memory_limit_mb = 1;
    CT_OK(bs_compact(&cs, e.st, &co, &ct_err));
    if (cs.ops_moved != 0) fail_msg("%s: an untracked row moved", be->name);
    co.memory_limit_mb = 0;
    CT_OK(bs_compact(&cs, e.st, &co, &ct_err));
    if (cs.ops_moved != 1 || cs.ops_cleared != 0)
      fail_msg("%s: %llu moved, %llu cleared with the default limit", be->name,
               (unsigned long long)cs.ops_moved, (unsigned long long)cs.ops_cleared);
    ct_env_close(&e);
  }
}

/* The focused tests on each selected backend of lmdb, memory and postgres (BS_BACKEND=name: that
 * one), then the differential run of LMDB beside memory and beside postgres, where selected. */
int main(void) {
  static const CMUnitTestFunction focused[] = {
      t_resume_lsn_at_once,          t_delete_fences_snapshot, t_auto_flush_before_queueing,
      t_managed_last_generated_wins, t_bounded_seen_set,
  };
  static const char *const names[] = {
      "t_resume_lsn_at_once",          "t_delete_fences_snapshot", "t_auto_flush_before_queueing",
      "t_managed_last_generated_wins", "t_bounded_seen_set",
  };
  const ct_backend *be[CT_MAX_BACKENDS];
  struct CMUnitTest t[6 + CT_MAX_BACKENDS];
  size_t i, n = 0, nb = ct_backends_selected(be);
  memset(t, 0, sizeof t);
  t[n].name = "t_seeds_share_no_draw", t[n++].test_func = t_seeds_share_no_draw;
  for (i = 0; i < nb; i++)
    if (be[i] != &ct_backends[CT_LMDB_PT]) g_focus[g_n_focus++] = be[i];
  for (i = 0; g_n_focus && i < 5; i++, n++) t[n].name = names[i], t[n].test_func = focused[i];
  for (i = 0; i < nb; i++)
    if (be[i] == &ct_backends[CT_MEMORY] || be[i] == ct_postgres()) {
      t[n].name = be[i] == ct_postgres() ? "t_diff/postgres" : "t_diff";
      t[n].test_func = t_diff;
      t[n++].initial_state = (void *)be[i];
    }
  return _cmocka_run_group_tests("diff", t, n, NULL, NULL) ? 1 : 0;
}
