"""What ``backup list`` shows: one row per backup at a destination, damaged manifests included."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .repository import DamagedManifest, Manifest, Repository
from .verify import Verification

VERIFIED = "verified"  # the last verification found every object good
FAILED = "failed"  # the last verification found bad objects
UNVERIFIED = "unverified"  # never verified
DAMAGED = "damaged"  # the manifest cannot be used: the backup cannot be verified or restored


@dataclass(frozen=True)
class BackupRow:
    """One backup: what it holds and the outcome of its last verification. A damaged manifest is a
    row too, with ``damaged`` saying why and nothing else known."""

    id: str
    manifest: str  # URL of its manifest
    created: str | None
    kind: str | None  # structured | dstream
    checkpoint: str | None
    query_id: str | None
    batch: int | None
    files: int | None
    bytes: int | None
    new_bytes: int | None
    new_objects: int | None
    damaged: str | None  # why the manifest cannot be used; None if it can
    last_verification: Verification | None
    drill: dict | None = None  # the last restore drill (drill.py): {at, passed}
    kept_planned: tuple[str, ...] = ()  # ``offsets/N+1`` of a no-data batch taken beside the cut (create.py)
    # objects it references that a verification (of this backup or another sharing them) marked bad since
    known_bad: int = 0

    @property
    def status(self) -> str:
        if self.damaged is not None:
            return DAMAGED
        if self.known_bad:
            return FAILED
        if self.last_verification is None:
            return UNVERIFIED
        return VERIFIED if self.last_verification.ok else FAILED

    @property
    def verified(self) -> str | None:
        """The time of the last verification if it passed, ``"FAILED"`` if it did not (or the manifest
        is damaged), None if never verified (the ``verified`` key of ``--json``)."""
        if self.status == VERIFIED:
            return self.last_verification.at
        return "FAILED" if self.status in (FAILED, DAMAGED) else None

    @classmethod
    def of(cls, m: Manifest, record: dict | None) -> "BackupRow":
        stats = m.stats
        return cls(m.id, m.url, m.created, m.doc.get("kind"), m.checkpoint_url, m.doc["checkpoint"].get("query_id"),
                   m.batch, stats.get("files"), stats.get("bytes"), stats.get("new_bytes"), stats.get("new_objects"),
                   None, Verification.from_record(record) if record is not None else None,
                   kept_planned=tuple(m.kept_planned))

    @classmethod
    def of_damaged(cls, d: DamagedManifest, record: dict | None) -> "BackupRow":
        return cls(d.id, d.url, None, None, None, None, None, None, None, None, None, d.problem,
                   Verification.from_record(record) if record is not None else None)

    def describe_verification(self) -> str:
        """For people: ``verified 2026-…Z``, ``FAILED at 2026-…Z: 2 bad objects, first …``, ``never
        verified``, ``DAMAGED: …``."""
        v = self.last_verification
        if self.status == DAMAGED:
            return f"DAMAGED: manifest {self.damaged}"
        if self.known_bad and (v is None or v.ok):
            return (f"FAILED: {self.known_bad} of its objects marked bad by a verification since its own ("
                    + (f"which passed at {v.at}" if v is not None else "it was never verified itself")
                    + "; bad/ in the destination)")
        if v is None:
            return "never verified"
        if v.ok:
            return f"verified {v.at}"
        return f"FAILED at {v.at}: {v.bad_objects} bad object(s), first {v.first_problem}"

    def to_dict(self) -> dict:
        """The ``--json`` row (docs/cli.md)."""
        v = self.last_verification
        return {"id": self.id, "created": self.created, "kind": self.kind, "checkpoint": self.checkpoint,
                "query_id": self.query_id, "batch": self.batch, "kept_planned": list(self.kept_planned), "files": self.files, "bytes": self.bytes,
                "new_bytes": self.new_bytes, "new_objects": self.new_objects, "verified": self.verified,
                "status": self.status, "damaged": self.damaged, "manifest": self.manifest,
                "last_verification": v.to_dict() if v is not None else None, "drill": self.drill,
                "known_bad_objects": self.known_bad}


def list_backups(repo: Repository) -> list[BackupRow]:
    """Every backup at a destination, oldest first (ids start with their UTC time), damaged manifests
    included, each with the outcome of its last verification."""
    records, drills = repo.verified(), repo.drills()
    bad = repo.bad_objects()  # one listing: objects any verification found bad, until stored again
    rows = [BackupRow.of(m, records.get(m.id)) for m in repo.manifests(refresh=True)]
    if bad:
        by_id = {m.id: m for m in repo.manifests()}
        rows = [replace(r, known_bad=len(by_id[r.id].hashes() & bad)) for r in rows]
    rows += [BackupRow.of_damaged(d, records.get(d.id)) for d in repo.damaged_manifests()]
    rows = [replace(r, drill={"at": drills[r.id].get("drilled_at"), "passed": bool(drills[r.id].get("passed"))})
            if drills.get(r.id) else r for r in rows]
    return sorted(rows, key=lambda r: r.id)
