#!/bin/sh
# amalgamate.sh OUTDIR file.c...: writes OUTDIR/bucketstore.c (the library as one translation
# unit) and copies of storage.h and storage_backend.h beside it, so a host vendors two files
# (SQLite's model), three when it supplies a backend of its own.
# The PostgreSQL backend's files (pg*.c and pg_internal.h), when given, sit inside
# #ifdef BS_HAVE_PG: compiled with -DBS_HAVE_PG and libpq's flags, linked with -lpq, the file has
# that backend; compiled without, it is the library without it (bs_open_postgres: BS_EUNSUPPORTED).
#
# How the files become one without clashing:
#  - The private headers (internal.h, lmdb_internal.h, mem_internal.h) are inlined once at the
#    top; every prototype in them becomes `static` (and so do the matching definitions in the .c
#    files), so no internal symbol is exported: the only external symbols left are the storage.h
#    API.
#  - xxHash is already private (XXH_INLINE_ALL in each file), so no XXH_* symbol is exported.
#  - File-scope names that two .c files both define (their own static helpers, typedefs,
#    struct tags) are renamed per file with a #define before the file and an #undef after it;
#    macros a file defines are #undef'd after it.
# Plain POSIX sh + awk (no Python on a fresh Debian machine).
set -eu
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
tmp="$out/bucketstore.c.tmp"
headers="$here/internal.h $here/lmdb_internal.h $here/mem_internal.h"
for f in "$@"; do case $(basename "$f") in pg*.c) headers="$headers $here/pg_internal.h"; break;; esac; done
# pg_guard FILE begin|end: the #ifdef around the PostgreSQL backend's files.
pg_guard() {
  case $(basename "$1") in pg*) if [ "$2" = begin ]; then echo "#ifdef BS_HAVE_PG"; else echo "#endif"; fi;; esac
}

