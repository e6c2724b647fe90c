/*
 * powercut.so: an LD_PRELOAD shim that cuts the power under a process, in the spirit of SQLite's
 * crash VFS. Environment:
 *   BS_POWERCUT_FILE  the file to watch (the database)
 *   BS_POWERCUT_AT    the watched call (1-based: a write to the file or a sync of it) at which
 *                     the power goes, before the call runs
 *   BS_POWERCUT_OUT   where the file is left as the power cut leaves it
 *   BS_POWERCUT_SEED  chooses which unsynced sectors survive
 * It keeps the file's durable image: what it held at open, plus every write a sync made
 * durable (fdatasync, fsync, or a write through a descriptor opened O_SYNC / O_DSYNC, as LMDB's
 * meta page is). At the cut, BS_POWERCUT_OUT gets the durable image with each page written since
 * the last sync kept, lost, or torn (each 512-byte sector kept or lost on its own), a lost sector
 * past the durable end reading as zeros; then the process exits at once (status 99), as a
 * machine that loses power runs nothing more. Watched: open, pwrite, pwritev, write and writev
 * (LMDB writes its pages with lseek + writev), fdatasync, fsync. msync is not: LMDB calls it only
 * with MDB_WRITEMAP, which bucketstore does not set.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define SECTOR 512
#define PAGE   4096
#define MAXFD  1024

static const char *g_path; /* BS_POWERCUT_FILE; NULL: watch nothing */
static char g_real[4096];  /* its canonical path, compared with each opened one's */
static unsigned long g_at; /* the call that cuts; 0: never */
static unsigned long g_calls;
static uint64_t g_rng;
static unsigned char g_fd[MAXFD]; /* 0: not the file; 1: the file; 2: the file, O_SYNC/O_DSYNC */
static unsigned char *g_durable;  /* the durable image */
static size_t g_dsize;            /* its size */
static unsigned char *g_dirty;    /* a byte per sector written since the last sync */
static size_t g_ndirty;           /* sectors g_dirty covers */

static uint64_t next_rand(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void die(const char *what) {
  fprintf(stderr, "powercut: %s\n", what);
  _exit(98);
}

static void *real(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f) die(name);
  return f;
}

/* Reads the file through a descriptor of the shim's own (the watched ones may be write-only, as
 * LMDB's O_DSYNC meta descriptor is); fd is ignored. */
static ssize_t real_pread(int fd, void *b, size_t n, off_t at) {
  static ssize_t (*f)(int, void *, size_t, off_t);
  static int rfd = -1;
  (void)fd;
  if (!f) f = (ssize_t(*)(int, void *, size_t, off_t))real("pread");
  if (rfd < 0 && (rfd = ((int (*)(const char *, int, ...))real("open"))(g_real, O_RDONLY)) < 0)
    die("opening the file for reading");
  return f(rfd, b, n, at);
}

static void init(void) {
  static int done;
  const char *at, *seed;
  if (done) return;
  done = 1;
  g_path = getenv("BS_POWERCUT_FILE");
  at = getenv("BS_POWERCUT_AT");
  seed = getenv("BS_POWERCUT_SEED");
  g_at = at ? strtoul(at, NULL, 10) : 0;
  g_rng = seed ? strtoull(seed, NULL, 10) : 1;
  if (g_path && !realpath(g_path, g_real)) g_real[0] = 0; /* resolved when it is created */
}

/* Grows the durable image and the dirty map to cover size bytes. */
static void cover(size_t size) {
  size_t sectors = (size + SECTOR - 1) / SECTOR;
  unsigned char *d, *b;
  if (sectors <= g_ndirty) return;
  if (!(d = realloc(g_dirty, sectors))) die("out of memory");
  g_dirty = d;
  if (!(b = realloc(g_durable, sectors * SECTOR))) die("out of memory");
  g_durable = b;
  memset(g_dirty + g_ndirty, 0, sectors - g_ndirty);
  memset(g_durable + g_ndirty * SECTOR, 0, (sectors - g_ndirty) * SECTOR);
  g_ndirty = sectors;
}

/* The first descriptor of the file: what the file holds now is durable (it is what the last
 * power cut, or a clean run, left). */
