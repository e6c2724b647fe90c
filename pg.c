/*
 * pg.c: the top of the PostgreSQL backend: streams, storage handles, waiting for a checkpoint,
 * the lifecycle slots, and the method tables and the constructor, whose slots are the functions
 * of the files below (pg_read.c, pg_write.c, pg_wcp.c, pg_save.c, pg_compact.c, pg_verify.c,
 * pg_backup.c), all of them on pg_codec.c (how C values are stored in the rows) and pg_conn.c
 * (statements, the pool); the open checks and migrates the schema through pg_format.c. No file
 * below uses this one (make layercheck).
 * A bs_db is a connection string and a pool of connections: any call takes an idle connection
 * (or opens one), runs its statements and gives it back, so reader threads never share one.
 */
#include "pg_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- Streams --------------------------------------------------------------------------------- */

static bs__pg_db *pg_of(bs_db *db) {
  return (bs__pg_db *)db;
}

static struct {
  void (*fn)(const char *point, PGconn *c, void *payload);
  void *payload;
} open_hook;

void bs__pg_set_open_hook(void (*fn)(const char *point, PGconn *c, void *payload), void *payload) {
  open_hook.fn = fn;
  open_hook.payload = fn ? payload : NULL;
}

void bs__pg_set_hook(bs_db *db, void (*fn)(const char *point, PGconn *c, void *payload),
                     void *payload) {
  pg_of(db)->hook = fn;
  pg_of(db)->hook_payload = fn ? payload : NULL;
}

static int pg_stream_create(uint32_t *id_out, bs_db *base, bs_val name, const bs_stream_options *o,
                            bs_error *err) {
  bs__pg_db *db = pg_of(base);
  bs__pg_args a = {0}, lk = {0}, m = {0};
  bs__stream_step step;
  char others[BS_PG_STATES_TEXT];
  PGconn *c;
  PGresult *r = NULL;
  int rc;
  if ((rc = bs__stream_transition(&step, 0, 0, BS__STREAM_CREATE, err))) return rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_bytes(&a, name);
  bs__pg_arg_i32(&a, (int32_t)o->hash);
  bs__pg_arg_i64(&a, bs__now_ms());
  bs__pg_arg_i32(&a, (int32_t)step.to);
  bs__pg_arg_states(&m, step.others, others);
  /* The schema's stream-creation lock makes id = max + 1 and "only the newest deploy stays
   * PROCESSING" atomic against another process creating a stream (contract.md 4.4), and waits
   * for nothing else: a table lock would also wait for every writer's open flush, and queue
   * every other writer behind itself. The UPDATE waits only for a flush of the PROCESSING
   * stream, whose row it changes. */
  bs__pg_arg_lock(&lk, &db->schema, 2, BS_PG_LOCK_SCHEMA);
  rc = bs__pg_begin_write(db, c, NULL, err);
  if (!rc) rc = bs__pg_run(c, "SELECT pg_advisory_xact_lock($1, $2)", &lk, "stream_create", err);
  if (!rc)
    rc = bs__pg_run(c,
                    "UPDATE bs_streams SET state = ($1::text::int2[])[state]"
                    " WHERE state <> ($1::text::int2[])[state]",
                    &m, "stream_create", err);
  if (!rc)
    rc = bs__pg_exec(c,
                     "INSERT INTO bs_streams (id, name, state, hash, created_ms)"
                     " SELECT coalesce(max(id), 0) + 1, $1, $4, $2, $3 FROM bs_streams"
                     " RETURNING id",
                     &a, &r, "stream_create", err);
  if (!rc) rc = bs__pg_commit(c, err);
  if (rc)
    bs__pg_rollback(c);
  else if (id_out)
    *id_out = (uint32_t)bs__pg_i32(r, 0, 0);
  PQclear(r);
  bs__pg_conn_put(db, c);
  return rc;
}

