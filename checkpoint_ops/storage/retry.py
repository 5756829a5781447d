"""Retrying object-store requests that fail for a moment: one bounded policy, in one place.

Object stores throttle (503 SlowDown), fail (500), drop connections and cut replies short, and the S3
client stack would retry on three levels of its own: botocore (``retries`` mode and attempts), s3fs
(``S3FileSystem.retries``: connection errors, truncated bodies, SlowDown) and, once per request, aiohttp
(an idempotent request on a reused connection that turns out dead). Stacked, botocore's and s3fs's
attempts multiply, and neither knows what a retried request means to us. So the direct-put file manager
turns botocore's and s3fs's retries off and runs every request through a ``Retrier`` with this policy:

* which failures are worth another attempt is decided here (``transient_reason``): throttling, 5xx,
  dropped or refused connections, timeouts, a reply body shorter than its ``Content-Length`` or not
  matching its checksum (``x-amz-checksum-*``), an unparsable reply. Not found, exists, access denied
  and every other 4xx are answers, never retried. The same codes decide for the per-key errors of a
  ``200 OK`` multi-object delete (``transient_code``), which the file manager sends again, those keys
  only, through the same policy;
* a TLS handshake that no retry changes (``tls_refusal``: an ``https://`` endpoint of a server that speaks
  plain HTTP, a certificate not trusted) is a misconfiguration: ``StorageError`` at once, naming the endpoint;
* attempts are bounded (``max_attempts``), spaced by capped exponential backoff with full jitter
  (``delay_s``), and counted by request kind (``OpCounter.retries``);
* when they run out, ``StoreUnavailableError`` (not an ``OSError``: no caller mistakes a flaky store for
  a damaged file) names the request, the attempts, the time spent and the last failure.

What a retried request means is the file manager's business (``direct_put.py``): a conditional PUT whose
first attempt was stored but whose reply was lost comes back 412, and is recognised as our own write by
its content; a retried delete or copy is idempotent; a listing page is retried on its own continuation
token, so keys are neither repeated nor skipped; a truncated read is retried, never parsed.

Configuration (storage options win over the environment; defaults in ``RetryPolicy``):

* ``CHECKPOINT_OPS_RETRY_ATTEMPTS``: attempts per request, first included (1 disables retries);
* ``CHECKPOINT_OPS_RETRY_BASE_DELAY``: seconds; the n-th retry waits up to ``base * 2**(n-1)``;
* ``CHECKPOINT_OPS_RETRY_MAX_DELAY``: seconds, the cap on one wait;
* storage option ``"retry": {"max_attempts": N, "base_delay_s": S, "max_delay_s": S}`` (taken out
  before the options reach fsspec).
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import random
import ssl
import time
from dataclasses import asdict, dataclass
from typing import Awaitable, Callable, Mapping, TypeVar

from ..errors import StorageError, StoreUnavailableError

T = TypeVar("T")

ENV_ATTEMPTS = "CHECKPOINT_OPS_RETRY_ATTEMPTS"
ENV_BASE_DELAY = "CHECKPOINT_OPS_RETRY_BASE_DELAY"
ENV_MAX_DELAY = "CHECKPOINT_OPS_RETRY_MAX_DELAY"
OPTION = "retry"  # the storage option holding a policy (never passed to fsspec)

# S3 error codes that mean "try again": throttling, server trouble, a body damaged in transit, a
# conditional write racing another one (AWS says: retry).
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "ProvisionedThroughputExceededException", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "PriorRequestNotComplete", "ConditionalRequestConflict", "XAmzContentSHA256Mismatch",
    "BadDigest", "IncompleteBody",
}
# Failures below HTTP (by class name, so no client library is imported here), most specific first.
_TRANSIENT_TYPES = (
    ("IncompleteReadError", "truncated reply (shorter than its Content-Length)"),
    ("IncompleteRead", "truncated reply (shorter than its Content-Length)"),
    ("FlexibleChecksumError", "damaged reply (its body does not match its checksum)"),
    ("ClientPayloadError", "truncated reply (shorter than its Content-Length)"),
    ("ResponseStreamingError", "connection broken while reading the reply"),
    ("ResponseParserError", "unparsable reply"),
    ("ReadTimeoutError", "read timeout"),
    ("ConnectTimeoutError", "connect timeout"),
    ("EndpointConnectionError", "could not connect"),
    ("ConnectionClosedError", "connection closed before the reply"),
    ("ServerDisconnectedError", "connection closed before the reply"),
    ("ConnectionResetError", "connection reset"),
    ("ConnectionRefusedError", "connection refused"),
    ("ConnectionAbortedError", "connection aborted"),
    ("BrokenPipeError", "connection broken"),
    ("ClientConnectionError", "connection error"),
    ("ProtocolError", "connection broken"),
    ("TimeoutError", "timeout"),
)
_ANSWERS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)


def _whole(name: str, value: object) -> int:
    """``value`` as a whole number: 2, 2.0 or "2", not 2.7 or "2.7" (which ``int`` would quietly make 2)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(number)


