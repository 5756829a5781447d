"""Queries that run elsewhere: a sensor that reads their checkpoints and reports progress on their external
assets as ``AssetObservation``s (latest committed batch and its time, what each new batch read and wrote, the
file sources' unprocessed files)."""

import json

import dagster as dg

from checkpoint_ops.ledger import Ledger
from checkpoint_ops.progress import query_progress
from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource

SENSOR = "checkpoint_progress_sensor"


def progress_observation(query: StreamingQuery, files: CheckpointFileManagerResource,
                         since_batch: int | None) -> tuple[dg.AssetObservation | None, int | None]:
    """The observation of what ``query`` committed after ``since_batch`` (None: nothing new, or no checkpoint
    yet) and the latest committed batch."""
    fm, root = files.file_manager(query.checkpoint)
    if not fm.walk(root):
        return None, since_batch
    ckpt = files.checkpoint(query.checkpoint)
    last = ckpt.latest_commit
    if last is None or (since_batch is not None and last <= since_batch):
        return None, since_batch
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
    if progress.unprocessed_files is not None:
        md["unprocessed_files"] = dg.MetadataValue.int(progress.unprocessed_files)
    return dg.AssetObservation(asset_key=query.name, metadata=md,
                               description=f"{query.name} committed batch {last}"), last


def _n(value) -> str:
    return "n/a" if value is None else str(value)


def progress_sensor(queries: list[StreamingQuery], name: str = SENSOR, minimum_interval_seconds: int = 60) -> dg.SensorDefinition:
    """One sensor for every query that runs elsewhere; its cursor is the last batch reported per query."""

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Reports the progress of queries that run elsewhere, from their checkpoints.")
    def _sensor(context: dg.SensorEvaluationContext, checkpoint_files: CheckpointFileManagerResource):
        cursor = json.loads(context.cursor) if context.cursor else {}
        events = []
        for query in queries:
            observation, last = progress_observation(query, checkpoint_files, cursor.get(query.name))
            if observation is not None:
                events.append(observation)
                cursor[query.name] = last
        return dg.SensorResult(asset_events=events, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor
