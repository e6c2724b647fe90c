/*
 * internal.h: what every module of the library shares and the host never sees, in three layers:
 *  1. the common layer (common.c): errors, allocator, array growth, the arena, BS_ASSERT, clock,
 *     byte order, the one hash table; it uses nothing else of the library;
 *  2. the front/backend contract: the front's state beside the bases of storage_backend.h, the
 *     backends' constructors;
 *  3. the rules (rules.c, lifecycle.c, checksum.c, effects.c, compact.c, lookup.c, verify.c) that
 *     the front and every backend apply, each written once; they use only the common layer.
 * The front (storage.c, writer.c, cache.c) uses all three; a backend uses the common layer and
 * the rules, never the front (`make layercheck` checks the object files with nm). No backend's
 * types: each backend's are in its own private header (lmdb_internal.h, mem_internal.h,
 * pg_internal.h).
 * `make install` ships none of them.
 *
 * Names: the public API is bs_ (storage.h); every symbol that is shared between the library's
 * files but not public is bs__ (two underscores), so a host's debugger, `nm` or a link error
 * never shows an internal function under the public prefix. `make layercheck` enforces it.
 */
#ifndef BUCKETSTORE_INTERNAL_H
#define BUCKETSTORE_INTERNAL_H

#include "storage_backend.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__)
#define BS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BS_PRINTF(a, b)
#endif

/* BS_ASSERT(cond): the front/backend contract, a condition the front guarantees a backend
 * (docs/backends.md), so a failure is a bug in the library and never bad input (which gets a
 * status code). Compiled in when BS_DEBUG is defined (the tree's builds, `make DEBUG=1`, the
 * default of make, make test and make check): it reports the condition on stderr and aborts.
 * Otherwise (`make DEBUG=0`, the amalgamation) it compiles to nothing: a release never aborts. */
#ifdef BS_DEBUG
void bs__assert_fail(const char *cond, const char *file, int line);
#define BS_ASSERT(cond) ((cond) ? (void)0 : bs__assert_fail(#cond, __FILE__, __LINE__))
#else
#define BS_ASSERT(cond) ((void)0)
#endif

/* A parameter that a callback or vtable signature imposes but this implementation does not need. */
#define BS_UNUSED(x) ((void)(x))

/* ================ 1. The common layer (common.c) ================ */

/* ---- Errors ---- */
/* Fills err (if any) with code and a formatted message; returns code. */
int bs__fail(bs_error *err, int code, const char *fmt, ...) BS_PRINTF(3, 4);
/* The one rule of a callback's non-zero return (storage.h CONVENTIONS): the call returns code,
 * BS_EUSER (BS_ECANCELED for a progress callback), and err names the callback ("bs_db_export's
 * fn") and quotes its value, which is never returned itself. */
int bs__callback_fail(bs_error *err, int code, const char *callback, int value);
/* Removes conninfo's passwords from msg (cap bytes, at most a bs_error's) where msg quotes them
 * (libpq's messages quote the URL or the part of it they refuse): bs_redact_conninfo's rule for
 * a message that came from outside the library. */
void bs__redact_message(char *msg, size_t cap, const char *conninfo);

/* ---- Clock ---- */
/* The one clock of stored times: wall-clock milliseconds since the Unix epoch (CLOCK_REALTIME).
 * Every time the library persists (stream creation, change records, write-checkpoint requests)
 * or compares with a persisted one (compaction's min_age_ms) must mean the same in another
 * process and after a reboot, which a monotonic clock's value does not. Timeouts measure elapsed
 * time on CLOCK_MONOTONIC instead (storage.c, bs_wait_checkpoint). */
int64_t bs__now_ms(void);
/* Tests only: bs__now_ms answers ms (>= 0) from now on, in every thread, until ms < 0 gives the
 * wall clock back. A test stamps its checkpoints with times of its choosing this way. */
void bs__set_now_ms(int64_t ms);
/* Milliseconds on CLOCK_MONOTONIC: elapsed time for timeouts only, never stored. */
uint64_t bs__monotonic_ms(void);
/* The CLOCK_MONOTONIC time ms from now: the deadline of a pthread_cond_timedwait on a condition
 * created with that clock (bs_wait_checkpoint's, the PostgreSQL listener's). */
struct timespec bs__monotonic_after(uint64_t ms);
/* bs_wait_checkpoint's polling period where no notification reaches it: commits of other
 * processes on LMDB (storage.c), a PostgreSQL hot standby (pg.c). */
#define BS_WAIT_POLL_MS 50u

/* ---- fork() ---- */
/* How many fork()s lie between this process and the one that first called this: a handle
 * records it at open, and a different value later means the handle came into a child through
 * fork(), where neither an LMDB environment nor a PostgreSQL connection may be used. */
unsigned bs__forks(void);

/* ---- Memory: every allocation goes through the db's allocator ---- */
void *bs__malloc(const bs_allocator *a, size_t n);
void *bs__calloc(const bs_allocator *a, size_t n, size_t size);
void *bs__realloc(const bs_allocator *a, void *p, size_t n);
void bs__free(const bs_allocator *a, void *p);
extern const bs_allocator bs__default_allocator;
/* The one allocator rule of every call that takes one (bs_open, bs_load): a (NULL, or all three
 * functions NULL: libc's) in *out; BS_EINVAL when only some functions are set. */
int bs__allocator_resolve(const bs_allocator *a, const bs_allocator **out, bs_error *err);
/* The one growth rule of arrays: *arr (of *cap elements of elem bytes) gets room for need
 * elements, the capacity doubling from at least 8; BS_ENOMEM (nothing changed) on overflow or
 * failure. BS_GROW(a, arr, cap, need) for a typed array arr. */
int bs__grow(const bs_allocator *a, void **arr, size_t *cap, size_t need, size_t elem);
#define BS_GROW(a, arr, cap, need)                                                                 \
  ((need) <= (cap) ? BS_OK : bs__grow((a), (void **)&(arr), &(cap), (need), sizeof *(arr)))

/* ---- Arena: many small allocations, freed together ---- */
/* Blocks of 64 KiB doubling to 4 MiB (or one of the size asked); 16-byte aligned pieces. a must
 * be set before the first allocation; a zeroed arena is empty. */
typedef struct bs__arena_blk {
  struct bs__arena_blk *next;
  size_t cap, used;
  max_align_t data[];
} bs__arena_blk;
typedef struct bs__arena {
  const bs_allocator *a;
  bs__arena_blk *head;
  size_t bytes; /* handed out since the last reset */
} bs__arena;
void *bs__arena_alloc(bs__arena *ar, size_t n); /* NULL: out of memory (or n absurd) */
void *bs__arena_dup(bs__arena *ar, const void *src, size_t n);
void bs__arena_reset(bs__arena *ar); /* keeps the newest (largest) block for reuse */
void bs__arena_free(bs__arena *ar);

