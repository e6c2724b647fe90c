#!/usr/bin/env bash
# Driver smoke test: runs every scenario tests/driver/NAME.jsonl through `bucketstore drive`
# on the memory backend and on an LMDB file, and compares the replies line by line with
# tests/driver/NAME.expected. An expected error message of "*" matches any message.
# Every scenario is required on every backend: a finished build answers no command with
# BS_UNSUPPORTED. With BS_DRIVER_PG=1 and BS_TEST_PG_URL (make pg-test) it runs the scenarios on
# the PostgreSQL backend instead, each in a schema of its own (psql creates and drops it).
# usage: tests/driver_smoke.sh ./bucketstore
set -u
BIN=${1:-./bucketstore}
HERE=$(cd "$(dirname "$0")" && pwd)
SCEN="$HERE/driver"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bs-smoke-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0

fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Replaces every "message":"..." by "message":"*".
wildcard() { sed -E 's/"message":"([^"\\]|\\.)*"/"message":"*"/g'; }


# compare NAME MODE EXPECTED ACTUAL: 0 when every line matches.
compare() {
  local name=$1 mode=$2 i
  local -a exp act
  mapfile -t exp < "$3"
  mapfile -t act < "$4"
  if [ "${#exp[@]}" -ne "${#act[@]}" ]; then
    fail "$name ($mode): ${#act[@]} replies, expected ${#exp[@]}"
    return 1
  fi
  for ((i = 0; i < ${#exp[@]}; i++)); do
    [ "${act[i]}" = "${exp[i]}" ] && continue
    if [[ ${exp[i]} == *'"message":"*"'* ]] &&
       [ "$(printf '%s\n' "${act[i]}" | wildcard)" = "${exp[i]}" ]; then
      continue
    fi
    fail "$name ($mode): reply $((i + 1)) differs"
    echo "  expected: ${exp[i]}"
    echo "  actual:   ${act[i]}"
    return 1
  done
  return 0
}

if [ ! -x "$BIN" ]; then
  echo "driver_smoke: $BIN is not executable" >&2
  exit 1
fi

for input in "$SCEN"/*.jsonl; do
  name=$(basename "$input" .jsonl)
  expected="$SCEN/$name.expected"
  if [ ! -f "$expected" ]; then
    fail "$name: no $name.expected"
    continue
  fi
  modes="memory lmdb"
  [ "${BS_DRIVER_PG:-}" = 1 ] && modes=postgres
  for mode in $modes; do
    if [ "$mode" = memory ]; then
      args=(drive --memory)
    elif [ "$mode" = postgres ]; then
      schema="bs_smoke_$$_$(echo "$name" | tr -c 'a-z0-9_\n' _)"
      psql -q "$BS_TEST_PG_URL" -c "SET client_min_messages = warning;
        DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" || { fail "$name: psql"; continue; }
      case $BS_TEST_PG_URL in *\?*) sep='&' ;; *) sep='?' ;; esac
      args=(drive --nosync --postgres "$BS_TEST_PG_URL${sep}options=-csearch_path%3D$schema")
    else
      rm -f "$TMP/db" "$TMP/db-lock"
      args=(drive --nosync --db "$TMP/db")
    fi
    "$BIN" "${args[@]}" < "$input" > "$TMP/out" 2> "$TMP/err"
    rc=$?
    if [ $rc -ne 0 ]; then
      fail "$name ($mode): exit status $rc: $(head -c 300 "$TMP/err")"
      continue
    fi
    [ "$mode" = postgres ] &&
      psql -q "$BS_TEST_PG_URL" -c "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE"
    compare "$name" "$mode" "$expected" "$TMP/out" && passes=$((passes + 1))
  done
done
if [ "${BS_DRIVER_PG:-}" = 1 ]; then
  echo "driver smoke (postgres): $passes scenarios passed, $failures failed"
  [ $failures -eq 0 ]
  exit
fi

# The driver itself: garbage keeps it going, a bad database path is exit 1, a temporary
# database leaves nothing behind.
out=$(printf '%s\n' 'garbage {' '' '{"cmd":"checkpoint","echo":7}' | "$BIN" drive --memory)
want='{"ok":false,"error":{"code":"BS_EINVAL","message":"*"}}
{"ok":true,"checkpoint":"0","lsn":null,"echo":7}'
if [ "$(printf '%s\n' "$out" | wildcard)" = "$want" ]; then passes=$((passes + 1)); else
  fail "malformed line: got: $out"; fi

"$BIN" drive --db "$TMP/no/such/dir/db" < /dev/null > /dev/null 2>&1
rc=$?
if [ $rc -eq 1 ]; then
  passes=$((passes + 1))
else
  fail "unopenable database: exit $rc, expected 1"
fi

mkdir -p "$TMP/t"
out=$(echo '{"cmd":"stream.create","name":"x"}' | TMPDIR="$TMP/t" "$BIN" drive)
rc=$?
left=$(ls -A "$TMP/t")
if [ $rc -eq 0 ] && [ -z "$left" ] && [[ $out == '{"ok":true'* ]]; then
  passes=$((passes + 1))
else
  fail "temporary database: exit $rc, reply $out, left behind: $left"
fi

echo "driver smoke: $passes passed, $failures failed"
[ $failures -eq 0 ]
