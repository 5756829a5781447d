"""Will a changed query restart from this checkpoint, and will it behave as the new code says?

``check_compat`` compares a query (the unstarted ``DataStreamWriter`` its function builds) with what a
checkpoint holds and reports every difference as one of:

* **safe**: allowed by the Structured Streaming guide ("Recovery Semantics after Changes in a Streaming
  Query") and accepted by Spark;
* **fails at restart**: Spark will refuse, with the error class it raises;
* **silently different**: Spark restarts, but does something other than the new code says (the
  checkpoint's ``spark.sql.shuffle.partitions`` wins over the session's, a file source now reads another
  directory as if every file were new, a file sink starts a log Spark later fails on, ...);
* **check by hand**: Spark restarts, and checkpoint-ops cannot tell whether the result is what the new code
  says: the plan changed below a stateful operator in a way that is not only a filter (how a grouping key or an
  aggregated value is computed): rows from the next batch on are computed the new way, beside state the old
  code computed. Never reported as safe; a plan change is safe only when it is provably a projection or filter
  (the ``state_hash`` of the profile is unchanged, or the query has no stateful operator).

**Spark is the judge** of everything it checks itself: the query is restarted on a scratch copy of the
checkpoint's restart set with its sink replaced by ``noop`` (``restart_judge.py``), and Spark's own
planning, operator-metadata and state-schema validation decide; a refusal is reported with Spark's error
class and message. Checkpoint-ops adds the checks Spark does not make: the settings the offsets log pins,
file-source paths against the source log, the file sink against its log, the output mode, and (with the
profile recorded beside the checkpoint after the last accepted run, ``query_profile.py``) the sink (its
kind, path and ``partitionBy`` columns), source options, stateful operators (join type, time-window
durations) and the code of UDFs below them (the plan names a UDF, not its body) that Spark accepts but that
compute differently. What the recorded profile does not say (an earlier
release did not record it) is unknown: a note, never a difference.

No PySpark import here: the caller passes its session and the function that builds the query.
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import re
import shlex
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import EXIT_FINDINGS, EXIT_OK, BadInputError, store_kept_failing
from .journal import restore_stopped_at
from .lag import SinkAheadOfCommits, planned_batch_logged_without_state, sink_ahead_of_commits, state_ends_at
from .model.checkpoint import Checkpoint
from .model.compactible import SPARK_DEFAULT_COMPACT_INTERVAL, is_compaction_batch
from .model.listing import new_query_blocked
from .model.offsets import OffsetSeq
from .model.sink import SinkOutput
from .pairing import same_location
from .query_profile import (RATE_LIMIT_OPTIONS, UNKNOWN, OperatorProfile, ProfileRecord, QueryProfile, SinkProfile,
                            UdfProfile, describe_query, read_profile, record_profile)
from .restart_judge import JudgeOutcome, copy_for_restart, require_unfenced, restart_files, run_judge
from .storage import open_file_manager
from .storage.manager import CheckpointFileManager
from .storage.paths import parse_url, spark_url_to_location

SAFE = "safe"
FAILS = "fails-at-restart"
SILENT = "silently-different"
CHECK = "check-by-hand"
VERDICTS = (FAILS, SILENT, CHECK, SAFE)

GUIDE = "Structured Streaming Programming Guide, 'Recovery Semantics after Changes in a Streaming Query'"
RULES = {
    "sources": "Changes in the number or type (a different source) of input sources are not allowed.",
    "source-options": "Changes in the parameters of input sources depend on the source: rate limits may change; "
                      "changing the subscribed topics or files is generally not allowed (the results are "
                      "unpredictable).",
    "sink": "Changes in the type of output sink are allowed only between some sinks: file sink to Kafka yes, Kafka "
            "to file sink no, Kafka to foreach (or back) yes.",
    "sink-path": "Changes in the parameters of output sink: the output directory of a file sink may not change.",
    "sink-commit": "Not a rule of the guide (checkpoint-ops, from Spark 4.3's behaviour): with RocksDB checkpoint "
                   "format V2, a batch the file sink logged must be committed (commits/N) before Spark restarts.",
    "sink-rollback": "Not a rule of the guide (checkpoint-ops, from Spark's file sink): a rollback takes the file "
                     "sink's log back with the checkpoint, or Spark's file sink skips every re-run batch id its log "
                     "already holds.",
    "sink-partitioning": "Changes in the parameters of output sink: a file sink's output keeps one partitioning "
                         "(its readers infer the partition columns from the directories of all its files); Spark "
                         "does not check it at a restart.",
    "projection": "Changes in projections, filters and map-like operations are allowed (a changed output schema "
                  "only if the sink accepts it).",
    "stateful": "Changes in stateful operations: the schema of state data may not change (aggregation keys and "
                "aggregates, deduplication columns, join columns and join type, the state and timeout of "
                "[flatMap|applyInPandas]GroupsWithState), and stateful operations may not be added or removed.",
    "output-mode": "The output mode decides what a stateful query emits; the checkpoint does not record it and Spark "
                   "does not check it at a restart. A file sink accepts only append mode.",
    "conf": "Spark records these settings in the offsets log at the query's first batch and applies the recorded "
            "values at every restart (OffsetSeqMetadata): a new value in the session has no effect on this query.",
    "query": "Spark must be able to plan the query against the checkpoint.",
}
_SCHEMAS = re.compile(r"Existing (key|value)_schema=(.*?) and new \1_schema=(.*?)(?:\.\s*\n|\.\s*If |\.?$)", re.S)
_ASPECT_ORDER = ("sources", "source-options", "stateful-operators", "state-schema", "state", "output-mode", "sink",
                 "conf", "projection", "query")
_MODE_EFFECTS = {
    ("append", "update"): "each group is emitted again at every batch that updates it (partial results before the "
                          "watermark closes it) instead of once when it closes",
    ("append", "complete"): "the whole result table is emitted at every batch, and no group is ever dropped from "
                            "the state",
    ("update", "append"): "a group is emitted only when the watermark closes it: groups already emitted as updates "
                          "are emitted once more, finally, when they close",
    ("update", "complete"): "the whole result table is emitted at every batch, and no group is ever dropped from "
                            "the state",
    ("complete", "append"): "only groups the watermark closes are emitted, once, instead of the whole table",
    ("complete", "update"): "only the groups a batch changes are emitted, instead of the whole table",
}


@dataclass(frozen=True)
class Difference:
    """One difference between the new query and the checkpoint, judged.

    ``effect`` says what Spark will do (for ``fails-at-restart``: how it refuses); ``rule`` is the guide's
    rule that applies; ``error_class`` is the Spark error class of a refusal (None when Spark raises a plain
    exception, whose class is then named in ``effect``); ``found_by`` is ``spark`` when Spark's own restart
    on the scratch copy decided, ``checkpoint-ops`` for the checks Spark does not make. ``fix``: what resolves
    it other than changing the query back (a difference that no query change causes), else None;
    ``rollback_to``: the batch to which a rollback of the checkpoint with its file sinks resolves it, when one does.
    """

    # sources | source-options | stateful-operators | state-schema | state | output-mode | sink | conf | projection
    # | query
    aspect: str
    verdict: str  # safe | fails-at-restart | silently-different | check-by-hand
    was: str | None
    now: str | None
    effect: str
    rule: str
    error_class: str | None = None
    found_by: str = "checkpoint-ops"
    fix: str | None = None
    rollback_to: int | None = None

    def to_dict(self) -> dict:
        return {"aspect": self.aspect, "verdict": self.verdict, "was": self.was, "now": self.now,
                "effect": self.effect, "rule": self.rule, "error_class": self.error_class, "found_by": self.found_by,
                "fix": self.fix, "rollback_to": self.rollback_to}


@dataclass(frozen=True)
class CompatReport:
    """The verdict on one query against one checkpoint.

    ``compatible``: every difference is safe (exit 0); otherwise exit 1 (a difference to check by hand too). ``spark_restarts``: Spark's own
    restart on the scratch copy accepted the query (None when it did not run: a fresh checkpoint, or the
    recorded profile shows Spark already accepted this exact query).
    """

    checkpoint: str
    batch: int | None  # the last committed batch (None: nothing committed yet)
    compatible: bool
    spark_restarts: bool | None
    differences: tuple[Difference, ...]
    notes: tuple[str, ...]
    query: QueryProfile
    judge: JudgeOutcome | None = None
    recorded: ProfileRecord | None = None
    as_of: int | None = None  # judged as of this batch, where a rollback to it leaves the checkpoint (``batch``)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.compatible else EXIT_FINDINGS

    def of(self, verdict: str) -> list[Difference]:
        return [d for d in self.differences if d.verdict == verdict]

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "batch": self.batch, "compatible": self.compatible,
                "spark_restarts": self.spark_restarts, "differences": [d.to_dict() for d in self.differences],
                "notes": list(self.notes), "judge": self.judge.to_dict() if self.judge else None,
                "query": self.query.to_dict(),
                "recorded_profile": ({"recorded_at": self.recorded.recorded_at, "judged": self.recorded.judged}
                                     if self.recorded else None)}

    def render(self) -> str:
        fails, silent, check = self.of(FAILS), self.of(SILENT), self.of(CHECK)
        head = "compatible" if self.compatible else "NOT COMPATIBLE (" + ", ".join(
            part for part in (f"{len(fails)} fail(s) at restart" if fails else "",
                              f"{len(silent)} silently different" if silent else "",
                              f"{len(check)} to check by hand" if check else "") if part) + ")"
        at = (f"as of batch {self.as_of}, where a rollback to it leaves the checkpoint" if self.as_of is not None else
              f"last committed batch {self.batch}" if self.batch is not None else "nothing committed yet")
        lines = [f"{self.checkpoint} ({at}): {head}"]
        for d in self.differences:
            label = {FAILS: "FAILS AT RESTART", SILENT: "SILENTLY DIFFERENT", CHECK: "CHECK BY HAND",
                     SAFE: "safe"}[d.verdict]
            lines.append(f"  {label}  {d.aspect}" + (f"  [{d.error_class}]" if d.error_class else ""))
            if d.was is not None or d.now is not None:
                lines.append(f"      was: {d.was if d.was is not None else '?'}")
                lines.append(f"      now: {d.now if d.now is not None else '?'}")
            lines.append(f"      {'Spark' if d.found_by == 'spark' else 'effect'}: {d.effect}")
            lines.append(f"      rule: {d.rule}")
            if d.fix and d.fix not in d.effect:
                lines.append(f"      fix: {d.fix}")
        if self.judge is not None:
            verdict = (f"restarted and ran batch {self.judge.batch} (stateful operators: "
                       f"{', '.join(self.judge.operators) or 'none'})" if self.judge.restarted
                       else f"refused ({self.judge.error_class or self.judge.exception})")
            lines.append(f"Spark's verdict on a scratch copy (noop sink): {verdict} in {self.judge.seconds:.1f} s")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---- the query ---------------------------------------------------------------------------------------


def load_query(spec: str) -> Callable:
    """``MODULE:FUNCTION`` -> the function (``FUNCTION(spark)`` returns the query's unstarted writer).
    The current directory is importable, as with ``python -m``."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise BadInputError(f"--query {spec!r} is not MODULE:FUNCTION", fix="e.g. --query my_streams:build_events")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure of user code is unusable input
        raise BadInputError(f"--query {spec!r}: cannot import {module_name}: {type(e).__name__}: {e}",
                            fix="run from the directory holding the module, or put it on PYTHONPATH") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise BadInputError(f"--query {spec!r}: {module_name} has no function {func_name}",
                            fix="name the function that takes the SparkSession and returns df.writeStream...")
    return func


class QueryBuildError(BadInputError):
    """The user's query function raised. ``trace``: its own traceback (from the function down), for a front end
    that shows it (the Dagster run's failure); the message stays one line, as every bad input's."""

    def __init__(self, problem: str, trace: str = "", **kw):
        super().__init__(problem, **kw)
        self.trace = trace


def build_writer(build: Callable, spark):
    """Call the query's function; its result must be an unstarted ``DataStreamWriter``."""
    try:
        writer = build(spark)
    except Exception as e:
        trace = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None))
        raise QueryBuildError(f"the query function {getattr(build, '__name__', build)!r} failed: "
                              f"{type(e).__name__}: {str(e).strip()[:1000]}", trace[-4000:].rstrip(),
                              fix="fix the query code (it is only called, nothing is started)") from None
    if not (hasattr(writer, "start") and hasattr(writer, "trigger") and hasattr(writer, "format")):
        raise BadInputError(f"the query function returned {type(writer).__name__}, not an unstarted "
                            "DataStreamWriter", fix="return df.writeStream... without calling start()")
    return writer