/* ---- Byte-order helpers (keys are big-endian so memcmp order is numeric order) ---- */
static inline void bs__put_u32be(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}
static inline uint32_t bs__get_u32be(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void bs__put_u64be(unsigned char *p, uint64_t v) {
  bs__put_u32be(p, (uint32_t)(v >> 32));
  bs__put_u32be(p + 4, (uint32_t)v);
}
static inline uint64_t bs__get_u64be(const unsigned char *p) {
  return ((uint64_t)bs__get_u32be(p) << 32) | bs__get_u32be(p + 4);
}
/* Values are little-endian (the layout table below). */
static inline void bs__put_u16le(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}
static inline uint32_t bs__get_u16le(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static inline void bs__put_u32le(unsigned char *p, uint32_t v) {
  bs__put_u16le(p, v);
  bs__put_u16le(p + 2, v >> 16);
}
static inline uint32_t bs__get_u32le(const unsigned char *p) {
  return bs__get_u16le(p) | bs__get_u16le(p + 2) << 16;
}
static inline void bs__put_u64le(unsigned char *p, uint64_t v) {
  bs__put_u32le(p, (uint32_t)v);
  bs__put_u32le(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t bs__get_u64le(const unsigned char *p) {
  return (uint64_t)bs__get_u32le(p) | (uint64_t)bs__get_u32le(p + 4) << 32;
}
/* memcmp order with shorter-prefix-first: the LSN order of contract.md section 1. */
static inline int bs__val_cmp(bs_val a, bs_val b) {
  size_t n = a.size < b.size ? a.size : b.size;
  int c = n ? memcmp(a.data, b.data, n) : 0;
  if (c) return c;
  return a.size < b.size ? -1 : a.size > b.size;
}
static inline bool bs__val_eq(bs_val a, bs_val b) {
  return a.size == b.size && (a.size == 0 || memcmp(a.data, b.data, a.size) == 0);
}
static inline bs_val bs__val_str(const char *s) {
  bs_val v = {s, s ? strlen(s) : 0};
  return v;
}
/* v's bytes copied to *p (advanced past them); an empty v stays absent or present as it was. */
static inline bs_val bs__val_put(unsigned char **p, bs_val v) {
  bs_val r = {v.data ? *p : NULL, v.size};
  if (v.size) memcpy(*p, v.data, v.size);
  *p += v.size;
  return r;
}
/* n byte strings copied into one allocation (the vals, then their bytes), to hand out after a
 * lock or a snapshot ends; an empty string is non-NULL. BS_ENOMEM. */
int bs__vals_copy(const bs_allocator *a, const bs_val *in, size_t n, bs_val **out);

/* Bytes of a bucket name quoted in a message ("%.*s"). */
static inline int bs__name_shown(bs_val name) {
  return (int)(name.size < 100 ? name.size : 100);
}

/* ---- The hash table: the one open-addressing table of the library ---- */
/* Linear probing over (hash, value) entries, at most half full, the capacity a power of two. It
 * maps a 64-bit hash to values the caller chooses (an array index + 1, an offset + 1, a pointer):
 * it narrows a search, the caller compares its own key, so the table neither owns nor hashes
 * keys. value 0 marks a free entry. A zeroed bs__htab is an empty table. */
typedef struct bs__hent {
  uint64_t hash;
  uintptr_t value;
} bs__hent;
typedef struct bs__htab {
  bs__hent *e;
  size_t cap, n;
} bs__htab;
/* Makes room for need entries in all: the only call that can fail (BS_ENOMEM, table unchanged). */
int bs__htab_reserve(bs__htab *t, const bs_allocator *a, size_t need);
/* Adds (hash, value != 0); put needs room reserved, add reserves it (BS_ENOMEM). */
void bs__htab_put(bs__htab *t, uint64_t hash, uintptr_t value);
int bs__htab_add(bs__htab *t, const bs_allocator *a, uint64_t hash, uintptr_t value);
/* Removes the entry (hash, value) / changes its value to `to`; absent: nothing happens. */
void bs__htab_remove(bs__htab *t, uint64_t hash, uintptr_t value);
void bs__htab_replace(bs__htab *t, uint64_t hash, uintptr_t from, uintptr_t to);
void bs__htab_clear(bs__htab *t); /* forgets every entry, keeps the memory */
void bs__htab_free(bs__htab *t, const bs_allocator *a);
/* XXH3_64 of v's bytes: the hash a table user keys a byte string by. */
uint64_t bs__val_hash(bs_val v);
/* A lookup: the values stored under hash, one per bs__htab_next, 0 after the last:
 *   bs__hprobe p = bs__htab_probe(t, h);
 *   for (uintptr_t v; (v = bs__htab_next(&p));) if (key_of(v) equals the key) ...
 * The table must not change while a probe is in use. */
typedef struct bs__hprobe {
  const bs__htab *t;
  uint64_t hash;
  size_t i;
} bs__hprobe;
static inline bs__hprobe bs__htab_probe(const bs__htab *t, uint64_t hash) {
  bs__hprobe p = {t, hash, t->cap ? (size_t)hash & (t->cap - 1) : 0};
  return p;
}
static inline uintptr_t bs__htab_next(bs__hprobe *p) {
  const bs__htab *t = p->t;
  if (!t->cap) return 0;
  for (;;) { /* ends: at most half of the entries are used */
    const bs__hent *e = &t->e[p->i];
    if (!e->value) return 0;
    p->i = (p->i + 1) & (t->cap - 1);
    if (e->hash == p->hash) return e->value;
  }
}

/* A set of borrowed byte strings: v holds each once, in the order first added (idx: index + 1).
 * A zeroed bs__vset is empty. add: BS_ENOMEM leaves the set as it was. */
typedef struct bs__vset {
  bs_val *v;
  size_t n, cap;
  bs__htab idx;
} bs__vset;
int bs__vset_add(bs__vset *s, const bs_allocator *a, bs_val v);
void bs__vset_free(bs__vset *s, const bs_allocator *a);

/* ================ 2. The front/backend contract ================ */

/* ---- The front's state of a database and a writer (storage_backend.h: bs_db.front,
 * bs_writer.front): allocated and freed by the front (storage.c), never touched by a backend ---- */
struct bs__db_front {
  struct bs__cksum_cache *cache; /* shared by every storage of this db; NULL = disabled */
  unsigned forks;                /* bs__forks() at the open */
  /* checkpoint notification: bumped and broadcast after each commit that made a checkpoint */
  pthread_mutex_t notify_mu;
  pthread_cond_t notify_cv;
  uint64_t notify_seq;
  void (*listener)(uint32_t stream, uint64_t checkpoint, void *payload);
  void *listener_payload;
};

/* The writer's queue (writer.c): one arena copy per save, the items in call order. records and
 * bytes measure the saves against the auto-flush bounds (bs_writer_options). */
typedef struct bs__queue {
  bs__arena ar;
  bs_write_item *items;
  size_t n, cap;
  size_t records, bytes;
} bs__queue;
/* Copies s (checked) / a custom write checkpoint into the queue; BS_ENOMEM leaves it as it was. */
int bs__queue_save(bs__queue *q, const bs_allocator *a, const bs_save *s);
int bs__queue_wcp(bs__queue *q, const bs_allocator *a, bs_val user_id, uint64_t checkpoint,
                  bs_val event, int64_t requested_at_ms);
bs_write_batch bs__queue_batch(const bs__queue *q); /* borrowed until the next queue call */
void bs__queue_reset(bs__queue *q);                 /* after the batch was applied */
void bs__queue_free(bs__queue *q, const bs_allocator *a);

struct bs__writer_front {
  bs_writer_options opts; /* as bs_writer_open resolved them */
  bs__queue q;        /* what was queued since the last flush; a backend never flushes on its own */
  bs_storage *locked; /* whose writer lock (of opts.snapshot's kind) the writer holds */
};

/* A built-in backend's constructor fills its db base from opts (checked by the front: the
 * allocator rule cannot fail here). */
static inline void bs__db_base_set(bs_db *db, const bs_db_vtable *vt, const bs_open_options *opts) {
  const bs_allocator *a = &bs__default_allocator;
  bs__allocator_resolve(opts ? opts->allocator : NULL, &a, NULL);
  db->vt = vt;
  db->alloc = *a;
  db->flags = opts ? opts->flags : 0;
  db->front = NULL;
}

/* Backend constructors, and the database tables of those with a file or a URL, whose load slot
 * bs_load calls without a handle. */
int bs__lmdb_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err);
extern const bs_db_vtable bs__lmdb_db_vt;
int bs__mem_open(bs_db **out, const bs_open_options *opts, bs_error *err);
#ifdef BS_HAVE_PG
/* pg.c, built with BS_HAVE_PG (make PG=1; the amalgamation compiled with it): url is a libpq
 * connection string or URI. */
int bs__pg_open(bs_db **out, const char *url, const bs_open_options *opts, bs_error *err);
extern const bs_db_vtable bs__pg_db_vt;
#endif

/* bs_batch_options defaults (storage.h; the limit's is BS_BATCH_LIMIT_DEFAULT there), applied
 * by the front. */
#define BS_DEFAULT_BATCH_BYTES (16u * 1024u * 1024u)

/* PUT and REMOVE carry object_type, object_id and subkey (PUT also data); MOVE and CLEAR carry
 * none. A carried field is present: its data is never NULL, also when it is empty (storage.h
 * CONVENTIONS); a field not carried is {NULL, 0}. bs__op_fields says so of an op read, for every
 * backend (the chunker applies it to each op it hands out). */
static inline int bs__op_carries_row(bs_op_type type) {
  return type == BS_OP_PUT || type == BS_OP_REMOVE;
}
static inline bs_val bs__op_field(bs_val v, int carried) {
  if (!carried) return (bs_val){NULL, 0};
  if (!v.data) v.data = "";
  return v;
}
static inline void bs__op_fields(bs_op *op) {
  int row = bs__op_carries_row(op->type);
  op->object_type = bs__op_field(op->object_type, row);
  op->object_id = bs__op_field(op->object_id, row);
  op->subkey = bs__op_field(op->subkey, row);
  op->data = bs__op_field(op->data, op->type == BS_OP_PUT);
}

/* ========= 3. Rules (rules.c, checksum.c, effects.c, compact.c, lookup.c, verify.c) ========= */

/* ---- Options and checkpoints (rules.c) ---- */
/* ---- Versioned structs (storage.h: options structs and backend tables only grow at the end) --
 * BS_SIZES(T)[v - 1] is the size of version v of T: what a caller (or a backend) built against
 * version v has, and all the library may read of it. The current version's is sizeof(T); the
 * older ones are BS_OLDER_T, each followed by a comma. Appending a field to T means bumping its
 * BS_*_VERSION and appending the previous version's size, offsetof(T, the new field), to
 * BS_OLDER_T; rules.c asserts one size per version. A backend table's sizes come from its slot
 * list instead (BS_TABLE_SIZE below). */
#define BS_OLDER_bs_open_options    offsetof(bs_open_options, pg_max_connections),
#define BS_OLDER_bs_stream_options  /* none yet */
#define BS_OLDER_bs_save            /* none yet */
#define BS_OLDER_bs_writer_options  /* none yet */
#define BS_OLDER_bs_commit_options  /* none yet */
#define BS_OLDER_bs_batch_options   /* none yet */
#define BS_OLDER_bs_compact_options /* none yet */
#define BS_OLDER_bs_backup_options  /* none yet */
/* The first version of each backend table whose slots have this build's signatures: the front
 * refuses an older table (storage.c HANDLE_CHECK), whose slots take their arguments in another
 * order. Changing a slot's signature means bumping its table's version and this to it. */
#define BS_FIRST_bs_db_vtable       2
#define BS_FIRST_bs_storage_vtable  5
#define BS_FIRST_bs_writer_vtable   2
#define BS_SIZES(T)                 ((const size_t[]){BS_OLDER_##T sizeof(T)})
#define BS_VERSIONS(T)              ((unsigned)(sizeof BS_SIZES(T) / sizeof(size_t)))
/* The caller's in (an options struct: its version first, checked 1..current, else BS_EINVAL
 * naming what) over out, which holds the defaults: only the bytes of in's version are read, the
 * fields of later versions keep their defaults; out's version is the current one. */
int bs__versioned_copy(void *out, const void *in, const size_t *sizes, unsigned current,
                       const char *what, bs_error *err);
#define BS_VERSIONED_COPY(out, in, T, what, err)                                                   \
  bs__versioned_copy(out, in, BS_SIZES(T), BS_VERSIONS(T), what, err)
/* The bytes of a backend table T of version v that the library may read, from the table's slot
 * list (storage_backend.h): up to the first slot a later version added; 0 for version 0, all of
 * T for a table of this build's version or newer. BS_TABLE_SIZE(T, v). */
#define BS__SLOT_CUT(name, since, params, args)                                                    \
  if ((since) > v && offsetof(bs__table, name) < n) n = offsetof(bs__table, name);
#define BS__TABLE_SIZE(T, SLOTS)                                                                   \
  typedef T bs__table;                                                                             \
  size_t n = sizeof(T);                                                                            \
  if (v == 0) return 0;                                                                            \
  SLOTS(BS__SLOT_CUT)                                                                              \
  return n;
static inline size_t bs__table_size_bs_db_vtable(unsigned v) {
  BS__TABLE_SIZE(bs_db_vtable, BS_DB_SLOTS)
}
static inline size_t bs__table_size_bs_storage_vtable(unsigned v) {
  BS__TABLE_SIZE(bs_storage_vtable, BS_STORAGE_SLOTS)
}
static inline size_t bs__table_size_bs_writer_vtable(unsigned v) {
  BS__TABLE_SIZE(bs_writer_vtable, BS_WRITER_SLOTS)
}
#define BS_TABLE_SIZE(T, v) bs__table_size_##T(v)
/* Does checkpoint a differ from b (op id, or the LSN's presence or bytes)? What ends a
 * bs_wait_checkpoint, in the front or in a backend's wait_checkpoint. */
static inline int bs__checkpoint_differs(const bs_checkpoint *a, const bs_checkpoint *b) {
  if (a->op_id != b->op_id || !a->has_lsn != !b->has_lsn) return 1;
  return a->has_lsn && (a->lsn_size != b->lsn_size || memcmp(a->lsn, b->lsn, a->lsn_size) != 0);
}

/* ---- A stream's states (contract.md 1, 4.4, 8; lifecycle.c): the one state machine ----
 * What an event does to the state of the stream it concerns and to every other stream of the
 * database. A backend reads the stored state, asks bs__stream_transition and stores the answer;
 * where it changes states in one statement without reading them first (PostgreSQL), it applies
 * a map of every state to its successor (bs__stream_map), passed as a parameter, so that no
 * state number is written twice. */
typedef enum bs__stream_event {
  BS__STREAM_CREATE,     /* bs_stream_create makes the stream (from: 0, it has no state yet) */
  BS__STREAM_WRITE,      /* a writer's call: open, flush, truncate, commit, the LSN calls */
  BS__STREAM_CHECKPOINT, /* a commit of the stream made a checkpoint */
  BS__STREAM_ERROR,      /* bs_report_error */
  BS__STREAM_TERMINATE   /* bs_terminate */
} bs__stream_event;
#define BS__STREAM_STATES (BS_STREAM_TERMINATED + 1) /* a map's entries, 0 (no state) included */
typedef struct bs__stream_step {
  bs_stream_state to; /* the stream's state afterwards */
  int others_change;  /* 0: every other stream keeps its state (others is the identity) */
  uint8_t others[BS__STREAM_STATES]; /* else another stream in state s goes to others[s] */
} bs__stream_step;
/* The step of ev from state from of stream (named in messages). BS_ESTATE when the stream's
 * state refuses ev (a write on a terminated stream), BS_ECORRUPT when from is no state; *out is
 * set only on BS_OK. */
int bs__stream_transition(bs__stream_step *out, uint32_t stream, unsigned from, bs__stream_event ev,
                          bs_error *err);
/* map[s]: the state a stream in state s takes on ev (an ev that changes no other stream), 0
 * where ev is refused; map[0] = 0. */
void bs__stream_map(uint8_t map[BS__STREAM_STATES], bs__stream_event ev);
/* Is s one of the five states? */
static inline int bs__stream_known(int s) {
  return s >= BS_STREAM_PROCESSING && s <= BS_STREAM_TERMINATED;
}
/* Is a stream in state s the served one (bs_storage_open of stream 0 picks the newest)? */
static inline int bs__stream_served(unsigned s) {
  return s == BS_STREAM_ACTIVE || s == BS_STREAM_ERRORED;
}

/* ---- A commit (contract.md 4.4; lifecycle.c): what it does, decided once ----
 * A backend reads its stream's row (bs__stream_row below; locked against other writers), asks
 * bs__plan_commit_row, applies bs__commit_row to the row and stores it with what the plan's
 * checkpoint does, in the commit's transaction. An LSN whose data is NULL is not set (an empty
 * LSN that is set has data). */
typedef struct bs__commit_plan {
  bs_block_reason blocked; /* why the commit may make no checkpoint; BS_BLOCKED_NONE: it may */
  /* The commit makes a checkpoint: checkpoint = last_checkpoint_op = op_head, checkpoint_lsn =
   * the commit's LSN, and what a checkpoint does (write checkpoints processed, its change
   * record, the purge of soft-deleted records, step). */
  int checkpoint;
  int raise_resume;     /* resume_lsn = the commit's LSN: it only rises */
  bs__stream_step step; /* the states afterwards (no change without a checkpoint) */
  /* What the checkpoint does (set when checkpoint is): */
  uint64_t
      purge_to; /* the soft-deleted records of a mark <= purge_to are purged (contract.md 4.3) */
} bs__commit_plan;
/* ---- The change-record cap (contract.md 5.1; lifecycle.c), decided once ----
 * A flush's change record names the buckets and the lookups it changed, and checkpoint_changes
 * those changed in its range. A kind of n names with bs__changes_too_many(n) is stored and
 * reported as "too many" (invalidate-all) without its list. Once a kind is too many it stays so
 * however many more names come: a collector may stop at bs__changes_enough() names. */
int bs__changes_too_many(size_t n);
size_t bs__changes_enough(void);
/* checkpoint_changes(from, to) invalidates every kind when from lies below the stream's change
 * fence (bs__changes_fenced); its buckets and lookups are those changed by ops in (from, to], its
 * write-checkpoint users those filed under an op id in [bs__changes_users_from(from), to]. */
int bs__changes_fenced(uint64_t from, uint64_t fence);
uint64_t bs__changes_users_from(uint64_t from);

/* ---- Aged records (contract.md 6 and 7; lifecycle.c), decided once ----
 * A record made or requested at at_ms (< 0: no time) is aged at a cutoff when bs__aged says so:
 * at or before it. The cutoffs carry the rules: a compaction at now_ms with min_age_ms takes the
 * newest checkpoint aged at bs__aged_cutoff as its aged checkpoint, and
 * delete_checkpoint_requests_before(before_ms) deletes the requests aged at bs__request_cutoff
 * (bs__request_expired: a managed one only once processed). A backend enumerates its records and
 * keeps or deletes what these answer; PostgreSQL's statements compare with <= the cutoff they are
 * given, as bs__aged does. */
int bs__aged(int64_t at_ms, int64_t cutoff_ms);
int64_t bs__aged_cutoff(int64_t now_ms, int64_t min_age_ms);
int64_t bs__request_cutoff(int64_t before_ms);
/* processed: 1 for a custom record (no client waits on its processing). */
int bs__request_expired(int64_t requested_at_ms, int processed, int64_t before_ms);

/* ---- A clear and a terminate (contract.md 8; lifecycle.c): what they leave, decided once ----
 * A backend reads its stream's row (locked against writers), asks bs__stream_reset and stores
 * every field of it, in the transaction that (for a clear) deletes every other record of the
 * stream: its ops, buckets, lookups, source tables and records, change records, custom write
 * checkpoints and compaction logs. Fields a backend has no use for it need not store. */
typedef struct bs__stream_row {
  unsigned state; /* bs_stream_state */
  int snapshot_done;
  uint64_t op_head; /* kept by a clear, as the next source table id: no id is used twice */
  uint64_t checkpoint, last_checkpoint_op;
  bs_val checkpoint_lsn, resume_lsn, no_checkpoint_before; /* data NULL: not set */
  uint64_t param_horizon, param_cursor, compact_horizon;
  uint64_t changes_fence; /* checkpoint_changes from below it invalidates */
} bs__stream_row;
/* The row of stream (named in messages) after bs_clear (clear), bs_terminate(clear)
 * (terminate): a clear gives the checkpoint state of a new stream, terminate the state
 * TERMINATED (BS_ECORRUPT when row->state is no state); row is changed only on BS_OK. */
int bs__stream_reset(bs__stream_row *row, uint32_t stream, int clear, int terminate, bs_error *err);

/* ---- snapshot_done and resume_lsn (contract.md 4.4; lifecycle.c), decided once ----
 * A backend reads its stream's row (locked against other writers), asks bs__plan_lsn and stores
 * the fields the plan names, with the call's lsn, in one transaction. */
typedef struct bs__lsn_plan {
  int snapshot_done;        /* snapshot_done = 1 */
  int no_checkpoint_before; /* no_checkpoint_before = lsn: it only rises */
  int resume_lsn;           /* resume_lsn = lsn, lower or not (the caller's restart point) */
} bs__lsn_plan;
/* The plan of a writer's snapshot_done(lsn) (snapshot_done 1) or resume_lsn(lsn) (0) on row, of
 * stream (named in messages). Refused like any write by the stream's state
 * (bs__stream_transition); *out is set only on BS_OK. */
int bs__plan_lsn(bs__lsn_plan *out, uint32_t stream, const bs__stream_row *row, int snapshot_done,
                 bs_val lsn, bs_error *err);
/* The plan of a commit at lsn of stream (named in messages), create_empty 0 or 1, on its row
 * (op_head: the last op id persisted, the commit's own flush included; last_checkpoint_op: the
 * op head at the last checkpoint). Refused like any write by the stream's state
 * (bs__stream_transition); *out is set only on BS_OK. Then the row every backend stores, written
 * once: the row after a commit at lsn planned p (the resume LSN, the checkpoint's fields and the
 * stream's state: what the checkpoint does to other records and streams stays the backend's to
 * store); the row after a writer's snapshot_done or resume_lsn planned p. A set LSN points at
 * the call's lsn (a backend copies what it keeps), and has data also when empty. */
int bs__plan_commit_row(bs__commit_plan *out, uint32_t stream, const bs__stream_row *row,
                        bs_val lsn, int create_empty, bs_error *err);
void bs__commit_row(bs__stream_row *row, const bs__commit_plan *p, bs_val lsn);
void bs__lsn_row(bs__stream_row *row, const bs__lsn_plan *p, bs_val lsn);

/* ---- Read checks (contract.md 5.5, 5.4; rules.c): every backend applies them to the values it
 * read in the call's one snapshot ---- */
/* A torn read: compaction folded bucket name's ops <= c into its leading CLEAR, whose span
 * [clear_start, clear_op) holds c (clear_op 0: none); BS_EINVALIDATED, else BS_OK. */
int bs__torn_fail(uint64_t c, bs_val name, bs_error *err);
static inline int bs__torn_check(uint64_t clear_start, uint64_t clear_op, uint64_t c, bs_val name,
                                 bs_error *err) {
  return clear_op && clear_start <= c && c < clear_op ? bs__torn_fail(c, name, err) : BS_OK;
}
/* A parameter read at c below the stream's parameter-compaction horizon: BS_ESTALE. */
int bs__param_horizon_check(uint64_t c, uint64_t horizon, bs_error *err);
/* A parameter read that would hand out n rows: more than limit is BS_ELIMIT. */
int bs__param_limit_check(size_t n, size_t limit, bs_error *err);
/* bs_writer_source_row of a row without a live source record: BS_ENOTFOUND naming table. */
int bs__source_row_missing(bs_val table, bs_error *err);
/* bs_stat's ops by type: counts one op of type (a bs_op_type) in out; another value is not
 * counted (verify reports it). */
void bs__stat_op(bs_stat *out, unsigned type);

/* ---- Bucket data chunks (contract.md 5.2, rules.c): the chunking rule of every backend ----
 * A bucket_data call starts each bucket it serves (bs__chunker_bucket), adds the bucket's ops in
 * (after, C] in op id order (bs__chunker_add) while the call is not stopped, and ends it
 * (bs__chunker_end). A chunk is cut before the op that would take it past chunk_bytes (one
 * larger op gets a chunk of its own); the call stops before the op that would pass limit ops or
 * max_bytes (stopped: that op exists, so has_more is exact). Ops are kept as given (their
 * strings borrowed) until their chunk is handed to on_chunk, whose non-zero return is passed on. */
/* Column mode (bs_get_bucket_columns, columns.c): the front hands the backend bs__cols_chunk as
 * on_chunk, with a bs__cols as its payload. A chunker given that on_chunk lays each op out in the
 * bs__cols's columns as it is added (bs__cols_add) and hands the chunk on in columns
 * (bs__cols_emit), so no bs_op is kept or copied; a backend that cuts its chunks itself calls
 * bs__cols_chunk with them, which lays them out the same way. */
typedef struct bs__cols {
  const bs_allocator *a;
  uint64_t *ids, *targets;
  uint8_t *types;
  uint32_t *sums, *offs; /* offs: 4 per op and one more, from 0 in each chunk */
  unsigned char *bytes;
  size_t cap, bcap, blen; /* ops and bytes room; bytes of the chunk so far */
  int (*on_chunk)(const bs_chunk_columns *, void *);
  void *payload;
  bs_error *err; /* the call's, for bs__cols_chunk's failures */
} bs__cols;
int bs__cols_chunk(const bs_chunk *c, void *payload);
/* Op i of the chunk being laid out (i: the ops before it in that chunk); BS_ENOMEM. */
int bs__cols_add(bs__cols *s, size_t i, const bs_op *op, bs_error *err);
/* Hands the chunk ch describes (its ops in s, n of them) to s->on_chunk; its return. */
int bs__cols_emit(bs__cols *s, const bs_chunk *ch, size_t n);
void bs__cols_free(bs__cols *s);
/* Room in every op column for op i; room for need bytes of fields, the first block first bytes
 * (0: 4 KiB). BS_ENOMEM. */
int bs__cols_room(bs__cols *s, size_t i, bs_error *err);
int bs__cols_bytes(bs__cols *s, size_t first, size_t need, bs_error *err);

typedef struct bs__chunker {
  const bs_allocator *a;
  bs__cols *cols;                       /* column mode: the ops go there, not into ops */
  size_t limit, chunk_bytes, max_bytes; /* the call's bs_batch_options, resolved */
  size_t served, bytes;                 /* ops and bytes handed out so far in this call */
  int stopped;                          /* the call hit limit or max_bytes */
  int (*on_chunk)(const bs_chunk *, void *);
  void *payload;
  bs_chunk ch; /* the chunk being filled */
  bs_op *ops;  /* its ops (reused from chunk to chunk) */
  size_t n, cap, csize;
} bs__chunker;
void bs__chunker_init(bs__chunker *k, const bs_allocator *a, const bs_batch_options *o,
                      int (*on_chunk)(const bs_chunk *, void *), void *payload);
void bs__chunker_bucket(bs__chunker *k, bs_val name, uint64_t after);
int bs__chunker_end(bs__chunker *k); /* on_chunk's return */
void bs__chunker_free(bs__chunker *k);
/* The parts of bs__chunker_add (inline: it runs once per op served) in rules.c: hand the full
 * chunk on and start the next one; grow the op array (BS_ENOMEM). */
int bs__chunker_cut(bs__chunker *k);
int bs__chunker_grow(bs__chunker *k, bs_error *err);
/* used + sz <= cap, without wrapping (used may already exceed cap after one large op). */
static inline int bs__chunker_fits(size_t used, size_t sz, size_t cap) {
  return sz <= cap && used <= cap - sz;
}
/* Adds op; BS_ENOMEM or on_chunk's non-zero return. The size contract.md 5.2 counts: data +
 * object_type + object_id + subkey. */
static inline int bs__chunker_add(bs__chunker *k, const bs_op *op, bs_error *err) {
  size_t sz = op->data.size + op->object_type.size + op->object_id.size + op->subkey.size;
  int rc;
  if (k->served >= k->limit || (k->served > 0 && !bs__chunker_fits(k->bytes, sz, k->max_bytes))) {
    k->stopped = 1;
    return BS_OK;
  }
  if (k->n > 0 && !bs__chunker_fits(k->csize, sz, k->chunk_bytes) && (rc = bs__chunker_cut(k)))
    return rc;
  if (k->cols) {
    if ((rc = bs__cols_add(k->cols, k->n++, op, err))) return rc;
  } else {
    if (k->n == k->cap && (rc = bs__chunker_grow(k, err))) return rc;
    k->ops[k->n] = *op;
    bs__op_fields(&k->ops[k->n++]);
  }
  k->csize += sz;
  k->served++;
  k->bytes += sz;
  if ((op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR) && op->target_op > k->ch.target_op)
    k->ch.target_op = op->target_op;
  return BS_OK;
}

/* Column mode only (k->cols): bs__chunker_add of op id stored as the op value p (size bytes,
 * internal.h "Op chunks", in the encoding of chunk_flags, bs__chunk_flags), its fields copied
 * straight into the columns; BS_ECORRUPT when it does not decode. */
int bs__chunker_add_value(bs__chunker *k, uint64_t id, const unsigned char *p, size_t size,
                          unsigned chunk_flags, bs_error *err);

/* ---- Write checkpoints (contract.md 7): the rule every backend applies ---- */
/* A stored head (connection conn at lsn) is reached by the heads a reader gives when they name
 * conn at an LSN at or above lsn; given connections the record lacks are ignored. A managed
 * record is acknowledged for the reader iff every one of its heads is reached. */
static inline bool bs__head_reached(bs_val conn, bs_val lsn, const bs_head *given, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (bs__val_eq(given[i].connection, conn)) return bs__val_cmp(lsn, given[i].lsn) <= 0;
  return false;
}

/* A commit at commit_lsn passes a stored head at lsn when lsn <= commit_lsn. The checkpoint of the
 * first commit that passes every head of a managed record makes it processed (contract.md 7), and
 * its user goes into that checkpoint's change record. */
static inline bool bs__head_passed(bs_val lsn, bs_val commit_lsn) {
  return bs__val_cmp(lsn, commit_lsn) <= 0;
}
/* A managed record's stored heads, walked as its backend keeps them: next answers 1 with the next
 * head's connection and lsn, 0 past the last. */
typedef int (*bs__head_next_fn)(void *it, bs_val *conn, bs_val *lsn);
/* Is every stored head of a managed record passed: by a commit at *commit_lsn when commit_lsn is
 * not NULL (bs__head_passed), else reached by a reader's heads given[0..n) (bs__head_reached)?
 * A record of no heads is. */
bool bs__heads_passed(bs__head_next_fn next, void *it, const bs_val *commit_lsn,
                      const bs_head *given, size_t n);
/* bs__head_next_fn over heads kept as an array of bs_head (it: a bs__head_array). */
typedef struct bs__head_array {
  const bs_head *h;
  size_t n;
} bs__head_array;
int bs__head_array_next(void *it, bs_val *conn, bs_val *lsn);
/* A managed record that waits for a commit (neither processed nor gone): its user and heads. */
typedef struct bs__wcp_waiting {
  bs_val user;
  bs__head_next_fn next;
  void *it;
} bs__wcp_waiting;
/* What a commit at lsn does to the managed write checkpoints (contract.md 7): each record waiting
 * (next: 1 and the next one, 0 after the last, or an error) whose every head the commit passes
 * becomes processed, its user filed in the checkpoint's change record (done, with the user next
 * gave last). PostgreSQL applies it as one statement (pg_write.c, checked against this by
 * tests/test_pg.c). next's or done's error is returned. */
int bs__managed_commit(bs_val lsn, int (*next)(void *ctx, bs__wcp_waiting *w, bs_error *err),
                       int (*done)(void *ctx, bs_val user, bs_error *err), void *ctx,
                       bs_error *err);

/* De-duplication of one user's requests in a managed batch (contract.md 7): does candidate c replace
 * the chosen request w? A supplied request id beats a generated one; among supplied the greatest
 * wins (the first of equals stays); among generated the last wins: its heads are the newest, so
 * the id is not acknowledged before the user's later writes are replicated. */
static inline int bs__managed_req_beats(const bs_managed_request *c, const bs_managed_request *w) {
  if (c->has_request_id != w->has_request_id) return c->has_request_id;
  return c->has_request_id ? c->request_id > w->request_id : 1;
}
/* The winning request of each user of a batch (bs__managed_req_beats), in user id order
 * (bs__val_cmp): win (n entries) gets them; returns how many. */
size_t bs__managed_winners(const bs_managed_request *req, size_t n, const bs_managed_request **win);

/* The id the winning request w of a user leaves (contract.md 7). stored: the user's record id when
 * it has one (exists), else its high-water mark (the id of its last record that cleanup deleted,
 * 0 when none), so ids never go backwards. *action: BS_WCP_REPLACE (id and heads replaced, not
 * processed; requested_at iff w supplied its id), BS_WCP_REFRESH (a supplied retry of the stored
 * id: requested_at only) or BS_WCP_KEEP (a lower supplied id changes nothing). BS_EINVAL when
 * the id would reach 2^63; *id and *action are then left as they were. */
enum { BS_WCP_KEEP, BS_WCP_REFRESH, BS_WCP_REPLACE };
int bs__managed_next_id(const bs_managed_request *w, int exists, uint64_t stored, uint64_t *id,
                        int *action, bs_error *err);
/* Managed write checkpoints are made only by a storage in managed mode: BS_ESTATE in custom
 * mode (contract.md 7). */
int bs__managed_mode_check(bs_write_checkpoint_mode mode, bs_error *err);
/* A user's record as the backend finds it within the batch's transaction: *live 0 when there is
 * none (or cleanup deleted it), else its *id and whether a commit *processed it. */
typedef int (*bs__managed_find_fn)(void *ctx, bs_val user, int *live, uint64_t *id, int *processed,
                                   bs_error *err);
/* What a managed batch answers, asked of its transaction after the batch (find): ids_out[i] =
 * request i's user's record id (0: none); *should_advance = 1 iff one of them waits for a commit
 * (live and not processed). find's error is returned. */
int bs__managed_answer(uint64_t *ids_out, int *should_advance, const bs_managed_request *req,
                       size_t n, bs__managed_find_fn find, void *ctx, bs_error *err);
/* The requested_at (ms) of the record that w replaces or refreshes (contract.md 7): a supplied id
 * takes w->requested_at_ms, or now (the batch's time) when that is 0; a generated id has none
 * (-1), so cleanup keeps it. */
static inline int64_t bs__managed_requested_at(const bs_managed_request *w, int64_t now) {
  return !w->has_request_id ? -1 : w->requested_at_ms ? w->requested_at_ms : now;
}

/* ---- Parameter sets (lookup.c) ---- */
/* The order of one lookup's source rows in a parameter-set answer (contract.md 5.4): table id,
 * XXH3_64 of the replica id, replica id: the LMDB backend's params key order, which every
 * backend follows. */
int bs__param_row_cmp(uint32_t table_a, bs_val rid_a, uint32_t table_b, bs_val rid_b);

/* ---- Checksums (checksum.c) ---- */
/* hash over the concatenation of parts (no allocation) */
uint32_t bs__hash_parts(bs_hash hash, const bs_val *parts, size_t n);
/* wrapping 32-bit addition/subtraction of op checksums */
static inline uint32_t bs__cksum_add(uint32_t a, uint32_t b) {
  return (uint32_t)(((uint64_t)a + b) & 0xffffffffu);
}
static inline uint32_t bs__cksum_sub(uint32_t a, uint32_t b) {
  return (uint32_t)(((uint64_t)a + 0x100000000ull - b) & 0xffffffffu);
}

/* ---- Op chunks (opchunk.c): the one encoding of a bucket's stored ops ----
 * A chunk is a strictly ordered run of one bucket's ops in one value: LMDB format 5's op records
 * (lmdb_ops.c, docs/format.md 4.3) use it, and so may any backend that stores ops in runs. Its
 * header (BS_CHUNK_HDR bytes, little-endian): u32 n ops (1..BS_CHUNK_MAX_OPS), u32 the wrapping
 * sum of their checksums, u64 the first op id, u32 the ops' bytes (the sum of their op values'
 * sizes, saturated at UINT32_MAX), u8 flags (BS_CHUNK_CLEAR: one of them is a CLEAR); then per
 * op varint(op id - the previous op's id; 0 for the first) | varint(value size) | op value.
 * An op value: u8 type | u32 checksum | u64 target_op | u16 object_type size | u16 object_id
 * size | u8 subkey size | those three strings (only for the types that carry a row,
 * bs__op_carries_row; their sizes 0 otherwise) | data (PUT only: the rest of the value). The op
 * id is the chunk's (or the record key's), not in the value. Where the chunk lives, how its key
 * is made and how large a writer lets it grow are the backend's.
 * A chunk with header flag BS_CHUNK_COMPACT (LMDB format 6) holds compact op values instead: u8
 * head (bits 0-2 the type, and the flags BS_OPC_*; other bits 0) | u32 checksum | varint
 * target_op (BS_OPC_TARGET only: never 0) | for the types that carry a row: the object_type and
 * object_id sizes (BS_OPC_SHORT: one byte, type size << 4 | id size; else a varint each) | u8
 * subkey size (none with BS_OPC_SUBKEY: BS_SUBKEY_SIZE, bs_subkey's) | those three strings |
 * data (PUT only: the rest of the value). The writer sets each flag that applies. Every field still lies whole in the value (zero-copy). A chunk's
 * ops are all of its one encoding; its byte count (and the bucket state's) stays the measure of
 * the first encoding, bs__op_value_size, whatever the encoding stored (docs/format.md 4.3). */
#define BS_CHUNK_HDR         21u
#define BS_CHUNK_CLEAR       1u   /* header flags: the chunk holds a CLEAR */
#define BS_CHUNK_COMPACT     2u   /* header flags: its op values are compact (format 6) */
#define BS_CHUNK_MAX_OPS     256u /* ops in one chunk, at most */
#define BS_OP_HEADER_SIZE    18u  /* an op value's fixed part */
#define BS_OPC_TARGET        8u   /* compact op value head: a varint target op follows */
#define BS_OPC_SUBKEY        16u  /* ... the subkey is BS_SUBKEY_SIZE bytes, its size not stored */
#define BS_OPC_SHORT         32u  /* ... object_type and object_id sizes below 16, in one byte */
#define BS_OPC_MIN           5u   /* a compact op value's least size: head and checksum */
/* The least size of an op value in the encoding of chunk flags f. */
#define BS_OP_MIN_SIZE(f)    ((f)&BS_CHUNK_COMPACT ? BS_OPC_MIN : BS_OP_HEADER_SIZE)
/* What bs__chunk_add writes for an op value of vs bytes, at most (two varints and the value). */
#define BS_CHUNK_ADD_MAX(vs) (20u + (vs))
static inline uint32_t bs__chunk_n(const unsigned char *p) {
  return bs__get_u32le(p);
}
static inline uint32_t bs__chunk_sum(const unsigned char *p) {
  return bs__get_u32le(p + 4);
}
static inline uint64_t bs__chunk_first(const unsigned char *p) {
  return bs__get_u64le(p + 8);
}
static inline uint32_t bs__chunk_bytes(const unsigned char *p) {
  return bs__get_u32le(p + 16);
}
static inline unsigned bs__chunk_flags(const unsigned char *p) {
  return p[20];
}
/* Varints of at most 10 bytes (7 bits a byte, low first). _put returns the bytes written; _get
 * reads the one at *pos of p (size bytes) and moves *pos past it: 0 when it does not decode
 * (truncated, or over 64 bits). */
size_t bs__varint_put(unsigned char *p, uint64_t v);
int bs__varint_get(const unsigned char *p, size_t size, size_t *pos, uint64_t *v);
static inline size_t bs__varint_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}
/* bs__varint_get with the one-byte case inline (a compact op's lengths, read per op) */
static inline int bs__varint_take(const unsigned char *p, size_t size, size_t *pos, uint64_t *v) {
  if (*pos < size && p[*pos] < 0x80) {
    *v = p[(*pos)++];
    return 1;
  }
  return bs__varint_get(p, size, pos, v);
}
/* An op value's encoders and decoders, in both encodings, are here side by side (inline: the
 * writer encodes and every reader decodes each op), so that a field of a stored op is written
 * and read back in one place (docs/layout.md, "Files touched by a change").
 * An op value's size, and op's value written into out (bs__op_value_size bytes). The caller has
 * checked the limits (BS_MAX_OBJECT_NAME, subkey < 256). */
static inline size_t bs__op_value_size(const bs_op *op) {
  size_t n = BS_OP_HEADER_SIZE;
  if (bs__op_carries_row(op->type))
    n += op->object_type.size + op->object_id.size + op->subkey.size;
  return op->type == BS_OP_PUT ? n + op->data.size : n;
}
static inline unsigned char *bs__op_put_bytes(unsigned char *p, bs_val v) {
  if (v.size) memcpy(p, v.data, v.size);
  return p + v.size;
}
static inline void bs__op_value_encode(unsigned char *p, const bs_op *op) {
  int row = bs__op_carries_row(op->type);
  const bs_val none = {NULL, 0};
  bs_val ot = row ? op->object_type : none, oi = row ? op->object_id : none;
  bs_val sk = row ? op->subkey : none;
  p[0] = (unsigned char)op->type;
  bs__put_u32le(p + 1, op->checksum);
  bs__put_u64le(p + 5, op->target_op);
  bs__put_u16le(p + 13, (uint32_t)ot.size);
  bs__put_u16le(p + 15, (uint32_t)oi.size);
  p[17] = (unsigned char)sk.size;
  p = bs__op_put_bytes(bs__op_put_bytes(bs__op_put_bytes(p + BS_OP_HEADER_SIZE, ot), oi), sk);
  if (op->type == BS_OP_PUT) bs__op_put_bytes(p, op->data);
}
/* The compact encoding's (BS_CHUNK_COMPACT): its size, and op written into out. */
static inline size_t bs__op_value_csize(const bs_op *op) {
  size_t n = BS_OPC_MIN;
  if (op->target_op) n += bs__varint_len(op->target_op);
  if (bs__op_carries_row(op->type)) {
    size_t ot = op->object_type.size, oi = op->object_id.size;
    n += (ot < 16 && oi < 16 ? 1 : bs__varint_len(ot) + bs__varint_len(oi)) +
         (op->subkey.size != BS_SUBKEY_SIZE) + ot + oi + op->subkey.size;
  }
  return op->type == BS_OP_PUT ? n + op->data.size : n;
}
/* Only the fields op's type carries, lengths as varints, the target op only when it is not 0
 * (docs/format.md 4.3 says what it saves). */
static inline void bs__op_value_cencode(unsigned char *p, const bs_op *op) {
  unsigned head = (unsigned)op->type | (op->target_op ? BS_OPC_TARGET : 0u);
  size_t ot = op->object_type.size, oi = op->object_id.size;
  int row = bs__op_carries_row(op->type);
  if (row && ot < 16 && oi < 16) head |= BS_OPC_SHORT;
  if (row && op->subkey.size == BS_SUBKEY_SIZE) head |= BS_OPC_SUBKEY;
  p[0] = (unsigned char)head;
  bs__put_u32le(p + 1, op->checksum);
  p += BS_OPC_MIN;
  if (op->target_op) p += bs__varint_put(p, op->target_op);
  if (!row) return;
  if (head & BS_OPC_SHORT) {
    *p++ = (unsigned char)(ot << 4 | oi);
  } else {
    p += bs__varint_put(p, ot);
    p += bs__varint_put(p, oi);
  }
  if (!(head & BS_OPC_SUBKEY)) *p++ = (unsigned char)op->subkey.size;
  p = bs__op_put_bytes(bs__op_put_bytes(p, op->object_type), op->object_id);
  p = bs__op_put_bytes(p, op->subkey);
  if (op->type == BS_OP_PUT) bs__op_put_bytes(p, op->data);
}
/* In the encoding of chunk flags f. */
static inline size_t bs__op_value_size_as(const bs_op *op, unsigned f) {
  return f & BS_CHUNK_COMPACT ? bs__op_value_csize(op) : bs__op_value_size(op);
}
/* Decodes the op value p (size bytes) of op id into op, borrowed: op's fields point into p.
 * BS_ECORRUPT: shorter than its header and strings, or not an op type. */
static inline int bs__op_value_decode(const unsigned char *p, size_t size, uint64_t id, bs_op *op) {
  size_t ot, oi, sk, fixed;
  int row;
  if (size < BS_OP_HEADER_SIZE) return BS_ECORRUPT;
  ot = bs__get_u16le(p + 13);
  oi = bs__get_u16le(p + 15);
  sk = p[17];
  fixed = BS_OP_HEADER_SIZE + ot + oi + sk;
  if (p[0] < BS_OP_PUT || p[0] > BS_OP_CLEAR || fixed > size) return BS_ECORRUPT;
  op->op_id = id;
  op->type = (bs_op_type)p[0];
  op->checksum = bs__get_u32le(p + 1);
  op->target_op = bs__get_u64le(p + 5);
  p += BS_OP_HEADER_SIZE;
  row = bs__op_carries_row(op->type);
  op->object_type.data = row ? p : NULL;
  op->object_type.size = ot;
  op->object_id.data = row ? p + ot : NULL;
  op->object_id.size = oi;
  op->subkey.data = row ? p + ot + oi : NULL;
  op->subkey.size = sk;
  if (op->type == BS_OP_PUT) {
    op->data.data = p + fixed - BS_OP_HEADER_SIZE;
    op->data.size = size - fixed;
  } else {
    op->data.data = NULL;
    op->data.size = 0;
  }
  return BS_OK;
}
/* bs__op_value_decode of a compact op value. BS_ECORRUPT also when bytes follow a non-PUT's
 * fields, or its head has a bit that means nothing or a target of 0: one op, one encoding. */
static inline int bs__op_value_cdecode(const unsigned char *p, size_t size, uint64_t id,
                                       bs_op *op) {
  size_t pos = BS_OPC_MIN;
  uint64_t ot, oi, sk;
  unsigned head;
  if (size < BS_OPC_MIN) return BS_ECORRUPT;
  head = p[0];
  /* the writer's common op, a PUT or REMOVE with short lengths and a bs_subkey subkey, in a few
   * instructions: readers decode every op they hand out */
  if ((head == (BS_OPC_SHORT | BS_OPC_SUBKEY | BS_OP_PUT) ||
       head == (BS_OPC_SHORT | BS_OPC_SUBKEY | BS_OP_REMOVE)) &&
      size > BS_OPC_MIN) {
    size_t t = p[BS_OPC_MIN] >> 4, i = p[BS_OPC_MIN] & 15u, end = BS_OPC_MIN + 1 + t + i;
    if (end + BS_SUBKEY_SIZE > size ||
        ((head & 3u) == BS_OP_REMOVE && end + BS_SUBKEY_SIZE != size))
      return BS_ECORRUPT;
    op->op_id = id;
    op->type = (bs_op_type)(head & 3u);
    op->checksum = bs__get_u32le(p + 1);
    op->target_op = 0;
    op->object_type.data = p + BS_OPC_MIN + 1;
    op->object_type.size = t;
    op->object_id.data = p + BS_OPC_MIN + 1 + t;
    op->object_id.size = i;
    op->subkey.data = p + end;
    op->subkey.size = BS_SUBKEY_SIZE;
    op->data.data = (head & 3u) == BS_OP_PUT ? p + end + BS_SUBKEY_SIZE : NULL;
    op->data.size = size - end - BS_SUBKEY_SIZE;
    return BS_OK;
  }
  if ((head & ~(7u | BS_OPC_TARGET | BS_OPC_SUBKEY | BS_OPC_SHORT)) || (head & 7u) < BS_OP_PUT ||
      (head & 7u) > BS_OP_CLEAR)
    return BS_ECORRUPT;
  op->op_id = id;
  op->type = (bs_op_type)(head & 7u);
  op->checksum = bs__get_u32le(p + 1);
  op->target_op = 0;
  if ((head & BS_OPC_TARGET) && (!bs__varint_take(p, size, &pos, &op->target_op) || !op->target_op))
    return BS_ECORRUPT;
  op->data.data = NULL;
  op->data.size = 0;
  if (!bs__op_carries_row(op->type)) {
    op->object_type.data = op->object_id.data = op->subkey.data = NULL;
    op->object_type.size = op->object_id.size = op->subkey.size = 0;
    return pos == size && !(head & (BS_OPC_SUBKEY | BS_OPC_SHORT)) ? BS_OK : BS_ECORRUPT;
  }
  if (head & BS_OPC_SHORT) {
    if (pos >= size) return BS_ECORRUPT;
    ot = p[pos] >> 4;
    oi = p[pos++] & 15u;
  } else if (!bs__varint_take(p, size, &pos, &ot) || !bs__varint_take(p, size, &pos, &oi)) {
    return BS_ECORRUPT;
  }
  if (head & BS_OPC_SUBKEY) {
    sk = BS_SUBKEY_SIZE;
  } else {
    if (pos >= size) return BS_ECORRUPT;
    sk = p[pos++];
  }
  if (ot > size - pos || oi > size - pos - ot || sk > size - pos - ot - oi) return BS_ECORRUPT;
  op->object_type.data = p + pos;
  op->object_type.size = (size_t)ot;
  op->object_id.data = p + pos + ot;
  op->object_id.size = (size_t)oi;
  op->subkey.data = p + pos + ot + oi;
  op->subkey.size = (size_t)sk;
  pos += ot + oi + sk;
  if (op->type == BS_OP_PUT) {
    op->data.data = p + pos;
    op->data.size = size - pos;
  } else if (pos != size) {
    return BS_ECORRUPT;
  }
  return BS_OK;
}
/* The op value in the encoding of chunk flags f. */
static inline int bs__op_value_decode_as(const unsigned char *p, size_t size, uint64_t id,
                                         unsigned f, bs_op *op) {
  return f & BS_CHUNK_COMPACT ? bs__op_value_cdecode(p, size, id, op)
                              : bs__op_value_decode(p, size, id, op);
}
/* Decodes chunk p (size bytes): its ops' ids, and their values' offsets in p and sizes, into
 * ids, off and len (BS_CHUNK_MAX_OPS entries each), their number into *n. BS_ECORRUPT unless p
 * is one whole chunk of 1..BS_CHUNK_MAX_OPS ops with strictly rising ids whose values are at
 * least an op header each. The header's sum, bytes and flags are not checked
 * (bs__chunk_header_problem is verify's check). */
int bs__chunk_decode(const unsigned char *p, size_t size, uint64_t *ids, uint32_t *off,
                     uint32_t *len, uint32_t *n);
/* Appends an op to a chunk being built at p (p + BS_CHUNK_HDR on for its first op): its id's
 * delta to the previous op (0 for the first) and its value, op's encoding in chunk flags f's
 * (val NULL: vs is bs__op_value_size_as(op, f)) or vs bytes copied from val; returns the bytes
 * written (at most BS_CHUNK_ADD_MAX(vs)). bs__chunk_add: the first encoding's. */
size_t bs__chunk_add_as(unsigned char *p, uint64_t delta, const bs_op *op, const unsigned char *val,
                        size_t vs, unsigned f);
size_t bs__chunk_add(unsigned char *p, uint64_t delta, const bs_op *op, const unsigned char *val,
                     size_t vs);
/* Fills the header of the chunk p (size bytes, its ops packed after the header by
 * bs__chunk_add_as, the first of id first, their encoding chunk flags f's) from its ops.
 * BS_ECORRUPT when they do not decode. bs__chunk_seal: the first encoding's. */
int bs__chunk_seal_as(unsigned char *p, size_t size, uint64_t first, unsigned f);
int bs__chunk_seal(unsigned char *p, size_t size, uint64_t first);
/* The bytes op value v (vs bytes, in the encoding of chunk flags f) counts for in a chunk's and
 * a bucket state's byte count: the size of its first encoding (bs__op_value_size), whatever the
 * one stored. 0 when its header does not fit (its strings are the op decoder's to check). */
size_t bs__chunk_op_bytes(const unsigned char *v, size_t vs, unsigned f);
/* Two chunks of one bucket joined into one (compaction's merge of small chunks): x (xs bytes,
 * its last op x_last) and y (ys bytes, its first op y_first above x_last, its first delta the
 * one-byte 0 every writer writes, its ops of x's encoding) become out (bs__chunk_join_size bytes): their packed ops
 * as they are, y's first delta recomputed, the header from theirs. */
size_t bs__chunk_join_size(size_t xs, uint64_t x_last, size_t ys, uint64_t y_first);
void bs__chunk_join(unsigned char *out, const unsigned char *x, size_t xs, uint64_t x_last,
                    const unsigned char *y, size_t ys);
/* What verify finds wrong with the header of the chunk p decoded (n, ids, off, len) whose
 * bucket's previous chunk ended at op after (NULL: nothing). */
const char *bs__chunk_header_problem(const unsigned char *p, uint32_t n, const uint64_t *ids,
                                     const uint32_t *off, const uint32_t *len, uint64_t after);

/* ---- A save's effects (effects.c): contract.md 4.1-4.3, decided once for every backend ----
 * The backend resolves the table, then hands each save (or each record a truncate drops) to
 * effects.c, which decides what happens and calls the backend's bs__effects_ops in contract
 * order: the op-id order of 4.1 is the order of the op and param calls. A backend only loads
 * records, allocates op ids, indexes and stores. */

/* A membership of a source record: the row is in bucket (the backend's handle for it, as its
 * bucket() slot returns) as (object_type, object_id); op = the id of the row's last op there. */
typedef struct bs__member {
  uint64_t bucket, op;
  bs_val object_type, object_id;
} bs__member;

/* A source record, as backends hand it to effects.c and store it. */
typedef struct bs__srec {
  int exists;    /* 0: there is no record (everything else empty) */
  int soft;      /* soft-deleted (4.3): no memberships, lookups or data */
  uint64_t mark; /* soft: the stream's op-id head at the delete; purged by a checkpoint >= it */
  bs__member *m; /* memberships, deduplicated, in order of first output */
  uint32_t nm;
  bs_val *lk; /* lookup keys, deduplicated */
  uint32_t nl;
  int has_data; /* the host's stored row data (data may be empty) */
  bs_val data;
} bs__srec;

/* The backend's side. ctx is bs__effects.ctx; err gets the backend's message. */
typedef struct bs__effects_ops {
  /* The current record of (table, rid), including the effects of earlier saves of this batch;
   * *out (exists 0 when there is none) stays valid until the next store of rid. */
  int (*load)(void *ctx, bs_val rid, const bs__srec **out, bs_error *err);
  /* The handle of the bucket named name, creating the bucket when it is new. */
  int (*bucket)(void *ctx, bs_val name, uint64_t *bucket, bs_error *err);
  /* Appends op (PUT or REMOVE; op_id unset) to bucket with the next op id, set into *op_id. */
  int (*op)(void *ctx, uint64_t bucket, const bs_op *op, uint64_t *op_id, bs_error *err);
  /* The row's op old_op in bucket was superseded by new_op (the log of incremental compaction,
   * contract.md 6). NULL: the backend keeps no such log. */
  int (*superseded)(void *ctx, uint64_t bucket, uint64_t old_op, uint64_t new_op, bs_error *err);
  /* Appends a parameter entry of (table, rid) for key with the next op id; n_params 0 (params
   * NULL): a tombstone. NULL: the backend keeps no parameter entries (source_row's shadow). */
  int (*param)(void *ctx, bs_val key, bs_val rid, const bs_val *params, size_t n_params,
               bs_error *err);
  /* Makes rec the record of rid (rec->exists 0: deletes it). rec's arrays are valid during the
   * call only; its strings are the save's or the previous record's. */
  int (*store)(void *ctx, bs_val rid, const bs__srec *rec, bs_error *err);
  /* The stream's op-id head (the last id allocated), the mark of a soft delete. */
  uint64_t (*op_head)(void *ctx);
} bs__effects_ops;

/* The hash of an effects context whose ops are discarded (source_row's shadow below): the op
 * calls then get neither a checksum nor a subkey (both unset), which it would not read. */
#define BS__HASH_NONE ((bs_hash)2)
typedef struct bs__effects {
  const bs__effects_ops *ops;
  void *ctx;
  const bs_allocator *alloc; /* for the scratch below */
  bs_hash hash;              /* the stream's op checksum (or BS__HASH_NONE, above) */
  int snapshot;              /* a snapshot writer (skip_existing, 4.3) */
  int snapshot_done;         /* the stream's snapshot is done */
  /* scratch of the new record, kept across saves; bs__effects_free releases it */
  bs__member *m;
  bs_val *lk;
  unsigned char *kept;
  size_t cap_m, cap_lk, cap_kept;
} bs__effects;

/* Applies contract.md 4.1 steps 1-4 (and 4.3) of save s of table table_id through e->ops. */
int bs__effects_save(bs__effects *e, uint32_t table_id, const bs_save *s, bs_error *err);
/* REMOVEs for every membership of r (rid's record) and tombstones for its lookups: step 1 of
 * 4.1 and truncate (4.2); the record itself is left to the caller. */
int bs__effects_unlink(bs__effects *e, uint32_t table_id, bs_val rid, const bs__srec *r,
                       bs_error *err);
void bs__effects_free(bs__effects *e);
/* source_row: rid's record of table as the flush of batch would leave it, its data pointing into
 * a stored record or into the batch; BS_ENOTFOUND (bs__source_row_missing) when it is not live.
 * stored(ctx, rid, out, err) gives a row's stored record (*out NULL = none), valid until the call
 * returns; snapshot: the writer's mode. */
int bs__effects_source_row(const bs_allocator *a, int snapshot, const bs_write_batch *batch,
                           bs_val table, bs_val rid,
                           int (*stored)(void *ctx, bs_val rid, const bs__srec **out,
                                         bs_error *err),
                           void *ctx, bs__srec *out, bs_error *err);

/* ---- Compaction planning (compact.c): backend-agnostic, shared by every backend ---- */
/* Copies in (NULL = defaults) into out with every default applied; BS_EINVAL names a bad field. */
int bs__compact_options_resolve(bs_compact_options *out, const bs_compact_options *in,
                                bs_error *err);
/* Initial-replication compaction's options: the defaults, max_op_id, and every bucket with
 * min_bucket_changes (> 0) ops since its last compaction due, whatever their share (ratio 0). */
void bs__compact_initial_options(bs_compact_options *o, uint64_t max_op_id,
                                 uint64_t min_bucket_changes);
/* Initial replication deletes ops only while the stream has no checkpoint, also none at op 0
 * (contract.md 6): BS_ESTATE once has_checkpoint. Checked in every transaction that deletes, since
 * a writer may commit the first checkpoint between two of them. */
int bs__compact_initial_check(uint32_t stream, int has_checkpoint, uint64_t checkpoint,
                              bs_error *err);
/* After each committed transaction: BS_ECANCELED when o's progress callback asks to stop. */
int bs__compact_progress(const bs_compact_options *o, const bs_compact_stats *so_far,
                         bs_error *err);
/* The incremental op budget of a call (UINT64_MAX: unbounded, also in full compaction). */
static inline uint64_t bs__compact_budget(const bs_compact_options *o) {
  return o->incremental_only && o->op_budget ? o->op_budget : UINT64_MAX;
}
/* Ops a bucket gained since its last full or initial compaction (bs_bucket_info.changes), from
 * its bucket-state figures; and 1 when they make it due for o (min_bucket_changes of them, at
 * least min_change_ratio of its count). */
uint64_t bs__compact_changes(uint64_t count, uint64_t compacted_count, uint64_t last_op,
                             uint64_t compacted_op);
int bs__compact_due(const bs_compact_options *o, uint64_t changes, uint64_t count);
int bs__compact_bucket_due(const bs_compact_options *o, uint64_t count, uint64_t compacted_count,
                           uint64_t last_op, uint64_t compacted_op);
/* Row identities (object_type, object_id, subkey) -> op id, bounded by limit bytes. */
typedef struct bs__seen_set {
  const bs_allocator *alloc;
  size_t limit, arena_size, arena_cap;
  bs__htab rows; /* row hash -> arena offset + 1 */
  unsigned char *arena;
  int full; /* the limit was reached: new rows are no longer recorded */
} bs__seen_set;
void bs__seen_init(bs__seen_set *s, const bs_allocator *a, size_t limit_bytes);
void bs__seen_clear(bs__seen_set *s); /* forgets every row, keeps the memory */
void bs__seen_free(bs__seen_set *s);
/* Row of op recorded: returns 1, *latest = its op id. Else records op (if room), returns 0. */
int bs__seen_visit(bs__seen_set *s, const bs_op *op, uint64_t *latest);
int bs__seen_find(const bs__seen_set *s, const bs_op *op, uint64_t *latest); /* lookup only */
/* The plan (contract.md 6), one for every backend: a backend walks a bucket in its own order and
 * transactions and asks these what each op becomes; it re-decides nothing.
 * The horizon: full, max_op_id if set, else the checkpoint; incremental, the newest checkpoint at
 * least min_age_ms old (aged; the checkpoint itself when min_age_ms is 0), lowered to max_op_id;
 * never above op_head (nothing above the last persisted op exists yet). 0: nothing to do.
 * Initial replication (the whole stream is the snapshot, before any checkpoint): checkpoint =
 * op_head, so max_op_id if set, else the last op. */
uint64_t bs__compact_horizon(const bs_compact_options *o, uint64_t checkpoint, uint64_t aged,
                             uint64_t op_head);
/* Full compaction, reverse scan (op ids descending from the horizon) with the seen-set: what it
 * learns is run = ops below the lowest surviving PUT (the leading run), max_moved = the highest op
 * id found superseded (0: none). */
typedef struct bs__compact_scan {
  uint64_t run, max_moved;
} bs__compact_scan;
/* Feeds op to the scan; 0 when the scan is complete (a CLEAR has nothing before it). */
int bs__compact_scan_op(bs__compact_scan *p, bs__seen_set *s, const bs_op *op);
/* After the scan (the seen-set is only read): 1 when op (PUT/REMOVE) is superseded by a later op
 * of its row, which becomes its MOVE target. */
int bs__compact_superseded(const bs__seen_set *s, const bs_op *op, uint64_t *target_out);
#define BS_CLEAR_MIN_RUN 2u /* a leading run folds into a CLEAR only from 2 ops */
/* Incremental: a logged entry (old op -> nw) is due once nw is at or below the horizon; then the
 * old op, while still a PUT or REMOVE below nw, becomes a MOVE to nw (its target: a reader at
 * C >= nw reads nw too, and a MOVE of nw reports the next target). */
static inline int bs__compact_entry_due(uint64_t nw, uint64_t horizon) {
  return nw <= horizon;
}
static inline int bs__compact_entry_moves(const bs_op *op, uint64_t nw) {
  return (op->type == BS_OP_PUT || op->type == BS_OP_REMOVE) && nw > op->op_id;
}
/* Folding a leading run into one CLEAR. */
typedef struct bs__clear_acc {
  uint64_t first_op, last_op, n, n_folded /* non-CLEAR ops */, n_moved, target_op, bytes;
  uint32_t checksum;
} bs__clear_acc;
/* The leading run, forward from the bucket's first op (at or below the horizon): op is in the
 * run unless it is a PUT that survives (move_target 0). */
static inline int bs__compact_in_run(const bs_op *op, uint64_t move_target) {
  return move_target != 0 || op->type != BS_OP_PUT;
}
/* Adds op (in the run) to the CLEAR: a superseded op (move_target != 0) as the MOVE it would
 * have become. value_bytes: op's stored size. */
void bs__clear_acc_add(bs__clear_acc *a, const bs_op *op, uint64_t move_target,
                       uint64_t value_bytes);
/* The ops compaction writes, made here for every backend (contract.md 6): op as a MOVE to target
 * keeps its op id and its checksum, so a bucket's sum over its ops stays what it was, and no
 * payload; the CLEAR of a fold lies at the run's last op id with the run's wrapping sum of
 * checksums and its largest target (bs__clear_acc_add). A backend stores the op it is given. */
bs_op bs__compact_move_op(const bs_op *op, uint64_t target);
bs_op bs__compact_clear_op(const bs__clear_acc *clear);
/* Initial replication, reverse scan (op ids descending from the horizon) with the seen-set: 1 when
 * op is deleted: MOVE/CLEAR residue, an op a later op of its row supersedes, and a REMOVE whose row
 * has nothing before it that survives. A row the full set does not track keeps everything. */
int bs__compact_initial_drop(bs__seen_set *s, const bs_op *op);
/* Defragmentation: re-emit a bucket's live PUTs (live of its count ops) when they are under ratio
 * of its ops and the rest could fold (more than one op beyond them). */
int bs__compact_defrag_due(uint64_t live, uint64_t count, double ratio);
/* Parameter compaction, a (lookup, table, replica id) group newest first: an entry at or below the
 * horizon goes when a newer one at the horizon exists (newer_seen), or, the newest, when it is a
 * tombstone (n_sets 0). */
static inline int bs__compact_param_drop(int newer_seen, uint32_t n_sets) {
  return newer_seen || n_sets == 0;
}

/* ---- The compaction loop (compact_run.c): one for every backend ----
 * bs__compact_drive runs a call (bs_compact, bs_compact_initial_replication): the order of its
 * parts, the horizon, which buckets and in what order, the op budget across buckets, the
 * defragmentation candidates, the parameter cursor, the statistics and the progress reports. A
 * backend gives its storage primitives; each that writes commits its own bounded transactions
 * (at most max_ops_per_txn ops changed) and calls bs__compact_report after each commit. */
enum { BS__COMPACT_FULL, BS__COMPACT_INC, BS__COMPACT_INITIAL };
#define BS__COMPACT_BATCH 256 /* buckets listed at a time */

typedef struct bs__compact_stream {
  uint32_t id;
  uint64_t checkpoint, op_head, param_cursor;
  int has_checkpoint;
} bs__compact_stream;

/* A bucket as the selection sees it (its bucket-state figures; first_op: its lowest stored op
 * id, 0 when it has none). */
typedef struct bs__compact_bucket {
  uint64_t id, count, compacted_count, last_op, compacted_op, first_op;
} bs__compact_bucket;

/* Where a listing resumes: after the bucket named name (a backend that lists by name) or at id
 * from (one that lists by id); done once the listing is complete. */
typedef struct bs__compact_cursor {
  unsigned char name[BS_MAX_BUCKET_NAME];
  size_t name_size;
  uint64_t from;
  int done;
} bs__compact_cursor;

typedef struct bs__compact_run {
  const bs_compact_options *o; /* resolved */
  int mode;                    /* BS__COMPACT_* */
  uint64_t horizon;            /* > 0 */
  uint64_t budget;             /* incremental ops left (UINT64_MAX: unbounded) */
  uint64_t processed;          /* buckets worked that existed (initial replication's answer) */
  const uint64_t *ids;         /* the batch: step works ids[i], ids[i + 1], ... */
  size_t n, i;
  int busy;          /* step stopped inside bucket ids[i] (the budget stops only between buckets) */
  bs__seen_set seen; /* bounded by memory_limit_mb; a backend clears it per bucket or group */
  bs_compact_stats *stats;
  bs_compact_stats reported;
  bs_error *err;
} bs__compact_run;

typedef struct bs__compact_store {
  /* optional (NULL: none); before anything else: opts->delete_checkpoint_requests_before_ms */
  int (*delete_requests)(void *x, int64_t before_ms, uint64_t *deleted, bs_error *err);
  int (*stream)(void *x, bs__compact_stream *out, bs_error *err);
  /* the newest checkpoint made at or before cutoff_ms (ms since the epoch), 0 if none */
  int (*aged)(void *x, int64_t cutoff_ms, uint64_t *out, bs_error *err);
  /* optional: records the horizon before any op changes (full and incremental) */
  int (*begin)(void *x, uint64_t horizon, bs_error *err);
  /* the bucket named name, as list gives it: *found 0 when there is none */
  int (*find)(void *x, bs_val name, bs__compact_bucket *out, int *found, bs_error *err);
  /* up to BS__COMPACT_BATCH buckets after cur, advancing it: queued (incremental: those with
   * logged superseded entries, in id order; only ids), else every bucket with its figures */
  int (*list)(void *x, int queued, bs__compact_cursor *cur, bs__compact_bucket *out, size_t *n,
              bs_error *err);
  /* runs the job (bs__compact_job_run) of r->ids[r->i] on, at least one transaction's worth, in
   * its transactions: advances r->i past every bucket it finished */
  int (*step)(void *x, bs__compact_run *r);
  /* re-emits the live rows of the fragmented buckets among ids (sorted, unique; the backend
   * may reorder them): bs__compact_defrag over the backend's bs__defrag_store does all of it */
  int (*defragment)(void *x, bs__compact_run *r, uint64_t *ids, size_t n);
  /* parameter compaction at r->horizon: fence raises the parameter horizon and the change fence
   * (a reader below gets BS_ESTALE, never a half-compacted answer); step deletes one
   * transaction's entries from where the last stopped (*done at the end); mark (optional)
   * records that everything at or below the horizon is reduced (the next call skips the pass) */
  int (*param_fence)(void *x, uint64_t horizon, bs_error *err);
  int (*param_step)(void *x, bs__compact_run *r, int *done);
  int (*param_mark)(void *x, uint64_t horizon, bs_error *err);
  /* optional, full and incremental, after everything else: aged is the newest checkpoint at
   * least min_age_ms old */
  int (*end)(void *x, bs__compact_run *r, uint64_t aged);
} bs__compact_store;

/* A progress report (opts->progress) when the statistics changed since the last: after each
 * commit, and once at the end with the call's totals. BS_ECANCELED when the callback stops it. */
int bs__compact_report(bs__compact_run *r);

/* ---- The parameter pass (compact_params.c): contract.md 6, over a cursor of entries ----
 * A backend whose param_step gives this cursor runs one transaction of the pass by calling
 * bs__compact_param_txn inside it: per (lookup, table, replica id) group only the newest entry at
 * or below the horizon stays, dropped too when it is a tombstone (bs__compact_param_drop); a
 * transaction visits max_ops_per_txn entries or more, up to the end of a group (a group is never
 * split), and the next resumes after the last group it finished. */
typedef struct bs__param_entry {
  bs_val lookup, rid;
  uint32_t table;
  uint64_t op;
  uint32_t n_sets; /* 0: a tombstone */
} bs__param_entry;
/* Where the pass resumes: after the group (lookup, table, rid); zeroed: at the first group. */
typedef struct bs__param_pos {
  unsigned char lookup[BS_MAX_LOOKUP_KEY], rid[BS_MAX_REPLICA_ID];
  size_t lookup_size, rid_size;
  uint32_t table;
  int started; /* a group was finished (else the pass starts at the first) */
  int done;    /* the pass is complete */
} bs__param_pos;
/* seek: the newest entry of the first group after pos, in any order of groups that stays the
 * same across the pass's transactions (*found 0: none); next: the entry after the current one,
 * the group's older entries newest first, then the next group's newest; del: deletes the current
 * entry (next goes on from it). An entry stays valid until the next call. */
typedef struct bs__param_cursor {
  int (*seek)(void *x, const bs__param_pos *pos, bs__param_entry *e, int *found, bs_error *err);
  int (*next)(void *x, bs__param_entry *e, int *found, bs_error *err);
  int (*del)(void *x, bs_error *err);
} bs__param_cursor;
/* One transaction's share of the pass at r->horizon from pos (advanced; pos->done at the end);
 * the entries removed are added to r->stats on BS_OK. */
int bs__compact_param_txn(const bs__param_cursor *c, void *x, bs__compact_run *r,
                          bs__param_pos *pos);

/* ---- Defragmentation (compact_defrag.c): contract.md 6, over a backend's primitives ----
 * A backend's defragment slot of bs__compact_store calls bs__compact_defrag with these. The
 * engine chooses the buckets (bs__compact_defrag_due, while their rows fit in memory_limit_mb,
 * in id order), collects their live rows (memberships of source records at or below the
 * horizon) in (bucket, op) order and re-emits them in transactions of max_ops_per_txn rows,
 * with a progress report after each. */
typedef struct bs__defrag_row {
  uint64_t bucket, old_op;
  const unsigned char *key; /* the source record's key, in the backend's own encoding */
  size_t key_size;
} bs__defrag_row;
typedef int (*bs__defrag_member_fn)(void *arg, uint64_t bucket, uint64_t op,
                                    const unsigned char *key, size_t key_size);
typedef struct bs__defrag_store {
  /* one snapshot around members (called twice) and count; the rows' keys are copied */
  int (*begin)(void *x, bs_error *err);
  void (*end)(void *x);
  /* every membership of every source record of the stream (fn's status is returned) */
  int (*members)(void *x, bs__defrag_member_fn fn, void *arg, bs_error *err);
  /* the bucket's stored op count (*found 0: no such bucket any more) */
  int (*count)(void *x, uint64_t bucket, uint64_t *count, int *found, bs_error *err);
  /* one transaction: re-emits each row whose source record still holds that membership at
   * old_op (a new PUT with a new op id, same payload and checksum; the membership moves to it;
   * (old -> new) logged as superseded), as the writer would; *emitted: how many */
  int (*reemit)(void *x, const bs__defrag_row *rows, size_t n, uint64_t *emitted, bs_error *err);
} bs__defrag_store;
int bs__compact_defrag(const bs__defrag_store *s, void *x, const bs_allocator *a,
                       bs__compact_run *r, const uint64_t *ids, size_t n);

/* ---- The bucket walk (compact_run.c): what a backend's transaction does to a bucket ----
 * A backend gives a cursor over one bucket's ops; the walk decides, counts and bounds. */

/* What one transaction did to one bucket: its state and the statistics take it on commit. */
typedef struct bs__compact_delta {
  int64_t count, bytes;
  uint32_t checksum_sub; /* initial replication: the checksums of deleted ops */
  uint64_t moved, cleared, removed;
  int changed;
  bs__clear_acc clear; /* a fold made in this transaction (n >= BS_CLEAR_MIN_RUN) */
  int clear_dropped;   /* initial replication deleted the leading CLEAR */
  int deleted;         /* ops were deleted: last_op may have to come down */
  int mark;            /* record the bucket as compacted (at the horizon) */
} bs__compact_delta;

/* The bucket's torn span (*start, *op: 0/0 = none) after d: a fold's CLEAR spans from the run's
 * first op, or from where the folded leading CLEAR's span started; a dropped CLEAR takes it. */
void bs__compact_span(const bs__compact_delta *d, uint64_t *start, uint64_t *op);

/* A transaction's bounds: ops changed (max_ops_per_txn) and ops visited (max_visits). */
typedef struct bs__compact_txn {
  size_t changes, visits, max_changes, max_visits;
} bs__compact_txn;
static inline int bs__compact_txn_full(const bs__compact_txn *t) {
  return t->changes >= t->max_changes || t->visits >= t->max_visits;
}

/* A backend's bucket for the job (compact_run.c): a cursor on its ops and one on its superseded
 * log, the writes, and its state. seek_le: the greatest op with op_id <= pos (*found 0 when none);
 * prev, next: the op before or after the current one; seek_ge: the least op with op_id >= pos;
 * get: the op id exactly. The op and its size (its stored bytes) stay valid until the next call.
 * del deletes the current op (the next call is a seek); move rewrites op (the current one) as a
 * MOVE to target, same checksum; fold replaces the bucket's first clear->n ops by one CLEAR at
 * clear->last_op (BS_ECORRUPT when they are not the ones the walk saw). sup_seek: the log's first
 * entry with old op >= old (*found 0 when none); sup_next: the one after; sup_del consumes the
 * current entry (the next call is sup_seek); sup_end (optional) follows a walk of the whole log.
 * start: whether the bucket exists and its stored bytes, before its job; apply: the delta of a
 * phase to the bucket's state, in the transaction that made it. bare: the stored size of a MOVE
 * or CLEAR. A backend may collect writes and apply them in bulk (in apply), or write at once. */
typedef struct bs__op_cursor {
  int (*seek_le)(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found);
  int (*prev)(void *x, bs_op *op, uint64_t *size, int *found);
  int (*seek_ge)(void *x, uint64_t pos, bs_op *op, uint64_t *size, int *found);
  int (*next)(void *x, bs_op *op, uint64_t *size, int *found);
  int (*get)(void *x, uint64_t id, bs_op *op, uint64_t *size, int *found);
  int (*del)(void *x);
  int (*move)(void *x, const bs_op *op, uint64_t target);
  int (*fold)(void *x, const bs__clear_acc *clear);
  int (*sup_seek)(void *x, uint64_t old, uint64_t *old_out, uint64_t *nw, int *found);
  int (*sup_next)(void *x, uint64_t *old, uint64_t *nw, int *found);
  int (*sup_del)(void *x);
  int (*sup_end)(void *x);
  int (*start)(void *x, uint64_t *bytes, int *exists);
  int (*apply)(void *x, const bs__compact_delta *d);
  uint64_t bare;
} bs__op_cursor;

/* A bucket's job: the phases compaction walks it through, resumable at pos between transactions.
 * Full: SCAN (reverse, read only: the seen-set, the leading run, the highest superseded op) ->
 * FOLD (the leading run, superseded ops included, into one CLEAR) -> MOVE (the superseded ops
 * above it) -> MARK. Incremental: IFOLD (the leading run, ops with a due log entry included,
 * consuming those entries) -> INC (the remaining due entries -> MOVE) -> FOLD (only when IFOLD
 * handed over without finishing the run). Initial replication: SCAN (deleting) -> FORGET (INC
 * dropping the due entries, whose old ops are gone) and MARK. */
enum {
  BS__JOB_START,
  BS__JOB_SCAN,
  BS__JOB_FOLD,
  BS__JOB_MOVE,
  BS__JOB_IFOLD,
  BS__JOB_INC,
  BS__JOB_MARK,
  BS__JOB_DONE
};
typedef struct bs__compact_job {
  int phase;
  int changed;    /* the bucket changed (buckets_compacted) */
  int gone;       /* the bucket did not exist at its start */
  int consumed;   /* incremental: entries were consumed (a fold may follow) */
  int ifold_done; /* IFOLD left the leading run final (no FOLD after INC) */
  uint64_t pos;   /* resume: SCAN the next op id down, MOVE up, IFOLD/INC the next old op */
  bs__compact_scan scan;
} bs__compact_job;
/* Advances j (zeroed: not started) on bucket x within t as far as t allows, applying each phase
 * (the statistics, buckets_compacted when it ends having changed the bucket). budget: the
 * incremental ops left; *processed counts the bucket when its job ends, had it existed. */
int bs__compact_job_run(const bs__op_cursor *cur, void *x, bs__compact_run *r, bs__compact_txn *t,
                        bs__compact_job *j, uint64_t *budget, uint64_t *processed);
/* Runs mode (BS__COMPACT_*) with o (resolved) on the store's stream; stats: the totals, also
 * on failure; *processed (may be NULL): the buckets worked. */
int bs__compact_drive(const bs__compact_store *s, void *x, const bs_allocator *a,
                      const bs_compact_options *o, int mode, bs_compact_stats *stats,
                      uint64_t *processed, bs_error *err);

/* ---- Generic reads (reads.c): contract.md 5 over a backend's storage primitives ----
 * The reads written once: a backend that gives these primitives answers bucket_data,
 * checksums, checksum_ranges, list_buckets, checkpoint_changes and parameter_sets through the
 * bs__read_* functions (the memory backend does; LMDB and PostgreSQL keep bulk executors of
 * their own). Every primitive but begin runs inside the call's one snapshot, between begin and
 * end, and what it hands the engine (names, ops, rows) stays valid until end; the engine calls
 * nothing of the caller in it. A walk's fn returns non-zero to stop it, and the walk returns that
 * value. */
typedef struct bs__read_bucket {
  bs_val name;
  uint64_t clear_start, clear_op;                     /* the torn span (bs__torn_check) */
  uint64_t generation, compacted_op, compacted_count; /* bs_bucket_info, bs__compact_changes */
  uint64_t last_op; /* the highest op id stored, as the backend keeps it (verify compares) */
  const void *h;    /* the backend's own */
} bs__read_bucket;
typedef struct bs__read_store {
  int (*begin)(void *x, bs_error *err); /* the snapshot (a read transaction, a lock) */
  void (*end)(void *x);
  void (*row)(void *x, bs__stream_row *out); /* the stream's row (fence, parameter horizon) */
  int (*bucket)(void *x, bs_val name, bs__read_bucket *out, int *found, bs_error *err);
  /* every bucket of the stream, in any order */
  int (*buckets)(void *x, int (*fn)(void *arg, const bs__read_bucket *b), void *arg, bs_error *err);
  /* the ops of b with ids in (after, to], ascending */
  int (*ops)(void *x, const bs__read_bucket *b, uint64_t after, uint64_t to,
             int (*fn)(void *arg, const bs_op *op), void *arg, bs_error *err);
  /* kind 0: each bucket with an op whose id is in [lo, hi]; 1: each lookup with a parameter
   * entry there; 2: each user filed there (a flush's op head, a checkpoint); repeats allowed */
  int (*changes)(void *x, int kind, uint64_t lo, uint64_t hi, int (*fn)(void *arg, bs_val name),
                 void *arg, bs_error *err);
  /* lookup's rows at c: each row's newest entry at or below c (a tombstone: none), in the order
   * the reads hand rows out (bs__param_row_cmp); fn's BS_ENOMEM is returned */
  int (*params)(void *x, bs_val lookup, uint64_t c,
                int (*fn)(void *arg, const bs_val *rows, size_t n), void *arg);
} bs__read_store;
int bs__read_bucket_data(const bs__read_store *s, void *x, const bs_allocator *a, int *has_more,
                         uint64_t c, const bs_bucket_request *req, size_t n_req,
                         const bs_batch_options *opts, int (*on_chunk)(const bs_chunk *, void *),
                         void *payload, bs_error *err);
/* checksums at C are checksum_ranges over (0, C] (cleared NULL) */
int bs__read_checksum_ranges(const bs__read_store *s, void *x, bs_checksum *out, int *cleared,
                             uint64_t *gen, uint64_t from, uint64_t to, const bs_val *buckets,
                             size_t n, bs_error *err);
int bs__read_list_buckets(const bs__read_store *s, void *x, const bs_allocator *a,
                          bs_val start_after, int (*fn)(const bs_bucket_info *, void *),
                          void *payload, bs_error *err);
int bs__read_checkpoint_changes(const bs__read_store *s, void *x, const bs_allocator *a,
                                uint64_t from, uint64_t to,
                                int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                bs_error *err);
int bs__read_parameter_sets(const bs__read_store *s, void *x, const bs_allocator *a, uint64_t c,
                            const bs_val *lookups, size_t n, size_t limit,
                            int (*fn)(const bs_val *, void *), void *payload, bs_error *err);
/* A storage whose reads are the ones above, in its table as they are: its handle begins with a
 * bs__read_storage (base first; reads and a set by its storage_open; the primitives' x is the
 * handle itself), and its bs_storage_vtable names the slots with BS__READ_SLOTS. */
typedef struct bs__read_storage {
  bs_storage base;
  const bs__read_store *reads;
  const bs_allocator *a;
} bs__read_storage;
#define BS__READ_SLOTS                                                                             \
  .bucket_data = bs__read_slot_bucket_data, .checksums = bs__read_slot_checksums,                  \
  .checksum_ranges = bs__read_slot_checksum_ranges,                                                \
  .checkpoint_changes = bs__read_slot_checkpoint_changes,                                          \
  .parameter_sets = bs__read_slot_parameter_sets, .list_buckets = bs__read_slot_list_buckets
int bs__read_slot_bucket_data(int *has_more_out, bs_storage *st, uint64_t c,
                              const bs_bucket_request *req, size_t n_req,
                              const bs_batch_options *opts,
                              int (*on_chunk)(const bs_chunk *, void *), void *payload,
                              bs_error *err);
int bs__read_slot_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t c,
                            const bs_val *buckets, size_t n, bs_error *err);
int bs__read_slot_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st,
                                  uint64_t from, uint64_t to, const bs_val *buckets, size_t n,
                                  bs_error *err);
