#!/usr/bin/env bash
# Threads against processes, the first paper's study (Wu, Brazzle, Cahoon, arXiv
# 2305.00798) on one host: logistic regression by SGD, logistic regression by the genetic
# algorithm and the mlp by SGD, each over data-size and model-size ladders, in four modes:
# 1 worker x 1 thread (serial), 1 x 2 threads (shared memory), 2 workers x 1 thread
# (distributed memory) and 2 x 2. The three sweeps (bench/sweeps/tvp-*.yaml) run one job
# at a time on a local 2-worker cluster; the tables (markdown) give per cell the wall time,
# the speedup and parallel efficiency against the serial cell (efficiency over workers x
# threads), the average power, the energy and the test accuracy.
#
# usage: bash bench/threads_vs_processes.sh [--build-dir build] [--repeats N] [--out DIR]
#   --repeats N   overrides the files' repeats (2)
#   --out DIR     where the sweeps' JSON and the tables go (default bench/results/tvp-DATE)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
repeats=""
out="bench/results/tvp-$(date +%Y%m%d-%H%M%S)"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
joule="$build/bin/joule"
[ -x "$joule" ] || { echo "no $joule: build first (see README.md)" >&2; exit 2; }
mkdir -p "$out"
state=$(mktemp -d)
files=$(mktemp -d)
trap '"$joule" --state-dir "$state" cluster down >/dev/null 2>&1 || true; rm -rf "$state" "$files"' EXIT
"$joule" --state-dir "$state" cluster up --workers 2 --threads 1 >/dev/null

status=0
for sweep in tvp-logreg-sgd tvp-logreg-ga tvp-mlp-sgd; do
  file="bench/sweeps/$sweep.yaml"
  if [ -n "$repeats" ]; then
    sed "s/^repeats: .*/repeats: $repeats/" "$file" > "$files/$sweep.yaml"
    file="$files/$sweep.yaml"
  fi
  echo "sweep $sweep ..." >&2
  # A sweep with a failed job still writes its table (the cell's ok count shows it); the
  # others still run, and the script's status says so at the end.
  "$joule" --state-dir "$state" sweep run "$file" -o json --out "$out/$sweep.json" || status=1
done
python3 bench/tvp_table.py "$out"/tvp-logreg-sgd.json "$out"/tvp-logreg-ga.json \
  "$out"/tvp-mlp-sgd.json | tee "$out/tables.md"
echo "wrote $out/tables.md" >&2
exit "$status"
