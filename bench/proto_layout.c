/*
 * proto_layout.c (bsbench --proto): layout prototypes, not the file format. The snapshot ingest
 * (rows i into bucket i % nb, op id i + 1, a durable commit per commit_rows rows) written
 * straight with LMDB in three layouts of the ops, everything else as bench_raw.c writes it
 * (source records with the existence check, bucket states, a change record per commit):
 *   a: today's layout, an LMDB record per op keyed bucket id | op id (the baseline);
 *   b: chunks, the ops of a flush appended per bucket as one record keyed bucket id | last op
 *      id, holding CH_HDR then the ops packed; the bucket's tail chunk (its key is the bucket
 *      state's last op, so no search finds it) is rewritten with the new ops while its packed
 *      ops stay within the cap, and a flush's ops beyond the cap start new chunks;
 *   c: a per-flush log, the flush's ops packed bucket by bucket into one record keyed by the
 *      flush, and an index entry per bucket and flush keyed flush | bucket id (where its ops
 *      lie in the record, with a chunk header's fields): the index as written before any
 *      compaction would cluster it by bucket, so a bucket's read looks it up in every flush;
 *   c+k: layout c compacted every K flushes: each bucket's ops in those flushes moved, in flush
 *      order, onto its chunks of layout b (the tail chunk taken up again while it has room),
 *      their index entries and then the flush records deleted, in durable transactions of at
 *      most commit_rows ops; the ingest's figures include the compactions (their share printed
 *      apart); reads and checksums take the chunks, then the flushes not compacted yet (K = 10:
 *      none of the 100; K = 30: the last 10).
 * All layouts hold the same op values (today's encoding, the library's public checksums), and
 * each measurement cross-checks the ops, bytes and checksum sums the layouts hand out.
 *
 * --proto=ops compares encodings of the ops inside 4 KiB chunks (layout b, format 5's) instead:
 *   d: dense, each op's fields that repeat across a chunk written once (docs/format.md 4.3,
 *      "Where the bytes go"): a head byte (type, and which fields follow), the checksum, the
 *      target op only when not 0, the object type only when it differs from the previous op's,
 *      a canonical subkey (bs_subkey's 8 hex digits of table id, '/', 32 hex digits) as its 16
 *      bytes and the table id only when it differs from the previous op's, lengths as varints;
 *      a reader spells the subkey out again into a buffer of the chunk (not zero-copy);
 *   e: format 5's chunk body compressed with zstd (level 1) per chunk, the cap on the
 *      uncompressed body; a reader decompresses the chunk into a buffer.
 * --proto=log runs a, b (4 KiB), c and c+k only.
 * Every layout's reads decode each op's fields as the library hands them out (a bs_op), and the
 * cross-check also sums the subkeys' bytes, so d's spelled-out subkeys are checked against a's.
 */
#include "raw.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
/* The Makefile defines BS_BENCH_ZSTD when pkg-config finds libzstd (layout e; the library itself
 * links no zstd) */
#ifdef BS_BENCH_ZSTD
#include <zstd.h>
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#ifndef CALLGRIND_DUMP_STATS_AT
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#define CALLGRIND_ZERO_STATS          ((void)0)
#endif

/* Chunk header: u32 ops, u32 wrapping sum of their checksums, u64 min op id, u32 bytes of packed
 * ops. Each packed op: varint(op id - previous op id in the chunk, the first from 0), varint(value
 * size), the op value as today's op records hold it. */
#define CH_HDR 20u

typedef struct layout {
  const char *name;
  size_t cap;     /* 0: an LMDB record per op; LOG: the per-flush log; else a chunk body's bytes */
  int enc;        /* chunks: how their ops are encoded */
  int set;        /* which run shows it: 1 --proto, 2 --proto=ops, 4 --proto=log */
  unsigned every; /* c+k: the ops written to the log, moved into chunks of cap every K flushes */
} layout;
#define LOG ((size_t)-1)
enum { ENC_PLAIN, ENC_DENSE, ENC_ZSTD, ENC_DENSE_TEXT /* dense, subkeys as text */ };
/* Format 5's cap: a chunk of 4,080 bytes with its 21-byte header fills one 4 KiB overflow page. */
#define F5_BODY 4059u

static const layout g_layouts[] = {
    {"a: record per op", 0, ENC_PLAIN, 7, 0},
    {"b: chunks, cap 4 KiB", 4096, ENC_PLAIN, 5, 0},
    {"b: chunks, cap 16 KiB", 16384, ENC_PLAIN, 1, 0},
    {"b: chunks, cap 64 KiB", 65536, ENC_PLAIN, 1, 0},
    {"c: flush log + index", LOG, ENC_PLAIN, 5, 0},
    {"c+k: log, K = 10", 4096, ENC_PLAIN, 5, 10},
    {"c+k: log, K = 30", 4096, ENC_PLAIN, 4, 30},
    {"b: format 5 chunks", F5_BODY, ENC_PLAIN, 2, 0},
    {"d: dense chunks", F5_BODY, ENC_DENSE, 2, 0},
    {"d': dense, subkey text", F5_BODY, ENC_DENSE_TEXT, 2, 0},
#ifdef BS_BENCH_ZSTD
    {"e: zstd, 4 KiB body", F5_BODY, ENC_ZSTD, 2, 0},
    {"e: zstd, 16 KiB body", 4 * F5_BODY, ENC_ZSTD, 2, 0},
#endif
};
#define NLAYOUTS (sizeof g_layouts / sizeof *g_layouts)

typedef struct pstat { /* what a layout's run measured */
  double ingest_s, cpu_s, wchar, write_bytes, file, ops_bytes, src_bytes, chunks;
  double read_s, ck_s, ckcp_s;
  double compact_s, compact_cpu, compact_wchar; /* c+k: the compactions' share of the ingest */
  uint64_t read_ops, read_bytes, read_skh, ck_buckets;
  uint32_t read_sum, ck_sum, ckcp_sum;
  int failed;
} pstat;

static size_t put_varint(unsigned char *p, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) p[n++] = (unsigned char)(v | 0x80);
  p[n++] = (unsigned char)v;
  return n;
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}

/* 0 when the varint runs past end. */
static size_t get_varint(const unsigned char *p, const unsigned char *end, uint64_t *v) {
  size_t n = 0;
  *v = 0;
  for (unsigned sh = 0; p + n < end && sh < 64; sh += 7) {
    unsigned char c = p[n++];
    *v |= (uint64_t)(c & 0x7f) << sh;
    if (!(c & 0x80)) return n;
  }
  return 0;
}

