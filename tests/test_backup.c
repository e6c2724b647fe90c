/*
 * test_backup.c: bs_backup, bs_db_export and bs_load on the LMDB backend. A backup taken while
 * a writer thread commits (the writer runs inside the backup's progress callback, so the
 * commits certainly fall between the backup's snapshot and its end) is that snapshot: it opens,
 * verifies, and has the source's checksums at the snapshot's checkpoint and none of the later
 * ops. A backup after compaction is smaller than the file (free pages are not copied). Records
 * exported and loaded back give the same records and the same checksums at every checkpoint,
 * with edge values (1- and 480-byte bucket names, bytes that are not UTF-8, "" data, 1 vs 1.0
 * lookups, both hashes, write checkpoints). Refusals leave nothing behind, and so does a load
 * that its next or progress callback stopped, whatever value it returned.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "util_contract.h"
#include "util_fault.h"
#include "storage.h"

static int setup(void **state) {
  *state = ct_env_new(&ct_backends[CT_LMDB]);
  return *state ? 0 : -1;
}

static void path_in(const ct_env *e, char *out, size_t n, const char *name) {
  snprintf(out, n, "%s/%s", e->dir, name);
}

static uint64_t file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static size_t dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  size_t n = 0;
  assert_non_null(d);
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
      if (getenv("BS_VERBOSE")) fprintf(stderr, "  %s\n", de->d_name);
      n++;
    }
  closedir(d);
  return n;
}

/* round r of rows 0..n-1 (insert when r == 0), spread over 5 buckets, then a commit */
static void round_of(bs_writer *w, unsigned r, unsigned n, unsigned lsn) {
  char id[16], data[32], bucket[8];
  bs_commit_result cr;
  for (unsigned i = 0; i < n; i++) {
    snprintf(id, sizeof id, "r%u", i);
    snprintf(data, sizeof data, "{\"v\":%u}", r);
    snprintf(bucket, sizeof bucket, "b%u", i % 5);
    CT_OK(ct_save(w, r ? BS_UPDATE : BS_INSERT, "t", NULL, id, CT_ROWS({bucket, "t", id, data})));
  }
  CT_OK(ct_commit(w, ct_lsn(lsn), &cr));
  assert_true(cr.checkpoint_created);
}

static uint64_t checkpoint_of(bs_storage *st) {
  bs_checkpoint cp;
  CT_OK(bs_get_checkpoint(&cp, st, &ct_err));
  return cp.op_id;
}

static void on_problem(const char *p, void *payload) {
  (void)payload;
  fprintf(stderr, "problem: %s\n", p);
}

/* ---- A backup while a writer commits --------------------------------------------------------- */

typedef struct race {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go, done, calls;
  bs_writer *w;
} race;

