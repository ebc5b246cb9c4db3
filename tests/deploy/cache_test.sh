#!/usr/bin/env bash
# The caches Joule's scripts keep, validated before use and rebuilt when invalid (issue 23:
# a fresh machine's `bash scripts/test.sh` failed on a base.tar that was a directory).
#
#   cache_test.sh validators   scripts/lib/cache.sh against the class of broken entries:
#                              directories, symlinks, empty, truncated and foreign files
#   cache_test.sh base-cold    scripts/build-images.sh --local-base --base-only from the
#                              cold path a fresh machine takes: an empty JOULE_IMAGE_CACHE
#                              (holding only the old bug's directory base.tar) and a base
#                              image that is absent; then a warm run keeps both, and an image
#                              of the same name from another tarball is imported again
#                              (root, podman, mmdebstrap, Debian's mirror; else exit 77)
#   cache_test.sh carry        scripts/gpu-check.sh --fetch into a carry with a truncated
#                              .deb, a stray one and a truncated dataset file: all made whole
#                              (apt and Debian's mirror; else exit 77)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
# shellcheck source=scripts/lib/cache.sh
source scripts/lib/cache.sh
mode=${1:?usage: cache_test.sh validators|base-cold|carry}
skip() { echo "cache_test $mode: SKIPPED: $*"; exit 77; }
fail() { echo "cache_test $mode: FAILED: $*" >&2; exit 1; }
scratch=$(mktemp -d)
cleanups=("rm -rf '$scratch'")
cleanup() { local c; for c in "${cleanups[@]}"; do eval "$c" || true; done; }
trap cleanup EXIT
checks=0
valid() { "$@" || fail "expected valid: $*"; checks=$((checks + 1)); }
invalid() { if "$@"; then fail "expected invalid: $*"; fi; checks=$((checks + 1)); }

validators() {
  # A Debian-like root file system, as a tarball the way mmdebstrap writes one (./ names).
  local root=$scratch/root
  mkdir -p "$root/etc" "$root/usr/bin"
  echo 12.8 >"$root/etc/debian_version"
  echo '#!/bin/sh' >"$root/usr/bin/true"
  head -c 300000 /dev/urandom >"$root/usr/bin/payload"   # a member to cut in the middle of
  tar -C "$root" -cf "$scratch/good.tar" .
  valid cache_valid_rootfs_tar "$scratch/good.tar"
  tar -C "$root" -czf "$scratch/good.tar.gz" etc usr   # no ./ prefix, compressed
  valid cache_valid_rootfs_tar "$scratch/good.tar.gz"
  mkdir -p "$scratch/dir.tar/etc"; cp "$root/etc/debian_version" "$scratch/dir.tar/etc/"
  invalid cache_valid_rootfs_tar "$scratch/dir.tar"          # what mmdebstrap wrote
  invalid cache_valid_rootfs_tar "$scratch/absent.tar"
  : >"$scratch/empty.tar"
  invalid cache_valid_rootfs_tar "$scratch/empty.tar"
  head -c 150000 "$scratch/good.tar" >"$scratch/truncated.tar"
  invalid cache_valid_rootfs_tar "$scratch/truncated.tar"
  head -c 100000 /dev/urandom >"$scratch/noise.tar"
  invalid cache_valid_rootfs_tar "$scratch/noise.tar"
  tar -C "$root" -cf "$scratch/no-debian.tar" usr
  invalid cache_valid_rootfs_tar "$scratch/no-debian.tar"
  ln -s "$scratch/good.tar" "$scratch/link.tar"
  invalid cache_valid_rootfs_tar "$scratch/link.tar"

  # Debian packages.
  local pkg=$scratch/pkg
  mkdir -p "$pkg/DEBIAN" "$pkg/usr/share/joule-cache-test"
  head -c 200000 /dev/urandom >"$pkg/usr/share/joule-cache-test/payload"
  printf 'Package: joule-cache-test\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: t\n' \
    >"$pkg/DEBIAN/control"
  dpkg-deb --build -Zgzip "$pkg" "$scratch/good.deb" >/dev/null
  valid cache_valid_deb "$scratch/good.deb"
  valid cache_valid_deb "$scratch/good.deb" joule-cache-test
  invalid cache_valid_deb "$scratch/good.deb" libother
  local size; size=$(stat -c %s "$scratch/good.deb")
  head -c $((size - 1000)) "$scratch/good.deb" >"$scratch/truncated.deb"
  invalid cache_valid_deb "$scratch/truncated.deb"
  head -c 1000 "$scratch/good.deb" >"$scratch/header-only.deb"
  invalid cache_valid_deb "$scratch/header-only.deb"
  invalid cache_valid_deb "$scratch/empty.tar"
  invalid cache_valid_deb "$scratch/noise.tar"
  invalid cache_valid_deb "$scratch/dir.tar"

  # gzip files and the dataset.
  head -c 300000 /dev/urandom | gzip >"$scratch/good.gz"
  valid cache_valid_gzip "$scratch/good.gz"
  head -c 100000 "$scratch/good.gz" >"$scratch/truncated.gz"
  invalid cache_valid_gzip "$scratch/truncated.gz"
  invalid cache_valid_gzip "$scratch/noise.tar"
  local ds=/usr/share/datasets/fashion-mnist
  if cache_valid_fashion_mnist "$ds"; then
    checks=$((checks + 1))
    cp -r "$ds" "$scratch/fm"
    valid cache_valid_fashion_mnist "$scratch/fm"
    cp "$scratch/fm/t10k-labels-idx1-ubyte.gz" "$scratch/labels.gz"
    head -c 3000 "$scratch/labels.gz" >"$scratch/fm/t10k-labels-idx1-ubyte.gz"
    invalid cache_valid_fashion_mnist "$scratch/fm"        # truncated
    gzip -dc "$scratch/labels.gz" | head -c 9000 | gzip >"$scratch/fm/t10k-labels-idx1-ubyte.gz"
    invalid cache_valid_fashion_mnist "$scratch/fm"        # whole gzip, too few labels
    rm "$scratch/fm/t10k-labels-idx1-ubyte.gz"
    invalid cache_valid_fashion_mnist "$scratch/fm"        # missing
  else
    echo "cache_test: no Fashion-MNIST in $ds (install-deps.sh installs it): its checks left out"
  fi
  invalid cache_valid_fashion_mnist "$scratch/absent"
}

