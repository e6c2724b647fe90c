/*
 * cli_tools.c: the operator's subcommands, in the spirit of mdb_stat / mdb_dump: `stat` (counts
 * and the most fragmented buckets), `dump` (a stream or one bucket as JSON lines), `compact`
 * (full, incremental or initial-replication, with progress and Ctrl-C) and `checkpoint`
 * (print the current checkpoint; --watch follows commits made by another process). They use the
 * public API only (cli_buckets_list collects bs_list_buckets).
 */
#include "cli.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Small shared pieces ------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  unsigned long long v;
  if (!s || !*s || *s == '-') return -1;
  v = strtoull(s, &end, 10);
  if (*end) return -1;
  *out = (uint64_t)v;
  return 0;
}

/* --name VALUE or --name=VALUE at argv[*i]: returns the value (advancing *i), NULL otherwise;
 * *bad = 1 when the option is there without a value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *bad) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    fprintf(stderr, "bucketstore: %s needs a value\n", name);
    *bad = 1;
    return NULL;
  }
  return argv[++*i];
}

/* An unsigned option; returns 1 consumed, 0 not this option, -1 bad value. */
static int opt_u64(int argc, char **argv, int *i, const char *name, uint64_t *out) {
  int bad = 0;
  const char *v = opt_value(argc, argv, i, name, &bad);
  if (bad) return -1;
  if (!v) return 0;
  if (parse_u64(v, out)) {
    fprintf(stderr, "bucketstore: %s wants a non-negative integer, not '%s'\n", name, v);
    return -1;
  }
  return 1;
}

static bs_val bs_val_of(const char *s) {
  bs_val v;
  v.data = s;
  v.size = strlen(s);
  return v;
}

static json_t *j_id(uint64_t x) {
  char buf[24];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)x);
  return json_string(buf);
}

/* Prints o as one compact line and releases it; BS_ENOMEM if it could not be built. */
static int print_line(json_t *o) {
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  if (!s) return BS_ENOMEM;
  fputs(s, stdout);
  fputc('\n', stdout);
  free(s);
  return BS_OK;
}

static int report(const char *cmd, int rc, const bs_error *err) {
  fprintf(stderr, "bucketstore %s: %s: %s\n", cmd, cli_code_name(rc), cli_error_text(rc, err));
  return 1;
}

/* --stream ID: shared by every command here. */
typedef struct common_opts {
  uint64_t stream; /* 0 = the active stream, else the newest */
} common_opts;

static int common_opt(int argc, char **argv, int *i, common_opts *o) {
  int r = opt_u64(argc, argv, i, "--stream", &o->stream);
  if (r > 0 && o->stream > UINT32_MAX) {
    fprintf(stderr, "bucketstore: --stream %llu is out of range\n", (unsigned long long)o->stream);
    return -1;
  }
  return r;
}

static int open_stream(const char *cmd, cli_db *c, uint64_t stream, bs_storage **st) {
  bs_error err = {0, ""};
  int rc = bs_storage_open(st, c->db, (uint32_t)stream, &err);
  if (rc == BS_ENOTFOUND) {
    if (stream)
      fprintf(stderr, "bucketstore %s: no stream %llu\n", cmd, (unsigned long long)stream);
    else
      fprintf(stderr, "bucketstore %s: the database has no stream\n", cmd);
    return 1;
  }
  return rc ? report(cmd, rc, &err) : 0;
}

/* Ctrl-C: the first one sets the flag (the long-running commands stop between transactions);
 * a second one kills as usual. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
  signal(SIGINT, SIG_DFL);
}

static void catch_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

/* ---- Row identities: live rows of a bucket, for fragmentation -------------------------------- */

/* Open addressing over the identity bytes (u16 len | object_type | u16 len | object_id |
 * u8 len | subkey); live = the latest PUT/REMOVE of the row was a PUT. */
typedef struct row_slot {
  char *key;
  size_t size;
  int live;
} row_slot;

typedef struct row_set {
  row_slot *slots;
  size_t cap, n, live;
} row_set;

static uint64_t fnv1a(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  while (n--) h = (h ^ (unsigned char)*p++) * 1099511628211ull;
  return h;
}

static void rows_free(row_set *s) {
  size_t i;
  for (i = 0; i < s->cap; i++) free(s->slots[i].key);
  free(s->slots);
  memset(s, 0, sizeof *s);
}

