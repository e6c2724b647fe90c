/* test_front: the front's argument validation and dispatch (storage.c), on a fake db and a
 * fake storage whose every vtable slot counts calls. Every check must return its documented
 * code with a message naming the argument, and must not reach the backend. Also: request
 * sorting/deduplication, option defaults, BS_EUNSUPPORTED for missing slots, read-only
 * refusals, checkpoint waiting (in-process wakeup and polling) and the listener. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "util_fault.h"

/* ---- the fake backend ---- */
static int calls; /* backend calls */
static bs_bucket_request seen_req[16];
static size_t seen_n;
static bs_batch_options seen_batch;
static size_t seen_limit;
static bs_val seen_lk[16]; /* the lookups of the last parameter_sets call */
static size_t seen_nlk;
static bs_compact_options seen_compact;
static int seen_create_empty;
static uint64_t fake_cp;

typedef struct fst {
  bs_storage base;
} fst;
typedef struct fw {
  bs_writer base;
} fw;

static void s_destroy(bs_storage *st) {
  free(st);
}
static const bs_writer_vtable full_wt;
static const bs_writer_vtable *open_wt = &full_wt;
static fw *last_writer; /* a writer the front refused (no destroy) is freed by the test */
static int open_null;   /* writer_open and storage_open answer BS_OK without a handle */
static int s_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *o,
                         bs_error *err) {
  fw *w = open_null ? NULL : calloc(1, sizeof *w);
  calls++;
  last_writer = w;
  *out = w ? &w->base : NULL;
  if (!w) return BS_OK;
  w->base.vt = open_wt;
  w->base.st = st;
  return BS_OK;
}
static void s_writer_close(bs_writer *w) {
  free(w);
}
static size_t trunc_saw; /* seen_items when the last truncate reached the backend */
static int s_trunc(bs_writer *w, bs_val t, int drop, bs_error *err);
/* What the front handed to the last flush or commit, and what the next flush answers. */
static void (*on_batch)(const bs_write_batch *b);
static size_t seen_items;
static int64_t seen_requested_at;
static int flush_rc;
static void note_batch(const bs_write_batch *b) {
  seen_items = b->n;
  for (size_t i = 0; i < b->n; i++)
    if (b->items[i].wcp) seen_requested_at = b->items[i].wcp->requested_at_ms;
  if (on_batch) on_batch(b);
}
static int s_flush(uint64_t *last, bs_writer *w, const bs_write_batch *b, bs_error *err) {
  calls++;
  note_batch(b);
  *last = 7;
  return flush_rc;
}
static int s_commit(bs_commit_result *out, bs_writer *w, const bs_write_batch *b, bs_val lsn,
                    int ce, bs_error *err) {
  calls++;
  note_batch(b);
  seen_create_empty = ce;
  out->checkpoint_created = 1;
  out->checkpoint = fake_cp ? __atomic_load_n(&fake_cp, __ATOMIC_SEQ_CST) : 7;
  return BS_OK;
}
static int s_lsn(bs_writer *w, bs_val lsn, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_source_row(bs_writer *w, const bs_write_batch *b, bs_val t, bs_val r,
                        int (*fn)(const bs_val *, void *), void *p, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_bucket_data(int *more, bs_storage *st, uint64_t cp, const bs_bucket_request *req,
                         size_t n, const bs_batch_options *o, int (*fn)(const bs_chunk *, void *),
                         void *p, bs_error *err) {
  calls++;
  seen_n = n;
  memcpy(seen_req, req, n * sizeof *req);
  seen_batch = *o;
  *more = 1;
  return BS_OK;
}
static int s_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t cp,
                       const bs_val *b, size_t n, bs_error *err) {
  calls++;
  for (size_t i = 0; i < n; i++) out[i].checksum = (uint32_t)b[i].size, out[i].count = cp;
  return BS_OK;
}
static int s_changes(bs_storage *st, uint64_t from, uint64_t to,
                     int (*fn)(const bs_checkpoint_changes *, void *), void *p, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_params(bs_storage *st, uint64_t cp, const bs_val *l, size_t n, size_t limit,
                    int (*fn)(const bs_val *, void *), void *p, bs_error *err) {
  calls++;
  seen_limit = limit;
  seen_nlk = n;
  memcpy(seen_lk, l, n * sizeof *l);
  return BS_OK;
}
static int s_wcp_mode(bs_storage *st, bs_write_checkpoint_mode m, bs_val e, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_managed(uint64_t *ids, int *adv, bs_storage *st, const bs_managed_request *r, size_t n,
                     bs_error *err) {
  calls++;
  *adv = 1;
  return BS_OK;
}
static int s_last_wcp(uint64_t *id, int *found, bs_storage *st, bs_val u, const bs_head *h,
                      size_t n, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_delete_before(uint64_t *d, bs_storage *st, int64_t t, bs_error *err) {
  calls++;
  *d = 3;
  return BS_OK;
}
static int s_compact(bs_compact_stats *s, bs_storage *st, const bs_compact_options *o,
                     bs_error *err) {
  calls++;
  seen_compact = *o;
  return BS_OK;
}
static int s_compact_initial(uint64_t *b, bs_storage *st, uint64_t m, uint64_t min, bs_error *err) {
  calls++;
  return BS_OK;
}
static int cp_reads; /* s_status calls, atomic: test_wait_and_listener's threads */
/* The checkpoint's one source: bs_get_checkpoint and the wait's polling read it here. */
static int s_status(bs_status *out, bs_storage *st, bs_error *err) {
  calls++;
  __atomic_add_fetch(&cp_reads, 1, __ATOMIC_SEQ_CST);
  out->checkpoint = __atomic_load_n(&fake_cp, __ATOMIC_SEQ_CST);
  return BS_OK;
}
static int s_report(bs_storage *st, const char *m, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_clear(bs_storage *st, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_terminate(bs_storage *st, int c, bs_error *err) {
  calls++;
  return BS_OK;
}
static int s_list(bs_storage *st, bs_val after, int (*fn)(const bs_bucket_info *, void *), void *p,
                  bs_error *err) {
  calls++;
  return BS_OK;
}
static int list_cb(const bs_bucket_info *info, void *payload) {
  return 0;
}

static const bs_writer_vtable full_wt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = s_writer_close,
    .truncate = s_trunc,
    .flush = s_flush,
    .commit = s_commit,
    .snapshot_done = s_lsn,
    .resume_lsn = s_lsn,
    .source_row = s_source_row,
};
static bs_storage_vtable full_vt = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = s_destroy,
    .writer_open = s_writer_open,
    .bucket_data = s_bucket_data,
    .checksums = s_checksums,
    .checkpoint_changes = s_changes,
    .parameter_sets = s_params,
    .set_write_checkpoint_mode = s_wcp_mode,
    .create_managed_write_checkpoints = s_managed,
    .last_write_checkpoint = s_last_wcp,
    .delete_checkpoint_requests_before = s_delete_before,
    .compact = s_compact,
    .compact_initial_replication = s_compact_initial,
    .get_status = s_status,
    .report_error = s_report,
    .clear = s_clear,
    .terminate = s_terminate,
    .list_buckets = s_list,
};
static bs_storage_vtable empty_vt = {.version = BS_STORAGE_VTABLE_VERSION, .destroy = s_destroy};
static bs_storage_vtable old_vt; /* version 0: every slot too new */
static const bs_storage_vtable *open_vt = &full_vt;

typedef struct fdb {
  bs_db base;
} fdb;

static void d_close(bs_db *db) {
  free(db);
}
static int d_stream_create(uint32_t *id, bs_db *db, bs_val name, const bs_stream_options *o,
                           bs_error *err) {
  calls++;
  *id = 1;
  return BS_OK;
}
static fst *last_opened; /* a storage the front refused (no destroy) is freed by the test */
static int d_storage_open(bs_storage **out, bs_db *db, uint32_t id, bs_error *err) {
  fst *s = calloc(1, sizeof *s);
  last_opened = s;
  if (open_null) {
    free(s);
    *out = NULL;
    return BS_OK;
  }
  s->base.vt = open_vt;
  s->base.db = db;
  s->base.stream_id = 1;
  *out = &s->base;
  return BS_OK;
}
static const bs_db_vtable fake_ops = {.version = BS_DB_VTABLE_VERSION,
                                      .destroy = d_close,
                                      .stream_create = d_stream_create,
                                      .storage_open = d_storage_open};

static bs_db *fake_db(unsigned flags) {
  fdb *d = calloc(1, sizeof *d);
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db;
  o.flags = flags;
  d->base.vt = &fake_ops;
  d->base.flags = flags;
  assert_int_equal(bs_open_backend(&db, &d->base, &o, NULL), BS_OK);
  return db;
}

static bs_storage *fake_storage(bs_db *db) {
  bs_storage *st;
  assert_int_equal(bs_storage_open(&st, db, 0, NULL), BS_OK);
  return st;
}

/* rc must be code, err must carry code and a message containing what; no backend call */
#define EXPECT(expr, want_, what)                                                                  \
  do {                                                                                             \
    bs_error err_;                                                                                 \
    int before_ = calls, rc_;                                                                      \
    memset(&err_, 0, sizeof err_);                                                                 \
    rc_ = (expr);                                                                                  \
    (void)err_;                                                                                    \
    if (rc_ != (want_) || !strstr(err_.msg, (what)))                                               \
      fprintf(stderr, "%s:%d: rc %d msg '%s'\n", __FILE__, __LINE__, rc_, err_.msg);               \
    assert_int_equal(rc_, (want_));                                                                \
    assert_int_equal(err_.code, (want_));                                                          \
    assert_non_null(strstr(err_.msg, (what)));                                                     \
    assert_int_equal(calls, before_);                                                              \
  } while (0)
#define E (&err_)

static const uint64_t TOO_HIGH = 0x8000000000000000ull;

static void half_free(void *o, void *p) {
  free(p);
}

static void test_open_checks(void **state) {
  bs_db *db = (bs_db *)1;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_allocator half = {NULL, NULL, NULL, NULL};
  (void)state;
  EXPECT(bs_open(NULL, "x", NULL, E), BS_EINVAL, "out");
  EXPECT(bs_open(&db, NULL, NULL, E), BS_EINVAL, "path");
  assert_null(db);
  EXPECT(bs_open(&db, "", NULL, E), BS_EINVAL, "path");
  o.version = 99;
  EXPECT(bs_open(&db, "/tmp/x", &o, E), BS_EINVAL, "opts->version");
  EXPECT(bs_open_memory(&db, &o, E), BS_EINVAL, "opts->version");
  o.version = BS_OPEN_OPTIONS_VERSION;
  o.flags = 0x100;
  EXPECT(bs_open_memory(&db, &o, E), BS_EINVAL, "opts->flags");
  o.flags = 0;
  half.malloc_fn = NULL;
  half.free_fn = half_free;
  o.allocator = &half;
  EXPECT(bs_open_memory(&db, &o, E), BS_EINVAL, "opts->allocator");
  EXPECT(bs_open_memory(NULL, NULL, E), BS_EINVAL, "out");
  bs_close(NULL); /* no-op */
}

static void test_strerror(void **state) {
  static const struct {
    int code;
    const char *sym;
  } t[] = {{BS_OK, "BS_OK"},
           {BS_EINVAL, "BS_EINVAL"},
           {BS_ENOTFOUND, "BS_ENOTFOUND"},
           {BS_ETOOBIG, "BS_ETOOBIG"},
           {BS_ELIMIT, "BS_ELIMIT"},
           {BS_ESTATE, "BS_ESTATE"},
           {BS_EINVALIDATED, "BS_EINVALIDATED"},
           {BS_ESTALE, "BS_ESTALE"},
           {BS_ECORRUPT, "BS_ECORRUPT"},
           {BS_ENOMEM, "BS_ENOMEM"},
           {BS_EIO, "BS_EIO"},
           {BS_EBUSY, "BS_EBUSY"},
           {BS_EUNSUPPORTED, "BS_EUNSUPPORTED"},
           {BS_ECANCELED, "BS_ECANCELED"},
           {BS_EUSER, "BS_EUSER"}};
  (void)state;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    const char *s = bs_strerror(t[i].code);
    assert_int_equal(strncmp(s, t[i].sym, strlen(t[i].sym)), 0);
    assert_int_equal(s[strlen(t[i].sym)], ':');
  }
}

/* bs_version() is the linked library's version: its parts agree with its string and with the
 * header this test was built against (one build), and NULL parts are allowed. */
static void test_version(void **state) {
  int major = -1, minor = -1, patch = -1;
  char parts[32];
  (void)state;
  const char *v = bs_version(&major, &minor, &patch);
  assert_string_equal(v, BS_VERSION_STRING);
  assert_int_equal(major, BS_VERSION_MAJOR);
  assert_int_equal(minor, BS_VERSION_MINOR);
  assert_int_equal(patch, BS_VERSION_PATCH);
  snprintf(parts, sizeof parts, "%d.%d.%d", major, minor, patch);
  assert_string_equal(parts, v);
  assert_int_equal(major * 10000 + minor * 100 + patch, BS_VERSION_NUMBER);
  assert_ptr_equal(bs_version(NULL, NULL, NULL), v);
}

static void test_stream_checks(void **state) {
  bs_db *db = fake_db(0), *ro = fake_db(BS_OPEN_RDONLY);
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  char name[300];
  uint32_t id = 0;
  (void)state;
  memset(name, 'n', sizeof name);
  name[256] = 0;
  EXPECT(bs_stream_create(&id, NULL, "s", NULL, E), BS_EINVAL, "db");
  EXPECT(bs_stream_create(&id, db, NULL, NULL, E), BS_EINVAL, "name");
  EXPECT(bs_stream_create(&id, db, "", NULL, E), BS_EINVAL, "name");
  EXPECT(bs_stream_create(&id, db, name, NULL, E), BS_ETOOBIG, "BS_MAX_STREAM_NAME");
  so.hash = (bs_hash)5;
  EXPECT(bs_stream_create(&id, db, "s", &so, E), BS_EINVAL, "opts->hash");
  so.hash = BS_HASH_SHA256;
  so.version = 0;
  EXPECT(bs_stream_create(&id, db, "s", &so, E), BS_EINVAL, "opts->version");
  EXPECT(bs_stream_create(&id, ro, "s", NULL, E), BS_ESTATE, "read-only");
  name[255] = 0;
  assert_int_equal(bs_stream_create(&id, db, name, NULL, NULL), BS_OK);
  assert_int_equal(id, 1);
  EXPECT(bs_stream_list(db, NULL, NULL, E), BS_EINVAL, "fn");
  EXPECT(bs_stream_list(NULL, NULL, NULL, E), BS_EINVAL, "db");
  EXPECT(bs_db_stat((bs_stat *)name, db, E), BS_EUNSUPPORTED, "stat");
  EXPECT(bs_db_stat(NULL, db, E), BS_EINVAL, "out");
  EXPECT(bs_db_verify(NULL, NULL, NULL, NULL, E), BS_EINVAL, "db");
  EXPECT(bs_storage_open(NULL, db, 0, E), BS_EINVAL, "out");
  bs_storage *st = fake_storage(db);
  assert_ptr_equal(st->db, db);
  assert_non_null(db->front->cache); /* the front's, beside the backend's base */
  assert_int_equal(bs_storage_stream_id(st), 1);
  assert_int_equal(bs_storage_stream_id(NULL), 0);
  bs_storage_close(st);
  bs_storage_close(NULL);
  bs_close(db);
  bs_close(ro);
}

/* bs_writer_check_save(w, change) answers as bs_writer_save(w, change) does, the same code
 * and message, and queues nothing; then the save itself (queued when it is accepted). */
static void expect_save(bs_writer *w, const bs_save *change, int want, const char *what) {
  bs_error checked, saved;
  size_t queued = w->front->q.n;
  int before = calls;
  memset(&checked, 0, sizeof checked);
  memset(&saved, 0, sizeof saved);
  assert_int_equal(bs_writer_check_save(w, change, &checked), want);
  assert_int_equal(w->front->q.n, queued);
  assert_int_equal(bs_writer_save(w, change, &saved), want);
  assert_int_equal(checked.code, saved.code);
  assert_string_equal(checked.msg, saved.msg);
  assert_int_equal(calls, before); /* below the auto-flush bound: no backend call */
  if (want != BS_OK) assert_non_null(strstr(saved.msg, what));
  assert_int_equal(w->front->q.n, queued + (want == BS_OK));
}

static void test_writer_checks(void **state) {
  bs_db *db = fake_db(0), *ro = fake_db(BS_OPEN_RDONLY);
  bs_storage *st = fake_storage(db), *rost = fake_storage(ro);
  bs_writer *w = NULL;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
  static char big[BS_MAX_OP_DATA + 1];
  bs_row row = {{"b", 1}, {"t", 1}, {"i", 1}, {"{}", 2}};
  bs_val params[1] = {{"{}", 2}};
  bs_lookup lk = {{"k", 1}, params, 1};
  bs_save s = BS_SAVE_INIT;
  (void)state;
  EXPECT(bs_writer_open(&w, NULL, NULL, E), BS_EINVAL, "st");
  EXPECT(bs_writer_open(NULL, st, NULL, E), BS_EINVAL, "out");
  wo.version = 2;
  EXPECT(bs_writer_open(&w, st, &wo, E), BS_EINVAL, "opts->version");
  EXPECT(bs_writer_open(&w, rost, NULL, E), BS_ESTATE, "read-only");
  assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);

  s.table = bs__val_str("users");
  s.after_id = bs__val_str("r1");
  s.rows = &row;
  s.n_rows = 1;
  s.lookups = &lk;
  s.n_lookups = 1;
  expect_save(w, &s, BS_OK, "");
  expect_save(w, NULL, BS_EINVAL, "change");
  s.version = 0;
  expect_save(w, &s, BS_EINVAL, "change->version");
  s.version = BS_SAVE_VERSION;
  s.tag = (bs_tag)9;
  expect_save(w, &s, BS_EINVAL, "change->tag");
  s.tag = BS_INSERT;
  s.table.size = 0;
  expect_save(w, &s, BS_EINVAL, "change->table");
  s.table.data = big;
  s.table.size = BS_MAX_TABLE_NAME + 1;
  expect_save(w, &s, BS_ETOOBIG, "BS_MAX_TABLE_NAME");
  s.table = bs__val_str("users");
  s.after_id.data = NULL;
  s.after_id.size = 0;
  expect_save(w, &s, BS_EINVAL, "change->after_id");
  s.after_id.data = big;
  s.after_id.size = BS_MAX_REPLICA_ID + 1;
  expect_save(w, &s, BS_ETOOBIG, "BS_MAX_REPLICA_ID");
  s.after_id.size = BS_MAX_REPLICA_ID; /* exactly the limit is fine */
  expect_save(w, &s, BS_OK, "");
  s.before_id.data = big;
  s.before_id.size = BS_MAX_REPLICA_ID + 1;
  expect_save(w, &s, BS_ETOOBIG, "change->before_id");
  s.before_id.data = NULL;
  s.before_id.size = 0;
  s.tag = BS_DELETE;
  s.after_id.data = NULL;
  s.after_id.size = 0;
  expect_save(w, &s, BS_EINVAL, "before_id");
  s.tag = BS_INSERT;
  s.after_id = bs__val_str("r1");
  row.bucket.data = big;
  row.bucket.size = BS_MAX_BUCKET_NAME + 1;
  expect_save(w, &s, BS_ETOOBIG, "rows[0].bucket");
  row.bucket.size = 0;
  expect_save(w, &s, BS_EINVAL, "rows[0].bucket");
  row.bucket = bs__val_str("b");
  row.data.data = big;
  row.data.size = BS_MAX_OP_DATA + 1;
  expect_save(w, &s, BS_ETOOBIG, "BS_MAX_OP_DATA");
  row.data = bs__val_str("{}");
  row.object_id.data = NULL;
  row.object_id.size = 3;
  expect_save(w, &s, BS_EINVAL, "rows[0].object_id");
  row.object_id = bs__val_str("i");
  lk.key.data = big;
  lk.key.size = BS_MAX_LOOKUP_KEY + 1;
  expect_save(w, &s, BS_ETOOBIG, "BS_MAX_LOOKUP_KEY");
  expect_save(w, &s, BS_ETOOBIG, "lookups[0].key");
  lk.key = bs__val_str("k");
  lk.params = NULL;
  expect_save(w, &s, BS_EINVAL, "lookups[0].params");
  {
    /* the element named by both indices; the limit itself is allowed */
    bs_val ps3[3] = {{"", 0}, {big, BS_MAX_OP_DATA}, {NULL, 1}};
    lk.params = ps3;
    lk.n_params = 3;
    expect_save(w, &s, BS_EINVAL, "lookups[0].params[2]: NULL data with size 1");
    ps3[2] = (bs_val){big, BS_MAX_OP_DATA + 1};
    expect_save(w, &s, BS_ETOOBIG, "lookups[0].params[2] is");
    lk.n_params = 1;
  }
  lk.params = params;
  row.object_type.data = big;
  row.object_type.size = BS_MAX_OBJECT_NAME + 1;
  expect_save(w, &s, BS_ETOOBIG, "rows[0].object_type is");
  row.object_type = bs__val_str("t");
  row.data.data = NULL;
  row.data.size = 1;
  expect_save(w, &s, BS_EINVAL, "rows[0].data: NULL data with size 1");
  row.data = bs__val_str("{}");
  s.rows = NULL;
  expect_save(w, &s, BS_EINVAL, "change->rows");
  s.rows = &row;

  bs_val lsn_big = {big, BS_MAX_LSN + 1}, lsn = bs__val_str("0/1");
  EXPECT(bs_writer_commit(NULL, w, lsn_big, NULL, E), BS_ETOOBIG, "BS_MAX_LSN");
  EXPECT(bs_writer_keepalive(NULL, w, lsn_big, E), BS_ETOOBIG, "BS_MAX_LSN");
  EXPECT(bs_writer_snapshot_done(w, lsn_big, E), BS_ETOOBIG, "BS_MAX_LSN");
  EXPECT(bs_writer_resume_lsn(w, lsn_big, E), BS_ETOOBIG, "BS_MAX_LSN");
  co.create_empty = 2;
  EXPECT(bs_writer_commit(NULL, w, lsn, &co, E), BS_EINVAL, "opts->create_empty");
  co.create_empty = -1;
  bs_commit_result cr;
  assert_int_equal(bs_writer_commit(&cr, w, lsn, &co, NULL), BS_OK);
  assert_int_equal(seen_create_empty, 1); /* the writer's own setting (default 1): the front's */
  assert_true(cr.checkpoint == 7);
  assert_int_equal(bs_writer_keepalive(NULL, w, lsn, NULL), BS_OK);
  assert_int_equal(seen_create_empty, 1);
  uint64_t last = 0;
  assert_int_equal(bs_writer_flush(&last, w, NULL), BS_OK);
  assert_true(last == 7);
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
  EXPECT(bs_writer_truncate(w, (bs_val){NULL, 0}, E), BS_EINVAL, "table");
  EXPECT(bs_writer_drop(w, (bs_val){big, BS_MAX_TABLE_NAME + 1}, E), BS_ETOOBIG, "table");
  EXPECT(bs_writer_source_row(w, bs__val_str("t"), (bs_val){big, 300}, NULL, NULL, E), BS_ETOOBIG,
         "replica_id");
  EXPECT(bs_writer_source_row(w, bs__val_str("t"), bs__val_str("r"), NULL, NULL, E), BS_EINVAL,
         "fn");
  EXPECT(bs_writer_custom_write_checkpoint(w, (bs_val){NULL, 2}, 1, lsn, E), BS_EINVAL, "user_id");
  EXPECT(bs_writer_custom_write_checkpoint(w, lsn, TOO_HIGH, lsn, E), BS_EINVAL, "checkpoint");
  EXPECT(bs_writer_custom_write_checkpoint(w, lsn, 1, (bs_val){big, 256}, E), BS_ETOOBIG, "event");
  EXPECT(bs_writer_custom_write_checkpoint_requested(w, lsn, 1, lsn, -1, E), BS_EINVAL,
         "requested_at_ms");
  seen_requested_at = 5;
  assert_int_equal(bs_writer_custom_write_checkpoint_requested(w, lsn, 1, lsn, 0, NULL), BS_OK);
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK); /* queued: the flush hands it over */
  assert_true(seen_requested_at == 0);                     /* 0 is a time (the epoch), not "none" */
  assert_int_equal(bs_writer_custom_write_checkpoint(w, lsn, 1, lsn, NULL), BS_OK);
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
  assert_true(seen_requested_at < 0); /* persistent */
  EXPECT(bs_writer_save(NULL, &s, E), BS_EINVAL, "w");
  EXPECT(bs_writer_check_save(NULL, &s, E), BS_EINVAL, "w: NULL");
  bs_writer_close(w);
  bs_writer_close(NULL);
  /* a snapshot writer takes INSERT only: the check says so as the save does */
  wo = (bs_writer_options)BS_WRITER_OPTIONS_INIT;
  wo.snapshot = 1;
  assert_int_equal(bs_writer_open(&w, st, &wo, NULL), BS_OK);
  expect_save(w, &s, BS_OK, "");
  s.tag = BS_UPDATE;
  expect_save(w, &s, BS_ESTATE, "change->tag: a snapshot writer accepts INSERT only");
  s.tag = BS_INSERT;
  bs_writer_close(w);
  wo.snapshot = 0;
  wo.version = BS_WRITER_OPTIONS_VERSION;
  wo.create_empty = 0;
  assert_int_equal(bs_writer_open(&w, st, &wo, NULL), BS_OK);
  assert_int_equal(bs_writer_commit(NULL, w, lsn, NULL, NULL), BS_OK);
  assert_int_equal(seen_create_empty, 0); /* -1 (no options) resolved to this writer's 0 */
  co.create_empty = 1;
  assert_int_equal(bs_writer_commit(NULL, w, lsn, &co, NULL), BS_OK);
  assert_int_equal(seen_create_empty, 1); /* an explicit value overrides it */
  bs_writer_close(w);
  bs_storage_close(st);
  bs_storage_close(rost);
  bs_close(db);
  bs_close(ro);
}

static int on_chunk(const bs_chunk *c, void *p) {
  return 0;
}
static int on_params(const bs_val *v, void *p) {
  return 0;
}
static int on_changes(const bs_checkpoint_changes *c, void *p) {
  return 0;
}

static void test_read_checks(void **state) {
  bs_db *db = fake_db(0);
  bs_storage *st = fake_storage(db);
  static char big[600];
  bs_bucket_request req[4] = {{{"c", 1}, 1}, {{"a", 1}, 2}, {{"b", 1}, 3}, {{"a", 1}, 5}};
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_val buckets[2] = {{"a", 1}, {"bb", 2}};
  bs_checksum out[2];
  int more = 0;
  (void)state;
  EXPECT(bs_get_bucket_data(&more, st, TOO_HIGH, req, 4, NULL, on_chunk, NULL, E), BS_EINVAL,
         "checkpoint");
  EXPECT(bs_get_bucket_data(&more, st, 10, NULL, 4, NULL, on_chunk, NULL, E), BS_EINVAL, "req");
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, NULL, NULL, NULL, E), BS_EINVAL, "on_chunk");
  bo.limit = 0; /* an explicit limit is honoured: zero ops per call cannot be served */
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, &bo, on_chunk, NULL, E), BS_EINVAL,
         "opts->limit");
  bo.limit = BS_BATCH_LIMIT_DEFAULT;
  bo.version = 7;
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, &bo, on_chunk, NULL, E), BS_EINVAL,
         "opts->version");
  req[2].after = TOO_HIGH;
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, NULL, on_chunk, NULL, E), BS_EINVAL,
         "req[2].after");
  req[2].after = 3;
  req[1].bucket.data = big;
  req[1].bucket.size = BS_MAX_BUCKET_NAME + 1;
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, NULL, on_chunk, NULL, E), BS_ETOOBIG,
         "BS_MAX_BUCKET_NAME");
  req[1].bucket.size = 0;
  EXPECT(bs_get_bucket_data(&more, st, 10, req, 4, NULL, on_chunk, NULL, E), BS_EINVAL,
         "req.bucket[1]");
  req[1].bucket = bs__val_str("a");
  /* sorted by name, deduplicated (the last request of a name wins), defaults filled in */
  assert_int_equal(bs_get_bucket_data(&more, st, 10, req, 4, NULL, on_chunk, NULL, NULL), BS_OK);
  assert_int_equal(seen_n, 3);
  assert_memory_equal(seen_req[0].bucket.data, "a", 1);
  assert_true(seen_req[0].after == 5);
  assert_memory_equal(seen_req[1].bucket.data, "b", 1);
  assert_memory_equal(seen_req[2].bucket.data, "c", 1);
  assert_int_equal(more, 1);
  assert_int_equal(seen_batch.limit, 1000);
  assert_int_equal(seen_batch.chunk_bytes, 1024 * 1024);
  assert_int_equal(seen_batch.max_bytes, 16 * 1024 * 1024);

  EXPECT(bs_get_checksums(out, st, TOO_HIGH, buckets, 2, E), BS_EINVAL, "checkpoint");
  EXPECT(bs_get_checksums(NULL, st, 5, buckets, 2, E), BS_EINVAL, "out");
  EXPECT(bs_get_checksums(out, st, 5, NULL, 2, E), BS_EINVAL, "buckets");
  {
    char name[BS_MAX_BUCKET_NAME + 1];
    bs_val bad = {NULL, 2}, over = {name, sizeof name};
    int before = calls;
    memset(name, 'x', sizeof name);
    EXPECT(bs_list_buckets(NULL, bad, list_cb, NULL, E), BS_EINVAL, "st");
    EXPECT(bs_list_buckets(st, bad, list_cb, NULL, E), BS_EINVAL, "start_after");
    EXPECT(bs_list_buckets(st, over, list_cb, NULL, E), BS_ETOOBIG, "start_after");
    EXPECT(bs_list_buckets(st, over, NULL, NULL, E), BS_ETOOBIG, "start_after");
    over.size--;
    EXPECT(bs_list_buckets(st, over, NULL, NULL, E), BS_EINVAL, "fn");
    assert_int_equal(bs_list_buckets(st, over, list_cb, NULL, NULL), BS_OK);
    assert_int_equal(calls, before + 1);
  }
  buckets[1].data = big;
  buckets[1].size = BS_MAX_BUCKET_NAME + 1;
  EXPECT(bs_get_checksums(out, st, 5, buckets, 2, E), BS_ETOOBIG, "buckets[1]");
  buckets[1] = bs__val_str("bb");
  assert_int_equal(bs_get_checksums(out, st, 5, buckets, 2, NULL), BS_OK);
  assert_int_equal(out[1].checksum, 2);
  assert_true(out[1].count == 5);

  EXPECT(bs_get_checkpoint_changes(st, 5, 4, on_changes, NULL, E), BS_EINVAL, "from");
  EXPECT(bs_get_checkpoint_changes(st, 1, TOO_HIGH, on_changes, NULL, E), BS_EINVAL, "to");
  EXPECT(bs_get_checkpoint_changes(st, 1, 2, NULL, NULL, E), BS_EINVAL, "fn");
  bs_val lk[1] = {{big, BS_MAX_LOOKUP_KEY + 1}};
  EXPECT(bs_get_parameter_sets(st, 5, lk, 1, BS_PARAM_LIMIT_DEFAULT, on_params, NULL, E),
         BS_ETOOBIG, "BS_MAX_LOOKUP_KEY");
  EXPECT(bs_get_parameter_sets(st, TOO_HIGH, lk, 0, BS_PARAM_LIMIT_DEFAULT, on_params, NULL, E),
         BS_EINVAL, "checkpoint");
  EXPECT(bs_get_parameter_sets(st, 5, NULL, 1, BS_PARAM_LIMIT_DEFAULT, on_params, NULL, E),
         BS_EINVAL, "lookups");
  lk[0].size = 3;
  assert_int_equal(
      bs_get_parameter_sets(st, 5, lk, 1, BS_PARAM_LIMIT_DEFAULT, on_params, NULL, NULL), BS_OK);
  assert_int_equal(seen_limit, 1000);
  assert_int_equal(bs_get_parameter_sets(st, 5, lk, 1, 0, on_params, NULL, NULL), BS_OK);
  assert_int_equal(seen_limit, 0); /* 0 is a limit (no row allowed), not "the default" */
  {
    /* each key once, in the place of its first request: an absent and a present empty key are
     * one key, as are equal bytes at different addresses; a one-byte key is not the empty one */
    char b2[] = "b", e[] = "\xc3\xa9";
    bs_val ks[8] = {{"b", 1}, {NULL, 0}, {e, 2},          {"", 0},
                    {b2, 1},  {"a", 1},  {"\xc3\xa9", 2}, {"b", 1}};
    assert_int_equal(bs_get_parameter_sets(st, 5, ks, 8, 1, on_params, NULL, NULL), BS_OK);
    assert_int_equal(seen_nlk, 4);
    assert_true(bs__val_eq(seen_lk[0], ks[0]) && seen_lk[1].size == 0);
    assert_true(bs__val_eq(seen_lk[2], ks[2]) && bs__val_eq(seen_lk[3], ks[5]));
    assert_int_equal(bs_get_parameter_sets(st, 5, ks + 1, 1, 1, on_params, NULL, NULL), BS_OK);
    assert_int_equal(seen_nlk, 1);
    assert_true(seen_lk[0].size == 0);
  }
  EXPECT(bs_get_checkpoint(NULL, st, E), BS_EINVAL, "out");
  EXPECT(bs_get_checkpoint(NULL, NULL, E), BS_EINVAL, "st");
  EXPECT(bs_get_status(NULL, st, E), BS_EINVAL, "out");
  EXPECT(bs_report_error(st, NULL, E), BS_EINVAL, "message");
  bs_storage_close(st);
  bs_close(db);
}