static int pg_stream_list(bs_db *base, int (*fn)(const bs_stream_info *, void *), void *payload,
                          bs_error *err) {
  bs__pg_db *db = pg_of(base);
  PGconn *c;
  PGresult *r;
  int rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  rc = bs__pg_exec(c, "SELECT " BS_PG_STREAM_COLS " FROM bs_streams ORDER BY id", NULL, &r,
                   "stream_list", err);
  bs__pg_conn_put(db, c); /* before fn, which may call back into the library */
  if (rc) return rc;
  for (int i = 0; i < PQntuples(r) && !rc; i++) {
    bs__pg_stream s = bs__pg_stream_row(r, i);
    bs_stream_info info = {
        .id = s.id, .name = s.name, .state = (bs_stream_state)s.row.state, .hash = s.hash};
    rc = fn(&info, payload);
  }
  PQclear(r);
  return rc;
}

static const bs_storage_vtable pg_vtable;

static int pg_storage_open(bs_storage **out, bs_db *base, uint32_t id, bs_error *err) {
  bs__pg_db *db = pg_of(base);
  bs__pg_args a = {0};
  bs__pg_storage *st;
  PGconn *c;
  PGresult *r;
  int rc, found;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)id); /* id 0 was resolved by the front (stream_list) */
  rc = bs__pg_exec(c, "SELECT id FROM bs_streams WHERE id = $1", &a, &r, "storage_open", err);
  bs__pg_conn_put(db, c);
  if (rc) return rc;
  found = PQntuples(r) == 1;
  PQclear(r);
  if (!found) return bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)id);
  if (!(st = bs__calloc(&base->alloc, 1, sizeof *st)))
    return bs__fail(err, BS_ENOMEM, "storage: out of memory");
  st->base.vt = &pg_vtable;
  st->base.db = base;
  st->base.stream_id = id;
  st->db = db;
  st->mode = BS_WCP_MANAGED;
  st->seen_epoch = -1;
  if (pthread_mutex_init(&st->mu, NULL)) {
    bs__free(&base->alloc, st);
    return bs__fail(err, BS_ENOMEM, "storage: cannot initialise a mutex");
  }
  *out = &st->base;
  return BS_OK;
}

/* ---- Stream state ---------------------------------------------------------------------------- */

static bs__pg_db *spg(bs_storage *st) {
  return ((bs__pg_storage *)st)->db;
}

static void copy_lsn(unsigned char *dst, size_t *size, int *has, bs_val v) {
  *has = v.data != NULL;
  *size = v.size < BS_MAX_LSN ? v.size : BS_MAX_LSN;
  if (*size) memcpy(dst, v.data, *size);
}

