/*
 * util_client.h: the sync protocol's lines and a client that applies them the way the reference
 * client does (its sync-protocol client and the SQLite core it drives): per-bucket state with
 * an `add_checksum` (checksums of ops no longer stored: superseded PUTs, REMOVEs, MOVEs, the
 * CLEAR's sum) and an `op_checksum` (checksums of the stored live PUTs), validated at
 * checkpoint_complete (every bucket) and partial_checkpoint_complete (buckets with priority
 * <= the given one) against the checksums of the last checkpoint / checkpoint_diff line.
 *
 * Written independently of util_model's reduce, so that the two cross-check each other.
 */
#ifndef BS_TESTS_UTIL_CLIENT_H
#define BS_TESTS_UTIL_CLIENT_H

#include "util_contract.h"

/* ---- Protocol lines (produced by util_server, consumed here) -------------------------------- */
typedef enum sl_kind {
  SL_CHECKPOINT = 1,      /* last_op_id, buckets (every bucket of the client) */
  SL_CHECKPOINT_DIFF = 2, /* last_op_id, buckets (updated), removed */
  SL_DATA = 3,            /* bucket, after, next_after, has_more, target_op, ops */
  SL_CHECKPOINT_COMPLETE = 4,
  SL_PARTIAL_COMPLETE = 5 /* last_op_id, priority */
} sl_kind;

typedef struct sl_bucket_checksum {
  char *name;
  uint32_t checksum;
  uint64_t count;
  int priority;
} sl_bucket_checksum;

typedef struct sl_line {
  sl_kind kind;
  uint64_t last_op_id;
  sl_bucket_checksum *buckets;
  size_t n_buckets;
  char **removed;
  size_t n_removed;
  int priority;
  char *bucket;
  uint64_t after, next_after, target_op;
  int has_more;
  ct_oplist ops;
} sl_line;

void sl_line_free(sl_line *l);
const char *sl_kind_name(sl_kind k);

/* ---- The client ----------------------------------------------------------------------------- */
typedef struct cl_row {
  char *key; /* object_type \x1f object_id \x1f subkey (the same key as util_model's reduce) */
  uint64_t op_id;
  uint32_t checksum;
  char *data;
} cl_row;

/* Local state of one bucket (ps_buckets + its ps_oplog rows). Survives disconnects. */
typedef struct cl_bucket {
  char *name;
  uint64_t last_op;
  uint32_t add_checksum; /* ops not stored any more */
  uint32_t op_checksum;  /* stored live PUTs */
  cl_row *rows;          /* sorted by key */
  size_t n, cap;
} cl_bucket;

typedef struct cl_checkpoint {
  uint64_t last_op_id;
  sl_bucket_checksum *b; /* sorted by name */
  size_t n, cap;
} cl_checkpoint;

typedef struct cl_client {
  cl_bucket *b; /* sorted by name */
  size_t n, cap;
  /* session (one connection) */
  int connected;
  int has_target;
  cl_checkpoint target;
  /* results */
  uint64_t validated_cp;  /* checkpoint of the last successful validation */
  int validated_priority; /* its priority; -1 = full checkpoint_complete */
  uint64_t applied_cp;    /* last checkpoint validated in full */
  unsigned long lines, data_ops, completes, partials;
  sl_kind last_kind; /* of the last line applied */
  char why[1024];    /* the last failure */
} cl_client;

/* cl_apply results */
#define CL_OK        0
#define CL_VALIDATED 1 /* a (partial) checkpoint validated: validated_cp / validated_priority */
#define CL_MISMATCH  2 /* a checksum did not match (why) */
#define CL_PROTOCOL  3 /* a line the protocol does not allow here (why) */

void cl_init(cl_client *c);
void cl_free(cl_client *c);
/* Deep copy of the local state (dst disconnected); the copy resumes from src's positions. */
void cl_clone(cl_client *dst, const cl_client *src);
/* Starts a session. *req_out (malloc'ed, names borrowed from c) gets one (bucket, last_op) per
 * local bucket, as the client requests them. */
void cl_connect(cl_client *c, bs_bucket_request **req_out, size_t *n_out);
void cl_disconnect(cl_client *c);
int cl_apply(cl_client *c, const sl_line *l);

cl_bucket *cl_find(const cl_client *c, const char *name);
const sl_bucket_checksum *cl_target_bucket(const cl_client *c, const char *name);
uint32_t cl_checksum(const cl_bucket *b); /* add_checksum + op_checksum */
const cl_row *cl_row_find(const cl_bucket *b, const char *key);

#endif /* BS_TESTS_UTIL_CLIENT_H */
