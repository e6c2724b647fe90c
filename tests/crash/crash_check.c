/*
 * crash_check: the judge of the crash test. Usage: crash_check DB LOG SEED
 *
 * After the writer was SIGKILLed: the file opens; bs_db_verify finds nothing; the checkpoint is
 * the last one LOG records, or the next one (its commit returned but the log line was not yet
 * written); and what a client sees at that checkpoint equals what the memory backend shows
 * after replaying commits 1..k of the same workload: every committed row, nothing else (the
 * reduced bucket contents and parameter sets), with every bucket checksum equal to the sum of
 * the ops read back. The memory backend runs the same engine as the file, so a rule wrong in
 * that engine would show alike in both: what a client reduces to at the file's checkpoint is
 * also checked against a naive model that follows the workload's saves alone (contract.md 4.1:
 * a row's latest save decides its one bucket, data and lookup; a delete drops it), each bucket's
 * rows and each lookup's parameter rows. Prints "ok k=K inflight=0|1"; exit 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util_fault.h"
#include "crash_workload.h"

static int fail(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "crash_check: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  return 1;
}

static void on_problem(const char *p, void *payload) {
  (void)payload;
  fprintf(stderr, "crash_check: verify: %s\n", p);
}

/* drops the "C=" line and every " ck=N": op ids and checksums depend on how often batches
 * were redone; the ft_fingerprint already checked checksum == sum of ops */
static void strip(char *s) {
  char *o = s, *p = s;
  if (!strncmp(p, "C=", 2)) p = strchr(p, '\n') + 1;
  while (*p) {
    if (!strncmp(p, " ck=", 4)) {
      p += 4;
      while (*p >= '0' && *p <= '9') p++;
      continue;
    }
    *o++ = *p++;
  }
  *o = 0;
}

static int fingerprint(bs_storage *st, uint64_t C, char **out, bs_error *err) {
  bs_val names[CW_BUCKETS], keys[CW_USERS];
  char nb[CW_BUCKETS][16];
  unsigned char kb[CW_USERS][64];
  for (int i = 0; i < CW_BUCKETS; i++) {
    snprintf(nb[i], sizeof nb[i], "b%d", i);
    names[i] = cw_v(nb[i]);
  }
  for (int i = 0; i < CW_USERS; i++) {
    keys[i].data = kb[i];
    keys[i].size = cw_lookup_key(kb[i], sizeof kb[i], i);
  }
  return ft_fingerprint(st, C, names, CW_BUCKETS, keys, CW_USERS, out, err);
}

/* ---- The naive model: the live rows after commits 1..k, from the saves alone ----------------- */

typedef struct nm_row {
  char id[24], bucket[16], data[96], param[48];
  unsigned char key[64];
  size_t key_n;
} nm_row;

typedef struct nm_rows {
  nm_row *v;
  size_t n, cap;
  int oom;
} nm_rows;

static void copy_val(char *dst, size_t cap, bs_val v) {
  size_t n = v.size < cap - 1 ? v.size : cap - 1;
  if (n) memcpy(dst, v.data, n);
  dst[n] = 0;
}

static void nm_seen(void *ctx, const bs_save *s) {
  nm_rows *m = ctx;
  char id[24];
  size_t i;
  copy_val(id, sizeof id, s->tag == BS_DELETE ? s->before_id : s->after_id);
  for (i = 0; i < m->n && strcmp(m->v[i].id, id) != 0; i++) continue;
  if (s->tag == BS_DELETE) { /* a delete of an unknown row changes nothing (contract.md 4.1) */
    if (i < m->n) m->v[i] = m->v[--m->n];
    return;
  }
  if (i == m->n) {
    if (m->n == m->cap) {
      size_t cap = m->cap ? 2 * m->cap : 64;
      nm_row *v = realloc(m->v, cap * sizeof *v);
      if (!v) {
        m->oom = 1;
        return;
      }
      m->v = v;
      m->cap = cap;
    }
    memset(&m->v[m->n], 0, sizeof m->v[0]);
    strcpy(m->v[m->n++].id, id);
  }
  /* the workload's saves have one output row and one lookup of one parameter row */
  copy_val(m->v[i].bucket, sizeof m->v[i].bucket, s->rows[0].bucket);
  copy_val(m->v[i].data, sizeof m->v[i].data, s->rows[0].data);
  copy_val(m->v[i].param, sizeof m->v[i].param, s->lookups[0].params[0]);
  m->v[i].key_n = s->lookups[0].key.size < sizeof m->v[i].key ? s->lookups[0].key.size : 0;
  memcpy(m->v[i].key, s->lookups[0].key.data, m->v[i].key_n);
}