# ---- the check ---------------------------------------------------------------------------------------

_READ = object()  # read the recorded profile beside the checkpoint


def check_compat(ckpt: Checkpoint, spark, build: Callable, *, old_sinks: Sequence[str] = (),
                 recorded: ProfileRecord | None | object = _READ, scratch_url: str | None = None,
                 storage_options: dict | None = None, reuse_judged: bool = False, writer=None,
                 as_of: int | None = None, cut_sinks: Sequence[str] = ()) -> CompatReport:
    """Judge the query ``build(spark)`` makes against ``ckpt`` (see module docstring). Reads only: the
    checkpoint is copied (its restart set) into ``scratch_url`` (default: a local temporary directory),
    and the copy is removed afterwards.

    ``old_sinks``: output directories of the file sinks the checkpoint's query wrote to (when no profile is
    recorded). ``reuse_judged``: skip Spark's restart when the recorded profile shows Spark already accepted
    a query with this plan fingerprint on this checkpoint (``ProfileRecord.proven``: the Dagster step, cheap
    when nothing changed); the checks Spark does not make always run. Unusable input (a damaged restart set,
    a fenced checkpoint, a query function that fails) raises ``BadInputError``.

    ``writer``: what ``build_writer(build, spark)`` returned, when the caller built it already (to start it
    afterwards). It is changed only when Spark's restart ran (``report.judge`` is not None: its sink was
    replaced by ``noop`` and it was started on the copy); otherwise it is as built, and may be started.

    ``as_of``: judge the query against the checkpoint as a rollback to that committed batch leaves it (before the
    rollback is applied: a query Spark refuses there is refused with nothing changed), with the file sinks in
    ``cut_sinks`` (URLs: the rollback's) taken to end at that batch too. Spark restarts a copy of the restart set
    of that batch.
    """
    # a new query: Spark creates the checkpoint at its first batch (a run stopped while Spark wrote its first
    # metadata left only that write's temp file, which Spark never reads: it starts afresh there too)
    if ckpt.listing.unreadable_dirs:
        rel, error = min(ckpt.listing.unreadable_dirs.items())
        raise BadInputError(f"{rel + '/' if rel else 'the checkpoint directory'} cannot be listed "
                            f"({error.strerror or error}): compat cannot judge what it holds", path=ckpt.url,
                            fix="make it readable by this user (or fix the storage permissions)")
    fresh = ckpt.listing.only_unfinished_writes()
    if not fresh and ckpt.kind != "structured":
        what = ("a legacy DStream checkpoint" if ckpt.kind == "dstream" else
                "not a Structured Streaming checkpoint (no metadata, offsets/ or commits/: an output directory, or "
                "another directory?)")
        raise BadInputError(f"{what}: compat judges Structured Streaming checkpoints", path=ckpt.url,
                            fix="point it at the query's checkpointLocation")
    if fresh:
        stopped = restore_stopped_at(ckpt.fm, ckpt.root)
        if stopped is not None:  # a restore into an empty location, stopped before (or while) it wrote metadata
            raise BadInputError(f"{stopped.what} stopped part-way at this location: a new query started here would "
                                "run where that operation puts (or removes) a checkpoint", path=ckpt.url,
                                fix=stopped.fix)
    blocked = ckpt.listing.blocks_new_query() if ckpt.fence is None else []
    if blocked:  # Spark starts it as a new query, and refuses to (a fenced one: refused below, naming resume)
        problem, fix = new_query_blocked(ckpt.listing, blocked)
        raise BadInputError(problem, path=ckpt.url, fix=fix)
    ckpt.refuse_misnamed([], "no query restarts here until it is put right")
    if as_of is not None:
        require_committed(ckpt, as_of)
    if writer is None:
        writer = build_writer(build, spark)
    if fresh:
        profile = describe_query(spark, writer)
        return CompatReport(ckpt.url, None, True, None, (), ("no checkpoint yet: Spark starts this query fresh",),
                            profile)
    profile = describe_query(spark, writer)
    # the query that wrote the last committed batch (after a rollback, not one that ran the batches it removed); as
    # of a batch, the one that wrote that batch (not one recorded after it, which ran batches the rollback removes)
    record = read_profile(ckpt.fm, ckpt.root, as_of=ckpt.latest_commit if as_of is None else as_of,
                          query_id=ckpt.query_id) if recorded is _READ else recorded
    notes: list[str] = []
    if profile.sources is None:
        notes.append("the query's sources and stateful operators could not be read (Spark Connect, or a plan this "
                     "release does not know): Spark's restart judges them alone")
    if profile.sink.kind == UNKNOWN:
        notes.append("the writer's sink and output mode could not be read: Spark's restart judges the query alone")
    require_unfenced(ckpt)
    batch = ckpt.latest_commit if as_of is None else as_of
    if batch is None:
        notes.append("nothing committed yet: Spark starts this query from its first batch")
        diffs = _uncommitted_sink_differences(spark, ckpt, profile, storage_options)
        return CompatReport(ckpt.url, None, not diffs, None, tuple(diffs), tuple(notes), profile, None, record)
    restart_files(ckpt, batch)  # damage is unusable input, before anything runs
    offsets = ckpt.offsets(batch)
    if as_of is not None:
        notes.append(f"judged as of batch {batch}, where the rollback leaves the checkpoint")
    elif ckpt.latest_offset is not None and ckpt.latest_offset > batch:
        notes.append(f"offsets/{ckpt.latest_offset} has no commit: a real restart first re-runs that batch; the "
                     f"judge restarts from the last committed batch {batch}")
    diffs: list[Difference] = []
    diffs += conf_differences(spark, offsets, batch)
    diffs += sink_differences(spark, profile, record, old_sinks, batch, storage_options, ckpt=ckpt,
                              cut_sinks=cut_sinks if as_of is not None else None)
    outcome = None
    if reuse_judged and record is not None and record.proven(profile.fingerprint, batch):
        notes.append(f"Spark already accepted this exact query (plan fingerprint {profile.fingerprint[:12]}, recorded "
                     f"{record.recorded_at}): not restarted again")
    else:
        outcome = _judge(ckpt, spark, writer, scratch_url, storage_options, batch)
    if outcome is not None and not outcome.restarted:
        diffs.append(spark_difference(outcome, ckpt, offsets, profile, record))
    else:
        diffs += source_differences(ckpt, offsets, profile, record, batch)
        diffs += operator_differences(profile, record, batch)
    diffs.sort(key=lambda d: (VERDICTS.index(d.verdict), _ASPECT_ORDER.index(d.aspect)))
    later = read_profile(ckpt.fm, ckpt.root, query_id=ckpt.query_id) if record is None and recorded is _READ \
        else None
    if later is not None:  # only records of batches after this one (a rollback below them): none of them wrote it
        notes.append(f"the query profiles recorded for this checkpoint are all of batches after batch {batch} (the "
                     f"newest recorded at batch {later.batch}; a rollback below them removed those batches), so "
                     "none is the query that wrote it: the sink, the output mode and source options of that query "
                     "are unknown (`compat --record` records the query that runs from here)")
    elif record is None:
        notes.append("no query profile recorded for this checkpoint: the sink, the output mode and source options "
                     "of the query that wrote it are unknown (`compat --record` or a Dagster run records them)")
    else:
        notes += _unrecorded(record.profile, profile)
    notes += _unreadable_udfs(profile)
    compatible = all(d.verdict == SAFE for d in diffs)
    restarts = outcome.restarted if outcome is not None else None
    return CompatReport(ckpt.url, batch, compatible, restarts, tuple(diffs), tuple(notes), profile, outcome, record,
                        as_of)


