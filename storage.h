/*
 * bucketstore: an embedded single-file storage engine for bucket-based sync.
 *
 * One database file (LMDB, or an in-memory store) holds any number of
 * replication streams. Each stream keeps an append-only log of bucket
 * operations (PUT / REMOVE / MOVE / CLEAR, each with a 32-bit checksum), a
 * parameter-lookup index and write-checkpoint rows. The contract every
 * backend keeps is docs/contract.md; this header is the manual.
 *
 * CAVEATS (read these first)
 *  - ONE WRITER PER STREAM AND KIND, and a bs_writer belongs to one thread: a second streaming
 *    (or snapshot) writer of a stream gets BS_EBUSY while one is open, in any handle, process
 *    or host (bs_writer_open). Readers and compaction run beside a writer.
 *  - A bs_db and its storages may be shared by reader threads.
 *  - A database at PATH also has a sidecar PATH-lock (LMDB's reader table and write lock),
 *    created by the first successful open, also a read-only one, and left behind on close: the
 *    directory must be writable. It holds no data. PATH is the file's real path (symlinks
 *    resolved), so processes opening one file through a symlink or by another relative path
 *    share one lock file; HARD LINKS have no one real path: processes must open a database by
 *    names that resolve to one path, or they neither exclude each other's writes nor protect
 *    each other's read snapshots. To DELETE a database, close it in every process, then unlink
 *    PATH and PATH-lock; there is no call for it. To copy one, use bs_backup() (copying PATH
 *    under a running writer can copy a torn file).
 *  - The file grows and never shrinks: compaction and bs_clear() free pages for reuse inside it.
 *    bs_backup() writes a compacted copy (docs/format.md 6).
 *  - Long-lived read snapshots pin old pages: the file grows while they live.
 *    Every read call here opens and closes its own snapshot.
 *  - A handle does not survive fork(): in the child every call on a handle opened before the
 *    fork (a bs_db, its storages and writers; any backend) fails with BS_ESTATE, and the child
 *    opens the database itself (bs_close of the inherited handles is allowed). Do not put the
 *    file on a network filesystem (LMDB's locking needs a local one).
 *
 * CONVENTIONS
 *  - Every fallible call returns an int status: BS_OK (0) or a negative
 *    BS_E* code. bs_strerror() names the code; the optional bs_error *err
 *    argument (may be NULL) receives a message naming the offending argument
 *    or key. A failed call leaves the database and a writer's queue as they
 *    were.
 *  - err is written when a call fails: then err->code is the returned status. After a call
 *    that returned BS_OK, err's contents are UNSPECIFIED: a success does not clear it, and a
 *    call that recovered from an internal failure (e.g. a full map, grown and retried) may
 *    leave that failure's code and message in it. Test the returned status, never err->code.
 *  - Besides the codes a function lists: any call on a database file may return BS_EIO (an
 *    LMDB or OS error, named in the message), BS_ENOMEM, BS_ECORRUPT (a record that does not
 *    decode) and BS_EBUSY (e.g. LMDB's reader table is full); a call that dispatches through
 *    a backend's method table returns BS_EUNSUPPORTED when the backend leaves that slot NULL
 *    (storage_backend.h; the LMDB backend implements every slot, the memory backend all but
 *    backup and export, the PostgreSQL backend what docs/postgresql.md lists).
 *  - Outputs come first (one is named out), then the handle, then the inputs; a callback's
 *    payload follows it, and err is last. Callbacks take payload last.
 *  - Names: a stream's handle is a storage (bs_storage, the argument st), a database's is db,
 *    a writer's w.
 *  - CALLBACKS' RETURNS, one rule for every int-returning callback: 0 goes on; any other value
 *    (also a negative one that equals a BS_E* code) stops the call, which returns BS_EUSER
 *    with a message in err naming the callback and quoting its value ("bs_db_export's fn
 *    returned -1"). The callback's own value is never returned, so a host's -1 cannot read as
 *    BS_EINVAL; keep what the callback wants to report in its payload. Two kinds of callback
 *    say "stop" in words of their own: a progress callback's non-zero return cancels, and the
 *    call returns BS_ECANCELED (with the same message); bs_load's next returns 1 for a record
 *    and 0 at the end, any other value stops it with BS_EUSER.
 *  - Handles returned through **out are owned by the caller and released
 *    with the matching bs_*_close(); never with free().
 *  - Data passed to callbacks is BORROWED: pointers into the LMDB map or the
 *    backend's buffers, valid only until the callback returns.
 *  - Options structs start with `unsigned version`; initialise them with
 *    their BS_*_INIT macro. Structs only ever grow at the end: the library reads only the
 *    fields of the version you set (a program built against an older header passes the older,
 *    smaller struct), and the fields added later take their defaults.
 *  - Op ids, checkpoints: uint64_t, always < 2^63. 0 means "none".
 *  - A result limit is honoured as given (0 allows nothing, or is BS_EINVAL where a call cannot
 *    serve zero); the defaults are named: BS_BATCH_LIMIT_DEFAULT, BS_PARAM_LIMIT_DEFAULT.
 *  - An empty string is a value. A bs_val is PRESENT when data is non-NULL (size may be 0: "")
 *    and ABSENT when it is {NULL, 0}. Every value the library hands out follows this: a field
 *    that exists is never NULL, also when empty (an object_id "", a stored row "", a parameter
 *    row ""); a field that does not exist is {NULL, 0} (e.g. the data of a REMOVE). Inputs: ""
 *    is accepted wherever a value is (object_type, object_id, op data, stored row data, lookup
 *    values, replica ids, user ids, LSNs, events); where a call needs a value, {NULL, 0} reads
 *    as "", and where a field is optional (before_id, stored_data) {NULL, 0} means absent.
 *    Names keep their own minimum: bucket, table and stream names are 1 byte or more.
 *  - LSNS COMPARE BYTE-WISE, NOT AS NUMBERS: opaque byte strings up to BS_MAX_LSN bytes,
 *    ordered by memcmp, a shorter prefix first. "0/10" sorts BELOW "0/9", so a commit at
 *    "0/10" after a checkpoint at "0/9" is blocked (BS_BLOCKED_CHECKPOINT_LSN). Encode them
 *    fixed-width, e.g. "00000000/0000000A" < "00000000/00000010" (docs/contract.md 1).
 *  - Times ending in _ms (requested_at_ms, before_ms) are wall-clock milliseconds since the
 *    Unix epoch (CLOCK_REALTIME); min_age_ms and timeout_ms are durations.
 *  - Threads: a function taking a bs_db or bs_storage may be called from any thread, also
 *    concurrently; bs_writer_* calls of one writer must come from one thread at a time.
 *    bs_*_close() of a handle must not race with any other call on that handle.
 *  - Input pointers (bs_val, option structs, arrays) are only read during the call; the
 *    library copies what it keeps. Unless a function says otherwise it returns BS_OK,
 *    BS_EINVAL (a NULL handle or bad argument, named in err), BS_ENOMEM or BS_EIO.
 */
#ifndef BUCKETSTORE_STORAGE_H
#define BUCKETSTORE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BS_API marks the public functions: the shared library exports these and nothing else (the
 * library is compiled with -fvisibility=hidden). Define BS_API yourself to override. */
#ifndef BS_API
#if defined(__GNUC__) && __GNUC__ >= 4
#define BS_API __attribute__((visibility("default")))
#else
#define BS_API
#endif
#endif

#define BS_VERSION_MAJOR  0
#define BS_VERSION_MINOR  4
#define BS_VERSION_PATCH  0
#define BS_VERSION_NUMBER (BS_VERSION_MAJOR * 10000 + BS_VERSION_MINOR * 100 + BS_VERSION_PATCH)
#define BS_VERSION_STRING "0.4.0"
/* The version of the library actually linked (the macros above are the header's): returns its
 * BS_VERSION_STRING, a static string, and sets each non-NULL argument to its part. A program
 * built against one header and run with another shared library can compare the two. */
BS_API const char *bs_version(int *major, int *minor, int *patch);
/* On-disk format written by this build; a file with a newer one is refused, an older one is
 * upgraded in place by a read-write open (bs_open). */
#define BS_FORMAT_VERSION 6

/* ---- Status codes (negative, in a range of their own) -------------------------------------- */
#define BS_OK           0
#define BS_EINVAL       (-1)  /* bad argument; the message names it */
#define BS_ENOTFOUND    (-2)  /* no such stream, user, row, ... */
#define BS_ETOOBIG      (-3)  /* key or value over a limit (see BS_MAX_*) */
#define BS_ELIMIT       (-4)  /* a result limit was exceeded */
#define BS_ESTATE       (-5)  /* call not valid in this state (terminated stream, wrong mode) */
#define BS_EINVALIDATED (-6)  /* read at a checkpoint that compaction tore; read a newer one */
#define BS_ESTALE       (-7)  /* parameter read below the parameter-compaction horizon */
#define BS_ECORRUPT     (-8)  /* the file does not decode, or is not a bucketstore file */
#define BS_ENOMEM       (-9)  /* allocation failed */
#define BS_EIO          (-10) /* LMDB or OS error; the message carries it */
#define BS_EBUSY        (-11) /* resource busy (e.g. the file is locked) */
#define BS_EUNSUPPORTED (-12) /* the backend does not implement this call */
#define BS_ECANCELED    (-13) /* cancelled by a progress callback */
#define BS_EUSER        (-14) /* a callback stopped the call (CONVENTIONS: its value is in err) */

/* ---- Limits (contract.md section 10), checked by the call that receives the value ------------ */
#define BS_MAX_BUCKET_NAME     480u
#define BS_MAX_LOOKUP_KEY      480u
#define BS_MAX_REPLICA_ID      256u
#define BS_MAX_TABLE_NAME      256u
#define BS_MAX_OP_DATA         (15u * 1024u * 1024u)
#define BS_MAX_LSN             255u
#define BS_MAX_STREAM_NAME     255u
#define BS_MAX_USER_ID         480u
#define BS_MAX_USER_EVENT      504u   /* a custom write checkpoint's user_id and event together */
#define BS_MAX_OBJECT_NAME     65535u /* object_type and object_id of a row */
#define BS_MAX_CONNECTION_NAME 255u   /* bs_head.connection (a replication connection name) */
#define BS_MAX_HEADS           65535u /* heads per managed write checkpoint request */

/* ---- Small value types ----------------------------------------------------------------------- */

/* Borrowed bytes. data may be NULL only when size is 0. */
typedef struct bs_val {
  const void *data;
  size_t size;
} bs_val;

/* Optional error detail of a failed call: code = the returned status, msg = a NUL-terminated
 * message naming the argument, key or file at fault. Unspecified after a success (CONVENTIONS). */
typedef struct bs_error {
  int code;
  char msg[256];
} bs_error;

/* A static string starting with the code's symbol, e.g. "BS_EINVAL: invalid argument". */
BS_API const char *bs_strerror(int code);

/* Writes conninfo (a PostgreSQL URL or key=value connection string, or any path) into out (cap
 * bytes, NUL-terminated, cut to fit; out may be NULL when cap is 0) with every password
 * replaced by "***": postgresql://u:***@host/db, ?password=*** (and &password=) in a URL, and
 * password=*** in key=value form (a quoted value too). Returns the length of the whole redacted
 * text (as snprintf: larger than cap - 1 when cut). The library never puts a password in a
 * message (libpq's echo of a malformed URL is redacted too); show a URL the same way. */
BS_API size_t bs_redact_conninfo(char *out, size_t cap, const char *conninfo);

/* Allocator hook, per handle (zstd's customMem shape). All three set, or all NULL for libc. */
typedef struct bs_allocator {
  void *(*malloc_fn)(void *opaque, size_t size);
  void *(*realloc_fn)(void *opaque, void *ptr, size_t size);
  void (*free_fn)(void *opaque, void *ptr);
  void *opaque;
} bs_allocator;

/* ---- Opaque handles -------------------------------------------------------------------------- */
typedef struct bs_db bs_db;           /* one open file (or memory store); thread-safe */
typedef struct bs_storage bs_storage; /* a storage: one stream's handle; thread-safe for reads */
typedef struct bs_writer bs_writer;   /* one replication writer of a stream; one thread */

/* ---- Opening --------------------------------------------------------------------------------- */
#define BS_OPEN_NOSYNC     0x1u /* no fsync at commit: a crash may lose recent commits, not corrupt */
#define BS_OPEN_RDONLY     0x2u /* read-only: every write call fails with BS_ESTATE */
/* a read-write open never upgrades an older LMDB format (bs_open), nor creates or migrates a
 * PostgreSQL schema (bs_open_postgres) */
#define BS_OPEN_NOMIGRATE  0x4u
/* PostgreSQL: the operator acknowledges that the database's history was rewound (a failover, a
 * restore), after which writes resume; set it once (bucketstore ack-rewind URL), never always */
#define BS_OPEN_ACK_REWIND 0x8u

typedef struct bs_open_options {
  unsigned version;
  unsigned flags;                /* BS_OPEN_* */
  size_t map_size;               /* initial LMDB map size; 0 = 4 GiB (address space, not disk;
                                     256 MiB on 32-bit); doubles on demand */
  size_t checksum_cache_entries; /* LRU entries; 0 = 100000; (size_t)-1 disables the cache */
  const bs_allocator *allocator; /* NULL = libc; copied */
  /* version 2: the PostgreSQL backend's connections for calls at most, besides writers'
   * sessions and the one LISTEN connection (bs_open_postgres); 0 = 10. Ignored by the other
   * backends */
  size_t pg_max_connections;
} bs_open_options;
#define BS_OPEN_OPTIONS_VERSION 2
#define BS_OPEN_OPTIONS_INIT                                                                       \
  { BS_OPEN_OPTIONS_VERSION, 0, 0, 0, NULL, 0 }

/* Opens the database file at path (copied); a missing file is created, unless BS_OPEN_RDONLY.
 * A path that bs_names_postgres accepts opens the PostgreSQL backend instead (bs_open_postgres).
 * *out is the caller's, closed with bs_close(); *out is NULL on failure. opts may be NULL.
 * The file is checked before LMDB maps it; a file that fails is refused unchanged and gets no
 * PATH-lock beside it (that appears only beside a bucketstore database). A new file is built
 * under a temporary name beside path (PATH.new-*, which a crash at that moment leaves behind,
 * safe to delete) and then linked into place, so path never holds a half-created database.
 * Errors: BS_EINVAL (NULL or empty path, bad option), BS_ENOTFOUND (read-only and the file is
 * missing, or the directory in path does not exist), BS_ECORRUPT (the message says which: an
 * empty file, not LMDB, truncated, a foreign LMDB file or one without data, a newer format, an
 * older one and the open read-only or BS_OPEN_NOMIGRATE), BS_EBUSY, BS_EIO, BS_ENOMEM.
 * A read-write open of a file of an older format upgrades it in place before it returns, in
 * transactions of bounded size, crash-safely: a file stopped halfway is finished by the next
 * read-write open and refused by older builds (docs/format.md 5).
 * One file, one environment: LMDB forbids opening one file twice in a process, so every bs_open
 * of one file in a process (by any name: a symlink, a hard link, a relative path; the file's
 * device and inode decide) shares one LMDB environment, from any thread, until its last handle
 * is closed. The handles behave as handles of two processes would (each has its own checksum
 * cache, allocator and checkpoint listener; writers of one stream are serialised by LMDB's write
 * lock as ever). Options that cannot share it fail with BS_EBUSY, the message naming the
 * option: a read-write open while the environment was opened read-only (open read-write first,
 * or close the read-only handles), BS_OPEN_NOSYNC set on one read-write handle and not on the
 * other, or a map_size larger than the map the environment has now (a smaller one is met). A
 * read-only handle uses a read-write environment and stays read-only. Across processes, LMDB's
 * lock file goes by the file's name (symlinks resolved): while another process has the file
 * open by one name, an open by another (a hard link, or a name before or after a rename) fails
 * with BS_EBUSY and makes no lock file, since two lock files would let each writer reuse pages
 * the other's readers still read. */
BS_API int bs_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err);

/* 1 when bs_open hands name to the PostgreSQL backend, else 0 (also for NULL): a URL starting
 * with postgresql:// or postgres://, or a libpq key=value connection string, recognised by its
 * first keyword (lower-case letters and '_', as libpq's are) followed by '=', e.g.
 * "host=db dbname=sync". A file whose name looks so is opened as "./name". For programs that
 * take either kind of name, as the CLI does, so they decide as the library does. */
BS_API int bs_names_postgres(const char *name);