static void *writer_thread(void *arg) {
  race *r = arg;
  pthread_mutex_lock(&r->mu);
  while (!r->go) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  for (unsigned k = 0; k < 5; k++) round_of(r->w, 10 + k, 40, 100 + k);
  pthread_mutex_lock(&r->mu);
  r->done = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* First call (the snapshot is taken, nothing read yet): the writer commits 5 times, so every
 * record the backup reads is read after those commits, and must still be the snapshot's. */
static int let_writer_run(uint64_t records, void *payload) {
  race *r = payload;
  if (r->calls++) return 0;
  assert_int_equal(records, 0);
  pthread_mutex_lock(&r->mu);
  r->go = 1;
  pthread_cond_broadcast(&r->cv);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  return 0;
}

static void test_backup_while_writing(void **state) {
  ct_env *e = *state;
  bs_backup_options o = BS_BACKUP_OPTIONS_INIT;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  race r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, e->w};
  char out[256], bucket[8];
  bs_db *copy;
  bs_storage *cst;
  bs_status status;
  pthread_t th;
  uint64_t c0, c1, cps[8], problems = 1;
  for (unsigned k = 0; k < 4; k++) {
    round_of(e->w, k, 40, k + 1);
    cps[k] = checkpoint_of(e->st);
  }
  c0 = cps[3];
  path_in(e, out, sizeof out, "copy.bs");
  o.progress = let_writer_run;
  o.progress_payload = &r;
  assert_int_equal(pthread_create(&th, NULL, writer_thread, &r), 0);
  CT_OK(bs_backup(e->db, out, &o, &ct_err));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(r.done);
  c1 = checkpoint_of(e->st);
  assert_true(c1 > c0); /* the writer was not held up: its commits landed during the backup */

  oo.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&copy, out, &oo, &ct_err));
  CT_OK(bs_db_verify(&problems, copy, on_problem, NULL, &ct_err));
  CT_EQ_U64(problems, 0);
  CT_OK(bs_storage_open(&cst, copy, 0, &ct_err));
  CT_EQ_U64(checkpoint_of(cst), c0); /* the snapshot's checkpoint, not a later one */
  CT_OK(bs_get_status(&status, cst, &ct_err));
  CT_EQ_U64(status.last_persisted_op, c0);
  for (unsigned b = 0; b < 5; b++) {
    bs_checksum want, got, later;
    snprintf(bucket, sizeof bucket, "b%u", b);
    for (unsigned k = 0; k < 4; k++) {
      CT_OK(ct_checksum(e->st, cps[k], bucket, &want));
      CT_OK(ct_checksum(cst, cps[k], bucket, &got));
      CT_EQ_U64(got.checksum, want.checksum);
      CT_EQ_U64(got.count, want.count);
    }
    /* the ops committed during the backup are not in the copy */
    CT_OK(ct_checksum(cst, c1, bucket, &got));
    CT_OK(ct_checksum(e->st, c0, bucket, &want));
    CT_OK(ct_checksum(e->st, c1, bucket, &later));
    CT_EQ_U64(got.count, want.count);
    assert_true(later.count > got.count);
  }
  bs_storage_close(cst);
  bs_close(copy);
}

/* ---- Compaction frees pages, the file keeps them, a backup drops them ------------------------ */

static void test_backup_reclaims_space(void **state) {
  ct_env *e = *state;
  bs_compact_stats cs;
  bs_stat before, after, of_copy;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  char out[256];
  bs_db *copy;
  uint64_t size_before;
  for (unsigned k = 0; k < 20; k++) round_of(e->w, k, 500, k + 1);
  CT_OK(bs_db_stat(&before, e->db, &ct_err));
  CT_OK(bs_compact(&cs, e->st, NULL, &ct_err));
  assert_true(cs.ops_moved > 0);
  CT_OK(bs_db_stat(&after, e->db, &ct_err));
  size_before = file_size(e->path);
  /* the file did not shrink, its free pages grew */
  assert_true(after.file_bytes >= before.file_bytes);
  assert_true(after.reclaimable_bytes > before.reclaimable_bytes);
  assert_true(after.reclaimable_bytes > after.file_bytes / 4);
  path_in(e, out, sizeof out, "copy.bs");
  CT_OK(bs_backup(e->db, out, NULL, &ct_err));
  assert_true(file_size(out) < size_before);
  assert_true(file_size(out) + after.reclaimable_bytes / 2 <= size_before);
  oo.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&copy, out, &oo, &ct_err));
  CT_OK(bs_db_stat(&of_copy, copy, &ct_err));
  bs_close(copy);
  CT_EQ_U64(of_copy.buckets, after.buckets);
  CT_EQ_U64(of_copy.ops_put, after.ops_put);
  CT_EQ_U64(of_copy.ops_move, after.ops_move);
  CT_EQ_U64(of_copy.ops_clear, after.ops_clear);
  CT_EQ_U64(of_copy.source_records, after.source_records);
  assert_true(of_copy.reclaimable_bytes < after.reclaimable_bytes / 4);
}

/* ---- Refusals -------------------------------------------------------------------------------- */

