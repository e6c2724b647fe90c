/*
 * test_hostile.c: bad input (contract.md section 10) and isolation (property 10), on the LMDB
 * backend.
 *  - A table of hostile calls (over-long names and keys, embedded NUL bytes, invalid UTF-8, huge
 *    data, bad versions and tags, NULL handles and pointers, out-of-order LSNs,
 *    op ids at 2^63): each returns its documented status and leaves the file unchanged (the
 *    fingerprint of the committed state, bs_db_stat, the stream status) and the writer's queue
 *    empty (a flush after it persists nothing).
 *  - The driver: hostile lines (negative, non-decimal, overflowing op ids, invalid UTF-8, not
 *    JSON) piped into `./bucketstore drive --memory` each get their own error reply.
 *  - Isolation: crafted bucket names, lookup keys, table names and replica ids that contain the
 *    key encoding's own length bytes and separators, and prefixes of each other, never reach
 *    another's rows; nor does a second stream with the same names.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util_fault.h"

typedef struct hx {
  char dir[256], path[320];
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  bs_error err;
  unsigned char big_dummy;
} hx;

static bs_val v(const char *s) {
  bs_val x = {s, s ? strlen(s) : 0};
  return x;
}
static bs_val vn(const void *p, size_t n) {
  bs_val x = {p, n};
  return x;
}

static const char *hx_buckets[] = {"b1", "b2"};

static int save_row(bs_writer *w, bs_val table, bs_tag tag, bs_val rid, bs_val bucket, bs_val oid,
                    bs_val data, const bs_lookup *lk, bs_error *err) {
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  s.table = table;
  s.tag = tag;
  if (tag == BS_DELETE)
    s.before_id = rid;
  else
    s.after_id = rid;
  row.bucket = bucket;
  row.object_type = v("t");
  row.object_id = oid;
  row.data = data;
  if (tag != BS_DELETE && bucket.data) {
    s.rows = &row;
    s.n_rows = 1;
  }
  if (lk) {
    s.lookups = lk;
    s.n_lookups = 1;
  }
  return bs_writer_save(w, &s, err);
}

static int setup(void **state) {
  hx *h = calloc(1, sizeof *h);
  assert_non_null(h);
  assert_int_equal(ft_tmpdir(h->dir, sizeof h->dir, "hostile"), 0);
  snprintf(h->path, sizeof h->path, "%s/db", h->dir);
  {
    bs_open_options oo = BS_OPEN_OPTIONS_INIT;
    oo.flags = BS_OPEN_NOSYNC;
    assert_int_equal(bs_open(&h->db, h->path, &oo, NULL), BS_OK);
  }
  assert_int_equal(bs_stream_create(NULL, h->db, "s1", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&h->st, h->db, 0, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&h->w, h->st, NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_snapshot_done(h->w, v("0001"), NULL), BS_OK);
  assert_int_equal(
      save_row(h->w, v("t"), BS_INSERT, v("r1"), v("b1"), v("r1"), v("{}"), NULL, NULL), BS_OK);
  assert_int_equal(
      save_row(h->w, v("t"), BS_INSERT, v("r2"), v("b2"), v("r2"), v("{}"), NULL, NULL), BS_OK);
  assert_int_equal(bs_writer_commit(NULL, h->w, v("0005"), NULL, NULL), BS_OK);
  *state = h;
  return 0;
}

static int teardown(void **state) {
  hx *h = *state;
  bs_writer_close(h->w);
  bs_storage_close(h->st);
  bs_close(h->db);
  ft_rm_db(h->dir, h->path);
  free(h);
  return 0;
}

/* Everything a hostile call must not change. */
typedef struct hx_snap {
  char *fp;
  bs_stat stat;
  bs_status status;
} hx_snap;

static void snap(hx *h, hx_snap *s) {
  bs_checkpoint cp;
  bs_val names[2] = {v(hx_buckets[0]), v(hx_buckets[1])};
  assert_int_equal(bs_get_checkpoint(&cp, h->st, NULL), BS_OK);
  assert_int_equal(ft_fingerprint(h->st, cp.op_id, names, 2, NULL, 0, &s->fp, NULL), BS_OK);
  assert_int_equal(bs_db_stat(&s->stat, h->db, NULL), BS_OK);
  assert_int_equal(bs_get_status(&s->status, h->st, NULL), BS_OK);
}

