/*
 * lmdb_internal.h: what the LMDB backend's files (lmdb*.c) share: the key and value layout of
 * the file, the handles, and the LMDB helpers. The only header that includes <lmdb.h>: the
 * front, the rules and the other backends compile without it (make layercheck).
 */
#ifndef BUCKETSTORE_LMDB_INTERNAL_H
#define BUCKETSTORE_LMDB_INTERNAL_H

#include "internal.h"

#include <lmdb.h>
#include <sys/types.h>

/* =================================================================================================
 * LMDB backend, its files from the bottom up (each uses only files named before it here):
 * lmdb_codec.c (the layout below), lmdb_file.c (the file check before the environment opens),
 * lmdb_env.c (the handle, transactions, map growth, stream and bucket records), lmdb_ops.c (the
 * op records: every access to `ops` goes through it), lmdb_read.c
 * (reads, stat), lmdb_params.c, lmdb_verify.c, lmdb_backup.c (backup, export, load), lmdb_wcp.c
 * (write checkpoints), lmdb_write.c (the writer, clear, terminate), lmdb_compact.c, and on top
 * lmdb.c (streams, the method tables, the constructor).
 *
 * One file (MDB_NOSUBDIR), named sub-databases. Integers in keys are big-endian so byte order is
 * numeric order. A variable part of a key is either the last part (its length is implied) or
 * length-prefixed, so no name can alias another. Values are little-endian.
 *
 *  sub-db      key                                                value
 *  meta        "format"                                           "bktstore" + u32 format version
 *              "seq.bucket"                                       u64 last global bucket id
 *              'S' u32be stream                                   stream record (bs__stream_rec)
 *  tables      u32be stream | table name (rest)                   u32 table id (1, 2, ... per stream)
 *  buckets     u32be stream | bucket name (rest)                  u64 bucket id
 *  bstate      u64be bucket id                                    bucket state (bs__bucket_state)
 *  ops         u64be bucket id | u64be the chunk's last op id     chunk: a run of the bucket's
 *                                                                 ops (lmdb_ops.c, format 5)
 *  source      u32be stream | u32be table id | replica id (rest)  source record (see below)
 *  params      u32be stream | u16be klen | lookup key | u32be table id | u64be XXH3_64(replica id)
 *              | u64be op id                                      u16 rid len, replica id, u32 n,
 *                                                                 n x (u32 len, JSON bytes);
 *                                                                 n = 0: tombstone
 *              (max 4+2+480+4+8+8 = 506 bytes. The replica id is hashed to fit the 511-byte key
 *              limit; readers group entries by the full replica id kept in the value, so a hash
 *              collision only interleaves two rows' entries, never merges them.)
 *  changes     u32be stream | u64be op id | u64be seq             change record (see below)
 *  wcp         'M' | user id (rest)                               managed record (bs__wcp_rec)
 *              'P' | user id (rest)                               (empty) marks a pending 'M'
 *                                                                 record: commit walks these
 *              'H' | user id (rest)                               u64 highest managed id of a
 *                                                                 user whose 'M' record cleanup
 *                                                                 deleted (ids never go back)
 *              'C' | u32be stream | u16be event len | event | user id (rest)   u64 value
 *                                                                 [| i64 requested_at ms: a
 *                                                                 request-derived checkpoint]
 *  superseded  u64be bucket id | u64be old op id                  u64 new op id
 *  cqueue      u32be stream | u64be bucket id                     (empty) incremental work queue
 *  softdel     u32be stream | u64be op-id mark | u32be table id | replica id (rest)   (empty)
 *              index of soft-deleted source records (contract.md 4.3); purged by the first checkpoint
 *              at or above the mark. An entry whose record is no longer soft-deleted with that
 *              mark is stale and simply dropped.
 *
 * Chunk (lmdb_ops.c): u32 n | u32 sum of checksums | u64 first op id | u32 bytes | u8 flags |
 *           n x (varint op id delta | varint value size | op value).
 * Op value: u8 type | u32 checksum | u64 target_op | u16 object_type len | u16 object_id len |
 *           u8 subkey len | object_type | object_id | subkey | data (rest of the value).
 *           The 18-byte header is fixed so that a reader decodes without copying (zero-copy:
 *           bs_op fields point into the map).
 * Change record (one per flush that persisted something, and one per checkpoint), keyed by the
 *           highest op id it covers: u64 first op id | u64 time ms | u8 flags (1 = checkpoint,
 *           2 = too many buckets, 4 = too many lookups) | u32 n buckets, n x (u16 len, name) |
 *           u32 n lookups, n x (u16 len, key) | u32 n users, n x (u16 len, user id).
 * ================================================================================================= */

/* ---- The codec (lmdb_codec.c; the decoders of hot read loops are inline here) ----------------
 * Each key and value of the layout table is encoded and decoded by this section and nowhere
 * else. A decoder checks every length against its buffer: what does not decode is BS_ECORRUPT,
 * never a read past the end. tests/test_codec.c holds golden bytes and malformed inputs. */

/* Every per-stream key starts with u32be stream (the layout table): a stream's entries of a
 * sub-database are the keys with that prefix. */
#define BS_STREAM_PREFIX_SIZE 4u
static inline void bs__lmdb_stream_prefix(unsigned char k[BS_STREAM_PREFIX_SIZE], uint32_t stream) {
  bs__put_u32be(k, stream);
}
/* The stream of a per-stream key; BS_ECORRUPT when k is too short to name one. */
static inline int bs__lmdb_key_stream(const MDB_val *k, uint32_t *stream) {
  if (k->mv_size < BS_STREAM_PREFIX_SIZE) return BS_ECORRUPT;
  *stream = bs__get_u32be(k->mv_data);
  return BS_OK;
}
/* 1 when per-stream key k belongs to stream. */
static inline int bs__lmdb_in_stream(const MDB_val *k, uint32_t stream) {
  uint32_t s;
  return bs__lmdb_key_stream(k, &s) == BS_OK && s == stream;
}
/* The bucket of a bucket-keyed key (bstate, ops, superseded: they start with u64be bucket id);
 * BS_ECORRUPT when k is too short to name one. */
static inline int bs__lmdb_key_bucket(const MDB_val *k, uint64_t *bucket) {
  if (k->mv_size < 8) return BS_ECORRUPT;
  *bucket = bs__get_u64be(k->mv_data);
  return BS_OK;
}

/* ops key: u64be bucket id | u64be op id. */
#define BS_OP_KEY_SIZE 16u
static inline void bs__lmdb_op_key(unsigned char k[BS_OP_KEY_SIZE], uint64_t bucket, uint64_t op) {
  bs__put_u64be(k, bucket);
  bs__put_u64be(k + 8, op);
}

/* Op value (layout above; internal.h's bs__op_value_*, which every backend storing op chunks
 * shares, bs__op_value_encode writes it): only the fields op's type carries are stored
 * (bs__op_carries_row; data only for PUT), so a MOVE or CLEAR is the bare header. */