static int cancel_at_once(uint64_t records, void *payload) {
  (void)records;
  (void)payload;
  return 1;
}

static int ignore_record(const bs_record *r, void *payload) {
  (void)r;
  (void)payload;
  return 0;
}

static void test_backup_refusals(void **state) {
  ct_env *e = *state;
  bs_backup_options o = BS_BACKUP_OPTIONS_INIT;
  char out[256], buf[8] = {0};
  bs_db *mem;
  FILE *f;
  size_t entries;
  round_of(e->w, 0, 10, 1);
  path_in(e, out, sizeof out, "keep.bs");
  f = fopen(out, "w");
  assert_non_null(f);
  fputs("keep", f);
  fclose(f);
  entries = dir_entries(e->dir);
  CT_RC(BS_ESTATE, bs_backup(e->db, out, NULL, &ct_err));
  assert_non_null(strstr(ct_err.msg, "exists"));
  f = fopen(out, "r");
  assert_non_null(f);
  assert_int_equal(fread(buf, 1, 4, f), 4);
  fclose(f);
  assert_string_equal(buf, "keep");
  CT_RC(BS_EINVAL, bs_backup(e->db, e->path, NULL, &ct_err)); /* its own file, even forced */
  o.flags = BS_BACKUP_REPLACE;
  CT_RC(BS_EINVAL, bs_backup(e->db, e->path, &o, &ct_err));
  CT_RC(BS_EINVAL, bs_backup(e->db, "", NULL, &ct_err));
  CT_RC(BS_EINVAL, bs_backup(e->db, NULL, NULL, &ct_err));
  CT_RC(BS_EINVAL, bs_backup(NULL, out, NULL, &ct_err));
  o.flags = 0x80;
  CT_RC(BS_EINVAL, bs_backup(e->db, out, &o, &ct_err));
  o.flags = BS_BACKUP_REPLACE;
  o.version = 99;
  CT_RC(BS_EINVAL, bs_backup(e->db, out, &o, &ct_err));
  /* cancelled: the existing file stays, no temporary is left */
  o.version = BS_BACKUP_OPTIONS_VERSION;
  o.progress = cancel_at_once;
  CT_RC(BS_ECANCELED, bs_backup(e->db, out, &o, &ct_err));
  assert_string_equal(ct_err.msg, "opts->progress returned 1, which cancels the call");
  assert_int_equal(dir_entries(e->dir), entries);
  CT_EQ_U64(file_size(out), 4);
  /* forced: replaced by a database */
  o.progress = NULL;
  CT_OK(bs_backup(e->db, out, &o, &ct_err));
  assert_true(file_size(out) > 4);
  /* the memory backend has no file */
  CT_OK(bs_open_memory(&mem, NULL, &ct_err));
  path_in(e, out, sizeof out, "mem.bs");
  CT_RC(BS_EUNSUPPORTED, bs_backup(mem, out, NULL, &ct_err));
  CT_RC(BS_EUNSUPPORTED, bs_db_export(mem, 0, ignore_record, NULL, &ct_err));
  bs_close(mem);
  CT_EQ_U64(file_size(out), 0);
}

/* ---- Export and load ------------------------------------------------------------------------- */

typedef struct rec {
  char table[16];
  uint32_t stream;
  unsigned char *key, *value;
  size_t key_size, value_size;
} rec;

typedef struct recs {
  rec *v;
  size_t n, cap, next;
  uint32_t only; /* when loading: 0 = all, else this stream and the database-wide ones */
} recs;

static int collect(const bs_record *r, void *payload) {
  recs *l = payload;
  rec *x;
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 256;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    assert_non_null(l->v);
  }
  x = &l->v[l->n++];
  assert_true(strlen(r->table) < sizeof x->table);
  strcpy(x->table, r->table);
  x->stream = r->stream;
  x->key_size = r->key.size;
  x->value_size = r->value.size;
  x->key = malloc(r->key.size + 1);
  x->value = malloc(r->value.size + 1);
  assert_true(x->key && x->value);
  memcpy(x->key, r->key.data, r->key.size);
  if (r->value.size) memcpy(x->value, r->value.data, r->value.size);
  return 0;
}

