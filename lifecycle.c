/*
 * lifecycle.c: a stream's lifecycle, decided once for every backend: the state machine of its
 * five states (contract.md 1): which event moves a stream from which state to which, what it
 * does to the database's other streams, and which states refuse a writer; and what a commit
 * does (contract.md 4.4), how many names a change record keeps (contract.md 5.1), which
 * checkpoints and requests are aged (contract.md 6, 7), and what a clear leaves (contract.md 8). A backend stores what these
 * decide; nothing here calls the front or a backend.
 */
#include "internal.h"

static void identity(uint8_t map[BS__STREAM_STATES]) {
  for (unsigned s = 0; s < BS__STREAM_STATES; s++) map[s] = (uint8_t)s;
}

/* A new stream is created PROCESSING, and an older one still PROCESSING stops: only the newest
 * deployment is kept in flight (contract.md 4.4). */
static void on_create(bs__stream_step *st) {
  st->to = BS_STREAM_PROCESSING;
  st->others_change = 1;
  st->others[BS_STREAM_PROCESSING] = BS_STREAM_STOPPED;
}

/* Activation: the first checkpoint of a PROCESSING stream makes it the served one and stops
 * every other served stream, in the same transaction (contract.md 4.4). A checkpoint of a
 * stream in another state changes no state. */
static void on_checkpoint(bs__stream_step *st, unsigned from) {
  if (from != BS_STREAM_PROCESSING) return;
  st->to = BS_STREAM_ACTIVE;
  st->others_change = 1;
  st->others[BS_STREAM_ACTIVE] = st->others[BS_STREAM_ERRORED] = BS_STREAM_STOPPED;
}

int bs__stream_transition(bs__stream_step *out, uint32_t stream, unsigned from, bs__stream_event ev,
                          bs_error *err) {
  bs__stream_step st;
  if (ev == BS__STREAM_CREATE ? from != 0 : !bs__stream_known((int)from))
    return bs__fail(err, BS_ECORRUPT, "stream %u: stored state %u is not a stream state", stream,
                    from);
  st.to = (bs_stream_state)from;
  st.others_change = 0;
  identity(st.others);
  switch (ev) {
  case BS__STREAM_CREATE:
    on_create(&st);
    break;
  case BS__STREAM_WRITE:
  case BS__STREAM_CHECKPOINT:
    /* terminated: no writer call changes the stream any more (storage.h bs_terminate) */
    if (from == BS_STREAM_TERMINATED)
      return bs__fail(err, BS_ESTATE, "stream %u is terminated", stream);
    if (ev == BS__STREAM_CHECKPOINT) on_checkpoint(&st, from);
    break;
  case BS__STREAM_ERROR: /* still served, marked as failing (contract.md 8) */
    if (from == BS_STREAM_ACTIVE) st.to = BS_STREAM_ERRORED;
    break;
  case BS__STREAM_TERMINATE:
    st.to = BS_STREAM_TERMINATED;
    break;
  }
  *out = st;
  return BS_OK;
}

void bs__stream_map(uint8_t map[BS__STREAM_STATES], bs__stream_event ev) {
  bs__stream_step st;
  map[0] = 0;
  for (unsigned s = BS_STREAM_PROCESSING; s < BS__STREAM_STATES; s++)
    map[s] = bs__stream_transition(&st, 0, s, ev, NULL) == BS_OK ? (uint8_t)st.to : 0;
}

/* can_checkpoint(lsn) of contract.md 4.4: BS_BLOCKED_NONE when a commit at lsn may make a
 * checkpoint, else the first reason (bs_block_reason order). NULL: not set. */
static bs_block_reason checkpoint_block(int snapshot_done, const bs_val *no_checkpoint_before,
                                        const bs_val *checkpoint_lsn, bs_val lsn) {
  if (!snapshot_done) return BS_BLOCKED_SNAPSHOT;
  if (no_checkpoint_before && bs__val_cmp(lsn, *no_checkpoint_before) < 0)
    return BS_BLOCKED_NO_CHECKPOINT_BEFORE;
  if (checkpoint_lsn && bs__val_cmp(lsn, *checkpoint_lsn) < 0) return BS_BLOCKED_CHECKPOINT_LSN;
  return BS_BLOCKED_NONE;
}

/* An LSN that only rises (no_checkpoint_before, the resume LSN a commit raises): does lsn
 * replace current (data NULL: not set)? */
static int lsn_raises(bs_val current, bs_val lsn) {
  return !current.data || bs__val_cmp(lsn, current) > 0;
}

int bs__plan_commit_row(bs__commit_plan *out, uint32_t stream, const bs__stream_row *row,
                        bs_val lsn, int create_empty, bs_error *err) {
  bs__commit_plan p;
  const bs_val *ncb = row->no_checkpoint_before.data ? &row->no_checkpoint_before : NULL;
  const bs_val *cpl = row->checkpoint_lsn.data ? &row->checkpoint_lsn : NULL;
  int rc;
  p.blocked = checkpoint_block(row->snapshot_done, ncb, cpl, lsn);
  /* the checkpoint is the op head at the last one: nothing new while they are equal (unless
   * create_empty); the first unblocked commit (no checkpoint LSN: a new or cleared stream)
   * always makes one */
  p.checkpoint = !p.blocked && (create_empty || !cpl || row->op_head != row->last_checkpoint_op);
  p.raise_resume = lsn_raises(row->resume_lsn, lsn);
  /* a soft-deleted record is marked with the op head at its delete: the checkpoint reaches it
   * when its op id (the op head) is at or above the mark, and no snapshot can resurrect the row
   * any more */
  p.purge_to = p.checkpoint ? row->op_head : 0;
  rc = bs__stream_transition(&p.step, stream, row->state,
                             p.checkpoint ? BS__STREAM_CHECKPOINT : BS__STREAM_WRITE, err);
  if (rc == BS_OK) *out = p;
  return rc;
}

