#!/bin/sh
# Container healthcheck: the program's Prometheus endpoint answers with Joule's series
# (coordinator: joule_build_info; worker: joule_power_watts once metering runs).
# JOULE_METRICS_PORT: the port of --metrics-listen / --metrics-address (default 9464).
set -eu
port="${JOULE_METRICS_PORT:-9464}"
case "${1:-}" in
  coordinator) series=joule_build_info ;;
  worker) series=joule_ ;;
  *) echo "usage: joule-healthcheck coordinator|worker" >&2; exit 2 ;;
esac
curl -fsS --max-time 2 "http://127.0.0.1:${port}/metrics" | grep -q "^${series}"
