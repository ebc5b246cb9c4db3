#!/usr/bin/env bash
# Joule and PyTorch DDP across test hosts (network namespaces), side by side in one run.
#
#   bash bench/multihost.sh [--models logreg,mlp,cnn] [--links unshaped,10gbit,1gbit]
#                           [--modes allreduce,fp16,local4,local16,powersgd4] [--epochs 1]
#                           [--powersgd-warmup 10]
#                           [--build-dir build] [--no-collectives] [--keep]
#                           [--joule-flags "--bucket-bytes 1048576 ..."]
#
# Per link setting it creates three test hosts with scripts/netns-hosts.sh (each host's
# egress shaped to the rate with tc tbf; "unshaped": a plain veth): the coordinator on
# host 1 (TLS and tokens, as off loopback it must be), one worker on each of hosts 2 and 3
# (Gloo over the link, 1 intra-op thread). DDP's two ranks run on hosts 2 and 3 too. Per
# model, DDP's gradient allreduce (and DDP with its fp16 compression hook, where the fp16
# mode is asked for, and with its powerSGD_hook at rank R for each powersgdR mode) and then
# each Joule mode: gradient allreduce, --fp16-compression, local SGD with H=4 and H=16,
# --sync powersgd --powersgd-rank R. Both PowerSGDs average exactly for the first
# --powersgd-warmup steps (default 10; PyTorch's floor is 2). Settings as
# bench/compare.sh: 2 ranks, local batch 64, SGD lr 0.05 momentum 0.9, seed 0.
#
# Per cell: samples/s (training loop only, as both sides report it), the ratio to DDP's
# allreduce on the same link, test accuracy, bytes sent per rank per step (the worker
# hosts' eth0 tx counters, control plane included), CPU seconds per 1000 samples (user+sys
# of the training processes) and joules per sample. Joules: Joule's energy report; for
# DDP, its CPU seconds times the watts per busy core that Joule's estimated source uses on
# a machine without RAPL (--watts-per-busy-core, 6 W), so both sides are charged alike.
# --joule-flags adds `joule submit` flags to every Joule job. Each Joule job's report
# (time by phase, energy) is saved beside the logs; --keep keeps them (the directory is
# printed). First, per link, joule-bench-collectives with a rank on each worker host (allreduce
# latency and bus bandwidth next to the link rate; --no-collectives skips it).
# Rows go to bench/results/multihost-<date>.jsonl. Needs root (namespaces, tc); without it
# exits 77 with the reason.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
PYTHON=/usr/bin/python3
HOSTS="$REPO_DIR/scripts/netns-hosts.sh"

MODELS="logreg,mlp,cnn"
LINKS="unshaped,10gbit,1gbit"
MODES="allreduce,fp16,local4,local16"
EPOCHS=1
BUILD_DIR="$REPO_DIR/build"
WORLD=2
LOCAL_BATCH=64
LR=0.05
MOMENTUM=0.9
SEED=0
RUN_COLLECTIVES=1
KEEP=0
JOULE_FLAGS=()
WATTS_PER_CORE=6
DDP_PORT=29511
COLLECTIVE_MAX_BYTES=$((64 << 20))
POWERSGD_WARMUP=10

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die() { echo "multihost.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) MODELS="${2:?--models needs a value}"; shift 2 ;;
    --links) LINKS="${2:?--links needs a value}"; shift 2 ;;
    --modes) MODES="${2:?--modes needs a value}"; shift 2 ;;
    --epochs) EPOCHS="${2:?--epochs needs a value}"; shift 2 ;;
    --powersgd-warmup) POWERSGD_WARMUP="${2:?--powersgd-warmup needs a value}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift 2 ;;
    --no-collectives) RUN_COLLECTIVES=0; shift ;;
    --keep) KEEP=1; shift ;;
    --joule-flags) read -r -a JOULE_FLAGS <<< "${2:?--joule-flags needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "multihost.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

[[ "$EPOCHS" =~ ^[1-9][0-9]*$ ]] || die "--epochs must be a positive integer, got '$EPOCHS'"
[[ "$POWERSGD_WARMUP" =~ ^[0-9]+$ ]] && (( POWERSGD_WARMUP >= 2 )) ||
  die "--powersgd-warmup must be an integer >= 2 (PyTorch's floor), got '$POWERSGD_WARMUP'"
