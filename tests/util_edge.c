/*
 * util_edge.c: the shared pool of edge values (see util_edge.h).
 */
#include "util_edge.h"

#include <stdint.h>
#include <string.h>

#define S(lit, kinds)                                                                              \
  { {lit, sizeof(lit) - 1}, kinds }

static const ue_str STRINGS[] = {
    S("", UE_EMPTY),
    S("a", 0),
    S("0", 0),
    S(".", UE_JSONISH), /* the PUT checksum joins with "." */
    S("1", 0),
    S("1.0", 0),
    S("\"", UE_JSONISH),
    S("\\", UE_JSONISH),
    S("a\"b\\c", UE_JSONISH),
    S("{\"id\":\"t1\"}", UE_JSONISH),
    S("null", 0),
    S("caf\xc3\xa9", UE_NONASCII),
    S("\xe2\x82\xac\xf0\x9f\x98\x80", UE_NONASCII), /* euro sign, emoji */
    S("\xc3\xa9\"\\", UE_NONASCII | UE_JSONISH),
    S("\xf0\x90\x80\x80", UE_NONASCII), /* U+10000, the first astral code point */
    S("\xf4\x8f\xbf\xbf", UE_NONASCII), /* U+10FFFF, the last */
    S("\xff", UE_NOTUTF8),              /* one byte, never in UTF-8 */
    S("\x80", UE_NOTUTF8),              /* a continuation byte alone */
    S("caf\xc3", UE_NOTUTF8),           /* cut inside a sequence */
    S("\xed\xa0\x80", UE_NOTUTF8),      /* the surrogate U+D800, encoded */
    S("\xc0\x80", UE_NOTUTF8),          /* an overlong NUL (no NUL byte) */
    S("\xf4\x90\x80\x80", UE_NOTUTF8),  /* above U+10FFFF */
    S("a\xfe\xff\"z", UE_NOTUTF8 | UE_JSONISH),
    S("a\0b", UE_NUL),
    S("\0", UE_NUL),
    S("x.y.z", UE_JSONISH),
    S("by_user[\"u1\"]", UE_JSONISH),
};

const ue_str *ue_strings(size_t *n_out) {
  *n_out = sizeof STRINGS / sizeof STRINGS[0];
  return STRINGS;
}

#define UE_BUF (BS_MAX_OBJECT_NAME + 2u)
static char g_len_buf[4][UE_BUF];

bs_val ue_str_len(size_t n, unsigned variant) {
  char *b = g_len_buf[variant % 4];
  size_t i;
  bs_val v;
  if (n > UE_BUF - 1) n = UE_BUF - 1;
  /* 'm' with a variant-dependent byte every 61 and at the end: distinct variants differ */
  for (i = 0; i < n; i++) b[i] = (char)(i % 61 == 60 ? 'A' + (variant % 26) : 'm');
  if (n) b[n - 1] = (char)('0' + variant % 10);
  v.data = b;
  v.size = n;
  return v;
}

bs_val ue_str_pick(ct_rng *r, size_t max, unsigned avoid, unsigned *kinds_out) {
  size_t n = sizeof STRINGS / sizeof STRINGS[0];
  if (max == 0) max = BS_MAX_OBJECT_NAME;
  for (int tries = 0; tries < 1000; tries++) {
    unsigned pick = (unsigned)ct_below(r, 8);
    if (pick == 0) { /* a maximum-length value, or one over */
      unsigned k = (!(avoid & UE_OVER) && ct_below(r, 3) == 0) ? UE_OVER : UE_MAXLEN;
      if (avoid & k) continue;
      if (kinds_out) *kinds_out = k;
      return ue_str_len(k == UE_OVER ? max + 1 : max, (unsigned)ct_below(r, 4));
    }
    const ue_str *s = &STRINGS[ct_below(r, n)];
    if ((s->kinds & avoid) || s->v.size > max) continue;
    if (kinds_out) *kinds_out = s->kinds;
    return s->v;
  }
  if (kinds_out) *kinds_out = 0;
  return STRINGS[1].v; /* "a": every mask allows it */
}

void ue_name(ct_rng *r, char *buf, size_t max, unsigned avoid, const char *names, size_t n,
             size_t stride) {
  bs_val v = ue_str_pick(r, max, avoid | UE_NUL | UE_OVER, NULL);
  for (size_t i = 0; i < n; i++) {
    const char *o = names + i * stride;
    if (strlen(o) == v.size && memcmp(o, v.data, v.size) == 0) return;
  }
  memcpy(buf, v.data, v.size);
  buf[v.size] = 0;
}

uint64_t ue_op_id(ct_rng *r, uint64_t head) {
  const uint64_t edges[] = {0,
                            1,
                            head,
                            head + 1,
                            head + 2,
                            (UINT64_C(1) << 32) - 1,
                            UINT64_C(1) << 32,
                            UINT64_C(1) << 53,
                            (UINT64_C(1) << 53) + 1,
                            (UINT64_C(1) << 63) - 1,
                            UINT64_C(1) << 63,
                            UINT64_MAX};
  if (ct_below(r, 6)) return head + 2 > head ? ct_below(r, head + 2) : ct_rand(r);
  return edges[ct_below(r, sizeof edges / sizeof edges[0])];
}

