"""What Spark's HDFS state cleanup leaves below the snapshot it keeps is retention, not damage.

Spark 4.3's cleanup (``HDFSBackedStateStoreProvider.cleanup``) lists one file per version, the snapshot
where a version has both a delta and a snapshot, and deletes every listed version below the snapshot it
keeps: a snapshot it deletes leaves that version's delta behind until the next cleanup. A query that
stops after such a cleanup leaves, e.g., ``18.delta 21.delta 21.snapshot ...`` (seen in this suite's own
Spark runs, depending on when maintenance ran). fsck called that "a snapshot or zip was deleted" (a
window-cut warning on a checkpoint exactly as Spark left it).

Here Spark writes the checkpoint and the batch ledger records it; then one retention step with a smaller
``minBatchesToRetain`` is replayed exactly as Spark does it (the timing of Spark's maintenance thread
cannot be forced): the offsets and commits purge below batch T, and each store's cleanup keeping the
newest snapshot at or below version T + 1. The ledger still reaches below T, so the window's stop is the
state's. fsck must be silent, and a rollback to the oldest batch the window offers must resume in Spark
with exact output. A snapshot deleted by hand together with the deltas after it, which Spark's cleanup
cannot leave (the snapshot kept above is higher than the offsets purge allows), still warns.
"""

from __future__ import annotations

import os

from checkpoint_ops.storage.checksums import hadoop_crc_name
from tests.helpers import cli_json
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read, rollback


def _listed(store_dir: str) -> dict[int, str]:
    """Spark's ``fetchFiles``: one file per version, the snapshot over the delta."""
    versions: dict[int, str] = {}
    for name in os.listdir(store_dir):
        stem, _, ext = name.partition(".")
        if stem.isdigit() and ext in ("delta", "snapshot") and (ext == "snapshot" or int(stem) not in versions):
            versions[int(stem)] = name
    return versions


def _snapshots(store_dir: str) -> list[int]:
    return sorted(v for v, name in _listed(store_dir).items() if name.endswith(".snapshot"))


def _remove(path: str) -> None:
    for p in (path, os.path.join(os.path.dirname(path), hadoop_crc_name(os.path.basename(path)))):
        if os.path.exists(p):
            os.remove(p)


def _spark_purge(checkpoint: str, threshold: int) -> None:
    """``offsetLog.purge`` and ``commitLog.purge``: every batch below ``threshold``."""
    for log in ("offsets", "commits"):
        for name in os.listdir(os.path.join(checkpoint, log)):
            if name.isdigit() and int(name) < threshold:
                _remove(os.path.join(checkpoint, log, name))


def _spark_cleanup(store_dir: str, newest_kept: int) -> None:
    """``cleanup`` of one store: keep the newest snapshot at or below ``newest_kept`` and everything
    after it; delete every listed version below it (a deleted snapshot's delta is not listed, so stays)."""
    listed = _listed(store_dir)
    kept = [v for v in _snapshots(store_dir) if v <= newest_kept]
    if not kept:
        return  # no snapshot to keep: Spark keeps everything from the first delta
    for v in sorted(v for v in listed if v < kept[-1]):
        _remove(os.path.join(store_dir, listed[v]))


def _stores(run) -> list[str]:
    op = os.path.join(run.checkpoint, "state", "0")
    return [os.path.join(op, p) for p in sorted(os.listdir(op)) if p.isdigit()]


def test_deltas_left_below_the_kept_snapshot_are_retention_and_the_oldest_batch_restarts(spark, spark_runs):
    run = spark_runs("hdfs")
    run.reset()
    try:
        code, r = cli_json("ledger", "sync", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert code == 0, r
        oldest = min(int(n) for n in os.listdir(os.path.join(run.checkpoint, "offsets")) if n.isdigit())
        # a snapshot with another below it (whose delta stays), high enough that the batch below the window
        # (T - 1, whose restart reads offsets/T-2 and offsets/T-1) still has its offsets in the ledger: then
        # the window's stop is the state's. T = v - 1, so v >= oldest + 3.
        keeps = [v for d in _stores(run) for v in _snapshots(d)[1:] if v >= oldest + 3]
        assert keeps, f"no store has two snapshots the second of which is at least offsets/{oldest} + 3"
        threshold = min(keeps) - 1
        _spark_purge(run.checkpoint, threshold)
        for d in _stores(run):
            _spark_cleanup(d, threshold + 1)
        left = [d for d in _stores(run) if _snapshots(d) and min(_listed(d)) < _snapshots(d)[0]]
        assert left, "no store kept a delta below its oldest snapshot"

        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, []), f["findings"]  # before: window-cut, "a snapshot ... was deleted"

        code, report = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert code == 0, report
        window = report["rollback_window"]
        assert window["earliest"] == threshold, window  # the state's stop, below the offsets the ledger keeps
        assert "state version" in window["earliest_reason"], window
        code, r = rollback(run, window["earliest"], "--yes")
        assert code == 0, r
        # the rollback restored offsets/T-1 from the ledger, below what Spark's purge left (the snapshot
        # kept is T + 1): still retention (before: window-cut, found by CI when maintenance had not yet run)
        assert threshold - 1 in {int(n) for n in os.listdir(os.path.join(run.checkpoint, "offsets")) if n.isdigit()}
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, []), f["findings"]
        assert finish_and_read(spark, run) == exact(run)
        code, f = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
        assert (code, f["findings"]) == (0, []), f["findings"]
    finally:
        run.reset()