def accept(ckpt: Checkpoint, report: CompatReport) -> ProfileRecord | None:
    """Record the judged query as the checkpoint's accepted one (beside it), unless it fails at restart.
    It counts as judged when Spark restarted it now, or had already accepted this exact query."""
    return accept_at(ckpt.fm, ckpt.root, report)


def require_committed(ckpt: Checkpoint, as_of: int) -> None:
    """``as_of`` is a committed batch ``ckpt`` still holds, or BadInputError naming the last committed one."""
    if ckpt.latest_commit is None or as_of > ckpt.latest_commit or as_of < 0 or as_of not in ckpt.commit_files:
        raise BadInputError(f"batch {as_of} is not a committed batch of this checkpoint (last committed: "
                            f"{ckpt.latest_commit}): the query cannot be judged as of it", path=ckpt.url,
                            fix="name a committed batch (`checkpoint-ops inspect` lists them)")


def accept_at(fm: CheckpointFileManager, root: str, report: CompatReport) -> ProfileRecord | None:
    """``accept`` for the checkpoint at ``root``, without its model (nothing listed)."""
    if report.of(FAILS):
        return None
    judged = report.spark_restarts is True or (
        report.spark_restarts is None and report.recorded is not None
        and report.recorded.proven(report.query.fingerprint, report.batch))
    return record_profile(fm, root, report.query, judged, report.batch)


