#!/usr/bin/env bash
# crashtest.sh: SIGKILL the crash writer at random moments, N times, checking the file after each
# kill (tests/crash/crash_check.c says what is checked).
# Usage: tests/crash/crashtest.sh BINDIR [KILLS]   (env: BS_SEED, BS_CRASH_DIR, BS_CRASH_MAXMS;
#   BS_SEED_LOG: a file the seed is appended to, as make test's suites do)
set -u
bindir=${1:?usage: crashtest.sh BINDIR [KILLS]}
kills=${2:-200}
seed=${BS_SEED:-$(( $(date +%s) % 100000 ))}
maxms=${BS_CRASH_MAXMS:-400}
dir=$(mktemp -d "${BS_CRASH_DIR:-${TMPDIR:-/tmp}}/bs_crash_XXXXXX")
db=$dir/db
log=$dir/log
RANDOM=$seed
inflight=0
last=0
cleanup() { rm -rf "$dir"; }
trap cleanup EXIT
echo "crashtest: $kills kills, seed $seed (BS_SEED=$seed reproduces), in $dir"
if [ -n "${BS_SEED_LOG:-}" ]; then echo "crashtest crash_writer $seed" >>"$BS_SEED_LOG"; fi
start=$(date +%s)
for ((i = 1; i <= kills; i++)); do
  "$bindir/crash_writer" "$db" "$log" "$seed" 2>"$dir/writer.err" &
  pid=$!
  # mostly short delays (kills during open, the first commits, compaction), some longer
  ms=$(( RANDOM % maxms + 1 ))
  if (( RANDOM % 4 == 0 )); then ms=$(( RANDOM % 30 + 1 )); fi
  sleep "$(printf '0.%03d' "$ms")"
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    echo "crashtest: the writer exited on its own (status $?) at kill $i:"
    cat "$dir/writer.err"
    exit 1
  fi
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  if ! out=$("$bindir/crash_check" "$db" "$log" "$seed"); then
    echo "crashtest: FAILED after kill $i (seed $seed); the file is kept in $dir.keep"
    cp -r "$dir" "$dir.keep"
    exit 1
  fi
  case $out in *inflight=1*) inflight=$((inflight + 1)) ;; esac
  last=$out
done
echo "crashtest: $kills kills survived in $(( $(date +%s) - start ))s; $inflight landed between a" \
     "commit and its log line; last check: $last"
