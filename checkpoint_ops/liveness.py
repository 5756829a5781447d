"""Who holds something, and whether they still do.

One record for every claim a process makes on shared storage: the lease on a checkpoint (or a sink
output, or a backup destination), a backup's intent, a prune's lock. A claim is short-lived and kept
alive by a heartbeat; anyone may judge it stale, and take over, when

* its holder ran on this host and that process is gone (the pid is not running, or is running but
  started at another time: the pid was reused), or
* its heartbeat is older than its time to live (a holder on another host, or a hung one).

Nothing here touches storage: callers read and write the record through the file manager.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Callable

from .units import iso_ms

# Short, so a killed holder blocks others for about a minute, not hours; renewed every third of it.
DEFAULT_TTL_S = 60.0
TTL_ENV = "CHECKPOINT_OPS_LEASE_TTL"  # seconds; tests and slow stores may change it


# ``Holder.kind``
OPERATION = "operation"
RUN = "run"
# How often, at most, a RUN holder's watcher looks at its lease by default (``spark.hold_lease_while_active``'s
# poll; a Dagster run looks every second): what a break of its lease waits on after the holder's next heartbeat
RUN_LOOK_S = 5.0


def default_ttl() -> float:
    try:
        return max(1.0, float(os.environ.get(TTL_ENV, DEFAULT_TTL_S)))
    except ValueError:
        return DEFAULT_TTL_S


def _now_ms(now: float | None = None) -> int:
    return int((time.time() if now is None else now) * 1000)


def process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (Linux), to tell a reused pid from its first
    owner; None where the system does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after it
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of the whole line


def pid_running(pid: int, started: str | None) -> bool:
    """Whether the process ``pid`` (started at ``started``, if known) is still running on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    if started is not None:
        now = process_start(pid)
        if now is not None and now != started:
            return False  # the pid was reused by a later process
    return True


@dataclass(frozen=True)
class Holder:
    """A claim: who (owner, host, pid), since when, and its last heartbeat."""

    owner: str  # what the holder says it is ("checkpoint-ops rollback", "dagster run 1a2b (events)")
    host: str
    pid: int
    pid_start: str | None
    token: str  # unique per claim: a holder recognises its own record by it
    acquired_ms: int
    heartbeat_ms: int
    ttl_s: float
    # what kind of holder: OPERATION (a command that checks its lease between steps and stops once it lost
    # it), RUN (a streaming query or a Dagster run holding it across one run: its watcher stops the query once
    # its heartbeat finds the lease lost, within ``RUN_LOOK_S`` of that), or
    # None (not said: a record written before 0.2, a backup intent, a prune lock)
    kind: str | None = None
    # the operation an OPERATION holder runs ("rollback", "undo", ... ``Operation.name``); None: not said (a
    # RUN, or a record written before 0.3). What ``undo`` weighs when a command died holding the lease.
    operation: str | None = None
    # stale by age alone, even once its process is gone: the record a holder that lost its lease to a takeover
    # leaves (``lease.Lease._stop_if_taken_while_late``), so that nobody takes the lease over while the process
    # that took it stops, however soon this one exits
    outlives_process: bool = False

    @classmethod
    def me(cls, owner: str, ttl_s: float | None = None, now: float | None = None,
           kind: str | None = None, operation: str | None = None) -> "Holder":
        ms = _now_ms(now)
        pid = os.getpid()
        return cls(owner, socket.gethostname(), pid, process_start(pid), uuid.uuid4().hex, ms, ms,
                   default_ttl() if ttl_s is None else float(ttl_s), kind, operation)

    def renewed(self, now: float | None = None) -> "Holder":
        return replace(self, heartbeat_ms=_now_ms(now))

    # -- judging ---------------------------------------------------------------------------------
    def stale_reason(self, now: float | None = None) -> str | None:
        """Why this claim no longer holds (None: it does)."""
        if not self.outlives_process and self.host == socket.gethostname() and not pid_running(self.pid,
                                                                                                 self.pid_start):
            return f"its process (pid {self.pid} on this host) is gone"
        ms = _now_ms(now)
        if ms - self.heartbeat_ms > self.ttl_s * 1000:
            return (f"its last heartbeat was at {iso_ms(self.heartbeat_ms)}, {int((ms - self.heartbeat_ms) / 1000)} s "
                    f"ago (it renews every {self.ttl_s / 3:g} s)")
        return None

    def is_mine(self) -> bool:
        return self.host == socket.gethostname() and self.pid == os.getpid()

    def describe(self) -> str:
        return f"{self.owner} (host {self.host}, pid {self.pid}, since {iso_ms(self.acquired_ms)})"

    # -- (de)serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: object) -> "Holder | None":
        """The record, or None if ``doc`` is not one (damaged, or written by something else)."""
        if not isinstance(doc, dict):
            return None
        try:
            return cls(str(doc["owner"]), str(doc["host"]), int(doc["pid"]),
                       None if doc.get("pid_start") is None else str(doc["pid_start"]), str(doc["token"]),
                       int(doc["acquired_ms"]), int(doc["heartbeat_ms"]), float(doc["ttl_s"]),
                       doc["kind"] if doc.get("kind") in (OPERATION, RUN) else None,
                       doc["operation"] if isinstance(doc.get("operation"), str) else None,
                       doc.get("outlives_process") is True)
        except (KeyError, TypeError, ValueError):
            return None


class Heartbeat:
    """Calls ``renew`` every ``interval_s`` on a daemon thread until stopped. A renewal that raises
    stops the heartbeat and is kept in ``error`` (the holder checks it at its next step)."""

    def __init__(self, renew: Callable[[], None], interval_s: float, name: str = "checkpoint-ops-heartbeat"):
        self._renew = renew
        self._interval = interval_s
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._renew()
            except BaseException as e:  # noqa: BLE001 - kept for the holder to raise
                self.error = e
                return

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """No renewal starts after this. From another thread: waits for the renewal under way, up to
        ``timeout`` seconds (None: as long as it takes), and returns False if it is still running then (it
        is left to finish or fail on its daemon thread; ``join`` waits for it). From the heartbeat's own
        thread (a renewal that stops its heartbeat): returns True at once."""
        self._stop.set()
        if self._thread is threading.current_thread():
            return True
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def join(self) -> None:
        """Wait until the heartbeat's thread has ended (after ``stop``: its last renewal has returned)."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "Heartbeat":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
