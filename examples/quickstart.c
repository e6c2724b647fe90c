/* quickstart.c: the README's embedding example: replicate one row, make a checkpoint, read the
 * bucket checksum a client must arrive at. Build: cc quickstart.c -lbucketstore -llmdb -lnettle */
/* clang-format off */
#include "storage.h"
#include <stdio.h>
#define V(s) ((bs_val){s, sizeof(s) - 1})
#define TRY(call) if ((rc = (call)) != BS_OK) goto fail

int main(int argc, char **argv) {
  bs_db *db = NULL; bs_storage *st = NULL; bs_writer *w = NULL; bs_error err = {0};
  uint32_t stream; bs_checksum cs; int rc;
  bs_row row = {V("todos[\"u1\"]"), V("todos"), V("t1"), V("{\"id\":\"t1\"}")};
  bs_save s = BS_SAVE_INIT;
  s.table = V("todos"), s.tag = BS_INSERT, s.after_id = V("t1"), s.rows = &row, s.n_rows = 1;
  TRY(bs_open(&db, argc > 1 ? argv[1] : "quickstart.bsdb", NULL, &err)); /* created if missing */
  TRY(bs_stream_create(&stream, db, "sync-rules-v1", NULL, &err));
  TRY(bs_storage_open(&st, db, stream, &err));
  TRY(bs_writer_open(&w, st, NULL, &err));
  TRY(bs_writer_save(w, &s, &err));                      /* queued; nothing visible yet */
  TRY(bs_writer_snapshot_done(w, V("00000000/0000000A"), &err)); /* LSNs: fixed width */
  TRY(bs_writer_commit(NULL, w, V("00000000/0000000A"), NULL, &err)); /* checkpoint at op 1 */
  TRY(bs_get_checksums(&cs, st, 1, &row.bucket, 1, &err));
  printf("checksum %u over %llu op(s)\n", cs.checksum, (unsigned long long)cs.count);
fail:
  if (rc) fprintf(stderr, "%s (%s)\n", bs_strerror(rc), err.msg);
  bs_writer_close(w), bs_storage_close(st), bs_close(db);
  return rc ? 1 : 0;
}
