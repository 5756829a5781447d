"""Verifying backups: every object a manifest names is there and holds exactly the bytes its hash says.

Every verification of a backup is recorded in ``verified/<id>.json``, good or bad, so ``backup list``
shows the outcome of the last one: never "verified" for a backup the last ``verify`` rejected. An object
that cannot be read counts as bad (the restore would fail on it just the same). A failed record lists
every bad object (``bad_hashes``; ``bad`` names the first files that use them), and the next backup
stores those objects again instead of reusing them (``create.py``). A damaged manifest
cannot be verified: asked for by id it is exit 2 naming its file; in a verification of everything it is
reported beside the others (which are verified as usual) and makes the outcome not ok.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

from ..errors import StoreUnavailableError
from .repository import TIME_FORMAT, Repository

WORKERS = 16
_RECORDED_BAD = 100  # files named in a record (the count covers all)


@dataclass(frozen=True)
class Verification:
    """The last verification of one backup, as recorded."""

    at: str | None  # UTC time, e.g. 2026-11-21T06:30:00Z
    ok: bool
    objects: int | None  # objects the backup references
    bad_objects: int  # of them, missing, damaged or unreadable
    first_problem: str | None  # the first bad one: object, the file that uses it, what is wrong

    @classmethod
    def from_record(cls, doc: dict) -> "Verification | None":
        """From ``verified/<id>.json`` (records of older releases have no count: it is derived)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
            return None
        bad = [b for b in doc.get("bad", []) if isinstance(b, dict)] if isinstance(doc.get("bad"), list) else []
        count = doc.get("bad_objects")
        if not isinstance(count, int):
            count = len({b.get("object") for b in bad})
        first = (f"{bad[0].get('object')} ({bad[0].get('root')}/{bad[0].get('file')}): {bad[0].get('problem')}"
                 if bad else None)
        at = doc.get("at") if isinstance(doc.get("at"), str) else None
        objects = doc.get("objects") if isinstance(doc.get("objects"), int) else None
        return cls(at, doc["ok"], objects, 0 if doc["ok"] else count, None if doc["ok"] else first)

    def to_dict(self) -> dict:
        return {"at": self.at, "ok": self.ok, "objects": self.objects, "bad_objects": self.bad_objects,
                "first_problem": self.first_problem}


def bad_hashes(doc: dict) -> set[str]:
    """The objects a failed verification record found missing, damaged or unreadable: all of them
    (``bad_hashes``), or in records of older releases those its first ``_RECORDED_BAD`` files name."""
    listed = doc.get("bad_hashes")
    if not isinstance(listed, list):
        bad = doc.get("bad") if isinstance(doc.get("bad"), list) else []
        listed = [b["object"].rsplit("/", 1)[-1] for b in bad
                  if isinstance(b, dict) and isinstance(b.get("object"), str)]
    return {h for h in listed if isinstance(h, str) and len(h) == 64}


def object_problem(repo: Repository, sha: str) -> str | None:
    """What is wrong with one stored object (None: it holds exactly the bytes its name says)."""
    try:
        got = repo.object_hash(sha)
    except StoreUnavailableError:
        raise  # the store, not the object: nothing is judged (or recorded) from a store that does not answer
    except Exception as e:  # noqa: BLE001 - whatever stops the read stops a restore just the same
        return f"cannot be read ({type(e).__name__}: {e})"
    if got is None:
        return "missing"
    return None if got == sha else "damaged (its content does not match its hash)"


def verify_backups(repo: Repository, backup_id: str | None = None) -> dict:
    """Re-read and hash every object the chosen backups (one, or all) reference, each object once.
    Records the outcome of each backup, good or bad; ``ok`` is False if any object is missing, damaged
    or unreadable, or (verifying all) any manifest is damaged."""
    manifests = [repo.manifest(backup_id)] if backup_id else repo.manifests()
    damaged = [] if backup_id else repo.damaged_manifests()
    hashes = sorted(set().union(*(m.hashes() for m in manifests))) if manifests else []
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        problems = dict(zip(hashes, pool.map(lambda h: object_problem(repo, h), hashes)))
    bad_objects = {h: p for h, p in problems.items() if p is not None}
    # a prune meanwhile deletes a backup's manifest, then the objects no other one names: neither is damage, and a
    # backup that is gone is not recorded (its record would outlive it); its objects are judged no more
    manifests, pruned = _still_published(repo, manifests)
    named = set().union(*(m.hashes() for m in manifests)) if manifests else set()
    problems = {h: p for h, p in problems.items() if h in named}
    bad_objects = {h: p for h, p in bad_objects.items() if h in named}
    repo.mark_bad(sorted(bad_objects))  # every later backup stores their content again (repository.py)
    repo.clear_bad(sorted(repo.bad_objects() & (problems.keys() - bad_objects.keys())))  # found whole
    at = time.strftime(TIME_FORMAT, time.gmtime())
    reports = []
    for m in manifests:
        bad = [{"object": repo.object_url(sha), "problem": bad_objects[sha], "root": rid, "file": rel}
               for rid in m.roots for rel, sha, _ in m.files(rid) if sha in bad_objects]
        shas = sorted(m.hashes() & bad_objects.keys())
        doc = {"at": at, "ok": not bad, "objects": len(m.hashes()), "bad_objects": len(shas),
               "bad": bad[:_RECORDED_BAD], "bad_hashes": shas}
        repo.record_verified(m.id, doc)
        reports.append({"backup_id": m.id, **doc})
    gone = bool(backup_id) and bool(pruned)  # the one asked for is gone: not verified
    return {"destination": repo.url, "ok": not bad_objects and not damaged and not gone, "objects_checked": len(hashes),
            "bad_objects": [repo.object_url(h) for h in sorted(bad_objects)], "backups": reports,
            "damaged": [d.to_dict() for d in damaged], "pruned_meanwhile": pruned,
            "requests": repo.fm.counter.snapshot(), "retries": repo.fm.counter.retries()}


def _still_published(repo: Repository, manifests: list) -> tuple[list, list[str]]:
    """Of ``manifests``, those still published, and the ids of those a prune deleted since they were read (their
    objects may be gone with them: that is no damage, and they are neither reported nor recorded). One listing of
    ``manifests/``, nothing read."""
    now = repo.manifest_ids()
    return [m for m in manifests if m.id in now], [m.id for m in manifests if m.id not in now]
