"""What Spark's HDFS state cleanup leaves below the snapshot it keeps is retention, not damage.

Spark 4.3's cleanup (``HDFSBackedStateStoreProvider.cleanup``) lists one file per version, the snapshot
where a version has both a delta and a snapshot, and deletes every listed version below the snapshot it
keeps: a snapshot it deletes leaves that version's delta behind until the next cleanup. A query that
stops after such a cleanup leaves, e.g., ``18.delta 21.delta 21.snapshot ...`` (seen in this suite's own
Spark runs, depending on when maintenance ran). fsck called that "a snapshot or zip was deleted" (a
window-cut warning on a checkpoint exactly as Spark left it). Here Spark writes the checkpoint, the
cleanup step is replayed exactly (the timing of Spark's maintenance thread cannot be forced), fsck must
be silent, and a rollback to the oldest batch the window offers must resume in Spark with exact output.
"""

from __future__ import annotations

import os

from tests.helpers import cli_json
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, rollback


def _spark_cleanup_below_second_snapshot(store_dir: str) -> list[str]:
    """Spark's cleanup of one store, keeping its second-oldest snapshot (nothing without two):
    ``fetchFiles`` keeps one file per version (the snapshot over the delta), and every listed version
    below the kept one is deleted, with its ``.crc``. Returns the twin deltas it leaves (the deltas of
    the deleted snapshots)."""
    names = os.listdir(store_dir)
    versions: dict[int, str] = {}
    for name in names:
        stem, _, ext = name.partition(".")
        if stem.isdigit() and ext in ("delta", "snapshot"):
            if ext == "snapshot" or int(stem) not in versions:
                versions[int(stem)] = name
    snapshots = sorted(v for v, name in versions.items() if name.endswith(".snapshot"))
    if len(snapshots) < 2:  # when maintenance wrote them is timing: the test needs this in one store at least
        return []
    keep = snapshots[1]
    for v in sorted(v for v in versions if v < keep):
        for name in (versions[v], f".{versions[v]}.crc"):
            if name in names:
                os.remove(os.path.join(store_dir, name))
    return [f"{v}.delta" for v in snapshots if v < keep and f"{v}.delta" in names]


def test_deltas_left_below_the_kept_snapshot_are_retention_and_the_oldest_batch_restarts(spark, spark_runs):
    run = spark_runs("hdfs")
    run.reset()
    try:
        op = os.path.join(run.checkpoint, "state", "0")
        stores = [os.path.join(op, p) for p in sorted(os.listdir(op)) if p.isdigit()]
        left = {d: _spark_cleanup_below_second_snapshot(d) for d in stores}
        assert any(left.values()), f"no snapshot with its delta beside it was deleted: {left}"

        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, []), f["findings"]  # before: window-cut, "a snapshot ... was deleted"

        code, report = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert code == 0, report
        window = report["rollback_window"]
        assert window["earliest"] is not None and window["earliest"] < run.last_batch, window
        code, r = rollback(run, window["earliest"], "--yes")
        assert code == 0, r
        assert finish_and_read(spark, run) == exact(run)
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, []), f["findings"]
    finally:
        run.reset()