static void test_wcp_and_compact_checks(void **state) {
  bs_db *db = fake_db(0), *ro = fake_db(BS_OPEN_RDONLY);
  bs_storage *st = fake_storage(db), *rost = fake_storage(ro);
  static char big[600];
  bs_head heads[1] = {{{"c", 1}, {big, 300}}};
  bs_managed_request mr[1] = {{{"u", 1}, heads, 1, 0, 0, 0}};
  uint64_t ids[1], id;
  int found, adv = 0;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  (void)state;
  EXPECT(bs_set_write_checkpoint_mode(st, (bs_write_checkpoint_mode)7, (bs_val){NULL, 0}, E),
         BS_EINVAL, "mode");
  EXPECT(bs_create_managed_write_checkpoints(ids, &adv, st, mr, 1, E), BS_ETOOBIG,
         "req[0].heads[0].lsn");
  heads[0].lsn = bs__val_str("0/1");
  mr[0].user_id.data = NULL; /* "" is a user id; NULL data with a size is not */
  EXPECT(bs_create_managed_write_checkpoints(ids, &adv, st, mr, 1, E), BS_EINVAL, "req[0].user_id");
  mr[0].user_id = bs__val_str("u");
  EXPECT(bs_create_managed_write_checkpoints(NULL, &adv, st, mr, 1, E), BS_EINVAL, "ids_out");
  mr[0].has_request_id = 1;
  mr[0].request_id = TOO_HIGH;
  EXPECT(bs_create_managed_write_checkpoints(ids, &adv, st, mr, 1, E), BS_EINVAL, "request_id");
  mr[0].has_request_id = 0;
  EXPECT(bs_create_managed_write_checkpoints(ids, &adv, rost, mr, 1, E), BS_ESTATE, "read-only");
  assert_int_equal(bs_create_managed_write_checkpoints(ids, &adv, st, mr, 1, NULL), BS_OK);
  assert_int_equal(adv, 1);
  EXPECT(bs_last_write_checkpoint(&id, &found, st, (bs_val){big, 481}, NULL, 0, E), BS_ETOOBIG,
         "BS_MAX_USER_ID");
  EXPECT(bs_last_write_checkpoint(NULL, &found, st, bs__val_str("u"), NULL, 0, E), BS_EINVAL,
         "id_out");
  EXPECT(bs_last_write_checkpoint(&id, NULL, st, bs__val_str("u"), NULL, 0, E), BS_EINVAL, "found");
  EXPECT(bs_delete_checkpoint_requests_before(NULL, rost, 5, E), BS_ESTATE, "read-only");

  co.max_op_id = TOO_HIGH;
  EXPECT(bs_compact(NULL, st, &co, E), BS_EINVAL, "opts->max_op_id");
  co.max_op_id = 0;
  co.n_buckets = 2;
  EXPECT(bs_compact(NULL, st, &co, E), BS_EINVAL, "opts->buckets");
  co.n_buckets = 0;
  co.version = 0;
  EXPECT(bs_compact(NULL, st, &co, E), BS_EINVAL, "opts->version");
  co.version = BS_COMPACT_OPTIONS_VERSION;
  EXPECT(bs_compact(NULL, rost, &co, E), BS_ESTATE, "read-only");
  assert_int_equal(bs_compact(NULL, st, NULL, NULL), BS_OK);
  assert_true(seen_compact.min_bucket_changes == BS_COMPACT_MIN_BUCKET_CHANGES);
  assert_true(seen_compact.min_change_ratio == BS_COMPACT_MIN_CHANGE_RATIO);
  assert_int_equal(seen_compact.memory_limit_mb, BS_COMPACT_MEMORY_LIMIT_MB);
  assert_true(seen_compact.min_age_ms == BS_COMPACT_MIN_AGE_MS);
  assert_int_equal(seen_compact.max_ops_per_txn, BS_COMPACT_MAX_OPS_PER_TXN);
  EXPECT(bs_compact_initial_replication(NULL, st, TOO_HIGH, 0, E), BS_EINVAL, "max_op_id");
  EXPECT(bs_compact_initial_replication(NULL, rost, 0, 0, E), BS_ESTATE, "read-only");
  EXPECT(bs_clear(rost, E), BS_ESTATE, "read-only");
  EXPECT(bs_terminate(rost, 1, E), BS_ESTATE, "read-only");
  EXPECT(bs_report_error(rost, "x", E), BS_ESTATE, "read-only");
  bs_storage_close(st);
  bs_storage_close(rost);
  bs_close(db);
  bs_close(ro);
}

