/*
 * pg_internal.h: what the PostgreSQL backend's files (pg*.c) share: the schema, the
 * handles, the connection pool and the libpq helpers. The only header that includes
 * <libpq-fe.h>: the front, the rules and the other backends compile without it (make
 * layercheck), and a build without PG=1 has no pg*.c at all.
 */
#ifndef BUCKETSTORE_PG_INTERNAL_H
#define BUCKETSTORE_PG_INTERNAL_H

#include "internal.h"

#include <libpq-events.h>
#include <libpq-fe.h>

/* =================================================================================================
 * Schema (pg_format.c creates it and migrates it; bs_meta 'schema_version' is the number of migration
 * steps applied, BS_PG_SCHEMA_VERSION this build's; a newer one is refused with BS_ECORRUPT).
 * Tables live in one schema, resolved once at open (bs__pg_schema_resolve) from the URL's
 * search_path: the first of its schemas that holds bs_meta, else its current schema (the first
 * that exists). Every session then runs with search_path = pg_catalog, <schema>, pg_temp, so no
 * other schema's functions or operators can stand in for pg_catalog's (a role with CREATE on
 * public could otherwise run its code as the service's role), and the advisory lock keys and
 * the notification channel derive from the schema's oid. One PostgreSQL database can so hold
 * several bucketstore databases (the tests give each its own schema with
 * ?options=-csearch_path%3Dname).
 *
 *  table       key                               columns
 *  bs_meta     key text                          value bigint ('schema_version')
 *  bs_streams  id int (1, 2, ...)                the stream record: name, state, hash, created_ms,
 *                                                snapshot_done, op_head, checkpoint,
 *                                                last_checkpoint_op, checkpoint_lsn, resume_lsn,
 *                                                no_checkpoint_before (NULL = not set),
 *                                                param_horizon, changes_fence, last_error
 *  bs_buckets  (stream, name)                    id bigint (identity, database-wide) and the
 *                                                bucket state: running checksum (0..2^32-1) and
 *                                                count over every persisted op, bytes, last_op,
 *                                                generation, clear_start/clear_op (the torn span
 *                                                of contract.md 5.5), compacted_count/_op,
 *                                                max_op_bytes (no op of the bucket has more
 *                                                payload bytes, bs__pg_op_bytes: the writer
 *                                                raises it, compaction leaves it an upper bound;
 *                                                it sizes bucket_data's pages of chunks)
 *  bs_chunks   (bucket id, last_op)              a bucket's ops in runs (schema 8; "Op chunks"
 *                                                below): first_op, n, checksum (the run's sum,
 *                                                the 32-bit value stored signed, cast back by
 *                                                the readers; sums keep their low 32 bits), ops
 *                                                (opchunk.c's encoding). The primary key is the
 *                                                read order: bucket_data walks a bucket's chunks
 *                                                from the one holding after + 1, checksums add
 *                                                the sums of the chunks above C (never a SUM over
 *                                                history) and decode the one C cuts. Schema 1-7
 *                                                held an op a row: bs_ops (bucket id, op_id),
 *                                                type, checksum, target_op, object_type,
 *                                                object_id, subkey, data, which migration 8 reads
 *                                                (BS_PG_OP_COLS) and drops
 *  bs_params   (stream, lookup, op_id)           table_id, replica_id, n (rows; 0 = tombstone),
 *                                                rows bytea[]
 *  bs_changes  (stream, op_id, seq)              one per flush or checkpoint, keyed by the highest
 *                                                op id it covers: first_op (op_id + 1 when it
 *                                                covers none; op_id at the last op id, 2^63 - 1,
 *                                                where no int8 is above: such a record names no
 *                                                bucket or lookup, so the reads see the same),
 *                                                flags (1 checkpoint,
 *                                                2 too many buckets, 4 too many lookups),
 *                                                buckets/lookups/users bytea[]
 *  bs_wcp_managed (user_id)                      database-wide managed write checkpoints: id,
 *                                                head_conns/head_lsns bytea[] (one head each),
 *                                                requested_at (NULL: a generated id), processed,
 *                                                processed_lsn, gone (deleted by cleanup: kept as
 *                                                the user's high-water mark, invisible to reads)
 *  bs_wcp_custom (stream, event, user_id)        custom write checkpoints: value, requested_at
 *                                                (NULL: persistent, owned by the source)
 *  bs_tables   (stream, name)                    id: 1, 2, ... per stream (bs_streams.next_table_id),
 *                                                the table's name in bs_params.table_id; key
 *                                                (schema 9): database-wide (an identity), the
 *                                                table in bs_source's key
 *  bs_source   (tkey, replica_id)                the source record of table key tkey
 *                                                (bs_tables.key): mark (contract.md 4.3; NULL
 *                                                unless soft-deleted), members (pg_codec.c's
 *                                                encoding of the memberships and lookup keys:
 *                                                varints since schema 5, an object_id equal to
 *                                                the replica id in one byte since schema 7, the
 *                                                counts in a head byte and a first object type
 *                                                equal to the table's name not spelled out since
 *                                                schema 9), data (NULL when the record has none;
 *                                                before schema 7 also soft and has_data columns;
 *                                                before schema 9 keyed (stream, table_id,
 *                                                replica_id))
 *  bs_superseded (stream, bucket, first_new)     pairs: the writer's log (incremental
 *                                                compaction consumes it) of one flush in one
 *                                                bucket, at most BS_PG_SUP_ROW entries (old_op,
 *                                                new_op: the op of the same row that replaced
 *                                                old_op), ascending by old op, in varints
 *                                                (bs__pg_sups_put; first_new is at most every
 *                                                entry's new op; one row per entry before schema
 *                                                6); bs_changes.time_ms: a
 *                                                checkpoint's time (ms since the epoch);
 *                                                bs_streams.param_cursor: parameter compaction
 *                                                is complete at or below it
 * Byte strings are bytea: PostgreSQL compares them as memcmp with the shorter prefix first,
 * the order of bs__val_cmp, so ORDER BY name is the order storage.h promises.
 * ================================================================================================= */
