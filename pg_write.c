/*
 * pg_write.c: the PostgreSQL backend's writer and write checkpoints: the writer's session
 * (advisory locks: one streaming and one snapshot writer per stream across every process and
 * host, else BS_EBUSY), commit (contract.md 4.4: the checkpoint, the stream's activation, the
 * processing of managed write checkpoints, the change record, all in one transaction),
 * snapshot_done and resume_lsn. The write checkpoints of contract.md 7 are pg_wcp.c's.
 */
#include "pg_internal.h"

#include <inttypes.h>
#include <stdlib.h>

static bs__pg_db *db_of(bs_storage *st) {
  return ((bs__pg_storage *)st)->db;
}

/* ---- The writer's session --------------------------------------------------------------------- */

/* The advisory lock of a stream's writers of one kind (pg_internal.h: BS_PG_LOCK_WRITER or
 * _SNAPSHOT), the backend's writer_lock: held by a session of the handle while its writer of
 * that kind is open, so every other handle, process and host gets BS_EBUSY. */
#define WRITER_LOCK_SQL "SELECT pg_try_advisory_lock($1, $2)"

static void arg_lock(bs__pg_args *a, const bs__pg_db *db, const struct bs__pg_lock *l) {
  bs__pg_arg_lock(a, &db->schema, l->stream, l->snapshot ? BS_PG_LOCK_SNAPSHOT : BS_PG_LOCK_WRITER);
}

static struct bs__pg_lock *lock_find(bs__pg_db *db, int32_t key) {
  for (size_t i = 0; i < db->n_locks; i++)
    if (db->locks[i]->key == key) return db->locks[i];
  return NULL;
}

/* Whether l's lock, which c could not take, is held by l's own last session, which was lost (its
 * server process has not noticed yet: a closed socket is found at its next read, a cut network
 * only by keepalives): then that process is ended, waiting up to 10 s for it to exit, and c tries
 * again. The holder must be that very process holding this very lock, so another host's writer
 * is never ended. c tries again whatever the first statement found: a lost session that was
 * already exiting may release the lock between c's first try and that statement (it then finds
 * no holder, or pg_terminate_backend no process), and the lock is free. Any failure here is just
 * "not taken". */
static int lock_retaken(bs__pg_db *db, PGconn *c, struct bs__pg_lock *l) {
  bs__pg_args a = {0};
  PGresult *r;
  int got;
  if (!l->pid) return 0;
  arg_lock(&a, db, l);
  bs__pg_arg_i32(&a, l->pid);
  if (bs__pg_exec(c,
                  "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks WHERE locktype = "
                  "'advisory' AND granted AND pid = $3 AND objsubid = 2 AND classid = $1::oid"
                  " AND objid = $2::oid",
                  &a, &r, "ending the lost writer session", NULL))
    return 0;
  PQclear(r);
  a.n = 2; /* the lock's keys alone: WRITER_LOCK_SQL's arguments */
  if (bs__pg_exec(c, WRITER_LOCK_SQL, &a, &r, "locking the stream's writer", NULL)) return 0;
  got = bs__pg_bool(r, 0, 0);
  PQclear(r);
  return got;
}

/* A new session holding l's advisory lock (l->mu held): BS_EBUSY when another session has it. */
static int session_open(bs__pg_db *db, struct bs__pg_lock *l, bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  PGconn *c;
  int rc, got;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  arg_lock(&a, db, l);
  if ((rc = bs__pg_exec(c, WRITER_LOCK_SQL, &a, &r, "locking the stream's writer", err))) {
    bs__pg_conn_drop(db, c);
    return rc;
  }
  got = bs__pg_bool(r, 0, 0);
  PQclear(r);
  if (!got) got = lock_retaken(db, c, l);
  if (!got) {
    bs__pg_conn_put(db, c);
    return bs__fail(err, BS_EBUSY, "stream %u already has a %s writer in another process or host",
                    (unsigned)l->stream, l->snapshot ? "snapshot" : "streaming");
  }
  bs__pg_conn_detach(db); /* held until the last writer closes */
  l->c = c;
  l->pid = PQbackendPID(c);
  bs__pg_hook(db, "writer.lock", c);
  return BS_OK;
}

/* Ends l's session (l->mu held): unlocked explicitly, as a closed session's locks go only when
 * its server process has exited, a moment after the close, so a writer opened right after would
 * find the lock still held. A session whose unlock failed (the server is gone) is closed, which
 * releases it too. */
