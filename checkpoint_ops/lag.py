"""A file sink behind its checkpoint: committed batches whose sink log entry is missing.

Spark writes ``_spark_metadata/N`` before ``commits/N`` (reference §7), and a file sink logs every batch
it runs, even one that wrote no rows. So a batch that is committed (in ``commits/``, or in the batch
ledger's records) but has no sink log file lost its rows for every reader of the sink, and the query will
not write them again: it only runs batches after its last commit. Two shapes:

* the sink log ends below the last commit (``_spark_metadata/21`` missing, ``commits/21`` present);
* a gap: a batch after the latest compact file has no log file at all (its entries were merged
  nowhere; before the latest compact file Spark deletes plain files itself, so absence means nothing).

What restores the rows is a rollback to the last batch before the first missing one (the sink log is
intact up to there) and reprocessing. Deleting the batch's data files (which the sink log no longer
lists, so they look like orphans) would make the loss permanent: nothing here, in ``fsck`` or in ``sink
orphans`` ever suggests it.

The other way round, ``SinkAheadOfCommits``: the sink logged the batch the checkpoint planned last and did not
commit (a stop between the two writes). That is harmless except on RocksDB checkpoint format V2, where Spark 4.3
cannot restart from it; a rollback to the last commit with the sink lets it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .ledger import Ledger
from .model.checkpoint import Checkpoint
from .model.sink import SinkOutput


@dataclass(frozen=True)
class SinkLag:
    """How a sink log compares with the batches its checkpoint committed."""

    sink: str
    checkpoint: str | None  # the checkpoint compared with (None: only a ledger)
    last_logged: int | None  # the sink log's latest batch
    last_committed: int | None  # the latest commit of the checkpoint or its ledger
    committed_by: str  # what says so: "commits/21", "the batch ledger", ...
    missing: tuple[int, ...]  # committed batches with no sink log entry, ascending
    missing_rels: tuple[str, ...]  # the log files they would be, as Spark names them

    @property
    def behind(self) -> bool:
        return bool(self.missing)

    @property
    def rollback_target(self) -> int | None:
        """The batch to roll back to (checkpoint and sink) so reprocessing rewrites every missing batch."""
        return self.missing[0] - 1 if self.missing and self.missing[0] > 0 else None

    def describe(self) -> str:
        return f"batch{'es' if len(self.missing) > 1 else ''} {_span(self.missing)}"

    def to_dict(self) -> dict:
        return {"sink": self.sink, "checkpoint": self.checkpoint, "last_logged": self.last_logged, "last_committed": self.last_committed,
                "committed_by": self.committed_by, "missing": list(self.missing), "behind": self.behind,
                "rollback_target": self.rollback_target}


def _span(batches: tuple[int, ...]) -> str:
    if len(batches) > 1 and batches[-1] - batches[0] == len(batches) - 1:
        return f"{batches[0]}..{batches[-1]}"
    return ", ".join(map(str, batches))


def sink_lag(ckpt: Checkpoint | None, sink: SinkOutput, ledger: Ledger | None = None) -> SinkLag:
    """Committed batches the sink log has no entry for. Commits come from the checkpoint and from the
    ledger (its commits, and the batches it recorded this sink's entries for); either may be None."""
    log = sink.log
    committed: list[tuple[int, str]] = []
    if ckpt is not None and ckpt.latest_commit is not None:
        committed.append((ckpt.latest_commit, f"commits/{ckpt.latest_commit} is in the checkpoint"))
    if ledger is not None:
        recorded = [b for b in ledger.records if ledger.has("commits", b) or ledger.has_sink_entries(sink, b)]
        if recorded:
            committed.append((max(recorded), f"the batch ledger recorded batch {max(recorded)}"))
    url = ckpt.url if ckpt is not None else None
    if not committed:
        return SinkLag(sink.url, url, log.latest, None, "", (), ())
    top, by = max(committed)
    s = log.latest if log.latest is not None else -1
    upto = min(s, top)
    floor = max((c for c in log.compact_ids if c <= upto), default=-1)
    missing = [b for b in range(floor + 1, upto + 1) if b not in log.files]
    missing += range(s + 1, top + 1)
    return SinkLag(sink.url, url, log.latest, top, by, tuple(missing), tuple(log.rel(b) for b in missing))


@dataclass(frozen=True)
class SinkAheadOfCommits:
    """A file sink that logged the batch its checkpoint planned last (``offsets/N``) and did not commit, the batch
    after the last commit, on RocksDB checkpoint format V2: the query stopped between the sink's commit of the
    batch and its ``commits/N`` file (Spark writes them in that order, reference section 7).

    Spark restarts by re-running the batch; the file sink skips it (its log has it), so no task runs and
    reports the state stores' checkpoint ids, and Spark 4.3's commit of that batch fails (``assertion failed:
    CheckpointInfo length: 0``), on every restart. The HDFS store and format V1 restart from the same state
    (the skip is right: the batch's rows are in the sink). A rollback to the last commit with the sink
    removes the batch's sink log entry and files, and the run writes them again.
    """

    checkpoint: str
    sink: str
    last_committed: int | None  # None: batch 0, nothing committed
    batch: int  # the planned, logged, uncommitted batch

    @property
    def problem(self) -> str:
        return (f"the sink log holds batch {self.batch}, which the checkpoint planned but never committed (the query "
                f"stopped between the file sink's commit and commits/{self.batch}): Spark re-runs it, the file sink "
                "skips it, and with RocksDB checkpoint format V2 Spark (4.3) then fails every restart with "
                "'assertion failed: CheckpointInfo length: 0'")

    @property
    def fix(self) -> str:
        if self.last_committed is None:
            return ("no batch was committed, so no rollback applies: restore the checkpoint and its sink from a "
                    "backup, or move both aside and start the query afresh (a source that starts at its latest "
                    "offsets, such as Kafka with startingOffsets=latest, then skips what batch 0 read)")
        return (f"roll back to the last committed batch with the sink, then run the query (it writes batch "
                f"{self.batch} again): `checkpoint-ops rollback {shlex.quote(self.checkpoint)} --to-batch "
                f"{self.last_committed} --sink {shlex.quote(self.sink)}`")


def sink_ahead_of_commits(ckpt: Checkpoint, sink_url: str, last_logged: int | None) -> SinkAheadOfCommits | None:
    """The state above: ``last_logged`` (the sink log's latest batch) is the checkpoint's last planned batch, the
    one after its last commit (or batch 0 with none), that commit parses, and the state is on format V2; else None
    (other shapes are other findings: commits behind, a sink ahead of the offsets, a damaged commit)."""
    planned, committed = ckpt.latest_offset, ckpt.latest_commit
    if last_logged is None or planned is None or last_logged != planned:
        return None
    if (planned - 1 if planned > 0 else None) != committed:
        return None
    if committed is not None and committed not in ckpt.load_commits([committed], errors=[]):
        return None  # a damaged commit: its own finding says what to roll back to
    if ckpt.checkpoint_format_version != 2:
        return None
    return SinkAheadOfCommits(ckpt.url, sink_url, committed, last_logged)


def state_ends_at(ckpt: Checkpoint, batch: int) -> bool:
    """No store of the checkpoint's state holds a version beyond the one ``batch`` committed (``batch + 1``): a
    batch after it that Spark's file sink skips (its log holds it) is committed without its state, and the next
    batch fails to load it (CANNOT_LOAD_STATE_STORE). A query stopped between the sink's commit of batch N+1 and
    ``commits/N+1`` has version N+2 (the tasks commit the state before the sink commits), and a hand-made rollback
    that kept the later versions lets Spark load them (the output then silently lacks rows, as
    ``test_naive_rollback_loses_data`` shows). True for a checkpoint without state."""
    return all((store.versions or [0])[-1] <= batch + 1 for store in ckpt.state.stores())


def planned_batch_logged_without_state(ckpt: Checkpoint, last_logged: int | None) -> bool:
    """The sink log's latest batch ``last_logged`` is the checkpoint's planned, uncommitted batch after a commit, the
    query has state, and no store holds the version that batch writes (format V2 is ``sink_ahead_of_commits``): not a
    query stopped between the sink's commit and ``commits/`` (its tasks committed the state first, and the sink's skip
    is right), but a rollback without the sink that kept a no-data batch planned. Spark's file sink skips the batch,
    Spark commits it without its state, and the next batch fails (CANNOT_LOAD_STATE_STORE)."""
    committed = ckpt.latest_commit
    if committed is None or last_logged is None or ckpt.latest_offset != last_logged or last_logged != committed + 1:
        return False
    if ckpt.checkpoint_format_version == 2 or not ckpt.state.stores():
        return False
    return state_ends_at(ckpt, committed)

