/*
 * bucketstore_node.c: the Node-API addon under bindings/node/index.js. It turns JS values into
 * the library's structs on the main thread (one copy into an arena owned by the call), runs
 * every call that can block (open, flush, commit, reads, compaction) on the libuv thread pool
 * (napi_async_work, one Promise per call) and builds JS values from the results on the main
 * thread. index.js wraps these functions in the classes of index.d.ts.
 *
 * Handles (db, storage, writer) are externals tagged with their kind and reference counted: a
 * handle's C object is released when it is closed (or garbage collected) and no child handle
 * and no call in flight still needs it, so any close/finalize order is safe.
 *
 * A writer's calls run in call order on one thread at a time: a save on an idle writer whose
 * queue is below its flush bound is queued synchronously (no I/O); every other writer call, and
 * saves behind one, become jobs that one async work at a time runs in order. The flush bound
 * (records, bytes) is the binding's: the C writer is opened without one, so a save never does
 * I/O on the main thread.
 */
#include <node_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

#define FLUSH_RECS   2000u /* the contract (section 4): auto-flush at 2000 records or 5 MB */
#define FLUSH_BYTES  (5u * 1000u * 1000u)
#define MAX_SAFE_INT 9007199254740991.0 /* 2^53 - 1 */

/* ---- Arena: the memory of one call (inputs converted from JS, outputs copied from the library) */

typedef struct blk {
  struct blk *next;
  size_t used, cap;
  max_align_t data[];
} blk;

typedef struct arena {
  blk *head;
} arena;

static char empty_bytes[1]; /* data of a present empty value: non-NULL, size 0 */

static void *ar_alloc(arena *a, size_t n) {
  blk *b = a->head;
  n = (n + 15) & ~(size_t)15;
  if (!n) return empty_bytes;
  if (!b || b->cap - b->used < n) {
    /* blocks double from 512 bytes (a queued save's arena is small) up to 64 KiB */
    size_t cap = b ? (b->cap < 65536 ? 2 * b->cap : 65536) : 512;
    if (cap < n) cap = n;
    blk *nb = malloc(sizeof *nb + cap);
    if (!nb) return NULL;
    nb->next = b, nb->used = 0, nb->cap = cap;
    a->head = b = nb;
  }
  b->used += n;
  return (char *)b->data + b->used - n;
}

static int ar_dup(arena *a, bs_val *out, const void *data, size_t size) {
  void *p;
  if (!data) {
    out->data = NULL, out->size = 0;
    return 0;
  }
  if (!(p = ar_alloc(a, size))) return -1;
  if (size) memcpy(p, data, size);
  out->data = p, out->size = size;
  return 0;
}

static void ar_free(arena *a) {
  while (a->head) {
    blk *b = a->head;
    a->head = b->next;
    free(b);
  }
}

/* Keeps the newest block for reuse (the writer's scratch arena). */
static void ar_reset(arena *a) {
  if (!a->head) return;
  ar_free(&(arena){a->head->next});
  a->head->next = NULL, a->head->used = 0;
}

/* ---- Errors ---------------------------------------------------------------------------------- */

/* "BS_EINVAL" from bs_strerror's "BS_EINVAL: ..." (one table of names: the library's). */
static void code_name(int rc, char out[32]) {
  const char *s = bs_strerror(rc), *colon = strchr(s, ':');
  size_t n = colon ? (size_t)(colon - s) : strlen(s);
  if (n > 31) n = 31;
  memcpy(out, s, n);
  out[n] = 0;
}

/* The error of code rc; BS_EINVAL is a TypeError when type_error, else a RangeError. */
static napi_value js_error(napi_env env, int rc, const bs_error *err, int type_error) {
  napi_value code, msg, e;
  char name[32];
  const char *text = err && err->msg[0] ? err->msg : bs_strerror(rc);
  code_name(rc, name);
  napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &code);
  napi_create_string_utf8(env, text, NAPI_AUTO_LENGTH, &msg);
  if (rc == BS_EINVAL && type_error)
    napi_create_type_error(env, code, msg, &e);
  else if (rc == BS_EINVAL)
    napi_create_range_error(env, code, msg, &e);
  else
    napi_create_error(env, code, msg, &e);
  return e;
}

/* The error of a library call: its BS_EINVAL is a value it refused (the binding has checked the
 * types), a RangeError, as Python's InvalidArgumentError is a ValueError. */
static napi_value make_error(napi_env env, int rc, const bs_error *err) {
  return js_error(env, rc, err, 0);
}

/* Throws unless a JS exception is already pending (e.g. from a getter that threw); the binding's
 * own BS_EINVAL (an argument of the wrong type) is a TypeError, throw_range's a RangeError. */
static int throw_rc(napi_env env, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int throw_rc(napi_env env, int rc, const char *fmt, ...) {
  bool pending = false;
  bs_error err = {rc, {0}};
  va_list ap;
  napi_is_exception_pending(env, &pending);
  if (pending) return -1;
  va_start(ap, fmt);
  vsnprintf(err.msg, sizeof err.msg, fmt, ap);
  va_end(ap);
  napi_throw(env, js_error(env, rc, &err, 1));
  return -1;
}

static int throw_range(napi_env env, const char *name, const char *what) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s: %s", name, what);
  napi_throw_range_error(env, "BS_EINVAL", msg);
  return -1;
}

#define NAPI(call)                                                                                 \
  do {                                                                                             \
    if ((call) != napi_ok) return throw_rc(env, BS_EIO, "Node-API call failed: %s", #call);        \
  } while (0)
#define NOMEM() throw_rc(env, BS_ENOMEM, "out of memory")

/* ---- JS -> C conversion (main thread). Each returns 0, or -1 with a JS exception pending. ---- */

static int type_of(napi_env env, napi_value v, napi_valuetype *t) {
  NAPI(napi_typeof(env, v, t));
  return 0;
}

static int is_nullish(napi_env env, napi_value v) {
  napi_valuetype t;
  return v == NULL ||
         (napi_typeof(env, v, &t) == napi_ok && (t == napi_undefined || t == napi_null));
}

/* Property names as JS strings made once per env, keyed by the address of the C literal:
 * napi_get_named_property would make (and intern) the string again on every call. The strings
 * live in an array (Node-API 8 references only objects); each is internalized (a property name
 * of an object comes back so), so lookups with it skip hashing it. */
#define KEY_SLOTS 128
typedef struct progress_ctx progress_ctx;
/* Per environment (its instance data): the property-name cache, and the progress contexts of
 * the long calls under way, which a library thread may be waiting in (abandoned at exit). */
typedef struct envdata {
  const char *name[KEY_SLOTS];
  napi_ref holder; /* array: slot -> key string */
  int exiting;
  progress_ctx *live;
} envdata;

static void envdata_free(napi_env env, void *data, void *hint);

static int key_make(napi_env env, const char *name, napi_value *out) {
  napi_value o, t, keys;
  NAPI(napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, out));
  NAPI(napi_create_object(env, &o));
  NAPI(napi_get_boolean(env, true, &t));
  NAPI(napi_set_property(env, o, *out, t));
  NAPI(napi_get_property_names(env, o, &keys));
  NAPI(napi_get_element(env, keys, 0, out));
  return 0;
}

static int key_of(napi_env env, const char *name, napi_value *out) {
  envdata *kc = NULL;
  napi_value holder;
  uint32_t h = (uint32_t)(((uintptr_t)name >> 3) % KEY_SLOTS);
  napi_get_instance_data(env, (void **)&kc);
  if (!kc || !kc->holder || napi_get_reference_value(env, kc->holder, &holder) != napi_ok)
    return key_make(env, name, out);
  for (int probe = 0; probe < KEY_SLOTS; probe++, h = (h + 1) % KEY_SLOTS) {
    if (kc->name[h] == name) {
      NAPI(napi_get_element(env, holder, h, out));
      return 0;
    }
    if (!kc->name[h]) {
      if (key_make(env, name, out)) return -1;
      if (napi_set_element(env, holder, h, *out) == napi_ok) kc->name[h] = name;
      return 0;
    }
  }
  return key_make(env, name, out);
}

/* obj[key], NULL when obj is not an object or the value is undefined or null. */
static int get_prop(napi_env env, napi_value obj, const char *key, napi_value *out) {
  napi_valuetype t;
  napi_value k;
  *out = NULL;
  if (obj == NULL) return 0;
  if (type_of(env, obj, &t)) return -1;
  if (t != napi_object && t != napi_function) return 0;
  if (key_of(env, key, &k)) return -1;
  NAPI(napi_get_property(env, obj, k, out));
  if (is_nullish(env, *out)) *out = NULL;
  return 0;
}

/* Whether s is well-formed UTF-8 (no overlong form, surrogate or code point above U+10FFFF);
 * if so, *units is its length in UTF-16 code units (n when it is ASCII). */
static int utf8_units(const unsigned char *s, size_t n, size_t *units) {
  size_t i = 0, u = 0;
  while (i < n) {
    uint64_t x;
    unsigned lo = 0x80, hi = 0xBF, c;
    size_t k;
    if (n - i >= 8 && (memcpy(&x, s + i, 8), !(x & 0x8080808080808080ull))) {
      i += 8, u += 8;
      continue;
    }
    if ((c = s[i]) < 0x80) {
      i++, u++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF)
      k = 1;
    else if (c >= 0xE0 && c <= 0xEF)
      k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
      k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
      return 0;
    if (n - i <= k || s[i + 1] < lo || s[i + 1] > hi) return 0;
    for (size_t j = 2; j <= k; j++)
      if ((s[i + j] & 0xC0) != 0x80) return 0;
    i += k + 1, u += k == 3 ? 2 : 1;
  }
  *units = u;
  return 1;
}

static int is_utf8(const unsigned char *s, size_t n) {
  size_t u;
  return utf8_units(s, n, &u);
}

/* Node writes a lone surrogate of a string as U+FFFD (EF BF BD), so two different strings
 * would become one: the UTF-8 p of v (len bytes) is refused when v holds one. Only a copy
 * with an EF byte is looked at again, in UTF-16. */
static int check_unicode(napi_env env, napi_value v, const char *p, size_t len, const char *name) {
  size_t n, i;
  uint16_t *u;
  int bad = 0;
  if (!memchr(p, 0xEF, len)) return 0;
  NAPI(napi_get_value_string_utf16(env, v, NULL, 0, &n));
  if (!(u = malloc((n + 1) * sizeof *u))) return NOMEM();
  if (napi_get_value_string_utf16(env, v, (char16_t *)u, n + 1, &n) != napi_ok) {
    free(u);
    return throw_rc(env, BS_EIO, "Node-API call failed: napi_get_value_string_utf16");
  }
  for (i = 0; i < n && !bad; i++) {
    if (u[i] >= 0xD800 && u[i] <= 0xDBFF && i + 1 < n && u[i + 1] >= 0xDC00 && u[i + 1] <= 0xDFFF)
      i++;
    else
      bad = u[i] >= 0xD800 && u[i] <= 0xDFFF;
  }
  free(u);
  if (bad)
    return throw_rc(env, BS_EINVAL,
                    "%s: not valid Unicode (a lone surrogate at index %zu; pass bytes as a "
                    "Uint8Array)",
                    name, i - 1);
  return 0;
}

/* A string (UTF-8; one with a lone surrogate is refused), Buffer or Uint8Array, copied into a. */
static int get_bytes(napi_env env, arena *a, napi_value v, const char *name, bs_val *out) {
  napi_valuetype t;
  bool is;
  if (v == NULL) return throw_rc(env, BS_EINVAL, "%s: missing (expected a string)", name);
  if (type_of(env, v, &t)) return -1;
  if (t == napi_string) {
    size_t len, room = a->head ? a->head->cap - a->head->used : 0;
    char *p;
    if (room >= 64) { /* one pass when it fits in the arena's current block */
      p = (char *)a->head->data + a->head->used;
      NAPI(napi_get_value_string_utf8(env, v, p, room, &len));
      /* a cut copy ends before the first character that did not fit, which may take up to 4
       * bytes: only a copy with more than 4 bytes to spare is surely the whole string */
      if (len + 4 < room) {
        char *q = ar_alloc(a, len + 1); /* = p: the same block has room */
        if (q != p) memmove(q, p, len + 1);
        out->data = q, out->size = len;
        return check_unicode(env, v, q, len, name);
      }
    }
    NAPI(napi_get_value_string_utf8(env, v, NULL, 0, &len));
    if (!(p = ar_alloc(a, len + 1))) return NOMEM();
    NAPI(napi_get_value_string_utf8(env, v, p, len + 1, &len));
    out->data = p, out->size = len;
    return check_unicode(env, v, p, len, name);
  }
  NAPI(napi_is_typedarray(env, v, &is));
  if (is) {
    napi_typedarray_type tt;
    size_t len, off;
    void *data;
    napi_value ab;
    NAPI(napi_get_typedarray_info(env, v, &tt, &len, &data, &ab, &off));
    if (tt == napi_uint8_array) return ar_dup(a, out, len ? data : empty_bytes, len) ? NOMEM() : 0;
  }
  return throw_rc(env, BS_EINVAL, "%s: expected a string or Uint8Array", name);
}

static int get_opt_bytes(napi_env env, arena *a, napi_value v, const char *name, bs_val *out) {
  if (v == NULL || is_nullish(env, v)) {
    out->data = NULL, out->size = 0;
    return 0;
  }
  return get_bytes(env, a, v, name, out);
}

/* JSON text: a string or bytes as given, anything else through JSON.stringify. */
static int get_json(napi_env env, arena *a, napi_value v, const char *name, bs_val *out) {
  napi_valuetype t;
  bool is = false;
  napi_value global, json, stringify, s;
  if (v == NULL) return throw_rc(env, BS_EINVAL, "%s: missing", name);
  if (type_of(env, v, &t)) return -1;
  if (t != napi_string) NAPI(napi_is_typedarray(env, v, &is));
  if (t == napi_string || is) return get_bytes(env, a, v, name, out);
  if (t != napi_object)
    return throw_rc(env, BS_EINVAL, "%s: expected JSON text or an object", name);
  NAPI(napi_get_global(env, &global));
  NAPI(napi_get_named_property(env, global, "JSON", &json));
  NAPI(napi_get_named_property(env, json, "stringify", &stringify));
  NAPI(napi_call_function(env, json, stringify, 1, &v, &s));
  return get_bytes(env, a, s, name, out);
}

/* An op id or other u64 below 2^63: a bigint, or a number that is a safe non-negative integer. */
static int get_u64(napi_env env, napi_value v, const char *name, uint64_t *out) {
  napi_valuetype t;
  if (v == NULL) return throw_rc(env, BS_EINVAL, "%s: missing (expected a bigint)", name);
  if (type_of(env, v, &t)) return -1;
  if (t == napi_bigint) {
    int64_t i;
    bool lossless;
    NAPI(napi_get_value_bigint_int64(env, v, &i, &lossless));
    if (!lossless || i < 0) return throw_range(env, name, "out of range (0 .. 2^63-1)");
    *out = (uint64_t)i;
    return 0;
  }
  if (t == napi_number) {
    double d;
    NAPI(napi_get_value_double(env, v, &d));
    if (!(d >= 0 && d <= MAX_SAFE_INT) || d != (double)(uint64_t)d)
      return throw_range(env, name, "not a non-negative safe integer (use a bigint)");
    *out = (uint64_t)d;
    return 0;
  }
  return throw_rc(env, BS_EINVAL, "%s: expected a bigint", name);
}

static int get_opt_u64(napi_env env, napi_value v, const char *name, uint64_t *out) {
  return v == NULL ? 0 : get_u64(env, v, name, out);
}

static int get_size(napi_env env, napi_value v, const char *name, size_t *out) {
  uint64_t u;
  if (get_u64(env, v, name, &u)) return -1;
  if (u > SIZE_MAX) return throw_range(env, name, "too large");
  *out = (size_t)u;
  return 0;
}

static int get_double(napi_env env, napi_value v, const char *name, double *out) {
  napi_valuetype t;
  if (type_of(env, v, &t)) return -1;
  if (t != napi_number) return throw_rc(env, BS_EINVAL, "%s: expected a number", name);
  NAPI(napi_get_value_double(env, v, out));
  return 0;
}

static int get_bool(napi_env env, napi_value v, const char *name, int *out) {
  napi_valuetype t;
  bool b;
  if (v == NULL) return 0; /* absent: keep the default */
  if (type_of(env, v, &t)) return -1;
  if (t != napi_boolean) return throw_rc(env, BS_EINVAL, "%s: expected a boolean", name);
  NAPI(napi_get_value_bool(env, v, &b));
  *out = b;
  return 0;
}

static int get_array(napi_env env, napi_value v, const char *name, uint32_t *n) {
  bool is;
  if (v == NULL) {
    *n = 0;
    return 0;
  }
  NAPI(napi_is_array(env, v, &is));
  if (!is) return throw_rc(env, BS_EINVAL, "%s: expected an array", name);
  NAPI(napi_get_array_length(env, v, n));
  return 0;
}

/* A lookup (array of null/boolean/number/bigint/string/Uint8Array), encoded canonically into a. */
static int get_lookup(napi_env env, arena *a, napi_value v, const char *name, bs_val *out) {
  uint32_t n;
  bs_scalar *vals;
  bs_error err = {0};
  size_t size = 0;
  char nm[96];
  void *buf;
  int rc;
  if (get_array(env, v, name, &n)) return -1;
  if (v == NULL) return throw_rc(env, BS_EINVAL, "%s: missing (expected an array)", name);
  if (!(vals = ar_alloc(a, (n ? n : 1) * sizeof *vals))) return NOMEM();
  for (uint32_t i = 0; i < n; i++) {
    napi_value e;
    napi_valuetype t;
    memset(&vals[i], 0, sizeof vals[i]);
    snprintf(nm, sizeof nm, "%s[%u]", name, i);
    NAPI(napi_get_element(env, v, i, &e));
    if (type_of(env, e, &t)) return -1;
    if (t == napi_null || t == napi_undefined) {
      vals[i].type = BS_SCALAR_NULL;
    } else if (t == napi_boolean) {
      bool b;
      NAPI(napi_get_value_bool(env, e, &b));
      vals[i].type = b ? BS_SCALAR_TRUE : BS_SCALAR_FALSE;
    } else if (t == napi_number) {
      vals[i].type = BS_SCALAR_DOUBLE; /* the library normalises integral values */
      NAPI(napi_get_value_double(env, e, &vals[i].d));
    } else if (t == napi_bigint) {
      bool lossless;
      NAPI(napi_get_value_bigint_int64(env, e, &vals[i].i, &lossless));
      if (!lossless) return throw_range(env, nm, "bigint out of the int64 range");
      vals[i].type = BS_SCALAR_INT;
    } else if (t == napi_string || t == napi_object) { /* text, or bytes: a Uint8Array */
      vals[i].type = BS_SCALAR_STRING;
      if (get_bytes(env, a, e, nm, &vals[i].s)) return -1;
    } else {
      return throw_rc(env, BS_EINVAL,
                      "%s: expected null, a boolean, number, bigint, string or Uint8Array", nm);
    }
  }
  rc = bs_lookup_encode(NULL, 0, &size, vals, n, &err);
  if (rc != BS_OK && rc != BS_ETOOBIG) return throw_rc(env, rc, "%s: %s", name, err.msg);
  if (!(buf = ar_alloc(a, size))) return NOMEM();
  if ((rc = bs_lookup_encode(buf, size, &size, vals, n, &err)) != BS_OK)
    return throw_rc(env, rc, "%s: %s", name, err.msg);
  out->data = buf, out->size = size;
  return 0;
}

/* ---- C -> JS --------------------------------------------------------------------------------- */

static napi_value js_u64(napi_env env, uint64_t u) {
  napi_value v;
  napi_create_bigint_uint64(env, u, &v);
  return v;
}

static napi_value js_num(napi_env env, double d) {
  napi_value v;
  napi_create_double(env, d, &v);
  return v;
}

static napi_value js_bool(napi_env env, int b) {
  napi_value v;
  napi_get_boolean(env, b != 0, &v);
  return v;
}

static napi_value js_null(napi_env env) {
  napi_value v;
  napi_get_null(env, &v);
  return v;
}

/* A string; a Buffer of the bytes when they are not UTF-8 (so they come back as written);
 * null when absent (data NULL). */
static napi_value js_str(napi_env env, bs_val s) {
  napi_value v;
  if (!s.data) return js_null(env);
  if (!is_utf8(s.data, s.size)) {
    void *copy;
    napi_create_buffer_copy(env, s.size, s.data, &copy, &v);
    return v;
  }
  napi_create_string_utf8(env, s.size ? s.data : "", s.size, &v);
  return v;
}

static void set(napi_env env, napi_value obj, const char *key, napi_value v) {
  napi_value k;
  if (key_of(env, key, &k) == 0) napi_set_property(env, obj, k, v);
}

static napi_value js_obj(napi_env env) {
  napi_value o;
  napi_create_object(env, &o);
  return o;
}

/* ---- Handles --------------------------------------------------------------------------------- */