/* ---- The table of hostile calls ------------------------------------------------------------- */

#define BIG (BS_MAX_OP_DATA + 1u)
static char *big; /* BIG bytes of 'x' */
static char long_name[1024];

typedef int (*hostile_fn)(hx *h);

static int h_bucket_481(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), vn(long_name, 481), v("r9"), v("{}"), NULL,
                  &h->err);
}
static int h_bucket_empty(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), vn("", 0), v("r9"), v("{}"), NULL, &h->err);
}
static int h_lookup_481(hx *h) {
  bs_lookup lk = {vn(long_name, 481), NULL, 0};
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), v("b1"), v("r9"), v("{}"), &lk, &h->err);
}
static int h_replica_257(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, vn(long_name, 257), v("b1"), v("r9"), v("{}"), NULL,
                  &h->err);
}
static int h_table_257(hx *h) {
  return save_row(h->w, vn(long_name, 257), BS_INSERT, v("r9"), v("b1"), v("r9"), v("{}"), NULL,
                  &h->err);
}
static int h_table_empty(hx *h) {
  return save_row(h->w, vn("", 0), BS_INSERT, v("r9"), v("b1"), v("r9"), v("{}"), NULL, &h->err);
}
static int h_data_huge(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), v("b1"), v("r9"), vn(big, BIG), NULL, &h->err);
}
static int h_param_huge(hx *h) {
  bs_val p = vn(big, BIG);
  bs_lookup lk = {v("k"), &p, 1};
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), v("b1"), v("r9"), v("{}"), &lk, &h->err);
}
static int h_stored_huge(hx *h) {
  bs_save s = BS_SAVE_INIT;
  s.table = v("t");
  s.after_id = v("r9");
  s.stored_data = vn(big, BIG);
  return bs_writer_save(h->w, &s, &h->err);
}
static int h_object_id_huge(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), v("b1"), vn(big, 65536), v("{}"), NULL,
                  &h->err);
}
static int h_data_null(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, v("r9"), v("b1"), v("r9"), vn(NULL, 5), NULL, &h->err);
}
static int h_bad_tag(hx *h) {
  return save_row(h->w, v("t"), (bs_tag)7, v("r9"), v("b1"), v("r9"), v("{}"), NULL, &h->err);
}
static int h_bad_version(hx *h) {
  bs_save s = BS_SAVE_INIT;
  s.version = 99;
  s.table = v("t");
  s.after_id = v("r9");
  return bs_writer_save(h->w, &s, &h->err);
}
static int h_insert_no_id(hx *h) {
  bs_save s = BS_SAVE_INIT;
  s.table = v("t");
  return bs_writer_save(h->w, &s, &h->err);
}
static int h_rows_null(hx *h) {
  bs_save s = BS_SAVE_INIT;
  s.table = v("t");
  s.after_id = v("r9");
  s.n_rows = 3;
  return bs_writer_save(h->w, &s, &h->err);
}
static int h_lsn_256(hx *h) {
  return bs_writer_commit(NULL, h->w, vn(long_name, 256), NULL, &h->err);
}
static int h_lsn_older(hx *h) {
  bs_commit_result r;
  int rc = bs_writer_commit(&r, h->w, v("0002"), NULL, &h->err);
  /* documented: BS_OK, blocked, no checkpoint (contract.md 4.4: lsn >= last checkpoint lsn) */
  if (rc == BS_OK && (!r.checkpoint_blocked || r.checkpoint_created)) return -1000;
  return rc;
}
static int h_snapshot_older(hx *h) {
  return bs_writer_snapshot_done(h->w, v("0000"), &h->err);
}
static int h_null_writer(hx *h) {
  return save_row(NULL, v("t"), BS_INSERT, v("r9"), v("b1"), v("r9"), v("{}"), NULL, &h->err);
}
static int h_null_commit(hx *h) {
  return bs_writer_commit(NULL, NULL, v("0009"), NULL, &h->err);
}
static int h_null_storage(hx *h) {
  bs_checksum c;
  bs_val b = v("b1");
  return bs_get_checksums(&c, NULL, 1, &b, 1, &h->err);
}
static int h_null_out(hx *h) {
  return bs_get_checkpoint(NULL, h->st, &h->err);
}
static int h_null_db(hx *h) {
  return bs_stream_create(NULL, NULL, "x", NULL, &h->err);
}
static int h_null_verify(hx *h) {
  return bs_db_verify(NULL, NULL, NULL, NULL, &h->err);
}
static int h_null_compact(hx *h) {
  return bs_compact(NULL, NULL, NULL, &h->err);
}
static int h_checkpoint_2_63(hx *h) {
  bs_checksum c;
  bs_val b = v("b1");
  return bs_get_checksums(&c, h->st, 0x8000000000000000ull, &b, 1, &h->err);
}
static int h_compact_nan(hx *h) {
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  co.min_change_ratio = NAN;
  return bs_compact(NULL, h->st, &co, &h->err);
}
static int h_compact_buckets_null(hx *h) {
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  co.n_buckets = 2;
  return bs_compact(NULL, h->st, &co, &h->err);
}
static int h_compact_horizon_2_63(hx *h) {
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  co.max_op_id = 0x8000000000000000ull;
  return bs_compact(NULL, h->st, &co, &h->err);
}
static int h_stream_name_256(hx *h) {
  char name[257];
  memset(name, 'n', 256);
  name[256] = 0;
  return bs_stream_create(NULL, h->db, name, NULL, &h->err);
}
static int h_user_481(hx *h) {
  bs_managed_request r;
  uint64_t id;
  memset(&r, 0, sizeof r);
  r.user_id = vn(long_name, 481);
  return bs_create_managed_write_checkpoints(&id, NULL, h->st, &r, 1, &h->err);
}
static int h_lookup_decode_garbage(hx *h) {
  bs_scalar vals[4];
  size_t n;
  return bs_lookup_decode(vals, 4, &n, vn("\x05\xff\xff", 3), &h->err);
}
static int h_open_opts_version(hx *h) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  oo.version = 99;
  return bs_open(&db, h->path, &oo, &h->err);
}
static int h_open_foreign(hx *h) {
  char p[400];
  FILE *f;
  bs_db *db = NULL;
  int rc;
  snprintf(p, sizeof p, "%s/foreign", h->dir);
  f = fopen(p, "wb");
  for (int i = 0; i < 3000; i++) fputs("not an lmdb file ", f);
  fclose(f);
  rc = bs_open(&db, p, NULL, &h->err);
  if (db) bs_close(db);
  return rc;
}
static int h_params_limit(hx *h) {
  /* 3 rows for one lookup, limit 2: BS_ELIMIT (rows written and committed in a prior call of
   * this table would change the file, so this reads the setup's state with a tiny limit) */
  unsigned char k[16];
  size_t kn = 0;
  bs_scalar s;
  bs_val key;
  memset(&s, 0, sizeof s);
  s.type = BS_SCALAR_NULL;
  bs_lookup_encode(k, sizeof k, &kn, &s, 1, NULL);
  key = vn(k, kn);
  return bs_get_parameter_sets(h->st, 0x7fffffffffffffffull, &key, 1, BS_PARAM_LIMIT_DEFAULT, NULL,
                               NULL, &h->err);
}
static int h_rdonly_write(hx *h) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  int rc;
  oo.flags = BS_OPEN_RDONLY;
  if ((rc = bs_open(&db, h->path, &oo, &h->err))) return -2000 + rc;
  if ((rc = bs_storage_open(&st, db, 0, &h->err)) == BS_OK) {
    rc = bs_writer_open(&w, st, NULL, &h->err);
    bs_writer_close(w);
    bs_storage_close(st);
  }
  bs_close(db);
  return rc;
}
/* accepted (opaque bytes), but must not change the file until flushed: queued only */
static int h_invalid_utf8_queued(hx *h) {
  return save_row(h->w, v("t"), BS_INSERT, vn("r\xff\xfe", 3), vn("b\xc3\x28", 3),
                  vn("\xed\xa0\x80", 3), vn("{\"\xff\":1}", 7), NULL, &h->err);
}

