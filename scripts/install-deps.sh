#!/usr/bin/env bash
# Installs every Debian 12 package that Joule's build, tests, demo and benchmarks need.
# Idempotent: packages already present are left alone. Run as root or with sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libtorch-dev libgloo-dev prometheus-cpp-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libsqlite3-dev libcli11-dev libabsl-dev zlib1g-dev
  nlohmann-json3-dev libyaml-cpp-dev libcpp-httplib-dev libssl-dev libbrotli-dev curl openssl
  libcsv-dev
  dataset-fashion-mnist libopenblas0-pthread
  python3 python3-torch python3-numpy
  prometheus
  iproute2 iptables
)

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
