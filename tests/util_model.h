/*
 * util_model.h: a naive reference model of one stream (contract.md 2-4, 5.4) and the
 * client's reduce algorithm (contract.md 9, property 2: keep the latest PUT per row identity
 * plus a remainder checksum).
 *
 * The model predicts, from the writer's calls alone, every op ever written (op id, type,
 * checksum, row identity, data) and every parameter entry. It computes checksums and subkeys
 * with its own code (xxHash / nettle), not the library's.
 *
 * Where the contract leaves an order open (REMOVEs of one step of a save, all ops of a truncate),
 * the model records a "group": a range of ids whose assignment inside the range is learned from
 * the engine (md_reconcile) after checking that the engine wrote exactly the predicted ops there.
 *
 * The rules the engine's shared code owns (checkpoint creation and LSNs, write checkpoints, chunk
 * bounds, torn reads) are stated again at the end, from the contract alone.
 */
#ifndef BS_TESTS_UTIL_MODEL_H
#define BS_TESTS_UTIL_MODEL_H

#include "util_contract.h"

typedef struct md_member {
  char *bucket, *otype, *oid;
} md_member;

typedef struct md_key {
  unsigned char *p;
  size_t n;
} md_key;

typedef struct md_record {
  uint32_t table;
  char *rid;
  md_member *m;
  size_t nm;
  md_key *lk;
  size_t nlk;
  int soft;      /* soft-deleted (contract.md 4.3): no memberships, no lookups */
  uint64_t mark; /* a soft record's: the stream's op head at the delete */
} md_record;

typedef struct md_bucket {
  char *name;
  ct_op *ops; /* the full original history, ascending op id */
  size_t n, cap;
} md_bucket;

typedef struct md_param {
  uint64_t op_id;
  md_key key;
  uint32_t table;
  char *rid;
  char **params; /* NULL + n 0 = tombstone */
  size_t n;
} md_param;

typedef struct md_group {
  uint64_t lo, hi;
} md_group;

typedef struct md_stream {
  bs_hash hash;
  uint64_t head; /* highest allocated op id */
  char *tables[64];
  uint32_t n_tables;
  uint32_t table_base; /* ids before the last clear: tables[i] has id table_base + i + 1 */
  md_record *rec;
  size_t n_rec, cap_rec;
  md_bucket *b;
  size_t n_b, cap_b;
  md_param *p;
  size_t n_p, cap_p;
  md_group *g;
  size_t n_g, cap_g;
} md_stream;

void md_init(md_stream *m, bs_hash hash);
void md_free(md_stream *m);
/* Applies one save (contract.md 4.1) of a streaming writer after the snapshot is done. */
void md_save(md_stream *m, const bs_save *s);
/* The same of a snapshot writer (snapshot: INSERT only, skipped when the row has a record, a
 * soft-deleted one too) or before the snapshot is done: then a DELETE leaves a soft-deleted
 * record marked with the op head (contract.md 4.3). */
void md_save_mode(md_stream *m, const bs_save *s, int snapshot, int snapshot_done);
/* A checkpoint at cp purges the soft-deleted records it reached (mark <= cp, contract.md 4.3). */
void md_purge(md_stream *m, uint64_t cp);
/* Applies truncate(table) (contract.md 4.2); a table no save named is not registered by it. */
void md_truncate(md_stream *m, const char *table);
/* Applies bs_clear (contract.md 8): every op, bucket, lookup and source record goes; op ids and
 * source table ids keep growing (an id is never used again in the stream). */
void md_clear(md_stream *m);
/* Checks the engine's ops in every open group with hi <= C and adopts the engine's id
 * assignment. Fails the test (with a dump) on any mismatch. */
void md_reconcile(md_stream *m, bs_storage *st, uint64_t C);

md_bucket *md_find_bucket(md_stream *m, const char *name);
/* Sum and count of the original history of bucket with op_id <= C. */
void md_checksum(const md_stream *m, const char *bucket, uint64_t C, bs_checksum *out);
/* Parameter sets at C (a key listed twice counts once), sorted and newline-joined (caller frees);
 * number of rows in *n_rows. */
char *md_params(const md_stream *m, uint64_t C, const bs_val *keys, size_t n, size_t *n_rows);

/* What checkpoint_changes(from, to) must name (contract.md 5.1): the buckets with an op in
 * (from, to] (lookups 0) or the lookup keys with a parameter entry there (lookups 1), each once;
 * fn (may be NULL) gets each name. Returns how many there are. */
size_t md_changed(const md_stream *m, int lookups, uint64_t from, uint64_t to,
                  void (*fn)(const void *p, size_t n, void *payload), void *payload);