static inline size_t bs__lmdb_op_size(const bs_op *op) {
  return bs__op_value_size(op);
}
/* Decodes a format-4 op record, format 5's op value (borrowed: op's fields point into val) with
 * op_id from the key. Not inline: the library reads ops from chunks (lmdb_ops.c), the tests
 * still read single op values with it, and an amalgamation must not carry an unused inline. */
int bs__lmdb_op_decode(const MDB_val *key, const MDB_val *val, bs_op *op);

/* buckets key: u32be stream | bucket name (1..BS_MAX_BUCKET_NAME bytes); value: u64 bucket id. */
#define BS_BUCKET_KEY_MAX (4u + BS_MAX_BUCKET_NAME)
static inline void bs__lmdb_bucket_value(unsigned char v[8], uint64_t id) {
  bs__put_u64le(v, id);
}
/* Points key at the key of (stream, name), written into buf. BS_ETOOBIG when name is over
 * BS_MAX_BUCKET_NAME. */
int bs__lmdb_bucket_key(unsigned char buf[BS_BUCKET_KEY_MAX], uint32_t stream, bs_val name,
                        MDB_val *key, bs_error *err);
/* The id a buckets value holds; BS_ECORRUPT (err written) when it is not one. */
int bs__lmdb_bucket_id_decode(const MDB_val *v, uint64_t *id, bs_error *err);
/* A whole buckets entry (name borrowed from k); BS_ECORRUPT, err untouched, when it does not
 * decode. */
int bs__lmdb_bucket_entry_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, bs_val *name,
                                 uint64_t *id);

/* tables key: u32be stream | table name (1..BS_MAX_TABLE_NAME bytes); value: u32 table id, from 1
 * (the stream record's next_table_id). */
#define BS_TABLE_KEY_MAX (4u + BS_MAX_TABLE_NAME)
/* Points key at the key of (stream, name), written into buf. BS_ETOOBIG when name is over
 * BS_MAX_TABLE_NAME. */
int bs__lmdb_table_key(unsigned char buf[BS_TABLE_KEY_MAX], uint32_t stream, bs_val name,
                       MDB_val *key, bs_error *err);
static inline void bs__lmdb_table_value(unsigned char v[4], uint32_t id) {
  bs__put_u32le(v, id);
}
/* The id a tables value holds; BS_ECORRUPT (err written) when it is not one. */
int bs__lmdb_table_id_decode(const MDB_val *v, uint32_t *id, bs_error *err);
/* A whole tables entry (name borrowed from k); BS_ECORRUPT, err untouched, when it does not
 * decode. */
int bs__lmdb_table_entry_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, bs_val *name,
                                uint32_t *id);

/* bstate key: u64be bucket id (so a bucket's state and its ops sort alike). */
#define BS_STATE_KEY_SIZE 8u
static inline void bs__lmdb_state_key(unsigned char k[BS_STATE_KEY_SIZE], uint64_t bucket) {
  bs__put_u64be(k, bucket);
}

/* source key: u32be stream | u32be table id (from 1) | replica id (the rest, at most
 * BS_MAX_REPLICA_ID bytes, "" included). Writes the key into k and returns its size. */
#define BS_SOURCE_KEY_MAX (8u + BS_MAX_REPLICA_ID)
static inline size_t bs__lmdb_source_key(unsigned char k[BS_SOURCE_KEY_MAX], uint32_t stream,
                                         uint32_t table, bs_val rid) {
  bs__put_u32be(k, stream);
  bs__put_u32be(k + 4, table);
  if (rid.size) memcpy(k + 8, rid.data, rid.size);
  return 8 + rid.size;
}
/* The parts of a source key (rid borrowed from k, non-NULL); BS_ECORRUPT when k is not one
 * (shorter than 8 bytes, table id 0, a replica id over BS_MAX_REPLICA_ID). */
static inline int bs__lmdb_source_key_decode(const MDB_val *k, uint32_t *stream, uint32_t *table,
                                             bs_val *rid) {
  const unsigned char *p = (const unsigned char *)k->mv_data;
  if (k->mv_size < 8 || k->mv_size > BS_SOURCE_KEY_MAX || bs__get_u32be(p + 4) == 0)
    return BS_ECORRUPT;
  *stream = bs__get_u32be(p);
  *table = bs__get_u32be(p + 4);
  rid->data = p + 8;
  rid->size = k->mv_size - 8;
  return BS_OK;
}
/* The replica id of a valid source key. */
static inline bs_val bs__lmdb_source_rid(bs_val key) {
  bs_val rid = {(const unsigned char *)key.data + 8, key.size - 8};
  return rid;
}

/* params key and value (the layout table above). */
#define BS_PARAM_KEY_MAX    (4u + 2u + BS_MAX_LOOKUP_KEY + 4u + 8u + 8u)
#define BS_PARAM_GROUP_SIZE 12u /* u32be table id | u64be XXH3_64(replica id) */
/* Writes stream | klen | lookup key (what every entry of one lookup key starts with) into out;
 * returns its size. */
size_t bs__lmdb_param_prefix(unsigned char *out, uint32_t stream, bs_val lookup);
/* Writes the key of one entry into out (BS_PARAM_KEY_MAX bytes); returns its size. The caller
 * has checked lookup.size <= BS_MAX_LOOKUP_KEY. */
size_t bs__lmdb_param_key(unsigned char *out, uint32_t stream, bs_val lookup, uint32_t table_id,
                          bs_val replica_id, uint64_t op_id);
/* Decodes a key (lookup borrowed from k); BS_ECORRUPT when it does not decode. */
int bs__lmdb_param_key_decode(const MDB_val *k, uint32_t *stream, bs_val *lookup, uint64_t *op_id);
/* Size of the value of an entry with n rows (n = 0: tombstone), and its encoder (out has
 * bs__lmdb_param_value_size bytes, e.g. an MDB_RESERVE buffer). */
size_t bs__lmdb_param_value_size(bs_val replica_id, const bs_val *rows, size_t n);
void bs__lmdb_param_value(unsigned char *out, bs_val replica_id, const bs_val *rows, size_t n);
/* Checks a value and returns its replica id and row count (borrowed); rows_out (may be NULL)
 * points at the first (u32 len, bytes) row. BS_ECORRUPT when it does not decode. */
int bs__lmdb_param_value_decode(const MDB_val *v, bs_val *replica_id, uint32_t *n_rows,
                                const unsigned char **rows_out);

/* cqueue key: u32be stream | u64be bucket id (a bucket with superseded entries to compact);
 * value empty. */
