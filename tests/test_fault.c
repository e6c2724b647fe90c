/*
 * test_fault.c: out-of-memory and I/O-error injection (SQLite's method) on the LMDB backend.
 *
 * One representative scenario (open, stream create, saves with lookups, flush, commits, reads,
 * checksums, write checkpoints, compaction, verify) runs once cleanly to record the reference
 * state after each commit, then again with a fault injected at failure point N, for N = 1, 2, ...
 * until a run no longer reaches N:
 *  - allocation faults through the per-handle allocator hook (util_fault.c);
 *  - LMDB faults: this binary interposes the mdb_* functions the library calls (the static
 *    library binds to the definitions below; they reach the real ones through dlsym(RTLD_NEXT)).
 * Two modes per kind:
 *  - persistent (every call from N on fails): the failing call must return a documented BS_*
 *    status, closing must free every block (the allocator counts them), and the reopened file
 *    must verify and show exactly the state of the last commit that returned BS_OK;
 *  - transient (only call N fails): the failed step is retried once and the run must end in
 *    exactly the reference end state (a failed call leaves the db and the writer's queue as they
 *    were: contract.md section 10).
 * Also: bs_backup, bs_db_export and bs_load with each LMDB call and allocation failing in turn
 * (a failure leaves nothing at the target, a success a copy that reads as the source), the
 * failing vtable wrapper under the checksum cache, and disk full (a small tmpfs when
 * this process may mount one, else ENOSPC injected at commit).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../storage.h"
#include "util_contract.h"
#include "util_fault.h"

/* ---- LMDB interposition --------------------------------------------------------------------- */

enum { MF_EIO = 0, MF_NATURAL = 1 }; /* error flavours */

static struct {
  unsigned long calls, fail_at, injected;
  int persistent, flavor;
  int commit_errno; /* when set: only mdb_txn_commit fails, with this errno (disk full) */
} mf;

static void mf_arm(unsigned long n, int persistent, int flavor) {
  mf.persistent = persistent;
  mf.flavor = flavor;
  mf.fail_at = n ? mf.calls + n : 0;
}

/* natural: the error a real LMDB could return from that call; EIO flavour: EIO */
static int mf_check(int natural) {
  unsigned long n = ++mf.calls;
  if (!mf.fail_at || n < mf.fail_at || (n > mf.fail_at && !mf.persistent)) return 0;
  mf.injected++;
  return mf.flavor == MF_NATURAL ? natural : EIO;
}

/* real_: the real LMDB function (the prototype comes from lmdb.h) */
#define REAL(name)                                                                                 \
  static __typeof__(name) *real_;                                                                  \
  if (!real_) *(void **)&real_ = dlsym(RTLD_NEXT, #name)

int mdb_env_create(MDB_env **env) {
  REAL(mdb_env_create);
  int e = mf_check(ENOMEM);
  if (e) {
    *env = NULL;
    return e;
  }
  return real_(env);
}
int mdb_env_open(MDB_env *env, const char *path, unsigned flags, mdb_mode_t mode) {
  REAL(mdb_env_open);
  int e = mf_check(EAGAIN);
  return e ? e : real_(env, path, flags, mode);
}
int mdb_env_set_mapsize(MDB_env *env, size_t size) {
  REAL(mdb_env_set_mapsize);
  int e = mf_check(ENOMEM);
  return e ? e : real_(env, size);
}
int mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **txn) {
  REAL(mdb_txn_begin);
  int e = mf_check((flags & MDB_RDONLY) ? MDB_READERS_FULL : MDB_MAP_RESIZED);
  return e ? e : real_(env, parent, flags, txn);
}
int mdb_txn_commit(MDB_txn *txn) {
  REAL(mdb_txn_commit);
  int e = mf.commit_errno ? 0 : mf_check(MDB_MAP_FULL);
  if (mf.commit_errno) {
    e = mf.commit_errno;
    mf.injected++;
  }
  if (e) {
    mdb_txn_abort(txn); /* a failed commit frees the txn, as the real one does */
    return e;
  }
  return real_(txn);
}
int mdb_dbi_open(MDB_txn *txn, const char *name, unsigned flags, MDB_dbi *dbi) {
  REAL(mdb_dbi_open);
  int e = mf_check(MDB_DBS_FULL);
  return e ? e : real_(txn, name, flags, dbi);
}
int mdb_stat(MDB_txn *txn, MDB_dbi dbi, MDB_stat *st) {
  REAL(mdb_stat);
  int e = mf_check(EINVAL);
  return e ? e : real_(txn, dbi, st);
}
int mdb_get(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v) {
  REAL(mdb_get);
  int e = mf_check(MDB_BAD_TXN);
  return e ? e : real_(txn, dbi, k, v);
}
int mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v, unsigned flags) {
  REAL(mdb_put);
  int e = mf_check(MDB_MAP_FULL);
  return e ? e : real_(txn, dbi, k, v, flags);
}
int mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v) {
  REAL(mdb_del);
  int e = mf_check(MDB_MAP_FULL);
  return e ? e : real_(txn, dbi, k, v);
}
int mdb_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **c) {
  REAL(mdb_cursor_open);
  int e = mf_check(ENOMEM);
  return e ? e : real_(txn, dbi, c);
}
int mdb_cursor_get(MDB_cursor *c, MDB_val *k, MDB_val *v, MDB_cursor_op op) {
  REAL(mdb_cursor_get);
  int e = mf_check(MDB_CORRUPTED);
  return e ? e : real_(c, k, v, op);
}
int mdb_cursor_put(MDB_cursor *c, MDB_val *k, MDB_val *v, unsigned flags) {
  REAL(mdb_cursor_put);
  int e = mf_check(MDB_MAP_FULL);
  return e ? e : real_(c, k, v, flags);
}
int mdb_cursor_del(MDB_cursor *c, unsigned flags) {
  REAL(mdb_cursor_del);
  int e = mf_check(MDB_MAP_FULL);
  return e ? e : real_(c, flags);
}

