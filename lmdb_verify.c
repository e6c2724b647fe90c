/*
 * lmdb_verify.c: bs_db_verify on the LMDB backend. One read transaction over the whole file;
 * every inconsistency is a problem passed to the caller (naming the bucket, and the op id where
 * one op is at fault) and counted, never the call's failure: only an LMDB/OS error or a failed
 * allocation ends it. Every key and value is bounds-checked before it is used, so a damaged file
 * yields problems, not a crash. What is checked:
 *  - meta: the format record, the bucket sequence, each stream record (decodes, checkpoint not
 *    above the op head, a known hash mode);
 *  - buckets and bstate: every name maps to an id whose state names it back;
 *  - every op of every bucket decodes (the op layout, lmdb_internal.h), and against the state
 *    the rules of verify.c (the op shapes, checksums and running values every backend checks);
 *  - source records: their table id names a tables entry of their stream, and every membership
 *    is a PUT of that bucket with the record's subkey;
 *  - the key and value shapes of the other sub-databases.
 * A stream whose clear is pending (its fence set, lmdb_write.c) holds only records that every
 * reader takes as deleted, some already deleted: they are not checked, and a note (not a
 * problem) says so.
 * Beyond reach: a MOVE's or CLEAR's target_op inside its bounds, and a REMOVE's object_type and
 * object_id (its checksum covers the subkey only), which no other record repeats.
 */
#include "lmdb_internal.h"

#include <inttypes.h>
#include <stdio.h>

/* ---- The verifier ------------------------------------------------------------------------------- */

typedef struct verifier {
  bs__verify v;
  bs__lmdb_db *db;
  MDB_txn *txn;
  int mdb_error;     /* set by a check that hit an LMDB error (not a problem of the file) */
  uint32_t *pending; /* streams whose clear is pending, in id order (meta's) */
  size_t n_pending, cap_pending;
  int failed; /* set by a check that failed otherwise (a BS code, the message in *err) */
  bs_error *err;
  uint32_t t_stream, t_id; /* the table of the last source record (records come in key order) */
  int t_known;
  bs__lmdb_opc oc; /* the ops, for the whole verify */
  bs__vbucket *b;  /* the bucket whose ops verify_states walks */
} verifier;

/* Whether stream's records are a pending clear's, not checked. */
static int pending(const verifier *vf, uint32_t stream) {
  for (size_t i = 0; i < vf->n_pending; i++)
    if (vf->pending[i] == stream) return 1;
  return 0;
}

#define problem(vf, ...) bs__verify_problem(&(vf)->v, __VA_ARGS__)

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
      if (bs__verify_stream_add(&vf->v, id, rec.op_head, rec.checkpoint, rec.hash) ||
          (rec.clear_pending &&
           BS_GROW(vf->v.a, vf->pending, vf->cap_pending, vf->n_pending + 1))) {
        mdb_cursor_close(cur);
        return bs__fail(err, BS_ENOMEM, "verify: stream list");
      }
      if (rec.clear_pending) {
        char note[128];
        vf->pending[vf->n_pending++] = id;
        snprintf(note, sizeof note,
                 "stream %" PRIu32 ": a clear is pending (not a problem): its records are "
                 "deleted, the next read-write open removes them",
                 id);
        if (vf->v.fn) vf->v.fn(note, vf->v.payload);
      }
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
    if (pending(vf, stream)) continue;
    if (!bs__verify_stream(&vf->v, stream))
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

static void ops_op(void *payload, const bs_op *op, uint64_t payload_bytes) {
  verifier *vf = payload;
  bs__verify_op(&vf->v, vf->b, op, payload_bytes);
}

/* An op of vf->b that does not decode (what says which), or bucket id has ops but no state
 * (what NULL), or a key of no bucket (bucket 0, what). */
static void ops_bad(void *payload, uint64_t bucket, const char *what) {
  verifier *vf = payload;
  bs__vbucket *b = vf->b;
  if (!what) {
    problem(vf, "ops of bucket id %" PRIu64 " without a bucket state", bucket);
  } else if (b && b->id == bucket) {
    b->n_bad++;
    problem(vf, "bucket \"%.*s\" (id %" PRIu64 "): %s", bs__name_shown(b->name),
            (const char *)b->name.data, b->id, what);
  } else {
    problem(vf, "%s", what);
  }
}