int bs__read_slot_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                     int (*fn)(const bs_checkpoint_changes *, void *),
                                     void *payload, bs_error *err);
int bs__read_slot_parameter_sets(bs_storage *st, uint64_t c, const bs_val *lookups, size_t n,
                                 size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                                 bs_error *err);
int bs__read_slot_list_buckets(bs_storage *st, bs_val start_after,
                               int (*fn)(const bs_bucket_info *, void *), void *payload,
                               bs_error *err);

/* ---- Verify (verify.c): the rules of every backend's bs_db_verify ----
 * A backend walks its own storage and reports what it finds; these decide what is a problem. */
typedef struct bs__vstream {
  uint32_t id;
  uint64_t op_head;
  bs_hash hash;
  int hash_known; /* 0: a hash mode this build does not know: checksums are not recomputed */
} bs__vstream;
typedef struct bs__verify {
  void (*fn)(const char *problem, void *payload); /* NULL: problems are only counted */
  void *payload;
  uint64_t problems;
  const bs_allocator *a; /* of streams, which the backend frees */
  bs__vstream *streams;
  size_t n_streams, cap_streams;
} bs__verify;
/* One problem: counted, and formatted (up to 511 bytes) for fn. */
void bs__verify_problem(bs__verify *v, const char *fmt, ...) BS_PRINTF(2, 3);
/* Records a stream (its stored hash mode and checkpoint checked); BS_ENOMEM. */
int bs__verify_stream_add(bs__verify *v, uint32_t id, uint64_t op_head, uint64_t checkpoint,
                          unsigned hash);