#define BS_PG_SCHEMA_VERSION 9

/* The one schema of a handle (bs__pg_schema_resolve). */
typedef struct bs__pg_schema {
  uint32_t oid;       /* pg_namespace.oid: the first key of every advisory lock (bs__pg_arg_lock) */
  char quoted[130];   /* its name quoted as an identifier (at most 63 bytes, quotes doubled) */
  char channel[24];   /* the checkpoint notification channel, bs_cp_<oid> */
  char set_path[200]; /* SET search_path = pg_catalog, <quoted>, pg_temp */
} bs__pg_schema;

/* Resolves the schema (above) of c, which still has the URL's search_path, with a statement
 * that names pg_catalog's objects explicitly (the caller then runs out->set_path on c).
 * BS_ENOTFOUND when no schema of the search_path exists. */
int bs__pg_schema_resolve(PGconn *c, bs__pg_schema *out, bs_error *err);

/* The oldest server the backend runs on (PQserverVersion's form): 14, for
 * pg_terminate_backend(pid, timeout) (pg_write.c). */
#define BS_PG_MIN_SERVER 140000
/* BS_OK, or BS_EUNSUPPORTED naming the server's version and the oldest supported. */
int bs__pg_check_server(int version, bs_error *err);

/* Connections of a handle's pool when bs_open_options.pg_max_connections is 0. */
#define BS_PG_MAX_CONNECTIONS 10u

typedef struct bs__pg_db {
  bs_db base;
  char *url;
  bs__pg_schema schema;
  /* The pool: a call takes a connection (an idle one, else a new one while fewer than max_conns
   * are open, else it waits on pool_cv) and gives it back. n_conns counts the connections idle
   * or in a call; the sessions held across calls (writers', ANALYZEs, bs__pg_conn_detach) and
   * the LISTEN connection are not among them. All guarded by pool_mu. */
  int sync_ready; /* the mutexes and conditions below are initialised */
  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv; /* a connection went back to the pool or was closed */
  PGconn **idle;          /* max_conns entries */
  size_t n_idle, n_conns, max_conns;
  /* The handle's one LISTEN connection, shared by every bs_wait_checkpoint (pg.c): opened by the
   * first wait, kept until the close. One waiter at a time reads its socket (polling); the
   * others wait on cv for the notifications it counts (gen). A lost connection ends every wait
   * that used it with BS_EIO (lost, epoch); the next wait opens a new one. Guarded by mu. */
  struct bs__pg_listener {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* gen or epoch changed, or the poller left */
    PGconn *c;
    int polling;
    uint64_t gen, epoch;
    bs_error lost;
  } listen;
  /* The writer sessions of this handle (pg_write.c): one per (stream, kind) holds the stream's
   * advisory writer lock and runs every statement of the handle's writer of that kind, so a
   * commit runs in the session that holds the lock (a session the server drops takes its lock
   * and its open transaction with it). The list is guarded by pool_mu, c by mu (taken before
   * pool_mu); a lock is listed from before its session opens until after it ended. */
  struct bs__pg_lock {
    int32_t key;
    uint32_t stream;
    int snapshot;
    PGconn *c;          /* NULL after a loss, until the next call reconnects and locks again */
    int pid;            /* the server process of the last session (c's), 0 before the first */
    pthread_mutex_t mu; /* held by a writer's call for its whole use of c */
  } * *locks;
  size_t n_locks, cap_locks;
  /* A test seam (tests/test_pg_fault.c): called at the backend's named points (bs__pg_hook
   * below) in the calling thread; NULL outside the tests. */
  void (*hook)(const char *point, PGconn *c, void *payload);
  void *hook_payload;
} bs__pg_db;

typedef struct bs__pg_storage {
  bs_storage base;
  bs__pg_db *db;
  pthread_mutex_t mu; /* guards the write-checkpoint mode, a per-handle setting */
  bs_write_checkpoint_mode mode;
  size_t event_size;
  unsigned char event[255];
  /* the stream's op head as this handle's writers last saw it committed, and bs_meta's
   * history_epoch then (-1: nothing seen yet); guarded by mu (bs__pg_head_seen) */
  uint64_t seen_head;
  int64_t seen_epoch;
} bs__pg_storage;

/* A writer runs its statements in its lock's session (pg_write.c): c is lock->c during a call
 * (set by writer_conn, lock->mu held). */
typedef struct bs__pg_writer {
  bs_writer base;
  bs__pg_db *db;
  struct bs__pg_lock *lock;
  PGconn *c;
  int snapshot;
  uint64_t written, analyze_at; /* ops and records this writer wrote; the next ANALYZE at */
  PGconn *analyzing; /* a pool session running the writer's last ANALYZE (pg_write.c), or NULL */
  /* a COMMIT whose reply was lost and whose outcome the server could not tell yet: its
   * transaction id (pg_write.c, commit_outcome); 0 when none */
  int64_t doubt;
} bs__pg_writer;

/* The bytes an op adds to its bucket's running bytes (bs_buckets.bytes): its payload fields. */
static inline uint64_t bs__pg_op_bytes(const bs_op *op) {
  return (uint64_t)op->object_type.size + op->object_id.size + op->subkey.size + op->data.size;
}

/* ---- Checkpoint notification ----
 * A commit that makes a checkpoint sends pg_notify(schema.channel, stream id) in its
 * transaction; bs_wait_checkpoint LISTENs on that channel (pg.c), so a commit on any host wakes
 * it. One channel per schema. */

/* ---- Advisory locks ----
 * Two int4 keys (a 64-bit key): the schema's oid, unique in the database, so two bucketstore
 * databases in one PostgreSQL database never share a lock; then the stream and the lock's kind
 * (bs__pg_arg_lock: stream * 4 + kind, stream ids being far below 2^30, one per deploy; the
 * schema-wide locks use stream 0). */
