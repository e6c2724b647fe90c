/*
 * lmdb_verify.c: bs_db_verify on the LMDB backend. One read transaction over the whole file;
 * every inconsistency is a problem passed to the caller (naming the bucket, and the op id where
 * one op is at fault) and counted, never the call's failure: only an LMDB/OS error or a failed
 * allocation ends it. Every key and value is bounds-checked before it is used, so a damaged file
 * yields problems, not a crash. What is checked:
 *  - meta: the format record, the bucket sequence, each stream record (decodes, checkpoint not
 *    above the op head, a known hash mode);
 *  - buckets and bstate: every name maps to an id whose state names it back;
 *  - every op of every bucket against the op layout (lmdb_internal.h) and contract.md 3: PUT and REMOVE
 *    checksums recomputed from the payload (PUT: object_type, object_id, data; REMOVE: the
 *    subkey) with the stream's hash; subkeys of their fixed shape; MOVE and CLEAR header-only;
 *    target_op within its bounds; a CLEAR only as the first op, where the state's CLEAR span
 *    ends; and the state's running checksum, count, bytes and last op equal to the ops' (the
 *    only check a MOVE's or CLEAR's checksum can get: their payload is gone);
 *  - source records: every membership is a PUT of that bucket with the record's subkey;
 *  - the key and value shapes of the other sub-databases.
 * Beyond reach: a MOVE's or CLEAR's target_op inside its bounds, and a REMOVE's object_type and
 * object_id (its checksum covers the subkey only), which no other record repeats.
 */
#include "lmdb_internal.h"

#include <inttypes.h>
#include <stdio.h>

/* ---- The verifier ------------------------------------------------------------------------------- */

typedef struct stream_head {
  uint32_t id;
  uint64_t op_head;
  bs_hash hash;
  int hash_known; /* 0: the record names no hash this build knows: checksums not recomputed */
} stream_head;

typedef struct verifier {
  bs__lmdb_db *db;
  MDB_txn *txn;
  const bs_allocator *a;
  void (*fn)(const char *, void *);
  void *payload;
  uint64_t problems;
  stream_head *streams;
  size_t n_streams, cap_streams;
  int mdb_error; /* set by a check that hit an LMDB error (not a problem of the file) */
} verifier;

static void problem(verifier *vf, const char *fmt, ...) BS_PRINTF(2, 3);
static void problem(verifier *vf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bs__verify_problem(&vf->problems, vf->fn, vf->payload, fmt, ap);
  va_end(ap);
}

static const stream_head *find_stream(const verifier *vf, uint32_t id) {
  for (size_t i = 0; i < vf->n_streams; i++)
    if (vf->streams[i].id == id) return &vf->streams[i];
  return NULL;
}

static int cursor_open(verifier *vf, MDB_dbi dbi, MDB_cursor **cur, bs_error *err) {
  int rc = mdb_cursor_open(vf->txn, dbi, cur);
  return rc ? bs__fail_mdb(err, rc, "verify: opening a cursor") : BS_OK;
}

static int walk_end(int mrc, bs_error *err) {
  return mrc == MDB_NOTFOUND || mrc == 0 ? BS_OK : bs__fail_mdb(err, mrc, "verify");
}