static void free_only(void *o, void *p) {
  (void)o;
  free(p);
}
static int destroyed; /* d_count_close, s_count_close and w_count_close calls */
static void d_count_close(bs_db *db) {
  destroyed++;
  free(db);
}
static void s_count_close(bs_storage *st) {
  destroyed++;
  free(st);
}
static void w_count_close(bs_writer *w) {
  destroyed++;
  free(w);
}

/* bs_writer_open on st must refuse what writer_open returns (BS_EINVAL naming what) */
static void writer_refused(bs_storage *st, const char *what) {
  bs_writer *w = (bs_writer *)1;
  bs_error e2;
  assert_int_equal(bs_writer_open(&w, st, NULL, &e2), BS_EINVAL); /* the backend was called */
  assert_non_null(strstr(e2.msg, what));
  assert_null(w);
}

static void test_unsupported_slots(void **state) {
  static bs_storage_vtable nodestroy_vt;
  static bs_writer_vtable nodestroy_wt;
  static const bs_db_vtable nodestroy_db = {.version = BS_DB_VTABLE_VERSION};
  static const bs_db_vtable v0_db = {.version = 0, .destroy = d_count_close};
  static const bs_storage_vtable v0_vt = {.version = 0, .destroy = s_count_close};
  static const bs_writer_vtable v0_wt = {.version = 0, .destroy = w_count_close};
  static const bs_db_vtable v1_db = {.version = 1, .destroy = d_count_close};
  static bs_storage_vtable old_st;
  static bs_writer_vtable old_wt;
  static const bs_db_vtable counted_db = {.version = BS_DB_VTABLE_VERSION,
                                          .destroy = d_count_close};
  const bs_val none = {NULL, 0};
  bs_db *db = fake_db(0), *out;
  bs_storage *st, *st2 = (bs_storage *)1;
  bs_checkpoint cp;
  bs_writer *w;
  fdb *d;
  (void)state;
  open_vt = &empty_vt;
  st = fake_storage(db);
  open_vt = &full_vt;
  EXPECT(bs_get_checkpoint(&cp, st, E), BS_EUNSUPPORTED, "get_status"); /* its one source */
  EXPECT(bs_writer_open(&w, st, NULL, E), BS_EUNSUPPORTED, "writer_open");
  EXPECT(bs_clear(st, E), BS_EUNSUPPORTED, "clear");
  EXPECT(bs_compact(NULL, st, NULL, E), BS_EUNSUPPORTED, "compact");
  EXPECT(bs_list_buckets(st, none, list_cb, NULL, E), BS_EUNSUPPORTED, "list_buckets");
  bs_storage_close(st);
  /* destroy is mandatory in every table: a handle without one is refused where it appears (it
   * could never be released), and so is a table of version 0 */
  open_vt = &old_vt;
  EXPECT(bs_storage_open(&st, db, 0, E), BS_EINVAL, "destroy");
  assert_null(st);
  free(last_opened);
  nodestroy_vt = full_vt;
  nodestroy_vt.destroy = NULL;
  open_vt = &nodestroy_vt;
  EXPECT(bs_storage_open(&st, db, 0, E), BS_EINVAL, "destroy");
  free(last_opened);
  open_vt = &full_vt;
  st = fake_storage(db);
  nodestroy_wt = full_wt;
  nodestroy_wt.destroy = NULL;
  open_wt = &nodestroy_wt;
  writer_refused(st, "destroy");
  free(last_writer);
  /* a refused handle whose table has a destroy is released through it, also a version-0
   * table's (destroy is the first slot of every version): nothing else could release it */
  destroyed = 0;
  open_wt = &v0_wt;
  writer_refused(st, "version");
  assert_int_equal(destroyed, 1);
  open_wt = &full_wt;
  open_vt = &v0_vt;
  EXPECT(bs_storage_open(&st2, db, 0, E), BS_EINVAL, "version");
  assert_null(st2);
  assert_int_equal(destroyed, 2);
  open_vt = &full_vt;
  /* a table built against 0.3.0's header (db 1, storage 3, writer 1), whose slots took their
   * outputs after the handle, is refused and released the same way: called, its slots would
   * read their arguments in another order */
  old_wt = full_wt;
  old_wt.version = 1;
  old_wt.destroy = w_count_close;
  open_wt = &old_wt;
  writer_refused(st, "version 2 or later");
  assert_int_equal(destroyed, 3);
  open_wt = &full_wt;
  /* and so is a storage table of version 4 (0.4.0's header before get_checkpoint was dropped:
   * every slot after writer_open one place further on) */
  old_st = full_vt;
  old_st.version = 4;
  old_st.destroy = s_count_close;
  open_vt = &old_st;
  EXPECT(bs_storage_open(&st2, db, 0, E), BS_EINVAL, "version 5 or later");
  assert_null(st2);
  assert_int_equal(destroyed, 4);
  open_vt = &full_vt;
  /* BS_OK without a handle is the backend's bug, refused with a code (a host supplies it) */
  open_null = 1;
  writer_refused(st, "no handle");
  EXPECT(bs_storage_open(&st2, db, 0, E), BS_EINVAL, "no handle");
  assert_null(st2);
  open_null = 0;
  bs_storage_close(st);
  d = calloc(1, sizeof *d);
  d->base.vt = &nodestroy_db;
  EXPECT(bs_open_backend(&out, &d->base, NULL, E), BS_EINVAL, "destroy");
  free(d);
  EXPECT(bs_open_backend(&out, NULL, NULL, E), BS_EINVAL, "no handle");
  /* refused, its table has a destroy: the front destroys the db through it */
  destroyed = 0;
  d = calloc(1, sizeof *d);
  d->base.vt = &v0_db;
  EXPECT(bs_open_backend(&out, &d->base, NULL, E), BS_EINVAL, "version");
  assert_null(out);
  assert_int_equal(destroyed, 1);
  d = calloc(1, sizeof *d);
  d->base.vt = &v1_db;
  EXPECT(bs_open_backend(&out, &d->base, NULL, E), BS_EINVAL, "version 2 or later");
  assert_null(out);
  assert_int_equal(destroyed, 2);
  d = calloc(1, sizeof *d);
  d->base.vt = &counted_db;
  d->base.alloc.malloc_fn = NULL;
  d->base.alloc.free_fn = free_only;
  EXPECT(bs_open_backend(&out, &d->base, NULL, E), BS_EINVAL, "allocator");
  assert_null(out);
  assert_int_equal(destroyed, 3);
  bs_close(db);
}

