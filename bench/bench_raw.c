/*
 * bench_raw.c: the baseline. Each workload's bytes written and read straight with LMDB: the
 * same keys (bucket id | op id, stream | table | replica id, ...), the same value sizes (op
 * header + object type/id + subkey + data, source records with one membership, bucket states,
 * one change record per transaction), the same commit cadence and sync mode. It computes the
 * same op checksums and subkeys (public functions of the library) since any store of this
 * protocol must. What it leaves out is the library's own work: the write queue, the source
 * record merge logic, argument checks, the checksum cache.
 */
#include "bench.h"
#include "lmdb_internal.h" /* the library's source record codec (format 3): the same bytes */
#include "raw.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

int mfail(bres *r, int mrc, const char *what) {
  r->status = BR_FAILED;
  snprintf(r->note, sizeof r->note, "%s: %s", what, mdb_strerror(mrc));
  return -1;
}

void r_close(rdb *d) {
  if (d->env) mdb_env_close(d->env);
  d->env = NULL;
}

int r_open(rdb *d, const char *name, int nosync, int create, bres *r) {
  MDB_txn *txn;
  int mrc;
  memset(d, 0, sizeof *d);
  bench_path(d->path, sizeof d->path, name);
  if (create) unlink(d->path);
  if ((mrc = mdb_env_create(&d->env)) || (mrc = mdb_env_set_maxdbs(d->env, 16)) ||
      (mrc = mdb_env_set_mapsize(d->env, (g_cfg->map_mb ? (size_t)g_cfg->map_mb : 65536) << 20)) ||
      (mrc = mdb_env_open(d->env, d->path, MDB_NOSUBDIR | MDB_NOTLS | (nosync ? MDB_NOSYNC : 0),
                          0644)))
    return mfail(r, mrc, "mdb_env_open");
  if ((mrc = mdb_txn_begin(d->env, NULL, 0, &txn))) return mfail(r, mrc, "mdb_txn_begin");
  if ((mrc = mdb_dbi_open(txn, "meta", MDB_CREATE, &d->meta)) ||
      (mrc = mdb_dbi_open(txn, "buckets", MDB_CREATE, &d->buckets)) ||
      (mrc = mdb_dbi_open(txn, "bstate", MDB_CREATE, &d->bstate)) ||
      (mrc = mdb_dbi_open(txn, "ops", MDB_CREATE, &d->ops)) ||
      (mrc = mdb_dbi_open(txn, "source", MDB_CREATE, &d->source)) ||
      (mrc = mdb_dbi_open(txn, "params", MDB_CREATE, &d->params)) ||
      (mrc = mdb_dbi_open(txn, "superseded", MDB_CREATE, &d->sup)) ||
      (mrc = mdb_dbi_open(txn, "changes", MDB_CREATE, &d->changes)) || (mrc = mdb_txn_commit(txn)))
    return mfail(r, mrc, "mdb_dbi_open");
  return 0;
}

static uint64_t r_head(rdb *d, MDB_txn *txn) {
  MDB_val k = {4, "head"}, v;
  return mdb_get(txn, d->meta, &k, &v) == 0 && v.mv_size == 8 ? gle64(v.mv_data) : 0;
}

static int r_set_head(rdb *d, MDB_txn *txn, uint64_t head) {
  unsigned char b[8];
  MDB_val k = {4, "head"}, v = {8, b};
  le64(b, head);
  return mdb_put(txn, d->meta, &k, &v, 0);
}

double r_ops(rdb *d) {
  MDB_txn *txn;
  MDB_stat st;
  if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return -1;
  mdb_stat(txn, d->ops, &st);
  mdb_txn_abort(txn);
  return (double)st.ms_entries;
}

void opkey(unsigned char k[16], uint64_t bucket_id, uint64_t op) {
  be64(k, bucket_id);
  be64(k + 8, op);
}

/* An op value exactly as the library lays it out. */
static size_t opval(unsigned char *p, int type, uint32_t ck, uint64_t target, const char *rid,
                    const char *sk, const char *data, size_t dlen) {
  p[0] = (unsigned char)type;
  le32(p + 1, ck);
  le64(p + 5, target);
  p[13] = OBJ_TYPE_LEN;
  p[14] = 0;
  p[15] = RID_LEN;
  p[16] = 0;
  p[17] = BS_SUBKEY_SIZE;
  memcpy(p + HDR, OBJ_TYPE, OBJ_TYPE_LEN);
  memcpy(p + HDR + OBJ_TYPE_LEN, rid, RID_LEN);
  memcpy(p + HDR + OBJ_TYPE_LEN + RID_LEN, sk, BS_SUBKEY_SIZE);
  if (dlen) memcpy(p + HDR + OBJ_TYPE_LEN + RID_LEN + BS_SUBKEY_SIZE, data, dlen);
  return HDR + OBJ_TYPE_LEN + RID_LEN + BS_SUBKEY_SIZE + dlen;
}

/* Op `op` of bucket b (row, version) built into v, today's op value; the bucket's running state
 * counts it. Returns the value's size. */
size_t op_make(unsigned char *v, racc *acc, unsigned b, uint64_t op, int type, uint64_t row,
               uint64_t version, size_t dsize) {
  char rid[RID_LEN + 1], sk[BS_SUBKEY_SIZE], data[65536];
  bs_val ot = {OBJ_TYPE, OBJ_TYPE_LEN}, oi, dv, skv = {sk, BS_SUBKEY_SIZE};
  uint32_t ck;
  size_t n;
  gen_rid(rid, row);
  oi.data = rid;
  oi.size = RID_LEN;
  bs_subkey(sk, TID, oi);
  if (type == BS_OP_PUT) {
    gen_data(data, row, version, dsize);
    dv.data = data;
    dv.size = dsize;
    ck = bs_checksum_put(BS_HASH_XXH3, ot, oi, dv);
  } else {
    dsize = 0;
    ck = bs_checksum_remove(BS_HASH_XXH3, skv);
  }
  n = opval(v, type, ck, 0, rid, sk, data, dsize);
  acc[b].checksum += ck;
  acc[b].count++;
  acc[b].bytes += n;
  acc[b].last_op = op;
  acc[b].touched = 1;
  return n;
}

static int put_op(rdb *d, MDB_txn *txn, racc *acc, unsigned b, uint64_t op, int type, uint64_t row,
                  uint64_t version, size_t dsize) {
  unsigned char k[16], v[OP_MAX];
  MDB_val key = {16, k}, val = {0, v};
  opkey(k, b + 1, op);
  val.mv_size = op_make(v, acc, b, op, type, row, version, dsize);
  return mdb_put(txn, d->ops, &key, &val, 0);
}

static const bs_val raw_table = {TABLE, sizeof TABLE - 1}; /* table id TID's name */

static void srckey(unsigned char *k, uint64_t row) {
  char rid[RID_LEN + 1];
  be32(k, STREAM);
  be32(k + 4, TID);
  gen_rid(rid, row);
  memcpy(k + 8, rid, RID_LEN);
}

/* The source record of row (one membership: bucket b, op, object id = the replica id), in the
 * library's current format, encoded by the library's own codec. */
int put_src(rdb *d, MDB_txn *txn, uint64_t row, unsigned b, uint64_t op) {
  unsigned char k[8 + RID_LEN], v[SREC_MAX];
  bs__member m = {b + 1, op, {OBJ_TYPE, OBJ_TYPE_LEN}, {NULL, RID_LEN}};
  bs__srec rec = {.exists = 1, .m = &m, .nm = 1};
  MDB_val key = {sizeof k, k}, val = {0, v};
  srckey(k, row);
  m.object_id.data = k + 8; /* object id = replica id */
  val.mv_size = bs__lmdb_srec_size(&rec, raw_table, m.object_id);
  bs__lmdb_srec_encode(v, &rec, raw_table, m.object_id);
  return mdb_put(txn, d->source, &key, &val, 0);
}

/* The source record's membership: bucket index and op id; 0 when the row is unknown. */
static int get_src(rdb *d, MDB_txn *txn, uint64_t row, unsigned *b, uint64_t *op) {
  unsigned char k[8 + RID_LEN];
  MDB_val key = {sizeof k, k}, val;
  bs_val rid = {k + 8, RID_LEN};
  bs__srec rec;
  bs__member m;
  srckey(k, row);
  if (mdb_get(txn, d->source, &key, &val) || bs__lmdb_srec_head(&val, &rec) || rec.nm != 1 ||
      rec.nl || bs__lmdb_srec_decode(&val, raw_table, rid, &rec, &m, NULL))
    return 0;
  *b = (unsigned)(m.bucket - 1);
  *op = m.op;
  return 1;
}