def _judge(ckpt: Checkpoint, spark, writer, scratch_url: str | None, storage_options: dict | None,
           batch: int) -> JudgeOutcome:
    base = scratch_url or tempfile.mkdtemp(prefix="checkpoint-ops-compat-")
    url = f"{base.rstrip('/')}/compat-{uuid.uuid4().hex[:12]}"
    try:
        copy = copy_for_restart(ckpt, url, storage_options, batch)
        return run_judge(spark, writer, copy.location, copy.batch + 1)
    finally:
        remove_scratch(url, storage_options)
        if scratch_url is None:
            remove_scratch(base, storage_options)


def remove_tree(url: str, storage_options: dict | None = None) -> None:
    """Delete a scratch tree (ours alone) and its directories."""
    fm, root = open_file_manager(url, storage_options)
    fm.delete_many([f.path for f in fm.walk(root)])
    fm.remove_empty_dirs(root)


def remove_scratch(url: str, storage_options: dict | None = None, warn: Callable[[str], None] | None = None) -> None:
    """``remove_tree`` on the way out of what used the scratch tree: a store that fails it leaves the tree (told
    through ``warn``), and never replaces that work's outcome or error."""
    try:
        remove_tree(url, storage_options)
    except Exception as e:  # noqa: BLE001 - only the store's failures; a bug is raised
        if not store_kept_failing(e):
            raise
        if warn is not None:
            warn(f"the scratch copy {url} could not be removed ({getattr(e, 'problem', None) or e}): delete it")


# ---- what Spark decided ------------------------------------------------------------------------------


def spark_difference(outcome: JudgeOutcome, ckpt: Checkpoint, offsets: OffsetSeq, profile: QueryProfile,
                     record: ProfileRecord | None) -> Difference:
    """Spark refused the restart: the difference it found, in the guide's terms."""
    cls = outcome.error_class or ""
    message = outcome.message or ""
    stored = [f"{op.op_id}: {op.name or '?'}" for op in ckpt.state.operators.values()]
    new_ops = None if profile.operators is None else [o.describe() for o in profile.operators]
    if cls.startswith("STATE_STORE_KEY_SCHEMA") or cls.startswith("STATE_STORE_VALUE_SCHEMA") \
            or cls == "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION":
        aspect, rule = "state-schema", RULES["stateful"]
        was, now = _schemas(message)
        was = was or _operators_text(record)
        now = now or (", ".join(new_ops) if new_ops else None)
    elif cls.startswith("STREAMING_STATEFUL_OPERATOR"):
        aspect, rule = "stateful-operators", RULES["stateful"]
        was = ", ".join(stored) or "no stateful operator (no state/ directory)"
        now = ", ".join(new_ops) if new_ops is not None else None
    elif cls.startswith("STATE_STORE") or cls.startswith("CANNOT_LOAD_STATE_STORE"):
        aspect, rule = "state", RULES["stateful"]
        was, now = ", ".join(stored) or None, ", ".join(new_ops) if new_ops else None
    elif "sources in the checkpoint offsets" in message or _source_kinds_differ(offsets, profile):
        aspect, rule = "sources", RULES["sources"]
        was = _offsets_sources_text(offsets)
        now = None if profile.sources is None else (
            f"{len(profile.sources)} source(s): " + ", ".join(s.describe() for s in profile.sources))
    else:
        aspect, rule, was, now = "query", RULES["query"], None, None
    thrown = outcome.error_class or outcome.exception or "an error"
    first = re.sub(r"^\[[A-Z0-9_.]+\]\s*", "", message).split("\n", 1)[0].strip()
    effect = f"Spark refuses to restart ({thrown}): {first}" if first else f"Spark refuses to restart ({thrown})"
    return Difference(aspect, FAILS, was, now, effect, rule, outcome.error_class, "spark")


