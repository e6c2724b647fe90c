#!/bin/sh
# cli_check.sh BUCKETSTORE: the operator subcommands on a real file. Builds a fragmented stream
# through `drive` (rows updated in every round, each round a checkpoint), then checks: help and
# usage errors, stat's fragmentation figures, dump's lines against checksums, compaction (a
# Ctrl-C cancel between transactions leaves a consistent file; a full run shrinks the buckets),
# verify's exit code, the database as an operand, backup (smaller, verified, never over a file
# unless forced), dump | load (the same dump, the same reads at every checkpoint, one stream or
# all), and checkpoint --watch seeing commits made by another process.
set -eu
bs=${1:-./bucketstore}
bs=$(cd "$(dirname "$bs")" && pwd)/$(basename "$bs") # some checks run in $tmp
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
for c in stat verify dump load backup compact checkpoint drive demo; do
  grep -q "^  $c" "$tmp/out" || fail "--help does not list $c"
done
for c in stat verify dump load backup compact checkpoint; do
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
# a foreign file: the error names it once (the library's message already begins with the path)
printf 'garbage' > "$tmp/foreign.db"
for c in stat verify dump; do
  expect_rc 1 "$bs" "$c" "$tmp/foreign.db"
  [ "$(grep -o "$tmp/foreign.db" "$tmp/err" | wc -l)" = 1 ] || { cat "$tmp/err"; fail "$c names the path twice"; }
  grep -q 'BS_ECORRUPT' "$tmp/err" || fail "$c: no BS_ECORRUPT"
done

# a libpq key=value string or a URL as the operand names a PostgreSQL database, not a file: the
# error names the connection (port 1: refused, or a build without PostgreSQL says so), and load
# makes no file named after it
for conn in "host=127.0.0.1 port=1 dbname=nosuch" "dbname = nosuch host=127.0.0.1 port=1" \
    "postgresql://127.0.0.1:1/nosuch" "postgres://127.0.0.1:1/nosuch"; do
  expect_rc 1 "$bs" stat "$conn"
  grep -qF "bucketstore stat: cannot open $conn: BS_E" "$tmp/err" ||
    { cat "$tmp/err" >&2; fail "stat '$conn': the error does not name the connection"; }
  (cd "$tmp" && expect_rc 2 "$bs" load "$conn" /dev/null)
  grep -qF "bucketstore load: $conn is a PostgreSQL database" "$tmp/err" || fail "load '$conn'"
done
[ -z "$(find "$tmp" -name '*dbname*' -o -name 'postgres*')" ] || fail "a file named after a connection"

# stat: 5 ops per live row in each of the 4 buckets
expect_rc 0 "$bs" stat --db "$db"
grep -q "ops 2000 (put 2000, remove 0, move 0, clear 0), live rows 400" "$tmp/out" ||
  { cat "$tmp/out"; fail "stat totals"; }
[ "$(grep -cE '^ +5\.00 +500 +100 ' "$tmp/out")" = 4 ] || { cat "$tmp/out"; fail "stat fragmentation"; }

# dump: header + 2000 ops + 4 bucket summaries; one bucket alone; counts agree
expect_rc 0 "$bs" dump --db "$db"
n=$(grep -vc '^{"record":' "$tmp/out")
[ "$n" = 2005 ] || fail "dump has $n header/op/checksum lines, want 2005"
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

# the database as an operand (like mdb_stat, sqlite3), the same as --db
expect_rc 0 "$bs" stat "$db" --no-buckets
grep -q "^file  *$db " "$tmp/out" || fail "stat DB"
expect_rc 2 "$bs" stat "$db" "$db.other"
expect_rc 2 "$bs" verify
grep -q "no database given" "$tmp/err" || fail "no database: usage error"
expect_rc 0 "$bs" verify "$db"
# free pages: compaction freed some, the file kept them
expect_rc 0 "$bs" stat "$db" --no-buckets
reclaimable=$(sed -n 's/^reclaimable  *\([0-9]*\) bytes.*/\1/p' "$tmp/out")
[ "${reclaimable:-0}" -gt 0 ] || { cat "$tmp/out"; fail "stat: reclaimable bytes after compaction"; }
# checkpoint: --count and --timeout-ms without --watch are usage errors, not ignored
expect_rc 2 "$bs" checkpoint "$db" --count 2
grep -q -- "--watch" "$tmp/err" || fail "checkpoint --count without --watch"
expect_rc 2 "$bs" checkpoint "$db" --timeout-ms 5
# one bucket: "1 bucket", not "1 buckets"
row='{"cmd":"save","table":"t","tag":"update","id":"s","rows":[{"bucket":"solo","type":"t","id":"s","data":"{}"}]}'
printf '%s\n' '{"cmd":"stream.create","name":"one"}' '{"cmd":"snapshot_done","lsn":"1"}' \
  "$row" '{"cmd":"commit","lsn":"1"}' "$row" '{"cmd":"commit","lsn":"2"}' |
  "$bs" drive --db "$tmp/one.db" > /dev/null