/* The reference service's cap: a client told of more changed names than this rereads every
 * bucket (or lookup) anyway, so a longer list would only cost the record's bytes. */
#define CHANGES_MAX 1000u

int bs__changes_too_many(size_t n) {
  return n > CHANGES_MAX;
}

size_t bs__changes_enough(void) {
  return CHANGES_MAX + 1;
}

/* Below the fence (a clear's op head, a parameter compaction's horizon) the change records are
 * gone: a range from there cannot be listed. */
int bs__changes_fenced(uint64_t from, uint64_t fence) {
  return from < fence;
}

/* A checkpoint made by a commit that adds no op keeps the op id of the one before, yet it can
 * acknowledge write checkpoints: a client at `from` may not have seen the users filed at `from`
 * itself, so they count (an extra, never a miss; contract.md 5.1). */
uint64_t bs__changes_users_from(uint64_t from) {
  return from;
}

/* "At or before": PostgreSQL's statements write it as <= the cutoff they are given. */
int bs__aged(int64_t at_ms, int64_t cutoff_ms) {
  return at_ms >= 0 && at_ms <= cutoff_ms;
}

/* A checkpoint at least min_age_ms old at now_ms is aged (min_age_ms >= 0). */
int64_t bs__aged_cutoff(int64_t now_ms, int64_t min_age_ms) {
  return now_ms - min_age_ms;
}

/* A request older than before_ms, strictly: one made at exactly before_ms stays. */
int64_t bs__request_cutoff(int64_t before_ms) {
  return before_ms > 0 ? before_ms - 1 : -1;
}

/* A pending managed request still has a client waiting for it: it stays whatever its age. */
int bs__request_expired(int64_t requested_at_ms, int processed, int64_t before_ms) {
  return processed && bs__aged(requested_at_ms, bs__request_cutoff(before_ms));
}

/* A clear: the checkpoint state of a new stream (no checkpoint, snapshot not done, no LSN, so the
 * LSN rules start again; no parameter or compaction horizon), and a fence at the op head, below
 * which what changed is no longer known. The op head stays: op ids are never reused, so a client
 * or a cache holding an id of before the clear cannot mistake a new op for it. */
static void on_clear(bs__stream_row *r) {
  r->snapshot_done = 0;
  r->checkpoint = r->last_checkpoint_op = 0;
  r->checkpoint_lsn = r->resume_lsn = r->no_checkpoint_before = (bs_val){NULL, 0};
  r->param_horizon = r->param_cursor = r->compact_horizon = 0;
  r->changes_fence = r->op_head;
}

int bs__stream_reset(bs__stream_row *row, uint32_t stream, int clear, int terminate,
                     bs_error *err) {
  bs__stream_step st;
  int rc;
  if (terminate &&
      (rc = bs__stream_transition(&st, stream, row->state, BS__STREAM_TERMINATE, err)) != BS_OK)
    return rc;
  if (clear) on_clear(row);
  if (terminate) row->state = st.to;
  return BS_OK;
}

/* snapshot_done(lsn): the snapshot is done, and no checkpoint comes before the larger of lsn and
 * the bound already set (it never goes down, so a later call cannot let in a checkpoint an
 * earlier one kept out). resume_lsn(lsn): where replication restarts, set as given. Either is a
 * write, refused on a terminated stream (contract.md 4.4). */
int bs__plan_lsn(bs__lsn_plan *out, uint32_t stream, const bs__stream_row *row, int snapshot_done,
                 bs_val lsn, bs_error *err) {
  bs__stream_step st;
  int rc = bs__stream_transition(&st, stream, row->state, BS__STREAM_WRITE, err);
  if (rc != BS_OK) return rc;
  out->snapshot_done = snapshot_done;
  out->no_checkpoint_before = snapshot_done && lsn_raises(row->no_checkpoint_before, lsn);
  out->resume_lsn = !snapshot_done;
  return BS_OK;
}

/* data NULL means "not set" in a row: a set empty LSN gets data of its own */
static bs_val lsn_set(bs_val lsn) {
  return lsn.data ? lsn : (bs_val){"", 0};
}

/* A checkpoint is the op head at the commit's LSN, and the op head it was made at (a commit with
 * create_empty 0 makes none while nothing was persisted since). */
void bs__commit_row(bs__stream_row *row, const bs__commit_plan *p, bs_val lsn) {
  if (p->raise_resume) row->resume_lsn = lsn_set(lsn);
  if (!p->checkpoint) return;
  row->checkpoint = row->last_checkpoint_op = row->op_head;
  row->checkpoint_lsn = lsn_set(lsn);
  row->state = p->step.to;
}

void bs__lsn_row(bs__stream_row *row, const bs__lsn_plan *p, bs_val lsn) {
  row->snapshot_done |= p->snapshot_done;
  if (p->no_checkpoint_before) row->no_checkpoint_before = lsn_set(lsn);
  if (p->resume_lsn) row->resume_lsn = lsn_set(lsn);
}
