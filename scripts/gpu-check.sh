#!/usr/bin/env bash
# The GPU check in one go, for a machine with an NVIDIA GPU, the CUDA toolkit (nvcc), CMake,
# ninja, a C++ compiler and PyTorch (CUDA build) in python3, whose wheel carries LibTorch
# (torch.utils.cmake_prefix_path) and whose nvidia-nccl wheel carries libnccl.so.2 and
# nccl.h, and nothing else Joule needs (the device machine of README "GPU builds").
#
#   bash scripts/gpu-check.sh --fetch   here, with apt: downloads the Debian 12 packages of
#                                       scripts/gpu-packages.txt into .gpu-carry/debs and
#                                       Fashion-MNIST into .gpu-carry/fashion-mnist (~57 MiB);
#                                       both are validated (every listed package once, each
#                                       .deb complete; the dataset's four files whole) and
#                                       made again when not (scripts/lib/cache.sh)
#   bash scripts/gpu-check.sh           there, as root or not: every step below
#   bash scripts/gpu-check.sh --dry     here, without a GPU: fetch, unpack, probe, configure
#
# Steps, each announced, the first broken one ends the script with its name and exit 1:
#   probe      what the machine has: compiler, glibc, CUDA, torch and its LibTorch, NCCL;
#              and whether torch's libraries export Gloo or protobuf symbols that would
#              clash with Debian's (reported as CLASH lines)
#   unpack     dpkg -x of every carried .deb into $PREFIX (never onto /), CMake and pkg-config
#              files rewritten to point into it; checks that every library in it finds each
#              library it needs in the prefix or in a base every glibc system has
#   configure  against the prefix (CMAKE_IGNORE_PREFIX_PATH keeps /usr out, so a missing
#              package fails here, not on the device), torch's LibTorch (in --dry: Debian's,
#              if python3 has no torch) and the NCCL wheel (in --dry: the CUDA toolkit's)
#   build      all targets, all cores                                  (skipped in --dry)
#   gpu-tests  ctest -L gpu                                            (skipped in --dry)
#   job        a one-worker GPU job: cnn on Fashion-MNIST, its accuracy (skipped in --dry)
#   speed      resnet50 on synthetic 3x224x224 images, one GPU worker: Joule's steady
#              images/s (from its /metrics) against PyTorch eager on the same GPU, same batch
#              (bench/gpu_reference.py: fp32, channels-last, bf16 autocast) (skipped in --dry)
#   accuracy   resnet18 on Fashion-MNIST, one GPU worker, 2 epochs    (skipped in --dry)
#   energy     Joule's meter on NVML (counter, and the power fallback) against pynvml's
#              counter and nvidia-smi's power over the same window (bench/gpu_energy.py)
#                                                                     (skipped in --dry)
# Probe to build stop the script at the first failure; the steps after the build each run
# whatever the others did, and the script fails at the end naming those that failed.
# Results: one line per step in $RESULTS (default build-gpu/gpu-check-results.txt).
#
# Environment: PREFIX (default /tmp/joule-prefix), BUILD_DIR (default build-gpu), CARRY
# (default .gpu-carry), RESULTS.
# -E: the ERR trap also inside functions (the steps), so every failure names its step.
set -eEuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# shellcheck source=scripts/lib/cache.sh
source scripts/lib/cache.sh
mode=device
case "${1:-}" in
  --dry) mode=dry ;;
  --fetch) mode=fetch ;;
  "") ;;
  *) echo "usage: $0 [--dry|--fetch]" >&2; exit 2 ;;
esac
CARRY=${CARRY:-$ROOT/.gpu-carry}
PREFIX=${PREFIX:-/tmp/joule-prefix}
BUILD_DIR=${BUILD_DIR:-$ROOT/build-gpu}
[[ $mode == dry ]] && BUILD_DIR=${BUILD_DIR%/}-dry
RESULTS=${RESULTS:-$BUILD_DIR/gpu-check-results.txt}
# The environment's own library path (the driver's libraries, in some images): python3 and
# torch run with it, Joule's binaries with the prefix's libraries before it.
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
mkdir -p "$BUILD_DIR"
: >"$RESULTS"
step=start
fail() {
  echo "gpu-check: FAILED at step '$step': $*" >&2
  echo "$step FAILED: $*" >>"$RESULTS"
  exit 1
}
trap 'fail "command failed (line $LINENO)"' ERR
begin() { step=$1; echo; echo "=== gpu-check: $step ==="; }
ok() { echo "$step ok${1:+: $1}" | tee -a "$RESULTS"; }
skip() { echo "$step skipped: $1" | tee -a "$RESULTS"; }
multiarch=x86_64-linux-gnu

