"""The rollback window: which batches the checkpoint (and its sinks) can still be rolled back to.

Rolling back to batch T means: after the rollback the last committed batch is T and Spark plans T+1
from ``offsets/T`` (reference §6.1). That is possible when T's restart set (``restart.py``: the files
Spark reads to restart after T) is all there and readable, from Spark's own files or, where Spark has
purged them, from the batch ledger. The window is the contiguous range of such batches ending at the
newest one; the reason names the file that stops it going further back (or that keeps the newest
committed batch out of reach).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model.checkpoint import Checkpoint
from .model.sink import SinkOutput
from .restart import Damage, RestartSets


@dataclass
class RollbackWindow:
    earliest: int | None
    latest: int | None
    reason: str | None = None  # why earliest - 1 (or anything) is out of reach
    latest_reason: str | None = None  # why batches above ``latest`` (committed ones) are out of reach
    stop: Damage | None = None  # the problem behind ``reason`` (None when the window ends at batch 0)

    def to_dict(self) -> dict:
        return {"earliest": self.earliest, "latest": self.latest, "earliest_reason": self.reason,
                "latest_reason": self.latest_reason}


def rollback_window(ckpt: Checkpoint, sinks: list[SinkOutput] = (), ledger=None,
                    sets: RestartSets | None = None) -> RollbackWindow:
    """The contiguous range of batches a rollback can reach, newest first until the first one that
    cannot be (each judged by its restart set, from the listing and the log files). With ``sets`` given,
    judged once for them: inspect and fsck in one pass share it."""
    if sets is not None and sets.window is not None:
        return sets.window
    window = _judge_window(ckpt, sinks, ledger, sets)
    if sets is not None:
        sets.window = window
    return window


def _judge_window(ckpt: Checkpoint, sinks, ledger, sets: RestartSets | None) -> RollbackWindow:
    last = ckpt.latest_commit
    if last is None:
        return RollbackWindow(None, None, "no batch has been committed yet")
    sets = sets or RestartSets(ckpt, sinks, ledger, deep=False)
    ckpt.load_offsets(errors=[])  # every retained file in one concurrent read; bad ones are judged below
    ckpt.load_commits(errors=[])
    known = set(ckpt.commit_files) | (set(ledger.batches("commits")) if ledger else set())
    # every batch id from the newest down, holes included: a missing commit stops the window there
    candidates = list(range(last, min(known) - 1, -1))
    earliest = latest = None
    reason = latest_reason = None
    stop = None
    for t in candidates:
        if t > last:
            continue
        rs = sets.of(t)
        if rs.damage:
            d = rs.damage[0]
            why = f"batch {t}: {d.text()}"
            if d.role == "metadata":  # no batch can be restarted
                return RollbackWindow(None, None, why, stop=d)
            if latest is None:
                latest_reason = latest_reason or why
                continue  # the newest batches are damaged: look for the newest reachable one
            reason, stop = why, d
            break
        if latest is None:
            latest = t
        earliest = t
    if earliest is None:
        return RollbackWindow(None, None, latest_reason, latest_reason)
    if reason is None:
        lowest = min(candidates)
        reason = (f"batch {lowest - 1}: commits/{lowest - 1} is gone (purged after minBatchesToRetain)"
                  if lowest > 0 else "batch 0 is the first batch")
    return RollbackWindow(earliest, latest, reason, latest_reason, stop)
