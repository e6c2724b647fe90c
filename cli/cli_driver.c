/*
 * cli_driver.c: `bucketstore drive`, the JSON-lines driver of docs/driver.md. One command
 * object per input line, one reply object per output line, in order, flushed after each.
 *
 * Commands are a table of (name, handler, needs): the dispatcher resolves the storage (the
 * stream's handle) and the named writer a command needs before calling its handler, so handlers only parse fields
 * (with the f_* helpers, whose BS_EINVAL messages name the field) and call the library.
 * Everything a handler allocates for one command goes to a per-command arena freed after the
 * reply is written, so handlers have no cleanup paths of their own.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A named writer of one stream, opened on first use. */
typedef struct drv_writer {
  uint32_t stream;
  char *name;
  bs_writer *w;
  struct drv_writer *next;
} drv_writer;

/* One storage (a stream's handle) per stream id, kept open so that per-handle settings (the
 * write-checkpoint mode) last, and so writers can point at it. */
typedef struct drv_stream {
  uint32_t id;
  bs_storage *st;
  bs_write_checkpoint_mode wcp_mode; /* as last set on st (write_checkpoint.last needs it) */
  struct drv_stream *next;
} drv_stream;

typedef struct drv {
  cli_db c;
  drv_stream *streams;
  drv_writer *writers;
  /* the current command's resolved stream and writer */
  bs_storage *st;
  bs_writer *w;
  /* per-command arena */
  void **arena;
  size_t n_arena, cap_arena;
} drv;

/* ---- Errors and the arena ------------------------------------------------------------------- */

/* Room for one more arena entry. */
static int tmp_reserve(drv *d) {
  if (d->n_arena == d->cap_arena) {
    size_t cap = d->cap_arena ? 2 * d->cap_arena : 64;
    void **a = realloc(d->arena, cap * sizeof *a);
    if (!a) return -1;
    d->arena = a;
    d->cap_arena = cap;
  }
  return 0;
}

static void *tmp_alloc(drv *d, size_t n) {
  void *p;
  if (tmp_reserve(d) != 0 || !(p = calloc(1, n ? n : 1))) return NULL;
  d->arena[d->n_arena++] = p;
  return p;
}

/* n elements of size bytes, or NULL (also on overflow). */
static void *tmp_array(drv *d, size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  return tmp_alloc(d, n * size);
}

/* Takes ownership of p (malloc'd, e.g. by json_dumps): freed with the arena. */
static int tmp_adopt(drv *d, void *p) {
  if (tmp_reserve(d) != 0) return -1;
  d->arena[d->n_arena++] = p;
  return 0;
}

static void tmp_reset(drv *d) {
  while (d->n_arena) free(d->arena[--d->n_arena]);
}

/* ---- Field parsing -----------------------------------------------------------------------------
 * Each f_* reads field k of object o. Required fields fail with "missing field 'k'"; a field of
 * the wrong type with "field 'k' must be ...". Optional absent fields leave the default. */

static json_t *field(json_t *o, const char *k, int required, bs_error *err, int *rc) {
  json_t *v = json_object_get(o, k);
  *rc = BS_OK;
  if (v && json_is_null(v) && !required) v = NULL; /* explicit null = absent, for optionals */
  if (!v && required) *rc = cli_fail(err, BS_EINVAL, "missing field '%s'", k);
  return v;
}

/* A string; absent optional: out->data stays NULL. */
static int f_str(json_t *o, const char *k, int required, bs_val *out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, required, err, &rc);
  if (!v) return rc;
  if (!json_is_string(v)) return cli_fail(err, BS_EINVAL, "field '%s' must be a string", k);
  out->data = json_string_value(v);
  out->size = json_string_length(v);
  return BS_OK;
}

/* A string usable as a C string (no NUL inside). */
static int f_cstr(json_t *o, const char *k, int required, const char **out, bs_error *err) {
  bs_val v = {NULL, 0};
  int rc = f_str(o, k, required, &v, err);
  if (rc != BS_OK || !v.data) return rc;
  if (strlen(v.data) != v.size) return cli_fail(err, BS_EINVAL, "field '%s' contains a NUL", k);
  *out = v.data;
  return BS_OK;
}

/* A 64-bit id as a decimal string: digits only, < 2^63. */
static int parse_id(const char *s, size_t n, uint64_t *out) {
  uint64_t x = 0;
  size_t i;
  if (n == 0 || n > 19) return -1;
  for (i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    x = x * 10 + (uint64_t)(s[i] - '0'); /* 19 digits < 2^64: no overflow */
  }
  if (x > (uint64_t)INT64_MAX) return -1;
  *out = x;
  return 0;
}

static int f_id_value(json_t *v, const char *k, uint64_t *out, bs_error *err) {
  if (!json_is_string(v) || parse_id(json_string_value(v), json_string_length(v), out) != 0)
    return cli_fail(err, BS_EINVAL, "field '%s' must be a decimal string below 2^63", k);
  return BS_OK;
}

static int f_id(json_t *o, const char *k, int required, uint64_t *out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, required, err, &rc);
  return v ? f_id_value(v, k, out, err) : rc;
}

static int f_int(json_t *o, const char *k, int required, int64_t min, int64_t max, int64_t *out,
                 bs_error *err) {
  int rc;
  json_t *v = field(o, k, required, err, &rc);
  if (!v) return rc;
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
    return cli_fail(err, BS_EINVAL, "field '%s' must be an integer in [%lld, %lld]", k,
                    (long long)min, (long long)max);
  *out = json_integer_value(v);
  return BS_OK;
}

/* A non-negative count or size. */
static int f_size(json_t *o, const char *k, size_t *out, bs_error *err) {
  int64_t x = 0;
  int rc = f_int(o, k, 0, 0, INT64_MAX, &x, err);
  if (rc == BS_OK && json_object_get(o, k) && !json_is_null(json_object_get(o, k)))
    *out = (size_t)x;
  return rc;
}

static int f_bool(json_t *o, const char *k, int *out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, 0, err, &rc);
  if (!v) return rc;
  if (!json_is_boolean(v)) return cli_fail(err, BS_EINVAL, "field '%s' must be a boolean", k);
  *out = json_is_true(v);
  return BS_OK;
}

static int f_num(json_t *o, const char *k, double *out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, 0, err, &rc);
  if (!v) return rc;
  if (!json_is_number(v)) return cli_fail(err, BS_EINVAL, "field '%s' must be a number", k);
  *out = json_number_value(v);
  return BS_OK;
}

/* An array (absent optional: an empty one). */
static int f_arr(json_t *o, const char *k, int required, json_t **out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, required, err, &rc);
  *out = NULL;
  if (!v) return rc;
  if (!json_is_array(v)) return cli_fail(err, BS_EINVAL, "field '%s' must be an array", k);
  *out = v;
  return BS_OK;
}

static int f_obj(json_t *o, const char *k, int required, json_t **out, bs_error *err) {
  int rc;
  json_t *v = field(o, k, required, err, &rc);
  *out = NULL;
  if (!v) return rc;
  if (!json_is_object(v)) return cli_fail(err, BS_EINVAL, "field '%s' must be an object", k);
  *out = v;
  return BS_OK;
}

