/*
 * lmdb_file.c: the check a database file passes before LMDB maps it. LMDB trusts its file: a
 * truncated one is mapped anyway and the first read past the end kills the process (SIGBUS), and
 * mdb_env_open creates `PATH-lock` beside whatever path it is given. So bs_open reads the two
 * meta pages here with pread, and refuses a file that is empty, is not LMDB, or is shorter than
 * its newest meta page says, with BS_ECORRUPT and a message that says which, before LMDB (or a
 * lock file) ever sees it.
 *
 * The layout is LMDB 0.9's (mdb.c, MDB_page and MDB_meta), native-endian, in the host's word
 * size: pages 0 and 1 are meta pages; each holds a page header then the meta record below.
 * Transaction N writes meta page N % 2, so the one with the larger txnid is current, and every
 * page LMDB may read lies below its mm_last_pg + 1 (mdb_page_get refuses higher page numbers).
 * Both meta pages must be valid, as LMDB requires. (mdb.c allows that "the file may be shorter if
 * the freeDB lists the final pages"; LMDB 0.9.24 was never seen to leave such a file, in the
 * whole test suite nor in transactions that free what they just allocated, so a file shorter than
 * its meta page says is taken as truncated.)
 */
#include "lmdb_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define LF_MAGIC        0xBEEFC0DEu /* MDB_MAGIC */
#define LF_DATA_VERSION 1u          /* MDB_DATA_VERSION of LMDB 0.9 */
#define LF_P_META       0x08u       /* MDB_page.mp_flags of a meta page */
#define LF_MIN_PAGE     512u        /* page sizes LMDB writes: the OS page size, a power of two */
#define LF_MAX_PAGE     65536u

/* MDB_page's header (PAGEHDRSZ bytes): pgno_t is size_t in a default LMDB build. */
typedef struct lf_page_head {
  size_t pgno;
  uint16_t pad, flags;
  uint16_t lower, upper;
} lf_page_head;

/* MDB_db: one B-tree's root record; mm_dbs[0] (free pages) also carries the page size. */
typedef struct lf_db {
  uint32_t pad; /* in mm_dbs[0]: the page size */
  uint16_t flags, depth;
  size_t branch_pages, leaf_pages, overflow_pages, entries, root;
} lf_db;

/* MDB_meta */
typedef struct lf_meta {
  uint32_t magic, version;
  void *address;
  size_t mapsize;
  lf_db dbs[2]; /* free pages, main database */
  size_t last_pg;
  size_t txnid;
} lf_meta;

#define LF_META_END (sizeof(lf_page_head) + sizeof(lf_meta)) /* bytes of a meta page read */

/* Reads meta page i (at offset i * psize, psize 0 for page 0) of a file of size bytes into m.
 * Returns BS_OK, or BS_ECORRUPT with the reason. */
static int read_meta(int fd, const char *path, uint64_t size, unsigned i, uint64_t psize,
                     lf_meta *m, bs_error *err) {
  unsigned char buf[LF_META_END];
  lf_page_head h;
  uint64_t off = i * psize;
  ssize_t got = pread(fd, buf, sizeof buf, (off_t)off);
  if (got < 0)
    return bs__fail(err, BS_EIO, "%s: reading meta page %u: %s", path, i, strerror(errno));
  if ((size_t)got < sizeof h + 8) {
    if (i == 0)
      return bs__fail(err, BS_ECORRUPT, "%s: not an LMDB/bucketstore file (%llu bytes)", path,
                      (unsigned long long)size);
    return bs__fail(err, BS_ECORRUPT, "%s: truncated: %llu bytes, the meta pages need %llu", path,
                    (unsigned long long)size, (unsigned long long)(2 * psize));
  }
  memcpy(&h, buf, sizeof h);
  memcpy(m, buf + sizeof h,
         (size_t)got - sizeof h < sizeof *m ? (size_t)got - sizeof h : sizeof *m);
  if (m->magic != LF_MAGIC || !(h.flags & LF_P_META))
    return i == 0 ? bs__fail(err, BS_ECORRUPT, "%s: not an LMDB/bucketstore file", path)
                  : bs__fail(err, BS_ECORRUPT, "%s: damaged: LMDB meta page 1 is not a meta page",
                             path);
  if (m->version != LF_DATA_VERSION)
    return bs__fail(err, BS_ECORRUPT,
                    "%s: not an LMDB/bucketstore file (LMDB data version %u, "
                    "this LMDB reads %u)",
                    path, m->version, LF_DATA_VERSION);
  if ((size_t)got < sizeof buf)
    return bs__fail(err, BS_ECORRUPT, "%s: truncated: %llu bytes, the meta page needs %llu", path,
                    (unsigned long long)size, (unsigned long long)(off + sizeof buf));
  return BS_OK;
}

