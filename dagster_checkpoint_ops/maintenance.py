"""Maintenance jobs: one op per streaming query, each in its checkpoint's pool, so maintenance of one
checkpoint never overlaps its stream while different checkpoints proceed side by side."""

from typing import Callable

import dagster as dg

from dagster_checkpoint_ops.query import StreamingQuery, pool_name
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings

Work = Callable[[dg.OpExecutionContext, StreamingQuery, StreamingSettings, CheckpointFileManagerResource], object]


def query_op(query: StreamingQuery, prefix: str, description: str, work: Work) -> dg.OpDefinition:
    @dg.op(name=f"{prefix}_{query.name}", pool=pool_name(query.name), description=description)
    def _op(context: dg.OpExecutionContext, streaming_settings: StreamingSettings,
            checkpoint_files: CheckpointFileManagerResource) -> None:
        work(context, query, streaming_settings, checkpoint_files)

    return _op


def maintenance_job(name: str, description: str, ops: list[dg.OpDefinition]) -> dg.JobDefinition:
    @dg.job(name=name, description=description)
    def _job():
        for op in ops:
            op()

    return _job