IFS=',' read -r -a MODEL_LIST <<< "$MODELS"
IFS=',' read -r -a LINK_LIST <<< "$LINKS"
IFS=',' read -r -a MODE_LIST <<< "$MODES"
for m in "${MODEL_LIST[@]}"; do
  [[ "$m" =~ ^(logreg|mlp|cnn)$ ]] || die "unknown model '$m' (expected logreg, mlp, cnn)"
done
for l in "${LINK_LIST[@]}"; do
  [[ "$l" == unshaped || "$l" =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] ||
    die "unknown link '$l' (expected unshaped or a tc rate such as 1gbit)"
done
for m in "${MODE_LIST[@]}"; do
  [[ "$m" =~ ^(allreduce|fp16|local[1-9][0-9]*|powersgd[1-9][0-9]*)$ ]] ||
    die "unknown mode '$m' (expected allreduce, fp16, localH, powersgdR)"
done
[ "$(id -u)" -eq 0 ] || { echo "multihost.sh: skipped: needs root (network namespaces, tc)" >&2; exit 77; }
BUILD_DIR="$(cd "$BUILD_DIR" 2>/dev/null && pwd || echo "$BUILD_DIR")"
for bin in joule joule-coordinator joule-worker; do
  [[ -x "$BUILD_DIR/bin/$bin" ]] || die "$BUILD_DIR/bin/$bin not found; build Joule first"
done
"$PYTHON" -c 'import torch, numpy' 2>/dev/null ||
  die "the reference needs $PYTHON with torch and numpy (Debian: python3-torch python3-numpy)"
command -v openssl >/dev/null || die "needs openssl (Debian package openssl)"

cd "$REPO_DIR"
mkdir -p "$BENCH_DIR/results"
STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="$BENCH_DIR/results/multihost-$STAMP.jsonl"
COLLECTIVES="$BENCH_DIR/results/multihost-collectives-$STAMP.txt"
: > "$RESULTS"
: > "$COLLECTIVES"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/joule-multihost.XXXXXX")"
HOSTS_PID=""
PIDS=()
FAILED=0

stop_hosts() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
  if [[ -n "$HOSTS_PID" ]]; then
    kill -TERM "$HOSTS_PID" 2>/dev/null || true
    wait "$HOSTS_PID" 2>/dev/null || true
    HOSTS_PID=""
  fi
}
cleanup() {
  local rc=$?
  stop_hosts
  if [[ $rc -eq 0 && $FAILED -eq 0 && $KEEP -eq 0 ]]; then rm -rf "$WORK"; else
    echo "multihost.sh: logs kept in $WORK" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A throwaway self-signed certificate for the coordinator's address, and the
# tokens, as a deployment would have them.
make_credentials() {
  local addr=$1
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/key.pem" -out "$WORK/cert.pem" \
    -days 1 -subj "/CN=joule-bench" -addext "subjectAltName=IP:$addr" 2>/dev/null
  echo "bench bench-token" > "$WORK/clients"
  echo "bench-token" > "$WORK/token"
  echo "join-token" > "$WORK/join"
}

# spawn_in_host LOG HOST cmd...: starts cmd in test host HOST in the background, output to
# LOG; LAST_PID is its pid (netns-hosts.sh exec and ip netns exec both exec it).
spawn_in_host() {
  local log=$1
  shift
  JNH_RUN="$RUN" bash "$HOSTS" exec "$@" > "$log" 2>&1 &
  LAST_PID=$!
}
tx_bytes() {  # bytes host $1 has sent on its link
  ip -n "jnh-$RUN-$1" -s -j link show eth0 |
    "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'
}
cpu_seconds() {  # user+sys of the processes given
  local total=0 p
  for p in "$@"; do
    total=$((total + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  awk -v t="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'
}

start_hosts() {
  local link=$1 flags=()
  [[ "$link" == unshaped ]] || flags=(--rate "$link")
  bash "$HOSTS" up 3 "${flags[@]}" > "$WORK/hosts-$link.log" 2>&1 &
  HOSTS_PID=$!
  local line=""
  for _ in $(seq 300); do
    line="$(grep -m1 '^ready ' "$WORK/hosts-$link.log" || true)"
    [[ -n "$line" ]] && break
    kill -0 "$HOSTS_PID" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n "$line" ]] || { cat "$WORK/hosts-$link.log" >&2; die "the test hosts did not come up"; }
  read -r _ RUN NET <<< "$line"
  COORD="$NET.1"
  make_credentials "$COORD"
  rm -f "$WORK/address" "$WORK/jobs.db"
  spawn_in_host "$WORK/coordinator-$link.log" 1 "$BUILD_DIR/bin/joule-coordinator" \
    --listen "$COORD:0" --db "$WORK/jobs-$link.db" --address-file "$WORK/address" \
    --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" --client-tokens-file "$WORK/clients" \
    --join-token-file "$WORK/join" --metrics-listen ""
  PIDS+=("$LAST_PID")
  for _ in $(seq 300); do [[ -s "$WORK/address" ]] && break; sleep 0.1; done
  [[ -s "$WORK/address" ]] || { cat "$WORK/coordinator-$link.log" >&2; die "no coordinator"; }
  ADDRESS="$(cat "$WORK/address")"
  WORKER_PIDS=()
  local h
  for h in 2 3; do
    spawn_in_host "$WORK/worker$h-$link.log" "$h" "$BUILD_DIR/bin/joule-worker" \
      --coordinator "$ADDRESS" --tls-ca "$WORK/cert.pem" --join-token-file "$WORK/join" \
      --gloo-host "$NET.$h" --threads 1 --metrics-address "" --checkpoint-root ""
    PIDS+=("$LAST_PID")
    WORKER_PIDS+=("$LAST_PID")
  done
  for _ in $(seq 300); do
    [[ "$(cli workers 2>/dev/null | grep -c idle || true)" -ge 2 ]] && return 0
    sleep 0.2
  done
  cli workers >&2 || true
  die "the workers did not register (logs in $WORK)"
}

cli() { "$BUILD_DIR/bin/joule" --coordinator "$ADDRESS" --tls-ca "$WORK/cert.pem" \
          --token-file "$WORK/token" "$@"; }

# One JSON row from the measurements in the environment (python: the reference needs it).
emit_row() {
  "$PYTHON" - <<'PY' >> "$RESULTS"
import json, os
e = os.environ
def f(k):
    v = e.get(k, "")
    return float(v) if v not in ("", "None") else None
samples, steps = f("SAMPLES"), f("STEPS")
row = {"date": e["STAMP"], "link": e["LINK"], "model": e["MODEL"], "system": e["SYSTEM"],
       "mode": e["MODE"], "world": int(e["WORLD"]), "local_batch": int(e["LOCAL_BATCH"]),
       "epochs": int(e["EPOCHS"]), "samples_per_second": f("SPS"),
       "test_accuracy": f("ACC"), "samples": samples, "steps": steps,
       "bytes_sent_per_rank_per_step": (f("TX") / int(e["WORLD"]) / steps) if steps else None,
       "cpu_seconds": f("CPU"), "joules": f("JOULES"),
       "joules_per_sample": (f("JOULES") / samples) if samples and f("JOULES") else None,
       "cores": os.cpu_count()}
print(json.dumps(row))
PY
}

run_ddp() {  # model, mode (allreduce, fp16, powersgdR): both ranks on hosts 2 and 3
  local model=$1 mode=$2 extra=() r
  case "$mode" in
    fp16) extra=(--fp16-hook) ;;
    powersgd*) extra=(--powersgd-rank "${mode#powersgd}" --powersgd-warmup "$POWERSGD_WARMUP") ;;
  esac
  local tx0 tx1
  tx0=$(( $(tx_bytes 2) + $(tx_bytes 3) ))
  local pids=()
  for r in 0 1; do
    spawn_in_host "$WORK/ddp$r.out" "$((r + 2))" env GLOO_SOCKET_IFNAME=eth0 "$PYTHON" \
      "$BENCH_DIR/cputime.py" "$PYTHON" "$BENCH_DIR/ddp_reference.py" "$model" "$WORLD" \
      "$LOCAL_BATCH" "$EPOCHS" --lr "$LR" --momentum "$MOMENTUM" --threads 1 --seed "$SEED" \
      --rank "$r" --master "$NET.2" --port "$DDP_PORT" "${extra[@]}"
    pids+=("$LAST_PID")
  done
  local ok=1
  for r in 0 1; do wait "${pids[$r]}" || ok=0; done
  tx1=$(( $(tx_bytes 2) + $(tx_bytes 3) ))
  if [[ $ok -eq 0 ]]; then
    echo "DDP $model ($mode) failed:" >&2; cat "$WORK/ddp0.out" "$WORK/ddp1.out" >&2
    FAILED=1; return
  fi
  local json cpu vals SPS="" ACC="" SAMPLES="" STEPS=""
  json="$(grep '^{' "$WORK/ddp0.out" | tail -n 1 || true)"
  cpu="$(cat "$WORK/ddp0.out" "$WORK/ddp1.out" | sed -n 's/^cpu_seconds=//p' |
         awk '{s += $1} END {printf "%.3f", s}')"
  if ! vals="$(JSON="$json" "$PYTHON" -c '