static void recs_free(recs *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].key);
    free(l->v[i].value);
  }
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int replay(bs_record *out, void *payload) {
  recs *l = payload;
  while (l->next < l->n) {
    const rec *x = &l->v[l->next++];
    if (l->only && x->stream && x->stream != l->only) continue;
    out->table = x->table;
    out->stream = x->stream;
    out->key.data = x->key;
    out->key.size = x->key_size;
    out->value.data = x->value;
    out->value.size = x->value_size;
    return 1;
  }
  return 0;
}

static void expect_same_records(const recs *a, const recs *b, uint32_t only) {
  size_t i, j = 0;
  for (i = 0; i < a->n; i++) {
    const rec *x = &a->v[i], *y;
    if (only && x->stream && x->stream != only) continue;
    assert_true(j < b->n);
    y = &b->v[j++];
    assert_string_equal(x->table, y->table);
    CT_EQ_U64(x->stream, y->stream);
    assert_true(x->key_size == y->key_size && memcmp(x->key, y->key, x->key_size) == 0);
    assert_true(x->value_size == y->value_size &&
                (!x->value_size || memcmp(x->value, y->value, x->value_size) == 0));
  }
  CT_EQ_U64(j, b->n);
}

/* Every (bucket, checkpoint): the same checksum and count, or the same refusal (torn reads). */
static void expect_same_checksums(bs_storage *a, bs_storage *b, const bs_val *buckets, size_t n,
                                  const uint64_t *cps, size_t n_cps) {
  for (size_t k = 0; k < n_cps; k++)
    for (size_t i = 0; i < n; i++) {
      bs_checksum x, y;
      int ra = bs_get_checksums(&x, a, cps[k], &buckets[i], 1, &ct_err);
      int rb = bs_get_checksums(&y, b, cps[k], &buckets[i], 1, &ct_err);
      assert_int_equal(ra, rb);
      if (ra == BS_OK) {
        CT_EQ_U64(x.checksum, y.checksum);
        CT_EQ_U64(x.count, y.count);
      }
    }
}

static void load_and_compare(ct_env *e, const recs *all, uint32_t only, const char *name,
                             const bs_val *buckets, size_t n_buckets, const uint64_t *cps,
                             size_t n_cps) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  recs in = *all, again = {0};
  char out[256];
  bs_db *db;
  bs_storage *sa, *sb;
  uint64_t problems = 1;
  in.next = 0;
  in.only = only;
  path_in(e, out, sizeof out, name);
  CT_OK(bs_load(out, NULL, replay, &in, &ct_err));
  oo.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&db, out, &oo, &ct_err));
  CT_OK(bs_db_verify(&problems, db, on_problem, NULL, &ct_err));
  CT_EQ_U64(problems, 0);
  CT_OK(bs_db_export(db, 0, collect, &again, &ct_err));
  expect_same_records(all, &again, only);
  recs_free(&again);
  CT_OK(bs_storage_open(&sa, e->db, only ? only : 1, &ct_err));
  CT_OK(bs_storage_open(&sb, db, only ? only : 1, &ct_err));
  expect_same_checksums(sa, sb, buckets, n_buckets, cps, n_cps);
  bs_storage_close(sa);
  bs_storage_close(sb);
  bs_close(db);
}

static void test_export_load_round_trip(void **state) {
  ct_env *e = *state;
  static char long_name[BS_MAX_BUCKET_NAME + 1];
  unsigned char k1[64], k2[64];
  const char *odd = "b\xc3\xbc\xff"; /* UTF-8 u-umlaut, then a byte that is no UTF-8 */
  bs_val buckets[6];
  bs_val params[1] = {{"{\"p\":1}", 7}};
  bs_lookup lk[2];
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_head head = {{"1", 1}, {"00000003", 8}};
  bs_managed_request mr = {{"user/1", 6}, &head, 1, 0, 0, 0};
  bs_storage *st2;
  bs_writer *w2;
  uint64_t cps[16], id;
  size_t n_cps = 0;
  recs all = {0}, one = {0};
  memset(long_name, 'x', BS_MAX_BUCKET_NAME);
  buckets[0] = ct_v("a");
  buckets[1] = (bs_val){long_name, BS_MAX_BUCKET_NAME};
  buckets[2] = ct_v(odd);
  buckets[3] = ct_v("empty-data");
  buckets[4] = ct_v("b0");
  buckets[5] = ct_v("never");
  lk[0] = (bs_lookup){ct_key_int(k1, sizeof k1, 1), params, 1};
  lk[1] = (bs_lookup){ct_key_double(k2, sizeof k2, 1.5), params, 1};
  for (unsigned r = 0; r < 6; r++) {
    char data[16];
    bs_commit_result cr;
    snprintf(data, sizeof data, "{\"r\":%u}", r);
    CT_OK(ct_save_lk(e->w, r ? BS_UPDATE : BS_INSERT, "t", NULL, "row1",
                     CT_ROWS({"a", "t", "row1", data}, {long_name, "t", "", data},
                             {odd, "t\xff", "id\xfe", "\xff\x01"}, {"empty-data", "t", "e", ""}),
                     lk, r % 2 ? 1 : 2));
    CT_OK(ct_save(e->w, r ? BS_UPDATE : BS_INSERT, "t", NULL, "row2",
                  CT_ROWS({"a", "t", "row2", "1"}, {"b0", "t", "row2", "1.0"})));
    if (r == 3) CT_OK(ct_save(e->w, BS_DELETE, "t", "row2", NULL, CT_NOROWS));
    CT_OK(ct_commit(e->w, ct_lsn(r + 1), &cr));
    cps[n_cps++] = checkpoint_of(e->st);
  }
  CT_OK(bs_create_managed_write_checkpoints(&id, NULL, e->st, &mr, 1, &ct_err));
  CT_OK(bs_writer_custom_write_checkpoint(e->w, ct_v("custom-user"), 7, ct_v("ev"), &ct_err));
  CT_OK(bs_writer_flush(NULL, e->w, &ct_err));
  /* a compaction: MOVEs, CLEARs and torn spans below the horizon */
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  CT_OK(bs_compact(NULL, e->st, &co, &ct_err));
  /* a second stream, sha256, still processing (not served), with ops above no checkpoint */
  CT_OK(bs_stream_create(NULL, e->db, "second", &(bs_stream_options){1, BS_HASH_SHA256}, &ct_err));
  CT_OK(bs_storage_open(&st2, e->db, 2, &ct_err));
  CT_OK(bs_writer_open(&w2, st2, NULL, &ct_err));
  CT_OK(ct_save(w2, BS_INSERT, "t", NULL, "x", CT_ROWS({"a", "test", "t1", "{\"id\":\"t1\"}"})));
  CT_OK(bs_writer_flush(NULL, w2, &ct_err));
  bs_writer_close(w2);
  bs_storage_close(st2);
  cps[n_cps] = cps[n_cps - 1] + 1; /* not a checkpoint: any op id reads */
  n_cps++;

  CT_OK(bs_db_export(e->db, 0, collect, &all, &ct_err));
  assert_true(all.n > 20);
  load_and_compare(e, &all, 0, "all.bs", buckets, 6, cps, n_cps);
  /* one stream: its records and the database-wide ones; export of that stream agrees */
  CT_OK(bs_db_export(e->db, 1, collect, &one, &ct_err));
  expect_same_records(&all, &one, 1);
  recs_free(&one);
  load_and_compare(e, &all, 1, "one.bs", buckets, 6, cps, n_cps);
  CT_OK(bs_db_export(e->db, 2, collect, &one, &ct_err));
  assert_true(one.n < all.n);
  for (size_t i = 0; i < one.n; i++) assert_true(one.v[i].stream == 0 || one.v[i].stream == 2);
  recs_free(&one);
  recs_free(&all);
}