#define BS_CQUEUE_KEY_SIZE 12u
static inline void bs__lmdb_cqueue_key(unsigned char k[BS_CQUEUE_KEY_SIZE], uint32_t stream,
                                       uint64_t bucket) {
  bs__put_u32be(k, stream);
  bs__put_u64be(k + 4, bucket);
}
/* BS_ECORRUPT when k and v are not a cqueue entry. */
int bs__lmdb_cqueue_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, uint64_t *bucket);

/* softdel key: u32be stream | u64be op-id mark | u32be table id | replica id (rest): the key of
 * the soft-deleted source record (u32be stream | u32be table id | replica id) with the mark
 * after its stream, so that a stream's entries come in mark order; value empty. */
#define BS_SOFTDEL_KEY_MAX (16u + BS_MAX_REPLICA_ID)
/* Writes the entry's key for the source record key src (a valid one) into out; returns its size. */
size_t bs__lmdb_softdel_key(unsigned char out[BS_SOFTDEL_KEY_MAX], uint64_t mark, bs_val src);
/* The stream, the mark and the source record's key (written into src_buf, src points at it) of an entry;
 * BS_ECORRUPT when k and v are not one (table id 0, a replica id over BS_MAX_REPLICA_ID, a value). */
int bs__lmdb_softdel_decode(const MDB_val *k, const MDB_val *v, uint32_t *stream, uint64_t *mark,
                            unsigned char src_buf[BS_SOFTDEL_KEY_MAX - 8], MDB_val *src);

/* changes key: u32be stream | u64be highest op id covered (last) | u64be sequence. */
#define BS_CHANGE_KEY_SIZE 20u
static inline void bs__lmdb_change_key(unsigned char k[BS_CHANGE_KEY_SIZE], uint32_t stream,
                                       uint64_t last, uint64_t seq) {
  bs__put_u32be(k, stream);
  bs__put_u64be(k + 4, last);
  bs__put_u64be(k + 12, seq);
}
/* Change record value (the layout table above): a fixed head, then three lists (bucket names,
 * lookup keys, user ids), each u32 n and n x (u16 len, bytes). The writer encodes one in place
 * (an MDB_RESERVE buffer of the summed sizes): bs__lmdb_change_head, then per list
 * bs__lmdb_change_count and its items, each bs__lmdb_change_item. */
#define BS_CHANGE_CHECKPOINT       1u
#define BS_CHANGE_TOO_MANY_BUCKETS 2u  /* too many buckets (bs__changes_too_many): left empty */
#define BS_CHANGE_TOO_MANY_LOOKUPS 4u  /* the same for lookups */
#define BS_CHANGE_FIXED            17u /* u64 first op id | u64 time ms | u8 flags */
static inline size_t bs__lmdb_change_list_size(size_t n, size_t item_bytes) {
  return 4 + 2 * n + item_bytes;
}
unsigned char *bs__lmdb_change_head(unsigned char *out, uint64_t first, int64_t time_ms,
                                    unsigned flags);
unsigned char *bs__lmdb_change_count(unsigned char *p, uint32_t n);
unsigned char *bs__lmdb_change_item(unsigned char *p, bs_val item); /* item.size <= 0xffff */
/* A decoded record; each list's items are read with bs__lmdb_change_next (already checked). */
typedef struct bs__change_list {
  const unsigned char *p;
  uint32_t n;
} bs__change_list;
typedef struct bs__change_rec {
  uint32_t stream;
  uint64_t first, last, seq;
  int64_t time_ms;
  unsigned flags;
  bs__change_list buckets, lookups, users;
} bs__change_rec;
/* BS_ECORRUPT when k and v are not one change record: a key of another size, unknown flags, a
 * list past the value's end or followed by bytes, too many buckets or lookups (the cap),
 * or an item over its limit (BS_MAX_BUCKET_NAME, BS_MAX_LOOKUP_KEY, BS_MAX_USER_ID). */
int bs__lmdb_change_decode(const MDB_val *k, const MDB_val *v, bs__change_rec *out);
static inline bs_val bs__lmdb_change_next(const unsigned char **p) {
  bs_val v;
  v.size = bs__get_u16le(*p);
  v.data = *p + 2;
  *p += 2 + v.size;
  return v;
}

/* source value (format 3; varints are LEB128, at most 10 bytes): u8 head (bits 0-2: 1 =
 * soft-deleted, 2 = has data, 4 = has a mark; bits 3-5: n members, 7 = more; bits 6-7: n lookups,
 * 3 = more) | varint soft-delete mark (flag 4) | varint n members (head 7) | varint n lookups
 * (head 3) | n x (varint bucket id | varint last op id | varint code | varint object_id length
 * (code bit 0) | object_type (code >> 1 - 1 bytes) | object_id (code bit 0)) | n x (varint len |
 * lookup key) | data (the rest, flag 2; without it the value ends after the lookups). A type code
 * (code >> 1) 0 repeats the previous member's object_type, or for the first member is the
 * table's name (table: the name of the source key's table id); code bit 0 clear: the object_id
 * is the replica id (rid: the source key's, bs__lmdb_source_rid). The subkey is not stored: it
 * is a function of (table id, replica id), both in the key. A member's bucket is the bucket id. */
size_t bs__lmdb_srec_size(const bs__srec *r, bs_val table, bs_val rid);
/* Writes r (bs__lmdb_srec_size bytes) into out; r->exists is implied, the caller has checked
 * the u16 limits (BS_MAX_OBJECT_NAME, BS_MAX_LOOKUP_KEY). */
void bs__lmdb_srec_encode(unsigned char *out, const bs__srec *r, bs_val table, bs_val rid);
/* Decodes v's fixed part into r (flags, counts, mark; r->m and r->lk NULL, exists 1). Then,
 * with arrays of r->nm members and r->nl keys, bs__lmdb_srec_decode fills them and the data
 * (all borrowed from v, table and rid; present fields non-NULL, also when empty). BS_ECORRUPT
 * when v is not exactly one record: truncated, overlong, or counts that cannot fit. */
int bs__lmdb_srec_head(const MDB_val *v, bs__srec *r);
int bs__lmdb_srec_decode(const MDB_val *v, bs_val table, bs_val rid, bs__srec *r, bs__member *m,
                         bs_val *lk);
/* Checks a whole value and calls fn(bucket id, op id) for each membership; BS_ECORRUPT when it
 * does not decode; a non-zero return of fn stops and is returned. No allocation. */
int bs__lmdb_srec_members(const MDB_val *v, int (*fn)(uint64_t bucket, uint64_t op, void *),
                          void *payload);
/* The migrations (lmdb_format.c): the format-2 value of the format-1 source record (k, v),
 * written into out (bs__lmdb_srec1_bound(v) bytes), its size in *n; and the format-3 value of
 * the format-2 one (bs__lmdb_srec2_bound(v) bytes; table: the name of its table id, or empty
 * when the table is unknown). BS_ECORRUPT when v is not a record of that format. */
