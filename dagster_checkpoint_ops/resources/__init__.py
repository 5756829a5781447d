"""Dagster resources: Spark, the checkpoint file manager, and the streaming definitions' settings."""

from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings
from dagster_checkpoint_ops.resources.spark import LOCAL_SPARK, SparkResource

__all__ = ["CheckpointFileManagerResource", "LOCAL_SPARK", "SparkResource", "StreamingSettings"]
