"""Verifying backups: every object a manifest names is there and holds exactly the bytes its hash says."""

from __future__ import annotations

import concurrent.futures
import time

from .repository import Repository

WORKERS = 16


def verify_backups(repo: Repository, backup_id: str | None = None) -> dict:
    """Re-read and hash every object the chosen backups (one, or all) reference, each object once.
    Records the outcome beside each manifest; ``ok`` is False if any object is missing or damaged."""
    manifests = [repo.manifest(backup_id)] if backup_id else repo.manifests()
    hashes = set().union(*(m.hashes() for m in manifests)) if manifests else set()
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        got = dict(zip(sorted(hashes), pool.map(repo.object_hash, sorted(hashes))))
    bad_objects = {h: ("missing" if got[h] is None else "damaged (its content does not match its hash)")
                   for h in hashes if got[h] != h}
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reports = []
    for m in manifests:
        bad = [{"object": repo.object_url(sha), "problem": bad_objects[sha], "root": rid, "file": rel}
               for rid in m.roots for rel, sha, _ in m.files(rid) if sha in bad_objects]
        doc = {"at": at, "ok": not bad, "objects": len(m.hashes()), "bad": bad[:100]}
        repo.record_verified(m.id, doc)
        reports.append({"backup_id": m.id, **doc})
    return {"destination": repo.url, "ok": not bad_objects, "objects_checked": len(hashes),
            "bad_objects": [repo.object_url(h) for h in sorted(bad_objects)], "backups": reports}
