#!/usr/bin/env bash
# Joule vs PyTorch DDP on the reference workloads, side by side in one run.
#
#   bash bench/compare.sh [--models logreg,mlp,cnn] [--epochs 1] [--runs 1] [--build-dir build]
#
# For each model and run it runs the PyTorch DDP reference (bench/ddp_reference.py) and
# then the same job on a private local Joule cluster (2 workers, 1 intra-op thread each),
# and prints, per model, the median over runs (run k uses seed k - 1 on both sides) of throughput, CPU-seconds per training
# sample (user + sys of every process: the reference's interpreters, Joule's workers and
# coordinator, start-up and evaluation included) and test accuracy for both. Every run
# also goes to bench/results/compare-<date>.jsonl. See bench/README.md.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
PYTHON=/usr/bin/python3

MODELS="logreg,mlp,cnn"
EPOCHS=1
RUNS=1
BUILD_DIR="$REPO_DIR/build"
WORLD=2
LOCAL_BATCH=64
LR=0.05
MOMENTUM=0.9
THREADS=1
SEED=0

usage() {
  sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) MODELS="${2:?--models needs a value}"; shift 2 ;;
    --models=*) MODELS="${1#*=}"; shift ;;
    --epochs) EPOCHS="${2:?--epochs needs a value}"; shift 2 ;;
    --epochs=*) EPOCHS="${1#*=}"; shift ;;
    --runs) RUNS="${2:?--runs needs a value}"; shift 2 ;;
    --runs=*) RUNS="${1#*=}"; shift ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift 2 ;;
    --build-dir=*) BUILD_DIR="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