/* The next packed op of a chunk body: its id, value and size; 0 at the end or on a bad op. */
static int chunk_next(const unsigned char **p, const unsigned char *end, uint64_t *op,
                      const unsigned char **v, size_t *vn) {
  uint64_t delta, size;
  size_t a, b;
  if (*p >= end || !(a = get_varint(*p, end, &delta)) || !(b = get_varint(*p + a, end, &size)) ||
      size > (uint64_t)(end - *p - a - b))
    return 0;
  *op += delta;
  *v = *p + a + b;
  *vn = (size_t)size;
  *p += a + b + size;
  return 1;
}

/* ---- Op fields ---- */
/* An op value (today's encoding, HDR bytes of header) decoded in place as the library hands it
 * out; 0 when it does not fit its size. */
static int op_fields(const unsigned char *v, size_t n, bs_op *o) {
  size_t otl, oil, skl;
  if (n < HDR) return 0;
  otl = (size_t)v[13] | (size_t)v[14] << 8;
  oil = (size_t)v[15] | (size_t)v[16] << 8;
  skl = v[17];
  if (HDR + otl + oil + skl > n) return 0;
  o->type = (bs_op_type)v[0];
  o->checksum = gle32(v + 1);
  o->target_op = gle64(v + 5);
  o->object_type.data = v + HDR;
  o->object_type.size = otl;
  o->object_id.data = v + HDR + otl;
  o->object_id.size = oil;
  o->subkey.data = v + HDR + otl + oil;
  o->subkey.size = skl;
  o->data.data = v + HDR + otl + oil + skl;
  o->data.size = n - HDR - otl - oil - skl;
  return 1;
}

/* ---- Dense ops (layout d) ---- */
/* An op: u8 head | u32 checksum | [varint target: D_TARGET] | [varint length + object type:
 * D_TYPE, else the previous op's] | varint length + object id | subkey: D_SKBIN: [u32 table id:
 * D_SKTID, else the previous op's] + the 16 bytes of its hash, else varint length + bytes | PUT:
 * varint length + data. The head's bits 0-2 are the type. The first op of a chunk, and the first a
 * flush appends to a chunk, carry every field they would repeat. */
#define D_TARGET 0x08u
#define D_TYPE   0x10u
#define D_SKBIN  0x20u
#define D_SKTID  0x40u

typedef struct dstate {     /* what the next op may repeat */
  int have, have_tid, text; /* text: the encoder keeps subkeys as text */
  const unsigned char *ot;
  size_t otl;
  uint32_t tid;
  char tidhex[9];         /* the reader's: tid spelled out, with the '/' */
  unsigned char otb[256]; /* the encoder's copy of the object type ot points to */
} dstate;

/* A lowercase hex digit's value, 16 for any other byte: a table built once. */
static unsigned char g_unhex[256];

/* A subkey bs_subkey spells (8 lowercase hex digits, '/', 32): its table id and hash bytes. (The
 * library's writer would keep the hash it spells instead of parsing it back.) */
static int subkey_parse(const unsigned char *sk, size_t n, uint32_t *tid, unsigned char h[16]) {
  uint32_t t = 0;
  unsigned bad = 0;
  if (!g_unhex['0']) {
    memset(g_unhex, 16, sizeof g_unhex);
    for (int i = 0; i < 16; i++) g_unhex[(unsigned char)"0123456789abcdef"[i]] = (unsigned char)i;
  }
  if (n != BS_SUBKEY_SIZE || sk[8] != '/') return 0;
  for (int i = 0; i < 8; i++) {
    bad |= g_unhex[sk[i]];
    t = t << 4 | (g_unhex[sk[i]] & 15u);
  }
  for (int i = 0; i < 16; i++) {
    unsigned hi = g_unhex[sk[9 + 2 * i]], lo = g_unhex[sk[10 + 2 * i]];
    bad |= hi | lo;
    h[i] = (unsigned char)((hi & 15u) << 4 | (lo & 15u));
  }
  *tid = t;
  return !(bad & 16u);
}

static const char g_hex[] = "0123456789abcdef";

static void tid_spell(char out[9], uint32_t tid) {
  for (int i = 7; i >= 0; i--, tid >>= 4) out[i] = g_hex[tid & 15];
  out[8] = '/';
}

/* Two hex digits a byte, a table built once. */
static char g_hex2[256][2];

static void subkey_spell(char *out, const char tidhex[9], const unsigned char h[16]) {
#ifdef __SSE2__
  /* 16 bytes to 32 hex digits in a few vector instructions (x86-64 always has SSE2): each nibble
   * n becomes '0' + n, plus 39 ('a' - '0' - 10) where n > 9 */
  __m128i v = _mm_loadu_si128((const __m128i *)(const void *)h), m = _mm_set1_epi8(0x0f);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m), lo = _mm_and_si128(v, m);
  __m128i a = _mm_unpacklo_epi8(hi, lo), b = _mm_unpackhi_epi8(hi, lo);
  __m128i nine = _mm_set1_epi8(9), zero = _mm_set1_epi8('0'), gap = _mm_set1_epi8(39);
  a = _mm_add_epi8(_mm_add_epi8(a, zero), _mm_and_si128(_mm_cmpgt_epi8(a, nine), gap));
  b = _mm_add_epi8(_mm_add_epi8(b, zero), _mm_and_si128(_mm_cmpgt_epi8(b, nine), gap));
  memcpy(out, tidhex, 9);
  _mm_storeu_si128((__m128i *)(void *)(out + 9), a);
  _mm_storeu_si128((__m128i *)(void *)(out + 25), b);
  return;
#endif
  if (!g_hex2[0][0])
    for (int i = 0; i < 256; i++) {
      g_hex2[i][0] = g_hex[i >> 4];
      g_hex2[i][1] = g_hex[i & 15];
    }
  memcpy(out, tidhex, 9);
  for (int i = 0; i < 16; i++) memcpy(out + 9 + 2 * i, g_hex2[h[i]], 2);
}

