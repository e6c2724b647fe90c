/*
 * test_format.c: the LMDB format layer's migrations (lmdb_format.c) on a file larger than one
 * migration transaction. A database written by this build is turned into the format-1 file an
 * earlier build would have written (its source records re-encoded as format 1, the format
 * record set to 1: util_format1.h), into the format-2 one (those records converted by the
 * migration's own step to format 2, the format record 2) and into the format-3 one (this build's
 * records, the format record 3), then each is opened:
 *  - read-only and with BS_OPEN_NOMIGRATE: refused, the file unchanged;
 *  - read-write: migrated in several transactions, after which every record is the one this
 *    build wrote (bs_db_export, byte for byte), verify is clean and writes go on;
 *  - stopped between any two of the migration's transactions (a child process leaves at the
 *    seam, as a kill -9 would): the file says the next format with the step record (so an
 *    older build refuses it), a read-only open says the migration stopped halfway, and the next
 *    read-write open finishes it with the same records.
 * The small files of tests/data, written by earlier builds themselves, are tests/format_check.sh's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lmdb_internal.h"
#include "util_contract.h"
#include "util_format1.h"

#define ROWS   23000u /* three migration transactions of 10,000 records a step */
#define OLDEST 1u     /* the formats a file can be migrated from: OLDEST .. BS_FORMAT_VERSION - 1 */
#define N_OLD  (BS_FORMAT_VERSION - OLDEST)

static const bs_val table_t = {(const unsigned char *)"t", 1}; /* write_rows' one table */

/* The database's records as this build exports them: a hash and a count. */
typedef struct digest {
  uint64_t h, n;
} digest;

static void mix(digest *d, const void *p, size_t n) {
  const unsigned char *b = p;
  d->h = (d->h ^ n) * 1099511628211ull;
  for (size_t i = 0; i < n; i++) d->h = (d->h ^ b[i]) * 1099511628211ull;
}

static int add_record(const bs_record *r, void *payload) {
  digest *d = payload;
  mix(d, r->table, strlen(r->table));
  mix(d, r->key.data, r->key.size);
  mix(d, r->value.data, r->value.size);
  d->n++;
  return 0;
}

static digest digest_of(const char *path) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  digest d = {1469598103934665603ull, 0};
  bs_db *db;
  uint64_t problems = 1;
  o.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&db, path, &o, &ct_err));
  CT_OK(bs_db_export(db, 0, add_record, &d, &ct_err));
  CT_OK(bs_db_verify(&problems, db, NULL, NULL, &ct_err));
  CT_EQ_U64(problems, 0);
  bs_close(db);
  return d;
}

/* ROWS rows, each in a bucket of its list (object id = replica id; every other one's type the
 * table's name) and every third also in a global bucket under another type and id, every fifth
 * with a lookup, every seventh updated, every eleventh deleted; then a checkpoint. */
static void write_rows(ct_env *e) {
  unsigned char kb[32];
  const bs_val params[1] = {{(const unsigned char *)"{\"p\":1}", 7}};
  bs_commit_result cr;
  char id[16], other[24], data[32], bucket[16];
  for (unsigned pass = 0; pass < 2; pass++)
    for (unsigned i = 0; i < ROWS; i++) {
      bs_lookup lk = {ct_key_int(kb, sizeof kb, i % 50), params, 1};
      if (pass && i % 7 && i % 11) continue;
      snprintf(id, sizeof id, "r%u", i);
      snprintf(other, sizeof other, "g-%u", i);
      snprintf(data, sizeof data, "{\"v\":%u}", pass);
      snprintf(bucket, sizeof bucket, "list%u", i % 40);
      const char *type = i % 2 ? "todo" : "t";
      if (pass && i % 11 == 0) {
        CT_OK(ct_save(e->w, BS_DELETE, "t", id, id, CT_NOROWS));
      } else if (i % 3 == 0) {
        CT_OK(ct_save_lk(e->w, pass ? BS_UPDATE : BS_INSERT, "t", NULL, id,
                         CT_ROWS({bucket, type, id, data}, {"global", "all", other, data}), &lk,
                         i % 5 == 0));
      } else {
        CT_OK(ct_save_lk(e->w, pass ? BS_UPDATE : BS_INSERT, "t", NULL, id,
                         CT_ROWS({bucket, type, id, data}), &lk, i % 5 == 0));
      }
      if (i % 5000 == 4999) CT_OK(ct_commit(e->w, ct_lsn(pass * 10 + i / 5000 + 1), &cr));
    }
  CT_OK(ct_commit(e->w, ct_lsn(99), &cr));
}

