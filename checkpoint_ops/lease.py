"""The lease: one writer at a time on a checkpoint, a sink output or a backup destination.

The lease is a hidden file, ``.checkpoint-ops.lease``, in the root it guards (Spark skips hidden names,
so a checkpoint or a sink output stays what Spark reads, and the one listing every command starts with
shows it). It holds a ``liveness.Holder``. Every mutating operation takes the lease of every root it
changes before it plans, and holds it to the end; the streaming runner holds the same lease while its
query runs; a user's own query can hold it too (``checkpoint_ops.spark.hold_lease_while_active``).

* **Acquire** is a put-if-absent (``link()`` on local disk, ``If-None-Match: *`` on object stores): of
  two processes that start together exactly one gets it; the other is refused (exit 1) with the
  holder's owner, host, pid and since when.
* **Heartbeat.** The holder rewrites its record every third of the time to live (default 60 s). Before
  each renewal it checks the record is still its own, so a holder that lost the lease learns it.
* **Takeover.** A lease whose holder is a dead pid on this host, or whose heartbeat lapsed, is stale.
  Taking it over is race-free: the taker first creates ``.checkpoint-ops.lease.takeover-<token>`` (put-
  if-absent, named after the stale record's token, so only one process can claim a given stale lease),
  checks the lease still holds that token, then replaces it. The claim is removed when the new holder
  releases. A warning says whose lease was taken over and why.
* **Release** deletes the lease if it is still ours (and our takeover claim). ``lease break`` removes a
  lease by hand, journaled (``break_lease``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from .errors import RefusedError
from .liveness import Heartbeat, Holder, default_ttl, process_start
from .model.listing import OWN_FILE_PREFIXES
from .storage import CheckpointFileManager
from .storage.paths import dirname, join

LEASE_NAME = ".checkpoint-ops.lease"
TAKEOVER_PREFIX = LEASE_NAME + ".takeover-"


def is_lease_file(rel: str) -> bool:
    """Our lease, takeover claims and their checksum sidecars, in the root they guard (hidden: never Spark
    data, never backed up or restored, never part of the model)."""
    return rel.startswith(OWN_FILE_PREFIXES)


@dataclass(frozen=True)
class LeaseState:
    """What a lease file says, judged now."""

    url: str  # the lease file
    holder: Holder | None  # None: free (no file) or unreadable
    present: bool
    stale_reason: str | None = None  # why the holder no longer holds it (None: it does, or free)
    unreadable: str | None = None  # the file is there but is not a lease record

    @property
    def held(self) -> bool:
        """Someone holds it now (a live holder, or an unreadable record we cannot judge as stale)."""
        return self.present and self.stale_reason is None

    def describe(self) -> str:
        if not self.present:
            return "free"
        who = self.holder.describe() if self.holder else f"an unreadable lease record ({self.unreadable})"
        if self.stale_reason:
            return f"stale: held by {who}, but {self.stale_reason}"
        return f"held by {who}"

    def to_dict(self) -> dict:
        return {"lease": self.url, "state": "free" if not self.present else ("stale" if self.stale_reason else "held"),
                "holder": self.holder.to_dict() if self.holder else None, "stale_reason": self.stale_reason,
                "unreadable": self.unreadable}


def lease_path(root: str) -> str:
    return join(root, LEASE_NAME)


_HELD_HERE: set[str] = set()  # tokens of the leases this process holds right now
_HELD_LOCK = threading.Lock()


def _left_here(holder: Holder) -> str | None:
    """A record naming this very process for a lease it no longer holds: its release failed (the store
    did not answer), and the process went on. Without this, a long-lived process (a Dagster code server, a
    test) would wait out the time to live for a lease nobody holds."""
    if holder.host != socket.gethostname() or holder.pid != os.getpid():
        return None
    if holder.pid_start != process_start(os.getpid()):
        return None
    with _HELD_LOCK:
        if holder.token in _HELD_HERE:
            return None
    return f"it was left by this process (pid {holder.pid}), which no longer holds it (its release failed)"


def read_lease(fm: CheckpointFileManager, root: str, now: float | None = None) -> LeaseState:
    """The lease of ``root`` as it is now (one GET, and a HEAD if the record is unreadable)."""
    path = lease_path(root)
    url = fm.url(path)
    try:
        data = fm.read_bytes(path)
    except FileNotFoundError:
        return LeaseState(url, None, False)
    try:
        holder = Holder.from_dict(json.loads(data))
    except ValueError:
        holder = None
    if holder is not None:
        return LeaseState(url, holder, True, holder.stale_reason(now) or _left_here(holder))
    # Not a record we wrote (edited, or a foreign file): judge it by its age alone.
    info = fm.info(path)
    age = (time.time() if now is None else now) - (info.mtime if info and info.mtime is not None else 0)
    stale = f"it is unreadable and {int(age)} s old" if age > default_ttl() else None
    return LeaseState(url, None, True, stale, unreadable="not a lease record")


def lease_of(fm: CheckpointFileManager, root: str, listing=None) -> LeaseState:
    """``read_lease``, without a request when a listing of ``root`` already shows there is none."""
    if listing is not None and LEASE_NAME not in listing.own:
        return LeaseState(fm.url(lease_path(root)), None, False)
    return read_lease(fm, root)


class LeaseHeld(RefusedError):
    """Another process holds the lease (exit 1)."""


class LeaseLost(RefusedError):
    """The lease was taken from us while we held it (our heartbeat lapsed): stop changing things."""


def _refusal(state: LeaseState, what: str, root_url: str) -> LeaseHeld:
    holder = state.holder
    beat = ""
    if holder is not None:
        beat = f"; last heartbeat {max(0, int(time.time() - holder.heartbeat_ms / 1000))} s ago"
    return LeaseHeld(
        f"{what} is in use: {state.describe()}{beat}",
        path=state.url,
        fix=f"wait for it to finish (`checkpoint-ops lease show {root_url}`); if you are sure nothing runs there "
            f"any more: `checkpoint-ops lease break {root_url} --yes`",
    )


@dataclass
class Lease:
    """A lease this process holds on one root, renewed by a heartbeat until released."""

    fm: CheckpointFileManager
    root: str
    holder: Holder
    took_over: str | None = None  # the stale holder's token, if we took its lease over
    notes: list[str] = field(default_factory=list)  # warnings for the user (a takeover)
    created: list[str] = field(default_factory=list)  # directories the lease made (a new restore target, and
    # its missing parents, deepest first): gone again if left empty
    _heartbeat: Heartbeat | None = None

    def __post_init__(self) -> None:
        with _HELD_LOCK:
            _HELD_HERE.add(self.holder.token)

    @property
    def url(self) -> str:
        return self.fm.url(self.root)

    @property
    def path(self) -> str:
        return lease_path(self.root)

    def _renew(self) -> None:
        state = read_lease(self.fm, self.root)
        if state.holder is None or state.holder.token != self.holder.token:
            raise LeaseLost(f"the lease was taken from this process: it is now {state.describe()}", path=state.url,
                            fix="the operation stopped where it was; finish it with `checkpoint-ops resume` once the "
                            "other holder is done")
        self.holder = self.holder.renewed()
        self.fm.write_bytes(self.path, json.dumps(self.holder.to_dict()).encode(), overwrite=True)

    def start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self._renew, self.holder.ttl_s / 3).start()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the heartbeat found the lease taken (called between steps)."""
        if self._heartbeat is not None and self._heartbeat.error is not None:
            err = self._heartbeat.error
            if isinstance(err, LeaseLost):
                raise err
            raise LeaseLost(f"the lease could not be renewed: {err}", path=self.fm.url(self.path),
                            fix="check the storage; the operation stopped where it was: finish it with "
                            "`checkpoint-ops resume`") from err

    def _drop_dead_temps(self) -> None:
        """Temp files of lease writes older than our lease: their writers died mid-write (a writer that
        lost the race removes its own), so nothing else will ever remove them. Object stores have none."""
        if self.fm.strategy == "direct-put":
            return
        dead = [f.path for f in self.fm.list(self.root)
                if not f.is_dir and f.name.startswith("." + OWN_FILE_PREFIXES[0]) and f.name.endswith(".tmp")
                and f.mtime is not None and f.mtime * 1000 < self.holder.acquired_ms]
        if dead:
            self.fm.delete_many(dead)

    def release(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        with _HELD_LOCK:  # from now on not held, even if deleting the record fails
            _HELD_HERE.discard(self.holder.token)
        state = read_lease(self.fm, self.root)
        if state.holder is not None and state.holder.token == self.holder.token:
            self.fm.delete(self.path)  # with its checksum sidecar, where the file system keeps one
        if self.took_over:
            self.fm.delete(join(self.root, TAKEOVER_PREFIX + self.took_over))
        self._drop_dead_temps()
        if self.created and not self.fm.walk(self.root):
            for d in self.created:  # a refused restore leaves no empty target behind
                self.fm.remove_empty_dirs(d)


def acquire(fm: CheckpointFileManager, root: str, owner: str, what: str | None = None,
            ttl_s: float | None = None, heartbeat: bool = True) -> Lease:
    """Take the lease of ``root`` for ``owner`` (module docstring); ``LeaseHeld`` if another holds it."""
    what = what or fm.url(root)
    me = Holder.me(owner, ttl_s)
    with _HELD_LOCK:  # before the record can exist: a thread of this process must never judge it left behind
        _HELD_HERE.add(me.token)
    try:
        return _acquire(fm, root, what, me, heartbeat)
    except BaseException:
        with _HELD_LOCK:
            _HELD_HERE.discard(me.token)
        raise


def _acquire(fm: CheckpointFileManager, root: str, what: str, me: Holder, heartbeat: bool) -> Lease:
    body = json.dumps(me.to_dict()).encode()
    path = lease_path(root)
    created = _missing_dirs(fm, root)
    for _ in range(3):  # a lease released or taken over while we look: look again
        try:
            fm.write_bytes(path, body, overwrite=False)
            lease = Lease(fm, root, me, created=created)
            break
        except FileExistsError:
            pass
        state = read_lease(fm, root)
        if not state.present:
            continue  # released between our put and our read
        if state.held:
            raise _refusal(state, what, fm.url(root))
        lease = _take_over(fm, root, state, me, body)
        if lease is not None:
            break
    else:
        raise _refusal(read_lease(fm, root), what, fm.url(root))
    if heartbeat:
        lease.start_heartbeat()
    return lease


def _missing_dirs(fm: CheckpointFileManager, root: str) -> list[str]:
    """``root`` and its ancestors that do not exist yet, deepest first: writing the lease makes them.
    Object stores have no directories."""
    if fm.strategy == "direct-put":
        return []
    out, d = [], root.rstrip("/")
    while d and d not in ("/", ".") and fm.info(d) is None:
        out.append(d)
        d = dirname(d)
    return out


def _take_over(fm: CheckpointFileManager, root: str, stale: LeaseState, me: Holder, body: bytes) -> Lease | None:
    """Replace a stale lease, unless another process claims it first (then None: look again)."""
    token = stale.holder.token if stale.holder else "unreadable"
    claim = join(root, TAKEOVER_PREFIX + token)
    try:
        fm.write_bytes(claim, json.dumps(me.to_dict()).encode(), overwrite=False)
    except FileExistsError:
        return None  # someone else is taking this one over: see who holds it now
    now = read_lease(fm, root)
    same = now.present and now.stale_reason is not None and (
        (now.holder.token if now.holder else "unreadable") == token)
    if not same:
        fm.delete(claim)
        return None
    fm.write_bytes(lease_path(root), body, overwrite=True)
    note = f"took over the lease of {fm.url(root)} from {stale.describe()}"
    return Lease(fm, root, me, took_over=token, notes=[note])


@dataclass
class LeaseSet:
    """The leases one operation holds (its checkpoint, sinks, restore targets...), taken in a fixed order."""

    leases: list[Lease] = field(default_factory=list)

    def covers(self, fm: CheckpointFileManager, root: str) -> bool:
        url = fm.url(root)
        return any(lease.url == url for lease in self.leases)

    @property
    def notes(self) -> list[str]:
        return [n for lease in self.leases for n in lease.notes]

    def check(self) -> None:
        for lease in self.leases:
            lease.check()

    def release(self) -> None:
        errors = []
        for lease in reversed(self.leases):
            try:
                lease.release()
            except Exception as e:  # noqa: BLE001 - release the others; report the first
                errors.append(e)
        self.leases.clear()
        if errors:
            raise errors[0]

    def __enter__(self) -> "LeaseSet":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire_all(locations: list[tuple[CheckpointFileManager, str, str]], owner: str,
                held: LeaseSet | None = None, into: LeaseSet | None = None) -> LeaseSet:
    """Take the lease of each (file manager, root, what) not already ``held``, in URL order; on a
    refusal release what was taken and re-raise. Returns the set taken now (``into`` if given)."""
    taken = into if into is not None else LeaseSet()
    seen = set()
    for fm, root, what in sorted(locations, key=lambda loc: loc[0].url(loc[1])):
        url = fm.url(root)
        if url in seen or (held is not None and held.covers(fm, root)) or taken.covers(fm, root):
            continue
        seen.add(url)
        try:
            taken.leases.append(acquire(fm, root, owner, what))
        except BaseException:
            taken.release()
            raise
    return taken
