"""Queries that run elsewhere: a sensor that reads their checkpoints and reports progress on their external
assets as ``AssetObservation``s (latest committed batch and its time, what each new batch read and wrote, the
file sources' unprocessed files)."""

import json
from typing import NamedTuple

import dagster as dg

from checkpoint_ops.ledger import Ledger
from checkpoint_ops.progress import query_progress
from checkpoint_ops.timeline import batch_times
from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource

SENSOR = "checkpoint_progress_sensor"


def progress_observation(query: StreamingQuery, files: CheckpointFileManagerResource,
                         since: "Reported | None") -> tuple[dg.AssetObservation | None, "Reported | None"]:
    """The observation of what ``query`` committed after the batch ``since`` reported (None: nothing new, or
    no checkpoint yet) and what is reported now. A checkpoint rolled back (or restored) since re-runs batches
    the sensor reported once: they are new again. The reported batch's ``batchTimestampMs`` tells: a batch
    now at that number with another time (or none there) means history was rewritten, and every batch that
    ran after the reported one counts, from the newest batch at or before its time."""
    fm, root = files.file_manager(query.checkpoint)
    if not fm.walk(root):
        return None, since
    ckpt = files.checkpoint(query.checkpoint)
    last = ckpt.latest_commit
    if last is None:
        return None, since
    since_batch = _since_batch(ckpt, since)
    if since_batch is not None and last <= since_batch:
        return None, Reported(last, _batch_time_ms(ckpt, last)) if since is not None and last < since.batch else since
    progress = query_progress(ckpt, [files.sink(s) for s in query.sinks], since_batch, Ledger.for_checkpoint(ckpt),
                              files.options())
    rows = ["| batch | time (UTC) | input files | output files | output bytes |", "|---|---|---|---|---|"]
    rows += [f"| {b.batch} | {b.time or '?'} | {_n(b.input_files)} | {_n(b.output_files)} | {_n(b.output_bytes)} |"
             for b in progress.batches]
    md = {"last_committed_batch": dg.MetadataValue.int(last),
          "last_batch_time": dg.MetadataValue.text(progress.last_batch_time or "unknown"),
          "new_batches": dg.MetadataValue.int(len(progress.batches)),
          "batches": dg.MetadataValue.md("\n".join(rows)),
          "batch_details": dg.MetadataValue.json([b.to_dict() for b in progress.batches]),
          "checkpoint": dg.MetadataValue.path(query.checkpoint)}
    if since is not None and since_batch != since.batch:
        md["rerun_after_rollback_from_batch"] = dg.MetadataValue.int(since.batch)
    if progress.unprocessed_files is not None:
        md["unprocessed_files"] = dg.MetadataValue.int(progress.unprocessed_files)
    return dg.AssetObservation(asset_key=query.name, metadata=md,
                               description=f"{query.name} committed batch {last}"), \
        Reported(last, _batch_time_ms(ckpt, last))


class Reported(NamedTuple):
    """The last batch the sensor reported for a query, and when it ran (its ``batchTimestampMs``)."""

    batch: int
    time_ms: int | None

    @classmethod
    def from_cursor(cls, value) -> "Reported | None":
        if value is None:
            return None
        if isinstance(value, int):  # a cursor written before the time was kept: the batch alone
            return cls(value, None)
        return cls(int(value["batch"]), value.get("time_ms"))

    def to_cursor(self) -> dict:
        return {"batch": self.batch, "time_ms": self.time_ms}


def _batch_time_ms(ckpt, batch: int) -> int | None:
    """``batchTimestampMs`` of ``offsets/batch`` on disk (None: gone, or unreadable)."""
    return batch_times(ckpt, [batch])[batch].timestamp_ms


def _since_batch(ckpt, since: "Reported | None") -> int | None:
    """The batch after which batches are new: the one reported, unless the checkpoint's history was rewritten
    since (its time differs, or it is gone), then the newest retained batch that ran at or before it."""
    if since is None or since.time_ms is None:
        return None if since is None else since.batch
    if not ckpt.offset_files or since.batch < min(ckpt.offset_files):
        return since.batch  # purged by Spark's retention since, not rewritten: what ran after it is new
    if _batch_time_ms(ckpt, since.batch) == since.time_ms:
        return since.batch
    times = batch_times(ckpt, [b for b in ckpt.offset_files if b <= since.batch])  # one load for them all
    ran_before = [b for b, t in sorted(times.items()) if t.timestamp_ms is not None and t.timestamp_ms <= since.time_ms]
    return ran_before[-1] if ran_before else None


def _n(value) -> str:
    return "n/a" if value is None else str(value)


def progress_sensor(queries: list[StreamingQuery], name: str = SENSOR, minimum_interval_seconds: int = 60) -> dg.SensorDefinition:
    """One sensor for every query that runs elsewhere; its cursor is the last batch reported per query
    and when it ran (a rolled-back checkpoint's re-run batches are reported again)."""

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Reports the progress of queries that run elsewhere, from their checkpoints.")
    def _sensor(context: dg.SensorEvaluationContext, checkpoint_files: CheckpointFileManagerResource):
        cursor = json.loads(context.cursor) if context.cursor else {}
        events = []
        for query in queries:
            observation, reported = progress_observation(query, checkpoint_files,
                                                         Reported.from_cursor(cursor.get(query.name)))
            if observation is not None:
                events.append(observation)
            if reported is not None:
                cursor[query.name] = reported.to_cursor()
        return dg.SensorResult(asset_events=events, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor
