/*
 * storage_backend.h: the implementer's API of bucketstore (like libgit2's include/git2/sys/):
 * what a backend, or a wrapper around one (tracing, fault injection), is made of. A program that
 * only USES the library includes storage.h and never sees these types; one that SUPPLIES a
 * backend includes this header too. docs/backends.md walks through adding a backend or a call.
 *
 * THREE TABLES, one per handle: bs_db_vtable (the database: streams, stat, verify, backup),
 * bs_storage_vtable (one stream: reads, write checkpoints, compaction, lifecycle) and
 * bs_writer_vtable (one writer of a stream). A backend's handle is a struct whose FIRST member
 * is the base (struct bs_db / bs_storage / bs_writer below), with vt pointing at its table:
 *
 *     typedef struct my_db { bs_db base; ... } my_db;
 *     static const bs_db_vtable my_db_vt = {.version = BS_DB_VTABLE_VERSION,
 *                                           .destroy = my_destroy, .storage_open = my_open_st};
 *
 * RULES the front (the bs_* functions of storage.h) keeps, so a backend need not:
 *  - Every argument is checked before a slot is called (NULL handles, sizes against BS_MAX_*,
 *    option versions, LSNs, op ids below 2^63); options reach the slots resolved (never NULL,
 *    every zero field replaced by its default). A backend does not re-check them.
 *  - A read-only database (BS_OPEN_RDONLY in bs_db.flags) gets no writing call: the front
 *    answers BS_ESTATE before the slot is reached.
 *  - A NULL slot answers BS_EUNSUPPORTED; `destroy` is the one mandatory slot of every table
 *    (bs_open_backend, bs_storage_open and bs_writer_open refuse with BS_EINVAL a handle
 *    without it or of a version older than below, releasing it through its destroy when it has
 *    one, and a slot that returned BS_OK without a handle).
 *  - Tables only grow at the end. Each carries the version its author compiled against
 *    (BS_*_VTABLE_VERSION); the front reads a slot only when the table's version is at least
 *    the version that added it, so a backend built against an older header keeps working. A
 *    slot whose signature changes, or a slot removed, bumps its table's version, and the front
 *    refuses the older versions (their slots take other arguments or lie elsewhere): the db
 *    table from version 2, the storage table from 5 and the writer table from 2 on (0.4.0:
 *    outputs first in every slot; the storage table's version 5 dropped get_checkpoint, which
 *    the front answers from get_status).
 *  - Slots follow storage.h's CONVENTIONS: outputs first, then the handle, then the inputs;
 *    a callback's payload after it; err last.
 *  - The checksum cache, checkpoint notification (bs_wait_checkpoint, the listener) and the
 *    writer's options live in the front, not in the bases: a backend never touches them.
 *  - Ownership: the caller of a slot owns its inputs (borrowed for the call); what a slot hands
 *    to a callback is borrowed until the callback returns; a handle returned through **out is
 *    released by the front through its table's destroy, exactly once.
 *  - Status codes are the BS_E* of storage.h, with a message in err naming what failed.
 *  - A callback a slot is handed returns 0 (go on) or a non-zero status: the slot then stops
 *    and returns it. The front hands slots its own callbacks around the host's and reports a
 *    host's stop itself (storage.h CONVENTIONS), so a backend never interprets a return value.
 */
#ifndef BUCKETSTORE_STORAGE_BACKEND_H
#define BUCKETSTORE_STORAGE_BACKEND_H

#include "storage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BS_DB_VTABLE_VERSION      3
#define BS_STORAGE_VTABLE_VERSION 5
#define BS_WRITER_VTABLE_VERSION  2

/* ---- The slot lists ----------------------------------------------------------------------------
 * Each table is written once, as the list of its slots after destroy (the one mandatory slot), in
 * table order: X(name, since, (parameters), (arguments)), where since is the table's version that
 * added the slot, parameters its prototype's (outputs first, then the handle, named db, st or w,
 * then the inputs, a callback's payload after it, err last) and arguments the same names. The
 * tables below are made of these lists, and so are the front's rule of which slots a table of an
 * older version has and any wrapper that forwards every slot (tests/util_passthrough.c,
 * tests/util_fault.c), e.g.
 *
 *     #define MY_FWD(name, since, params, args)                                                 \
 *       static int my_##name params { st = ((my_storage *)st)->inner; return st->vt->name args; }
 *     BS_STORAGE_SLOTS(MY_FWD)
 *
 * A new slot is one entry at the end of its list, with its table's version one higher. */
#define BS_SLOT_MEMBER(name, since, params, args) int(*name) params;

/* ---- The database ---------------------------------------------------------------------------- */

