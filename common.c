/*
 * common.c: the common layer, below the front (storage.c) and every backend, which all use it
 * and which uses none of them: status strings and bs__fail, the allocator and the growth rule of
 * arrays, the one wall clock and the one hash table. (The database base is storage_backend.h's
 * struct bs_db; its front state, the checksum cache and checkpoint notification, is storage.c's.)
 * `make layercheck` fails when a backend's object uses a symbol of storage.o, so the front and
 * the backends cannot import each other again.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- Errors ---------------------------------------------------------------------------------- */

const char *bs_strerror(int code) {
  /* indexed by -code: the codes are 0, -1, -2, ... (storage.h) */
  static const char *const text[] = {
      [-BS_OK] = "BS_OK: success",
      [-BS_EINVAL] = "BS_EINVAL: invalid argument",
      [-BS_ENOTFOUND] = "BS_ENOTFOUND: not found",
      [-BS_ETOOBIG] = "BS_ETOOBIG: key or value over a limit",
      [-BS_ELIMIT] = "BS_ELIMIT: result limit exceeded",
      [-BS_ESTATE] = "BS_ESTATE: call not valid in this state",
      [-BS_EINVALIDATED] = "BS_EINVALIDATED: checkpoint was compacted; read a newer checkpoint",
      [-BS_ESTALE] = "BS_ESTALE: read below the parameter-compaction horizon",
      [-BS_ECORRUPT] = "BS_ECORRUPT: file does not decode",
      [-BS_ENOMEM] = "BS_ENOMEM: out of memory",
      [-BS_EIO] = "BS_EIO: I/O or LMDB error",
      [-BS_EBUSY] = "BS_EBUSY: resource busy",
      [-BS_EUNSUPPORTED] = "BS_EUNSUPPORTED: not supported by this backend",
      [-BS_ECANCELED] = "BS_ECANCELED: cancelled",
      [-BS_EUSER] = "BS_EUSER: a callback stopped the call",
  };
  if (code > 0 || code <= -(int)(sizeof text / sizeof *text) || !text[-code])
    return "BS_EUNKNOWN: unknown status code";
  return text[-code];
}

