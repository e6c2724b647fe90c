/*
 * fuzz_api: the public C API (storage.h) driven by sequences of calls decoded from the input, on
 * LMDB files in a temporary directory and on the memory backend: opens, reopens and second
 * handles of one file, streams, storages and writers opened and closed in any order the API
 * allows, saves and reads with edge values (absent, "", one byte, non-ASCII bytes with NULs,
 * each field's BS_MAX_* and one over), commits at rising, equal and lower LSNs, compaction,
 * backup, export, verify, and NULL handles.
 *
 * Every call must return BS_OK or a BS_E* code (BS_EUSER, or a progress's BS_ECANCELED, when a
 * callback stopped it: never the callback's own value), and a failure must fill bs_error with that
 * code and a message. Invariants checked where the manual
 * makes them certain: a bucket's checksum and count at the current checkpoint are the sum and
 * number of its ops read back there; bs_list_buckets' figures are bs_get_checksums' at the last
 * persisted op; a commit's result names the checkpoint bs_get_checkpoint then reads; a
 * verify finds no problem, and every LMDB database verifies clean before it is closed; a backup
 * opens and verifies clean, and a failed one leaves nothing beside it.
 *
 * Input: a sequence of operations, each one opcode byte followed by the argument bytes it reads
 * (missing bytes read as 0). Each input starts from no database.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NDB   2
#define NST   2
#define STOP  (-1000) /* a callback's own code: the call answers BS_EUSER, never it */
#define MAXOP 64

static char tdir[256], path[300], copy[300];
static unsigned char *big; /* BS_MAX_OP_DATA + 1 bytes: every maximum and one over */
static char sname[BS_MAX_STREAM_NAME + 2];
static unsigned long calls, inputs;
static int trace; /* BS_FUZZ_TRACE set: each call's line and status to stderr */

static const uint8_t *in;
static size_t in_n;

static bs_db *db[NDB];
static int on_file[NDB]; /* db[d] is an LMDB file (not the memory backend) */
static bs_storage *st[NST];
static int st_db[NST];
static bs_writer *wr[NST]; /* wr[i] writes through st[i] */
static unsigned lsn_n;
static char lsn_buf[16];

static bs_error E;
static int stopped; /* the callback returned its stop code during the current call */
static int stop_at; /* the callback stops at its stop_at-th invocation (0: never) */

static unsigned u8(void) {
  unsigned b = 0;
  if (in_n) {
    b = *in++;
    in_n--;
  }
  return b;
}