/* An array of strings as bs_vals in the arena. */
static int f_names(drv *d, json_t *o, const char *k, int required, bs_val **out, size_t *n,
                   bs_error *err) {
  json_t *a, *v;
  size_t i;
  int rc = f_arr(o, k, required, &a, err);
  *out = NULL;
  *n = 0;
  if (rc != BS_OK || !a) return rc;
  if (!(*out = tmp_array(d, json_array_size(a), sizeof **out))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    if (!json_is_string(v))
      return cli_fail(err, BS_EINVAL, "field '%s[%zu]' must be a string", k, i);
    (*out)[i].data = json_string_value(v);
    (*out)[i].size = json_string_length(v);
  }
  *n = json_array_size(a);
  return BS_OK;
}

/* A lookup ([JSON scalars]) encoded with bs_lookup_encode into the arena. */
static int encode_lookup(drv *d, json_t *a, const char *k, bs_val *out, bs_error *err) {
  bs_scalar *vals;
  json_t *v;
  size_t i, size = 0;
  void *buf;
  int rc;
  if (!json_is_array(a)) return cli_fail(err, BS_EINVAL, "field '%s' must be an array", k);
  if (!(vals = tmp_array(d, json_array_size(a), sizeof *vals))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    switch (json_typeof(v)) {
    case JSON_NULL:
      vals[i].type = BS_SCALAR_NULL;
      break;
    case JSON_TRUE:
      vals[i].type = BS_SCALAR_TRUE;
      break;
    case JSON_FALSE:
      vals[i].type = BS_SCALAR_FALSE;
      break;
    case JSON_INTEGER:
      vals[i].type = BS_SCALAR_INT;
      vals[i].i = json_integer_value(v);
      break;
    case JSON_REAL:
      vals[i].type = BS_SCALAR_DOUBLE;
      vals[i].d = json_real_value(v);
      break;
    case JSON_STRING:
      vals[i].type = BS_SCALAR_STRING;
      vals[i].s.data = json_string_value(v);
      vals[i].s.size = json_string_length(v);
      break;
    default:
      return cli_fail(err, BS_EINVAL, "field '%s[%zu]' must be a scalar", k, i);
    }
  }
  /* The encoding reports its size also when it does not fit: then retry with that much, so
   * an over-long key reaches the library call that enforces the limit. */
  if (!(buf = tmp_alloc(d, BS_MAX_LOOKUP_KEY + 32))) return BS_ENOMEM;
  rc = bs_lookup_encode(buf, BS_MAX_LOOKUP_KEY + 32, &size, vals, json_array_size(a), err);
  if (rc == BS_ETOOBIG && size > BS_MAX_LOOKUP_KEY + 32) {
    if (!(buf = tmp_alloc(d, size))) return BS_ENOMEM;
    rc = bs_lookup_encode(buf, size, &size, vals, json_array_size(a), err);
  }
  if (rc != BS_OK) return rc;
  out->data = buf;
  out->size = size;
  return BS_OK;
}

/* ---- Reply values --------------------------------------------------------------------------- */

static json_t *j_id(uint64_t x) {
  char buf[24];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)x);
  return json_string(buf);
}

static json_t *j_lsn(int has, const unsigned char *lsn, size_t n) {
  bs_val v = {lsn, n};
  return has ? cli_json_bytes(v) : json_null();
}

/* Sets a field; the reply builders call this with fresh values (json_object_set_new steals). */
static int put(json_t *o, const char *k, json_t *v) {
  if (!v || json_object_set_new(o, k, v) != 0) return BS_ENOMEM;
  return BS_OK;
}

static json_t *j_scalars(const bs_scalar *vals, size_t n) {
  json_t *a = json_array();
  size_t i;
  for (i = 0; a && i < n; i++) {
    json_t *v;
    switch (vals[i].type) {
    case BS_SCALAR_NULL:
      v = json_null();
      break;
    case BS_SCALAR_FALSE:
      v = json_false();
      break;
    case BS_SCALAR_TRUE:
      v = json_true();
      break;
    case BS_SCALAR_INT:
      v = json_integer(vals[i].i);
      break;
    case BS_SCALAR_DOUBLE:
      v = json_real(vals[i].d);
      break;
    default:
      v = cli_json_bytes(vals[i].s);
      break;
    }
    if (!v || json_array_append_new(a, v) != 0) {
      json_decref(a);
      return NULL;
    }
  }
  return a;
}

/* ---- Streams and writers -------------------------------------------------------------------- */

static int stream_handle(drv *d, uint32_t id, bs_storage **out, bs_error *err) {
  drv_stream *s;
  bs_storage *st;
  int rc;
  for (s = d->streams; s; s = s->next)
    if (s->id == id) return *out = s->st, BS_OK;
  if ((rc = bs_storage_open(&st, d->c.db, id, err)) != BS_OK) return rc;
  if (id == 0) {
    /* resolved to the active-or-newest stream: use (or keep) the handle of that id */
    uint32_t real = bs_storage_stream_id(st);
    for (s = d->streams; s; s = s->next)
      if (s->id == real) {
        bs_storage_close(st);
        return *out = s->st, BS_OK;
      }
    id = real;
  }
  if (!(s = calloc(1, sizeof *s))) {
    bs_storage_close(st);
    return BS_ENOMEM;
  }
  s->id = id;
  s->st = st;
  s->next = d->streams;
  d->streams = s;
  *out = st;
  return BS_OK;
}

/* The command's stream: field "stream" (an id), else the active stream, else the newest. */
static int resolve_stream(drv *d, json_t *req, bs_storage **out, bs_error *err) {
  int64_t id = 0;
  int rc = f_int(req, "stream", 0, 1, UINT32_MAX, &id, err);
  if (rc != BS_OK) return rc;
  return stream_handle(d, (uint32_t)id, out, err);
}

static drv_writer **find_writer(drv *d, uint32_t stream, const char *name) {
  drv_writer **p;
  for (p = &d->writers; *p; p = &(*p)->next)
    if ((*p)->stream == stream && strcmp((*p)->name, name) == 0) break;
  return p;
}

static int open_writer(drv *d, bs_storage *st, const char *name, const bs_writer_options *opts,
                       bs_writer **out, bs_error *err) {
  drv_writer *w = calloc(1, sizeof *w);
  int rc;
  if (!w || !(w->name = strdup(name))) {
    free(w);
    return BS_ENOMEM;
  }
  if ((rc = bs_writer_open(&w->w, st, opts, err)) != BS_OK) {
    free(w->name);
    free(w);
    return rc;
  }
  w->stream = bs_storage_stream_id(st);
  w->next = d->writers;
  d->writers = w;
  *out = w->w;
  return BS_OK;
}

static void close_writer(drv_writer **p) {
  drv_writer *w = *p;
  *p = w->next;
  bs_writer_close(w->w);
  free(w->name);
  free(w);
}

static const char *writer_name(json_t *req, bs_error *err, int *rc) {
  const char *name = "main";
  *rc = f_cstr(req, "writer", 0, &name, err);
  return name;
}

