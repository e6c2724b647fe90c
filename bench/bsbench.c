/*
 * bsbench: the benchmark harness. Creates a fresh temporary directory, builds the
 * stores each workload needs, and measures every workload twice: through bucketstore, and as
 * the same key pattern / value sizes / commit cadence / sync mode written straight into LMDB.
 * The ratio between the two is the figure of merit (absolute numbers vary between machines).
 *
 * Each phase (a build, a measurement) runs in its own forked child: its peak RSS is its own,
 * and a crash in a half-built library call is reported as a failed row instead of killing the
 * run. --no-fork runs everything in one process (for profilers).
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__GNUC__)
#define BS_BENCH_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define BS_BENCH_PRINTF(a, b)
#endif

bres *g_res;
int *g_nres;
const bench_cfg *g_cfg;
bench_shared *g_sh;
int32_t *g_state_bs, *g_state_raw;
static int *g_quiet; /* shared: results of setup runs are discarded */
/* the baseline's engine name: raw LMDB, or raw libpq with --pg */
#define RAW_ENGINE (g_cfg->pg_url ? "libpq" : "lmdb")
static bres g_scratch;

void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "bsbench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bres *res_new(const char *workload, const char *name, const char *engine) {
  bres *r;
  if (*g_quiet || *g_nres >= BR_MAX) {
    r = &g_scratch;
  } else {
    r = &g_res[(*g_nres)++];
  }
  memset(r, 0, sizeof *r);
  snprintf(r->workload, sizeof r->workload, "%s", workload);
  snprintf(r->name, sizeof r->name, "%s", name);
  snprintf(r->engine, sizeof r->engine, "%s", engine);
  r->p50_us = r->p99_us = -1;
  r->bytes_per_op = -1;
  return r;
}

void res_fail(bres *r, int rc, const char *what, const bs_error *err) {
  r->status = rc == BS_EUNSUPPORTED ? BR_UNSUPPORTED : BR_FAILED;
  snprintf(r->note, sizeof r->note, "%.60s: %.80s%s%.200s", what, bs_strerror(rc),
           err && err->msg[0] ? " / " : "", err && err->msg[0] ? err->msg : "");
  if (!*g_quiet && r != &g_scratch) return;
  fprintf(stderr, "bsbench: setup failed: %s\n", r->note);
}

/* ---- Memory: peak RSS (getrusage) and a sampled peak of anonymous memory ---- */
static volatile int sampler_run;
static pthread_t sampler_thr;
static long anon_peak_pages;

static void *sampler(void *arg) {
  (void)arg;
  while (sampler_run) {
    long size, res, shr;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
      if (fscanf(f, "%ld %ld %ld", &size, &res, &shr) == 3 && res - shr > anon_peak_pages)
        anon_peak_pages = res - shr;
      fclose(f);
    }
    usleep(2000);
  }
  return NULL;
}

void mem_sampler_start(void) {
  anon_peak_pages = 0;
  sampler_run = 1;
  if (pthread_create(&sampler_thr, NULL, sampler, NULL) != 0) sampler_run = 0;
}

void mem_sampler_stop(void) {
  if (!sampler_run) return;
  sampler_run = 0;
  pthread_join(sampler_thr, NULL);
}

void res_mem(bres *r) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  r->maxrss_mb = (double)ru.ru_maxrss / 1024.0;
  r->anon_peak_mb = (double)anon_peak_pages * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double pct(double *v, size_t n, double p) {
  size_t i;
  if (!n) return -1;
  qsort(v, n, sizeof *v, cmp_double);
  i = (size_t)(p * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

double file_bytes(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (double)sb.st_size : -1;
}

int copy_file(const char *src, const char *dst) {
  char buf[1 << 16];
  ssize_t n;
  int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644), rc = 0;
  if (in < 0 || out < 0) rc = -1;
  while (!rc && (n = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)n) != n) rc = -1;
  /* Flush both files now: otherwise the kernel writes these hundreds of MB back in the
   * middle of a later timed phase (and its fsyncs), whichever engine happens to run then. */
  if (!rc && (fsync(in) || fsync(out))) rc = -1;
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  return rc;
}

void bench_path(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", g_cfg->tmp, name);
}

/* ---- Data generation ---- */
/* Hand-rolled formatting: the generator runs once per row for both engines, and snprintf
 * showed up as a quarter of the ingest profile. */
static char *put_digits(char *p, uint64_t v, int width) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n < width) tmp[n++] = '0';
  while (n) *p++ = tmp[--n];
  return p;
}

void gen_rid(char out[RID_LEN + 1], uint64_t i) {
  out[0] = 'r';
  put_digits(out + 1, i % 100000000ull, 8);
  out[RID_LEN] = 0;
}

void gen_bucket(char *out, size_t cap, size_t *len, unsigned b) {
  static const char head[] = "by_list[\"l";
  char *p = out;
  (void)cap; /* callers pass >= 24 bytes */
  memcpy(p, head, sizeof head - 1);
  p = put_digits(p + sizeof head - 1, b % 100000u, 5);
  *p++ = '"';
  *p++ = ']';
  *p = 0;
  *len = (size_t)(p - out);
}

int save_generated(bs_writer *w, bs_tag tag, uint64_t row, unsigned b, uint64_t version,
                   bs_error *err) {
  char rid[RID_LEN + 1], bname[64], data[65536];
  size_t blen;
  bs_row out;
  bs_save s = BS_SAVE_INIT;
  gen_rid(rid, row);
  s.table.data = OBJ_TYPE;
  s.table.size = OBJ_TYPE_LEN;
  s.tag = tag;
  if (tag == BS_DELETE) {
    s.before_id.data = rid;
    s.before_id.size = RID_LEN;
    return bs_writer_save(w, &s, err);
  }
  gen_bucket(bname, sizeof bname, &blen, b);
  gen_data(data, row, version, g_cfg->data_size);
  s.after_id.data = rid;
  s.after_id.size = RID_LEN;
  out.bucket.data = bname;
  out.bucket.size = blen;
  out.object_type.data = OBJ_TYPE;
  out.object_type.size = OBJ_TYPE_LEN;
  out.object_id.data = rid;
  out.object_id.size = RID_LEN;
  out.data.data = data;
  out.data.size = g_cfg->data_size;
  s.rows = &out;
  s.n_rows = 1;
  return bs_writer_save(w, &s, err);
}

