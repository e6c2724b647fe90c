/*
 * lmdb_backup.c: copies of an LMDB database file. bs_backup copies every record of one read
 * snapshot into a fresh file (so the copy has no free pages: the way to give back space the
 * file never returns by itself), bs_db_export hands the same records to a callback (for
 * `bucketstore dump`), and bs_load builds a fresh file from such records. A new file is always
 * written in a temporary directory beside its final path, synced, reopened, verified
 * (bs_db_verify, 0 problems) and only then moved to the path; nothing is left behind on
 * failure. Records are copied as they are stored (the on-disk format of lmdb_internal.h), so a file
 * loaded from an export equals the original in every record.
 */
#include "lmdb_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Export: every record, with the stream it belongs to --------------------------------------- */

typedef struct exporter {
  bs__lmdb_db *db;
  MDB_txn *txn;
  uint64_t bucket; /* one-entry cache of bucket id -> stream (ops come in bucket order) */
  uint32_t bucket_stream;
  int has_bucket;
  uint32_t *pending; /* streams whose clear is pending: only their row is exported */
  size_t n_pending, cap_pending;
} exporter;

static int collect_pending(exporter *x, bs_error *err) {
  bs__stream_rec r;
  uint32_t id = 0;
  int rc;
  while ((rc = bs__lmdb_stream_next(x->db, x->txn, &id, &r, err)) == 1)
    if (r.clear_pending) {
      if (BS_GROW(&x->db->base.alloc, x->pending, x->cap_pending, x->n_pending + 1))
        return bs__fail(err, BS_ENOMEM, "export: out of memory");
      x->pending[x->n_pending++] = id;
    }
  return rc;
}

/* A record every reader takes as deleted: one of a pending clear's stream, but its row. */
static int cleared(const exporter *x, const char *table, uint32_t stream) {
  for (size_t i = 0; i < x->n_pending; i++)
    if (x->pending[i] == stream) return strcmp(table, "meta") != 0;
  return 0;
}

static uint32_t bucket_stream(exporter *x, const MDB_val *k) {
  unsigned char id[8];
  MDB_val key = {8, id}, val;
  bs__bucket_state s;
  uint64_t bucket;
  if (bs__lmdb_key_bucket(k, &bucket)) return 0;
  if (!x->has_bucket || bucket != x->bucket) {
    x->bucket = bucket;
    x->has_bucket = 1;
    x->bucket_stream = 0;
    memcpy(id, k->mv_data, 8); /* the bstate key is the bucket id */
    if (mdb_get(x->txn, x->db->bstate, &key, &val) == 0 && bs__bucket_state_decode(&val, &s) == 0)
      x->bucket_stream = s.stream;
  }
  return x->bucket_stream;
}

/* The stream of a record, from the codec's decoders; 0 = the whole database (also a record that
 * does not decode: verify reports it). */
static uint32_t record_stream(exporter *x, const char *table, const MDB_val *k, const MDB_val *v) {
  static const char *const by_prefix[] = {"tables",  "buckets", "source", "params",
                                          "changes", "cqueue",  "softdel"};
  bs__bucket_state s;
  bs__wcp_key wk;
  uint32_t id;
  if (strcmp(table, "meta") == 0) return bs__lmdb_stream_key_decode(k, &id) ? 0 : id;
  if (strcmp(table, "wcp") == 0) return bs__lmdb_wcp_key_decode(k, &wk) ? 0 : wk.stream;
  if (strcmp(table, "bstate") == 0) return bs__bucket_state_decode(v, &s) ? 0 : s.stream;
  if (strcmp(table, "ops") == 0 || strcmp(table, "superseded") == 0) return bucket_stream(x, k);
  for (size_t i = 0; i < sizeof by_prefix / sizeof by_prefix[0]; i++)
    if (strcmp(table, by_prefix[i]) == 0) return bs__lmdb_key_stream(k, &id) ? 0 : id;
  return 0;
}

static int export_txn(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream,
                      int (*fn)(const bs_record *, void *), void *payload, bs_error *err) {
  exporter x = {db, txn, 0, 0, 0, NULL, 0, 0};
  const char *name;
  MDB_dbi dbi;
  int rc = collect_pending(&x, err);
  for (size_t i = 0; rc == BS_OK && bs__lmdb_subdb(db, i, &name, &dbi); i++) {
    MDB_cursor *cur;
    MDB_val k, v;
    int mrc = mdb_cursor_open(txn, dbi, &cur);
    if (mrc) {
      rc = bs__fail_mdb(err, mrc, "export: mdb_cursor_open");
      break;
    }
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && rc == BS_OK;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      bs_record r;
      r.table = name;
      r.stream = record_stream(&x, name, &k, &v);
      r.key.data = k.mv_data;
      r.key.size = k.mv_size;
      r.value.data = v.mv_data;
      r.value.size = v.mv_size;
      if ((!stream || !r.stream || r.stream == stream) && !cleared(&x, name, r.stream))
        rc = fn(&r, payload);
    }
    mdb_cursor_close(cur);
    if (rc == BS_OK && mrc != MDB_NOTFOUND) rc = bs__fail_mdb(err, mrc, "export: reading");
  }
  bs__free(&db->base.alloc, x.pending);
  return rc;
}