static int put_sup(rdb *d, MDB_txn *txn, unsigned b, uint64_t old_op, uint64_t new_op) {
  unsigned char k[16], v[8];
  MDB_val key = {16, k}, val = {8, v};
  opkey(k, b + 1, old_op);
  le64(v, new_op);
  return mdb_put(txn, d->sup, &key, &val, 0);
}

/* Writes the touched buckets' states (and names of new buckets), one change record, the head. */
int r_finish(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, uint64_t first, uint64_t head,
             uint64_t *seq) {
  unsigned char v[96 + 64], ck[20], cv[8192];
  size_t cn = 21;
  uint32_t nnames = 0;
  int mrc;
  for (unsigned b = 0; b < nb; b++) {
    char name[64];
    size_t len;
    MDB_val key, val;
    unsigned char k[8], nk[4 + 64];
    if (!acc[b].touched) continue;
    gen_bucket(name, sizeof name, &len, b);
    if (!acc[b].exists) {
      unsigned char id[8];
      MDB_val ikey = {4 + len, nk}, ival = {8, id};
      be32(nk, STREAM);
      memcpy(nk + 4, name, len);
      le64(id, b + 1);
      if ((mrc = mdb_put(txn, d->buckets, &ikey, &ival, 0))) return mrc;
      acc[b].exists = 1;
    }
    memset(v, 0, 96);
    le32(v, STREAM);
    le32(v + 4, acc[b].checksum);
    le64(v + 8, acc[b].count);
    le64(v + 16, acc[b].bytes);
    le64(v + 24, acc[b].last_op);
    memcpy(v + 96, name, len);
    be64(k, b + 1);
    key.mv_size = 8;
    key.mv_data = k;
    val.mv_size = 96 + len;
    val.mv_data = v;
    if ((mrc = mdb_put(txn, d->bstate, &key, &val, 0))) return mrc;
    if (cn + 2 + len + 8 < sizeof cv) {
      cv[cn] = (unsigned char)len;
      cv[cn + 1] = 0;
      memcpy(cv + cn + 2, name, len);
      cn += 2 + len;
      nnames++;
    }
    acc[b].touched = 0;
  }
  {
    MDB_val key = {20, ck}, val = {cn + 8, cv};
    memset(cv, 0, 21);
    le64(cv, first);
    le32(cv + 17, nnames); /* u64 first | u64 time | u8 flags | u32 n, then the n names */
    be32(ck, STREAM);
    be64(ck + 4, head);
    be64(ck + 12, ++*seq);
    if ((mrc = mdb_put(txn, d->changes, &key, &val, 0))) return mrc;
  }
  return r_set_head(d, txn, head);
}

/* Loads the running bucket states (nb buckets) of an existing store. */
static int r_load(rdb *d, racc *acc, unsigned nb, uint64_t *head) {
  MDB_txn *txn;
  int mrc;
  if ((mrc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn))) return mrc;
  for (unsigned b = 0; b < nb; b++) {
    unsigned char k[8];
    MDB_val key = {8, k}, val;
    be64(k, b + 1);
    memset(&acc[b], 0, sizeof acc[b]);
    if (mdb_get(txn, d->bstate, &key, &val) == 0 && val.mv_size >= 96) {
      const unsigned char *p = val.mv_data;
      acc[b].checksum = gle32(p + 4);
      acc[b].count = gle64(p + 8);
      acc[b].bytes = gle64(p + 16);
      acc[b].last_op = gle64(p + 24);
      acc[b].exists = 1;
    }
  }
  *head = r_head(d, txn);
  mdb_txn_abort(txn);
  return 0;
}

void set_lat(bres *r, double *lat, size_t n) {
  r->p50_us = pct(lat, n, 0.50) * 1e6;
  r->p99_us = pct(lat, n, 0.99) * 1e6;
}

static void hist_push(uint64_t cp) {
  g_sh->hist_raw[g_sh->nhist_raw % 256] = cp;
  g_sh->nhist_raw++;
}

/* ---- W1 ---- */
/* The source records of rows [s, e); skip_existing = the snapshot writer's existence check. */
int r_put_sources(rdb *d, MDB_txn *txn, unsigned nb, uint64_t s, uint64_t e, uint64_t op_base,
                  int skip_existing) {
  int mrc;
  for (uint64_t i = s; i < e; i++) {
    unsigned char k[8 + RID_LEN];
    MDB_val key = {sizeof k, k}, val;
    if (skip_existing) {
      srckey(k, i);
      if (mdb_get(txn, d->source, &key, &val) == 0) continue;
    }
    if ((mrc = put_src(d, txn, i, (unsigned)(i % nb), op_base + i + 1))) return mrc;
  }
  return 0;
}

/* Rows [s, e) into buckets i % nb, op id i + 1, ops written bucket by bucket like the library's
 * flush. */
int r_insert_batch(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, uint64_t s, uint64_t e,
                   uint64_t version, uint64_t op_base, int skip_existing, size_t dsize) {
  int mrc = r_put_sources(d, txn, nb, s, e, op_base, skip_existing);
  for (unsigned b = 0; b < nb && !mrc; b++) {
    uint64_t i = s + (b + nb - s % nb) % nb;
    for (; i < e && !mrc; i += nb)
      mrc = put_op(d, txn, acc, b, op_base + i + 1, BS_OP_PUT, i, version, dsize);
  }
  return mrc;
}

int raw_ingest(int mode) {
  const bench_cfg *c = g_cfg;
  int large = mode == 1, nosync = mode == 2;
  unsigned nb = large ? c->buckets_large : c->buckets_small;
  uint64_t n = c->rows, every = c->commit_rows, seq = 0;
  racc *acc = calloc(nb, sizeof *acc);
  double *lat = calloc(n / every + 2, sizeof *lat), t0;
  size_t nl = 0;
  char name[72];
  bres *r;
  rdb d;
  int mrc;

  snprintf(name, sizeof name, "snapshot %lluk rows -> %u buckets%s", (unsigned long long)n / 1000,
           nb, nosync ? ", nosync" : "");
  r = res_new("ingest", name, "lmdb");
  snprintf(r->unit, sizeof r->unit, "rows/s");
  if (r_open(&d, large ? "s10k.raw" : nosync ? "s100ns.raw" : "s100.raw", nosync, 1, r)) goto out;
  mem_sampler_start();
  t0 = now_s();
  for (uint64_t s = 0; s < n; s += every) {
    uint64_t e = s + every < n ? s + every : n;
    double tc = now_s();
    MDB_txn *txn;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) {
      mfail(r, mrc, "begin");
      goto out;
    }
    if ((mrc = r_insert_batch(&d, txn, acc, nb, s, e, 0, 0, 1, c->data_size)) ||
        (mrc = r_finish(&d, txn, acc, nb, s + 1, e, &seq)) || (mrc = mdb_txn_commit(txn))) {
      mfail(r, mrc, "ingest txn");
      goto out;
    }
    lat[nl++] = now_s() - tc;
  }
  r->secs = now_s() - t0;
  mem_sampler_stop();
  r->count = (double)n;
  r->value = (double)n / r->secs;
  r->mbps = (double)n * (double)c->data_size / r->secs / 1e6;
  set_lat(r, lat, nl);
  res_mem(r);
  r->bytes_per_op = file_bytes(d.path) / r_ops(&d);
  snprintf(r->note, sizeof r->note,
           "ops + source records + bucket states + change record, "
           "one %s txn per %llu rows",
           nosync ? "nosync" : "durable", (unsigned long long)every);
  if (mode == 0) {
    for (uint64_t i = 0; i < n; i++) g_state_raw[i] = (int32_t)(i % nb);
    g_sh->nhist_raw = 0;
    g_sh->change_seq_raw = 0;
    hist_push(n);
    g_sh->built[ST_S100] |= 2;
  }
out:
  r_close(&d);
  free(acc);
  free(lat);
  return r->status == BR_FAILED;
}

/* ---- W2 ---- */
typedef struct rstream {
  rdb *d;
  racc *acc;
  uint64_t head, seq;
} rstream;

