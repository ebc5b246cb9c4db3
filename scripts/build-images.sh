#!/usr/bin/env bash
# Builds Joule's container images (docker/Dockerfile.coordinator, docker/Dockerfile.worker,
# and docker/Dockerfile.postgres for deploy/docker-compose.ha.yml) with podman, on a Debian 12 base made locally by mmdebstrap when no registry is reachable.
#
#   bash scripts/build-images.sh [--tag TAG] [--local-base [--base-only] | --base IMAGE]
#
#   --base IMAGE   the BASE build argument (default docker.io/library/debian:bookworm-slim)
#   --local-base   build the base with `mmdebstrap --variant=minbase bookworm` (as root),
#                  cache the tarball in $JOULE_IMAGE_CACHE (default /var/cache/joule-deploy)
#                  and import it as $JOULE_BASE_IMAGE (default localhost/joule-base:bookworm)
#                  labelled with the tarball's SHA-256. Both are validated before use: a
#                  tarball that is not a complete Debian root file system (a directory, an
#                  empty or truncated file) is made again, and an image without the label of
#                  the cached tarball (absent, from another tarball, from an older script)
#                  is imported again (scripts/lib/cache.sh; tests/deploy/cache_test.sh)
#   --base-only    with --local-base: make and check the base image only, build nothing
#   --tag TAG      image tag (default latest): localhost/joule-coordinator:TAG,
#                  localhost/joule-worker:TAG and localhost/joule-postgres:TAG
#
# --format docker keeps the HEALTHCHECK (OCI images have none). Podman caches layers, so a
# rebuild reinstalls no package unless install-deps.sh changed, and both images share one
# build stage (the same steps): Joule compiles once per change of the sources.
# Set CONTAINERS_CONF=docker/containers.conf on hosts that need runc or low ulimits.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/cache.sh
source scripts/lib/cache.sh

base=docker.io/library/debian:bookworm-slim
tag=latest
local_base=0
base_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) base="${2:?--base needs an image}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --local-base) local_base=1; shift ;;
    --base-only) base_only=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "build-images: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $base_only == 1 && $local_base == 0 ]]; then
  echo "build-images: --base-only needs --local-base" >&2; exit 2
fi
if [[ $local_base == 1 ]]; then
  base="${JOULE_BASE_IMAGE:-localhost/joule-base:bookworm}"
  cache="${JOULE_IMAGE_CACHE:-/var/cache/joule-deploy}"
  tarball="$cache/base.tar"
  mkdir -p "$cache"
  if [[ -e $tarball ]] && ! cache_valid_rootfs_tar "$tarball"; then
    echo "build-images: $tarball is not a complete Debian root file system: making it again"
    rm -rf "$tarball"
  fi
  if [[ ! -e $tarball ]]; then
    echo "build-images: making a Debian 12 base with mmdebstrap ($tarball)"
    rm -rf "$tarball.partial"
    # --format=tar: mmdebstrap otherwise picks the format from the name's extension, and
    # ".partial" has none it knows (it wrote a directory).
    mmdebstrap --variant=minbase --format=tar --quiet bookworm "$tarball.partial"
    cache_valid_rootfs_tar "$tarball.partial" ||
      { rm -rf "$tarball.partial"; echo "build-images: mmdebstrap wrote no Debian root file system tarball" >&2; exit 1; }
    mv "$tarball.partial" "$tarball"
  fi
  sha=$(sha256sum "$tarball" | cut -d' ' -f1)
  label="" had="absent"
  if podman image exists "$base"; then
    label=$(podman image inspect --format '{{index .Labels "org.joule.base.sha256"}}' "$base" 2>/dev/null || true)
    had="present with ${label:+label ${label:0:12}}${label:-no label}"
  fi
  if [[ $label != "$sha" ]]; then
    echo "build-images: importing $base from $tarball (sha256 ${sha:0:12}; the image was $had)"
    podman import --quiet --change "LABEL org.joule.base.sha256=$sha" "$tarball" "$base" >/dev/null
  fi
  version=$(podman run --rm --network none "$base" cat /etc/debian_version) ||
    { echo "build-images: $base does not run" >&2; exit 1; }
  echo "build-images: base $base: Debian $version, from $tarball (sha256 ${sha:0:12})"
  [[ $base_only == 1 ]] && exit 0
fi

for program in coordinator worker postgres; do
  echo "build-images: localhost/joule-$program:$tag (base $base)"
  podman build --quiet --format docker --network host --build-arg "BASE=$base" \
    -f "docker/Dockerfile.$program" -t "localhost/joule-$program:$tag" . >/dev/null
done
