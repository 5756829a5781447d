"""Does a query look active on this checkpoint (or sink output)? What the tool can see without a lease.

A query run by checkpoint-ops (the Dagster asset), or by a user's script under
``checkpoint_ops.spark.hold_lease_while_active``, holds the checkpoint's lease (``lease.py``), and every
operation is refused while it does. A query started any other way holds no lease. All the tool can see of
it is the files it writes: a batch planned recently and not committed yet (``offsets/N`` without
``commits/N``), or, for a sink output without its checkpoint, a log file written recently. A query idle
between triggers writes nothing and cannot be seen at all: stop it before changing its checkpoint. A batch
that a query run by checkpoint-ops left planned when it failed (the Dagster asset's run, under the lease) is
recorded as such (``record_ended_run``): the rollback that repairs it is not refused for looking recent.

``--force`` skips the refusal, never silently: ``refuse_if_active`` and ``refuse_if_sink_active`` then return
a warning saying what was overridden and what it risks, which the operation runner adds to the plan's
``warnings`` (so a dry run and ``--json`` show it as the apply does).
"""

from __future__ import annotations

import json
import time

from .errors import BadInputError, CheckpointOpsError, RefusedError, param
from .journal import load_journal, ops_dir, scan_journals
from .model.checkpoint import Checkpoint
from .model.logfile import batch_id_from_name
from .storage.paths import join

DEFAULT_FRESH_SECONDS = 600  # an uncommitted batch planned this recently means "running"

_CANNOT_SEE = ("a query started without checkpoint-ops holds no lease, and one idle between triggers writes nothing, "
               "so the files it writes are all this tool can see of it")


def _fix(extra: str = "") -> str:
    force = param("force")
    return ("stop the query first (query.stop(), or cancel its job) and wait until it has ended; run your own "
            "queries under checkpoint_ops.spark.hold_lease_while_active so every command refuses while they run"
            + (f"; {force} overrides this check if you are sure nothing runs" if force else "") + extra)


def active_reasons(ckpt: Checkpoint, fresh_seconds: int = DEFAULT_FRESH_SECONDS, now: float | None = None) -> list[str]:
    """Why the checkpoint looks in use (empty: it looks idle)."""
    now = time.time() if now is None else now
    L, C = ckpt.latest_offset, ckpt.latest_commit
    # On a fenced checkpoint no query can be running, and an uncommitted newest batch is the
    # interrupted operation's own doing.
    if ckpt.fence is None and L is not None and (C is None or L > C):
        info = ckpt.offset_files[L].info
        if info.mtime is not None and now - info.mtime < fresh_seconds and not _left_planned(ckpt, f"offsets/{L}") \
                and _planned_by_ended_run(ckpt, f"offsets/{L}") is None:
            return [f"offsets/{L} has no commit yet and was written {int(now - info.mtime)} s ago: a batch is "
                    f"probably running (a planned batch counts as running until it is {fresh_seconds} s old)"]
    return []


ENDED_RUN_FILE = "ended-run.json"  # beside the checkpoint (``journal.ops_dir``)


def record_ended_run(fm, root: str, by: str) -> str | None:
    """A query that checkpoint-ops ran under the checkpoint's lease failed (``by``: which run): record the newest
    ``offsets/`` file as it is now (name, size, mtime), planned by that run, which has ended. Until that file
    changes, its age is no sign of a query running (``active_reasons``), so the rollback that repairs the
    failed batch is not refused for ``DEFAULT_FRESH_SECONDS``. Returns the file recorded; None if none, or
    the record could not be written (then the age rule applies, as before)."""
    try:
        files = {batch_id_from_name(f.name): f for f in fm.list(join(root, "offsets")) if not f.is_dir}
        files.pop(None, None)
        if not files:
            return None
        newest = files[max(files)]
        rel = f"offsets/{newest.name}"
        doc = {"offsets": rel, "size": newest.size, "mtime": newest.mtime, "by": by, "recorded_at": time.time()}
        fm.write_bytes(join(ops_dir(fm, root), ENDED_RUN_FILE), json.dumps(doc).encode(), overwrite=True)
        return rel
    except (OSError, ValueError, CheckpointOpsError):
        return None


def _planned_by_ended_run(ckpt: Checkpoint, rel: str) -> str | None:
    """Which ended run planned ``rel`` (``record_ended_run``), if the file is still the one it left."""
    try:
        doc = json.loads(ckpt.fm.read_bytes(join(ops_dir(ckpt.fm, ckpt.root), ENDED_RUN_FILE)))
        info = ckpt.listing.files.get(rel)
        if doc.get("offsets") == rel and info is not None and info.size == doc.get("size") \
                and info.mtime == doc.get("mtime"):
            return str(doc.get("by"))
    except (OSError, ValueError, AttributeError, BadInputError):  # an outage is raised: not 'no ended run'
        pass
    return None


