/*
 * test_clear.c: an LMDB clear is atomic (lmdb_write.c). Its first transaction resets the stream's
 * row and sets the fence; the records are then deleted in bounded transactions, the last of which
 * removes the fence. Stopped after the first of them (the seam, as a kill would), the file still
 * holds part of the records, yet every reader sees the clear complete: no bucket data, checksums
 * (0, 0), no parameter sets, no bucket listed, checkpoint changes invalidated, an export without
 * the stream's records; verify finds no problem and says the clear is pending; a read-only open
 * sees the same and writes nothing. The next read-write open, or the next write of the stream,
 * finishes the deletion. tests/crash/clear_kill.c kills a clear at each of its transactions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lmdb_internal.h"
#include "util_contract.h"

#define BUCKETS 20u
#define ROWS    400u
#define LOOKUPS 10u
#define BOUND   100u /* records a deletion transaction (the seam's bound) */

/* ROWS rows in BUCKETS buckets, each with a lookup of LOOKUPS keys; a commit at lsn. */
static uint64_t write_rows(ct_env *e, unsigned lsn) {
  const bs_val params[1] = {{(const unsigned char *)"{\"p\":1}", 7}};
  unsigned char kb[32];
  char id[16], bucket[16];
  bs_commit_result cr;
  for (unsigned i = 0; i < ROWS; i++) {
    bs_lookup lk = {ct_key_int(kb, sizeof kb, i % LOOKUPS), params, 1};
    snprintf(id, sizeof id, "r%u", i);
    snprintf(bucket, sizeof bucket, "b%u", i % BUCKETS);
    CT_OK(ct_save_lk(e->w, BS_INSERT, "t", NULL, id, CT_ROWS({bucket, "t", id, "{}"}), &lk, 1));
  }
  CT_OK(ct_commit(e->w, ct_lsn(lsn), &cr));
  assert_true(cr.checkpoint_created);
  return cr.checkpoint;
}

static int setup(void **state) {
  ct_env *e = ct_env_new(&ct_backends[CT_LMDB]);
  if (!e) return -1;
  *state = e;
  return 0;
}

static unsigned stop_at, batches;
static int stop_batch(unsigned n) {
  batches = n + 1;
  return n == stop_at ? BS_ECANCELED : BS_OK;
}

/* Clears (or terminates and clears) e's stream, stopped before its deletion's transaction
 * number `at` (0: none of them ran). */
static void clear_stopped(ct_env *e, unsigned at, int terminate) {
  stop_at = at;
  bs__lmdb_set_clear_seam(&(bs__lmdb_clear_seam){.records = BOUND, .batch = stop_batch});
  assert_int_equal(terminate ? bs_terminate(e->st, 1, &ct_err) : bs_clear(e->st, &ct_err),
                   BS_ECANCELED);
  bs__lmdb_set_clear_seam(NULL);
}

static int count_bucket(const bs_bucket_info *info, void *payload) {
  (void)info;
  ++*(unsigned *)payload;
  return 0;
}

typedef struct changes_seen {
  int invalidate;
  size_t buckets, lookups;
} changes_seen;

static int on_changes(const bs_checkpoint_changes *ch, void *payload) {
  changes_seen *s = payload;
  s->invalidate = ch->invalidate_data_buckets && ch->invalidate_parameter_buckets;
  s->buckets = ch->n_updated_buckets;
  s->lookups = ch->n_updated_lookups;
  return 0;
}

/* Every reader of st sees the stream empty at C (the checkpoint of before the clear). */
static void expect_cleared(bs_storage *st, uint64_t C) {
  unsigned char kb[LOOKUPS][32];
  bs_val lookups[LOOKUPS];
  unsigned listed = 0;
  changes_seen ch;
  bs_status s;
  for (unsigned i = 0; i < BUCKETS; i++) {
    char bucket[16];
    ct_oplist l;
    bs_checksum c;
    memset(&l, 0, sizeof l);
    snprintf(bucket, sizeof bucket, "b%u", i);
    CT_OK(ct_read_bucket(st, C, bucket, 0, &l));
    CT_EQ_U64(l.n, 0);
    ct_oplist_free(&l);
    CT_OK(ct_checksum(st, C, bucket, &c));
    CT_EQ_U64(c.count, 0);
    CT_EQ_U64(c.checksum, 0);
  }
  for (unsigned i = 0; i < LOOKUPS; i++) lookups[i] = ct_key_int(kb[i], sizeof kb[i], i);
  ct_expect_params(st, C, lookups, LOOKUPS, "");
  CT_OK(bs_list_buckets(st, (bs_val){NULL, 0}, count_bucket, &listed, &ct_err));
  CT_EQ_U64(listed, 0);
  memset(&ch, 0, sizeof ch);
  CT_OK(bs_get_checkpoint_changes(st, 0, C, on_changes, &ch, &ct_err));
  assert_true(ch.invalidate);
  CT_EQ_U64(ch.buckets, 0);
  CT_EQ_U64(ch.lookups, 0);
  memset(&s, 0, sizeof s);
  CT_OK(bs_get_status(&s, st, &ct_err));
  CT_EQ_U64(s.checkpoint, 0);
  CT_EQ_U64(s.last_persisted_op, C); /* the op head stays: ids are never reused */
}

