/*
 * lmdb_env.c: the bottom of the LMDB backend, under every other lmdb*.c file but the codec
 * (lmdb_codec.c) and the file check (lmdb_file.c). Opening a handle on a file (the format
 * check, one environment per file in a process), transactions and map growth, and the records
 * the other files read and write through it: stream records, bucket states, bucket ids, the
 * sub-databases, and the writer locks (the one slot it holds; lmdb.c sets the handle's table).
 */
#include "lmdb_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The map is address space, not disk: the file grows only as pages are written. A large default
 * makes growth (which must wait until no transaction of this process is open) rare. */
#define LM_DEFAULT_MAP (SIZE_MAX > 0xffffffffu ? (size_t)4 << 30 : (size_t)256 << 20)
#define LM_MAXDBS      16

/* ---- Errors and transactions ----------------------------------------------------------------- */

int bs__fail_mdb(bs_error *err, int mdb_rc, const char *what) {
  int code = BS_EIO;
  if (mdb_rc == ENOMEM)
    code = BS_ENOMEM;
  else if (mdb_rc == MDB_CORRUPTED || mdb_rc == MDB_INVALID || mdb_rc == MDB_VERSION_MISMATCH ||
           mdb_rc == MDB_PAGE_NOTFOUND)
    code = BS_ECORRUPT;
  else if (mdb_rc == EAGAIN || mdb_rc == EBUSY || mdb_rc == MDB_READERS_FULL)
    code = BS_EBUSY;
  return bs__fail(err, code, "%s: %s", what, mdb_strerror(mdb_rc));
}

int bs__lmdb_fail(bs_error *err, int mdb_rc, const char *what) {
  if (mdb_rc == MDB_MAP_FULL) {
    bs__fail(err, BS_EIO, "%s: %s", what, mdb_strerror(mdb_rc));
    return BS_LMDB_MAPFULL;
  }
  return bs__fail_mdb(err, mdb_rc, what);
}

/*
 * Map growth against readers (a1). LMDB resizes the map only while no txn of this process is
 * live, so every txn holds txn_lock shared and a resize takes it exclusive. The lock is glibc's
 * default, reader-preferring rwlock, and must stay so: a thread that already holds it (a read
 * txn opened inside a read callback) takes it shared again, which a writer-preferring lock
 * deadlocks as soon as a resizer is queued. Reader preference alone, though, let readers whose
 * txns overlap continuously starve the resizer (and with it the writer) indefinitely.
 *
 * So a resize first raises e->grow_pending (under grow_mu: one resizer at a time), and a
 * *top-level* txn begin of any thread (one that holds no txn_lock yet, lm_depth == 0) holds off
 * while it is raised: the txns already in finish, the lock drains, the resizer gets it.
 * Why this cannot deadlock:
 *  - a thread that holds txn_lock never waits for the flag (lm_depth > 0): nested read txns
 *    begin as before, and every holder the resizer waits for keeps running to its end;
 *  - a thread held off holds no txn_lock, so the resizer does not wait for it;
 *  - the hold-off is bounded (LM_GROW_HOLDOFF_MS): if a holder waits, through the host, for a
 *    thread that is held off, that thread goes ahead after the bound (as before this change);
 *  - a resize asked for by a thread that holds txn_lock itself would wait for itself: refused
 *    with an error instead (the callers run it after ending their txn).
 * lm_depth counts holds across all databases: holding db A and beginning on db B skips B's
 * hold-off, which is only less fair, never a deadlock.
 */
#define LM_GROW_HOLDOFF_MS 500

static _Thread_local unsigned lm_depth;               /* txn_lock holds of this thread */
static _Thread_local const bs__lmdb_env *lm_seen_env; /* env of this thread's last write txn */
static _Thread_local size_t lm_seen_map;              /* its map size when that txn began */

static void grow_holdoff(bs__lmdb_env *e) {
  struct timespec nap = {0, 200 * 1000}; /* 0.2 ms */
  for (int i = 0; i < LM_GROW_HOLDOFF_MS * 5; i++) {
    if (!__atomic_load_n(&e->grow_pending, __ATOMIC_ACQUIRE)) return;
    nanosleep(&nap, NULL);
  }
}

/* Resizes the map with txn_lock held exclusive. failed: the map size the caller's txn ran out
 * of (0: unknown): when the map is larger by now (another thread grew it, or adopt), it is left
 * as is and the caller simply retries, so two threads hitting MAP_FULL at once double it once.
 * adopt: take the size another process set (MDB_MAP_RESIZED) instead of doubling. */
static int resize_map(bs__lmdb_env *e, size_t failed, int adopt, bs_error *err) {
  MDB_envinfo info;
  size_t cur, next;
  int mrc = 0, rc = BS_OK;
  if (lm_depth)
    return bs__fail(err, BS_ESTATE,
                    "the map must be resized while this thread has a "
                    "transaction open on a database; end it and retry");
  pthread_mutex_lock(&e->grow_mu);
  __atomic_store_n(&e->grow_pending, 1, __ATOMIC_RELEASE);
  pthread_rwlock_wrlock(&e->txn_lock);
  cur = e->map_size;
  if (adopt) {
    mrc = mdb_env_set_mapsize(e->env, 0);
    if (mrc == 0 && mdb_env_info(e->env, &info) == 0) e->map_size = info.me_mapsize;
  } else {
    if (mdb_env_info(e->env, &info) == 0 && info.me_mapsize > cur) cur = info.me_mapsize;
    if (!failed || cur <= failed) {
      next = cur * 2;
      if (next < cur)
        rc = bs__fail(err, BS_EIO, "map size cannot grow beyond %zu bytes", cur);
      else if ((mrc = mdb_env_set_mapsize(e->env, next)) == 0)
        e->map_size = next;
    }
  }
  pthread_rwlock_unlock(&e->txn_lock);
  __atomic_store_n(&e->grow_pending, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&e->grow_mu);
  if (mrc) return bs__fail_mdb(err, mrc, "mdb_env_set_mapsize");
  return rc;
}

