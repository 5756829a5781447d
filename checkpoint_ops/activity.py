"""Is a query running on this checkpoint? A lease our runner holds, or an uncommitted fresh batch.

The lease is a hidden file in the checkpoint root (Spark never reads hidden names there), so the
one listing every operation starts with already tells whether it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

from .errors import RefusedError
from .model.checkpoint import Checkpoint
from .storage import CheckpointFileManager
from .storage.paths import join

LEASE_NAME = ".checkpoint-ops.lease"
DEFAULT_FRESH_SECONDS = 600  # an uncommitted batch planned this recently means "running"


def read_lease(fm: CheckpointFileManager, root: str) -> dict | None:
    try:
        return json.loads(fm.read_bytes(join(root, LEASE_NAME)))
    except FileNotFoundError:
        return None
    except ValueError:
        return {"owner": "unknown (unreadable lease file)", "expires_ms": float("inf")}


def active_reasons(ckpt: Checkpoint, fresh_seconds: int = DEFAULT_FRESH_SECONDS, now: float | None = None) -> list[str]:
    """Why the checkpoint looks in use (empty: it looks idle)."""
    now = time.time() if now is None else now
    reasons = []
    if LEASE_NAME in ckpt.listing:
        lease = read_lease(ckpt.fm, ckpt.root)
        if lease and lease.get("expires_ms", 0) > now * 1000:
            reasons.append(
                f"a run holds the lease {ckpt.listing.url(LEASE_NAME)} (owner {lease.get('owner')}, "
                f"expires {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(lease['expires_ms'] / 1000)) if lease['expires_ms'] != float('inf') else 'never'})"
            )
    L, C = ckpt.latest_offset, ckpt.latest_commit
    # On a fenced checkpoint no query can be running, and an uncommitted newest batch is the
    # interrupted operation's own doing: only a lease means activity then.
    if ckpt.fence is None and L is not None and (C is None or L > C):
        info = ckpt.offset_files[L].info
        if info.mtime is not None and now - info.mtime < fresh_seconds:
            reasons.append(
                f"offsets/{L} has no commit yet and was written {int(now - info.mtime)} s ago: a batch is probably running"
            )
    return reasons


def sink_active_reasons(sink, fresh_seconds: int = DEFAULT_FRESH_SECONDS, now: float | None = None) -> list[str]:
    """Why a file sink's output looks in use when its checkpoint is not known: a fresh newest log file."""
    now = time.time() if now is None else now
    log = sink.log
    if log.latest is None:
        return []
    info = log.files[log.latest].info
    if info.mtime is not None and now - info.mtime < fresh_seconds:
        return [f"{log.rel(log.latest)} was written {int(now - info.mtime)} s ago: the query is probably running"]
    return []


def refuse_if_active(ckpt: Checkpoint, force: bool, fresh_seconds: int = DEFAULT_FRESH_SECONDS) -> None:
    reasons = active_reasons(ckpt, fresh_seconds)
    if reasons and not force:
        raise RefusedError(
            "the query looks active: " + "; ".join(reasons),
            path=ckpt.url,
            fix="stop the query (and wait for its lease to be released) and try again; --force overrides this "
            "check if you are sure nothing runs",
        )


@contextlib.contextmanager
def hold_lease(fm: CheckpointFileManager, root: str, owner: str, ttl_seconds: int = 6 * 3600):
    """Hold the checkpoint's lease while a query runs; refuses if another live lease exists."""
    path = join(root, LEASE_NAME)
    doc = {
        "owner": owner,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "acquired_ms": int(time.time() * 1000),
        "expires_ms": int((time.time() + ttl_seconds) * 1000),
    }
    data = json.dumps(doc).encode()
    try:
        fm.write_bytes(path, data, overwrite=False)
    except FileExistsError:
        current = read_lease(fm, root) or {}
        if current.get("expires_ms", 0) > time.time() * 1000:
            raise RefusedError(
                f"another run holds the lease (owner {current.get('owner')}, host {current.get('host')})",
                path=fm.url(path),
                fix="wait for it to finish; if it died, delete the lease file once you are sure",
            ) from None
        fm.write_bytes(path, data, overwrite=True)  # an expired lease: take it over
    try:
        yield doc
    finally:
        current = read_lease(fm, root)
        if current and current.get("acquired_ms") == doc["acquired_ms"] and current.get("pid") == doc["pid"]:
            fm.delete(path)
