"""Spark Structured Streaming checkpoints, operated safely from Dagster.

.. code-block:: python

    from dagster_checkpoint_ops import StreamingQuery, streaming_definitions

Importing this package does nothing but define things: no Spark session, no files written.
"""

from dagster_checkpoint_ops.component import StreamingQueryComponent
from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.resources import (LOCAL_SPARK, CheckpointFileManagerResource, SparkResource,
                                              StreamingSettings)
from dagster_checkpoint_ops.streaming import ReprocessConfig, default_home, streaming_definitions

__all__ = ["CheckpointFileManagerResource", "LOCAL_SPARK", "ReprocessConfig", "SparkResource", "StreamingQuery",
           "StreamingQueryComponent", "StreamingSettings", "default_home", "streaming_definitions"]
