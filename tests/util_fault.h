/*
 * util_fault.h: fault injection for the reliability tests (test_fault.c, test_concurrency.c, ...).
 *
 *  - ft_alloc: a bs_allocator (the per-handle hook of bs_open_options) that counts allocations,
 *    tracks the live ones (a leak check that works without ASan), and fails the N-th one, either
 *    once (transient) or from N on (persistent).
 *  - ft_wrap: a storage wrapper (like util_passthrough.c) whose vtable forwards every slot but
 *    fails the k-th call of chosen slots with a chosen status.
 *
 * Public API and the backend API only. Linked into every test binary: no main() here. Counters are atomic so the
 * allocator may be shared by reader threads.
 */
#ifndef BS_TESTS_UTIL_FAULT_H
#define BS_TESTS_UTIL_FAULT_H

#include <stddef.h>
#include <stdint.h>

#include "../storage_backend.h"

/* ---- Failing allocator ---------------------------------------------------------------------- */
typedef struct ft_alloc {
  bs_allocator a;         /* pass &f->a as bs_open_options.allocator */
  unsigned long calls;    /* malloc + realloc calls so far (failed ones included) */
  unsigned long fail_at;  /* 1-based call number to fail; 0 = never */
  int persistent;         /* 1: every call from fail_at on fails; 0: only that one */
  unsigned long injected; /* failures injected so far */
  long live;              /* blocks allocated and not yet freed */
  size_t live_bytes;
} ft_alloc;

void ft_alloc_init(ft_alloc *f);
/* Arms: fail call number n (counting from the next call as 1); 0 disarms. */
void ft_alloc_arm(ft_alloc *f, unsigned long n, int persistent);

/* ---- Failing vtable wrapper ----------------------------------------------------------------- */
/* Slot numbers: FT_<slot> for each slot of the storage and writer tables, from their lists in
 * storage_backend.h (FT_checksums, FT_flush, ...), and the two destroys. */
#define FT_SLOT_NUMBER(name, since, params, args) FT_##name,
enum ft_slot {
  FT_DESTROY,
  FT_WRITER_CLOSE,
  BS_STORAGE_SLOTS(FT_SLOT_NUMBER) BS_WRITER_SLOTS(FT_SLOT_NUMBER) FT_N_SLOTS
};

typedef struct ft_vt_config {
  unsigned long calls[FT_N_SLOTS];   /* calls seen per slot */
  unsigned long fail_at[FT_N_SLOTS]; /* 1-based call number of that slot to fail; 0 = never */
  int persistent[FT_N_SLOTS];        /* fail every call from fail_at on */
  int status[FT_N_SLOTS];            /* status to return (0 = BS_EIO) */
  unsigned long injected;
} ft_vt_config;

/* Wraps inner (taking ownership) with cfg (borrowed; must outlive the wrapper). The wrapper
 * shares inner's checksum cache, so the front's cache sits above the failing slots. */
int ft_wrap(bs_storage **out, bs_storage *inner, ft_vt_config *cfg);

/* ---- A compaction-invariant fingerprint of a stream at checkpoint C ------------------------- */
/* Text describing, at C: every bucket of buckets (its checksum and its reduced live rows: the
 * latest PUT per row identity, CLEAR resetting) and the parameter sets of every lookup. Equal
 * for two stores that any client sees alike at C, so also before and after compaction.
 * Also checks, per bucket, that the sum of the op checksums read equals the bucket checksum;
 * on a mismatch returns FT_EMISMATCH with the detail in err. A bucket whose read served a
 * MOVE/CLEAR with target_op > C (compaction above C: contract.md 5.5) is marked " target>C".
 * *out: malloc'd; caller frees. */
#define FT_EMISMATCH (-100)
int ft_fingerprint(bs_storage *st, uint64_t C, const bs_val *buckets, size_t nb,
                   const bs_val *lookups, size_t nl, char **out, bs_error *err);

/* ---- Byte strings collected as text (parameter sets, change lists) ------------------------ */
/* Each value becomes printable text, unambiguous for any bytes (ASCII kept, the rest %xx, as
 * ft_fingerprint shows names). Parameter rows arrive in an order the contract does not fix:
 * collect, then ft_strs_sort. */
typedef struct ft_strs {
  char **v;
  size_t n, cap;
} ft_strs;
/* Adds *v; also the callback of bs_get_parameter_sets (payload: ft_strs *). BS_ENOMEM on failure. */
int ft_strs_add(const bs_val *v, void *payload);
void ft_strs_sort(ft_strs *s);
int ft_strs_has(const ft_strs *s, bs_val v); /* 1 when v was added */
void ft_strs_free(ft_strs *s);

/* ---- Small helpers -------------------------------------------------------------------------- */
/* A fresh temporary directory under $TMPDIR (or /tmp) into buf; 0 on success. */
int ft_tmpdir(char *buf, size_t cap, const char *tag);
/* Removes path, path-lock and the directory dir (best effort). */
void ft_rm_db(const char *dir, const char *path);
/* The CLI of this build, BUILD/bucketstore beside this BUILD/tests/ binary, into buf: 0 when it
 * is there (make builds it before it runs the tests), else -1. */
int ft_cli_path(char *buf, size_t cap);
/* What a test cannot run here: printed, and recorded for make test's summary as a skip (appended
 * to the file $BS_SKIP_NOTE, tests/step.sh). The caller then skips (cmocka's skip()) or returns. */
void ft_skip_note(const char *why);
/* A status is "clean" when it is one of the documented BS_* codes. */
int ft_clean_status(int rc);

#endif /* BS_TESTS_UTIL_FAULT_H */
