/*
 * op_head_set PATH STREAM HEAD: sets the op head (the last op id allocated) of stream STREAM of
 * the LMDB store at PATH to HEAD, as tests/util_head.c does for the C suites. No public call
 * moves it, and writing 2^53 ops to get there is out of reach, so the bindings' tests of op ids
 * above 2^53 from a real store (bindings/node/test/opids.test.js,
 * bindings/python/tests/test_opids.py) prepare their store with it: make node-test and make
 * py-test build it and name it in BS_TEST_OP_HEAD_SET. The stream must have written nothing yet.
 * Exit 0, or 1 with the library's message on stderr.
 */
#include <stdlib.h>
#include <string.h>

#include "util_head.h"

int main(int argc, char **argv) {
  bs_db *db = NULL;
  bs_error err = {0, ""};
  char *end;
  unsigned long long stream, head;
  int rc;
  if (argc != 4) {
    fprintf(stderr, "usage: op_head_set PATH STREAM HEAD\n");
    return 2;
  }
  stream = strtoull(argv[2], &end, 10);
  if (*end || !*argv[2] || stream == 0 || stream > UINT32_MAX) {
    fprintf(stderr, "op_head_set: STREAM %s is no stream id\n", argv[2]);
    return 2;
  }
  head = strtoull(argv[3], &end, 10);
  if (*end || !*argv[3]) {
    fprintf(stderr, "op_head_set: HEAD %s is no op id\n", argv[3]);
    return 2;
  }
  if ((rc = bs_open(&db, argv[1], NULL, &err)) == BS_OK)
    rc = ct_set_op_head(&ct_backends[CT_LMDB], db, argv[1], (uint32_t)stream, head, &err);
  bs_close(db);
  if (rc != BS_OK) {
    fprintf(stderr, "op_head_set %s: %s (%s)\n", argv[1], bs_strerror(rc), err.msg);
    return 1;
  }
  return 0;
}
