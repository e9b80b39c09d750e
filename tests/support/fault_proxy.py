"""A fault-injecting HTTP reverse proxy on 127.0.0.1, in front of an S3 endpoint (stdlib only).

Every request (method, path, query, headers, body) is forwarded verbatim to the upstream endpoint and its
response streamed back, unless the scripted :class:`FaultPlan` claims the request first:

* ``slow_down(n, method, target)``: the next ``n`` matching requests get ``503 SlowDown`` (S3's XML error
  body) and are not forwarded;
* ``reset_get(n, target)``: the next ``n`` matching object GETs that succeed upstream get the status line,
  the headers (with the full Content-Length) and part of the body, then the socket is reset (RST);
* ``conflict(n, target)``: the next ``n`` matching conditional PUTs (If-Match or If-None-Match) get
  ``409 ConditionalRequestConflict`` and are not forwarded (as on S3: nothing was written).

``target`` is a regex searched in the request target (``/bucket/key?query``, percent-decoded); ``method``
None matches any method. Every fault injected is recorded in :attr:`FaultProxy.injected`.
"""

from __future__ import annotations

import http.client
import io
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

SLOW_DOWN, RESET, CONFLICT = "slow-down", "reset", "conflict"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
_COPY_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Injected:
    """One fault the proxy injected: its kind, the request's method and target, and (for a reset) the bytes
    of the body sent before it."""

    kind: str
    method: str
    target: str
    sent: int | None = None


@dataclass
class _Rule:
    kind: str
    remaining: int
    method: str | None
    target: re.Pattern[str]
    fraction: float = 0.5

    def matches(self, method: str, target: str, conditional: bool) -> bool:
        if self.remaining <= 0 or (self.method is not None and method != self.method):
            return False
        if self.kind == CONFLICT and not (method == "PUT" and conditional):
            return False
        if self.kind == RESET and (method != "GET" or "?" in target):  # object GETs, not listings
            return False
        return self.target.search(target) is not None


@dataclass
class FaultPlan:
    """Scripted faults, each rule firing for the next N requests it matches (rules are tried in order)."""

    rules: list[_Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def slow_down(self, count: int, method: str | None = None, target: str = "") -> None:
        self._add(_Rule(SLOW_DOWN, count, method, re.compile(target)))

    def reset_get(self, count: int = 1, target: str = "", fraction: float = 0.5) -> None:
        self._add(_Rule(RESET, count, "GET", re.compile(target), fraction))

    def conflict(self, count: int = 1, target: str = "") -> None:
        self._add(_Rule(CONFLICT, count, "PUT", re.compile(target)))

    def pending(self) -> int:
        """Faults armed but not injected yet."""
        with self.lock:
            return sum(r.remaining for r in self.rules)

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()

    def _add(self, rule: _Rule) -> None:
        with self.lock:
            self.rules.append(rule)

    def claim(self, method: str, target: str, conditional: bool, kinds: tuple[str, ...]) -> _Rule | None:
        """The first armed rule of one of ``kinds`` matching the request, its count taken; None if none."""
        with self.lock:
            for rule in self.rules:
                if rule.kind in kinds and rule.matches(method, target, conditional):
                    rule.remaining -= 1
                    return rule
        return None

    def give_back(self, rule: _Rule) -> None:
        """Undo a claim that could not be injected (a reset of a response with too small a body)."""
        with self.lock:
            rule.remaining += 1


def _s3_error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        f"<RequestId>fault-proxy</RequestId></Error>"
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def _dispatch(self) -> None:
        body = self._request_body()
        target = unquote(self.path)
        method, conditional = self.command, bool(self.headers.get("If-Match") or self.headers.get("If-None-Match"))
        proxy = self.server.proxy
        proxy.count(method, target)
        rule = proxy.plan.claim(method, target, conditional, (SLOW_DOWN, CONFLICT))
        if rule is not None:
            proxy.record(Injected(rule.kind, method, target))
            if rule.kind == SLOW_DOWN:
                self._reply(503, _s3_error("SlowDown", "Please reduce your request rate."))
            else:
                message = "A conflicting operation occurred. If using PutObject you can retry the request."
                self._reply(409, _s3_error("ConditionalRequestConflict", message))
            return
        self._forward(body, target)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _dispatch

    def _request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            pieces = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(pieces)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, body: bytes, target: str) -> None:
        upstream = http.client.HTTPConnection(self.server.proxy.upstream_host, self.server.proxy.upstream_port, 60)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP | {"expect", "content-length"}:
                    upstream.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            self._relay(upstream.getresponse(), target)
        finally:
            upstream.close()

    def _relay(self, resp: http.client.HTTPResponse, target: str) -> None:
        length = resp.getheader("Content-Length")
        rule = None
        if self.command == "GET" and resp.status in (200, 206) and length and int(length) >= 2:  # 206: a ranged GET
            rule = self.server.proxy.plan.claim(self.command, target, False, (RESET,))
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        chunked = length is None and self.command != "HEAD" and resp.status not in (204, 304)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if rule is not None:
            self._send_part_and_reset(resp, int(length or 0), rule)
            return
        while piece := resp.read(_COPY_CHUNK):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _send_part_and_reset(self, resp: http.client.HTTPResponse, length: int, rule: _Rule) -> None:
        sent = max(1, min(length - 1, int(length * rule.fraction)))
        self.wfile.write(resp.read(sent))
        self.wfile.flush()
        self.server.proxy.record(Injected(RESET, self.command, unquote(self.path), sent))
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.rfile.close()
        self.wfile.close()
        self.connection.close()  # linger 0: the peer gets a RST, not a FIN
        self.wfile = io.BytesIO()  # what the base class flushes after this request


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy


class FaultProxy:
    """The proxy: ``start()``, point clients at :attr:`url`, arm :attr:`plan`, read :attr:`injected`, ``stop()``."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the fault proxy forwards to plain http:// endpoints only, not {upstream}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 80
        self.plan = FaultPlan()
        self.injected: list[Injected] = []
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def record(self, fault: Injected) -> None:
        with self._lock:
            self.injected.append(fault)

    def count(self, method: str, target: str) -> None:
        with self._lock:
            self.requests[method] = self.requests.get(method, 0) + 1

    def kinds(self) -> dict[str, int]:
        """How many faults of each kind were injected so far."""
        with self._lock:
            found: dict[str, int] = {}
            for fault in self.injected:
                found[fault.kind] = found.get(fault.kind, 0) + 1
            return found

    def reset_log(self) -> None:
        with self._lock:
            self.injected.clear()
            self.requests.clear()