typedef enum kind { K_DB = 1, K_STORAGE = 2, K_WRITER = 3 } kind;
static const char *const kind_names[] = {"", "database", "storage", "writer"};
static const napi_type_tag kind_tags[] = {{0, 0},
                                          {0x6275636b65747374ull, 0x6f72652d64620001ull},
                                          {0x6275636b65747374ull, 0x6f72652d73740002ull},
                                          {0x6275636b65747374ull, 0x6f72652d77720003ull}};

typedef struct job job;
typedef struct node node;
struct node {
  kind kind;
  int refs;     /* 1 while open + children not yet released + calls in flight */
  int children; /* open child handles (close them first) */
  int closed;   /* close() called or the external collected: new calls fail */
  int finalized, released;
  node *parent;
  napi_deferred close_wait;
  napi_env env;
  union {
    bs_db *db;
    bs_storage *st;
    bs_writer *w;
  } u;
  /* writer: a job queue run by one async work at a time, and the binding's flush bound */
  job *pending, *pending_tail;
  int running, dirty;
  size_t q_records, q_bytes, max_records, max_bytes;
  arena scratch;
  /* database: the checkpoint listener's threadsafe function, made by the first onCheckpoint()
   * and kept until the database is released (a commit in a worker may be calling it) */
  napi_threadsafe_function listener;
};

static void node_unref(node *n);
static _Atomic int64_t live_handles; /* C objects not yet released (all envs; for tests) */

static void node_release(node *n) {
  node *p = n->parent;
  if (n->kind == K_WRITER)
    bs_writer_close(n->u.w);
  else if (n->kind == K_STORAGE)
    bs_storage_close(n->u.st);
  else
    bs_close(n->u.db); /* no commit can call the listener after this */
  if (n->listener) napi_release_threadsafe_function(n->listener, napi_tsfn_release);
  ar_free(&n->scratch);
  n->released = 1;
  live_handles--;
  if (n->close_wait) {
    napi_value u;
    napi_get_undefined(n->env, &u);
    napi_resolve_deferred(n->env, n->close_wait, u);
    n->close_wait = NULL;
  }
  if (n->finalized) free(n);
  if (p) node_unref(p);
}

static void node_unref(node *n) {
  if (--n->refs == 0) node_release(n);
}

static void node_mark_closed(node *n) {
  n->closed = 1;
  if (n->parent) n->parent->children--;
}

static void node_finalize(napi_env env, void *data, void *hint) {
  node *n = data;
  n->finalized = 1;
  if (!n->closed) {
    node_mark_closed(n);
    node_unref(n); /* may free n */
  } else if (n->released) {
    free(n);
  }
}

static napi_value node_wrap(napi_env env, kind k, void *obj, node *parent) {
  napi_value ext;
  node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->kind = k, n->refs = 1, n->parent = parent, n->env = env;
  n->u.db = obj;
  if (napi_create_external(env, n, node_finalize, NULL, &ext) != napi_ok ||
      napi_type_tag_object(env, ext, &kind_tags[k]) != napi_ok) {
    free(n);
    return NULL;
  }
  if (parent) parent->refs++, parent->children++;
  live_handles++;
  return ext;
}

/* The open handle of kind k in v; else a JS error and NULL. */
static node *get_node(napi_env env, napi_value v, kind k) {
  napi_valuetype t;
  bool ok = false;
  void *p = NULL;
  if (v && napi_typeof(env, v, &t) == napi_ok && t == napi_external)
    napi_check_object_type_tag(env, v, &kind_tags[k], &ok);
  if (!ok || napi_get_value_external(env, v, &p) != napi_ok) {
    throw_rc(env, BS_EINVAL, "handle: not a bucketstore %s", kind_names[k]);
    return NULL;
  }
  if (((node *)p)->closed) {
    throw_rc(env, BS_ESTATE, "%s: closed", kind_names[k]);
    return NULL;
  }
  return p;
}

/* ---- Async calls ----------------------------------------------------------------------------- */

typedef struct work work;
typedef void (*exec_fn)(work *w);
typedef napi_value (*done_fn)(napi_env env, work *w);
struct work {
  napi_async_work aw;
  napi_deferred d;
  node *n; /* the handle the call runs on (ref held), or NULL for open */
  exec_fn exec;
  done_fn done;
  arena ar;
  int rc;
  bs_error err;
  /* call-specific fields */
  union {
    bs_checkpoint cp;
    bs_status status;
    bs_compact_stats stats;
    bs_commit_result cr;
    bs_stat stat;
  } r;
  void *obj;   /* a handle opened by the call (db, storage, writer), released if not wrapped */
  bs_val a, b; /* names, paths, messages */
  uint64_t u1, u2, u3;
  int i1, i2;
  size_t n_items;
  void *items, *out; /* call-specific arrays in ar */
  bs_checkpoint cp2; /* waitCheckpoint: the known checkpoint */
  bs_open_options oo;
  bs_writer_options wo;
  bs_compact_options co;
  bs_backup_options bo;
  struct chan *ch;         /* a transfer (export/load) the call works on (ref held), or NULL */
  progress_ctx *pc;        /* a long call's progress (onProgress, signal), or NULL */
  void *list, **list_tail; /* results copied out in the worker */
  size_t list_n;
  struct opbatch *bt; /* bucketData's batch */
};

static void work_exec(napi_env env, void *data) {
  work *w = data;
  w->exec(w);
}

/* A long call's progress (compaction, backup, load). After each step the library thread asks
 * progress_step: it reads the AbortSignal's flag and, with an onProgress callback, queues a call
 * of it on the main thread and waits for the verdict, so the callback sees every step in order
 * and its cancel takes effect at that step. The callback cancels by returning true or by
 * throwing; a Promise it returns is waited for the same way (true, or a rejection, cancels).
 * Every context is listed in its environment's envdata until freed: when the environment exits
 * (process.exit(), an uncaught exception, a worker thread's end) each is abandoned, and its
 * thread stops waiting for a main thread that will not answer again and cancels the call at its
 * next step, so the exit, which waits for the thread pool, ends. */
struct progress_ctx {
  napi_threadsafe_function tsfn; /* onProgress, NULL when none */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending, cancelled, abandoned; /* under mu */
  int records_mode;                  /* the callback gets the records so far, else the stats */
  bs_compact_stats stats;
  uint64_t records;
  _Atomic int *flag; /* the AbortSignal's flag (an Int32Array over a SharedArrayBuffer), or NULL */
  napi_ref keep;     /* that array */
  napi_ref error;    /* {error: what the callback threw or its Promise rejected with} */
  envdata *ed;       /* NULL once the environment's data is gone */
  progress_ctx *prev, *next;
};

/* Library thread: a waiting progress_step returns (cancelled) and later ones do not wait. */
static void progress_abandon(progress_ctx *pc) {
  pthread_mutex_lock(&pc->mu);
  pc->abandoned = 1;
  pthread_cond_broadcast(&pc->cv);
  pthread_mutex_unlock(&pc->mu);
}

/* The environment exits: abandons every long call under way, and the ones started later. */
static void progress_abandon_all(void *arg) {
  envdata *ed = arg;
  ed->exiting = 1;
  for (progress_ctx *pc = ed->live; pc; pc = pc->next) progress_abandon(pc);
}

static void progress_free(napi_env env, progress_ctx *pc) {
  if (pc->ed) {
    if (pc->prev)
      pc->prev->next = pc->next;
    else
      pc->ed->live = pc->next;
    if (pc->next) pc->next->prev = pc->prev;
  }
  if (pc->tsfn) napi_release_threadsafe_function(pc->tsfn, napi_tsfn_release);
  if (pc->keep) napi_delete_reference(env, pc->keep);
  if (pc->error) napi_delete_reference(env, pc->error);
  pthread_mutex_destroy(&pc->mu);
  pthread_cond_destroy(&pc->cv);
  free(pc);
}

static void envdata_free(napi_env env, void *data, void *hint) {
  envdata *ed = data;
  napi_remove_env_cleanup_hook(env, progress_abandon_all, ed);
  progress_abandon_all(ed);
  for (progress_ctx *pc = ed->live; pc; pc = pc->next) pc->ed = NULL;
  if (ed->holder) napi_delete_reference(env, ed->holder);
  free(ed);
}

static void progress_call_js(napi_env env, napi_value fn, void *context, void *data);
static napi_value js_stats(napi_env env, const bs_compact_stats *s);

/* The progress context of a long call: onProgress (a function or NULL) and the AbortSignal's
 * flag (an Int32Array over a SharedArrayBuffer, or NULL). *out is set, to be freed by
 * progress_free, whenever it could be made, even when this fails later. */
static int progress_new(napi_env env, napi_value fn, napi_value flag, int records_mode,
                        progress_ctx **out) {
  napi_valuetype t = napi_undefined;
  envdata *ed = NULL;
  progress_ctx *pc;
  napi_value name;
  *out = NULL;
  if (fn && type_of(env, fn, &t)) return -1;
  if (fn && t != napi_function)
    return throw_rc(env, BS_EINVAL, "options.onProgress: expected a function");
  NAPI(napi_get_instance_data(env, (void **)&ed));
  if (!(pc = calloc(1, sizeof *pc))) return NOMEM();
  pthread_mutex_init(&pc->mu, NULL);
  pthread_cond_init(&pc->cv, NULL);
  pc->records_mode = records_mode, pc->abandoned = ed->exiting, pc->ed = ed;
  if ((pc->next = ed->live)) pc->next->prev = pc;
  ed->live = pc;
  *out = pc;
  if (flag) {
    napi_typedarray_type tt;
    size_t len, off;
    void *data;
    napi_value ab;
    if (napi_get_typedarray_info(env, flag, &tt, &len, &data, &ab, &off) != napi_ok ||
        tt != napi_int32_array || len < 1 ||
        napi_create_reference(env, flag, 1, &pc->keep) != napi_ok)
      return throw_rc(env, BS_EINVAL, "cancel: expected an Int32Array");
    pc->flag = data;
  }
  if (fn &&
      (napi_create_string_utf8(env, "bucketstore.progress", NAPI_AUTO_LENGTH, &name) != napi_ok ||
       napi_create_threadsafe_function(env, fn, NULL, name, 0, 1, NULL, NULL, NULL,
                                       progress_call_js, &pc->tsfn) != napi_ok))
    return throw_rc(env, BS_EIO, "options.onProgress: could not create a threadsafe function");
  return 0;
}

/* Library thread, after a step (pc->stats or pc->records set): non-zero cancels the call. */
static int progress_step(progress_ctx *pc) {
  int cancel;
  pthread_mutex_lock(&pc->mu);
  if (pc->tsfn && !pc->abandoned && !pc->cancelled && !(pc->flag && atomic_load(pc->flag))) {
    pc->pending = 1;
    pthread_mutex_unlock(&pc->mu);
    if (napi_call_threadsafe_function(pc->tsfn, pc, napi_tsfn_blocking) != napi_ok)
      progress_abandon(pc); /* the environment is closing */
    pthread_mutex_lock(&pc->mu);
    while (pc->pending && !pc->abandoned) pthread_cond_wait(&pc->cv, &pc->mu);
  }
  cancel = pc->cancelled || pc->abandoned || (pc->flag && atomic_load(pc->flag));
  pthread_mutex_unlock(&pc->mu);
  return cancel;
}

/* Main thread: the callback's verdict for the waiting step. */
static void progress_done(progress_ctx *pc, int cancel) {
  pthread_mutex_lock(&pc->mu);
  if (cancel) pc->cancelled = 1;
  pc->pending = 0;
  pthread_cond_signal(&pc->cv);
  pthread_mutex_unlock(&pc->mu);
}

/* Main thread: the callback threw e (or its Promise rejected with e): the call rejects with it. */
static void progress_fail(napi_env env, progress_ctx *pc, napi_value e) {
  napi_value box;
  if (e && !pc->error && napi_create_object(env, &box) == napi_ok &&
      napi_set_named_property(env, box, "error", e) == napi_ok)
    napi_create_reference(env, box, 1, &pc->error);
  progress_done(pc, 1);
}

static void progress_fail_pending(napi_env env, progress_ctx *pc) {
  bool pending = false;
  napi_value e = NULL;
  napi_is_exception_pending(env, &pending);
  if (pending && napi_get_and_clear_last_exception(env, &e) != napi_ok) e = NULL;
  progress_fail(env, pc, e);
}

/* Main thread: the callback returned (or its Promise resolved to) v: only true cancels. */
static void progress_verdict(napi_env env, progress_ctx *pc, napi_value v) {
  napi_valuetype t;
  bool yes = false;
  progress_done(pc, napi_typeof(env, v, &t) == napi_ok && t == napi_boolean &&
                        napi_get_value_bool(env, v, &yes) == napi_ok && yes);
}

/* The settling of a Promise onProgress returned: (value) -> undefined, data: the context. */
static napi_value progress_settled(napi_env env, napi_callback_info info, int rejected) {
  size_t argc = 1;
  napi_value v = NULL;
  void *pc = NULL;
  if (napi_get_cb_info(env, info, &argc, &v, NULL, &pc) != napi_ok || !pc) return NULL;
  if (argc < 1) napi_get_undefined(env, &v);
  if (rejected)
    progress_fail(env, pc, v);
  else
    progress_verdict(env, pc, v);
  return NULL;
}

static napi_value progress_resolved(napi_env env, napi_callback_info info) {
  return progress_settled(env, info, 0);
}

static napi_value progress_rejected(napi_env env, napi_callback_info info) {
  return progress_settled(env, info, 1);
}

/* Main thread: runs onProgress for the waiting step (env NULL: the environment is going away,
 * and its cleanup abandons the waiting thread). */
static void progress_call_js(napi_env env, napi_value fn, void *context, void *data) {
  progress_ctx *pc = data;
  napi_value arg, u, r, then, cb[2];
  bool promise = false;
  if (!env || !fn) return;
  arg = pc->records_mode ? js_num(env, (double)pc->records) : js_stats(env, &pc->stats);
  napi_get_undefined(env, &u);
  if (napi_call_function(env, u, fn, 1, &arg, &r) != napi_ok) {
    progress_fail_pending(env, pc);
  } else if (napi_is_promise(env, r, &promise) != napi_ok || !promise) {
    progress_verdict(env, pc, r);
  } else if (napi_get_named_property(env, r, "then", &then) != napi_ok ||
             napi_create_function(env, "onProgressResolved", NAPI_AUTO_LENGTH, progress_resolved,
                                  pc, &cb[0]) != napi_ok ||
             napi_create_function(env, "onProgressRejected", NAPI_AUTO_LENGTH, progress_rejected,
                                  pc, &cb[1]) != napi_ok ||
             napi_call_function(env, r, then, 2, cb, &u) != napi_ok) {
    progress_fail_pending(env, pc);
  }
}

/* What the callback threw, into *out; 0 when it did not throw. */
static int progress_thrown(napi_env env, progress_ctx *pc, napi_value *out) {
  napi_value box;
  return pc && pc->error && napi_get_reference_value(env, pc->error, &box) == napi_ok &&
         napi_get_named_property(env, box, "error", out) == napi_ok;
}

static void chan_unref(napi_env env, struct chan *ch);

static void opbatch_free(napi_env env, struct opbatch *b);

static void work_free(napi_env env, work *w) {
  if (w->ch) chan_unref(env, w->ch);
  if (w->pc) progress_free(env, w->pc);
  opbatch_free(env, w->bt);
  ar_free(&w->ar);
  free(w);
}

static void work_complete(napi_env env, napi_status status, void *data) {
  work *w = data;
  napi_value v = NULL;
  if (status != napi_ok && w->rc == BS_OK) w->rc = BS_ECANCELED;
  if (w->rc == BS_OK) v = w->done(env, w);
  if (w->rc != BS_OK && progress_thrown(env, w->pc, &v)) {
    napi_reject_deferred(env, w->d, v); /* the onProgress callback threw v: it cancelled */
  } else if (w->rc != BS_OK) {
    napi_reject_deferred(env, w->d, make_error(env, w->rc, &w->err));
  } else if (v == NULL) {
    bool pending = false;
    napi_value e;
    napi_is_exception_pending(env, &pending);
    if (pending)
      napi_get_and_clear_last_exception(env, &e);
    else
      e = make_error(env, BS_ENOMEM, NULL);
    napi_reject_deferred(env, w->d, e);
  } else {
    napi_resolve_deferred(env, w->d, v);
  }
  napi_delete_async_work(env, w->aw);
  if (w->n) node_unref(w->n);
  work_free(env, w);
}

static work *work_new(napi_env env) {
  work *w = calloc(1, sizeof *w);
  if (!w) NOMEM();
  return w;
}

/* Queues w (which owns n's ref from here on) and returns its Promise. */
static napi_value work_start(napi_env env, work *w, node *n, exec_fn exec, done_fn done) {
  napi_value promise, name;
  w->n = n, w->exec = exec, w->done = done;
  if (napi_create_promise(env, &w->d, &promise) != napi_ok ||
      napi_create_string_utf8(env, "bucketstore", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_create_async_work(env, NULL, name, work_exec, work_complete, w, &w->aw) != napi_ok ||
      napi_queue_async_work(env, w->aw) != napi_ok) {
    throw_rc(env, BS_EIO, "could not start an async call");
    work_free(env, w); /* a created promise stays pending; nothing else refers to it */
    return NULL;
  }
  if (n) n->refs++;
  return promise;
}

/* A call's arguments: argv[0..n-1], missing ones NULL. */
#define ARGS(n)                                                                                    \
  size_t argc = (n);                                                                               \
  napi_value argv[(n)] = {0};                                                                      \
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return NULL;                \
  for (size_t i_ = argc; i_ < (n); i_++) argv[i_] = NULL;                                          \
  for (size_t i_ = 0; i_ < argc && i_ < (n); i_++)                                                 \
    if (is_nullish(env, argv[i_])) argv[i_] = NULL

#define FAIL_WORK(w)                                                                               \
  do {                                                                                             \
    work_free(env, w);                                                                             \
    return NULL;                                                                                   \
  } while (0)

/* ---- Database -------------------------------------------------------------------------------- */

static void exec_open(work *w) {
  bs_db *db = NULL;
  if (w->i1)
    w->rc = bs_open_memory(&db, &w->oo, &w->err);
  else if (w->i2)
    w->rc = bs_open_postgres(&db, w->a.data, &w->oo, &w->err);
  else
    w->rc = bs_open(&db, w->a.data, &w->oo, &w->err);
  w->obj = db;
}

static napi_value done_handle(napi_env env, work *w) {
  kind k = w->n ? (w->n->kind == K_DB ? K_STORAGE : K_WRITER) : K_DB;
  napi_value ext = node_wrap(env, k, w->obj, w->n);
  if (!ext) {
    if (k == K_WRITER)
      bs_writer_close(w->obj);
    else if (k == K_STORAGE)
      bs_storage_close(w->obj);
    else
      bs_close(w->obj);
  }
  return ext;
}

/* open(path | url | null, {memory, postgres, nosync, readonly, nomigrate, mapSize,
 * checksumCacheEntries, maxConnections}) */
static napi_value db_open(napi_env env, napi_callback_info info) {
  static const struct {
    const char *name;
    unsigned flag;
  } flags[] = {
      {"nosync", BS_OPEN_NOSYNC}, {"readonly", BS_OPEN_RDONLY}, {"nomigrate", BS_OPEN_NOMIGRATE}};
  ARGS(2);
  napi_value v;
  work *w = work_new(env);
  char name[64];
  if (!w) return NULL;
  w->oo = (bs_open_options)BS_OPEN_OPTIONS_INIT;
  if (get_prop(env, argv[1], "memory", &v) || get_bool(env, v, "options.memory", &w->i1) ||
      get_prop(env, argv[1], "postgres", &v) || get_bool(env, v, "options.postgres", &w->i2))
    FAIL_WORK(w);
#ifndef BS_HAVE_PG
  if (w->i2) {
    throw_rc(env, BS_EUNSUPPORTED,
             "openPostgres: this bucketstore addon was built without libpq (the PostgreSQL client "
             "library): install it (apt-get install libpq-dev) and reinstall bucketstore "
             "(npm rebuild bucketstore)");
    FAIL_WORK(w);
  }
#endif
  if (!w->i1) {
    bs_val p;
    if (get_bytes(env, &w->ar, argv[0], w->i2 ? "url" : "path", &p) ||
        ar_dup(&w->ar, &w->a, p.data, p.size + 1))
      FAIL_WORK(w);
    ((char *)w->a.data)[p.size] = 0;
    if (memchr(p.data, 0, p.size)) {
      throw_range(env, w->i2 ? "url" : "path", "contains a NUL byte");
      FAIL_WORK(w);
    }
  }
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
    int on = 0;
    snprintf(name, sizeof name, "options.%s", flags[i].name);
    if (get_prop(env, argv[1], flags[i].name, &v) || get_bool(env, v, name, &on)) FAIL_WORK(w);
    if (on) w->oo.flags |= flags[i].flag;
  }
  if (get_prop(env, argv[1], "mapSize", &v) ||
      (v && get_size(env, v, "options.mapSize", &w->oo.map_size)))
    FAIL_WORK(w);
  if (get_prop(env, argv[1], "checksumCacheEntries", &v) ||
      (v && get_size(env, v, "options.checksumCacheEntries", &w->oo.checksum_cache_entries)))
    FAIL_WORK(w);
  /* absent: the library's default pool; 0 would say the same, so it is refused as a size */
  if (get_prop(env, argv[1], "maxConnections", &v) ||
      (v && get_size(env, v, "options.maxConnections", &w->oo.pg_max_connections)))
    FAIL_WORK(w);
  if (v && !w->oo.pg_max_connections) {
    throw_range(env, "options.maxConnections", "must be at least 1");
    FAIL_WORK(w);
  }
  return work_start(env, w, NULL, exec_open, done_handle);
}