/* The command's writer (field "writer", default "main"), opened with defaults on first use. */
static int resolve_writer(drv *d, json_t *req, bs_writer **out, bs_error *err) {
  bs_writer_options opts = BS_WRITER_OPTIONS_INIT;
  drv_writer **p;
  int rc;
  const char *name = writer_name(req, err, &rc);
  if (rc != BS_OK) return rc;
  p = find_writer(d, bs_storage_stream_id(d->st), name);
  if (*p) return *out = (*p)->w, BS_OK;
  return open_writer(d, d->st, name, &opts, out, err);
}

/* Closes every writer (discarding unflushed saves) and storage. */
static void close_handles(drv *d) {
  while (d->writers) close_writer(&d->writers);
  while (d->streams) {
    drv_stream *s = d->streams;
    d->streams = s->next;
    bs_storage_close(s->st);
    free(s);
  }
}

/* ---- Command handlers -------------------------------------------------------------------------
 * Each gets the request, the reply object to add fields to, and err for the message. */

typedef int (*drv_fn)(drv *d, json_t *req, json_t *out, bs_error *err);

static int h_stream_create(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_stream_options opts = BS_STREAM_OPTIONS_INIT;
  const char *name = NULL, *hash = NULL;
  uint32_t id;
  int rc;
  if ((rc = f_cstr(req, "name", 1, &name, err)) != BS_OK) return rc;
  if ((rc = f_cstr(req, "checksum", 0, &hash, err)) != BS_OK) return rc;
  if (hash && strcmp(hash, "sha256") == 0)
    opts.hash = BS_HASH_SHA256;
  else if (hash && strcmp(hash, "xxh3") != 0)
    return cli_fail(err, BS_EINVAL, "field 'checksum' must be \"xxh3\" or \"sha256\"");
  if ((rc = bs_stream_create(&id, d->c.db, name, &opts, err)) != BS_OK) return rc;
  return put(out, "stream", json_integer(id));
}

static int list_one(const bs_stream_info *info, void *payload) {
  json_t *s = json_pack("{s:I,s:o,s:s}", "stream", (json_int_t)info->id, "name",
                        cli_json_bytes(info->name), "state", cli_state_name(info->state));
  if (!s || json_array_append_new(payload, s) != 0) return BS_ENOMEM;
  return 0;
}

static int h_stream_list(drv *d, json_t *req, json_t *out, bs_error *err) {
  json_t *a = json_array();
  int rc;
  if (put(out, "streams", a) != BS_OK) return BS_ENOMEM;
  if ((rc = bs_stream_list(d->c.db, list_one, a, err)) != BS_OK) return rc;
  return BS_OK;
}

static int h_stream_status(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_status s;
  int rc = bs_get_status(&s, d->st, err);
  if (rc != BS_OK) return rc;
  if (put(out, "stream", json_integer(bs_storage_stream_id(d->st))) ||
      put(out, "state", json_string(cli_state_name(s.state))) ||
      put(out, "resume_lsn", j_lsn(s.has_resume_lsn, s.resume_lsn, s.resume_lsn_size)) ||
      put(out, "snapshot_done", json_boolean(s.snapshot_done)) ||
      put(out, "checkpoint", j_id(s.checkpoint)) ||
      put(out, "lsn", j_lsn(s.has_lsn, s.lsn, s.lsn_size)) ||
      put(out, "last_persisted_op", j_id(s.last_persisted_op)) ||
      put(out, "last_error", s.last_error[0] ? json_string(s.last_error) : json_null()))
    return BS_ENOMEM;
  return BS_OK;
}

static int h_writer_open(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_writer_options opts = BS_WRITER_OPTIONS_INIT;
  bs_writer *w;
  drv_writer **p;
  int rc;
  const char *name = writer_name(req, err, &rc);
  if (rc != BS_OK || (rc = f_bool(req, "snapshot", &opts.snapshot, err)) != BS_OK ||
      (rc = f_bool(req, "create_empty", &opts.create_empty, err)) != BS_OK)
    return rc;
  p = find_writer(d, bs_storage_stream_id(d->st), name);
  if (*p) {
    /* the old writer is closed even when its last flush fails: the caller asked for a new one */
    rc = bs_writer_flush(NULL, (*p)->w, err);
    close_writer(p);
    if (rc != BS_OK) return rc;
  }
  return open_writer(d, d->st, name, &opts, &w, err);
}

static int parse_tag(json_t *req, bs_tag *tag, bs_error *err) {
  const char *s = NULL;
  int rc = f_cstr(req, "tag", 1, &s, err);
  if (rc != BS_OK) return rc;
  if (strcmp(s, "insert") == 0)
    *tag = BS_INSERT;
  else if (strcmp(s, "update") == 0)
    *tag = BS_UPDATE;
  else if (strcmp(s, "delete") == 0)
    *tag = BS_DELETE;
  else
    return cli_fail(err, BS_EINVAL, "field 'tag' must be \"insert\", \"update\" or \"delete\"");
  return BS_OK;
}

static int parse_rows(drv *d, json_t *req, bs_save *s, bs_error *err) {
  static const char *keys[4] = {"bucket", "type", "id", "data"};
  json_t *a, *v;
  bs_row *rows;
  size_t i, k;
  int rc = f_arr(req, "rows", 0, &a, err);
  if (rc != BS_OK || !a) return rc;
  if (!(rows = tmp_array(d, json_array_size(a), sizeof *rows))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    bs_val *f[4] = {&rows[i].bucket, &rows[i].object_type, &rows[i].object_id, &rows[i].data};
    if (!json_is_object(v))
      return cli_fail(err, BS_EINVAL, "field 'rows[%zu]' must be an object", i);
    for (k = 0; k < 4; k++) {
      json_t *x = json_object_get(v, keys[k]);
      if (!json_is_string(x))
        return cli_fail(err, BS_EINVAL, "field 'rows[%zu].%s' must be a string", i, keys[k]);
      f[k]->data = json_string_value(x);
      f[k]->size = json_string_length(x);
    }
  }
  s->rows = rows;
  s->n_rows = json_array_size(a);
  return BS_OK;
}

/* Bucket-parameter rows (JSON objects) become compact JSON text, the stored form. */
static int parse_lookups(drv *d, json_t *req, bs_save *s, bs_error *err) {
  json_t *a, *v, *p, *x;
  bs_lookup *lk;
  size_t i, j;
  char name[48];
  int rc = f_arr(req, "lookups", 0, &a, err);
  if (rc != BS_OK || !a) return rc;
  if (!(lk = tmp_array(d, json_array_size(a), sizeof *lk))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    bs_val *params;
    if (!json_is_object(v))
      return cli_fail(err, BS_EINVAL, "field 'lookups[%zu]' must be an object", i);
    snprintf(name, sizeof name, "lookups[%zu].lookup", i);
    if ((rc = encode_lookup(d, json_object_get(v, "lookup"), name, &lk[i].key, err)) != BS_OK)
      return rc;
    p = json_object_get(v, "params");
    if (p && !json_is_array(p))
      return cli_fail(err, BS_EINVAL, "field 'lookups[%zu].params' must be an array", i);
    if (!(params = tmp_array(d, json_array_size(p), sizeof *params))) return BS_ENOMEM;
    json_array_foreach(p, j, x) {
      char *text;
      if (!json_is_object(x))
        return cli_fail(err, BS_EINVAL, "field 'lookups[%zu].params[%zu]' must be an object", i, j);
      if (!(text = json_dumps(x, JSON_COMPACT)) || tmp_adopt(d, text) != 0) {
        free(text);
        return BS_ENOMEM;
      }
      params[j].data = text;
      params[j].size = strlen(text);
    }
    lk[i].params = params;
    lk[i].n_params = json_array_size(p);
  }
  s->lookups = lk;
  s->n_lookups = json_array_size(a);
  return BS_OK;
}

