#!/usr/bin/env bash
# Local SGD against allreduce on the mlp workload (2 workers x 1 thread, global batch 128,
# SGD lr 0.05 momentum 0.9, Fashion-MNIST), side by side in one run: training throughput
# and final test accuracy for synchronous allreduce and for post-local SGD averaging
# parameters (and momentum) every H steps, H in {1, 4, 16}, after no warm-up.
#
# usage: bash bench/local_sgd.sh [--epochs 1] [--build-dir build]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=1
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
joule="$build/bin/joule"
[ -x "$joule" ] || { echo "no $joule: build first" >&2; exit 2; }
state=$(mktemp -d)
trap '"$joule" --state-dir "$state" cluster down >/dev/null 2>&1 || true; rm -rf "$state"' EXIT
"$joule" --state-dir "$state" cluster up --workers 2 --threads 1 >/dev/null

run() {  # name, extra submit flags...
  local name="$1"; shift
  local id
  id=$("$joule" --state-dir "$state" submit --model mlp --workers 2 --global-batch-size 128 \
        --epochs "$epochs" --lr 0.05 --momentum 0.9 --threads 1 --seed 0 --name "$name" "$@")
  "$joule" --state-dir "$state" watch "$id" >/dev/null
  "$joule" --state-dir "$state" status "$id" |
    sed -n "s/.*test accuracy \([0-9.]*\) (loss.*(\([0-9]*\) samples\/s).*/$name \2 \1/p"
}

printf '%-16s %12s %10s\n' "sync" "samples/s" "accuracy"
{
  run allreduce
  for h in 1 4 16; do
    run "local-sgd-H$h" --sync local-sgd --sync-period "$h" --average-momentum
  done
} | while read -r name sps acc; do printf '%-16s %12s %10s\n' "$name" "$sps" "$acc"; done