void gen_data(char *out, uint64_t row, uint64_t version, size_t size) {
  static const char a[] = "{\"id\":\"r", b[] = "\",\"v\":", c[] = ",\"done\":false,\"d\":\"";
  static const char fill[] = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";
  char *p = out, *end = out + size - 2;
  memcpy(p, a, sizeof a - 1);
  p = put_digits(p + sizeof a - 1, row % 100000000ull, 8);
  memcpy(p, b, sizeof b - 1);
  p = put_digits(p + sizeof b - 1, version, 1);
  memcpy(p, c, sizeof c - 1);
  p += sizeof c - 1;
  for (size_t off = row % 26; p < end;) {
    size_t n = (size_t)(end - p) < 26 ? (size_t)(end - p) : 26;
    memcpy(p, fill + off, n);
    p += n;
  }
  end[0] = '"';
  end[1] = '}';
}

void gen_lsn(char out[17], uint64_t n) {
  snprintf(out, 17, "%016llx", (unsigned long long)n);
}

void gen_change(change *c, uint64_t k, int32_t *state, uint64_t rows, unsigned nb) {
  uint64_t s = g_cfg->seed ^ (k * 0x2545f4914f6cdd1dull);
  uint64_t r = rng_next(&s) % rows, kind = rng_next(&s) % 10;
  c->row = r;
  c->old_bucket = state[r];
  if (state[r] < 0) {
    c->kind = CH_INSERT;
    c->new_bucket = (int32_t)(rng_next(&s) % nb);
  } else if (kind < 6) {
    c->kind = CH_UPDATE;
    c->new_bucket = state[r];
  } else if (kind < 8) {
    c->kind = CH_MOVE;
    c->new_bucket = (int32_t)((unsigned)(state[r] + 1 + rng_next(&s) % (nb - 1)) % nb);
  } else {
    c->kind = CH_DELETE;
    c->new_bucket = -1;
  }
  state[r] = c->new_bucket;
}