static void session_close(bs__pg_db *db, struct bs__pg_lock *l) {
  bs__pg_args a = {0};
  PGresult *r;
  if (!l->c) return;
  bs__pg_hook(db, "writer.unlock", l->c);
  arg_lock(&a, db, l);
  if (PQstatus(l->c) == CONNECTION_OK &&
      bs__pg_exec(l->c, "SELECT pg_advisory_unlock($1, $2)", &a, &r,
                  "unlocking the stream's writer", NULL) == BS_OK) {
    PQclear(r);
    bs__pg_conn_adopt(db, l->c);
  } else {
    PQfinish(l->c);
  }
  l->c = NULL;
}

/* A new lock of the handle, listed (pool_mu held), no session yet; NULL when out of memory. */
static struct bs__pg_lock *lock_new(bs__pg_db *db, int32_t key, uint32_t stream, int snapshot) {
  struct bs__pg_lock *l;
  if (db->n_locks == db->cap_locks) {
    size_t cap = db->cap_locks ? db->cap_locks * 2 : 4;
    struct bs__pg_lock **p = bs__realloc(&db->base.alloc, db->locks, cap * sizeof *p);
    if (!p) return NULL;
    db->locks = p;
    db->cap_locks = cap;
  }
  if (!(l = bs__calloc(&db->base.alloc, 1, sizeof *l))) return NULL;
  if (pthread_mutex_init(&l->mu, NULL)) {
    bs__free(&db->base.alloc, l);
    return NULL;
  }
  l->key = key;
  l->stream = stream;
  l->snapshot = snapshot;
  db->locks[db->n_locks++] = l;
  return l;
}

/* Ends l's session and unlists l. */
static void lock_release(bs__pg_db *db, struct bs__pg_lock *l) {
  pthread_mutex_lock(&l->mu);
  session_close(db, l);
  pthread_mutex_lock(&db->pool_mu);
  for (size_t i = 0; i < db->n_locks; i++)
    if (db->locks[i] == l) {
      db->locks[i] = db->locks[--db->n_locks];
      break;
    }
  pthread_mutex_unlock(&db->pool_mu);
  pthread_mutex_unlock(&l->mu);
  pthread_mutex_destroy(&l->mu);
  bs__free(&db->base.alloc, l);
}

static int32_t lock_key(uint32_t stream, int snapshot) {
  return bs__pg_lock_key(stream, snapshot ? BS_PG_LOCK_SNAPSHOT : BS_PG_LOCK_WRITER);
}

/* The writer lock of (stream, kind): listed from before its session opens until after it ended,
 * so the handle's own writer of that kind is refused (BS_EBUSY) whatever thread asks, as any
 * other handle's. */
int bs__pg_writer_lock(bs_storage *st, int snapshot, int take, bs_error *err) {
  bs__pg_db *db = db_of(st);
  int32_t key = lock_key(st->stream_id, snapshot);
  struct bs__pg_lock *l;
  int rc, held;
  pthread_mutex_lock(&db->pool_mu);
  l = lock_find(db, key);
  if (!(held = l != NULL) && take) l = lock_new(db, key, st->stream_id, snapshot);
  pthread_mutex_unlock(&db->pool_mu);
  if (!take) {
    if (l) lock_release(db, l);
    return BS_OK;
  }
  if (held) return bs__fail(err, BS_EBUSY, "held by this handle");
  if (!l) return bs__fail(err, BS_ENOMEM, "writer: out of memory");
  pthread_mutex_lock(&l->mu);
  rc = session_open(db, l, err);
  pthread_mutex_unlock(&l->mu);
  if (rc) lock_release(db, l);
  return rc;
}

static int stream_state(PGconn *c, uint32_t stream, int *state, bs_error *err) {
  bs__pg_args a = {0};
  PGresult *r;
  int rc;
  *state = 0;
  bs__pg_arg_i32(&a, (int32_t)stream);
  /* the schema version too: a build it is too old for refuses at once */
  rc = bs__pg_exec(c,
                   "SELECT " BS_PG_STREAM_COLS ", (SELECT value FROM bs_meta"
                   " WHERE key = 'schema_version') FROM bs_streams WHERE id = $1",
                   &a, &r, "reading the stream", err);
  if (rc) return rc;
  if (PQntuples(r) != 1)
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", stream);
  else if (!(rc = bs__pg_schema_current(bs__pg_i64(r, 0, BS_PG_STREAM_NCOLS), err)))
    *state = (int)bs__pg_stream_row(r, 0).row.state;
  PQclear(r);
  if (!rc) {
    bs__stream_step step;
    rc = bs__stream_transition(&step, stream, (unsigned)*state, BS__STREAM_WRITE, err);
  }
  return rc;
}

