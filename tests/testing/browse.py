#!/usr/bin/python3
"""Drives a LIVE web page served over HTTP on loopback (the coordinator's web UI) in a real
headless Chromium, for integration tests.

Usage: browse.py URL [--header "Name: value"]... [--cookie name=value]... [--wait-js EXPR]...
                 [--eval-js EXPR]... [--screenshot OUT.png] [--timeout SECONDS] [--expect-status
                 CODE] [-v]

URL is http(s)://127.0.0.1[:PORT]/... or http(s)://localhost[:PORT]/...; its origin (scheme,
host and port) is the only one the page may contact. The page runs in real time (it may poll
its server every second and update itself). In order:

  * every --header is sent with every request of the page (Network.setExtraHTTPHeaders: e.g.
    "Authorization: Bearer TOKEN"), every --cookie is set for the URL's origin, and URL is
    loaded; its main document must answer HTTP --expect-status (default 200), and the page
    must fire its load event;
  * each --wait-js EXPR, in order, is evaluated in the page (awaiting a promise) every 200 ms
    until its value is truthy in JavaScript's sense; an exception counts as a falsy value.
    Expressions may keep things on window for later ones: "(window.__n = jouleStats.points) >=
    2", then "jouleStats.points > window.__n";
  * each --eval-js EXPR is evaluated, and {"EXPR": value, ...} is printed on stdout as one line
    of JSON (undefined as null, NaN, Infinity and BigInts as strings);
  * with --screenshot, the whole page (at least 1280x800 CSS px) is written to OUT.png, which
    must not be blank: more than --min-ink (2%) of its pixels differ from the most common colour
    and it has more than 3 distinct colours (render_html.py's check for a page).

The run fails, as soon as it happens, on: a console.error or failed console.assert; an uncaught
exception or unhandled promise rejection; a browser error in the page's log; a subresource that
fails to load or answers HTTP >= 400 (but /favicon.ico, which Chromium asks for by itself); any
request to another origin (it is blocked, and reported once per URL); a renderer crash; the page
not loading, or a --wait-js not becoming true, within --timeout seconds (default 20, for the
whole run); an --eval-js that throws. What the browser logs about the main document's own status
(such as "Failed to load resource: the server responded with a status of 401") is no failure in
itself: that status is checked against --expect-status, so a 401 page passes with
--expect-status 401 (-v prints what was logged).

Nothing leaves the machine: Chromium resolves no name and no address but 127.0.0.1 and localhost
(--host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"), uses no proxy,
and every request of the page and of its workers is intercepted (Fetch domain) and failed unless
it is to URL's origin, so another port on loopback is out of reach too.

Exit status: 0 when it passed; 1 with one "browse: FAIL: ..." line per failure on stderr (also
when interrupted by SIGINT, SIGTERM or SIGHUP); 2 for a usage error; 77 (ctest's skip code) when
chromium, or PIL for --screenshot, is not installed. Chromium and its temporary profile are
removed on every way out (if this script is killed with SIGKILL, Chromium still dies with it, but
the profile, browse.* in $TMPDIR, stays). Standard library only (and Debian's python3-pil for
--screenshot); run it with /usr/bin/python3. Shares its DevTools plumbing (cdp_pipe.py) with
render_html.py.
"""

import argparse
import base64
import contextlib
import importlib.util
import io
import json
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp_pipe import (SKIP, Browser, BrowserError, blank_failure, find_chromium,  # noqa: E402
                      location, one_line, remote_object_text)

VIEWPORT = (1280, 800)
MAX_SCREENSHOT_HEIGHT = 16384
POLL_S = 0.2
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
RESOLVER_RULES = "MAP * ~NOTFOUND, " + ", ".join("EXCLUDE " + h for h in LOOPBACK_HOSTS)
CHROMIUM_FLAGS = [
    "--host-resolver-rules=" + RESOLVER_RULES,  # every other name and IP literal: unreachable
    "--no-proxy-server",  # whatever http_proxy says
    "--window-size=%d,%d" % VIEWPORT,
]
# URLs that never reach the network (Fetch does not intercept them).
LOCAL_SCHEMES = ("data:", "blob:", "about:")
DEFAULT_PORTS = {"http": 80, "https": 443}
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Usage(Exception):
    """A usage error: exit status 2."""


class Unusable(Exception):
    """An expression whose value cannot be used: one failure line."""


class Interrupted(BaseException):
    """A signal asked the run to stop (BaseException: no `except Exception` swallows it)."""


def say(text):
    print("browse: " + text, file=sys.stderr, flush=True)