size_t bs__lmdb_srec1_bound(const MDB_val *v);
int bs__lmdb_srec1_convert(const MDB_val *k, const MDB_val *v, unsigned char *out, size_t *n);
size_t bs__lmdb_srec2_bound(const MDB_val *v);
int bs__lmdb_srec2_convert(const MDB_val *k, const MDB_val *v, bs_val table, unsigned char *out,
                           size_t *n);

/* meta 'S' key: 'S' | u32be stream id. */
#define BS_STREAM_KEY_SIZE 5u
static inline void bs__lmdb_stream_key(unsigned char k[BS_STREAM_KEY_SIZE], uint32_t id) {
  k[0] = 'S';
  bs__put_u32be(k + 1, id);
}
/* The stream id of a meta key; BS_ECORRUPT when k is not a stream key. */
int bs__lmdb_stream_key_decode(const MDB_val *k, uint32_t *id);

/* meta "format": "bktstore" | u32 format version, checked at open; meta "seq.bucket": the last
 * bucket id given out (every stream's buckets take their ids from it), valued like a buckets
 * entry (bs__lmdb_bucket_value, bs__lmdb_bucket_id_decode). */
#define BS_FORMAT_VALUE_SIZE 12u
static inline MDB_val bs__lmdb_format_key(void) {
  MDB_val k = {6, (void *)"format"};
  return k;
}
static inline MDB_val bs__lmdb_seq_key(void) {
  MDB_val k = {10, (void *)"seq.bucket"};
  return k;
}
/* The value of format version / the version of a format value: BS_ECORRUPT when v is not one
 * (another size or tag). */
void bs__lmdb_format_value(unsigned char v[BS_FORMAT_VALUE_SIZE], uint32_t version);
int bs__lmdb_format_decode(const MDB_val *v, uint32_t *version);
/* meta "format.step", present only while a migration runs (lmdb_format.c): u32 the format it
 * migrates from | u8 1 when a key follows | the key of the last record converted (the rest). */
#define BS_FORMAT_STEP_FIXED 5u
static inline MDB_val bs__lmdb_format_step_key(void) {
  MDB_val k = {11, (void *)"format.step"};
  return k;
}
/* Writes the record into buf (BS_FORMAT_STEP_FIXED + key->mv_size bytes; key mv_size 0: none)
 * and returns it; decode: BS_ECORRUPT when v is not one (key borrowed from v). */
MDB_val bs__lmdb_format_step_value(unsigned char *buf, uint32_t from, MDB_val key);
int bs__lmdb_format_step_decode(const MDB_val *v, uint32_t *from, MDB_val *key);

/* Per-stream record in meta 'S' u32be id (little-endian):
 *   u8 record version (BS_STREAM_REC_VERSION) | u8 state | u8 hash | u8 snapshot_done | u8 flags
 *   (1 = checkpoint lsn, 2 = resume lsn, 4 = no_checkpoint_before, 8 = clear pending) | 3 zero |
 *   u32 id |
 *   u32 next_table_id | u64 op_head, checkpoint, last_checkpoint_op, change_seq, param_horizon,
 *   param_cursor, changes_fence, compact_horizon | i64 created_ms       (BS_STREAM_REC_FIXED)
 *   then u16 len + bytes (at most BS_STREAM_STR_MAX) for: name, checkpoint_lsn, resume_lsn,
 *   no_checkpoint_before, last_error; nothing after them.
 * Byte strings point into the map (or the writer's copy). */
#define BS_STREAM_REC_VERSION 1u
#define BS_STREAM_REC_FIXED   88u
#define BS_STREAM_STR_MAX     255u /* BS_MAX_STREAM_NAME, BS_MAX_LSN; last_error is cut to it */
#define BS_STREAM_REC_MAX     (BS_STREAM_REC_FIXED + 5u * (2u + BS_STREAM_STR_MAX))
typedef struct bs__stream_rec {
  uint32_t id;
  uint8_t state; /* bs_stream_state */
  uint8_t hash;  /* bs_hash */
  uint8_t snapshot_done;
  uint8_t has_checkpoint_lsn, has_resume_lsn, has_no_checkpoint_before;
  /* A clear committed, its records not all deleted yet: every record of the stream but this
   * one is dead (cleared up to op_head, which no write moves before the deletion ends). */
  uint8_t clear_pending;
  uint64_t op_head;            /* highest allocated = highest persisted op id */
  uint64_t checkpoint;         /* 0 = none */
  uint64_t last_checkpoint_op; /* op_head at the last checkpoint (create_empty = 0 rule) */
  uint64_t change_seq;         /* last seq used in `changes` */
  uint64_t param_horizon;      /* parameter reads below it: BS_ESTALE */
  uint64_t param_cursor;       /* parameter compaction progress */
  uint64_t changes_fence;      /* checkpoint_changes from below it: invalidate */
  uint64_t compact_horizon;    /* highest horizon any compaction used */
  uint32_t next_table_id;
  int64_t created_ms;
  bs_val name, checkpoint_lsn, resume_lsn, no_checkpoint_before, last_error;
} bs__stream_rec;
/* The stream record codec (lmdb_codec.c). The encoder writes the value into out and returns its
 * size, 0 when a string is over BS_STREAM_STR_MAX. The decoder borrows the strings from v (never
 * NULL, also when empty); BS_ECORRUPT when v is not one whole record of this version with a
 * known state. */
size_t bs__stream_rec_encode(unsigned char out[BS_STREAM_REC_MAX], const bs__stream_rec *r);
int bs__stream_rec_decode(const MDB_val *v, bs__stream_rec *out);

/* wcp keys: a tag byte, then 'M' (managed record), 'P' (its pending marker, empty value) or 'H'
 * (high-water mark, u64 id) | user id (rest, at most BS_MAX_USER_ID); or 'C' (custom value) |
 * u32be stream | u16be event len | event | user id (rest), the whole key within LMDB's 511. */
enum {
  BS_WCP_MANAGED_TAG = 'M',
  BS_WCP_PENDING_TAG = 'P',
  BS_WCP_HWM_TAG = 'H',
  BS_WCP_CUSTOM_TAG = 'C'
};
#define BS_WCP_USER_KEY_MAX (1u + BS_MAX_USER_ID)
#define BS_WCP_KEY_MAX      (7u + BS_MAX_USER_EVENT)
/* The 'M', 'P' or 'H' key of user (at most BS_MAX_USER_ID bytes: the caller checked). */
MDB_val bs__lmdb_wcp_user_key(unsigned char buf[BS_WCP_USER_KEY_MAX], int tag, bs_val user);
/* The 'C' key of (stream, event, user); BS_ETOOBIG when it would be over BS_WCP_KEY_MAX. */
int bs__lmdb_wcp_custom_key(unsigned char buf[BS_WCP_KEY_MAX], MDB_val *k, uint32_t stream,
                            bs_val event, bs_val user, bs_error *err);
