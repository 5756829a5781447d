"""The factory, as this repository's code location imported it before it became the package
``dagster_checkpoint_ops``: ``from dagster_checkpoint_ops import StreamingQuery, streaming_definitions``."""

from dagster_checkpoint_ops import ReprocessConfig, StreamingQuery, default_home, streaming_definitions

__all__ = ["ReprocessConfig", "StreamingQuery", "default_home", "streaming_definitions"]
