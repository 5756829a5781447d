"""A fault-injecting HTTP proxy on loopback in front of the S3 test server (moto), for the tests.

It understands just enough HTTP/1.1 to relay one request at a time per client connection (keep-alive
kept, so clients reuse pooled connections as they would with S3), and to break a chosen request in
one of these ways (``FAULTS``):

* ``reset``: the connection is reset before the request reaches the server (nothing happened there);
* ``lost-reply``: the server handles the request (a PUT is stored, a DELETE done), then the connection
  is reset before the reply: the client cannot tell it happened;
* ``500``: ``InternalError`` and ``503``: ``SlowDown``, as S3 sends them (XML error body), without
  forwarding;
* ``slow``: the reply comes after ``FaultPlan.delay_s``;
* ``truncate``: the server handles the request; its reply keeps its ``Content-Length`` but the body is
  cut in half and the connection closed (a client must notice the mismatch, never take a short object).
  A reply without a body is lost instead.

These are the faults a plan picks from by default (``FAULTS``). Four more must be asked for by name
(``OPT_IN_FAULTS``), as they damage a reply in ways only some requests can show:

* ``key-errors``: a multi-object delete (``DELETE-MULTI``) is answered, without forwarding, ``200 OK``
  with a per-key ``<Error>`` (``InternalError`` or ``SlowDown``) for every key it names, as S3 does when
  part of a batch fails: nothing was deleted, and only the per-key errors say so. Any other request
  gets the ``500`` fault;
* ``key-denied``: the same, with ``AccessDenied`` for every key (an answer, not a failure to retry);
* ``corrupt``: the server handles the request; its reply keeps its framing but one byte of the body is
  flipped, so its checksum (``x-amz-checksum-*``, sent for a whole-object GET of an object stored with
  one) does not match. A reply without a body passes unchanged;
* ``copy-too-large``: a CopyObject (``COPY``) is answered, without forwarding, ``400 InvalidRequest``
  "The specified copy source is larger than the maximum allowable size", as S3 answers for a source over
  5 GiB (so a small object takes the multipart copy path). Any other request gets the ``500`` fault.

Which requests fail is decided per request from a seed: the *i*-th time the same request (method,
path, query, range and body) comes, it fails when ``Random(f"{seed}|{request}|{i}")`` says so, so a run is
reproducible however the client's threads interleave. ``outage(seconds)`` fails every request (reset or 503) for that long: the store is
down. ``deny(*keys)`` answers ``403 AccessDenied`` for those objects: the store refuses (the credentials may not).
``hold_clock({key: when})`` makes the store's clock stand still for those objects: every reply (a GET's or a
HEAD's ``Last-Modified``, a listing's ``<LastModified>``) gives each the time held, whenever it was written,
as S3's one-second clock does to versions written within one tick.
Counters say what went through and what was broken, by request kind (``request_kind``).

Used in process (``FaultyS3(upstream).start()``, one asyncio loop on a daemon thread) by the fixture
``faulty_s3`` in ``tests/conftest.py``; clients reach it at ``.endpoint`` like any S3 endpoint.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from urllib.parse import parse_qsl, quote, unquote, urlsplit

FAULTS = ("reset", "lost-reply", "500", "503", "slow", "truncate")  # a plan's default
OPT_IN_FAULTS = ("key-errors", "key-denied", "corrupt", "copy-too-large")  # named in a plan's ``faults`` only
# What the server must have done before the fault: these forward the request first.
_AFTER = {"lost-reply", "truncate", "slow", "corrupt"}
# Per-key error codes of a multi-object delete's 200 reply, by fault.
_KEY_ERRORS = {"key-errors": ("InternalError", "SlowDown"), "key-denied": ("AccessDenied",)}

REQUEST_KINDS = ("LIST", "GET", "HEAD", "PUT", "PUT-IF-NONE-MATCH", "COPY", "DELETE", "DELETE-MULTI",
                 "VERSIONING", "LIST-VERSIONS", "MULTIPART", "BUCKET", "OTHER")

_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),  # an answer, not a failure: only ``deny`` gives it
    "copy-too-large": (400, "Bad Request", "InvalidRequest", "The specified copy source is larger than the maximum "
                       "allowable size for a copy source: 5368709120"),
}


def request_kind(method: str, target: str, headers: dict[str, str]) -> str:
    """What an S3 request does, from its method, target and headers (names lower-case)."""
    parts = urlsplit(target)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = parts.path.strip("/")
    has_key = "/" in path
    if "uploads" in query or "uploadId" in query:
        return "MULTIPART"
    if method == "GET":
        if "versioning" in query:
            return "VERSIONING"
        if "versions" in query:
            return "LIST-VERSIONS"
        if not has_key:
            return "LIST" if ("list-type" in query or "prefix" in query or not query) else "BUCKET"
        return "GET"
    if method == "HEAD":
        return "HEAD" if has_key else "BUCKET"
    if method == "PUT":
        if not has_key:
            return "BUCKET"
        if "x-amz-copy-source" in headers:
            return "COPY"
        if headers.get("if-none-match") == "*":
            return "PUT-IF-NONE-MATCH"
        return "PUT"
    if method == "DELETE":
        return "DELETE" if has_key else "BUCKET"
    if method == "POST" and "delete" in query:
        return "DELETE-MULTI"
    return "OTHER"


@dataclass(frozen=True)
class FaultPlan:
    """Which requests fail, and how.

    ``rate``: the share of requests that fail (0 to 1). ``faults``: the ways they fail, picked evenly.
    ``requests``: the request kinds that may fail (None: every kind). ``limit``: at most this many
    failures of the same request (method, path and query), so a retry of it gets through; None: no
    limit. ``delay_s``: how late a ``slow`` reply comes.
    """

    rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    seed: int = 0
    requests: frozenset[str] | None = None
    limit: int | None = None
    delay_s: float = 0.2

    def __post_init__(self):
        unknown = set(self.faults) - set(FAULTS + OPT_IN_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS + OPT_IN_FAULTS}")
        if self.requests is not None and set(self.requests) - set(REQUEST_KINDS):
            raise ValueError(f"unknown request kinds {sorted(set(self.requests) - set(REQUEST_KINDS))}")


@dataclass
class FaultStats:
    """What went through the proxy: requests by kind, and the faults injected by (request kind, fault)."""

    requests: collections.Counter = field(default_factory=collections.Counter)
    faults: collections.Counter = field(default_factory=collections.Counter)

    def faulted_kinds(self) -> set[str]:
        return {kind for kind, _ in self.faults}

    def fault_kinds(self) -> set[str]:
        return {fault for _, fault in self.faults}

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    def to_dict(self) -> dict:
        return {"requests": dict(sorted(self.requests.items())),
                "faults": {f"{k} {f}": n for (k, f), n in sorted(self.faults.items())}}


class _Request:
    __slots__ = ("method", "target", "version", "headers", "raw_head", "body", "kind")

    def __init__(self, method, target, version, headers, raw_head, body):
        self.method, self.target, self.version = method, target, version
        self.headers, self.raw_head, self.body = headers, raw_head, body
        self.kind = request_kind(method, target, {k: v for k, v in headers})

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def forwarded(self) -> bytes:
        """The request as sent on: the same bytes, without ``Expect`` (answered here) and with a
        connection the server closes after its reply (one upstream connection per request)."""
        lines = [f"{self.method} {self.target} {self.version}"]
        for line in self.raw_head.split(b"\r\n")[1:]:
            name = line.split(b":", 1)[0].strip().lower()
            if name in (b"expect", b"connection", b"keep-alive") or not line:
                continue
            lines.append(line.decode("latin-1"))
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class _Response:
    __slots__ = ("status", "head_lines", "body", "framed")

    def __init__(self, status: int, head_lines: list[bytes], body: bytes, framed: bool):
        self.status, self.head_lines, self.body, self.framed = status, head_lines, body, framed

    def encode(self, body: bytes | None = None) -> bytes:
        return b"\r\n".join(self.head_lines) + b"\r\n\r\n" + (self.body if body is None else body)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    except asyncio.LimitOverrunError:
        return None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, raw (sizes, chunks and trailers as sent)."""
    out = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then the empty line
                trailer = await reader.readuntil(b"\r\n")
                out += trailer
                if trailer == b"\r\n":
                    return bytes(out)
        out += await reader.readexactly(size + 2)