/* close(handle): resolves when the C object is released (after the calls in flight). */
static napi_value handle_close(napi_env env, napi_callback_info info) {
  ARGS(1);
  napi_value promise;
  napi_valuetype t;
  node *n = NULL;
  bool ok = false;
  for (int k = K_DB; k <= K_WRITER && !ok; k++)
    if (argv[0] && napi_typeof(env, argv[0], &t) == napi_ok && t == napi_external)
      napi_check_object_type_tag(env, argv[0], &kind_tags[k], &ok);
  if (!ok || napi_get_value_external(env, argv[0], (void **)&n) != napi_ok) {
    throw_rc(env, BS_EINVAL, "handle: not a bucketstore handle");
    return NULL;
  }
  if (n->children) {
    throw_rc(env, BS_ESTATE, "%s: close its %d open %s first", kind_names[n->kind], n->children,
             n->kind == K_DB ? "storage(s) and export(s)" : "writer(s)");
    return NULL;
  }
  if (n->closed) { /* closing twice is a no-op */
    napi_deferred d;
    napi_value u;
    if (napi_create_promise(env, &d, &promise) != napi_ok) return NULL;
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, d, u);
    return promise;
  }
  if (napi_create_promise(env, &n->close_wait, &promise) != napi_ok) return NULL;
  node_mark_closed(n);
  node_unref(n);
  return promise;
}

static void exec_stream_create(work *w) {
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  uint32_t id = 0;
  so.hash = (bs_hash)w->i1;
  w->rc = bs_stream_create(&id, w->n->u.db, w->a.data, &so, &w->err);
  w->u1 = id;
}

static napi_value done_u32(napi_env env, work *w) {
  return js_num(env, (double)w->u1);
}

/* createStream(db, name, {checksum: 'xxh3' | 'sha256'}) -> stream id */
static napi_value stream_create(napi_env env, napi_callback_info info) {
  ARGS(3);
  napi_value v;
  bs_val name, hash = {0};
  node *n = get_node(env, argv[0], K_DB);
  work *w = n ? work_new(env) : NULL;
  if (!w) return NULL;
  if (get_bytes(env, &w->ar, argv[1], "name", &name) ||
      ar_dup(&w->ar, &w->a, name.data, name.size + 1) || get_prop(env, argv[2], "checksum", &v) ||
      get_opt_bytes(env, &w->ar, v, "options.checksum", &hash))
    FAIL_WORK(w);
  ((char *)w->a.data)[name.size] = 0;
  if (memchr(name.data, 0, name.size)) {
    throw_range(env, "name", "contains a NUL byte");
    FAIL_WORK(w);
  }
  if (hash.data && hash.size == 6 && !memcmp(hash.data, "sha256", 6))
    w->i1 = BS_HASH_SHA256;
  else if (hash.data && !(hash.size == 4 && !memcmp(hash.data, "xxh3", 4))) {
    throw_range(env, "options.checksum", "expected 'xxh3' or 'sha256'");
    FAIL_WORK(w);
  }
  return work_start(env, w, n, exec_stream_create, done_u32);
}

typedef struct stream_item {
  struct stream_item *next;
  bs_stream_info info;
} stream_item;

static int collect_stream(const bs_stream_info *info, void *payload) {
  work *w = payload;
  stream_item *it = ar_alloc(&w->ar, sizeof *it);
  if (!it || ar_dup(&w->ar, &it->info.name, info->name.data, info->name.size)) return BS_ENOMEM;
  it->info.id = info->id, it->info.state = info->state, it->info.hash = info->hash;
  it->next = NULL;
  *w->list_tail = it;
  w->list_tail = (void **)&it->next;
  w->list_n++;
  return 0;
}

static void exec_stream_list(work *w) {
  w->list_tail = &w->list;
  w->rc = bs_stream_list(w->n->u.db, collect_stream, w, &w->err);
}

static const char *const state_names[] = {"",        "PROCESSING", "ACTIVE",
                                          "ERRORED", "STOPPED",    "TERMINATED"};

static napi_value js_state(napi_env env, bs_stream_state s) {
  napi_value v;
  napi_create_string_utf8(env, s >= 1 && s <= 5 ? state_names[s] : "UNKNOWN", NAPI_AUTO_LENGTH, &v);
  return v;
}

static napi_value done_stream_list(napi_env env, work *w) {
  napi_value arr;
  uint32_t i = 0;
  napi_create_array_with_length(env, w->list_n, &arr);
  for (stream_item *it = w->list; it; it = it->next) {
    napi_value o = js_obj(env), h;
    set(env, o, "id", js_num(env, it->info.id));
    set(env, o, "name", js_str(env, it->info.name));
    set(env, o, "state", js_state(env, it->info.state));
    napi_create_string_utf8(env, it->info.hash == BS_HASH_SHA256 ? "sha256" : "xxh3",
                            NAPI_AUTO_LENGTH, &h);
    set(env, o, "checksum", h);
    napi_set_element(env, arr, i++, o);
  }
  return arr;
}

static napi_value stream_list(napi_env env, napi_callback_info info) {
  ARGS(1);
  node *n = get_node(env, argv[0], K_DB);
  work *w = n ? work_new(env) : NULL;
  if (!w) return NULL;
  return work_start(env, w, n, exec_stream_list, done_stream_list);
}

static void exec_storage_open(work *w) {
  bs_storage *st = NULL;
  w->rc = bs_storage_open(&st, w->n->u.db, (uint32_t)w->u1, &w->err);
  w->obj = st;
}

/* storageOpen(db, streamId = 0): 0 = the active stream, else the newest */
static napi_value storage_open(napi_env env, napi_callback_info info) {
  ARGS(2);
  node *n = get_node(env, argv[0], K_DB);
  work *w = n ? work_new(env) : NULL;
  if (!w) return NULL;
  if (get_opt_u64(env, argv[1], "streamId", &w->u1)) FAIL_WORK(w);
  if (w->u1 > UINT32_MAX) {
    throw_range(env, "streamId", "above 2^32-1");
    FAIL_WORK(w);
  }
  return work_start(env, w, n, exec_storage_open, done_handle);
}

static napi_value storage_stream_id(napi_env env, napi_callback_info info) {
  ARGS(1);
  node *n = get_node(env, argv[0], K_STORAGE);
  return n ? js_num(env, bs_storage_stream_id(n->u.st)) : NULL;
}

/* ---- Checkpoint listener ------------------------------------------------------------------ */

/* The JS function of a database's listener; freed when its threadsafe function is finalized,
 * after every queued call ran. */
typedef struct listener_ctx {
  napi_ref fn; /* NULL: unregistered */
} listener_ctx;

typedef struct listener_event {
  uint32_t stream;
  uint64_t checkpoint;
} listener_event;

/* Committing thread (a worker): queues the event for the main thread. */
static void on_checkpoint(uint32_t stream, uint64_t checkpoint, void *payload) {
  listener_event *e = malloc(sizeof *e);
  if (!e) return;
  e->stream = stream, e->checkpoint = checkpoint;
  if (napi_call_threadsafe_function(payload, e, napi_tsfn_nonblocking) != napi_ok) free(e);
}

/* Main thread: fn({stream, checkpoint}); what it throws goes to 'uncaughtException', as from
 * any event listener. */
static void listener_call_js(napi_env env, napi_value unused, void *context, void *data) {
  listener_ctx *ctx = context;
  listener_event *ev = data;
  napi_value fn, arg, u, r, e;
  if (env && ctx->fn && napi_get_reference_value(env, ctx->fn, &fn) == napi_ok) {
    arg = js_obj(env);
    set(env, arg, "stream", js_num(env, ev->stream));
    set(env, arg, "checkpoint", js_u64(env, ev->checkpoint));
    napi_get_undefined(env, &u);
    if (napi_call_function(env, u, fn, 1, &arg, &r) != napi_ok &&
        napi_get_and_clear_last_exception(env, &e) == napi_ok)
      napi_fatal_exception(env, e);
  }
  free(ev);
}

static void listener_finalize(napi_env env, void *data, void *hint) {
  listener_ctx *ctx = data;
  if (ctx->fn) napi_delete_reference(env, ctx->fn);
  free(ctx);
}

/* onCheckpoint(db, fn | null): fn runs after every checkpoint this process commits on db. */
static napi_value db_on_checkpoint(napi_env env, napi_callback_info info) {
  ARGS(2);
  napi_valuetype t = napi_undefined;
  node *n = get_node(env, argv[0], K_DB);
  listener_ctx *ctx = NULL;
  napi_value u, name;
  if (!n || (argv[1] && type_of(env, argv[1], &t))) return NULL;
  if (argv[1] && t != napi_function) {
    throw_rc(env, BS_EINVAL, "listener: expected a function or null");
    return NULL;
  }
  if (!n->listener) {
    if (!argv[1]) return napi_get_undefined(env, &u) == napi_ok ? u : NULL;
    if (!(ctx = calloc(1, sizeof *ctx))) return NOMEM(), NULL;
    if (napi_create_string_utf8(env, "bucketstore.checkpoint", NAPI_AUTO_LENGTH, &name) !=
            napi_ok ||
        napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, ctx, listener_finalize, ctx,
                                        listener_call_js, &n->listener) != napi_ok) {
      free(ctx);
      n->listener = NULL;
      throw_rc(env, BS_EIO, "listener: could not create a threadsafe function");
      return NULL;
    }
    napi_unref_threadsafe_function(env, n->listener); /* it does not keep the process alive */
  }
  napi_get_threadsafe_function_context(n->listener, (void **)&ctx);
  if (ctx->fn) napi_delete_reference(env, ctx->fn), ctx->fn = NULL;
  if (argv[1] && napi_create_reference(env, argv[1], 1, &ctx->fn) != napi_ok) {
    throw_rc(env, BS_EIO, "listener: could not keep the function");
    return NULL;
  }
  bs_set_checkpoint_listener(n->u.db, argv[1] ? on_checkpoint : NULL, n->listener);
  napi_get_undefined(env, &u);
  return u;
}

/* ---- Writer ---------------------------------------------------------------------------------- */

/* ---- Saves as bytes ---------------------------------------------------------------------------
 * save() and saveMany() (index.js's SaveEncoder) hand over their records encoded in one Buffer,
 * so that a record crosses with one Node-API call instead of one per field. The layout, all
 * integers little-endian and unaligned:
 *   save    := u8 tag (1 insert, 2 update, 3 delete)
 *              u8 present (bit 0: before_id, bit 1: after_id, bit 2: stored_data)
 *              bytes table, [bytes before_id], [bytes after_id], [bytes stored_data]
 *              u32 n_rows, row * n_rows          row := bytes bucket, object_type, object_id, data
 *              u32 n_lookups, lookup * n_lookups
 *   lookup  := u32 n_values, scalar * n_values, u32 n_params, bytes * n_params
 *   scalar  := u8 0 null | 1 false | 2 true | 3 f64 number | 4 i64 bigint | 5 bytes string
 *   bytes   := u32 size, size bytes (UTF-8 checked by the encoder, or a Uint8Array's bytes)
 * JS checks what only it can see (types, lone surrogates); the library checks every save of a
 * batch (bs_writer_check_save) before any is queued. */

typedef struct batch_saves {
  bs_save *saves;
  size_t *sizes; /* encoded bytes of each save: its measure for the flush bound */
  uint32_t n;
  int single; /* save(): errors name "record", else "saves[i]" */
} batch_saves;

