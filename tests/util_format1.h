/*
 * util_format1.h: format 1 of the LMDB layout, as the tests need it to write files that earlier
 * builds wrote (the library reads format 1 only in its migration, lmdb_format.c).
 */
#ifndef BS_UTIL_FORMAT1_H
#define BS_UTIL_FORMAT1_H

#include <string.h>

#include "internal.h"

/* Format 1's source record, written independently of the library
 * (docs/format.md 4.4 before format 2): what the migration to format 2 reads; out has room for
 * 17 + 20 per member + 2 per key + every string and the data. */
static inline size_t srec1_encode(unsigned char *p, const bs__srec *r) {
  unsigned char *s = p;
  *p++ = (unsigned char)((r->soft ? 1 : 0) | (r->has_data ? 2 : 0));
  bs__put_u32le(p, r->nm);
  bs__put_u32le(p + 4, r->nl);
  bs__put_u64le(p + 8, r->mark);
  p += 16;
  for (uint32_t i = 0; i < r->nm; i++) {
    bs__put_u64le(p, r->m[i].bucket);
    bs__put_u64le(p + 8, r->m[i].op);
    bs__put_u16le(p + 16, (uint32_t)r->m[i].object_type.size);
    bs__put_u16le(p + 18, (uint32_t)r->m[i].object_id.size);
    p += 20;
    memcpy(p, r->m[i].object_type.data, r->m[i].object_type.size);
    p += r->m[i].object_type.size;
    memcpy(p, r->m[i].object_id.data, r->m[i].object_id.size);
    p += r->m[i].object_id.size;
  }
  for (uint32_t i = 0; i < r->nl; i++) {
    bs__put_u16le(p, (uint32_t)r->lk[i].size);
    memcpy(p + 2, r->lk[i].data, r->lk[i].size);
    p += 2 + r->lk[i].size;
  }
  if (r->has_data) {
    memcpy(p, r->data.data, r->data.size);
    p += r->data.size;
  }
  return (size_t)(p - s);
}

#endif
