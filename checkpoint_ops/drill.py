"""Restore drills: prove a backup restarts, by restoring it into scratch space and letting Spark restart
the query on it.

A drill restores the backup (``backup/restore.py``: every object checked against its hash) into a fresh
scratch directory, checks the restored checkpoint's restart set, then restarts the query there with its
sink replaced by ``noop`` and runs its next batch (``restart_judge.py``). It records the result beside
the backup's manifest (``drills/<backup id>.json`` in the destination), so the **recovery point** (the
age of the newest backup that passed a drill) is known however the latest drill went, and reports the
**recovery time** (restore plus restart). A drill that fails names its cause: the stage (restore, restart
set, Spark) and the backed-up files involved.

Nothing outside the scratch directory is written except the drill record; the scratch tree is removed.
"""

from __future__ import annotations

import calendar
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from .backup import Repository
from .backup.restore import RestoreOperation
from .operation import RunOptions, run
from .backup.repository import Manifest
from .compat import build_writer, remove_scratch
from .errors import STORE_FAILURES, BadInputError, StorageError, StoreUnavailableError
from .model.checkpoint import Checkpoint
from .restart_judge import JudgeOutcome, plant_in_place, restart_files, run_judge

RESTORE, RESTART_SET, SPARK, PASSED = "restore", "restart set", "spark", "passed"


@dataclass(frozen=True)
class DrillResult:
    """One drill of one backup.

    ``stage`` is where it stopped: ``restore`` (an object is missing or damaged, or the restore was
    refused), ``restart set`` (the restored checkpoint lacks a file Spark needs), ``spark`` (Spark refused
    the restart) or ``passed``. ``cause`` says why in words and ``cause_files`` names the backed-up files
    (``<root>/<path>``, e.g. ``checkpoint/offsets/7``). ``recovery_point_*`` describe the newest backup of
    this destination that passed a drill (this one, if it passed), with its age in seconds now.
    """

    destination: str
    backup_id: str
    checkpoint: str  # the checkpoint the backup was taken of
    batch: int | None
    backup_created: str
    drilled_at: str
    passed: bool
    stage: str
    cause: str | None
    cause_files: tuple[str, ...]
    restore_s: float
    restart_s: float
    judge: JudgeOutcome | None
    recovery_point_backup: str | None
    recovery_point_s: float | None

    @property
    def recovery_time_s(self) -> float:
        """How long getting the query running again from this backup took: restore plus restart."""
        return self.restore_s + self.restart_s

    def to_dict(self) -> dict:
        return {"destination": self.destination, "backup_id": self.backup_id, "checkpoint": self.checkpoint,
                "batch": self.batch, "backup_created": self.backup_created, "drilled_at": self.drilled_at,
                "passed": self.passed, "stage": self.stage, "cause": self.cause,
                "cause_files": list(self.cause_files), "restore_s": round(self.restore_s, 3),
                "restart_s": round(self.restart_s, 3), "recovery_time_s": round(self.recovery_time_s, 3),
                "recovery_point_backup": self.recovery_point_backup,
                "recovery_point_s": None if self.recovery_point_s is None else round(self.recovery_point_s, 1),
                "judge": self.judge.to_dict() if self.judge else None}

    def render(self) -> str:
        head = (f"drill of backup {self.backup_id} (batch {self.batch} of {self.checkpoint}): "
                + ("PASSED" if self.passed else f"FAILED at {self.stage}"))
        lines = [head]
        if not self.passed:
            lines.append(f"  cause: {self.cause}")
            lines += [f"  file: {f}" for f in self.cause_files]
        lines.append(f"  recovery time: {self.recovery_time_s:.1f} s (restore {self.restore_s:.1f} s, restart "
                     f"{self.restart_s:.1f} s)")
        lines.append("  recovery point: " + (f"backup {self.recovery_point_backup}, {self.recovery_point_s:.0f} s old"
                                             if self.recovery_point_backup else "none (no backup passed a drill)"))
        return "\n".join(lines)


_DRILL_AGAIN = ("the drill stopped before it judged the backup: nothing is recorded against it, the backup is "
                "unchanged, and the drill's scratch copy is removed (a warning names it if it could not be); run the "
                "drill again once the store answers")


def _not_judged(e: StorageError | StoreUnavailableError) -> StorageError | StoreUnavailableError:
    """A drill stopped by the store (failing, or refusing a request: the scratch location's too), which records no
    failed drill: the backup was not judged."""
    if isinstance(e, StoreUnavailableError):
        return e.finish_with(_DRILL_AGAIN)
    return StorageError(e.problem, path=e.path, fix="mend what the store refused (credentials, permissions, space), "
                        "then run the drill again: the backup was not judged, nothing is recorded against it, and the "
                        "drill's scratch copy is removed (a warning names it if it could not be)")


