"""The operations directory beside a checkpoint, the write-ahead journal in it, and the fence.

``<parent>/.checkpoint-ops/<name>/`` sits beside the checkpoint (never inside: Spark parses names
in its own folders) and holds:

* ``journal/<op id>/plan.json``: the plan, the bytes it writes and the original ``metadata``,
  written before anything changes; then ``applied`` or ``undone`` markers;
* ``trash/<op id>/<path>``: every file the operation deleted, moved aside so ``undo`` can put it back
  (on object stores with versioning, the delete marker plays this role and nothing is copied);
* ``ledger/``: the batch ledger.

While an operation runs, the checkpoint's ``metadata`` is replaced by a fence (``fence.py``).
"""

from __future__ import annotations

import calendar
import json
import time
import uuid
from dataclasses import dataclass

from . import __version__
from .errors import BadInputError
from .storage import CheckpointFileManager
from .storage.paths import basename, dirname, join

OPS_DIR = ".checkpoint-ops"
# 2: the record carries its hooks (undo_guard, ledger_truncation, undoable); format 1 records are
# upgraded on load (``_upgrade``)
JOURNAL_FORMAT = 2


def ops_dir(fm: CheckpointFileManager, root: str) -> str:
    """Where our files for ``root`` live: beside it, in a hidden directory."""
    parent = dirname(root)
    if not parent or (not fm.location.is_local and "/" not in root.strip("/")):
        raise BadInputError(
            "the location is a bucket root: there is no place beside it for the journal and ledger",
            path=fm.url(root),
            fix="keep checkpoints under a prefix (s3://bucket/checkpoints/query)",
        )
    return join(parent, OPS_DIR, basename(root))