/* Op value v (n bytes, today's encoding) densely into out under st; returns its size. */
static size_t dense_encode(unsigned char *out, const unsigned char *v, size_t n, dstate *st) {
  bs_op o;
  unsigned char h[16];
  uint32_t tid = 0;
  size_t len = 5;
  unsigned head;
  if (!op_fields(v, n, &o)) return 0;
  head = (unsigned)o.type;
  if (o.target_op) head |= D_TARGET;
  if (!st->have || st->otl != o.object_type.size ||
      memcmp(st->otb, o.object_type.data, o.object_type.size))
    head |= D_TYPE;
  if (!st->text && subkey_parse(o.subkey.data, o.subkey.size, &tid, h)) {
    head |= D_SKBIN;
    if (!st->have_tid || tid != st->tid) head |= D_SKTID;
  }
  out[0] = (unsigned char)head;
  le32(out + 1, o.checksum);
  if (head & D_TARGET) len += put_varint(out + len, o.target_op);
  if (head & D_TYPE) {
    len += put_varint(out + len, o.object_type.size);
    memcpy(out + len, o.object_type.data, o.object_type.size);
    len += o.object_type.size;
  }
  len += put_varint(out + len, o.object_id.size);
  memcpy(out + len, o.object_id.data, o.object_id.size);
  len += o.object_id.size;
  if (head & D_SKBIN) {
    if (head & D_SKTID) {
      le32(out + len, tid);
      len += 4;
      st->tid = tid;
      st->have_tid = 1;
    }
    memcpy(out + len, h, 16);
    len += 16;
  } else {
    len += put_varint(out + len, o.subkey.size);
    memcpy(out + len, o.subkey.data, o.subkey.size);
    len += o.subkey.size;
  }
  if (o.type == BS_OP_PUT) {
    len += put_varint(out + len, o.data.size);
    memcpy(out + len, o.data.data, o.data.size);
    len += o.data.size;
  }
  /* v is the caller's buffer, which the next op overwrites: keep a copy */
  st->have = o.object_type.size <= sizeof st->otb;
  st->otl = o.object_type.size;
  if (st->have) memcpy(st->otb, o.object_type.data, o.object_type.size);
  return len;
}

/* The next dense op of a chunk body (its id after *op) into o, a spelled-out subkey at sk (41
 * bytes); 0 at the end or on a bad op. */
static int dense_next(const unsigned char **pp, const unsigned char *end, uint64_t *op, bs_op *o,
                      dstate *st, char *sk) {
  const unsigned char *p = *pp;
  uint64_t delta, v;
  size_t a;
  unsigned head;
#define NEED(n)                                                                                    \
  do {                                                                                             \
    if ((size_t)(end - p) < (size_t)(n)) return 0;                                                 \
  } while (0)
#define VARINT(x)                                                                                  \
  do {                                                                                             \
    if (!(a = get_varint(p, end, &(x)))) return 0;                                                 \
    p += a;                                                                                        \
  } while (0)
  if (p >= end) return 0;
  VARINT(delta);
  NEED(5);
  head = p[0];
  o->type = (bs_op_type)(head & 7);
  o->checksum = gle32(p + 1);
  p += 5;
  o->target_op = 0;
  if (head & D_TARGET) VARINT(o->target_op);
  if (head & D_TYPE) {
    VARINT(v);
    NEED(v);
    st->ot = p;
    st->otl = (size_t)v;
    st->have = 1;
    p += v;
  } else if (!st->have) {
    return 0;
  }
  o->object_type.data = st->ot;
  o->object_type.size = st->otl;
  VARINT(v);
  NEED(v);
  o->object_id.data = p;
  o->object_id.size = (size_t)v;
  p += v;
  if (head & D_SKBIN) {
    if (head & D_SKTID) {
      NEED(4);
      st->tid = gle32(p);
      tid_spell(st->tidhex, st->tid);
      st->have_tid = 1;
      p += 4;
    } else if (!st->have_tid) {
      return 0;
    }
    NEED(16);
    subkey_spell(sk, st->tidhex, p);
    p += 16;
    o->subkey.data = sk;
    o->subkey.size = BS_SUBKEY_SIZE;
  } else {
    VARINT(v);
    NEED(v);
    o->subkey.data = p;
    o->subkey.size = (size_t)v;
    p += v;
  }
  o->data.data = NULL;
  o->data.size = 0;
  if (o->type == BS_OP_PUT) {
    VARINT(v);
    NEED(v);
    o->data.data = p;
    o->data.size = (size_t)v;
    p += v;
  }
#undef NEED
#undef VARINT
  *op += delta;
  *pp = p;
  return 1;
}

/* The next op of a chunk body in encoding enc (ENC_ZSTD: the body decompressed) into o; sk: room
 * for the op's spelled-out subkey (dense) */
static int body_next(int enc, const unsigned char **p, const unsigned char *end, uint64_t *op,
                     bs_op *o, dstate *st, char *sk) {
  const unsigned char *v;
  size_t vn;
  if (enc == ENC_DENSE || enc == ENC_DENSE_TEXT) return dense_next(p, end, op, o, st, sk);
  return chunk_next(p, end, op, &v, &vn) && op_fields(v, vn, o);
}

#ifdef BS_BENCH_ZSTD
static ZSTD_CCtx *g_zc;
static ZSTD_DCtx *g_zd;
static unsigned char *g_zbuf; /* a compressed chunk, or a decompressed body */
static size_t g_zcap;

static int z_room(size_t n) {
  if (n <= g_zcap) return 1;
  free(g_zbuf);
  g_zcap = 0;
  if (!(g_zbuf = malloc(n))) return 0;
  g_zcap = n;
  return 1;
}

/* Chunk value p (n bytes: CH_HDR, then the compressed body) decompressed into g_zbuf; returns the
 * body's size, or (size_t)-1. */
static size_t z_body(const unsigned char *p, size_t n) {
  size_t want, got;
  if (n < CH_HDR) return (size_t)-1;
  want = gle32(p + 16);
  if (!z_room(want + 1) || (!g_zd && !(g_zd = ZSTD_createDCtx()))) return (size_t)-1;
  got = ZSTD_decompressDCtx(g_zd, g_zbuf, g_zcap, p + CH_HDR, n - CH_HDR);
  return ZSTD_isError(got) || got != want ? (size_t)-1 : got;
}
#endif

/* ---- Writing chunks ---- */
typedef struct chunkw {
  unsigned char *buf; /* CH_HDR + packed ops */
  size_t len;         /* bytes of packed ops */
  uint32_t count, ck;
  uint64_t min, last;
  int enc;
  dstate st; /* ENC_DENSE: what the next op may repeat */
} chunkw;

static int chunk_emit(rdb *d, MDB_txn *txn, uint64_t id, chunkw *w, double *chunks) {
  unsigned char k[16];
  MDB_val key = {16, k}, val = {CH_HDR + w->len, w->buf};
  if (!w->count) return 0;
  le32(w->buf, w->count);
  le32(w->buf + 4, w->ck);
  le64(w->buf + 8, w->min);
  le32(w->buf + 16, (uint32_t)w->len);
#ifdef BS_BENCH_ZSTD
  if (w->enc == ENC_ZSTD) {
    size_t bound = ZSTD_compressBound(w->len), z;
    if (!z_room(CH_HDR + bound) || (!g_zc && !(g_zc = ZSTD_createCCtx()))) return ENOMEM;
    memcpy(g_zbuf, w->buf, CH_HDR);
    z = ZSTD_compressCCtx(g_zc, g_zbuf + CH_HDR, bound, w->buf + CH_HDR, w->len, 1);
    if (ZSTD_isError(z)) return EIO;
    val.mv_size = CH_HDR + z;
    val.mv_data = g_zbuf;
  }
#endif
  opkey(k, id, w->last);
  w->len = w->count = w->ck = 0;
  w->min = w->last = 0;
  w->st.have = w->st.have_tid = 0;
  ++*chunks;
  return mdb_put(txn, d->ops, &key, &val, 0);
}

