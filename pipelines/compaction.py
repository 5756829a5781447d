"""Scheduled sink-log compaction and batch-granular retention of every file sink, per query, in its pool."""

from typing import Optional

import dagster as dg

from checkpoint_ops.errors import CheckpointOpsError
from checkpoint_ops.sinklog import apply, open_context, parse_duration, plan_compact, plan_retain, sweep_staging
from pipelines.maintenance import maintenance_job, query_op
from pipelines.query import StreamingQuery
from resources.checkpoint_files import CheckpointFileManagerResource
from resources.settings import StreamingSettings


def compact_sinks(context, query: StreamingQuery, settings: StreamingSettings,
                  files: CheckpointFileManagerResource) -> list[dict]:
    """Compact each of the query's file sinks, then drop batches older than the retention, if set."""
    opts = files.options()
    done = []
    for sink in query.sinks:
        try:
            ctx = open_context(sink, query.checkpoint, opts)
            sweep_staging(ctx)
            plan = plan_compact(ctx, stage=True)
            result = apply(ctx, plan, opts) if not plan.empty else None
            entry = {"sink": sink, "compact": plan.summary.get("compact"), "op_id": result and result["op_id"]}
            if settings.sink_retention:
                ctx = open_context(sink, query.checkpoint, opts, data=True)
                plan = plan_retain(ctx, older_than_s=parse_duration(settings.sink_retention), delete_files=True,
                                   stage=True)
                result = apply(ctx, plan, opts) if not plan.empty else None
                entry["retain"] = plan.summary.get("retain")
            done.append(entry)
        except CheckpointOpsError as e:
            raise dg.Failure(description=f"compaction of {sink} ({query.name}) refused: {e.render()}") from None
    context.log_event(dg.AssetObservation(asset_key=query.name,
                                          metadata={"sink_compaction": dg.MetadataValue.json(done)}))
    return done


def compaction_job(queries: list[StreamingQuery]) -> Optional[dg.JobDefinition]:
    ops = [query_op(q, "compact", f"Compact {q.name}'s file sink logs (and apply the sink retention, if set).",
                    compact_sinks) for q in queries if q.sinks]
    if not ops:
        return None
    return maintenance_job("sink_compaction_job",
                           "Compact every file sink's log at batch granularity (each in its checkpoint's pool).", ops)
