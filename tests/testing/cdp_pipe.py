"""Headless Chromium driven over the DevTools protocol on a pipe: shared by render_html.py
(self-contained HTML reports, file://) and browse.py (live pages on loopback, http://).

Chromium is started with --remote-debugging-pipe: it reads JSON messages ending in NUL on its
fd 3 and writes them on its fd 4. It runs in a session of its own (so a Ctrl-C at the terminal
reaches only the Python driver, which then closes it) and gets SIGKILL if the driver dies
without closing it (PR_SET_PDEATHSIG). Standard library only; ink() and blank_failure() need an
image from PIL (Debian's python3-pil).
"""

import ctypes
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time

SKIP = 77
# Chromium, minus everything that would reach out of the machine or wait on a desktop. Each
# driver adds --host-resolver-rules and --window-size.
BASE_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    "--password-store=basic",
    "--remote-debugging-pipe",
]


class BrowserError(Exception):
    """The browser could not be driven: one failure line."""


def find_chromium(requested):
    """--chromium, else $JOULE_CHROMIUM (each alone when given), else the usual places."""
    chosen = requested or os.environ.get("JOULE_CHROMIUM")
    candidates = [chosen] if chosen else ["/usr/bin/chromium", shutil.which("chromium"),
                                          shutil.which("chromium-browser")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _die_with_parent():
    """In the child, before exec: SIGKILL when the driver dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Browser:
    def __init__(self, chromium, profile_dir, deadline, timeout, flags):
        self.deadline = deadline
        self.timeout = timeout
        self.buf = b""
        self.next_id = 0
        self.handlers = []
        self.log_path = os.path.join(profile_dir, "chromium.stderr")
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Move Chromium's ends above fd 9 so that the shell's "3<&N 4>&M" cannot clobber them.
        child_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        # Its temporary files (shared memory, with --disable-dev-shm-usage) go with the profile.
        env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS="disabled:", TMPDIR=profile_dir)
        args = [chromium, *BASE_FLAGS, *flags,
                "--user-data-dir=" + os.path.join(profile_dir, "p"), "about:blank"]
        script = 'exec "$0" "$@" 3<&%d 4>&%d %d<&- %d>&-' % (child_r, child_w, child_r, child_w)
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    ["/bin/bash", "-c", script, *args], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, pass_fds=(child_r, child_w), env=env, start_new_session=True,
                    preexec_fn=_die_with_parent)
        except BaseException:
            for fd in (self.to_chrome, self.from_chrome):
                os.close(fd)
            raise
        finally:
            os.close(child_r)
            os.close(child_w)

    def stderr_tail(self, lines=5):
        try:
            with open(self.log_path, errors="replace") as f:
                text = [line.strip() for line in f if line.strip()]
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def _read_message(self, until):
        while b"\0" not in self.buf:
            left = until - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.from_chrome], [], [], left)
            if not ready:
                return None
            data = os.read(self.from_chrome, 1 << 20)
            if not data:
                raise BrowserError("chromium exited unexpectedly (exit status %s): %s" %
                                   (self.proc.poll(), self.stderr_tail()))
            self.buf += data
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def _dispatch(self, message):
        for handler in self.handlers:
            handler(message)

    def send(self, method, params=None, session=None):
        """Sends a command without waiting: its answer goes to the handlers. Returns its id."""
        self.next_id += 1
        request = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        data = json.dumps(request).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self.to_chrome, data):]
        except BrokenPipeError:
            raise BrowserError("chromium exited unexpectedly (exit status %s): %s" %
                               (self.proc.poll(), self.stderr_tail())) from None
        return self.next_id

    def call(self, method, params=None, session=None, deadline=None):
        """Sends a command and handles events until its answer (by `deadline`, default the
        browser's)."""
        request_id = self.send(method, params, session)
        while True:
            message = self._read_message(deadline or self.deadline)
            if message is None:
                raise BrowserError("no answer to %s within the %gs timeout: is a page script "
                                   "stuck in a loop?" % (method, self.timeout))
            if message.get("id") == request_id:
                if "error" in message:
                    raise BrowserError("%s failed: %s" % (method, message["error"].get("message")))
                return message.get("result", {})
            self._dispatch(message)

    def wait_for(self, method, session):
        """Handles events until `method` arrives on `session`; False at the deadline."""
        while True:
            message = self._read_message(self.deadline)
            if message is None:
                return False
            self._dispatch(message)
            if message.get("method") == method and message.get("sessionId") == session:
                return True

    def drain(self, seconds):
        until = min(self.deadline, time.monotonic() + seconds)
        while (message := self._read_message(until)) is not None:
            self._dispatch(message)

    def close(self):
        try:
            if self.proc.poll() is None:
                self.deadline = time.monotonic() + 2
                self.call("Browser.close")
        except (BrowserError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        # The launcher exec'd chromium in a session of its own: end what is left of it (zygote,
        # renderers), and nothing else.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        os.close(self.to_chrome)
        os.close(self.from_chrome)


# ---------------------------------------------------------------------------------------------
# What the page reports, as one line.


def location(url, line):
    name = url.rsplit("/", 1)[-1] if url else ""
    return " (%s:%d)" % (name, line + 1) if name else ""


def one_line(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def remote_object_text(obj):
    if "value" in obj:
        value = obj["value"]
        return value if isinstance(value, str) else json.dumps(value)
    if "unserializableValue" in obj:
        return obj["unserializableValue"]
    description = obj.get("description")
    if description:
        # An Error's description is its message followed by its stack: keep the message.
        return description.split("\n    at ", 1)[0]
    return obj.get("type", "?")


# ---------------------------------------------------------------------------------------------
# Screenshots (PIL images).


def ink(image):
    """(share of pixels that differ from the most common colour, number of distinct colours)."""
    width, height = image.size
    colours = image.getcolors(width * height)
    top = max(count for count, _ in colours)
    return 1 - top / (width * height), len(colours)


def blank_failure(image, min_ink, check_share=True):
    """A failure line when the whole image is blank: at most 3 distinct colours or (when
    check_share) no more than min_ink of its pixels differ from the most common colour."""
    share, colours = ink(image)
    if colours <= 3 or (check_share and share <= min_ink):
        return ("the screenshot is blank: %d distinct colour(s), %.2f%% of the pixels differ "
                "from the most common colour" % (colours, 100 * share))
    return None