/* The bucket's tail chunk into w (and out of the tree) if `need` more bytes of packed ops keep it
 * within cap. */
static int chunk_take_tail(rdb *d, MDB_txn *txn, uint64_t id, uint64_t last, size_t cap,
                           size_t need, chunkw *w, double *chunks) {
  unsigned char k[16];
  MDB_val key = {16, k}, val;
  const unsigned char *p;
  size_t body;
  int mrc;
  opkey(k, id, last);
  if ((mrc = mdb_get(txn, d->ops, &key, &val))) return mrc == MDB_NOTFOUND ? 0 : mrc;
  p = val.mv_data;
  body = val.mv_size - CH_HDR;
  if (val.mv_size < CH_HDR || (w->enc != ENC_ZSTD && gle32(p + 16) != body)) return MDB_CORRUPTED;
  if (gle32(p + 16) + need > cap) return 0;
  memcpy(w->buf, p, CH_HDR);
#ifdef BS_BENCH_ZSTD
  if (w->enc == ENC_ZSTD) {
    if ((body = z_body(p, val.mv_size)) == (size_t)-1) return MDB_CORRUPTED;
    memcpy(w->buf + CH_HDR, g_zbuf, body);
  } else
#endif
    memcpy(w->buf + CH_HDR, p + CH_HDR, body);
  w->count = gle32(p);
  w->ck = gle32(p + 4);
  w->min = gle64(p + 8);
  w->len = body;
  w->last = last;
  w->st.have = w->st.have_tid = 0; /* the next op carries its fields: no decode of the tail */
  --*chunks;
  return mdb_del(txn, d->ops, &key, NULL);
}

/* Op value v (n bytes) as it would be packed into w after w->last: into out with the state it
 * leaves in *next (dense), or as is; returns the bytes it takes. */
static size_t chunk_op_size(const chunkw *w, uint64_t op, const unsigned char *v, size_t n,
                            unsigned char *out, size_t *on, dstate *next) {
  if (w->enc == ENC_DENSE || w->enc == ENC_DENSE_TEXT) {
    *next = w->st;
    *on = dense_encode(out, v, n, next);
    return varint_len(op - w->last) + *on;
  }
  return varint_len(op - w->last) + varint_len(n) + n;
}

/* Op `op` (value v, n bytes) appended to bucket id's chunks through w. *first: it is the first
 * op of a run, which takes the bucket's tail chunk (its key's last op prev) up again while the op
 * fits in it with every field it could repeat. */
static int chunk_put(rdb *d, MDB_txn *txn, uint64_t id, size_t cap, chunkw *w, double *chunks,
                     int *first, uint64_t prev, uint64_t op, const unsigned char *v, size_t n) {
  static unsigned char dv[OP_MAX + 32];
  static dstate next;
  size_t dn = 0, need;
  int mrc;
  if (*first) {
    /* what the op takes as the first a flush appends (every field it could repeat) */
    chunkw probe = *w;
    probe.last = prev;
    probe.st.have = probe.st.have_tid = 0;
    need = chunk_op_size(&probe, op, v, n, dv, &dn, &next);
    if ((mrc = chunk_take_tail(d, txn, id, prev, cap, need, w, chunks))) return mrc;
    *first = 0;
  }
  need = chunk_op_size(w, op, v, n, dv, &dn, &next);
  if (w->count && w->len + need > cap) {
    if ((mrc = chunk_emit(d, txn, id, w, chunks))) return mrc;
    need = chunk_op_size(w, op, v, n, dv, &dn, &next); /* the new chunk's first op */
  }
  if (!w->count) w->min = op;
  w->len += put_varint(w->buf + CH_HDR + w->len, op - w->last);
  if (w->enc == ENC_DENSE || w->enc == ENC_DENSE_TEXT) {
    memcpy(w->buf + CH_HDR + w->len, dv, dn); /* encoded once, above */
    w->len += dn;
    w->st = next;
  } else {
    w->len += put_varint(w->buf + CH_HDR + w->len, n);
    memcpy(w->buf + CH_HDR + w->len, v, n);
    w->len += n;
  }
  w->count++;
  w->ck += gle32(v + 1);
  w->last = op;
  return 0;
}

/* The flush's ops of bucket b (rows [s, e) with i % nb == b) appended as chunks. */
static int chunk_flush(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, unsigned b, uint64_t s,
                       uint64_t e, size_t cap, chunkw *w, double *chunks) {
  static unsigned char v[OP_MAX];
  uint64_t id = b + 1, prev = acc[b].last_op;
  int mrc = 0, first = acc[b].count > 0;
  for (uint64_t i = s + (b + nb - s % nb) % nb; i < e && !mrc; i += nb) {
    uint64_t op = i + 1;
    size_t n = op_make(v, acc, b, op, BS_OP_PUT, i, 0, g_cfg->data_size);
    mrc = chunk_put(d, txn, id, cap, w, chunks, &first, prev, op, v, n);
  }
  return mrc ? mrc : chunk_emit(d, txn, id, w, chunks);
}

/* ---- Writing the log ---- */
/* Index entry of a bucket in a flush: u32 offset and u32 bytes of its packed ops in the flush's
 * record, u32 ops, u32 checksum sum, u64 min and u64 last op id. */
#define IX_SIZE 32u

static void ixkey(unsigned char k[16], uint64_t flush, uint64_t id) {
  be64(k, flush);
  be64(k + 8, id);
}

/* Flush `flush` (rows [s, e)): its ops into buf bucket by bucket (each bucket's run packed as a
 * chunk body), an index entry per bucket, then buf as the flush's record. */