/* ---- The scenario --------------------------------------------------------------------------- */

#define N_COMMITS 5

static const char *sc_buckets[] = {"b1", "b2", "by_user[\"u1\"]", "by_user[\"u2\"]", "global[]"};
#define N_BUCKETS (sizeof sc_buckets / sizeof *sc_buckets)
static unsigned char sc_keybuf[2][64];
static bs_val sc_keys[2];

typedef struct sc_run {
  const char *path;
  const bs_allocator *alloc; /* NULL = libc */
  int retry;                 /* transient mode: retry a failed step once */
  char *fp[N_COMMITS + 1];   /* reference run: the fingerprint after each commit */
  /* results */
  int rc, line, retries, last_commit;
  bs_error err;
} sc_run;

static bs_val v(const char *s) {
  bs_val x = {s, s ? strlen(s) : 0};
  return x;
}

static void sc_init_keys(void) {
  static const char *users[2] = {"u1", "u2"};
  for (int i = 0; i < 2; i++) {
    bs_scalar s;
    size_t n = 0;
    memset(&s, 0, sizeof s);
    s.type = BS_SCALAR_STRING;
    s.s = v(users[i]);
    assert_int_equal(bs_lookup_encode(sc_keybuf[i], sizeof sc_keybuf[i], &n, &s, 1, NULL), BS_OK);
    sc_keys[i].data = sc_keybuf[i];
    sc_keys[i].size = n;
  }
}

static int sc_bucket_vals(bs_val *out) {
  for (size_t i = 0; i < N_BUCKETS; i++) out[i] = v(sc_buckets[i]);
  return (int)N_BUCKETS;
}

/* One save: row id `id` of table `t` with data `d` into bucket b (NULL: no row), and a lookup
 * for user u (-1: none). */
static int sc_save(bs_writer *w, bs_tag tag, const char *t, const char *before, const char *id,
                   const char *b, const char *d, int u, bs_error *err) {
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  bs_lookup lk;
  bs_val par = v("{\"bucket\":\"x\"}");
  s.table = v(t);
  s.tag = tag;
  s.before_id = v(before);
  s.after_id = tag == BS_DELETE ? v(NULL) : v(id);
  if (tag == BS_DELETE && !before) s.before_id = v(id);
  row.bucket = v(b);
  row.object_type = v(t);
  row.object_id = v(id);
  row.data = v(d);
  if (b && tag != BS_DELETE) {
    s.rows = &row;
    s.n_rows = 1;
  }
  if (u >= 0 && tag != BS_DELETE) {
    lk.key = sc_keys[u];
    lk.params = &par;
    lk.n_params = 1;
    s.lookups = &lk;
    s.n_lookups = 1;
  }
  return bs_writer_save(w, &s, err);
}

static int sc_commit(bs_writer *w, const char *lsn, bs_error *err) {
  bs_commit_result r;
  return bs_writer_commit(&r, w, v(lsn), NULL, err);
}

static int on_chunk_count(const bs_chunk *c, void *payload) {
  *(size_t *)payload += c->n_ops;
  return 0;
}
static int on_params_count(const bs_val *p, void *payload) {
  (void)p;
  ++*(size_t *)payload;
  return 0;
}
static int on_changes(const bs_checkpoint_changes *c, void *payload) {
  *(size_t *)payload += c->n_updated_buckets;
  return 0;
}

/* Reads of every kind at the current checkpoint. */
static int sc_reads(bs_storage *st, bs_error *err) {
  bs_checkpoint cp;
  bs_checksum ck[N_BUCKETS];
  bs_val names[N_BUCKETS];
  bs_bucket_request req[N_BUCKETS];
  bs_status status;
  size_t n = 0;
  int more, rc;
  sc_bucket_vals(names);
  if ((rc = bs_get_checkpoint(&cp, st, err))) return rc;
  if ((rc = bs_get_checksums(ck, st, cp.op_id, names, N_BUCKETS, err))) return rc;
  /* twice: the second is served by the cache */
  if ((rc = bs_get_checksums(ck, st, cp.op_id, names, N_BUCKETS, err))) return rc;
  for (size_t i = 0; i < N_BUCKETS; i++) {
    req[i].bucket = names[i];
    req[i].after = 0;
  }
  if ((rc = bs_get_bucket_data(&more, st, cp.op_id, req, N_BUCKETS, NULL, on_chunk_count, &n, err)))
    return rc;
  if ((rc = bs_get_parameter_sets(st, cp.op_id, sc_keys, 2, BS_PARAM_LIMIT_DEFAULT, on_params_count,
                                  &n, err)))
    return rc;
  if ((rc = bs_get_checkpoint_changes(st, 0, cp.op_id, on_changes, &n, err))) return rc;
  return bs_get_status(&status, st, err);
}