/* ---- The planner's statistics ------------------------------------------------------------------
 * Autovacuum analyzes a table a minute or more after it grew, and until then a table that filled
 * up is planned as nearly empty (a page of bucket data by a bitmap scan of the rest of the bucket
 * and a sort of it on disk, O(bucket) per page). So a writer has the tables it fills analyzed
 * when what it wrote since doubled (the first flush included): O(log n) ANALYZEs of at most 30k
 * sampled rows each. Not in the writer's transaction or session: an ANALYZE of a 150k-op bucket
 * took 0.26 s, the p99 of a commit. After a COMMIT it is sent on a session of the pool and not
 * waited for; the writer collects the session at a later flush or commit, and its close ends a
 * session still analyzing (the server finishes that ANALYZE). One at a time: one that is due
 * while the last still runs waits for the next flush. A failure to start or finish one is not the
 * flush's: statistics are a hint. */

#define ANALYZE_SQL "ANALYZE bs_chunks, bs_source, bs_params, bs_buckets, bs_superseded"

/* Gives the analyzing session back once its ANALYZE has answered (or at once, closing it when it
 * has not: end). */
static void analyze_collect(bs__pg_writer *w, int end) {
  PGconn *c = w->analyzing;
  PGresult *r;
  if (!c) return;
  if (!PQconsumeInput(c) || (PQisBusy(c) && end)) {
    PQfinish(c);
    w->analyzing = NULL;
    return;
  }
  if (PQisBusy(c)) return;
  while ((r = PQgetResult(c)) != NULL) PQclear(r);
  w->analyzing = NULL;
  bs__pg_conn_adopt(w->db, c);
}

/* After a COMMIT: an ANALYZE when what the writer wrote doubled since the last. */
static void analyze_maybe(bs__pg_writer *w) {
  PGconn *c;
  analyze_collect(w, 0);
  if (w->analyzing || w->written == 0 || w->written < w->analyze_at) return;
  if (bs__pg_conn_try(w->db, &c)) return; /* never wait for one: a hint */
  if (!PQsendQuery(c, ANALYZE_SQL)) {
    bs__pg_conn_drop(w->db, c);
    return;
  }
  bs__pg_conn_detach(w->db); /* held until a later call collects it */
  w->analyze_at = 2 * w->written;
  w->analyzing = c;
  bs__pg_hook(w->db, "analyze", c);
}

static const bs_writer_vtable pg_writer_vt;

int bs__pg_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *o, bs_error *err) {
  bs__pg_db *db = db_of(st);
  struct bs__pg_lock *l = NULL;
  bs__pg_writer *w;
  PGconn *c;
  int rc, state;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  rc = stream_state(c, st->stream_id, &state, err);
  bs__pg_conn_put(db, c);
  if (rc) return rc;
  if (!(w = bs__calloc(&db->base.alloc, 1, sizeof *w)))
    return bs__fail(err, BS_ENOMEM, "writer: out of memory");
  pthread_mutex_lock(&db->pool_mu);
  l = lock_find(db, lock_key(st->stream_id, o->snapshot)); /* the front took it */
  pthread_mutex_unlock(&db->pool_mu);
  BS_ASSERT(l);
  w->base.vt = &pg_writer_vt;
  w->base.st = st;
  w->db = db;
  w->lock = l;
  w->snapshot = o->snapshot;
  *out = &w->base;
  return BS_OK;
}

static void writer_close(bs_writer *bw) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  if (!w) return;
  analyze_collect(w, 1); /* the front releases the writer lock next */
  bs__free(&w->db->base.alloc, w);
}

/* Sets w->c to the session of the writer's lock (the caller holds lock->mu). A session the
 * server ended while idle is found here, before anything is sent: BS_EIO with libpq's message
 * (another host may have taken the lock meanwhile); the next call opens a new session and
 * takes the lock again, BS_EBUSY when another process or host holds it. */