static int log_flush(rdb *d, MDB_txn *txn, racc *acc, unsigned nb, uint64_t s, uint64_t e,
                     uint64_t flush, unsigned char *buf, double *records) {
  static unsigned char v[OP_MAX];
  unsigned char k[16], ix[IX_SIZE];
  MDB_val key = {16, k}, val = {IX_SIZE, ix};
  size_t len = 0;
  int mrc;
  for (unsigned b = 0; b < nb; b++) {
    size_t start = len;
    uint32_t count = 0, ck = 0;
    uint64_t min = 0, prev = 0;
    for (uint64_t i = s + (b + nb - s % nb) % nb; i < e; i += nb) {
      uint64_t op = i + 1;
      size_t n = op_make(v, acc, b, op, BS_OP_PUT, i, 0, g_cfg->data_size);
      len += put_varint(buf + len, op - prev);
      len += put_varint(buf + len, n);
      memcpy(buf + len, v, n);
      len += n;
      if (!count++) min = op;
      ck += gle32(v + 1);
      prev = op;
    }
    if (!count) continue;
    le32(ix, (uint32_t)start);
    le32(ix + 4, (uint32_t)(len - start));
    le32(ix + 8, count);
    le32(ix + 12, ck);
    le64(ix + 16, min);
    le64(ix + 24, prev);
    ixkey(k, flush, b + 1);
    if ((mrc = mdb_put(txn, d->params, &key, &val, 0))) return mrc;
    ++*records;
  }
  be64(k, flush);
  key.mv_size = 8;
  val.mv_size = len;
  val.mv_data = buf;
  return mdb_put(txn, d->sup, &key, &val, 0);
}

/* The first flush still in the log (c: 1; c+k: the one after the last compacted), as a reader
 * would find it in a meta record; the log's reads visit it and every later one. */
static uint64_t g_log_from = 1;

/* The ingest's flushes (1..n). */
static uint64_t log_flushes(void) {
  return (g_cfg->rows + g_cfg->commit_rows - 1) / g_cfg->commit_rows;
}

/* Bucket id's index entry in a flush, and the packed ops it names. */
static int log_entry(rdb *d, MDB_txn *txn, uint64_t flush, uint64_t id, const unsigned char **ix,
                     const unsigned char **p, const unsigned char **end) {
  unsigned char k[16];
  MDB_val key = {16, k}, val, lv;
  ixkey(k, flush, id);
  if (mdb_get(txn, d->params, &key, &val) || val.mv_size != IX_SIZE) return 0;
  *ix = val.mv_data;
  key.mv_size = 8;
  if (mdb_get(txn, d->sup, &key, &lv) || (uint64_t)gle32(*ix) + gle32(*ix + 4) > lv.mv_size)
    return 0;
  *p = (const unsigned char *)lv.mv_data + gle32(*ix);
  *end = *p + gle32(*ix + 4);
  return 1;
}

/* Layout c+k: the log's flushes (from, to] moved into chunks of cap (layout b's), bucket after
 * bucket, in durable transactions of at most commit_rows ops (a bucket's ops of the window in
 * one): its ops appended in flush order onto its chunks, whose tail (*tail[b], 0: none yet) is
 * taken up again while it has room, and its index entries deleted; the flush records go in the
 * last transaction. *records counts index entries and chunks. */
static int log_compact(rdb *d, unsigned nb, uint64_t from, uint64_t to, size_t cap, chunkw *w,
                       uint64_t *tail, double *records) {
  MDB_txn *txn = NULL;
  uint64_t in_txn = 0;
  int mrc = 0;
  for (unsigned b = 0; b < nb && !mrc; b++) {
    uint64_t id = b + 1, last = 0;
    int first = tail[b] != 0;
    if (!txn && (mrc = mdb_txn_begin(d->env, NULL, 0, &txn))) return mrc;
    for (uint64_t f = from + 1; f <= to && !mrc; f++) {
      const unsigned char *ix, *p, *end, *v;
      unsigned char k[16];
      MDB_val key = {16, k};
      uint64_t op = 0;
      size_t vn;
      if (!log_entry(d, txn, f, id, &ix, &p, &end)) continue;
      /* the log's record is not written in this transaction, so p stays valid while the
       * chunks are put */
      while (!mrc && chunk_next(&p, end, &op, &v, &vn)) {
        mrc = chunk_put(d, txn, id, cap, w, records, &first, tail[b], op, v, vn);
        last = op;
        in_txn++;
      }
      if (!mrc && p != end) mrc = MDB_CORRUPTED;
      ixkey(k, f, id);
      if (!mrc && !(mrc = mdb_del(txn, d->params, &key, NULL))) --*records;
    }
    if (mrc || !last) continue;
    tail[b] = last;
    if ((mrc = chunk_emit(d, txn, id, w, records)) || in_txn < g_cfg->commit_rows) continue;
    mrc = mdb_txn_commit(txn);
    txn = NULL;
    in_txn = 0;
  }
  if (!mrc && !txn) mrc = mdb_txn_begin(d->env, NULL, 0, &txn);
  for (uint64_t f = from + 1; f <= to && !mrc; f++) {
    unsigned char k[8];
    MDB_val key = {8, k};
    be64(k, f);
    mrc = mdb_del(txn, d->sup, &key, NULL);
  }
  if (txn && (mrc || (mrc = mdb_txn_commit(txn)))) {
    if (mrc) mdb_txn_abort(txn);
  }
  return mrc;
}

/* ---- Measuring ---- */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* wchar (bytes given to write calls) and write_bytes (bytes this process sent to be stored) of
 * /proc/self/io; -1 where the kernel does not say. */
static void io_now(double *wchar, double *wbytes) {
  char line[128];
  FILE *f = fopen("/proc/self/io", "r");
  unsigned long long v;
  *wchar = *wbytes = -1;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "wchar: %llu", &v) == 1) *wchar = (double)v;
    if (sscanf(line, "write_bytes: %llu", &v) == 1) *wbytes = (double)v;
  }
  fclose(f);
}

/* Bytes of the tree's pages. */
static double db_bytes(MDB_txn *txn, MDB_dbi dbi) {
  MDB_stat st;
  if (mdb_stat(txn, dbi, &st)) return -1;
  return (double)(st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) * st.ms_psize;
}

