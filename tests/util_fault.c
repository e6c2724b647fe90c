/*
 * util_fault.c: a failing allocator and a failing vtable wrapper (see util_fault.h).
 */
#include "util_fault.h"

#include "../storage_backend.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Failing allocator ---------------------------------------------------------------------- */

/* Each block carries a 16-byte header (size + magic) so that frees can be checked and counted;
 * 16 keeps the payload aligned for any type. */
#define FT_HDR   16u
#define FT_MAGIC 0x6674616cu

static int ft_should_fail(ft_alloc *f) {
  unsigned long n = __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
  unsigned long at = __atomic_load_n(&f->fail_at, __ATOMIC_RELAXED);
  if (at == 0 || n < at) return 0;
  if (n > at && !f->persistent) return 0;
  __atomic_add_fetch(&f->injected, 1, __ATOMIC_RELAXED);
  return 1;
}

static void *ft_hdr_set(unsigned char *p, size_t n) {
  uint32_t magic = FT_MAGIC;
  memcpy(p, &n, sizeof n);
  memcpy(p + 8, &magic, sizeof magic);
  return p + FT_HDR;
}

static size_t ft_hdr_size(void *user) {
  unsigned char *p = (unsigned char *)user - FT_HDR;
  uint32_t magic;
  size_t n;
  memcpy(&magic, p + 8, sizeof magic);
  memcpy(&n, p, sizeof n);
  if (magic != FT_MAGIC) {
    fprintf(stderr, "util_fault: free of a block not from this allocator (%p)\n", user);
    abort(); /* a test helper: the library's bug must stop the test loudly */
  }
  return n;
}

static void *ft_malloc(void *opaque, size_t n) {
  ft_alloc *f = opaque;
  unsigned char *p;
  if (ft_should_fail(f) || n > SIZE_MAX - FT_HDR) return NULL;
  if (!(p = malloc(n + FT_HDR))) return NULL;
  __atomic_add_fetch(&f->live, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->live_bytes, n, __ATOMIC_RELAXED);
  return ft_hdr_set(p, n);
}

static void ft_free(void *opaque, void *user) {
  ft_alloc *f = opaque;
  size_t n;
  if (!user) return;
  n = ft_hdr_size(user);
  memset((unsigned char *)user - FT_HDR + 8, 0, 4); /* catches double frees */
  __atomic_sub_fetch(&f->live, 1, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&f->live_bytes, n, __ATOMIC_RELAXED);
  free((unsigned char *)user - FT_HDR);
}

static void *ft_realloc(void *opaque, void *user, size_t n) {
  ft_alloc *f = opaque;
  unsigned char *p;
  size_t old;
  if (!user) return ft_malloc(opaque, n);
  if (ft_should_fail(f) || n > SIZE_MAX - FT_HDR) return NULL;
  old = ft_hdr_size(user);
  if (!(p = realloc((unsigned char *)user - FT_HDR, n + FT_HDR))) return NULL;
  __atomic_sub_fetch(&f->live_bytes, old, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->live_bytes, n, __ATOMIC_RELAXED);
  return ft_hdr_set(p, n);
}

void ft_alloc_init(ft_alloc *f) {
  memset(f, 0, sizeof *f);
  f->a.malloc_fn = ft_malloc;
  f->a.realloc_fn = ft_realloc;
  f->a.free_fn = ft_free;
  f->a.opaque = f;
}

void ft_alloc_arm(ft_alloc *f, unsigned long n, int persistent) {
  f->persistent = persistent;
  __atomic_store_n(&f->fail_at, n ? f->calls + n : 0, __ATOMIC_RELAXED);
}

/* ---- Failing vtable wrapper ----------------------------------------------------------------- */

/* Each wrapper has a table of its own: exactly the slots its inner handle's table has (a NULL
 * slot stays NULL, so the front answers or falls back as it would without the wrapper). */
typedef struct fw_storage {
  bs_storage base;
  bs_storage *inner;
  ft_vt_config *cfg;
  bs_storage_vtable vt;
} fw_storage;

typedef struct fw_writer {
  bs_writer base;
  bs_writer *inner;
  ft_vt_config *cfg;
  bs_writer_vtable vt;
} fw_writer;

#define FT_SLOT_NAME(name, since, params, args) [FT_##name] = #name,
static const char *const fw_names[FT_N_SLOTS] = {[FT_DESTROY] = "destroy",
                                                 [FT_WRITER_CLOSE] = "writer destroy",
                                                 BS_STORAGE_SLOTS(FT_SLOT_NAME)
                                                     BS_WRITER_SLOTS(FT_SLOT_NAME)};

