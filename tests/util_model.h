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
/* Applies one save (contract.md 4.1). */
void md_save(md_stream *m, const bs_save *s);
/* Applies truncate(table) (contract.md 4.2). */
void md_truncate(md_stream *m, const char *table);
/* Checks the engine's ops in every open group with hi <= C and adopts the engine's id
 * assignment. Fails the test (with a dump) on any mismatch. */
void md_reconcile(md_stream *m, bs_storage *st, uint64_t C);

md_bucket *md_find_bucket(md_stream *m, const char *name);
/* Sum and count of the original history of bucket with op_id <= C. */
void md_checksum(const md_stream *m, const char *bucket, uint64_t C, bs_checksum *out);
/* Parameter sets at C (a key listed twice counts once), sorted and newline-joined (caller frees);
 * number of rows in *n_rows. */
char *md_params(const md_stream *m, uint64_t C, const bs_val *keys, size_t n, size_t *n_rows);

/* Op checksums and subkey, computed independently of the library. */
uint32_t md_hash(bs_hash h, const void *p, size_t n);
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

#endif /* BS_TESTS_UTIL_MODEL_H */
