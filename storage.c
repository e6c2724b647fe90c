/*
 * storage.c: the front of the library: the argument checks of the public API, dispatch of every
 * call to the backend's tables, the checksum cache (cache.c) above any backend, and the waits
 * for a checkpoint. It uses the common layer (common.c) and the rules (rules.c); no backend uses
 * anything of it (`make layercheck`).
 */
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- Version --------------------------------------------------------------------------------- */

const char *bs_version(int *major, int *minor, int *patch) {
  if (major) *major = BS_VERSION_MAJOR;
  if (minor) *minor = BS_VERSION_MINOR;
  if (patch) *patch = BS_VERSION_PATCH;
  return BS_VERSION_STRING;
}

/* ---- The database base: the front's part ------------------------------------------------------ */

#define BS_DEFAULT_CACHE_ENTRIES 100000u
/* Defaults of zero option fields (storage.h). The front resolves them before every vtable call,
 * so backends never see a NULL opts or a zero bound (batch defaults: internal.h). */
#define BS_DEFAULT_FLUSH_RECORDS 2000u
#define BS_DEFAULT_FLUSH_BYTES   (5u * 1000u * 1000u)

/* opts (NULL: the defaults) checked and copied into o, which the open passes on. */
static int resolve_open_options(const bs_open_options *opts, bs_open_options *o, bs_error *err) {
  static const bs_open_options defaults = BS_OPEN_OPTIONS_INIT;
  const bs_allocator *a;
  unsigned unknown;
  int rc;
  *o = defaults;
  if (opts && (rc = BS_VERSIONED_COPY(o, opts, bs_open_options, "opts->version", err))) return rc;
  if ((unknown = o->flags & ~(unsigned)(BS_OPEN_NOSYNC | BS_OPEN_RDONLY | BS_OPEN_NOMIGRATE |
                                        BS_OPEN_ACK_REWIND)) != 0)
    return bs__fail(err, BS_EINVAL, "opts->flags: unknown bits 0x%x", unknown);
  return bs__allocator_resolve(o->allocator, &a, err);
}

static void db_front_free(bs_db *db) {
  struct bs__db_front *f = db->front;
  if (!f) return;
  bs__cksum_cache_free(f->cache);
  pthread_cond_destroy(&f->notify_cv);
  pthread_mutex_destroy(&f->notify_mu);
  bs__free(&db->alloc, f);
  db->front = NULL;
}

static int db_front_new(bs_db *db, const bs_open_options *o, bs_error *err) {
  struct bs__db_front *f = bs__calloc(&db->alloc, 1, sizeof *f);
  pthread_condattr_t ca;
  size_t entries = o->checksum_cache_entries;
  int rc;
  if (!f) return bs__fail(err, BS_ENOMEM, "cannot allocate the database's front state");
  if (entries == 0) entries = BS_DEFAULT_CACHE_ENTRIES;
  f->forks = bs__forks();
  if (entries != (size_t)-1 && bs__cksum_cache_new(&f->cache, &db->alloc, entries) != BS_OK) {
    bs__free(&db->alloc, f);
    return bs__fail(err, BS_ENOMEM, "cannot allocate the checksum cache");
  }
  /* Waiters use timed waits on the monotonic clock, so a wall-clock jump cannot stall them. */
  if (pthread_mutex_init(&f->notify_mu, NULL) != 0) goto fail_mu;
  if (pthread_condattr_init(&ca) != 0) goto fail_cv;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  rc = pthread_cond_init(&f->notify_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) goto fail_cv;
  db->front = f;
  return BS_OK;

fail_cv:
  pthread_mutex_destroy(&f->notify_mu);
fail_mu:
  bs__cksum_cache_free(f->cache);
  bs__free(&db->alloc, f);
  return bs__fail(err, BS_ENOMEM, "cannot initialise the checkpoint notification");
}

/* The one rule of a handle a backend hands the front (storage_backend.h): h is set and its table
 * T has a destroy and a version from BS_FIRST_T on (an older table's slots take their arguments
 * in another order); else BS_EINVAL, and a refused handle is released through its table's
 * destroy when it has one (the first slot of every version, so a version-0 table's too). A
 * handle without a destroy cannot be released: the backend's bug. */