import json, os
j = json.loads(os.environ["JSON"])
print("SPS={} ACC={} SAMPLES={} STEPS={}".format(
    j["samples_per_second"], j["test_accuracy"], j["samples"], j["steps"]))')"; then
    echo "DDP $model ($mode): no result line in $WORK/ddp0.out" >&2
    FAILED=1; return
  fi
  eval "$vals"
  SYSTEM=ddp MODE="$mode" TX=$((tx1 - tx0)) CPU="$cpu" \
    JOULES="$(awk -v c="$cpu" -v w="$WATTS_PER_CORE" 'BEGIN { printf "%.3f", c * w }')" \
    SPS="$SPS" ACC="$ACC" SAMPLES="$SAMPLES" STEPS="$STEPS" emit_row
  echo "  DDP $mode: $SPS samples/s, accuracy $ACC"
}

# joule-bench-collectives with one rank on each worker host: Gloo allreduce latency and
# bus bandwidth over the link (float32, then fp16 on the wire), next to the link's rate.
run_collectives() {
  local link=$1 gbit="" wire
  [[ "$link" == unshaped ]] || gbit="$(awk -v r="$link" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1)
    printf "%g", n * ((u ~ /^k/) ? 1e-6 : (u ~ /^m/) ? 1e-3 : (u ~ /^g/) ? 1 : 1e-9) }')"
  for wire in float32 fp16; do
    local dir="$WORK/rendezvous-$link-$wire" pids=() h
    mkdir -p "$dir"
    for h in 2 3; do
      local flags=(--rank "$((h - 2))" --world 2 --rendezvous-dir "$dir" --gloo-host "$NET.$h"
                   --max-bytes "$COLLECTIVE_MAX_BYTES" --seconds 0.3)
      [[ -n "$gbit" ]] && flags+=(--link-gbit "$gbit")
      [[ "$wire" == fp16 ]] && flags+=(--fp16)
      spawn_in_host "$WORK/collectives-$link-$wire-$h.out" "$h" \
        "$BUILD_DIR/bin/joule-bench-collectives" "${flags[@]}"
      pids+=("$LAST_PID")
    done
    local ok=1
    for h in 0 1; do wait "${pids[$h]}" || ok=0; done
    if [[ $ok -eq 0 ]]; then
      echo "collectives over $link ($wire) failed:" >&2
      cat "$WORK/collectives-$link-$wire-"*.out >&2
      FAILED=1
      continue
    fi
    echo "# link $link" | tee -a "$COLLECTIVES"
    tee -a "$COLLECTIVES" < "$WORK/collectives-$link-$wire-2.out"
  done
}