/* One statement on a pooled connection, outside any transaction. */
static int query(bs_storage *st, const char *sql, const bs__pg_args *a, PGresult **r,
                 const char *what, bs_error *err) {
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = bs__pg_exec(c, sql, a, r, what, err);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

static int run(bs_storage *st, const char *sql, const bs__pg_args *a, const char *what,
               bs_error *err) {
  PGresult *r;
  int rc = query(st, sql, a, &r, what, err);
  PQclear(r);
  return rc;
}

static int stream_gone(const bs_storage *st, bs_error *err) {
  return bs__fail(err, BS_ENOTFOUND, "stream %u: no such stream", (unsigned)st->stream_id);
}
/* The stream's row by one prepared statement: get_status (the front answers bs_get_checkpoint,
 * which clients poll, from it) and the checkpoint waits. *out borrows from *r, which the caller
 * clears; on a failure *r is NULL. */
static const bs__pg_stmt stream_stmt = {BS_PG_STMT_STREAM, "SELECT " BS_PG_STREAM_COLS
                                                           " FROM bs_streams WHERE id = $1"};

static int stream_read(PGconn *c, bs_storage *st, PGresult **r, bs__pg_stream *out,
                       const char *what, bs_error *err) {
  bs__pg_args a = {0};
  int rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  if ((rc = bs__pg_execp(c, &stream_stmt, &a, r, what, err))) return rc;
  if (PQntuples(*r) != 1) {
    PQclear(*r);
    *r = NULL;
    return stream_gone(st, err);
  }
  *out = bs__pg_stream_row(*r, 0);
  return BS_OK;
}

static int read_checkpoint(PGconn *c, bs_storage *st, bs_checkpoint *out, bs_error *err) {
  PGresult *r;
  bs__pg_stream s;
  int rc = stream_read(c, st, &r, &s, "get_checkpoint", err);
  if (rc) return rc;
  out->op_id = s.row.checkpoint;
  copy_lsn(out->lsn, &out->lsn_size, &out->has_lsn, s.row.checkpoint_lsn);
  PQclear(r);
  return BS_OK;
}

static int pg_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = read_checkpoint(c, st, out, err);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

/* ---- Waiting for a checkpoint (BS_PG_CHANNEL) ------------------------------------------------ */

/* Frees the notifications c has received; 1 when there was one. */
static int drain_notifies(PGconn *c) {
  PGnotify *n;
  int any = 0;
  while ((n = PQnotifies(c)) != NULL) {
    any = 1;
    PQfreemem(n);
  }
  return any;
}

/* The LISTEN connection (l->mu held): opened when there is none. It is not a connection of the
 * pool: waiters never hold one of those while they wait. */
static int listener_open(bs__pg_db *db, bs_error *err) {
  struct bs__pg_listener *l = &db->listen;
  char sql[64];
  PGconn *c;
  int rc;
  if (l->c) return BS_OK;
  if ((rc = bs__pg_conn_open(db, &c, err))) return rc;
  snprintf(sql, sizeof sql, "LISTEN %s", db->schema.channel);
  if ((rc = bs__pg_run(c, sql, NULL, "wait_checkpoint: listen", err))) {
    PQfinish(c);
    return rc;
  }
  l->c = c;
  return BS_OK;
}

/* Reads the LISTEN connection's socket until something arrives or ms pass (l->mu held, released
 * meanwhile: the others wait on l->cv); a notification bumps gen, a loss epoch. */
static void listener_poll(bs__pg_db *db, uint64_t ms) {
  struct bs__pg_listener *l = &db->listen;
  PGconn *c = l->c;
  struct pollfd p;
  int ok;
  l->polling = 1;
  pthread_mutex_unlock(&l->mu);
  bs__pg_hook(db, "wait", c);
  p.fd = PQsocket(c);
  p.events = POLLIN;
  p.revents = 0;
  ok = p.fd >= 0 && (poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms) >= 0 || errno == EINTR) &&
       PQconsumeInput(c) && PQstatus(c) == CONNECTION_OK;
  pthread_mutex_lock(&l->mu);
  l->polling = 0;
  if (!ok) {
    bs__pg_fail(c, NULL, "waiting for a checkpoint", &l->lost);
    PQfinish(c);
    l->c = NULL;
    l->epoch++;
  } else if (drain_notifies(c)) {
    l->gen++;
  }
  pthread_cond_broadcast(&l->cv);
}

/* Waits on l->cv (l->mu held) until the poller or a notification wakes it, or ms pass. */
static void listener_wait(bs__pg_db *db, uint64_t ms) {
  struct bs__pg_listener *l = &db->listen;
  struct timespec ts;
  bs__pg_hook(db, "wait", l->c);
  ts = bs__monotonic_after(ms);
  pthread_cond_timedwait(&l->cv, &l->mu, &ts);
}

/* A hot standby cannot LISTEN (PostgreSQL: "cannot execute LISTEN during recovery"): there the
 * wait reads the checkpoint every BS_WAIT_POLL_MS on c (the "wait" point before each sleep). */
static int wait_standby(bs_storage *st, PGconn *c, const bs_checkpoint *known, uint64_t deadline,
                        bs_checkpoint *out, bs_error *err) {
  int rc;
  for (;;) {
    uint64_t now;
    if ((rc = read_checkpoint(c, st, out, err)) || bs__checkpoint_differs(out, known) ||
        (now = bs__monotonic_ms()) >= deadline)
      return rc;
    bs__pg_hook(spg(st), "wait", c);
    poll(NULL, 0, (int)(deadline - now < BS_WAIT_POLL_MS ? deadline - now : BS_WAIT_POLL_MS));
  }
}

/* On the handle's LISTEN connection (pg_internal.h), opened first: a commit before a read is in
 * it, one after bumps gen (the waiter then reads again). The reads run on connections of the
 * pool, given back before the wait. A waiter whose LISTEN connection was lost (epoch) fails
 * with the loss's BS_EIO. */
