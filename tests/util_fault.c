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

typedef struct fw_storage {
  bs_storage base;
  bs_storage *inner;
  ft_vt_config *cfg;
} fw_storage;

typedef struct fw_writer {
  bs_writer base;
  bs_writer *inner;
  ft_vt_config *cfg;
} fw_writer;

static int fw_fail(ft_vt_config *c, int slot, bs_error *err) {
  unsigned long n = ++c->calls[slot];
  int st = c->status[slot] ? c->status[slot] : BS_EIO;
  if (!c->fail_at[slot] || n < c->fail_at[slot]) return BS_OK;
  if (n > c->fail_at[slot] && !c->persistent[slot]) return BS_OK;
  c->injected++;
  if (err) {
    err->code = st;
    snprintf(err->msg, sizeof err->msg, "injected fault in slot %d, call %lu", slot, n);
  }
  return st;
}

#define FS(st) ((fw_storage *)(st))
#define FW(w)  ((fw_writer *)(w))
/* Counts the call, injects the fault if due, else forwards (NULL slot: BS_EUNSUPPORTED). */
#define FWD(cfg, slotno, inner, slot, ...)                                                         \
  do {                                                                                             \
    int fw_rc_ = fw_fail((cfg), (slotno), err);                                                    \
    if (fw_rc_) return fw_rc_;                                                                     \
    if (!(inner)->vt->slot) return BS_EUNSUPPORTED;                                                \
    return (inner)->vt->slot(__VA_ARGS__);                                                         \
  } while (0)
#define SFWD(st, slotno, slot, ...)                                                                \
  FWD(FS(st)->cfg, slotno, FS(st)->inner, slot, FS(st)->inner, __VA_ARGS__)
#define WFWD(w, slotno, slot, ...)                                                                 \
  FWD(FW(w)->cfg, slotno, FW(w)->inner, slot, FW(w)->inner, __VA_ARGS__)
/* The same for a slot whose outputs come before the handle: the caller places the inner one. */
#define SFWD_AT(st, slotno, slot, ...) FWD(FS(st)->cfg, slotno, FS(st)->inner, slot, __VA_ARGS__)
#define WFWD_AT(w, slotno, slot, ...)  FWD(FW(w)->cfg, slotno, FW(w)->inner, slot, __VA_ARGS__)

static const bs_writer_vtable fw_writer_vt;

static void fw_destroy(bs_storage *st) {
  fw_storage *p = FS(st);
  p->cfg->calls[FT_DESTROY]++;
  bs_storage_close(p->inner);
  free(p);
}

static int fw_writer_open(bs_writer **out, bs_storage *st, const bs_writer_options *opts,
                          bs_error *err) {
  bs_storage *in = FS(st)->inner;
  bs_writer *iw = NULL;
  fw_writer *w;
  int rc;
  if ((rc = fw_fail(FS(st)->cfg, FT_WRITER_OPEN, err))) return rc;
  if (!in->vt->writer_open) return BS_EUNSUPPORTED;
  if (!(w = calloc(1, sizeof *w))) return BS_ENOMEM;
  if ((rc = in->vt->writer_open(&iw, in, opts, err))) {
    free(w);
    return rc;
  }
  if (!iw->st) iw->st = in;
  w->base.vt = &fw_writer_vt;
  w->base.st = st;
  w->inner = iw;
  w->cfg = FS(st)->cfg;
  *out = &w->base;
  return BS_OK;
}

static void fw_writer_close(bs_writer *w) {
  bs_writer *iw = FW(w)->inner;
  FW(w)->cfg->calls[FT_WRITER_CLOSE]++;
  if (iw) iw->vt->destroy(iw);
  free(w);
}

