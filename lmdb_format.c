/*
 * lmdb_format.c: the versions of the LMDB file format and the migrations between them, above
 * lmdb_env.c (which opens the file and refuses a foreign one, or one newer than this build's)
 * and below lmdb.c, whose open runs bs__lmdb_format_open before a handle is handed out.
 *
 * A migration from format N to N + 1 rewrites every record of one sub-database, key kept, value
 * converted, in transactions of at most LM_MIGRATE_RECORDS records or LM_MIGRATE_BYTES bytes
 * (memory stays bounded on a file of any size). Its first transaction sets the format record to
 * N + 1 and writes the meta record "format.step" (N, and the key of the last record converted),
 * which each later one moves on and the last one deletes. So a process stopped at any moment
 * leaves either the file as it was (the first transaction never committed) or one that says it
 * is N + 1 with a step record: an older build refuses it as newer, a read-only open of this build
 * says the migration stopped halfway, and a read-write open finishes it from where it stopped.
 */
#include "lmdb_internal.h"

/* Measured (bench/README.md "Format migration"): fewer records a transaction pay a durable commit
 * each (2,000: 1.4x to 2.6x the time), more buy no time and cost memory (about 1.5x a transaction's
 * bytes). */
#define LM_MIGRATE_RECORDS 10000u
#define LM_MIGRATE_BYTES   ((size_t)16 << 20)
#define LM_KEY_MAX         511 /* LMDB's key limit (MDB_MAXKEYSIZE) */

typedef struct migration {
  bs__lmdb_db *db;
  const char *path;
  unsigned char *buf; /* converted values, then the last key */
  size_t cap;
  uint64_t records; /* puts so far (the seam's record count) */
  int done;
  /* the table whose name a step looked up last: stream, id, name (size 0: none) */
  uint32_t t_stream, t_id;
  int t_known;
  bs_val t_name;
  unsigned char t_buf[BS_MAX_TABLE_NAME];
} migration;

static bs__lmdb_migrate_seam seam;

void bs__lmdb_set_migrate_seam(const bs__lmdb_migrate_seam *s) {
  static const bs__lmdb_migrate_seam none;
  seam = s ? *s : none;
}

static unsigned char *grow_buf(migration *m, size_t n) {
  return BS_GROW(&m->db->base.alloc, m->buf, m->cap, n) == BS_OK ? m->buf : NULL;
}

/* A step rewrites each record (k, v) of one sub-database (dbi of the handle; name, for messages)
 * written in format `from` into *out (m's buffer, grown with grow_buf), in format from + 1;
 * BS_ECORRUPT when v is not a record of format from, BS_ENOMEM, or an LMDB error (err written). */
typedef struct fmt_step {
  MDB_dbi (*dbi)(const bs__lmdb_db *db);
  const char *name;
  int (*convert)(migration *m, MDB_txn *txn, const MDB_val *k, const MDB_val *v, MDB_val *out,
                 bs_error *err);
  /* a step that regroups records, new keys (dbi and convert NULL): one batch after key (mv_size
   * 0: the first), key then the last key it wrote; *done when nothing was left */
  int (*regroup)(migration *m, MDB_txn *txn, MDB_val *key, int *done, bs_error *err);
} fmt_step;

static MDB_dbi source_dbi(const bs__lmdb_db *db) {
  return db->source;
}

/* Format 2: source records in varints, without the object type and id a membership repeats. */
static int source_to2(migration *m, MDB_txn *txn, const MDB_val *k, const MDB_val *v, MDB_val *out,
                      bs_error *err) {
  unsigned char *buf = grow_buf(m, bs__lmdb_srec1_bound(v));
  (void)txn, (void)err;
  if (!buf) return BS_ENOMEM;
  out->mv_data = buf;
  return bs__lmdb_srec1_convert(k, v, buf, &out->mv_size);
}
static const fmt_step step_source_to2 = {source_dbi, "source", source_to2, NULL};

