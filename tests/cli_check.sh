#!/bin/sh
# cli_check.sh BUCKETSTORE: the operator subcommands on a real file. Builds a fragmented stream
# through `drive` (rows updated in every round, each round a checkpoint), then checks: help and
# usage errors, stat's fragmentation figures, dump's lines against checksums, compaction (a
# Ctrl-C cancel between transactions leaves a consistent file; a full run shrinks the buckets),
# verify's exit code, and checkpoint --watch seeing commits made by another process.
set -eu
bs=${1:-./bucketstore}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
db="$tmp/cli.db"
fail() { echo "cli_check: FAIL: $*" >&2; exit 1; }
expect_rc() { want=$1; shift; set +e; "$@" >"$tmp/out" 2>"$tmp/err"; got=$?; set -e
  [ "$got" = "$want" ] || { cat "$tmp/err" >&2; fail "'$*' exited $got, want $want"; }; }

# 400 rows in 4 buckets, 5 rounds: 2000 PUTs, 400 live rows, 5 ops per live row.
awk 'BEGIN {
  print "{\"cmd\":\"stream.create\",\"name\":\"cli\"}"
  for (r = 0; r < 5; r++) {
    for (i = 0; i < 400; i++)
      printf "{\"cmd\":\"save\",\"table\":\"t\",\"tag\":\"%s\",\"id\":\"r%d\",\"rows\":[{\"bucket\":" \
             "\"b%d\",\"type\":\"t\",\"id\":\"r%d\",\"data\":\"{\\\"v\\\":%d}\"}]}\n",
             r ? "update" : "insert", i, i % 4, i, r
    if (r == 0) print "{\"cmd\":\"snapshot_done\",\"lsn\":\"00000001\"}"
    printf "{\"cmd\":\"commit\",\"lsn\":\"%08d\"}\n", r + 1
  } }' | "$bs" drive --db "$db" --nosync > "$tmp/drive.out"
[ "$(grep -c '"ok":false' "$tmp/drive.out" || true)" = 0 ] || fail "driver errors"

# help: every command has a complete page; bad usage is an error on stderr
expect_rc 0 "$bs" --help
for c in stat verify dump compact checkpoint drive demo; do
  grep -q "^  $c" "$tmp/out" || fail "--help does not list $c"
done
for c in stat verify dump compact checkpoint; do
  expect_rc 0 "$bs" help "$c"
  [ "$(wc -l < "$tmp/out")" -ge 4 ] || fail "help $c is too short"
  expect_rc 0 "$bs" "$c" --help
done
expect_rc 2 "$bs" nosuchcommand
[ -s "$tmp/err" ] && [ ! -s "$tmp/out" ] || fail "unknown command: error must go to stderr only"
expect_rc 2 "$bs" stat
expect_rc 2 "$bs" dump --db "$db" --bogus
expect_rc 1 "$bs" stat --db "$tmp/missing.db"
expect_rc 1 "$bs" dump --db "$db" --stream 9

# stat: 5 ops per live row in each of the 4 buckets
expect_rc 0 "$bs" stat --db "$db"
grep -q "ops 2000 (put 2000, remove 0, move 0, clear 0), live rows 400" "$tmp/out" ||
  { cat "$tmp/out"; fail "stat totals"; }
[ "$(grep -cE '^ +5\.00 +500 +100 ' "$tmp/out")" = 4 ] || { cat "$tmp/out"; fail "stat fragmentation"; }

# dump: header + 2000 ops + 4 bucket summaries; one bucket alone; counts agree
expect_rc 0 "$bs" dump --db "$db"
[ "$(wc -l < "$tmp/out")" = 2005 ] || fail "dump has $(wc -l < "$tmp/out") lines, want 2005"
grep -q '^{"stream":1,"state":"ACTIVE","checkpoint":"2000"' "$tmp/out" || fail "dump header"
grep -q '^{"bucket":"b2","checksum":-\{0,1\}[0-9]*,"count":500}$' "$tmp/out" || fail "dump summary"
expect_rc 0 "$bs" dump --db "$db" --bucket b3 --checkpoint 800
[ "$(grep -c '"op":"PUT"' "$tmp/out")" = 200 ] || fail "dump --bucket --checkpoint"

# compact: cancelled after the first transaction (the test raises the SIGINT itself), the file
# verifies and reads the same; then a full run leaves ~1 op per live row
# the bucket's checksum (not its op count: compaction folds ops) must never change
b0_checksum() { "$bs" dump --db "$db" --bucket b0 | tail -n 1 | sed 's/.*"checksum":\(-*[0-9]*\).*/\1/'; }
b0_checksum > "$tmp/b0.before"
BS_CLI_CANCEL_AFTER=1 expect_rc 130 "$bs" compact --db "$db" --txn-ops 50
grep -q "interrupted" "$tmp/err" || fail "cancel message"
expect_rc 0 "$bs" verify --db "$db"
b0_checksum | cmp -s - "$tmp/b0.before" || fail "checksum changed"
expect_rc 0 "$bs" compact --db "$db"
grep -qE "^full compaction: [1-4] buckets" "$tmp/out" || { cat "$tmp/out"; fail "compact summary"; }
grep -q "^progress: .*(done)" "$tmp/err" || fail "plain progress lines on a non-tty stderr"
expect_rc 0 "$bs" stat --db "$db"
[ "$(grep -cE '^ +1\.0[01] +10[01] +100 ' "$tmp/out")" = 4 ] || { cat "$tmp/out"; fail "after compact"; }
b0_checksum | cmp -s - "$tmp/b0.before" || fail "checksum changed"
expect_rc 0 "$bs" verify --db "$db"
grep -q "^0 problems" "$tmp/out" || fail "verify output"
expect_rc 1 "$bs" compact --db "$db" --initial
grep -q BS_ESTATE "$tmp/err" || fail "--initial after a checkpoint must be BS_ESTATE"

# checkpoint --watch in one process sees two commits made by another
"$bs" checkpoint --db "$db" --watch --count 2 --timeout-ms 10000 > "$tmp/watch" &
watcher=$!
n=0; while [ ! -s "$tmp/watch" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
# (polling from another process coalesces commits closer together than its 50 ms period)
{ echo '{"cmd":"keepalive","lsn":"00000100"}'; sleep 0.3
  echo '{"cmd":"save","table":"t","tag":"update","id":"r1","rows":[{"bucket":"b1","type":"t","id":"r1","data":"{}"}]}'
  echo '{"cmd":"commit","lsn":"00000101"}'; } | "$bs" drive --db "$db" > /dev/null
wait "$watcher" || fail "checkpoint --watch exited non-zero"
[ "$(wc -l < "$tmp/watch")" = 3 ] || { cat "$tmp/watch"; fail "watch lines"; }
tail -n 1 "$tmp/watch" | grep -q '"checkpoint":"2001","lsn":"00000101"' || fail "watch last line"
echo "cli_check: ok"