static int fail_next(bs_record *r, void *payload) {
  (void)r;
  (void)payload;
  return BS_EIO;
}

static int odd_next(bs_record *r, void *payload) {
  (void)r;
  (void)payload;
  return 2;
}

/* bs_load's callbacks with every value a host may return (ct_callback_values): after a few
 * records, next returns the value (1 and 0, a record and the end, are next's words: left out);
 * or progress returns it at its first call. storage.h's rule: any other value of next stops the
 * load (BS_EUSER), a non-zero progress cancels it (BS_ECANCELED), each naming the callback and
 * quoting the value; the callback is not called again; nothing is left in the directory. */
typedef struct load_stop {
  recs *in;
  size_t after; /* next: records handed out before it returns value */
  int value, calls;
} load_stop;

static int next_stops(bs_record *out, void *payload) {
  load_stop *s = payload;
  if (s->in->next < s->after) return replay(out, s->in);
  s->calls++;
  return s->value;
}

static int progress_stops(uint64_t records, void *payload) {
  load_stop *s = payload;
  (void)records;
  s->calls++;
  return s->value;
}

static void test_load_callback_returns(void **state) {
  ct_env *e = *state;
  bs_backup_options o = BS_BACKUP_OPTIONS_INIT;
  recs all = {0};
  char out[256], lock[300];
  size_t entries;
  round_of(e->w, 0, 10, 1);
  CT_OK(bs_db_export(e->db, 0, collect, &all, &ct_err));
  assert_true(all.n > 3);
  path_in(e, out, sizeof out, "cb.bs");
  snprintf(lock, sizeof lock, "%s-lock", out);
  entries = dir_entries(e->dir);
  for (size_t i = 0; i < CT_N_CALLBACK_VALUES; i++) {
    load_stop s = {&all, 3, ct_callback_values[i], 0};
    int rc;
    if (s.value != 0 && s.value != 1) {
      all.next = 0;
      memset(&ct_err, 0, sizeof ct_err);
      rc = bs_load(out, NULL, next_stops, &s, &ct_err);
      ct_expect_stopped("bs_load", rc, s.value, s.calls, "bs_load's next");
      assert_int_equal(dir_entries(e->dir), entries);
    }
    all.next = 0;
    s.calls = 0;
    o.progress = progress_stops;
    o.progress_payload = &s;
    memset(&ct_err, 0, sizeof ct_err);
    rc = bs_load(out, &o, replay, &all, &ct_err);
    ct_expect_stopped("bs_load", rc, s.value, s.calls, "opts->progress");
    if (rc == BS_OK) { /* value 0: loaded; removed for the next round */
      assert_true(s.calls > 0);
      assert_int_equal(unlink(out), 0);
      unlink(lock);
    }
    assert_int_equal(dir_entries(e->dir), entries);
  }
  recs_free(&all);
}

static void *only_malloc(void *opaque, size_t size) {
  (void)opaque;
  return malloc(size);
}