typedef struct hostile {
  const char *name;
  hostile_fn fn;
  int want;
  int queued; /* 1: accepted into the queue (the test then discards it by reopening the writer) */
} hostile;

static const hostile table[] = {
    {"bucket name of 481 bytes", h_bucket_481, BS_ETOOBIG, 0},
    {"empty bucket name", h_bucket_empty, BS_EINVAL, 0},
    {"lookup key of 481 bytes", h_lookup_481, BS_ETOOBIG, 0},
    {"replica id of 257 bytes", h_replica_257, BS_ETOOBIG, 0},
    {"table name of 257 bytes", h_table_257, BS_ETOOBIG, 0},
    {"empty table name", h_table_empty, BS_EINVAL, 0},
    {"op data over BS_MAX_OP_DATA", h_data_huge, BS_ETOOBIG, 0},
    {"parameter row over BS_MAX_OP_DATA", h_param_huge, BS_ETOOBIG, 0},
    {"stored data over BS_MAX_OP_DATA", h_stored_huge, BS_ETOOBIG, 0},
    {"object id over 65535 bytes", h_object_id_huge, BS_ETOOBIG, 0},
    {"data NULL with size 5", h_data_null, BS_EINVAL, 0},
    {"tag 7", h_bad_tag, BS_EINVAL, 0},
    {"save version 99", h_bad_version, BS_EINVAL, 0},
    {"INSERT without after_id", h_insert_no_id, BS_EINVAL, 0},
    {"rows NULL with n_rows 3", h_rows_null, BS_EINVAL, 0},
    {"LSN of 256 bytes", h_lsn_256, BS_ETOOBIG, 0},
    {"commit at an older LSN (blocked)", h_lsn_older, BS_OK, 0},
    {"snapshot_done at an older LSN", h_snapshot_older, BS_OK, 0},
    {"save on a NULL writer", h_null_writer, BS_EINVAL, 0},
    {"commit on a NULL writer", h_null_commit, BS_EINVAL, 0},
    {"checksums on a NULL storage", h_null_storage, BS_EINVAL, 0},
    {"get_checkpoint with NULL out", h_null_out, BS_EINVAL, 0},
    {"stream_create on a NULL db", h_null_db, BS_EINVAL, 0},
    {"verify on a NULL db", h_null_verify, BS_EINVAL, 0},
    {"compact on a NULL storage", h_null_compact, BS_EINVAL, 0},
    {"checksums at 2^63", h_checkpoint_2_63, BS_EINVAL, 0},
    {"compact with a NaN ratio", h_compact_nan, BS_EINVAL, 0},
    {"compact with buckets NULL, n 2", h_compact_buckets_null, BS_EINVAL, 0},
    {"compact horizon 2^63", h_compact_horizon_2_63, BS_EINVAL, 0},
    {"stream name of 256 bytes", h_stream_name_256, BS_ETOOBIG, 0},
    {"user id of 481 bytes", h_user_481, BS_ETOOBIG, 0},
    {"malformed lookup key", h_lookup_decode_garbage, BS_ECORRUPT, 0},
    {"open options version 99", h_open_opts_version, BS_EINVAL, 0},
    {"open a foreign file", h_open_foreign, BS_ECORRUPT, 0},
    {"parameter sets, checkpoint above the head, NULL fn", h_params_limit, BS_EINVAL, 0},
    {"writer on a read-only handle", h_rdonly_write, BS_ESTATE, 0},
    {"invalid UTF-8 and NUL bytes (opaque: queued)", h_invalid_utf8_queued, BS_OK, 1},
};

