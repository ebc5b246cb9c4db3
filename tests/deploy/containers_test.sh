#!/usr/bin/env bash
# The container images and the compose stack, for real (ctest deploy_containers_test,
# label deploy; root and podman, else it skips with exit 77):
#   1. builds the coordinator and worker images on a local Debian 12 base
#      (scripts/build-images.sh --local-base: no registry needed; layers are cached);
#   2. runs deploy/docker-compose.yml's coordinator and two workers (a scratch copy, its
#      own secrets and free ports) with tests/deploy/compose_run.py, as podman-compose
#      1.0.3 cannot run network_mode: host; every container's healthcheck passes;
#   3. Debian's Prometheus with the shipped configuration and rules scrapes them through
#      the coordinator's http_sd; jobs submitted with the `joule` CLI from outside the
#      containers train, and while the second does, EVERY dashboard, recording-rule and
#      alert expression is evaluated (tests/deploy/check_deploy.py promql);
#   4. a short job first, then the long one, succeed and `joule report` works; a worker
#      stopped makes JouleWorkersLost fire; the coordinator restarted keeps the jobs and
#      their reports (its volume);
#   5. the PostgreSQL variant (deploy/docker-compose.ha.yml over the same file): PostgreSQL,
#      a leader and a standby coordinator, two workers given both; the leader's container
#      killed mid-job, the standby leads and the job ends in its first attempt.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
skip() { echo "containers_test: SKIPPED: $*"; exit 77; }
fail() { echo "containers_test: FAILED: $*" >&2; exit 1; }
step() { echo "containers_test: $(date +%T) $*"; }
[[ $(id -u) == 0 ]] || skip "needs root (rootful podman, as in CI)"
command -v podman >/dev/null || skip "no podman (bash scripts/install-deps.sh installs it)"
command -v mmdebstrap >/dev/null || skip "no mmdebstrap (bash scripts/install-deps.sh installs it)"
podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"
# The `joule` CLI built with the tests (ctest passes its path), else build/bin/joule.
joule="${1:-$repo/build/bin/joule}"
[[ -x $joule ]] || fail "no $joule: build Joule first"
export CONTAINERS_CONF="$repo/docker/containers.conf"

step "building the images"
build_log="$(mktemp)"
if ! bash scripts/build-images.sh --local-base >"$build_log" 2>&1; then
  tail -30 "$build_log"
  rm -f "$build_log"
  fail "scripts/build-images.sh failed (its last lines above)"
fi
grep '^build-images' "$build_log" || true
rm -f "$build_log"

scratch="$(mktemp -d)"
# One fixed project name: a run killed before its cleanup (a ctest timeout) leaves
# containers that the next run removes first.
project="joule-deploy-test"
prom_pid=""
cleanup() {
  if [[ -n $prom_pid ]]; then kill "$prom_pid" 2>/dev/null || true; fi
  python3 tests/deploy/compose_run.py --file "$scratch/deploy/docker-compose.yml" \
    --project "$project" down >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
cp -r deploy "$scratch/"
rm -rf "$scratch/deploy/secrets"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
JOULE_PORT=$(free_port); JOULE_METRICS_PORT=$(free_port)
JOULE_WORKER_METRICS_PORT_1=$(free_port); JOULE_WORKER_METRICS_PORT_2=$(free_port)
prom_port=$(free_port)
export JOULE_PORT JOULE_METRICS_PORT JOULE_WORKER_METRICS_PORT_1 JOULE_WORKER_METRICS_PORT_2
sed -i "s/127\.0\.0\.1:9464/127.0.0.1:$JOULE_METRICS_PORT/g" "$scratch/deploy/prometheus/prometheus.yml"
bash "$scratch/deploy/make-secrets.sh" >/dev/null
cli=("$joule" --coordinator "127.0.0.1:$JOULE_PORT" --insecure --token-file "$scratch/deploy/secrets/client-token")

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every second until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "no $what within the deadline"
    sleep 1
  done
}

step "starting the coordinator and two workers (compose file, project $project)"
python3 tests/deploy/compose_run.py --file "$scratch/deploy/docker-compose.yml" \
  --project "$project" down >/dev/null 2>&1 || true
python3 tests/deploy/compose_run.py --file "$scratch/deploy/docker-compose.yml" \
  --project "$project" up coordinator worker-1 worker-2 2>&1 | grep -v systemd || true
