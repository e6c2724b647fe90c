#!/bin/sh
# The steps of `make test` and their summary: a skipped step is never counted as passed.
#   tests/step.sh RESULTS NAME CMD...   runs CMD and appends one line to RESULTS: "fail NAME" when
#       it exits non-zero; else "skip NAME: WHY" when it wrote WHY to the file $BS_SKIP_NOTE (a
#       step skips what it cannot run there by printing and appending a line to it: the Makefile's
#       `skip` function, ft_skip in the C suites); else "pass NAME".
#   tests/step.sh --scan PATTERN CMD...   runs CMD (a suite with skips of its own: pytest -rs,
#       node --test) and adds each line of its output that matches the grep PATTERN to
#       $BS_SKIP_NOTE; exits with CMD's status.
#   tests/step.sh --seeds LOG   prints how many seeded runs each suite made on each backend, from
#       LOG (lines "SUITE BACKEND SEED", appended by every seeded run of make test: BS_SEED_LOG),
#       and fails if no run logged a seed or if two runs used one seed.
#   tests/step.sh --summary RESULTS [STRICT]   prints "N passed, M failed, K skipped" and names
#       what failed and what was skipped; exits 1 on a failure, and with STRICT=1 on a skip too.
set -u
if [ "$1" = --summary ]; then
  results=$2 strict=${3:-0}
  [ -f "$results" ] || { echo "test summary: no steps ran ($results missing)"; exit 1; }
  p=$(grep -c '^pass ' "$results") f=$(grep -c '^fail ' "$results") k=$(grep -c '^skip ' "$results")
  echo "== $p passed, $f failed, $k skipped"
  grep '^fail \|^skip ' "$results" | sed 's/^/   /'
  [ "$f" = 0 ] || exit 1
  if [ "$k" != 0 ] && [ "$strict" = 1 ]; then echo "STRICT=1: a skip fails the run"; exit 1; fi
  exit 0
fi
if [ "$1" = --seeds ]; then
  log=$2
  [ -s "$log" ] || { echo "seeds: no run logged a seed ($log)"; exit 1; }
  echo "== seeds: $(wc -l <"$log") runs, $(cut -d' ' -f3 "$log" | sort -u | wc -l) distinct seeds"
  cut -d' ' -f1,2 "$log" | sort | uniq -c | sed 's/^ */   /'
  dup=$(cut -d' ' -f3 "$log" | sort | uniq -d)
  [ -z "$dup" ] && exit 0
  echo "seeds: runs that share a seed (each seed must be one run's):"
  for s in $dup; do grep " $s\$" "$log" | sed 's/^/   /'; done
  exit 1
fi
if [ "$1" = --scan ]; then
  pattern=$2
  shift 2
  out=$(mktemp "${TMPDIR:-/tmp}/bs-scan-XXXXXX")
  exec 4>&1
  rc=$( ( ("$@" 2>&1; echo $? >&3) | tee "$out" >&4) 3>&1)
  if [ -n "${BS_SKIP_NOTE:-}" ]; then grep -e "$pattern" "$out" >> "$BS_SKIP_NOTE"; fi
  rm -f "$out"
  exit "$rc"
fi
results=$1 name=$2
shift 2
note=$(mktemp "${TMPDIR:-/tmp}/bs-skip-XXXXXX")
BS_SKIP_NOTE=$note "$@"
rc=$?
if [ $rc != 0 ]; then
  echo "fail $name (exit status $rc)" >> "$results"
  echo "== FAILED: $name (exit status $rc)"
elif [ -s "$note" ]; then
  echo "skip $name: $(sort -u "$note" | paste -sd ';' | sed 's/;/; /g')" >> "$results"
else
  echo "pass $name" >> "$results"
fi
rm -f "$note"
exit 0