base_cold() {
  [[ $(id -u) == 0 ]] || skip "needs root (rootful podman and mmdebstrap, as in CI)"
  command -v podman >/dev/null || skip "no podman (bash scripts/install-deps.sh installs it)"
  command -v mmdebstrap >/dev/null || skip "no mmdebstrap (bash scripts/install-deps.sh installs it)"
  export CONTAINERS_CONF="$repo/docker/containers.conf"
  podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"
  export JOULE_IMAGE_CACHE=$scratch/cache
  export JOULE_BASE_IMAGE="localhost/joule-base-cold-test:$$"
  cleanups+=("podman rmi -f '$JOULE_BASE_IMAGE' >/dev/null 2>&1")
  ! podman image exists "$JOULE_BASE_IMAGE" || fail "$JOULE_BASE_IMAGE exists before the test"
  mkdir -p "$JOULE_IMAGE_CACHE/base.tar/etc"   # the directory the old script left behind
  local out
  echo "cache_test: cold: an empty cache (but for a directory base.tar), no base image"
  out=$(bash scripts/build-images.sh --local-base --base-only 2>&1) || { echo "$out"; fail "cold run"; }
  echo "$out"
  grep -q 'not a complete Debian root file system: making it again' <<<"$out" || fail "the directory base.tar was not rejected"
  grep -q 'making a Debian 12 base with mmdebstrap' <<<"$out" || fail "no mmdebstrap run"
  grep -q "importing $JOULE_BASE_IMAGE .*the image was absent" <<<"$out" || fail "the absent image was not imported"
  grep -qE "base $JOULE_BASE_IMAGE: Debian 12\." <<<"$out" || fail "the base image does not run Debian 12"
  valid cache_valid_rootfs_tar "$JOULE_IMAGE_CACHE/base.tar"
  [[ ! -e $JOULE_IMAGE_CACHE/base.tar.partial ]] || fail "a .partial was left in the cache"

  echo "cache_test: warm: both kept"
  out=$(bash scripts/build-images.sh --local-base --base-only 2>&1) || { echo "$out"; fail "warm run"; }
  if grep -qE 'making|importing' <<<"$out"; then echo "$out"; fail "a valid cache was made again"; fi

  echo "cache_test: an image of the same name from another tarball is imported again"
  tar -C "$scratch" -cf "$scratch/other.tar" cache/base.tar --transform 's,.*,etc/debian_version,' 2>/dev/null ||
    { echo 0 >"$scratch/v"; tar -C "$scratch" -cf "$scratch/other.tar" v; }
  podman rmi -f "$JOULE_BASE_IMAGE" >/dev/null
  podman import --quiet "$scratch/other.tar" "$JOULE_BASE_IMAGE" >/dev/null
  out=$(bash scripts/build-images.sh --local-base --base-only 2>&1) || { echo "$out"; fail "run over a foreign image"; }
  grep -q "importing $JOULE_BASE_IMAGE .*the image was present with no label" <<<"$out" || { echo "$out"; fail "a foreign image was used"; }
  grep -qE "base $JOULE_BASE_IMAGE: Debian 12\." <<<"$out" || fail "the re-imported image does not run Debian 12"
  checks=$((checks + 8))
}