def _schemas(message: str) -> tuple[str | None, str | None]:
    """(stored, new) schema from Spark's STATE_STORE_*_SCHEMA_NOT_COMPATIBLE message."""
    found = _SCHEMAS.search(message)
    if not found:
        return None, None
    which = found.group(1)
    return f"{which} schema {found.group(2)}", f"{which} schema {found.group(3)}"


def _operators_text(record: ProfileRecord | None) -> str | None:
    if record is None or record.profile.operators is None:
        return None
    return ", ".join(o.describe() for o in record.profile.operators) or "no stateful operator"


def _offsets_sources_text(offsets: OffsetSeq) -> str:
    kinds = ", ".join(f"{o.source_id}: {o.kind}" for o in offsets.offsets)
    return f"{len(offsets.offsets)} source(s) in offsets/{offsets.batch_id} ({kinds})"


def _expected_offset_kind(kind: str) -> set[str]:
    return {"file": {"file"}, "kafka": {"kafka"}}.get(kind, {"long", "other"})


def _source_kinds_differ(offsets: OffsetSeq, profile: QueryProfile) -> bool:
    if profile.sources is None or len(profile.sources) != len(offsets.offsets):
        return False
    return any(o.kind != "none" and o.kind not in _expected_offset_kind(s.kind)
               for o, s in zip(offsets.offsets, profile.sources))


# ---- what Spark does not check ----------------------------------------------------------------------


def conf_differences(spark, offsets: OffsetSeq, batch: int) -> list[Difference]:
    """Settings the offsets log pins whose session value differs: Spark applies the recorded value."""
    out = []
    for key, pinned in sorted(offsets.conf.items()):
        try:
            now = spark.conf.get(key)
        except Exception:  # not set and without a default: the session has no opinion
            continue
        if now is None or str(now).strip().lower() == str(pinned).strip().lower():
            continue
        effect = f"Spark applies {pinned} (recorded in offsets/{batch} at the query's first batch): the session's " \
                 f"{now} has no effect on this query"
        if key == "spark.sql.shuffle.partitions":
            effect += f"; the state stays in {pinned} partitions"
        elif key == "spark.sql.streaming.stateStore.providerClass":
            effect += f"; the state stays in {str(pinned).rsplit('.', 1)[-1]}"
        effect += " (to really change it, start a new checkpoint)"
        out.append(Difference("conf", SILENT, f"{key}={pinned}", f"{key}={now}", effect, RULES["conf"]))
    return out


def sink_differences(spark, profile: QueryProfile, record: ProfileRecord | None, old_sinks: Sequence[str],
                     batch: int, storage_options: dict | None, *, ckpt: Checkpoint | None = None,
                     cut_sinks: Sequence[str] | None = None) -> list[Difference]:
    """Output mode and sink: what the file sink's own log says, and what changed since the recorded query.
    ``ckpt``: the checkpoint (its planned batches and state format judge a sink log ahead of ``batch``).
    ``cut_sinks``: judged as of ``batch`` before a rollback to it (``check_compat``'s ``as_of``): the file sinks
    it rolls back to ``batch`` too (a sink log ahead of it is cut, and the checkpoint plans nothing beyond it)."""
    out = []
    sink, mode = profile.sink, profile.output_mode
    if sink.kind == UNKNOWN:
        return out
    old_sink = record.profile.sink if record is not None else (
        SinkProfile("file", "file", old_sinks[0]) if old_sinks else None)
    old_mode = record.profile.output_mode if record is not None else None
    stateful = bool(profile.operators) if profile.operators is not None else None
    if sink.kind == "file" and mode != "append":
        out.append(Difference("output-mode", FAILS, old_mode, mode,
                              f"start() refuses: the file sink ({sink.format}) supports only append mode",
                              RULES["output-mode"], "STREAMING_OUTPUT_MODE.UNSUPPORTED_DATASOURCE"))
    elif old_mode is not None and old_mode != mode:
        if stateful is False:
            out.append(Difference("output-mode", SAFE, old_mode, mode, "a query without stateful operators emits the "
                                  "same rows in append and update mode", RULES["output-mode"]))
        else:
            effect = _MODE_EFFECTS.get((old_mode, mode), "the sink receives different rows")
            out.append(Difference("output-mode", SILENT, old_mode, mode, f"Spark restarts, and from batch {batch + 1} "
                                  f"{effect}", RULES["output-mode"]))
    if sink.kind == "file" and sink.path:
        out += _file_sink_differences(spark, sink, old_sink, batch, storage_options, ckpt, cut_sinks)
        out += _partitioning_differences(sink, old_sink, batch)
    elif old_sink is not None and (old_sink.kind, old_sink.path) != (sink.kind, sink.path):
        was = old_sink.describe()
        if old_sink.kind == "file":
            effect = (f"allowed: the {sink.kind} sink receives batches from {batch + 1} on (at least once unless it "
                      f"deduplicates on the batch id); the file output at {old_sink.path} stops growing")
        else:
            effect = f"allowed: the {sink.kind} sink receives batches from {batch + 1} on"
        out.append(Difference("sink", SAFE, was, sink.describe(), effect, RULES["sink"]))
    return out


