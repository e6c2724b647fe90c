/*
 * util_contract.h: helpers shared by the conformance tests (test_contract.c, test_property.c).
 * Everything here goes through the PUBLIC API (storage.h) only: a backend is judged by what
 * contract.md says, never by its internals. No main() here: linked into every test binary.
 */
#ifndef BS_TESTS_UTIL_CONTRACT_H
#define BS_TESTS_UTIL_CONTRACT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "../storage.h"

/* ---- Backends under test ----------------------------------------------------------------------
 * A backend is data: a name, whether its data survives a close, and two hooks. The three
 * built-ins are entries of ct_backends[]; another program describes its own backend the same way
 * and hands it to ct_run_contract() (docs/testing.md, "Running the conformance suite on your own backend").
 */
typedef struct ct_backend ct_backend;
struct ct_backend {
  const char *name; /* "memory", "lmdb", "lmdb+passthrough": labels and BS_CONTRACT_ONLY */
  int persistent;   /* data survives closing the db and open_db() again on the same path */
  /* Opens the db of one test. path: for a persistent backend, a file in a fresh temporary
   * directory of the test's own (the suite deletes the directory and every file in it at the
   * end); NULL otherwise. opts: the suite's options (checksum cache size; BS_OPEN_NOSYNC for
   * files). A persistent backend is opened again on the same path to reopen it and for a second
   * handle, and must then see what was committed. NULL hook: bs_open(), or bs_open_memory() when
   * not persistent. */
  int (*open_db)(const ct_backend *be, const char *path, const bs_open_options *opts, bs_db **out,
                 bs_error *err);
  /* Opens the storage of stream `id` of db (id 0: the ACTIVE stream, as bs_storage_open). NULL
   * hook: bs_storage_open(). A wrapping backend opens the inner storage and wraps it (the
   * "lmdb+passthrough" entry does that with ct_passthrough_wrap). */
  int (*open_storage)(const ct_backend *be, bs_db *db, uint32_t id, bs_storage **out,
                      bs_error *err);
  void *ctx; /* the backend's own, for its hooks; unused by the suite */
  /* The capabilities it does not have yet (CT_LACKS_*, 0: none): the tests and steps that need
   * one are left out on it, by this flag only (a BS_EUNSUPPORTED reply is never skipped: it
   * fails). Clearing a bit turns its cases on. */
  unsigned lacks;
  /* Removes what open_db created for path beyond the files in its directory (ct_env_close calls
   * it after closing the db; a server backend drops the test's schema). NULL: nothing. */
  void (*remove_db)(const ct_backend *be, const char *path);
};

/* Capabilities of ct_backend.lacks, one bit each. */
#define CT_LACKS_TRUNCATE 0x1u /* bs_writer_truncate, bs_writer_drop */
#define CT_LACKS_COMPACT  0x2u /* bs_compact, bs_compact_initial_replication */
/* No way for the suite to set a stream's op head (ct_set_op_head, tests/util_head.c, knows the
 * built-in backends only: no public call moves the head): the op-id-bound cases. */
#define CT_LACKS_OP_HEAD  0x4u
/* Whether be lacks capability cap (a CT_LACKS_* bit). */
int ct_lacks(const ct_backend *be, unsigned cap);

/* The built-ins; the enum names their index in ct_backends[]. */
enum { CT_MEMORY = 0, CT_LMDB = 1, CT_LMDB_PT = 2, CT_N_BACKENDS = 3 };
extern const ct_backend ct_backends[CT_N_BACKENDS];
/* "postgres": the PostgreSQL backend on the server BS_TEST_PG_URL names (a database where the
 * user may create schemas), persistent, each test env in a schema of its own (created by its
 * open_db, selected by the URL's search_path, dropped by remove_db; a reopen or a second handle
 * uses the same URL). NULL without BS_TEST_PG_URL or in a build without the backend. */
const ct_backend *ct_postgres(void);
/* The schema of the "postgres" env whose db is at path (ct_env.path), as open_db names it. */
void ct_pg_schema_of(const char *path, char *out, size_t cap);
/* The backends a suite runs on: the built-ins, then "postgres" when ct_postgres() has it; with
 * BS_BACKEND=name only the one of that name (none when no backend has it). Returns how many. */
#define CT_MAX_BACKENDS (CT_N_BACKENDS + 1)
size_t ct_backends_selected(const ct_backend *out[CT_MAX_BACKENDS]);

