"""Pruning backups: which to keep, and collecting the objects no backup needs any more.

The newest verified backup of each checkpoint is never deleted (if none is verified yet, the newest
backup is kept instead). Object garbage collection holds a lock in ``locks/`` and never runs while a
backup is being taken: each side writes its marker before it looks for the other's (a backup writes its
intent, then waits while a prune lock exists; a prune writes its lock, then leaves the objects alone if
an intent exists), so of two that start together at least one sees the other. Manifests are deleted
either way; their objects go with the next prune that runs alone. Running prune again finishes one that
was interrupted.
"""

from __future__ import annotations

import calendar
import contextlib
import time

from ..errors import BadInputError, StoreUnavailableError
from ..plan import Plan
from .repository import LOCK_TTL_S, Repository


def plan_backup_prune(repo: Repository, keep_last: int | None = None, keep_within_s: float | None = None,
                      now: float | None = None) -> Plan:
    """The manifests to delete and, as things stand now, the objects that would become garbage."""
    if keep_last is None and keep_within_s is None:
        raise BadInputError("say which backups to keep: --keep-last K and/or --keep-within DURATION")
    if (keep_last is not None and keep_last < 1) or (keep_within_s is not None and keep_within_s < 0):
        raise BadInputError("--keep-last must be at least 1 and --keep-within not negative")
    now = time.time() if now is None else now
    manifests = repo.manifests(refresh=True)
    verified = repo.verified()
    by_ckpt: dict[str, list] = {}
    for m in manifests:
        by_ckpt.setdefault(m.checkpoint_url, []).append(m)
    keep, drop, why_kept = set(), [], {}
    for url, ms in by_ckpt.items():
        good = [m for m in ms if verified.get(m.id, {}).get("ok")]
        anchor = good[-1] if good else ms[-1]
        why_kept[anchor.id] = "newest verified" if good else "newest (none verified yet)"
        keep.add(anchor.id)
        if keep_last is not None:
            for m in ms[-keep_last:]:
                keep.add(m.id)
                why_kept.setdefault(m.id, f"among the newest {keep_last}")
        if keep_within_s is not None:
            for m in ms:
                created = calendar.timegm(time.strptime(m.created, "%Y-%m-%dT%H:%M:%SZ"))
                if now - created <= keep_within_s:
                    keep.add(m.id)
                    why_kept.setdefault(m.id, "within --keep-within")
        drop += [m for m in ms if m.id not in keep]
    plan = Plan("backup-prune", {"dest": repo.url}, None)
    for m in drop:
        plan.delete("dest", f"manifests/{m.id}.json", f"backup {m.id} of {m.checkpoint_url} (batch {m.batch})", "trash")
    needed = set().union(*(m.hashes() for m in manifests if m.id in keep)) if keep else set()
    garbage = {h: size for h, size in repo.all_objects().items() if h not in needed}
    for h, size in sorted(garbage.items()):
        plan.delete("dest", f"objects/{h[:2]}/{h}", "objects no kept backup references", "trash", size)
    plan.summary = {"delete": [m.id for m in drop] or "nothing", "keep": {i: why_kept[i] for i in sorted(keep)},
                    "objects": f"{len(garbage)} unreferenced ({sum(garbage.values())} bytes)"}
    return plan


def apply_backup_prune(repo: Repository, plan: Plan) -> dict:
    """Delete the planned manifests, then (alone, under the lock) every object no manifest or running
    backup needs. Objects are judged again under the lock: a backup may have published since.
    ``requests`` and ``retries``: what the destination's file manager issued, by kind."""
    try:
        lock = repo.take_prune_lock()
    except StoreUnavailableError as e:
        raise e.finish_with("nothing was deleted; once the store answers, run the same command again") from e.__cause__
    try:
        result = _collect(repo, plan)
    except StoreUnavailableError as e:
        with contextlib.suppress(StoreUnavailableError):  # the store may be down: say what stays behind
            repo.release_prune_lock(lock)
            lock = None
        left = (f"; its lock {repo.fm.url(repo.path('locks/' + lock))} may stay behind, and backups wait for it "
                f"until it expires ({LOCK_TTL_S // 3600} h) or is deleted") if lock else ""
        raise e.finish_with("the prune stopped part-way: every backup not yet deleted is whole (objects go only "
                            "after no manifest names them); once the store answers, run the same command again to "
                            f"finish it{left}") from e.__cause__
    except BaseException:
        repo.release_prune_lock(lock)
        raise
    repo.release_prune_lock(lock)
    return {**result, "requests": repo.fm.counter.snapshot(), "retries": repo.fm.counter.retries()}


def _collect(repo: Repository, plan: Plan) -> dict:
    manifests = [a.rel for a in plan.actions if a.rel.startswith("manifests/")]
    repo.fm.delete_many([repo.path(r) for r in manifests])
    repo.fm.delete_many([repo.path(r.replace("manifests/", "verified/")) for r in manifests])
    if repo.live_intents():
        return {"manifests_deleted": len(manifests), "objects_deleted": 0, "bytes_deleted": 0,
                "objects_deferred": True,
                "note": "a backup is being taken: its objects, and any others, are left for the next prune"}
    needed = set().union(*(m.hashes() for m in repo.manifests(refresh=True)))
    garbage = {h: s for h, s in repo.all_objects().items() if h not in needed}
    repo.fm.delete_many([repo.object_path(h) for h in garbage])
    return {"manifests_deleted": len(manifests), "objects_deleted": len(garbage),
            "bytes_deleted": sum(garbage.values()), "objects_deferred": False}
