/*
 * contract_own.c: the conformance suite run on "a backend of your own", as docs/testing.md tells
 * another program to do it (tests/contract_own_check.sh builds this file with the doc's own cc
 * command). The backend described here is an LMDB file opened by bs_open, under a name the
 * suite's helpers do not know: like any backend from outside, the suite cannot move its op head,
 * so it says so with CT_LACKS_OP_HEAD and the op-id-bound case is left out, named as skipped.
 */
#include "util_contract.h"

int main(void) {
  static const ct_backend mine = {"mine", 1, NULL, NULL, NULL, CT_LACKS_OP_HEAD, NULL};
  const ct_backend *backends[] = {&mine};
  return ct_run_contract(backends, 1) != 0;
}