static void fail(int line, const char *what, long long a, long long b) {
  fprintf(stderr, "fuzz_api:%d: %s (%lld, %lld): err %d '%s'\n", line, what, a, b, E.code, E.msg);
  abort();
}
#define REQUIRE(c, a, b)                                                                           \
  do {                                                                                             \
    if (!(c)) fail(__LINE__, #c, (long long)(a), (long long)(b));                                  \
  } while (0)

/* Clears E and the callback state before a call. */
static void pre(void) {
  E.code = 1;
  E.msg[0] = '\0';
  stopped = 0;
  calls++;
}

/* The returned status is a documented one, and a failure is described in E. */
static int post(int rc, int line) {
  if (trace) fprintf(stderr, "fuzz_api:%d: %d %s\n", line, rc, rc ? E.msg : "");
  if (rc == BS_OK) return rc;
  if (rc < BS_EUSER || rc > 0) fail(line, "undocumented status", rc, 0);
  if (rc == BS_EUSER && !stopped) fail(line, "BS_EUSER without a callback's stop", rc, 0);
  if (E.code != rc) fail(line, "err.code is not the returned status", rc, E.code);
  if (!E.msg[0] || !memchr(E.msg, '\0', sizeof E.msg)) fail(line, "no message", rc, 0);
  return rc;
}
#define CALL(expr) (pre(), post((expr), __LINE__))

static int stop_here(void) {
  if (stop_at && --stop_at == 0) {
    stopped = 1;
    return STOP;
  }
  return 0;
}

/* A value for a field of at most max bytes. */
static bs_val pick(size_t max) {
  static const unsigned char odd[] = {0xc3, 0xa9, 0x00, 0xff, 'z'};
  static unsigned char one[256];
  static const char *const names[] = {"a", "b", "c", "t"};
  unsigned s = u8();
  bs_val v = {NULL, 0};
  switch (s % 8) {
  case 0:
    break; /* absent */
  case 1:
    v.data = "";
    break;
  case 2:
    one[s] = (unsigned char)s;
    v.data = one + s;
    v.size = 1;
    break;
  case 3:
    v.data = odd;
    v.size = sizeof odd;
    break;
  case 4:
    v.data = big;
    v.size = max;
    break;
  case 5:
    v.data = big;
    v.size = max + 1;
    break;
  default:
    v.data = names[(s >> 3) & 3];
    v.size = 1;
  }
  return v;
}

static const char *stream_name(void) {
  unsigned s = u8() % 5;
  memset(sname, 'a', sizeof sname - 1);
  sname[sizeof sname - 1] = '\0';
  switch (s) {
  case 0:
    return NULL;
  case 1:
    return "";
  case 2:
    return "s";
  case 3:
    sname[BS_MAX_STREAM_NAME] = '\0';
    return sname;
  default:
    return sname; /* one over */
  }
}

/* An LSN rising, equal or lower than the last one, or an edge value. */
static bs_val lsn(void) {
  unsigned s = u8();
  bs_val v;
  switch (s % 6) {
  case 0:
  case 1:
    lsn_n++;
    break;
  case 2:
    break;
  case 3:
    if (lsn_n) lsn_n--;
    break;
  default:
    return pick(BS_MAX_LSN);
  }
  snprintf(lsn_buf, sizeof lsn_buf, "%08u", lsn_n);
  v.data = lsn_buf;
  v.size = 8;
  return v;
}

static void close_writer(int i) {
  calls++;
  bs_writer_close(wr[i]);
  wr[i] = NULL;
}
static void close_storage(int i) {
  close_writer(i);
  calls++;
  bs_storage_close(st[i]);
  st[i] = NULL;
}
static void on_problem(const char *problem, void *p);
/* Whether the database file at p verifies clean (opened read-only when db is NULL). */
static void verify_clean(bs_db *d, const char *p) {
  bs_open_options ro = BS_OPEN_OPTIONS_INIT;
  bs_db *own = NULL;
  uint64_t problems = 0;
  ro.flags = BS_OPEN_RDONLY;
  if (!d) REQUIRE(CALL(bs_open(&own, p, &ro, &E)) == BS_OK, 0, 0);
  if (CALL(bs_db_verify(&problems, d ? d : own, on_problem, NULL, &E)) == BS_OK)
    REQUIRE(problems == 0, problems, 0);
  calls++;
  bs_close(own);
}

static void close_db(int d) {
  for (int i = 0; i < NST; i++)
    if (st[i] && st_db[i] == d) close_storage(i);
  if (db[d] && on_file[d]) verify_clean(db[d], NULL); /* the calls made on it kept it sound */
  calls++;
  bs_close(db[d]);
  db[d] = NULL;
}

static void remove_files(void) {
  char p[320];
  unlink(path);
  unlink(copy);
  snprintf(p, sizeof p, "%s-lock", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-lock", copy);
  unlink(p);
}

static void cleanup(void) {
  remove_files();
  rmdir(tdir);
  free(big);
  fprintf(stderr, "fuzz_api: %lu inputs, %lu calls\n", inputs, calls);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  (void)argc;
  (void)argv;
  trace = getenv("BS_FUZZ_TRACE") != NULL;
  snprintf(tdir, sizeof tdir, "%s/bs_fuzzapi_XXXXXX", base);
  if (!mkdtemp(tdir)) abort();
  snprintf(path, sizeof path, "%s/db", tdir);
  snprintf(copy, sizeof copy, "%s/copy", tdir);
  if (!(big = malloc(BS_MAX_OP_DATA + 1))) abort();
  memset(big, 'x', BS_MAX_OP_DATA + 1);
  atexit(cleanup);
  return 0;
}

static void op_open(void) {
  unsigned s = u8();
  int d = s & 1;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  if (db[d]) close_db(d);
  oo.flags = (s & 2 ? BS_OPEN_RDONLY : 0) | (s & 4 ? 0 : BS_OPEN_NOSYNC);
  oo.map_size = s & 8 ? 0 : 1 << 16; /* small: the map grows under the fuzzer */
  oo.checksum_cache_entries = s & 16 ? (size_t)-1 : 0;
  if (s & 32) oo.version = 0;
  on_file[d] = !(s & 64);
  if (s & 64)
    CALL(bs_open_memory(&db[d], &oo, &E));
  else
    CALL(bs_open(&db[d], path, &oo, &E));
}

static int on_stream(const bs_stream_info *info, void *p) {
  REQUIRE(info->name.data && info->name.size >= 1, info->id, info->name.size);
  ++*(unsigned *)p;
  return stop_here();
}

static void op_streams(void) {
  unsigned s = u8(), n = 0;
  bs_db *d = s & 4 ? NULL : db[s & 1];
  bs_stream_options so = BS_STREAM_OPTIONS_INIT;
  uint32_t id = 0;
  so.hash = (bs_hash)((s >> 3) % 3); /* 2 is no hash */
  if (s & 2) {
    stop_at = (s >> 5) & 3;
    CALL(bs_stream_list(d, s & 32 ? on_stream : NULL, &n, &E));
    stop_at = 0;
  } else {
    CALL(bs_stream_create(s & 32 ? NULL : &id, d, stream_name(), s & 64 ? NULL : &so, &E));
  }
}

static void op_storage(void) {
  unsigned s = u8();
  int i = s & 1, d = (s >> 1) & 1;
  if (s & 4) {
    close_storage(i);
    return;
  }
  if (st[i]) close_storage(i);
  st_db[i] = d;
  if (CALL(bs_storage_open(&st[i], db[d], (s >> 3) % 4, &E)) == BS_OK)
    REQUIRE(st[i] && bs_storage_stream_id(st[i]) > 0, s, 0);
}

static void op_writer(void) {
  unsigned s = u8();
  int i = s & 1;
  bs_writer_options wo = BS_WRITER_OPTIONS_INIT;
  if (s & 2) {
    close_writer(i);
    return;
  }
  if (wr[i]) close_writer(i);
  wo.snapshot = (s >> 2) & 1;
  wo.create_empty = (s >> 3) & 1;
  wo.max_records = (s >> 4) & 3; /* 1..3: auto-flushes */
  if (s & 64) wo.version = 99;
  CALL(bs_writer_open(&wr[i], st[i], s & 128 ? NULL : &wo, &E));
}

static void op_save(void) {
  unsigned s = u8();
  bs_save sv = BS_SAVE_INIT;
  bs_row rows[2];
  bs_lookup lk;
  bs_val params[2];
  size_t n = (s >> 3) % 3;
  sv.table = pick(BS_MAX_TABLE_NAME);
  sv.tag = (bs_tag)((s >> 1) % 4); /* 0 is no tag */
  if (s & 32) sv.before_id = pick(BS_MAX_REPLICA_ID);
  sv.after_id = pick(BS_MAX_REPLICA_ID);
  for (size_t k = 0; k < n; k++) {
    rows[k].bucket = pick(BS_MAX_BUCKET_NAME);
    rows[k].object_type = pick(BS_MAX_OBJECT_NAME);
    rows[k].object_id = pick(BS_MAX_OBJECT_NAME);
    rows[k].data = pick(BS_MAX_OP_DATA);
  }
  sv.rows = n ? rows : NULL;
  sv.n_rows = n;
  if (s & 64) {
    params[0] = pick(64);
    params[1] = pick(64);
    lk.key = pick(BS_MAX_LOOKUP_KEY);
    lk.params = params;
    lk.n_params = u8() % 3;
    sv.lookups = &lk;
    sv.n_lookups = 1;
  }
  if (s & 128) sv.stored_data = pick(64);
  if (!sv.tag) sv.version = u8() % 3; /* 1 is the only version known */
  CALL(bs_writer_save(wr[s & 1], &sv, &E));
}

static void op_commit(void) {
  unsigned s = u8();
  bs_writer *w = wr[s & 1];
  bs_commit_options co = BS_COMMIT_OPTIONS_INIT;
  bs_commit_result res;
  bs_checkpoint cp;
  uint64_t last = 0;
  bs_val l = lsn();
  co.create_empty = (int)((s >> 4) % 3) - 1;
  switch ((s >> 1) & 7) {
  case 0:
  case 1:
    if (CALL(bs_writer_commit(&res, w, l, s & 64 ? NULL : &co, &E)) == BS_OK) {
      REQUIRE(!res.checkpoint_blocked || !res.checkpoint_created, res.checkpoint_blocked, 0);
      REQUIRE(res.checkpoint_blocked == (res.blocked_reason != BS_BLOCKED_NONE), res.blocked_reason,
              0);
      if (st[s & 1] && CALL(bs_get_checkpoint(&cp, st[s & 1], &E)) == BS_OK)
        REQUIRE(cp.op_id == res.checkpoint, cp.op_id, res.checkpoint);
    }
    break;
  case 2:
    CALL(bs_writer_keepalive(s & 64 ? NULL : &res, w, l, &E));
    break;
  case 3:
    CALL(bs_writer_snapshot_done(w, l, &E));
    break;
  case 4:
    CALL(bs_writer_resume_lsn(w, l, &E));
    break;
  case 5:
    CALL(bs_writer_flush(s & 64 ? NULL : &last, w, &E));
    break;
  default:
    if (s & 64)
      CALL(bs_writer_drop(w, pick(BS_MAX_TABLE_NAME), &E));
    else
      CALL(bs_writer_truncate(w, pick(BS_MAX_TABLE_NAME), &E));
  }
}

static int on_source(const bs_val *data, void *p) {
  REQUIRE(!data || data->data, 0, 0);
  (void)p;
  return stop_here();
}

static void op_writer_misc(void) {
  unsigned s = u8();
  bs_writer *w = wr[s & 1];
  uint64_t c = s & 2 ? (uint64_t)1 << 63 : u8();
  bs_val user = pick(BS_MAX_USER_ID), event = pick(255);
  switch ((s >> 2) & 3) {
  case 0:
    user = pick(BS_MAX_TABLE_NAME);
    event = pick(BS_MAX_REPLICA_ID);
    stop_at = (s >> 4) & 1;
    CALL(bs_writer_source_row(w, user, event, s & 32 ? NULL : on_source, NULL, &E));
    stop_at = 0;
    break;
  case 1:
    CALL(bs_writer_custom_write_checkpoint(w, user, c, event, &E));
    break;
  default:
    CALL(bs_writer_custom_write_checkpoint_requested(w, user, c, event, s & 16 ? -1 : 5, &E));
  }
}

struct sum {
  uint32_t checksum;
  uint64_t count, after;
  int seen;
};

static int on_chunk(const bs_chunk *c, void *p) {
  struct sum *sum = p;
  REQUIRE(c->bucket.data && (c->ops || !c->n_ops), c->n_ops, 0);
  for (size_t k = 0; k < c->n_ops; k++) {
    const bs_op *o = &c->ops[k];
    REQUIRE(o->op_id > sum->after && o->type >= BS_OP_PUT && o->type <= BS_OP_CLEAR, o->op_id,
            o->type);
    REQUIRE((o->type == BS_OP_PUT) == (o->data.data != NULL), o->type, o->op_id);
    sum->checksum += o->checksum;
    sum->count++;
    sum->after = o->op_id;
  }
  REQUIRE(c->next_after == sum->after, c->next_after, sum->after);
  return stop_here();
}

/* Reads one bucket's ops at the current checkpoint, page by page, against its checksum. */
static void op_bucket(void) {
  unsigned s = u8();
  bs_storage *t = st[s & 1];
  bs_batch_options bo = BS_BATCH_OPTIONS_INIT;
  bs_bucket_request req;
  bs_checkpoint cp;
  bs_checksum ck;
  struct sum sum = {0, 0, 0, 0};
  uint64_t c = 0;
  int more = 1, rc = BS_OK;
  req.bucket = pick(BS_MAX_BUCKET_NAME);
  bo.limit = (s >> 1) % 4; /* 0 is refused */
  bo.chunk_bytes = (s >> 3) & 1 ? 0 : 16;
  if (t && CALL(bs_get_checkpoint(&cp, t, &E)) == BS_OK) c = cp.op_id;
  if (s & 16) c = (uint64_t)1 << 63;
  stop_at = (s >> 5) & 3;
  while (more && rc == BS_OK) {
    uint64_t before = sum.count;
    req.after = sum.after;
    rc = CALL(bs_get_bucket_data(&more, t, c, &req, 1, s & 128 ? NULL : &bo, on_chunk, &sum, &E));
    REQUIRE(rc != BS_OK || !more || sum.count > before, sum.count, before); /* no progress */
  }
  stop_at = 0;
  if (rc == BS_OK && CALL(bs_get_checksums(&ck, t, c, &req.bucket, 1, &E)) == BS_OK) {
    REQUIRE(ck.count == sum.count, ck.count, sum.count);
    REQUIRE(ck.checksum == sum.checksum, ck.checksum, sum.checksum);
  }
}

struct listing {
  bs_storage *st;
  uint64_t at;
};

static int on_bucket(const bs_bucket_info *info, void *p) {
  struct listing *l = p;
  bs_checksum ck;
  REQUIRE(info->name.data && info->name.size >= 1 && info->count >= 1, info->name.size,
          info->count);
  if (CALL(bs_get_checksums(&ck, l->st, l->at, &info->name, 1, &E)) == BS_OK) {
    REQUIRE(ck.count == info->count, ck.count, info->count);
    REQUIRE(ck.checksum == info->checksum, ck.checksum, info->checksum);
  }
  return stop_here();
}

static int on_params(const bs_val *v, void *p) {
  REQUIRE(v->data, v->size, 0);
  (void)p;
  return stop_here();
}

static int on_changes(const bs_checkpoint_changes *c, void *p) {
  REQUIRE(!c->n_updated_buckets || c->updated_buckets, c->n_updated_buckets, 0);
  (void)p;
  return stop_here();
}

static void op_read(void) {
  unsigned s = u8();
  bs_storage *t = s & 128 ? NULL : st[s & 1];
  bs_status status;
  bs_checkpoint cp;
  struct listing l = {t, 0};
  bs_val keys[2];
  uint64_t id;
  int found;
  bs_head head;
  unsigned a = u8(), b = u8(); /* read here: argument order is unspecified */
  stop_at = (s >> 4) & 3;
  switch ((s >> 1) & 7) {
  case 0:
    if (CALL(bs_get_status(&status, t, &E)) == BS_OK) {
      l.at = status.last_persisted_op;
      REQUIRE(status.checkpoint <= status.last_persisted_op, status.checkpoint,
              status.last_persisted_op);
      CALL(bs_list_buckets(t, pick(BS_MAX_BUCKET_NAME), on_bucket, &l, &E));
    }
    break;
  case 1:
    keys[0] = pick(BS_MAX_LOOKUP_KEY);
    keys[1] = pick(BS_MAX_LOOKUP_KEY);
    CALL(bs_get_parameter_sets(t, a, keys, 1 + (s & 1), b % 3, on_params, NULL, &E));
    break;
  case 2:
    CALL(bs_get_checkpoint_changes(t, a, b, on_changes, NULL, &E));
    break;
  case 3:
    CALL(bs_wait_checkpoint(&cp, t, NULL, s & 64 ? -1 : 0, &E));
    break;
  case 4:
    head.connection = pick(BS_MAX_CONNECTION_NAME);
    head.lsn = lsn();
    CALL(bs_last_write_checkpoint(&id, &found, t, pick(BS_MAX_USER_ID), &head, s & 64 ? 0 : 1, &E));
    break;
  case 5:
    CALL(bs_set_write_checkpoint_mode(t, (bs_write_checkpoint_mode)(a % 3), pick(255), &E));
    break;
  default: {
    bs_managed_request mr;
    int adv;
    memset(&mr, 0, sizeof mr);
    head.connection = pick(BS_MAX_CONNECTION_NAME);
    head.lsn = lsn();
    mr.user_id = pick(BS_MAX_USER_ID);
    mr.heads = &head;
    mr.n_heads = 1;
    mr.has_request_id = s & 64 ? 1 : 0;
    mr.request_id = a;
    CALL(bs_create_managed_write_checkpoints(&id, &adv, t, &mr, 1, &E));
  }
  }
  stop_at = 0;
}

static int compact_progress(const bs_compact_stats *so_far, void *p) {
  (void)so_far;
  (void)p;
  return stop_here();
}

static void op_compact(void) {
  unsigned s = u8(), a = u8();
  bs_storage *t = st[s & 1];
  bs_compact_options co = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats stats;
  bs_val b;
  uint64_t n;
  if (s & 2) {
    CALL(bs_compact_initial_replication(&n, t, a & 1 ? 0 : (uint64_t)a << 56, a >> 1, &E));
    return;
  }
  co.min_bucket_changes = a & 1;
  co.min_change_ratio = a & 2 ? 0.0 : -1.0;
  co.incremental_only = (a >> 2) & 1;
  co.min_age_ms = a & 8 ? 0 : -1;
  co.compact_parameters = (a >> 4) & 1;
  co.defragment_ratio = a & 32 ? 0.5 : 0.0;
  co.max_ops_per_txn = (s >> 2) & 3; /* 1 is below the minimum */
  co.op_budget = (s >> 4) & 3;
  if (a & 64) {
    b = pick(BS_MAX_BUCKET_NAME);
    co.buckets = &b;
    co.n_buckets = 1;
  }
  if (a & 128) co.max_op_id = (uint64_t)1 << 63;
  co.progress = compact_progress;
  stop_at = (s >> 6) & 3;
  CALL(bs_compact(&stats, t, &co, &E));
  stop_at = 0;
}

static int backup_progress(uint64_t records, void *p) {
  (void)records;
  (void)p;
  return stop_here();
}
static int on_record(const bs_record *rec, void *p) {
  REQUIRE(rec->table && rec->key.data, rec->key.size, 0);
  ++*(uint64_t *)p;
  return stop_here();
}
static void on_problem(const char *problem, void *p) {
  (void)p;
  fprintf(stderr, "fuzz_api: verify: %s\n", problem);
}

/* Nothing but the files of the database and its copy (and their lock files) in the directory:
 * a failed backup leaves no temporary behind. */
static void only_known_files(void) {
  static const char *const known[] = {".", "..", "db", "db-lock", "copy", "copy-lock"};
  DIR *dir = opendir(tdir);
  struct dirent *e;
  REQUIRE(dir, 0, 0);
  while ((e = readdir(dir)) != NULL) {
    size_t k = 0;
    while (k < sizeof known / sizeof known[0] && strcmp(e->d_name, known[k])) k++;
    if (k == sizeof known / sizeof known[0]) {
      fprintf(stderr, "fuzz_api: %s/%s left behind\n", tdir, e->d_name);
      abort();
    }
  }
  closedir(dir);
}

static void op_db(void) {
  unsigned s = u8();
  bs_db *d = s & 128 ? NULL : db[s & 1];
  bs_backup_options bo = BS_BACKUP_OPTIONS_INIT;
  bs_stat stat;
  uint64_t n = 0;
  stop_at = (s >> 4) & 3;
  switch ((s >> 1) & 7) {
  case 0:
    bo.flags = (s >> 6) & 1 ? BS_BACKUP_REPLACE : 0;
    bo.progress = backup_progress;
    if (CALL(bs_backup(d, (s >> 4) & 1 ? path : copy, &bo, &E)) == BS_OK && !((s >> 4) & 1))
      verify_clean(NULL, copy);
    else
      only_known_files();
    break;
  case 1:
    CALL(bs_db_export(d, (s >> 6) & 1, on_record, &n, &E));
    break;
  case 2:
    stop_at = 0;
    if (CALL(bs_db_verify(&n, d, on_problem, NULL, &E)) == BS_OK) REQUIRE(n == 0, n, 0);
    break;
  case 3:
    CALL(bs_db_stat(&stat, d, &E));
    break;
  case 4:
    if (st[s & 1]) {
      const char *m = s & 64 ? "" : sname;
      memset(sname, 'e', sizeof sname - 1);
      sname[sizeof sname - 1] = '\0';
      CALL(bs_report_error(st[s & 1], m, &E));
    }
    break;
  default:
    /* clear or terminate: the stream's writer then refuses its calls */
    if (s & 64)
      CALL(bs_clear(st[s & 1], &E));
    else
      CALL(bs_terminate(st[s & 1], (s >> 5) & 1, &E));
  }
  stop_at = 0;
}

/* Every call that takes a handle refuses NULL with BS_EINVAL. */
static void op_null(void) {
  bs_checkpoint cp;
  bs_status status;
  bs_stat stat;
  bs_val lsn0 = {"1", 1};
  bs_save sv = BS_SAVE_INIT;
  bs_writer *w = NULL;
  bs_storage *t = NULL;
  uint64_t u;
  unsigned which = u8() % 14;
  int found;
  int rc = 0;
  switch (which) {
  case 0:
    rc = CALL(bs_writer_save(NULL, &sv, &E));
    break;
  case 1:
    rc = CALL(bs_writer_commit(NULL, NULL, lsn0, NULL, &E));
    break;
  case 2:
    rc = CALL(bs_writer_flush(&u, NULL, &E));
    break;
  case 3:
    rc = CALL(bs_writer_open(&w, NULL, NULL, &E));
    break;
  case 4:
    rc = CALL(bs_storage_open(&t, NULL, 0, &E));
    break;
  case 5:
    rc = CALL(bs_get_checkpoint(&cp, NULL, &E));
    break;
  case 6:
    rc = CALL(bs_get_status(&status, NULL, &E));
    break;
  case 7:
    rc = CALL(bs_db_stat(&stat, NULL, &E));
    break;
  case 8:
    rc = CALL(bs_compact(NULL, NULL, NULL, &E));
    break;
  case 9:
    rc = CALL(bs_stream_create(NULL, NULL, "s", NULL, &E));
    break;
  case 10:
    rc = CALL(bs_get_checkpoint(NULL, st[0], &E));
    break;
  case 11:
    rc = CALL(bs_last_write_checkpoint(&u, &found, NULL, lsn0, NULL, 0, &E));
    break;
  case 12: /* a NULL handle's close is a no-op */
    calls += 3;
    bs_writer_close(NULL);
    bs_storage_close(NULL);
    bs_close(NULL);
    return;
  default:
    calls++;
    rc = bs_set_checkpoint_listener(NULL, NULL, NULL); /* no err argument */
  }
  REQUIRE(rc == BS_EINVAL, rc, which);
  REQUIRE(!w && !t, which, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static void (*const ops[])(void) = {
      op_open,   op_streams, op_storage, op_writer, op_save, op_save, op_commit, op_writer_misc,
      op_bucket, op_read,    op_compact, op_db,     op_null, op_save, op_commit, op_bucket};
  const size_t nops = sizeof ops / sizeof ops[0];
  unsigned order;
  if (size > 4096) return 0;
  in = data;
  in_n = size;
  inputs++;
  lsn_n = 0;
  remove_files();
  for (int k = 0; k < MAXOP && in_n; k++) ops[u8() % nops]();
  /* close what is left in an order the input chooses (writers before their storage) */
  order = u8();
  for (int i = 0; i < NST; i++) close_writer(order & 1 ? i : NST - 1 - i);
  for (int i = 0; i < NST; i++) close_storage(order & 2 ? i : NST - 1 - i);
  for (int d = 0; d < NDB; d++) close_db(order & 4 ? d : NDB - 1 - d);
  return 0;
}