static row_slot *rows_find(row_slot *slots, size_t cap, const char *key, size_t size) {
  size_t i = (size_t)fnv1a(key, size) & (cap - 1);
  while (slots[i].key && !(slots[i].size == size && memcmp(slots[i].key, key, size) == 0))
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

static int rows_grow(row_set *s) {
  size_t ncap = s->cap ? s->cap * 2 : 256, i;
  row_slot *ns = calloc(ncap, sizeof *ns);
  if (!ns) return BS_ENOMEM;
  for (i = 0; i < s->cap; i++)
    if (s->slots[i].key) *rows_find(ns, ncap, s->slots[i].key, s->slots[i].size) = s->slots[i];
  free(s->slots);
  s->slots = ns;
  s->cap = ncap;
  return BS_OK;
}

static int rows_visit(row_set *s, const bs_op *op) {
  static char buf[2 + 65535 + 2 + 65535 + 1 + 255]; /* one thread: the CLI */
  char *p = buf;
  row_slot *slot;
  int live = op->type == BS_OP_PUT;
  if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) return BS_OK;
  *p++ = (char)(op->object_type.size >> 8);
  *p++ = (char)op->object_type.size;
  if (op->object_type.size) memcpy(p, op->object_type.data, op->object_type.size);
  p += op->object_type.size;
  *p++ = (char)(op->object_id.size >> 8);
  *p++ = (char)op->object_id.size;
  if (op->object_id.size) memcpy(p, op->object_id.data, op->object_id.size);
  p += op->object_id.size;
  *p++ = (char)op->subkey.size;
  if (op->subkey.size) memcpy(p, op->subkey.data, op->subkey.size & 0xff);
  p += op->subkey.size & 0xff;
  if ((s->n + 1) * 2 > s->cap && rows_grow(s)) return BS_ENOMEM;
  slot = rows_find(s->slots, s->cap, buf, (size_t)(p - buf));
  if (!slot->key) {
    if (!(slot->key = malloc((size_t)(p - buf)))) return BS_ENOMEM;
    memcpy(slot->key, buf, (size_t)(p - buf));
    slot->size = (size_t)(p - buf);
    s->n++;
  } else if (slot->live) {
    s->live--;
  }
  slot->live = live;
  if (live) s->live++;
  return BS_OK;
}

/* ---- stat ------------------------------------------------------------------------------------ */

typedef struct bucket_fig {
  const cli_bucket *b;
  uint64_t ops, live, by_type[5];
  double ratio; /* ops per live row; a bucket with ops and no live row counts as ops / 1 */
} bucket_fig;

typedef struct read_acc {
  bucket_fig *f;
  row_set rows;
  uint64_t next_after; /* where the next batch starts */
} read_acc;

static int fig_chunk(const bs_chunk *c, void *payload) {
  read_acc *a = payload;
  size_t i;
  for (i = 0; i < c->n_ops; i++) {
    bs_op_type t = c->ops[i].type;
    a->f->ops++;
    if (t >= BS_OP_PUT && t <= BS_OP_CLEAR) a->f->by_type[t]++;
    if (rows_visit(&a->rows, &c->ops[i])) return BS_ENOMEM;
  }
  a->next_after = c->next_after;
  return 0;
}

/* Reads one bucket from the start up to `at`, in batches, counting ops and live rows. */
static int read_bucket(bs_storage *st, uint64_t at, bucket_fig *f, bs_error *err) {
  bs_batch_options o = BS_BATCH_OPTIONS_INIT;
  bs_bucket_request req;
  read_acc a;
  int rc = BS_OK, more = 1;
  memset(&a, 0, sizeof a);
  a.f = f;
  req.bucket.data = f->b->name;
  req.bucket.size = f->b->name_size;
  o.limit = 10000;
  while (more && rc == BS_OK) {
    req.after = a.next_after;
    rc = bs_get_bucket_data(&more, st, at, &req, 1, &o, fig_chunk, &a, err);
    if (more && a.next_after == req.after) break; /* no progress: never spin */
  }
  f->live = a.rows.live;
  f->ratio = (double)f->ops / (double)(f->live ? f->live : 1);
  rows_free(&a.rows);
  return rc;
}

static int fig_cmp(const void *x, const void *y) {
  const bucket_fig *a = x, *b = y;
  if (a->ratio != b->ratio) return a->ratio < b->ratio ? 1 : -1;
  if (a->ops != b->ops) return a->ops < b->ops ? 1 : -1;
  return 0;
}

static void human(char *out, size_t n, uint64_t bytes) {
  const char *unit = "KMGT";
  double v = (double)bytes;
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(out, n, "%llu", (unsigned long long)bytes);
  else
    snprintf(out, n, "%.1f%c", v, unit[u]);
}

typedef struct stat_opts {
  common_opts c;
  uint64_t top;
  int no_buckets;
} stat_opts;