def _left_planned(ckpt: Checkpoint, rel: str) -> bool:
    """``rel`` is the no-data batch that the rollback or restore whose result the checkpoint holds left
    planned (a rollback keeps it: rollback.py): its age is that of the run that planned it, not a sign of a
    run now. That operation is the newest rollback or restore journaled here that was not undone or
    dropped: one undone since (rollback, rollback again, undo) left the tree as the one before it had, and a
    sink operation journaled since changed no offsets file."""
    try:
        journals = scan_journals(ckpt.fm, ops_dir(ckpt.fm, ckpt.root))
    except (OSError, ValueError, BadInputError):
        return False
    for path, markers in reversed(list(journals.items())):
        if "undone" in markers or "abandoned" in markers:
            continue  # its changes were reverted, or it never made any
        try:
            record = load_journal(ckpt.fm, path).record
        except (OSError, ValueError, BadInputError):
            return False
        if record.get("operation") not in _PLANNING_OPERATIONS:
            continue  # a sink operation: the offsets files are as the operation before it left them
        if "applied" not in markers or "undoing" in markers:
            return False  # unfinished, or its undo was: nothing is known to stand
        return rel in record.get("left_planned", [])
    return False


_PLANNING_OPERATIONS = ("rollback", "restore")  # the operations that may leave a no-data batch planned


RECENT_COMMIT_SECONDS = 120  # a newest commit this recent may be a query's, idle until its next trigger
RECENT_COMMIT = "the newest batch committed recently"


def recent_commit_warning(ckpt: Checkpoint, seconds: int = RECENT_COMMIT_SECONDS,
                          now: float | None = None) -> list[str]:
    """A warning when the newest ``commits/`` file is younger than ``seconds`` and nothing looks planned: a query
    idle between triggers writes nothing this tool can see (module docstring), and a recent commit is the
    likeliest sign of one. Not a refusal: a query that just failed, the usual reason for a rollback, looks the
    same (a hostile review rolled back under a query still running on a 2 s trigger: it wrote its next batches
    over the rolled-back logs and failed, and fsck found 11 errors)."""
    now = time.time() if now is None else now
    C = ckpt.latest_commit
    if ckpt.fence is not None or C is None or (ckpt.latest_offset is not None and ckpt.latest_offset > C):
        return []  # fenced: nothing runs; a planned batch: ``active_reasons`` judges it
    info = ckpt.commit_files[C].info
    if info.mtime is None or now - info.mtime >= seconds:
        return []
    # the same words run to run (no seconds): a dry run's plan, printed twice, reads the same
    return [f"{RECENT_COMMIT}: commits/{C} was written less than {seconds // 60} minutes ago. A query started without "
            "checkpoint-ops that still runs, idle until its next trigger, writes nothing this tool can see: if one "
            "runs, stop it before going ahead (it would plan its next batch over the rolled-back logs, and fail or "
            "mix two timelines)"]


def sink_active_reasons(sink, fresh_seconds: int = DEFAULT_FRESH_SECONDS, now: float | None = None) -> list[str]:
    """Why a file sink's output looks in use when its checkpoint is not known: a fresh newest log file."""
    now = time.time() if now is None else now
    log = sink.log
    if log.latest is None:
        return []
    info = log.files[log.latest].info
    if info.mtime is not None and now - info.mtime < fresh_seconds:
        return [f"{log.rel(log.latest)} was written {int(now - info.mtime)} s ago: the query is probably running"]
    return []


def _refuse(reasons: list[str], path: str, extra_fix: str = "") -> None:
    raise RefusedError("the query looks active: " + "; ".join(reasons) + f" ({_CANNOT_SEE})", path=path,
                       fix=_fix(extra_fix))


def forced_warning(reasons: list[str]) -> str:
    """What ``--force`` overrode when the query looks active, and what that risks (for the plan's warnings)."""
    return ("--force overrode the check that no query is running: the query looks active ("
            + "; ".join(reasons) + "). If a query is running, it fails at its next batch (the files it "
            "expects are gone or changed under it), or worse, writes a batch into the changed checkpoint and "
            "mixes two timelines; stop it first unless you are sure it has ended")


def refuse_if_active(ckpt: Checkpoint, force: bool, fresh_seconds: int = DEFAULT_FRESH_SECONDS) -> list[str]:
    """Refuse if the query looks active; with ``force``, the warnings for what was overridden (module
    docstring)."""
    reasons = active_reasons(ckpt, fresh_seconds)
    if reasons and not force:
        _refuse(reasons, ckpt.url)
    return [forced_warning(reasons)] if reasons else []


def refuse_if_sink_active(sink, force: bool, fresh_seconds: int = DEFAULT_FRESH_SECONDS) -> list[str]:
    """``refuse_if_active`` for a sink output whose checkpoint is not known."""
    reasons = sink_active_reasons(sink, fresh_seconds)
    if reasons and not force:
        ckpt = param("checkpoint")
        _refuse(reasons, sink.url, f"; pass {ckpt} so the query's checkpoint is judged too" if ckpt else "")
    return [forced_warning(reasons)] if reasons else []