carry() {
  command -v apt-get >/dev/null || skip "no apt-get"
  export CARRY=$scratch/carry BUILD_DIR=$scratch/build RESULTS=$scratch/results.txt
  echo "cache_test: a cold carry"
  bash scripts/gpu-check.sh --fetch >"$scratch/cold.log" 2>&1 || { cat "$scratch/cold.log"; fail "cold fetch"; }
  local debs; debs=$(ls "$CARRY/debs" | wc -l)
  [[ $debs -gt 10 ]] || fail "the cold fetch carried $debs packages"
  echo "cache_test: a warm carry is kept"
  bash scripts/gpu-check.sh --fetch >"$scratch/warm.log" 2>&1 || { cat "$scratch/warm.log"; fail "warm fetch"; }
  grep -q 'is complete and valid: kept' "$scratch/warm.log" || { cat "$scratch/warm.log"; fail "a valid carry was fetched again"; }
  echo "cache_test: a truncated .deb, a stray file and a truncated dataset file"
  # Not `ls | head -1`: under pipefail, ls killed by SIGPIPE (more names than head reads
  # before it exits) ends the script, silently, now and then.
  local carried=("$CARRY"/debs/*.deb)
  local victim=${carried[0]}
  head -c 2000 "$victim" >"$victim.cut"; mv "$victim.cut" "$victim"
  cp "$victim" "$CARRY/debs/stray_1.0_amd64.deb"
  local img=$CARRY/fashion-mnist/t10k-images-idx3-ubyte.gz
  head -c 10000 "$img" >"$img.cut"; mv "$img.cut" "$img"
  bash scripts/gpu-check.sh --fetch >"$scratch/repair.log" 2>&1 || { cat "$scratch/repair.log"; fail "repairing fetch"; }
  grep -q 'debs is incomplete or invalid: downloading again' "$scratch/repair.log" || fail "the broken .deb was not noticed"
  grep -q 'fashion-mnist is incomplete or corrupt' "$scratch/repair.log" || fail "the truncated dataset was not noticed"
  local d
  for d in "$CARRY"/debs/*.deb; do valid cache_valid_deb "$d"; done
  [[ ! -e $CARRY/debs/stray_1.0_amd64.deb ]] || fail "the stray .deb is still carried"
  [[ $(ls "$CARRY/debs" | wc -l) == "$debs" ]] || fail "the repaired carry has $(ls "$CARRY/debs" | wc -l) packages, not $debs"
  valid cache_valid_fashion_mnist "$CARRY/fashion-mnist"
}

case "$mode" in
  validators) validators ;;
  base-cold) base_cold ;;
  carry) carry ;;
  *) fail "unknown mode" ;;
esac
echo "cache_test $mode: passed ($checks checks)"