static int p_ingest(rdb *d, const layout *L, unsigned nb, pstat *ps) {
  const bench_cfg *c = g_cfg;
  racc *acc = calloc(nb, sizeof *acc);
  size_t bufsize = L->cap == LOG ? (size_t)c->commit_rows * (OP_MAX - 65536 + c->data_size + 24)
                                 : CH_HDR + (L->cap ? L->cap : 1) + OP_MAX;
  chunkw w = {.buf = malloc(bufsize), .enc = L->enc};
  /* c+k: the flush's record is built in lbuf, its compaction appends through w */
  unsigned char *lbuf =
      L->every ? malloc((size_t)c->commit_rows * (OP_MAX - 65536 + c->data_size + 24)) : NULL;
  uint64_t *tail = L->every ? calloc(nb, sizeof *tail) : NULL, done = 0;
  w.st.text = L->enc == ENC_DENSE_TEXT;
  uint64_t seq = 0;
  double t0, c0, wc0, wb0, wc1, wb1;
  char name[64];
  MDB_txn *txn = NULL;
  int mrc = ENOMEM;
  if (!acc || !w.buf || (L->every && (!lbuf || !tail))) goto out;
  CALLGRIND_ZERO_STATS;
  io_now(&wc0, &wb0);
  c0 = cpu_s();
  t0 = now_s();
  for (uint64_t s = 0; s < c->rows; s += c->commit_rows) {
    uint64_t e = s + c->commit_rows < c->rows ? s + c->commit_rows : c->rows;
    if ((mrc = mdb_txn_begin(d->env, NULL, 0, &txn))) goto out;
    if (!L->cap) {
      mrc = r_insert_batch(d, txn, acc, nb, s, e, 0, 0, 1, c->data_size);
    } else if (L->cap == LOG) {
      if (!(mrc = r_put_sources(d, txn, nb, s, e, 0, 1)))
        mrc = log_flush(d, txn, acc, nb, s, e, s / c->commit_rows + 1, w.buf, &ps->chunks);
    } else if (L->every) {
      if (!(mrc = r_put_sources(d, txn, nb, s, e, 0, 1)))
        mrc = log_flush(d, txn, acc, nb, s, e, s / c->commit_rows + 1, lbuf, &ps->chunks);
    } else {
      mrc = r_put_sources(d, txn, nb, s, e, 0, 1);
      for (unsigned b = 0; b < nb && !mrc; b++)
        mrc = chunk_flush(d, txn, acc, nb, b, s, e, L->cap, &w, &ps->chunks);
    }
    if (mrc || (mrc = r_finish(d, txn, acc, nb, s + 1, e, &seq))) goto out;
    mrc = mdb_txn_commit(txn);
    txn = NULL;
    if (mrc) goto out;
    if (L->every && (s / c->commit_rows + 1) % L->every == 0) {
      double k0 = now_s(), kc0 = cpu_s(), kw0, kw1, kb;
      uint64_t flush = s / c->commit_rows + 1;
      io_now(&kw0, &kb);
      if ((mrc = log_compact(d, nb, done, flush, L->cap, &w, tail, &ps->chunks))) goto out;
      done = flush;
      io_now(&kw1, &kb);
      ps->compact_s += now_s() - k0;
      ps->compact_cpu += cpu_s() - kc0;
      ps->compact_wchar += kw0 < 0 ? 0 : kw1 - kw0;
    }
  }
  ps->ingest_s = now_s() - t0;
  g_log_from = done + 1;
  ps->cpu_s = cpu_s() - c0;
  snprintf(name, sizeof name, "%s, ingest", L->name);
  CALLGRIND_DUMP_STATS_AT(name);
  io_now(&wc1, &wb1);
  ps->wchar = wc0 < 0 ? -1 : wc1 - wc0;
  ps->write_bytes = wb0 < 0 ? -1 : wb1 - wb0;
  ps->file = file_bytes(d->path);
  if ((mrc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn))) goto out;
  ps->ops_bytes = db_bytes(txn, d->ops) + db_bytes(txn, d->sup) + db_bytes(txn, d->params);
  ps->src_bytes = db_bytes(txn, d->source);
  if (!L->cap) ps->chunks = (double)c->rows;
out:
  if (txn) mdb_txn_abort(txn);
  free(acc);
  free(w.buf);
  free(lbuf);
  free(tail);
  return mrc;
}

typedef struct phand {
  uint64_t ops, bytes, skh; /* skh: a sum over the subkeys' bytes, to cross-check them */
  uint32_t sum;
} phand;

/* An op handed out: what the cross-check counts of it. */
static void hand_op(const bs_op *o, phand *out) {
  const unsigned char *sk = o->subkey.data;
  uint64_t h = 0;
  out->bytes += o->object_type.size + o->object_id.size + o->subkey.size + o->data.size;
  out->sum += o->checksum;
  for (size_t i = 0; i < o->subkey.size; i++) h = h * 31 + sk[i];
  out->skh += h;
}

/* Hands out the packed ops of [p, end) in (after, cp] while *n < limit; 1 when an op above cp
 * ended it. */
static int hand_packed(int enc, const unsigned char *p, const unsigned char *end, uint64_t after,
                       uint64_t cp, uint64_t limit, uint64_t *n, uint64_t *last, phand *out) {
  /* the chunk's spelled-out subkeys (d), each kept until the chunk is done, as a reader handing
   * out a chunk's ops at once would (format 5 caps a chunk at 256 ops) */
  static char sks[256 * BS_SUBKEY_SIZE];
  uint64_t op = 0;
  dstate st = {0};
  bs_op o;
  for (uint32_t i = 0;
       *n < limit && body_next(enc, &p, end, &op, &o, &st, sks + (i & 255) * BS_SUBKEY_SIZE); i++) {
    if (op <= after) continue;
    if (op > cp) return 1;
    hand_op(&o, out);
    *last = op;
    ++*n;
  }
  return 0;
}

/* The log: a lookup in every flush's index, from the first. */
static void log_scan(rdb *d, MDB_txn *txn, uint64_t id, uint64_t after, uint64_t cp, uint64_t limit,
                     uint64_t *n, uint64_t *last, phand *out) {
  for (uint64_t f = g_log_from, nf = log_flushes(); f <= nf && *n < limit; f++) {
    const unsigned char *ix, *p, *end;
    if (!log_entry(d, txn, f, id, &ix, &p, &end) || gle64(ix + 24) <= after) continue;
    if (gle64(ix + 16) > cp || hand_packed(ENC_PLAIN, p, end, after, cp, limit, n, last, out))
      break;
  }
}

/* Hands out ops (after, cp] of bucket id, at most limit; returns the last op read when the limit
 * stopped it (0: the bucket's end). Chunks: the first chunk found may start below after + 1, its
 * ops up to after are skipped. */
