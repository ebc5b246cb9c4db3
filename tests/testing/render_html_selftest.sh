#!/usr/bin/env bash
# Self-test of tests/testing/render_html.py, the headless-Chromium checker of Joule's HTML
# reports. Builds, in a temporary directory, pages that follow the report contract (plots in
# <div class="joule-plot" id=... data-title=...>, drawn by vegaEmbed with the vendored
# third_party/vega/*.min.js inlined in <script> elements, body data-rendered set once all have
# rendered), and checks that:
#   - a good page (a line chart with series "rank 0" and "rank 1", and a bar chart) passes,
#     with its EXPECT and a screenshot;
#   - the checker fails, naming the cause, for (a) an invalid spec (mark "nonsense": the page
#     reports it with console.error), (b) a script that throws, (c) an EXPECT naming a series
#     the plot does not have, (d) a blank page (nothing rendered, white screenshot) and (e) a
#     page whose plots are in the DOM but invisible (blank screenshot only).
# Exits 0 when all hold, 1 otherwise, 77 (ctest skip) when chromium is not installed.
# PYTHON overrides the interpreter (default /usr/bin/python3, which has Debian's python3-pil);
# RENDER_HTML_SELFTEST_KEEP=1 keeps the temporary directory (pages, screenshots, outputs).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
checker="${here}/render_html.py"
python="${PYTHON:-/usr/bin/python3}"
vega_dir="${root}/third_party/vega"

work="$(mktemp -d "${TMPDIR:-/tmp}/render_html_selftest.XXXXXX")"
if [[ -n "${RENDER_HTML_SELFTEST_KEEP:-}" ]]; then
  echo "render_html_selftest: keeping the pages, screenshots and outputs in ${work}"
else
  trap 'rm -rf "${work}"' EXIT
fi

started=${SECONDS}
failed=0

# inline_js FILE: the file's text, safe inside <script>...</script> ("</script" -> "<\/script").
inline_js() {
  sed 's#</\(script\)#<\\/\1#gI' "$1"
}

# make_page OUT HEAD_EXTRA BODY_EXTRA: a report with two plots, "loss" (a line chart, series
# "rank 0" and "rank 1") and "tput" (a bar chart, three bars). HEAD_EXTRA goes at the end of
# <head> (style), BODY_EXTRA after the rendering script. MARK overrides the bar chart's mark.
make_page() {
  local out="$1" head_extra="$2" body_extra="$3" lib
  {
    printf '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
    printf '<title>Joule report (render_html self-test)</title>\n'
    for lib in vega vega-lite vega-embed; do
      printf '<script>'
      inline_js "${vega_dir}/${lib}.min.js"
      printf '</script>\n'
    done
    printf '%s\n' "${head_extra}"
    cat <<EOF
</head><body>
<h1>Joule report</h1>
<div class="joule-plot" id="loss" data-title="Loss per rank"></div>
<div class="joule-plot" id="tput" data-title="Throughput per worker"></div>
<script>
"use strict";
const specs = {
  loss: {
    "\$schema": "https://vega.github.io/schema/vega-lite/v6.json",
    title: "Loss per rank", width: 400, height: 200, mark: "line",
    data: {values: [
      {step: 0, rank: "rank 0", loss: 2.0}, {step: 1, rank: "rank 0", loss: 1.4},
      {step: 2, rank: "rank 0", loss: 1.1}, {step: 3, rank: "rank 0", loss: 0.9},
      {step: 0, rank: "rank 1", loss: 2.1}, {step: 1, rank: "rank 1", loss: 1.5},
      {step: 2, rank: "rank 1", loss: 1.0}, {step: 3, rank: "rank 1", loss: 0.8}]},
    encoding: {
      x: {field: "step", type: "quantitative", title: "Step"},
      y: {field: "loss", type: "quantitative", title: "Training loss"},
      color: {field: "rank", type: "nominal", title: "Rank"}}
  },
  tput: {
    "\$schema": "https://vega.github.io/schema/vega-lite/v6.json",
    title: "Throughput per worker", width: 300, height: 200, mark: "${MARK:-bar}",
    data: {values: [{worker: "worker-a", rate: 10}, {worker: "worker-b", rate: 14},
                    {worker: "worker-c", rate: 7}]},
    encoding: {
      x: {field: "worker", type: "nominal", title: "Worker"},
      y: {field: "rate", type: "quantitative", title: "Samples/s"}}
  }
};
const plots = Array.from(document.querySelectorAll("div.joule-plot"));
Promise.all(plots.map(div =>
    vegaEmbed(div, specs[div.id], {renderer: "svg", actions: false}).catch(err => {
      console.error("joule: plot " + div.id + " failed to render: " + err);
      throw err;
    })))
  .then(() => { document.body.dataset.rendered = String(plots.length); },
        () => {});
</script>
EOF
    printf '%s\n</body></html>\n' "${body_extra}"
  } >"${out}"
}