/* A varint of a chunk (docs/format.md 4.3). */
static uint64_t chunk_varint(const unsigned char *p, size_t *pos) {
  uint64_t r = 0;
  for (unsigned s = 0;; s += 7) {
    unsigned char b = p[(*pos)++];
    r |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) return r;
  }
}

/* Rewrites each chunk of format 6 (compact op values, header flag 2) as format 5's: the same
 * ops, each op value in format 5's encoding (docs/format.md 4.3), a chunk of more than one op cut
 * in two (its first half under its own last op's key): so the migration's step has chunks to
 * join again, as it had a format-5 writer's 20-op chunks to fill into 22. */
static void uncompact(MDB_txn *txn) {
  MDB_dbi ops;
  MDB_cursor *cur;
  MDB_val k, v;
  unsigned char *buf = malloc(1 << 20), next[16] = {0}, kc[16];
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS], n;
  int mrc;
  assert_non_null(buf);
  assert_int_equal(mdb_dbi_open(txn, "ops", 0, &ops), 0);
  assert_int_equal(mdb_cursor_open(txn, ops, &cur), 0);
  for (k = (MDB_val){16, next}; (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)) == 0;
       k = (MDB_val){16, next}) {
    uint64_t bucket = bs__get_u64be(k.mv_data);
    unsigned char *c = buf + (1 << 19);
    uint32_t half;
    assert_true(v.mv_size <= (size_t)1 << 18);
    memcpy(c, v.mv_data, v.mv_size);
    assert_int_equal(bs__chunk_decode(c, v.mv_size, ids, off, len, &n), BS_OK);
    assert_true(bs__chunk_flags(c) & BS_CHUNK_COMPACT); /* this build writes no other */
    assert_int_equal(mdb_cursor_del(cur, 0), 0);
    half = n > 1 ? n / 2 : n;
    for (uint32_t from = 0; from < n; from = half, half = n) {
      size_t size = BS_CHUNK_HDR;
      MDB_val out = {0, buf};
      for (uint32_t i = from; i < half; i++) {
        bs_op op;
        assert_int_equal(bs__op_value_cdecode(c + off[i], len[i], ids[i], &op), BS_OK);
        size += bs__chunk_add(buf + size, i > from ? ids[i] - ids[i - 1] : 0, &op, NULL,
                              bs__op_value_size(&op));
      }
      assert_int_equal(bs__chunk_seal(buf, size, ids[from]), BS_OK);
      out.mv_size = size;
      bs__put_u64be(kc, bucket);
      bs__put_u64be(kc + 8, ids[half - 1]);
      k = (MDB_val){16, kc};
      assert_int_equal(mdb_put(txn, ops, &k, &out, MDB_NOOVERWRITE), 0);
    }
    assert_true(ids[n - 1] < UINT64_MAX);
    bs__put_u64be(next, bucket);
    bs__put_u64be(next + 8, ids[n - 1] + 1);
  }
  assert_int_equal(mrc, MDB_NOTFOUND);
  mdb_cursor_close(cur);
  free(buf);
}

/* Rewrites the ops of format 5 (chunks) as format 4's, a record per op keyed bucket id | op
 * id, from the layout docs/format.md 4.3 gives. */
static void unchunk(MDB_txn *txn) {
  MDB_dbi ops;
  MDB_cursor *cur;
  MDB_val k, v;
  unsigned char *buf = malloc(1 << 20), next[16];
  int mrc;
  assert_non_null(buf);
  assert_int_equal(mdb_dbi_open(txn, "ops", 0, &ops), 0);
  assert_int_equal(mdb_cursor_open(txn, ops, &cur), 0);
  /* a chunk's ops take keys up to the chunk's, and the next chunk's key is above it */
  bs__put_u64be(next, 0);
  bs__put_u64be(next + 8, 0);
  for (k = (MDB_val){16, next}; (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)) == 0;
       k = (MDB_val){16, next}) {
    size_t pos = 21, n = bs__get_u32le(v.mv_data);
    uint64_t bucket = bs__get_u64be(k.mv_data), id = bs__get_u64le((unsigned char *)v.mv_data + 8);
    uint64_t last = bs__get_u64be((unsigned char *)k.mv_data + 8);
    unsigned char kb[16];
    assert_true(n > 0 && v.mv_size <= (size_t)1 << 20);
    memcpy(buf, v.mv_data, v.mv_size);
    assert_int_equal(mdb_cursor_del(cur, 0), 0);
    for (size_t i = 0; i < n; i++) {
      uint64_t delta = chunk_varint(buf, &pos), size = chunk_varint(buf, &pos);
      MDB_val ok = {16, kb}, ov = {size, buf + pos};
      id += delta;
      bs__put_u64be(kb, bucket);
      bs__put_u64be(kb + 8, id);
      assert_int_equal(mdb_put(txn, ops, &ok, &ov, MDB_NOOVERWRITE), 0);
      pos += size;
    }
    CT_EQ_U64(id, last);
    assert_true(last < UINT64_MAX);
    bs__put_u64be(next, bucket);
    bs__put_u64be(next + 8, last + 1);
  }
  assert_int_equal(mrc, MDB_NOTFOUND);
  mdb_cursor_close(cur);
  free(buf);
}