/* clang-format off */
#define BS_DB_SLOTS(X)                                                                             \
  /* name: 1..BS_MAX_STREAM_NAME bytes; o: resolved (never NULL, hash valid). */                   \
  X(stream_create, 1, (uint32_t *id_out, bs_db *db, bs_val name, const bs_stream_options *o,       \
                       bs_error *err), (id_out, db, name, o, err))                                 \
  X(stream_list, 1, (bs_db *db, int (*fn)(const bs_stream_info *, void *), void *payload,          \
                     bs_error *err), (db, fn, payload, err))                                       \
  /* id: a stream's (BS_ENOTFOUND when there is none such). The front resolves id 0 through        \
   * stream_list (the newest served stream, else the newest); a table without stream_list gets     \
   * the 0 as asked. The storage returned has vt (with destroy), db = this db and stream_id        \
   * set. */                                                                                       \
  X(storage_open, 1, (bs_storage **out, bs_db *db, uint32_t id, bs_error *err),                    \
    (out, db, id, err))                                                                            \
  X(stat, 1, (bs_stat *out, bs_db *db, bs_error *err), (out, db, err))                             \
  X(verify, 1, (uint64_t *problems, bs_db *db, void (*fn)(const char *, void *), void *payload,    \
                bs_error *err), (problems, db, fn, payload, err))                                  \
  X(backup, 1, (bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err),        \
    (db, path, opts, err))                                                                         \
  X(export_records, 1, (bs_db *db, uint32_t stream, int (*fn)(const bs_record *, void *),          \
                        void *payload, bs_error *err), (db, stream, fn, payload, err))             \
  /* Version 3. A new database at path from records (bs_load), the one slot called without a       \
   * handle, since it makes the database: bs_load calls it in the table of the built-in backend    \
   * its path names (as bs_open picks one: PostgreSQL for a postgresql:// or postgres:// URL,      \
   * else LMDB), so a host's backend leaves it NULL. opts resolved (allocator set, never           \
   * BS_BACKUP_REPLACE). next fills *rec (borrowed until its next call) and returns 1, returns 0   \
   * after the last record, or else a status (BS_EUSER) that the slot returns. */                  \
  X(load, 3, (const char *path, const bs_backup_options *opts,                                     \
              int (*next)(bs_record *rec, void *payload), void *payload, bs_error *err),           \
    (path, opts, next, payload, err))
/* clang-format on */

typedef struct bs_db_vtable {
  unsigned version;
  /* Mandatory. Releases the db (the front has released its own state first). */
  void (*destroy)(bs_db *db);
  BS_DB_SLOTS(BS_SLOT_MEMBER)
} bs_db_vtable;

/* The base every database begins with. The backend's constructor sets vt, alloc and flags
 * (from the bs_open_options it was given) and allocates everything it keeps through alloc;
 * front is the front's own state, attached by bs_open_backend: opaque, never touched. */
struct bs_db {
  const bs_db_vtable *vt;
  bs_allocator alloc; /* all three functions set (libc's when the host gave none) */
  unsigned flags;     /* BS_OPEN_NOSYNC, BS_OPEN_RDONLY */
  struct bs__db_front *front;
};

/* Hands a backend's freshly constructed database to the front: checks db (vt of version 2 or
 * later, with destroy; alloc all set or all NULL for libc), attaches the front's state (the
 * checksum cache sized by opts->checksum_cache_entries, checkpoint waits; opts may be NULL,
 * else checked as bs_open checks it) and sets *out = db, released by bs_close() (the front's
 * state, then vt->destroy). On failure *out = NULL and db has been destroyed through vt->destroy
 * (when vt has no destroy, nothing can release it: the backend's bug). Errors: BS_EINVAL,
 * BS_ENOMEM.
 * A host's open function ends with `return bs_open_backend(out, &mine->base, opts, err);`. */
BS_API int bs_open_backend(bs_db **out, bs_db *db, const bs_open_options *opts, bs_error *err);

/* ---- One stream ------------------------------------------------------------------------------ */