static void test_hostile_table(void **state) {
  hx *h = *state;
  size_t n = sizeof table / sizeof table[0];
  big = malloc(BIG);
  assert_non_null(big);
  memset(big, 'x', BIG);
  memset(long_name, 'k', sizeof long_name);
  long_name[3] = 0; /* an embedded NUL in every long name */
  for (size_t i = 0; i < n; i++) {
    hx_snap before, after;
    uint64_t last = 0, last_after = 0;
    int rc;
    snap(h, &before);
    assert_int_equal(bs_writer_flush(&last, h->w, NULL), BS_OK);
    memset(&h->err, 0, sizeof h->err);
    rc = table[i].fn(h);
    if (rc != table[i].want)
      fail_msg("%s: got %s (%d: %s), documented %s", table[i].name, bs_strerror(rc), rc, h->err.msg,
               bs_strerror(table[i].want));
    if (rc != BS_OK && h->err.code != rc)
      fail_msg("%s: err.code %d does not mirror the status %d", table[i].name, h->err.code, rc);
    if (rc != BS_OK && !h->err.msg[0]) fail_msg("%s: no error message", table[i].name);
    if (table[i].queued) { /* discard the queue: close the writer unflushed */
      bs_writer_close(h->w);
      h->w = NULL;
      assert_int_equal(bs_writer_open(&h->w, h->st, NULL, NULL), BS_OK);
    }
    /* nothing was queued by the failed call, and the file did not change */
    assert_int_equal(bs_writer_flush(&last_after, h->w, NULL), BS_OK);
    if (last_after != last)
      fail_msg("%s: the call queued ops (%llu -> %llu)", table[i].name, (unsigned long long)last,
               (unsigned long long)last_after);
    snap(h, &after);
    if (strcmp(before.fp, after.fp) != 0)
      fail_msg("%s: the committed state changed:\n%s---\n%s", table[i].name, before.fp, after.fp);
    after.stat.file_bytes = before.stat.file_bytes; /* LMDB may reuse or add free pages */
    if (memcmp(&before.stat, &after.stat, sizeof before.stat) != 0)
      fail_msg("%s: bs_db_stat changed", table[i].name);
    if (before.status.checkpoint != after.status.checkpoint ||
        before.status.last_persisted_op != after.status.last_persisted_op ||
        before.status.lsn_size != after.status.lsn_size ||
        memcmp(before.status.lsn, after.status.lsn, before.status.lsn_size) != 0)
      fail_msg("%s: the stream status changed", table[i].name);
    free(before.fp);
    free(after.fp);
  }
  printf("hostile calls: %zu, each with its documented status and the file unchanged\n", n);
  free(big);
  big = NULL;
}