int bs__lmdb_txn_begin(bs__lmdb_db *db, unsigned flags, MDB_txn **out, bs_error *err) {
  int mrc, rc;
  *out = NULL;
  if (!(flags & MDB_RDONLY) && (db->env_flags & MDB_RDONLY))
    return bs__fail(err, BS_ESTATE, "database is open read-only");
  for (int tries = 0;; tries++) {
    if (!lm_depth) grow_holdoff(db->e);
    pthread_rwlock_rdlock(&db->e->txn_lock);
    mrc = mdb_txn_begin(db->env, NULL, flags, out);
    if (mrc == 0) {
      lm_depth++;
      if (!(flags & MDB_RDONLY)) {
        lm_seen_env = db->e;
        lm_seen_map = db->e->map_size; /* stable: changed only under the exclusive lock */
      }
      return BS_OK;
    }
    pthread_rwlock_unlock(&db->e->txn_lock);
    *out = NULL;
    if (mrc != MDB_MAP_RESIZED || tries > 8) return bs__fail_mdb(err, mrc, "mdb_txn_begin");
    if ((rc = resize_map(db->e, 0, 1, err)) != BS_OK) return rc;
  }
}

static void txn_unlock(bs__lmdb_db *db) {
  pthread_rwlock_unlock(&db->e->txn_lock);
  if (lm_depth) lm_depth--;
}

int bs__lmdb_txn_commit(bs__lmdb_db *db, MDB_txn *txn, bs_error *err) {
  int mrc = mdb_txn_commit(txn);
  txn_unlock(db);
  return mrc ? bs__lmdb_fail(err, mrc, "mdb_txn_commit") : BS_OK;
}

void bs__lmdb_txn_abort(bs__lmdb_db *db, MDB_txn *txn) {
  if (!txn) return;
  mdb_txn_abort(txn);
  txn_unlock(db);
}

/* Called after MAP_FULL, with the failed txn ended: grows the map unless another thread has
 * grown it since this thread's last write txn began. */
int bs__lmdb_grow(bs__lmdb_db *db, bs_error *err) {
  return resize_map(db->e, lm_seen_env == db->e ? lm_seen_map : 0, 0, err);
}

int bs__lmdb_write(bs__lmdb_db *db, int (*fn)(MDB_txn *txn, void *payload, bs_error *err),
                   void *payload, bs_error *err) {
  MDB_txn *txn;
  int rc;
  for (;;) {
    if ((rc = bs__lmdb_txn_begin(db, 0, &txn, err)) != BS_OK) return rc;
    rc = fn(txn, payload, err);
    if (rc == BS_OK)
      rc = bs__lmdb_txn_commit(db, txn, err);
    else
      bs__lmdb_txn_abort(db, txn);
    if (rc != BS_LMDB_MAPFULL) return rc;
    if ((rc = bs__lmdb_grow(db, err)) != BS_OK) return rc;
  }
}

/* ---- Stream records (the codec: bs__stream_rec_encode, lmdb_internal.h) ---------------------- */

int bs__stream_rec_get(bs__lmdb_db *db, MDB_txn *txn, uint32_t id, bs__stream_rec *out,
                       bs_error *err) {
  unsigned char k[BS_STREAM_KEY_SIZE];
  MDB_val key = {sizeof k, k}, val;
  int mrc;
  memset(out, 0, sizeof *out); /* a failed get leaves *out defined, not stale */
  bs__lmdb_stream_key(k, id);
  mrc = mdb_get(txn, db->meta, &key, &val);
  if (mrc == MDB_NOTFOUND) return bs__fail(err, BS_ENOTFOUND, "stream %u does not exist", id);
  if (mrc) return bs__lmdb_fail(err, mrc, "reading the stream record");
  if (bs__stream_rec_decode(&val, out) != BS_OK)
    return bs__fail(err, BS_ECORRUPT, "stream %u: record does not decode", id);
  return BS_OK;
}

int bs__stream_rec_put(bs__lmdb_db *db, MDB_txn *txn, const bs__stream_rec *r, bs_error *err) {
  /* Encoded into a local buffer first: the strings may point into the old value of this very
   * key, which the put may overwrite in place. */
  unsigned char buf[BS_STREAM_REC_MAX], k[BS_STREAM_KEY_SIZE];
  MDB_val key = {sizeof k, k}, val = {bs__stream_rec_encode(buf, r), buf};
  int mrc;
  if (!val.mv_size)
    return bs__fail(err, BS_ETOOBIG, "stream %u: a record string over %u bytes", r->id,
                    BS_STREAM_STR_MAX);
  bs__lmdb_stream_key(k, r->id);
  mrc = mdb_put(txn, db->meta, &key, &val, 0);
  return mrc ? bs__lmdb_fail(err, mrc, "writing the stream record") : BS_OK;
}

