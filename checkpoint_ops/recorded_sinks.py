"""The file sinks a checkpoint's records say its query writes, and what an operation or a check of the
checkpoint alone does about them.

Nothing in a checkpoint names the output its file sink writes. A rollback of the checkpoint alone leaves
the sink log with batches above the target, and Spark's file sink skips every batch id its log already
has (reference §4.3): the re-run batches' rows are silently dropped. Once a pairing is recorded in the
checkpoint's batch ledger (``ledger sync --sink``, ``backup create``, ``backup restore``, a rollback with
``--sink``; see ``pairing.py``), the checkpoint does name its outputs, so:

* a **rollback** that is not given one of them is refused (``RecordedSinksLeftOut``, exit 1, nothing
  changed), naming each, unless the caller says the output was abandoned on purpose
  (``--without-recorded-sinks``; the plan then warns). A recorded output with no sink log at its
  location any more is no danger (a restart starts a new log there) and is a plan warning;
* **fsck** of the checkpoint judges every recorded output it was not given exactly as if it had been
  given with ``--sink`` (``sink-ahead`` names it); one with no sink log any more is a warning
  (``recorded-sink-missing``), and so is one that cannot be read (``recorded-sink-unreadable``).

Only the ledger's pairing records count (a directory of a few small files, read without the segments).
A record of another checkpoint (a ledger copied along) or of an earlier query at this location says
nothing here, as in ``pairing.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import BadInputError, RefusedError, param
from .ledger import Ledger
from .model.checkpoint import Checkpoint
from .model.compactible import SPARK_DEFAULT_COMPACT_INTERVAL
from .model.sink import SINK_LOG_DIR, SinkOutput
from .pairing import query_id_of, same_location
from .storage import open_file_manager


@dataclass(frozen=True)
class RecordedSink:
    """An output a pairing record in the checkpoint's ledger names."""

    url: str  # as recorded
    recorded_by: str  # what recorded it, and when (the newest record naming it)

    def to_dict(self) -> dict:
        return {"url": self.url, "recorded_by": self.recorded_by}


@dataclass(frozen=True)
class LeftOut:
    """A recorded output a command on the checkpoint was not given, as found at its location now."""

    recorded: RecordedSink
    output: SinkOutput | None  # its sink output when a sink log is there, else None
    gone: str | None = None  # why there is no sink log to judge (nothing there, no _spark_metadata/)
    unreadable: str | None = None  # the error met reading it

    @property
    def url(self) -> str:
        return self.recorded.url

    @property
    def latest_batch(self) -> int | None:
        return self.output.log.latest if self.output is not None else None

    def to_dict(self) -> dict:
        return {**self.recorded.to_dict(), "latest_batch": self.latest_batch, "gone": self.gone,
                "unreadable": self.unreadable}


def recorded_sinks(ckpt: Checkpoint, ledger: Ledger | None) -> list[RecordedSink]:
    """The outputs the ledger's pairing records name for this checkpoint (this location, this query id),
    each once, in the order first recorded. Reads only ``ledger/pairing/`` unless the ledger is loaded."""
    if ledger is None:
        return []
    qid = query_id_of(ckpt)
    found: dict[str, RecordedSink] = {}
    for rec in ledger.pairing_records():
        if not same_location(rec.checkpoint, ckpt.url) or (rec.query_id and qid and rec.query_id != qid):
            continue
        for url in rec.sinks:
            key = next((k for k in found if same_location(k, url)), url)
            found[key] = RecordedSink(found[key].url if key in found else url,
                                      f"{rec.by or 'a pairing record'} at {rec.recorded_at}")
    return list(found.values())


def left_out(ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None, *,
             storage_options: dict | None = None, compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL,
             data: bool = False) -> list[LeftOut]:
    """The recorded outputs not among ``sinks``, each opened (``data``: with its data files listed, as
    ``--sink`` opens one; else only its log). Read-only; a store that keeps failing is raised as is."""
    out = []
    for rec in recorded_sinks(ckpt, ledger):
        if any(same_location(s.url, rec.url) for s in sinks):
            continue
        try:
            fm, root = open_file_manager(rec.url, storage_options)
            sink = SinkOutput(fm, root, compact_interval, data=data)
            if sink.log.files:
                out.append(LeftOut(rec, sink))
                continue
            there = fm.info(root) is not None if fm.strategy != "direct-put" else bool(fm.list(root))
            out.append(LeftOut(rec, None, gone=(f"no sink log ({SINK_LOG_DIR}/) there any more" if there else
                                                 "nothing there any more")))
        except (OSError, BadInputError) as e:
            out.append(LeftOut(rec, None, unreadable=str(e).splitlines()[0]))
    return out


