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
* **A holder stops before anyone may take over.** ``check()`` (called between an operation's steps)
  raises ``LeaseLost`` once ``valid_for_s(ttl)`` (five sixths of the time to live) has passed since the
  start of the last renewal that succeeded (or of the acquire), by this process's monotonic clock: a
  renewal that hangs in retries stops the holder before its record can be judged stale. The sixth left
  is room for two hosts' clocks to disagree and for the step under way when ``check()`` last passed.
* **A renewal never lands after that point unnoticed.** A renewal reads the record (still our token?)
  and replaces it only if it is still the version read (``replace_if_same``). On S3 that is one PUT with
  ``If-Match``: a renewal stuck in retries until someone took the lease over is refused by the store, so
  it never replaces the new holder's record (the late holder stops; the new one goes on). So is a
  takeover's write, if the record it judged stale was renewed meanwhile. Where the store has no
  conditional replace (local disk, HDFS: a rename cannot be made conditional) the replace is
  unconditional (on local disk the file's content is compared with what was read just before the write,
  which leaves the write itself as a window; HDFS compares nothing): a renewal that has not written by that
  point does not write, and one whose write was stored only after it may have replaced the record of a
  process that took the lease over meanwhile.
  The late holder looks for that taker's claim (kept until it releases): if it is there, it stops, stamps its
  record once more (the late write's stamp predates the pause), to be judged by age alone (not by its process,
  which may exit at once), and leaves it to go stale a time to live later, and the taker stops at its next
  renewal, finding it; if not, nobody took it over (or the taker is done), and the late holder stops (a
  stepwise one) or goes on (one without steps).
* **Holders without steps.** A streaming query's lease (``spark.hold_lease_while_active``) and a Dagster
  run's (held across the Spark run) guard one opaque run, not steps that can stop: stopping their
  heartbeat would let the record go stale while the query still runs, and any command take the lease
  and change the checkpoint under it. Their heartbeat renews while the record holds their token, however
  late, and a renewal the store failed is tried again at the next beat (``renew_errors``); only a record
  that is not theirs stops it. Then ``check`` fails, and their watchers (``spark.ActiveQueryLease``, the
  Dagster runner, each checking every few seconds while the query runs) stop the query.
* **Takeover.** A lease whose holder is a dead pid on this host, or whose heartbeat lapsed, is stale.
  Taking it over is race-free: the taker first creates ``.checkpoint-ops.lease.takeover-<token>`` (put-
  if-absent, named after the stale record's token, so only one process can claim a given stale lease),
  checks the lease still holds that token, then replaces it. A claim holds its taker's record and is
  judged like a lease: a claim left by a takeover that was interrupted (killed, the store down) goes
  stale with its taker, and is then claimed in turn (``takeover-<the claim's token>``, put-if-absent
  again), up to ``MAX_CLAIM_CHAIN`` deep. A takeover that fails after its claim removes the claim. The
  claims are removed when the new holder releases: its own, those it claimed past, and every other stale one
  beside the lease (each names a lease record that is gone, so no takeover can go through it: a taker checks
  the lease still holds the record it judged once its claim is stored). A warning says whose lease was taken
  over and why; a refusal because of a live claim names the claim file and ``lease break``.
* **Release** deletes the lease if it is still ours (and our takeover claims), once no renewal is under
  way. On S3 it waits for one at most one renewal interval, then leaves it on its daemon thread: its
  ``If-Match`` names a record that is gone by the time it lands, so the store refuses it. Where the replace
  is unconditional (local disk, HDFS), a renewal landing after the delete would write the record back, over
  the record of whoever took the lease next: release waits for it, however long. ``lease break`` removes a
  lease by hand, and every takeover claim beside it, journaled (``lease_break.py``), never one a live process
  on this host holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable
from .errors import BadInputError, CheckpointOpsError, RefusedError, StorageError, StoreUnavailableError, store_kept_failing
from .interrupts import interrupts_held
from .liveness import OPERATION, RUN, Heartbeat, Holder, default_ttl, process_start
from .model.listing import OWN_FILE_PREFIXES
from .storage import CheckpointFileManager, FileChangedError
from .storage.paths import basename, dirname, join, place_key
from .units import iso_ms

# the temp files of a lease write: of the record and of its checksum sidecar (``.<name>.<uuid>.tmp``)
_DEAD_TEMP_PREFIXES = tuple("." + prefix for prefix in OWN_FILE_PREFIXES)

LEASE_NAME = ".checkpoint-ops.lease"
TAKEOVER_PREFIX = LEASE_NAME + ".takeover-"
# A holder goes on for this share of its time to live after a renewal starts, no longer (module docstring).
VALID_SHARE = 5 / 6
# Stale takeover claims claimed in turn before a takeover gives up: each is a takeover interrupted between its claim and
# its write (killed, or the store down), so the chain grows by one per such failure in a row; walking it costs one
# read per claim. Deep enough that the next command, not a person, ends any such run of failures.
MAX_CLAIM_CHAIN = 64


def valid_for_s(ttl_s: float) -> float:
    """How long after a renewal (or the acquire) starts its holder may go on changing things: less than
    the time to live, after which another process may judge the lease stale and take it over."""
    return ttl_s * VALID_SHARE


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
    version: str | None = None  # the record's version at the store, for ``replace_if_same`` (S3: its ETag)

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


def lease_root(lease_url: str) -> str:
    """The root a lease file's (or a takeover claim's) URL guards: what ``lease show`` takes."""
    parent, _, name = lease_url.rstrip("/").rpartition("/")
    return parent if parent and name.startswith(LEASE_NAME) else lease_url


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


def _json_or_none(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_lease(fm: CheckpointFileManager, root: str, now: float | None = None) -> LeaseState:
    """The lease of ``root`` as it is now (one GET, and a HEAD if the record is unreadable)."""
    return _read_record(fm, lease_path(root), now)


def _read_record(fm: CheckpointFileManager, path: str, now: float | None = None) -> LeaseState:
    """A lease or a takeover claim (both hold a ``Holder``), judged now."""
    url = fm.url(path)
    try:
        data, version = fm.read_versioned(path)
    except FileNotFoundError:
        return LeaseState(url, None, False)
    except IsADirectoryError:  # made by hand, or by a copy tool: no lease could be taken or read there
        raise BadInputError(f"{basename(path)} is a directory, where checkpoint-ops keeps the lease file",
                            path=url, fix="move that directory away (checkpoint-ops keeps nothing in a directory of that "
                            "name; keep what it holds elsewhere); nothing was changed") from None
    try:
        holder = Holder.from_dict(json.loads(data))
    except ValueError:
        holder = None
    if holder is not None:
        return LeaseState(url, holder, True, holder.stale_reason(now) or _left_here(holder), version=version)
    # Not a record we wrote (edited, or a foreign file): judge it by its age alone.
    info = fm.info(path)
    age = (time.time() if now is None else now) - (info.mtime if info and info.mtime is not None else 0)
    stale = f"it is unreadable and {int(age)} s old" if age > default_ttl() else None
    return LeaseState(url, None, True, stale, unreadable="not a lease record", version=version)


def lease_of(fm: CheckpointFileManager, root: str, listing=None) -> LeaseState:
    """``read_lease``, without a request when a listing of ``root`` already shows there is none."""
    if listing is not None and LEASE_NAME not in listing.own \
            and not any(rel.startswith(LEASE_NAME + "/") for rel in listing.own):  # (a directory holding files)
        return LeaseState(fm.url(lease_path(root)), None, False)
    return read_lease(fm, root)


class LeaseHeld(RefusedError):
    """Another process holds the lease (exit 1)."""


class LeaseLost(RefusedError):
    """The lease was taken from us while we held it (our heartbeat lapsed): stop changing things."""

    def finish_with(self, fix: str) -> "LeaseLost":
        """The same loss, with how to finish the command it stopped (one that is not journaled says so)."""
        e = LeaseLost(self.problem, path=self.path, fix=fix)
        e.__cause__ = self.__cause__
        return e


def guard_saying(guard: Callable[[], None] | None, fix: str) -> Callable[[], None]:
    """``guard`` (an operation's ``ApplyContext.guard``; None: nothing to check) whose ``LeaseLost`` says
    ``fix``: how to finish a command that is not journaled, such as a prune (run it again)."""

    def check() -> None:
        if guard is None:
            return
        try:
            guard()
        except LeaseLost as e:
            raise e.finish_with(fix) from None

    return check


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
    # monotonic time the last renewal that succeeded (or the acquire) started: ``check`` counts from it
    renewed_at: float = field(default_factory=time.monotonic)
    claims: list[str] = field(default_factory=list)  # our takeover claim and the stale ones it replaced
    notes: list[str] = field(default_factory=list)  # warnings for the user (a takeover)
    created: list[str] = field(default_factory=list)  # directories the lease made (a new restore target, and
    # its missing parents, deepest first): gone again if left empty
    # an operation that calls ``check`` between its steps (True), or a holder across one opaque run (a
    # streaming query: ``spark.hold_lease_while_active``, a Dagster run), which must not lose its lease
    # while the run goes on (False: module docstring, "Holders without steps")
    stepwise: bool = True
    renew_errors: int = 0  # renewals of a holder without steps that failed and were tried again
    _heartbeat: Heartbeat | None = None
    _lost: LeaseLost | None = None  # once lost, lost for good (a later renewal must not revive it)
    _overwrote: bool = False  # a late renewal of ours was stored over a taker's record: never delete it

    def __post_init__(self) -> None:
        with _HELD_LOCK:
            _HELD_HERE.add(self.holder.token)

    @property
    def url(self) -> str:
        return self.fm.url(self.root)

    @property
    def path(self) -> str:
        return lease_path(self.root)

    def _lapse(self, stored_late: bool = False) -> LeaseLost | None:
        """``LeaseLost`` if the last renewal that succeeded started too long ago for the lease to be ours
        for sure (module docstring); ``stored_late``: a renewal was just stored, after that point."""
        age = time.monotonic() - self.renewed_at
        limit = valid_for_s(self.holder.ttl_s)
        if age <= limit:
            return None
        what = f"the lease was last renewed {age:.1f} s ago"
        if stored_late:
            what = (f"a renewal of the lease was stored {age:.1f} s after the previous one started, so it may have "
                    "replaced the record of a process that took the lease over meanwhile (that process stops at "
                    "its next renewal)")
        return LeaseLost(f"{what}: after {limit:g} s of its {self.holder.ttl_s:g} s time to live another process "
                         "may take it over, so this process stops", path=self.fm.url(self.path),
                         fix="check the storage (renewing the lease is slow or failing); the operation stopped "
                         "where it was: finish it with `checkpoint-ops resume` (or `undo`)")

    def _renew(self) -> None:
        if self.stepwise:
            self._renew_once()
            return
        try:  # a holder without steps renews while the record is its own, however late (module docstring)
            self._renew_once()
        except LeaseLost:
            raise
        except Exception:  # noqa: BLE001 - the store failed this time (after its retries): try again next beat
            self.renew_errors += 1

    def _renew_once(self) -> None:
        """Read the record (still ours?), write it renewed. A stepwise holder never writes once it may have
        lapsed, and stops if its write landed that late (module docstring)."""
        if self._lost is not None and self.stepwise:
            raise self._lost
        started = time.monotonic()
        state = read_lease(self.fm, self.root)
        if state.holder is None or state.holder.token != self.holder.token:
            raise LeaseLost(f"the lease was taken from this process: it is now {state.describe()}", path=state.url,
                            fix="the operation stopped where it was; finish it with `checkpoint-ops resume` once the "
                            "other holder is done")
        lapse = self._lapse() if self.stepwise else None
        if lapse is not None:  # too late to write: the record may be someone else's by the time it lands
            raise lapse
        renewed = self.holder.renewed()
        try:  # only over the record just read: never over one a taker wrote meanwhile (module docstring)
            self.fm.replace_if_same(self.path, json.dumps(renewed.to_dict()).encode(), state.version)
        except (FileChangedError, FileNotFoundError):
            now = read_lease(self.fm, self.root)
            if now.holder is not None and now.holder.token == self.holder.token:
                # an earlier renewal of this process that its retries gave up on was stored meanwhile: still ours
                # (a holder without steps tries again at its next beat; a stepwise one stops, as for any failure)
                raise StorageError("a renewal of the lease crossed an earlier one of this process that the store "
                                   "stored late", path=now.url) from None
            raise LeaseLost(f"the lease was taken from this process while it renewed it (the store refused the "
                            f"late renewal): it is now {now.describe()}", path=now.url,
                            fix="the operation stopped where it was; finish it with `checkpoint-ops resume` once "
                            "the other holder is done") from None
        if not self.fm.conditional_replace and time.monotonic() - self.renewed_at > valid_for_s(self.holder.ttl_s):
            self._stop_if_taken_while_late()
        lapse = self._lapse(stored_late=True) if self.stepwise else None
        if lapse is not None:
            raise lapse
        self.holder, self.renewed_at = renewed, started

    def _stop_if_taken_while_late(self) -> None:
        """A renewal stored late on a store without a conditional replace (the process paused between its read
        and its write) may have replaced the record of a process that took the lease over meanwhile: its claim,
        named after our record and kept until it releases, says so. Then this holder has lost the lease and
        stops. Its record stays, stamped once more now if it is still ours (the late write carries the time of
        the renewal's read, before the pause, so it may be stale already) and marked to be judged by age alone
        (``Holder.outlives_process``: this process may exit at once, and a dead process's record is otherwise
        stale at once, while the taker's claim goes stale by age a time to live after the takeover; a review
        showed a third process taking the lease over then). Its release leaves it, and this process does not
        judge it its own leftover, so no third process finds the lease free or stale for a time to live while
        the taker and this holder stop; the taker finds it at its next renewal and stops too. (Writing the
        taker's record back instead could restore a record older than the taker's last renewal, or that of a
        taker interrupted long ago: a third review.) A leftover claim of an interrupted takeover stops it as
        well. If the store fails the re-stamp, the late record stands with its early stamp."""
        claim = join(self.root, TAKEOVER_PREFIX + self.holder.token)
        try:
            body = self.fm.read_bytes(claim)
        except FileNotFoundError:
            return  # nobody holds it through a takeover: the record is ours (or was free, and a release deletes it)
        self._overwrote = True
        try:  # stamped now (the late write's stamp predates its pause) and judged by age alone, if still ours
            state = read_lease(self.fm, self.root)
            if state.holder is not None and state.holder.token == self.holder.token:
                held = replace(self.holder.renewed(), outlives_process=True)
                self.fm.replace_if_same(self.path, json.dumps(held.to_dict()).encode(), state.version)
        except Exception:  # noqa: BLE001 - the store failed (or the taker renewed meanwhile): the record stands
            pass
        taker = Holder.from_dict(_json_or_none(body))
        who = taker.describe() if taker is not None else "another process"
        self._lost = LeaseLost(f"the lease was taken over by {who} while this process did not renew it, and a late "
                               "renewal of this process was stored over that holder's record: both stop (that holder "
                               "at its next renewal), and the record goes stale after its time to live",
                               path=self.fm.url(self.path),
                               fix="this process stopped; once that holder has stopped (`checkpoint-ops lease show`), "
                               "run it again (an operation: finish it with `checkpoint-ops resume`; the other holder's "
                               "operation too)")
        raise self._lost

    def verify(self) -> None:
        """``check``, then the record read now: ``LeaseLost`` if it is not ours, found at once rather than at the
        next renewal (before a holder without steps writes anything more under it)."""
        self.check()
        state = read_lease(self.fm, self.root)
        if state.holder is None or state.holder.token != self.holder.token:
            self._lost = LeaseLost(f"the lease was taken from this process: it is now {state.describe()}",
                                   path=state.url, fix="the run stopped; once that holder is done, run it again")
            raise self._lost

    def start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self._renew, self.holder.ttl_s / 3).start()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the heartbeat found the lease taken or could not renew it, or if no renewal
        succeeded for too long (module docstring). Called between steps; once lost, always lost."""
        if self._lost is None:
            self._lost = self._heartbeat_error() or (self._lapse() if self.stepwise else None)
        if self._lost is not None:
            raise self._lost

    def _heartbeat_error(self) -> LeaseLost | None:
        err = self._heartbeat.error if self._heartbeat is not None else None
        if err is None or isinstance(err, LeaseLost):
            return err
        lost = LeaseLost(f"the lease could not be renewed: {err}", path=self.fm.url(self.path),
                         fix="check the storage; the operation stopped where it was: finish it with "
                         "`checkpoint-ops resume`")
        lost.__cause__ = err
        return lost

    def _drop_dead_temps(self) -> None:
        """Temp files of lease writes older than our lease: their writers died mid-write (a writer that
        lost the race removes its own), so nothing else will ever remove them. Object stores have none."""
        if self.fm.strategy == "direct-put":
            return
        dead = [f.path for f in self.fm.list(self.root)
                if not f.is_dir and f.name.startswith(_DEAD_TEMP_PREFIXES) and f.name.endswith(".tmp")
                and f.mtime is not None and f.mtime * 1000 < self.holder.acquired_ms]
        if dead:
            self.fm.delete_many(dead)

    def release(self) -> None:
        """Stop renewing, then delete the record if it is still ours, our takeover claims, and dead lease
        temp files. Where renewals are conditional (S3), a renewal under way is waited for at most one
        renewal interval (a third of the time to live): a late one can never write the record back. Elsewhere
        release waits for it, however long: one landing after the delete could replace the record of the
        next holder (module docstring)."""
        if self._heartbeat is not None:
            self._heartbeat.stop(timeout=self.holder.ttl_s / 3 if self.fm.conditional_replace else None)
            self._heartbeat = None
        with _HELD_LOCK:  # from now on not held, even if deleting the record fails
            if not self._overwrote:  # that record goes stale by age, here too (``_stop_if_taken_while_late``)
                _HELD_HERE.discard(self.holder.token)
        state = read_lease(self.fm, self.root)
        # not a record a late renewal of ours wrote over a taker's (``_stop_if_taken_while_late``): left to go stale
        if state.holder is not None and state.holder.token == self.holder.token and not self._overwrote:
            self.fm.delete(self.path)  # with its checksum sidecar, where the file system keeps one
        for name in self.claims:
            self.fm.delete(join(self.root, name))
        self._drop_dead_temps()
        if self.created and not self.fm.walk(self.root):
            for d in self.created:  # a refused restore leaves no empty target behind
                self.fm.remove_empty_dirs(d)


def acquire(fm: CheckpointFileManager, root: str, owner: str, what: str | None = None,
            ttl_s: float | None = None, heartbeat: bool = True, stepwise: bool = True,
            operation: str | None = None) -> Lease:
    """Take the lease of ``root`` for ``owner`` (module docstring); ``LeaseHeld`` if another holds it.
    ``stepwise``: see ``Lease.stepwise``; ``operation``: the operation it is taken for (``Holder.operation``)."""
    what = what or fm.url(root)
    started = time.monotonic()  # no later than our record's heartbeat time: ``check`` counts from here
    # the kind says what breaking it would do (lease_break)
    me = Holder.me(owner, ttl_s, kind=OPERATION if stepwise else RUN, operation=operation)
    with _HELD_LOCK:  # before the record can exist: a thread of this process must never judge it left behind
        _HELD_HERE.add(me.token)
    try:
        return _acquire(fm, root, what, me, started, heartbeat, stepwise)
    except BaseException:
        with _HELD_LOCK:
            _HELD_HERE.discard(me.token)
        raise


def _acquire(fm: CheckpointFileManager, root: str, what: str, me: Holder, started: float,
             heartbeat: bool, stepwise: bool = True) -> Lease:
    body = json.dumps(me.to_dict()).encode()
    path = lease_path(root)
    created = _missing_dirs(fm, root)
    in_the_way: LeaseState | None = None  # the last takeover claim that kept us from a stale lease
    for _ in range(3):  # a lease released or taken over while we look: look again
        try:
            fm.write_bytes(path, body, overwrite=False)
            lease = Lease(fm, root, me, started, created=created)
            break
        except FileExistsError:
            pass
        state = read_lease(fm, root)
        if not state.present:
            continue  # released between our put and our read
        if state.held:
            raise _refusal(state, what, fm.url(root))
        taken = _take_over(fm, root, state, me, body, started)
        if isinstance(taken, Lease):
            lease = taken
            break
        if taken is not None:
            in_the_way = taken
    else:
        state = read_lease(fm, root)
        if in_the_way is not None and state.present and not state.held:
            raise _claim_refusal(state, in_the_way, what, fm.url(root))
        raise _refusal(state, what, fm.url(root))
    lease.stepwise = stepwise
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


def _token(state: LeaseState) -> str:
    """The token a takeover claim on this record is named after."""
    return state.holder.token if state.holder else "unreadable"


def _take_over(fm: CheckpointFileManager, root: str, stale: LeaseState, me: Holder, body: bytes,
               started: float) -> Lease | LeaseState | None:
    """Replace a stale lease (module docstring). None: it changed meanwhile (look again); a ``LeaseState``:
    the takeover claim in the way (a live taker's, one that cannot be judged, or too many stale ones)."""
    token = _token(stale)
    passed: list[str] = []  # stale claims in the way, each claimed in turn: removed with ours at release
    for _ in range(MAX_CLAIM_CHAIN + 1):
        claim = join(root, TAKEOVER_PREFIX + token)
        try:
            fm.write_bytes(claim, body, overwrite=False)
            break
        except FileExistsError:
            pass
        other = _read_record(fm, claim)
        if not other.present:
            return None  # its taker finished or gave up meanwhile: look again
        if other.held or other.holder is None:
            return other  # a live taker (it gets the lease, or gives up and removes its claim), or unjudgeable
        passed.append(basename(claim))
        token = other.holder.token
    else:
        return other
    try:
        now = read_lease(fm, root)
        if not (now.present and now.stale_reason is not None and _token(now) == _token(stale)):
            fm.delete(claim)
            return None
        took = time.monotonic() - started
        if took > valid_for_s(me.ttl_s):  # our record would be stale, or nearly, when it lands
            raise LeaseHeld(f"taking over the stale lease of {fm.url(root)} took {took:.1f} s, too long for its "
                            f"{me.ttl_s:g} s time to live: nothing was changed", path=fm.url(lease_path(root)),
                            fix="check the storage (it is slow), then run the command again")
        try:  # only over the stale record judged: a renewal that landed meanwhile wins
            fm.replace_if_same(lease_path(root), body, now.version)
        except (FileChangedError, FileNotFoundError):
            fm.delete(claim)
            return None  # look again
    except BaseException:
        # A claim whose takeover failed is removed; left behind (the store did not answer), it goes stale
        # with this process and the next taker claims it in turn.
        with contextlib.suppress(Exception):
            fm.delete(claim)
        raise
    note = f"took over the lease of {fm.url(root)} from {stale.describe()}"
    if passed:
        note += f" (past {len(passed)} takeover claim(s) left by interrupted takeovers)"
    try:  # best effort: the lease is ours already, and a claim left here is removed by a later holder
        left = _claims_left_by(fm, root, stale, {basename(claim), *passed})
    except (OSError, StoreUnavailableError, CheckpointOpsError):
        left = []
    return Lease(fm, root, me, started, claims=[basename(claim), *passed, *left], notes=[note])


def _claims_left_by(fm: CheckpointFileManager, root: str, stale: LeaseState, known: set[str]) -> list[str]:
    """Names of the takeover claims beside the lease, other than ``known``, that no takeover can go through any
    more, removed with ours at release: those the stale lease's own holder left (it took the lease over itself,
    then died holding it: a killed undo after a killed rollback, so its claim, named after the lease before it,
    is one no later taker would ever meet; the same process wrote them, so none is live), and every stale one
    (its taker gone or past its time to live: claims a taker walked past, left when that taker then died holding
    the lease, are never met again either). A live claim of another taker stays: it finds the lease changed,
    and removes its claim itself."""
    try:
        names = [f.name for f in fm.list(root)  # (a claim's .crc sidecar starts "..": not listed here)
                 if not f.is_dir and f.name.startswith(TAKEOVER_PREFIX) and f.name not in known]
    except (FileNotFoundError, NotADirectoryError):
        return []
    left = []
    for name in names:
        record = _read_record(fm, join(root, name))
        if not record.present:
            continue
        its_own = record.holder is not None and stale.holder is not None and record.holder.token == stale.holder.token
        if its_own or record.stale_reason is not None:
            left.append(name)
    return left


def _claim_refusal(stale: LeaseState, claim: LeaseState, what: str, root_url: str) -> LeaseHeld:
    """The lease is stale, but a takeover claim is in the way: say which, and how to clear it."""
    by = claim.holder.describe() if claim.holder else f"an unreadable claim ({claim.unreadable})"
    if claim.holder is not None and claim.held:
        age = max(0, int(time.time() - claim.holder.heartbeat_ms / 1000))
        until = iso_ms(int(claim.holder.heartbeat_ms + claim.holder.ttl_s * 1000))
        why = (f"a takeover of it was claimed {age} s ago by {by}, which has not finished; that claim is replaced "
               f"once it goes stale (its process gone, or at {until})")
    else:
        why = f"the takeover claim in the way cannot be replaced ({claim.describe()})"
    return LeaseHeld(
        f"{what} is in use: its lease is {stale.describe()}; {why}", path=claim.url,
        fix=f"if no other checkpoint-ops command is taking this lease over right now, remove the lease and its "
            f"takeover claims: `checkpoint-ops lease break {root_url} --yes`")


@dataclass
class LeaseSet:
    """The leases one operation holds (its checkpoint, sinks, restore targets...), taken in a fixed order."""

    leases: list[Lease] = field(default_factory=list)

    def covers(self, fm: CheckpointFileManager, root: str) -> bool:
        """A lease of this place is in the set, however either spelled it (a symbolic link, ``s3a://``)."""
        place = place_key(fm.url(root))
        return any(place_key(lease.url) == place for lease in self.leases)

    @property
    def notes(self) -> list[str]:
        return [n for lease in self.leases for n in lease.notes]

    def check(self) -> None:
        for lease in self.leases:
            lease.check()

    def verify(self) -> None:
        """``Lease.verify`` of each: one read of each record."""
        for lease in self.leases:
            lease.verify()

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

    def release_quietly(self) -> Exception | None:
        """``release``, returning its error instead of raising it: for a block whose own outcome matters more
        (a lease left behind goes stale, ``LEASE_LEFT_BEHIND``). On a store that keeps failing the release fails
        too, with the store's "nothing was changed; run the same command again": raised, it would replace an
        error naming the resume of what stopped part-way, or turn work done into a failure."""
        try:
            self.release()
        except Exception as e:  # noqa: BLE001 - the store's failures only: told by the caller; a bug is raised
            if not isinstance(e, StorageError) and not store_kept_failing(e):
                raise
            return e
        return None

    def release_on_error(self) -> Exception | None:
        """``release_quietly`` while an error is on its way out: that error is the one raised, so even a bug in the
        release is only returned (to be told)."""
        try:
            return self.release_quietly()
        except Exception as e:  # noqa: BLE001
            return e

    @contextlib.contextmanager
    def held(self, warn: Callable[[str], None]):
        """The set, for a block, then released. Its release never replaces the block's outcome (an error, or
        work done): a release that fails is told through ``warn``, and the lease goes stale."""
        try:
            yield self
        except BaseException:
            _told_left(self.release_on_error(), warn, "")
            raise
        _told_left(self.release_quietly(), warn, "it completed, but ")

    def __enter__(self) -> "LeaseSet":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
        else:  # the error on its way out is the one to raise (``held`` tells what the release left)
            self.release_on_error()


LEASE_LEFT_BEHIND = ("it goes stale once this process ends (at once for the next command on this host), or when "
                     "its heartbeat lapses")


def release_problem(e: Exception) -> str:
    """What went wrong with a lease's release, without the error's own advice (a store failure's "nothing
    was changed; run the same command again" is wrong beside an operation that did change things)."""
    if isinstance(e, CheckpointOpsError):
        return f"{e.path}: {e.problem}" if e.path else e.problem
    return str(e)


def _told_left(error: Exception | None, warn: Callable[[str], None], done: str) -> None:
    if error is not None:
        warn(f"{done}its lease could not be released ({release_problem(error)}); {LEASE_LEFT_BEHIND}")


def acquire_all(locations: list[tuple[CheckpointFileManager, str, str]], owner: str,
                held: LeaseSet | None = None, into: LeaseSet | None = None, stepwise: bool = True,
                operation: str | None = None, warn: Callable[[str], None] | None = None) -> LeaseSet:
    """Take the lease of each (file manager, root, what) not already ``held``, in the order of places; on a
    refusal release what was taken and re-raise. Returns the set taken now (``into`` if given).

    A first Ctrl-C while a lease is being written is held until it is in the set (``warn`` told at once), then
    raised: what was taken is released, so no lease is left for others to wait out."""
    taken = into if into is not None else LeaseSet()
    seen = set()

    def told() -> None:
        if warn is not None:
            warn("interrupted: finishing the lease being taken, then releasing it (Ctrl-C again to stop at once, "
                 "leaving it to go stale)")

    # in the order of the places, not of their spellings: two operations naming them differently still agree
    for fm, root, what in sorted(locations, key=lambda loc: place_key(loc[0].url(loc[1]))):
        place = place_key(fm.url(root))  # two spellings of one place hold one lease
        if place in seen or (held is not None and held.covers(fm, root)) or taken.covers(fm, root):
            continue
        seen.add(place)
        try:
            with interrupts_held(told) as caught:
                taken.leases.append(acquire(fm, root, owner, what, stepwise=stepwise, operation=operation))
            if caught:
                raise KeyboardInterrupt
        except BaseException:  # the refusal (or Ctrl-C) is what to report; a lease left goes stale, told
            left = taken.release_on_error()
            if warn is not None:
                _told_left(left, warn, "")
            raise
    return taken