/* One line per row as "id=data" (bucket rows) or "param" (a lookup's), sorted, then joined. */
typedef struct lines {
  char **v;
  size_t n, cap;
  int oom;
} lines;

static void lines_add(lines *l, const char *a, size_t an, const char *b, size_t bn) {
  char *s = malloc(an + bn + 2);
  if (s && l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      free(s);
      s = NULL;
    } else {
      l->v = v;
      l->cap = cap;
    }
  }
  if (!s) {
    l->oom = 1;
    return;
  }
  memcpy(s, a, an);
  s[an] = 0;
  if (b) {
    s[an] = '=';
    memcpy(s + an + 1, b, bn);
    s[an + 1 + bn] = 0;
  }
  l->v[l->n++] = s;
}

static int cmp_line(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* the sorted lines, newline-joined, into buf (cap bytes); frees them */
static void lines_join(lines *l, char *buf, size_t cap) {
  size_t at = 0;
  if (l->n) qsort(l->v, l->n, sizeof *l->v, cmp_line);
  buf[0] = 0;
  for (size_t i = 0; i < l->n; i++) {
    at += (size_t)snprintf(buf + (at < cap ? at : cap), at < cap ? cap - at : 0, "%s\n", l->v[i]);
    free(l->v[i]);
  }
  if (at >= cap) l->oom = 1; /* cut: never equal to an uncut one */
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

/* A client's reduce of a bucket's ops: the latest op per row identity (type, id, subkey), the
 * PUTs kept; a CLEAR stands for everything before it. Rows as "object_id=data". */
typedef struct seen_op {
  char key[160], id[24], data[96];
  int put;
} seen_op;
typedef struct reduce_ctx {
  seen_op *v;
  size_t n, cap;
  uint64_t last; /* the last op handed out: where the next call goes on */
  int oom;
} reduce_ctx;

static int reduce_chunk(const bs_chunk *c, void *payload) {
  reduce_ctx *r = payload;
  for (size_t i = 0; i < c->n_ops; i++) {
    const bs_op *op = &c->ops[i];
    char key[160];
    size_t j;
    r->last = op->op_id;
    if (op->type == BS_OP_CLEAR) r->n = 0;
    if (op->type != BS_OP_PUT && op->type != BS_OP_REMOVE) continue;
    snprintf(key, sizeof key, "%.*s|%.*s|%.*s", (int)op->object_type.size,
             (const char *)op->object_type.data, (int)op->object_id.size,
             (const char *)op->object_id.data, (int)op->subkey.size, (const char *)op->subkey.data);
    for (j = 0; j < r->n && strcmp(r->v[j].key, key) != 0; j++) continue;
    if (j == r->n) {
      if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        seen_op *v = realloc(r->v, cap * sizeof *v);
        if (!v) return r->oom = 1, BS_ENOMEM;
        r->v = v;
        r->cap = cap;
      }
      r->n++;
    }
    strcpy(r->v[j].key, key);
    copy_val(r->v[j].id, sizeof r->v[j].id, op->object_id);
    copy_val(r->v[j].data, sizeof r->v[j].data, op->data);
    r->v[j].put = op->type == BS_OP_PUT;
  }
  return 0;
}

static int param_line(const bs_val *p, void *payload) {
  lines_add(payload, p->data, p->size, NULL, 0);
  return 0;
}

/* The file at C against the model: each bucket's reduced rows, each lookup's parameter rows. */
static int naive_check(bs_storage *st, uint64_t C, const nm_rows *m, uint64_t k) {
  static char got[1 << 16], want[1 << 16];
  bs_error err = {0, ""};
  int rc;
  for (int b = 0; b < CW_BUCKETS; b++) {
    char name[16];
    bs_bucket_request req;
    reduce_ctx r = {0};
    lines lg = {0}, lw = {0};
    int more = 1;
    snprintf(name, sizeof name, "b%d", b);
    req.bucket = cw_v(name);
    req.after = 0;
    while (more) {
      if ((rc = bs_get_bucket_data(&more, st, C, &req, 1, NULL, reduce_chunk, &r, &err)))
        return fail("model check: reading %s: %s", name, err.msg);
      req.after = r.last;
    }
    for (size_t i = 0; i < r.n; i++)
      if (r.v[i].put)
        lines_add(&lg, r.v[i].id, strlen(r.v[i].id), r.v[i].data, strlen(r.v[i].data));
    for (size_t i = 0; i < m->n; i++)
      if (strcmp(m->v[i].bucket, name) == 0)
        lines_add(&lw, m->v[i].id, strlen(m->v[i].id), m->v[i].data, strlen(m->v[i].data));
    free(r.v);
    lines_join(&lg, got, sizeof got);
    lines_join(&lw, want, sizeof want);
    if (r.oom || lg.oom || lw.oom) return fail("model check: out of memory%s%s", "", "");
    if (strcmp(got, want) != 0) {
      fprintf(stderr,
              "crash_check: commit %llu, bucket %s: a client reduces the file to\n%s--- "
              "but the naive model has\n%s",
              (unsigned long long)k, name, got, want);
      return 1;
    }
  }
  for (int u = 0; u < CW_USERS; u++) {
    unsigned char kb[64];
    bs_val key;
    lines lg = {0}, lw = {0};
    key.data = kb;
    key.size = cw_lookup_key(kb, sizeof kb, u);
    if ((rc = bs_get_parameter_sets(st, C, &key, 1, (size_t)1 << 30, param_line, &lg, &err)))
      return fail("model check: parameter sets: %s%s", err.msg, "");
    for (size_t i = 0; i < m->n; i++)
      if (m->v[i].key_n == key.size && memcmp(m->v[i].key, kb, key.size) == 0)
        lines_add(&lw, m->v[i].param, strlen(m->v[i].param), NULL, 0);
    lines_join(&lg, got, sizeof got);
    lines_join(&lw, want, sizeof want);
    if (lg.oom || lw.oom) return fail("model check: out of memory%s%s", "", "");
    if (strcmp(got, want) != 0) {
      fprintf(stderr,
              "crash_check: commit %llu, lookup u%d: the file's parameter rows\n%s--- "
              "but the naive model's\n%s",
              (unsigned long long)k, u, got, want);
      return 1;
    }
  }
  return 0;
}

/* The memory backend after commits 1..k. */
static int model(uint64_t seed, uint64_t k, char **out, bs_error *err) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  cw_state state = {0};
  bs_checkpoint cp;
  char lsn[32];
  int rc;
  if ((rc = bs_open_memory(&db, NULL, err))) return rc;
  if ((rc = bs_stream_create(NULL, db, "crash", NULL, err))) goto out;
  if ((rc = bs_storage_open(&st, db, 0, err))) goto out;
  if ((rc = bs_writer_open(&w, st, NULL, err))) goto out;
  if ((rc = bs_writer_snapshot_done(w, cw_v("00000000"), err))) goto out;
  for (uint64_t c = 1; c <= k; c++) {
    if ((rc = cw_commit_saves(&state, seed, c, w, err))) goto out;
    cw_lsn(lsn, sizeof lsn, c);
    if ((rc = bs_writer_commit(NULL, w, cw_v(lsn), NULL, err))) goto out;
  }
  if ((rc = bs_get_checkpoint(&cp, st, err))) goto out;
  rc = fingerprint(st, cp.op_id, out, err);
out:
  free(state.live);
  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  return rc;
}

