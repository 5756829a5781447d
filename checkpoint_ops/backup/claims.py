"""Claims at a backup destination: a backup's intent (``intents/<backup id>.json``) and a prune's lock
(``locks/prune-<stamp>-<id>.json``).

Each is a small JSON record carrying a ``liveness.Holder``. Its holder writes it before it looks for
the other side's claims, rewrites it every third of its time to live (a ``Heartbeat``) while it works,
and deletes it when done. Anyone may judge a claim *stale*: its holder's process is gone (a dead pid on
this host) or its heartbeat lapsed (a holder elsewhere, or a hung one). A stale claim is ignored (a
dead backup no longer holds garbage collection; a dead prune no longer makes backups wait) and the next
prune removes it. A record this tool cannot read is stale too (every record is written atomically, so
no holder of ours left it half written); a record of an older release (``{"expires": t}``) holds
until ``t``.

A holder that was late renewing its own claim cannot know what others did meanwhile (a prune may have
judged its intent stale and collected objects it reuses): ``HeldClaim.check`` raises then, and the
holder stops before it publishes anything.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import RefusedError, store_kept_failing
from ..interrupts import interrupts_held
from ..journal import utc_stamp
from ..liveness import Heartbeat, Holder
from ..storage import CheckpointFileManager
from ..storage.paths import join

INTENT = "intent"
PRUNE_LOCK = "prune-lock"
DIRS = {INTENT: "intents", PRUNE_LOCK: "locks"}
_LATE_FIX = "it stopped before its next change (a backup publishes nothing); run the command again"


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass(frozen=True)
class Claim:
    """One record under ``intents/`` or ``locks/``, as judged at one moment."""

    kind: str  # INTENT | PRUNE_LOCK
    rel: str  # path relative to the destination
    holder: Holder | None  # None: an older release's record, or one this tool cannot read
    stale: str | None  # why it no longer holds; None while it does
    backup_id: str | None = None  # (intent) the backup being taken
    hashes: frozenset[str] = frozenset()  # (intent) objects the backup said it will reference

    @property
    def live(self) -> bool:
        return self.stale is None

    @property
    def restoring(self) -> bool:
        """An intent of a restore (``restore_claim``), not of a backup being taken."""
        return self.kind == INTENT and (self.backup_id or "").startswith(RESTORE_PREFIX)

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]

    def describe(self) -> str:
        what = (f"prune lock {self.name[:-len('.json')]}" if self.kind != INTENT else
                f"restore of backup {self.backup_id[len(RESTORE_PREFIX):-9]}" if self.restoring else
                f"backup {self.backup_id}")
        return f"{what}, by {self.holder.describe()}" if self.holder is not None else what

    def to_dict(self) -> dict:
        return {"kind": self.kind, "rel": self.rel, "backup_id": self.backup_id,
                "holder": self.holder.to_dict() if self.holder is not None else None, "stale": self.stale}


def judge(kind: str, rel: str, blob: bytes | None, now: float | None = None) -> Claim:
    """The claim a record states, and whether it still holds at ``now``."""
    now = time.time() if now is None else now
    backup_id = rel.rsplit("/", 1)[-1][:-len(".json")] if kind == INTENT else None
    try:
        doc = json.loads(blob) if blob else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Claim(kind, rel, None, "it is not a record this tool reads (not a JSON object)", backup_id)
    hashes = frozenset(h for h in doc.get("hashes", []) if isinstance(h, str)) \
        if isinstance(doc.get("hashes"), list) else frozenset()
    holder = Holder.from_dict(doc.get("holder"))
    if holder is not None:
        return Claim(kind, rel, holder, holder.stale_reason(now), backup_id, hashes)
    expires = doc.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):  # an older release's record
        return Claim(kind, rel, None, None if expires > now else f"it expired at {_iso(expires)}", backup_id, hashes)
    return Claim(kind, rel, None, "it is not a record this tool reads (no holder)", backup_id, hashes)


def read_claims(fm: CheckpointFileManager, root: str, kind: str, now: float | None = None) -> list[Claim]:
    """Every claim of one kind at the destination (one listing and one concurrent read), by name."""
    d = DIRS[kind]
    names = sorted(f.name for f in fm.list(join(root, d)) if f.name.endswith(".json") and not f.name.startswith("."))
    if kind == PRUNE_LOCK:
        names = [n for n in names if n.startswith("prune-")]
    paths = {n: join(root, f"{d}/{n}") for n in names}
    data = fm.read_many(paths.values())
    return [judge(kind, f"{d}/{n}", data.get(p), now) for n, p in paths.items() if data.get(p) is not None]


class HeldClaim:
    """A claim this process holds: written by ``acquire``, renewed by a heartbeat every third of its
    time to live, deleted by ``release``. ``check`` says whether it held all along."""

    def __init__(self, fm: CheckpointFileManager, root: str, kind: str, name: str, owner: str,
                 fields: dict | None = None, ttl_s: float | None = None):
        self.fm = fm
        self.kind = kind
        self.rel = f"{DIRS[kind]}/{name}"
        self.path = join(root, self.rel)
        self.url = fm.url(self.path)
        self.holder = Holder.me(owner, ttl_s)
        self._fields = dict(fields or {})
        self._heartbeat: Heartbeat | None = None
        # Others judge the record by the heartbeat time it states, so the time that counts is from
        # one stated heartbeat to the moment the next record lands (time.monotonic()).
        self._stated_at = 0.0  # when the heartbeat of the record that landed last was taken
        self._late_s = 0.0  # the longest such gap so far

    def _write(self, holder: Holder, overwrite: bool) -> None:
        stated = time.monotonic()
        doc = {"kind": self.kind, **self._fields, "holder": holder.to_dict()}
        self.fm.write_bytes(self.path, json.dumps(doc).encode(), overwrite=overwrite)
        if self._stated_at:
            self._late_s = max(self._late_s, time.monotonic() - self._stated_at)
        self.holder, self._stated_at = holder, stated

    def _renew(self) -> None:
        self._write(self.holder.renewed(), overwrite=True)

    def acquire(self) -> "HeldClaim":
        """Write the record (a prune lock never replaces another's) and start renewing it. Once."""
        if self._heartbeat is not None:
            return self
        self._write(self.holder, overwrite=self.kind == INTENT)
        self._heartbeat = Heartbeat(self._renew, self.holder.ttl_s / 3, name=f"checkpoint-ops-{self.kind}").start()
        return self

    def check(self) -> None:
        """Raise unless the claim held without a gap since ``acquire``: a renewal that failed, or came
        later than its time to live, let others judge it stale and act as if this holder were gone."""
        hb = self._heartbeat
        if hb is not None and hb.error is not None:
            raise RefusedError(f"this {self.kind} could not be renewed ({hb.error}): others may have judged it "
                               "stale and acted on that", path=self.url, fix=_LATE_FIX)
        late = max(self._late_s, time.monotonic() - self._stated_at)
        if late > self.holder.ttl_s:
            raise RefusedError(f"this {self.kind} went {late:.0f} s without renewal (its time to live is "
                               f"{self.holder.ttl_s:g} s): others may have judged it stale and acted on that",
                               path=self.url, fix=_LATE_FIX + " (a slow or overloaded machine may need a longer "
                               "CHECKPOINT_OPS_LEASE_TTL)")

    def release_quietly(self) -> None:
        """``release``, for a command whose own outcome matters more: a store failing now leaves the record to
        go stale (the next prune removes it): the store's own error, or ours once it kept failing through every
        retry (``StoreUnavailableError``); any other error is raised."""
        try:
            self.release()
        except Exception as e:  # noqa: BLE001
            if not store_kept_failing(e):
                raise

    def release(self) -> None:
        """Stop renewing, then delete the record (in this order: a late renewal must not revive it). A
        renewal under way is waited for at most one renewal interval. One still hung on the store then is
        left on its daemon thread, and the record is deleted now and again once that renewal has returned
        (a renewal is an unconditional write: landing after the first delete, it writes the record back).
        The record's name is this holder's alone (a backup id, a prune lock's own), so the late write never
        replaces another's. If this process ends first, the record written back goes stale (its pid is gone,
        its heartbeat lapses). A first Ctrl-C meanwhile is held until the record is deleted, then raised
        (``interrupts_held``): the record is not left to go stale, keeping a prune waiting or from collecting."""
        caught: list[int] = []
        try:
            with interrupts_held(self._told) as caught:
                self._release()
        except Exception as e:
            if caught:  # the Ctrl-C held meanwhile is raised, not lost to a caller releasing quietly
                raise KeyboardInterrupt from e
            raise
        if caught:
            raise KeyboardInterrupt

    def _told(self) -> None:
        """Said at once when a Ctrl-C is held (a slow store must not look like a hang). Only where SIGINT is
        Python's own (``interrupts_held``): a command or a script at a terminal, so straight to stderr."""
        what = "prune lock" if self.kind == PRUNE_LOCK else "restore intent" if "restores" in self._fields else \
            "backup intent"
        print(f"checkpoint-ops: warning: interrupted: releasing the {what} in the backup destination first "
              "(Ctrl-C again to stop at once, leaving it to go stale)", file=sys.stderr, flush=True)

    def _release(self) -> None:
        beat, self._heartbeat = self._heartbeat, None
        if beat is not None and not beat.stop(timeout=self.holder.ttl_s / 3):
            threading.Thread(target=self._delete_after, args=(beat,), name=f"checkpoint-ops-{self.kind}-release",
                             daemon=True).start()
        self.fm.delete(self.path)

    def _delete_after(self, beat: Heartbeat) -> None:
        """The second delete of ``release``: once the renewal left running has returned."""
        beat.join()
        if self._heartbeat is not None:  # acquired again meanwhile (``acquire`` is meant once): its record now
            return
        with contextlib.suppress(Exception):  # the store may still fail: the record then goes stale
            self.fm.delete(self.path)

    def __enter__(self) -> "HeldClaim":
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.release()
        else:  # the error on its way out is the one to raise
            self.release_quietly()


def intent_claim(fm: CheckpointFileManager, root: str, backup_id: str, checkpoint_url: str,
                 hashes: set[str] = frozenset()) -> HeldClaim:
    """The intent of backup ``backup_id`` (not yet acquired)."""
    return HeldClaim(fm, root, INTENT, f"{backup_id}.json", f"checkpoint-ops backup create {checkpoint_url}",
                     {"id": backup_id, "checkpoint": checkpoint_url, "hashes": sorted(hashes)})


RESTORE_PREFIX = "restore-"  # an intent of a restore: ``restore-<backup id>-<token>.json``


def restore_claim(fm: CheckpointFileManager, root: str, backup_id: str, target_url: str) -> HeldClaim:
    """The intent of a restore of backup ``backup_id`` (not yet acquired): while it lives, a prune collects no
    object (as while a backup is taken), so none the restore still has to read goes."""
    return HeldClaim(fm, root, INTENT, f"{RESTORE_PREFIX}{backup_id}-{uuid.uuid4().hex[:8]}.json",
                     f"checkpoint-ops backup restore {backup_id} into {target_url}",
                     {"restores": backup_id, "target": target_url})


def prune_lock_claim(fm: CheckpointFileManager, root: str) -> HeldClaim:
    """A new prune lock (not yet acquired)."""
    return HeldClaim(fm, root, PRUNE_LOCK, f"prune-{utc_stamp()}-{uuid.uuid4().hex[:8]}.json",
                     "checkpoint-ops backup prune")


__all__ = ["Claim", "HeldClaim", "INTENT", "PRUNE_LOCK", "intent_claim", "judge", "prune_lock_claim", "read_claims",
           "restore_claim"]