/* One transaction of `count` changes. */
static int r_change_txn(rstream *s, uint64_t count, bres *r) {
  const bench_cfg *c = g_cfg;
  MDB_txn *txn;
  uint64_t first = s->head + 1;
  int mrc;
  if ((mrc = mdb_txn_begin(s->d->env, NULL, 0, &txn))) return mfail(r, mrc, "begin");
  for (uint64_t k = 0; k < count; k++) {
    change ch;
    uint64_t kseq = g_sh->change_seq_raw++, op_old = 0;
    unsigned ob = 0;
    int had;
    gen_change(&ch, kseq, g_state_raw, c->rows, c->buckets_small);
    had = get_src(s->d, txn, ch.row, &ob, &op_old);
    mrc = 0;
    if (ch.kind != CH_DELETE) {
      uint64_t op = ++s->head;
      mrc = put_op(s->d, txn, s->acc, (unsigned)ch.new_bucket, op, BS_OP_PUT, ch.row, kseq + 1,
                   c->data_size);
      if (!mrc && had && ob == (unsigned)ch.new_bucket) mrc = put_sup(s->d, txn, ob, op_old, op);
      if (!mrc && had && ob != (unsigned)ch.new_bucket) {
        uint64_t rm = ++s->head;
        mrc = put_op(s->d, txn, s->acc, ob, rm, BS_OP_REMOVE, ch.row, 0, 0);
        if (!mrc) mrc = put_sup(s->d, txn, ob, op_old, rm);
      }
      if (!mrc) mrc = put_src(s->d, txn, ch.row, (unsigned)ch.new_bucket, op);
    } else if (had) {
      unsigned char sk[8 + RID_LEN];
      MDB_val key = {sizeof sk, sk};
      uint64_t rm = ++s->head;
      mrc = put_op(s->d, txn, s->acc, ob, rm, BS_OP_REMOVE, ch.row, 0, 0);
      if (!mrc) mrc = put_sup(s->d, txn, ob, op_old, rm);
      srckey(sk, ch.row);
      if (!mrc) mrc = mdb_del(txn, s->d->source, &key, NULL);
    }
    if (mrc) {
      mdb_txn_abort(txn);
      return mfail(r, mrc, "change");
    }
  }
  if ((mrc = r_finish(s->d, txn, s->acc, c->buckets_small, first, s->head, &s->seq)) ||
      (mrc = mdb_txn_commit(txn)))
    return mfail(r, mrc, "commit");
  hist_push(s->head);
  return 0;
}

int raw_stream(int nosync, int report) {
  const bench_cfg *c = g_cfg;
  uint64_t m = c->updates, every = c->commit_changes;
  racc *acc = calloc(c->buckets_small, sizeof *acc);
  double *lat = calloc(m / every + 2, sizeof *lat), t0;
  size_t nl = 0;
  char name[72];
  bres *r;
  rdb d;
  rstream s;

  snprintf(name, sizeof name, "%llu changes/commit, %s", (unsigned long long)every,
           nosync ? "nosync" : "durable");
  r = res_new("stream", name, "lmdb");
  snprintf(r->unit, sizeof r->unit, "chg/s");
  if (r_open(&d, "s100.raw", nosync, 0, r)) goto out;
  s.d = &d;
  s.acc = acc;
  s.seq = 1u << 30;
  r_load(&d, acc, c->buckets_small, &s.head);
  mem_sampler_start();
  t0 = now_s();
  for (uint64_t k = 0; k < m; k += every) {
    double tc = now_s();
    if (r_change_txn(&s, k + every < m ? every : m - k, r)) goto out;
    lat[nl++] = now_s() - tc;
  }
  r->secs = now_s() - t0;
  mem_sampler_stop();
  r->count = (double)m;
  r->value = (double)m / r->secs;
  set_lat(r, lat, nl);
  res_mem(r);
  r->bytes_per_op = file_bytes(d.path) / r_ops(&d);
  snprintf(r->note, sizeof r->note,
           "source get/put, PUT/REMOVE ops, superseded log; latency = "
           "whole txn (puts + commit)");
  g_sh->built[ST_STREAMED] |= 2;
  (void)report;
out:
  r_close(&d);
  free(acc);
  free(lat);
  return r->status == BR_FAILED;
}

/* ---- W3 ---- */
typedef struct rdl {
  uint64_t ops, bytes;
} rdl;

uint64_t r_bucket_id(rdb *d, MDB_txn *txn, unsigned b) {
  unsigned char k[4 + 64];
  char name[64];
  size_t len;
  MDB_val key, val;
  gen_bucket(name, sizeof name, &len, b);
  be32(k, STREAM);
  memcpy(k + 4, name, len);
  key.mv_size = 4 + len;
  key.mv_data = k;
  if (mdb_get(txn, d->buckets, &key, &val) || val.mv_size != 8) return 0;
  return gle64(val.mv_data);
}

/* Reads ops (after, cp] of bucket b, at most limit; returns the last op id read (0: none). */
static uint64_t r_scan(rdb *d, MDB_txn *txn, uint64_t id, uint64_t after, uint64_t cp,
                       uint64_t limit, rdl *out) {
  MDB_cursor *cur;
  unsigned char k[16];
  MDB_val key = {16, k}, val;
  uint64_t n = 0, last = 0;
  int mrc;
  opkey(k, id, after + 1);
  if (mdb_cursor_open(txn, d->ops, &cur)) return 0;
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && n < limit;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const unsigned char *p = val.mv_data, *kp = key.mv_data;
    uint64_t op;
    size_t fixed;
    if (key.mv_size != 16 || gbe64(kp) != id || (op = gbe64(kp + 8)) > cp) break;
    fixed = HDR + (size_t)(p[13] | p[14] << 8) + (size_t)(p[15] | p[16] << 8) + p[17];
    out->bytes += val.mv_size - HDR;
    (void)fixed;
    last = op;
    n++;
  }
  out->ops += n;
  mdb_cursor_close(cur);
  return n == limit ? last : 0;
}

static int r_download(rdb *d, uint64_t cp, unsigned b, rdl *out) {
  uint64_t after = 0;
  do {
    MDB_txn *txn;
    uint64_t id;
    if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return -1;
    id = r_bucket_id(d, txn, b);
    after = id ? r_scan(d, txn, id, after, cp, g_cfg->read_limit, out) : 0;
    mdb_txn_abort(txn);
  } while (after);
  return 0;
}

/* The distinct bucket names of a catch-up's change records (borrowed from the map): open
 * addressing with a per-use stamp, so that reuse does not clear the table. */
#define RSET_SLOTS 8192u
typedef struct rset_slot {
  const unsigned char *name;
  size_t len;
  unsigned stamp;
} rset_slot;
static rset_slot g_rset[RSET_SLOTS];
static unsigned g_rset_stamp;

static int rset_add(const unsigned char *name, size_t len) {
  size_t j = (size_t)XXH3_64bits(name, len) & (RSET_SLOTS - 1);
  for (; g_rset[j].stamp == g_rset_stamp; j = (j + 1) & (RSET_SLOTS - 1))
    if (g_rset[j].len == len && memcmp(g_rset[j].name, name, len) == 0) return 0;
  g_rset[j].name = name;
  g_rset[j].len = len;
  g_rset[j].stamp = g_rset_stamp;
  return 1;
}

/* Catch-up as bucketstore does it, in one read txn: the change records of (from, cp] name the
 * changed buckets (deduplicated), then per bucket its id and a cursor scan of its ops in
 * (from, cp]. Sets *nbk to the buckets read. */
static int r_catch_up(rdb *d, uint64_t from, uint64_t cp, rdl *out, size_t *nbk) {
  static struct {
    const unsigned char *name;
    size_t len;
  } todo[RSET_SLOTS / 2];
  unsigned char k[20], nk[4 + 64];
  MDB_val key = {20, k}, val;
  MDB_cursor *cur;
  MDB_txn *txn;
  size_t n = 0;
  int mrc;
  if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return -1;
  if (mdb_cursor_open(txn, d->changes, &cur)) {
    mdb_txn_abort(txn);
    return -1;
  }
  g_rset_stamp++;
  be32(k, STREAM); /* records are keyed stream | last op | seq: start after `from` */
  be64(k + 4, from + 1);
  be64(k + 12, 0);
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const unsigned char *p = val.mv_data, *end = p + val.mv_size;
    if (key.mv_size != 20 || gbe32(key.mv_data) != STREAM || val.mv_size < 21) break;
    if (gle64(p) > cp) break; /* later records start later still */
    uint32_t nn = gle32(p + 17);
    for (p += 21; nn > 0 && end - p >= 2; nn--) {
      size_t len = (size_t)(p[0] | p[1] << 8);
      if ((size_t)(end - p - 2) < len || len > 64) break;
      if (n < RSET_SLOTS / 2 && rset_add(p + 2, len)) {
        todo[n].name = p + 2;
        todo[n].len = len;
        n++;
      }
      p += 2 + len;
    }
  }
  mdb_cursor_close(cur);
  for (size_t i = 0; i < n; i++) {
    MDB_val ik = {4 + todo[i].len, nk}, iv;
    be32(nk, STREAM);
    memcpy(nk + 4, todo[i].name, todo[i].len);
    if (mdb_get(txn, d->buckets, &ik, &iv) == 0 && iv.mv_size == 8)
      r_scan(d, txn, gle64(iv.mv_data), from, cp, UINT64_MAX, out);
  }
  mdb_txn_abort(txn);
  *nbk = n;
  return 0;
}

