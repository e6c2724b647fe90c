#!/usr/bin/env bash
# powercut.sh: cuts the power under the crash writer N times (tests/crash/powercut.c, preloaded),
# each time at a random write to the database or sync of it; the file the cut leaves (what was
# synced, plus a random subset of the pages written since, torn at 512-byte sectors) must open,
# verify clean and hold every commit the writer logged as returned (tests/crash/crash_check.c),
# and the next writer continues on it.
# Usage: tests/crash/powercut.sh BINDIR [CUTS [WRITER]]
#   (env: BS_SEED, BS_CRASH_DIR, BS_CRASH_KEEP=0: keep no copy of a failing run's files,
#   BS_SEED_LOG: a file the seed is appended to, as make test's suites do)
# WRITER: crash_writer (default), or crash_writer_nosync, which must fail: its commits return
# before anything is synced.
set -u
bindir=${1:?usage: powercut.sh BINDIR [CUTS [WRITER]]}
cuts=${2:-50}
writer=${3:-crash_writer}
seed=${BS_SEED:-$(( $(date +%s) % 100000 ))}
dir=$(mktemp -d "${BS_CRASH_DIR:-${TMPDIR:-/tmp}}/bs_powercut_XXXXXX")
db=$dir/db
log=$dir/log
RANDOM=$seed
lost_sum=0 unsynced_sum=0
trap 'rm -rf "$dir"' EXIT
echo "powercut: $cuts cuts under $writer, seed $seed (BS_SEED=$seed reproduces), in $dir"
if [ -n "${BS_SEED_LOG:-}" ]; then echo "powercut $writer $seed" >>"$BS_SEED_LOG"; fi
for ((i = 1; i <= cuts; i++)); do
  # mostly early calls (open, the first commits), some later ones (compactions, a grown file)
  at=$(( RANDOM % 400 + 1 ))
  if (( RANDOM % 4 == 0 )); then at=$(( RANDOM % 3000 + 1 )); fi
  LD_PRELOAD=$bindir/powercut.so BS_POWERCUT_FILE=$db BS_POWERCUT_AT=$at \
    BS_POWERCUT_OUT=$dir/cut BS_POWERCUT_SEED=$((seed * 1000 + i)) \
    "$bindir/$writer" "$db" "$log" "$seed" 2>"$dir/writer.err"
  rc=$?
  if [ $rc != 99 ]; then
    echo "powercut: the writer exited with status $rc before call $at (cut $i):"
    cat "$dir/writer.err"
    exit 1
  fi
  lost=$(sed -n 's/^powercut: cut at call [0-9]*: \([0-9]*\) of \([0-9]*\) .*/\1 \2/p' "$dir/writer.err")
  lost_sum=$((lost_sum + ${lost% *})) unsynced_sum=$((unsynced_sum + ${lost#* }))
  mv "$dir/cut" "$db"
  rm -f "$db-lock"
  if ! out=$("$bindir/crash_check" "$db" "$log" "$seed"); then
    echo "powercut: FAILED after cut $i at call $at (seed $seed)"
    if [ "${BS_CRASH_KEEP:-1}" != 0 ]; then cp -r "$dir" "$dir.keep"; echo "  files kept in $dir.keep"; fi
    exit 1
  fi
done
echo "powercut: $cuts power cuts survived ($lost_sum of $unsynced_sum unsynced sectors lost in all);" \
  "last check: $out"
