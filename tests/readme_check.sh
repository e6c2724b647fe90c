#!/usr/bin/env bash
# readme_check.sh [BUCKETSTORE]: the README's examples are real.
#  - Its C example is examples/quickstart.c, which make test builds and runs: fail when the two
#    drift apart.
#  - With the CLI binary as argument: its driver example (the `$ printf ... | ./bucketstore drive`
#    block) is run with that binary and must print exactly the replies the README shows.
set -eu
cd "$(dirname "$0")/.."
fail() { echo "readme_check: FAIL: $*" >&2; exit 1; }
diff <(awk '/^```c$/{on=1; next} /^```$/{on=0} on' README.md) examples/quickstart.c >/dev/null ||
  fail "README.md's C example differs from examples/quickstart.c"

checked="C example"
if [ $# -ge 1 ]; then
  bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/bs-readme.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # The command: from "    $ printf" to the line that pipes into the driver; then the replies
  # up to the next blank line.
  awk '/^    \$ printf/ { on = 1 } on { sub(/^    (\$ )?/, ""); print } on && /drive --memory$/ { exit }' \
    README.md > "$tmp/cmd"
  awk '/^    \$ printf/ { on = 1 } on && /drive --memory$/ { out = 1; next }
       out && /^$/ { exit } out { sub(/^    /, ""); print }' README.md > "$tmp/want"
  [ -s "$tmp/cmd" ] && [ -s "$tmp/want" ] || fail "README.md has no driver example"
  grep -q '| ./bucketstore drive --memory$' "$tmp/cmd" || fail "driver example: no ./bucketstore drive"
  sed -i "s#| ./bucketstore drive#| '$bin' drive#" "$tmp/cmd"
  bash "$tmp/cmd" > "$tmp/got" || fail "driver example: the command failed"
  diff "$tmp/want" "$tmp/got" > "$tmp/diff" ||
    fail "README.md's driver example does not print what it shows (< README, > actual): $(cat "$tmp/diff")"
  checked="$checked, driver example ($(wc -l < "$tmp/want") replies)"
fi

echo "readme_check: ok ($checked)"