static int stat_fd(int fd, const char *path, struct stat *sb, bs_error *err) {
  return fstat(fd, sb) == 0 ? BS_OK : bs__fail(err, BS_EIO, "%s: %s", path, strerror(errno));
}

/* The checks of the open file fd (bs__lmdb_file_check closes it). */
static int check_fd(int fd, const char *path, enum bs__lmdb_file_state *state, bs_error *err) {
  struct stat sb;
  lf_meta m[2];
  uint64_t size, psize, need;
  const lf_meta *cur;
  int rc;

  if ((rc = stat_fd(fd, path, &sb, err)) != BS_OK) return rc;
  if (!S_ISREG(sb.st_mode)) return bs__fail(err, BS_ECORRUPT, "%s: not a regular file", path);
  size = (uint64_t)sb.st_size;
  if (size == 0)
    return bs__fail(err, BS_ECORRUPT, "%s: empty file: not a bucketstore database", path);
  if ((rc = read_meta(fd, path, size, 0, 0, &m[0], err)) != BS_OK) return rc;
  psize = m[0].dbs[0].pad;
  if (psize < LF_MIN_PAGE || psize > LF_MAX_PAGE || (psize & (psize - 1)))
    return bs__fail(err, BS_ECORRUPT, "%s: damaged: LMDB page size %llu", path,
                    (unsigned long long)psize);
  if (size < 2 * psize)
    return bs__fail(err, BS_ECORRUPT, "%s: truncated: %llu bytes, the meta pages need %llu", path,
                    (unsigned long long)size, (unsigned long long)(2 * psize));
  if ((rc = read_meta(fd, path, size, 1, psize, &m[1], err)) != BS_OK) return rc;
  cur = m[1].txnid > m[0].txnid ? &m[1] : &m[0];
  if (cur->last_pg < 1 || cur->last_pg >= UINT64_MAX / psize)
    return bs__fail(err, BS_ECORRUPT, "%s: damaged: LMDB meta page claims last page %llu", path,
                    (unsigned long long)cur->last_pg);
  need = ((uint64_t)cur->last_pg + 1) * psize;
  /* The size that counts is taken after the meta pages were read: another process may commit
   * meanwhile, growing the file, and LMDB writes a commit's pages before its meta page, so a
   * whole file is at least as long as any meta page read before this stat says. (The size from
   * before the reads made bs_open fail as "truncated" beside a writer in another process.) */
  if ((rc = stat_fd(fd, path, &sb, err)) != BS_OK) return rc;
  size = (uint64_t)sb.st_size;
  if (size < need)
    return bs__fail(err, BS_ECORRUPT, "%s: truncated: %llu bytes, the meta page needs %llu", path,
                    (unsigned long long)size, (unsigned long long)need);
  *state = cur->dbs[1].entries == 0 ? BS_LMDB_FILE_NO_DATA : BS_LMDB_FILE_DATA;
  return BS_OK;
}

int bs__lmdb_file_check(const char *path, enum bs__lmdb_file_state *state, bs_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc;
  *state = fd < 0 && errno == ENOENT ? BS_LMDB_FILE_MISSING : BS_LMDB_FILE_DATA;
  if (fd < 0)
    return errno == ENOENT ? BS_OK : bs__fail(err, BS_EIO, "%s: %s", path, strerror(errno));
  rc = check_fd(fd, path, state, err);
  close(fd);
  return rc;
}