static void test_load_refusals(void **state) {
  ct_env *e = *state;
  bs_backup_options o = BS_BACKUP_OPTIONS_INIT;
  bs_allocator partial = {only_malloc, NULL, NULL, NULL}, none = {NULL, NULL, NULL, NULL};
  recs all = {0}, bad;
  char out[256], saved[16];
  size_t entries = dir_entries(e->dir), fmt = 0;
  round_of(e->w, 0, 10, 1);
  CT_OK(bs_db_export(e->db, 0, collect, &all, &ct_err));
  for (fmt = 0; fmt < all.n; fmt++)
    if (strcmp(all.v[fmt].table, "meta") == 0 && all.v[fmt].key_size == 6 &&
        memcmp(all.v[fmt].key, "format", 6) == 0)
      break;
  assert_true(fmt < all.n);
  path_in(e, out, sizeof out, "load.bs");
  /* an unknown table */
  bad = all;
  strcpy(saved, all.v[all.n - 1].table);
  strcpy(all.v[all.n - 1].table, "nosuch");
  CT_RC(BS_ECORRUPT, bs_load(out, NULL, replay, &bad, &ct_err));
  assert_non_null(strstr(ct_err.msg, "nosuch"));
  strcpy(all.v[all.n - 1].table, saved);
  /* a record in the wrong table: the result does not verify, and is not kept */
  strcpy(all.v[all.n - 1].table, strcmp(saved, "softdel") ? "softdel" : "cqueue");
  bad = all;
  CT_RC(BS_ECORRUPT, bs_load(out, NULL, replay, &bad, &ct_err));
  assert_non_null(strstr(ct_err.msg, "problem"));
  strcpy(all.v[all.n - 1].table, saved);
  /* another format version */
  all.v[fmt].value[8] ^= 0x7f;
  bad = all;
  CT_RC(BS_ECORRUPT, bs_load(out, NULL, replay, &bad, &ct_err));
  all.v[fmt].value[8] ^= 0x7f;
  /* no format record at all */
  {
    recs without = all;
    without.v = malloc(all.n * sizeof *without.v);
    assert_non_null(without.v);
    memcpy(without.v, all.v, fmt * sizeof *without.v);
    memcpy(without.v + fmt, all.v + fmt + 1, (all.n - fmt - 1) * sizeof *without.v);
    without.n = all.n - 1;
    CT_RC(BS_ECORRUPT, bs_load(out, NULL, replay, &without, &ct_err));
    free(without.v);
  }
  /* any value of next but 1 and 0 stops the load: BS_EUSER quoting it, never the value itself */
  CT_RC(BS_EUSER, bs_load(out, NULL, fail_next, NULL, &ct_err));
  assert_string_equal(ct_err.msg, "bs_load's next returned -10, which stops the call");
  CT_RC(BS_EUSER, bs_load(out, NULL, odd_next, NULL, &ct_err));
  assert_string_equal(ct_err.msg, "bs_load's next returned 2, which stops the call");
  o.flags = BS_BACKUP_REPLACE;
  bad = all;
  CT_RC(BS_EINVAL, bs_load(out, &o, replay, &bad, &ct_err));
  CT_RC(BS_EINVAL, bs_load("", NULL, replay, &bad, &ct_err));
  CT_RC(BS_EINVAL, bs_load(out, NULL, NULL, &bad, &ct_err));
  CT_RC(BS_EINVAL, bs_load("postgres://h/db", &o, fail_next, NULL, &ct_err)); /* checks first */
  /* a URL names the PostgreSQL backend (as bs_open reads it), which no records make: refused
   * before next is asked for one (fail_next would stop it with BS_EUSER), nothing created */
  o.flags = 0;
  CT_RC(BS_EUNSUPPORTED, bs_load("postgresql://127.0.0.1:1/db", &o, fail_next, NULL, &ct_err));
#ifdef BS_HAVE_PG
  assert_non_null(strstr(ct_err.msg, "restore its database with pg_restore"));
#else
  assert_non_null(strstr(ct_err.msg, "no PostgreSQL backend"));
#endif
  CT_RC(BS_EUNSUPPORTED, bs_load("postgres://h/db", NULL, fail_next, NULL, &ct_err));
  /* the allocator rule is bs_open's: all three functions or none (none: libc's) */
  o.allocator = &partial;
  bad = all;
  CT_RC(BS_EINVAL, bs_load(out, &o, replay, &bad, &ct_err));
  assert_non_null(strstr(ct_err.msg, "opts->allocator: set all three functions or none"));
  assert_int_equal(dir_entries(e->dir), entries);
  /* loaded once (with an allocator of no functions); then the file exists and is refused */
  o.allocator = &none;
  bad = all;
  CT_OK(bs_load(out, &o, replay, &bad, &ct_err));
  bad = all;
  CT_RC(BS_ESTATE, bs_load(out, NULL, replay, &bad, &ct_err));
  recs_free(&all);
}

