"""Dagster resources: Spark, the checkpoint file manager, and the streaming definitions' settings."""

from resources.checkpoint_files import CheckpointFileManagerResource
from resources.settings import StreamingSettings
from resources.spark import LOCAL_SPARK, SparkResource

__all__ = ["CheckpointFileManagerResource", "LOCAL_SPARK", "SparkResource", "StreamingSettings"]