static int stat_opt(int argc, char **argv, int *i, void *payload) {
  stat_opts *o = payload;
  int r;
  if ((r = common_opt(argc, argv, i, &o->c)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--top", &o->top)) != 0) return r;
  if (strcmp(argv[*i], "--no-buckets") == 0) return o->no_buckets = 1;
  return 0;
}

typedef struct stream_list {
  bs_stream_info *v;
  char (*names)[BS_MAX_STREAM_NAME + 1];
  size_t n, cap;
} stream_list;

static int collect_stream(const bs_stream_info *info, void *payload) {
  stream_list *l = payload;
  if (l->n == l->cap) {
    size_t ncap = l->cap ? l->cap * 2 : 8;
    bs_stream_info *v = realloc(l->v, ncap * sizeof *v);
    char(*names)[BS_MAX_STREAM_NAME + 1];
    if (!v) return BS_ENOMEM;
    l->v = v;
    if (!(names = realloc(l->names, ncap * sizeof *names))) return BS_ENOMEM;
    l->names = names;
    l->cap = ncap;
  }
  l->v[l->n] = *info;
  memcpy(l->names[l->n], info->name.data, info->name.size);
  l->names[l->n][info->name.size] = '\0';
  l->v[l->n].name.data = NULL; /* borrowed: use names[] */
  l->n++;
  return 0;
}

/* One stream: header, ops by type, and the `top` most fragmented buckets. */
static int stat_stream(cli_db *c, const bs_stream_info *info, const char *name,
                       const stat_opts *o) {
  bs_error err = {0, ""};
  bs_storage *st = NULL;
  bs_status status;
  cli_bucket *b = NULL;
  bucket_fig *f = NULL;
  uint64_t types[5] = {0}, bytes = 0, ops = 0, live = 0;
  size_t n = 0, i;
  int rc;
  if ((rc = bs_storage_open(&st, c->db, info->id, &err)) ||
      (rc = bs_get_status(&status, st, &err)) || (rc = cli_buckets_list(st, &b, &n, &err)))
    goto fail;
  printf("\nstream %u \"%s\" %s, hash %s: checkpoint %llu, last op %llu, %zu bucket%s\n", info->id,
         name, cli_state_name(info->state), info->hash == BS_HASH_SHA256 ? "sha256" : "xxh3",
         (unsigned long long)status.checkpoint, (unsigned long long)status.last_persisted_op, n,
         n == 1 ? "" : "s");
  if (o->no_buckets || n == 0) goto done;
  if (!(f = calloc(n, sizeof *f))) {
    rc = BS_ENOMEM;
    goto fail;
  }
  /* read at the last persisted op: every op the bucket states count */
  for (i = 0; i < n; i++) {
    f[i].b = &b[i];
    if ((rc = read_bucket(st, status.last_persisted_op, &f[i], &err))) goto fail;
    for (int t = 1; t <= 4; t++) types[t] += f[i].by_type[t];
    bytes += b[i].bytes;
    ops += f[i].ops;
    live += f[i].live;
  }
  printf("  ops %llu (put %llu, remove %llu, move %llu, clear %llu), live rows %llu, "
         "%.2f ops per live row, op bytes %llu\n",
         (unsigned long long)ops, (unsigned long long)types[BS_OP_PUT],
         (unsigned long long)types[BS_OP_REMOVE], (unsigned long long)types[BS_OP_MOVE],
         (unsigned long long)types[BS_OP_CLEAR], (unsigned long long)live,
         (double)ops / (double)(live ? live : 1), (unsigned long long)bytes);
  qsort(f, n, sizeof *f, fig_cmp);
  printf("  fragmentation (ops per live row), worst first:\n");
  printf("  %10s %10s %10s %9s  %s\n", "ops/live", "ops", "live", "bytes", "bucket");
  for (i = 0; i < n && i < o->top; i++) {
    char hb[32];
    human(hb, sizeof hb, f[i].b->bytes);
    printf("  %10.2f %10llu %10llu %9s  %s\n", f[i].ratio, (unsigned long long)f[i].ops,
           (unsigned long long)f[i].live, hb, f[i].b->name);
  }
  if (n > o->top) printf("  ... %zu more (--top N)\n", n - (size_t)o->top);
done:
  free(f);
  cli_buckets_free(b, n);
  bs_storage_close(st);
  return 0;
fail:
  free(f);
  cli_buckets_free(b, n);
  bs_storage_close(st);
  return report("stat", rc, &err);
}

int cli_stat(int argc, char **argv) {
  cli_db c = {0};
  stat_opts o;
  stream_list l = {0};
  bs_stat s;
  bs_error err = {0, ""};
  size_t i;
  int rc;
  memset(&o, 0, sizeof o);
  o.top = 10;
  if ((rc = cli_open_file(&c, argc, argv, 1, stat_opt, &o))) goto done;
  if ((rc = bs_db_stat(&s, c.db, &err)) || (rc = bs_stream_list(c.db, collect_stream, &l, &err))) {
    rc = report("stat", rc, &err);
    goto done;
  }
  printf("file               %s (%llu bytes)\n", cli_db_name(&c), (unsigned long long)s.file_bytes);
  printf("streams            %llu\n", (unsigned long long)s.streams);
  printf("buckets            %llu\n", (unsigned long long)s.buckets);
  printf("ops                %llu (put %llu, remove %llu, move %llu, clear %llu)\n",
         (unsigned long long)(s.ops_put + s.ops_remove + s.ops_move + s.ops_clear),
         (unsigned long long)s.ops_put, (unsigned long long)s.ops_remove,
         (unsigned long long)s.ops_move, (unsigned long long)s.ops_clear);
  printf("parameter entries  %llu\n", (unsigned long long)s.parameter_entries);
  printf("source records     %llu\n", (unsigned long long)s.source_records);
  printf("write checkpoints  %llu\n", (unsigned long long)s.write_checkpoints);
  printf("reclaimable        %llu bytes on free pages (reused by later writes; the file never "
         "shrinks: 'bucketstore backup' writes a copy without them)\n",
         (unsigned long long)s.reclaimable_bytes);
  for (i = 0; i < l.n && rc == 0; i++)
    if (!o.c.stream || l.v[i].id == o.c.stream) rc = stat_stream(&c, &l.v[i], l.names[i], &o);
done:
  free(l.v);
  free(l.names);
  cli_db_close(&c);
  return rc;
}

/* ---- dump ------------------------------------------------------------------------------------ */

typedef struct dump_opts {
  common_opts c;
  const char *bucket;
  uint64_t checkpoint;
  int has_checkpoint, all;
} dump_opts;

static int dump_opt(int argc, char **argv, int *i, void *payload) {
  dump_opts *o = payload;
  int r, bad = 0;
  const char *v;
  if ((r = common_opt(argc, argv, i, &o->c)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--checkpoint", &o->checkpoint)) != 0) {
    o->has_checkpoint = 1;
    return r;
  }
  if (strcmp(argv[*i], "--all") == 0) return o->all = 1;
  if ((v = opt_value(argc, argv, i, "--bucket", &bad))) o->bucket = v;
  return bad ? -1 : v != NULL;
}

static int dump_chunk(const bs_chunk *c, void *payload) {
  uint64_t *next = payload;
  size_t i;
  for (i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "bucket", cli_json_bytes(c->bucket)) ||
        json_object_set_new(o, "op_id", j_id(op->op_id)) ||
        json_object_set_new(o, "op", json_string(cli_op_name(op->type))) ||
        json_object_set_new(o, "object_type", cli_json_bytes(op->object_type)) ||
        json_object_set_new(o, "object_id", cli_json_bytes(op->object_id)) ||
        json_object_set_new(o, "subkey", cli_json_bytes(op->subkey)) ||
        json_object_set_new(o, "checksum", json_integer((json_int_t)op->checksum)) ||
        (op->target_op && json_object_set_new(o, "target_op", j_id(op->target_op))) ||
        json_object_set_new(o, "data", cli_json_bytes(op->data))) {
      json_decref(o);
      return BS_ENOMEM;
    }
    if (print_line(o)) return BS_ENOMEM;
  }
  *next = c->next_after;
  return 0;
}

/* Every op of one bucket up to at, then a line with its checksum and count at at. */
static int dump_bucket(bs_storage *st, uint64_t at, bs_val name, bs_error *err) {
  bs_bucket_request req;
  bs_checksum ck;
  uint64_t next = 0;
  int rc, more = 1;
  req.bucket = name;
  while (more) {
    req.after = next;
    if ((rc = bs_get_bucket_data(&more, st, at, &req, 1, NULL, dump_chunk, &next, err))) return rc;
    if (more && next == req.after) break;
  }
  if ((rc = bs_get_checksums(&ck, st, at, &name, 1, err))) return rc;
  /* bucket checksums are signed 32-bit in the sync protocol */
  return print_line(json_pack("{s:o,s:I,s:I}", "bucket", cli_json_bytes(name), "checksum",
                              (json_int_t)(int32_t)ck.checksum, "count", (json_int_t)ck.count));
}

/* Bytes as lowercase hex; buf is grown as needed and reused (free it after the last call). */
typedef struct hex_buf {
  char *p;
  size_t cap;
} hex_buf;

static json_t *j_hex(hex_buf *b, bs_val v) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *p = v.data;
  size_t i;
  if (v.size * 2 + 1 > b->cap) {
    char *np = realloc(b->p, v.size * 2 + 1);
    if (!np) return NULL;
    b->p = np;
    b->cap = v.size * 2 + 1;
  }
  for (i = 0; i < v.size; i++) {
    b->p[2 * i] = digits[p[i] >> 4];
    b->p[2 * i + 1] = digits[p[i] & 15];
  }
  return json_stringn(b->p ? b->p : "", v.size * 2);
}