/* The buckets entry of a state's (stream, name) must point back at the state's id. */
static int check_name_entry(verifier *vf, uint64_t id, const bs__bucket_state *s, bs_error *err) {
  unsigned char kb[BS_BUCKET_KEY_MAX];
  MDB_val k, v;
  uint64_t got = 0;
  int mrc;
  if (s->name.size == 0 || bs__lmdb_bucket_key(kb, s->stream, s->name, &k, NULL))
    return BS_OK; /* a name of no bucket: bs__verify_bucket_end reports it */
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
  MDB_cursor *sc = NULL;
  MDB_val k, v;
  bs__lmdb_ops_check chk = {ops_op, ops_bad, vf};
  int rc, mrc;
  uint64_t expect_next = 0; /* ops of ids below this were already consumed */

  if ((rc = cursor_open(vf, vf->db->bstate, &sc, err)) != 0) goto done;
  for (mrc = mdb_cursor_get(sc, &k, &v, MDB_FIRST); mrc == 0;
       mrc = mdb_cursor_get(sc, &k, &v, MDB_NEXT)) {
    bs__bucket_state s;
    uint64_t id;
    if (k.mv_size != 8 || bs__bucket_state_decode(&v, &s)) {
      problem(vf, "bstate: malformed entry (key %zu bytes, value %zu bytes)", k.mv_size, v.mv_size);
      continue;
    }
    id = bs__get_u64be((const unsigned char *)k.mv_data);
    if (pending(vf, s.stream)) { /* its ops go before its state: none is an orphan */
      if ((rc = bs__lmdb_ops_orphans(&vf->oc, expect_next, id, &chk, err)) != 0) goto done;
      expect_next = id + 1;
      continue;
    }
    bs__vbucket b = {.name = s.name,
                     .id = id,
                     .stream_id = s.stream,
                     .stream = bs__verify_stream(&vf->v, s.stream),
                     .has_state = 1,
                     .checksum = s.checksum,
                     .count = s.count,
                     .bytes = s.bytes,
                     .last_op = s.last_op,
                     .clear_start = s.clear_start,
                     .clear_op = s.clear_op,
                     .header = BS_OP_HEADER_SIZE};
    if ((rc = bs__lmdb_ops_orphans(&vf->oc, expect_next, id, &chk, err)) != 0) goto done;
    vf->b = &b;
    rc = bs__lmdb_ops_verify(&vf->oc, id, &chk, err);
    vf->b = NULL;
    if (rc != 0) goto done;
    bs__verify_bucket_end(&vf->v, &b);
    if ((rc = check_name_entry(vf, id, &s, err)) != 0) goto done;
    expect_next = id + 1;
  }
  if ((rc = walk_end(mrc, err)) != 0) goto done;
  rc = bs__lmdb_ops_orphans(&vf->oc, expect_next, UINT64_MAX, &chk, err);
done:
  if (sc) mdb_cursor_close(sc);
  return rc;
}

/* ---- Verify: key and value shapes of the other sub-databases -------------------------------- */

/* A check of one entry of a sub-database (verify_each) returns BS_ECORRUPT when it does not
 * decode (verify_each reports it), 1 when *stream names the entry's stream (which verify_each
 * checks), else 0 (the check reported what it found). */
typedef int check_fn(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream);