class RecordedSinksLeftOut(RefusedError):
    """A rollback of a checkpoint without an output its ledger records: exit 1, nothing changed."""

    def __init__(self, ckpt: Checkpoint, target: int, missing: list[LeftOut], given: list[str] = ()):
        self.missing = missing
        first = missing[0]
        names = ", ".join(m.url for m in missing)
        latest = first.latest_batch
        if first.unreadable is not None:
            effect = f"it cannot be read to check it ({first.unreadable})"
        elif latest is not None and latest > target:
            effect = (f"its sink log has batches up to {latest}: rolled back without it, the query would re-run "
                      f"batches {target + 1}..{latest} and Spark's file sink would skip them (it skips batch ids its "
                      "log has), silently dropping their rows")
        else:
            effect = (f"its sink log ends at batch {latest}; a checkpoint and its file sink are rolled back "
                      "together, or the next rollback leaves them out of step")
        them = "them" if len(missing) > 1 else "it"
        opt_out = param("without_recorded_sinks")
        if param("sink") is not None:
            fix = (f"roll the sink back with the checkpoint: `checkpoint-ops rollback {ckpt.url} --to-batch {target} "
                   + " ".join(f"--sink {url}" for url in [*given, *(m.url for m in missing)]) + "`")
        else:
            fix = f"if the query still writes {names}, make {them} one of its file sinks"
        if opt_out:
            fix += f"; if the query no longer writes {them} (an output abandoned on purpose), add {opt_out}"
        else:
            fix += (f"; if the query no longer writes {them} (an output abandoned on purpose), roll back from the "
                    f"command line: `checkpoint-ops rollback {ckpt.url} --to-batch {target} --without-recorded-sinks` "
                    "(with the --sink outputs it does write)")
        super().__init__(
            f"the batch ledger records that this checkpoint's query writes the file sink {names} "
            f"(recorded by {first.recorded.recorded_by}), and it is not part of this rollback: {effect}",
            path=ckpt.url, fix=fix)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "recorded_sinks": [m.to_dict() for m in self.missing]}


@dataclass(frozen=True)
class RecordedSinksCheck:
    """How a rollback treats recorded outputs it was not given (``plan_rollback``'s ``recorded_sinks``)."""

    storage_options: dict | None = None
    compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL
    without_recorded_sinks: bool = False  # the caller says the outputs left out were abandoned on purpose

    def check(self, ckpt: Checkpoint, sinks: list[SinkOutput], ledger: Ledger | None, target: int) -> list[str]:
        """Refuse (``RecordedSinksLeftOut``) a rollback to ``target`` without a recorded output that still has
        a sink log (or cannot be read), unless ``without_recorded_sinks``; returns the plan's warnings."""
        missing = left_out(ckpt, sinks, ledger, storage_options=self.storage_options,
                           compact_interval=self.compact_interval)
        live = [m for m in missing if m.gone is None]
        if live and not self.without_recorded_sinks:
            raise RecordedSinksLeftOut(ckpt, target, live, [s.url for s in sinks])
        warnings = [] if sinks or missing else _no_sink_given(ckpt, target)
        for m in missing:
            if m.gone is not None:
                warnings.append(f"the batch ledger records that this query writes {m.url} (recorded by "
                                f"{m.recorded.recorded_by}), but {m.gone}: nothing there to roll back")
            else:
                latest = m.latest_batch
                skipped = (f": its sink log has batches up to {latest}, so Spark's file sink will skip re-run "
                           f"batches {target + 1}..{latest} if the query writes there again"
                           if latest is not None and latest > target else "")
                warnings.append(f"{m.url}, which the batch ledger records as this query's output, is left as it "
                                f"is ({param('without_recorded_sinks') or 'abandoned on purpose'}){skipped}")
        return warnings