/* One {"record","stream","key","value"} line: what `load` rebuilds the file from. */
static int dump_record(const bs_record *r, void *payload) {
  hex_buf *b = payload;
  json_t *k = j_hex(b, r->key);
  json_t *v = k ? j_hex(b, r->value) : NULL;
  return print_line(json_pack("{s:s,s:I,s:o,s:o}", "record", r->table, "stream",
                              (json_int_t)r->stream, "key", k, "value", v));
}

/* The header line, then every op of one bucket or of every bucket with its checksum line. */
static int dump_stream(cli_db *c, uint32_t id, const dump_opts *o, bs_error *err) {
  bs_storage *st = NULL;
  bs_status s;
  cli_bucket *b = NULL;
  size_t n = 0, i;
  uint64_t at;
  int rc;
  if ((rc = bs_storage_open(&st, c->db, id, err)) || (rc = bs_get_status(&s, st, err))) goto done;
  /* default: what clients see (the checkpoint); before the first one, everything persisted */
  at = o->has_checkpoint ? o->checkpoint : s.checkpoint ? s.checkpoint : s.last_persisted_op;
  if ((rc = print_line(json_pack("{s:i,s:s,s:o,s:o,s:o}", "stream", (int)bs_storage_stream_id(st),
                                 "state", cli_state_name(s.state), "checkpoint", j_id(s.checkpoint),
                                 "last_op", j_id(s.last_persisted_op), "read_at", j_id(at)))))
    goto done;
  if (o->bucket) {
    rc = dump_bucket(st, at, bs_val_of(o->bucket), err);
  } else if (!(rc = cli_buckets_list(st, &b, &n, err))) {
    for (i = 0; i < n && rc == BS_OK; i++) {
      bs_val name = {b[i].name, b[i].name_size};
      rc = dump_bucket(st, at, name, err);
    }
  }
done:
  cli_buckets_free(b, n);
  bs_storage_close(st);
  return rc;
}

