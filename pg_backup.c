/*
 * pg_backup.c: what bs_backup, bs_db_export and bs_load answer on the PostgreSQL backend (the
 * LMDB backend's lmdb_backup.c copies its file, exports its records and loads them).
 */
#include "pg_internal.h"

/* bs_record is a record of the LMDB file format (docs/format.md): its tables, keys and values are
 * the LMDB backend's sub-databases, which bs_load writes into a new file. This backend stores
 * other tables, and no other backend may use the LMDB codec (make layercheck), so it has no such
 * records to give and no file to copy. */
int bs__pg_backup(bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err) {
  BS_UNUSED(db);
  BS_UNUSED(path);
  BS_UNUSED(opts);
  return bs__fail(err, BS_EUNSUPPORTED,
                  "backup: a PostgreSQL database is not a file; copy it with pg_dump (or the "
                  "server's own backups)");
}

int bs__pg_export(bs_db *db, uint32_t stream, int (*fn)(const bs_record *, void *), void *payload,
                  bs_error *err) {
  BS_UNUSED(db);
  BS_UNUSED(stream);
  BS_UNUSED(fn);
  BS_UNUSED(payload);
  return bs__fail(err, BS_EUNSUPPORTED,
                  "export: records are the LMDB file format's (docs/format.md), which the "
                  "PostgreSQL backend does not store; copy it with pg_dump");
}

int bs__pg_load(const char *url, const bs_backup_options *opts, int (*next)(bs_record *, void *),
                void *payload, bs_error *err) {
  BS_UNUSED(url);
  BS_UNUSED(opts);
  BS_UNUSED(next);
  BS_UNUSED(payload);
  return bs__fail(err, BS_EUNSUPPORTED,
                  "load: records are the LMDB file format's (docs/format.md), which the "
                  "PostgreSQL backend does not store; restore its database with pg_restore");
}