static uint64_t p_scan(rdb *d, MDB_txn *txn, const layout *L, uint64_t id, uint64_t after,
                       uint64_t cp, uint64_t limit, phand *out) {
  size_t cap = L->cap;
  MDB_cursor *cur;
  unsigned char k[16];
  MDB_val key = {16, k}, val;
  uint64_t n = 0, last = 0;
  int mrc, above = 0; /* an op above cp ended the chunks' walk */
  if (cap == LOG) {
    log_scan(d, txn, id, after, cp, limit, &n, &last, out);
    out->ops += n;
    return n == limit ? last : 0;
  }
  opkey(k, id, after + 1);
  if (mdb_cursor_open(txn, d->ops, &cur)) return 0;
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && n < limit;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const unsigned char *kp = key.mv_data, *p = val.mv_data, *body = p + CH_HDR;
    size_t bn = val.mv_size - CH_HDR;
    uint64_t op;
    bs_op o;
    if (gbe64(kp) != id) break;
    if (!cap) {
      if ((op = gbe64(kp + 8)) > cp || !op_fields(p, val.mv_size, &o)) break;
      hand_op(&o, out);
      last = op;
      n++;
      continue;
    }
    if (gle64(p + 8) > cp && (above = 1)) break;
#ifdef BS_BENCH_ZSTD
    if (L->enc == ENC_ZSTD) {
      if ((bn = z_body(p, val.mv_size)) == (size_t)-1) break;
      body = g_zbuf;
    }
#endif
    if ((above = hand_packed(L->enc == ENC_ZSTD ? ENC_PLAIN : L->enc, body, body + bn, after, cp,
                             limit, &n, &last, out)))
      break;
  }
  mdb_cursor_close(cur);
  /* c+k: the ops not compacted yet follow the chunks' in the log */
  if (L->every && !above && n < limit)
    log_scan(d, txn, id, n ? last : after, cp, limit, &n, &last, out);
  out->ops += n;
  return n == limit ? last : 0;
}

/* Whole buckets from op 0 at cp, a read txn per read_limit ops (as raw_reads). */
static int p_reads(rdb *d, const layout *L, unsigned nb, uint64_t cp, phand *out) {
  for (unsigned b = 0; b < nb; b++) {
    uint64_t after = 0;
    do {
      MDB_txn *txn;
      uint64_t id;
      if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return -1;
      id = r_bucket_id(d, txn, b);
      after = id ? p_scan(d, txn, L, id, after, cp, g_cfg->read_limit, out) : 0;
      mdb_txn_abort(txn);
    } while (after);
  }
  return 0;
}

/* Every bucket's checksum at the latest op summed from its stored ops (no running state, no
 * cache): every op's checksum, every chunk's sum, or every flush's index entry of the bucket. */
static uint32_t p_checksum_full(rdb *d, MDB_txn *txn, const layout *L, unsigned nb) {
  size_t cap = L->cap;
  uint32_t total = 0;
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, d->ops, &cur)) return 0;
  for (unsigned b = 0; b < nb; b++) {
    uint64_t id = r_bucket_id(d, txn, b);
    unsigned char k[16];
    MDB_val key = {16, k}, val;
    uint32_t ck = 0;
    int mrc;
    if (cap == LOG || L->every) { /* c+k: its chunks' sums added below */
      for (uint64_t f = g_log_from, nf = log_flushes(); f <= nf; f++) {
        ixkey(k, f, id);
        if (mdb_get(txn, d->params, &key, &val) == 0)
          ck += gle32((unsigned char *)val.mv_data + 12);
      }
    }
    if (cap == LOG) {
      total += ck;
      continue;
    }
    opkey(k, id, 0);
    for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && gbe64(key.mv_data) == id;
         mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT))
      ck += gle32((const unsigned char *)val.mv_data + (cap ? 4 : 1));
    total += ck;
  }
  mdb_cursor_close(cur);
  return total;
}

/* The checksums of the packed ops of [p, end) above cp. */
static uint32_t sum_above(int enc, const unsigned char *p, const unsigned char *end, uint64_t cp) {
  char sk[BS_SUBKEY_SIZE];
  uint64_t op = 0;
  uint32_t ck = 0;
  dstate st = {0};
  bs_op o;
  while (body_next(enc, &p, end, &op, &o, &st, sk))
    if (op > cp) ck += o.checksum;
  return ck;
}

/* Chunks and log: bucket b's checksum at cp, the running state minus the chunks (index entries)
 * above cp, the one that holds cp decoded for its ops above cp; as r_checksum does with op
 * records. */
static void chunk_checksum(rdb *d, MDB_txn *txn, MDB_cursor *cur, const layout *L, unsigned b,
                           uint64_t cp, uint32_t *ck) {
  size_t cap = L->cap;
  unsigned char k[16];
  MDB_val key = {8, k}, val;
  uint64_t id = r_bucket_id(d, txn, b);
  int mrc;
  *ck = 0;
  be64(k, id);
  if (!id || mdb_get(txn, d->bstate, &key, &val) || val.mv_size < 96) return;
  *ck = gle32((unsigned char *)val.mv_data + 4);
  if (gle64((unsigned char *)val.mv_data + 24) <= cp) return;
  if (cap == LOG || L->every) { /* c+k: then the chunks below the log */
    for (uint64_t f = log_flushes(); f >= g_log_from; f--) {
      const unsigned char *ix, *p, *end;
      if (!log_entry(d, txn, f, id, &ix, &p, &end)) continue;
      if (gle64(ix + 24) <= cp) break;
      *ck -= gle64(ix + 16) > cp ? gle32(ix + 12) : sum_above(ENC_PLAIN, p, end, cp);
    }
    if (cap == LOG) return;
  }
  opkey(k, id, cp + 1);
  key.mv_size = 16;
  key.mv_data = k;
  for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && gbe64(key.mv_data) == id;
       mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
    const unsigned char *p = val.mv_data, *body = p + CH_HDR;
    size_t bn = val.mv_size - CH_HDR;
    if (gle64(p + 8) > cp) {
      *ck -= gle32(p + 4);
      continue;
    }
#ifdef BS_BENCH_ZSTD
    if (L->enc == ENC_ZSTD) {
      if ((bn = z_body(p, val.mv_size)) == (size_t)-1) return;
      body = g_zbuf;
    }
#endif
    *ck -= sum_above(L->enc == ENC_ZSTD ? ENC_PLAIN : L->enc, body, body + bn, cp);
  }
}

static uint32_t p_checksum_at(rdb *d, MDB_txn *txn, const layout *L, unsigned nb, uint64_t cp) {
  uint32_t total = 0, ck;
  uint64_t count;
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, d->ops, &cur)) return 0;
  for (unsigned b = 0; b < nb; b++) {
    if (L->cap)
      chunk_checksum(d, txn, cur, L, b, cp, &ck);
    else
      r_checksum(d, txn, cur, b, cp, &ck, &count);
    total += ck;
  }
  mdb_cursor_close(cur);
  return total;
}

/* The best of three warm passes (the first pass before them warms the map). */
#define PASSES 3

