#!/bin/sh
# format_check.sh BUCKETSTORE: files of every format, each written by a build of that format from
# the same script and kept in tests/data (formatN.mdb; how they were made: tests/data/README.md),
# opened by this build. Every build must answer alike on each of them, what the first build
# answered (format.dump, format.expected). For each file: a read-only open (dump) reads it, or,
# when it is older than this build's format, refuses with the reason; either way the file is
# unchanged. A read-write open (drive: tests/data/format_after.jsonl, reads and then writes over
# the old rows) answers as expected, after which the file is at this build's format and
# verifies clean.
set -eu
bs=${1:-./bucketstore}
data=$(dirname "$0")/data
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-format.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "format_check: FAIL: $*" >&2; exit 1; }
current=$("$bs" version | sed -n 's/.*(format \([0-9]*\))$/\1/p')
[ -n "$current" ] || fail "bucketstore version names no format"
# the ops and checksums of every stream, without the stored records (their bytes are the format's)
dump() { "$bs" dump "$1" --all >"$tmp/dump.all" && grep -v '^{"record"' "$tmp/dump.all"; }

n=0
for f in "$data"/format*.mdb; do
  v=$(basename "$f" .mdb | sed 's/^format//')
  n=$((n + 1))
  cp "$f" "$tmp/ro.mdb"
  if [ "$v" = "$current" ]; then
    dump "$tmp/ro.mdb" >"$tmp/ro.dump" || fail "format $v: dump failed"
  else
    if dump "$tmp/ro.mdb" >"$tmp/ro.dump" 2>"$tmp/ro.err"; then fail "format $v: read-only open read it"; fi
    grep -q "format $v is older than this build's $current: a read-write open upgrades it" \
      "$tmp/ro.err" || { cat "$tmp/ro.err" >&2; fail "format $v: read-only open: wrong message"; }
    cp "$data/format.dump" "$tmp/ro.dump"
  fi
  cmp -s "$f" "$tmp/ro.mdb" || fail "format $v: a read-only open changed the file"
  diff "$data/format.dump" "$tmp/ro.dump" >&2 || fail "format $v: read-only dump differs"

  cp "$f" "$tmp/rw.mdb"
  "$bs" drive --db "$tmp/rw.mdb" <"$data/format_after.jsonl" >"$tmp/rw.out" ||
    fail "format $v: drive failed"
  diff "$data/format.expected" "$tmp/rw.out" >&2 || fail "format $v: reads and writes differ"
  "$bs" verify "$tmp/rw.mdb" >"$tmp/verify.out" || { cat "$tmp/verify.out" >&2; fail "format $v: verify"; }
  "$bs" dump "$tmp/rw.mdb" --all | grep -q '^{"record":"meta","stream":0,"key":"666f726d6174","value":"626b7473746f7265'"$(printf '%02x' "$current")"'000000"}$' ||
    fail "format $v: not at format $current after a read-write open"
done
[ "$n" -gt 0 ] || fail "no tests/data/format*.mdb"

# formatN.records: the records that format N's build exported from formatN.mdb (its
# `bucketstore dump --all`, record lines only). load rebuilds from them a file of this build's
# format with the same records as formatN.mdb upgraded in place (opened read-write, nothing
# written), whose source records are this build's own export's; records of a format this build
# does not know are refused, nothing created.
r=0
for f in "$data"/format*.records; do
  v=$(basename "$f" .records | sed 's/^format//')
  r=$((r + 1))
  "$bs" load "$tmp/load$v.mdb" "$f" >/dev/null || fail "format $v records: load failed"
  dump "$tmp/load$v.mdb" >"$tmp/load.dump" || fail "format $v records: dump failed"
  diff "$data/format.dump" "$tmp/load.dump" >&2 || fail "format $v records: loaded dump differs"
  cp "$data/format$v.mdb" "$tmp/up$v.mdb"
  "$bs" drive --db "$tmp/up$v.mdb" </dev/null >/dev/null || fail "format $v: read-write open failed"
  "$bs" dump "$tmp/up$v.mdb" --all | grep '^{"record"' >"$tmp/up.rec"
  "$bs" dump "$tmp/load$v.mdb" --all | grep '^{"record"' >"$tmp/load.rec"
  cmp -s "$tmp/up.rec" "$tmp/load.rec" ||
    fail "format $v records: loaded records differ from the file upgraded in place"
  # the source records (which every step so far rewrote) are those this build wrote itself from
  # the same script: an upgrade converts, it does not merely reread
  grep '^{"record":"source"' "$tmp/up.rec" >"$tmp/up.src" || true
  grep '^{"record":"source"' "$data/format$current.records" | cmp -s - "$tmp/up.src" ||
    fail "format $v: the upgraded source records differ from format$current.records'"
  sed 's/"value":"626b7473746f7265[0-9a-f]*"}$/"value":"626b7473746f726563000000"}/' "$f" \
    >"$tmp/newer.records"
  if "$bs" load "$tmp/newer$v.mdb" "$tmp/newer.records" >/dev/null 2>"$tmp/newer.err"; then
    fail "format $v records: records of format 99 loaded"
  fi
  grep -q "the records are of another format than this build's" "$tmp/newer.err" ||
    { cat "$tmp/newer.err" >&2; fail "format $v records: format 99: wrong message"; }
  [ ! -e "$tmp/newer$v.mdb" ] || fail "format $v records: format 99 left a file"
done
[ "$r" -gt 0 ] || fail "no tests/data/format*.records"
echo "format_check: $n file(s) of formats up to $current: read-only and read-write opens as expected;" \
  "$r export(s) loaded as expected"