/* ---- Bucket states ---------------------------------------------------------------------------- */

int bs__bucket_state_put(bs__lmdb_db *db, MDB_txn *txn, uint64_t bucket_id,
                         const bs__bucket_state *s, bs_error *err) {
  unsigned char buf[BS_BUCKET_STATE_FIXED + BS_MAX_BUCKET_NAME];
  unsigned char k[BS_STATE_KEY_SIZE];
  MDB_val key = {sizeof k, k}, val;
  int mrc;
  BS_ASSERT(s->name.size <= BS_MAX_BUCKET_NAME); /* a checked or a stored name */
  bs__bucket_state_encode(buf, s);
  bs__lmdb_state_key(k, bucket_id);
  val.mv_size = bs__bucket_state_size(s);
  val.mv_data = buf;
  mrc = mdb_put(txn, db->bstate, &key, &val, 0);
  return mrc ? bs__lmdb_fail(err, mrc, "writing a bucket state") : BS_OK;
}

int bs__lmdb_get(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const MDB_val *key, MDB_val *val) {
  MDB_val found = *key;
  int mrc;
  if (!cur) return mdb_get(txn, dbi, (MDB_val *)key, val);
  if (!*cur && (mrc = mdb_cursor_open(txn, dbi, cur)) != 0) return mrc;
  mrc = mdb_cursor_get(*cur, &found, val, MDB_SET_RANGE);
  if (mrc == 0 &&
      !bs__val_eq((bs_val){found.mv_data, found.mv_size}, (bs_val){key->mv_data, key->mv_size}))
    mrc = MDB_NOTFOUND;
  return mrc;
}

int bs__lmdb_bucket_id(bs__lmdb_db *db, MDB_txn *txn, MDB_cursor **cur, uint32_t stream,
                       bs_val name, uint64_t *id_out, bs_error *err) {
  unsigned char k[BS_BUCKET_KEY_MAX];
  MDB_val key, val;
  int rc, mrc;
  if ((rc = bs__lmdb_bucket_key(k, stream, name, &key, err))) return rc;
  mrc = bs__lmdb_get(txn, db->buckets, cur, &key, &val);
  if (mrc == MDB_NOTFOUND) return BS_ENOTFOUND;
  if (mrc) return bs__lmdb_fail(err, mrc, "looking up a bucket");
  return bs__lmdb_bucket_id_decode(&val, id_out, err);
}

/* ---- Opening and closing ---------------------------------------------------------------------- */

static const char *const lm_db_names[BS_LMDB_NDBS] = {"meta", "tables",     "buckets", "bstate",
                                                      "ops",  "source",     "params",  "changes",
                                                      "wcp",  "superseded", "cqueue",  "softdel"};

static MDB_dbi *dbi_slot(bs__lmdb_db *db, size_t i) {
  MDB_dbi *slots[BS_LMDB_NDBS] = {&db->meta, &db->tables,     &db->buckets, &db->bstate,
                                  &db->ops,  &db->source,     &db->params,  &db->changes,
                                  &db->wcp,  &db->superseded, &db->cqueue,  &db->softdel};
  return slots[i];
}

/* Checks the "format" record of an existing meta sub-db (open in txn): a foreign file, one of a
 * format newer than this build's, or older than the first (1), is refused; an older one is left
 * to the format layer (lmdb_format.c), which migrates it once the environment is open. */
static int check_format(MDB_txn *txn, MDB_dbi meta, const char *path, bs_error *err) {
  MDB_val key = bs__lmdb_format_key(), val;
  uint32_t version = 0;
  int mrc = mdb_get(txn, meta, &key, &val);
  if (mrc == MDB_NOTFOUND || (mrc == 0 && bs__lmdb_format_decode(&val, &version)))
    return bs__fail(err, BS_ECORRUPT, "%s: foreign LMDB file, not a bucketstore database", path);
  if (mrc) return bs__fail_mdb(err, mrc, "reading the format record");
  if (version < 1 || version > BS_FORMAT_VERSION)
    return bs__fail(err, BS_ECORRUPT, "%s: format %u is %s than this build's %u", path, version,
                    version < BS_FORMAT_VERSION ? "older" : "newer", (unsigned)BS_FORMAT_VERSION);
  return BS_OK;
}

/* Opens every sub-db in txn (dbi[i]: lm_db_names[i]; "meta" is 0); on a fresh file creates them
 * and writes the format record. */