static int writer_conn(bs__pg_writer *w, bs_error *err) {
  struct bs__pg_lock *l = w->lock;
  int rc;
  w->c = NULL;
  if (l->c && PQstatus(l->c) == CONNECTION_OK && PQtransactionStatus(l->c) == PQTRANS_IDLE &&
      !bs__pg_conn_alive(l->c)) {
    rc = bs__pg_fail(l->c, NULL, "writer: the session holding the stream's writer lock was lost",
                     err);
    PQfinish(l->c);
    l->c = NULL;
    return rc;
  }
  /* a loss an earlier call reported (its statement failed): a new session, locked again */
  if (l->c && PQstatus(l->c) != CONNECTION_OK) {
    PQfinish(l->c);
    l->c = NULL;
  }
  if (!l->c && (rc = session_open(w->db, l, err))) return rc;
  w->c = l->c;
  return BS_OK;
}

/* ---- A COMMIT whose reply was lost -------------------------------------------------------------
 * When the session drops after COMMIT was sent, the transaction may or may not have committed.
 * Its id (txid_current, taken with BEGIN) tells: txid_status on another session. Committed: the
 * call succeeded (the front empties its queue). Aborted: the call failed, the queue stays. Not
 * known (the server cannot be asked, or has not finished with it): the call fails and the writer
 * keeps asking at each call; once the answer is "committed" it refuses every call (BS_ESTATE),
 * since its queue, which the front still holds, was persisted: applying it again would persist
 * it twice. */

/* txid_status of xid on a pooled session: 1 committed, 0 aborted, -1 not known (yet). An id
 * "in the future" (22023) is one a crash forgot: nothing of it was logged, so it did not commit. */
static int xid_status(bs__pg_db *db, int64_t xid, bs_error *err) {
  bs__pg_args a = {0};
  const char *state;
  PGresult *r;
  PGconn *c;
  int st = -1;
  if (bs__pg_conn_get(db, &c, err)) return -1;
  bs__pg_arg_i64(&a, xid);
  r = PQexecParams(c, "SELECT txid_status($1)::text", a.n, a.types, a.values, a.lengths, a.formats,
                   0);
  if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
    if (!PQgetisnull(r, 0, 0))
      st = !strcmp(PQgetvalue(r, 0, 0), "committed") ? 1
           : !strcmp(PQgetvalue(r, 0, 0), "aborted") ? 0
                                                     : -1;
  } else if (r && (state = PQresultErrorField(r, PG_DIAG_SQLSTATE)) && !strcmp(state, "22023")) {
    st = 0;
  } else {
    bs__pg_fail(c, r, "commit: asking the outcome", err);
  }
  PQclear(r);
  bs__pg_conn_put(db, c);
  return st;
}

/* rc/err: the failure of the COMMIT whose reply was lost. */
static int commit_outcome(bs__pg_writer *w, int64_t xid, int rc, bs_error *err) {
  bs_error ask = {0};
  int st = xid_status(w->db, xid, &ask);
  if (st == 1) return BS_OK;
  if (st == 0) return rc;
  w->doubt = xid;
  return bs__fail(err, BS_EIO,
                  "commit: the session was lost after COMMIT was sent, and whether transaction "
                  "%lld committed is not known yet (%s); the writer asks again at its next call",
                  (long long)xid, ask.msg[0] ? ask.msg : "in progress");
}

/* Before a call of a writer with a COMMIT in doubt. */
static int doubt_resolve(bs__pg_writer *w, bs_error *err) {
  bs_error ask = {0};
  int st = xid_status(w->db, w->doubt, &ask);
  if (st == 0) {
    w->doubt = 0; /* it did not commit: the queue is still to be applied */
    return BS_OK;
  }
  if (st == 1)
    return bs__fail(err, BS_ESTATE,
                    "writer: its last COMMIT (transaction %lld) did commit although its reply was "
                    "lost, so its queue is persisted: close the writer and open a new one",
                    (long long)w->doubt);
  return bs__fail(err, BS_EIO, "writer: whether transaction %lld committed is not known yet (%s)",
                  (long long)w->doubt, ask.msg[0] ? ask.msg : "in progress");
}