/* meta: format tag, bucket sequence, stream records (collected for the later checks). */
static int verify_meta(verifier *vf, uint64_t *seq_bucket, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k, v, fk = bs__lmdb_format_key(), sk = bs__lmdb_seq_key();
  bs_val format = {fk.mv_data, fk.mv_size}, seq = {sk.mv_data, sk.mv_size};
  int rc, mrc, have_format = 0;

  *seq_bucket = UINT64_MAX; /* unknown: no check */
  if ((rc = cursor_open(vf, vf->db->meta, &cur, err)) != 0) return rc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs_val key = {k.mv_data, k.mv_size};
    uint32_t id;
    uint32_t version;
    if (bs__val_eq(key, format)) {
      have_format = 1;
      if (bs__lmdb_format_decode(&v, &version))
        problem(vf, "meta \"format\": bad value (%zu bytes)", v.mv_size);
    } else if (bs__val_eq(key, seq)) {
      if (bs__lmdb_bucket_id_decode(&v, seq_bucket, NULL))
        problem(vf, "meta \"seq.bucket\": value of %zu bytes", v.mv_size);
    } else if (bs__lmdb_stream_key_decode(&k, &id) == BS_OK) {
      bs__stream_rec rec;
      if (bs__stream_rec_decode(&v, &rec) != BS_OK) {
        problem(vf, "stream %" PRIu32 ": record of %zu bytes does not decode", id, v.mv_size);
        continue;
      }
      if (rec.hash != BS_HASH_XXH3 && rec.hash != BS_HASH_SHA256)
        problem(vf, "stream %" PRIu32 ": unknown hash mode %u", id, (unsigned)rec.hash);
      if (rec.checkpoint > rec.op_head)
        problem(vf, "stream %" PRIu32 ": checkpoint %" PRIu64 " above op head %" PRIu64, id,
                rec.checkpoint, rec.op_head);
      if (BS_GROW(vf->a, vf->streams, vf->cap_streams, vf->n_streams + 1)) {
        mdb_cursor_close(cur);
        return bs__fail(err, BS_ENOMEM, "verify: stream list");
      }
      vf->streams[vf->n_streams].id = id;
      vf->streams[vf->n_streams].op_head = rec.op_head;
      vf->streams[vf->n_streams].hash = (bs_hash)rec.hash;
      vf->streams[vf->n_streams++].hash_known =
          rec.hash == BS_HASH_XXH3 || rec.hash == BS_HASH_SHA256;
    } else {
      problem(vf, "meta: unknown key of %zu bytes", k.mv_size);
    }
  }
  mdb_cursor_close(cur);
  if ((rc = walk_end(mrc, err)) != 0) return rc;
  if (!have_format) problem(vf, "meta: no \"format\" record");
  return BS_OK;
}

/* The state of bucket id (*found 0: none; a state that does not decode: zeroed); an LMDB
 * status. */
static int state_of(verifier *vf, uint64_t id, bs__bucket_state *s, int *found) {
  unsigned char kb[BS_STATE_KEY_SIZE];
  MDB_val k = {sizeof kb, kb}, v;
  int mrc;
  memset(s, 0, sizeof *s);
  bs__lmdb_state_key(kb, id);
  mrc = mdb_get(vf->txn, vf->db->bstate, &k, &v);
  *found = mrc == 0;
  if (mrc == 0 && bs__bucket_state_decode(&v, s)) memset(s, 0, sizeof *s);
  return mrc == MDB_NOTFOUND ? 0 : mrc;
}

/* buckets: name -> id must match the state's stream and name. */
static int verify_bucket_names(verifier *vf, uint64_t seq_bucket, bs_error *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  int rc, mrc;

  if ((rc = cursor_open(vf, vf->db->buckets, &cur, err)) != 0) return rc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs_val name;
    uint64_t id;
    uint32_t stream;
    bs__bucket_state s;
    int found;
    if (bs__lmdb_bucket_entry_decode(&k, &v, &stream, &name, &id)) {
      problem(vf, "buckets: malformed entry (key %zu bytes, value %zu bytes)", k.mv_size,
              v.mv_size);
      continue;
    }
    if (!find_stream(vf, stream))
      problem(vf, "bucket \"%.*s\": unknown stream %" PRIu32, bs__name_shown(name),
              (const char *)name.data, stream);
    if (id == 0 || id > seq_bucket)
      problem(vf, "bucket \"%.*s\": id %" PRIu64 " outside the bucket sequence",
              bs__name_shown(name), (const char *)name.data, id);
    if ((mrc = state_of(vf, id, &s, &found))) break;
    if (!found) {
      problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): no bucket state", bs__name_shown(name),
              (const char *)name.data, id);
      continue;
    }
    if (!s.name.data) continue; /* does not decode: reported by verify_states */
    if (s.stream != stream || !bs__val_eq(s.name, name))
      problem(vf,
              "bucket \"%.*s\" (id %" PRIu64 "): state names stream %" PRIu32 " bucket "
              "\"%.*s\"",
              bs__name_shown(name), (const char *)name.data, id, s.stream, bs__name_shown(s.name),
              (const char *)s.name.data);
  }
  mdb_cursor_close(cur);
  return walk_end(mrc, err);
}