enum {
  BS_PG_LOCK_WRITER,   /* a stream's streaming writer (pg_write.c) */
  BS_PG_LOCK_SNAPSHOT, /* a stream's snapshot writer */
  BS_PG_LOCK_COMPACT,  /* a stream's compaction (pg_compact.c) */
  BS_PG_LOCK_SCHEMA    /* stream 0: the migrations (pg_format.c); 1: managed write checkpoints;
                        * 2: stream creation (pg.c) */
};
static inline int32_t bs__pg_lock_key(uint32_t stream, int kind) {
  return (int32_t)(stream << 2 | (uint32_t)kind);
}

/* The test seam: calls db->hook (when set) with point and the connection in use. Points:
 * "wait" (a checkpoint waiter is about to block: on the LISTEN connection's socket, or on the
 * other waiters' condition, c that connection; or to sleep on a hot standby, c its own),
 * "pool.wait" (a call is about to wait for a connection of the pool: max_conns are in use),
 * "flush.loaded" (a flush read the source records and buckets its queue needs, nothing written
 * yet), "flush" (a flush's statements ran, its COMMIT not sent yet), "commit" (a commit's queue
 * applied in its transaction, the checkpoint not made yet), "commit.sent" (a flush's or
 * commit's COMMIT sent, its reply not read yet), "writer.lock" (a writer session got its
 * advisory lock), "writer.unlock" (a writer closes: its lock's session is about to unlock),
 * "analyze" (a writer's ANALYZE sent on a session of its own, not waited for), "open.probe" (an
 * open between two statements on c that see its server process, pg.c refuse_pooler),
 * "verify.buckets" (bs_db_verify's row checks ran in its transaction, its bucket walk not
 * begun). */
void bs__pg_hook(bs__pg_db *db, const char *point, PGconn *c);
/* Sets the seam of a PostgreSQL bs_db (tests only; not thread-safe: set it before use). */
void bs__pg_set_hook(bs_db *db, void (*fn)(const char *point, PGconn *c, void *payload),
                     void *payload);
/* The seam every handle opened afterwards starts with, from its open on (tests only; NULL: none;
 * not thread-safe: no open may run meanwhile). */
void bs__pg_set_open_hook(void (*fn)(const char *point, PGconn *c, void *payload), void *payload);
/* Brings c's schema (bs__pg_schema_resolve) to version `to` (at most BS_PG_SCHEMA_VERSION;
 * open takes this build's), in one transaction. Tests build an older schema with it, to migrate
 * it afterwards. */
int bs__pg_migrate(PGconn *c, int64_t to, bs_error *err);
/* An open's schema check on c (db->schema resolved): a read-write open refuses a hot standby,
 * migrates the schema to this build's version and records the server's history; a read-only
 * one, or one with BS_OPEN_NOMIGRATE, needs the schema at this build's version. */
int bs__pg_check_schema(bs__pg_db *db, PGconn *c, bs_error *err);

/* ---- Connections (pg_conn.c, as the statements below) ---- */
/* A new connection to db's server, set up for the backend (its schema, generic plans), outside
 * the pool (the LISTEN connection of pg.c). */
int bs__pg_conn_open(bs__pg_db *db, PGconn **out, bs_error *err);
/* Is idle connection c still there? One the server ended (pg_terminate_backend, a restart) has
 * its last message and the end of the stream waiting on the socket: read without blocking. */
int bs__pg_conn_alive(PGconn *c);
/* A live connection of the pool (or a new one), idle (no transaction open); waits while
 * max_conns are in use (the "pool.wait" point before the first wait, c NULL). */
int bs__pg_conn_get(bs__pg_db *db, PGconn **out, bs_error *err);
/* The same without waiting: BS_EBUSY (no message) while max_conns are in use. */
int bs__pg_conn_try(bs__pg_db *db, PGconn **out);
/* Gives c back: kept when it is healthy and idle, else closed. NULL is a no-op. */
void bs__pg_conn_put(bs__pg_db *db, PGconn *c);
/* Closes c, a connection of the pool, whatever its state (its session's locks go with it). NULL
 * is a no-op. */
void bs__pg_conn_drop(bs__pg_db *db, PGconn *c);
/* A connection taken from the pool that outlives the call (a writer's session, an ANALYZE not
 * waited for) leaves the pool's count, so that sessions held across calls never starve the calls
 * (a thread holding a writer then waiting for a connection only its own next call would free);
 * it is closed with PQfinish, or given back with _adopt (kept idle when the pool has room). */
void bs__pg_conn_detach(bs__pg_db *db);
void bs__pg_conn_adopt(bs__pg_db *db, PGconn *c);

/* ---- Statements ---- */
/* Parameters of one statement, sent in binary (integers big-endian, bytea raw). */
#define BS_PG_MAX_ARGS 16
typedef struct bs__pg_args {
  int n;
  const char *values[BS_PG_MAX_ARGS];
  int lengths[BS_PG_MAX_ARGS];
  int formats[BS_PG_MAX_ARGS];
  Oid types[BS_PG_MAX_ARGS];
  unsigned char ints[BS_PG_MAX_ARGS][8];
} bs__pg_args;
void bs__pg_arg_i64(bs__pg_args *a, int64_t v);
void bs__pg_arg_i32(bs__pg_args *a, int32_t v);
void bs__pg_arg_bool(bs__pg_args *a, int v);
/* text (s borrowed until the statement ran) */
void bs__pg_arg_text(bs__pg_args *a, const char *s);
/* The two int4 keys of an advisory lock of schema s (above): pg_advisory_lock($n, $n+1). */
void bs__pg_arg_lock(bs__pg_args *a, const bs__pg_schema *s, uint32_t stream, int kind);
/* bytea: v.data NULL is SQL NULL (an absent value), {"" , 0} the empty string */
void bs__pg_arg_bytes(bs__pg_args *a, bs_val v);
/* A map of stream states (lifecycle.c: bs__stream_step.others, bs__stream_map) as int2[] text,
 * written into buf: a statement moves a row with `state = ($n::text::int2[])[state]` (arrays
 * start at 1, as the states do), so the SQL holds no state number of its own. */