/* ---- The driver ----------------------------------------------------------------------------- */

static void test_hostile_driver(void **state) {
  static const char *lines[] = {
      "{\"cmd\":\"checksums\",\"checkpoint\":\"-1\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":\"1e3\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":\"0x10\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":\" 12\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":\"18446744073709551616\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":\"9223372036854775808\",\"buckets\":[\"b\"]}",
      "{\"cmd\":\"checksums\",\"checkpoint\":12,\"buckets\":[\"b\"]}",
      "{\"cmd\":\"bucket_data\",\"checkpoint\":\"1\",\"buckets\":{\"b\":\"-3\"}}",
      "{\"cmd\":\"compact\",\"max_op_id\":\"+5\"}",
      "{\"cmd\":\"save\",\"table\":\"t\",\"tag\":\"insert\",\"id\":\"\xff\xfe\"}",
      "not json at all",
      "{\"cmd\":\"save\",\"table\":\"t\",\"tag\":\"upsert\",\"id\":\"r\"}",
      "{\"cmd\":\"commit\",\"lsn\":7}",
      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]",
      "{\"cmd\":\"checksums\",\"checkpoint\":\"1\",\"buckets\":[\"b\"],\"cmd\":\"stat\"}",
  };
  size_t n = sizeof lines / sizeof lines[0], got = 0;
  char dir[256], in[320], out[320], cmd[1800], buf[4096], cli[1024];
  FILE *f;
  (void)state;
  if (ft_cli_path(cli, sizeof cli) != 0)
    fail_msg("no CLI beside this test (BUILD/bucketstore): make builds it before the tests");
  assert_int_equal(ft_tmpdir(dir, sizeof dir, "hostile_drv"), 0);
  snprintf(in, sizeof in, "%s/in", dir);
  snprintf(out, sizeof out, "%s/out", dir);
  f = fopen(in, "w");
  assert_non_null(f);
  fputs("{\"cmd\":\"stream.create\",\"name\":\"s\"}\n", f);
  for (size_t i = 0; i < n; i++) fprintf(f, "%s\n", lines[i]);
  fputs("{\"cmd\":\"checkpoint\"}\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s drive --memory < %s > %s", cli, in, out);
  assert_int_equal(system(cmd), 0);
  f = fopen(out, "r");
  assert_non_null(f);
  while (fgets(buf, sizeof buf, f)) {
    if (got == 0 || got == n + 1) {
      if (!strstr(buf, "\"ok\":true")) fail_msg("driver line %zu: %s", got, buf);
    } else if (!strstr(buf, "\"ok\":false") || !strstr(buf, "\"code\":\"BS_EINVAL\"")) {
      fail_msg("driver: hostile line %s\n  got %s", lines[got - 1], buf);
    }
    got++;
  }
  fclose(f);
  assert_int_equal(got, n + 2); /* one reply per line; the driver went on after each */
  printf("driver: %zu hostile lines, each answered BS_EINVAL\n", n);
  ft_rm_db(dir, NULL);
}