/* Opens the PostgreSQL backend on the database that url names (a libpq connection string or
 * URI, copied; bs_open hands every name bs_names_postgres accepts here). Its
 * tables live in one schema, resolved once at open from the connection's search_path (e.g.
 * append ?options=-csearch_path%3Dmyschema to keep several databases in one; a name that needs
 * quoting is written quoted there, %22My%5C%20Schema%22 for "My Schema"): the first of its
 * schemas that holds a bucketstore database, else the first that exists (BS_ENOTFOUND when none
 * does). Every session of the handle then runs with search_path = pg_catalog, that schema,
 * pg_temp, so functions and operators other roles created elsewhere (public) never run as the
 * handle's role; the schema itself must be writable by its owner only. Its tables are created
 * at the first open and migrated to this build's schema version by a read-write open; BS_OPEN_NOSYNC sets
 * synchronous_commit off, map_size is ignored. Several processes, also on several hosts, may
 * open one database. Connections: a call takes one from the handle's pool for its duration (an
 * idle one, else a new one; a compaction for its run); the pool holds at most
 * opts->pg_max_connections (default 10), and a call that finds all of them in use waits until
 * one is given back (so a callback that calls the library back, from bs_list_buckets or
 * bs_get_bucket_data, needs one more than the calls running at once). Besides the pool: a
 * each open writer holds a session (two per stream with a snapshot and a streaming writer),
 * and at most one more for a moment (its ANALYZE),
 * and one LISTEN connection, opened by the first bs_wait_checkpoint, serves every waiter of the
 * handle. A handle so uses at most pg_max_connections + 1 + 2 per open writer; size the
 * server's max_connections (or a session-mode pooler) for every process.
 * Unless the URL sets them: connect_timeout=10, TCP keepalives (idle 60 s, interval 10 s, 6
 * probes) and application_name=bucketstore.
 * Writers: bs_writer_open's writer lock is an advisory lock held by the writer's session, so it
 * excludes writers on every host. A writer whose session was lost (BS_EIO) takes the lock again
 * in a new session at its next call;
 * if its old session's server process still holds it (it has not noticed the loss), that
 * process is ended first (pg_terminate_backend, waiting up to 10 s), never another writer's.
 * A hot standby (a read-only replica) opens with BS_OPEN_RDONLY: reads and bs_wait_checkpoint
 * work there, at the position the standby has replayed.
 * History: op ids never repeat. After a failover to an asynchronous standby or a point-in-time
 * restore they could (clients may hold checkpoints the database lost), so every write fails
 * with BS_ESTATE ("history rewound: ...", nothing written) when the server's system identifier
 * or timeline, or the OID of the table bs_meta, is not the one the schema records (a
 * read-write open records them when it has none; checked once per session: a promotion, a
 * point-in-time restore, a copy in another cluster, a pg_dump restored into this one), or when
 * a writer finds its stream's op head lower than this handle's writers last saw committed
 * (rows put back under it). Once every client is made to sync again, an open with
 * BS_OPEN_ACK_REWIND (`bucketstore ack-rewind URL`; read-write, else BS_EINVAL) records the
 * server's history and lets every process's writers go on from the restored op head.
 * Errors: BS_EINVAL (NULL or empty url, bad option), BS_EIO (the server is unreachable or
 * refused the connection: libpq's message), BS_ESTATE (read-write on a hot standby: its
 * advisory locks would not exclude the primary's writer), BS_ECORRUPT (the schema is newer
 * than this build's, or older and the open read-only or BS_OPEN_NOMIGRATE), BS_ENOTFOUND
 * (read-only or BS_OPEN_NOMIGRATE and no schema yet), BS_EBUSY (a migration step waited longer
 * than lock_timeout for a table: 10 s unless the URL sets it), BS_EUNSUPPORTED (a server older
 * than PostgreSQL 14; a pooler in transaction mode, seen at open as one server process serving
 * two of the handle's connections or one connection's changing between statements: connect
 * directly or through a session-mode pooler; a build without the PostgreSQL backend: make PG=0,
 * or no libpq), BS_ENOMEM.
 * Migrations: a read-write open brings the schema to this build's version in one transaction
 * (steps may rewrite the largest tables under an exclusive lock); with BS_OPEN_NOMIGRATE it
 * refuses instead, so a fleet migrates once, deliberately (`bucketstore migrate URL`). A handle
 * that a newer build's migration overtook writes nothing more: every write (flush, commit,
 * snapshot_done, resume_lsn, truncate, compaction, clear, terminate, write checkpoints, a new
 * writer or stream) fails with BS_ECORRUPT ("... newer than this build's N: upgrade
 * bucketstore"); reads go on.
 * What the backend implements is listed in docs/postgresql.md; a call it does not
 * implement yet answers BS_EUNSUPPORTED. */
BS_API int bs_open_postgres(bs_db **out, const char *url, const bs_open_options *opts,
                            bs_error *err);

/* Opens a fresh in-memory store (the reference backend: naive and obviously correct).
 * Nothing is persisted; bs_close() discards it. Errors: BS_EINVAL (bad option), BS_ENOMEM. */
BS_API int bs_open_memory(bs_db **out, const bs_open_options *opts, bs_error *err);

/* Closes the database. All storages and writers of it must be closed first, and no other call
 * on db may be running. NULL is a no-op. The PATH-lock file stays (see CAVEATS). */
BS_API void bs_close(bs_db *db);

/* ---- Streams --------------------------------------------------------------------------------- */
typedef enum bs_stream_state {
  BS_STREAM_PROCESSING = 1, /* being filled, not served */
  BS_STREAM_ACTIVE = 2,     /* served */
  BS_STREAM_ERRORED = 3,    /* served, not replicating */
  BS_STREAM_STOPPED = 4,
  BS_STREAM_TERMINATED = 5
} bs_stream_state;

typedef enum bs_hash {
  BS_HASH_XXH3 = 0,  /* low 32 bits of XXH3_64bits(seed 0) */
  BS_HASH_SHA256 = 1 /* first 4 bytes, little-endian, of SHA-256: the reference service's */
} bs_hash;

typedef struct bs_stream_options {
  unsigned version;
  bs_hash hash;
} bs_stream_options;
#define BS_STREAM_OPTIONS_VERSION 1
#define BS_STREAM_OPTIONS_INIT                                                                     \
  { BS_STREAM_OPTIONS_VERSION, BS_HASH_XXH3 }

typedef struct bs_stream_info {
  uint32_t id;
  bs_val name;
  bs_stream_state state;
  bs_hash hash;
} bs_stream_info;

/* Creates a PROCESSING stream (ids 1, 2, 3, ...); an older PROCESSING stream becomes STOPPED.
 * id_out and opts may be NULL; name is NUL-terminated, 1..BS_MAX_STREAM_NAME bytes.
 * Errors: BS_EINVAL (db or name NULL, name empty, bad option or hash), BS_ETOOBIG (name over
 * BS_MAX_STREAM_NAME), BS_ESTATE (read-only db). */
BS_API int bs_stream_create(uint32_t *id_out, bs_db *db, const char *name,
                            const bs_stream_options *opts, bs_error *err);

/* Calls fn for every stream in ascending id order; info (and its name) is borrowed, valid until
 * fn returns. Errors: BS_EINVAL (db or fn NULL), BS_EUSER (fn stopped it). */
BS_API int bs_stream_list(bs_db *db, int (*fn)(const bs_stream_info *info, void *payload),
                          void *payload, bs_error *err);

/* Opens a storage on stream id; id 0 = the served stream (ACTIVE or ERRORED), else the newest
 * one. A storage on a STOPPED or TERMINATED stream still reads. Close with bs_storage_close().
 * Errors: BS_EINVAL (out or db NULL), BS_ENOTFOUND (no such stream / no stream at all). */
BS_API int bs_storage_open(bs_storage **out, bs_db *db, uint32_t stream_id, bs_error *err);
/* Releases the storage (NULL is a no-op); close its writers first. */
BS_API void bs_storage_close(bs_storage *st);
/* The stream id the storage was opened on (infallible). */
BS_API uint32_t bs_storage_stream_id(const bs_storage *st);

/* ---- Writing --------------------------------------------------------------------------------- */
typedef enum bs_tag { BS_INSERT = 1, BS_UPDATE = 2, BS_DELETE = 3 } bs_tag;

/* One evaluated output row of a source row: PUT into bucket. */
typedef struct bs_row {
  bs_val bucket;      /* 1..BS_MAX_BUCKET_NAME bytes */
  bs_val object_type; /* output table */
  bs_val object_id;   /* output row id */
  bs_val data;        /* row as JSON text, up to BS_MAX_OP_DATA */
} bs_row;

/* One evaluated parameter lookup: key (encoded with bs_lookup_encode) -> bucket-parameter rows
 * (each a JSON object as text). */
typedef struct bs_lookup {
  bs_val key;
  const bs_val *params;
  size_t n_params;
} bs_lookup;

/* One source row change (contract.md section 4.1). */
typedef struct bs_save {
  unsigned version;
  bs_val table; /* source table name (registered on first use) */
  bs_tag tag;
  bs_val before_id; /* replica id before; data NULL = same as after_id */
  bs_val after_id;  /* replica id after; ignored (absent) for BS_DELETE */
  const bs_row *rows;
  size_t n_rows;
  const bs_lookup *lookups;
  size_t n_lookups;
  bs_val stored_data; /* optional row data kept with the source record; data NULL = none */
} bs_save;
#define BS_SAVE_VERSION 1
#define BS_SAVE_INIT                                                                               \
  {                                                                                                \
    BS_SAVE_VERSION, {NULL, 0}, BS_INSERT, {NULL, 0}, {NULL, 0}, NULL, 0, NULL, 0, {               \
      NULL, 0                                                                                      \
    }                                                                                              \
  }

