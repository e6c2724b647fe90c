/*
 * storage.c: the front of the library. Argument checks, error strings, the allocator, the
 * database base (checkpoint notification), and dispatch of every stream-level call through
 * the storage vtable. The checksum cache (checksum.c) is consulted here, above any backend.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Errors ---------------------------------------------------------------------------------- */

const char *bs_strerror(int code) {
  switch (code) {
  case BS_OK: return "BS_OK: success";
  case BS_EINVAL: return "BS_EINVAL: invalid argument";
  case BS_ENOTFOUND: return "BS_ENOTFOUND: not found";
  case BS_ETOOBIG: return "BS_ETOOBIG: key or value over a limit";
  case BS_ELIMIT: return "BS_ELIMIT: result limit exceeded";
  case BS_ESTATE: return "BS_ESTATE: call not valid in this state";
  case BS_EINVALIDATED: return "BS_EINVALIDATED: checkpoint was compacted; read a newer checkpoint";
  case BS_ESTALE: return "BS_ESTALE: read below the parameter-compaction horizon";
  case BS_ECORRUPT: return "BS_ECORRUPT: file does not decode";
  case BS_ENOMEM: return "BS_ENOMEM: out of memory";
  case BS_EIO: return "BS_EIO: I/O or LMDB error";
  case BS_EBUSY: return "BS_EBUSY: resource busy";
  case BS_EUNSUPPORTED: return "BS_EUNSUPPORTED: not supported by this backend";
  case BS_ECANCELED: return "BS_ECANCELED: cancelled";
  default: return "BS_EUNKNOWN: unknown status code";
  }
}

int bs_fail(bs_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int bs_fail_mdb(bs_error *err, int mdb_rc, const char *what) {
  int code = BS_EIO;
  if (mdb_rc == ENOMEM) code = BS_ENOMEM;
  else if (mdb_rc == MDB_CORRUPTED || mdb_rc == MDB_INVALID || mdb_rc == MDB_VERSION_MISMATCH ||
           mdb_rc == MDB_PAGE_NOTFOUND)
    code = BS_ECORRUPT;
  else if (mdb_rc == EAGAIN || mdb_rc == EBUSY || mdb_rc == MDB_READERS_FULL)
    code = BS_EBUSY;
  return bs_fail(err, code, "%s: %s", what, mdb_strerror(mdb_rc));
}

/* ---- Memory ---------------------------------------------------------------------------------- */

static void *libc_malloc(void *o, size_t n) { (void)o; return malloc(n); }
static void *libc_realloc(void *o, void *p, size_t n) { (void)o; return realloc(p, n); }
static void libc_free(void *o, void *p) { (void)o; free(p); }
const bs_allocator bs_default_allocator = {libc_malloc, libc_realloc, libc_free, NULL};

void *bs_malloc(const bs_allocator *a, size_t n) { return a->malloc_fn(a->opaque, n ? n : 1); }

void *bs_calloc(const bs_allocator *a, size_t n, size_t size) {
  void *p;
  if (size && n > SIZE_MAX / size) return NULL;
  p = bs_malloc(a, n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void *bs_realloc(const bs_allocator *a, void *p, size_t n) {
  return a->realloc_fn(a->opaque, p, n ? n : 1);
}

void bs_free(const bs_allocator *a, void *p) {
  if (p) a->free_fn(a->opaque, p);
}