/* ---- Isolation ------------------------------------------------------------------------------ */

/* Names crafted against the key layout (internal.h): length prefixes (u16be), u32be stream and
 * table ids, u64be ids, the subkey's '/', NUL bytes, and prefixes of each other. */
static const struct {
  const char *p;
  size_t n;
} crafted[] = {
    {"a", 1},
    {"a\0", 2},
    {"a\0\0\0\1", 5},
    {"\0\0\0\1a", 5},
    {"\0\0\0\2a", 5},
    {"\0\x01"
     "a",
     3},
    {"\0\x02"
     "a\0",
     4},
    {"ab", 2},
    {"a/b", 3},
    {"00000001/", 9},
    {"\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\2", 16},
    {"\xff\xff\xff\xff", 4},
};
#define N_CRAFTED (sizeof crafted / sizeof crafted[0])

static int collect_ids(const bs_chunk *c, void *payload) {
  char *seen = payload; /* seen[i]: row "o<i>" is live (its last PUT/REMOVE was a PUT) */
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    char id[16];
    int idx;
    if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) continue;
    /* borrowed bytes are not NUL-terminated: copy before parsing */
    if (op->object_id.size < 2 || op->object_id.size >= sizeof id) return -1;
    memcpy(id, op->object_id.data, op->object_id.size);
    id[op->object_id.size] = 0;
    if (sscanf(id + 1, "%d", &idx) != 1 || idx < 0 || idx >= 64) return -1;
    seen[idx] = op->type == BS_OP_PUT;
  }
  return 0;
}

static int collect_params(const bs_val *p, void *payload) {
  char *seen = payload, buf[32];
  int idx;
  if (p->size < 3 || p->size >= sizeof buf) return -1;
  memcpy(buf, p->data, p->size);
  buf[p->size] = 0;
  if (sscanf(buf, "{\"%d", &idx) != 1 || idx < 0 || idx >= 64) return -1;
  seen[idx]++;
  return 0;
}

static void check_bucket(bs_storage *st, uint64_t C, bs_val name, int want_idx, const char *what) {
  char seen[64] = {0};
  bs_bucket_request req = {name, 0};
  int more = 0;
  assert_int_equal(bs_get_bucket_data(&more, st, C, &req, 1, NULL, collect_ids, seen, NULL), BS_OK);
  for (int i = 0; i < 64; i++) {
    int want = i == want_idx ? 1 : 0;
    if (seen[i] != want) {
      fprintf(stderr, "%s %d at %llu:", what, want_idx, (unsigned long long)C);
      for (int j = 0; j < 64; j++)
        if (seen[j]) fprintf(stderr, " o%d x%d", j, seen[j]);
      fprintf(stderr, "\n");
    }
    if (seen[i] != want)
      fail_msg("%s %d: row o%d live %d, expected %d", what, want_idx, i, seen[i], want);
  }
}