typedef struct bs_writer_options {
  unsigned version;
  int snapshot;     /* skip_existing: INSERT only; inserts of known rows are skipped */
  int create_empty; /* commits with nothing new still create a checkpoint (default 1) */
  /* Auto-flush bounds (contract.md 4): a save or truncate that finds max_records changes, or
   * max_bytes bytes of change data (the sizes of the bs_save's strings), queued since the
   * last flush flushes them first; a failed auto-flush fails that save and queues nothing. */
  size_t max_records; /* 0 = 2000 */
  size_t max_bytes;   /* 0 = 5 MB */
} bs_writer_options;
#define BS_WRITER_OPTIONS_VERSION 1
#define BS_WRITER_OPTIONS_INIT                                                                     \
  { BS_WRITER_OPTIONS_VERSION, 0, 1, 0, 0 }

typedef struct bs_commit_options {
  unsigned version;
  int create_empty; /* -1 = the writer's setting, 0 or 1 overrides */
} bs_commit_options;
#define BS_COMMIT_OPTIONS_VERSION 1
#define BS_COMMIT_OPTIONS_INIT                                                                     \
  { BS_COMMIT_OPTIONS_VERSION, -1 }

/* Why a commit made no checkpoint although one was asked for (contract.md 4.4). When several hold,
 * the first in this order is reported. */
typedef enum bs_block_reason {
  BS_BLOCKED_NONE = 0,                 /* not blocked */
  BS_BLOCKED_SNAPSHOT = 1,             /* the stream's snapshot is not done (snapshot_done) */
  BS_BLOCKED_NO_CHECKPOINT_BEFORE = 2, /* lsn sorts below the snapshot_done LSN */
  BS_BLOCKED_CHECKPOINT_LSN = 3        /* lsn sorts below the last checkpoint's LSN */
} bs_block_reason;

typedef struct bs_commit_result {
  int checkpoint_blocked;
  int checkpoint_created;
  uint64_t checkpoint; /* the stream's checkpoint after the call (0 = none) */
  /* BS_BLOCKED_NONE unless checkpoint_blocked. LSNs compare BYTE-WISE (memcmp, a shorter
   * prefix first): "0/10" sorts below "0/9", so a commit at "0/10" after one at "0/9" is
   * blocked with BS_BLOCKED_CHECKPOINT_LSN. Use fixed-width LSNs ("00000000/0000000A"). */
  bs_block_reason blocked_reason;
} bs_commit_result;

/* Opens a writer on st's stream (opts may be NULL: the defaults). The writer is used by one
 * thread at a time and must be closed before st. Close with bs_writer_close(), which discards
 * whatever was not flushed (NULL is a no-op).
 * ONE WRITER PER STREAM AND KIND: while a streaming writer of a stream is open, another
 * streaming writer of it is refused with BS_EBUSY, on the same handle or another one, in this
 * process or another (and for PostgreSQL on another host); the same for snapshot writers
 * (opts->snapshot). The lock is taken by bs_writer_open and released before bs_writer_close
 * returns; a process that dies (also by SIGKILL) releases its writers' locks. Two writers'
 * saves would interleave, each diffing rows against the source records the other left, and
 * either commit would make a checkpoint of what both flushed. LMDB: the lock is an
 * open-file-description lock on the database file (Linux), so it holds across processes
 * however they name the file; a child after fork() does not inherit its parent's locks.
 * From a snapshot writer to a streaming one: save the snapshot's rows through a writer opened
 * with opts->snapshot = 1, flush it and close it, call bs_writer_snapshot_done(lsn) with the
 * source position the snapshot is consistent at (any writer of the stream may; the snapshot
 * writer before it closes, typically), then open a writer with snapshot = 0 and replicate
 * from that position, committing as you go (docs/contract.md 4.3, 4.4). A streaming writer may
 * also run beside a snapshot writer while the snapshot is copied: the snapshot skips rows the
 * stream already has, and deletes leave soft-deleted records until the first checkpoint.
 * Errors: BS_EINVAL (out or st NULL, bad option), BS_ESTATE (read-only db, terminated stream),
 * BS_EBUSY (a writer of that kind is open on the stream, above). */
BS_API int bs_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *opts,
                          bs_error *err);
BS_API void bs_writer_close(bs_writer *w);

/* Queues one source row change (docs/contract.md 4.1): the library copies it (every buffer of
 * change may be reused when the call returns); may auto-flush first. Errors: BS_EINVAL (a
 * field, named), BS_ETOOBIG (a value over its BS_MAX_*), BS_ESTATE (a snapshot writer given
 * UPDATE or DELETE, contract.md 4.3; from an auto-flush: stream terminated),
 * BS_ENOMEM (the copy: nothing queued), and an auto-flush's errors (as bs_writer_flush). */
BS_API int bs_writer_save(bs_writer *w, const bs_save *change, bs_error *err);
/* Checks change as bs_writer_save(w, change) does before it queues anything (since 0.4.0): the
 * fields, their BS_MAX_* limits and w's kind (a snapshot writer takes INSERT only), with the
 * same code and message; BS_OK when bs_writer_save would queue it (an auto-flush and its
 * memory aside). Queues, flushes and changes nothing; it reads only what bs_writer_open fixed,
 * so it may run on any thread, also while another thread uses w (e.g. checking a batch of saves
 * before any is queued). Errors: BS_EINVAL (w NULL; a field, named), BS_ETOOBIG, BS_ESTATE (as
 * bs_writer_save). */
BS_API int bs_writer_check_save(const bs_writer *w, const bs_save *change, bs_error *err);
/* Truncate flushes the queue (its own transaction: a failed truncate leaves it flushed), then
 * persists REMOVEs / tombstones for every row of table (in bounded transactions; visible with
 * the next checkpoint); drop also forgets the table.
 * Errors: BS_EINVAL / BS_ETOOBIG (table empty or over BS_MAX_TABLE_NAME), BS_ESTATE (stream
 * terminated), BS_EIO. */
BS_API int bs_writer_truncate(bs_writer *w, bs_val table, bs_error *err);
BS_API int bs_writer_drop(bs_writer *w, bs_val table, bs_error *err);
/* Persists the queue (the saves and custom write checkpoints queued since the last flush, in one
 * transaction). last_op_out (may be NULL): the stream's highest
 * persisted op id. Never makes a checkpoint. On failure nothing is persisted and the queue is
 * kept (flush again, or close to discard). Errors: BS_EINVAL (w NULL), BS_ESTATE (stream
 * terminated). */
BS_API int bs_writer_flush(uint64_t *last_op_out, bs_writer *w, bs_error *err);
/* Flushes, then makes a checkpoint iff can_checkpoint(lsn) (contract.md 4.4): the snapshot is done
 * and lsn sorts at or above both the snapshot_done LSN and the last checkpoint's LSN. A blocked
 * commit still persists the queue and returns BS_OK with out->checkpoint_blocked = 1 and
 * out->blocked_reason saying why; LSNs compare byte-wise (CONVENTIONS). opts and out may be
 * NULL. Errors: BS_EINVAL (w NULL, bad option), BS_ETOOBIG (lsn over BS_MAX_LSN), BS_ESTATE
 * (stream terminated), and a flush's errors. Listeners
 * (bs_set_checkpoint_listener) run in this thread before it returns. */
BS_API int bs_writer_commit(bs_commit_result *out, bs_writer *w, bs_val lsn,
                            const bs_commit_options *opts, bs_error *err);
/* commit(lsn) with create_empty = 1. */
BS_API int bs_writer_keepalive(bs_commit_result *out, bs_writer *w, bs_val lsn, bs_error *err);
/* Marks the stream's snapshot done and raises no_checkpoint_before to lsn (never lowers it): no
 * checkpoint is made at an LSN that sorts below it. Persisted at once, in a write transaction
 * of its own (the writer's queue is not flushed).
 * Errors: BS_EINVAL (w NULL), BS_ETOOBIG (lsn over BS_MAX_LSN), BS_ESTATE (stream terminated). */
BS_API int bs_writer_snapshot_done(bs_writer *w, bs_val lsn, bs_error *err);
/* Sets where replication restarts (bs_status.resume_lsn) to lsn, persisted at once in a write
 * transaction of its own; every commit also raises it to the commit's lsn. Errors: as
 * bs_writer_snapshot_done. */
BS_API int bs_writer_resume_lsn(bs_writer *w, bs_val lsn, bs_error *err);
/* Reads back the data stored with a source record (seeing this writer's queued saves).
 * fn receives data (borrowed) or NULL when the row has no stored data. Errors: BS_EINVAL (w or
 * fn NULL, table empty), BS_ETOOBIG (table or replica_id over its limit), BS_ENOTFOUND (the
 * row has no source record, or was deleted), BS_EUSER (fn stopped
 * it). */
BS_API int bs_writer_source_row(bs_writer *w, bs_val table, bs_val replica_id,
                                int (*fn)(const bs_val *data, void *payload), void *payload,
                                bs_error *err);