/* ---- Allocation failures (SQLite's loop): fail the n-th allocation and every later one ------ */

/* After a failed call: a clean status, no block leaked, nothing at out, no temporary left. After
 * a successful one: out verifies. Returns 0 once the call no longer reaches n. */
static int check_faulted(ft_alloc *fa, unsigned long injected, long live, int rc, const char *out,
                         const char *dir, size_t entries, unsigned long n) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  uint64_t problems = 1;
  bs_db *copy;
  if (fa->live != live) fail_msg("n=%lu: %ld blocks leaked (%s)", n, fa->live - live, ct_err.msg);
  if (rc != BS_OK) {
    if (rc != BS_ENOMEM)
      fail_msg("n=%lu: %s (%s), expected BS_ENOMEM", n, bs_strerror(rc), ct_err.msg);
    assert_int_equal(dir_entries(dir), entries);
    return 1;
  }
  oo.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&copy, out, &oo, &ct_err));
  CT_OK(bs_db_verify(&problems, copy, NULL, NULL, &ct_err));
  bs_close(copy);
  CT_EQ_U64(problems, 0);
  assert_int_equal(remove(out), 0);
  {
    char lock[300];
    snprintf(lock, sizeof lock, "%s-lock", out);
    remove(lock); /* if the read-only open made one */
  }
  return fa->injected > injected;
}

static void test_allocation_failures(void **state) {
  ct_env *e = *state;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_backup_options lo = BS_BACKUP_OPTIONS_INIT;
  ft_alloc fa;
  recs all = {0};
  char out[256];
  bs_db *db;
  size_t entries;
  unsigned long n, backups = 0, loads = 0;
  for (unsigned k = 0; k < 3; k++) round_of(e->w, k, 30, k + 1);
  CT_OK(bs_db_export(e->db, 0, collect, &all, &ct_err));
  /* one handle per file per process (LMDB): reopen the source with the failing allocator */
  bs_writer_close(e->w);
  bs_storage_close(e->st);
  bs_close(e->db);
  e->w = NULL;
  e->st = NULL;
  e->db = NULL;
  ft_alloc_init(&fa);
  oo.allocator = &fa.a;
  CT_OK(bs_open(&db, e->path, &oo, &ct_err));
  path_in(e, out, sizeof out, "copy.bs");
  entries = dir_entries(e->dir);
  for (n = 1; n < 100000; n++) {
    long live = fa.live;
    unsigned long injected = fa.injected;
    int rc;
    ft_alloc_arm(&fa, n, 1);
    rc = bs_backup(db, out, NULL, &ct_err);
    ft_alloc_arm(&fa, 0, 0);
    if (!check_faulted(&fa, injected, live, rc, out, e->dir, entries, n)) break;
    backups++;
  }
  bs_close(db);
  assert_int_equal(fa.live, 0);
  lo.allocator = &fa.a;
  for (n = 1; n < 100000; n++) {
    unsigned long injected = fa.injected;
    int rc;
    all.next = 0;
    ft_alloc_arm(&fa, n, 1);
    rc = bs_load(out, &lo, replay, &all, &ct_err);
    ft_alloc_arm(&fa, 0, 0);
    if (!check_faulted(&fa, injected, 0, rc, out, e->dir, entries, n)) break;
    loads++;
  }
  recs_free(&all);
  printf("allocation failures: %lu points in bs_backup, %lu in bs_load\n", backups, loads);
  assert_true(backups > 5 && loads > 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_backup_while_writing, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_backup_reclaims_space, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_backup_refusals, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_export_load_round_trip, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_load_refusals, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_load_callback_returns, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_allocation_failures, setup, ct_env_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