def utc_stamp() -> str:
    """A UTC time to the microsecond that sorts as text: journals and ledger segments are ordered by
    name, and two operations (or a rollback and the next ledger sync) can fall in the same second."""
    t = time.time_ns() // 1000
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(t // 1_000_000))}.{t % 1_000_000:06d}Z"


def new_op_id(operation: str) -> str:
    return f"{utc_stamp()}-{operation}-{uuid.uuid4().hex[:8]}"


def op_id_time(op_id: str) -> float | None:
    """When the operation ``op_id`` was journaled (its ``utc_stamp``), in seconds since the epoch."""
    stamp = op_id.split("-", 1)[0]
    try:
        whole, _, micros = stamp.rstrip("Z").partition(".")
        return calendar.timegm(time.strptime(whole, "%Y%m%dT%H%M%S")) + int(micros or 0) / 1_000_000
    except ValueError:
        return None


# ---- the journal ----------------------------------------------------------------------------------


@dataclass
class Journal:
    fm: CheckpointFileManager
    path: str  # <ops>/journal/<op id>
    record: dict

    @property
    def op_id(self) -> str:
        return self.record["op_id"]

    def marker(self, name: str) -> str:
        return join(self.path, name)

    def has_marker(self, name: str) -> bool:
        return self.fm.exists(self.marker(name))

    def mark(self, name: str, by: str | None = None) -> None:
        """Add a marker (idempotent): when (``at``, to the second, for people; ``time``, seconds since the epoch
        to the microsecond, for ``marked_at``), and who (``by``: the holder of the leases, when known)."""
        now = time.time()
        info = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "time": round(now, 6),
                **({"by": by} if by else {})}
        stamp = json.dumps(info).encode()
        try:
            self.fm.write_bytes(self.marker(name), stamp, overwrite=False)
        except FileExistsError:
            pass  # already marked (a resumed run)

    def marker_info(self, name: str) -> dict:
        """What a marker says (``at``, and ``by`` when it was recorded); empty if it is missing or unreadable."""
        try:
            doc = json.loads(self.fm.read_bytes(self.marker(name)))
        except (FileNotFoundError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def marked_at(self, name: str) -> float | None:
        """When the marker was written, in seconds since the epoch (None: missing, or it does not say). A
        marker written before ``time`` was recorded says ``at`` to the second: the end of that second, so a
        comparison with it errs towards "marked later"."""
        info = self.marker_info(name)
        if isinstance(info.get("time"), (int, float)):
            return float(info["time"])
        try:
            return calendar.timegm(time.strptime(str(info["at"]), "%Y-%m-%dT%H:%M:%SZ")) + 1.0
        except (KeyError, ValueError):
            return None

    def unmark(self, name: str) -> None:
        """Remove a marker (a rolled-forward undo is no longer "undoing")."""
        self.fm.delete(self.marker(name))


def write_journal(fm: CheckpointFileManager, ops: str, record: dict) -> Journal:
    record = {"format": JOURNAL_FORMAT, "tool_version": __version__,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    path = join(ops, "journal", record["op_id"])
    fm.write_bytes(join(path, "plan.json"), json.dumps(record, separators=(",", ":")).encode(), overwrite=False)
    return Journal(fm, path, record)


def load_journal(fm: CheckpointFileManager, path: str) -> Journal:
    try:
        record = json.loads(fm.read_bytes(join(path, "plan.json")))
    except FileNotFoundError:
        raise BadInputError("journal has no plan.json: the operation it names is not journaled here", path=fm.url(path),
                            fix="if this checkpoint was copied from where the operation ran, finish or undo it there "
                            "and copy it again; otherwise restore the checkpoint from a backup") from None
    except ValueError:
        raise BadInputError("journal plan.json is not valid JSON", path=fm.url(path),
                            fix="the journal is damaged; restore the checkpoint from a backup") from None
    if record.get("format", 0) > JOURNAL_FORMAT:
        raise BadInputError(f"journal format {record.get('format')} is newer than this tool understands",
                            path=fm.url(path), fix="use the spark-checkpoint-ops release that wrote it")
    return Journal(fm, path, _upgrade(record))


# Format 1 journals named their hooks only through the operation: what releases up to 0.1 wrote.
_V1_GUARDS = {"rollback": {"checkpoint": ["offsets", "commits"]}, "restore": {"checkpoint": ["offsets", "commits"]},
              "sink-compact": {"sink0": ["_spark_metadata"]}, "sink-retain": {"sink0": ["_spark_metadata"]},
              "sink-orphans": {"sink0": ["_spark_metadata"]}}


def _upgrade(record: dict) -> dict:
    if record.get("format", 1) >= 2:
        return record
    op = record.get("operation")
    out = {**record, "undo_guard": _V1_GUARDS.get(op, {}), "undoable": True}
    if op == "rollback":
        out["ledger_truncation"] = {"after_batch": record["plan"]["target_batch"]}
    return out


def scan_journals(fm: CheckpointFileManager, ops: str) -> dict[str, set[str]]:
    """Journal directory -> the files in it (``plan.json`` and markers), oldest first, from one
    listing. A directory without ``plan.json`` is a crash while the journal itself was written:
    nothing had changed yet, so it is no operation at all and is left out."""
    base = join(ops, "journal")
    found: dict[str, set[str]] = {}
    for f in fm.walk(base):
        rest = f.path[len(base) + 1:]
        op, _, name = rest.partition("/")
        if name and "/" not in name and not name.startswith("."):
            found.setdefault(join(base, op), set()).add(name)
    return {p: found[p] for p in sorted(found) if "plan.json" in found[p]}


@dataclass(frozen=True)
class StoppedRestore:
    """A restore into a location that stopped part-way, or an undo of one: what it is, the command that ends it
    and what that command does."""

    what: str  # "a checkpoint-ops restore (journaled in <url>)"
    command: str  # "checkpoint-ops resume <url>" or "checkpoint-ops undo <url>"
    undoing: bool  # an undo of the restore stopped part-way

    @property
    def fix(self) -> str:
        if self.undoing:
            return f"run `{self.command}` first: it finishes removing what the restore put there"
        return (f"run `{self.command}` first: it finishes the restore, or drops it and says what to do if it had "
                "changed nothing yet")


def restore_stopped_at(fm: CheckpointFileManager, root: str) -> StoppedRestore | None:
    """A restore into ``root`` that stopped part-way, or its undo, judged on the journal ``resume`` and ``undo`` act
    on (the newest one neither undone nor abandoned, past those of commands that are never undone, such as a lease
    break); None when that journal is not a restore's, or is applied (also for a bucket root, where no journal can
    be). Only a restore puts a checkpoint where there was none, so only its journal speaks for an empty location. A
    journal that cannot be read (damaged, or written by a newer release) counts when its name says restore:
    ``resume`` then names what is wrong with it. One listing of the journals, and a read of that journal's plan."""
    try:
        ops = ops_dir(fm, root)
    except BadInputError:
        return None
    url = fm.url(root)
    for path, markers in reversed(scan_journals(fm, ops).items()):
        if "undone" in markers or "abandoned" in markers:
            continue
        journaled = f"(journaled in {fm.url(path)})"
        try:
            record = load_journal(fm, path).record
        except BadInputError:
            if "-restore-" not in basename(path):
                return None
            return StoppedRestore(f"a checkpoint-ops restore {journaled}, whose journal cannot be read,",
                                  f"checkpoint-ops resume {url}", False)
        if not record.get("undoable", True):
            continue  # history only (a lease break): it puts no checkpoint anywhere
        if record.get("operation") != "restore":
            return None
        if "undoing" in markers:
            return StoppedRestore(f"an undo of a checkpoint-ops restore {journaled}", f"checkpoint-ops undo {url}",
                                  True)
        if "applied" in markers:
            return None
        return StoppedRestore(f"a checkpoint-ops restore {journaled}", f"checkpoint-ops resume {url}", False)
    return None


def list_journals(fm: CheckpointFileManager, ops: str) -> list[str]:
    """Journal directories, oldest first (op ids start with a UTC timestamp)."""
    return list(scan_journals(fm, ops))
