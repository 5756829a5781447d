"""Retrying the requests of a transfer that fail for a moment (object stores throttle and drop)."""

from __future__ import annotations

import random
import time

ATTEMPTS = 4


def transient(e: BaseException) -> bool:
    """A failure worth trying again: throttling, a 5xx, a dropped or timed-out connection."""
    if isinstance(e, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    code = ""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", "")) + " " + \
            str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    text = f"{type(e).__name__} {e} {code}"
    return any(w in text for w in ("SlowDown", "Throttl", "RequestTimeout", "InternalError", "ServiceUnavailable",
                                   " 500", " 502", " 503", " 504", "ConnectionError", "ConnectionReset",
                                   "EndpointConnectionError", "ReadTimeout", "TimeoutError", "IncompleteRead",
                                   "ServerDisconnected", "ClientOSError"))


def retry(fn, attempts: int = ATTEMPTS, base_delay: float = 0.2):
    """``fn()``, tried again with jittered exponential back-off while it fails transiently."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:
            if i == attempts - 1 or not transient(e):
                raise
            time.sleep(base_delay * 2 ** i * (0.5 + random.random()))