int bs__lmdb_export(bs_db *base, uint32_t stream, int (*fn)(const bs_record *, void *),
                    void *payload, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  MDB_txn *txn;
  int rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err);
  if (rc) return rc;
  rc = export_txn(db, txn, stream, fn, payload, err);
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

/* ---- A new file, filled in batches, verified, then moved into place ---------------------------- */

#define BATCH_RECORDS 20000u
#define BATCH_BYTES   (16u * 1024u * 1024u)

typedef struct entry {
  MDB_dbi dbi;
  int format;                       /* meta "format" */
  size_t key, key_size, value_size; /* the key at offset key of the arena, the value after it */
} entry;

typedef struct target {
  const bs_allocator *a;
  const bs_backup_options *o;
  char *dir, *file, *lock; /* temporary directory, the database file in it and its lock file */
  bs_db *handle;
  entry *e;
  size_t n, cap;
  unsigned char *arena;
  size_t used, arena_cap;
  uint64_t total;
  int saw_format;
  uint32_t older; /* the records' format when older than this build's (load): migrated at the end */
} target;

static char *str_cat(const bs_allocator *a, const char *x, const char *y) {
  size_t nx = strlen(x), ny = strlen(y);
  char *s = bs__malloc(a, nx + ny + 1);
  if (s) {
    memcpy(s, x, nx);
    memcpy(s + nx, y, ny + 1);
  }
  return s;
}

/* Removes whatever is left of the temporary directory (it allocates nothing: it also runs
 * after an allocation failure). */
static void target_free(target *t) {
  bs__lmdb_db_close(t->handle);
  t->handle = NULL;
  if (t->file) unlink(t->file);
  if (t->lock) unlink(t->lock);
  if (t->dir) rmdir(t->dir);
  bs__free(t->a, t->file);
  bs__free(t->a, t->lock);
  bs__free(t->a, t->dir);
  bs__free(t->a, t->e);
  bs__free(t->a, t->arena);
}

/* The directory of path ("." when it has none), with a trailing '/'. */
static char *dir_of(const bs_allocator *a, const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) + 1 : 0;
  char *d = bs__malloc(a, n + 3);
  if (!d) return NULL;
  if (n)
    memcpy(d, path, n);
  else
    memcpy(d, "./", n = 2);
  d[n] = '\0';
  return d;
}

/* Refuses a path that exists (unless replace) and prepares the temporary file beside it. */
static int target_open(target *t, const char *path, size_t map_size, int replace,
                       const bs_allocator *a, const bs_backup_options *o, bs_error *err) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  char *d;
  memset(t, 0, sizeof *t);
  t->a = a;
  t->o = o;
  if (!replace && access(path, F_OK) == 0)
    return bs__fail(err, BS_ESTATE, "path: %s exists (not replaced)", path);
  if (!(d = dir_of(a, path))) return bs__fail(err, BS_ENOMEM, "naming the temporary directory");
  t->dir = str_cat(a, d, ".bucketstore-tmp-XXXXXX");
  bs__free(a, d);
  if (!t->dir) return bs__fail(err, BS_ENOMEM, "naming the temporary directory");
  if (!mkdtemp(t->dir)) {
    int e = errno;
    bs__free(a, t->dir);
    t->dir = NULL;
    return bs__fail(err, BS_EIO, "path: cannot create a temporary directory beside %s: %s", path,
                    strerror(e));
  }
  if (!(t->file = str_cat(a, t->dir, "/copy.bsdb")) || !(t->lock = str_cat(a, t->file, "-lock")))
    return bs__fail(err, BS_ENOMEM, "naming the temporary file");
  oo.flags = BS_OPEN_NOSYNC; /* synced once at the end */
  oo.map_size = map_size;
  oo.checksum_cache_entries = (size_t)-1;
  oo.allocator = a;
  return bs__lmdb_db_open(&t->handle, t->file, &oo, err);
}