typedef struct bs__wcp_key {
  int tag;
  uint32_t stream; /* 'C' only */
  bs_val event;    /* 'C' only */
  bs_val user;
} bs__wcp_key;
/* Any wcp key (strings borrowed from k); BS_ECORRUPT when it is none of the four. */
int bs__lmdb_wcp_key_decode(const MDB_val *k, bs__wcp_key *out);

/* Managed record ('M'): u64 id | u8 flags | i64 requested_at ms | u8 len, processed-at lsn |
 * u16 n heads, n x (u16 len, connection | u8 len, lsn). */
#define BS_WCP_HAS_REQUESTED 1u
#define BS_WCP_PROCESSED     2u
typedef struct bs__wcp_rec {
  uint64_t id;
  unsigned flags;
  int64_t requested_at;
  bs_val processed_lsn;
  const unsigned char *heads; /* encoded heads (decoded record): bs__lmdb_wcp_head_next */
  size_t heads_size;
  uint32_t n_heads;
} bs__wcp_rec;
/* Size and encoding of r; new_heads (if not NULL) replace r's encoded heads. */
size_t bs__lmdb_wcp_rec_size(const bs__wcp_rec *r, const bs_head *new_heads, size_t n_new);
void bs__lmdb_wcp_rec_encode(unsigned char *out, const bs__wcp_rec *r, const bs_head *new_heads,
                             size_t n_new);
/* Borrows from v; BS_ECORRUPT when v is not one whole record (unknown flags, an LSN or
 * connection over its limit, heads past the end or followed by bytes). */
int bs__lmdb_wcp_rec_decode(const MDB_val *v, bs__wcp_rec *out);
/* The next head of a decoded record (advances *p). */
void bs__lmdb_wcp_head_next(const unsigned char **p, bs_val *conn, bs_val *lsn);
/* 'H' value: u64 id. 'C' value: u64 value [| i64 requested_at ms: a request-derived checkpoint].
 * The encoders return the value's size; a custom requested_at < 0 is none (persistent) and
 * decodes as -1. BS_ECORRUPT when a value has another size. */
size_t bs__lmdb_wcp_hwm_value(unsigned char out[8], uint64_t id);
int bs__lmdb_wcp_hwm_decode(const MDB_val *v, uint64_t *id);
size_t bs__lmdb_wcp_custom_value(unsigned char out[16], uint64_t value, int64_t requested_at);
int bs__lmdb_wcp_custom_decode(const MDB_val *v, uint64_t *value, int64_t *requested_at);

/* Per-bucket state in bstate (fixed 96 bytes little-endian, then the bucket name). */
typedef struct bs__bucket_state {
  uint32_t stream;
  uint32_t checksum;        /* wrapping sum over every persisted op */
  uint64_t count;           /* persisted ops */
  uint64_t bytes;           /* sum of op value sizes */
  uint64_t last_op;         /* highest op id in the bucket */
  uint64_t generation;      /* bumped by every compaction that changed the bucket */
  uint64_t clear_start;     /* span of the leading CLEAR: reads at C in [clear_start, clear_op) */
  uint64_t clear_op;        /*   fail with BS_EINVALIDATED; 0/0 = none */
  uint64_t compacted_count; /* count after the last compaction (selection by change) */
  uint64_t compacted_op;    /* last_op at the last compaction */
  uint64_t reserved[3];
  bs_val name;
} bs__bucket_state;
#define BS_BUCKET_STATE_FIXED 96u
/* The bstate value codec (lmdb_codec.c): the decoder borrows name from v, BS_ECORRUPT when v
 * is not BS_BUCKET_STATE_FIXED bytes plus a name of at most BS_MAX_BUCKET_NAME. */
static inline size_t bs__bucket_state_size(const bs__bucket_state *s) {
  return BS_BUCKET_STATE_FIXED + s->name.size;
}
void bs__bucket_state_encode(unsigned char *out, const bs__bucket_state *s);
int bs__bucket_state_decode(const MDB_val *v, bs__bucket_state *out);

/* The superseded log (lmdb_codec.c): key u64be bucket id | u64be old op id (the ops key layout,
 * so a bucket's entries sort by old op), value u64le new op id: the writer's op new_op replaced
 * old_op of the same row in that bucket. The decoder gives BS_ECORRUPT unless the key is
 * BS_SUP_KEY_SIZE and the value BS_SUP_VALUE_SIZE bytes. */
#define BS_SUP_KEY_SIZE   16u
#define BS_SUP_VALUE_SIZE 8u
void bs__lmdb_sup_key(unsigned char k[BS_SUP_KEY_SIZE], uint64_t bucket, uint64_t old_op);
void bs__lmdb_sup_value(unsigned char v[BS_SUP_VALUE_SIZE], uint64_t new_op);
int bs__lmdb_sup_decode(const MDB_val *k, const MDB_val *v, uint64_t *bucket, uint64_t *old_op,
                        uint64_t *new_op);

/* The environment of one database file in this process, shared by every handle that opens the
 * file (lmdb_env.c "One environment per file"): LMDB forbids two environments on one file in one
 * process. What LMDB keeps per environment lives here; a handle keeps copies of env and the
 * sub-database handles (a dbi belongs to the environment, the same for every handle). */
#define BS_LMDB_NDBS 12u /* sub-databases: the layout table's */
typedef struct bs__lmdb_env bs__lmdb_env;
struct bs__lmdb_env {
  MDB_env *env;
  MDB_dbi dbi[BS_LMDB_NDBS]; /* lmdb_env.c lm_db_names' order */
  unsigned flags;            /* the MDB flags it was opened with */
  pthread_mutex_t grow_mu;   /* serialises map growth */
  /* (a1) every txn of this process holds txn_lock shared; map growth (MDB_MAP_FULL, or
   * MDB_MAP_RESIZED from another process) takes it exclusive: LMDB forbids resizing while a
   * txn of this process is live. */
  pthread_rwlock_t txn_lock;
  size_t map_size;
  int grow_pending; /* (a1) a thread waits to resize the map: new top-level txns hold off */
  /* fd, the environment's own descriptor of the file (read-only in a read-only environment), holds
   * its name lock (lmdb_env.c "One lock file per file") and the writer locks ("Writer locks") for
   * other processes; held lists this process's writer locks (keys 2 * stream + snapshot), under
   * wl_mu. */
  int fd;
  pthread_mutex_t wl_mu;
  uint64_t *held;
  size_t n_held, cap_held;
  /* the registry's (under its mutex) */
  bs__lmdb_env *next;
  dev_t dev;
  ino_t ino;
  unsigned forks; /* bs__forks() at the open: another value means a child after fork() */
  unsigned refs;  /* handles using it */
};