static int open_dbs_txn(MDB_txn *txn, int rdonly, MDB_dbi *dbi, const char *path, bs_error *err) {
  MDB_dbi main_dbi;
  MDB_stat st;
  int mrc, rc, fresh = 0;
  mrc = mdb_dbi_open(txn, "meta", 0, &dbi[0]);
  if (mrc == MDB_NOTFOUND) {
    /* A new file is empty; an LMDB file with other content is someone else's. */
    mrc = mdb_dbi_open(txn, NULL, 0, &main_dbi);
    if (mrc == 0) mrc = mdb_stat(txn, main_dbi, &st);
    if (mrc) return bs__fail_mdb(err, mrc, "opening the main database");
    if (st.ms_entries > 0)
      return bs__fail(err, BS_ECORRUPT, "%s: foreign LMDB file, not a bucketstore database", path);
    if (rdonly)
      return bs__fail(err, BS_ECORRUPT, "%s: LMDB file without data: not a bucketstore database",
                      path);
    fresh = 1;
  } else if (mrc) {
    return bs__fail_mdb(err, mrc, "opening sub-database meta");
  } else if ((rc = check_format(txn, dbi[0], path, err)) != BS_OK) {
    return rc;
  }
  for (size_t i = 0; i < BS_LMDB_NDBS; i++) {
    mrc = mdb_dbi_open(txn, lm_db_names[i], rdonly ? 0 : MDB_CREATE, &dbi[i]);
    if (mrc == MDB_NOTFOUND || mrc == MDB_INCOMPATIBLE)
      return bs__fail(err, BS_ECORRUPT, "%s: sub-database %s missing or foreign", path,
                      lm_db_names[i]);
    if (mrc) return bs__fail_mdb(err, mrc, "opening a sub-database");
  }
  if (fresh) {
    unsigned char v[BS_FORMAT_VALUE_SIZE];
    MDB_val key = bs__lmdb_format_key(), val = {sizeof v, v};
    bs__lmdb_format_value(v, BS_FORMAT_VERSION);
    if ((mrc = mdb_put(txn, dbi[0], &key, &val, 0)) != 0)
      return bs__fail_mdb(err, mrc, "writing the format record");
  }
  return BS_OK;
}

/* Opens the sub-dbs of env, just opened with flags: no other thread knows env yet, so its txn
 * needs no txn_lock, and the map may be resized (MDB_MAP_RESIZED: another process grew it). */
static int open_dbs(MDB_env *env, unsigned flags, MDB_dbi *dbi, const char *path, bs_error *err) {
  MDB_txn *txn;
  int mrc, rc;
  for (int tries = 0; (mrc = mdb_txn_begin(env, NULL, flags & MDB_RDONLY, &txn)) != 0; tries++)
    if (mrc != MDB_MAP_RESIZED || tries > 8 || (mrc = mdb_env_set_mapsize(env, 0)) != 0)
      return bs__fail_mdb(err, mrc, "mdb_txn_begin");
  if ((rc = open_dbs_txn(txn, (flags & MDB_RDONLY) != 0, dbi, path, err)) != BS_OK) {
    mdb_txn_abort(txn);
    return rc;
  }
  /* Committed even when read-only: aborting would close the dbi handles opened in it. */
  mrc = mdb_txn_commit(txn);
  if (mrc == MDB_MAP_FULL) return bs__fail(err, BS_EIO, "map full while creating the file");
  return mrc ? bs__fail_mdb(err, mrc, "mdb_txn_commit") : BS_OK;
}

/* The status of a failed mdb_env_open. */
static int env_open_error(const char *path, int mrc, bs_error *err) {
  if (mrc == MDB_INVALID || mrc == MDB_VERSION_MISMATCH)
    return bs__fail(err, BS_ECORRUPT, "%s: not an LMDB/bucketstore file (%s)", path,
                    mdb_strerror(mrc));
  if (mrc == ENOENT) return bs__fail(err, BS_ENOTFOUND, "%s: no such file", path);
  return bs__fail(err, bs__fail_mdb(NULL, mrc, ""), "%s: %s", path, mdb_strerror(mrc));
}

/* Checks the format record through a lock-less read-only environment, which creates nothing.
 * Run when no lock file exists yet, so that a foreign or older/newer file never gets one (no
 * process has the file open then, so reading without the lock table is safe). */
static int preflight_format(const char *path, const char *real, bs_error *err) {
  MDB_env *env;
  MDB_txn *txn = NULL;
  MDB_dbi meta;
  int mrc, rc;
  if ((mrc = mdb_env_create(&env)) != 0) return bs__fail_mdb(err, mrc, "mdb_env_create");
  if ((mrc = mdb_env_set_maxdbs(env, LM_MAXDBS)) == 0)
    mrc = mdb_env_open(env, real, MDB_NOSUBDIR | MDB_NOTLS | MDB_RDONLY | MDB_NOLOCK, 0644);
  if (mrc) {
    mdb_env_close(env);
    return env_open_error(path, mrc, err);
  }
  if ((mrc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)) != 0) {
    rc = bs__fail_mdb(err, mrc, "beginning a read transaction");
  } else if ((mrc = mdb_dbi_open(txn, "meta", 0, &meta)) != 0) {
    rc = mrc == MDB_NOTFOUND || mrc == MDB_INCOMPATIBLE
             ? bs__fail(err, BS_ECORRUPT, "%s: foreign LMDB file, not a bucketstore database", path)
             : bs__fail_mdb(err, mrc, "opening sub-database meta");
  } else {
    rc = check_format(txn, meta, path, err);
  }
  if (txn) mdb_txn_abort(txn);
  mdb_env_close(env);
  return rc;
}

/* Checks the file (lmdb_file.c) before the environment is opened, so that a bad file is
 * refused unchanged and without a lock file beside it. *missing: no file at path (BS_ENOTFOUND
 * if read-only). */
static int check_file(const bs_allocator *a, const char *path, int rdonly, int *missing,
                      bs_error *err) {
  enum bs__lmdb_file_state state;
  int rc = bs__lmdb_file_check(a, path, &state, err);
  *missing = state == BS_LMDB_FILE_MISSING;
  if (*missing) return rdonly ? bs__fail(err, BS_ENOTFOUND, "%s: no such file", path) : BS_OK;
  if (rc != BS_OK) return rc;
  if (state == BS_LMDB_FILE_NO_DATA) /* made by mdb_env_open alone: another program's, or an
                                        old build's stopped before its first commit */
    return bs__fail(err, BS_ECORRUPT, "%s: LMDB file without data: not a bucketstore database",
                    path);
  return BS_OK;
}