/* Custom write-checkpoint mode: queue (user, value[, event]; copied), persisted by the next flush
 * (after the saves queued with it),
 * overwriting the previous value of (user, event). This one is persistent (owned by the source):
 * bs_delete_checkpoint_requests_before keeps it. Errors: BS_EINVAL (w NULL, checkpoint >= 2^63),
 * BS_ETOOBIG (user_id over BS_MAX_USER_ID, event over 255 bytes, both over BS_MAX_USER_EVENT
 * together: the longest key LMDB stores them in). */
BS_API int bs_writer_custom_write_checkpoint(bs_writer *w, bs_val user_id, uint64_t checkpoint,
                                             bs_val event, bs_error *err);
/* The same for a custom checkpoint created from a client's checkpoint request made at
 * requested_at_ms (ms since the epoch, >= 0): bs_delete_checkpoint_requests_before(t) deletes
 * it once requested_at_ms < t. Errors as above, and BS_EINVAL (requested_at_ms negative). */
BS_API int bs_writer_custom_write_checkpoint_requested(bs_writer *w, bs_val user_id,
                                                       uint64_t checkpoint, bs_val event,
                                                       int64_t requested_at_ms, bs_error *err);

/* ---- Reading --------------------------------------------------------------------------------- */
typedef struct bs_checkpoint {
  uint64_t op_id; /* 0 before the first checkpoint */
  int has_lsn;
  size_t lsn_size;
  unsigned char lsn[BS_MAX_LSN];
} bs_checkpoint;

/* The stream's current checkpoint (op_id 0 and has_lsn 0 before the first). out is a copy.
 * Errors: BS_EINVAL (st or out NULL). */
BS_API int bs_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err);

/* Blocks until the stream's checkpoint op id differs from `known` (or the LSN changes), or
 * timeout_ms passes (then BS_OK with out = current). Commits in this process wake it at
 * once; commits from other processes are seen by polling (every 50 ms). On a PostgreSQL
 * database a commit on any host wakes it at once (LISTEN on the handle's one connection for all
 * its waiters); BS_EIO with libpq's message when the server drops that connection (every wait
 * then running fails; the next opens a new one). On a hot standby (a
 * read-only replica, opened with BS_OPEN_RDONLY: PostgreSQL cannot LISTEN during recovery) it
 * polls every 50 ms instead and sees a commit once the standby has replayed it. known NULL = no
 * checkpoint yet; timeout_ms < 0 is BS_EINVAL. */
BS_API int bs_wait_checkpoint(bs_checkpoint *out, bs_storage *st, const bs_checkpoint *known,
                              int timeout_ms, bs_error *err);

/* Registers fn, called after every checkpoint this process commits on db, in the committing
 * (writer's) thread, outside any lock: it may call the library's read functions, and should be
 * short (the writer waits for it). One listener per db; a new one replaces the old; fn NULL
 * unregisters. Any thread. Returns BS_OK, or BS_EINVAL for a NULL db (no err argument). */
BS_API int bs_set_checkpoint_listener(
    bs_db *db, void (*fn)(uint32_t stream, uint64_t checkpoint, void *payload), void *payload);

typedef enum bs_op_type {
  BS_OP_PUT = 1,
  BS_OP_REMOVE = 2,
  BS_OP_MOVE = 3,
  BS_OP_CLEAR = 4
} bs_op_type;

/* One stored op. PUT and REMOVE carry object_type, object_id and subkey, PUT also data: those
 * have non-NULL data, also when empty. Fields an op type does not carry have data NULL and size
 * 0; target_op is 0 unless MOVE/CLEAR. All bytes borrowed (valid during the callback). */
typedef struct bs_op {
  uint64_t op_id;
  bs_op_type type;
  uint32_t checksum;
  uint64_t target_op;
  bs_val object_type;
  bs_val object_id;
  bs_val subkey;
  bs_val data;
} bs_op;

typedef struct bs_chunk {
  bs_val bucket;
  uint64_t after;      /* requested position, or the previous chunk's next_after */
  uint64_t next_after; /* op id of the last op */
  int has_more;        /* the bucket was cut; more may remain up to the checkpoint */
  uint64_t target_op;  /* max target_op of its MOVE/CLEAR ops; 0 = none */
  const bs_op *ops;
  size_t n_ops;
} bs_chunk;

typedef struct bs_bucket_request {
  bs_val bucket;
  uint64_t after;
} bs_bucket_request;

/* The default ops per bs_get_bucket_data call (the reference service's). */
#define BS_BATCH_LIMIT_DEFAULT 1000u
/* The default chunk size of bs_get_bucket_data, in op bytes. */
#define BS_CHUNK_BYTES_DEFAULT (1024u * 1024u)

typedef struct bs_batch_options {
  unsigned version;
  /* ops per call (all buckets), >= 1: 0 is BS_EINVAL. The INIT macro sets
   * BS_BATCH_LIMIT_DEFAULT */
  size_t limit;
  /* a chunk ends when its next op would take it past chunk_bytes; an op larger than that gets
   * a chunk of its own (so 0: one op per chunk, save for ops of size 0). op size = data +
   * object_type + object_id + subkey. The INIT macro sets BS_CHUNK_BYTES_DEFAULT */
  size_t chunk_bytes;
  size_t max_bytes; /* bytes per call; 0 = 16 MiB */
} bs_batch_options;
#define BS_BATCH_OPTIONS_VERSION 1
#define BS_BATCH_OPTIONS_INIT                                                                      \
  { BS_BATCH_OPTIONS_VERSION, BS_BATCH_LIMIT_DEFAULT, BS_CHUNK_BYTES_DEFAULT, 0 }

/* Ops with after < op_id <= checkpoint of the requested buckets, served in ascending byte
 * order of bucket name, as chunks handed to on_chunk (borrowed). *has_more_out = 1 when the
 * call stopped at its limit/byte cap: call again with after = next_after per bucket. opts NULL:
 * BS_BATCH_OPTIONS_INIT. A bucket named twice is served once (its last request). PostgreSQL:
 * each page of a bucket's ops is one statement, a snapshot of its own, and on_chunk runs in no
 * transaction; a compaction between two pages changes nothing a client ends with (contract.md
 * 5.2), and one that made the bucket's span torn fails the call with BS_EINVALIDATED, also after
 * chunks were handed out. Errors:
 * BS_EINVALIDATED (checkpoint inside a bucket's compacted span, contract.md 5.5), BS_EINVAL (st
 * or on_chunk NULL, req NULL with n_req, an empty bucket name, checkpoint or after >= 2^63, bad
 * option, also opts->limit 0), BS_ETOOBIG (a bucket name over BS_MAX_BUCKET_NAME), or
 * BS_EUSER (on_chunk stopped it). */
BS_API int bs_get_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                              const bs_bucket_request *req, size_t n_req,
                              const bs_batch_options *opts,
                              int (*on_chunk)(const bs_chunk *chunk, void *payload), void *payload,
                              bs_error *err);

/* A chunk of bs_get_bucket_columns: bs_get_bucket_data's chunk with its ops laid out in columns
 * instead of one bs_op each, for a host that copies a chunk out whole (a language binding).
 * Op i (0 <= i < n_ops) is op_id[i], type[i] (a bs_op_type), checksum[i] and op_target[i] (0
 * unless MOVE/CLEAR); its field j (0 object_type, 1 object_id, 2 subkey, 3 data) is the bytes
 * [field[4 * i + j], field[4 * i + j + 1]) of bytes, so field has 4 * n_ops + 1 entries, rising,
 * from 0. A field the op's type does not carry (bs_op's NULL: PUT carries all four, REMOVE all
 * but data, MOVE and CLEAR none) is empty. All borrowed: valid during the callback. */
typedef struct bs_chunk_columns {
  bs_val bucket;
  uint64_t after, next_after; /* as bs_chunk's */
  int has_more;
  uint64_t target_op; /* max op_target[i]; 0 = none */
  size_t n_ops;
  const uint64_t *op_id;
  const uint8_t *type;
  const uint32_t *checksum;
  const uint64_t *op_target;
  const uint32_t *field;
  const unsigned char *bytes;
} bs_chunk_columns;

/* bs_get_bucket_data with each chunk handed to on_chunk in columns: the same ops, chunks, order,
 * has_more and errors (torn reads included) for the same arguments, save that a chunk is also cut
 * before it would pass 2^32 - 1 bytes (opts->chunk_bytes above that counts as that). */
BS_API int bs_get_bucket_columns(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                                 const bs_bucket_request *req, size_t n_req,
                                 const bs_batch_options *opts,
                                 int (*on_chunk)(const bs_chunk_columns *chunk, void *payload),
                                 void *payload, bs_error *err);