def _parse_headers(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, _, v = line.partition(":")
        headers.append((k.strip().lower(), v.strip()))
    return lines[0], headers


class FaultyS3:
    """The proxy (see the module docstring). ``start()`` returns the endpoint URL."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.plan = FaultPlan()
        self.stats = FaultStats()
        self._seen: collections.Counter = collections.Counter()
        self._faulted: collections.Counter = collections.Counter()
        self._outage_until = 0.0
        self._outage_after: int | None = None  # requests still to pass before an armed outage starts
        self._outage_seconds = 0.0
        self._outage_kind: str | None = None
        self._outage_requests = 0
        self._denied: frozenset[str] = frozenset()
        self._held: dict[str, datetime] = {}  # bucket/key -> the modification time every reply gives it
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # -- control (from the tests' threads) -------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_plan(self, plan: FaultPlan) -> None:
        """Use ``plan`` from the next request on; the per-request counts start again."""
        with self._lock:
            self.plan = plan
            self._seen.clear()
            self._faulted.clear()

    def deny(self, *keys: str) -> None:
        """Answer ``403 AccessDenied`` to every request for these objects (``bucket/key``), as a store does to
        credentials that may not read or write them, until ``calm`` or ``clear``."""
        with self._lock:
            self._denied = frozenset(k.strip("/") for k in keys)

    def hold_clock(self, stamps: dict[str, datetime]) -> None:
        """The store's clock stands still for these objects (``bucket/key`` -> an aware time, whole
        seconds): every reply gives each that modification time, whatever its versions were written at,
        until ``calm`` or ``clear``. Versions written within one tick of a one-second clock, without the
        tick's deadline (a test on a loaded machine cannot make its work fit within one second)."""
        with self._lock:
            self._held = {k.strip("/"): when for k, when in stamps.items()}

    def calm(self) -> None:
        """No faults and no outage from now on (the counters stay)."""
        with self._lock:
            self._denied = frozenset()
            self._held = {}
            self.plan = FaultPlan()
            self._outage_until = 0.0
            self._outage_after = None

    def clear(self) -> None:
        """No faults, no outage, counters at zero."""
        with self._lock:
            self.plan = FaultPlan()
            self._denied = frozenset()
            self._held = {}
            self._seen.clear()
            self._faulted.clear()
            self._outage_until = 0.0
            self._outage_after = None
            self.stats = FaultStats()

    def reset_stats(self) -> FaultStats:
        """The counters so far, and zero from now on."""
        with self._lock:
            stats, self.stats = self.stats, FaultStats()
            return stats

    def outage(self, seconds: float, after_requests: int = 0, of_kind: str | None = None,
               at_next_request: bool = False) -> None:
        """Every request fails for ``seconds``, starting now or once ``after_requests`` more requests
        (of the kind ``of_kind``, if given: say, part-way through an operation's copies) have gone
        through. ``at_next_request`` (with ``after_requests`` 0): starting with the next request, not now,
        so that a command slow to reach the store (CI under load) cannot outlast the outage before its
        first request."""
        with self._lock:
            self._outage_seconds = seconds
            self._outage_kind = of_kind
            if after_requests <= 0 and at_next_request:
                self._outage_after = 0  # _decide starts it with the next request (of the kind)
            elif after_requests <= 0:
                self._outage_until = time.monotonic() + seconds
                self._outage_after = None
            else:
                self._outage_after = after_requests

    def in_outage(self) -> bool:
        with self._lock:
            return self._outage_after is not None or time.monotonic() < self._outage_until

    def wait_outage_over(self, timeout: float = 120.0) -> None:
        """Block until no outage is armed or running."""
        deadline = time.monotonic() + timeout
        while self.in_outage():
            if time.monotonic() > deadline:
                raise TimeoutError("the outage did not end")
            time.sleep(0.05)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> str:
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, limit=2**20))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="faulty-s3", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self.endpoint

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:  # connections clients keep open
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    # -- deciding --------------------------------------------------------------------------------------------
    def _decide(self, req: _Request) -> str | None:
        """The fault for this request, or None; counts it."""
        with self._lock:
            self.stats.requests[req.kind] += 1
            if self._denied and unquote(urlsplit(req.target).path).strip("/") in self._denied:
                self.stats.faults[(req.kind, "403")] += 1
                return "403"
            now = time.monotonic()
            down = now < self._outage_until
            if self._outage_after == 0 and self._outage_kind in (None, req.kind):  # armed for this request
                self._outage_after = None
                self._outage_until = now + self._outage_seconds
                down = True
            elif self._outage_after is not None and self._outage_kind in (None, req.kind):
                self._outage_after -= 1  # this request still goes through; the outage may start after it
                if self._outage_after <= 0:
                    self._outage_after = None
                    self._outage_until = now + self._outage_seconds
            if down:
                self._outage_requests += 1
                fault = ("reset", "503")[self._outage_requests % 2]
                self.stats.faults[(req.kind, fault)] += 1
                return fault
            plan = self.plan
            # a multipart upload tried again gets a new upload id: its requests are still "the same"
            target = re.sub(r"uploadId=[^&]*", "uploadId=*", req.target)
            body = re.sub(rb"<UploadId>[^<]*</UploadId>", b"", req.body)
            key = f"{req.method} {target} {req.header('range')} {hashlib.sha1(body).hexdigest()[:12]}"
            n = self._seen[key]
            self._seen[key] += 1
            if plan.rate <= 0 or (plan.requests is not None and req.kind not in plan.requests):
                return None
            if plan.limit is not None and self._faulted[key] >= plan.limit:
                return None
            rng = random.Random(f"{plan.seed}|{key}|{n}")
            if rng.random() >= plan.rate:
                return None
            fault = rng.choice(plan.faults)
            self._faulted[key] += 1
            self.stats.faults[(req.kind, fault)] += 1
            return fault

    # -- relaying ----------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                line, headers = _parse_headers(head)
                method, target, version = line.split(" ", 2)
                hdr = dict(headers)
                if hdr.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                if "content-length" in hdr:
                    body = await reader.readexactly(int(hdr["content-length"]))
                elif "chunked" in hdr.get("transfer-encoding", "").lower():
                    body = await _read_chunked(reader)
                else:
                    body = b""
                req = _Request(method, target, version, headers, head[:-4], body)
                fault = self._decide(req)
                if fault == "reset":
                    _reset(writer)
                    return
                if (fault in _KEY_ERRORS and req.kind != "DELETE-MULTI") or (fault == "copy-too-large" and
                                                                               req.kind != "COPY"):
                    fault = "500"
                if fault in _KEY_ERRORS:
                    writer.write(_key_errors_reply(_KEY_ERRORS[fault], req))
                    await writer.drain()
                    continue
                if fault in _ERRORS:
                    writer.write(_error_reply(fault, req))
                    await writer.drain()
                    continue
                if fault == "slow":
                    await asyncio.sleep(self.plan.delay_s)
                resp = await self._forward(req)
                if resp is None:  # the server went away: the client sees it as a reset
                    _reset(writer)
                    return
                with self._lock:
                    held = dict(self._held)
                if held and resp.status == 200:
                    _restamp(req, resp, held)
                if fault == "lost-reply" or (fault == "truncate" and len(resp.body) < 2):
                    _reset(writer)
                    return
                if fault == "truncate":
                    writer.write(resp.encode(resp.body[: len(resp.body) // 2]))
                    await writer.drain()
                    _reset(writer)
                    return
                if fault == "corrupt" and resp.body:
                    middle = len(resp.body) // 2
                    body = resp.body[:middle] + bytes([resp.body[middle] ^ 0xFF]) + resp.body[middle + 1:]
                    writer.write(resp.encode(body))
                else:
                    writer.write(resp.encode())
                await writer.drain()
                if not resp.framed:
                    writer.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if not writer.is_closing():
                writer.close()

    async def _forward(self, req: _Request) -> _Response | None:
        """Send the request to the server on a fresh connection; its whole reply (the server closes)."""
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream, limit=2**20)
        except OSError:
            return None
        try:
            uwriter.write(req.forwarded())
            await uwriter.drain()
            raw = await ureader.read()
        except (ConnectionError, OSError):
            return None
        finally:
            uwriter.close()
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        # the client's connection stays open: drop the server's "close"
        kept = [lines[0]] + [h for h in lines[1:] if h.split(b":", 1)[0].strip().lower() not in
                             (b"connection", b"keep-alive")]
        names = {h.split(b":", 1)[0].strip().lower() for h in kept[1:]}
        no_body = req.method == "HEAD" or status in (204, 304) or 100 <= status < 200
        if no_body:
            body = b""
        framed = no_body or b"content-length" in names or b"transfer-encoding" in names
        if not framed:
            kept.append(b"Content-Length: " + str(len(body)).encode())
            framed = True
        return _Response(status, kept, body, framed)


def _restamp(req: _Request, resp: _Response, held: dict[str, datetime]) -> None:
    """Give the held objects their held modification time in this reply (``FaultyS3.hold_clock``)."""
    path = unquote(urlsplit(req.target).path).strip("/")
    if req.kind in ("GET", "HEAD") and path in held:
        stamp = format_datetime(held[path].astimezone(timezone.utc), usegmt=True).encode()
        resp.head_lines = [b"Last-Modified: " + stamp if line.split(b":", 1)[0].strip().lower() == b"last-modified"
                           else line for line in resp.head_lines]
    elif req.kind == "LIST":
        for name, when in held.items():
            bucket, _, key = name.partition("/")
            if bucket != path:
                continue
            stamp = when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z").encode()  # as long as S3's own: the length stays
            for spelled in {key, quote(key), quote(key, safe="")}:
                resp.body = re.sub(rb"(<Key>" + re.escape(spelled.encode()) + rb"</Key>(?:(?!</Contents>).)*?<LastModified>)"
                                   rb"[^<]*(</LastModified>)", lambda m: m.group(1) + stamp + m.group(2), resp.body,
                                   flags=re.S)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def _error_reply(fault: str, req: _Request) -> bytes:
    status, reason, code, message = _ERRORS[fault]
    request_id = uuid.uuid4().hex[:16].upper()
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>{request_id}</RequestId></Error>").encode()
    if req.method == "HEAD":
        body = b""
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nx-amz-request-id: {request_id}\r\n"
            f"Content-Length: {len(body) if req.method != 'HEAD' else 0}\r\n\r\n")
    return head.encode() + body


def _key_errors_reply(codes: tuple[str, ...], req: _Request) -> bytes:
    """A multi-object delete's ``200 OK`` whose every key failed (codes taken in turn, from the key)."""
    keys = re.findall(rb"<Key>([^<]*)</Key>", req.body)
    errors = b"".join(
        b"<Error><Key>%s</Key><Code>%s</Code><Message>injected by the fault proxy</Message></Error>"
        % (key, codes[int(hashlib.sha1(key).hexdigest(), 16) % len(codes)].encode()) for key in keys)
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            + errors + b"</DeleteResult>")
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nx-amz-request-id: {uuid.uuid4().hex[:16].upper()}"
            f"\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body
