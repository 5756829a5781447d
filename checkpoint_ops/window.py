"""The rollback window: which batches the checkpoint (and its sinks) can still be rolled back to.

Rolling back to batch T means: after the rollback the last committed batch is T and Spark plans
T+1 from ``offsets/T`` (reference §6.1). That needs, for every component:

* ``commits/T``, ``offsets/T`` and ``offsets/T-1`` (Spark's restart reads both offsets files);
* state version T+1 loadable for every operator, partition and store;
* each file-source log reconstructible as of its log offset in ``offsets/T``;
* each sink log reconstructible as of batch T.

Where Spark's own files are not enough, a batch ledger may be (``ledger`` argument).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model.checkpoint import Checkpoint
from .model.compactible import CompactibleLog, is_compaction_batch, previous_compaction
from .model.logfile import LogFormatError
from .model.sink import SinkOutput


@dataclass
class RollbackWindow:
    earliest: int | None
    latest: int | None
    reason: str | None = None  # why earliest - 1 (or anything) is out of reach

    def to_dict(self) -> dict:
        return {"earliest": self.earliest, "latest": self.latest, "earliest_reason": self.reason}


def log_reachable(log: CompactibleLog, upto: int) -> str | None:
    """None if the log's state after ``upto`` can be (re)built from its own files, else why not.

    Needed: the compact file at the last compaction <= upto and plain files after it, each either
    on disk under the right name or rebuildable from a later compact (source logs only, whose
    entries carry ``batchId``).
    """
    needed = []
    c = previous_compaction(upto, log.interval)
    if c is not None:
        needed.append(c)
    needed += range((c + 1) if c is not None else 0, upto + 1)
    rebuild_from = [x for x in log.compact_ids if x >= (c if c is not None else 0)]
    for b in needed:
        f = log.files.get(b)
        if f is not None and f.compact == is_compaction_batch(b, log.interval):
            continue
        if log.kind == "source log" and any(x >= b for x in rebuild_from):
            continue  # FileEntry.batchId lets us rebuild it from a later compact file
        return f"{log.rel(b)} is gone" + (
            " and cannot be rebuilt (sink entries carry no batch id; a batch ledger would know)"
            if log.kind == "sink log"
            else " and no later compact file holds its entries"
        )
    return None


def check_target(
    ckpt: Checkpoint,
    target: int,
    sinks: list[SinkOutput] = (),
    ledger=None,
    exact: bool = False,
) -> list[str]:
    """Everything that prevents a rollback to ``target`` (empty list: reachable)."""
    problems: list[str] = []
    has = lambda kind, b: ledger is not None and ledger.has(kind, b)  # noqa: E731
    if target not in ckpt.commit_files and not has("commits", target):
        problems.append(f"commits/{target} is gone (batch {target} was purged, or never committed)")
    if target not in ckpt.offset_files and not has("offsets", target):
        problems.append(f"offsets/{target} is gone (purged after minBatchesToRetain)")
    if target > 0 and (target - 1) not in ckpt.offset_files and not has("offsets", target - 1):
        problems.append(f"offsets/{target - 1} is gone: Spark's restart needs offsets/{target - 1} and offsets/{target}")
    if problems:
        return problems
    offsets = ckpt.offsets(target) if target in ckpt.offset_files else ledger.offsets(target)
    st = ckpt.state
    commit = None
    if st.has_unique_ids:  # checkpoint format V2: the commit pins the state files' unique ids
        commit = ckpt.commit(target) if target in ckpt.commit_files else ledger.commit(target)
    for op in st.operators.values():
        names = op.store_names
        for (part, name), store in op.stores.items():
            uid = commit.unique_id(op.op_id, part, names.index(name)) if commit and commit.state_unique_ids else None
            if commit and commit.state_unique_ids and uid is None:
                problems.append(f"commits/{target} has no state unique id for {store.label}")
                continue
            ids_for = ckpt.unique_ids_for(op.op_id, part, names.index(name)) if uid else None
            b = st.check(store, target + 1, uid, ids_for, exact=exact)
            if not b.ok:
                problems.append(f"state version {target + 1} cannot be loaded: {b.reason}")
                if not exact:
                    break  # one state reason is enough for the window
        if problems:
            break

    for sid, src in ckpt.sources.items():
        if src.log is None:
            continue
        so = offsets.source(sid)
        k = so.log_offset if so else None
        if k is None:
            continue
        why = log_reachable(src.log, k)
        if why:
            problems.append(f"file-source log {src.rel_dir} as of log offset {k}: {why}")

    for sink in sinks:
        log = sink.log
        if log.latest is None or log.latest <= target:
            continue
        why = log_reachable(log, target)
        if why and not (ledger is not None and ledger.covers_sink(sink, target)):
            problems.append(f"sink log {sink.url}/_spark_metadata as of batch {target}: {why}")
    return problems


def rollback_window(ckpt: Checkpoint, sinks: list[SinkOutput] = (), ledger=None) -> RollbackWindow:
    """The contiguous range of batches, ending at the last commit, a rollback can reach."""
    latest = ckpt.latest_commit
    if latest is None:
        return RollbackWindow(None, None, "no batch has been committed yet")
    candidates = sorted(set(ckpt.commit_files) | (set(ledger.batches("commits")) if ledger else set()), reverse=True)
    earliest, reason = None, None
    try:
        ckpt.load_offsets()
        ckpt.load_commits()
    except LogFormatError as e:
        return RollbackWindow(None, None, f"unreadable log file: {e.path}: {e.problem}")
    for t in candidates:
        if t > latest:
            continue
        problems = check_target(ckpt, t, sinks, ledger)
        if problems:
            reason = f"batch {t}: {problems[0]}"
            break
        earliest = t
    if earliest is None:
        return RollbackWindow(None, None, reason)
    if reason is None:
        lowest = min(candidates)
        reason = (f"batch {lowest - 1}: commits/{lowest - 1} is gone (purged after minBatchesToRetain)"
                  if lowest > 0 else "batch 0 is the first batch")
    return RollbackWindow(earliest, latest, reason)