/* Sets err (the library's bs_error, for a failure found on the binding's side); returns rc. */
static int err_set(bs_error *err, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int err_set(bs_error *err, int rc, const char *fmt, ...) {
  char msg[sizeof err->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap); /* fmt's arguments may be err->msg itself */
  va_end(ap);
  err->code = rc;
  memcpy(err->msg, msg, sizeof msg);
  return rc;
}

typedef struct rd {
  const unsigned char *p, *end;
} rd;

/* Returns the constant itself, so that the compiler sees a reader's failure is never BS_OK. */
static int rd_fail(bs_error *err) {
  err_set(err, BS_EINVAL, "encoding: not a batch encoded by index.js");
  return BS_EINVAL;
}

static int rd_u8(rd *r, unsigned *v, bs_error *err) {
  if (r->p == r->end) return rd_fail(err);
  *v = *r->p++;
  return BS_OK;
}

static int rd_u32(rd *r, uint32_t *v, bs_error *err) {
  if (r->end - r->p < 4) return rd_fail(err);
  *v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
       (uint32_t)r->p[3] << 24;
  r->p += 4;
  return BS_OK;
}

static int rd_u64(rd *r, uint64_t *v, bs_error *err) {
  uint32_t lo, hi;
  if (rd_u32(r, &lo, err) || rd_u32(r, &hi, err)) return BS_EINVAL;
  *v = (uint64_t)hi << 32 | lo;
  return BS_OK;
}

/* Bytes of the batch (never NULL: a present field, empty too). */
static int rd_field(rd *r, bs_val *v, bs_error *err) {
  uint32_t size;
  if (rd_u32(r, &size, err)) return BS_EINVAL;
  if ((size_t)(r->end - r->p) < size) return rd_fail(err);
  v->data = size ? (const void *)r->p : (const void *)empty_bytes, v->size = size;
  r->p += size;
  return BS_OK;
}

static int rd_count(rd *r, size_t each, uint32_t *n, bs_error *err) {
  if (rd_u32(r, n, err)) return BS_EINVAL;
  /* every element takes at least `each` bytes: a count beyond the rest is malformed */
  return (size_t)(r->end - r->p) / each < *n ? rd_fail(err) : BS_OK;
}

/* A lookup's values, encoded canonically (bs_lookup_encode) into the arena. */
static int rd_lookup(rd *r, arena *a, bs_val *key, bs_error *err) {
  static const char field[] = "lookup";
  uint32_t n;
  bs_scalar *vals;
  size_t size = 0;
  void *buf;
  int rc;
  if (rd_count(r, 1, &n, err)) return BS_EINVAL;
  if (!(vals = ar_alloc(a, (n ? n : 1) * sizeof *vals)))
    return err_set(err, BS_ENOMEM, "out of memory");
  for (uint32_t k = 0; k < n; k++) {
    unsigned t;
    uint64_t u;
    memset(&vals[k], 0, sizeof vals[k]);
    if (rd_u8(r, &t, err)) return BS_EINVAL;
    if (t <= 2) {
      vals[k].type = t == 0 ? BS_SCALAR_NULL : t == 1 ? BS_SCALAR_FALSE : BS_SCALAR_TRUE;
    } else if (t == 3 || t == 4) {
      if (rd_u64(r, &u, err)) return BS_EINVAL;
      if (t == 3) /* the library normalises integral values */
        vals[k].type = BS_SCALAR_DOUBLE, memcpy(&vals[k].d, &u, sizeof u);
      else
        vals[k].type = BS_SCALAR_INT, vals[k].i = (int64_t)u;
    } else if (t == 5) {
      vals[k].type = BS_SCALAR_STRING;
      if (rd_field(r, &vals[k].s, err)) return BS_EINVAL;
    } else {
      return rd_fail(err);
    }
  }
  rc = bs_lookup_encode(NULL, 0, &size, vals, n, err);
  if (rc != BS_OK && rc != BS_ETOOBIG) return err_set(err, rc, "%s: %s", field, err->msg);
  if (!(buf = ar_alloc(a, size))) return err_set(err, BS_ENOMEM, "out of memory");
  if ((rc = bs_lookup_encode(buf, size, &size, vals, n, err)) != BS_OK)
    return err_set(err, rc, "%s: %s", field, err->msg);
  key->data = buf, key->size = size; /* within BS_MAX_LOOKUP_KEY: bs_lookup_encode's rule */
  return BS_OK;
}

/* One save of the batch into s (arrays in a; bytes borrowed from the batch). */
static int rd_save(rd *r, arena *a, bs_save *s, bs_error *err) {
  unsigned tag, present;
  uint32_t n_rows, n_lookups;
  *s = (bs_save)BS_SAVE_INIT;
  if (rd_u8(r, &tag, err) || rd_u8(r, &present, err)) return BS_EINVAL;
  if (tag < BS_INSERT || tag > BS_DELETE) return rd_fail(err);
  s->tag = (bs_tag)tag;
  if (rd_field(r, &s->table, err) || ((present & 1) && rd_field(r, &s->before_id, err)) ||
      ((present & 2) && rd_field(r, &s->after_id, err)) ||
      ((present & 4) && rd_field(r, &s->stored_data, err)))
    return BS_EINVAL;
  if (rd_count(r, 16, &n_rows, err)) return BS_EINVAL;
  if (n_rows) {
    bs_row *row = ar_alloc(a, n_rows * sizeof *row);
    if (!row) return err_set(err, BS_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n_rows; i++)
      if (rd_field(r, &row[i].bucket, err) || rd_field(r, &row[i].object_type, err) ||
          rd_field(r, &row[i].object_id, err) || rd_field(r, &row[i].data, err))
        return BS_EINVAL;
    s->rows = row, s->n_rows = n_rows;
  }
  if (rd_count(r, 8, &n_lookups, err)) return BS_EINVAL;
  if (n_lookups) {
    bs_lookup *l = ar_alloc(a, n_lookups * sizeof *l);
    if (!l) return err_set(err, BS_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n_lookups; i++) {
      uint32_t np;
      bs_val *p;
      if (rd_lookup(r, a, &l[i].key, err) || rd_count(r, 4, &np, err))
        return err_set(err, err->code, "evaluatedParameters[%u].%s", i, err->msg);
      if (!(p = ar_alloc(a, (np ? np : 1) * sizeof *p)))
        return err_set(err, BS_ENOMEM, "out of memory");
      for (uint32_t k = 0; k < np; k++)
        if (rd_field(r, &p[k], err)) return BS_EINVAL;
      l[i].params = p, l[i].n_params = np;
    }
    s->lookups = l, s->n_lookups = n_lookups;
  }
  return BS_OK;
}

typedef enum jkind {
  J_SAVE,
  J_TRUNCATE,
  J_DROP,
  J_FLUSH,
  J_COMMIT,
  J_KEEPALIVE,
  J_SNAPSHOT_DONE,
  J_RESUME_LSN,
  J_CUSTOM_WCP,
  J_SOURCE_ROW
} jkind;

struct job {
  job *next;
  jkind kind;
  napi_deferred d;
  arena ar;
  batch_saves bs; /* J_SAVE */
  bs_val a, b;
  uint64_t u;
  int create_empty, has_ms;
  int64_t ms;
  /* results */
  int rc, flushed, found;
  bs_error err;
  uint64_t last_op;
  bs_commit_result cr;
  bs_val data;
};

static void exec_create_writer(work *w) {
  bs_writer *wr = NULL;
  w->rc = bs_writer_open(&wr, w->n->u.st, &w->wo, &w->err);
  w->obj = wr;
}

static napi_value done_writer(napi_env env, work *w) {
  napi_value ext = done_handle(env, w);
  node *n;
  if (!ext || napi_get_value_external(env, ext, (void **)&n) != napi_ok) return ext;
  n->max_records = w->u1, n->max_bytes = w->u2;
  return ext;
}

/* createWriter(storage, {skipExistingRows, createEmptyCheckpoints, maxRecords, maxBytes}) */
static napi_value create_writer(napi_env env, napi_callback_info info) {
  ARGS(2);
  napi_value v;
  node *n = get_node(env, argv[0], K_STORAGE);
  work *w = n ? work_new(env) : NULL;
  if (!w) return NULL;
  w->wo = (bs_writer_options)BS_WRITER_OPTIONS_INIT;
  w->u1 = FLUSH_RECS, w->u2 = FLUSH_BYTES;
  if (get_prop(env, argv[1], "skipExistingRows", &v) ||
      get_bool(env, v, "options.skipExistingRows", &w->wo.snapshot) ||
      get_prop(env, argv[1], "createEmptyCheckpoints", &v) ||
      get_bool(env, v, "options.createEmptyCheckpoints", &w->wo.create_empty) ||
      get_prop(env, argv[1], "maxRecords", &v) ||
      get_opt_u64(env, v, "options.maxRecords", &w->u1) || get_prop(env, argv[1], "maxBytes", &v) ||
      get_opt_u64(env, v, "options.maxBytes", &w->u2))
    FAIL_WORK(w);
  if (w->u1 == 0 || w->u2 == 0) {
    throw_range(env, "options.maxRecords/maxBytes", "must be at least 1");
    FAIL_WORK(w);
  }
  /* The binding flushes at its bound, in the worker; the C writer never auto-flushes. */
  w->wo.max_records = SIZE_MAX, w->wo.max_bytes = SIZE_MAX;
  return work_start(env, w, n, exec_create_writer, done_writer);
}

static int at_bound(const node *n) {
  return n->q_records >= n->max_records || n->q_bytes >= n->max_bytes;
}

/* Queues b's saves in order on the writer's thread, flushing first at the binding's bound (a
 * failed flush queues nothing more); *flushed and *last_op tell the last flush. An error names
 * the save ("saves[i]: ..."); the saves before it stay queued. */
static int queue_saves(node *n, const batch_saves *b, int *flushed, uint64_t *last_op,
                       bs_error *err) {
  int rc;
  for (uint32_t i = 0; i < b->n; i++) {
    if (at_bound(n)) {
      if ((rc = bs_writer_flush(last_op, n->u.w, err)) != BS_OK) return rc;
      *flushed = 1, n->q_records = n->q_bytes = 0, n->dirty = 0;
    }
    if ((rc = bs_writer_save(n->u.w, &b->saves[i], err)) != BS_OK)
      return b->single ? rc : err_set(err, rc, "saves[%u]: %s", i, err->msg);
    n->q_records++, n->q_bytes += b->sizes[i], n->dirty = 1;
  }
  return BS_OK;
}

/* Runs one job on the writer's thread (main or worker, never both at once). */
static void run_job(node *n, job *j) {
  bs_writer *wr = n->u.w;
  switch (j->kind) {
  case J_SAVE:
    j->rc = queue_saves(n, &j->bs, &j->flushed, &j->last_op, &j->err);
    return;
  case J_TRUNCATE:
  case J_DROP:
    j->rc = (j->kind == J_DROP ? bs_writer_drop : bs_writer_truncate)(wr, j->a, &j->err);
    if (j->rc == BS_OK) n->dirty = 1;
    return;
  case J_FLUSH:
    if (!n->dirty) return;
    if ((j->rc = bs_writer_flush(&j->last_op, wr, &j->err)) == BS_OK)
      j->flushed = 1, n->q_records = n->q_bytes = 0, n->dirty = 0;
    return;
  case J_COMMIT:
  case J_KEEPALIVE: {
    bs_commit_options o = BS_COMMIT_OPTIONS_INIT;
    o.create_empty = j->kind == J_KEEPALIVE ? 1 : j->create_empty;
    if ((j->rc = bs_writer_commit(&j->cr, wr, j->a, &o, &j->err)) == BS_OK)
      n->q_records = n->q_bytes = 0, n->dirty = 0;
    return;
  }
  case J_SNAPSHOT_DONE:
    j->rc = bs_writer_snapshot_done(wr, j->a, &j->err);
    return;
  case J_RESUME_LSN:
    j->rc = bs_writer_resume_lsn(wr, j->a, &j->err);
    return;
  case J_CUSTOM_WCP:
    j->rc = j->has_ms
                ? bs_writer_custom_write_checkpoint_requested(wr, j->a, j->u, j->b, j->ms, &j->err)
                : bs_writer_custom_write_checkpoint(wr, j->a, j->u, j->b, &j->err);
    if (j->rc == BS_OK) n->dirty = 1;
    return;
  case J_SOURCE_ROW:
    break;
  }
}

static int copy_source_row(const bs_val *data, void *payload) {
  job *j = payload;
  j->found = 1;
  return data ? (ar_dup(&j->ar, &j->data, data->data ? data->data : empty_bytes, data->size)
                     ? BS_ENOMEM
                     : 0)
              : 0;
}

static void run_job_source_row(node *n, job *j) {
  j->rc = bs_writer_source_row(n->u.w, j->a, j->b, copy_source_row, j, &j->err);
  if (j->rc == BS_ENOTFOUND) j->rc = BS_OK, j->found = 0;
}

/* bs_block_reason as the driver spells it; null when not blocked. */
static napi_value js_blocked_reason(napi_env env, const bs_commit_result *r) {
  static const char *const names[] = {"unknown", "snapshot_not_done", "below_no_checkpoint_before",
                                      "below_checkpoint_lsn"};
  unsigned k = (unsigned)r->blocked_reason;
  napi_value v;
  if (!r->checkpoint_blocked) return js_null(env);
  napi_create_string_utf8(env, names[k < 4 ? k : 0], NAPI_AUTO_LENGTH, &v);
  return v;
}

static napi_value job_result(napi_env env, job *j) {
  napi_value o;
  switch (j->kind) {
  case J_SAVE:
  case J_FLUSH:
    if (!j->flushed) return js_null(env);
    o = js_obj(env);
    set(env, o, "flushed_op", js_u64(env, j->last_op));
    return o;
  case J_COMMIT:
  case J_KEEPALIVE:
    o = js_obj(env);
    set(env, o, "checkpointBlocked", js_bool(env, j->cr.checkpoint_blocked));
    set(env, o, "checkpointCreated", js_bool(env, j->cr.checkpoint_created));
    set(env, o, "checkpoint", js_u64(env, j->cr.checkpoint));
    set(env, o, "blockedReason", js_blocked_reason(env, &j->cr));
    return o;
  case J_SOURCE_ROW:
    if (!j->found) {
      napi_get_undefined(env, &o);
      return o;
    }
    return js_str(env, j->data);
  default:
    napi_get_undefined(env, &o);
    return o;
  }
}

static void job_free(job *j) {
  ar_free(&j->ar);
  free(j);
}

typedef struct batch {
  napi_async_work aw;
  node *n;
  job *jobs;
} batch;

static void batch_exec(napi_env env, void *data) {
  batch *b = data;
  for (job *j = b->jobs; j; j = j->next)
    if (j->kind == J_SOURCE_ROW)
      run_job_source_row(b->n, j);
    else
      run_job(b->n, j);
}

static void batch_start(napi_env env, node *n);

static void batch_complete(napi_env env, napi_status status, void *data) {
  batch *b = data;
  node *n = b->n;
  job *j = b->jobs;
  napi_delete_async_work(env, b->aw);
  free(b);
  n->running = 0;
  if (n->pending) batch_start(env, n); /* the next jobs keep their order behind these */
  while (j) {
    job *next = j->next;
    if (status != napi_ok && j->rc == BS_OK) j->rc = BS_ECANCELED;
    if (j->rc != BS_OK)
      napi_reject_deferred(env, j->d, make_error(env, j->rc, &j->err));
    else
      napi_resolve_deferred(env, j->d, job_result(env, j));
    job_free(j);
    j = next;
  }
  node_unref(n);
}

/* Runs the pending jobs in one async work. On failure to start, they are rejected. */
static void batch_start(napi_env env, node *n) {
  napi_value name;
  batch *b = calloc(1, sizeof *b);
  if (b && napi_create_string_utf8(env, "bucketstore.writer", NAPI_AUTO_LENGTH, &name) == napi_ok &&
      napi_create_async_work(env, NULL, name, batch_exec, batch_complete, b, &b->aw) == napi_ok) {
    b->n = n, b->jobs = n->pending;
    n->pending = n->pending_tail = NULL;
    if (napi_queue_async_work(env, b->aw) == napi_ok) {
      n->running = 1, n->refs++;
      return;
    }
    n->pending = b->jobs;
    napi_delete_async_work(env, b->aw);
  }
  free(b);
  for (job *j = n->pending, *next; j; j = next) {
    bs_error err = {BS_EIO, "could not start an async call"};
    next = j->next;
    napi_reject_deferred(env, j->d, make_error(env, BS_EIO, &err));
    job_free(j);
  }
  n->pending = n->pending_tail = NULL;
}

/* Queues j behind the writer's pending jobs and returns its Promise. */
static napi_value job_queue(napi_env env, node *n, job *j) {
  napi_value promise;
  if (napi_create_promise(env, &j->d, &promise) != napi_ok) {
    job_free(j);
    throw_rc(env, BS_EIO, "could not create a promise");
    return NULL;
  }
  if (n->pending_tail)
    n->pending_tail->next = j;
  else
    n->pending = j;
  n->pending_tail = j;
  if (!n->running) batch_start(env, n);
  return promise;
}

static job *job_new(napi_env env, node **n, napi_value h, jkind k) {
  job *j;
  if (!(*n = get_node(env, h, K_WRITER))) return NULL;
  if (!(j = calloc(1, sizeof *j))) NOMEM();
  if (j) j->kind = k;
  return j;
}

/* Decodes the whole batch into b (arrays and a copy of the bytes in a), checking every save
 * before any is queued. */
static int decode_saves(const node *n, arena *a, const void *bytes, size_t size, uint32_t count,
                        batch_saves *b, bs_error *err) {
  rd r;
  unsigned char *copy = ar_alloc(a, size);
  b->saves = ar_alloc(a, (count ? count : 1) * sizeof *b->saves);
  b->sizes = ar_alloc(a, (count ? count : 1) * sizeof *b->sizes);
  if (!copy || !b->saves || !b->sizes) return err_set(err, BS_ENOMEM, "out of memory");
  if (size) memcpy(copy, bytes, size);
  r.p = copy, r.end = copy + size;
  for (b->n = 0; b->n < count; b->n++) {
    const unsigned char *start = r.p;
    bs_save *s = &b->saves[b->n];
    int rc = rd_save(&r, a, s, err);
    if (!rc) rc = bs_writer_check_save(n->u.w, s, err);
    if (rc)
      return b->single ? err_set(err, rc, "record: %s", err->msg)
                       : err_set(err, rc, "saves[%u]: %s", b->n, err->msg);
    b->sizes[b->n] = (size_t)(r.p - start);
  }
  return r.p == r.end ? BS_OK : rd_fail(err);
}

/* Whether queueing b now flushes at the bound before one of its saves. */
static int saves_flush(const node *n, const batch_saves *b) {
  size_t recs = n->q_records, bytes = n->q_bytes;
  for (uint32_t i = 0; i < b->n; i++) {
    if (recs >= n->max_records || bytes >= n->max_bytes) return 1;
    recs++, bytes += b->sizes[i];
  }
  return 0;
}

/* save()'s arguments after the writer: the Buffer, the count of saves in it, single. */
static int get_encoded(napi_env env, napi_value *argv, void **bytes, size_t *size, uint32_t *count,
                       bool *single) {
  bool is = false;
  if (argv[1]) NAPI(napi_is_buffer(env, argv[1], &is));
  if (!is || !argv[2] || napi_get_value_uint32(env, argv[2], count) != napi_ok)
    return throw_rc(env, BS_EINVAL, "saves: not a batch encoded by index.js");
  NAPI(napi_get_buffer_info(env, argv[1], bytes, size));
  if (argv[3]) NAPI(napi_get_value_bool(env, argv[3], single));
  return 0;
}

/* save(writer, bytes, count, single): count saves encoded in bytes (the layout above); single:
 * save()'s one record. null when queued without a flush (synchronously, on an idle writer), else
 * a Promise of null or {flushed_op}. A bad save throws and queues nothing. */
static napi_value writer_save(napi_env env, napi_callback_info info) {
  ARGS(4);
  node *n = get_node(env, argv[0], K_WRITER);
  void *bytes = NULL;
  size_t size = 0;
  uint32_t count;
  bool single = false;
  batch_saves b = {0};
  bs_error err = {0};
  job *j;
  int rc;
  if (!n || get_encoded(env, argv, &bytes, &size, &count, &single)) return NULL;
  /* decoded into the writer's scratch arena; a batch that must wait becomes its job's arena */
  if (n->scratch.head && n->scratch.head->cap > FLUSH_BYTES)
    ar_free(&n->scratch);
  else
    ar_reset(&n->scratch);
  b.single = single;
  if ((rc = decode_saves(n, &n->scratch, bytes, size, count, &b, &err)) != BS_OK) {
    napi_throw(env, make_error(env, rc, &err));
    return NULL;
  }
  if (!n->running && !n->pending && !saves_flush(n, &b)) {
    int flushed = 0;
    uint64_t last_op;
    if ((rc = queue_saves(n, &b, &flushed, &last_op, &err)) != BS_OK) {
      napi_throw(env, make_error(env, rc, &err));
      return NULL;
    }
    return js_null(env);
  }
  if (!(j = calloc(1, sizeof *j))) {
    NOMEM();
    return NULL;
  }
  j->kind = J_SAVE, j->bs = b, j->ar = n->scratch;
  n->scratch = (arena){NULL};
  return job_queue(env, n, j);
}

/* flush / snapshotDone / resumeLsn / commit / keepalive / truncate / drop share this shape. */
static napi_value writer_call(napi_env env, napi_callback_info info, jkind k, const char *what) {
  ARGS(3);
  node *n;
  job *j = job_new(env, &n, argv[0], k);
  napi_value v;
  if (!j) return NULL;
  if (k != J_FLUSH && get_bytes(env, &j->ar, argv[1], what, &j->a)) goto fail;
  if (k == J_COMMIT) {
    j->create_empty = -1;
    if (get_prop(env, argv[2], "createEmptyCheckpoints", &v) ||
        get_bool(env, v, "options.createEmptyCheckpoints", &j->create_empty))
      goto fail;
  }
  return job_queue(env, n, j);
fail:
  job_free(j);
  return NULL;
}

static napi_value writer_flush(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_FLUSH, NULL);
}
static napi_value writer_commit(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_COMMIT, "lsn");
}
static napi_value writer_keepalive(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_KEEPALIVE, "lsn");
}
static napi_value writer_snapshot_done(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_SNAPSHOT_DONE, "lsn");
}
static napi_value writer_resume_lsn(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_RESUME_LSN, "lsn");
}
static napi_value writer_truncate(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_TRUNCATE, "table");
}
static napi_value writer_drop(napi_env env, napi_callback_info info) {
  return writer_call(env, info, J_DROP, "table");
}

/* sourceRow(writer, table, replicaId) -> string | null (no data stored) | undefined (no row) */
static napi_value writer_source_row(napi_env env, napi_callback_info info) {
  ARGS(3);
  node *n;
  job *j = job_new(env, &n, argv[0], J_SOURCE_ROW);
  if (!j) return NULL;
  if (get_bytes(env, &j->ar, argv[1], "table", &j->a) ||
      get_bytes(env, &j->ar, argv[2], "replicaId", &j->b)) {
    job_free(j);
    return NULL;
  }
  return job_queue(env, n, j);
}

/* Milliseconds from a number (since the epoch, or a duration) or, with dates, from a Date: a
 * whole number, as Python's int (a fraction is refused, never truncated). */
static int get_ms(napi_env env, napi_value v, const char *name, int dates, int64_t *out) {
  bool is_date = false;
  double d;
  if (dates) NAPI(napi_is_date(env, v, &is_date));
  if (is_date)
    NAPI(napi_get_date_value(env, v, &d));
  else if (get_double(env, v, name, &d))
    return -1;
  if (!(d >= -9.2e18 && d <= 9.2e18)) return throw_range(env, name, "not a valid time");
  if (d != (double)(int64_t)d) return throw_range(env, name, "not a whole number of milliseconds");
  *out = (int64_t)d;
  return 0;
}

/* addCustomWriteCheckpoint(writer, {user_id, checkpoint, event_id, checkpoint_requested_at}) */
static napi_value writer_custom_wcp(napi_env env, napi_callback_info info) {
  ARGS(2);
  node *n;
  napi_value v;
  job *j = job_new(env, &n, argv[0], J_CUSTOM_WCP);
  if (!j) return NULL;
  if (get_prop(env, argv[1], "user_id", &v) ||
      get_bytes(env, &j->ar, v, "checkpoint.user_id", &j->a) ||
      get_prop(env, argv[1], "checkpoint", &v) || get_u64(env, v, "checkpoint.checkpoint", &j->u) ||
      get_prop(env, argv[1], "event_id", &v) ||
      get_opt_bytes(env, &j->ar, v, "checkpoint.event_id", &j->b) ||
      get_prop(env, argv[1], "checkpoint_requested_at", &v) ||
      (v && get_ms(env, v, "checkpoint.checkpoint_requested_at", 1, &j->ms))) {
    job_free(j);
    return NULL;
  }
  j->has_ms = v != NULL;
  return job_queue(env, n, j);
}

/* ---- Reading --------------------------------------------------------------------------------- */

static void exec_checkpoint(work *w) {
  w->rc = bs_get_checkpoint(&w->r.cp, w->n->u.st, &w->err);
}

static napi_value js_lsn(napi_env env, int has, const unsigned char *lsn, size_t size) {
  return has ? js_str(env, (bs_val){lsn, size}) : js_null(env);
}

static napi_value done_checkpoint(napi_env env, work *w) {
  napi_value o = js_obj(env);
  set(env, o, "checkpoint", js_u64(env, w->r.cp.op_id));
  set(env, o, "lsn", js_lsn(env, w->r.cp.has_lsn, w->r.cp.lsn, w->r.cp.lsn_size));
  return o;
}

static node *storage_arg(napi_env env, napi_value h, work **w) {
  node *n = get_node(env, h, K_STORAGE);
  *w = n ? work_new(env) : NULL;
  return *w ? n : NULL;
}

static napi_value get_checkpoint(napi_env env, napi_callback_info info) {
  ARGS(1);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  return n ? work_start(env, w, n, exec_checkpoint, done_checkpoint) : NULL;
}

/* Bucket data. The worker lays the batch out as index.js reads it, copying each op's fields out
 * of the read snapshot once: columns (op ids, types, checksums, and per field its kind and the
 * UTF-16 offset where it starts in the text) and the text of every field that is UTF-8, one
 * after another, from which the main thread makes one string that index.js slices. A Node-API
 * call per string, and above all napi_set_element per string into an array, cost more than the
 * rest of the read. A field outside the text (kind FIELD_RAW: bytes that are not UTF-8, or text
 * past TEXT_MAX, which keeps the string under V8's length limit) is copied to the arena and made
 * on its own. A field equal to the same field of the op before it in the batch (an op's object
 * type, most often) is FIELD_SAME: index.js reuses that op's string. */
enum { FIELD_TEXT, FIELD_NULL, FIELD_RAW, FIELD_SAME };
#define TEXT_MAX ((size_t)1 << 28)

typedef struct gbuf {
  unsigned char *p;
  size_t len, cap;
  int lent; /* p is an ArrayBuffer's memory that a call lent (see bucket_data): not ours to free */
} gbuf;

/* Room for n more bytes at g->p + g->len (doubling; a first block even for n 0), or NULL out
 * of memory. A lent block is left as it is: the bytes so far move to a block of our own. */
static unsigned char *gb_grow(gbuf *g, size_t n) {
  size_t cap = g->cap ? g->cap : 4096;
  unsigned char *p;
  while (cap - g->len < n) {
    if (cap > SIZE_MAX / 2) return NULL;
    cap *= 2;
  }
  if (!(p = g->lent ? malloc(cap) : realloc(g->p, cap))) return NULL;
  if (g->lent && g->len) memcpy(p, g->p, g->len);
  g->p = p, g->cap = cap, g->lent = 0;
  return g->p + g->len;
}

static inline unsigned char *gb_room(gbuf *g, size_t n) {
  return g->p && g->cap - g->len >= n ? g->p + g->len : gb_grow(g, n);
}

typedef struct cchunk {
  struct cchunk *next;
  bs_chunk c; /* ops not kept: they are in the batch's columns */
} cchunk;

typedef struct rawfield {
  struct rawfield *next;
  uint32_t f;
  bs_val v;
} rawfield;

/* The batch's buffers in the order of the pool bucketData lends (ids, types, sums, kinds, offs,
 * text). */
enum { N_COLUMNS = 6 };

/* The default mode's text is handed to JS in pieces of about PIECE_UNITS UTF-16 units, cut
 * between ops: a string of V8's regular size (under 128 KiB) is made in its young generation,
 * whose memory is used again from one scavenge to the next, where one string of the batch (1.3
 * MiB for 10k ops of 120-byte rows) went to its large-object space, fresh pages each call: 86%
 * of the default mode's page faults (perf record -e page-faults), about 48 a 1000 ops. Piece p
 * starts at op op, byte byte and unit unit of the batch's text. */
#define PIECE_UNITS 32768u
typedef struct textcut {
  size_t op, byte, unit;
} textcut;

typedef struct opbatch {
  gbuf ids, types, sums, kinds, offs, text;
  napi_ref pool;     /* the lent ArrayBuffers (an array, held for the call), or NULL */
  size_t n, units;   /* ops laid out; UTF-16 units of the text */
  size_t prev[4][2]; /* text offset and size of the previous op's fields, when text */
  textcut *cuts;     /* the default mode's pieces (cuts[0] the first, at 0) */
  size_t n_cuts, cap_cuts;
  rawfield *raw, **raw_tail;
  cchunk *chunks, **chunks_tail;
  size_t n_chunks;
} opbatch;

static gbuf *column(opbatch *b, int i) {
  gbuf *const g[N_COLUMNS] = {&b->ids, &b->types, &b->sums, &b->kinds, &b->offs, &b->text};
  return g[i];
}

static void opbatch_free(napi_env env, opbatch *b) {
  if (!b) return;
  for (int i = 0; i < N_COLUMNS; i++)
    if (!column(b, i)->lent) free(column(b, i)->p);
  free(b->cuts);
  if (b->pool) napi_delete_reference(env, b->pool);
}