#define BS_PG_STATES_TEXT 32
void bs__pg_arg_states(bs__pg_args *a, const uint8_t map[BS__STREAM_STATES],
                       char buf[BS_PG_STATES_TEXT]);

/* bytea[] of the n values (one-dimensional; {NULL, 0} elements are SQL NULL), encoded into
 * *buf (allocated from a; the caller frees it after the statement). BS_ENOMEM, BS_ETOOBIG
 * (over 1 GiB). */
int bs__pg_arg_bytes_array(bs__pg_args *a, const bs_val *v, size_t n, const bs_allocator *al,
                           unsigned char **buf, bs_error *err);

/* int8[] of the n values, likewise. */
int bs__pg_arg_i64_array(bs__pg_args *a, const uint64_t *v, size_t n, const bs_allocator *al,
                         unsigned char **buf, bs_error *err);

/* A binary bytea[] result value, walked element by element (borrowed from the result). */
typedef struct bs__pg_array {
  const unsigned char *p, *end;
  uint32_t n, i;
} bs__pg_array;
/* BS_ECORRUPT (err may be NULL) when v is not a one-dimensional (or empty) array. */
int bs__pg_array_open(bs_val v, bs__pg_array *it, bs_error *err);
/* 1 and the next element (a NULL element: {NULL, 0}), 0 after the last, BS_ECORRUPT. */
int bs__pg_array_next(bs__pg_array *it, bs_val *out);

/* Runs sql with args (may be NULL) and binary results. BS_OK with *res (PQclear it) when the
 * server answered PGRES_COMMAND_OK or PGRES_TUPLES_OK; else the error mapped (bs__pg_fail),
 * *res NULL. what names the statement in the message. */
int bs__pg_exec(PGconn *c, const char *sql, const bs__pg_args *args, PGresult **res,
                const char *what, bs_error *err);
/* sql with its integer arguments (int4, int8, bool) written into it as literals, run without
 * parameters, so the server plans it for these values (the sessions force generic plans on
 * parameterized statements): for a statement whose best plan depends on them, a range of
 * bs_changes whose size only the values tell. BS_EINVAL for another argument type (a bug). */
int bs__pg_exec_custom(PGconn *c, const char *sql, const bs__pg_args *args, PGresult **res,
                       const char *what, bs_error *err);
/* A hot statement, prepared once per session (at its first use there: PQprepare with the
 * parameter types of that use, the same at every use) and then executed by name, so that it is
 * planned once per session instead of at every call (about 0.2 ms, as much as a checksum's
 * execution). id: its bit in the session's set of prepared statements (pg_conn.c keeps the set with
 * the connection: a new session, also after a loss, prepares again), unique per statement. */
typedef struct bs__pg_stmt {
  int id;
  const char *sql;
} bs__pg_stmt;
enum {
  BS_PG_STMT_STATES,          /* pg_read.c bucket_states */
  BS_PG_STMT_PAGE,            /* pg_read.c read_bucket */
  BS_PG_STMT_PARAMS,          /* pg_read.c parameter sets */
  BS_PG_STMT_CHANGES,         /* pg_read.c checkpoint changes */
  BS_PG_STMT_STREAM,          /* pg.c stream_read: get_status, the checkpoint waits */
  BS_PG_STMT_BATCH_OPEN,      /* pg_save.c batch_open */
  BS_PG_STMT_TABLE,           /* pg_save.c resolve_tables */
  BS_PG_STMT_RECORDS,         /* pg_save.c load_records */
  BS_PG_STMT_BUCKETS,         /* pg_save.c load_batch */
  BS_PG_STMT_RESERVE,         /* pg_save.c reserve_ids */
  BS_PG_STMT_BK_CREATE,       /* pg_save.c create_buckets */
  BS_PG_STMT_REC_DELETE,      /* pg_save.c delete_records */
  BS_PG_STMT_REC_UPDATE,      /* pg_save.c update_records */
  BS_PG_STMT_BK_UPDATE,       /* pg_save.c write_buckets */
  BS_PG_STMT_BK_CHANGES,      /* pg_save.c write_buckets */
  BS_PG_STMT_OP_HEAD,         /* pg_save.c batch_write */
  BS_PG_STMT_COMMIT_READ,     /* pg_write.c commit_locked */
  BS_PG_STMT_CHECKPOINT_MAKE, /* pg_write.c make_checkpoint */
  BS_PG_STMT_RESUME,          /* pg_write.c commit_locked */
  BS_PG_STMT_N
};
/* bs__pg_exec of a hot statement (args may be NULL). On a connection that no pool opened, it
 * runs unprepared. */
int bs__pg_execp(PGconn *c, const bs__pg_stmt *s, const bs__pg_args *args, PGresult **res,
                 const char *what, bs_error *err);
/* bs__pg_execp without a result. */
int bs__pg_runp(PGconn *c, const bs__pg_stmt *s, const bs__pg_args *args, const char *what,
                bs_error *err);

/* bs__pg_exec without a result; without args, sql may be several statements. */
int bs__pg_run(PGconn *c, const char *sql, const bs__pg_args *args, const char *what,
               bs_error *err);
/* Maps a failed result (res may be NULL: the connection's error) to a status: BS_EBUSY for a
 * lock that was not available or a serialization failure, BS_EIO otherwise, with libpq's
 * message and the SQLSTATE. */
int bs__pg_fail(PGconn *c, const PGresult *res, const char *what, bs_error *err);

/* Binary result columns. */
int64_t bs__pg_i64(const PGresult *r, int row, int col);
int32_t bs__pg_i32(const PGresult *r, int row, int col);
int bs__pg_i16(const PGresult *r, int row, int col);
int bs__pg_bool(const PGresult *r, int row, int col);
/* bytea: SQL NULL gives {NULL, 0}; an empty value a non-NULL data with size 0 */
bs_val bs__pg_bytes(const PGresult *r, int row, int col);

/* Transactions: BEGIN (read-only ones REPEATABLE READ, so a read call sees one snapshot; a
 * read-write one only for the migrations: the handle's writes begin with bs__pg_begin_write),
 * COMMIT, and ROLLBACK (which never fails: a broken connection is closed by conn_put). */
