"""Dagster resources: storage access for checkpoint operations, and where a stream keeps its files."""

from resources.checkpoint_files import CheckpointFileManagerResource
from resources.streams import StreamLocations

__all__ = ["CheckpointFileManagerResource", "StreamLocations"]