#define HANDLE_CHECK(h, T, what, err)                                                              \
  (!(h) ? handle_fail(what, 0, err)                                                                \
   : (h)->vt && (h)->vt->version >= BS_FIRST_##T && (h)->vt->destroy                               \
       ? BS_OK                                                                                     \
       : ((h)->vt && (h)->vt->destroy ? (h)->vt->destroy(h) : (void)0,                             \
          handle_fail(what, BS_FIRST_##T, err)))
static int handle_fail(const char *what, unsigned first, bs_error *err) {
  if (!first) return bs__fail(err, BS_EINVAL, "%s: the backend returned no handle", what);
  return bs__fail(err, BS_EINVAL,
                  "%s: the backend returned a handle without a table of version %u or later "
                  "with a destroy",
                  what, first);
}

int bs_open_backend(bs_db **out, bs_db *db, const bs_open_options *opts, bs_error *err) {
  const bs_allocator *a;
  bs_open_options o;
  int rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  *out = NULL;
  if ((rc = HANDLE_CHECK(db, bs_db_vtable, "db", err))) return rc;
  db->front = NULL;
  if ((rc = resolve_open_options(opts, &o, err)) == BS_OK &&
      (rc = bs__allocator_resolve(&db->alloc, &a, err)) == BS_OK)
    db->alloc = *a;
  if (rc == BS_OK) rc = db_front_new(db, &o, err);
  if (rc != BS_OK) {
    db->vt->destroy(db);
    return rc;
  }
  *out = db;
  return BS_OK;
}

/* After a commit that created a checkpoint: wakes waiters and calls the listener. */
static void notify_checkpoint(bs_db *db, uint32_t stream, uint64_t checkpoint) {
  struct bs__db_front *f = db ? db->front : NULL;
  void (*fn)(uint32_t, uint64_t, void *);
  void *payload;
  if (!f) return;
  pthread_mutex_lock(&f->notify_mu);
  f->notify_seq++;
  fn = f->listener;
  payload = f->listener_payload;
  pthread_cond_broadcast(&f->notify_cv);
  pthread_mutex_unlock(&f->notify_mu);
  bs__cksum_cache_note_checkpoint(f->cache, stream, checkpoint);
  /* The listener runs outside the lock so it may call back into the library. */
  if (fn) fn(stream, checkpoint, payload);
}

/* ---- Argument checks shared by the front and backends ---------------------------------------- */

/* The common case, checked without formatting a message (the writer's and readers' hot paths). */
static int sized_ok(bs_val v, size_t min, size_t max) {
  return (v.data || !v.size) && v.size >= min && v.size <= max;
}

/* v holds min..max bytes (limit: how the message names max), its data NULL only when empty. */
static int check_sized(bs_val v, size_t min, size_t max, const char *what, const char *limit,
                       bs_error *err) {
  if (v.size && !v.data)
    return bs__fail(err, BS_EINVAL, "%s: NULL data with size %zu", what, v.size);
  if (v.size > max)
    return bs__fail(err, BS_ETOOBIG, "%s is %zu bytes, over %s (%zu)", what, v.size, limit, max);
  if (v.size < min) return bs__fail(err, BS_EINVAL, "%s is empty", what);
  return BS_OK;
}

/* The check of element i of an argument array ("rows[3].bucket"). */
static int check_sized_at(bs_val v, size_t min, size_t max, const char *array, size_t i,
                          const char *field, const char *limit, bs_error *err) {
  char what[96];
  snprintf(what, sizeof what, "%s[%zu]%s", array, i, field);
  return check_sized(v, min, max, what, limit, err);
}

/* The two checks with the limit named by its macro (BS_MAX_*), written once. The common case
 * is decided inline, without a call or a formatted name: these run once per field of every
 * save and per element of every read request. */
#define CHECK_SIZED(v, min, max, what, err)                                                        \
  (sized_ok(v, min, max) ? BS_OK : check_sized(v, min, max, what, #max, err))
#define CHECK_SIZED_AT(v, min, max, array, i, field, err)                                          \
  (sized_ok(v, min, max) ? BS_OK : check_sized_at(v, min, max, array, i, field, #max, err))

static int check_lsn(bs_val lsn, bs_error *err) {
  return CHECK_SIZED(lsn, 0, BS_MAX_LSN, "lsn", err);
}

#define BS_MAX_EVENT_NAME 255u /* a custom write checkpoint's event (storage.h) */
static int check_event(bs_val event, bs_error *err) {
  return check_sized(event, 0, BS_MAX_EVENT_NAME, "event", "the event name limit", err);
}

static int check_row(const bs_row *r, size_t i, bs_error *err) {
  int rc;
  if ((rc = CHECK_SIZED_AT(r->bucket, 1, BS_MAX_BUCKET_NAME, "rows", i, ".bucket", err)) ||
      (rc =
           CHECK_SIZED_AT(r->object_type, 0, BS_MAX_OBJECT_NAME, "rows", i, ".object_type", err)) ||
      (rc = CHECK_SIZED_AT(r->object_id, 0, BS_MAX_OBJECT_NAME, "rows", i, ".object_id", err)))
    return rc;
  return CHECK_SIZED_AT(r->data, 0, BS_MAX_OP_DATA, "rows", i, ".data", err);
}

static int check_lookup(const bs_lookup *l, size_t i, bs_error *err) {
  char what[64];
  int rc;
  if ((rc = CHECK_SIZED_AT(l->key, 0, BS_MAX_LOOKUP_KEY, "lookups", i, ".key", err))) return rc;
  if (l->n_params && !l->params)
    return bs__fail(err, BS_EINVAL, "lookups[%zu].params: NULL with n_params %zu", i, l->n_params);
  for (size_t j = 0; j < l->n_params; j++)
    if (!sized_ok(l->params[j], 0, BS_MAX_OP_DATA)) { /* the name only then */
      snprintf(what, sizeof what, "lookups[%zu].params", i);
      return CHECK_SIZED_AT(l->params[j], 0, BS_MAX_OP_DATA, what, j, "", err);
    }
  return BS_OK;
}

/* change copied into s (its version's fields, the later ones at their defaults) and checked. */
static int check_save(const bs_save *change, bs_save *s, bs_error *err) {
  static const bs_save defaults = BS_SAVE_INIT;
  int rc;
  *s = defaults;
  if (!change) return bs__fail(err, BS_EINVAL, "change: NULL");
  if ((rc = BS_VERSIONED_COPY(s, change, bs_save, "change->version", err))) return rc;
  if ((rc = CHECK_SIZED(s->table, 1, BS_MAX_TABLE_NAME, "change->table", err))) return rc;
  if (s->tag != BS_INSERT && s->tag != BS_UPDATE && s->tag != BS_DELETE)
    return bs__fail(err, BS_EINVAL, "change->tag: %d is not INSERT, UPDATE or DELETE", (int)s->tag);
  if ((rc = CHECK_SIZED(s->before_id, 0, BS_MAX_REPLICA_ID, "change->before_id", err))) return rc;
  if ((rc = CHECK_SIZED(s->after_id, 0, BS_MAX_REPLICA_ID, "change->after_id", err))) return rc;
  if (s->tag != BS_DELETE && !s->after_id.data)
    return bs__fail(err, BS_EINVAL, "change->after_id: required for INSERT and UPDATE");
  if (s->tag == BS_DELETE && !s->before_id.data && !s->after_id.data)
    return bs__fail(err, BS_EINVAL, "change->before_id: required for DELETE");
  if (s->n_rows && !s->rows)
    return bs__fail(err, BS_EINVAL, "change->rows: NULL with n_rows %zu", s->n_rows);
  if (s->n_lookups && !s->lookups)
    return bs__fail(err, BS_EINVAL, "change->lookups: NULL with n_lookups %zu", s->n_lookups);
  for (size_t i = 0; i < s->n_rows; i++)
    if ((rc = check_row(&s->rows[i], i, err))) return rc;
  for (size_t i = 0; i < s->n_lookups; i++)
    if ((rc = check_lookup(&s->lookups[i], i, err))) return rc;
  return CHECK_SIZED(s->stored_data, 0, BS_MAX_OP_DATA, "change->stored_data", err);
}

/* ---- Callbacks ------------------------------------------------------------------------------- */

/* A host's callback on its way through a backend (storage.h CONVENTIONS): the slot gets a
 * trampoline that calls the host's function, keeps its first non-zero return and hands the
 * backend BS_EUSER, a status every backend returns as it is; the front then reports the call's
 * result by the one rule (bs__callback_fail), whatever the backend made of it. */
typedef struct callback {
  const char *name; /* the callback as the message names it: "bs_db_export's fn" */
  union {
    int (*stream)(const bs_stream_info *, void *);
    int (*bucket)(const bs_bucket_info *, void *);
    int (*chunk)(const bs_chunk *, void *);
    int (*columns)(const bs_chunk_columns *, void *);
    int (*changes)(const bs_checkpoint_changes *, void *);
    int (*val)(const bs_val *, void *);
    int (*record)(const bs_record *, void *);
    int (*next)(bs_record *, void *);
  } fn;
  void *payload;
  int value; /* the first non-zero return; 0 while the host goes on */
} callback;

static int callback_note(callback *c, int value) {
  if (!value) return 0;
  if (!c->value) c->value = value;
  return BS_EUSER;
}

/* The call's status after its slot returned rc. */
static int callback_result(const callback *c, int rc, bs_error *err) {
  return c->value ? bs__callback_fail(err, BS_EUSER, c->name, c->value) : rc;
}

#define CALLBACK_TRAMPOLINE(name, member, T)                                                       \
  static int name(T arg, void *p) {                                                                \
    callback *c = p;                                                                               \
    return callback_note(c, c->fn.member(arg, c->payload));                                        \
  }
CALLBACK_TRAMPOLINE(cb_stream, stream, const bs_stream_info *)
CALLBACK_TRAMPOLINE(cb_bucket, bucket, const bs_bucket_info *)
CALLBACK_TRAMPOLINE(cb_chunk, chunk, const bs_chunk *)
CALLBACK_TRAMPOLINE(cb_columns, columns, const bs_chunk_columns *)
CALLBACK_TRAMPOLINE(cb_val, val, const bs_val *)
CALLBACK_TRAMPOLINE(cb_record, record, const bs_record *)

/* bs_load's next: 1 (a record) and 0 (the end) go to the slot as they are. */
static int cb_next(bs_record *rec, void *p) {
  callback *c = p;
  int value = c->fn.next(rec, c->payload);
  return value == 1 || value == 0 ? value : callback_note(c, value);
}

/* ---- Front: shared checks -------------------------------------------------------------------- */

#define BS_OP_ID_LIMIT 0x8000000000000000ull /* op ids and checkpoints are < 2^63 */

/* The one slot rule of the three tables (storage_backend.h): a slot is usable when it lies
 * within the size of the table's version (BS_TABLE_SIZE: an older, shorter table does not have
 * it, and the version is checked before the slot is read) and is set; else BS_EUNSUPPORTED. */
#define SLOT_OK(t, T, slot)                                                                        \
  ((t) && offsetof(T, slot) + sizeof((t)->slot) <= BS_TABLE_SIZE(T, (t)->version) &&               \
   (t)->slot != NULL)
static int slot_fail(const char *name, bs_error *err) {
  return bs__fail(err, BS_EUNSUPPORTED, "backend does not implement %s", name);
}
#define SLOT_CHECK(t, T, slot, err) (SLOT_OK(t, T, slot) ? BS_OK : slot_fail(#slot, (err)))
#define VT_CHECK(st, slot, err)     SLOT_CHECK((st)->vt, bs_storage_vtable, slot, err)
#define WT_CHECK(w, slot, err)      SLOT_CHECK((w)->vt, bs_writer_vtable, slot, err)
#define DB_CHECK(db, slot, err)     SLOT_CHECK((db)->vt, bs_db_vtable, slot, err)

static int check_op_id(uint64_t v, const char *what, bs_error *err) {
  if (v >= BS_OP_ID_LIMIT)
    return bs__fail(err, BS_EINVAL, "%s: %llu is not below 2^63", what, (unsigned long long)v);
  return BS_OK;
}

static int check_op_id_at(uint64_t v, const char *array, size_t i, const char *field,
                          bs_error *err) {
  char what[96];
  if (v < BS_OP_ID_LIMIT) return BS_OK;
  snprintf(what, sizeof what, "%s[%zu]%s", array, i, field);
  return check_op_id(v, what, err);
}

static int check_bucket_name(bs_val v, const char *what, size_t i, bs_error *err) {
  return CHECK_SIZED_AT(v, 1, BS_MAX_BUCKET_NAME, what, i, "", err);
}

/* The allocator of what the front allocates for st (its database's). */
static const bs_allocator *front_alloc(const bs_storage *st) {
  return st && st->db ? &st->db->alloc : &bs__default_allocator;
}

/* The first check of a call on a handle: it is set; it was opened in this process, not
 * inherited through fork() (BS_ESTATE); a writing call (call names it; NULL: a reading one) is
 * refused on a read-only database (BS_ESTATE). Then the call checks its arguments, and last that
 * its slot is usable (BS_EUNSUPPORTED), so a bad argument is named whatever the backend. */
static int check_db(const bs_db *db, const char *call, bs_error *err) {
  if (!db) return bs__fail(err, BS_EINVAL, "db: NULL");
  if (db->front && db->front->forks != bs__forks())
    return bs__fail(err, BS_ESTATE,
                    "the database was opened before fork(): its environment does not survive "
                    "fork, so the child process must open the database itself");
  if (call && (db->flags & BS_OPEN_RDONLY))
    return bs__fail(err, BS_ESTATE, "%s: the database is open read-only", call);
  return BS_OK;
}
static int check_storage(const bs_storage *st, const char *call, bs_error *err) {
  if (!st) return bs__fail(err, BS_EINVAL, "st: NULL");
  return st->db ? check_db(st->db, call, err) : BS_OK;
}

static int check_writer(const bs_writer *w, bs_error *err) {
  if (!w) return bs__fail(err, BS_EINVAL, "w: NULL");
  return check_storage(w->st, NULL, err);
}

static int check_table(bs_val table, bs_error *err) {
  return CHECK_SIZED(table, 1, BS_MAX_TABLE_NAME, "table", err);
}

/* The checksum cache of st: its database's (a free-standing storage has none). */
static bs__cksum_cache *cache_of(const bs_storage *st) {
  return st->db && st->db->front ? st->db->front->cache : NULL;
}

static void note_checkpoint(bs_storage *st, uint64_t cp) {
  bs__cksum_cache *c = cache_of(st);
  if (c) bs__cksum_cache_note_checkpoint(c, st->stream_id, cp);
}

/* ---- Opening --------------------------------------------------------------------------------- */

/* The checks every bs_open* makes first: out is set (*out NULL until the open succeeds), the
 * name (what: "path", "url"; NULL: none) is neither NULL nor empty, and the options, resolved
 * into o: the backend gets that copy (never more of the caller's struct than its version). */
static int check_open(bs_db **out, const char *what, const char *name, const bs_open_options *opts,
                      bs_open_options *o, bs_error *err) {
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  *out = NULL;
  if (what && (!name || !*name))
    return bs__fail(err, BS_EINVAL, "%s: %s", what, name ? "empty" : "NULL");
  return resolve_open_options(opts, o, err);
}

/* The one rule of which built-in backend a name opens: PostgreSQL for a URL or a libpq
 * key=value string (a keyword, lower-case letters and '_' as libpq's are, then '='), else LMDB.
 * No file path is lost: a file of such a name is reachable as ./name. */
int bs_names_postgres(const char *name) {
  size_t n;
  if (!name) return 0;
  if (!strncmp(name, "postgresql://", 13) || !strncmp(name, "postgres://", 11)) return 1;
  n = strspn(name, "abcdefghijklmnopqrstuvwxyz_");
  return n > 0 && name[n + strspn(name + n, " \t")] == '=';
}

int bs_open(bs_db **out, const char *path, const bs_open_options *opts, bs_error *err) {
  bs_open_options o;
  int rc;
  if ((rc = check_open(out, "path", path, opts, &o, err)) != BS_OK) return rc;
  if (bs_names_postgres(path)) return bs_open_postgres(out, path, &o, err);
  if ((rc = bs__lmdb_open(out, path, &o, err)) != BS_OK) return rc;
  return bs_open_backend(out, *out, &o, err);
}

/* What a build without the PostgreSQL backend tells its user to do: the repository's advice by
 * default; a package that compiles the library has its own (bindings/python/setup.py), since
 * its user has no make to run. */
#ifndef BS_NO_PG_ADVICE
#define BS_NO_PG_ADVICE "make PG=1"
#endif

int bs_open_postgres(bs_db **out, const char *url, const bs_open_options *opts, bs_error *err) {
  bs_open_options o;
  int rc;
  if ((rc = check_open(out, "url", url, opts, &o, err)) != BS_OK) return rc;
#ifdef BS_HAVE_PG
  if ((rc = bs__pg_open(out, url, &o, err)) != BS_OK) return rc;
  return bs_open_backend(out, *out, &o, err);
#else
  return bs__fail(err, BS_EUNSUPPORTED,
                  "url: this build has no PostgreSQL backend (" BS_NO_PG_ADVICE ")");
#endif
}

int bs_open_memory(bs_db **out, const bs_open_options *opts, bs_error *err) {
  bs_open_options o;
  int rc;
  if ((rc = check_open(out, NULL, NULL, opts, &o, err)) != BS_OK) return rc;
  if ((rc = bs__mem_open(out, &o, err)) != BS_OK) return rc;
  return bs_open_backend(out, *out, &o, err);
}

void bs_close(bs_db *db) {
  if (!db) return;
  db_front_free(db);
  db->vt->destroy(db);
}

/* ---- Streams --------------------------------------------------------------------------------- */

int bs_stream_create(uint32_t *id_out, bs_db *db, const char *name, const bs_stream_options *opts,
                     bs_error *err) {
  bs_stream_options o = BS_STREAM_OPTIONS_INIT;
  uint32_t id;
  int rc;
  if ((rc = check_db(db, "stream_create", err))) return rc;
  if (!name) return bs__fail(err, BS_EINVAL, "name: NULL");
  if ((rc = CHECK_SIZED(bs__val_str(name), 1, BS_MAX_STREAM_NAME, "name", err))) return rc;
  if (opts && (rc = BS_VERSIONED_COPY(&o, opts, bs_stream_options, "opts->version", err)))
    return rc;
  if (o.hash != BS_HASH_XXH3 && o.hash != BS_HASH_SHA256)
    return bs__fail(err, BS_EINVAL, "opts->hash: unknown hash %d", (int)o.hash);
  if ((rc = DB_CHECK(db, stream_create, err))) return rc;
  rc = db->vt->stream_create(&id, db, bs__val_str(name), &o, err);
  if (rc == BS_OK && id_out) *id_out = id;
  return rc;
}

int bs_stream_list(bs_db *db, int (*fn)(const bs_stream_info *info, void *payload), void *payload,
                   bs_error *err) {
  callback c = {"bs_stream_list's fn", {.stream = fn}, payload, 0};
  int rc;
  if ((rc = check_db(db, NULL, err))) return rc;
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  if ((rc = DB_CHECK(db, stream_list, err))) return rc;
  rc = db->vt->stream_list(db, cb_stream, &c, err);
  return callback_result(&c, rc, err);
}

/* Stream id 0 (storage.h bs_storage_open): the newest served stream, else the newest one. */
typedef struct stream_pick {
  uint32_t served, newest;
} stream_pick;

static int pick_stream(const bs_stream_info *in, void *payload) {
  stream_pick *p = payload;
  if (in->id > p->newest) p->newest = in->id;
  if (bs__stream_served((unsigned)in->state) && in->id > p->served) p->served = in->id;
  return 0;
}

int bs_storage_open(bs_storage **out, bs_db *db, uint32_t stream_id, bs_error *err) {
  stream_pick p = {0, 0};
  int rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  *out = NULL;
  if ((rc = check_db(db, NULL, err))) return rc;
  if ((rc = DB_CHECK(db, storage_open, err))) return rc;
  if (!stream_id && SLOT_OK(db->vt, bs_db_vtable, stream_list)) {
    if ((rc = db->vt->stream_list(db, pick_stream, &p, err))) return rc;
    if (!(stream_id = p.served ? p.served : p.newest))
      return bs__fail(err, BS_ENOTFOUND, "the database has no stream");
  }
  if ((rc = db->vt->storage_open(out, db, stream_id, err)) == BS_OK)
    rc = HANDLE_CHECK(*out, bs_storage_vtable, "storage_open", err);
  if (rc != BS_OK) *out = NULL;
  return rc;
}

void bs_storage_close(bs_storage *st) {
  if (st) st->vt->destroy(st);
}

uint32_t bs_storage_stream_id(const bs_storage *st) {
  return st ? st->stream_id : 0;
}

/* ---- Writing --------------------------------------------------------------------------------- */

/* ONE WRITER PER STREAM AND KIND (storage.h bs_writer_open), the rule of every backend: its
 * writer_lock slot says whether the lock is free, in whatever reach its writers have (a process,
 * a file's processes, a server's hosts); the answer's words are the front's. */
static int writer_lock(bs_storage *st, int snapshot, bs_error *err) {
  int rc;
  if (!SLOT_OK(st->vt, bs_storage_vtable, writer_lock)) return BS_OK;
  if ((rc = st->vt->writer_lock(st, snapshot, 1, err)) == BS_EBUSY)
    bs__fail(err, BS_EBUSY,
             "stream %u already has a %s writer open, in this or another handle or process (one "
             "per stream and kind)",
             (unsigned)st->stream_id, snapshot ? "snapshot" : "streaming");
  return rc;
}
static void writer_unlock(bs_storage *st, int snapshot) {
  if (SLOT_OK(st->vt, bs_storage_vtable, writer_lock)) st->vt->writer_lock(st, snapshot, 0, NULL);
}

int bs_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *opts, bs_error *err) {
  bs_writer_options o = BS_WRITER_OPTIONS_INIT;
  struct bs__writer_front *f;
  bs_writer *w = NULL;
  int rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  *out = NULL;
  if ((rc = check_storage(st, "writer_open", err))) return rc;
  if (opts && (rc = BS_VERSIONED_COPY(&o, opts, bs_writer_options, "opts->version", err)))
    return rc;
  if (o.max_records == 0) o.max_records = BS_DEFAULT_FLUSH_RECORDS;
  if (o.max_bytes == 0) o.max_bytes = BS_DEFAULT_FLUSH_BYTES;
  if ((rc = VT_CHECK(st, writer_open, err))) return rc;
  if (!(f = bs__calloc(front_alloc(st), 1, sizeof *f)))
    return bs__fail(err, BS_ENOMEM, "cannot allocate the writer's front state");
  if ((rc = writer_lock(st, o.snapshot, err)) != BS_OK) {
    bs__free(front_alloc(st), f);
    return rc;
  }
  if ((rc = st->vt->writer_open(&w, st, &o, err)) == BS_OK)
    rc = HANDLE_CHECK(w, bs_writer_vtable, "writer_open", err);
  if (rc != BS_OK) {
    writer_unlock(st, o.snapshot);
    bs__free(front_alloc(st), f);
    return rc;
  }
  if (!w->st) w->st = st;
  f->locked = st;
  f->opts = o;
  f->q.ar.a = front_alloc(st);
  w->front = f;
  *out = w;
  return BS_OK;
}

void bs_writer_close(bs_writer *w) {
  struct bs__writer_front *f;
  const bs_allocator *a;
  if (!w) return;
  f = w->front;
  a = front_alloc(w->st);
  w->vt->destroy(w); /* what is still queued is dropped (storage.h) */
  writer_unlock(f->locked, f->opts.snapshot);
  bs__queue_free(&f->q, a);
  bs__free(a, f);
}

/* Hands the queue to the backend in one call (its flush or commit): on success it is applied
 * and the queue empty; on failure it stays as it was (storage.h CONVENTIONS). */
static int flush_queue(bs_writer *w, uint64_t *last, bs_error *err) {
  bs_write_batch b = bs__queue_batch(&w->front->q);
  int rc;
  if ((rc = WT_CHECK(w, flush, err))) return rc;
  if ((rc = w->vt->flush(last, w, &b, err)) == BS_OK) bs__queue_reset(&w->front->q);
  return rc;
}

/* The one auto-flush rule (contract.md 4, storage.h bs_writer_options): before a change is queued,
 * a queue at one of its bounds is flushed; if that fails, the change is not queued. */
static int auto_flush(bs_writer *w, bs_error *err) {
  const struct bs__writer_front *f = w->front;
  uint64_t last;
  if (f->q.records < f->opts.max_records && f->q.bytes < f->opts.max_bytes) return BS_OK;
  return flush_queue(w, &last, err);
}

/* The save rule (storage.h bs_writer_check_save): change copied into s and checked, then the
 * writer's kind. Reads only what bs_writer_open fixed, so any thread may call it. */
static int check_writer_save(const bs_writer *w, const bs_save *change, bs_save *s, bs_error *err) {
  int rc;
  if ((rc = check_save(change, s, err))) return rc;
  if (w->front->opts.snapshot && s->tag != BS_INSERT)
    return bs__fail(err, BS_ESTATE,
                    "change->tag: a snapshot writer accepts INSERT only (contract.md 4.3)");
  return BS_OK;
}

int bs_writer_check_save(const bs_writer *w, const bs_save *change, bs_error *err) {
  bs_save s;
  if (!w) return bs__fail(err, BS_EINVAL, "w: NULL");
  return check_writer_save(w, change, &s, err);
}

int bs_writer_save(bs_writer *w, const bs_save *change, bs_error *err) {
  bs_save s;
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = check_writer_save(w, change, &s, err))) return rc;
  if ((rc = auto_flush(w, err))) return rc;
  if (bs__queue_save(&w->front->q, front_alloc(w->st), &s) != BS_OK)
    return bs__fail(err, BS_ENOMEM, "cannot queue the change");
  return BS_OK;
}

static int writer_truncate(bs_writer *w, bs_val table, int drop, bs_error *err) {
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = check_table(table, err))) return rc;
  if ((rc = WT_CHECK(w, truncate, err))) return rc;
  /* what was queued before goes first, then the truncate is persisted at once (contract.md
   * 4.2): two transactions, so a failed truncate leaves the queue flushed */
  if (w->front->q.n) {
    uint64_t last;
    if ((rc = flush_queue(w, &last, err))) return rc;
  }
  return w->vt->truncate(w, table, drop, err);
}

int bs_writer_truncate(bs_writer *w, bs_val table, bs_error *err) {
  return writer_truncate(w, table, 0, err);
}

int bs_writer_drop(bs_writer *w, bs_val table, bs_error *err) {
  return writer_truncate(w, table, 1, err);
}

int bs_writer_flush(uint64_t *last_op_out, bs_writer *w, bs_error *err) {
  uint64_t last = 0;
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = flush_queue(w, &last, err)) == BS_OK && last_op_out) *last_op_out = last;
  return rc;
}