int bs__pg_begin(PGconn *c, int read_only, bs_error *err);
/* BEGIN of a write transaction of the handle (every one but the migrations'), in one round trip:
 * the schema's migration lock taken shared for the transaction (a migration takes it exclusive:
 * it waits for the write transactions that began before it, and those after it wait for it),
 * then the schema version read, which must still be this build's (bs__pg_schema_current), so a
 * process left running at the old version after a newer build migrated the schema writes
 * nothing. xid (NULL: not wanted) = the transaction's id (txid_current). On failure no
 * transaction is left open. */
int bs__pg_begin_write(bs__pg_db *db, PGconn *c, int64_t *xid, bs_error *err);
/* The data's history: the server's system identifier, the timeline it writes on, and the OID of
 * bs_meta, the table that records them. A point-in-time recovery and a standby's promotion both
 * start a new timeline; a copy of the data in another cluster has another system identifier; a
 * dump restored (pg_dump, then psql or pg_restore), into the same cluster too, creates new
 * tables, with new OIDs, and copies the recorded one. */
#define HISTORY_SQL                                                                                \
  "(SELECT system_identifier FROM pg_control_system()),"                                           \
  " ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,"                \
  " (SELECT tableoid::bigint FROM bs_meta WHERE key = 'schema_version')"

/* BS_OK when schema version v is this build's, else BS_ECORRUPT: newer ("upgrade bucketstore")
 * or older. */
int bs__pg_schema_current(int64_t v, bs_error *err);
int bs__pg_commit(PGconn *c, bs_error *err);
void bs__pg_rollback(PGconn *c);

/* ---- The codec (pg_codec.c) ----
 * How the C values are stored in the rows of the schema above. A statement names the columns of
 * a stored thing by its list and reads its rows with its decoder, so a stored field changes
 * here, in pg_codec.c and in a migration (pg_format.c). */

/* The SQL spelling of a C enum value, for the text of a statement ("type = " BS_PG_SQL_MOVE).
 * Each is listed by bs__pg_enums with the C value it spells; tests/test_pg.c t_codec_enums fails
 * when the server reads a spelling as another value, or a C value has none. Stream states have
 * none: the statements take them as parameters (bs__pg_arg_states), as lifecycle.c decides. */
#define BS_PG_SQL_PUT    "1" /* bs_op_type */
#define BS_PG_SQL_REMOVE "2"
#define BS_PG_SQL_MOVE   "3"
#define BS_PG_SQL_CLEAR  "4"
/* bs_changes.flags: bits */
enum {
  BS_PG_CHG_CHECKPOINT = 1, /* the record of a checkpoint */
  BS_PG_CHG_BUCKETS = 2,    /* too many buckets (bs__changes_too_many): left empty */
  BS_PG_CHG_LOOKUPS = 4     /* the same for lookups */
};
#define BS_PG_SQL_CHG_CHECKPOINT "1"
#define BS_PG_SQL_CHG_BUCKETS    "2"
#define BS_PG_SQL_CHG_LOOKUPS    "4"
/* An op chunk's header (internal.h, "Op chunks") as the server reads it from a bytea: its flags
 * byte, the last of the header (1-based, as substring counts: BS_CHUNK_HDR), and the flag of a
 * chunk that holds a CLEAR (pg_read.c's checksum ranges: "cleared"). */
#define BS_PG_SQL_CHUNK_FLAGS_AT "21"
#define BS_PG_SQL_CHUNK_CLEAR    "1"
typedef struct bs__pg_enum {
  const char *what, *sql;
  int value;
} bs__pg_enum;
const bs__pg_enum *bs__pg_enums(void); /* the list; the last has what NULL */
/* bs__heads_passed at a commit (rules.c, bs__managed_commit) as SQL over a managed row's
 * head_lsns and the commit's LSN, $3: every head lsn <= the commit's, none too. The checkpoint's
 * statement applies it (pg_write.c); tests/test_pg.c t_heads_passed checks it against the C rule. */
#define BS_PG_SQL_HEADS_PASSED "(SELECT bool_and(h <= $3) FROM unnest(head_lsns) AS h) IS NOT FALSE"

/* Schema 7's op rows (bs_ops), which migration 8 reads into chunks (pg_format.c) and the tests
 * write to build older databases: its columns but the key and data, in bs_op's order
 * (BS_PG_OP_COLS; tests/test_pg.c t_codec_ops fails when bs_ops has a column the list does not
 * name). bs__pg_op_row reads the op of row's columns col.. (data: column col + BS_PG_OP_NCOLS is
 * its data; else the op has none), borrowed from r. bs__pg_op_copy appends the op's row to a
 * COPY stream of BS_PG_OP_COPY, its payload columns NULL where bs__op_fields says the op's type
 * carries none. */
#define BS_PG_OP_COLS  "op_id, type, checksum, target_op, object_type, object_id, subkey"
#define BS_PG_OP_NCOLS 7
#define BS_PG_OP_COPY  "COPY bs_ops (bucket, " BS_PG_OP_COLS ", data) FROM STDIN (FORMAT binary)"
bs_op bs__pg_op_row(const PGresult *r, int row, int col, int data);

/* A source record's columns (bs_source) but its data: replica_id, mark (NULL: not soft-deleted),
 * members (bs__pg_srec_encode's), whether it has data. bs__pg_source_row reads the record of
 * row's columns col.. into out (exists 1; data: column col + BS_PG_SOURCE_NCOLS is its data),
 * table the name of its table (the members' first object type may be it), strings borrowed
 * from r and table, out->m and out->lk allocated from a (the caller frees them; both NULL after
 * a failure). BS_ECORRUPT (the members do not decode), BS_ENOMEM. bs__pg_source_copy appends
 * a record of the table of key tkey (bs_tables.key) and name table to a COPY stream of
 * BS_PG_SOURCE_COPY. */
