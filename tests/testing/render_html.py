#!/usr/bin/python3
"""Checks a self-contained Joule HTML report in a real headless Chromium.

Usage: render_html.py PAGE.html [--expect EXPECT.json] [--screenshot OUT.png]

Opens PAGE.html as file:// in Debian's chromium (headless, no sandbox, no GPU, a throwaway
profile, every host name and address mapped to "not found" so nothing leaves the machine),
lets it run for a virtual-time budget so Vega's asynchronous rendering completes, then checks:

  * the page logged no error: no console.error/console.assert failure, no uncaught exception
    or unhandled promise rejection, no browser error (a resource that failed to load, ...),
    and it requested nothing but local files (file:, data:, blob:, about:);
  * the page contract of Joule's reports: every plot is <div class="joule-plot" id="ID"
    data-title="TITLE">, rendered by vegaEmbed(..., {renderer: "svg", actions: false}); once
    all have rendered the page sets document.body.dataset.rendered to their number (so body
    must carry data-rendered="<number of .joule-plot divs>"); there is at least one plot;
  * every plot holds an <svg> with at least one mark, and for each plot listed in EXPECT.json
        {"plots": {"ID": {"min_marks": N, "series": ["name", ...], "texts": ["...", ...]}}}
    (every key optional but "plots"): at least N marks (the children of Vega's
    <g class="mark-TYPE role-mark ..."> groups: one path per line or area series, one per
    bar, symbol or rule, one text per text mark), each series name equal to a legend label of
    that plot, and each text contained in one of the plot's SVG <text> elements (titles,
    axis titles, labels);
  * with --screenshot: a 1200x2000 (CSS px) screenshot of the page is written to OUT.png
    (taller pages are captured whole) and must not be blank: within each plot's box, and over
    the page when it has no plot, more than --min-ink (2%) of the pixels differ from the most
    common colour and there are more than 3 distinct colours.

Exit status: 0 when every check passes; 1 with one line per failure on stderr; 2 for a usage
error or a malformed EXPECT.json; 77 (ctest's skip code, SKIP_RETURN_CODE) when chromium, or
PIL for --screenshot, is not installed. The browser is driven through the DevTools protocol
over a pipe (--remote-debugging-pipe; cdp_pipe.py beside this file, shared with browse.py),
because Chromium's own --enable-logging=stderr prints console.log, console.warn and
console.error alike as "INFO:CONSOLE", with no level; what it reads is the same as --dump-dom
and --virtual-time-budget give. Standard library only (and Debian's python3-pil for
--screenshot); run it with /usr/bin/python3.
"""

import argparse
import base64
import html.parser
import importlib.util
import io
import json
import os
import pathlib
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cdp_pipe import (SKIP, Browser, BrowserError, blank_failure, find_chromium,  # noqa: E402
                      ink, location, one_line, remote_object_text)

VIEWPORT = (1200, 2000)
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")
# Every host name and IP literal: unreachable.
CHROMIUM_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=%d,%d" % VIEWPORT]


class Usage(Exception):
    """A usage error or a malformed EXPECT.json: exit status 2."""


# ---------------------------------------------------------------------------------------------
# What the page reports.


class PageLog:
    """Collects, from the page's session, every error and every off-machine request."""

    def __init__(self, verbose):
        self.session = None
        self.errors = []
        self.remote_urls = set()
        self.verbose = verbose

    def __call__(self, message):
        if self.session is None or message.get("sessionId") != self.session:
            return
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            frames = params.get("stackTrace", {}).get("callFrames") or [{}]
            text = " ".join(remote_object_text(arg) for arg in params.get("args", []))
            where = location(frames[0].get("url"), frames[0].get("lineNumber", 0))
            if params.get("type") in ("error", "assert"):
                self.errors.append("console.%s: %s%s" % (params["type"], one_line(text), where))
            elif self.verbose:
                print("render_html: console.%s: %s%s" % (params.get("type"), one_line(text),
                                                         where), file=sys.stderr)
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
            if entry.get("level") == "error" and entry.get("url") not in self.remote_urls:
                self.errors.append("browser %s error: %s%s" % (
                    entry.get("source", "?"), one_line(entry.get("text", "")),
                    " (%s)" % entry["url"] if entry.get("url") else ""))
            elif self.verbose:
                print("render_html: browser %s %s: %s" % (
                    entry.get("source"), entry.get("level"), one_line(entry.get("text", ""))),
                    file=sys.stderr)
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not url.startswith(LOCAL_SCHEMES) and url not in self.remote_urls:
                self.remote_urls.add(url)
                self.errors.append("the page requested %s: a report must be self-contained "
                                   "(blocked: nothing leaves the machine)" % one_line(url, 200))
        elif method == "Inspector.targetCrashed":
            self.errors.append("the page's renderer crashed")