static int pg_wait_checkpoint(bs_checkpoint *out, bs_storage *st, const bs_checkpoint *known,
                              uint64_t timeout_ms, bs_error *err) {
  uint64_t deadline = bs__monotonic_ms() + timeout_ms, gen, epoch, now;
  bs__pg_db *db = spg(st);
  struct bs__pg_listener *l = &db->listen;
  PGconn *c;
  PGresult *r;
  int rc, standby = 0;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  if (!(rc = bs__pg_exec(c, "SELECT pg_is_in_recovery()", NULL, &r, "wait_checkpoint", err))) {
    standby = bs__pg_bool(r, 0, 0);
    PQclear(r);
    if (standby) rc = wait_standby(st, c, known, deadline, out, err);
  }
  bs__pg_conn_put(db, c);
  if (rc || standby) return rc;
  pthread_mutex_lock(&l->mu);
  rc = listener_open(db, err);
  epoch = l->epoch;
  while (!rc) {
    gen = l->gen;
    pthread_mutex_unlock(&l->mu);
    rc = pg_get_checkpoint(out, st, err);
    pthread_mutex_lock(&l->mu);
    if (rc || bs__checkpoint_differs(out, known) || (now = bs__monotonic_ms()) >= deadline) break;
    if (l->epoch != epoch) {
      if (err) *err = l->lost;
      rc = BS_EIO;
      break;
    }
    if (l->gen != gen) continue;
    if (l->polling)
      listener_wait(db, deadline - now);
    else
      listener_poll(db, deadline - now);
  }
  pthread_mutex_unlock(&l->mu);
  return rc;
}

static int pg_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  PGresult *r;
  PGconn *c;
  bs__pg_stream s;
  bs_val e;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  rc = stream_read(c, st, &r, &s, "get_status", err);
  bs__pg_conn_put(spg(st), c);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  out->state = (bs_stream_state)s.row.state;
  out->snapshot_done = s.row.snapshot_done; /* the front: once a checkpoint exists */
  out->checkpoint = s.row.checkpoint;
  out->last_persisted_op = s.row.op_head;
  copy_lsn(out->lsn, &out->lsn_size, &out->has_lsn, s.row.checkpoint_lsn);
  copy_lsn(out->resume_lsn, &out->resume_lsn_size, &out->has_resume_lsn, s.row.resume_lsn);
  e = s.last_error;
  if (e.size > sizeof out->last_error - 1) e.size = sizeof out->last_error - 1;
  if (e.size) memcpy(out->last_error, e.data, e.size);
  PQclear(r);
  return BS_OK;
}

static int pg_report_error(bs_storage *st, const char *message, bs_error *err) {
  bs__pg_args a = {0};
  bs_val m = bs__val_str(message ? message : "");
  uint8_t map[BS__STREAM_STATES];
  char text[BS_PG_STATES_TEXT];
  if (m.size > 255) m.size = 255;
  bs__stream_map(map, BS__STREAM_ERROR);
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  bs__pg_arg_bytes(&a, m);
  bs__pg_arg_states(&a, map, text);
  return run(st,
             "UPDATE bs_streams SET last_error = $2, state = ($3::text::int2[])[state]"
             " WHERE id = $1",
             &a, "report_error", err);
}

/* The stream's row, locked: a flush holds it (pg_save.c batch_open), so the clear waits for the
 * flush and its deletes then see the flush's rows. */
static const char *const reset_read_sql =
    "SELECT " BS_PG_STREAM_COLS " FROM bs_streams WHERE id = $1 FOR UPDATE";

/* Stores the row w of stream id (every field lifecycle.c decides). */
static int reset_store(PGconn *c, uint32_t id, const bs__stream_row *w, bs_error *err) {
  bs__pg_args a = {0};
  bs__pg_arg_i32(&a, (int32_t)id);
  bs__pg_stream_args(&a, w);
  return bs__pg_run(c, "UPDATE bs_streams SET " BS_PG_STREAM_SET " WHERE id = $1", &a, "clear",
                    err);
}

/* Deletes every record of the stream but its row. */
static int reset_delete(PGconn *c, uint32_t id, bs_error *err) {
  bs__pg_args a = {0};
  bs__pg_arg_i32(&a, (int32_t)id);
  return bs__pg_run(c,
                    "WITH o AS (DELETE FROM bs_chunks WHERE bucket IN (SELECT id FROM bs_buckets"
                    "  WHERE stream = $1)),"
                    " p AS (DELETE FROM bs_params WHERE stream = $1),"
                    " ch AS (DELETE FROM bs_changes WHERE stream = $1),"
                    " cw AS (DELETE FROM bs_wcp_custom WHERE stream = $1),"
                    " sr AS (DELETE FROM bs_source WHERE tkey IN (SELECT key FROM bs_tables"
                    "  WHERE stream = $1)),"
                    " su AS (DELETE FROM bs_superseded WHERE stream = $1),"
                    " tb AS (DELETE FROM bs_tables WHERE stream = $1)"
                    " DELETE FROM bs_buckets WHERE stream = $1",
                    &a, "clear", err);
}