int cli_dump(int argc, char **argv) {
  cli_db c = {0};
  dump_opts o;
  stream_list l = {0};
  bs_storage *st = NULL;
  bs_error err = {0, ""};
  uint32_t id = 0;
  size_t i;
  int rc;
  memset(&o, 0, sizeof o);
  if ((rc = cli_open_file(&c, argc, argv, 1, dump_opt, &o))) goto done;
  if (o.all && (o.c.stream || o.bucket || o.has_checkpoint)) {
    fprintf(stderr, "bucketstore dump: --all takes no --stream, --bucket or --checkpoint\n");
    rc = 2;
    goto done;
  }
  if (o.all) {
    if ((rc = bs_stream_list(c.db, collect_stream, &l, &err))) goto fail;
    for (i = 0; i < l.n && rc == BS_OK; i++) rc = dump_stream(&c, l.v[i].id, &o, &err);
  } else {
    if ((rc = open_stream("dump", &c, o.c.stream, &st))) goto done;
    id = bs_storage_stream_id(st);
    rc = dump_stream(&c, id, &o, &err);
  }
  /* a whole stream (or every one): the records too, so that `load` can rebuild the file */
  if (rc == BS_OK && !o.bucket && !o.has_checkpoint) {
    hex_buf hb = {NULL, 0};
    rc = bs_db_export(c.db, id, dump_record, &hb, &err);
    free(hb.p);
  }
  if (rc) goto fail;
  goto done;
fail:
  rc = report("dump", rc, &err);
done:
  if (fflush(stdout) != 0 && rc == 0) {
    fprintf(stderr, "bucketstore dump: write error on stdout\n");
    rc = 1;
  }
  free(l.v);
  free(l.names);
  bs_storage_close(st);
  cli_db_close(&c);
  return rc;
}

/* ---- load ------------------------------------------------------------------------------------ */

typedef struct load_opts {
  common_opts c;
} load_opts;

static int load_opt(int argc, char **argv, int *i, void *payload) {
  return common_opt(argc, argv, i, &((load_opts *)payload)->c);
}

/* Reads dump lines and hands out their records; other lines (header, ops, checksums) are
 * skipped: the records alone rebuild the file. */
typedef struct load_reader {
  FILE *in;
  const char *name;
  uint32_t stream; /* 0 = every record */
  char *line;
  size_t line_cap;
  unsigned long lineno;
  uint64_t records, of_stream;
  json_t *cur;          /* the current line's object (holds the table name) */
  unsigned char *k, *v; /* decoded key and value */
  size_t k_cap, v_cap;
  bs_error err; /* why next_record stopped the call (the library then says BS_EUSER) */
} load_reader;

static int unhex(const char *s, size_t n, unsigned char **buf, size_t *cap, size_t *out) {
  size_t i;
  if (n % 2) return -1;
  if (n / 2 + 1 > *cap) {
    unsigned char *nb = realloc(*buf, n / 2 + 1);
    if (!nb) return BS_ENOMEM;
    *buf = nb;
    *cap = n / 2 + 1;
  }
  for (i = 0; i < n; i++) {
    int d = s[i] >= '0' && s[i] <= '9'   ? s[i] - '0'
            : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    if (i % 2)
      (*buf)[i / 2] |= (unsigned char)d;
    else
      (*buf)[i / 2] = (unsigned char)(d << 4);
  }
  *out = n / 2;
  return 0;
}

static int next_record(bs_record *rec, void *payload) {
  load_reader *r = payload;
  ssize_t len;
  while ((len = getline(&r->line, &r->line_cap, r->in)) >= 0) {
    json_error_t je;
    json_t *o, *t, *k, *v;
    json_int_t stream;
    int bad;
    r->lineno++;
    if (len == 0 || r->line[0] == '\n') continue;
    json_decref(r->cur);
    r->cur = o = json_loadb(r->line, (size_t)len, 0, &je);
    if (!o || !json_is_object(o))
      return cli_fail(&r->err, BS_ECORRUPT, "%s:%lu: not a dump line (%s)", r->name, r->lineno,
                      o ? "not an object" : je.text);
    if (!(t = json_object_get(o, "record"))) continue; /* header, op or checksum line */
    k = json_object_get(o, "key");
    v = json_object_get(o, "value");
    stream = json_integer_value(json_object_get(o, "stream"));
    bad = !json_is_string(t) || !json_is_string(k) || !json_is_string(v) ||
          !json_is_integer(json_object_get(o, "stream")) || stream < 0 || stream > UINT32_MAX;
    if (!bad && (bad = unhex(json_string_value(k), json_string_length(k), &r->k, &r->k_cap,
                             &rec->key.size)) == BS_ENOMEM)
      return cli_fail(&r->err, BS_ENOMEM, "out of memory reading %s", r->name);
    if (!bad && (bad = unhex(json_string_value(v), json_string_length(v), &r->v, &r->v_cap,
                             &rec->value.size)) == BS_ENOMEM)
      return cli_fail(&r->err, BS_ENOMEM, "out of memory reading %s", r->name);
    if (bad)
      return cli_fail(&r->err, BS_ECORRUPT,
                      "%s:%lu: a record line needs record, stream, and key "
                      "and value in hex",
                      r->name, r->lineno);
    if (r->stream && stream && (uint32_t)stream != r->stream) continue;
    rec->table = json_string_value(t);
    rec->stream = (uint32_t)stream;
    rec->key.data = r->k;
    rec->value.data = r->v;
    r->records++;
    if (stream && (uint32_t)stream == r->stream) r->of_stream++;
    return 1;
  }
  if (ferror(r->in)) return cli_fail(&r->err, BS_EIO, "cannot read %s", r->name);
  if (!r->records)
    return cli_fail(&r->err, BS_EINVAL,
                    "%s has no record lines (a dump made with --bucket or "
                    "--checkpoint shows ops, it cannot be loaded)",
                    r->name);
  if (r->stream && !r->of_stream)
    return cli_fail(&r->err, BS_ENOTFOUND, "%s has no stream %u", r->name, r->stream);
  return 0;
}