static int h_save(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_save s = BS_SAVE_INIT;
  bs_val id = {NULL, 0}, old_id = {NULL, 0};
  int rc;
  if ((rc = f_str(req, "table", 1, &s.table, err)) != BS_OK ||
      (rc = parse_tag(req, &s.tag, err)) != BS_OK ||
      (rc = f_str(req, "id", 1, &id, err)) != BS_OK ||
      (rc = f_str(req, "old_id", 0, &old_id, err)) != BS_OK ||
      (rc = f_str(req, "store", 0, &s.stored_data, err)) != BS_OK)
    return rc;
  if (s.tag == BS_DELETE) {
    s.before_id = old_id.data ? old_id : id; /* delete: id names the deleted row */
    s.after_id = id;
  } else {
    s.before_id = old_id;
    s.after_id = id;
    if ((rc = parse_rows(d, req, &s, err)) != BS_OK || (rc = parse_lookups(d, req, &s, err)))
      return rc;
  }
  return bs_writer_save(d->w, &s, err);
}

static int h_truncate(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val table = {NULL, 0};
  int rc = f_str(req, "table", 1, &table, err);
  return rc != BS_OK ? rc : bs_writer_truncate(d->w, table, err);
}

static int h_drop(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val table = {NULL, 0};
  int rc = f_str(req, "table", 1, &table, err);
  return rc != BS_OK ? rc : bs_writer_drop(d->w, table, err);
}

static int h_flush(drv *d, json_t *req, json_t *out, bs_error *err) {
  uint64_t last = 0;
  int rc = bs_writer_flush(&last, d->w, err);
  return rc != BS_OK ? rc : put(out, "last_op", j_id(last));
}

/* bs_block_reason as the driver spells it: null when not blocked. */
static json_t *blocked_reason(const bs_commit_result *r) {
  switch (r->checkpoint_blocked ? r->blocked_reason : BS_BLOCKED_NONE) {
  case BS_BLOCKED_SNAPSHOT:
    return json_string("snapshot_not_done");
  case BS_BLOCKED_NO_CHECKPOINT_BEFORE:
    return json_string("below_no_checkpoint_before");
  case BS_BLOCKED_CHECKPOINT_LSN:
    return json_string("below_checkpoint_lsn");
  case BS_BLOCKED_NONE:
    break;
  }
  return r->checkpoint_blocked ? json_string("unknown") : json_null();
}

static int commit_reply(json_t *out, const bs_commit_result *r) {
  if (put(out, "checkpoint_blocked", json_boolean(r->checkpoint_blocked)) ||
      put(out, "checkpoint_created", json_boolean(r->checkpoint_created)) ||
      put(out, "checkpoint", j_id(r->checkpoint)) || put(out, "blocked_reason", blocked_reason(r)))
    return BS_ENOMEM;
  return BS_OK;
}

/* commit and keepalive: keepalive is commit with create_empty forced on. */
static int do_commit(drv *d, json_t *req, json_t *out, bs_error *err, int keepalive) {
  bs_commit_options opts = BS_COMMIT_OPTIONS_INIT;
  bs_commit_result r = {0, 0, 0, BS_BLOCKED_NONE};
  bs_val lsn = {NULL, 0};
  int rc;
  if ((rc = f_str(req, "lsn", 1, &lsn, err)) != BS_OK ||
      (rc = f_bool(req, "create_empty", &opts.create_empty, err)) != BS_OK)
    return rc;
  if (keepalive) opts.create_empty = 1;
  if ((rc = bs_writer_commit(&r, d->w, lsn, &opts, err)) != BS_OK) return rc;
  return commit_reply(out, &r);
}

static int h_commit(drv *d, json_t *req, json_t *out, bs_error *err) {
  return do_commit(d, req, out, err, 0);
}

static int h_keepalive(drv *d, json_t *req, json_t *out, bs_error *err) {
  return do_commit(d, req, out, err, 1);
}

static int h_snapshot_done(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val lsn = {NULL, 0};
  int rc = f_str(req, "lsn", 1, &lsn, err);
  return rc != BS_OK ? rc : bs_writer_snapshot_done(d->w, lsn, err);
}

static int h_resume_lsn(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val lsn = {NULL, 0};
  int rc = f_str(req, "lsn", 1, &lsn, err);
  return rc != BS_OK ? rc : bs_writer_resume_lsn(d->w, lsn, err);
}

static int source_row_one(const bs_val *data, void *payload) {
  return put(payload, "data", data ? cli_json_bytes(*data) : json_null());
}

static int h_source_row(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val table = {NULL, 0}, id = {NULL, 0};
  int rc;
  if ((rc = f_str(req, "table", 1, &table, err)) != BS_OK ||
      (rc = f_str(req, "id", 1, &id, err)) != BS_OK)
    return rc;
  rc = bs_writer_source_row(d->w, table, id, source_row_one, out, err);
  /* driver.md: a row without a source record answers data null, like one with nothing stored */
  return rc == BS_ENOTFOUND ? put(out, "data", json_null()) : rc;
}

static int h_checkpoint(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_checkpoint cp;
  bs_storage *st;
  int rc = resolve_stream(d, req, &st, err);
  memset(&cp, 0, sizeof cp);
  /* no stream at all (and none named): nothing was ever checkpointed, cp stays zero */
  if ((rc != BS_ENOTFOUND || json_object_get(req, "stream")) &&
      (rc != BS_OK || (rc = bs_get_checkpoint(&cp, st, err)) != BS_OK))
    return rc;
  if (put(out, "checkpoint", j_id(cp.op_id)) ||
      put(out, "lsn", j_lsn(cp.has_lsn, cp.lsn, cp.lsn_size)))
    return BS_ENOMEM;
  return BS_OK;
}

static json_t *j_op(const bs_op *op) {
  return json_pack("{s:o,s:s,s:o,s:o,s:o,s:o,s:I}", "op_id", j_id(op->op_id), "op",
                   cli_op_name(op->type), "object_type", cli_json_bytes(op->object_type),
                   "object_id", cli_json_bytes(op->object_id), "subkey", cli_json_bytes(op->subkey),
                   "data", cli_json_bytes(op->data), "checksum", (json_int_t)op->checksum);
}

static int chunk_one(const bs_chunk *c, void *payload) {
  json_t *ops = json_array(), *chunk;
  size_t i;
  for (i = 0; ops && i < c->n_ops; i++)
    if (json_array_append_new(ops, j_op(&c->ops[i])) != 0) break;
  if (!ops || i < c->n_ops) {
    json_decref(ops);
    return BS_ENOMEM;
  }
  chunk = json_pack("{s:o,s:o,s:o,s:b,s:o,s:o}", "bucket", cli_json_bytes(c->bucket), "after",
                    j_id(c->after), "next_after", j_id(c->next_after), "has_more", c->has_more,
                    "target_op", c->target_op ? j_id(c->target_op) : json_null(), "data", ops);
  if (!chunk || json_array_append_new(payload, chunk) != 0) return BS_ENOMEM;
  return 0;
}