expect_rc 0 "$bs" compact "$tmp/one.db" --min-changes 1
grep -qE "^full compaction: 1 bucket, 1 op moved, " "$tmp/out" || { cat "$tmp/out"; fail "plurals"; }

# backup: a smaller, verified copy; an existing OUT only with --force; nothing left on refusal
expect_rc 0 "$bs" backup "$db" "$tmp/copy.db"
grep -q "verified" "$tmp/out" || fail "backup summary"
[ "$(wc -c < "$tmp/copy.db")" -lt "$(wc -c < "$db")" ] || fail "backup is not smaller"
expect_rc 0 "$bs" verify "$tmp/copy.db"
expect_rc 1 "$bs" backup --db "$db" "$tmp/copy.db"
grep -q "exists" "$tmp/err" || fail "backup over an existing file"
expect_rc 0 "$bs" backup --db "$db" "$tmp/copy.db" --force
expect_rc 2 "$bs" backup "$db"
expect_rc 1 "$bs" backup "$db" "$db" --force
ls -a "$tmp" | grep -q bucketstore-tmp && fail "a temporary was left behind"
"$bs" dump "$db" > "$tmp/a.dump"; "$bs" dump "$tmp/copy.db" > "$tmp/b.dump"
cmp -s "$tmp/a.dump" "$tmp/b.dump" || fail "the backup dumps differently"

# dump | load: a new file; dump(load(dump(x))) == dump(x); checksums equal at every checkpoint
expect_rc 0 "$bs" load "$tmp/loaded.db" "$tmp/a.dump"
grep -q "^loaded [0-9]* records into" "$tmp/out" || fail "load summary"
"$bs" dump "$tmp/loaded.db" | cmp -s - "$tmp/a.dump" || fail "dump(load(dump)) differs"
expect_rc 1 "$bs" load "$tmp/loaded.db" "$tmp/a.dump"
grep -q "exists" "$tmp/err" || fail "load over an existing file"
for c in 1 400 800 1200 1600 1999 2000 2001; do
  for f in "$db" "$tmp/loaded.db"; do
    set +e; "$bs" dump "$f" --checkpoint "$c" > "$f.at" 2>&1; echo "rc $?" >> "$f.at"; set -e
  done
  cmp -s "$db.at" "$tmp/loaded.db.at" || fail "checkpoint $c reads differently after load"
done
"$bs" dump --db "$tmp/loaded.db" --bucket b2 --checkpoint 2000 | grep -q '"count"' ||
  fail "loaded file serves its buckets"
# a partial dump cannot be loaded; a stream that is not there is refused
"$bs" dump "$db" --bucket b0 > "$tmp/partial.dump"
expect_rc 1 "$bs" load "$tmp/p.db" < "$tmp/partial.dump"
grep -q "no record lines" "$tmp/err" || fail "partial dump"
expect_rc 1 "$bs" load "$tmp/p.db" --stream 7 - < "$tmp/a.dump"
[ ! -e "$tmp/p.db" ] || fail "a refused load left a file"
# a record changed on the way (one byte of an op's data, the digit of a PUT's {"v":N}, hex
# 7b2276223a3N: the op's checksum no longer matches): the result does not verify, no file
awk '!done && /^{"record":"ops"/ && (i = index($0, "7b2276223a3")) { p = i + 11;
  c = substr($0, p, 1); $0 = substr($0, 1, p - 1) (c == "0" ? "1" : "0") substr($0, p + 1);
  done = 1 } { print }' "$tmp/a.dump" > "$tmp/tampered.dump"
cmp -s "$tmp/a.dump" "$tmp/tampered.dump" && fail "the dump was not changed"
expect_rc 1 "$bs" load "$tmp/p.db" "$tmp/tampered.dump"
grep -q "problem" "$tmp/err" || { cat "$tmp/err"; fail "a tampered dump must not verify"; }
[ ! -e "$tmp/p.db" ] || fail "a load that did not verify left a file"
echo '{"stream":1' > "$tmp/bad.dump"
expect_rc 1 "$bs" load "$tmp/p.db" "$tmp/bad.dump"
grep -q "bad.dump:1" "$tmp/err" || fail "a bad line is named"
# two streams: --all dumps both; load --stream picks one
printf '%s\n' '{"cmd":"stream.create","name":"two","checksum":"sha256"}' \
  '{"cmd":"save","stream":2,"table":"t","tag":"insert","id":"x","rows":[{"bucket":"z","type":"t","id":"x","data":"{}"}]}' \
  '{"cmd":"flush","stream":2}' | "$bs" drive --db "$db" > /dev/null
