"""Real Spark runs for the tests: one shared session, checkpoints generated once per test session.

Sink and source logs hold absolute paths, so a copied checkpoint is not the same checkpoint.
Each flavour is therefore generated once at a fixed location and kept pristine; ``SparkRun.reset()``
puts the pristine tree back in place (mtimes included) before a test changes it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from pipelines.event_counts import build_query, write_event_files

# Python workers (applyInPandasWithState, transformWithStateInPandas) must run this interpreter, which
# has pandas and pyarrow; Spark starts `python3` from PATH otherwise. Read when the SparkContext starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"

# Small retention and compaction so 30 batches exercise purge, compaction and log cleanup.
SESSION_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.minBatchesToRetain": "10",
    "spark.sql.streaming.fileSink.log.compactInterval": "5",
    "spark.sql.streaming.fileSink.log.cleanupDelay": "0",
    "spark.sql.streaming.fileSource.log.compactInterval": "5",
    "spark.sql.streaming.fileSource.log.cleanupDelay": "0",
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.pollingDelay": "10ms",
}

FLAVOURS = {
    "hdfs": {
        "spark.sql.streaming.stateStore.providerClass": HDFS,
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "1",
    },
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "1",
    },
    "rocksdb_v2": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
    },
}

FILES_PER_RUN = (15, 15)  # two query runs (a restart in between), 30 input files in all
COMPACT_INTERVAL = 5


def make_session():
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName("checkpoint-ops-tests")
    for k, v in SESSION_CONF.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def unload_state_stores(spark) -> None:
    """Drop every loaded state store provider and stop maintenance (no cached state, no writers)."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


class _Pristine:
    """``input/`` and ``output/`` under ``self.base``, and the pristine copy beside it that ``reset`` puts back."""

    @property
    def input(self) -> str:
        return os.path.join(self.base, "input")

    @property
    def output(self) -> str:
        return os.path.join(self.base, "output")

    @property
    def pristine(self) -> str:
        return self.base + ".pristine"

    def reset(self) -> None:
        """Put the pristine generated tree back at the canonical location (mtimes included)."""
        if os.path.exists(self.base):
            remove_tree(self.base)
        shutil.copytree(self.pristine, self.base, symlinks=True)


def remove_tree(path: str, wait_s: float = 30.0) -> None:
    """``shutil.rmtree``, tried again while something still writes into the tree: a query that failed (a test
    that makes Spark refuse a restart) returns before its tasks on other partitions have stopped, and one of them
    can create a state file in a directory being removed ("Directory not empty", seen on a loaded machine)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError:
            if not os.path.lexists(path):
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass
class SparkRun(_Pristine):
    flavour: str
    base: str
    progress: list[dict] = field(default_factory=list)
    files: int = 0

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.base, "checkpoint")

    @property
    def last_batch(self) -> int:
        return self.progress[-1]["batchId"]

    def progress_for(self, batch: int) -> dict:
        return next(p for p in self.progress if p["batchId"] == batch)

    def run_query(self, spark, conf: dict | None = None, **kw) -> list[dict]:
        """Run the query (availableNow) on this run's directories; returns the progress of each batch.

        ``conf`` overrides SQL confs for this run only.
        """
        # Re-assert every SQL conf: other code sharing the session (e.g. a Dagster PySparkResource
        # calling getOrCreate with its own config) may have changed them.
        for k, v in {**SESSION_CONF, **FLAVOURS[self.flavour], **(conf or {})}.items():
            if k.startswith("spark.sql."):
                spark.conf.set(k, v)
        q = build_query(spark, self.input, self.output, self.checkpoint, **kw)
        q.awaitTermination()
        progress = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]
        unload_state_stores(spark)
        return progress


def generate(spark, flavour: str, base: str) -> SparkRun:
    run = SparkRun(flavour, base)
    os.makedirs(base)
    start = 0
    for n in FILES_PER_RUN:
        write_event_files(run.input, start, start + n)
        start += n
        run.progress += run.run_query(spark)
    # Whether Spark ends a run with a no-data batch varies, so the last batch id does too. Tests
    # want plain sink/source log files after the last compaction: add input until that holds.
    while (run.last_batch + 1) % COMPACT_INTERVAL == 0 or (run.last_batch + 1) % COMPACT_INTERVAL == 1:
        write_event_files(run.input, start, start + 1)
        start += 1
        run.progress += run.run_query(spark)
    run.files = start
    time.sleep(0.1)
    shutil.copytree(base, run.pristine, symlinks=True)
    return run


def build_stateless_query(spark, input_dir: str, output_dir: str, checkpoint_dir: str):
    """File source -> parquet, no state: rollbacks beyond Spark's window need only the ledger."""
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.LongType()),
                           T.StructField("ts", T.StringType())])
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(input_dir).select("key", "value")
    return (df.writeStream.format("parquet").option("checkpointLocation", checkpoint_dir)
            .trigger(availableNow=True).start(output_dir))


def run_stateless(spark, base: str, checkpoint: str | None = None) -> list[dict]:
    """The stateless query on ``base``/input and ``base``/output; its checkpoint ``base``/checkpoint unless given."""
    for k, v in SESSION_CONF.items():
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    q = build_stateless_query(spark, os.path.join(base, "input"), os.path.join(base, "output"),
                              checkpoint or os.path.join(base, "checkpoint"))
    q.awaitTermination()
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


@dataclass
class QueryRun(_Pristine):
    """One stateless query's directories (input file i is batch i), kept pristine like ``SparkRun``."""

    base: str
    checkpoint: str
    files: int = 0

    def reset(self) -> None:
        super().reset()
        self.files = len([n for n in os.listdir(self.input) if n.endswith(".json")])

    def run(self, spark, more: int = 0) -> list[dict]:
        """Add ``more`` input files and let the query process what is new."""
        write_event_files(self.input, self.files, self.files + more)
        self.files += more
        return run_stateless(spark, self.base, self.checkpoint)


PAIR_FILES = 8  # batches 0..7 per query: a compaction at 4 (interval 5), plain log files on both sides of it


def generate_pair_runs(spark, root: str) -> dict[str, QueryRun]:
    """Two queries writing two outputs, "a" then "b" (the same batch ids, run at other times), and "inside",
    whose checkpoint is kept inside its own output (``output/checkpoint``)."""
    runs = {}
    for name in ("a", "b", "inside"):
        base = os.path.join(root, name)
        ckpt = os.path.join(base, "output", "checkpoint") if name == "inside" else os.path.join(base, "checkpoint")
        run = QueryRun(base, ckpt)
        run.run(spark, PAIR_FILES)
        # the next query runs well after this one: its batches must not fall inside this one's batch times
        # plus the 2 s the line-up allows (a fast machine runs all of "a" in about that)
        time.sleep(5)
        shutil.copytree(base, run.pristine, symlinks=True)
        runs[name] = run
    return runs