/* Runs the conformance suite (test_contract.c) on each of the n backends, in order; returns
 * non-zero when a test failed. test_contract.c's own main() calls it with the three built-ins;
 * a third party compiles test_contract.c with -DCT_CONTRACT_NO_MAIN and calls it from its own
 * main(). Honours BS_CONTRACT_ONLY, BS_CONTRACT_STRICT and BS_TEST_QUICK like the built-in run. */
int ct_run_contract(const ct_backend *const *backends, size_t n);

/* The last error of a helper call (tests are single-threaded). */
extern bs_error ct_err;

/* One test's world: a db (memory or a temp file), one stream, its storage and writer. */
typedef struct ct_env {
  const ct_backend *be;
  char dir[128];
  char path[192];
  size_t cache_entries; /* passed to bs_open_options.checksum_cache_entries */
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
  uint32_t stream;
} ct_env;

/* Opens the db of backend be (a fresh temp dir for file backends). */
int ct_env_open(ct_env *e, const ct_backend *be, size_t cache_entries);
/* Creates stream `name`, opens its storage and a default writer, and (if snapshot_lsn != NULL)
 * marks its snapshot done at that LSN so that commits can make checkpoints. */
int ct_env_stream(ct_env *e, const char *name, bs_hash hash, const char *snapshot_lsn);
/* Opens storage `id` of db, wrapped by the pass-through for "lmdb+passthrough". */
int ct_storage_open(const ct_env *e, bs_db *db, uint32_t id, bs_storage **out);
/* Opens a second handle on the same file (file backends only), with its own cache setting. */
int ct_open_second(const ct_env *e, size_t cache_entries, bs_db **out);
/* Closes writer, storage and db, and reopens db + storage of e->stream + a new writer
 * (file backends only; the memory backend returns BS_EUNSUPPORTED). */
int ct_env_reopen(ct_env *e);
/* Closes everything and removes the temp files. */
void ct_env_close(ct_env *e);
/* Opens a new writer on e->st replacing e->w (closing the old one, discarding its queue). */
int ct_env_writer(ct_env *e, const bs_writer_options *opts);
/* A cmocka fixture's world: a heap ct_env on backend be with stream "s1" (XXH3) whose snapshot
 * is done at "00000000", storage and writer open. NULL (after printing why) on failure. */
ct_env *ct_env_new(const ct_backend *be);
/* cmocka teardown of a ct_env_new() state: ct_env_close() and free. */
int ct_env_teardown(void **state);

/* ---- The pass-through wrapper (util_passthrough.c) -------------------------------------------- */
/* Wraps inner (taking ownership: closing the wrapper closes inner). Every vtable slot forwards
 * to inner; writers are wrapped too. bucket_data relays the inner backend's chunks through a
 * callback of its own, so the front sees a backend that cuts its own chunks (columns.c's
 * fallback for bs_get_bucket_columns). */
int ct_passthrough_wrap(bs_storage **out, bs_storage *inner);
/* The same, with no checksum cache on the wrapper: every checksum goes to the backend. */
int ct_passthrough_wrap_uncached(bs_storage **out, bs_storage *inner);
/* Number of forwarded calls so far (proves the wrapper is really on the path). */
extern unsigned long ct_passthrough_calls;

/* ---- Writing helpers -------------------------------------------------------------------------- */
typedef struct ct_r {
  const char *bucket, *type, *id, *data;
} ct_r;
#define CT_ROWS(...)                                                                               \
  ((const ct_r[]){__VA_ARGS__}), (sizeof((const ct_r[]){__VA_ARGS__}) / sizeof(ct_r))
#define CT_NOROWS NULL, 0

bs_val ct_v(const char *s); /* NULL -> {NULL, 0} */
/* One save. before NULL = same as after (for DELETE pass the deleted id as before). */
int ct_save(bs_writer *w, bs_tag tag, const char *table, const char *before, const char *after,
            const ct_r *rows, size_t n_rows);
/* A save with lookups too (lookups built by the caller). */
int ct_save_lk(bs_writer *w, bs_tag tag, const char *table, const char *before, const char *after,
               const ct_r *rows, size_t n_rows, const bs_lookup *lookups, size_t n_lookups);
int ct_commit(bs_writer *w, const char *lsn, bs_commit_result *out);
/* n as a fixed-width LSN ("%08u": byte order is numeric order), from 8 rotating buffers. */
const char *ct_lsn(unsigned n);
int ct_commit_ce(bs_writer *w, const char *lsn, int create_empty, bs_commit_result *out);
/* Encodes a lookup key of one string scalar (or an int / a double) into buf; returns its bs_val. */
bs_val ct_key_str(unsigned char *buf, size_t cap, const char *s);
bs_val ct_key_int(unsigned char *buf, size_t cap, int64_t i);
bs_val ct_key_double(unsigned char *buf, size_t cap, double d);