# ---------------------------------------------------------------------------------------------
# The DOM, as --dump-dom would print it, made into a small tree.

VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                 "param", "source", "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag = tag
        self.attrs = attrs
        self.parent = parent
        self.children = []  # Nodes and strings

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def elements(self):
        return [c for c in self.children if isinstance(c, Node)]

    def iter(self):
        yield self
        for child in self.elements():
            yield from child.iter()

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)


class TreeBuilder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.stack[-1])
        self.stack[-1].children.append(node)
        if tag not in VOID_ELEMENTS:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID_ELEMENTS:
            self.stack.pop()

    def handle_endtag(self, tag):
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse_dom(markup):
    builder = TreeBuilder()
    builder.feed(markup)
    builder.close()
    return builder.root


def count_marks(svg):
    """Children of Vega's non-group mark containers: <g class="mark-TYPE role-mark ...">."""
    total = 0
    for node in svg.iter():
        classes = node.classes()
        if (node.tag == "g" and "role-mark" in classes and
                any(c.startswith("mark-") and c != "mark-group" for c in classes)):
            total += len(node.elements())
    return total


def svg_texts(svg, role=None):
    """The text of each <text> in the SVG, or in its <g> groups of class `role`."""
    scopes = [svg] if role is None else [
        node for node in svg.iter() if node.tag == "g" and role in node.classes()]
    return [" ".join(node.text().split())
            for scope in scopes for node in scope.iter() if node.tag == "text"]


def check_dom(root, expect):
    failures = []
    body = next((n for n in root.iter() if n.tag == "body"), None)
    plots = [n for n in root.iter() if n.tag == "div" and "joule-plot" in n.classes()]
    if not plots:
        failures.append('the page has no plot: no <div class="joule-plot">')
    rendered = body.attrs.get("data-rendered") if body is not None else None
    if rendered is None:
        failures.append("<body> has no data-rendered attribute: the page never finished "
                        "rendering its %d plot(s)" % len(plots))
    elif rendered != str(len(plots)):
        failures.append('<body data-rendered="%s"> but the page has %d .joule-plot div(s)' %
                        (rendered, len(plots)))
    by_id = {}
    for plot in plots:
        plot_id = plot.attrs.get("id")
        if not plot_id:
            failures.append('a <div class="joule-plot"> has no id (data-title "%s")' %
                            plot.attrs.get("data-title", ""))
        elif plot_id in by_id:
            failures.append("two .joule-plot divs have the id '%s'" % plot_id)
        else:
            by_id[plot_id] = plot
        if "data-title" not in plot.attrs:
            failures.append("plot '%s' has no data-title attribute" % plot_id)
    for plot_id in expect:
        if plot_id not in by_id:
            failures.append("plot '%s' is expected but the page has no .joule-plot with that id "
                            "(it has: %s)" % (plot_id, ", ".join(sorted(by_id)) or "none"))
    for plot_id, plot in by_id.items():
        want = expect.get(plot_id, {})
        svgs = [n for n in plot.iter() if n.tag == "svg"]
        if not svgs:
            failures.append("plot '%s' has no <svg>: Vega did not render it" % plot_id)
            continue
        marks = sum(count_marks(svg) for svg in svgs)
        min_marks = max(1, want.get("min_marks", 1))
        if marks < min_marks:
            failures.append("plot '%s' has %d mark(s), expected at least %d" %
                            (plot_id, marks, min_marks))
        labels = [t for svg in svgs for t in svg_texts(svg, role="role-legend-label")]
        for series in want.get("series", []):
            if series not in labels:
                failures.append("plot '%s': series '%s' is not a legend label (labels: %s)" %
                                (plot_id, series, json.dumps(labels)))
        texts = [t for svg in svgs for t in svg_texts(svg)]
        for text in want.get("texts", []):
            if not any(text in t for t in texts):
                failures.append("plot '%s': no SVG text contains '%s'" % (plot_id, text))
    return failures