static uint64_t r_checkpoint(rdb *d) {
  MDB_txn *txn;
  uint64_t h;
  if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return 0;
  h = r_head(d, txn);
  mdb_txn_abort(txn);
  return h;
}

int raw_reads(void) {
  const bench_cfg *c = g_cfg;
  unsigned nb = c->buckets_small;
  double *lat = calloc(nb + 64, sizeof *lat), t0;
  rdl tot = {0, 0};
  char name[72];
  bres *r, *r2;
  uint64_t cp;
  rdb d;

  r = res_new("reads", "whole buckets from 0, cold map", "lmdb");
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (r_open(&d, "s100.raw", 0, 0, r)) goto out;
  cp = r_checkpoint(&d);
  for (int pass = 0; pass < 2; pass++) {
    if (pass) {
      r = res_new("reads", "whole buckets from 0, warm map", "lmdb");
      snprintf(r->unit, sizeof r->unit, "ops/s");
    }
    memset(&tot, 0, sizeof tot);
    mem_sampler_start();
    t0 = now_s();
    for (unsigned b = 0; b < nb; b++) {
      double tb = now_s();
      r_download(&d, cp, b, &tot);
      lat[b] = now_s() - tb;
    }
    r->secs = now_s() - t0;
    mem_sampler_stop();
    r->count = (double)tot.ops;
    r->value = (double)tot.ops / r->secs;
    r->mbps = (double)tot.bytes / r->secs / 1e6;
    set_lat(r, lat, nb);
    res_mem(r);
    snprintf(r->note, sizeof r->note, "cursor scan, one read txn per %llu ops; %.0f MB/s",
             (unsigned long long)c->read_limit, r->mbps);
  }

  uint64_t behind = g_sh->nhist_raw > c->catchup_commits ? c->catchup_commits : g_sh->nhist_raw - 1;
  snprintf(name, sizeof name, "catch-up, %llu commits behind", (unsigned long long)behind);
  r2 = res_new("reads", name, "lmdb");
  snprintf(r2->unit, sizeof r2->unit, "ops/s");
  if (!behind) {
    r2->status = BR_FAILED;
    snprintf(r2->note, sizeof r2->note, "no earlier checkpoint recorded");
    goto out;
  }
  {
    uint64_t from = g_sh->hist_raw[(g_sh->nhist_raw - 1 - behind) % 256];
    int reps = c->quick ? 5 : 40;
    size_t nbk = 0;
    rdl dd = {0, 0};
    t0 = now_s();
    for (int i = 0; i < reps; i++) {
      double tc = now_s();
      if (r_catch_up(&d, from, cp, &dd, &nbk)) break;
      lat[i] = now_s() - tc;
    }
    r2->secs = now_s() - t0;
    r2->count = (double)dd.ops;
    r2->value = (double)dd.ops / r2->secs;
    r2->mbps = (double)dd.bytes / r2->secs / 1e6;
    set_lat(r2, lat, (size_t)reps);
    res_mem(r2);
    snprintf(r2->note, sizeof r2->note,
             "one read txn: change records -> %zu distinct buckets, id get + cursor scan each",
             nbk);
  }
out:
  r_close(&d);
  free(lat);
  return 0;
}

typedef struct rctx {
  rdb *d;
  rstream *s;
  volatile int stop;
  uint64_t ops, changes, seed;
  bres *r;
} rctx;

static void *r_reader(void *arg) {
  rctx *x = arg;
  uint64_t s = x->seed;
  while (!x->stop) {
    rdl o = {0, 0};
    r_download(x->d, r_checkpoint(x->d), (unsigned)(rng_next(&s) % g_cfg->buckets_small), &o);
    x->ops += o.ops;
  }
  return NULL;
}

static void *r_writer(void *arg) {
  rctx *x = arg;
  while (!x->stop) {
    if (r_change_txn(x->s, g_cfg->commit_changes, x->r)) break;
    x->changes += g_cfg->commit_changes;
  }
  return NULL;
}

int raw_concurrent(int threads) {
  const bench_cfg *c = g_cfg;
  racc *acc = calloc(c->buckets_small, sizeof *acc);
  char name[72];
  bres *r;
  rdb d;
  rstream s;
  rctx rd[8], wr;
  pthread_t rt[8], wt;
  uint64_t ops = 0;
  double t0;

  snprintf(name, sizeof name, "%d reader%s + streaming writer", threads, threads > 1 ? "s" : "");
  r = res_new("reads", name, "lmdb");
  r->timed = 1;
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (r_open(&d, "s100.raw", 0, 0, r)) goto out;
  s.d = &d;
  s.acc = acc;
  s.seq = 2u << 30;
  r_load(&d, acc, c->buckets_small, &s.head);
  memset(&wr, 0, sizeof wr);
  wr.d = &d;
  wr.s = &s;
  wr.r = r;
  mem_sampler_start();
  t0 = now_s();
  pthread_create(&wt, NULL, r_writer, &wr);
  for (int i = 0; i < threads; i++) {
    memset(&rd[i], 0, sizeof rd[i]);
    rd[i].d = &d;
    rd[i].seed = c->seed + (uint64_t)i * 7919;
    pthread_create(&rt[i], NULL, r_reader, &rd[i]);
  }
  usleep((useconds_t)(c->read_secs * 1e6));
  for (int i = 0; i < threads; i++) rd[i].stop = 1;
  for (int i = 0; i < threads; i++) {
    pthread_join(rt[i], NULL);
    ops += rd[i].ops;
  }
  r->secs = now_s() - t0;
  wr.stop = 1;
  pthread_join(wt, NULL);
  mem_sampler_stop();
  if (r->status != BR_OK) goto out;
  r->count = (double)ops;
  r->value = (double)ops / r->secs;
  res_mem(r);
  snprintf(r->note, sizeof r->note, "writer meanwhile %.0f changes/s (durable)",
           (double)wr.changes / r->secs);
out:
  r_close(&d);
  free(acc);
  return 0;
}

/* ---- W4 ---- */
static void ck_shape(int big, uint64_t *nbk, uint64_t *per) {
  *nbk = big ? g_cfg->ck_big_buckets : g_cfg->ck_requests;
  *per = big ? g_cfg->ck_big_ops : g_cfg->ck_small_ops;
}

int raw_ck_build(int big) {
  uint64_t nbk, per, total, every = 1000, seq = 0, prev = 0, cp = 0;
  bres *r = res_new("checksums", "build", "lmdb");
  racc *acc;
  rdb d;
  int mrc;
  ck_shape(big, &nbk, &per);
  total = nbk * per;
  acc = calloc(nbk, sizeof *acc);
  if (r_open(&d, big ? "ckb.raw" : "cks.raw", 1, 1, r)) goto out;
  for (uint64_t s = 0; s < total; s += every) {
    uint64_t e = s + every < total ? s + every : total;
    MDB_txn *txn;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) {
      mfail(r, mrc, "begin");
      goto out;
    }
    for (uint64_t i = s; i < e; i++)
      if ((mrc = put_op(&d, txn, acc, (unsigned)(i % nbk), i + 1, BS_OP_PUT, i, 0, 64))) break;
    if (mrc || (mrc = r_finish(&d, txn, acc, (unsigned)nbk, s + 1, e, &seq)) ||
        (mrc = mdb_txn_commit(txn))) {
      mfail(r, mrc, "build txn");
      goto out;
    }
    prev = cp;
    cp = e;
  }
  g_sh->ck_cp[1][big][0] = cp;
  g_sh->ck_cp[1][big][1] = prev;
out:
  r_close(&d);
  free(acc);
  return r->status == BR_FAILED;
}

/* Checksum and count of bucket b at cp: running state minus the ops above cp. */
void r_checksum(rdb *d, MDB_txn *txn, MDB_cursor *cur, unsigned b, uint64_t cp, uint32_t *ck,
                uint64_t *count) {
  unsigned char k[16];
  MDB_val key = {8, k}, val;
  uint64_t id = r_bucket_id(d, txn, b), last;
  int mrc;
  *ck = 0;
  *count = 0;
  if (!id) return;
  be64(k, id);
  if (mdb_get(txn, d->bstate, &key, &val) || val.mv_size < 96) return;
  *ck = gle32((unsigned char *)val.mv_data + 4);
  *count = gle64((unsigned char *)val.mv_data + 8);
  last = gle64((unsigned char *)val.mv_data + 24);
  if (last <= cp) return;
  opkey(k, id + 1, 0);
  key.mv_size = 16;
  key.mv_data = k;
  mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
  mrc = mdb_cursor_get(cur, &key, &val, mrc == 0 ? MDB_PREV : MDB_LAST);
  for (; mrc == 0; mrc = mdb_cursor_get(cur, &key, &val, MDB_PREV)) {
    const unsigned char *kp = key.mv_data;
    if (gbe64(kp) != id || gbe64(kp + 8) <= cp) break;
    *ck -= gle32((unsigned char *)val.mv_data + 1);
    (*count)--;
  }
}

