/* TEMPORARY placeholder (owner: compaction helper); replaced by the real module. */
#include "internal.h"
int bs_lmdb_compact(bs_storage *st, const bs_compact_options *opts, bs_compact_stats *stats,
                    bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "compaction not built yet");
}
int bs_lmdb_compact_initial_replication(bs_storage *st, uint64_t max_op_id,
                                        uint64_t min_bucket_changes, uint64_t *buckets_out,
                                        bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "initial-replication compaction not built yet");
}