typedef struct verdict {
  uint64_t problems;
  unsigned notes;
} verdict;

static void on_problem(const char *text, void *payload) {
  verdict *v = payload;
  if (strstr(text, "a clear is pending (not a problem)"))
    v->notes++;
  else
    print_message("verify: %s\n", text);
}

static verdict verify(bs_db *db) {
  verdict v = {0, 0};
  CT_OK(bs_db_verify(&v.problems, db, on_problem, &v, &ct_err));
  return v;
}

static int count_stream_records(const bs_record *r, void *payload) {
  if (r->stream) ++*(unsigned *)payload;
  return 0;
}

/* What the file holds of the stream beyond its row: ops + buckets + parameter entries + source
 * records (the stream is the database's only one), counted in the file itself: bs_db_stat counts
 * what readers see. */
static uint64_t records_left(bs_db *base) {
  bs__lmdb_db *db = (bs__lmdb_db *)base;
  MDB_dbi dbis[4] = {db->ops, db->buckets, db->params, db->source};
  uint64_t n = 0;
  MDB_txn *txn;
  CT_OK(bs__lmdb_txn_begin(db, MDB_RDONLY, &txn, &ct_err));
  for (int i = 0; i < 4; i++) {
    MDB_stat ms;
    assert_int_equal(mdb_stat(txn, dbis[i], &ms), 0);
    n += ms.ms_entries;
  }
  bs__lmdb_txn_abort(db, txn);
  return n;
}

/* bs_db_stat counts what readers see: nothing of a fenced stream but the stream itself. */
static void expect_stat_empty(bs_db *db) {
  bs_stat s;
  memset(&s, 0xff, sizeof s);
  CT_OK(bs_db_stat(&s, db, &ct_err));
  CT_EQ_U64(s.streams, 1);
  CT_EQ_U64(s.buckets, 0);
  CT_EQ_U64(s.ops_put + s.ops_remove + s.ops_move + s.ops_clear, 0);
  CT_EQ_U64(s.parameter_entries, 0);
  CT_EQ_U64(s.source_records, 0);
  CT_EQ_U64(s.write_checkpoints, 0);
}

/* After the first deletion transaction: the file holds records, every reader sees none. */
static void test_stopped_reads_complete(void **state) {
  ct_env *e = *state;
  uint64_t C = write_rows(e, 1), left;
  bs_open_options o = BS_OPEN_OPTIONS_INIT;
  unsigned exported = 0;
  bs_storage *st2;
  bs_db *ro;
  verdict v;
  CT_OK(bs_writer_custom_write_checkpoint(e->w, ct_v("u1"), 7, ct_v(NULL), &ct_err));
  CT_OK(bs_writer_flush(NULL, e->w, &ct_err));
  clear_stopped(e, 1, 0);
  left = records_left(e->db);
  assert_true(left > 0 && left < ROWS * 3 + BUCKETS + LOOKUPS);
  expect_cleared(e->st, C);
  expect_stat_empty(e->db);
  v = verify(e->db);
  CT_EQ_U64(v.problems, 0);
  CT_EQ_U64(v.notes, 1);
  CT_OK(bs_db_export(e->db, e->stream, count_stream_records, &exported, &ct_err));
  CT_EQ_U64(exported, 1); /* its row */
  /* a read-only open honours the fence and writes nothing */
  o.flags = BS_OPEN_RDONLY;
  CT_OK(bs_open(&ro, e->path, &o, &ct_err));
  CT_OK(bs_storage_open(&st2, ro, e->stream, &ct_err));
  expect_cleared(st2, C);
  v = verify(ro);
  CT_EQ_U64(v.problems, 0);
  CT_EQ_U64(v.notes, 1);
  CT_EQ_U64(records_left(ro), left);
  expect_stat_empty(ro);
  bs_storage_close(st2);
  bs_close(ro);
  /* the next read-write open finishes the deletion */
  CT_OK(ct_env_reopen(e));
  CT_EQ_U64(records_left(e->db), 0);
  v = verify(e->db);
  CT_EQ_U64(v.problems, 0);
  CT_EQ_U64(v.notes, 0);
  expect_cleared(e->st, C);
  /* and the stream takes writes again, above the op head */
  CT_OK(bs_writer_snapshot_done(e->w, ct_v(ct_lsn(1)), &ct_err));
  CT_EQ_U64(write_rows(e, 2), 2 * C); /* the ops (and lookups) of before, again */
}

