#!/usr/bin/env bash
# The main job: installs what is needed, builds Joule, starts a local cluster (a
# coordinator and two CPU workers on loopback), trains the mlp on Fashion-MNIST with
# data-parallel SGD (Gloo allreduce) across the two workers, prints the final test
# accuracy, the wall time and the job's energy report (and writes it as an HTML page with
# plots), and shuts every process down.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2

export JOULE_STATE_DIR="${JOULE_STATE_DIR:-$PWD/.joule/main-job}"
joule=build/bin/joule
"$joule" cluster down >/dev/null 2>&1 || true
"$joule" cluster up --workers 2
trap '"$joule" cluster down' EXIT

id=$("$joule" submit --name fashion-mlp --model mlp --dataset fashion-mnist --workers 2 \
  --global-batch-size 128 --epochs 3 --lr 0.05 --momentum 0.9)
echo "submitted job $id"
"$joule" watch "$id"
echo
"$joule" report "$id"
"$joule" report "$id" --html "$JOULE_STATE_DIR/job-$id.html"
echo "the report with its plots (power by rank, energy by phase, loss and accuracy by epoch):"
echo "  $JOULE_STATE_DIR/job-$id.html"
