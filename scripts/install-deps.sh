#!/usr/bin/env bash
# Installs the Debian 12 packages Joule needs. Idempotent: packages already present are
# left alone. Run as root or with sudo.
#
#   bash scripts/install-deps.sh                 everything: build, tests, demo, benchmarks,
#                                                deploy checks (the README's commands)
#   bash scripts/install-deps.sh --build         what compiling Joule needs (an image's
#                                                build stage)
#   bash scripts/install-deps.sh --runtime --coordinator | --worker
#                                                the shared libraries (and data) one program
#                                                needs to run (an image's runtime stage)
#   --cuda (with --build or --runtime --worker)  without Debian's CPU-only LibTorch: a CUDA
#                                                LibTorch comes from PyTorch's archive
#                                                (docker/Dockerfile.worker-cuda)
set -euo pipefail

# Compiling: the toolchain and every library's development package.
build=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libtorch-dev libgloo-dev prometheus-cpp-dev libspdlog-dev libfmt-dev
  libsqlite3-dev libpq-dev libcli11-dev libabsl-dev zlib1g-dev
  nlohmann-json3-dev libyaml-cpp-dev libcpp-httplib-dev libssl-dev libbrotli-dev
  libcsv-dev libzip-dev libjpeg-dev libpng-dev libhdf5-dev
)
# Running joule-coordinator and joule (the libraries they link; `ldd` of each, mapped
# with `dpkg -S`), plus curl for the images' healthcheck and openssl for certificates.
runtime_coordinator=(
  ca-certificates curl openssl
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 libre2-9 libc-ares2
  libspdlog1.10 libfmt9 libsqlite3-0 libpq5 libyaml-cpp0.7 libcpp-httplib0.11 libssl3 libbrotli1
  zlib1g libprometheus-cpp-core1.0 libzip4
)
# Running joule-worker: the coordinator's libraries, LibTorch, Gloo, libcsv, libjpeg-turbo,
# libpng, libhdf5, an OpenBLAS
# and the Fashion-MNIST dataset.
runtime_worker=(
  "${runtime_coordinator[@]}"
  libtorch1.13 libgloo0 libcsv3 libopenblas0-pthread dataset-fashion-mnist
  libjpeg62-turbo libpng16-16 libhdf5-103-1
)
# Tests, the demo, benchmarks, the deploy checks, and the HTML reports' browser checks.
dev=(
  libgtest-dev libgmock-dev curl openssl
  dataset-fashion-mnist libopenblas0-pthread
  python3 python3-torch python3-numpy
  prometheus postgresql
  iproute2 iptables
  podman buildah runc mmdebstrap podman-compose uidmap
  yamllint shellcheck
  chromium python3-pil fonts-dejavu-core
)

mode=all
program=""
cuda=0
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    --build) mode=build ;;
    --runtime) mode=runtime ;;
    --coordinator) program=coordinator ;;
    --worker) program=worker ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

case "$mode" in
  all) packages=("${build[@]}" "${dev[@]}") ;;
  build) packages=("${build[@]}") ;;
  runtime)
    case "$program" in
      coordinator) packages=("${runtime_coordinator[@]}") ;;
      worker) packages=("${runtime_worker[@]}") ;;
      *) echo "install-deps: --runtime needs --coordinator or --worker" >&2; exit 2 ;;
    esac ;;
esac

if [[ $cuda == 1 ]]; then
  kept=()
  for p in "${packages[@]}"; do
    [[ $p == libtorch-dev || $p == libtorch1.13 ]] || kept+=("$p")
  done
  packages=("${kept[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
