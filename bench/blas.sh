#!/usr/bin/env bash
# The BLAS choices a Debian 12 user has under the same LibTorch, on the models' own GEMM
# shapes (joule-bench-blas): OpenBLAS's pthread build (the default) with each kernel this
# CPU runs, OpenBLAS's OpenMP build, BLIS (pthread), and the reference BLAS, one thread.
#
#   bash bench/blas.sh [--build-dir build] [--threads 1] [--seconds 0.3]
#
# The libraries not installed are fetched from Debian's archive with `apt-get download`
# into a temporary directory and unpacked there (`dpkg -x`): nothing is installed, nothing
# kept. Prints a table (GFLOP/s per shape; flop/cycle at the clock /proc/cpuinfo gives) and
# writes the JSON lines to bench/results/blas-STAMP.jsonl.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "$0")" && pwd)"
REPO_DIR="$(dirname "$BENCH_DIR")"
BUILD_DIR="$REPO_DIR/build"
THREADS=1
SECONDS_PER_SHAPE=0.3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --seconds) SECONDS_PER_SHAPE="$2"; shift 2 ;;
    *) echo "blas.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
BENCH="$BUILD_DIR/bin/joule-bench-blas"
[[ -x $BENCH ]] || { echo "blas.sh: $BENCH not found; build Joule first" >&2; exit 2; }
ARCH_LIB=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/joule-blas.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
( cd "$WORK" && apt-get download libopenblas0-openmp libblis4-pthread >/dev/null 2>&1 ) ||
  echo "blas.sh: apt-get download failed: OpenMP OpenBLAS and BLIS left out" >&2
for deb in "$WORK"/*.deb; do [[ -e $deb ]] && dpkg -x "$deb" "$WORK/root"; done

STAMP="$(date +%Y%m%d-%H%M%S)"
mkdir -p "$BENCH_DIR/results"
RESULTS="$BENCH_DIR/results/blas-$STAMP.jsonl"
: > "$RESULTS"

run() {  # LABEL LIBRARY_DIR [OPENBLAS_CORETYPE]
  local label="$1" dir="$2" core="${3:-}"
  [[ -e $dir/libblas.so.3 ]] || { echo "blas.sh: $label: no $dir/libblas.so.3" >&2; return 0; }
  env LD_LIBRARY_PATH="$dir" ${core:+OPENBLAS_CORETYPE="$core"} \
      "$BENCH" --threads "$THREADS" --seconds "$SECONDS_PER_SHAPE" 2>/dev/null |
    sed "s/^{/{\"variant\": \"$label\", /" >> "$RESULTS" ||
    echo "blas.sh: $label failed" >&2
}

# OpenBLAS (pthread): its own choice, then every kernel this CPU runs (the worker's table).
run "openblas-pthread" "$ARCH_LIB/openblas-pthread"
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
cores=(PRESCOTT SANDYBRIDGE)
[[ $flags == *" avx2 "* && $flags == *" fma "* ]] && cores+=(HASWELL)
[[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512vl "* ]] && cores+=(SKYLAKEX)
for core in "${cores[@]}"; do run "openblas-pthread $core" "$ARCH_LIB/openblas-pthread" "$core"; done
run "openblas-openmp" "$WORK/root$ARCH_LIB/openblas-openmp"
run "blis-pthread" "$WORK/root$ARCH_LIB/blis-pthread"
run "reference" "$ARCH_LIB/blas"

echo "== sgemm GFLOP/s, $THREADS thread(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
     "at $(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2 | xargs) MHz (flop/cycle in brackets)"
python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
shapes = list(dict.fromkeys(r["shape"] for r in rows))
variants = list(dict.fromkeys(r["variant"] for r in rows))
cell = {(r["variant"], r["shape"]): r for r in rows}
head = ["variant (core)"] + shapes
table = [head]
for v in variants:
    any_row = next(r for r in rows if r["variant"] == v)
    line = [f'{v} ({any_row["core"] or "-"})']
    for s in shapes:
        r = cell.get((v, s))
        line.append("-" if r is None else
                    f'{r["gflops"]:.1f} [{r["flops_per_cycle"]:.1f}]' + ("" if r["check_ok"] else " WRONG"))
    table.append(line)
w = [max(len(t[i]) for t in table) for i in range(len(head))]
for k, t in enumerate(table):
    print(" | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(t)))
    if k == 0:
        print("-+-".join("-" * x for x in w))
PY
echo "results: ${RESULTS#"$REPO_DIR"/}"