const bs__vstream *bs__verify_stream(const bs__verify *v, uint32_t id); /* NULL: unknown */
/* A bucket: its stored state, set by the backend, then what bs__verify_op saw of its ops (zeroed
 * before the first), compared by bs__verify_bucket_end. */
typedef struct bs__vbucket {
  bs_val name;
  uint64_t id; /* shown in problems */
  uint32_t stream_id;
  const bs__vstream *stream; /* NULL: unknown */
  int has_state;             /* running checksum, count and bytes are stored */
  uint64_t checksum, count, bytes, last_op, clear_start, clear_op;
  uint64_t header; /* what an op adds to bytes beyond its payload */
  uint32_t sum;
  uint64_t n, n_bad /* ops the backend could not decode */, sum_bytes, last_seen, first_op;
  int first_clear;
} bs__vbucket;
/* The next op of b in op id order; payload: the bytes stored beyond its fixed fields. */
void bs__verify_op(bs__verify *v, bs__vbucket *b, const bs_op *op, uint64_t payload);
void bs__verify_bucket_end(bs__verify *v, const bs__vbucket *b);
/* Verify's op walk (reads.c) over a backend's read primitives (bs__read_store): every bucket of
 * stream sh and its ops through the rules above, inside the caller's snapshot (no begin or end),
 * an op's strings its payload, the buckets numbered in walk order. The walk's error (a backend's
 * failure; BS_OK when it only found problems). */
