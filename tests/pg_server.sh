#!/bin/sh
# pg_server.sh start DIR [full] | standby DIR URL | detach DIR | stop DIR | restart DIR |
# run CMD...: a throwaway PostgreSQL server for the tests.
#   start DIR    initdb into DIR/data, listen on 127.0.0.1 on a free port (no Unix socket outside
#                DIR), print the server's URL (postgresql://bs@127.0.0.1:PORT/bs) on stdout
#   start DIR full  the same, a server whose files cannot grow past 8 MiB - 512 bytes (prlimit
#                --fsize; the postmaster ignores SIGXFSZ, so extending a table fails as on a full
#                disk: "could not extend file", SQLSTATE 53100), 1 MiB WAL segments, no autovacuum
#                (tests/test_pg_fault t_disk_full)
#   standby DIR URL  a hot standby of the server at URL (pg_basebackup -R: read-only, streaming
#                its WAL), started as start does; prints its URL (tests/test_pg_fault t_standby)
#   detach DIR   stop that standby and start it again on its port without its primary
#                (primary_conninfo empty): it keeps the WAL it received and gets no more, as a
#                standby cut off from a failed primary (tests/test_pg_fault t_failover)
#   stop DIR     stop the server and remove DIR
#   restart DIR  stop the server as a crash does (pg_ctl stop -m immediate: every session is cut,
#                nothing is checkpointed) and start it again on the same port (tests/test_pg_fault)
#   run CMD      start a server in a new temporary directory, run CMD with BS_TEST_PG_URL and
#                BS_TEST_PG_RESTART (the restart command) set, stop and remove it, exit with
#                CMD's status; with BS_TEST_PG_URL already set, just run CMD against that server
#                (docs/testing.md, "On PostgreSQL"). Both set BS_TEST_PG_SERVER (this script) for
#                the tests that start a server of their own; a started server also sets
#                BS_TEST_PG_DIR, its directory, where they start theirs (own.*), which its stop
#                stops too: none is left running when a test was killed half-way
# PostgreSQL refuses to run as root: as root the server runs as the `postgres` user (runuser).
# Exit 77 when no PostgreSQL binaries are installed (PG_BIN, default the newest under
# /usr/lib/postgresql).
set -eu

pg_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  return 1
}

as_owner() { # run "$@" as the owner of the data directory
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start() {
  dir=$1
  walseg=
  bin=$(pg_bin) || { echo "pg_server.sh: no PostgreSQL binaries (apt-get install postgresql-15)" >&2; exit 77; }
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  if [ "${2:-}" = full ]; then touch "$dir/full"; walseg=--wal-segsize=1; fi
  as_owner "$bin/initdb" -D "$dir/data" -U bs --auth=trust -E UTF8 --no-sync $walseg >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  port=$(free_port)
  serve "$bin" "$dir" "$port"
  echo "$port" >"$dir/port"
  as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U bs bs
  echo "postgresql://bs@127.0.0.1:$port/bs"
}

serve() { # BIN DIR PORT [OPTIONS]: start the server of DIR on PORT
  # fsync off: a test server holds nothing worth a crash-safe disk; small shared buffers
  limit= opts=${4:-}
  if [ -f "$2/full" ]; then limit="prlimit --fsize=8388096 --"; opts="$opts -c autovacuum=off"; fi
  as_owner $limit "$1/pg_ctl" -D "$2/data" -l "$2/server.log" -w -t 600 \
    -o "-c listen_addresses=127.0.0.1 -p $3 -k $2 -c fsync=off -c full_page_writes=off \
        -c shared_buffers=64MB -c max_connections=100 $opts" start >/dev/null ||
    { cat "$2/server.log" >&2; exit 1; }
}

standby() {
  dir=$1
  bin=$(pg_bin) || exit 77
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  as_owner "$bin/pg_basebackup" -d "$2" -D "$dir/data" -R -c fast -X stream >"$dir/basebackup.log" 2>&1 ||
    { cat "$dir/basebackup.log" >&2; exit 1; }
  port=$(free_port)
  serve "$bin" "$dir" "$port"
  echo "$port" >"$dir/port"
  echo "postgresql://bs@127.0.0.1:$port/bs"
}

detach() {
  dir=$1
  bin=$(pg_bin) || exit 77
  as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  serve "$bin" "$dir" "$(cat "$dir/port")" "-c primary_conninfo=''"
}

restart() {
  dir=$1
  walseg=
  bin=$(pg_bin) || exit 77
  as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
  serve "$bin" "$dir" "$(cat "$dir/port")"
}

stop() {
  dir=$1
  bin=$(pg_bin) || exit 0
  for d in "$dir"/own.* "$dir"; do
    if [ -d "$d/data" ]; then as_owner "$bin/pg_ctl" -D "$d/data" -m fast -w stop >/dev/null 2>&1 || true; fi
  done
  rm -rf "$dir"
}

case "${1:-}" in
start) start "$2" "${3:-}" ;;
standby) standby "$2" "$3" ;;
detach) detach "$2" ;;
stop) stop "$2" ;;
restart) restart "$2" ;;
run)
  shift
  BS_TEST_PG_SERVER="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  export BS_TEST_PG_SERVER
  if [ -n "${BS_TEST_PG_URL:-}" ]; then exec "$@"; fi
  dir=$(mktemp -d /tmp/bs-pg.XXXXXX)
  trap 'stop "$dir"' EXIT INT TERM
  url=$(start "$dir") || exit $?
  rc=0
  BS_TEST_PG_URL=$url BS_TEST_PG_RESTART="$BS_TEST_PG_SERVER restart $dir" BS_TEST_PG_DIR=$dir \
    "$@" || rc=$?
  exit $rc
  ;;
*)
  echo "usage: pg_server.sh start DIR [full] | standby DIR URL | detach DIR | stop DIR | restart DIR | run CMD" >&2
  exit 2
  ;;
esac
