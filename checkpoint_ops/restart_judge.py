"""Spark as the judge: restart a query on a scratch copy of a checkpoint, against Spark's ``noop`` sink,
and report what Spark did.

The copy holds what Spark reads to restart after the last committed batch N: the restart set
(``restart.py``: ``metadata``, ``offsets/N-1`` and ``offsets/N``, ``commits/N``, the source logs, the
state files that load version N+1, and the SST and log files their RocksDB zips name) plus what Spark
validates the query against: every operator's metadata and state schema files, and the metadata of sources
that are not file sources (Kafka's initial offsets, the rate source's start time). ``offsets/N`` is then
planted again as ``offsets/N+1``: Spark's restart finds batch N+1 planned but not committed and must run it,
over no new input (its start and end offsets are equal). So Spark plans the changed query against the checkpoint, checks its sources, its
stateful operators against the operator metadata, every key and value schema, loads every state store at
version N+1 and commits the batch: every check Spark makes at a restart, without reading new data and
without touching the query's real output (the sink is ``noop``; ``trigger(once)`` runs just that batch).

No PySpark import here: the session and writer come from the caller.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import zipfile
from dataclasses import dataclass

from .errors import BadInputError
from .model.checkpoint import Checkpoint
from .model.state import StateFile, Store
from .query_profile import is_connect
from .restart import RestartSets
from .storage import CheckpointFileManager, open_file_manager
from .storage.paths import parse_url

# Files Spark validates a query against (not in the restart set, which is about loading state).
_VALIDATION_FILE = re.compile(r"^state/\d+/(?:_metadata/.+|_stateSchema/.+|\d+/(?:[^/]+/)?_metadata/schema)$")
_ERROR_CLASS = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")
_WRAPPERS = {"STREAM_FAILED"}
JUDGE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RestartCopy:
    """A scratch copy ready for Spark: restarting from ``location`` runs batch ``batch + 1``."""

    url: str
    location: str  # as Spark's checkpointLocation
    batch: int  # the last committed batch of the original
    files: int
    bytes: int

    def to_dict(self) -> dict:
        return {"url": self.url, "batch": self.batch, "files": self.files, "bytes": self.bytes}


@dataclass(frozen=True)
class JudgeOutcome:
    """What Spark did when the query restarted on the copy.

    ``restarted``: Spark planned and committed batch ``batch`` (the checks it makes at a restart all
    passed). Otherwise ``error_class`` is Spark's error class (``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``),
    or None when Spark raised a plain exception (``exception`` names its class), and ``message`` is Spark's.
    """

    restarted: bool
    batch: int
    seconds: float
    error_class: str | None = None
    exception: str | None = None
    message: str | None = None
    operators: tuple[str, ...] = ()  # the stateful operators Spark ran (progress names), when it ran

    def to_dict(self) -> dict:
        return {"restarted": self.restarted, "batch": self.batch, "seconds": round(self.seconds, 3),
                "error_class": self.error_class, "exception": self.exception, "message": self.message,
                "operators": list(self.operators)}


def spark_location(fm: CheckpointFileManager, root: str) -> str:
    """A location as Spark (Hadoop) names it: a local path, or s3a:// for S3."""
    loc = parse_url(fm.url(root))
    if loc.is_local:
        return loc.path
    return f"{'s3a' if loc.scheme == 's3' else loc.original_scheme or loc.scheme}://{loc.path}"