/* Op op starts at byte byte and unit unit of the text: a new piece when the current one holds
 * PIECE_UNITS units or more. Out of memory: -1. */
static inline int text_cut(opbatch *b, size_t op, size_t byte, size_t unit) {
  textcut *c;
  if (unit - b->cuts[b->n_cuts - 1].unit < PIECE_UNITS) return 0;
  if (b->n_cuts == b->cap_cuts) {
    if (!(c = realloc(b->cuts, 2 * b->cap_cuts * sizeof *c))) return -1;
    b->cuts = c, b->cap_cuts *= 2;
  }
  b->cuts[b->n_cuts++] = (textcut){op, byte, unit};
  return 0;
}

/* Copies n bytes from s to d; whether they are all ASCII. */
static int copy_ascii(unsigned char *d, const unsigned char *s, size_t n) {
  uint64_t acc = 0, x;
  size_t i = 0;
  if (n < 8) {
    for (; i < n; i++) acc |= d[i] = s[i];
    return !(acc & 0x80);
  }
  for (; n - i > 8; i += 8) memcpy(&x, s + i, 8), memcpy(d + i, &x, 8), acc |= x;
  memcpy(&x, s + n - 8, 8), memcpy(d + n - 8, &x, 8), acc |= x; /* the last 8, overlapping */
  return !(acc & 0x8080808080808080ull);
}

/* Whether a (a text field's copy) holds the n bytes at v: the last 8 (or fewer) first, where
 * the fields of two ops most often differ, then the rest. */
static inline int same_bytes(const unsigned char *a, const unsigned char *v, size_t n) {
  uint64_t x, y;
  uint32_t c, d, e, g;
  if (n < 8) { /* an object type most often: two overlapping words, not a call to memcmp */
    if (n < 4) return !memcmp(a, v, n);
    memcpy(&c, a, 4), memcpy(&d, v, 4), memcpy(&e, a + n - 4, 4), memcpy(&g, v + n - 4, 4);
    return c == d && e == g;
  }
  memcpy(&x, a + n - 8, 8), memcpy(&y, v + n - 8, 8);
  return x == y && !memcmp(a, v, n - 8);
}

/* Field j of op b->n: its kind, its offset, its text. */
static int put_field(work *w, opbatch *b, int j, const bs_val *v) {
  uint32_t off = (uint32_t)b->units;
  unsigned char kind = FIELD_RAW, *t;
  size_t u = v->size;
  if (!v->data) {
    kind = FIELD_NULL;
  } else if (b->prev[j][1] == v->size + 1 &&
             same_bytes(b->text.p + b->prev[j][0], v->data, v->size)) {
    kind = FIELD_SAME;
  } else if (v->size <= TEXT_MAX - b->text.len) {
    if (!(t = gb_room(&b->text, v->size))) return BS_ENOMEM;
    if (copy_ascii(t, v->data, v->size) || utf8_units(t, v->size, &u)) {
      kind = FIELD_TEXT;
      b->prev[j][0] = b->text.len, b->prev[j][1] = v->size + 1; /* + 1: 0 is "not text" */
      b->text.len += v->size, b->units += u;
    }
  }
  if (kind != FIELD_SAME && kind != FIELD_TEXT) b->prev[j][1] = 0;
  if (kind == FIELD_RAW) {
    rawfield *r = ar_alloc(&w->ar, sizeof *r);
    if (!r || ar_dup(&w->ar, &r->v, v->data, v->size)) return BS_ENOMEM;
    r->f = (uint32_t)(4 * b->n + (size_t)j), r->next = NULL;
    *b->raw_tail = r, b->raw_tail = &r->next;
  }
  b->kinds.p[4 * b->n + (size_t)j] = kind;
  memcpy(b->offs.p + 4 * (4 * b->n + (size_t)j), &off, 4);
  return 0;
}

/* In raw mode a type's bits above the fourth say which fields the op does not carry (RAW_NULL
 * << j for field j): none for PUT, data for REMOVE, all four for MOVE and CLEAR. */
enum { RAW_NULL = 16 };
static const uint8_t raw_nulls[8] = {0, 0, RAW_NULL << 3, 15 * RAW_NULL, 15 * RAW_NULL, 0, 0, 0};

/* The chunk's metadata, kept for done_bucket_data (its ops are in the batch's columns). */
static int keep_chunk(work *w, const bs_val *bucket, uint64_t after, uint64_t next_after,
                      int has_more, uint64_t target_op, size_t n_ops) {
  opbatch *b = w->bt;
  cchunk *cc = ar_alloc(&w->ar, sizeof *cc);
  if (!cc || ar_dup(&w->ar, &cc->c.bucket, bucket->data, bucket->size)) return BS_ENOMEM;
  cc->c = (bs_chunk){.bucket = cc->c.bucket,
                     .after = after,
                     .next_after = next_after,
                     .has_more = has_more,
                     .target_op = target_op,
                     .n_ops = n_ops};
  cc->next = NULL;
  *b->chunks_tail = cc, b->chunks_tail = &cc->next;
  b->n_chunks++;
  return 0;
}

/* Raw mode: a chunk the library laid out in columns (bs_get_bucket_columns) appended to the
 * batch's as op b->n onwards, a bulk copy per column: the fields' bytes as they are into the
 * batch's Buffer, each field's byte offset moved by where the chunk's bytes start (a field ends
 * where the next starts), a type with its RAW_NULL bits; index.js decodes a field when it is
 * read. Against a bs_op per op copied field by field (bs_get_bucket_data): callgrind, raw reads
 * about 100 instructions an op less (bench/README.md). */
static int copy_columns(const bs_chunk_columns *c, void *payload) {
  work *w = payload;
  opbatch *b = w->bt;
  size_t n = c->n_ops, base = b->text.len, bytes = c->field[4 * n];
  uint32_t *offs, at = (uint32_t)base;
  int rc;
  if ((rc = keep_chunk(w, &c->bucket, c->after, c->next_after, c->has_more, c->target_op, n)))
    return rc;
  if (bytes > UINT32_MAX - base) return BS_ELIMIT;
  b->ids.len = 8 * b->n, b->types.len = b->n, b->sums.len = 4 * b->n; /* the ops laid out */
  b->offs.len = 16 * b->n;
  if (b->n + n > UINT32_MAX / 16 || !gb_room(&b->ids, 8 * n) || !gb_room(&b->types, n) ||
      !gb_room(&b->sums, 4 * n) || !gb_room(&b->offs, 16 * n + 4) || !gb_room(&b->text, bytes))
    return BS_ENOMEM;
  memcpy(b->ids.p + 8 * b->n, c->op_id, 8 * n);
  memcpy(b->sums.p + 4 * b->n, c->checksum, 4 * n);
  if (bytes) memcpy(b->text.p + base, c->bytes, bytes);
  for (size_t i = 0; i < n; i++)
    b->types.p[b->n + i] = (uint8_t)(c->type[i] | raw_nulls[c->type[i] & 7]);
  offs = (uint32_t *)(void *)b->offs.p + 4 * b->n;
  for (size_t f = 0; f < 4 * n; f++) offs[f] = c->field[f] + at;
  b->n += n, b->text.len = base + bytes;
  return 0;
}

/* Whether the n bytes at p are all ASCII: 32 at a time, then 8. */
static int all_ascii(const unsigned char *p, size_t n) {
  uint64_t acc = 0, x, y, z, u;
  size_t i = 0;
  for (; n - i >= 32; i += 32) {
    memcpy(&x, p + i, 8), memcpy(&y, p + i + 8, 8), memcpy(&z, p + i + 16, 8);
    memcpy(&u, p + i + 24, 8), acc |= x | y | z | u;
  }
  for (; n - i >= 8; i += 8) memcpy(&x, p + i, 8), acc |= x;
  for (; i < n; i++) acc |= p[i];
  return !(acc & 0x8080808080808080ull);
}

/* The default mode from a chunk in columns (bs_get_bucket_columns), as op b->n onwards. A chunk
 * whose fields are all ASCII (the common case: JSON rows, ids) is laid out in bulk: its bytes
 * copied into the text at once, checked at once, each field's UTF-16 offset its byte offset
 * moved by where the chunk starts; a field is FIELD_SAME when it equals the op before's, as
 * put_field says (its bytes stay in the text: the offsets still say where each field starts).
 * Another chunk goes field by field through put_field, as the fields of bs_ops did. */
static int copy_columns_text(const bs_chunk_columns *c, void *payload) {
  work *w = payload;
  opbatch *b = w->bt;
  size_t n = c->n_ops, bytes = c->field[4 * n];
  int rc;
  if ((rc = keep_chunk(w, &c->bucket, c->after, c->next_after, c->has_more, c->target_op, n)))
    return rc;
  b->ids.len = 8 * b->n, b->types.len = b->n, b->sums.len = 4 * b->n; /* the ops laid out */
  b->kinds.len = 4 * b->n, b->offs.len = 16 * b->n;
  if (b->n + n > UINT32_MAX / 16 || !gb_room(&b->ids, 8 * n) || !gb_room(&b->types, n) ||
      !gb_room(&b->sums, 4 * n) || !gb_room(&b->kinds, 4 * n) || !gb_room(&b->offs, 16 * n + 4))
    return BS_ENOMEM;
  memcpy(b->ids.p + 8 * b->n, c->op_id, 8 * n);
  memcpy(b->sums.p + 4 * b->n, c->checksum, 4 * n);
  memcpy(b->types.p + b->n, c->type, n);
  if (bytes <= TEXT_MAX - b->text.len && all_ascii(c->bytes, bytes)) {
    size_t tbase = b->text.len, ubase = b->units;
    unsigned char *kinds = b->kinds.p + 4 * b->n, *t;
    uint32_t *offs = (uint32_t *)(void *)b->offs.p + 4 * b->n;
    if (!(t = gb_room(&b->text, bytes))) return BS_ENOMEM;
    if (bytes) memcpy(t, c->bytes, bytes);
    for (size_t f = 0; f < 4 * n; f++) offs[f] = (uint32_t)(ubase + c->field[f]);
    for (size_t i = 0; i < n; i++) {
      const uint32_t *fi = c->field + 4 * i;
      unsigned type = c->type[i];
      unsigned char *k = kinds + 4 * i;
      if (text_cut(b, b->n + i, tbase + fi[0], ubase + fi[0])) return BS_ENOMEM;
      if (type == BS_OP_PUT || type == BS_OP_REMOVE) {
        /* only the object type is compared with the op before's (most ops of a bucket share
         * it, and it is short: a slice of it in JS would copy); an id, a subkey or a row
         * seldom repeats, and comparing them cost more than it saved (callgrind) */
        size_t at = tbase + fi[0], sz = fi[1] - fi[0];
        if (b->prev[0][1] == sz + 1 && same_bytes(b->text.p + b->prev[0][0], b->text.p + at, sz)) {
          k[0] = FIELD_SAME;
        } else {
          k[0] = FIELD_TEXT, b->prev[0][0] = at, b->prev[0][1] = sz + 1;
        }
        k[1] = k[2] = FIELD_TEXT;
        k[3] = type == BS_OP_PUT ? FIELD_TEXT : FIELD_NULL;
      } else { /* MOVE, CLEAR: no field */
        k[0] = k[1] = k[2] = k[3] = FIELD_NULL;
        b->prev[0][1] = 0;
      }
    }
    /* put_field compares every field with the op before's: these were not kept */
    b->prev[1][1] = b->prev[2][1] = b->prev[3][1] = 0;
    b->text.len += bytes, b->units += bytes, b->n += n;
    return 0;
  }
  for (size_t i = 0; i < n; i++, b->n++) {
    unsigned type = c->type[i];
    if (text_cut(b, b->n, b->text.len, b->units)) return BS_ENOMEM;
    for (int j = 0; j < 4; j++) {
      size_t f = 4 * i + (size_t)j;
      bs_val v = {NULL, 0};
      if (type == BS_OP_PUT || (type == BS_OP_REMOVE && j < 3))
        v = (bs_val){c->bytes ? c->bytes + c->field[f] : (const unsigned char *)"",
                     c->field[f + 1] - c->field[f]};
      if ((rc = put_field(w, b, j, &v))) return rc;
    }
  }
  return 0;
}

static void exec_bucket_data(work *w) {
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  int has_more = 0;
  o.limit = (size_t)w->u2, o.chunk_bytes = (size_t)w->u3;
  w->bt->raw_tail = &w->bt->raw, w->bt->chunks_tail = &w->bt->chunks;
  if (!w->i2) {
    if (!(w->bt->cuts = malloc(16 * sizeof *w->bt->cuts))) {
      w->rc = BS_ENOMEM;
      snprintf(w->err.msg, sizeof w->err.msg, "out of memory copying bucket data");
      return;
    }
    w->bt->cuts[0] = (textcut){0, 0, 0}, w->bt->n_cuts = 1, w->bt->cap_cuts = 16;
  }
  w->rc = w->i2 ? bs_get_bucket_columns(&has_more, w->n->u.st, w->u1, w->items, w->n_items, &o,
                                        copy_columns, w, &w->err)
                : bs_get_bucket_columns(&has_more, w->n->u.st, w->u1, w->items, w->n_items, &o,
                                        copy_columns_text, w, &w->err);
  if (w->rc == BS_ENOMEM && !w->err.msg[0])
    snprintf(w->err.msg, sizeof w->err.msg, "out of memory copying bucket data");
  if (w->rc == BS_ELIMIT && !w->err.msg[0])
    snprintf(w->err.msg, sizeof w->err.msg,
             "a raw batch's fields over 4 GiB: lower options.limit or chunkLimitBytes");
  w->i1 = has_more;
}

/* A typed array of the n elements of size each at data (copied into a new ArrayBuffer). */
static napi_value js_typed(napi_env env, napi_typedarray_type t, size_t size, size_t n,
                           const void *data) {
  napi_value ab, ta;
  void *p;
  if (napi_create_arraybuffer(env, n * size, &p, &ab) != napi_ok ||
      napi_create_typedarray(env, t, n, ab, 0, &ta) != napi_ok)
    return NULL;
  if (n) memcpy(p, data, n * size);
  return ta;
}

static void free_block(napi_env env, void *data, void *hint) {
  (void)env, (void)hint;
  free(data);
}

/* A typed array of the n elements of size each in g, whose block the array takes over (an
 * external ArrayBuffer: no copy), or copied where Node refuses external buffers. */
static napi_value js_typed_own(napi_env env, napi_typedarray_type t, size_t size, size_t n,
                               gbuf *g) {
  napi_value ab, ta;
  if (!n || napi_create_external_arraybuffer(env, g->p, n * size, free_block, NULL, &ab) != napi_ok)
    return js_typed(env, t, size, n, g->p);
  *g = (gbuf){0};
  return napi_create_typedarray(env, t, n, ab, 0, &ta) == napi_ok ? ta : NULL;
}

/* A Buffer of g's bytes, taking its block over as js_typed_own does. */
static napi_value js_buffer_own(napi_env env, gbuf *g) {
  napi_value v;
  void *copy;
  if (g->len && napi_create_external_buffer(env, g->len, g->p, free_block, NULL, &v) == napi_ok) {
    *g = (gbuf){0};
    return v;
  }
  return napi_create_buffer_copy(env, g->len, g->p, &copy, &v) == napi_ok ? v : NULL;
}

/* With a lent pool (bucket_data): column i as a typed array of n elements of size each over an
 * ArrayBuffer that also goes into pool[i] for the next call to lend: the lent one when the batch
 * fitted in it, else a new one of the column's capacity holding its bytes (V8's memory, which
 * index.js can transfer; an external buffer it cannot). */
static napi_value js_typed_pooled(napi_env env, opbatch *b, int i, napi_typedarray_type t,
                                  size_t size, size_t n, napi_value pool) {
  gbuf *g = column(b, i);
  napi_value lent, ab, ta;
  void *p;
  if (g->lent) {
    if (napi_get_reference_value(env, b->pool, &lent) != napi_ok ||
        napi_get_element(env, lent, (uint32_t)i, &ab) != napi_ok)
      return NULL;
  } else if (napi_create_arraybuffer(env, g->cap, &p, &ab) != napi_ok) {
    return NULL;
  } else if (n) {
    memcpy(p, g->p, n * size);
  }
  if (napi_set_element(env, pool, (uint32_t)i, ab) != napi_ok ||
      napi_create_typedarray(env, t, n, ab, 0, &ta) != napi_ok)
    return NULL;
  return ta;
}

/* Column i as a typed array: pooled when the call lent a pool, else taking the block over. */
static napi_value js_column(napi_env env, opbatch *b, int i, napi_typedarray_type t, size_t size,
                            size_t n, napi_value pool) {
  return pool ? js_typed_pooled(env, b, i, t, size, n, pool)
              : js_typed_own(env, t, size, n, column(b, i));
}

/* The default mode's text as its pieces (opbatch's cuts): an array of strings, one a piece,
 * and *cuts_out a Uint32Array of [op, unit] for each piece (the op and UTF-16 unit it starts
 * at), then [ops, units] of the whole. */
static napi_value js_text_pieces(napi_env env, opbatch *b, napi_value *cuts_out) {
  napi_value texts, ab, s;
  uint32_t *cu;
  if (napi_create_array_with_length(env, b->n_cuts, &texts) != napi_ok ||
      napi_create_arraybuffer(env, 8 * (b->n_cuts + 1), (void **)&cu, &ab) != napi_ok ||
      napi_create_typedarray(env, napi_uint32_array, 2 * (b->n_cuts + 1), ab, 0, cuts_out) !=
          napi_ok)
    return NULL;
  for (size_t p = 0; p < b->n_cuts; p++) {
    const textcut *c = &b->cuts[p];
    size_t to = p + 1 < b->n_cuts ? b->cuts[p + 1].byte : b->text.len;
    const char *t = (const char *)b->text.p + c->byte;
    /* latin1 when the whole batch is ASCII (units == bytes): no UTF-8 decoding */
    if ((b->units == b->text.len ? napi_create_string_latin1(env, t, to - c->byte, &s)
                                 : napi_create_string_utf8(env, t, to - c->byte, &s)) != napi_ok ||
        napi_set_element(env, texts, (uint32_t)p, s) != napi_ok)
      return NULL;
    cu[2 * p] = (uint32_t)c->op, cu[2 * p + 1] = (uint32_t)c->unit;
  }
  cu[2 * b->n_cuts] = (uint32_t)b->n, cu[2 * b->n_cuts + 1] = (uint32_t)b->units;
  return texts;
}

/* A batch in columns, from which index.js builds the OplogEntry objects (object literals of one
 * shape are much cheaper to make in JS than property by property through Node-API):
 * {hasMore, ids: BigUint64Array, types: Uint8Array, sums: Uint32Array, texts, cuts,
 *  kinds: Uint8Array, offs: Uint32Array, raw: [], chunks: [{bucket, after, next_after,
 *  has_more, targetOp, n}]} with the ops of all chunks in order; field f (object_type,
 * object_id, subkey, data of op f/4) is the UTF-16 units [offs[f], offs[f + 1]) of the text,
 * null, raw[f] or field f - 4 as kinds[f] says; the text is in pieces (js_text_pieces): op k's
 * fields are in texts[p] for the piece p whose ops hold k, from its unit cuts[2p + 1] on. In raw
 * mode text is a Buffer of every field's bytes, offs are byte offsets into it, kinds is empty
 * and a type's bits above the fourth say which fields are null (raw_nulls).
 * When the call lent a pool: pool, the ArrayBuffers under the columns and the text's bytes (in
 * raw mode text is then a Uint8Array over the last), for the next call to lend. */
