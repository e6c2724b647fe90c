/*
 * test_double.c: bucketstore's memory backend as the storage of another program's tests. The
 * "application" below (app_*) writes todos through a bs_writer; its tests run against
 * bs_open_memory(): no file, no cleanup, microseconds per test, and the same contract as the
 * LMDB backend (the project's differential tests hold both to it). A counting allocator (the
 * per-handle bs_allocator hook) lets a test fail the N-th allocation and check that the
 * application reports the error instead of crashing.
 * Exits non-zero when a test fails.
 */
#include "storage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- The application under test ------------------------------------------------------------ */

/* Saves one todo of a user into bucket user["<owner>"] and commits it at lsn. */
static int app_add_todo(bs_writer *w, const char *id, const char *owner, const char *title,
                        const char *lsn, bs_error *err) {
  char bucket[64], data[256];
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  bs_val v;
  int rc;
  snprintf(bucket, sizeof bucket, "user[\"%s\"]", owner);
  snprintf(data, sizeof data, "{\"id\":\"%s\",\"title\":\"%s\"}", id, title);
  row.bucket.data = bucket;
  row.bucket.size = strlen(bucket);
  row.object_type.data = "todos";
  row.object_type.size = 5;
  row.object_id.data = id;
  row.object_id.size = strlen(id);
  row.data.data = data;
  row.data.size = strlen(data);
  s.table = row.object_type;
  s.after_id = row.object_id;
  s.rows = &row;
  s.n_rows = 1;
  if ((rc = bs_writer_save(w, &s, err))) return rc;
  v.data = lsn;
  v.size = strlen(lsn);
  return bs_writer_commit(NULL, w, v, NULL, err);
}

/* ---- Test helpers ----------------------------------------------------------------------------- */

static int failures;
#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "test_double: %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);        \
      failures++;                                                                                  \
      return;                                                                                      \
    }                                                                                              \
  } while (0)

/* A fresh store with one stream and its writer: the fixture of every test. */
typedef struct fixture {
  bs_db *db;
  bs_storage *st;
  bs_writer *w;
} fixture;

static int setup(fixture *f, const bs_allocator *alloc) {
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  bs_val lsn0 = {"00000000/00000000", 17}; /* LSNs compare byte-wise: keep them fixed-width */
  uint32_t id;
  memset(f, 0, sizeof *f);
  o.allocator = alloc;
  return bs_open_memory(&f->db, &o, NULL) || bs_stream_create(&id, f->db, "test", NULL, NULL) ||
         bs_storage_open(&f->st, f->db, id, NULL) || bs_writer_open(&f->w, f->st, NULL, NULL) ||
         bs_writer_snapshot_done(f->w, lsn0, NULL);
}

static void teardown(fixture *f) {
  bs_writer_close(f->w);
  bs_storage_close(f->st);
  bs_close(f->db);
}

static int collect(const bs_chunk *c, void *payload) {
  char *out = payload;
  size_t i;
  for (i = 0; i < c->n_ops; i++)
    if (c->ops[i].type == BS_OP_PUT)
      strncat(out, c->ops[i].data.data, c->ops[i].data.size < 200 ? c->ops[i].data.size : 200);
  return 0;
}

/* ---- Tests -------------------------------------------------------------------------------------- */

static void test_todo_lands_in_owner_bucket(void) {
  fixture f;
  bs_checkpoint cp;
  bs_bucket_request req = {{"user[\"ann\"]", 11}, 0};
  char got[1024] = "";
  int more;
  CHECK(setup(&f, NULL) == 0);
  CHECK(app_add_todo(f.w, "1", "ann", "milk", "00000000/00000001", NULL) == BS_OK);
  CHECK(bs_get_checkpoint(&cp, f.st, NULL) == BS_OK && cp.op_id > 0);
  CHECK(bs_get_bucket_data(&more, f.st, cp.op_id, &req, 1, NULL, collect, got, NULL) == BS_OK);
  CHECK(strcmp(got, "{\"id\":\"1\",\"title\":\"milk\"}") == 0);
  teardown(&f);
}

static void test_rejects_oversized_owner(void) {
  fixture f;
  char owner[600];
  bs_error err = {0, ""};
  memset(owner, 'x', sizeof owner - 1);
  owner[sizeof owner - 1] = '\0';
  CHECK(setup(&f, NULL) == 0);
  /* the bucket name is cut at 63 bytes by the app: fine; a 600-byte id is not */
  CHECK(app_add_todo(f.w, owner, "ann", "t", "00000000/00000001", &err) == BS_ETOOBIG);
  CHECK(strstr(err.msg, "replica") != NULL || strstr(err.msg, "id") != NULL);
  teardown(&f);
}

/* Allocator that fails every allocation after `budget` successful ones. */
typedef struct budget {
  long left;
} budget;
static void *b_malloc(void *o, size_t n) {
  budget *b = o;
  return b->left-- > 0 ? malloc(n) : NULL;
}
static void *b_realloc(void *o, void *p, size_t n) {
  budget *b = o;
  return b->left-- > 0 ? realloc(p, n) : NULL;
}
static void b_free(void *o, void *p) {
  (void)o;
  free(p);
}

static void test_out_of_memory_is_reported(void) {
  long k;
  int saw_enomem = 0, saw_ok = 0;
  /* For k = 0, 1, 2, ...: fail the k-th allocation of a commit; the app must get BS_ENOMEM
   * (or succeed once k is past what the call needs), never crash. */
  for (k = 0; k < 400 && !saw_ok; k++) {
    budget b = {1 << 30};
    bs_allocator a = {b_malloc, b_realloc, b_free, NULL};
    fixture f;
    int rc;
    a.opaque = &b;
    CHECK(setup(&f, &a) == 0);
    b.left = k;
    rc = app_add_todo(f.w, "1", "ann", "milk", "00000000/00000001", NULL);
    CHECK(rc == BS_OK || rc == BS_ENOMEM);
    saw_enomem |= rc == BS_ENOMEM;
    saw_ok |= rc == BS_OK;
    b.left = 1 << 30;
    teardown(&f);
  }
  CHECK(saw_enomem && saw_ok);
}

int main(void) {
  test_todo_lands_in_owner_bucket();
  test_rejects_oversized_owner();
  test_out_of_memory_is_reported();
  if (failures) return 1;
  printf("test_double: 3 tests passed\n");
  return 0;
}