static int fw_writer_truncate(bs_writer *w, bs_val table, int drop, bs_error *err) {
  WFWD(w, FT_WRITER_TRUNCATE, truncate, table, drop, err);
}
static int fw_writer_flush(uint64_t *last, bs_writer *w, const bs_write_batch *b, bs_error *err) {
  WFWD_AT(w, FT_WRITER_FLUSH, flush, last, FW(w)->inner, b, err);
}
static int fw_writer_commit(bs_commit_result *out, bs_writer *w, const bs_write_batch *b,
                            bs_val lsn, int ce, bs_error *err) {
  WFWD_AT(w, FT_WRITER_COMMIT, commit, out, FW(w)->inner, b, lsn, ce, err);
}
static int fw_writer_snapshot_done(bs_writer *w, bs_val lsn, bs_error *err) {
  WFWD(w, FT_WRITER_SNAPSHOT_DONE, snapshot_done, lsn, err);
}
static int fw_writer_resume_lsn(bs_writer *w, bs_val lsn, bs_error *err) {
  WFWD(w, FT_WRITER_RESUME_LSN, resume_lsn, lsn, err);
}
static int fw_writer_source_row(bs_writer *w, const bs_write_batch *b, bs_val table, bs_val id,
                                int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  WFWD(w, FT_WRITER_SOURCE_ROW, source_row, b, table, id, fn, payload, err);
}
static int fw_get_checkpoint(bs_checkpoint *out, bs_storage *st, bs_error *err) {
  SFWD_AT(st, FT_GET_CHECKPOINT, get_checkpoint, out, FS(st)->inner, err);
}
static int fw_bucket_data(int *more, bs_storage *st, uint64_t cp, const bs_bucket_request *req,
                          size_t n, const bs_batch_options *o, int (*fn)(const bs_chunk *, void *),
                          void *payload, bs_error *err) {
  SFWD_AT(st, FT_BUCKET_DATA, bucket_data, more, FS(st)->inner, cp, req, n, o, fn, payload, err);
}
static int fw_checksums(bs_checksum *out, uint64_t *gen, bs_storage *st, uint64_t cp,
                        const bs_val *b, size_t n, bs_error *err) {
  SFWD_AT(st, FT_CHECKSUMS, checksums, out, gen, FS(st)->inner, cp, b, n, err);
}
static int fw_checksum_ranges(bs_checksum *out, int *cleared, uint64_t *gen, bs_storage *st,
                              uint64_t from, uint64_t to, const bs_val *b, size_t n,
                              bs_error *err) {
  SFWD_AT(st, FT_CHECKSUM_RANGES, checksum_ranges, out, cleared, gen, FS(st)->inner, from, to, b, n,
          err);
}
static int fw_checkpoint_changes(bs_storage *st, uint64_t from, uint64_t to,
                                 int (*fn)(const bs_checkpoint_changes *, void *), void *payload,
                                 bs_error *err) {
  SFWD(st, FT_CHECKPOINT_CHANGES, checkpoint_changes, from, to, fn, payload, err);
}
static int fw_parameter_sets(bs_storage *st, uint64_t cp, const bs_val *l, size_t n, size_t limit,
                             int (*fn)(const bs_val *, void *), void *payload, bs_error *err) {
  SFWD(st, FT_PARAMETER_SETS, parameter_sets, cp, l, n, limit, fn, payload, err);
}
static int fw_set_wcp_mode(bs_storage *st, bs_write_checkpoint_mode m, bs_val ev, bs_error *err) {
  SFWD(st, FT_SET_WCP_MODE, set_write_checkpoint_mode, m, ev, err);
}
static int fw_create_managed(uint64_t *ids, int *adv, bs_storage *st, const bs_managed_request *r,
                             size_t n, bs_error *err) {
  SFWD_AT(st, FT_CREATE_MANAGED, create_managed_write_checkpoints, ids, adv, FS(st)->inner, r, n,
          err);
}
static int fw_last_wcp(uint64_t *id, int *found, bs_storage *st, bs_val user, const bs_head *h,
                       size_t nh, bs_error *err) {
  SFWD_AT(st, FT_LAST_WCP, last_write_checkpoint, id, found, FS(st)->inner, user, h, nh, err);
}
static int fw_delete_wcp(uint64_t *deleted, bs_storage *st, int64_t before, bs_error *err) {
  SFWD_AT(st, FT_DELETE_WCP, delete_checkpoint_requests_before, deleted, FS(st)->inner, before,
          err);
}
static int fw_compact(bs_compact_stats *s, bs_storage *st, const bs_compact_options *o,
                      bs_error *err) {
  SFWD_AT(st, FT_COMPACT, compact, s, FS(st)->inner, o, err);
}
static int fw_compact_initial(uint64_t *buckets, bs_storage *st, uint64_t max_op,
                              uint64_t min_changes, bs_error *err) {
  SFWD_AT(st, FT_COMPACT_INITIAL, compact_initial_replication, buckets, FS(st)->inner, max_op,
          min_changes, err);
}
static int fw_get_status(bs_status *out, bs_storage *st, bs_error *err) {
  SFWD_AT(st, FT_GET_STATUS, get_status, out, FS(st)->inner, err);
}
static int fw_report_error(bs_storage *st, const char *msg, bs_error *err) {
  SFWD(st, FT_REPORT_ERROR, report_error, msg, err);
}
static int fw_clear(bs_storage *st, bs_error *err) {
  SFWD(st, FT_CLEAR, clear, err);
}
static int fw_terminate(bs_storage *st, int clear, bs_error *err) {
  SFWD(st, FT_TERMINATE, terminate, clear, err);
}