/* ---- the writer's queue (writer.c): the front copies and queues, a backend gets one batch ---- */
static unsigned char q_rid[BS_MAX_REPLICA_ID]; /* the caller's buffer, overwritten after save */
static int q_checked;

static int val_is(bs_val v, const char *want, size_t n) {
  return v.data && v.size == n && (n == 0 || memcmp(v.data, want, n) == 0);
}

static void check_copies(const bs_write_batch *b) {
  static unsigned char want[BS_MAX_REPLICA_ID];
  const bs_save *c, *d;
  const bs_queued_wcp *cw;
  for (size_t i = 0; i < sizeof want; i++) want[i] = (unsigned char)(i % 2 ? 0xa9 : 0xc3);
  assert_int_equal(b->n, 3);
  c = b->items[0].save;
  assert_non_null(c);
  assert_null(b->items[0].wcp);
  assert_true(val_is(c->table, "t", 1));
  assert_true(val_is(c->after_id, (const char *)want, sizeof want)); /* the copy, not q_rid */
  assert_true(c->after_id.data != q_rid);
  assert_null(c->before_id.data); /* absent stays absent */
  assert_null(c->stored_data.data);
  assert_int_equal(c->n_rows, 2);
  assert_true(val_is(c->rows[0].object_type, "", 0)); /* present empty stays present */
  assert_true(val_is(c->rows[0].object_id, "x", 1));
  assert_true(val_is(c->rows[0].data, "1.0", 3));
  assert_true(val_is(c->rows[1].data, "1", 1));
  assert_int_equal(c->n_lookups, 1);
  assert_true(val_is(c->lookups[0].key, "", 0));
  assert_int_equal(c->lookups[0].n_params, 2);
  assert_true(val_is(c->lookups[0].params[0], "", 0));
  assert_null(c->lookups[0].params[1].data);
  d = b->items[1].save;
  assert_non_null(d);
  assert_int_equal(d->tag, BS_DELETE);
  assert_true(val_is(d->after_id, "r9", 2)); /* a DELETE's after_id is kept as given */
  assert_null(d->before_id.data);
  assert_int_equal(d->n_rows, 0);
  cw = b->items[2].wcp;
  assert_non_null(cw);
  assert_null(b->items[2].save);
  assert_true(val_is(cw->user_id, "", 0)); /* {NULL, 0} reads as "" */
  assert_true(val_is(cw->event, "e", 1));
  assert_true(cw->checkpoint == 3 && cw->requested_at_ms < 0);
  q_checked = 1;
}

