/*
 * crash_workload.h: the deterministic workload of the crash test, shared by the writer (which
 * runs it against the file until it is SIGKILLed) and the checker (which replays it into the
 * memory backend to know what commit k must show). Header-only (static functions): both
 * programs include it.
 *
 * Commit c (1, 2, ...) is a batch of saves drawn from a PRNG seeded by (seed, c) and the set of
 * rows alive before it. Each row is touched at most once per commit and INSERT is used only for
 * fresh row ids, so a batch re-run after a crash (whose earlier attempt was partly flushed but
 * not committed) ends in the same state: the redo is idempotent, as replication after a restart
 * must be.
 */
#ifndef BS_CRASH_WORKLOAD_H
#define BS_CRASH_WORKLOAD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../storage.h"

#define CW_BUCKETS 8
#define CW_USERS   3
#define CW_LSN_FMT "%08llu"

typedef struct cw_state {
  char (*live)[24]; /* ids of the rows alive, unordered */
  size_t n, cap;
  /* when set, told of every save cw_commit_saves makes (after w took it, when w is given): the
   * checker's naive model follows the workload through it */
  void (*seen)(void *ctx, const bs_save *s);
  void *ctx;
} cw_state;

static uint64_t cw_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static bs_val cw_v(const char *s) {
  bs_val x = {s, s ? strlen(s) : 0};
  return x;
}

static size_t cw_lookup_key(unsigned char *buf, size_t cap, int user) {
  char u[16];
  bs_scalar s;
  size_t n = 0;
  snprintf(u, sizeof u, "u%d", user);
  memset(&s, 0, sizeof s);
  s.type = BS_SCALAR_STRING;
  s.s = cw_v(u);
  if (bs_lookup_encode(buf, cap, &n, &s, 1, NULL) != BS_OK) return 0;
  return n;
}

/* Runs commit c's saves through w (NULL: only advances st, to rebuild it); updates st. Returns
 * the first failing status. The saves only; the caller commits with lsn CW_LSN_FMT of c. */
static int cw_commit_saves(cw_state *st, uint64_t seed, uint64_t c, bs_writer *w, bs_error *err) {
  uint64_t r = seed * 1000003u + c;
  int n = 3 + (int)(cw_next(&r) % 28), rc;
  char *touched = calloc(st->n + 1, 1);
  size_t n_before = st->n;
  if (!touched) return BS_ENOMEM;
  for (int i = 0; i < n; i++) {
    bs_save s = BS_SAVE_INIT;
    bs_row row;
    bs_lookup lk;
    unsigned char key[64];
    char id[24], bucket[16], data[96], par[48];
    bs_val pv;
    int action = (int)(cw_next(&r) % 10), user = (int)(cw_next(&r) % CW_USERS);
    size_t pick = n_before ? (size_t)(cw_next(&r) % n_before) : 0;
    snprintf(bucket, sizeof bucket, "b%d", (int)(cw_next(&r) % CW_BUCKETS));
    if (action < 3 || n_before == 0 || touched[pick]) {
      /* a fresh row */
      snprintf(id, sizeof id, "n%llu_%d", (unsigned long long)c, i);
      s.tag = BS_INSERT;
      if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        void *p = realloc(st->live, cap * sizeof *st->live);
        if (!p) {
          free(touched);
          return BS_ENOMEM;
        }
        st->live = p;
        st->cap = cap;
      }
      strcpy(st->live[st->n++], id);
    } else {
      memcpy(id, st->live[pick], sizeof id);
      s.tag = action < 8 ? BS_UPDATE : BS_DELETE;
      touched[pick] = s.tag == BS_DELETE ? 2 : 1;
    }
    snprintf(data, sizeof data, "{\"id\":\"%s\",\"c\":%llu,\"i\":%d}", id, (unsigned long long)c,
             i);
    snprintf(par, sizeof par, "{\"row\":\"%s\"}", id);
    s.table = cw_v("t");
    if (s.tag == BS_DELETE) {
      s.before_id = cw_v(id);
    } else {
      s.after_id = cw_v(id);
      row.bucket = cw_v(bucket);
      row.object_type = cw_v("t");
      row.object_id = cw_v(id);
      row.data = cw_v(data);
      s.rows = &row;
      s.n_rows = 1;
      lk.key.data = key;
      lk.key.size = cw_lookup_key(key, sizeof key, user);
      pv = cw_v(par);
      lk.params = &pv;
      lk.n_params = 1;
      s.lookups = &lk;
      s.n_lookups = 1;
    }
    if (w && (rc = bs_writer_save(w, &s, err)) != BS_OK) {
      free(touched);
      return rc;
    }
    if (st->seen) st->seen(st->ctx, &s);
  }
  /* drop the rows this commit deleted (touched 2); fresh rows (index >= n_before) stay */
  {
    size_t j = 0;
    for (size_t i = 0; i < st->n; i++)
      if (i >= n_before || touched[i] != 2) memmove(st->live[j++], st->live[i], 24);
    st->n = j;
  }
  free(touched);
  return BS_OK;
}

static void cw_lsn(char *buf, size_t cap, uint64_t c) {
  snprintf(buf, cap, CW_LSN_FMT, (unsigned long long)c);
}

#endif /* BS_CRASH_WORKLOAD_H */
