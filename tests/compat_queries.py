"""Small real checkpoints for the compatibility tests, one per kind of query, and the queries that wrote them.

Each base is generated once per test session at a fixed location (source logs hold absolute paths) by its
original query, which is then recorded as the checkpoint's accepted query profile, as a Dagster run
records it. ``reset()`` puts the pristine tree back (input, checkpoint, output, profile) before a test
restarts a changed query on it for real.

* ``agg``: windowed counts and sums of JSON events into parquet (append), HDFS state, batches 0..3;
* ``dedup``: events deduplicated on ``key`` into parquet, batches 0..2;
* ``join``: a stream-stream inner join of two event streams on ``key`` within 20 s, into parquet;
* ``stateless``: the events as they arrive, written by ``foreachBatch`` (one parquet directory per batch);
* ``partitioned``: the events as they arrive into parquet, ``partitionBy("key")``, batches 0..2.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from checkpoint_ops.model import Checkpoint
from checkpoint_ops.query_profile import describe_query, record_profile
from checkpoint_ops.storage import open_file_manager
from pipelines.event_counts import FILE_MTIME_BASE, counts_writer, read_events, write_event_files
from tests.spark_runs import FLAVOURS, SESSION_CONF, unload_state_stores

BASE_FILES = 3  # input files 0..2 (one micro-batch each)
OTHER_INPUT_FILES = (100, 102)  # input2/: files 100 and 101, which no base query reads


def use_session_conf(spark) -> None:
    """The tests' SQL settings with the HDFS state store (other tests sharing the session may change them)."""
    for key, value in {**SESSION_CONF, **FLAVOURS["hdfs"]}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)


@dataclass
class CompatBase:
    name: str
    root: str

    def dir(self, name: str) -> str:
        return os.path.join(self.root, name)

    @property
    def checkpoint(self) -> str:
        return self.dir("checkpoint")

    @property
    def output(self) -> str:
        return self.dir("output")

    @property
    def pristine(self) -> str:
        return self.root + ".pristine"

    @property
    def batch(self) -> int:
        return Checkpoint.open(self.checkpoint).latest_commit

    def reset(self) -> None:
        if os.path.exists(self.root):
            shutil.rmtree(self.root)
        shutil.copytree(self.pristine, self.root, symlinks=True)

    def add_events(self, start: int, stop: int, source: str = "input") -> None:
        write_event_files(self.dir(source), start, stop)


# ---- the original queries -------------------------------------------------------------------------


def agg_writer(spark, base: CompatBase):
    return counts_writer(spark, base.dir("input"), base.output)


def dedup_writer(spark, base: CompatBase, columns=("key",)):
    deduped = read_events(spark, base.dir("input")).dropDuplicates(list(columns))
    return deduped.writeStream.format("parquet").option("path", base.output)


def partitioned_writer(spark, base: CompatBase, columns=("key",)):
    writer = read_events(spark, base.dir("input")).writeStream.format("parquet").option("path", base.output)
    return writer.partitionBy(*columns) if columns else writer


def join_frame(spark, base: CompatBase, how: str = "inner", on_value: bool = False):
    from pyspark.sql import functions as F

    left = read_events(spark, base.dir("left")).withWatermark("ts", "10 seconds") \
        .selectExpr("key", "value AS lv", "ts AS lts")
    right = read_events(spark, base.dir("right")).withWatermark("ts", "10 seconds") \
        .selectExpr("key AS rkey", "value AS rv", "ts AS rts")
    condition = "key = rkey AND lts BETWEEN rts - INTERVAL 20 SECONDS AND rts + INTERVAL 20 SECONDS"
    if on_value:
        condition += " AND lv = rv"
    return left.join(right, F.expr(condition), how)


def join_writer(spark, base: CompatBase, how: str = "inner", on_value: bool = False):
    return join_frame(spark, base, how, on_value).writeStream.format("parquet").option("path", base.output)


def batch_writer(output: str):
    """A foreachBatch function writing each batch to ``<output>/batch-<id>`` (idempotent per batch)."""
    def write(df, batch_id):
        df.write.mode("overwrite").parquet(os.path.join(output, f"batch-{batch_id:05d}"))

    return write


def stateless_writer(spark, base: CompatBase):
    return read_events(spark, base.dir("input")).writeStream.foreachBatch(batch_writer(base.output))


ORIGINAL = {"agg": agg_writer, "dedup": dedup_writer, "join": join_writer, "stateless": stateless_writer,
            "partitioned": partitioned_writer}


def generate_base(spark, name: str, root: str) -> CompatBase:
    """Run the base's original query over its input (availableNow) and record its profile."""
    base = CompatBase(name, root)
    os.makedirs(root)
    use_session_conf(spark)
    if name == "join":
        base.add_events(0, 2, "left")
        base.add_events(0, 2, "right")
    else:
        base.add_events(0, BASE_FILES)
    base.add_events(*OTHER_INPUT_FILES, source="input2")
    writer = ORIGINAL[name](spark, base)
    profile = describe_query(spark, writer)
    query = writer.option("checkpointLocation", base.checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    unload_state_stores(spark)
    fm, ckpt_root = open_file_manager(base.checkpoint)
    record_profile(fm, ckpt_root, profile, judged=False, batch=None)  # as a Dagster run records it, before the run
    shutil.copytree(root, base.pristine, symlinks=True)
    return base


# ---- restarting a changed query for real ------------------------------------------------------------


@dataclass
class RealRestart:
    """What Spark did when the changed query really restarted on the checkpoint (its real sink included)."""

    progress: list[dict]
    error: str | None  # str() of the exception Spark raised, None if the run finished

    @property
    def ok(self) -> bool:
        return self.error is None

    def batch(self, batch_id: int) -> dict:
        return next(p for p in self.progress if p["batchId"] == batch_id)

    @property
    def input_rows(self) -> int:
        return sum(int(p.get("numInputRows") or 0) for p in self.progress)


def restart_for_real(spark, writer, checkpoint: str, once: bool = False) -> RealRestart:
    """Start ``writer`` on ``checkpoint`` (availableNow, or once) and wait: Spark's own answer."""
    progress: list[dict] = []
    try:
        query = writer.option("checkpointLocation", checkpoint)
        query = query.trigger(once=True) if once else query.trigger(availableNow=True)
        started = query.start()
        try:
            started.awaitTermination()
        finally:
            progress = [json.loads(p.json) for p in started.recentProgress]
    except Exception as e:  # Spark's exception, with the JVM cause's class (AssertionError, ...)
        origin = getattr(e, "_origin", None)
        cause = origin.getCause() if origin is not None else None
        return RealRestart(progress, f"{e}\n{cause.getClass().getName() if cause is not None else type(e).__name__}")
    finally:
        unload_state_stores(spark)
    return RealRestart(progress, None)


def write_json_events(directory: str, name: str, rows: list[dict], index: int) -> None:
    """Hand-made events (key, value, ISO time) as one input file with mtime after file ``index``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    os.utime(path, (FILE_MTIME_BASE + index, FILE_MTIME_BASE + index))