# A delay longer than this is a mistake (an hour per retry; time.sleep overflows near 9e18 s)
MAX_DELAY_ALLOWED_S = 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one request is tried. The defaults ride out throttling and short
    blips (up to about 20 s of waiting per request) and give up on an outage, which then stops the
    operation where ``resume`` (or running it again) picks it up."""

    max_attempts: int = 10
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"retry max_attempts must be at least 1, not {self.max_attempts}")
        if not all(0 <= d <= MAX_DELAY_ALLOWED_S for d in (self.base_delay_s, self.max_delay_s)):  # nan fails too
            raise ValueError(f"retry delays must be between 0 and {MAX_DELAY_ALLOWED_S:g} s: base_delay_s "
                             f"{self.base_delay_s}, max_delay_s {self.max_delay_s} ({ENV_BASE_DELAY}, {ENV_MAX_DELAY}, "
                             f"or the storage option {OPTION!r})")

    @classmethod
    def resolve(cls, option: object = None, environ: Mapping[str, str] | None = None) -> "RetryPolicy":
        """The policy from the environment, overridden by the storage option ``retry`` (a dict).
        Unusable values are a ValueError naming the setting."""
        env = os.environ if environ is None else environ
        fields = {}
        for name, var, parse in (("max_attempts", ENV_ATTEMPTS, int), ("base_delay_s", ENV_BASE_DELAY, float),
                                 ("max_delay_s", ENV_MAX_DELAY, float)):
            if env.get(var):
                try:
                    fields[name] = parse(env[var])
                except ValueError:
                    raise ValueError(f"{var}={env[var]!r} is not a {parse.__name__}") from None
        if option is not None:
            if not isinstance(option, dict) or set(option) - {"max_attempts", "base_delay_s", "max_delay_s"}:
                raise ValueError(f"storage option {OPTION!r} must be an object with max_attempts, base_delay_s "
                                 f"and/or max_delay_s, not {option!r}")
            fields.update(option)
        try:
            return cls(**{k: (_whole(k, v) if k == "max_attempts" else float(v)) for k, v in fields.items()})
        except (TypeError, ValueError) as e:
            raise ValueError(f"retry policy: {e}") from None

    def delay_s(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """How long to wait before retry number ``retry`` (1 = the second attempt): full jitter, uniform
        in [0, min(max_delay_s, base_delay_s * 2**(retry-1))]."""
        return rand() * min(self.max_delay_s, self.base_delay_s * 2 ** (retry - 1))

    def to_dict(self) -> dict:
        return asdict(self)


def transient_code(code: str) -> bool:
    """Whether an S3 error code (of a reply, or of one key in a multi-object delete's reply) means
    "try again"."""
    return code in _TRANSIENT_CODES


def transient_reason(e: BaseException) -> str | None:
    """Why ``e`` is worth another attempt (e.g. ``"503 SlowDown"``, ``"connection reset"``,
    ``"truncated reply (shorter than its Content-Length)"``), or None when it is an answer (not found,
    exists, denied, any other 4xx) or not a storage failure at all."""
    if isinstance(e, _ANSWERS):
        return None
    seen = 0
    exc: BaseException | None = e
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            status = int(status) if str(status).isdigit() else (int(code) if code.isdigit() else None)
            if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
                if status is None:  # a per-key error of a 200 reply carries a code only
                    return code
                return f"{status} {code}" if code and code != str(status) else str(status)
            return None  # an HTTP answer that retrying will not change
        names = {cls.__name__ for cls in type(exc).__mro__}
        for name, reason in _TRANSIENT_TYPES:
            if name in names:
                # botocore wraps the socket's own error (kwargs["error"]): it often says more
                inner = getattr(exc, "kwargs", {}).get("error") if isinstance(getattr(exc, "kwargs", None), dict) \
                    else None
                return _socket_reason(inner) or _socket_reason(exc) or reason
        if isinstance(exc, asyncio.TimeoutError):
            return "timeout"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


# What a TLS handshake answers when the other end speaks plain HTTP (or something else that is not TLS).
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "RECORD_LAYER_FAILURE",
                      "PACKET_LENGTH_TOO_LONG"})


def tls_refusal(e: BaseException) -> str | None:
    """Why a connection's TLS handshake failed in a way no retry changes (the endpoint does not speak TLS,
    or its certificate is not trusted), wherever the client libraries wrapped it; None otherwise (a
    handshake cut short is a dropped connection, retried)."""
    exc: BaseException | None = e
    for _ in range(8):
        if exc is None:
            return None
        # (aiohttp's own errors subclass these without their attributes: the socket's error is further down)
        detail = getattr(exc, "verify_message", None) or getattr(exc, "reason", None)
        if isinstance(exc, ssl.SSLCertVerificationError) and detail:
            return f"its certificate is not trusted ({detail})"
        if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _NOT_TLS:
            return f"it does not speak TLS there ({exc.reason})"
        exc = exc.__cause__ or exc.__context__
    return None


_ERRNO_REASONS = {errno.ECONNRESET: "connection reset", errno.ECONNREFUSED: "connection refused",
                  errno.EPIPE: "connection broken", errno.ECONNABORTED: "connection aborted",
                  errno.ETIMEDOUT: "timeout"}


def _socket_reason(e: object) -> str | None:
    """A precise reason from an OS-level error (a reset, a refusal), wherever it is wrapped."""
    depth = 0
    while isinstance(e, BaseException) and depth < 4:
        if isinstance(e, OSError) and e.errno in _ERRNO_REASONS:
            return _ERRNO_REASONS[e.errno]
        e, depth = e.__cause__ or e.__context__, depth + 1
    return None


class Retrier:
    """A policy bound to a request counter: runs one request again after a transient failure.

    ``kind`` names the request in the counter (``GetObject``, ``PutObject``...); ``url`` the object
    in the error a user sees when the attempts run out.
    """

    def __init__(self, policy: RetryPolicy, counter, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random, endpoint: str | None = None):
        self.policy = policy
        self.counter = counter
        self._sleep = sleep
        self._rand = rand
        self.endpoint = endpoint  # the store's endpoint URL where one was set: named when it cannot be reached

    def _give_up(self, kind: str, url: str, attempt: int, started: float, reason: str) -> StoreUnavailableError:
        took = time.monotonic() - started
        # a failure below HTTP (refused, reset, timed out) may be the wrong endpoint: say which one was tried
        where = f"; endpoint {self.endpoint}" if self.endpoint and not reason[:1].isdigit() else ""
        return StoreUnavailableError(
            f"the object store kept failing: {kind} failed {attempt} time(s) over {took:.1f} s "
            f"(last: {reason}{where})", path=url, retries=self.counter.retries())

    def _judge(self, e: Exception, kind: str, url: str, attempt: int, started: float) -> float:
        """The wait before the next attempt; raises when ``e`` is an answer or attempts ran out."""
        tls = tls_refusal(e)
        if tls is not None:
            raise StorageError(
                f"no TLS connection to the object store{f' at {self.endpoint}' if self.endpoint else ''}: {tls}",
                path=url, fix="check the endpoint's scheme (a server without TLS is reached with http://, one with "
                "TLS with https://); for a certificate signed by your own authority, point AWS_CA_BUNDLE (or the "
                "storage option client_kwargs.verify) at it") from e
        reason = transient_reason(e)
        if reason is None:
            raise e
        if attempt >= self.policy.max_attempts:
            raise self._give_up(kind, url, attempt, started, reason) from e
        self.counter.add_retry(kind)
        return self.policy.delay_s(attempt, self._rand)

    def call(self, kind: str, url: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        attempt = 1
        while True:
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - judged, then re-raised or retried
                wait = self._judge(e, kind, url, attempt, started)
            self._sleep(wait)
            attempt += 1

    async def acall(self, kind: str, url: str, fn: Callable[[], Awaitable[T]]) -> T:
        started = time.monotonic()
        attempt = 1
        while True:
            try:
                return await fn()
            except Exception as e:  # noqa: BLE001 - judged, then re-raised or retried
                wait = self._judge(e, kind, url, attempt, started)
            await asyncio.sleep(wait)
            attempt += 1
