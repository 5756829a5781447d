"""The resources this repository's code location (``pipelines/``) uses: the package's, as configured here.

The example keeps the package defaults (local Spark, the file manager by URL scheme); a deployment would
configure them here, e.g. ``SparkResource(spark_config={"spark.master": "spark://master:7077"})``.
"""

from dagster_checkpoint_ops.resources import LOCAL_SPARK, CheckpointFileManagerResource, SparkResource, StreamingSettings

# Spark settings of the example's queries, over local Spark's defaults.
EXAMPLE_SPARK_CONFIG: dict = dict(LOCAL_SPARK)

__all__ = ["CheckpointFileManagerResource", "EXAMPLE_SPARK_CONFIG", "LOCAL_SPARK", "SparkResource", "StreamingSettings"]
