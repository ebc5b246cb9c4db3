#!/usr/bin/env bash
# Self-test of tests/testing/browse.py, the headless-Chromium driver of live pages on loopback.
# Starts a small HTTP server (Python's http.server on 127.0.0.1 and a free port) and checks that:
#   - a page that counts (a <span id=n> and window.jouleStats every 300 ms, and a fetch() of
#     its server every 250 ms) passes two --wait-js in order, its --eval-js prints the count as
#     JSON on stdout, and its screenshot is not blank;
#   - a page that calls console.error, one whose script throws, one that fetches a missing
#     resource (404) and a blank page with --screenshot fail, naming the cause;
#   - a page that fetches http://198.18.0.1/ (another origin) fails, and so do pages (and a
#     worker) that fetch the same server under another origin (http://localhost:PORT/): those
#     requests never reach the server;
#   - /secret (401 unless "Authorization: Bearer t0k") passes with that --header, passes
#     without it only with --expect-status 401, and fails without it by default;
#   - a --wait-js that never becomes true fails within --timeout 20 (the run takes < 50 s), and
#     SIGINT ends a run with a FAIL line;
#   - usage errors exit 2, and no Chromium process or temporary profile is left behind.
# Exits 0 when all hold, 1 otherwise, 77 (ctest skip) when chromium is not installed.
# PYTHON overrides the interpreter (default /usr/bin/python3, which has Debian's python3-pil);
# BROWSE_SELFTEST_KEEP=1 keeps the temporary directory (server log, screenshots, outputs).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
browse="${here}/browse.py"
python="${PYTHON:-/usr/bin/python3}"

if [[ -n "${JOULE_CHROMIUM:-}" ]]; then
  if [[ ! -x "${JOULE_CHROMIUM}" ]]; then
    echo "browse_selftest: SKIP: JOULE_CHROMIUM=${JOULE_CHROMIUM} is not a program" >&2
    exit 77
  fi
elif [[ ! -x /usr/bin/chromium ]] && ! command -v chromium >/dev/null &&
  ! command -v chromium-browser >/dev/null; then
  echo "browse_selftest: SKIP: chromium is not installed (apt-get install chromium)" >&2
  exit 77
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/browse_selftest.XXXXXX")"
# browse.py makes its Chromium profiles here, so that leftovers can be seen.
profiles="${work}/tmp"
mkdir "${profiles}"
server_pid=""
cleanup() {
  if [[ -n "${server_pid}" ]]; then
    kill "${server_pid}" 2>/dev/null || true
    wait "${server_pid}" 2>/dev/null || true
  fi
  if [[ -n "${BROWSE_SELFTEST_KEEP:-}" ]]; then
    echo "browse_selftest: kept the server log, screenshots and outputs in ${work}"
  else
    rm -rf "${work}"
  fi
}
trap cleanup EXIT

started=${SECONDS}
failed=0

cat >"${work}/server.py" <<'EOF'
"""The self-test's server: PAGES by path, /secret behind a bearer token, every request logged
(path and Authorization header) to LOG. Writes its port to PORT_FILE once it listens."""
import http.server
import os
import sys

