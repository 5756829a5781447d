"""Pruning backups: which to keep, collecting the objects no backup needs any more, and clearing what
dead backups and prunes left behind.

The newest verified backup of each checkpoint is never deleted (if none is verified yet, the newest
backup is kept instead). Object garbage collection holds a lock in ``locks/`` and never runs while a
backup is being taken: each side writes its marker before it looks for the other's (a backup writes its
intent, then waits while a live prune lock exists; a prune writes its lock, then leaves the objects alone
if a live intent exists), so of two that start together at least one sees the other. Manifests are
deleted either way; their objects go with the next prune that runs alone. Running prune again finishes
one that was interrupted.

Claims (``claims.py``) hold only while their holder lives: an intent or lock whose process is gone, or
whose heartbeat lapsed, is ignored, and the prune removes it (the plan lists it). Leftovers of
interrupted writes (``leftovers.py``) are removed when no backup is being taken and they are old enough.

A damaged manifest (``repository.manifest_problem``) blocks object garbage collection until the user
removes it: which objects it references is unknown, and deleting one it needs would turn a backup the
user may still repair into one that can never be restored. Everything else proceeds; the plan says why
no object is collected.
"""

from __future__ import annotations

import calendar
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import BadInputError, StoreUnavailableError, store_kept_failing
from ..lease import guard_saying, release_problem
from ..operation import ApplyContext, Operation, Site
from ..plan import Plan
from ..storage import open_file_manager
from .claims import INTENT, Claim, HeldClaim
from .leftovers import DEFAULT_MIN_AGE_S, find_leftovers, is_leftover_rel, remove_leftovers
from .repository import TIME_FORMAT, Repository


@dataclass(frozen=True)
class BackupPruneResult:
    """What ``apply_backup_prune`` did."""

    manifests_deleted: int
    objects_deleted: int
    bytes_deleted: int
    objects_deferred: bool  # objects were left for a later prune (a backup ran, or a manifest is damaged)
    claims_removed: int  # stale intents and prune locks
    leftovers_removed: int  # temp files and unfinished uploads
    note: str | None = None  # why objects were deferred
    requests: dict = field(default_factory=dict)  # what the destination's file manager issued, by kind
    retries: dict = field(default_factory=dict)  # of them, retries, by kind

    def to_dict(self) -> dict:
        return {"manifests_deleted": self.manifests_deleted, "objects_deleted": self.objects_deleted,
                "bytes_deleted": self.bytes_deleted, "objects_deferred": self.objects_deferred,
                "claims_removed": self.claims_removed, "leftovers_removed": self.leftovers_removed, "note": self.note,
                "requests": self.requests, "retries": self.retries}


def _running(live: list[Claim]) -> str:
    return "a backup is being taken or restored (" + "; ".join(c.describe() for c in live) + ")"


def _damaged(repo: Repository) -> str:
    d = repo.damaged_manifests()
    return (f"{len(d)} damaged manifest(s) ({d[0].url} {d[0].problem}) may reference any object: no object is "
            "collected until they are removed (after checking them)")


