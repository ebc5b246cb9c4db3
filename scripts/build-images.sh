#!/usr/bin/env bash
# Builds Joule's container images (docker/Dockerfile.coordinator, docker/Dockerfile.worker)
# with podman, on a Debian 12 base made locally by mmdebstrap when no registry is reachable.
#
#   bash scripts/build-images.sh [--tag TAG] [--local-base | --base IMAGE]
#
#   --base IMAGE   the BASE build argument (default docker.io/library/debian:bookworm-slim)
#   --local-base   build the base with `mmdebstrap --variant=minbase bookworm` (as root),
#                  cache the tarball in $JOULE_IMAGE_CACHE (default /var/cache/joule-deploy)
#                  and import it as localhost/joule-base:bookworm; reused while present
#   --tag TAG      image tag (default latest): localhost/joule-coordinator:TAG and
#                  localhost/joule-worker:TAG
#
# --format docker keeps the HEALTHCHECK (OCI images have none). Podman caches layers, so a
# rebuild reinstalls no package unless install-deps.sh changed, and both images share one
# build stage (the same steps): Joule compiles once per change of the sources.
# Set CONTAINERS_CONF=docker/containers.conf on hosts that need runc or low ulimits.
set -euo pipefail
cd "$(dirname "$0")/.."

base=docker.io/library/debian:bookworm-slim
tag=latest
local_base=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) base="${2:?--base needs an image}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --local-base) local_base=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "build-images: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $local_base == 1 ]]; then
  base=localhost/joule-base:bookworm
  cache="${JOULE_IMAGE_CACHE:-/var/cache/joule-deploy}"
  if ! podman image exists "$base"; then
    if [[ ! -s $cache/base.tar ]]; then
      mkdir -p "$cache"
      echo "build-images: making a Debian 12 base with mmdebstrap ($cache/base.tar)"
      mmdebstrap --variant=minbase --quiet bookworm "$cache/base.tar.partial"
      mv "$cache/base.tar.partial" "$cache/base.tar"
    fi
    podman import --quiet "$cache/base.tar" "$base" >/dev/null
  fi
fi

for program in coordinator worker; do
  echo "build-images: localhost/joule-$program:$tag (base $base)"
  podman build --quiet --format docker --network host --build-arg "BASE=$base" \
    -f "docker/Dockerfile.$program" -t "localhost/joule-$program:$tag" . >/dev/null
done