/* Op checksums and subkey, computed independently of the library. */
uint32_t md_hash(bs_hash h, const void *p, size_t n);
/* The checksum op must carry by its own fields (contract.md 3), into *out: 1 for a PUT (from its
 * type, id and data) and a REMOVE (from its subkey); 0 for a MOVE or CLEAR, whose checksum is
 * that of the ops they replaced. */
int md_op_checksum(bs_hash h, const ct_op *op, uint32_t *out);
void md_subkey(char out[BS_SUBKEY_SIZE + 1], uint32_t table_id, const void *rid, size_t n);

/* ---- The client's reduce ------------------------------------------------------------------- */
typedef struct md_row {
  char *key; /* object_type \x1f object_id \x1f subkey */
  uint64_t op_id;
  uint32_t checksum;
  char *data;
} md_row;

typedef struct md_reduced {
  uint32_t remainder;
  md_row *rows; /* open-addressing table */
  size_t cap, n;
} md_reduced;

void md_reduce_init(md_reduced *r);
void md_reduce_free(md_reduced *r);
void md_reduce_op(md_reduced *r, const ct_op *op);
void md_reduce_ops(md_reduced *r, const ct_op *ops, size_t n);
/* 1 if equal; else 0 and a description of the first difference in why (may be NULL). */
int md_reduced_eq(const md_reduced *a, const md_reduced *b, char *why, size_t why_cap);
/* remainder + the sum of the live rows' checksums: the bucket checksum a client validates. */
uint32_t md_reduced_total(const md_reduced *r);
/* The live row of key (object_type \x1f object_id \x1f subkey), or NULL. */
const md_row *md_reduced_get(const md_reduced *r, const char *key);

/* ---- The engine's rules, written from the contract (util_model_rules.c) ---------------------
 * Independent of the library: nothing here calls rules.c, compact.c or the chunker, so a wrong
 * operator there makes the engine disagree with the model. */

/* LSN order (contract.md 1): byte-wise, a shorter prefix first. */
int md_lsn_cmp(const char *a, const char *b);

/* A stream's checkpoint state (contract.md 4.4). LSNs are text (NUL-free) of up to 63 bytes. */
typedef struct md_cpstate {
  int snapshot_done, has_nocb, has_cp, has_resume;
  char nocb[64], cp_lsn[64], resume[64];
  uint64_t cp;
} md_cpstate;

/* snapshot_done(lsn): no_checkpoint_before = max(current, lsn). */
void md_cp_snapshot_done(md_cpstate *c, const char *lsn);
/* resume_lsn(lsn): the resume LSN is lsn, lower than the current one or not (the caller's
 * restart point, contract.md 4.4). */
void md_cp_resume_lsn(md_cpstate *c, const char *lsn);
/* The outcome of commit(lsn) with head the last persisted op id, create_empty 0 or 1; applies
 * it to c. *created: whether a checkpoint is made (it is then c->cp = head at lsn). Every commit
 * raises the resume LSN to lsn. */
bs_block_reason md_cp_commit(md_cpstate *c, uint64_t head, const char *lsn, int create_empty,
                             int *created);

/* The states of a database's streams (contract.md 1, 4.4, 8), s[id - 1]. */
#define MD_STREAMS 8
typedef struct md_states {
  bs_stream_state s[MD_STREAMS];
  size_t n;
} md_states;
/* bs_stream_create (the new stream's id is n afterwards); a commit of stream id that made a
 * checkpoint; bs_report_error on stream id. */
void md_states_create(md_states *m);
void md_states_checkpoint(md_states *m, uint32_t id);
void md_states_error(md_states *m, uint32_t id);
/* bs_terminate on stream id: TERMINATED from any state, for good (bs_clear changes no state). */
void md_states_terminate(md_states *m, uint32_t id);

/* Write checkpoints (contract.md 7): managed records database-wide, custom records per stream,
 * and, per stream, the users filed under each op id (for checkpoint_changes). */
#define MD_WCP_MAX   32
#define MD_WCP_HEADS 3
typedef struct md_whead {
  char conn[16], lsn[64];
} md_whead;
typedef struct md_managed {
  char user[32];
  int exists, processed, has_at;
  uint64_t id, high; /* high: the id of the last record cleanup deleted */
  int64_t at;
  md_whead heads[MD_WCP_HEADS];
  size_t nh;
} md_managed;
typedef struct md_custom {
  uint32_t stream;
  char user[32];
  int exists, has_at, pending; /* pending: queued, not yet flushed */
  uint64_t value;
  int64_t at;
} md_custom;
typedef struct md_ack { /* user acknowledged, filed under op id op */
  uint32_t stream;
  uint64_t op;
  char user[32];
} md_ack;
typedef struct md_wcp {
  md_managed m[MD_WCP_MAX];
  size_t nm;
  md_custom c[MD_WCP_MAX];
  size_t nc;
  md_ack *acks;
  size_t nacks, cap_acks;
} md_wcp;
void md_wcp_free(md_wcp *w);
/* One managed request: user, heads, a supplied id (has_id) and requested_at (ms, > 0). */
typedef struct md_mreq {
  const char *user;
  md_whead heads[MD_WCP_HEADS];
  size_t nh;
  int has_id;
  uint64_t id;
  int64_t at;
} md_mreq;
/* What create_managed_write_checkpoints returns before its batch: BS_ESTATE from a storage in
 * custom mode (custom 1; the batch then stores nothing), else BS_OK. */