int cli_load(int argc, char **argv) {
  cli_db c = {0};
  load_opts o;
  load_reader r;
  bs_error err = {0, ""};
  struct stat sb;
  int rc;
  memset(&o, 0, sizeof o);
  memset(&r, 0, sizeof r);
  c.max_operands = 1;
  if ((rc = cli_parse_args(&c, argc, argv, load_opt, &o))) goto done;
  if (cli_is_postgres(&c)) { /* bs_load makes a file: never one named after a connection */
    fprintf(stderr, "bucketstore load: %s is a PostgreSQL database: load makes a new LMDB file\n",
            cli_db_name(&c));
    rc = 2;
    goto done;
  }
  r.name = c.n_operands && strcmp(c.operands[0], "-") != 0 ? c.operands[0] : "stdin";
  r.in = strcmp(r.name, "stdin") == 0 ? stdin : fopen(r.name, "r");
  r.stream = (uint32_t)o.c.stream;
  if (!r.in) {
    fprintf(stderr, "bucketstore load: cannot open %s\n", r.name);
    rc = 1;
    goto done;
  }
  if ((rc = bs_load(c.path, NULL, next_record, &r, &err)) == BS_EUSER && r.err.code) {
    rc = r.err.code;
    err = r.err;
  }
  if (rc) {
    rc = report("load", rc, &err);
    goto done;
  }
  printf("loaded %llu record%s into %s (%llu bytes), verified\n", (unsigned long long)r.records,
         cli_s(r.records), cli_db_name(&c),
         stat(c.path, &sb) == 0 ? (unsigned long long)sb.st_size : 0ull);
done:
  if (r.in && r.in != stdin) fclose(r.in);
  json_decref(r.cur);
  free(r.line);
  free(r.k);
  free(r.v);
  cli_db_close(&c);
  return rc;
}

/* ---- backup ---------------------------------------------------------------------------------- */

typedef struct backup_opts {
  int force;
} backup_opts;

static int backup_opt(int argc, char **argv, int *i, void *payload) {
  (void)argc;
  if (strcmp(argv[*i], "--force") == 0 || strcmp(argv[*i], "-f") == 0)
    return ((backup_opts *)payload)->force = 1;
  return 0;
}

int cli_backup(int argc, char **argv) {
  cli_db c = {0};
  backup_opts o = {0};
  bs_backup_options bo = BS_BACKUP_OPTIONS_INIT;
  bs_error err = {0, ""};
  struct stat a, b;
  double t0 = now_s();
  int rc;
  c.max_operands = 1;
  if ((rc = cli_parse_args(&c, argc, argv, backup_opt, &o))) goto done;
  if (c.n_operands != 1) {
    fprintf(stderr, "bucketstore backup: where to? (bucketstore backup DB OUT)\n");
    rc = 2;
    goto done;
  }
  if ((rc = cli_open_existing(&c, "backup", 1))) goto done;
  if (o.force) bo.flags |= BS_BACKUP_REPLACE;
  if ((rc = bs_backup(c.db, c.operands[0], &bo, &err))) {
    rc = report("backup", rc, &err);
    goto done;
  }
  if (stat(c.path, &a) != 0) a.st_size = 0;
  if (stat(c.operands[0], &b) != 0) b.st_size = 0;
  printf("backup: %s (%llu bytes) -> %s (%llu bytes), verified, %.3f s\n", cli_db_name(&c),
         (unsigned long long)a.st_size, c.operands[0], (unsigned long long)b.st_size, now_s() - t0);
done:
  cli_db_close(&c);
  return rc;
}

/* ---- compact --------------------------------------------------------------------------------- */

typedef struct compact_opts {
  common_opts c;
  int incremental, initial, parameters, quiet;
  uint64_t max_op_id, min_changes, budget, min_age_ms, txn_ops;
  int has_min_age;
  const char **buckets;
  size_t n_buckets;
} compact_opts;

static int compact_opt(int argc, char **argv, int *i, void *payload) {
  compact_opts *o = payload;
  const char *a = argv[*i], *v;
  int r, bad = 0;
  if ((r = common_opt(argc, argv, i, &o->c)) != 0) return r;
  if (strcmp(a, "--incremental") == 0) return o->incremental = 1;
  if (strcmp(a, "--initial") == 0) return o->initial = 1;
  if (strcmp(a, "--parameters") == 0) return o->parameters = 1;
  if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) return o->quiet = 1;
  if ((r = opt_u64(argc, argv, i, "--max-op-id", &o->max_op_id)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--min-changes", &o->min_changes)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--budget", &o->budget)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--txn-ops", &o->txn_ops)) != 0) return r;
  if ((r = opt_u64(argc, argv, i, "--min-age-ms", &o->min_age_ms)) != 0) {
    o->has_min_age = 1;
    return r;
  }
  if ((v = opt_value(argc, argv, i, "--bucket", &bad))) {
    const char **p = realloc(o->buckets, (o->n_buckets + 1) * sizeof *p);
    if (!p) return -1;
    o->buckets = p;
    o->buckets[o->n_buckets++] = v;
    return 1;
  }
  return bad ? -1 : 0;
}

/* Progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise (for logs),
 * both throttled. The fraction is bytes of the buckets begun over bytes of the buckets the
 * run will select (known for full compaction; incremental runs show counts only). */
typedef struct progress_ui {
  int tty, quiet;
  uint64_t total_bytes; /* 0 = unknown */
  double started, last;
  unsigned long calls, cancel_after; /* BS_CLI_CANCEL_AFTER: tests raise SIGINT themselves */
} progress_ui;