typedef struct bs_checksum {
  uint32_t checksum; /* wrapping sum of op checksums with op_id <= checkpoint */
  uint64_t count;    /* stored ops with op_id <= checkpoint */
} bs_checksum;

/* One entry per requested bucket, in request order (out has n entries). Unknown bucket: 0/0.
 * Served through the checksum cache. Errors: BS_EINVALIDATED (contract.md 5.5), BS_EINVAL (st
 * NULL, buckets or out NULL with n, an empty name, checkpoint >= 2^63), BS_ETOOBIG (a name over
 * BS_MAX_BUCKET_NAME). */
BS_API int bs_get_checksums(bs_checksum *out, bs_storage *st, uint64_t checkpoint,
                            const bs_val *buckets, size_t n, bs_error *err);

/* ---- Listing buckets ------------------------------------------------------------------------- */
/* One bucket of a stream, as its stored figures stand: every persisted op counts, also ops above
 * the current checkpoint (flushed, not yet checkpointed). Cheap: the backends keep these figures
 * per bucket, so listing never reads the ops themselves. */
typedef struct bs_bucket_info {
  bs_val name;         /* borrowed; 1..BS_MAX_BUCKET_NAME bytes, any bytes (NUL too) */
  uint32_t checksum;   /* wrapping sum of the checksums of the bucket's stored ops */
  uint64_t count;      /* stored ops, >= 1 (compaction lowers it). checksum and count are what
                          bs_get_checksums answers at bs_status.last_persisted_op */
  uint64_t last_op;    /* highest op id stored in the bucket */
  uint64_t bytes;      /* space of its ops in the backend's own measure (the unit of
                          bs_compact_stats.bytes_before); for sizing and progress only */
  uint64_t generation; /* changes whenever a compaction rewrites the bucket's ops; a host that
                          caches per-bucket figures compares it for equality (nothing else) */
  uint64_t changes;    /* about how many ops arrived since the bucket's last full compaction
                          (all of them when it has none): the figure bs_compact weighs against
                          min_bucket_changes and, over count, min_change_ratio. Backends may
                          count the ops that arrived during a compaction differently */
} bs_bucket_info;

/* Calls fn for every bucket of the stream that holds at least one stored op, in ascending byte
 * order of name (memcmp, a shorter prefix first: the order of bs_get_bucket_data), starting
 * after start_after ({NULL, 0} = from the first; it need not name an existing bucket). A
 * callback that returns non-zero stops the call (BS_EUSER, CONVENTIONS); to page through
 * any number of buckets, stop after a page and call again with the last name seen (copy it:
 * info is borrowed) as start_after. One call reads one consistent snapshot and runs fn inside
 * it, so keep a call short (LMDB: a long-lived snapshot pins old pages); pages may come from
 * different snapshots. PostgreSQL: each 1000 buckets of a call are one statement, a snapshot of
 * their own, and fn runs in no transaction (a slow fn holds back no vacuum); each bucket is
 * still listed once, in order. fn may call the library's read functions, not write through it.
 * Each stream lists its own buckets only (equal names in two streams are two buckets).
 * Errors: BS_EINVAL (st or fn NULL, start_after data NULL with a size), BS_ETOOBIG (start_after
 * over BS_MAX_BUCKET_NAME), BS_EUNSUPPORTED (a backend built before this call), BS_EUSER (fn
 * stopped it). */
BS_API int bs_list_buckets(bs_storage *st, bs_val start_after,
                           int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                           bs_error *err);

typedef struct bs_checkpoint_changes {
  int invalidate_data_buckets;      /* too many, or range unknown: treat every bucket as changed */
  int invalidate_parameter_buckets; /* likewise for lookups */
  const bs_val *updated_buckets;
  size_t n_updated_buckets;
  const bs_val *updated_lookups; /* encoded keys (bs_lookup_decode) */
  size_t n_updated_lookups;
  const bs_val *updated_write_checkpoint_users;
  size_t n_updated_write_checkpoint_users;
} bs_checkpoint_changes;

/* What changed in (from, to], passed to fn once; changes and every array in it are borrowed,
 * valid until fn returns. Errors: BS_EINVAL (st or fn NULL, from > to, from or to >= 2^63), or
 * BS_EUSER (fn stopped it). */
BS_API int bs_get_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                     int (*fn)(const bs_checkpoint_changes *changes, void *payload),
                                     void *payload, bs_error *err);

/* The reference service's parameter-row limit: pass it for the default. */
#define BS_PARAM_LIMIT_DEFAULT 1000u

/* Bucket-parameter rows of the lookups at checkpoint, each passed to fn (borrowed JSON text).
 * limit is honoured as given: more rows than limit (with 0: any row) fail the call, fn having
 * seen none of them. Errors: BS_ELIMIT ("too many parameter results (limit was N)"),
 * BS_ESTALE (checkpoint below the parameter-compaction horizon, contract.md 5.5), BS_EINVAL (st
 * or fn NULL, lookups NULL with n_lookups, checkpoint >= 2^63), BS_ETOOBIG (a lookup key over
 * BS_MAX_LOOKUP_KEY), BS_EUSER (fn stopped it). */
BS_API int bs_get_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups,
                                 size_t n_lookups, size_t limit,
                                 int (*fn)(const bs_val *params, void *payload), void *payload,
                                 bs_error *err);

/* ---- Lookup key encoding --------------------------------------------------------------------- */
typedef enum bs_scalar_type {
  BS_SCALAR_NULL = 0,
  BS_SCALAR_FALSE = 1,
  BS_SCALAR_TRUE = 2,
  BS_SCALAR_INT = 3,    /* i */
  BS_SCALAR_DOUBLE = 4, /* d: integral values within int64 are encoded as INT */
  BS_SCALAR_STRING = 5  /* s: UTF-8 bytes */
} bs_scalar_type;

typedef struct bs_scalar {
  bs_scalar_type type;
  int64_t i;
  double d;
  bs_val s;
} bs_scalar;

/* Canonical, injective encoding of a list of scalars into buf (cap bytes); *size_out gets the
 * encoded size (also when it does not fit: then BS_ETOOBIG). Equal lists <=> equal bytes. */
BS_API int bs_lookup_encode(void *buf, size_t cap, size_t *size_out, const bs_scalar *values,
                            size_t n, bs_error *err);
/* Decodes key into values (cap entries; strings borrowed from key, valid while key is).
 * BS_ECORRUPT if malformed; BS_ETOOBIG when key holds more than cap values (*n_out = how many:
 * call again with that cap). Both are pure functions: any thread. */
BS_API int bs_lookup_decode(bs_scalar *values, size_t cap, size_t *n_out, bs_val key,
                            bs_error *err);

/* ---- Checksums ------------------------------------------------------------------------------- */
/* PUT checksum: hash("put." + object_type + "." + object_id + "." + data). */
BS_API uint32_t bs_checksum_put(bs_hash hash, bs_val object_type, bs_val object_id, bs_val data);
/* REMOVE checksum: hash("delete." + subkey). */
BS_API uint32_t bs_checksum_remove(bs_hash hash, bs_val subkey);
/* Subkey of a source row: 8 lowercase hex digits of table id, '/', 32 lowercase hex digits of
 * XXH3-128 of replica_id (big-endian canonical). Writes BS_SUBKEY_SIZE bytes (no NUL). */
#define BS_SUBKEY_SIZE 41u
BS_API void bs_subkey(char out[BS_SUBKEY_SIZE], uint32_t table_id, bs_val replica_id);

/* ---- Write checkpoints (contract.md section 7) ----------------------------------------------- */
typedef enum bs_write_checkpoint_mode {
  BS_WCP_MANAGED = 0,
  BS_WCP_CUSTOM = 1
} bs_write_checkpoint_mode;

typedef struct bs_head {
  bs_val connection;
  bs_val lsn;
} bs_head;

typedef struct bs_managed_request {
  bs_val user_id; /* full user id: user_id or user_id/client_id */
  const bs_head *heads;
  size_t n_heads;
  int has_request_id;
  uint64_t request_id;
  /* ms since the epoch, >= 1; 0 = now (the time of the call). 0 is the "now" of a zeroed
   * request, the usual case; no client request is made at the epoch itself */
  int64_t requested_at_ms;
} bs_managed_request;

/* Sets how st serves write checkpoints (default managed); a setting of the storage, not
 * stored in the file. event (custom mode) may be {NULL, 0}. Errors: BS_EINVAL (st
 * NULL, unknown mode), BS_ETOOBIG (event over 255 bytes). */
BS_API int bs_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                        bs_error *err);
/* One write transaction for the batch. ids_out[i] (n entries) = the stored id of request i's
 * user after the batch; *should_advance (may be NULL) = 1 when a record waits for a commit.
 * Errors: BS_ESTATE (custom mode, read-only db), BS_EINVAL / BS_ETOOBIG (a request, named; a
 * request_id >= 2^63, or an id that would pass it). */