# expect_pass NAME ARGS...: the checker must exit 0.
expect_pass() {
  local name="$1" rc=0
  shift
  "${python}" "${checker}" "$@" 2>"${work}/${name}.err" || rc=$?
  if [[ ${rc} -eq 77 ]]; then
    cat "${work}/${name}.err" >&2
    echo "render_html_selftest: SKIP: the checker cannot run here (see above)" >&2
    exit 77
  fi
  if [[ ${rc} -ne 0 ]]; then
    echo "render_html_selftest: FAIL: ${name}: expected success, got exit ${rc}:" >&2
    sed 's/^/    /' "${work}/${name}.err" >&2
    failed=1
  else
    echo "render_html_selftest: ok: ${name} passes"
  fi
}

# expect_fail NAME NEEDLE ARGS...: the checker must exit 1, with NEEDLE in a FAIL line.
expect_fail() {
  local name="$1" needle="$2" rc=0
  shift 2
  "${python}" "${checker}" "$@" 2>"${work}/${name}.err" || rc=$?
  if [[ ${rc} -ne 1 ]]; then
    echo "render_html_selftest: FAIL: ${name}: expected exit 1, got ${rc}:" >&2
    sed 's/^/    /' "${work}/${name}.err" >&2
    failed=1
  elif ! grep -F -- "FAIL:" "${work}/${name}.err" | grep -qF -- "${needle}"; then
    echo "render_html_selftest: FAIL: ${name}: failed, but no FAIL line says '${needle}':" >&2
    sed 's/^/    /' "${work}/${name}.err" >&2
    failed=1
  else
    echo "render_html_selftest: ok: ${name} fails: $(grep -F -- "${needle}" \
      "${work}/${name}.err" | head -n 1 | sed 's/^render_html: FAIL: [^:]*: //')"
  fi
}

for lib in vega vega-lite vega-embed; do
  if [[ ! -s "${vega_dir}/${lib}.min.js" ]]; then
    echo "render_html_selftest: FAIL: ${vega_dir}/${lib}.min.js is missing" >&2
    exit 1
  fi
done

cat >"${work}/good.json" <<'EOF'
{"plots": {
  "loss": {"min_marks": 2, "series": ["rank 0", "rank 1"],
           "texts": ["Loss per rank", "Step", "Training loss", "Rank"]},
  "tput": {"min_marks": 3, "texts": ["Throughput per worker", "Worker", "Samples/s"]}}}
EOF
cat >"${work}/no_such_series.json" <<'EOF'
{"plots": {"loss": {"min_marks": 2, "series": ["rank 0", "rank 2"]}}}
EOF

make_page "${work}/good.html" "" ""
MARK=nonsense make_page "${work}/invalid_spec.html" "" ""
make_page "${work}/throws.html" "" \
  '<script>throw new Error("deliberate failure in a report script");</script>'
make_page "${work}/invisible.html" \
  '<style>.joule-plot svg { visibility: hidden; }</style>' ""
cat >"${work}/blank.html" <<'EOF'
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>blank</title></head><body>
<div class="joule-plot" id="loss" data-title="Loss per rank"></div>
</body></html>
EOF

expect_pass good "${work}/good.html" --expect "${work}/good.json" \
  --screenshot "${work}/good.png"
expect_fail invalid_spec "console.error" "${work}/invalid_spec.html" \
  --expect "${work}/good.json"
expect_fail throws "uncaught exception: Error: deliberate failure" "${work}/throws.html" \
  --expect "${work}/good.json"
expect_fail no_such_series "series 'rank 2' is not a legend label" "${work}/good.html" \
  --expect "${work}/no_such_series.json"
expect_fail blank "the screenshot is blank" "${work}/blank.html" \
  --screenshot "${work}/blank.png"
expect_fail blank_not_rendered "no data-rendered attribute" "${work}/blank.html"
expect_fail invisible "plot 'loss' looks blank in the screenshot" "${work}/invisible.html" \
  --expect "${work}/good.json" --screenshot "${work}/invisible.png"

elapsed=$((SECONDS - started))
if [[ ${failed} -ne 0 ]]; then
  echo "render_html_selftest: FAILED (${elapsed}s)" >&2
  exit 1
fi
echo "render_html_selftest: all checks passed (${elapsed}s)"
