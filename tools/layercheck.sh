#!/bin/sh
# layercheck.sh OBJ...: the library's layers (internal.h, issue 13), checked on its object files
# with nm: which object uses a symbol that which other object defines.
#   common.o                  the common layer: uses no other library object;
#   lmdb*.o, mem*.o, pg*.o    backends: use the common layer, the rules and their own backend's
#                             objects, never the front and never another backend;
#   storage.o, writer.o       the front (writer.o: the writer's queue): may use everything, and
#                             no other object uses it, so the front and the backends cannot
#                             import each other again;
#   any other object          a rule module (rules.o, checksum.o, compact.o, lookup.o, ...): uses
#                             the common layer and other rules only.
# Plain POSIX sh (nm, comm); prints every offending pair and exits 1, or one summary line.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$@"; do
  b=$(basename "$o" .o)
  nm --defined-only "$o" | awk 'NF == 3 && $2 ~ /[TDBRVWC]/ {print $3}' | sort -u >"$tmp/$b.def"
  nm -u "$o" | awk '{print $NF}' | sort -u >"$tmp/$b.use"
done

layer() {
  case $1 in
  common) echo common ;;
  storage | writer) echo front ;;
  lmdb*) echo lmdb ;;
  mem*) echo mem ;;
  pg*) echo pg ;;
  *) echo rules ;;
  esac
}

bad=0
for u in "$tmp"/*.use; do
  ub=$(basename "$u" .use)
  ul=$(layer "$ub")
  for d in "$tmp"/*.def; do
    db=$(basename "$d" .def)
    [ "$db" = "$ub" ] && continue
    dl=$(layer "$db")
    case "$ul:$dl" in
    front:* | rules:common | rules:rules | lmdb:common | mem:common | pg:common) continue ;;
    lmdb:rules | mem:rules | pg:rules | lmdb:lmdb | mem:mem | pg:pg) continue ;;
    esac
    hits=$(comm -12 "$u" "$d" | tr '\n' ' ')
    if [ -n "$hits" ]; then
      echo "layercheck: $ub.o ($ul) uses $db.o ($dl): $hits"
      bad=1
    fi
  done
done
[ "$bad" = 0 ] || exit 1
echo "layercheck: $# objects: the common layer uses nothing, rules only common, backends no front"