if ! [[ "$RUNS" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare.sh: --runs must be a positive integer, got '$RUNS'" >&2
  exit 2
fi
if ! [[ "$EPOCHS" =~ ^[1-9][0-9]*$ ]]; then
  echo "compare.sh: --epochs must be a positive integer, got '$EPOCHS'" >&2
  exit 2
fi
IFS=',' read -r -a MODEL_LIST <<< "$MODELS"
if [[ ${#MODEL_LIST[@]} -eq 0 ]]; then
  echo "compare.sh: --models is empty" >&2
  exit 2
fi
for m in "${MODEL_LIST[@]}"; do
  case "$m" in
    logreg|mlp|cnn) ;;
    *) echo "compare.sh: unknown model '$m' (expected logreg, mlp, cnn)" >&2; exit 2 ;;
  esac
done

# A relative --build-dir is taken from the directory the script was started in.
BUILD_DIR="$(cd "$BUILD_DIR" 2>/dev/null && pwd || echo "$BUILD_DIR")"
JOULE="$BUILD_DIR/bin/joule"
for bin in joule joule-coordinator joule-worker; do
  if [[ ! -x "$BUILD_DIR/bin/$bin" ]]; then
    echo "compare.sh: $BUILD_DIR/bin/$bin not found; build Joule first:" >&2
    echo "    cmake -S . -B build -G Ninja && cmake --build build -j2" >&2
    exit 2
  fi
done
if [[ ! -x "$PYTHON" ]] || ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  echo "compare.sh: the reference needs $PYTHON with torch and numpy (Debian: python3-torch python3-numpy)" >&2
  exit 2
fi

cd "$REPO_DIR"
RESULTS_DIR="$BENCH_DIR/results"
mkdir -p "$RESULTS_DIR"
STAMP="$(date +%Y%m%d-%H%M%S)"
RESULTS="$RESULTS_DIR/compare-$STAMP.jsonl"
: > "$RESULTS"

STATE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/joule-bench.XXXXXX")"
FAILED=0
cleanup() {
  local rc=$?
  "$JOULE" --state-dir "$STATE_DIR" cluster down >/dev/null 2>&1 || true
  if [[ $rc -eq 0 && $FAILED -eq 0 ]]; then
    rm -rf "$STATE_DIR"
  else
    echo "compare.sh: cluster state and logs kept in $STATE_DIR" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Both sides on the same BLAS kernel: the one a Joule worker settles on here (its
# --blas-kernel auto: a generic fallback replaced by the CPU's best), exported as
# OPENBLAS_CORETYPE for the DDP reference's ranks and Joule's workers alike, so that the
# ratio measures the training systems, not which kernel each one's OpenBLAS happened to pick.
BLAS_INFO="$("$BUILD_DIR/bin/joule-worker" --blas-info 2>/dev/null || true)"
BLAS_LIBRARY="$(printf '%s\n' "$BLAS_INFO" | sed -n 's/^library *//p')"
BLAS_CORE="$(printf '%s\n' "$BLAS_INFO" | sed -n 's/^core *\([^ ]*\).*/\1/p')"
BLAS_OWN="$("$BUILD_DIR/bin/joule-worker" --blas-kernel keep --blas-info 2>/dev/null |
            sed -n 's/^core *\([^ ]*\).*/\1/p' || true)"
# Exported only where the worker switched (a name its check accepted): otherwise both sides
# load OpenBLAS's own choice anyway.
if [[ $BLAS_LIBRARY == OpenBLAS && -n $BLAS_CORE && $BLAS_CORE != "$BLAS_OWN" &&
      -z ${OPENBLAS_CORETYPE:-} ]]; then
  export OPENBLAS_CORETYPE="$BLAS_CORE"
fi
echo "== BLAS on both sides: ${BLAS_LIBRARY:-unknown} ${OPENBLAS_CORETYPE:-$BLAS_CORE}" \
     "(joule-worker --blas-info: $(printf '%s\n' "$BLAS_INFO" | sed -n 's/^cpu *//p'))"
echo "== Joule vs PyTorch DDP: models $MODELS, $EPOCHS epoch(s), $WORLD workers x $THREADS thread," \
     "global batch $((WORLD * LOCAL_BATCH)) (local $LOCAL_BATCH), sgd lr $LR momentum $MOMENTUM"
echo "== starting a private Joule cluster in $STATE_DIR"
"$JOULE" --state-dir "$STATE_DIR" cluster up --workers "$WORLD" --threads "$THREADS"

# Rows for the table: model joule_sps ref_sps ratio joule_acc ref_acc
ROWS=()

# CPU seconds (user + sys) of the cluster's processes (workers and coordinator) so far.
cluster_cpu_seconds() {
  local total=0 pid t
  # STATE_DIR/pids: "PID START_TICKS EXE" lines after a "#" header (client/cluster_state.h).
  while read -r pid _; do
    [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/stat" ]] || continue
    # Fields after the ")" that ends the command name: utime is the 12th, stime the 13th.
    t="$(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')"
    total=$((total + t))
  done < "$STATE_DIR/pids"
  awk -v t="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'
}

for run in $(seq 1 "$RUNS"); do
# Run k uses seed k - 1 on both sides, so medians over runs average over initialisations
# and shuffles, not just over timing noise.
SEED=$((run - 1))
for model in "${MODEL_LIST[@]}"; do
  echo
  echo "== $model: PyTorch DDP reference"
  ref_json=""
  ref_cpu=""
  if ref_out="$("$PYTHON" "$BENCH_DIR/cputime.py" "$PYTHON" "$BENCH_DIR/ddp_reference.py" \
                 "$model" "$WORLD" "$LOCAL_BATCH" "$EPOCHS" \
                 --lr "$LR" --momentum "$MOMENTUM" --threads "$THREADS" --seed "$SEED")"; then
    ref_json="$(printf '%s\n' "$ref_out" | grep '^{' | tail -n 1 || true)"
    ref_cpu="$(printf '%s\n' "$ref_out" | sed -n 's/^cpu_seconds=//p' | tail -n 1)"
  fi
  if [[ -n "$ref_json" ]]; then
    echo "$ref_json"
  else
    echo "reference run for $model failed" >&2
    FAILED=1
  fi

  echo "== $model: Joule"
  joule_status=""
  cpu_before="$(cluster_cpu_seconds)"
  job_id="$("$JOULE" --state-dir "$STATE_DIR" submit --model "$model" --workers "$WORLD" \
              --global-batch-size "$((WORLD * LOCAL_BATCH))" --epochs "$EPOCHS" --lr "$LR" \
              --momentum "$MOMENTUM" --threads "$THREADS" --seed "$SEED" --name "bench-$model" \
            | tail -n 1 | tr -d '[:space:]')" || job_id=""
  if [[ ! "$job_id" =~ ^[0-9]+$ ]]; then
    echo "joule submit for $model failed (got '$job_id')" >&2
    FAILED=1
  elif "$JOULE" --state-dir "$STATE_DIR" watch "$job_id" | tail -n 1; then
    joule_status="$("$JOULE" --state-dir "$STATE_DIR" status "$job_id")"
    joule_cpu="$(awk -v a="$cpu_before" -v b="$(cluster_cpu_seconds)" 'BEGIN { printf "%.3f", b - a }')"
    printf '%s\n' "$joule_status" | grep -E 'test accuracy .*samples/s' || true
  else
    echo "joule job $job_id ($model) did not succeed:" >&2
    "$JOULE" --state-dir "$STATE_DIR" status "$job_id" >&2 || true
    FAILED=1
  fi

  # Merge both sides into one JSON line (python: the reference needs it anyway).
  row_json="$(REF_JSON="$ref_json" JOULE_STATUS="$joule_status" JOB_ID="$job_id" \
      REF_CPU="$ref_cpu" JOULE_CPU="${joule_cpu:-}" RUN="$run" \
      MODEL="$model" EPOCHS="$EPOCHS" WORLD="$WORLD" LOCAL_BATCH="$LOCAL_BATCH" \
      LR="$LR" MOMENTUM="$MOMENTUM" THREADS="$THREADS" STAMP="$STAMP" \
      BLAS="${BLAS_LIBRARY:-unknown} ${OPENBLAS_CORETYPE:-$BLAS_CORE}" "$PYTHON" - <<'PY'
import json, os, re
env = os.environ
ref = json.loads(env["REF_JSON"]) if env["REF_JSON"] else {}
m = re.search(r"test accuracy ([0-9.]+) \(loss ([0-9.]+)\); (\d+) samples, (\d+) steps; "
              r"train ([0-9.]+) s \(([0-9.]+) samples/s\); wall ([0-9.]+) s", env["JOULE_STATUS"])
joule = {}
if m:
    joule = {"test_accuracy": float(m[1]), "test_loss": float(m[2]), "samples": int(m[3]),
             "steps": int(m[4]), "train_seconds": float(m[5]), "samples_per_second": float(m[6]),
             "wall_seconds": float(m[7])}
j_sps, r_sps = joule.get("samples_per_second"), ref.get("samples_per_second")
row = {
    "date": env["STAMP"], "model": env["MODEL"], "epochs": int(env["EPOCHS"]),
    "world": int(env["WORLD"]), "local_batch": int(env["LOCAL_BATCH"]),
    "global_batch": int(env["WORLD"]) * int(env["LOCAL_BATCH"]),
    "lr": float(env["LR"]), "momentum": float(env["MOMENTUM"]), "threads": int(env["THREADS"]),
    "cores": os.cpu_count(),
    "joule_samples_per_second": j_sps, "reference_samples_per_second": r_sps,
    "ratio_joule_over_reference": round(j_sps / r_sps, 3) if j_sps and r_sps else None,
    "joule_test_accuracy": joule.get("test_accuracy"), "reference_test_accuracy": ref.get("test_accuracy"),
    "joule_train_seconds": joule.get("train_seconds"), "reference_train_seconds": ref.get("train_seconds"),
    "joule_samples": joule.get("samples"), "reference_samples": ref.get("samples"),
    "joule_job_id": int(env["JOB_ID"]) if env["JOB_ID"].isdigit() else None,
    "run": int(env["RUN"]),
    "joule_cpu_seconds": float(env["JOULE_CPU"]) if env["JOULE_CPU"] else None,
    "reference_cpu_seconds": float(env["REF_CPU"]) if env["REF_CPU"] else None,
    "torch": ref.get("torch"),
    "blas": env["BLAS"],
}
print(json.dumps(row))
PY
  )"
  printf '%s\n' "$row_json" >> "$RESULTS"
  ROWS+=("$row_json")
done
done

echo
printf '%s\n' "${ROWS[@]}" | "$PYTHON" -c '
import json, statistics, sys
def num(v, fmt):
    return "-" if v is None else format(v, fmt)
def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None
def per_sample(r, side):
    cpu, n = r.get(side + "_cpu_seconds"), r.get(side + "_samples")
    return cpu / n * 1e6 if cpu is not None and n else None
by_model = {}
for line in sys.stdin:
    r = json.loads(line)
    r["joule_cpu_us"] = per_sample(r, "joule")
    r["reference_cpu_us"] = per_sample(r, "reference")
    by_model.setdefault(r["model"], []).append(r)
head = ("model", "runs", "joule samples/s", "reference samples/s", "ratio",
        "joule CPU us/sample", "reference CPU us/sample", "joule accuracy", "reference accuracy")
rows = [head]
for model, rs in by_model.items():
    j, ref = med(rs, "joule_samples_per_second"), med(rs, "reference_samples_per_second")
    rows.append((model, str(len(rs)), num(j, ",.0f"), num(ref, ",.0f"),
                 num(j / ref if j and ref else None, ".2f"),
                 num(med(rs, "joule_cpu_us"), ",.1f"), num(med(rs, "reference_cpu_us"), ",.1f"),
                 num(med(rs, "joule_test_accuracy"), ".4f"),
                 num(med(rs, "reference_test_accuracy"), ".4f")))
w = [max(len(r[i]) for r in rows) for i in range(len(head))]
print("medians over runs; CPU us/sample = user+sys of all processes / training samples")
for k, r in enumerate(rows):
    print(" | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    if k == 0:
        print("-+-".join("-" * x for x in w))
'
echo
echo "results: ${RESULTS#"$REPO_DIR"/}"
if [[ $FAILED -ne 0 ]]; then
  echo "compare.sh: some runs failed (see above)" >&2
  exit 1
fi