two_workers() { [[ $("${cli[@]}" workers | grep -c ' idle ') == 2 ]]; }
wait_for 90 "two idle workers registered" two_workers
for c in coordinator worker-1 worker-2; do
  wait_for 60 "healthy $c" podman healthcheck run "${project}_$c"
done

step "Prometheus (Debian's) with deploy/prometheus on 127.0.0.1:$prom_port"
prometheus --config.file="$scratch/deploy/prometheus/prometheus.yml" \
  --storage.tsdb.path="$scratch/prometheus-data" --web.listen-address="127.0.0.1:$prom_port" \
  >"$scratch/prometheus.log" 2>&1 &
prom_pid=$!
prom="http://127.0.0.1:$prom_port"
promql() {  # promql EXPR: prints the result vector's length
  curl -fsS --max-time 5 "$prom/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))'
}
targets_up() { [[ $(promql 'up == 1') == 3 ]]; }
wait_for 60 "three targets up in Prometheus (coordinator, two workers via http_sd)" targets_up

step "a short job from the CLI outside the containers"
submit() {
  local id
  id=$("${cli[@]}" submit --model mlp --workers 2 --global-batch-size 128 "$@")
  [[ $id =~ ^[0-9]+$ ]] || fail "submit printed '$id', not a job id"
  echo "$id"
}
short=$(submit --name deploy-short --epochs 1 --max-train-samples 6000 --max-test-samples 1000)
timeout 120 "${cli[@]}" watch "$short" >/dev/null || true
"${cli[@]}" status "$short" | grep -q succeeded || { "${cli[@]}" status "$short"; fail "job $short did not succeed"; }
"${cli[@]}" report "$short" >"$scratch/report-before.txt" || fail "joule report $short"
grep -q 'energy' "$scratch/report-before.txt" || fail "the report has no energy"

step "every dashboard, rule and alert expression while a longer job trains"
job=$(submit --name deploy-long --epochs 10)
# Its rates over 1m need a few scrapes, the recording rules an evaluation after them, and
# the accuracy panel the first epoch's evaluation.
training_scraped() {
  [[ $(promql "count_over_time(joule_samples_total{joule_job=\"$job\"}[1m]) >= 4") == 2 ]] &&
    [[ $(promql "joule_job:samples_per_joule:rate1m{joule_job=\"$job\"}") == 1 ]] &&
    [[ $(promql "joule_test_accuracy_ratio{joule_job=\"$job\"}") -ge 1 ]]
}
wait_for 90 "job $job's series scraped and recorded" training_scraped
python3 tests/deploy/check_deploy.py promql --prometheus "$prom" --job "$job" >"$scratch/promql.txt" ||
  { cat "$scratch/promql.txt"; fail "dashboard, rule or alert expressions failed (above)"; }
tail -1 "$scratch/promql.txt"
timeout 300 "${cli[@]}" watch "$job" >/dev/null || true
"${cli[@]}" status "$job" | grep -q succeeded || { "${cli[@]}" status "$job"; fail "job $job did not succeed"; }

step "a worker lost: JouleWorkersLost must fire"
podman stop -t 2 "${project}_worker-2" >/dev/null
alert_firing() {
  curl -fsS --max-time 5 "$prom/api/v1/alerts" |
    python3 -c 'import json,sys; a=json.load(sys.stdin)["data"]["alerts"]; sys.exit(0 if any(x["labels"]["alertname"]=="JouleWorkersLost" and x["state"]=="firing" for x in a) else 1)'
}
wait_for 150 "JouleWorkersLost firing" alert_firing

step "the coordinator restarted keeps the job (its volume)"
# Stop, then start: `podman restart` races its own SIGKILL against a container that has
# just stopped ("container state improper"). The coordinator answers SIGTERM at once; the
# 20 s are for a loaded host.
podman stop -t 20 "${project}_coordinator" >/dev/null
podman start "${project}_coordinator" >/dev/null
wait_for 60 "the coordinator back" "${cli[@]}" list
"${cli[@]}" report "$short" >"$scratch/report-after.txt" || fail "joule report $short after the restart"
"${cli[@]}" status "$job" | grep -q succeeded || fail "job $job is not listed as succeeded after the restart"
diff "$scratch/report-before.txt" "$scratch/report-after.txt" || fail "the report changed across the restart"
step "the PostgreSQL variant: a standby coordinator takes over mid-job"
python3 tests/deploy/compose_run.py --file "$scratch/deploy/docker-compose.yml" \
  --project "$project" down >/dev/null 2>&1 || true
POSTGRES_PORT=$(free_port); JOULE_STANDBY_PORT=$(free_port); JOULE_STANDBY_METRICS_PORT=$(free_port)
export POSTGRES_PORT JOULE_STANDBY_PORT JOULE_STANDBY_METRICS_PORT
ha_files=(--file "$scratch/deploy/docker-compose.yml" --file "$scratch/deploy/docker-compose.ha.yml")
cleanup_ha() {
  python3 tests/deploy/compose_run.py "${ha_files[@]}" --project "$project" down >/dev/null 2>&1 || true
  cleanup
}
trap cleanup_ha EXIT
# From here a failure shows both coordinators' last log lines.
fail() {
  local c
  for c in coordinator coordinator-standby; do
    echo "--- ${project}_$c:"
    podman logs --tail 30 "${project}_$c" 2>&1 | grep -v 'level=' || true
  done
  echo "containers_test: FAILED: $*" >&2
  exit 1
}
python3 tests/deploy/compose_run.py "${ha_files[@]}" --project "$project" \
  up postgres coordinator coordinator-standby worker-1 worker-2 2>&1 | grep -v systemd || true
cli=("$joule" --coordinator "127.0.0.1:$JOULE_PORT,127.0.0.1:$JOULE_STANDBY_PORT" --insecure
  --token-file "$scratch/deploy/secrets/client-token")
wait_for 120 "two idle workers registered with the pair" two_workers
for c in postgres coordinator coordinator-standby; do
  wait_for 60 "healthy $c" podman healthcheck run "${project}_$c"
done
# epoch_led_on METRICS_PORT: the epoch that coordinator leads in (nothing if it stands by).
epoch_led_on() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/metrics" |
    awk '$1 == "joule_coordinator_leading" {l = $2} $1 == "joule_coordinator_lease_epoch" {e = $2} END {if (l == 1) print e}'
}
one_leads() { [[ -n $(epoch_led_on "$JOULE_METRICS_PORT")$(epoch_led_on "$JOULE_STANDBY_METRICS_PORT") ]]; }
wait_for 60 "a coordinator leading" one_leads
if [[ -n $(epoch_led_on "$JOULE_METRICS_PORT") ]]; then leader=coordinator; else leader=coordinator-standby; fi
old_epoch=$(epoch_led_on "$JOULE_METRICS_PORT")$(epoch_led_on "$JOULE_STANDBY_METRICS_PORT")
job=$(submit --name deploy-ha --epochs 6)
# Training, not still connecting its ranks (a rendezvous cut short cannot be adopted: the
# attempt is re-queued, as README "High availability" says).
training() { "${cli[@]}" status "$job" | grep -Eq 'step [1-9][0-9]*/'; }
wait_for 90 "job $job training" training
# SIGKILL: no resignation. (Its restart policy may bring it back as a standby, or even
# leading again once the lease lapsed: either way a newer epoch leads.)
podman kill "${project}_$leader" >/dev/null
newer_leads() {
  local e
  for e in $(epoch_led_on "$JOULE_METRICS_PORT") $(epoch_led_on "$JOULE_STANDBY_METRICS_PORT"); do
    awk -v e="$e" -v o="$old_epoch" 'BEGIN {exit !(e > o)}' && return 0
  done
  return 1
}
wait_for 60 "a coordinator leading in an epoch after $old_epoch" newer_leads
wait_for 60 "job $job's status from the new leader" "${cli[@]}" status "$job"
timeout 300 "${cli[@]}" watch "$job" >/dev/null || true
"${cli[@]}" status "$job" >"$scratch/ha-status.txt" || true
grep -q succeeded "$scratch/ha-status.txt" || { cat "$scratch/ha-status.txt"; fail "job $job did not succeed through the failover"; }
grep -q 'attempt 1 on' "$scratch/ha-status.txt" || { cat "$scratch/ha-status.txt"; fail "job $job was re-run (not attempt 1) after the failover"; }
step "passed"
