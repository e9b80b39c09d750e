"""Open a page in headless Chromium with the network off and record what it loads, through the DevTools
protocol over a pipe (``--remote-debugging-pipe``: requests in on fd 3, replies out on fd 4, NUL-separated
JSON), so nothing but the standard library is needed. A page served on 127.0.0.1 (``offline=False``) loads from
there only, with cookies set first (a login), and leaves its rendered text and a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Headless, no sandbox (containers), and no way out: every host name but 127.0.0.1 fails to resolve and every
# connection but loopback goes to a proxy on a closed port.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--remote-debugging-pipe",
)
SETTLE_S = 1.0  # after the load event, how long no request may be pending before the page counts as loaded


@dataclass
class PageLoad:
    """What a page loaded: each request's URL, the failed ones with their error, and the script errors."""

    requested: dict[str, str] = field(default_factory=dict)  # request id -> URL
    failed: list[tuple[str, str]] = field(default_factory=list)  # (URL, error text)
    errors: list[str] = field(default_factory=list)  # uncaught exceptions and console errors
    finished: set[str] = field(default_factory=set)
    text: str = ""  # the rendered page's text (document.body.innerText) once it has settled
    links: list[str] = field(default_factory=list)  # the settled page's link targets (absolute URLs)
    title: str = ""
    images: int = 0  # images drawn at least 100 pixels wide (plots)

    def note(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requested[params["requestId"]] = params["request"]["url"]
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            self.finished.add(params["requestId"])
            if method == "Network.loadingFailed" and not params.get("canceled"):  # the page's own abort is no failure
                url = self.requested.get(params["requestId"], "?")
                self.failed.append((url, params.get("blockedReason") or params["errorText"]))
        elif method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("exception", {}).get("description", "exception"))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    @property
    def pending(self) -> set[str]:
        """Requests not finished yet; a ``blob:`` one (a web worker's script) may never report its end."""
        return {request for request, url in self.requested.items() if not url.startswith("blob:")} - self.finished


class _Pipe:
    """The DevTools protocol over Chromium's pipe: send a command, read replies and events."""

    def __init__(self, out_fd: int, in_fd: int) -> None:
        self.out_fd, self.in_fd, self.buffer, self.next_id = out_fd, in_fd, b"", 0

    def send(self, method: str, session: str | None = None, **params: Any) -> int:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        os.write(self.out_fd, json.dumps(message | ({"sessionId": session} if session else {})).encode() + b"\0")
        return self.next_id

    def read(self, timeout: float) -> dict[str, Any] | None:
        while b"\0" not in self.buffer:
            if not select.select([self.in_fd], [], [], timeout)[0]:
                return None
            chunk = os.read(self.in_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        wanted = self.send(method, session, **params)
        while (reply := self.read(30)) is not None:
            if reply.get("id") == wanted:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(method)


@dataclass(frozen=True)
class Visit:
    """How to open a page: ``offline`` cuts every request (file:// pages); otherwise only loopback answers (the
    proxy and resolver rules still refuse the rest). ``cookies`` are set for the URL first; ``screenshot`` is where
    a PNG of the settled page goes; ``until`` (a JavaScript expression) must also hold before the page counts as
    loaded: what an app renders after its own later requests."""

    offline: bool = True
    cookies: dict[str, str] = field(default_factory=dict)
    screenshot: Path | None = None
    until: str | None = None


def load(url: str, profile: Path, timeout: float = 60, visit: Visit | None = None) -> PageLoad:
    """Open ``url`` in a headless Chromium of its own (user data in ``profile``), as ``visit`` says (default: the
    network off), and record its loads."""
    with Browser(profile) as browser:
        return browser.load(url, timeout, visit)


class Browser:
    """One headless Chromium (user data in ``profile``) for several pages, each opened in a fresh tab; ended by
    its PID when the ``with`` block ends."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile

    def __enter__(self) -> Browser:
        to_chrome, from_chrome = os.pipe(), os.pipe()

        def wire() -> None:  # the child's fd 3 reads our commands, its fd 4 writes the replies
            commands, replies = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome[0], from_chrome[1]))
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        self.process = subprocess.Popen(
            ["chromium", *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(3, 4),  # kept open past the close of the others, which follows preexec_fn
            preexec_fn=wire,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome[0])
        os.close(from_chrome[1])
        self.pipe = _Pipe(to_chrome[1], from_chrome[0])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self.pipe.out_fd)
        os.close(self.pipe.in_fd)

    def load(self, url: str, timeout: float = 60, visit: Visit | None = None) -> PageLoad:
        """Open ``url`` in a new tab, as ``visit`` says (default: the network off), and record its loads."""
        return _record(self.pipe, url, timeout, visit or Visit())


def _record(pipe: _Pipe, url: str, timeout: float, visit: Visit) -> PageLoad:
    """Navigate a fresh tab to ``url`` and collect its events until it has loaded and settled."""
    target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
    session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Network", "Page", "Runtime", "Log"):
        pipe.call(f"{domain}.enable", session)
    if visit.offline:
        conditions = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
        pipe.call("Network.emulateNetworkConditions", session, **conditions)
    if visit.screenshot is not None:
        pipe.call(
            "Emulation.setDeviceMetricsOverride", session, width=1400, height=900, deviceScaleFactor=1, mobile=False
        )
    for name, value in visit.cookies.items():
        pipe.call("Network.setCookie", session, name=name, value=value, url=url)
    pipe.send("Page.navigate", session, url=url)
    deadline = time.monotonic() + timeout
    page = _settle(pipe, session, url, timeout)
    while visit.until and not _holds(pipe, session, visit.until):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: {visit.until} did not hold in {timeout} s")
        page = _settle(pipe, session, url, deadline - time.monotonic(), page)
    read = (
        "[document.body.innerText, Array.from(document.querySelectorAll('a[href]'), a => a.href), document.title, "
        "Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0 && i.width >= 100).length]"
    )
    rendered = pipe.call("Runtime.evaluate", session, expression=read, returnByValue=True)["result"]
    page.text, page.links, page.title, page.images = rendered["value"]
    if visit.screenshot is not None:
        visit.screenshot.write_bytes(base64.b64decode(pipe.call("Page.captureScreenshot", session)["data"]))
    pipe.call("Target.closeTarget", targetId=target)
    return page


def _holds(pipe: _Pipe, session: str, expression: str) -> bool:
    answer = pipe.call("Runtime.evaluate", session, expression=f"!!({expression})", returnByValue=True)
    return bool(answer["result"]["value"])


def _settle(pipe: _Pipe, session: str, url: str, timeout: float, page: PageLoad | None = None) -> PageLoad:
    """The page's loads once it has loaded and no request is pending for ``SETTLE_S``; ``page``: a load that had
    settled and goes on (its load event seen)."""
    deadline = time.monotonic() + timeout
    loaded_at = None if page is None else time.monotonic()
    page = page or PageLoad()
    while time.monotonic() < deadline:
        event = pipe.read(0.2)
        if event is not None and event.get("sessionId") == session:
            page.note(event)
            loaded_at = time.monotonic() if event.get("method") == "Page.loadEventFired" else loaded_at
        elif event is None and loaded_at and not page.pending and time.monotonic() - loaded_at > SETTLE_S:
            return page
    pending = sorted(page.requested[request] for request in page.pending)
    raise TimeoutError(f"{url} did not finish loading in {timeout} s; pending: {pending}")
