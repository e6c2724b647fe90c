/*
 * fuzz_records: hostile content inside a real database file. A template file (built once by a
 * small workload: buckets, ops incl. MOVE/CLEAR, lookups, source records, write checkpoints,
 * change records) is copied; one record of one sub-database is replaced through plain LMDB by
 * fuzzed bytes (its value, or its key); then the library opens the file, verifies it and runs
 * reads, a writer commit and a compaction on it. Every stored-record decoder (stream records,
 * bucket states, ops, source records, parameter entries, change records, write checkpoints)
 * meets the bytes. Any status is fine; a crash, a sanitizer report, a leak or a hang is not.
 *
 * Input: byte 0 = sub-db index (low 4 bits) and mode (0x10: replace the key, else the value),
 * byte 1 = which record of it, the rest = the new bytes.
 */
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const dbs[] = {"meta", "tables",     "buckets", "bstate",
                                  "ops",  "source",     "params",  "changes",
                                  "wcp",  "superseded", "cqueue",  "softdel"};
#define NDBS (sizeof dbs / sizeof dbs[0])

static char tdir[256], tmpl[300], work[300];
static unsigned char *tmpl_bytes;
static size_t tmpl_size;

static bs_val v(const char *s) {
  bs_val x = {s, s ? strlen(s) : 0};
  return x;
}

static void save(bs_writer *w, bs_tag tag, const char *id, const char *bucket, int user) {
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  bs_lookup lk;
  bs_scalar sc;
  unsigned char key[64];
  size_t kn = 0;
  bs_val par = v("{\"p\":1}");
  char u[8];
  snprintf(u, sizeof u, "u%d", user);
  memset(&sc, 0, sizeof sc);
  sc.type = BS_SCALAR_STRING;
  sc.s = v(u);
  bs_lookup_encode(key, sizeof key, &kn, &sc, 1, NULL);
  s.table = v("t");
  s.tag = tag;
  if (tag == BS_DELETE) {
    s.before_id = v(id);
  } else {
    s.after_id = v(id);
    row.bucket = v(bucket);
    row.object_type = v("t");
    row.object_id = v(id);
    row.data = v("{\"x\":1}");
    s.rows = &row;
    s.n_rows = 1;
    lk.key.data = key;
    lk.key.size = kn;
    lk.params = &par;
    lk.n_params = 1;
    s.lookups = &lk;
    s.n_lookups = 1;
  }
  bs_writer_save(w, &s, NULL);
}

static int build_template(void) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_managed_request mr;
  bs_head head = {{"1", 1}, {"0003", 4}};
  uint64_t id;
  int adv, fd;
  oo.flags = BS_OPEN_NOSYNC;
  oo.map_size = 1 << 20;
  if (bs_open(&db, tmpl, &oo, NULL) || bs_stream_create(NULL, db, "s", NULL, NULL) ||
      bs_storage_open(&st, db, 0, NULL) || bs_writer_open(&w, st, NULL, NULL))
    return -1;
  bs_writer_snapshot_done(w, v("0001"), NULL);
  for (int i = 0; i < 6; i++) {
    char idb[16], b[16];
    snprintf(idb, sizeof idb, "r%d", i);
    snprintf(b, sizeof b, "b%d", i % 3);
    save(w, BS_INSERT, idb, b, i % 2);
  }
  bs_writer_commit(NULL, w, v("0002"), NULL, NULL);
  save(w, BS_UPDATE, "r0", "b1", 1);
  save(w, BS_UPDATE, "r1", "b1", 0);
  save(w, BS_DELETE, "r2", NULL, 0);
  bs_writer_custom_write_checkpoint(w, v("cu"), 7, v(""), NULL);
  bs_writer_commit(NULL, w, v("0003"), NULL, NULL);
  memset(&mr, 0, sizeof mr);
  mr.user_id = v("mu");
  mr.heads = &head;
  mr.n_heads = 1;
  bs_create_managed_write_checkpoints(&id, &adv, st, &mr, 1, NULL);
  co.min_bucket_changes = 1;
  co.min_change_ratio = 0;
  co.compact_parameters = 1;
  bs_compact(NULL, st, &co, NULL);
  save(w, BS_UPDATE, "r3", "b2", 1);
  bs_writer_flush(NULL, w, NULL); /* persisted, not committed */
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  /* keep the bytes: each input starts from a fresh copy */
  if ((fd = open(tmpl, O_RDONLY)) < 0) return -1;
  tmpl_size = (size_t)lseek(fd, 0, SEEK_END);
  tmpl_bytes = malloc(tmpl_size);
  if (!tmpl_bytes || pread(fd, tmpl_bytes, tmpl_size, 0) != (ssize_t)tmpl_size) return -1;
  close(fd);
  return 0;
}