/* Running values recomputed from one bucket's ops. */
typedef struct bucket_sum {
  uint32_t checksum;
  uint64_t count, bytes, last_op, bad_ops;
  uint64_t first_op; /* id of the first op, 0 if none */
  int first_clear;   /* the first op is a CLEAR */
} bucket_sum;

/* A subkey's shape (contract.md 1): 8 lowercase hex digits, '/', 32 lowercase hex digits. */
static int subkey_ok(bs_val sk) {
  const unsigned char *p = sk.data;
  if (sk.size != BS_SUBKEY_SIZE) return 0;
  for (size_t i = 0; i < sk.size; i++)
    if (i == 8 ? p[i] != '/' : !((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
      return 0;
  return 1;
}

/* One decoded op (the index-th of its bucket, raw value v) against the layout and contract.md 3. */
static void check_op(verifier *vf, const bs__bucket_state *s, const stream_head *sh,
                     const MDB_val *v, const bs_op *op, uint64_t index) {
  static const char *const names[] = {"?", "PUT", "REMOVE", "MOVE", "CLEAR"};
  const char *nm = (const char *)s->name.data, *tn = names[op->type];
  int ns = bs__name_shown(s->name);
  size_t rest = v->mv_size - BS_OP_HEADER_SIZE - op->object_type.size - op->object_id.size -
                op->subkey.size; /* the data bytes of a PUT, nothing for the others */
  uint32_t want;
  if (op->op_id == 0) problem(vf, "bucket \"%.*s\": op id 0", ns, nm);
  if (op->type == BS_OP_MOVE || op->type == BS_OP_CLEAR) {
    if (v->mv_size != BS_OP_HEADER_SIZE)
      problem(vf, "bucket \"%.*s\" op %" PRIu64 ": %s with a payload (value of %zu bytes)", ns, nm,
              op->op_id, tn, v->mv_size);
    if (op->type == BS_OP_MOVE ? op->target_op <= op->op_id || op->target_op > s->last_op
                               : op->target_op > s->last_op)
      problem(vf, "bucket \"%.*s\" op %" PRIu64 ": %s has a bad target_op %" PRIu64, ns, nm,
              op->op_id, tn, op->target_op);
    if (op->type == BS_OP_CLEAR && (index != 0 || op->op_id != s->clear_op))
      problem(vf,
              "bucket \"%.*s\" op %" PRIu64 ": a CLEAR that is not the bucket's leading CLEAR "
              "(the state's CLEAR span ends at %" PRIu64 ")",
              ns, nm, op->op_id, s->clear_op);
    return;
  }
  if (op->target_op != 0)
    problem(vf, "bucket \"%.*s\" op %" PRIu64 ": %s has a bad target_op %" PRIu64, ns, nm,
            op->op_id, tn, op->target_op);
  if (!subkey_ok(op->subkey))
    problem(vf, "bucket \"%.*s\" op %" PRIu64 ": %s with a malformed subkey (%zu bytes)", ns, nm,
            op->op_id, tn, op->subkey.size);
  if (op->type == BS_OP_REMOVE && rest != 0)
    problem(vf, "bucket \"%.*s\" op %" PRIu64 ": REMOVE with %zu bytes of data", ns, nm, op->op_id,
            rest);
  if (!sh || !sh->hash_known) return;
  want = op->type == BS_OP_PUT ? bs_checksum_put(sh->hash, op->object_type, op->object_id, op->data)
                               : bs_checksum_remove(sh->hash, op->subkey);
  if (want != op->checksum)
    problem(vf,
            "bucket \"%.*s\" op %" PRIu64 ": %s checksum %" PRIu32 " stored, its payload "
            "hashes to %" PRIu32,
            ns, nm, op->op_id, tn, op->checksum, want);
}

/* Consumes the ops of bucket id (state s) from cur (positioned at or before them). */
static int sum_bucket_ops(verifier *vf, MDB_cursor *cur, uint64_t id, const bs__bucket_state *s,
                          bucket_sum *sum, bs_error *err) {
  const stream_head *sh = find_stream(vf, s->stream);
  unsigned char kb[16];
  MDB_val k = {16, kb}, v;
  int mrc;

  memset(sum, 0, sizeof *sum);
  bs__lmdb_op_key(kb, id, 0);
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); mrc == 0;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    bs_op op;
    if (k.mv_size < 8 || memcmp(k.mv_data, kb, 8) != 0) break;
    if (bs__lmdb_op_decode(&k, &v, &op)) {
      sum->bad_ops++;
      problem(vf,
              "bucket \"%.*s\" (id %" PRIu64 "): op %" PRIu64 " does not decode (key %zu bytes, "
              "value %zu bytes)",
              bs__name_shown(s->name), (const char *)s->name.data, id,
              k.mv_size == 16 ? bs__get_u64be((const unsigned char *)k.mv_data + 8) : 0, k.mv_size,
              v.mv_size);
      continue;
    }
    check_op(vf, s, sh, &v, &op, sum->count + sum->bad_ops);
    if (sum->count + sum->bad_ops == 0) {
      sum->first_op = op.op_id;
      sum->first_clear = op.type == BS_OP_CLEAR;
    }
    sum->checksum = bs__cksum_add(sum->checksum, op.checksum);
    sum->count++;
    sum->bytes += v.mv_size;
    sum->last_op = op.op_id;
  }
  return walk_end(mrc, err);
}

static void compare_state(verifier *vf, uint64_t id, const bs__bucket_state *s,
                          const bucket_sum *sum) {
  const stream_head *sh = find_stream(vf, s->stream);
  const char *nm = (const char *)s->name.data;
  int ns = bs__name_shown(s->name);
  if (!sh)
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): unknown stream %" PRIu32, ns, nm, id, s->stream);
  else if (s->last_op > sh->op_head)
    problem(vf,
            "bucket \"%.*s\" (id %" PRIu64 "): last op %" PRIu64 " above the stream's op "
            "head %" PRIu64,
            ns, nm, id, s->last_op, sh->op_head);
  if (sum->bad_ops) return; /* sums over undecodable ops mean nothing */
  if (s->checksum != sum->checksum)
    problem(vf,
            "bucket \"%.*s\" (id %" PRIu64 "): running checksum %" PRIu32 ", ops sum to %" PRIu32,
            ns, nm, id, s->checksum, sum->checksum);
  if (s->count != sum->count)
    problem(vf,
            "bucket \"%.*s\" (id %" PRIu64 "): running count %" PRIu64 ", %" PRIu64 " ops stored",
            ns, nm, id, s->count, sum->count);
  if (s->bytes != sum->bytes)
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): running bytes %" PRIu64 ", ops hold %" PRIu64,
            ns, nm, id, s->bytes, sum->bytes);
  if (s->last_op != sum->last_op)
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): last op %" PRIu64 ", highest stored op %" PRIu64,
            ns, nm, id, s->last_op, sum->last_op);
  if (s->clear_op > s->last_op || s->clear_start > s->clear_op)
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): bad CLEAR span [%" PRIu64 ", %" PRIu64 "]", ns,
            nm, id, s->clear_start, s->clear_op);
  else if (s->clear_op && !(sum->first_clear && sum->first_op == s->clear_op))
    problem(vf,
            "bucket \"%.*s\" (id %" PRIu64 "): the state's CLEAR span ends at %" PRIu64 ", but "
            "op %" PRIu64 " is the bucket's first op%s",
            ns, nm, id, s->clear_op, sum->first_op, sum->first_clear ? "" : " and no CLEAR");
}