/* Creates a new database at path atomically: built complete (sub-databases, format record,
 * synced unless flags has MDB_NOSYNC) under a temporary name beside it, without a lock file,
 * then linked into place. So a process stopped at any moment leaves either no file at path or a
 * whole database, never the empty file an interrupted mdb_env_open would (which check_file
 * refuses). Another process that created path first wins: its file is kept. A stray PATH.new-*
 * is what a stopped creation leaves. */
static int create_file(const bs_allocator *a, const char *path, unsigned flags, bs_error *err) {
  static _Atomic unsigned counter;
  size_t n = strlen(path) + 64;
  char *tmp = bs__malloc(a, n);
  MDB_env *env = NULL;
  MDB_dbi dbi[BS_LMDB_NDBS];
  int fd = -1, mrc, rc;
  if (!tmp) return bs__fail(err, BS_ENOMEM, "cannot name a temporary file");
  for (int i = 0; i < 100 && fd < 0; i++) {
    snprintf(tmp, n, "%s.new-%ld-%u", path, (long)getpid(), counter++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    rc = bs__fail(err, errno == ENOENT ? BS_ENOTFOUND : BS_EIO, "%s: cannot create: %s", path,
                  strerror(errno));
    bs__free(a, tmp);
    return rc;
  }
  close(fd); /* empty: LMDB takes it as a new environment */
  flags = MDB_NOSUBDIR | MDB_NOTLS | MDB_NOLOCK | (flags & MDB_NOSYNC);
  if ((mrc = mdb_env_create(&env)) != 0 || (mrc = mdb_env_set_maxdbs(env, LM_MAXDBS)) ||
      (mrc = mdb_env_open(env, tmp, flags, 0644)) != 0)
    rc = bs__fail(err, bs__fail_mdb(NULL, mrc, ""), "%s: %s", tmp, mdb_strerror(mrc));
  else
    rc = open_dbs(env, flags, dbi, tmp, err); /* commits (with a sync unless MDB_NOSYNC) */
  if (env) mdb_env_close(env);
  if (rc == BS_OK && link(tmp, path) != 0 && errno != EEXIST && rename(tmp, path) != 0)
    rc = bs__fail(err, BS_EIO, "%s: cannot create: %s", path, strerror(errno));
  unlink(tmp);
  bs__free(a, tmp);
  return rc;
}

/*
 * One environment per file. LMDB forbids two environments on one file in one process: the
 * second one's open takes the process's own lock on the lock file as if nobody else used it and
 * resets the reader table, so the first one's read snapshots are no longer protected and the
 * writer reuses their pages. So every handle on one file (whatever name opened it: the key is
 * the device and inode) shares one environment, counted by refs, in a registry whose mutex also
 * covers opening and closing an environment, so that an open never races a close of the same
 * file. The lock file is the one beside the real path (symlinks resolved), so that two
 * processes opening one file by two names also share one reader table and one write lock.
 * The environment is allocated with libc's allocator: it outlives the handle that opened it,
 * and with it that handle's allocator.
 * After fork() the child's copy of the registry still lists the parent's environments, unusable
 * there: an open in the child never shares one (forks differs), and closing the last handle of
 * one leaves it alone, since closing its lock-file descriptor would drop this process's
 * fcntl locks on that file, also those of an environment the child opened itself.
 */
static pthread_mutex_t lm_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t lm_reg_once = PTHREAD_ONCE_INIT;
static bs__lmdb_env *lm_reg; /* every environment of this process */

/* The child's copy of the mutex may be held: by a thread the child does not have, or by the
 * thread that forked, from inside a callback of an open (the host's allocator, an interposed
 * read). Taking the mutex before fork() would deadlock that thread, so the child starts with a
 * fresh one. The list it protects is only ever changed by one store (a new head, or one
 * unlink before the free), so the child's copy is a valid list of its stale environments. */
static void reg_child(void) {
  pthread_mutex_init(&lm_reg_mu, NULL);
  /* the parent's writer locks stay the parent's ("Writer locks" below) */
  for (bs__lmdb_env *e = lm_reg; e; e = e->next)
    if (e->fd >= 0) {
      close(e->fd);
      e->fd = -1;
    }
}
static void reg_init(void) {
  (void)pthread_atfork(NULL, NULL, reg_child);
}
static void reg_lock(void) {
  pthread_once(&lm_reg_once, reg_init);
  pthread_mutex_lock(&lm_reg_mu);
}
static void reg_unlock(void) {
  pthread_mutex_unlock(&lm_reg_mu);
}

/* The usable environment of file (dev, ino), NULL when this process has none. */
static bs__lmdb_env *reg_find(dev_t dev, ino_t ino) {
  unsigned forks = bs__forks();
  for (bs__lmdb_env *e = lm_reg; e; e = e->next)
    if (e->dev == dev && e->ino == ino && e->forks == forks) return e;
  return NULL;
}

/* Whether a handle opened with flags (MDB_*) and map_size (0: any) can use e: BS_OK, or
 * BS_EBUSY naming the option that differs. One environment has one set of MDB flags and one map;
 * a read-only handle may use a read-write environment (it never begins a write txn). */
static int env_compatible(bs__lmdb_env *e, const char *path, unsigned flags, size_t map_size,
                          bs_error *err) {
  static const char shared[] = "another handle has the file open in this process, and every "
                               "handle of one file shares its LMDB environment";
  size_t now;
  if (!(flags & MDB_RDONLY) && (e->flags & MDB_RDONLY))
    return bs__fail(err, BS_EBUSY,
                    "%s: read-write open, but %s, opened read-only (close it, or open read-write "
                    "first)",
                    path, shared);
  if (!(flags & MDB_RDONLY) && ((flags ^ e->flags) & MDB_NOSYNC))
    return bs__fail(err, BS_EBUSY, "%s: BS_OPEN_NOSYNC %s, but %s, opened %s it", path,
                    flags & MDB_NOSYNC ? "set" : "not set", shared,
                    e->flags & MDB_NOSYNC ? "with" : "without");
  pthread_rwlock_rdlock(&e->txn_lock); /* map_size changes under the exclusive lock */
  now = e->map_size;
  pthread_rwlock_unlock(&e->txn_lock);
  if (map_size > now)
    return bs__fail(err, BS_EBUSY, "%s: map_size %zu, but %s, which maps %zu bytes", path, map_size,
                    shared, now);
  return BS_OK;
}

static void env_free(bs__lmdb_env *e) {
  if (e->env) mdb_env_close(e->env);
  if (e->fd >= 0) close(e->fd);
  bs__free(&bs__default_allocator, e->held);
  pthread_mutex_destroy(&e->wl_mu);
  pthread_rwlock_destroy(&e->txn_lock);
  pthread_mutex_destroy(&e->grow_mu);
  bs__free(&bs__default_allocator, e);
}

/* ---- One lock file per file -------------------------------------------------------------------
 * LMDB keeps its reader table and write mutex in a lock file named after the path it is given
 * (real-lock). realpath settles symlinks and relative names, not hard links: two processes that
 * opened one file by two hard-link names (or by its names before and after a rename) would keep
 * two reader tables and two write mutexes, and each writer would reuse pages the other's
 * readers still read. So every environment holds a shared open-file-description lock on one byte
 * of the data file, chosen by a hash of its real path, and an open refuses while someone holds
 * a lock on another byte of that range: another process has the file open by another name. Each
 * open takes its byte before it looks at the others, so of two opens by two names at once at
 * least one sees the other: never both admitted. A hash collision of two names (one in 2^20)
 * goes unseen, as every case did before. The range lies beyond the writer locks' (below). */
#define LM_NAME_BASE  ((off_t)1 << 42)
#define LM_NAME_SLOTS ((uint64_t)1 << 20)

/* Whether a lock other than this descriptor's own conflicts with a write lock on [start,
 * start + len): 1, 0, or -1 (errno). */
static int name_lock_held(int fd, off_t start, off_t len) {
#ifdef F_OFD_GETLK
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
  if (len == 0) return 0; /* l_len 0 would mean "to the end of any file" */
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
  return fl.l_type != F_UNLCK;
#else
  (void)fd, (void)start, (void)len;
  return 0;
#endif
}

/* Takes fd's name lock for the real path real: BS_OK, BS_EBUSY (the file is open by another
 * name in another process) or BS_EIO. Released when fd is closed. */
static int name_lock(int fd, const char *real, const char *path, bs_error *err) {
#ifdef F_OFD_SETLK
  bs_val name = {real, strlen(real)};
  off_t mine = LM_NAME_BASE + (off_t)(bs__val_hash(name) % LM_NAME_SLOTS);
  struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = mine, .l_len = 1};
  int below, above;
  while (fcntl(fd, F_OFD_SETLK, &fl) != 0) /* nobody takes a write lock there: never EAGAIN */
    if (errno != EINTR)
      return bs__fail(err, BS_EIO, "%s: the name lock: %s", path, strerror(errno));
  below = name_lock_held(fd, LM_NAME_BASE, mine - LM_NAME_BASE);
  above =
      below ? below : name_lock_held(fd, mine + 1, LM_NAME_BASE + (off_t)LM_NAME_SLOTS - mine - 1);
  if (below < 0 || above < 0)
    return bs__fail(err, BS_EIO, "%s: the name lock: %s", path, strerror(errno));
  if (below || above)
    return bs__fail(err, BS_EBUSY,
                    "%s: another process has this file open by another name (a hard link, or a "
                    "name it had before a rename); LMDB's lock file goes by name, so every "
                    "process must open the file by one name",
                    path);
#else
  (void)fd, (void)real, (void)path, (void)err;
#endif
  return BS_OK;
}