static int h_bucket_data(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_batch_options opts = BS_BATCH_OPTIONS_INIT;
  bs_bucket_request *r;
  uint64_t cp = 0;
  json_t *b, *v, *chunks = json_array();
  const char *name;
  size_t n = 0;
  int has_more = 0, rc;
  char what[64];
  if (put(out, "chunks", chunks) != BS_OK) return BS_ENOMEM;
  if ((rc = f_id(req, "checkpoint", 1, &cp, err)) != BS_OK ||
      (rc = f_obj(req, "buckets", 1, &b, err)) != BS_OK ||
      (rc = f_size(req, "limit", &opts.limit, err)) != BS_OK ||
      (rc = f_size(req, "chunk_bytes", &opts.chunk_bytes, err)) != BS_OK)
    return rc;
  if (!(r = tmp_array(d, json_object_size(b), sizeof *r))) return BS_ENOMEM;
  json_object_foreach(b, name, v) {
    snprintf(what, sizeof what, "buckets.%s", name);
    if ((rc = f_id_value(v, what, &r[n].after, err)) != BS_OK) return rc;
    r[n].bucket.data = name;
    r[n].bucket.size = strlen(name);
    n++;
  }
  if ((rc = bs_get_bucket_data(&has_more, d->st, cp, r, n, &opts, chunk_one, chunks, err)))
    return rc;
  return put(out, "has_more", json_boolean(has_more));
}

static int h_checksums(drv *d, json_t *req, json_t *out, bs_error *err) {
  uint64_t cp = 0;
  bs_val *names;
  bs_checksum *sums;
  json_t *o = json_object();
  size_t i, n;
  int rc;
  if (put(out, "checksums", o) != BS_OK) return BS_ENOMEM;
  if ((rc = f_id(req, "checkpoint", 1, &cp, err)) != BS_OK ||
      (rc = f_names(d, req, "buckets", 1, &names, &n, err)) != BS_OK)
    return rc;
  if (!(sums = tmp_array(d, n, sizeof *sums))) return BS_ENOMEM;
  if ((rc = bs_get_checksums(sums, d->st, cp, names, n, err)) != BS_OK) return rc;
  for (i = 0; i < n; i++) {
    /* bucket checksums are signed 32-bit in JSON (contract.md section 3) */
    json_t *e = json_pack("{s:I,s:I}", "checksum", (json_int_t)(int32_t)sums[i].checksum, "count",
                          (json_int_t)sums[i].count);
    if (!e || json_object_setn_new(o, names[i].data, names[i].size, e) != 0) return BS_ENOMEM;
  }
  return BS_OK;
}