/* Ops of bucket ids in [lo, hi) have no bucket state: one problem per such bucket id. */
static int report_orphans(verifier *vf, MDB_cursor *oc, uint64_t lo, uint64_t hi, bs_error *err) {
  unsigned char kb[16];
  MDB_val k = {16, kb}, v;
  int mrc;
  bs__lmdb_op_key(kb, lo, 0);
  while ((mrc = mdb_cursor_get(oc, &k, &v, MDB_SET_RANGE)) == 0) {
    uint64_t id;
    if (k.mv_size < 8) {
      problem(vf, "ops: key of %zu bytes", k.mv_size);
      return BS_OK;
    }
    id = bs__get_u64be((const unsigned char *)k.mv_data);
    if (id >= hi) break;
    problem(vf, "ops of bucket id %" PRIu64 " without a bucket state", id);
    if (id == UINT64_MAX) break;
    bs__lmdb_op_key(kb, id + 1, 0);
    k.mv_size = 16;
    k.mv_data = kb;
  }
  return walk_end(mrc, err);
}

/* The buckets entry of a state's (stream, name) must point back at the state's id. */
static int check_name_entry(verifier *vf, uint64_t id, const bs__bucket_state *s, bs_error *err) {
  unsigned char kb[BS_BUCKET_KEY_MAX];
  MDB_val k, v;
  uint64_t got = 0;
  int mrc;
  if (s->name.size == 0 || bs__lmdb_bucket_key(kb, s->stream, s->name, &k, NULL)) {
    problem(vf, "bucket id %" PRIu64 ": state holds a name of %zu bytes", id, s->name.size);
    return BS_OK;
  }
  mrc = mdb_get(vf->txn, vf->db->buckets, &k, &v);
  if (mrc == MDB_NOTFOUND || (mrc == 0 && (bs__lmdb_bucket_id_decode(&v, &got, NULL) || got != id)))
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): the name does not map back to this id",
            bs__name_shown(s->name), (const char *)s->name.data, id);
  else if (mrc)
    return bs__fail_mdb(err, mrc, "verify: bucket names");
  return BS_OK;
}