/* COMMIT of the transaction xid: BS_OK when it committed, also when the reply was lost. */
static int commit_txn(bs__pg_writer *w, int64_t xid, bs_error *err) {
  PGconn *c = w->c;
  PGresult *r;
  int ok = 0, answered = 0, rc = BS_OK;
  if (PQsendQuery(c, "COMMIT")) {
    bs__pg_hook(w->db, "commit.sent", c);
    while ((r = PQgetResult(c)) != NULL) {
      if (PQresultStatus(r) == PGRES_COMMAND_OK) {
        ok = 1;
      } else if (!rc) {
        /* an error of the server's carries a SQLSTATE; libpq's own (the connection) none */
        answered = PQresultErrorField(r, PG_DIAG_SQLSTATE) != NULL;
        rc = bs__pg_fail(c, r, "commit", err);
      }
      PQclear(r);
    }
  }
  if (ok && !rc) return BS_OK;
  if (!rc) rc = bs__pg_fail(c, NULL, "commit", err);
  if (answered) return rc; /* the server refused it: not committed */
  return commit_outcome(w, xid, rc, err);
}

/* Every writer call holds its session's mutex (the session is the writer lock's) and starts
 * with a live, locked session (writer_conn). */
static int call_begin(bs__pg_writer *w, bs_error *err) {
  int rc;
  pthread_mutex_lock(&w->lock->mu);
  if ((w->doubt && (rc = doubt_resolve(w, err))) || (rc = writer_conn(w, err)))
    pthread_mutex_unlock(&w->lock->mu);
  return rc;
}

static int call_end(bs__pg_writer *w, int rc) {
  pthread_mutex_unlock(&w->lock->mu);
  return rc;
}

/* Truncate and drop in bounded transactions (contract.md 4.2), each a share of the table's
 * records; the front has flushed what was queued before. */
static int truncate_locked(bs__pg_writer *w, bs_val table, int drop, bs_error *err) {
  int rc, done = 0;
  while (!done) {
    if ((rc = writer_conn(w, err)) || (rc = bs__pg_begin_write(w->db, w->c, NULL, err))) return rc;
    if ((rc = bs__pg_truncate_share(w, table, drop, &done, err)) ||
        (rc = bs__pg_commit(w->c, err))) {
      bs__pg_rollback(w->c);
      return rc;
    }
  }
  return BS_OK;
}

static int writer_truncate(bs_writer *bw, bs_val table, int drop, bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  int rc;
  if ((rc = call_begin(w, err))) return rc;
  return call_end(w, truncate_locked(w, table, drop, err));
}

/* The record read back in a transaction rolled back at once; fn runs outside of it. */
static int writer_source_row(bs_writer *bw, const bs_write_batch *in, bs_val table, bs_val rid,
                             int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  bs_val data;
  int rc, has_data;
  if ((rc = call_begin(w, err))) return rc;
  if ((rc = bs__pg_begin_write(w->db, w->c, NULL, err))) return call_end(w, rc);
  rc = bs__pg_source_row_read(&data, &has_data, w, in, table, rid, err);
  bs__pg_rollback(w->c);
  call_end(w, rc);
  if (!rc) rc = fn(has_data ? &data : NULL, payload);
  if (data.size) bs__free(&w->db->base.alloc, (void *)data.data);
  return rc;
}

/* ---- Flush, commit ------------------------------------------------------------------------------ */

static int flush_locked(bs__pg_writer *w, const bs_write_batch *batch, uint64_t *last_op_out,
                        bs_error *err) {
  uint64_t head = 0;
  int64_t xid = 0;
  int rc;
  if ((rc = bs__pg_begin_write(w->db, w->c, &xid, err))) return rc;
  if (!(rc = bs__pg_flush_in_txn(w, batch, &head, err))) bs__pg_hook(w->db, "flush", w->c);
  if (rc || (rc = commit_txn(w, xid, err))) {
    bs__pg_rollback(w->c); /* nothing half-applied; the front keeps the queue */
    return rc;
  }
  bs__pg_head_seen(w->base.st, head, -1, NULL);
  analyze_maybe(w);
  if (last_op_out) *last_op_out = head;
  return BS_OK;
}

static int writer_flush(uint64_t *last_op_out, bs_writer *bw, const bs_write_batch *batch,
                        bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  int rc;
  if ((rc = call_begin(w, err))) return rc;
  return call_end(w, flush_locked(w, batch, last_op_out, err));
}