static napi_value done_bucket_data(napi_env env, work *w) {
  opbatch *b = w->bt;
  napi_value chunks, res = js_obj(env), ids, types, sums, text, kinds, offs, raw, pool = NULL;
  napi_value cuts = NULL;
  uint32_t ci = 0, end = (uint32_t)(w->i2 ? b->text.len : b->units);
  size_t n = b->n;
  b->offs.len = 16 * n;
  if (!gb_room(&b->offs, 4) || !gb_room(&b->text, 1)) {
    NOMEM();
    return NULL;
  }
  memcpy(b->offs.p + 16 * n, &end, 4);
  if ((b->pool && napi_create_array_with_length(env, N_COLUMNS, &pool) != napi_ok) ||
      !(ids = js_column(env, b, 0, napi_biguint64_array, 8, n, pool)) ||
      !(types = js_column(env, b, 1, napi_uint8_array, 1, n, pool)) ||
      !(sums = js_column(env, b, 2, napi_uint32_array, 4, n, pool)) ||
      !(kinds = js_column(env, b, 3, napi_uint8_array, 1, w->i2 ? 0 : 4 * n, pool)) ||
      !(offs = js_column(env, b, 4, napi_uint32_array, 4, 4 * n + 1, pool)) ||
      napi_create_array(env, &raw) != napi_ok ||
      napi_create_array_with_length(env, b->n_chunks, &chunks) != napi_ok)
    return NULL;
  if (w->i2) {
    if (!(text = pool ? js_typed_pooled(env, b, 5, napi_uint8_array, 1, b->text.len, pool)
                      : js_buffer_own(env, &b->text)))
      return NULL;
  } else if (pool && !js_typed_pooled(env, b, 5, napi_uint8_array, 1, b->text.len, pool)) {
    return NULL;
  } else if (!(text = js_text_pieces(env, b, &cuts))) {
    return NULL;
  }
  for (rawfield *r = b->raw; r; r = r->next)
    if (napi_set_element(env, raw, r->f, js_str(env, r->v)) != napi_ok) return NULL;
  for (cchunk *cc = b->chunks; cc; cc = cc->next) {
    const bs_chunk *c = &cc->c;
    napi_value ch = js_obj(env);
    set(env, ch, "bucket", js_str(env, c->bucket));
    set(env, ch, "after", js_u64(env, c->after));
    set(env, ch, "next_after", js_u64(env, c->next_after));
    set(env, ch, "has_more", js_bool(env, c->has_more));
    set(env, ch, "targetOp", c->target_op ? js_u64(env, c->target_op) : js_null(env));
    set(env, ch, "n", js_num(env, (double)c->n_ops));
    napi_set_element(env, chunks, ci++, ch);
  }
  set(env, res, "hasMore", js_bool(env, w->i1));
  set(env, res, "ids", ids);
  set(env, res, "types", types);
  set(env, res, "sums", sums);
  set(env, res, w->i2 ? "text" : "texts", text);
  if (!w->i2) set(env, res, "cuts", cuts);
  set(env, res, "kinds", kinds);
  set(env, res, "offs", offs);
  set(env, res, "raw", raw);
  set(env, res, "chunks", chunks);
  if (pool) set(env, res, "pool", pool);
  return res;
}

/* Lends the worker the ArrayBuffers of pool (an array; see done_bucket_data) to write the batch
 * into, instead of new memory for every call: nothing else refers to them (index.js took them
 * out of its pool and detached what the user held), and the array held keeps them alive. */
static int lend_pool(napi_env env, opbatch *b, napi_value pool) {
  uint32_t n;
  if (get_array(env, pool, "pool", &n) || napi_create_reference(env, pool, 1, &b->pool) != napi_ok)
    return -1;
  for (uint32_t i = 0; i < n && i < N_COLUMNS; i++) {
    gbuf *g = column(b, (int)i);
    napi_value ab;
    bool is_ab = false;
    void *p = NULL;
    size_t len = 0;
    if (napi_get_element(env, pool, i, &ab) != napi_ok ||
        napi_is_arraybuffer(env, ab, &is_ab) != napi_ok ||
        (is_ab && napi_get_arraybuffer_info(env, ab, &p, &len) != napi_ok))
      return -1;
    if (p && len) *g = (gbuf){.p = p, .cap = len, .lent = 1};
  }
  return 0;
}

/* The call of bucketData and bucketDataSync from their arguments, or NULL with an exception. */
static work *bucket_data_args(napi_env env, napi_callback_info info) {
  ARGS(6);
  napi_value v;
  uint32_t n_req;
  bs_bucket_request *req;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  w->n = n; /* no ref: bucket_data's work_start takes one; bucketDataSync returns first */
  if (get_u64(env, argv[1], "checkpoint", &w->u1) || get_array(env, argv[2], "dataBuckets", &n_req))
    FAIL_WORK(w);
  if (!(req = ar_alloc(&w->ar, (n_req ? n_req : 1) * sizeof *req))) {
    NOMEM();
    FAIL_WORK(w);
  }
  for (uint32_t i = 0; i < n_req; i++) {
    napi_value e, f;
    char nm[64];
    if (napi_get_element(env, argv[2], i, &e) != napi_ok) FAIL_WORK(w);
    snprintf(nm, sizeof nm, "dataBuckets[%u].bucket", i);
    if (get_prop(env, e, "bucket", &f) || get_bytes(env, &w->ar, f, nm, &req[i].bucket))
      FAIL_WORK(w);
    snprintf(nm, sizeof nm, "dataBuckets[%u].start", i);
    req[i].after = 0;
    if (get_prop(env, e, "start", &f) || get_opt_u64(env, f, nm, &req[i].after)) FAIL_WORK(w);
  }
  w->items = req, w->n_items = n_req;
  /* an absent option takes the default; an explicit one is honoured (limit 0 is BS_EINVAL,
   * chunkLimitBytes 0 is one op per chunk) */
  w->u2 = BS_BATCH_LIMIT_DEFAULT, w->u3 = BS_CHUNK_BYTES_DEFAULT;
  if (get_prop(env, argv[3], "limit", &v) || get_opt_u64(env, v, "options.limit", &w->u2) ||
      get_prop(env, argv[3], "chunkLimitBytes", &v) ||
      get_opt_u64(env, v, "options.chunkLimitBytes", &w->u3) ||
      get_bool(env, argv[4], "raw", &w->i2))
    FAIL_WORK(w);
  if (!(w->bt = ar_alloc(&w->ar, sizeof *w->bt))) {
    NOMEM();
    FAIL_WORK(w);
  }
  memset(w->bt, 0, sizeof *w->bt);
  if (argv[5] && lend_pool(env, w->bt, argv[5])) FAIL_WORK(w);
  return w;
}

/* bucketData(storage, checkpoint, [{bucket, start}], {limit, chunkLimitBytes}, raw, pool) */
static napi_value bucket_data(napi_env env, napi_callback_info info) {
  work *w = bucket_data_args(env, info);
  return w ? work_start(env, w, w->n, exec_bucket_data, done_bucket_data) : NULL;
}

/* bucketDataSync: the same read on the calling (main) thread, its batch returned or its error
 * thrown: no hop to the thread pool and back, and JS reads the columns while the cache holds
 * them (bench/README.md). The handle cannot be released meanwhile: that happens on this thread. */
static napi_value bucket_data_sync(napi_env env, napi_callback_info info) {
  work *w = bucket_data_args(env, info);
  napi_value v = NULL;
  if (!w) return NULL;
  exec_bucket_data(w);
  if (w->rc != BS_OK)
    napi_throw(env, make_error(env, w->rc, &w->err));
  else
    v = done_bucket_data(env, w);
  work_free(env, w);
  return v;
}

static void exec_checksums(work *w) {
  w->rc = bs_get_checksums(w->out, w->n->u.st, w->u1, w->items, w->n_items, &w->err);
}

/* [checksum (signed 32-bit, as the service and the driver), count, ...] in request order */
static napi_value done_checksums(napi_env env, work *w) {
  napi_value arr;
  const bs_checksum *cs = w->out;
  napi_create_array_with_length(env, w->n_items * 2, &arr);
  for (size_t i = 0; i < w->n_items; i++) {
    napi_set_element(env, arr, (uint32_t)(2 * i), js_num(env, (int32_t)cs[i].checksum));
    napi_set_element(env, arr, (uint32_t)(2 * i + 1), js_num(env, (double)cs[i].count));
  }
  return arr;
}

/* Copies an array of byte strings into w->items (bs_val[n]). */
static int get_val_array(napi_env env, work *w, napi_value arr, const char *name) {
  uint32_t n;
  bs_val *vals;
  char nm[96];
  if (get_array(env, arr, name, &n)) return -1;
  if (!(vals = ar_alloc(&w->ar, (n ? n : 1) * sizeof *vals))) return NOMEM();
  for (uint32_t i = 0; i < n; i++) {
    napi_value e;
    NAPI(napi_get_element(env, arr, i, &e));
    snprintf(nm, sizeof nm, "%s[%u]", name, i);
    if (get_bytes(env, &w->ar, e, nm, &vals[i])) return -1;
  }
  w->items = vals, w->n_items = n;
  return 0;
}

/* checksums(storage, checkpoint, [bucket]) */
static napi_value get_checksums(napi_env env, napi_callback_info info) {
  ARGS(3);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (get_u64(env, argv[1], "checkpoint", &w->u1) || get_val_array(env, w, argv[2], "buckets"))
    FAIL_WORK(w);
  if (!(w->out = ar_alloc(&w->ar, (w->n_items ? w->n_items : 1) * sizeof(bs_checksum)))) {
    NOMEM();
    FAIL_WORK(w);
  }
  return work_start(env, w, n, exec_checksums, done_checksums);
}

typedef struct vitem {
  struct vitem *next;
  bs_val v;
} vitem;

static int push_val(work *w, bs_val v) {
  vitem *it = ar_alloc(&w->ar, sizeof *it);
  if (!it || ar_dup(&w->ar, &it->v, v.data ? v.data : empty_bytes, v.size)) return BS_ENOMEM;
  it->next = NULL;
  *w->list_tail = it;
  w->list_tail = (void **)&it->next;
  w->list_n++;
  return 0;
}

static int collect_param(const bs_val *params, void *payload) {
  return push_val(payload, *params);
}

static void exec_parameter_sets(work *w) {
  w->list_tail = &w->list;
  w->rc = bs_get_parameter_sets(w->n->u.st, w->u1, w->items, w->n_items, (size_t)w->u2,
                                collect_param, w, &w->err);
}

static napi_value js_list(napi_env env, vitem *it, size_t n) {
  napi_value arr;
  uint32_t i = 0;
  napi_create_array_with_length(env, n, &arr);
  for (; it; it = it->next) napi_set_element(env, arr, i++, js_str(env, it->v));
  return arr;
}

static napi_value done_parameter_sets(napi_env env, work *w) {
  return js_list(env, w->list, w->list_n);
}

/* parameterSets(storage, checkpoint, [lookup], limit) -> [JSON text] */
static napi_value get_parameter_sets(napi_env env, napi_callback_info info) {
  ARGS(4);
  uint32_t n_l;
  bs_val *keys;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  w->u2 = BS_PARAM_LIMIT_DEFAULT; /* an absent limit: the default; 0 allows no row */
  if (get_u64(env, argv[1], "checkpoint", &w->u1) || get_array(env, argv[2], "lookups", &n_l) ||
      get_opt_u64(env, argv[3], "limit", &w->u2))
    FAIL_WORK(w);
  if (!(keys = ar_alloc(&w->ar, (n_l ? n_l : 1) * sizeof *keys))) {
    NOMEM();
    FAIL_WORK(w);
  }
  for (uint32_t i = 0; i < n_l; i++) {
    napi_value e;
    char nm[48];
    snprintf(nm, sizeof nm, "lookups[%u]", i);
    if (napi_get_element(env, argv[2], i, &e) != napi_ok ||
        get_lookup(env, &w->ar, e, nm, &keys[i]))
      FAIL_WORK(w);
  }
  w->items = keys, w->n_items = n_l;
  return work_start(env, w, n, exec_parameter_sets, done_parameter_sets);
}

/* Checkpoint changes: three lists (buckets, encoded lookups, users) and two flags. */
typedef struct changes_out {
  vitem *lists[3];
  size_t n[3];
} changes_out;

static int collect_changes(const bs_checkpoint_changes *c, void *payload) {
  work *w = payload;
  changes_out *o = w->out;
  const bs_val *arrs[3] = {c->updated_buckets, c->updated_lookups,
                           c->updated_write_checkpoint_users};
  size_t ns[3] = {c->n_updated_buckets, c->n_updated_lookups, c->n_updated_write_checkpoint_users};
  w->i1 = c->invalidate_data_buckets, w->i2 = c->invalidate_parameter_buckets;
  for (int k = 0; k < 3; k++) {
    w->list = NULL, w->list_tail = &w->list, w->list_n = 0;
    for (size_t i = 0; i < ns[k]; i++)
      if (push_val(w, arrs[k][i])) return BS_ENOMEM;
    o->lists[k] = w->list, o->n[k] = w->list_n;
  }
  return 0;
}

static void exec_changes(work *w) {
  w->rc = bs_get_checkpoint_changes(w->n->u.st, w->u1, w->u2, collect_changes, w, &w->err);
}

/* A decoded lookup key as an array of JS values (integers beyond 2^53 as bigint). */
static napi_value js_lookup(napi_env env, bs_val key) {
  bs_scalar sc[64], *vals = sc;
  size_t n = 0;
  napi_value arr;
  int rc = bs_lookup_decode(sc, 64, &n, key, NULL);
  if (rc == BS_ETOOBIG && (vals = malloc(n * sizeof *vals)))
    rc = bs_lookup_decode(vals, n, &n, key, NULL);
  if (rc != BS_OK) {
    if (vals && vals != sc) free(vals);
    return js_null(env);
  }
  napi_create_array_with_length(env, n, &arr);
  for (size_t i = 0; i < n; i++) {
    napi_value v;
    switch (vals[i].type) {
    case BS_SCALAR_FALSE:
    case BS_SCALAR_TRUE:
      v = js_bool(env, vals[i].type == BS_SCALAR_TRUE);
      break;
    case BS_SCALAR_INT:
      if (vals[i].i >= -(int64_t)MAX_SAFE_INT && vals[i].i <= (int64_t)MAX_SAFE_INT)
        v = js_num(env, (double)vals[i].i);
      else
        napi_create_bigint_int64(env, vals[i].i, &v);
      break;
    case BS_SCALAR_DOUBLE:
      v = js_num(env, vals[i].d);
      break;
    case BS_SCALAR_STRING:
      v = js_str(env, vals[i].s.data ? vals[i].s : (bs_val){empty_bytes, 0});
      break;
    default:
      v = js_null(env);
    }
    napi_set_element(env, arr, (uint32_t)i, v);
  }
  if (vals != sc) free(vals);
  return arr;
}

static napi_value done_changes(napi_env env, work *w) {
  changes_out *o = w->out;
  napi_value res = js_obj(env), lookups;
  uint32_t i = 0;
  set(env, res, "updatedDataBuckets", js_list(env, o->lists[0], o->n[0]));
  set(env, res, "invalidateDataBuckets", js_bool(env, w->i1));
  napi_create_array_with_length(env, o->n[1], &lookups);
  for (vitem *it = o->lists[1]; it; it = it->next)
    napi_set_element(env, lookups, i++, js_lookup(env, it->v));
  set(env, res, "updatedParameterLookups", lookups);
  set(env, res, "invalidateParameterBuckets", js_bool(env, w->i2));
  set(env, res, "updatedWriteCheckpointUsers", js_list(env, o->lists[2], o->n[2]));
  return res;
}

/* checkpointChanges(storage, from, to) */
static napi_value get_checkpoint_changes(napi_env env, napi_callback_info info) {
  ARGS(3);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (get_u64(env, argv[1], "lastCheckpoint", &w->u1) ||
      get_u64(env, argv[2], "nextCheckpoint", &w->u2))
    FAIL_WORK(w);
  if (!(w->out = ar_alloc(&w->ar, sizeof(changes_out)))) {
    NOMEM();
    FAIL_WORK(w);
  }
  memset(w->out, 0, sizeof(changes_out));
  return work_start(env, w, n, exec_changes, done_changes);
}

/* ---- Compaction ------------------------------------------------------------------------------ */

static int compact_progress(const bs_compact_stats *so_far, void *payload) {
  progress_ctx *pc = payload;
  pc->stats = *so_far;
  return progress_step(pc);
}

static void exec_compact(work *w) {
  w->rc = bs_compact(&w->r.stats, w->n->u.st, &w->co, &w->err);
}

static napi_value done_compact(napi_env env, work *w) {
  return js_stats(env, &w->r.stats);
}

static napi_value js_stats(napi_env env, const bs_compact_stats *s) {
  napi_value o = js_obj(env);
  set(env, o, "bucketsCompacted", js_num(env, (double)s->buckets_compacted));
  set(env, o, "opsMoved", js_num(env, (double)s->ops_moved));
  set(env, o, "opsCleared", js_num(env, (double)s->ops_cleared));
  set(env, o, "opsRemoved", js_num(env, (double)s->ops_removed));
  set(env, o, "bytesBefore", js_num(env, (double)s->bytes_before));
  set(env, o, "bytesAfter", js_num(env, (double)s->bytes_after));
  set(env, o, "parameterEntriesRemoved", js_num(env, (double)s->parameter_entries_removed));
  set(env, o, "checkpointRequestsDeleted", js_num(env, (double)s->checkpoint_requests_deleted));
  set(env, o, "opsReemitted", js_num(env, (double)s->ops_reemitted));
  return o;
}

/* compact(storage, options, cancelFlag: Int32Array over a SharedArrayBuffer | undefined) */
static napi_value compact(napi_env env, napi_callback_info info) {
  ARGS(3);
  napi_value v, o;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  o = argv[1];
  w->co = (bs_compact_options)BS_COMPACT_OPTIONS_INIT;
  if (get_prop(env, o, "maxOpId", &v) || get_opt_u64(env, v, "options.maxOpId", &w->co.max_op_id) ||
      get_prop(env, o, "minBucketChanges", &v) ||
      get_opt_u64(env, v, "options.minBucketChanges", &w->co.min_bucket_changes) ||
      get_prop(env, o, "memoryLimitMB", &v) ||
      (v && get_size(env, v, "options.memoryLimitMB", &w->co.memory_limit_mb)) ||
      get_prop(env, o, "incrementalOnly", &v) ||
      get_bool(env, v, "options.incrementalOnly", &w->co.incremental_only) ||
      get_prop(env, o, "compactParameterData", &v) ||
      get_bool(env, v, "options.compactParameterData", &w->co.compact_parameters) ||
      get_prop(env, o, "maxOpsPerTransaction", &v) ||
      (v && get_size(env, v, "options.maxOpsPerTransaction", &w->co.max_ops_per_txn)) ||
      get_prop(env, o, "opBudget", &v) || get_opt_u64(env, v, "options.opBudget", &w->co.op_budget))
    FAIL_WORK(w);
  if (get_prop(env, o, "minChangeRatio", &v) ||
      (v && get_double(env, v, "options.minChangeRatio", &w->co.min_change_ratio)) ||
      get_prop(env, o, "defragmentRatio", &v) ||
      (v && get_double(env, v, "options.defragmentRatio", &w->co.defragment_ratio)))
    FAIL_WORK(w);
  if (get_prop(env, o, "minAgeMs", &v) ||
      (v && get_ms(env, v, "options.minAgeMs", 0, &w->co.min_age_ms)))
    FAIL_WORK(w);
  /* 0 would read as "no cleanup" in C: a time at the epoch itself is refused instead */
  if (get_prop(env, o, "deleteCheckpointRequestsBefore", &v) ||
      (v && get_ms(env, v, "options.deleteCheckpointRequestsBefore", 1,
                   &w->co.delete_checkpoint_requests_before_ms)) ||
      (v && w->co.delete_checkpoint_requests_before_ms < 1 &&
       throw_range(env, "options.deleteCheckpointRequestsBefore", "at or before the epoch")))
    FAIL_WORK(w);
  if (get_prop(env, o, "compactBuckets", &v)) FAIL_WORK(w);
  if (v) {
    if (get_val_array(env, w, v, "options.compactBuckets")) FAIL_WORK(w);
    w->co.buckets = w->items, w->co.n_buckets = w->n_items;
  }
  if (get_prop(env, o, "onProgress", &v) || progress_new(env, v, argv[2], 0, &w->pc)) FAIL_WORK(w);
  w->co.progress = compact_progress, w->co.progress_payload = w->pc;
  return work_start(env, w, n, exec_compact, done_compact);
}

static void exec_compact_initial(work *w) {
  w->rc = bs_compact_initial_replication(&w->u3, w->n->u.st, w->u1, w->u2, &w->err);
}

static napi_value done_compact_initial(napi_env env, work *w) {
  napi_value o = js_obj(env);
  set(env, o, "buckets", js_num(env, (double)w->u3));
  return o;
}

/* compactInitialReplication(storage, {maxOpId, minBucketChanges}) -> {buckets} */
static napi_value compact_initial(napi_env env, napi_callback_info info) {
  ARGS(2);
  napi_value v;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (get_prop(env, argv[1], "maxOpId", &v) || get_opt_u64(env, v, "options.maxOpId", &w->u1) ||
      get_prop(env, argv[1], "minBucketChanges", &v) ||
      get_opt_u64(env, v, "options.minBucketChanges", &w->u2))
    FAIL_WORK(w);
  return work_start(env, w, n, exec_compact_initial, done_compact_initial);
}

/* ---- Write checkpoints ----------------------------------------------------------------------- */

/* setWriteCheckpointMode(storage, mode, eventName): in-memory, synchronous. */
static napi_value set_wcp_mode(napi_env env, napi_callback_info info) {
  ARGS(3);
  arena a = {0};
  bs_val mode, event = {0};
  bs_error err = {0};
  int rc = BS_OK, m = -1;
  node *n = get_node(env, argv[0], K_STORAGE);
  napi_value u = NULL;
  if (!n) return NULL;
  if (get_bytes(env, &a, argv[1], "mode", &mode) ||
      get_opt_bytes(env, &a, argv[2], "eventName", &event))
    goto out;
  if (mode.size == 7 && !memcmp(mode.data, "managed", 7)) m = BS_WCP_MANAGED;
  if (mode.size == 6 && !memcmp(mode.data, "custom", 6)) m = BS_WCP_CUSTOM;
  if (m < 0) {
    throw_range(env, "mode", "expected 'managed' or 'custom'");
    goto out;
  }
  if ((rc = bs_set_write_checkpoint_mode(n->u.st, (bs_write_checkpoint_mode)m, event, &err)))
    napi_throw(env, make_error(env, rc, &err));
  else
    napi_get_undefined(env, &u);
out:
  ar_free(&a);
  return u;
}