/* ---- Running phases ---- */
static int run_phase(const char *label, int (*fn)(int), int arg, int quiet) {
  pid_t pid;
  int status, rc;
  *g_quiet = quiet;
  fflush(stdout);
  fflush(stderr);
  if (g_cfg->nofork) {
    rc = fn(arg);
    *g_quiet = 0;
    return rc;
  }
  pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    rc = fn(arg);
    fflush(stdout);
    _exit(rc == 0 ? 0 : 1);
  }
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) die("waitpid: %s", strerror(errno));
  *g_quiet = 0;
  if (WIFSIGNALED(status)) {
    bres *r = res_new("crash", label, "-");
    r->status = BR_FAILED;
    snprintf(r->note, sizeof r->note, "%s crashed with signal %d", label, WTERMSIG(status));
    fprintf(stderr, "bsbench: %s\n", r->note);
    return -1;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

#define PHASE(fn, arg) run_phase(#fn, fn, arg, 0)
#define SETUP(fn, arg) run_phase(#fn, fn, arg, 1)

static int w_bs_stream_setup(int a) {
  return bs_stream(a, 0);
}
static int w_raw_stream_setup(int a) {
  return raw_stream(a, 0);
}
static int w_bs_stream(int a) {
  return bs_stream(a, 1);
}
static int w_raw_stream(int a) {
  return raw_stream(a, 1);
}
static int w_bs_reads(int a) {
  (void)a;
  return bs_reads();
}
static int w_raw_reads(int a) {
  (void)a;
  return raw_reads();
}
static int w_bs_params(int a) {
  (void)a;
  return bs_params();
}
static int w_raw_params(int a) {
  (void)a;
  return raw_params();
}
static int w_bs_compact_build(int a) {
  (void)a;
  return bs_compact_build();
}
static int w_raw_compact_build(int a) {
  (void)a;
  return raw_compact_build();
}

static int selected(const char *name) {
  return !g_cfg->only || strcmp(g_cfg->only, name) == 0;
}

static void need_s100(void) {
  if (!g_sh->built[ST_S100]) {
    SETUP(bs_ingest, 0);
    SETUP(raw_ingest, 0);
  }
}

static void need_streamed(void) {
  need_s100();
  if (!g_sh->built[ST_STREAMED]) {
    SETUP(w_bs_stream_setup, 1);
    SETUP(w_raw_stream_setup, 1);
  }
}

static void run_all(void) {
  if (selected("ingest")) {
    PHASE(bs_ingest, 0);
    PHASE(raw_ingest, 0);
    PHASE(bs_ingest, 2);
    PHASE(raw_ingest, 2);
    PHASE(bs_ingest, 1);
    PHASE(raw_ingest, 1);
  }
  if (selected("stream")) {
    need_s100();
    PHASE(w_bs_stream, 0);
    PHASE(w_raw_stream, 0);
    PHASE(w_bs_stream, 1);
    PHASE(w_raw_stream, 1);
  }
  if (selected("reads")) {
    need_streamed();
    PHASE(w_bs_reads, 0);
    PHASE(w_raw_reads, 0);
    for (int t = 1; t <= 4; t *= 2) {
      PHASE(bs_concurrent, t);
      PHASE(raw_concurrent, t);
    }
  }
  if (selected("checksums")) {
    for (int big = 0; big <= 1; big++) {
      SETUP(bs_ck_build, big);
      SETUP(raw_ck_build, big);
      PHASE(bs_checksums, big);
      PHASE(raw_checksums, big);
    }
  }
  if (selected("params")) {
    PHASE(w_bs_params, 0);
    PHASE(w_raw_params, 0);
  }
  if (selected("compact")) {
    SETUP(w_bs_compact_build, 0);
    SETUP(w_raw_compact_build, 0);
    PHASE(bs_compaction, 0);
    PHASE(raw_compaction, 0);
    PHASE(bs_compaction, 1);
    PHASE(raw_compaction, 1);
    PHASE(bs_compaction, 2);
    PHASE(raw_compaction, 2);
  }
}

/* --pg: the PostgreSQL workloads (bench_pg.c), each beside its raw libpq baseline */
static void run_pg(void) {
  if (pg_prepare()) die("--pg: cannot prepare the run's schemas on %s", g_cfg->pg_url);
  if (!g_cfg->only || strcmp(g_cfg->only, "changes")) { /* the data of every other workload */
    PHASE(pg_bs_ingest, 0);
    PHASE(pg_raw_ingest, 0);
  }
  if (selected("ingest") || selected("compact")) PHASE(pg_bs_ingest, 1);
  if (selected("reads")) {
    PHASE(pg_bs_reads, 0);
    PHASE(pg_raw_reads, 0);
  }
  if (selected("checksums")) {
    PHASE(pg_bs_checksums, 0);
    PHASE(pg_raw_checksums, 0);
    PHASE(pg_raw_checksums, 1);
  }
  if (selected("compact")) {
    PHASE(pg_bs_compact, 0);
    PHASE(pg_bs_compact, 1);
  }
  if (selected("changes")) { /* a stream of its own, after the others */
    PHASE(pg_bs_changes, 0);
    PHASE(pg_raw_changes, 0);
  }
  if (!g_cfg->keep) pg_cleanup();
}

/* ---- Output ---- */
static void fmt_value(char *out, size_t cap, const bres *r) {
  double v = r->value;
  if (r->status == BR_UNSUPPORTED) {
    snprintf(out, cap, "unsupported");
    return;
  }
  if (r->status != BR_OK) {
    snprintf(out, cap, "FAILED");
    return;
  }
  if (v >= 1e6)
    snprintf(out, cap, "%.2fM %s", v / 1e6, r->unit);
  else if (v >= 1e4)
    snprintf(out, cap, "%.0fk %s", v / 1e3, r->unit);
  else if (v >= 100)
    snprintf(out, cap, "%.0f %s", v, r->unit);
  else
    snprintf(out, cap, "%.2f %s", v, r->unit);
}

static void fmt_lat(char *out, size_t cap, const bres *r) {
  if (!r || r->status != BR_OK || r->p50_us < 0) {
    snprintf(out, cap, "-");
    return;
  }
  if (r->p50_us >= 1000)
    snprintf(out, cap, "%.1f/%.1fms", r->p50_us / 1e3, r->p99_us / 1e3);
  else
    snprintf(out, cap, "%.1f/%.1fus", r->p50_us, r->p99_us);
}

static const bres *find_raw(const bres *b) {
  for (int i = 0; i < *g_nres; i++) {
    const bres *r = &g_res[i];
    if (!strcmp(r->engine, RAW_ENGINE) && !strcmp(r->workload, b->workload) &&
        !strcmp(r->name, b->name))
      return r;
  }
  return NULL;
}

static double ratio(const bres *b, const bres *r) {
  if (!r || b->status != BR_OK || r->status != BR_OK || b->value <= 0 || r->value <= 0) return -1;
  return b->lower_better ? b->value / r->value : r->value / b->value;
}

static bres *find(const char *workload, const char *prefix, const char *engine) {
  for (int i = 0; i < *g_nres; i++) {
    bres *r = &g_res[i];
    if (!strcmp(r->workload, workload) && !strcmp(r->engine, engine) &&
        !strncmp(r->name, prefix, strlen(prefix)) && r->status == BR_OK)
      return r;
  }
  return NULL;
}

static void note_add(bres *r, const char *fmt, ...) BS_BENCH_PRINTF(2, 3);
static void note_add(bres *r, const char *fmt, ...) {
  size_t n = strlen(r->note);
  va_list ap;
  if (n + 3 >= sizeof r->note) return;
  if (n) {
    r->note[n++] = ';';
    r->note[n++] = ' ';
    r->note[n] = 0;
  }
  va_start(ap, fmt);
  vsnprintf(r->note + n, sizeof r->note - n, fmt, ap);
  va_end(ap);
}

/* A failed cross-check: the two sides of a row did different work. Noted on the row, counted,
 * and the run fails. */
static int g_cross_failed;
static void cross_fail(bres *r, const char *fmt, ...) BS_BENCH_PRINTF(2, 3);
static void cross_fail(bres *r, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  g_cross_failed++;
  fprintf(stderr, "bsbench: CROSS-CHECK FAILED: %s %s: %s\n", r->workload, r->name, msg);
  note_add(r, "CROSS-CHECK FAILED: %s", msg);
}

static const char *plan_mode_name(int m) {
  return m == 1 ? "force_generic_plan" : m == 2 ? "force_custom_plan" : m == 3 ? "auto" : "unknown";
}

/* Figures that need two rows (or two phases): commit overhead over its fsync, and the
 * cross-checks: both sides of every row did the same work. */
static void derive(void) {
  static const char *eng[2] = {"bs", "lmdb"};
  for (int e = 0; e < 2; e++) {
    bres *d = find("stream", "", eng[e]), *n = NULL;
    for (int i = 0; i < *g_nres; i++)
      if (!strcmp(g_res[i].workload, "stream") && !strcmp(g_res[i].engine, eng[e]) &&
          strstr(g_res[i].name, "nosync") && g_res[i].status == BR_OK)
        n = &g_res[i];
    if (d && strstr(d->name, "durable") && n && d->p50_us > n->p50_us)
      note_add(d,
               "fsync share of a commit: p50 %.2f ms durable - %.2f ms nosync = %.2f ms; "
               "the commit's other work = %.0f%% of that fsync",
               d->p50_us / 1e3, n->p50_us / 1e3, (d->p50_us - n->p50_us) / 1e3,
               100.0 * n->p50_us / (d->p50_us - n->p50_us));
  }
  /* every row both sides measured: the same count of ops, rows, calls (unless time-bound) */
  for (int i = 0; i < *g_nres; i++) {
    bres *b = &g_res[i];
    if (strcmp(b->engine, "bs") || b->status != BR_OK || b->timed) continue;
    for (int j = 0; j < *g_nres; j++) {
      bres *o = &g_res[j];
      if ((strcmp(o->engine, "lmdb") && strcmp(o->engine, "libpq")) || o->status != BR_OK ||
          o->timed || strcmp(o->workload, b->workload) || strcmp(o->name, b->name))
        continue;
      if (o->count != b->count)
        cross_fail(b, "bucketstore counted %.0f, %s %.0f", b->count, o->engine, o->count);
    }
  }
  for (int big = 0; big <= 1; big++)
    for (int cp = 0; cp <= 1; cp++) {
      uint64_t a = g_sh->ck_sum[0][big][cp], b = g_sh->ck_sum[1][big][cp];
      bres *r = find("checksums", "", "bs");
      if (a && b && a != b && r)
        cross_fail(r, "%s buckets, %s: bucketstore and raw checksums differ", big ? "big" : "small",
                   cp ? "older" : "latest");
    }
  if (g_sh->pg_read_sum[0] != g_sh->pg_read_sum[1]) {
    bres *r = find("reads", "", "bs");
    if (r) cross_fail(r, "bucketstore and raw libpq read different ops");
  }
  for (int big = 0; big <= 1; big++)
    if (g_sh->pg_ck_sum[0][big] != g_sh->pg_ck_sum[1][big]) {
      bres *r = find("checksums", "", "bs");
      if (r)
        cross_fail(r, "%s bucket: bucketstore and raw checksums differ", big ? "big" : "small");
    }
  if (g_sh->pg_plan_mode[0] || g_sh->pg_plan_mode[1]) {
    bres *r = find("checksums", "", "bs");
    if (r && (g_sh->pg_plan_mode[0] != g_sh->pg_plan_mode[1] || g_sh->pg_custom_plans[0] ||
              g_sh->pg_custom_plans[1]))
      cross_fail(
          r,
          "plans differ: bucketstore %s (%llu custom plans), raw libpq %s (%llu custom "
          "plans)",
          plan_mode_name(g_sh->pg_plan_mode[0]), (unsigned long long)g_sh->pg_custom_plans[0],
          plan_mode_name(g_sh->pg_plan_mode[1]), (unsigned long long)g_sh->pg_custom_plans[1]);
  }
  if (g_sh->param_rows[0] != g_sh->param_rows[1]) {
    bres *r = find("params", "lookup", "bs");
    if (r)
      cross_fail(r, "%llu rows vs raw %llu", (unsigned long long)g_sh->param_rows[0],
                 (unsigned long long)g_sh->param_rows[1]);
  }
}

static void target(const char *what, int ok, const char *fmt, ...) BS_BENCH_PRINTF(3, 4);
static void target(const char *what, int ok, const char *fmt, ...) {
  va_list ap;
  printf("  [%s] %-52s ", ok < 0 ? "n/a " : ok ? "met " : "MISS", what);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

/* The PostgreSQL goals against their orientation (the sync service's own PostgreSQL storage). */
static void print_pg_targets(void) {
  bres *b = find("ingest", "  all ops", "bs"), *r = find("ingest", "  all ops", "libpq"), *s;
  printf("\ntargets (vs the sync service's PostgreSQL storage; figures, not assertions):\n");
  if (b)
    target("ingest >= 10x 9.6k ops/s (96k)", b->value >= 96e3,
           "%.1fk ops/s = %.1fx the orientation; raw libpq %.1fk ops/s, ratio %.2fx",
           b->value / 1e3, b->value / 9.6e3, r ? r->value / 1e3 : 0, ratio(b, r));
  else
    target("ingest >= 10x 9.6k ops/s (96k)", -1, "not measured");
  b = find("reads", "whole bucket from 0, second", "bs");
  r = find("reads", "whole bucket from 0, second", "libpq");
  if (b)
    target("whole-bucket reads >= 10x 41k ops/s (410k)", b->value >= 410e3,
           "%.0fk ops/s = %.1fx the orientation; raw libpq %.0fk ops/s, ratio %.2fx",
           b->value / 1e3, b->value / 41e3, r ? r->value / 1e3 : 0, ratio(b, r));
  else
    target("whole-bucket reads >= 10x 41k ops/s (410k)", -1, "not measured");
  b = s = NULL;
  for (int i = 0; i < *g_nres; i++)
    if (!strcmp(g_res[i].workload, "checksums") && !strcmp(g_res[i].engine, "bs") &&
        g_res[i].status == BR_OK) {
      if (b)
        s = &g_res[i];
      else
        b = &g_res[i];
    }
  if (b && s)
    target("cold checksums flat in bucket size (88 ms)", b->value <= 2 * s->value,
           "%.0f us (%s) vs %.0f us (%s): %.2fx", b->value, b->name + 6, s->value, s->name + 6,
           b->value / s->value);
  else
    target("cold checksums flat in bucket size (88 ms)", -1, "not measured");
  b = find("ingest", "  all ops", "bs");
  if (b && b->bytes_per_op > 0 && g_sh->lmdb_bytes_per_op > 0)
    target("bytes per op <= the LMDB backend's (orientation 676)",
           b->bytes_per_op <= g_sh->lmdb_bytes_per_op,
           "%.0f B/op, LMDB backend %.0f B/op, raw libpq %.0f B/op", b->bytes_per_op,
           g_sh->lmdb_bytes_per_op,
           (r = find("ingest", "  all ops", "libpq")) ? r->bytes_per_op : 0);
  else
    target("bytes per op <= the LMDB backend's (orientation 676)", -1, "not measured");
  b = find("compact", "full", "bs");
  if (b && g_cfg->pg_rows != 100000) /* the orientation's 5.4 s is a time for 150k ops */
    target("compaction (5.4 s), bounded memory", -1,
           "%.2f s, anon peak %.1f MB: --pg-rows is not the orientation's 100000", b->secs,
           b->anon_peak_mb);
  else if (b)
    target("compaction (5.4 s), bounded memory", b->secs < 5.4, "%.2f s, anon peak %.1f MB",
           b->secs, b->anon_peak_mb);
  else
    target("compaction (5.4 s), bounded memory", -1, "not measured / unsupported");
}

/* The targets of the LMDB backend (bench/README.md, "What limits each target"), measured,
 * never asserted. */
static void print_targets(void) {
  char name[72];
  bres *b, *r, *n;
  double worst = -1;
  printf("\ntargets (this run's figures, not assertions):\n");
  snprintf(name, sizeof name, "snapshot %lluk rows -> %u buckets",
           (unsigned long long)g_cfg->rows / 1000, g_cfg->buckets_small);
  b = find("ingest", name, "bs");
  r = find("ingest", name, "lmdb");
  if (b && strcmp(b->name, name)) b = NULL; /* the durable run is listed first */
  if (r && strcmp(r->name, name)) r = NULL;
  if (b && r)
    target("ingest >= 1M rows/s into 100 buckets, <= 2x raw", b->value >= 1e6 && ratio(b, r) <= 2.0,
           "%.0fk rows/s, raw %.0fk rows/s, ratio %.2fx", b->value / 1e3, r->value / 1e3,
           ratio(b, r));
  else
    target("ingest >= 1M rows/s into 100 buckets, <= 2x raw", -1, "not measured");
  b = find("reads", "whole buckets from 0, warm", "bs");
  r = find("reads", "whole buckets from 0, warm", "lmdb");
  if (b)
    target("full-bucket reads >= 10M ops/s", b->value >= 1e7,
           "%.2fM ops/s (%.0f MB/s), "
           "raw %.2fM ops/s, ratio %.2fx",
           b->value / 1e6, b->mbps, r ? r->value / 1e6 : 0, r ? ratio(b, r) : -1);
  else
    target("full-bucket reads >= 10M ops/s", -1, "not measured");
  for (int i = 0; i < *g_nres; i++)
    if (!strcmp(g_res[i].workload, "checksums") && !strcmp(g_res[i].engine, "bs") &&
        g_res[i].status == BR_OK && g_res[i].value > worst)
      worst = g_res[i].value, b = &g_res[i];
  if (worst >= 0)
    target("checksums < 10 us/bucket regardless of size", worst < 10, "worst %.2f us/bucket (%s)",
           worst, b->name);
  else
    target("checksums < 10 us/bucket regardless of size", -1, "not measured");
  b = find("compact", "full", "bs");
  r = find("compact", "full", "lmdb");
  if (b)
    target("full compaction >= 2M ops/s, bounded memory", b->value >= 2e6,
           "%.0fk ops/s, anon peak %.1f MB, RSS %.0f MB; raw %.0fk ops/s, ratio %.2fx",
           b->value / 1e3, b->anon_peak_mb, b->maxrss_mb, r ? r->value / 1e3 : 0,
           r ? ratio(b, r) : -1);
  else
    target("full compaction >= 2M ops/s, bounded memory", -1, "not measured / unsupported");
  b = find("stream", "", "bs");
  n = NULL;
  for (int i = 0; i < *g_nres; i++)
    if (!strcmp(g_res[i].workload, "stream") && !strcmp(g_res[i].engine, "bs") &&
        strstr(g_res[i].name, "nosync") && g_res[i].status == BR_OK)
      n = &g_res[i];
  if (b && n && strstr(b->name, "durable") && b->p50_us > n->p50_us) {
    double over = n->p50_us / (b->p50_us - n->p50_us);
    target("a commit adds < 20% to the fsync it needs", over < 0.2,
           "+%.0f%% (p50 durable %.2f ms, nosync %.2f ms)", 100 * over, b->p50_us / 1e3,
           n->p50_us / 1e3);
  } else {
    target("a commit adds < 20% to the fsync it needs", -1, "not measured");
  }
}

static void print_table(void) {
  printf("\n%-9s %-42s %15s %15s %6s %17s %17s %11s %11s\n", "workload", "case", "bucketstore",
         g_cfg->pg_url ? "raw libpq" : "raw LMDB", "ratio", "p50/p99 bs", "p50/p99 raw",
         "RSS MB b/r", "B/op b/r");
  for (int i = 0; i < *g_nres; i++) {
    const bres *b = &g_res[i], *r;
    char vb[32], vr[32], lb[32], lr[32], rs[32], bo[32], ra[16];
    double x;
    if (!strcmp(b->engine, RAW_ENGINE)) {
      /* a raw row without a bucketstore partner still gets printed */
      int paired = 0;
      for (int j = 0; j < *g_nres; j++)
        if (!strcmp(g_res[j].engine, "bs") && !strcmp(g_res[j].workload, b->workload) &&
            !strcmp(g_res[j].name, b->name))
          paired = 1;
      if (paired) continue;
    }
    r = strcmp(b->engine, "bs") ? NULL : find_raw(b);
    if (strcmp(b->engine, "bs") && strcmp(b->engine, RAW_ENGINE)) {
      printf("%-9s %-42s %s\n", b->workload, b->name, b->note);
      continue;
    }
    if (!strcmp(b->engine, RAW_ENGINE)) {
      r = b;
      b = NULL;
    }
    if (b)
      fmt_value(vb, sizeof vb, b);
    else
      snprintf(vb, sizeof vb, "-");
    if (r)
      fmt_value(vr, sizeof vr, r);
    else
      snprintf(vr, sizeof vr, "-");
    fmt_lat(lb, sizeof lb, b);
    fmt_lat(lr, sizeof lr, r);
    x = b ? ratio(b, r) : -1;
    if (x > 0)
      snprintf(ra, sizeof ra, "%.2fx", x);
    else
      snprintf(ra, sizeof ra, "-");
    snprintf(rs, sizeof rs, "%.0f/%.0f", b ? b->maxrss_mb : 0, r ? r->maxrss_mb : 0);
    if ((b && b->bytes_per_op > 0) || (r && r->bytes_per_op > 0))
      snprintf(bo, sizeof bo, "%.0f/%.0f", b && b->bytes_per_op > 0 ? b->bytes_per_op : 0,
               r && r->bytes_per_op > 0 ? r->bytes_per_op : 0);
    else
      snprintf(bo, sizeof bo, "-");
    printf("%-9s %-42s %15s %15s %6s %17s %17s %11s %11s\n", (b ? b : r)->workload,
           (b ? b : r)->name, vb, vr, ra, lb, lr, rs, bo);
  }
  printf("\nratio = bucketstore cost / raw %s cost (1.00x = as fast as the bytes alone).\n",
         g_cfg->pg_url ? "libpq" : "LMDB");
  printf("RSS = peak RSS of the phase's process (getrusage; includes mapped file pages).\n");
  printf("notes:\n");
  for (int i = 0; i < *g_nres; i++) {
    const bres *b = &g_res[i];
    if (b->note[0]) printf("  %-9s %-42s [%s] %s\n", b->workload, b->name, b->engine, b->note);
  }
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, const char *k, double v, int comma) {
  fprintf(f, "\"%s\": ", k);
  if (v != v)
    fprintf(f, "null");
  else
    fprintf(f, "%.6g", v);
  if (comma) fprintf(f, ", ");
}

static void write_json(const char *path, double total_s) {
  FILE *f = fopen(path, "w");
  struct utsname u;
  const bench_cfg *c = g_cfg;
  if (!f) die("%s: %s", path, strerror(errno));
  uname(&u);
  fprintf(f, "{\n  \"version\": \"%s\", \"machine\": ", BS_VERSION_STRING);
  json_str(f, u.machine);
  fprintf(f, ", \"kernel\": ");
  json_str(f, u.release);
  fprintf(f, ", \"cpus\": %ld, \"total_seconds\": %.2f,\n  \"config\": {",
          sysconf(_SC_NPROCESSORS_ONLN), total_s);
  json_num(f, "rows", (double)c->rows, 1);
  json_num(f, "updates", (double)c->updates, 1);
  json_num(f, "data_size", (double)c->data_size, 1);
  json_num(f, "commit_rows", (double)c->commit_rows, 1);
  json_num(f, "commit_changes", (double)c->commit_changes, 1);
  json_num(f, "read_limit", (double)c->read_limit, 1);
  json_num(f, "ck_requests", (double)c->ck_requests, 1);
  json_num(f, "ck_big_ops", (double)c->ck_big_ops, 1);
  json_num(f, "params", (double)c->params, 1);
  json_num(f, "compact_rows", (double)c->compact_rows, 1);
  json_num(f, "compact_memory_mb", (double)c->compact_memory_mb, 1);
  json_num(f, "pg_rows", (double)c->pg_rows, 1);
  json_num(f, "seed", (double)c->seed, 1);
  json_num(f, "quick", c->quick, 0);
  fprintf(f, "},\n  \"results\": [\n");
  for (int i = 0; i < *g_nres; i++) {
    const bres *r = &g_res[i];
    const bres *raw = strcmp(r->engine, "bs") ? NULL : find_raw(r);
    double x = raw ? ratio(r, raw) : -1;
    fprintf(f, "    {\"workload\": ");
    json_str(f, r->workload);
    fprintf(f, ", \"case\": ");
    json_str(f, r->name);
    fprintf(f, ", \"engine\": ");
    json_str(f, r->engine);
    fprintf(f, ", \"status\": ");
    json_str(f, r->status == BR_OK ? "ok" : r->status == BR_UNSUPPORTED ? "unsupported" : "failed");
    fprintf(f, ", \"unit\": ");
    json_str(f, r->unit);
    fprintf(f, ", ");
    json_num(f, "value", r->value, 1);
    json_num(f, "count", r->count, 1);
    json_num(f, "seconds", r->secs, 1);
    json_num(f, "mb_per_s", r->mbps, 1);
    json_num(f, "p50_us", r->p50_us, 1);
    json_num(f, "p99_us", r->p99_us, 1);
    json_num(f, "peak_rss_mb", r->maxrss_mb, 1);
    json_num(f, "anon_peak_mb", r->anon_peak_mb, 1);
    json_num(f, "bytes_per_op", r->bytes_per_op, 1);
    json_num(f, "ratio_to_raw", x, 1);
    fprintf(f, "\"note\": ");
    json_str(f, r->note);
    fprintf(f, "}%s\n", i + 1 < *g_nres ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

/* ---- Temporary directory ---- */
static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[1024];
  if (!d) return;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void usage(void) {
  printf("usage: bsbench [options]\n"
         "  --quick             small sizes (a smoke run: a few seconds)\n"
         "  --only NAME         one workload: ingest stream reads checksums params compact\n"
         "                      (changes: --pg only)\n"
         "  --json PATH         also write the results as JSON\n"
         "  --dir DIR           parent of the temporary directory (default $TMPDIR or /tmp)\n"
         "  --keep              keep the temporary directory\n"
         "  --no-fork           run every phase in this process (profilers; RSS then cumulative)\n"
         "  --seed N\n"
         "sizes:\n"
         "  --rows N            initial snapshot rows (1000000)\n"
         "  --buckets N         buckets of the first snapshot run (100)\n"
         "  --large-buckets N   buckets of the second snapshot run (10000)\n"
         "  --commit-rows N     snapshot commit cadence (10000)\n"
         "  --updates N         streaming changes per sync mode (100000)\n"
         "  --commit-changes N  streaming commit cadence (1000)\n"
         "  --data-size N       JSON bytes per row (120)\n"
         "  --read-limit N      ops per get_bucket_data call (10000)\n"
         "  --read-secs S       seconds per concurrent-reader run (1.5)\n"
         "  --ck-requests N     buckets per checksum measurement (10000)\n"
         "  --ck-big-ops N      ops per big bucket (100000)\n"
         "  --ck-big-buckets N  big buckets (10)\n"
         "  --params N          parameter index entries (1000000)\n"
         "  --param-queries N   lookups (100000)\n"
         "  --compact-rows N    compaction rows, each updated once (250000)\n"
         "  --map-mb N          initial map size of the bucketstore files (library default)\n"
         "                      and the map size of the raw stores (65536; valgrind needs less)\n"
         "  --compact-memory-mb N  compaction's memory_limit_mb, every compaction phase\n"
         "                      (library default: 64)\n"
         "  --pg URL|start      the PostgreSQL workloads on the server at URL, or on\n"
         "                      one started with tests/pg_server.sh (from the repository root;\n"
         "                      BS_PG_SERVER names the script); --only ingest|reads|checksums|\n"
         "                      compact|changes selects among them\n"
         "  --proto             layout prototypes instead of the workloads: the snapshot ingest\n"
         "                      in today's layout and in chunks, with reads and checksums\n"
         "                      (bench/README.md, \"Layout prototypes\"); uses --rows,\n"
         "                      --buckets, --large-buckets, --commit-rows, --data-size,\n"
         "                      --read-limit\n"
         "  --proto=ops         op encodings inside 4 KiB chunks instead of the workloads:\n"
         "                      today's (format 5), dense (a chunk's repeated fields once,\n"
         "                      subkeys binary), zstd per chunk, beside the record per op\n"
         "                      (bench/README.md, \"Op encodings\"); uses what --proto uses\n"
         "  --proto=log         the per-flush log compacted into chunks every K flushes, beside\n"
         "                      the record per op, 4 KiB chunks and the log left as written\n"
         "                      (bench/README.md, \"The log compacted\"); uses what --proto uses\n"
         "  --defrag            defragmentation policies instead of the workloads: a fresh\n"
         "                      client's download after compaction against existing clients'\n"
         "                      (bench/README.md, \"Defragmentation\"); uses --buckets,\n"
         "                      --updates, --commit-changes, --data-size\n"
         "  --proto-source      source-record layouts instead of the workloads: the snapshot's\n"
         "                      source side alone in format 2's records, format 3's, and\n"
         "                      format 3's with shorter keys (bench/README.md, \"Format 3\");\n"
         "                      uses --rows, --buckets, --large-buckets, --commit-rows\n"
         "  --pg-proto          with --pg: PostgreSQL layout prototypes instead of the workloads:\n"
         "                      the --pg ingest as a row per op and as chunks (bench/README.md,\n"
         "                      \"On PostgreSQL: chunks\"); uses --pg-rows, --buckets,\n"
         "                      --commit-changes, --data-size, --read-limit\n"
         "  --pg-rows N         --pg: the inserts into the one bucket (100000; 10000 with\n"
         "                      --quick), then N/2 random updates of them\n"
         "  --pg-changes N      --pg: the checkpoints (change records) of the changes workload\n"
         "                      (300000; 20000 with --quick)\n");
}

static char pg_dir[600], pg_sh[512]; /* --pg start: the server's directory and script */

int main(int argc, char **argv) {
  static bench_cfg cfg;
  static const struct option lo[] = {{"quick", 0, 0, 'q'},
                                     {"only", 1, 0, 'o'},
                                     {"json", 1, 0, 'j'},
                                     {"dir", 1, 0, 'd'},
                                     {"keep", 0, 0, 'k'},
                                     {"no-fork", 0, 0, 'F'},
                                     {"seed", 1, 0, 's'},
                                     {"help", 0, 0, 'h'},
                                     {"rows", 1, 0, 1},
                                     {"buckets", 1, 0, 2},
                                     {"large-buckets", 1, 0, 3},
                                     {"commit-rows", 1, 0, 4},
                                     {"updates", 1, 0, 5},
                                     {"commit-changes", 1, 0, 6},
                                     {"data-size", 1, 0, 7},
                                     {"read-limit", 1, 0, 8},
                                     {"read-secs", 1, 0, 9},
                                     {"ck-requests", 1, 0, 10},
                                     {"ck-big-ops", 1, 0, 11},
                                     {"ck-big-buckets", 1, 0, 12},
                                     {"params", 1, 0, 13},
                                     {"param-queries", 1, 0, 14},
                                     {"compact-rows", 1, 0, 15},
                                     {"map-mb", 1, 0, 16},
                                     {"pg-rows", 1, 0, 17},
                                     {"compact-memory-mb", 1, 0, 18},
                                     {"pg-changes", 1, 0, 19},
                                     {"pg", 1, 0, 'P'},
                                     {"proto", 2, 0, 'L'},
                                     {"pg-proto", 0, 0, 'G'},
                                     {"defrag", 0, 0, 'D'},
                                     {"proto-source", 0, 0, 'S'},
                                     {0, 0, 0, 0}};
  uint64_t sizes[20] = {0};
  double read_secs = 0, t0;
  const char *parent;
  void *shm;
  size_t shm_size;
  int c, pg_bad = 0;

  cfg.seed = 42;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'q':
      cfg.quick = 1;
      break;
    case 'o':
      cfg.only = optarg;
      break;
    case 'j':
      cfg.json = optarg;
      break;
    case 'd':
      cfg.dir = optarg;
      break;
    case 'k':
      cfg.keep = 1;
      break;
    case 'F':
      cfg.nofork = 1;
      break;
    case 's':
      cfg.seed = strtoull(optarg, NULL, 0);
      break;
    case 'P':
      cfg.pg_url = optarg;
      break;
    case 'L':
      if (optarg && strcmp(optarg, "ops") && strcmp(optarg, "log"))
        die("--proto=%s: only --proto, --proto=ops or --proto=log", optarg);
      cfg.proto = !optarg ? 1 : strcmp(optarg, "ops") ? 4 : 2;
      break;
    case 'G':
      cfg.pg_proto = 1;
      break;
    case 'D':
      cfg.defrag = 1;
      break;
    case 'S':
      cfg.proto_source = 1;
      break;
    case 'h':
      usage();
      return 0;
    case 9:
      read_secs = strtod(optarg, NULL);
      break;
    default:
      if (c >= 1 && c <= 19) {
        sizes[c] = strtoull(optarg, NULL, 0);
        if (!sizes[c]) die("--%s needs a positive number", lo[c + 7].name);
        break;
      }
      usage();
      return 2;
    }
  }
  if (cfg.only) {
    static const char *names[] = {"ingest", "stream",  "reads",  "checksums",
                                  "params", "compact", "changes"};
    int ok = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) ok |= !strcmp(cfg.only, names[i]);
    if (!ok) die("--only: unknown workload '%s'", cfg.only);
  }
  /* defaults: a few minutes on 2 cores; --quick: a few seconds */
  cfg.rows = cfg.quick ? 20000 : 1000000;
  cfg.buckets_small = 100;
  cfg.buckets_large = cfg.quick ? 1000 : 10000;
  cfg.commit_rows = cfg.quick ? 2000 : 10000;
  cfg.updates = cfg.quick ? 5000 : 100000;
  cfg.commit_changes = 1000;
  cfg.data_size = 120;
  cfg.read_limit = 10000;
  cfg.read_secs = cfg.quick ? 0.2 : 1.5;
  cfg.catchup_commits = 10;
  cfg.ck_requests = cfg.quick ? 1000 : 10000;
  cfg.ck_small_ops = 10;
  cfg.ck_big_ops = cfg.quick ? 5000 : 100000;
  cfg.ck_big_buckets = cfg.quick ? 4 : 10;
  cfg.params = cfg.quick ? 20000 : 1000000;
  cfg.param_queries = cfg.quick ? 2000 : 100000;
  cfg.compact_rows = cfg.quick ? 10000 : 250000;
  if (sizes[1]) cfg.rows = sizes[1];
  if (sizes[2]) cfg.buckets_small = (unsigned)sizes[2];
  if (sizes[3]) cfg.buckets_large = (unsigned)sizes[3];
  if (sizes[4]) cfg.commit_rows = sizes[4];
  if (sizes[5]) cfg.updates = sizes[5];
  if (sizes[6]) cfg.commit_changes = sizes[6];
  if (sizes[7]) cfg.data_size = sizes[7];
  if (sizes[8]) cfg.read_limit = sizes[8];
  if (read_secs > 0) cfg.read_secs = read_secs;
  if (sizes[10]) cfg.ck_requests = sizes[10];
  if (sizes[11]) cfg.ck_big_ops = sizes[11];
  if (sizes[12]) cfg.ck_big_buckets = sizes[12];
  if (sizes[13]) cfg.params = sizes[13];
  if (sizes[14]) cfg.param_queries = sizes[14];
  if (sizes[15]) cfg.compact_rows = sizes[15];
  if (sizes[16]) cfg.map_mb = sizes[16];
  cfg.pg_rows = sizes[17] ? sizes[17] : cfg.quick ? 10000 : 100000;
  cfg.pg_changes = sizes[19] ? sizes[19] : cfg.quick ? 20000 : 300000;
  cfg.compact_memory_mb = (size_t)sizes[18];
  if (cfg.data_size < 64 || cfg.data_size > 65536) die("--data-size must be 64..65536");
  if (cfg.buckets_small < 2 || cfg.buckets_large < 2) die("need at least 2 buckets");
  if (cfg.rows < cfg.buckets_large) die("--rows must be at least --large-buckets");
  if (cfg.pg_proto && !cfg.pg_url) die("--pg-proto needs --pg URL|start");

  parent = cfg.dir ? cfg.dir : getenv("TMPDIR");
  if (!parent || !*parent) parent = "/tmp";
  snprintf(cfg.tmp, sizeof cfg.tmp, "%s/bsbench.XXXXXX", parent);
  if (!mkdtemp(cfg.tmp)) die("mkdtemp %s: %s", cfg.tmp, strerror(errno));
  g_cfg = &cfg;

  /* results, flags and per-row state shared with the phase children */
  shm_size = sizeof(bres) * BR_MAX + sizeof(bench_shared) + 2 * sizeof(int) +
             2 * sizeof(int32_t) * (size_t)cfg.rows + 64;
  shm = mmap(NULL, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) die("mmap: %s", strerror(errno));
  g_res = shm;
  g_sh = (bench_shared *)(g_res + BR_MAX);
  g_nres = (int *)(g_sh + 1);
  g_quiet = g_nres + 1;
  g_state_bs = (int32_t *)(g_quiet + 1);
  g_state_raw = g_state_bs + cfg.rows;

  printf("bsbench %s: %s%s, rows=%llu data=%zuB, dir %s\n", BS_VERSION_STRING,
         cfg.quick ? "quick" : "default sizes", cfg.only ? " (one workload)" : "",
         (unsigned long long)cfg.rows, cfg.data_size, cfg.tmp);
  t0 = now_s();
  if (cfg.proto || cfg.defrag || cfg.proto_source) {
    int bad = cfg.proto ? proto_layouts() : cfg.defrag ? proto_defrag() : proto_source();
    printf("total %.1f s\n", now_s() - t0);
    if (!cfg.keep) rm_tree(cfg.tmp);
    return bad ? 1 : 0;
  }
  if (cfg.pg_url) {
    static char url[1024];
    const char *sh = getenv("BS_PG_SERVER");
    cfg.pg_tag = (long)getpid();
    if (!strcmp(cfg.pg_url, "start")) {
      char cmd[1200];
      FILE *p;
      /* not inside cfg.tmp: as root the server runs as postgres, which cannot enter a 0700
       * directory of root's; pg_server.sh gives this one to its server's user */
      snprintf(pg_dir, sizeof pg_dir, "%s/bsbench-pg.XXXXXX", parent);
      if (!mkdtemp(pg_dir)) die("mkdtemp %s: %s", pg_dir, strerror(errno));
      snprintf(pg_sh, sizeof pg_sh, "%s", sh && *sh ? sh : "tests/pg_server.sh");
      snprintf(cmd, sizeof cmd, "%s start %s", pg_sh, pg_dir);
      if (!(p = popen(cmd, "r")) || !fgets(url, sizeof url, p) || pclose(p) != 0)
        die("--pg start: '%s' failed (run from the repository root, or set BS_PG_SERVER)", cmd);
      url[strcspn(url, "\n")] = 0;
      cfg.pg_url = url;
      printf("PostgreSQL server started: %s\n", url);
    }
    if (cfg.pg_proto)
      pg_bad = proto_pg();
    else
      run_pg();
    if (pg_dir[0]) {
      char cmd[1200];
      snprintf(cmd, sizeof cmd, "%s stop %s", pg_sh, pg_dir);
      if (system(cmd) != 0) fprintf(stderr, "bsbench: '%s' failed\n", cmd);
    }
    if (cfg.pg_proto) {
      printf("total %.1f s\n", now_s() - t0);
      if (!cfg.keep) rm_tree(cfg.tmp);
      return pg_bad ? 1 : 0;
    }
  } else {
    run_all();
  }
  derive();
  print_table();
  if (cfg.pg_url)
    print_pg_targets();
  else
    print_targets();
  printf("total %.1f s\n", now_s() - t0);
  if (cfg.json) write_json(cfg.json, now_s() - t0);
  if (!cfg.keep)
    rm_tree(cfg.tmp);
  else
    printf("kept %s\n", cfg.tmp);
  if (g_cross_failed) {
    fprintf(stderr, "bsbench: %d cross-check(s) failed: the two sides did different work\n",
            g_cross_failed);
    return 1;
  }
  for (int i = 0; i < *g_nres; i++)
    if (g_res[i].status == BR_FAILED) return 1;
  return 0;
}