static const bs__pg_stmt checkpoint_make_stmt = {
    BS_PG_STMT_CHECKPOINT_MAKE,
    "WITH done AS (UPDATE bs_wcp_managed SET processed = true, processed_lsn = $3"
    "  WHERE NOT processed AND NOT gone"
    "  AND " BS_PG_SQL_HEADS_PASSED "  RETURNING user_id),"
    " rec AS (INSERT INTO bs_changes (stream, op_id, seq, first_op, flags, users, time_ms)"
    "  SELECT $1, $2, coalesce((SELECT max(seq) FROM bs_changes WHERE stream = $1"
    "   AND op_id = $2), 0) + 1, least($2, 9223372036854775806) + 1, " BS_PG_SQL_CHG_CHECKPOINT ","
    "  coalesce(array_agg(user_id), '{}'), $4 FROM done),"
    " purge AS (DELETE FROM bs_source WHERE tkey IN (SELECT key FROM bs_tables"
    "  WHERE stream = $1) AND mark <= $9),"
    " others AS (UPDATE bs_streams SET state = ($7::text::int2[])[state] WHERE id <> $1"
    "  AND state <> ($7::text::int2[])[state])"
    " UPDATE bs_streams SET checkpoint = $2, checkpoint_lsn = $10, last_checkpoint_op = $11,"
    "  state = $6, resume_lsn = $8 WHERE id = $1"
    " RETURNING pg_notify($5, $1::text)"};

/* The checkpoint of a commit (contract.md 4.4), as plan p decided, inside the commit's
 * transaction with the stream row locked: managed write checkpoints whose heads the lsn reached
 * become processed, their users go into the checkpoint's change record, the soft-deleted records
 * up to the plan's purge_to go, the others take the states of the plan's step, the stream's row
 * takes the fields bs__commit_row gave row (its checkpoint, the op head it was made at and its
 * LSN, its state, the resume LSN), and the stream's waiters on every host are notified (the
 * schema's channel). */
static int make_checkpoint(bs__pg_writer *w, uint32_t stream, const bs__stream_row *row, bs_val lsn,
                           const bs__commit_plan *p, bs_error *err) {
  PGconn *c = w->c;
  bs__pg_args a = {0};
  char others[BS_PG_STATES_TEXT];
  bs__pg_arg_i32(&a, (int32_t)stream);
  bs__pg_arg_i64(&a, (int64_t)row->checkpoint);
  bs__pg_arg_bytes(&a, lsn);
  bs__pg_arg_i64(&a, bs__now_ms()); /* the checkpoint's time: incremental compaction's min_age */
  bs__pg_arg_text(&a, w->db->schema.channel);
  bs__pg_arg_i32(&a, (int32_t)row->state);
  bs__pg_arg_states(&a, p->step.others, others);
  bs__pg_arg_bytes(&a, row->resume_lsn);
  bs__pg_arg_i64(&a, (int64_t)p->purge_to);
  bs__pg_arg_bytes(&a, row->checkpoint_lsn);
  bs__pg_arg_i64(&a, (int64_t)row->last_checkpoint_op);
  return bs__pg_runp(c, &checkpoint_make_stmt, /* delivered at COMMIT */
                     &a, "commit", err);
}

static const bs__pg_stmt resume_stmt = {BS_PG_STMT_RESUME,
                                        "UPDATE bs_streams SET resume_lsn = $2 WHERE id = $1"};

static const bs__pg_stmt commit_read_stmt = {BS_PG_STMT_COMMIT_READ,
                                             "SELECT " BS_PG_STREAM_COLS
                                             " FROM bs_streams WHERE id = $1 FOR UPDATE"};