/* create_empty: -1 = the writer's own setting (resolved here, for the backend), 0 or 1. */
static int writer_commit(bs_writer *w, bs_val lsn, int create_empty, bs_commit_result *out,
                         bs_error *err) {
  bs_commit_result r;
  bs_write_batch b;
  int rc;
  memset(&r, 0, sizeof r);
  if ((rc = check_writer(w, err))) return rc;
  if (create_empty < 0) create_empty = w->front->opts.create_empty != 0;
  if ((rc = check_lsn(lsn, err))) return rc;
  if ((rc = WT_CHECK(w, commit, err))) return rc;
  b = bs__queue_batch(&w->front->q);
  if ((rc = w->vt->commit(&r, w, &b, lsn, create_empty, err)) != BS_OK) return rc;
  bs__queue_reset(&w->front->q);
  if (r.checkpoint) note_checkpoint(w->st, r.checkpoint);
  if (r.checkpoint_created) notify_checkpoint(w->st->db, w->st->stream_id, r.checkpoint);
  if (!r.checkpoint_blocked) r.blocked_reason = BS_BLOCKED_NONE;
  if (out) *out = r;
  return BS_OK;
}

int bs_writer_commit(bs_commit_result *out, bs_writer *w, bs_val lsn, const bs_commit_options *opts,
                     bs_error *err) {
  bs_commit_options o = BS_COMMIT_OPTIONS_INIT;
  int rc;
  if (opts && (rc = BS_VERSIONED_COPY(&o, opts, bs_commit_options, "opts->version", err)))
    return rc;
  if (o.create_empty < -1 || o.create_empty > 1)
    return bs__fail(err, BS_EINVAL, "opts->create_empty: %d is not -1, 0 or 1", o.create_empty);
  return writer_commit(w, lsn, o.create_empty, out, err);
}

