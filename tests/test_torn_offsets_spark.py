"""An offsets file cut to its version line (``v1\\n``), read by Spark, and the fix our tools give for it.

A store without atomic renames, or a copy that stopped part-way, can leave ``offsets/N`` holding only the
version line. Our model calls that a torn write (``parse_offsets``, kind ``truncated``) from reading Spark's
``OffsetSeqLog.deserialize``; here Spark reads such a file. fsck names it, the fix it prints
(``logfile.TORN_LOG_FIX``) is followed as written, and Spark then resumes with the exact output:

* a batch only planned (no ``commits/N``): deleting ``offsets/N`` lets Spark plan batch N again;
* a committed batch: deleting ``offsets/N`` alone leaves a commit without its offsets, which Spark refuses
  (``CONCURRENT_STREAM_LOG_UPDATE``; with RocksDB checkpoint format V2, ``CheckpointInfo length: 0``);
  ``checkpoint-ops rollback`` to the batch before it lets Spark resume.

The cut file gets a matching Hadoop ``.crc`` sidecar, so what Spark reports is the content, not a checksum.
"""

from __future__ import annotations

import os

import pytest

from checkpoint_ops.storage.checksums import hadoop_crc_bytes, hadoop_crc_name
from pipelines.event_counts import flush_files
from tests.helpers import cli_json, tree_snapshot
from tests.test_rollback_spark import INTERVALS, exact, finish_and_read

VERSION_LINE_ONLY = b"v1\n"
# Spark's OffsetSeqLog.deserialize takes the metadata line from an empty iterator (NoSuchElementException)
TORN = "next on empty iterator"


def _write_torn(path: str, stamp_from: str | None = None) -> None:
    """``path`` holding the version line only, with its ``.crc`` sidecar; its mtime that of ``stamp_from``
    (a file written long ago: no batch counts as running)."""
    folder, name = os.path.split(path)
    with open(path, "wb") as f:
        f.write(VERSION_LINE_ONLY)
    crc = os.path.join(folder, hadoop_crc_name(name))
    with open(crc, "wb") as f:
        f.write(hadoop_crc_bytes(VERSION_LINE_ONLY))
    if stamp_from is not None:
        stat = os.stat(stamp_from)
        for p in (path, crc):
            os.utime(p, (stat.st_atime, stat.st_mtime))


def _remove(path: str) -> None:
    folder, name = os.path.split(path)
    for p in (path, os.path.join(folder, hadoop_crc_name(name))):
        os.remove(p)


def _torn_finding(run, rel: str) -> dict:
    code, report = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    torn = [f for f in report["findings"] if f["path"].endswith(rel) and f["severity"] == "error"]
    assert code != 0 and len(torn) == 1, report
    assert "version line but no metadata line" in torn[0]["problem"], torn[0]
    return torn[0]


def _spark_refuses(spark, run, reason: str) -> None:
    before = tree_snapshot(run.checkpoint)
    with pytest.raises(Exception, match=reason):
        run.run_query(spark)
    assert tree_snapshot(run.checkpoint) == before, "the refused restart changed the checkpoint"


def test_a_planned_batch_whose_offsets_hold_the_version_line_only(spark, run):
    """Batch L+1 planned and torn as it was written: Spark cannot restart; deleting it (the fix) lets Spark plan
    the batch again, and the output is exact. First the file is deleted without its ``.crc`` sidecar: fsck says
    so, and Spark's write of the file fails on the sidecar, leaving what fsck names next."""
    last = run.last_batch
    torn = os.path.join(run.checkpoint, "offsets", str(last + 1))
    _write_torn(torn, stamp_from=os.path.join(run.checkpoint, "offsets", str(last)))
    finding = _torn_finding(run, f"offsets/{last + 1}")
    assert "no `commits/N` yet, can be deleted with its `.N.crc` sidecar" in finding["fix"], finding

    _spark_refuses(spark, run, TORN)
    os.remove(torn)  # the fix half followed: its sidecar left behind, which fsck names and Spark's write fails on
    code, report = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert code != 0 and [(f["severity"], f["code"]) for f in report["findings"]] == [("error", "orphan-crc")], report
    flush_files(run.input, run.files)  # new input: Spark plans batch L+1, and writes its offsets file
    with pytest.raises(Exception, match="concurrently using"):
        run.run_query(spark)
    # Spark wrote offsets/L+1, then failed to put its sidecar in place: the old one is stale now, and the new
    # one's temp file is left; fsck names both, and deleting them is its fix
    code, report = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    found = {(f["severity"], f["code"]): f["path"] for f in report["findings"]}
    assert code != 0 and set(found) == {("warning", "stale-crc"), ("warning", "orphan-crc")}, report
    assert found[("warning", "stale-crc")].endswith(f"offsets/{hadoop_crc_name(str(last + 1))}"), report
    for path in found.values():
        os.remove(path)
    code, after = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, after["findings"]) == (0, []), after
    assert finish_and_read(spark, run) == exact(run)


def test_a_committed_batch_whose_offsets_hold_the_version_line_only(spark, run):
    """offsets/L of a committed batch torn: Spark cannot restart; deleting offsets/L alone is refused by Spark
    too (a commit without its offsets), as the fix warns; the rollback to L-1 it names lets Spark resume exactly."""
    last = run.last_batch
    torn = os.path.join(run.checkpoint, "offsets", str(last))
    _write_torn(torn, stamp_from=torn)
    finding = _torn_finding(run, f"offsets/{last}")
    assert "`checkpoint-ops rollback` to the batch before it" in finding["fix"], finding

    _spark_refuses(spark, run, TORN)
    saved = {p: open(p, "rb").read() for p in (torn, os.path.join(run.checkpoint, "offsets", hadoop_crc_name(
        str(last))))}
    stamp = os.stat(torn)
    _remove(torn)  # what the fix warns against: Spark refuses this as well
    _spark_refuses(spark, run, "CONCURRENT_STREAM_LOG_UPDATE" if run.flavour != "rocksdb_v2"
                   else "CheckpointInfo length: 0")
    for p, data in saved.items():
        with open(p, "wb") as f:
            f.write(data)
        os.utime(p, (stamp.st_atime, stamp.st_mtime))

    code, applied = cli_json("rollback", run.checkpoint, "--to-batch", str(last - 1), "--sink", run.output,
                             *INTERVALS, "--yes")
    assert code == 0 and applied["result"]["status"] == "applied", applied
    code, after = cli_json("fsck", run.checkpoint, "--sink", run.output, *INTERVALS)
    assert (code, after["findings"]) == (0, []), after
    assert finish_and_read(spark, run) == exact(run)
