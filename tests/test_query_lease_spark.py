"""``spark.hold_lease_while_active`` with a real query: the query is started before the helper can be called,
so when an operation holds the lease the helper stops the query before it raises (it went on running beside
the operation before: its next batch planned and committed while a rollback held the checkpoint)."""

from __future__ import annotations

import os

import pytest

from checkpoint_ops.lease import acquire
from checkpoint_ops.spark import hold_lease_while_active
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import read_events, write_event_files


def test_a_query_whose_lease_is_held_elsewhere_is_stopped(spark, tmp_path):
    from checkpoint_ops.errors import RefusedError

    incoming, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ckpt")
    os.makedirs(ckpt)
    write_event_files(incoming, 0, 2)
    fm, root = open_file_manager(ckpt)
    holder = acquire(fm, root, "checkpoint-ops rollback (a test)", "checkpoint")
    try:
        query = read_events(spark, incoming).writeStream.format("parquet").option("path", out).option(
            "checkpointLocation", ckpt).trigger(processingTime="1 second").start()
        try:
            with pytest.raises(RefusedError) as refused:
                hold_lease_while_active(query, ckpt, [out])
            assert not query.isActive  # left running before: it went on beside the holder
            assert "checkpoint-ops rollback (a test)" in refused.value.problem, refused.value.problem
            assert "was stopped" in refused.value.problem and "start the query again" in refused.value.fix
        finally:
            query.stop()
    finally:
        holder.release()
