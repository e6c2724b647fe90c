/*
 * lmdb.c: the top of the LMDB backend: its method tables and its constructor, and the calls
 * on streams (create, list, open a stream's handle). Every slot is a function of a file below
 * (lmdb_read.c, lmdb_params.c, lmdb_wcp.c, lmdb_write.c, lmdb_compact.c, lmdb_verify.c,
 * lmdb_backup.c), all of them on lmdb_env.c (the handle, transactions, records) and the codec
 * (lmdb_codec.c), and the format layer (lmdb_format.c), which brings an older file to this
 * build's format at open; no file below uses this one (make layercheck). The key/value layout is the
 * table in lmdb_internal.h.
 */
#include "lmdb_internal.h"

/* ---- Streams --------------------------------------------------------------------------------- */

typedef struct create_ctx {
  bs__lmdb_db *db;
  bs_val name;
  bs_hash hash;
  uint32_t id;
} create_ctx;

static int create_txn(MDB_txn *txn, void *payload, bs_error *err) {
  create_ctx *c = payload;
  bs__stream_rec rec;
  bs__stream_step step;
  uint32_t last;
  int rc;
  if ((rc = bs__stream_transition(&step, 0, 0, BS__STREAM_CREATE, err)) != BS_OK ||
      (rc = bs__lmdb_streams_map(c->db, txn, 0, step.others, &last, err)) != BS_OK)
    return rc;
  if (last == UINT32_MAX) return bs__fail(err, BS_ELIMIT, "stream ids exhausted");
  memset(&rec, 0, sizeof rec);
  rec.id = last + 1;
  rec.state = (uint8_t)step.to;
  rec.hash = (uint8_t)c->hash;
  rec.next_table_id = 1;
  rec.created_ms = bs__now_ms();
  rec.name = c->name;
  c->id = rec.id;
  return bs__stream_rec_put(c->db, txn, &rec, err);
}

static int lmdb_stream_create(uint32_t *id_out, bs_db *base, bs_val name,
                              const bs_stream_options *o, bs_error *err) {
  BS_ASSERT(o && (o->hash == BS_HASH_XXH3 || o->hash == BS_HASH_SHA256));
  BS_ASSERT(name.size >= 1 && name.size <= BS_MAX_STREAM_NAME);
  create_ctx c = {.db = (bs__lmdb_db *)base, .name = name, .hash = o->hash};
  int rc;
  if ((rc = bs__lmdb_write(c.db, create_txn, &c, err)) != BS_OK) return rc;
  if (id_out) *id_out = c.id;
  return BS_OK;
}

static int lmdb_stream_list(bs_db *base, int (*fn)(const bs_stream_info *, void *), void *payload,
                            bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  bs__stream_rec r;
  uint32_t id = 0;
  MDB_txn *txn;
  int rc;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  while ((rc = bs__lmdb_stream_next(db, txn, &id, &r, err)) == 1) {
    bs_stream_info info = {r.id, r.name, (bs_stream_state)r.state, (bs_hash)r.hash};
    if ((rc = fn(&info, payload)) != BS_OK) break;
  }
  bs__lmdb_txn_abort(db, txn);
  return rc;
}

static const bs_storage_vtable lmdb_vtable;

static int lmdb_storage_open(bs_storage **out, bs_db *base, uint32_t id, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  bs__lmdb_storage *st;
  MDB_txn *txn;
  bs__stream_rec rec;
  int rc;

  *out = NULL;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, err)) != BS_OK) return rc;
  rc = bs__stream_rec_get(db, txn, id, &rec, err); /* id 0 was resolved by the front */
  bs__lmdb_txn_abort(db, txn);
  if (rc != BS_OK) return rc;
  st = bs__calloc(&db->base.alloc, 1, sizeof *st);
  if (!st) return bs__fail(err, BS_ENOMEM, "cannot allocate the storage handle");
  st->base.vt = &lmdb_vtable;
  st->base.db = &db->base;
  st->base.stream_id = id;
  st->db = db;
  st->wcp_mode = BS_WCP_MANAGED;
  if (pthread_mutex_init(&st->wcp_mu, NULL)) {
    bs__free(&db->base.alloc, st);
    return bs__fail(err, BS_ENOMEM, "storage: cannot initialise a mutex");
  }
  *out = &st->base;
  return BS_OK;
}

static void lmdb_storage_destroy(bs_storage *base) {
  bs__lmdb_storage *st = (bs__lmdb_storage *)base;
  if (!st) return;
  pthread_mutex_destroy(&st->wcp_mu);
  bs__free(&st->db->base.alloc, st);
}

/* ---- The database handle --------------------------------------------------------------------- */

const bs_db_vtable bs__lmdb_db_vt = {
    .version = BS_DB_VTABLE_VERSION,
    .destroy = bs__lmdb_db_close,
    .stream_create = lmdb_stream_create,
    .stream_list = lmdb_stream_list,
    .storage_open = lmdb_storage_open,
    .stat = bs__lmdb_stat,
    .verify = bs__lmdb_verify,
    .backup = bs__lmdb_backup,
    .export_records = bs__lmdb_export,
    .load = bs__lmdb_load,
};

int bs__lmdb_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err) {
  int rc = bs__lmdb_db_open(out, path, opts, err);
  if (rc != BS_OK) return rc;
  (*out)->vt = &bs__lmdb_db_vt;
  /* a read-write open finishes the clears a stopped process left (a read-only one honours their
   * fence: lmdb_write.c) */
  if ((rc = bs__lmdb_format_open((bs__lmdb_db *)*out, path, err)) != BS_OK ||
      (!((*out)->flags & BS_OPEN_RDONLY) &&
       (rc = bs__lmdb_clear_pending((bs__lmdb_db *)*out, err)) != BS_OK)) {
    bs__lmdb_db_close(*out);
    *out = NULL;
  }
  return rc;
}

/* ---- The vtable ---------------------------------------------------------------------------------- */

static const bs_storage_vtable lmdb_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = lmdb_storage_destroy,
    .writer_open = bs__lmdb_writer_open,
    .bucket_data = bs__lmdb_bucket_data,
    .checksums = bs__lmdb_checksums,
    .checksum_ranges = bs__lmdb_checksum_ranges,
    .checkpoint_changes = bs__lmdb_checkpoint_changes,
    .parameter_sets = bs__lmdb_parameter_sets,
    .set_write_checkpoint_mode = bs__lmdb_set_write_checkpoint_mode,
    .create_managed_write_checkpoints = bs__lmdb_create_managed_write_checkpoints,
    .last_write_checkpoint = bs__lmdb_last_write_checkpoint,
    .delete_checkpoint_requests_before = bs__lmdb_delete_checkpoint_requests_before,
    .compact = bs__lmdb_compact,
    .compact_initial_replication = bs__lmdb_compact_initial_replication,
    .get_status = bs__lmdb_get_status,
    .report_error = bs__lmdb_report_error,
    .clear = bs__lmdb_clear,
    .terminate = bs__lmdb_terminate,
    .list_buckets = bs__lmdb_list_buckets,
    .writer_lock = bs__lmdb_writer_lock,
};