BS_API int bs_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance,
                                               bs_storage *st, const bs_managed_request *req,
                                               size_t n, bs_error *err);
/* Managed mode: the user's id iff every head of its record is reached by heads (the given
 * list names that connection at an LSN at or above it; connections the record does not have
 * are ignored). Custom mode: the stored value for (user, the mode's event); heads are not
 * used. *found = 0 when there is none; heads may be NULL when n_heads is 0. Errors: BS_EINVAL
 * (st, id_out or found NULL, heads NULL with n_heads), BS_ETOOBIG (user_id, a connection or an
 * LSN over its limit). */
BS_API int bs_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user_id,
                                    const bs_head *heads, size_t n_heads, bs_error *err);
/* Deletes the processed managed records (database-wide) and the custom records of st's
 * stream whose requested_at < before_ms. Records without requested_at (generated managed ids,
 * persistent custom checkpoints) are kept. Managed ids never go backwards: a user whose record
 * was deleted gets ids above the deleted one. *deleted_out may be NULL. before_ms: ms since the
 * Unix epoch. Errors: BS_EINVAL (st NULL), BS_ESTATE (read-only db). */
BS_API int bs_delete_checkpoint_requests_before(uint64_t *deleted_out, bs_storage *st,
                                                int64_t before_ms, bs_error *err);

/* ---- Compaction (contract.md section 6) ------------------------------------------------------ */
typedef struct bs_compact_stats {
  uint64_t buckets_compacted;
  uint64_t ops_moved;
  uint64_t ops_cleared;
  uint64_t ops_removed;
  uint64_t bytes_before;
  uint64_t bytes_after;
  uint64_t parameter_entries_removed;
  uint64_t checkpoint_requests_deleted;
  uint64_t ops_reemitted; /* defragmentation: live PUTs re-emitted with new op ids */
} bs_compact_stats;

typedef struct bs_compact_options {
  unsigned version;
  uint64_t max_op_id;    /* horizon; 0 = the current checkpoint */
  const bs_val *buckets; /* full: NULL = select by the two thresholds below; either way a
                            bucket with no op at or below the horizon is left alone; incremental
                            compaction ignores it (it works the buckets the writers logged) */
  size_t n_buckets;
  uint64_t min_bucket_changes; /* 0 = BS_COMPACT_MIN_BUCKET_CHANGES */
  double min_change_ratio;     /* < 0 = BS_COMPACT_MIN_CHANGE_RATIO */
  size_t memory_limit_mb;      /* 0 = BS_COMPACT_MEMORY_LIMIT_MB */
  int incremental_only;
  int64_t min_age_ms; /* incremental horizon age; < 0 = BS_COMPACT_MIN_AGE_MS */
  /* 0 = BS_COMPACT_MAX_OPS_PER_TXN (minimum 2). The write lock is held for a whole transaction, commit included,
   * so this bounds how long a writer of the stream waits. Measured (2 vCPU VM, 500k ops, 50%
   * superseded, durable full compaction): 10000 -> ~5 ms per transaction (p50, max ~17 ms) at
   * 2.1-3.2M ops/s; 50000 -> ~25-40 ms (max ~70 ms) at 1.9-3.2M ops/s, i.e. no measurable gain.
   * Larger values only pay where each commit's fsync is slow; raise it for offline runs. */
  size_t max_ops_per_txn;
  uint64_t op_budget; /* incremental: stop after this many ops; 0 = unbounded */
  int compact_parameters;
  int64_t delete_checkpoint_requests_before_ms; /* 0 = don't */
  /* > 0: defragmentation (contract.md 6), after the MOVE/CLEAR pass, of the buckets it processed
   * whose live rows (membership PUTs at or below the horizon) are fewer than this fraction of
   * their ops: the live PUTs are re-emitted at the end with new op ids (same payload and
   * checksum; existing clients download them again; visible at the next checkpoint; the bucket
   * checksum at that checkpoint grows by theirs, as for any new op). The superseded PUTs fold at
   * the next compaction whose horizon covers the new ops. 0 = off. */
  double defragment_ratio;
  /* progress whenever the totals changed: after each transaction, and once at the end with the
   * call's totals (what stats_out gets); non-zero return cancels (returns BS_ECANCELED) */
  int (*progress)(const bs_compact_stats *so_far, void *payload);
  void *progress_payload;
} bs_compact_options;
#define BS_COMPACT_OPTIONS_VERSION 1
#define BS_COMPACT_OPTIONS_INIT                                                                    \
  { BS_COMPACT_OPTIONS_VERSION, 0, NULL, 0, 0, -1.0, 0, 0, -1, 0, 0, 0, 0, 0.0, NULL, NULL }
/* The defaults of bs_compact_options, plain literals so that a host can print them (the CLI's
 * help stringizes them). The two thresholds a full compaction selects buckets by
 * (bs_compact_bucket_due): a bucket is due with at least this many ops since its last compaction
 * (bs_bucket_info.changes) that are at least this share of its ops (changes / count). */
#define BS_COMPACT_MIN_BUCKET_CHANGES 10
#define BS_COMPACT_MIN_CHANGE_RATIO   0.1
#define BS_COMPACT_MEMORY_LIMIT_MB    64     /* the seen-set of a bucket's row identities */
#define BS_COMPACT_MIN_AGE_MS         300000 /* incremental compaction's horizon age */
#define BS_COMPACT_MAX_OPS_PER_TXN    10000  /* ops changed per write transaction */

/* Compacts the stream (full, or incremental with incremental_only) in short write
 * transactions of at most max_ops_per_txn ops, so a writer of the stream (in this or another
 * process) waits only briefly. What any client ends with never changes (contract.md section 9).
 * opts may be NULL (defaults); stats_out (may be NULL) gets the totals, also on failure or
 * cancel (what was done so far). Errors: BS_EINVAL (bad option, named), BS_ETOOBIG (a bucket
 * name over BS_MAX_BUCKET_NAME), BS_ESTATE (read-only db), BS_ECANCELED (progress returned
 * non-zero: the transactions already committed stay, nothing is half-done). Any thread; a second concurrent compaction of the same stream
 * is safe (it serialises on the write lock). PostgreSQL: every compaction also deletes the
 * stream's change records below the aged checkpoint (the newest at least min_age_ms old; a
 * record naming write-checkpoint users keeps those), so bs_get_checkpoint_changes from below it
 * answers with the invalidate flags (contract.md 5.1). */
BS_API int bs_compact(bs_compact_stats *stats_out, bs_storage *st, const bs_compact_options *opts,
                      bs_error *err);
/* *due = 1 when a full bs_compact with opts (NULL = the defaults) and no opts->buckets would
 * select the bucket bs_list_buckets described: its changes at least min_bucket_changes and, over
 * its count, at least min_change_ratio, the defaults applied as bs_compact applies them (the
 * horizon aside). For hosts that plan or report compaction; bs_compact decides by the same rule.
 * Errors: BS_EINVAL (due or bucket NULL, a bad option, named; *due is then 0). */
BS_API int bs_compact_bucket_due(int *due, const bs_compact_options *opts,
                                 const bs_bucket_info *bucket, bs_error *err);
/* Before the first checkpoint only (else BS_ESTATE; also on a read-only db). max_op_id 0 = last
 * persisted op. Buckets with fewer than min_bucket_changes ops (0 = 1) are skipped, and so are
 * those with no op at or below max_op_id (left as they are, still due for a later run);
 * *buckets_out (may be NULL) = buckets compacted. Errors: BS_ESTATE (as said), BS_EINVAL (st
 * NULL, max_op_id >= 2^63). */
BS_API int bs_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                          uint64_t min_bucket_changes, bs_error *err);

/* ---- Lifecycle and inspection ---------------------------------------------------------------- */
typedef struct bs_status {
  bs_stream_state state;
  int snapshot_done; /* snapshot done and a checkpoint exists */
  uint64_t checkpoint;
  uint64_t last_persisted_op;
  int has_lsn;
  size_t lsn_size;
  unsigned char lsn[BS_MAX_LSN];
  int has_resume_lsn;
  size_t resume_lsn_size;
  unsigned char resume_lsn[BS_MAX_LSN];
  char last_error[256]; /* "" when none */
} bs_status;

/* Fills out with the stream's lifecycle state (a copy: no borrowed pointers). Errors:
 * BS_EINVAL (st or out NULL). */
BS_API int bs_get_status(bs_status *out, bs_storage *st, bs_error *err);
/* Records message (copied, cut to 255 bytes) as the stream's last error (bs_status); an
 * ACTIVE stream becomes ERRORED (still served). Errors: BS_EINVAL (st NULL), BS_ESTATE
 * (read-only db). */
