/* TEMPORARY placeholder (owner: LMDB read helper); replaced by the real module. */
#include "internal.h"
int bs_lmdb_get_checkpoint(bs_storage *st, bs_checkpoint *out, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_bucket_data(bs_storage *st, uint64_t checkpoint, const bs_bucket_request *req,
                        size_t n_req, const bs_batch_options *opts,
                        int (*on_chunk)(const bs_chunk *, void *), void *payload,
                        int *has_more_out, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_checksums(bs_storage *st, uint64_t checkpoint, const bs_val *buckets, size_t n,
                      bs_checksum *out, uint64_t *generation_out, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_checksum_ranges(bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets,
                            size_t n, bs_checksum *out, int *cleared, uint64_t *generation_out,
                            bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                               int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                               bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_get_status(bs_storage *st, bs_status *out, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_stat(bs_db *db, bs_stat *out, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
int bs_lmdb_verify(bs_db *db, void (*fn)(const char *, void *), void *payload,
                   uint64_t *problems, bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "not built yet");
}
