#!/usr/bin/env bash
# The GPU checks in one go, for a machine with NVIDIA GPUs, the CUDA toolkit and NCCL
# (and Joule's build dependencies: scripts/install-deps.sh):
#   - configures and builds with JOULE_WITH_CUDA (the NCCL process group),
#   - runs the `gpu`-labelled tests (NCCL allreduce of known buffers; GPU training, which
#     needs a CUDA LibTorch: pass its path as LIBTORCH=/opt/libtorch),
#   - runs the allreduce microbenchmark on NCCL (rank r on GPU r).
#
#   bash scripts/gpu-check.sh [BUILD_DIR]      (default build-gpu)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-build-gpu}"
nvidia-smi -L || { echo "gpu-check: no NVIDIA driver or GPU here" >&2; exit 2; }
args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJOULE_WITH_CUDA=ON)
[[ -d /usr/local/cuda ]] && args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
[[ -n "${LIBTORCH:-}" ]] && args+=(-DCMAKE_PREFIX_PATH="$LIBTORCH")
cmake "${args[@]}"
grep -q "JOULE_NCCL_LIBRARY:FILEPATH=/" "$BUILD_DIR/CMakeCache.txt" ||
  { echo "gpu-check: CMake found no NCCL" >&2; exit 2; }
cmake --build "$BUILD_DIR" -j"$(nproc)" --target worker_nccl_process_group_test \
  worker_gpu_trainer_test joule-bench-collectives
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure
"$BUILD_DIR/bin/joule-bench-collectives" --transport nccl --ranks 8 --seconds 0.2