static int get_heads(napi_env env, arena *a, napi_value obj, const char *name, const bs_head **out,
                     size_t *n_out) {
  napi_value keys;
  uint32_t n;
  bs_head *h;
  char nm[96];
  napi_valuetype t;
  *out = NULL, *n_out = 0;
  if (obj == NULL) return 0;
  if (type_of(env, obj, &t)) return -1;
  if (t != napi_object) return throw_rc(env, BS_EINVAL, "%s: expected an object", name);
  NAPI(napi_get_property_names(env, obj, &keys));
  NAPI(napi_get_array_length(env, keys, &n));
  if (!(h = ar_alloc(a, (n ? n : 1) * sizeof *h))) return NOMEM();
  for (uint32_t i = 0; i < n; i++) {
    napi_value k, v;
    NAPI(napi_get_element(env, keys, i, &k));
    NAPI(napi_get_property(env, obj, k, &v));
    snprintf(nm, sizeof nm, "%s key %u", name, i);
    if (get_bytes(env, a, k, nm, &h[i].connection)) return -1;
    snprintf(nm, sizeof nm, "%s[%u]", name, i);
    if (get_bytes(env, a, v, nm, &h[i].lsn)) return -1;
  }
  *out = h, *n_out = n;
  return 0;
}

static void exec_create_managed(work *w) {
  w->rc = bs_create_managed_write_checkpoints(w->out, &w->i1, w->n->u.st, w->items, w->n_items,
                                              &w->err);
}

static napi_value done_create_managed(napi_env env, work *w) {
  napi_value o = js_obj(env), ids;
  const uint64_t *id = w->out;
  napi_create_array_with_length(env, w->n_items, &ids);
  for (size_t i = 0; i < w->n_items; i++)
    napi_set_element(env, ids, (uint32_t)i, js_u64(env, id[i]));
  set(env, o, "ids", ids);
  set(env, o, "shouldAdvance", js_bool(env, w->i1));
  return o;
}

/* createManagedWriteCheckpoints(storage, [{user_id, heads, checkpoint_request_id,
 * checkpoint_requested_at}]) */
static napi_value create_managed(napi_env env, napi_callback_info info) {
  ARGS(2);
  uint32_t n_req;
  bs_managed_request *req;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (get_array(env, argv[1], "checkpoints", &n_req)) FAIL_WORK(w);
  req = ar_alloc(&w->ar, (n_req ? n_req : 1) * sizeof *req);
  w->out = ar_alloc(&w->ar, (n_req ? n_req : 1) * sizeof(uint64_t));
  if (!req || !w->out) {
    NOMEM();
    FAIL_WORK(w);
  }
  for (uint32_t i = 0; i < n_req; i++) {
    napi_value e, f;
    char nm[64];
    memset(&req[i], 0, sizeof req[i]);
    if (napi_get_element(env, argv[1], i, &e) != napi_ok) FAIL_WORK(w);
    snprintf(nm, sizeof nm, "checkpoints[%u].user_id", i);
    if (get_prop(env, e, "user_id", &f) || get_bytes(env, &w->ar, f, nm, &req[i].user_id))
      FAIL_WORK(w);
    snprintf(nm, sizeof nm, "checkpoints[%u].heads", i);
    if (get_prop(env, e, "heads", &f) ||
        get_heads(env, &w->ar, f, nm, &req[i].heads, &req[i].n_heads))
      FAIL_WORK(w);
    snprintf(nm, sizeof nm, "checkpoints[%u].checkpoint_request_id", i);
    if (get_prop(env, e, "checkpoint_request_id", &f) ||
        (f && get_u64(env, f, nm, &req[i].request_id)))
      FAIL_WORK(w);
    req[i].has_request_id = f != NULL;
    /* 0 would read as "now" in C: a request at the epoch itself is refused instead */
    snprintf(nm, sizeof nm, "checkpoints[%u].checkpoint_requested_at", i);
    if (get_prop(env, e, "checkpoint_requested_at", &f) ||
        (f && get_ms(env, f, nm, 1, &req[i].requested_at_ms)) ||
        (f && req[i].requested_at_ms < 1 && throw_range(env, nm, "at or before the epoch")))
      FAIL_WORK(w);
  }
  w->items = req, w->n_items = n_req;
  return work_start(env, w, n, exec_create_managed, done_create_managed);
}

static void exec_last_wcp(work *w) {
  w->rc = bs_last_write_checkpoint(&w->u1, &w->i1, w->n->u.st, w->a, w->items, w->n_items, &w->err);
}

static napi_value done_last_wcp(napi_env env, work *w) {
  return w->i1 ? js_u64(env, w->u1) : js_null(env);
}

/* lastWriteCheckpoint(storage, {user_id, heads}) -> bigint | null */
static napi_value last_wcp(napi_env env, napi_callback_info info) {
  ARGS(2);
  napi_value v;
  const bs_head *heads;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (get_prop(env, argv[1], "user_id", &v) ||
      get_bytes(env, &w->ar, v, "filters.user_id", &w->a) || get_prop(env, argv[1], "heads", &v) ||
      get_heads(env, &w->ar, v, "filters.heads", &heads, &w->n_items))
    FAIL_WORK(w);
  w->items = (void *)heads;
  return work_start(env, w, n, exec_last_wcp, done_last_wcp);
}

static void exec_delete_requests(work *w) {
  w->rc = bs_delete_checkpoint_requests_before(&w->u1, w->n->u.st, (int64_t)w->u2, &w->err);
}

static napi_value done_u64_num(napi_env env, work *w) {
  return js_num(env, (double)w->u1);
}

/* deleteCheckpointRequestsBefore(storage, ms) -> number deleted */
static napi_value delete_requests(napi_env env, napi_callback_info info) {
  ARGS(2);
  int64_t ms;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  if (!argv[1]) {
    throw_rc(env, BS_EINVAL, "before: missing (expected a Date or milliseconds)");
    FAIL_WORK(w);
  }
  if (get_ms(env, argv[1], "before", 1, &ms)) FAIL_WORK(w);
  w->u2 = (uint64_t)ms;
  return work_start(env, w, n, exec_delete_requests, done_u64_num);
}

/* ---- Lifecycle ------------------------------------------------------------------------------- */

static void exec_status(work *w) {
  w->rc = bs_get_status(&w->r.status, w->n->u.st, &w->err);
}

static napi_value done_status(napi_env env, work *w) {
  const bs_status *s = &w->r.status;
  napi_value o = js_obj(env);
  set(env, o, "state", js_state(env, s->state));
  set(env, o, "resumeLsn", js_lsn(env, s->has_resume_lsn, s->resume_lsn, s->resume_lsn_size));
  set(env, o, "snapshotDone", js_bool(env, s->snapshot_done));
  set(env, o, "checkpoint", js_u64(env, s->checkpoint));
  set(env, o, "lsn", js_lsn(env, s->has_lsn, s->lsn, s->lsn_size));
  set(env, o, "lastPersistedOp", js_u64(env, s->last_persisted_op));
  /* null when none (storage.h's ""), as docs/bindings.md says; else always a string: the
   * library cuts a message at 255 bytes, maybe inside a character, which V8's UTF-8 decoding
   * makes U+FFFD, as Python's decode("utf-8", "replace") does (js_str would give a Buffer) */
  if (s->last_error[0]) {
    napi_value e;
    if (napi_create_string_utf8(env, s->last_error, strlen(s->last_error), &e) != napi_ok)
      return NULL;
    set(env, o, "lastError", e);
  } else {
    set(env, o, "lastError", js_null(env));
  }
  return o;
}

static napi_value get_status(napi_env env, napi_callback_info info) {
  ARGS(1);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  return n ? work_start(env, w, n, exec_status, done_status) : NULL;
}

static void exec_lifecycle(work *w) {
  if (w->i1 == 0)
    w->rc = bs_clear(w->n->u.st, &w->err);
  else if (w->i1 == 1)
    w->rc = bs_terminate(w->n->u.st, w->i2, &w->err);
  else
    w->rc = bs_report_error(w->n->u.st, w->a.data, &w->err);
}

static napi_value done_undefined(napi_env env, work *w) {
  napi_value u;
  napi_get_undefined(env, &u);
  return u;
}

static napi_value lifecycle(napi_env env, napi_callback_info info, int what) {
  ARGS(2);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  w->i1 = what;
  if (what == 1 && get_bool(env, argv[1], "clearStorage", &w->i2)) FAIL_WORK(w);
  if (what == 2) {
    bs_val m;
    if (get_bytes(env, &w->ar, argv[1], "message", &m) || ar_dup(&w->ar, &w->a, m.data, m.size + 1))
      FAIL_WORK(w);
    ((char *)w->a.data)[m.size] = 0; /* a NUL inside ends the message early: harmless */
  }
  return work_start(env, w, n, exec_lifecycle, done_undefined);
}

static napi_value storage_clear(napi_env env, napi_callback_info info) {
  return lifecycle(env, info, 0);
}
static napi_value storage_terminate(napi_env env, napi_callback_info info) {
  return lifecycle(env, info, 1);
}
static napi_value storage_report_error(napi_env env, napi_callback_info info) {
  return lifecycle(env, info, 2);
}

/* ---- Pure helpers ---------------------------------------------------------------------------- */

/* checksumPut('xxh3' | 'sha256', objectType, objectId, data) -> op checksum (unsigned) */
static napi_value checksum_put(napi_env env, napi_callback_info info) {
  ARGS(4);
  arena a = {0};
  bs_val h, t, id, d;
  napi_value r = NULL;
  if (!get_bytes(env, &a, argv[0], "hash", &h) && !get_bytes(env, &a, argv[1], "objectType", &t) &&
      !get_bytes(env, &a, argv[2], "objectId", &id) && !get_json(env, &a, argv[3], "data", &d)) {
    int sha = h.size == 6 && !memcmp(h.data, "sha256", 6);
    if (!sha && !(h.size == 4 && !memcmp(h.data, "xxh3", 4)))
      throw_range(env, "hash", "expected 'xxh3' or 'sha256'");
    else
      r = js_num(env, bs_checksum_put(sha ? BS_HASH_SHA256 : BS_HASH_XXH3, t, id, d));
  }
  ar_free(&a);
  return r;
}

/* liveHandles() -> database, storage and writer objects not yet released (a leak check). */
static napi_value js_live_handles(napi_env env, napi_callback_info info) {
  return js_num(env, (double)live_handles);
}

/* ---- Module ---------------------------------------------------------------------------------- */

/* ---- Stat, verify, buckets, waiting --------------------------------------------------------- */

static void exec_stat(work *w) {
  w->rc = bs_db_stat(&w->r.stat, w->n->u.db, &w->err);
}

static napi_value done_stat(napi_env env, work *w) {
  const bs_stat *s = &w->r.stat;
  napi_value o = js_obj(env);
  set(env, o, "streams", js_num(env, (double)s->streams));
  set(env, o, "buckets", js_num(env, (double)s->buckets));
  set(env, o, "opsPut", js_num(env, (double)s->ops_put));
  set(env, o, "opsRemove", js_num(env, (double)s->ops_remove));
  set(env, o, "opsMove", js_num(env, (double)s->ops_move));
  set(env, o, "opsClear", js_num(env, (double)s->ops_clear));
  set(env, o, "parameterEntries", js_num(env, (double)s->parameter_entries));
  set(env, o, "sourceRecords", js_num(env, (double)s->source_records));
  set(env, o, "writeCheckpoints", js_num(env, (double)s->write_checkpoints));
  set(env, o, "fileBytes", js_num(env, (double)s->file_bytes));
  set(env, o, "reclaimableBytes", js_num(env, (double)s->reclaimable_bytes));
  return o;
}

/* stat(db) -> the counts of bs_db_stat */
static napi_value db_stat(napi_env env, napi_callback_info info) {
  ARGS(1);
  work *w;
  node *n = get_node(env, argv[0], K_DB);
  if (!n || !(w = work_new(env))) return NULL;
  return work_start(env, w, n, exec_stat, done_stat);
}

static void collect_problem(const char *problem, void *payload) {
  work *w = payload;
  if (push_val(w, (bs_val){problem, strlen(problem)})) w->i1 = BS_ENOMEM;
}

static void exec_verify(work *w) {
  w->list_tail = &w->list;
  w->rc = bs_db_verify(NULL, w->n->u.db, collect_problem, w, &w->err);
  if (w->rc == BS_OK && w->i1) w->rc = w->i1;
}

/* verify(db) -> [problem] (empty: consistent) */
static napi_value db_verify(napi_env env, napi_callback_info info) {
  ARGS(1);
  work *w;
  node *n = get_node(env, argv[0], K_DB);
  if (!n || !(w = work_new(env))) return NULL;
  return work_start(env, w, n, exec_verify, done_parameter_sets);
}

typedef struct binfo {
  struct binfo *next;
  bs_bucket_info i; /* name in the call's arena */
} binfo;

#define LIST_STOP 1 /* a page is full: the library then answers BS_EUSER */

static int collect_bucket(const bs_bucket_info *i, void *payload) {
  work *w = payload;
  binfo *b;
  if (w->list_n == w->u1) return LIST_STOP;
  if (!(b = ar_alloc(&w->ar, sizeof *b))) return BS_ENOMEM;
  b->i = *i, b->next = NULL;
  if (ar_dup(&w->ar, &b->i.name, i->name.data, i->name.size)) return BS_ENOMEM;
  *w->list_tail = b;
  w->list_tail = (void **)&b->next;
  w->list_n++;
  return 0;
}

static void exec_list_buckets(work *w) {
  w->list_tail = &w->list;
  w->rc = bs_list_buckets(w->n->u.st, w->a, collect_bucket, w, &w->err);
  if (w->rc != BS_EUSER) return; /* collect_bucket stopped it: a full page, or no memory */
  if (w->list_n == w->u1)
    w->rc = BS_OK;
  else
    w->rc = w->err.code = BS_ENOMEM, snprintf(w->err.msg, sizeof w->err.msg, "out of memory");
}

static napi_value done_list_buckets(napi_env env, work *w) {
  napi_value arr;
  uint32_t k = 0;
  napi_create_array_with_length(env, w->list_n, &arr);
  for (binfo *b = w->list; b; b = b->next) {
    napi_value o = js_obj(env);
    set(env, o, "bucket", js_str(env, b->i.name));
    set(env, o, "checksum", js_num(env, (int32_t)b->i.checksum));
    set(env, o, "count", js_num(env, (double)b->i.count));
    set(env, o, "lastOp", js_u64(env, b->i.last_op));
    set(env, o, "bytes", js_num(env, (double)b->i.bytes));
    set(env, o, "generation", js_u64(env, b->i.generation));
    set(env, o, "changes", js_num(env, (double)b->i.changes));
    napi_set_element(env, arr, k++, o);
  }
  return arr;
}

/* listBuckets(storage, startAfter | null, limit) -> up to limit buckets after startAfter */
static napi_value list_buckets(napi_env env, napi_callback_info info) {
  ARGS(3);
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  w->a = (bs_val){NULL, 0};
  if ((argv[1] && get_bytes(env, &w->ar, argv[1], "options.startAfter", &w->a)) ||
      get_u64(env, argv[2], "options.page", &w->u1))
    FAIL_WORK(w);
  if (w->u1 == 0) {
    throw_range(env, "options.page", "not positive");
    FAIL_WORK(w);
  }
  return work_start(env, w, n, exec_list_buckets, done_list_buckets);
}

#define WAIT_SLICE_MS 100 /* how soon a wait sees an abort or the process's exit */

static int same_checkpoint(const bs_checkpoint *a, const bs_checkpoint *b) {
  return a->op_id == b->op_id && a->has_lsn == b->has_lsn &&
         (!a->has_lsn || (a->lsn_size == b->lsn_size && !memcmp(a->lsn, b->lsn, a->lsn_size)));
}

/* bs_wait_checkpoint in slices, so that an abort (or the environment's exit) ends it. u1: the
 * timeout in ms (UINT64_MAX: none); i1: whether known (w->cp2) is given. */
static void exec_wait(work *w) {
  uint64_t left = w->u1;
  const bs_checkpoint *known = w->i1 ? &w->cp2 : NULL;
  for (;;) {
    int slice = left < WAIT_SLICE_MS ? (int)left : WAIT_SLICE_MS;
    w->rc = bs_wait_checkpoint(&w->r.cp, w->n->u.st, known, slice, &w->err);
    if (w->rc != BS_OK || !known || !same_checkpoint(known, &w->r.cp) ||
        (left -= (uint64_t)slice) == 0)
      return;
    if (progress_step(w->pc)) {
      w->rc = BS_ECANCELED;
      snprintf(w->err.msg, sizeof w->err.msg, "the wait was cancelled");
      return;
    }
  }
}

/* waitCheckpoint(storage, known {checkpoint, lsn} | null, timeoutMs | null (none), cancelFlag)
 * -> {checkpoint, lsn} */
static napi_value wait_checkpoint(napi_env env, napi_callback_info info) {
  ARGS(4);
  napi_value v;
  double ms = -1;
  work *w;
  node *n = storage_arg(env, argv[0], &w);
  if (!n) return NULL;
  w->u1 = UINT64_MAX;
  if (argv[2] && get_double(env, argv[2], "options.timeoutMs", &ms)) FAIL_WORK(w);
  if (argv[2] && !(ms >= 0 && (ms >= 1e15 || ms == (double)(uint64_t)ms))) {
    throw_range(env, "options.timeoutMs", "not a non-negative whole number");
    FAIL_WORK(w);
  }
  if (argv[2] && ms < 1e15) w->u1 = (uint64_t)ms;
  if (argv[1]) {
    bs_val lsn = {NULL, 0};
    w->i1 = 1;
    if (get_prop(env, argv[1], "checkpoint", &v) ||
        get_u64(env, v, "known.checkpoint", &w->cp2.op_id) || get_prop(env, argv[1], "lsn", &v) ||
        get_opt_bytes(env, &w->ar, v, "known.lsn", &lsn))
      FAIL_WORK(w);
    if (lsn.size > BS_MAX_LSN) {
      throw_rc(env, BS_ETOOBIG, "known.lsn: longer than %u bytes", BS_MAX_LSN);
      FAIL_WORK(w);
    }
    if ((w->cp2.has_lsn = lsn.data != NULL))
      memcpy(w->cp2.lsn, lsn.data, w->cp2.lsn_size = lsn.size);
  }
  if (progress_new(env, NULL, argv[3], 0, &w->pc)) FAIL_WORK(w);
  return work_start(env, w, n, exec_wait, done_checkpoint);
}

/* ---- Backup, export, load -------------------------------------------------------------------- */

static int records_progress(uint64_t records, void *payload) {
  progress_ctx *pc = payload;
  pc->records = records;
  return progress_step(pc);
}

/* A C string copy of a path argument (string or Uint8Array, no NUL byte) in a. */
static int get_path(napi_env env, arena *a, napi_value v, const char *name, bs_val *out) {
  bs_val p;
  if (get_bytes(env, a, v, name, &p) || ar_dup(a, out, p.data, p.size + 1)) return -1;
  ((char *)out->data)[p.size] = 0;
  out->size = p.size;
  if (memchr(p.data, 0, p.size)) return throw_range(env, name, "contains a NUL byte");
  return 0;
}

static void exec_backup(work *w) {
  w->rc = bs_backup(w->n->u.db, w->a.data, &w->bo, &w->err);
}

/* backup(db, path, {replace, onProgress}, cancelFlag | undefined) */
static napi_value db_backup(napi_env env, napi_callback_info info) {
  ARGS(4);
  napi_value v, fn;
  work *w;
  node *n = get_node(env, argv[0], K_DB);
  int replace = 0;
  if (!n || !(w = work_new(env))) return NULL;
  w->bo = (bs_backup_options)BS_BACKUP_OPTIONS_INIT;
  if (get_path(env, &w->ar, argv[1], "path", &w->a) || get_prop(env, argv[2], "replace", &v) ||
      get_bool(env, v, "options.replace", &replace) || get_prop(env, argv[2], "onProgress", &fn) ||
      progress_new(env, fn, argv[3], 1, &w->pc))
    FAIL_WORK(w);
  if (replace) w->bo.flags |= BS_BACKUP_REPLACE;
  w->bo.progress = records_progress, w->bo.progress_payload = w->pc;
  return work_start(env, w, n, exec_backup, done_undefined);
}

/* A batch of records between a library thread and JS: the records, their table names, keys and
 * values (in the arena), and their key and value bytes (for the batch bound). */
#define XFER_RECORDS 1000u
#define XFER_BYTES   (1u << 20)

typedef struct rbatch {
  arena ar;
  bs_record *r;
  size_t n, cap, bytes;
} rbatch;

static void rbatch_free(rbatch *b) {
  if (!b) return;
  ar_free(&b->ar);
  free(b->r);
  free(b);
}