int main(int argc, char **argv) {
  bs_error err = {0, ""};
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_checkpoint cp;
  uint64_t seed, k = 0, logged_k = 0, logged_op = 0, problems = 0;
  char line[128], *got = NULL, *want = NULL;
  FILE *log;
  int rc;
  if (argc != 4) {
    fprintf(stderr, "usage: crash_check DB LOG SEED\n");
    return 2;
  }
  seed = strtoull(argv[3], NULL, 10);
  if ((log = fopen(argv[2], "r")) != NULL) {
    while (fgets(line, sizeof line, log)) {
      unsigned long long a, b;
      if (sscanf(line, "%llu %llu", &a, &b) == 2) {
        logged_k = a;
        logged_op = b;
      }
    }
    fclose(log);
  }
  if ((rc = bs_open(&db, argv[1], NULL, &err)))
    return fail("open: %s (%s)", bs_strerror(rc), err.msg);
  if ((rc = bs_db_verify(&problems, db, on_problem, NULL, &err)))
    return fail("verify: %s (%s)", bs_strerror(rc), err.msg);
  if (problems) return fail("verify found problems%s%s", "", "");
  rc = bs_storage_open(&st, db, 0, &err);
  if (rc == BS_ENOTFOUND && logged_k == 0) { /* killed before the stream existed */
    bs_close(db);
    printf("ok k=0 inflight=0\n");
    return 0;
  }
  if (rc) return fail("storage_open: %s (%s)", bs_strerror(rc), err.msg);
  if ((rc = bs_get_checkpoint(&cp, st, &err)))
    return fail("checkpoint: %s (%s)", bs_strerror(rc), err.msg);
  if (cp.has_lsn) {
    char buf[32];
    size_t n = cp.lsn_size < sizeof buf - 1 ? cp.lsn_size : sizeof buf - 1;
    memcpy(buf, cp.lsn, n);
    buf[n] = 0;
    k = strtoull(buf, NULL, 10);
  }
  if (k != logged_k && k != logged_k + 1) {
    fprintf(stderr, "crash_check: checkpoint is commit %llu; the log's last commit is %llu\n",
            (unsigned long long)k, (unsigned long long)logged_k);
    return 1;
  }
  if (k == logged_k && k && cp.op_id != logged_op) {
    fprintf(stderr, "crash_check: commit %llu: checkpoint %llu, logged %llu\n",
            (unsigned long long)k, (unsigned long long)cp.op_id, (unsigned long long)logged_op);
    return 1;
  }
  if ((rc = fingerprint(st, cp.op_id, &got, &err)))
    return fail("reading the file at its checkpoint: %s (%s)", bs_strerror(rc), err.msg);
  {
    cw_state ms = {0};
    nm_rows nm = {0};
    ms.seen = nm_seen;
    ms.ctx = &nm;
    for (uint64_t c = 1; c <= k && rc == BS_OK; c++) rc = cw_commit_saves(&ms, seed, c, NULL, &err);
    free(ms.live);
    if (rc || nm.oom) return fail("naive model: %s%s", rc ? bs_strerror(rc) : "out of memory", "");
    rc = naive_check(st, cp.op_id, &nm, k);
    free(nm.v);
    if (rc) return 1;
  }
  if ((rc = model(seed, k, &want, &err))) return fail("model: %s (%s)", bs_strerror(rc), err.msg);
  strip(got);
  strip(want);
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "crash_check: commit %llu: the file shows\n%s--- but the model\n%s",
            (unsigned long long)k, got, want);
    return 1;
  }
  printf("ok k=%llu inflight=%d op=%llu\n", (unsigned long long)k, k != logged_k,
         (unsigned long long)cp.op_id);
  free(got);
  free(want);
  bs_storage_close(st);
  bs_close(db);
  return 0;
}
