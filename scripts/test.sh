#!/usr/bin/env bash
# Installs what is needed, builds Joule with its tests and runs every test that needs no
# GPU (ctest -LE gpu): unit tests, then integration tests with real processes on loopback.
# Two tests at a time (CTEST_PARALLEL_LEVEL overrides): most integration time is waiting
# on processes, and every test takes its own ports, scratch directory and namespaces.
# JOULE_WERROR=ON (as CI sets it) makes compiler warnings errors; the default is OFF, so
# that a newer compiler's new warnings do not stop a user's build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DJOULE_BUILD_TESTS=ON \
  -DJOULE_WERROR="${JOULE_WERROR:-OFF}"
cmake --build build -j2
ctest --test-dir build -LE gpu --output-on-failure -j "${CTEST_PARALLEL_LEVEL:-2}"