/* Opens a new environment on real (the file's real path: its lock file is real-lock; path is the
 * name the caller gave, for messages). */
static int env_new(bs__lmdb_env **out, const char *path, const char *real, unsigned flags,
                   size_t map_size, bs_error *err) {
  bs__lmdb_env *e = bs__calloc(&bs__default_allocator, 1, sizeof *e);
  MDB_envinfo info;
  int mrc, rc;
  *out = NULL;
  if (!e) return bs__fail(err, BS_ENOMEM, "cannot allocate the environment");
  if (pthread_rwlock_init(&e->txn_lock, NULL) != 0) {
    bs__free(&bs__default_allocator, e);
    return bs__fail(err, BS_ENOMEM, "cannot initialise the transaction lock");
  }
  pthread_mutex_init(&e->grow_mu, NULL);
  pthread_mutex_init(&e->wl_mu, NULL);
  e->flags = flags;
  e->fd = open(real, (flags & MDB_RDONLY ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (e->fd < 0) {
    rc = bs__fail(err, BS_EIO, "%s: %s", path, strerror(errno));
  } else if ((rc = name_lock(e->fd, real, path, err)) != BS_OK) {
  } else if ((mrc = mdb_env_create(&e->env)) != 0) {
    rc = bs__fail_mdb(err, mrc, "mdb_env_create");
  } else if ((mrc = mdb_env_set_maxdbs(e->env, LM_MAXDBS)) != 0 ||
             (mrc = mdb_env_set_mapsize(e->env, map_size)) != 0) {
    rc = bs__fail_mdb(err, mrc, "configuring the environment");
  } else if ((mrc = mdb_env_open(e->env, real, flags, 0644)) != 0) {
    rc = env_open_error(path, mrc, err);
  } else {
    e->map_size = mdb_env_info(e->env, &info) == 0 ? info.me_mapsize : map_size;
    rc = open_dbs(e->env, flags, e->dbi, path, err);
  }
  if (rc != BS_OK) {
    env_free(e);
    return rc;
  }
  *out = e;
  return BS_OK;
}

/* The environment of the file at path for db (a new one, or the process's, shared), with
 * registry's mutex held. */
static int env_get(bs__lmdb_db *db, const char *path, unsigned flags, size_t map_size,
                   bs_error *err) {
  char real[PATH_MAX], lock[PATH_MAX + sizeof "-lock"];
  struct stat sb;
  bs__lmdb_env *e;
  int rc, missing, dead = 0;
  if ((rc = check_file(&db->base.alloc, path, (flags & MDB_RDONLY) != 0, &missing, err)) != BS_OK ||
      (missing && (rc = create_file(&db->base.alloc, path, flags, err)) != BS_OK))
    return rc;
  if (!realpath(path, real) || stat(real, &sb) != 0)
    return bs__fail(err, errno == ENOENT ? BS_ENOTFOUND : BS_EIO, "%s: %s", path, strerror(errno));
  if ((e = reg_find(sb.st_dev, sb.st_ino)) != NULL) {
    if ((rc = env_compatible(e, path, flags, map_size, err)) != BS_OK) return rc;
  } else {
    /* The format record, read before a lock file exists (none: no process has the file open),
     * so that a foreign or older/newer file never gets one. */
    snprintf(lock, sizeof lock, "%s-lock", real);
    if (access(lock, F_OK) != 0 && (rc = preflight_format(path, real, err)) != BS_OK) return rc;
    if ((rc = env_new(&e, path, real, flags, map_size ? map_size : LM_DEFAULT_MAP, err)) != BS_OK)
      return rc;
    e->dev = sb.st_dev;
    e->ino = sb.st_ino;
    e->forks = bs__forks();
    e->next = lm_reg;
    lm_reg = e;
  }
  mdb_reader_check(e->env, &dead); /* clears slots of crashed readers, at every open */
  e->refs++;
  db->e = e;
  db->env = e->env;
  db->env_flags = e->flags | (flags & MDB_RDONLY);
  for (size_t i = 0; i < BS_LMDB_NDBS; i++) *dbi_slot(db, i) = e->dbi[i];
  return BS_OK;
}

static void env_put(bs__lmdb_env *e) {
  reg_lock();
  if (--e->refs == 0 && e->forks == bs__forks()) {
    bs__lmdb_env **p = &lm_reg;
    while (*p != e) p = &(*p)->next;
    *p = e->next;
    env_free(e);
  }
  reg_unlock();
}

static int open_env(bs__lmdb_db *db, const char *path, const bs_open_options *opts, bs_error *err) {
  unsigned flags = MDB_NOSUBDIR | MDB_NOTLS;
  int rc;
  if (opts && (opts->flags & BS_OPEN_NOSYNC)) flags |= MDB_NOSYNC;
  if (opts && (opts->flags & BS_OPEN_RDONLY)) flags |= MDB_RDONLY;
  reg_lock();
  rc = env_get(db, path, flags, opts ? opts->map_size : 0, err);
  reg_unlock();
  return rc;
}

void bs__lmdb_db_close(bs_db *base) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  bs_allocator a;
  if (!db) return;
  a = db->base.alloc;
  if (db->e) env_put(db->e);
  bs__free(&a, db);
}

int bs__lmdb_db_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err) {
  bs__lmdb_db *db;
  bs_db base;
  int rc;

  *out = NULL;
  BS_ASSERT(path); /* checked by the front, and by lmdb_backup.c */
  bs__db_base_set(&base, NULL, opts);
  db = bs__calloc(&base.alloc, 1, sizeof *db);
  if (!db) return bs__fail(err, BS_ENOMEM, "cannot allocate the database handle");
  db->base = base;
  if ((rc = open_env(db, path, opts, err)) != BS_OK) {
    bs__lmdb_db_close(&db->base);
    return rc;
  }
  *out = &db->base;
  return BS_OK;
}

