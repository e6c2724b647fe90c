/*
 * replicator.c: embedding bucketstore in a replication process. The shape every replicator
 * has: open the file, create (or resume) a stream, copy the initial snapshot, mark it done, then
 * loop: read changes from the source, save them, commit at each source transaction boundary.
 * The "source" here is a fake one (rows updated round by round); a real one reads a WAL or a
 * change stream and uses its positions as LSNs.
 *
 *   replicator [PATH]     (default: a temporary file, removed at the end)
 * Exits non-zero on any failure.
 */
#include "storage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS   200
#define ROUNDS 20

static bs_val str(const char *s) {
  bs_val v = {s, strlen(s)};
  return v;
}

static int die(const char *what, int rc, const bs_error *err) {
  fprintf(stderr, "replicator: %s: %s (%s)\n", what, bs_strerror(rc), err->msg);
  return 1;
}

/* One source row change: row `id` of table "todos" goes to bucket "list[<id % 4>]". */
static int save_row(bs_writer *w, int id, int version, bs_tag tag, bs_error *err) {
  char rid[16], bucket[16], data[64];
  bs_save s = BS_SAVE_INIT;
  bs_row row;
  snprintf(rid, sizeof rid, "%d", id);
  snprintf(bucket, sizeof bucket, "list[%d]", id % 4);
  snprintf(data, sizeof data, "{\"id\":%d,\"version\":%d}", id, version);
  row.bucket = str(bucket);
  row.object_type = str("todos");
  row.object_id = str(rid);
  row.data = str(data);
  s.table = str("todos");
  s.tag = tag;
  s.after_id = str(rid);
  s.rows = &row;
  s.n_rows = tag == BS_DELETE ? 0 : 1;
  return bs_writer_save(w, &s, err);
}

int main(int argc, char **argv) {
  char dir[] = "/tmp/replicator-XXXXXX", tmp[64], lsn[32], lock[80];
  const char *path = argc > 1 ? argv[1] : NULL;
  bs_open_options oo = BS_OPEN_OPTIONS_INIT;
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  bs_commit_result cr;
  bs_status status;
  uint32_t stream;
  int rc, i, round;

  if (!path) { /* bs_open creates a missing file (an existing empty one is refused) */
    if (!mkdtemp(dir)) return 1;
    snprintf(tmp, sizeof tmp, "%s/db", dir);
    path = tmp;
  }
  oo.flags = BS_OPEN_NOSYNC; /* an example: durability of the last commits does not matter */
  if ((rc = bs_open(&db, path, &oo, &err))) return die("open", rc, &err);
  if ((rc = bs_stream_create(&stream, db, "example", NULL, &err)) ||
      (rc = bs_storage_open(&st, db, stream, &err)) || (rc = bs_writer_open(&w, st, NULL, &err)))
    return die("stream", rc, &err);

  /* 1. Initial snapshot: every row once. The writer flushes in batches on its own. */
  for (i = 0; i < ROWS; i++)
    if ((rc = save_row(w, i, 0, BS_INSERT, &err))) return die("snapshot save", rc, &err);
  /* No checkpoint may be made below the position the snapshot was taken at. */
  if ((rc = bs_writer_snapshot_done(w, str("0000000000"), &err)))
    return die("snapshot_done", rc, &err);

  /* 2. Streaming: each round is one source transaction, committed at its LSN. A commit is
   * what clients can see: bs_writer_commit makes the checkpoint. */
  for (round = 1; round <= ROUNDS; round++) {
    for (i = round % 7; i < ROWS; i += 7)
      if ((rc = save_row(w, i, round, round % 5 == 0 && i % 3 == 0 ? BS_DELETE : BS_UPDATE, &err)))
        return die("save", rc, &err);
    snprintf(lsn, sizeof lsn, "%010d", round);
    if ((rc = bs_writer_commit(&cr, w, str(lsn), NULL, &err))) return die("commit", rc, &err);
    if (!cr.checkpoint_created) {
      fprintf(stderr, "replicator: round %d made no checkpoint\n", round);
      return 1;
    }
    printf("round %2d: checkpoint %llu at lsn %s\n", round, (unsigned long long)cr.checkpoint, lsn);
  }

  /* 3. Where to resume after a restart: the status carries the last committed LSN. */
  if ((rc = bs_get_status(&status, st, &err))) return die("status", rc, &err);
  if (!status.snapshot_done || status.checkpoint != cr.checkpoint || !status.has_lsn ||
      status.lsn_size != strlen(lsn) || memcmp(status.lsn, lsn, status.lsn_size) != 0) {
    fprintf(stderr, "replicator: status does not show the last commit\n");
    return 1;
  }
  printf("done: %d rounds, checkpoint %llu, resume after lsn %.*s\n", ROUNDS,
         (unsigned long long)status.checkpoint, (int)status.lsn_size, (const char *)status.lsn);

  bs_writer_close(w);
  bs_storage_close(st);
  bs_close(db);
  if (path == tmp) {
    snprintf(lock, sizeof lock, "%s-lock", tmp);
    unlink(tmp);
    unlink(lock);
    rmdir(dir);
  }
  return 0;
}