static int fw_fail(ft_vt_config *c, int slot, bs_error *err) {
  unsigned long n = ++c->calls[slot];
  int st = c->status[slot] ? c->status[slot] : BS_EIO;
  if (!c->fail_at[slot] || n < c->fail_at[slot]) return BS_OK;
  if (n > c->fail_at[slot] && !c->persistent[slot]) return BS_OK;
  c->injected++;
  if (err) {
    err->code = st;
    snprintf(err->msg, sizeof err->msg, "injected fault in %s, call %lu", fw_names[slot], n);
  }
  return st;
}

/* Counts the call, injects the fault if due, else forwards. Made from storage_backend.h's slot
 * lists: a new slot needs nothing here. */
#define FW_FWD(name, since, params, args)                                                          \
  static int fw_##name params {                                                                    \
    int rc_ = fw_fail(((fw_storage *)st)->cfg, FT_##name, err);                                    \
    if (rc_) return rc_;                                                                           \
    st = ((fw_storage *)st)->inner;                                                                \
    return st->vt->name args;                                                                      \
  }
#define FW_WFWD(name, since, params, args)                                                         \
  static int fw_w_##name params {                                                                  \
    int rc_ = fw_fail(((fw_writer *)w)->cfg, FT_##name, err);                                      \
    if (rc_) return rc_;                                                                           \
    w = ((fw_writer *)w)->inner;                                                                   \
    return w->vt->name args;                                                                       \
  }
BS_STORAGE_SLOTS(FW_FWD)
BS_WRITER_SLOTS(FW_WFWD)
/* The slot when the inner table (in, of version in->version) has it set. */
#define FW_SET(name, since, params, args)                                                          \
  t->name = in->version >= (since) && in->name ? fw_##name : NULL;
#define FW_WSET(name, since, params, args)                                                         \
  t->name = in->version >= (since) && in->name ? fw_w_##name : NULL;

static void fw_writer_close(bs_writer *w) {
  bs_writer *iw = ((fw_writer *)w)->inner;
  ((fw_writer *)w)->cfg->calls[FT_WRITER_CLOSE]++;
  if (iw) iw->vt->destroy(iw);
  free(w);
}

/* The inner storage's writer_open (faults injected as in any slot), its writer wrapped. */
static int fw_open_writer(bs_writer **out, bs_storage *st, const bs_writer_options *opts,
                          bs_error *err) {
  fw_writer *w = calloc(1, sizeof *w);
  bs_writer_vtable *t;
  const bs_writer_vtable *in;
  bs_writer *iw = NULL;
  int rc;
  if (!w) return BS_ENOMEM;
  if ((rc = fw_writer_open(&iw, st, opts, err))) {
    free(w);
    return rc;
  }
  if (!iw->st) iw->st = ((fw_storage *)st)->inner;
  t = &w->vt, in = iw->vt;
  t->version = BS_WRITER_VTABLE_VERSION;
  t->destroy = fw_writer_close;
  BS_WRITER_SLOTS(FW_WSET)
  w->base.vt = t;
  w->base.st = st;
  w->inner = iw;
  w->cfg = ((fw_storage *)st)->cfg;
  *out = &w->base;
  return BS_OK;
}

static void fw_destroy(bs_storage *st) {
  fw_storage *p = (fw_storage *)st;
  p->cfg->calls[FT_DESTROY]++;
  bs_storage_close(p->inner);
  free(p);
}

int ft_wrap(bs_storage **out, bs_storage *inner, ft_vt_config *cfg) {
  fw_storage *p = calloc(1, sizeof *p);
  bs_storage_vtable *t;
  const bs_storage_vtable *in = inner->vt;
  if (!p) return BS_ENOMEM;
  t = &p->vt;
  t->version = BS_STORAGE_VTABLE_VERSION;
  t->destroy = fw_destroy;
  BS_STORAGE_SLOTS(FW_SET)
  if (t->writer_open) t->writer_open = fw_open_writer;
  p->base.vt = t;
  p->base.db = inner->db;
  p->base.stream_id = inner->stream_id;
  p->inner = inner;
  p->cfg = cfg;
  *out = &p->base;
  return BS_OK;
}

/* ---- Helpers -------------------------------------------------------------------------------- */

int ft_tmpdir(char *buf, size_t cap, const char *tag) {
  const char *t = getenv("TMPDIR");
  int n = snprintf(buf, cap, "%s/bs_%s_XXXXXX", t && *t ? t : "/tmp", tag);
  if (n < 0 || (size_t)n >= cap) return -1;
  return mkdtemp(buf) ? 0 : -1;
}