static int sc_fingerprint(bs_storage *st, char **out, bs_error *err) {
  bs_checkpoint cp;
  bs_val names[N_BUCKETS];
  char *fp = NULL;
  int rc;
  sc_bucket_vals(names);
  if ((rc = bs_get_checkpoint(&cp, st, err))) return rc;
  rc = ft_fingerprint(st, cp.op_id, names, N_BUCKETS, sc_keys, 2, &fp, err);
  if (rc) return rc;
  if (cp.op_id == 0 && !cp.has_lsn) {
    /* no checkpoint: nothing may be visible; then it is the same state as no stream at all */
    for (char *line = fp; *line; line = strchr(line, '\n') + 1) {
      size_t n = (size_t)(strchr(line, '\n') - line);
      if ((line[0] == 'B' && (n < 12 || memcmp(line + n - 12, " ck=0 rows=0", 12))) ||
          (line[0] == 'L' && line[n - 1] != ':') || line[0] == ' ')
        return FT_EMISMATCH; /* visible data without a checkpoint */
    }
    free(fp);
    *out = strdup("C=0\n");
    return *out ? BS_OK : BS_ENOMEM;
  }
  if (cp.has_lsn) {
    size_t n = strlen(fp);
    char *p = realloc(fp, n + cp.lsn_size + 8);
    if (!p) {
      free(fp);
      return BS_ENOMEM;
    }
    fp = p;
    memcpy(fp + n, "lsn=", 4);
    memcpy(fp + n + 4, cp.lsn, cp.lsn_size);
    fp[n + 4 + cp.lsn_size] = 0;
  }
  *out = fp;
  return BS_OK;
}