static void draw(progress_ui *u, const bs_compact_stats *s, int final) {
  double t = now_s();
  if (u->quiet || (!final && t - u->last < (u->tty ? 0.1 : 1.0))) return;
  u->last = t;
  if (u->tty) {
    char bar[31];
    double frac = u->total_bytes ? (double)s->bytes_before / (double)u->total_bytes : 0;
    int i, fill;
    if (final) frac = 1;
    if (frac > 1) frac = 1;
    fill = (int)(frac * 30);
    for (i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    if (u->total_bytes || final)
      fprintf(stderr, "\r[%s] %3d%%  %llu bucket%s, %llu moved, %llu cleared  ", bar,
              (int)(frac * 100), (unsigned long long)s->buckets_compacted,
              cli_s(s->buckets_compacted), (unsigned long long)s->ops_moved,
              (unsigned long long)s->ops_cleared);
    else
      fprintf(stderr, "\r%llu bucket%s, %llu moved, %llu cleared, %.1f s  ",
              (unsigned long long)s->buckets_compacted, cli_s(s->buckets_compacted),
              (unsigned long long)s->ops_moved, (unsigned long long)s->ops_cleared, t - u->started);
    if (final) fputc('\n', stderr);
  } else {
    fprintf(stderr,
            "progress: %llu bucket%s compacted, %llu op%s moved, %llu cleared, "
            "%llu removed, %.1f s%s\n",
            (unsigned long long)s->buckets_compacted, cli_s(s->buckets_compacted),
            (unsigned long long)s->ops_moved, cli_s(s->ops_moved),
            (unsigned long long)s->ops_cleared, (unsigned long long)s->ops_removed, t - u->started,
            final ? " (done)" : "");
  }
}

/* Called by the library after each transaction: drawing, and cancelling on Ctrl-C (the
 * library then stops with BS_ECANCELED, nothing half-done). */
static int on_progress(const bs_compact_stats *so_far, void *payload) {
  progress_ui *u = payload;
  if (u->cancel_after && ++u->calls == u->cancel_after) raise(SIGINT);
  draw(u, so_far, 0);
  return interrupted ? 1 : 0;
}

/* Bytes the run will touch, for the bar: the named buckets, or those due for compaction. */
static uint64_t planned_bytes(cli_db *c, bs_storage *st, const compact_opts *o) {
  bs_error err = {0, ""};
  cli_bucket *b;
  uint64_t total = 0;
  size_t n, i, j;
  if (cli_buckets_list(st, &b, &n, &err)) return 0;
  for (i = 0; i < n; i++) {
    int pick = 0;
    if (o->n_buckets) {
      for (j = 0; j < o->n_buckets && !pick; j++)
        pick = strlen(o->buckets[j]) == b[i].name_size &&
               memcmp(o->buckets[j], b[i].name, b[i].name_size) == 0;
    } else {
      pick = cli_bucket_due(&b[i], o->min_changes);
    }
    if (pick) total += b[i].bytes;
  }
  cli_buckets_free(b, n);
  return total;
}

static int run_initial(bs_storage *st, const compact_opts *o, bs_error *err) {
  uint64_t buckets = 0;
  double t0 = now_s();
  int rc = bs_compact_initial_replication(&buckets, st, o->max_op_id, o->min_changes, err);
  if (rc) return rc;
  printf("initial-replication compaction: %llu bucket%s in %.3f s\n", (unsigned long long)buckets,
         cli_s(buckets), now_s() - t0);
  return BS_OK;
}

int cli_compact(int argc, char **argv) {
  cli_db c = {0};
  compact_opts o;
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats cs;
  progress_ui ui;
  bs_storage *st = NULL;
  bs_error err = {0, ""};
  bs_val *names = NULL;
  const char *cancel = getenv("BS_CLI_CANCEL_AFTER");
  size_t i;
  int rc;
  memset(&o, 0, sizeof o);
  memset(&ui, 0, sizeof ui);
  if ((rc = cli_open_file(&c, argc, argv, 0, compact_opt, &o))) goto done;
  if (o.incremental + o.initial > 1 || (o.initial && (o.n_buckets || o.parameters))) {
    fprintf(stderr, "bucketstore compact: --initial takes only --max-op-id and --min-changes; "
                    "it excludes --incremental\n");
    rc = 2;
    goto done;
  }
  if ((rc = open_stream("compact", &c, o.c.stream, &st))) goto done;
  if (o.initial) {
    if ((rc = run_initial(st, &o, &err))) rc = report("compact", rc, &err);
    goto done;
  }
  if (o.n_buckets && !(names = calloc(o.n_buckets, sizeof *names))) {
    rc = report("compact", BS_ENOMEM, NULL);
    goto done;
  }
  for (i = 0; i < o.n_buckets; i++) names[i] = bs_val_of(o.buckets[i]);
  co.max_op_id = o.max_op_id;
  co.buckets = names;
  co.n_buckets = o.n_buckets;
  co.min_bucket_changes = o.min_changes;
  co.incremental_only = o.incremental;
  co.op_budget = o.budget;
  co.max_ops_per_txn = (size_t)o.txn_ops;
  co.compact_parameters = o.parameters;
  if (o.has_min_age) co.min_age_ms = (int64_t)o.min_age_ms;
  co.progress = on_progress;
  co.progress_payload = &ui;
  ui.tty = isatty(STDERR_FILENO);
  ui.quiet = o.quiet;
  ui.started = now_s();
  ui.cancel_after = cancel ? strtoul(cancel, NULL, 10) : 0;
  if (!o.incremental) ui.total_bytes = planned_bytes(&c, st, &o);
  catch_sigint();
  memset(&cs, 0, sizeof cs);
  rc = bs_compact(&cs, st, &co, &err);
  signal(SIGINT, SIG_DFL);
  if (rc == BS_ECANCELED && interrupted) {
    if (ui.tty && !ui.quiet) fputc('\n', stderr);
    fprintf(stderr,
            "bucketstore compact: interrupted; stopped between transactions (%llu bucket%s "
            "compacted so far, nothing half-done)\n",
            (unsigned long long)cs.buckets_compacted, cli_s(cs.buckets_compacted));
    rc = 130;
    goto done;
  }
  if (rc) {
    if (ui.tty && !ui.quiet) fputc('\n', stderr);
    rc = report("compact", rc, &err);
    goto done;
  }
  draw(&ui, &cs, 1);
  printf("%s compaction: %llu bucket%s, %llu op%s moved, %llu cleared, %llu removed, "
         "%llu parameter entr%s removed; bytes %llu -> %llu; %.3f s\n",
         o.incremental ? "incremental" : "full", (unsigned long long)cs.buckets_compacted,
         cli_s(cs.buckets_compacted), (unsigned long long)cs.ops_moved, cli_s(cs.ops_moved),
         (unsigned long long)cs.ops_cleared, (unsigned long long)cs.ops_removed,
         (unsigned long long)cs.parameter_entries_removed,
         cs.parameter_entries_removed == 1 ? "y" : "ies", (unsigned long long)cs.bytes_before,
         (unsigned long long)cs.bytes_after, now_s() - ui.started);
done:
  free(names);
  free(o.buckets);
  bs_storage_close(st);
  cli_db_close(&c);
  return rc;
}

/* ---- checkpoint [--watch] -------------------------------------------------------------------- */

typedef struct checkpoint_opts {
  common_opts c;
  int watch;
  uint64_t count, timeout_ms;
} checkpoint_opts;

static int checkpoint_opt(int argc, char **argv, int *i, void *payload) {
  checkpoint_opts *o = payload;
  int r;
  if ((r = common_opt(argc, argv, i, &o->c)) != 0) return r;
  if (strcmp(argv[*i], "--watch") == 0 || strcmp(argv[*i], "-w") == 0) return o->watch = 1;
  if ((r = opt_u64(argc, argv, i, "--count", &o->count)) != 0) return r;
  return opt_u64(argc, argv, i, "--timeout-ms", &o->timeout_ms);
}

static int print_checkpoint(uint32_t stream, const bs_checkpoint *cp) {
  bs_val lsn = {cp->lsn, cp->lsn_size};
  struct timespec ts;
  int rc;
  clock_gettime(CLOCK_REALTIME, &ts);
  rc = print_line(json_pack("{s:i,s:o,s:o,s:I}", "stream", (int)stream, "checkpoint",
                            j_id(cp->op_id), "lsn", cp->has_lsn ? cli_json_bytes(lsn) : json_null(),
                            "time_ms", (json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000));
  fflush(stdout);
  return rc;
}

int cli_checkpoint(int argc, char **argv) {
  cli_db c = {0};
  checkpoint_opts o;
  bs_storage *st = NULL;
  bs_checkpoint cp, next;
  bs_error err = {0, ""};
  uint64_t seen = 0;
  double deadline;
  int rc;
  memset(&o, 0, sizeof o);
  if ((rc = cli_parse_args(&c, argc, argv, checkpoint_opt, &o))) goto done;
  if (!o.watch && (o.count || o.timeout_ms)) {
    fprintf(stderr, "bucketstore checkpoint: --count and --timeout-ms apply to --watch only\n");
    rc = 2;
    goto done;
  }
  if ((rc = cli_open_existing(&c, "checkpoint", 1))) goto done;
  if ((rc = open_stream("checkpoint", &c, o.c.stream, &st))) goto done;
  if ((rc = bs_get_checkpoint(&cp, st, &err)) ||
      (rc = print_checkpoint(bs_storage_stream_id(st), &cp)))
    goto fail;
  if (!o.watch) goto done;
  catch_sigint();
  deadline = o.timeout_ms ? now_s() + (double)o.timeout_ms / 1000.0 : 0;
  /* wait in short slices so Ctrl-C and the deadline are noticed promptly */
  while (!interrupted && (!o.count || seen < o.count)) {
    if (deadline && now_s() >= deadline) {
      if (o.count) {
        fprintf(stderr, "bucketstore checkpoint: %llu of %llu checkpoint%s before the timeout\n",
                (unsigned long long)seen, (unsigned long long)o.count, cli_s(o.count));
        rc = 1;
      }
      break;
    }
    if ((rc = bs_wait_checkpoint(&next, st, &cp, 200, &err))) goto fail;
    if (next.op_id == cp.op_id && next.lsn_size == cp.lsn_size &&
        memcmp(next.lsn, cp.lsn, cp.lsn_size) == 0 && next.has_lsn == cp.has_lsn)
      continue;
    cp = next;
    seen++;
    if ((rc = print_checkpoint(bs_storage_stream_id(st), &cp))) goto fail;
  }
  signal(SIGINT, SIG_DFL);
  goto done;
fail:
  rc = report("checkpoint", rc, &err);
done:
  bs_storage_close(st);
  cli_db_close(&c);
  return rc;
}
