#!/usr/bin/env bash
# Metering overhead: the mlp reference workload (2 workers x 1 thread, global batch 128,
# one epoch of Fashion-MNIST, SGD lr 0.05 momentum 0.9) with energy metering at the
# default period (100 ms) against metering off, side by side in one run. The two modes
# alternate (on, off, on, off, ...) so that drift in the machine's speed hits both alike.
#
# usage: bash bench/metering_overhead.sh [--runs N] [--build-dir build] [--period-ms 100]
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
build=build
period=100
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --period-ms) period="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
joule="$build/bin/joule"
if [ ! -x "$joule" ]; then
  echo "no $joule: build first (cmake -S . -B build -G Ninja && cmake --build build -j2)" >&2
  exit 2
fi

state=$(mktemp -d)
trap '"$joule" --state-dir "$state" cluster down >/dev/null 2>&1 || true; rm -rf "$state"' EXIT

# One job on a fresh cluster whose workers meter every $1 ms (0 = off); prints samples/s.
run_once() {
  "$joule" --state-dir "$state" cluster up --workers 2 --threads 1 --energy-period-ms "$1" >/dev/null
  local id
  id=$("$joule" --state-dir "$state" submit --model mlp --workers 2 --global-batch-size 128 \
        --epochs 1 --lr 0.05 --momentum 0.9 --threads 1 --seed 0 --name "overhead-$1")
  "$joule" --state-dir "$state" watch "$id" >/dev/null
  "$joule" --state-dir "$state" status "$id" |
    sed -n 's/.*train [0-9.]* s (\([0-9]*\) samples\/s).*/\1/p'
  "$joule" --state-dir "$state" cluster down >/dev/null
}

on=(); off=()
for i in $(seq "$runs"); do
  on+=("$(run_once "$period")")
  off+=("$(run_once 0)")
  echo "run $i: metering on ${on[-1]} samples/s, off ${off[-1]} samples/s"
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
m_on=$(median "${on[@]}")
m_off=$(median "${off[@]}")
awk -v on="$m_on" -v off="$m_off" -v p="$period" 'BEGIN {
  printf "mlp, median of the runs: metering every %d ms %d samples/s, off %d samples/s, overhead %.2f%%\n",
    p, on, off, 100 * (off - on) / off }'
