"""The code location: assets, checks, jobs and resources, on embedded defaults (local Spark)."""

import dagster as dg
from dagster_pyspark import PySparkResource

from pipelines.assets import event_counts
from pipelines.checks import event_counts_checkpoint_check
from pipelines.jobs import event_counts_job
from resources.checkpoint_files import CheckpointFileManagerResource
from resources.streams import StreamLocations

LOCAL_SPARK = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    # a short retention so the demo shows purged batches and a bounded rollback window
    "spark.sql.streaming.minBatchesToRetain": "20",
}

defs = dg.Definitions(
    assets=[event_counts],
    asset_checks=[event_counts_checkpoint_check],
    jobs=[event_counts_job],
    resources={
        "pyspark": PySparkResource(spark_config=LOCAL_SPARK),
        "locations": StreamLocations(),
        "checkpoint_files": CheckpointFileManagerResource(),
    },
)