int bs__read_verify(bs__verify *v, const bs__read_store *s, void *x, const bs__vstream *sh,
                    bs_error *err);

/* ---- The front's checksum cache (cache.c; only storage.c calls it) ---- */
typedef struct bs__cksum_cache bs__cksum_cache;
int bs__cksum_cache_new(bs__cksum_cache **out, const bs_allocator *a, size_t capacity);
void bs__cksum_cache_free(bs__cksum_cache *c);
/* Front entry point: answers from the cache, batches misses to st->vt. */
int bs__cksum_cache_get(bs__cksum_cache *c, bs_storage *st, uint64_t checkpoint,
                        const bs_val *buckets, size_t n, bs_checksum *out, bs_error *err);
/* The front reports checkpoints it has seen (entries are stored only at C <= one of them), and
 * drops a stream's entries when the stream is cleared. */
void bs__cksum_cache_note_checkpoint(bs__cksum_cache *c, uint32_t stream, uint64_t checkpoint);
void bs__cksum_cache_drop_stream(bs__cksum_cache *c, uint32_t stream);
typedef struct bs__cksum_cache_stats {
  uint64_t hits;      /* answered from a cached base (exact or extended by a range) */
  uint64_t misses;    /* recomputed by vt->checksums */
  uint64_t stale;     /* cached bases discarded because the generation moved */
  uint64_t evictions; /* LRU evictions at capacity */
  uint64_t entries;   /* current entries */
} bs__cksum_cache_stats;
void bs__cksum_cache_get_stats(bs__cksum_cache *c, bs__cksum_cache_stats *out);

#endif /* BUCKETSTORE_INTERNAL_H */
