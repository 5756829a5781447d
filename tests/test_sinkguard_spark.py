"""A rollback never silently leaves out a file sink the checkpoint's records name (recorded_sinks.py).

Spark writes a stateless query's checkpoint and file sink (24 batches, compaction every 5, Spark cleaning
up its own logs) and ``ledger sync --sink`` records the pairing, as the Dagster asset does after every run.
Rolling the checkpoint back alone would leave the sink log with the rolled-back batch ids, and Spark's file
sink skips batch ids its log has: the reprocessed rows would be silently dropped. Spark is the judge: the
query restarts with changed logic (values x 1000 from the first re-run batch), so its output shows whether
each re-run batch's rows were written once, with the new logic, or dropped.
"""

from __future__ import annotations

import json
import os
import shutil

from pipelines.event_counts import event_rows
from tests.helpers import cli, cli_json, tree_snapshot
from tests.spark_runs import COMPACT_INTERVAL, SESSION_CONF
from tests.test_sink_spark import SINK, Run, rows, sink_run  # noqa: F401  (a fixture)

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL), *SINK)
SCALE = 1000


def _run_changed(spark, run: Run) -> None:
    """The stateless query of ``spark_runs.build_stateless_query`` with its values scaled (a fixed bug)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    for k, v in SESSION_CONF.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.LongType()),
                           T.StructField("ts", T.StringType())])
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(f"{run.base}/input")
    q = (df.select("key", (F.col("value") * SCALE).alias("value")).writeStream.format("parquet")
         .option("checkpointLocation", run.ckpt).trigger(availableNow=True).start(run.out))
    q.awaitTermination()


def _expected(files: int, rerun_from: int) -> list:
    """Every input file's rows exactly once: as first written up to the target, with the new logic after."""
    return sorted((e["key"], e["value"] * (SCALE if i >= rerun_from else 1)) for i in range(files) for e in event_rows(i))


def _files(run: Run) -> int:
    return len([n for n in os.listdir(f"{run.base}/input") if n.endswith(".json")])


def test_rollback_without_a_recorded_sink_is_refused_and_with_it_spark_reprocesses_exactly(spark, sink_run):
    run = Run(sink_run)
    last = run.batches() - 1
    n = last - 6  # crosses the sink log's newest compaction
    before = tree_snapshot(run.base)  # checkpoint, output, input and the ledger and journals beside them
    code, f = cli_json("fsck", run.ckpt, *INTERVALS)
    assert (code, f["findings"]) == (0, []), f

    for extra in ((), ("--dry-run",), ("--yes",)):
        code, out, err = cli("rollback", run.ckpt, "--to-batch", n, *INTERVALS, *extra, "--json")
        assert code == 1, (extra, out, err)
        assert f"records that this checkpoint's query writes the file sink {run.out}" in err, err
        assert f"batches {n + 1}..{last}" in err and "silently dropping their rows" in err, err
        assert f"--to-batch {n} --sink {run.out}" in err and "--without-recorded-sinks" in err, err
        assert [s["url"] for s in json.loads(out)["recorded_sinks"]] == [run.out]
        assert tree_snapshot(run.base) == before, f"a refused rollback ({extra}) changed something"

    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, "--sink", run.out, *INTERVALS, "--yes")
    assert code == 0, r
    assert r["plan"]["roots"] == {"checkpoint": run.ckpt, "sink0": run.out}
    _run_changed(spark, run)
    assert rows(spark, run.out) == _expected(_files(run), n + 1)


def test_without_recorded_sinks_applies_fsck_names_the_sink_and_spark_drops_the_reprocessed_rows(spark, sink_run):
    """The opt-out does what it says (the checkpoint alone), the plan and plain ``fsck`` say what it costs, and
    Spark shows that cost is real: the re-run batches' new rows never reach the sink."""
    run = Run(sink_run)
    last = run.batches() - 1
    n = last - 6
    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, "--without-recorded-sinks", *INTERVALS, "--yes")
    assert code == 0, r
    assert r["plan"]["roots"] == {"checkpoint": run.ckpt}
    assert any(run.out in w and f"batches {n + 1}..{last}" in w for w in r["plan"]["warnings"]), r["plan"]["warnings"]
    assert str(last) in os.listdir(f"{run.out}/_spark_metadata")  # the sink was left as it was

    code, f = cli_json("fsck", run.ckpt, *INTERVALS)  # no --sink: the ledger's record names it
    ahead = [x for x in f["findings"] if x["code"] == "sink-ahead"]
    assert code == 1 and len(ahead) == 1 and ahead[0]["severity"] == "error", f
    assert ahead[0]["path"] == f"{run.out}/_spark_metadata/{last}" and f"--sink {run.out}" in ahead[0]["fix"], ahead

    _run_changed(spark, run)
    got, files = rows(spark, run.out), _files(run)
    assert got == _expected(files, files), "the re-run batches' rows were written: the file sink skipped nothing?"
    assert got != _expected(files, n + 1)


def test_a_recorded_sink_that_is_gone_is_a_warning_and_does_not_block_a_rollback(sink_run, tmp_path):
    run = Run(sink_run)
    n = run.batches() - 4
    shutil.move(run.out, str(tmp_path / "moved-away"))
    code, f = cli_json("fsck", run.ckpt, *INTERVALS)
    assert code == 1 and [(x["code"], x["severity"], x["path"]) for x in f["findings"]] == [
        ("recorded-sink-missing", "warning", run.out)], f
    assert "nothing there any more" in f["findings"][0]["problem"]

    before = tree_snapshot(run.ckpt)
    code, r = cli_json("rollback", run.ckpt, "--to-batch", n, *INTERVALS, "--dry-run")
    assert code == 0, r
    assert any(run.out in w and "nothing there any more" in w for w in r["plan"]["warnings"]), r["plan"]["warnings"]
    assert tree_snapshot(run.ckpt) == before