int bs_writer_keepalive(bs_commit_result *out, bs_writer *w, bs_val lsn, bs_error *err) {
  return writer_commit(w, lsn, 1, out, err);
}

int bs_writer_snapshot_done(bs_writer *w, bs_val lsn, bs_error *err) {
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = check_lsn(lsn, err))) return rc;
  if ((rc = WT_CHECK(w, snapshot_done, err))) return rc;
  return w->vt->snapshot_done(w, lsn, err);
}

int bs_writer_resume_lsn(bs_writer *w, bs_val lsn, bs_error *err) {
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = check_lsn(lsn, err))) return rc;
  if ((rc = WT_CHECK(w, resume_lsn, err))) return rc;
  return w->vt->resume_lsn(w, lsn, err);
}

int bs_writer_source_row(bs_writer *w, bs_val table, bs_val replica_id,
                         int (*fn)(const bs_val *data, void *payload), void *payload,
                         bs_error *err) {
  callback c = {"bs_writer_source_row's fn", {.val = fn}, payload, 0};
  bs_write_batch b;
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = check_table(table, err))) return rc;
  if ((rc = CHECK_SIZED(replica_id, 0, BS_MAX_REPLICA_ID, "replica_id", err))) return rc;
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  if ((rc = WT_CHECK(w, source_row, err))) return rc;
  b = bs__queue_batch(&w->front->q);
  rc = w->vt->source_row(w, &b, table, replica_id, cb_val, &c, err);
  return callback_result(&c, rc, err);
}