def restart_files(ckpt: Checkpoint, batch: int, ssts: bool = False) -> list[str]:
    """The files Spark reads to restart ``ckpt`` after ``batch`` and to validate a query against it
    (relative paths, sorted). Damage in them is unusable input (exit 2), naming the first damaged file.
    ``ssts``: also the SST and log files the RocksDB zips among them name, which takes a read of each zip
    (what a copy needs; a check of the set as the listing shows it does not)."""
    rs = RestartSets(ckpt, deep=False).of(batch)
    if rs.damage:
        first = rs.damage[0]
        more = f" (and {len(rs.damage) - 1} more)" if len(rs.damage) > 1 else ""
        raise BadInputError(f"{first.problem}{more}: Spark cannot restart this checkpoint after batch {batch}, "
                            "so no query can be judged against it", path=first.url, fix=first.fix)
    rels: set[str] = set()
    for f in rs.files:
        if f.origin == "disk":
            rels.add(f.rel)
        elif f.origin.startswith("rebuilt from "):
            rels.add(f.origin[len("rebuilt from "):])  # the compact file Spark itself reads
    state_files = {sf.rel: (store, sf) for store in ckpt.state.stores() for sf in store.files}
    for rel in list(rels):
        store, sf = state_files.get(rel, (None, None))
        if sf is None:
            continue
        for side in sf.sidecars:
            if not side.rsplit("/", 1)[-1].startswith("."):
                rels.add(side)  # Spark's own checksum file (checkpoint format V2)
        if ssts and sf.kind == "zip":
            rels.update(_zip_ssts(ckpt, store, sf))
    for sid, src in ckpt.sources.items():
        if src.log is None:  # Kafka's initial offsets, the rate source's start time, ...
            rels.update(rel for rel, _ in ckpt.listing.under(src.rel_dir) if not rel.rsplit("/", 1)[-1].startswith("."))
    rels.update(rel for rel in ckpt.listing.files if _VALIDATION_FILE.match(rel)
                and not rel.rsplit("/", 1)[-1].startswith("."))
    return sorted(rels)


def _zip_ssts(ckpt: Checkpoint, store: Store, zip_file: StateFile) -> list[str]:
    """The SST and log files (``SSTs/``, ``logs/``) a RocksDB checkpoint zip names: RocksDB opens them when it
    loads the zip's version, so a restart needs them beside it. Reads the zip (its ``metadata`` entry)."""
    url = ckpt.listing.url(zip_file.rel)
    try:
        names = ckpt.state.zip_ssts(zip_file)
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError) as e:
        raise BadInputError(f"{zip_file.name} is not a readable RocksDB checkpoint zip ({e}): Spark cannot load "
                            "its state", path=url, fix="restore it from a backup, or roll back to an earlier "
                            "batch") from None
    missing = [name for name in names if name not in store.ssts]
    if missing:
        raise BadInputError(f"{zip_file.name} names {missing[0]}" + (f" and {len(missing) - 1} more files"
                            if len(missing) > 1 else "") + f", not in {store.rel_dir}/SSTs or logs: RocksDB "
                            "cannot open its state", path=url,
                            fix="restore the store's files from a backup, or roll back to a batch whose state is "
                                "complete (see `checkpoint-ops inspect`)")
    return [store.ssts[name] for name in names]


def require_unfenced(ckpt: Checkpoint) -> None:
    """An interrupted checkpoint-ops operation fenced the checkpoint: Spark cannot start on it (exit 2)."""
    if ckpt.fence is not None:
        raise BadInputError(f"an interrupted checkpoint-ops {ckpt.fence.operation} fenced this checkpoint: Spark "
                            "cannot restart it until it is finished or undone", path=ckpt.url,
                            fix=f"run `checkpoint-ops resume {shlex.quote(ckpt.url)}` or "
                                f"`checkpoint-ops undo {shlex.quote(ckpt.url)}`")


def copy_for_restart(ckpt: Checkpoint, scratch_url: str, storage_options: dict | None = None,
                     batch: int | None = None) -> RestartCopy:
    """Copy what Spark reads to restart ``ckpt`` after its last committed batch (or after ``batch``, a committed
    one: as a rollback to it leaves the checkpoint) into ``scratch_url`` (which must be empty or absent), and plant
    the next batch (see module docstring)."""
    require_unfenced(ckpt)
    batch = ckpt.latest_commit if batch is None else batch
    if batch is None:
        raise BadInputError("the checkpoint has no committed batch: there is nothing to restart from",
                            path=ckpt.url, fix="run the query once (a new query starts fresh)")
    rels = restart_files(ckpt, batch, ssts=True)
    fm, root = open_file_manager(scratch_url, storage_options)
    if fm.walk(root):
        raise BadInputError("the scratch location is not empty", path=scratch_url,
                            fix="give an empty (or new) scratch location")
    total = 0
    for rel in rels:
        data = ckpt.fm.read_bytes(ckpt.listing.abs(rel))
        fm.write_bytes(f"{root}/{rel}", data)
        total += len(data)
    plant_next_batch(fm, root, ckpt.fm.read_bytes(ckpt.listing.abs(f"offsets/{batch}")), batch)
    return RestartCopy(fm.url(root), spark_location(fm, root), batch, len(rels), total)


