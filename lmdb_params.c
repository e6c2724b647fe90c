/* TEMPORARY placeholder (owner: parameter helper); replaced by the real module. */
#include "internal.h"
int bs_lmdb_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,
                           size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                           bs_error *err) {
  return bs_fail(err, BS_EUNSUPPORTED, "parameter sets not built yet");
}