#define BS_PG_SOURCE_COLS  "replica_id, mark, members, data IS NOT NULL"
#define BS_PG_SOURCE_NCOLS 4
#define BS_PG_SOURCE_COPY_INTO(t)                                                                  \
  "COPY " t " (mark, tkey, replica_id, members, data) FROM STDIN (FORMAT binary)"
#define BS_PG_SOURCE_COPY BS_PG_SOURCE_COPY_INTO("bs_source")
int bs__pg_source_row(bs__srec *out, const bs_allocator *a, const PGresult *r, int row, int col,
                      int data, bs_val table);

/* The stream row (bs_streams): its identity and the state every call reads, whole: a statement
 * selects BS_PG_STREAM_COLS (then columns of its own, from BS_PG_STREAM_NCOLS on) and
 * bs__pg_stream_row reads row `row` of r (strings borrowed from r). The hot read, get_status
 * (the front answers bs_get_checkpoint from it, per client poll), is a prepared statement: the
 * server's CPU per call is then about that of a prepared read of the checkpoint's two columns
 * alone (13 against 11.5 us; unprepared, the whole row took 31 us). created_ms and next_table_id
 * are not in the list: no call reads them back (pg_save.c takes table ids with an UPDATE). A
 * stored row: "UPDATE bs_streams SET " BS_PG_STREAM_SET " WHERE id = $1", its parameters $2..
 * appended by bs__pg_stream_args (lifecycle.c's fields: a clear or terminate, pg.c).
 * tests/test_pg.c t_codec_stream fails when a list and its decoder or encoder disagree, or the
 * table has a column the list lacks. */
#define BS_PG_STREAM_COLS                                                                          \
  "checkpoint, checkpoint_lsn, id, name, hash, state, snapshot_done, op_head, last_checkpoint_op," \
  " resume_lsn, no_checkpoint_before, param_horizon, param_cursor, changes_fence, last_error"
#define BS_PG_STREAM_NCOLS 15
#define BS_PG_STREAM_SET                                                                           \
  "state = $2, snapshot_done = $3, op_head = $4, checkpoint = $5, last_checkpoint_op = $6,"        \
  " checkpoint_lsn = $7, resume_lsn = $8, no_checkpoint_before = $9, param_horizon = $10,"         \
  " param_cursor = $11, changes_fence = $12"
typedef struct bs__pg_stream {
  uint32_t id;
  bs_val name;
  bs_hash hash;
  bs__stream_row row; /* compact_horizon is LMDB's: 0 here */
  bs_val last_error;
} bs__pg_stream;
bs__pg_stream bs__pg_stream_row(const PGresult *r, int row);
void bs__pg_stream_args(bs__pg_args *a, const bs__stream_row *w);

/* A growing byte buffer: a binary COPY stream's tuples (oom: an allocation failed, the rest was
 * dropped). _room: n more bytes (NULL after a failure; _grow, its slow path, makes room); _int:
 * an integer field of size bytes, _bytes: a bytea field (v.data NULL: SQL NULL), _tuple: a
 * tuple's field count. Inline: the writer appends a few fields per op. */
typedef struct bs__pg_buf {
  unsigned char *p;
  size_t n, cap;
  int oom;
} bs__pg_buf;
unsigned char *bs__pg_buf_grow(bs__pg_buf *b, const bs_allocator *a, size_t n);
static inline unsigned char *bs__pg_buf_room(bs__pg_buf *b, const bs_allocator *a, size_t n) {
  if (b->oom || b->n + n > b->cap) return bs__pg_buf_grow(b, a, n);
  b->n += n;
  return b->p + b->n - n;
}
static inline void bs__pg_copy_int(bs__pg_buf *b, const bs_allocator *a, uint64_t v, int size) {
  unsigned char *p = bs__pg_buf_room(b, a, 4 + (size_t)size);
  if (!p) return;
  bs__put_u32be(p, (uint32_t)size);
  for (int k = 0; k < size; k++) p[4 + k] = (unsigned char)(v >> (8 * (size - 1 - k)));
}
static inline void bs__pg_copy_bytes(bs__pg_buf *b, const bs_allocator *a, bs_val v) {
  unsigned char *p = bs__pg_buf_room(b, a, 4 + (v.data ? v.size : 0));
  if (!p) return;
  bs__put_u32be(p, v.data ? (uint32_t)v.size : 0xffffffffu);
  if (v.size) memcpy(p + 4, v.data, v.size);
}
static inline void bs__pg_copy_tuple(bs__pg_buf *b, const bs_allocator *a, int fields) {
  unsigned char *p = bs__pg_buf_room(b, a, 2);
  if (p) p[0] = (unsigned char)(fields >> 8), p[1] = (unsigned char)fields;
}
void bs__pg_op_copy(bs__pg_buf *b, const bs_allocator *a, uint64_t bucket, uint64_t op_id,
                    const bs_op *op);
void bs__pg_source_copy(bs__pg_buf *b, const bs_allocator *a, uint32_t tkey, bs_val table,
                        bs_val rid, const bs__srec *r);

/* ---- Op chunks (schema 8, pg_chunk.c) ----
 *  bs_chunks   (bucket id, last_op)              first_op, n (its ops), checksum (the wrapping
 *                                                sum of its ops', stored signed), ops (bytea:
 *                                                a chunk of opchunk.c's encoding, internal.h "Op
 *                                                chunks", its op values compact; its header
 *                                                holds n, the sum, first op, bytes and flags).
 * A bucket's chunks never overlap and follow each other in key order: reads walk the index from
 * the chunk holding a position (the first whose last_op is above it); checksums add the sums of
 * chunks wholly in range and decode only the (at most two) chunks its edges cut. */
/* A chunk's bytes with its header, at most (one larger op takes a chunk of its own). */
#define BS_PG_CHUNK_BYTES 4000u
#define BS_PG_CHUNK_COPY                                                                           \
  "COPY bs_chunks (bucket, last_op, first_op, n, checksum, ops) FROM STDIN (FORMAT binary)"