def plan_backup_prune(repo: Repository, keep_last: int | None = None, keep_within_s: float | None = None,
                      now: float | None = None, temp_min_age_s: float | None = None) -> Plan:
    """The manifests to delete, the stale claims and old leftovers to remove and, as things stand now,
    the objects that would become garbage. ``temp_min_age_s`` (default ``DEFAULT_MIN_AGE_S``): how old
    a leftover must be before it is removed."""
    if keep_last is None and keep_within_s is None:
        raise BadInputError("say which backups to keep: --keep-last K and/or --keep-within DURATION")
    if (keep_last is not None and keep_last < 1) or (keep_within_s is not None and keep_within_s < 0):
        raise BadInputError("--keep-last must be at least 1 and --keep-within not negative")
    min_age = DEFAULT_MIN_AGE_S if temp_min_age_s is None else temp_min_age_s
    if min_age < 0:
        raise BadInputError("--temp-min-age must not be negative")
    now = time.time() if now is None else now
    manifests = repo.manifests(refresh=True)
    damaged = repo.damaged_manifests()
    verified = repo.verified()
    by_ckpt: dict[str, list] = {}
    for m in manifests:
        by_ckpt.setdefault(m.checkpoint_url, []).append(m)
    keep, drop, why_kept = set(), [], {}
    for url, ms in by_ckpt.items():
        good = [m for m in ms if verified.get(m.id, {}).get("ok") is True]
        anchor = good[-1] if good else ms[-1]
        why_kept[anchor.id] = "newest verified" if good else "newest (none verified yet)"
        keep.add(anchor.id)
        if keep_last is not None:
            for m in ms[-keep_last:]:
                keep.add(m.id)
                why_kept.setdefault(m.id, f"among the newest {keep_last}")
        if keep_within_s is not None:
            for m in ms:
                created = calendar.timegm(time.strptime(m.created, TIME_FORMAT))
                if now - created <= keep_within_s:
                    keep.add(m.id)
                    why_kept.setdefault(m.id, "within --keep-within")
        drop += [m for m in ms if m.id not in keep]
    plan = Plan("backup-prune", {"dest": repo.url}, None)
    for m in drop:
        plan.delete("dest", f"manifests/{m.id}.json", f"backup {m.id} of {m.checkpoint_url} (batch {m.batch})", "trash")
    plan.summary = {"delete": [m.id for m in drop] or "nothing", "keep": {i: why_kept[i] for i in sorted(keep)}}
    if damaged:
        plan.summary["damaged"] = [f"{d.id}: manifest {d.problem}" for d in damaged]

    claims = repo.intents(now) + repo.locks(now)
    stale = [c for c in claims if not c.live]
    live = [c for c in claims if c.live and c.kind == INTENT]
    for c in stale:
        plan.delete("dest", c.rel, f"{('intent of a restore' if c.restoring else 'intent of a backup') if c.kind == INTENT else 'lock of a prune'} that is "
                    f"gone ({c.stale})", "litter")
    if stale:
        plan.summary["stale claims"] = [f"{c.describe()}: {c.stale}" for c in stale]
    if live:
        plan.summary["running"] = [c.describe() for c in live]

    files = repo.walk()
    leftovers = find_leftovers(repo, files)
    if live:
        plan.summary["leftovers"] = (f"{len(leftovers)} left alone while a backup is being taken" if leftovers
                                     else "none")
    else:
        old = [x for x in leftovers if x.old_enough(now, min_age)]
        for x in old:
            plan.delete("dest", x.plan_rel, x.describe(), "litter", x.size)
        young = len(leftovers) - len(old)
        plan.summary["leftovers"] = (f"{len(old)} from interrupted writes ({sum(x.size or 0 for x in old)} bytes)"
                                     + (f"; {young} younger than {min_age:g} s kept (a writer may still be at work)"
                                        if young else ""))

    if live:
        plan.summary["objects"] = "left for the next prune: " + _running(live)
    elif damaged:
        plan.summary["objects"] = "blocked: " + _damaged(repo)
    else:
        needed = set().union(*(m.hashes() for m in manifests if m.id in keep)) if keep else set()
        garbage = {h: size for h, size in repo.all_objects(files).items() if h not in needed}
        for h, size in sorted(garbage.items()):
            plan.delete("dest", f"objects/{h[:2]}/{h}", "objects no kept backup references", "trash", size)
        plan.summary["objects"] = f"{len(garbage)} unreferenced ({sum(garbage.values())} bytes)"
    return plan


_RERUN = ("the prune stopped part-way: every backup not yet deleted is whole (objects go only after no manifest names "
          "them); run the same command again to finish it")
_DELETE_CHUNK = 1000  # deletes between two lease checks (an object store's DeleteObjects takes 1,000 keys)


def apply_backup_prune(repo: Repository, plan: Plan, guard: Callable[[], None] | None = None) -> BackupPruneResult:
    """Apply a prune plan under a prune lock: delete the planned manifests and the planned claims that
    are still stale; then, only if no backup is being taken (judged again, under the lock), the planned
    leftovers and, unless a manifest is damaged, the planned objects that no manifest references now (a
    backup may have published since the plan). Never deletes anything the plan does not name. A store
    that stays unavailable stops it with a StoreUnavailableError saying how to finish. ``guard`` (the
    destination's lease check) is called before each step and each chunk of deletes: a prune whose lease
    lapsed stops (``LeaseLost``, saying to run it again) instead of deleting beside the command that took
    the lease over."""
    try:
        lock = repo.hold_prune_lock()
    except StoreUnavailableError as e:
        raise e.finish_with("nothing was deleted; once the store answers, run the same command again") from e.__cause__
    try:
        result = _collect(repo, plan, lock, guard_saying(guard, _RERUN))
    except StoreUnavailableError as e:
        lock.release_quietly()  # the store may be down: the lock then goes stale
        raise e.finish_with("the prune stopped part-way: every backup not yet deleted is whole (objects go only "
                            "after no manifest names them); once the store answers, run the same command again to "
                            "finish it (a prune lock left behind goes stale once its heartbeat stops)") from e.__cause__
    except BaseException:
        lock.release_quietly()  # a lease lost, a Ctrl-C: that is what stopped it, not a failing release
        raise
    try:
        lock.release()
    except KeyboardInterrupt:  # held until the lock was gone (it said so at once): the prune had finished, so it stands
        pass
    except Exception as e:  # noqa: BLE001 - only the store's failures: the prune is done, its lock goes stale
        if not store_kept_failing(e):
            raise
        left = (f"its prune lock could not be released ({release_problem(e)}): it is left to go stale (once this "
                "process has ended, or its time to live after its last renewal), and a backup or restore started "
                "meanwhile waits for it")
        result = dataclasses.replace(result, note=f"{result.note}; {left}" if result.note else left)
    return dataclasses.replace(result, requests=repo.fm.counter.snapshot(), retries=repo.fm.counter.retries())