/* requested_at_ms < 0: persistent (no requested_at) */
static int custom_write_checkpoint(bs_writer *w, bs_val user_id, uint64_t checkpoint, bs_val event,
                                   int64_t requested_at_ms, bs_error *err) {
  int rc;
  if ((rc = check_writer(w, err))) return rc;
  if ((rc = CHECK_SIZED(user_id, 0, BS_MAX_USER_ID, "user_id", err))) return rc;
  if ((rc = check_op_id(checkpoint, "checkpoint", err))) return rc;
  if ((rc = check_event(event, err))) return rc;
  if (user_id.size + event.size > BS_MAX_USER_EVENT)
    return bs__fail(err, BS_ETOOBIG, "user_id + event: %zu bytes, over BS_MAX_USER_EVENT (%u)",
                    user_id.size + event.size, BS_MAX_USER_EVENT);
  /* queued with the saves, flushed in the same transaction after them */
  if (bs__queue_wcp(&w->front->q, front_alloc(w->st), user_id, checkpoint, event,
                    requested_at_ms) != BS_OK)
    return bs__fail(err, BS_ENOMEM, "cannot queue the write checkpoint");
  return BS_OK;
}

int bs_writer_custom_write_checkpoint(bs_writer *w, bs_val user_id, uint64_t checkpoint,
                                      bs_val event, bs_error *err) {
  return custom_write_checkpoint(w, user_id, checkpoint, event, -1, err);
}

int bs_writer_custom_write_checkpoint_requested(bs_writer *w, bs_val user_id, uint64_t checkpoint,
                                                bs_val event, int64_t requested_at_ms,
                                                bs_error *err) {
  if (requested_at_ms < 0)
    return bs__fail(err, BS_EINVAL, "requested_at_ms: %lld is negative",
                    (long long)requested_at_ms);
  return custom_write_checkpoint(w, user_id, checkpoint, event, requested_at_ms, err);
}

/* ---- Reading: checkpoints -------------------------------------------------------------------- */

/* The checkpoint is read from get_status: a backend keeps it in one place, its stream record,
 * and has no slot of its own for it (storage_backend.h, the storage table's version 5). */
static int read_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  bs_status s;
  int rc;
  memset(&s, 0, sizeof s);
  if ((rc = st->vt->get_status(&s, st, err)) != BS_OK) return rc;
  memset(out, 0, sizeof *out);
  out->op_id = s.checkpoint;
  out->has_lsn = s.has_lsn;
  out->lsn_size = s.lsn_size;
  memcpy(out->lsn, s.lsn, s.lsn_size);
  note_checkpoint(st, out->op_id);
  return BS_OK;
}

int bs_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  bs_checkpoint cp;
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  if ((rc = VT_CHECK(st, get_status, err))) return rc;
  if ((rc = read_checkpoint(&cp, st, err)) != BS_OK) return rc;
  *out = cp;
  return BS_OK;
}

/* Sleeps up to ms, or until a commit in this process bumps db->notify_seq past seq. */
static void wait_notify(bs_db *db, uint64_t seq, uint64_t ms) {
  struct bs__db_front *f = db ? db->front : NULL;
  struct timespec ts;
  if (!f) {
    ts.tv_sec = (time_t)(ms / 1000u);
    ts.tv_nsec = (long)(ms % 1000u) * 1000000L;
    nanosleep(&ts, NULL);
    return;
  }
  ts = bs__monotonic_after(ms);
  pthread_mutex_lock(&f->notify_mu);
  while (f->notify_seq == seq)
    if (pthread_cond_timedwait(&f->notify_cv, &f->notify_mu, &ts) != 0) break;
  pthread_mutex_unlock(&f->notify_mu);
}

int bs_wait_checkpoint(bs_checkpoint *out, bs_storage *st, const bs_checkpoint *known,
                       int timeout_ms, bs_error *err) {
  bs_checkpoint none, cur;
  uint64_t deadline, seq = 0, now;
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  if (timeout_ms < 0) return bs__fail(err, BS_EINVAL, "timeout_ms: %d is negative", timeout_ms);
  if ((rc = VT_CHECK(st, get_status, err))) return rc;
  if (!known) {
    memset(&none, 0, sizeof none);
    known = &none;
  }
  if (SLOT_OK(st->vt, bs_storage_vtable,
              wait_checkpoint)) { /* the backend is woken from other processes */
    memset(&cur, 0, sizeof cur);
    if ((rc = st->vt->wait_checkpoint(&cur, st, known, (uint64_t)timeout_ms, err)) != BS_OK)
      return rc;
    note_checkpoint(st, cur.op_id);
    *out = cur;
    return BS_OK;
  }
  deadline = bs__monotonic_ms() + (uint64_t)timeout_ms;
  for (;;) {
    /* Read the sequence before the checkpoint: a commit between the two then ends the wait
     * at once instead of being missed. */
    if (st->db && st->db->front) {
      pthread_mutex_lock(&st->db->front->notify_mu);
      seq = st->db->front->notify_seq;
      pthread_mutex_unlock(&st->db->front->notify_mu);
    }
    if ((rc = read_checkpoint(&cur, st, err)) != BS_OK) return rc;
    now = bs__monotonic_ms();
    if (bs__checkpoint_differs(&cur, known) || now >= deadline) break;
    wait_notify(st->db, seq, deadline - now < BS_WAIT_POLL_MS ? deadline - now : BS_WAIT_POLL_MS);
  }
  *out = cur;
  return BS_OK;
}

