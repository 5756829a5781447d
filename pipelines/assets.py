"""Assets that run streaming queries."""

import json

import dagster as dg
from dagster_pyspark import PySparkResource

from checkpoint_ops.activity import hold_lease
from checkpoint_ops.inspect import inspect_checkpoint
from checkpoint_ops.ledger import Ledger
from checkpoint_ops.ledger import sync as sync_ledger
from pipelines.event_counts import build_query
from resources.checkpoint_files import CheckpointFileManagerResource
from resources.streams import StreamLocations


@dg.asset(kinds={"spark", "parquet"}, group_name="streaming", pool="checkpoint-event-counts")
def event_counts(
    context: dg.AssetExecutionContext,
    pyspark: PySparkResource,
    locations: StreamLocations,
    checkpoint_files: CheckpointFileManagerResource,
) -> dg.MaterializeResult:
    """Windowed event counts, appended by the streaming query until its input is drained."""
    spark = pyspark.spark_session
    fm, root = checkpoint_files.file_manager(locations.checkpoint_dir)
    # The lease tells rollbacks (and other runs) that this query is running.
    with hold_lease(fm, root, owner=f"dagster run {context.run.run_id}"):
        query = build_query(spark, locations.input_dir, locations.output_dir, locations.checkpoint_dir)
        query.awaitTermination()
    progress = [json.loads(p.json) for p in query.recentProgress]
    context.log.info(f"ran {len(progress)} micro-batches")

    ckpt = checkpoint_files.checkpoint(locations.checkpoint_dir)
    sink = checkpoint_files.sink(locations.output_dir)
    ledger = sync_ledger(ckpt, [sink])  # remember which files each batch wrote, past compaction
    report = inspect_checkpoint(ckpt, [sink], ledger=Ledger.for_checkpoint(ckpt))
    window = report["rollback_window"]
    return dg.MaterializeResult(
        metadata={
            "batches_run": dg.MetadataValue.int(len(progress)),
            "batch_ids": dg.MetadataValue.text(
                f"{progress[0]['batchId']}..{progress[-1]['batchId']}" if progress else "none (no new input)"
            ),
            "input_rows": dg.MetadataValue.int(sum(int(p["numInputRows"]) for p in progress)),
            "last_committed_batch": dg.MetadataValue.int(
                report["last_committed_batch"] if report["last_committed_batch"] is not None else -1
            ),
            "rollback_window": dg.MetadataValue.text(
                f"{window['earliest']}..{window['latest']}" if window["earliest"] is not None else "none"
            ),
            "ledger_batches_recorded": dg.MetadataValue.int(ledger["batches_recorded"]),
            "sink_files": dg.MetadataValue.int(report["sink"]["files"]),
            "sink_bytes": dg.MetadataValue.int(report["sink"]["bytes"]),
            "checkpoint": dg.MetadataValue.path(locations.checkpoint_dir),
            "output": dg.MetadataValue.path(locations.output_dir),
        }
    )