/* STEP: run expr; in transient mode retry it once after a clean failure. */
#define STEP(expr)                                                                                 \
  do {                                                                                             \
    int rc_ = (expr);                                                                              \
    if (rc_ && s->retry && ft_clean_status(rc_)) {                                                 \
      s->retries++;                                                                                \
      rc_ = (expr);                                                                                \
    }                                                                                              \
    if (rc_) {                                                                                     \
      s->rc = rc_;                                                                                 \
      s->line = __LINE__;                                                                          \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

#define COMMIT(lsn)                                                                                \
  do {                                                                                             \
    STEP(sc_commit(w, lsn, &s->err));                                                              \
    s->last_commit++;                                                                              \
    if (s->fp[0] && !s->fp[s->last_commit]) {                                                      \
      STEP(sc_fingerprint(st, &s->fp[s->last_commit], &s->err));                                   \
    }                                                                                              \
  } while (0)

static void on_problem(const char *problem, void *payload) {
  bs_error *err = payload;
  if (!err->msg[0]) snprintf(err->msg, sizeof err->msg, "verify: %s", problem);
}

static int sc_verify(bs_db *db, bs_error *err) {
  uint64_t problems = 0;
  bs_error perr = {0, ""};
  int rc = bs_db_verify(&problems, db, on_problem, &perr, err);
  if (rc == BS_OK && problems) {
    rc = FT_EMISMATCH;
    if (err) *err = perr;
  }
  return rc;
}

static void sc_scenario(sc_run *s) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs;
  bs_managed_request mr;
  bs_head head;
  bs_stat stat;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  uint32_t sid = 0;
  uint64_t last = 0, id = 0;
  int found = 0, adv = 0;
  char idbuf[16], data[64];

  s->rc = BS_OK;
  s->line = 0;
  s->last_commit = 0;
  oo.flags = BS_OPEN_NOSYNC;
  oo.allocator = s->alloc;
  oo.checksum_cache_entries = 64;
  STEP(bs_open(&db, s->path, &oo, &s->err));
  STEP(bs_stream_create(&sid, db, "s1", NULL, &s->err));
  STEP(bs_storage_open(&st, db, sid, &s->err));
  STEP(bs_writer_open(&w, st, NULL, &s->err));
  STEP(bs_writer_snapshot_done(w, v("0001"), &s->err));

  /* phase 1: inserts with lookups */
  for (int i = 0; i < 8; i++) {
    snprintf(idbuf, sizeof idbuf, "r%d", i);
    snprintf(data, sizeof data, "{\"id\":\"r%d\",\"v\":%d}", i, i);
    STEP(sc_save(w, BS_INSERT, i % 3 ? "t1" : "t2", NULL, idbuf, sc_buckets[i % N_BUCKETS], data,
                 i % 2, &s->err));
  }
  STEP(bs_writer_flush(&last, w, &s->err));
  COMMIT("0002");
  STEP(sc_reads(st, &s->err));

  /* phase 2: updates moving rows between buckets, a key change, deletes, source_row */
  for (int i = 0; i < 6; i++) {
    snprintf(idbuf, sizeof idbuf, "r%d", i);
    snprintf(data, sizeof data, "{\"id\":\"r%d\",\"v\":%d}", i, 100 + i);
    STEP(sc_save(w, BS_UPDATE, i % 3 ? "t1" : "t2", NULL, idbuf, sc_buckets[(i + 1) % N_BUCKETS],
                 data, (i + 1) % 2, &s->err));
  }
  STEP(sc_save(w, BS_UPDATE, "t1", "r7", "r7b", "b1", "{\"id\":\"r7b\"}", -1, &s->err));
  STEP(sc_save(w, BS_DELETE, "t1", NULL, "r1", NULL, NULL, -1, &s->err));
  STEP(sc_save(w, BS_DELETE, "t1", NULL, "nope", NULL, NULL, -1, &s->err));
  STEP(bs_writer_flush(&last, w, &s->err));
  COMMIT("0003");

  memset(&mr, 0, sizeof mr);
  head.connection = v("1");
  head.lsn = v("0004");
  mr.user_id = v("user1");
  mr.heads = &head;
  mr.n_heads = 1;
  STEP(bs_create_managed_write_checkpoints(&id, &adv, st, &mr, 1, &s->err));

  /* full compaction of everything at the current checkpoint, parameters included */
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  co.compact_parameters = 1;
  co.max_ops_per_txn = 3; /* several short transactions */
  STEP(bs_compact(&cs, st, &co, &s->err));

  /* phase 3: more changes, a truncate, commit; reads after compaction */
  for (int i = 2; i < 6; i++) {
    snprintf(idbuf, sizeof idbuf, "r%d", i);
    snprintf(data, sizeof data, "{\"id\":\"r%d\",\"v\":%d}", i, 200 + i);
    STEP(sc_save(w, BS_UPDATE, i % 3 ? "t1" : "t2", NULL, idbuf, sc_buckets[i % N_BUCKETS], data,
                 i % 2, &s->err));
  }
  STEP(bs_writer_truncate(w, v("t2"), &s->err));
  COMMIT("0004");
  STEP(sc_reads(st, &s->err));
  STEP(bs_last_write_checkpoint(&id, &found, st, v("user1"), &head, 1, &s->err));

  /* incremental compaction, then a keepalive */
  co.incremental_only = 1;
  co.min_age_ms = 0;
  STEP(bs_compact(&cs, st, &co, &s->err));
  STEP(sc_save(w, BS_INSERT, "t1", NULL, "r9", "b2", "{\"id\":\"r9\"}", 0, &s->err));
  COMMIT("0005");
  STEP(bs_writer_keepalive(NULL, w, v("0006"), &s->err));
  s->last_commit++;
  if (s->fp[0] && !s->fp[s->last_commit]) STEP(sc_fingerprint(st, &s->fp[s->last_commit], &s->err));
  STEP(bs_db_stat(&stat, db, &s->err));
  STEP(sc_verify(db, &s->err));
out:
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* The state of the file at path, opened with libc's allocator: verifies, and returns its
 * fingerprint ("C=0" when there is no stream yet). */
static char *sc_reopen_fingerprint(const char *path) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_error err = {0, ""};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  char *fp = NULL;
  int rc;
  oo.flags = BS_OPEN_NOSYNC;
  rc = bs_open(&db, path, &oo, &err);
  if (rc) fail_msg("reopen %s: %s (%s)", path, bs_strerror(rc), err.msg);
  rc = sc_verify(db, &err);
  if (rc) fail_msg("verify after the fault: %s (%s)", bs_strerror(rc), err.msg);
  rc = bs_storage_open(&st, db, 0, &err);
  if (rc == BS_ENOTFOUND) {
    fp = strdup("C=0\n");
  } else {
    if (rc) fail_msg("storage_open: %s (%s)", bs_strerror(rc), err.msg);
    rc = sc_fingerprint(st, &fp, &err);
    if (rc) fail_msg("fingerprint after the fault: %s (%s)", bs_strerror(rc), err.msg);
    bs_storage_close(st);
  }
  bs_close(db);
  return fp;
}

typedef struct sc_fixture {
  char dir[256], path[320];
  sc_run ref;
} sc_fixture;

static void sc_fixture_init(sc_fixture *f, const char *tag) {
  memset(f, 0, sizeof *f);
  assert_int_equal(ft_tmpdir(f->dir, sizeof f->dir, tag), 0);
  snprintf(f->path, sizeof f->path, "%s/db", f->dir);
  sc_init_keys();
  /* the reference run: fingerprints after every commit */
  f->ref.path = f->path;
  f->ref.fp[0] = strdup("C=0\n");
  sc_scenario(&f->ref);
  if (f->ref.rc)
    fail_msg("reference run failed at line %d: %s (%s)", f->ref.line, bs_strerror(f->ref.rc),
             f->ref.err.msg);
  assert_int_equal(f->ref.last_commit, N_COMMITS);
  ft_rm_db(NULL, f->path);
}

static void sc_fixture_free(sc_fixture *f) {
  for (int i = 0; i <= N_COMMITS; i++) free(f->ref.fp[i]);
  ft_rm_db(f->dir, f->path);
}

/* Checks the outcome of one faulted run; returns 1 if the fault was reached. */
static void sc_check(sc_fixture *f, sc_run *s, const char *what, unsigned long n, int persistent) {
  char *fp;
  if (s->rc && !ft_clean_status(s->rc))
    fail_msg("%s N=%lu: unclean status %d at line %d (%s)", what, n, s->rc, s->line, s->err.msg);
  if (!persistent && s->rc)
    fail_msg("%s N=%lu (transient): the retried step still failed at line %d: %s (%s)", what, n,
             s->line, bs_strerror(s->rc), s->err.msg);
  fp = sc_reopen_fingerprint(f->path);
  {
    int want = persistent ? s->last_commit : N_COMMITS;
    if (strcmp(fp, f->ref.fp[want]) != 0)
      fail_msg("%s N=%lu (%s, failed at line %d: %s): state after reopen is not the state of "
               "commit %d\n--- got:\n%s--- want:\n%s",
               what, n, persistent ? "persistent" : "transient", s->line, bs_strerror(s->rc), want,
               fp, f->ref.fp[want]);
  }
  free(fp);
  ft_rm_db(NULL, f->path);
}

/* BS_FAULT_STRIDE=k injects at every k-th LMDB failure point only, starting at an offset drawn
 * from the run's seed (ct_run_seed "fault": make test's SEED moves it, BS_SEED replays one), so
 * that runs of other seeds reach the points between; the quick mode (make test) uses 4, a full
 * run (BS_TEST_QUICK unset) 1. */
static unsigned long stride(void) {
  const char *e = getenv("BS_FAULT_STRIDE"), *q = getenv("BS_TEST_QUICK");
  unsigned long k = e ? strtoul(e, NULL, 10) : (q && strcmp(q, "0") ? 4 : 1);
  return k ? k : 1;
}

static uint64_t g_seed; /* the run's (ct_run_seed) */

static unsigned long first_point(unsigned long step) {
  unsigned long first = 1 + (unsigned long)(ct_seed(g_seed, 1).s % step);
  if (step > 1)
    printf("(every %lu-th failure point from %lu; BS_SEED=%llu)\n", step, first,
           (unsigned long long)g_seed);
  return first;
}

static unsigned long total_points;

static void run_alloc_loop(int persistent) {
  sc_fixture f;
  ft_alloc fa;
  unsigned long n, reached = 0;
  sc_fixture_init(&f, "fault_alloc");
  for (n = 1;; n++) {
    sc_run s;
    memset(&s, 0, sizeof s);
    s.path = f.path;
    s.alloc = &fa.a;
    s.retry = !persistent;
    ft_alloc_init(&fa);
    ft_alloc_arm(&fa, n, persistent);
    sc_scenario(&s);
    if (fa.live != 0)
      fail_msg("alloc N=%lu: %ld blocks (%zu bytes) leaked (failed at line %d: %s)", n, fa.live,
               fa.live_bytes, s.line, s.err.msg);
    if (!fa.injected) break; /* the run no longer reaches N */
    reached++;
    sc_check(&f, &s, "alloc", n, persistent);
  }
  printf("alloc (%s): %lu failure points injected (allocations per run: %lu)\n",
         persistent ? "persistent" : "transient", reached, fa.calls);
  assert_true(reached > 50);
  total_points += reached;
  sc_fixture_free(&f);
}

static void run_mdb_loop(int persistent, int flavor) {
  sc_fixture f;
  unsigned long n, reached = 0, calls = 0, step = stride();
  sc_fixture_init(&f, "fault_mdb");
  for (n = first_point(step);; n += step) {
    sc_run s;
    memset(&s, 0, sizeof s);
    s.path = f.path;
    s.retry = !persistent;
    mf.injected = 0;
    calls = mf.calls;
    mf_arm(n, persistent, flavor);
    sc_scenario(&s);
    mf_arm(0, 0, 0);
    calls = mf.calls - calls;
    if (!mf.injected) break;
    reached++;
    sc_check(&f, &s, flavor == MF_NATURAL ? "lmdb(natural)" : "lmdb(EIO)", n, persistent);
  }
  printf("lmdb %s (%s): %lu failure points injected (LMDB calls per run: %lu)\n",
         flavor == MF_NATURAL ? "natural errors" : "EIO", persistent ? "persistent" : "transient",
         reached, calls);
  assert_true(reached > 50);
  total_points += reached;
  sc_fixture_free(&f);
}

/* ---- bs_backup, bs_db_export and bs_load under faults ---------------------------------------- */

/* The records of a database, copied out of bs_db_export for bs_load to read back. */
typedef struct rec_list {
  bs_record *r;
  size_t n, cap, next;
} rec_list;

static int rec_collect(const bs_record *rec, void *payload) {
  rec_list *l = payload;
  bs_record *d;
  char *bytes;
  if (l->n == l->cap) {
    bs_record *p = realloc(l->r, (l->cap = l->cap ? 2 * l->cap : 64) * sizeof *p);
    if (!p) return BS_ENOMEM;
    l->r = p;
  }
  d = &l->r[l->n];
  if (!(bytes = malloc(strlen(rec->table) + 1 + rec->key.size + rec->value.size + 1)))
    return BS_ENOMEM;
  strcpy(bytes, rec->table);
  d->table = bytes;
  bytes += strlen(rec->table) + 1;
  memcpy(bytes, rec->key.data, rec->key.size);
  if (rec->value.size) memcpy(bytes + rec->key.size, rec->value.data, rec->value.size);
  d->key.data = bytes;
  d->key.size = rec->key.size;
  d->value.data = bytes + rec->key.size;
  d->value.size = rec->value.size;
  d->stream = rec->stream;
  l->n++;
  return 0;
}

static int rec_next(bs_record *rec, void *payload) {
  rec_list *l = payload;
  if (l->next == l->n) return 0;
  *rec = l->r[l->next++];
  return 1;
}

static void rec_list_free(rec_list *l) {
  for (size_t i = 0; i < l->n; i++) free((void *)l->r[i].table);
  free(l->r);
}

static size_t dir_entries(const char *dir) {
  char cmd[400];
  FILE *p;
  size_t n = 0;
  int c;
  snprintf(cmd, sizeof cmd, "ls -A '%s'", dir);
  assert_non_null(p = popen(cmd, "r"));
  while ((c = fgetc(p)) != EOF) n += c == '\n';
  pclose(p);
  return n;
}

/* One faulted call (which = 0 backup, 1 export, 2 load) into out. A failure must be a clean code,
 * leave nothing at out and nothing beside it; a success (a transient fault the call absorbed, or
 * no fault reached) a file that opens, verifies and reads as the source. */
static void bl_check(int which, int rc, const bs_error *err, const char *out, const char *dir,
                     size_t entries, const char *ref_fp, const char *what, unsigned long n) {
  if (which == 1) { /* export writes nothing */
    if (rc && !ft_clean_status(rc))
      fail_msg("export %s N=%lu: unclean status %d (%s)", what, n, rc, err->msg);
    return;
  }
  if (rc) {
    if (!ft_clean_status(rc))
      fail_msg("%s %s N=%lu: unclean status %d (%s)", which ? "load" : "backup", what, n, rc,
               err->msg);
    if (access(out, F_OK) == 0)
      fail_msg("%s %s N=%lu failed (%s) but left a file at its path", which ? "load" : "backup",
               what, n, err->msg);
  } else {
    char *fp = sc_reopen_fingerprint(out);
    if (strcmp(fp, ref_fp) != 0)
      fail_msg("%s %s N=%lu: the copy reads differently\n--- got:\n%s--- want:\n%s",
               which ? "load" : "backup", what, n, fp, ref_fp);
    free(fp);
    ft_rm_db(NULL, out);
  }
  if (dir_entries(dir) != entries)
    fail_msg("%s %s N=%lu: a temporary file or directory was left beside the copy",
             which ? "load" : "backup", what, n);
}

/* Every LMDB call (persistent and transient EIO) and every allocation (of the db for backup and
 * export, of the options for load) fails in turn; the source file is compared before and after. */
static void test_backup_load_faults(void **state) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_backup_options bo = BS_BACKUP_OPTIONS_INIT;
  sc_fixture f;
  sc_run s;
  rec_list recs = {0};
  ft_alloc fa;
  bs_db *db = NULL;
  char out[400], *ref_fp;
  unsigned long step = stride(), reached = 0;
  size_t entries;
  (void)state;

  sc_fixture_init(&f, "fault_backup");
  memset(&s, 0, sizeof s);
  s.path = f.path;
  sc_scenario(&s); /* the source: the scenario's end state, no fault */
  assert_int_equal(s.rc, BS_OK);
  ref_fp = sc_reopen_fingerprint(f.path);
  snprintf(out, sizeof out, "%s/copy", f.dir);
  entries = dir_entries(f.dir);

  ft_alloc_init(&fa);
  oo.flags = BS_OPEN_NOSYNC;
  oo.allocator = &fa.a;
  assert_int_equal(bs_open(&db, f.path, &oo, NULL), BS_OK);
  assert_int_equal(bs_db_export(db, 0, rec_collect, &recs, NULL), BS_OK);
  assert_true(recs.n > 20);

  for (int which = 0; which < 3; which++) {
    for (int mode = 0; mode < 3; mode++) { /* 0: LMDB persistent, 1: LMDB transient, 2: malloc */
      unsigned long n;
      for (n = first_point(step);; n += step) {
        bs_error err = {0, ""};
        long live = fa.live;
        rec_list sink = {0};
        int rc;
        mf.injected = 0;
        fa.injected = 0;
        recs.next = 0;
        if (mode < 2) {
          mf_arm(n, mode == 0, MF_EIO);
        } else {
          ft_alloc_arm(&fa, n, 0);
        }
        bo.allocator = which == 2 ? &fa.a : NULL;
        rc = which == 0   ? bs_backup(db, out, &bo, &err)
             : which == 1 ? bs_db_export(db, 0, rec_collect, &sink, &err)
                          : bs_load(out, &bo, rec_next, &recs, &err);
        mf_arm(0, 0, 0);
        ft_alloc_arm(&fa, 0, 0);
        rec_list_free(&sink);
        if (fa.live != live)
          fail_msg("call %d mode %d N=%lu: %ld allocations leaked", which, mode, n, fa.live - live);
        bl_check(which, rc, &err, out, f.dir, entries, ref_fp,
                 mode == 0   ? "lmdb persistent"
                 : mode == 1 ? "lmdb transient"
                             : "malloc",
                 n);
        if (!mf.injected && !fa.injected) break;
        reached++;
      }
      /* each call makes many LMDB calls and allocations (export allocates nothing) */
      if (which != 1 || mode != 2) assert_true(n > 10);
    }
  }
  bs_close(db);
  assert_int_equal(fa.live, 0);
  {
    char *fp = sc_reopen_fingerprint(f.path); /* the source is untouched */
    assert_string_equal(fp, ref_fp);
    free(fp);
  }
  printf("backup/export/load: %lu failure points injected\n", reached);
  total_points += reached;
  rec_list_free(&recs);
  free(ref_fp);
  sc_fixture_free(&f);
}

