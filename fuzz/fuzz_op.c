/*
 * fuzz_op: the LMDB value decoders that read stored bytes without copying: bs__lmdb_op_decode
 * (lmdb_internal.h) and bs__bucket_state_decode. Input: 1 byte key size selector, then the value.
 * Every decoded field must point inside the value.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lmdb_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(bs_val v, const uint8_t *p, size_t n) {
  if (v.size &&
      (!v.data || (const uint8_t *)v.data < p || (const uint8_t *)v.data + v.size > p + n))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char key[32];
  uint8_t *val;
  MDB_val k, v;
  bs_op op;
  size_t n;
  if (size < 1) return 0;
  memset(key, 0x5a, sizeof key);
  k.mv_size = data[0] & 0x80 ? data[0] & 31 : 16; /* mostly the right key size */
  k.mv_data = key;
  n = size - 1;
  /* an exact-size heap copy, so any read past the value is caught */
  val = malloc(n ? n : 1);
  if (!val) return 0;
  if (n) memcpy(val, data + 1, n);
  v.mv_size = n;
  v.mv_data = val;
  if (bs__lmdb_op_decode(&k, &v, &op) == BS_OK) {
    inside(op.object_type, val, n);
    inside(op.object_id, val, n);
    inside(op.subkey, val, n);
    inside(op.data, val, n);
    if (op.type < BS_OP_PUT || op.type > BS_OP_CLEAR) abort();
    if (op.object_type.size + op.object_id.size + op.subkey.size + op.data.size + 18 > n) abort();
  }
  {
    bs__bucket_state s;
    if (bs__bucket_state_decode(&v, &s) == BS_OK) inside(s.name, val, n);
  }
  free(val);
  return 0;
}