/* A chunk being built for one bucket (its ops ascending): _add an op (op->op_id), _value an op
 * value already in the compact encoding (op NULL) or an op (val NULL) of vs bytes; a chunk that
 * would pass BS_PG_CHUNK_BYTES or BS_CHUNK_MAX_OPS is sealed into rows (a COPY stream of
 * BS_PG_CHUNK_COPY) first; _end seals the last. BS_ENOMEM. */
typedef struct bs__pg_chunkb {
  unsigned char *p;
  size_t n, cap;
  uint32_t nops;
  uint64_t first, last;
} bs__pg_chunkb;
int bs__pg_chunkb_add(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket,
                      const bs_op *op);
int bs__pg_chunkb_value(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket,
                        uint64_t id, const bs_op *op, const unsigned char *val, size_t vs);
int bs__pg_chunkb_end(bs__pg_chunkb *k, const bs_allocator *a, bs__pg_buf *rows, uint64_t bucket);
void bs__pg_chunkb_free(bs__pg_chunkb *k, const bs_allocator *a);
/* A sealed chunk of size bytes whose last op is last, as a row of BS_PG_CHUNK_COPY. */
void bs__pg_chunk_row(bs__pg_buf *rows, const bs_allocator *a, uint64_t bucket,
                      const unsigned char *chunk, size_t size, uint64_t last);
/* A chunk decoded (borrowed from the value): _open checks it whole (BS_ECORRUPT), _op decodes op
 * i in place (fields as bs__op_fields leaves them), _cksum and _is_clear read op i's header. */
typedef struct bs__pg_chunkr {
  const unsigned char *p;
  size_t size;
  unsigned flags;
  uint32_t n;
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS];
} bs__pg_chunkr;
int bs__pg_chunk_open(bs__pg_chunkr *r, bs_val v);
int bs__pg_chunk_op(const bs__pg_chunkr *r, uint32_t i, bs_op *op);
uint32_t bs__pg_chunk_cksum(const bs__pg_chunkr *r, uint32_t i);
int bs__pg_chunk_is_clear(const bs__pg_chunkr *r, uint32_t i);
/* Adds the checksums and count of chunk v's ops in (lo, hi] to *sum and *count, and sets
 * *cleared (when not NULL) if one of them is a CLEAR. v.data NULL: none. BS_ECORRUPT. */
int bs__pg_chunk_range(bs_val v, uint64_t lo, uint64_t hi, uint32_t *sum, uint64_t *count,
                       int *cleared);
/* Calls fn with every chunk of bs_chunks (in a transaction the caller opened: a cursor), those
 * of `where` (SQL over bucket and last_op, args its parameters; NULL: all), in key order,
 * decoded; a chunk that does not decode, or whose last op is not its key's, is BS_ECORRUPT;
 * fn's non-zero return stops the walk and is returned. At most 1,000 chunks in memory. */
int bs__pg_chunks_walk(PGconn *c, const char *where, const bs__pg_args *args,
                       int (*fn)(uint64_t bucket, uint64_t last, const bs__pg_chunkr *ch,
                                 void *payload),
                       void *payload, bs_error *err);
/* Ops of one bucket read from its chunks (compaction's pages), decoded in place: the chunks'
 * results are held until the next read or _clear. bytes[i]: ops[i]'s payload bytes. */
typedef struct bs__pg_opset {
  bs_op *ops;
  uint64_t *bytes;
  size_t n, cap;
  PGresult **held;
  size_t nheld, cheld;
} bs__pg_opset;
void bs__pg_opset_clear(bs__pg_opset *s);
void bs__pg_opset_free(bs__pg_opset *s, const bs_allocator *a);
/* The bucket's ops in [lo, hi], at most limit, ascending (desc: descending from hi). */
int bs__pg_opset_page(PGconn *c, const bs_allocator *a, bs__pg_opset *s, uint64_t bucket,
                      uint64_t lo, uint64_t hi, int desc, size_t limit, bs_error *err);
/* The bucket's ops of ids (n, ascending) that exist, ascending. */
int bs__pg_opset_ids(PGconn *c, const bs_allocator *a, bs__pg_opset *s, uint64_t bucket,
                     const uint64_t *ids, size_t n, bs_error *err);
/* Compaction's changes to a bucket's ops, in its transaction: every op in [lo, hi] deleted
 * (DELETE), or the op lo (= hi) made a MOVE to target when it is a PUT or REMOVE (MOVE), or the
 * CLEAR of a fold (CLEAR); compact.c makes the MOVE and the CLEAR. bs__pg_chunks_edit applies n
 * of them (disjoint; sorted here): chunks wholly inside a deleted range are deleted unread, the
 * chunks the others cut and the chunks under half of BS_PG_CHUNK_BYTES right beside them are
 * read (64 a statement), edited and written again as the writer chunks a run, a run of adjacent
 * ones as one run: so the small chunks compaction leaves merge. *deleted: the ops deleted;
 * *edited: the MOVEs and CLEARs made. */
enum { BS_PG_EDIT_DELETE = 0, BS_PG_EDIT_MOVE = 1, BS_PG_EDIT_CLEAR = 2 };
typedef struct bs__pg_edit {
  uint64_t lo, hi, target;
  const bs__clear_acc *clear; /* CLEAR: the fold (bs__compact_clear_op makes the op) */
  int kind;
} bs__pg_edit;
int bs__pg_chunks_edit(PGconn *c, const bs_allocator *a, uint64_t bucket, bs__pg_edit *e, size_t n,
                       uint64_t *deleted, uint64_t *edited, bs_error *err);
/* pg_conn.c: data (a COPY stream's tuples) through `sql` (a binary COPY ... FROM STDIN). */
int bs__pg_copy_in(PGconn *c, const char *sql, bs__pg_buf *data, const bs_allocator *a,
                   bs_error *err);