int ft_cli_path(char *buf, size_t cap) {
  char self[900];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  char *slash;
  if (n <= 0) return -1;
  self[n] = '\0';
  if (!(slash = strrchr(self, '/'))) return -1;
  *slash = '\0';
  n = snprintf(buf, cap, "%s/../bucketstore", self);
  if (n < 0 || (size_t)n >= cap) return -1;
  return access(buf, X_OK) == 0 ? 0 : -1;
}

void ft_skip_note(const char *why) {
  const char *note = getenv("BS_SKIP_NOTE");
  FILE *f;
  printf("skipped: %s\n", why);
  if (note && *note && (f = fopen(note, "a")) != NULL) {
    fprintf(f, "%s\n", why);
    fclose(f);
  }
}

void ft_rm_db(const char *dir, const char *path) {
  char lock[512];
  DIR *d;
  struct dirent *e;
  if (path) {
    unlink(path);
    snprintf(lock, sizeof lock, "%s-lock", path);
    unlink(lock);
  }
  if (!dir) return;
  /* whatever else a test left in its own directory */
  if ((d = opendir(dir)) != NULL) {
    while ((e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(lock, sizeof lock, "%s/%s", dir, e->d_name);
      unlink(lock);
    }
    closedir(d);
  }
  rmdir(dir);
}

int ft_clean_status(int rc) {
  return rc <= BS_EINVAL && rc >= BS_EUSER;
}

/* ---- Fingerprint ---------------------------------------------------------------------------- */

typedef struct fp_buf {
  char *p;
  size_t n, cap;
  int oom;
} fp_buf;

static void fp_add(fp_buf *b, const void *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->cap ? b->cap * 2 : 1024) + n;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void fp_str(fp_buf *b, const char *s) {
  fp_add(b, s, strlen(s));
}

/* bytes as printable text: hex-escaped when not plain ASCII, so any name is unambiguous */
static void fp_bytes(fp_buf *b, bs_val v) {
  const unsigned char *p = v.data;
  char x[8];
  for (size_t i = 0; i < v.size; i++) {
    if (p[i] >= 0x21 && p[i] < 0x7f && p[i] != '%' && p[i] != '|' && p[i] != '=') {
      fp_add(b, &p[i], 1);
    } else {
      snprintf(x, sizeof x, "%%%02x", p[i]);
      fp_str(b, x);
    }
  }
}

typedef struct fp_row {
  char *key, *data;
} fp_row;

typedef struct fp_rows {
  fp_row *v;
  size_t n, cap;
  uint32_t sum;
  uint64_t last, max_target;
  int oom;
} fp_rows;

static void rows_clear(fp_rows *r) {
  for (size_t i = 0; i < r->n; i++) {
    free(r->v[i].key);
    free(r->v[i].data);
  }
  r->n = 0;
}

static char *fp_key(const bs_op *op) {
  fp_buf b = {0};
  fp_bytes(&b, op->object_type);
  fp_str(&b, "|");
  fp_bytes(&b, op->object_id);
  fp_str(&b, "|");
  fp_bytes(&b, op->subkey);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p ? b.p : strdup("");
}

static int fp_on_chunk(const bs_chunk *c, void *payload) {
  fp_rows *r = payload;
  if (c->target_op > r->max_target) r->max_target = c->target_op;
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    char *k;
    size_t j;
    r->sum += op->checksum;
    r->last = op->op_id;
    if (op->type == BS_OP_CLEAR) rows_clear(r);
    if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) continue;
    if (!(k = fp_key(op))) goto oom;
    for (j = 0; j < r->n && strcmp(r->v[j].key, k); j++) {
    }
    if (j < r->n) { /* drop the old version */
      free(r->v[j].key);
      free(r->v[j].data);
      r->v[j] = r->v[--r->n];
    }
    if (op->type == BS_OP_REMOVE) {
      free(k);
      continue;
    }
    if (r->n == r->cap) {
      size_t cap = r->cap ? r->cap * 2 : 16;
      fp_row *v = realloc(r->v, cap * sizeof *v);
      if (!v) {
        free(k);
        goto oom;
      }
      r->v = v;
      r->cap = cap;
    }
    {
      fp_buf d = {0};
      fp_bytes(&d, op->data);
      fp_str(&d, "");
      r->v[r->n].key = k;
      r->v[r->n].data = d.p;
      r->n++;
      if (d.oom || !d.p) goto oom;
    }
  }
  return 0;
