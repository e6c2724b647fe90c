#!/bin/sh
# install_check.sh: `make install` into a temporary DESTDIR + PREFIX, then build a tiny program
# against the installed copy with `pkg-config --cflags --libs bucketstore` (shared, and static
# with --static; including the header both as <storage.h> and as "storage.h"), run both, and
# check what was (not) installed: the headers only as include/bucketstore/storage.h and
# storage_backend.h (a host-supplied backend builds against the latter and runs), the man
# page with a section for every command the CLI lists, the .pc with Requires.private: lmdb; then
# `make uninstall` leaves nothing behind. Run from the project root (make test does).
set -eu
MAKE=${MAKE:-make}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=/opt/bucketstore-test
stage="$tmp/stage"
root="$stage$prefix"
fail() { echo "install_check: FAIL: $*" >&2; exit 1; }

$MAKE --no-print-directory -s install DESTDIR="$stage" PREFIX="$prefix" >/dev/null

for f in include/bucketstore/storage.h include/bucketstore/storage_backend.h share/man/man1/bucketstore.1 lib/libbucketstore.a lib/libbucketstore.so lib/libbucketstore.so.0 \
         bin/bucketstore lib/pkgconfig/bucketstore.pc; do
  [ -e "$root/$f" ] || fail "$f not installed"
done
[ -L "$root/lib/libbucketstore.so" ] || fail "libbucketstore.so is not a symlink"
[ -L "$root/lib/libbucketstore.so.0" ] || fail "libbucketstore.so.0 is not a symlink"
real=$(ls "$root"/lib/libbucketstore.so.*.*.* 2>/dev/null | head -n 1)
[ -f "$real" ] && [ ! -L "$real" ] || fail "no versioned real name libbucketstore.so.X.Y.Z"
soname=$(objdump -p "$real" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = libbucketstore.so.0 ] || fail "soname is '$soname', want libbucketstore.so.0"
if find "$stage" -name '*internal.h' | grep -q .; then fail "a private header was installed"; fi
[ "$(ls "$root/include")" = bucketstore ] || fail "include/ holds more than bucketstore/: $(ls "$root/include")"
[ "$(ls "$root/include/bucketstore" | tr '\n' ' ')" = "storage.h storage_backend.h " ] ||
  fail "extra headers: $(ls "$root/include/bucketstore")"
grep -q "^prefix=$prefix\$" "$root/lib/pkgconfig/bucketstore.pc" || fail "pc prefix"
grep -q '^Requires.private: lmdb' "$root/lib/pkgconfig/bucketstore.pc" ||
  fail "pc: no Requires.private: lmdb"

# The man page: one section (.SS) per command of `bucketstore --help`, and no section for a
# command the CLI does not have; groff finds nothing to warn about.
man="$root/share/man/man1/bucketstore.1"
"$root/bin/bucketstore" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }' |
  sort > "$tmp/cli_commands"
[ -s "$tmp/cli_commands" ] || fail "bucketstore --help lists no commands"
sed -n 's/^\.SS //p' "$man" | sort > "$tmp/man_commands"
diff "$tmp/cli_commands" "$tmp/man_commands" >"$tmp/man_diff" ||
  fail "bucketstore.1 sections differ from the CLI's commands (< CLI only, > man only): $(cat "$tmp/man_diff")"
if command -v groff >/dev/null; then
  groff -man -Tutf8 -ww -z "$man" 2>"$tmp/groff" && [ ! -s "$tmp/groff" ] ||
    fail "groff warns on bucketstore.1: $(cat "$tmp/groff")"
fi

# pkg-config must see the staged copy: point it at the staged .pc and relocate the prefix.
export PKG_CONFIG_PATH="$root/lib/pkgconfig"
pc() { pkg-config --define-variable=prefix="$root" --define-variable=libdir="$root/lib" \
         --define-variable=includedir="$root/include" "$@" bucketstore; }
[ "$(pc --modversion)" = "$(sed -n 's/^#define BS_VERSION_STRING "\(.*\)"/\1/p' storage.h)" ] \
  || fail "pkg-config --modversion"
pc --cflags | grep -q -- "-I$root/include/bucketstore" || fail "pc Cflags: $(pc --cflags)"

cat > "$tmp/hello.c" <<'C'
/* A host program: open an in-memory store, write one row, commit, read it back. */
#include <storage.h>
#include <stdio.h>
#include <string.h>

static int count_ops(const bs_chunk *c, void *payload) {
  *(size_t *)payload += c->n_ops;
  return 0;
}