/* ---- The failing vtable wrapper under the checksum cache ------------------------------------ */

/* Writes commits 1..n_cp into buckets c0..c3 (with updates so ranges are not trivial); cps gets
 * each checkpoint. */
static void write_commits(bs_storage *st, uint64_t *cps, int n_cp) {
  bs_writer *w = NULL;
  bs_commit_result r;
  char id[16], lsn[16], data[64], b[16];
  assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, v("0000"), NULL), BS_OK);
  for (int c = 0; c < n_cp; c++) {
    for (int i = 0; i < 6; i++) {
      snprintf(id, sizeof id, "r%d", (c * 7 + i) % 10);
      snprintf(b, sizeof b, "c%d", (c + i) % 4);
      snprintf(data, sizeof data, "{\"c\":%d,\"i\":%d}", c, i);
      assert_int_equal(sc_save(w, BS_UPDATE, "t", NULL, id, b, data, -1, NULL), BS_OK);
    }
    snprintf(lsn, sizeof lsn, "%04d", c + 1);
    assert_int_equal(bs_writer_commit(&r, w, v(lsn), NULL, NULL), BS_OK);
    cps[c] = r.checkpoint;
  }
  bs_writer_close(w);
}

static void test_wrapper_under_cache(void **state) {
  char dir[256], path[320];
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL, *plain = NULL;
  bs_storage *inner = NULL, *st = NULL, *ref = NULL;
  ft_vt_config cfg;
  uint64_t cps[6];
  bs_val names[4] = {{"c0", 2}, {"c1", 2}, {"c2", 2}, {"c3", 2}};
  bs_checksum want[6][4], got[4];
  int want_rc[6];
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  unsigned long k, injected = 0, failed_calls = 0;
  (void)state;
  assert_int_equal(ft_tmpdir(dir, sizeof dir, "fault_vt"), 0);
  snprintf(path, sizeof path, "%s/db", dir);
  oo.flags = BS_OPEN_NOSYNC;
  assert_int_equal(bs_open(&db, path, &oo, NULL), BS_OK);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&inner, db, 0, NULL), BS_OK);
  write_commits(inner, cps, 6);
  /* compaction bumps generations: cached bases of older generations must not be reused */
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  co.max_op_id = cps[2];
  assert_int_equal(bs_compact(NULL, inner, &co, NULL), BS_OK);
  /* the reference: a second handle without any cache */
  oo.checksum_cache_entries = (size_t)-1;
  assert_int_equal(bs_open(&plain, path, &oo, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&ref, plain, 0, NULL), BS_OK);
  for (int c = 0; c < 6; c++) {
    want_rc[c] = bs_get_checksums(want[c], ref, cps[c], names, 4, NULL);
    /* a checkpoint below the horizon may be torn by the CLEAR (contract.md 5.5) */
    assert_true(want_rc[c] == BS_OK || (want_rc[c] == BS_EINVALIDATED && cps[c] < cps[2]));
  }
  assert_int_equal(want_rc[5], BS_OK);
  memset(&cfg, 0, sizeof cfg);
  assert_int_equal(ft_wrap(&st, inner, &cfg), BS_OK);
  for (k = 1;; k++) {
    unsigned long before = cfg.injected;
    /* fail the k-th call of both checksum slots; query a walk of checkpoints */
    memset(cfg.calls, 0, sizeof cfg.calls);
    cfg.fail_at[FT_checksums] = k;
    cfg.fail_at[FT_checksum_ranges] = k;
    cfg.status[FT_checksum_ranges] = BS_ENOMEM;
    for (int rep = 0; rep < 3; rep++) {
      for (int c = 0; c < 6; c++) {
        int ci = (c * (rep + 2) + (int)k) % 6;
        int rc = bs_get_checksums(got, st, cps[ci], names, 4, NULL);
        if (rc == BS_EIO || rc == BS_ENOMEM) {
          failed_calls++;
          /* the failed call left nothing behind: the retry is exact */
          memset(got, 0xee, sizeof got);
          rc = bs_get_checksums(got, st, cps[ci], names, 4, NULL);
        }
        assert_int_equal(rc, want_rc[ci]);
        if (rc != BS_OK) continue;
        for (int b = 0; b < 4; b++) {
          if (got[b].checksum != want[ci][b].checksum || got[b].count != want[ci][b].count)
            fail_msg("k=%lu: bucket c%d at %llu: cache says %u/%llu, backend %u/%llu", k, b,
                     (unsigned long long)cps[ci], got[b].checksum, (unsigned long long)got[b].count,
                     want[ci][b].checksum, (unsigned long long)want[ci][b].count);
        }
      }
    }
    if (cfg.injected == before) break;
    injected += cfg.injected - before;
  }
  printf("vtable wrapper: %lu faults injected under the checksum cache (%lu calls failed)\n",
         injected, failed_calls);
  assert_true(injected > 0 && failed_calls > 0);
  total_points += injected;
  bs_storage_close(st);
  bs_storage_close(ref);
  bs_close(plain);
  bs_close(db);
  ft_rm_db(dir, path);
}

