/*
 * util_server.h: a small driver that plays the sync service for one client connection, over
 * the public API (so over any backend's vtable):
 *  - checkpoint lines from bs_get_checksums, checkpoint_diff lines from
 *    bs_get_checkpoint_changes (only changed buckets are re-summed and re-fetched);
 *  - data lines from bs_get_bucket_data with random limit / chunk_bytes, buckets by priority,
 *    partial_checkpoint_complete after each priority but the last, then checkpoint_complete;
 *  - checkpoint_complete (and partial) WITHHELD when a chunk's target_op exceeds the checkpoint
 *    or a read returns BS_EINVALIDATED; a checkpoint whose checksums are BS_EINVALIDATED gets
 *    no line at all. The connection then moves on to a newer checkpoint (contract.md 5.5).
 * One call of sv_next does at most one storage read and returns at most one line, so a test
 * can interleave writes, commits and compactions between any two lines.
 */
#ifndef BS_TESTS_UTIL_SERVER_H
#define BS_TESTS_UTIL_SERVER_H

#include "util_client.h"

typedef struct sv_sub {
  const char *name; /* borrowed for the duration of sv_set_buckets (copied) */
  int priority;     /* 0 (highest) .. 3 */
} sv_sub;

typedef struct sv_options {
  /* 1: may serve an older observed checkpoint before the newest (a lagging service) */
  int lag;
  /* 1: may abandon a checkpoint's data when a newer checkpoint is observed (superseded) */
  int interrupt;
  /* checks every bs_get_checkpoint_changes answer (test hook, may be NULL) */
  void (*on_changes)(uint64_t from, uint64_t to, const bs_checkpoint_changes *ch, void *payload);
  void *payload;
} sv_options;

typedef struct sv_stats {
  unsigned long lines, checkpoints, diffs, data, completes, partials;
  unsigned long withheld_target;      /* a chunk had target_op > checkpoint */
  unsigned long withheld_invalidated; /* a data read returned BS_EINVALIDATED */
  unsigned long checksum_invalidated; /* checksums at a checkpoint were BS_EINVALIDATED */
  unsigned long superseded, reads;
} sv_stats;

typedef struct sv_conn sv_conn;

/* Opens a connection: req are the client's (bucket, after) positions (copied); seed drives the
 * random limit / chunk_bytes / lag / interrupt choices. */
int sv_connect(sv_conn **out, bs_storage *st, const bs_bucket_request *req, size_t n_req,
               uint64_t seed, const sv_options *opts);
/* The buckets this client is entitled to (its sync rules' output); copied; takes effect at the
 * next checkpoint line. */
void sv_set_buckets(sv_conn *c, const sv_sub *subs, size_t n);
/* 1: *line was filled (free with sl_line_free); 0: nothing to send until a newer checkpoint;
 * < 0: a storage call failed unexpectedly, or the engine broke the chunk contract (err). */
int sv_next(sv_conn *c, sl_line *line, bs_error *err);
/* Notes the stream's current checkpoint (the service's checkpoint watcher); sv_next does this
 * too. A lagging connection may later serve any noted checkpoint above the last one sent. */
int sv_observe(sv_conn *c, bs_error *err);
const sv_stats *sv_get_stats(const sv_conn *c);
void sv_close(sv_conn *c);

#endif /* BS_TESTS_UTIL_SERVER_H */