def plant_next_batch(fm: CheckpointFileManager, root: str, offsets_bytes: bytes, batch: int) -> None:
    """Write ``offsets/<batch+1>`` with the offsets of ``batch``: Spark's restart then runs batch+1 over
    no new input. Only ever into a scratch copy."""
    fm.write_bytes(f"{root}/offsets/{batch + 1}", offsets_bytes)


def plant_in_place(ckpt: Checkpoint, batch: int) -> str:
    """Plant the next batch into ``ckpt`` itself, which must be a scratch copy (a restored backup), and
    return its location for Spark."""
    plant_next_batch(ckpt.fm, ckpt.root, ckpt.fm.read_bytes(ckpt.listing.abs(f"offsets/{batch}")), batch)
    return spark_location(ckpt.fm, ckpt.root)


def run_judge(spark, writer, location: str, batch: int, timeout_s: float = JUDGE_TIMEOUT_S) -> JudgeOutcome:
    """Start ``writer`` (the changed query, unstarted) on the prepared copy at ``location`` with Spark's
    ``noop`` sink and ``trigger(once)``, wait for it, and report whether Spark ran batch ``batch``.

    ``writer`` is changed (its sink is replaced): build a fresh one for the real run.
    """
    to_noop(spark, writer)
    t0 = time.monotonic()
    try:
        started = writer.option("checkpointLocation", location).trigger(once=True).start()
        if started.awaitTermination(timeout_s) is False:
            started.stop()
            return JudgeOutcome(False, batch, time.monotonic() - t0, None, "timeout",
                                f"Spark did not finish batch {batch} within {int(timeout_s)} s")
        progress = [_progress(p) for p in started.recentProgress]
    except Exception as e:  # Spark's verdict: the query cannot restart
        error_class, exception, message = spark_failure(e)
        return JudgeOutcome(False, batch, time.monotonic() - t0, error_class, exception, message)
    finally:
        _release_state_stores(spark)
    ran = [p for p in progress if p.get("batchId") == batch]
    if not ran:
        ran_ids = [p.get("batchId") for p in progress]
        return JudgeOutcome(False, batch, time.monotonic() - t0, None, None,
                            f"Spark restarted but did not run batch {batch} (ran {ran_ids})")
    operators = tuple(op.get("operatorName", "?") for op in ran[-1].get("stateOperators", []))
    return JudgeOutcome(True, batch, time.monotonic() - t0, operators=operators)


def to_noop(spark, writer) -> None:
    """Replace the writer's sink by Spark's ``noop`` sink: the query plans and runs as it would, and
    writes nothing anywhere (foreachBatch functions, file paths and Kafka topics are not used)."""
    if is_connect(spark):
        proto = writer._write_proto
        for name in ("foreach_batch", "foreach_writer", "path", "table_name"):
            proto.ClearField(name)
        proto.format = "noop"
        return
    writer.format("noop")  # overrides foreachBatch/foreach too; noop ignores path and partitionBy


def spark_failure(exc: BaseException) -> tuple[str | None, str | None, str]:
    """(error class, Java exception class, message) of a failed streaming query or start(). The
    ``STREAM_FAILED`` wrapper is looked through; the streaming query's own dump is cut off."""
    text = str(exc)
    exception = None
    origin = getattr(exc, "_origin", None)  # classic PySpark: the JVM exception
    if origin is not None:
        try:
            cause = origin.getCause() or origin
            exception = str(cause.getClass().getName())
            text = str(cause.getMessage() or text)
        except Exception:
            pass
    classes = [c for c in _ERROR_CLASS.findall(text) if c not in _WRAPPERS and not c.startswith("id =")]
    message = text.split("=== Streaming Query ===")[0]
    message = re.sub(r"^\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ", "", message.strip())
    message = re.sub(r"\s*SQLSTATE: \w+", "", message).strip()
    if exception is None:
        exception = type(exc).__name__
    return (classes[0] if classes else None), exception, message[:2000]


def _progress(p) -> dict:
    return json.loads(p.json) if hasattr(p, "json") else dict(p)


def _release_state_stores(spark) -> None:
    """Unload the state stores the judge loaded (they point into scratch space), unless another query of
    this session is running. Under Spark Connect the server unloads them at its next maintenance."""
    if is_connect(spark) or spark.streams.active:
        return
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