/* A clear and/or terminate in one transaction: the row read, what lifecycle.c makes of it
 * stored, and for a clear every other record of the stream deleted. */
static int clear_or_terminate(bs_storage *st, int clear, int terminate, bs_error *err) {
  bs__pg_args a = {0};
  bs__stream_row w;
  PGresult *r = NULL;
  PGconn *c;
  int rc;
  if ((rc = bs__pg_conn_get(spg(st), &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)st->stream_id);
  rc = bs__pg_begin_write(spg(st), c, NULL, err);
  if (!rc) rc = bs__pg_exec(c, reset_read_sql, &a, &r, "clear", err);
  if (!rc && PQntuples(r) != 1) rc = stream_gone(st, err);
  if (!rc) {
    w = bs__pg_stream_row(r, 0).row;
    rc = bs__stream_reset(&w, st->stream_id, clear, terminate, err);
  }
  if (!rc && clear) rc = reset_delete(c, st->stream_id, err);
  if (!rc) rc = reset_store(c, st->stream_id, &w, err); /* w borrows from r */
  PQclear(r);
  if (!rc) rc = bs__pg_commit(c, err);
  if (rc) bs__pg_rollback(c);
  bs__pg_conn_put(spg(st), c);
  return rc;
}

static int pg_clear(bs_storage *st, bs_error *err) {
  return clear_or_terminate(st, 1, 0, err);
}

static int pg_terminate(bs_storage *st, int clear, bs_error *err) {
  return clear_or_terminate(st, clear, 1, err);
}

static void pg_storage_destroy(bs_storage *st) {
  if (!st) return;
  pthread_mutex_destroy(&((bs__pg_storage *)st)->mu);
  bs__free(&spg(st)->base.alloc, st);
}

static const bs_storage_vtable pg_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = pg_storage_destroy,
    .writer_open = bs__pg_writer_open,
    .bucket_data = bs__pg_bucket_data,
    .checksums = bs__pg_checksums,
    .checksum_ranges = bs__pg_checksum_ranges,
    .checkpoint_changes = bs__pg_checkpoint_changes,
    .parameter_sets = bs__pg_parameter_sets,
    .set_write_checkpoint_mode = bs__pg_set_write_checkpoint_mode,
    .create_managed_write_checkpoints = bs__pg_create_managed_write_checkpoints,
    .last_write_checkpoint = bs__pg_last_write_checkpoint,
    .delete_checkpoint_requests_before = bs__pg_delete_checkpoint_requests_before,
    .compact = bs__pg_compact,
    .compact_initial_replication = bs__pg_compact_initial_replication,
    .get_status = pg_get_status,
    .report_error = pg_report_error,
    .clear = pg_clear,
    .terminate = pg_terminate,
    .list_buckets = bs__pg_list_buckets,
    .wait_checkpoint = pg_wait_checkpoint,
    .writer_lock = bs__pg_writer_lock,
};

/* ---- Database -------------------------------------------------------------------------------- */

static int backend_pid(PGconn *c, int *pid, bs_error *err) {
  PGresult *r;
  int rc = bs__pg_exec(c, "SELECT pg_backend_pid()", NULL, &r, "open: probing the session", err);
  if (rc) return rc;
  *pid = bs__pg_i32(r, 0, 0);
  PQclear(r);
  return BS_OK;
}

/* Behind a transaction-mode pooler (PgBouncer pool_mode = transaction, managed poolers' transaction
 * mode) a client's statements outside a transaction run on whichever server session is free: the
 * writer's advisory lock, LISTEN, the session's settings and prepared statements would reach
 * other clients' sessions. Seen at open as a server process shared by two of the handle's
 * connections (the pooler hands a second client the session the first just freed: PgBouncer's
 * default, most recently used first), or one connection's server process changing between two
 * statements ("open.probe" point between them, c that connection). The second connection is one
 * of the pool's, kept; with a pool of one, only the first test runs. A pooler in session mode,
 * or none, never shows either. */