int raw_checksums(int big) {
  uint64_t nbk, per, n = g_cfg->ck_requests;
  size_t per_call;
  ck_shape(big, &nbk, &per);
  per_call = (size_t)(nbk < n ? nbk : n);
  for (int older = 0; older <= 1; older++) {
    char name[72];
    bres *r;
    rdb d;
    uint64_t cp = g_sh->ck_cp[1][big][older], sum = 0, calls = (n + per_call - 1) / per_call;
    int reps = g_cfg->quick ? 2 : 5;
    double t0, *lat = calloc(calls * (size_t)reps, sizeof *lat);
    size_t nl = 0;
    snprintf(name, sizeof name, "%llu x %llu-op bkts, %s, cold", (unsigned long long)nbk,
             (unsigned long long)per, older ? "older" : "latest");
    r = res_new("checksums", name, "lmdb");
    snprintf(r->unit, sizeof r->unit, "us/bucket");
    r->lower_better = 1;
    if (r_open(&d, big ? "ckb.raw" : "cks.raw", 0, 0, r)) {
      free(lat);
      continue;
    }
    t0 = now_s();
    for (int rep = 0; rep < reps; rep++) {
      for (uint64_t k = 0; k < calls; k++) {
        double tc = now_s();
        MDB_txn *txn;
        MDB_cursor *cur;
        if (mdb_txn_begin(d.env, NULL, MDB_RDONLY, &txn)) break;
        mdb_cursor_open(txn, d.ops, &cur);
        for (size_t i = 0; i < per_call; i++) {
          uint32_t ck;
          uint64_t cnt;
          r_checksum(&d, txn, cur, (unsigned)i, cp, &ck, &cnt);
          if (rep == 0) sum += ck + cnt;
        }
        mdb_cursor_close(cur);
        mdb_txn_abort(txn);
        lat[nl++] = now_s() - tc;
      }
    }
    r->secs = now_s() - t0;
    r->count = (double)(calls * per_call * (uint64_t)reps);
    r->value = r->secs / r->count * 1e6;
    set_lat(r, lat, nl);
    res_mem(r);
    g_sh->ck_sum[1][big][older] = sum;
    snprintf(r->note, sizeof r->note, "bucket id + state get, walk back ops above checkpoint %llu",
             (unsigned long long)cp);
    r_close(&d);
    free(lat);
  }
  return 0;
}

/* ---- W5 ---- */
static size_t lookup_key(unsigned char *buf, uint64_t k) {
  bs_scalar v[2];
  size_t size = 0;
  memset(v, 0, sizeof v);
  v[0].type = BS_SCALAR_STRING;
  v[0].s.data = "org";
  v[0].s.size = 3;
  v[1].type = BS_SCALAR_INT;
  v[1].i = (int64_t)k;
  bs_lookup_encode(buf, 64, &size, v, 2, NULL);
  return size;
}

static uint64_t fnv(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull;
  while (n--) h = (h ^ *s++) * 1099511628211ull;
  return h;
}

int raw_params(void) {
  const bench_cfg *c = g_cfg;
  uint64_t n = c->params, keys = n / 10 ? n / 10 : 1, every = 10000, seq = 0, rows = 0, cp;
  double t0, *lat = calloc(c->param_queries, sizeof *lat);
  char name[72];
  bres *rb, *r;
  rdb d;
  int mrc = 0;

  snprintf(name, sizeof name, "build %lluk-entry index", (unsigned long long)n / 1000);
  rb = res_new("params", name, "lmdb");
  snprintf(rb->unit, sizeof rb->unit, "entries/s");
  if (r_open(&d, "params.raw", 1, 1, rb)) goto out;
  mem_sampler_start();
  t0 = now_s();
  for (uint64_t s = 0; s < n; s += every) {
    uint64_t e = s + every < n ? s + every : n;
    MDB_txn *txn;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) break;
    for (uint64_t i = s; i < e && !mrc; i++) {
      unsigned char key[64], pk[128], pv[96], sk[64], sv[SREC_MAX];
      char rid[24], js[48];
      size_t kl = lookup_key(key, i % keys), rl, jl;
      MDB_val k, v;
      bs_val lkv, ridv, members = {"members", 7}; /* table id 2's name in bench_bs.c */
      bs__srec src = {.exists = 1, .lk = &lkv, .nl = 1};
      rl = (size_t)snprintf(rid, sizeof rid, "p%08llu", (unsigned long long)i);
      ridv.data = rid;
      ridv.size = rl;
      jl = (size_t)snprintf(js, sizeof js, "{\"list\":\"l%07llu\"}", (unsigned long long)i);
      be32(pk, STREAM);
      pk[4] = (unsigned char)(kl >> 8);
      pk[5] = (unsigned char)kl;
      memcpy(pk + 6, key, kl);
      be32(pk + 6 + kl, 2);
      be64(pk + 10 + kl, fnv(rid, rl));
      be64(pk + 18 + kl, i + 1);
      pv[0] = (unsigned char)rl;
      pv[1] = 0;
      memcpy(pv + 2, rid, rl);
      le32(pv + 2 + rl, 1);
      le32(pv + 6 + rl, (uint32_t)jl);
      memcpy(pv + 10 + rl, js, jl);
      k.mv_size = 26 + kl;
      k.mv_data = pk;
      v.mv_size = 10 + rl + jl;
      v.mv_data = pv;
      if ((mrc = mdb_put(txn, d.params, &k, &v, 0))) break;
      /* the source record remembers the row's lookup key */
      be32(sk, STREAM);
      be32(sk + 4, 2);
      memcpy(sk + 8, rid, rl);
      lkv.data = key;
      lkv.size = kl;
      k.mv_size = 8 + rl;
      k.mv_data = sk;
      v.mv_size = bs__lmdb_srec_size(&src, members, ridv);
      v.mv_data = sv;
      bs__lmdb_srec_encode(sv, &src, members, ridv);
      mrc = mdb_put(txn, d.source, &k, &v, 0);
    }
    if (!mrc) {
      unsigned char ck[20], cv[32];
      MDB_val k = {20, ck}, v = {29, cv};
      memset(cv, 0, sizeof cv);
      be32(ck, STREAM);
      be64(ck + 4, e);
      be64(ck + 12, ++seq);
      mrc = mdb_put(txn, d.changes, &k, &v, 0);
    }
    if (mrc || (mrc = r_set_head(&d, txn, e)) || (mrc = mdb_txn_commit(txn))) break;
  }
  if (mrc) {
    mfail(rb, mrc, "build");
    goto out;
  }
  rb->secs = now_s() - t0;
  mem_sampler_stop();
  rb->count = (double)n;
  rb->value = (double)n / rb->secs;
  res_mem(rb);
  rb->bytes_per_op = file_bytes(d.path) / (double)n;
  snprintf(rb->note, sizeof rb->note, "params entry + source record per row, nosync");
  r_close(&d);

  snprintf(name, sizeof name, "lookup 1 key (10 rows) in %lluk", (unsigned long long)n / 1000);
  r = res_new("params", name, "lmdb");
  snprintf(r->unit, sizeof r->unit, "lookups/s");
  if (r_open(&d, "params.raw", 0, 0, r)) goto out;
  cp = r_checkpoint(&d);
  {
    uint64_t s = c->seed;
    mem_sampler_start();
    t0 = now_s();
    for (uint64_t q = 0; q < c->param_queries; q++) {
      unsigned char key[64], pk[128], group[12];
      size_t kl = lookup_key(key, rng_next(&s) % keys);
      double tq = now_s();
      MDB_txn *txn;
      MDB_cursor *cur;
      MDB_val k, v, last = {0, NULL};
      int have = 0;
      be32(pk, STREAM);
      pk[4] = (unsigned char)(kl >> 8);
      pk[5] = (unsigned char)kl;
      memcpy(pk + 6, key, kl);
      k.mv_size = 6 + kl;
      k.mv_data = pk;
      if (mdb_txn_begin(d.env, NULL, MDB_RDONLY, &txn)) break;
      mdb_cursor_open(txn, d.params, &cur);
      /* entries of a (table, replica) group ascend by op id: keep the last one <= cp */
      for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
           mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const unsigned char *kp = k.mv_data;
        if (k.mv_size != 26 + kl || memcmp(kp, pk, 6 + kl)) break;
        if (have && memcmp(group, kp + 6 + kl, 12)) {
          rows += gle32((unsigned char *)last.mv_data + 2 + ((unsigned char *)last.mv_data)[0]);
          have = 0;
        }
        if (gbe64(kp + 18 + kl) <= cp) {
          memcpy(group, kp + 6 + kl, 12);
          last = v;
          have = 1;
        }
      }
      if (have)
        rows += gle32((unsigned char *)last.mv_data + 2 + ((unsigned char *)last.mv_data)[0]);
      mdb_cursor_close(cur);
      mdb_txn_abort(txn);
      lat[q] = now_s() - tq;
    }
    r->secs = now_s() - t0;
    mem_sampler_stop();
  }
  r->count = (double)c->param_queries;
  r->value = r->count / r->secs;
  set_lat(r, lat, c->param_queries);
  res_mem(r);
  snprintf(r->note, sizeof r->note, "%.2f rows per lookup; prefix scan in one read txn",
           (double)rows / r->count);
  g_sh->param_rows[1] = rows;