int bs__lmdb_subdb(const bs__lmdb_db *db, size_t i, const char **name, MDB_dbi *dbi) {
  if (i >= BS_LMDB_NDBS) return 0;
  if (name) *name = lm_db_names[i];
  if (dbi) *dbi = *dbi_slot((bs__lmdb_db *)db, i);
  return 1;
}

/* ---- Streams --------------------------------------------------------------------------------- */

/* Each call seeks afresh, so the caller may write records between. */
int bs__lmdb_stream_next(bs__lmdb_db *db, MDB_txn *txn, uint32_t *id, bs__stream_rec *rec,
                         bs_error *err) {
  unsigned char k[BS_STREAM_KEY_SIZE];
  MDB_val key = {sizeof k, k}, val;
  MDB_cursor *cur;
  int mrc;
  if (*id == UINT32_MAX) return 0;
  bs__lmdb_stream_key(k, *id + 1);
  if ((mrc = mdb_cursor_open(txn, db->meta, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
  mdb_cursor_close(cur); /* key and val stay valid: they point into the txn's pages */
  if (mrc == MDB_NOTFOUND || (mrc == 0 && bs__lmdb_stream_key_decode(&key, id) != BS_OK)) return 0;
  if (mrc) return bs__lmdb_fail(err, mrc, "scanning streams");
  if (bs__stream_rec_decode(&val, rec) != BS_OK)
    return bs__fail(err, BS_ECORRUPT, "stream %u: record does not decode", *id);
  return 1;
}

int bs__lmdb_streams_map(bs__lmdb_db *db, MDB_txn *txn, uint32_t except,
                         const uint8_t map[BS__STREAM_STATES], uint32_t *last, bs_error *err) {
  bs__stream_rec r;
  uint32_t id = 0;
  int rc;
  while ((rc = bs__lmdb_stream_next(db, txn, &id, &r, err)) == 1)
    if (id != except && r.state < BS__STREAM_STATES && map[r.state] != r.state) {
      r.state = map[r.state];
      if ((rc = bs__stream_rec_put(db, txn, &r, err)) != BS_OK) return rc;
    }
  if (last) *last = id;
  return rc;
}

/* ---- Writer locks ------------------------------------------------------------------------------
 * One writer per stream and kind (storage.h bs_writer_open). In this process the handles of a
 * file share its environment, so the locks held are a set in it. Across processes, an
 * open-file-description lock (F_OFD_SETLK) on one byte of the file per (stream, kind), at
 * LM_WL_BASE + 2 * stream + snapshot, on the environment's own descriptor: the kernel releases
 * it when the process ends, also by SIGKILL. Why these: LMDB's own locks are classic POSIX
 * locks on the lock file (a byte at offset 0, and one at each reader's pid), which belong to the
 * process and all go at the close of any descriptor of that file, so a descriptor of ours there
 * could never be closed while the environment lives; the data file carries no lock of LMDB's,
 * and an OFD lock belongs to the descriptor that took it, untouched by others' closes. The bytes
 * lie far beyond the file's end, where no lock of anyone's falls. The descriptor is the
 * environment's, not LMDB's (which is not close-on-exec: a lock on it would live on in a program
 * the host starts), and a child after fork() closes its copy (reg_child), so it never holds its
 * parent's writer locks. Without OFD locks (not Linux) only this process's writers exclude each
 * other. */
#define LM_WL_BASE ((off_t)1 << 40)

static int wl_find(const bs__lmdb_env *e, uint64_t key, size_t *at) {
  for (*at = 0; *at < e->n_held; (*at)++)
    if (e->held[*at] == key) return 1;
  return 0;
}

/* BS_OK, BS_EBUSY (another process has it) or BS_EIO. */
static int wl_file(const bs__lmdb_env *e, uint64_t key, short type, bs_error *err) {
#ifdef F_OFD_SETLK
  struct flock fl = {
      .l_type = type, .l_whence = SEEK_SET, .l_start = LM_WL_BASE + (off_t)key, .l_len = 1};
  int rc;
  while ((rc = fcntl(e->fd, F_OFD_SETLK, &fl)) != 0 && errno == EINTR) continue;
  if (rc == 0) return BS_OK;
  if (errno == EAGAIN || errno == EACCES) return bs__fail(err, BS_EBUSY, "held by a process");
  return bs__fail(err, BS_EIO, "the writer lock: fcntl: %s", strerror(errno));
#else
  (void)e, (void)key, (void)type, (void)err;
  return BS_OK;
#endif
}

int bs__lmdb_writer_lock(bs_storage *base, int snapshot, int take, bs_error *err) {
  bs__lmdb_env *e = ((bs__lmdb_storage *)base)->db->e;
  uint64_t key = 2 * (uint64_t)base->stream_id + (snapshot != 0);
  size_t at;
  int rc = BS_OK;
  pthread_mutex_lock(&e->wl_mu);
  if (!take) {
    if (wl_find(e, key, &at)) {
      (void)wl_file(e, key, F_UNLCK, NULL);
      e->held[at] = e->held[--e->n_held];
    }
  } else if (wl_find(e, key, &at)) {
    rc = bs__fail(err, BS_EBUSY, "held in this process");
  } else if (BS_GROW(&bs__default_allocator, e->held, e->cap_held, e->n_held + 1)) {
    rc = bs__fail(err, BS_ENOMEM, "the writer lock: out of memory");
  } else if ((rc = wl_file(e, key, F_WRLCK, err)) == BS_OK) {
    e->held[e->n_held++] = key;
  }
  pthread_mutex_unlock(&e->wl_mu);
  return rc;
}
