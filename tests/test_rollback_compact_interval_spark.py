"""A rollback never changes the compact interval Spark derives for the logs it leaves (hostile review).

Spark takes a log's compact interval from its two latest ``.compact`` files, or, with one left, derives it
from that file's id and the configured default (reference §4.2): ``7.compact`` alone gives 8, not 4. With
fewer batches retained than the interval, Spark's cleanup removes ``3.compact`` early, and a rollback to 8
removes ``11.compact``: the query then compacted at 15, not 11, and once Spark's cleanup left ``15.compact``
alone a reader derived 4 again and failed on a ``19.compact`` that was never written (``spark.read`` of the
output and the restart). The rollback writes ``3.compact`` again (the source log's from its entries' batchId,
the sink log's from the batch ledger), and Spark is the judge: it runs on, restarts and reads every row once.
"""

import os

from checkpoint_ops.session_settings import session_settings
from pipelines.event_counts import event_rows, write_event_files
from tests.helpers import cli_json

INTERVAL = 4
CONF = {"spark.sql.streaming.fileSink.log.compactInterval": str(INTERVAL),
        "spark.sql.streaming.fileSource.log.compactInterval": str(INTERVAL),
        "spark.sql.streaming.fileSink.log.cleanupDelay": "0", "spark.sql.streaming.fileSource.log.cleanupDelay": "0",
        "spark.sql.streaming.minBatchesToRetain": "2", "spark.sql.shuffle.partitions": "2"}
OPTS = ("--source-compact-interval", str(INTERVAL), "--sink-compact-interval", str(INTERVAL))


def _run(spark, base: str) -> None:
    from pyspark.sql import types as T

    with session_settings(spark, CONF):
        schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.LongType()),
                               T.StructField("ts", T.StringType())])
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(f"{base}/input")
        q = (df.select("key", "value").writeStream.format("parquet").option("checkpointLocation", f"{base}/checkpoint")
             .trigger(availableNow=True).start(f"{base}/output"))
        q.awaitTermination()


def _land(base: str, start: int, end: int) -> None:
    write_event_files(f"{base}/input", start, end)


def _rows(spark, base: str) -> list:
    return sorted(tuple(r) for r in spark.read.parquet(f"{base}/output").collect())


def _expected(files: int) -> list:
    return sorted((e["key"], e["value"]) for i in range(files) for e in event_rows(i))


def _names(d: str) -> list[str]:
    return sorted((x for x in os.listdir(d) if not x.startswith(".")), key=lambda x: int(x.split(".")[0]))


def test_a_rollback_keeps_the_compact_interval_and_spark_runs_restarts_and_reads_on(spark, tmp_path):
    base = str(tmp_path / "run")
    ckpt, out = f"{base}/checkpoint", f"{base}/output"
    logs = (f"{ckpt}/sources/0", f"{out}/_spark_metadata")
    for start, end in ((0, 3), (3, 6), (6, 9), (9, 12)):  # a ledger sync after each run, as the Dagster asset does
        _land(base, start, end)
        _run(spark, base)
        code, r = cli_json("ledger", "sync", ckpt, "--sink", out, *OPTS)
        assert code == 0, r
    for d in logs:
        assert _names(d) == ["7.compact", "8", "9", "10", "11.compact"], (d, _names(d))  # Spark removed 3.compact
    code, r = cli_json("inspect", ckpt, "--sink", out, *OPTS)
    assert code == 0 and r["rollback_window"]["earliest"] <= 8, r["rollback_window"]  # the ledger rebuilds it

    code, r = cli_json("rollback", ckpt, "--to-batch", 8, "--sink", out, *OPTS, "--yes")
    assert code == 0, r
    for d in logs:
        assert _names(d) == ["3.compact", "7.compact", "8"], (d, _names(d))
    code, f = cli_json("fsck", ckpt, "--sink", out, *OPTS)
    assert (code, f["findings"]) == (0, []), f

    files = 12
    for more in (4, 4, 6):  # batches 9..11 again and on, past 15, 19 and 23, one restart after another
        _land(base, files, files + more)
        files += more
        _run(spark, base)
        assert _rows(spark, base) == _expected(files)
    for d in logs:
        assert all(int(x.split(".")[0]) % INTERVAL == INTERVAL - 1 for x in _names(d) if x.endswith(".compact")), d
    code, f = cli_json("fsck", ckpt, "--sink", out, *OPTS)
    assert (code, f["findings"]) == (0, []), f


def test_without_a_ledger_the_window_ends_where_a_rollback_would_change_the_interval(spark, tmp_path):
    """The same logs with no batch ledger: ``3.compact`` cannot be rebuilt, so a rollback below ``11.compact`` is
    refused. ``inspect`` showed the window reaching back to batch 7 all the same (a hostile review: every batch it
    offered but the newest was refused). The window now ends at the newest batch, naming why, and the rollback it
    offers is the one that goes through."""
    from tests.helpers import tree_snapshot

    base = str(tmp_path / "run")
    ckpt, out = f"{base}/checkpoint", f"{base}/output"
    for start, end in ((0, 3), (3, 6), (6, 9), (9, 12)):
        _land(base, start, end)
        _run(spark, base)
    assert _names(f"{out}/_spark_metadata") == ["7.compact", "8", "9", "10", "11.compact"]

    code, r = cli_json("inspect", ckpt, "--sink", out, *OPTS)
    assert code == 0, r
    window = r["rollback_window"]
    assert (window["earliest"], window["latest"]) == (11, 11), window
    assert "derive compact interval 8" in window["earliest_reason"] and "3.compact" in window["earliest_reason"], window
    before = tree_snapshot(base)
    code, refused = cli_json("rollback", ckpt, "--to-batch", 10, "--sink", out, *OPTS, "--yes")
    assert code == 1 and refused["error"] == "RefusedError" and "derive compact interval 8" in refused["problem"], refused
    assert tree_snapshot(base) == before