int main(void) {
  bs_db *db = NULL;
  bs_storage *st = NULL;
  bs_writer *w = NULL;
  bs_error err = {0, ""};
  bs_save s = BS_SAVE_INIT;
  bs_row row = {{"b1", 2}, {"t", 1}, {"r1", 2}, {"{}", 2}};
  bs_bucket_request req = {{"b1", 2}, 0};
  bs_commit_result cr;
  uint32_t id;
  size_t n = 0;
  int more = 0;
  if (strcmp(bs_strerror(BS_ETOOBIG), "") == 0) return 1;
  if (bs_open_memory(&db, NULL, &err) || bs_stream_create(&id, db, "s", NULL, &err) ||
      bs_storage_open(&st, db, id, &err) || bs_writer_open(&w, st, NULL, &err))
    goto fail;
  s.table.data = "t"; s.table.size = 1;
  s.after_id.data = "r1"; s.after_id.size = 2;
  s.rows = &row; s.n_rows = 1;
  if (bs_writer_save(w, &s, &err) || bs_writer_snapshot_done(w, (bs_val){"1", 1}, &err) ||
      bs_writer_commit(&cr, w, (bs_val){"1", 1}, NULL, &err) || !cr.checkpoint_created)
    goto fail;
  if (bs_get_bucket_data(&more, st, cr.checkpoint, &req, 1, NULL, count_ops, &n, &err) || n != 1)
    goto fail;
  bs_writer_close(w); bs_storage_close(st); bs_close(db);
  if (strcmp(bs_version(NULL, NULL, NULL), BS_VERSION_STRING) != 0) return 1;
  printf("installed bucketstore %s works\n", BS_VERSION_STRING);
  return 0;
fail:
  fprintf(stderr, "hello: %s\n", err.msg);
  return 1;
}
C
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -std=c99 -Wall -Werror $(pc --cflags) -o "$tmp/hello" "$tmp/hello.c" $(pc --libs)
LD_LIBRARY_PATH="$root/lib" "$tmp/hello" >/dev/null || fail "shared build does not run"
ldd_out=$(LD_LIBRARY_PATH="$root/lib" ldd "$tmp/hello")
echo "$ldd_out" | grep -q "libbucketstore.so.0 => $root/lib/" || fail "not linked to libbucketstore.so.0"
# Static: the archive plus Libs.private.
# shellcheck disable=SC2046
$cc -std=c99 -Wall -Werror $(pc --cflags) -o "$tmp/hello_static" "$tmp/hello.c" \
  "$root/lib/libbucketstore.a" $(pc --static --libs-only-l | sed 's/-lbucketstore//')
"$tmp/hello_static" >/dev/null || fail "static build does not run"
# The in-tree spelling #include "storage.h" finds the installed header through the same Cflags.
sed 's|#include <storage.h>|#include "storage.h"|' "$tmp/hello.c" > "$tmp/hello_quoted.c"
grep -q '#include "storage.h"' "$tmp/hello_quoted.c" || fail "quoted include not substituted"
# shellcheck disable=SC2046
(cd "$tmp" && $cc -std=c99 -Wall -Werror $(pc --cflags) -o hello_quoted hello_quoted.c $(pc --libs)) ||
  fail "#include \"storage.h\" does not build with pkg-config --cflags"
LD_LIBRARY_PATH="$root/lib" "$tmp/hello_quoted" >/dev/null || fail "quoted-include build does not run"
"$root/bin/bucketstore" version >/dev/null || fail "installed CLI does not run"

# A host supplies a whole backend through the installed implementer header: one stream whose
# checkpoint is 42 (reported by get_status, which bs_get_checkpoint reads); the front (argument
# checks, dispatch, NULL slots) sits above it.
cat > "$tmp/host_backend.c" <<'C'
#include <storage_backend.h>
#include <stdlib.h>
#include <string.h>
typedef struct { bs_db base; int storages; } h_db;
static void h_destroy(bs_db *db) { free(db); }
static void h_st_destroy(bs_storage *st) { ((h_db *)st->db)->storages--; free(st); }
static int h_status(bs_status *out, bs_storage *st, bs_error *err) {
  (void)st; (void)err; out->checkpoint = 42; return BS_OK;
}
static const bs_storage_vtable h_st_vt = {
  .version = BS_STORAGE_VTABLE_VERSION, .destroy = h_st_destroy, .get_status = h_status};
static int h_open_st(bs_storage **out, bs_db *db, uint32_t id, bs_error *err) {
  bs_storage *st = calloc(1, sizeof *st);
  (void)err;
  if (!st) return BS_ENOMEM;
  st->vt = &h_st_vt; st->db = db; st->stream_id = id ? id : 1;
  ((h_db *)db)->storages++;
  *out = st;
  return BS_OK;
}
static const bs_db_vtable h_db_vt = {
  .version = BS_DB_VTABLE_VERSION, .destroy = h_destroy, .storage_open = h_open_st};
int main(void) {
  h_db *d = calloc(1, sizeof *d);
  bs_db *db; bs_storage *st; bs_writer *w; bs_checkpoint cp; bs_stat stat;
  if (!d) return 1;
  d->base.vt = &h_db_vt;
  if (bs_open_backend(&db, &d->base, NULL, NULL) || bs_storage_open(&st, db, 0, NULL)) return 1;
  if (bs_get_checkpoint(&cp, st, NULL) || cp.op_id != 42) return 2;
  if (bs_writer_open(&w, st, NULL, NULL) != BS_EUNSUPPORTED) return 3;
  if (bs_db_stat(&stat, db, NULL) != BS_EUNSUPPORTED) return 4;
  if (bs_get_checkpoint(&cp, NULL, NULL) != BS_EINVAL) return 5;
  bs_storage_close(st);
  if (d->storages != 0) return 6;
  bs_close(db);
  return 0;
}
C
# shellcheck disable=SC2046
$cc -std=c99 -Wall -Werror $(pc --cflags) -o "$tmp/host_backend" "$tmp/host_backend.c" $(pc --libs)
LD_LIBRARY_PATH="$root/lib" "$tmp/host_backend" || fail "a host-supplied backend does not run ($?)"

$MAKE --no-print-directory -s uninstall DESTDIR="$stage" PREFIX="$prefix" >/dev/null
left=$(find "$stage" -type f -o -type l)
[ -z "$left" ] || fail "uninstall left: $left"
echo "install_check: ok (prefix $prefix, soname $soname, $(basename "$real"))"
