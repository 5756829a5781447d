"""Formats real Spark writes beyond the main fixtures: offsets v2 / commits v3, DStream checkpoints."""

from __future__ import annotations

import os
import time

import pytest

from checkpoint_ops.session_settings import session_settings
from tests.helpers import cli_json


@pytest.fixture(scope="session")
def named_checkpoint(spark, tmp_path_factory):
    """Named source and sink (query evolution): offsets v2 and commits v3."""
    base = tmp_path_factory.mktemp("named")
    (base / "in").mkdir()
    (base / "in" / "a.json").write_text('{"a":1}')
    confs = {
        "spark.sql.streaming.offsetLog.formatVersion": "2",
        "spark.sql.streaming.queryEvolution.enableSourceEvolution": "true",
        "spark.sql.streaming.queryEvolution.enableSinkEvolution": "true",
    }
    with session_settings(spark, confs):
        df = spark.readStream.schema("a long").format("json").name("orders_src").load(str(base / "in"))
        w = df.writeStream.format("parquet").option("checkpointLocation", str(base / "ckpt")).trigger(availableNow=True)
        w._jwrite = w._jwrite.name("orders_sink")  # DataStreamWriter.name() is not exposed in PySpark 4.3
        q = w.start(str(base / "out"))
        q.awaitTermination()
    return base


def test_offsets_v2_and_commits_v3(named_checkpoint):
    ck = str(named_checkpoint / "ckpt")
    code, r = cli_json("inspect", ck)
    assert code == 0
    (src,) = r["sources"]
    assert src["id"] == "orders_src" and src["kind"] == "file" and src["offset"] == {"logOffset": 0}
    assert r["state"]["operators"] == []
    code, off = cli_json("offsets", ck, "--batch", 0)
    assert code == 0 and off["sources"][0]["id"] == "orders_src"
    from checkpoint_ops.model import Checkpoint

    c = Checkpoint.open(ck)
    assert c.offsets(0).version == 2
    commit = c.commit(0)
    assert commit.version == 3 and "orders_sink" in commit.sink_metadata
    code, f = cli_json("fsck", ck, "--sink", str(named_checkpoint / "out"))
    assert (code, f["findings"]) == (0, [])


@pytest.fixture(scope="session")
def dstream_checkpoint(spark, tmp_path_factory):
    from pyspark.streaming import StreamingContext

    base = tmp_path_factory.mktemp("dstream")
    (base / "in").mkdir()
    ssc = StreamingContext(spark.sparkContext, 1)
    ssc.checkpoint(str(base / "ckpt"))
    stream = ssc.textFileStream(str(base / "in")).map(lambda line: (line, 1))
    stream.updateStateByKey(lambda vs, s: sum(vs) + (s or 0)).pprint()
    ssc.start()
    time.sleep(4.5)
    ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return base / "ckpt"


def test_dstream_checkpoints_listed_by_time(dstream_checkpoint):
    code, r = cli_json("inspect", str(dstream_checkpoint))
    assert code == 0 and r["kind"] == "dstream"
    times = [c["time_ms"] for c in r["checkpoints"]]
    on_disk = sorted(int(n.split("-")[1].split(".")[0]) for n in os.listdir(dstream_checkpoint)
                     if n.startswith("checkpoint-"))
    assert times == sorted(set(on_disk)) and len(times) >= 2
    assert r["latest_checkpoint_ms"] == max(on_disk)
    assert any(c["backup"] for c in r["checkpoints"]) == any(n.endswith(".bk") for n in os.listdir(dstream_checkpoint))
    code, f = cli_json("fsck", str(dstream_checkpoint))
    assert (code, f["findings"]) == (0, [])