oom:
  r->oom = 1;
  return BS_ENOMEM;
}

static int cmp_row(const void *a, const void *b) {
  return strcmp(((const fp_row *)a)->key, ((const fp_row *)b)->key);
}
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int ft_strs_add(const bs_val *v, void *payload) {
  ft_strs *s = payload;
  fp_buf b = {0};
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    char **p = realloc(s->v, cap * sizeof *p);
    if (!p) return BS_ENOMEM;
    s->v = p;
    s->cap = cap;
  }
  fp_bytes(&b, *v);
  fp_str(&b, "");
  if (b.oom) {
    free(b.p);
    return BS_ENOMEM;
  }
  s->v[s->n++] = b.p;
  return 0;
}

void ft_strs_sort(ft_strs *s) {
  if (s->n) qsort(s->v, s->n, sizeof *s->v, cmp_str); /* qsort(NULL, 0) is UB (UBSan) */
}

int ft_strs_has(const ft_strs *s, bs_val v) {
  fp_buf b = {0};
  int hit = 0;
  fp_bytes(&b, v);
  fp_str(&b, "");
  for (size_t i = 0; i < s->n && b.p && !hit; i++) hit = strcmp(s->v[i], b.p) == 0;
  free(b.p);
  return hit;
}

void ft_strs_free(ft_strs *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

static int fp_bucket(bs_storage *st, uint64_t C, bs_val name, fp_buf *b, bs_error *err) {
  fp_rows r = {0};
  bs_checksum ck;
  bs_bucket_request req;
  int more = 1, rc;
  char line[96];
  if ((rc = bs_get_checksums(&ck, st, C, &name, 1, err)) != BS_OK) return rc;
  req.bucket = name;
  req.after = 0;
  while (more) {
    rc = bs_get_bucket_data(&more, st, C, &req, 1, NULL, fp_on_chunk, &r, err);
    if (rc != BS_OK) goto out;
    req.after = r.last;
  }
  if (r.sum != ck.checksum) {
    rc = FT_EMISMATCH;
    if (err) {
      err->code = rc;
      snprintf(err->msg, sizeof err->msg, "bucket checksum %u at %llu != sum of its ops %u",
               ck.checksum, (unsigned long long)C, r.sum);
    }
    goto out;
  }
  fp_str(b, "B ");
  fp_bytes(b, name);
  /* a MOVE/CLEAR pointing above C: compaction to a newer horizon changed what C shows (contract.md
   * 5.5); marked so that callers comparing two reads of C can tell */
  snprintf(line, sizeof line, " ck=%u rows=%zu%s\n", ck.checksum, r.n,
           r.max_target > C ? " target>C" : "");
  fp_str(b, line);
  if (r.n) qsort(r.v, r.n, sizeof *r.v, cmp_row);
  for (size_t i = 0; i < r.n; i++) {
    fp_str(b, "  ");
    fp_str(b, r.v[i].key);
    fp_str(b, "=");
    fp_str(b, r.v[i].data);
    fp_str(b, "\n");
  }
out:
  rows_clear(&r);
  free(r.v);
  if (rc == BS_OK && r.oom) rc = BS_ENOMEM;
  return rc;
}

int ft_fingerprint(bs_storage *st, uint64_t C, const bs_val *buckets, size_t nb,
                   const bs_val *lookups, size_t nl, char **out, bs_error *err) {
  fp_buf b = {0};
  char line[64];
  int rc = BS_OK;
  *out = NULL;
  snprintf(line, sizeof line, "C=%llu\n", (unsigned long long)C);
  fp_str(&b, line);
  for (size_t i = 0; i < nb && rc == BS_OK; i++) rc = fp_bucket(st, C, buckets[i], &b, err);
  for (size_t i = 0; i < nl && rc == BS_OK; i++) {
    ft_strs ps = {0};
    rc = bs_get_parameter_sets(st, C, &lookups[i], 1, (size_t)1 << 30, ft_strs_add, &ps, err);
    if (rc == BS_OK) {
      ft_strs_sort(&ps);
      fp_str(&b, "L ");
      fp_bytes(&b, lookups[i]);
      fp_str(&b, ":");
      for (size_t j = 0; j < ps.n; j++) {
        fp_str(&b, " ");
        fp_str(&b, ps.v[j]);
      }
      fp_str(&b, "\n");
    }
    ft_strs_free(&ps);
  }
  if (rc == BS_OK && b.oom) rc = BS_ENOMEM;
  if (rc != BS_OK) {
    free(b.p);
    return rc;
  }
  *out = b.p;
  return BS_OK;
}