static int put_batch(MDB_txn *txn, void *payload, bs_error *err) {
  target *t = payload;
  bs__lmdb_db *db = (bs__lmdb_db *)t->handle;
  for (size_t i = 0; i < t->n; i++) {
    const entry *e = &t->e[i];
    MDB_val k = {e->key_size, t->arena + e->key}, cur;
    MDB_val v = {e->value_size, t->arena + e->key + e->key_size};
    int mrc;
    if (e->format) {
      /* the new file has its own format record: the records must be of the same format, or of
       * an older one, which the file then takes until target_finish migrates it */
      uint32_t version = 0;
      mrc = mdb_get(txn, db->meta, &k, &cur);
      if (mrc) return bs__lmdb_fail(err, mrc, "reading the format record");
      if (cur.mv_size == v.mv_size && memcmp(cur.mv_data, v.mv_data, v.mv_size) == 0) continue;
      if (bs__lmdb_format_decode(&v, &version) || version == 0 || version > BS_FORMAT_VERSION)
        return bs__fail(err, BS_ECORRUPT,
                        "the records are of another format than this build's (format %u)",
                        (unsigned)BS_FORMAT_VERSION);
      t->older = version;
    }
    /* MDB_APPEND fills pages completely (records come in key order); out of order, a plain put */
    mrc = mdb_put(txn, e->dbi, &k, &v, MDB_APPEND);
    if (mrc == MDB_KEYEXIST) mrc = mdb_put(txn, e->dbi, &k, &v, 0);
    if (mrc) return bs__lmdb_fail(err, mrc, "writing a record");
  }
  return BS_OK;
}

/* bs_backup's and bs_load's progress callback, after records written so far. */
static int progress(const bs_backup_options *o, uint64_t records, bs_error *err) {
  int value = o->progress ? o->progress(records, o->progress_payload) : 0;
  return value ? bs__callback_fail(err, BS_ECANCELED, "opts->progress", value) : BS_OK;
}

static int target_flush(target *t, bs_error *err) {
  int rc;
  if (!t->n) return BS_OK;
  if ((rc = bs__lmdb_write((bs__lmdb_db *)t->handle, put_batch, t, err))) return rc;
  t->total += t->n;
  t->n = t->used = 0;
  return progress(t->o, t->total, err);
}

static int target_put(target *t, const bs_record *r, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)t->handle;
  const char *name;
  MDB_dbi dbi;
  MDB_val fk = bs__lmdb_format_key();
  size_t i, need = r->key.size + r->value.size;
  int format;
  entry *e;
  for (i = 0; r->table && bs__lmdb_subdb(db, i, &name, &dbi); i++)
    if (strcmp(r->table, name) == 0) break;
  if (!r->table || !bs__lmdb_subdb(db, i, NULL, NULL))
    return bs__fail(err, BS_ECORRUPT, "record %llu: unknown table %s",
                    (unsigned long long)(t->total + t->n + 1), r->table ? r->table : "(NULL)");
  if (r->key.size == 0 || r->key.size > 511 || !r->key.data || (r->value.size && !r->value.data))
    return bs__fail(err, BS_ECORRUPT, "record %llu (%s): bad key or value",
                    (unsigned long long)(t->total + t->n + 1), name);
  format = strcmp(name, "meta") == 0 && bs__val_eq(r->key, (bs_val){fk.mv_data, fk.mv_size});
  t->saw_format |= format;
  if ((t->n >= BATCH_RECORDS || t->used + need > BATCH_BYTES) && t->n) {
    int rc = target_flush(t, err);
    if (rc) return rc;
  }
  if (BS_GROW(t->a, t->e, t->cap, t->n + 1)) return bs__fail(err, BS_ENOMEM, "record batch");
  if (BS_GROW(t->a, t->arena, t->arena_cap, t->used + need))
    return bs__fail(err, BS_ENOMEM, "record batch");
  e = &t->e[t->n++];
  e->dbi = dbi;
  e->format = format;
  e->key = t->used;
  e->key_size = r->key.size;
  e->value_size = r->value.size;
  memcpy(t->arena + t->used, r->key.data, r->key.size);
  if (r->value.size) memcpy(t->arena + t->used + r->key.size, r->value.data, r->value.size);
  t->used += need;
  return BS_OK;
}

#define FIRST_PROBLEM 200 /* bytes of the first problem a failed copy quotes */
static void note_problem(const char *problem, void *payload) {
  char *first = payload;
  if (!first[0]) snprintf(first, FIRST_PROBLEM, "%s", problem);
}

/* Opens the finished copy read-only and verifies it: 0 problems or BS_ECORRUPT. */
static int verify_copy(target *t, bs_error *err) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  char first[FIRST_PROBLEM] = "";
  uint64_t problems = 0;
  bs_db *copy;
  int rc;
  oo.flags = BS_OPEN_RDONLY;
  oo.checksum_cache_entries = (size_t)-1;
  oo.allocator = t->a;
  if ((rc = bs__lmdb_db_open(&copy, t->file, &oo, err))) return rc;
  rc = bs__lmdb_verify(&problems, copy, note_problem, first, err);
  bs__lmdb_db_close(copy);
  if (rc == BS_OK && problems)
    rc = bs__fail(err, BS_ECORRUPT, "the copy has %llu problem%s (first: %s); nothing was written",
                  (unsigned long long)problems, problems == 1 ? "" : "s", first);
  return rc;
}