static int refuse_pooler(bs__pg_db *db, PGconn *c, bs_error *err) {
  PGconn *c2 = NULL;
  int first, other = 0, again, rc;
  if ((rc = backend_pid(c, &first, err))) return rc;
  bs__pg_hook(db, "open.probe", c);
  if (bs__pg_conn_try(db, &c2) == BS_OK) {
    rc = backend_pid(c2, &other, err);
    bs__pg_conn_put(db, c2);
    if (rc) return rc;
  }
  if ((rc = backend_pid(c, &again, err))) return rc;
  if (first == other || first != again)
    return bs__fail(
        err, BS_EUNSUPPORTED,
        "the connection goes through a pooler in transaction mode (server process %d "
        "%s): connect directly or through a pooler in session mode (PgBouncer "
        "pool_mode = session)",
        first, first == other ? "served two connections at once" : "changed between statements");
  return BS_OK;
}

static void pg_close(bs_db *base) {
  bs__pg_db *db = pg_of(base);
  bs_allocator a = base->alloc;
  for (size_t i = 0; i < db->n_idle; i++) PQfinish(db->idle[i]);
  PQfinish(db->listen.c);
  for (size_t i = 0; i < db->n_locks; i++) { /* writers left open by the host */
    PQfinish(db->locks[i]->c);
    pthread_mutex_destroy(&db->locks[i]->mu);
    bs__free(&a, db->locks[i]);
  }
  bs__free(&a, db->idle);
  bs__free(&a, db->locks);
  bs__free(&a, db->url);
  if (db->sync_ready) {
    pthread_cond_destroy(&db->listen.cv);
    pthread_mutex_destroy(&db->listen.mu);
    pthread_cond_destroy(&db->pool_cv);
    pthread_mutex_destroy(&db->pool_mu);
  }
  bs__free(&a, db);
}

/* The pool's and the listener's mutexes and conditions (the listener's timed waits use the
 * monotonic clock, so a wall-clock jump cannot stall them); 0 or BS_ENOMEM. */
static int sync_init(bs__pg_db *db) {
  pthread_condattr_t ca;
  int ok = 0;
  if (pthread_mutex_init(&db->pool_mu, NULL)) return BS_ENOMEM;
  if (pthread_cond_init(&db->pool_cv, NULL)) goto pool_cv;
  if (pthread_mutex_init(&db->listen.mu, NULL)) goto listen_mu;
  if (pthread_condattr_init(&ca)) goto listen_cv;
  ok = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&db->listen.cv, &ca);
  pthread_condattr_destroy(&ca);
  if (ok) {
    db->sync_ready = 1;
    return BS_OK;
  }
listen_cv:
  pthread_mutex_destroy(&db->listen.mu);
listen_mu:
  pthread_cond_destroy(&db->pool_cv);
pool_cv:
  pthread_mutex_destroy(&db->pool_mu);
  return BS_ENOMEM;
}

/* count_ops's: an op of each type (index bs_op_type) */
static int count_ops(uint64_t bucket, uint64_t last, const bs__pg_chunkr *ch, void *payload) {
  uint64_t *n = payload;
  BS_UNUSED(bucket), BS_UNUSED(last);
  for (uint32_t i = 0; i < ch->n; i++) {
    unsigned t = ch->p[ch->off[i]];
    t = ch->flags & BS_CHUNK_COMPACT ? t & 7u : t;
    if (t >= BS_OP_PUT && t <= BS_OP_CLEAR) n[t]++;
  }
  return BS_OK;
}

/* Counts over every stream in one snapshot (a read-only transaction: one statement, then the
 * ops by type, which only their chunks' bytes say); file_bytes: the bs_ tables' size on the
 * server, indexes and TOAST included. */