static int s_trunc(bs_writer *w, bs_val t, int drop, bs_error *err) {
  calls++;
  trunc_saw = seen_items;
  return BS_OK;
}

static void test_writer_queue(void **state) {
  bs_db *db = fake_db(0);
  bs_storage *st = fake_storage(db);
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_row rows[2] = {{{"b", 1}, {"", 0}, {"x", 1}, {"1.0", 3}},
                    {{"b", 1}, {"t", 1}, {"y", 1}, {"1", 1}}};
  bs_val params[2] = {{"", 0}, {NULL, 0}};
  bs_lookup lk = {{"", 0}, params, 2};
  bs_save s = BS_SAVE_INIT, del = BS_SAVE_INIT;
  bs_writer *w;
  int before;
  (void)state;
  wo.max_records = 3;
  assert_int_equal(bs_writer_open(&w, st, &wo, NULL), BS_OK);
  for (size_t i = 0; i < sizeof q_rid; i++) q_rid[i] = (unsigned char)(i % 2 ? 0xa9 : 0xc3);
  s.table = bs__val_str("t");
  s.after_id = (bs_val){q_rid, sizeof q_rid}; /* BS_MAX_REPLICA_ID bytes, not ASCII */
  s.rows = rows;
  s.n_rows = 2;
  s.lookups = &lk;
  s.n_lookups = 1;
  del.table = bs__val_str("t");
  del.tag = BS_DELETE;
  del.after_id = bs__val_str("r9");
  before = calls;
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  memset(q_rid, 'z', sizeof q_rid); /* the queue holds a copy: the caller's buffer is free */
  assert_int_equal(bs_writer_save(w, &del, NULL), BS_OK);
  assert_int_equal(
      bs_writer_custom_write_checkpoint(w, (bs_val){NULL, 0}, 3, bs__val_str("e"), NULL), BS_OK);
  assert_int_equal(calls, before); /* queueing never reaches the backend */
  /* a failed flush leaves the queue as it was; the next one hands over the same items */
  flush_rc = BS_EIO;
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_EIO);
  flush_rc = BS_OK;
  on_batch = check_copies;
  q_checked = 0;
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
  on_batch = NULL;
  assert_true(q_checked);
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
  assert_int_equal(seen_items, 0); /* the successful flush emptied it */
  /* auto-flush (max_records 3): the fourth save first flushes the three queued */
  s.after_id = bs__val_str("r1");
  for (int i = 0; i < 3; i++) assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  before = calls;
  seen_items = 0;
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  assert_int_equal(calls, before + 1);
  assert_int_equal(seen_items, 3);
  /* a failed auto-flush does not queue the change */
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  flush_rc = BS_EIO;
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_EIO);
  flush_rc = BS_OK;
  /* truncate: what was queued before goes first */
  trunc_saw = 99;
  assert_int_equal(bs_writer_truncate(w, bs__val_str("t"), NULL), BS_OK);
  assert_int_equal(trunc_saw, 3);
  /* commit hands over the queue in its own call */
  assert_int_equal(bs_writer_save(w, &s, NULL), BS_OK);
  seen_items = 0;
  assert_int_equal(bs_writer_commit(NULL, w, bs__val_str("1"), NULL, NULL), BS_OK);
  assert_int_equal(seen_items, 1);
  assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
  assert_int_equal(seen_items, 0);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