BS_API int bs_report_error(bs_storage *st, const char *message, bs_error *err);
/* Drops every op, bucket, lookup, source record and checkpoint of the stream. Also drops the
 * stream's entries from this process's checksum cache (bs_terminate too); another process that
 * has the file open and served checksums of the stream should reopen it. The stream itself
 * stays (bs_terminate ends it); the freed pages stay in the file (CAVEATS). The clear is atomic:
 * LMDB commits the stream's reset checkpoint state and a fence in one transaction, from which on
 * every reader (also of another process, or after a crash) sees the stream empty, then deletes
 * the records in bounded transactions. One that fails or is killed after the fence returns or
 * leaves the clear done, its deletion finished lazily: by the next write of the stream (a
 * flush, commit, truncate or compaction, before it writes) or the next read-write bs_open;
 * bs_db_verify says a clear is pending (docs/format.md 4.7). Errors: BS_EINVAL (st NULL),
 * BS_ESTATE (read-only db); an error after the fence leaves the clear done. */
BS_API int bs_clear(bs_storage *st, bs_error *err);
/* Marks the stream TERMINATED (no writer may open on it again); with clear non-zero, also clears
 * it as bs_clear() does, the new state and the clear's fence in one transaction (atomic, the
 * deletion finished lazily). Errors: BS_EINVAL (st NULL), BS_ESTATE (read-only db). */
BS_API int bs_terminate(bs_storage *st, int clear, bs_error *err);

typedef struct bs_stat {
  uint64_t streams;
  uint64_t buckets;
  uint64_t ops_put, ops_remove, ops_move, ops_clear;
  uint64_t parameter_entries;
  uint64_t source_records;
  uint64_t write_checkpoints;
  /* The file's size. PostgreSQL: the bs_ tables' pg_total_relation_size (indexes and TOAST
   * included) in the handle's schema. */
  uint64_t file_bytes;
  /* Bytes of the file on free pages (LMDB's free list: pages that compaction, deletes and
   * old versions released). Later writes reuse them, but the file never shrinks; bs_backup()
   * writes a copy without them. 0 for the memory backend, and for the PostgreSQL backend
   * (the server reclaims space itself: VACUUM). */
  uint64_t reclaimable_bytes;
} bs_stat;

/* Counts over the whole database (every stream) in one read snapshot; walks every sub-database,
 * so it costs a full scan of the file (PostgreSQL: a count of every table, one statement). The
 * counts are what readers see: an LMDB stream whose clear is pending (bs_clear) counts as a stream
 * with nothing in it, though its records, until their deletion finishes, still take file_bytes.
 * Errors: BS_EINVAL (db or out NULL). */
BS_API int bs_db_stat(bs_stat *out, bs_db *db, bs_error *err);
/* Recomputes every PUT's and REMOVE's checksum from its payload with the stream's hash, every
 * bucket's running checksum and count from its ops (which covers MOVE and CLEAR), and checks key
 * and value encodings and that source records point at their PUTs, in one read snapshot. Each
 * problem, naming the bucket and (where one op is at fault) the op id, is passed to fn (may be
 * NULL; the text is borrowed, valid until fn returns). *problems_out (may be NULL) counts them.
 * A note that is not a problem also goes to fn, uncounted: an LMDB stream whose clear is pending
 * (its records fenced, their deletion not finished; bs_clear), whose records are not checked.
 * Problems found still return BS_OK: a failure code means the check itself could not run
 * (BS_EINVAL: db NULL; BS_EIO, BS_ENOMEM). PostgreSQL: the same checks on its tables (and their
 * columns' bounds), in one READ ONLY REPEATABLE READ transaction (it writes nothing, also on a
 * read-write handle), read a page of rows at a time; fn runs after it ended (never holding the
 * snapshot open): the problems' first 256 KiB of text are kept for it, and when more were found
 * a last call says how many (*problems_out counts them all). */
BS_API int bs_db_verify(uint64_t *problems_out, bs_db *db,
                        void (*fn)(const char *problem, void *payload), void *payload,
                        bs_error *err);

/* ---- Backup, export and load (mdb_copy / mdb_dump / mdb_load) ------------------------------ */
#define BS_BACKUP_REPLACE 0x1u /* bs_backup: replace a file that exists at path */

typedef struct bs_backup_options {
  unsigned version;
  unsigned flags; /* BS_BACKUP_* */
  /* bs_backup: once with 0 when its snapshot is taken (commits from then on are not in the
   * copy), then after each batch of records written (records so far; bs_load: after each
   * batch). Non-zero cancels: the call returns BS_ECANCELED and leaves nothing at path. It
   * runs in the calling thread, inside bs_backup's snapshot: it may read db, not write it. */
  int (*progress)(uint64_t records, void *payload);
  void *progress_payload;
  const bs_allocator *allocator; /* bs_load's (NULL = libc); bs_backup uses the db's */
} bs_backup_options;
#define BS_BACKUP_OPTIONS_VERSION 1
#define BS_BACKUP_OPTIONS_INIT                                                                     \
  { BS_BACKUP_OPTIONS_VERSION, 0, NULL, NULL, NULL }

/* Writes a consistent copy of the database (every stream, as of one read snapshot taken at the
 * start) to a new file at path. The copy is compacted: free pages are left out, so it is the
 * way to give back the space compaction freed (the database file itself never shrinks). It is
 * written beside path (a temporary directory in path's directory), opened and verified
 * (bs_db_verify, 0 problems), and only then renamed to path; on any failure nothing is left
 * at path. Writers, readers and compaction of db (in this and other processes) keep running
 * and are not waited for; what they commit after the snapshot is not in the copy. The snapshot
 * is held for the whole call (LMDB: old pages stay pinned, and a writer of this process that
 * must grow the map waits until the call ends). opts may be NULL. Errors: BS_EINVAL (path NULL
 * or empty, or naming db's own file), BS_ESTATE (path exists and BS_BACKUP_REPLACE is not set),
 * BS_ECORRUPT (the copy did not verify; the message has the first problem), BS_ECANCELED,
 * BS_EUNSUPPORTED (the memory backend: it has no file to copy; the PostgreSQL backend: it is no
 * file either, and its tables are not the LMDB format: copy it with pg_dump), BS_EIO,
 * BS_ENOMEM. Any thread.
 */
BS_API int bs_backup(bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err);

/* One record of a database file: a key and value of one of the backend's tables (LMDB: its
 * sub-databases, in the on-disk format of BS_FORMAT_VERSION; the meta table's "format" record
 * names it). stream: the stream the record belongs to, 0 for records of the whole database
 * (the format record, id counters, managed write checkpoints). */
typedef struct bs_record {
  const char *table; /* NUL-terminated name, e.g. "ops" */
  uint32_t stream;
  bs_val key, value;
} bs_record;

/* Calls fn for every record of the database (stream 0) or of one stream and the database-wide
 * ones, table by table, in key order, from one read snapshot (held for the whole call). rec
 * and its bytes are borrowed, valid until fn returns. The records are the LMDB format's, so
 * only an LMDB database has them: an export is not a way between backends. Errors: BS_EINVAL (fn
 * NULL), BS_EUNSUPPORTED (the memory and PostgreSQL backends, fn never called), BS_EIO,
 * BS_EUSER (fn stopped it). */
BS_API int bs_db_export(bs_db *db, uint32_t stream, int (*fn)(const bs_record *rec, void *payload),
                        void *payload, bs_error *err);

/* Creates a new database file at path (LMDB) from records (those of bs_db_export, e.g. read
 * back from `bucketstore dump`); path names a backend as bs_open reads it, and only LMDB's is
 * made from records. next fills *rec (borrowed until the next call) and returns 1,
 * returns 0 after the last one; any other value stops the call (BS_EUSER). The result is
 * written, verified and renamed into place as bs_backup's copy; the same records give the same
 * database, byte for byte in every record. Records exported by a build of an older format give
 * the file that build would have written, upgraded to this build's format as a read-write
 * bs_open upgrades it, before it is verified. Options: progress and allocator
 * (BS_BACKUP_REPLACE is refused: load never replaces a file). Errors: BS_EINVAL (path, opts),
 * BS_EUSER (next stopped it), BS_ESTATE (path exists), BS_ECORRUPT (an unknown table, a bad key,
 * no format record or one of a newer or unknown version, or the result did not verify),
 * BS_EUNSUPPORTED (a name bs_names_postgres accepts: a PostgreSQL database is restored with
 * pg_restore; next is never called), BS_ECANCELED, BS_EIO, BS_ENOMEM. Any thread. */
BS_API int bs_load(const char *path, const bs_backup_options *opts,
                   int (*next)(bs_record *rec, void *payload), void *payload, bs_error *err);

/* ==== Backend authors ============================================================================
 * The handles above are opaque here. A program that supplies its own backend (or wraps one:
 * tracing, fault injection) includes storage_backend.h, which defines their base structs and
 * the three method tables (database, storage, writer); docs/backends.md is the walk-through. */

#ifdef __cplusplus
}
#endif
#endif /* BUCKETSTORE_STORAGE_H */