static int pg_stat(bs_stat *out, bs_db *base, bs_error *err) {
  bs__pg_db *db = pg_of(base);
  PGconn *c;
  bs__pg_args a = {0};
  PGresult *r = NULL;
  uint64_t types[BS_OP_CLEAR + 1] = {0};
  int rc;
  if ((rc = bs__pg_conn_get(db, &c, err))) return rc;
  bs__pg_arg_i32(&a, (int32_t)db->schema.oid);
  if (!(rc = bs__pg_begin(c, 1, err))) {
    rc = bs__pg_exec(c,
                     "SELECT (SELECT count(*) FROM bs_streams), (SELECT count(*) FROM bs_buckets),"
                     " (SELECT count(*) FROM bs_params), (SELECT count(*) FROM bs_source),"
                     " (SELECT count(*) FROM bs_wcp_managed WHERE NOT gone)"
                     "  + (SELECT count(*) FROM bs_wcp_custom),"
                     " (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint"
                     "  FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE 'bs\\_%'"
                     "  AND c.relnamespace = $1::oid)",
                     &a, &r, "stat", err);
    if (!rc) rc = bs__pg_chunks_walk(c, NULL, NULL, count_ops, types, err);
    if (!rc) rc = bs__pg_commit(c, err);
    if (rc) bs__pg_rollback(c);
  }
  bs__pg_conn_put(db, c);
  if (rc) {
    PQclear(r);
    return rc;
  }
  memset(out, 0, sizeof *out);
  out->streams = (uint64_t)bs__pg_i64(r, 0, 0);
  out->buckets = (uint64_t)bs__pg_i64(r, 0, 1);
  out->ops_put = types[BS_OP_PUT];
  out->ops_remove = types[BS_OP_REMOVE];
  out->ops_move = types[BS_OP_MOVE];
  out->ops_clear = types[BS_OP_CLEAR];
  out->parameter_entries = (uint64_t)bs__pg_i64(r, 0, 2);
  out->source_records = (uint64_t)bs__pg_i64(r, 0, 3);
  out->write_checkpoints = (uint64_t)bs__pg_i64(r, 0, 4);
  out->file_bytes = (uint64_t)bs__pg_i64(r, 0, 5);
  PQclear(r);
  return BS_OK;
}

const bs_db_vtable bs__pg_db_vt = {
    .version = BS_DB_VTABLE_VERSION,
    .destroy = pg_close,
    .stat = pg_stat,
    .stream_create = pg_stream_create,
    .stream_list = pg_stream_list,
    .storage_open = pg_storage_open,
    .verify = bs__pg_verify,
    .backup = bs__pg_backup,
    .export_records = bs__pg_export,
    .load = bs__pg_load,
};

int bs__pg_open(bs_db **out, const char *url, const bs_open_options *opts, bs_error *err) {
  size_t n = strlen(url);
  bs__pg_db *db;
  const bs_allocator *a;
  bs_db base;
  PGconn *c;
  int rc;
  bs__db_base_set(&base, &bs__pg_db_vt, opts);
  if (!(db = bs__calloc(&base.alloc, 1, sizeof *db)))
    return bs__fail(err, BS_ENOMEM, "database: out of memory");
  db->base = base;
  db->hook = open_hook.fn;
  db->hook_payload = open_hook.payload;
  a = &db->base.alloc;
  /* opts: the front's copy at the current version (storage.c check_open) */
  db->max_conns = opts->pg_max_connections ? opts->pg_max_connections : BS_PG_MAX_CONNECTIONS;
  if (sync_init(db)) {
    bs__free(a, db);
    return bs__fail(err, BS_ENOMEM, "database: cannot initialise a mutex");
  }
  if (db->max_conns > SIZE_MAX / sizeof *db->idle ||
      !(db->idle = bs__malloc(a, db->max_conns * sizeof *db->idle)) ||
      !(db->url = bs__malloc(a, n + 1))) {
    pg_close(&db->base);
    return bs__fail(err, BS_ENOMEM, "database: out of memory");
  }
  memcpy(db->url, url, n + 1);
  if ((rc = bs__pg_conn_get(db, &c, err)) == BS_OK) {
    if (!(rc = bs__pg_check_server(PQserverVersion(c), err)) && !(rc = refuse_pooler(db, c, err)) &&
        !(rc = bs__pg_schema_resolve(c, &db->schema, err)) &&
        !(rc = bs__pg_run(c, db->schema.set_path, NULL, "open: search_path", err)))
      rc = bs__pg_check_schema(db, c, err);
    bs__pg_conn_put(db, c);
  }
  if (rc) {
    pg_close(&db->base);
    return rc;
  }
  *out = &db->base;
  return BS_OK;
}