static int check_table(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  uint32_t id;
  bs_val name;
  BS_UNUSED(vf);
  return bs__lmdb_table_entry_decode(k, v, stream, &name, &id) ? BS_ECORRUPT : 1;
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
  bs__bucket_state s;
  bs_op op;
  bs_error e;
  int found, mrc, rc;
  bs_val want = {m->subkey, BS_SUBKEY_SIZE};
  const char *what = NULL;
  rc = bs__lmdb_opc_get(&vf->oc, bucket, op_id, &op, &found, &e);
  if (rc == BS_ECORRUPT) return 0; /* reported with the bucket's ops */
  if (rc != BS_OK) {
    *vf->err = e;
    return vf->failed = rc;
  }
  if (!found)
    what = "no such op";
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

/* A source record's table id names a tables entry of its stream: a type code 0 stands for that
 * table's name (lmdb_codec.c). Reported once a table: its records come one after the other. */
static void check_source_table(verifier *vf, uint32_t stream, uint32_t table) {
  bs_val name;
  int rc;
  if (vf->t_known && vf->t_stream == stream && vf->t_id == table) return;
  vf->t_stream = stream;
  vf->t_id = table;
  vf->t_known = 1;
  rc = bs__lmdb_table_name(vf->db, vf->txn, stream, table, &name, vf->err);
  if (rc == BS_ENOTFOUND)
    problem(vf,
            "source: records of table %" PRIu32 " of stream %" PRIu32
            ", which no tables entry names",
            table, stream);
  else if (rc != BS_OK)
    vf->failed = rc;
}

static int check_source(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  member_ctx m;
  bs_val rid;
  if (bs__lmdb_source_key_decode(k, stream, &m.table, &rid)) return BS_ECORRUPT;
  if (pending(vf, *stream)) return 1;
  check_source_table(vf, *stream, m.table);
  m.vf = vf;
  bs_subkey(m.subkey, m.table, rid);
  if (bs__lmdb_srec_members(v, check_member, &m) == BS_ECORRUPT)
    problem(vf, "source: record of table %" PRIu32 " (value of %zu bytes) does not decode", m.table,
            v->mv_size);
  return 1;
}

static int check_param(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  const bs__vstream *sh;
  bs_val lookup, rid;
  uint32_t n_rows;
  uint64_t op;
  if (bs__lmdb_param_key_decode(k, stream, &lookup, &op) ||
      bs__lmdb_param_value_decode(v, &rid, &n_rows, NULL) != BS_OK)
    return BS_ECORRUPT;
  if ((sh = bs__verify_stream(&vf->v, *stream)) && (op == 0 || op > sh->op_head))
    problem(vf, "params: entry with op id %" PRIu64 " (stream %" PRIu32 " op head %" PRIu64 ")", op,
            sh->id, sh->op_head);
  return 1;
}

static int check_change(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  bs__change_rec r;
  BS_UNUSED(vf);
  if (bs__lmdb_change_decode(k, v, &r)) return BS_ECORRUPT;
  *stream = r.stream;
  return 1;
}

static int check_wcp(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  bs__wcp_key wk;
  bs__wcp_rec r;
  uint64_t id;
  int64_t at;
  if (bs__lmdb_wcp_key_decode(k, &wk)) return BS_ECORRUPT;
  if (wk.tag == BS_WCP_MANAGED_TAG   ? bs__lmdb_wcp_rec_decode(v, &r)
      : wk.tag == BS_WCP_PENDING_TAG ? v->mv_size != 0
      : wk.tag == BS_WCP_HWM_TAG     ? bs__lmdb_wcp_hwm_decode(v, &id)
                                     : bs__lmdb_wcp_custom_decode(v, &id, &at)) {
    problem(vf, "wcp: the '%c' entry of user \"%.*s\" has a malformed value of %zu bytes", wk.tag,
            bs__name_shown(wk.user), (const char *)wk.user.data, v->mv_size);
    return 0;
  }
  *stream = wk.stream;
  return wk.tag == BS_WCP_CUSTOM_TAG; /* custom entries belong to a stream */
}

static int check_superseded(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  uint64_t bucket, old_op, new_op;
  BS_UNUSED(vf);
  BS_UNUSED(stream);
  return bs__lmdb_sup_decode(k, v, &bucket, &old_op, &new_op) ? BS_ECORRUPT : 0;
}

static int check_softdel(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  unsigned char sk[BS_SOFTDEL_KEY_MAX - 8];
  MDB_val src;
  uint64_t mark;
  BS_UNUSED(vf);
  return bs__lmdb_softdel_decode(k, v, stream, &mark, sk, &src) ? BS_ECORRUPT : 1;
}

static int check_cqueue(verifier *vf, const MDB_val *k, const MDB_val *v, uint32_t *stream) {
  uint64_t bucket;
  BS_UNUSED(vf);
  return bs__lmdb_cqueue_decode(k, v, stream, &bucket) ? BS_ECORRUPT : 1;
}

static int verify_each(verifier *vf, MDB_dbi dbi, const char *name, check_fn *check,
                       bs_error *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  int rc, mrc;
  if ((rc = cursor_open(vf, dbi, &cur, err)) != 0) return rc;
  for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0 && !vf->mdb_error && !vf->failed;
       mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    uint32_t stream = 0;
    int got = check(vf, &k, &v, &stream);
    if (got < 0)
      problem(vf, "%s: malformed entry (key %zu bytes, value %zu bytes)", name, k.mv_size,
              v.mv_size);
    else if (got && !bs__verify_stream(&vf->v, stream))
      problem(vf, "%s: entry of unknown stream %" PRIu32, name, stream);
  }
  mdb_cursor_close(cur);
  if (vf->failed) return vf->failed;
  return walk_end(vf->mdb_error ? vf->mdb_error : mrc, err);
}

int bs__lmdb_verify(uint64_t *problems, bs_db *base, void (*fn)(const char *, void *),
                    void *payload, bs_error *err) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  verifier vf;
  uint64_t seq_bucket;
  int rc;

  memset(&vf, 0, sizeof vf);
  vf.db = db;
  vf.err = err;
  vf.v.a = &db->base.alloc;
  vf.v.fn = fn;
  vf.v.payload = payload;
  if ((rc = bs__lmdb_txn_begin(db, MDB_RDONLY, &vf.txn, err)) != 0) return rc;
  if ((rc = bs__lmdb_opc_open(&vf.oc, db, vf.txn, err)) != 0 ||
      (rc = verify_meta(&vf, &seq_bucket, err)) != 0 ||
      (rc = verify_bucket_names(&vf, seq_bucket, err)) != 0 ||
      (rc = verify_states(&vf, err)) != 0 ||
      (rc = verify_each(&vf, db->tables, "tables", check_table, err)) != 0 ||
      (rc = verify_each(&vf, db->source, "source", check_source, err)) != 0 ||
      (rc = verify_each(&vf, db->params, "params", check_param, err)) != 0 ||
      (rc = verify_each(&vf, db->changes, "changes", check_change, err)) != 0 ||
      (rc = verify_each(&vf, db->wcp, "wcp", check_wcp, err)) != 0 ||
      (rc = verify_each(&vf, db->superseded, "superseded", check_superseded, err)) != 0 ||
      (rc = verify_each(&vf, db->cqueue, "cqueue", check_cqueue, err)) != 0 ||
      (rc = verify_each(&vf, db->softdel, "softdel", check_softdel, err)) != 0)
    goto done;
done:
  bs__lmdb_opc_close(&vf.oc);
  bs__lmdb_txn_abort(db, vf.txn);
  bs__free(vf.v.a, vf.v.streams);
  bs__free(vf.v.a, vf.pending);
  if (problems) *problems = vf.v.problems;
  return rc;
}
