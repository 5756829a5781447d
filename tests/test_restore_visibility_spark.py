"""An unfinished restore is never a partial table to Spark's readers of its sink target.

Spark reads a sink output through its log (``_spark_metadata``) when the log exists: only the files it lists,
and a listed file that is missing fails the read. Without it, Spark lists the directory and reads whatever
data files are there. A restore that wrote data files before the sink log left, when it stopped part-way (an
object-store outage, a killed process), a sink target that ``spark.read.parquet`` read silently as a subset of
the table (found by a hostile review: 75 of 120 rows, no error). The restore now writes each sink's log before
any of its data files, and its undo removes them in the reverse order.

Proved with the kill switch (``CHECKPOINT_OPS_KILL_AT``, in a forked child): the restore killed at each of its
mutating calls in turn, Spark reads the sink target and must fail or return exactly every row, never a subset;
``resume`` then finishes the restore and Spark reads every row. The undo of a completed restore, killed at each
call, is read the same way.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from pipelines.event_counts import write_event_files
from tests.test_crash_matrix import runner  # noqa: F401  (a fixture)
from tests.spark_runs import COMPACT_INTERVAL, run_stateless

I = ("--source-compact-interval", str(COMPACT_INTERVAL), "--sink-compact-interval", str(COMPACT_INTERVAL))
SPARK_SAMPLES = 3  # recovered restores Spark reads in full after ``resume`` (first, middle and last crash point)


@pytest.fixture(scope="module")
def backed_up(spark, runner, tmp_path_factory):
    """A small stateless query (6 batches, a compaction at 4) backed up: (destination, backup id, its rows)."""
    base = str(tmp_path_factory.mktemp("visibility") / "run")
    write_event_files(os.path.join(base, "input"), 0, 6)
    run_stateless(spark, base)
    dest = os.path.join(base, "..", "dest")
    code, out, err = runner.run("backup", "create", f"{base}/checkpoint", dest, "--sink", f"{base}/output", *I,
                                "--json")
    assert code == 0, err
    return dest, json.loads(out)["backup_id"], _rows(spark, f"{base}/output")


def _rows(spark, path: str) -> list[tuple] | None:
    """Every row ``spark.read.parquet`` returns (sorted), or None if the read failed."""
    try:
        return sorted(tuple(r) for r in spark.read.parquet(path).collect())
    except Exception:  # noqa: BLE001 - any failure of the read is a loud one: what the test allows
        return None


def _data_files(out: str) -> int:
    return sum(1 for d, _, names in os.walk(out) if "_spark_metadata" not in d
               for n in names if n.endswith(".parquet") and not n.startswith("."))


def test_an_interrupted_restore_is_never_a_partial_table_to_spark(spark, backed_up, runner, tmp_path):
    dest, backup_id, full = backed_up
    partial_states = 0  # crash points that left data files in the sink target

    def restore(where: str) -> list:
        return ["backup", "restore", dest, backup_id, f"{where}/ckpt", "--sink-target", f"{where}/out", "--yes", "--json"]

    k, points, seen_partial = 1, [], []
    while True:
        where = str(tmp_path / f"k{k}")  # a new place per crash point: nothing Spark cached applies to another
        code, out, err = runner.run(*restore(where), kill_at=k)
        if code != -9:
            assert code == 0, (k, out, err)
            break
        points.append(k)
        files = _data_files(f"{where}/out")
        if 0 < files:
            partial_states += 1
        got = _rows(spark, f"{where}/out")
        if got is not None and got != full:
            seen_partial.append(f"k={k}: {len(got)} of {len(full)} rows, {files} data files")
        k += 1
    assert not seen_partial, seen_partial
    assert partial_states > 1, "no crash point fell among the data files: the test proves nothing"

    # every interrupted restore is finished by ``resume``; Spark reads every row of sampled ones
    sampled = {points[0], points[len(points) // 2], points[-1]}
    for k in points:
        where = str(tmp_path / f"k{k}")
        code, out, err = runner.run("resume", f"{where}/ckpt", "--json")
        if code != 0 and ("nothing to resume" in err or "no such checkpoint" in err
                          or "stopped before changing anything" in err):
            shutil.rmtree(where)  # it stopped before changing anything: the restore is run again
            code, out, err = runner.run(*restore(where))
        assert code == 0, (k, out, err)
        if k in sampled:
            assert _rows(spark, f"{where}/out") == full, k
    assert len(sampled) == SPARK_SAMPLES


def test_an_interrupted_undo_of_a_restore_is_never_a_partial_table_to_spark(spark, backed_up, runner, tmp_path):
    """The undo of a completed restore removes the data files before the sink log: killed anywhere, Spark reads
    every row or fails; run again, it leaves nothing Spark reads. (A guard on the undo's order: with the log
    written first, an undo in the apply's order would leave data files without their log.)"""
    dest, backup_id, full = backed_up
    k, seen_partial, partial_states = 1, [], 0
    while True:
        where = str(tmp_path / f"u{k}")  # a new place per crash point (the journal names its roots absolutely)
        code, out, err = runner.run("backup", "restore", dest, backup_id, f"{where}/ckpt", "--sink-target",
                                    f"{where}/out", "--yes", "--json")
        assert code == 0, err
        restored = _data_files(f"{where}/out")
        code, out, err = runner.run("undo", f"{where}/ckpt", "--yes", "--json", kill_at=k)
        if code != -9:
            assert code == 0, (k, out, err)
            break
        files = _data_files(f"{where}/out")
        partial_states += 0 < files < restored
        got = _rows(spark, f"{where}/out")
        if got is not None and got != full:
            seen_partial.append(f"k={k}: {len(got)} of {len(full)} rows, {files} data files")
        code, out, err = runner.run("undo", f"{where}/ckpt", "--yes", "--json")
        assert code == 0 or "nothing to undo" in err, (k, out, err)  # (killed after its marker: done)
        assert _data_files(f"{where}/out") == 0 and _rows(spark, f"{where}/out") in (None, []), k
        k += 1
    assert not seen_partial, seen_partial
    assert partial_states > 0, "no crash point fell among the data files: the test proves nothing"