int bs_set_checkpoint_listener(bs_db *db,
                               void (*fn)(uint32_t stream, uint64_t checkpoint, void *payload),
                               void *payload) {
  struct bs__db_front *f = db ? db->front : NULL;
  if (!f) return BS_EINVAL;
  pthread_mutex_lock(&f->notify_mu);
  f->listener = fn;
  f->listener_payload = fn ? payload : NULL;
  pthread_mutex_unlock(&f->notify_mu);
  return BS_OK;
}

/* ---- Reading: bucket data -------------------------------------------------------------------- */

/* A name (the first field of an array element) and its element's index. */
typedef struct name_ref {
  bs_val name;
  size_t index;
} name_ref;

static int name_ref_cmp(const void *a, const void *b) {
  const name_ref *x = a, *y = b;
  int c = bs__val_cmp(x->name, y->name);
  if (c) return c;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* The names of the n elements (each `stride` bytes, a bs_val first) at base, sorted by name,
 * equal names in element order; NULL when out of memory. Freed with bs__free. */
static name_ref *sort_names(const bs_allocator *a, const void *base, size_t stride, size_t n) {
  name_ref *r = bs__calloc(a, n, sizeof *r);
  for (size_t i = 0; r && i < n; i++) {
    memcpy(&r[i].name, (const char *)base + i * stride, sizeof r[i].name);
    r[i].index = i;
  }
  if (r) qsort(r, n, sizeof *r, name_ref_cmp);
  return r;
}

static int check_batch_options(const bs_batch_options *opts, bs_batch_options *o, bs_error *err) {
  bs_batch_options def = BS_BATCH_OPTIONS_INIT;
  int rc;
  *o = def;
  if (opts && (rc = BS_VERSIONED_COPY(o, opts, bs_batch_options, "opts->version", err))) return rc;
  if (o->limit == 0)
    return bs__fail(err, BS_EINVAL, "opts->limit: 0 ops per call (the default is %u)",
                    BS_BATCH_LIMIT_DEFAULT);
  if (o->max_bytes == 0) o->max_bytes = BS_DEFAULT_BATCH_BYTES;
  return BS_OK;
}

/* bs_get_bucket_data and bs_get_bucket_columns: the checks, the requests sorted by name, and
 * the backend's slot called with on_chunk, payload (the front's trampoline and its callback c;
 * for columns, bs__cols_chunk and its bs__cols). */
static int bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                       const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                       int columns, int (*on_chunk)(const bs_chunk *, void *), void *payload,
                       bs_error *err) {
  bs_batch_options o;
  bs_bucket_request *sorted = NULL;
  name_ref *refs = NULL;
  int has_more = 0, rc;
  size_t i, m = 0;
  const bs_allocator *a = front_alloc(st);

  if (has_more_out) *has_more_out = 0;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = check_op_id(checkpoint, "checkpoint", err))) return rc;
  if (n_req && !req) return bs__fail(err, BS_EINVAL, "req: NULL with n_req %zu", n_req);
  if (!on_chunk) return bs__fail(err, BS_EINVAL, "on_chunk: NULL");
  if ((rc = check_batch_options(opts, &o, err))) return rc;
  /* a chunk's field offsets are 32-bit; ops are far smaller (BS_MAX_OP_DATA) */
  if (columns && o.chunk_bytes > UINT32_MAX) o.chunk_bytes = UINT32_MAX;
  for (i = 0; i < n_req; i++) {
    if ((rc = check_bucket_name(req[i].bucket, "req.bucket", i, err))) return rc;
    if ((rc = check_op_id_at(req[i].after, "req", i, ".after", err))) return rc;
  }
  if ((rc = VT_CHECK(st, bucket_data, err))) return rc;
  if (n_req == 0) return BS_OK;

  /* Backends get the requests sorted by name without duplicates; a repeated bucket keeps its
   * last request (the reference service keys requests by bucket name in a map). */
  refs = sort_names(a, req, sizeof *req, n_req);
  sorted = bs__calloc(a, n_req, sizeof *sorted);
  if (!refs || !sorted) {
    rc = bs__fail(err, BS_ENOMEM, "cannot sort %zu bucket requests", n_req);
    goto done;
  }
  for (i = 0; i < n_req; i++)
    if (i + 1 == n_req || !bs__val_eq(refs[i].name, refs[i + 1].name))
      sorted[m++] = req[refs[i].index];
  rc = st->vt->bucket_data(&has_more, st, checkpoint, sorted, m, &o, on_chunk, payload, err);
  if (rc == BS_OK && has_more_out) *has_more_out = has_more;
done:
  bs__free(a, refs);
  bs__free(a, sorted);
  return rc;
}

int bs_get_bucket_data(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                       const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                       int (*on_chunk)(const bs_chunk *chunk, void *payload), void *payload,
                       bs_error *err) {
  callback c = {"bs_get_bucket_data's on_chunk", {.chunk = on_chunk}, payload, 0};
  int rc = bucket_data(has_more_out, st, checkpoint, req, n_req, opts, 0,
                       on_chunk ? cb_chunk : NULL, &c, err);
  rc = callback_result(&c, rc, err);
  if (rc && has_more_out) *has_more_out = 0;
  return rc;
}

int bs_get_bucket_columns(int *has_more_out, bs_storage *st, uint64_t checkpoint,
                          const bs_bucket_request *req, size_t n_req, const bs_batch_options *opts,
                          int (*on_chunk)(const bs_chunk_columns *chunk, void *payload),
                          void *payload, bs_error *err) {
  callback c = {"bs_get_bucket_columns's on_chunk", {.columns = on_chunk}, payload, 0};
  bs__cols s;
  int rc;
  memset(&s, 0, sizeof s);
  s.a = st ? front_alloc(st) : NULL;
  s.on_chunk = cb_columns;
  s.payload = &c;
  s.err = err;
  rc = bucket_data(has_more_out, st, checkpoint, req, n_req, opts, 1,
                   on_chunk ? bs__cols_chunk : NULL, &s, err);
  rc = callback_result(&c, rc, err);
  if (rc && has_more_out) *has_more_out = 0;
  bs__cols_free(&s);
  return rc;
}

/* ---- Reading: checksums, changes, parameters ------------------------------------------------- */

int bs_get_checksums(bs_checksum *out, bs_storage *st, uint64_t checkpoint, const bs_val *buckets,
                     size_t n, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = check_op_id(checkpoint, "checkpoint", err))) return rc;
  if (n && !buckets) return bs__fail(err, BS_EINVAL, "buckets: NULL with n %zu", n);
  if (n && !out) return bs__fail(err, BS_EINVAL, "out: NULL with n %zu", n);
  for (size_t i = 0; i < n; i++)
    if ((rc = check_bucket_name(buckets[i], "buckets", i, err))) return rc;
  if ((rc = VT_CHECK(st, checksums, err))) return rc;
  if (n == 0) return BS_OK;
  if (cache_of(st)) return bs__cksum_cache_get(cache_of(st), st, checkpoint, buckets, n, out, err);
  return st->vt->checksums(out, NULL, st, checkpoint, buckets, n, err);
}

/* ---- Reading: listing buckets --------------------------------------------------------------- */

int bs_list_buckets(bs_storage *st, bs_val start_after,
                    int (*fn)(const bs_bucket_info *info, void *payload), void *payload,
                    bs_error *err) {
  callback c = {"bs_list_buckets's fn", {.bucket = fn}, payload, 0};
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = CHECK_SIZED(start_after, 0, BS_MAX_BUCKET_NAME, "start_after", err))) return rc;
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  if ((rc = VT_CHECK(st, list_buckets, err))) return rc;
  rc = st->vt->list_buckets(st, start_after, cb_bucket, &c, err);
  return callback_result(&c, rc, err);
}

/* A kind over the change-record cap (bs__changes_too_many), or one the backend invalidated (range
 * unknown, a record's own too-many flag), is reported as invalidate-all without a list. So a
 * backend reports what it collected and may stop collecting a kind at bs__changes_enough(). */