/* ---- Reading helpers -------------------------------------------------------------------------- */
typedef struct ct_buf {
  char *p; /* NUL-terminated copy, NULL when absent */
  size_t n;
} ct_buf;

typedef struct ct_op {
  uint64_t op_id;
  bs_op_type type;
  uint32_t checksum;
  uint64_t target_op;
  ct_buf object_type, object_id, subkey, data;
} ct_op;

typedef struct ct_oplist {
  ct_op *v;
  size_t n, cap;
  uint64_t max_target; /* the largest chunk target_op seen */
  size_t n_chunks;
} ct_oplist;

void ct_op_copy(ct_op *dst, const bs_op *src);
void ct_op_free(ct_op *op);
void ct_oplist_push(ct_oplist *l, const bs_op *op);
void ct_oplist_free(ct_oplist *l);
int ct_buf_eq(const ct_buf *b, const char *s);

/* Reads all of bucket in (after, C] with repeated calls (limit, chunk_bytes: 0 = default),
 * asserting the chunk invariants of contract.md 5.2 along the way. Returns the status of the first
 * failing call. */
int ct_read_bucket_opts(bs_storage *st, uint64_t C, const char *bucket, size_t blen, uint64_t after,
                        size_t limit, size_t chunk_bytes, ct_oplist *out);
int ct_read_bucket(bs_storage *st, uint64_t C, const char *bucket, uint64_t after, ct_oplist *out);
int ct_checksum(bs_storage *st, uint64_t C, const char *bucket, bs_checksum *out);
int ct_checksum_n(bs_storage *st, uint64_t C, const char *bucket, size_t blen, bs_checksum *out);

/* Collects parameter sets into a sorted, newline-joined string (caller frees). */
int ct_params(bs_storage *st, uint64_t C, const bs_val *lookups, size_t n, size_t limit,
              char **out);
/* Asserts that ct_params() (no limit) succeeds and returns exactly `want`. */
void ct_expect_params(bs_storage *st, uint64_t C, const bs_val *lookups, size_t n,
                      const char *want);

const char *ct_type_name(bs_op_type t);
void ct_dump_ops(const char *what, const ct_oplist *l);

