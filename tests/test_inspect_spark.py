"""inspect / offsets on checkpoints real Spark wrote, checked against Spark's own progress reports."""

from __future__ import annotations

import json

from tests.helpers import cli, cli_json
from tests.spark_runs import COMPACT_INTERVAL

INTERVALS = ("--source-compact-interval", str(COMPACT_INTERVAL))
SINK_INTERVAL = ("--sink-compact-interval", str(COMPACT_INTERVAL))


def _offset(value):
    """Progress offsets are JSON text in some PySpark versions and parsed objects in others."""
    return json.loads(value) if isinstance(value, str) else value


def _watermark_ms(progress: dict) -> int:
    from datetime import datetime

    wm = progress["eventTime"].get("watermark")
    return int(datetime.fromisoformat(wm.replace("Z", "+00:00")).timestamp() * 1000)


def test_inspect_matches_spark_progress(run):
    code, r = cli_json("inspect", run.checkpoint, "--sink", run.output, *INTERVALS, *SINK_INTERVAL)
    assert code == 0
    last = run.progress[-1]
    assert r["query_id"] == last["id"]
    assert r["last_committed_batch"] == last["batchId"]
    assert r["commits"]["last"] == last["batchId"] and r["offsets"]["last"] == last["batchId"]
    assert r["in_progress_batch"] is None
    # Spark keeps minBatchesToRetain (10) + 1 offsets/commits files.
    assert r["offsets"]["first"] == last["batchId"] - 10
    assert [b["id"] for b in r["batches"]] == list(range(last["batchId"] - 10, last["batchId"] + 1))
    for b in r["batches"]:
        p = run.progress_for(b["id"])
        assert b["committed"] is True
        assert b["watermark_ms"] == _watermark_ms(p), b
    # source offsets: what Spark reported as the end offset of the last batch
    (src,) = r["sources"]
    assert src["kind"] == "file"
    assert src["offset"] == _offset(last["sources"][0]["endOffset"])
    assert src["log"]["compact_interval"] == COMPACT_INTERVAL
    # state: batch b commits version b+1
    st = r["state"]
    (op,) = st["operators"]
    assert op["name"] == "stateStoreSave"
    assert op["partitions"] == 2 and op["stores"] == ["default"]
    assert op["versions"]["last"] == last["batchId"] + 1
    expected_provider = "hdfs" if run.flavour == "hdfs" else "rocksdb"
    assert st["provider"] == expected_provider
    assert st["checkpoint_format_version"] == (2 if run.flavour == "rocksdb_v2" else 1)
    # the sink: every file Spark reports through a reader is in the log
    assert r["sink"]["latest_batch"] == last["batchId"]
    assert r["sink"]["compact_interval"] == COMPACT_INTERVAL
    assert r["sink"]["files"] > 0 and r["sink"]["bytes"] > 0
    # the window ends at the last commit and starts where offsets/N-1 still exists
    w = r["rollback_window"]
    assert w["latest"] == last["batchId"]
    assert w["earliest"] == r["offsets"]["first"] + 1
    assert f"offsets/{r['offsets']['first'] - 1}" in w["earliest_reason"]


def test_offsets_of_a_batch(run):
    batch = run.last_batch - 3
    code, r = cli_json("offsets", run.checkpoint, "--batch", batch)
    assert code == 0
    p = run.progress_for(batch)
    (s,) = r["sources"]
    assert s["start"] == _offset(p["sources"][0]["startOffset"])
    assert s["end"] == _offset(p["sources"][0]["endOffset"])
    assert r["committed"] is True and r["watermark_ms"] == _watermark_ms(p)
    # the text names the watermark as Spark's progress does (a time), with its milliseconds
    code, out, err = cli("offsets", run.checkpoint, "--batch", batch)
    assert code == 0 and f"watermark {p['eventTime']['watermark'].replace('.000Z', '')}" in out, out + err


def test_offsets_of_a_purged_batch_is_bad_input(run):
    code, r = cli_json("offsets", run.checkpoint, "--batch", 0)
    assert code == 2
    assert r["path"].endswith("offsets/0") and "holds batches" in r["problem"]


def test_spark_sink_log_agrees_with_spark_reader(spark, run):
    """The files our model lists for the sink are exactly the ones Spark's reader uses."""
    from checkpoint_ops.model import open_sink

    sink = open_sink(run.output, compact_interval=COMPACT_INTERVAL)
    ours = {e.path for e in sink.log.entries_after(sink.log.latest)}
    spark_files = set(spark.read.parquet(run.output).inputFiles())
    assert ours == spark_files
