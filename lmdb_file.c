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
 * Both meta pages must be valid, as LMDB requires. mdb.c allows that "the file may be shorter if
 * the freeDB lists the final pages": a transaction that frees pages it allocated itself (a page
 * split and merged again, a chunk of ops rewritten twice, lmdb_ops.c) puts them on the free list
 * unwritten. So a file shorter than its meta page says is truncated unless every page it lacks
 * is on the free list, which is read here with pread too (free_covers).
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
#define LF_P_BRANCH     0x01u /* MDB_page.mp_flags */
#define LF_P_LEAF       0x02u
#define LF_F_BIGDATA    0x01u /* MDB_node.mn_flags: the data is on overflow pages */
#define LF_MAX_DEPTH    16u   /* of the free DB's tree: far above what a file reaches */
#define LF_INVALID      (~(size_t)0)

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

/* The free-page walk of free_covers: the pages [lo, hi] that no free list names yet (one bit
 * each), the page buffer, and the pages it may still read: a tree reads each page of the file
 * at most once, and a damaged one that names pages again must not make the walk unbounded. */
typedef struct lf_walk {
  const bs_allocator *a;
  int fd;
  uint64_t psize, size;
  size_t lo, hi, left, reads;
  unsigned char *missing, *page;
} lf_walk;

static int walk_page(lf_walk *w, size_t pgno, uint64_t off, unsigned char *buf, size_t n) {
  if (pgno >= w->size / w->psize || off + n > w->size || w->reads == 0) return 0;
  w->reads--;
  return pread(w->fd, buf, n, (off_t)(pgno * w->psize + off)) == (ssize_t)n;
}

/* Marks the pages a free list (IDL: u64 count, then page numbers) names. */
static void walk_idl(lf_walk *w, const unsigned char *p, size_t n) {
  size_t count;
  if (n < sizeof count) return;
  memcpy(&count, p, sizeof count);
  for (size_t i = 1; i <= count && (i + 1) * sizeof(size_t) <= n; i++) {
    size_t pg;
    memcpy(&pg, p + i * sizeof pg, sizeof pg);
    if (pg >= w->lo && pg <= w->hi && (w->missing[(pg - w->lo) / 8] >> ((pg - w->lo) % 8) & 1)) {
      w->missing[(pg - w->lo) / 8] &= (unsigned char)~(1u << ((pg - w->lo) % 8));
      w->left--;
    }
  }
}

/* Walks the free DB's subtree at pgno: 0 when a page of it is not in the file or not a page. */
static int walk_tree(lf_walk *w, size_t pgno, unsigned depth) {
  unsigned char *pg = w->page + depth * w->psize;
  lf_page_head h;
  size_t n;
  if (depth >= LF_MAX_DEPTH || !walk_page(w, pgno, 0, pg, w->psize)) return 0;
  memcpy(&h, pg, sizeof h);
  if (h.lower < sizeof h || h.lower > w->psize) return 0;
  n = (h.lower - sizeof h) / 2;
  for (size_t i = 0; i < n; i++) {
    uint16_t at, lo, hi, flags, ksize;
    memcpy(&at, pg + sizeof h + 2 * i, 2);
    if ((size_t)at + 8 > w->psize) return 0;
    memcpy(&lo, pg + at, 2);
    memcpy(&hi, pg + at + 2, 2);
    memcpy(&flags, pg + at + 4, 2);
    memcpy(&ksize, pg + at + 6, 2);
    if (h.flags & LF_P_BRANCH) {
      if (!walk_tree(w, (size_t)lo | (size_t)hi << 16 | (size_t)flags << 32, depth + 1)) return 0;
    } else if (h.flags & LF_P_LEAF) {
      size_t dsize = (size_t)lo | (size_t)hi << 16, data = (size_t)at + 8 + ksize;
      if (flags & LF_F_BIGDATA) {
        size_t ov;
        unsigned char *buf;
        if (data + sizeof ov > w->psize) return 0;
        memcpy(&ov, pg + data, sizeof ov);
        if (dsize > (size_t)64 << 20 || !(buf = bs__malloc(w->a, dsize ? dsize : 1))) return 0;
        if (!walk_page(w, ov, sizeof h, buf, dsize)) {
          bs__free(w->a, buf);
          return 0;
        }
        walk_idl(w, buf, dsize);
        bs__free(w->a, buf);
      } else {
        if (data + dsize > w->psize) return 0;
        walk_idl(w, pg + data, dsize);
      }
    } else {
      return 0;
    }
  }
  return 1;
}

/* Whether the free DB whose root is root lists every page from the file's end to last_pg (0
 * also when memory ran out: the file is then refused as truncated). */
static int free_covers(const bs_allocator *a, int fd, uint64_t size, uint64_t psize, size_t root,
                       size_t last_pg) {
  lf_walk w = {a,    fd,  psize, size, (size_t)(size / psize), last_pg, 0, (size_t)(size / psize),
               NULL, NULL};
  int ok = 0;
  if (root == LF_INVALID || size % psize || w.lo > w.hi || w.hi - w.lo >= (size_t)1 << 30) return 0;
  w.left = w.hi - w.lo + 1;
  w.missing = bs__malloc(a, w.left / 8 + 1);
  w.page = bs__malloc(a, LF_MAX_DEPTH * psize);
  if (w.missing && w.page) {
    memset(w.missing, 0xff, w.left / 8 + 1);
    ok = walk_tree(&w, root, 0) && w.left == 0;
  }
  bs__free(a, w.missing);
  bs__free(a, w.page);
  return ok;
}

static int stat_fd(int fd, const char *path, struct stat *sb, bs_error *err) {
  return fstat(fd, sb) == 0 ? BS_OK : bs__fail(err, BS_EIO, "%s: %s", path, strerror(errno));
}

/* The checks of the open file fd (bs__lmdb_file_check closes it). */
static int check_fd(const bs_allocator *a, int fd, const char *path,
                    enum bs__lmdb_file_state *state, bs_error *err) {
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
  if (size < need && !free_covers(a, fd, size, psize, cur->dbs[0].root, cur->last_pg))
    return bs__fail(err, BS_ECORRUPT, "%s: truncated: %llu bytes, the meta page needs %llu", path,
                    (unsigned long long)size, (unsigned long long)need);
  *state = cur->dbs[1].entries == 0 ? BS_LMDB_FILE_NO_DATA : BS_LMDB_FILE_DATA;
  return BS_OK;
}

int bs__lmdb_file_check(const bs_allocator *a, const char *path, enum bs__lmdb_file_state *state,
                        bs_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc;
  *state = fd < 0 && errno == ENOENT ? BS_LMDB_FILE_MISSING : BS_LMDB_FILE_DATA;
  if (fd < 0)
    return errno == ENOENT ? BS_OK : bs__fail(err, BS_EIO, "%s: %s", path, strerror(errno));
  rc = check_fd(a, fd, path, state, err);
  close(fd);
  return rc;
}