/* clang-format off */
#define BS_STORAGE_SLOTS(X)                                                                        \
  /* opts resolved: never NULL, no zero bound. The writer returned has vt (with destroy) and       \
   * st = this storage set. */                                                                     \
  X(writer_open, 1, (bs_writer **out, bs_storage *st, const bs_writer_options *opts,               \
                     bs_error *err), (out, st, opts, err))                                         \
  /* buckets arrive sorted by name, deduplicated; opts resolved */                                 \
  X(bucket_data, 1, (int *has_more_out, bs_storage *st, uint64_t checkpoint,                       \
                     const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,     \
                     int (*on_chunk)(const bs_chunk *chunk, void *payload), void *payload,         \
                     bs_error *err),                                                               \
    (has_more_out, st, checkpoint, req, n_req, opts, on_chunk, payload, err))                      \
  /* uncached; the front batches cache misses into one call. generation_out (n entries, may be     \
   * NULL): the bucket's compaction generation, for the cache. */                                  \
  X(checksums, 1, (bs_checksum *out, uint64_t *generation_out, bs_storage *st,                     \
                   uint64_t checkpoint, const bs_val *buckets, size_t n, bs_error *err),           \
    (out, generation_out, st, checkpoint, buckets, n, err))                                        \
  /* checksum/count of ops in (from, to]; *cleared = 1 if the range holds a CLEAR (then out is     \
   * the value at `to` from zero, not a delta). Used by the cache to extend a cached base.         \
   * out, cleared and generation_out have n entries (cleared[i] per bucket); from == to is         \
   * allowed (zero delta: the cache validates an exact hit's generation). Like checksums, it       \
   * answers BS_EINVALIDATED when `to` lies in a bucket's compacted span (contract.md 5.5). */     \
  X(checksum_ranges, 1, (bs_checksum *out, int *cleared, uint64_t *generation_out,                 \
                         bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets,        \
                         size_t n, bs_error *err),                                                 \
    (out, cleared, generation_out, st, from, to, buckets, n, err))                                 \
  /* from <= to; the front reports a kind over the change-record cap (lifecycle.c), or one the     \
   * backend invalidated, as invalidate-all: collecting a kind may stop once it is over the cap */ \
  X(checkpoint_changes, 1, (bs_storage *st, uint64_t from, uint64_t to,                            \
                            int (*fn)(const bs_checkpoint_changes *changes, void *payload),        \
                            void *payload, bs_error *err), (st, from, to, fn, payload, err))       \
  /* lookups arrive deduplicated, each in the place of its first request; a limit of 0 allows      \
   * no row */                                                                                     \
  X(parameter_sets, 1, (bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,      \
                        size_t limit, int (*fn)(const bs_val *params, void *payload),              \
                        void *payload, bs_error *err),                                             \
    (st, checkpoint, lookups, n, limit, fn, payload, err))                                         \
  X(set_write_checkpoint_mode, 1, (bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,    \
                                   bs_error *err), (st, mode, event, err))                         \
  X(create_managed_write_checkpoints, 1, (uint64_t *ids_out, int *should_advance, bs_storage *st,  \
                                          const bs_managed_request *req, size_t n, bs_error *err), \
    (ids_out, should_advance, st, req, n, err))                                                    \
  X(last_write_checkpoint, 1, (uint64_t *id_out, int *found, bs_storage *st, bs_val user_id,       \
                               const bs_head *heads, size_t n_heads, bs_error *err),               \
    (id_out, found, st, user_id, heads, n_heads, err))                                             \
  X(delete_checkpoint_requests_before, 1, (uint64_t *deleted, bs_storage *st, int64_t before_ms,   \
                                           bs_error *err), (deleted, st, before_ms, err))          \
  X(compact, 1, (bs_compact_stats *stats, bs_storage *st, const bs_compact_options *opts,          \
                 bs_error *err), (stats, st, opts, err))                                           \
  X(compact_initial_replication, 1, (uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,    \
                                     uint64_t min_bucket_changes, bs_error *err),                  \
    (buckets_out, st, max_op_id, min_bucket_changes, err))                                         \
  X(get_status, 1, (bs_status *out, bs_storage *st, bs_error *err), (out, st, err))                \
  X(report_error, 1, (bs_storage *st, const char *message, bs_error *err), (st, message, err))     \
  X(clear, 1, (bs_storage *st, bs_error *err), (st, err))                                          \
  X(terminate, 1, (bs_storage *st, int clear, bs_error *err), (st, clear, err))                    \
  X(list_buckets, 1, (bs_storage *st, bs_val start_after,                                          \
                      int (*fn)(const bs_bucket_info *info, void *payload), void *payload,         \
                      bs_error *err), (st, start_after, fn, payload, err))                         \
  /* Version 2. bs_wait_checkpoint for a backend whose commits from other processes or hosts can   \
   * wake a waiter (PostgreSQL: LISTEN/NOTIFY): blocks until the stream's checkpoint differs from  \
   * known (bs__checkpoint_differs: op id or LSN) or timeout_ms passes, and sets *out to the       \
   * current one. known is never NULL. NULL slot: the front polls get_status. */                   \
  X(wait_checkpoint, 2, (bs_checkpoint *out, bs_storage *st, const bs_checkpoint *known,           \
                         uint64_t timeout_ms, bs_error *err), (out, st, known, timeout_ms, err))   \
  /* Version 3. The writer lock of this stream's writers of one kind (snapshot 0: streaming, 1:    \
   * snapshot), which keeps storage.h's one writer per stream and kind: lock 1 takes it, or        \
   * answers BS_EBUSY while it is held, by this or another handle, process or host (the front      \
   * words the message); lock 0 releases it and cannot fail (err is NULL). The front takes it      \
   * before writer_open and releases it after the writer's destroy (or a failed writer_open), so   \
   * writer_open and every writer call run with it held. NULL slot: nothing excludes a second      \
   * writer of the backend's streams. */                                                           \
  X(writer_lock, 3, (bs_storage *st, int snapshot, int lock, bs_error *err),                       \
    (st, snapshot, lock, err))