def _recorded_sink(ckpt: Checkpoint):
    """The sink of the query profile recorded beside the checkpoint, or None (none recorded, or damaged: no hint;
    an outage is raised)."""
    from .query_profile import read_profile

    try:
        record = read_profile(ckpt.fm, ckpt.root)
    except (OSError, ValueError, KeyError, TypeError, BadInputError):
        return None
    return record.profile.sink if record is not None else None


def recorded_sink_left_ahead(ckpt: Checkpoint, sinks: list[str], target: int, *, storage_options: dict | None = None,
                             compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL) -> tuple[str, int] | None:
    """The file sink the recorded query profile says the checkpoint's query writes, when a rollback to ``target``
    with ``sinks`` (URLs) leaves its log ahead of ``target``: (its path, its log's newest batch); else None (none
    recorded, another kind of sink, among ``sinks``, no log there, or not ahead). Spark's file sink then skips the
    re-run batches without running them. Read-only."""
    sink = _recorded_sink(ckpt)
    if sink is None or sink.kind != "file" or not sink.path or any(same_location(sink.path, url) for url in sinks):
        return None
    fm, root = open_file_manager(sink.path, storage_options)
    latest = SinkOutput(fm, root, compact_interval, data=False).log.latest  # None: no sink log there
    return (sink.path, latest) if latest is not None and latest > target else None


def _which_sink(sink) -> str:
    """What to pass for the file sink the recorded query profile knows (``sink``, None if none is recorded)."""
    sink_opt = param("sink") or "the sink"
    return (f"the query's recorded profile says it writes a file sink at {sink.path}: pass {sink_opt} {sink.path}"
            if sink is not None and sink.kind == "file" and sink.path else
            f"if the query writes a file sink, pass its output directory ({sink_opt} OUTPUT_PATH)")


def backup_without_sink(ckpt: Checkpoint, sinks: list, ledger: Ledger | None) -> list[str]:
    """A backup with no sink, of a checkpoint whose ledger records none: if its query writes a file sink, the
    backup holds the checkpoint alone, and a restore of it runs the query on without the output of every batch
    before the cut (a hostile review: a rollback warned of this, a backup said nothing). Silent when the recorded
    query profile shows another kind of sink."""
    if sinks or ckpt.latest_commit is None or recorded_sinks(ckpt, ledger):
        return []
    sink = _recorded_sink(ckpt)
    if sink is not None and sink.kind not in ("file", "unknown"):
        return []
    return [f"no file sink given, and the batch ledger records none for this checkpoint: {_which_sink(sink)}. "
            "Without it, this backup holds the checkpoint alone: a restore of it runs the query on from batch "
            f"{ckpt.latest_commit + 1} into an output without the rows of the batches up to {ckpt.latest_commit}"]


def _no_sink_given(ckpt: Checkpoint, target: int) -> list[str]:
    """A rollback with no sink, of a checkpoint whose ledger records none: nothing says whether its query writes a
    file sink. If it does, the output's log keeps the batches after the target, and Spark's file sink skips them
    when they run again: the rows of the reprocessed batches never reach it. Say so, naming the sink the recorded
    query profile knows (``compat --record`` or a Dagster run writes it); silent when that profile shows another
    kind of sink."""
    sink = _recorded_sink(ckpt)
    latest = ckpt.latest_commit
    again = f"batches {target + 1}..{latest}" if latest is not None and latest > target else None
    redelivered = (f"{again} run again and hand their rows to it a second time: foreachBatch gets the same batch ids, "
                   "Kafka and other sinks get duplicates unless their writes are idempotent per batch id (or what those "
                   "batches wrote is removed from it first)") if again else None
    if sink is not None and sink.kind not in ("file", "unknown"):
        return [f"the query's recorded profile says it writes a {sink.kind} sink, which a rollback does not change: "
                f"{redelivered}"] if redelivered else []
    where = _which_sink(sink)
    other = (f"; if it writes another sink (foreachBatch, Kafka), a rollback does not change it: {redelivered}"
             if redelivered and (sink is None or sink.kind == "unknown") else "")
    return [f"no file sink given, and the batch ledger records none for this checkpoint: {where}. Without it, the "
            f"output keeps its sink log of batches after {target}, and Spark's file sink skips those batch ids when "
            f"they run again, so their new rows never reach it{other}"]