def origin_of(url):
    """(scheme, host, port) of an http(s) or ws(s) URL, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            return None
        return scheme, parts.hostname.lower(), parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# JavaScript values, as Runtime.evaluate returns them with returnByValue.


def js_value(obj):
    """A RemoteObject as JSON: undefined is null, NaN/Infinity/-0/BigInts are strings."""
    if "value" in obj:
        return obj["value"]
    if "unserializableValue" in obj:
        return obj["unserializableValue"]
    if obj.get("type") == "undefined":
        return None
    return obj.get("description") or obj.get("type")


def js_truthy(obj):
    kind = obj.get("type")
    if kind == "undefined":
        return False
    if "unserializableValue" in obj:  # NaN, Infinity, -Infinity, -0, 123n
        return obj["unserializableValue"] not in ("NaN", "-0", "0n")
    if kind == "object":
        return obj.get("subtype") != "null"
    if kind in ("boolean", "number", "string"):
        return bool(obj.get("value"))
    return True  # function, symbol


def js_show(obj):
    if obj.get("type") == "undefined":
        return "undefined"
    return one_line(json.dumps(js_value(obj)), 200)


# ---------------------------------------------------------------------------------------------
# What the page does.


class PageLog:
    """Follows the page's session (and its workers'): answers paused requests, collects errors,
    requests, responses and failed loads. failures() says what went wrong so far."""

    def __init__(self, browser, origin, headers, verbose):
        self.browser = browser
        self.origin = origin
        self.headers = headers
        self.verbose = verbose
        self.sessions = set()
        self.errors = []  # in the order they happened
        self.blocked = set()  # URLs of other origins, reported once each
        self.urls = {}  # requestId -> URL (the last of its redirects)
        self.chains = {}  # requestId -> every URL of its redirects
        self.responses = {}  # requestId -> (status, URL, resource type)
        self.load_failures = {}  # requestId -> (URL, errorText, canceled, resource type)
        self.log_errors = []  # Log.entryAdded entries at level "error"
        self.main_request = None
        self.loaded = False
        self.sent = set()  # ids of commands sent without waiting for their answer
        self.noted = set()  # what note() said once
        self.favicon = "%s://%s:%d/favicon.ico" % origin

    def send(self, method, params, session):
        self.sent.add(self.browser.send(method, params, session))

    def note(self, text):
        if self.verbose:
            say(text)

    def allowed(self, url):
        return url.startswith(LOCAL_SCHEMES) or origin_of(url) == self.origin

    def block(self, url, what):
        if url not in self.blocked:
            self.blocked.add(url)
            self.errors.append("%s %s: another origin than %s://%s:%d (blocked: only the URL's "
                               "origin may be contacted)" % (what, one_line(url, 200),
                                                             *self.origin))

    def start_session(self, session, worker=False):
        """Sent, in order, to the page's session before it navigates and to each of its
        workers' before it runs. The page's Fetch interception also holds its dedicated
        workers' requests (workers have no Fetch domain); their sessions report their console,
        exceptions and requests."""
        self.sessions.add(session)
        for domain in ("Runtime", "Log", "Network") + (() if worker else ("Inspector",)):
            self.send(domain + ".enable", {}, session)
        if self.headers:
            self.send("Network.setExtraHTTPHeaders", {"headers": self.headers}, session)
        if not worker:
            self.send("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session)
        self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                           "flatten": True}, session)

    def __call__(self, message):
        if "method" not in message:
            if message.get("id") in self.sent:
                self.sent.discard(message["id"])
                if "error" in message:
                    self.note("a command failed: %s" % message["error"].get("message"))
            return
        session = message.get("sessionId")
        if session not in self.sessions:
            return
        method = message["method"]
        params = message.get("params", {})
        if method == "Fetch.requestPaused":
            url = params.get("request", {}).get("url", "")
            if self.allowed(url):
                self.send("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
            else:
                self.block(url, "the page requested")
                self.send("Fetch.failRequest", {"requestId": params["requestId"],
                                                "errorReason": "BlockedByClient"}, session)
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            self.urls[params["requestId"]] = url
            self.chains.setdefault(params["requestId"], []).append(url)
            if not self.allowed(url):
                self.block(url, "the page requested")
            if not url.startswith("data:"):
                self.note("%s %s (%s)" % (params.get("request", {}).get("method", "?"),
                                          one_line(url, 200), params.get("type", "?")))
        elif method == "Network.webSocketCreated":
            if not self.allowed(params.get("url", "")):
                # No interception for WebSockets: the resolver keeps other hosts away, but
                # another port on loopback would be reached.
                self.block(params.get("url", ""), "the page opened a WebSocket to")
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            self.responses[params["requestId"]] = (response.get("status", 0),
                                                   response.get("url", ""), params.get("type"))
            if not response.get("url", "").startswith("data:"):
                self.note("HTTP %s %s" % (response.get("status"), one_line(response.get("url"),
                                                                           200)))
        elif method == "Network.loadingFailed":
            url = self.urls.get(params["requestId"], "?")
            self.load_failures[params["requestId"]] = (
                url, params.get("errorText", "?"), params.get("canceled", False),
                params.get("type"))
            self.note("failed: %s: %s%s" % (one_line(url, 200), params.get("errorText"),
                                            " (canceled)" if params.get("canceled") else ""))
        elif method == "Runtime.consoleAPICalled":
            frames = params.get("stackTrace", {}).get("callFrames") or [{}]
            text = " ".join(remote_object_text(arg) for arg in params.get("args", []))
            where = location(frames[0].get("url"), frames[0].get("lineNumber", 0))
            if params.get("type") in ("error", "assert"):
                self.errors.append("console.%s: %s%s" % (params["type"], one_line(text), where))
            else:
                self.note("console.%s: %s%s" % (params.get("type"), one_line(text), where))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exception = details.get("exception") or {}
            text = remote_object_text(exception) if exception else details.get("text", "")
            kind = ("unhandled promise rejection" if "in promise" in details.get("text", "")
                    else "uncaught exception")
            where = location(details.get("url"), details.get("lineNumber", 0))
            self.errors.append("%s: %s%s" % (kind, one_line(text), where))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.log_errors.append(entry)
            else:
                self.note("browser %s %s: %s" % (entry.get("source"), entry.get("level"),
                                                 one_line(entry.get("text", ""))))
        elif method == "Page.loadEventFired":
            self.loaded = True
        elif method == "Page.javascriptDialogOpening":
            # An alert() would stop the page until answered.
            self.note("dialog (%s): %s" % (params.get("type"), one_line(params.get("message"))))
            self.send("Page.handleJavaScriptDialog", {"accept": True}, session)
        elif method == "Target.attachedToTarget":
            worker = params["sessionId"]
            self.note("attached to a %s: %s" % (params.get("targetInfo", {}).get("type"),
                                                one_line(params.get("targetInfo", {}).get("url"))))
            self.start_session(worker, worker=True)
            self.send("Runtime.runIfWaitingForDebugger", {}, worker)
        elif method == "Inspector.targetCrashed":
            self.errors.append("the page's renderer crashed")

    def failures(self):
        """Everything that went wrong so far, each once, in a stable order."""
        failures = list(self.errors)
        main_urls = set(self.chains.get(self.main_request, []))
        reported = set(self.blocked)
        for request, (status, url, kind) in self.responses.items():
            if url == self.favicon and status >= 400:
                reported.add(url)  # the browser asks for it unless the page names an icon
                continue
            if request != self.main_request and status >= 400:
                reported.add(url)
                failures.append("HTTP %d for %s (%s)" % (status, one_line(url, 200), kind))
        for request, (url, error, canceled, kind) in self.load_failures.items():
            if request == self.main_request or url in reported or canceled:
                continue
            reported.add(url)
            failures.append("could not load %s (%s): %s" % (one_line(url, 200), kind, error))
        for entry in self.log_errors:
            url = entry.get("url")
            text = "browser %s error: %s%s" % (entry.get("source", "?"),
                                               one_line(entry.get("text", "")),
                                               " (%s)" % url if url else "")
            if entry.get("source") == "network" and url in reported:
                continue  # said above
            if entry.get("source") == "network" and (url in main_urls or
                                                     url.startswith("chrome-error:")):
                # The main document's status is checked on its own.
                if text not in self.noted:
                    self.noted.add(text)
                    self.note("not a failure (the main document's status is checked on its "
                              "own): %s" % text)
                continue
            failures.append(text)
        return list(dict.fromkeys(failures))


# ---------------------------------------------------------------------------------------------


class Signals:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted, once: after the first one all three are
    ignored, so that closing the browser and removing its profile complete."""

    def __init__(self):
        self.pending = None
        self.holding = 0
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, self.handler)

    def handler(self, signum, _frame):
        for other in HANDLED_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        self.pending = signal.Signals(signum).name
        if not self.holding:
            raise Interrupted(self.pending)

    @contextlib.contextmanager
    def held(self):
        """Delays Interrupted to the end of the block (starting the browser)."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self.pending:
                raise Interrupted(self.pending)


def evaluate(browser, session, option, expression, deadline):
    """(RemoteObject, None) or (None, why it has no value)."""
    try:
        result = browser.call("Runtime.evaluate",
                              {"expression": expression, "returnByValue": True,
                               "awaitPromise": True}, session, deadline)
    except BrowserError as e:
        if time.monotonic() >= deadline:
            return None, ("still being evaluated at the timeout (a promise that never settled, "
                          "or a script that never returned?)")
        if "returned by value" in str(e):  # a symbol, a cyclic object, ...
            raise Unusable("%s %r: its value cannot be returned as JSON" % (option, expression))
        return None, str(e)  # the page navigating, ...
    details = result.get("exceptionDetails")
    if details:
        exception = details.get("exception")
        return None, "threw %s" % one_line(remote_object_text(exception) if exception
                                           else details.get("text", "?"), 200)
    return result.get("result", {}), None


def browse(args, chromium, origin, headers, signals):
    started = time.monotonic()
    deadline = started + args.timeout
    failures = []
    results = None
    profile = browser = log = None
    try:
        with signals.held():
            profile = tempfile.mkdtemp(prefix="browse.")
            browser = Browser(chromium, profile, deadline, args.timeout, CHROMIUM_FLAGS)
        log = PageLog(browser, origin, headers, args.verbose)
        browser.handlers.append(log)

        def failed():
            return failures or log.failures()

        targets = browser.call("Target.getTargets")["targetInfos"]
        page = next((t for t in targets if t["type"] == "page"), None)
        target_id = (page["targetId"] if page else
                     browser.call("Target.createTarget", {"url": "about:blank"})["targetId"])
        session = browser.call("Target.attachToTarget",
                               {"targetId": target_id, "flatten": True})["sessionId"]
        log.start_session(session)
        browser.call("Page.enable", session=session)
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1,
                      "mobile": False}, session)
        for name, value in args.cookie:
            browser.call("Network.setCookie", {"name": name, "value": value,
                                               "url": "%s://%s:%d/" % origin}, session)
        navigation = browser.call("Page.navigate", {"url": args.url}, session)
        log.main_request = navigation.get("loaderId")
        main = log.responses.get(log.main_request)
        error = navigation.get("errorText")
        # An error status with an empty body: Chromium shows its own error page.
        if error and not (main and error == "net::ERR_HTTP_RESPONSE_CODE_FAILURE"):
            raise BrowserError("cannot load %s: %s" % (args.url, error))
        while not log.loaded and time.monotonic() < deadline and not failed():
            browser.drain(0.05)
        main = log.responses.get(log.main_request)
        if main is None:
            failures.append("no response to the main document (%s)" % args.url)
        elif main[0] != args.expect_status:
            failures.append("%s answered HTTP %d, expected %d" %
                            (one_line(main[1], 200), main[0], args.expect_status))
        elif not log.loaded and not failed():
            failures.append("the page did not finish loading (no load event) within %gs" %
                            args.timeout)
        log.note("HTTP %d, loaded in %.2fs" % (main[0] if main else 0,
                                               time.monotonic() - started))

        for expression in args.wait_js:
            since = time.monotonic()
            last = None
            while not failed():
                value, why = evaluate(browser, session, "--wait-js", expression, deadline)
                if value is not None and js_truthy(value):
                    log.note("--wait-js %r: %s after %.2fs" % (expression, js_show(value),
                                                              time.monotonic() - since))
                    break
                shown = why or js_show(value)
                if shown != last:
                    log.note("--wait-js %r: %s" % (expression, shown))
                last = shown
                if time.monotonic() + POLL_S >= deadline:
                    failures.append("--wait-js %r did not become true within the %gs "
                                    "timeout; last value: %s" % (expression, args.timeout,
                                                                 last))
                    break
                browser.drain(POLL_S)
            if failed():
                break

        if not failed():
            results = {}
            for expression in args.eval_js:
                value, why = evaluate(browser, session, "--eval-js", expression, deadline)
                if why:
                    failures.append("--eval-js %r %s" % (expression, why))
                else:
                    results[expression] = js_value(value)

        if args.screenshot and not failed():
            size = browser.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
            height = min(MAX_SCREENSHOT_HEIGHT, max(VIEWPORT[1], int(size["height"] + 0.5)))
            clip = {"x": 0, "y": 0, "width": VIEWPORT[0], "height": height, "scale": 1}
            png = base64.b64decode(browser.call(
                "Page.captureScreenshot",
                {"format": "png", "clip": clip, "captureBeyondViewport": height > VIEWPORT[1]},
                session)["data"])
            pathlib.Path(args.screenshot).write_bytes(png)
            from PIL import Image  # Debian's python3-pil; checked for in main()
            blank = blank_failure(Image.open(io.BytesIO(png)).convert("RGB"), args.min_ink)
            if blank:
                failures.append(blank + " (%s)" % args.screenshot)
            log.note("screenshot %dx%d: %s" % (clip["width"], height, args.screenshot))
        # What the page did last (an error it logged, a response to a failed request).
        browser.drain(0.1)
        failures = log.failures() + failures
    except (BrowserError, Unusable) as e:
        failures = (log.failures() if log else []) + failures + [str(e)]
    except OSError as e:  # starting chromium, writing the screenshot
        failures = (log.failures() if log else []) + failures + [str(e)]
    except Interrupted as e:
        failures = (log.failures() if log else []) + failures + ["interrupted by %s" % e]
    finally:
        with signals.held():  # a signal now is reported once this is done
            if browser:
                browser.close()
            if profile:
                shutil.rmtree(profile, ignore_errors=True)
    return failures, results


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Drive a live page on loopback in headless Chromium (see the header of this "
                    "file). Exit 0: passed, 1: failed, 2: usage, 77: chromium missing.")
    parser.add_argument("url", help="http://127.0.0.1:PORT/... or http://localhost:PORT/...")
    parser.add_argument("--header", action="append", default=[], metavar='"NAME: VALUE"',
                        help="send this header with every request of the page")
    parser.add_argument("--cookie", action="append", default=[], metavar="NAME=VALUE",
                        help="set this cookie for the URL's origin")
    parser.add_argument("--wait-js", action="append", default=[], metavar="EXPR",
                        help="wait, in order, until each is truthy (every 200 ms)")
    parser.add_argument("--eval-js", action="append", default=[], metavar="EXPR",
                        help='at the end, print {"EXPR": value, ...} on stdout')
    parser.add_argument("--screenshot", metavar="OUT.png",
                        help="write a full-page screenshot there, and fail if it is blank")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds for the whole run (default 20)")
    parser.add_argument("--expect-status", type=int, default=200, metavar="CODE",
                        help="the main document's HTTP status (default 200)")
    parser.add_argument("--min-ink", type=float, default=0.02,
                        help="share of non-background pixels a screenshot needs (default 0.02)")
    parser.add_argument("--chromium", help="the browser (default: $JOULE_CHROMIUM, else "
                                           "/usr/bin/chromium, else chromium on PATH)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print requests, responses, console messages and timings")
    args = parser.parse_args(argv)

    origin = origin_of(args.url)
    if origin is None or origin[1] not in LOOPBACK_HOSTS:
        raise Usage("URL must be http(s)://127.0.0.1[:PORT]/... or http(s)://localhost[:PORT]/"
                    "...: %s" % args.url)
    if not args.timeout > 0:
        raise Usage("--timeout must be positive")
    if not 100 <= args.expect_status <= 599:
        raise Usage("--expect-status must be an HTTP status (100-599)")
    headers = {}
    for header in args.header:
        name, colon, value = header.partition(":")
        if not colon or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name.strip()):
            raise Usage('--header must be "Name: value": %r' % header)
        headers[name.strip()] = value.strip()
    cookies = []
    for cookie in args.cookie:
        name, equals, value = cookie.partition("=")
        if not equals or not name or re.search(r"[\s;=,]", name):
            raise Usage("--cookie must be name=value: %r" % cookie)
        cookies.append((name, value))
    args.cookie = cookies
    return args, origin, headers


def main(argv):
    started = time.monotonic()
    try:
        args, origin, headers = parse_args(argv)
    except Usage as e:
        say(str(e))
        return 2
    chromium = find_chromium(args.chromium)
    if chromium is None:
        say("SKIP: chromium is not installed (apt-get install chromium)")
        return SKIP
    if args.screenshot and importlib.util.find_spec("PIL") is None:
        say("SKIP: PIL is not installed (apt-get install python3-pil; run with /usr/bin/python3)")
        return SKIP
    signals = Signals()
    try:
        failures, results = browse(args, chromium, origin, headers, signals)
    except Interrupted as e:  # before or after the browser ran
        failures, results = ["interrupted by %s" % e], None
    if results is not None and args.eval_js:
        print(json.dumps(results, ensure_ascii=False), flush=True)
    for failure in failures:
        say("FAIL: %s" % failure)
    say("%s: %s in %.1fs" % (args.url, "FAILED" if failures else "ok",
                             time.monotonic() - started))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