static void cleanup(void) {
  char p[320];
  unlink(tmpl);
  unlink(work);
  snprintf(p, sizeof p, "%s-lock", tmpl);
  unlink(p);
  snprintf(p, sizeof p, "%s-lock", work);
  unlink(p);
  rmdir(tdir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  (void)argc;
  (void)argv;
  snprintf(tdir, sizeof tdir, "%s/bs_fuzzrec_XXXXXX", base);
  if (!mkdtemp(tdir)) abort();
  snprintf(tmpl, sizeof tmpl, "%s/template", tdir);
  snprintf(work, sizeof work, "%s/work", tdir);
  if (build_template() != 0) abort();
  atexit(cleanup);
  return 0;
}

/* Copies the template and plants the fuzzed record. 0 when the file is ready. */
static int plant(const uint8_t *data, size_t size) {
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  MDB_dbi dbi;
  MDB_cursor *cur = NULL;
  MDB_val k, val, nk, nv;
  unsigned char kcopy[512];
  int fd, rc = -1, which = data[1];
  if ((fd = open(work, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) return -1;
  if (write(fd, tmpl_bytes, tmpl_size) != (ssize_t)tmpl_size) {
    close(fd);
    return -1;
  }
  close(fd);
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) ||
      mdb_env_open(env, work, MDB_NOSUBDIR | MDB_NOSYNC, 0644) ||
      mdb_txn_begin(env, NULL, 0, &txn) || mdb_dbi_open(txn, dbs[(data[0] & 15) % NDBS], 0, &dbi) ||
      mdb_cursor_open(txn, dbi, &cur))
    goto out;
  if (mdb_cursor_get(cur, &k, &val, MDB_FIRST)) goto out;
  for (int i = 0; i < which; i++)
    if (mdb_cursor_get(cur, &k, &val, MDB_NEXT)) mdb_cursor_get(cur, &k, &val, MDB_FIRST);
  nv.mv_data = (void *)(data + 2);
  nv.mv_size = size - 2;
  if (data[0] & 0x10) { /* a new key with the old value */
    if (size - 2 == 0 || size - 2 > 511) goto out;
    memcpy(kcopy, val.mv_data, val.mv_size < sizeof kcopy ? val.mv_size : sizeof kcopy);
    nv.mv_size = val.mv_size < sizeof kcopy ? val.mv_size : sizeof kcopy;
    nv.mv_data = kcopy;
    if (mdb_cursor_del(cur, 0)) goto out;
    nk.mv_data = (void *)(data + 2);
    nk.mv_size = size - 2;
    if (mdb_put(txn, dbi, &nk, &nv, 0)) goto out;
  } else {
    nk = k;
    if (mdb_cursor_put(cur, &nk, &nv, MDB_CURRENT) && mdb_put(txn, dbi, &k, &nv, 0)) goto out;
  }
  mdb_cursor_close(cur);
  cur = NULL;
  rc = mdb_txn_commit(txn) ? -1 : 0;
  txn = NULL;
out:
  if (cur) mdb_cursor_close(cur);
  if (txn) mdb_txn_abort(txn);
  if (env) mdb_env_close(env);
  return rc;
}

static int count_chunk(const bs_chunk *c, void *p) {
  *(size_t *)p += c->n_ops;
  return 0;
}
static int count_params(const bs_val *x, void *p) {
  (void)x;
  ++*(size_t *)p;
  return 0;
}
static int count_changes(const bs_checkpoint_changes *c, void *p) {
  *(size_t *)p += c->n_updated_buckets + c->n_updated_lookups;
  return 0;
}
static int count_streams(const bs_stream_info *i, void *p) {
  (void)i;
  ++*(size_t *)p;
  return 0;
}

static void exercise(void) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_checkpoint cp;
  bs_status status;
  bs_stat stat;
  bs_val names[4] = {{"b0", 2}, {"b1", 2}, {"b2", 2}, {"zz", 2}};
  bs_bucket_request req[4];
  bs_checksum ck[4];
  uint64_t problems, id;
  size_t n = 0;
  int more, found;
  bs_head head = {{"1", 1}, {"0009", 4}};
  oo.flags = BS_OPEN_NOSYNC;
  if (bs_open(&db, work, &oo, NULL) != BS_OK) return;
  bs_db_verify(&problems, db, NULL, NULL, NULL);
  bs_db_stat(&stat, db, NULL);
  bs_stream_list(db, count_streams, &n, NULL);
  if (bs_storage_open(&st, db, 0, NULL) == BS_OK) {
    uint64_t C = 0;
    if (bs_get_checkpoint(&cp, st, NULL) == BS_OK) C = cp.op_id;
    for (int i = 0; i < 4; i++) {
      req[i].bucket = names[i];
      req[i].after = 0;
    }
    for (uint64_t c = 0; c <= C + 1; c += (C / 3) + 1) {
      bs_get_bucket_data(&more, st, c, req, 4, NULL, count_chunk, &n, NULL);
      bs_get_checksums(ck, st, c, names, 4, NULL);
      bs_get_checkpoint_changes(st, 0, c, count_changes, &n, NULL);
    }
    {
      unsigned char key[16];
      size_t kn = 0;
      bs_scalar sc;
      bs_val lk;
      memset(&sc, 0, sizeof sc);
      sc.type = BS_SCALAR_STRING;
      sc.s = v("u1");
      bs_lookup_encode(key, sizeof key, &kn, &sc, 1, NULL);
      lk.data = key;
      lk.size = kn;
      bs_get_parameter_sets(st, C, &lk, 1, BS_PARAM_LIMIT_DEFAULT, count_params, &n, NULL);
    }
    bs_get_status(&status, st, NULL);
    bs_last_write_checkpoint(&id, &found, st, v("mu"), &head, 1, NULL);
    if (bs_writer_open(&w, st, NULL, NULL) == BS_OK) {
      save(w, BS_UPDATE, "r1", "b2", 0);
      save(w, BS_DELETE, "r4", NULL, 0);
      bs_writer_commit(NULL, w, v("0010"), NULL, NULL);
      bs_writer_close(w);
    }
    {
      bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
      co.min_bucket_changes = 1;
      co.min_change_ratio = 0;
      co.compact_parameters = 1;
      co.op_budget = 1000;
      bs_compact(NULL, st, &co, NULL);
    }
    bs_db_verify(&problems, db, NULL, NULL, NULL);
    bs_storage_close(st);
  }
  bs_close(db);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 4096) return 0;
  if (plant(data, size) != 0) return 0;
  exercise();
  return 0;
}
