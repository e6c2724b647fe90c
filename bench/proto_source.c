/*
 * proto_source.c (bsbench --proto-source): source-record layouts measured on their own, beside
 * the baseline the raw LMDB workload wrote before LMDB format 3 (format 2's records). The
 * snapshot ingest's source side (row i in bucket i % N with op id i + 1, an existence check per
 * row, a durable commit per --commit rows) written straight with LMDB into a file holding only
 * the source tree, its records in one of four layouts:
 *   f2:    format 2's value (flags, varint counts, type code 6 and "todos", id code 0) under
 *          today's key, u32be stream | u32be table id | replica id (17 bytes): the baseline;
 *   f3:    format 3's value (the library's codec: counts in the head byte, the first type the
 *          table's name, the id the replica id: 6-7 bytes) under the same key: LMDB format 3;
 *   f3+k1: f3's value, the table id in the key as one byte (an order-keeping varint: 14 bytes);
 *   f3+k0: f3's value, stream and table as one byte, a database-wide table id (10 bytes).
 * Every layout's records are read back and checked: each decodes to its row's bucket and op
 * (f2's through the migration's conversion, which must give f3's bytes).
 */
#include "bench.h"
#include "lmdb_internal.h"
#include "raw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { F2, F3, F3K1, F3K0, NSRC };
static const char *const names[NSRC] = {"f2 (baseline)", "f3 (format 3)", "f3+k1", "f3+k0"};
static const bs_val table = {TABLE, sizeof TABLE - 1};

typedef struct sstat {
  double rows_s, tree, file;
  int failed;
} sstat;

static size_t key_of(int L, unsigned char *k, uint64_t row) {
  char rid[RID_LEN + 1];
  size_t n = L == F3K0 ? 1 : L == F3K1 ? 5 : 8;
  gen_rid(rid, row);
  if (L == F3K0) k[0] = 1; /* stream 1's table 1, as a database-wide id */
  if (L == F3K1) be32(k, STREAM), k[4] = TID;
  if (L <= F3) be32(k, STREAM), be32(k + 4, TID);
  memcpy(k + n, rid, RID_LEN);
  return n + RID_LEN;
}

/* Format 3's value of the row (the library's codec). */
static size_t f3_value(unsigned char *v, uint64_t bucket, uint64_t op, bs_val rid) {
  bs__member m = {bucket, op, table, rid};
  bs__srec r = {.exists = 1, .m = &m, .nm = 1};
  bs__lmdb_srec_encode(v, &r, table, rid);
  return bs__lmdb_srec_size(&r, table, rid);
}

/* Format 2's value of the row (docs/format.md 4.4 before format 3). */
static size_t f2_value(unsigned char *v, uint64_t bucket, uint64_t op) {
  unsigned char *p = v;
  uint64_t f[2] = {bucket, op};
  *p++ = 0, *p++ = 1, *p++ = 0; /* flags, 1 member, no lookups */
  for (int i = 0; i < 2; i++) {
    uint64_t x = f[i];
    while (x >= 0x80) *p++ = (unsigned char)(x | 0x80), x >>= 7;
    *p++ = (unsigned char)x;
  }
  *p++ = OBJ_TYPE_LEN + 1, *p++ = 0; /* type code, id code 0: the replica id */
  memcpy(p, OBJ_TYPE, OBJ_TYPE_LEN);
  return (size_t)(p - v) + OBJ_TYPE_LEN;
}

static double tree_bytes(MDB_txn *txn, MDB_dbi dbi) {
  MDB_stat st;
  if (mdb_stat(txn, dbi, &st)) return -1;
  return (double)(st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) * st.ms_psize;
}