# Names that the private headers declare with external linkage: prototypes at column 0.
internal_names() {
  awk '/^(static|typedef|#|extern|[ \t}{\/*])/ { next }
       /^[A-Za-z_]/ { if (match($0, /[A-Za-z_][A-Za-z0-9_]*\(/))
                        print substr($0, RSTART, RLENGTH - 1) }' $headers | sort -u
}

# File-scope names a .c file defines that could clash with another file's.
defined_names() {
  awk '/^static / {
         s = $0; sub(/[=;(\[].*/, "", s); n = split(s, w, /[ *]+/); if (w[n] != "") print w[n]
         if (match($0, /[A-Za-z_][A-Za-z0-9_]*\(/)) print substr($0, RSTART, RLENGTH - 1)
       }
       /^}[ \t]*[A-Za-z_][A-Za-z0-9_]*;/ { s = $0; sub(/^}[ \t]*/, "", s); sub(/;.*/, "", s); print s }
       /^typedef [^(]*;/ { s = $0; sub(/;.*/, "", s); n = split(s, w, /[ *]+/); print w[n] }
       /^(typedef )?enum[^{]*\{.*\}/ { # the constants of a one-line enum
         s = $0; sub(/^[^{]*\{/, "", s); sub(/\}.*/, "", s); n = split(s, w, /,/)
         for (i = 1; i <= n; i++) { e = w[i]; sub(/=.*/, "", e); gsub(/[ \t]/, "", e); if (e != "") print e }
       }
       /^(typedef )?(struct|union|enum) [A-Za-z_]/ {
         s = $0; sub(/^(typedef )?(struct|union|enum) /, "", s); sub(/[^A-Za-z0-9_].*/, "", s); print s
       }' "$1" | sort -u
}

# Identifier tokens of a file (comments and strings included: over-renaming is harmless).
tokens() { tr -c 'A-Za-z0-9_' '\n' < "$1" | grep -E '^[A-Za-z_]' | sort -u; }

# A name that file F defines and any other file mentions is renamed inside F: that covers two
# files defining one name, and a local variable in one file shadowing another's typedef.
# ...except struct tags the headers mention: those are shared on purpose (a struct internal.h
# declares and one file completes).
names=$(internal_names)
cat $headers "$here/storage.h" "$here/storage_backend.h" | tr -s ' \t' '  ' |
  grep -oE '(struct|union|enum) [A-Za-z_][A-Za-z0-9_]*' | sed 's/^[a-z]* //' | sort -u > "$out/shared"
for f in "$@"; do defined_names "$f" > "$out/defs.$(basename "$f" .c)"; done
clashes=$(for f in "$@"; do
  others=$(for g in "$@"; do [ "$g" = "$f" ] || echo "$g"; done)
  for g in $others; do tokens "$g"; done | sort -u | comm -12 "$out/defs.$(basename "$f" .c)" -
done | sort -u | comm -23 - "$out/shared")
rm -f "$out"/defs.* "$out/shared"

# A rename is a macro, so it would also rewrite a member access: a name that a file uses as a
# member (x.name, p->name) of a struct the headers declare is renamed, when the file defines a
# function of that name and never calls the member (x.name(...)), by a function-like macro
# (which leaves the member alone); else it is kept.
strip_comments() { sed -e 's|/\*.*\*/||g' -e 's|^ *\*.*||' -e 's|^/\*.*||' "$1"; }
{ for h in $headers "$here/storage.h" "$here/storage_backend.h"; do strip_comments "$h"; done; } |
  tr -c 'A-Za-z0-9_' '\n' | grep -E '^[A-Za-z_]' | sort -u > "$out/header_tokens"
renames() { # file: the clashing names it defines and may rename
  defined_names "$1" | grep -xF "$clashes" | while read -r n; do
    if grep -qx "$n" "$out/header_tokens" && grep -qE "(\.|->)$n([^A-Za-z0-9_]|\$)" "$1"; then
      if grep -qE "^static [^=;]*[^A-Za-z0-9_]$n\(" "$1" && ! grep -qE "(\.|->)$n\(" "$1"; then
        echo "$n()"
      fi
      continue
    fi
    echo "$n"
  done
}

{
  echo "/*"
  echo " * bucketstore.c: the bucketstore library as one file (make amalgamate), version"
  echo " * $(sed -n 's/^#define BS_VERSION_STRING "\(.*\)"/\1/p' "$here/storage.h"), from: $*."
  echo " * Build: cc -c bucketstore.c (beside storage.h); link -llmdb -lnettle -lpthread. With the"
  echo " * PostgreSQL backend: cc -DBS_HAVE_PG \$(pkg-config --cflags libpq) ..., link -lpq too."
  echo " * Generated; edit the original files instead."
  echo " */"
  echo "#ifndef _GNU_SOURCE"
  echo "#define _GNU_SOURCE"
  echo "#endif"
  echo "#define BS_AMALGAMATION 1"
  echo "#if defined(__GNUC__)"
  echo "#define BS_AMALG_STATIC static __attribute__((unused))"
  echo "#else"
  echo "#define BS_AMALG_STATIC static"
  echo "#endif"
  echo "#include \"storage.h\""
  echo "#include \"storage_backend.h\""
  for h in $headers; do
    echo "/* ==== $(basename "$h") ==== */"
    pg_guard "$h" begin
    # Prototypes (and the extern objects) of the private headers get internal linkage.
    echo "$names" | awk -v file="$h" '
      FILENAME != file { want[$0] = 1; next }
      /^#include "internal.h"/ { print "/* internal.h: above */"; next }
      /^#include "storage_backend.h"/ { print "/* storage_backend.h: above */"; next }
      /^extern / { sub(/^extern /, "BS_AMALG_STATIC "); print; next }
      /^(static|typedef|#|[ \t}{\/*])/ { print; next }
      /^[A-Za-z_]/ && match($0, /[A-Za-z_][A-Za-z0-9_]*\(/) &&
        (substr($0, RSTART, RLENGTH - 1) in want) { print "BS_AMALG_STATIC " $0; next }
      { print }' - "$h"
    pg_guard "$h" end
  done
  for f in "$@"; do
    base=$(basename "$f" .c)
    echo "/* ==== $f ==== */"
    pg_guard "$f" begin
    ren=$(renames "$f")
    for n in $ren; do
      case $n in
        *"()") echo "#define ${n%??}(...) ${n%??}__$base(__VA_ARGS__)";;
        *) echo "#define $n ${n}__$base";;
      esac
    done
    echo "#line 1 \"$f\""
    echo "$names" | awk -v file="$f" '
      FILENAME != file { want[$0] = 1; next }
      /^#include "(lmdb_|mem_|pg_)?internal.h"/ { print "/* " substr($2, 2, length($2) - 2) ": above */"; next }
      /^#include "storage.h"/ { print "/* storage.h: above */"; next }
      /^(static|typedef|#|extern|[ \t}{\/*])/ { print; next }
      /^const [A-Za-z_]+ bs__[A-Za-z0-9_]+ = / { print "static " $0; next }
      /^[A-Za-z_]/ && match($0, /[A-Za-z_][A-Za-z0-9_]*\(/) &&
        (substr($0, RSTART, RLENGTH - 1) in want) { print "static " $0; next }
      { print }' - "$f"
    for n in $ren; do echo "#undef ${n%()}"; done
    # The file's own macros end with it (two files may define one name differently).
    awk '/^#[ \t]*define[ \t]+[A-Za-z_]/ { s = $0; sub(/^#[ \t]*define[ \t]+/, "", s);
           sub(/[^A-Za-z0-9_].*/, "", s); print "#undef " s }' "$f" | sort -u
    pg_guard "$f" end
  done
} > "$tmp"
mv "$tmp" "$out/bucketstore.c"
rm -f "$out/header_tokens"
cp "$here/storage.h" "$here/storage_backend.h" "$out/"
echo "amalgamate: $out/bucketstore.c ($(wc -l < "$out/bucketstore.c") lines) + storage.h" \
  "+ storage_backend.h"