def _file_sink_differences(spark, sink: SinkProfile, old_sink: SinkProfile | None, batch: int,
                           storage_options: dict | None, ckpt: Checkpoint | None = None,
                           cut_sinks: Sequence[str] | None = None) -> list[Difference]:
    """A file sink continues only where its log (``<path>/_spark_metadata``) ends at the checkpoint's batch
    (``cut_sinks``: see ``sink_differences``)."""
    fm, root = open_file_manager(sink.path, storage_options)
    output = SinkOutput(fm, root, _sink_interval(spark), data=False)
    latest = output.log.latest
    if cut_sinks is not None:
        ckpt = None  # the rollback removes the batches planned beyond ``batch``
        if latest is not None and latest > batch and any(same_location(sink.path, url) for url in cut_sinks):
            latest = batch
    if latest == batch:
        return []
    was = old_sink.describe() if old_sink is not None else \
        "the sink this checkpoint's query wrote (unknown: no recorded profile; pass --sink)"
    now = sink.describe() + (f" (its log ends at batch {latest})" if latest is not None else " (no sink log there)")
    if ckpt is not None and latest is not None and latest == batch + 1 == ckpt.latest_offset:
        # stopped between the sink's commit of a planned batch and its commits/ file: Spark re-runs the batch and
        # the file sink skips it, as its rows are there (and its state: the tasks committed it before the sink);
        # only format V2's state commit fails on the skip
        ahead = sink_ahead_of_commits(ckpt, sink.path, latest)
        if ahead is not None:
            return [_ahead_difference(ahead, was, now)]
        if not planned_batch_logged_without_state(ckpt, latest):
            return []
        # the state of the planned batch is not there: not that stop, but a rollback without the sink that kept a
        # no-data batch planned (review G); the skipped batch would be committed without its state
    if latest is not None and latest > batch and cut_sinks is not None:  # as of a rollback that leaves it ahead
        return [Difference("sink", FAILS, was, now, f"the rollback to batch {batch} does not take this file sink with "
                           f"it, and its log holds batches {batch + 1}..{latest}: Spark re-runs them and its file sink "
                           "skips each without running it, so their rows never reach the output and a stateful "
                           "query commits them without their state (its next batch fails: CANNOT_LOAD_STATE_STORE)",
                           RULES["sink-rollback"], fix=f"roll the sink back with the checkpoint: declare it in the "
                           f"asset's sinks (Dagster), or pass --sink {sink.path} (the command line)")]
    if latest is not None and latest > batch:
        return [_sink_left_ahead(ckpt, sink, was, now, batch, latest)]
    interval = output.log.interval if latest is not None else _sink_interval(spark)
    first = batch + 1
    compaction = next(b for b in range(first, first + interval + 1) if is_compaction_batch(b, interval))
    missing = f"_spark_metadata/{(latest + 1) if latest is not None else 0}"
    fails = (f"the sink's first compaction at batch {compaction} needs the log files of the batches before it, "
             f"and {missing} is not there: Spark fails with BATCH_METADATA_NOT_FOUND")
    if compaction == first:
        return [Difference("sink", FAILS, was, now, f"Spark restarts and batch {first} fails: {fails}",
                           RULES["sink-path"], "BATCH_METADATA_NOT_FOUND")]
    return [Difference("sink", SILENT, was, now,
                       f"Spark restarts and writes batch {first} into a log that starts there: readers of "
                       f"{sink.path} fail ({missing} doesn't exist), and {fails} (compact interval {interval})",
                       RULES["sink-path"], "BATCH_METADATA_NOT_FOUND")]


def _sink_left_ahead(ckpt: Checkpoint | None, sink: SinkProfile, was: str, now: str, batch: int,
                     latest: int) -> Difference:
    """The file sink's log holds batches beyond the checkpoint's last commit (a rollback or a restore that did not
    take the sink with it): Spark's file sink skips each re-run batch id its log holds without running the batch.
    A stateful query then commits those batches without their state, so its next batch fails; the output of any
    query keeps only what the sink log lists. A rollback of the checkpoint to its own batch with the sink
    cuts the sink's log and files back to it."""
    held = f"batches {batch + 1}..{latest}" if latest > batch + 1 else f"batch {latest}"
    effect = (f"the sink log holds {held}, beyond the checkpoint's last committed batch {batch} (a rollback or a "
              f"restore that did not take the sink with it): Spark re-runs them and its file sink skips each batch id its "
              f"log holds without running it: the re-run's rows never reach the output, which keeps only what the "
              f"sink log already lists")
    verdict, error_class = SILENT, None
    stateful = ckpt is not None and bool(ckpt.state.stores())
    if stateful and ckpt.checkpoint_format_version == 2:
        verdict = FAILS
        effect += (f"; with RocksDB checkpoint format V2 the first batch it skips ({batch + 1}) commits no state and "
                   "stops the query: 'assertion failed: CheckpointInfo length: 0'")
    elif stateful and state_ends_at(ckpt, batch):
        verdict, error_class = FAILS, "CANNOT_LOAD_STATE_STORE"
        effect += (f"; the stateful query commits them without their state (its state ends at batch {batch}), so "
                   f"its first new batch fails: CANNOT_LOAD_STATE_STORE")
    where = shlex.quote(ckpt.url) if ckpt is not None else "CHECKPOINT"
    fix = (f"roll the sink back to the checkpoint's batch {batch}: `checkpoint-ops rollback {where} --to-batch "
           f"{batch} --sink {shlex.quote(sink.path)}` (Dagster: declare the sink in the asset's sinks and materialize "
           f"with run config rollback_to_batch: {batch})")
    return Difference("sink", verdict, was, now, effect, RULES["sink-rollback"], error_class, fix=fix,
                      rollback_to=batch)


def _uncommitted_sink_differences(spark, ckpt: Checkpoint, profile: QueryProfile,
                                  storage_options: dict | None) -> list[Difference]:
    """Nothing committed yet: only a file sink that logged the planned first batch on format V2 fails."""
    sink = profile.sink
    if sink.kind != "file" or not sink.path or ckpt.latest_offset is None:
        return []
    fm, root = open_file_manager(sink.path, storage_options)
    ahead = sink_ahead_of_commits(ckpt, sink.path, SinkOutput(fm, root, _sink_interval(spark), data=False).log.latest)
    return [] if ahead is None else [_ahead_difference(ahead, sink.describe(), sink.describe())]


def _ahead_difference(ahead: SinkAheadOfCommits, was: str, now: str) -> Difference:
    return Difference("sink", FAILS, was, now, f"{ahead.problem}; {ahead.fix}", RULES["sink-commit"], fix=ahead.fix,
                      rollback_to=ahead.last_committed)