int md_wcp_managed_refused(int custom);
/* create_managed_write_checkpoints(req, n): ids_out[i] = request i's user's id after the batch;
 * returns should_advance. */
int md_wcp_managed(md_wcp *w, const md_mreq *req, size_t n, uint64_t *ids_out);
/* last_write_checkpoint in managed mode with the given heads; 1 and *id when acknowledged. */
int md_wcp_last_managed(const md_wcp *w, const char *user, const md_whead *given, size_t n,
                        uint64_t *id);
/* A custom write checkpoint queued by stream's writer (has_at: requested at `at`); it is stored
 * at the writer's next flush (the caller reads it only after one). */
void md_wcp_custom(md_wcp *w, uint32_t stream, const char *user, uint64_t value, int has_at,
                   int64_t at);
int md_wcp_last_custom(const md_wcp *w, uint32_t stream, const char *user, uint64_t *value);
/* A flush of stream's writer ending at op head `head` stores the queued custom write checkpoints:
 * their users are filed under head (the flush's change record). */
void md_wcp_flushed(md_wcp *w, uint32_t stream, uint64_t head);
/* A checkpoint `cp` created by stream at lsn: marks the managed records whose heads are all
 * <= lsn processed and files their users under cp (the checkpoint's change record). */
void md_wcp_checkpoint(md_wcp *w, uint32_t stream, uint64_t cp, const char *lsn);
/* bs_clear of stream: its custom records go, and what its checkpoints acknowledged is no longer
 * known (checkpoint_changes from below the clear invalidates). Managed records are the
 * database's and stay. */
void md_wcp_clear(md_wcp *w, uint32_t stream);
/* delete_checkpoint_requests_before(t) from stream's handle; returns how many it deletes. */
uint64_t md_wcp_cleanup(md_wcp *w, uint32_t stream, int64_t t);
/* Whether checkpoint_changes(from, to) of stream names user: a user filed under an op id in
 * [from, to] (both ends: a checkpoint may keep the op id of the one before, so a client at `from`
 * may not have seen what was filed there; contract.md 5.1 allows the extra), and no other. */
int md_wcp_lists(const md_wcp *w, uint32_t stream, uint64_t from, uint64_t to, const char *user);

/* The change-record cap (contract.md 5.1): a kind of n names that checkpoint_changes reports as
 * invalidate-all instead of a list. */
int md_changes_too_many(size_t n);

/* Bucket data chunks (contract.md 5.2). One call over the requested buckets in the order served,
 * lists[k] the ops bucket k still has in (after, C]: the chunks it returns (at most cap), each
 * bucket k's ops [first, first + n) of lists[k]; *more: the caller must call again. limit >= 1,
 * max_bytes resolved (0 is not "default" here). Op size: data + object type + object id +
 * subkey. */
typedef struct md_chunk {
  size_t bucket, first, n;
  int has_more;
  uint64_t target_op;
} md_chunk;
size_t md_chunk_call(const ct_oplist *lists, size_t n_lists, size_t limit, size_t chunk_bytes,
                     size_t max_bytes, md_chunk *out, size_t cap, int *more);

/* The aged checkpoint of an incremental compaction at now_ms with min_age_ms > 0 (contract.md 6):
 * the newest of the n checkpoints cps (made at made_ms, ascending) made at least min_age_ms
 * before now_ms; 0 when none is that old. */
uint64_t md_aged_checkpoint(const uint64_t *cps, const int64_t *made_ms, size_t n, int64_t now_ms,
                            int64_t min_age_ms);

/* An op as read (storage.h bs_op): PUT and REMOVE carry object_type, object_id and subkey, PUT
 * also data, each present (data not NULL) also when empty; every other field is {NULL, 0}.
 * Returns the name of the first field that breaks it, or NULL. */
const char *md_op_fields_wrong(const bs_op *op);

/* Torn reads (contract.md 5.5): a data or checksum read at C of bucket b (its original history)
 * whose stored ops start with a CLEAR of id clear_op (0: none) fails with BS_EINVALIDATED iff
 * that CLEAR folded an op of the history at or below C. */
int md_torn(const md_bucket *b, uint64_t clear_op, uint64_t C);

#endif /* BS_TESTS_UTIL_MODEL_H */