def _delete(repo: Repository, paths: list[str], check: Callable[[], None]) -> None:
    for start in range(0, len(paths), _DELETE_CHUNK):
        check()
        repo.fm.delete_many(paths[start:start + _DELETE_CHUNK])


def _collect(repo: Repository, plan: Plan, lock: HeldClaim, check: Callable[[], None]) -> BackupPruneResult:
    leftovers = [a.rel for a in plan.actions if is_leftover_rel(a.rel)]
    rels = [a.rel for a in plan.actions if not is_leftover_rel(a.rel)]
    manifests = [r for r in rels if r.startswith("manifests/")]
    _delete(repo, [repo.path(r) for r in manifests], check)
    _delete(repo, [repo.path(r.replace("manifests/", folder)) for r in manifests
                   for folder in ("verified/", "drills/")], check)  # their verification and drill records

    claims = {c.rel: c for c in repo.intents() + repo.locks()}
    stale = [r for r in rels if r in claims and not claims[r].live]
    _delete(repo, [repo.path(r) for r in stale], check)
    live = [c for c in claims.values() if c.live and c.kind == INTENT]

    if live:
        return BackupPruneResult(len(manifests), 0, 0, True, len(stale), 0, f"{_running(live)}: objects and "
                                 "leftovers of interrupted writes are left for the next prune")
    check()
    removed = remove_leftovers(repo, leftovers)
    if repo.damaged_manifests(refresh=True):
        return BackupPruneResult(len(manifests), 0, 0, True, len(stale), removed, _damaged(repo))
    needed = set().union(*(m.hashes() for m in repo.manifests()))
    sizes = {a.rel: a.size or 0 for a in plan.actions}
    garbage = [r for r in rels if r.startswith("objects/") and r.rsplit("/", 1)[-1] not in needed]
    def still_alone() -> None:  # a lock that lapsed let a backup start meanwhile: its objects must not go
        lock.check()
        check()

    _delete(repo, [repo.path(r) for r in garbage], still_alone)
    return BackupPruneResult(len(manifests), len(garbage), sum(sizes[r] for r in garbage), False, len(stale),
                             removed)


class BackupPruneOperation(Operation):
    """``checkpoint-ops backup prune``: old backups and the objects nothing needs (module docstring)."""

    name = "backup-prune"

    def __init__(self, dest_url: str, keep_last: int | None = None, keep_within_s: float | None = None,
                 storage_options: dict | None = None, temp_min_age_s: float | None = None):
        self.dest_url, self.keep_last, self.keep_within_s = dest_url, keep_last, keep_within_s
        self.temp_min_age_s = temp_min_age_s
        self.storage_options = storage_options
        self.repo: Repository | None = None
        fm, root = open_file_manager(dest_url, storage_options)
        self._sites = [Site(fm, root, f"backup destination {dest_url}")]

    def sites(self) -> list[Site]:
        return self._sites

    def open(self) -> None:
        self.repo = Repository.open(self.dest_url, self.storage_options)

    def plan(self, stage: bool) -> Plan:
        return plan_backup_prune(self.repo, self.keep_last, self.keep_within_s, temp_min_age_s=self.temp_min_age_s)

    def apply(self, plan: Plan, ctx: ApplyContext) -> BackupPruneResult:
        return apply_backup_prune(self.repo, plan, guard=ctx.guard)

    def describe(self, plan: Plan, outcome: BackupPruneResult) -> str:
        return (f"Deleted {outcome.manifests_deleted} backup(s) and {outcome.objects_deleted} unreferenced objects "
                f"({outcome.bytes_deleted} bytes); removed {outcome.claims_removed} stale claim(s) and "
                f"{outcome.leftovers_removed} leftover(s) of interrupted writes"
                + (f"; {outcome.note}" if outcome.note else ""))
