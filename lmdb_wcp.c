/* TEMPORARY placeholder (owner: write-checkpoint helper); replaced by the real module. */
#include "internal.h"
int bs_lmdb_wcp_mark_processed(bs_lmdb_db *db, MDB_txn *txn, bs_val lsn,
                               int (*fn)(bs_val user, void *payload), void *payload, bs_error *err) {
  return BS_OK;
}
int bs_lmdb_wcp_put_custom(bs_lmdb_db *db, MDB_txn *txn, uint32_t stream, bs_val event,
                           bs_val user, uint64_t value, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "custom write checkpoints not built yet");
}
int bs_lmdb_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                      bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "write checkpoints not built yet");
}
int bs_lmdb_create_managed_write_checkpoints(bs_storage *st, const bs_managed_request *req,
                                             size_t n, uint64_t *ids_out, int *should_advance,
                                             bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "write checkpoints not built yet");
}
int bs_lmdb_last_write_checkpoint(bs_storage *st, bs_val user_id, const bs_head *heads,
                                  size_t n_heads, uint64_t *id_out, int *found, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "write checkpoints not built yet");
}
int bs_lmdb_delete_checkpoint_requests_before(bs_storage *st, int64_t before_ms,
                                              uint64_t *deleted, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "write checkpoints not built yet");
}
