#!/bin/sh
# amalgamate_check.sh: `make amalgamate`, then build a host program from just the two vendored
# files (bucketstore.c + storage.h, copied to an empty directory) with system LMDB and nettle;
# the host also links its own xxHash (libxxhash) to prove ours is private. The PostgreSQL
# backend's files are in it, compiled only with -DBS_HAVE_PG.
# Checks: bucketstore.c compiles with -Wall -Wextra -Werror (every -Wextra warning, unused
# parameters included) with gcc and clang, each as -std=c11 and -std=gnu11, at -O0 and -O2; the
# program runs; the object exports exactly the storage.h API (no XXH_*, no internal bs_* symbol).
# Run from the project root (make test does).
set -eu
MAKE=${MAKE:-make}
BUILD=${BUILD:-build}
cc=${CC:-cc}
COMPILERS=${COMPILERS:-gcc clang}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-amalg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "amalgamate_check: FAIL: $*" >&2; exit 1; }

$MAKE --no-print-directory -s amalgamate BUILD="$BUILD" >/dev/null
cp "$BUILD/amalgamation/bucketstore.c" "$BUILD/amalgamation/storage.h" \
  "$BUILD/amalgamation/storage_backend.h" "$tmp/"
[ "$(ls "$tmp")" = "$(printf 'bucketstore.c\nstorage.h\nstorage_backend.h')" ] || fail "unexpected files"
grep -qE '#include "(lmdb_)?internal.h"' "$tmp/bucketstore.c" && fail "a private header still included"

# Strict flags, no -D_GNU_SOURCE or -I: the vendored file must stand alone. Some warnings only
# appear with optimisation (flow analysis), others only without it. With libpq installed the
# -std=c11 builds have the PostgreSQL backend (-DBS_HAVE_PG), the -std=gnu11 ones do not.
pg=
if pkg-config --exists libpq 2>/dev/null; then pg="-DBS_HAVE_PG $(pkg-config --cflags libpq)"; fi
builds=0
for c in $COMPILERS; do
  command -v "$c" >/dev/null || fail "compiler $c not found (install it, or set COMPILERS)"
  for std in c11 gnu11; do
    with=; [ $std = c11 ] && with=$pg
    for opt in -O0 -O2; do
      "$c" -std=$std $opt -Wall -Wextra -Werror -Wshadow $with -c "$tmp/bucketstore.c" \
        -o "$tmp/strict$std.o" || fail "$c -std=$std $opt -Wall -Wextra -Werror $with: warnings above"
      builds=$((builds + 1))
    done
  done
done
$cc -std=c11 -O1 -Wall -Wextra -Werror -c "$tmp/bucketstore.c" -o "$tmp/bucketstore.o"

# Exported symbols must all be functions declared in storage.h, with the PostgreSQL backend too.
nm -g --defined-only "$tmp/bucketstore.o" | awk '{ print $3 }' | sort > "$tmp/exported"
nm -g --defined-only "$tmp/strictc11.o" | awk '{ print $3 }' | sort | cmp -s - "$tmp/exported" ||
  fail "the build with BS_HAVE_PG exports other symbols"
[ -s "$tmp/exported" ] || fail "nothing exported"
if grep -i xxh "$tmp/exported"; then fail "XXH symbols leak"; fi
while read -r sym; do
  grep -qE "[ *]$sym\\(" "$tmp/storage.h" "$tmp/storage_backend.h" ||
    fail "exported symbol $sym is not in storage.h or storage_backend.h"
done < "$tmp/exported"

cat > "$tmp/host.c" <<'C'
/* A host with its own (non-inlined) xxHash, using the vendored bucketstore on a file. */
#include "storage.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

int main(int argc, char **argv) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  bs_save s = BS_SAVE_INIT;
  bs_row row = {{"b", 1}, {"t", 1}, {"1", 1}, {"{\"x\":1}", 7}};
  bs_val bucket = {"b", 1};
  bs_checksum ck;
  bs_commit_result cr;
  uint32_t id;
  char lock[4200];
  if (argc != 2 || XXH64("x", 1, 0) == 0) return 2;
  if (bs_open(&db, argv[1], NULL, &err) || bs_stream_create(&id, db, "s", NULL, &err) ||
      bs_storage_open(&st, db, id, &err) || bs_writer_open(&w, st, NULL, &err))
    goto fail;
  s.table.data = "t"; s.table.size = 1;
  s.after_id.data = "1"; s.after_id.size = 1;
  s.rows = &row; s.n_rows = 1;
  if (bs_writer_save(w, &s, &err) || bs_writer_snapshot_done(w, bucket, &err) ||
      bs_writer_commit(&cr, w, bucket, NULL, &err) ||
      bs_get_checksums(&ck, st, cr.checkpoint, &bucket, 1, &err))
    goto fail;
  if (ck.count != 1 ||
      ck.checksum != bs_checksum_put(BS_HASH_XXH3, row.object_type, row.object_id, row.data)) {
    fprintf(stderr, "host: wrong checksum\n");
    return 1;
  }
  bs_writer_close(w); bs_storage_close(st); bs_close(db);
  snprintf(lock, sizeof lock, "%s-lock", argv[1]);
  unlink(argv[1]); unlink(lock);
  return 0;
fail:
  fprintf(stderr, "host: %s\n", err.msg);
  return 1;
}
C
$cc -std=c11 -Wall -Wextra -Werror -I"$tmp" -o "$tmp/host" "$tmp/host.c" "$tmp/bucketstore.o" \
  -llmdb -lnettle -lpthread -lxxhash
"$tmp/host" "$tmp/host.db" || fail "host program failed"
echo "amalgamate_check: ok ($(wc -l < "$tmp/bucketstore.c") lines, warning-free in $builds builds" \
  "($COMPILERS x c11/gnu11 x -O0/-O2), $(wc -l < "$tmp/exported") exported symbols, all in storage.h or storage_backend.h)"