/* ---- Lookup values ---------------------------------------------------------------------------- */

#define SC_INT(l, x, same)                                                                         \
  { l, {BS_SCALAR_INT, x, 0, {NULL, 0}}, same }
#define SC_DBL(l, x, same)                                                                         \
  { l, {BS_SCALAR_DOUBLE, 0, x, {NULL, 0}}, same }
#define SC_STR(l, lit, same)                                                                       \
  { l, {BS_SCALAR_STRING, 0, 0, {lit, sizeof(lit) - 1}}, same }
#define SC_OF(l, t, same)                                                                          \
  { l, {t, 0, 0, {NULL, 0}}, same }

static const ue_scalar SCALARS[] = {
    SC_INT("1", 1, -1),
    SC_DBL("1.0", 1.0, 0), /* integral: the same key as 1 */
    SC_INT("0", 0, -1),
    SC_DBL("-0", -0.0, 2), /* integral zero: the same key as 0 */
    SC_DBL("0.5", 0.5, -1),
    SC_DBL("3.14", 3.14, -1),
    SC_INT("314", 314, -1),
    SC_DBL("314.0", 314.0, 6),
    SC_INT("-1", -1, -1),
    SC_INT("2^53", 9007199254740992, -1),
    SC_DBL("2^53 as a double", 9007199254740992.0, 9), /* integral: the same key as 2^53 */
    SC_INT("2^53 + 1", 9007199254740993, -1),          /* no double has it: never 2^53 */
    SC_INT("-(2^53 + 1)", -9007199254740993, -1),
    SC_INT("int64 max", INT64_MAX, -1),
    SC_INT("int64 min", INT64_MIN, -1),
    SC_DBL("2^63", 9223372036854775808.0, -1), /* integral, outside int64: stays a double */
    SC_DBL("-2^63", -9223372036854775808.0, 14),
    SC_DBL("1e300", 1e300, -1),
    SC_OF("true", BS_SCALAR_TRUE, -1),
    SC_OF("false", BS_SCALAR_FALSE, -1),
    SC_OF("null", BS_SCALAR_NULL, -1),
    SC_STR("\"\"", "", -1),
    SC_STR("\"1\"", "1", -1),
    SC_STR("\"u1\"", "u1", -1),
    SC_STR("\"caf\xc3\xa9\"", "caf\xc3\xa9", -1),
    SC_STR("\"a\\\"b\"", "a\"b\\", -1),
    SC_STR("\"a\\0b\"", "a\0b", -1), /* NUL inside: last, so it can be left out */
};
#define N_SCALARS (sizeof SCALARS / sizeof SCALARS[0])

const ue_scalar *ue_scalars(size_t *n_out) {
  *n_out = N_SCALARS;
  return SCALARS;
}

const ue_scalar *ue_scalar_pick(ct_rng *r, int allow_nul) {
  return &SCALARS[ct_below(r, allow_nul ? N_SCALARS : N_SCALARS - 1)];
}

bs_val ue_lookup_key(ct_rng *r, unsigned char *buf, size_t cap, int allow_nul) {
  static char pad[BS_MAX_LOOKUP_KEY];
  bs_scalar v[3];
  size_t n = 1 + ct_below(r, 3), size = 0, i;
  bs_val k = {buf, 0};
  for (i = 0; i < n; i++) v[i] = ue_scalar_pick(r, allow_nul)->v;
  if (ct_below(r, 8) == 0) { /* the last value a string that makes the key exactly the maximum */
    size_t len = 0;
    memset(pad, 'k', sizeof pad);
    v[n - 1] = (bs_scalar){BS_SCALAR_STRING, 0, 0, {pad, 0}};
    for (int tries = 0; tries < 8; tries++) {
      bs_lookup_encode(buf, cap, &size, v, n, NULL); /* the size, also when over */
      if (size == BS_MAX_LOOKUP_KEY) break;
      if (size < BS_MAX_LOOKUP_KEY)
        len += BS_MAX_LOOKUP_KEY - size;
      else
        len -= len < size - BS_MAX_LOOKUP_KEY ? len : size - BS_MAX_LOOKUP_KEY;
      v[n - 1].s.size = len;
    }
  }
  if (bs_lookup_encode(buf, cap, &size, v, n, NULL) != BS_OK) fail_msg("ue_lookup_key: encode");
  k.size = size;
  return k;
}

bs_val ue_data(ct_rng *r, size_t max) {
  static char big[UE_DATA_MAX];
  size_t n;
  switch (ct_below(r, 8)) {
  case 0:
    n = 0;
    break;
  case 1:
    n = 1;
    break;
  case 2:
    n = 65535 + ct_below(r, 2);
    break;
  case 3:
    n = ct_below(r, 4) == 0 ? UE_DATA_MAX : 3900 + ct_below(r, 201);
    break;
  default:
    n = 3900 + ct_below(r, 201);
  }
  if (n > max) { /* about the chunk size instead, or max */
    size_t c = 3900 + ct_below(r, 201);
    n = c <= max ? c : max;
  }
  if (n == UE_DATA_MAX) {
    memset(big, 'd', sizeof big);
    big[n - 1] = (char)('0' + ct_below(r, 10));
    return (bs_val){big, n};
  }
  return ue_str_len(n, (unsigned)ct_below(r, 4));
}