out:
  r_close(&d);
  free(lat);
  return 0;
}

/* ---- W6 ---- */
int raw_compact_build(void) {
  const bench_cfg *c = g_cfg;
  uint64_t n = c->compact_rows, every = 10000, seq = 0;
  unsigned nb = c->buckets_small;
  racc *acc = calloc(nb, sizeof *acc);
  bres *r = res_new("compact", "build", "lmdb");
  char full[600], inc[600];
  rdb d;
  int mrc = 0;
  if (r_open(&d, "cmp.raw", 1, 1, r)) goto out;
  for (uint64_t s = 0; s < n && !mrc; s += every) {
    uint64_t e = s + every < n ? s + every : n;
    MDB_txn *txn;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) break;
    if ((mrc = r_insert_batch(&d, txn, acc, nb, s, e, 0, 0, 0, c->data_size)) ||
        (mrc = r_finish(&d, txn, acc, nb, s + 1, e, &seq)) || (mrc = mdb_txn_commit(txn)))
      break;
  }
  /* the update pass: op n + i + 1 supersedes op i + 1 in the same bucket */
  for (uint64_t s = 0; s < n && !mrc; s += every) {
    uint64_t e = s + every < n ? s + every : n;
    MDB_txn *txn;
    if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) break;
    if ((mrc = r_insert_batch(&d, txn, acc, nb, s, e, 1, n, 0, c->data_size))) break;
    for (uint64_t i = s; i < e && !mrc; i++)
      mrc = put_sup(&d, txn, (unsigned)(i % nb), i + 1, n + i + 1);
    if (mrc || (mrc = r_finish(&d, txn, acc, nb, n + s + 1, n + e, &seq)) ||
        (mrc = mdb_txn_commit(txn)))
      break;
  }
  if (mrc) {
    mfail(r, mrc, "build");
    goto out;
  }
  r_close(&d);
  bench_path(full, sizeof full, "cmp_full.raw");
  bench_path(inc, sizeof inc, "cmp_inc.raw");
  if (copy_file(d.path, full) || copy_file(d.path, inc)) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "copying the store failed");
  }
  bench_path(full, sizeof full, "cmp_ns.raw");
  if (copy_file(d.path, full)) {
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "copying the store failed");
  }
out:
  r_close(&d);
  free(acc);
  return r->status == BR_FAILED;
}

/* Row identity hash set for the reverse scan: (hash of type|id|subkey) -> latest op id. */
typedef struct seen {
  uint64_t *h, *op;
  size_t cap, n;
} seen;

static int seen_visit(seen *s, const unsigned char *ident, size_t len, uint64_t op,
                      uint64_t *latest) {
  uint64_t h = fnv(ident, len) | 1;
  size_t i;
  if ((s->n + 1) * 2 > s->cap) {
    seen t = {0, 0, s->cap ? s->cap * 2 : 1024, 0};
    t.h = calloc(t.cap, 8);
    t.op = calloc(t.cap, 8);
    for (size_t j = 0; j < s->cap; j++)
      if (s->h[j]) {
        size_t k = s->h[j] & (t.cap - 1);
        while (t.h[k]) k = (k + 1) & (t.cap - 1);
        t.h[k] = s->h[j];
        t.op[k] = s->op[j];
        t.n++;
      }
    free(s->h);
    free(s->op);
    *s = t;
  }
  for (i = h & (s->cap - 1); s->h[i]; i = (i + 1) & (s->cap - 1))
    if (s->h[i] == h) {
      *latest = s->op[i];
      return 1;
    }
  s->h[i] = h;
  s->op[i] = op;
  s->n++;
  return 0;
}

static void seen_clear(seen *s) {
  if (s->cap) {
    memset(s->h, 0, s->cap * 8);
    s->n = 0;
  }
}

/* Rewrites the op under the cursor as a MOVE targeting `target` (payload dropped). */
static int to_move(MDB_cursor *cur, MDB_val *key, const MDB_val *val, uint64_t target) {
  unsigned char buf[HDR + 64 + 600];
  const unsigned char *p = val->mv_data;
  size_t keep = HDR + (size_t)(p[13] | p[14] << 8) + (size_t)(p[15] | p[16] << 8) + p[17];
  MDB_val nv = {keep, buf};
  if (keep > sizeof buf) return 0;
  memcpy(buf, p, keep);
  buf[0] = BS_OP_MOVE;
  le64(buf + 5, target);
  return mdb_cursor_put(cur, key, &nv, MDB_CURRENT);
}

/* Folds the leading run of REMOVE/MOVE/CLEAR ops of bucket id into one CLEAR. */
static int fold(MDB_txn *txn, rdb *d, uint64_t id, uint64_t *removed) {
  MDB_cursor *cur;
  unsigned char k[16], v[HDR];
  MDB_val key = {16, k}, val;
  uint64_t n = 0, last = 0, target = 0;
  uint32_t ck = 0;
  int mrc;
  opkey(k, id, 0);
  if ((mrc = mdb_cursor_open(txn, d->ops, &cur))) return mrc;
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)) {
    const unsigned char *p = val.mv_data, *kp = key.mv_data;
    if (gbe64(kp) != id || p[0] == BS_OP_PUT) break;
    ck += gle32(p + 1);
    if (gle64(p + 5) > target) target = gle64(p + 5);
    last = gbe64(kp + 8);
    n++;
    if ((mrc = mdb_cursor_del(cur, 0))) break;
    opkey(k, id, last + 1);
    key.mv_data = k;
    key.mv_size = 16;
  }
  mdb_cursor_close(cur);
  if (mrc && mrc != MDB_NOTFOUND) return mrc;
  if (!n) return 0;
  memset(v, 0, sizeof v);
  v[0] = BS_OP_CLEAR;
  le32(v + 1, ck);
  le64(v + 5, target);
  opkey(k, id, last);
  key.mv_data = k;
  val.mv_size = HDR;
  val.mv_data = v;
  *removed += n - 1;
  return mdb_put(txn, d->ops, &key, &val, 0);
}

/* ---- Full compaction, shaped like lmdb_compact.c's: per bucket a read-only reverse scan (the
 * seen-set, the leading run below the lowest surviving PUT), the run folded straight into one
 * CLEAR (superseded PUTs included, never rewritten as MOVEs first), then MOVEs for superseded
 * ops above the run. A transaction commits after the library's default max_ops_per_txn ops
 * changed or 8 times that visited, as lmdb_compact.c's visit factor. */
enum { RC_CHANGES = BS_COMPACT_MAX_OPS_PER_TXN, RC_VISITS = 8 * RC_CHANGES };

typedef struct rcomp {
  rdb *d;
  MDB_txn *txn;
  seen *s;
  uint64_t changes, visits, moved, removed;
} rcomp;

/* Latest op recorded for the row (0 = not recorded). */
static uint64_t seen_find(const seen *s, const unsigned char *ident, size_t len) {
  uint64_t h = fnv(ident, len) | 1;
  if (!s->cap) return 0;
  for (size_t i = h & (s->cap - 1); s->h[i]; i = (i + 1) & (s->cap - 1))
    if (s->h[i] == h) return s->op[i];
  return 0;
}

static size_t ident_len(const MDB_val *val) {
  const unsigned char *p = val->mv_data;
  return val->mv_size - HDR - (p[0] == BS_OP_PUT ? g_cfg->data_size : 0);
}