/* Reads every record back: each must decode to its row's bucket and op. */
static int check(rdb *d, int L, unsigned nb) {
  MDB_txn *txn;
  int bad = 0;
  if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return 1;
  for (uint64_t i = 0; i < g_cfg->rows && !bad; i++) {
    unsigned char k[8 + RID_LEN], conv[64];
    MDB_val key = {key_of(L, k, i), k}, val;
    bs_val rid = {k + key.mv_size - RID_LEN, RID_LEN};
    bs__member m;
    bs__srec r;
    size_t n;
    if (mdb_get(txn, d->source, &key, &val)) {
      bad = 1;
      break;
    }
    if (L == F2) { /* through the migration's conversion */
      if (bs__lmdb_srec2_convert(&key, &val, table, conv, &n)) {
        bad = 1;
        break;
      }
      val = (MDB_val){n, conv};
    }
    bad = bs__lmdb_srec_head(&val, &r) || r.nm != 1 ||
          bs__lmdb_srec_decode(&val, table, rid, &r, &m, NULL) || m.bucket != i % nb + 1 ||
          m.op != i + 1 || !bs__val_eq(m.object_type, table) || !bs__val_eq(m.object_id, rid);
  }
  mdb_txn_abort(txn);
  return bad;
}

static void run(int L, unsigned nb, sstat *out) {
  const bench_cfg *c = g_cfg;
  bres *res = res_new("proto-source", names[L], "lmdb");
  char name[32];
  struct stat sb;
  MDB_txn *txn = NULL;
  rdb d;
  double t0;
  int mrc = 0;
  memset(out, 0, sizeof *out);
  snprintf(name, sizeof name, "src%d.raw", L);
  if (r_open(&d, name, 0, 1, res)) {
    out->failed = 1;
    return;
  }
  t0 = now_s();
  for (uint64_t s = 0; s < c->rows && !mrc; s += c->commit_rows) {
    uint64_t e = s + c->commit_rows < c->rows ? s + c->commit_rows : c->rows;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) break;
    for (uint64_t i = s; i < e && !mrc; i++) {
      unsigned char k[8 + RID_LEN], v[SREC_MAX];
      MDB_val key = {key_of(L, k, i), k}, val = {0, v};
      bs_val rid = {k + key.mv_size - RID_LEN, RID_LEN};
      if (mdb_get(txn, d.source, &key, &val) == 0) continue; /* the snapshot's existence check */
      val.mv_data = v;
      val.mv_size = L == F2 ? f2_value(v, i % nb + 1, i + 1) : f3_value(v, i % nb + 1, i + 1, rid);
      mrc = mdb_put(txn, d.source, &key, &val, 0);
    }
    if (!mrc)
      mrc = mdb_txn_commit(txn);
    else
      mdb_txn_abort(txn);
    txn = NULL;
  }
  out->rows_s = (double)c->rows / (now_s() - t0);
  if (!mrc && !(mrc = mdb_txn_begin(d.env, NULL, MDB_RDONLY, &txn))) {
    out->tree = tree_bytes(txn, d.source) / (double)c->rows;
    mdb_txn_abort(txn);
  }
  out->file = stat(d.path, &sb) == 0 ? (double)sb.st_size / (double)c->rows : -1;
  if (mrc) mfail(res, mrc, "ingest");
  out->failed = mrc != 0 || check(&d, L, nb);
  if (!mrc && out->failed)
    fprintf(stderr, "bsbench --proto-source: %s: a record does not decode\n", names[L]);
  r_close(&d);
}

int proto_source(void) {
  unsigned sizes[2] = {g_cfg->buckets_small, g_cfg->buckets_large};
  int bad = 0;
  printf("source-record layouts: the snapshot's source side alone, %llu rows, a durable commit per "
         "%llu\n",
         (unsigned long long)g_cfg->rows, (unsigned long long)g_cfg->commit_rows);
  for (int s = 0; s < 2; s++) {
    sstat st[NSRC];
    printf("\n%u buckets\n%-16s %12s %8s %12s %12s\n", sizes[s], "layout", "rows/s", "ratio",
           "tree B/row", "file B/row");
    for (int L = 0; L < NSRC; L++) {
      run(L, sizes[s], &st[L]);
      bad += st[L].failed;
      printf("%-16s %12.0f %7.2fx %12.1f %12.1f%s\n", names[L], st[L].rows_s,
             st[L].rows_s > 0 ? st[0].rows_s / st[L].rows_s : 0, st[L].tree, st[L].file,
             st[L].failed ? "  FAILED" : "");
    }
  }
  printf("\nratio = f2's rate / the layout's (below 1.00x: faster than the baseline); tree = the "
         "source tree's pages (mdb_stat) per row; file = the file's size per row\n");
  return bad;
}
