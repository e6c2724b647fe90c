/*
 * compact_params.c: compaction's parameter pass (contract.md 6, "Parameter compaction"), written
 * once over a backend's cursor of parameter entries (bs__param_cursor, internal.h). What an entry
 * becomes is compact.c's rule (bs__compact_param_drop); here: the walk of a (lookup, table,
 * replica id) group newest first, the transaction's bound (max_ops_per_txn entries visited,
 * ending at a group boundary so that a group's newest entry is always decided with the rest of
 * it), where the next transaction resumes, and the count. The backend wraps a call in its
 * transaction and commits it; compact_run.c reports progress after each.
 */
#include "internal.h"

static int same_group(const bs__param_pos *p, const bs__param_entry *e) {
  bs_val lookup = {p->lookup, p->lookup_size}, rid = {p->rid, p->rid_size};
  return p->started && p->table == e->table && bs__val_eq(lookup, e->lookup) &&
         bs__val_eq(rid, e->rid); /* an empty key's data may be NULL: not for memcmp */
}

int bs__compact_param_txn(const bs__param_cursor *c, void *x, bs__compact_run *r,
                          bs__param_pos *pos) {
  bs__param_entry e;
  size_t visited = 0;
  uint64_t removed = 0;
  int found = 0, newer = 0, full = 0, rc = c->seek(x, pos, &e, &found, r->err);
  for (; !rc && found; rc = c->next(x, &e, &found, r->err)) {
    if (!same_group(pos, &e)) { /* a new group: pos names it once it is begun */
      if ((full = visited >= r->o->max_ops_per_txn)) break; /* the next transaction's first */
      if (e.lookup.size > sizeof pos->lookup || e.rid.size > sizeof pos->rid)
        return bs__fail(r->err, BS_ECORRUPT, "compact: a parameter entry's key is too long");
      if (e.lookup.size) memcpy(pos->lookup, e.lookup.data, e.lookup.size);
      if (e.rid.size) memcpy(pos->rid, e.rid.data, e.rid.size);
      pos->lookup_size = e.lookup.size;
      pos->rid_size = e.rid.size;
      pos->table = e.table;
      pos->started = 1;
      newer = 0;
    }
    visited++;
    if (e.op > r->horizon) continue; /* above the horizon: kept, and no newer one for below */
    if (bs__compact_param_drop(newer, e.n_sets)) {
      if ((rc = c->del(x, r->err))) break;
      removed++;
    }
    newer = 1;
  }
  if (rc) return rc;
  pos->done = !full;
  r->stats->parameter_entries_removed += removed;
  return BS_OK;
}
