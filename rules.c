/*
 * rules.c: the small rules of the storage contract that the front and every backend apply, each
 * written once: when a commit may make a checkpoint (contract.md 4.4), which id a managed write
 * checkpoint takes (contract.md 7), and the options checks that a backend's own public entry
 * point (bs_load) shares with the front. The larger rule modules are checksum.c, compact.c and
 * lookup.c. Nothing here calls the front or a backend.
 */
#include "internal.h"

int bs__check_version(unsigned v, unsigned current, const char *what, bs_error *err) {
  if (v < 1 || v > current)
    return bs__fail(err, BS_EINVAL, "%s %u is not supported (this build: %u)", what, v, current);
  return BS_OK;
}

bs_block_reason bs__checkpoint_block(int snapshot_done, const bs_val *no_checkpoint_before,
                                     const bs_val *checkpoint_lsn, bs_val lsn) {
  if (!snapshot_done) return BS_BLOCKED_SNAPSHOT;
  if (no_checkpoint_before && bs__val_cmp(lsn, *no_checkpoint_before) < 0)
    return BS_BLOCKED_NO_CHECKPOINT_BEFORE;
  if (checkpoint_lsn && bs__val_cmp(lsn, *checkpoint_lsn) < 0) return BS_BLOCKED_CHECKPOINT_LSN;
  return BS_BLOCKED_NONE;
}

int bs__managed_next_id(const bs_managed_request *w, int exists, uint64_t stored, uint64_t *id,
                        int *action, bs_error *err) {
  *action = BS_WCP_REPLACE;
  if (!w->has_request_id) {
    *id = stored + 1; /* stored < 2^63: no wrap */
  } else if (!exists || w->request_id > stored) {
    *id = w->request_id > stored ? w->request_id : stored;
  } else {
    *id = stored;
    *action = w->request_id == stored ? BS_WCP_REFRESH : BS_WCP_KEEP;
  }
  if (*id >= (UINT64_C(1) << 63))
    return bs__fail(err, BS_EINVAL, "user %.*s: write checkpoint id would pass 2^63",
                    (int)w->user_id.size, (const char *)w->user_id.data);
  return BS_OK;
}

int bs__backup_options_resolve(bs_backup_options *out, const bs_backup_options *opts,
                               bs_error *err) {
  static const bs_backup_options defaults = BS_BACKUP_OPTIONS_INIT;
  int rc;
  *out = defaults;
  if (!opts) return BS_OK;
  if ((rc = bs__check_version(opts->version, BS_BACKUP_OPTIONS_VERSION, "opts->version", err)))
    return rc;
  if (opts->flags & ~BS_BACKUP_REPLACE)
    return bs__fail(err, BS_EINVAL, "opts->flags: unknown bits 0x%x",
                    opts->flags & ~BS_BACKUP_REPLACE);
  *out = *opts;
  return BS_OK;
}

size_t bs__managed_winners(const bs_managed_request *req, size_t n,
                           const bs_managed_request **win) {
  size_t nw = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k;
    for (k = 0; k < nw; k++)
      if (bs__val_eq(win[k]->user_id, req[i].user_id)) break;
    if (k == nw)
      win[nw++] = &req[i];
    else if (bs__managed_req_beats(&req[i], win[k]))
      win[k] = &req[i];
  }
  return nw;
}