# --- fetch (on the CPU machine: needs apt and the network) ---
fetch() {
  begin fetch
  local pkgs p n
  pkgs=$(sed 's/#.*//' scripts/gpu-packages.txt | tr -s ' \n' ' ')
  # The carried packages: valid when every listed package has exactly one complete .deb
  # and nothing else is there (a list that changed, a download cut short, a stray file).
  carry_debs_valid() {
    local d=$1 p n
    [[ -d $d ]] || return 1
    for p in $pkgs; do
      n=0
      for f in "$d/${p}"_*.deb; do
        [[ -e $f ]] || continue
        cache_valid_deb "$f" "$p" || return 1
        n=$((n + 1))
      done
      [[ $n == 1 ]] || return 1
    done
    [[ $(find "$d" -mindepth 1 | wc -l) == $(wc -w <<<"$pkgs") ]]
  }
  if carry_debs_valid "$CARRY/debs"; then
    echo "fetch: $CARRY/debs is complete and valid: kept"
  else
    [[ -d $CARRY/debs ]] && echo "fetch: $CARRY/debs is incomplete or invalid: downloading again"
    rm -rf "$CARRY/debs.partial"
    mkdir -p "$CARRY/debs.partial"
    # shellcheck disable=SC2086
    (cd "$CARRY/debs.partial" && apt-get download $pkgs >/dev/null 2>&1) ||
      fail "apt-get download failed (apt-get update first?)"
    carry_debs_valid "$CARRY/debs.partial" ||
      fail "apt-get download gave an incomplete or invalid set of packages in $CARRY/debs.partial"
    rm -rf "$CARRY/debs"
    mv "$CARRY/debs.partial" "$CARRY/debs"
  fi
  if [[ -e $CARRY/fashion-mnist ]] && ! cache_valid_fashion_mnist "$CARRY/fashion-mnist"; then
    echo "fetch: $CARRY/fashion-mnist is incomplete or corrupt: copying it again"
    rm -rf "$CARRY/fashion-mnist"
  fi
  if [[ ! -e $CARRY/fashion-mnist ]]; then
    local ds=/usr/share/datasets/fashion-mnist
    rm -rf "$CARRY/ds" "$CARRY/fashion-mnist.partial"
    if ! cache_valid_fashion_mnist "$ds"; then
      (cd "$CARRY" && apt-get download dataset-fashion-mnist >/dev/null 2>&1 &&
        dpkg -x dataset-fashion-mnist_*.deb ds && rm dataset-fashion-mnist_*.deb) ||
        fail "cannot get dataset-fashion-mnist"
      ds=$CARRY/ds/usr/share/datasets/fashion-mnist
    fi
    mkdir -p "$CARRY/fashion-mnist.partial"
    cp "$ds"/*.gz "$CARRY/fashion-mnist.partial/"
    rm -rf "$CARRY/ds"
    cache_valid_fashion_mnist "$CARRY/fashion-mnist.partial" ||
      fail "the Fashion-MNIST copied from $ds is not the whole dataset"
    mv "$CARRY/fashion-mnist.partial" "$CARRY/fashion-mnist"
  fi
  # The device machine takes a working tree of at most 64 MiB: the tracked and untracked
  # (not ignored) files plus the carry. Checked here, where a fix is possible, with 128 KiB
  # to spare for files written before the call (the device tool refuses a larger tree
  # itself). The margin is thin: Debian's updates grow the packages (2026-12-05: 61.9 MB
  # carried, 4.7 MB of tree, 4 KB over the 512 KiB this spared before).
  local tree carry_bytes limit=$((64 * 1024 * 1024 - 128 * 1024))
  # (A file deleted but not staged is listed and cannot be stat'ed: counted as nothing.)
  tree=$({ git ls-files -z --cached --others --exclude-standard 2>/dev/null |
    xargs -0r stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
  carry_bytes=$(find "$CARRY" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  if ((tree + carry_bytes > limit)); then
    fail "the carry ($((carry_bytes / 1048576)) MiB) and the tree ($((tree / 1048576)) MiB) pass the device's 64 MiB less 128 KiB; carry fewer packages (scripts/gpu-packages.txt)"
  fi
  ok "$(ls "$CARRY/debs" | wc -l) packages, $(du -sm "$CARRY" | cut -f1) MiB in $CARRY; with the tree $(((tree + carry_bytes) / 1048576)) MiB of the device's 64"
}

# --- a fresh prefix: packages unpacked by an earlier run (a list since shortened) must not
# satisfy the completeness check or CMake. Only a prefix this script made is removed. ---
fresh_prefix() {
  step=prefix
  [[ $PREFIX != / && -n $PREFIX ]] || fail "PREFIX must not be /"
  # Made by this script: its marker, or (before the marker existed) only what dpkg -x of the
  # carried packages and the NCCL links make.
  local e
  if [[ -e $PREFIX && ! -e $PREFIX/.joule-gpu-prefix ]]; then
    for e in "$PREFIX"/* "$PREFIX"/.[!.]*; do
      [[ -e $e || -L $e ]] || continue
      [[ $(basename "$e") =~ ^(usr|etc|lib|lib64|bin|sbin|nccl)$ ]] ||
        fail "$PREFIX holds $(basename "$e") and was not made by gpu-check.sh: remove it or set PREFIX"
    done
  fi
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  touch "$PREFIX/.joule-gpu-prefix"
}

# --- probe ---
probe() {
  begin probe
  CXX=$(command -v g++ || command -v c++ || true)
  [[ -n $CXX ]] || fail "no C++ compiler (g++ or c++) on PATH"
  echo "compiler: $CXX: $($CXX --version | head -1)"
  echo "glibc: $(ldd --version | head -1)"
  command -v cmake >/dev/null || fail "no cmake"
  command -v ninja >/dev/null || fail "no ninja"
  echo "cmake: $(cmake --version | head -1); ninja $(ninja --version)"
  CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
  [[ -x $CUDA_ROOT/bin/nvcc ]] || fail "no nvcc under $CUDA_ROOT (set CUDA_ROOT)"
  echo "cuda: $("$CUDA_ROOT/bin/nvcc" --version | tail -1)"
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
  if [[ -n $TORCH_PREFIX ]]; then
    TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch.compiled_with_cxx11_abi())')"
    python3 -c 'import sys, torch; sys.exit(0 if torch.compiled_with_cxx11_abi() else 1)' ||
      fail "torch's LibTorch uses the old C++ ABI; Debian's libraries use the new one"
    Torch_DIR=$TORCH_PREFIX/Torch
  elif [[ $mode == dry && -d /usr/lib/$multiarch/cmake/Torch ]]; then
    Torch_DIR=/usr/lib/$multiarch/cmake/Torch
    TORCH_LIB=/usr/lib/$multiarch
    echo "torch: python3 has none; --dry stands in Debian's LibTorch ($Torch_DIR)"
  else
    fail "python3 has no torch (import torch failed)"
  fi
  NCCL_HOME=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null || true)
  if [[ -z $NCCL_HOME || ! -f $NCCL_HOME/include/nccl.h ]]; then
    if [[ $mode == dry && -f $CUDA_ROOT/include/nccl.h ]]; then
      NCCL_HOME=$CUDA_ROOT
      echo "nccl: no nvidia-nccl wheel; --dry uses the CUDA toolkit's ($NCCL_HOME)"
    else
      fail "no NCCL: the nvidia-nccl wheel (python3 -c 'import nvidia.nccl') has no include/nccl.h"
    fi
  fi
  # The wheel ships libnccl.so.2 only; CMake's find_library wants libnccl.so.
  if [[ ! -e $NCCL_HOME/lib/libnccl.so && -e $NCCL_HOME/lib/libnccl.so.2 ]]; then
    mkdir -p "$PREFIX/nccl"
    ln -sfn "$NCCL_HOME/include" "$PREFIX/nccl/include"
    mkdir -p "$PREFIX/nccl/lib"
    ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$PREFIX/nccl/lib/libnccl.so.2"
    ln -sf libnccl.so.2 "$PREFIX/nccl/lib/libnccl.so"
    NCCL_HOME=$PREFIX/nccl
  fi
  echo "nccl: $NCCL_HOME ($(grep -m1 -E '#define NCCL_(MAJOR|VERSION_CODE)' "$NCCL_HOME/include/nccl.h" || true))"
  # Torch's own copies of Gloo and protobuf: exported symbols would interpose on Debian's.
  local clash=""
  for lib in "$TORCH_LIB"/libtorch_cpu.so "$TORCH_LIB"/libtorch.so; do
    [[ -f $lib ]] || continue
    local g p
    g=$(nm -D --defined-only "$lib" 2>/dev/null | grep -c '_ZN4gloo' || true)
    p=$(nm -D --defined-only "$lib" 2>/dev/null | grep -c '_ZN6google8protobuf' || true)
    echo "$(basename "$lib"): exports $g gloo:: and $p google::protobuf:: symbols"
    [[ $g -gt 0 ]] && clash+=" gloo($g in $(basename "$lib"))"
    [[ $p -gt 0 ]] && clash+=" protobuf($p in $(basename "$lib"))"
  done
  if [[ -n $clash ]]; then
    echo "CLASH: torch exports$clash; Joule also links Debian's libgloo/libprotobuf: the" \
      "first definition loaded wins; the gloo and gpu tests below show whether it matters"
    echo "probe CLASH:$clash" >>"$RESULTS"
  fi
  ok "compiler $($CXX -dumpfullversion), torch at $Torch_DIR, nccl at $NCCL_HOME"
}

# --- unpack ---
unpack() {
  begin unpack
  local debs=("$CARRY"/debs/*.deb)
  [[ -f ${debs[0]} ]] || fail "no .deb files in $CARRY/debs (run --fetch on a machine with apt)"
  [[ $PREFIX != / && -n $PREFIX ]] || fail "PREFIX must not be /"
  mkdir -p "$PREFIX"
  for d in "${debs[@]}"; do
    cache_valid_deb "$d" || fail "$d is not a complete Debian package (run --fetch again)"
    dpkg -x "$d" "$PREFIX" || fail "dpkg -x $d"
  done
  # Absolute paths the packages were built with now live under $PREFIX.
  grep -rlZ --include='*.cmake' -e '"/usr/' -e ' /usr/' -e ';/usr/' "$PREFIX/usr" |
    xargs -0r sed -i -E "s#([\" ;])/usr/#\1$PREFIX/usr/#g"
  # Joule links prometheus-cpp's pull library only; its push library's libcurl is not carried,
  # so the config must not look for it.
  sed -i -E 's/^([[:space:]]*)find_dependency\(CURL\)/\1# find_dependency(CURL): not carried (gpu-check.sh)/' \
    "$PREFIX"/usr/lib/$multiarch/cmake/prometheus-cpp/prometheus-cpp-config.cmake
  find "$PREFIX/usr" -name '*.pc' -print0 |
    xargs -0r sed -i -E "s#^prefix=/usr#prefix=$PREFIX/usr#"
  # Absolute symbolic links (e.g. lib -> /usr/lib/...) are re-pointed into the prefix.
  while IFS= read -r -d '' link; do
    local target
    target=$(readlink "$link")
    [[ $target == /* && $target != "$PREFIX"* ]] && ln -sfn "$PREFIX$target" "$link"
  done < <(find "$PREFIX" -path "$PREFIX/nccl" -prune -o -type l -print0)
  curl_stub
  LIBDIRS=$PREFIX/usr/lib/$multiarch:$PREFIX/usr/lib
  # Completeness: every shared object and program in the prefix finds what it needs in the
  # prefix or in the base (glibc, libstdc++, libgcc, and what the device already has).
  local base='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|libresolv|libz|libcrypt|libutil)\.so'
  local have missing=""
  have=$(find "$PREFIX" \( -type f -o -type l \) -name '*.so*' -printf '%f\n' | sort -u)
  while IFS= read -r -d '' f; do
    file -b "$f" | grep -q '^ELF' || continue
    # prometheus-cpp's push library needs libcurl, which is not carried: Joule links pull only.
    [[ $(basename "$f") =~ ^libprometheus-cpp-push ]] && continue
    for need in $(objdump -p "$f" 2>/dev/null | awk '/NEEDED/ {print $2}'); do
      [[ $need =~ $base ]] && continue
      grep -qxF "$need" <<<"$have" || missing+=" $need(by $(basename "$f"))"
    done
  done < <(find "$PREFIX/usr/lib" "$PREFIX/usr/bin" -type f \( -name '*.so*' -o -perm -u+x \) -print0)
  [[ -z $missing ]] || fail "libraries the prefix lacks:$missing"
  ok "$(ls "${debs[@]}" | wc -l) packages into $PREFIX, every NEEDED library present"
}

# libhdf5 links libcurl for its read-only S3 driver (ROS3), which Joule never uses (hdf5:
# datasets are local files). libcurl and its own libraries (SSH, LDAP, ...) are not on every
# machine, so a stub libcurl.so.4 stands in: each curl function libhdf5 imports, under the
# symbol version it imports, returning 0 (CURLE_OK, or NULL for a handle: S3 would fail).
curl_stub() {
  local lib=$PREFIX/usr/lib/$multiarch hdf5 syms version
  hdf5=$(find "$lib" -maxdepth 1 -name 'libhdf5_serial.so.*' -type f -print -quit)
  [[ -n $hdf5 ]] || fail "no libhdf5_serial in $lib"
  syms=$(nm -D --undefined-only "$hdf5" | awk '$2 ~ /^curl_/ {split($2, a, "@"); print a[1]}' | sort -u)
  version=$(nm -D --undefined-only "$hdf5" | awk '$2 ~ /^curl_.*@/ {split($2, a, "@"); v = a[2]} END {print v}')
  [[ -n $syms ]] || return 0
  local src=$PREFIX/curl-stub
  mkdir -p "$src"
  for s in $syms; do echo "long $s(void) { return 0; }"; done >"$src/curl_stub.c"
  { echo "${version:-CURL_STUB} {"; echo "  global:"; for s in $syms; do echo "    $s;"; done
    echo "  local: *;"; echo "};"; } >"$src/curl_stub.map"
  rm -f "$lib"/libcurl.so*
  "$CXX" -shared -fPIC -O1 -o "$lib/libcurl.so.4" -Wl,-soname,libcurl.so.4 \
    -Wl,--version-script,"$src/curl_stub.map" -x c "$src/curl_stub.c" ||
    fail "cannot build the libcurl stub"
  echo "unpack: libcurl.so.4 is a stub of $(wc -w <<<"$syms") functions ($version) for libhdf5"
}

# --- configure ---
configure() {
  begin configure
  export PATH=$PREFIX/usr/bin:$PATH
  export PKG_CONFIG_LIBDIR=$PREFIX/usr/lib/$multiarch/pkgconfig:$PREFIX/usr/share/pkgconfig:$PREFIX/usr/lib/pkgconfig
  export NCCL_HOME
  local args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DJOULE_BUILD_TESTS=ON
    -DJOULE_WITH_CUDA=ON -DCUDAToolkit_ROOT="$CUDA_ROOT" -DCMAKE_CXX_COMPILER="$CXX"
    -DCMAKE_PREFIX_PATH="$PREFIX/usr;$PREFIX/usr/lib/$multiarch/cmake;$PREFIX/usr/share/cmake"
    -DTorch_DIR="$Torch_DIR"
    -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf"
    -DLIBDL_INCLUDE_DIRS=/usr/include -DLIBDL_LIBRARIES=dl  # libc6-dev: the base, not carried
    -DLIBRT_INCLUDE_DIRS=/usr/include -DLIBRT_LIBRARIES=rt
    # -L: gRPC's config names re2 as a bare -lre2 (with -L/usr/lib/...), found in the prefix.
    -DCMAKE_EXE_LINKER_FLAGS="-L$PREFIX/usr/lib/$multiarch -Wl,-rpath-link,$PREFIX/usr/lib/$multiarch"
    -DCMAKE_SHARED_LINKER_FLAGS="-L$PREFIX/usr/lib/$multiarch -Wl,-rpath-link,$PREFIX/usr/lib/$multiarch")
  [[ $mode == dry ]] && args+=(-DJOULE_WERROR=ON)
  # Debian's LibTorch (the --dry stand-in) finds its own dependencies (gflags, glog, ...)
  # in /usr, so /usr stays searchable then; the check of the cache below still fails on any
  # of Joule's dependencies found outside the prefix.
  [[ $Torch_DIR == /usr/* ]] || args+=(-DCMAKE_IGNORE_PREFIX_PATH="/usr;/usr/local;/")
  cmake "${args[@]}" >"$BUILD_DIR/configure.log" 2>&1 ||
    { tail -40 "$BUILD_DIR/configure.log" >&2; fail "cmake configure (log: $BUILD_DIR/configure.log)"; }
  grep -q '^JOULE_WITH_CUDA:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" || fail "JOULE_WITH_CUDA is not ON"
  # Every dependency but Torch (and what Torch's config pulls in), CUDA and NCCL must come
  # from the prefix.
  local stray
  stray=$(grep -E '^[A-Za-z0-9_.+-]+_(DIR|INCLUDE_DIR|INCLUDE_DIRS|LIBRARY|LIBRARY_RELEASE|EXECUTABLE):(PATH|FILEPATH)=/' "$BUILD_DIR/CMakeCache.txt" |
    grep -vE "=$PREFIX|=$Torch_DIR|=${CUDA_ROOT}|^(Torch|Caffe2|ATen|CUDA|CUDAToolkit|MKL|kineto|gflags|glog|GFLAGS|GLOG|Unwind|LIBDL|LIBRT|Python|JOULE_NCCL|pthread|C10|c10|TORCH|torch|CMAKE|PKG_CONFIG|GIT)[A-Za-z0-9_]*:" || true)
  [[ -z $stray ]] || fail "found outside the prefix: $stray"
  ok "$(grep -E '^(gRPC|absl|Gloo|spdlog|prometheus-cpp|yaml-cpp|CLI11|nlohmann_json)_DIR' "$BUILD_DIR/CMakeCache.txt" | wc -l) config packages from the prefix; NCCL $(grep '^JOULE_NCCL_LIBRARY' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2)"
}

# --- build, tests, checks (device only) ---
# Every target that compiles is built (ninja -k 0): on a device call, the checks whose
# programs built still run after another target failed, and the log names every error.
build() {
  begin build
  if ! LD_LIBRARY_PATH=$LIBDIRS${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH} \
    cmake --build "$BUILD_DIR" -j"$(nproc)" -- -k 0 >"$BUILD_DIR/build.log" 2>&1; then
    grep -m40 -E 'error|FAILED' "$BUILD_DIR/build.log" >&2 || true
    [[ $mode == device ]] || fail "build (log: $BUILD_DIR/build.log)"
    echo "build FAILED: $(grep -c '^FAILED' "$BUILD_DIR/build.log") targets (log: $BUILD_DIR/build.log); the checks run with what built" |
      tee -a "$RESULTS"
    BUILD_FAILED=1
    return 0
  fi
  ok "in $SECONDS s since start"
}

gpu_tests() {
  begin gpu-tests
  # The GPU trainer tests read Fashion-MNIST: the carried copy.
  JOULE_TEST_DATA_ROOT=$CARRY ctest --test-dir "$BUILD_DIR" -L '^gpu$' --output-on-failure --timeout 300 2>&1 |
    tee "$BUILD_DIR/gpu-tests.log" || fail "ctest -L gpu (log: $BUILD_DIR/gpu-tests.log)"
  grep -q 'tests passed' "$BUILD_DIR/gpu-tests.log" || fail "no gpu tests ran"
  # A skip is not a pass on a GPU machine.
  ! grep -q 'Skipped\|\*\*\*Not Run' "$BUILD_DIR/gpu-tests.log" || fail "gpu tests skipped on a GPU machine"
  ok "$(grep -Eo '[0-9]+ tests passed|[0-9]+% tests passed.*' "$BUILD_DIR/gpu-tests.log" | tail -1)"
}

# Joule's binaries: the prefix's libraries, torch's and NCCL's before the environment's own.
joule_env() {
  export LD_LIBRARY_PATH=$LIBDIRS:$TORCH_LIB:$NCCL_HOME/lib${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH}
}
# python3 with torch: the environment's own library path, not the prefix's.
py() { LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH python3 "$@"; }

# A local cluster (a coordinator and one CPU worker) plus one `--device-kind gpu` worker
# serving /metrics on 127.0.0.1:$GPU_METRICS_PORT, all ended when the step's subshell exits.
# Sets `joule` (the CLI) and exports JOULE_STATE_DIR (one per step).
GPU_METRICS_PORT=19477
gpu_cluster() {
  export JOULE_STATE_DIR=$BUILD_DIR/state-$step
  joule=$BUILD_DIR/bin/joule
  "$joule" cluster down >/dev/null 2>&1 || true
  "$joule" cluster up --workers 1 --data-root "$CARRY" || fail "cluster up"
  # The file's first line is the coordinator's gRPC address (the second its /metrics).
  "$BUILD_DIR/bin/joule-worker" --coordinator "$(head -1 "$JOULE_STATE_DIR/coordinator.addr")" \
    --device-kind gpu --host gpu-0 --insecure --checkpoint-root "$JOULE_STATE_DIR/gpu-ckpt" \
    --metrics-address "127.0.0.1:$GPU_METRICS_PORT" >"$BUILD_DIR/gpu-worker-$step.log" 2>&1 &
  # The step's end, however it ends: its background jobs (the worker, a /metrics scraper)
  # stopped, and the cluster.
  # shellcheck disable=SC2064
  trap "trap - ERR; touch '$BUILD_DIR/$step.done'; kill \$(jobs -p) 2>/dev/null || true; '$joule' cluster down >/dev/null 2>&1 || true" EXIT
}

job() {
  begin job
  local data=$CARRY/fashion-mnist
  cache_valid_fashion_mnist "$data" || fail "no complete Fashion-MNIST in $data (run --fetch)"
  gpu_cluster
  local id
  id=$("$joule" submit --name gpu-cnn --model cnn --dataset "idx:$data" --device gpu \
    --workers 1 --global-batch-size 128 --epochs 2 --lr 0.05 --momentum 0.9) || fail "submit"
  "$joule" watch "$id" | tee "$BUILD_DIR/job.log" || fail "job $id did not succeed (worker log: $BUILD_DIR/gpu-worker-job.log)"
  "$joule" report "$id" | tee -a "$BUILD_DIR/job.log"
  grep -qi 'cuda\|nccl' "$BUILD_DIR/gpu-worker-job.log" || fail "the worker log names neither CUDA nor NCCL"
  ok "job $id: $(grep -Eo 'final test accuracy: [0-9.]+' "$BUILD_DIR/job.log" | tail -1)"
}

# Joule's steady training rate from the GPU worker's /metrics: joule_samples_total polled
# every 0.25 s until $1 exists, the rate taken between 20% and 90% of the final count (the
# first steps' CUDA and cuDNN set-up and the evaluation left out). Prints images/s.
steady_rate() {
  py - "$1" "http://127.0.0.1:$GPU_METRICS_PORT/metrics" <<'PYEOF'
import os, sys, time, urllib.request
done_file, url = sys.argv[1], sys.argv[2]
points = []
while not os.path.exists(done_file):
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
        n = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                if l.startswith("joule_samples_total"))
        points.append((time.monotonic(), n))
    except OSError:
        pass
    time.sleep(0.25)
final = max((p[1] for p in points), default=0)
win = [p for p in points if 0.2 * final <= p[1] <= 0.9 * final]
if final == 0 or len(win) < 2 or win[-1][1] == win[0][1]:
    sys.exit("steady_rate: too few /metrics readings while the job trained")
print(f"{(win[-1][1] - win[0][1]) / (win[-1][0] - win[0][0]):.1f}")
PYEOF
}

speed() {
  begin speed
  gpu_cluster
  local batch=128 n id rate
  n=$((batch * 40))
  rm -f "$BUILD_DIR/speed.done"
  steady_rate "$BUILD_DIR/speed.done" >"$BUILD_DIR/speed.rate" &
  local scraper=$!
  id=$("$joule" submit --name gpu-resnet50 --model resnet50 \
    --dataset "synthetic:3x224x224:1000:$n" --device gpu --workers 1 \
    --global-batch-size "$batch" --epochs 1 --lr 0.1 --momentum 0.9) || fail "submit"
  "$joule" watch "$id" >"$BUILD_DIR/speed-job.log" 2>&1 || { touch "$BUILD_DIR/speed.done"; fail "resnet50 job $id did not succeed (log: $BUILD_DIR/gpu-worker-speed.log)"; }
  touch "$BUILD_DIR/speed.done"
  wait "$scraper" || fail "no steady rate from the worker's /metrics"
  rate=$(cat "$BUILD_DIR/speed.rate")
  "$joule" report "$id" >>"$BUILD_DIR/speed-job.log" 2>&1 || true
  "$joule" status "$id" -o json >"$BUILD_DIR/speed-job.json"
  echo "Joule resnet50 batch $batch: $rate images/s (steady, from /metrics)" | tee -a "$BUILD_DIR/speed.log"
  py bench/gpu_reference.py --model resnet50 --batch "$batch" --steps 30 --warmup 10 |
    tee -a "$BUILD_DIR/speed.log" || fail "bench/gpu_reference.py"
  local summary
  summary=$(py - "$rate" "$BUILD_DIR/speed.log" "$BUILD_DIR/speed-job.json" <<'PYEOF'
import json, sys
rate = float(sys.argv[1])
ref = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
job = json.loads(open(sys.argv[3]).read())
r = job.get("result", {})
e = r.get("energy", {})
parts = [f"Joule {rate:.0f} img/s ({r.get('samplesPerSecond', r.get('samples_per_second', 0)):.0f} over the whole run)"]
for mode, m in ref["modes"].items():
    parts.append(f"PyTorch {mode} {m['images_per_second']:.0f} ({rate / m['images_per_second']:.2f}x)")
parts.append(f"job energy {e.get('totalJoules', e.get('total_joules', 0)):.0f} J")
print("; ".join(parts))
PYEOF
  ) || fail "summary"
  ok "resnet50 batch $batch on $(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader): $summary"
}

accuracy() {
  begin accuracy
  local data=$CARRY/fashion-mnist id
  cache_valid_fashion_mnist "$data" || fail "no complete Fashion-MNIST in $data (run --fetch)"
  gpu_cluster
  id=$("$joule" submit --name gpu-resnet18 --model resnet18 --dataset "idx:$data" --device gpu \
    --workers 1 --global-batch-size 128 --epochs 2 --lr 0.05 --momentum 0.9 --seed 1) ||
    fail "submit"
  "$joule" watch "$id" >"$BUILD_DIR/accuracy.log" 2>&1 || fail "resnet18 job $id did not succeed"
  "$joule" report "$id" >>"$BUILD_DIR/accuracy.log" 2>&1 || true
  ok "resnet18 on Fashion-MNIST, 2 epochs: $(grep -Eo 'test accuracy [0-9.]+' "$BUILD_DIR/accuracy.log" | tail -1); $(grep -Eo 'train [0-9.]+ s \([0-9]+ samples/s\)' "$BUILD_DIR/accuracy.log" | tail -1)"
}

energy() {
  begin energy
  py bench/gpu_energy.py --bench "$BUILD_DIR/bin/joule-bench-nvml" --ld-library-path "$LD_LIBRARY_PATH" \
    --seconds 10 2>&1 | tee "$BUILD_DIR/energy.log" || fail "energy comparison (log: $BUILD_DIR/energy.log)"
  ok "$(grep -E '^(Joule|nvidia-smi|window)' "$BUILD_DIR/energy.log" | tr -s ' ' | paste -sd';' -)"
}

if [[ $mode == fetch ]]; then fetch; exit 0; fi
if [[ $mode == dry ]]; then
  command -v apt-get >/dev/null && fetch
  fresh_prefix
  probe
  unpack
  configure
  for s in build gpu-tests job speed accuracy energy; do step=$s; skip "--dry (no GPU build or run)"; done
  echo; echo "gpu-check --dry: every step without a GPU passed; results in $RESULTS"
  exit 0
fi
nvidia-smi -L || { step=probe; fail "no NVIDIA driver or GPU here"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,pci.bus_id --format=csv || true
fresh_prefix
probe
unpack
configure
build
# Each check after the build runs whatever the others did: one device call learns them all.
failed=""
for s in job speed gpu_tests accuracy energy; do
  # The subshell's failure must not end this shell: neither errexit nor the ERR trap here.
  trap - ERR
  set +e
  (
    set -eE
    trap 'fail "command failed (line $LINENO)"' ERR
    joule_env
    "$s"
  )
  rc=$?
  set -e
  trap 'fail "command failed (line $LINENO)"' ERR
  [[ $rc == 0 ]] || failed+=" $s"
done
[[ -n ${BUILD_FAILED:-} ]] && failed=" build$failed"
[[ -z $failed ]] || { echo; echo "gpu-check: FAILED:$failed; results in $RESULTS" >&2; exit 1; }
echo; echo "gpu-check: all steps passed; results in $RESULTS"