int bs__fail(bs_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* ---- Passwords in connection strings ------------------------------------------------------- */

#define REDACTED    "***"
#define MAX_SECRETS 16 /* password spans of one string; the last of that many runs to its end */

typedef struct secret {
  size_t at, len;
} secret;

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* n spans found in s: when the parser stopped at MAX_SECRETS, the last one runs to the end
 * (more passwords than that are no connection string, but are hidden all the same). */
static size_t secrets_end(const char *s, secret *out, size_t n) {
  if (n == MAX_SECRETS) out[n - 1].len = strlen(s) - out[n - 1].at;
  return n;
}

/* The passwords of a URL, in order: the userinfo's after its first ':' (up to the last '@'
 * before the path, so a raw '@' in a password is hidden too, where libpq stops at the first),
 * then the values of password= query parameters (after the userinfo). */
static size_t url_secrets(const char *s, size_t rest, secret *out) {
  size_t n = 0, end = rest + strcspn(s + rest, "/"), at = end, i;
  for (i = rest; i < end; i++)
    if (s[i] == '@') at = i;
  if (at < end) {
    const char *colon = memchr(s + rest, ':', at - rest);
    if (colon) out[n++] = (secret){(size_t)(colon + 1 - s), at - (size_t)(colon + 1 - s)};
    rest = at + 1;
  }
  for (i = rest + strcspn(s + rest, "?"); s[i] && n < MAX_SECRETS; i += strcspn(s + i, "&")) {
    size_t key = ++i, eq = key + strcspn(s + key, "=&");
    if (s[eq] == '=' && eq - key == 8 && !strncmp(s + key, "password", 8))
      out[n++] = (secret){eq + 1, strcspn(s + eq + 1, "&")};
  }
  return secrets_end(s, out, n);
}

/* The passwords of a key=value string, parsed as libpq does (values unquoted up to a space, or
 * in single quotes; a backslash escapes the next character). */
static size_t kv_secrets(const char *s, secret *out) {
  size_t n = 0, i = 0;
  while (n < MAX_SECRETS) {
    size_t key, key_len, v;
    while (is_space(s[i])) i++;
    if (!s[i]) break;
    for (key = i; s[i] && s[i] != '=' && !is_space(s[i]); i++) {
    }
    key_len = i - key;
    while (is_space(s[i])) i++;
    if (s[i] != '=') continue; /* libpq refuses it (quoting the key): look on all the same */
    for (i++; is_space(s[i]); i++) {
    }
    v = i;
    if (s[i] == '\'') {
      for (i++; s[i] && s[i] != '\''; i++)
        if (s[i] == '\\' && s[i + 1]) i++;
      if (s[i]) i++;
    } else {
      for (; s[i] && !is_space(s[i]); i++)
        if (s[i] == '\\' && s[i + 1]) i++;
    }
    if (key_len == 8 && !strncmp(s + key, "password", 8) && i > v) out[n++] = (secret){v, i - v};
  }
  return secrets_end(s, out, n);
}

static size_t secrets(const char *s, secret *out) {
  if (!strncmp(s, "postgresql://", 13)) return url_secrets(s, 13, out);
  if (!strncmp(s, "postgres://", 11)) return url_secrets(s, 11, out);
  return kv_secrets(s, out);
}

/* Appends n bytes of s to out (cap bytes, NUL-terminated, cut to fit) at len; the new length. */
static size_t append(char *out, size_t cap, size_t len, const char *s, size_t n) {
  if (len + 1 < cap) {
    size_t k = cap - len - 1 < n ? cap - len - 1 : n;
    memcpy(out + len, s, k);
    out[len + k] = '\0';
  }
  return len + n;
}

size_t bs_redact_conninfo(char *out, size_t cap, const char *conninfo) {
  secret sec[MAX_SECRETS];
  const char *s = conninfo ? conninfo : "";
  size_t n = secrets(s, sec), len = 0, from = 0, i;
  if (!out) cap = 0;
  if (cap) out[0] = '\0';
  for (i = 0; i < n; i++) {
    len = append(out, cap, len, s + from, sec[i].at - from);
    len = append(out, cap, len, REDACTED, sizeof REDACTED - 1);
    from = sec[i].at + sec[i].len;
  }
  return append(out, cap, len, s + from, strlen(s + from));
}

/* How many bytes at p (q of them) are a password of sec[0..n), or a part of one between '@'s
 * (libpq splits a URL's raw '@' in a password off into the host it then quotes); 0: none. */
static size_t secret_at(const char *conninfo, const secret *sec, size_t n, const char *p,
                        size_t q) {
  for (size_t i = 0; i < n; i++) {
    const char *pw = conninfo + sec[i].at, *end = pw + sec[i].len, *part;
    if (sec[i].len && sec[i].len <= q && !memcmp(p, pw, sec[i].len)) return sec[i].len;
    for (part = pw; part < end; part += strcspn(part, "@") + 1) {
      size_t len = strcspn(part, "@");
      if (part + len > end) len = (size_t)(end - part);
      if (len && len < sec[i].len && len <= q && !memcmp(p, part, len)) return len;
    }
  }
  return 0;
}

void bs__redact_message(char *msg, size_t cap, const char *conninfo) {
  secret sec[MAX_SECRETS];
  size_t n = conninfo ? secrets(conninfo, sec) : 0, len = 0, i = 0, k;
  char out[sizeof((bs_error *)0)->msg];
  int quoted = 0;
  if (!n || cap > sizeof out) return;
  /* libpq quotes what it echoes ("invalid percent-encoded token: \"...\"", a whole URL): the
   * passwords go from quoted text, where the message's own words are never cut up */
  while (msg[i] && len + 1 < cap) {
    if (quoted && (k = secret_at(conninfo, sec, n, msg + i, strlen(msg + i))) != 0) {
      len += (size_t)snprintf(out + len, cap - len, "%s", REDACTED);
      i += k;
      continue;
    }
    quoted ^= msg[i] == '"';
    out[len++] = msg[i++];
  }
  out[len < cap ? len : cap - 1] = '\0';
  memcpy(msg, out, cap);
}

int bs__callback_fail(bs_error *err, int code, const char *callback, int value) {
  return bs__fail(err, code, "%s returned %d, which %s the call", callback, value,
                  code == BS_ECANCELED ? "cancels" : "stops");
}

/* ---- Clock ----------------------------------------------------------------------------------- */

static int64_t fixed_now_ms = -1; /* bs__set_now_ms's; < 0: the wall clock */

void bs__set_now_ms(int64_t ms) {
  __atomic_store_n(&fixed_now_ms, ms < 0 ? -1 : ms, __ATOMIC_RELAXED);
}

int64_t bs__now_ms(void) {
  struct timespec ts;
  int64_t fixed = __atomic_load_n(&fixed_now_ms, __ATOMIC_RELAXED);
  if (fixed >= 0) return fixed;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned fork_count;
static pthread_once_t forks_once = PTHREAD_ONCE_INIT;

static void forks_child(void) {
  __atomic_add_fetch(&fork_count, 1, __ATOMIC_RELAXED);
}

static void forks_register(void) {
  /* a failure (ENOMEM) leaves the count at 0 in every child: handles are then not refused there,
   * as before this check existed */
  (void)pthread_atfork(NULL, NULL, forks_child);
}

unsigned bs__forks(void) {
  pthread_once(&forks_once, forks_register);
  return __atomic_load_n(&fork_count, __ATOMIC_RELAXED);
}

uint64_t bs__monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

struct timespec bs__monotonic_after(uint64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)(ms / 1000u);
  ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* ---- Memory ---------------------------------------------------------------------------------- */

static void *libc_malloc(void *o, size_t n) {
  (void)o;
  return malloc(n);
}
static void *libc_realloc(void *o, void *p, size_t n) {
  (void)o;
  return realloc(p, n);
}
static void libc_free(void *o, void *p) {
  (void)o;
  free(p);
}
const bs_allocator bs__default_allocator = {libc_malloc, libc_realloc, libc_free, NULL};

int bs__allocator_resolve(const bs_allocator *a, const bs_allocator **out, bs_error *err) {
  int set = a ? (a->malloc_fn != NULL) + (a->realloc_fn != NULL) + (a->free_fn != NULL) : 0;
  if (set != 0 && set != 3)
    return bs__fail(err, BS_EINVAL, "opts->allocator: set all three functions or none");
  *out = set ? a : &bs__default_allocator;
  return BS_OK;
}

void *bs__malloc(const bs_allocator *a, size_t n) {
  return a->malloc_fn(a->opaque, n ? n : 1);
}

void *bs__calloc(const bs_allocator *a, size_t n, size_t size) {
  void *p;
  if (size && n > SIZE_MAX / size) return NULL;
  p = bs__malloc(a, n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void *bs__realloc(const bs_allocator *a, void *p, size_t n) {
  return a->realloc_fn(a->opaque, p, n ? n : 1);
}

void bs__free(const bs_allocator *a, void *p) {
  if (p) a->free_fn(a->opaque, p);
}

int bs__grow(const bs_allocator *a, void **arr, size_t *cap, size_t need, size_t elem) {
  size_t nc;
  void *p;
  if (need <= *cap) return BS_OK;
  nc = *cap ? *cap : 8;
  while (nc < need) {
    if (nc > SIZE_MAX / 2 / elem) return BS_ENOMEM;
    nc *= 2;
  }
  if (!(p = bs__realloc(a, *arr, nc * elem))) return BS_ENOMEM;
  *arr = p;
  *cap = nc;
  return BS_OK;
}

/* ---- The contract's asserts (BS_ASSERT, test builds only) ------------------------------------ */

#ifdef BS_DEBUG
void bs__assert_fail(const char *cond, const char *file, int line) {
  fprintf(stderr, "bucketstore: BS_ASSERT(%s) failed at %s:%d (a front/backend contract bug)\n",
          cond, file, line);
  abort();
}
#endif

/* ---- Arena ----------------------------------------------------------------------------------- */

void *bs__arena_alloc(bs__arena *ar, size_t n) {
  bs__arena_blk *b = ar->head;
  if (n > SIZE_MAX / 2) return NULL; /* a saturated size: no such block */
  n = (n + 15) & ~(size_t)15;
  if (!b || b->cap - b->used < n) {
    size_t cap = b ? b->cap * 2 : 64 * 1024;
    if (cap > 4u * 1024 * 1024) cap = 4u * 1024 * 1024;
    if (cap < n) cap = n;
    b = bs__malloc(ar->a, sizeof *b + cap);
    if (!b) return NULL;
    b->cap = cap;
    b->used = 0;
    b->next = ar->head;
    ar->head = b;
  }
  void *p = (unsigned char *)b->data + b->used;
  b->used += n;
  ar->bytes += n;
  return p;
}

void *bs__arena_dup(bs__arena *ar, const void *src, size_t n) {
  void *p = bs__arena_alloc(ar, n ? n : 1);
  if (p && n) memcpy(p, src, n);
  return p;
}

int bs__vals_copy(const bs_allocator *a, const bs_val *in, size_t n, bs_val **out) {
  size_t bytes = 0;
  unsigned char *p;
  for (size_t i = 0; i < n; i++) bytes += in[i].size;
  if (!(*out = bs__malloc(a, n * sizeof(bs_val) + bytes + 1))) return BS_ENOMEM;
  p = (unsigned char *)(*out + n);
  for (size_t i = 0; i < n; i++) {
    (*out)[i] = bs__val_put(&p, in[i]);
    if (!(*out)[i].data) (*out)[i].data = p;
  }
  return BS_OK;
}

void bs__arena_reset(bs__arena *ar) {
  bs__arena_blk *b = ar->head, *next;
  if (!b) return;
  next = b->next;
  b->next = NULL;
  b->used = 0;
  while (next) {
    bs__arena_blk *n2 = next->next;
    bs__free(ar->a, next);
    next = n2;
  }
  ar->bytes = 0;
}

void bs__arena_free(bs__arena *ar) {
  bs__arena_reset(ar);
  bs__free(ar->a, ar->head);
  ar->head = NULL;
}

/* ---- The hash table -------------------------------------------------------------------------- */

#define HTAB_MIN_CAP 16u

/* Inserts without a check for room: the table is at most half full, so a free entry exists. */
void bs__htab_put(bs__htab *t, uint64_t hash, uintptr_t value) {
  size_t m = t->cap - 1, i = (size_t)hash & m;
  while (t->e[i].value) i = (i + 1) & m;
  t->e[i].hash = hash;
  t->e[i].value = value;
  t->n++;
}

int bs__htab_reserve(bs__htab *t, const bs_allocator *a, size_t need) {
  bs__htab nt = {NULL, t->cap ? t->cap : HTAB_MIN_CAP, 0};
  if (need <= t->cap / 2) return BS_OK;
  while (need > nt.cap / 2) {
    if (nt.cap > SIZE_MAX / 4 / sizeof *nt.e) return BS_ENOMEM;
    nt.cap *= 2;
  }
  if (!(nt.e = bs__calloc(a, nt.cap, sizeof *nt.e))) return BS_ENOMEM;
  for (size_t i = 0; i < t->cap; i++)
    if (t->e[i].value) bs__htab_put(&nt, t->e[i].hash, t->e[i].value);
  bs__free(a, t->e);
  *t = nt;
  return BS_OK;
}

int bs__htab_add(bs__htab *t, const bs_allocator *a, uint64_t hash, uintptr_t value) {
  if ((t->n + 1) * 2 > t->cap && bs__htab_reserve(t, a, t->n + 1)) return BS_ENOMEM;
  bs__htab_put(t, hash, value);
  return BS_OK;
}

/* Position of the entry (hash, value), or cap when there is none. */
static size_t htab_pos(const bs__htab *t, uint64_t hash, uintptr_t value) {
  size_t m = t->cap - 1;
  if (!t->cap) return 0;
  for (size_t i = (size_t)hash & m; t->e[i].value; i = (i + 1) & m)
    if (t->e[i].value == value && t->e[i].hash == hash) return i;
  return t->cap;
}

void bs__htab_remove(bs__htab *t, uint64_t hash, uintptr_t value) {
  size_t m = t->cap - 1, i = htab_pos(t, hash, value);
  if (i >= t->cap) return;
  t->n--;
  /* Backward shift: entry j may fill the hole at i unless its home lies cyclically in (i, j]; a
   * lookup then never meets an empty entry before the one it looks for. */
  for (size_t j = (i + 1) & m; t->e[j].value; j = (j + 1) & m) {
    size_t home = (size_t)t->e[j].hash & m;
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      t->e[i] = t->e[j];
      i = j;
    }
  }
  t->e[i].value = 0;
}

void bs__htab_replace(bs__htab *t, uint64_t hash, uintptr_t from, uintptr_t to) {
  size_t i = htab_pos(t, hash, from);
  if (i < t->cap) t->e[i].value = to;
}

void bs__htab_clear(bs__htab *t) {
  if (t->n) memset(t->e, 0, t->cap * sizeof *t->e);
  t->n = 0;
}

void bs__htab_free(bs__htab *t, const bs_allocator *a) {
  bs__free(a, t->e);
  t->e = NULL;
  t->cap = t->n = 0;
}

uint64_t bs__val_hash(bs_val v) {
  return XXH3_64bits(v.size ? v.data : "", v.size);
}

int bs__vset_add(bs__vset *s, const bs_allocator *a, bs_val v) {
  uint64_t h = bs__val_hash(v);
  bs__hprobe p = bs__htab_probe(&s->idx, h);
  for (uintptr_t i; (i = bs__htab_next(&p));)
    if (bs__val_eq(s->v[i - 1], v)) return BS_OK;
  if (BS_GROW(a, s->v, s->cap, s->n + 1) || bs__htab_add(&s->idx, a, h, s->n + 1)) return BS_ENOMEM;
  s->v[s->n++] = v;
  return BS_OK;
}

void bs__vset_free(bs__vset *s, const bs_allocator *a) {
  bs__free(a, s->v);
  bs__htab_free(&s->idx, a);
  memset(s, 0, sizeof *s);
}