/* clang-format on */

typedef struct bs_storage_vtable {
  unsigned version;
  void (*destroy)(bs_storage *st); /* mandatory */
  BS_STORAGE_SLOTS(BS_SLOT_MEMBER)
} bs_storage_vtable;

/* The base every storage begins with. db: the owning database (NULL for a free-standing
 * storage: the front then has no checksum cache and no read-only flag for it). */
struct bs_storage {
  const bs_storage_vtable *vt;
  bs_db *db;
  uint32_t stream_id;
};

/* ---- One writer ------------------------------------------------------------------------------ */

/* What the front queued since the last flush (bs_writer_save, bs_writer_custom_write_checkpoint*):
 * the front copies and queues; a backend never does. A batch is borrowed for the slot's call. */

/* A queued custom write checkpoint. user_id and event are present (data never NULL). */
typedef struct bs_queued_wcp {
  bs_val user_id, event;
  uint64_t checkpoint;
  int64_t requested_at_ms; /* < 0: persistent (no requested_at) */
} bs_queued_wcp;

/* One queued call: exactly one of save and wcp is set. A save is the front's verbatim copy of
 * the caller's, checked against storage.h's limits; a DELETE's after_id is kept as given. */
typedef struct bs_write_item {
  const bs_save *save;
  const bs_queued_wcp *wcp;
} bs_write_item;

/* The queue in call order; n may be 0. */
typedef struct bs_write_batch {
  const bs_write_item *items;
  size_t n;
} bs_write_batch;

/* clang-format off */
#define BS_WRITER_SLOTS(X)                                                                         \
  /* Applies batch in ONE transaction, all of it or (on failure) nothing; an empty batch writes    \
   * nothing but is refused on a terminated stream like any other. *last_op_out: the stream's op   \
   * head afterwards. The auto-flush bounds are the front's: a backend never flushes on its        \
   * own. */                                                                                       \
  X(flush, 1, (uint64_t *last_op_out, bs_writer *w, const bs_write_batch *batch, bs_error *err),   \
    (last_op_out, w, batch, err))                                                                  \
  /* Persists a truncate (drop: and forgets the table) at once; the front has flushed what was     \
   * queued before it (contract.md 4.2). */                                                        \
  X(truncate, 1, (bs_writer *w, bs_val table, int drop, bs_error *err), (w, table, drop, err))     \
  /* Applies batch and then commits at lsn, in one transaction. create_empty: 0 or 1 (the front    \
   * resolved -1, the writer's own setting in bs_writer_options). */                               \
  X(commit, 1, (bs_commit_result *out, bs_writer *w, const bs_write_batch *batch, bs_val lsn,      \
                int create_empty, bs_error *err), (out, w, batch, lsn, create_empty, err))         \
  X(snapshot_done, 1, (bs_writer *w, bs_val lsn, bs_error *err), (w, lsn, err))                    \
  X(resume_lsn, 1, (bs_writer *w, bs_val lsn, bs_error *err), (w, lsn, err))                       \
  /* The row's stored data as if batch (not flushed yet) were applied. */                          \
  X(source_row, 1, (bs_writer *w, const bs_write_batch *batch, bs_val table, bs_val replica_id,    \
                    int (*fn)(const bs_val *data, void *payload), void *payload, bs_error *err),   \
    (w, batch, table, replica_id, fn, payload, err))
/* clang-format on */

typedef struct bs_writer_vtable {
  unsigned version;
  void (*destroy)(bs_writer *w); /* mandatory */
  BS_WRITER_SLOTS(BS_SLOT_MEMBER)
} bs_writer_vtable;

/* The base every writer begins with. st: the storage it writes (set by the backend's
 * writer_open). front: the front's state (options, the queue): opaque. */
struct bs_writer {
  const bs_writer_vtable *vt;
  bs_storage *st;
  struct bs__writer_front *front;
};

#ifdef __cplusplus
}
#endif
#endif /* BUCKETSTORE_STORAGE_BACKEND_H */
