/*
 * util_edge.h: one shared pool of edge values for the randomized suites (test_property.c,
 * test_sync.c, test_diff.c): strings every call that takes bytes must round-trip ("", one byte,
 * the maximum length of each BS_MAX_* limit and one byte over it, non-ASCII and astral UTF-8,
 * bytes that are not UTF-8, quotes, backslashes, NUL bytes) and lookup values whose canonical
 * encoding matters (1 vs 1.0, -0, true, null, int64 extremes, 2^53 and 2^53 + 1 beside the
 * double 2^53, 2^63 and other doubles, strings that look like numbers).
 *
 * A suite draws with a mask of the kinds it cannot take (its model keeps NUL-terminated
 * strings, say): a draw never returns a value of an excluded kind.
 */
#ifndef BS_TESTS_UTIL_EDGE_H
#define BS_TESTS_UTIL_EDGE_H

#include "util_contract.h"

/* Kinds of an edge string (bits; a value may have several). */
#define UE_EMPTY    0x01u /* "" */
#define UE_NUL      0x02u /* holds a NUL byte */
#define UE_NONASCII 0x04u /* UTF-8 beyond ASCII */
#define UE_MAXLEN   0x08u /* exactly the limit asked for */
#define UE_OVER     0x10u /* one byte over the limit (the call must refuse it: BS_ETOOBIG) */
#define UE_JSONISH  0x20u /* quotes, backslashes, braces: breaks naive JSON or "." joining */
#define UE_NOTUTF8  0x40u /* bytes that are not UTF-8 (names and ids are bytes: contract.md 1) */

/* The pool's fixed strings (each with its kinds); n_out gets their number. */
typedef struct ue_str {
  bs_val v;
  unsigned kinds;
} ue_str;
const ue_str *ue_strings(size_t *n_out);

/* A random edge string of at most max bytes (max 0 = no limit below BS_MAX_OBJECT_NAME), of
 * none of the kinds in avoid. With probability about 1/8 it is a maximum-length value (max bytes,
 * UE_MAXLEN; or max + 1 bytes, UE_OVER, unless avoided). Borrowed from static storage that stays
 * valid for the whole program; *kinds_out (may be NULL) gets its kinds. */
bs_val ue_str_pick(ct_rng *r, size_t max, unsigned avoid, unsigned *kinds_out);

/* An edge value of at most max bytes (none of the kinds in avoid, no NUL, not over max) copied
 * into buf (max + 1 bytes) as a C string, unless it equals one of the n C strings at names,
 * stride bytes apart: then buf is left as it was. For suites whose model keeps names as C
 * strings: the run's names, plain ones with some replaced. */
void ue_name(ct_rng *r, char *buf, size_t max, unsigned avoid, const char *names, size_t n,
             size_t stride);

/* A value of exactly n bytes (n <= BS_MAX_OBJECT_NAME + 1) whose content depends on variant:
 * distinct variants give distinct values of the same length. Static storage, one per variant
 * modulo 4 (a later call with the same variant % 4 overwrites it). */
bs_val ue_str_len(size_t n, unsigned variant);

/* Op data of an edge size up to max bytes: "", one byte, about the LMDB backend's chunk of ops
 * (3900-4100 bytes: one op alone, two ops sharing one, an op just over, lmdb_ops.c CHUNK_CAP),
 * 65535 and 65536 (past 16-bit sizes), rarely (one draw in 32) 1 MiB + 1, above a read's default
 * chunk_bytes. No NUL, not JSON; static storage (a later call may overwrite it). */
#define UE_DATA_MAX ((1u << 20) + 1)
bs_val ue_data(ct_rng *r, size_t max);

/* Lookup values. */
typedef struct ue_scalar {
  const char *label; /* for failure messages: "1.0", "-0", "int64 max", ... */
  bs_scalar v;
  int same_as; /* index of an earlier entry with the same canonical encoding, or -1 */
} ue_scalar;
const ue_scalar *ue_scalars(size_t *n_out);
/* A random lookup value of the pool (strings of the pool are NUL-free unless allowed). */
const ue_scalar *ue_scalar_pick(ct_rng *r, int allow_nul);
/* Encodes 1..3 random pool values into buf (cap >= BS_MAX_LOOKUP_KEY); returns the key. One key
 * in 8 is exactly BS_MAX_LOOKUP_KEY bytes long (a value with a long string). */
bs_val ue_lookup_key(ct_rng *r, unsigned char *buf, size_t cap, int allow_nul);

/* An op id argument (a read's C or after, a range's from or to, a compaction's max_op_id) for a
 * stream whose last op id is head: mostly in [0, head + 1]; one draw in 6 an edge: 0, 1, head,
 * head + 1, head + 2, 2^32 - 1, 2^32, 2^53, 2^53 + 1, 2^63 - 1 (the last op id a stream may
 * have), 2^63 (the first it may not), UINT64_MAX. A call must answer each the same on every
 * backend: served, empty, or refused. */
uint64_t ue_op_id(ct_rng *r, uint64_t head);

#endif /* BS_TESTS_UTIL_EDGE_H */