/* Records exported by a build of an older format make a file of that format: the format layer
 * upgrades it as it would the old build's own file. */
static int migrate_copy(target *t, bs_error *err) {
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *copy;
  int rc;
  oo.checksum_cache_entries = (size_t)-1;
  oo.allocator = t->a;
  if ((rc = bs__lmdb_db_open(&copy, t->file, &oo, err))) return rc;
  rc = bs__lmdb_format_open((bs__lmdb_db *)copy, t->file, err);
  bs__lmdb_db_close(copy);
  return rc;
}

static void sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

/* Writes the last batch, syncs, verifies, and moves the file to path: rename when replacing,
 * else link (which refuses a path that appeared meanwhile) and unlink. */
static int target_finish(target *t, const char *path, int replace, bs_error *err) {
  int rc, mrc;
  if ((rc = target_flush(t, err))) return rc;
  if ((mrc = mdb_env_sync(((bs__lmdb_db *)t->handle)->env, 1)) != 0)
    return bs__fail_mdb(err, mrc, "syncing the copy");
  bs__lmdb_db_close(t->handle);
  t->handle = NULL;
  if (t->older && (rc = migrate_copy(t, err))) return rc;
  if ((rc = verify_copy(t, err))) return rc;
  if (replace) {
    if (rename(t->file, path) != 0)
      return bs__fail(err, BS_EIO, "path: cannot rename the copy to %s: %s", path, strerror(errno));
  } else if (link(t->file, path) != 0) {
    if (errno == EEXIST) return bs__fail(err, BS_ESTATE, "path: %s exists (not replaced)", path);
    return bs__fail(err, BS_EIO, "path: cannot create %s: %s", path, strerror(errno));
  }
  {
    char *d = dir_of(t->a, path); /* the new name is durable once its directory is */
    if (d) sync_dir(d);
    bs__free(t->a, d);
  }
  return BS_OK;
}

/* ---- bs_backup ------------------------------------------------------------------------------- */

static int put_record(const bs_record *r, void *payload) {
  void **p = payload;
  return target_put(p[0], r, p[1]);
}

/* 1 when path names the file db has open. */
static int same_file(bs__lmdb_db *db, const char *path) {
  struct stat a, b;
  int fd;
  return mdb_env_get_fd(db->env, &fd) == 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int bs__lmdb_backup(bs_db *base, const char *path, const bs_backup_options *o, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  MDB_envinfo info;
  MDB_stat ms;
  MDB_txn *txn = NULL;
  target t;
  void *args[2];
  size_t map;
  int rc, replace = (o->flags & BS_BACKUP_REPLACE) != 0;
  if (same_file(db, path))
    return bs__fail(err, BS_EINVAL, "path: %s is the database's own file", path);
  if (mdb_env_info(db->env, &info) != 0 || mdb_env_stat(db->env, &ms) != 0)
    return bs__fail(err, BS_EIO, "cannot read the environment's size");
  /* The copy cannot grow its map while this thread holds the source snapshot (lmdb_env.c, a1):
   * room for every used page twice over (the copy is never larger than the pages in use). */
  map = (info.me_last_pgno + 1) * (size_t)ms.ms_psize * 2 + (1u << 20);
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err))) return rc;
  if ((rc = target_open(&t, path, map, replace, &db->base.alloc, o, err)) == BS_OK) {
    args[0] = &t;
    args[1] = err;
    if ((rc = progress(o, 0, err)) == BS_OK) /* the snapshot is taken */
      rc = export_txn(db, txn, 0, put_record, args, err);
  }
  bs__lmdb_txn_abort(db, txn); /* the last batch is written by target_finish, after the snapshot */
  if (rc == BS_OK) rc = target_finish(&t, path, replace, err);
  target_free(&t);
  return rc;
}

/* ---- bs_load --------------------------------------------------------------------------------- */

int bs__lmdb_load(const char *path, const bs_backup_options *o,
                  int (*next)(bs_record *rec, void *payload), void *payload, bs_error *err) {
  bs_record r;
  target t;
  int rc;
  if ((rc = target_open(&t, path, 0, 0, o->allocator, o, err)) == BS_OK) {
    int value;
    while ((value = next(&r, payload)) == 1)
      if ((rc = target_put(&t, &r, err)) != BS_OK) break;
    if (rc == BS_OK && value != 0) rc = value; /* 1: a record, 0: the end, else the host's stop */
    if (rc == 0 && !t.saw_format)
      rc = bs__fail(err, BS_ECORRUPT, "the records have no format record (meta \"format\")");
    if (rc == 0) rc = target_finish(&t, path, 0, err);
  }
  target_free(&t);
  return rc;
}