def _partitioning_differences(sink: SinkProfile, old_sink: SinkProfile | None, batch: int) -> list[Difference]:
    """The same file sink written with other ``partitionBy`` columns: Spark's sink takes them as given (its log
    does not record them), and its readers infer partitions from the directories of the files the log lists."""
    if old_sink is None or old_sink.kind != "file" or old_sink.path != sink.path:
        return []
    before, after = old_sink.partition_by, sink.partition_by
    if before is None or after is None or before == after:
        return []  # unknown (a profile an earlier release recorded) is never a difference
    first, out = batch + 1, sink.path
    if before and after:
        effect = (f"Spark restarts and from batch {first} writes into {'/'.join(f'{c}=...' for c in after)} "
                  f"directories beside the {'/'.join(f'{c}=...' for c in before)} ones: readers of {out} then fail "
                  "(spark.read: [CONFLICTING_PARTITION_COLUMN_NAMES])")
        error_class = "CONFLICTING_PARTITION_COLUMN_NAMES"
    elif before:
        effect = (f"Spark restarts and from batch {first} writes its files at the top of {out}, beside the "
                  f"{before[0]}=... directories: readers of {out} see only the partitioned files, so no row from "
                  f"batch {first} on")
        error_class = None
    else:
        effect = (f"Spark restarts and from batch {first} writes into {after[0]}=... directories beside the files "
                  f"at the top of {out}: readers of {out} see only the partitioned files, so no row of batches up "
                  f"to {batch}")
        error_class = None
    fix = "keep the old partitionBy, or write the new partitioning to a new output directory (a new checkpoint)"
    return [Difference("sink", SILENT, _partition_text(before), _partition_text(after), f"{effect}; {fix}",
                       RULES["sink-partitioning"], error_class)]


def _partition_text(columns: tuple[str, ...]) -> str:
    return f"partitionBy({', '.join(columns)})" if columns else "no partitionBy"


def _unrecorded(old: QueryProfile, new: QueryProfile) -> list[str]:
    """What the recorded profile does not say (an earlier release recorded it): not compared, never a difference."""
    again = "record the accepted query again (`compat --record`, or a Dagster run) to have it compared"
    out = []
    if old.sink.kind == new.sink.kind == "file" and old.sink.path == new.sink.path \
            and old.sink.partition_by is None and new.sink.partition_by is not None:
        out.append(f"the file sink's partitionBy columns are unknown for the recorded query: a change is not checked "
                   f"(readers fail, or miss rows, when they change); {again}")
    if old.operators is not None and new.operators is not None and any(
            before.windows is None and after.windows for before, after in zip(old.operators, new.operators)):
        out.append(f"the time windows (durations) of the recorded query's aggregations are unknown: a change is not "
                   f"checked; {again}")
    if old.udfs is None and new.udfs and new.operators:
        out.append(f"the code of the recorded query's UDFs is unknown: a change in a UDF's body is not checked (the "
                   f"plan shows only its name and arguments); {again}")
    return out


def _unreadable_udfs(profile: QueryProfile) -> list[str]:
    """UDFs in the part of the plan the state is computed from whose code cannot be read (JVM UDFs)."""
    unread = [u for u in profile.udfs or () if u.state and u.code is None]
    if not unread or not profile.operators:
        return []
    names = ", ".join(sorted({f"{u.name} ({u.kind})" for u in unread}))
    return [f"the code of {names}, below a stateful operator, cannot be read: a change in its body is not checked "
            "(rows from the next batch on would be computed the new way beside state the old code computed); if "
            "its code changed since the last run, check the change by hand"]


def _sink_interval(spark) -> int:
    try:
        return int(spark.conf.get("spark.sql.streaming.fileSink.log.compactInterval"))
    except Exception:
        return SPARK_DEFAULT_COMPACT_INTERVAL


def source_differences(ckpt: Checkpoint, offsets: OffsetSeq, profile: QueryProfile, record: ProfileRecord | None,
                       batch: int) -> list[Difference]:
    """Sources Spark accepted (same number, offsets it can parse) but reads differently."""
    if profile.sources is None or len(profile.sources) != len(offsets.offsets):
        return []
    out = []
    for so, src in zip(offsets.offsets, profile.sources):
        if so.kind != "none" and so.kind not in _expected_offset_kind(src.kind):
            out.append(Difference("sources", SILENT, f"source {so.source_id}: {so.kind} offsets", src.describe(),
                                  f"Spark parses the old offsets as {src.format} offsets and goes on from them",
                                  RULES["sources"]))
            continue
        log_dir = ckpt.sources.get(so.source_id)
        if src.kind == "file" and src.path and log_dir is not None and log_dir.log is not None:
            old_dirs = _logged_dirs(log_dir.log)
            if old_dirs and not any(_under(d, src.path) for d in old_dirs):
                old = ", ".join(sorted(old_dirs)[:3])
                out.append(Difference(
                    "sources", SILENT, f"file source reading {old}", src.describe(),
                    f"Spark restarts, but sources/{so.source_id} lists the files read so far under {old}: every "
                    f"file under {src.path} counts as new and batch {batch + 1} reads them all, and files arriving "
                    f"under {old} are no longer read", RULES["source-options"]))
    if record is not None and record.profile.sources is not None:
        for old, new in zip(record.profile.sources, profile.sources):
            if (old.kind, old.path) != (new.kind, new.path) or old.options == new.options:
                continue
            before, after = old.option_map, new.option_map
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            limits = [k for k in changed if k in RATE_LIMIT_OPTIONS]
            others = [k for k in changed if k not in RATE_LIMIT_OPTIONS]
            if limits:
                out.append(Difference("source-options", SAFE, _options_text(limits, before),
                                      _options_text(limits, after),
                                      f"allowed: source {new.index} reads at the new rate from batch {batch + 1} on",
                                      RULES["source-options"]))
            if others:
                out.append(Difference("source-options", SILENT, _options_text(others, before),
                                      _options_text(others, after),
                                      f"Spark does not check source options: from batch {batch + 1} on source "
                                      f"{new.index} reads with the new ones", RULES["source-options"]))
    return out


def _options_text(keys: list[str], options: dict[str, str]) -> str:
    return ", ".join(f"{key}={options.get(key, '(unset)')}" for key in keys)


def _logged_dirs(log) -> set[str]:
    """Directories of the files the newest source-log file lists (as locations: scheme and path)."""
    latest = log.latest
    if latest is None:
        return set()
    entries = log.read([latest]).get(latest, [])
    out = set()
    for e in entries[-1000:]:
        loc = spark_url_to_location(e.path)
        out.add(f"{loc.scheme}://{loc.path.rsplit('/', 1)[0]}" if not loc.is_local else loc.path.rsplit("/", 1)[0])
    return out


def _under(logged_dir: str, new_path: str) -> bool:
    loc = parse_url(new_path)
    target = loc.path if loc.is_local else f"{loc.scheme}://{loc.path}"
    if any(ch in target for ch in "*?["):
        return fnmatch.fnmatch(logged_dir, target) or fnmatch.fnmatch(logged_dir, target.rstrip("/") + "/*")
    return logged_dir == target.rstrip("/") or logged_dir.startswith(target.rstrip("/") + "/")


