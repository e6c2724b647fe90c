/*
 * kill_files.h: what the programs that kill an LMDB operation at counted points (migrate_kill.c,
 * clear_kill.c) both need: a failure that ends the program, a database's records as bytes to
 * compare (bs_db_export), and fresh copies of a file. Header-only (static functions); the
 * including program defines KILL_PROG, its name for messages, first.
 */
#ifndef BS_KILL_FILES_H
#define BS_KILL_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"

typedef struct bytes {
  unsigned char *p;
  size_t n, cap;
} bytes;

static void die(const char *what, const char *detail) {
  fprintf(stderr, KILL_PROG ": FAIL: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static void append(bytes *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    if (!(b->p = realloc(b->p, b->cap))) die("out of memory", NULL);
  }
  if (n) memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void append_val(bytes *b, const void *data, size_t n) {
  uint64_t len = n;
  append(b, &len, sizeof len);
  append(b, data, n);
}

/* bs_db_export's callback: each record appended to the bytes at payload, length-prefixed. */
static int add_record(const bs_record *r, void *payload) {
  bytes *b = payload;
  append_val(b, r->table, strlen(r->table));
  append(b, &r->stream, sizeof r->stream);
  append_val(b, r->key.data, r->key.size);
  append_val(b, r->value.data, r->value.size);
  return 0;
}

static void copy_file(const char *from, const char *to) {
  char buf[1 << 16];
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  size_t n;
  if (!in || !out) die("cannot copy", from);
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) die("cannot write", to);
  if (ferror(in) || fclose(out) != 0) die("cannot copy", from);
  fclose(in);
}

static int same_file(const char *a, const char *b) {
  char x[1 << 12], y[1 << 12];
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  size_t na, nb;
  int same = fa && fb;
  while (same) {
    na = fread(x, 1, sizeof x, fa);
    nb = fread(y, 1, sizeof y, fb);
    same = na == nb && memcmp(x, y, na) == 0;
    if (na == 0) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

/* A fresh copy of base at work (and no lock file of an earlier run). */
static void fresh(const char *base, const char *work) {
  char lock[4200];
  snprintf(lock, sizeof lock, "%s-lock", work);
  (void)unlink(lock);
  copy_file(base, work);
}

#endif