static int commit_locked(bs_writer *bw, const bs_write_batch *batch, bs_val lsn, int create_empty,
                         bs_commit_result *out, bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  uint32_t stream = bw->st->stream_id;
  bs__pg_args a = {0};
  PGresult *r = NULL;
  uint64_t head, cp;
  int64_t xid = 0;
  int rc;
  bs__commit_plan p;
  bs__stream_row s;
  if ((rc = bs__pg_begin_write(w->db, w->c, &xid, err))) return rc;
  /* the queue first, in the same transaction: a commit flushes (contract.md 4.4) */
  if ((rc = bs__pg_flush_in_txn(w, batch, &head, err))) goto fail;
  bs__pg_hook(w->db, "commit", w->c);
  bs__pg_arg_i32(&a, (int32_t)stream);
  rc = bs__pg_execp(w->c, &commit_read_stmt, &a, &r, "commit", err);
  if (rc) goto fail;
  if (PQntuples(r) != 1) {
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)stream);
    goto fail;
  }
  s = bs__pg_stream_row(r, 0).row; /* borrows from r until the row is stored */
  if ((rc = bs__plan_commit_row(&p, stream, &s, lsn, create_empty, err))) goto fail;
  bs__commit_row(&s, &p, lsn);
  head = s.op_head;
  cp = s.checkpoint;
  if (p.checkpoint && (rc = make_checkpoint(w, stream, &s, lsn, &p, err))) goto fail;
  if (p.raise_resume && !p.checkpoint) { /* else make_checkpoint's statement stored it */
    bs__pg_args b = {0};
    bs__pg_arg_i32(&b, (int32_t)stream);
    bs__pg_arg_bytes(&b, s.resume_lsn);
    rc = bs__pg_runp(w->c, &resume_stmt, &b, "commit", err);
  }
  PQclear(r);
  r = NULL;
  if (rc || (rc = commit_txn(w, xid, err))) goto fail;
  bs__pg_head_seen(bw->st, head, -1, NULL);
  analyze_maybe(w);
  if (out) {
    out->checkpoint_blocked = p.blocked != BS_BLOCKED_NONE;
    out->blocked_reason = p.blocked;
    out->checkpoint_created = p.checkpoint;
    out->checkpoint = cp;
  }
  return BS_OK;
fail:
  PQclear(r);
  bs__pg_rollback(w->c);
  return rc;
}

static int writer_commit(bs_commit_result *out, bs_writer *bw, const bs_write_batch *batch,
                         bs_val lsn, int create_empty, bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  int rc;
  if ((rc = call_begin(w, err))) return rc;
  return call_end(w, commit_locked(bw, batch, lsn, create_empty, out, err));
}

/* snapshot_done and resume_lsn take effect at once, in a transaction of their own, and leave the
 * queue alone (as the other backends): the stream row is read and locked, and the fields
 * lifecycle.c's bs__lsn_row sets are stored. */
static int stream_update(bs_writer *bw, int snapshot_done, bs_val lsn, bs_error *err) {
  bs__pg_writer *w = (bs__pg_writer *)bw;
  uint32_t stream = bw->st->stream_id;
  const char *what = snapshot_done ? "snapshot_done" : "resume_lsn";
  bs__pg_args a = {0}, b = {0};
  bs__lsn_plan p = {0};
  bs__stream_row s;
  PGresult *r = NULL;
  int rc;
  if ((rc = call_begin(w, err))) return rc;
  if ((rc = bs__pg_begin_write(w->db, w->c, NULL, err))) return call_end(w, rc);
  bs__pg_arg_i32(&a, (int32_t)stream);
  rc = bs__pg_exec(w->c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams WHERE id = $1 FOR UPDATE",
                   &a, &r, what, err);
  if (!rc && PQntuples(r) != 1)
    rc = bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)stream);
  if (!rc) {
    s = bs__pg_stream_row(r, 0).row; /* borrows from r until the row is stored */
    rc = bs__plan_lsn(&p, stream, &s, snapshot_done, lsn, err);
  }
  if (!rc) {
    bs__lsn_row(&s, &p, lsn);
    bs__pg_arg_i32(&b, (int32_t)stream);
    bs__pg_arg_bool(&b, s.snapshot_done);
    bs__pg_arg_bytes(&b, s.no_checkpoint_before);
    bs__pg_arg_bytes(&b, s.resume_lsn);
    rc = bs__pg_run(w->c,
                    "UPDATE bs_streams SET snapshot_done = $2, no_checkpoint_before = $3,"
                    " resume_lsn = $4 WHERE id = $1",
                    &b, what, err);
  }
  PQclear(r);
  if (!rc) rc = bs__pg_commit(w->c, err);
  if (rc) bs__pg_rollback(w->c);
  return call_end(w, rc);
}

static int writer_snapshot_done(bs_writer *bw, bs_val lsn, bs_error *err) {
  return stream_update(bw, 1, lsn, err);
}

static int writer_resume_lsn(bs_writer *bw, bs_val lsn, bs_error *err) {
  return stream_update(bw, 0, lsn, err);
}

static const bs_writer_vtable pg_writer_vt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = writer_close,
    .flush = writer_flush,
    .truncate = writer_truncate,
    .source_row = writer_source_row,
    .commit = writer_commit,
    .snapshot_done = writer_snapshot_done,
    .resume_lsn = writer_resume_lsn,
};
