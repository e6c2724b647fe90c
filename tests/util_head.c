/*
 * util_head.c: a stream's op head set from outside (see util_head.h).
 */
#include "util_head.h"

#include <stdio.h>
#include <string.h>

#include "../lmdb_internal.h"
#include "../mem_internal.h"
#include "util_pg.h"

static int lmdb_set_head(bs_db *db, uint32_t stream, uint64_t head, bs_error *err) {
  bs__lmdb_db *l = (bs__lmdb_db *)db;
  bs__stream_rec rec;
  MDB_txn *txn;
  int rc = bs__lmdb_txn_begin(l, 0, &txn, err);
  if (rc) return rc;
  if ((rc = bs__stream_rec_get(l, txn, stream, &rec, err)) ||
      (rec.op_head = head, rc = bs__stream_rec_put(l, txn, &rec, err))) {
    bs__lmdb_txn_abort(l, txn);
    return rc;
  }
  return bs__lmdb_txn_commit(l, txn, err);
}

static int mem_set_head(bs_db *db, uint32_t stream, uint64_t head, bs_error *err) {
  mem_db *m = (mem_db *)db;
  int rc = BS_OK;
  pthread_mutex_lock(&m->mu);
  if (stream == 0 || stream > m->nstreams || !m->streams[stream - 1])
    rc = bs__fail(err, BS_ENOTFOUND, "ct_set_op_head: no stream %u", stream);
  else
    m->streams[stream - 1]->m.row.op_head = head;
  pthread_mutex_unlock(&m->mu);
  return rc;
}

int ct_set_op_head(const ct_backend *be_, bs_db *db, const char *path, uint32_t stream,
                   uint64_t head, bs_error *err) {
  const char *be = be_->name;
  if (strcmp(be, "memory") == 0) return mem_set_head(db, stream, head, err);
  if (strcmp(be, "lmdb") == 0 || strcmp(be, "lmdb+passthrough") == 0)
    return lmdb_set_head(db, stream, head, err);
#ifdef BS_HAVE_PG
  if (strcmp(be, "postgres") == 0) {
    char schema[96], sql[256];
    ct_pg_schema_of(path, schema, sizeof schema);
    snprintf(sql, sizeof sql, "UPDATE %s.bs_streams SET op_head = %llu WHERE id = %u", schema,
             (unsigned long long)head, stream);
    if (pgt_admin_try(sql, err->msg, sizeof err->msg)) return err->code = BS_EIO;
    return BS_OK;
  }
#endif
  (void)path;
  return bs__fail(err, BS_EUNSUPPORTED, "ct_set_op_head: backend %s", be);
}

uint64_t ct_draw_start_head(ct_rng *r) {
  switch (ct_below(r, 8)) {
  case 0:
    return (UINT64_C(1) << 32) - 1 - ct_below(r, 200);
  case 1:
    return (UINT64_C(1) << 53) - 1 - ct_below(r, 200);
  case 2:
    return (UINT64_C(1) << 63) - 1 - (UINT64_C(1) << 24) - ct_below(r, 1u << 20);
  default:
    return 0;
  }
}
