/*
 * raw.h: today's LMDB layout as bench_raw.c writes it (the baseline's records, its byte order
 * helpers and its running bucket state), shared with proto_layout.c, whose prototypes write the
 * same ops, source records and bucket states in other layouts.
 */
#ifndef BSBENCH_RAW_H
#define BSBENCH_RAW_H

#include <lmdb.h>

#include "bench.h"

#define STREAM   1u
#define TID      1u
#define HDR      18u
#define SREC_MAX 96u /* a source record of the benchmark: one membership or one lookup key */

typedef struct rdb {
  MDB_env *env;
  MDB_dbi meta, buckets, bstate, ops, source, params, sup, changes;
  char path[600];
} rdb;

typedef struct racc { /* per-bucket running state, written once per transaction */
  uint32_t checksum;
  uint64_t count, bytes, last_op;
  int touched, exists;
} racc;
#define OP_MAX (HDR + 64 + 65536) /* the largest op value of the benchmark */

static inline void be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}
static inline void be64(unsigned char *p, uint64_t v) {
  be32(p, (uint32_t)(v >> 32));
  be32(p + 4, (uint32_t)v);
}
static inline uint32_t gbe32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t gbe64(const unsigned char *p) {
  return (uint64_t)gbe32(p) << 32 | gbe32(p + 4);
}
static inline void le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint64_t gle64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static inline void le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t gle32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int mfail(bres *r, int mrc, const char *what);
int r_open(rdb *d, const char *name, int nosync, int create, bres *r);
void r_close(rdb *d);
double r_ops(rdb *d);
void opkey(unsigned char k[16], uint64_t bucket_id, uint64_t op);
size_t op_make(unsigned char *v, racc *acc, unsigned b, uint64_t op, int type, uint64_t row,
               uint64_t version, size_t dsize);
int put_src(rdb *d, MDB_txn *txn, uint64_t row, unsigned b, uint64_t op);
int r_finish(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, uint64_t first, uint64_t head,
             uint64_t *seq);
int r_put_sources(rdb *d, MDB_txn *txn, unsigned nb, uint64_t s, uint64_t e, uint64_t op_base,
                  int skip_existing);
int r_insert_batch(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, uint64_t s, uint64_t e,
                   uint64_t version, uint64_t op_base, int skip_existing, size_t dsize);
void set_lat(bres *r, double *lat, size_t n);
uint64_t r_bucket_id(rdb *d, MDB_txn *txn, unsigned b);
void r_checksum(rdb *d, MDB_txn *txn, MDB_cursor *cur, unsigned b, uint64_t cp, uint32_t *ck,
                uint64_t *count);

#endif