def run_drill(repo: Repository, backup_id: str | None, spark, build: Callable, *, scratch_url: str | None = None,
              relocate: Sequence[str] = (), storage_options: dict | None = None,
              warn: Callable[[str], None] | None = None) -> DrillResult:
    """Drill ``backup_id`` (default: the newest backup) with the query ``build(spark)`` makes, record the
    result in the destination, and return it. Unusable input (no such backup, a DStream backup, a query
    function that fails) raises ``BadInputError``; a backup that does not restart is a failed drill. ``warn``: told
    what the restore waits for (a running prune)."""
    manifest = _manifest(repo, backup_id)
    if manifest.doc.get("kind") != "structured":
        raise BadInputError("a DStream backup: drills restart Structured Streaming queries", path=manifest.url)
    writer = build_writer(build, spark)
    base = scratch_url or tempfile.mkdtemp(prefix="checkpoint-ops-drill-")
    work = f"{base.rstrip('/')}/drill-{uuid.uuid4().hex[:12]}"
    sinks = sorted((r for r in manifest.roots if r.startswith("sink")), key=lambda r: int(r[4:]))
    target = f"{work}/checkpoint"
    t0 = time.monotonic()
    restore_s = restart_s = 0.0
    judge = None
    try:
        try:
            op = RestoreOperation(repo.url, manifest.id, target, [f"{work}/{rid}" for rid in sinks], list(relocate),
                                  storage_options=storage_options)
            run(op, RunOptions(yes=True, storage_options=storage_options, owner="checkpoint-ops backup drill", warn=warn))
        except STORE_FAILURES as e:  # the store failed or refused (the scratch location's, too), not the backup
            raise _not_judged(e) from e.__cause__
        except BadInputError as e:
            restore_s = time.monotonic() - t0
            return _finish(repo, manifest, False, RESTORE, _restore_cause(e), _object_files(repo, manifest, e.path),
                           restore_s, 0.0, None)
        restore_s = time.monotonic() - t0
        t1 = time.monotonic()
        ckpt = Checkpoint.open(target, storage_options)
        try:
            restart_files(ckpt, manifest.batch)
        except STORE_FAILURES as e:
            raise _not_judged(e) from e.__cause__
        except BadInputError as e:
            rel = _rel_in(e.path, ckpt)
            return _finish(repo, manifest, False, RESTART_SET, e.problem, (f"checkpoint/{rel}",) if rel else (),
                           restore_s, time.monotonic() - t1, None)
        location = plant_in_place(ckpt, manifest.batch)
        judge = run_judge(spark, writer, location, manifest.batch + 1)
        restart_s = time.monotonic() - t1
        if not judge.restarted:
            cause = f"Spark refused to restart the restored checkpoint ({judge.error_class or judge.exception}): " \
                    f"{(judge.message or '').splitlines()[0] if judge.message else ''}"
            return _finish(repo, manifest, False, SPARK, cause, (), restore_s, restart_s, judge)
        return _finish(repo, manifest, True, PASSED, None, (), restore_s, restart_s, judge)
    finally:
        remove_scratch(work, storage_options, warn)
        if scratch_url is None:
            remove_scratch(base, storage_options, warn)


def drill_records(repo: Repository) -> dict[str, dict]:
    """backup id -> its last drill record (``passed``, ``stage``, ``cause``, ``cause_files``, ``drilled_at``,
    ``restore_s``, ``restart_s``); a torn record reads as empty (as if never drilled)."""
    return {backup_id: doc for backup_id, doc in repo.drills().items() if doc}


def recovery_point(repo: Repository, now: float | None = None) -> tuple[str | None, float | None]:
    """(id, age in seconds) of the newest existing backup that passed its last drill, or (None, None)."""
    now = time.time() if now is None else now
    records = drill_records(repo)
    passed = [m for m in repo.manifests(refresh=True) if records.get(m.id, {}).get("passed")]
    if not passed:
        return None, None
    newest = passed[-1]
    return newest.id, now - calendar.timegm(time.strptime(newest.created, "%Y-%m-%dT%H:%M:%SZ"))


def _manifest(repo: Repository, backup_id: str | None) -> Manifest:
    manifests = repo.manifests(refresh=True)  # backups taken since the repository was opened count
    if backup_id:
        return repo.manifest(backup_id)
    if not manifests:
        raise BadInputError("no backups here to drill", path=repo.url,
                            fix="take one with `checkpoint-ops backup create`")
    return manifests[-1]


def _finish(repo: Repository, manifest: Manifest, passed: bool, stage: str, cause: str | None,
            cause_files: tuple[str, ...], restore_s: float, restart_s: float,
            judge: JudgeOutcome | None) -> DrillResult:
    drilled_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record = {"passed": passed, "stage": stage, "cause": cause, "cause_files": list(cause_files),
              "drilled_at": drilled_at, "restore_s": round(restore_s, 3), "restart_s": round(restart_s, 3)}
    repo.record_drill(manifest.id, record)
    try:
        point, age = recovery_point(repo)
    except StoreUnavailableError as e:  # not "nothing was changed": the verdict is recorded
        raise e.finish_with(f"the drill of backup {manifest.id} {'passed' if passed else 'failed'} and is recorded; "
                            f"only the recovery point could not be read after it: `checkpoint-ops backup list "
                            f"{repo.url}` shows both once the store answers (no need to drill again)") from e.__cause__
    return DrillResult(repo.url, manifest.id, manifest.checkpoint_url, manifest.batch, manifest.created, drilled_at,
                       passed, stage, cause, cause_files, restore_s, restart_s, judge, point, age)


def _restore_cause(e: BadInputError) -> str:
    return f"the restore failed: {e.path}: {e.problem}" if e.path else f"the restore failed: {e.problem}"


def _object_files(repo: Repository, manifest: Manifest, path: str | None) -> tuple[str, ...]:
    """The backed-up files whose content is the stored object at ``path`` (if it names one)."""
    if not path:
        return ()
    return tuple(f"{rid}/{rel}" for rid in manifest.roots for rel, sha, _ in manifest.files(rid)
                 if repo.object_url(sha) == path)


def _rel_in(url: str | None, ckpt: Checkpoint) -> str | None:
    prefix = ckpt.url.rstrip("/") + "/"
    return url[len(prefix):] if url and url.startswith(prefix) else None
