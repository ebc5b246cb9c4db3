#!/usr/bin/env bash
# The job store side by side in one run: durable submits per second from 32 clients and
# list latency, SQLite (a new file) and PostgreSQL (a server this script starts in a
# temporary directory, as `nobody` when run as root, on a Unix socket there; fsync on),
# both through joule-bench-coordinator-load. With --history N (0: skipped), then list pages
# over N stored finished jobs on each (a new SQLite file, a new PostgreSQL database).
#
#   bash bench/store.sh [--jobs 20000] [--clients 32] [--history 1000000] [--build build]
set -euo pipefail
jobs=20000
clients=32
history=1000000
build=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    --history) history="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "store.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bench="$build/bin/joule-bench-coordinator-load"
[[ -x $bench ]] || { echo "store.sh: $bench is not built (cmake --build $build)" >&2; exit 1; }
pgbin=$(printf "%s\n" /usr/lib/postgresql/*/bin | sort -V | tail -1)
[[ -n $pgbin && -x $pgbin/initdb ]] || {
  echo "store.sh: PostgreSQL is not installed (bash scripts/install-deps.sh)" >&2; exit 1; }

dir=$(mktemp -d /tmp/joule_store_bench_XXXXXX)
as_server=()
if [[ $(id -u) == 0 ]]; then
  chown nobody:nogroup "$dir"
  as_server=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi
stop() {
  "${as_server[@]}" "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
"${as_server[@]}" "$pgbin/initdb" -D "$dir/data" -U joule --auth=trust -E UTF8 --locale=C \
  >"$dir/initdb.log" 2>&1
port=$(( 20000 + RANDOM % 20000 ))
"${as_server[@]}" "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o \
  "-p $port -k $dir -c listen_addresses='' -c fsync=on" start >/dev/null
"${as_server[@]}" "$pgbin/createdb" -h "$dir" -p "$port" -U joule bench

echo "== joule-bench-coordinator-load --jobs $jobs --clients $clients, $(nproc) cores, $(date -u +%F)"
echo "-- SQLite"
"$bench" --jobs "$jobs" --clients "$clients" --no-heartbeats
echo "-- PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}')"
"$bench" --jobs "$jobs" --clients "$clients" --no-heartbeats \
  --store "postgresql:///bench?host=$dir&port=$port&user=joule"
[[ $history -gt 0 ]] || exit 0
"${as_server[@]}" "$pgbin/createdb" -h "$dir" -p "$port" -U joule history
echo "== joule-bench-coordinator-load --history $history"
echo "-- SQLite"
"$bench" --history "$history"
echo "-- PostgreSQL"
"$bench" --history "$history" --store "postgresql:///history?host=$dir&port=$port&user=joule"