/* BS_ASSERT is on in test builds: a backend slot called past the front with what the front never
 * passes (writer options NULL) stops the process with SIGABRT instead of running on. (A DEBUG=0
 * build compiles the assert out: nothing to check there.) */
static void test_contract_asserts(void **state) {
#ifdef BS_DEBUG
  bs_db *db;
  bs_storage *st;
  uint32_t id;
  pid_t pid;
  int status = 0;
  (void)state;
  assert_int_equal(bs_open_memory(&db, NULL, NULL), BS_OK);
  assert_int_equal(bs_stream_create(&id, db, "s", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st, db, id, NULL), BS_OK);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    bs_writer *w = NULL;
    if (!freopen("/dev/null", "w", stderr)) _exit(2); /* the report is expected */
    st->vt->writer_open(&w, st, NULL, NULL);
    _exit(0); /* reached only if the assert did not fire */
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  bs_storage_close(st);
  bs_close(db);
#else
  (void)state;
  ft_skip_note("test_front: the contract asserts (a DEBUG=0 build compiles them out)");
  skip();
#endif
}

/* ---- waiting and notification ---- */
static uint64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct bump_arg {
  bs_writer *w;
  int notify;
  int reads; /* cp_reads before the wait started */
} bump_arg;

/* Bumps the checkpoint once the waiter has read it in its wait (so the bump always lands
 * while it waits, however the threads are scheduled): through a commit that notifies, or
 * (notify 0) as another process's commit would, seen only by the wait's polling. */
static void *bump_later(void *p) {
  bump_arg *a = p;
  struct timespec ts = {0, 1000000L};
  while (__atomic_load_n(&cp_reads, __ATOMIC_SEQ_CST) <= a->reads) nanosleep(&ts, NULL);
  __atomic_store_n(&fake_cp, fake_cp + 1, __ATOMIC_SEQ_CST);
  /* a commit through the front that made a checkpoint notifies (the backend does not) */
  if (a->notify) assert_int_equal(bs_writer_commit(NULL, a->w, bs__val_str("1"), NULL, NULL), 0);
  return NULL;
}

static int heard;
static uint64_t heard_cp;
static void listener(uint32_t stream, uint64_t cp, void *payload) {
  heard += *(int *)payload;
  heard_cp = cp;
}

/* Every wait below that must end by a change has no timeout to speak of (INT_MAX ms): the
 * interleaving is arranged (bump_later), and alarm() only catches a wait that never ends. */
