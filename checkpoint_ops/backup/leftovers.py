"""What interrupted writes leave at a backup destination, and when removing it is safe.

* Local disk and HDFS-like stores: the hidden temp file of an atomic write (``.<name>.<uuid>.tmp``,
  see ``storage/rename.py``) whose writer died before it published it.
* Local disk: also the object a backup was creating in place (``Repository.put_objects_direct``) when
  it died, part-written under its own name. Nothing tells it from a whole object by name, so it is not a
  leftover here: no manifest names it, so prune collects it with the other unreferenced objects (under the
  same rule: only while no backup is being taken), and a backup that needs it reads it back first
  (``create.py``).
* Object stores (``direct-put``): an object up to 64 MiB is one PUT and leaves nothing; the local spool
  of a bigger one is an anonymous temp file that vanishes with its process. A bigger object is a
  multipart upload: if its writer is killed, the upload stays open at the store with the parts sent so
  far, unlisted and billed until it is aborted. (One that fails, or loses the put-if-absent race, is
  aborted by the writer itself.)

A leftover may still be a live writer's: ``backup prune`` removes one only when no backup is being
taken (no live intent: a backup's writes may be in flight) and it is at least ``DEFAULT_MIN_AGE_S``
old (a temp file since its last write, an upload since it started); the writers that hold no intent
(the marker, an intent or lock being written, a verification record) write a few bytes at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..storage import FileInfo
from ..storage.manager import PendingUpload
from ..storage.rename import is_temp_name
from .repository import Repository

TEMP_FILE = "temp-file"
UPLOAD = "upload"
DEFAULT_MIN_AGE_S = 3600.0
_UPLOAD_MARK = "#upload="  # how a prune plan names an upload: <key rel>#upload=<upload id>


@dataclass(frozen=True)
class Leftover:
    """One temp file or unfinished upload at the destination."""

    kind: str  # TEMP_FILE | UPLOAD
    rel: str  # relative to the destination (an upload: the key it would have published)
    size: int | None  # bytes (a temp file; an upload's parts are not listed)
    since: float | None  # last write (temp file) or start (upload), seconds since the epoch
    upload_id: str | None = None

    @property
    def plan_rel(self) -> str:
        """How a prune plan names it (an upload has no file: its key and upload id)."""
        return self.rel if self.kind == TEMP_FILE else f"{self.rel}{_UPLOAD_MARK}{self.upload_id}"

    def age(self, now: float) -> float | None:
        return None if self.since is None else now - self.since

    def old_enough(self, now: float, min_age_s: float) -> bool:
        age = self.age(now)
        return age is not None and age >= min_age_s

    def describe(self) -> str:
        return "temp file of an interrupted write" if self.kind == TEMP_FILE else \
            "multipart upload its writer never completed (its parts are stored and billed)"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "rel": self.rel, "size": self.size, "since": self.since, "upload_id": self.upload_id}


def find_leftovers(repo: Repository, files: list[FileInfo]) -> list[Leftover]:
    """Every leftover at the destination: temp files from ``files`` (a listing of it), unfinished
    uploads from the store (one more listing, object stores only)."""
    base = repo.root + "/"
    out = [Leftover(TEMP_FILE, f.path[len(base):], f.size, f.mtime) for f in files
           if f.path.startswith(base) and not f.is_dir and is_temp_name(f.name)]
    out += [Leftover(UPLOAD, u.path[len(base):], None, u.initiated, u.upload_id)
            for u in repo.fm.pending_uploads(repo.root) if u.path.startswith(base)]
    return sorted(out, key=lambda x: x.plan_rel)


def is_leftover_rel(plan_rel: str) -> bool:
    """Whether a prune plan's ``rel`` names a leftover (a temp file or an upload)."""
    return _UPLOAD_MARK in plan_rel or is_temp_name(plan_rel.rsplit("/", 1)[-1])


def remove_leftovers(repo: Repository, plan_rels: list[str]) -> int:
    """Delete the temp files and abort the uploads a prune plan names; returns how many there were."""
    temps = [repo.path(r) for r in plan_rels if _UPLOAD_MARK not in r]
    uploads = []
    for r in plan_rels:
        if _UPLOAD_MARK in r:
            rel, _, upload_id = r.partition(_UPLOAD_MARK)
            uploads.append(PendingUpload(repo.path(rel), upload_id, None))
    repo.fm.delete_many(temps)
    if uploads:
        repo.fm.abort_uploads(uploads)
    return len(temps) + len(uploads)