def load_expect(path):
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise Usage("cannot read %s: %s" % (path, e)) from None
    if not isinstance(data, dict) or set(data) != {"plots"} or not isinstance(data["plots"], dict):
        raise Usage('%s: expected {"plots": {"ID": {...}, ...}} and nothing else' % path)
    for plot_id, want in data["plots"].items():
        if not isinstance(want, dict):
            raise Usage("%s: plot '%s': expected an object" % (path, plot_id))
        unknown = set(want) - {"min_marks", "series", "texts"}
        if unknown:
            raise Usage("%s: plot '%s': unknown key(s) %s (known: min_marks, series, texts)" %
                        (path, plot_id, ", ".join(sorted(unknown))))
        if not isinstance(want.get("min_marks", 0), int) or want.get("min_marks", 0) < 0:
            raise Usage("%s: plot '%s': min_marks must be a non-negative integer" %
                        (path, plot_id))
        for key in ("series", "texts"):
            values = want.get(key, [])
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise Usage("%s: plot '%s': %s must be a list of strings" % (path, plot_id, key))
    return data["plots"]


# ---------------------------------------------------------------------------------------------
# The screenshot.


def check_screenshot(png, boxes, min_ink):
    from PIL import Image  # Debian's python3-pil; checked for in main()

    image = Image.open(io.BytesIO(png)).convert("RGB")
    blank = blank_failure(image, min_ink, check_share=not boxes)
    failures = [blank] if blank else []
    for plot_id, (x, y, w, h) in boxes.items():
        box = (max(0, round(x)), max(0, round(y)),
               min(image.width, round(x + w)), min(image.height, round(y + h)))
        if box[2] - box[0] < 1 or box[3] - box[1] < 1:
            failures.append("plot '%s' has no visible area on the page (%gx%g at %g,%g)" %
                            (plot_id, w, h, x, y))
            continue
        share, colours = ink(image.crop(box))
        if colours <= 3 or share <= min_ink:
            failures.append("plot '%s' looks blank in the screenshot: %d distinct colour(s), "
                            "%.2f%% of its pixels differ from the most common colour (needs "
                            "> %.2f%%)" % (plot_id, colours, 100 * share, 100 * min_ink))
    return failures


# ---------------------------------------------------------------------------------------------

PLOT_BOXES_JS = """JSON.stringify(Array.from(document.querySelectorAll("div.joule-plot[id]"))
  .map(d => { const r = d.getBoundingClientRect();
              return [d.id, [r.left + scrollX, r.top + scrollY, r.width, r.height]]; }))"""
PAGE_SIZE_JS = """JSON.stringify([document.documentElement.scrollWidth,
                                 document.documentElement.scrollHeight])"""


def evaluate(browser, session, expression):
    result = browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                          session)
    if "exceptionDetails" in result:
        raise BrowserError("evaluating %r in the page failed: %s" %
                           (expression[:40], result["exceptionDetails"].get("text")))
    return result["result"].get("value")