/* ---- Disk full ------------------------------------------------------------------------------ */

static void test_disk_full(void **state) {
  char dir[256], path[320];
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  bs_stat stat;
  bs_val names[4] = {{"c0", 2}, {"c1", 2}, {"c2", 2}, {"c3", 2}};
  char *last_fp = NULL, *fp = NULL, *data;
  uint64_t last_cp = 0, problems = 1;
  int mounted = 0, rc = BS_OK, commits = 0;
  (void)state;
  assert_int_equal(ft_tmpdir(dir, sizeof dir, "fault_full"), 0);
  /* a real full filesystem when this process may mount a 4 MiB tmpfs; else injected ENOSPC */
  mounted = !getenv("BS_FAULT_NOMOUNT") && mount("tmpfs", dir, "tmpfs", 0, "size=4m") == 0;
  snprintf(path, sizeof path, "%s/db", dir);
  oo.map_size = 256 * 1024; /* small: the map must grow several times before the disk is full */
  assert_int_equal(bs_open(&db, path, &oo, &err), BS_OK);
  assert_int_equal(bs_stream_create(NULL, db, "s", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, 0, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(w, v("0000"), NULL), BS_OK);
  data = malloc(2100);
  assert_non_null(data);
  for (int c = 0; c < 10000 && rc == BS_OK; c++) {
    bs_commit_result r;
    char id[16], lsn[16], b[16];
    if (!mounted && c == 40) mf.commit_errno = ENOSPC;
    for (int i = 0; i < 20 && rc == BS_OK; i++) {
      snprintf(id, sizeof id, "r%d", c * 20 + i);
      snprintf(b, sizeof b, "c%d", i % 4);
      snprintf(data, 2100, "{\"pad\":\"%02000d\"}", c);
      rc = sc_save(w, BS_INSERT, "t", NULL, id, b, data, -1, &err);
    }
    snprintf(lsn, sizeof lsn, "%06d", c + 1);
    if (rc == BS_OK) rc = bs_writer_commit(&r, w, v(lsn), NULL, &err);
    if (rc == BS_OK) {
      commits++;
      last_cp = r.checkpoint;
      free(last_fp);
      last_fp = NULL;
      if (c % 10 == 0 || !mounted) /* a full fingerprint now and then; the last one below */
        assert_int_equal(ft_fingerprint(st, last_cp, names, 4, NULL, 0, &last_fp, NULL), BS_OK);
    }
  }
  mf.commit_errno = 0;
  free(data);
  printf("disk full (%s): %d commits, then %s (%s)\n", mounted ? "4 MiB tmpfs" : "injected ENOSPC",
         commits, bs_strerror(rc), err.msg);
  assert_true(rc == BS_EIO);
  /* LMDB reports a write the full disk refused whole as ENOSPC, and one it cut short as EIO
   * (mdb_page_flush); which of the two ends a real disk depends on where the file's pages fall */
  assert_true(strstr(err.msg, strerror(ENOSPC)) || (mounted && strstr(err.msg, strerror(EIO))));
  assert_true(commits > 5);
  /* the same handle still reads the last commit */
  {
    bs_checkpoint cp;
    assert_int_equal(bs_get_checkpoint(&cp, st, NULL), BS_OK);
    assert_int_equal(cp.op_id, last_cp);
  }
  assert_int_equal(bs_db_stat(&stat, db, NULL), BS_OK);
  if (mounted) assert_true(stat.file_bytes > oo.map_size); /* the map did grow */
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  /* reopen (the disk still full): verifies, at the last commit */
  db = NULL;
  assert_int_equal(bs_open(&db, path, NULL, &err), BS_OK);
  assert_int_equal(bs_db_verify(&problems, db, NULL, NULL, NULL), BS_OK);
  assert_int_equal(problems, 0);
  assert_int_equal(bs_storage_open(&st, db, 0, NULL), BS_OK);
  if (!last_fp) assert_int_equal(bs_get_checkpoint(&(bs_checkpoint){0}, st, NULL), BS_OK);
  assert_int_equal(ft_fingerprint(st, last_cp, names, 4, NULL, 0, &fp, NULL), BS_OK);
  {
    bs_checkpoint cp;
    assert_int_equal(bs_get_checkpoint(&cp, st, NULL), BS_OK);
    assert_int_equal(cp.op_id, last_cp);
  }
  if (last_fp) assert_string_equal(fp, last_fp);
  free(fp);
  free(last_fp);
  bs_storage_close(st);
  bs_close(db);
  ft_rm_db(NULL, path);
  if (mounted) umount2(dir, MNT_DETACH);
  ft_rm_db(dir, NULL);
}

static void test_alloc_persistent(void **state) {
  (void)state;
  run_alloc_loop(1);
}
static void test_alloc_transient(void **state) {
  (void)state;
  run_alloc_loop(0);
}
static void test_mdb_persistent(void **state) {
  (void)state;
  run_mdb_loop(1, MF_EIO);
}
static void test_mdb_transient_eio(void **state) {
  (void)state;
  run_mdb_loop(0, MF_EIO);
}
static void test_mdb_transient_natural(void **state) {
  (void)state;
  run_mdb_loop(0, MF_NATURAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_persistent),
      cmocka_unit_test(test_alloc_transient),
      cmocka_unit_test(test_mdb_persistent),
      cmocka_unit_test(test_mdb_transient_eio),
      cmocka_unit_test(test_mdb_transient_natural),
      cmocka_unit_test(test_wrapper_under_cache),
      cmocka_unit_test(test_disk_full),
      cmocka_unit_test(test_backup_load_faults),
  };
  int rc;
  g_seed = ct_run_seed("fault");
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  printf("test_fault: %lu failure points injected in total\n", total_points);
  return rc;
}
