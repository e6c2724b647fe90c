/*
 * checksum.c: op checksums (contract.md section 3) and row subkeys. xxHash is used privately
 * (XXH_INLINE_ALL): every XXH_* symbol is static to this file, so a host that links its own
 * xxHash never clashes with ours. The checksum cache above the backends is the front's (cache.c).
 */
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nettle/sha2.h>

/* ---- Op checksums ---------------------------------------------------------------------------- */

/* Hash of the concatenation of parts, streamed so nothing is allocated. The xxh3 and sha256
 * states live on the stack. */
uint32_t bs__hash_parts(bs_hash hash, const bs_val *parts, size_t n) {
  if (hash == BS_HASH_SHA256) {
    struct sha256_ctx ctx;
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    for (size_t i = 0; i < n; i++)
      if (parts[i].size) sha256_update(&ctx, parts[i].size, (const uint8_t *)parts[i].data);
    sha256_digest(&ctx, sizeof digest, digest);
    return (uint32_t)digest[0] | (uint32_t)digest[1] << 8 | (uint32_t)digest[2] << 16 |
           (uint32_t)digest[3] << 24;
  } else {
    /* Short input (the usual REMOVE, small PUTs): one-shot over a stack copy is cheaper than
     * the streaming state's setup. Both give the same hash. */
    unsigned char buf[256];
    size_t total = 0;
    for (size_t i = 0; i < n && total <= sizeof buf; i++) total += parts[i].size;
    if (total <= sizeof buf) {
      size_t off = 0;
      for (size_t i = 0; i < n; i++) {
        if (parts[i].size) memcpy(buf + off, parts[i].data, parts[i].size);
        off += parts[i].size;
      }
      return (uint32_t)XXH3_64bits(buf, off);
    }
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (size_t i = 0; i < n; i++)
      if (parts[i].size) XXH3_64bits_update(&state, parts[i].data, parts[i].size);
    return (uint32_t)XXH3_64bits_digest(&state);
  }
}

uint32_t bs_checksum_put(bs_hash hash, bs_val object_type, bs_val object_id, bs_val data) {
  /* The usual PUT (xxh3, a small row): its input laid out directly, without bs__hash_parts'
   * loops over six parts. Sizes are bounded (names <= 64 KiB, data <= 15 MiB): no overflow. */
  size_t n = 6 + object_type.size + object_id.size + data.size;
  if (hash != BS_HASH_SHA256 && n <= 256) {
    unsigned char buf[256], *p = buf;
    memcpy(p, "put.", 4);
    p += 4;
    if (object_type.size) memcpy(p, object_type.data, object_type.size);
    p += object_type.size;
    *p++ = '.';
    if (object_id.size) memcpy(p, object_id.data, object_id.size);
    p += object_id.size;
    *p++ = '.';
    if (data.size) memcpy(p, data.data, data.size);
    return (uint32_t)XXH3_64bits(buf, n);
  }
  bs_val parts[6] = {{"put.", 4}, object_type, {".", 1}, object_id, {".", 1}, data};
  return bs__hash_parts(hash, parts, 6);
}

uint32_t bs_checksum_remove(bs_hash hash, bs_val subkey) {
  bs_val parts[2] = {{"delete.", 7}, subkey};
  return bs__hash_parts(hash, parts, 2);
}

/* ---- Subkeys --------------------------------------------------------------------------------- */

/* Lower-case hex of n bytes (n a multiple of 4), four bytes per step in one 64-bit word (SWAR):
 * each byte goes to a 16-bit lane as (high nibble, low nibble), '0' is added to every nibble and
 * 'a' - '0' - 10 more to those >= 10. A byte-at-a-time loop cost ~9 instructions per byte, and
 * bs_subkey runs once per saved row. */
static void hex_bytes(char *out, const unsigned char *p, size_t n) {
  const uint64_t lo = UINT64_C(0x000f000f000f000f), ones = UINT64_C(0x0101010101010101);
  for (size_t i = 0; i < n; i += 4) {
    uint64_t v = (uint64_t)p[i] | (uint64_t)p[i + 1] << 16 | (uint64_t)p[i + 2] << 32 |
                 (uint64_t)p[i + 3] << 48;
    uint64_t nib = ((v >> 4) & lo) | (v & lo) << 8; /* one nibble per byte, in order */
    uint64_t ge10 = ((nib + 6 * ones) >> 4) & ones; /* 1 in each byte whose nibble >= 10 */
    bs__put_u64le((unsigned char *)out + 2 * i, nib + 0x30 * ones + ge10 * ('a' - '0' - 10));
  }
}

void bs_subkey(char out[BS_SUBKEY_SIZE], uint32_t table_id, bs_val replica_id) {
  unsigned char tid[4];
  XXH128_canonical_t canon;
  XXH128_hash_t h = XXH3_128bits(replica_id.size ? replica_id.data : "", replica_id.size);
  bs__put_u32be(tid, table_id);
  hex_bytes(out, tid, 4);
  out[8] = '/';
  XXH128_canonicalFromHash(&canon, h);
  hex_bytes(out + 9, canon.digest, 16);
}
