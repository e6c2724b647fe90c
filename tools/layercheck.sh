#!/bin/sh
# layercheck.sh OBJ...: the library's layers (internal.h), checked on its object files with nm:
# which object uses a symbol that which other object defines. Two rules:
#
# 1. The layers of internal.h:
#   common.o                  the common layer: uses no other library object;
#   lmdb*.o, mem*.o, pg*.o    backends: use the common layer, the rules and their own backend's
#                             objects, never the front and never another backend;
#   storage.o, writer.o,      the front (writer.o: the writer's queue; cache.o: the checksum
#   cache.o                   cache above the backends): may use everything, and no other object
#                             uses it, so the front and the backends cannot import each other;
#   any other object          a rule module (rules.o, checksum.o, compact.o, lookup.o, ...): uses
#                             the common layer and other rules only;
#   cli_*.o                   the CLI (cli/, a program on storage.h): no library object uses it.
#                             make layercheck checks it in a run of its own, on its objects alone
#                             (tools/layercheck.sh build/cli/*.o), for rule 2.
# 2. No cycle: within a layer too, every arrow between two files points one way (a backend's
#    files sit on its bottom, the codec and the primitives; its table sits on top), so each file
#    can be read, and changed, knowing only the files below it.
#
# Plain POSIX sh (nm, comm, awk); prints every offending pair and every cycle (each arrow with
# the symbols it takes) and exits 1, or one summary line. -a also prints every arrow, "user.c ->
# definer.c" a line. Without objects it runs `make layercheck`, which builds them and calls it
# on the library's and the CLI's (so it works from a clean tree); an object that does not exist
# is an error, not a smaller graph.
set -eu
arrows=0
if [ "${1-}" = -a ]; then
  arrows=1
  shift
fi
if [ $# = 0 ]; then
  [ "$arrows" = 0 ] || echo "layercheck: -a needs the objects (tools/layercheck.sh -a build/*.o)" >&2
  cd "$(dirname "$0")/.."
  exec ${MAKE:-make} --no-print-directory layercheck
fi
for o in "$@"; do
  [ -f "$o" ] || {
    echo "layercheck: $o: no such object (make layercheck builds them first)" >&2
    exit 2
  }
done

# Arrows that still close a cycle, "user definer" a line, left out of rule 2 until their cycle
# is gone; none is left. An entry whose arrow no longer exists fails the check: the list only
# shrinks.
allowed=''

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$@"; do
  b=$(basename "$o" .o)
  nm --defined-only "$o" >"$tmp/nm" # on its own, so that set -e sees nm fail
  awk 'NF == 3 && $2 ~ /[TDBRVWC]/ {print $3}' "$tmp/nm" | sort -u >"$tmp/$b.def"
  nm -u "$o" >"$tmp/nm"
  awk '{print $NF}' "$tmp/nm" | sort -u >"$tmp/$b.use"
done
rm -f "$tmp/nm"

layer() {
  case $1 in
  common) echo common ;;
  storage | writer | cache) echo front ;;
  lmdb*) echo lmdb ;;
  mem*) echo mem ;;
  pg*) echo pg ;;
  cli_*) echo cli ;;
  *) echo rules ;;
  esac
}

bad=0
: >"$tmp/graph"
for u in "$tmp"/*.use; do
  ub=$(basename "$u" .use)
  ul=$(layer "$ub")
  for d in "$tmp"/*.def; do
    db=$(basename "$d" .def)
    [ "$db" = "$ub" ] && continue
    hits=$(comm -12 "$u" "$d" | tr '\n' ' ')
    [ -n "$hits" ] || continue
    echo "$ub $db $hits" >>"$tmp/graph"
    dl=$(layer "$db")
    case "$ul:$dl" in
    front:* | cli:* | rules:common | rules:rules | lmdb:common | mem:common | pg:common) continue ;;
    lmdb:rules | mem:rules | pg:rules | lmdb:lmdb | mem:mem | pg:pg) continue ;;
    esac
    echo "layercheck: $ub.o ($ul) uses $db.o ($dl): $hits"
    bad=1
  done
done

# Rule 2 on the graph without the allowed arrows. An allowed arrow between two objects that were
# not given (a build without PostgreSQL) is not asked for.
printf '%s\n' "$allowed" | while read -r ub db; do
  [ -n "$ub" ] && [ -f "$tmp/$ub.use" ] && [ -f "$tmp/$db.def" ] || continue
  grep -q "^$ub $db " "$tmp/graph" ||
    echo "layercheck: $ub.o no longer uses $db.o: take '$ub $db' off the allowed arrows"
done >"$tmp/stale"
[ -s "$tmp/stale" ] && cat "$tmp/stale" && bad=1
printf '%s\n' "$allowed" >"$tmp/allowed"
# A depth-first walk: an arrow back to a file on the current path closes a cycle, printed from
# that file round to it again.
if ! awk 'NR == FNR { allowed[$1 " " $2]; next } !(($1 " " $2) in allowed)' "$tmp/allowed" \
  "$tmp/graph" | awk '
  { if (!($1 in seen)) { seen[$1]; order[++nodes] = $1 }
    n[$1]++; to[$1, n[$1]] = $2
    s = $0; sub(/^[^ ]+ [^ ]+ /, "", s); syms[$1, $2] = s }
  function visit(v,   i, j, w) {
    state[v] = 1; path[++depth] = v
    for (i = 1; i <= n[v]; i++) {
      w = to[v, i]
      if (state[w] == 1) {
        for (j = depth; path[j] != w; j--) ;
        printf "layercheck: cycle %d:", ++cycles
        for (; j <= depth; j++) printf " %s.c ->", path[j]
        printf " %s.c\n", w
        for (j = depth; path[j] != w; j--) ;
        for (; j <= depth; j++)
          printf "  %s.c -> %s.c: %s\n", path[j], j < depth ? path[j + 1] : w,
                 syms[path[j], j < depth ? path[j + 1] : w]
      } else if (!state[w]) visit(w)
    }
    depth--; state[v] = 2
  }
  END { for (k = 1; k <= nodes; k++) if (!state[order[k]]) visit(order[k]); exit cycles > 0 }'
then
  bad=1
fi
[ "$bad" = 0 ] || exit 1
[ "$arrows" = 0 ] || awk '{ print $1 ".c -> " $2 ".c" }' "$tmp/graph"
layers=$(for o in "$@"; do layer "$(basename "$o" .o)"; done | sort -u | tr '\n' ' ')
echo "layercheck: $# objects (layers: ${layers% }): every arrow between layers allowed; no cycle" \
  "(allowed arrows left: $(printf '%s\n' "$allowed" | awk 'NF == 2' | wc -l))"