static int fw_list_buckets(bs_storage *st, bs_val after, int (*fn)(const bs_bucket_info *, void *),
                           void *payload, bs_error *err) {
  bs_storage *in = FS(st)->inner;
  int rc = fw_fail(FS(st)->cfg, FT_LIST_BUCKETS, err);
  if (rc) return rc;
  if (!in->vt->list_buckets) return BS_EUNSUPPORTED;
  return in->vt->list_buckets(in, after, fn, payload, err);
}

/* Never fails by injection: the lock is the front's rule, not a call a host makes. */
static int fw_writer_lock(bs_storage *st, int snapshot, int lock, bs_error *err) {
  bs_storage *in = FS(st)->inner;
  return in->vt->writer_lock ? in->vt->writer_lock(in, snapshot, lock, err) : BS_OK;
}

static const bs_writer_vtable fw_writer_vt = {
    .version = BS_WRITER_VTABLE_VERSION,
    .destroy = fw_writer_close,
    .truncate = fw_writer_truncate,
    .flush = fw_writer_flush,
    .commit = fw_writer_commit,
    .snapshot_done = fw_writer_snapshot_done,
    .resume_lsn = fw_writer_resume_lsn,
    .source_row = fw_writer_source_row,
};

static const bs_storage_vtable fw_vtable = {
    .version = BS_STORAGE_VTABLE_VERSION,
    .destroy = fw_destroy,
    .writer_open = fw_writer_open,
    .get_checkpoint = fw_get_checkpoint,
    .bucket_data = fw_bucket_data,
    .checksums = fw_checksums,
    .checksum_ranges = fw_checksum_ranges,
    .checkpoint_changes = fw_checkpoint_changes,
    .parameter_sets = fw_parameter_sets,
    .set_write_checkpoint_mode = fw_set_wcp_mode,
    .create_managed_write_checkpoints = fw_create_managed,
    .last_write_checkpoint = fw_last_wcp,
    .delete_checkpoint_requests_before = fw_delete_wcp,
    .compact = fw_compact,
    .compact_initial_replication = fw_compact_initial,
    .get_status = fw_get_status,
    .report_error = fw_report_error,
    .clear = fw_clear,
    .terminate = fw_terminate,
    .list_buckets = fw_list_buckets,
    .writer_lock = fw_writer_lock,
};

int ft_wrap(bs_storage **out, bs_storage *inner, ft_vt_config *cfg) {
  fw_storage *p = calloc(1, sizeof *p);
  if (!p) return BS_ENOMEM;
  p->base.vt = &fw_vtable;
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

uint64_t ft_env_seed(void) {
  const char *s = getenv("BS_SEED");
  return s && *s ? strtoull(s, NULL, 10) : 20240601u;
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