run_joule() {  # model, mode
  local model=$1 mode=$2 flags=()
  case "$mode" in
    allreduce) ;;
    fp16) flags=(--fp16-compression) ;;
    local*) flags=(--sync local-sgd --sync-period "${mode#local}") ;;
    powersgd*) flags=(--sync powersgd --powersgd-rank "${mode#powersgd}"
                      --sync-warmup-steps "$POWERSGD_WARMUP") ;;
  esac
  flags+=("${JOULE_FLAGS[@]}")
  local tx0 tx1 cpu0 cpu1 id
  tx0=$(( $(tx_bytes 2) + $(tx_bytes 3) ))
  cpu0="$(cpu_seconds "${WORKER_PIDS[@]}")"
  id="$(cli submit --model "$model" --workers "$WORLD" --global-batch-size "$((WORLD * LOCAL_BATCH))" \
        --epochs "$EPOCHS" --lr "$LR" --momentum "$MOMENTUM" --threads 1 --seed "$SEED" \
        --name "multihost-$model-$mode" "${flags[@]}" | tail -n 1 | tr -d '[:space:]')" || id=""
  if [[ ! "$id" =~ ^[0-9]+$ ]] || ! cli watch "$id" > /dev/null; then
    echo "Joule $model $mode failed:" >&2; [[ -n "$id" ]] && cli status "$id" >&2
    FAILED=1; return
  fi
  tx1=$(( $(tx_bytes 2) + $(tx_bytes 3) ))
  cpu1="$(cpu_seconds "${WORKER_PIDS[@]}")"
  cli report "$id" > "$WORK/report-$LINK-$model-$mode.txt" 2>&1 || true
  # The job's report: protobuf JSON (int64 as strings), proto field names.
  local vals SPS="" ACC="" SAMPLES="" STEPS="" JOULES=""
  if ! vals="$(cli report "$id" --format json | "$PYTHON" -c '