/* The op's target if it is superseded (its row has a later op), else 0. */
static uint64_t superseded_by(const seen *s, const MDB_val *key, const MDB_val *val) {
  const unsigned char *p = val->mv_data;
  uint64_t latest;
  if (p[0] != BS_OP_PUT && p[0] != BS_OP_REMOVE) return 0;
  latest = seen_find(s, p + HDR, ident_len(val));
  return latest > gbe64((const unsigned char *)key->mv_data + 8) ? latest : 0;
}

static int rc_commit_if(rcomp *rc, int force) {
  int mrc;
  if (!force && rc->changes < RC_CHANGES && rc->visits < RC_VISITS) return 0;
  rc->changes = rc->visits = 0;
  mrc = mdb_txn_commit(rc->txn);
  rc->txn = NULL;
  return mrc ? mrc : mdb_txn_begin(rc->d->env, NULL, 0, &rc->txn);
}

static int rc_scan(rcomp *rc, uint64_t id, uint64_t *run, uint64_t *max_sup) {
  uint64_t next = UINT64_MAX;
  int mrc = 0, more = 1;
  *run = *max_sup = 0;
  while (more && !mrc) {
    MDB_cursor *cur;
    unsigned char k[16];
    MDB_val key = {16, k}, val;
    more = 0;
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->ops, &cur))) break;
    opkey(k, next == UINT64_MAX ? id + 1 : id, next == UINT64_MAX ? 0 : next);
    mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
    mrc = mdb_cursor_get(cur, &key, &val, mrc == 0 ? MDB_PREV : MDB_LAST);
    for (; mrc == 0; mrc = mdb_cursor_get(cur, &key, &val, MDB_PREV)) {
      const unsigned char *p = val.mv_data, *kp = key.mv_data;
      uint64_t op, latest;
      if (gbe64(kp) != id) break;
      op = gbe64(kp + 8);
      rc->visits++;
      ++*run;
      if (p[0] == BS_OP_CLEAR) break;
      if ((p[0] == BS_OP_PUT || p[0] == BS_OP_REMOVE) &&
          seen_visit(rc->s, p + HDR, ident_len(&val), op, &latest)) {
        if (op > *max_sup) *max_sup = op;
      } else if (p[0] == BS_OP_PUT) {
        *run = 0;
      }
      if (rc->visits >= RC_VISITS) {
        next = op;
        more = 1;
        break;
      }
    }
    mdb_cursor_close(cur);
    if (mrc == MDB_NOTFOUND) mrc = 0;
    if (!mrc && more) mrc = rc_commit_if(rc, 1);
  }
  return mrc;
}

/* Folds the first `run` ops of the bucket into one CLEAR, a transaction's room at a time (the
 * CLEAR of one share is the first op of the next). Returns the last op id folded. */
static int rc_fold(rcomp *rc, uint64_t id, uint64_t run, uint64_t *last) {
  int mrc = 0;
  *last = 0;
  while (run >= 2 && !mrc) {
    uint64_t room = RC_CHANGES - rc->changes, share = run < room ? run : room, ck = 0, tg = 0;
    MDB_cursor *cur;
    unsigned char k[16], v[HDR];
    MDB_val key = {16, k}, val;
    if (share < 2) {
      mrc = rc_commit_if(rc, 1);
      continue;
    }
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->ops, &cur))) break;
    opkey(k, id, 0);
    mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
    for (uint64_t i = 0; i < share && mrc == 0; i++) {
      const unsigned char *p = val.mv_data;
      uint64_t t = superseded_by(rc->s, &key, &val);
      if (gbe64(key.mv_data) != id) {
        mrc = MDB_NOTFOUND; /* the run was counted by the scan: cannot happen */
        break;
      }
      if (t)
        rc->moved++;
      else
        t = gle64(p + 5);
      ck += gle32(p + 1);
      if (t > tg) tg = t;
      if (i + 1 < share) {
        if ((mrc = mdb_cursor_del(cur, 0))) break;
        mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
      } else {
        MDB_val ck16 = {16, k}, cv = {HDR, v};
        memcpy(k, key.mv_data, 16);
        memset(v, 0, sizeof v);
        v[0] = BS_OP_CLEAR;
        le32(v + 1, (uint32_t)ck);
        le64(v + 5, tg);
        *last = gbe64(k + 8);
        mrc = mdb_cursor_put(cur, &ck16, &cv, MDB_CURRENT);
      }
    }
    mdb_cursor_close(cur);
    if (mrc) break;
    rc->changes += share;
    rc->visits += share;
    rc->removed += share - 1;
    run -= share - 1;
    mrc = rc_commit_if(rc, 0);
  }
  return mrc;
}

/* MOVEs for the superseded ops above the folded run, up to the highest one. */
static int rc_move(rcomp *rc, uint64_t id, uint64_t from, uint64_t max_sup) {
  int mrc = 0, more = 1;
  while (more && !mrc) {
    MDB_cursor *cur;
    unsigned char k[16];
    MDB_val key = {16, k}, val;
    more = 0;
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->ops, &cur))) break;
    opkey(k, id, from);
    for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
         mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
      uint64_t op = gbe64((const unsigned char *)key.mv_data + 8), t;
      if (gbe64(key.mv_data) != id || op > max_sup) break;
      if (rc->changes >= RC_CHANGES || rc->visits >= RC_VISITS) {
        from = op;
        more = 1;
        break;
      }
      rc->visits++;
      if ((t = superseded_by(rc->s, &key, &val))) {
        unsigned char kc[16];
        MDB_val kk = {16, kc};
        memcpy(kc, key.mv_data, 16);
        if ((mrc = to_move(cur, &kk, &val, t))) break;
        rc->moved++;
        rc->changes++;
      }
    }
    mdb_cursor_close(cur);
    if (mrc == MDB_NOTFOUND) mrc = 0;
    if (!mrc && more) mrc = rc_commit_if(rc, 1);
  }
  return mrc;
}

static int rc_full(rcomp *rc, unsigned nb) {
  int mrc = 0;
  for (unsigned b = 0; b < nb && !mrc; b++) {
    uint64_t id = b + 1, run, max_sup, last;
    seen_clear(rc->s);
    if ((mrc = rc_scan(rc, id, &run, &max_sup)) || (mrc = rc_fold(rc, id, run, &last))) break;
    if (max_sup > last) mrc = rc_move(rc, id, last + 1, max_sup);
  }
  return mrc;
}

/* ---- Incremental compaction, shaped like lmdb_compact.c's (IFOLD, INC, FOLD): per bucket with
 * superseded entries, the leading run (ops whose entry names a later op, and REMOVE/MOVE/CLEAR
 * ops) folded straight into one CLEAR while the entries of the folded ops are consumed, then
 * MOVEs for the entries left (ops above the run), then a fold of a run those MOVEs extended.
 * Same cadence as the library: a fold's ops and consumed entries are each one change, a
 * transaction commits after 10k changes or 80k visits. */

/* One transaction's share of the bucket's leading run: pass 1 reads the share (ops and the
 * entries it consumes), pass 2 folds it and deletes those entries. *ended: the run is final
 * (a PUT without a later op, or the bucket's end). *folded: ops folded (0 when fewer than 2). */