/* bstate against the ops (one merged pass: states and ops are both in bucket-id order). */
static int verify_states(verifier *vf, bs_error *err) {
  MDB_cursor *sc = NULL, *oc = NULL;
  MDB_val k, v;
  int rc, mrc;
  uint64_t expect_next = 0; /* ops of ids below this were already consumed */

  if ((rc = cursor_open(vf, vf->db->bstate, &sc, err)) != 0 ||
      (rc = cursor_open(vf, vf->db->ops, &oc, err)) != 0)
    goto done;
  for (mrc = mdb_cursor_get(sc, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(sc, &k, &v, MDB_NEXT)) {
    bs__bucket_state s;
    bucket_sum sum;
    uint64_t id;
    if (k.mv_size != 8 || bs__bucket_state_decode(&v, &s)) {
      problem(vf, "bstate: malformed entry (key %zu bytes, value %zu bytes)", k.mv_size, v.mv_size);
      continue;
    }
    id = bs__get_u64be((const unsigned char *)k.mv_data);
    if ((rc = report_orphans(vf, oc, expect_next, id, err)) != 0) goto done;
    if ((rc = sum_bucket_ops(vf, oc, id, &s, &sum, err)) != 0) goto done;
    compare_state(vf, id, &s, &sum);
    if ((rc = check_name_entry(vf, id, &s, err)) != 0) goto done;
    expect_next = id + 1;
  }
  if ((rc = walk_end(mrc, err)) != 0) goto done;
  rc = report_orphans(vf, oc, expect_next, UINT64_MAX, err);
done:
  if (sc) mdb_cursor_close(sc);
  if (oc) mdb_cursor_close(oc);
  return rc;
}

/* ---- Verify: key and value shapes of the other sub-databases -------------------------------- */

static void stream_known(verifier *vf, const char *dbname, uint32_t stream) {
  if (!find_stream(vf, stream)) problem(vf, "%s: entry of unknown stream %" PRIu32, dbname, stream);
}

static void check_table(verifier *vf, const MDB_val *k, const MDB_val *v) {
  uint32_t stream, id;
  bs_val name;
  if (bs__lmdb_table_entry_decode(k, v, &stream, &name, &id)) {
    problem(vf, "tables: malformed entry (key %zu bytes, value %zu bytes)", k->mv_size, v->mv_size);
    return;
  }
  stream_known(vf, "tables", stream);
}

/* One membership of a source record: a PUT of that bucket with the record's subkey. */
typedef struct member_ctx {
  verifier *vf;
  char subkey[BS_SUBKEY_SIZE];
  uint32_t table;
} member_ctx;

static int check_member(uint64_t bucket, uint64_t op_id, void *payload) {
  member_ctx *m = payload;
  verifier *vf = m->vf;
  unsigned char kb[16];
  MDB_val k = {16, kb}, v;
  bs__bucket_state s;
  bs_op op;
  int found;
  bs_val want = {m->subkey, BS_SUBKEY_SIZE};
  const char *what = NULL;
  int mrc;
  bs__lmdb_op_key(kb, bucket, op_id);
  mrc = mdb_get(vf->txn, vf->db->ops, &k, &v);
  if (mrc && mrc != MDB_NOTFOUND) return vf->mdb_error = mrc;
  if (mrc)
    what = "no such op";
  else if (bs__lmdb_op_decode(&k, &v, &op) != BS_OK)
    return 0; /* reported with the bucket's ops */
  else if (op.type != BS_OP_PUT)
    what = "not a PUT";
  else if (!bs__val_eq(op.subkey, want))
    what = "its subkey is not the source row's";
  if (!what) return 0;
  if ((mrc = state_of(vf, bucket, &s, &found))) return vf->mdb_error = mrc;
  problem(vf,
          "bucket \"%.*s\" (id %" PRIu64 ") op %" PRIu64
          ": held by a source record of table %" PRIu32 ", but %s",
          bs__name_shown(s.name), s.name.size ? (const char *)s.name.data : "", bucket, op_id,
          m->table, what);
  return 0;
}

static void check_source(verifier *vf, const MDB_val *k, const MDB_val *v) {
  member_ctx m;
  uint32_t stream;
  bs_val rid;
  if (bs__lmdb_source_key_decode(k, &stream, &m.table, &rid)) {
    problem(vf, "source: malformed key of %zu bytes", k->mv_size);
    return;
  }
  stream_known(vf, "source", stream);
  m.vf = vf;
  bs_subkey(m.subkey, m.table, rid);
  if (bs__lmdb_srec_members(v, check_member, &m) == BS_ECORRUPT)
    problem(vf, "source: record of table %" PRIu32 " (value of %zu bytes) does not decode", m.table,
            v->mv_size);
}

static void check_param(verifier *vf, const MDB_val *k, const MDB_val *v) {
  const stream_head *sh;
  bs_val lookup, rid;
  uint32_t stream, n_rows;
  uint64_t op;
  if (bs__lmdb_param_key_decode(k, &stream, &lookup, &op)) {
    problem(vf, "params: malformed key of %zu bytes", k->mv_size);
    return;
  }
  if (bs__lmdb_param_value_decode(v, &rid, &n_rows, NULL) != BS_OK)
    problem(vf, "params: value of %zu bytes does not decode", v->mv_size);
  sh = find_stream(vf, stream);
  if (!sh)
    stream_known(vf, "params", stream);
  else if (op == 0 || op > sh->op_head)
    problem(vf, "params: entry with op id %" PRIu64 " (stream %" PRIu32 " op head %" PRIu64 ")", op,
            sh->id, sh->op_head);
}

static void check_change(verifier *vf, const MDB_val *k, const MDB_val *v) {
  bs__change_rec r;
  if (bs__lmdb_change_decode(k, v, &r)) {
    problem(vf, "changes: record does not decode (key %zu bytes, value %zu bytes)", k->mv_size,
            v->mv_size);
    return;
  }
  stream_known(vf, "changes", r.stream);
}

static void check_wcp(verifier *vf, const MDB_val *k, const MDB_val *v) {
  bs__wcp_key wk;
  bs__wcp_rec r;
  uint64_t id;
  int64_t at;
  if (bs__lmdb_wcp_key_decode(k, &wk)) {
    problem(vf, "wcp: malformed key of %zu bytes", k->mv_size);
  } else if (wk.tag == BS_WCP_MANAGED_TAG   ? bs__lmdb_wcp_rec_decode(v, &r)
             : wk.tag == BS_WCP_PENDING_TAG ? v->mv_size != 0
             : wk.tag == BS_WCP_HWM_TAG     ? bs__lmdb_wcp_hwm_decode(v, &id)
                                            : bs__lmdb_wcp_custom_decode(v, &id, &at)) {
    problem(vf, "wcp: the '%c' entry of user \"%.*s\" has a malformed value of %zu bytes", wk.tag,
            bs__name_shown(wk.user), (const char *)wk.user.data, v->mv_size);
  } else if (wk.tag == BS_WCP_CUSTOM_TAG) { /* custom entries belong to a stream */
    stream_known(vf, "wcp", wk.stream);
  }
}

static void check_superseded(verifier *vf, const MDB_val *k, const MDB_val *v) {
  uint64_t bucket, old_op, new_op;
  if (bs__lmdb_sup_decode(k, v, &bucket, &old_op, &new_op))
    problem(vf, "superseded: malformed entry (key %zu bytes, value %zu bytes)", k->mv_size,
            v->mv_size);
}

static void check_softdel(verifier *vf, const MDB_val *k, const MDB_val *v) {
  unsigned char sk[BS_SOFTDEL_KEY_MAX - 8];
  MDB_val src;
  uint32_t stream;
  uint64_t mark;
  if (bs__lmdb_softdel_decode(k, v, &stream, &mark, sk, &src)) {
    problem(vf, "softdel: malformed entry (key %zu bytes, value %zu bytes)", k->mv_size,
            v->mv_size);
    return;
  }
  stream_known(vf, "softdel", stream);
}

static void check_cqueue(verifier *vf, const MDB_val *k, const MDB_val *v) {
  uint32_t stream;
  uint64_t bucket;
  if (bs__lmdb_cqueue_decode(k, v, &stream, &bucket)) {
    problem(vf, "cqueue: malformed entry (key %zu bytes, value %zu bytes)", k->mv_size, v->mv_size);
    return;
  }
  stream_known(vf, "cqueue", stream);
}

static int verify_each(verifier *vf, MDB_dbi dbi,
                       void (*check)(verifier *, const MDB_val *, const MDB_val *), bs_error *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  int rc, mrc;
  if ((rc = cursor_open(vf, dbi, &cur, err)) != 0) return rc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && !vf->mdb_error;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    check(vf, &k, &v);
  mdb_cursor_close(cur);
  return walk_end(vf->mdb_error ? vf->mdb_error : mrc, err);
}

int bs__lmdb_verify(bs_db *base, void (*fn)(const char *, void *), void *payload,
                    uint64_t *problems, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  verifier vf;
  uint64_t seq_bucket;
  int rc;

  memset(&vf, 0, sizeof vf);
  vf.db = db;
  vf.a = &db->base.alloc;
  vf.fn = fn;
  vf.payload = payload;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &vf.txn, err)) != 0) return rc;
  if ((rc = verify_meta(&vf, &seq_bucket, err)) != 0 ||
      (rc = verify_bucket_names(&vf, seq_bucket, err)) != 0 ||
      (rc = verify_states(&vf, err)) != 0 ||
      (rc = verify_each(&vf, db->tables, check_table, err)) != 0 ||
      (rc = verify_each(&vf, db->source, check_source, err)) != 0 ||
      (rc = verify_each(&vf, db->params, check_param, err)) != 0 ||
      (rc = verify_each(&vf, db->changes, check_change, err)) != 0 ||
      (rc = verify_each(&vf, db->wcp, check_wcp, err)) != 0 ||
      (rc = verify_each(&vf, db->superseded, check_superseded, err)) != 0 ||
      (rc = verify_each(&vf, db->cqueue, check_cqueue, err)) != 0 ||
      (rc = verify_each(&vf, db->softdel, check_softdel, err)) != 0)
    goto done;
done:
  bs__lmdb_txn_abort(db, vf.txn);
  bs__free(vf.a, vf.streams);
  if (problems) *problems = vf.problems;
  return rc;
}
