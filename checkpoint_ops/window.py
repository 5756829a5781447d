"""The rollback window: which batches the checkpoint (and its sinks) can still be rolled back to.

Rolling back to batch T means: after the rollback the last committed batch is T and Spark plans T+1
from ``offsets/T`` (reference §6.1). That is possible when T's restart set (``restart.py``: the files
Spark reads to restart after T) is all there and readable, from Spark's own files or, where Spark has
purged them, from the batch ledger. The window is the contiguous range of such batches ending at the
newest one; the reason names the file that stops it going further back (or that keeps the newest
committed batch out of reach).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .errors import param
from .model.checkpoint import Checkpoint
from .model.compactible import all_valid_batches, infer_interval, previous_compaction
from .model.sink import SinkOutput
from .restart import MISSING, PURGED, Damage, RestartSets
from .window_memo import WindowMemo


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
    judged once for them: inspect and fsck in one pass share it (only for the sinks ``sets`` judges: fsck
    adds the outputs the ledger records, and with them the window is judged again)."""
    same = sets is not None and _same_sinks(sets.sinks, sinks)
    if same and sets.window is not None:
        return sets.window
    window = _judge_window(ckpt, sinks, ledger, sets)
    if same:
        sets.window = window
    return window


def _same_sinks(a, b) -> bool:
    return [id(s) for s in a] == [id(s) for s in b]


def _judge_window(ckpt: Checkpoint, sinks, ledger, sets: RestartSets | None) -> RollbackWindow:
    last = ckpt.latest_commit
    if last is None:
        return RollbackWindow(None, None, "no batch has been committed yet")
    if sets is not None and not _same_sinks(sets.sinks, sinks):
        # asked for other sinks than ``sets`` has (fsck adds the outputs the ledger records): their own sets
        sets = RestartSets(ckpt, sinks, ledger, deep=False, cache=sets.cache)
    sets = sets or RestartSets(ckpt, sinks, ledger, deep=False)
    # batches an earlier pass found sound on exactly these files are not judged again (with a cache only)
    memo = WindowMemo(ckpt, sinks, sets.cache) if sets.cache is not None else None
    known = set(ckpt.commit_files) | (set(ledger.batches("commits")) if ledger else set())
    # every batch id from the newest down, holes included: a missing commit stops the window there
    candidates = list(range(last, min(known) - 1, -1))
    # the files of the batches to judge, read ahead in concurrent batches (bad ones are judged below): not
    # those of batches the memo answers from the listing alone (the newest is always judged), nor far below
    # where the window stops
    if memo is not None:  # entries an earlier version wrote are checked by reading offsets/t: in one go
        ckpt.load_offsets(memo.without_log_offsets(candidates), errors=[])
    judge = candidates if memo is None else [t for t in candidates if t == last or not memo.answers(t)]
    ahead = _ReadAhead(ckpt, judge)
    earliest = latest = None
    reason = latest_reason = None
    stop = None
    judged = False
    interval_kept = _IntervalKept(sinks, ledger)
    for t in candidates:
        if t > last:
            continue
        # (only once a batch was judged: the newest, never remembered, judges ``metadata`` for all)
        if memo is not None and judged and memo.is_sound(t):
            damage = interval_kept.lost_at(t)
        else:
            ahead.before(t)
            rs = sets.of(t)
            judged = True
            if memo is not None:
                memo.remember(t, rs)
            # damage first (it names what is wrong); then what the rollback refuses for a sink log's interval
            damage = rs.damage[0] if rs.damage else interval_kept.lost_at(t)
        if damage is not None:
            d = damage
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