static int set_one(const bs_val *params, void *payload) {
  json_t *v = json_loadb(params->data, params->size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  if (!v) v = cli_json_bytes(*params); /* not JSON (not written by this driver): pass the text on */
  if (!v || json_array_append_new(payload, v) != 0) return BS_ENOMEM;
  return 0;
}

static int h_parameter_sets(drv *d, json_t *req, json_t *out, bs_error *err) {
  uint64_t cp = 0;
  size_t i, limit = BS_PARAM_LIMIT_DEFAULT; /* only an absent field takes the default */
  json_t *a, *v, *sets = json_array();
  bs_val *keys;
  char what[32];
  int rc;
  if (put(out, "sets", sets) != BS_OK) return BS_ENOMEM;
  if ((rc = f_id(req, "checkpoint", 1, &cp, err)) != BS_OK ||
      (rc = f_arr(req, "lookups", 1, &a, err)) != BS_OK ||
      (rc = f_size(req, "limit", &limit, err)) != BS_OK)
    return rc;
  if (!(keys = tmp_array(d, json_array_size(a), sizeof *keys))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    snprintf(what, sizeof what, "lookups[%zu]", i);
    if ((rc = encode_lookup(d, v, what, &keys[i], err)) != BS_OK) return rc;
  }
  return bs_get_parameter_sets(d->st, cp, keys, json_array_size(a), limit, set_one, sets, err);
}

static json_t *j_names(const bs_val *v, size_t n) {
  json_t *a = json_array();
  size_t i;
  for (i = 0; a && i < n; i++)
    if (json_array_append_new(a, cli_json_bytes(v[i])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

static int changes_one(const bs_checkpoint_changes *c, void *payload) {
  json_t *lookups = json_array();
  bs_scalar *vals;
  size_t i;
  int rc;
  if (put(payload, "updated_buckets", j_names(c->updated_buckets, c->n_updated_buckets)) ||
      put(payload, "invalidate_data_buckets", json_boolean(c->invalidate_data_buckets)) ||
      put(payload, "updated_lookups", lookups))
    return BS_ENOMEM;
  for (i = 0; i < c->n_updated_lookups; i++) {
    size_t n = 0, cap = c->updated_lookups[i].size + 1; /* every value takes a byte or more */
    if (!(vals = malloc(cap * sizeof *vals))) return BS_ENOMEM;
    rc = bs_lookup_decode(vals, cap, &n, c->updated_lookups[i], NULL);
    if (rc == BS_OK && json_array_append_new(lookups, j_scalars(vals, n)) != 0) rc = BS_ENOMEM;
    free(vals);
    if (rc != BS_OK) return rc;
  }
  if (put(payload, "invalidate_parameter_buckets", json_boolean(c->invalidate_parameter_buckets)) ||
      put(payload, "updated_write_checkpoint_users",
          j_names(c->updated_write_checkpoint_users, c->n_updated_write_checkpoint_users)))
    return BS_ENOMEM;
  return 0;
}

static int h_checkpoint_changes(drv *d, json_t *req, json_t *out, bs_error *err) {
  uint64_t from = 0, to = 0;
  int rc;
  if ((rc = f_id(req, "from", 1, &from, err)) != BS_OK ||
      (rc = f_id(req, "to", 1, &to, err)) != BS_OK)
    return rc;
  return bs_get_checkpoint_changes(d->st, from, to, changes_one, out, err);
}

static int h_compact(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats s;
  int64_t mbc = 0, before = 0, age = -1;
  bs_val *names = NULL;
  size_t n = 0;
  int rc;
  memset(&s, 0, sizeof s);
  if ((rc = f_id(req, "max_op_id", 0, &o.max_op_id, err)) != BS_OK ||
      (rc = f_names(d, req, "buckets", 0, &names, &n, err)) != BS_OK ||
      (rc = f_int(req, "min_bucket_changes", 0, 0, INT64_MAX, &mbc, err)) != BS_OK ||
      (rc = f_num(req, "min_change_ratio", &o.min_change_ratio, err)) != BS_OK ||
      (rc = f_size(req, "memory_limit_mb", &o.memory_limit_mb, err)) != BS_OK ||
      (rc = f_bool(req, "incremental_only", &o.incremental_only, err)) != BS_OK ||
      (rc = f_bool(req, "compact_parameters", &o.compact_parameters, err)) != BS_OK ||
      (rc = f_int(req, "delete_checkpoint_requests_before", 0, 0, INT64_MAX, &before, err)) ||
      (rc = f_int(req, "min_age_ms", 0, -1, INT64_MAX, &age, err)) != BS_OK ||
      (rc = f_size(req, "max_ops_per_txn", &o.max_ops_per_txn, err)) != BS_OK ||
      (rc = f_num(req, "defragment_ratio", &o.defragment_ratio, err)) != BS_OK)
    return rc;
  o.buckets = names;
  o.n_buckets = n;
  o.min_bucket_changes = (uint64_t)mbc;
  o.delete_checkpoint_requests_before_ms = before;
  o.min_age_ms = age;
  if ((rc = bs_compact(&s, d->st, &o, err)) != BS_OK) return rc;
  /* bytes_before/after are left out: they differ between backends and builds */
  if (put(out, "buckets_compacted", json_integer((json_int_t)s.buckets_compacted)) ||
      put(out, "ops_moved", json_integer((json_int_t)s.ops_moved)) ||
      put(out, "ops_cleared", json_integer((json_int_t)s.ops_cleared)) ||
      put(out, "ops_removed", json_integer((json_int_t)s.ops_removed)) ||
      put(out, "parameter_entries_removed",
          json_integer((json_int_t)s.parameter_entries_removed)) ||
      put(out, "checkpoint_requests_deleted",
          json_integer((json_int_t)s.checkpoint_requests_deleted)) ||
      put(out, "ops_reemitted", json_integer((json_int_t)s.ops_reemitted)))
    return BS_ENOMEM;
  return BS_OK;
}

static int h_compact_initial(drv *d, json_t *req, json_t *out, bs_error *err) {
  uint64_t max = 0, buckets = 0;
  int64_t mbc = 1;
  int rc;
  if ((rc = f_id(req, "max_op_id", 0, &max, err)) != BS_OK ||
      (rc = f_int(req, "min_bucket_changes", 0, 0, INT64_MAX, &mbc, err)) != BS_OK)
    return rc;
  if ((rc = bs_compact_initial_replication(&buckets, d->st, max, (uint64_t)mbc, err)) != BS_OK)
    return rc;
  return put(out, "buckets", json_integer((json_int_t)buckets));
}

/* The entry of the command's resolved storage (d->st). */
static drv_stream *current_stream(drv *d) {
  drv_stream *s = d->streams;
  while (s && s->st != d->st) s = s->next;
  return s;
}

static int h_wcp_mode(drv *d, json_t *req, json_t *out, bs_error *err) {
  const char *mode = NULL;
  bs_val event = {NULL, 0};
  bs_write_checkpoint_mode m;
  int rc;
  if ((rc = f_cstr(req, "mode", 1, &mode, err)) != BS_OK ||
      (rc = f_str(req, "event", 0, &event, err)) != BS_OK)
    return rc;
  if (strcmp(mode, "managed") == 0)
    m = BS_WCP_MANAGED;
  else if (strcmp(mode, "custom") == 0)
    m = BS_WCP_CUSTOM;
  else
    return cli_fail(err, BS_EINVAL, "field 'mode' must be \"managed\" or \"custom\"");
  if ((rc = bs_set_write_checkpoint_mode(d->st, m, event, err)) != BS_OK) return rc;
  current_stream(d)->wcp_mode = m;
  return BS_OK;
}

/* heads {connection: lsn} as bs_heads in the arena. */
static int parse_heads(drv *d, json_t *o, const char *k, bs_head **out, size_t *n, bs_error *err) {
  const char *conn;
  json_t *v;
  size_t i = 0;
  if (!(*out = tmp_array(d, json_object_size(o), sizeof **out))) return BS_ENOMEM;
  json_object_foreach(o, conn, v) {
    if (!json_is_string(v))
      return cli_fail(err, BS_EINVAL, "field '%s.%s' must be a string", k, conn);
    (*out)[i].connection.data = conn;
    (*out)[i].connection.size = strlen(conn);
    (*out)[i].lsn.data = json_string_value(v);
    (*out)[i].lsn.size = json_string_length(v);
    i++;
  }
  *n = i;
  return BS_OK;
}

static int h_wcp_create_managed(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_managed_request *r;
  uint64_t *ids;
  json_t *a, *v, *h, *map = json_object();
  size_t i, n;
  int should_advance = 0, rc;
  char what[48]; /* "items[<size_t>].requested_at" */
  if (put(out, "write_checkpoints", map) != BS_OK) return BS_ENOMEM;
  if ((rc = f_arr(req, "items", 1, &a, err)) != BS_OK) return rc;
  n = json_array_size(a);
  if (!(r = tmp_array(d, n, sizeof *r)) || !(ids = tmp_array(d, n, sizeof *ids))) return BS_ENOMEM;
  json_array_foreach(a, i, v) {
    int64_t at = 0;
    if (!json_is_object(v))
      return cli_fail(err, BS_EINVAL, "field 'items[%zu]' must be an object", i);
    snprintf(what, sizeof what, "items[%zu].user_id", i);
    if (f_str(v, "user_id", 1, &r[i].user_id, err) != BS_OK || !r[i].user_id.data)
      return cli_fail(err, BS_EINVAL, "field '%s' must be a string", what);
    snprintf(what, sizeof what, "items[%zu].heads", i);
    if (!json_is_object(h = json_object_get(v, "heads")))
      return cli_fail(err, BS_EINVAL, "field '%s' must be an object", what);
    if ((rc = parse_heads(d, h, what, (bs_head **)&r[i].heads, &r[i].n_heads, err)) != BS_OK)
      return rc;
    if (json_object_get(v, "request_id")) {
      snprintf(what, sizeof what, "items[%zu].request_id", i);
      if ((rc = f_id_value(json_object_get(v, "request_id"), what, &r[i].request_id, err)))
        return rc;
      r[i].has_request_id = 1;
    }
    /* >= 1: the library reads 0 as "now", so an explicit 0 cannot be honoured as given */
    snprintf(what, sizeof what, "items[%zu].requested_at", i);
    if ((rc = f_int(v, "requested_at", 0, 1, INT64_MAX, &at, err)) != BS_OK)
      return cli_fail(err, rc, "field '%s' must be an integer in [1, %lld]", what,
                      (long long)INT64_MAX);
    r[i].requested_at_ms = at; /* absent: 0, now */
  }
  if ((rc = bs_create_managed_write_checkpoints(ids, &should_advance, d->st, r, n, err))) return rc;
  for (i = 0; i < n; i++) {
    /* user ids come from JSON strings; a NUL inside would cut the key, so use setn */
    if (json_object_setn_new(map, r[i].user_id.data, r[i].user_id.size, j_id(ids[i])) != 0)
      return BS_ENOMEM;
  }
  return put(out, "should_advance", json_boolean(should_advance));
}

static int h_wcp_custom(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val user = {NULL, 0}, event = {NULL, 0};
  uint64_t cp = 0;
  int64_t at = 0;
  int rc;
  if ((rc = f_str(req, "user_id", 1, &user, err)) != BS_OK ||
      (rc = f_id(req, "checkpoint", 1, &cp, err)) != BS_OK ||
      (rc = f_str(req, "event", 0, &event, err)) != BS_OK ||
      (rc = f_int(req, "requested_at", 0, 0, INT64_MAX, &at, err)) != BS_OK)
    return rc;
  if (json_object_get(req, "requested_at") && !json_is_null(json_object_get(req, "requested_at")))
    return bs_writer_custom_write_checkpoint_requested(d->w, user, cp, event, at, err);
  return bs_writer_custom_write_checkpoint(d->w, user, cp, event, err); /* persistent */
}

static int h_wcp_last(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_val user = {NULL, 0}, lsn = {NULL, 0};
  bs_head one, *heads = &one;
  json_t *h;
  size_t n = 1;
  uint64_t id = 0;
  int found = 0, rc;
  if ((rc = f_str(req, "user_id", 1, &user, err)) != BS_OK ||
      (rc = f_obj(req, "heads", 0, &h, err)) != BS_OK ||
      (rc = f_str(req, "lsn", 0, &lsn, err)) != BS_OK)
    return rc;
  if (h) {
    if ((rc = parse_heads(d, h, "heads", &heads, &n, err)) != BS_OK) return rc;
  } else if (current_stream(d)->wcp_mode == BS_WCP_CUSTOM) {
    n = 0; /* a custom checkpoint has no heads: user_id alone names it */
  } else if (lsn.data) {
    one.connection.data = "1"; /* the shorthand of driver.md: heads {"1": lsn} */
    one.connection.size = 1;
    one.lsn = lsn;
  } else {
    return cli_fail(err, BS_EINVAL, "missing field 'heads' or 'lsn'");
  }
  if ((rc = bs_last_write_checkpoint(&id, &found, d->st, user, heads, n, err)) != BS_OK) return rc;
  return put(out, "write_checkpoint", found ? j_id(id) : json_null());
}

static int h_wcp_delete_before(drv *d, json_t *req, json_t *out, bs_error *err) {
  int64_t before = 0;
  uint64_t deleted = 0;
  int rc = f_int(req, "before", 1, 0, INT64_MAX, &before, err);
  if (rc != BS_OK || (rc = bs_delete_checkpoint_requests_before(&deleted, d->st, before, err)))
    return rc;
  return put(out, "deleted", json_integer((json_int_t)deleted));
}

static int h_clear(drv *d, json_t *req, json_t *out, bs_error *err) {
  return bs_clear(d->st, err);
}

static int h_terminate(drv *d, json_t *req, json_t *out, bs_error *err) {
  int clear = 0, rc = f_bool(req, "clear", &clear, err);
  return rc != BS_OK ? rc : bs_terminate(d->st, clear, err);
}

static int h_report_error(drv *d, json_t *req, json_t *out, bs_error *err) {
  const char *msg = NULL;
  int rc = f_cstr(req, "message", 1, &msg, err);
  return rc != BS_OK ? rc : bs_report_error(d->st, msg, err);
}

/* Like a crash: writers are closed without flushing. The memory backend keeps its store (it
 * has no file to reopen), so there only the handles are dropped. */
static int h_reopen(drv *d, json_t *req, json_t *out, bs_error *err) {
  close_handles(d);
  if (d->c.memory) return BS_OK;
  cli_db_close_handle(&d->c);
  return cli_db_open(&d->c, err);
}

static void verify_one(const char *problem, void *payload) {
  json_array_append_new(payload, json_string(problem));
}

static int h_verify(drv *d, json_t *req, json_t *out, bs_error *err) {
  json_t *problems = json_array();
  uint64_t n = 0;
  if (put(out, "problems", problems) != BS_OK) return BS_ENOMEM;
  return bs_db_verify(&n, d->c.db, verify_one, problems, err);
}

static int h_stat(drv *d, json_t *req, json_t *out, bs_error *err) {
  bs_stat s;
  int rc = bs_db_stat(&s, d->c.db, err);
  json_t *v;
  if (rc != BS_OK) return rc;
  v = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "streams", (json_int_t)s.streams,
                "buckets", (json_int_t)s.buckets, "ops_put", (json_int_t)s.ops_put, "ops_remove",
                (json_int_t)s.ops_remove, "ops_move", (json_int_t)s.ops_move, "ops_clear",
                (json_int_t)s.ops_clear, "parameter_entries", (json_int_t)s.parameter_entries,
                "source_records", (json_int_t)s.source_records, "write_checkpoints",
                (json_int_t)s.write_checkpoints, "file_bytes", (json_int_t)s.file_bytes,
                "reclaimable_bytes", (json_int_t)s.reclaimable_bytes);
  if (!v || json_object_update(out, v) != 0) rc = BS_ENOMEM;
  json_decref(v);
  return rc;
}

/* ---- The command table ---------------------------------------------------------------------- */

enum { NEED_STREAM = 1, NEED_WRITER = 2 | NEED_STREAM };

static const struct drv_cmd {
  const char *name;
  drv_fn fn;
  unsigned needs;
} cmds[] = {
    {"stream.create", h_stream_create, 0},
    {"stream.list", h_stream_list, 0},
    {"stream.status", h_stream_status, NEED_STREAM},
    {"writer.open", h_writer_open, NEED_STREAM},
    {"save", h_save, NEED_WRITER},
    {"truncate", h_truncate, NEED_WRITER},
    {"drop", h_drop, NEED_WRITER},
    {"flush", h_flush, NEED_WRITER},
    {"commit", h_commit, NEED_WRITER},
    {"keepalive", h_keepalive, NEED_WRITER},
    {"snapshot_done", h_snapshot_done, NEED_WRITER},
    {"resume_lsn", h_resume_lsn, NEED_WRITER},
    {"source_row", h_source_row, NEED_WRITER},
    {"checkpoint", h_checkpoint, 0},
    {"bucket_data", h_bucket_data, NEED_STREAM},
    {"checksums", h_checksums, NEED_STREAM},
    {"parameter_sets", h_parameter_sets, NEED_STREAM},
    {"checkpoint_changes", h_checkpoint_changes, NEED_STREAM},
    {"compact", h_compact, NEED_STREAM},
    {"compact_initial_replication", h_compact_initial, NEED_STREAM},
    {"write_checkpoint.mode", h_wcp_mode, NEED_STREAM},
    {"write_checkpoint.create_managed", h_wcp_create_managed, NEED_STREAM},
    {"write_checkpoint.custom", h_wcp_custom, NEED_WRITER},
    {"write_checkpoint.last", h_wcp_last, NEED_STREAM},
    {"write_checkpoint.delete_before", h_wcp_delete_before, NEED_STREAM},
    {"clear", h_clear, NEED_STREAM},
    {"terminate", h_terminate, NEED_STREAM},
    {"report_error", h_report_error, NEED_STREAM},
    {"reopen", h_reopen, 0},
    {"verify", h_verify, 0},
    {"stat", h_stat, 0},
};

static int run_command(drv *d, json_t *req, json_t *out, bs_error *err) {
  const char *name = NULL;
  size_t i;
  int rc;
  if ((rc = f_cstr(req, "cmd", 1, &name, err)) != BS_OK) return rc;
  for (i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (strcmp(cmds[i].name, name) == 0) break;
  if (i == sizeof cmds / sizeof cmds[0])
    return cli_fail(err, BS_EINVAL, "unknown command '%s'", name);
  d->st = NULL;
  d->w = NULL;
  if ((cmds[i].needs & NEED_STREAM) && (rc = resolve_stream(d, req, &d->st, err)) != BS_OK)
    return rc;
  if ((cmds[i].needs & NEED_WRITER) == NEED_WRITER &&
      (rc = resolve_writer(d, req, &d->w, err)) != BS_OK)
    return rc;
  return cmds[i].fn(d, req, out, err);
}

/* ---- The loop ------------------------------------------------------------------------------- */

/* The path ("lookups[0].lookup[2]", keys as written) of the value or key that ends at byte end
 * of line s, a JSON prefix jansson read; "" at the top. Names the field of a line refused for one
 * value rather than for its syntax. */
static void json_path_at(const char *s, size_t end, char *out, size_t cap) {
  enum { DEPTH = 16, KEY = 40 };
  struct {
    char kind;       /* '{' or '[' */
    size_t index;    /* of the array's current element */
    const char *key; /* the object's current key, as written, or NULL before one */
    size_t key_len;
  } f[DEPTH];
  size_t depth = 0, i, n = 0, k;
  const char *str = NULL; /* the open string's first byte */
  memset(f, 0, sizeof f);
  for (i = 0; i < end; i++) {
    char ch = s[i];
    if (str) {
      if (ch == '\\') {
        i++;
      } else if (ch == '"') {
        if (depth && depth <= DEPTH && f[depth - 1].kind == '{' && !f[depth - 1].key) {
          f[depth - 1].key = str;
          f[depth - 1].key_len = (size_t)(s + i - str);
        }
        str = NULL;
      }
    } else if (ch == '"') {
      str = s + i + 1;
    } else if (ch == '{' || ch == '[') {
      if (++depth <= DEPTH) {
        f[depth - 1].kind = ch;
        f[depth - 1].index = 0;
        f[depth - 1].key = NULL;
      }
    } else if ((ch == '}' || ch == ']') && depth) {
      depth--;
    } else if (ch == ',' && depth && depth <= DEPTH) {
      f[depth - 1].index++;
      f[depth - 1].key = NULL;
    }
  }
  out[0] = '\0';
  for (k = 0; k < depth && k < DEPTH && n < cap; k++) {
    int w;
    if (f[k].kind == '[')
      w = snprintf(out + n, cap - n, "[%zu]", f[k].index);
    else if (f[k].key)
      w = snprintf(out + n, cap - n, "%s%.*s%s", n ? "." : "",
                   (int)(f[k].key_len < KEY ? f[k].key_len : KEY), f[k].key,
                   f[k].key_len > KEY ? "..." : "");
    else
      w = 0;
    if (w < 0) break;
    n += (size_t)w;
  }
}

/* Fails a line jansson refused: BS_EINVAL, for a value it cannot hold (an integer beyond int64,
 * a number beyond a double, an object key with a NUL) naming the field, else "invalid JSON". */
static int json_refused(const char *line, size_t len, const json_error_t *je, bs_error *err) {
  char path[160], what[176];
  size_t end = (size_t)je->position < len ? (size_t)je->position : len, start = end;
  enum json_error_code code = json_error_code(je);
  if (code != json_error_numeric_overflow && code != json_error_null_byte_in_key)
    return cli_fail(err, BS_EINVAL, "invalid JSON: %s", je->text);
  json_path_at(line, end, path, sizeof path);
  snprintf(what, sizeof what, *path ? "field '%s'" : "the line%s", path);
  if (code == json_error_null_byte_in_key)
    return cli_fail(err, BS_EINVAL, "%s: an object key cannot hold a NUL (\\u0000)", what);
  while (start > 0 && strchr("0123456789+-.eE", line[start - 1])) start--;
  return cli_fail(err, BS_EINVAL,
                  "%s: %.*s is out of range (an integer must fit in 64 bits signed, a number in a "
                  "double)",
                  what, (int)(end - start < 64 ? end - start : 64), line + start);
}

/* Builds and prints the reply to one line: {"ok":true,...fields,"echo":...} or
 * {"ok":false,"error":{"code","message"},"echo":...}. */
static void reply(drv *d, const char *line, size_t len) {
  bs_error err = {0, ""};
  json_error_t jerr;
  json_t *req =
      json_loadb(line, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  json_t *fields = json_object(), *out = json_object(), *echo = NULL;
  char *text;
  int rc;
  if (!req)
    rc = json_refused(line, len, &jerr, &err);
  else if (!json_is_object(req))
    rc = cli_fail(&err, BS_EINVAL, "command must be a JSON object");
  else
    rc = fields && out ? run_command(d, req, fields, &err) : BS_ENOMEM;
  if (req && json_is_object(req)) echo = json_object_get(req, "echo");
  if (rc == BS_OK) {
    json_object_set_new(out, "ok", json_true());
    json_object_update(out, fields);
  } else {
    json_object_set_new(out, "ok", json_false());
    json_object_set_new(
        out, "error",
        json_pack("{s:s,s:s}", "code", cli_code_name(rc), "message", cli_error_text(rc, &err)));
  }
  if (echo) json_object_set(out, "echo", echo);
  text = json_dumps(out, JSON_COMPACT);
  if (text) {
    fputs(text, stdout);
  } else {
    /* out of memory, or a message that is not UTF-8: still one line per command */
    fputs("{\"ok\":false,\"error\":{\"code\":\"BS_ENOMEM\",\"message\":\"reply\"}}", stdout);
  }
  fputc('\n', stdout);
  fflush(stdout);
  free(text);
  json_decref(out);
  json_decref(fields);
  json_decref(req);
  tmp_reset(d);
}

static int blank(const char *s, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
  return 1;
}

int cli_drive(int argc, char **argv) {
  drv d;
  bs_error err = {0, ""};
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int i, rc;
  memset(&d, 0, sizeof d);
  for (i = 2; i < argc; i++) {
    int r = cli_db_option(&d.c, argc, argv, &i);
    if (r == 0) fprintf(stderr, "bucketstore drive: unknown option %s\n", argv[i]);
    if (r <= 0) {
      cli_db_close(&d.c);
      return 2;
    }
  }
  if ((rc = cli_db_open(&d.c, &err)) != BS_OK) {
    fprintf(stderr, "bucketstore drive: cannot open the database: %s: %s\n", cli_code_name(rc),
            cli_error_text(rc, &err));
    cli_db_close(&d.c);
    return 1;
  }
  while ((len = getline(&line, &cap, stdin)) >= 0)
    if (!blank(line, (size_t)len)) reply(&d, line, (size_t)len);
  free(line);
  close_handles(&d);
  cli_db_close(&d.c);
  free(d.arena);
  return 0;
}

/* (r) The driver loop over the lines of a buffer, against a fresh in-memory database, replying
 * on stdout as `drive --memory` does: the hook of the fuzz target fuzz/fuzz_driver.c. Returns 0,
 * or 1 when the database cannot be opened. */
int cli_drive_buffer(const char *buf, size_t len) {
  drv d;
  bs_error err = {0, ""};
  size_t i = 0;
  memset(&d, 0, sizeof d);
  d.c.memory = 1;
  if (cli_db_open(&d.c, &err) != BS_OK) return 1;
  while (i < len) {
    const char *nl = memchr(buf + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (buf + i)) + 1 : len - i;
    if (!blank(buf + i, n)) reply(&d, buf + i, n);
    i += n;
  }
  close_handles(&d);
  cli_db_close(&d.c);
  free(d.arena);
  return 0;
}