typedef struct bs__lmdb_db bs__lmdb_db;
struct bs__lmdb_db {
  bs_db base;
  bs__lmdb_env *e;
  MDB_env *env; /* e->env */
  MDB_dbi meta, tables, buckets, bstate, ops, source, params, changes, wcp, superseded, cqueue;
  MDB_dbi softdel;    /* soft-deleted source records, see the layout table */
  unsigned env_flags; /* this handle's: e->flags, plus MDB_RDONLY for a read-only handle */
};

typedef struct bs__lmdb_storage {
  bs_storage base;
  bs__lmdb_db *db;
  /* The write-checkpoint mode and event: one value, under wcp_mu (any thread may set it while
   * another reads, storage.h), read with bs__lmdb_wcp_mode. */
  pthread_mutex_t wcp_mu;
  bs_write_checkpoint_mode wcp_mode;
  char wcp_event[256];
  size_t wcp_event_size;
} bs__lmdb_storage;

/* lmdb_file.c: checks path before LMDB maps it; with BS_OK *state says what it found.
 * BS_ECORRUPT with the reason (empty, not LMDB, damaged or truncated meta pages); BS_ENOMEM when
 * a (through a) cannot hold what reading the free list needs. */
enum bs__lmdb_file_state {
  BS_LMDB_FILE_MISSING, /* no such file */
  BS_LMDB_FILE_NO_DATA, /* LMDB's meta pages, an empty main database */
  BS_LMDB_FILE_DATA     /* LMDB with data (whose format record the environment checks) */
};
int bs__lmdb_file_check(const bs_allocator *a, const char *path, enum bs__lmdb_file_state *state,
                        bs_error *err);

/* lmdb_env.c: the bottom the other files sit on (one method-table slot: the writer lock). */
/* A handle on the file at path, with no method table (vt NULL: lmdb.c's constructor sets it);
 * closed with bs__lmdb_db_close, which takes NULL. */
int bs__lmdb_db_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err);
void bs__lmdb_db_close(bs_db *db);

/* lmdb_format.c: brings the file of db, just opened, to this build's format (BS_FORMAT_VERSION)
 * when it is older, unless db is read-only or BS_OPEN_NOMIGRATE (then BS_ECORRUPT saying why);
 * a migration stopped halfway is finished. path: for messages. */
int bs__lmdb_format_open(bs__lmdb_db *db, const char *path, bs_error *err);
/* Test and bench seam of the migrations (NULL: none): a transaction's bounds (0: the defaults,
 * LM_MIGRATE_* in lmdb_format.c), batch(n) before each transaction (0, 1, ...; the last one
 * finds nothing left to do) and record(n) before each record's put (0, 1, ... in this open), so
 * a test can stop the process between any two transactions or inside one. */
typedef struct bs__lmdb_migrate_seam {
  unsigned records;
  size_t bytes;
  void (*batch)(unsigned n);
  void (*record)(uint64_t n);
} bs__lmdb_migrate_seam;
void bs__lmdb_set_migrate_seam(const bs__lmdb_migrate_seam *seam);
/* The name of table id of stream (borrowed from txn: copy it before txn writes), by a walk over
 * the stream's tables entries: a source record of format 3 needs it, and only its key's table id
 * says which. BS_ENOTFOUND (err untouched) when the stream has no such table. */
int bs__lmdb_table_name(const bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, uint32_t id,
                        bs_val *name, bs_error *err);
/* The writer_lock slot (lmdb_env.c "Writer locks"): the lock lives in the environment. */
int bs__lmdb_writer_lock(bs_storage *st, int snapshot, int take, bs_error *err);
/* Maps an LMDB/errno status to BS_* (MDB_MAP_FULL etc. are handled by callers first). */
int bs__fail_mdb(bs_error *err, int mdb_rc, const char *what);
/* Internal status (never returned to the host): an LMDB call hit MDB_MAP_FULL. The unit of work
 * must abort its txn (bs__lmdb_txn_abort), call bs__lmdb_grow() and run again from the start. */
#define BS_LMDB_MAPFULL (-1000)
/* bs__fail_mdb, except MDB_MAP_FULL -> BS_LMDB_MAPFULL */
int bs__lmdb_fail(bs_error *err, int mdb_rc, const char *what);
void bs__lmdb_txn_abort(bs__lmdb_db *db, MDB_txn *txn); /* also ends read txns; NULL ok */
int bs__lmdb_grow(bs__lmdb_db *db, bs_error *err);      /* doubles the map (no txn may be live) */
/* Runs fn in a write txn and commits; on BS_LMDB_MAPFULL grows the map and runs fn again. */
int bs__lmdb_write(bs__lmdb_db *db, int (*fn)(MDB_txn *txn, void *payload, bs_error *err),
                   void *payload, bs_error *err);
/* flags: 0 or MDB_RDONLY. Write txns on a read-only db: BS_ESTATE. End with commit or abort. */
int bs__lmdb_txn_begin(bs__lmdb_db *db, unsigned flags, MDB_txn **out, bs_error *err);
/* Ends txn either way; MDB_MAP_FULL comes back as BS_LMDB_MAPFULL (the caller grows, retries). */
int bs__lmdb_txn_commit(bs__lmdb_db *db, MDB_txn *txn, bs_error *err);
int bs__stream_rec_get(bs__lmdb_db *db, MDB_txn *txn, uint32_t id, bs__stream_rec *out,
                       bs_error *err);
int bs__stream_rec_put(bs__lmdb_db *db, MDB_txn *txn, const bs__stream_rec *rec, bs_error *err);
int bs__bucket_state_put(bs__lmdb_db *db, MDB_txn *txn, uint64_t bucket_id,
                         const bs__bucket_state *s, bs_error *err);
/* mdb_get in dbi, or (cur not NULL) through *cur, opened on first use and kept by the caller for
 * a whole unit of work: on a positioned cursor a key near the last one costs a compare or two
 * where mdb_get descends from the root every time (keys met in order: a snapshot by primary key,
 * fresh keys past the end, buckets in name order). MDB_SET_RANGE plus an equality test: MDB_SET
 * would drop the position on a miss. Returns the LMDB status. */
int bs__lmdb_get(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur, const MDB_val *key, MDB_val *val);
/* bucket name -> id within stream; cur (may be NULL) a cursor on buckets the caller keeps for a
 * whole unit of work (bs__lmdb_get); BS_ENOTFOUND when unknown,
 * quietly (err is not written: readers treat an unknown bucket as empty) */
int bs__lmdb_bucket_id(bs__lmdb_db *db, MDB_txn *txn, MDB_cursor **cur, uint32_t stream,
                       bs_val name, uint64_t *id_out, bs_error *err);

/* The record of the stream after *id (0: the first) in txn, in id order, and its id in *id:
 * 1, or 0 after the last. */
int bs__lmdb_stream_next(bs__lmdb_db *db, MDB_txn *txn, uint32_t *id, bs__stream_rec *rec,
                         bs_error *err);
/* Moves every stream but except from its state s to map[s] (bs__stream_step.others); *last
 * (if not NULL) = the highest stream id, 0 when there is none. */