def test_the_rule_leftovers_are_judged_by():
    """``_cleanup_could_leave`` on the listings of the review (helper run, Spark 4.3, minBatchesToRetain 5,
    oldest offsets and commits file 33): Spark's leftovers pass, a snapshot deleted by hand with the deltas after it
    does not (the snapshot left above is higher than the log purge allows, give or take PURGE_LAG_ALLOWED
    skipped purges), nor do consecutive deltas."""
    from types import SimpleNamespace

    from checkpoint_ops.restart import PURGE_LAG_ALLOWED, _cleanup_could_leave, _oldest_logged_batch

    def store(*names):
        files = [SimpleNamespace(version=int(n.split(".")[0]), kind=n.split(".")[1]) for n in names]
        return SimpleNamespace(files=files)

    spark_left = store("30.delta", "34.delta", "34.snapshot", "35.delta", "36.delta", "37.delta", "38.delta",
                       "38.snapshot", "39.delta", "40.delta")
    assert _cleanup_could_leave(spark_left, 30, oldest_logged=33)
    by_hand = store("30.delta", "34.delta", "38.delta", "38.snapshot", "39.delta", "40.delta")
    assert not _cleanup_could_leave(by_hand, 30, oldest_logged=33)  # before the bound: taken for retention
    assert _cleanup_could_leave(by_hand, 30, oldest_logged=37)  # had the offsets purge gone that far, it could be
    assert _cleanup_could_leave(by_hand, 30, oldest_logged=37 - PURGE_LAG_ALLOWED)  # or nearly, its purges skipped
    consecutive = store("33.delta", "34.delta", "35.delta", "35.snapshot", "36.delta")
    assert not _cleanup_could_leave(consecutive, 33, oldest_logged=34)
    no_snapshot = store("30.delta", "31.delta")
    assert not _cleanup_could_leave(no_snapshot, 30, oldest_logged=29)
    # after a rollback to 24 (CI run): offsets/23 restored from the ledger, commits from 24, snapshot 25 kept
    rolled_back = store("22.delta", "25.delta", "25.snapshot", "26.delta", "27.delta", "28.delta", "28.snapshot")
    oldest = _oldest_logged_batch({23, 24, 25}, {24, 25})
    assert oldest == 24
    assert _cleanup_could_leave(rolled_back, 22, oldest_logged=oldest)
    # a skipped async purge leaves the logs up to PURGE_LAG_ALLOWED batches behind the state cleanup
    assert _cleanup_could_leave(rolled_back, 22, oldest_logged=24 - PURGE_LAG_ALLOWED)
    assert not _cleanup_could_leave(rolled_back, 22, oldest_logged=23 - PURGE_LAG_ALLOWED)
    assert _oldest_logged_batch({5, 6}, set()) == 5 and _oldest_logged_batch(set(), set()) is None


def test_consecutive_leftovers_where_spark_snapshots_every_version():
    """``minDeltasForSnapshot=0``: Spark snapshots every version a maintenance pass finds, and one cleanup
    can delete snapshots at consecutive versions, leaving their deltas. Listings from a review's real Spark
    4.3 runs (window aggregation, minBatchesToRetain 3, maintenance every 750 ms, async log purge), where
    fsck warned window-cut on checkpoints nobody had touched; and that run's checkpoint with every
    snapshot but the newest deleted by hand, which must still warn."""
    from types import SimpleNamespace

    from checkpoint_ops.restart import _cleanup_could_leave, _snapshots_at_consecutive_versions

    def store(listing):
        names = listing.split()
        return SimpleNamespace(files=[SimpleNamespace(version=int(n.split(".")[0]), kind=n.split(".")[1])
                                      for n in names])

    # stop 4: offsets 42..45, commits 42..44
    stop4 = store("40.delta 41.delta 42.delta 42.snapshot 43.delta 43.snapshot 44.delta 45.delta 45.snapshot")
    assert _snapshots_at_consecutive_versions(stop4)
    assert _cleanup_could_leave(stop4, 40, oldest_logged=42, snapshots_every_version=True)
    assert not _cleanup_could_leave(stop4, 40, oldest_logged=42)  # without the sign: the false warning
    # stop 5, partition 1 (offsets and commits from 51); partition 0 holds 50.snapshot
    stop5 = store("50.delta 51.delta 52.delta 52.snapshot 53.delta 53.snapshot 54.delta 55.delta 55.snapshot")
    assert _cleanup_could_leave(stop5, 50, oldest_logged=51, snapshots_every_version=True)
    # by hand: every snapshot but the newest gone; no store shows the sign any more
    by_hand = store("93.delta 94.delta 95.delta 96.delta 97.delta 98.delta 98.snapshot")
    assert not _snapshots_at_consecutive_versions(by_hand)
    assert not _cleanup_could_leave(by_hand, 93, oldest_logged=93, snapshots_every_version=False)
    # the sign does not lift the bound: a snapshot far above what the log purge left was not Spark's choice
    assert not _cleanup_could_leave(stop4, 40, oldest_logged=30, snapshots_every_version=True)
    spaced = store("30.delta 33.delta 33.snapshot 36.delta 36.snapshot")  # minDeltasForSnapshot >= 2
    assert not _snapshots_at_consecutive_versions(spaced)
