/*
 * fuzz_lookup: bs_lookup_decode on arbitrary bytes. A key that decodes must re-encode to exactly
 * the same bytes (lookup.c: the decoder accepts only canonical forms; keys over
 * BS_MAX_LOOKUP_KEY decode but do not encode: BS_ETOOBIG), and the decoded strings
 * must lie inside the key.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bs_scalar vals[64];
  unsigned char out[1024];
  size_t n = 0, m = 0;
  bs_val key = {size ? data : NULL, size};
  int rc = bs_lookup_decode(vals, 64, &n, key, NULL);
  if (rc != BS_OK) {
    if (rc != BS_ECORRUPT && rc != BS_ETOOBIG) abort();
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    if (vals[i].type == BS_SCALAR_STRING && vals[i].s.size &&
        ((const uint8_t *)vals[i].s.data < data ||
         (const uint8_t *)vals[i].s.data + vals[i].s.size > data + size))
      abort(); /* a borrowed string outside the key */
  rc = bs_lookup_encode(out, sizeof out, &m, vals, n, NULL);
  if (size <= BS_MAX_LOOKUP_KEY) { /* longer keys decode but are never encoded */
    if (rc != BS_OK || m != size || (size && memcmp(out, data, size) != 0))
      abort(); /* decode accepted a non-canonical form */
  }
  return 0;
}