int bs__lmdb_streams_map(bs__lmdb_db *db, MDB_txn *txn, uint32_t except,
                         const uint8_t map[BS__STREAM_STATES], uint32_t *last, bs_error *err);
/* The sub-databases, i = 0, 1, ...: 0 past the last one, else 1 with its name and handle (dbi
 * may be NULL). */
int bs__lmdb_subdb(const bs__lmdb_db *db, size_t i, const char **name, MDB_dbi *dbi);

/* lmdb_ops.c: the op records, the only code that knows how a bucket's ops lie in `ops` (every
 * other file reads and changes them through these). Whatever the layout, a bucket's records are
 * keyed by u64be bucket id first (a clear deletes them by that prefix). An op handed out is
 * decoded in place: valid until the transaction writes or ends. */
typedef struct bs__lmdb_opc { /* a cursor on one bucket's ops at a time, in a transaction */
  MDB_cursor *cur;
  const bs_allocator *a;
  uint64_t bucket; /* the bucket of the last seek */
  /* the chunk under the cursor, decoded (n 0: none; its value vsize bytes); i the op last handed
   * out. Compaction's changes go into a copy of the chunk (dirty: val is wbuf; dead[k]: op k
   * deleted), written once when the cursor leaves the chunk (bs__lmdb_opc_flush) */
  const unsigned char *val;
  size_t vsize;
  uint32_t n, i;
  int dirty;
  unsigned char *buf, *wbuf; /* the chunk being written; the changed copy */
  size_t cap, wcap;
  uint64_t ids[BS_CHUNK_MAX_OPS];
  uint32_t off[BS_CHUNK_MAX_OPS], len[BS_CHUNK_MAX_OPS];
  unsigned char dead[BS_CHUNK_MAX_OPS];
} bs__lmdb_opc;
int bs__lmdb_opc_open(bs__lmdb_opc *c, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err);
void bs__lmdb_opc_close(bs__lmdb_opc *c); /* also on a zeroed one */
/* *found = 1 with *op the bucket's first op at or above id (seek_ge), its last at or below id
 * (seek_le), exactly id (get), the next or previous one of the bucket of the last seek; else
 * *found = 0. An op that does not decode: BS_ECORRUPT. */
int bs__lmdb_opc_seek_ge(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err);
int bs__lmdb_opc_seek_le(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                         bs_error *err);
int bs__lmdb_opc_get(bs__lmdb_opc *c, uint64_t bucket, uint64_t id, bs_op *op, int *found,
                     bs_error *err);
int bs__lmdb_opc_next(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err);
/* The bytes of the op last handed out in the bucket state's measure (format 5's size, whatever
 * the encoding stored): compaction's deltas. Computed here, not per op handed out, which readers
 * would pay for nothing. */
static inline uint64_t bs__lmdb_opc_bytes(const bs__lmdb_opc *c) {
  /* 0 when no op was handed out (a seek that failed or found none: its caller ignores it) */
  if (c->i >= c->n) return 0;
  return bs__chunk_op_bytes(c->val + c->off[c->i], c->len[c->i], bs__chunk_flags(c->val));
}
int bs__lmdb_opc_prev(bs__lmdb_opc *c, bs_op *op, int *found, bs_error *err);
/* Compaction's changes at the current op: delete it (then next gives the op after it, prev the
 * op before it), or rewrite it as bare (a MOVE or CLEAR of the current op's id). They change the
 * chunk under the cursor in memory; it is written when the cursor leaves it, and then merged with
 * the bucket's chunk before or after it where the two fit the writer's bounds as one.
 * bs__lmdb_opc_flush writes it now: before the transaction commits. */
int bs__lmdb_opc_del(bs__lmdb_opc *c, bs_error *err);
int bs__lmdb_opc_bare(bs__lmdb_opc *c, const bs_op *bare, bs_error *err);
int bs__lmdb_opc_flush(bs__lmdb_opc *c, bs_error *err);
/* Checksum sum and count of the bucket's ops in (from, to]; stop_at_clear: at a CLEAR, *cleared
 * = 1 and the sum so far. */
int bs__lmdb_ops_sum(bs__lmdb_opc *c, uint64_t bucket, uint64_t from, uint64_t to,
                     int stop_at_clear, bs_checksum *out, int *cleared, bs_error *err);
/* Adds the ops of bucket (NULL: of every bucket) to out's counts by type (bs__stat_op). */
int bs__lmdb_ops_stat(const bs__lmdb_db *db, MDB_txn *txn, const uint64_t *bucket, bs_stat *out,
                      bs_error *err);
/* Verify's walk: op(payload, op, bytes of it past the op header) for each op of bucket, bad
 * (payload, bucket, what) for each that does not decode; bs__lmdb_ops_orphans: bad(payload, id,
 * NULL) for each bucket id in [lo, hi) that has ops (bad(payload, 0, what) for a key of none). */
typedef struct bs__lmdb_ops_check {
  void (*op)(void *payload, const bs_op *op, uint64_t payload_bytes);
  void (*bad)(void *payload, uint64_t bucket, const char *what);
  void *payload;
} bs__lmdb_ops_check;
int bs__lmdb_ops_verify(bs__lmdb_opc *c, uint64_t bucket, const bs__lmdb_ops_check *chk,
                        bs_error *err);
int bs__lmdb_ops_orphans(bs__lmdb_opc *c, uint64_t lo, uint64_t hi, const bs__lmdb_ops_check *chk,
                         bs_error *err);
/* The writer's appends of a flush: bs__lmdb_opw_put hands one bucket's new ops (above its last
 * op), next(it) giving them in rising op id order and NULL after the last; buckets in rising id
 * order. */
typedef struct bs__lmdb_opw {
  MDB_cursor *cur;
  const bs_allocator *a;
  unsigned char last[BS_OP_KEY_SIZE]; /* the file's last key when opened */
  int has_last;
  unsigned app;       /* MDB_APPEND once past it */
  unsigned char *buf; /* the chunk being built: size bytes, n ops, first_id .. last_id */
  size_t cap, size;
  uint32_t n;
  uint64_t first_id, last_id;
  /* the encoding of the chunk being built (chunk flags: BS_CHUNK_COMPACT or 0), and of the next
   * one started */
  unsigned f, f_new;
} bs__lmdb_opw;
int bs__lmdb_opw_open(bs__lmdb_opw *w, const bs__lmdb_db *db, MDB_txn *txn, bs_error *err);
int bs__lmdb_opw_put(bs__lmdb_opw *w, uint64_t bucket, const bs_op *(*next)(void *it), void *it,
                     bs_error *err);