static int rc_ifold_share(rcomp *rc, uint64_t id, int *ended, uint64_t *folded) {
  uint64_t room = RC_CHANGES - rc->changes, n = 0, kn = 0, moved = 0, tg = 0, last = 0;
  uint32_t ck = 0;
  unsigned char k[16], ek[16], v[HDR];
  MDB_val key = {16, k}, val, ekey = {16, ek}, ev;
  MDB_cursor *oc = NULL, *ec = NULL;
  int mrc, erc;
  *ended = 0;
  *folded = 0;
  if ((mrc = mdb_cursor_open(rc->txn, rc->d->ops, &oc)) ||
      (mrc = mdb_cursor_open(rc->txn, rc->d->sup, &ec)))
    goto out;
  opkey(k, id, 0);
  opkey(ek, id, 0);
  mrc = mdb_cursor_get(oc, &key, &val, MDB_SET_RANGE);
  erc = mdb_cursor_get(ec, &ekey, &ev, MDB_SET_RANGE);
  for (;;) {
    const unsigned char *p = val.mv_data;
    uint64_t op, eold = 0, enw = 0, t;
    int has_e, sup, cut = 0;
    if (mrc || gbe64(key.mv_data) != id) {
      *ended = 1;
      break;
    }
    op = gbe64((const unsigned char *)key.mv_data + 8);
    /* entries of ops no longer stored are consumed on the way */
    for (has_e = erc == 0 && gbe64(ekey.mv_data) == id; has_e;
         has_e = erc == 0 && gbe64(ekey.mv_data) == id) {
      eold = gbe64((const unsigned char *)ekey.mv_data + 8);
      if (eold >= op) break;
      if (n + kn + 1 > room || rc->visits >= RC_VISITS) {
        cut = 1;
        break;
      }
      kn++;
      rc->visits++;
      erc = mdb_cursor_get(ec, &ekey, &ev, MDB_NEXT);
    }
    if (cut) break;
    has_e = has_e && eold == op;
    enw = has_e ? gle64(ev.mv_data) : 0;
    sup = has_e && (p[0] == BS_OP_PUT || p[0] == BS_OP_REMOVE) && enw > op;
    if (!sup && p[0] == BS_OP_PUT) {
      *ended = 1;
      break;
    }
    if (n + 1 + kn + (uint64_t)has_e > room || rc->visits >= RC_VISITS) break;
    rc->visits += 1 + (uint64_t)has_e;
    t = sup ? enw : gle64(p + 5);
    if (t > tg) tg = t;
    ck += gle32(p + 1);
    moved += (uint64_t)sup;
    last = op;
    n++;
    kn += (uint64_t)has_e;
    if (has_e) erc = mdb_cursor_get(ec, &ekey, &ev, MDB_NEXT);
    mrc = mdb_cursor_get(oc, &key, &val, MDB_NEXT);
  }
  if (mrc == MDB_NOTFOUND) mrc = 0;
  if (mrc || n < 2 || kn == 0) goto out; /* nothing this share would fold: INC takes the entries */
  /* pass 2: the first n - 1 ops deleted, the n-th rewritten as the CLEAR; then kn entries */
  opkey(k, id, 0);
  mrc = mdb_cursor_get(oc, &key, &val, MDB_SET_RANGE);
  for (uint64_t i = 0; i + 1 < n && mrc == 0; i++)
    if (!(mrc = mdb_cursor_del(oc, 0))) mrc = mdb_cursor_get(oc, &key, &val, MDB_NEXT);
  if (!mrc) {
    MDB_val ck16 = {16, k}, cv = {HDR, v};
    opkey(k, id, last);
    memset(v, 0, sizeof v);
    v[0] = BS_OP_CLEAR;
    le32(v + 1, ck);
    le64(v + 5, tg);
    mrc = mdb_cursor_put(oc, &ck16, &cv, MDB_CURRENT);
  }
  opkey(ek, id, 0);
  ekey.mv_data = ek;
  if (!mrc) mrc = mdb_cursor_get(ec, &ekey, &ev, MDB_SET_RANGE);
  for (uint64_t i = 0; i < kn && mrc == 0; i++)
    if (!(mrc = mdb_cursor_del(ec, 0)) && i + 1 < kn)
      mrc = mdb_cursor_get(ec, &ekey, &ev, MDB_NEXT);
  if (mrc) goto out;
  rc->changes += n + kn;
  rc->moved += moved;
  rc->removed += n - 1;
  *folded = n;
out:
  if (oc) mdb_cursor_close(oc);
  if (ec) mdb_cursor_close(ec);
  return mrc;
}

/* INC: the bucket's entries left become MOVEs (target = the later op), each consumed. */
static int rc_inc_moves(rcomp *rc, uint64_t id, uint64_t *consumed) {
  int mrc = 0, more = 1;
  *consumed = 0;
  while (more && !mrc) {
    MDB_cursor *ec, *oc;
    unsigned char ek[16];
    MDB_val ekey = {16, ek}, ev;
    more = 0;
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->sup, &ec))) break;
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->ops, &oc))) {
      mdb_cursor_close(ec);
      break;
    }
    opkey(ek, id, 0);
    for (mrc = mdb_cursor_get(ec, &ekey, &ev, MDB_SET_RANGE); mrc == 0 && gbe64(ekey.mv_data) == id;
         mrc = mdb_cursor_get(ec, &ekey, &ev, MDB_NEXT)) {
      MDB_val ok = {16, ekey.mv_data}, ov;
      uint64_t nw = gle64(ev.mv_data), old = gbe64((const unsigned char *)ekey.mv_data + 8);
      if (rc->changes >= RC_CHANGES || rc->visits >= RC_VISITS) {
        more = 1;
        break;
      }
      rc->visits++;
      if (mdb_cursor_get(oc, &ok, &ov, MDB_SET_KEY) == 0) {
        const unsigned char *p = ov.mv_data;
        if ((p[0] == BS_OP_PUT || p[0] == BS_OP_REMOVE) && nw > old) {
          unsigned char kc[16];
          MDB_val kk = {16, kc};
          memcpy(kc, ok.mv_data, 16);
          if ((mrc = to_move(oc, &kk, &ov, nw))) break;
          rc->moved++;
        }
      }
      if ((mrc = mdb_cursor_del(ec, 0))) break;
      rc->changes++;
      ++*consumed;
    }
    mdb_cursor_close(oc);
    mdb_cursor_close(ec);
    if (mrc == MDB_NOTFOUND) mrc = 0;
    if (!mrc && more) mrc = rc_commit_if(rc, 1);
  }
  return mrc;
}

static int rc_incremental(rcomp *rc) {
  uint64_t id = 0;
  int mrc = 0;
  for (;;) {
    MDB_cursor *ec;
    unsigned char ek[16];
    MDB_val ekey = {16, ek}, ev;
    uint64_t folded, consumed;
    int ended = 0, fresh;
    /* the next bucket with superseded entries (the library keeps a queue of them) */
    if ((mrc = mdb_cursor_open(rc->txn, rc->d->sup, &ec))) break;
    opkey(ek, id + 1, 0);
    mrc = mdb_cursor_get(ec, &ekey, &ev, MDB_SET_RANGE);
    if (!mrc) id = gbe64(ekey.mv_data);
    mdb_cursor_close(ec);
    if (mrc) break;
    /* IFOLD, a share per transaction until the run is final or a share folds nothing */
    do {
      fresh = rc->changes == 0 && rc->visits == 0;
      if ((mrc = rc_ifold_share(rc, id, &ended, &folded))) break;
      if (!ended && (folded || !fresh)) mrc = rc_commit_if(rc, 1);
    } while (!mrc && !ended && (folded || !fresh));
    if (mrc || (mrc = rc_inc_moves(rc, id, &consumed))) break;
    if (consumed && !ended) mrc = fold(rc->txn, rc->d, id, &rc->removed);
    if (!mrc) mrc = rc_commit_if(rc, 0);
    if (mrc) break;
  }
  return mrc == MDB_NOTFOUND ? 0 : mrc;
}

int raw_compaction(int mode) {
  static const char *names[] = {"full, 50% superseded", "incremental, 50% superseded",
                                "full, 50% superseded, nosync"};
  static const char *files[] = {"cmp_full.raw", "cmp_inc.raw", "cmp_ns.raw"};
  const bench_cfg *c = g_cfg;
  unsigned nb = c->buckets_small;
  int incremental = mode == 1;
  bres *r = res_new("compact", names[mode], "lmdb");
  seen s = {0, 0, 0, 0};
  uint64_t moved = 0, removed = 0;
  double before, after, t0;
  MDB_txn *txn = NULL;
  rdb d;
  int mrc = 0;
  snprintf(r->unit, sizeof r->unit, "ops/s");
  if (r_open(&d, files[mode], mode == 2, 0, r)) goto out;
  before = r_ops(&d);
  mem_sampler_start();
  t0 = now_s();
  if ((mrc = mdb_txn_begin(d.env, NULL, 0, &txn))) goto fail;
  {
    rcomp rc = {&d, txn, &s, 0, 0, 0, 0};
    mrc = incremental ? rc_incremental(&rc) : rc_full(&rc, nb);
    txn = rc.txn;
    moved = rc.moved;
    removed = rc.removed;
  }
  if (mrc || (mrc = mdb_txn_commit(txn))) {
    txn = NULL;
    goto fail;
  }
  txn = NULL;
  r->secs = now_s() - t0;
  mem_sampler_stop();
  after = r_ops(&d);
  r->count = before;
  r->value = before / r->secs;
  res_mem(r);
  r->bytes_per_op = file_bytes(d.path) / after;
  snprintf(r->note, sizeof r->note,
           "ops %.0f -> %.0f (moved %llu, folded into CLEARs, %llu deleted by folds); %s", before,
           after, (unsigned long long)moved, (unsigned long long)removed,
           incremental ? "superseded log: leading run folded into a CLEAR (its entries "
                         "consumed), rest MOVEd; commit per 10k changes or 80k visited"
                       : "scan, superseded run folded into a CLEAR, rest MOVEd; commit per "
                         "10k ops changed or 80k visited");
  goto out;
fail:
  if (txn) mdb_txn_abort(txn);
  mem_sampler_stop();
  mfail(r, mrc, "compaction");
out:
  r_close(&d);
  free(s.h);
  free(s.op);
  return 0;
}