/* bs_source.members (pg_codec.c "Source records"): _size bytes, written by _encode (r's
 * memberships and lookups; an object_id equal to rid and a first object type equal to table,
 * the name of the record's table, are not spelled out); _decode reads a value of the record of
 * replica id rid in table into r's m, nm, lk and nl: strings borrowed from v (or rid, table), the
 * two arrays allocated from a (the caller frees r->m and r->lk; after a failure both are NULL).
 * BS_ECORRUPT (not one whole value), BS_ENOMEM. _srec8_decode reads schema 5-8's value (no table
 * name elided), which migration 9 converts. */
size_t bs__pg_srec_size(const bs__srec *r, bs_val table, bs_val rid);
void bs__pg_srec_encode(unsigned char *p, const bs__srec *r, bs_val table, bs_val rid);
int bs__pg_srec_decode(const bs_allocator *a, bs_val v, bs_val table, bs_val rid, bs__srec *r);
int bs__pg_srec8_decode(const bs_allocator *a, bs_val v, bs_val rid, bs__srec *r);
/* bs_superseded.pairs (pg_internal.h's schema): a row holds at most BS_PG_SUP_ROW entries, so a
 * compaction rewriting one rewrites a few KiB. _put appends an entry (old ops ascending, new_op
 * >= first_new; at most 20 bytes) and returns the end; _next walks a value (borrowed): 1 and the
 * next entry, 0 after the last, BS_ECORRUPT (truncated, old ops not ascending, out of range). */
#define BS_PG_SUP_ROW 4096
typedef struct bs__pg_sups {
  const unsigned char *p, *end;
  uint64_t old_op, first_new;
} bs__pg_sups;
unsigned char *bs__pg_sups_put(unsigned char *p, uint64_t *prev_old, uint64_t first_new,
                               uint64_t old_op, uint64_t new_op);
void bs__pg_sups_open(bs__pg_sups *it, bs_val v, uint64_t first_new);
int bs__pg_sups_next(bs__pg_sups *it, uint64_t *old_op, uint64_t *new_op);

/* pg_write.c: the writer slots */
int bs__pg_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *o, bs_error *err);
int bs__pg_writer_lock(bs_storage *st, int snapshot, int take, bs_error *err);
/* pg_wcp.c: the write-checkpoint slots */
int bs__pg_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                     bs_error *err);
int bs__pg_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance, bs_storage *st,
                                            const bs_managed_request *req, size_t n, bs_error *err);
int bs__pg_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user,
                                 const bs_head *heads, size_t n_heads, bs_error *err);
int bs__pg_delete_checkpoint_requests_before(uint64_t *deleted, bs_storage *st, int64_t before_ms,
                                             bs_error *err);

/* pg_save.c: the flush of the front's queue, below the writer's slots (pg_write.c), which own
 * the session and its transactions: every function here runs in the writer's open transaction.
 * _source_row_read: the source record (table, rid) as the queue in leaves it: *has_data, and
 * *data a copy (allocated from the db's allocator when data->size > 0: the caller frees it);
 * BS_ENOTFOUND when there is none. The caller rolls the transaction back. */
int bs__pg_source_row_read(bs_val *data, int *has_data, bs__pg_writer *w, const bs_write_batch *in,
                           bs_val table, bs_val rid, bs_error *err);
/* One share of a truncate or drop (contract.md 4.2): the REMOVEs of up to a bounded number of
 * the table's source records, which go; *done when none is left (a drop then forgets the
 * table). */
int bs__pg_truncate_share(bs__pg_writer *w, bs_val table, int drop, int *done, bs_error *err);
/* The op head can only grow (a clear keeps it), so one lower than a writer of st saw committed
 * was rewound under the process (the tables restored, a failover to a standby that lacked the
 * last commits): with epoch (bs_meta's history_epoch, read with head) unchanged since, BS_ESTATE
 * and nothing written; a new epoch (BS_OPEN_ACK_REWIND) accepts head. epoch < 0: head was just
 * committed, only recorded. */
int bs__pg_head_seen(bs_storage *st, uint64_t head, int64_t epoch, bs_error *err);
/* Applies batch inside the writer's open transaction; *head = the op-id head after it. */
int bs__pg_flush_in_txn(bs__pg_writer *w, const bs_write_batch *batch, uint64_t *head,
                        bs_error *err);

/* pg_read.c: the read slots */
int bs__pg_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                       const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                       int (*on_chunk)(const bs_chunk *, void *), void *payload, bs_error *err);
int bs__pg_checksums(bs_checksum *out, uint64_t *generation_out, bs_storage *st,
                     uint64_t checkpoint, const bs_val *buckets, size_t n, bs_error *err);
int bs__pg_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *generation_out, bs_storage *st,
                           uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                           bs_error *err);
int bs__pg_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,
                          size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                          bs_error *err);
int bs__pg_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                              int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                              bs_error *err);
int bs__pg_list_buckets(bs_storage *st, bs_val start_after,
                        int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                        bs_error *err);

/* pg_verify.c: verify (a db slot) */
int bs__pg_verify(uint64_t *problems, bs_db *db, void (*fn)(const char *, void *), void *payload,
                  bs_error *err);
/* pg_backup.c: what backup, export and load answer (db slots) */
int bs__pg_backup(bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err);
int bs__pg_export(bs_db *db, uint32_t stream, int (*fn)(const bs_record *, void *), void *payload,
                  bs_error *err);
int bs__pg_load(const char *url, const bs_backup_options *opts, int (*next)(bs_record *, void *),
                void *payload, bs_error *err);
/* pg_compact.c: compaction (contract.md 6) */
int bs__pg_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *opts,
                   bs_error *err);
int bs__pg_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                       uint64_t min_bucket_changes, bs_error *err);
/* pg_save.c: defragmentation (contract.md 6), on compaction's connection c (no transaction
 * open): the live PUTs of the fragmented buckets among ids (n, the buckets just compacted)
 * re-emitted through the writer's path, max_ops_per_txn per transaction. */
int bs__pg_defragment(const bs_compact_options *o, PGconn *c, bs_storage *st, uint64_t *ids,
                      size_t n, uint64_t horizon, bs_compact_stats *stats, bs_error *err);

#endif /* BUCKETSTORE_PG_INTERNAL_H */
