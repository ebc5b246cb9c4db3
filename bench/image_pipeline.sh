#!/usr/bin/env bash
# Decoded and augmented images/s per core: Joule's imagefolder: pipeline (joule-bench-images)
# beside torchvision + PIL (image_pipeline_reference.py), same files, same transforms
# (RandomResizedCrop(224, scale=(0.08, 1)), flip, normalise), one core each, in one run.
#
#   bash bench/image_pipeline.sh [--build-dir build] [--images 1500] [--side 448] [--dir DIR]
#
# Without --dir it writes an ImageFolder from Fashion-MNIST at ImageNet-like sizes
# (scripts/make-imagefolder.py, --side pixels square, JPEG as ImageNet) into a temporary
# directory. Appends the lines to bench/results/images-<date>.jsonl and prints a table.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$here/../build"
images=1500
side=448
dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --images) images="$2"; shift 2 ;;
    --side) side="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) echo "image_pipeline.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin="$build/bin/joule-bench-images"
if [[ ! -x "$bin" ]]; then
  echo "image_pipeline.sh: $bin is missing: cmake --build $build -j2 --target joule-bench-images" >&2
  exit 2
fi
if ! /usr/bin/python3 -c "import torchvision, PIL" 2>/dev/null; then
  echo "image_pipeline.sh: needs Debian's python3-torchvision and python3-pil" >&2
  exit 2
fi
tmp=""
cleanup() { [[ -n "$tmp" ]] && rm -rf "$tmp"; }
trap cleanup EXIT
if [[ -z "$dir" ]]; then
  tmp="$(mktemp -d)"
  dir="$tmp/folder"
  /usr/bin/python3 "$here/../scripts/make-imagefolder.py" "$dir" --train-per-class 60 \
    --val-per-class 1 --side "$side" --format jpg >/dev/null
fi
mkdir -p "$here/results"
out="$here/results/images-$(date +%Y%m%d-%H%M%S).jsonl"
{
  echo "{\"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')\", \"side\": $side}"
  taskset -c 0 "$bin" "$dir" --images "$images" --threads 1
  taskset -c 0 "$bin" "$dir" --images "$images" --threads 1 --exact-decode
  taskset -c 0 /usr/bin/python3 "$here/image_pipeline_reference.py" "$dir" --images "$images"
} | tee "$out"
/usr/bin/python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"pipeline"' in l]
ref = next(r for r in rows if r["pipeline"] == "torchvision-pil")
print(f"\n{'pipeline':<24}{'images/s/core':>14}{'vs PIL':>8}")
for r in rows:
    name = r["pipeline"] + (" (exact decode)" if r.get("exact_decode") else "")
    v = r["images_per_second_per_thread"]
    print(f"{name:<24}{v:>14.1f}{v / ref['images_per_second_per_thread']:>7.2f}x")
EOF