static void test_wait_and_listener(void **state) {
  bs_db *db = fake_db(0);
  bs_storage *st = fake_storage(db);
  bs_checkpoint known, out;
  pthread_t th;
  bump_arg a = {NULL, 1, 0};
  uint64_t t0;
  int one = 1, before;
  (void)state;
  alarm(300);
  fake_cp = 5;
  assert_int_equal(bs_writer_open(&a.w, st, NULL, NULL), BS_OK);
  EXPECT(bs_wait_checkpoint(&out, st, NULL, -1, E), BS_EINVAL, "timeout_ms");
  EXPECT(bs_wait_checkpoint(NULL, st, NULL, 10, E), BS_EINVAL, "out");
  assert_int_equal(bs_get_checkpoint(&known, st, NULL), BS_OK);
  /* nothing changes: returns after the timeout (not before) with the current checkpoint */
  t0 = ms_now();
  assert_int_equal(bs_wait_checkpoint(&out, st, &known, 150, NULL), BS_OK);
  assert_true(ms_now() - t0 >= 150);
  assert_true(out.op_id == 5);
  /* different from `known` already: returns after one read, without waiting */
  known.op_id = 4;
  before = cp_reads;
  assert_int_equal(bs_wait_checkpoint(&out, st, &known, INT_MAX, NULL), BS_OK);
  assert_int_equal(cp_reads, before + 1);
  assert_true(out.op_id == 5);
  known.op_id = 5;
  /* in-process commit: woken by the notification */
  assert_int_equal(bs_set_checkpoint_listener(db, listener, &one), BS_OK);
  a.reads = cp_reads;
  pthread_create(&th, NULL, bump_later, &a);
  assert_int_equal(bs_wait_checkpoint(&out, st, &known, INT_MAX, NULL), BS_OK);
  pthread_join(th, NULL);
  assert_true(out.op_id == 6);
  assert_int_equal(heard, 1);
  assert_true(heard_cp == 6);
  /* another process's commit (no notification): seen by polling */
  known = out;
  a.notify = 0;
  a.reads = cp_reads;
  pthread_create(&th, NULL, bump_later, &a);
  assert_int_equal(bs_wait_checkpoint(&out, st, &known, INT_MAX, NULL), BS_OK);
  pthread_join(th, NULL);
  assert_true(out.op_id == 7);
  /* unregistered listener is not called */
  assert_int_equal(bs_set_checkpoint_listener(db, NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_commit(NULL, a.w, bs__val_str("2"), NULL, NULL), BS_OK);
  assert_int_equal(heard, 1);
  assert_int_equal(bs_set_checkpoint_listener(NULL, listener, NULL), BS_EINVAL);
  alarm(0);
  bs_writer_close(a.w);
  bs_storage_close(st);
  bs_close(db);
}

/* bs__now_ms is the wall clock (a stored time must mean the same in another process): it lies
 * within the seconds time() reports around it, which a monotonic clock's value does not. */
static int64_t realtime_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* bs__now_ms is CLOCK_REALTIME in milliseconds: between two readings of that clock. (Not
 * time(): glibc serves it from the coarse clock, which lags by up to a tick, so a reading
 * just after a second boundary fell outside time()'s second.) */
static void test_clock(void **state) {
  int64_t t0 = realtime_ms();
  int64_t ms = bs__now_ms();
  int64_t t1 = realtime_ms();
  (void)state;
  assert_true(t0 <= ms && ms <= t1);
  assert_true(ms > (int64_t)1767225600 * 1000); /* after 2026-01-01: milliseconds, epoch-based */
}

/* ---- Older callers: a struct of an older version's size, last in a mapped page ----------------
 * The page after it is PROT_NONE, so a library that read more of a caller's struct (or of a
 * backend's table) than its version has dies here with SIGSEGV. Every version of every options
 * struct (BS_SIZES: one size per version) and backend table (BS_TABLE_SIZE, from its slot list)
 * is placed so: the versions a struct has today, and, the day a field is appended, the older
 * size with it. */
#define GUARDED 3 /* structs placed at once (a db table, a storage table, an options struct) */
static unsigned char *guard_page[GUARDED];

/* size bytes of src with version v, in region i (each a page of its own), ending where its guard
 * page starts. */
static void *at_page_end(int i, const void *src, size_t size, unsigned v) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *p;
  if (!guard_page[i]) {
    guard_page[i] =
        mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(guard_page[i] != MAP_FAILED);
    assert_int_equal(mprotect(guard_page[i] + page, page, PROT_NONE), 0);
  }
  p = guard_page[i] + page - size;
  memcpy(p, src, size);
  memcpy(p, &v, sizeof v); /* every versioned struct starts with its version */
  return p;
}
#define OLDER_AT(i, T, v, src) ((T *)at_page_end(i, src, BS_SIZES(T)[(v)-1], v))
#define OLDER(T, v, src)       ((const T *)OLDER_AT(0, T, v, src))
#define TABLE_AT(i, T, v, src) ((T *)at_page_end(i, src, BS_TABLE_SIZE(T, v), v))

static int chunk_none(const bs_chunk *c, void *payload) {
  (void)c;
  (void)payload;
  return 0;
}

static int no_records(bs_record *r, void *payload) {
  (void)r;
  (void)payload;
  return 0;
}

static void test_older_callers(void **state) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  bs_save sv = BS_SAVE_INIT;
  bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_compact_options cpo = BS_COMPACT_OPTIONS_INIT;
  bs_backup_options bko = BS_BACKUP_OPTIONS_INIT;
  bs_bucket_request req = {{"b", 1}, 0};
  bs_row row = {{"b", 1}, {"t", 1}, {"r", 1}, {"{}", 2}};
  char dir[] = "/tmp/bs-older-XXXXXX", path[64];
  bs_error err;
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  unsigned v;
  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/load.bsdb", dir);
  sv.table = (bs_val){"t", 1};
  sv.after_id = (bs_val){"r", 1};
  sv.rows = &row;
  sv.n_rows = 1;
  for (v = 1; v <= BS_OPEN_OPTIONS_VERSION; v++) {
    assert_int_equal(bs_open_memory(&db, OLDER(bs_open_options, v, &oo), &err), BS_OK);
    for (unsigned s2 = 1; s2 <= BS_STREAM_OPTIONS_VERSION; s2++)
      assert_int_equal(bs_stream_create(NULL, db, "s", OLDER(bs_stream_options, s2, &so), &err),
                       BS_OK);
    assert_int_equal(bs_storage_open(&st, db, 0, &err), BS_OK);
    for (unsigned x = 1; x <= BS_WRITER_OPTIONS_VERSION; x++) {
      assert_int_equal(bs_writer_open(&w, st, OLDER(bs_writer_options, x, &wo), &err), BS_OK);
      for (unsigned y = 1; y <= BS_SAVE_VERSION; y++)
        assert_int_equal(bs_writer_save(w, OLDER(bs_save, y, &sv), &err), BS_OK);
      assert_int_equal(bs_writer_snapshot_done(w, (bs_val){"0", 1}, &err), BS_OK);
      for (unsigned y = 1; y <= BS_COMMIT_OPTIONS_VERSION; y++)
        assert_int_equal(
            bs_writer_commit(NULL, w, (bs_val){"1", 1}, OLDER(bs_commit_options, y, &co), &err),
            BS_OK);
      bs_writer_close(w);
    }
    for (unsigned y = 1; y <= BS_BATCH_OPTIONS_VERSION; y++)
      assert_int_equal(bs_get_bucket_data(NULL, st, 0, &req, 1, OLDER(bs_batch_options, y, &bo),
                                          chunk_none, NULL, &err),
                       BS_OK);
    for (unsigned y = 1; y <= BS_COMPACT_OPTIONS_VERSION; y++)
      assert_int_equal(bs_compact(NULL, st, OLDER(bs_compact_options, y, &cpo), &err), BS_OK);
    for (unsigned y = 1; y <= BS_BACKUP_OPTIONS_VERSION; y++) {
      /* read before the memory backend says it has no backup; load reads them too */
      assert_int_equal(bs_backup(db, path, OLDER(bs_backup_options, y, &bko), &err),
                       BS_EUNSUPPORTED);
      assert_int_equal(bs_load(path, OLDER(bs_backup_options, y, &bko), no_records, NULL, &err),
                       BS_ECORRUPT);
    }
    bs_storage_close(st);
    bs_close(db);
  }
  rmdir(dir);
}

/* Backend tables: every version of each that the front accepts (from BS_FIRST_*: the older ones
 * are refused, test_unsupported_slots), last in the page, so a slot past a version's end would
 * be read off it. */
/* Each slot of the lists (storage_backend.h) within the size of the version that added it, and
 * that version no newer than its table's: the lists only grow at the end. */
#define IN_ITS_VERSION(T, current, name, since)                                                    \
  assert_true((since) <= (current) &&                                                              \
              offsetof(T, name) + sizeof(void (*)(void)) <= BS_TABLE_SIZE(T, since));