int bs__lmdb_table_name(const bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, uint32_t id,
                        bs_val *name, bs_error *err) {
  unsigned char kb[4];
  MDB_val key = {4, kb}, val;
  MDB_cursor *cur;
  int mrc;
  bs__put_u32be(kb, stream);
  if ((mrc = mdb_cursor_open(txn, db->tables, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    uint32_t s, t;
    if (bs__lmdb_table_entry_decode(&key, &val, &s, name, &t) || s != stream) {
      mrc = MDB_NOTFOUND; /* past the stream's entries (or not one: verify reports it) */
      break;
    }
    if (t == id) break;
  }
  mdb_cursor_close(cur);
  if (mrc == MDB_NOTFOUND) return BS_ENOTFOUND;
  return mrc ? bs__lmdb_fail(err, mrc, "reading the tables") : BS_OK;
}

/* m->t_name: the name of table id of stream (size 0 when the stream has no such table). The
 * records come in key order, so one walk a table. */
static int table_name(migration *m, MDB_txn *txn, uint32_t stream, uint32_t id, bs_error *err) {
  bs_val name;
  int rc;
  if (m->t_known && m->t_stream == stream && m->t_id == id) return BS_OK;
  rc = bs__lmdb_table_name(m->db, txn, stream, id, &name, err);
  if (rc != BS_OK && rc != BS_ENOTFOUND) return rc;
  m->t_name.data = m->t_buf;
  m->t_name.size = rc == BS_OK ? name.size : 0;
  if (m->t_name.size) memcpy(m->t_buf, name.data, name.size);
  m->t_known = 1;
  m->t_stream = stream;
  m->t_id = id;
  return BS_OK;
}

/* Format 3: the counts in the head byte, a first membership's object type that is the table's
 * name not written (the table's name looked up by its id in the key). */
static int source_to3(migration *m, MDB_txn *txn, const MDB_val *k, const MDB_val *v, MDB_val *out,
                      bs_error *err) {
  uint32_t stream, id;
  bs_val rid;
  unsigned char *buf;
  int rc;
  if (bs__lmdb_source_key_decode(k, &stream, &id, &rid)) return BS_ECORRUPT;
  if ((rc = table_name(m, txn, stream, id, err)) != BS_OK) return rc;
  if (!(buf = grow_buf(m, bs__lmdb_srec2_bound(v)))) return BS_ENOMEM;
  out->mv_data = buf;
  return bs__lmdb_srec2_convert(k, v, m->t_name, buf, &out->mv_size);
}
static const fmt_step step_source_to3 = {source_dbi, "source", source_to3, NULL};

/* Format 4: a stream record's flag 8, a clear pending (lmdb_write.c). No record of format 3 has
 * it: the step only stamps the version, so that a format-3 build, which would read the records
 * such a clear leaves as live, refuses the file. */
static const fmt_step step_stamp4 = {NULL, "meta", NULL, NULL};

/* Format 5: a bucket's ops in chunks (lmdb_ops.c), the ops of format 4, one a record, regrouped
 * in key order; a batch ends between chunks. */
static int ops_to5(migration *m, MDB_txn *txn, MDB_val *key, int *done, bs_error *err) {
  unsigned char *kb = grow_buf(m, BS_OP_KEY_SIZE);
  int rc;
  if (!kb) return BS_ENOMEM;
  if (key->mv_size && key->mv_size != BS_OP_KEY_SIZE) return BS_ECORRUPT;
  if (key->mv_size) memmove(kb, key->mv_data, BS_OP_KEY_SIZE);
  rc = bs__lmdb_ops_rechunk(
      m->db, txn, kb, key->mv_size != 0, seam.records ? seam.records : LM_MIGRATE_RECORDS,
      seam.bytes ? seam.bytes : LM_MIGRATE_BYTES, seam.record, &m->records, done, err);
  key->mv_data = kb;
  key->mv_size = BS_OP_KEY_SIZE;
  return rc;
}
static const fmt_step step_ops_to5 = {NULL, "ops", NULL, ops_to5};

/* Format 6: the chunks' op values in the compact encoding (opchunk.c), each chunk's ops recoded
 * and regrouped as the writer fills chunks, in key order; a batch ends between chunks. The
 * format-5 chunks above the step record's key are read as they are, the recoded ones below it
 * are flagged in their header (BS_CHUNK_COMPACT). */
static int ops_to6(migration *m, MDB_txn *txn, MDB_val *key, int *done, bs_error *err) {
  unsigned char *kb = grow_buf(m, BS_OP_KEY_SIZE);
  int rc;
  if (!kb) return BS_ENOMEM;
  if (key->mv_size && key->mv_size != BS_OP_KEY_SIZE) return BS_ECORRUPT;
  if (key->mv_size) memmove(kb, key->mv_data, BS_OP_KEY_SIZE);
  rc = bs__lmdb_ops_recode(
      m->db, txn, kb, key->mv_size != 0, seam.records ? seam.records : LM_MIGRATE_RECORDS,
      seam.bytes ? seam.bytes : LM_MIGRATE_BYTES, seam.record, &m->records, done, err);
  key->mv_data = kb;
  key->mv_size = BS_OP_KEY_SIZE;
  return rc;
}
static const fmt_step step_ops_to6 = {NULL, "ops", NULL, ops_to6};

/* steps[N]: from format N to N + 1 (format 1 is the first). */
static const fmt_step *const steps[BS_FORMAT_VERSION] = {
    NULL, &step_source_to2, &step_source_to3, &step_stamp4, &step_ops_to5, &step_ops_to6};

/* The file's format (*version) and whether a step record says a migration is under way (*from,
 * *key: the last key converted, borrowed from txn, mv_size 0 before the first). */
static int format_state(bs__lmdb_db *db, MDB_txn *txn, uint32_t *version, int *stepping,
                        uint32_t *from, MDB_val *key, bs_error *err) {
  MDB_val k = bs__lmdb_format_key(), v;
  int mrc = mdb_get(txn, db->meta, &k, &v);
  if (mrc) return bs__lmdb_fail(err, mrc, "reading the format record");
  if (bs__lmdb_format_decode(&v, version))
    return bs__fail(err, BS_ECORRUPT, "the format record does not decode");
  k = bs__lmdb_format_step_key();
  mrc = mdb_get(txn, db->meta, &k, &v);
  *stepping = mrc == 0;
  if (mrc == MDB_NOTFOUND) return BS_OK;
  if (mrc) return bs__lmdb_fail(err, mrc, "reading the migration record");
  if (bs__lmdb_format_step_decode(&v, from, key) || *from + 1 != *version || *from == 0 ||
      !steps[*from])
    return bs__fail(err, BS_ECORRUPT, "the migration record does not decode");
  return BS_OK;
}

static int put_meta(bs__lmdb_db *db, MDB_txn *txn, MDB_val k, MDB_val v, bs_error *err) {
  int mrc = mdb_put(txn, db->meta, &k, &v, 0);
  return mrc ? bs__lmdb_fail(err, mrc, "writing the format record") : BS_OK;
}

/* Converts the records after key (mv_size 0: from the first) of step from's sub-database, up to
 * the batch's bounds; then records where it stopped, or, at the end, deletes the step record. */
static int step_batch(migration *m, MDB_txn *txn, uint32_t from, MDB_val key, bs_error *err) {
  const fmt_step *s = steps[from];
  MDB_dbi dbi;
  MDB_cursor *cur;
  unsigned char kb[LM_KEY_MAX];
  MDB_val k = key, v, out, sk = bs__lmdb_format_step_key();
  size_t n = 0, bytes = 0;
  size_t max_n = seam.records ? seam.records : LM_MIGRATE_RECORDS;
  size_t max_bytes = seam.bytes ? seam.bytes : LM_MIGRATE_BYTES;
  int mrc, rc = BS_OK, done;
  if (s->regroup) {
    if ((rc = s->regroup(m, txn, &key, &done, err)) != BS_OK) {
      if (rc == BS_ECORRUPT)
        rc = bs__fail(err, BS_ECORRUPT, "%s: migrating to format %u: a %s record does not decode",
                      m->path, from + 1, s->name);
      else if (rc == BS_ENOMEM)
        rc = bs__fail(err, rc, "%s: migrating to format %u: out of memory", m->path, from + 1);
      return rc;
    }
    if (done) {
      mrc = mdb_del(txn, m->db->meta, &sk, NULL);
      return mrc && mrc != MDB_NOTFOUND ? bs__lmdb_fail(err, mrc, "deleting the migration record")
                                        : BS_OK;
    }
    memcpy(kb, key.mv_data, key.mv_size); /* m->buf is about to grow */
    key.mv_data = kb;
    goto record;
  }
  if (!s->dbi) return BS_OK; /* a version stamp: its first transaction is the whole step */
  dbi = s->dbi(m->db);
  if ((mrc = mdb_cursor_open(txn, dbi, &cur)) != 0)
    return bs__lmdb_fail(err, mrc, "mdb_cursor_open");
  if (!key.mv_size) {
    mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
  } else {
    mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    if (mrc == 0 && k.mv_size == key.mv_size && memcmp(k.mv_data, key.mv_data, k.mv_size) == 0)
      mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  for (; mrc == 0 && n < max_n && bytes < max_bytes; n++) {
    if ((rc = s->convert(m, txn, &k, &v, &out, err)) != BS_OK) {
      if (rc == BS_ECORRUPT)
        rc = bs__fail(err, BS_ECORRUPT, "%s: migrating to format %u: a %s record does not decode",
                      m->path, from + 1, s->name);
      else if (rc == BS_ENOMEM)
        rc = bs__fail(err, rc, "%s: migrating to format %u: out of memory", m->path, from + 1);
      break;
    }
    /* a put whose value changes size moves the node: its key must not point into the page */
    memcpy(kb, k.mv_data, k.mv_size);
    key.mv_size = k.mv_size;
    key.mv_data = kb;
    bytes += k.mv_size + out.mv_size;
    if (seam.record) seam.record(m->records);
    m->records++;
    if ((mrc = mdb_cursor_put(cur, &key, &out, MDB_CURRENT)) != 0) break;
    mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(cur);
  if (rc != BS_OK) return rc;
  if (mrc == MDB_NOTFOUND) {
    mrc = mdb_del(txn, m->db->meta, &sk, NULL); /* none: the step took one transaction */
    return mrc && mrc != MDB_NOTFOUND ? bs__lmdb_fail(err, mrc, "deleting the migration record")
                                      : BS_OK;
  }
  if (mrc) return bs__lmdb_fail(err, mrc, "migrating the records");
record:
  if (!(m->buf = grow_buf(m, BS_FORMAT_STEP_FIXED + key.mv_size)))
    return bs__fail(err, BS_ENOMEM, "%s: migrating: out of memory", m->path);
  return put_meta(m->db, txn, sk, bs__lmdb_format_step_value(m->buf, from, key), err);
}

/* One transaction of the migration: the next batch of the step under way, or the first of the
 * next step, or (the file at this build's format) nothing, and m->done. */
static int migrate_txn(MDB_txn *txn, void *payload, bs_error *err) {
  migration *m = payload;
  unsigned char fv[BS_FORMAT_VALUE_SIZE];
  uint32_t version, from;
  MDB_val key = {0, NULL};
  int rc, stepping;
  if ((rc = format_state(m->db, txn, &version, &stepping, &from, &key, err)) != BS_OK) return rc;
  if (!stepping) {
    if (version == BS_FORMAT_VERSION) {
      m->done = 1;
      return BS_OK;
    }
    from = version;
    bs__lmdb_format_value(fv, version + 1);
    if ((rc = put_meta(m->db, txn, bs__lmdb_format_key(), (MDB_val){sizeof fv, fv}, err)))
      return rc;
  }
  return step_batch(m, txn, from, key, err);
}

int bs__lmdb_format_open(bs__lmdb_db *db, const char *path, bs_error *err) {
  migration m = {db, path, NULL, 0, 0, 0, 0, 0, 0, {NULL, 0}, {0}};
  MDB_txn *txn;
  MDB_val key;
  uint32_t version, from;
  int rc, stepping;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  rc = format_state(db, txn, &version, &stepping, &from, &key, err);
  bs__lmdb_txn_abort(db, txn);
  if (rc != BS_OK || (version == BS_FORMAT_VERSION && !stepping)) return rc;
  if (db->base.flags & (BS_OPEN_RDONLY | BS_OPEN_NOMIGRATE)) {
    if (stepping)
      return bs__fail(err, BS_ECORRUPT,
                      "%s: its migration to format %u stopped halfway: a read-write open of this "
                      "build finishes it",
                      path, version);
    return bs__fail(err, BS_ECORRUPT,
                    "%s: format %u is older than this build's %u: a read-write open upgrades it "
                    "in place (a read-only one never changes a file)",
                    path, version, (unsigned)BS_FORMAT_VERSION);
  }
  for (unsigned batch = 0; rc == BS_OK && !m.done; batch++) {
    if (seam.batch) seam.batch(batch);
    m.t_known = 0; /* a transaction retried or the next one may see other tables */
    rc = bs__lmdb_write(db, migrate_txn, &m, err);
  }
  bs__free(&db->base.alloc, m.buf);
  return rc;
}