/* The next write of the stream finishes the deletion before it writes (the writer was open before
 * the clear), and lands alone in the stream. */
static void test_stopped_write_finishes(void **state) {
  ct_env *e = *state;
  uint64_t C = write_rows(e, 1);
  bs_commit_result cr;
  ct_oplist l;
  verdict v;
  clear_stopped(e, 1, 0);
  assert_true(records_left(e->db) > 0);
  CT_OK(bs_writer_snapshot_done(e->w, ct_v(ct_lsn(1)), &ct_err)); /* the row only */
  assert_true(records_left(e->db) > 0);
  CT_OK(ct_save(e->w, BS_INSERT, "t", NULL, "r1", CT_ROWS({"b1", "t", "r1", "2"})));
  CT_OK(ct_commit(e->w, ct_lsn(2), &cr));
  CT_EQ_U64(records_left(e->db), 3); /* the op, its bucket, its source record */
  v = verify(e->db);
  CT_EQ_U64(v.problems, 0);
  CT_EQ_U64(v.notes, 0);
  memset(&l, 0, sizeof l);
  CT_OK(ct_read_bucket(e->st, C + 1, "b1", 0, &l));
  CT_EQ_U64(l.n, 1);
  CT_EQ_U64(l.v[0].op_id, C + 1);
  ct_oplist_free(&l);
}

/* A compaction is a write too: it finishes the deletion first. */
static void test_stopped_compact_finishes(void **state) {
  ct_env *e = *state;
  bs_compact_options o = BS_COMPACT_OPTIONS_INIT;
  bs_compact_stats stats;
  (void)write_rows(e, 1);
  clear_stopped(e, 0, 0);
  assert_true(records_left(e->db) > 0);
  CT_OK(bs_compact(&stats, e->st, &o, &ct_err));
  CT_EQ_U64(records_left(e->db), 0);
}

/* terminate with clear: the state and the fence in one transaction. */
static void test_stopped_terminate(void **state) {
  ct_env *e = *state;
  uint64_t C = write_rows(e, 1);
  bs_status s;
  clear_stopped(e, 2, 1);
  expect_cleared(e->st, C);
  memset(&s, 0, sizeof s);
  CT_OK(bs_get_status(&s, e->st, &ct_err));
  CT_EQ_U64(s.state, BS_STREAM_TERMINATED);
  bs_writer_close(e->w); /* a terminated stream takes no writer: ct_env_reopen opens none */
  e->w = NULL;
  bs_storage_close(e->st);
  e->st = NULL;
  bs_close(e->db);
  CT_OK(bs_open(&e->db, e->path, NULL, &ct_err));
  CT_EQ_U64(records_left(e->db), 0);
  CT_EQ_U64(verify(e->db).problems, 0);
}

/* An uninterrupted clear: bounded transactions, the last one finds nothing left; again: none. */
static void test_bounded(void **state) {
  ct_env *e = *state;
  uint64_t C = write_rows(e, 1), before = records_left(e->db);
  stop_at = UINT32_MAX;
  batches = 0;
  bs__lmdb_set_clear_seam(&(bs__lmdb_clear_seam){.records = BOUND, .batch = stop_batch});
  CT_OK(bs_clear(e->st, &ct_err));
  bs__lmdb_set_clear_seam(NULL);
  /* every record of the stream but the row (bucket states, changes and tables, which bs_stat does
   * not count, too), BOUND a transaction */
  assert_true(batches > before / BOUND && batches <= before / BOUND + 4);
  CT_EQ_U64(records_left(e->db), 0);
  expect_cleared(e->st, C);
  CT_EQ_U64(verify(e->db).notes, 0);
}

/* Behind the fence the stream's custom write checkpoints are deleted for cleanup too: it neither
 * counts them nor any other record (a managed one stays: the database's, not the stream's). */
static void test_stopped_cleanup(void **state) {
  ct_env *e = *state;
  uint64_t deleted = 99;
  (void)write_rows(e, 1);
  CT_OK(
      bs_writer_custom_write_checkpoint_requested(e->w, ct_v("c1"), 5, ct_v(NULL), 1000, &ct_err));
  CT_OK(bs_writer_flush(NULL, e->w, &ct_err));
  clear_stopped(e, 0, 0);
  assert_true(records_left(e->db) > 0);
  CT_OK(bs_delete_checkpoint_requests_before(&deleted, e->st, 2000, &ct_err));
  CT_EQ_U64(deleted, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stopped_reads_complete, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_write_finishes, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_compact_finishes, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_terminate, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_bounded, setup, ct_env_teardown),
      cmocka_unit_test_setup_teardown(test_stopped_cleanup, setup, ct_env_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