void bs__lmdb_opw_close(bs__lmdb_opw *w);
/* The migration from format 4 (lmdb_format.c): regroups the format-4 op records after key (the
 * key of the last chunk it wrote; has_key 0: from the first) into chunks, until max_records or
 * max_bytes were taken, and writes the last chunk's key into key (a chunk the bounds cut is
 * taken up again by the next batch, so the chunks do not depend on the bounds).
 * record(n) (may be NULL) before each record is taken, n counting on from *records. *done when
 * none was left. BS_ECORRUPT (err untouched) for a record that is no format-4 op. */
int bs__lmdb_ops_rechunk(const bs__lmdb_db *db, MDB_txn *txn, unsigned char key[BS_OP_KEY_SIZE],
                         int has_key, size_t max_records, size_t max_bytes,
                         void (*record)(uint64_t n), uint64_t *records, int *done, bs_error *err);
/* The migration from format 5, alike: the format-5 chunks after key are recoded into chunks of
 * format 6's compact op values, regrouped as the writer would fill them (bounds count input
 * chunks). BS_ECORRUPT (err untouched) for a record that is no format-5 chunk. */
int bs__lmdb_ops_recode(const bs__lmdb_db *db, MDB_txn *txn, unsigned char key[BS_OP_KEY_SIZE],
                        int has_key, size_t max_records, size_t max_bytes,
                        void (*record)(uint64_t n), uint64_t *records, int *done, bs_error *err);

/* lmdb_read.c: vtable slots for reads (set into the vtable in lmdb.c) */
int bs__lmdb_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                         const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                         int (*on_chunk)(const bs_chunk *, void *), void *payload, bs_error *err);
int bs__lmdb_checksums(bs_checksum *out, uint64_t *generation_out, bs_storage *st,
                       uint64_t checkpoint, const bs_val *buckets, size_t n, bs_error *err);
int bs__lmdb_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *generation_out,
                             bs_storage *st, uint64_t from, uint64_t to, const bs_val *buckets,
                             size_t n, bs_error *err);
int bs__lmdb_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                bs_error *err);
int bs__lmdb_get_status(bs_status *out, bs_storage *st, bs_error *err);
int bs__lmdb_list_buckets(bs_storage *st, bs_val start_after,
                          int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                          bs_error *err);
int bs__lmdb_stat(bs_stat *out, bs_db *db, bs_error *err);
/* lmdb_verify.c */
int bs__lmdb_verify(uint64_t *problems, bs_db *db, void (*fn)(const char *, void *), void *payload,
                    bs_error *err);

/* lmdb_backup.c: backup, export and load (storage.h). */
int bs__lmdb_backup(bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err);
int bs__lmdb_export(bs_db *db, uint32_t stream, int (*fn)(const bs_record *, void *), void *payload,
                    bs_error *err);
int bs__lmdb_load(const char *path, const bs_backup_options *opts, int (*next)(bs_record *, void *),
                  void *payload, bs_error *err);

/* lmdb_wcp.c: write checkpoints. The two hooks run inside the writer's transaction. */
/* Marks pending managed records whose heads are <= lsn as processed; fn (may be NULL) is called
 * for each user marked (for the checkpoint's change record). */
int bs__lmdb_wcp_mark_processed(bs__lmdb_db *db, MDB_txn *txn, bs_val lsn,
                                int (*fn)(bs_val user, void *payload), void *payload,
                                bs_error *err);
/* Persists one custom write checkpoint (overwrites); requested_at < 0: persistent. */
int bs__lmdb_wcp_put_custom(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, bs_val event,
                            bs_val user, uint64_t value, int64_t requested_at, bs_error *err);
int bs__lmdb_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                       bs_error *err);
int bs__lmdb_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance,
                                              bs_storage *st, const bs_managed_request *req,
                                              size_t n, bs_error *err);
int bs__lmdb_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user_id,
                                   const bs_head *heads, size_t n_heads, bs_error *err);
/* Tests only: from now on (NULL: no more) bs__lmdb_last_write_checkpoint calls hook with st once
 * it took the handle's mode and event, before it reads the file: a test runs another thread's
 * calls there. */
void bs__lmdb_set_wcp_read_hook(void (*hook)(bs_storage *st));
int bs__lmdb_delete_checkpoint_requests_before(uint64_t *deleted, bs_storage *st, int64_t before_ms,
                                               bs_error *err);

/* lmdb_params.c */
int bs__lmdb_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups, size_t n,
                            size_t limit, int (*fn)(const bs_val *, void *), void *payload,
                            bs_error *err);

/* lmdb_write.c: the writer and the lifecycle calls (slots), on lmdb_env.c and lmdb_wcp.c. */
int bs__lmdb_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *o,
                         bs_error *err);
int bs__lmdb_clear(bs_storage *st, bs_error *err);
int bs__lmdb_terminate(bs_storage *st, int clear, bs_error *err);
int bs__lmdb_report_error(bs_storage *st, const char *message, bs_error *err);
/* A clear's deletion (its row and fence committed first): finishes that of stream (nothing when
 * none is pending), or that of every stream whose clear a stopped process left (a read-write
 * open), in bounded transactions. */
int bs__lmdb_clear_finish(bs__lmdb_db *db, uint32_t stream, bs_error *err);
int bs__lmdb_clear_pending(bs__lmdb_db *db, bs_error *err);
/* Test and bench seam of a clear's deletion (NULL: none): a transaction's bound (0: the default,
 * LM_CLEAR_RECORDS), batch(n) before each of its transactions (0, 1, ...; the last finds nothing
 * left and clears the fence); a batch that returns a BS_E* code stops the deletion with it. */
typedef struct bs__lmdb_clear_seam {
  unsigned records;
  int (*batch)(unsigned n);
} bs__lmdb_clear_seam;
void bs__lmdb_set_clear_seam(const bs__lmdb_clear_seam *seam);
/* Defragmentation (lmdb_compact.c), through the writer's path. A live PUT to re-emit:
 * the bucket, its op id, and the key of the source record whose membership holds that op. */
typedef struct bs__lmdb_reemit_row {
  uint64_t bucket, old_op;
  const unsigned char *src_key; /* u32be stream | u32be table id | replica id */
  size_t src_key_size;
} bs__lmdb_reemit_row;
/* Inside txn: re-emits each row whose source record still has that membership at old_op (a new
 * PUT with a new op id, the same payload and checksum; the membership moves to it; (old -> new)
 * is logged to `superseded`; one change record), as the writer would. *emitted_out = how many. */
int bs__lmdb_reemit(bs__lmdb_db *db, MDB_txn *txn, uint32_t stream, const bs__lmdb_reemit_row *rows,
                    size_t n, uint64_t *emitted_out, bs_error *err);

/* lmdb_compact.c */
int bs__lmdb_compact(bs_compact_stats *stats, bs_storage *st, const bs_compact_options *opts,
                     bs_error *err);
int bs__lmdb_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                         uint64_t min_bucket_changes, bs_error *err);

#endif /* BUCKETSTORE_LMDB_INTERNAL_H */
