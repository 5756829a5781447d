"""A rollback to batch N whose next batch was a no-data batch (Spark runs one when the watermark moves on
with no new input, and in append mode it emits the windows the new watermark closes).

Spark plans a no-data batch only within a run, after a batch whose watermark leaves something to emit:
at a restart whose last batch is committed, with no new input, it plans nothing. So a rollback that
deleted ``offsets/N+1`` lost that batch's rows until new input arrived (for a finished source, a
backfill, for good): the rerun over the same input emitted nothing, and nothing said so. The rollback
keeps ``offsets/N+1`` of such a batch (same source offsets as batch N), planned and not committed: Spark
runs it again at the restart with its recorded watermark, and emits exactly those rows. For every state
store, Spark writes the checkpoint, we roll it back, and Spark's rerun over the same input writes exactly
the rows of the uninterrupted run; undo, right after the rollback, is not taken for a write since.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from tests.helpers import cli_json, content_snapshot
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores

BASE = datetime(2024, 1, 1, tzinfo=timezone.utc)
FILES = 4  # one file a batch (maxFilesPerTrigger 1): batches 0..3 read data, batch 4 only moves the watermark


def _write_inputs(directory: str, first: int = 0, last: int = FILES) -> None:
    os.makedirs(directory, exist_ok=True)
    for i in range(first, last):
        rows = [{"key": "a", "ts": (BASE + timedelta(seconds=10 * i + j)).isoformat()} for j in range(10)]
        path = os.path.join(directory, f"f{i:02d}.json")
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # Spark reads them oldest first


def _run(spark, flavour: str, base: str, input_dir: str | None = None) -> None:
    """10 s windows, a 10 s watermark, append mode: a window is emitted once the watermark passes its end.
    The input is ``base``/input unless given."""
    from pyspark.sql import functions as F

    for k, v in {**SESSION_CONF, **FLAVOURS[flavour]}.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    df = (spark.readStream.schema("key STRING, ts TIMESTAMP").option("maxFilesPerTrigger", 1)
          .json(input_dir or os.path.join(base, "input")))
    counts = (df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "10 seconds")).count()
              .select(F.col("window.start").cast("string").alias("window"), "count"))
    q = (counts.writeStream.format("parquet").outputMode("append")
         .option("checkpointLocation", os.path.join(base, "checkpoint")).trigger(availableNow=True)
         .start(os.path.join(base, "output")))
    q.awaitTermination()
    unload_state_stores(spark)


def _rows(spark, base: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(os.path.join(base, "output")).collect())


def _source_offsets(checkpoint: str, batch: int) -> list[str]:
    with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
        return f.read().splitlines()[2:]


def _run_ending_with_a_no_data_batch(spark, base: str, flavour: str = "hdfs") -> tuple[list[tuple], int]:
    """Spark's run over the inputs, with the ``flavour`` state store: (its rows, its last batch, a no-data
    batch)."""
    checkpoint = os.path.join(base, "checkpoint")
    _write_inputs(os.path.join(base, "input"))
    _run(spark, flavour, base)
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    assert last == FILES and _source_offsets(checkpoint, last) == _source_offsets(checkpoint, last - 1)
    return _rows(spark, base), last


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb", "rocksdb_v2"])
def test_a_rollback_before_a_no_data_batch_keeps_it_planned_and_spark_emits_its_rows_again(spark, tmp_path,
                                                                                           flavour):
    base = str(tmp_path)
    checkpoint, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    _write_inputs(os.path.join(base, "input"))
    _run(spark, flavour, base)
    expected = _rows(spark, base)
    batches = sorted(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    last = batches[-1]
    # the setup this test is about: Spark ended the run with a no-data batch that emitted rows
    assert last == FILES and _source_offsets(checkpoint, last) == _source_offsets(checkpoint, last - 1), batches
    target = last - 1
    original = content_snapshot(checkpoint, output)

    code, r = cli_json("rollback", checkpoint, "--to-batch", target, "--sink", output, "--yes")
    assert code == 0, r
    kept = f"offsets/{last}"
    assert os.path.exists(os.path.join(checkpoint, kept))
    assert not os.path.exists(os.path.join(checkpoint, "commits", str(last)))
    assert kept not in {a["rel"] for a in r["plan"]["actions"]}
    assert "no-data batch" in r["plan"]["summary"]["kept"], r["plan"]["summary"]
    rolled_back = content_snapshot(checkpoint, output)
    code, f = cli_json("fsck", checkpoint, "--sink", output)  # a planned, uncommitted batch is Spark's own state
    assert code == 0, f
    assert _rows(spark, base) != expected  # the rows the no-data batch emitted are gone with its sink log entry

    code, u = cli_json("undo", checkpoint, "--yes")  # nothing was written since: the kept file is the rollback's
    assert code == 0, u
    assert content_snapshot(checkpoint, output) == original
    code, r = cli_json("rollback", checkpoint, "--to-batch", target, "--sink", output, "--yes")
    assert code == 0, r
    assert content_snapshot(checkpoint, output) == rolled_back

    _run(spark, flavour, base)  # the same input: Spark runs the planned no-data batch again
    assert _rows(spark, base) == expected
    assert os.path.exists(os.path.join(checkpoint, "commits", str(last)))
    code, f = cli_json("fsck", checkpoint, "--sink", output)
    assert code == 0, f


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb", "rocksdb_v2"])
def test_a_no_data_batch_spark_purged_is_restored_planned_from_the_ledger(spark, tmp_path, flavour):
    """The no-data batch after the target is gone from ``offsets/`` (Spark's log purge), but the batch ledger
    recorded it: the rollback writes it back, planned, and Spark's rerun over the same input emits its rows.
    Before, it went like any purged batch above the target, and the rows it emitted never came back."""
    base = str(tmp_path)
    checkpoint, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    expected, last = _run_ending_with_a_no_data_batch(spark, base, flavour)
    code, r = cli_json("ledger", "sync", checkpoint, "--sink", output)
    assert code == 0, r
    _write_inputs(os.path.join(base, "input"), FILES, FILES + 2)  # a later run: more batches after the no-data one
    _run(spark, flavour, base)
    code, r = cli_json("ledger", "sync", checkpoint, "--sink", output)
    assert code == 0, r
    # Spark's purge of offsets/ and commits/ below a later batch, by hand: the shared session keeps 10 batches,
    # and with fewer its 1 s state maintenance would also drop the state the rollback needs
    for log in ("offsets", "commits"):
        for name in os.listdir(os.path.join(checkpoint, log)):
            if int(name.lstrip(".").split(".")[0]) <= last:
                os.remove(os.path.join(checkpoint, log, name))
    held = os.path.join(base, "held")
    os.makedirs(held)
    for i in range(FILES, FILES + 2):  # the rerun reads the input the no-data batch had seen, no more
        os.rename(os.path.join(base, "input", f"f{i:02d}.json"), os.path.join(held, f"f{i:02d}.json"))

    code, r = cli_json("rollback", checkpoint, "--to-batch", last - 1, "--sink", output, "--yes")
    assert code == 0, r
    assert r["plan"]["summary"]["kept_planned"] == [f"offsets/{last}"], r["plan"]["summary"]
    with open(os.path.join(checkpoint, "offsets", str(last))) as f:
        assert f.read().splitlines()[2:] == _source_offsets(checkpoint, last - 1)  # planned, the same offsets
    assert not os.path.exists(os.path.join(checkpoint, "commits", str(last)))
    code, f = cli_json("fsck", checkpoint, "--sink", output)
    assert code == 0, f
    _run(spark, flavour, base)
    assert _rows(spark, base) == expected  # before: the windows the no-data batch closed were missing
    code, f = cli_json("fsck", checkpoint, "--sink", output)
    assert code == 0, f


def test_a_restore_to_before_a_no_data_batch_keeps_it_planned_too(spark, tmp_path):
    """``backup restore --to-batch`` plans with the rollback planner: restored to the batch before a no-data
    batch, the copy keeps it planned, and Spark resuming the copy over the same input writes exactly the
    rows of the uninterrupted run. Undo of the restore is not refused as "written since"."""
    base, restored = str(tmp_path / "original"), str(tmp_path / "restored")
    checkpoint, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    expected, last = _run_ending_with_a_no_data_batch(spark, base)
    dest = str(tmp_path / "backups")
    code, b = cli_json("backup", "create", checkpoint, dest, "--sink", output)
    assert code == 0, b
    args = ("backup", "restore", dest, b["backup_id"], os.path.join(restored, "checkpoint"), "--sink-target",
            os.path.join(restored, "output"), "--to-batch", last - 1, "--yes")
    code, r = cli_json(*args)
    assert code == 0, r
    assert "no-data batch" in r["plan"]["summary"]["kept"], r["plan"]["summary"]
    assert os.path.exists(os.path.join(restored, "checkpoint", "offsets", str(last)))
    code, u = cli_json("undo", os.path.join(restored, "checkpoint"), "--yes")
    assert code == 0, u
    code, r = cli_json(*args)
    assert code == 0, r
    _run(spark, "hdfs", restored, input_dir=os.path.join(base, "input"))
    assert _rows(spark, restored) == expected


def test_a_kept_no_data_batch_is_the_standing_rollbacks_after_a_later_one_is_undone(spark, tmp_path):
    """Rollback to the batch before a no-data batch (kept planned), rollback further back, undo that: the tree is
    the first rollback's result again, and its kept batch is not taken for a running query (it was, for 10
    minutes after Spark's run: the activity check asked only the newest journal, the undone one). The next
    rollback plans and the undo of the first one brings back exactly what Spark wrote."""
    base = str(tmp_path)
    checkpoint, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    _write_inputs(os.path.join(base, "input"))
    _run(spark, "hdfs", base)
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    assert last == FILES and _source_offsets(checkpoint, last) == _source_offsets(checkpoint, last - 1)
    original = content_snapshot(checkpoint, output)

    code, r = cli_json("rollback", checkpoint, "--to-batch", last - 1, "--sink", output, "--yes")
    assert code == 0 and "no-data batch" in r["plan"]["summary"]["kept"], r
    first = content_snapshot(checkpoint, output)
    code, r = cli_json("rollback", checkpoint, "--to-batch", 1, "--sink", output, "--yes")
    assert code == 0, r
    code, u = cli_json("undo", checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(checkpoint, output) == first
    code, r = cli_json("rollback", checkpoint, "--to-batch", 2, "--sink", output, "--dry-run")
    assert code == 0, r  # refused before: "offsets/4 has no commit yet and was written 3 s ago"
    code, u = cli_json("undo", checkpoint, "--yes")
    assert code == 0, u
    assert content_snapshot(checkpoint, output) == original


@pytest.mark.parametrize("flavour", ["hdfs", "rocksdb", "rocksdb_v2"])
def test_a_backup_of_a_kept_no_data_batch_takes_it_and_the_restored_copy_emits_its_rows(spark, tmp_path, flavour):
    """Rolled back to the batch before a no-data batch (kept planned), then backed up: the backup cuts at the
    last commit and took nothing above it, so the restored copy had no planned batch, and Spark resuming it
    over the same (finished) input planned nothing and never emitted that batch's rows (fsck called it
    healthy). The backup takes ``offsets/N+1`` of a no-data batch and says so; the restore writes it; Spark on
    the restored copy writes exactly the rows of the uninterrupted run."""
    base, restored = str(tmp_path / "original"), str(tmp_path / "restored")
    checkpoint, output = os.path.join(base, "checkpoint"), os.path.join(base, "output")
    expected, last = _run_ending_with_a_no_data_batch(spark, base, flavour)
    code, r = cli_json("rollback", checkpoint, "--to-batch", last - 1, "--sink", output, "--yes")
    assert code == 0 and "no-data batch" in r["plan"]["summary"]["kept"], r

    dest = str(tmp_path / "backups")
    code, b = cli_json("backup", "create", checkpoint, dest, "--sink", output)
    assert code == 0 and b["batch"] == last - 1, b
    code, v = cli_json("backup", "verify", dest, b["backup_id"])
    assert code == 0, v
    target, sink_target = os.path.join(restored, "checkpoint"), os.path.join(restored, "output")
    code, r = cli_json("backup", "restore", dest, b["backup_id"], target, "--sink-target", sink_target, "--yes")
    assert code == 0, r
    planned = os.path.join(target, "offsets", str(last))
    restored_planned = open(planned, "rb").read() if os.path.exists(planned) else None
    code, f = cli_json("fsck", target, "--sink", sink_target)
    assert code == 0, f
    code, d = cli_json("rollback", target, "--to-batch", last - 1, "--sink", sink_target, "--dry-run")
    assert code == 0, d  # the restore's planned batch is not taken for a running query
    again = str(tmp_path / "again")
    code, r2 = cli_json("backup", "restore", dest, b["backup_id"], os.path.join(again, "checkpoint"), "--sink-target",
                        os.path.join(again, "output"), "--to-batch", last - 1, "--yes")
    assert code == 0 and r2["plan"]["summary"]["kept_planned"] == [f"offsets/{last}"], r2
    assert os.path.exists(os.path.join(again, "checkpoint", "offsets", str(last)))

    _run(spark, flavour, restored, input_dir=os.path.join(base, "input"))  # the same, finished input
    assert _rows(spark, restored) == expected  # before: the rows of the no-data batch were missing
    assert os.path.exists(os.path.join(target, "commits", str(last)))
    with open(os.path.join(checkpoint, "offsets", str(last)), "rb") as f:
        assert restored_planned == f.read()  # the restore wrote the planned batch as it was
    assert b["kept_planned"] == [f"offsets/{last}"] and "no-data batch" in b["kept"], b
    assert r["plan"]["summary"]["kept_planned"] == [f"offsets/{last}"], r["plan"]["summary"]
    code, rows = cli_json("backup", "list", dest)
    assert code == 0 and rows["backups"][0]["kept_planned"] == [f"offsets/{last}"], rows
