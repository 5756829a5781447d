"""Scheduled sink-log compaction and batch-granular retention of every file sink, per query, in its pool."""

from typing import Optional

import dagster as dg

from checkpoint_ops.errors import CheckpointOpsError, parameter_names
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.sinklog import SinkCompactOperation, SinkRetainOperation
from checkpoint_ops.units import parse_duration
from dagster_checkpoint_ops.maintenance import maintenance_job, query_op
from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings
from dagster_checkpoint_ops.runner import refuse_checkpoint_of_another_query


def compact_sinks(context, query: StreamingQuery, settings: StreamingSettings,
                  files: CheckpointFileManagerResource) -> list[dict]:
    """Compact each of the query's file sinks, then drop batches older than the retention, if set: each
    through the operation runner (the checkpoint's and the sink's leases, journaled, undoable)."""
    refuse_checkpoint_of_another_query(context, query, files, job="compaction")
    opts = files.options()
    options = RunOptions(yes=True, storage_options=opts, owner=f"dagster run {context.run.run_id} (compaction of "
                         f"{query.name})")
    done = []
    for sink in query.sinks:
        try:
            with parameter_names({"sink_compact_interval": "the query's Spark settings", "force": None}):
                result = run(SinkCompactOperation(sink, query.checkpoint, storage_options=opts), options)
                entry = {"sink": sink, "compact": result.plan.summary.get("compact"),
                         "op_id": result.outcome.op_id if result.applied else None}
                retention = settings.sink_retention_of(query)
                if retention:
                    older = parse_duration(retention, "sink_retention")
                    result = run(SinkRetainOperation(sink, query.checkpoint, older_than_s=older, delete_files=True,
                                                     storage_options=opts), options)
                    entry["retain"] = result.plan.summary.get("retain")
            done.append(entry)
        except CheckpointOpsError as e:
            raise dg.Failure(description=f"compaction of {sink} ({query.name}) refused: {e.render()}") from None
    context.log_event(dg.AssetObservation(asset_key=query.name,
                                          metadata={"sink_compaction": dg.MetadataValue.json(done)}))
    return done


def compaction_job(queries: list[StreamingQuery], name: str = "sink_compaction_job") -> Optional[dg.JobDefinition]:
    ops = [query_op(q, "compact", f"Compact {q.name}'s file sink logs (and apply the sink retention, if set).",
                    compact_sinks) for q in queries if q.sinks]
    if not ops:
        return None
    return maintenance_job(name,
                           "Compact every file sink's log at batch granularity (each in its checkpoint's pool).", ops)