import json, sys
r = json.load(sys.stdin).get("result", {})
e = r.get("energy", {})
print("ACC={} SAMPLES={} STEPS={} SPS={} JOULES={}".format(
    r.get("test_accuracy", ""), r.get("samples", ""), r.get("steps", ""),
    r.get("samples_per_second", ""), e.get("total_joules", "")))')"; then
    echo "Joule $model $mode: no report for job $id" >&2
    FAILED=1; return
  fi
  eval "$vals"
  SYSTEM=joule MODE="$mode" TX=$((tx1 - tx0)) \
    CPU="$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.3f", b - a }')" JOULES="$JOULES" \
    SPS="$SPS" ACC="$ACC" SAMPLES="$SAMPLES" STEPS="$STEPS" emit_row
  echo "  Joule $mode: $SPS samples/s, accuracy $ACC"
}

export STAMP WORLD LOCAL_BATCH EPOCHS
echo "== Joule vs PyTorch DDP across test hosts: models $MODELS, links $LINKS, modes $MODES;" \
     "$WORLD ranks x 1 thread, local batch $LOCAL_BATCH, $EPOCHS epoch(s)"
for link in "${LINK_LIST[@]}"; do
  echo "== link: $link"
  start_hosts "$link"
  [[ "$RUN_COLLECTIVES" == 1 ]] && run_collectives "$link"
  for model in "${MODEL_LIST[@]}"; do
    echo "-- $model"
    export LINK="$link" MODEL="$model"
    run_ddp "$model" allreduce
    for mode in "${MODE_LIST[@]}"; do
      [[ "$mode" == fp16 || "$mode" == powersgd* ]] && run_ddp "$model" "$mode"
    done
    for mode in "${MODE_LIST[@]}"; do run_joule "$model" "$mode"; done
  done
  stop_hosts
done

echo
"$PYTHON" - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {(r["link"], r["model"]): r["samples_per_second"] for r in rows
        if r["system"] == "ddp" and r["mode"] == "allreduce"}
def n(v, fmt):
    return "-" if v is None else format(v, fmt)
head = ("link", "model", "system", "mode", "samples/s", "x DDP", "accuracy",
        "KiB/rank/step", "CPU s/1k samples", "mJ/sample")
out = [head]
for r in rows:
    b = base.get((r["link"], r["model"]))
    sps = r["samples_per_second"]
    cpu = r["cpu_seconds"] / r["samples"] * 1000 if r["cpu_seconds"] and r["samples"] else None
    out.append((r["link"], r["model"], r["system"], r["mode"], n(sps, ",.0f"),
                n(sps / b if sps and b else None, ".2f"), n(r["test_accuracy"], ".4f"),
                n(r["bytes_sent_per_rank_per_step"] / 1024
                  if r["bytes_sent_per_rank_per_step"] else None, ",.1f"),
                n(cpu, ".2f"),
                n(r["joules_per_sample"] * 1000 if r["joules_per_sample"] else None, ".2f")))
w = [max(len(x[i]) for x in out) for i in range(len(head))]
for k, x in enumerate(out):
    print("| " + " | ".join(c.ljust(w[i]) if i < 4 else c.rjust(w[i]) for i, c in enumerate(x)) + " |")
    if k == 0:
        print("|" + "|".join("-" * (x + 2) for x in w) + "|")
PY
echo
echo "results: ${RESULTS#"$REPO_DIR"/} and ${COLLECTIVES#"$REPO_DIR"/}"
if [[ $FAILED -ne 0 ]]; then echo "multihost.sh: some runs failed (see above)" >&2; exit 1; fi
