"""Jobs."""

import dagster as dg

from pipelines.assets import event_counts
from pipelines.checks import event_counts_checkpoint_check

# In-process: one Spark JVM for the whole run instead of one per step process.
event_counts_job = dg.define_asset_job(
    "event_counts_job",
    selection=dg.AssetSelection.assets(event_counts) | dg.AssetSelection.checks(event_counts_checkpoint_check),
    executor_def=dg.in_process_executor,
)