def render(args, chromium, expect):
    url = pathlib.Path(args.page).resolve().as_uri()
    deadline = time.monotonic() + args.timeout
    failures = []
    log = PageLog(args.verbose)
    with tempfile.TemporaryDirectory(prefix="render_html.") as profile_dir:
        browser = Browser(chromium, profile_dir, deadline, args.timeout, CHROMIUM_FLAGS)
        browser.handlers.append(log)
        try:
            targets = browser.call("Target.getTargets")["targetInfos"]
            page = next((t for t in targets if t["type"] == "page"), None)
            target_id = (page["targetId"] if page else
                         browser.call("Target.createTarget", {"url": "about:blank"})["targetId"])
            session = browser.call("Target.attachToTarget",
                                   {"targetId": target_id, "flatten": True})["sessionId"]
            log.session = session
            for domain in ("Page", "Runtime", "Log", "Network", "Inspector"):
                browser.call(domain + ".enable", session=session)
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1,
                          "mobile": False}, session)
            # As --virtual-time-budget: timers only run once no fetch is pending, and idle time
            # is skipped, so a finished page costs no waiting and a hung one costs the budget.
            browser.call("Emulation.setVirtualTimePolicy", {"policy": "pause"}, session)
            navigation = browser.call("Page.navigate", {"url": url}, session)
            if navigation.get("errorText"):
                raise BrowserError("cannot open %s: %s" % (url, navigation["errorText"]))
            browser.call("Emulation.setVirtualTimePolicy",
                         {"policy": "pauseIfNetworkFetchesPending", "budget": args.budget_ms,
                          "maxVirtualTimeTaskStarvationCount": 10000}, session)
            if not browser.wait_for("Emulation.virtualTimeBudgetExpired", session):
                failures.append("the page did not settle within %gs of real time (virtual "
                                "time budget %d ms)" % (args.timeout, args.budget_ms))
            browser.drain(0.05)
            markup = evaluate(browser, session, "document.documentElement.outerHTML")
            if args.dom:
                pathlib.Path(args.dom).write_text("<!DOCTYPE html>\n" + markup, encoding="utf-8")
            png = boxes = None
            if args.screenshot:
                width, height = json.loads(evaluate(browser, session, PAGE_SIZE_JS))
                boxes = dict(json.loads(evaluate(browser, session, PLOT_BOXES_JS)))
                clip = {"x": 0, "y": 0, "width": VIEWPORT[0],
                        "height": max(VIEWPORT[1], height), "scale": 1}
                png = base64.b64decode(browser.call(
                    "Page.captureScreenshot",
                    {"format": "png", "clip": clip, "captureBeyondViewport": height > VIEWPORT[1]},
                    session)["data"])
                pathlib.Path(args.screenshot).write_bytes(png)
                if args.verbose:
                    print("render_html: page %dx%d, screenshot %dx%d" %
                          (width, height, clip["width"], clip["height"]), file=sys.stderr)
            browser.drain(0.05)
        except BrowserError as e:
            # What the page logged before the browser stopped answering explains it best.
            return log.errors + failures + [str(e)]
        finally:
            browser.close()
    failures = log.errors + failures + check_dom(parse_dom(markup), expect)
    if png is not None:
        failures += check_screenshot(png, boxes, args.min_ink)
    return failures


def main(argv):
    parser = argparse.ArgumentParser(
        description="Check a Joule HTML report in headless Chromium (see the header of this "
                    "file). Exit 0: passed, 1: failed, 2: usage, 77: chromium missing.")
    parser.add_argument("page", help="the HTML file")
    parser.add_argument("--expect", metavar="EXPECT.json",
                        help='{"plots": {"ID": {"min_marks": N, "series": [...], "texts": [...]}}}')
    parser.add_argument("--screenshot", metavar="OUT.png",
                        help="write a screenshot there, and fail if it is blank")
    parser.add_argument("--dom", metavar="OUT.html", help="write the rendered DOM there")
    parser.add_argument("--chromium", help="the browser (default: $JOULE_CHROMIUM, else "
                                           "/usr/bin/chromium, else chromium on PATH)")
    parser.add_argument("--timeout", type=float, default=15.0,
                        help="real seconds for the whole run (default 15)")
    parser.add_argument("--budget-ms", type=int, default=5000,
                        help="virtual milliseconds the page may run (default 5000)")
    parser.add_argument("--min-ink", type=float, default=0.02,
                        help="share of non-background pixels a plot needs (default 0.02)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the page's other console messages and timings")
    args = parser.parse_args(argv)

    started = time.monotonic()
    try:
        expect = load_expect(args.expect)
        if not os.path.isfile(args.page):
            raise Usage("no such file: %s" % args.page)
    except Usage as e:
        print("render_html: %s" % e, file=sys.stderr)
        return 2
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("render_html: SKIP: chromium is not installed (apt-get install chromium)",
              file=sys.stderr)
        return SKIP
    if args.screenshot:
        if importlib.util.find_spec("PIL") is None:
            print("render_html: SKIP: PIL is not installed (apt-get install python3-pil; run "
                  "with /usr/bin/python3)", file=sys.stderr)
            return SKIP
    failures = render(args, chromium, expect)
    for failure in failures:
        print("render_html: FAIL: %s: %s" % (args.page, failure), file=sys.stderr)
    if args.verbose or not failures:
        print("render_html: %s: %s in %.1fs" % (args.page, "FAILED" if failures else "ok",
                                                time.monotonic() - started), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