static void list_capped(int *invalidate, const bs_val **list, size_t *n) {
  if (!*invalidate && !bs__changes_too_many(*n)) return;
  *invalidate = 1;
  *list = NULL;
  *n = 0;
}

static int changes_capped(const bs_checkpoint_changes *in, void *payload) {
  callback *c = payload;
  bs_checkpoint_changes ch = *in;
  list_capped(&ch.invalidate_data_buckets, &ch.updated_buckets, &ch.n_updated_buckets);
  list_capped(&ch.invalidate_parameter_buckets, &ch.updated_lookups, &ch.n_updated_lookups);
  return callback_note(c, c->fn.changes(&ch, c->payload));
}

int bs_get_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                              int (*fn)(const bs_checkpoint_changes *changes, void *payload),
                              void *payload, bs_error *err) {
  callback c = {"bs_get_checkpoint_changes's fn", {.changes = fn}, payload, 0};
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = check_op_id(from, "from", err))) return rc;
  if ((rc = check_op_id(to, "to", err))) return rc;
  if (from > to)
    return bs__fail(err, BS_EINVAL, "from: %llu is above to (%llu)", (unsigned long long)from,
                    (unsigned long long)to);
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  if ((rc = VT_CHECK(st, checkpoint_changes, err))) return rc;
  rc = st->vt->checkpoint_changes(st, from, to, changes_capped, &c, err);
  return callback_result(&c, rc, err);
}

int bs_get_parameter_sets(bs_storage *st, uint64_t checkpoint, const bs_val *lookups,
                          size_t n_lookups, size_t limit,
                          int (*fn)(const bs_val *params, void *payload), void *payload,
                          bs_error *err) {
  callback c = {"bs_get_parameter_sets's fn", {.val = fn}, payload, 0};
  const bs_allocator *a = front_alloc(st);
  name_ref *refs = NULL;
  bs_val *unique = NULL;
  size_t m = 0;
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = check_op_id(checkpoint, "checkpoint", err))) return rc;
  if (n_lookups && !lookups)
    return bs__fail(err, BS_EINVAL, "lookups: NULL with n_lookups %zu", n_lookups);
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  for (size_t i = 0; i < n_lookups; i++)
    if ((rc = CHECK_SIZED_AT(lookups[i], 0, BS_MAX_LOOKUP_KEY, "lookups", i, "", err))) return rc;
  if ((rc = VT_CHECK(st, parameter_sets, err))) return rc;
  if (n_lookups < 2) {
    rc = st->vt->parameter_sets(st, checkpoint, lookups, n_lookups, limit, cb_val, &c, err);
    return callback_result(&c, rc, err);
  }
  /* Backends get each key once, in the order of its first request: a key asked twice is
   * served once. A repeat's copy is marked by an impossible size (sorting keeps this O(n log n)). */
  refs = sort_names(a, lookups, sizeof *lookups, n_lookups);
  unique = bs__malloc(a, n_lookups * sizeof *unique);
  if (!refs || !unique) {
    rc = bs__fail(err, BS_ENOMEM, "cannot deduplicate %zu lookups", n_lookups);
    goto done;
  }
  memcpy(unique, lookups, n_lookups * sizeof *unique);
  for (size_t i = 1; i < n_lookups; i++)
    if (bs__val_eq(refs[i].name, refs[i - 1].name)) unique[refs[i].index].size = SIZE_MAX;
  for (size_t i = 0; i < n_lookups; i++)
    if (unique[i].size != SIZE_MAX) unique[m++] = unique[i];
  rc = st->vt->parameter_sets(st, checkpoint, unique, m, limit, cb_val, &c, err);
  rc = callback_result(&c, rc, err);
done:
  bs__free(a, refs);
  bs__free(a, unique);
  return rc;
}

/* ---- Write checkpoints ----------------------------------------------------------------------- */

static int check_heads(const bs_head *heads, size_t n, const char *what, bs_error *err) {
  int rc;
  if (n && !heads) return bs__fail(err, BS_EINVAL, "%s: NULL with %zu heads", what, n);
  for (size_t i = 0; i < n; i++) {
    if ((rc = CHECK_SIZED_AT(heads[i].connection, 0, BS_MAX_CONNECTION_NAME, what, i, ".connection",
                             err)) ||
        (rc = CHECK_SIZED_AT(heads[i].lsn, 0, BS_MAX_LSN, what, i, ".lsn", err)))
      return rc;
  }
  return BS_OK;
}

int bs_set_write_checkpoint_mode(bs_storage *st, bs_write_checkpoint_mode mode, bs_val event,
                                 bs_error *err) {
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if (mode != BS_WCP_MANAGED && mode != BS_WCP_CUSTOM)
    return bs__fail(err, BS_EINVAL, "mode: unknown write checkpoint mode %d", (int)mode);
  if ((rc = check_event(event, err))) return rc;
  if ((rc = VT_CHECK(st, set_write_checkpoint_mode, err))) return rc;
  return st->vt->set_write_checkpoint_mode(st, mode, event, err);
}

int bs_create_managed_write_checkpoints(uint64_t *ids_out, int *should_advance, bs_storage *st,
                                        const bs_managed_request *req, size_t n, bs_error *err) {
  int advance = 0, rc;
  if ((rc = check_storage(st, "create_managed_write_checkpoints", err))) return rc;
  if (n && !req) return bs__fail(err, BS_EINVAL, "req: NULL with n %zu", n);
  if (n && !ids_out) return bs__fail(err, BS_EINVAL, "ids_out: NULL with n %zu", n);
  for (size_t i = 0; i < n; i++) {
    char what[48];
    if ((rc = CHECK_SIZED_AT(req[i].user_id, 0, BS_MAX_USER_ID, "req", i, ".user_id", err)))
      return rc;
    if (req[i].n_heads > BS_MAX_HEADS) /* stored as a u16 count */
      return bs__fail(err, BS_ETOOBIG, "req[%zu].heads: %zu heads (limit BS_MAX_HEADS, %u)", i,
                      req[i].n_heads, BS_MAX_HEADS);
    if (req[i].n_heads) { /* the heads' names are only built when there are heads */
      snprintf(what, sizeof what, "req[%zu].heads", i);
      if ((rc = check_heads(req[i].heads, req[i].n_heads, what, err))) return rc;
    }
    if (req[i].has_request_id &&
        (rc = check_op_id_at(req[i].request_id, "req", i, ".request_id", err)))
      return rc;
  }
  if ((rc = VT_CHECK(st, create_managed_write_checkpoints, err))) return rc;
  rc = st->vt->create_managed_write_checkpoints(ids_out, &advance, st, req, n, err);
  if (rc == BS_OK && should_advance) *should_advance = advance;
  return rc;
}

int bs_last_write_checkpoint(uint64_t *id_out, int *found, bs_storage *st, bs_val user_id,
                             const bs_head *heads, size_t n_heads, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if ((rc = CHECK_SIZED(user_id, 0, BS_MAX_USER_ID, "user_id", err))) return rc;
  if ((rc = check_heads(heads, n_heads, "heads", err))) return rc;
  if (!id_out) return bs__fail(err, BS_EINVAL, "id_out: NULL");
  if (!found) return bs__fail(err, BS_EINVAL, "found: NULL");
  if ((rc = VT_CHECK(st, last_write_checkpoint, err))) return rc;
  *id_out = 0;
  *found = 0;
  return st->vt->last_write_checkpoint(id_out, found, st, user_id, heads, n_heads, err);
}

int bs_delete_checkpoint_requests_before(uint64_t *deleted_out, bs_storage *st, int64_t before_ms,
                                         bs_error *err) {
  uint64_t deleted = 0;
  int rc;
  if ((rc = check_storage(st, "delete_checkpoint_requests_before", err))) return rc;
  if ((rc = VT_CHECK(st, delete_checkpoint_requests_before, err))) return rc;
  rc = st->vt->delete_checkpoint_requests_before(&deleted, st, before_ms, err);
  if (rc == BS_OK && deleted_out) *deleted_out = deleted;
  return rc;
}

/* ---- Compaction ------------------------------------------------------------------------------ */