port_file, log_file = sys.argv[1], sys.argv[2]
HEAD = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>%s</title></head>'
PAGES = {
    "/counter": """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>counter</title>
<style>body { font: 32px sans-serif; } h1 { background: #246; color: #fff; padding: 16px; }</style>
</head><body><h1>Joule browse self-test</h1><p>points: <span id="n">0</span></p>
<script>
"use strict";
let n = 0;
window.jouleStats = {points: 0};
setInterval(() => {
  n += 1;
  document.getElementById("n").textContent = String(n);
  window.jouleStats = {points: n};
}, 300);
setInterval(() => { fetch("/api/ping").then(r => r.text()); }, 250);
console.log("counter page up");
</script></body></html>""",
    "/console-error": HEAD % "console.error" +
        '<body><p>x</p><script>console.error("deliberate console.error");</script></body></html>',
    "/throws": HEAD % "throws" +
        '<body><p>x</p><script>throw new Error("deliberate failure");</script></body></html>',
    "/missing": HEAD % "missing" +
        '<body><p>x</p><script>fetch("/no-such-thing").then(r => r.text());</script></body></html>',
    "/other-origin": HEAD % "other origin" +
        '<body><p>x</p><script>fetch("http://198.18.0.1/").catch(() => {});</script></body></html>',
    "/blank": HEAD % "blank" + "<body></body></html>",
    # The same server under another origin: from the page, and from a worker.
    "/other-port": HEAD % "other port" +
        '<body><p>x</p><script>fetch("http://localhost:PORT/leak").catch(() => {});</script>'
        "</body></html>",
    # The page is done once the worker has tried its request (the run waits for that with
    # --wait-js, not for a settle time the worker may outlast).
    "/worker-other-port": HEAD % "worker" +
        "<body><p>x</p><script>const w = new Worker(URL.createObjectURL(new Blob("
        "['fetch(\"http://localhost:PORT/leak-worker\").catch(() => {})"
        ".finally(() => postMessage(1));'], "
        '{type: "text/javascript"}))); w.onmessage = () => { window.__tried = true; };'
        "</script></body></html>",
}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log_file, "a", encoding="utf-8") as log:
            log.write("%s %s\n" % (self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        if path == "/api/ping":
            self.answer(200, "pong", "text/plain")
        elif path == "/secret":
            if self.headers.get("Authorization") == "Bearer t0k":
                self.answer(200, HEAD % "secret" + '<body><p id="s">the secret</p></body></html>')
            else:
                self.answer(401, HEAD % "401" + "<body><p>a token is required</p></body></html>")
        elif path in PAGES:
            self.answer(200, PAGES[path].replace("PORT", str(self.server.server_address[1])))
        else:
            self.answer(404, "not found", "text/plain")

    def answer(self, code, body, content_type="text/html; charset=utf-8"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_file + ".tmp", "w", encoding="utf-8") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
EOF

"${python}" "${work}/server.py" "${work}/port" "${work}/requests.log" \
  >"${work}/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  [[ -s "${work}/port" ]] && break
  sleep 0.1
done
if [[ ! -s "${work}/port" ]]; then
  echo "browse_selftest: FAIL: the test server did not start:" >&2
  sed 's/^/    /' "${work}/server.out" >&2
  exit 1
fi
base="http://127.0.0.1:$(cat "${work}/port")"

# run NAME ARGS...: runs browse.py (stdout to NAME.out, stderr to NAME.err); sets rc and took.
rc=0
took=0
run() {
  local name="$1" start=${SECONDS}
  shift
  rc=0
  TMPDIR="${profiles}" "${python}" "${browse}" "$@" >"${work}/${name}.out" \
    2>"${work}/${name}.err" || rc=$?
  took=$((SECONDS - start))
  if [[ ${rc} -eq 77 ]]; then
    cat "${work}/${name}.err" >&2
    echo "browse_selftest: SKIP: browse.py cannot run here (see above)" >&2
    exit 77
  fi
}

fail() {
  local name="$1" why="$2"
  echo "browse_selftest: FAIL: ${name}: ${why}:" >&2
  sed 's/^/    /' "${work}/${name}.out" "${work}/${name}.err" >&2
  failed=1
}

# expect_pass NAME ARGS...: browse.py must exit 0.
expect_pass() {
  local name="$1"
  shift
  run "${name}" "$@"
  if [[ ${rc} -ne 0 ]]; then
    fail "${name}" "expected success, got exit ${rc}"
    return 1
  fi
  echo "browse_selftest: ok: ${name} passes (${took}s)"
}

# expect_fail NAME NEEDLE ARGS...: browse.py must exit 1, with NEEDLE in a FAIL line.
expect_fail() {
  local name="$1" needle="$2"
  shift 2
  run "${name}" "$@"
  if [[ ${rc} -ne 1 ]]; then
    fail "${name}" "expected exit 1, got ${rc}"
    return 1
  elif ! grep -F -- "browse: FAIL:" "${work}/${name}.err" | grep -qF -- "${needle}"; then
    fail "${name}" "failed, but no FAIL line says '${needle}'"
    return 1
  fi
  echo "browse_selftest: ok: ${name} fails (${took}s): $(grep -F -- "${needle}" \
    "${work}/${name}.err" | head -n 1 | sed 's/^browse: FAIL: //')"
}

# never_requested NAME PATH: the server never saw PATH.
never_requested() {
  if grep -q "^$2 " "${work}/requests.log"; then
    echo "browse_selftest: FAIL: $1: the server was asked for $2: it was not blocked" >&2
    failed=1
  fi
}

count_js="document.getElementById('n').textContent"
if expect_pass counter "${base}/counter" --wait-js "(window.__n = jouleStats.points) >= 2" \
  --wait-js "jouleStats.points > window.__n" --eval-js "${count_js}" \
  --screenshot "${work}/counter.png"; then
  # The second wait saw the count pass the first's, which was at least 2.
  if ! grep -qxE '\{"document\.getElementById\('"'n'"'\)\.textContent": "([3-9]|[1-9][0-9]+)"\}' \
    "${work}/counter.out"; then
    fail counter "stdout is not {\"${count_js}\": \"<count >= 3>\"}"
  fi
  if ! grep -q "^/api/ping " "${work}/requests.log"; then
    fail counter "the page's fetch() of /api/ping never reached the server"
  fi
fi
expect_fail console_error "console.error: deliberate console.error" "${base}/console-error" || true
expect_fail throws "uncaught exception: Error: deliberate failure" "${base}/throws" || true
expect_fail missing "HTTP 404 for ${base}/no-such-thing" "${base}/missing" || true
expect_fail blank "the screenshot is blank" "${base}/blank" --screenshot "${work}/blank.png" ||
  true
expect_fail other_origin "the page requested http://198.18.0.1/: another origin" \
  "${base}/other-origin" || true
port="$(cat "${work}/port")"
expect_fail other_port "the page requested http://localhost:${port}/leak: another origin" \
  "${base}/other-port" || true
never_requested other_port /leak
expect_fail worker_other_port \
  "the page requested http://localhost:${port}/leak-worker: another origin" \
  "${base}/worker-other-port" --wait-js 'window.__tried === true' || true
never_requested worker_other_port /leak-worker

if expect_pass secret_with_token "${base}/secret" --header "Authorization: Bearer t0k" \
  --eval-js "document.getElementById('s').textContent"; then
  if ! grep -qxF '{"document.getElementById('"'s'"').textContent": "the secret"}' \
    "${work}/secret_with_token.out"; then
    fail secret_with_token "stdout does not show the secret"
  fi
fi
expect_pass secret_401_expected "${base}/secret" --expect-status 401 || true
expect_fail secret_401_unexpected "answered HTTP 401, expected 200" "${base}/secret" || true

# --timeout covers chromium's start and the page's load too: 20 s leaves a loaded machine
# (a CI running two tests beside it took over 3 s to load the page; beside a training test
# on both cores, more) time to reach the wait that is meant to fail.
if expect_fail never_true "--wait-js 'window.__never === true' did not become true" \
  "${base}/counter" --timeout 20 --wait-js "jouleStats.points >= 1" \
  --wait-js "window.__never === true"; then
  if [[ ${took} -ge 50 ]]; then
    fail never_true "took ${took}s with --timeout 20"
  fi
fi

# SIGINT in the middle of a wait: a FAIL line, and everything cleaned up (checked below).
requests_before=$(grep -c '/counter' "${work}/requests.log" || true)
TMPDIR="${profiles}" "${python}" "${browse}" "${base}/counter" --timeout 30 \
  --wait-js "window.__never === true" >"${work}/sigint.out" 2>"${work}/sigint.err" &
browse_pid=$!
# Interrupt once the page has been requested (the run is in its wait), at most 20 s on.
for _ in $(seq 200); do
  [[ $(grep -c '/counter' "${work}/requests.log" || true) -gt ${requests_before} ]] && break
  sleep 0.1
done
kill -INT "${browse_pid}"
rc=0
wait "${browse_pid}" || rc=$?
if [[ ${rc} -ne 1 ]] || ! grep -qF "browse: FAIL: interrupted by SIGINT" "${work}/sigint.err"; then
  fail sigint "expected exit 1 and 'interrupted by SIGINT', got exit ${rc}"
else
  echo "browse_selftest: ok: sigint ends the run: interrupted by SIGINT"
fi

for args in "http://example.com/" "${base}/counter --header NoColon" \
  "${base}/counter --cookie novalue" "${base}/counter --timeout 0"; do
  # shellcheck disable=SC2086  # the words of args are the arguments
  run usage ${args}
  if [[ ${rc} -ne 2 ]]; then
    fail usage "browse.py ${args}: expected exit 2, got ${rc}"
  fi
done
echo "browse_selftest: ok: usage errors exit 2"

# Nothing left behind: no Chromium with a profile of ours, no profile. Exited processes
# stay visible until they are reaped: give that up to 5 s.
for _ in $(seq 50); do
  pgrep -f -- "${profiles}/" >/dev/null || break
  sleep 0.1
done
if pgrep -f -- "${profiles}/" >"${work}/leftover.pids"; then
  echo "browse_selftest: FAIL: processes left behind: $(tr '\n' ' ' <"${work}/leftover.pids")" >&2
  failed=1
fi
if [[ -n "$(ls -A "${profiles}")" ]]; then
  echo "browse_selftest: FAIL: temporary files left behind: $(ls -A "${profiles}")" >&2
  failed=1
fi

elapsed=$((SECONDS - started))
if [[ ${failed} -ne 0 ]]; then
  echo "browse_selftest: FAILED (${elapsed}s)" >&2
  exit 1
fi
echo "browse_selftest: all checks passed (${elapsed}s)"