/* A new record at the end of b (NULL: out of memory). */
static bs_record *rbatch_push(rbatch *b) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    bs_record *r = realloc(b->r, cap * sizeof *r);
    if (!r) return NULL;
    b->r = r, b->cap = cap;
  }
  return &b->r[b->n++];
}

/* The hand-over between a producer and a consumer thread, one batch at a time through one slot
 * (export: the export thread -> exportNext; load: loadPush -> the loader thread), so at most
 * three batches exist: the producer's, the slot's and the consumer's. Freed when its external
 * and every call using it are done (refs, main thread only). */
typedef struct chan {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rbatch *slot;     /* handed over, not yet taken */
  int eof;          /* load: JS pushed its last batch */
  _Atomic int stop; /* the consumer went away / the load is aborted */
  int finished, rc; /* the library call returned rc */
  bs_error err;
  int joined, joining, started; /* the thread (under mu) */
  pthread_t thread;
  int refs, ended, is_load; /* main thread */
  node *db;                 /* export: its database (a ref and a child held until ended) */
  uint32_t stream;
  rbatch *cur; /* the export's filling batch / the batch the loader serves */
  size_t pos;
  bs_val path; /* load: in ar */
  arena ar;
  bs_backup_options bo;
  progress_ctx *pc;
} chan;

static const napi_type_tag chan_tag = {0x6275636b65747374ull, 0x6f72652d78660004ull};

static void chan_unref(napi_env env, chan *ch) {
  if (--ch->refs) return;
  rbatch_free(ch->slot);
  rbatch_free(ch->cur);
  if (ch->pc) progress_free(env, ch->pc);
  ar_free(&ch->ar);
  pthread_mutex_destroy(&ch->mu);
  pthread_cond_destroy(&ch->cv);
  free(ch);
}

static int chan_finished(chan *ch) {
  int f;
  pthread_mutex_lock(&ch->mu);
  f = ch->finished;
  pthread_mutex_unlock(&ch->mu);
  return f;
}

/* Stops the producer or the loader at its next record (and a progress wait). */
static void chan_stop(chan *ch) {
  pthread_mutex_lock(&ch->mu);
  ch->stop = 1;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
  if (ch->pc) progress_abandon(ch->pc);
}

/* Waits for the thread to end (once, from whichever thread asks first). */
static void chan_join(chan *ch) {
  pthread_mutex_lock(&ch->mu);
  if (!ch->started || ch->joined) {
    pthread_mutex_unlock(&ch->mu);
    return;
  }
  if (ch->joining) {
    while (!ch->joined) pthread_cond_wait(&ch->cv, &ch->mu);
    pthread_mutex_unlock(&ch->mu);
    return;
  }
  ch->joining = 1;
  pthread_mutex_unlock(&ch->mu);
  pthread_join(ch->thread, NULL);
  pthread_mutex_lock(&ch->mu);
  ch->joined = 1;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
}

/* Main thread, after the thread ended: gives back the database and the progress function (a
 * threadsafe function keeps the event loop alive). */
static void chan_end(napi_env env, chan *ch) {
  if (ch->ended) return;
  ch->ended = 1;
  if (ch->db) {
    ch->db->children--;
    node_unref(ch->db);
    ch->db = NULL;
  }
  if (ch->pc) {
    progress_free(env, ch->pc);
    ch->pc = NULL;
  }
}

static void chan_finalize(napi_env env, void *data, void *hint) {
  chan *ch = data;
  if (!ch->ended) {
    chan_stop(ch);
    /* a load is always ended by index.js; an unended one is an environment going away while
     * its loader may wait for the main thread: left to the process's exit */
    if (ch->is_load && !chan_finished(ch)) return;
    chan_join(ch);
    chan_end(env, ch);
  }
  chan_unref(env, ch);
}

static chan *chan_new(void) {
  chan *ch = calloc(1, sizeof *ch);
  if (!ch) return NULL;
  pthread_mutex_init(&ch->mu, NULL);
  pthread_cond_init(&ch->cv, NULL);
  ch->refs = 1; /* the external's */
  return ch;
}

/* The external of ch with its thread running main; NULL (JS error pending, ch freed) on failure. */
static napi_value chan_start(napi_env env, chan *ch, void *(*main_fn)(void *)) {
  napi_value ext;
  if (napi_create_external(env, ch, chan_finalize, NULL, &ext) != napi_ok ||
      napi_type_tag_object(env, ext, &chan_tag) != napi_ok) {
    chan_unref(env, ch); /* (a created external without its tag is never used) */
    throw_rc(env, BS_EIO, "could not create a handle");
    return NULL;
  }
  if (ch->db) ch->db->refs++, ch->db->children++;
  if (pthread_create(&ch->thread, NULL, main_fn, ch) != 0) {
    ch->finished = 1, ch->rc = BS_EIO;
    snprintf(ch->err.msg, sizeof ch->err.msg, "could not start a thread");
  } else {
    ch->started = 1;
  }
  return ext;
}

/* The open transfer handle in v; else a JS error and NULL. */
static chan *chan_arg(napi_env env, napi_value v) {
  napi_valuetype t;
  bool ok = false;
  void *p = NULL;
  if (v && napi_typeof(env, v, &t) == napi_ok && t == napi_external)
    napi_check_object_type_tag(env, v, &chan_tag, &ok);
  if (!ok || napi_get_value_external(env, v, &p) != napi_ok) {
    throw_rc(env, BS_EINVAL, "handle: not a bucketstore export or load");
    return NULL;
  }
  if (((chan *)p)->ended) {
    throw_rc(env, BS_ESTATE, "the export or load is closed");
    return NULL;
  }
  return p;
}

/* A call on ch: its work holds a ref on ch (released by work_free). */
static work *chan_work(napi_env env, chan *ch) {
  work *w = work_new(env);
  if (w) w->ch = ch, ch->refs++;
  return w;
}

static void chan_finish(chan *ch, int rc) {
  pthread_mutex_lock(&ch->mu);
  ch->rc = rc, ch->finished = 1;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
}

/* ---- export: a thread runs bs_db_export, exportNext takes its batches --------------------- */

/* Producer: waits until the slot is free; -1 when the consumer went away. */
static int chan_hand(chan *ch, rbatch *b) {
  int ok;
  pthread_mutex_lock(&ch->mu);
  while (ch->slot && !ch->stop) pthread_cond_wait(&ch->cv, &ch->mu);
  if ((ok = !ch->stop)) ch->slot = b;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
  return ok ? 0 : -1;
}

static int export_record(const bs_record *rec, void *payload) {
  chan *ch = payload;
  rbatch *b = ch->cur;
  bs_record *x;
  bs_val t;
  if (ch->stop) return BS_ECANCELED;
  if (!b && !(b = ch->cur = calloc(1, sizeof *b))) return BS_ENOMEM;
  if (!(x = rbatch_push(b)) || ar_dup(&b->ar, &t, rec->table, strlen(rec->table) + 1) ||
      ar_dup(&b->ar, &x->key, rec->key.size ? rec->key.data : empty_bytes, rec->key.size) ||
      ar_dup(&b->ar, &x->value, rec->value.size ? rec->value.data : empty_bytes, rec->value.size)) {
    if (x) b->n--;
    return BS_ENOMEM;
  }
  x->table = t.data, x->stream = rec->stream;
  b->bytes += rec->key.size + rec->value.size;
  if (b->n < XFER_RECORDS && b->bytes < XFER_BYTES) return 0;
  if (chan_hand(ch, b)) return BS_ECANCELED;
  ch->cur = NULL;
  return 0;
}

static void *export_main(void *arg) {
  chan *ch = arg;
  int rc = bs_db_export(ch->db->u.db, ch->stream, export_record, ch, &ch->err);
  if (rc == BS_OK && ch->cur) {
    if (chan_hand(ch, ch->cur) == 0)
      ch->cur = NULL;
    else
      rc = BS_ECANCELED;
  }
  chan_finish(ch, rc);
  return NULL;
}

/* exportOpen(db, stream = 0) -> an export handle whose thread reads one snapshot */
static napi_value export_open(napi_env env, napi_callback_info info) {
  ARGS(2);
  uint64_t stream = 0;
  node *n = get_node(env, argv[0], K_DB);
  chan *ch;
  if (!n || get_opt_u64(env, argv[1], "stream", &stream)) return NULL;
  if (stream > UINT32_MAX) {
    throw_range(env, "stream", "above 2^32-1");
    return NULL;
  }
  if (!(ch = chan_new())) {
    NOMEM();
    return NULL;
  }
  ch->db = n, ch->stream = (uint32_t)stream;
  return chan_start(env, ch, export_main);
}

static void exec_export_next(work *w) {
  chan *ch = w->ch;
  pthread_mutex_lock(&ch->mu);
  while (!ch->slot && !ch->finished) pthread_cond_wait(&ch->cv, &ch->mu);
  w->obj = ch->slot, ch->slot = NULL;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
}

/* [{table, stream, key: Buffer, value: Buffer}] of a batch, null at the end, or the export's
 * error thrown. */
static napi_value done_export_next(napi_env env, work *w) {
  rbatch *b = w->obj;
  napi_value arr = NULL;
  if (!b) {
    if (w->ch->rc == BS_OK) return js_null(env);
    napi_throw(env, make_error(env, w->ch->rc, &w->ch->err));
    return NULL;
  }
  w->obj = NULL;
  if (napi_create_array_with_length(env, b->n, &arr) == napi_ok)
    for (size_t i = 0; i < b->n && arr; i++) {
      const bs_record *r = &b->r[i];
      napi_value o = js_obj(env), k, v;
      if (napi_create_buffer_copy(env, r->key.size, r->key.data, NULL, &k) != napi_ok ||
          napi_create_buffer_copy(env, r->value.size, r->value.data, NULL, &v) != napi_ok) {
        arr = NULL;
        break;
      }
      set(env, o, "table", js_str(env, (bs_val){r->table, strlen(r->table)}));
      set(env, o, "stream", js_num(env, r->stream));
      set(env, o, "key", k);
      set(env, o, "value", v);
      if (napi_set_element(env, arr, (uint32_t)i, o) != napi_ok) arr = NULL;
    }
  rbatch_free(b);
  return arr;
}

/* exportNext(export) -> the next batch of records, or null after the last */
static napi_value export_next(napi_env env, napi_callback_info info) {
  ARGS(1);
  chan *ch = chan_arg(env, argv[0]);
  work *w;
  if (!ch) return NULL;
  if (ch->is_load) {
    throw_rc(env, BS_EINVAL, "handle: not a bucketstore export");
    return NULL;
  }
  w = chan_work(env, ch);
  return w ? work_start(env, w, NULL, exec_export_next, done_export_next) : NULL;
}

static void exec_chan_close(work *w) {
  chan_stop(w->ch);
  chan_join(w->ch);
}

static napi_value done_chan_close(napi_env env, work *w) {
  chan_end(env, w->ch);
  return done_undefined(env, w);
}

/* exportClose(export): stops its thread; resolves when the snapshot is released. Closing twice
 * is a no-op. */
static napi_value export_close(napi_env env, napi_callback_info info) {
  ARGS(1);
  napi_valuetype t;
  bool ok = false;
  chan *ch = NULL;
  work *w;
  if (argv[0] && napi_typeof(env, argv[0], &t) == napi_ok && t == napi_external)
    napi_check_object_type_tag(env, argv[0], &chan_tag, &ok);
  if (!ok || napi_get_value_external(env, argv[0], (void **)&ch) != napi_ok || ch->is_load) {
    throw_rc(env, BS_EINVAL, "handle: not a bucketstore export");
    return NULL;
  }
  if (!(w = chan_work(env, ch))) return NULL;
  return work_start(env, w, NULL, exec_chan_close, done_chan_close);
}

/* ---- load: loadPush hands batches to a thread running bs_load ------------------------------ */

static int load_next(bs_record *rec, void *payload) {
  chan *ch = payload;
  while (!ch->cur || ch->pos == ch->cur->n) {
    rbatch *b;
    rbatch_free(ch->cur);
    ch->cur = NULL, ch->pos = 0;
    pthread_mutex_lock(&ch->mu);
    while (!ch->slot && !ch->eof && !ch->stop) pthread_cond_wait(&ch->cv, &ch->mu);
    b = ch->stop ? NULL : ch->slot;
    if (b) ch->slot = NULL;
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
    if (!b) return ch->stop ? BS_ECANCELED : 0;
    ch->cur = b;
  }
  *rec = ch->cur->r[ch->pos++];
  return 1;
}

static void *load_main(void *arg) {
  chan *ch = arg;
  chan_finish(ch, bs_load(ch->path.data, &ch->bo, load_next, ch, &ch->err));
  return NULL;
}

/* loadOpen(path, onProgress | undefined, cancelFlag | undefined) -> a load handle whose thread
 * builds the file from the batches loadPush hands it */
static napi_value load_open(napi_env env, napi_callback_info info) {
  ARGS(3);
  chan *ch = chan_new();
  if (!ch) {
    NOMEM();
    return NULL;
  }
  ch->is_load = 1;
  ch->bo = (bs_backup_options)BS_BACKUP_OPTIONS_INIT;
  if (get_path(env, &ch->ar, argv[0], "path", &ch->path) ||
      progress_new(env, argv[1], argv[2], 1, &ch->pc)) {
    chan_unref(env, ch);
    return NULL;
  }
  ch->bo.progress = records_progress, ch->bo.progress_payload = ch->pc;
  return chan_start(env, ch, load_main);
}

/* records[i] of JS (base: the index of records[0] in the caller's input) into b. */
static int get_record(napi_env env, rbatch *b, napi_value r, uint32_t i, uint32_t base) {
  char name[64];
  napi_value v;
  uint64_t stream = 0;
  bs_val t;
  bs_record *x = rbatch_push(b);
  if (!x) return NOMEM();
  snprintf(name, sizeof name, "records[%u].table", base + i);
  if (get_prop(env, r, "table", &v) || get_path(env, &b->ar, v, name, &t)) return -1;
  snprintf(name, sizeof name, "records[%u].stream", base + i);
  if (get_prop(env, r, "stream", &v) || get_opt_u64(env, v, name, &stream)) return -1;
  if (stream > UINT32_MAX) return throw_range(env, name, "above 2^32-1");
  snprintf(name, sizeof name, "records[%u].key", base + i);
  if (get_prop(env, r, "key", &v) || get_bytes(env, &b->ar, v, name, &x->key)) return -1;
  snprintf(name, sizeof name, "records[%u].value", base + i);
  if (get_prop(env, r, "value", &v) || get_bytes(env, &b->ar, v, name, &x->value)) return -1;
  x->table = t.data, x->stream = (uint32_t)stream;
  return 0;
}

static int is_load_arg(napi_env env, const chan *ch) {
  return ch->is_load || throw_rc(env, BS_EINVAL, "handle: not a bucketstore load") == 0;
}

static void exec_load_push(work *w) {
  chan *ch = w->ch;
  pthread_mutex_lock(&ch->mu);
  while (ch->slot && !ch->finished) pthread_cond_wait(&ch->cv, &ch->mu);
  if (!ch->finished) ch->slot = w->obj, w->obj = NULL;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
}

static napi_value done_load_push(napi_env env, work *w) {
  int taken = w->obj == NULL;
  rbatch_free(w->obj); /* the loader ended early: loadEnd says why */
  w->obj = NULL;
  return js_bool(env, taken);
}

/* loadPush(load, records, base) -> true when the loader took them, false when it has ended */
static napi_value load_push(napi_env env, napi_callback_info info) {
  ARGS(3);
  chan *ch = chan_arg(env, argv[0]);
  uint32_t n, base = 0;
  rbatch *b;
  work *w;
  if (!ch || !is_load_arg(env, ch) || get_array(env, argv[1], "records", &n) ||
      (argv[2] && napi_get_value_uint32(env, argv[2], &base) != napi_ok))
    return NULL;
  if (!(b = calloc(1, sizeof *b))) {
    NOMEM();
    return NULL;
  }
  for (uint32_t i = 0; i < n; i++) {
    napi_value r;
    if (napi_get_element(env, argv[1], i, &r) != napi_ok || get_record(env, b, r, i, base)) {
      rbatch_free(b);
      return NULL;
    }
  }
  if (!(w = chan_work(env, ch))) {
    rbatch_free(b);
    return NULL;
  }
  w->obj = b;
  return work_start(env, w, NULL, exec_load_push, done_load_push);
}

static void exec_load_end(work *w) {
  chan *ch = w->ch;
  pthread_mutex_lock(&ch->mu);
  if (w->i1)
    ch->stop = 1;
  else
    ch->eof = 1;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
  chan_join(ch);
}

static napi_value done_load_end(napi_env env, work *w) {
  chan *ch = w->ch;
  napi_value e = NULL;
  if (ch->rc != BS_OK && !progress_thrown(env, ch->pc, &e)) e = make_error(env, ch->rc, &ch->err);
  chan_end(env, ch);
  if (!e) return done_undefined(env, w);
  napi_throw(env, e);
  return NULL;
}

/* loadEnd(load, abort): after the last loadPush (or, abort, instead of it): resolves when the
 * file is in place, else rejects with why not (what onProgress threw, or the library's error) */
static napi_value load_end(napi_env env, napi_callback_info info) {
  ARGS(2);
  chan *ch = chan_arg(env, argv[0]);
  work *w;
  bool abort = false;
  if (!ch || !is_load_arg(env, ch) ||
      (argv[1] && napi_get_value_bool(env, argv[1], &abort) != napi_ok))
    return NULL;
  if (!(w = chan_work(env, ch))) return NULL;
  w->i1 = abort;
  return work_start(env, w, NULL, exec_load_end, done_load_end);
}

/* exiting(): the process is exiting (its 'exit' event): every long call under way cancels at its
 * next step instead of waiting for the main thread. */
static napi_value js_exiting(napi_env env, napi_callback_info info) {
  envdata *ed = NULL;
  if (napi_get_instance_data(env, (void **)&ed) == napi_ok && ed) progress_abandon_all(ed);
  return NULL;
}

static napi_value init(napi_env env, napi_value exports) {
  envdata *ed = calloc(1, sizeof *ed);
  napi_value holder;
  if (!ed || napi_create_array_with_length(env, KEY_SLOTS, &holder) != napi_ok ||
      napi_create_reference(env, holder, 1, &ed->holder) != napi_ok ||
      napi_set_instance_data(env, ed, envdata_free, NULL) != napi_ok) {
    if (ed && ed->holder) napi_delete_reference(env, ed->holder);
    free(ed);
    throw_rc(env, BS_ENOMEM, "could not initialise the addon");
    return NULL;
  }
  /* a worker thread's environment torn down without its 'exit' event */
  if (napi_add_env_cleanup_hook(env, progress_abandon_all, ed) != napi_ok) return NULL;
  static const struct {
    const char *name;
    napi_callback fn;
  } fns[] = {
      {"open", db_open},
      {"close", handle_close},
      {"streamCreate", stream_create},
      {"streamList", stream_list},
      {"onCheckpoint", db_on_checkpoint},
      {"storageOpen", storage_open},
      {"storageStreamId", storage_stream_id},
      {"createWriter", create_writer},
      {"save", writer_save},
      {"flush", writer_flush},
      {"commit", writer_commit},
      {"keepalive", writer_keepalive},
      {"snapshotDone", writer_snapshot_done},
      {"resumeLsn", writer_resume_lsn},
      {"truncate", writer_truncate},
      {"drop", writer_drop},
      {"sourceRow", writer_source_row},
      {"addCustomWriteCheckpoint", writer_custom_wcp},
      {"getCheckpoint", get_checkpoint},
      {"bucketData", bucket_data},
      {"bucketDataSync", bucket_data_sync},
      {"checksums", get_checksums},
      {"parameterSets", get_parameter_sets},
      {"checkpointChanges", get_checkpoint_changes},
      {"compact", compact},
      {"compactInitialReplication", compact_initial},
      {"setWriteCheckpointMode", set_wcp_mode},
      {"createManagedWriteCheckpoints", create_managed},
      {"lastWriteCheckpoint", last_wcp},
      {"deleteCheckpointRequestsBefore", delete_requests},
      {"getStatus", get_status},
      {"clear", storage_clear},
      {"terminate", storage_terminate},
      {"reportError", storage_report_error},
      {"checksumPut", checksum_put},
      {"liveHandles", js_live_handles},
      {"backup", db_backup},
      {"exportOpen", export_open},
      {"exportNext", export_next},
      {"exportClose", export_close},
      {"loadOpen", load_open},
      {"loadPush", load_push},
      {"loadEnd", load_end},
      {"exiting", js_exiting},
      {"stat", db_stat},
      {"verify", db_verify},
      {"listBuckets", list_buckets},
      {"waitCheckpoint", wait_checkpoint},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    napi_value f;
    if (napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].fn, NULL, &f) != napi_ok ||
        napi_set_named_property(env, exports, fns[i].name, f) != napi_ok)
      return NULL;
  }
  napi_value ver;
  napi_create_string_utf8(env, BS_VERSION_STRING, NAPI_AUTO_LENGTH, &ver);
  napi_set_named_property(env, exports, "version", ver);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