int bs_compact_bucket_due(int *due, const bs_compact_options *opts, const bs_bucket_info *bucket,
                          bs_error *err) {
  bs_compact_options o;
  int rc;
  if (!due) return bs__fail(err, BS_EINVAL, "due: NULL");
  *due = 0;
  if (!bucket) return bs__fail(err, BS_EINVAL, "bucket: NULL");
  if ((rc = bs__compact_options_resolve(&o, opts, err))) return rc;
  *due = bs__compact_due(&o, bucket->changes, bucket->count);
  return BS_OK;
}

int bs_compact(bs_compact_stats *stats_out, bs_storage *st, const bs_compact_options *opts,
               bs_error *err) {
  bs_compact_options o;
  bs_compact_stats stats;
  int rc;
  if ((rc = check_storage(st, "compact", err))) return rc;
  /* One place for the defaults and range checks (compact.c), so every backend gets the same. */
  if ((rc = bs__compact_options_resolve(&o, opts, err))) return rc;
  for (size_t i = 0; i < o.n_buckets; i++)
    if ((rc = check_bucket_name(o.buckets[i], "opts->buckets", i, err))) return rc;
  if (o.defragment_ratio != o.defragment_ratio || o.defragment_ratio < 0)
    return bs__fail(err, BS_EINVAL, "opts->defragment_ratio: not a number >= 0");
  if ((rc = VT_CHECK(st, compact, err))) return rc;
  memset(&stats, 0, sizeof stats);
  rc = st->vt->compact(&stats, st, &o, err);
  /* Partial statistics are reported on cancel too: the transactions done are committed. */
  if (stats_out) *stats_out = stats;
  return rc;
}

int bs_compact_initial_replication(uint64_t *buckets_out, bs_storage *st, uint64_t max_op_id,
                                   uint64_t min_bucket_changes, bs_error *err) {
  uint64_t buckets = 0;
  int rc;
  if ((rc = check_storage(st, "compact_initial_replication", err))) return rc;
  if ((rc = check_op_id(max_op_id, "max_op_id", err))) return rc;
  if ((rc = VT_CHECK(st, compact_initial_replication, err))) return rc;
  rc = st->vt->compact_initial_replication(&buckets, st, max_op_id,
                                           min_bucket_changes ? min_bucket_changes : 1, err);
  if (rc == BS_OK && buckets_out) *buckets_out = buckets;
  return rc;
}

/* ---- Lifecycle and inspection ---------------------------------------------------------------- */

int bs_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, NULL, err))) return rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  if ((rc = VT_CHECK(st, get_status, err))) return rc;
  memset(out, 0, sizeof *out);
  if ((rc = st->vt->get_status(out, st, err))) return rc;
  out->snapshot_done &= out->has_lsn; /* reported once a checkpoint exists (storage.h) */
  return BS_OK;
}

int bs_report_error(bs_storage *st, const char *message, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, "report_error", err))) return rc;
  if (!message) return bs__fail(err, BS_EINVAL, "message: NULL");
  if ((rc = VT_CHECK(st, report_error, err))) return rc;
  return st->vt->report_error(st, message, err);
}

int bs_clear(bs_storage *st, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, "clear", err))) return rc;
  if ((rc = VT_CHECK(st, clear, err))) return rc;
  rc = st->vt->clear(st, err);
  /* Dropped either way: after a failed clear the cache just recomputes. */
  if (cache_of(st)) bs__cksum_cache_drop_stream(cache_of(st), st->stream_id);
  return rc;
}

int bs_terminate(bs_storage *st, int clear, bs_error *err) {
  int rc;
  if ((rc = check_storage(st, "terminate", err))) return rc;
  if ((rc = VT_CHECK(st, terminate, err))) return rc;
  rc = st->vt->terminate(st, clear, err);
  if (cache_of(st)) bs__cksum_cache_drop_stream(cache_of(st), st->stream_id);
  return rc;
}

int bs_db_stat(bs_stat *out, bs_db *db, bs_error *err) {
  int rc;
  if ((rc = check_db(db, NULL, err))) return rc;
  if (!out) return bs__fail(err, BS_EINVAL, "out: NULL");
  if ((rc = DB_CHECK(db, stat, err))) return rc;
  memset(out, 0, sizeof *out);
  return db->vt->stat(out, db, err);
}

int bs_db_verify(uint64_t *problems_out, bs_db *db, void (*fn)(const char *problem, void *payload),
                 void *payload, bs_error *err) {
  uint64_t problems = 0;
  int rc;
  if ((rc = check_db(db, NULL, err))) return rc;
  if ((rc = DB_CHECK(db, verify, err))) return rc;
  rc = db->vt->verify(&problems, db, fn, payload, err);
  if (problems_out) *problems_out = problems;
  return rc;
}

/* opts (NULL = defaults) checked and copied into o (bs_backup and bs_load). */
static int resolve_backup_options(bs_backup_options *o, const bs_backup_options *opts,
                                  bs_error *err) {
  static const bs_backup_options defaults = BS_BACKUP_OPTIONS_INIT;
  int rc;
  *o = defaults;
  if (opts && (rc = BS_VERSIONED_COPY(o, opts, bs_backup_options, "opts->version", err))) return rc;
  if (o->flags & ~BS_BACKUP_REPLACE)
    return bs__fail(err, BS_EINVAL, "opts->flags: unknown bits 0x%x",
                    o->flags & ~BS_BACKUP_REPLACE);
  return BS_OK;
}

int bs_backup(bs_db *db, const char *path, const bs_backup_options *opts, bs_error *err) {
  bs_backup_options o;
  int rc;
  if ((rc = check_db(db, NULL, err))) return rc;
  if (!path || !*path) return bs__fail(err, BS_EINVAL, "path: NULL or empty");
  if ((rc = resolve_backup_options(&o, opts, err))) return rc;
  if ((rc = DB_CHECK(db, backup, err))) return rc;
  return db->vt->backup(db, path, &o, err);
}

int bs_db_export(bs_db *db, uint32_t stream, int (*fn)(const bs_record *rec, void *payload),
                 void *payload, bs_error *err) {
  callback c = {"bs_db_export's fn", {.record = fn}, payload, 0};
  int rc;
  if ((rc = check_db(db, NULL, err))) return rc;
  if (!fn) return bs__fail(err, BS_EINVAL, "fn: NULL");
  if ((rc = DB_CHECK(db, export_records, err))) return rc;
  rc = db->vt->export_records(db, stream, cb_record, &c, err);
  return callback_result(&c, rc, err);
}

/* The table whose load slot makes the database path names (bs_open's choice of backend). */
static int load_table(const bs_db_vtable **out, const char *path, bs_error *err) {
  *out = &bs__lmdb_db_vt;
  if (!bs_names_postgres(path)) return BS_OK;
#ifdef BS_HAVE_PG
  BS_UNUSED(err);
  *out = &bs__pg_db_vt;
  return BS_OK;
#else
  return bs__fail(err, BS_EUNSUPPORTED,
                  "path: this build has no PostgreSQL backend (" BS_NO_PG_ADVICE ")");
#endif
}

int bs_load(const char *path, const bs_backup_options *opts,
            int (*next)(bs_record *rec, void *payload), void *payload, bs_error *err) {
  callback c = {"bs_load's next", {.next = next}, payload, 0};
  const bs_db_vtable *vt;
  bs_backup_options o;
  int rc;
  if (!path || !*path) return bs__fail(err, BS_EINVAL, "path: NULL or empty");
  if (!next) return bs__fail(err, BS_EINVAL, "next: NULL");
  if ((rc = resolve_backup_options(&o, opts, err))) return rc;
  if (o.flags & BS_BACKUP_REPLACE)
    return bs__fail(err, BS_EINVAL, "opts->flags: BS_BACKUP_REPLACE: load never replaces a file");
  if ((rc = bs__allocator_resolve(o.allocator, &o.allocator, err))) return rc;
  if ((rc = load_table(&vt, path, err))) return rc;
  if ((rc = SLOT_CHECK(vt, bs_db_vtable, load, err))) return rc;
  rc = vt->load(path, &o, cb_next, &c, err);
  return callback_result(&c, rc, err);
}
