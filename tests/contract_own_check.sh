#!/bin/sh
# contract_own_check.sh [BUILD]: docs/testing.md's recipe for running the conformance suite on a
# backend of one's own, followed as written. Its cc command is read out of the doc (so the doc
# and this check cannot differ), pointed at tests/contract_own.c and BUILD's library, compiled
# and run: every case passes on that backend, and the case its lacks flag names is left out,
# saying so.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "contract_own_check: $*" >&2; exit 1; }

# the command: the backquoted text that starts with "cc -DCT_CONTRACT_NO_MAIN", over its lines
cmd=$(tr '\n' ' ' < docs/testing.md | sed -n 's/.*`\(cc -DCT_CONTRACT_NO_MAIN[^`]*\)`.*/\1/p')
[ -n "$cmd" ] || fail "docs/testing.md has no \`cc -DCT_CONTRACT_NO_MAIN ...\` command"
case "$cmd" in *mymain.c*build/libbucketstore.a*) ;; *) fail "unexpected command: $cmd" ;; esac
cmd=$(printf '%s' "$cmd" | sed "s|mymain\.c|tests/contract_own.c|; s|build/libbucketstore\.a|$build/libbucketstore.a|")
echo "$cmd -o $tmp/contract_own"
sh -c "$cmd -o $tmp/contract_own" || fail "the doc's command does not build"
BS_SKIP_NOTE= BS_TEST_QUICK=1 "$tmp/contract_own" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "the suite failed"; }
grep -q '^skipped: .*t_op_ids_at_limit.*mine lacks the capability' "$tmp/out" ||
  { cat "$tmp/out"; fail "the case CT_LACKS_OP_HEAD names was not left out"; }
grep -q 'PASSED' "$tmp/out" || { cat "$tmp/out"; fail "no PASSED line"; }
echo "contract_own_check: ok ($(grep -c '^\[       OK \]' "$tmp/out") cases passed on \"mine\")"