static void adopt(int fd) {
  struct stat st;
  if (g_durable || fstat(fd, &st) != 0) return;
  cover((size_t)st.st_size + 1);
  g_dsize = (size_t)st.st_size;
  if (g_dsize && real_pread(fd, g_durable, g_dsize, 0) != (ssize_t)g_dsize) die("reading the file");
}

static int watched_path(const char *path) {
  char r[4096];
  if (!g_path) return 0;
  if (!realpath(path, r)) return 0;
  if (!g_real[0] && strcmp(path, g_path) == 0) strcpy(g_real, r);
  return strcmp(r, g_real) == 0;
}

static int opened(int fd, const char *path, int flags) {
  init();
  if (fd >= 0 && fd < MAXFD) {
    g_fd[fd] = 0;
    if (watched_path(path)) {
      g_fd[fd] = (flags & (O_SYNC | O_DSYNC)) ? 2 : 1;
      adopt(fd);
    }
  }
  return fd;
}

static int watched(int fd) {
  return fd >= 0 && fd < MAXFD && g_fd[fd];
}

/* Sectors [at, at + n) as they are in the file now become durable. */
static void make_durable(int fd, size_t at, size_t n) {
  size_t s = at / SECTOR, e = (at + n + SECTOR - 1) / SECTOR;
  struct stat st;
  if (fstat(fd, &st) != 0) die("fstat");
  cover((size_t)st.st_size);
  for (; s < e && s < g_ndirty; s++) {
    size_t from = s * SECTOR, len = SECTOR;
    if (from >= (size_t)st.st_size) break;
    if (from + len > (size_t)st.st_size) len = (size_t)st.st_size - from;
    if (real_pread(fd, g_durable + from, len, (off_t)from) != (ssize_t)len) die("pread");
    g_dirty[s] = 0;
  }
  if ((size_t)st.st_size > g_dsize && at + n >= (size_t)st.st_size) g_dsize = (size_t)st.st_size;
}

static void cut(int fd) {
  const char *out = getenv("BS_POWERCUT_OUT");
  struct stat st;
  size_t size, p, unsynced = 0, lost = 0;
  unsigned char *img, sec[SECTOR];
  int o;
  if (!out || fstat(fd, &st) != 0) die("BS_POWERCUT_OUT unset, or fstat failed");
  size = (size_t)st.st_size > g_dsize ? (size_t)st.st_size : g_dsize;
  cover(size);
  if (!(img = malloc(size + 1))) die("out of memory");
  memcpy(img, g_durable, size);
  for (p = 0; p * PAGE < size; p++) {
    unsigned fate = (unsigned)(next_rand() % 3); /* 0 lost, 1 kept, 2 torn */
    for (size_t s = p * PAGE / SECTOR; s < (p + 1) * PAGE / SECTOR && s < g_ndirty; s++) {
      size_t from = s * SECTOR, len = from + SECTOR > size ? size - from : SECTOR;
      if (from >= size) break;
      if (!g_dirty[s]) continue;
      unsynced++;
      if (fate == 0 || (fate == 2 && next_rand() % 2)) {
        lost++;
        continue;
      }
      if (from < (size_t)st.st_size) {
        size_t have = from + len > (size_t)st.st_size ? (size_t)st.st_size - from : len;
        if (real_pread(fd, sec, have, (off_t)from) != (ssize_t)have) die("pread");
        memcpy(img + from, sec, have);
      }
    }
  }
  /* a file written past its durable end keeps its new size: the lost sectors read as zeros */
  if ((o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) die("open BS_POWERCUT_OUT");
  if (write(o, img, size) != (ssize_t)size || fsync(o) != 0) die("write BS_POWERCUT_OUT");
  close(o);
  fprintf(stderr, "powercut: cut at call %lu: %zu of %zu unsynced sectors lost\n", g_at, lost,
          unsynced);
  _exit(99);
}

/* A watched call: the cut, when its number comes. */
static void event(int fd) {
  if (g_at && ++g_calls == g_at) cut(fd);
}

static void wrote(int fd, off_t at, ssize_t n) {
  struct stat st;
  size_t s, e;
  if (n <= 0 || at < 0) return;
  if (g_fd[fd] == 2) {
    make_durable(fd, (size_t)at, (size_t)n);
    return;
  }
  if (fstat(fd, &st) != 0) die("fstat");
  cover((size_t)st.st_size);
  for (s = (size_t)at / SECTOR, e = ((size_t)at + (size_t)n + SECTOR - 1) / SECTOR; s < e; s++)
    g_dirty[s] = 1;
}

static void synced(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) die("fstat");
  cover((size_t)st.st_size);
  for (size_t s = 0; s < g_ndirty; s++)
    if (g_dirty[s]) make_durable(fd, s * SECTOR, SECTOR);
  g_dsize = (size_t)st.st_size;
}