class _IntervalKept:
    """Whether a rollback to a batch keeps each file sink log's compact interval (``Rollback._check_readable``).
    A rollback removes the compact files after its target. Where Spark's cleanup left only one at or below it,
    Spark derives the interval from that one file, and it may be another than the one the log was written with
    (``5.compact`` alone gives 6 with interval 3): the rollback then writes the compact file before it from the
    batch ledger, or refuses. Judged from the listing alone (and the ledger where it could rebuild one)."""

    def __init__(self, sinks, ledger):
        self.sinks, self.ledger = list(sinks), ledger
        self._compacts = [sorted(s.log.compact_ids) for s in self.sinks]  # each judged by bisection: O(log) a batch
        self._rebuildable: dict[tuple[int, int], bool] = {}

    def lost_at(self, t: int) -> Damage | None:
        for i, sink in enumerate(self.sinks):
            log, ids = sink.log, self._compacts[i]
            if not ids or ids[-1] <= t:
                continue  # no compact file removed: the interval Spark derives stays as it is
            below = bisect.bisect_right(ids, t)
            kept = set(ids[max(0, below - 2):below])  # Spark derives the interval from the two latest left
            newest = previous_compaction(t, log.interval)  # the one a reader of t needs (rebuilt if gone)
            if newest is not None:
                kept.add(newest)
            interval, how = infer_interval(sorted(kept)[-2:], log.default_interval)
            if interval == log.interval:
                continue
            if not kept:  # none left at or below t: Spark reads the log with the configured interval
                lost = self._unreadable_with(i, sink, t, interval, how)
                if lost is not None:
                    return lost
                continue
            last = max(kept)
            earlier = last - log.interval
            if earlier < 0:  # the first compact file: only the configured interval derives the log's own
                rel = log.rel(last)
                return Damage(f"sink{i}", rel, log.listing.url(rel), "sink log", PURGED, "purged",
                              f"a rollback to batch {t} would leave {rel} as the only compact file of {log.rel_dir}, "
                              f"and Spark would derive compact interval {interval} from it ({how}), not "
                              f"{log.interval}, the interval the log was written with", _interval_fix())
            if self._can_rebuild(i, sink, earlier):
                continue
            rel = log.rel(earlier, log.interval)
            return Damage(f"sink{i}", rel, log.listing.url(rel), "sink log", PURGED, "purged",
                          f"a rollback to batch {t} would leave {log.rel(last)} as the only compact file of "
                          f"{log.rel_dir}, and Spark would derive compact interval {interval} from it ({how}), not "
                          f"{log.interval}, the interval the log was written with; {rel}, which would keep it, is gone "
                          "and cannot be rebuilt (sink entries carry no batch id; a batch ledger would know)",
                          "choose a later batch; a batch ledger kept from now on (`checkpoint-ops ledger sync "
                          "--sink`, or the Dagster asset) lets later rollbacks rebuild it")
        return None

    def _unreadable_with(self, i: int, sink, t: int, interval: int, how: str) -> Damage | None:
        """With no compact file left at or below ``t``, the rollback reads the log with ``interval`` (the configured
        one) and refuses when a file a reader of ``t`` needs is not there under that name (``_check_readable``)."""
        log = sink.log
        rebuilt = {log.rel(b) for b in log.missing_for(t)}  # the rollback writes them (the restart set judged them)
        for b in all_valid_batches(t, interval):
            rel = log.rel(b, interval)
            if rel not in rebuilt and (b not in log.files or log.files[b].rel != rel):
                return Damage(f"sink{i}", rel, log.listing.url(rel), "sink log", MISSING, "sink-log-gap",
                              f"after a rollback to batch {t} Spark would read {log.rel_dir} with compact interval "
                              f"{interval} ({how}) and miss {rel}; the log was written with {log.interval}",
                              _interval_fix())
        return None

    def _can_rebuild(self, i: int, sink, earlier: int) -> bool:
        """Whether the batch ledger can write ``earlier``'s compact file as a rollback does
        (``Ledger.sink_log_files_at``): it recorded the entries of every batch after it up to the next compact file
        on disk. Asked without parsing them: this runs in every Dagster materialization's pass."""
        key = (i, earlier)
        if key not in self._rebuildable:
            log, ids = sink.log, self._compacts[i]
            after = bisect.bisect_right(ids, earlier)
            base = ids[after] if after < len(ids) else log.latest
            self._rebuildable[key] = (
                self.ledger is not None and base is not None and not log.missing_for(base)
                and all(self.ledger.has_sink_entries(sink, b) for b in range(earlier + 1, base + 1)))
        return self._rebuildable[key]


def _interval_fix() -> str:
    return (f"pass the compactInterval the query runs with ({param('sink_compact_interval') or 'its Spark settings'}):"
            " Spark derives the interval from it when one compact file is left, or none")


class _ReadAhead:
    """Reads the offsets and commits files of the batches the window will judge (``batches``, newest first)
    a run at a time, each run in one concurrent read (object stores), the runs doubling from 16 to 256: a
    window that stops early reads little past its stop, a long one in few round trips. ``before`` is asked
    in the window's order (newest first), so a cursor finds each batch: no map of a window that reaches
    back through a ledger of 100,000s of batches."""

    def __init__(self, ckpt: Checkpoint, batches: list[int]):
        self.ckpt, self.batches = ckpt, batches
        self.cursor = 0  # batches[cursor] is the next batch at or below the last one asked for
        self.read_to = 0  # batches[:read_to] are read
        self.run = 16

    def before(self, batch: int) -> None:
        batches, i = self.batches, self.cursor
        while i < len(batches) and batches[i] > batch:
            i += 1
        self.cursor = i
        if i >= len(batches) or batches[i] != batch or i < self.read_to:
            return
        chunk = batches[i:i + self.run]
        self.read_to = i + len(chunk)
        self.run = min(self.run * 2, 256)
        self.ckpt.load_offsets(sorted({b for t in chunk for b in (t - 1, t)}), errors=[])
        self.ckpt.load_commits(sorted(chunk), errors=[])