/* Rewrites the file at path as format 1 to 5: the op values in format 5's encoding, the ops one a
 * record (format 4 and older), every source record re-encoded as format 1 (then converted to 2 by
 * the migration's step; 3 to 5 have this build's), the format record to match. */
static void to_format(const char *path, uint32_t format) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi meta, src;
  MDB_cursor *cur;
  MDB_val k, v, fk = bs__lmdb_format_key(), fv;
  unsigned char f1[BS_FORMAT_VALUE_SIZE], *buf = malloc(1 << 20), *buf2 = malloc(2 << 20);
  bs__member *m = malloc(1024 * sizeof *m);
  bs_val lk[64];
  int mrc;
  assert_non_null(buf);
  assert_non_null(buf2);
  assert_non_null(m);
  assert_true(format >= 1 && format <= 5);
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
  assert_int_equal(mdb_env_open(env, path, MDB_NOSUBDIR, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  assert_int_equal(mdb_dbi_open(txn, "source", 0, &src), 0);
  assert_int_equal(mdb_cursor_open(txn, src, &cur), 0);
  uncompact(txn);
  if (format <= 4) unchunk(txn);
  /* format 3's and 4's source records are this build's */
  for (mrc = format >= 3 ? MDB_NOTFOUND : mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs_val key = {k.mv_data, k.mv_size};
    unsigned char kc[BS_SOURCE_KEY_MAX];
    bs__srec r;
    MDB_val out;
    assert_int_equal(bs__lmdb_srec_head(&v, &r), BS_OK);
    assert_true(r.nm <= 1024 && r.nl <= 64);
    assert_int_equal(bs__lmdb_srec_decode(&v, table_t, bs__lmdb_source_rid(key), &r, m, lk), BS_OK);
    out.mv_size = srec1_encode(buf, &r);
    out.mv_data = buf;
    if (format == 2) {
      assert_true(bs__lmdb_srec1_bound(&out) <= (size_t)2 << 20);
      assert_int_equal(bs__lmdb_srec1_convert(&k, &out, buf2, &out.mv_size), BS_OK);
      out.mv_data = buf2;
    }
    memcpy(kc, k.mv_data, k.mv_size);
    k.mv_data = kc;
    assert_int_equal(mdb_cursor_put(cur, &k, &out, MDB_CURRENT), 0);
  }
  assert_int_equal(mrc, MDB_NOTFOUND);
  mdb_cursor_close(cur);
  bs__lmdb_format_value(f1, format);
  fv = (MDB_val){sizeof f1, f1};
  assert_int_equal(mdb_put(txn, meta, &fk, &fv, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  free(buf);
  free(buf2);
  free(m);
}

/* The format record's version and whether the step record is there, read without the library. */
static void raw_format(const char *path, uint32_t *version, int *stepping) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi meta;
  MDB_val fk = bs__lmdb_format_key(), sk = bs__lmdb_format_step_key(), v;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
  assert_int_equal(mdb_env_open(env, path, MDB_NOSUBDIR | MDB_RDONLY, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  assert_int_equal(mdb_get(txn, meta, &fk, &v), 0);
  assert_int_equal(bs__lmdb_format_decode(&v, version), BS_OK);
  *stepping = mdb_get(txn, meta, &sk, &v) == 0;
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

/* The whole file at path (malloc'd, its size in *n). */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *p;
  long size;
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  size = ftell(f);
  assert_true(size >= 0);
  rewind(f);
  p = malloc((size_t)size + 1);
  assert_non_null(p);
  assert_int_equal(fread(p, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *n = (size_t)size;
  return p;
}

/* Copies the file from over to (without a lock file beside it). */
static void copy_file(const char *from, const char *to) {
  char lock[300];
  size_t n;
  unsigned char *p = slurp(from, &n);
  FILE *f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(p);
  snprintf(lock, sizeof lock, "%s-lock", to);
  (void)unlink(lock);
}

static int files_equal(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *pa = slurp(a, &na), *pb = slurp(b, &nb);
  int eq = na == nb && memcmp(pa, pb, na) == 0;
  free(pa);
  free(pb);
  return eq;
}

static unsigned batches_seen;
static void count_batch(unsigned batch) {
  batches_seen = batch + 1;
}

/* The transactions of format 5's step, the ops regrouped into chunks (10,000 ops each, and the
 * one that finds none left), of format 6's, the chunks recoded, and the ops of the file. */
static unsigned ops_batches, recode_batches;
static uint64_t n_ops;

/* Files of each older format (old[N - OLDEST]: format N) beside what this build wrote before
 * the downgrade (its digest). */
typedef struct fixture {
  ct_env *e;
  char old[N_OLD][256], work[256];
  digest want;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f || !(f->e = ct_env_new(&ct_backends[CT_LMDB]))) return -1;
  write_rows(f->e);
  bs_writer_close(f->e->w);
  bs_storage_close(f->e->st);
  bs_close(f->e->db);
  f->e->w = NULL, f->e->st = NULL, f->e->db = NULL;
  f->want = digest_of(f->e->path);
  for (uint32_t i = 0; i < N_OLD; i++) {
    snprintf(f->old[i], sizeof f->old[i], "%s/format%u.mdb", f->e->dir, OLDEST + i);
    copy_file(f->e->path, f->old[i]);
    to_format(f->old[i], OLDEST + i);
  }
  snprintf(f->work, sizeof f->work, "%s/work.mdb", f->e->dir);
  {
    bs_open_options o = BS_OPEN_OPTIONS_INIT;
    bs_stat st;
    bs_db *db = NULL;
    o.flags = BS_OPEN_RDONLY;
    if (bs_open(&db, f->e->path, &o, &ct_err) != BS_OK || bs_db_stat(&st, db, &ct_err) != BS_OK)
      return -1;
    bs_close(db);
    n_ops = st.ops_put + st.ops_remove + st.ops_move + st.ops_clear;
  }
  /* format 5 -> 6, and 4 -> 5 -> 6: the batches setup counts, which test_migrates_in_batches
   * checks */
  for (uint32_t v = 5; v >= 4; v--) {
    bs_db *db = NULL;
    copy_file(f->old[v - OLDEST], f->work);
    bs__lmdb_set_migrate_seam(&(bs__lmdb_migrate_seam){.batch = count_batch});
    batches_seen = 0;
    if (bs_open(&db, f->work, NULL, &ct_err) != BS_OK) {
      fprintf(stderr, "setup: %s\n", ct_err.msg);
      return -1;
    }
    bs_close(db);
    bs__lmdb_set_migrate_seam(NULL);
    if (v == 5)
      recode_batches = batches_seen ? batches_seen - 1 : 0;
    else
      ops_batches = batches_seen > recode_batches ? batches_seen - 1 - recode_batches : 0;
  }
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  const char *files[N_OLD + 1];
  char lock[300];
  for (uint32_t i = 0; i < N_OLD; i++) files[i] = f->old[i];
  files[N_OLD] = f->work;
  for (uint32_t i = 0; i <= N_OLD; i++) {
    snprintf(lock, sizeof lock, "%s-lock", files[i]);
    (void)unlink(files[i]);
    (void)unlink(lock);
  }
  ct_env_close(f->e);
  free(f->e);
  free(f);
  return 0;
}

static int open_flags(const char *path, unsigned flags) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  int rc;
  o.flags = flags;
  rc = bs_open(&db, path, &o, &ct_err);
  bs_close(db);
  return rc;
}

static void test_refused_unchanged(void **state) {
  fixture *f = *state;
  char want[128];
  uint32_t version;
  int stepping;
  for (uint32_t v = OLDEST; v < BS_FORMAT_VERSION; v++) {
    const char *old = f->old[v - OLDEST];
    snprintf(want, sizeof want,
             "format %u is older than this build's %u: a read-write open upgrades it in place", v,
             (unsigned)BS_FORMAT_VERSION);
    copy_file(old, f->work);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(open_flags(f->work, i ? BS_OPEN_NOMIGRATE : BS_OPEN_RDONLY), BS_ECORRUPT);
      assert_non_null(strstr(ct_err.msg, want));
      assert_true(files_equal(old, f->work));
    }
    raw_format(f->work, &version, &stepping);
    CT_EQ_U64(version, v);
    assert_false(stepping);
  }
}

/* The transactions of the step from format v: a source step's 23,000 records take three, the
 * last of which ends the step; format 4's, a version stamp, one; format 5's, the ops regrouped,
 * and format 6's, the chunks recoded, as setup counted them. */
static unsigned step_batches(uint32_t v) {
  return v == 3 ? 1 : v == 4 ? ops_batches : v == 5 ? recode_batches : 3;
}

/* The transactions of a migration from format v: its steps', and one more that finds nothing
 * left. */
static unsigned batches_from(uint32_t v) {
  unsigned n = 1;
  for (; v < BS_FORMAT_VERSION; v++) n += step_batches(v);
  return n;
}

static void test_migrates_in_batches(void **state) {
  fixture *f = *state;
  /* the ops step: 10,000 ops a transaction, the last one finding none left (n_ops is not a
   * multiple of 10,000 here: the last batch with ops ends the step) */
  assert_true(n_ops > 30000 && n_ops % 10000 != 0);
  CT_EQ_U64(ops_batches, n_ops / 10000 + 1);
  /* the recoding: its chunks (fewer than 10,000, under 16 MiB) in one transaction, which ends
   * the step (test_recoded_in_small_batches cuts it) */
  CT_EQ_U64(recode_batches, 1);
  for (uint32_t v = OLDEST; v < BS_FORMAT_VERSION; v++) {
    digest got;
    uint32_t version;
    int stepping;
    copy_file(f->old[v - OLDEST], f->work);
    bs__lmdb_set_migrate_seam(&(bs__lmdb_migrate_seam){.batch = count_batch});
    batches_seen = 0;
    CT_OK(open_flags(f->work, 0));
    bs__lmdb_set_migrate_seam(NULL);
    CT_EQ_U64(batches_seen, batches_from(v));
    raw_format(f->work, &version, &stepping);
    CT_EQ_U64(version, BS_FORMAT_VERSION);
    assert_false(stepping);
    got = digest_of(f->work);
    CT_EQ_U64(got.n, f->want.n);
    CT_EQ_U64(got.h, f->want.h);
    /* and a second open finds nothing to do */
    bs__lmdb_set_migrate_seam(&(bs__lmdb_migrate_seam){.batch = count_batch});
    batches_seen = 0;
    CT_OK(open_flags(f->work, 0));
    bs__lmdb_set_migrate_seam(NULL);
    CT_EQ_U64(batches_seen, 0);
  }
}

static unsigned stop_at;
static void stop_here(unsigned batch) {
  if (batch == stop_at) _exit(0); /* between two transactions: what a kill leaves */
}

static void test_stopped_halfway(void **state) {
  fixture *f = *state;
  char want[96];
  for (uint32_t v = OLDEST; v < BS_FORMAT_VERSION; v++)
    for (stop_at = 0; stop_at < batches_from(v); stop_at++) {
      const char *old = f->old[v - OLDEST];
      uint32_t version;
      int stepping, status;
      digest got;
      pid_t pid;
      copy_file(old, f->work);
      fflush(NULL);
      pid = fork();
      assert_true(pid >= 0);
      if (pid == 0) {
        bs__lmdb_set_migrate_seam(&(bs__lmdb_migrate_seam){.batch = stop_here});
        (void)open_flags(f->work, 0);
        _exit(3); /* the migration ended before stop_at */
      }
      assert_int_equal(waitpid(pid, &status, 0), pid);
      assert_true(WIFEXITED(status));
      CT_EQ_U64(WEXITSTATUS(status), 0);
      raw_format(f->work, &version, &stepping);
      if (stop_at == 0) { /* nothing committed: the file as it was */
        assert_true(files_equal(old, f->work));
        CT_EQ_U64(version, v);
        assert_false(stepping);
      } else { /* the step under way: marked with its format (older builds refuse it) */
        uint32_t from = v;
        unsigned done = stop_at;
        while (done > step_batches(from)) done -= step_batches(from++);
        CT_EQ_U64(version, from + 1);
        /* the step's last batch deletes the step record (a stamp writes none) */
        assert_int_equal(stepping, done < step_batches(from));
        if (stepping) {
          snprintf(want, sizeof want, "its migration to format %u stopped halfway", version);
          assert_int_equal(open_flags(f->work, BS_OPEN_RDONLY), BS_ECORRUPT);
          assert_non_null(strstr(ct_err.msg, want));
        }
      }
      CT_OK(open_flags(f->work, 0));
      got = digest_of(f->work);
      CT_EQ_U64(got.n, f->want.n);
      CT_EQ_U64(got.h, f->want.h);
    }
}

/* Format 5 -> 6 in transactions of a few chunks (the seam's bound), stopped between any two of
 * the first ones: wherever the bounds cut the recoding, and wherever it stops, the chunks are
 * those this build's writer built (the same records, byte for byte). */
static void test_recoded_in_small_batches(void **state) {
  fixture *f = *state;
  const char *old = f->old[5 - OLDEST];
  static const unsigned bounds[] = {1, 7, 100};
  for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
    unsigned n_batches;
    digest got;
    copy_file(old, f->work);
    bs__lmdb_set_migrate_seam(&(bs__lmdb_migrate_seam){.batch = count_batch, .records = bounds[b]});
    batches_seen = 0;
    CT_OK(open_flags(f->work, 0));
    bs__lmdb_set_migrate_seam(NULL);
    n_batches = batches_seen;
    assert_true(n_batches > 3); /* cut: many transactions */
    got = digest_of(f->work);
    CT_EQ_U64(got.n, f->want.n);
    CT_EQ_U64(got.h, f->want.h);
    /* (the last transaction finds nothing left, the one before it ends the step) */
    for (stop_at = 1; stop_at + 1 < n_batches && stop_at < 12; stop_at++) {
      uint32_t version;
      int stepping, status;
      pid_t pid;
      copy_file(old, f->work);
      fflush(NULL);
      pid = fork();
      assert_true(pid >= 0);
      if (pid == 0) {
        bs__lmdb_set_migrate_seam(
            &(bs__lmdb_migrate_seam){.batch = stop_here, .records = bounds[b]});
        (void)open_flags(f->work, 0);
        _exit(3);
      }
      assert_int_equal(waitpid(pid, &status, 0), pid);
      assert_true(WIFEXITED(status));
      CT_EQ_U64(WEXITSTATUS(status), 0);
      raw_format(f->work, &version, &stepping);
      CT_EQ_U64(version, 6);
      assert_true(stepping);
      CT_OK(open_flags(f->work, 0)); /* finished with the default bounds */
      got = digest_of(f->work);
      CT_EQ_U64(got.n, f->want.n);
      CT_EQ_U64(got.h, f->want.h);
    }
  }
}

/* After the migration the writer goes on: a row written by the old build is updated and deleted
 * through its migrated source record (REMOVEs from both of its buckets). */
static void test_writes_after(void **state) {
  fixture *f = *state;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_commit_result cr;
  bs_checksum before, after;
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  uint64_t problems = 1;
  copy_file(f->old[BS_FORMAT_VERSION - 1 - OLDEST], f->work); /* the previous format's */
  CT_OK(bs_open(&db, f->work, &o, &ct_err));
  CT_OK(bs_storage_open(&st, db, f->e->stream, &ct_err));
  CT_OK(ct_checksum(st, INT64_MAX, "global", &before));
  CT_OK(bs_writer_open(&w, st, NULL, &ct_err));
  CT_OK(ct_save(w, BS_DELETE, "t", "r3", "r3", CT_NOROWS)); /* in list3 and global */
  CT_OK(ct_save(w, BS_UPDATE, "t", NULL, "r6", CT_ROWS({"list6", "todo", "r6", "{}"})));
  CT_OK(ct_commit(w, ct_lsn(100), &cr));
  assert_true(cr.checkpoint_created);
  CT_OK(ct_checksum(st, INT64_MAX, "global", &after));
  CT_EQ_U64(after.count, before.count + 2); /* r3's and r6's REMOVE of their global rows */
  CT_OK(bs_db_verify(&problems, db, NULL, NULL, &ct_err));
  CT_EQ_U64(problems, 0);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused_unchanged), cmocka_unit_test(test_migrates_in_batches),
      cmocka_unit_test(test_stopped_halfway),   cmocka_unit_test(test_recoded_in_small_batches),
      cmocka_unit_test(test_writes_after),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