static void test_isolation(void **state) {
  hx *h = *state;
  bs_storage *st2 = NULL;
  bs_writer *w2 = NULL;
  bs_commit_result r;
  char params[N_CRAFTED][16], oid[16];
  bs_val pv[N_CRAFTED];
  uint64_t C;
  uint32_t s2;
  /* stream 2: the same crafted names, different rows; created first so it is not the active */
  assert_int_equal(bs_stream_create(&s2, h->db, "s2", NULL, NULL), BS_OK);
  assert_int_equal(bs_storage_open(&st2, h->db, s2, NULL), BS_OK);
  assert_int_equal(bs_writer_open(&w2, st2, NULL, NULL), BS_OK);
  for (size_t i = 0; i < N_CRAFTED; i++) {
    bs_val name = vn(crafted[i].p, crafted[i].n);
    bs_lookup lk;
    snprintf(params[i], sizeof params[i], "{\"%zu\":1}", i);
    pv[i] = v(params[i]);
    lk.key = name; /* raw bytes as a lookup key: also crafted */
    lk.params = &pv[i];
    lk.n_params = 1;
    /* row o<i>: bucket = table = replica id = lookup key = crafted[i], in both streams */
    snprintf(oid, sizeof oid, "o%zu", i);
    assert_int_equal(save_row(h->w, name, BS_INSERT, name, name, v(oid), v("{}"), &lk, NULL),
                     BS_OK);
    snprintf(oid, sizeof oid, "o%zu", i + N_CRAFTED);
    assert_int_equal(save_row(w2, name, BS_INSERT, name, name, v(oid), v("{}"), &lk, NULL), BS_OK);
  }
  assert_int_equal(bs_writer_snapshot_done(w2, v("0001"), NULL), BS_OK);
  assert_int_equal(bs_writer_flush(NULL, w2, NULL), BS_OK); /* persisted in s2, not committed */
  assert_int_equal(bs_writer_commit(&r, h->w, v("0006"), NULL, NULL), BS_OK);
  C = r.checkpoint;
  for (size_t i = 0; i < N_CRAFTED; i++) {
    bs_val name = vn(crafted[i].p, crafted[i].n);
    char seen[64] = {0};
    check_bucket(h->st, C, name, (int)i, "crafted bucket");
    assert_int_equal(bs_get_parameter_sets(h->st, C, &name, 1, BS_PARAM_LIMIT_DEFAULT,
                                           collect_params, seen, NULL),
                     BS_OK);
    for (int j = 0; j < 64; j++)
      if (seen[j] != (j == (int)i)) fail_msg("crafted lookup %zu: %d rows of %d", i, seen[j], j);
  }
  /* truncating crafted table 0 ("a") removes row o0 only */
  assert_int_equal(bs_writer_truncate(h->w, vn(crafted[0].p, crafted[0].n), NULL), BS_OK);
  assert_int_equal(bs_writer_commit(&r, h->w, v("0007"), NULL, NULL), BS_OK);
  C = r.checkpoint;
  check_bucket(h->st, C, vn(crafted[0].p, crafted[0].n), -1, "truncated bucket");
  for (size_t i = 1; i < N_CRAFTED; i++)
    check_bucket(h->st, C, vn(crafted[i].p, crafted[i].n), (int)i, "bucket after truncate");
  /* stream 2 commits: its rows become visible there, and stay invisible in stream 1 */
  assert_int_equal(bs_writer_commit(&r, w2, v("0002"), NULL, NULL), BS_OK);
  for (size_t i = 0; i < N_CRAFTED; i++)
    check_bucket(st2, r.checkpoint, vn(crafted[i].p, crafted[i].n), (int)(i + N_CRAFTED),
                 "stream 2 bucket");
  for (size_t i = 1; i < N_CRAFTED; i++)
    check_bucket(h->st, C, vn(crafted[i].p, crafted[i].n), (int)i, "stream 1 after stream 2");
  /* clearing stream 2 leaves stream 1 alone */
  assert_int_equal(bs_clear(st2, NULL), BS_OK);
  for (size_t i = 1; i < N_CRAFTED; i++)
    check_bucket(h->st, C, vn(crafted[i].p, crafted[i].n), (int)i, "stream 1 after clear");
  {
    uint64_t problems = 1;
    assert_int_equal(bs_db_verify(&problems, h->db, NULL, NULL, NULL), BS_OK);
    assert_int_equal(problems, 0);
  }
  printf("isolation: %zu crafted names as bucket, table, replica id and lookup key, 2 streams\n",
         N_CRAFTED);
  bs_writer_close(w2);
  bs_storage_close(st2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_hostile_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_driver, setup, teardown),
      cmocka_unit_test_setup_teardown(test_isolation, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