def operator_differences(profile: QueryProfile, record: ProfileRecord | None, batch: int) -> list[Difference]:
    """Against the recorded query: operators Spark accepted (same state schema) that now compute otherwise,
    and a changed stateless part (projections, filters)."""
    if record is None:
        if not profile.operators:
            return []
        # Spark's restart judges the state schema only: what the old operators computed is known to nobody here
        return [Difference(
            "stateful-operators", CHECK, "unknown (no query profile recorded)",
            "; ".join(op.describe() for op in profile.operators),
            f"no query profile is recorded for the query that wrote batch {batch} of this checkpoint, so what its "
            "stateful operators computed is unknown; "
            "Spark's restart checks only the state's schema (keys and values), not a join's type, condition or "
            "time range, a watermark's delay or a grouping expression of the same type: if any of those changed, "
            f"the rows from batch {batch + 1} on come out differently, with no error. Compare them with the query "
            "that wrote the checkpoint by hand, or record that query first (`checkpoint-ops compat CKPT --query "
            "OLD --record`) and judge the new one against it", RULES["stateful"])]
    old = record.profile
    out = []
    if old.operators is not None and profile.operators is not None:
        for before, after in zip(old.operators, profile.operators):
            if before.same_as(after):
                continue
            if before.kind == after.kind == "join" and before.detail.split(" ", 1)[0] != after.detail.split(" ", 1)[0]:
                effect = (f"Spark accepts the join state (its schema does not record the join type) and from the next "
                          f"batch joins as {after.detail.split(' ', 1)[0]} instead of {before.detail.split(' ', 1)[0]}:"
                          " rows without a match are emitted (or dropped) differently")
            elif (before.kind, before.detail) == (after.kind, after.detail) and before.windows and after.windows:
                # the time windows alone changed
                effect = (f"Spark accepts the state (a window key is struct<start, end> whatever its durations) and "
                          f"from batch {batch + 1} puts new rows into {', '.join(after.windows)} windows, while the "
                          f"{', '.join(before.windows)} windows already in the state get no more rows and are still "
                          "emitted (in append mode when the watermark passes their end): the output mixes windows "
                          "of both lengths")
            else:
                effect = "Spark accepts the state (its schema is unchanged) but the operator now computes something " \
                         "else from it: the state built by the old operator is read as the new one's"
            out.append(Difference("stateful-operators", SILENT, before.describe(), after.describe(), effect,
                                  RULES["stateful"]))
    plan_changed = bool(old.plan_hash and profile.plan_hash and old.plan_hash != profile.plan_hash) \
        or same_udfs(old, profile) is False  # the plan prints a UDF by its name and arguments, not its code
    if not out and plan_changed and _same_operators(old.operators, profile.operators) \
            and old.sources == profile.sources:
        out.append(_plan_difference(old, profile, batch))
    return out


def same_udfs(old: QueryProfile, new: QueryProfile, state_only: bool = False) -> bool | None:
    """Whether both profiles call the same UDFs with the same code (``state_only``: in the part of the plan the
    state is computed from): False when a UDF's code (or the list of UDFs) differs, None when it cannot be shown
    (a profile an earlier release recorded, Spark Connect, a UDF whose code cannot be read: a JVM UDF)."""
    if old.udfs is None or new.udfs is None:
        return None
    before = [u for u in old.udfs if u.state or not state_only]
    after = [u for u in new.udfs if u.state or not state_only]
    if [(u.kind, u.name) for u in before] != [(u.kind, u.name) for u in after]:
        return False
    if any(b.code and a.code and b.code != a.code for b, a in zip(before, after)):
        return False
    return None if any(u.code is None for u in before + after) else True


def _changed_udfs(old: QueryProfile, new: QueryProfile) -> tuple[list[UdfProfile], list[UdfProfile]]:
    if old.udfs is None or new.udfs is None or len(old.udfs) != len(new.udfs):
        return [], []
    pairs = [(b, a) for b, a in zip(old.udfs, new.udfs) if b.code and a.code and b.code != a.code]
    return [b for b, _ in pairs], [a for _, a in pairs]


def _plan_difference(old: QueryProfile, new: QueryProfile, batch: int) -> Difference:
    """The plan changed, its sources and stateful operators did not: safe when the change is provably a
    projection or filter (no stateful operator, or the part the state is computed from is unchanged but for
    filters), else to check by hand."""
    was, now = f"plan {(old.plan_hash or '?')[:12]}", f"plan {(new.plan_hash or '?')[:12]}"
    before, after = _changed_udfs(old, new)
    if before:
        was += ", " + ", ".join(u.describe() for u in before)
        now += ", " + ", ".join(u.describe() for u in after)
    state_udfs = same_udfs(old, new, state_only=True)
    if new.operators == () or (old.state_hash is not None and old.state_hash == new.state_hash
                               and state_udfs is not False):
        return Difference("projection", SAFE, was, now, "allowed: the stateless part of the query (projections, "
                          "filters) changed; Spark accepts the checkpoint", RULES["projection"])
    if old.state_hash is not None and old.state_hash == new.state_hash:
        changed = ", ".join(u.describe() for u in after if u.state) or "a UDF"
        why = f"the code of {changed} changed below a stateful operator (the plan shows only its name and arguments)"
    elif old.state_hash is not None:
        why = "the plan changed below a stateful operator, and not only its filters"
    else:
        why = ("the plan changed, and the recorded profile (an earlier release's) does not say whether below a "
               "stateful operator")
    return Difference("projection", CHECK, was, now,
                      f"Spark accepts the state (its schema is unchanged), but {why}: if the change is in how a "
                      f"grouping key or an aggregated value is computed, rows from batch {batch + 1} on are "
                      "computed the new way and combined with state the old code computed (sums, counts and "
                      "groups mix both); checkpoint-ops cannot tell that from a harmless projection: check the "
                      "change by hand", RULES["projection"])


def _same_operators(before: tuple[OperatorProfile, ...] | None, after: tuple[OperatorProfile, ...] | None) -> bool:
    if before is None or after is None:
        return before is after
    return len(before) == len(after) and all(b.same_as(a) for b, a in zip(before, after))