/* ---- The interposed calls ---------------------------------------------------------------- */

#define OPEN_MODE(flags, mode)                                                                     \
  do {                                                                                             \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                                         \
      va_list ap;                                                                                  \
      va_start(ap, flags);                                                                         \
      (mode) = (mode_t)va_arg(ap, int);                                                            \
      va_end(ap);                                                                                  \
    }                                                                                              \
  } while (0)

int open(const char *path, int flags, ...) {
  static int (*f)(const char *, int, ...);
  mode_t mode = 0;
  OPEN_MODE(flags, mode);
  if (!f) f = (int (*)(const char *, int, ...))real("open");
  return opened(f(path, flags, mode), path, flags);
}

int open64(const char *path, int flags, ...) {
  static int (*f)(const char *, int, ...);
  mode_t mode = 0;
  OPEN_MODE(flags, mode);
  if (!f) f = (int (*)(const char *, int, ...))real("open64");
  return opened(f(path, flags, mode), path, flags);
}

int __open_2(const char *path, int flags) {
  return open(path, flags);
}

int __open64_2(const char *path, int flags) {
  return open64(path, flags);
}

int close(int fd) {
  static int (*f)(int);
  if (!f) f = (int (*)(int))real("close");
  if (fd >= 0 && fd < MAXFD) g_fd[fd] = 0;
  return f(fd);
}

ssize_t pwrite(int fd, const void *b, size_t n, off_t at) {
  static ssize_t (*f)(int, const void *, size_t, off_t);
  ssize_t r;
  if (!f) f = (ssize_t(*)(int, const void *, size_t, off_t))real("pwrite");
  if (!watched(fd)) return f(fd, b, n, at);
  event(fd);
  r = f(fd, b, n, at);
  wrote(fd, at, r);
  return r;
}

ssize_t pwrite64(int fd, const void *b, size_t n, off_t at) {
  return pwrite(fd, b, n, at);
}

ssize_t pwritev(int fd, const struct iovec *v, int cnt, off_t at) {
  static ssize_t (*f)(int, const struct iovec *, int, off_t);
  ssize_t r;
  if (!f) f = (ssize_t(*)(int, const struct iovec *, int, off_t))real("pwritev");
  if (!watched(fd)) return f(fd, v, cnt, at);
  event(fd);
  r = f(fd, v, cnt, at);
  wrote(fd, at, r);
  return r;
}

ssize_t pwritev64(int fd, const struct iovec *v, int cnt, off_t at) {
  return pwritev(fd, v, cnt, at);
}

ssize_t write(int fd, const void *b, size_t n) {
  static ssize_t (*f)(int, const void *, size_t);
  off_t at;
  ssize_t r;
  if (!f) f = (ssize_t(*)(int, const void *, size_t))real("write");
  if (!watched(fd) || (at = lseek(fd, 0, SEEK_CUR)) < 0) return f(fd, b, n);
  event(fd);
  r = f(fd, b, n);
  wrote(fd, at, r);
  return r;
}

ssize_t writev(int fd, const struct iovec *v, int cnt) {
  static ssize_t (*f)(int, const struct iovec *, int);
  off_t at;
  ssize_t r;
  if (!f) f = (ssize_t(*)(int, const struct iovec *, int))real("writev");
  if (!watched(fd) || (at = lseek(fd, 0, SEEK_CUR)) < 0) return f(fd, v, cnt);
  event(fd);
  r = f(fd, v, cnt);
  wrote(fd, at, r);
  return r;
}

int fdatasync(int fd) {
  static int (*f)(int);
  int r;
  if (!f) f = (int (*)(int))real("fdatasync");
  if (!watched(fd)) return f(fd);
  event(fd);
  if ((r = f(fd)) == 0) synced(fd);
  return r;
}

int fsync(int fd) {
  static int (*f)(int);
  int r;
  if (!f) f = (int (*)(int))real("fsync");
  if (!watched(fd)) return f(fd);
  event(fd);
  if ((r = f(fd)) == 0) synced(fd);
  return r;
}