expect_rc 0 "$bs" dump "$db" --all
grep -c '^{"stream":' "$tmp/out" | grep -qx 2 || fail "dump --all: a header per stream"
cp "$tmp/out" "$tmp/all.dump"
expect_rc 0 "$bs" load "$tmp/two.db" --stream 2 "$tmp/all.dump"
expect_rc 0 "$bs" dump "$tmp/two.db" --all
grep -c '^{"stream":' "$tmp/out" | grep -qx 1 || fail "load --stream 2: one stream"
grep -q '^{"stream":2,"state":"PROCESSING"' "$tmp/out" || fail "load --stream 2: stream 2"
"$bs" dump "$db" --stream 2 | cmp -s - "$tmp/out" || fail "load --stream 2 differs from dump --stream 2"
expect_rc 0 "$bs" load "$tmp/both.db" < "$tmp/all.dump"
"$bs" dump "$tmp/both.db" --all | cmp -s - "$tmp/all.dump" || fail "dump --all after load"

# checkpoint --watch in one process sees two commits made by another. Polling from another
# process coalesces commits closer together than its 50 ms period, so each commit is made only
# once the watcher has printed the line before it: the interleaving is arranged (a FIFO feeds
# the driver), and the bounds (10 minutes) only catch a hang. The watcher's file exists before
# the watcher starts, and a count that cannot be read is "not yet": once, under load, the shell
# asked for the lines before the background job had made its file, `[ "" -lt 1 ]` failed, which
# ended the wait at once, and every command went out before the watcher's first line (which then
# already showed the keepalive: "1 of 2 checkpoints before the timeout").
: > "$tmp/watch"
"$bs" checkpoint --db "$db" --watch --count 2 --timeout-ms 600000 > "$tmp/watch" &
watcher=$!
watched() { n=0; until [ "$(wc -l < "$tmp/watch")" -ge "$1" ]; do
  n=$((n + 1)); [ $n -lt 6000 ] || { watch_said; fail "checkpoint --watch: no line $1"; }
  sleep 0.1; done; }
# what each side said, on a failure: the driver answers every command with a JSON line
watch_said() { echo "== watch:"; cat "$tmp/watch"; echo "== drive:"; cat "$tmp/drive"; }
mkfifo "$tmp/cmds"
"$bs" drive --db "$db" < "$tmp/cmds" > "$tmp/drive" &
driver=$!
exec 3> "$tmp/cmds"
watched 1
echo '{"cmd":"keepalive","lsn":"00000100"}' >&3
watched 2
echo '{"cmd":"save","table":"t","tag":"update","id":"r1","rows":[{"bucket":"b1","type":"t","id":"r1","data":"{}"}]}' >&3
echo '{"cmd":"commit","lsn":"00000101"}' >&3
exec 3>&-
wait "$driver" || { watch_said; fail "drive exited non-zero"; }
grep -q '"ok":false' "$tmp/drive" && { watch_said; fail "drive refused a command"; }
wait "$watcher" || { watch_said; fail "checkpoint --watch exited non-zero"; }
[ "$(wc -l < "$tmp/watch")" = 3 ] || { watch_said; fail "watch lines"; }
tail -n 1 "$tmp/watch" | grep -q '"checkpoint":"2001","lsn":"00000101"' || fail "watch last line"
# A PostgreSQL password is never printed: URLs to a closed port, URLs libpq refuses by quoting
# them, a password as a query parameter, and key=value form, through stat, verify and drive.
pw=Zq7secretPW
for url in "postgresql://u:$pw@127.0.0.1:1/db" "postgresql://u:$pw%zz@127.0.0.1:1/db" \
    "postgresql://u:$pw@[::1:1/db" "postgres://u@127.0.0.1:1/db?password=$pw&bogus=1" \
    "host=127.0.0.1 port=1 password=$pw"; do
  for c in stat verify; do
    expect_rc 1 "$bs" "$c" --postgres "$url"
    ! grep -q "$pw" "$tmp/out" "$tmp/err" || fail "$c --postgres prints the password: $(cat "$tmp/err")"
    grep -q '\*\*\*' "$tmp/err" || fail "$c --postgres: the URL is not shown: $(cat "$tmp/err")"
  done
  echo '{"cmd":"stat"}' | (cd "$tmp" && expect_rc 1 "$bs" drive --postgres "$url")
  ! grep -q "$pw" "$tmp/out" "$tmp/err" || fail "drive --postgres prints the password"
done
# --postgres takes libpq's key=value form as well as a URL: a connection is tried (the closed
# port refuses it), never a file of that name
for c in stat verify migrate; do
  (cd "$tmp" && expect_rc 1 "$bs" "$c" --postgres "host=127.0.0.1 port=1 password=$pw")
  grep -q 'BS_EIO' "$tmp/err" && ! grep -q 'does not exist' "$tmp/err" ||
    fail "$c --postgres key=value is not a connection: $(cat "$tmp/err")"
done
echo '{"cmd":"stat"}' | (cd "$tmp" && expect_rc 1 "$bs" drive --postgres "host=127.0.0.1 port=1")
[ -z "$(find "$tmp" -maxdepth 1 -name 'host=*')" ] || fail "drive --postgres key=value made a file"
echo "cli_check: ok"