/* ---- Assertions that print the library's error ---------------------------------------------- */
#define CT_OK(expr)                                                                                \
  do {                                                                                             \
    int ct_rc_ = (expr);                                                                           \
    if (ct_rc_ != BS_OK) fail_msg("%s\n  -> %s (%s)", #expr, bs_strerror(ct_rc_), ct_err.msg);     \
  } while (0)

#define CT_RC(want, expr)                                                                          \
  do {                                                                                             \
    int ct_rc_ = (expr);                                                                           \
    if (ct_rc_ != (want))                                                                          \
      fail_msg("%s\n  -> %s (%s), expected %s", #expr, bs_strerror(ct_rc_), ct_err.msg,            \
               bs_strerror(want));                                                                 \
  } while (0)

#define CT_EQ_U64(a, b)                                                                            \
  do {                                                                                             \
    uint64_t ct_a_ = (uint64_t)(a), ct_b_ = (uint64_t)(b);                                         \
    if (ct_a_ != ct_b_)                                                                            \
      fail_msg("%s == %s: got %llu, expected %llu", #a, #b, (unsigned long long)ct_a_,             \
               (unsigned long long)ct_b_);                                                         \
  } while (0)

#define CT_STR(buf, s)                                                                             \
  do {                                                                                             \
    const char *ct_s_ = (s);                                                                       \
    if (!ct_buf_eq(&(buf), ct_s_))                                                                 \
      fail_msg("%s: got \"%s\", expected \"%s\"", #buf, (buf).p ? (buf).p : "(none)",              \
               ct_s_ ? ct_s_ : "(none)");                                                          \
  } while (0)

/* ---- Callbacks' returns (storage.h, CALLBACKS' RETURNS) --------------------------------------- */
/* What a host's callback may return, for the tests of that rule: 0 (go on), -1, BS_E* codes,
 * positive values and the extremes of int. */
#define CT_N_CALLBACK_VALUES 9
extern const int ct_callback_values[CT_N_CALLBACK_VALUES];
/* Fails unless `call` (its status rc, and ct_err) is what storage.h promises when its callback
 * (named as the library's message names it: "bs_stream_list's fn", "opts->progress") returned
 * value and was then not called again (calls: how often it ran): BS_OK for 0; else BS_EUSER, or
 * BS_ECANCELED for a progress callback, with "<callback> returned <value>, which stops (cancels)
 * the call", and calls == 1. */
void ct_expect_stopped(const char *call, int rc, int value, int calls, const char *callback);

/* ---- Small containers (test code: allocation failure fails the test) ------------------------ */
char *ct_strndup(const void *p, size_t n); /* NUL-terminated copy */
char *ct_strdup(const char *s);
/* Grows v (of *cap elements of elem bytes) to hold at least need, doubling; returns v. */
void *ct_grow(void *v, size_t *cap, size_t need, size_t elem);
/* Binary search of an array of n structs (elem bytes each) sorted by the `char *` member at
 * name_off, compared bytewise with (name, len) as memcmp then length. Returns the index of the
 * match (*found = 1) or the insertion point (*found = 0). */
size_t ct_sorted_pos(const void *v, size_t n, size_t elem, size_t name_off, const char *name,
                     size_t len, int *found);
/* Opens a zeroed slot at index i of v (*n elements, *cap allocated), growing it; ++*n. Returns
 * the (possibly moved) array. */
void *ct_insert_at(void *v, size_t *n, size_t *cap, size_t i, size_t elem);
/* Removes element i of v (n elements) by moving the tail down; --*n. Frees nothing. */
void ct_remove_at(void *v, size_t *n, size_t i, size_t elem);
/* "type\x1fid\x1fsubkey": a row's identity within a bucket, as the client keys its oplog. */
char *ct_row_key(const ct_op *op);

/* ---- Seeds and the quick mode ----------------------------------------------------------------- */
int ct_quick(void); /* BS_TEST_QUICK set and not "0" */
uint64_t ct_env_u64(const char *name, uint64_t dflt);
/* splitmix64 PRNG */
typedef struct ct_rng {
  uint64_t s;
} ct_rng;
/* The generator of a suite's run of seed `seed` (stream: a constant of the suite's). The seed
 * goes through splitmix64's finalizer first: a start of seed * 0x9e3779b97f4a7c15 + c (the
 * increment of every draw) made seed k + 1 replay seed k one draw later. Every seeded suite
 * starts its generator here. */
ct_rng ct_seed(uint64_t seed, uint64_t stream);
uint64_t ct_rand(ct_rng *r);
uint64_t ct_below(ct_rng *r, uint64_t n); /* [0, n) */
/* A run's trace: an FNV-1a hash (start: 0) of what it did; folds n bytes into *h. */
void ct_trace(uint64_t *h, const void *p, size_t n);
/* How many of the n values repeat an earlier one. */
size_t ct_repeats(const uint64_t *v, size_t n);
/* Fails naming the first two of the n seeds run from `first` whose traces (trace[i] of seed
 * first + i) are equal: two seeds that do the same thing test it twice. */
void ct_distinct_traces(const char *suite, uint64_t first, const uint64_t *trace, size_t n);

/* The first seed of suite's runs on backend be ("property", "differential", "sync", "diff",
 * "pg_compact", "torn", "compact"; be NULL for the suites of one seed a run, ct_run_seed): BS_SEED when set
 * (one seed reproduced), else BS_SEED_BASE (default 1) plus a block of CT_SEED_BLOCK seeds of the
 * pair's own (the registry in util_contract.c, which also names the driver differential's and the
 * crash tests' blocks), so that no two runs of one `make test` share a seed (tests/step.sh
 * --seeds checks the log). */
#define CT_SEED_BLOCK 1000000u
uint64_t ct_first_seed(const char *suite, const ct_backend *be);
/* The seed of a run of a suite that takes one a run ("cache", "checksum", "lookup", "mem",
 * "concurrency", "fault", "read", "writer", "badfile", "common", "verify"; each test
 * draws its own stream from it with ct_seed): ct_first_seed (suite, NULL), logged (ct_seed_log, backend "-") and printed to stderr with the command that
 * replays it. Called once, from main. */
uint64_t ct_run_seed(const char *suite);
/* Appends "suite backend seed" to the file BS_SEED_LOG names, when it is set: one line per run. */
void ct_seed_log(const char *suite, const char *backend, uint64_t seed);

#endif /* BS_TESTS_UTIL_CONTRACT_H */