#define DB_SLOT_IN(name, since, params, args)                                                      \
  IN_ITS_VERSION(bs_db_vtable, BS_DB_VTABLE_VERSION, name, since)
#define STORAGE_SLOT_IN(name, since, params, args)                                                 \
  IN_ITS_VERSION(bs_storage_vtable, BS_STORAGE_VTABLE_VERSION, name, since)
#define WRITER_SLOT_IN(name, since, params, args)                                                  \
  IN_ITS_VERSION(bs_writer_vtable, BS_WRITER_VTABLE_VERSION, name, since)

static void test_older_backends(void **state) {
  bs_storage_vtable t = full_vt;
  bs_checkpoint cp;
  bs_writer *w;
  bs_db *db;
  bs_storage *st;
  (void)state;
  BS_DB_SLOTS(DB_SLOT_IN)
  BS_STORAGE_SLOTS(STORAGE_SLOT_IN)
  BS_WRITER_SLOTS(WRITER_SLOT_IN)
  assert_int_equal(BS_TABLE_SIZE(bs_storage_vtable, BS_STORAGE_VTABLE_VERSION),
                   sizeof(bs_storage_vtable));
  assert_int_equal(BS_TABLE_SIZE(bs_storage_vtable, 1),
                   offsetof(bs_storage_vtable, wait_checkpoint));
  t.wait_checkpoint = NULL; /* the front polls get_status instead */
  for (unsigned v = BS_FIRST_bs_db_vtable; v <= BS_DB_VTABLE_VERSION; v++) {
    fdb *d = calloc(1, sizeof *d);
    d->base.vt = TABLE_AT(1, bs_db_vtable, v, &fake_ops);
    assert_int_equal(bs_open_backend(&db, &d->base, NULL, NULL), BS_OK);
    for (unsigned s2 = BS_FIRST_bs_storage_vtable; s2 <= BS_STORAGE_VTABLE_VERSION; s2++) {
      open_vt = TABLE_AT(2, bs_storage_vtable, s2, &t);
      assert_int_equal(bs_storage_open(&st, db, 0, NULL), BS_OK);
      open_vt = &full_vt;
      memset(&cp, 0, sizeof cp);
      assert_int_equal(bs_wait_checkpoint(&cp, st, NULL, 0, NULL), BS_OK);
      assert_int_equal(bs_list_buckets(st, (bs_val){NULL, 0}, list_cb, NULL, NULL), BS_OK);
      for (unsigned x = BS_FIRST_bs_writer_vtable; x <= BS_WRITER_VTABLE_VERSION; x++) {
        open_wt = TABLE_AT(0, bs_writer_vtable, x, &full_wt);
        assert_int_equal(bs_writer_open(&w, st, NULL, NULL), BS_OK);
        open_wt = &full_wt;
        assert_int_equal(bs_writer_flush(NULL, w, NULL), BS_OK);
        assert_int_equal(bs_writer_commit(NULL, w, (bs_val){"1", 1}, NULL, NULL), BS_OK);
        bs_writer_close(w);
      }
      bs_storage_close(st);
    }
    bs_close(db);
  }
}

/* Which names bs_open hands to PostgreSQL: URLs and libpq key=value strings, nothing else; such
 * a name never becomes a file, and ./name reaches a file of that name. */
static void test_names_postgres(void **state) {
  static const struct {
    const char *name;
    int pg;
  } t[] = {
      {"postgresql://h/db", 1},
      {"postgres://h", 1},
      {"postgresql://", 1},
      {"host=h dbname=d", 1},
      {"host =h", 1},
      {"a_b=1", 1},
      {"dbname=", 1},
      {"x=1", 1},
      {"postgresql:/h", 0},
      {"Postgres://h", 0},
      {"Host=h", 0},
      {"=x", 0},
      {"./host=h", 0},
      {"/tmp/a=b", 0},
      {"host", 0},
      {"h\xc3\xa9=1", 0},
      {"x", 0},
      {"", 0},
  };
  const char *conn = "host=127.0.0.1 port=1 connect_timeout=1 dbname=bsnone";
  bs_error err;
  bs_db *db;
  (void)state;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (bs_names_postgres(t[i].name) != t[i].pg) fail_msg("%s: not %d", t[i].name, t[i].pg);
  assert_int_equal(bs_names_postgres(NULL), 0);
  /* a closed port (or a build without PostgreSQL): refused, and no file named after it */
  assert_int_not_equal(bs_open(&db, conn, NULL, &err), BS_OK);
  assert_null(db);
  assert_int_not_equal(access(conn, F_OK), 0);
}

/* A password never reaches a message: bs_redact_conninfo's forms, and bs_open_postgres failing on
 * a closed port (libpq's own message) and on URLs libpq refuses by quoting them. */
#define SECRET "Zq7secretPW"
static void test_redact_conninfo(void **state) {
  static const struct {
    const char *in, *out;
  } t[] = {
      {"postgresql://u:" SECRET "@127.0.0.1:1/db", "postgresql://u:***@127.0.0.1:1/db"},
      {"postgres://u:" SECRET "@h/db?password=" SECRET "&sslmode=disable",
       "postgres://u:***@h/db?password=***&sslmode=disable"},
      {"postgresql://u@h:5/db?application_name=x&password=" SECRET,
       "postgresql://u@h:5/db?application_name=x&password=***"},
      {"postgresql://u:p@" SECRET "@h/db", "postgresql://u:***@h/db"}, /* a raw '@' */
      {"postgresql://u@h/db", "postgresql://u@h/db"},
      {"postgresql://h:5432", "postgresql://h:5432"},
      {"host=h port=1 password=" SECRET " user=u", "host=h port=1 password=*** user=u"},
      {"host=h password = '" SECRET " \\' x' dbname=d", "host=h password = *** dbname=d"},
      {"password=a\\ " SECRET, "password=***"},
      {"passwords=x password", "passwords=x password"},
      {"host=h junk password=" SECRET, "host=h junk password=***"},  /* after what libpq refuses */
      {"postgresql://u:a?password=" SECRET "@h/db?password=" SECRET, /* a '?' in the userinfo */
       "postgresql://u:***@h/db?password=***"},
      {"postgresql://h/?password=1&password=2&password=3&password=4&password=5&password=6&"
       "password=7&password=8&password=9&password=10&password=11&password=12&password=13&"
       "password=14&password=15&password=16&password=" SECRET,
       "postgresql://h/?password=***&password=***&password=***&password=***&password=***&"
       "password=***&password=***&password=***&password=***&password=***&password=***&"
       "password=***&password=***&password=***&password=***&password=***"},
      {"/var/lib/x.bsdb", "/var/lib/x.bsdb"},
      {"", ""},
  };
  static const char *const refused[] = {
      "postgresql://u:" SECRET "@127.0.0.1:1/db",    /* connection refused */
      "postgresql://u:" SECRET "%zz@127.0.0.1:1/db", /* "invalid percent-encoded token" */
      "postgresql://u:" SECRET "@[::1:1/db",         /* quotes the whole URL */
      "postgresql://u:x@" SECRET "@127.0.0.1:1/db",  /* the host it quotes is the password's tail */
      "postgresql://u@127.0.0.1:1/db?password=" SECRET "&bogus=1",
      "host=127.0.0.1 port=1 user=u password=" SECRET,
  };
  char out[512];
  bs_error err;
  bs_db *db;
  (void)state;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    assert_int_equal(bs_redact_conninfo(out, sizeof out, t[i].in), strlen(t[i].out));
    assert_string_equal(out, t[i].out);
  }
  /* cut to fit, NUL-terminated, the full length returned; a NULL string is "" */
  assert_int_equal(bs_redact_conninfo(out, 20, t[0].in), strlen(t[0].out));
  assert_int_equal(strlen(out), 19);
  assert_int_equal(bs_redact_conninfo(NULL, 0, t[0].in), strlen(t[0].out));
  assert_int_equal(bs_redact_conninfo(out, sizeof out, NULL), 0);
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    memset(&err, 0, sizeof err);
    assert_int_not_equal(bs_open_postgres(&db, refused[i], NULL, &err), BS_OK);
    if (strstr(err.msg, SECRET) || strstr(err.msg, "secretPW"))
      fail_msg("%s: the message has the password: %s", refused[i], err.msg);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_postgres),    cmocka_unit_test(test_redact_conninfo),
      cmocka_unit_test(test_older_callers),     cmocka_unit_test(test_older_backends),
      cmocka_unit_test(test_contract_asserts),  cmocka_unit_test(test_open_checks),
      cmocka_unit_test(test_writer_queue),      cmocka_unit_test(test_strerror),
      cmocka_unit_test(test_stream_checks),     cmocka_unit_test(test_writer_checks),
      cmocka_unit_test(test_read_checks),       cmocka_unit_test(test_wcp_and_compact_checks),
      cmocka_unit_test(test_unsupported_slots), cmocka_unit_test(test_wait_and_listener),
      cmocka_unit_test(test_version),           cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