static int p_measure(rdb *d, const layout *L, unsigned nb, pstat *ps) {
  uint64_t cp = g_cfg->rows, mid = g_cfg->rows - g_cfg->commit_rows / 2;
  char name[64];
  MDB_txn *txn;
  phand warm = {0, 0, 0, 0};
  if (p_reads(d, L, nb, cp, &warm)) return -1;
  ps->read_s = ps->ck_s = ps->ckcp_s = 1e30;
  CALLGRIND_ZERO_STATS;
  for (int i = 0; i < PASSES; i++) {
    phand pr = {0, 0, 0, 0};
    double t0 = now_s(), t;
    if (p_reads(d, L, nb, cp, &pr)) return -1;
    if ((t = now_s() - t0) < ps->read_s) ps->read_s = t;
    ps->read_ops = pr.ops;
    ps->read_bytes = pr.bytes;
    ps->read_sum = pr.sum;
    ps->read_skh = pr.skh;
  }
  snprintf(name, sizeof name, "%s, reads", L->name);
  CALLGRIND_DUMP_STATS_AT(name);
  for (int i = 0; i < PASSES; i++) {
    double t0 = now_s(), t;
    if (mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn)) return -1;
    ps->ck_sum = p_checksum_full(d, txn, L, nb);
    if ((t = now_s() - t0) < ps->ck_s) ps->ck_s = t;
    t0 = now_s();
    ps->ckcp_sum = p_checksum_at(d, txn, L, nb, mid);
    if ((t = now_s() - t0) < ps->ckcp_s) ps->ckcp_s = t;
    mdb_txn_abort(txn);
  }
  ps->ck_buckets = nb;
  return 0;
}

static void p_run(const layout *L, unsigned nb, pstat *ps) {
  char name[64];
  bres r; /* r_open reports into it */
  rdb d;
  int mrc;
  memset(ps, 0, sizeof *ps);
  snprintf(name, sizeof name, "proto%u.%zu", nb, L->cap);
  if (r_open(&d, name, 0, 1, &r)) {
    fprintf(stderr, "bsbench --proto: %s\n", r.note);
    ps->failed = 1;
    return;
  }
  if ((mrc = p_ingest(&d, L, nb, ps)) || p_measure(&d, L, nb, ps)) {
    fprintf(stderr, "bsbench --proto: %s, %u buckets: %s\n", L->name, nb,
            mrc ? mdb_strerror(mrc) : "reads failed");
    ps->failed = 1;
  }
  r_close(&d);
  unlink(d.path);
  strncat(d.path, "-lock", sizeof d.path - strlen(d.path) - 1);
  unlink(d.path);
}

static void p_print(unsigned nb, const pstat *ps) {
  const bench_cfg *c = g_cfg;
  double commits = (double)((c->rows + c->commit_rows - 1) / c->commit_rows), n = (double)c->rows;
  const pstat *a = &ps[0];
  printf("\n%u buckets, %llu rows, a durable commit per %llu rows (x a: ratio to layout a)\n", nb,
         (unsigned long long)c->rows, (unsigned long long)c->commit_rows);
  printf("%-22s %15s %7s %8s %9s %6s %6s %6s %8s %15s %15s %13s\n", "layout", "ingest rows/s",
         "cpu us", "KiB/cmt", "wb KiB/c", "B/op", "opsB", "srcB", "records", "reads ops/s",
         "ck full us/bk", "ck@cp us/bk");
  for (size_t i = 0; i < NLAYOUTS; i++) {
    const pstat *p = &ps[i];
    if (!(g_layouts[i].set & g_cfg->proto)) continue;
    if (p->failed) {
      printf("%-22s FAILED\n", g_layouts[i].name);
      continue;
    }
    printf("%-22s %8.0fk %4.2fx %7.2f %8.0f %9.0f %6.0f %6.0f %6.0f %8.0f %8.2fM %4.2fx %7.1f "
           "%5.2fx %6.1f %5.2fx\n",
           g_layouts[i].name, n / p->ingest_s / 1e3, a->ingest_s / p->ingest_s, p->cpu_s / n * 1e6,
           p->wchar / commits / 1024, p->write_bytes / commits / 1024, p->file / n,
           p->ops_bytes / n, p->src_bytes / n, p->chunks, (double)p->read_ops / p->read_s / 1e6,
           a->read_s / p->read_s, p->ck_s / nb * 1e6, a->ck_s / p->ck_s, p->ckcp_s / nb * 1e6,
           a->ckcp_s / p->ckcp_s);
  }
  for (size_t i = 0; i < NLAYOUTS; i++) {
    const pstat *p = &ps[i];
    if (!(g_layouts[i].set & g_cfg->proto) || p->failed || !g_layouts[i].every) continue;
    printf("  %s: its compactions took %.2f s of the ingest's %.2f s (%.0f%%), CPU %.2f us a row, "
           "wrote %.0f KiB a commit\n",
           g_layouts[i].name, p->compact_s, p->ingest_s, 100 * p->compact_s / p->ingest_s,
           p->compact_cpu / n * 1e6, p->compact_wchar / commits / 1024);
  }
}

/* Layouts a and b side by side, their hand-outs cross-checked. Returns the number of failures. */
int proto_layouts(void) {
  unsigned sizes[2] = {g_cfg->buckets_small, g_cfg->buckets_large};
  int bad = 0;
  printf("%s (not the file format); reads and checksums: best of %d warm passes\n",
         g_cfg->proto == 2 ? "op encodings in chunks" : "layout prototypes", PASSES);
  for (int s = 0; s < 2; s++) {
    pstat ps[NLAYOUTS];
    for (size_t i = 0; i < NLAYOUTS; i++) {
      if (!(g_layouts[i].set & g_cfg->proto)) continue;
      p_run(&g_layouts[i], sizes[s], &ps[i]);
      bad += ps[i].failed;
      if (!ps[i].failed && !ps[0].failed &&
          (ps[i].read_ops != ps[0].read_ops || ps[i].read_bytes != ps[0].read_bytes ||
           ps[i].read_skh != ps[0].read_skh || ps[i].read_sum != ps[0].read_sum ||
           ps[i].ck_sum != ps[0].ck_sum || ps[i].ckcp_sum != ps[0].ckcp_sum ||
           ps[i].ck_sum != ps[i].read_sum || ps[i].read_ops != g_cfg->rows)) {
        fprintf(stderr, "bsbench --proto: %s, %u buckets: the hand-outs differ from layout a\n",
                g_layouts[i].name, sizes[s]);
        bad++;
      }
    }
    p_print(sizes[s], ps);
  }
  printf("\ncolumns: cpu us = CPU (user + sys) per row of the ingest; KiB/cmt = /proc/self/io "
         "wchar per commit (what LMDB wrote: 4 KiB pages); wb KiB/c = write_bytes per commit; "
         "B/op = file size / ops; opsB, srcB = bytes of the pages of the op trees (c: log and "
         "index) and of the source tree (mdb_stat) / ops; records = op records, chunks or index "
         "entries; ck full = a bucket's checksum at the latest op summed from every op (a), "
         "chunk header (b) or index entry (c); ck@cp = at a checkpoint half a commit below the "
         "head, the bucket state minus the ops (chunks, entries) above it\n");
  return bad;
}
