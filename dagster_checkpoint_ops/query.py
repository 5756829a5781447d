"""A streaming query as the Dagster definitions know it, and the names derived from it."""

import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class StreamingQuery:
    """One streaming query: its name (the asset's), how to build it, its checkpoint and file sinks.

    ``build(spark)`` returns the query's unstarted ``DataStreamWriter``; ``sinks`` are the output
    directories of its file sinks (empty for foreachBatch, Kafka and other sinks).
    """

    name: str
    build: Callable  # (SparkSession) -> DataStreamWriter, not started
    checkpoint: str
    sinks: Sequence[str] = ()
    description: Optional[str] = None
    group: str = "streaming"
    tags: dict = field(default_factory=dict)

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"query name {self.name!r} must be a Python identifier (it names the asset and its ops)")


def pool_name(query: str) -> str:
    """One Dagster pool per checkpoint: its streaming runs, backups and compactions never overlap."""
    return f"checkpoint-{query}"


def job_name(query: str) -> str:
    return f"{query}_job"
